/* Drives server/tools.h for tests/test_tools.py.
 *
 * Usage: tool_calls detect TEMPLATE_FILE            prints the format's name
 *        tool_calls plan FORMAT CHOICE NAME PARALLEL TOOLS_FILE
 *                                                  prints the GBNF, then "\n%%\n" and the triggers
 *                                                  one a line (CHOICE auto|none|required|named;
 *                                                  NAME "-" for none)
 *        tool_calls parse FORMAT PARALLEL CHUNK OUTPUT_FILE
 *                                                  feeds the output CHUNK bytes at a time (0: all
 *                                                  at once) and prints {"content", "tool_calls",
 *                                                  "growth_ok"} as JSON; growth_ok says the content
 *                                                  only ever grew by appending
 *        tool_calls generic CHOICE NAME PARALLEL MESSAGES_FILE TOOLS_FILE
 *                                                  prints the generic format's messages
 * On failure "STATUS field: message" goes to stderr and the exit status is 1.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "tools.h"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = realloc(buf, cap * 2 + 1);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

static int format_of(const char *name)
{
    for (int f = KIRI_TOOLS_GENERIC; f <= KIRI_TOOLS_GEMMA; f++)
        if (!strcmp(kiri_tools_format_name(f), name))
            return f;
    return -1;
}

static int choice_of(const char *name)
{
    static const char *const names[] = {"auto", "none", "required", "named"};
    for (int c = 0; c < 4; c++)
        if (!strcmp(names[c], name))
            return c;
    return -1;
}

static int failed(int rc, const struct kiri_status_info *info)
{
    fprintf(stderr, "%s %s: %s\n", kiri_status_name(rc), info->field, info->message);
    return 1;
}

int main(int argc, char **argv)
{
    struct kiri_status_info info;
    kiri_error_clear(&info);
    size_t len = 0, len2 = 0;
    if (argc == 3 && !strcmp(argv[1], "detect")) {
        char *t = slurp(argv[2], &len);
        if (!t)
            return 2;
        printf("%s\n", kiri_tools_format_name(kiri_tools_detect(t, len)));
        free(t);
        return 0;
    }
    if (argc == 7 && !strcmp(argv[1], "plan")) {
        char *tools = slurp(argv[6], &len);
        if (!tools || format_of(argv[2]) < 0 || choice_of(argv[3]) < 0)
            return 2;
        struct kiri_tools_plan plan;
        int rc = kiri_tools_plan_init(format_of(argv[2]), tools, len, choice_of(argv[3]),
                                      strcmp(argv[4], "-") ? argv[4] : NULL, atoi(argv[5]), NULL, 0, &plan, &info);
        free(tools);
        if (rc != KIRI_OK)
            return failed(rc, &info);
        printf("%s\n%%%%\n", plan.grammar ? plan.grammar : "");
        for (int i = 0; i < plan.n_triggers; i++)
            printf("%s\n", plan.triggers[i]);
        kiri_tools_plan_free(&plan);
        return 0;
    }
    if (argc == 6 && !strcmp(argv[1], "parse")) {
        char *out = slurp(argv[5], &len);
        const int format = format_of(argv[2]);
        if (!out || format < 0)
            return 2;
        struct kiri_tools_parser *p;
        if (kiri_tools_parser_init(format, atoi(argv[3]), 42, &p) != KIRI_OK)
            return 2;
        size_t chunk = (size_t)atol(argv[4]), seen = 0;
        char *prev = calloc(1, len + 1);
        int growth_ok = 1;
        for (size_t at = 0; at < len;) {
            size_t n = chunk && len - at > chunk ? chunk : len - at;
            if (kiri_tools_parser_feed(p, out + at, n) != KIRI_OK)
                return 2;
            at += n;
            size_t clen;
            const char *c = kiri_tools_parser_content(p, &clen);
            if (clen < seen || memcmp(c, prev, seen) != 0)
                growth_ok = 0;
            if (clen <= len) {
                memcpy(prev, c, clen);
                seen = clen;
            }
        }
        if (kiri_tools_parser_finish(p) != KIRI_OK)
            return 2;
        size_t clen;
        const char *c = kiri_tools_parser_content(p, &clen);
        if (clen < seen || memcmp(c, prev, seen) != 0)
            growth_ok = 0;
        json_t *calls = json_array();
        for (int i = 0; i < kiri_tools_parser_n_calls(p); i++) {
            const struct kiri_tool_call *tc = kiri_tools_parser_call(p, i);
            json_array_append_new(calls, json_pack("{s:s,s:s,s:s}", "id", tc->id, "name", tc->name, "arguments",
                                                   tc->arguments));
        }
        json_t *o = json_pack("{s:s%,s:o,s:b}", "content", c, clen, "tool_calls", calls, "growth_ok", growth_ok);
        char *s = json_dumps(o, JSON_COMPACT);
        printf("%s\n", s);
        free(s);
        json_decref(o);
        kiri_tools_parser_free(p);
        free(prev);
        free(out);
        return 0;
    }
    if (argc == 7 && !strcmp(argv[1], "generic")) {
        char *m = slurp(argv[5], &len), *t = slurp(argv[6], &len2), *res = NULL;
        size_t res_len = 0;
        if (!m || !t || choice_of(argv[2]) < 0)
            return 2;
        int rc = kiri_tools_generic_messages(m, len, t, len2, choice_of(argv[2]), strcmp(argv[3], "-") ? argv[3] : NULL,
                                             atoi(argv[4]), &res, &res_len, &info);
        free(m);
        free(t);
        if (rc != KIRI_OK)
            return failed(rc, &info);
        fwrite(res, 1, res_len, stdout);
        kiri_mem_free(res);
        return 0;
    }
    fprintf(stderr, "usage: see the comment at the top of tests/tools/tool_calls.c\n");
    return 2;
}
