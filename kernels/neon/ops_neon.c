/* ARM NEON versions of the row operations of ops.c that cost time in a step: attention over an
 * F16 or F32 key/value cache (one head, a group of heads sharing a key/value head, and a tile of
 * a prompt's tokens times such heads), the RMS norm, SwiGLU, GeGLU, scaling and soft-capping
 * rows, and the recurrent layers' steps (one head of the gated delta rule, one token's short
 * convolution). The attention of decoding
 * grows with the context, prefill's with the square of the prompt.
 *
 * What must stay true: the same numerics as kiri_cpu_attend_head in ops.c (the query rounded to
 * F16 for an F16 cache, scores scaled after the dot product, the softmax denominator summed in
 * double, the attention weights rounded to F16 for an F16 cache), differing only in the order of
 * float additions and in exp, which is a polynomial within 2 ulp of expf. In a tile, the lanes of
 * a row outside its token's keys [kv_first, n_kv) get weight exactly 0 and its weighted sum covers
 * only its own keys, so keys and values only other tokens see (NaN or not) never reach it. The norm squares in float
 * and sums in double like the reference; SwiGLU is within a few ulp of it. Other cache types and
 * head sizes that are not a multiple of 4 (or above 1024) go to the reference kernel; groups and
 * tiles send head sizes above 256 one head at a time to attend_head_neon.
 *
 * NEON and its F16 conversions are part of every AArch64 CPU: no feature check is needed.
 */
#include "neon_kernels.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <math.h>

/* Helpers whose loops over registers must unroll (their size arguments are constants at every
 * call) so that accumulators stay in registers. */
#define INLINE static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 16")

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

/* e^x for x <= 0 (scores minus their maximum): x = n ln2 + r with |r| <= ln2 / 2, e^r by its
 * Taylor polynomial to degree 7 (truncation below 1e-8 relative), 2^n put into the exponent.
 * Results below the smallest normal float flush to 0. NaN propagates (FMAX keeps it). */
INLINE float32x4_t exp_neg(float32x4_t x)
{
    const float32x4_t lo = vdupq_n_f32(-87.33654f);
    const uint32x4_t under = vcltq_f32(x, lo);
    x = vmaxq_f32(lo, x);
    const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
    r = vfmsq_f32(r, n, vdupq_n_f32(1.428606765330187045e-06f));
    float32x4_t p = vdupq_n_f32(1.0f / 5040);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 720), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 120), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 24), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f / 6), p, r);
    p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.0f), p, r);
    const int32x4_t e = vshlq_n_s32(vcvtq_s32_f32(n), 23);
    const uint32x4_t y = vreinterpretq_u32_s32(vaddq_s32(vreinterpretq_s32_f32(p), e));
    return vreinterpretq_f32_u32(vbicq_u32(y, under));
}

/* 4 values of a cache row (F16 or F32) at element i, as floats. */
INLINE float32x4_t load_kv(const void *row, int f16, int i)
{
    if (f16)
        return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const kiri_f16 *)row + i)));
    return vld1q_f32((const float *)row + i);
}

/* Rounds 4 floats through F16 and back (to nearest even), as an F16 cache's products do. */
INLINE float32x4_t round_f16(float32x4_t v)
{
    return vcvt_f32_f16(vcvt_f16_f32(v));
}

static float round_f16_1(float v)
{
    return vgetq_lane_f32(round_f16(vdupq_n_f32(v)), 0);
}

/* The 4 lanes' sums of 4 vectors, in order: [sum(a0) sum(a1) sum(a2) sum(a3)]. */
INLINE float32x4_t fold4(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3)
{
    return vpaddq_f32(vpaddq_f32(a0, a1), vpaddq_f32(a2, a3));
}

/* Adds 4 lanes of double sums: the double sum of the 4 lanes of e goes to lo (lanes 0, 1) and
 * hi (lanes 2, 3). */
INLINE void add_f64(float64x2_t *lo, float64x2_t *hi, float32x4_t e)
{
    *lo = vaddq_f64(*lo, vcvt_f64_f32(vget_low_f32(e)));
    *hi = vaddq_f64(*hi, vcvt_high_f64_f32(e));
}

/* Whether the NEON attention takes a cache of kv_type with head size d: F16 or F32, d a positive
 * multiple of 4 up to max_d (what its query buffers hold); the rest goes to the reference. */
static int neon_attend_ok(int kv_type, int d, int max_d)
{
    return (kv_type == KIRI_TYPE_F16 || kv_type == KIRI_TYPE_F32) && d % 4 == 0 && d > 0 && d <= max_d;
}

#define KROW(j) ((const char *)k + (size_t)slots[j] * k_stride)
#define VROW(j) ((const char *)v + (size_t)slots[j] * v_stride)

/* ---------------------------------------------------------------------------------------------
 * One head
 * ------------------------------------------------------------------------------------------- */

/* Scores of 4 key rows against qr: [s0 s1 s2 s3], unscaled. */
INLINE float32x4_t scores4(const float *qr, const void *k0, const void *k1, const void *k2,
                           const void *k3, int f16, int d)
{
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0, a2 = a0, a3 = a0;
    for (int i = 0; i < d; i += 4) {
        const float32x4_t qv = vld1q_f32(qr + i);
        a0 = vfmaq_f32(a0, qv, load_kv(k0, f16, i));
        a1 = vfmaq_f32(a1, qv, load_kv(k1, f16, i));
        a2 = vfmaq_f32(a2, qv, load_kv(k2, f16, i));
        a3 = vfmaq_f32(a3, qv, load_kv(k3, f16, i));
    }
    return fold4(a0, a1, a2, a3);
}

/* Scores of 8 key rows (kr[0..7]) against qr, unscaled, into s[0..7]: 8 accumulators keep the
 * multiply-add units busy where 4 would wait on each other. */
INLINE void scores8(const float *qr, const char *const kr[8], int f16, int d, float32x4_t s[2])
{
    float32x4_t a[8];
    UNROLL
    for (int t = 0; t < 8; t++)
        a[t] = vdupq_n_f32(0.0f);
    for (int i = 0; i < d; i += 4) {
        const float32x4_t qv = vld1q_f32(qr + i);
        UNROLL
        for (int t = 0; t < 8; t++)
            a[t] = vfmaq_f32(a[t], qv, load_kv(kr[t], f16, i));
    }
    s[0] = fold4(a[0], a[1], a[2], a[3]);
    s[1] = fold4(a[4], a[5], a[6], a[7]);
}

/* Value columns [c0, c0 + 4 NC) of the weighted sum over n_kv value rows, weights in w. */
INLINE void wsum_head(const void *v, size_t v_stride, const int32_t *slots, int n_kv, int f16,
                      const float *w, int c0, int NC, float *out)
{
    float32x4_t o[16];
    UNROLL
    for (int c = 0; c < NC; c++)
        o[c] = vdupq_n_f32(0.0f);
    for (int j = 0; j < n_kv; j++) {
        const char *vr = VROW(j);
        const float wj = w[j];
        UNROLL
        for (int c = 0; c < NC; c++)
            o[c] = vfmaq_n_f32(o[c], load_kv(vr, f16, c0 + 4 * c), wj);
    }
    UNROLL
    for (int c = 0; c < NC; c++)
        vst1q_f32(out + c0 + 4 * c, o[c]);
}

static void attend_head_neon(const float *q, const void *k, size_t k_stride, const void *v,
                             size_t v_stride, int kv_type, const int32_t *slots, int n_kv,
                             int head_dim, float scale, float *scratch, float *out)
{
    const int d = head_dim;
    if (!neon_attend_ok(kv_type, d, 1024)) {
        kiri_cpu_attend_head(q, k, k_stride, v, v_stride, kv_type, slots, n_kv, head_dim, scale,
                             scratch, out);
        return;
    }
    const int f16 = kv_type == KIRI_TYPE_F16;
    float qr[1024];
    for (int i = 0; i < d; i += 4) {
        const float32x4_t qv = vld1q_f32(q + i);
        vst1q_f32(qr + i, f16 ? round_f16(qv) : qv);
    }

    /* Scores, scaled, and their maximum: 8 keys at a time, then 4, then the last 1 to 3 with
     * the last key repeated in the unused lanes. */
    const float32x4_t sc = vdupq_n_f32(scale);
    float32x4_t vmax = vdupq_n_f32(-INFINITY);
    int j = 0;
    for (; j + 8 <= n_kv; j += 8) {
        const char *kr[8];
        for (int t = 0; t < 8; t++)
            kr[t] = KROW(j + t);
        float32x4_t s[2];
        scores8(qr, kr, f16, d, s);
        s[0] = vmulq_f32(s[0], sc);
        s[1] = vmulq_f32(s[1], sc);
        vst1q_f32(scratch + j, s[0]);
        vst1q_f32(scratch + j + 4, s[1]);
        vmax = vmaxq_f32(vmax, vmaxq_f32(s[0], s[1]));
    }
    for (; j < n_kv; j += 4) {
        const int l = n_kv - 1;
        const float32x4_t s = vmulq_f32(scores4(qr, KROW(j), KROW(j + 1 <= l ? j + 1 : l),
                                                KROW(j + 2 <= l ? j + 2 : l),
                                                KROW(j + 3 <= l ? j + 3 : l), f16, d),
                                        sc);
        vmax = vmaxq_f32(vmax, s); /* the repeated lanes hold the last key's score */
        if (j + 4 <= n_kv) {
            vst1q_f32(scratch + j, s);
        } else {
            float t[4];
            vst1q_f32(t, s);
            for (int i = 0; j + i < n_kv; i++)
                scratch[j + i] = t[i];
        }
    }
    const float max = vmaxvq_f32(vmax);

    /* Softmax numerators in place, their sum in double. */
    const float32x4_t mv = vdupq_n_f32(max);
    float64x2_t s_lo = vdupq_n_f64(0.0), s_hi = vdupq_n_f64(0.0);
    j = 0;
    for (; j + 4 <= n_kv; j += 4) {
        const float32x4_t e = exp_neg(vsubq_f32(vld1q_f32(scratch + j), mv));
        vst1q_f32(scratch + j, e);
        add_f64(&s_lo, &s_hi, e);
    }
    double sum = vaddvq_f64(vaddq_f64(s_lo, s_hi));
    for (; j < n_kv; j++) {
        const float e = expf(scratch[j] - max);
        scratch[j] = e;
        sum += (double)e;
    }
    const float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;

    /* Weights (rounded to F16 for an F16 cache), then the weighted sum of value rows, 64 values
     * of the head at a time in registers. */
    const float32x4_t iv = vdupq_n_f32(inv);
    j = 0;
    for (; j + 4 <= n_kv; j += 4) {
        const float32x4_t w = vmulq_f32(vld1q_f32(scratch + j), iv);
        vst1q_f32(scratch + j, f16 ? round_f16(w) : w);
    }
    for (; j < n_kv; j++) {
        const float w = scratch[j] * inv;
        scratch[j] = f16 ? round_f16_1(w) : w;
    }
    int c0 = 0;
    for (; c0 + 64 <= d; c0 += 64)
        wsum_head(v, v_stride, slots, n_kv, f16, scratch, c0, 16, out);
    for (; c0 + 16 <= d; c0 += 16)
        wsum_head(v, v_stride, slots, n_kv, f16, scratch, c0, 4, out);
    for (; c0 < d; c0 += 4)
        wsum_head(v, v_stride, slots, n_kv, f16, scratch, c0, 1, out);
}

/* ---------------------------------------------------------------------------------------------
 * Several rows against one key/value head (groups and tiles)
 * ------------------------------------------------------------------------------------------- */

/* Rows of queries against one key/value head: up to 16 (tokens x heads), in lane groups of 4.
 * Row h's query rounded as the cache's products round it is qv[s * rows4 + h] for its values
 * 4s .. 4s + 3 (interleaved, so a pass over the head reads it in order); rows4 is the row count
 * rounded up to 4, rows past the real ones repeat the last and see no keys. The scores, then the
 * weights, of key j for row h sit at scratch[rows4 * j + h]. */
struct rows {
    float32x4_t qv[1024]; /* (d / 4, rows4): head size at most 256 */
    float *out[16];       /* borrowed: row h's output, head_dim floats */
    int32_t fk[16], nk[16]; /* row h sees the keys [fk[h], nk[h]); both 0 for rows seeing none */
    int n, n4, n_max;     /* rows, rows rounded up to 4, largest nk */
    int j_lo;             /* smallest fk of the rows that see keys (n_max if none) */
};

/* Scores of every key row against 4 G query rows, scaled after the dot product: the key row is
 * read and widened once for all of them. */
INLINE void score_keys(const struct rows *R, const void *k, size_t k_stride, const int32_t *slots,
                       int f16, int d, float scale, float *scratch, int G)
{
    const float32x4_t sc = vdupq_n_f32(scale);
    for (int j = R->j_lo; j < R->n_max; j++) {
        const char *kr = KROW(j);
        float32x4_t a[16];
        UNROLL
        for (int h = 0; h < 4 * G; h++)
            a[h] = vdupq_n_f32(0.0f);
        const float32x4_t *qv = R->qv;
        for (int i = 0; i < d; i += 4, qv += 4 * G) {
            const float32x4_t kv = load_kv(kr, f16, i);
            UNROLL
            for (int h = 0; h < 4 * G; h++)
                a[h] = vfmaq_f32(a[h], qv[h], kv);
        }
        UNROLL
        for (int g = 0; g < G; g++)
            vst1q_f32(scratch + (size_t)(4 * G) * (size_t)j + 4 * g,
                      vmulq_f32(fold4(a[4 * g], a[4 * g + 1], a[4 * g + 2], a[4 * g + 3]), sc));
    }
}

/* One multiply-add of value registers v[0 .. NC) into row h's accumulators o[h][0 .. NC), weighted
 * by lane h of w (h a constant), when cond holds. */
#define FMA_ROW(o, v, w, h, NC, cond)                                                              \
    do {                                                                                           \
        if (cond) {                                                                                \
            UNROLL                                                                                 \
            for (int c = 0; c < NC; c++)                                                           \
                (o)[h][c] = vfmaq_laneq_f32((o)[h][c], (v)[c], (w), h);                            \
        }                                                                                          \
    } while (0)

/* Value columns [c0, c0 + 4 NC) of the weighted sums of rows r0 .. r0 + 4 RG: one pass over the
 * keys all these rows see, then each row alone over the keys only some of them see. A value row
 * is read and widened once for all of them; 4 rows' weights come in one register. */
INLINE void wsum_rows(const struct rows *R, const void *v, size_t v_stride, const int32_t *slots,
                      int f16, const float *scratch, int r0, int c0, int RG, int NC)
{
    const int nr = R->n - r0 < 4 * RG ? R->n - r0 : 4 * RG;
    /* Keys [lo, hi) reach some of the rows, [all0, all1) all of them. */
    int lo = R->n_max, hi = 0, all0 = 0, all1 = R->n_max;
    for (int h = 0; h < nr; h++) {
        lo = R->fk[r0 + h] < lo ? R->fk[r0 + h] : lo;
        hi = R->nk[r0 + h] > hi ? R->nk[r0 + h] : hi;
        all0 = R->fk[r0 + h] > all0 ? R->fk[r0 + h] : all0;
        all1 = R->nk[r0 + h] < all1 ? R->nk[r0 + h] : all1;
    }
    float32x4_t o[8][2];
    UNROLL
    for (int h = 0; h < 4 * RG; h++)
        UNROLL
        for (int c = 0; c < NC; c++)
            o[h][c] = vdupq_n_f32(0.0f);
    for (int j = lo; j < hi; j++) {
        const char *vr = VROW(j);
        const float *wj = scratch + (size_t)R->n4 * (size_t)j + r0;
        float32x4_t vv[2];
        UNROLL
        for (int c = 0; c < NC; c++)
            vv[c] = load_kv(vr, f16, c0 + 4 * c);
        UNROLL
        for (int g = 0; g < RG; g++) {
            const float32x4_t w = vld1q_f32(wj + 4 * g);
            float32x4_t(*og)[2] = o + 4 * g;
            const int32_t *nk = R->nk + r0 + 4 * g, *fk = R->fk + r0 + 4 * g;
            if (j >= all0 && j < all1) {
                FMA_ROW(og, vv, w, 0, NC, 1);
                FMA_ROW(og, vv, w, 1, NC, 1);
                FMA_ROW(og, vv, w, 2, NC, 1);
                FMA_ROW(og, vv, w, 3, NC, 1);
            } else { /* rows that do not see key j: their weight is 0, but 0 times NaN is not */
                FMA_ROW(og, vv, w, 0, NC, j >= fk[0] && j < nk[0]);
                FMA_ROW(og, vv, w, 1, NC, j >= fk[1] && j < nk[1]);
                FMA_ROW(og, vv, w, 2, NC, j >= fk[2] && j < nk[2]);
                FMA_ROW(og, vv, w, 3, NC, j >= fk[3] && j < nk[3]);
            }
        }
    }
    UNROLL
    for (int h = 0; h < 4 * RG; h++)
        if (h < nr)
            UNROLL
            for (int c = 0; c < NC; c++)
                vst1q_f32(R->out[r0 + h] + c0 + 4 * c, o[h][c]);
}

/* The rows of R against one key/value head, with the result of attend_head_neon for each.
 * scratch holds R->n4 floats per key of the largest n_kv. The cache is F16 or F32, head_dim a
 * multiple of 4 and at most 256; R->qv, nk, out, n, n4 and n_max are set. */
static void attend_rows(struct rows *R, const void *k, size_t k_stride, const void *v,
                        size_t v_stride, int f16, const int32_t *slots, int d, float scale,
                        float *scratch)
{
    const int G = R->n4 / 4;
    switch (G) {
    case 1: score_keys(R, k, k_stride, slots, f16, d, scale, scratch, 1); break;
    case 2: score_keys(R, k, k_stride, slots, f16, d, scale, scratch, 2); break;
    case 3: score_keys(R, k, k_stride, slots, f16, d, scale, scratch, 3); break;
    default: score_keys(R, k, k_stride, slots, f16, d, scale, scratch, 4); break;
    }
    /* Softmax per lane over the lane's own keys: maxima, numerators (0 outside [fk, nk): the AND
     * also clears a NaN), sums in double, then the weights. */
    const float32x4_t ninf = vdupq_n_f32(-INFINITY);
    for (int g = 0; g < G; g++) {
        const int32x4_t lim = vld1q_s32(R->nk + 4 * g), from = vld1q_s32(R->fk + 4 * g);
#define LANE_SEES(j) vbicq_u32(vcgtq_s32(lim, vdupq_n_s32(j)), vcgtq_s32(from, vdupq_n_s32(j)))
        float32x4_t vmax = ninf;
        for (int j = R->j_lo; j < R->n_max; j++) {
            const uint32x4_t ok = LANE_SEES(j);
            const float32x4_t s = vld1q_f32(scratch + (size_t)R->n4 * (size_t)j + 4 * g);
            vmax = vmaxq_f32(vmax, vbslq_f32(ok, s, ninf));
        }
        float64x2_t s_lo = vdupq_n_f64(0.0), s_hi = vdupq_n_f64(0.0);
        for (int j = R->j_lo; j < R->n_max; j++) {
            float *sj = scratch + (size_t)R->n4 * (size_t)j + 4 * g;
            const uint32x4_t ok = LANE_SEES(j);
            const float32x4_t e = vreinterpretq_f32_u32(
                vandq_u32(ok, vreinterpretq_u32_f32(exp_neg(vsubq_f32(vld1q_f32(sj), vmax)))));
            vst1q_f32(sj, e);
            add_f64(&s_lo, &s_hi, e);
        }
        double sums[4];
        vst1q_f64(sums, s_lo);
        vst1q_f64(sums + 2, s_hi);
        float invs[4];
        for (int h = 0; h < 4; h++)
            invs[h] = sums[h] > 0.0 ? (float)(1.0 / sums[h]) : 0.0f;
        const float32x4_t inv = vld1q_f32(invs);
#undef LANE_SEES
        for (int j = R->j_lo; j < R->n_max; j++) {
            float *sj = scratch + (size_t)R->n4 * (size_t)j + 4 * g;
            const float32x4_t w = vmulq_f32(vld1q_f32(sj), inv);
            vst1q_f32(sj, f16 ? round_f16(w) : w);
        }
    }
    /* Weighted sums of the value rows: 8 rows x 8 values in registers per pass over the keys
     * (4 rows where only 4 are left, 4 values where only 4 are left). */
    for (int r0 = 0; r0 < R->n; r0 += 8) {
        const int two = R->n - r0 > 4;
        int c0 = 0;
        for (; c0 + 8 <= d; c0 += 8)
            if (two)
                wsum_rows(R, v, v_stride, slots, f16, scratch, r0, c0, 2, 2);
            else
                wsum_rows(R, v, v_stride, slots, f16, scratch, r0, c0, 1, 2);
        if (c0 < d) {
            if (two)
                wsum_rows(R, v, v_stride, slots, f16, scratch, r0, c0, 2, 1);
            else
                wsum_rows(R, v, v_stride, slots, f16, scratch, r0, c0, 1, 1);
        }
    }
}

/* Sets R's query row h (h < R->n4) from q, rounded for an F16 cache. */
static void rows_set_query(struct rows *R, int h, const float *q, int f16, int d)
{
    float32x4_t *qv = R->qv + h;
    for (int i = 0; i < d; i += 4, qv += R->n4) {
        const float32x4_t x = vld1q_f32(q + i);
        *qv = f16 ? round_f16(x) : x;
    }
}

/* n_q query heads sharing one key/value head: groups of up to 8 through attend_rows (scratch
 * holds 8 floats per key), a last single head and unsupported cases through attend_head_neon. */
static void attend_group_neon(const float *q, size_t q_stride, int n_q, const void *k, size_t k_stride,
                              const void *v, size_t v_stride, int kv_type, const int32_t *slots,
                              int n_kv, int head_dim, float scale, float *scratch, float *out,
                              size_t out_stride)
{
    const int d = head_dim;
    const int ok = neon_attend_ok(kv_type, d, 256);
    const int f16 = kv_type == KIRI_TYPE_F16;
    int h = 0;
    if (ok) {
        struct rows R;
        for (; n_q - h >= 2; h += R.n) {
            R.n = n_q - h < 8 ? n_q - h : 8;
            R.n4 = (R.n + 3) / 4 * 4;
            R.n_max = n_kv > 0 ? n_kv : 0;
            R.j_lo = 0;
            for (int r = 0; r < R.n4; r++) {
                const int rr = r < R.n ? r : R.n - 1;
                rows_set_query(&R, r, q + (size_t)(h + rr) * q_stride, f16, d);
                R.nk[r] = r < R.n ? R.n_max : 0;
                R.fk[r] = 0;
                R.out[r] = out + (size_t)(h + rr) * out_stride;
            }
            attend_rows(&R, k, k_stride, v, v_stride, f16, slots, d, scale, scratch);
        }
    }
    for (; h < n_q; h++)
        attend_head_neon(q + (size_t)h * q_stride, k, k_stride, v, v_stride, kv_type, slots, n_kv,
                         head_dim, scale, scratch, out + (size_t)h * out_stride);
}

/* Tokens times heads (see kiri_attend_tile_fn): up to 16 query rows against one key/value head,
 * every key and value row read once for all of them. */
static void attend_tile_neon(const float *q, size_t q_tok, size_t q_head, int n_t, int n_q,
                             const void *k, size_t k_stride, const void *v, size_t v_stride,
                             int kv_type, const int32_t *slots, const int32_t *kv_first,
                             const int32_t *n_kv, int head_dim, float scale, float *scratch, float *out,
                             size_t out_tok, size_t out_head)
{
    const int d = head_dim, rows = n_t * n_q;
    if (n_t <= 0 || n_q <= 0 || rows > KIRI_ATTEND_TILE_ROWS)
        return;
    if (!neon_attend_ok(kv_type, d, 256)) {
        kiri_cpu_attend_tile_rows(attend_head_neon, q, q_tok, q_head, n_t, n_q, k, k_stride, v, v_stride, kv_type,
                                  slots, kv_first, n_kv, d, scale, scratch, out, out_tok, out_head);
        return;
    }
    const int f16 = kv_type == KIRI_TYPE_F16;
    struct rows R;
    R.n = rows;
    R.n4 = (rows + 3) / 4 * 4;
    R.n_max = 0;
    R.j_lo = INT32_MAX;
    for (int r = 0; r < R.n4; r++) {
        const int rr = r < rows ? r : rows - 1;
        const int t = rr / n_q, h = rr % n_q;
        rows_set_query(&R, r, q + (size_t)t * q_tok + (size_t)h * q_head, f16, d);
        const int32_t e = r < rows ? n_kv[t] : 0, f = r < rows && kv_first ? kv_first[t] : 0;
        const int some = f >= 0 && e > f;
        R.nk[r] = some ? e : 0;
        R.fk[r] = some ? f : 0;
        R.n_max = R.nk[r] > R.n_max ? R.nk[r] : R.n_max;
        if (some)
            R.j_lo = f < R.j_lo ? f : R.j_lo;
        R.out[r] = out + (size_t)t * out_tok + (size_t)h * out_head;
    }
    if (R.j_lo > R.n_max)
        R.j_lo = R.n_max;
    attend_rows(&R, k, k_stride, v, v_stride, f16, slots, d, scale, scratch);
}

#undef KROW
#undef VROW

/* ---------------------------------------------------------------------------------------------
 * Element-wise rows
 * ------------------------------------------------------------------------------------------- */

/* sigmoid(z) from t = e^-|z| (never overflows): 1/(1+t) for z >= 0, t/(1+t) below. */
INLINE float32x4_t sigmoid(float32x4_t z)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    const float32x4_t t = exp_neg(vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(z), vdupq_n_u32(0x80000000u))));
    const uint32x4_t neg = vcltq_f32(z, vdupq_n_f32(0.0f));
    return vdivq_f32(vbslq_f32(neg, t, one), vaddq_f32(one, t));
}

/* y = silu(g) u with silu(g) = g sigmoid(g): within a few ulp of the reference's
 * g / (1 + expf(-g)). */
static void swiglu_row_neon(const float *g, const float *u, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t gv = vld1q_f32(g + i);
        vst1q_f32(y + i, vmulq_f32(vmulq_f32(gv, sigmoid(gv)), vld1q_f32(u + i)));
    }
    if (i < n)
        kiri_cpu_swiglu_row(g + i, u + i, y + i, n - i);
}

/* y = gelu(g) u as the reference computes it, g sigmoid(2z) with 2z formed by the same float
 * operations in the same order (separate multiplies and adds, no fused ones): within a few ulp of
 * kiri_cpu_geglu_row, and exactly 0 where its e^-2z is below the smallest normal float. */
static void geglu_row_neon(const float *g, const float *u, float *y, int64_t n)
{
    const float32x4_t c = vdupq_n_f32(0.044715f), k2 = vdupq_n_f32(2.0f * 0.797884560802865355f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t x = vld1q_f32(g + i);
        const float32x4_t x3 = vmulq_f32(vmulq_f32(vmulq_f32(c, x), x), x);
        const float32x4_t z2 = vmulq_f32(k2, vaddq_f32(x, x3));
        vst1q_f32(y + i, vmulq_f32(vmulq_f32(x, sigmoid(z2)), vld1q_f32(u + i)));
    }
    if (i < n)
        kiri_cpu_geglu_row(g + i, u + i, y + i, n - i);
}

static void scale_row_neon(const float *x, float *y, int64_t n, float s)
{
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vmulq_n_f32(vld1q_f32(x + i), s));
    for (; i < n; i++)
        y[i] = x[i] * s;
}

/* tanh(x): below |x| = 0.4 its Taylor polynomial to x^15 (truncation under 3e-10 relative), above
 * it (1 - t) / (1 + t) with t = e^-2|x| (no cancellation there), the sign put back. Within a few
 * ulp of tanhf; NaN propagates. */
INLINE float32x4_t tanh_neon(float32x4_t x)
{
    const float32x4_t one = vdupq_n_f32(1.0f);
    const float32x4_t a = vabsq_f32(x), a2 = vmulq_f32(a, a);
    float32x4_t p = vdupq_n_f32(-929569.0f / 638512875.0f);
    p = vfmaq_f32(vdupq_n_f32(21844.0f / 6081075.0f), p, a2);
    p = vfmaq_f32(vdupq_n_f32(-1382.0f / 155925.0f), p, a2);
    p = vfmaq_f32(vdupq_n_f32(62.0f / 2835.0f), p, a2);
    p = vfmaq_f32(vdupq_n_f32(-17.0f / 315.0f), p, a2);
    p = vfmaq_f32(vdupq_n_f32(2.0f / 15.0f), p, a2);
    p = vfmaq_f32(vdupq_n_f32(-1.0f / 3.0f), p, a2);
    const float32x4_t small = vfmaq_f32(a, vmulq_f32(p, a2), a);
    const float32x4_t t = exp_neg(vmulq_n_f32(a, -2.0f));
    const float32x4_t large = vdivq_f32(vsubq_f32(one, t), vaddq_f32(one, t));
    const float32x4_t r = vbslq_f32(vcltq_f32(a, vdupq_n_f32(0.4f)), small, large);
    const uint32x4_t sign = vdupq_n_u32(0x80000000u);
    return vreinterpretq_f32_u32(vorrq_u32(vreinterpretq_u32_f32(r), vandq_u32(sign, vreinterpretq_u32_f32(x))));
}

static void softcap_row_neon(const float *x, float *y, int64_t n, float cap)
{
    const float32x4_t cv = vdupq_n_f32(cap);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1q_f32(y + i, vmulq_f32(cv, tanh_neon(vdivq_f32(vld1q_f32(x + i), cv))));
    if (i < n)
        kiri_cpu_softcap_row(x + i, y + i, n - i, cap);
}

/* The reference's numerics: squares in float, their sum in double, the scale in float. */
static void rms_norm_row_neon(const float *x, const float *w, float *y, int64_t n, float eps)
{
    float64x2_t s0 = vdupq_n_f64(0.0), s1 = vdupq_n_f64(0.0);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t xv = vld1q_f32(x + i);
        add_f64(&s0, &s1, vmulq_f32(xv, xv));
    }
    double sum = vaddvq_f64(vaddq_f64(s0, s1));
    for (int64_t j = i; j < n; j++)
        sum += (double)(x[j] * x[j]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    const float32x4_t sc = vdupq_n_f32(scale);
    for (i = 0; i + 4 <= n; i += 4) {
        const float32x4_t xv = vmulq_f32(vld1q_f32(x + i), sc);
        vst1q_f32(y + i, w ? vmulq_f32(xv, vld1q_f32(w + i)) : xv);
    }
    for (; i < n; i++)
        y[i] = (x[i] * scale) * (w ? w[i] : 1.0f);
}

/* The sum of eight running sums (lanes 0-3 in a, 4-7 in b) in dot_f32's order (ops.c):
 * ((0+4) + (1+5)) + ((2+6) + (3+7)). */
static inline float sum8_neon(float32x4_t a, float32x4_t b)
{
    const float32x4_t h = vaddq_f32(a, b);
    const float32x4_t p = vpaddq_f32(h, h); /* (0+4)+(1+5), (2+6)+(3+7), ... */
    return vgetq_lane_f32(p, 0) + vgetq_lane_f32(p, 1);
}

/* kiri_cpu_delta_head with each row in two short passes while it is in L1 (decay and the
 * prediction; the update and the query), eight lanes at a time in two registers (dot_f32's eight
 * running sums), with fused multiply-adds. Head sizes that are not a multiple of 8 take the
 * reference. */
static void delta_head_neon(float *state, const float *q, const float *k, const float *v, float beta, float decay,
                            float scale, int64_t n, float *y)
{
    if (n % 8) {
        kiri_cpu_delta_head(state, q, k, v, beta, decay, scale, n, y);
        return;
    }
    for (int64_t j = 0; j < n; j++) {
        float *row = state + j * n;
        float32x4_t ka = vdupq_n_f32(0.0f), kb = vdupq_n_f32(0.0f);
        for (int64_t i = 0; i < n; i += 8) {
            const float32x4_t m0 = vmulq_n_f32(vld1q_f32(row + i), decay);
            const float32x4_t m1 = vmulq_n_f32(vld1q_f32(row + i + 4), decay);
            vst1q_f32(row + i, m0);
            vst1q_f32(row + i + 4, m1);
            ka = vfmaq_f32(ka, m0, vld1q_f32(k + i));
            kb = vfmaq_f32(kb, m1, vld1q_f32(k + i + 4));
        }
        const float32x4_t d = vdupq_n_f32((v[j] - sum8_neon(ka, kb)) * beta);
        float32x4_t qa = vdupq_n_f32(0.0f), qb = vdupq_n_f32(0.0f);
        for (int64_t i = 0; i < n; i += 8) {
            const float32x4_t m0 = vfmaq_f32(vld1q_f32(row + i), d, vld1q_f32(k + i));
            const float32x4_t m1 = vfmaq_f32(vld1q_f32(row + i + 4), d, vld1q_f32(k + i + 4));
            vst1q_f32(row + i, m0);
            vst1q_f32(row + i + 4, m1);
            qa = vfmaq_f32(qa, m0, vld1q_f32(q + i));
            qb = vfmaq_f32(qb, m1, vld1q_f32(q + i + 4));
        }
        y[j] = sum8_neon(qa, qb) * scale;
    }
}

/* kiri_cpu_short_conv_row four channels at a time: the products and sums in the reference's order
 * (separate multiplies and adds; the reference's may be fused by the compiler), SiLU as
 * swiglu_row_neon takes it, within a few ulp. The channels left over take the reference. */
static void short_conv_row_neon(float *state, size_t state_stride, const float *w, size_t w_stride, int64_t taps,
                                const float *x, int silu, int64_t n, float *y)
{
    if (taps < 1 || taps > KIRI_SHORT_CONV_MAX_TAPS) {
        kiri_cpu_short_conv_row(state, state_stride, w, w_stride, taps, x, silu, n, y);
        return;
    }
    int64_t c = 0;
    for (; c + 4 <= n; c += 4) {
        float32x4_t in[KIRI_SHORT_CONV_MAX_TAPS];
        for (int64_t k = 0; k + 1 < taps; k++)
            in[k] = vld1q_f32(state + (size_t)k * state_stride + c);
        in[taps - 1] = vld1q_f32(x + c);
        float32x4_t sum = vdupq_n_f32(0.0f);
        for (int64_t k = 0; k < taps; k++)
            sum = vaddq_f32(sum, vmulq_f32(in[k], vld1q_f32(w + (size_t)k * w_stride + c)));
        for (int64_t k = 0; k + 1 < taps; k++)
            vst1q_f32(state + (size_t)k * state_stride + c, in[k + 1]);
        vst1q_f32(y + c, silu ? vmulq_f32(sum, sigmoid(sum)) : sum);
    }
    if (c < n)
        kiri_cpu_short_conv_row(state + c, state_stride, w + c, w_stride, taps, x + c, silu, n - c, y + c);
}

/* ---------------------------------------------------------------------------------------------
 * Table
 * ------------------------------------------------------------------------------------------- */

void kiri_cpu_kernels_init_ops_neon(struct kiri_cpu_kernels *k)
{
    k->attend_head = attend_head_neon;
    k->attend_group = attend_group_neon;
    k->attend_tile = attend_tile_neon;
    k->swiglu_row = swiglu_row_neon;
    k->rms_norm_row = rms_norm_row_neon;
    k->geglu_row = geglu_row_neon;
    k->scale_row = scale_row_neon;
    k->softcap_row = softcap_row_neon;
    k->delta_head = delta_head_neon;
    k->short_conv_row = short_conv_row_neon;
}

#else
typedef int kiri_ops_neon_unused; /* an empty translation unit is not valid ISO C */
#endif
