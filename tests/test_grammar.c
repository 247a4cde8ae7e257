/* Tests for runtime/grammar: GBNF parse errors (line and column), acceptance of strings, the
 * stack and work bounds on ambiguous grammars, and token masks against a brute-force check of every
 * token of real vocabularies. */
#include "test.h"

#include "grammar.h"
#include "kiri.h"
#include "model.h"

static int accepts(const char *gbnf, const char *text)
{
    struct kiri_grammar *g = NULL;
    struct kiri_status_info info;
    if (kiri_grammar_compile(gbnf, strlen(gbnf), &g, &info) != KIRI_OK) {
        fprintf(stderr, "compile failed: %s\n", info.message);
        return -1;
    }
    struct kiri_grammar_state *st = NULL;
    int r = -1;
    if (kiri_grammar_state_init(g, &st) == KIRI_OK) {
        const int rc = kiri_grammar_state_feed(st, text, strlen(text));
        r = rc == KIRI_OK ? kiri_grammar_state_can_end(st) : rc == KIRI_E_INVALID_ARG ? 0 : rc;
    }
    kiri_grammar_state_free(st);
    kiri_grammar_free(g);
    return r;
}

static const char *JSON_GBNF =
    "root   ::= object\n"
    "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
    "\n"
    "object ::=\n"
    "  \"{\" ws (\n"
    "            string \":\" ws value\n"
    "    (\",\" ws string \":\" ws value)*\n"
    "  )? \"}\" ws\n"
    "\n"
    "array  ::=\n"
    "  \"[\" ws (\n"
    "            value\n"
    "    (\",\" ws value)*\n"
    "  )? \"]\" ws\n"
    "\n"
    "string ::=\n"
    "  \"\\\"\" (\n"
    "    [^\"\\\\\\x7F\\x00-\\x1F] |\n"
    "    \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}) # escapes\n"
    "  )* \"\\\"\" ws\n"
    "\n"
    "number ::= (\"-\"? ([0-9] | [1-9] [0-9]{0,15})) (\".\" [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws\n"
    "ws ::= | \" \" | \"\\n\" [ \\t]{0,20}\n";

static void test_accepts(void)
{
    static const struct {
        const char *gbnf, *text;
        int ok;
    } cases[] = {
        {"root ::= \"abc\"", "abc", 1},
        {"root ::= \"abc\"", "ab", 0},
        {"root ::= \"abc\"", "abcd", 0},
        {"root ::= \"a\" | \"b\"", "b", 1},
        {"root ::= [a-c]+", "abccba", 1},
        {"root ::= [a-c]+", "", 0},
        {"root ::= [^a-c]*", "xyz\xE2\x82\xAC", 1},
        {"root ::= [^a-c]*", "xaz", 0},
        {"root ::= \"x\"{2,3}", "x", 0},
        {"root ::= \"x\"{2,3}", "xx", 1},
        {"root ::= \"x\"{2,3}", "xxx", 1},
        {"root ::= \"x\"{2,3}", "xxxx", 0},
        {"root ::= \"x\"{2,}", "xxxxxxx", 1},
        {"root ::= (\"ab\" | \"c\"){3}", "abcab", 1},
        {"root ::= (\"ab\" | \"c\"){3}", "abc", 0},
        {"root ::= .", "\xF0\x9F\x98\x80", 1},
        {"root ::= .", "\xED\xA0\x80", 0},   /* a surrogate is no character */
        {"root ::= .", "\xC0\x80", 0},       /* overlong */
        {"root ::= [\\u00e9-\\u00ff]", "\xC3\xA9", 1},
        {"root ::= [\\u00e9-\\u00ff]", "\xC3\xA8", 0},
        {"root ::= [\\U0001F600-\\U0001F64F]", "\xF0\x9F\x98\x80", 1},
        {"root ::= [\\x00-\\U0010FFFF]", "\xF4\x8F\xBF\xBF", 1},
        {"root ::= [\\x00-\\U0010FFFF]", "\xF4\x90\x80\x80", 0},
        {"root ::= [日本語]+", "日本", 1},
        {"root ::= \"\\x41\\u00e9\\t\\\\\"", "A\xC3\xA9\t\\", 1},
        {"root ::= a b\na ::= \"x\"?\nb ::= \"y\"", "y", 1},
        {"root ::= item (\",\" item)*\nitem ::= [0-9]+  # a comment\n", "1,22,333", 1},
        {"root ::= item (\",\" item)*\nitem ::= [0-9]+\n", "1,,2", 0},
        {"root ::= \"a\"\n  | \"b\"\n  | \"c\"", "c", 1},
        {"root ::= ( \"x\"\n  \"y\" )", "xy", 1},
        {"root ::= [-a]", "-", 1},
        {"root ::= [a-]", "-", 1},
        {"root ::= [\\]]", "]", 1},
        {"root ::= e\ne ::= t (\"+\" t)*\nt ::= \"(\" e \")\" | [0-9]", "(1+(2+3))+4", 1},
        {"root ::= e\ne ::= t (\"+\" t)*\nt ::= \"(\" e \")\" | [0-9]", "(1+2", 0},
        {"root ::= x | \"y\"\nx ::= \"x\" x", "y", 1}, /* the unproductive alternative is dropped */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int r = accepts(cases[i].gbnf, cases[i].text);
        if (r != cases[i].ok)
            fprintf(stderr, "case %zu: %s on \"%s\"\n", i, cases[i].gbnf, cases[i].text);
        CHECK_EQ_INT(r, cases[i].ok);
    }
    CHECK_EQ_INT(accepts(JSON_GBNF, "{\"a\": [1, 2.5, -3e7, true, null, \"x\\u00e9\\n\"], \"b\": {}}"), 1);
    CHECK_EQ_INT(accepts(JSON_GBNF, "{\"a\": [1, 2.5,]}"), 0);
    CHECK_EQ_INT(accepts(JSON_GBNF, "{\"a\": \"\x01\"}"), 0);
}

static void test_errors(void)
{
    static const struct {
        const char *gbnf, *where, *what;
    } cases[] = {
        {"", "line 1, column 1", "no rule named 'root'"},
        {"rot ::= \"a\"", "line 1, column 1", "no rule named 'root'"},
        {"root ::= foo", "line 1, column 10", "'foo' is used but never defined"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1", "defined twice"},
        {"root ::= \"abc", "line 1, column 10", "not closed"},
        {"root ::= [abc", "line 1, column 10", "not closed"},
        {"root ::= (\"a\" | \"b\"", "line 1, column 10", "not closed"},
        {"root ::= \"a\")", "line 1, column 13", "unexpected ')'"},
        {"root ::= *", "line 1, column 10", "nothing before it"},
        {"root ::= \"\\q\"", "line 1, column 11", "unknown escape"},
        {"root ::= \"\\x4\"", "line 1, column 11", "hex digits"},
        {"root ::= \"\\uD800\"", "line 1, column 11", "not a Unicode scalar"},
        {"root ::= [z-a]", "line 1, column 10", "reversed"},
        {"root ::= \"x\"{3,2}", "line 1, column 13", "below its minimum"},
        {"root ::= \"x\"{99999}", "line 1, column 14", "repetition count above"},
        {"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", "line 2, column 1", "left-recursive"},
        {"root ::= a\na ::= b? a \"x\" | \"y\"\nb ::= \"z\"", "line 2, column 1", "left-recursive"},
        {"root ::= (\"\")*", "line 1, column 14", "without consuming input"},
        {"root ::= \"x\" root", "line 1, column 1", "no finite text"},
        {"root ::= \"a\" b ::= \"c\"", "line 1, column 14", "line of its own"},
        {"root = \"a\"", "line 1, column 6", "expected '::='"},
        {"root ::= \"a\"\n\n  ::= \"b\"", "line 3, column 3", "expected a rule name"},
        {"root ::= \"\xC3\"", "line 1, column 11", "invalid UTF-8"},
        {"root ::= [^\\x00-\\U0010FFFF]", "line 1, column 10", "matches nothing"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct kiri_status_info info;
        const int rc = kiri_grammar_check(cases[i].gbnf, strlen(cases[i].gbnf), &info);
        CHECK_EQ_INT(rc, KIRI_E_INVALID_ARG);
        CHECK_STR(info.field, "grammar");
        if (!strstr(info.message, cases[i].where) || !strstr(info.message, cases[i].what)) {
            fprintf(stderr, "case %zu: got \"%s\", want \"%s\" and \"%s\"\n", i, info.message, cases[i].where,
                    cases[i].what);
            CHECK(0);
        }
    }
    /* Deep nesting is refused, not a stack overflow. */
    char *deep = test_xmalloc(4096);
    size_t n = (size_t)snprintf(deep, 4096, "root ::= ");
    for (int k = 0; k < 1000; k++)
        deep[n++] = '(';
    deep[n] = 0;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_grammar_check(deep, n, &info), KIRI_E_INVALID_ARG);
    CHECK(strstr(info.message, "nest") != NULL);
    free(deep);
    CHECK_EQ_INT(kiri_grammar_check("root ::= \"a\"", KIRI_GRAMMAR_MAX_SIZE + 1, &info), KIRI_E_INVALID_ARG);
}

/* An ambiguous grammar whose paths reconverge after every x is accepted over any length; nesting
 * past the depth bound ends with a clear error. */
static void test_caps(void)
{
    struct kiri_grammar *g = NULL;
    const char *amb = "root ::= x*\nx ::= \"a\" | \"a\" \"a\"? | [a-z] | [a-b] \"a\"?";
    CHECK_EQ_INT(kiri_grammar_compile(amb, strlen(amb), &g, NULL), KIRI_OK);
    struct kiri_grammar_state *st = NULL;
    CHECK_EQ_INT(kiri_grammar_state_init(g, &st), KIRI_OK);
    int rc = KIRI_OK;
    for (int k = 0; k < 10000 && rc == KIRI_OK; k++)
        rc = kiri_grammar_state_feed(st, "a", 1);
    CHECK_EQ_INT(rc, KIRI_OK);
    struct kiri_grammar_stats stats;
    kiri_grammar_state_stats(st, &stats);
    CHECK(stats.n_stacks <= 8 && stats.peak_stacks <= 8);
    kiri_grammar_state_free(st);
    kiri_grammar_free(g);
    /* Nesting past the depth bound. */
    const char *nest = "root ::= \"[\" root? \"]\"";
    CHECK_EQ_INT(kiri_grammar_compile(nest, strlen(nest), &g, NULL), KIRI_OK);
    CHECK_EQ_INT(kiri_grammar_state_init(g, &st), KIRI_OK);
    rc = KIRI_OK;
    int fed = 0;
    for (; fed < 5000 && rc == KIRI_OK; fed++)
        rc = kiri_grammar_state_feed(st, "[", 1);
    CHECK_EQ_INT(rc, KIRI_E_UNSUPPORTED);
    CHECK(fed > 1000);
    CHECK_STR(kiri_grammar_state_error(st), "grammar nests deeper than 2048 levels");
    /* The failed byte left the state as it was: the brackets so far can still close. */
    for (int k = 0; k < fed - 1; k++)
        CHECK_EQ_INT(kiri_grammar_state_feed(st, "]", 1), KIRI_OK);
    CHECK(kiri_grammar_state_can_end(st));
    CHECK(kiri_grammar_state_done(st));
    kiri_grammar_state_free(st);
    kiri_grammar_free(g);
}

/* Ambiguity whose paths converge costs nothing: the stacks stay few, and references reached again
 * over the same return are expanded once (d0 .. d29 would otherwise take 2^30 paths to the "a"). */
static void test_converging(void)
{
    char text[1024];
    memset(text, 'a', sizeof text);
    char gbnf[2048];
    size_t n = (size_t)snprintf(gbnf, sizeof gbnf, "root ::= d0*\n");
    for (int k = 0; k < 29; k++)
        n += (size_t)snprintf(gbnf + n, sizeof gbnf - n, "d%d ::= d%d | d%d\n", k, k + 1, k + 1);
    snprintf(gbnf + n, sizeof gbnf - n, "d29 ::= \"a\" | \"a\"\n");
    const char *cases[] = {"root ::= (\"a\" | \"a\")*", "root ::= (x | x x?)*\nx ::= \"a\" | [a-b] | \"a\"", gbnf};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        struct kiri_grammar *g = NULL;
        struct kiri_status_info info;
        CHECK_EQ_INT(kiri_grammar_compile(cases[c], strlen(cases[c]), &g, &info), KIRI_OK);
        struct kiri_grammar_state *st = NULL;
        CHECK_EQ_INT(kiri_grammar_state_init(g, &st), KIRI_OK);
        if (!st) {
            kiri_grammar_free(g);
            continue;
        }
        struct kiri_grammar_stats stats;
        uint32_t most = 0;
        uint64_t most_steps = 0;
        for (size_t i = 0; i < sizeof text; i++) {
            CHECK_EQ_INT(kiri_grammar_state_feed(st, text + i, 1), KIRI_OK);
            kiri_grammar_state_stats(st, &stats);
            most = stats.n_stacks > most ? stats.n_stacks : most;
            most_steps = stats.steps > most_steps ? stats.steps : most_steps;
        }
        CHECK(kiri_grammar_state_can_end(st));
        if (most > 8 || most_steps > 400)
            fprintf(stderr, "case %zu: %u stacks, %llu steps for one byte\n", c, most, (unsigned long long)most_steps);
        CHECK(most <= 8);
        CHECK(most_steps <= 400);
        kiri_grammar_state_free(st);
        kiri_grammar_free(g);
    }
}

/* stories260K's vocabulary (the model opened for it only) and its trie; 0 when either fails. */
static int stories_vocab(struct kiri_model **m, struct kiri_grammar_vocab **v)
{
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.vocab_only = 1;
    CHECK_EQ_INT(kiri_model_open(KIRI_SOURCE_DIR "/models/stories260K.gguf", &mp, m, NULL), KIRI_OK);
    if (!*m)
        return 0;
    CHECK_EQ_INT(kiri_grammar_vocab_init((*m)->tokenizer, v), KIRI_OK);
    if (*v)
        return 1;
    kiri_model_close(*m);
    return 0;
}

/* The fuzz input that once took seconds per byte (tests/fuzz/seeds/grammar/ambiguous_nesting): every
 * "a" may open one more nested root, so the distinct stacks grow with the text. Each byte's work
 * stays proportional to the stacks (expansions that converge are made once), and the text ends at
 * the stack bound with the error naming it, leaving the state as it was. */
static void test_ambiguous_nesting(void)
{
    const char *gbnf = "root ::= x*\nx ::= \"a\" | \"a\"root \"a\"? | [a-z] | [ ::= a-b] \"a\"?\n";
    struct kiri_model *m = NULL;
    struct kiri_grammar_vocab *v = NULL;
    if (!stories_vocab(&m, &v))
        return;
    struct kiri_grammar *g = NULL;
    struct kiri_grammar_state *st = NULL;
    CHECK_EQ_INT(kiri_grammar_compile(gbnf, strlen(gbnf), &g, NULL), KIRI_OK);
    CHECK_EQ_INT(kiri_grammar_state_init(g, &st), KIRI_OK);
    struct kiri_grammar_stats stats;
    int rc = KIRI_OK, fed = 0, masks_failed = 0;
    uint32_t before = 1;
    for (; fed < 5000 && rc == KIRI_OK; fed++) {
        if (fed % 64 == 0) {
            const uint32_t *mask;
            const int mrc = kiri_grammar_state_mask(st, v, NULL, &mask, NULL);
            CHECK(mrc == KIRI_OK || mrc == KIRI_E_UNSUPPORTED);
            if (mrc == KIRI_E_UNSUPPORTED) {
                masks_failed++;
                CHECK(strncmp(kiri_grammar_state_error(st), "grammar too ambiguous: ", 23) == 0);
            }
        }
        rc = kiri_grammar_state_feed(st, "a", 1);
        kiri_grammar_state_stats(st, &stats);
        CHECK(stats.n_stacks <= KIRI_GRAMMAR_MAX_STACKS);
        CHECK(stats.steps <= 8 * (uint64_t)before + 64);
        if (stats.steps > 8 * (uint64_t)before + 64)
            break;
        before = stats.n_stacks;
    }
    CHECK_EQ_INT(rc, KIRI_E_UNSUPPORTED);
    CHECK(fed > 300 && fed < 5000);
    CHECK_STR(kiri_grammar_state_error(st), "grammar too ambiguous: more than 4096 parse stacks");
    /* The walk's own bound stopped the masks first, well before the state reached its bound. */
    CHECK(masks_failed > 0);
    /* The refused byte left the state as it was, and it still answers. */
    kiri_grammar_state_stats(st, &stats);
    CHECK_EQ_INT((int)stats.n_stacks, (int)before);
    CHECK(kiri_grammar_state_can_end(st));
    CHECK_EQ_INT(kiri_grammar_state_feed(st, "0", 1), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_grammar_state_feed(st, "a", 1), KIRI_E_UNSUPPORTED);
    kiri_grammar_state_free(st);
    kiri_grammar_free(g);
    kiri_grammar_vocab_free(v);
    kiri_model_close(m);
}

/* Stacks that double with every byte end at the bound within a few bytes; a start past the bound
 * is refused at compile time. */
static void test_doubling(void)
{
    const char *gbnf = "root ::= a\na ::= [a-z] a x | [a-z] a y | [a-z]{13} \".\"\nx ::= [a-z]\ny ::= [a-z]\n";
    struct kiri_grammar *g = NULL;
    CHECK_EQ_INT(kiri_grammar_compile(gbnf, strlen(gbnf), &g, NULL), KIRI_OK);
    struct kiri_grammar_state *st = NULL;
    CHECK_EQ_INT(kiri_grammar_state_init(g, &st), KIRI_OK);
    int rc = KIRI_OK, fed = 0;
    for (; fed < 20 && rc == KIRI_OK; fed++)
        rc = kiri_grammar_state_feed(st, "q", 1);
    CHECK_EQ_INT(rc, KIRI_E_UNSUPPORTED);
    CHECK(fed <= 13);
    CHECK_STR(kiri_grammar_state_error(st), "grammar too ambiguous: more than 4096 parse stacks");
    kiri_grammar_state_free(st);
    kiri_grammar_free(g);
    /* 5000 alternatives all start at once. */
    char *big = test_xmalloc(64 * 1024);
    size_t n = (size_t)snprintf(big, 64 * 1024, "root ::= \"x0\"");
    for (int k = 1; k < 5000; k++)
        n += (size_t)snprintf(big + n, 64 * 1024 - n, " | \"x%d\"", k);
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_grammar_check(big, n, &info), KIRI_E_INVALID_ARG);
    CHECK(strstr(info.message, "more than 4096 parse stacks") != NULL);
    free(big);
}

/* Every mask bit against feeding the token's bytes to a copy of the state, along a walk through
 * a JSON text (including the inside of strings and a multi-byte character). */
#define STRIDE 10 /* positions of the walk between two brute-force checks */

static void check_masks(const char *vocab_file, const char *gbnf, const char *walk)
{
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.vocab_only = 1;
    struct kiri_model *m = NULL;
    struct kiri_status_info info;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", KIRI_SHARED_DIR, vocab_file);
    if (kiri_model_open(path, &mp, &m, &info) != KIRI_OK) {
        fprintf(stderr, "%s: %s\n", path, info.message);
        CHECK(0);
        return;
    }
    struct kiri_grammar_vocab *v = NULL;
    struct kiri_grammar *g = NULL;
    struct kiri_grammar_state *st = NULL, *probe = NULL;
    struct kiri_grammar_cache *cache = NULL;
    CHECK_EQ_INT(kiri_grammar_vocab_init(m->tokenizer, &v), KIRI_OK);
    CHECK_EQ_INT(kiri_grammar_compile(gbnf, strlen(gbnf), &g, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_grammar_state_init(g, &st), KIRI_OK);
    CHECK_EQ_INT(kiri_grammar_cache_init(64 << 20, &cache), KIRI_OK);
    const int32_t V = kiri_grammar_vocab_n_vocab(v);
    const size_t n = strlen(walk);
    int steps = 0;
    for (size_t i = 0; i <= n; i++) {
        const uint32_t *mask = NULL;
        int32_t n_allowed = 0;
        CHECK_EQ_INT(kiri_grammar_state_mask(st, v, i % 2 ? cache : NULL, &mask, &n_allowed), KIRI_OK);
        int32_t count = 0, bad = 0;
        for (int32_t id = 0; id < V; id++) {
            const int bit = (mask[id / 32] >> (id % 32)) & 1;
            count += bit;
            /* The reference: a fresh state fed the walk so far, then the token's bytes. */
            size_t len;
            const uint8_t *p = kiri_grammar_vocab_piece(v, id, &len);
            int want;
            if (kiri_model_is_eog(m, id)) {
                want = kiri_grammar_state_can_end(st);
            } else if (!p) {
                want = 0;
            } else {
                /* A rejected feed leaves the state as it was, so the probe is rebuilt only after
                 * a token it accepted. */
                if (!probe) {
                    kiri_grammar_state_init(g, &probe);
                    kiri_grammar_state_feed(probe, walk, i);
                }
                want = kiri_grammar_state_feed(probe, p, len) == KIRI_OK;
                if (want) {
                    kiri_grammar_state_free(probe);
                    probe = NULL;
                }
            }
            if (bit != want && bad++ < 3)
                fprintf(stderr, "%s step %zu: token %d mask %d, feeding %d\n", vocab_file, i, id, bit, want);
            CHECK_EQ_INT(kiri_grammar_state_allows(st, v, id), want);
            if (bit != want)
                CHECK(0);
        }
        CHECK_EQ_INT(count, n_allowed);
        kiri_grammar_state_free(probe); /* fed the walk up to i only */
        probe = NULL;
        if (i < n)
            CHECK_EQ_INT(kiri_grammar_state_feed(st, walk + i, 1), KIRI_OK);
        steps++;
        /* The brute force is slow: check a spread of positions, not every one. */
        if (i + STRIDE < n)
            for (int k = 0; k < STRIDE - 1; k++, i++)
                CHECK_EQ_INT(kiri_grammar_state_feed(st, walk + i + 1, 1), KIRI_OK);
    }
    CHECK(kiri_grammar_state_can_end(st));
    uint64_t computed, hits;
    kiri_grammar_cache_counts(cache, &computed, &hits);
    CHECK(computed > 0);
    (void)steps;
    kiri_grammar_state_free(probe);
    kiri_grammar_state_free(st);
    kiri_grammar_cache_free(cache);
    kiri_grammar_free(g);
    kiri_grammar_vocab_free(v);
    kiri_model_close(m);
}

static void test_masks_qwen2(void)
{
    check_masks("tokenizer-vectors/ggml-vocab-qwen2.gguf", JSON_GBNF,
                "{\"name\": \"Zo\xC3\xAB \\\"q\\\"\", \"n\": [1, -2.5e3], \"ok\": true}");
}

/* Palindromes remember every byte on the stack, so a walk over the vocabulary meets more stack sets
 * than its memo holds and the mask is computed by the direct walk. */
static void test_masks_many_sets(void)
{
    static char pal[4096];
    size_t n = (size_t)snprintf(pal, sizeof pal, "root ::= [a-z]?");
    for (char c = 'a'; c <= 'z'; c++)
        n += (size_t)snprintf(pal + n, sizeof pal - n, " | \"%c\" root \"%c\"", c, c);
    check_masks("tokenizer-vectors/ggml-vocab-qwen2.gguf", pal, "aa");
}

static void test_masks_spm(void)
{
    check_masks("tokenizer-vectors/ggml-vocab-llama-spm.gguf", "root ::= [a-z ]+ \"\xE6\x97\xA5\" [0-9]{2}",
                "hello world\xE6\x97\xA5" "42");
}

/* The cache gives the same mask as computing it, for states reached twice. */
static void test_cache_repeats(void)
{
    struct kiri_model *m = NULL;
    struct kiri_grammar_vocab *v = NULL;
    if (!stories_vocab(&m, &v))
        return;
    struct kiri_grammar *g = NULL;
    struct kiri_grammar_state *st = NULL;
    struct kiri_grammar_cache *cache = NULL;
    CHECK_EQ_INT(kiri_grammar_compile(JSON_GBNF, strlen(JSON_GBNF), &g, NULL), KIRI_OK);
    CHECK_EQ_INT(kiri_grammar_state_init(g, &st), KIRI_OK);
    CHECK_EQ_INT(kiri_grammar_cache_init(1 << 20, &cache), KIRI_OK);
    const char *walk = "{\"aaaaaaaaaaaaaaaa\": [1, 1, 1, 1]}";
    const size_t words = ((size_t)kiri_grammar_vocab_n_vocab(v) + 31) / 32;
    uint32_t *copy = test_xmalloc(words * 4);
    for (size_t i = 0; walk[i]; i++) {
        const uint32_t *a, *b;
        CHECK_EQ_INT(kiri_grammar_state_mask(st, v, cache, &a, NULL), KIRI_OK);
        memcpy(copy, a, words * 4);
        CHECK_EQ_INT(kiri_grammar_state_mask(st, v, NULL, &b, NULL), KIRI_OK);
        CHECK(memcmp(copy, b, words * 4) == 0);
        CHECK_EQ_INT(kiri_grammar_state_feed(st, walk + i, 1), KIRI_OK);
    }
    uint64_t computed, hits;
    kiri_grammar_cache_counts(cache, &computed, &hits);
    CHECK(hits >= 16);
    free(copy);
    kiri_grammar_state_free(st);
    kiri_grammar_cache_free(cache);
    kiri_grammar_free(g);
    kiri_grammar_vocab_free(v);
    kiri_model_close(m);
}

TEST_MAIN(test_accepts, test_errors, test_caps, test_converging, test_ambiguous_nesting, test_doubling, test_masks_qwen2,
          test_masks_many_sets, test_masks_spm, test_cache_repeats)
