/* The portable C kernels: the reference every faster kernel and every backend is tested against.
 * Kernels take plain pointers, sizes and strides; they include no runtime header but backend.h.
 *
 * Quantized products follow GGUF's pairing of weight and activation types: a weight row of type T
 * is multiplied with an activation row converted to kiri_cpu_vec_dot_type(T):
 *   F32 -> F32, F16 -> F16, BF16 -> BF16, Q4_0/Q5_0/Q8_0 -> Q8_0, Q4_1/Q5_1 -> Q8_1,
 *   Q4_K/Q5_K/Q6_K -> Q8_K.
 * The SIMD kernels (AVX2, NEON) implement the same functions with the same types, so a table of
 * function pointers (struct kiri_cpu_kernels) can swap them in at start-up.
 */
#ifndef KIRI_CPU_KERNELS_H
#define KIRI_CPU_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "../../runtime/backend.h"

/* ---- scalar conversions (exact, round-to-nearest-even where narrowing) ---- */
float kiri_f16_to_f32(kiri_f16 h);
kiri_f16 kiri_f32_to_f16(float f);
float kiri_bf16_to_f32(kiri_bf16 h);
kiri_bf16 kiri_f32_to_bf16(float f);

/* ---- rows of one type ---- */

/* Dequantizes n values (a multiple of the type's block size) of a supported type to F32.
 * Supported: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K. */
void kiri_cpu_dequantize_row(int type, const void *src, float *dst, int64_t n);

/* Converts n F32 values to `type` (a weight type above, or an activation type Q8_0, Q8_1, Q8_K),
 * using the reference (round-to-nearest, GGUF-compatible) quantization. Returns bytes written,
 * 0 for an unsupported type or an n that is not a multiple of the block size. */
size_t kiri_cpu_quantize_row(int type, const float *src, void *dst, int64_t n);

/* The activation type a weight type's dot product takes (see above); -1 if unsupported. */
int kiri_cpu_vec_dot_type(int weight_type);

/* s = dot(x, y) over n values: x a weight row of type T, y an activation row of
 * kiri_cpu_vec_dot_type(T). */
typedef void (*kiri_vec_dot_fn)(int64_t n, float *s, const void *x, const void *y);
/* Converts an F32 activation row to an activation type (same contract as kiri_cpu_quantize_row,
 * without the return value). */
typedef void (*kiri_from_float_fn)(const float *src, void *dst, int64_t n);

/* A tile of a matrix product: dst[t * dst_stride + r] = dot(weight row r, activation row t) for
 * r in [0, nr) and t in [0, nt), k values each. Weight row r (of type T) starts at
 * w + r * w_stride bytes, activation row t (of kiri_cpu_vec_dot_type(T), already converted) at
 * a + t * a_stride bytes; dst_stride counts floats. Any nr, nt >= 1 work: the kernel walks its own
 * register-sized micro-tiles inside and handles the edges, the caller picks a cache-sized tile.
 * Results equal vec_dot's up to the order of the float additions (the integer block sums are
 * the same). */
typedef void (*kiri_gemm_fn)(int64_t k, const void *w, size_t w_stride, const void *a,
                             size_t a_stride, float *dst, size_t dst_stride, int64_t nr, int64_t nt);

/* One query head against cached keys and values: the contract of kiri_cpu_attend_head below. */
typedef void (*kiri_attend_fn)(const float *q, const void *k, size_t k_stride, const void *v,
                               size_t v_stride, int kv_type, const int32_t *slots, int n_kv,
                               int head_dim, float scale, float *scratch, float *out);

/* Query rows a kiri_attend_tile_fn takes at once (tokens times heads). */
#define KIRI_ATTEND_TILE_ROWS 16

/* n_q query heads that share one key/value head (grouped-query attention), each with the result
 * of kiri_attend_fn: head i's query at q + i * q_stride, its output at out + i * out_stride
 * (strides in floats). scratch holds KIRI_ATTEND_TILE_ROWS * n_kv floats. */
typedef void (*kiri_attend_group_fn)(const float *q, size_t q_stride, int n_q, const void *k,
                                     size_t k_stride, const void *v, size_t v_stride, int kv_type,
                                     const int32_t *slots, int n_kv, int head_dim, float scale,
                                     float *scratch, float *out, size_t out_stride);

/* n_t tokens of one sequence and n_q query heads sharing one key/value head, n_t * n_q at most
 * KIRI_ATTEND_TILE_ROWS: each (token, head) with the result of kiri_attend_fn, token i seeing the
 * slots [kv_first[i], n_kv[i]) (a sliding window; kv_first NULL: from 0), that is, the result of
 * kiri_attend_fn on slots + kv_first[i] and n_kv[i] - kv_first[i] keys. A token's result never
 * depends on the keys and values outside its range (NaN or not). The query of token i, head h is at q + i * q_tok + h * q_head, its
 * output at out + i * out_tok + h * out_head (strides in floats). Every key and value row is read
 * once for all of them, which is what makes prefill's attention a matrix product. scratch holds
 * KIRI_ATTEND_TILE_ROWS floats per key of the largest n_kv. */
typedef void (*kiri_attend_tile_fn)(const float *q, size_t q_tok, size_t q_head, int n_t, int n_q,
                                    const void *k, size_t k_stride, const void *v, size_t v_stride,
                                    int kv_type, const int32_t *slots, const int32_t *kv_first,
                                    const int32_t *n_kv, int head_dim, float scale, float *scratch,
                                    float *out, size_t out_tok, size_t out_head);

/* Row operations with the contracts of kiri_cpu_swiglu_row (also GeGLU's), kiri_cpu_rms_norm_row,
 * kiri_cpu_scale_row and kiri_cpu_softcap_row below. */
typedef void (*kiri_swiglu_fn)(const float *g, const float *u, float *y, int64_t n);
typedef void (*kiri_rms_norm_fn)(const float *x, const float *w, float *y, int64_t n, float eps);
typedef void (*kiri_map_fn)(const float *x, float *y, int64_t n, float param);
/* One token's step of the gated delta rule on one head: the contract of kiri_cpu_delta_head. */
typedef void (*kiri_delta_head_fn)(float *state, const float *q, const float *k, const float *v, float beta,
                                   float decay, float scale, int64_t n, float *y);
/* One token of a causal depthwise convolution over a run of channels: the contract of
 * kiri_cpu_short_conv_row. */
typedef void (*kiri_short_conv_fn)(float *state, size_t state_stride, const float *w, size_t w_stride,
                                   int64_t taps, const float *x, int silu, int64_t n, float *y);

/* The kernel table of the CPU backend: the reference entries first, then the best ones the CPU
 * offers. Indexed by enum kiri_type. */
struct kiri_cpu_kernels {
    kiri_vec_dot_fn vec_dot[KIRI_TYPE_COUNT];       /* by weight type; NULL: unsupported */
    kiri_from_float_fn from_float[KIRI_TYPE_COUNT]; /* by activation type */
    kiri_gemm_fn gemm[KIRI_TYPE_COUNT];             /* by weight type; NULL: use vec_dot */
    /* By weight type: up to this many tokens, gemm reads each weight row once for all of them
     * (a small batch streamed like one token), so callers pass whole row ranges rather than
     * cache-sized tiles. 0: only one token. */
    uint8_t gemm_stream[KIRI_TYPE_COUNT];
    kiri_attend_fn attend_head;                     /* NULL: kiri_cpu_attend_head */
    kiri_attend_group_fn attend_group;              /* NULL: attend_head for each head */
    kiri_attend_tile_fn attend_tile;                /* NULL: attend_group for each token */
    kiri_swiglu_fn swiglu_row;                      /* NULL: kiri_cpu_swiglu_row */
    kiri_rms_norm_fn rms_norm_row;                  /* NULL: kiri_cpu_rms_norm_row */
    kiri_swiglu_fn geglu_row;                       /* NULL: kiri_cpu_geglu_row */
    kiri_map_fn scale_row;                          /* NULL: kiri_cpu_scale_row */
    kiri_map_fn softcap_row;                        /* NULL: kiri_cpu_softcap_row */
    kiri_delta_head_fn delta_head;                  /* NULL: kiri_cpu_delta_head */
    kiri_short_conv_fn short_conv_row;              /* NULL: kiri_cpu_short_conv_row */
    const char *path;                               /* "c", "avx2", "neon+dotprod", ... */
};

/* Fills every entry with the portable C kernels. */
void kiri_cpu_kernels_init_ref(struct kiri_cpu_kernels *k);

#if defined(__x86_64__)
/* Replaces the entries that have AVX2 + FMA + F16C versions (quants_avx2.c) and sets path to
 * "avx2". Call after kiri_cpu_kernels_init_ref, and only when the CPU reports KIRI_CPU_AVX2. */
void kiri_cpu_kernels_init_avx2(struct kiri_cpu_kernels *k);
/* Sets the gemm entries that have AVX2 + FMA + F16C versions (gemm_avx2.c: Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, F32). Same preconditions as kiri_cpu_kernels_init_avx2. */
void kiri_cpu_kernels_init_gemm_avx2(struct kiri_cpu_kernels *k);
/* AMD family 19h (Zen 3, Zen 4): its one-token kernels prefetch weight rows into L2, not L1. */
int kiri_cpu_is_amd_family_19h(void);
/* Sets the row-operation entries that have AVX2 versions (ops_avx2.c: attend_head, attend_group,
 * attend_tile, swiglu_row, rms_norm_row, geglu_row, scale_row, softcap_row, delta_head,
 * short_conv_row). Same preconditions as kiri_cpu_kernels_init_avx2. */
void kiri_cpu_kernels_init_ops_avx2(struct kiri_cpu_kernels *k);
/* Replaces the row-operation entries that have AVX-512 versions (ops_avx512.c: delta_head,
 * short_conv_row). Call after kiri_cpu_kernels_init_ops_avx2, and only when the CPU reports
 * KIRI_CPU_AVX512. */
void kiri_cpu_kernels_init_ops_avx512(struct kiri_cpu_kernels *k);
/* Replaces the gemm entries that have AVX-512 + VNNI versions (gemm_avx512.c: Q4_0, Q4_1, Q5_0,
 * Q5_1, Q8_0, Q4_K, Q5_K, Q6_K). Call after kiri_cpu_kernels_init_gemm_avx2, and only when the CPU reports
 * KIRI_CPU_AVX512 and KIRI_CPU_AVX512_VNNI. */
void kiri_cpu_kernels_init_gemm_avx512(struct kiri_cpu_kernels *k);
/* Prefill tiles on token octets (gemm_octet_avx2.c), for the gemm entries of gemm_avx2.c: the
 * kiri_gemm_fn contract for the first 8 * (nt / 8) tokens only, which is the count returned.
 * Same preconditions as kiri_cpu_kernels_init_avx2. */
int64_t kiri_cpu_gemm_octets_q4_0_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt);
int64_t kiri_cpu_gemm_octets_q4_1_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt);
int64_t kiri_cpu_gemm_octets_q5_0_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt);
int64_t kiri_cpu_gemm_octets_q5_1_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt);
int64_t kiri_cpu_gemm_octets_q8_0_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt);
int64_t kiri_cpu_gemm_octets_q4_K_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt);
int64_t kiri_cpu_gemm_octets_q5_K_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt);
int64_t kiri_cpu_gemm_octets_q6_K_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt);
/* The small-batch kernels of gemm_avx2.c (the kiri_gemm_fn contract; one to four tokens stream
 * the rows once, more go four at a time), which the AVX-512 table keeps for decode and for the
 * tokens its octet kernels leave. Same preconditions as kiri_cpu_kernels_init_avx2. */
void kiri_cpu_gemm_small_q4_1_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                   float *dst, size_t ds, int64_t nr, int64_t nt);
void kiri_cpu_gemm_small_q5_0_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                   float *dst, size_t ds, int64_t nr, int64_t nt);
void kiri_cpu_gemm_small_q5_1_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                   float *dst, size_t ds, int64_t nr, int64_t nt);
#endif

/* ---- element-wise and row operations (portable C) ---- */

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] over one row of n. */
void kiri_cpu_rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps);
/* y[i] = silu(g[i]) * u[i]. */
void kiri_cpu_swiglu_row(const float *g, const float *u, float *y, int64_t n);
/* y[i] = gelu(g[i]) * u[i], gelu by its tanh approximation 0.5 x (1 + tanh(sqrt(2/pi)
 * (x + 0.044715 x^3))), within a few ulp of that formula evaluated exactly on the float x (where
 * the result is a normal float). y may equal g or u. */
void kiri_cpu_geglu_row(const float *g, const float *u, float *y, int64_t n);
/* y[i] = x[i] * s. y may equal x. */
void kiri_cpu_scale_row(const float *x, float *y, int64_t n, float s);
/* y[i] = cap * tanh(x[i] / cap), cap > 0. y may equal x. */
void kiri_cpu_softcap_row(const float *x, float *y, int64_t n, float cap);
/* One token's step of the gated delta rule on one head of n (key and value head size): state
 * (n x n, row j = value j's weights over the key) decays by decay, row j then moves by
 * beta (v[j] - row_j . k) along k, and y[j] = scale (row_j . q) with the updated row. Rows are
 * independent, so the steps run row by row in one pass over the state. */
void kiri_cpu_delta_head(float *state, const float *q, const float *k, const float *v, float beta, float decay,
                         float scale, int64_t n, float *y);
/* One token of a causal depthwise convolution of `taps` taps (1 to KIRI_SHORT_CONV_MAX_TAPS) over
 * n channels, all arrays indexed by channel: the weights tap-major (tap k of channel c at
 * w[k * w_stride + c], the oldest input's tap first), the state the channels' taps - 1 previous
 * inputs, oldest first (input k at state + k * state_stride). y[c] = the sum over k of input k
 * times tap k, the state's inputs first and x's last, added in that order in float; with silu,
 * silu of that sum (sum / (1 + e^-sum)). The state then moves on by one input, x its newest.
 * y may equal x. */
void kiri_cpu_short_conv_row(float *state, size_t state_stride, const float *w, size_t w_stride, int64_t taps,
                             const float *x, int silu, int64_t n, float *y);
/* The most taps kiri_short_conv_fn takes (lfm2's kernel has 3, qwen35's 4). */
#define KIRI_SHORT_CONV_MAX_TAPS 16
/* Rotates one token's heads in place: x is (head_dim, n_head) contiguous; the first n_rot values
 * of each head rotate (pairs as p->mode says), cos and sin scaled by p->attn_factor, the rest pass
 * unchanged. freq_factors (n_rot / 2) may be NULL. */
void kiri_cpu_rope_token(float *x, int n_head, int head_dim, int32_t pos,
                         const struct kiri_rope_params *p, const float *freq_factors);
/* One query head against n_kv cached keys: out (head_dim) = softmax(q.k * scale) v. Keys and values
 * are rows of kv_type (F32, F16 or Q8_0) found through slots (n_kv slot indices), row strides in
 * bytes. scratch holds n_kv floats. */
void kiri_cpu_attend_head(const float *q, const void *k, size_t k_stride, const void *v,
                          size_t v_stride, int kv_type, const int32_t *slots, int n_kv,
                          int head_dim, float scale, float *scratch, float *out);
/* A tile with kiri_attend_tile_fn's contract worked one (token, head) row at a time through
 * `head`: what a vector tile kernel falls back to for a cache type or head size it does not take. */
void kiri_cpu_attend_tile_rows(kiri_attend_fn head, const float *q, size_t q_tok, size_t q_head, int n_t,
                               int n_q, const void *k, size_t k_stride, const void *v, size_t v_stride,
                               int kv_type, const int32_t *slots, const int32_t *kv_first,
                               const int32_t *n_kv, int head_dim, float scale, float *scratch, float *out,
                               size_t out_tok, size_t out_head);

#endif
