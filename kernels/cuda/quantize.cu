/* Activation conversion for products: F32 rows to the format the weight's dot product takes,
 * with the CPU reference's arithmetic (kernels/cpu/quants.c) so the quants are its bytes:
 * Q8_0 / Q8_1 scale by amax / 127 and round half away from zero; Q8_K maps the value of largest
 * magnitude (the first on ties) to -127 and rounds to nearest even. IEEE division and rounding
 * are CUDA's defaults (no fast math), so d and 1/d are the reference's. */
#include "common.cuh"

extern "C" int kiri_cuda_act_format(int weight_type)
{
    switch (weight_type) {
    case KIRI_TYPE_F32: return KIRI_CUDA_ACT_F32;
    case KIRI_TYPE_F16: return KIRI_CUDA_ACT_F16;
    case KIRI_TYPE_BF16: return KIRI_CUDA_ACT_BF16;
    case KIRI_TYPE_Q4_0: case KIRI_TYPE_Q5_0: case KIRI_TYPE_Q8_0: return KIRI_CUDA_ACT_Q8_0;
    case KIRI_TYPE_Q4_1: case KIRI_TYPE_Q5_1: return KIRI_CUDA_ACT_Q8_1;
    case KIRI_TYPE_Q4_K: case KIRI_TYPE_Q5_K: case KIRI_TYPE_Q6_K: return KIRI_CUDA_ACT_Q8_K;
    default: return -1;
    }
}

extern "C" size_t kiri_cuda_act_row_bytes(int act, int64_t k)
{
    switch (act) {
    case KIRI_CUDA_ACT_F32: case KIRI_CUDA_ACT_F16: case KIRI_CUDA_ACT_BF16: return (size_t)k * 4;
    case KIRI_CUDA_ACT_Q8_0: return (size_t)(k / 32) * sizeof(act_q8_0);
    case KIRI_CUDA_ACT_Q8_1: return (size_t)(k / 32) * sizeof(act_q8_1);
    case KIRI_CUDA_ACT_Q8_K: return (size_t)(k / 256) * sizeof(act_q8_k);
    default: return 0;
    }
}

/* One value per thread: grid (values / 256, rows). */
template <int A>
__global__ void round_rows(const float *src, size_t src_stride, float *dst, int64_t k)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= k)
        return;
    const float x = ((const float *)((const char *)src + blockIdx.y * src_stride))[i];
    dst[blockIdx.y * k + i] = A == KIRI_CUDA_ACT_F16 ? f16_round(x) : bf16_round(x);
}

/* One 32-value block per thread: grid (blocks / 64, rows). */
template <int A>
__global__ void quantize_q8(const float *src, size_t src_stride, void *dst, int64_t nb, size_t row_bytes)
{
    const int64_t b = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= nb)
        return;
    const float *x = (const float *)((const char *)src + blockIdx.y * src_stride) + 32 * b;
    float d;
    if (A == KIRI_CUDA_ACT_Q8_0) {
        act_q8_0 *y = (act_q8_0 *)((char *)dst + blockIdx.y * row_bytes) + b;
        quantize_q8_block(x, y->qs, &d);
        y->d = f16_round(d);
    } else {
        act_q8_1 *y = (act_q8_1 *)((char *)dst + blockIdx.y * row_bytes) + b;
        const int sum = quantize_q8_block(x, y->qs, &d);
        y->d = f16_round(d);
        y->s = f16_round((float)sum * d);
    }
}

/* One 256-value block per warp, 8 values per lane: grid (blocks / 4, rows), 4 warps a block. */
__global__ void quantize_q8_k(const float *src, size_t src_stride, act_q8_k *dst, int64_t nb, size_t row_bytes)
{
    const int64_t b = (int64_t)blockIdx.x * 4 + threadIdx.y;
    if (b >= nb)
        return;
    const int lane = threadIdx.x;
    const float *x = (const float *)((const char *)src + blockIdx.y * src_stride) + 256 * b + 8 * lane;
    act_q8_k *y = (act_q8_k *)((char *)dst + blockIdx.y * row_bytes) + b;
    float v[8], amax = 0.0f, vmax = 0.0f;
    int at = 0;
    for (int j = 0; j < 8; j++) {
        v[j] = x[j];
        if (amax < fabsf(v[j])) {
            amax = fabsf(v[j]);
            vmax = v[j];
            at = 8 * lane + j;
        }
    }
    /* The largest magnitude, the first index on ties, as the reference's sequential scan. */
    for (int o = WARP / 2; o > 0; o >>= 1) {
        const float a2 = __shfl_xor_sync(0xffffffffu, amax, o), v2 = __shfl_xor_sync(0xffffffffu, vmax, o);
        const int at2 = __shfl_xor_sync(0xffffffffu, at, o);
        if (a2 > amax || (a2 == amax && at2 < at)) {
            amax = a2;
            vmax = v2;
            at = at2;
        }
    }
    if (amax == 0.0f) {
        ((uint32_t *)y->qs)[2 * lane] = 0; /* blocks are 4-byte aligned only */
        ((uint32_t *)y->qs)[2 * lane + 1] = 0;
        if (lane < 16)
            y->bsums[lane] = 0;
        if (lane == 0)
            y->d = 0.0f;
        return;
    }
    const float iscale = -127.0f / vmax;
    uint32_t w0 = 0, w1 = 0;
    int s = 0;
    for (int j = 0; j < 8; j++) {
        int q = __float2int_rn(iscale * v[j]);
        q = q > 127 ? 127 : q;
        s += q;
        if (j < 4)
            w0 |= ((uint32_t)q & 0xffu) << (8 * j);
        else
            w1 |= ((uint32_t)q & 0xffu) << (8 * (j - 4));
    }
    ((uint32_t *)y->qs)[2 * lane] = w0;
    ((uint32_t *)y->qs)[2 * lane + 1] = w1;
    s += __shfl_xor_sync(0xffffffffu, s, 1); /* lanes 2g and 2g + 1 hold group g */
    if ((lane & 1) == 0)
        y->bsums[lane / 2] = s;
    if (lane == 0)
        y->d = 1.0f / iscale;
}

extern "C" int kiri_cuda_quantize(int act, const float *src, size_t src_stride, void *dst, int64_t k, int64_t n,
                                  void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    if (n <= 0 || k <= 0)
        return 0;
    const size_t row = kiri_cuda_act_row_bytes(act, k);
    for (int64_t t0 = 0; t0 < n; t0 += KIRI_CUDA_MAX_GRID_Y) {
        const unsigned ny = (unsigned)(n - t0 < KIRI_CUDA_MAX_GRID_Y ? n - t0 : KIRI_CUDA_MAX_GRID_Y);
        const float *s = (const float *)((const char *)src + (size_t)t0 * src_stride);
        char *d = (char *)dst + (size_t)t0 * row;
        switch (act) {
        case KIRI_CUDA_ACT_F16:
            round_rows<KIRI_CUDA_ACT_F16><<<dim3((unsigned)((k + 255) / 256), ny), 256, 0, st>>>(s, src_stride, (float *)d, k);
            break;
        case KIRI_CUDA_ACT_BF16:
            round_rows<KIRI_CUDA_ACT_BF16><<<dim3((unsigned)((k + 255) / 256), ny), 256, 0, st>>>(s, src_stride, (float *)d, k);
            break;
        case KIRI_CUDA_ACT_Q8_0:
            quantize_q8<KIRI_CUDA_ACT_Q8_0><<<dim3((unsigned)((k / 32 + 63) / 64), ny), 64, 0, st>>>(s, src_stride, d, k / 32, row);
            break;
        case KIRI_CUDA_ACT_Q8_1:
            quantize_q8<KIRI_CUDA_ACT_Q8_1><<<dim3((unsigned)((k / 32 + 63) / 64), ny), 64, 0, st>>>(s, src_stride, d, k / 32, row);
            break;
        case KIRI_CUDA_ACT_Q8_K:
            quantize_q8_k<<<dim3((unsigned)((k / 256 + 3) / 4), ny), dim3(32, 4), 0, st>>>(s, src_stride, (act_q8_k *)d, k / 256, row);
            break;
        default:
            return -1;
        }
    }
    return (int)cudaGetLastError();
}
