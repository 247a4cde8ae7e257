/* Micro-benchmark of the CPU decode attention: one token's query heads against an F16 cache of
 * n_kv keys, through the kernel table's attend_group as a decode step calls it (one call per
 * key/value head, its group of query heads together), over `layers` layers' caches laid out as
 * the paged cache lays them (a slot row holds every key/value head of a layer). With enough
 * layers the caches outgrow L3, so the keys and values come from DRAM as in a decode step at
 * depth; with one small layer they stay in cache and the figure is the arithmetic alone.
 * Prints microseconds per key/value head and layer, best of the passes. One thread, the best
 * table of this CPU (AVX2 attention on both x86 tiers; the portable C elsewhere).
 *
 * Usage: bench_attention [n_kv] [layers] [head_dim] [kv_heads] [query heads per kv head] [passes]
 *        (defaults 4096 6 64 8 4 5: LFM2-1.2B's attention layers at depth 4096)
 * e.g.   bench_attention 2048 22 64 4 8    TinyLlama at 2048
 *        bench_attention 4096 26 256 1 4   Gemma 3 1B at 4096
 */
#include <stdio.h>
#include <stdlib.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "platform.h"

static long arg(int argc, char **argv, int i, long dflt) { return argc > i ? atol(argv[i]) : dflt; }

int main(int argc, char **argv)
{
    const long n_kv = arg(argc, argv, 1, 4096), layers = arg(argc, argv, 2, 6), d = arg(argc, argv, 3, 64);
    const long hkv = arg(argc, argv, 4, 8), nq = arg(argc, argv, 5, 4), passes = arg(argc, argv, 6, 5);
    if (n_kv < 1 || n_kv > (1 << 20) || layers < 1 || layers > 256 || d < 8 || d > 1024 || d % 8 || hkv < 1 ||
        hkv > 64 || nq < 1 || nq > 16 || passes < 1 || passes > 1000) {
        fprintf(stderr, "bench_attention: n_kv 1..1048576, layers 1..256, head_dim 8..1024 (multiple of 8), "
                        "kv_heads 1..64, query heads per kv head 1..16, passes 1..1000\n");
        return 2;
    }
    struct kiri_cpu_kernels k;
    kiri_cpu_kernels_init_ref(&k);
#if defined(__x86_64__)
    if (kiri_platform_cpu_features() & KIRI_CPU_AVX2) {
        kiri_cpu_kernels_init_avx2(&k);
        kiri_cpu_kernels_init_ops_avx2(&k);
    }
#endif
    const size_t row = (size_t)hkv * (size_t)d * sizeof(uint16_t); /* one slot: every kv head */
    uint16_t **kc = calloc((size_t)layers, sizeof *kc), **vc = calloc((size_t)layers, sizeof *vc);
    int32_t *slots = malloc((size_t)n_kv * sizeof *slots);
    float *q = malloc((size_t)(hkv * nq * d) * sizeof *q), *out = malloc((size_t)(hkv * nq * d) * sizeof *out);
    float *scratch = malloc(((size_t)KIRI_ATTEND_TILE_ROWS * (size_t)n_kv + 64) * sizeof *scratch);
    if (!kc || !vc || !slots || !q || !out || !scratch) {
        fprintf(stderr, "bench_attention: out of memory\n");
        return 1;
    }
    uint64_t s = 42;
    for (long l = 0; l < layers; l++) {
        kc[l] = malloc(row * (size_t)n_kv);
        vc[l] = malloc(row * (size_t)n_kv);
        if (!kc[l] || !vc[l]) {
            fprintf(stderr, "bench_attention: out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < row / sizeof(uint16_t) * (size_t)n_kv; i++) { /* F16 in [0.125, 0.25) */
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            kc[l][i] = (uint16_t)(0x3000 | ((s >> 33) & 0x3ff));
            vc[l][i] = (uint16_t)(0x3000 | ((s >> 43) & 0x3ff));
        }
    }
    for (long i = 0; i < n_kv; i++)
        slots[i] = (int32_t)i;
    for (long i = 0; i < hkv * nq * d; i++)
        q[i] = (float)((i * 37) % 101) / 101.0f - 0.5f;
    const kiri_attend_fn head = k.attend_head ? k.attend_head : kiri_cpu_attend_head;
    double best = 1e30;
    for (long p = 0; p < passes; p++) {
        const double t0 = kiri_platform_now();
        for (long l = 0; l < layers; l++)
            for (long h = 0; h < hkv; h++) {
                const float *qh = q + h * nq * d;
                float *oh = out + h * nq * d;
                const char *kh = (const char *)kc[l] + (size_t)h * (size_t)d * 2;
                const char *vh = (const char *)vc[l] + (size_t)h * (size_t)d * 2;
                if (nq > 1 && k.attend_group)
                    k.attend_group(qh, (size_t)d, (int)nq, kh, row, vh, row, KIRI_TYPE_F16, slots, (int)n_kv, (int)d,
                                   0.125f, scratch, oh, (size_t)d);
                else
                    for (long i = 0; i < nq; i++)
                        head(qh + i * d, kh, row, vh, row, KIRI_TYPE_F16, slots, (int)n_kv, (int)d, 0.125f, scratch,
                             oh + i * d);
            }
        const double t = kiri_platform_now() - t0;
        best = t < best ? t : best;
    }
    const double bytes = 2.0 * (double)row * (double)n_kv * (double)layers;
    printf("bench_attention (%s): %ld keys, %ld layers, %ld kv heads of %ld, %ld query heads each: "
           "%.1f us per kv head and layer, %.2f ms per token, %.1f GB/s of cache\n",
           k.path, n_kv, layers, hkv, d, nq, best * 1e6 / (double)(layers * hkv), best * 1e3, bytes / best / 1e9);
    for (long l = 0; l < layers; l++) {
        free(kc[l]);
        free(vc[l]);
    }
    free(kc);
    free(vc);
    free(slots);
    free(q);
    free(out);
    free(scratch);
    return 0;
}
