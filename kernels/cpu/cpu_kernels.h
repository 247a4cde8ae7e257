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

/* The kernel table of the CPU backend: the reference entries first, then the best ones the CPU
 * offers. Indexed by enum kiri_type. */
struct kiri_cpu_kernels {
    kiri_vec_dot_fn vec_dot[KIRI_TYPE_COUNT];       /* by weight type; NULL: unsupported */
    kiri_from_float_fn from_float[KIRI_TYPE_COUNT]; /* by activation type */
    const char *path;                               /* "c", "avx2", "neon+dotprod", ... */
};

/* Fills every entry with the portable C kernels. */
void kiri_cpu_kernels_init_ref(struct kiri_cpu_kernels *k);

#if defined(__x86_64__)
/* Replaces the entries that have AVX2 + FMA + F16C versions (quants_avx2.c) and sets path to
 * "avx2". Call after kiri_cpu_kernels_init_ref, and only when the CPU reports KIRI_CPU_AVX2. */
void kiri_cpu_kernels_init_avx2(struct kiri_cpu_kernels *k);
#endif

/* ---- element-wise and row operations (portable C) ---- */

/* y[i] = x[i] / sqrt(mean(x^2) + eps) * w[i] over one row of n. */
void kiri_cpu_rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps);
/* y[i] = silu(g[i]) * u[i]. */
void kiri_cpu_swiglu_row(const float *g, const float *u, float *y, int64_t n);
/* Rotates one token's heads in place: x is (head_dim, n_head) contiguous. freq_factors may be NULL. */
void kiri_cpu_rope_token(float *x, int n_head, int head_dim, int32_t pos,
                         const struct kiri_rope_params *p, const float *freq_factors);
/* One query head against n_kv cached keys: out (head_dim) = softmax(q.k * scale) v. Keys and values
 * are rows of kv_type (F32, F16 or Q8_0) found through slots (n_kv slot indices), row strides in
 * bytes. scratch holds n_kv floats. */
void kiri_cpu_attend_head(const float *q, const void *k, size_t k_stride, const void *v,
                          size_t v_stride, int kv_type, const int32_t *slots, int n_kv,
                          int head_dim, float scale, float *scratch, float *out);

#endif
