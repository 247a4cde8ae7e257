/* Stands in for the JSON Schema compiler (schema/json_schema.h) in a build that does not have it
 * yet: the "compiled" grammar accepts any JSON object, so tool-call arguments always parse as JSON
 * but their schema is not enforced. CMake builds this file only when there is no kiri_schema
 * library; it goes away when the compiler lands.
 */
#include "json_schema.h"

#include <jansson.h>
#include <string.h>

#include "buf.h"
#include "error.h"
#include "kiri.h"

int kiri_json_schema_to_gbnf(const char *schema, size_t len, const char *root_name, const char *prefix,
                             char **gbnf, size_t *gbnf_len, struct kiri_status_info *info)
{
    json_error_t je;
    json_t *v = json_loadb(schema, len, 0, &je);
    const int ok = json_is_object(v) || json_is_boolean(v);
    json_decref(v);
    if (!ok)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "json_schema", -1, "a JSON Schema must be an object");
    const char *r = root_name ? root_name : "root", *x = prefix ? prefix : "";
    struct kiri_buf b = {0};
    kiri_buf_printf(&b, "%s ::= %sobject\n", r, x);
    kiri_buf_printf(&b, "%svalue ::= %sobject | %sarray | %sstring | %snumber | \"true\" | \"false\" | \"null\"\n",
                    x, x, x, x, x);
    kiri_buf_printf(&b, "%sobject ::= \"{\" %sws (%sstring \":\" %sws %svalue (\",\" %sws %sstring \":\" %sws "
                        "%svalue)*)? \"}\"\n", x, x, x, x, x, x, x, x, x);
    kiri_buf_printf(&b, "%sarray ::= \"[\" %sws (%svalue (\",\" %sws %svalue)*)? \"]\"\n", x, x, x, x, x);
    kiri_buf_printf(&b, "%sstring ::= \"\\\"\" ([^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" "
                        "[0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F]))* \"\\\"\" %sws\n", x, x);
    kiri_buf_printf(&b, "%snumber ::= \"-\"? ([0-9] | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)? %sws\n",
                    x, x);
    kiri_buf_printf(&b, "%sws ::= [ ]?\n", x);
    if (b.failed) {
        kiri_buf_free(&b);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    }
    *gbnf = kiri_buf_take(&b, gbnf_len);
    return KIRI_OK;
}
