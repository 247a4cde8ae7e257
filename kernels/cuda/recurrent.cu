/* The hybrid models' token mixers: SHORT_CONV (lfm2, qwen35), DELTA_GATES and DELTA_NET (qwen35),
 * with the CPU reference's formulas in its order (common.cuh's short_conv_step, softplus_value,
 * delta_row_step). The recurrences run inside one thread per channel (SHORT_CONV) or per (value
 * head, state row) (DELTA_NET), which walks the step's tokens in batch order; channels, heads and
 * rows run in parallel, as in the Vulkan shaders. Rows outside the state are skipped, as on the
 * CPU; a token at position 0 starts from zeros, one that reads another row (a speculative step's)
 * copies it to its own first. */
#include "common.cuh"

/* One thread per channel. In place allowed: a token's input is read before its output is written,
 * and only this thread touches its channel. */
__global__ void short_conv(const float *u, size_t u_nb1, const float *w, size_t w_nb1, float *state, size_t s_nb1,
                           const int32_t *rows, const int32_t *from, const int32_t *pos, float *dst,
                           size_t d_nb1, int64_t e, int64_t n_tok, int k, int64_t n_slots, int silu)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= e)
        return;
    const float *wc = (const float *)((const char *)w + (size_t)c * w_nb1);
    for (int64_t t = 0; t < n_tok; t++) {
        const int32_t r = rows[t], f = from[t];
        if (r < 0 || r >= n_slots || f < 0 || f >= n_slots)
            continue;
        float *s = (float *)((char *)state + (size_t)r * s_nb1) + c;
        const float *sf = (const float *)((const char *)state + (size_t)f * s_nb1) + c;
        for (int j = 0; j + 1 < k; j++)
            if (pos[t] == 0)
                s[(size_t)j * e] = 0.0f;
            else if (f != r)
                s[(size_t)j * e] = sf[(size_t)j * e];
        const float x = ((const float *)((const char *)u + (size_t)t * u_nb1))[c];
        ((float *)((char *)dst + (size_t)t * d_nb1))[c] = short_conv_step(s, (size_t)e, wc, k, x, silu);
    }
}

extern "C" int kiri_cuda_short_conv(const struct kiri_cuda_short_conv *a, void *stream)
{
    if (a->e <= 0 || a->n_tok <= 0)
        return 0;
    if (a->e > 0x7fffffffLL * 64 || a->k < 2)
        return -1;
    short_conv<<<(unsigned)((a->e + 63) / 64), 64, 0, (cudaStream_t)stream>>>(
        a->u, a->u_nb1, a->w, a->w_nb1, a->state, a->s_nb1, a->rows, a->from, a->pos, a->dst, a->d_nb1, a->e,
        a->n_tok, a->k, a->n_slots, a->silu);
    return (int)cudaGetLastError();
}

/* One thread per (head, token). */
__global__ void delta_gates(const float *b, size_t b_nb1, const float *a, size_t a_nb1, const float *dt,
                            const float *decay, float *dst, size_t d_nb1, int64_t h, int64_t n_tok)
{
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= h * n_tok)
        return;
    const int64_t i = g % h, t = g / h;
    const float bv = ((const float *)((const char *)b + (size_t)t * b_nb1))[i];
    const float x = ((const float *)((const char *)a + (size_t)t * a_nb1))[i] + dt[i];
    float *y = (float *)((char *)dst + (size_t)t * d_nb1);
    y[i] = sigmoid_value(bv);
    y[h + i] = softplus_value(x) * decay[i];
}

extern "C" int kiri_cuda_delta_gates(const float *b, size_t b_nb1, const float *a, size_t a_nb1, const float *dt,
                                     const float *decay, float *dst, size_t d_nb1, int64_t h, int64_t n_tok,
                                     void *stream)
{
    if (h <= 0 || n_tok <= 0)
        return 0;
    const int64_t n = h * n_tok;
    if (n > 0x7fffffffLL * 64)
        return -1;
    delta_gates<<<(unsigned)((n + 63) / 64), 64, 0, (cudaStream_t)stream>>>(b, b_nb1, a, a_nb1, dt, decay, dst, d_nb1,
                                                                           h, n_tok);
    return (int)cudaGetLastError();
}

/* One thread per (value head, state row): row j of head h evolves on its own (delta_row_step). */
__global__ void delta_net(const float *x, size_t x_nb1, const float *gates, size_t g_nb1, float *state, size_t s_nb1,
                          const int32_t *rows, const int32_t *from, const int32_t *pos, float *dst, size_t d_nb1,
                          int hk, int hv, int s, int64_t n_tok, int64_t n_slots, float scale)
{
    const int64_t g = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (g >= (int64_t)hv * s)
        return;
    const int h = (int)(g / s), j = (int)(g % s);
    for (int64_t t = 0; t < n_tok; t++) {
        const int32_t r = rows[t], f = from[t];
        if (r < 0 || r >= n_slots || f < 0 || f >= n_slots)
            continue;
        float *m = (float *)((char *)state + (size_t)r * s_nb1) + ((size_t)h * s + j) * s;
        const float *mf = (const float *)((const char *)state + (size_t)f * s_nb1) + ((size_t)h * s + j) * s;
        const float *xt = (const float *)((const char *)x + (size_t)t * x_nb1);
        const float *gt = (const float *)((const char *)gates + (size_t)t * g_nb1);
        const float *q = xt + (size_t)(h % hk) * s, *k = xt + (size_t)hk * s + (size_t)(h % hk) * s;
        const float v = xt[(size_t)2 * hk * s + (size_t)h * s + j];
        for (int i = 0; i < s; i++)
            if (pos[t] == 0)
                m[i] = 0.0f;
            else if (f != r)
                m[i] = mf[i];
        const float y = delta_row_step(m, k, q, v, gt[h], expf(gt[hv + h]), s);
        ((float *)((char *)dst + (size_t)t * d_nb1))[(size_t)h * s + j] = y * scale;
    }
}

extern "C" int kiri_cuda_delta_net(const struct kiri_cuda_delta_net *a, void *stream)
{
    if (a->n_tok <= 0)
        return 0;
    const int64_t n = (int64_t)a->n_head_v * a->head_dim;
    if (a->n_head_k <= 0 || a->n_head_v % a->n_head_k != 0 || a->head_dim <= 0 || n > 0x7fffffffLL * 64)
        return -1;
    delta_net<<<(unsigned)((n + 63) / 64), 64, 0, (cudaStream_t)stream>>>(
        a->x, a->x_nb1, a->gates, a->g_nb1, a->state, a->s_nb1, a->rows, a->from, a->pos, a->dst, a->d_nb1, a->n_head_k,
        a->n_head_v, a->head_dim, a->n_tok, a->n_slots, a->scale);
    return (int)cudaGetLastError();
}
