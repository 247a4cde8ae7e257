/* Structured output in the batching loop on stories260K: constrained and unconstrained sequences
 * batched together (and preempted) each get exactly the tokens they get alone; constrained text
 * follows its grammar (checked by hand-written character tests, not by the matcher); logit bias
 * bans and forces tokens; lazy grammars start at their trigger; bad grammars fail at submit; a
 * grammar too ambiguous for the matcher ends its own sequence with the cause, not its neighbour's. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiri.h"
#include "platform.h"
#include "test.h"

#ifndef KIRI_SOURCE_DIR
#define KIRI_SOURCE_DIR "."
#endif

#define N_REQ 6
#define MAX_GEN 40

struct result {
    int32_t tokens[256];
    int n;
    char text[4096];
    size_t text_len;
    int finish;
    int status;
    char error[160];
};

static struct kiri_mutex *lock;
static struct kiri_cond *done_cond;
static int n_done;
static struct kiri_model *model;

static int on_event(void *user, const struct kiri_token_event *ev)
{
    struct result *r = user;
    kiri_platform_mutex_lock(lock);
    if (ev->token >= 0 && r->n < 256)
        r->tokens[r->n++] = ev->token;
    if (r->text_len + ev->text_len < sizeof r->text) {
        memcpy(r->text + r->text_len, ev->text, ev->text_len);
        r->text_len += ev->text_len;
        r->text[r->text_len] = 0;
    }
    if (ev->finish >= 0) {
        r->finish = ev->finish;
        r->status = ev->status;
        snprintf(r->error, sizeof r->error, "%s", ev->error ? ev->error : "");
        n_done++;
        kiri_platform_cond_broadcast(done_cond);
    }
    kiri_platform_mutex_unlock(lock);
    return 0;
}

static void wait_done(int n)
{
    kiri_platform_mutex_lock(lock);
    while (n_done < n)
        if (kiri_platform_cond_timed_wait(done_cond, lock, 60.0))
            break;
    kiri_platform_mutex_unlock(lock);
}

/* A comma-separated list of 1..3 numbers of 1..4 digits, then a full stop. */
#define LIST "root ::= num (\", \" num){0,2} \".\"\nnum ::= [1-9] [0-9]{0,3}\n"
/* One to five words of lower-case letters, then "!" */
#define WORDS "root ::= [a-z]+ (\" \" [a-z]+){0,4} \"!\""

static int is_list(const char *s)
{
    int nums = 0;
    for (;;) {
        if (*s < '1' || *s > '9')
            return 0;
        int d = 0;
        while (isdigit((unsigned char)*s))
            s++, d++;
        if (d > 4 || ++nums > 3)
            return 0;
        if (strcmp(s, ".") == 0)
            return 1;
        if (strncmp(s, ", ", 2) != 0)
            return 0;
        s += 2;
    }
}

static int is_words(const char *s)
{
    size_t n = strlen(s);
    if (n < 2 || s[n - 1] != '!' || !islower((unsigned char)s[0]) || !islower((unsigned char)s[n - 2]))
        return 0;
    for (size_t i = 0; i + 1 < n; i++)
        if (!(islower((unsigned char)s[i]) || (s[i] == ' ' && s[i + 1] != ' ')))
            return 0;
    return 1;
}

struct spec {
    const char *prompt;
    const char *grammar;
    float temperature;
    uint64_t seed;
};

static const struct spec specs[N_REQ] = {
    {"Once upon a time", LIST, 0.8f, 1},  {"Lily wanted to", NULL, 0, 0},
    {"The little dog", WORDS, 1.0f, 3},   {"One day, Tom", NULL, 0, 0},
    {"There was a big red ball", LIST, 0, 0}, {"Sam and his mom went to", WORDS, 0, 0},
};

static int submit_spec(struct kiri_batcher *b, const struct spec *sp, struct result *r)
{
    int32_t ids[128];
    const int n = kiri_tokenize(model, sp->prompt, strlen(sp->prompt), -1, 0, ids, 128);
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.tokens = ids;
    req.n_tokens = n;
    req.max_tokens = MAX_GEN;
    kiri_sampling_default(&req.sampling);
    req.sampling.temperature = sp->temperature;
    req.sampling.seed = sp->seed;
    req.sampling.top_k = 0;
    req.grammar = sp->grammar;
    req.grammar_len = sp->grammar ? strlen(sp->grammar) : 0;
    uint64_t id;
    return kiri_batcher_submit(b, &req, on_event, r, &id, NULL);
}

static struct kiri_batcher *make_batcher(int max_seqs, size_t kv_memory)
{
    struct kiri_batcher_params p;
    kiri_batcher_params_default(&p);
    p.max_seqs = max_seqs;
    p.n_ctx = 64;
    p.chunk = 8;
    p.kv_memory = kv_memory;
    struct kiri_batcher *b = NULL;
    CHECK_EQ_INT(kiri_batcher_init(model, &p, &b, NULL), 0);
    return b;
}

static void test_setup(void)
{
    kiri_platform_mutex_init(&lock);
    kiri_platform_cond_init(&done_cond);
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.n_threads = 2;
    CHECK_EQ_INT(kiri_model_open(KIRI_SOURCE_DIR "/models/stories260K.gguf", &mp, &model, NULL), 0);
}

static struct result solo[N_REQ];

static void test_batched_equals_solo(void)
{
    for (int i = 0; i < N_REQ; i++) {
        struct kiri_batcher *b = make_batcher(1, 0);
        n_done = 0;
        memset(&solo[i], 0, sizeof solo[i]);
        CHECK_EQ_INT(submit_spec(b, &specs[i], &solo[i]), 0);
        kiri_batcher_start(b);
        wait_done(1);
        kiri_batcher_free(b);
        if (specs[i].grammar) {
            const int ok = strcmp(specs[i].grammar, LIST) == 0 ? is_list(solo[i].text) : is_words(solo[i].text);
            if (!ok || solo[i].finish != KIRI_FINISH_STOP)
                fprintf(stderr, "request %d: \"%s\" (finish %d)\n", i, solo[i].text, solo[i].finish);
            /* A sentence that had not ended within MAX_GEN tokens is fine only if it ran out. */
            CHECK(ok || solo[i].finish == KIRI_FINISH_LENGTH);
            CHECK(solo[i].finish == KIRI_FINISH_STOP || solo[i].finish == KIRI_FINISH_LENGTH);
        }
    }
    /* All together, twice: with room for everyone, and with blocks for one context only so
     * that sequences are preempted and recomputed (only the greedy ones then, since a restarted
     * sampler redraws its random numbers). */
    for (int pass = 0; pass < 2; pass++) {
        const size_t block = 16 * kiri_model_kv_bytes_per_token(model, KIRI_KV_F16);
        struct kiri_batcher *b = make_batcher(N_REQ, pass ? 4 * block : 0);
        if (!b)
            return;
        static struct result res[N_REQ];
        memset(res, 0, sizeof res);
        n_done = 0;
        int n_sub = 0;
        for (int i = 0; i < N_REQ; i++)
            if (!pass || specs[i].temperature == 0) {
                CHECK_EQ_INT(submit_spec(b, &specs[i], &res[i]), 0);
                n_sub++;
            }
        kiri_batcher_start(b);
        wait_done(n_sub);
        struct kiri_batcher_stats st;
        kiri_batcher_get_stats(b, &st);
        CHECK(st.peak_batch_seqs > 1);
        if (pass && st.preemptions == 0)
            fprintf(stderr, "blocks %d, peak %d, generated %llu\n", st.kv_blocks_total, st.peak_batch_seqs,
                    (unsigned long long)st.generated_tokens);
        if (pass)
            CHECK(st.preemptions > 0);
        for (int i = 0; i < N_REQ; i++) {
            if (pass && specs[i].temperature != 0)
                continue;
            int same = res[i].n == solo[i].n && res[i].finish == solo[i].finish;
            for (int t = 0; same && t < res[i].n; t++)
                same = res[i].tokens[t] == solo[i].tokens[t];
            if (!same)
                fprintf(stderr, "pass %d request %d differs: \"%s\" vs \"%s\"\n", pass, i, res[i].text, solo[i].text);
            CHECK(same);
        }
        kiri_batcher_free(b);
    }
}

static void run_one(struct kiri_request *req, const char *prompt, struct result *r)
{
    int32_t ids[128];
    req->tokens = ids;
    req->n_tokens = kiri_tokenize(model, prompt, strlen(prompt), -1, 0, ids, 128);
    struct kiri_batcher *b = make_batcher(1, 0);
    memset(r, 0, sizeof *r);
    n_done = 0;
    uint64_t id;
    CHECK_EQ_INT(kiri_batcher_submit(b, req, on_event, r, &id, NULL), 0);
    kiri_batcher_start(b);
    wait_done(1);
    kiri_batcher_free(b);
}

static void test_logit_bias(void)
{
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.max_tokens = 12;
    kiri_sampling_default(&req.sampling);
    req.sampling.temperature = 0;
    struct result plain, banned, forced;
    run_one(&req, "Once upon a time", &plain);
    CHECK(plain.n == 12);
    /* Banning the greedy first token moves the first choice elsewhere, and it never appears. */
    int32_t tok[2] = {plain.tokens[0], plain.tokens[1]};
    float val[2] = {-100, -100};
    req.bias_tokens = tok;
    req.bias_values = val;
    req.n_bias = 2;
    run_one(&req, "Once upon a time", &banned);
    CHECK(banned.n > 0);
    for (int i = 0; i < banned.n; i++)
        CHECK(banned.tokens[i] != tok[0] && banned.tokens[i] != tok[1]);
    /* +100 forces a token (an ordinary word piece) at every step. */
    tok[0] = plain.tokens[3];
    val[0] = 100;
    req.n_bias = 1;
    run_one(&req, "Once upon a time", &forced);
    CHECK_EQ_INT(forced.n, 12);
    for (int i = 0; i < forced.n; i++)
        CHECK_EQ_INT(forced.tokens[i], tok[0]);
    /* Bias and grammar together: the grammar wins over a forced token it does not allow. */
    req.grammar = LIST;
    req.grammar_len = strlen(LIST);
    req.max_tokens = MAX_GEN;
    run_one(&req, "Once upon a time", &forced);
    CHECK(is_list(forced.text) || forced.finish == KIRI_FINISH_LENGTH);
    /* Malformed tables are refused. */
    struct kiri_status_info info;
    int32_t ids[4] = {1, 2, 3, 4};
    req.tokens = ids;
    req.n_tokens = 4;
    tok[0] = 1 << 30;
    struct kiri_batcher *b = make_batcher(1, 0);
    uint64_t id;
    CHECK_EQ_INT(kiri_batcher_submit(b, &req, on_event, &plain, &id, &info), KIRI_E_INVALID_ARG);
    CHECK_STR(info.field, "logit_bias");
    kiri_batcher_free(b);
}

static void test_lazy_grammar(void)
{
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.max_tokens = 80;
    kiri_sampling_default(&req.sampling);
    req.sampling.temperature = 0;
    const char *trig[1] = {"the"};
    const char *g = "root ::= \"the\" [a-z]* \" \" [0-9]{1,3} \".\"";
    req.grammar = g;
    req.grammar_len = strlen(g);
    req.grammar_triggers = trig;
    req.n_grammar_triggers = 1;
    struct result r;
    run_one(&req, "Once upon a time", &r);
    const char *at = strstr(r.text, "the");
    CHECK(at != NULL);
    if (at) {
        const char *p = at + 3;
        while (islower((unsigned char)*p))
            p++;
        CHECK(*p == ' ');
        p++;
        int d = 0;
        while (isdigit((unsigned char)*p))
            p++, d++;
        const int ok = d >= 1 && d <= 3 && strcmp(p, ".") == 0;
        if (!ok)
            fprintf(stderr, "lazy: \"%s\"\n", r.text);
        CHECK(ok);
        CHECK_EQ_INT(r.finish, KIRI_FINISH_STOP);
    }
}

static void test_bad_grammar(void)
{
    struct kiri_batcher *b = make_batcher(1, 0);
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    int32_t ids[2] = {1, 2};
    req.tokens = ids;
    req.n_tokens = 2;
    req.max_tokens = 4;
    kiri_sampling_default(&req.sampling);
    const char *g = "root ::= \"a\"\nx ::= (\"b\"";
    req.grammar = g;
    req.grammar_len = strlen(g);
    struct kiri_status_info info;
    struct result r;
    uint64_t id;
    CHECK_EQ_INT(kiri_batcher_submit(b, &req, on_event, &r, &id, &info), KIRI_E_INVALID_ARG);
    CHECK_STR(info.field, "grammar");
    CHECK(strstr(info.message, "line 2, column 7") != NULL);
    const char *trig[1] = {""};
    req.grammar = "root ::= \"a\"";
    req.grammar_len = strlen(req.grammar);
    req.grammar_triggers = trig;
    req.n_grammar_triggers = 1;
    CHECK_EQ_INT(kiri_batcher_submit(b, &req, on_event, &r, &id, &info), KIRI_E_INVALID_ARG);
    kiri_batcher_free(b);
    /* kiri_generate passes its grammar through. */
    struct kiri_context *c = NULL;
    CHECK_EQ_INT(kiri_context_init(model, NULL, &c, NULL), 0);
    struct kiri_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = 8;
    kiri_sampling_default(&gp.sampling);
    gp.grammar = g;
    gp.grammar_len = strlen(g);
    CHECK_EQ_INT(kiri_generate(c, ids, 2, &gp, NULL, NULL, NULL, &info), KIRI_E_INVALID_ARG);
    CHECK_STR(info.field, "grammar");
    kiri_context_free(c);
}

/* Every letter may open a level that one of two rules closes: the parse stacks double with each
 * byte whatever the model writes, and the sentence cannot end before 13 letters. */
#define AMBIGUOUS "root ::= a\na ::= [a-z] a x | [a-z] a y | [a-z]{13} \".\"\nx ::= [a-z]\ny ::= [a-z]\n"

static void test_ambiguous_grammar(void)
{
    struct kiri_batcher *b = make_batcher(2, 0);
    if (!b)
        return;
    static const struct spec amb_spec = {"Once upon a time", AMBIGUOUS, 0, 0};
    static const struct spec list_spec = {"Once upon a time", LIST, 0, 0};
    static struct result amb, list;
    memset(&amb, 0, sizeof amb);
    memset(&list, 0, sizeof list);
    n_done = 0;
    CHECK_EQ_INT(submit_spec(b, &amb_spec, &amb), 0);
    CHECK_EQ_INT(submit_spec(b, &list_spec, &list), 0);
    kiri_batcher_start(b);
    wait_done(2);
    kiri_batcher_free(b);
    CHECK_EQ_INT(amb.finish, KIRI_FINISH_ERROR);
    CHECK_EQ_INT(amb.status, KIRI_E_UNSUPPORTED);
    if (strncmp(amb.error, "grammar too ambiguous: ", 23) != 0)
        fprintf(stderr, "ambiguous: \"%s\" (finish %d)\n", amb.error, amb.finish);
    CHECK(strncmp(amb.error, "grammar too ambiguous: ", 23) == 0);
    CHECK(amb.n < 13); /* it ended within a few tokens */
    CHECK(list.finish == KIRI_FINISH_STOP || list.finish == KIRI_FINISH_LENGTH);
    CHECK(is_list(list.text) || list.finish == KIRI_FINISH_LENGTH);
    CHECK(list.error[0] == 0);
    /* kiri_generate reports the cause. */
    struct kiri_context *c = NULL;
    CHECK_EQ_INT(kiri_context_init(model, NULL, &c, NULL), 0);
    struct kiri_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = MAX_GEN;
    kiri_sampling_default(&gp.sampling);
    gp.grammar = AMBIGUOUS;
    gp.grammar_len = strlen(AMBIGUOUS);
    struct kiri_status_info info;
    int32_t ids[128];
    const int n = kiri_tokenize(model, amb_spec.prompt, strlen(amb_spec.prompt), -1, 0, ids, 128);
    CHECK_EQ_INT(kiri_generate(c, ids, n, &gp, NULL, NULL, NULL, &info), KIRI_E_UNSUPPORTED);
    CHECK(strstr(info.message, "grammar too ambiguous: ") != NULL);
    kiri_context_free(c);
}

static void test_teardown(void)
{
    kiri_model_close(model);
    kiri_platform_cond_free(done_cond);
    kiri_platform_mutex_free(lock);
}

TEST_MAIN(test_setup, test_batched_equals_solo, test_logit_bias, test_lazy_grammar, test_bad_grammar,
          test_ambiguous_grammar, test_teardown)
