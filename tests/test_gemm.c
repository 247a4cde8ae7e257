/* Tests of the gemm kernels (kernels/cpu/gemm_avx2.c, gemm_avx512.c): every tile entry against the reference
 * vec_dot of quants.c, one dot per (row, token), on random rows quantized by the reference
 * quantizers. The shapes cover the kernels' micro-tile edges (rows and tokens that are not
 * multiples of four, single tokens and single rows), several passes over the token side (k
 * beyond one chunk of 128 blocks), padded row strides and a padded output stride whose padding
 * must stay untouched; data patterns include rows at the extremes of the integer ranges (the
 * largest 4-, 5- and 6-bit quants against activations of 127) and Q8_0 weights holding -128.
 *
 * Tolerance: the kernels compute the same integer block sums as the reference and add the
 * blocks' float contributions in another order, so they may differ by a few float roundings of
 * the sum of the magnitudes; the bound used is 1e-4 of sum |w_i| |a_i| (dequantized weights,
 * float activations) plus 1e-5 of |reference|. A wrong block, scale or lane is off by far more. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "platform.h"
#define TEST_RNG_SEED 0x2545F4914F6CDD1Dull
#include "test.h"

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */


static size_t row_bytes(int type, int64_t k)
{
    return (size_t)(k / kiri_type_block_size(type)) * kiri_type_size(type);
}

enum pattern {
    PATTERN_RANDOM,  /* uniform values, some blocks scaled down by 1000 */
    PATTERN_EXTREME  /* activations all 1 (quantized to 127); weights at the ends of their range */
};

static void fill(float *x, int64_t n, enum pattern p, int is_weight)
{
    for (int64_t i = 0; i < n; i++) {
        if (p == PATTERN_EXTREME)
            /* One value of -1 per 16 and the rest 7/8: Q4_0 then holds nibbles 0 and 15. */
            x[i] = !is_weight ? 1.0f : (i % 16 == 0 ? -1.0f : 0.875f);
        else
            x[i] = test_rand_sym() * ((i / 32) % 7 == 3 ? 0.001f : 1.0f);
    }
}

/* ---------------------------------------------------------------------------------------------
 * The check
 * ------------------------------------------------------------------------------------------- */

struct shape {
    int64_t nr, nt;
};

static const struct shape shapes[] = {
    {1, 1}, {3, 1}, {4, 1}, {5, 1}, {8, 1}, {9, 1}, {13, 1}, {1, 2}, {4, 2}, {7, 3},
    {1, 4}, {4, 4}, {5, 4}, {8, 5}, {3, 6}, {16, 7}, {17, 8}, {2, 9}, {9, 13},
    /* Prefill tiles on token octets (gemm_octet_avx2.c): passes of 4, 3, 2 and 1 octets with a
     * rest for the quads, more rows than one pass takes (64), and two passes of 4 octets. */
    {5, 16}, {3, 27}, {70, 33}, {2, 45}, {3, 70},
};

/* Runs gemm on an (nr, nt) tile of k and compares with the reference; returns the number of
 * mismatches (each also a failed check). */
static int check_tile(int type, kiri_gemm_fn gemm, const struct kiri_cpu_kernels *ref, int64_t k,
                      struct shape s, enum pattern p)
{
    const int vt = kiri_cpu_vec_dot_type(type);
    const size_t w_pad = 32, a_pad = 64, d_pad = 3;
    const size_t ws = row_bytes(type, k) + w_pad, as = row_bytes(vt, k) + a_pad;
    const size_t ds = (size_t)s.nr + d_pad;
    float *wf = test_xmalloc((size_t)(s.nr * k) * sizeof *wf);
    float *af = test_xmalloc((size_t)(s.nt * k) * sizeof *af);
    float *deq = test_xmalloc((size_t)k * sizeof *deq);
    unsigned char *w = test_xmalloc(ws * (size_t)s.nr);
    unsigned char *a = test_xmalloc(as * (size_t)s.nt);
    float *dst = test_xmalloc(ds * (size_t)s.nt * sizeof *dst);
    fill(wf, s.nr * k, p, 1);
    fill(af, s.nt * k, p, 0);
    memset(w, 0xA5, ws * (size_t)s.nr);
    memset(a, 0x5A, as * (size_t)s.nt);
    for (int64_t r = 0; r < s.nr; r++) {
        CHECK(kiri_cpu_quantize_row(type, wf + r * k, w + (size_t)r * ws, k) == row_bytes(type, k));
        if (type == KIRI_TYPE_Q8_0 && p == PATTERN_RANDOM) { /* weights (not activations) may hold -128 */
            struct kiri_block_q8_0 *b = (struct kiri_block_q8_0 *)(w + (size_t)r * ws);
            b[0].qs[(r * 5) % 32] = -128;
        }
    }
    for (int64_t t = 0; t < s.nt; t++)
        CHECK(kiri_cpu_quantize_row(vt, af + t * k, a + (size_t)t * as, k) == row_bytes(vt, k));
    for (size_t i = 0; i < ds * (size_t)s.nt; i++)
        dst[i] = NAN;

    gemm(k, w, ws, a, as, dst, ds, s.nr, s.nt);

    int bad = 0;
    for (int64_t r = 0; r < s.nr; r++) {
        kiri_cpu_dequantize_row(type, w + (size_t)r * ws, deq, k);
        for (int64_t t = 0; t < s.nt; t++) {
            float want;
            ref->vec_dot[type](k, &want, w + (size_t)r * ws, a + (size_t)t * as);
            double mag = 0;
            for (int64_t i = 0; i < k; i++)
                mag += fabs((double)deq[i] * (double)af[t * k + i]);
            const double tol = 1e-4 * mag + 1e-5 * fabs((double)want) + 1e-30;
            const float got = dst[(size_t)t * ds + (size_t)r];
            if (!(fabs((double)got - (double)want) <= tol)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s k=%lld tile %lldx%lld pattern %d: row %lld token %lld\n",
                            kiri_type_name(type), (long long)k, (long long)s.nr, (long long)s.nt,
                            (int)p, (long long)r, (long long)t);
                CHECK_NEAR(got, want, tol);
            }
        }
    }
    for (int64_t t = 0; t < s.nt; t++)
        for (size_t i = (size_t)s.nr; i < ds; i++)
            if (!isnan(dst[(size_t)t * ds + i])) {
                bad++;
                CHECK(isnan(dst[(size_t)t * ds + i])); /* padding written */
            }
    free(wf);
    free(af);
    free(deq);
    free(w);
    free(a);
    free(dst);
    return bad;
}

/* ---------------------------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------------------------- */

struct type_case {
    int type;
    int64_t k[5]; /* 0 ends the list */
};

static const struct type_case type_cases[] = {
    {KIRI_TYPE_Q4_0, {32, 96, 2048, 32 * 133, 0}},
    {KIRI_TYPE_Q8_0, {32, 160, 2048, 32 * 130, 0}},
    {KIRI_TYPE_Q4_1, {32, 96, 2048, 32 * 133, 0}},
    {KIRI_TYPE_Q5_0, {32, 96, 2048, 32 * 133, 0}},
    {KIRI_TYPE_Q5_1, {32, 96, 2048, 32 * 133, 0}},
    {KIRI_TYPE_Q4_K, {256, 768, 2048, 256 * 17, 0}},
    {KIRI_TYPE_Q5_K, {256, 768, 2048, 256 * 17, 0}},
    {KIRI_TYPE_Q6_K, {256, 768, 2048, 256 * 17, 0}},
    {KIRI_TYPE_F16, {1, 7, 33, 100, 2048}},
    {KIRI_TYPE_F32, {1, 8, 31, 257, 2048}},
};

static void test_gemm_avx2(void)
{
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    if (!(kiri_platform_cpu_features() & KIRI_CPU_AVX2)) {
        fprintf(stderr, "test_gemm_avx2: SKIPPED: this CPU lacks AVX2, FMA or F16C\n");
        return;
    }
    struct kiri_cpu_kernels ref, fast;
    kiri_cpu_kernels_init_ref(&ref);
    kiri_cpu_kernels_init_ref(&fast);
    kiri_cpu_kernels_init_avx2(&fast);
    kiri_cpu_kernels_init_gemm_avx2(&fast);
    int n_kernels = 0;
    for (size_t c = 0; c < sizeof type_cases / sizeof type_cases[0]; c++) {
        const struct type_case *tc = &type_cases[c];
        const kiri_gemm_fn gemm = fast.gemm[tc->type];
        CHECK(gemm != NULL);
        if (!gemm)
            continue;
        n_kernels++;
        int bad = 0;
        for (int ki = 0; ki < 5 && tc->k[ki]; ki++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                bad += check_tile(tc->type, gemm, &ref, tc->k[ki], shapes[si], PATTERN_RANDOM);
                if (si % 4 == 0)
                    bad += check_tile(tc->type, gemm, &ref, tc->k[ki], shapes[si], PATTERN_EXTREME);
            }
        if (bad)
            fprintf(stderr, "test_gemm_avx2: %s: %d mismatches\n", kiri_type_name(tc->type), bad);
    }
    /* Types without a gemm entry fall back to vec_dot in the backend. */
    CHECK(fast.gemm[KIRI_TYPE_BF16] == NULL);
    CHECK(ref.gemm[KIRI_TYPE_Q4_0] == NULL);
    fprintf(stderr, "test_gemm_avx2: %d gemm kernels checked against the reference\n", n_kernels);
#else
    fprintf(stderr, "test_gemm_avx2: SKIPPED: no AVX2 kernels in this build\n");
#endif
}

/* The extreme pattern really reaches the ends of the ranges the kernels' folds rely on. */
static void test_extreme_pattern(void)
{
    float x[32];
    struct kiri_block_q4_0 b;
    struct kiri_block_q8_0 a;
    fill(x, 32, PATTERN_EXTREME, 1);
    CHECK(kiri_cpu_quantize_row(KIRI_TYPE_Q4_0, x, &b, 32) == sizeof b);
    CHECK_EQ_INT(b.qs[0] & 0xF, 0);
    CHECK_EQ_INT(b.qs[1] & 0xF, 15);
    struct kiri_block_q5_1 b5; /* 5-bit quants: 0 and 31 (the folds' largest int16 sums) */
    CHECK(kiri_cpu_quantize_row(KIRI_TYPE_Q5_1, x, &b5, 32) == sizeof b5);
    CHECK_EQ_INT((b5.qs[0] & 0xF) | (b5.qh[0] & 1) << 4, 0);
    CHECK_EQ_INT((b5.qs[1] & 0xF) | (b5.qh[0] >> 1 & 1) << 4, 31);
    struct kiri_block_q5_0 b50; /* Q5_0's quant 0 (its octet kernel's int16 bound against 127) */
    CHECK(kiri_cpu_quantize_row(KIRI_TYPE_Q5_0, x, &b50, 32) == sizeof b50);
    CHECK_EQ_INT((b50.qs[0] & 0xF) | (b50.qh[0] & 1) << 4, 0);
    float xk[KIRI_QK_K]; /* Q5_K too (its octet kernel's int16 bound is reached at 0 against 127) */
    struct kiri_block_q5_K bk;
    fill(xk, KIRI_QK_K, PATTERN_EXTREME, 1);
    CHECK(kiri_cpu_quantize_row(KIRI_TYPE_Q5_K, xk, &bk, KIRI_QK_K) == sizeof bk);
    CHECK_EQ_INT((bk.qs[0] & 0xF) | (bk.qh[0] & 1) << 4, 0);
    CHECK_EQ_INT((bk.qs[1] & 0xF) | (bk.qh[1] & 1) << 4, 31);
    CHECK_EQ_INT((bk.qs[16] >> 4) | (bk.qh[16] >> 1 & 1) << 4, 0); /* value 48: sub-block 1 */
    CHECK_EQ_INT((bk.qs[17] >> 4) | (bk.qh[17] >> 1 & 1) << 4, 31);
    fill(x, 32, PATTERN_EXTREME, 0);
    CHECK(kiri_cpu_quantize_row(KIRI_TYPE_Q8_0, x, &a, 32) == sizeof a);
    CHECK_EQ_INT(a.qs[7], 127);
}

/* The AVX-512 kernels group rows by 16 and tokens by 16 or 8, pass over k in chunks of 64 blocks (Q4_0,
 * Q8_0) and split tiles beyond 128 rows: shapes around those sizes besides the common ones. k is
 * a multiple of 256 so the same sizes serve the K-quants. Octets followed by one or two tokens
 * (which the types without AVX-512 small-batch kernels hand to the AVX2 ones): 9, 18, 50. */
static const struct shape shapes_avx512[] = {
    {16, 8}, {15, 3}, {33, 11}, {130, 9}, {17, 2}, {31, 16}, {20, 35}, {7, 18}, {19, 50},
};

static void test_gemm_avx512(void)
{
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    const uint32_t need = KIRI_CPU_AVX512 | KIRI_CPU_AVX512_VNNI;
    if ((kiri_platform_cpu_features() & need) != need) {
        fprintf(stderr, "test_gemm_avx512: SKIPPED: this CPU lacks AVX-512 (F, BW, VL) or VNNI\n");
        return;
    }
    struct kiri_cpu_kernels ref, fast;
    kiri_cpu_kernels_init_ref(&ref);
    kiri_cpu_kernels_init_ref(&fast);
    kiri_cpu_kernels_init_gemm_avx512(&fast);
    static const int types[] = {KIRI_TYPE_Q4_0, KIRI_TYPE_Q4_1, KIRI_TYPE_Q5_0, KIRI_TYPE_Q5_1,
                                KIRI_TYPE_Q8_0, KIRI_TYPE_Q4_K, KIRI_TYPE_Q5_K, KIRI_TYPE_Q6_K};
    static const int64_t ks[] = {256, 2048, 32 * 136};
    for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
        const kiri_gemm_fn gemm = fast.gemm[types[c]];
        CHECK(gemm != NULL);
        if (!gemm)
            continue;
        int bad = 0;
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
                bad += check_tile(types[c], gemm, &ref, ks[ki], shapes[si], si % 4 ? PATTERN_RANDOM : PATTERN_EXTREME);
            for (size_t si = 0; si < sizeof shapes_avx512 / sizeof shapes_avx512[0]; si++)
                bad += check_tile(types[c], gemm, &ref, ks[ki], shapes_avx512[si], PATTERN_RANDOM);
        }
        if (bad)
            fprintf(stderr, "test_gemm_avx512: %s: %d mismatches\n", kiri_type_name(types[c]), bad);
    }
    fprintf(stderr, "test_gemm_avx512: %zu gemm kernels checked against the reference\n",
            sizeof types / sizeof types[0]);
#else
    fprintf(stderr, "test_gemm_avx512: SKIPPED: no x86 kernels in this build\n");
#endif
}

/* Small batches and single tokens, the decode-side paths of both tables: every token count 1..9
 * (one-token kernels, the 2-4-token kernels, an octet plus a rest) against odd row counts around
 * the kernels' row groups (4, 8 and 16 rows) and a longer range (the backend hands small batches
 * a thread's whole share of rows, see gemm_stream), with k whose block count leaves each remainder
 * modulo 4 (the AVX-512 Q4_0 one-token kernel reads four blocks at a time and masks the last
 * group) and one k past that kernel's table (its fallback). */
static const int64_t small_nrs[] = {1, 3, 5, 7, 9, 13, 17, 31, 33, 130};

/* A streamed small batch gives each token exactly the floats it gets alone (so a sequence decodes
 * the same in a serving step with others): gemm over nt tokens against nt one-token calls,
 * compared bit for bit. Returns the number of differing results. */
static int check_batch_alone(int type, kiri_gemm_fn gemm, int64_t k, int64_t nr, int64_t nt)
{
    const int vt = kiri_cpu_vec_dot_type(type);
    const size_t ws = row_bytes(type, k), as = row_bytes(vt, k), ds = (size_t)nr;
    float *f = test_xmalloc((size_t)((nr > nt ? nr : nt) * k) * sizeof *f);
    unsigned char *w = test_xmalloc(ws * (size_t)nr);
    unsigned char *a = test_xmalloc(as * (size_t)nt);
    float *batch = test_xmalloc(ds * (size_t)nt * sizeof *batch);
    float *alone = test_xmalloc(ds * (size_t)nt * sizeof *alone);
    fill(f, nr * k, PATTERN_RANDOM, 1);
    for (int64_t r = 0; r < nr; r++)
        CHECK(kiri_cpu_quantize_row(type, f + r * k, w + (size_t)r * ws, k) == ws);
    fill(f, nt * k, PATTERN_RANDOM, 0);
    for (int64_t t = 0; t < nt; t++)
        CHECK(kiri_cpu_quantize_row(vt, f + t * k, a + (size_t)t * as, k) == as);
    gemm(k, w, ws, a, as, batch, ds, nr, nt);
    for (int64_t t = 0; t < nt; t++)
        gemm(k, w, ws, a + (size_t)t * as, as, alone + (size_t)t * ds, ds, nr, 1);
    int bad = 0;
    for (size_t i = 0; i < ds * (size_t)nt; i++)
        bad += memcmp(&batch[i], &alone[i], sizeof(float)) != 0;
    CHECK_EQ_INT(bad, 0);
    free(f);
    free(w);
    free(a);
    free(batch);
    free(alone);
    return bad;
}

static int check_small(const char *name, const struct kiri_cpu_kernels *fast, const struct kiri_cpu_kernels *ref)
{
    static const struct {
        int type;
        int64_t k[4]; /* 0 ends the list */
    } cases[] = {
        {KIRI_TYPE_Q4_0, {32 * 5, 32 * 7, 32 * 10, 2048}},
        {KIRI_TYPE_Q8_0, {32 * 5, 32 * 7, 32 * 10, 2048}},
        {KIRI_TYPE_Q4_1, {32 * 5, 32 * 7, 32 * 10, 2048}},
        {KIRI_TYPE_Q5_0, {32 * 5, 32 * 7, 32 * 10, 2048}},
        {KIRI_TYPE_Q5_1, {32 * 5, 32 * 7, 32 * 10, 2048}},
        {KIRI_TYPE_Q4_K, {256 * 3, 2048, 0, 0}},
        {KIRI_TYPE_Q5_K, {256 * 3, 2048, 0, 0}},
        {KIRI_TYPE_Q6_K, {256 * 3, 2048, 0, 0}},
    };
    int n_tiles = 0;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        /* Types that stream small batches are given whole row ranges by the backend. */
        CHECK(fast->gemm_stream[cases[c].type] <= 8);
        CHECK(ref->gemm_stream[cases[c].type] == 0);
        const kiri_gemm_fn gemm = fast->gemm[cases[c].type];
        CHECK(gemm != NULL);
        if (!gemm)
            continue;
        int bad = 0;
        for (int ki = 0; ki < 4 && cases[c].k[ki]; ki++)
            for (int64_t nt = 1; nt <= 9; nt++)
                for (size_t ri = 0; ri < sizeof small_nrs / sizeof small_nrs[0]; ri++) {
                    const struct shape sh = {small_nrs[ri], nt};
                    const enum pattern p = (ri + (size_t)nt) % 5 == 0 ? PATTERN_EXTREME : PATTERN_RANDOM;
                    bad += check_tile(cases[c].type, gemm, ref, cases[c].k[ki], sh, p);
                    n_tiles++;
                }
        for (int64_t nt = 2; nt <= fast->gemm_stream[cases[c].type]; nt++)
            for (size_t ri = 0; ri < sizeof small_nrs / sizeof small_nrs[0]; ri++)
                bad += check_batch_alone(cases[c].type, gemm, cases[c].k[0], small_nrs[ri], nt);
        for (int64_t nt = 1; nt <= 3; nt++) { /* rows of 520 blocks of 32 (65 of 256) */
            const struct shape sh = {5, nt};
            bad += check_tile(cases[c].type, gemm, ref, 32 * 520, sh, PATTERN_RANDOM);
            n_tiles++;
        }
        if (bad)
            fprintf(stderr, "%s: %s: %d mismatches\n", name, kiri_type_name(cases[c].type), bad);
    }
    return n_tiles;
}

static void test_small_batches(void)
{
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    const uint32_t f = kiri_platform_cpu_features();
    struct kiri_cpu_kernels ref;
    kiri_cpu_kernels_init_ref(&ref);
    if (f & KIRI_CPU_AVX2) {
        struct kiri_cpu_kernels fast;
        kiri_cpu_kernels_init_ref(&fast);
        kiri_cpu_kernels_init_gemm_avx2(&fast);
        const int n = check_small("test_small_batches avx2", &fast, &ref);
        fprintf(stderr, "test_small_batches: avx2: %d tiles checked\n", n);
    } else {
        fprintf(stderr, "test_small_batches: avx2: SKIPPED: this CPU lacks AVX2, FMA or F16C\n");
    }
    const uint32_t need = KIRI_CPU_AVX512 | KIRI_CPU_AVX512_VNNI;
    if ((f & need) == need) {
        struct kiri_cpu_kernels fast; /* the backend's AVX-512 table: AVX2 entries for the other types */
        kiri_cpu_kernels_init_ref(&fast);
        kiri_cpu_kernels_init_gemm_avx2(&fast);
        kiri_cpu_kernels_init_gemm_avx512(&fast);
        const int n = check_small("test_small_batches avx512", &fast, &ref);
        fprintf(stderr, "test_small_batches: avx512: %d tiles checked\n", n);
    } else {
        fprintf(stderr, "test_small_batches: avx512: SKIPPED: this CPU lacks AVX-512 (F, BW, VL) or VNNI\n");
    }
#else
    fprintf(stderr, "test_small_batches: SKIPPED: no x86 kernels in this build\n");
#endif
}

TEST_MAIN(test_gemm_avx2, test_gemm_avx512, test_small_batches, test_extreme_pattern)
