/* AVX2 (with FMA and F16C) versions of the row operations of ops.c that cost time in a step:
 * attention over an F16 or F32 key/value cache, one head or a group of heads sharing a key/value
 * head (the per-token cost of decoding grows with the context through it, and prefill's with the
 * square of the prompt), and the element-wise rows: RMS norm, SwiGLU, GeGLU, scaling and
 * soft-capping (the logits of a large vocabulary, once per token), and the recurrent layers' steps
 * (one head of the gated delta rule, one token's short convolution).
 *
 * What must stay true: the same numerics as kiri_cpu_attend_head in ops.c (the query rounded to
 * F16 for an F16 cache, scores scaled after the dot product, the softmax denominator summed in
 * double, the attention weights rounded to F16 for an F16 cache), differing only in the order of
 * float additions and in exp, which is a polynomial within 2 ulp of expf. Other cache types and
 * head sizes that are not a multiple of 8 go to the reference kernel.
 *
 * Compiled without -mavx2: each function carries a target attribute; the table entries may only
 * be installed after the CPU and the OS reported KIRI_CPU_AVX2.
 */
#include "cpu_kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* Loops over the registers of a tile must be unrolled so their accumulators stay in registers. */
#define UNROLL _Pragma("GCC unroll 8")

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

/* e^x for x <= 0 (scores minus their maximum): x = n ln2 + r with |r| <= ln2 / 2, e^r by its
 * Taylor polynomial to degree 7 (truncation below 1e-8 relative), 2^n put into the exponent.
 * Results below the smallest normal float flush to 0. NaN propagates. */
AVX2 static inline __m256 exp_neg(__m256 x)
{
    const __m256 lo = _mm256_set1_ps(-87.33654f);
    const __m256 under = _mm256_cmp_ps(x, lo, _CMP_LT_OQ);
    x = _mm256_max_ps(lo, x); /* a NaN x is kept (max returns its second operand then) */
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187045e-06f), r);
    __m256 p = _mm256_set1_ps(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    const __m256i e = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
    const __m256 y = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), e));
    return _mm256_andnot_ps(under, y);
}

/* 8 values of a cache row (F16 or F32) at element i, as floats. */
AVX2 static inline __m256 load_kv(const void *row, int f16, int i)
{
    if (f16)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const kiri_f16 *)row + i)));
    return _mm256_loadu_ps((const float *)row + i);
}

/* Rounds 8 floats through F16 and back, as an F16 cache's products do. */
AVX2 static inline __m256 round_f16(__m256 v)
{
    return _mm256_cvtph_ps(_mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

/* ---------------------------------------------------------------------------------------------
 * Attention
 * ------------------------------------------------------------------------------------------- */

/* Scores of keys j .. j + 3 (rows k0..k3) against qr: [s0 s1 s2 s3], unscaled. */
AVX2 static inline __m128 scores4(const float *qr, const void *k0, const void *k1, const void *k2,
                                  const void *k3, int f16, int d)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(qr + i);
        a0 = _mm256_fmadd_ps(qv, load_kv(k0, f16, i), a0);
        a1 = _mm256_fmadd_ps(qv, load_kv(k1, f16, i), a1);
        a2 = _mm256_fmadd_ps(qv, load_kv(k2, f16, i), a2);
        a3 = _mm256_fmadd_ps(qv, load_kv(k3, f16, i), a3);
    }
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

AVX2 static inline __attribute__((always_inline)) void
attend_head_body(const float *q, const void *k, size_t k_stride, const void *v, size_t v_stride, const int f16,
                 const int32_t *slots, int n_kv, int head_dim, float scale, float *scratch, float *out)
{
    const int d = head_dim;
    float qr[1024];
    for (int i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        _mm256_storeu_ps(qr + i, f16 ? round_f16(qv) : qv);
    }
#define KROW(j) ((const char *)k + (size_t)slots[j] * k_stride)
#define VROW(j) ((const char *)v + (size_t)slots[j] * v_stride)

    /* Scores, scaled, and their maximum. */
    const __m128 sc = _mm_set1_ps(scale);
    __m128 vmax = _mm_set1_ps(-INFINITY);
    int j = 0;
    for (; j + 4 <= n_kv; j += 4) {
        const __m128 s = _mm_mul_ps(scores4(qr, KROW(j), KROW(j + 1), KROW(j + 2), KROW(j + 3), f16, d), sc);
        _mm_storeu_ps(scratch + j, s);
        vmax = _mm_max_ps(vmax, s);
    }
    if (j < n_kv) {
        const int l = n_kv - 1;
        const __m128 s = _mm_mul_ps(scores4(qr, KROW(j), KROW(j + 1 <= l ? j + 1 : l),
                                            KROW(j + 2 <= l ? j + 2 : l), KROW(l), f16, d),
                                    sc);
        float t[4];
        _mm_storeu_ps(t, s);
        for (int i = 0; j + i < n_kv; i++) {
            scratch[j + i] = t[i];
            vmax = _mm_max_ss(vmax, _mm_set_ss(t[i]));
        }
    }
    vmax = _mm_max_ps(vmax, _mm_movehl_ps(vmax, vmax));
    vmax = _mm_max_ss(vmax, _mm_movehdup_ps(vmax));
    const float max = _mm_cvtss_f32(vmax);

    /* Softmax numerators in place, their sum in double. */
    const __m256 m8 = _mm256_set1_ps(max);
    __m256d sum4 = _mm256_setzero_pd();
    j = 0;
    for (; j + 8 <= n_kv; j += 8) {
        const __m256 e = exp_neg(_mm256_sub_ps(_mm256_loadu_ps(scratch + j), m8));
        _mm256_storeu_ps(scratch + j, e);
        sum4 = _mm256_add_pd(sum4, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)),
                                                 _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1))));
    }
    double sum = 0.0;
    {
        double t[4];
        _mm256_storeu_pd(t, sum4);
        sum = (t[0] + t[1]) + (t[2] + t[3]);
    }
    for (; j < n_kv; j++) {
        const float e = expf(scratch[j] - max);
        scratch[j] = e;
        sum += (double)e;
    }
    const float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;

    /* Weights (rounded to F16 for an F16 cache), then the weighted sum of value rows, 64 values
     * of the head at a time in registers. */
    const __m256 inv8 = _mm256_set1_ps(inv);
    j = 0;
    for (; j + 8 <= n_kv; j += 8) {
        const __m256 w = _mm256_mul_ps(_mm256_loadu_ps(scratch + j), inv8);
        _mm256_storeu_ps(scratch + j, f16 ? round_f16(w) : w);
    }
    for (; j < n_kv; j++) {
        const float w = scratch[j] * inv;
        scratch[j] = f16 ? _cvtsh_ss(_cvtss_sh(w, _MM_FROUND_TO_NEAREST_INT)) : w;
    }
    int c0 = 0;
    for (; c0 + 64 <= d; c0 += 64) { /* apart from the remainder, so o stays in registers */
        __m256 o[8];
        UNROLL
        for (int c = 0; c < 8; c++)
            o[c] = _mm256_setzero_ps();
        for (j = 0; j < n_kv; j++) {
            const __m256 w = _mm256_broadcast_ss(scratch + j);
            const char *vr = VROW(j);
            UNROLL
            for (int c = 0; c < 8; c++)
                o[c] = _mm256_fmadd_ps(w, load_kv(vr, f16, c0 + 8 * c), o[c]);
        }
        UNROLL
        for (int c = 0; c < 8; c++)
            _mm256_storeu_ps(out + c0 + 8 * c, o[c]);
    }
    for (; c0 < d; c0 += 8) {
        __m256 o = _mm256_setzero_ps();
        for (j = 0; j < n_kv; j++)
            o = _mm256_fmadd_ps(_mm256_broadcast_ss(scratch + j), load_kv(VROW(j), f16, c0), o);
        _mm256_storeu_ps(out + c0, o);
    }
#undef KROW
#undef VROW
}

/* The body with the cache type a constant, as attend_tile_avx2's. */
AVX2 static void attend_head_avx2(const float *q, const void *k, size_t k_stride, const void *v,
                                  size_t v_stride, int kv_type, const int32_t *slots, int n_kv,
                                  int head_dim, float scale, float *scratch, float *out)
{
    const int d = head_dim;
    if ((kv_type != KIRI_TYPE_F16 && kv_type != KIRI_TYPE_F32) || d % 8 != 0 || d > 1024 || d <= 0)
        kiri_cpu_attend_head(q, k, k_stride, v, v_stride, kv_type, slots, n_kv, head_dim, scale,
                             scratch, out);
    else if (kv_type == KIRI_TYPE_F16)
        attend_head_body(q, k, k_stride, v, v_stride, 1, slots, n_kv, d, scale, scratch, out);
    else
        attend_head_body(q, k, k_stride, v, v_stride, 0, slots, n_kv, d, scale, scratch, out);
}

/* The 8 lanes' sums of 8 vectors, in order: [sum(a0) .. sum(a7)]. */
AVX2 static inline __m256 fold8(const __m256 a[8])
{
    const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    const __m256 h1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31));
}

#define TILE_ROWS KIRI_ATTEND_TILE_ROWS
/* Keys ahead of the one being scored whose key rows (into L1) and value rows (into L2, read after
 * every score, when they fit there: V_PREFETCH_SPAN) a tile prefetches: a decode step reads them
 * from memory, 128 B of each cache row per key/value head, a stride the hardware prefetchers
 * follow poorly; even whole rows read in order (one key/value head) stream at half the speed
 * without. */
#define ATTN_PREFETCH 16
/* Keys ahead whose key rows a tile fetches into L2 first: the L1 fetches alone keep too few
 * misses in flight for memory's latency (Zen 4, 4096 keys from DRAM, bench/bench_attention.c:
 * 64-dim heads 176 -> 114 us a key/value head, 256-dim 420 -> 270, with ATTN_PREFETCH 32 -> 16). */
#define ATTN_PREFETCH_L2 128
/* Bytes of value rows a tile's weighted sums take at once (see attend_tile_avx2): within L1. */
#define V_BLOCK_BYTES 16384
/* Bytes of value rows up to which a tile prefetches them into L2 while it scores the keys: more
 * (a decode step's 4096 keys of 256 values, 2 MiB) would leave L2 before the weighted sums read
 * them, so the prefetches would only cost bandwidth. */
#define V_PREFETCH_SPAN (256 * 1024)

/* Prefetch a cache row of `bytes` (it need not start a line) into L1 or into L2 (two functions:
 * the hint must be a constant even where nothing is inlined). Always inlined: GCC takes a function
 * that only prefetches for one without effects and drops the calls it has not inlined. */
AVX2 static inline __attribute__((always_inline)) void prefetch_row_l1(const char *p, int bytes)
{
    for (int i = 0; i < bytes; i += 64)
        _mm_prefetch(p + i, _MM_HINT_T0);
    _mm_prefetch(p + bytes - 1, _MM_HINT_T0);
}

AVX2 static inline __attribute__((always_inline)) void prefetch_row_l2(const char *p, int bytes)
{
    for (int i = 0; i < bytes; i += 64)
        _mm_prefetch(p + i, _MM_HINT_T1);
    _mm_prefetch(p + bytes - 1, _MM_HINT_T1);
}

/* The scores of n key rows (kr[0 .. n)) for the first `w` of 8 query rows at qr (rows of 256),
 * scaled, key i's into dst[TILE_ROWS i ..][0 .. 8) with the lanes past w 0. w n <= 8 (w 8 and n 1,
 * w 4 and n up to 2, w 2 and n up to 4: constants where inlined): one accumulator per (key, row),
 * so a decode step's 2 or 4 heads keep 8 chains of multiply-adds in flight, not 2 or 4 that wait
 * on each other's latency. Each accumulator adds the same products in the same order whatever
 * n is. */
AVX2 static inline __attribute__((always_inline)) void key_scores(const float (*qr)[256], int w, int n,
                                                                  const char *const *kr, int f16, int d,
                                                                  __m256 sc, float *dst)
{
    __m256 acc[8];
    UNROLL
    for (int a = 0; a < 8; a++)
        acc[a] = _mm256_setzero_ps();
    for (int i = 0; i < d; i += 8) {
        UNROLL
        for (int key = 0; key < 4; key++)
            if (key < n) {
                const __m256 kv = load_kv(kr[key], f16, i);
                UNROLL
                for (int h = 0; h < 8; h++)
                    if (h < w && key * w + h < 8)
                        acc[key * w + h] = _mm256_fmadd_ps(_mm256_load_ps(&qr[h][i]), kv, acc[key * w + h]);
            }
    }
    const __m256 s = _mm256_mul_ps(fold8(acc), sc);
    if (n == 1) {
        _mm256_storeu_ps(dst, s);
        return;
    }
    float t[8];
    _mm256_storeu_ps(t, s);
    UNROLL
    for (int key = 0; key < 4; key++)
        if (key < n)
            UNROLL
            for (int h = 0; h < 8; h++)
                dst[(size_t)TILE_ROWS * key + h] = h < w ? t[key * w + h] : 0.0f;
}

/* o[h] += w[h] v for the first nr (2 or 4: a constant where inlined) rows and values c .. c + 16
 * of the value rows of keys [j0, j1); weights of key j at wts[TILE_ROWS j + h]. */
AVX2 static inline __attribute__((always_inline)) void weighted_values(__m256 o[4][2], int nr, const float *wts,
                                                                       const void *v, size_t v_stride,
                                                                       const int32_t *slots, int j0, int j1,
                                                                       int f16, int c)
{
    for (int j = j0; j < j1; j++) {
        const char *vr = (const char *)v + (size_t)slots[j] * v_stride;
        const float *wj = wts + (size_t)TILE_ROWS * j;
        const __m256 v0 = load_kv(vr, f16, c), v1 = load_kv(vr, f16, c + 8);
        UNROLL
        for (int h = 0; h < 4; h++)
            if (h < nr) {
                const __m256 w = _mm256_broadcast_ss(wj + h);
                o[h][0] = _mm256_fmadd_ps(w, v0, o[h][0]);
                o[h][1] = _mm256_fmadd_ps(w, v1, o[h][1]);
            }
    }
}

/* The weighted sums of weighted_values for one or two rows over values c .. c + 32: eight
 * independent accumulators, as four rows over 16 values have (a decode step's two heads of a
 * key/value head would otherwise leave half the multiply-adds waiting on latency). The partial
 * sums of rows r0, r0 + 1 (the second only when nr is 2) are read from and written back to acc. */
AVX2 static inline __attribute__((always_inline)) void weighted_values_wide(float (*acc)[256], int r0, int nr,
                                                                            const float *wts, const void *v,
                                                                            size_t v_stride, const int32_t *slots,
                                                                            int j0, int j1, int f16, int c)
{
    __m256 o[2][4];
    UNROLL
    for (int h = 0; h < 2; h++)
        UNROLL
        for (int x = 0; x < 4; x++)
            o[h][x] = _mm256_load_ps(&acc[r0 + (h < nr ? h : 0)][c + 8 * x]);
    for (int j = j0; j < j1; j++) {
        const char *vr = (const char *)v + (size_t)slots[j] * v_stride;
        const float *wj = wts + (size_t)TILE_ROWS * j;
        __m256 vv[4];
        UNROLL
        for (int x = 0; x < 4; x++)
            vv[x] = load_kv(vr, f16, c + 8 * x);
        UNROLL
        for (int h = 0; h < 2; h++) {
            const __m256 w = _mm256_broadcast_ss(wj + h);
            UNROLL
            for (int x = 0; x < 4; x++)
                o[h][x] = _mm256_fmadd_ps(w, vv[x], o[h][x]);
        }
    }
    UNROLL
    for (int h = 0; h < 2; h++)
        if (h < nr)
            UNROLL
            for (int x = 0; x < 4; x++)
                _mm256_store_ps(&acc[r0 + h][c + 8 * x], o[h][x]);
}

/* o[h] = values c .. c + 16 of rows r0 + h of the partial sums (rows past nr repeat row r0). */
AVX2 static inline __attribute__((always_inline)) void load_sums(__m256 o[4][2], const float (*acc)[256], int r0,
                                                                 int nr, int c)
{
    UNROLL
    for (int h = 0; h < 4; h++) {
        o[h][0] = _mm256_load_ps(&acc[r0 + (h < nr ? h : 0)][c]);
        o[h][1] = _mm256_load_ps(&acc[r0 + (h < nr ? h : 0)][c + 8]);
    }
}

/* Tokens times heads (see kiri_attend_tile_fn): up to 16 query rows against one key/value head.
 * Scores of key j for the 16 rows sit at scratch[16 j ..]; a row's lanes outside its token's keys
 * [kv_first, n_kv) are masked out of the softmax (weight exactly 0) and its weighted sum covers
 * only its own keys, so every row gets the result of attend_head_avx2 whatever the other rows'
 * keys and values hold. */
AVX2 static inline __attribute__((always_inline)) void
attend_tile_body(const float *q, size_t q_tok, size_t q_head, int n_t, int n_q, const void *k, size_t k_stride,
                 const void *v, size_t v_stride, const int f16, const int32_t *slots, const int32_t *kv_first,
                 const int32_t *n_kv, int head_dim, float scale, float *scratch, float *out, size_t out_tok,
                 size_t out_head)
{
    const int d = head_dim, rows = n_t * n_q;
    const int groups = rows > 8 ? 2 : 1; /* lanes of 8 rows */
    float qr[TILE_ROWS][256] __attribute__((aligned(32)));
    /* Row r sees the keys [fk[r], nk[r]); rows that see none have both 0 and take no part in the
     * range of keys j_lo .. n_max the tile walks. */
    int32_t nk[TILE_ROWS] __attribute__((aligned(32)));
    int32_t fk[TILE_ROWS] __attribute__((aligned(32)));
    int n_max = 0, j_lo = INT32_MAX;
    for (int r = 0; r < TILE_ROWS; r++) {
        /* Rows past the tile repeat the last one, seeing no keys: their lanes are dropped. */
        const int rr = r < rows ? r : rows - 1;
        const float *qh = q + (size_t)(rr / n_q) * q_tok + (size_t)(rr % n_q) * q_head;
        for (int i = 0; i < d; i += 8) {
            const __m256 qv = _mm256_loadu_ps(qh + i);
            _mm256_storeu_ps(&qr[r][i], f16 ? round_f16(qv) : qv);
        }
        const int32_t e = r < rows ? n_kv[r / n_q] : 0, f = r < rows && kv_first ? kv_first[r / n_q] : 0;
        const int some = f >= 0 && e > f;
        nk[r] = some ? e : 0;
        fk[r] = some ? f : 0;
        n_max = nk[r] > n_max ? nk[r] : n_max;
        if (some)
            j_lo = f < j_lo ? f : j_lo;
    }
    if (j_lo > n_max)
        j_lo = n_max;
#define KROW(j) ((const char *)k + (size_t)slots[j] * k_stride)
#define VROW(j) ((const char *)v + (size_t)slots[j] * v_stride)
    /* Scores: each key row is widened once for up to 8 rows, scaled after the dot product. A
     * tile of 2 to 4 rows (a decode step's heads of one key/value head) computes only those, for
     * two keys at a time (four with 2 rows). */
    const __m256 sc = _mm256_set1_ps(scale);
    const int row_bytes = d * (f16 ? 2 : 4);
    /* Value rows go to L2 while the keys are scored only when all of them fit there; else the
     * weighted sums fetch them a block ahead (see below). */
    const int v_early = (size_t)(n_max - j_lo) * (size_t)row_bytes <= V_PREFETCH_SPAN;
    const int step = rows <= 2 ? 4 : rows <= 4 ? 2 : 1; /* keys scored at once */
    /* The keys the loop below reaches before its own L2 prefetches would: all at once, so their
     * misses overlap rather than each waiting out memory's latency in turn. */
    for (int j = j_lo; j < n_max && j < j_lo + ATTN_PREFETCH_L2; j++)
        prefetch_row_l2(KROW(j), row_bytes);
    for (int j = j_lo; j < n_max; j += step) {
        const int n = n_max - j < step ? n_max - j : step;
        const char *kr[4];
        for (int i = 0; i < n; i++) {
            kr[i] = KROW(j + i);
            if (j + i + ATTN_PREFETCH_L2 < n_max)
                prefetch_row_l2(KROW(j + i + ATTN_PREFETCH_L2), row_bytes);
            if (j + i + ATTN_PREFETCH < n_max) {
                prefetch_row_l1(KROW(j + i + ATTN_PREFETCH), row_bytes);
                if (v_early)
                    prefetch_row_l2(VROW(j + i + ATTN_PREFETCH), row_bytes);
            }
        }
        float *sj = scratch + (size_t)TILE_ROWS * j;
        if (rows <= 2 && n == 4)
            key_scores(qr, 2, 4, kr, f16, d, sc, sj);
        else if (rows <= 4 && n == 2)
            key_scores(qr, 4, 2, kr, f16, d, sc, sj);
        else /* one key at a time: 8 rows or more, and the last keys */
            for (int i = 0; i < n; i++) {
                if (rows <= 4)
                    key_scores(qr, 4, 1, kr + i, f16, d, sc, sj + (size_t)TILE_ROWS * i);
                else
                    for (int g = 0; g < groups; g++)
                        key_scores(qr + 8 * g, 8, 1, kr + i, f16, d, sc, sj + (size_t)TILE_ROWS * i + 8 * g);
            }
    }
    /* Softmax per lane over the lane's own keys: maxima, numerators (0 outside [fk, nk)), sums in
     * double, then the weights. */
    for (int g = 0; g < groups; g++) {
        const __m256i lim = _mm256_load_si256((const __m256i *)(nk + 8 * g));
        const __m256i from = _mm256_load_si256((const __m256i *)(fk + 8 * g));
        const __m256 ninf = _mm256_set1_ps(-INFINITY);
#define LANE_SEES(j)                                                                               \
    _mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpgt_epi32(from, _mm256_set1_epi32(j)),       \
                                            _mm256_cmpgt_epi32(lim, _mm256_set1_epi32(j))))
        __m256 vmax = ninf;
        for (int j = j_lo; j < n_max; j++)
            vmax = _mm256_max_ps(vmax, _mm256_blendv_ps(ninf, _mm256_loadu_ps(scratch + (size_t)TILE_ROWS * j + 8 * g),
                                                        LANE_SEES(j)));
        __m256d sum_lo = _mm256_setzero_pd(), sum_hi = _mm256_setzero_pd();
        for (int j = j_lo; j < n_max; j++) {
            float *sj = scratch + (size_t)TILE_ROWS * j + 8 * g;
            const __m256 e = _mm256_and_ps(LANE_SEES(j), exp_neg(_mm256_sub_ps(_mm256_loadu_ps(sj), vmax)));
            _mm256_storeu_ps(sj, e);
            sum_lo = _mm256_add_pd(sum_lo, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
            sum_hi = _mm256_add_pd(sum_hi, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
        }
#undef LANE_SEES
        double sums[8];
        _mm256_storeu_pd(sums, sum_lo);
        _mm256_storeu_pd(sums + 4, sum_hi);
        float invs[8];
        for (int h = 0; h < 8; h++)
            invs[h] = sums[h] > 0.0 ? (float)(1.0 / sums[h]) : 0.0f;
        const __m256 inv = _mm256_loadu_ps(invs);
        for (int j = j_lo; j < n_max; j++) {
            float *sj = scratch + (size_t)TILE_ROWS * j + 8 * g;
            const __m256 w = _mm256_mul_ps(_mm256_loadu_ps(sj), inv);
            _mm256_storeu_ps(sj, f16 ? round_f16(w) : w);
        }
    }
    /* Weighted sums of the value rows: 4 rows x 16 values in registers per pass over the keys all
     * 4 rows see ([all0, all1)), each row alone over the few keys only some of them see (a
     * prompt's later tokens see more, and with a window its earlier ones see older keys). The
     * keys all rows of a group see go in blocks small enough that their value rows stay in L1
     * while every group of rows and every 16 values pass over them (else each pass reads them
     * again from L2); the partial sums wait in acc between blocks, so each sum still adds its
     * keys in order. One or two rows (a decode step's heads on one worker) take 32 values at a
     * time, so eight sums are in flight as with four rows. Value rows that were not prefetched
     * while scoring go to L2 a block ahead, a share of the next block at each step. */
    const int groups4 = (rows + 3) / 4;
    int lo[TILE_ROWS / 4], hi[TILE_ROWS / 4], all0[TILE_ROWS / 4], all1[TILE_ROWS / 4];
    int jb_lo = n_max, jb_hi = 0;
    for (int g = 0; g < groups4; g++) {
        const int r0 = 4 * g, nr = rows - r0 < 4 ? rows - r0 : 4;
        lo[g] = n_max, hi[g] = 0, all0[g] = 0, all1[g] = n_max;
        for (int h = 0; h < nr; h++) {
            lo[g] = fk[r0 + h] < lo[g] ? fk[r0 + h] : lo[g];
            hi[g] = nk[r0 + h] > hi[g] ? nk[r0 + h] : hi[g];
            all0[g] = fk[r0 + h] > all0[g] ? fk[r0 + h] : all0[g];
            all1[g] = nk[r0 + h] < all1[g] ? nk[r0 + h] : all1[g];
        }
        if (all1[g] < all0[g])
            all1[g] = all0[g];
        if (all0[g] < all1[g]) {
            jb_lo = all0[g] < jb_lo ? all0[g] : jb_lo;
            jb_hi = all1[g] > jb_hi ? all1[g] : jb_hi;
        }
    }
    float acc[TILE_ROWS][256] __attribute__((aligned(32)));
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < d; c += 8)
            _mm256_store_ps(&acc[r][c], _mm256_setzero_ps());
    const int block = V_BLOCK_BYTES / (d * (f16 ? 2 : 4)) > 8 ? V_BLOCK_BYTES / (d * (f16 ? 2 : 4)) : 8;
    for (int jb = jb_lo; jb < jb_hi; jb += block) {
        const int je = jb_hi - jb < block ? jb_hi : jb + block;
        for (int g = 0; g < groups4; g++) {
            const int r0 = 4 * g, nr = rows - r0 < 4 ? rows - r0 : 4;
            const int j0 = all0[g] > jb ? all0[g] : jb, j1 = all1[g] < je ? all1[g] : je;
            if (j0 >= j1)
                continue;
            const int wide = nr <= 2 && d % 32 == 0;
            for (int c = 0; c < d; c += wide ? 32 : 16) {
                if (!v_early && g == 0) { /* a share of the next block's value rows into L2 */
                    const int cs = wide ? 32 : 16, per = (block * cs + d - 1) / d, jn = je + c / cs * per;
                    for (int j = jn; j < jn + per && j < je + block && j < jb_hi; j++)
                        prefetch_row_l2(VROW(j), row_bytes);
                }
                if (wide) {
                    weighted_values_wide(acc, r0, nr, scratch + r0, v, v_stride, slots, j0, j1, f16, c);
                    continue;
                }
                __m256 o[4][2];
                load_sums(o, acc, r0, nr, c);
                if (nr <= 2)
                    weighted_values(o, 2, scratch + r0, v, v_stride, slots, j0, j1, f16, c);
                else
                    weighted_values(o, 4, scratch + r0, v, v_stride, slots, j0, j1, f16, c);
                UNROLL
                for (int h = 0; h < 4; h++)
                    if (h < nr) {
                        _mm256_store_ps(&acc[r0 + h][c], o[h][0]);
                        _mm256_store_ps(&acc[r0 + h][c + 8], o[h][1]);
                    }
            }
        }
    }
    for (int g = 0; g < groups4; g++) {
        const int r0 = 4 * g, nr = rows - r0 < 4 ? rows - r0 : 4;
        for (int c = 0; c < d; c += 16) {
            __m256 o[4][2];
            load_sums(o, acc, r0, nr, c);
            for (int j = lo[g]; j < hi[g]; j++) { /* [lo, all0), then [all1, hi) */
                if (j == all0[g] && all0[g] < all1[g]) {
                    j = all1[g];
                    if (j >= hi[g])
                        break;
                }
                const char *vr = VROW(j);
                const float *wj = scratch + (size_t)TILE_ROWS * j + r0;
                const __m256 v0 = load_kv(vr, f16, c), v1 = load_kv(vr, f16, c + 8);
                UNROLL
                for (int h = 0; h < 4; h++)
                    if (h < nr && j >= fk[r0 + h] && j < nk[r0 + h]) {
                        const __m256 w = _mm256_broadcast_ss(wj + h);
                        o[h][0] = _mm256_fmadd_ps(w, v0, o[h][0]);
                        o[h][1] = _mm256_fmadd_ps(w, v1, o[h][1]);
                    }
            }
            UNROLL
            for (int h = 0; h < 4; h++)
                if (h < nr) {
                    const int r = r0 + h;
                    float *o_r = out + (size_t)(r / n_q) * out_tok + (size_t)(r % n_q) * out_head;
                    _mm256_storeu_ps(o_r + c, o[h][0]);
                    _mm256_storeu_ps(o_r + c + 8, o[h][1]);
                }
        }
    }
#undef KROW
#undef VROW
}

/* The tile body with the cache type a constant: its inner loops then widen F16 rows (or load F32
 * ones) without a test per load (a decode step's 8 heads of 64 over 576 keys in L2: 20.6 -> 19.6
 * us a key/value head, bench/bench_attention.c). */
AVX2 static void attend_tile_avx2(const float *q, size_t q_tok, size_t q_head, int n_t, int n_q,
                                  const void *k, size_t k_stride, const void *v, size_t v_stride,
                                  int kv_type, const int32_t *slots, const int32_t *kv_first,
                                  const int32_t *n_kv, int head_dim, float scale, float *scratch, float *out,
                                  size_t out_tok, size_t out_head)
{
    const int d = head_dim, rows = n_t * n_q;
    if (n_t <= 0 || n_q <= 0 || rows > TILE_ROWS)
        return;
    if ((kv_type != KIRI_TYPE_F16 && kv_type != KIRI_TYPE_F32) || d % 16 != 0 || d <= 0 || d > 256) {
        kiri_cpu_attend_tile_rows(attend_head_avx2, q, q_tok, q_head, n_t, n_q, k, k_stride, v, v_stride, kv_type,
                                  slots, kv_first, n_kv, d, scale, scratch, out, out_tok, out_head);
        return;
    }
    if (kv_type == KIRI_TYPE_F16)
        attend_tile_body(q, q_tok, q_head, n_t, n_q, k, k_stride, v, v_stride, 1, slots, kv_first, n_kv, d, scale,
                         scratch, out, out_tok, out_head);
    else
        attend_tile_body(q, q_tok, q_head, n_t, n_q, k, k_stride, v, v_stride, 0, slots, kv_first, n_kv, d, scale,
                         scratch, out, out_tok, out_head);
}

/* n_q query heads sharing one key/value head (grouped-query attention): tiles of one token and up
 * to 16 heads (2 or more heads, a supported cache type and head size: every key and value row is
 * read and widened once for all of them, which is what a decode step at depth waits on: Gemma 3's
 * two heads per worker over 4096 keys of 256 took twice as long one head at a time), else one
 * head at a time. */
AVX2 static void attend_group_avx2(const float *q, size_t q_stride, int n_q, const void *k, size_t k_stride,
                                   const void *v, size_t v_stride, int kv_type, const int32_t *slots,
                                   int n_kv, int head_dim, float scale, float *scratch, float *out,
                                   size_t out_stride)
{
    const int ok = (kv_type == KIRI_TYPE_F16 || kv_type == KIRI_TYPE_F32) && head_dim % 16 == 0 &&
                   head_dim > 0 && head_dim <= 256;
    const int32_t nk[1] = {n_kv};
    int h = 0;
    if (ok)
        for (; n_q - h >= 2; h += TILE_ROWS)
            attend_tile_avx2(q + (size_t)h * q_stride, 0, q_stride, 1, n_q - h < TILE_ROWS ? n_q - h : TILE_ROWS,
                             k, k_stride, v, v_stride, kv_type, slots, NULL, nk, head_dim, scale, scratch,
                             out + (size_t)h * out_stride, 0, out_stride);
    for (; h < n_q; h++)
        attend_head_avx2(q + (size_t)h * q_stride, k, k_stride, v, v_stride, kv_type, slots, n_kv, head_dim,
                         scale, scratch, out + (size_t)h * out_stride);
}

/* ---------------------------------------------------------------------------------------------
 * Element-wise rows
 * ------------------------------------------------------------------------------------------- */

/* sigmoid(z) from t = e^-|z| (never overflows): 1/(1+t) for z >= 0, t/(1+t) below. */
AVX2 static inline __m256 sigmoid(__m256 z)
{
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 t = exp_neg(_mm256_or_ps(z, _mm256_set1_ps(-0.0f)));
    const __m256 neg = _mm256_cmp_ps(z, _mm256_setzero_ps(), _CMP_LT_OQ);
    return _mm256_div_ps(_mm256_blendv_ps(one, t, neg), _mm256_add_ps(one, t));
}

/* y = silu(g) u with silu(g) = g sigmoid(g); sigmoid from t = e^-|g| (never overflows) as 1/(1+t)
 * for g >= 0 and t/(1+t) below: within a few ulp of the reference's g / (1 + expf(-g)). */
AVX2 static void swiglu_row_avx2(const float *g, const float *u, float *y, int64_t n)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gv = _mm256_loadu_ps(g + i);
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(gv, sigmoid(gv)), _mm256_loadu_ps(u + i)));
    }
    if (i < n)
        kiri_cpu_swiglu_row(g + i, u + i, y + i, n - i);
}

/* y = gelu(g) u as the reference computes it, g sigmoid(2z) with 2z formed by the same float
 * operations in the same order (no contraction): within a few ulp of kiri_cpu_geglu_row, and
 * exactly 0 where its e^-2z is below the smallest normal float (results under 1e-35). */
AVX2 static void geglu_row_avx2(const float *g, const float *u, float *y, int64_t n)
{
    const __m256 c = _mm256_set1_ps(0.044715f), k2 = _mm256_set1_ps(2.0f * 0.797884560802865355f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i);
        const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(c, x), x), x);
        const __m256 z2 = _mm256_mul_ps(k2, _mm256_add_ps(x, x3));
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(x, sigmoid(z2)), _mm256_loadu_ps(u + i)));
    }
    if (i < n)
        kiri_cpu_geglu_row(g + i, u + i, y + i, n - i);
}

AVX2 static void scale_row_avx2(const float *x, float *y, int64_t n, float s)
{
    const __m256 sv = _mm256_set1_ps(s);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sv));
    for (; i < n; i++)
        y[i] = x[i] * s;
}

/* tanh(x): below |x| = 0.4 its Taylor polynomial to x^15 (truncation under 3e-10 relative), above
 * it (1 - t) / (1 + t) with t = e^-2|x| (no cancellation there), the sign put back. Within a few
 * ulp of tanhf; NaN propagates. */
AVX2 static inline __m256 tanh_avx2(__m256 x)
{
    const __m256 sign = _mm256_set1_ps(-0.0f), one = _mm256_set1_ps(1.0f);
    const __m256 a = _mm256_andnot_ps(sign, x);
    const __m256 a2 = _mm256_mul_ps(a, a);
    __m256 p = _mm256_set1_ps(-929569.0f / 638512875.0f);
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(21844.0f / 6081075.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1382.0f / 155925.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(62.0f / 2835.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-17.0f / 315.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(2.0f / 15.0f));
    p = _mm256_fmadd_ps(p, a2, _mm256_set1_ps(-1.0f / 3.0f));
    const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(p, a2), a, a);
    const __m256 t = exp_neg(_mm256_mul_ps(a, _mm256_set1_ps(-2.0f)));
    const __m256 large = _mm256_div_ps(_mm256_sub_ps(one, t), _mm256_add_ps(one, t));
    const __m256 r = _mm256_blendv_ps(large, small, _mm256_cmp_ps(a, _mm256_set1_ps(0.4f), _CMP_LT_OQ));
    return _mm256_or_ps(r, _mm256_and_ps(sign, x));
}

AVX2 static void softcap_row_avx2(const float *x, float *y, int64_t n, float cap)
{
    const __m256 cv = _mm256_set1_ps(cap);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_mul_ps(cv, tanh_avx2(_mm256_div_ps(_mm256_loadu_ps(x + i), cv))));
    if (i < n)
        kiri_cpu_softcap_row(x + i, y + i, n - i, cap);
}

/* The reference's numerics: squares in float, their sum in double, the scale in float. */
AVX2 static void rms_norm_row_avx2(const float *x, const float *w, float *y, int64_t n, float eps)
{
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256 sq = _mm256_mul_ps(v, v);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
    }
    double t[4];
    _mm256_storeu_pd(t, _mm256_add_pd(s0, s1));
    double sum = (t[0] + t[1]) + (t[2] + t[3]);
    for (int64_t j = i; j < n; j++)
        sum += (double)(x[j] * x[j]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    const __m256 sc = _mm256_set1_ps(scale);
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), sc);
        _mm256_storeu_ps(y + i, w ? _mm256_mul_ps(v, _mm256_loadu_ps(w + i)) : v);
    }
    for (; i < n; i++)
        y[i] = (x[i] * scale) * (w ? w[i] : 1.0f);
}

/* The sum of a vector's 8 lanes in dot_f32's order (ops.c): ((0+4) + (1+5)) + ((2+6) + (3+7)). */
AVX2 static inline float sum8_avx2(__m256 v)
{
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 t = _mm_hadd_ps(h, h); /* (0+4)+(1+5), (2+6)+(3+7), ... */
    return _mm_cvtss_f32(t) + _mm_cvtss_f32(_mm_movehdup_ps(t));
}

/* kiri_cpu_delta_head with each row in two short passes while it is in L1 (decay and the
 * prediction; the update and the query), eight lanes at a time: the lanes are dot_f32's eight
 * running sums, with fused multiply-adds. One loop runs the second pass of a row beside the first
 * pass of the next, so the chains of multiply-adds and sums of two rows overlap while the state is
 * still read in order, one stream (rows side by side in separate streams made decode, whose state
 * comes from DRAM, slower). Head sizes that are not a multiple of 8 take the reference. */
AVX2 static void delta_head_avx2(float *state, const float *q, const float *k, const float *v, float beta,
                                 float decay, float scale, int64_t n, float *y)
{
    if (n % 8) {
        kiri_cpu_delta_head(state, q, k, v, beta, decay, scale, n, y);
        return;
    }
    const __m256 dv = _mm256_set1_ps(decay);
    __m256 pk = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) { /* the first pass of row 0 */
        const __m256 m = _mm256_mul_ps(_mm256_loadu_ps(state + i), dv);
        _mm256_storeu_ps(state + i, m);
        pk = _mm256_fmadd_ps(m, _mm256_loadu_ps(k + i), pk);
    }
    for (int64_t j = 0; j < n; j++) {
        float *row = state + j * n, *next = row + n;
        const __m256 d = _mm256_set1_ps((v[j] - sum8_avx2(pk)) * beta);
        __m256 pq = _mm256_setzero_ps();
        pk = _mm256_setzero_ps();
        if (j + 1 < n)
            for (int64_t i = 0; i < n; i += 8) {
                const __m256 kv = _mm256_loadu_ps(k + i);
                const __m256 m = _mm256_fmadd_ps(d, kv, _mm256_loadu_ps(row + i));
                _mm256_storeu_ps(row + i, m);
                pq = _mm256_fmadd_ps(m, _mm256_loadu_ps(q + i), pq);
                const __m256 mn = _mm256_mul_ps(_mm256_loadu_ps(next + i), dv);
                _mm256_storeu_ps(next + i, mn);
                pk = _mm256_fmadd_ps(mn, kv, pk);
            }
        else
            for (int64_t i = 0; i < n; i += 8) {
                const __m256 m = _mm256_fmadd_ps(d, _mm256_loadu_ps(k + i), _mm256_loadu_ps(row + i));
                _mm256_storeu_ps(row + i, m);
                pq = _mm256_fmadd_ps(m, _mm256_loadu_ps(q + i), pq);
            }
        y[j] = sum8_avx2(pq) * scale;
    }
}

/* kiri_cpu_short_conv_row eight channels at a time: the same products and sums in the same order
 * (no fused multiply-adds), so without SiLU the output is the reference's to the bit; SiLU as
 * swiglu_row_avx2 takes it, within a few ulp. The channels left over take the reference. */
AVX2 static void short_conv_row_avx2(float *state, size_t state_stride, const float *w, size_t w_stride,
                                     int64_t taps, const float *x, int silu, int64_t n, float *y)
{
    if (taps < 1 || taps > KIRI_SHORT_CONV_MAX_TAPS) {
        kiri_cpu_short_conv_row(state, state_stride, w, w_stride, taps, x, silu, n, y);
        return;
    }
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) {
        __m256 in[KIRI_SHORT_CONV_MAX_TAPS];
        for (int64_t k = 0; k + 1 < taps; k++)
            in[k] = _mm256_loadu_ps(state + (size_t)k * state_stride + c);
        in[taps - 1] = _mm256_loadu_ps(x + c);
        __m256 sum = _mm256_setzero_ps();
        for (int64_t k = 0; k < taps; k++)
            sum = _mm256_add_ps(sum, _mm256_mul_ps(in[k], _mm256_loadu_ps(w + (size_t)k * w_stride + c)));
        for (int64_t k = 0; k + 1 < taps; k++)
            _mm256_storeu_ps(state + (size_t)k * state_stride + c, in[k + 1]);
        _mm256_storeu_ps(y + c, silu ? _mm256_mul_ps(sum, sigmoid(sum)) : sum);
    }
    if (c < n)
        kiri_cpu_short_conv_row(state + c, state_stride, w + c, w_stride, taps, x + c, silu, n - c, y + c);
}

/* ---------------------------------------------------------------------------------------------
 * Table
 * ------------------------------------------------------------------------------------------- */

void kiri_cpu_kernels_init_ops_avx2(struct kiri_cpu_kernels *k)
{
    k->attend_head = attend_head_avx2;
    k->attend_group = attend_group_avx2;
    k->attend_tile = attend_tile_avx2;
    k->swiglu_row = swiglu_row_avx2;
    k->rms_norm_row = rms_norm_row_avx2;
    k->geglu_row = geglu_row_avx2;
    k->scale_row = scale_row_avx2;
    k->softcap_row = softcap_row_avx2;
    k->delta_head = delta_head_avx2;
    k->short_conv_row = short_conv_row_avx2;
}

#else
typedef int kiri_ops_avx2_unused; /* an empty translation unit is not valid ISO C */
#endif
