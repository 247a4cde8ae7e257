/* The CUDA kernels of the CUDA backend, as plain C launchers the glue (cuda_backend.c) calls: each
 * enqueues one kernel on a stream (passed as void * so this header needs no CUDA header) and
 * returns 0, or the CUDA error code of the launch. Pointers are device addresses; strides are in
 * bytes. Every kernel reads and writes only the elements its shape names.
 *
 * Numerics follow the CPU reference (kernels/cpu): products take the activations converted to
 * the type the weight's dot product takes (kiri_cpu_vec_dot_type), with the reference's rounding
 * (the quants are the reference's bytes), and each block's integer sum is exact; only the order
 * in which block results are added differs. The .cu files are compiled with -fmad=false so no
 * product and sum are fused where the reference rounds both.
 */
#ifndef KIRI_CUDA_KERNELS_H
#define KIRI_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Activation formats of products. F32 means the F32 rows themselves; F16 and BF16 are floats
 * rounded to those types; the Q8 formats are blocks of int8 quants with float scales:
 *   Q8_0: 32 quants, d            (36 bytes per 32 values)
 *   Q8_1: 32 quants, d, s         (40 bytes)
 *   Q8_K: 256 quants, d, 16 sums  (324 bytes per 256 values) */
enum { KIRI_CUDA_ACT_F32, KIRI_CUDA_ACT_F16, KIRI_CUDA_ACT_BF16, KIRI_CUDA_ACT_Q8_0,
       KIRI_CUDA_ACT_Q8_1, KIRI_CUDA_ACT_Q8_K };

/* The activation format a weight type's products take; -1 for a type without kernels. */
int kiri_cuda_act_format(int weight_type);
/* Bytes of one converted activation row of k values (k a multiple of the format's block). */
size_t kiri_cuda_act_row_bytes(int act, int64_t k);

/* Converts n rows of k F32 values (src_stride apart) to format act (not F32), rows of
 * kiri_cuda_act_row_bytes(act, k) bytes one after the other at dst. */
int kiri_cuda_quantize(int act, const float *src, size_t src_stride, void *dst, int64_t k, int64_t n,
                       void *stream);

/* dst[t * d_stride + r] = weight row r . activation row t, for r < rows, t < n: weight rows of
 * weight_type (w_stride apart), activations in the weight's format (a_stride apart; for F32 the
 * source rows). One token runs a warp per row; more run a warp per row and 8 tokens. */
int kiri_cuda_matmul(int weight_type, const void *w, size_t w_stride, int64_t rows, const void *act,
                     size_t a_stride, float *dst, size_t d_stride, int64_t k, int64_t n, void *stream);

/* dst row i (d_stride apart) = the dequantized row ids[i] of src (rows of type, s_stride apart),
 * for i < n; an id outside [0, n_src) leaves its row unwritten. */
int kiri_cuda_get_rows(int type, const void *src, size_t s_stride, int64_t n_src, const int32_t *ids,
                       int64_t n, float *dst, size_t d_stride, int64_t ncols, void *stream);

/* RMS norm of rows of n values; row r of (n, ne1, ne2) lives at (r % ne1) * nb1 + (r / ne1) * nb2.
 * w (n values) may be NULL. y may be x. */
int kiri_cuda_rms_norm(const float *x, size_t x_nb1, size_t x_nb2, const float *w, float *y,
                       size_t y_nb1, size_t y_nb2, int64_t n, int64_t ne1, int64_t rows, float eps,
                       void *stream);

/* op 0: y = a + b, 1: y = a * b, 2: y = silu(a) * b, 3: y = gelu(a) * b (GEGLU, tanh
 * approximation), 4: y = a * sigmoid(b) (SIGMOID_MUL), over rows of n; b_nb1 = 0 broadcasts b's
 * first row. */
int kiri_cuda_binary(int op, const float *a, size_t a_nb1, const float *b, size_t b_nb1, float *y,
                     size_t y_nb1, int64_t n, int64_t rows, void *stream);

/* op 0: y = x * c (SCALE), 1: y = c * tanh(x / c) (SOFTCAP, c > 0), over rows of n; row r of
 * (n, ne1, ...) lives at (r % ne1) * nb1 + (r / ne1) * nb2 on each side (strided head views).
 * y may be x. */
int kiri_cuda_unary(int op, const float *x, size_t x_nb1, size_t x_nb2, float *y, size_t y_nb1, size_t y_nb2,
                    int64_t n, int64_t ne1, int64_t rows, float c, void *stream);

/* RoPE in place on x (head_dim, n_head, n_tok) with head stride nb1 and token stride nb2 at
 * positions pos; ff (n_rot / 2 values) may be NULL. theta_scale = freq_base^(-2 / n_rot), computed
 * by the caller as the CPU reference computes it; cos and sin are multiplied by attn_factor. */
int kiri_cuda_rope(float *x, size_t nb1, size_t nb2, const int32_t *pos, const float *ff, int64_t n_head,
                   int64_t n_tok, int n_rot, int neox, float theta_scale, float freq_scale, float attn_factor,
                   void *stream);

/* Copies n_tok rows of k F32 values (s_nb1 apart) into the cache rows slots[i] (c_nb1 apart) of a
 * cache of type ctype (F32, F16 or Q8_0) with n_slots rows; slots outside are skipped. */
int kiri_cuda_store_kv(const float *src, size_t s_nb1, const int32_t *slots, void *cache, size_t c_nb1,
                       int ctype, int64_t k, int64_t n_tok, int64_t n_slots, void *stream);

/* The ATTENTION op of runtime/backend.h: q (head_dim, n_head, n_tok) with strides q_nb1, q_nb2;
 * caches of kv_type with n_slots rows; meta (2, n_tok) and tables I32; dst rows d_nb1 apart. */
struct kiri_cuda_attention {
    const float *q;
    size_t q_nb1, q_nb2;
    const void *k, *v;
    size_t k_nb1, v_nb1;
    const int32_t *meta, *tables;
    float *dst;
    size_t d_nb1;
    int n_head, n_head_kv, head_dim, block_size, kv_type;
    int64_t n_tok, n_slots;
    float scale;
    int window; /* > 0: a token with n keys attends keys [max(0, n - window), n) only */
};
int kiri_cuda_attention(const struct kiri_cuda_attention *a, void *stream);

/* SHORT_CONV (runtime/backend.h): u (e, n_tok) rows u_nb1 apart; kernel w (k taps per channel,
 * rows w_nb1 apart); state rows ((k - 1) * e floats) s_nb1 apart, n_slots of them; rows (written),
 * from (read: rows itself, or a speculative step's) and pos (n_tok) I32; dst rows d_nb1 apart
 * (dst may be u). */
struct kiri_cuda_short_conv {
    const float *u, *w;
    size_t u_nb1, w_nb1;
    float *state;
    size_t s_nb1;
    const int32_t *rows, *from, *pos;
    float *dst;
    size_t d_nb1;
    int64_t e, n_tok, n_slots;
    int k, silu;
};
int kiri_cuda_short_conv(const struct kiri_cuda_short_conv *a, void *stream);

/* DELTA_GATES: dst row t (d_nb1 apart) = h values sigmoid(b), then h values softplus(a + dt) *
 * decay, from rows b and a (b_nb1, a_nb1 apart) and dt, decay (h values). */
int kiri_cuda_delta_gates(const float *b, size_t b_nb1, const float *a, size_t a_nb1, const float *dt,
                          const float *decay, float *dst, size_t d_nb1, int64_t h, int64_t n_tok, void *stream);

/* DELTA_NET: x (q, k, v per token) rows x_nb1 apart; gates (beta, g) rows g_nb1 apart; state rows
 * (n_head_v * head_dim^2 floats) s_nb1 apart, n_slots of them; rows, from and pos (n_tok) I32 as
 * for SHORT_CONV. */
struct kiri_cuda_delta_net {
    const float *x, *gates;
    size_t x_nb1, g_nb1;
    float *state;
    size_t s_nb1;
    const int32_t *rows, *from, *pos;
    float *dst;
    size_t d_nb1;
    int n_head_k, n_head_v, head_dim;
    int64_t n_tok, n_slots;
    float scale;
};
int kiri_cuda_delta_net(const struct kiri_cuda_delta_net *a, void *stream);

/* 0 when this binary holds code the current device can run, else the CUDA error (for example
 * "no kernel image is available"). */
int kiri_cuda_check_image(void);

#ifdef __cplusplus
}
#endif

#endif
