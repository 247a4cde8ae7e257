/* GET_ROWS: rows of a table (a weight of any type, or an F32 scratch tensor) dequantized to F32,
 * element for element as kiri_cpu_dequantize_row computes them (-fmad=false keeps the
 * reference's separate roundings of d * q and - m). One value per thread. */
#include "common.cuh"

template <int T>
__global__ void get_rows(const uint8_t *src, size_t s_stride, int64_t n_src, const int32_t *ids, float *dst,
                         size_t d_stride, int64_t ncols)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= ncols)
        return;
    const int32_t id = ids[blockIdx.y];
    if (id < 0 || id >= n_src)
        return; /* the runtime validates ids; never read outside the table */
    float *y = (float *)((char *)dst + (size_t)blockIdx.y * d_stride);
    y[i] = wt<T>::val(src + (size_t)id * s_stride, (int)i);
}

template <int T>
static int launch(const void *src, size_t s_stride, int64_t n_src, const int32_t *ids, int64_t n, float *dst,
                  size_t d_stride, int64_t ncols, cudaStream_t st)
{
    for (int64_t r = 0; r < n; r += KIRI_CUDA_MAX_GRID_Y) {
        const int64_t nn = n - r < KIRI_CUDA_MAX_GRID_Y ? n - r : KIRI_CUDA_MAX_GRID_Y;
        get_rows<T><<<dim3((unsigned)((ncols + 255) / 256), (unsigned)nn), 256, 0, st>>>(
            (const uint8_t *)src, s_stride, n_src, ids + r, (float *)((char *)dst + (size_t)r * d_stride), d_stride,
            ncols);
    }
    return (int)cudaGetLastError();
}

extern "C" int kiri_cuda_get_rows(int type, const void *src, size_t s_stride, int64_t n_src, const int32_t *ids,
                                  int64_t n, float *dst, size_t d_stride, int64_t ncols, void *stream)
{
    if (n <= 0 || ncols <= 0)
        return 0;
    KIRI_CUDA_DISPATCH_TYPE(type, launch, src, s_stride, n_src, ids, n, dst, d_stride, ncols, (cudaStream_t)stream)
}
