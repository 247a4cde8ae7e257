/* Speculative decoding on stories260K. The prompt-lookup drafter on hand-made sequences; greedy
 * output with speculation equal token for token to plain decoding (one sequence and batched with
 * plain ones, with prefix sharing, a grammar, log-probs), drafts accepted and rejected on a
 * repetitive prompt; max_tokens, stop strings and the context length end a speculative sequence
 * where they end a plain one; a cancelled speculative stream gives every block back; a loop made
 * without draft rows ignores the request. Sampling: the tokens a speculative sequence draws after
 * a drafted position follow the distribution of the sampling pipeline, computed here in float64
 * from the model's logits (a chi-square test that the non-exact rule "keep any draft the filters
 * keep" fails by far). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"
#include "draft.h"
#include "kiri.h"
#include "platform.h"
#include "sampler.h"
#include "test.h"

#ifndef KIRI_SOURCE_DIR
#define KIRI_SOURCE_DIR "."
#endif

#define MAX_OUT 256

static struct kiri_model *model;
/* Draft models: stories260K itself (another instance), and stories260K in Q4_0, whose guesses
 * sometimes differ from the F32 model's. */
static struct kiri_model *self_draft, *q4_draft;
#define Q4_PATH "test_draft_stories260K-Q4_0.gguf"

/* Prompts: stories, then text that repeats itself, where lookup drafts are often right. */
static const char *const prompts[] = {
    "Once upon a time",
    "Lily wanted to",
    "The little dog",
    "One day, Tom",
    "Lily went to the park. She saw a big dog. The dog was happy. Lily went to the park. She saw a big",
    "Tom had a red ball. He liked to play with the ball. Tom had a red ball. He liked to",
    "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat",
    "Sam and his mom went to the store. They bought milk and bread. Sam and his mom went to the",
};
#define N_PROMPTS ((int)(sizeof prompts / sizeof prompts[0]))

struct result {
    int32_t tokens[MAX_OUT];
    float logprobs[MAX_OUT];
    int n;
    char text[4096];
    size_t text_len;
    int finish;
    int n_events;
    int stop_after;               /* the callback asks to stop after this many tokens (0: never) */
    int logprob_bad;
};

static int on_event(void *user, const struct kiri_token_event *ev)
{
    struct result *r = user;
    r->n_events++;
    if (ev->token >= 0 && r->n < MAX_OUT) {
        r->logprobs[r->n] = ev->logprob;
        r->tokens[r->n++] = ev->token;
        if (ev->n_top > 0 && (ev->top_ids[0] != ev->token || fabsf(ev->top_logprobs[0] - ev->logprob) > 1e-5f))
            r->logprob_bad++;
    }
    if (r->text_len + ev->text_len < sizeof r->text) {
        memcpy(r->text + r->text_len, ev->text, ev->text_len);
        r->text_len += ev->text_len;
    }
    if (ev->finish >= 0)
        r->finish = ev->finish;
    return r->stop_after > 0 && r->n >= r->stop_after;
}

struct options {
    int spec;
    int spec_max;
    int max_tokens;
    const char *stop;
    const char *grammar;
    int logprobs;
};

static struct kiri_model *draft_model; /* the next make_batcher's, or NULL */
/* Whether the next make_batcher's drafts weigh their measured costs. Only test_cost_aware's do:
 * the others test what drafts give, and follow acceptance alone (kiri_batcher_ignore_spec_costs),
 * since on stories260K a draft model costs what its target does and a step's time is a fraction of
 * a millisecond that a loaded machine (or a sanitizer) moves at random. */
static int weigh_costs;

static struct kiri_batcher *make_batcher(int32_t max_seqs, int32_t n_ctx, int prefix, int32_t draft_rows)
{
    struct kiri_batcher_params p;
    kiri_batcher_params_default(&p);
    p.max_seqs = max_seqs;
    p.n_ctx = n_ctx;
    p.chunk = 64;
    p.prefix_cache = prefix;
    p.draft_rows = draft_rows;
    p.draft_model = draft_model;
    struct kiri_batcher *b = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_batcher_init(model, &p, &b, &info), 0);
    if (b && !weigh_costs)
        kiri_batcher_ignore_spec_costs(b);
    return b;
}

static int submit(struct kiri_batcher *b, const char *prompt, const struct options *o, struct result *r)
{
    int32_t ids[512];
    const int n = kiri_tokenize(model, prompt, strlen(prompt), -1, 0, ids, 512);
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.tokens = ids;
    req.n_tokens = n;
    req.max_tokens = o->max_tokens;
    kiri_sampling_default(&req.sampling);
    req.sampling.temperature = 0;
    req.speculative = o->spec;
    req.spec_max = o->spec_max;
    req.stop = o->stop ? &o->stop : NULL;
    req.n_stop = o->stop ? 1 : 0;
    req.grammar = o->grammar;
    req.grammar_len = o->grammar ? strlen(o->grammar) : 0;
    req.logprobs = o->logprobs;
    req.top_logprobs = o->logprobs ? 3 : 0;
    uint64_t id;
    struct kiri_status_info info;
    const int rc = kiri_batcher_submit(b, &req, on_event, r, &id, &info);
    CHECK_EQ_INT(rc, 0);
    return rc;
}

/* One request alone through a fresh one-sequence loop; the loop's statistics in *st. */
static void run_one(const char *prompt, const struct options *o, int32_t n_ctx, struct result *r,
                    struct kiri_batcher_stats *st)
{
    memset(r, 0, sizeof *r);
    struct kiri_batcher *b = make_batcher(1, n_ctx, 0, 16);
    if (!b)
        return;
    if (submit(b, prompt, o, r) == 0)
        kiri_batcher_run(b, NULL);
    if (st)
        kiri_batcher_get_stats(b, st);
    kiri_batcher_free(b);
}

static int same_tokens(const struct result *a, const struct result *b)
{
    if (a->n != b->n)
        return 0;
    for (int i = 0; i < a->n; i++)
        if (a->tokens[i] != b->tokens[i])
            return 0;
    return 1;
}

/* ---- the drafter ---- */

static void test_ngram_lookup(void)
{
    int32_t d[8];
    /* The longest suffix that occurred before: "1 2 3" at 1, followed by 7 8 1 ... */
    const int32_t a[] = {5, 1, 2, 3, 7, 8, 1, 2, 3};
    CHECK_EQ_INT(kiri_draft_ngram(a, 9, d, 3), 3);
    CHECK(d[0] == 7 && d[1] == 8 && d[2] == 1);
    /* ... and no more than what follows it up to the end of the sequence. */
    CHECK_EQ_INT(kiri_draft_ngram(a, 9, d, 8), 5);
    CHECK(d[3] == 2 && d[4] == 3);
    /* The latest of several occurrences. */
    const int32_t b[] = {1, 2, 3, 5, 1, 2, 3, 6, 1, 2, 3};
    CHECK_EQ_INT(kiri_draft_ngram(b, 11, d, 2), 2);
    CHECK(d[0] == 6 && d[1] == 1);
    /* A longer match wins over a later shorter one: "4 1 2 3" at 0 beats "1 2 3" at 5. */
    const int32_t c[] = {4, 1, 2, 3, 9, 1, 2, 3, 8, 4, 1, 2, 3};
    CHECK_EQ_INT(kiri_draft_ngram(c, 13, d, 1), 1);
    CHECK_EQ_INT(d[0], 9);
    /* Nothing repeats, a suffix shorter than KIRI_NGRAM_MIN (two tokens do not draft: in free
     * text they repeat by chance), nothing asked, nothing given. */
    const int32_t e[] = {1, 2, 3, 4, 5, 6};
    CHECK_EQ_INT(kiri_draft_ngram(e, 6, d, 4), 0);
    const int32_t g[] = {1, 2, 9, 1, 2};
    CHECK_EQ_INT(kiri_draft_ngram(g, 5, d, 4), 0);
    const int32_t f[] = {7, 3, 9, 3};
    CHECK_EQ_INT(kiri_draft_ngram(f, 4, d, 4), 0);
    CHECK_EQ_INT(kiri_draft_ngram(a, 9, d, 0), 0);
    CHECK_EQ_INT(kiri_draft_ngram(a, 0, d, 4), 0);
    CHECK_STR(kiri_drafter_ngram()->name, "ngram");
    CHECK_STR(kiri_spec_name(KIRI_SPEC_DRAFT), "draft");
    CHECK(kiri_spec_name(KIRI_SPEC_KINDS) == NULL);
    CHECK_EQ_INT(kiri_spec_parse("ngram"), KIRI_SPEC_NGRAM);
    CHECK_EQ_INT(kiri_spec_parse("none"), KIRI_SPEC_NONE);
    CHECK_EQ_INT(kiri_spec_parse("draft"), KIRI_SPEC_DRAFT);
    CHECK_EQ_INT(kiri_spec_parse("eagle"), -1);
    CHECK_EQ_INT(kiri_spec_parse(NULL), -1);
}

/* ---- greedy: the same tokens ---- */

static struct result plain[N_PROMPTS];

static void test_greedy_same(void)
{
    uint64_t drafted = 0, accepted = 0;
    for (int i = 0; i < N_PROMPTS; i++) {
        const struct options po = {0, 0, 96, NULL, NULL, 0};
        run_one(prompts[i], &po, 256, &plain[i], NULL);
        static struct result r;
        struct kiri_batcher_stats st;
        const struct options so = {KIRI_SPEC_NGRAM, 8, 96, NULL, NULL, 0};
        run_one(prompts[i], &so, 256, &r, &st);
        CHECK_EQ_INT(plain[i].n, 96);
        CHECK_EQ_INT(r.finish, plain[i].finish);
        if (!same_tokens(&r, &plain[i]))
            fprintf(stderr, "prompt %d: speculative tokens differ from plain decoding\n", i);
        CHECK(same_tokens(&r, &plain[i]));
        CHECK_EQ_INT(r.text_len, plain[i].text_len);
        CHECK(memcmp(r.text, plain[i].text, r.text_len) == 0);
        CHECK_EQ_INT(st.generated_tokens, 96);
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        /* Fewer steps than tokens once drafts are kept. */
        if (st.spec_accepted[KIRI_SPEC_NGRAM] > 0)
            CHECK(st.steps < 96 + 1);
        drafted += st.spec_drafted[KIRI_SPEC_NGRAM];
        accepted += st.spec_accepted[KIRI_SPEC_NGRAM];
    }
    fprintf(stderr, "greedy: %llu tokens drafted, %llu kept\n", (unsigned long long)drafted,
            (unsigned long long)accepted);
    CHECK(accepted > 0);
    CHECK(drafted > accepted);
}

/* Speculative and plain requests batched in one loop with prefix sharing (the repeated prompts
 * share blocks with each other's published ones), log-probs on some: each gives its solo tokens. */
static void test_mixed_batch(void)
{
    struct kiri_batcher *b = make_batcher(4, 256, 1, 16);
    if (!b)
        return;
    static struct result r[2 * N_PROMPTS];
    memset(r, 0, sizeof r);
    /* Request i and i + N_PROMPTS: the same prompt, one speculative, one plain. */
    for (int i = 0; i < 2 * N_PROMPTS; i++) {
        const struct options o = {(i + i / N_PROMPTS) % 2 ? KIRI_SPEC_NGRAM : 0, 6, 96, NULL, NULL,
                                  i % N_PROMPTS >= 4};
        submit(b, prompts[i % N_PROMPTS], &o, &r[i]);
    }
    kiri_batcher_run(b, NULL);
    for (int i = 0; i < 2 * N_PROMPTS; i++) {
        if (!same_tokens(&r[i], &plain[i % N_PROMPTS]))
            fprintf(stderr, "batched request %d differs from its solo run\n", i);
        CHECK(same_tokens(&r[i], &plain[i % N_PROMPTS]));
        CHECK_EQ_INT(r[i].logprob_bad, 0);
    }
    /* A token's log-probability is the same whether it was verified as a draft or decoded alone. */
    for (int i = 4; i < N_PROMPTS; i++)
        for (int t = 0; t < r[i].n && t < r[i + N_PROMPTS].n; t++)
            CHECK_NEAR(r[i].logprobs[t], r[i + N_PROMPTS].logprobs[t], 1e-4);
    struct kiri_batcher_stats st;
    kiri_batcher_get_stats(b, &st);
    CHECK(st.peak_batch_seqs > 1);
    CHECK(st.spec_accepted[KIRI_SPEC_NGRAM] > 0);
    CHECK_EQ_INT(st.spec_drafted[KIRI_SPEC_NONE], 0);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    CHECK_EQ_INT(st.generated_tokens, 2 * N_PROMPTS * 96);
    kiri_batcher_free(b);

    /* A loop with more decoding sequences than spec_max_seqs drafts nothing. */
    struct kiri_batcher_params p;
    kiri_batcher_params_default(&p);
    p.max_seqs = 4;
    p.n_ctx = 256;
    p.spec_max_seqs = 1;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_batcher_init(model, &p, &b, &info), 0);
    memset(r, 0, sizeof r);
    for (int i = 4; i < 8; i++) {
        const struct options o = {KIRI_SPEC_NGRAM, 6, 24, NULL, NULL, 0};
        submit(b, prompts[i], &o, &r[i]);
    }
    kiri_batcher_run(b, NULL);
    kiri_batcher_get_stats(b, &st);
    for (int i = 4; i < 8; i++)
        CHECK_EQ_INT(r[i].n, 24);
    CHECK(st.spec_drafted[KIRI_SPEC_NGRAM] < 4 * 24 / 2); /* only while fewer than two decode */
    kiri_batcher_free(b);
}

/* A grammar (every token's bytes checked as it is kept) and a penalty-free greedy sampler: drafts
 * the grammar refuses are rejected, the output is the plain output under the same grammar. */
static void test_grammar_same(void)
{
    const char *g = "root ::= [a-zA-Z .,]+";
    for (int i = 4; i < 6; i++) {
        struct result a, s;
        const struct options po = {0, 0, 64, NULL, g, 0}, so = {KIRI_SPEC_NGRAM, 8, 64, NULL, g, 0};
        run_one(prompts[i], &po, 256, &a, NULL);
        struct kiri_batcher_stats st;
        run_one(prompts[i], &so, 256, &s, &st);
        CHECK(same_tokens(&a, &s));
        CHECK_EQ_INT(a.finish, s.finish);
        CHECK(st.spec_drafted[KIRI_SPEC_NGRAM] > 0);
    }
}

/* ---- the ends of a sequence ---- */

static void test_limits(void)
{
    const int k = 4; /* a repetitive prompt: drafts are long */
    /* max_tokens: exactly that many, the plain run's first ones. */
    for (int m = 1; m <= 11; m += 2) {
        struct result r;
        const struct options o = {KIRI_SPEC_NGRAM, 8, m, NULL, NULL, 0};
        run_one(prompts[k], &o, 256, &r, NULL);
        CHECK_EQ_INT(r.n, m);
        CHECK_EQ_INT(r.finish, KIRI_FINISH_LENGTH);
        for (int t = 0; t < r.n && t < plain[k].n; t++)
            CHECK_EQ_INT(r.tokens[t], plain[k].tokens[t]);
    }
    /* A stop string in the middle of the plain text: the same text before it, nothing after. */
    char stop[16];
    const size_t at = plain[k].text_len / 2;
    memcpy(stop, plain[k].text + at, 5);
    stop[5] = 0;
    struct result a, s;
    const struct options po = {0, 0, 96, stop, NULL, 0}, so = {KIRI_SPEC_NGRAM, 8, 96, stop, NULL, 0};
    run_one(prompts[k], &po, 256, &a, NULL);
    run_one(prompts[k], &so, 256, &s, NULL);
    CHECK_EQ_INT(a.finish, KIRI_FINISH_STOP);
    CHECK_EQ_INT(s.finish, KIRI_FINISH_STOP);
    CHECK(a.text_len <= at);
    CHECK_EQ_INT(s.text_len, a.text_len);
    CHECK(memcmp(s.text, a.text, a.text_len) == 0);
    CHECK(same_tokens(&a, &s));
    CHECK_EQ_INT(s.n_events, a.n_events);
    /* The context length: the sequence ends where the plain one does. */
    const struct options lo = {0, 0, -1, NULL, NULL, 0}, ls = {KIRI_SPEC_NGRAM, 16, -1, NULL, NULL, 0};
    run_one(prompts[k], &lo, 64, &a, NULL);
    run_one(prompts[k], &ls, 64, &s, NULL);
    CHECK_EQ_INT(a.finish, KIRI_FINISH_CONTEXT);
    CHECK_EQ_INT(s.finish, a.finish);
    CHECK(same_tokens(&a, &s));
}

/* The callback stops a speculative stream in the middle of a verified draft: no token after that
 * one reaches it, and every block goes back. */
static void test_cancel_frees_blocks(void)
{
    for (int stop_after = 3; stop_after <= 30; stop_after += 9) {
        struct kiri_batcher *b = make_batcher(2, 256, 0, 16);
        if (!b)
            return;
        struct result r, other;
        memset(&r, 0, sizeof r);
        memset(&other, 0, sizeof other);
        r.stop_after = stop_after;
        const struct options o = {KIRI_SPEC_NGRAM, 8, 96, NULL, NULL, 0};
        submit(b, prompts[6], &o, &r);
        submit(b, prompts[4], &o, &other);
        kiri_batcher_run(b, NULL);
        struct kiri_batcher_stats st;
        kiri_batcher_get_stats(b, &st);
        CHECK_EQ_INT(r.finish, KIRI_FINISH_CANCELLED);
        CHECK_EQ_INT(r.n, stop_after);
        CHECK(same_tokens(&other, &plain[4]));
        CHECK_EQ_INT(st.kv_blocks_used, 0);
        CHECK(st.spec_drafted[KIRI_SPEC_NGRAM] > 0);
        kiri_batcher_free(b);
    }
    /* Cancelled from outside between steps (kiri_batcher_run's flag). */
    struct kiri_batcher *b = make_batcher(1, 256, 0, 16);
    struct result r;
    memset(&r, 0, sizeof r);
    const struct options o = {KIRI_SPEC_NGRAM, 8, 96, NULL, NULL, 0};
    submit(b, prompts[6], &o, &r);
    _Atomic int cancel = 1;
    kiri_batcher_run(b, &cancel);
    struct kiri_batcher_stats st;
    kiri_batcher_get_stats(b, &st);
    CHECK_EQ_INT(r.finish, KIRI_FINISH_CANCELLED);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    kiri_batcher_free(b);
}

/* A request with these speculation settings is refused at submit, naming field. */
static void refused(struct kiri_batcher *b, int spec, int32_t spec_max, const char *field)
{
    int32_t ids[4] = {1, 2, 3, 4};
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.tokens = ids;
    req.n_tokens = 4;
    kiri_sampling_default(&req.sampling);
    req.speculative = spec;
    req.spec_max = spec_max;
    uint64_t id;
    struct kiri_status_info info;
    struct result r;
    CHECK_EQ_INT(kiri_batcher_submit(b, &req, on_event, &r, &id, &info), KIRI_E_INVALID_ARG);
    CHECK_STR(info.field, field);
}

/* Requests that ask for speculation where the loop cannot verify, and bad values. */
static void test_off_and_bad(void)
{
    struct kiri_batcher *b = make_batcher(1, 256, 0, 0);
    if (!b)
        return;
    struct result r;
    memset(&r, 0, sizeof r);
    const struct options o = {KIRI_SPEC_NGRAM, 8, 96, NULL, NULL, 0};
    submit(b, prompts[6], &o, &r);
    kiri_batcher_run(b, NULL);
    struct kiri_batcher_stats st;
    kiri_batcher_get_stats(b, &st);
    CHECK(same_tokens(&r, &plain[6]));
    CHECK_EQ_INT(st.spec_drafted[KIRI_SPEC_NGRAM], 0);
    refused(b, KIRI_SPEC_KINDS, 0, "speculative");
    refused(b, -1, 0, "speculative");
    refused(b, KIRI_SPEC_NGRAM, KIRI_SPEC_MAX_DRAFT + 1, "spec_max");
    refused(b, KIRI_SPEC_NGRAM, -3, "spec_max");
    kiri_batcher_free(b);
}

/* ---- sampling: the same distribution ---- */

/* The rule itself, on one row of logits with a draft the pipeline finds unlikely and one it finds
 * likely: over many verifications the tokens follow p (computed here in float64), and the draft is
 * kept as often as p gives it. Keeping any draft the filters keep, or drawing the replacement
 * from p with the draft still in it, fails this. */
static void test_verify_rule(void)
{
    const float logits[6] = {1.0f, 2.5f, 0.2f, 2.0f, -1.0f, 1.7f};
    double p[6], z = 0;
    for (int v = 0; v < 6; v++)
        z += exp((double)logits[v] / 0.9);
    for (int v = 0; v < 6; v++)
        p[v] = exp((double)logits[v] / 0.9) / z;
    const int32_t drafts[2] = {0, 1};
    for (int d = 0; d < 2; d++) {
        struct kiri_sampling sp;
        kiri_sampling_default(&sp);
        sp.temperature = 0.9f;
        sp.top_k = 0;
        sp.top_p = 1.0f;
        sp.min_p = 0.0f;
        sp.seed = 7 + (uint64_t)d;
        struct kiri_sampler *smp = NULL;
        CHECK_EQ_INT(kiri_sampler_init(&sp, 6, &smp), 0);
        if (!smp)
            return;
        enum { DRAWS = 40000 };
        double seen[6] = {0};
        int kept = 0;
        for (int i = 0; i < DRAWS; i++) {
            int accepted = -1;
            const int32_t t = kiri_sampler_verify(smp, logits, drafts[d], &accepted);
            CHECK(t >= 0 && t < 6);
            CHECK(accepted == (t == drafts[d]));
            if (t >= 0 && t < 6)
                seen[t]++;
            kept += accepted == 1;
        }
        kiri_sampler_free(smp);
        double chi2 = 0;
        for (int v = 0; v < 6; v++)
            chi2 += (seen[v] - DRAWS * p[v]) * (seen[v] - DRAWS * p[v]) / (DRAWS * p[v]);
        /* 5 degrees of freedom: the 1 - 1e-4 quantile is 25.7. */
        CHECK(chi2 < 25.7);
        CHECK_NEAR((double)kept / DRAWS, p[drafts[d]], 0.01);
    }
    /* Greedy: the argmax, kept only when it is the draft. */
    struct kiri_sampling gs;
    kiri_sampling_default(&gs);
    gs.temperature = 0;
    struct kiri_sampler *g = NULL;
    CHECK_EQ_INT(kiri_sampler_init(&gs, 6, &g), 0);
    int accepted = -1;
    CHECK_EQ_INT(kiri_sampler_verify(g, logits, 3, &accepted), 1);
    CHECK_EQ_INT(accepted, 0);
    CHECK_EQ_INT(kiri_sampler_verify(g, logits, 1, &accepted), 1);
    CHECK_EQ_INT(accepted, 1);
    kiri_sampler_free(g);
}

#define TOP_K 8
#define TEMP 2.0
#define N_DRAWS 3000

struct draws {
    int32_t t[N_DRAWS][3];
    int n[N_DRAWS];
};

static int on_draw(void *user, const struct kiri_token_event *ev)
{
    int32_t *t = user; /* t[3] then the count in t[3] */
    if (ev->token >= 0 && t[3] < 3)
        t[t[3]++] = ev->token;
    return 0;
}

/* The sampling pipeline for top-k TOP_K at temperature TEMP (top-p and min-p off), in float64:
 * the TOP_K largest logits (ties to the lower id), divided by TEMP, softmaxed. */
static void top_k_dist(const float *logits, int32_t n_vocab, int32_t *ids, double *p)
{
    for (int k = 0; k < TOP_K; k++) {
        int32_t best = -1;
        for (int32_t v = 0; v < n_vocab; v++) {
            int taken = 0;
            for (int j = 0; j < k; j++)
                taken |= ids[j] == v;
            if (!taken && (best < 0 || logits[v] > logits[best]))
                best = v;
        }
        ids[k] = best;
    }
    double z = 0;
    for (int k = 0; k < TOP_K; k++)
        z += exp(((double)logits[ids[k]] - (double)logits[ids[0]]) / TEMP);
    for (int k = 0; k < TOP_K; k++)
        p[k] = exp(((double)logits[ids[k]] - (double)logits[ids[0]]) / TEMP) / z;
}

static const float *held_logits;

static int on_held(void *user, const struct kiri_token_event *ev)
{
    (void)user;
    if (ev->logits)
        held_logits = ev->logits;
    return 0;
}

/* A context of 128 tokens on the model, for reference logits. */
static struct kiri_context *reference_context(void)
{
    struct kiri_context *c = NULL;
    struct kiri_context_params cp;
    kiri_context_params_default(&cp);
    cp.n_ctx = 128;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_context_init(model, &cp, &c, &info), 0);
    return c;
}

/* Logits after tokens[0..n) from a fresh context, copied to out. */
static void eval_logits(struct kiri_context *c, const int32_t *tokens, int n, float *out)
{
    const float *lg = NULL;
    struct kiri_status_info info;
    kiri_context_reset(c);
    CHECK_EQ_INT(kiri_context_eval(c, tokens, n, &lg, &info), 0);
    if (lg)
        memcpy(out, lg, (size_t)kiri_model_n_vocab(model) * sizeof *out);
}

/* The sampling pipeline's distributions of the three tokens after the prompt, in float64: the first
 * token's TOP_K candidates id1, and for the f-th of them the joint distribution of the second and
 * third tokens given it, p[(f * TOP_K + a) * TOP_K + d] for the a-th second (id2) and the d-th
 * third after those (id3). */
struct joint {
    int32_t id1[TOP_K], id2[TOP_K][TOP_K], id3[TOP_K][TOP_K][TOP_K];
    double p[TOP_K * TOP_K * TOP_K];
};

static int joint_distribution(const int32_t *prompt, int n, struct joint *j)
{
    const int32_t V = kiri_model_n_vocab(model);
    struct kiri_context *c = reference_context();
    float *lg = malloc((size_t)V * sizeof *lg);
    int32_t seq[160];
    if (!c || !lg || n + 2 > 160) {
        kiri_context_free(c);
        free(lg);
        return -1;
    }
    memcpy(seq, prompt, (size_t)n * sizeof *seq);
    double p1[TOP_K], p2[TOP_K], p3[TOP_K];
    eval_logits(c, seq, n, lg);
    top_k_dist(lg, V, j->id1, p1);
    for (int f = 0; f < TOP_K; f++) {
        seq[n] = j->id1[f];
        eval_logits(c, seq, n + 1, lg);
        top_k_dist(lg, V, j->id2[f], p2);
        for (int a = 0; a < TOP_K; a++) {
            seq[n + 1] = j->id2[f][a];
            eval_logits(c, seq, n + 2, lg);
            top_k_dist(lg, V, j->id3[f][a], p3);
            for (int d = 0; d < TOP_K; d++)
                j->p[(f * TOP_K + a) * TOP_K + d] = p2[a] * p3[d];
        }
    }
    kiri_context_free(c);
    free(lg);
    return 0;
}

/* n_draws speculative requests for three tokens each, sampled with top-k TOP_K at temperature TEMP
 * from prompts[4] (seeds 1..n_draws), against the float64 distributions. */
static void sampling_distribution(int kind, int n_draws)
{
    const char *prompt = prompts[4];
    int32_t ids[160];
    const int n = kiri_tokenize(model, prompt, strlen(prompt), -1, 0, ids, 150);
    static int32_t draw[N_DRAWS][4];
    if (n_draws > N_DRAWS)
        n_draws = N_DRAWS;
    memset(draw, 0, sizeof draw);
    struct kiri_batcher *b = make_batcher(4, 128, 1, 16);
    if (!b)
        return;
    for (int i = 0; i < n_draws; i++) {
        struct kiri_request req;
        memset(&req, 0, sizeof req);
        req.tokens = ids;
        req.n_tokens = n;
        req.max_tokens = 3;
        kiri_sampling_default(&req.sampling);
        req.sampling.temperature = (float)TEMP;
        req.sampling.top_k = TOP_K;
        req.sampling.top_p = 1.0f;
        req.sampling.min_p = 0.0f;
        req.sampling.seed = (uint64_t)i + 1;
        req.speculative = kind;
        req.spec_max = 4;
        uint64_t id;
        if (kiri_batcher_submit(b, &req, on_draw, draw[i], &id, NULL) != KIRI_OK) {
            kiri_batcher_run(b, NULL); /* the queue is full: run it down first */
            CHECK_EQ_INT(kiri_batcher_submit(b, &req, on_draw, draw[i], &id, NULL), 0);
        }
    }
    kiri_batcher_run(b, NULL);
    struct kiri_batcher_stats st;
    kiri_batcher_get_stats(b, &st);
    kiri_batcher_free(b);
    fprintf(stderr, "sampling (%s): %d draws; %llu drafted, %llu kept\n", kiri_spec_name(kind), n_draws,
            (unsigned long long)st.spec_drafted[kind], (unsigned long long)st.spec_accepted[kind]);
    /* Enough verified drafts, some rejected, for the test to see the rule. */
    CHECK(st.spec_accepted[kind] > (uint64_t)n_draws / 10);
    CHECK(st.spec_drafted[kind] > st.spec_accepted[kind]);

    static struct joint j;
    if (joint_distribution(ids, n, &j) < 0) {
        CHECK(0);
        return;
    }
    /* The draws that tell: those whose later tokens may have been verified against a draft, after a
     * first token that the lookup continues, or after any with a draft model. Their second and
     * third tokens, given the first, against the float64 distribution; cells expecting fewer than
     * 5 draws are pooled, and a draw outside every cell counts against the test. */
    int told[TOP_K] = {0}, count[TOP_K] = {0}, n_told = 0;
    for (int f = 0; f < TOP_K; f++) {
        int32_t seq[160], guess[1];
        memcpy(seq, ids, (size_t)n * sizeof *seq);
        seq[n] = j.id1[f];
        told[f] = kind != KIRI_SPEC_NGRAM || kiri_draft_ngram(seq, n + 1, guess, 1) == 1;
    }
    static double observed[TOP_K * TOP_K * TOP_K];
    memset(observed, 0, sizeof observed);
    int outside = 0;
    for (int i = 0; i < n_draws; i++) {
        int cell = -1, first = -1;
        for (int f = 0; f < TOP_K && first < 0; f++)
            if (draw[i][0] == j.id1[f])
                first = f;
        if (first < 0) {
            outside++;
            continue;
        }
        count[first]++;
        if (!told[first])
            continue;
        n_told++;
        for (int a = 0; a < TOP_K && cell < 0; a++)
            for (int d = 0; draw[i][1] == j.id2[first][a] && d < TOP_K && cell < 0; d++)
                if (draw[i][2] == j.id3[first][a][d])
                    cell = (first * TOP_K + a) * TOP_K + d;
        if (cell < 0)
            outside++;
        else
            observed[cell]++;
    }
    fprintf(stderr, "sampling: %d draws after a first token the drafter continues\n", n_told);
    CHECK_EQ_INT(outside, 0);
    CHECK(n_told > n_draws / 10);
    double chi2 = 0, pooled_e = 0, pooled_o = 0;
    int cells = 0;
    for (int k = 0; k < TOP_K * TOP_K * TOP_K; k++) {
        const double e = told[k / (TOP_K * TOP_K)] ? count[k / (TOP_K * TOP_K)] * j.p[k] : 0, o = observed[k];
        if (e < 5) {
            pooled_e += e;
            pooled_o += o;
            continue;
        }
        chi2 += (o - e) * (o - e) / e;
        cells++;
    }
    if (pooled_e > 0) {
        chi2 += (pooled_o - pooled_e) * (pooled_o - pooled_e) / pooled_e;
        cells++;
    }
    /* The chi-square quantile at 1 - 1e-4 for cells - 1 degrees of freedom (Wilson-Hilferty). */
    const double df = cells - 1, z = 3.719;
    const double crit = df * pow(1 - 2 / (9 * df) + z * sqrt(2 / (9 * df)), 3);
    fprintf(stderr, "sampling: chi-square %.1f over %d cells (the 1e-4 critical value %.1f)\n", chi2, cells, crit);
    CHECK(cells > 4);
    CHECK(chi2 < crit);
}

/* Prompt lookup drafts after a few of the first tokens only, so it takes more draws. */
static void test_sampling_distribution(void)
{
    sampling_distribution(KIRI_SPEC_NGRAM, N_DRAWS);
}

/* The same with a draft model (stories260K's Q4_0 copy drafting for it), which drafts after every
 * first token: fewer draws test as much, and each costs a draft model's run. */
static void test_sampling_distribution_draft_model(void)
{
    draft_model = q4_draft;
    sampling_distribution(KIRI_SPEC_DRAFT, N_DRAWS / 3);
    draft_model = NULL;
}

/* ---- a draft model ---- */

/* Greedy with a draft model: the plain tokens; the model drafting for itself is nearly always
 * right, its Q4_0 copy often and not always; batched with lookup and plain sequences; a
 * cancelled stream and the loop's end release the draft model's sequences. */
static void test_draft_model_greedy(void)
{
    struct kiri_model *drafts[2] = {self_draft, q4_draft};
    uint64_t drafted[2] = {0}, kept[2] = {0};
    for (int d = 0; d < 2; d++)
        for (int i = 0; i < N_PROMPTS; i++) {
            draft_model = drafts[d];
            struct result r;
            struct kiri_batcher_stats st;
            const struct options o = {KIRI_SPEC_DRAFT, d ? 6 : 16, 96, NULL, NULL, 0};
            run_one(prompts[i], &o, 256, &r, &st);
            draft_model = NULL;
            if (!same_tokens(&r, &plain[i]))
                fprintf(stderr, "prompt %d with draft model %d: tokens differ from plain decoding\n", i, d);
            CHECK(same_tokens(&r, &plain[i]));
            CHECK_EQ_INT(st.kv_blocks_used, 0);
            CHECK_EQ_INT(st.spec_drafted[KIRI_SPEC_NGRAM], 0);
            drafted[d] += st.spec_drafted[KIRI_SPEC_DRAFT];
            kept[d] += st.spec_accepted[KIRI_SPEC_DRAFT];
        }
    fprintf(stderr, "draft model: itself %llu of %llu kept, Q4_0 %llu of %llu\n", (unsigned long long)kept[0],
            (unsigned long long)drafted[0], (unsigned long long)kept[1], (unsigned long long)drafted[1]);
    CHECK(kept[0] * 10 >= drafted[0] * 9 && drafted[0] > 0);
    CHECK(kept[1] > 0 && drafted[1] > kept[1]);

    /* Batched: draft model, lookup and plain requests side by side. */
    draft_model = q4_draft;
    struct kiri_batcher *b = make_batcher(4, 256, 1, 16);
    draft_model = NULL;
    if (!b)
        return;
    static struct result r[2 * N_PROMPTS];
    memset(r, 0, sizeof r);
    const int kinds[3] = {KIRI_SPEC_DRAFT, KIRI_SPEC_NGRAM, KIRI_SPEC_NONE};
    for (int i = 0; i < 2 * N_PROMPTS; i++) {
        const struct options o = {kinds[i % 3], 8, 96, NULL, NULL, 0};
        submit(b, prompts[i % N_PROMPTS], &o, &r[i]);
    }
    kiri_batcher_run(b, NULL);
    for (int i = 0; i < 2 * N_PROMPTS; i++)
        CHECK(same_tokens(&r[i], &plain[i % N_PROMPTS]));
    struct kiri_batcher_stats st;
    kiri_batcher_get_stats(b, &st);
    CHECK(st.spec_accepted[KIRI_SPEC_DRAFT] > 0 && st.spec_accepted[KIRI_SPEC_NGRAM] > 0);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    /* Again on the same loop: the draft model's sequences of the first round were released, so
     * its slots are free for these. */
    memset(r, 0, sizeof r);
    r[0].stop_after = 5;
    for (int i = 0; i < 4; i++) {
        const struct options o = {KIRI_SPEC_DRAFT, 8, 96, NULL, NULL, 0};
        submit(b, prompts[4 + i], &o, &r[i]);
    }
    kiri_batcher_run(b, NULL);
    CHECK_EQ_INT(r[0].finish, KIRI_FINISH_CANCELLED);
    CHECK_EQ_INT(r[0].n, 5);
    for (int i = 1; i < 4; i++)
        CHECK(same_tokens(&r[i], &plain[4 + i]));
    struct kiri_batcher_stats st2;
    kiri_batcher_get_stats(b, &st2);
    CHECK(st2.spec_accepted[KIRI_SPEC_DRAFT] > st.spec_accepted[KIRI_SPEC_DRAFT]);
    CHECK_EQ_INT(st2.kv_blocks_used, 0);
    kiri_batcher_free(b);

    /* Asking for a draft model where none is loaded. */
    b = make_batcher(1, 256, 0, 16);
    if (b)
        refused(b, KIRI_SPEC_DRAFT, 0, "speculative");
    kiri_batcher_free(b);
}

/* ---- drafting that does not pay ---- */

/* A drafter that proposes the model's own greedy continuation (a plain run's tokens), so that
 * every draft is kept, and sleeps `cost` seconds in each proposal. */
struct oracle {
    struct kiri_drafter base;
    const struct result *plain; /* the tokens after the prompt */
    int32_t n_prompt;
    double cost;
    int calls;
};

static int32_t oracle_propose(struct kiri_drafter *d, uint64_t seq, const int32_t *tokens, int32_t n, int32_t *draft,
                              int32_t max)
{
    struct oracle *o = (struct oracle *)d;
    (void)seq;
    (void)tokens;
    o->calls++;
    if (o->cost > 0)
        kiri_platform_sleep(o->cost);
    int32_t k = 0;
    for (int32_t g = n - o->n_prompt; k < max && g >= 0 && g < o->plain->n; g++)
        draft[k++] = o->plain->tokens[g];
    return k;
}

/* Every draft is right, but proposing one costs as much as 30 plain steps of the model (at least
 * 20 ms; measured on the plain run, so that it holds under an emulator or a sanitizer too): after
 * the first proposals have measured that, drafting stops (and the tokens are the plain ones). The
 * same drafter at no cost drafts nearly every token. */
static void test_cost_aware(void)
{
    static struct result ref, r;
    const struct options po = {0, 0, 160, NULL, NULL, 0};
    const double t0 = kiri_platform_now();
    run_one(prompts[0], &po, 256, &ref, NULL);
    const double per_step = (kiri_platform_now() - t0) / (ref.n > 0 ? ref.n : 1);
    const double cost = 30 * per_step > 0.02 ? 30 * per_step : 0.02;
    int32_t ids[64];
    const int32_t n_prompt = kiri_tokenize(model, prompts[0], strlen(prompts[0]), -1, 0, ids, 64);
    CHECK(ref.n > 100);
    for (int costly = 0; costly < 2; costly++) {
        struct oracle o = {{"draft", oracle_propose, NULL, NULL, NULL}, &ref, n_prompt, costly ? cost : 0, 0};
        weigh_costs = 1;
        struct kiri_batcher *b = make_batcher(1, 256, 0, 16);
        weigh_costs = 0;
        if (!b)
            return;
        CHECK_EQ_INT(kiri_batcher_set_drafter(b, &o.base), 0);
        memset(&r, 0, sizeof r);
        const struct options so = {KIRI_SPEC_DRAFT, 8, 160, NULL, NULL, 0};
        if (submit(b, prompts[0], &so, &r) == 0)
            kiri_batcher_run(b, NULL);
        struct kiri_batcher_stats st;
        kiri_batcher_get_stats(b, &st);
        kiri_batcher_free(b);
        const uint64_t drafted = st.spec_drafted[KIRI_SPEC_DRAFT];
        fprintf(stderr, "cost-aware: proposals %s: %d of them, %llu tokens drafted of %d, %llu kept, %llu steps\n",
                costly ? "costly" : "free", o.calls, (unsigned long long)drafted, r.n,
                (unsigned long long)st.spec_accepted[KIRI_SPEC_DRAFT], (unsigned long long)st.steps);
        CHECK(same_tokens(&r, &ref));
        CHECK_EQ_INT(st.spec_accepted[KIRI_SPEC_DRAFT], drafted);
        if (costly)
            CHECK(o.calls <= 3 && drafted <= 24);
        else
            CHECK(drafted >= (uint64_t)ref.n / 2);
    }
}

/* A held sequence cut back and extended gives the logits of the sequence it now is. */
static void test_truncate_held(void)
{
    struct kiri_batcher *b = make_batcher(1, 128, 0, 0);
    if (!b)
        return;
    int32_t ids[64];
    const int n = kiri_tokenize(model, prompts[4], strlen(prompts[4]), -1, 0, ids, 64);
    struct kiri_context *c = reference_context();
    struct kiri_status_info info;
    const int32_t V = kiri_model_n_vocab(model);
    float *want = malloc((size_t)V * sizeof *want);
    if (!c || !want || n < 30) {
        kiri_context_free(c);
        free(want);
        kiri_batcher_free(b);
        return;
    }
    /* Logits after the first 20 tokens, computed alone. */
    eval_logits(c, ids, 20, want);
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.tokens = ids;
    req.n_tokens = n; /* all of them, past a block boundary */
    uint64_t id;
    static struct result r;
    CHECK_EQ_INT(kiri_batcher_submit_held(b, &req, on_held, NULL, &id, &info), 0);
    kiri_batcher_run(b, NULL);
    /* Cut to 20 and nothing appended: token 19 is computed again. */
    CHECK_EQ_INT(kiri_batcher_truncate(b, id, 20, &info), 0);
    held_logits = NULL;
    kiri_batcher_run(b, NULL);
    CHECK(held_logits != NULL);
    double err = 0;
    for (int32_t v = 0; held_logits && v < V; v++)
        err = fmax(err, fabs((double)held_logits[v] - want[v]));
    CHECK(err < 1e-3);
    /* Cut to 12, then the rest appended again: the logits after all n tokens, as at first. */
    eval_logits(c, ids, n, want);
    CHECK_EQ_INT(kiri_batcher_truncate(b, id, 12, &info), 0);
    CHECK_EQ_INT(kiri_batcher_append(b, id, ids + 12, n - 12, &info), 0);
    held_logits = NULL;
    kiri_batcher_run(b, NULL);
    err = 0;
    for (int32_t v = 0; held_logits && v < V; v++)
        err = fmax(err, fabs((double)held_logits[v] - want[v]));
    CHECK(held_logits != NULL && err < 1e-3);
    /* Bad cuts. */
    CHECK_EQ_INT(kiri_batcher_truncate(b, id, 0, &info), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_batcher_truncate(b, id, n + 1, &info), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_batcher_truncate(b, id + 1, 5, &info), KIRI_E_INVALID_ARG);
    (void)r;
    kiri_context_free(c);
    free(want);
    kiri_batcher_free(b);
}

static void test_setup(void)
{
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.n_threads = 1; /* a pool waiting for descheduled workers on a busy machine slows every step */
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_model_open(KIRI_SOURCE_DIR "/models/stories260K.gguf", &mp, &model, &info), 0);
    CHECK_EQ_INT(kiri_model_open(KIRI_SOURCE_DIR "/models/stories260K.gguf", &mp, &self_draft, &info), 0);
    CHECK_EQ_INT(kiri_quantize(KIRI_SOURCE_DIR "/models/stories260K.gguf", Q4_PATH, "Q4_0", NULL, NULL, &info), 0);
    CHECK_EQ_INT(kiri_model_open(Q4_PATH, &mp, &q4_draft, &info), 0);
    if (!model || !self_draft || !q4_draft)
        exit(1);
}

static void test_teardown(void)
{
    kiri_model_close(model);
    kiri_model_close(self_draft);
    kiri_model_close(q4_draft);
    remove(Q4_PATH);
}

TEST_MAIN(test_setup, test_ngram_lookup, test_greedy_same, test_mixed_batch, test_grammar_same, test_limits,
          test_cancel_frees_blocks, test_off_and_bad, test_verify_rule, test_sampling_distribution,
          test_truncate_held, test_cost_aware, test_draft_model_greedy, test_sampling_distribution_draft_model, test_teardown)
