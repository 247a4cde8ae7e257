/* The CPU features kiri detects at start-up (kiri_platform_cpu_features asks the CPU and the OS).
 * Shared by the platform layer, which detects them, and the kernels, which choose by them. */
#ifndef KIRI_CPU_FEATURES_H
#define KIRI_CPU_FEATURES_H

/* CPU features the runtime detected (asking both the CPU and the operating system). */
enum kiri_cpu_feature {
    KIRI_CPU_AVX2 = 1u << 0,    /* with FMA and F16C */
    KIRI_CPU_AVX512 = 1u << 1,  /* F, BW, VL with OS-enabled ZMM state */
    KIRI_CPU_AVX512_VNNI = 1u << 2,
    KIRI_CPU_AVX_VNNI = 1u << 3,
    KIRI_CPU_NEON = 1u << 8,
    KIRI_CPU_DOTPROD = 1u << 9,
    KIRI_CPU_I8MM = 1u << 10
};

#endif
