/* AVX-512 versions of the recurrent layers' row operations of ops.c: one head's step of the gated
 * delta rule (Qwen3.5's DeltaNet layers, whose 128 x 128 state per head is the largest per-token
 * cost of their prefill after the products) and one token's short convolution (its q/k/v
 * convolution with SiLU over 6144 channels). Sixteen lanes where the AVX2 versions have eight.
 *
 * What must stay true: the contracts of kiri_cpu_delta_head and kiri_cpu_short_conv_row, differing
 * only in the order of float additions (the delta rule's dot products) and in exp (a polynomial
 * within 2 ulp of expf, as in ops_avx2.c); the convolution's sums are the reference's to the bit.
 *
 * Compiled without -mavx512*: each function carries a target attribute; the entries may only be
 * installed when the CPU and the OS reported KIRI_CPU_AVX512.
 */
#include "cpu_kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>

#define AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))

/* e^x for x <= 0: x = n ln2 + r with |r| <= ln2 / 2, e^r by its Taylor polynomial to degree 7
 * (truncation below 1e-8 relative), 2^n put into the exponent; ops_avx2.c's exp_neg on sixteen
 * lanes. Results below the smallest normal float flush to 0. NaN propagates. */
AVX512 static inline __m512 exp_neg512(__m512 x)
{
    const __m512 lo = _mm512_set1_ps(-87.33654f);
    const __mmask16 under = _mm512_cmp_ps_mask(x, lo, _CMP_LT_OQ);
    x = _mm512_max_ps(lo, x); /* a NaN x is kept (max returns its second operand then) */
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187045e-06f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i e = _mm512_slli_epi32(_mm512_cvtps_epi32(n), 23);
    const __m512 y = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(p), e));
    return _mm512_maskz_mov_ps((__mmask16)~under, y);
}

/* silu(z) = z sigmoid(z), sigmoid from t = e^-|z| (never overflows): 1/(1+t) for z >= 0, t/(1+t)
 * below; within a few ulp of the reference's z / (1 + expf(-z)). */
AVX512 static inline __m512 silu512(__m512 z)
{
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 t = exp_neg512(_mm512_castsi512_ps(
        _mm512_or_si512(_mm512_castps_si512(z), _mm512_set1_epi32((int)0x80000000u))));
    const __mmask16 neg = _mm512_cmp_ps_mask(z, _mm512_setzero_ps(), _CMP_LT_OQ);
    return _mm512_mul_ps(z, _mm512_div_ps(_mm512_mask_mov_ps(one, neg, t), _mm512_add_ps(one, t)));
}

/* kiri_cpu_delta_head with each row in two short passes while it is in L1 (decay and the
 * prediction; the update and the query), sixteen lanes at a time with fused multiply-adds. One
 * loop runs the second pass of a row beside the first pass of the next, so the chains of
 * multiply-adds and sums of two rows overlap while the state is still read in order, one stream
 * (rows side by side in separate streams made decode, whose state comes from DRAM, slower). Head
 * sizes that are not a multiple of 16 take the reference. */
AVX512 static void delta_head_avx512(float *state, const float *q, const float *k, const float *v, float beta,
                                     float decay, float scale, int64_t n, float *y)
{
    if (n % 16) {
        kiri_cpu_delta_head(state, q, k, v, beta, decay, scale, n, y);
        return;
    }
    const __m512 dv = _mm512_set1_ps(decay);
    __m512 pk = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) { /* the first pass of row 0 */
        const __m512 m = _mm512_mul_ps(_mm512_loadu_ps(state + i), dv);
        _mm512_storeu_ps(state + i, m);
        pk = _mm512_fmadd_ps(m, _mm512_loadu_ps(k + i), pk);
    }
    for (int64_t j = 0; j < n; j++) {
        float *row = state + j * n, *next = row + n;
        const __m512 d = _mm512_set1_ps((v[j] - _mm512_reduce_add_ps(pk)) * beta);
        __m512 pq = _mm512_setzero_ps();
        pk = _mm512_setzero_ps();
        if (j + 1 < n)
            for (int64_t i = 0; i < n; i += 16) {
                const __m512 kv = _mm512_loadu_ps(k + i);
                const __m512 m = _mm512_fmadd_ps(d, kv, _mm512_loadu_ps(row + i));
                _mm512_storeu_ps(row + i, m);
                pq = _mm512_fmadd_ps(m, _mm512_loadu_ps(q + i), pq);
                const __m512 mn = _mm512_mul_ps(_mm512_loadu_ps(next + i), dv);
                _mm512_storeu_ps(next + i, mn);
                pk = _mm512_fmadd_ps(mn, kv, pk);
            }
        else
            for (int64_t i = 0; i < n; i += 16) {
                const __m512 m = _mm512_fmadd_ps(d, _mm512_loadu_ps(k + i), _mm512_loadu_ps(row + i));
                _mm512_storeu_ps(row + i, m);
                pq = _mm512_fmadd_ps(m, _mm512_loadu_ps(q + i), pq);
            }
        y[j] = _mm512_reduce_add_ps(pq) * scale;
    }
}

/* kiri_cpu_short_conv_row sixteen channels at a time: the same products and sums in the same
 * order (no fused multiply-adds), so without SiLU the output is the reference's to the bit. The
 * channels left over take the reference. */
AVX512 static void short_conv_row_avx512(float *state, size_t state_stride, const float *w, size_t w_stride,
                                         int64_t taps, const float *x, int silu, int64_t n, float *y)
{
    if (taps < 1 || taps > KIRI_SHORT_CONV_MAX_TAPS) {
        kiri_cpu_short_conv_row(state, state_stride, w, w_stride, taps, x, silu, n, y);
        return;
    }
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) {
        __m512 in[KIRI_SHORT_CONV_MAX_TAPS];
        for (int64_t k = 0; k + 1 < taps; k++)
            in[k] = _mm512_loadu_ps(state + (size_t)k * state_stride + c);
        in[taps - 1] = _mm512_loadu_ps(x + c);
        __m512 sum = _mm512_setzero_ps();
        for (int64_t k = 0; k < taps; k++)
            sum = _mm512_add_ps(sum, _mm512_mul_ps(in[k], _mm512_loadu_ps(w + (size_t)k * w_stride + c)));
        for (int64_t k = 0; k + 1 < taps; k++)
            _mm512_storeu_ps(state + (size_t)k * state_stride + c, in[k + 1]);
        _mm512_storeu_ps(y + c, silu ? silu512(sum) : sum);
    }
    if (c < n)
        kiri_cpu_short_conv_row(state + c, state_stride, w + c, w_stride, taps, x + c, silu, n - c, y + c);
}

void kiri_cpu_kernels_init_ops_avx512(struct kiri_cpu_kernels *k)
{
    k->delta_head = delta_head_avx512;
    k->short_conv_row = short_conv_row_avx512;
}

#else
typedef int kiri_ops_avx512_unused; /* an empty translation unit is not valid ISO C */
#endif
