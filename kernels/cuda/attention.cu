/* ATTENTION over the paged KV cache: causal attention of each (token, query head) over its keys,
 * found through the token's block table (runtime/backend.h); with a sliding window only the last
 * `window` of them: both passes start at key max(0, n - window), so table entries of earlier
 * blocks (stale ids) are never read. Caches F32, F16 or Q8_0 are read as kiri_cpu_attend_head
 * reads them: for a reduced-precision cache the query and the attention
 * weights are rounded to F16, and the weighted values are added in key order.
 *
 * One block of 4 warps per (token, head). Pass 1: each warp scores every 4th key (its lanes split
 * the head's dimensions, a warp sum adds them) and keeps a running max and sum of exponentials;
 * the four are combined. Pass 2: 32 keys at a time, the warps rescore them into weights in shared
 * memory, then each thread adds weight x value over those keys for its own dimensions. */
#include "common.cuh"

#define MAX_D 1024
#define THREADS 128
#define N_WARPS (THREADS / WARP)
#define CHUNK 32

struct attn_args {
    struct kiri_cuda_attention a;
    size_t kv_row; /* bytes of one head's row in the cache */
};

__device__ __forceinline__ int64_t slot_of(const int32_t *table, int bs, int64_t j)
{
    return (int64_t)table[j / bs] * bs + j % bs;
}

/* q . key times scale, the warp's lanes splitting the dimensions (every lane gets the result). */
template <int C>
__device__ float score(const float *q, const uint8_t *krow, int d, float scale)
{
    float s = 0.0f;
    for (int i = threadIdx.x % WARP; i < d; i += WARP) {
        if (C == KIRI_TYPE_F32)
            s += q[i] * ((const float *)krow)[i];
        else if (C == KIRI_TYPE_F16)
            s += q[i] * f16_at(krow + 2 * i);
        else /* lane i % 32 holds element i of block i / 32 */
            s += (q[i] * (float)(int8_t)krow[34 * (i / 32) + 2 + i % 32]) * f16_at(krow + 34 * (i / 32));
    }
    return warp_sum(s) * scale;
}

template <int C>
__device__ __forceinline__ float weighted(const uint8_t *vrow, int i, float w)
{
    if (C == KIRI_TYPE_F32)
        return w * ((const float *)vrow)[i];
    if (C == KIRI_TYPE_F16)
        return w * f16_at(vrow + 2 * i);
    const float dv = f16_at(vrow + 34 * (i / 32)) * w;
    return dv * (float)(int8_t)vrow[34 * (i / 32) + 2 + i % 32];
}

template <int C>
__global__ void __launch_bounds__(THREADS) attention(const attn_args args)
{
    const struct kiri_cuda_attention &p = args.a;
    __shared__ float qs[MAX_D];
    __shared__ float wsh[CHUNK];
    __shared__ int64_t ssh[CHUNK];
    __shared__ float red_m[N_WARPS], red_l[N_WARPS];
    const int64_t t = blockIdx.x / p.n_head;
    const int h = (int)(blockIdx.x % p.n_head);
    const int hk = h / (p.n_head / p.n_head_kv);
    const int D = p.head_dim, warp = threadIdx.x / WARP, lane = threadIdx.x % WARP;
    const float *qrow = (const float *)((const char *)p.q + (size_t)t * p.q_nb2 + (size_t)h * p.q_nb1);
    for (int i = threadIdx.x; i < D; i += THREADS)
        qs[i] = C == KIRI_TYPE_F32 ? qrow[i] : f16_round(qrow[i]);
    /* A windowed token's key count may pass the cache's slots (a windowed pool keeps only the
     * windows): only the keys it reads must fit. */
    int64_t n_kv = p.meta[2 * t];
    if (n_kv < 0)
        n_kv = 0;
    const int64_t j_lo = p.window > 0 && n_kv > p.window ? n_kv - p.window : 0;
    if (n_kv - j_lo > p.n_slots)
        n_kv = j_lo;
    const int32_t *table = p.tables + p.meta[2 * t + 1];
    const uint8_t *kbase = (const uint8_t *)p.k + (size_t)hk * args.kv_row;
    const uint8_t *vbase = (const uint8_t *)p.v + (size_t)hk * args.kv_row;
    __syncthreads();

    /* Pass 1: the largest score and the sum of exp(score - largest). Slots outside the cache
     * (never made by the runtime) are left out of both passes. */
    float m = -INFINITY, l = 0.0f;
    for (int64_t j = j_lo + warp; j < n_kv; j += N_WARPS) {
        const int64_t slot = slot_of(table, p.block_size, j);
        if (slot < 0 || slot >= p.n_slots)
            continue;
        const float s = score<C>(qs, kbase + (size_t)slot * p.k_nb1, D, p.scale);
        if (s > m) {
            l = l * expf(m - s) + 1.0f;
            m = s;
        } else {
            l += expf(s - m);
        }
    }
    if (lane == 0) {
        red_m[warp] = m;
        red_l[warp] = l;
    }
    __syncthreads();
    float mx = -INFINITY, sum = 0.0f;
    for (int i = 0; i < N_WARPS; i++)
        mx = fmaxf(mx, red_m[i]);
    for (int i = 0; i < N_WARPS; i++)
        sum += red_l[i] > 0.0f ? red_l[i] * expf(red_m[i] - mx) : 0.0f;
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;

    /* Pass 2: out[i] = sum over keys, in order, of weight * value. */
    float acc[MAX_D / THREADS];
#pragma unroll
    for (int i = 0; i < MAX_D / THREADS; i++)
        acc[i] = 0.0f;
    for (int64_t j0 = j_lo; j0 < n_kv; j0 += CHUNK) {
        const int nj = n_kv - j0 < CHUNK ? (int)(n_kv - j0) : CHUNK;
        __syncthreads(); /* the previous chunk's weights are used up */
        for (int jj = warp; jj < nj; jj += N_WARPS) {
            const int64_t slot = slot_of(table, p.block_size, j0 + jj);
            float w = 0.0f;
            if (slot >= 0 && slot < p.n_slots) {
                w = expf(score<C>(qs, kbase + (size_t)slot * p.k_nb1, D, p.scale) - mx) * inv;
                if (C != KIRI_TYPE_F32)
                    w = f16_round(w);
            }
            if (lane == 0) {
                wsh[jj] = w;
                ssh[jj] = slot >= 0 && slot < p.n_slots ? slot : -1;
            }
        }
        __syncthreads();
#pragma unroll
        for (int i = 0; i < MAX_D / THREADS; i++) {
            const int d = i * THREADS + threadIdx.x;
            if (d < D)
                for (int jj = 0; jj < nj; jj++)
                    if (ssh[jj] >= 0)
                        acc[i] += weighted<C>(vbase + (size_t)ssh[jj] * p.v_nb1, d, wsh[jj]);
        }
    }
    float *out = (float *)((char *)p.dst + (size_t)t * p.d_nb1) + (size_t)h * D;
#pragma unroll
    for (int i = 0; i < MAX_D / THREADS; i++) {
        const int d = i * THREADS + threadIdx.x;
        if (d < D)
            out[d] = acc[i];
    }
}

extern "C" int kiri_cuda_attention(const struct kiri_cuda_attention *a, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (a->n_tok <= 0)
        return 0;
    if (a->head_dim <= 0 || a->head_dim > MAX_D || a->n_head_kv <= 0 || a->n_head % a->n_head_kv != 0 ||
        a->block_size <= 0 || a->window < 0 || a->n_tok * a->n_head > 0x7fffffff)
        return -1;
    attn_args args;
    args.a = *a;
    const unsigned blocks = (unsigned)(a->n_tok * a->n_head);
    switch (a->kv_type) {
    case KIRI_TYPE_F32:
        args.kv_row = (size_t)a->head_dim * 4;
        attention<KIRI_TYPE_F32><<<blocks, THREADS, 0, st>>>(args);
        break;
    case KIRI_TYPE_F16:
        args.kv_row = (size_t)a->head_dim * 2;
        attention<KIRI_TYPE_F16><<<blocks, THREADS, 0, st>>>(args);
        break;
    case KIRI_TYPE_Q8_0:
        if (a->head_dim % 32 != 0)
            return -1;
        args.kv_row = (size_t)(a->head_dim / 32) * 34;
        attention<KIRI_TYPE_Q8_0><<<blocks, THREADS, 0, st>>>(args);
        break;
    default:
        return -1;
    }
    return (int)cudaGetLastError();
}
