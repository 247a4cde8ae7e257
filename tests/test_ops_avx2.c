/* Tests of the AVX2 row operations (kernels/cpu/ops_avx2.c) against the reference kernels of
 * ops.c on random inputs: one attention head, and groups of heads sharing a key/value head, over
 * F16 and F32 caches (and a Q8_0 cache, which goes to the reference), for head sizes that are and
 * are not multiples of 16 and 64, key counts around the kernel's groups of 4 and 8, group sizes
 * around 4 and 8, scattered cache slots, and score ranges whose softmax underflows.
 *
 * Tolerance: the outputs are weighted means of value rows with |v| <= 1. The kernels sum in
 * another order and use their own exp (within 2 ulp), so a weight rounded to F16 may land one
 * F16 step away, which for a weight in [0.5, 1) is 2^-11 = 4.9e-4: 5e-4 absolute for F16 caches
 * (the NEON kernels' test met such a flip at 2.4e-4), 1e-5 for F32 (observed 1e-6). A wrong key
 * or weight is off by far more. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "../runtime/platform.h"
#define ATTN_TOL_F16 5e-4 /* see above */
#define TEST_RNG_SEED 0x853C49E6748FEA9Bull
#include "test.h"


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

#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
/* The reference table with the AVX2 row operations on top, or 0 (after saying so) when this CPU
 * cannot run them. */
static int avx2_table(const char *test, struct kiri_cpu_kernels *k)
{
    if (!(kiri_platform_cpu_features() & KIRI_CPU_AVX2)) {
        fprintf(stderr, "%s: SKIPPED: this CPU lacks AVX2, FMA or F16C\n", test);
        return 0;
    }
    kiri_cpu_kernels_init_ref(k);
    kiri_cpu_kernels_init_ops_avx2(k);
    return 1;
}
#endif

struct attn_case {
    int kv_type, head_dim, n_kv;
    float q_scale; /* large values give scores far apart: most weights underflow */
};

static const struct attn_case attn_cases[] = {
    {KIRI_TYPE_F16, 64, 1, 1.0f},    {KIRI_TYPE_F16, 64, 3, 1.0f},   {KIRI_TYPE_F16, 64, 4, 1.0f},
    {KIRI_TYPE_F16, 64, 7, 1.0f},    {KIRI_TYPE_F16, 64, 9, 1.0f},   {KIRI_TYPE_F16, 64, 33, 1.0f},
    {KIRI_TYPE_F16, 64, 300, 1.0f},  {KIRI_TYPE_F16, 64, 300, 40.f}, {KIRI_TYPE_F16, 128, 77, 1.0f},
    {KIRI_TYPE_F16, 72, 16, 1.0f},   {KIRI_TYPE_F16, 8, 5, 1.0f},    {KIRI_TYPE_F32, 64, 1, 1.0f},
    {KIRI_TYPE_F32, 64, 10, 1.0f},   {KIRI_TYPE_F32, 64, 513, 3.0f}, {KIRI_TYPE_F32, 136, 20, 1.0f},
    {KIRI_TYPE_Q8_0, 64, 50, 1.0f},
};

static void test_attend_head(void)
{
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    struct kiri_cpu_kernels fast;
    if (!avx2_table(__func__, &fast))
        return;
    CHECK(fast.attend_head != NULL);
    if (!fast.attend_head)
        return;
    for (size_t c = 0; c < sizeof attn_cases / sizeof attn_cases[0]; c++) {
        const struct attn_case *tc = &attn_cases[c];
        const int d = tc->head_dim, n_slots = tc->n_kv + 11;
        const size_t row = (size_t)(d / kiri_type_block_size(tc->kv_type)) * kiri_type_size(tc->kv_type);
        const size_t stride = row + 32; /* rows of other heads sit between */
        void *kc = test_xmalloc(stride * (size_t)n_slots), *vc = test_xmalloc(stride * (size_t)n_slots);
        fill_cache(kc, tc->kv_type, n_slots, d, stride);
        fill_cache(vc, tc->kv_type, n_slots, d, stride);
        int32_t *slots = test_xmalloc((size_t)tc->n_kv * sizeof *slots);
        for (int j = 0; j < tc->n_kv; j++) /* distinct, scattered */
            slots[j] = (int32_t)((j * 7 + 3) % n_slots);
        float *q = test_xmalloc((size_t)d * sizeof *q);
        for (int i = 0; i < d; i++)
            q[i] = test_rand_sym() * tc->q_scale;
        float *s_ref = test_xmalloc((size_t)tc->n_kv * sizeof(float)), *s_fast = test_xmalloc((size_t)tc->n_kv * sizeof(float));
        float *o_ref = test_xmalloc((size_t)d * sizeof(float)), *o_fast = test_xmalloc((size_t)d * sizeof(float));
        const float scale = 1.0f / sqrtf((float)d);
        kiri_cpu_attend_head(q, kc, stride, vc, stride, tc->kv_type, slots, tc->n_kv, d, scale, s_ref, o_ref);
        fast.attend_head(q, kc, stride, vc, stride, tc->kv_type, slots, tc->n_kv, d, scale, s_fast, o_fast);
        const double tol = tc->kv_type == KIRI_TYPE_F32 ? 1e-5 : tc->kv_type == KIRI_TYPE_F16 ? ATTN_TOL_F16 : 0.0;
        int bad = 0;
        for (int i = 0; i < d; i++)
            if (!(fabs((double)o_fast[i] - (double)o_ref[i]) <= tol) && bad++ < 3) {
                fprintf(stderr, "  case %zu (%s, d %d, n_kv %d): value %d\n", c,
                        kiri_type_name(tc->kv_type), d, tc->n_kv, i);
                CHECK_NEAR(o_fast[i], o_ref[i], tol);
            }
        free(kc);
        free(vc);
        free(slots);
        free(q);
        free(s_ref);
        free(s_fast);
        free(o_ref);
        free(o_fast);
    }
    fprintf(stderr, "test_attend_head: %zu cases checked against the reference\n",
            sizeof attn_cases / sizeof attn_cases[0]);
#else
    fprintf(stderr, "test_attend_head: SKIPPED: no AVX2 kernels in this build\n");
#endif
}

struct group_case {
    int kv_type, head_dim, n_kv, n_q;
    float q_scale;
};

static const struct group_case group_cases[] = {
    {KIRI_TYPE_F16, 64, 1, 8, 1.0f},   {KIRI_TYPE_F16, 64, 37, 8, 1.0f},  {KIRI_TYPE_F16, 64, 300, 8, 30.f},
    {KIRI_TYPE_F16, 64, 20, 4, 1.0f},  {KIRI_TYPE_F16, 64, 20, 5, 1.0f},  {KIRI_TYPE_F16, 64, 20, 3, 1.0f},
    {KIRI_TYPE_F16, 128, 50, 14, 1.0f}, {KIRI_TYPE_F16, 256, 9, 9, 1.0f}, {KIRI_TYPE_F16, 72, 12, 8, 1.0f},
    {KIRI_TYPE_F32, 64, 130, 8, 1.0f}, {KIRI_TYPE_F32, 96, 7, 6, 2.0f},   {KIRI_TYPE_Q8_0, 64, 40, 8, 1.0f},
};

/* Every head of a group against the reference one head at a time; the output rows' padding must
 * stay untouched. */
static void test_attend_group(void)
{
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    struct kiri_cpu_kernels fast;
    if (!avx2_table(__func__, &fast))
        return;
    CHECK(fast.attend_group != NULL);
    if (!fast.attend_group)
        return;
    for (size_t c = 0; c < sizeof group_cases / sizeof group_cases[0]; c++) {
        const struct group_case *tc = &group_cases[c];
        const int d = tc->head_dim, n_slots = tc->n_kv + 5;
        const size_t row = (size_t)(d / kiri_type_block_size(tc->kv_type)) * kiri_type_size(tc->kv_type);
        const size_t stride = row * 3; /* two other key/value heads between rows */
        const size_t q_stride = (size_t)d + 8, out_stride = (size_t)d + 16;
        void *kc = test_xmalloc(stride * (size_t)n_slots), *vc = test_xmalloc(stride * (size_t)n_slots);
        fill_cache(kc, tc->kv_type, n_slots, d, stride);
        fill_cache(vc, tc->kv_type, n_slots, d, stride);
        int32_t *slots = test_xmalloc((size_t)tc->n_kv * sizeof *slots);
        for (int j = 0; j < tc->n_kv; j++)
            slots[j] = (int32_t)((j * 3 + 1) % n_slots);
        float *q = test_xmalloc(q_stride * (size_t)tc->n_q * sizeof *q);
        for (size_t i = 0; i < q_stride * (size_t)tc->n_q; i++)
            q[i] = test_rand_sym() * tc->q_scale;
        float *out = test_xmalloc(out_stride * (size_t)tc->n_q * sizeof *out);
        for (size_t i = 0; i < out_stride * (size_t)tc->n_q; i++)
            out[i] = NAN;
        float *scratch = test_xmalloc((size_t)tc->n_kv * KIRI_ATTEND_TILE_ROWS * sizeof(float));
        float *s_ref = test_xmalloc((size_t)tc->n_kv * sizeof(float)), *o_ref = test_xmalloc((size_t)d * sizeof(float));
        const float scale = 1.0f / sqrtf((float)d);
        fast.attend_group(q, q_stride, tc->n_q, kc, stride, vc, stride, tc->kv_type, slots, tc->n_kv, d, scale,
                          scratch, out, out_stride);
        const double tol = tc->kv_type == KIRI_TYPE_F32 ? 1e-5 : tc->kv_type == KIRI_TYPE_F16 ? ATTN_TOL_F16 : 0.0;
        int bad = 0;
        for (int h = 0; h < tc->n_q; h++) {
            kiri_cpu_attend_head(q + (size_t)h * q_stride, kc, stride, vc, stride, tc->kv_type, slots, tc->n_kv, d,
                                 scale, s_ref, o_ref);
            for (int i = 0; i < d; i++) {
                const float got = out[(size_t)h * out_stride + (size_t)i];
                if (!(fabs((double)got - (double)o_ref[i]) <= tol) && bad++ < 3) {
                    fprintf(stderr, "  group case %zu (%s, d %d, n_kv %d, n_q %d): head %d value %d\n", c,
                            kiri_type_name(tc->kv_type), d, tc->n_kv, tc->n_q, h, i);
                    CHECK_NEAR(got, o_ref[i], tol);
                }
            }
            for (size_t i = (size_t)d; i < out_stride; i++)
                CHECK(isnan(out[(size_t)h * out_stride + i]));
        }
        free(kc);
        free(vc);
        free(slots);
        free(q);
        free(out);
        free(scratch);
        free(s_ref);
        free(o_ref);
    }
    fprintf(stderr, "test_attend_group: %zu cases checked against the reference\n",
            sizeof group_cases / sizeof group_cases[0]);
#else
    fprintf(stderr, "test_attend_group: SKIPPED: no AVX2 kernels in this build\n");
#endif
}

struct tile_case {
    int kv_type, head_dim, n_t, n_q, n_kv0; /* token i sees n_kv0 + i keys */
    float q_scale;
};

static const struct tile_case tile_cases[] = {
    {KIRI_TYPE_F16, 64, 5, 3, 1, 1.0f},    {KIRI_TYPE_F16, 64, 5, 3, 300, 1.0f}, {KIRI_TYPE_F16, 64, 2, 8, 37, 1.0f},
    {KIRI_TYPE_F16, 64, 4, 4, 9, 30.f},    {KIRI_TYPE_F16, 128, 2, 7, 50, 1.0f}, {KIRI_TYPE_F16, 256, 1, 16, 20, 1.0f},
    {KIRI_TYPE_F16, 64, 16, 1, 3, 1.0f},   {KIRI_TYPE_F16, 64, 3, 5, 0, 1.0f},   {KIRI_TYPE_F16, 72, 3, 3, 12, 1.0f},
    {KIRI_TYPE_F32, 64, 5, 3, 130, 1.0f},  {KIRI_TYPE_F32, 96, 2, 6, 7, 2.0f},   {KIRI_TYPE_Q8_0, 64, 4, 4, 40, 1.0f},
};

/* Runs of tokens times heads against the reference one (token, head) at a time, token i seeing
 * n_kv0 + i keys (a prompt's causal mask; n_kv0 = 0 gives a first token that sees nothing). The keys
 * and values only later tokens see hold NaN and infinities: an earlier token's result must not
 * depend on them. Output padding stays untouched. */
static void test_attend_tile(void)
{
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    struct kiri_cpu_kernels fast;
    if (!avx2_table(__func__, &fast))
        return;
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
        const size_t row = (size_t)(d / kiri_type_block_size(tc->kv_type)) * kiri_type_size(tc->kv_type);
        const size_t stride = row * 2;
        void *kc = test_xmalloc(stride * (size_t)n_slots), *vc = test_xmalloc(stride * (size_t)n_slots);
        fill_cache(kc, tc->kv_type, n_slots, d, stride);
        fill_cache(vc, tc->kv_type, n_slots, d, stride);
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
        float *scratch = test_xmalloc((size_t)(n_max > 0 ? n_max : 1) * KIRI_ATTEND_TILE_ROWS * sizeof(float));
        float *s_ref = test_xmalloc((size_t)(n_max > 0 ? n_max : 1) * sizeof(float));
        float **o_ref = test_xmalloc((size_t)tc->n_t * (size_t)tc->n_q * sizeof *o_ref);
        const float scale = 1.0f / sqrtf((float)d);
        /* The reference first, on clean keys and values; then the keys and values of the last
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
        const double tol = tc->kv_type == KIRI_TYPE_F32 ? 1e-5 : tc->kv_type == KIRI_TYPE_F16 ? ATTN_TOL_F16 : 0.0;
        int bad = 0;
        for (int r = 0; r < tc->n_t * tc->n_q; r++) {
            const int i_t = r / tc->n_q, h = r % tc->n_q;
            const float *o = out + (size_t)i_t * out_tok + (size_t)h * out_head;
            if (poisoned && i_t == tc->n_t - 1)
                continue; /* sees the poisoned key: no reference to compare with */
            for (int i = 0; i < d; i++)
                if (!(fabs((double)o[i] - (double)o_ref[r][i]) <= tol) && bad++ < 3) {
                    fprintf(stderr, "  tile case %zu (%s, d %d, %d tokens x %d heads, n_kv0 %d): token %d head %d value %d\n",
                            c, kiri_type_name(tc->kv_type), d, tc->n_t, tc->n_q, tc->n_kv0, i_t, h, i);
                    CHECK_NEAR(o[i], o_ref[r][i], tol);
                }
            for (size_t i = (size_t)d; i < out_head; i++)
                CHECK(isnan(o[i]));
        }
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
    fprintf(stderr, "test_attend_tile: %zu cases checked against the reference\n",
            sizeof tile_cases / sizeof tile_cases[0]);
#else
    fprintf(stderr, "test_attend_tile: SKIPPED: no AVX2 kernels in this build\n");
#endif
}

/* SwiGLU and RMS norm rows against the reference, including lengths that are not multiples of 8,
 * gates far into both tails of the sigmoid, and a norm without weights. */
static void test_rows(void)
{
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    struct kiri_cpu_kernels fast;
    if (!avx2_table(__func__, &fast))
        return;
    CHECK(fast.swiglu_row != NULL && fast.rms_norm_row != NULL);
    if (!fast.swiglu_row || !fast.rms_norm_row)
        return;
    static const int64_t lens[] = {1, 7, 8, 29, 2048, 5632};
    static const float spreads[] = {1.0f, 30.0f, 200.0f};
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t si = 0; si < sizeof spreads / sizeof spreads[0]; si++) {
            const int64_t n = lens[li];
            float *g = test_xmalloc((size_t)n * sizeof *g), *u = test_xmalloc((size_t)n * sizeof *u);
            float *w = test_xmalloc((size_t)n * sizeof *w);
            float *a = test_xmalloc((size_t)n * sizeof *a), *b = test_xmalloc((size_t)n * sizeof *b);
            for (int64_t i = 0; i < n; i++) {
                g[i] = test_rand_sym() * spreads[si];
                u[i] = test_rand_sym();
                w[i] = test_rand_sym() * 2.0f;
            }
            kiri_cpu_swiglu_row(g, u, a, n);
            fast.swiglu_row(g, u, b, n);
            int bad = 0;
            /* A few ulp of silu(g) u; where e^g is below the smallest normal float (g < -87.3)
             * the kernel's exp flushes to 0, leaving results under 1e-35 instead of tiny values. */
            for (int64_t i = 0; i < n; i++)
                if (!(fabs((double)a[i] - (double)b[i]) <= 4e-7 * fabs((double)a[i]) + 1e-35) && bad++ < 3)
                    CHECK_NEAR(b[i], a[i], 4e-7 * fabs((double)a[i]) + 1e-35);
            for (int with_w = 0; with_w < 2; with_w++) {
                kiri_cpu_rms_norm_row(g, with_w ? w : NULL, a, n, 1e-5f);
                fast.rms_norm_row(g, with_w ? w : NULL, b, n, 1e-5f);
                for (int64_t i = 0; i < n; i++) /* the same scale up to its last bit */
                    if (!(fabs((double)a[i] - (double)b[i]) <= 2.5e-7 * fabs((double)a[i])) && bad++ < 3)
                        CHECK_NEAR(b[i], a[i], 2.5e-7 * fabs((double)a[i]));
            }
            free(g);
            free(u);
            free(w);
            free(a);
            free(b);
        }
    fprintf(stderr, "test_rows: swiglu and rms_norm checked against the reference\n");
#else
    fprintf(stderr, "test_rows: SKIPPED: no AVX2 kernels in this build\n");
#endif
}

TEST_MAIN(test_attend_head, test_attend_group, test_attend_tile, test_rows)
