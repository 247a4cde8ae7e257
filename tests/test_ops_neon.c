/* Tests of the NEON row operations (kernels/neon/ops_neon.c) against the reference kernels of
 * ops.c on random inputs: one attention head, groups of 1 to 16 heads sharing a key/value head,
 * and tiles of a prompt's tokens times heads, over F16 and F32 caches (and a Q8_0 cache, which
 * goes to the reference), for head sizes that are and are not multiples of 4, 8 and 64 (and above
 * 256, where groups and tiles go one head at a time), key counts around the kernel's groups of 4
 * and 8, scattered cache slots, score ranges whose softmax underflows, and later tokens' keys and
 * values holding NaN; then SwiGLU (gates far into both tails, and a sweep over the whole range of
 * the kernel's exp) and RMS norm rows with and without weights.
 *
 * Tolerance: the attention outputs are weighted means of value rows with |v| <= 1. The kernels sum
 * in another order and use their own exp (within 2 ulp), so a weight rounded to F16 may land one
 * F16 step away from the reference's: 2^-11 (4.9e-4) for a weight in [0.5, 1). For F16 caches that
 * gives 5e-4 absolute, more than test_ops_avx2.c's 2e-4, which one such flip already exceeds (one
 * seen while writing this test: a weight of 0.40344289, 5e-7 above the midpoint of two F16
 * values, moved a result by 2.4e-4); without a flip the error stays near 1e-5. For F32 caches
 * 1e-5 (weights are not rounded). A wrong key or weight is off by far more, and the cases with
 * equal keys (see same_keys) must match exactly. Cases the kernels hand to the reference (Q8_0,
 * head sizes not a multiple of 4) must match it exactly too. Each test prints the largest error
 * it saw. The kernels may use only the scratch their contract grants: the floats after it must
 * stay as they were.
 *
 * Only built as a test on aarch64 (under qemu-aarch64 when cross-compiled). Elsewhere the program
 * says so and exits 0. */
#if !defined(__aarch64__)
#include <stdio.h>

int main(void)
{
    printf("test_ops_neon: not aarch64\n");
    return 0;
}
#else

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/neon/neon_kernels.h"
#define TEST_RNG_SEED 0x5851F42D4C957F2Dull
#include "test.h"

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

/* Floats written after a scratch area, which the kernels must leave alone. */
#define GUARD 64
#define GUARD_VALUE 12345.0f

static struct kiri_cpu_kernels neon_table(void)
{
    struct kiri_cpu_kernels k;
    kiri_cpu_kernels_init_ref(&k);
    kiri_cpu_kernels_init_ops_neon(&k);
    return k;
}

/* Fills n_slots cache rows of type kv_type (head_dim values each) with random values. */
static void fill_cache(void *cache, int kv_type, int n_slots, int head_dim, size_t stride)
{
    float *row = test_xmalloc((size_t)head_dim * sizeof *row);
    for (int s = 0; s < n_slots; s++) {
        for (int i = 0; i < head_dim; i++)
            row[i] = test_rand_sym();
        CHECK(kiri_cpu_quantize_row(kv_type, row, (char *)cache + (size_t)s * stride, head_dim) > 0);
    }
    free(row);
}

/* Bytes of one cache row. */
static size_t row_size(int kv_type, int d)
{
    return (size_t)(d / kiri_type_block_size(kv_type)) * kiri_type_size(kv_type);
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

/* Makes every key row a copy of the first. All scores are then equal whatever order their sums
 * take, every weight is exactly 1/n_kv before rounding, and with an F16 cache every product of an
 * F16 weight and an F16 value is exact, so the kernels must give the reference's bits: this is
 * where a weight left unrounded (an error below the tolerance above) shows. */
static void same_keys(void *cache, int n_slots, size_t row, size_t stride)
{
    for (int s = 1; s < n_slots; s++)
        memcpy((char *)cache + (size_t)s * stride, cache, row);
}

static double tolerance(int kv_type, int d, int same)
{
    if (d % 4 != 0 || kv_type == KIRI_TYPE_Q8_0 || (same && kv_type == KIRI_TYPE_F16))
        return 0.0; /* the reference itself, or exact (see same_keys) */
    return kv_type == KIRI_TYPE_F32 ? 1e-5 : 5e-4;
}

/* The largest attention error seen, by cache type (F32 and F16), for the test's summary line. */
static double worst_f32, worst_f16;

static void note_error(int kv_type, float got, float want)
{
    const double e = fabs((double)got - (double)want);
    if (kv_type == KIRI_TYPE_F32)
        worst_f32 = e > worst_f32 ? e : worst_f32;
    else if (kv_type == KIRI_TYPE_F16)
        worst_f16 = e > worst_f16 ? e : worst_f16;
}

/* ---------------------------------------------------------------------------------------------
 * One head
 * ------------------------------------------------------------------------------------------- */

struct attn_case {
    int kv_type, head_dim, n_kv;
    float q_scale; /* large values give scores far apart: most weights underflow */
    int same_keys; /* every key row equal: see same_keys() */
};

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

static void test_attend_head(void)
{
    const struct kiri_cpu_kernels fast = neon_table();
    worst_f32 = worst_f16 = 0.0;
    CHECK(fast.attend_head != NULL && fast.attend_head != kiri_cpu_attend_head);
    if (!fast.attend_head)
        return;
    for (size_t c = 0; c < sizeof attn_cases / sizeof attn_cases[0]; c++) {
        const struct attn_case *tc = &attn_cases[c];
        const int d = tc->head_dim, n_slots = tc->n_kv + 11;
        const size_t stride = row_size(tc->kv_type, d) + 32; /* rows of other heads sit between */
        void *kc = test_xmalloc(stride * (size_t)n_slots), *vc = test_xmalloc(stride * (size_t)n_slots);
        fill_cache(kc, tc->kv_type, n_slots, d, stride);
        fill_cache(vc, tc->kv_type, n_slots, d, stride);
        if (tc->same_keys)
            same_keys(kc, n_slots, row_size(tc->kv_type, d), stride);
        int32_t *slots = test_xmalloc((size_t)tc->n_kv * sizeof *slots);
        for (int j = 0; j < tc->n_kv; j++) /* distinct (n_slots is not a multiple of 7), scattered */
            slots[j] = (int32_t)((j * 7 + 3) % n_slots);
        float *q = test_xmalloc((size_t)d * sizeof *q);
        for (int i = 0; i < d; i++)
            q[i] = test_rand_sym() * tc->q_scale;
        float *s_ref = test_xmalloc((size_t)tc->n_kv * sizeof(float)), *s_fast = scratch_alloc((size_t)tc->n_kv);
        float *o_ref = test_xmalloc((size_t)d * sizeof(float)), *o_fast = test_xmalloc((size_t)(d + 4) * sizeof(float));
        for (int i = 0; i < d + 4; i++)
            o_fast[i] = NAN;
        const float scale = 1.0f / sqrtf((float)d);
        kiri_cpu_attend_head(q, kc, stride, vc, stride, tc->kv_type, slots, tc->n_kv, d, scale, s_ref, o_ref);
        fast.attend_head(q, kc, stride, vc, stride, tc->kv_type, slots, tc->n_kv, d, scale, s_fast, o_fast);
        const double tol = tolerance(tc->kv_type, d, tc->same_keys);
        int bad = 0;
        for (int i = 0; i < d; i++)
            note_error(tc->kv_type, o_fast[i], o_ref[i]);
        for (int i = 0; i < d; i++)
            if (!(fabs((double)o_fast[i] - (double)o_ref[i]) <= tol) && bad++ < 3) {
                fprintf(stderr, "  case %zu (%s, d %d, n_kv %d): value %d\n", c,
                        kiri_type_name(tc->kv_type), d, tc->n_kv, i);
                CHECK_NEAR(o_fast[i], o_ref[i], tol);
            }
        for (int i = d; i < d + 4; i++)
            CHECK(isnan(o_fast[i]));
        CHECK(guard_intact(s_fast, (size_t)tc->n_kv));
        free(kc);
        free(vc);
        free(slots);
        free(q);
        free(s_ref);
        free(s_fast);
        free(o_ref);
        free(o_fast);
    }
    fprintf(stderr, "test_attend_head: %zu cases checked against the reference (largest error F16 %.2g, F32 %.2g)\n",
            sizeof attn_cases / sizeof attn_cases[0], worst_f16, worst_f32);
}

/* ---------------------------------------------------------------------------------------------
 * Groups of heads
 * ------------------------------------------------------------------------------------------- */

struct group_case {
    int kv_type, head_dim, n_kv;
    float q_scale;
    int same_keys;
};

/* Each case runs with every group size from 1 to 16. */
static const struct group_case group_cases[] = {
    {KIRI_TYPE_F16, 64, 1, 1.0f, 0},    {KIRI_TYPE_F16, 64, 37, 1.0f, 0},   {KIRI_TYPE_F16, 64, 300, 30.f, 0},
    {KIRI_TYPE_F16, 128, 50, 1.0f, 0},  {KIRI_TYPE_F16, 256, 9, 1.0f, 0},   {KIRI_TYPE_F16, 72, 12, 1.0f, 0},
    {KIRI_TYPE_F16, 8, 20, 1.0f, 0},    {KIRI_TYPE_F16, 12, 6, 1.0f, 0},    {KIRI_TYPE_F16, 260, 5, 1.0f, 0},
    {KIRI_TYPE_F16, 6, 4, 1.0f, 0},     {KIRI_TYPE_F32, 64, 130, 1.0f, 0},  {KIRI_TYPE_F32, 96, 7, 2.0f, 0},
    {KIRI_TYPE_F32, 20, 3, 1.0f, 0},    {KIRI_TYPE_Q8_0, 64, 40, 1.0f, 0},  {KIRI_TYPE_F16, 64, 7, 1.0f, 1},
    {KIRI_TYPE_F16, 72, 13, 1.0f, 1},
};

/* Every head of a group against the reference one head at a time; the output rows' padding must
 * stay untouched and the scratch stay within its 8 floats per key. */
static void test_attend_group(void)
{
    const struct kiri_cpu_kernels fast = neon_table();
    worst_f32 = worst_f16 = 0.0;
    CHECK(fast.attend_group != NULL);
    if (!fast.attend_group)
        return;
    int runs = 0;
    for (size_t c = 0; c < sizeof group_cases / sizeof group_cases[0]; c++) {
        const struct group_case *tc = &group_cases[c];
        const int d = tc->head_dim, n_slots = tc->n_kv + 5;
        const size_t stride = row_size(tc->kv_type, d) * 3; /* two other key/value heads between rows */
        void *kc = test_xmalloc(stride * (size_t)n_slots), *vc = test_xmalloc(stride * (size_t)n_slots);
        fill_cache(kc, tc->kv_type, n_slots, d, stride);
        fill_cache(vc, tc->kv_type, n_slots, d, stride);
        if (tc->same_keys)
            same_keys(kc, n_slots, row_size(tc->kv_type, d), stride);
        int32_t *slots = test_xmalloc((size_t)tc->n_kv * sizeof *slots);
        for (int j = 0; j < tc->n_kv; j++)
            slots[j] = (int32_t)((j * 3 + 1) % n_slots);
        float *s_ref = test_xmalloc((size_t)tc->n_kv * sizeof(float)), *o_ref = test_xmalloc((size_t)d * sizeof(float));
        const float scale = 1.0f / sqrtf((float)d);
        const double tol = tolerance(tc->kv_type, d, tc->same_keys);
        for (int n_q = 1; n_q <= 16; n_q++, runs++) {
            const size_t q_stride = (size_t)d + 8, out_stride = (size_t)d + 16;
            float *q = test_xmalloc(q_stride * (size_t)n_q * sizeof *q);
            for (size_t i = 0; i < q_stride * (size_t)n_q; i++)
                q[i] = test_rand_sym() * tc->q_scale;
            float *out = test_xmalloc(out_stride * (size_t)n_q * sizeof *out);
            for (size_t i = 0; i < out_stride * (size_t)n_q; i++)
                out[i] = NAN;
            float *scratch = scratch_alloc((size_t)tc->n_kv * 8);
            fast.attend_group(q, q_stride, n_q, kc, stride, vc, stride, tc->kv_type, slots, tc->n_kv, d, scale,
                              scratch, out, out_stride);
            int bad = 0;
            for (int h = 0; h < n_q; h++) {
                kiri_cpu_attend_head(q + (size_t)h * q_stride, kc, stride, vc, stride, tc->kv_type, slots, tc->n_kv,
                                     d, scale, s_ref, o_ref);
                for (int i = 0; i < d; i++) {
                    const float got = out[(size_t)h * out_stride + (size_t)i];
                    note_error(tc->kv_type, got, o_ref[i]);
                    if (!(fabs((double)got - (double)o_ref[i]) <= tol) && bad++ < 3) {
                        fprintf(stderr, "  group case %zu (%s, d %d, n_kv %d, n_q %d): head %d value %d\n", c,
                                kiri_type_name(tc->kv_type), d, tc->n_kv, n_q, h, i);
                        CHECK_NEAR(got, o_ref[i], tol);
                    }
                }
                for (size_t i = (size_t)d; i < out_stride; i++)
                    CHECK(isnan(out[(size_t)h * out_stride + i]));
            }
            CHECK(guard_intact(scratch, (size_t)tc->n_kv * 8));
            free(q);
            free(out);
            free(scratch);
        }
        free(kc);
        free(vc);
        free(slots);
        free(s_ref);
        free(o_ref);
    }
    fprintf(stderr, "test_attend_group: %d groups (%zu cases x 1..16 heads) checked against the reference "
                    "(largest error F16 %.2g, F32 %.2g)\n",
            runs, sizeof group_cases / sizeof group_cases[0], worst_f16, worst_f32);
}

/* ---------------------------------------------------------------------------------------------
 * Tiles of tokens times heads
 * ------------------------------------------------------------------------------------------- */

struct tile_case {
    int kv_type, head_dim, n_t, n_q, n_kv0; /* token i sees n_kv0 + i keys */
    float q_scale;
    int same_keys;
};

static const struct tile_case tile_cases[] = {
    {KIRI_TYPE_F16, 64, 5, 3, 1, 1.0f, 0},     {KIRI_TYPE_F16, 64, 5, 3, 300, 1.0f, 0},
    {KIRI_TYPE_F16, 64, 2, 8, 37, 1.0f, 0},    {KIRI_TYPE_F16, 64, 4, 4, 9, 30.f, 0},
    {KIRI_TYPE_F16, 128, 2, 7, 50, 1.0f, 0},   {KIRI_TYPE_F16, 256, 1, 16, 20, 1.0f, 0},
    {KIRI_TYPE_F16, 64, 16, 1, 3, 1.0f, 0},    {KIRI_TYPE_F16, 64, 3, 5, 0, 1.0f, 0},
    {KIRI_TYPE_F16, 72, 3, 3, 12, 1.0f, 0},    {KIRI_TYPE_F16, 8, 16, 1, 1, 1.0f, 0},
    {KIRI_TYPE_F16, 8, 8, 2, 0, 1.0f, 0},      {KIRI_TYPE_F16, 12, 7, 2, 4, 1.0f, 0},
    {KIRI_TYPE_F16, 64, 1, 1, 8, 1.0f, 0},     {KIRI_TYPE_F16, 64, 2, 1, 7, 1.0f, 0},
    {KIRI_TYPE_F16, 64, 3, 2, 5, 1.0f, 0},     {KIRI_TYPE_F16, 64, 6, 2, 2, 1.0f, 0},
    {KIRI_TYPE_F16, 64, 13, 1, 0, 1.0f, 0},    {KIRI_TYPE_F16, 260, 3, 2, 6, 1.0f, 0},
    {KIRI_TYPE_F16, 6, 4, 2, 3, 1.0f, 0},      {KIRI_TYPE_F32, 64, 5, 3, 130, 1.0f, 0},
    {KIRI_TYPE_F32, 96, 2, 6, 7, 2.0f, 0},     {KIRI_TYPE_F32, 20, 9, 1, 1, 1.0f, 0},
    {KIRI_TYPE_Q8_0, 64, 4, 4, 40, 1.0f, 0},   {KIRI_TYPE_F16, 64, 3, 5, 2, 1.0f, 1},
    {KIRI_TYPE_F16, 8, 16, 1, 1, 1.0f, 1},     {KIRI_TYPE_F16, 12, 7, 2, 4, 1.0f, 1},
};

/* Runs of tokens times heads against the reference one (token, head) at a time, token i seeing
 * n_kv0 + i keys (a prompt's causal mask; n_kv0 = 0 gives a first token that sees nothing). The
 * key and value only the last token sees hold NaN and infinities: an earlier token's result must
 * not depend on them. Output padding stays untouched, the scratch within its 16 floats per key. */
static void test_attend_tile(void)
{
    const struct kiri_cpu_kernels fast = neon_table();
    worst_f32 = worst_f16 = 0.0;
    CHECK(fast.attend_tile != NULL);
    if (!fast.attend_tile)
        return;
    for (size_t c = 0; c < sizeof tile_cases / sizeof tile_cases[0]; c++) {
        const struct tile_case *tc = &tile_cases[c];
        const int d = tc->head_dim, n_max = tc->n_kv0 + tc->n_t - 1;
        int n_slots = n_max + 5;
        while (n_slots % 7 == 0) /* slots below are distinct */
            n_slots++;
        CHECK(tc->n_t * tc->n_q <= KIRI_ATTEND_TILE_ROWS);
        const size_t stride = row_size(tc->kv_type, d) * 2;
        void *kc = test_xmalloc(stride * (size_t)n_slots), *vc = test_xmalloc(stride * (size_t)n_slots);
        fill_cache(kc, tc->kv_type, n_slots, d, stride);
        fill_cache(vc, tc->kv_type, n_slots, d, stride);
        if (tc->same_keys)
            same_keys(kc, n_slots, row_size(tc->kv_type, d), stride);
        int32_t *slots = test_xmalloc((size_t)(n_max > 0 ? n_max : 1) * sizeof *slots);
        for (int j = 0; j < n_max; j++)
            slots[j] = (int32_t)((j * 7 + 2) % n_slots);
        int32_t n_kv[KIRI_ATTEND_TILE_ROWS];
        for (int i = 0; i < tc->n_t; i++)
            n_kv[i] = tc->n_kv0 + i;
        const size_t q_head = (size_t)d + 8, q_tok = q_head * (size_t)tc->n_q + 24;
        const size_t out_head = (size_t)d + 16, out_tok = out_head * (size_t)tc->n_q + 8;
        float *q = test_xmalloc(q_tok * (size_t)tc->n_t * sizeof *q);
        for (size_t i = 0; i < q_tok * (size_t)tc->n_t; i++)
            q[i] = test_rand_sym() * tc->q_scale;
        float *out = test_xmalloc(out_tok * (size_t)tc->n_t * sizeof *out);
        for (size_t i = 0; i < out_tok * (size_t)tc->n_t; i++)
            out[i] = NAN;
        const size_t n_scratch = (size_t)(n_max > 0 ? n_max : 1) * KIRI_ATTEND_TILE_ROWS;
        float *scratch = scratch_alloc(n_scratch);
        float *s_ref = test_xmalloc((size_t)(n_max > 0 ? n_max : 1) * sizeof(float));
        float **o_ref = test_xmalloc((size_t)tc->n_t * (size_t)tc->n_q * sizeof *o_ref);
        const float scale = 1.0f / sqrtf((float)d);
        /* The reference first, on clean keys and values; then the key and value of the last
         * token's last key turn into NaN and infinity, which only that token sees. */
        for (int r = 0; r < tc->n_t * tc->n_q; r++) {
            o_ref[r] = test_xmalloc((size_t)d * sizeof(float));
            kiri_cpu_attend_head(q + (size_t)(r / tc->n_q) * q_tok + (size_t)(r % tc->n_q) * q_head, kc, stride, vc,
                                 stride, tc->kv_type, slots, n_kv[r / tc->n_q], d, scale, s_ref, o_ref[r]);
        }
        const int poisoned = tc->n_t > 1 && tc->kv_type != KIRI_TYPE_Q8_0;
        if (poisoned) {
            char *kr = (char *)kc + (size_t)slots[n_max - 1] * stride, *vr = (char *)vc + (size_t)slots[n_max - 1] * stride;
            float *bad = test_xmalloc((size_t)d * sizeof *bad);
            for (int i = 0; i < d; i++)
                bad[i] = i % 2 ? NAN : INFINITY;
            CHECK(kiri_cpu_quantize_row(tc->kv_type, bad, kr, d) > 0);
            CHECK(kiri_cpu_quantize_row(tc->kv_type, bad, vr, d) > 0);
            free(bad);
        }
        fast.attend_tile(q, q_tok, q_head, tc->n_t, tc->n_q, kc, stride, vc, stride, tc->kv_type, slots, n_kv, d,
                         scale, scratch, out, out_tok, out_head);
        const double tol = tolerance(tc->kv_type, d, tc->same_keys);
        int bad = 0;
        for (int r = 0; r < tc->n_t * tc->n_q; r++) {
            const int i_t = r / tc->n_q, h = r % tc->n_q;
            const float *o = out + (size_t)i_t * out_tok + (size_t)h * out_head;
            if (poisoned && i_t == tc->n_t - 1)
                continue; /* sees the poisoned key: no reference to compare with */
            for (int i = 0; i < d; i++)
                note_error(tc->kv_type, o[i], o_ref[r][i]);
            for (int i = 0; i < d; i++)
                if (!(fabs((double)o[i] - (double)o_ref[r][i]) <= tol) && bad++ < 3) {
                    fprintf(stderr, "  tile case %zu (%s, d %d, %d tokens x %d heads, n_kv0 %d): token %d head %d value %d\n",
                            c, kiri_type_name(tc->kv_type), d, tc->n_t, tc->n_q, tc->n_kv0, i_t, h, i);
                    CHECK_NEAR(o[i], o_ref[r][i], tol);
                }
            for (size_t i = (size_t)d; i < out_head; i++)
                CHECK(isnan(o[i]));
        }
        CHECK(guard_intact(scratch, n_scratch));
        for (int r = 0; r < tc->n_t * tc->n_q; r++)
            free(o_ref[r]);
        free(o_ref);
        free(kc);
        free(vc);
        free(slots);
        free(q);
        free(out);
        free(scratch);
        free(s_ref);
    }
    fprintf(stderr, "test_attend_tile: %zu cases checked against the reference (largest error F16 %.2g, F32 %.2g)\n",
            sizeof tile_cases / sizeof tile_cases[0], worst_f16, worst_f32);
}

/* ---------------------------------------------------------------------------------------------
 * Element-wise rows
 * ------------------------------------------------------------------------------------------- */

/* A few ulp of silu(g) u; where e^g is below the smallest normal float (g < -87.3) the kernel's
 * exp flushes to 0, leaving results under 1e-35 instead of tiny values. */
static int swiglu_close(float got, float want)
{
    return fabs((double)got - (double)want) <= 4e-7 * fabs((double)want) + 1e-35;
}

/* SwiGLU and RMS norm rows against the reference, including lengths that are not multiples of 4,
 * gates far into both tails of the sigmoid, and a norm without weights; then SwiGLU over evenly
 * spaced gates from -100 to 100, which walks the kernel's exp over its whole range. */
static void test_rows(void)
{
    const struct kiri_cpu_kernels fast = neon_table();
    CHECK(fast.swiglu_row != NULL && fast.swiglu_row != kiri_cpu_swiglu_row);
    CHECK(fast.rms_norm_row != NULL && fast.rms_norm_row != kiri_cpu_rms_norm_row);
    if (!fast.swiglu_row || !fast.rms_norm_row)
        return;
    static const int64_t lens[] = {1, 3, 4, 5, 7, 8, 29, 2048, 5632};
    static const float spreads[] = {1.0f, 30.0f, 200.0f};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t si = 0; si < sizeof spreads / sizeof spreads[0]; si++) {
            const int64_t n = lens[li];
            float *g = test_xmalloc((size_t)n * sizeof *g), *u = test_xmalloc((size_t)n * sizeof *u);
            float *w = test_xmalloc((size_t)n * sizeof *w);
            float *a = test_xmalloc((size_t)n * sizeof *a), *b = test_xmalloc((size_t)(n + 4) * sizeof *b);
            for (int64_t i = 0; i < n; i++) {
                g[i] = test_rand_sym() * spreads[si];
                u[i] = test_rand_sym();
                w[i] = test_rand_sym() * 2.0f;
            }
            for (int64_t i = 0; i < n + 4; i++)
                b[i] = NAN;
            kiri_cpu_swiglu_row(g, u, a, n);
            fast.swiglu_row(g, u, b, n);
            int bad = 0;
            for (int64_t i = 0; i < n; i++)
                if (!swiglu_close(b[i], a[i]) && bad++ < 3) {
                    fprintf(stderr, "  swiglu n %lld spread %g: value %lld (g %.9g)\n", (long long)n,
                            (double)spreads[si], (long long)i, (double)g[i]);
                    CHECK_NEAR(b[i], a[i], 4e-7 * fabs((double)a[i]) + 1e-35);
                }
            for (int with_w = 0; with_w < 2; with_w++) {
                kiri_cpu_rms_norm_row(g, with_w ? w : NULL, a, n, 1e-5f);
                fast.rms_norm_row(g, with_w ? w : NULL, b, n, 1e-5f);
                for (int64_t i = 0; i < n; i++) /* the same scale up to its last bit */
                    if (!(fabs((double)a[i] - (double)b[i]) <= 2.5e-7 * fabs((double)a[i])) && bad++ < 3) {
                        fprintf(stderr, "  rms_norm n %lld spread %g weights %d: value %lld\n", (long long)n,
                                (double)spreads[si], with_w, (long long)i);
                        CHECK_NEAR(b[i], a[i], 2.5e-7 * fabs((double)a[i]));
                    }
            }
            for (int64_t i = n; i < n + 4; i++)
                CHECK(isnan(b[i]));
            free(g);
            free(u);
            free(w);
            free(a);
            free(b);
        }

    enum { N_SWEEP = 200001 };
    float *g = test_xmalloc(N_SWEEP * sizeof *g), *u = test_xmalloc(N_SWEEP * sizeof *u);
    float *a = test_xmalloc(N_SWEEP * sizeof *a), *b = test_xmalloc(N_SWEEP * sizeof *b);
    for (int i = 0; i < N_SWEEP; i++) {
        g[i] = -100.0f + 200.0f * (float)i / (float)(N_SWEEP - 1);
        u[i] = 1.0f;
    }
    kiri_cpu_swiglu_row(g, u, a, N_SWEEP);
    fast.swiglu_row(g, u, b, N_SWEEP);
    double worst = 0.0;
    int bad = 0;
    for (int i = 0; i < N_SWEEP; i++) {
        if (fabs((double)a[i]) > 1e-30)
            worst = fmax(worst, fabs((double)b[i] - (double)a[i]) / fabs((double)a[i]));
        if (!swiglu_close(b[i], a[i]) && bad++ < 3) {
            fprintf(stderr, "  swiglu sweep: g %.9g\n", (double)g[i]);
            CHECK_NEAR(b[i], a[i], 4e-7 * fabs((double)a[i]) + 1e-35);
        }
    }
    free(g);
    free(u);
    free(a);
    free(b);
    fprintf(stderr, "test_rows: swiglu and rms_norm checked against the reference (swiglu sweep: worst %.2g relative)\n",
            worst);
}

TEST_MAIN(test_attend_head, test_attend_group, test_attend_tile, test_rows)

#endif
