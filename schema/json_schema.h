/* JSON Schema compiled to a GBNF grammar (the text kiri_grammar_check and the engine accept), so a
 * constrained sequence always produces JSON that validates against the schema.
 *
 * Honoured: type (one or a list), enum, const, properties / required / additionalProperties
 * (false, true or a schema), items / prefixItems / minItems / maxItems, nested objects, anyOf,
 * oneOf, allOf of objects, $ref / $defs / definitions (local, "#/..."), string minLength /
 * maxLength, format (date, time, date-time, uuid), pattern where it is a regular language, and
 * the annotations (title, description, default, examples, $schema, $id, $comment). A keyword the
 * compiler cannot honour exactly is refused (KIRI_E_UNSUPPORTED with field set to the JSON
 * pointer of the subschema and the keyword named in the message), never silently relaxed.
 *
 * Bounded: nesting depth, rule count, enum size and output size are capped; a $ref cycle that
 * cannot produce a finite value is refused. */
#ifndef KIRI_JSON_SCHEMA_H
#define KIRI_JSON_SCHEMA_H

#include <stddef.h>

struct kiri_status_info;

/* Compiles schema[0..len) (JSON text) into GBNF text whose top rule is root_name (NULL: "root")
 * and whose every other rule name starts with prefix (NULL: ""), so several schemas can be joined
 * in one grammar (tool calls do). *gbnf is NUL-terminated, owned by the caller (kiri_mem_free),
 * *gbnf_len its length. Errors: KIRI_E_INVALID_ARG for text that is not JSON or not a schema
 * (field "json_schema"), KIRI_E_UNSUPPORTED for a keyword or value outside what is honoured
 * (field: the JSON pointer), KIRI_E_NOMEM. */
int kiri_json_schema_to_gbnf(const char *schema, size_t len, const char *root_name, const char *prefix,
                             char **gbnf, size_t *gbnf_len, struct kiri_status_info *info);

#endif
