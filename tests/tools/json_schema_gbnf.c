/* Prints the GBNF grammar kiri compiles from a JSON Schema file, for tests/test_json_schema.py.
 *
 * Usage: json_schema_gbnf SCHEMA_FILE [--root NAME] [--prefix P]
 * SCHEMA_FILE "-" reads stdin. The grammar goes to stdout; on failure, "STATUS_NAME field:
 * message" goes to stderr and the exit status is 1 (2 for a usage or I/O error).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h"
#include "kiri.h"
#include "mem.h"

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *nb = realloc(buf, cap * 2);
        if (!nb) {
            free(buf);
            return NULL;
        }
        buf = nb;
        cap *= 2;
    }
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s SCHEMA_FILE [--root NAME] [--prefix P]\n", argv[0]);
        return 2;
    }
    const char *root = NULL, *prefix = NULL;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--root"))
            root = argv[i + 1];
        else if (!strcmp(argv[i], "--prefix"))
            prefix = argv[i + 1];
    }
    FILE *f = strcmp(argv[1], "-") ? fopen(argv[1], "rb") : stdin;
    if (!f) {
        perror(argv[1]);
        return 2;
    }
    size_t len = 0;
    char *text = read_all(f, &len);
    if (f != stdin)
        fclose(f);
    if (!text)
        return 2;
    char *gbnf = NULL;
    size_t gbnf_len = 0;
    struct kiri_status_info info;
    int rc = kiri_json_schema_to_gbnf(text, len, root, prefix, &gbnf, &gbnf_len, &info);
    free(text);
    if (rc) {
        fprintf(stderr, "%s %s: %s\n", kiri_status_name(rc), info.field, info.message);
        return 1;
    }
    fwrite(gbnf, 1, gbnf_len, stdout);
    kiri_mem_free(gbnf);
    return 0;
}
