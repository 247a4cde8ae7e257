/* Does OpenBLAS sgemm beat kiri's own quantized matrix products for prompt prefill? For the seven
 * weight matrices of one TinyLlama-1.1B layer (n_embd 2048, n_ff 5632, 4 KV heads of 64: q and o
 * 2048 x 2048, k and v 256 x 2048, gate and up 5632 x 2048, down 2048 x 5632) and prompt batches
 * of 32 to 512 tokens, on 1 and 2 threads, it times:
 *
 *   kiri   the CPU backend running one step of seven MATMUL nodes on the quantized weights
 *          (activations converted to Q8, the register-blocked int8 gemm tiles), as a forward
 *          step does;
 *   blas   what a BLAS path must do without caching F32 copies of the weights (which would break
 *          zero-copy and take 4-8 times the memory): per matrix, dequantize a tile of rows to F32
 *          into a scratch buffer (split over the thread pool) and multiply it with cblas_sgemm
 *          (OpenBLAS, openblas_set_num_threads), dequantization time included;
 *   sgemm  cblas_sgemm alone on F32 weights dequantized beforehand: the best case for BLAS, as if
 *          F32 weights cost nothing.
 *
 * Figures are GFLOP/s of the whole layer (2 * tokens * rows * k per matrix), the best of several
 * repetitions (the machine is shared). The kiri and blas outputs are compared (relative L2 error)
 * so both did the same work; they differ by the Q8 rounding of the activations only.
 *
 * Usage: bench_blas [repetitions] [tile rows] [threads] [avx2]   (defaults 3, 256, and 0: both 1
 * and 2; "avx2" hides AVX-512 and VNNI from kiri, as on an AVX2-only CPU; a tile of 8192 rows is
 * the whole matrix) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cblas.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "platform.h"
#include "backend.h"
#include "threadpool.h"

extern const struct kiri_backend_iface kiri_cpu_backend_iface;

enum { N_MAT = 7, MAX_REPS = 50 };

struct mat {
    const char *name;
    int64_t rows, k;
    int input;      /* which activation matrix feeds it: 0 attn, 1 attn out, 2 ffn, 3 ffn down */
};

static const struct mat mats[N_MAT] = {
    {"attn_q", 2048, 2048, 0}, {"attn_k", 256, 2048, 0}, {"attn_v", 256, 2048, 0},
    {"attn_output", 2048, 2048, 1}, {"ffn_gate", 5632, 2048, 2}, {"ffn_up", 5632, 2048, 2},
    {"ffn_down", 2048, 5632, 3},
};
static const int64_t input_k[4] = {2048, 2048, 2048, 5632};

static float rnd_val(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 40) / 16777216.0 * 2.0 - 1.0);
}

static void *xmalloc(size_t n)
{
    void *p = aligned_alloc(64, (n + 63) / 64 * 64);
    if (!p) {
        fprintf(stderr, "bench_blas: out of memory (%zu bytes)\n", n);
        exit(1);
    }
    return p;
}

/* ---- the BLAS path: dequantize a tile of rows over the pool, then sgemm ---- */

struct deq_job {
    int type;
    const unsigned char *w; /* first row of the tile */
    size_t rb;
    int64_t rows, k;
    float *out;
};

static void deq_worker(void *arg, int ith, int nth)
{
    const struct deq_job *j = arg;
    const int64_t r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth;
    for (int64_t r = r0; r < r1; r++)
        kiri_cpu_dequantize_row(j->type, j->w + (size_t)r * j->rb, j->out + (size_t)r * (size_t)j->k, j->k);
}

/* y (nt x rows, row stride rows) = x (nt x k) times w^T, w quantized, through F32 tiles. */
static void blas_matmul(struct kiri_threadpool *tp, int type, const unsigned char *w, int64_t rows,
                        int64_t k, const float *x, int64_t nt, float *y, float *scratch, int64_t tile)
{
    const size_t rb = kiri_row_bytes(type, k);
    for (int64_t r = 0; r < rows; r += tile) {
        const int64_t m = rows - r < tile ? rows - r : tile;
        struct deq_job j = {type, w + (size_t)r * rb, rb, m, k, scratch};
        kiri_threadpool_run(tp, deq_worker, &j);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nt, (int)m, (int)k, 1.0f, x, (int)k,
                    scratch, (int)k, 0.0f, y + r, (int)rows);
    }
}

/* ---- helpers ---- */

static double layer_flops(int64_t nt)
{
    double f = 0;
    for (int i = 0; i < N_MAT; i++)
        f += 2.0 * (double)nt * (double)mats[i].rows * (double)mats[i].k;
    return f;
}

/* Relative L2 distance of a from b over n values. */
static double rel_err(const float *a, const float *b, size_t n)
{
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        s += (double)b[i] * b[i];
    }
    return s > 0 ? sqrt(d / s) : sqrt(d);
}

static void tensor2(struct kiri_tensor *t, int type, void *data, int64_t ne0, int64_t ne1)
{
    memset(t, 0, sizeof *t);
    t->type = type;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = t->ne[3] = 1;
    t->nb[0] = kiri_type_size(type);
    t->nb[1] = kiri_row_bytes(type, ne0);
    t->nb[2] = t->nb[3] = t->nb[1] * (size_t)ne1;
    t->data = data;
}

int main(int argc, char **argv)
{
    const int reps = argc > 1 ? atoi(argv[1]) : 3;
    const int64_t tile = argc > 2 ? atoll(argv[2]) : 256;
    const int only_th = argc > 3 ? atoi(argv[3]) : 0;
    const int avx2_only = argc > 4 && strcmp(argv[4], "avx2") == 0;
    if (reps < 1 || reps > MAX_REPS || tile < 1 || tile > 8192 || only_th < 0 || only_th > 2 ||
        (argc > 4 && !avx2_only)) {
        fprintf(stderr, "usage: bench_blas [repetitions 1..%d] [tile rows 1..8192] [threads 1|2, 0: both] [avx2]\n",
                MAX_REPS);
        return 2;
    }
    static const int types[] = {KIRI_TYPE_Q4_0, KIRI_TYPE_Q8_0, KIRI_TYPE_Q4_K};
    static const int64_t nts[] = {32, 64, 128, 256, 512};
    static const int threads[] = {1, 2};
    enum { N_TYPES = 3, N_NT = 5, N_TH = 2 };
    const int64_t max_nt = 512;

    /* Random F32 weights; each type is quantized from them. */
    uint64_t seed = 42;
    float *wf[N_MAT];
    for (int i = 0; i < N_MAT; i++) {
        const size_t n = (size_t)(mats[i].rows * mats[i].k);
        wf[i] = xmalloc(n * sizeof(float));
        for (size_t e = 0; e < n; e++)
            wf[i][e] = rnd_val(&seed) * 0.05f;
    }
    float *xin[4], *yk[N_MAT], *yb[N_MAT];
    for (int i = 0; i < 4; i++) {
        const size_t n = (size_t)(max_nt * input_k[i]);
        xin[i] = xmalloc(n * sizeof(float));
        for (size_t e = 0; e < n; e++)
            xin[i][e] = rnd_val(&seed);
    }
    for (int i = 0; i < N_MAT; i++) {
        yk[i] = xmalloc((size_t)(max_nt * mats[i].rows) * sizeof(float));
        yb[i] = xmalloc((size_t)(max_nt * mats[i].rows) * sizeof(float));
    }
    float *scratch = xmalloc((size_t)tile * 5632 * sizeof(float));
    float *wdeq[N_MAT]; /* the dequantized weights of the current type, for the sgemm-only case */
    unsigned char *wq[N_MAT];
    for (int i = 0; i < N_MAT; i++) {
        wdeq[i] = xmalloc((size_t)(mats[i].rows * mats[i].k) * sizeof(float));
        wq[i] = xmalloc((size_t)mats[i].rows * kiri_row_bytes(KIRI_TYPE_Q8_0, mats[i].k)); /* largest */
    }

    uint32_t features = kiri_platform_cpu_features();
    if (avx2_only) /* kiri as on an x86 box without AVX-512 / VNNI */
        features &= ~(uint32_t)(KIRI_CPU_AVX512 | KIRI_CPU_AVX512_VNNI | KIRI_CPU_AVX_VNNI);
    printf("bench_blas: TinyLlama-1.1B layer (7 matrices, %.1f M weights), best of %d, BLAS tile %lld rows\n",
           layer_flops(1) / 2e6, reps, (long long)tile);
    printf("OpenBLAS: %s, core %s\n", openblas_get_config(), openblas_get_corename());
    if (getenv("OPENBLAS_CORETYPE")) /* read by OpenBLAS at load: it overrides the CPU's detection */
        printf("note: OPENBLAS_CORETYPE=%s in the environment picks OpenBLAS's kernels\n",
               getenv("OPENBLAS_CORETYPE"));
    printf("%-5s %2s %4s %10s %10s %10s %8s %8s %7s %9s\n", "type", "th", "nt", "kiri", "blas+deq",
           "sgemm", "blas/k", "sgemm/k", "deq %", "rel.err");

    double worst_err = 0;
    for (int ti = 0; ti < N_TYPES; ti++) {
        const int type = types[ti];
        for (int i = 0; i < N_MAT; i++) {
            const size_t rb = kiri_row_bytes(type, mats[i].k);
            for (int64_t r = 0; r < mats[i].rows; r++)
                kiri_cpu_quantize_row(type, wf[i] + (size_t)(r * mats[i].k), wq[i] + (size_t)r * rb, mats[i].k);
            kiri_cpu_dequantize_row(type, wq[i], wdeq[i], mats[i].rows * mats[i].k);
        }
        for (int hi = 0; hi < N_TH; hi++) {
            const int nth = threads[hi];
            if (only_th && nth != only_th)
                continue;
            struct kiri_threadpool *tp;
            struct kiri_backend *be;
            struct kiri_backend_config cfg;
            char msg[128];
            memset(&cfg, 0, sizeof cfg);
            cfg.cpu_features = features;
            if (kiri_threadpool_init(nth, &tp) != 0) {
                fprintf(stderr, "bench_blas: cannot start %d threads\n", nth);
                return 1;
            }
            kiri_threadpool_as_threads(tp, &cfg.threads);
            if (kiri_cpu_backend_iface.init(&cfg, &be, msg, sizeof msg) != 0) {
                fprintf(stderr, "bench_blas: CPU backend: %s\n", msg);
                return 1;
            }
            if (ti == 0 && (hi == 0 || only_th)) {
                char path[64];
                kiri_cpu_backend_iface.describe(be, path, sizeof path);
                printf("(kiri kernels \"%s\"; GFLOP/s of the layer; blas/k and sgemm/k: speed over kiri's)\n", path);
            }
            openblas_set_num_threads(nth);
            for (int ni = 0; ni < N_NT; ni++) {
                const int64_t nt = nts[ni];
                struct kiri_tensor tw[N_MAT], tx[4], ty[N_MAT];
                struct kiri_node nodes[N_MAT];
                for (int i = 0; i < 4; i++)
                    tensor2(&tx[i], KIRI_TYPE_F32, xin[i], input_k[i], nt);
                for (int i = 0; i < N_MAT; i++) {
                    tensor2(&tw[i], type, wq[i], mats[i].k, mats[i].rows);
                    tensor2(&ty[i], KIRI_TYPE_F32, yk[i], mats[i].rows, nt);
                    memset(&nodes[i], 0, sizeof nodes[i]);
                    nodes[i].op = KIRI_OP_MATMUL;
                    nodes[i].dst = &ty[i];
                    nodes[i].src[0] = &tw[i];
                    nodes[i].src[1] = &tx[mats[i].input];
                }
                double best_k = 1e30, best_b = 1e30, best_s = 1e30, best_d = 1e30;
                for (int rep = 0; rep < reps; rep++) {
                    double t0 = kiri_platform_now();
                    if (kiri_cpu_backend_iface.compute(be, nodes, N_MAT) != 0) {
                        fprintf(stderr, "bench_blas: compute failed\n");
                        return 1;
                    }
                    double t1 = kiri_platform_now();
                    best_k = t1 - t0 < best_k ? t1 - t0 : best_k;

                    t0 = kiri_platform_now(); /* the dequantization share of the blas path */
                    for (int i = 0; i < N_MAT; i++) {
                        const size_t rb = kiri_row_bytes(type, mats[i].k);
                        for (int64_t r = 0; r < mats[i].rows; r += tile) {
                            const int64_t m = mats[i].rows - r < tile ? mats[i].rows - r : tile;
                            struct deq_job j = {type, wq[i] + (size_t)r * rb, rb, m, mats[i].k, scratch};
                            kiri_threadpool_run(tp, deq_worker, &j);
                        }
                    }
                    t1 = kiri_platform_now();
                    best_d = t1 - t0 < best_d ? t1 - t0 : best_d;

                    t0 = kiri_platform_now();
                    for (int i = 0; i < N_MAT; i++)
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)nt, (int)mats[i].rows,
                                    (int)mats[i].k, 1.0f, xin[mats[i].input], (int)mats[i].k, wdeq[i],
                                    (int)mats[i].k, 0.0f, yb[i], (int)mats[i].rows);
                    t1 = kiri_platform_now();
                    best_s = t1 - t0 < best_s ? t1 - t0 : best_s;

                    t0 = kiri_platform_now();
                    for (int i = 0; i < N_MAT; i++)
                        blas_matmul(tp, type, wq[i], mats[i].rows, mats[i].k, xin[mats[i].input], nt,
                                    yb[i], scratch, tile);
                    t1 = kiri_platform_now();
                    best_b = t1 - t0 < best_b ? t1 - t0 : best_b;
                }
                /* yb holds the tiled blas path's result (it ran last). */
                double err = 0;
                for (int i = 0; i < N_MAT; i++) {
                    const double e = rel_err(yk[i], yb[i], (size_t)(nt * mats[i].rows));
                    err = e > err ? e : err;
                }
                worst_err = err > worst_err ? err : worst_err;
                const double f = layer_flops(nt) / 1e9;
                printf("%-5s %2d %4lld %10.1f %10.1f %10.1f %7.2fx %7.2fx %6.0f%% %9.2e%s\n",
                       kiri_type_name(type), nth, (long long)nt, f / best_k, f / best_b, f / best_s,
                       best_k / best_b, best_k / best_s, 100.0 * best_d / best_b, err,
                       err > 0.02 ? "  MISMATCH" : "");
                fflush(stdout);
            }
            kiri_cpu_backend_iface.free(be);
            kiri_threadpool_free(tp);
        }
    }
    printf("worst relative error kiri vs BLAS: %.2e (Q8 activations vs F32)\n", worst_err);
    for (int i = 0; i < N_MAT; i++) {
        free(wf[i]);
        free(yk[i]);
        free(yb[i]);
        free(wdeq[i]);
        free(wq[i]);
    }
    for (int i = 0; i < 4; i++)
        free(xin[i]);
    free(scratch);
    return worst_err > 0.02 ? 1 : 0;
}
