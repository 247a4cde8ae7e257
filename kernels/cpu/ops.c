/* Portable C row kernels: RMS norm, SwiGLU, GeGLU, scaling, soft-capping, RoPE, one attention
 * head, one head's step of the gated delta rule and one token's short convolution. Numerics follow the
 * common reference implementation closely (sums of squares and softmax denominators in double,
 * RoPE angles advanced by repeated multiplication, F16 caches read with the query and the
 * attention weights rounded to F16) so logits agree with llama.cpp to float rounding. */
#include <math.h>
#include <string.h>

#include "cpu_kernels.h"

/* A dot product in 8 running sums, which compilers turn into vector lanes (one sum would have
 * to stay in order); the delta rule's rows are as long as a head (128 on Qwen3.5). */
static float dot_f32(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0.0f};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int u = 0; u < 8; u++)
            acc[u] += a[i + u] * b[i + u];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* Row by row while it is in L1: the state (64 KiB a head on Qwen3.5) is read and written once
 * per token, with the float operations of four passes (decay, prediction, update, query). */
void kiri_cpu_delta_head(float *state, const float *q, const float *k, const float *v, float beta, float decay,
                         float scale, int64_t n, float *y)
{
    for (int64_t j = 0; j < n; j++) {
        float *row = state + j * n;
        for (int64_t i = 0; i < n; i++)
            row[i] *= decay;
        const float d = (v[j] - dot_f32(row, k, n)) * beta;
        for (int64_t i = 0; i < n; i++)
            row[i] += d * k[i];
        y[j] = dot_f32(row, q, n) * scale;
    }
}

/* Channel by channel, the taps in order, as llama.cpp's ssm_conv sums them. */
void kiri_cpu_short_conv_row(float *state, size_t state_stride, const float *w, size_t w_stride, int64_t taps,
                             const float *x, int silu, int64_t n, float *y)
{
    for (int64_t c = 0; c < n; c++) {
        const float xc = x[c];
        float sum = 0.0f;
        for (int64_t k = 0; k + 1 < taps; k++)
            sum += state[(size_t)k * state_stride + c] * w[(size_t)k * w_stride + c];
        sum += xc * w[(size_t)(taps - 1) * w_stride + c];
        for (int64_t k = 0; k + 2 < taps; k++)
            state[(size_t)k * state_stride + c] = state[(size_t)(k + 1) * state_stride + c];
        if (taps > 1)
            state[(size_t)(taps - 2) * state_stride + c] = xc;
        y[c] = silu ? sum / (1.0f + expf(-sum)) : sum;
    }
}

void kiri_cpu_rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps)
{
    double sum = 0.0;
    for (int64_t i = 0; i < n; i++)
        sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = (x[i] * scale) * (w ? w[i] : 1.0f);
}

void kiri_cpu_swiglu_row(const float *g, const float *u, float *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        const float s = g[i] / (1.0f + expf(-g[i]));
        y[i] = s * u[i];
    }
}

/* gelu(x) = 0.5 x (1 + tanh(z)), z = sqrt(2/pi) (x + 0.044715 x^3), written as x sigmoid(2 z)
 * (0.5 (1 + tanh z) = 1 / (1 + e^-2z)): the same function, but 1 + tanhf(z) cancels to nothing
 * for x below about -3, where this form keeps full relative precision. e^-2z overflowing to
 * infinity (x below about -10) gives -0, the value rounded. */
void kiri_cpu_geglu_row(const float *g, const float *u, float *y, int64_t n)
{
    const float k = 0.797884560802865355f; /* sqrt(2/pi) */
    for (int64_t i = 0; i < n; i++) {
        const float x = g[i];
        const float z2 = 2.0f * k * (x + 0.044715f * x * x * x);
        y[i] = x / (1.0f + expf(-z2)) * u[i];
    }
}

void kiri_cpu_scale_row(const float *x, float *y, int64_t n, float s)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * s;
}

void kiri_cpu_softcap_row(const float *x, float *y, int64_t n, float cap)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = cap * tanhf(x[i] / cap);
}

void kiri_cpu_rope_token(float *x, int n_head, int head_dim, int32_t pos,
                         const struct kiri_rope_params *p, const float *freq_factors)
{
    const int n_rot = p->n_rot;
    const float theta_scale = powf(p->freq_base, -2.0f / (float)n_rot);
    /* The angles are the same for every head: compute the (cos, sin) pairs once, both scaled by
     * attn_factor (as ggml's rope with ext_factor 0 applies its mscale). Dimensions from n_rot to
     * head_dim pass unchanged, unscaled. */
    float cs[512][2];
    const int n_pairs = n_rot / 2 <= 512 ? n_rot / 2 : 512;
    float theta = (float)pos;
    for (int i = 0; i < n_pairs; i++) {
        const float ff = freq_factors ? freq_factors[i] : 1.0f;
        const float angle = p->freq_scale * (theta / ff);
        cs[i][0] = cosf(angle) * p->attn_factor;
        cs[i][1] = sinf(angle) * p->attn_factor;
        theta *= theta_scale;
    }
    for (int h = 0; h < n_head; h++) {
        float *v = x + (size_t)h * (size_t)head_dim;
        if (p->mode == KIRI_ROPE_NEOX) {
            for (int i = 0; i < n_pairs; i++) {
                const float a = v[i], b = v[i + n_rot / 2];
                v[i] = a * cs[i][0] - b * cs[i][1];
                v[i + n_rot / 2] = a * cs[i][1] + b * cs[i][0];
            }
        } else {
            for (int i = 0; i < n_pairs; i++) {
                const float a = v[2 * i], b = v[2 * i + 1];
                v[2 * i] = a * cs[i][0] - b * cs[i][1];
                v[2 * i + 1] = a * cs[i][1] + b * cs[i][0];
            }
        }
    }
}

/* The dot product of an F32 query (rounded as the cache type's product rounds it) and one cached
 * key row. */
static float dot_key(const float *q, const void *krow, int kv_type, int d)
{
    float s = 0.0f;
    if (kv_type == KIRI_TYPE_F32) {
        const float *k = krow;
        for (int i = 0; i < d; i++)
            s += q[i] * k[i];
    } else if (kv_type == KIRI_TYPE_F16) {
        const kiri_f16 *k = krow;
        for (int i = 0; i < d; i++)
            s += q[i] * kiri_f16_to_f32(k[i]);
    } else { /* Q8_0 */
        const struct kiri_block_q8_0 *k = krow;
        for (int b = 0; b < d / KIRI_QK8_0; b++) {
            const float dk = kiri_f16_to_f32(k[b].d);
            float bs = 0.0f;
            for (int i = 0; i < KIRI_QK8_0; i++)
                bs += q[b * KIRI_QK8_0 + i] * (float)k[b].qs[i];
            s += bs * dk;
        }
    }
    return s;
}

static void add_value(float *out, float w, const void *vrow, int kv_type, int d)
{
    if (kv_type == KIRI_TYPE_F32) {
        const float *v = vrow;
        for (int i = 0; i < d; i++)
            out[i] += w * v[i];
    } else if (kv_type == KIRI_TYPE_F16) {
        const kiri_f16 *v = vrow;
        for (int i = 0; i < d; i++)
            out[i] += w * kiri_f16_to_f32(v[i]);
    } else {
        const struct kiri_block_q8_0 *v = vrow;
        for (int b = 0; b < d / KIRI_QK8_0; b++) {
            const float dv = kiri_f16_to_f32(v[b].d) * w;
            for (int i = 0; i < KIRI_QK8_0; i++)
                out[b * KIRI_QK8_0 + i] += dv * (float)v[b].qs[i];
        }
    }
}

void kiri_cpu_attend_head(const float *q, const void *k, size_t k_stride, const void *v,
                          size_t v_stride, int kv_type, const int32_t *slots, int n_kv,
                          int head_dim, float scale, float *scratch, float *out)
{
    /* A reduced-precision cache multiplies with a query rounded to that precision. */
    float qr[1024];
    const int d = head_dim <= 1024 ? head_dim : 1024;
    for (int i = 0; i < d; i++)
        qr[i] = kv_type == KIRI_TYPE_F32 ? q[i] : kiri_f16_to_f32(kiri_f32_to_f16(q[i]));

    float max = -INFINITY;
    for (int j = 0; j < n_kv; j++) {
        const char *krow = (const char *)k + (size_t)slots[j] * k_stride;
        const float s = dot_key(qr, krow, kv_type, d) * scale;
        scratch[j] = s;
        if (s > max)
            max = s;
    }
    double sum = 0.0;
    for (int j = 0; j < n_kv; j++) {
        const float e = expf(scratch[j] - max);
        scratch[j] = e;
        sum += (double)e;
    }
    const float inv = sum > 0.0 ? (float)(1.0 / sum) : 0.0f;
    memset(out, 0, (size_t)d * sizeof *out);
    for (int j = 0; j < n_kv; j++) {
        float w = scratch[j] * inv;
        if (kv_type != KIRI_TYPE_F32)
            w = kiri_f16_to_f32(kiri_f32_to_f16(w));
        const char *vrow = (const char *)v + (size_t)slots[j] * v_stride;
        add_value(out, w, vrow, kv_type, d);
    }
}

void kiri_cpu_attend_tile_rows(kiri_attend_fn head, const float *q, size_t q_tok, size_t q_head, int n_t,
                               int n_q, const void *k, size_t k_stride, const void *v, size_t v_stride,
                               int kv_type, const int32_t *slots, const int32_t *kv_first,
                               const int32_t *n_kv, int head_dim, float scale, float *scratch, float *out,
                               size_t out_tok, size_t out_head)
{
    for (int r = 0; r < n_t * n_q; r++) {
        const int t = r / n_q, h = r % n_q;
        const int32_t f = kv_first ? kv_first[t] : 0;
        head(q + (size_t)t * q_tok + (size_t)h * q_head, k, k_stride, v, v_stride, kv_type, slots + f,
             n_kv[t] - f, head_dim, scale, scratch, out + (size_t)t * out_tok + (size_t)h * out_head);
    }
}
