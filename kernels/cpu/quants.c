/* The portable C reference for GGUF's element types: half-precision conversions, dequantization
 * and quantization of rows, and the quantized dot products a CPU matmul is made of.
 *
 * What must stay true:
 * - Dequantization is bit-exact with the GGUF definitions (checked against gguf-py's NumPy code by
 *   tests/test_dequant.py). That fixes the order of the float operations: for example a K-quant
 *   value is (d * scale) * q - (dmin * min), each product rounded to float before the next step.
 *   This file must therefore be compiled without floating-point contraction into FMA
 *   (-ffp-contract=off; GCC's ISO C modes and the pragma below give that).
 * - The weight quantizers of the legacy types (Q4_0 ... Q8_0) produce the bytes the format's
 *   reference produces; the K-quant quantizers search scales and mins per sub-block in the same
 *   spirit (weighted least squares over a few candidate scales), so their output is close to, not
 *   byte-identical with, other implementations.
 * - Dot products work the way the formats intend: integer sums per (sub-)block, then one float
 *   scale per block. Faster kernels (quants_avx2.c) must agree with these within rounding.
 */
#include "cpu_kernels.h"

#include <math.h>
#include <string.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

/* ---------------------------------------------------------------------------------------------
 * Scalar conversions
 * ------------------------------------------------------------------------------------------- */

static inline uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Widening is exact, so every binary16 value (NaN payloads included) has one right answer. */
float kiri_f16_to_f32(kiri_f16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu;
    uint32_t m = h & 0x3ffu;

    if (e == 0x1f)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e != 0)
        return bits_f32(sign | ((e + 112) << 23) | (m << 13));
    if (m == 0)
        return bits_f32(sign);
    /* Subnormal: m * 2^-24 is exactly representable as a normal float. */
    float v = (float)m * 5.9604644775390625e-8f;
    return sign ? -v : v;
}

/* Narrowing rounds to nearest, ties to even; overflow gives infinity; NaNs stay NaN, quieted, with
 * the top payload bits kept (what F16C's vcvtps2ph does, so the SIMD paths agree). */
kiri_f16 kiri_f32_to_f16(float f)
{
    uint32_t x = f32_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t a = x & 0x7fffffffu;

    if (a >= 0x7f800000u) {
        if (a > 0x7f800000u)
            return (kiri_f16)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
        return (kiri_f16)(sign | 0x7c00u);
    }
    if (a >= 0x477ff000u) /* >= 65520: rounds past the largest finite half, 65504 */
        return (kiri_f16)(sign | 0x7c00u);
    if (a < 0x38800000u) { /* below 2^-14: a subnormal half or zero */
        if (a < 0x33000000u) /* below 2^-25: rounds to zero (2^-25 itself ties to even zero) */
            return (kiri_f16)sign;
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* value = m * 2^(e-150); in units of 2^-24: m >> (126-e) */
        uint32_t r = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++; /* may carry into the smallest normal, 0x0400, which is the right encoding */
        return (kiri_f16)(sign | r);
    }
    uint32_t r = (a - 0x38000000u) >> 13; /* rebias the exponent from 127 to 15 */
    uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1)))
        r++; /* a carry out of the mantissa bumps the exponent, as it should */
    return (kiri_f16)(sign | r);
}

float kiri_bf16_to_f32(kiri_bf16 h)
{
    return bits_f32((uint32_t)h << 16);
}

/* Round to nearest even; NaNs are quieted (bit 6 of the bfloat16) so truncating a NaN's payload can
 * never turn it into an infinity. */
kiri_bf16 kiri_f32_to_bf16(float f)
{
    uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (kiri_bf16)((x >> 16) | 0x40u);
    return (kiri_bf16)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

#define F16(h) kiri_f16_to_f32(h)

/* Rounds to the nearest integer, ties to even, for |v| < 2^22 (all the K-quant searches need):
 * adding 1.5 * 2^23 leaves the integer in the low mantissa bits. */
static inline int nearest_int(float v)
{
    float f = v + 12582912.f;
    int32_t i;
    memcpy(&i, &f, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

static inline int clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block. Bytes 0-3 hold scales 0-3
 * in their low 6 bits, bytes 4-7 mins 0-3; scales and mins 4-7 keep their low 4 bits in bytes 8-11
 * (scale low nibble, min high nibble) and their top 2 bits in the spare top bits of bytes 0-7. */
static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* ---------------------------------------------------------------------------------------------
 * Dequantization. Element order within blocks: the 32-value types store value j in the low nibble
 * of qs[j] and value j + 16 in the high nibble. K-quants go in chunks of 64 (Q4_K, Q5_K: 32 low
 * nibbles then 32 high nibbles) or 128 (Q6_K: four runs of 32 sharing ql and qh).
 * ------------------------------------------------------------------------------------------- */

static void dequant_q4_0(const struct kiri_block_q4_0 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += KIRI_QK4_0) {
        const float d = F16(x[i].d);
        for (int j = 0; j < KIRI_QK4_0 / 2; j++) {
            y[j] = d * (float)((x[i].qs[j] & 0xF) - 8);
            y[j + 16] = d * (float)((x[i].qs[j] >> 4) - 8);
        }
    }
}

static void dequant_q4_1(const struct kiri_block_q4_1 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += KIRI_QK4_1) {
        const float d = F16(x[i].d), m = F16(x[i].m);
        for (int j = 0; j < KIRI_QK4_1 / 2; j++) {
            y[j] = d * (float)(x[i].qs[j] & 0xF) + m;
            y[j + 16] = d * (float)(x[i].qs[j] >> 4) + m;
        }
    }
}

static inline uint32_t load_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void dequant_q5_0(const struct kiri_block_q5_0 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += KIRI_QK5_0) {
        const float d = F16(x[i].d);
        const uint32_t qh = load_u32le(x[i].qh);
        for (int j = 0; j < KIRI_QK5_0 / 2; j++) {
            int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            y[j] = d * (float)(((x[i].qs[j] & 0xF) | h0 << 4) - 16);
            y[j + 16] = d * (float)(((x[i].qs[j] >> 4) | h1 << 4) - 16);
        }
    }
}

static void dequant_q5_1(const struct kiri_block_q5_1 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += KIRI_QK5_1) {
        const float d = F16(x[i].d), m = F16(x[i].m);
        const uint32_t qh = load_u32le(x[i].qh);
        for (int j = 0; j < KIRI_QK5_1 / 2; j++) {
            int h0 = (qh >> j) & 1, h1 = (qh >> (j + 16)) & 1;
            y[j] = d * (float)((x[i].qs[j] & 0xF) | h0 << 4) + m;
            y[j + 16] = d * (float)((x[i].qs[j] >> 4) | h1 << 4) + m;
        }
    }
}

static void dequant_q8_0(const struct kiri_block_q8_0 *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, y += KIRI_QK8_0) {
        const float d = F16(x[i].d);
        for (int j = 0; j < KIRI_QK8_0; j++)
            y[j] = d * (float)x[i].qs[j];
    }
}

static void dequant_q4_K(const struct kiri_block_q4_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = F16(x[i].d), dmin = F16(x[i].dmin);
        const uint8_t *q = x[i].qs;
        for (int j = 0; j < 8; j += 2, q += 32, y += 64) {
            uint8_t sc, m;
            get_scale_min_k4(j, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            get_scale_min_k4(j + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) {
                y[l] = d1 * (float)(q[l] & 0xF) - m1;
                y[l + 32] = d2 * (float)(q[l] >> 4) - m2;
            }
        }
    }
}

static void dequant_q5_K(const struct kiri_block_q5_K *x, float *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++) {
        const float d = F16(x[i].d), dmin = F16(x[i].dmin);
        const uint8_t *ql = x[i].qs, *qh = x[i].qh;
        for (int j = 0; j < 8; j += 2, ql += 32, y += 64) {
            uint8_t sc, m;
            get_scale_min_k4(j, x[i].scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            get_scale_min_k4(j + 1, x[i].scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            /* Chunk j/2 takes bits j and j + 1 of each qh byte. */
            for (int l = 0; l < 32; l++) {
                int h1 = (qh[l] >> j) & 1, h2 = (qh[l] >> (j + 1)) & 1;
                y[l] = d1 * (float)((ql[l] & 0xF) | h1 << 4) - m1;
                y[l + 32] = d2 * (float)((ql[l] >> 4) | h2 << 4) - m2;
            }
        }
    }
}

/* Unpacks the 256 6-bit quants of a Q6_K block, minus 32, in element order. */
static void unpack_q6_K(const struct kiri_block_q6_K *x, int8_t *q)
{
    const uint8_t *ql = x->ql, *qh = x->qh;
    for (int n = 0; n < KIRI_QK_K; n += 128, ql += 64, qh += 32, q += 128) {
        for (int l = 0; l < 32; l++) {
            q[l] = (int8_t)(((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32);
            q[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32);
            q[l + 64] = (int8_t)(((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32);
            q[l + 96] = (int8_t)(((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32);
        }
    }
}

static void dequant_q6_K(const struct kiri_block_q6_K *x, float *y, int64_t nb)
{
    int8_t q[KIRI_QK_K];
    for (int64_t i = 0; i < nb; i++, y += KIRI_QK_K) {
        const float d = F16(x[i].d);
        unpack_q6_K(&x[i], q);
        for (int g = 0; g < KIRI_QK_K / 16; g++) {
            const float dg = d * (float)x[i].scales[g];
            for (int l = 0; l < 16; l++)
                y[16 * g + l] = dg * (float)q[16 * g + l];
        }
    }
}

void kiri_cpu_dequantize_row(int type, const void *src, float *dst, int64_t n)
{
    const int64_t bs = kiri_type_block_size(type);
    if (bs <= 0 || n % bs != 0)
        return;
    const int64_t nb = n / bs;
    switch (type) {
    case KIRI_TYPE_F32:
        memcpy(dst, src, (size_t)n * sizeof(float));
        break;
    case KIRI_TYPE_F16: {
        const kiri_f16 *h = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = kiri_f16_to_f32(h[i]);
        break;
    }
    case KIRI_TYPE_BF16: {
        const kiri_bf16 *h = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = kiri_bf16_to_f32(h[i]);
        break;
    }
    case KIRI_TYPE_Q4_0: dequant_q4_0(src, dst, nb); break;
    case KIRI_TYPE_Q4_1: dequant_q4_1(src, dst, nb); break;
    case KIRI_TYPE_Q5_0: dequant_q5_0(src, dst, nb); break;
    case KIRI_TYPE_Q5_1: dequant_q5_1(src, dst, nb); break;
    case KIRI_TYPE_Q8_0: dequant_q8_0(src, dst, nb); break;
    case KIRI_TYPE_Q4_K: dequant_q4_K(src, dst, nb); break;
    case KIRI_TYPE_Q5_K: dequant_q5_K(src, dst, nb); break;
    case KIRI_TYPE_Q6_K: dequant_q6_K(src, dst, nb); break;
    default: break;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Quantization of the 32-value types (byte-identical with the format's reference: the scale comes
 * from the value of largest magnitude, or from the range for the types with a min).
 * ------------------------------------------------------------------------------------------- */

/* The value of largest magnitude (the first one on ties), keeping its sign. */
static float signed_absmax(const float *x, int n, float *amax_out)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        const float v = fabsf(x[j]);
        if (amax < v) {
            amax = v;
            max = x[j];
        }
    }
    *amax_out = amax;
    return max;
}

static void quant_q4_0(const float *x, struct kiri_block_q4_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += KIRI_QK4_0) {
        float amax;
        const float max = signed_absmax(x, KIRI_QK4_0, &amax);
        const float d = max / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kiri_f32_to_f16(d);
        for (int j = 0; j < KIRI_QK4_0 / 2; j++) {
            int q0 = (int)(x[j] * id + 8.5f), q1 = (int)(x[j + 16] * id + 8.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void minmax(const float *x, int n, float *lo, float *hi)
{
    float mn = x[0], mx = x[0];
    for (int j = 1; j < n; j++) {
        mn = x[j] < mn ? x[j] : mn;
        mx = x[j] > mx ? x[j] : mx;
    }
    *lo = mn;
    *hi = mx;
}

static void quant_q4_1(const float *x, struct kiri_block_q4_1 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += KIRI_QK4_1) {
        float lo, hi;
        minmax(x, KIRI_QK4_1, &lo, &hi);
        const float d = (hi - lo) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kiri_f32_to_f16(d);
        y[i].m = kiri_f32_to_f16(lo);
        for (int j = 0; j < KIRI_QK4_1 / 2; j++) {
            int q0 = (int)((x[j] - lo) * id + 0.5f), q1 = (int)((x[j + 16] - lo) * id + 0.5f);
            q0 = q0 > 15 ? 15 : q0;
            q1 = q1 > 15 ? 15 : q1;
            y[i].qs[j] = (uint8_t)(q0 | q1 << 4);
        }
    }
}

static void store_u32le(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
}

static void quant_q5_0(const float *x, struct kiri_block_q5_0 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += KIRI_QK5_0) {
        float amax;
        const float max = signed_absmax(x, KIRI_QK5_0, &amax);
        const float d = max / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        y[i].d = kiri_f32_to_f16(d);
        for (int j = 0; j < KIRI_QK5_0 / 2; j++) {
            int q0 = (int)(x[j] * id + 16.5f), q1 = (int)(x[j + 16] * id + 16.5f);
            q0 = q0 > 31 ? 31 : q0;
            q1 = q1 > 31 ? 31 : q1;
            y[i].qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_u32le(y[i].qh, qh);
    }
}

static void quant_q5_1(const float *x, struct kiri_block_q5_1 *y, int64_t nb)
{
    for (int64_t i = 0; i < nb; i++, x += KIRI_QK5_1) {
        float lo, hi;
        minmax(x, KIRI_QK5_1, &lo, &hi);
        const float d = (hi - lo) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint32_t qh = 0;
        y[i].d = kiri_f32_to_f16(d);
        y[i].m = kiri_f32_to_f16(lo);
        for (int j = 0; j < KIRI_QK5_1 / 2; j++) {
            int q0 = (int)((x[j] - lo) * id + 0.5f), q1 = (int)((x[j + 16] - lo) * id + 0.5f);
            q0 = q0 > 31 ? 31 : q0;
            q1 = q1 > 31 ? 31 : q1;
            y[i].qs[j] = (uint8_t)((q0 & 0xF) | (q1 & 0xF) << 4);
            qh |= (uint32_t)(q0 >> 4) << j | (uint32_t)(q1 >> 4) << (j + 16);
        }
        store_u32le(y[i].qh, qh);
    }
}

/* Q8_0 and Q8_1: d = amax / 127, values rounded half away from zero (roundf), as the reference. */
static void quant_q8_0(const float *x, void *vy, int64_t n)
{
    struct kiri_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / KIRI_QK8_0; i++, x += KIRI_QK8_0) {
        float amax;
        signed_absmax(x, KIRI_QK8_0, &amax);
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = kiri_f32_to_f16(d);
        for (int j = 0; j < KIRI_QK8_0; j++)
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
    }
}

static void quant_q8_1(const float *x, void *vy, int64_t n)
{
    struct kiri_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / KIRI_QK8_1; i++, x += KIRI_QK8_1) {
        float amax;
        signed_absmax(x, KIRI_QK8_1, &amax);
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int sum = 0;
        for (int j = 0; j < KIRI_QK8_1; j++) {
            y[i].qs[j] = (int8_t)roundf(x[j] * id);
            sum += y[i].qs[j];
        }
        y[i].d = kiri_f32_to_f16(d);
        y[i].s = kiri_f32_to_f16((float)sum * d);
    }
}

/* Q8_K: the value of largest magnitude maps to -127 (iscale = -127 / max), so d = 1 / iscale is
 * negative for a positive max; that is the format reference's convention, kept so blocks compare
 * byte for byte. d stays a float, so nothing here can overflow. */
static void quant_q8_K(const float *x, void *vy, int64_t n)
{
    struct kiri_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++, x += KIRI_QK_K) {
        float amax;
        const float max = signed_absmax(x, KIRI_QK_K, &amax);
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        const float iscale = -127.f / max;
        for (int j = 0; j < KIRI_QK_K; j++) {
            int v = nearest_int(iscale * x[j]);
            y[i].qs[j] = (int8_t)(v > 127 ? 127 : v);
        }
        for (int g = 0; g < KIRI_QK_K / 16; g++) {
            int s = 0;
            for (int l = 0; l < 16; l++)
                s += y[i].qs[16 * g + l];
            y[i].bsums[g] = (int16_t)s;
        }
        y[i].d = 1 / iscale;
    }
}

/* ---------------------------------------------------------------------------------------------
 * K-quant quantization. Each sub-block gets its own scale (and min) by a small search: start from
 * the range-derived scale, try nstep nearby ones, and for the levels each produces solve the
 * weighted least-squares fit of scale and min; keep the fit with the least weighted error. The
 * per-sub-block scales are then themselves quantized (6 bits for Q4_K/Q5_K, 8 bits for Q6_K) and
 * the values re-quantized against the scales actually stored.
 * ------------------------------------------------------------------------------------------- */

/* Fits x[i] ~ scale * L[i] - m (L in 0..nmax, m >= 0) with weights w. Writes the levels to L and
 * m to *m_out, returns scale. */
static float fit_scale_min(int n, int nmax, const float *x, const float *w, uint8_t *L,
                           float *m_out, float rmin, float rdelta, int nstep)
{
    uint8_t Lt[32];
    float lo = x[0], hi = x[0], sw = w[0], swx = w[0] * x[0];
    for (int i = 1; i < n; i++) {
        lo = x[i] < lo ? x[i] : lo;
        hi = x[i] > hi ? x[i] : hi;
        sw += w[i];
        swx += w[i] * x[i];
    }
    if (lo > 0)
        lo = 0; /* the min is an offset down from zero only */
    if (hi == lo) {
        memset(L, 0, (size_t)n);
        *m_out = -lo;
        return 0.0f;
    }
    float iscale = (float)nmax / (hi - lo);
    float scale = 1.0f / iscale;
    float best = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(nearest_int(iscale * (x[i] - lo)), 0, nmax);
        L[i] = (uint8_t)l;
        const float diff = scale * (float)l + lo - x[i];
        best += w[i] * diff * diff;
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * (float)is + (float)nmax) / (hi - lo);
        float sl = 0, sl2 = 0, sxl = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest_int(iscale * (x[i] - lo)), 0, nmax);
            Lt[i] = (uint8_t)l;
            sl += w[i] * (float)l;
            sl2 += w[i] * (float)(l * l);
            sxl += w[i] * (float)l * x[i];
        }
        const float det = sw * sl2 - sl * sl;
        if (det <= 0)
            continue;
        float s = (sw * sxl - swx * sl) / det;
        float mn = (sl2 * swx - sl * sxl) / det;
        if (mn > 0) {
            mn = 0;
            s = sxl / sl2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            const float diff = s * (float)Lt[i] + mn - x[i];
            err += w[i] * diff * diff;
        }
        if (err < best) {
            memcpy(L, Lt, (size_t)n);
            best = err;
            scale = s;
            lo = mn;
        }
    }
    *m_out = -lo;
    return scale;
}

/* Fits x[i] ~ scale * L[i], L in -nmax..nmax-1, weighting each value by x^2 (large values matter
 * most). The value of largest magnitude anchors at -nmax, the side with the extra level. Returns
 * scale (negative when that value is positive). */
static float fit_scale_sym(int n, int nmax, const float *x)
{
    float amax;
    const float max = signed_absmax(x, n, &amax);
    if (amax < 1e-15f)
        return 0.0f;
    float best_scale = 0.0f, best = 0.0f;
    for (int is = 0; is <= 18; is++) {
        /* is = 0 is the plain scale; then nmax +- 0.1 .. 0.9 */
        const int k = is == 0 ? 0 : is <= 9 ? -is : is - 9;
        const float iscale = -((float)nmax + 0.1f * (float)k) / max;
        float sxl = 0, sl2 = 0;
        for (int i = 0; i < n; i++) {
            const int l = clampi(nearest_int(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sxl += w * x[i] * (float)l;
            sl2 += w * (float)(l * l);
        }
        if (sl2 <= 0)
            continue;
        if (is == 0 || sxl * sxl > best * sl2) {
            best_scale = sxl / sl2;
            best = best_scale * sxl;
        }
    }
    return best_scale;
}

static void pack_scales_k4(uint8_t *s, const uint8_t *ls, const uint8_t *lm)
{
    memset(s, 0, KIRI_K_SCALE_SIZE);
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] |= ls[j];
            s[j + 4] |= lm[j];
        } else {
            s[j + 4] = (uint8_t)((ls[j] & 0xF) | (lm[j] & 0xF) << 4);
            s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            s[j] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* Shared by Q4_K (nmax 15) and Q5_K (nmax 31): finds the levels L (256) and the packed d, dmin and
 * scales of one block. */
static void quant_k_scale_min(const float *x, int nmax, float rmin, int nstep, uint8_t *L,
                              kiri_f16 *d_out, kiri_f16 *dmin_out, uint8_t *scales)
{
    float w[32], sc[8], mn[8], max_sc = 0, max_mn = 0, sx2 = 0;
    uint8_t ls[8], lm[8];
    for (int l = 0; l < KIRI_QK_K; l++)
        sx2 += x[l] * x[l];
    const float av_x = sqrtf(sx2 / KIRI_QK_K);
    for (int j = 0; j < 8; j++) {
        for (int l = 0; l < 32; l++)
            w[l] = av_x + fabsf(x[32 * j + l]);
        sc[j] = fit_scale_min(32, nmax, x + 32 * j, w, L + 32 * j, &mn[j], rmin, 0.1f, nstep);
        max_sc = sc[j] > max_sc ? sc[j] : max_sc;
        max_mn = mn[j] > max_mn ? mn[j] : max_mn;
    }
    const float inv_sc = max_sc > 0 ? 63.f / max_sc : 0.f;
    const float inv_mn = max_mn > 0 ? 63.f / max_mn : 0.f;
    for (int j = 0; j < 8; j++) {
        ls[j] = (uint8_t)clampi(nearest_int(inv_sc * sc[j]), 0, 63);
        lm[j] = (uint8_t)clampi(nearest_int(inv_mn * mn[j]), 0, 63);
    }
    pack_scales_k4(scales, ls, lm);
    *d_out = kiri_f32_to_f16(max_sc / 63.f);
    *dmin_out = kiri_f32_to_f16(max_mn / 63.f);
    const float d = F16(*d_out), dmin = F16(*dmin_out);
    for (int j = 0; j < 8; j++) {
        const float dd = d * (float)ls[j];
        if (dd == 0.0f)
            continue;
        const float dm = dmin * (float)lm[j];
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)clampi(nearest_int((x[32 * j + l] + dm) / dd), 0, nmax);
    }
}

static void quant_q4_K(const float *x, struct kiri_block_q4_K *y, int64_t nb)
{
    uint8_t L[KIRI_QK_K];
    for (int64_t i = 0; i < nb; i++, x += KIRI_QK_K) {
        quant_k_scale_min(x, 15, -1.0f, 20, L, &y[i].d, &y[i].dmin, y[i].scales);
        for (int j = 0; j < KIRI_QK_K; j += 64)
            for (int l = 0; l < 32; l++)
                y[i].qs[j / 2 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
    }
}

static void quant_q5_K(const float *x, struct kiri_block_q5_K *y, int64_t nb)
{
    uint8_t L[KIRI_QK_K];
    for (int64_t i = 0; i < nb; i++, x += KIRI_QK_K) {
        quant_k_scale_min(x, 31, -0.5f, 15, L, &y[i].d, &y[i].dmin, y[i].scales);
        memset(y[i].qh, 0, sizeof y[i].qh);
        for (int j = 0; j < KIRI_QK_K; j += 64) {
            const int c = j / 64; /* chunk c uses qh bits 2c (low half) and 2c + 1 (high half) */
            for (int l = 0; l < 32; l++) {
                const int l1 = L[j + l], l2 = L[j + l + 32];
                y[i].qh[l] |= (uint8_t)((l1 >> 4) << (2 * c) | (l2 >> 4) << (2 * c + 1));
                y[i].qs[j / 2 + l] = (uint8_t)((l1 & 0xF) | (l2 & 0xF) << 4);
            }
        }
    }
}

static void quant_q6_K(const float *x, struct kiri_block_q6_K *y, int64_t nb)
{
    uint8_t L[KIRI_QK_K];
    float sc[KIRI_QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += KIRI_QK_K) {
        float max_sc = 0, amax_sc = 0;
        for (int g = 0; g < KIRI_QK_K / 16; g++) {
            sc[g] = fit_scale_sym(16, 32, x + 16 * g);
            if (fabsf(sc[g]) > amax_sc) {
                amax_sc = fabsf(sc[g]);
                max_sc = sc[g];
            }
        }
        memset(&y[i], 0, sizeof y[i]);
        if (amax_sc < 1e-15f)
            continue;
        /* The largest scale maps to -128 so the rest fit in -128..127. */
        const float iscale = -128.f / max_sc;
        y[i].d = kiri_f32_to_f16(1.0f / iscale);
        const float d = F16(y[i].d);
        for (int g = 0; g < KIRI_QK_K / 16; g++) {
            const int s = clampi(nearest_int(iscale * sc[g]), -128, 127);
            y[i].scales[g] = (int8_t)s;
            const float dd = d * (float)s;
            for (int l = 0; l < 16; l++) {
                int q = 0;
                if (dd != 0.0f)
                    q = clampi(nearest_int(x[16 * g + l] / dd), -32, 31);
                L[16 * g + l] = (uint8_t)(q + 32);
            }
        }
        for (int j = 0; j < KIRI_QK_K; j += 128) {
            uint8_t *ql = y[i].ql + j / 2, *qh = y[i].qh + j / 4;
            for (int l = 0; l < 32; l++) {
                const int q1 = L[j + l], q2 = L[j + l + 32], q3 = L[j + l + 64], q4 = L[j + l + 96];
                ql[l] = (uint8_t)((q1 & 0xF) | (q3 & 0xF) << 4);
                ql[l + 32] = (uint8_t)((q2 & 0xF) | (q4 & 0xF) << 4);
                qh[l] = (uint8_t)(q1 >> 4 | (q2 >> 4) << 2 | (q3 >> 4) << 4 | (q4 >> 4) << 6);
            }
        }
    }
}

static void conv_f32(const float *x, void *vy, int64_t n)
{
    memcpy(vy, x, (size_t)n * sizeof(float));
}

static void conv_f16(const float *x, void *vy, int64_t n)
{
    kiri_f16 *y = vy;
    for (int64_t i = 0; i < n; i++)
        y[i] = kiri_f32_to_f16(x[i]);
}

static void conv_bf16(const float *x, void *vy, int64_t n)
{
    kiri_bf16 *y = vy;
    for (int64_t i = 0; i < n; i++)
        y[i] = kiri_f32_to_bf16(x[i]);
}

size_t kiri_cpu_quantize_row(int type, const float *src, void *dst, int64_t n)
{
    const int64_t bs = kiri_type_block_size(type);
    if (bs <= 0 || n < 0 || n % bs != 0)
        return 0;
    const int64_t nb = n / bs;
    switch (type) {
    case KIRI_TYPE_F32: conv_f32(src, dst, n); break;
    case KIRI_TYPE_F16: conv_f16(src, dst, n); break;
    case KIRI_TYPE_BF16: conv_bf16(src, dst, n); break;
    case KIRI_TYPE_Q4_0: quant_q4_0(src, dst, nb); break;
    case KIRI_TYPE_Q4_1: quant_q4_1(src, dst, nb); break;
    case KIRI_TYPE_Q5_0: quant_q5_0(src, dst, nb); break;
    case KIRI_TYPE_Q5_1: quant_q5_1(src, dst, nb); break;
    case KIRI_TYPE_Q8_0: quant_q8_0(src, dst, n); break;
    case KIRI_TYPE_Q8_1: quant_q8_1(src, dst, n); break;
    case KIRI_TYPE_Q8_K: quant_q8_K(src, dst, n); break;
    case KIRI_TYPE_Q4_K: quant_q4_K(src, dst, nb); break;
    case KIRI_TYPE_Q5_K: quant_q5_K(src, dst, nb); break;
    case KIRI_TYPE_Q6_K: quant_q6_K(src, dst, nb); break;
    default: return 0;
    }
    return (size_t)nb * kiri_type_size(type);
}

/* ---------------------------------------------------------------------------------------------
 * Dot products: integer sums inside a block, one float scale per block (or sub-block for K).
 * ------------------------------------------------------------------------------------------- */

int kiri_cpu_vec_dot_type(int weight_type)
{
    switch (weight_type) {
    case KIRI_TYPE_F32: return KIRI_TYPE_F32;
    case KIRI_TYPE_F16: return KIRI_TYPE_F16;
    case KIRI_TYPE_BF16: return KIRI_TYPE_BF16;
    case KIRI_TYPE_Q4_0: case KIRI_TYPE_Q5_0: case KIRI_TYPE_Q8_0: return KIRI_TYPE_Q8_0;
    case KIRI_TYPE_Q4_1: case KIRI_TYPE_Q5_1: return KIRI_TYPE_Q8_1;
    case KIRI_TYPE_Q4_K: case KIRI_TYPE_Q5_K: case KIRI_TYPE_Q6_K: return KIRI_TYPE_Q8_K;
    default: return -1;
    }
}

static void vec_dot_f32(int64_t n, float *s, const void *vx, const void *vy)
{
    const float *x = vx, *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += x[i] * y[i];
    *s = sum;
}

static void vec_dot_f16(int64_t n, float *s, const void *vx, const void *vy)
{
    const kiri_f16 *x = vx, *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += F16(x[i]) * F16(y[i]);
    *s = sum;
}

static void vec_dot_bf16(int64_t n, float *s, const void *vx, const void *vy)
{
    const kiri_bf16 *x = vx, *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n; i++)
        sum += kiri_bf16_to_f32(x[i]) * kiri_bf16_to_f32(y[i]);
    *s = sum;
}

static void vec_dot_q4_0_q8_0(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q4_0 *x = vx;
    const struct kiri_block_q8_0 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / KIRI_QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < KIRI_QK8_0 / 2; j++)
            sumi += ((x[i].qs[j] & 0xF) - 8) * y[i].qs[j] + ((x[i].qs[j] >> 4) - 8) * y[i].qs[j + 16];
        sum += (float)sumi * (F16(x[i].d) * F16(y[i].d));
    }
    *s = sum;
}

/* With x = d_x q + m and y = d_y q': sum x y = d_x d_y sum(q q') + m * s_y, s_y = d_y sum(q'). */
static void vec_dot_q4_1_q8_1(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q4_1 *x = vx;
    const struct kiri_block_q8_1 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / KIRI_QK8_1; i++) {
        int sumi = 0;
        for (int j = 0; j < KIRI_QK8_1 / 2; j++)
            sumi += (x[i].qs[j] & 0xF) * y[i].qs[j] + (x[i].qs[j] >> 4) * y[i].qs[j + 16];
        sum += (float)sumi * (F16(x[i].d) * F16(y[i].d)) + F16(x[i].m) * F16(y[i].s);
    }
    *s = sum;
}

static void vec_dot_q5_0_q8_0(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q5_0 *x = vx;
    const struct kiri_block_q8_0 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / KIRI_QK8_0; i++) {
        const uint32_t qh = load_u32le(x[i].qh);
        int sumi = 0;
        for (int j = 0; j < KIRI_QK8_0 / 2; j++) {
            const int q0 = ((x[i].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4) - 16;
            const int q1 = ((x[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4) - 16;
            sumi += q0 * y[i].qs[j] + q1 * y[i].qs[j + 16];
        }
        sum += (float)sumi * (F16(x[i].d) * F16(y[i].d));
    }
    *s = sum;
}

static void vec_dot_q5_1_q8_1(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q5_1 *x = vx;
    const struct kiri_block_q8_1 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / KIRI_QK8_1; i++) {
        const uint32_t qh = load_u32le(x[i].qh);
        int sumi = 0;
        for (int j = 0; j < KIRI_QK8_1 / 2; j++) {
            const int q0 = (x[i].qs[j] & 0xF) | (int)((qh >> j) & 1) << 4;
            const int q1 = (x[i].qs[j] >> 4) | (int)((qh >> (j + 16)) & 1) << 4;
            sumi += q0 * y[i].qs[j] + q1 * y[i].qs[j + 16];
        }
        sum += (float)sumi * (F16(x[i].d) * F16(y[i].d)) + F16(x[i].m) * F16(y[i].s);
    }
    *s = sum;
}

static void vec_dot_q8_0_q8_0(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q8_0 *x = vx;
    const struct kiri_block_q8_0 *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / KIRI_QK8_0; i++) {
        int sumi = 0;
        for (int j = 0; j < KIRI_QK8_0; j++)
            sumi += x[i].qs[j] * y[i].qs[j];
        sum += (float)sumi * (F16(x[i].d) * F16(y[i].d));
    }
    *s = sum;
}

/* Q4_K/Q5_K: x = d sc q - dmin m per sub-block of 32, so
 * sum x y = d_y (d sum_j sc_j sum(q q') - dmin sum_j m_j sum(q')), sum(q') from Q8_K's bsums. */
static void vec_dot_q4_K_q8_K(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q4_K *x = vx;
    const struct kiri_block_q8_K *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++) {
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j += 2, q += 32, a += 64) {
            uint8_t sc1, m1, sc2, m2;
            get_scale_min_k4(j, x[i].scales, &sc1, &m1);
            get_scale_min_k4(j + 1, x[i].scales, &sc2, &m2);
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += (q[l] & 0xF) * a[l];
                s2 += (q[l] >> 4) * a[l + 32];
            }
            sumi += sc1 * s1 + sc2 * s2;
            summ += m1 * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]) +
                    m2 * (y[i].bsums[2 * j + 2] + y[i].bsums[2 * j + 3]);
        }
        sum += y[i].d * F16(x[i].d) * (float)sumi - y[i].d * F16(x[i].dmin) * (float)summ;
    }
    *s = sum;
}

static void vec_dot_q5_K_q8_K(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q5_K *x = vx;
    const struct kiri_block_q8_K *y = vy;
    float sum = 0;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++) {
        const uint8_t *q = x[i].qs, *qh = x[i].qh;
        const int8_t *a = y[i].qs;
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j += 2, q += 32, a += 64) {
            uint8_t sc1, m1, sc2, m2;
            get_scale_min_k4(j, x[i].scales, &sc1, &m1);
            get_scale_min_k4(j + 1, x[i].scales, &sc2, &m2);
            int s1 = 0, s2 = 0;
            for (int l = 0; l < 32; l++) {
                s1 += ((q[l] & 0xF) | ((qh[l] >> j) & 1) << 4) * a[l];
                s2 += ((q[l] >> 4) | ((qh[l] >> (j + 1)) & 1) << 4) * a[l + 32];
            }
            sumi += sc1 * s1 + sc2 * s2;
            summ += m1 * (y[i].bsums[2 * j] + y[i].bsums[2 * j + 1]) +
                    m2 * (y[i].bsums[2 * j + 2] + y[i].bsums[2 * j + 3]);
        }
        sum += y[i].d * F16(x[i].d) * (float)sumi - y[i].d * F16(x[i].dmin) * (float)summ;
    }
    *s = sum;
}

static void vec_dot_q6_K_q8_K(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q6_K *x = vx;
    const struct kiri_block_q8_K *y = vy;
    int8_t q[KIRI_QK_K];
    float sum = 0;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++) {
        unpack_q6_K(&x[i], q);
        int sumi = 0;
        for (int g = 0; g < KIRI_QK_K / 16; g++) {
            int sg = 0;
            for (int l = 0; l < 16; l++)
                sg += q[16 * g + l] * y[i].qs[16 * g + l];
            sumi += x[i].scales[g] * sg;
        }
        sum += y[i].d * F16(x[i].d) * (float)sumi;
    }
    *s = sum;
}

void kiri_cpu_kernels_init_ref(struct kiri_cpu_kernels *k)
{
    memset(k, 0, sizeof *k);
    k->vec_dot[KIRI_TYPE_F32] = vec_dot_f32;
    k->vec_dot[KIRI_TYPE_F16] = vec_dot_f16;
    k->vec_dot[KIRI_TYPE_BF16] = vec_dot_bf16;
    k->vec_dot[KIRI_TYPE_Q4_0] = vec_dot_q4_0_q8_0;
    k->vec_dot[KIRI_TYPE_Q4_1] = vec_dot_q4_1_q8_1;
    k->vec_dot[KIRI_TYPE_Q5_0] = vec_dot_q5_0_q8_0;
    k->vec_dot[KIRI_TYPE_Q5_1] = vec_dot_q5_1_q8_1;
    k->vec_dot[KIRI_TYPE_Q8_0] = vec_dot_q8_0_q8_0;
    k->vec_dot[KIRI_TYPE_Q4_K] = vec_dot_q4_K_q8_K;
    k->vec_dot[KIRI_TYPE_Q5_K] = vec_dot_q5_K_q8_K;
    k->vec_dot[KIRI_TYPE_Q6_K] = vec_dot_q6_K_q8_K;
    k->from_float[KIRI_TYPE_F32] = conv_f32;
    k->from_float[KIRI_TYPE_F16] = conv_f16;
    k->from_float[KIRI_TYPE_BF16] = conv_bf16;
    k->from_float[KIRI_TYPE_Q8_0] = quant_q8_0;
    k->from_float[KIRI_TYPE_Q8_1] = quant_q8_1;
    k->from_float[KIRI_TYPE_Q8_K] = quant_q8_K;
    k->path = "c";
}
