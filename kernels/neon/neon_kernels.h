/* The ARM NEON kernels of the CPU backend (quants_neon.c): the dot products a matmul spends its
 * time in and the activation conversions, as replacements for entries of the CPU kernel table.
 *
 * Every replacement keeps the contract of the portable kernel it replaces (kernels/cpu/quants.c):
 * the activation conversions write the same bytes; the dot products compute the same integer
 * block sums and differ from the reference only in the order of float additions across blocks.
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
#endif

#endif
