/* The CPU backend's operations against straightforward double-precision formulas written here,
 * on random inputs: RMS norm, SwiGLU, GeGLU, scaling and soft-capping (also through the backend,
 * in place), RoPE (both layouts, partial rotation, frequency factors, the magnitude factor),
 * attention through block tables (F32, F16 and Q8_0 caches, GQA) with and without a sliding
 * window, the short convolution with per-sequence state (and qwen35's with SiLU), the sigmoid
 * gate, the Gated DeltaNet gates and delta rule with per-sequence state, products of every weight type through
 * the backend with 1 and 3 worker threads, and the thread pool itself. Backend steps run on the reference kernels and on the kernels this CPU
 * offers (AVX2, NEON). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "backend.h"
#include "platform.h"
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

/* gelu by its tanh formula, in double. Where 1 + tanh(z) would cancel (z < 0) the same value as
 * 2 / (1 + e^-2z) - with 1 + tanh z = 2 e^2z / (1 + e^2z) - so the reference keeps its relative
 * precision down to the smallest floats. */
#define PI 3.14159265358979323846

static double gelu_ref(double x)
{
    const double z = sqrt(2.0 / PI) * (x + 0.044715 * x * x * x);
    if (z >= 0)
        return 0.5 * x * (1.0 + tanh(z));
    return x * exp(2.0 * z) / (1.0 + exp(2.0 * z));
}

/* The error a float evaluation of gelu at x may make: a few ulp of the result, plus the ulp of
 * z = sqrt(2/pi) (x + 0.044715 x^3) carried into e^-2z, which is |2z| times as large relative to
 * it (this is the function's own condition number: below x = -3 a float gelu cannot do better).
 * Results below the smallest normal float may flush to 0. */
static double gelu_tol(double x, double u)
{
    const double z2 = fabs(2.0 * sqrt(2.0 / PI) * (x + 0.044715 * x * x * x));
    const double want = fabs(gelu_ref(x) * u);
    return want * (1e-6 + (x < 0 ? z2 * 1.8e-7 : 0.0)) + 1e-37;
}

/* GeGLU against the double formula: relative 1e-6 where x >= -3 (the whole range where the tanh
 * formula is well conditioned), the conditioned bound of gelu_tol below; in place too. */
static void test_geglu(void)
{
    enum { N = 4001 };
    float *g = malloc(N * sizeof *g), *u = malloc(N * sizeof *u), *y = malloc(N * sizeof *y);
    for (int i = 0; i < N; i++) {
        g[i] = i < 3001 ? -15.0f + 30.0f * (float)i / 3000.0f : frand() * 4.0f;
        u[i] = i % 3 ? frand() * 2.0f : 1.0f;
    }
    kiri_cpu_geglu_row(g, u, y, N);
    double worst_well = 0, worst_all = 0;
    int bad = 0;
    for (int i = 0; i < N; i++) {
        const double want = gelu_ref(g[i]) * u[i];
        const double rel = want != 0 ? fabs(y[i] - want) / fabs(want) : fabs((double)y[i]);
        if (g[i] >= -3.0f && fabs(want) > 1e-30)
            worst_well = fmax(worst_well, rel);
        if (fabs(want) > 1e-30)
            worst_all = fmax(worst_all, rel);
        const double tol = g[i] >= -3.0f ? 1e-6 * fabs(want) + 1e-37 : gelu_tol(g[i], u[i]);
        if (!(fabs(y[i] - want) <= tol) && bad++ < 5) {
            fprintf(stderr, "  geglu x %.9g u %.9g\n", (double)g[i], (double)u[i]);
            CHECK_NEAR(y[i], want, tol);
        }
    }
    fprintf(stderr, "geglu: worst relative error %.2g for x >= -3, %.2g over [-15, 15]\n", worst_well, worst_all);
    CHECK(bad == 0);
    /* In place, over the gate and over the up values. */
    float a[37], b[37], c[37];
    fill(a, 37, 6.0f);
    fill(b, 37, 1.0f);
    kiri_cpu_geglu_row(a, b, c, 37);
    float a2[37], b2[37];
    memcpy(a2, a, sizeof a);
    memcpy(b2, b, sizeof b);
    kiri_cpu_geglu_row(a2, b, a2, 37);
    kiri_cpu_geglu_row(a, b2, b2, 37);
    CHECK(memcmp(a2, c, sizeof c) == 0);
    CHECK(memcmp(b2, c, sizeof c) == 0);
    free(g);
    free(u);
    free(y);
}

static void test_scale_softcap(void)
{
    enum { N = 300 };
    float x[N], y[N];
    fill(x, N, 40.0f);
    x[0] = 0.0f;
    x[1] = -1e-30f;
    x[2] = 1e4f;
    kiri_cpu_scale_row(x, y, N, 0.0625f * 3.0f);
    for (int i = 0; i < N; i++) /* one rounding of the exact product */
        CHECK(y[i] == (float)((double)x[i] * (0.0625 * 3.0)));
    for (int ci = 0; ci < 3; ci++) {
        const float cap = ci == 0 ? 30.0f : ci == 1 ? 50.0f : 0.5f;
        kiri_cpu_softcap_row(x, y, N, cap);
        for (int i = 0; i < N; i++) {
            const double want = cap * tanh((double)x[i] / cap);
            CHECK_NEAR(y[i], want, 4e-7 * fabs(want) + 1e-45);
        }
        memcpy(y, x, sizeof x);
        kiri_cpu_softcap_row(y, y, N, cap); /* in place */
        for (int i = 0; i < N; i++)
            CHECK_NEAR(y[i], cap * tanh((double)x[i] / cap), 4e-7 * fabs(cap * tanh((double)x[i] / cap)) + 1e-45);
    }
}

static void test_rope(void)
{
    enum { D = 64, H = 3 };
    float x[D * H], y[D * H], ff[D / 2];
    for (int i = 0; i < D / 2; i++)
        ff[i] = 1.0f + (float)i / 8.0f;
    /* Partial (48 of 64) and full rotation, with and without a magnitude factor (which scales
     * the rotated dimensions only). */
    for (int variant = 0; variant < 8; variant++) {
        const int mode = variant & 1 ? KIRI_ROPE_NEOX : KIRI_ROPE_NORMAL, use_ff = (variant >> 1) & 1;
        const int n_rot = variant & 4 ? 48 : 64;
        const float attn_factor = use_ff ? 1.1902380714238083f : variant & 4 ? 1.0f : 0.75f;
        {
            fill(x, D * H, 1.0f);
            memcpy(y, x, sizeof x);
            const struct kiri_rope_params p = {mode, n_rot, 10000.0f, 0.5f, attn_factor};
            const int32_t pos = 37;
            kiri_cpu_rope_token(y, H, D, pos, &p, use_ff ? ff : NULL);
            for (int h = 0; h < H; h++) {
                const float *a = x + h * D, *b = y + h * D;
                for (int i = 0; i < p.n_rot / 2; i++) {
                    const double theta = pos * pow(10000.0, -2.0 * i / p.n_rot) / (use_ff ? ff[i] : 1.0) * 0.5;
                    const int i0 = mode == KIRI_ROPE_NEOX ? i : 2 * i;
                    const int i1 = mode == KIRI_ROPE_NEOX ? i + p.n_rot / 2 : 2 * i + 1;
                    const double c = cos(theta) * attn_factor, sn = sin(theta) * attn_factor;
                    CHECK_NEAR(b[i0], a[i0] * c - a[i1] * sn, 2e-4);
                    CHECK_NEAR(b[i1], a[i0] * sn + a[i1] * c, 2e-4);
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

/* A backend on n_threads workers with the kernels of cpu_features (0: the reference kernels). */
static int env_init_features(struct env *e, int n_threads, uint32_t cpu_features)
{
    if (kiri_threadpool_init(n_threads, &e->tp) != 0)
        return -1;
    kiri_threadpool_as_threads(e->tp, &e->threads);
    struct kiri_backend_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.threads = e->threads;
    cfg.cpu_features = cpu_features;
    char msg[64];
    return kiri_cpu_backend_iface.init(&cfg, &e->be, msg, sizeof msg);
}

static int env_init(struct env *e, int n_threads)
{
    return env_init_features(e, n_threads, 0);
}

static void env_free(struct env *e)
{
    kiri_cpu_backend_iface.free(e->be);
    kiri_threadpool_free(e->tp);
}

/* An attention node over n_tok tokens' queries q (head_dim, n_head, n_tok), caches kc and vc of
 * kv_type (head_dim * n_head_kv, slots), metadata meta (2, n_tok), block tables (n_tables) and the
 * output out (head_dim * n_head, n_tok); the tensors live in a. */
struct attn_tensors {
    struct kiri_tensor q, k, v, meta, tables, out;
};

static void attention_node(struct kiri_node *nd, struct attn_tensors *a, int kv_type, float *q, int n_tok,
                           void *kc, void *vc, int slots, const int32_t *meta, const int32_t *tables, int n_tables,
                           float *out, struct kiri_attn_params p)
{
    tensor2(&a->q, KIRI_TYPE_F32, q, p.head_dim, p.n_head);
    a->q.ne[2] = n_tok;
    a->q.nb[2] = a->q.nb[1] * (size_t)p.n_head;
    a->q.nb[3] = a->q.nb[2] * (size_t)n_tok;
    tensor2(&a->k, kv_type, kc, (int64_t)p.head_dim * p.n_head_kv, slots);
    tensor2(&a->v, kv_type, vc, (int64_t)p.head_dim * p.n_head_kv, slots);
    tensor2(&a->meta, KIRI_TYPE_I32, (void *)meta, 2, n_tok);
    tensor2(&a->tables, KIRI_TYPE_I32, (void *)tables, n_tables, 1);
    tensor2(&a->out, KIRI_TYPE_F32, out, (int64_t)p.head_dim * p.n_head, n_tok);
    memset(nd, 0, sizeof *nd);
    nd->op = KIRI_OP_ATTENTION;
    nd->dst = &a->out;
    nd->src[0] = &a->q;
    nd->src[1] = &a->k;
    nd->src[2] = &a->v;
    nd->src[3] = &a->meta;
    nd->src[4] = &a->tables;
    nd->p.attn = p;
}

/* The largest error of one token's attention output (n_head heads of head_dim, row-major) against
 * the double-precision formula over its keys [lo, n): key j in slot table[j / bs] * bs + j % bs of
 * the dequantized caches kf and vf (rows of head_dim * n_head_kv floats). */
static double attention_formula_error(const float *q, const float *kf, const float *vf, const int32_t *table,
                                      int lo, int n, int bs, int n_head, int n_head_kv, int head_dim,
                                      double scale, const float *out)
{
    const size_t kv_row = (size_t)head_dim * (size_t)n_head_kv;
    double worst = 0;
    double *sc = malloc((size_t)(n > 0 ? n : 1) * sizeof *sc);
    for (int h = 0; h < n_head; h++) {
        const int hk = h / (n_head / n_head_kv);
        double mx = -1e300, sum = 0;
        for (int j = lo; j < n; j++) {
            const float *kr = kf + (size_t)(table[j / bs] * bs + j % bs) * kv_row + (size_t)hk * (size_t)head_dim;
            double d = 0;
            for (int i = 0; i < head_dim; i++)
                d += (double)q[h * head_dim + i] * kr[i];
            sc[j] = d * scale;
            mx = sc[j] > mx ? sc[j] : mx;
        }
        for (int j = lo; j < n; j++)
            sum += (sc[j] = exp(sc[j] - mx));
        for (int i = 0; i < head_dim; i++) {
            double o = 0;
            for (int j = lo; j < n; j++)
                o += sc[j] / sum *
                     vf[(size_t)(table[j / bs] * bs + j % bs) * kv_row + (size_t)hk * (size_t)head_dim + (size_t)i];
            worst = fmax(worst, fabs(o - out[h * head_dim + i]));
        }
    }
    free(sc);
    return worst;
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
    struct kiri_node nd;
    struct attn_tensors at;
    attention_node(&nd, &at, kv_type, &q[0][0][0], NTOK, kc, vc, slots, meta, tables, 5, &out[0][0],
                   (struct kiri_attn_params){H, HKV, D, BS, 0.125f, 0});
    struct env e;
    CHECK_EQ_INT(env_init(&e, n_threads), 0);
    CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);
    env_free(&e);

    double worst = 0;
    for (int t = 0; t < NTOK; t++)
        worst = fmax(worst, attention_formula_error(&q[t][0][0], &kf[0][0], &vf[0][0], tables + meta[2 * t + 1], 0,
                                                    meta[2 * t], BS, H, HKV, D, 0.125, out[t]));
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

/* Sliding-window attention through the backend: a 12-token prompt chunk continuing 8 cached keys
 * (token i sees 9 + i keys), a decode token with 13 keys and one with 1 key, three block tables.
 * Every table entry of a block wholly before a sequence's earliest window start is poisoned with
 * a block id far outside the cache: reading one faults. Each token is checked twice: against the
 * double-precision formula over its last `window` keys, and against the backend's own full
 * attention (window 0) over a cache holding only those keys, copied into fresh slots (the
 * reference kernels must then give the same bits; a SIMD table, whose prefill tiles group the
 * work differently, agrees within its row-operation tolerances). */
enum { WD = 64, WH = 4, WHKV = 2, WBS = 4, WSLOTS = 48, WTOK = 14 };

static int window_first(int n, int window) { return window > 0 && n > window ? n - window : 0; }

static void attention_window_case(int kv_type, int window, int n_threads, uint32_t features)
{
    static float kf[WSLOTS][WD * WHKV], vf[WSLOTS][WD * WHKV], q[WTOK][WH][WD], out[WTOK][WH * WD];
    static float one_out[WH * WD];
    fill(&kf[0][0], sizeof kf / 4, 1.0f);
    fill(&vf[0][0], sizeof vf / 4, 1.0f);
    fill(&q[0][0][0], sizeof q / 4, 1.0f);
    const size_t row = kiri_row_bytes(kv_type, WD * WHKV);
    char *kc = calloc(WSLOTS, row), *vc = calloc(WSLOTS, row);
    char *kc1 = calloc(WSLOTS, row), *vc1 = calloc(WSLOTS, row);
    for (int sl = 0; sl < WSLOTS; sl++) {
        CHECK(kiri_cpu_quantize_row(kv_type, kf[sl], kc + sl * row, WD * WHKV) == row);
        CHECK(kiri_cpu_quantize_row(kv_type, vf[sl], vc + sl * row, WD * WHKV) == row);
        kiri_cpu_dequantize_row(kv_type, kc + sl * row, kf[sl], WD * WHKV);
        kiri_cpu_dequantize_row(kv_type, vc + sl * row, vf[sl], WD * WHKV);
    }
    /* Tables: the prompt's sequence {7, 2, 9, 0, 5}, the decode tokens' {3, 8, 1, 6} and {11}. */
    const int32_t poison = 0x0FFFFFFF;
    int32_t tables[10] = {7, 2, 9, 0, 5, 3, 8, 1, 6, 11};
    int32_t meta[WTOK * 2];
    for (int t = 0; t < 12; t++) {
        meta[2 * t] = 9 + t;
        meta[2 * t + 1] = 0;
    }
    meta[24] = 13, meta[25] = 5, meta[26] = 1, meta[27] = 9;
    for (int b = 0; b < window_first(9, window) / WBS; b++)
        tables[b] = poison;
    for (int b = 0; b < window_first(13, window) / WBS; b++)
        tables[5 + b] = poison;

    struct kiri_node nd;
    struct attn_tensors at;
    attention_node(&nd, &at, kv_type, &q[0][0][0], WTOK, kc, vc, WSLOTS, meta, tables, 10, &out[0][0],
                   (struct kiri_attn_params){WH, WHKV, WD, WBS, 0.125f, window});
    struct env e;
    CHECK_EQ_INT(env_init_features(&e, n_threads, features), 0);
    CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
    CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);

    const int32_t clean[10] = {7, 2, 9, 0, 5, 3, 8, 1, 6, 11};
    const double tol_formula = kv_type == KIRI_TYPE_F32 ? 1e-5 : 3e-3;
    const double tol_full = features == 0 ? 0.0 : kv_type == KIRI_TYPE_F32 ? 1e-5 : 5e-4;
    double worst = 0, worst_full = 0;
    for (int t = 0; t < WTOK; t++) {
        const int32_t *table = clean + meta[2 * t + 1];
        const int n = meta[2 * t], lo = window_first(n, window);
        worst = fmax(worst, attention_formula_error(&q[t][0][0], &kf[0][0], &vf[0][0], table, lo, n, WBS, WH, WHKV,
                                                    WD, 0.125, out[t]));
        /* Full attention over a cache of only keys [lo, n), in slots 0 .. n - lo - 1. */
        for (int j = lo; j < n; j++) {
            const int sl = table[j / WBS] * WBS + j % WBS;
            memcpy(kc1 + (size_t)(j - lo) * row, kc + (size_t)sl * row, row);
            memcpy(vc1 + (size_t)(j - lo) * row, vc + (size_t)sl * row, row);
        }
        int32_t ident[WSLOTS / WBS];
        for (int b = 0; b < WSLOTS / WBS; b++)
            ident[b] = b;
        const int32_t meta1[2] = {n - lo, 0};
        struct kiri_node n1;
        struct attn_tensors a1;
        attention_node(&n1, &a1, kv_type, &q[t][0][0], 1, kc1, vc1, WSLOTS, meta1, ident, WSLOTS / WBS, one_out,
                       (struct kiri_attn_params){WH, WHKV, WD, WBS, 0.125f, 0});
        CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &n1, 1), 0);
        for (int i = 0; i < WD * WH; i++)
            worst_full = fmax(worst_full, fabs((double)one_out[i] - (double)out[t][i]));
    }
    env_free(&e);
    if (worst > tol_formula || worst_full > tol_full)
        fprintf(stderr, "attention window %d %s threads %d features %#x: formula %.3g, full attention %.3g\n",
                window, kiri_type_name(kv_type), n_threads, (unsigned)features, worst, worst_full);
    CHECK(worst <= tol_formula);
    CHECK(worst_full <= tol_full);
    free(kc);
    free(vc);
    free(kc1);
    free(vc1);
}

/* Windows of 1 key, not a multiple of the block size (5), a multiple (8), the longest token's
 * count (20), beyond it (25), and none (0). */
static void test_attention_window(void)
{
    static const int windows[] = {0, 1, 5, 8, 20, 25};
    static const int types[] = {KIRI_TYPE_F32, KIRI_TYPE_F16, KIRI_TYPE_Q8_0};
    const uint32_t features[2] = {0, kiri_platform_cpu_features()};
    for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++)
        for (size_t ti = 0; ti < 3; ti++)
            for (int fi = 0; fi < 2; fi++)
                attention_window_case(types[ti], windows[wi], 1 + 2 * fi, features[fi]);
}

/* GEGLU, SCALE and SOFTCAP nodes through the backend, on the reference kernels and on this CPU's,
 * with 1 and 3 workers: one row (split inside the row) and several, into another tensor and in
 * place, against the double formulas. */
static void test_elementwise_nodes(void)
{
    enum { E = 1000, R = 3 };
    static float g[R][E], u[R][E], y[R][E], in[R][E];
    fill(&g[0][0], (size_t)E * R, 5.0f);
    fill(&u[0][0], (size_t)E * R, 1.0f);
    const uint32_t features[2] = {0, kiri_platform_cpu_features()};
    for (int fi = 0; fi < 2; fi++)
        for (int nt = 1; nt <= 3; nt += 2)
            for (int rows = 1; rows <= R; rows += R - 1)
                for (int op = 0; op < 3; op++)
                    for (int in_place = 0; in_place < 2; in_place++) {
                        struct kiri_tensor tg, tu, ty;
                        memcpy(in, g, sizeof g);
                        tensor2(&tg, KIRI_TYPE_F32, in, E, rows);
                        tensor2(&tu, KIRI_TYPE_F32, u, E, rows);
                        tensor2(&ty, KIRI_TYPE_F32, in_place ? (void *)in : (void *)y, E, rows);
                        struct kiri_node nd = {.dst = &ty, .src = {&tg}};
                        if (op == 0) {
                            nd.op = KIRI_OP_GEGLU;
                            nd.src[1] = &tu;
                        } else if (op == 1) {
                            nd.op = KIRI_OP_SCALE;
                            nd.p.scale = 0.3f;
                        } else {
                            nd.op = KIRI_OP_SOFTCAP;
                            nd.p.softcap = 3.0f;
                        }
                        struct env e;
                        CHECK_EQ_INT(env_init_features(&e, nt, features[fi]), 0);
                        CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
                        CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);
                        env_free(&e);
                        const float(*out)[E] = in_place ? in : y;
                        int bad = 0;
                        for (int r = 0; r < rows; r++)
                            for (int i = 0; i < E; i++) {
                                const double x = g[r][i];
                                const double want = op == 0   ? gelu_ref(x) * u[r][i]
                                                    : op == 1 ? (double)(float)(x * 0.3f)
                                                              : 3.0 * tanh(x / 3.0);
                                const double tol = op == 0 ? gelu_tol(x, u[r][i]) + 3e-7 * fabs(want)
                                                           : 5e-7 * fabs(want) + 1e-37;
                                if (!(fabs(out[r][i] - want) <= tol) && bad++ < 3) {
                                    fprintf(stderr, "  op %d features %d threads %d rows %d in place %d: [%d][%d]\n",
                                            op, fi, nt, rows, in_place, r, i);
                                    CHECK_NEAR(out[r][i], want, tol);
                                }
                            }
                        CHECK(bad == 0);
                    }
    /* A soft cap must be positive. */
    struct kiri_tensor tx;
    tensor2(&tx, KIRI_TYPE_F32, g, E, 1);
    struct kiri_node nd = {.op = KIRI_OP_SOFTCAP, .dst = &tx, .src = {&tx}};
    struct env e;
    CHECK_EQ_INT(env_init(&e, 1), 0);
    CHECK(!kiri_cpu_backend_iface.supports(e.be, &nd));
    env_free(&e);
}

/* Two sequences' tokens (9 and 6) in two steps, as the recurrent ops' tests feed them: (sequence,
 * index) of each token; the first step the first's 5 tokens then the second's 2, the second step
 * the rest interleaved. */
static const int two_seq_steps[2][8][2] = {
    {{0, 0}, {0, 1}, {0, 2}, {0, 3}, {0, 4}, {1, 0}, {1, 1}, {-1, 0}},
    {{1, 2}, {0, 5}, {0, 6}, {1, 3}, {1, 4}, {0, 7}, {1, 5}, {0, 8}},
};
static const int two_seq_n[2] = {7, 8};

/* KIRI_OP_SHORT_CONV against the convolution written out: two sequences in state rows 2 and 0 of
 * three (filled with garbage, which a token at position 0 must not read), the first step the
 * first's 5 tokens then the second's 2, the second step the rest interleaved; 3 and 4 taps, in
 * place and not, 1 and 3 workers, both kernel sets. The sums run in the op's order (taps oldest
 * first, in float), so the outputs and the final states are exact. */
static void test_short_conv(void)
{
    enum { E = 40, NA = 9, NB = 6, SLOTS = 3, MAXK = 4 };
    static float ua[NA][E], ub[NB][E], w[E][MAXK];
    fill(&ua[0][0], (size_t)NA * E, 2.0f);
    fill(&ub[0][0], (size_t)NB * E, 2.0f);
    fill(&w[0][0], (size_t)E * MAXK, 1.0f);
    const int(*steps)[8][2] = two_seq_steps;
    const int *n_step = two_seq_n;
    const uint32_t features[2] = {0, kiri_platform_cpu_features()};
    for (int K = 3; K <= MAXK; K++)
        for (int fi = 0; fi < 2; fi++)
            for (int nt = 1; nt <= 3; nt += 2)
                for (int in_place = 0; in_place < 2; in_place++) {
                    static float state[SLOTS][(MAXK - 1) * E], x[8][E], y[8][E], wk[E][MAXK];
                    fill(&state[0][0], sizeof state / sizeof(float), 9.0f);
                    for (int c = 0; c < E; c++)
                        for (int k = 0; k < K; k++)
                            wk[c][k] = w[c][k];
                    struct env e;
                    CHECK_EQ_INT(env_init_features(&e, nt, features[fi]), 0);
                    int bad = 0;
                    for (int st = 0; st < 2; st++) {
                        const int n = n_step[st];
                        int32_t rows[8], pos[8];
                        for (int t = 0; t < n; t++) {
                            const int sq = steps[st][t][0], i = steps[st][t][1];
                            memcpy(x[t], sq ? ub[i] : ua[i], sizeof x[t]);
                            rows[t] = sq ? 0 : 2;
                            pos[t] = i;
                        }
                        struct kiri_tensor tx, ty, tw, ts, tr, tp;
                        tensor2(&tx, KIRI_TYPE_F32, x, E, n);
                        tensor2(&ty, KIRI_TYPE_F32, in_place ? (void *)x : (void *)y, E, n);
                        tensor2(&tw, KIRI_TYPE_F32, wk, K, E);
                        tw.nb[1] = MAXK * sizeof(float); /* rows of MAXK, K of them used */
                        tensor2(&ts, KIRI_TYPE_F32, state, (int64_t)(K - 1) * E, SLOTS);
                        ts.nb[1] = sizeof state[0];
                        tensor2(&tr, KIRI_TYPE_I32, rows, n, 1);
                        tensor2(&tp, KIRI_TYPE_I32, pos, n, 1);
                        struct kiri_node nd = {.op = KIRI_OP_SHORT_CONV, .dst = &ty, .src = {&tx, &tw, &ts, &tr, &tp}};
                        CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
                        CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);
                        const float(*out)[E] = in_place ? x : y;
                        for (int t = 0; t < n; t++) {
                            const int sq = steps[st][t][0], i = steps[st][t][1];
                            const float(*u)[E] = sq ? ub : ua;
                            for (int c = 0; c < E; c++) {
                                float want = 0.0f;
                                for (int k = 0; k + 1 < K; k++) {
                                    const int j = i - K + 1 + k;
                                    want += (j >= 0 ? u[j][c] : 0.0f) * wk[c][k];
                                }
                                want += u[i][c] * wk[c][K - 1];
                                if (out[t][c] != want && bad++ < 3) {
                                    fprintf(stderr, "  taps %d features %d threads %d in place %d: step %d token %d channel %d\n",
                                            K, fi, nt, in_place, st, t, c);
                                    CHECK_NEAR(out[t][c], want, 0.0);
                                }
                            }
                        }
                    }
                    /* Each state row ends as its sequence's last K - 1 inputs, oldest first. */
                    for (int k = 0; k + 1 < K; k++)
                        for (int c = 0; c < E; c++) {
                            bad += state[2][k * E + c] != ua[NA - K + 1 + k][c];
                            bad += state[0][k * E + c] != ub[NB - K + 1 + k][c];
                        }
                    CHECK(bad == 0);
                    env_free(&e);
                }
    /* One tap is no convolution with state; a state row of the wrong width is refused. */
    float buf[4 * E];
    int32_t ids[1] = {0};
    struct kiri_tensor tx, tw, ts, ti;
    tensor2(&tx, KIRI_TYPE_F32, buf, E, 1);
    tensor2(&tw, KIRI_TYPE_F32, buf, 1, E);
    tensor2(&ts, KIRI_TYPE_F32, buf, E, 1);
    tensor2(&ti, KIRI_TYPE_I32, ids, 1, 1);
    struct kiri_node nd = {.op = KIRI_OP_SHORT_CONV, .dst = &tx, .src = {&tx, &tw, &ts, &ti, &ti}};
    struct env e;
    CHECK_EQ_INT(env_init(&e, 1), 0);
    CHECK(!kiri_cpu_backend_iface.supports(e.be, &nd));
    tensor2(&tw, KIRI_TYPE_F32, buf, 3, E);
    CHECK(!kiri_cpu_backend_iface.supports(e.be, &nd));
    tensor2(&ts, KIRI_TYPE_F32, buf, 2 * E, 1);
    CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
    env_free(&e);
}

static double sigmoid_d(double x) { return 1.0 / (1.0 + exp(-x)); }

/* KIRI_OP_SHORT_CONV with p.conv_silu (qwen35): one sequence's 6 tokens in one step from a zero
 * state, 4 taps; each output is silu of the convolution written out in double. */
static void test_short_conv_silu(void)
{
    enum { E = 24, N = 6, K = 4 };
    static float x[N][E], y[N][E], w[E][K], state[(K - 1) * E];
    fill(&x[0][0], sizeof x / 4, 2.0f);
    fill(&w[0][0], sizeof w / 4, 1.0f);
    fill(state, sizeof state / 4, 9.0f);
    int32_t rows[N], pos[N];
    for (int t = 0; t < N; t++) {
        rows[t] = 0;
        pos[t] = t;
    }
    struct kiri_tensor tx, ty, tw, ts, tr, tp;
    tensor2(&tx, KIRI_TYPE_F32, x, E, N);
    tensor2(&ty, KIRI_TYPE_F32, y, E, N);
    tensor2(&tw, KIRI_TYPE_F32, w, K, E);
    tensor2(&ts, KIRI_TYPE_F32, state, (K - 1) * E, 1);
    tensor2(&tr, KIRI_TYPE_I32, rows, N, 1);
    tensor2(&tp, KIRI_TYPE_I32, pos, N, 1);
    struct kiri_node nd = {.op = KIRI_OP_SHORT_CONV, .dst = &ty, .src = {&tx, &tw, &ts, &tr, &tp}};
    nd.p.conv_silu = 1;
    struct env e;
    CHECK_EQ_INT(env_init(&e, 2), 0);
    CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
    CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);
    for (int t = 0; t < N; t++)
        for (int c = 0; c < E; c++) {
            double sum = 0.0;
            for (int k = 0; k < K; k++) {
                const int j = t - K + 1 + k;
                sum += j >= 0 ? (double)x[j][c] * w[c][k] : 0.0;
            }
            CHECK_NEAR(y[t][c], sum * sigmoid_d(sum), 1e-6 * (1.0 + fabs(sum)));
        }
    env_free(&e);
}

/* KIRI_OP_SIGMOID_MUL: the attention output times sigmoid of its gate, read as qwen35's graph
 * reads it: rows of D from a projection whose rows hold D queries then D gates (stride 2 D). */
static void test_sigmoid_mul(void)
{
    enum { D = 12, R = 7 };
    static float x[R][D], g[R][2 * D], y[R][D];
    fill(&x[0][0], sizeof x / 4, 3.0f);
    fill(&g[0][0], sizeof g / 4, 8.0f);
    struct kiri_tensor tx, tg, ty;
    tensor2(&tx, KIRI_TYPE_F32, x, D, R);
    tensor2(&ty, KIRI_TYPE_F32, y, D, R);
    tensor2(&tg, KIRI_TYPE_F32, &g[0][D], D, R);
    tg.nb[1] = 2 * D * sizeof(float);
    tg.nb[2] = tg.nb[3] = tg.nb[1] * R;
    struct kiri_node nd = {.op = KIRI_OP_SIGMOID_MUL, .dst = &ty, .src = {&tx, &tg}};
    struct env e;
    CHECK_EQ_INT(env_init(&e, 3), 0);
    CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
    CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);
    for (int r = 0; r < R; r++)
        for (int i = 0; i < D; i++) {
            const double want = (double)x[r][i] * sigmoid_d(g[r][D + i]);
            CHECK_NEAR(y[r][i], want, 1e-6 * (1.0 + fabs(want)));
        }
    env_free(&e);
}

/* KIRI_OP_DELTA_GATES: beta = sigmoid(b), g = softplus(a + dt) * A (with arguments past 20, where
 * softplus is the identity, among them), against the formulas in double. */
static void test_delta_gates(void)
{
    enum { H = 5, N = 4 };
    static float b[N][H], a[N][H], dt[H], A[H], y[N][2 * H];
    fill(&b[0][0], sizeof b / 4, 6.0f);
    fill(&a[0][0], sizeof a / 4, 6.0f);
    fill(dt, H, 1.0f);
    for (int h = 0; h < H; h++)
        A[h] = -expf(frand());
    a[1][2] = 24.0f;
    a[3][0] = -30.0f;
    struct kiri_tensor tb, ta, tdt, tA, ty;
    tensor2(&tb, KIRI_TYPE_F32, b, H, N);
    tensor2(&ta, KIRI_TYPE_F32, a, H, N);
    tensor2(&tdt, KIRI_TYPE_F32, dt, H, 1);
    tensor2(&tA, KIRI_TYPE_F32, A, H, 1);
    tensor2(&ty, KIRI_TYPE_F32, y, 2 * H, N);
    struct kiri_node nd = {.op = KIRI_OP_DELTA_GATES, .dst = &ty, .src = {&tb, &ta, &tdt, &tA}};
    struct env e;
    CHECK_EQ_INT(env_init(&e, 3), 0);
    CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
    CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);
    for (int t = 0; t < N; t++)
        for (int h = 0; h < H; h++) {
            const double x = (double)a[t][h] + dt[h], g = log1p(exp(x)) * A[h];
            CHECK_NEAR(y[t][h], sigmoid_d(b[t][h]), 1e-6);
            CHECK_NEAR(y[t][H + h], g, 1e-5 * (1.0 + fabs(g)));
        }
    env_free(&e);
}

/* KIRI_OP_DELTA_NET against the gated delta rule written out in double: two sequences in state
 * rows 2 and 0 of three (filled with garbage, which a token at position 0 must not read), 2 key
 * heads and 4 value heads of 8 (value head j reads key head j % 2), the first step the first
 * sequence's 5 tokens then the second's 2, the second step the rest interleaved; 1 and 3
 * workers, both kernel sets. Outputs and final states within float rounding. */
static void test_delta_net(void)
{
    enum { S = 8, HK = 2, HV = 4, C = (2 * HK + HV) * S, NA = 9, NB = 6, SLOTS = 3 };
    static float xa[NA][C], xb[NB][C], ga[NA][2 * HV], gb[NB][2 * HV];
    fill(&xa[0][0], sizeof xa / 4, 1.0f);
    fill(&xb[0][0], sizeof xb / 4, 1.0f);
    for (int t = 0; t < NA + NB; t++)
        for (int h = 0; h < HV; h++) {
            float *g = t < NA ? ga[t] : gb[t - NA];
            g[h] = 0.5f + 0.5f * frand();        /* beta in (0, 1) */
            g[HV + h] = -0.4f + 0.35f * frand(); /* log of the decay */
        }
    /* The reference: each sequence's outputs and final states. */
    static double wa[NA][HV * S], wb[NB][HV * S], fa[HV][S][S], fb[HV][S][S];
    for (int sq = 0; sq < 2; sq++) {
        const int n = sq ? NB : NA;
        double(*M)[S][S] = sq ? fb : fa;
        memset(M, 0, sizeof fa);
        for (int t = 0; t < n; t++) {
            const float *x = sq ? xb[t] : xa[t], *g = sq ? gb[t] : ga[t];
            double *out = sq ? wb[t] : wa[t];
            for (int h = 0; h < HV; h++) {
                const float *q = x + (h % HK) * S, *k = x + HK * S + (h % HK) * S, *v = x + 2 * HK * S + h * S;
                const double decay = exp(g[HV + h]), beta = g[h];
                for (int j = 0; j < S; j++)
                    for (int i = 0; i < S; i++)
                        M[h][j][i] *= decay;
                double d[S];
                for (int j = 0; j < S; j++) {
                    double mk = 0.0;
                    for (int i = 0; i < S; i++)
                        mk += M[h][j][i] * k[i];
                    d[j] = beta * (v[j] - mk);
                }
                for (int j = 0; j < S; j++)
                    for (int i = 0; i < S; i++)
                        M[h][j][i] += d[j] * k[i];
                for (int j = 0; j < S; j++) {
                    double o = 0.0;
                    for (int i = 0; i < S; i++)
                        o += M[h][j][i] * q[i];
                    out[h * S + j] = o / sqrt((double)S);
                }
            }
        }
    }
    const int(*steps)[8][2] = two_seq_steps;
    const int *n_step = two_seq_n;
    const uint32_t features[2] = {0, kiri_platform_cpu_features()};
    for (int fi = 0; fi < 2; fi++)
        for (int nt = 1; nt <= 3; nt += 2) {
            static float state[SLOTS][HV * S * S], x[8][C], gates[8][2 * HV], y[8][HV * S];
            fill(&state[0][0], sizeof state / sizeof(float), 9.0f);
            struct env e;
            CHECK_EQ_INT(env_init_features(&e, nt, features[fi]), 0);
            int bad = 0;
            for (int st = 0; st < 2; st++) {
                const int n = n_step[st];
                int32_t rows[8], pos[8];
                for (int t = 0; t < n; t++) {
                    const int sq = steps[st][t][0], i = steps[st][t][1];
                    memcpy(x[t], sq ? xb[i] : xa[i], sizeof x[t]);
                    memcpy(gates[t], sq ? gb[i] : ga[i], sizeof gates[t]);
                    rows[t] = sq ? 0 : 2;
                    pos[t] = i;
                }
                struct kiri_tensor tx, tg, ts, tr, tp, ty;
                tensor2(&tx, KIRI_TYPE_F32, x, C, n);
                tensor2(&tg, KIRI_TYPE_F32, gates, 2 * HV, n);
                tensor2(&ts, KIRI_TYPE_F32, state, HV * S * S, SLOTS);
                tensor2(&tr, KIRI_TYPE_I32, rows, n, 1);
                tensor2(&tp, KIRI_TYPE_I32, pos, n, 1);
                tensor2(&ty, KIRI_TYPE_F32, y, HV * S, n);
                struct kiri_node nd = {.op = KIRI_OP_DELTA_NET, .dst = &ty, .src = {&tx, &tg, &ts, &tr, &tp}};
                nd.p.delta = (struct kiri_delta_params){HK, HV, S, 1.0f / sqrtf((float)S)};
                CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
                CHECK_EQ_INT(kiri_cpu_backend_iface.compute(e.be, &nd, 1), 0);
                for (int t = 0; t < n; t++) {
                    const int sq = steps[st][t][0], i = steps[st][t][1];
                    const double *want = sq ? wb[i] : wa[i];
                    for (int j = 0; j < HV * S; j++)
                        if (fabs(y[t][j] - want[j]) > 1e-5 * (1.0 + fabs(want[j])) && bad++ < 3) {
                            fprintf(stderr, "  features %d threads %d: step %d token %d value %d\n", fi, nt, st, t, j);
                            CHECK_NEAR(y[t][j], want[j], 1e-5 * (1.0 + fabs(want[j])));
                        }
                }
            }
            for (int h = 0; h < HV; h++)
                for (int j = 0; j < S; j++)
                    for (int i = 0; i < S; i++) {
                        bad += fabs(state[2][(h * S + j) * S + i] - fa[h][j][i]) > 1e-5;
                        bad += fabs(state[0][(h * S + j) * S + i] - fb[h][j][i]) > 1e-5;
                    }
            CHECK(bad == 0);
            env_free(&e);
        }
    /* Value heads that are no multiple of the key heads, and a state of the wrong width, are
     * refused. */
    static float buf[SLOTS * HV * S * S];
    int32_t ids[1] = {0};
    struct kiri_tensor tx, tg, ts, ti, ty;
    tensor2(&tx, KIRI_TYPE_F32, buf, C, 1);
    tensor2(&tg, KIRI_TYPE_F32, buf, 2 * HV, 1);
    tensor2(&ts, KIRI_TYPE_F32, buf, HV * S * S, 1);
    tensor2(&ti, KIRI_TYPE_I32, ids, 1, 1);
    tensor2(&ty, KIRI_TYPE_F32, buf, HV * S, 1);
    struct kiri_node nd = {.op = KIRI_OP_DELTA_NET, .dst = &ty, .src = {&tx, &tg, &ts, &ti, &ti}};
    nd.p.delta = (struct kiri_delta_params){HK, HV, S, 1.0f};
    struct env e;
    CHECK_EQ_INT(env_init(&e, 1), 0);
    CHECK(kiri_cpu_backend_iface.supports(e.be, &nd));
    nd.p.delta.n_head_k = 3;
    CHECK(!kiri_cpu_backend_iface.supports(e.be, &nd));
    nd.p.delta.n_head_k = HK;
    tensor2(&ts, KIRI_TYPE_F32, buf, HV * S * S - 1, 1);
    CHECK(!kiri_cpu_backend_iface.supports(e.be, &nd));
    env_free(&e);
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

TEST_MAIN(test_rms_norm, test_swiglu, test_geglu, test_scale_softcap, test_rope, test_attention,
          test_attention_window, test_elementwise_nodes, test_short_conv, test_short_conv_silu, test_sigmoid_mul,
          test_delta_gates, test_delta_net, test_matmul_types, test_threadpool)
