/* The ARM NEON kernels of the CPU backend, as replacements for entries of the CPU kernel table:
 * the dot products and activation conversions (quants_neon.c), the matrix products of prefill
 * (gemm_neon.c: SDOT, and SMMLA where the CPU has i8mm) and the row operations (ops_neon.c:
 * attention, RMS norm, SwiGLU, GeGLU, scaling, soft-capping, the delta rule's head step, the
 * short convolution's token).
 *
 * Every replacement keeps the contract of the portable kernel it replaces (kernels/cpu/quants.c,
 * ops.c): the activation conversions write the same bytes; the products compute the same integer
 * block sums and differ from the reference only in the order of float additions; the row
 * operations differ only in that order and in exp (ops_neon.c says how).
 */
#ifndef KIRI_NEON_KERNELS_H
#define KIRI_NEON_KERNELS_H

#include "../cpu/cpu_kernels.h"

#if defined(__aarch64__)
/* Replaces the entries that have NEON versions and sets k->path to "neon", or to "neon+dotprod"
 * when cpu_features has KIRI_CPU_DOTPROD, in which case the 8-bit dot products use the SDOT
 * instruction. Call after kiri_cpu_kernels_init_ref. NEON is part of every AArch64 CPU; pass
 * KIRI_CPU_DOTPROD only when the CPU reports it (the SDOT kernels fault without it). */
void kiri_cpu_kernels_init_neon(struct kiri_cpu_kernels *k, uint32_t cpu_features);
/* Sets the gemm entries that have NEON versions (gemm_neon.c), with SDOT when cpu_features has
 * KIRI_CPU_DOTPROD and SMMLA when it has KIRI_CPU_I8MM. Called by kiri_cpu_kernels_init_neon. */
void kiri_cpu_kernels_init_gemm_neon(struct kiri_cpu_kernels *k, uint32_t cpu_features);
/* Sets the row-operation entries that have NEON versions (ops_neon.c: attention, norms,
 * SwiGLU, GeGLU, scaling, soft-capping, delta_head, short_conv_row). Called by kiri_cpu_kernels_init_neon. */
void kiri_cpu_kernels_init_ops_neon(struct kiri_cpu_kernels *k);
#endif

#endif
