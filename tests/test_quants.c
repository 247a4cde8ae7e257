/* Tests of kernels/cpu/quants.c: half-precision conversions (exhaustive where the domain is 16-bit,
 * against a slow exact rounding elsewhere), quantize/dequantize error bounds per type, dot products
 * against float dot products of the dequantized rows, Q8_K's bsums, and edge cases. Bit-exactness
 * with the GGUF definitions is checked separately against gguf-py (tests/test_dequant.py). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "platform.h"
#include "test.h"

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd_u64(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rnd_unit(void) /* (0, 1) */
{
    return ((double)(rnd_u64() >> 11) + 0.5) / 9007199254740992.0;
}

static float rnd_normal(void)
{
    return (float)(sqrt(-2.0 * log(rnd_unit())) * cos(6.283185307179586 * rnd_unit()));
}

static void fill_normal(float *x, int64_t n, float scale)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = rnd_normal() * scale;
}

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

/* Dequantizes an activation row (Q8_1, Q8_K are not weight types, so the API has no dequantizer
 * for them) or any weight row. */
static void dequant_any(int type, const void *src, float *dst, int64_t n)
{
    if (type == KIRI_TYPE_Q8_1) {
        const struct kiri_block_q8_1 *b = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = kiri_f16_to_f32(b[i / 32].d) * (float)b[i / 32].qs[i % 32];
    } else if (type == KIRI_TYPE_Q8_K) {
        const struct kiri_block_q8_K *b = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = b[i / 256].d * (float)b[i / 256].qs[i % 256];
    } else {
        kiri_cpu_dequantize_row(type, src, dst, n);
    }
}

static size_t row_bytes(int type, int64_t n)
{
    return (size_t)(n / kiri_type_block_size(type)) * kiri_type_size(type);
}

/* ---------------------------------------------------------------------------------------------
 * Scalar conversions
 * ------------------------------------------------------------------------------------------- */

/* Exact value of a positive finite half, by its definition. */
static double half_value(unsigned h)
{
    unsigned e = (h >> 10) & 31, m = h & 1023;
    return e ? ldexp(1024 + m, (int)e - 25) : ldexp(m, -24);
}

/* Slow exact f32 -> f16: binary search for the neighbours, then round to nearest even. */
static unsigned slow_to_half(float f)
{
    unsigned sign = (bits_of(f) >> 16) & 0x8000u;
    double a = fabs((double)f);
    if (a >= 65520.0)
        return sign | 0x7c00u;
    unsigned lo = 0, hi = 0x7bff;
    while (lo < hi) { /* largest h with value <= a */
        unsigned mid = (lo + hi + 1) / 2;
        if (half_value(mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    double below = a - half_value(lo), above = half_value(lo + 1) - a;
    if (above < below || (above == below && (lo & 1)))
        lo++;
    return sign | lo;
}

static void test_f16_all_values(void)
{
    int bad_value = 0, bad_round = 0, bad_nan = 0;
    for (unsigned h = 0; h < 65536; h++) {
        float f = kiri_f16_to_f32((kiri_f16)h);
        unsigned e = (h >> 10) & 31;
        if (e == 31 && (h & 1023)) {
            /* NaN stays NaN with sign and payload; narrowing quiets it. */
            if (!isnan(f) || (bits_of(f) >> 31) != (h >> 15) || ((bits_of(f) >> 13) & 1023) != (h & 1023))
                bad_nan++;
            if (kiri_f32_to_f16(f) != (h | 0x200u))
                bad_nan++;
            continue;
        }
        double want = e == 31 ? INFINITY : half_value(h & 0x7fff);
        if (h & 0x8000)
            want = -want;
        if ((double)f != want || !!signbit(f) != !!(h & 0x8000))
            bad_value++;
        if (kiri_f32_to_f16(f) != h)
            bad_round++;
    }
    CHECK_EQ_INT(bad_value, 0);
    CHECK_EQ_INT(bad_round, 0);
    CHECK_EQ_INT(bad_nan, 0);
}

static void test_f16_rounding(void)
{
    static const struct { float f; unsigned h; } cases[] = {
        {1.0f, 0x3c00}, {-2.0f, 0xc000}, {65504.0f, 0x7bff}, {65519.99f, 0x7bff},
        {65520.0f, 0x7c00}, {1e10f, 0x7c00}, {-1e10f, 0xfc00}, {1.0f + 0x1p-11f, 0x3c00},
        {1.0f + 0x3p-11f, 0x3c02}, {0x1p-24f, 0x0001}, {0x1p-25f, 0x0000}, {0x1.000002p-25f, 0x0001},
        {0x3p-26f, 0x0001}, {0x3p-25f, 0x0002}, {0x5p-25f, 0x0002}, {0x1p-14f, 0x0400},
        {0x1.ff8p-15f, 0x03ff}, {-0.0f, 0x8000}, {1e-30f, 0x0000}, {0x1.ffcp-15f, 0x0400},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        CHECK_EQ_INT(kiri_f32_to_f16(cases[i].f), cases[i].h);
    CHECK_EQ_INT(kiri_f32_to_f16(INFINITY), 0x7c00);
    CHECK_EQ_INT(kiri_f32_to_f16(float_of(0x7f800001u)) & 0x7e00u, 0x7e00); /* sNaN -> qNaN */

    /* A sweep over the float bit patterns (every 997th, both signs) against the slow rounding. */
    int bad = 0;
    for (uint64_t u = 0; u < 0x7f800000ull; u += 997) {
        float f = float_of((uint32_t)u);
        if (kiri_f32_to_f16(f) != slow_to_half(f))
            bad++;
        if (kiri_f32_to_f16(-f) != slow_to_half(-f))
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

static void test_bf16(void)
{
    int bad = 0;
    for (unsigned h = 0; h < 65536; h++) {
        float f = kiri_bf16_to_f32((kiri_bf16)h);
        if (bits_of(f) != h << 16)
            bad++;
        unsigned back = kiri_f32_to_bf16(f);
        if (isnan(f) ? back != (h | 0x40u) : back != h)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    /* Narrowing: nearest, ties to even, carries into the exponent; big values round to infinity. */
    CHECK_EQ_INT(kiri_f32_to_bf16(float_of(0x3f808000u)), 0x3f80); /* tie, even stays */
    CHECK_EQ_INT(kiri_f32_to_bf16(float_of(0x3f818000u)), 0x3f82); /* tie, odd rounds up */
    CHECK_EQ_INT(kiri_f32_to_bf16(float_of(0x3f808001u)), 0x3f81);
    CHECK_EQ_INT(kiri_f32_to_bf16(float_of(0x7f7fffffu)), 0x7f80);
    CHECK_EQ_INT(kiri_f32_to_bf16(float_of(0x7f800001u)), 0x7fc0); /* sNaN quieted, not Inf */
    bad = 0;
    for (uint64_t u = 0; u < 0x7f800000ull; u += 991) {
        uint32_t x = (uint32_t)u, t = x >> 16, r = x & 0xffff;
        uint32_t want = r > 0x8000 || (r == 0x8000 && (t & 1)) ? t + 1 : t;
        if (kiri_f32_to_bf16(float_of(x)) != want)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Quantize -> dequantize
 * ------------------------------------------------------------------------------------------- */

/* Relative RMS error bounds on normal data, about 1.3x what this quantization reaches (measured:
 * F16 2.1e-4, BF16 1.7e-3, Q4_0 .086, Q4_1 .078, Q5_0 .043, Q5_1 .038, Q8_0 .0053, Q4_K .071,
 * Q5_K .036, Q6_K .018). */
static const struct { int type; double rel_rmse; } quant_cases[] = {
    {KIRI_TYPE_F32, 0.0},       {KIRI_TYPE_F16, 3e-4},     {KIRI_TYPE_BF16, 2.2e-3},
    {KIRI_TYPE_Q4_0, 0.11},     {KIRI_TYPE_Q4_1, 0.10},    {KIRI_TYPE_Q5_0, 0.055},
    {KIRI_TYPE_Q5_1, 0.049},    {KIRI_TYPE_Q8_0, 0.007},   {KIRI_TYPE_Q8_1, 0.007},
    {KIRI_TYPE_Q8_K, 0.007},    {KIRI_TYPE_Q4_K, 0.092},   {KIRI_TYPE_Q5_K, 0.047},
    {KIRI_TYPE_Q6_K, 0.023},
};

static void test_quant_roundtrip(void)
{
    const int64_t n = 256 * 64;
    float *x = xmalloc((size_t)n * 4), *y = xmalloc((size_t)n * 4);
    void *q = xmalloc((size_t)n * 4);
    for (size_t c = 0; c < sizeof quant_cases / sizeof quant_cases[0]; c++) {
        const int t = quant_cases[c].type;
        for (int scale_i = 0; scale_i < 3; scale_i++) {
            /* Ordinary, small (half-precision block scales become subnormal) and large data. */
            const float scale = scale_i == 0 ? 1.0f : scale_i == 1 ? 1e-3f : 1e3f;
            fill_normal(x, n, scale);
            size_t bytes = kiri_cpu_quantize_row(t, x, q, n);
            CHECK_EQ_INT(bytes, row_bytes(t, n));
            dequant_any(t, q, y, n);
            double se = 0, sx = 0;
            for (int64_t i = 0; i < n; i++) {
                se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
                sx += (double)x[i] * x[i];
            }
            double rel = sqrt(se / sx);
            /* At 1e-3 subnormal half-precision block scales lose a few bits. */
            double bound = quant_cases[c].rel_rmse * (scale_i == 1 ? 1.5 : 1.0);
            if (!(rel <= bound))
                fprintf(stderr, "  %s at scale %g: rel rmse %.5f > %.5f\n", kiri_type_name(t),
                        (double)scale, rel, bound);
            CHECK(rel <= bound);
        }
    }
    free(x);
    free(y);
    free(q);
}

/* Bytes written, unsupported types and partial blocks. */
static void test_quant_contract(void)
{
    float x[512] = {0};
    static unsigned char q[4096];
    CHECK_EQ_INT(kiri_cpu_quantize_row(KIRI_TYPE_Q4_0, x, q, 64), 2 * 18);
    CHECK_EQ_INT(kiri_cpu_quantize_row(KIRI_TYPE_Q4_K, x, q, 512), 2 * 144);
    CHECK_EQ_INT(kiri_cpu_quantize_row(KIRI_TYPE_Q8_K, x, q, 256), 292);
    CHECK_EQ_INT(kiri_cpu_quantize_row(KIRI_TYPE_F16, x, q, 3), 6);
    CHECK_EQ_INT(kiri_cpu_quantize_row(KIRI_TYPE_Q4_0, x, q, 48), 0);
    CHECK_EQ_INT(kiri_cpu_quantize_row(KIRI_TYPE_Q6_K, x, q, 128), 0);
    CHECK_EQ_INT(kiri_cpu_quantize_row(KIRI_TYPE_Q2_K, x, q, 256), 0);
    CHECK_EQ_INT(kiri_cpu_quantize_row(KIRI_TYPE_I32, x, q, 4), 0);
    CHECK_EQ_INT(kiri_cpu_quantize_row(99, x, q, 4), 0);
    CHECK_EQ_INT(kiri_cpu_vec_dot_type(KIRI_TYPE_Q4_0), KIRI_TYPE_Q8_0);
    CHECK_EQ_INT(kiri_cpu_vec_dot_type(KIRI_TYPE_Q5_1), KIRI_TYPE_Q8_1);
    CHECK_EQ_INT(kiri_cpu_vec_dot_type(KIRI_TYPE_Q6_K), KIRI_TYPE_Q8_K);
    CHECK_EQ_INT(kiri_cpu_vec_dot_type(KIRI_TYPE_BF16), KIRI_TYPE_BF16);
    CHECK_EQ_INT(kiri_cpu_vec_dot_type(KIRI_TYPE_Q2_K), -1);
}

/* All-zero input gives all-zero output (no NaN from a zero scale); constant blocks stay close. */
static void test_quant_edge(void)
{
    static const int types[] = {KIRI_TYPE_F16, KIRI_TYPE_BF16, KIRI_TYPE_Q4_0, KIRI_TYPE_Q4_1,
                                KIRI_TYPE_Q5_0, KIRI_TYPE_Q5_1, KIRI_TYPE_Q8_0, KIRI_TYPE_Q8_1,
                                KIRI_TYPE_Q8_K, KIRI_TYPE_Q4_K, KIRI_TYPE_Q5_K, KIRI_TYPE_Q6_K};
    float x[256], y[256];
    static unsigned char q[2048];
    for (size_t c = 0; c < sizeof types / sizeof types[0]; c++) {
        const int t = types[c];
        for (int k = 0; k < 256; k++)
            x[k] = 0.0f;
        kiri_cpu_quantize_row(t, x, q, 256);
        dequant_any(t, q, y, 256);
        int nonzero = 0;
        for (int k = 0; k < 256; k++)
            nonzero += y[k] != 0.0f;
        CHECK_EQ_INT(nonzero, 0);
        /* A constant, and a block with one outlier: the largest value is kept well. */
        for (int k = 0; k < 256; k++)
            x[k] = -0.3f;
        x[77] = 1000.0f;
        kiri_cpu_quantize_row(t, x, q, 256);
        dequant_any(t, q, y, 256);
        CHECK_NEAR(y[77], 1000.0, 1000.0 * 0.01);
        int bad = 0;
        for (int k = 0; k < 256; k++)
            bad += !isfinite(y[k]);
        CHECK_EQ_INT(bad, 0);
    }
    /* Q8_K keeps a float scale: huge values survive. */
    for (int k = 0; k < 256; k++)
        x[k] = rnd_normal() * 1e30f;
    kiri_cpu_quantize_row(KIRI_TYPE_Q8_K, x, q, 256);
    dequant_any(KIRI_TYPE_Q8_K, q, y, 256);
    float amax = 0;
    for (int k = 0; k < 256; k++)
        amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
    int bad = 0;
    for (int k = 0; k < 256; k++)
        bad += !(fabsf(y[k] - x[k]) <= amax / 254 * 1.001f);
    CHECK_EQ_INT(bad, 0);
}

/* Q8_K: bsums are the sums of 16 quants; d follows the reference sign convention (the value of
 * largest magnitude quantizes to -127); requantizing the dequantized row gives the same bytes. */
static void test_q8_K(void)
{
    float x[512], y[512];
    struct kiri_block_q8_K a[2], b[2];
    fill_normal(x, 512, 3.0f);
    x[10] = 20.0f;   /* largest of block 0, positive */
    x[300] = -20.0f; /* largest of block 1, negative */
    kiri_cpu_quantize_row(KIRI_TYPE_Q8_K, x, a, 512);
    for (int i = 0; i < 2; i++) {
        int bad = 0;
        for (int g = 0; g < 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += a[i].qs[16 * g + l];
            bad += s != a[i].bsums[g];
        }
        CHECK_EQ_INT(bad, 0);
    }
    CHECK_EQ_INT(a[0].qs[10], -127);
    CHECK(a[0].d < 0);
    CHECK_EQ_INT(a[1].qs[300 - 256], -127);
    CHECK(a[1].d > 0);
    CHECK_NEAR(a[0].d, -20.0 / 127, 1e-7);
    dequant_any(KIRI_TYPE_Q8_K, a, y, 512);
    kiri_cpu_quantize_row(KIRI_TYPE_Q8_K, y, b, 512);
    CHECK(memcmp(a, b, sizeof a) == 0);
    /* Q8_1's s is d times the sum of its quants. */
    struct kiri_block_q8_1 c[16];
    kiri_cpu_quantize_row(KIRI_TYPE_Q8_1, x, c, 512);
    int bad = 0;
    for (int i = 0; i < 16; i++) {
        int s = 0;
        for (int l = 0; l < 32; l++)
            s += c[i].qs[l];
        float want = kiri_f16_to_f32(kiri_f32_to_f16((float)s * kiri_f16_to_f32(c[i].d)));
        bad += kiri_f16_to_f32(c[i].s) != want && fabsf(kiri_f16_to_f32(c[i].s) - want) > fabsf(want) * 1e-3f;
    }
    CHECK_EQ_INT(bad, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Dot products
 * ------------------------------------------------------------------------------------------- */

static const int dot_types[] = {KIRI_TYPE_F32, KIRI_TYPE_F16, KIRI_TYPE_BF16, KIRI_TYPE_Q4_0,
                                KIRI_TYPE_Q4_1, KIRI_TYPE_Q5_0, KIRI_TYPE_Q5_1, KIRI_TYPE_Q8_0,
                                KIRI_TYPE_Q4_K, KIRI_TYPE_Q5_K, KIRI_TYPE_Q6_K};

/* For each weight type and a few lengths (one block included): vec_dot(x, act(y)) must equal the
 * double-precision dot of the dequantized rows up to float rounding (rel. 1e-5 of sum |x y|), and
 * the f32 dot of dequant(x) and y up to the activation quantization (1% of sum |x y|). */
static void test_vec_dot_ref(void)
{
    struct kiri_cpu_kernels k;
    kiri_cpu_kernels_init_ref(&k);
    CHECK_STR(k.path, "c");
    static const int64_t lens[] = {256, 512, 4096};
    const int64_t nmax = 4096;
    float *x = xmalloc(nmax * 4), *y = xmalloc(nmax * 4), *xd = xmalloc(nmax * 4), *yd = xmalloc(nmax * 4);
    void *xq = xmalloc(nmax * 4), *yq = xmalloc(nmax * 4 + 1024);
    for (size_t c = 0; c < sizeof dot_types / sizeof dot_types[0]; c++) {
        const int t = dot_types[c], vt = kiri_cpu_vec_dot_type(t);
        CHECK(k.vec_dot[t] != NULL);
        CHECK(vt >= 0 && k.from_float[vt] != NULL);
        if (!k.vec_dot[t] || vt < 0 || !k.from_float[vt])
            continue;
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            const int64_t n = lens[li] == 256 ? kiri_type_block_size(t) * (t >= KIRI_TYPE_Q4_K && t <= KIRI_TYPE_Q6_K ? 1 : 8) : lens[li];
            fill_normal(x, n, 1.0f);
            fill_normal(y, n, 2.0f);
            kiri_cpu_quantize_row(t, x, xq, n);
            kiri_cpu_dequantize_row(t, xq, xd, n);
            k.from_float[vt](y, yq, n);
            dequant_any(vt, yq, yd, n);
            float s = -1;
            k.vec_dot[t](n, &s, xq, yq);
            double exact = 0, mag = 0, full = 0, tol = 0;
            for (int64_t i = 0; i < n; i++) {
                exact += (double)xd[i] * yd[i];
                full += (double)xd[i] * y[i];
                mag += fabs((double)xd[i] * y[i]);
            }
            if (vt == KIRI_TYPE_Q8_1) {
                /* Q4_1/Q5_1 apply their min through Q8_1's s, rounded to half precision: allow
                 * |m s| 2^-11 per block. Both types start with f16 d, f16 m. */
                const struct kiri_block_q8_1 *yb = yq;
                for (int64_t b = 0; b < n / 32; b++) {
                    const kiri_f16 *dm = (const kiri_f16 *)((const char *)xq + b * kiri_type_size(t));
                    tol += fabs(kiri_f16_to_f32(dm[1]) * kiri_f16_to_f32(yb[b].s)) * 0x1p-11;
                }
            }
            tol += 1e-5 * mag + 1e-6;
            if (!(fabs(s - exact) <= tol) || !(fabs(s - full) <= 0.01 * mag))
                fprintf(stderr, "  vec_dot %s n=%lld: %.7g vs %.7g (dequantized act), %.7g (f32 act), sum|xy| %.4g\n",
                        kiri_type_name(t), (long long)n, (double)s, exact, full, mag);
            CHECK_NEAR(s, exact, tol);
            CHECK_NEAR(s, full, 0.01 * mag);
        }
        /* All-zero rows give exactly 0. */
        const int64_t n = kiri_type_block_size(t) == 1 ? 64 : kiri_type_block_size(t);
        memset(x, 0, (size_t)n * 4);
        kiri_cpu_quantize_row(t, x, xq, n);
        k.from_float[vt](x, yq, n);
        float s = -1;
        k.vec_dot[t](n, &s, xq, yq);
        CHECK(s == 0.0f);
    }
    free(x);
    free(y);
    free(xd);
    free(yd);
    free(xq);
    free(yq);
}

/* ---------------------------------------------------------------------------------------------
 * SIMD kernels against the reference
 * ------------------------------------------------------------------------------------------- */

/* Random blocks of a weight type: random bytes, with the f16 scale fields set to random finite
 * values of either sign, so every bit pattern of the quants and packed scales is exercised. */
static void random_weight_row(int t, void *dst, int64_t n)
{
    if (t == KIRI_TYPE_F32 || t == KIRI_TYPE_F16 || t == KIRI_TYPE_BF16) {
        float *tmp = xmalloc((size_t)n * 4);
        fill_normal(tmp, n, 1.0f);
        kiri_cpu_quantize_row(t, tmp, dst, n);
        free(tmp);
        return;
    }
    const size_t ts = kiri_type_size(t), nb = (size_t)(n / kiri_type_block_size(t));
    unsigned char *p = dst;
    for (size_t i = 0; i < nb * ts; i++)
        p[i] = (unsigned char)rnd_u64();
    size_t off[2] = {0, 2}, n_off = 1;
    if (t == KIRI_TYPE_Q4_1 || t == KIRI_TYPE_Q5_1 || t == KIRI_TYPE_Q4_K || t == KIRI_TYPE_Q5_K)
        n_off = 2;
    if (t == KIRI_TYPE_Q6_K)
        off[0] = offsetof(struct kiri_block_q6_K, d);
    for (size_t b = 0; b < nb; b++)
        for (size_t k = 0; k < n_off; k++) {
            kiri_f16 h = kiri_f32_to_f16(rnd_normal() * 0.05f);
            memcpy(p + b * ts + off[k], &h, 2);
        }
}

/* Every AVX2 entry against the reference: the activation quantizers must produce identical bytes;
 * the dot products may differ only by float summation order, bounded by 1e-5 * sum |x y|. */
static void test_avx2_kernels(void)
{
#if !defined(__x86_64__)
    fprintf(stderr, "test_avx2_kernels: SKIPPED: not an x86-64 build\n");
#else
    if (!(kiri_platform_cpu_features() & KIRI_CPU_AVX2)) {
        fprintf(stderr, "test_avx2_kernels: SKIPPED: this CPU lacks AVX2, FMA or F16C\n");
        return;
    }
    struct kiri_cpu_kernels ref, fast;
    kiri_cpu_kernels_init_ref(&ref);
    kiri_cpu_kernels_init_ref(&fast);
    kiri_cpu_kernels_init_avx2(&fast);
    CHECK_STR(fast.path, "avx2");
    const int64_t nmax = 4096;
    float *x = xmalloc(nmax * 4), *xd = xmalloc(nmax * 4), *yd = xmalloc(nmax * 4);
    unsigned char *a = xmalloc(nmax * 4 + 1024), *b = xmalloc(nmax * 4 + 1024);
    void *w = xmalloc(nmax * 4);
    int n_fast = 0;

    /* Activation conversions: normal data, exact ties (k/2 steps), +-amax in one block, zeros;
     * for F16 also arbitrary bit patterns. */
    for (int t = 0; t < KIRI_TYPE_COUNT; t++) {
        if (!fast.from_float[t] || fast.from_float[t] == ref.from_float[t])
            continue;
        n_fast++;
        for (int c = 0; c < 5; c++) {
            const int64_t n = c == 3 ? kiri_type_block_size(t) : c == 4 ? nmax - 3 : nmax;
            if (c == 4 && t != KIRI_TYPE_F16)
                continue;
            fill_normal(x, n, c == 0 ? 1.0f : 100.0f);
            if (c == 1)
                for (int64_t i = 0; i < n; i++)
                    x[i] = roundf(x[i]) * 0.5f;
            if (c == 2) {
                x[5] = -500.0f;
                x[9] = 500.0f;
                x[300] = 600.0f;
                x[301] = -600.0f;
                memset(x + 512, 0, 256 * 4);
            }
            if (c == 4) /* any float: NaNs, infinities, subnormals, overflow, a ragged tail */
                for (int64_t i = 0; i < n; i++) {
                    uint32_t u = (uint32_t)rnd_u64();
                    x[i] = float_of(i % 3 ? u : (u & 0x8fffffffu) | 0x30000000u);
                }
            memset(a, 0x55, row_bytes(t, n));
            memset(b, 0xAA, row_bytes(t, n));
            ref.from_float[t](x, a, n);
            fast.from_float[t](x, b, n);
            int same = memcmp(a, b, row_bytes(t, n)) == 0;
            if (!same)
                fprintf(stderr, "  avx2 from_float %s case %d differs from the reference\n", kiri_type_name(t), c);
            CHECK(same);
        }
    }

    /* Dot products. */
    for (int t = 0; t < KIRI_TYPE_COUNT; t++) {
        if (!fast.vec_dot[t] || fast.vec_dot[t] == ref.vec_dot[t])
            continue;
        n_fast++;
        const int vt = kiri_cpu_vec_dot_type(t);
        const int64_t bs = kiri_type_block_size(t);
        const int64_t lens[] = {1, 7, 33, 1, 3, 16, nmax};
        for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
            /* Odd lengths only for the plain types; block counts for the others. */
            int64_t n = bs == 1 ? (li < 3 ? lens[li] : lens[li] * 32 + (int64_t)li) : lens[li] * bs;
            if (li < 3 && bs != 1)
                continue;
            if (n > nmax)
                n = nmax;
            for (int rep = 0; rep < 4; rep++) {
                random_weight_row(t, w, n);
                fill_normal(x, n, rep == 3 ? 50.0f : 1.0f);
                ref.from_float[vt](x, a, n);
                float s_ref = -1, s_fast = -2;
                ref.vec_dot[t](n, &s_ref, w, a);
                fast.vec_dot[t](n, &s_fast, w, a);
                dequant_any(t, w, xd, n);
                dequant_any(vt, a, yd, n);
                double mag = 0;
                for (int64_t i = 0; i < n; i++)
                    mag += fabs((double)xd[i] * yd[i]);
                const double tol = 1e-5 * mag + 1e-30;
                if (!(fabs((double)s_ref - s_fast) <= tol))
                    fprintf(stderr, "  avx2 vec_dot %s n=%lld: %.9g vs reference %.9g (tol %.3g)\n",
                            kiri_type_name(t), (long long)n, (double)s_fast, (double)s_ref, tol);
                CHECK_NEAR(s_fast, s_ref, tol);
            }
        }
    }
    fprintf(stderr, "test_avx2_kernels: %d AVX2 kernels checked against the reference\n", n_fast);
    CHECK(n_fast >= 15);
    free(x);
    free(xd);
    free(yd);
    free(a);
    free(b);
    free(w);
#endif
}

TEST_MAIN(test_f16_all_values, test_f16_rounding, test_bf16, test_quant_roundtrip, test_quant_contract,
          test_quant_edge, test_q8_K, test_vec_dot_ref, test_avx2_kernels)
