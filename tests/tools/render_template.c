/* Renders a chat template for tests/test_chat_template.py, which compares the output with
 * jinja2's byte for byte.
 *
 * Usage: render_template TEMPLATE_FILE [--bos S] [--eos S] [--gen] [--max-output N]
 *                        [--max-steps N] [--max-memory N] [--none ROLE] [ROLE CONTENT]...
 *        render_template TEMPLATE_FILE --json CONVERSATION_FILE [--tools TOOLS_FILE]
 *                        [--vars VARS_FILE] [--bos S] [--eos S] [--gen]
 * TEMPLATE_FILE "-chatml" uses the built-in ChatML template. Each ROLE CONTENT pair is one
 * message; "--none ROLE" adds a message whose content is none. With --json the messages are a
 * JSON list in a file (tool calls, tool results), --tools a JSON list of tools and --vars a JSON
 * object of further variables (enable_thinking...), rendered with
 * kiri_chat_template_render_json_vars. The rendered text goes to stdout
 * as is; on failure, "STATUS_NAME field: message" goes to stderr and the exit status is 1.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "chat_template.h"

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        cap *= 2;
    }
    fclose(f);
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s TEMPLATE_FILE [--bos S] [--eos S] [--gen] [ROLE CONTENT]...\n",
                argv[0]);
        return 2;
    }
    const char *bos = NULL, *eos = NULL, *json_path = NULL, *tools_path = NULL, *vars_path = NULL;
    int gen = 0, n_msgs = 0;
    struct kiri_chat_limits limits = {0, 0, 0};
    struct kiri_chat_message *msgs = calloc((size_t)argc, sizeof *msgs);
    if (!msgs)
        return 2;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--gen")) {
            gen = 1;
        } else if (i + 1 < argc && !strcmp(argv[i], "--bos")) {
            bos = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--eos")) {
            eos = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--max-output")) {
            limits.max_output = strtoull(argv[++i], NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "--max-steps")) {
            limits.max_steps = strtoull(argv[++i], NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "--max-memory")) {
            limits.max_memory = strtoull(argv[++i], NULL, 10);
        } else if (i + 1 < argc && !strcmp(argv[i], "--json")) {
            json_path = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--tools")) {
            tools_path = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--vars")) {
            vars_path = argv[++i];
        } else if (i + 1 < argc && !strcmp(argv[i], "--none")) {
            msgs[n_msgs].role = argv[++i];
            msgs[n_msgs++].content = NULL;
        } else if (i + 1 < argc) {
            msgs[n_msgs].role = argv[i];
            msgs[n_msgs++].content = argv[++i];
        } else {
            fprintf(stderr, "unpaired argument %s\n", argv[i]);
            return 2;
        }
    }
    size_t len;
    char *src;
    if (!strcmp(argv[1], "-chatml")) {
        src = strdup(kiri_chat_template_chatml());
        len = src ? strlen(src) : 0;
    } else {
        src = read_file(argv[1], &len);
    }
    if (!src) {
        fprintf(stderr, "cannot read %s\n", argv[1]);
        return 2;
    }
    struct kiri_status_info info;
    struct kiri_chat_template *t;
    char *out;
    size_t out_len;
    kiri_error_clear(&info);
    int rc = kiri_chat_template_init(src, len, &t, &info);
    if (rc == KIRI_OK && json_path) {
        size_t mlen = 0, tlen = 0, vlen = 0;
        char *m = read_file(json_path, &mlen);
        char *tools = tools_path ? read_file(tools_path, &tlen) : NULL;
        char *vars = vars_path ? read_file(vars_path, &vlen) : NULL;
        if (!m || (tools_path && !tools) || (vars_path && !vars)) {
            fprintf(stderr, "cannot read %s\n", !m ? json_path : !vars && vars_path ? vars_path : tools_path);
            return 2;
        }
        rc = kiri_chat_template_render_json_vars(t, m, mlen, tools, tlen, vars, vlen, bos, eos, gen,
                                                 &limits, &out, &out_len, &info);
        free(m);
        free(tools);
        free(vars);
        kiri_chat_template_free(t);
    } else if (rc == KIRI_OK) {
        rc = kiri_chat_template_render(t, msgs, n_msgs, bos, eos, gen, &limits, &out, &out_len, &info);
        kiri_chat_template_free(t);
    }
    free(src);
    free(msgs);
    if (rc != KIRI_OK) {
        fprintf(stderr, "%s %s: %s\n", kiri_status_name(rc), info.field, info.message);
        return 1;
    }
    fwrite(out, 1, out_len, stdout);
    kiri_mem_free(out);
    return 0;
}
