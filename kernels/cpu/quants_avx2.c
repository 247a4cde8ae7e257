/* AVX2 (with FMA and F16C) versions of the CPU kernels a matmul spends its time in: the dot
 * products of every weight type (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)
 * and the activation conversions to F16, Q8_0, Q8_1 and Q8_K.
 *
 * The file is compiled without -mavx2: each function carries a target attribute, so the binary
 * still runs on any x86-64 and kiri_cpu_kernels_init_avx2 may only be called after the CPU (and
 * the OS) reported AVX2, FMA and F16C (KIRI_CPU_AVX2).
 *
 * What must stay true:
 * - Same contracts as the reference kernels in quants.c. The activation quantizers produce the
 *   same bytes as the reference (same float operations, same rounding); the dot products compute
 *   the same integer block sums and differ from the reference only in the order of the float
 *   additions across blocks (tests/test_quants.c bounds that).
 * - The sign trick used for int8 x int8 products (|x| times y with x's sign) is exact as long as
 *   the activation never holds -128; the activation quantizers only produce -127..127.
 */
#include "cpu_kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

AVX2 static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline int hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}

AVX2 static inline float hmax_ps(__m256 v)
{
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline float hmin_ps(__m256 v)
{
    __m128 s = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_min_ps(s, _mm_movehl_ps(s, s));
    s = _mm_min_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline float h2f(kiri_f16 h)
{
    return _cvtsh_ss(h);
}

/* Sum of 32 signed int8 products, as 8 int32 partial sums. maddubs wants an unsigned operand,
 * so multiply |x| by y carrying x's sign; pairs stay below 2 * 128 * 127 (no int16 saturation). */
AVX2 static inline __m256i dot_i8(__m256i x, __m256i y)
{
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
}

/* Sum of 32 unsigned (0..127) x signed int8 products, as 8 int32 partial sums. */
AVX2 static inline __m256i dot_u8i8(__m256i x, __m256i y)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1));
}

/* The 16 bytes of a 32-value block's nibbles as 32 values in element order: low nibbles
 * (values 0..15) in the low lane, high nibbles (16..31) in the high lane. */
AVX2 static inline __m256i nibbles_32(const uint8_t *qs)
{
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(b, 4), b);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
}

/* Expands 32 bits to 32 bytes: byte i is 0xFF where bit i is set, else 0. */
AVX2 static inline __m256i bits_to_bytes(uint32_t bits)
{
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll,
                                           0x0101010101010101ll, 0x0000000000000000ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), pick);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

/* ---------------------------------------------------------------------------------------------
 * Dot products of the 32-value types
 * ------------------------------------------------------------------------------------------- */

/* One block's contribution, accumulated into acc. The loops below alternate two accumulators
 * so consecutive blocks' FMAs do not wait on each other (the FMA latency, not the integer work,
 * bounds a single chain). */
AVX2 static inline __m256 q4_0_block(const struct kiri_block_q4_0 *x, const struct kiri_block_q8_0 *y, __m256 acc)
{
    const __m256i q = _mm256_sub_epi8(nibbles_32(x->qs), _mm256_set1_epi8(8));
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256 d = _mm256_set1_ps(h2f(x->d) * h2f(y->d));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(q, a)), acc);
}

/* q - 16 as int8 is the nibble with 0xF0 or'ed in where the fifth bit is clear. */
AVX2 static inline __m256 q5_0_block(const struct kiri_block_q5_0 *x, const struct kiri_block_q8_0 *y, __m256 acc)
{
    uint32_t qh;
    memcpy(&qh, x->qh, 4); /* little-endian, as x86 is */
    const __m256i q = _mm256_or_si256(nibbles_32(x->qs),
                                      _mm256_andnot_si256(bits_to_bytes(qh), _mm256_set1_epi8((char)0xF0)));
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256 d = _mm256_set1_ps(h2f(x->d) * h2f(y->d));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(q, a)), acc);
}

AVX2 static inline __m256 q8_0_block(const struct kiri_block_q8_0 *x, const struct kiri_block_q8_0 *y, __m256 acc)
{
    const __m256i q = _mm256_loadu_si256((const __m256i *)x->qs);
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256 d = _mm256_set1_ps(h2f(x->d) * h2f(y->d));
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(q, a)), acc);
}

/* Q4_1/Q5_1 with Q8_1: the min's share m * s is summed separately in *summ. */
AVX2 static inline __m256 q4_1_block(const struct kiri_block_q4_1 *x, const struct kiri_block_q8_1 *y, __m256 acc,
                                     float *summ)
{
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256 d = _mm256_set1_ps(h2f(x->d) * h2f(y->d));
    *summ += h2f(x->m) * h2f(y->s);
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8i8(nibbles_32(x->qs), a)), acc);
}

AVX2 static inline __m256 q5_1_block(const struct kiri_block_q5_1 *x, const struct kiri_block_q8_1 *y, __m256 acc,
                                     float *summ)
{
    uint32_t qh;
    memcpy(&qh, x->qh, 4);
    const __m256i q = _mm256_or_si256(nibbles_32(x->qs), _mm256_and_si256(bits_to_bytes(qh), _mm256_set1_epi8(0x10)));
    const __m256i a = _mm256_loadu_si256((const __m256i *)y->qs);
    const __m256 d = _mm256_set1_ps(h2f(x->d) * h2f(y->d));
    *summ += h2f(x->m) * h2f(y->s);
    return _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_u8i8(q, a)), acc);
}

#define DOT_32(name, xtype, ytype, block)                                                        \
    AVX2 static void name(int64_t n, float *s, const void *vx, const void *vy)                  \
    {                                                                                            \
        const struct xtype *x = vx;                                                              \
        const struct ytype *y = vy;                                                              \
        const int64_t nb = n / 32;                                                               \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                          \
        int64_t i = 0;                                                                           \
        for (; i + 1 < nb; i += 2) {                                                             \
            acc0 = block(&x[i], &y[i], acc0);                                                    \
            acc1 = block(&x[i + 1], &y[i + 1], acc1);                                            \
        }                                                                                        \
        if (i < nb)                                                                              \
            acc0 = block(&x[i], &y[i], acc0);                                                    \
        *s = hsum_ps(_mm256_add_ps(acc0, acc1));                                                 \
    }

#define DOT_32_MIN(name, xtype, ytype, block)                                                    \
    AVX2 static void name(int64_t n, float *s, const void *vx, const void *vy)                  \
    {                                                                                            \
        const struct xtype *x = vx;                                                              \
        const struct ytype *y = vy;                                                              \
        const int64_t nb = n / 32;                                                               \
        __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();                          \
        float summ = 0;                                                                          \
        int64_t i = 0;                                                                           \
        for (; i + 1 < nb; i += 2) {                                                             \
            acc0 = block(&x[i], &y[i], acc0, &summ);                                             \
            acc1 = block(&x[i + 1], &y[i + 1], acc1, &summ);                                     \
        }                                                                                        \
        if (i < nb)                                                                              \
            acc0 = block(&x[i], &y[i], acc0, &summ);                                             \
        *s = hsum_ps(_mm256_add_ps(acc0, acc1)) + summ;                                          \
    }

DOT_32(vec_dot_q4_0_q8_0_avx2, kiri_block_q4_0, kiri_block_q8_0, q4_0_block)
DOT_32(vec_dot_q5_0_q8_0_avx2, kiri_block_q5_0, kiri_block_q8_0, q5_0_block)
DOT_32(vec_dot_q8_0_q8_0_avx2, kiri_block_q8_0, kiri_block_q8_0, q8_0_block)
DOT_32_MIN(vec_dot_q4_1_q8_1_avx2, kiri_block_q4_1, kiri_block_q8_1, q4_1_block)
DOT_32_MIN(vec_dot_q5_1_q8_1_avx2, kiri_block_q5_1, kiri_block_q8_1, q5_1_block)

/* ---------------------------------------------------------------------------------------------
 * Dot products of the K-quants
 * ------------------------------------------------------------------------------------------- */

/* The 8 scales and 8 mins of a Q4_K/Q5_K block (6 bits each, packed in 12 bytes; see
 * get_scale_min_k4 in quants.c), unpacked with word operations. */
static inline void unpack_scales_k4(const uint8_t *p, uint8_t *sc, uint8_t *mn)
{
    uint32_t w[3], out[4];
    memcpy(w, p, 12);
    out[0] = w[0] & 0x3f3f3f3fu;                                       /* scales 0-3 */
    out[1] = (w[2] & 0x0f0f0f0fu) | ((w[0] >> 2) & 0x30303030u);        /* scales 4-7 */
    out[2] = w[1] & 0x3f3f3f3fu;                                       /* mins 0-3 */
    out[3] = ((w[2] >> 4) & 0x0f0f0f0fu) | ((w[1] >> 2) & 0x30303030u); /* mins 4-7 */
    memcpy(sc, out, 8);
    memcpy(mn, out + 2, 8);
}

AVX2 static void vec_dot_q4_K_q8_K_avx2(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q4_K *x = vx;
    const struct kiri_block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps();
    float summ_acc = 0;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++) {
        uint8_t sc[8], mn[8];
        unpack_scales_k4(x[i].scales, sc, mn);
        /* The mins meet the activation sums: sum_j mn_j * (bsums[2j] + bsums[2j+1]). */
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m128i mn8 = _mm_loadl_epi64((const __m128i *)mn);
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8)); /* each twice */
        const int summ = hsum_epi32(_mm256_madd_epi16(bs, mn16));

        /* Three rounds of horizontal adds fold the eight sub-blocks' products into [s0 .. s7] per
         * 128-bit half (each 16 products, at most 16 * 15 * 127 < 2^15), then one madd applies
         * the eight scales. */
        __m256i pp[4];
        for (int j = 0; j < 4; j++) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * j));
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * j + 32));
            const __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), a0);
            const __m256i p1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), a1);
            pp[j] = _mm256_hadd_epi16(p0, p1);
        }
        const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(pp[0], pp[1]), _mm256_hadd_epi16(pp[2], pp[3]));
        const __m256i scw = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)sc)));
        const __m256i sumi = _mm256_madd_epi16(h, scw);
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        summ_acc += y[i].d * h2f(x[i].dmin) * (float)summ;
    }
    *s = hsum_ps(acc) - summ_acc;
}

/* Q5_K: Q4_K plus a fifth bit per value; chunk j of 64 values takes bits 2j (first 32) and
 * 2j + 1 (last 32) of the 32 qh bytes. */
AVX2 static void vec_dot_q5_K_q8_K_avx2(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q5_K *x = vx;
    const struct kiri_block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float summ_acc = 0;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++) {
        uint8_t sc[8], mn[8];
        unpack_scales_k4(x[i].scales, sc, mn);
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m128i mn8 = _mm_loadl_epi64((const __m128i *)mn);
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
        const int summ = hsum_epi32(_mm256_madd_epi16(bs, mn16));

        __m256i hb = _mm256_loadu_si256((const __m256i *)x[i].qh);
        __m256i sumi = _mm256_setzero_si256();
        for (int j = 0; j < 4; j++, hb = _mm256_srli_epi16(hb, 2)) {
            const __m256i q = _mm256_loadu_si256((const __m256i *)(x[i].qs + 32 * j));
            const __m256i a0 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * j));
            const __m256i a1 = _mm256_loadu_si256((const __m256i *)(y[i].qs + 64 * j + 32));
            const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(hb, one), 4);
            const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), one), 4);
            const __m256i q0 = _mm256_or_si256(_mm256_and_si256(q, m4), h0);
            const __m256i q1 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), h1);
            /* 31 * 127 * 2 fits int16 */
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q0, a0), _mm256_set1_epi16(sc[2 * j])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(q1, a1), _mm256_set1_epi16(sc[2 * j + 1])));
        }
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        summ_acc += y[i].d * h2f(x[i].dmin) * (float)summ;
    }
    *s = hsum_ps(acc) - summ_acc;
}

/* Q6_K: quants are q - 32 with q in 0..63, so sum (q - 32) a = sum q a - 32 sum a, and the sums of
 * a per 16 values are Q8_K's bsums. Each run of 32 values spans two 16-value scale groups; a byte
 * shuffle spreads scale g over the low lane and g + 1 over the high lane. */
AVX2 static void vec_dot_q6_K_q8_K_avx2(int64_t n, float *s, const void *vx, const void *vy)
{
    const struct kiri_block_q6_K *x = vx;
    const struct kiri_block_q8_K *y = vy;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
    /* Shuffles picking int16 scale 2k (low lane) and 2k + 1 (high lane) from 8 scales. */
    const __m256i pick[4] = {
        _mm256_set_epi64x(0x0302030203020302ll, 0x0302030203020302ll, 0x0100010001000100ll, 0x0100010001000100ll),
        _mm256_set_epi64x(0x0706070607060706ll, 0x0706070607060706ll, 0x0504050405040504ll, 0x0504050405040504ll),
        _mm256_set_epi64x(0x0b0a0b0a0b0a0b0all, 0x0b0a0b0a0b0a0b0all, 0x0908090809080908ll, 0x0908090809080908ll),
        _mm256_set_epi64x(0x0f0e0f0e0f0e0f0ell, 0x0f0e0f0e0f0e0f0ell, 0x0d0c0d0c0d0c0d0cll, 0x0d0c0d0c0d0c0d0cll),
    };
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < n / KIRI_QK_K; i++) {
        const __m128i sc8 = _mm_loadu_si128((const __m128i *)x[i].scales);
        const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
        const __m256i bs = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const int bias = hsum_epi32(_mm256_madd_epi16(bs, sc16));

        __m256i sumi = _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = x[i].ql + 64 * h, *qh = x[i].qh + 32 * h;
            const int8_t *a = y[i].qs + 128 * h;
            const __m128i sch = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(x[i].scales + 8 * h)));
            const __m256i scb = _mm256_broadcastsi128_si256(sch);
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql);
            const __m256i l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
            for (int k = 0; k < 4; k++) {
                const __m256i av = _mm256_loadu_si256((const __m256i *)(a + 32 * k));
                const __m256i p = _mm256_maddubs_epi16(q[k], av); /* 63 * 127 * 2 fits int16 */
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, _mm256_shuffle_epi8(scb, pick[k])));
            }
        }
        const float d = y[i].d * h2f(x[i].d);
        const __m256i total = _mm256_sub_epi32(sumi, _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, 32 * bias));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(total), acc);
    }
    *s = hsum_ps(acc);
}

/* ---------------------------------------------------------------------------------------------
 * F16 dot product: F16C widening, FMA into four accumulators.
 * ------------------------------------------------------------------------------------------- */

AVX2 static void vec_dot_f16_avx2(int64_t n, float *s, const void *vx, const void *vy)
{
    const kiri_f16 *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        for (int k = 0; k < 4; k++) {
            const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i + 8 * k)));
            const __m256 yv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i + 8 * k)));
            acc[k] = _mm256_fmadd_ps(xv, yv, acc[k]);
        }
    }
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + i)));
        const __m256 yv = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(y + i)));
        acc[0] = _mm256_fmadd_ps(xv, yv, acc[0]);
    }
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++)
        sum += h2f(x[i]) * h2f(y[i]);
    *s = sum;
}

AVX2 static void vec_dot_f32_avx2(int64_t n, float *s, const void *vx, const void *vy)
{
    const float *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i + 8 * k), _mm256_loadu_ps(y + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i), acc[0]);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++)
        sum += x[i] * y[i];
    *s = sum;
}

/* bfloat16 widens by a 16-bit shift. */
AVX2 static inline __m256 load_bf16(const kiri_bf16 *p)
{
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
}

AVX2 static void vec_dot_bf16_avx2(int64_t n, float *s, const void *vx, const void *vy)
{
    const kiri_bf16 *x = vx, *y = vy;
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int k = 0; k < 4; k++)
            acc[k] = _mm256_fmadd_ps(load_bf16(x + i + 8 * k), load_bf16(y + i + 8 * k), acc[k]);
    for (; i + 8 <= n; i += 8)
        acc[0] = _mm256_fmadd_ps(load_bf16(x + i), load_bf16(y + i), acc[0]);
    float sum = hsum_ps(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; i < n; i++)
        sum += kiri_bf16_to_f32(x[i]) * kiri_bf16_to_f32(y[i]);
    *s = sum;
}

/* ---------------------------------------------------------------------------------------------
 * Activation quantizers (byte-identical with the reference)
 * ------------------------------------------------------------------------------------------- */

/* roundf: to nearest, halfway cases away from zero (not the SIMD default, ties to even). */
AVX2 static inline __m256 round_away(__m256 v)
{
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t)); /* exact */
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 step = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f));
    return _mm256_add_ps(t, _mm256_and_ps(up, step));
}

/* Packs 4 x 8 int32 (each in -128..127) into 32 int8 in order. */
AVX2 static inline __m256i pack_i32x4(__m256i a, __m256i b, __m256i c, __m256i d)
{
    const __m256i ab = _mm256_packs_epi32(a, b), cd = _mm256_packs_epi32(c, d);
    const __m256i v = _mm256_packs_epi16(ab, cd); /* lane-interleaved groups of 4 */
    return _mm256_permutevar8x32_epi32(v, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

AVX2 static void quant_q8_0_avx2(const float *x, void *vy, int64_t n)
{
    struct kiri_block_q8_0 *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / KIRI_QK8_0; i++, x += KIRI_QK8_0) {
        __m256 v[4];
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_loadu_ps(x + 8 * k);
        const __m256 m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
        const __m256 m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
        const float amax = hmax_ps(_mm256_max_ps(m01, m23));
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        const __m256 mul = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(round_away(_mm256_mul_ps(v[k], mul)));
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32x4(q[0], q[1], q[2], q[3]));
    }
}

AVX2 static void quant_q8_1_avx2(const float *x, void *vy, int64_t n)
{
    struct kiri_block_q8_1 *y = vy;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n / KIRI_QK8_1; i++, x += KIRI_QK8_1) {
        __m256 v[4];
        for (int k = 0; k < 4; k++)
            v[k] = _mm256_loadu_ps(x + 8 * k);
        const __m256 m01 = _mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1]));
        const __m256 m23 = _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3]));
        const float amax = hmax_ps(_mm256_max_ps(m01, m23));
        const float d = amax / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        const __m256 mul = _mm256_set1_ps(id);
        __m256i q[4];
        for (int k = 0; k < 4; k++)
            q[k] = _mm256_cvtps_epi32(round_away(_mm256_mul_ps(v[k], mul)));
        const int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
        _mm256_storeu_si256((__m256i *)y[i].qs, pack_i32x4(q[0], q[1], q[2], q[3]));
        y[i].d = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        y[i].s = _cvtss_sh((float)sum * d, _MM_FROUND_TO_NEAREST_INT);
    }
}

/* vcvtps2ph rounds to nearest even and quiets NaNs keeping the top payload bits, exactly what
 * kiri_f32_to_f16 does. */
AVX2 static void conv_f16_avx2(const float *x, void *vy, int64_t n)
{
    kiri_f16 *y = vy;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++)
        y[i] = _cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

/* Q8_K: the value of largest magnitude (the first on ties) maps to -127; values round to nearest
 * even (cvtps under the default rounding mode, as the reference's nearest_int). */
AVX2 static void quant_q8_K_avx2(const float *x, void *vy, int64_t n)
{
    struct kiri_block_q8_K *y = vy;
    for (int64_t i = 0; i < n / KIRI_QK_K; i++, x += KIRI_QK_K) {
        __m256 vmax = _mm256_loadu_ps(x), vmin = vmax;
        for (int k = 8; k < KIRI_QK_K; k += 8) {
            const __m256 v = _mm256_loadu_ps(x + k);
            vmax = _mm256_max_ps(vmax, v);
            vmin = _mm256_min_ps(vmin, v);
        }
        const float hi = hmax_ps(vmax), lo = hmin_ps(vmin);
        const float amax = hi > -lo ? hi : -lo;
        if (amax == 0.0f) {
            memset(&y[i], 0, sizeof y[i]);
            continue;
        }
        float max;
        if (hi != -lo) {
            max = hi > -lo ? hi : lo;
        } else { /* +amax and -amax both occur: the first one decides, as in the reference */
            max = 0;
            for (int k = 0; k < KIRI_QK_K; k++)
                if (x[k] == hi || x[k] == lo) {
                    max = x[k];
                    break;
                }
        }
        const float iscale = -127.f / max;
        const __m256 mul = _mm256_set1_ps(iscale);
        const __m256i cap = _mm256_set1_epi32(127);
        for (int g = 0; g < KIRI_QK_K; g += 64) {
            __m256i q[8];
            for (int k = 0; k < 8; k++)
                q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + g + 8 * k), mul)), cap);
            _mm256_storeu_si256((__m256i *)(y[i].qs + g), pack_i32x4(q[0], q[1], q[2], q[3]));
            _mm256_storeu_si256((__m256i *)(y[i].qs + g + 32), pack_i32x4(q[4], q[5], q[6], q[7]));
            /* Four sums of 16: add the two vectors of each group, then fold lanes. */
            const __m256i s0 = _mm256_add_epi32(q[0], q[1]), s1 = _mm256_add_epi32(q[2], q[3]);
            const __m256i s2 = _mm256_add_epi32(q[4], q[5]), s3 = _mm256_add_epi32(q[6], q[7]);
            const __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(s0, s1), _mm256_hadd_epi32(s2, s3));
            const __m128i sums = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            _mm_storel_epi64((__m128i *)(y[i].bsums + g / 16), _mm_packs_epi32(sums, sums));
        }
        y[i].d = 1 / iscale;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Table
 * ------------------------------------------------------------------------------------------- */

void kiri_cpu_kernels_init_avx2(struct kiri_cpu_kernels *k)
{
    k->vec_dot[KIRI_TYPE_F32] = vec_dot_f32_avx2;
    k->vec_dot[KIRI_TYPE_F16] = vec_dot_f16_avx2;
    k->vec_dot[KIRI_TYPE_BF16] = vec_dot_bf16_avx2;
    k->vec_dot[KIRI_TYPE_Q4_0] = vec_dot_q4_0_q8_0_avx2;
    k->vec_dot[KIRI_TYPE_Q4_1] = vec_dot_q4_1_q8_1_avx2;
    k->vec_dot[KIRI_TYPE_Q5_0] = vec_dot_q5_0_q8_0_avx2;
    k->vec_dot[KIRI_TYPE_Q5_1] = vec_dot_q5_1_q8_1_avx2;
    k->vec_dot[KIRI_TYPE_Q8_0] = vec_dot_q8_0_q8_0_avx2;
    k->vec_dot[KIRI_TYPE_Q4_K] = vec_dot_q4_K_q8_K_avx2;
    k->vec_dot[KIRI_TYPE_Q5_K] = vec_dot_q5_K_q8_K_avx2;
    k->vec_dot[KIRI_TYPE_Q6_K] = vec_dot_q6_K_q8_K_avx2;
    k->from_float[KIRI_TYPE_F16] = conv_f16_avx2;
    k->from_float[KIRI_TYPE_Q8_0] = quant_q8_0_avx2;
    k->from_float[KIRI_TYPE_Q8_1] = quant_q8_1_avx2;
    k->from_float[KIRI_TYPE_Q8_K] = quant_q8_K_avx2;
    k->path = "avx2";
}

#else
typedef int kiri_quants_avx2_unused; /* an empty translation unit is not valid ISO C */
#endif
