/* MATMUL: products of weight rows and activation rows. One token: a warp per output row, its
 * lanes taking the row's units in turn (common.cuh) and adding their results with a warp sum.
 * Several tokens: a warp per output row and 8 tokens, so each weight unit is read once for 8
 * tokens (the rest come from the L1 cache). Rows of a block's 4 warps are neighbours. */
#include "common.cuh"

#define ROWS_PER_BLOCK 4
#define TOKS 8

template <int T>
__global__ void matvec(const uint8_t *w, size_t w_stride, int64_t rows, const void *act, float *dst, int k, int units)
{
    const int64_t r = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.y;
    if (r >= rows)
        return;
    const uint8_t *wr = w + (size_t)r * w_stride;
    float s = 0.0f;
    for (int u = threadIdx.x; u < units; u += WARP)
        s += wt<T>::dot(wr, act, u, k);
    s = warp_sum(s);
    if (threadIdx.x == 0)
        dst[r] = s;
}

template <int T>
__global__ void matmat(const uint8_t *w, size_t w_stride, int64_t rows, const char *act, size_t a_stride,
                       float *dst, size_t d_stride, int k, int units, int64_t n)
{
    const int64_t r = (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.y;
    const int64_t t0 = (int64_t)blockIdx.y * TOKS;
    if (r >= rows)
        return;
    const int nt = n - t0 < TOKS ? (int)(n - t0) : TOKS;
    const uint8_t *wr = w + (size_t)r * w_stride;
    float s[TOKS];
    for (int j = 0; j < TOKS; j++)
        s[j] = 0.0f;
    for (int u = threadIdx.x; u < units; u += WARP) {
#pragma unroll
        for (int j = 0; j < TOKS; j++)
            if (j < nt)
                s[j] += wt<T>::dot(wr, act + (size_t)(t0 + j) * a_stride, u, k);
    }
#pragma unroll
    for (int j = 0; j < TOKS; j++) {
        const float v = warp_sum(s[j]);
        if (threadIdx.x == 0 && j < nt)
            *(float *)((char *)dst + (size_t)(t0 + j) * d_stride + (size_t)r * sizeof(float)) = v;
    }
}

template <int T>
static int launch(const void *w, size_t w_stride, int64_t rows, const void *act, size_t a_stride, float *dst,
                  size_t d_stride, int64_t k, int64_t n, cudaStream_t st)
{
    const int units = (int)((k + wt<T>::UNIT - 1) / wt<T>::UNIT);
    const dim3 threads(WARP, ROWS_PER_BLOCK);
    const unsigned gx = (unsigned)((rows + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);
    if (n == 1) {
        matvec<T><<<gx, threads, 0, st>>>((const uint8_t *)w, w_stride, rows, act, dst, (int)k, units);
        return (int)cudaGetLastError();
    }
    /* Grid y holds at most 65535 groups of tokens; larger steps go in slices. */
    const int64_t per = (int64_t)KIRI_CUDA_MAX_GRID_Y * TOKS;
    for (int64_t t = 0; t < n; t += per) {
        const int64_t nn = n - t < per ? n - t : per;
        matmat<T><<<dim3(gx, (unsigned)((nn + TOKS - 1) / TOKS)), threads, 0, st>>>(
            (const uint8_t *)w, w_stride, rows, (const char *)act + (size_t)t * a_stride, a_stride,
            (float *)((char *)dst + (size_t)t * d_stride), d_stride, (int)k, units, nn);
    }
    return (int)cudaGetLastError();
}

extern "C" int kiri_cuda_matmul(int weight_type, const void *w, size_t w_stride, int64_t rows, const void *act,
                                size_t a_stride, float *dst, size_t d_stride, int64_t k, int64_t n, void *stream)
{
    if (rows <= 0 || n <= 0)
        return 0;
    KIRI_CUDA_DISPATCH_TYPE(weight_type, launch, w, w_stride, rows, act, a_stride, dst, d_stride, k, n,
                            (cudaStream_t)stream)
}
