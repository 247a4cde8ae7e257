/* ops_check: the checks shared by the SIMD row-operation tests; see ops_check.h.
 *
 * Tolerances. The attention outputs are weighted means of value rows with |v| <= 1. The kernels
 * sum in another order and use their own exp (within 2 ulp of expf), so a weight rounded to F16
 * may land one F16 step away from the reference's: 2^-11 (4.9e-4) for a weight in [0.5, 1). F16
 * caches therefore get 5e-4 absolute, which one such flip may use up (one seen on NEON: a weight
 * of 0.40344289, 5e-7 above the midpoint of two F16 values, moved a result by 2.4e-4); without a
 * flip the error stays near 1e-5. F32 caches get 1e-5 (weights are not rounded; seen: below
 * 1e-6). A wrong key or weight is off by far more. Cases must match the reference exactly where
 * every key is equal and the cache is F16 (see cache_init), and where the kernels hand the work
 * to the reference (Q8_0 caches, head sizes the table does not take: see ops_check_init). Each
 * attention check prints the largest error it saw. SwiGLU and RMS norm rows: see swiglu_close
 * and ops_check_rows. */
#include "ops_check.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "test.h"

#define TOL_F16 5e-4 /* see above */
#define TOL_F32 1e-5

/* Floats written after a scratch area, which the kernels must leave alone. */
#define GUARD 64
#define GUARD_VALUE 12345.0f

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The checks here count in this file's test.h counters; every public entry hands them over to
 * the caller's before it returns. */
static void hand_over(struct ops_check *o)
{
    (void)test_run_all; /* the callers run the tests */
    *o->checks += test_checks;
    *o->failures += test_failures;
    test_checks = test_failures = 0;
}

void ops_check_init(struct ops_check *o, const struct kiri_cpu_kernels *k, const char *name,
                    int head_multiple, int group_scratch, uint64_t seed, int *checks, int *failures)
{
    memset(o, 0, sizeof *o);
    o->k = k;
    o->name = name;
    o->head_multiple = head_multiple > 0 ? head_multiple : 1;
    o->group_scratch = group_scratch > 0 && group_scratch <= KIRI_ATTEND_TILE_ROWS ? group_scratch
                                                                                  : KIRI_ATTEND_TILE_ROWS;
    o->checks = checks;
    o->failures = failures;
    test_rng_state = seed;
}

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

/* n floats uniform in [-spread, spread). */
static float *random_floats(size_t n, float spread)
{
    float *p = test_xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = test_rand_sym() * spread;
    return p;
}

/* n floats of NaN: an output area whose padding must stay as it is. */
static float *nan_floats(size_t n)
{
    float *p = test_xmalloc(n * sizeof *p);
    for (size_t i = 0; i < n; i++)
        p[i] = NAN;
    return p;
}

static void check_nan(const float *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        CHECK(isnan(p[i]));
}

/* A scratch area of n floats followed by the guard. */
static float *scratch_alloc(size_t n)
{
    float *s = test_xmalloc((n + GUARD) * sizeof *s);
    for (size_t i = 0; i < n + GUARD; i++)
        s[i] = i < n ? NAN : GUARD_VALUE;
    return s;
}

static int guard_intact(const float *s, size_t n)
{
    for (size_t i = n; i < n + GUARD; i++)
        if (s[i] != GUARD_VALUE)
            return 0;
    return 1;
}

/* Rows of a cache for n keys: extra more, raised to a count that is not a multiple of 7, so that
 * the slots of pick_slots are distinct. */
static int cache_rows(int n, int extra)
{
    int rows = n + extra;
    while (rows % 7 == 0)
        rows++;
    return rows;
}

/* n distinct, scattered slots (j * 7 + first) % rows (at least one entry allocated). */
static int32_t *pick_slots(int n, int first, int rows)
{
    int32_t *slots = test_xmalloc((size_t)(n > 0 ? n : 1) * sizeof *slots);
    for (int j = 0; j < n; j++)
        slots[j] = (int32_t)((j * 7 + first) % rows);
    return slots;
}

/* A key and a value cache: n_rows rows of kv_type, head_dim values each, stride bytes apart (the
 * bytes between belong to other heads). */
struct cache {
    void *k, *v; /* owned: (n_rows, stride) bytes each */
    size_t stride;
};

static void fill_rows(void *cache, int kv_type, int n_rows, int head_dim, size_t stride)
{
    for (int s = 0; s < n_rows; s++) {
        float *row = random_floats((size_t)head_dim, 1.0f);
        CHECK(kiri_cpu_quantize_row(kv_type, row, (char *)cache + (size_t)s * stride, head_dim) > 0);
        free(row);
    }
}

/* Random keys and values. With same, every key row is a copy of the first: all scores are then
 * equal whatever order their sums take, every weight is exactly 1/n_kv before rounding, and with
 * an F16 cache every product of an F16 weight and an F16 value is exact, so the kernels must give
 * the reference's bits. That is where a weight left unrounded (an error below the tolerance)
 * shows. */
static void cache_init(struct cache *c, int kv_type, int head_dim, int n_rows, size_t stride, int same)
{
    c->stride = stride;
    c->k = test_xmalloc(stride * (size_t)n_rows);
    c->v = test_xmalloc(stride * (size_t)n_rows);
    fill_rows(c->k, kv_type, n_rows, head_dim, stride);
    fill_rows(c->v, kv_type, n_rows, head_dim, stride);
    for (int s = 1; same && s < n_rows; s++)
        memcpy((char *)c->k + (size_t)s * stride, c->k, kiri_row_bytes(kv_type, head_dim));
}

static void cache_free(struct cache *c)
{
    free(c->k);
    free(c->v);
}

static double tolerance(const struct ops_check *o, int kv_type, int d, int same)
{
    if (kv_type == KIRI_TYPE_Q8_0 || d % o->head_multiple != 0 || d > 1024 ||
        (same && kv_type == KIRI_TYPE_F16))
        return 0.0; /* the reference itself, or exact (see cache_init) */
    return kv_type == KIRI_TYPE_F32 ? TOL_F32 : TOL_F16;
}

/* d attention outputs against the reference's within tol; records the largest error by cache
 * type. The first 3 misses of a case (*bad counts them) print what (the case) and fail. */
static void compare(struct ops_check *o, int kv_type, const float *got, const float *want, int d, double tol,
                    int *bad, const char *what)
{
    for (int i = 0; i < d; i++) {
        const double e = fabs((double)got[i] - (double)want[i]);
        if (kv_type == KIRI_TYPE_F32)
            o->worst_f32 = e > o->worst_f32 ? e : o->worst_f32;
        else if (kv_type == KIRI_TYPE_F16)
            o->worst_f16 = e > o->worst_f16 ? e : o->worst_f16;
        if (!(e <= tol) && (*bad)++ < 3) {
            fprintf(stderr, "  %s value %d\n", what, i);
            CHECK_NEAR(got[i], want[i], tol);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * One head
 * ------------------------------------------------------------------------------------------- */

struct attn_case {
    int kv_type, head_dim, n_kv;
    float q_scale; /* large values give scores far apart: most weights underflow */
    int same_keys; /* every key row equal: see cache_init() */
};

/* Head sizes that are and are not multiples of 4, 8, 16 and 64 (and 1024, the largest the
 * kernels take), key counts around the kernels' groups of 4 and 8. */
static const struct attn_case attn_cases[] = {
    {KIRI_TYPE_F16, 64, 1, 1.0f, 0},     {KIRI_TYPE_F16, 64, 3, 1.0f, 0},     {KIRI_TYPE_F16, 64, 4, 1.0f, 0},
    {KIRI_TYPE_F16, 64, 5, 1.0f, 0},     {KIRI_TYPE_F16, 64, 7, 1.0f, 0},     {KIRI_TYPE_F16, 64, 8, 1.0f, 0},
    {KIRI_TYPE_F16, 64, 9, 1.0f, 0},     {KIRI_TYPE_F16, 64, 12, 1.0f, 0},    {KIRI_TYPE_F16, 64, 15, 1.0f, 0},
    {KIRI_TYPE_F16, 64, 17, 1.0f, 0},    {KIRI_TYPE_F16, 64, 33, 1.0f, 0},    {KIRI_TYPE_F16, 64, 300, 1.0f, 0},
    {KIRI_TYPE_F16, 64, 300, 40.f, 0},   {KIRI_TYPE_F16, 128, 77, 1.0f, 0},   {KIRI_TYPE_F16, 72, 16, 1.0f, 0},
    {KIRI_TYPE_F16, 8, 5, 1.0f, 0},      {KIRI_TYPE_F16, 8, 40, 30.f, 0},     {KIRI_TYPE_F16, 4, 6, 1.0f, 0},
    {KIRI_TYPE_F16, 12, 11, 1.0f, 0},    {KIRI_TYPE_F16, 84, 19, 1.0f, 0},    {KIRI_TYPE_F16, 6, 9, 1.0f, 0},
    {KIRI_TYPE_F16, 1024, 13, 1.0f, 0},  {KIRI_TYPE_F32, 64, 1, 1.0f, 0},     {KIRI_TYPE_F32, 64, 10, 1.0f, 0},
    {KIRI_TYPE_F32, 64, 513, 3.0f, 0},   {KIRI_TYPE_F32, 136, 20, 1.0f, 0},   {KIRI_TYPE_F32, 20, 23, 1.0f, 0},
    {KIRI_TYPE_F32, 10, 7, 1.0f, 0},     {KIRI_TYPE_Q8_0, 64, 50, 1.0f, 0},   {KIRI_TYPE_F16, 64, 3, 1.0f, 1},
    {KIRI_TYPE_F16, 64, 7, 1.0f, 1},     {KIRI_TYPE_F16, 64, 13, 1.0f, 1},    {KIRI_TYPE_F16, 12, 6, 1.0f, 1},
    {KIRI_TYPE_F32, 64, 7, 1.0f, 1},
};

/* The output past head_dim stays untouched, the scratch within its n_kv floats. */
void ops_check_attend_head(struct ops_check *o)
{
    const struct kiri_cpu_kernels *k = o->k;
    o->worst_f32 = o->worst_f16 = 0.0;
    CHECK(k->attend_head != NULL && k->attend_head != kiri_cpu_attend_head);
    for (size_t c = 0; k->attend_head && c < COUNT(attn_cases); c++) {
        const struct attn_case *tc = &attn_cases[c];
        const int d = tc->head_dim, n_rows = cache_rows(tc->n_kv, 11);
        struct cache kv;
        cache_init(&kv, tc->kv_type, d, n_rows, kiri_row_bytes(tc->kv_type, d) + 32, tc->same_keys);
        int32_t *slots = pick_slots(tc->n_kv, 3, n_rows);
        float *q = random_floats((size_t)d, tc->q_scale);
        float *s_ref = test_xmalloc((size_t)tc->n_kv * sizeof(float)), *s_fast = scratch_alloc((size_t)tc->n_kv);
        float *o_ref = test_xmalloc((size_t)d * sizeof(float)), *o_fast = nan_floats((size_t)d + 4);
        const float scale = 1.0f / sqrtf((float)d);
        kiri_cpu_attend_head(q, kv.k, kv.stride, kv.v, kv.stride, tc->kv_type, slots, tc->n_kv, d, scale, s_ref,
                             o_ref);
        k->attend_head(q, kv.k, kv.stride, kv.v, kv.stride, tc->kv_type, slots, tc->n_kv, d, scale, s_fast, o_fast);
        char what[96];
        snprintf(what, sizeof what, "case %zu (%s, d %d, n_kv %d%s):", c, kiri_type_name(tc->kv_type), d,
                 tc->n_kv, tc->same_keys ? ", equal keys" : "");
        int bad = 0;
        compare(o, tc->kv_type, o_fast, o_ref, d, tolerance(o, tc->kv_type, d, tc->same_keys), &bad, what);
        check_nan(o_fast + d, 4);
        CHECK(guard_intact(s_fast, (size_t)tc->n_kv));
        cache_free(&kv);
        free(slots);
        free(q);
        free(s_ref);
        free(s_fast);
        free(o_ref);
        free(o_fast);
    }
    fprintf(stderr, "%s: %zu cases checked against the reference (largest error F16 %.2g, F32 %.2g)\n",
            o->name, COUNT(attn_cases), o->worst_f16, o->worst_f32);
    hand_over(o);
}

/* ---------------------------------------------------------------------------------------------
 * Groups of heads
 * ------------------------------------------------------------------------------------------- */

/* The cases of groups, each run with every group size from 1 to 16. Head sizes above 256 (260,
 * 264) go one head at a time inside the kernels. */
static const struct attn_case group_cases[] = {
    {KIRI_TYPE_F16, 64, 1, 1.0f, 0},    {KIRI_TYPE_F16, 64, 37, 1.0f, 0},   {KIRI_TYPE_F16, 64, 300, 30.f, 0},
    {KIRI_TYPE_F16, 128, 50, 1.0f, 0},  {KIRI_TYPE_F16, 256, 9, 1.0f, 0},   {KIRI_TYPE_F16, 72, 12, 1.0f, 0},
    {KIRI_TYPE_F16, 8, 20, 1.0f, 0},    {KIRI_TYPE_F16, 12, 6, 1.0f, 0},    {KIRI_TYPE_F16, 260, 5, 1.0f, 0},
    {KIRI_TYPE_F16, 6, 4, 1.0f, 0},     {KIRI_TYPE_F16, 64, 20, 1.0f, 0},   {KIRI_TYPE_F16, 264, 6, 1.0f, 0},
    {KIRI_TYPE_F32, 64, 130, 1.0f, 0},  {KIRI_TYPE_F32, 96, 7, 2.0f, 0},    {KIRI_TYPE_F32, 20, 3, 1.0f, 0},
    {KIRI_TYPE_Q8_0, 64, 40, 1.0f, 0},  {KIRI_TYPE_F16, 64, 7, 1.0f, 1},    {KIRI_TYPE_F16, 72, 13, 1.0f, 1},
    /* More value rows than the kernels prefetch while scoring (256 KiB): fetched a block ahead. */
    {KIRI_TYPE_F16, 256, 603, 1.0f, 0}, {KIRI_TYPE_F32, 96, 701, 1.0f, 0},
};

/* Every head of a group against the reference one head at a time; the output rows' padding must
 * stay untouched and the scratch within its group_scratch floats per key. */
void ops_check_attend_group(struct ops_check *o)
{
    const struct kiri_cpu_kernels *k = o->k;
    o->worst_f32 = o->worst_f16 = 0.0;
    CHECK(k->attend_group != NULL);
    int runs = 0;
    for (size_t c = 0; k->attend_group && c < COUNT(group_cases); c++) {
        const struct attn_case *tc = &group_cases[c];
        const int d = tc->head_dim, n_rows = cache_rows(tc->n_kv, 5);
        struct cache kv;
        cache_init(&kv, tc->kv_type, d, n_rows, kiri_row_bytes(tc->kv_type, d) * 3, tc->same_keys);
        int32_t *slots = pick_slots(tc->n_kv, 1, n_rows);
        float *s_ref = test_xmalloc((size_t)tc->n_kv * sizeof(float)), *o_ref = test_xmalloc((size_t)d * sizeof(float));
        const float scale = 1.0f / sqrtf((float)d);
        const double tol = tolerance(o, tc->kv_type, d, tc->same_keys);
        for (int n_q = 1; n_q <= 16; n_q++, runs++) {
            const size_t q_stride = (size_t)d + 8, out_stride = (size_t)d + 16;
            const size_t n_scratch = (size_t)tc->n_kv * (size_t)o->group_scratch;
            float *q = random_floats(q_stride * (size_t)n_q, tc->q_scale);
            float *out = nan_floats(out_stride * (size_t)n_q);
            float *scratch = scratch_alloc(n_scratch);
            k->attend_group(q, q_stride, n_q, kv.k, kv.stride, kv.v, kv.stride, tc->kv_type, slots, tc->n_kv, d,
                            scale, scratch, out, out_stride);
            int bad = 0;
            for (int h = 0; h < n_q; h++) {
                kiri_cpu_attend_head(q + (size_t)h * q_stride, kv.k, kv.stride, kv.v, kv.stride, tc->kv_type, slots,
                                     tc->n_kv, d, scale, s_ref, o_ref);
                char what[128];
                snprintf(what, sizeof what, "group case %zu (%s, d %d, n_kv %d, n_q %d): head %d", c,
                         kiri_type_name(tc->kv_type), d, tc->n_kv, n_q, h);
                compare(o, tc->kv_type, out + (size_t)h * out_stride, o_ref, d, tol, &bad, what);
                check_nan(out + (size_t)h * out_stride + d, out_stride - (size_t)d);
            }
            CHECK(guard_intact(scratch, n_scratch));
            free(q);
            free(out);
            free(scratch);
        }
        cache_free(&kv);
        free(slots);
        free(s_ref);
        free(o_ref);
    }
    fprintf(stderr, "%s: %d groups (%zu cases x 1..16 heads) checked against the reference "
                    "(largest error F16 %.2g, F32 %.2g)\n",
            o->name, runs, COUNT(group_cases), o->worst_f16, o->worst_f32);
    hand_over(o);
}

/* ---------------------------------------------------------------------------------------------
 * Tiles of tokens times heads
 * ------------------------------------------------------------------------------------------- */

struct tile_case {
    int kv_type, head_dim, n_t, n_q, n_kv0; /* token i sees n_kv0 + i keys */
    float q_scale;
    int same_keys;
    int window; /* > 0: token i sees only the last `window` of its keys */
};

/* Tiles of 1 to 16 rows (one or two vectors of 8 lanes), n_kv0 = 0 for a first token that sees
 * nothing, head sizes above 256 (one head at a time inside the kernels). */
static const struct tile_case tile_cases[] = {
    {KIRI_TYPE_F16, 64, 5, 3, 1, 1.0f, 0, 0},     {KIRI_TYPE_F16, 64, 5, 3, 300, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 64, 2, 8, 37, 1.0f, 0, 0},    {KIRI_TYPE_F16, 64, 4, 4, 9, 30.f, 0, 0},
    {KIRI_TYPE_F16, 128, 2, 7, 50, 1.0f, 0, 0},   {KIRI_TYPE_F16, 256, 1, 16, 20, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 64, 16, 1, 3, 1.0f, 0, 0},    {KIRI_TYPE_F16, 64, 3, 5, 0, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 72, 3, 3, 12, 1.0f, 0, 0},    {KIRI_TYPE_F16, 8, 16, 1, 1, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 8, 8, 2, 0, 1.0f, 0, 0},      {KIRI_TYPE_F16, 12, 7, 2, 4, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 64, 1, 1, 8, 1.0f, 0, 0},     {KIRI_TYPE_F16, 64, 2, 1, 7, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 64, 3, 2, 5, 1.0f, 0, 0},     {KIRI_TYPE_F16, 64, 6, 2, 2, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 64, 13, 1, 0, 1.0f, 0, 0},    {KIRI_TYPE_F16, 260, 3, 2, 6, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 264, 3, 2, 6, 1.0f, 0, 0},    {KIRI_TYPE_F16, 6, 4, 2, 3, 1.0f, 0, 0},
    {KIRI_TYPE_F32, 64, 5, 3, 130, 1.0f, 0, 0},   {KIRI_TYPE_F32, 96, 2, 6, 7, 2.0f, 0, 0},
    {KIRI_TYPE_F32, 20, 9, 1, 1, 1.0f, 0, 0},     {KIRI_TYPE_Q8_0, 64, 4, 4, 40, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 64, 3, 5, 2, 1.0f, 1, 0},     {KIRI_TYPE_F16, 8, 16, 1, 1, 1.0f, 1, 0},
    {KIRI_TYPE_F16, 12, 7, 2, 4, 1.0f, 1, 0},
    /* A decode step's 8 heads of one key/value head over several blocks of value rows; 2 and 3
     * heads of 256 over more value rows than the kernels prefetch while scoring. */
    {KIRI_TYPE_F16, 64, 1, 8, 700, 1.0f, 0, 0},   {KIRI_TYPE_F16, 256, 1, 2, 1030, 1.0f, 0, 0},
    {KIRI_TYPE_F16, 256, 1, 3, 517, 1.0f, 0, 0},  {KIRI_TYPE_F32, 128, 2, 1, 1100, 1.0f, 0, 600},
    /* Sliding windows: every token past it (first keys 4 .. 8), a prompt that grows into it,
     * a window of 1, windows around the vector widths, cases the kernels hand on. */
    {KIRI_TYPE_F16, 64, 5, 3, 9, 1.0f, 0, 5},  {KIRI_TYPE_F16, 64, 16, 1, 3, 1.0f, 0, 4},
    {KIRI_TYPE_F32, 64, 5, 3, 130, 1.0f, 0, 7}, {KIRI_TYPE_F16, 128, 2, 7, 50, 1.0f, 0, 1},
    {KIRI_TYPE_F16, 8, 16, 1, 1, 1.0f, 0, 3},  {KIRI_TYPE_F16, 64, 4, 4, 9, 30.f, 0, 8},
    {KIRI_TYPE_F16, 256, 1, 16, 20, 1.0f, 0, 9}, {KIRI_TYPE_F32, 20, 9, 1, 1, 1.0f, 0, 2},
    {KIRI_TYPE_Q8_0, 64, 4, 4, 40, 1.0f, 0, 5}, {KIRI_TYPE_F16, 260, 3, 2, 6, 1.0f, 0, 2},
    {KIRI_TYPE_F16, 64, 3, 5, 12, 1.0f, 1, 2},  {KIRI_TYPE_F16, 12, 7, 2, 4, 1.0f, 0, 6},
    {KIRI_TYPE_F16, 64, 5, 3, 400, 1.0f, 0, 300}, /* windows that start inside a block of values */
};

/* Runs of tokens times heads against the reference one (token, head) at a time, token i seeing
 * n_kv0 + i keys (a prompt's causal mask), or with a window only the last of them (the reference
 * then runs on just those). The key and value only the last token sees hold NaN and infinities:
 * an earlier token's result must not depend on them. With a window whose start moves between the
 * first two tokens, so do the key and value only the first token sees, and every key before it
 * (which no token sees). Output padding stays untouched, the scratch within its
 * KIRI_ATTEND_TILE_ROWS floats per key. */
void ops_check_attend_tile(struct ops_check *o)
{
    const struct kiri_cpu_kernels *k = o->k;
    o->worst_f32 = o->worst_f16 = 0.0;
    CHECK(k->attend_tile != NULL);
    for (size_t c = 0; k->attend_tile && c < COUNT(tile_cases); c++) {
        const struct tile_case *tc = &tile_cases[c];
        const int d = tc->head_dim, n_max = tc->n_kv0 + tc->n_t - 1, n_rows = cache_rows(n_max, 5);
        const int rows = tc->n_t * tc->n_q;
        CHECK(rows <= KIRI_ATTEND_TILE_ROWS);
        struct cache kv;
        cache_init(&kv, tc->kv_type, d, n_rows, kiri_row_bytes(tc->kv_type, d) * 2, tc->same_keys);
        int32_t *slots = pick_slots(n_max, 2, n_rows);
        int32_t n_kv[KIRI_ATTEND_TILE_ROWS], first[KIRI_ATTEND_TILE_ROWS];
        for (int i = 0; i < tc->n_t && i < KIRI_ATTEND_TILE_ROWS; i++) {
            n_kv[i] = tc->n_kv0 + i;
            first[i] = tc->window > 0 && n_kv[i] > tc->window ? n_kv[i] - tc->window : 0;
        }
        const size_t q_head = (size_t)d + 8, q_tok = q_head * (size_t)tc->n_q + 24;
        const size_t out_head = (size_t)d + 16, out_tok = out_head * (size_t)tc->n_q + 8;
        float *q = random_floats(q_tok * (size_t)tc->n_t, tc->q_scale);
        float *out = nan_floats(out_tok * (size_t)tc->n_t);
        const size_t n_scratch = (size_t)(n_max > 0 ? n_max : 1) * KIRI_ATTEND_TILE_ROWS;
        float *scratch = scratch_alloc(n_scratch);
        float *s_ref = test_xmalloc((size_t)(n_max > 0 ? n_max : 1) * sizeof(float));
        float *o_ref = test_xmalloc((size_t)rows * (size_t)d * sizeof(float)); /* (rows, d) */
        const float scale = 1.0f / sqrtf((float)d);
        /* The reference first, on clean keys and values; then the key and value of the last
         * token's last key turn into NaN and infinity, which only that token sees. */
        for (int r = 0; r < rows; r++)
            kiri_cpu_attend_head(q + (size_t)(r / tc->n_q) * q_tok + (size_t)(r % tc->n_q) * q_head, kv.k, kv.stride,
                                 kv.v, kv.stride, tc->kv_type, slots + first[r / tc->n_q],
                                 n_kv[r / tc->n_q] - first[r / tc->n_q], d, scale, s_ref, o_ref + (size_t)r * (size_t)d);
        const int poisoned = tc->n_t > 1 && tc->kv_type != KIRI_TYPE_Q8_0;
        const int poisoned_first = poisoned && first[0] < first[1];
        if (poisoned) {
            float *nan_inf = test_xmalloc((size_t)d * sizeof *nan_inf);
            for (int i = 0; i < d; i++)
                nan_inf[i] = i % 2 ? NAN : INFINITY;
            for (int j = poisoned_first ? 0 : n_max - 1; j < n_max; j = j == first[0] ? n_max - 1 : j + 1) {
                const size_t at = (size_t)slots[j] * kv.stride;
                CHECK(kiri_cpu_quantize_row(tc->kv_type, nan_inf, (char *)kv.k + at, d) > 0);
                CHECK(kiri_cpu_quantize_row(tc->kv_type, nan_inf, (char *)kv.v + at, d) > 0);
            }
            free(nan_inf);
        }
        k->attend_tile(q, q_tok, q_head, tc->n_t, tc->n_q, kv.k, kv.stride, kv.v, kv.stride, tc->kv_type, slots,
                       tc->window > 0 ? first : NULL, n_kv, d, scale, scratch, out, out_tok, out_head);
        const double tol = tolerance(o, tc->kv_type, d, tc->same_keys);
        int bad = 0;
        for (int r = 0; r < rows; r++) {
            const int i_t = r / tc->n_q, h = r % tc->n_q;
            const float *got = out + (size_t)i_t * out_tok + (size_t)h * out_head;
            if ((poisoned && i_t == tc->n_t - 1) || (poisoned_first && i_t == 0))
                continue; /* sees a poisoned key: no reference to compare with */
            char what[160];
            snprintf(what, sizeof what,
                     "tile case %zu (%s, d %d, %d tokens x %d heads, n_kv0 %d, window %d): token %d head %d", c,
                     kiri_type_name(tc->kv_type), d, tc->n_t, tc->n_q, tc->n_kv0, tc->window, i_t, h);
            compare(o, tc->kv_type, got, o_ref + (size_t)r * (size_t)d, d, tol, &bad, what);
            check_nan(got + d, out_head - (size_t)d);
        }
        CHECK(guard_intact(scratch, n_scratch));
        cache_free(&kv);
        free(slots);
        free(q);
        free(out);
        free(scratch);
        free(s_ref);
        free(o_ref);
    }
    fprintf(stderr, "%s: %zu cases checked against the reference (largest error F16 %.2g, F32 %.2g)\n",
            o->name, COUNT(tile_cases), o->worst_f16, o->worst_f32);
    hand_over(o);
}

/* ---------------------------------------------------------------------------------------------
 * Element-wise rows
 * ------------------------------------------------------------------------------------------- */

/* A few ulp of silu(g) u; where e^g is below the smallest normal float (g < -87.3) the kernels'
 * exp flushes to 0, leaving results under 1e-35 instead of tiny values. */
static double swiglu_tol(float g, float want)
{
    (void)g;
    return 4e-7 * fabs((double)want) + 1e-35;
}

/* The same scale as the reference's up to its last bit. */
static double rms_norm_tol(float want)
{
    return 2.5e-7 * fabs((double)want);
}

/* Compares n results of a row kernel with the reference's within tol(x, want); returns the worst
 * error relative to the reference's value (where that is above 1e-30). */
static double compare_row(const char *what, const float *x, const float *got, const float *want, int64_t n,
                          double (*tol)(float x, float want))
{
    double worst = 0.0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - (double)want[i]);
        if (fabs((double)want[i]) > 1e-30)
            worst = fmax(worst, e / fabs((double)want[i]));
        if (!(e <= tol(x[i], want[i])) && bad++ < 3) {
            fprintf(stderr, "  %s: value %lld (x %.9g)\n", what, (long long)i, (double)x[i]);
            CHECK_NEAR(got[i], want[i], tol(x[i], want[i]));
        }
    }
    return worst;
}

/* n values evenly spaced over [lo, hi]. */
static float *sweep(float lo, float hi, int n)
{
    float *x = test_xmalloc((size_t)n * sizeof *x);
    for (int i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * (float)i / (float)(n - 1);
    return x;
}

/* The SwiGLU sweep: gates evenly spaced from -100 to 100, which walks the kernels' exp over its
 * whole range. Returns the worst relative error. */
static double swiglu_sweep(const struct kiri_cpu_kernels *k)
{
    enum { N_SWEEP = 200001 };
    float *g = sweep(-100.0f, 100.0f, N_SWEEP), *u = sweep(1.0f, 1.0f, N_SWEEP);
    float *a = test_xmalloc(N_SWEEP * sizeof *a), *b = test_xmalloc(N_SWEEP * sizeof *b);
    kiri_cpu_swiglu_row(g, u, a, N_SWEEP);
    k->swiglu_row(g, u, b, N_SWEEP);
    const double worst = compare_row("swiglu sweep", g, b, a, N_SWEEP, swiglu_tol);
    free(g);
    free(u);
    free(a);
    free(b);
    return worst;
}

/* GeGLU, scaling and soft-capping against the reference. GeGLU: the kernels form 2z as the
 * reference does and differ in exp (2 ulp) and the sigmoid's division, so a few ulp, growing with
 * |2z| where x < 0 (e^-2z carries its argument's rounding |2z| times over: at x = -10, 2z = -87);
 * results under 1e-35 may flush to 0. Soft-capping: tanh within a few ulp of tanhf; scaling: the
 * same product. */
static double geglu_tol(float x, float want)
{
    const double z2 = fabs(2.0 * 0.7978845608 * ((double)x + 0.044715 * (double)x * x * x));
    return fabs((double)want) * (4e-7 + (x < 0 ? z2 * 1.2e-7 : 0.0)) + 1e-35;
}

static double softcap_tol(float x, float want)
{
    (void)x;
    return 6e-7 * fabs((double)want) + 1e-38;
}

static double exact_tol(float x, float want)
{
    (void)x;
    (void)want;
    return 0.0;
}

/* The rows of lengths around the vector widths (nothing written past n; in place where the
 * contract allows), then sweeps of x over [-20, 20] (GeGLU: both tails of the sigmoid and the
 * flush to 0; soft-capping at caps 1 and 30: tanh's polynomial, its switch at 0.4 and its
 * saturation). Returns the worst relative errors of GeGLU and soft-capping. */
static void check_glu_caps(const struct kiri_cpu_kernels *k, double *worst_geglu, double *worst_softcap)
{
    static const int64_t lens[] = {1, 3, 4, 5, 7, 8, 9, 16, 29, 2048, 5632};
    *worst_geglu = *worst_softcap = 0.0;
    for (size_t li = 0; li < COUNT(lens); li++) {
        const int64_t n = lens[li];
        float *x = random_floats((size_t)n, 8.0f), *u = random_floats((size_t)n, 1.0f);
        float *a = test_xmalloc((size_t)n * sizeof *a), *b = nan_floats((size_t)n + 4);
        kiri_cpu_geglu_row(x, u, a, n);
        k->geglu_row(x, u, b, n);
        *worst_geglu = fmax(*worst_geglu, compare_row("geglu", x, b, a, n, geglu_tol));
        check_nan(b + n, 4);
        float *c = test_xmalloc((size_t)n * sizeof *c);
        memcpy(c, x, (size_t)n * sizeof *c);
        k->geglu_row(c, u, c, n); /* in place */
        compare_row("geglu in place", x, c, a, n, geglu_tol);
        kiri_cpu_softcap_row(x, a, n, 5.0f);
        k->softcap_row(x, b, n, 5.0f);
        *worst_softcap = fmax(*worst_softcap, compare_row("softcap", x, b, a, n, softcap_tol));
        memcpy(c, x, (size_t)n * sizeof *c);
        k->softcap_row(c, c, n, 5.0f);
        compare_row("softcap in place", x, c, a, n, softcap_tol);
        kiri_cpu_scale_row(x, a, n, 0.37f);
        k->scale_row(x, b, n, 0.37f);
        compare_row("scale", x, b, a, n, exact_tol);
        check_nan(b + n, 4);
        free(x);
        free(u);
        free(a);
        free(b);
        free(c);
    }
    enum { N_SWEEP = 400001 };
    float *x = sweep(-20.0f, 20.0f, N_SWEEP), *u = sweep(1.0f, 1.0f, N_SWEEP);
    float *a = test_xmalloc(N_SWEEP * sizeof *a), *b = test_xmalloc(N_SWEEP * sizeof *b);
    kiri_cpu_geglu_row(x, u, a, N_SWEEP);
    k->geglu_row(x, u, b, N_SWEEP);
    *worst_geglu = fmax(*worst_geglu, compare_row("geglu sweep", x, b, a, N_SWEEP, geglu_tol));
    for (int ci = 0; ci < 2; ci++) {
        const float cap = ci ? 30.0f : 1.0f;
        kiri_cpu_softcap_row(x, a, N_SWEEP, cap);
        k->softcap_row(x, b, N_SWEEP, cap);
        *worst_softcap = fmax(*worst_softcap, compare_row("softcap sweep", x, b, a, N_SWEEP, softcap_tol));
    }
    free(x);
    free(u);
    free(a);
    free(b);
}

/* SwiGLU and RMS norm rows against the reference, with lengths around the vector widths of 4 and
 * 8, gates far into both tails of the sigmoid, and a norm without weights; nothing is written
 * past n. Then the SwiGLU sweep. */
void ops_check_rows(struct ops_check *o)
{
    const struct kiri_cpu_kernels *k = o->k;
    CHECK(k->swiglu_row != NULL && k->swiglu_row != kiri_cpu_swiglu_row);
    CHECK(k->rms_norm_row != NULL && k->rms_norm_row != kiri_cpu_rms_norm_row);
    CHECK(k->geglu_row != NULL && k->geglu_row != kiri_cpu_geglu_row);
    CHECK(k->scale_row != NULL && k->scale_row != kiri_cpu_scale_row);
    CHECK(k->softcap_row != NULL && k->softcap_row != kiri_cpu_softcap_row);
    if (!k->swiglu_row || !k->rms_norm_row || !k->geglu_row || !k->scale_row || !k->softcap_row) {
        hand_over(o);
        return;
    }
    static const int64_t lens[] = {1, 3, 4, 5, 7, 8, 9, 16, 29, 2048, 5632};
    static const float spreads[] = {1.0f, 30.0f, 200.0f};
    for (size_t li = 0; li < COUNT(lens); li++)
        for (size_t si = 0; si < COUNT(spreads); si++) {
            const int64_t n = lens[li];
            float *g = random_floats((size_t)n, spreads[si]), *u = random_floats((size_t)n, 1.0f);
            float *w = random_floats((size_t)n, 2.0f);
            float *a = test_xmalloc((size_t)n * sizeof *a), *b = nan_floats((size_t)n + 4);
            kiri_cpu_swiglu_row(g, u, a, n);
            k->swiglu_row(g, u, b, n);
            int bad = 0;
            for (int64_t i = 0; i < n; i++)
                if (!(fabs((double)b[i] - (double)a[i]) <= swiglu_tol(g[i], a[i])) && bad++ < 3) {
                    fprintf(stderr, "  swiglu n %lld spread %g: value %lld (g %.9g)\n", (long long)n,
                            (double)spreads[si], (long long)i, (double)g[i]);
                    CHECK_NEAR(b[i], a[i], swiglu_tol(g[i], a[i]));
                }
            for (int with_w = 0; with_w < 2; with_w++) {
                kiri_cpu_rms_norm_row(g, with_w ? w : NULL, a, n, 1e-5f);
                k->rms_norm_row(g, with_w ? w : NULL, b, n, 1e-5f);
                for (int64_t i = 0; i < n; i++)
                    if (!(fabs((double)b[i] - (double)a[i]) <= rms_norm_tol(a[i])) && bad++ < 3) {
                        fprintf(stderr, "  rms_norm n %lld spread %g weights %d: value %lld\n", (long long)n,
                                (double)spreads[si], with_w, (long long)i);
                        CHECK_NEAR(b[i], a[i], rms_norm_tol(a[i]));
                    }
            }
            check_nan(b + n, 4);
            free(g);
            free(u);
            free(w);
            free(a);
            free(b);
        }
    const double worst = swiglu_sweep(k);
    double worst_geglu, worst_softcap;
    check_glu_caps(k, &worst_geglu, &worst_softcap);
    fprintf(stderr, "%s: swiglu (%zu lengths x %zu spreads), rms_norm, geglu, scale and softcap checked against "
                    "the reference (worst relative: swiglu sweep %.2g, geglu %.2g, softcap %.2g)\n",
            o->name, COUNT(lens), COUNT(spreads), worst, worst_geglu, worst_softcap);
    hand_over(o);
}

/* ---------------------------------------------------------------------------------------------
 * delta_head
 * ------------------------------------------------------------------------------------------- */

/* One head's state through three tokens of the gated delta rule, kernel and reference side by
 * side from the same random state: head sizes around the vector widths (12 and 20 are not
 * multiples of 8 and must match the reference exactly), up to Qwen3.5's 128. Outputs and states
 * within a few roundings of the dot products (1e-5 relative to the sum of the magnitudes of a
 * row's terms, plus 1e-6); the output's padding stays untouched. */
void ops_check_delta_head(struct ops_check *o)
{
    const struct kiri_cpu_kernels *k = o->k;
    CHECK(k->delta_head != NULL && k->delta_head != kiri_cpu_delta_head);
    if (!k->delta_head) {
        hand_over(o);
        return;
    }
    static const int64_t sizes[] = {8, 12, 16, 20, 64, 128};
    double worst = 0.0;
    for (size_t si = 0; si < COUNT(sizes); si++) {
        const int64_t n = sizes[si];
        float *a = random_floats((size_t)(n * n), 0.5f), *b = test_xmalloc((size_t)(n * n) * sizeof *b);
        memcpy(b, a, (size_t)(n * n) * sizeof *b);
        float *ya = nan_floats((size_t)n + 4), *yb = nan_floats((size_t)n + 4);
        int bad = 0;
        for (int t = 0; t < 3; t++) {
            float *q = random_floats((size_t)n, 0.3f), *kk = random_floats((size_t)n, 0.3f);
            float *v = random_floats((size_t)n, 1.0f);
            const float beta = 0.25f + 0.7f * (float)t / 3.0f, decay = 0.95f - 0.2f * (float)t;
            kiri_cpu_delta_head(a, q, kk, v, beta, decay, 0.125f, n, ya);
            k->delta_head(b, q, kk, v, beta, decay, 0.125f, n, yb);
            for (int64_t j = 0; j < n; j++) {
                double mag = 0.0;
                for (int64_t i = 0; i < n; i++)
                    mag += fabs((double)a[j * n + i]) * (fabs((double)q[i]) + fabs((double)kk[i]));
                const double tol = n % 8 ? 0.0 : 1e-5 * (mag + fabs((double)v[j])) + 1e-6;
                double err = fabs((double)yb[j] - (double)ya[j]);
                for (int64_t i = 0; i < n; i++) {
                    const double e = fabs((double)b[j * n + i] - (double)a[j * n + i]);
                    err = e > err ? e : err;
                }
                worst = err > worst ? err : worst;
                if (!(err <= tol) && bad++ < 3) {
                    fprintf(stderr, "  delta_head n %lld token %d: row %lld off by %.3g\n", (long long)n, t,
                            (long long)j, err);
                    CHECK(err <= tol);
                }
            }
            check_nan(yb + n, 4);
            free(q);
            free(kk);
            free(v);
        }
        free(a);
        free(b);
        free(ya);
        free(yb);
    }
    fprintf(stderr, "%s: delta_head (%zu head sizes x 3 tokens) checked against the reference (worst %.2g)\n",
            o->name, COUNT(sizes), worst);
    hand_over(o);
}

/* ---------------------------------------------------------------------------------------------
 * short_conv_row
 * ------------------------------------------------------------------------------------------- */

/* Three tokens through one state, kernel and reference side by side: tap counts from 1 to the
 * most (lfm2's 3, qwen35's 4), channel counts around the vector widths (the kernels hand what is
 * left over to the reference), with and without SiLU, strides wider than the run (the gaps must
 * stay untouched), inputs large enough on the last token to reach both tails of the sigmoid. The
 * state is copied, so it must match exactly; the sums are the reference's float operations in its
 * order, so without SiLU the outputs match exactly too, except on AArch64, where the compiler may
 * fuse the reference's multiply-adds (2^-22 of the sum of the terms' magnitudes). With SiLU the
 * kernels' sigmoid is within a few ulp of the reference's: 1e-6 of the terms' magnitudes plus of
 * the result. Prints the largest error seen. */
void ops_check_short_conv(struct ops_check *o)
{
    const struct kiri_cpu_kernels *k = o->k;
    CHECK(k->short_conv_row != NULL && k->short_conv_row != kiri_cpu_short_conv_row);
    if (!k->short_conv_row) {
        hand_over(o);
        return;
    }
    static const int64_t taps_list[] = {1, 2, 3, 4, 5, KIRI_SHORT_CONV_MAX_TAPS};
    static const int64_t widths[] = {1, 7, 8, 15, 16, 17, 33, 100};
#if defined(__aarch64__)
    const double plain_tol = 0x1p-22;
#else
    const double plain_tol = 0.0;
#endif
    double worst = 0.0;
    int cases = 0, bad = 0;
    for (size_t ti = 0; ti < COUNT(taps_list); ti++)
        for (size_t wi = 0; wi < COUNT(widths); wi++)
            for (int silu = 0; silu < 2; silu++) {
                const int64_t taps = taps_list[ti], n = widths[wi];
                const size_t ss = (size_t)n + 5, ws = (size_t)n + 3, sn = ss * (size_t)taps;
                float *w = random_floats(ws * (size_t)taps, 1.0f);
                float *sa = nan_floats(sn), *sb = nan_floats(sn);
                for (int64_t kk = 0; kk + 1 < taps; kk++)
                    for (int64_t c = 0; c < n; c++)
                        sa[(size_t)kk * ss + c] = sb[(size_t)kk * ss + c] = test_rand_sym() * 2.0f;
                for (int t = 0; t < 3; t++) {
                    float *x = random_floats((size_t)n, t == 2 ? 60.0f : 2.0f);
                    float *terms = test_xmalloc((size_t)n * sizeof *terms);
                    for (int64_t c = 0; c < n; c++) {
                        double m = fabs((double)x[c] * (double)w[(size_t)(taps - 1) * ws + c]);
                        for (int64_t kk = 0; kk + 1 < taps; kk++)
                            m += fabs((double)sa[(size_t)kk * ss + c] * (double)w[(size_t)kk * ws + c]);
                        terms[c] = (float)m;
                    }
                    float *ya = nan_floats((size_t)n + 4), *yb = nan_floats((size_t)n + 4);
                    kiri_cpu_short_conv_row(sa, ss, w, ws, taps, x, silu, n, ya);
                    k->short_conv_row(sb, ss, w, ws, taps, x, silu, n, yb);
                    for (int64_t c = 0; c < n; c++) {
                        const double err = fabs((double)yb[c] - (double)ya[c]);
                        const double tol = silu ? 1e-6 * ((double)terms[c] + fabs((double)ya[c])) + 1e-37
                                                : plain_tol * (double)terms[c];
                        worst = err > worst ? err : worst;
                        if (!(err <= tol) && bad++ < 3) {
                            fprintf(stderr,
                                    "  short_conv taps %lld n %lld silu %d token %d: channel %lld %.9g vs %.9g\n",
                                    (long long)taps, (long long)n, silu, t, (long long)c, (double)yb[c],
                                    (double)ya[c]);
                            CHECK(err <= tol);
                        }
                    }
                    check_nan(yb + n, 4);
                    CHECK(memcmp(sa, sb, sn * sizeof *sa) == 0); /* the state, gaps (NaN) included */
                    free(x);
                    free(terms);
                    free(ya);
                    free(yb);
                    cases++;
                }
                /* in place: y over x */
                float *x = random_floats((size_t)n, 3.0f), *ya = nan_floats((size_t)n);
                kiri_cpu_short_conv_row(sa, ss, w, ws, taps, x, silu, n, ya);
                k->short_conv_row(sb, ss, w, ws, taps, x, silu, n, x);
                for (int64_t c = 0; c < n; c++)
                    CHECK(fabs((double)x[c] - (double)ya[c]) <= 1e-5 * (fabs((double)ya[c]) + 1.0));
                CHECK(memcmp(sa, sb, sn * sizeof *sa) == 0);
                free(x);
                free(ya);
                free(w);
                free(sa);
                free(sb);
            }
    fprintf(stderr, "%s: short_conv_row (%d cases of a token) checked against the reference (worst %.2g)\n",
            o->name, cases, worst);
    hand_over(o);
}
