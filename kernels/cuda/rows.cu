/* Row operations: RMS norm, add / mul / SwiGLU / GEGLU / sigmoid-mul, scale / softcap, RoPE, with the CPU reference's formulas
 * (kernels/cpu/ops.c): the sum of squares in double, RoPE angles advanced by repeated
 * multiplication from the position, each pair rotated with the reference's products. */
#include "common.cuh"

/* One row per block of 256 threads. */
__global__ void rms_norm(const float *x, size_t x_nb1, size_t x_nb2, const float *w, float *y, size_t y_nb1,
                         size_t y_nb2, int64_t n, int64_t ne1, float eps)
{
    const int64_t r = blockIdx.x;
    const float *xr = (const float *)((const char *)x + (size_t)(r % ne1) * x_nb1 + (size_t)(r / ne1) * x_nb2);
    float *yr = (float *)((char *)y + (size_t)(r % ne1) * y_nb1 + (size_t)(r / ne1) * y_nb2);
    double sum = 0.0;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        sum += (double)(xr[i] * xr[i]);
    for (int o = WARP / 2; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    __shared__ double part[8];
    if (threadIdx.x % WARP == 0)
        part[threadIdx.x / WARP] = sum;
    __syncthreads();
    double total = 0.0;
    for (int i = 0; i < (int)(blockDim.x / WARP); i++)
        total += part[i];
    const float scale = 1.0f / sqrtf((float)(total / (double)n) + eps);
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = (xr[i] * scale) * (w ? w[i] : 1.0f);
}

extern "C" int kiri_cuda_rms_norm(const float *x, size_t x_nb1, size_t x_nb2, const float *w, float *y,
                                  size_t y_nb1, size_t y_nb2, int64_t n, int64_t ne1, int64_t rows, float eps,
                                  void *stream)
{
    if (rows <= 0 || n <= 0 || ne1 <= 0)
        return 0;
    if (rows > 0x7fffffff)
        return -1;
    rms_norm<<<(unsigned)rows, 256, 0, (cudaStream_t)stream>>>(x, x_nb1, x_nb2, w, y, y_nb1, y_nb2, n, ne1, eps);
    return (int)cudaGetLastError();
}

/* One value per thread: grid (values / 256, rows). */
template <int OP>
__global__ void binary(const float *a, size_t a_nb1, const float *b, size_t b_nb1, float *y, size_t y_nb1, int64_t n)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float x = ((const float *)((const char *)a + blockIdx.y * a_nb1))[i];
    const float z = ((const float *)((const char *)b + blockIdx.y * b_nb1))[i];
    float *out = (float *)((char *)y + blockIdx.y * y_nb1);
    if (OP == 0)
        out[i] = x + z;
    else if (OP == 1)
        out[i] = x * z;
    else if (OP == 2)
        out[i] = (x / (1.0f + expf(-x))) * z;
    else if (OP == 3)
        out[i] = geglu_value(x, z);
    else
        out[i] = x * sigmoid_value(z);
}

extern "C" int kiri_cuda_binary(int op, const float *a, size_t a_nb1, const float *b, size_t b_nb1, float *y,
                                size_t y_nb1, int64_t n, int64_t rows, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    for (int64_t r = 0; r < rows; r += KIRI_CUDA_MAX_GRID_Y) {
        const int64_t nr = rows - r < KIRI_CUDA_MAX_GRID_Y ? rows - r : KIRI_CUDA_MAX_GRID_Y;
        const dim3 grid((unsigned)((n + 255) / 256), (unsigned)nr);
        const float *ar = (const float *)((const char *)a + (size_t)r * a_nb1);
        const float *br = (const float *)((const char *)b + (size_t)r * b_nb1);
        float *yr = (float *)((char *)y + (size_t)r * y_nb1);
        if (op == 0)
            binary<0><<<grid, 256, 0, st>>>(ar, a_nb1, br, b_nb1, yr, y_nb1, n);
        else if (op == 1)
            binary<1><<<grid, 256, 0, st>>>(ar, a_nb1, br, b_nb1, yr, y_nb1, n);
        else if (op == 2)
            binary<2><<<grid, 256, 0, st>>>(ar, a_nb1, br, b_nb1, yr, y_nb1, n);
        else if (op == 3)
            binary<3><<<grid, 256, 0, st>>>(ar, a_nb1, br, b_nb1, yr, y_nb1, n);
        else
            binary<4><<<grid, 256, 0, st>>>(ar, a_nb1, br, b_nb1, yr, y_nb1, n);
    }
    return (int)cudaGetLastError();
}

/* One value per thread: grid (values / 256, rows r0 + blockIdx.y); row r at (r % ne1) * nb1 +
 * (r / ne1) * nb2. */
template <int OP>
__global__ void unary(const float *x, size_t x_nb1, size_t x_nb2, float *y, size_t y_nb1, size_t y_nb2, int64_t n,
                      int64_t ne1, int64_t r0, float c)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const int64_t r = r0 + blockIdx.y, r1 = r % ne1, r2 = r / ne1;
    const float v = ((const float *)((const char *)x + (size_t)r1 * x_nb1 + (size_t)r2 * x_nb2))[i];
    ((float *)((char *)y + (size_t)r1 * y_nb1 + (size_t)r2 * y_nb2))[i] = OP == 0 ? v * c : softcap_value(v, c);
}

extern "C" int kiri_cuda_unary(int op, const float *x, size_t x_nb1, size_t x_nb2, float *y, size_t y_nb1,
                               size_t y_nb2, int64_t n, int64_t ne1, int64_t rows, float c, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (n <= 0 || rows <= 0 || ne1 <= 0)
        return 0;
    for (int64_t r = 0; r < rows; r += KIRI_CUDA_MAX_GRID_Y) {
        const int64_t nr = rows - r < KIRI_CUDA_MAX_GRID_Y ? rows - r : KIRI_CUDA_MAX_GRID_Y;
        const dim3 grid((unsigned)((n + 255) / 256), (unsigned)nr);
        if (op == 0)
            unary<0><<<grid, 256, 0, st>>>(x, x_nb1, x_nb2, y, y_nb1, y_nb2, n, ne1, r, c);
        else
            unary<1><<<grid, 256, 0, st>>>(x, x_nb1, x_nb2, y, y_nb1, y_nb2, n, ne1, r, c);
    }
    return (int)cudaGetLastError();
}

#define MAX_PAIRS 512

/* One token per block: the (cos, sin) of each pair first (thread i advances the angle i times,
 * as the reference's loop does; both times attn_factor), then every (head, pair) of the token. */
__global__ void rope(float *x, size_t nb1, size_t nb2, const int32_t *pos, const float *ff, int n_head, int n_rot,
                     int neox, float theta_scale, float freq_scale, float attn_factor)
{
    __shared__ float cs[MAX_PAIRS][2];
    const int t = blockIdx.x;
    const int n_pairs = n_rot / 2 <= MAX_PAIRS ? n_rot / 2 : MAX_PAIRS;
    for (int i = threadIdx.x; i < n_pairs; i += blockDim.x) {
        float theta = (float)pos[t];
        for (int j = 0; j < i; j++)
            theta *= theta_scale;
        const float f = ff ? ff[i] : 1.0f;
        const float angle = freq_scale * (theta / f);
        cs[i][0] = cosf(angle) * attn_factor;
        cs[i][1] = sinf(angle) * attn_factor;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n_head * n_pairs; j += blockDim.x) {
        const int h = j / n_pairs, i = j % n_pairs;
        float *v = (float *)((char *)x + (size_t)t * nb2 + (size_t)h * nb1);
        const int i0 = neox ? i : 2 * i, i1 = neox ? i + n_rot / 2 : 2 * i + 1;
        const float a = v[i0], b = v[i1];
        v[i0] = a * cs[i][0] - b * cs[i][1];
        v[i1] = a * cs[i][1] + b * cs[i][0];
    }
}

extern "C" int kiri_cuda_rope(float *x, size_t nb1, size_t nb2, const int32_t *pos, const float *ff, int64_t n_head,
                              int64_t n_tok, int n_rot, int neox, float theta_scale, float freq_scale,
                              float attn_factor, void *stream)
{
    if (n_tok <= 0 || n_head <= 0 || n_rot < 2)
        return 0;
    if (n_tok > 0x7fffffff || n_head > 0x7fffff)
        return -1;
    rope<<<(unsigned)n_tok, 128, 0, (cudaStream_t)stream>>>(x, nb1, nb2, pos, ff, (int)n_head, n_rot, neox,
                                                            theta_scale, freq_scale, attn_factor);
    return (int)cudaGetLastError();
}

extern "C" int kiri_cuda_check_image(void)
{
    cudaFuncAttributes fa;
    return (int)cudaFuncGetAttributes(&fa, (const void *)rms_norm);
}
