/* libFuzzer target for JSON Schema -> GBNF: compile the input as a schema (with and without a
 * rule prefix); an accepted schema must give NUL-terminated GBNF within KIRI_GRAMMAR_MAX_SIZE that
 * starts with its root rule and that the engine's grammar check accepts; a refused one must fill
 * the error record with a known code, a field and a message. Compilation time is bounded by the
 * compiler's caps (libFuzzer's -timeout catches a regression).
 *
 * Build: cmake -S . -B build-fuzz -DKIRI_FUZZ=ON -DCMAKE_C_COMPILER=clang && cmake --build build-fuzz
 *        --target fuzz_json_schema
 * Run:   build-fuzz/fuzz_json_schema -max_total_time=60 corpus/ tests/fuzz/seeds/json_schema/
 */
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "json_schema.h"
#include "kiri.h"
#include "mem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(const char *text, size_t len, const char *root, const char *prefix)
{
    char *g = NULL;
    size_t n = 0;
    struct kiri_status_info info;
    int rc = kiri_json_schema_to_gbnf(text, len, root, prefix, &g, &n, &info);
    if (rc == KIRI_OK) {
        if (!g || strlen(g) != n || n > KIRI_GRAMMAR_MAX_SIZE)
            abort();
        const char *want = root ? root : "root";
        if (strncmp(g, want, strlen(want)) || strncmp(g + strlen(want), " ::= ", 5))
            abort();
        /* The engine wants a rule "root"; a named root is joined under one, as tool calls do. */
        char *joined = g;
        if (root) {
            joined = malloc(n + 32);
            if (!joined)
                abort();
            size_t k = (size_t)snprintf(joined, 32, "root ::= %s\n", root);
            memcpy(joined + k, g, n + 1);
            n += k;
        }
        struct kiri_status_info ginfo;
        if (kiri_grammar_check(joined, n, &ginfo) != KIRI_OK)
            abort();
        if (joined != g)
            free(joined);
        kiri_mem_free(g);
        return;
    }
    if (g || info.code != rc || !info.message[0] || !info.field[0])
        abort();
    if (rc != KIRI_E_INVALID_ARG && rc != KIRI_E_UNSUPPORTED && rc != KIRI_E_NOMEM)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check((const char *)data, size, NULL, NULL);
    if (size < 4096)
        check((const char *)data, size, "tool", "t-");
    return 0;
}
