/* Tests for runtime/sampler.c. Expected values are computed here from the definitions in
 * sampler.h (softmax, llama.cpp's filter semantics, OpenAI's penalties), never from the sampler's
 * own earlier output. */
#include "sampler.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "kiri.h"
#include "mem.h"
#include "test.h"

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

/* A small LCG for test inputs only, so the inputs are the same everywhere. */
static uint32_t lcg_state = 12345;
static float rnd(void)
{
    lcg_state = lcg_state * 1664525u + 1013904223u;
    return (float)(lcg_state >> 8) / 16777216.0f;
}

static void random_logits(float *l, int n, float scale)
{
    for (int i = 0; i < n; i++)
        l[i] = (rnd() * 2.0f - 1.0f) * scale;
}

static void params_off(struct kiri_sampling *p, float temperature)
{
    kiri_sampling_default(p);
    p->temperature = temperature;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->frequency_penalty = 0.0f;
    p->presence_penalty = 0.0f;
    p->seed = 7;
}

static int ref_argmax(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b])
            b = i;
    return b;
}

static struct kiri_sampler *make(const struct kiri_sampling *p, int n_vocab)
{
    struct kiri_sampler *s = NULL;
    int rc = kiri_sampler_init(p, n_vocab, &s);
    CHECK_EQ_INT(rc, KIRI_OK);
    return s;
}

/* Sorted-order reference: index order of logits, descending, ties by lower id. */
static const float *cmp_logits;
static int cmp_desc(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    if (cmp_logits[i] > cmp_logits[j])
        return -1;
    if (cmp_logits[i] < cmp_logits[j])
        return 1;
    return i - j;
}

static int *ref_order(const float *l, int n)
{
    int *idx = malloc((size_t)n * sizeof *idx);
    for (int i = 0; i < n; i++)
        idx[i] = i;
    cmp_logits = l;
    qsort(idx, (size_t)n, sizeof *idx, cmp_desc);
    return idx;
}

/* ---------------------------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------------------------- */

static void test_defaults_valid(void)
{
    struct kiri_sampling p;
    struct kiri_status_info info;
    kiri_sampling_default(&p);
    CHECK_EQ_INT(kiri_sampling_validate(&p, &info), KIRI_OK);
    CHECK_NEAR(p.temperature, 0.8, 1e-7);
    CHECK_EQ_INT(p.top_k, 40);
    CHECK_NEAR(p.top_p, 0.95, 1e-7);
    CHECK_NEAR(p.min_p, 0.05, 1e-7);
    CHECK_NEAR(p.repeat_penalty, 1.0, 0);
    CHECK_EQ_INT(p.repeat_last_n, 64);
}

static void test_greedy_is_argmax(void)
{
    enum { V = 1000 };
    static float l[V];
    struct kiri_sampling p;
    params_off(&p, 0.0f);
    p.top_k = 40; /* ignored by greedy */
    struct kiri_sampler *s = make(&p, V);
    for (int round = 0; round < 20; round++) {
        random_logits(l, V, 10.0f);
        CHECK_EQ_INT(kiri_sampler_sample(s, l), ref_argmax(l, V));
    }
    /* Ties go to the lowest id; NaN never wins. */
    for (int i = 0; i < V; i++)
        l[i] = -1.0f;
    l[3] = NAN;
    l[500] = 2.0f;
    l[700] = 2.0f;
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 500);
    l[0] = NAN;
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 500);
    /* All -inf: there is no distribution; the argmax fallback gives id 0. */
    for (int i = 0; i < V; i++)
        l[i] = -INFINITY;
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 0);
    kiri_sampler_free(s);

    /* The same holds when penalties force the slow path (a penalty on an unrelated token). */
    params_off(&p, 0.0f);
    p.repeat_penalty = 1.3f;
    s = make(&p, V);
    kiri_sampler_accept(s, 999);
    random_logits(l, V, 10.0f);
    l[999] = -50.0f;
    CHECK_EQ_INT(kiri_sampler_sample(s, l), ref_argmax(l, V));
    kiri_sampler_free(s);
}

static void test_seed_determinism(void)
{
    enum { V = 300, N = 200 };
    static float l[V];
    static int32_t a[N], b[N], c[N];
    random_logits(l, V, 3.0f);
    struct kiri_sampling p;
    kiri_sampling_default(&p);
    p.temperature = 1.0f;
    p.top_k = 0;
    p.min_p = 0.0f;
    p.seed = 1234;
    struct kiri_sampler *s1 = make(&p, V), *s2 = make(&p, V);
    p.seed = 1235;
    struct kiri_sampler *s3 = make(&p, V);
    int differ = 0;
    for (int i = 0; i < N; i++) {
        a[i] = kiri_sampler_sample(s1, l);
        b[i] = kiri_sampler_sample(s2, l);
        c[i] = kiri_sampler_sample(s3, l);
        CHECK(a[i] >= 0 && a[i] < V);
        differ += a[i] != c[i];
    }
    int same = 1;
    for (int i = 0; i < N; i++)
        same &= a[i] == b[i];
    CHECK(same);
    CHECK(differ > N / 2);
    /* reset replays the sequence */
    kiri_sampler_reset(s1);
    same = 1;
    for (int i = 0; i < N; i++)
        same &= kiri_sampler_sample(s1, l) == a[i];
    CHECK(same);
    kiri_sampler_free(s1);
    kiri_sampler_free(s2);
    kiri_sampler_free(s3);
}

static void test_top_k1_and_tiny_top_p_are_greedy(void)
{
    enum { V = 5000 };
    static float l[V];
    struct kiri_sampling pk, pp;
    params_off(&pk, 1.5f);
    pk.top_k = 1;
    params_off(&pp, 1.5f);
    pp.top_p = 1e-6f;
    struct kiri_sampler *sk = make(&pk, V), *sp = make(&pp, V);
    for (int round = 0; round < 50; round++) {
        random_logits(l, V, 4.0f);
        if (round % 5 == 0) { /* a tie at the top: the lower id is the greedy pick */
            int m = ref_argmax(l, V);
            l[V - 1 - m / 2] = l[m];
        }
        int g = ref_argmax(l, V);
        CHECK_EQ_INT(kiri_sampler_sample(sk, l), g);
        CHECK_EQ_INT(kiri_sampler_sample(sp, l), g);
    }
    kiri_sampler_free(sk);
    kiri_sampler_free(sp);
}

/* Frequencies of 20000 draws against the softmax the test computes itself. With N = 20000 the
 * standard deviation of a frequency is at most 0.0036; 0.015 is over four of them. */
static void check_frequencies(const struct kiri_sampling *p, const float *l, int n,
                              const double *expect)
{
    enum { N = 20000 };
    int counts[16] = {0};
    struct kiri_sampler *s = make(p, n);
    for (int i = 0; i < N; i++) {
        int t = kiri_sampler_sample(s, l);
        CHECK(t >= 0 && t < n);
        if (t >= 0 && t < n)
            counts[t]++;
    }
    for (int i = 0; i < n; i++) {
        CHECK_NEAR((double)counts[i] / N, expect[i], 0.015);
        if (expect[i] == 0.0)
            CHECK_EQ_INT(counts[i], 0);
    }
    /* The distribution itself, exactly. */
    const struct kiri_sampler_candidate *c;
    int32_t m = kiri_sampler_dist(s, l, &c);
    double seen[16] = {0};
    for (int32_t i = 0; i < m; i++)
        seen[c[i].id] = c[i].p;
    for (int i = 0; i < n; i++)
        CHECK_NEAR(seen[i], expect[i], 1e-6);
    kiri_sampler_free(s);
}

static void softmax_subset(const float *l, int n, const int *keep, double t, double *out)
{
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++)
        if (keep[i] && l[i] > mx)
            mx = l[i];
    for (int i = 0; i < n; i++) {
        out[i] = keep[i] ? exp((l[i] - mx) / t) : 0.0;
        sum += out[i];
    }
    for (int i = 0; i < n; i++)
        out[i] /= sum;
}

static void test_statistics(void)
{
    static const float l[6] = {1.0f, 2.0f, 3.0f, 0.5f, -1.0f, 0.0f};
    struct kiri_sampling p;
    double e[6];

    int all[6] = {1, 1, 1, 1, 1, 1};
    params_off(&p, 1.0f);
    softmax_subset(l, 6, all, 1.0, e);
    check_frequencies(&p, l, 6, e);

    /* temperature 0.7 after top-k 3: the softmax of the three largest at T = 0.7 */
    int top3[6] = {1, 1, 1, 0, 0, 0};
    params_off(&p, 0.7f);
    p.top_k = 3;
    p.seed = 99;
    softmax_subset(l, 6, top3, 0.7, e);
    check_frequencies(&p, l, 6, e);

    /* temperature 2 flattens */
    params_off(&p, 2.0f);
    p.seed = 5;
    softmax_subset(l, 6, all, 2.0, e);
    check_frequencies(&p, l, 6, e);
}

/* Logits log(0.5), log(0.3), log(0.15), log(0.05): probabilities at temperature 1 are exactly
 * those. Each case lists the ids that must survive. */
static void test_filter_semantics(void)
{
    static const float l[4] = {-0.693147181f, -1.203972804f, -1.897119985f, -2.995732274f};
    static const struct {
        int32_t top_k;
        float top_p, min_p;
        int keep[4];
    } cases[] = {
        {0, 0.75f, 0.0f, {1, 1, 0, 0}},  /* 0.5 + 0.3 reaches 0.75 */
        {0, 0.85f, 0.0f, {1, 1, 1, 0}},  /* needs the third */
        {0, 0.99f, 0.0f, {1, 1, 1, 1}},
        {0, 0.4f, 0.0f, {1, 0, 0, 0}},
        {0, 1.0f, 0.35f, {1, 1, 0, 0}},  /* p >= 0.175 */
        {0, 1.0f, 0.2f, {1, 1, 1, 0}},   /* p >= 0.1 */
        {0, 1.0f, 1.0f, {1, 0, 0, 0}},
        {0, 0.99f, 0.2f, {1, 1, 1, 0}},  /* min-p binds */
        {0, 0.75f, 0.2f, {1, 1, 0, 0}},  /* top-p binds */
        /* top-p after top-k measures within the top-k set: 0.625 / 0.375 */
        {2, 0.6f, 0.0f, {1, 0, 0, 0}},
        {2, 0.7f, 0.0f, {1, 1, 0, 0}},
        {3, 1.0f, 0.0f, {1, 1, 1, 0}},
        {3, 1.0f, 0.7f, {1, 0, 0, 0}},   /* p >= 0.35 */
        {3, 1.0f, 0.4f, {1, 1, 0, 0}},   /* p >= 0.2 */
        {10, 1.0f, 0.0f, {1, 1, 1, 1}},  /* k > n_vocab is off */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct kiri_sampling p;
        params_off(&p, 1.0f);
        p.top_k = cases[k].top_k;
        p.top_p = cases[k].top_p;
        p.min_p = cases[k].min_p;
        struct kiri_sampler *s = make(&p, 4);
        const struct kiri_sampler_candidate *c;
        int32_t n = kiri_sampler_dist(s, l, &c);
        int got[4] = {0};
        for (int32_t i = 0; i < n; i++)
            got[c[i].id] = 1;
        for (int i = 0; i < 4; i++) {
            if (got[i] != cases[k].keep[i])
                fprintf(stderr, "filter case %zu, id %d\n", k, i);
            CHECK_EQ_INT(got[i], cases[k].keep[i]);
        }
        double e[4];
        softmax_subset(l, 4, cases[k].keep, 1.0, e);
        for (int32_t i = 0; i < n; i++)
            CHECK_NEAR(c[i].p, e[c[i].id], 1e-6);
        kiri_sampler_free(s);
    }
}

/* Large vocabularies: top-k selection and the growing top-p selection agree with a full sort. */
static void test_large_vocab_selection(void)
{
    enum { V = 50000 };
    float *l = malloc(V * sizeof *l);
    random_logits(l, V, 8.0f);
    for (int i = 0; i < 200; i++) /* some exact ties */
        l[(i * 7919) % V] = l[(i * 104729) % V];
    int *order = ref_order(l, V);
    struct kiri_sampling p;
    const struct kiri_sampler_candidate *c;

    params_off(&p, 1.0f);
    p.top_k = 40;
    struct kiri_sampler *s = make(&p, V);
    int32_t n = kiri_sampler_dist(s, l, &c);
    CHECK_EQ_INT(n, 40);
    int ok = 1;
    for (int i = 0; i < n; i++)
        ok &= c[i].id == order[i];
    CHECK(ok);
    for (int i = 0; i < 1000; i++) {
        int t = kiri_sampler_sample(s, l);
        int in = 0;
        for (int j = 0; j < 40; j++)
            in |= t == order[j];
        CHECK(in);
    }
    kiri_sampler_free(s);

    /* top-p alone over a flat distribution: the answer needs thousands of tokens, so the
     * selection has to grow several times. */
    static const float tps[] = {0.05f, 0.5f, 0.9f, 0.999f};
    for (size_t k = 0; k < sizeof tps / sizeof tps[0]; k++) {
        double mx = l[order[0]], z = 0.0, cum = 0.0;
        for (int i = 0; i < V; i++)
            z += exp((double)l[i] - mx);
        int want = V;
        for (int i = 0; i < V; i++) {
            cum += exp((double)l[order[i]] - mx);
            if (cum >= tps[k] * z) {
                want = i + 1;
                break;
            }
        }
        params_off(&p, 1.0f);
        p.top_p = tps[k];
        s = make(&p, V);
        n = kiri_sampler_dist(s, l, &c);
        /* float vs double sums may move the cut by one token at most */
        CHECK(abs(n - want) <= 1);
        ok = 1;
        for (int i = 0; i < n; i++)
            ok &= c[i].id == order[i];
        CHECK(ok);
        kiri_sampler_free(s);
    }

    /* min-p alone keeps id order and exactly the tokens above the threshold. */
    params_off(&p, 1.0f);
    p.min_p = 0.01f;
    s = make(&p, V);
    n = kiri_sampler_dist(s, l, &c);
    float thr = l[order[0]] + logf(0.01f);
    int want = 0;
    for (int i = 0; i < V; i++)
        want += l[i] >= thr;
    CHECK_EQ_INT(n, want);
    ok = 1;
    for (int i = 1; i < n; i++)
        ok &= c[i].id > c[i - 1].id && c[i].logit >= thr;
    CHECK(ok);
    kiri_sampler_free(s);

    free(order);
    free(l);
}

static float dist_logit(struct kiri_sampler *s, const float *l, int32_t id)
{
    const struct kiri_sampler_candidate *c;
    int32_t n = kiri_sampler_dist(s, l, &c);
    for (int32_t i = 0; i < n; i++)
        if (c[i].id == id)
            return c[i].logit;
    return NAN;
}

static void test_penalties(void)
{
    static const float l[6] = {2.0f, 1.9f, -0.5f, 0.0f, 1.0f, -3.0f};
    struct kiri_sampling p;

    /* repetition: a positive logit is divided, a negative one multiplied */
    params_off(&p, 0.0f);
    p.repeat_penalty = 1.5f;
    struct kiri_sampler *s = make(&p, 6);
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 0);
    kiri_sampler_accept(s, 0);
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 1); /* 2 / 1.5 = 1.33 < 1.9 */
    kiri_sampler_accept(s, 0);                  /* repeats count once for this penalty */
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 1);
    kiri_sampler_free(s);

    params_off(&p, 1.0f);
    p.repeat_penalty = 1.5f;
    s = make(&p, 6);
    kiri_sampler_accept(s, 0);
    kiri_sampler_accept(s, 0);
    kiri_sampler_accept(s, 2);
    kiri_sampler_accept(s, 3);
    CHECK_NEAR(dist_logit(s, l, 0), 2.0 / 1.5, 1e-6);
    CHECK_NEAR(dist_logit(s, l, 2), -0.75, 1e-6);
    CHECK_NEAR(dist_logit(s, l, 3), 0.0, 0);
    CHECK_NEAR(dist_logit(s, l, 1), 1.9, 1e-6);
    /* the input row is untouched and the penalty is not compounded across calls */
    CHECK_NEAR(l[0], 2.0, 0);
    CHECK_NEAR(dist_logit(s, l, 0), 2.0 / 1.5, 1e-6);
    kiri_sampler_free(s);

    /* frequency and presence: logit -= count * freq + presence */
    params_off(&p, 1.0f);
    p.frequency_penalty = 0.2f;
    p.presence_penalty = 0.5f;
    s = make(&p, 6);
    for (int i = 0; i < 3; i++)
        kiri_sampler_accept(s, 0);
    kiri_sampler_accept(s, 5);
    CHECK_NEAR(dist_logit(s, l, 0), 2.0 - 3 * 0.2 - 0.5, 1e-6);
    CHECK_NEAR(dist_logit(s, l, 5), -3.0 - 0.2 - 0.5, 1e-6);
    CHECK_NEAR(dist_logit(s, l, 4), 1.0, 0);
    /* negative values reward repeats */
    kiri_sampler_free(s);
    params_off(&p, 0.0f);
    p.presence_penalty = -1.5f;
    s = make(&p, 6);
    kiri_sampler_accept(s, 4);
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 4); /* 1 + 1.5 = 2.5 > 2 */
    kiri_sampler_free(s);

    /* the window: after repeat_last_n newer tokens, a token is forgotten */
    params_off(&p, 0.0f);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 4;
    s = make(&p, 6);
    kiri_sampler_accept(s, 0);
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 1);
    for (int i = 0; i < 3; i++)
        kiri_sampler_accept(s, 5);
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 1);
    kiri_sampler_accept(s, 5);
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 0);
    kiri_sampler_accept(s, 0);
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 1);
    kiri_sampler_accept(s, -1); /* out-of-range ids are ignored */
    kiri_sampler_accept(s, 6);
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 1);
    kiri_sampler_reset(s); /* forgets the history */
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 0);
    kiri_sampler_free(s);

    /* repeat_last_n 0 turns every penalty off */
    params_off(&p, 0.0f);
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 0;
    s = make(&p, 6);
    kiri_sampler_accept(s, 0);
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 0);
    kiri_sampler_free(s);
}

static void test_infinities(void)
{
    static float l[8];
    struct kiri_sampling p;
    params_off(&p, 1.0f);
    struct kiri_sampler *s = make(&p, 8);
    for (int i = 0; i < 8; i++)
        l[i] = -INFINITY;
    l[6] = 0.5f;
    for (int i = 0; i < 100; i++)
        CHECK_EQ_INT(kiri_sampler_sample(s, l), 6);
    l[2] = INFINITY;
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 2);
    for (int i = 0; i < 8; i++)
        l[i] = NAN;
    CHECK_EQ_INT(kiri_sampler_sample(s, l), 0);
    kiri_sampler_free(s);
}

static void test_validation(void)
{
    static const struct {
        const char *field;
        int which;
        float value;
    } bad[] = {
        {"temperature", 0, NAN},          {"temperature", 0, -0.1f},
        {"temperature", 0, INFINITY},     {"top_p", 1, 0.0f},
        {"top_p", 1, 1.01f},              {"top_p", 1, NAN},
        {"top_p", 1, -1.0f},              {"min_p", 2, -0.01f},
        {"min_p", 2, 1.5f},               {"min_p", 2, NAN},
        {"repeat_penalty", 3, 0.0f},      {"repeat_penalty", 3, -1.0f},
        {"repeat_penalty", 3, NAN},       {"repeat_penalty", 3, INFINITY},
        {"frequency_penalty", 4, 2.5f},   {"frequency_penalty", 4, -2.01f},
        {"frequency_penalty", 4, NAN},    {"presence_penalty", 5, -3.0f},
        {"presence_penalty", 5, NAN},     {"presence_penalty", 5, INFINITY},
        {"repeat_last_n", 6, -1.0f},      {"repeat_last_n", 6, 2e6f},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        struct kiri_sampling p;
        struct kiri_status_info info;
        kiri_sampling_default(&p);
        switch (bad[k].which) {
        case 0: p.temperature = bad[k].value; break;
        case 1: p.top_p = bad[k].value; break;
        case 2: p.min_p = bad[k].value; break;
        case 3: p.repeat_penalty = bad[k].value; break;
        case 4: p.frequency_penalty = bad[k].value; break;
        case 5: p.presence_penalty = bad[k].value; break;
        default: p.repeat_last_n = (int32_t)bad[k].value; break;
        }
        CHECK_EQ_INT(kiri_sampling_validate(&p, &info), KIRI_E_INVALID_ARG);
        CHECK_EQ_INT(info.code, KIRI_E_INVALID_ARG);
        CHECK_STR(info.field, bad[k].field);
        CHECK(strstr(info.message, bad[k].field) != NULL);
        CHECK_EQ_INT(kiri_sampling_validate(&p, NULL), KIRI_E_INVALID_ARG);
        struct kiri_sampler *s = (struct kiri_sampler *)&info; /* must stay untouched */
        CHECK_EQ_INT(kiri_sampler_init(&p, 10, &s), KIRI_E_INVALID_ARG);
        CHECK(s == (struct kiri_sampler *)&info);
    }
    /* edges that are valid */
    struct kiri_sampling p;
    kiri_sampling_default(&p);
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.frequency_penalty = -2.0f;
    p.presence_penalty = 2.0f;
    p.repeat_last_n = 0;
    p.top_k = -5;
    CHECK_EQ_INT(kiri_sampling_validate(&p, NULL), KIRI_OK);
    CHECK_EQ_INT(kiri_sampling_validate(NULL, NULL), KIRI_E_INVALID_ARG);
    struct kiri_sampler *s = NULL;
    CHECK_EQ_INT(kiri_sampler_init(&p, 0, &s), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_sampler_init(&p, -3, &s), KIRI_E_INVALID_ARG);
    CHECK(s == NULL);
    kiri_sampler_free(NULL);
}

/* Every allocation in init fails in turn: NOMEM, nothing leaks (ASan checks), *out untouched. */
static void test_failing_allocator(void)
{
    struct kiri_sampling p;
    kiri_sampling_default(&p);
    p.repeat_penalty = 1.1f;
    int succeeded = 0;
    for (long n = 0; n < 10 && !succeeded; n++) {
        struct kiri_sampler *s = NULL;
        kiri_mem_fail_after(n);
        int rc = kiri_sampler_init(&p, 100, &s);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK) {
            CHECK(s != NULL);
            CHECK(n == 5); /* sampler, pool, sel, ring, counts */
            succeeded = 1;
            kiri_sampler_free(s);
        } else {
            CHECK_EQ_INT(rc, KIRI_E_NOMEM);
            CHECK(s == NULL);
        }
    }
    CHECK(succeeded);
}

TEST_MAIN(test_defaults_valid, test_greedy_is_argmax, test_seed_determinism,
          test_top_k1_and_tiny_top_p_are_greedy, test_statistics, test_filter_semantics,
          test_large_vocab_selection, test_penalties, test_infinities, test_validation,
          test_failing_allocator)
