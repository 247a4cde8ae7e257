/* Micro-benchmark of the CPU dot-product kernels: nanoseconds per row dot (one weight row of
 * n = 4096 values against one activation row) for every weight type, reference C versus AVX2,
 * plus the activation quantizers. Rows cycle through a small matrix (64 rows, at most 1 MiB) so
 * the numbers measure compute, not DRAM bandwidth. One thread.
 *
 * The second table times the one-token (decode) tiles of the matrix-product kernels (kiri_gemm_fn
 * with one token) of the common model types, AVX2 and AVX-512 where the CPU has them, as GB/s of
 * weights consumed: once on a matrix that stays in L2 (compute speed) and once on 256 MiB of rows
 * read once per pass (DRAM streaming, what decode does).
 *
 * The third table times the same tiles with 2, 3, 4 and 8 tokens (the small batches of a
 * serving step, and one octet of prefill), again as GB/s of weights: a tile that reads each
 * weight once for all its tokens keeps the one-token figure.
 *
 * The prefill table (mode "prefill" only) times whole products as a prefill step makes them: a
 * matrix of PREFILL_ROWS rows of n values against PREFILL_TOKENS tokens, called in tiles of 64
 * rows as the CPU backend calls the kernels, in milliseconds per product (best of several), for
 * the AVX2 table and the best table of this CPU (AVX-512 where it has it). One thread.
 *
 * Usage: bench_vec_dot [n] [milliseconds per measurement] [gemm|one|prefill]   (defaults 4096, 200;
 * with "gemm", only the gemm tables; with "one", only the one-token table; with "prefill", only
 * the prefill table)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "platform.h"

#define N_ROWS 64

static float rnd_val(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / 16777216.0 * 2.0 - 1.0);
}

/* Calls fn on rows round-robin until `ms` milliseconds pass; returns nanoseconds per call. */
static double time_dot(kiri_vec_dot_fn fn, int64_t n, const unsigned char *w, size_t row_bytes,
                       const void *act, double ms, float *sink)
{
    double t0 = kiri_platform_now(), t1;
    long calls = 0;
    float acc = 0;
    do {
        for (int r = 0; r < N_ROWS; r++) {
            float s;
            fn(n, &s, w + (size_t)r * row_bytes, act);
            acc += s;
        }
        calls += N_ROWS;
        t1 = kiri_platform_now();
    } while ((t1 - t0) * 1e3 < ms);
    *sink += acc;
    return (t1 - t0) * 1e9 / (double)calls;
}

/* Calls a gemm tile with nt tokens (activation rows `as` bytes apart) over nr rows (rb bytes
 * each, tile rows per call) until `ms` milliseconds pass; returns the weight bytes consumed per
 * nanosecond (GB/s): each pass reads the rows once for all nt tokens. out holds nt * tile
 * floats. */
static double time_gemm(kiri_gemm_fn fn, int64_t n, const unsigned char *w, size_t rb, int64_t nr,
                        int64_t tile, const void *act, size_t as, int64_t nt, float *out, double ms)
{
    double t0 = kiri_platform_now(), t1;
    double bytes = 0;
    do {
        for (int64_t r = 0; r < nr; r += tile) {
            const int64_t m = nr - r < tile ? nr - r : tile;
            fn(n, w + (size_t)r * rb, rb, act, as, out, (size_t)tile, m, nt);
        }
        bytes += (double)nr * (double)rb;
        t1 = kiri_platform_now();
    } while ((t1 - t0) * 1e3 < ms);
    return bytes / ((t1 - t0) * 1e9);
}

/* The gemm benchmarks' weights: the N_ROWS rows of x quantized to type t into w (the L2 case),
 * and as many copies of them as fit in the `big` bytes of wb (the DRAM case, realistic values).
 * Returns the number of rows in wb. */
static int64_t gemm_rows(int t, const float *x, int64_t n, unsigned char *w, unsigned char *wb, size_t big)
{
    const size_t rb = kiri_row_bytes(t, n);
    for (int r = 0; r < N_ROWS; r++)
        kiri_cpu_quantize_row(t, x + (size_t)r * n, w + (size_t)r * rb, n);
    const int64_t nbig = (int64_t)(big / rb);
    for (int64_t r = 0; r < nbig; r++)
        memcpy(wb + (size_t)r * rb, w + (size_t)(r % N_ROWS) * rb, rb);
    return nbig;
}

static double time_quant(kiri_from_float_fn fn, const float *x, void *dst, int64_t n, double ms)
{
    double t0 = kiri_platform_now(), t1;
    long calls = 0;
    do {
        for (int r = 0; r < 16; r++)
            fn(x, dst, n);
        calls += 16;
        t1 = kiri_platform_now();
    } while ((t1 - t0) * 1e3 < ms);
    return (t1 - t0) * 1e9 / (double)calls;
}

enum { PREFILL_ROWS = 2048, PREFILL_TOKENS = 512, PREFILL_TILE = 64 };

/* Milliseconds of one product of rows x n against PREFILL_TOKENS tokens in tiles of
 * PREFILL_TILE rows, the best of the runs that fit in `ms` (at least three). */
static double time_prefill(kiri_gemm_fn fn, int64_t n, const unsigned char *w, size_t rb, int64_t rows,
                           const void *act, size_t as, float *out, double ms)
{
    double best = 1e30, t_all = kiri_platform_now();
    for (int run = 0; run < 3 || (kiri_platform_now() - t_all) * 1e3 < ms; run++) {
        const double t0 = kiri_platform_now();
        for (int64_t r = 0; r < rows; r += PREFILL_TILE)
            fn(n, w + (size_t)r * rb, rb, act, as, out + r, (size_t)rows, PREFILL_TILE, PREFILL_TOKENS);
        const double t = (kiri_platform_now() - t0) * 1e3;
        best = t < best ? t : best;
    }
    return best;
}

/* The prefill table (see the top of the file). Returns 0 when out of memory. */
static int bench_prefill(int64_t n, double ms, uint32_t features)
{
    struct kiri_cpu_kernels ref, g2, best;
    kiri_cpu_kernels_init_ref(&ref);
    kiri_cpu_kernels_init_ref(&g2);
    kiri_cpu_kernels_init_ref(&best);
#if defined(__x86_64__)
    if (features & KIRI_CPU_AVX2) {
        kiri_cpu_kernels_init_gemm_avx2(&g2);
        kiri_cpu_kernels_init_gemm_avx2(&best);
        const uint32_t vnni = KIRI_CPU_AVX512 | KIRI_CPU_AVX512_VNNI;
        if ((features & vnni) == vnni)
            kiri_cpu_kernels_init_gemm_avx512(&best);
    }
#endif
    const size_t as = (size_t)n * sizeof(float) + 4096; /* > any activation row of n values */
    float *x = malloc((size_t)n * PREFILL_ROWS * sizeof(float));
    unsigned char *w = malloc((size_t)n * PREFILL_ROWS * sizeof(float));
    unsigned char *act = malloc(as * PREFILL_TOKENS);
    float *out = malloc(sizeof(float) * PREFILL_ROWS * PREFILL_TOKENS);
    int ok = x && w && act && out;
    if (!ok)
        fprintf(stderr, "bench_vec_dot: out of memory\n");
    uint64_t seed = 7;
    for (int64_t i = 0; ok && i < n * PREFILL_ROWS; i++)
        x[i] = rnd_val(&seed);
    static const int types[] = {KIRI_TYPE_Q4_0, KIRI_TYPE_Q4_1, KIRI_TYPE_Q5_0, KIRI_TYPE_Q5_1,
                                KIRI_TYPE_Q8_0, KIRI_TYPE_Q4_K, KIRI_TYPE_Q5_K, KIRI_TYPE_Q6_K};
    if (ok)
        printf("%-6s %12s %12s %9s   (prefill: %d rows of %lld against %d tokens, ms per product, 1 thread)\n",
               "gemm", "avx2 ms", "best ms", "speedup", PREFILL_ROWS, (long long)n, PREFILL_TOKENS);
    for (size_t c = 0; ok && c < sizeof types / sizeof types[0]; c++) {
        const int t = types[c], vt = kiri_cpu_vec_dot_type(t);
        if (!g2.gemm[t])
            continue;
        const size_t rb = kiri_row_bytes(t, n);
        for (int64_t r = 0; r < PREFILL_ROWS; r++)
            kiri_cpu_quantize_row(t, x + (size_t)r * (size_t)n, w + (size_t)r * rb, n);
        for (int64_t i = 0; i < PREFILL_TOKENS; i++) /* distinct tokens: rows of x */
            ref.from_float[vt](x + (size_t)i * (size_t)n, act + (size_t)i * as, n);
        const double ta = time_prefill(g2.gemm[t], n, w, rb, PREFILL_ROWS, act, as, out, ms);
        const double tb = time_prefill(best.gemm[t], n, w, rb, PREFILL_ROWS, act, as, out, ms);
        printf("%-6s %12.2f %12.2f %8.2fx%s\n", kiri_type_name(t), ta, tb, ta / tb,
               best.gemm[t] == g2.gemm[t] ? "  (same kernel)" : "");
    }
    free(x);
    free(w);
    free(act);
    free(out);
    return ok;
}

int main(int argc, char **argv)
{
    int64_t n = argc > 1 ? atoll(argv[1]) : 4096;
    double ms = argc > 2 ? atof(argv[2]) : 200.0;
    const int only_one = argc > 3 && strcmp(argv[3], "one") == 0;
    const int only_gemm = only_one || (argc > 3 && strcmp(argv[3], "gemm") == 0);
    const int only_prefill = argc > 3 && strcmp(argv[3], "prefill") == 0;
    if (n <= 0 || n % 256 != 0) {
        fprintf(stderr, "bench_vec_dot: n must be a positive multiple of 256\n");
        return 2;
    }
    struct kiri_cpu_kernels ref, best;
    kiri_cpu_kernels_init_ref(&ref);
    kiri_cpu_kernels_init_ref(&best);
    const uint32_t features = kiri_platform_cpu_features();
#if defined(__x86_64__)
    if (features & KIRI_CPU_AVX2)
        kiri_cpu_kernels_init_avx2(&best);
#endif
    printf("bench_vec_dot: n = %lld, %d rows, %.0f ms per measurement, kernels \"%s\"\n",
           (long long)n, N_ROWS, ms, best.path);

    uint64_t seed = 42;
    float *x = malloc((size_t)n * N_ROWS * sizeof(float));
    unsigned char *w = malloc((size_t)n * N_ROWS * sizeof(float));
    unsigned char *act = malloc((size_t)n * sizeof(float) + 4096);
    if (!x || !w || !act) {
        fprintf(stderr, "bench_vec_dot: out of memory\n");
        return 1;
    }
    for (int64_t i = 0; i < n * N_ROWS; i++)
        x[i] = rnd_val(&seed);

    static const int types[] = {KIRI_TYPE_F32, KIRI_TYPE_F16, KIRI_TYPE_BF16, KIRI_TYPE_Q4_0,
                                KIRI_TYPE_Q4_1, KIRI_TYPE_Q5_0, KIRI_TYPE_Q5_1, KIRI_TYPE_Q8_0,
                                KIRI_TYPE_Q4_K, KIRI_TYPE_Q5_K, KIRI_TYPE_Q6_K};
    float sink = 0;
    if (only_prefill)
        return bench_prefill(n, ms, features) ? 0 : 1;
    printf("%-6s %12s %12s %9s %12s\n", "type", "ref ns/row", "best ns/row", "speedup", "best GB/s");
    for (size_t c = 0; c < (only_gemm ? 0 : sizeof types / sizeof types[0]); c++) {
        const int t = types[c], vt = kiri_cpu_vec_dot_type(t);
        const size_t rb = kiri_row_bytes(t, n);
        for (int r = 0; r < N_ROWS; r++)
            kiri_cpu_quantize_row(t, x + (size_t)r * n, w + (size_t)r * rb, n);
        ref.from_float[vt](x, act, n);
        const double t_ref = time_dot(ref.vec_dot[t], n, w, rb, act, ms, &sink);
        const double t_best = best.vec_dot[t] == ref.vec_dot[t]
                                  ? t_ref
                                  : time_dot(best.vec_dot[t], n, w, rb, act, ms, &sink);
        printf("%-6s %12.1f %12.1f %8.2fx %12.2f%s\n", kiri_type_name(t), t_ref, t_best,
               t_ref / t_best, (double)rb / t_best, best.vec_dot[t] == ref.vec_dot[t] ? "  (no SIMD kernel)" : "");
    }
    printf("\n%-6s %12s %12s %9s\n", "quant", "ref ns/row", "best ns/row", "speedup");
    static const int acts[] = {KIRI_TYPE_Q8_0, KIRI_TYPE_Q8_1, KIRI_TYPE_Q8_K, KIRI_TYPE_F16};
    for (size_t c = 0; c < (only_gemm ? 0 : sizeof acts / sizeof acts[0]); c++) {
        const int t = acts[c];
        const double t_ref = time_quant(ref.from_float[t], x, act, n, ms);
        const double t_best = best.from_float[t] == ref.from_float[t]
                                  ? t_ref
                                  : time_quant(best.from_float[t], x, act, n, ms);
        printf("%-6s %12.1f %12.1f %8.2fx%s\n", kiri_type_name(t), t_ref, t_best, t_ref / t_best,
               best.from_float[t] == ref.from_float[t] ? "  (no SIMD kernel)" : "");
    }

    /* Decode tiles: the L2 case cycles over the 64 rows above; the DRAM case over big rows. */
    struct kiri_cpu_kernels g2, g512;
    kiri_cpu_kernels_init_ref(&g2);
    kiri_cpu_kernels_init_ref(&g512);
#if defined(__x86_64__)
    if (features & KIRI_CPU_AVX2) {
        kiri_cpu_kernels_init_gemm_avx2(&g2);
        kiri_cpu_kernels_init_gemm_avx2(&g512);
        const uint32_t vnni = KIRI_CPU_AVX512 | KIRI_CPU_AVX512_VNNI;
        if ((features & vnni) == vnni)
            kiri_cpu_kernels_init_gemm_avx512(&g512);
    }
#endif
    const size_t big = (size_t)256 << 20;
    unsigned char *wb = malloc(big);
    enum { MAX_NT = 8, TILE = 1024 };
    float *out = malloc(sizeof(float) * MAX_NT * TILE);
    const size_t as = (size_t)n * sizeof(float) + 4096; /* > any activation row of n values */
    unsigned char *tok = malloc(as * MAX_NT);
    if (!wb || !out || !tok) {
        fprintf(stderr, "bench_vec_dot: out of memory\n");
        return 1;
    }
    static const int gtypes[] = {KIRI_TYPE_Q4_0, KIRI_TYPE_Q8_0, KIRI_TYPE_Q4_K, KIRI_TYPE_Q5_K, KIRI_TYPE_Q6_K};
    printf("\n%-6s %14s %14s %14s %14s   (one-token gemm tiles, GB/s of weights, 1 thread)\n", "gemm",
           "avx2 L2", "best L2", "avx2 DRAM", "best DRAM");
    for (size_t c = 0; c < sizeof gtypes / sizeof gtypes[0]; c++) {
        const int t = gtypes[c], vt = kiri_cpu_vec_dot_type(t);
        if (!g2.gemm[t])
            continue;
        const size_t rb = kiri_row_bytes(t, n);
        const int64_t nbig = gemm_rows(t, x, n, w, wb, big);
        ref.from_float[vt](x, act, n);
        const double l2a = time_gemm(g2.gemm[t], n, w, rb, N_ROWS, N_ROWS, act, as, 1, out, ms);
        const double l2b = time_gemm(g512.gemm[t], n, w, rb, N_ROWS, N_ROWS, act, as, 1, out, ms);
        const double dra = time_gemm(g2.gemm[t], n, wb, rb, nbig, TILE, act, as, 1, out, ms);
        const double drb = time_gemm(g512.gemm[t], n, wb, rb, nbig, TILE, act, as, 1, out, ms);
        printf("%-6s %14.2f %14.2f %14.2f %14.2f\n", kiri_type_name(t), l2a, l2b, dra, drb);
    }
    printf("\n%-6s %3s %14s %14s %14s %14s   (small-batch gemm tiles, GB/s of weights, 1 thread)\n", "gemm",
           "nt", "avx2 L2", "best L2", "avx2 DRAM", "best DRAM");
    for (size_t c = 0; c < (only_one ? 0 : sizeof gtypes / sizeof gtypes[0]); c++) {
        const int t = gtypes[c], vt = kiri_cpu_vec_dot_type(t);
        if (!g2.gemm[t])
            continue;
        const size_t rb = kiri_row_bytes(t, n);
        const int64_t nbig = gemm_rows(t, x, n, w, wb, big);
        for (int i = 0; i < MAX_NT; i++) /* distinct tokens: rows of x */
            ref.from_float[vt](x + (size_t)i * (size_t)n, tok + (size_t)i * as, n);
        static const int nts[] = {2, 3, 4, 8};
        for (size_t j = 0; j < sizeof nts / sizeof nts[0]; j++) {
            const int nt = nts[j];
            const double l2a = time_gemm(g2.gemm[t], n, w, rb, N_ROWS, N_ROWS, tok, as, nt, out, ms);
            const double l2b = time_gemm(g512.gemm[t], n, w, rb, N_ROWS, N_ROWS, tok, as, nt, out, ms);
            const double dra = time_gemm(g2.gemm[t], n, wb, rb, nbig, TILE, tok, as, nt, out, ms);
            const double drb = time_gemm(g512.gemm[t], n, wb, rb, nbig, TILE, tok, as, nt, out, ms);
            printf("%-6s %3d %14.2f %14.2f %14.2f %14.2f\n", kiri_type_name(t), nt, l2a, l2b, dra, drb);
        }
    }
    free(tok);
    free(wb);
    free(out);
    if (sink == 12345.678f) /* keeps the results alive */
        printf("%g\n", (double)sink);
    free(x);
    free(w);
    free(act);
    (void)features;
    return 0;
}
