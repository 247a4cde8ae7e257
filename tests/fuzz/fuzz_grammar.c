/* libFuzzer target for GBNF grammars: the input is a grammar, optionally followed by a NUL byte
 * and text. The grammar is compiled; when accepted, the text is fed one byte at a time (a refused
 * byte is skipped, as a sampler would never pick it), and every few bytes the token mask over
 * stories260K's vocabulary is computed with and without the cache and compared, so a bad stack,
 * an unbounded expansion or a stale cache entry shows up under ASan or as a mismatch.
 *
 * Build: cmake -DKIRI_FUZZ=ON with clang (target fuzz_grammar); run from the repository root:
 *        build-fuzz/fuzz_grammar -max_total_time=120 corpus/ tests/fuzz/seeds/grammar/
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "kiri.h"
#include "model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Matching steps one input may spend (kiri_grammar_stats.steps summed), checked before each mask:
 * one mask (2^20 + 4 per trie node) and one byte fed (2^16) may still go past it, so an input stays
 * under about 2.2M steps. A step costs 0.2-1.1 us under ASan, UBSan and the fuzzer's comparison
 * tracing, which keeps the slowest input near 2.5 s against libFuzzer's -timeout of 5 s. */
#define FUZZ_MAX_WORK ((uint64_t)1 << 20)

static struct kiri_model *model;
static struct kiri_grammar_vocab *vocab;
static struct kiri_grammar_cache *cache;

static void setup(void)
{
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.vocab_only = 1;
    if (kiri_model_open("models/stories260K.gguf", &mp, &model, NULL) != KIRI_OK ||
        kiri_grammar_vocab_init(model->tokenizer, &vocab) != KIRI_OK ||
        kiri_grammar_cache_init((size_t)4 << 20, &cache) != KIRI_OK)
        abort(); /* run from the repository root */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!model)
        setup();
    const uint8_t *nul = memchr(data, 0, size);
    const size_t glen = nul ? (size_t)(nul - data) : size;
    struct kiri_grammar *g = NULL;
    struct kiri_status_info info;
    if (kiri_grammar_compile((const char *)data, glen, &g, &info) != KIRI_OK) {
        if (!strstr(info.message, "grammar line") && info.code != KIRI_E_NOMEM && glen <= KIRI_GRAMMAR_MAX_SIZE)
            abort(); /* every refusal names its line and column */
        return 0;
    }
    struct kiri_grammar_state *st = NULL;
    if (kiri_grammar_state_init(g, &st) == KIRI_OK) {
        const size_t words = ((size_t)kiri_grammar_vocab_n_vocab(vocab) + 31) / 32;
        uint32_t *copy = malloc(words * 4);
        const uint8_t *text = nul ? nul + 1 : NULL;
        const size_t n = nul ? size - glen - 1 : 0;
        /* Each call is bounded by the matcher; the run of one input is bounded here, so that an
         * ambiguous grammar kept just under the bounds for thousands of bytes stays within
         * libFuzzer's time limit (a server ends the request at the first bound passed). */
        uint64_t work = 0;
        struct kiri_grammar_stats stats;
        for (size_t i = 0; i <= n && i < 4096 && copy && work < FUZZ_MAX_WORK; i++) {
            if (i % 4 == 0) {
                const uint32_t *a, *b;
                int32_t na = 0, nb = 0;
                const int ra = kiri_grammar_state_mask(st, vocab, NULL, &a, &na);
                if (ra == KIRI_OK)
                    memcpy(copy, a, words * 4);
                kiri_grammar_state_stats(st, &stats);
                work += stats.steps;
                if (work >= FUZZ_MAX_WORK)
                    break;
                const int rb = kiri_grammar_state_mask(st, vocab, cache, &b, &nb);
                kiri_grammar_state_stats(st, &stats);
                work += stats.steps;
                if (ra == KIRI_OK && rb == KIRI_OK && (na != nb || memcmp(copy, b, words * 4) != 0))
                    abort();
                if ((ra == KIRI_E_UNSUPPORTED || rb == KIRI_E_UNSUPPORTED) &&
                    !strstr(kiri_grammar_state_error(st), "grammar"))
                    abort(); /* every bound passed is named */
            }
            if (i < n) {
                const int rc = kiri_grammar_state_feed(st, text + i, 1);
                kiri_grammar_state_stats(st, &stats);
                work += stats.steps;
                if (rc != KIRI_OK && rc != KIRI_E_INVALID_ARG && rc != KIRI_E_UNSUPPORTED)
                    break;
            }
        }
        (void)kiri_grammar_state_can_end(st);
        (void)kiri_grammar_state_done(st);
        free(copy);
    }
    kiri_grammar_state_free(st);
    kiri_grammar_free(g);
    return 0;
}
