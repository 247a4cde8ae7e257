#include "sampler.h"

#include <math.h>
#include <string.h>

#include "error.h"
#include "kiri.h"
#include "mem.h"

typedef struct kiri_sampler_candidate cand;

struct kiri_sampler {
    struct kiri_sampling params;   /* validated copy */
    int32_t n_vocab;
    uint64_t rng[4];               /* xoshiro256** state, never all zero */
    /* Penalty history; all three are NULL/0 when no penalty is active. */
    int32_t *ring;                 /* owned, (repeat_last_n) token ids, oldest at ring_head once full */
    int32_t ring_len;              /* filled slots, <= repeat_last_n; slots [0, ring_len) are valid */
    int32_t ring_head;             /* the slot the next accepted token goes to */
    int32_t *counts;               /* owned, (n_vocab) occurrences of each id in the ring */
    cand *pool;                    /* owned, (n_vocab) scratch: every token, then the survivors */
    cand *sel;                     /* owned, (n_vocab) scratch: a sorted selection from pool */
};

/* ---------------------------------------------------------------------------------------------
 * Parameters
 * ------------------------------------------------------------------------------------------- */

/* The defaults are llama.cpp's common ones, except the seed: llama.cpp's 0xFFFFFFFF means "pick
 * one at random", but kiri's sampler never reads a clock, so the default seed is 0, an ordinary
 * seed like any other, and a caller who wants varied output sets seed from its own entropy. */
void kiri_sampling_default(struct kiri_sampling *s)
{
    memset(s, 0, sizeof *s);
    s->temperature = 0.8f;
    s->top_k = 40;
    s->top_p = 0.95f;
    s->min_p = 0.05f;
    s->repeat_penalty = 1.0f;
    s->repeat_last_n = 64;
    s->frequency_penalty = 0.0f;
    s->presence_penalty = 0.0f;
    s->seed = 0;
}

/* Comparisons are written so that NaN fails every one of them and is rejected. */
int kiri_sampling_validate(const struct kiri_sampling *p, struct kiri_status_info *info)
{
    const int e = KIRI_E_INVALID_ARG;
    if (!p)
        return kiri_error_set(info, e, "sampling parameters are NULL");
    if (!(p->temperature >= 0.0f && isfinite(p->temperature)))
        return kiri_error_at(info, e, "temperature", -1,
                             "temperature must be a finite number >= 0 (0 is greedy), got %g",
                             (double)p->temperature);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return kiri_error_at(info, e, "top_p", -1, "top_p must be in (0, 1] (1 is off), got %g",
                             (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return kiri_error_at(info, e, "min_p", -1, "min_p must be in [0, 1] (0 is off), got %g",
                             (double)p->min_p);
    if (!(p->repeat_penalty > 0.0f && isfinite(p->repeat_penalty)))
        return kiri_error_at(info, e, "repeat_penalty", -1,
                             "repeat_penalty must be a finite number > 0 (1 is off), got %g",
                             (double)p->repeat_penalty);
    if (p->repeat_last_n < 0 || p->repeat_last_n > KIRI_SAMPLER_MAX_LAST_N)
        return kiri_error_at(info, e, "repeat_last_n", -1,
                             "repeat_last_n must be in [0, %d], got %ld", KIRI_SAMPLER_MAX_LAST_N,
                             (long)p->repeat_last_n);
    if (!(p->frequency_penalty >= -2.0f && p->frequency_penalty <= 2.0f))
        return kiri_error_at(info, e, "frequency_penalty", -1,
                             "frequency_penalty must be in [-2, 2], got %g",
                             (double)p->frequency_penalty);
    if (!(p->presence_penalty >= -2.0f && p->presence_penalty <= 2.0f))
        return kiri_error_at(info, e, "presence_penalty", -1,
                             "presence_penalty must be in [-2, 2], got %g",
                             (double)p->presence_penalty);
    kiri_error_clear(info);
    return KIRI_OK;
}

static int penalties_active(const struct kiri_sampling *p)
{
    return p->repeat_last_n > 0 &&
           (p->repeat_penalty != 1.0f || p->frequency_penalty != 0.0f ||
            p->presence_penalty != 0.0f);
}

/* ---------------------------------------------------------------------------------------------
 * Random numbers: xoshiro256** (Blackman and Vigna), its state filled by splitmix64
 * ------------------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t rng_next(uint64_t s[4])
{
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

/* Uniform in [0, 1) with 53 random bits. */
static double rng_uniform(uint64_t s[4]) { return (double)(rng_next(s) >> 11) * 0x1.0p-53; }

/* splitmix64 never yields four zero words in a row, so the state is valid for every seed. */
static void rng_seed(uint64_t s[4], uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        s[i] = splitmix64(&seed);
}

/* ---------------------------------------------------------------------------------------------
 * Lifetime and history
 * ------------------------------------------------------------------------------------------- */

int kiri_sampler_init(const struct kiri_sampling *params, int32_t n_vocab,
                      struct kiri_sampler **out)
{
    if (kiri_sampling_validate(params, NULL) != KIRI_OK || n_vocab <= 0)
        return KIRI_E_INVALID_ARG;
    struct kiri_sampler *s = kiri_mem_calloc(1, sizeof *s);
    if (!s)
        return KIRI_E_NOMEM;
    s->params = *params;
    s->n_vocab = n_vocab;
    s->pool = kiri_mem_array((size_t)n_vocab, sizeof *s->pool);
    s->sel = kiri_mem_array((size_t)n_vocab, sizeof *s->sel);
    if (!s->pool || !s->sel)
        goto nomem;
    if (penalties_active(params)) {
        s->ring = kiri_mem_array((size_t)params->repeat_last_n, sizeof *s->ring);
        s->counts = kiri_mem_calloc((size_t)n_vocab, sizeof *s->counts);
        if (!s->ring || !s->counts)
            goto nomem;
    }
    kiri_sampler_reset(s);
    *out = s;
    return KIRI_OK;
nomem:
    kiri_sampler_free(s);
    return KIRI_E_NOMEM;
}

void kiri_sampler_free(struct kiri_sampler *s)
{
    if (!s)
        return;
    kiri_mem_free(s->ring);
    kiri_mem_free(s->counts);
    kiri_mem_free(s->pool);
    kiri_mem_free(s->sel);
    kiri_mem_free(s);
}

void kiri_sampler_reset(struct kiri_sampler *s)
{
    rng_seed(s->rng, s->params.seed);
    if (s->counts) {
        for (int32_t i = 0; i < s->ring_len; i++)
            s->counts[s->ring[i]] = 0;
    }
    s->ring_len = 0;
    s->ring_head = 0;
}

void kiri_sampler_accept(struct kiri_sampler *s, int32_t token)
{
    if (!s->ring || token < 0 || token >= s->n_vocab)
        return;
    int32_t cap = s->params.repeat_last_n;
    if (s->ring_len == cap)
        s->counts[s->ring[s->ring_head]]--;
    else
        s->ring_len++;
    s->ring[s->ring_head] = token;
    s->counts[token]++;
    s->ring_head = s->ring_head + 1 == cap ? 0 : s->ring_head + 1;
}

/* ---------------------------------------------------------------------------------------------
 * Candidate lists
 * ------------------------------------------------------------------------------------------- */

/* The total order every sorted list follows: larger logit first, then smaller id. Ids are
 * unique, so no two candidates compare equal and selections are the same on every platform. */
static int better(const cand *a, const cand *b)
{
    return a->logit > b->logit || (a->logit == b->logit && a->id < b->id);
}

/* Restores the heap property below i in a heap whose root is the worst entry. */
static void sift_down(cand *h, int32_t n, int32_t i)
{
    for (;;) {
        int32_t c = 2 * i + 1;
        if (c >= n)
            return;
        if (c + 1 < n && better(&h[c], &h[c + 1]))
            c++;
        if (!better(&h[i], &h[c]))
            return;
        cand t = h[i];
        h[i] = h[c];
        h[c] = t;
        i = c;
    }
}

/* Writes the m best of src[0..n) to dst[0..m), sorted best first, in O(n log m): a heap of the m
 * best seen so far whose root is the one to evict. 1 <= m <= n. */
static void select_top(const cand *src, int32_t n, cand *dst, int32_t m)
{
    memcpy(dst, src, (size_t)m * sizeof *dst);
    for (int32_t i = m / 2 - 1; i >= 0; i--)
        sift_down(dst, m, i);
    for (int32_t i = m; i < n; i++) {
        if (better(&src[i], &dst[0])) {
            dst[0] = src[i];
            sift_down(dst, m, 0);
        }
    }
    for (int32_t end = m - 1; end > 0; end--) {
        cand t = dst[0];
        dst[0] = dst[end];
        dst[end] = t;
        sift_down(dst, end, 0);
    }
}

/* Applies the penalties once per distinct token in the history. A token's count is negated
 * while it has been handled, and restored afterwards, so repeats in the ring are skipped. */
static void apply_penalties(struct kiri_sampler *s, cand *pool)
{
    const struct kiri_sampling *p = &s->params;
    for (int32_t i = 0; i < s->ring_len; i++) {
        int32_t t = s->ring[i];
        int32_t c = s->counts[t];
        if (c <= 0)
            continue;
        float l = pool[t].logit;
        l = l > 0.0f ? l / p->repeat_penalty : l * p->repeat_penalty;
        l -= (float)c * p->frequency_penalty + p->presence_penalty;
        pool[t].logit = l;
        s->counts[t] = -c;
    }
    for (int32_t i = 0; i < s->ring_len; i++) {
        int32_t t = s->ring[i];
        if (s->counts[t] < 0)
            s->counts[t] = -s->counts[t];
    }
}

/* NaN is treated as -infinity so it never wins a comparison it should not. */
static float clean(float x) { return isnan(x) ? -INFINITY : x; }

int32_t kiri_sampler_argmax(const float *logits, int32_t n)
{
    int32_t best = 0;
    float bl = clean(logits[0]);
    for (int32_t i = 1; i < n; i++) {
        float l = clean(logits[i]);
        if (l > bl) {
            bl = l;
            best = i;
        }
    }
    return best;
}

/* Length of the shortest prefix of c (sorted) whose probability, exp(logit - max) / z, sums to
 * at least top_p; 0 if the whole list falls short. */
static int32_t top_p_cut(const cand *c, int32_t n, float max, double z, float top_p)
{
    double need = (double)top_p * z, cum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        cum += (double)expf(c[i].logit - max);
        if (cum >= need)
            return i + 1;
    }
    return 0;
}

/* The pipeline of sampler.h, steps 1-5 without the draw. Returns the number of candidates left
 * in *out (pool or sel) with their final probabilities. */
static int32_t distribution(struct kiri_sampler *s, const float *logits, cand **out)
{
    const struct kiri_sampling *p = &s->params;
    const int32_t nv = s->n_vocab;
    cand *pool = s->pool;

    int32_t best = 0;
    for (int32_t i = 0; i < nv; i++) {
        pool[i].id = i;
        pool[i].logit = clean(logits[i]);
        pool[i].p = 0.0f;
    }
    if (s->ring)
        apply_penalties(s, pool);
    for (int32_t i = 1; i < nv; i++)
        if (pool[i].logit > pool[best].logit)
            best = i;
    const float max = pool[best].logit;

    if (p->temperature <= 0.0f || !isfinite(max)) {
        s->sel[0] = pool[best];
        s->sel[0].p = 1.0f;
        *out = s->sel;
        return 1;
    }

    cand *c = pool;
    int32_t n = nv;
    int sorted = 0;
    if (p->top_k > 0 && p->top_k < n) {
        select_top(pool, n, s->sel, p->top_k);
        c = s->sel;
        n = p->top_k;
        sorted = 1;
    }

    /* The temperature-1 softmax denominator over what top-k left; top-p measures against it. */
    double z = 0.0;
    for (int32_t i = 0; i < n; i++)
        z += (double)expf(c[i].logit - max);

    /* min-p and top-p each keep a prefix of the sorted list, and min-p's threshold depends only
     * on the maximum, so applying min-p first (a cheap filter without sorting) and then top-p
     * with the denominator from before min-p keeps exactly what llama.cpp's order keeps. */
    if (p->min_p > 0.0f) {
        const float thr = max + logf(p->min_p);
        int32_t m = 0;
        if (sorted) {
            for (m = 1; m < n && c[m].logit >= thr; m++) {
            }
        } else {
            for (int32_t i = 0; i < n; i++)
                if (c[i].logit >= thr)
                    c[m++] = c[i];
        }
        n = m;
    }

    if (p->top_p < 1.0f) {
        if (sorted) {
            int32_t cut = top_p_cut(c, n, max, z, p->top_p);
            if (cut)
                n = cut;
        } else {
            /* Select a growing number of the best until their mass reaches top_p: typical
             * distributions stop after the first round, at O(n log 64). */
            int32_t m = n < 64 ? n : 64;
            for (;;) {
                select_top(c, n, s->sel, m);
                int32_t cut = top_p_cut(s->sel, m, max, z, p->top_p);
                if (cut || m == n) {
                    n = cut ? cut : m;
                    break;
                }
                m = m > n / 8 ? n : m * 8;
            }
            c = s->sel;
        }
    }

    double sum = 0.0;
    for (int32_t i = 0; i < n; i++) {
        float w = expf((c[i].logit - max) / p->temperature);
        c[i].p = w;
        sum += (double)w;
    }
    for (int32_t i = 0; i < n; i++)
        c[i].p = (float)((double)c[i].p / sum);
    *out = c;
    return n;
}

/* ---------------------------------------------------------------------------------------------
 * Sampling
 * ------------------------------------------------------------------------------------------- */

int32_t kiri_sampler_dist(struct kiri_sampler *s, const float *logits,
                          const struct kiri_sampler_candidate **out)
{
    cand *c;
    int32_t n = distribution(s, logits, &c);
    *out = c;
    return n;
}

/* One uniform number is drawn per call whenever temperature > 0, even when one candidate is
 * left, so the random stream advances by one per token and seeds stay comparable across runs
 * whose filters differ. */
int32_t kiri_sampler_sample(struct kiri_sampler *s, const float *logits)
{
    if (s->params.temperature <= 0.0f && !s->ring)
        return kiri_sampler_argmax(logits, s->n_vocab);
    double u = s->params.temperature > 0.0f ? rng_uniform(s->rng) : 0.0;
    cand *c;
    int32_t n = distribution(s, logits, &c);
    if (n == 1)
        return c[0].id;
    double total = 0.0;
    for (int32_t i = 0; i < n; i++)
        total += (double)c[i].p;
    double r = u * total, acc = 0.0;
    int32_t last = 0;
    for (int32_t i = 0; i < n; i++) {
        if (c[i].p <= 0.0f)
            continue;
        acc += (double)c[i].p;
        last = i;
        if (acc > r)
            return c[i].id;
    }
    return c[last].id;
}

int32_t kiri_sampler_verify(struct kiri_sampler *s, const float *logits, int32_t draft, int *accepted)
{
    if (s->params.temperature <= 0.0f) {
        const int32_t t = kiri_sampler_sample(s, logits);
        *accepted = t == draft;
        return t;
    }
    const double u = rng_uniform(s->rng);
    cand *c;
    const int32_t n = distribution(s, logits, &c);
    double total = 0.0, p_draft = 0.0;
    for (int32_t i = 0; i < n; i++) {
        total += (double)c[i].p;
        if (c[i].id == draft)
            p_draft = (double)c[i].p;
    }
    *accepted = u * total < p_draft;
    if (*accepted)
        return draft;
    /* The residual max(0, p - q) of a one-hot draft q is p without the draft. */
    const double r = rng_uniform(s->rng) * (total - p_draft);
    double acc = 0.0;
    int32_t last = -1;
    for (int32_t i = 0; i < n; i++) {
        if (c[i].id == draft || c[i].p <= 0.0f)
            continue;
        acc += (double)c[i].p;
        last = i;
        if (acc > r)
            return c[i].id;
    }
    /* Nothing but the draft had any probability: rounding kept it from being accepted above. */
    *accepted = last < 0;
    return last < 0 ? draft : c[last].id;
}
