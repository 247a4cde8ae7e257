/* STORE_KV: rows of keys or values into their cache slots, converted to the cache's type as the
 * CPU backend converts them (F16 rounded to nearest even; Q8_0 blocks with d = amax / 127 and
 * quants rounded half away from zero, in GGUF's 34-byte layout). */
#include "common.cuh"

/* F32 / F16: one value per thread; Q8_0: one block per thread. Grid (units / 128, tokens). */
template <int C>
__global__ void store_kv(const float *src, size_t s_nb1, const int32_t *slots, uint8_t *cache, size_t c_nb1,
                         int64_t k, int64_t n_slots)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int32_t slot = slots[blockIdx.y];
    if (slot < 0 || slot >= n_slots)
        return;
    const float *x = (const float *)((const char *)src + blockIdx.y * s_nb1);
    uint8_t *row = cache + (size_t)slot * c_nb1;
    if (C == KIRI_TYPE_F32) {
        if (i < k)
            ((float *)row)[i] = x[i];
    } else if (C == KIRI_TYPE_F16) {
        if (i < k)
            ((uint16_t *)row)[i] = f16_bits(x[i]);
    } else {
        if (i >= k / 32)
            return;
        uint8_t *b = row + 34 * i;
        float d;
        quantize_q8_block(x + 32 * i, (int8_t *)b + 2, &d);
        *(uint16_t *)b = f16_bits(d);
    }
}

extern "C" int kiri_cuda_store_kv(const float *src, size_t s_nb1, const int32_t *slots, void *cache, size_t c_nb1,
                                  int ctype, int64_t k, int64_t n_tok, int64_t n_slots, void *stream)
{
    cudaStream_t st = (cudaStream_t)stream;
    const int64_t units = ctype == KIRI_TYPE_Q8_0 ? k / 32 : k;
    for (int64_t t = 0; t < n_tok; t += KIRI_CUDA_MAX_GRID_Y) {
        const int64_t nt = n_tok - t < KIRI_CUDA_MAX_GRID_Y ? n_tok - t : KIRI_CUDA_MAX_GRID_Y;
        const dim3 grid((unsigned)((units + 127) / 128), (unsigned)nt);
        const float *s = (const float *)((const char *)src + (size_t)t * s_nb1);
        uint8_t *c = (uint8_t *)cache;
        if (ctype == KIRI_TYPE_F32)
            store_kv<KIRI_TYPE_F32><<<grid, 128, 0, st>>>(s, s_nb1, slots + t, c, c_nb1, k, n_slots);
        else if (ctype == KIRI_TYPE_F16)
            store_kv<KIRI_TYPE_F16><<<grid, 128, 0, st>>>(s, s_nb1, slots + t, c, c_nb1, k, n_slots);
        else if (ctype == KIRI_TYPE_Q8_0)
            store_kv<KIRI_TYPE_Q8_0><<<grid, 128, 0, st>>>(s, s_nb1, slots + t, c, c_nb1, k, n_slots);
        else
            return -1;
    }
    return (int)cudaGetLastError();
}
