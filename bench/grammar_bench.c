/* Times grammar token masks on a real vocabulary: a JSON text is tokenized by the model's own
 * tokenizer and walked token by token through a JSON grammar; at every step the mask is computed
 * cold (no cache), then looked up in a warm cache, and the greedy fast path's one-token check is
 * timed too. Usage: grammar_bench MODEL.gguf [GRAMMAR.gbnf] (the model may hold only a vocabulary). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "kiri.h"
#include "model.h"

static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "object ::= \"{\" ws ( string \":\" ws value (\",\" ws string \":\" ws value)* )? \"}\" ws\n"
    "array  ::= \"[\" ws ( value (\",\" ws value)* )? \"]\" ws\n"
    "string ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) )* \"\\\"\" ws\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static const char *TEXT =
    "{\"name\": \"Ada Lovelace\", \"born\": 1815, \"languages\": [\"English\", \"French\"], "
    "\"notes\": \"She wrote the first published algorithm for a machine.\", \"score\": -12.5e3, "
    "\"active\": true, \"tags\": {\"field\": \"mathematics\", \"era\": \"Victorian\"}}";

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = malloc(KIRI_GRAMMAR_MAX_SIZE + 1);
    *len = buf ? fread(buf, 1, KIRI_GRAMMAR_MAX_SIZE, f) : 0;
    fclose(f);
    return buf;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: grammar_bench MODEL.gguf [GRAMMAR.gbnf]\n");
        return 2;
    }
    const char *gbnf = JSON_GBNF;
    size_t glen = strlen(JSON_GBNF);
    char *file = NULL;
    if (argc > 2 && !(gbnf = file = read_file(argv[2], &glen))) {
        fprintf(stderr, "cannot read %s\n", argv[2]);
        return 1;
    }
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.vocab_only = 1;
    struct kiri_model *m = NULL;
    struct kiri_status_info info;
    if (kiri_model_open(argv[1], &mp, &m, &info) != KIRI_OK) {
        fprintf(stderr, "%s: %s\n", argv[1], info.message);
        return 1;
    }
    struct kiri_grammar *g = NULL;
    if (kiri_grammar_compile(gbnf, glen, &g, &info) != KIRI_OK) {
        fprintf(stderr, "grammar: %s\n", info.message);
        return 1;
    }
    double t0 = kiri_time_seconds();
    struct kiri_grammar_vocab *v = NULL;
    if (kiri_grammar_vocab_init(m->tokenizer, &v) != KIRI_OK)
        return 1;
    const double t_trie = kiri_time_seconds() - t0;
    struct kiri_grammar_state *st = NULL;
    struct kiri_grammar_cache *cache = NULL;
    if (kiri_grammar_state_init(g, &st) != KIRI_OK || kiri_grammar_cache_init((size_t)256 << 20, &cache) != KIRI_OK)
        return 1;
    int32_t ids[1024];
    const int n = kiri_tokenize(m, TEXT, strlen(TEXT), 0, 0, ids, 1024);
    double cold = 0, warm = 0, fast = 0, worst = 0;
    int steps = 0, allowed_sum = 0;
    for (int i = 0; i < n && n <= 1024; i++) {
        const uint32_t *mask;
        int32_t n_allowed;
        t0 = kiri_time_seconds();
        if (kiri_grammar_state_mask(st, v, NULL, &mask, &n_allowed) != KIRI_OK)
            return 1;
        const double c = kiri_time_seconds() - t0;
        cold += c;
        worst = c > worst ? c : worst;
        allowed_sum += n_allowed;
        kiri_grammar_state_mask(st, v, cache, &mask, NULL); /* fills the cache */
        t0 = kiri_time_seconds();
        kiri_grammar_state_mask(st, v, cache, &mask, NULL);
        warm += kiri_time_seconds() - t0;
        t0 = kiri_time_seconds();
        const int ok = kiri_grammar_state_allows(st, v, ids[i]);
        fast += kiri_time_seconds() - t0;
        if (ok != 1) {
            fprintf(stderr, "token %d of the text is not allowed at step %d\n", ids[i], i);
            return 1;
        }
        size_t len;
        const uint8_t *p = kiri_grammar_vocab_piece(v, ids[i], &len);
        if (kiri_grammar_state_feed(st, p, len) != KIRI_OK)
            return 1;
        steps++;
    }
    /* The same walk again: states repeat, so every mask comes from the cache. */
    uint64_t computed0, hits0, computed1, hits1;
    kiri_grammar_cache_counts(cache, &computed0, &hits0);
    kiri_grammar_state_reset(st);
    t0 = kiri_time_seconds();
    for (int i = 0; i < steps; i++) {
        const uint32_t *mask;
        kiri_grammar_state_mask(st, v, cache, &mask, NULL);
        size_t len;
        const uint8_t *p = kiri_grammar_vocab_piece(v, ids[i], &len);
        kiri_grammar_state_feed(st, p, len);
    }
    const double rewalk = kiri_time_seconds() - t0;
    kiri_grammar_cache_counts(cache, &computed1, &hits1);
    printf("vocabulary %d tokens (%s): trie built in %.1f ms\n", kiri_model_n_vocab(m), argv[1], t_trie * 1e3);
    printf("walk of %d tokens: mask cold %.3f ms/token (worst %.3f ms, %.0f tokens allowed on average), "
           "cached %.1f us/token, one-token check %.2f us; re-walk with the cache %.1f us/token "
           "(%llu hits, %llu computed)\n",
           steps, cold / steps * 1e3, worst * 1e3, (double)allowed_sum / steps, warm / steps * 1e6,
           fast / steps * 1e6, rewalk / steps * 1e6, (unsigned long long)(hits1 - hits0),
           (unsigned long long)(computed1 - computed0));
    kiri_grammar_state_free(st);
    kiri_grammar_cache_free(cache);
    kiri_grammar_vocab_free(v);
    kiri_grammar_free(g);
    kiri_model_close(m);
    free(file);
    return 0;
}
