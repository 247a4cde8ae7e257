/* Tests of kernels/neon/quants_neon.c and gemm_neon.c against the portable reference kernels
 * (kernels/cpu/quants.c) on random inputs: every NEON entry of the kernel table, once with the base
 * NEON kernels and once with the SDOT (dotprod) kernels when the CPU has them; the gemm tiles once
 * with SDOT and once with SMMLA (i8mm) when the CPU has them, by building the table with the
 * features masked.
 *
 * Tolerances:
 * - Activation conversions (F16, Q8_0, Q8_1, Q8_K) must write the reference's bytes exactly.
 * - Dot products compute the same integer block sums as the reference and add the scaled block
 *   sums in another order (and with fused multiply-adds), so they must agree within
 *   1e-5 * sum |x_i * y_i| over the dequantized values; a single wrong element of a 4096-long row
 *   is already 20 times that. Every value of a gemm tile is held to the same bound against the
 *   reference vec_dot of its row and token, and the floats beside the tile must stay untouched.
 *
 * Only built as a test on aarch64 (under qemu-aarch64 when cross-compiled: QEMU_CPU=max has
 * dotprod, QEMU_CPU=cortex-a72 does not). Elsewhere the program says so and exits 0. */
#if !defined(__aarch64__)
#include <stdio.h>

int main(void)
{
    printf("test_neon: not aarch64\n");
    return 0;
}
#else

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "../kernels/neon/neon_kernels.h"
#include "platform.h"
#include "test.h"

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static uint64_t rng = 0x2545F4914F6CDD1Dull;

static uint64_t rnd_u64(void) /* xorshift64* */
{
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return rng * 0x2545F4914F6CDD1Dull;
}

static double rnd_unit(void) /* (0, 1) */
{
    return ((double)(rnd_u64() >> 11) + 0.5) / 9007199254740992.0;
}

static float rnd_normal(void)
{
    return (float)(sqrt(-2.0 * log(rnd_unit())) * cos(6.283185307179586 * rnd_unit()));
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_neon: out of memory\n");
        exit(1);
    }
    return p;
}

static size_t row_bytes(int type, int64_t n)
{
    return (size_t)(n / kiri_type_block_size(type)) * kiri_type_size(type);
}

/* Any weight row, or an activation row (Q8_1 and Q8_K have no dequantizer in the API). */
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

static kiri_f16 small_f16(void)
{
    return kiri_f32_to_f16(rnd_normal() * 0.01f);
}

/* A row of random bytes, so every bit pattern of the quants and sub-block scales occurs
 * (Q8_0's -128 and Q6_K's -128 scale included), with the half-precision scales and mins
 * replaced by small finite values. */
static void random_weights(int type, void *row, int64_t n)
{
    uint8_t *p = row;
    const size_t size = row_bytes(type, n), bsize = kiri_type_size(type);
    for (size_t i = 0; i < size; i++)
        p[i] = (uint8_t)rnd_u64();
    for (size_t off = 0; off < size; off += bsize) {
        void *b = p + off;
        switch (type) {
        case KIRI_TYPE_Q4_0: ((struct kiri_block_q4_0 *)b)->d = small_f16(); break;
        case KIRI_TYPE_Q5_0: ((struct kiri_block_q5_0 *)b)->d = small_f16(); break;
        case KIRI_TYPE_Q8_0: ((struct kiri_block_q8_0 *)b)->d = small_f16(); break;
        case KIRI_TYPE_Q4_1:
            ((struct kiri_block_q4_1 *)b)->d = small_f16();
            ((struct kiri_block_q4_1 *)b)->m = small_f16();
            break;
        case KIRI_TYPE_Q5_1:
            ((struct kiri_block_q5_1 *)b)->d = small_f16();
            ((struct kiri_block_q5_1 *)b)->m = small_f16();
            break;
        case KIRI_TYPE_Q4_K:
            ((struct kiri_block_q4_K *)b)->d = small_f16();
            ((struct kiri_block_q4_K *)b)->dmin = small_f16();
            break;
        case KIRI_TYPE_Q5_K:
            ((struct kiri_block_q5_K *)b)->d = small_f16();
            ((struct kiri_block_q5_K *)b)->dmin = small_f16();
            break;
        case KIRI_TYPE_Q6_K: ((struct kiri_block_q6_K *)b)->d = small_f16(); break;
        default: break;
        }
    }
}

/* The kernel table of one path: the reference, then the NEON entries for these features. */
static void neon_table(struct kiri_cpu_kernels *k, uint32_t features)
{
    kiri_cpu_kernels_init_ref(k);
    kiri_cpu_kernels_init_neon(k, features);
}

static int have_dotprod(void)
{
    return (kiri_platform_cpu_features() & KIRI_CPU_DOTPROD) != 0;
}

/* ---------------------------------------------------------------------------------------------
 * The table
 * ------------------------------------------------------------------------------------------- */

static const int weight_types[] = {
    KIRI_TYPE_F32,  KIRI_TYPE_F16,  KIRI_TYPE_BF16, KIRI_TYPE_Q4_0, KIRI_TYPE_Q4_1, KIRI_TYPE_Q5_0,
    KIRI_TYPE_Q5_1, KIRI_TYPE_Q8_0, KIRI_TYPE_Q4_K, KIRI_TYPE_Q5_K, KIRI_TYPE_Q6_K,
};
#define N_WEIGHT_TYPES (sizeof weight_types / sizeof weight_types[0])

static const int act_types[] = {KIRI_TYPE_F16, KIRI_TYPE_Q8_0, KIRI_TYPE_Q8_1, KIRI_TYPE_Q8_K};
#define N_ACT_TYPES (sizeof act_types / sizeof act_types[0])

static void test_table(void)
{
    struct kiri_cpu_kernels ref, base, sdot;
    kiri_cpu_kernels_init_ref(&ref);
    neon_table(&base, KIRI_CPU_NEON);
    neon_table(&sdot, KIRI_CPU_NEON | KIRI_CPU_DOTPROD);
    CHECK_STR(base.path, "neon");
    CHECK_STR(sdot.path, "neon+dotprod");
    struct kiri_cpu_kernels mm;
    neon_table(&mm, KIRI_CPU_NEON | KIRI_CPU_DOTPROD | KIRI_CPU_I8MM);
    CHECK_STR(mm.path, "neon+dotprod+i8mm");
    for (size_t i = 0; i < N_WEIGHT_TYPES; i++) {
        const int t = weight_types[i];
        CHECK(base.vec_dot[t] != NULL && base.vec_dot[t] != ref.vec_dot[t]);
        CHECK(sdot.vec_dot[t] != NULL && sdot.vec_dot[t] != ref.vec_dot[t]);
        /* The float products have one version; every 8-bit product has an SDOT one. */
        if (t == KIRI_TYPE_F32 || t == KIRI_TYPE_F16 || t == KIRI_TYPE_BF16)
            CHECK(base.vec_dot[t] == sdot.vec_dot[t]);
        else
            CHECK(base.vec_dot[t] != sdot.vec_dot[t]);
    }
    for (size_t i = 0; i < N_ACT_TYPES; i++)
        CHECK(base.from_float[act_types[i]] != ref.from_float[act_types[i]]);
    /* Entries without a NEON version keep the reference. */
    CHECK(base.from_float[KIRI_TYPE_F32] == ref.from_float[KIRI_TYPE_F32]);
    CHECK(base.from_float[KIRI_TYPE_BF16] == ref.from_float[KIRI_TYPE_BF16]);
    CHECK(base.vec_dot[KIRI_TYPE_Q8_K] == NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Activation conversions: the same bytes as the reference
 * ------------------------------------------------------------------------------------------- */

enum row_kind { ROW_NORMAL, ROW_TINY, ROW_LARGE, ROW_ZERO, ROW_TIES, ROW_TIES_NEG, ROW_KIND_COUNT };

/* Rows that stress the rounding rules: in ROW_TIES each block's largest magnitude is 127, so
 * Q8_0's and Q8_K's scales are exactly 1 and the halves (k + 0.5) are exact ties; ROW_TIES has
 * -127 first and +127 later (ROW_TIES_NEG the other way round) for Q8_K's first-on-ties rule. */
static void fill_row(float *x, int64_t n, int kind)
{
    for (int64_t i = 0; i < n; i++) {
        switch (kind) {
        case ROW_NORMAL: x[i] = rnd_normal(); break;
        case ROW_TINY: x[i] = rnd_normal() * 1e-6f; break;
        case ROW_LARGE: x[i] = rnd_normal() * 3e3f; break;
        case ROW_ZERO: x[i] = (i % 5 == 0) ? -0.0f : 0.0f; break;
        default: {
            const int k = (int)(rnd_u64() % 253) - 126; /* -126 .. 126 */
            x[i] = (float)k + (k < 126 ? 0.5f : -0.5f);
            if (i % 32 == 3)
                x[i] = kind == ROW_TIES ? -127.0f : 127.0f;
            if (i % 32 == 9)
                x[i] = kind == ROW_TIES ? 127.0f : -127.0f;
            break;
        }
        }
    }
}

static int bytes_differ(const void *a, const void *b, size_t n, size_t *at)
{
    const uint8_t *p = a, *q = b;
    for (size_t i = 0; i < n; i++)
        if (p[i] != q[i]) {
            *at = i;
            return 1;
        }
    return 0;
}

static void check_from_float(const struct kiri_cpu_kernels *ref, const struct kiri_cpu_kernels *k)
{
    static const int64_t lengths[] = {256, 512, 1280, 4096};
    int checked = 0;
    for (size_t ti = 0; ti < N_ACT_TYPES; ti++) {
        const int t = act_types[ti];
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            const int64_t n = lengths[li] + (t == KIRI_TYPE_F16 ? 7 : 0); /* F16: a scalar tail */
            const size_t size = row_bytes(t, n);
            float *x = xmalloc((size_t)n * sizeof *x);
            void *want = xmalloc(size), *got = xmalloc(size);
            for (int kind = 0; kind < ROW_KIND_COUNT; kind++) {
                fill_row(x, n, kind);
                memset(want, 0xAA, size);
                memset(got, 0x55, size);
                ref->from_float[t](x, want, n);
                k->from_float[t](x, got, n);
                size_t at = 0;
                const int differ = bytes_differ(want, got, size, &at);
                CHECK(!differ);
                if (differ)
                    fprintf(stderr, "  %s from_float %s n=%lld row kind %d: byte %zu is %02x, want %02x\n",
                            k->path, kiri_type_name(t), (long long)n, kind, at,
                            ((uint8_t *)got)[at], ((uint8_t *)want)[at]);
                checked++;
            }
            free(x);
            free(want);
            free(got);
        }
    }
    fprintf(stderr, "test_neon: %s: %d activation rows byte-identical with the reference\n", k->path, checked);
}

/* F16 narrowing of the values where rounding rules show: ties, overflow, subnormals, NaNs with
 * payloads (quieted, top payload bits kept), infinities and signed zeros; 16 of them so the
 * vector loop, not the scalar tail, converts them. */
static void check_f16_specials(const struct kiri_cpu_kernels *ref, const struct kiri_cpu_kernels *k)
{
    const float x[32] = {
        1.0f, -2.0f, 65504.0f, 65519.99f, 65520.0f, -1e10f, 1.0f + 0x1p-11f, 1.0f + 0x3p-11f,
        0x1p-24f, 0x1p-25f, 0x1.000002p-25f, 0x3p-26f, 0x3p-25f, 0x5p-25f, 0x1.ff8p-15f, 0x1.ffcp-15f,
        -0.0f, 0.0f, 1e-30f, -1e-30f, float_of(0x7f800000u), float_of(0xff800000u),
        float_of(0x7fc00000u), float_of(0x7f800001u), float_of(0xffa5a5a5u), float_of(0x7fdfffffu),
        0x1p-14f, -0x1p-14f, 3.14159f, -65536.0f, 1e-8f, 0x1.8p-24f,
    };
    kiri_f16 want[32], got[32];
    ref->from_float[KIRI_TYPE_F16](x, want, 32);
    k->from_float[KIRI_TYPE_F16](x, got, 32);
    for (int i = 0; i < 32; i++)
        CHECK_EQ_INT(got[i], want[i]);
}

static void test_from_float_neon(void)
{
    struct kiri_cpu_kernels ref, k;
    kiri_cpu_kernels_init_ref(&ref);
    neon_table(&k, KIRI_CPU_NEON);
    check_from_float(&ref, &k);
    check_f16_specials(&ref, &k);
}

/* The conversions do not depend on dotprod, but the table a dotprod CPU uses is checked whole. */
static void test_from_float_dotprod(void)
{
    if (!have_dotprod()) {
        fprintf(stderr, "test_from_float_dotprod: SKIPPED: this CPU lacks dotprod\n");
        return;
    }
    struct kiri_cpu_kernels ref, k;
    kiri_cpu_kernels_init_ref(&ref);
    neon_table(&k, KIRI_CPU_NEON | KIRI_CPU_DOTPROD);
    check_from_float(&ref, &k);
    check_f16_specials(&ref, &k);
}

/* ---------------------------------------------------------------------------------------------
 * Dot products: the reference's value within 1e-5 * sum |x_i y_i|
 * ------------------------------------------------------------------------------------------- */

#define DOT_REL_TOL 1e-5

/* One product of weight row type t against its activation type, n values; random_bytes picks
 * the weight source (random bytes, or the reference quantizer applied to normal values).
 * Returns 1 when the NEON value is within tolerance. */
static int check_dot(const struct kiri_cpu_kernels *ref, const struct kiri_cpu_kernels *k, int t,
                     int64_t n, int random_bytes)
{
    const int vt = kiri_cpu_vec_dot_type(t);
    float *xf = xmalloc((size_t)n * sizeof *xf), *yf = xmalloc((size_t)n * sizeof *yf);
    void *xq = xmalloc(row_bytes(t, n)), *yq = xmalloc(row_bytes(vt, n));

    if (random_bytes) {
        random_weights(t, xq, n);
    } else {
        for (int64_t i = 0; i < n; i++)
            xf[i] = rnd_normal();
        kiri_cpu_quantize_row(t, xf, xq, n);
    }
    for (int64_t i = 0; i < n; i++)
        yf[i] = rnd_normal();
    ref->from_float[vt](yf, yq, n);

    float want = -1.0f, got = -2.0f;
    ref->vec_dot[t](n, &want, xq, yq);
    k->vec_dot[t](n, &got, xq, yq);

    dequant_any(t, xq, xf, n);
    dequant_any(vt, yq, yf, n);
    double sabs = 0;
    for (int64_t i = 0; i < n; i++)
        sabs += fabs((double)xf[i] * (double)yf[i]);
    const double tol = DOT_REL_TOL * sabs;
    const int ok = fabs((double)got - (double)want) <= tol;
    CHECK(ok);
    if (!ok)
        fprintf(stderr, "  %s vec_dot %s (%s weights) n=%lld: %.9g vs reference %.9g (tol %.3g)\n",
                k->path, kiri_type_name(t), random_bytes ? "random-byte" : "quantized",
                (long long)n, (double)got, (double)want, tol);
    free(xf);
    free(yf);
    free(xq);
    free(yq);
    return ok;
}

static void check_vec_dots(const struct kiri_cpu_kernels *ref, const struct kiri_cpu_kernels *k)
{
    static const int64_t len_float[] = {0, 1, 3, 4, 7, 15, 16, 17, 33, 100, 1000, 4096};
    static const int64_t len_32[] = {32, 64, 96, 160, 1024, 4128};
    static const int64_t len_k[] = {256, 512, 768, 4096};
    int checked = 0;
    for (size_t ti = 0; ti < N_WEIGHT_TYPES; ti++) {
        const int t = weight_types[ti];
        const int64_t bs = kiri_type_block_size(t);
        const int64_t *len = bs == 1 ? len_float : bs == 32 ? len_32 : len_k;
        const size_t n_len = bs == 1 ? sizeof len_float / sizeof len_float[0]
                           : bs == 32 ? sizeof len_32 / sizeof len_32[0]
                                      : sizeof len_k / sizeof len_k[0];
        for (size_t li = 0; li < n_len; li++) {
            for (int rep = 0; rep < 3; rep++) {
                check_dot(ref, k, t, len[li], 0);
                checked++;
                if (bs > 1) {
                    check_dot(ref, k, t, len[li], 1);
                    checked++;
                }
            }
        }
    }
    fprintf(stderr, "test_neon: %s: %d dot products within %g * sum|x*y| of the reference\n", k->path,
            checked, DOT_REL_TOL);
}

static void test_vec_dot_neon(void)
{
    struct kiri_cpu_kernels ref, k;
    kiri_cpu_kernels_init_ref(&ref);
    neon_table(&k, KIRI_CPU_NEON);
    check_vec_dots(&ref, &k);
}

static void test_vec_dot_dotprod(void)
{
    if (!have_dotprod()) {
        fprintf(stderr, "test_vec_dot_dotprod: SKIPPED: this CPU lacks dotprod (SDOT)\n");
        return;
    }
    struct kiri_cpu_kernels ref, k;
    kiri_cpu_kernels_init_ref(&ref);
    neon_table(&k, KIRI_CPU_NEON | KIRI_CPU_DOTPROD);
    check_vec_dots(&ref, &k);
}

/* Extremes the random rows rarely reach: all quants at their most negative or most positive
 * against an activation of all -127 or all 127, where the integer sums are largest. */
static void test_vec_dot_extremes(void)
{
    struct kiri_cpu_kernels ref, k[2];
    kiri_cpu_kernels_init_ref(&ref);
    neon_table(&k[0], KIRI_CPU_NEON);
    neon_table(&k[1], KIRI_CPU_NEON | KIRI_CPU_DOTPROD);
    const int n_paths = have_dotprod() ? 2 : 1;
    static const int types[] = {KIRI_TYPE_Q4_0, KIRI_TYPE_Q4_1, KIRI_TYPE_Q5_0, KIRI_TYPE_Q5_1,
                                KIRI_TYPE_Q8_0, KIRI_TYPE_Q4_K, KIRI_TYPE_Q5_K, KIRI_TYPE_Q6_K};
    const int64_t n = 512;
    uint8_t x[512 * 2], y[sizeof(struct kiri_block_q8_K) * 2];
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int t = types[ti], vt = kiri_cpu_vec_dot_type(t);
        for (int fill = 0; fill < 4; fill++) {
            float yf[512];
            for (int i = 0; i < n; i++)
                yf[i] = (fill & 2) ? -1.0f : 1.0f;
            ref.from_float[vt](yf, y, n);
            memset(x, (fill & 1) ? 0xFF : 0x00, row_bytes(t, n));
            /* Scales and mins: 0xFF bytes are the largest (Q6_K's scale -1), 0x80 the most negative. */
            if (t == KIRI_TYPE_Q6_K)
                for (int b = 0; b < 2; b++)
                    memset(((struct kiri_block_q6_K *)x)[b].scales, (fill & 1) ? 0x80 : 0x7F, 16);
            for (size_t off = 0; off < row_bytes(t, n); off += kiri_type_size(t)) {
                kiri_f16 one = kiri_f32_to_f16(1.0f);
                if (t == KIRI_TYPE_Q6_K)
                    memcpy(x + off + offsetof(struct kiri_block_q6_K, d), &one, 2);
                else
                    memcpy(x + off, &one, 2); /* d first in every other block */
                if (t == KIRI_TYPE_Q4_1 || t == KIRI_TYPE_Q5_1 || t == KIRI_TYPE_Q4_K || t == KIRI_TYPE_Q5_K)
                    memcpy(x + off + 2, &one, 2); /* m or dmin */
            }
            float want;
            ref.vec_dot[t](n, &want, x, y);
            for (int p = 0; p < n_paths; p++) {
                float got;
                k[p].vec_dot[t](n, &got, x, y);
                CHECK_NEAR(got, want, 1e-6 * fabs((double)want));
            }
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Matrix-product tiles (gemm_neon.c): every (row, token) of a tile within 1e-5 * sum |x_i y_i|
 * of the reference vec_dot, with the tile's other floats untouched
 * ------------------------------------------------------------------------------------------- */

static int have_i8mm(void)
{
    const uint32_t need = KIRI_CPU_DOTPROD | KIRI_CPU_I8MM;
    return (kiri_platform_cpu_features() & need) == need;
}

static const int gemm_types[] = {KIRI_TYPE_Q4_0, KIRI_TYPE_Q8_0, KIRI_TYPE_Q4_K, KIRI_TYPE_Q6_K};
#define N_GEMM_TYPES (sizeof gemm_types / sizeof gemm_types[0])

/* Without dotprod there is no gemm (the backend falls back to vec_dot); dotprod gives the SDOT
 * tiles, dotprod + i8mm other (SMMLA) tiles; i8mm alone is not a CPU that exists and gives none. */
static void test_gemm_table(void)
{
    struct kiri_cpu_kernels base, i8only, sdot, mmla, host;
    neon_table(&base, KIRI_CPU_NEON);
    neon_table(&i8only, KIRI_CPU_NEON | KIRI_CPU_I8MM);
    neon_table(&sdot, KIRI_CPU_NEON | KIRI_CPU_DOTPROD);
    neon_table(&mmla, KIRI_CPU_NEON | KIRI_CPU_DOTPROD | KIRI_CPU_I8MM);
    neon_table(&host, kiri_platform_cpu_features());
    for (int t = 0; t < KIRI_TYPE_COUNT; t++) {
        CHECK(base.gemm[t] == NULL);
        CHECK(i8only.gemm[t] == NULL);
        if (!have_dotprod())
            CHECK(host.gemm[t] == NULL);
    }
    for (size_t i = 0; i < N_GEMM_TYPES; i++) {
        const int t = gemm_types[i];
        CHECK(sdot.gemm[t] != NULL);
        CHECK(mmla.gemm[t] != NULL);
        CHECK(sdot.gemm[t] != mmla.gemm[t]);
        if (have_dotprod())
            CHECK(host.gemm[t] == (have_i8mm() ? mmla.gemm[t] : sdot.gemm[t]));
    }
    fprintf(stderr, "test_neon: host features: dotprod %s, i8mm %s; gemm entries %s\n",
            have_dotprod() ? "yes" : "no", have_i8mm() ? "yes" : "no",
            host.gemm[KIRI_TYPE_Q4_0] ? "installed" : "NULL");
}

/* Weight rows for a gemm check: random bytes, quantized normal values, or (extreme) every quant
 * at its most negative (even rows) or most positive (odd rows) with unit super-block scales and
 * the largest sub-block scales and mins (Q4_K: 63; Q6_K: -128). */
enum gemm_fill { GEMM_RANDOM_BYTES, GEMM_QUANTIZED, GEMM_EXTREME };

static void gemm_weights(int t, void *row, int64_t k, int64_t r, int fill, float *scratch)
{
    if (fill == GEMM_RANDOM_BYTES) {
        random_weights(t, row, k);
    } else if (fill == GEMM_QUANTIZED) {
        for (int64_t i = 0; i < k; i++)
            scratch[i] = rnd_normal();
        kiri_cpu_quantize_row(t, scratch, row, k);
    } else {
        /* Q4_0 nibble 0 is -8, 15 is 7; Q8_0 byte 0x80 is -128, 0x7F is 127; Q4_K nibbles 0..15
         * (a min of 63 makes 0 the most negative); Q6_K 6-bit quants 0..63 are -32..31. */
        const int hi = (int)(r & 1);
        const uint8_t q = t == KIRI_TYPE_Q8_0 ? (hi ? 0x7F : 0x80) : (hi ? 0xFF : 0x00);
        const kiri_f16 one = kiri_f32_to_f16(1.0f);
        const size_t bsize = kiri_type_size(t);
        uint8_t *p = row;
        for (size_t off = 0; off < row_bytes(t, k); off += bsize) {
            memset(p + off, q, bsize);
            if (t == KIRI_TYPE_Q6_K) {
                struct kiri_block_q6_K *b = (struct kiri_block_q6_K *)(p + off);
                memset(b->scales, 0x80, sizeof b->scales);
                b->d = one;
            } else if (t == KIRI_TYPE_Q4_K) {
                struct kiri_block_q4_K *b = (struct kiri_block_q4_K *)(p + off);
                memset(b->scales, 0xFF, sizeof b->scales);
                b->d = b->dmin = one;
            } else {
                memcpy(p + off, &one, sizeof one); /* d first in Q4_0 and Q8_0 */
            }
        }
    }
}

/* One tile of nr rows x nt tokens over k values of weight type t; strides padded when pad.
 * Extreme tiles take activations of all 127 (even tokens) or all -127 (odd tokens).
 * Returns the number of (row, token) values checked. */
static int check_gemm(const struct kiri_cpu_kernels *ref, const struct kiri_cpu_kernels *k, int t,
                      int64_t len, int64_t nr, int64_t nt, int fill, int pad)
{
    const int vt = kiri_cpu_vec_dot_type(t);
    const size_t ws = row_bytes(t, len) + (pad ? 2 * kiri_type_size(t) + 2 : 0);
    /* Padded strides keep the blocks' alignment (2 bytes; Q8_K's float scale 4). */
    const size_t as = row_bytes(vt, len) + (pad ? kiri_type_size(vt) + 4 : 0);
    const size_t ds = (size_t)nr + (pad ? 5 : 0);
    uint8_t *w = xmalloc(ws * (size_t)nr), *a = xmalloc(as * (size_t)nt);
    float *xf = xmalloc((size_t)len * sizeof *xf), *wf = xmalloc((size_t)(len * nr) * sizeof *wf);
    float *af = xmalloc((size_t)(len * nt) * sizeof *af);
    float *dst = xmalloc(ds * (size_t)nt * sizeof *dst);
    const float sentinel = -12345.0f;

    memset(w, 0xA5, ws * (size_t)nr);
    memset(a, 0x5A, as * (size_t)nt);
    for (int64_t r = 0; r < nr; r++) {
        gemm_weights(t, w + (size_t)r * ws, len, r, fill, xf);
        dequant_any(t, w + (size_t)r * ws, wf + r * len, len);
    }
    for (int64_t i = 0; i < nt; i++) {
        for (int64_t j = 0; j < len; j++)
            xf[j] = fill == GEMM_EXTREME ? ((i & 1) ? -1.0f : 1.0f) : rnd_normal();
        ref->from_float[vt](xf, a + (size_t)i * as, len);
        dequant_any(vt, a + (size_t)i * as, af + i * len, len);
    }
    for (size_t i = 0; i < ds * (size_t)nt; i++)
        dst[i] = sentinel;

    k->gemm[t](len, w, ws, a, as, dst, ds, nr, nt);

    int bad = 0;
    for (int64_t i = 0; i < nt; i++) {
        for (int64_t r = 0; r < nr; r++) {
            float want = -1.0f;
            ref->vec_dot[t](len, &want, w + (size_t)r * ws, a + (size_t)i * as);
            double sabs = 0;
            for (int64_t j = 0; j < len; j++)
                sabs += fabs((double)wf[r * len + j] * (double)af[i * len + j]);
            const double tol = fill == GEMM_EXTREME ? 1e-6 * fabs((double)want) : DOT_REL_TOL * sabs;
            const float got = dst[(size_t)i * ds + (size_t)r];
            if (!(fabs((double)got - (double)want) <= tol)) {
                if (bad++ < 3)
                    fprintf(stderr, "  %s gemm %s k=%lld tile %lldx%lld fill %d: [t %lld, r %lld] %.9g vs reference %.9g (tol %.3g)\n",
                            k->path, kiri_type_name(t), (long long)len, (long long)nr, (long long)nt,
                            fill, (long long)i, (long long)r, (double)got, (double)want, tol);
            }
        }
        for (size_t r = (size_t)nr; r < ds; r++)
            if (dst[(size_t)i * ds + r] != sentinel && bad++ < 3)
                fprintf(stderr, "  %s gemm %s tile %lldx%lld wrote past row %lld of token %lld\n", k->path,
                        kiri_type_name(t), (long long)nr, (long long)nt, (long long)nr, (long long)i);
    }
    CHECK(bad == 0);
    free(w);
    free(a);
    free(xf);
    free(wf);
    free(af);
    free(dst);
    return (int)(nr * nt);
}

static void check_gemms(const struct kiri_cpu_kernels *ref, const struct kiri_cpu_kernels *k)
{
    static const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 9, 17};
    /* In values: 1, 3 and 8 blocks of 32, or 1 and 3 super-blocks of 256. */
    static const int64_t small_k[] = {32, 96, 256}, small_k256[] = {256, 768};
    /* Past one pass over the token side (64 blocks of 32, 16 of 256), several passes with a
     * partial last one, and a model's width. */
    static const int64_t large_k[] = {2080, 9600, 4096}, large_k256[] = {4352, 9728, 4096};
    static const int64_t large_tiles[][2] = {{1, 1}, {4, 8}, {5, 9}, {17, 3}, {7, 17}, {64, 2}, {3, 1}};
    const size_t n_sizes = sizeof sizes / sizeof sizes[0];
    int tiles = 0, values = 0;
    for (size_t ti = 0; ti < N_GEMM_TYPES; ti++) {
        const int t = gemm_types[ti];
        CHECK(k->gemm[t] != NULL);
        if (!k->gemm[t])
            continue;
        /* No whole block: every value 0, as the reference's empty sum. */
        {
            float z[3 * 6];
            const int8_t none[1] = {0};
            for (int i = 0; i < 3 * 6; i++)
                z[i] = -1.0f;
            k->gemm[t](0, none, 0, none, 0, z, 6, 5, 3);
            for (int i = 0; i < 3 * 6; i++)
                CHECK(z[i] == (i % 6 < 5 ? 0.0f : -1.0f));
        }
        const int kq = kiri_type_block_size(t) == KIRI_QK_K;
        const int64_t *sk = kq ? small_k256 : small_k, *lk = kq ? large_k256 : large_k;
        const size_t n_sk = kq ? 2 : 3;
        for (size_t ki = 0; ki < n_sk; ki++)
            for (size_t ri = 0; ri < n_sizes; ri++)
                for (size_t ci = 0; ci < n_sizes; ci++, tiles++)
                    values += check_gemm(ref, k, t, sk[ki], sizes[ri], sizes[ci],
                                         (int)((ri + ci + ki) % 2), (int)((ri + ci) % 3 == 0));
        for (size_t ki = 0; ki < 3; ki++)
            for (size_t li = 0; li < sizeof large_tiles / sizeof large_tiles[0]; li++, tiles++)
                values += check_gemm(ref, k, t, lk[ki], large_tiles[li][0], large_tiles[li][1],
                                     (int)(li % 2), (int)(li % 3 == 1));
        /* Extremes: the largest block sums, both signs, over more than one pass. */
        for (size_t li = 0; li < sizeof large_tiles / sizeof large_tiles[0]; li++, tiles++)
            values += check_gemm(ref, k, t, kq ? 4352 : 4128, large_tiles[li][0], large_tiles[li][1],
                                 GEMM_EXTREME, 0);
    }
    fprintf(stderr, "test_neon: %s gemm: %d tiles, %d values checked against the reference (tol %g * sum|x*y|)\n",
            k->path, tiles, values, DOT_REL_TOL);
}

/* The SDOT tiles, also on a CPU with i8mm (its table takes the SMMLA ones). */
static void test_gemm_sdot(void)
{
    if (!have_dotprod()) {
        fprintf(stderr, "test_gemm_sdot: SKIPPED: this CPU lacks dotprod (SDOT)\n");
        return;
    }
    struct kiri_cpu_kernels ref, k;
    kiri_cpu_kernels_init_ref(&ref);
    neon_table(&k, KIRI_CPU_NEON | KIRI_CPU_DOTPROD);
    k.path = "neon+dotprod (SDOT)";
    check_gemms(&ref, &k);
}

static void test_gemm_i8mm(void)
{
    if (!have_i8mm()) {
        fprintf(stderr, "test_gemm_i8mm: SKIPPED: this CPU lacks i8mm (SMMLA)\n");
        return;
    }
    struct kiri_cpu_kernels ref, k;
    kiri_cpu_kernels_init_ref(&ref);
    neon_table(&k, KIRI_CPU_NEON | KIRI_CPU_DOTPROD | KIRI_CPU_I8MM);
    k.path = "neon+dotprod+i8mm (SMMLA)";
    check_gemms(&ref, &k);
}

TEST_MAIN(test_table, test_from_float_neon, test_from_float_dotprod, test_vec_dot_neon,
          test_vec_dot_dotprod, test_vec_dot_extremes, test_gemm_table, test_gemm_sdot, test_gemm_i8mm)

#endif
