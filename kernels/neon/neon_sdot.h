/* The SDOT instruction and the half-to-float conversion shared by the NEON kernel files
 * (quants_neon.c, gemm_neon.c). Those files are compiled without -march flags so that the binary
 * runs on any AArch64 CPU; a function that uses SDOT is compiled for dotprod by the SDOT target
 * attribute and must only be called when the CPU reports dotprod.
 *
 * Include only on AArch64, after <arm_neon.h>.
 */
#ifndef KIRI_NEON_SDOT_H
#define KIRI_NEON_SDOT_H

/* GCC inlines the SDOT intrinsic in a function compiled for dotprod by attribute; clang (before
 * 16) declares the intrinsic only when the whole file is built for dotprod, so with clang the
 * instruction is written as inline assembly. */
#if defined(__clang__)
#define SDOT __attribute__((target("dotprod")))
#else
#define SDOT __attribute__((target("arch=armv8.2-a+dotprod")))
#endif

/* acc + the dot products of a and b: lane i adds the four int8 products of bytes 4i .. 4i + 3. */
SDOT static inline int32x4_t sdot(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__clang__)
    __asm__("sdot %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
#else
    return vdotq_s32(acc, a, b);
#endif
}

/* A half-precision value as a float (exact). */
static inline float h2f(kiri_f16 h)
{
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}

#endif
