/* Device helpers shared by the CUDA kernels: conversions, loads, warp sums, the activation block
 * layouts, and for every weight type the dot product of one unit of a weight row with the
 * activations and the value of one element (exactly as kiri_cpu_dequantize_row gives it).
 *
 * A unit is the piece of a row one lane handles at a time: a 32-value block for the legacy
 * types, 32 values for the plain types (the last may be short), 64 values (a quarter block) for
 * the K-quants, so rows of 2048 values give every lane of a warp work.
 *
 * Loads: blocks of 18, 22, 34 and 210 bytes start at even offsets only, so their 32-bit words are
 * read as two halves; Q4_1, Q5_1, Q4_K and Q5_K blocks keep 4-byte alignment when the row does
 * (the backend checks that weights are 4-byte aligned).
 *
 * The per-unit functions are __host__ __device__ (HD), with host versions of the two intrinsics
 * they use, so tests/cuda_units.cu checks them against the CPU reference on any machine. */
#ifndef KIRI_CUDA_COMMON_CUH
#define KIRI_CUDA_COMMON_CUH

#include <cuda_fp16.h>
#include <stdint.h>
#include <string.h>

#include "../../runtime/backend.h"
#include "cuda_kernels.h"

#define WARP 32
#define HD __host__ __device__ __forceinline__

HD float bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

HD uint32_t f32_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(f);
#else
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
#endif
}

/* c + the dot product of the four signed bytes of a and of b. */
HD int dp4a(int a, int b, int c)
{
#ifdef __CUDA_ARCH__
    return dp4a(a, b, c);
#else
    for (int i = 0; i < 4; i++)
        c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
#endif
}

/* ---- conversions (exact widening; narrowing rounds to nearest even like the reference) ---- */

/* IEEE binary16 bits to float: exact for every value (kiri_f16_to_f32). */
HD float f16_to_f32(uint32_t h)
{
#ifdef __CUDA_ARCH__
    return __half2float(__ushort_as_half((unsigned short)h));
#else
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1fu)
        return bits_f32(sign | 0x7f800000u | (m << 13));
    if (e != 0u)
        return bits_f32(sign | ((e + 112u) << 23) | (m << 13));
    const float v = (float)m * 5.9604644775390625e-8f; /* m * 2^-24, exact */
    return sign ? -v : v;
#endif
}

HD float f16_at(const uint8_t *p) { return f16_to_f32(*(const uint16_t *)p); }

/* Float to binary16 bits, rounding to nearest even (kiri_f32_to_f16's definition). */
HD uint16_t f16_bits(float f)
{
#ifdef __CUDA_ARCH__
    return __half_as_ushort(__float2half_rn(f));
#else
    const uint32_t x = f32_bits(f), sign = (x >> 16) & 0x8000u, a = x & 0x7fffffffu;
    if (a >= 0x7f800000u)
        return (uint16_t)(a > 0x7f800000u ? sign | 0x7e00u | ((a >> 13) & 0x3ffu) : sign | 0x7c00u);
    if (a >= 0x477ff000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        if (a < 0x33000000u)
            return (uint16_t)sign;
        const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = (a - 0x38000000u) >> 13;
    const uint32_t rem = a & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1)))
        r++;
    return (uint16_t)(sign | r);
#endif
}

HD float f16_round(float f) { return f16_to_f32(f16_bits(f)); }

HD float bf16_to_f32(uint16_t h) { return bits_f32((uint32_t)h << 16); }

/* kiri_f32_to_bf16: ties to even, NaNs quieted. */
HD float bf16_round(float f)
{
    const uint32_t x = f32_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return bits_f32(((x >> 16) | 0x40u) << 16);
    return bits_f32(((x + 0x7fffu + ((x >> 16) & 1u)) >> 16) << 16);
}

/* ---- elementwise formulas (runtime/backend.h), shared by the kernels and tests/cuda_units.cu ---- */

/* GEGLU's value: gelu(g) * u, gelu by its tanh approximation 0.5 g (1 + tanh(z)), z = sqrt(2/pi)
 * (g + 0.044715 g^3), computed as the CPU reference does: g / (1 + e^-2z), the same function
 * without the cancellation of 1 + tanh(z) for negative g. */
HD float geglu_value(float g, float u)
{
    const float z2 = 2.0f * 0.797884560802865355f * (g + 0.044715f * g * g * g);
    return g / (1.0f + expf(-z2)) * u;
}

/* SOFTCAP's value: c tanh(x / c), c > 0; tanhf is within 2 ulp on the device (CUDA's documented
 * bound), the C library's on the host; the division IEEE-rounded (nvcc's default -prec-div). */
HD float softcap_value(float x, float c) { return c * tanhf(x / c); }

/* ---- the hybrid models' recurrences (runtime/backend.h), shared by recurrent.cu and
 * tests/cuda_units.cu; written in the CPU reference's order (kernels/cpu/cpu_backend.c) ---- */

HD float sigmoid_value(float x) { return 1.0f / (1.0f + expf(-x)); }

/* softplus as the reference writes it: the identity past 20. */
HD float softplus_value(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

/* One token of one channel of SHORT_CONV: state holds the channel's K - 1 previous inputs, oldest
 * first, `stride` floats apart; returns the output for input x and shifts x into the state. The
 * taps add oldest input first. */
HD float short_conv_step(float *state, size_t stride, const float *w, int k, float x, int silu)
{
    float sum = 0.0f;
    for (int j = 0; j + 1 < k; j++)
        sum += state[(size_t)j * stride] * w[j];
    sum += x * w[k - 1];
    for (int j = 0; j + 2 < k; j++)
        state[(size_t)j * stride] = state[(size_t)(j + 1) * stride];
    state[(size_t)(k - 2) * stride] = x;
    return silu ? sum / (1.0f + expf(-sum)) : sum;
}

/* The reference's dot_f32 order: 8 running sums combined pairwise, then the tail in order. */
HD float combine8(const float acc[8])
{
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

/* One token of one row m (S floats: a value dimension over the key dimensions) of a delta-rule
 * state: m *= decay, d = beta (v - m . k), m += d k; returns m . q (unscaled). */
HD float delta_row_step(float *m, const float *k, const float *q, float v, float beta, float decay, int s)
{
    const int full = s - s % 8;
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (int i = 0; i < full; i += 8)
        for (int l = 0; l < 8; l++) {
            m[i + l] *= decay;
            acc[l] += m[i + l] * k[i + l];
        }
    float pred = combine8(acc);
    for (int i = full; i < s; i++) {
        m[i] *= decay;
        pred += m[i] * k[i];
    }
    const float d = (v - pred) * beta;
    for (int l = 0; l < 8; l++)
        acc[l] = 0.0f;
    for (int i = 0; i < full; i += 8)
        for (int l = 0; l < 8; l++) {
            m[i + l] += d * k[i + l];
            acc[l] += m[i + l] * q[i + l];
        }
    float y = combine8(acc);
    for (int i = full; i < s; i++) {
        m[i] += d * k[i];
        y += m[i] * q[i];
    }
    return y;
}

/* ---- loads ---- */

HD uint32_t ld_u32_a2(const uint8_t *p)
{
    const uint16_t *h = (const uint16_t *)p;
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
}

HD uint32_t ld_u32_a4(const uint8_t *p) { return *(const uint32_t *)p; }

HD int ld_i32(const int8_t *p) { return *(const int *)p; }

/* Bits 0..3 of b moved to bit 4 of bytes 0..3 (the fifth bit of four Q5 values). */
HD uint32_t expand4(uint32_t b)
{
    return ((b & 1u) << 4) | ((b & 2u) << 11) | ((b & 4u) << 18) | ((b & 8u) << 25);
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = WARP / 2; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---- activation blocks (cuda_kernels.h) ---- */

struct act_q8_0 { int8_t qs[32]; float d; };
struct act_q8_1 { int8_t qs[32]; float d; float s; };
struct act_q8_k { int8_t qs[256]; float d; int32_t bsums[16]; };

/* One block of 32 activations as the reference's quant_q8_0 / quant_q8_1: d = amax / 127, quants
 * rounded half away from zero; returns the sum of the quants (for Q8_1's s). */
HD int quantize_q8_block(const float *x, int8_t *qs, float *d_out)
{
    float amax = 0.0f;
    for (int j = 0; j < 32; j++)
        amax = fmaxf(amax, fabsf(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < 32; j++) {
        const int q = (int)roundf(x[j] * id);
        qs[j] = (int8_t)q;
        sum += q;
    }
    *d_out = d;
    return sum;
}

/* Sum of the four signed bytes of a word. */
HD int bsum4(int a) { return dp4a(a, 0x01010101, 0); }

/* ---- weight types ---- */

/* The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block (get_scale_min_k4). */
HD void scale_min_k4(const uint8_t *s, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* wt<T>: UNIT values per unit, BS values and BB bytes per block; dot(row, act, u, k) is unit u's
 * contribution to the product; val(row, i) is element i of the row. */
template <int T> struct wt;

template <> struct wt<KIRI_TYPE_F32> {
    static const int UNIT = 32, BS = 1, BB = 4;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const float *x = (const float *)w + 32 * u, *y = (const float *)a + 32 * u;
        const int nv = k - 32 * u < 32 ? k - 32 * u : 32;
        float s = 0.0f;
        for (int i = 0; i < nv; i++)
            s += x[i] * y[i];
        return s;
    }
    HD static float val(const uint8_t *w, int i) { return ((const float *)w)[i]; }
};

template <> struct wt<KIRI_TYPE_F16> {
    static const int UNIT = 32, BS = 1, BB = 2;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint16_t *x = (const uint16_t *)w + 32 * u;
        const float *y = (const float *)a + 32 * u;
        const int nv = k - 32 * u < 32 ? k - 32 * u : 32;
        float s = 0.0f;
        for (int i = 0; i < nv; i++)
            s += f16_to_f32(x[i]) * y[i];
        return s;
    }
    HD static float val(const uint8_t *w, int i) { return f16_at(w + 2 * i); }
};

template <> struct wt<KIRI_TYPE_BF16> {
    static const int UNIT = 32, BS = 1, BB = 2;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint16_t *x = (const uint16_t *)w + 32 * u;
        const float *y = (const float *)a + 32 * u;
        const int nv = k - 32 * u < 32 ? k - 32 * u : 32;
        float s = 0.0f;
        for (int i = 0; i < nv; i++)
            s += bf16_to_f32(x[i]) * y[i];
        return s;
    }
    HD static float val(const uint8_t *w, int i) { return bf16_to_f32(((const uint16_t *)w)[i]); }
};

/* Q4_0: d (f16), 16 bytes: value j in the low nibble of byte j, value j + 16 in the high one. */
template <> struct wt<KIRI_TYPE_Q4_0> {
    static const int UNIT = 32, BS = 32, BB = 18;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint8_t *b = w + BB * u;
        const act_q8_0 *y = (const act_q8_0 *)a + u;
        int sumi = 0, sa = 0;
        for (int i = 0; i < 4; i++) {
            const uint32_t q = ld_u32_a2(b + 2 + 4 * i);
            const int a0 = ld_i32(y->qs + 4 * i), a1 = ld_i32(y->qs + 16 + 4 * i);
            sumi = dp4a((int)(q & 0x0f0f0f0fu), a0, sumi);
            sumi = dp4a((int)((q >> 4) & 0x0f0f0f0fu), a1, sumi);
            sa += bsum4(a0) + bsum4(a1);
        }
        sumi -= 8 * sa;
        return (float)sumi * (f16_at(b) * y->d);
    }
    HD static float val(const uint8_t *w, int i)
    {
        const uint8_t *b = w + BB * (i / 32);
        const int j = i % 32;
        const int q = (b[2 + (j & 15)] >> ((j >> 4) << 2)) & 0xF;
        return f16_at(b) * (float)(q - 8);
    }
};

/* Q4_1: d, m (f16), nibbles as Q4_0; value = d q + m. */
template <> struct wt<KIRI_TYPE_Q4_1> {
    static const int UNIT = 32, BS = 32, BB = 20;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint8_t *b = w + BB * u;
        const act_q8_1 *y = (const act_q8_1 *)a + u;
        int sumi = 0;
        for (int i = 0; i < 4; i++) {
            const uint32_t q = ld_u32_a4(b + 4 + 4 * i);
            sumi = dp4a((int)(q & 0x0f0f0f0fu), ld_i32(y->qs + 4 * i), sumi);
            sumi = dp4a((int)((q >> 4) & 0x0f0f0f0fu), ld_i32(y->qs + 16 + 4 * i), sumi);
        }
        return (float)sumi * (f16_at(b) * y->d) + f16_at(b + 2) * y->s;
    }
    HD static float val(const uint8_t *w, int i)
    {
        const uint8_t *b = w + BB * (i / 32);
        const int j = i % 32;
        const int q = (b[4 + (j & 15)] >> ((j >> 4) << 2)) & 0xF;
        return f16_at(b) * (float)q + f16_at(b + 2);
    }
};

/* Q5_0: d (f16), qh (the fifth bits, little endian), nibbles; value = d (q - 16). */
template <> struct wt<KIRI_TYPE_Q5_0> {
    static const int UNIT = 32, BS = 32, BB = 22;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint8_t *b = w + BB * u;
        const act_q8_0 *y = (const act_q8_0 *)a + u;
        const uint32_t qh = ld_u32_a2(b + 2);
        int sumi = 0, sa = 0;
        for (int i = 0; i < 4; i++) {
            const uint32_t q = ld_u32_a2(b + 6 + 4 * i);
            const int a0 = ld_i32(y->qs + 4 * i), a1 = ld_i32(y->qs + 16 + 4 * i);
            const uint32_t lo = (q & 0x0f0f0f0fu) | expand4(qh >> (4 * i));
            const uint32_t hi = ((q >> 4) & 0x0f0f0f0fu) | expand4(qh >> (16 + 4 * i));
            sumi = dp4a((int)lo, a0, sumi);
            sumi = dp4a((int)hi, a1, sumi);
            sa += bsum4(a0) + bsum4(a1);
        }
        sumi -= 16 * sa;
        return (float)sumi * (f16_at(b) * y->d);
    }
    HD static float val(const uint8_t *w, int i)
    {
        const uint8_t *b = w + BB * (i / 32);
        const int j = i % 32;
        const uint32_t qh = ld_u32_a2(b + 2);
        const int q = ((b[6 + (j & 15)] >> ((j >> 4) << 2)) & 0xF) | (int)(((qh >> j) & 1u) << 4);
        return f16_at(b) * (float)(q - 16);
    }
};

/* Q5_1: d, m (f16), qh, nibbles; value = d q + m. */
template <> struct wt<KIRI_TYPE_Q5_1> {
    static const int UNIT = 32, BS = 32, BB = 24;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint8_t *b = w + BB * u;
        const act_q8_1 *y = (const act_q8_1 *)a + u;
        const uint32_t qh = ld_u32_a4(b + 4);
        int sumi = 0;
        for (int i = 0; i < 4; i++) {
            const uint32_t q = ld_u32_a4(b + 8 + 4 * i);
            const uint32_t lo = (q & 0x0f0f0f0fu) | expand4(qh >> (4 * i));
            const uint32_t hi = ((q >> 4) & 0x0f0f0f0fu) | expand4(qh >> (16 + 4 * i));
            sumi = dp4a((int)lo, ld_i32(y->qs + 4 * i), sumi);
            sumi = dp4a((int)hi, ld_i32(y->qs + 16 + 4 * i), sumi);
        }
        return (float)sumi * (f16_at(b) * y->d) + f16_at(b + 2) * y->s;
    }
    HD static float val(const uint8_t *w, int i)
    {
        const uint8_t *b = w + BB * (i / 32);
        const int j = i % 32;
        const uint32_t qh = ld_u32_a4(b + 4);
        const int q = ((b[8 + (j & 15)] >> ((j >> 4) << 2)) & 0xF) | (int)(((qh >> j) & 1u) << 4);
        return f16_at(b) * (float)q + f16_at(b + 2);
    }
};

/* Q8_0: d (f16), 32 int8. */
template <> struct wt<KIRI_TYPE_Q8_0> {
    static const int UNIT = 32, BS = 32, BB = 34;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint8_t *b = w + BB * u;
        const act_q8_0 *y = (const act_q8_0 *)a + u;
        int sumi = 0;
        for (int i = 0; i < 8; i++)
            sumi = dp4a((int)ld_u32_a2(b + 2 + 4 * i), ld_i32(y->qs + 4 * i), sumi);
        return (float)sumi * (f16_at(b) * y->d);
    }
    HD static float val(const uint8_t *w, int i)
    {
        const uint8_t *b = w + BB * (i / 32);
        return f16_at(b) * (float)(int8_t)b[2 + i % 32];
    }
};

/* Q4_K: d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles in chunks of 64
 * values (32 low nibbles, then the high nibbles of the same bytes). Unit c = chunk c. */
template <> struct wt<KIRI_TYPE_Q4_K> {
    static const int UNIT = 64, BS = 256, BB = 144;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint8_t *b = w + BB * (u >> 2);
        const int c = u & 3;
        const act_q8_k *y = (const act_q8_k *)a + (u >> 2);
        int sc1, m1, sc2, m2;
        scale_min_k4(b + 4, 2 * c, &sc1, &m1);
        scale_min_k4(b + 4, 2 * c + 1, &sc2, &m2);
        int s1 = 0, s2 = 0;
        for (int i = 0; i < 8; i++) {
            const uint32_t q = ld_u32_a4(b + 16 + 32 * c + 4 * i);
            s1 = dp4a((int)(q & 0x0f0f0f0fu), ld_i32(y->qs + 64 * c + 4 * i), s1);
            s2 = dp4a((int)((q >> 4) & 0x0f0f0f0fu), ld_i32(y->qs + 64 * c + 32 + 4 * i), s2);
        }
        const int sumi = sc1 * s1 + sc2 * s2;
        const int summ = m1 * (y->bsums[4 * c] + y->bsums[4 * c + 1]) + m2 * (y->bsums[4 * c + 2] + y->bsums[4 * c + 3]);
        return y->d * f16_at(b) * (float)sumi - y->d * f16_at(b + 2) * (float)summ;
    }
    HD static float val(const uint8_t *w, int i)
    {
        const uint8_t *b = w + BB * (i / 256);
        const int j = i % 256, sub = j >> 5;
        int sc, m;
        scale_min_k4(b + 4, sub, &sc, &m);
        const float d1 = f16_at(b) * (float)sc, m1 = f16_at(b + 2) * (float)m;
        const int q = (b[16 + 32 * (j >> 6) + (j & 31)] >> ((sub & 1) << 2)) & 0xF;
        return d1 * (float)q - m1;
    }
};

/* Q5_K: as Q4_K with 32 bytes qh after the scales: bit s of qh[l] is the fifth bit of value l of
 * sub-block s. */
template <> struct wt<KIRI_TYPE_Q5_K> {
    static const int UNIT = 64, BS = 256, BB = 176;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint8_t *b = w + BB * (u >> 2);
        const int c = u & 3;
        const act_q8_k *y = (const act_q8_k *)a + (u >> 2);
        int sc1, m1, sc2, m2;
        scale_min_k4(b + 4, 2 * c, &sc1, &m1);
        scale_min_k4(b + 4, 2 * c + 1, &sc2, &m2);
        int s1 = 0, s2 = 0;
        for (int i = 0; i < 8; i++) {
            const uint32_t q = ld_u32_a4(b + 48 + 32 * c + 4 * i), h = ld_u32_a4(b + 16 + 4 * i);
            const uint32_t lo = (q & 0x0f0f0f0fu) | (((h >> (2 * c)) & 0x01010101u) << 4);
            const uint32_t hi = ((q >> 4) & 0x0f0f0f0fu) | (((h >> (2 * c + 1)) & 0x01010101u) << 4);
            s1 = dp4a((int)lo, ld_i32(y->qs + 64 * c + 4 * i), s1);
            s2 = dp4a((int)hi, ld_i32(y->qs + 64 * c + 32 + 4 * i), s2);
        }
        const int sumi = sc1 * s1 + sc2 * s2;
        const int summ = m1 * (y->bsums[4 * c] + y->bsums[4 * c + 1]) + m2 * (y->bsums[4 * c + 2] + y->bsums[4 * c + 3]);
        return y->d * f16_at(b) * (float)sumi - y->d * f16_at(b + 2) * (float)summ;
    }
    HD static float val(const uint8_t *w, int i)
    {
        const uint8_t *b = w + BB * (i / 256);
        const int j = i % 256, sub = j >> 5, l = j & 31;
        int sc, m;
        scale_min_k4(b + 4, sub, &sc, &m);
        const float d1 = f16_at(b) * (float)sc, m1 = f16_at(b + 2) * (float)m;
        const int q = ((b[48 + 32 * (j >> 6) + l] >> ((sub & 1) << 2)) & 0xF) | (((b[16 + l] >> sub) & 1) << 4);
        return d1 * (float)q - m1;
    }
};

/* Q6_K: 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales (one per 16
 * values), d (f16). In each half of 128 values, value l + 32 s (s = 0..3) takes the low (s < 2)
 * or high nibble of ql[l + 32 (s & 1)] and bits 2s, 2s + 1 of qh[l]. Unit c = groups 4c..4c+3. */
template <> struct wt<KIRI_TYPE_Q6_K> {
    static const int UNIT = 64, BS = 256, BB = 210;
    HD static float dot(const uint8_t *w, const void *a, int u, int k)
    {
        const uint8_t *b = w + BB * (u >> 2);
        const act_q8_k *y = (const act_q8_k *)a + (u >> 2);
        int sumi = 0;
        for (int g = 4 * (u & 3); g < 4 * (u & 3) + 4; g++) {
            const int h = g >> 3, s = (g & 7) >> 1, l0 = (g & 1) << 4;
            const uint8_t *ql = b + 64 * h + l0 + 32 * (s & 1), *qh = b + 128 + 32 * h + l0;
            const int shl = (s >> 1) << 2, shh = 2 * s;
            int sg = 0, sa = 0;
            for (int i = 0; i < 4; i++) {
                const uint32_t lo = ld_u32_a2(ql + 4 * i), hi = ld_u32_a2(qh + 4 * i);
                const uint32_t q = ((lo >> shl) & 0x0f0f0f0fu) | (((hi >> shh) & 0x03030303u) << 4);
                const int av = ld_i32(y->qs + 16 * g + 4 * i);
                sg = dp4a((int)q, av, sg);
                sa += bsum4(av);
            }
            sumi += (int)(int8_t)b[192 + g] * (sg - 32 * sa);
        }
        return y->d * f16_at(b + 208) * (float)sumi;
    }
    HD static float val(const uint8_t *w, int i)
    {
        const uint8_t *b = w + BB * (i / 256);
        const int j = i % 256, h = j >> 7, s = (j & 127) >> 5, l = j & 31;
        const int lo = b[64 * h + l + 32 * (s & 1)] >> ((s >> 1) << 2);
        const int hi = b[128 + 32 * h + l] >> (2 * s);
        const int q = ((lo & 0xF) | ((hi & 3) << 4)) - 32;
        const float dg = f16_at(b + 208) * (float)(int8_t)b[192 + j / 16];
        return dg * (float)q;
    }
};

/* Returns F<T>(args) for the weight type T known at run time; -1 for a type without kernels. */
#define KIRI_CUDA_DISPATCH_TYPE(type, F, ...)                                                   \
    switch (type) {                                                                             \
    case KIRI_TYPE_F32: return F<KIRI_TYPE_F32>(__VA_ARGS__);                                   \
    case KIRI_TYPE_F16: return F<KIRI_TYPE_F16>(__VA_ARGS__);                                   \
    case KIRI_TYPE_BF16: return F<KIRI_TYPE_BF16>(__VA_ARGS__);                                 \
    case KIRI_TYPE_Q4_0: return F<KIRI_TYPE_Q4_0>(__VA_ARGS__);                                 \
    case KIRI_TYPE_Q4_1: return F<KIRI_TYPE_Q4_1>(__VA_ARGS__);                                 \
    case KIRI_TYPE_Q5_0: return F<KIRI_TYPE_Q5_0>(__VA_ARGS__);                                 \
    case KIRI_TYPE_Q5_1: return F<KIRI_TYPE_Q5_1>(__VA_ARGS__);                                 \
    case KIRI_TYPE_Q8_0: return F<KIRI_TYPE_Q8_0>(__VA_ARGS__);                                 \
    case KIRI_TYPE_Q4_K: return F<KIRI_TYPE_Q4_K>(__VA_ARGS__);                                 \
    case KIRI_TYPE_Q5_K: return F<KIRI_TYPE_Q5_K>(__VA_ARGS__);                                 \
    case KIRI_TYPE_Q6_K: return F<KIRI_TYPE_Q6_K>(__VA_ARGS__);                                 \
    default: return -1;                                                                         \
    }

/* Grid x dimension limit, for kernels that spread work over x and y. */
#define KIRI_CUDA_MAX_GRID_Y 65535

#endif
