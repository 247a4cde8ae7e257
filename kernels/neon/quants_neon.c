/* ARM NEON versions of the CPU kernels a matmul spends its time in: the dot products of every
 * weight type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) and the activation
 * conversions to F16, Q8_0, Q8_1 and Q8_K.
 *
 * NEON (Advanced SIMD) is part of every AArch64 CPU, so the base kernels need no run-time check.
 * The 8-bit dot products exist twice: once with widening multiplies (any AArch64 CPU) and once
 * with SDOT (Armv8.2 dotprod, optional before Armv8.4). Both are built from one body each: the
 * body takes the 16-pair dot product as a function argument and is always inlined into a base
 * wrapper and an SDOT wrapper, so the constant argument turns into inlined code and only the SDOT
 * wrapper (compiled for dotprod by a target attribute, see neon_sdot.h) contains the instruction.
 * The file is compiled without -march flags, so the binary runs on any AArch64 CPU.
 *
 * What must stay true:
 * - Same contracts as the reference kernels in kernels/cpu/quants.c. The activation quantizers
 *   produce the same bytes as the reference (same float operations, same rounding: FCVTAS is
 *   roundf, FCVTNS is the reference's ties-to-even nearest_int, FCVT/FCVTN narrow to half with
 *   ties to even and keep NaN payloads as kiri_f32_to_f16 does). The dot products compute the same
 *   integer block sums and differ from the reference only in the order of the float additions
 *   across blocks (tests/test_neon.c bounds that).
 * - Integer sums cannot overflow: a 16-bit product is at most 128 * 128 and is widened before any
 *   addition; block sums stay far below 2^31 (the largest, Q6_K, is under 2^28).
 * - Multi-byte fields are read with memcpy as little-endian words; AArch64 Linux is little-endian.
 */
#include "neon_kernels.h"

#if defined(__aarch64__)

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "quants_neon.c assumes a little-endian AArch64 target"
#endif

#include <arm_neon.h>
#include <string.h>

#include "neon_sdot.h"

/* A kernel body: inlined into both the base and the SDOT wrapper. */
#define BODY static inline __attribute__((always_inline))

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static inline kiri_f16 f2h(float f)
{
    return vget_lane_u16(vreinterpret_u16_f16(vcvt_f16_f32(vdupq_n_f32(f))), 0);
}

static inline float bf2f(kiri_bf16 h)
{
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* acc + the dot product of 16 int8 pairs, spread over four int32 lanes. Which lane holds which
 * products differs between the two versions; callers only use the sum of the lanes, or scale
 * all four lanes alike. */
typedef int32x4_t (*dot16_fn)(int32x4_t acc, int8x16_t a, int8x16_t b);

static inline int32x4_t dot16_neon(int32x4_t acc, int8x16_t a, int8x16_t b)
{
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}

/* The sum of one 32-value block's products: q0 against a[0..15], q1 against a[16..31]. */
BODY int32x4_t dot32(int8x16_t q0, int8x16_t q1, const int8_t *a, dot16_fn dot)
{
    return dot(dot(vdupq_n_s32(0), q0, vld1q_s8(a)), q1, vld1q_s8(a + 16));
}

/* Byte j of the 32 (lo: 0-15, hi: 16-31) is 0xFF where bit j of the little-endian qh word is set,
 * else 0. */
static inline void qh_to_bytes(const uint8_t qh[4], uint8x16_t *lo, uint8x16_t *hi)
{
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t b = vld1q_u8(bit);
    *lo = vtstq_u8(vcombine_u8(vdup_n_u8(qh[0]), vdup_n_u8(qh[1])), b);
    *hi = vtstq_u8(vcombine_u8(vdup_n_u8(qh[2]), vdup_n_u8(qh[3])), b);
}

/* The low and high nibbles of 16 bytes. */
static inline uint8x16_t lo4(uint8x16_t v) { return vandq_u8(v, vdupq_n_u8(0x0F)); }
static inline uint8x16_t hi4(uint8x16_t v) { return vshrq_n_u8(v, 4); }
static inline int8x16_t s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* ---------------------------------------------------------------------------------------------
 * Dot products of the 32-value types. Value j of a block is the low nibble of qs[j] for j < 16 and
 * the high nibble of qs[j - 16] otherwise. Consecutive blocks go to two float accumulators so
 * their multiply-adds do not wait on each other.
 * ------------------------------------------------------------------------------------------- */

BODY int32x4_t q4_0_sum(const struct kiri_block_q4_0 *x, const int8_t *a, dot16_fn dot)
{
    const uint8x16_t v = vld1q_u8(x->qs);
    const int8x16_t eight = vdupq_n_s8(8);
    return dot32(vsubq_s8(s8(lo4(v)), eight), vsubq_s8(s8(hi4(v)), eight), a, dot);
}

/* q - 16 as int8 is the nibble with 0xF0 or'ed in where the fifth bit is clear. */
BODY int32x4_t q5_0_sum(const struct kiri_block_q5_0 *x, const int8_t *a, dot16_fn dot)
{
    const uint8x16_t v = vld1q_u8(x->qs), f0 = vdupq_n_u8(0xF0);
    uint8x16_t hlo, hhi;
    qh_to_bytes(x->qh, &hlo, &hhi);
    return dot32(s8(vorrq_u8(lo4(v), vbicq_u8(f0, hlo))), s8(vorrq_u8(hi4(v), vbicq_u8(f0, hhi))), a, dot);
}

BODY int32x4_t q8_0_sum(const struct kiri_block_q8_0 *x, const int8_t *a, dot16_fn dot)
{
    return dot32(vld1q_s8(x->qs), vld1q_s8(x->qs + 16), a, dot);
}

BODY int32x4_t q4_1_sum(const struct kiri_block_q4_1 *x, const int8_t *a, dot16_fn dot)
{
    const uint8x16_t v = vld1q_u8(x->qs);
    return dot32(s8(lo4(v)), s8(hi4(v)), a, dot);
}

BODY int32x4_t q5_1_sum(const struct kiri_block_q5_1 *x, const int8_t *a, dot16_fn dot)
{
    const uint8x16_t v = vld1q_u8(x->qs), b4 = vdupq_n_u8(0x10);
    uint8x16_t hlo, hhi;
    qh_to_bytes(x->qh, &hlo, &hhi);
    return dot32(s8(vorrq_u8(lo4(v), vandq_u8(b4, hlo))), s8(vorrq_u8(hi4(v), vandq_u8(b4, hhi))), a, dot);
}

/* sum over blocks of d_x d_y sum(q q'), for the types whose values are d q. */
#define DOT_32(name, xtype, sum)                                                                 \
    BODY float name(int64_t n, const void *vx, const void *vy, dot16_fn dot)                    \
    {                                                                                            \
        const struct xtype *x = vx;                                                              \
        const struct kiri_block_q8_0 *y = vy;                                                    \
        const int64_t nb = n / 32;                                                               \
        float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);                               \
        int64_t i = 0;                                                                           \
        for (; i + 1 < nb; i += 2) {                                                             \
            const int32x4_t p0 = sum(&x[i], y[i].qs, dot), p1 = sum(&x[i + 1], y[i + 1].qs, dot); \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(x[i].d) * h2f(y[i].d));             \
            acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(x[i + 1].d) * h2f(y[i + 1].d));     \
        }                                                                                        \
        if (i < nb)                                                                              \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(sum(&x[i], y[i].qs, dot)),                   \
                               h2f(x[i].d) * h2f(y[i].d));                                       \
        return vaddvq_f32(vaddq_f32(acc0, acc1));                                                \
    }

/* With x = d_x q + m and y = d_y q': sum x y = d_x d_y sum(q q') + m s_y (Q8_1's s = d_y sum q'). */
#define DOT_32_MIN(name, xtype, sum)                                                             \
    BODY float name(int64_t n, const void *vx, const void *vy, dot16_fn dot)                    \
    {                                                                                            \
        const struct xtype *x = vx;                                                              \
        const struct kiri_block_q8_1 *y = vy;                                                    \
        const int64_t nb = n / 32;                                                               \
        float32x4_t acc0 = vdupq_n_f32(0), acc1 = vdupq_n_f32(0);                               \
        float summ = 0;                                                                          \
        int64_t i = 0;                                                                           \
        for (; i + 1 < nb; i += 2) {                                                             \
            const int32x4_t p0 = sum(&x[i], y[i].qs, dot), p1 = sum(&x[i + 1], y[i + 1].qs, dot); \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(p0), h2f(x[i].d) * h2f(y[i].d));             \
            acc1 = vfmaq_n_f32(acc1, vcvtq_f32_s32(p1), h2f(x[i + 1].d) * h2f(y[i + 1].d));     \
            summ += h2f(x[i].m) * h2f(y[i].s) + h2f(x[i + 1].m) * h2f(y[i + 1].s);              \
        }                                                                                        \
        if (i < nb) {                                                                            \
            acc0 = vfmaq_n_f32(acc0, vcvtq_f32_s32(sum(&x[i], y[i].qs, dot)),                   \
                               h2f(x[i].d) * h2f(y[i].d));                                       \
            summ += h2f(x[i].m) * h2f(y[i].s);                                                   \
        }                                                                                        \
        return vaddvq_f32(vaddq_f32(acc0, acc1)) + summ;                                         \
    }

DOT_32(dot_q4_0, kiri_block_q4_0, q4_0_sum)
DOT_32(dot_q5_0, kiri_block_q5_0, q5_0_sum)
DOT_32(dot_q8_0, kiri_block_q8_0, q8_0_sum)
DOT_32_MIN(dot_q4_1, kiri_block_q4_1, q4_1_sum)
DOT_32_MIN(dot_q5_1, kiri_block_q5_1, q5_1_sum)

/* ---------------------------------------------------------------------------------------------
 * Dot products of the K-quants (super-blocks of 256 against Q8_K).
 * ------------------------------------------------------------------------------------------- */

/* The 8 scales and 8 mins of a Q4_K/Q5_K block, 6 bits each in 12 bytes: bytes 0-3 hold scales
 * 0-3 and bytes 4-7 mins 0-3 in their low 6 bits; bytes 8-11 hold the low 4 bits of scale (low
 * nibble) and min (high nibble) 4-7, whose top 2 bits sit in the top bits of bytes 0-3 (scales)
 * and 4-7 (mins). Unpacked four at a time as 32-bit words. */
static inline void unpack_scales_k4(const uint8_t *p, uint8_t sc[8], uint8_t mn[8])
{
    uint32_t w[3], s[2], m[2];
    memcpy(w, p, sizeof w);
    s[0] = w[0] & 0x3F3F3F3Fu;
    m[0] = w[1] & 0x3F3F3F3Fu;
    s[1] = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 6) & 0x03030303u) << 4;
    m[1] = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 6) & 0x03030303u) << 4;
    memcpy(sc, s, sizeof s);
    memcpy(mn, m, sizeof m);
}

/* sum_j mn[j] * (bsums[2j] + bsums[2j + 1]): the mins meet the activation sums of their 32. */
static inline int mins_dot_bsums(const uint8_t mn[8], const int16_t bsums[16])
{
    const int16x8_t bs = vpaddq_s16(vld1q_s16(bsums), vld1q_s16(bsums + 8));
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    return vaddvq_s32(vmlal_high_s16(vmull_s16(vget_low_s16(bs), vget_low_s16(m)), bs, m));
}

/* Q4_K: x = d sc q - dmin m per sub-block of 32. Chunk j of 64 values holds the 32 low nibbles of
 * qs[32j ..] (sub-block 2j), then their 32 high nibbles (sub-block 2j + 1). */
BODY float dot_q4_K(int64_t n, const void *vx, const void *vy, dot16_fn dot)
{
    const struct kiri_block_q4_K *x = vx;
    const struct kiri_block_q8_K *y = vy;
    float32x4_t acc = vdupq_n_f32(0);
    float summ = 0;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++) {
        uint8_t sc[8], mn[8];
        unpack_scales_k4(x[i].scales, sc, mn);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        int32x4_t sumi = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++, q += 32, a += 64) {
            const uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
            sumi = vmlaq_n_s32(sumi, dot32(s8(lo4(q0)), s8(lo4(q1)), a, dot), sc[2 * j]);
            sumi = vmlaq_n_s32(sumi, dot32(s8(hi4(q0)), s8(hi4(q1)), a + 32, dot), sc[2 * j + 1]);
        }
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), y[i].d * h2f(x[i].d));
        summ += y[i].d * h2f(x[i].dmin) * (float)mins_dot_bsums(mn, y[i].bsums);
    }
    return vaddvq_f32(acc) - summ;
}

/* Q5_K: Q4_K plus a fifth bit; chunk j takes bit 2j (low nibbles) and 2j + 1 (high nibbles) of
 * the 32 qh bytes, qh[l] belonging to value l of each half. */
BODY float dot_q5_K(int64_t n, const void *vx, const void *vy, dot16_fn dot)
{
    const struct kiri_block_q5_K *x = vx;
    const struct kiri_block_q8_K *y = vy;
    const uint8x16_t one = vdupq_n_u8(1), two = vdupq_n_u8(2);
    float32x4_t acc = vdupq_n_f32(0);
    float summ = 0;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++) {
        uint8_t sc[8], mn[8];
        unpack_scales_k4(x[i].scales, sc, mn);
        const uint8_t *q = x[i].qs;
        const int8_t *a = y[i].qs;
        uint8x16_t h0 = vld1q_u8(x[i].qh), h1 = vld1q_u8(x[i].qh + 16);
        int32x4_t sumi = vdupq_n_s32(0);
        for (int j = 0; j < 4; j++, q += 32, a += 64) {
            const uint8x16_t q0 = vld1q_u8(q), q1 = vld1q_u8(q + 16);
            const uint8x16_t l0 = vorrq_u8(lo4(q0), vshlq_n_u8(vandq_u8(h0, one), 4));
            const uint8x16_t l1 = vorrq_u8(lo4(q1), vshlq_n_u8(vandq_u8(h1, one), 4));
            const uint8x16_t u0 = vorrq_u8(hi4(q0), vshlq_n_u8(vandq_u8(h0, two), 3));
            const uint8x16_t u1 = vorrq_u8(hi4(q1), vshlq_n_u8(vandq_u8(h1, two), 3));
            sumi = vmlaq_n_s32(sumi, dot32(s8(l0), s8(l1), a, dot), sc[2 * j]);
            sumi = vmlaq_n_s32(sumi, dot32(s8(u0), s8(u1), a + 32, dot), sc[2 * j + 1]);
            h0 = vshrq_n_u8(h0, 2);
            h1 = vshrq_n_u8(h1, 2);
        }
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), y[i].d * h2f(x[i].d));
        summ += y[i].d * h2f(x[i].dmin) * (float)mins_dot_bsums(mn, y[i].bsums);
    }
    return vaddvq_f32(acc) - summ;
}

/* Q6_K, one run of 32 values: low bits lo0/lo1 (0..15) and high bits hb0/hb1 (0, 16, 32 or 48)
 * of values 0-15 and 16-31, which have scales sc[0] and sc[1]. */
BODY int32x4_t q6_K_run(int32x4_t sumi, uint8x16_t lo0, uint8x16_t lo1, uint8x16_t hb0,
                        uint8x16_t hb1, const int8_t *a, const int8_t *sc, dot16_fn dot)
{
    const int8x16_t off = vdupq_n_s8(32);
    const int8x16_t q0 = vsubq_s8(s8(vorrq_u8(lo0, hb0)), off);
    const int8x16_t q1 = vsubq_s8(s8(vorrq_u8(lo1, hb1)), off);
    sumi = vmlaq_n_s32(sumi, dot(vdupq_n_s32(0), q0, vld1q_s8(a)), sc[0]);
    return vmlaq_n_s32(sumi, dot(vdupq_n_s32(0), q1, vld1q_s8(a + 16)), sc[1]);
}

/* Q6_K: value q - 32 with q in 0..63, times an int8 scale per 16 values. Each half of 128 values
 * has 64 ql bytes and 32 qh bytes; run r (32 values) takes the low nibbles of ql[0..31] (r = 0),
 * of ql[32..63] (r = 1), then the high nibbles of the same (r = 2, 3), with bits 2r, 2r + 1 of
 * qh[0..31] on top. */
BODY float dot_q6_K(int64_t n, const void *vx, const void *vy, dot16_fn dot)
{
    const struct kiri_block_q6_K *x = vx;
    const struct kiri_block_q8_K *y = vy;
    const uint8x16_t m2 = vdupq_n_u8(0x30);
    float32x4_t acc = vdupq_n_f32(0);
    for (int64_t i = 0; i < n / KIRI_QK_K; i++) {
        int32x4_t sumi = vdupq_n_s32(0);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *a = y[i].qs + 128 * h, *sc = x[i].scales + 8 * h;
            const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
            const uint8x16_t l2 = vld1q_u8(ql + 32), l3 = vld1q_u8(ql + 48);
            const uint8x16_t b0 = vld1q_u8(qh), b1 = vld1q_u8(qh + 16);
            /* ((qh >> 2r) & 3) << 4, the high bits of run r, by one shift and one mask. */
            sumi = q6_K_run(sumi, lo4(l0), lo4(l1), vandq_u8(vshlq_n_u8(b0, 4), m2),
                            vandq_u8(vshlq_n_u8(b1, 4), m2), a, sc, dot);
            sumi = q6_K_run(sumi, lo4(l2), lo4(l3), vandq_u8(vshlq_n_u8(b0, 2), m2),
                            vandq_u8(vshlq_n_u8(b1, 2), m2), a + 32, sc + 2, dot);
            sumi = q6_K_run(sumi, hi4(l0), hi4(l1), vandq_u8(b0, m2), vandq_u8(b1, m2), a + 64,
                            sc + 4, dot);
            sumi = q6_K_run(sumi, hi4(l2), hi4(l3), vandq_u8(vshrq_n_u8(b0, 2), m2),
                            vandq_u8(vshrq_n_u8(b1, 2), m2), a + 96, sc + 6, dot);
        }
        acc = vfmaq_n_f32(acc, vcvtq_f32_s32(sumi), y[i].d * h2f(x[i].d));
    }
    return vaddvq_f32(acc);
}

/* The base and SDOT entry points of every 8-bit dot product. */
#define NEON_AND_SDOT(name, body)                                                                \
    static void name##_neon(int64_t n, float *s, const void *vx, const void *vy)                \
    {                                                                                            \
        *s = body(n, vx, vy, dot16_neon);                                                        \
    }                                                                                            \
    SDOT static void name##_sdot(int64_t n, float *s, const void *vx, const void *vy)           \
    {                                                                                            \
        *s = body(n, vx, vy, sdot);                                                              \
    }

NEON_AND_SDOT(vec_dot_q4_0_q8_0, dot_q4_0)
NEON_AND_SDOT(vec_dot_q4_1_q8_1, dot_q4_1)
NEON_AND_SDOT(vec_dot_q5_0_q8_0, dot_q5_0)
NEON_AND_SDOT(vec_dot_q5_1_q8_1, dot_q5_1)
NEON_AND_SDOT(vec_dot_q8_0_q8_0, dot_q8_0)
NEON_AND_SDOT(vec_dot_q4_K_q8_K, dot_q4_K)
NEON_AND_SDOT(vec_dot_q5_K_q8_K, dot_q5_K)
NEON_AND_SDOT(vec_dot_q6_K_q8_K, dot_q6_K)

/* ---------------------------------------------------------------------------------------------
 * Float dot products: widen to F32, fused multiply-add into four accumulators.
 * ------------------------------------------------------------------------------------------- */

static void vec_dot_f32_neon(int64_t n, float *s, const void *vx, const void *vy)
{
    const float *x = vx, *y = vy;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        acc0 = vfmaq_f32(acc0, vld1q_f32(x + i), vld1q_f32(y + i));
        acc1 = vfmaq_f32(acc1, vld1q_f32(x + i + 4), vld1q_f32(y + i + 4));
        acc2 = vfmaq_f32(acc2, vld1q_f32(x + i + 8), vld1q_f32(y + i + 8));
        acc3 = vfmaq_f32(acc3, vld1q_f32(x + i + 12), vld1q_f32(y + i + 12));
    }
    for (; i + 4 <= n; i += 4)
        acc0 = vfmaq_f32(acc0, vld1q_f32(x + i), vld1q_f32(y + i));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; i++)
        sum += x[i] * y[i];
    *s = sum;
}

/* F16 widens exactly with FCVTL, which every AArch64 CPU has (FP16 arithmetic is not needed). */
static void vec_dot_f16_neon(int64_t n, float *s, const void *vx, const void *vy)
{
    const kiri_f16 *x = vx, *y = vy;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0, acc2 = acc0, acc3 = acc0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const float16x8_t x0 = vreinterpretq_f16_u16(vld1q_u16(x + i));
        const float16x8_t x1 = vreinterpretq_f16_u16(vld1q_u16(x + i + 8));
        const float16x8_t y0 = vreinterpretq_f16_u16(vld1q_u16(y + i));
        const float16x8_t y1 = vreinterpretq_f16_u16(vld1q_u16(y + i + 8));
        acc0 = vfmaq_f32(acc0, vcvt_f32_f16(vget_low_f16(x0)), vcvt_f32_f16(vget_low_f16(y0)));
        acc1 = vfmaq_f32(acc1, vcvt_high_f32_f16(x0), vcvt_high_f32_f16(y0));
        acc2 = vfmaq_f32(acc2, vcvt_f32_f16(vget_low_f16(x1)), vcvt_f32_f16(vget_low_f16(y1)));
        acc3 = vfmaq_f32(acc3, vcvt_high_f32_f16(x1), vcvt_high_f32_f16(y1));
    }
    for (; i + 4 <= n; i += 4)
        acc0 = vfmaq_f32(acc0, vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(x + i))),
                         vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(y + i))));
    float sum = vaddvq_f32(vaddq_f32(vaddq_f32(acc0, acc1), vaddq_f32(acc2, acc3)));
    for (; i < n; i++)
        sum += h2f(x[i]) * h2f(y[i]);
    *s = sum;
}

/* bfloat16 widens by a 16-bit shift into the top of the F32. */
static void vec_dot_bf16_neon(int64_t n, float *s, const void *vx, const void *vy)
{
    const kiri_bf16 *x = vx, *y = vy;
    float32x4_t acc0 = vdupq_n_f32(0), acc1 = acc0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t xv = vld1q_u16(x + i), yv = vld1q_u16(y + i);
        acc0 = vfmaq_f32(acc0, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(xv), 16)),
                         vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(yv), 16)));
        acc1 = vfmaq_f32(acc1, vreinterpretq_f32_u32(vshll_high_n_u16(xv, 16)),
                         vreinterpretq_f32_u32(vshll_high_n_u16(yv, 16)));
    }
    float sum = vaddvq_f32(vaddq_f32(acc0, acc1));
    for (; i < n; i++)
        sum += bf2f(x[i]) * bf2f(y[i]);
    *s = sum;
}

/* ---------------------------------------------------------------------------------------------
 * Activation conversions (byte-identical with the reference)
 * ------------------------------------------------------------------------------------------- */

static void conv_f16_neon(const float *x, void *vy, int64_t n)
{
    kiri_f16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vcvt_high_f16_f32(vcvt_f16_f32(vld1q_f32(x + i)), vld1q_f32(x + i + 4));
        vst1q_u16(y + i, vreinterpretq_u16_f16(h));
    }
    for (; i < n; i++)
        y[i] = f2h(x[i]);
}

/* The largest |x| of 32 values; NaNs are ignored, as in the reference's comparison. */
static inline float absmax32(const float32x4_t v[8])
{
    float32x4_t m = vabsq_f32(v[0]);
    for (int k = 1; k < 8; k++)
        m = vmaxnmq_f32(m, vabsq_f32(v[k]));
    return vmaxnmvq_f32(m);
}

/* Rounds v[k] * id half away from zero (roundf) into 32 int8, and returns their sum. */
static inline int round_store_32(int8_t *dst, const float32x4_t v[8], float id)
{
    int32x4_t q[8];
    for (int k = 0; k < 8; k++)
        q[k] = vcvtaq_s32_f32(vmulq_n_f32(v[k], id));
    for (int k = 0; k < 8; k += 4) {
        const int16x8_t h0 = vcombine_s16(vqmovn_s32(q[k]), vqmovn_s32(q[k + 1]));
        const int16x8_t h1 = vcombine_s16(vqmovn_s32(q[k + 2]), vqmovn_s32(q[k + 3]));
        vst1q_s8(dst + 4 * k, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
    }
    const int32x4_t s = vaddq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])),
                                  vaddq_s32(vaddq_s32(q[4], q[5]), vaddq_s32(q[6], q[7])));
    return vaddvq_s32(s);
}

/* Q8_0 and Q8_1: d = amax / 127, values rounded half away from zero. */
static void quant_q8_0_neon(const float *x, void *vy, int64_t n)
{
    struct kiri_block_q8_0 *y = vy;
    for (int64_t i = 0; i < n / KIRI_QK8_0; i++, x += KIRI_QK8_0) {
        float32x4_t v[8];
        for (int k = 0; k < 8; k++)
            v[k] = vld1q_f32(x + 4 * k);
        const float d = absmax32(v) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = f2h(d);
        (void)round_store_32(y[i].qs, v, id);
    }
}

static void quant_q8_1_neon(const float *x, void *vy, int64_t n)
{
    struct kiri_block_q8_1 *y = vy;
    for (int64_t i = 0; i < n / KIRI_QK8_1; i++, x += KIRI_QK8_1) {
        float32x4_t v[8];
        for (int k = 0; k < 8; k++)
            v[k] = vld1q_f32(x + 4 * k);
        const float d = absmax32(v) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const int sum = round_store_32(y[i].qs, v, id);
        y[i].d = f2h(d);
        y[i].s = f2h((float)sum * d);
    }
}

/* Q8_K: the value of largest magnitude (the first one on ties) maps to -127; values round to
 * nearest, ties to even (FCVTNS, as the reference's nearest_int), capped at 127. */
static void quant_q8_K_neon(const float *x, void *vy, int64_t n)
{
    struct kiri_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++, x += KIRI_QK_K) {
        float32x4_t vmax = vld1q_f32(x), vmin = vmax;
        for (int k = 4; k < KIRI_QK_K; k += 4) {
            const float32x4_t v = vld1q_f32(x + k);
            vmax = vmaxnmq_f32(vmax, v);
            vmin = vminnmq_f32(vmin, v);
        }
        const float hi = vmaxnmvq_f32(vmax), lo = vminnmvq_f32(vmin);
        const float amax = hi > -lo ? hi : -lo;
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max;
        if (hi != -lo) {
            max = hi > -lo ? hi : lo;
        } else { /* +amax and -amax both occur: the first one decides, as in the reference */
            max = hi;
            for (int k = 0; k < KIRI_QK_K; k++)
                if (x[k] == hi || x[k] == lo) {
                    max = x[k];
                    break;
                }
        }
        const float iscale = -127.f / max;
        const int32x4_t cap = vdupq_n_s32(127);
        for (int g = 0; g < KIRI_QK_K; g += 16) {
            int32x4_t q[4];
            for (int k = 0; k < 4; k++)
                q[k] = vminq_s32(vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + g + 4 * k), iscale)), cap);
            const int16x8_t h0 = vcombine_s16(vqmovn_s32(q[0]), vqmovn_s32(q[1]));
            const int16x8_t h1 = vcombine_s16(vqmovn_s32(q[2]), vqmovn_s32(q[3]));
            vst1q_s8(y[i].qs + g, vcombine_s8(vqmovn_s16(h0), vqmovn_s16(h1)));
            y[i].bsums[g / 16] = (int16_t)vaddvq_s32(vaddq_s32(vaddq_s32(q[0], q[1]), vaddq_s32(q[2], q[3])));
        }
        y[i].d = 1 / iscale;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Table
 * ------------------------------------------------------------------------------------------- */

void kiri_cpu_kernels_init_neon(struct kiri_cpu_kernels *k, uint32_t cpu_features)
{
    const int sdot = (cpu_features & KIRI_CPU_DOTPROD) != 0;
    k->vec_dot[KIRI_TYPE_F32] = vec_dot_f32_neon;
    k->vec_dot[KIRI_TYPE_F16] = vec_dot_f16_neon;
    k->vec_dot[KIRI_TYPE_BF16] = vec_dot_bf16_neon;
    k->vec_dot[KIRI_TYPE_Q4_0] = sdot ? vec_dot_q4_0_q8_0_sdot : vec_dot_q4_0_q8_0_neon;
    k->vec_dot[KIRI_TYPE_Q4_1] = sdot ? vec_dot_q4_1_q8_1_sdot : vec_dot_q4_1_q8_1_neon;
    k->vec_dot[KIRI_TYPE_Q5_0] = sdot ? vec_dot_q5_0_q8_0_sdot : vec_dot_q5_0_q8_0_neon;
    k->vec_dot[KIRI_TYPE_Q5_1] = sdot ? vec_dot_q5_1_q8_1_sdot : vec_dot_q5_1_q8_1_neon;
    k->vec_dot[KIRI_TYPE_Q8_0] = sdot ? vec_dot_q8_0_q8_0_sdot : vec_dot_q8_0_q8_0_neon;
    k->vec_dot[KIRI_TYPE_Q4_K] = sdot ? vec_dot_q4_K_q8_K_sdot : vec_dot_q4_K_q8_K_neon;
    k->vec_dot[KIRI_TYPE_Q5_K] = sdot ? vec_dot_q5_K_q8_K_sdot : vec_dot_q5_K_q8_K_neon;
    k->vec_dot[KIRI_TYPE_Q6_K] = sdot ? vec_dot_q6_K_q8_K_sdot : vec_dot_q6_K_q8_K_neon;
    k->from_float[KIRI_TYPE_F16] = conv_f16_neon;
    k->from_float[KIRI_TYPE_Q8_0] = quant_q8_0_neon;
    k->from_float[KIRI_TYPE_Q8_1] = quant_q8_1_neon;
    k->from_float[KIRI_TYPE_Q8_K] = quant_q8_K_neon;
    k->path = !sdot ? "neon" : cpu_features & KIRI_CPU_I8MM ? "neon+dotprod+i8mm" : "neon+dotprod";
    kiri_cpu_kernels_init_gemm_neon(k, cpu_features);
    kiri_cpu_kernels_init_ops_neon(k);
}

#else
typedef int kiri_quants_neon_unused; /* an empty translation unit is not valid ISO C */
#endif
