/* The CPU backend's operations against straightforward double-precision formulas written here,
 * on random inputs: RMS norm, SwiGLU, RoPE (both layouts, frequency factors), attention through
 * block tables (F32, F16 and Q8_0 caches, GQA), products of every weight type through the backend
 * with 1 and 3 worker threads, and the thread pool itself. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "backend.h"
#include "test.h"
#include "threadpool.h"

extern const struct kiri_backend_iface kiri_cpu_backend_iface;

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand() * scale;
}

static void tensor2(struct kiri_tensor *t, int type, void *data, int64_t ne0, int64_t ne1)
{
    memset(t, 0, sizeof *t);
    t->type = type;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = t->ne[3] = 1;
    t->nb[0] = kiri_type_size(type);
    t->nb[1] = (size_t)(ne0 / kiri_type_block_size(type)) * kiri_type_size(type);
    t->nb[2] = t->nb[3] = t->nb[1] * (size_t)ne1;
    t->data = data;
}

/* ---- row kernels ---- */

static void test_rms_norm(void)
{
    float x[300], w[300], y[300];
    fill(x, 300, 3.0f);
    fill(w, 300, 1.0f);
    kiri_cpu_rms_norm_row(x, w, y, 300, 1e-5f);
    double ss = 0;
    for (int i = 0; i < 300; i++)
        ss += (double)x[i] * x[i];
    const double s = 1.0 / sqrt(ss / 300 + 1e-5);
    for (int i = 0; i < 300; i += 7)
        CHECK_NEAR(y[i], x[i] * s * w[i], 1e-5);
}

static void test_swiglu(void)
{
    float g[64], u[64], y[64];
    fill(g, 64, 8.0f);
    fill(u, 64, 2.0f);
    kiri_cpu_swiglu_row(g, u, y, 64);
    for (int i = 0; i < 64; i++)
        CHECK_NEAR(y[i], g[i] / (1.0 + exp(-(double)g[i])) * u[i], 1e-5);
}

static void test_rope(void)
{
    enum { D = 64, H = 3 };
    float x[D * H], y[D * H], ff[D / 2];
    for (int i = 0; i < D / 2; i++)
        ff[i] = 1.0f + (float)i / 8.0f;
    for (int mode = 0; mode <= 2; mode += 2) {
        for (int use_ff = 0; use_ff < 2; use_ff++) {
            fill(x, D * H, 1.0f);
            memcpy(y, x, sizeof x);
            const struct kiri_rope_params p = {mode, 48, 10000.0f, 0.5f, 1.0f};
            const int32_t pos = 37;
            kiri_cpu_rope_token(y, H, D, pos, &p, use_ff ? ff : NULL);
            for (int h = 0; h < H; h++) {
                const float *a = x + h * D, *b = y + h * D;
                for (int i = 0; i < p.n_rot / 2; i++) {
                    const double theta = pos * pow(10000.0, -2.0 * i / p.n_rot) / (use_ff ? ff[i] : 1.0) * 0.5;
                    const int i0 = mode == KIRI_ROPE_NEOX ? i : 2 * i;
                    const int i1 = mode == KIRI_ROPE_NEOX ? i + p.n_rot / 2 : 2 * i + 1;
                    CHECK_NEAR(b[i0], a[i0] * cos(theta) - a[i1] * sin(theta), 2e-4);
                    CHECK_NEAR(b[i1], a[i0] * sin(theta) + a[i1] * cos(theta), 2e-4);
                }
                for (int i = p.n_rot; i < D; i++) /* dimensions past n_rot are untouched */
                    CHECK_NEAR(b[i], a[i], 0);
            }
        }
    }
}

/* ---- backend steps ---- */

struct env {
    struct kiri_threadpool *tp;
    struct kiri_threads threads;
    struct kiri_backend *be;
};

static int env_init(struct env *e, int n_threads)
{
    if (kiri_threadpool_init(n_threads, &e->tp) != 0)
        return -1;
    kiri_threadpool_as_threads(e->tp, &e->threads);
    struct kiri_backend_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.threads = e->threads;
    char msg[64];
    return kiri_cpu_backend_iface.init(&cfg, &e->be, msg, sizeof msg);
}

static void env_free(struct env *e)
{
    kiri_cpu_backend_iface.free(e->be);
    kiri_threadpool_free(e->tp);
}

/* Attention through a scrambled block table against a dense double-precision computation. */
static void attention_case(int kv_type, int n_threads)
{
    enum { D = 64, H = 4, HKV = 2, BS = 4, NBLK = 8, NTOK = 3 };
    const int slots = BS * NBLK;
    float kf[slots][D * HKV], vf[slots][D * HKV], q[NTOK][H][D], out[NTOK][H * D];
    fill(&kf[0][0], sizeof kf / 4, 1.0f);
    fill(&vf[0][0], sizeof vf / 4, 1.0f);
    fill(&q[0][0][0], sizeof q / 4, 1.0f);
    const size_t row = (size_t)(D * HKV / kiri_type_block_size(kv_type)) * kiri_type_size(kv_type);
    char *kc = calloc((size_t)slots, row), *vc = calloc((size_t)slots, row);
    struct kiri_cpu_kernels k;
    kiri_cpu_kernels_init_ref(&k);
    for (int s = 0; s < slots; s++) {
        if (kv_type == KIRI_TYPE_F32) {
            memcpy(kc + s * row, kf[s], row);
            memcpy(vc + s * row, vf[s], row);
        } else {
            k.from_float[kv_type](kf[s], kc + s * row, D * HKV);
            k.from_float[kv_type](vf[s], vc + s * row, D * HKV);
            /* The reference reads the same rounded values the kernel reads. */
            kiri_cpu_dequantize_row(kv_type, kc + s * row, kf[s], D * HKV);
            kiri_cpu_dequantize_row(kv_type, vc + s * row, vf[s], D * HKV);
        }
    }
    /* Two sequences: tokens 0 and 1 belong to one (table {5, 2, 7}), token 2 to another ({3, 0}). */
    const int32_t tables[5] = {5, 2, 7, 3, 0};
    const int32_t meta[NTOK * 2] = {10, 0, 11, 0, 6, 3};
    struct kiri_tensor tq, tk, tv, tm, tt, to;
    tensor2(&tq, KIRI_TYPE_F32, q, D, H);
    tq.ne[2] = NTOK;
    tq.nb[2] = tq.nb[1] * H;
    tq.nb[3] = tq.nb[2] * NTOK;
    tensor2(&tk, kv_type, kc, D * HKV, slots);
    tensor2(&tv, kv_type, vc, D * HKV, slots);
    tensor2(&tm, KIRI_TYPE_I32, (void *)meta, 2, NTOK);
    tensor2(&tt, KIRI_TYPE_I32, (void *)tables, 5, 1);
    tensor2(&to, KIRI_TYPE_F32, out, D * H, NTOK);
    struct kiri_node nd = {.op = KIRI_OP_ATTENTION, .dst = &to, .src = {&tq, &tk, &tv, &tm, &tt}};
    nd.p.attn = (struct kiri_attn_params){H, HKV, D, BS, 0.125f, 0};
    struct env e;
    CHECK_EQ_INT(env_init(&e, n_threads), 0);
    CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);
    env_free(&e);

    double worst = 0;
    for (int t = 0; t < NTOK; t++) {
        const int32_t *table = tables + meta[2 * t + 1];
        const int n_kv = meta[2 * t];
        for (int h = 0; h < H; h++) {
            const int hk = h / (H / HKV);
            double sc[16], mx = -1e300, sum = 0;
            for (int j = 0; j < n_kv; j++) {
                const int s = table[j / BS] * BS + j % BS;
                double d = 0;
                for (int i = 0; i < D; i++)
                    d += (double)q[t][h][i] * kf[s][hk * D + i];
                sc[j] = d * 0.125;
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j < n_kv; j++)
                sum += (sc[j] = exp(sc[j] - mx));
            for (int i = 0; i < D; i++) {
                double o = 0;
                for (int j = 0; j < n_kv; j++) {
                    const int s = table[j / BS] * BS + j % BS;
                    o += sc[j] / sum * vf[s][hk * D + i];
                }
                const double err = fabs(o - out[t][h * D + i]);
                worst = err > worst ? err : worst;
            }
        }
    }
    /* Reduced-precision caches also round the query and the weights to F16 (as the common
     * reference does), which costs about 1e-3 here. */
    CHECK_NEAR(worst, 0, kv_type == KIRI_TYPE_F32 ? 1e-5 : 3e-3);
    free(kc);
    free(vc);
}

static void test_attention(void)
{
    attention_case(KIRI_TYPE_F32, 1);
    attention_case(KIRI_TYPE_F16, 3);
    attention_case(KIRI_TYPE_Q8_0, 2);
}

/* A product through the backend equals the dot products of dequantized weights with the
 * activations, for every weight type, within the rounding of the activation type. */
static void test_matmul_types(void)
{
    static const int types[] = {KIRI_TYPE_F32, KIRI_TYPE_F16, KIRI_TYPE_BF16, KIRI_TYPE_Q4_0, KIRI_TYPE_Q4_1,
                                KIRI_TYPE_Q5_0, KIRI_TYPE_Q5_1, KIRI_TYPE_Q8_0, KIRI_TYPE_Q4_K,
                                KIRI_TYPE_Q5_K, KIRI_TYPE_Q6_K};
    enum { K = 512, O = 37, N = 5 };
    float *wf = malloc(sizeof(float) * K * O), *wd = malloc(sizeof(float) * K * O);
    float x[N][K], y[N][O];
    void *wq = malloc(sizeof(float) * K * O);
    fill(wf, (size_t)K * O, 0.5f);
    fill(&x[0][0], sizeof x / 4, 1.0f);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int type = types[ti];
        const size_t row = (size_t)(K / kiri_type_block_size(type)) * kiri_type_size(type);
        for (int o = 0; o < O; o++) {
            CHECK_EQ_INT(kiri_cpu_quantize_row(type, wf + o * K, (char *)wq + o * row, K), row);
            kiri_cpu_dequantize_row(type, (char *)wq + o * row, wd + o * K, K);
        }
        struct kiri_tensor tw, tx, ty;
        tensor2(&tw, type, wq, K, O);
        tensor2(&tx, KIRI_TYPE_F32, x, K, N);
        tensor2(&ty, KIRI_TYPE_F32, y, O, N);
        struct kiri_node nd = {.op = KIRI_OP_MATMUL, .dst = &ty, .src = {&tw, &tx}};
        for (int nt = 1; nt <= 3; nt += 2) {
            struct env e;
            CHECK_EQ_INT(env_init(&e, nt), 0);
            CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
            memset(y, 0, sizeof y);
            CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);
            env_free(&e);
            double worst = 0, mag = 0;
            for (int t = 0; t < N; t++)
                for (int o = 0; o < O; o++) {
                    double d = 0;
                    for (int i = 0; i < K; i++)
                        d += (double)wd[o * K + i] * x[t][i];
                    worst = fmax(worst, fabs(d - y[t][o]));
                    mag = fmax(mag, fabs(d));
                }
            /* Activations are rounded to 8 bits for quantized weights, F16/BF16 for those. */
            const double tol = type == KIRI_TYPE_F32 ? 1e-4 : type == KIRI_TYPE_BF16 ? 0.05 : 0.03 * mag;
            if (worst > tol)
                fprintf(stderr, "matmul %s threads %d: worst %.3g (magnitude %.3g)\n", kiri_type_name(type), nt,
                        worst, mag);
            CHECK(worst <= tol);
        }
    }
    free(wf);
    free(wd);
    free(wq);
}

/* Every worker of a pool runs the function once per run, and the barrier orders phases. */
struct pool_job {
    int counts[8];
    int phase_ok;
    struct kiri_threadpool *tp;
    int flags[8];
};

static void pool_fn(void *arg, int ith, int nth)
{
    struct pool_job *j = arg;
    j->counts[ith]++;
    j->flags[ith] = 1;
    kiri_threadpool_barrier(j->tp);
    for (int i = 0; i < nth; i++)
        if (!j->flags[i])
            j->phase_ok = 0;
    kiri_threadpool_barrier(j->tp);
    j->flags[ith] = 0;
    kiri_threadpool_barrier(j->tp);
}

static void test_threadpool(void)
{
    for (int n = 1; n <= 4; n++) {
        struct pool_job j;
        memset(&j, 0, sizeof j);
        j.phase_ok = 1;
        CHECK_EQ_INT(kiri_threadpool_init(n, &j.tp), 0);
        for (int r = 0; r < 200; r++)
            kiri_threadpool_run(j.tp, pool_fn, &j);
        for (int i = 0; i < n; i++)
            CHECK_EQ_INT(j.counts[i], 200);
        CHECK(j.phase_ok);
        kiri_threadpool_free(j.tp);
    }
}

TEST_MAIN(test_rms_norm, test_swiglu, test_rope, test_attention, test_matmul_types, test_threadpool)
