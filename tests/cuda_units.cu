/* The CUDA kernels' per-block arithmetic against the CPU reference, on the host (no GPU needed):
 * kernels/cuda/common.cuh compiles its unit functions for host and device alike, so here, for
 * every weight type, random rows quantized by the reference must give
 * - through wt<T>::val, every element exactly as kiri_cpu_dequantize_row (row look-ups are exact);
 * - through wt<T>::dot over all units of a row, the reference vec_dot within 2e-5 of
 *   sum |w_i x_i| (the integer block sums are the same; only the float order of adding differs),
 *   with the activations in the reference's format (Q8_0, Q8_1, Q8_K, F16, BF16) moved into the
 *   CUDA layout;
 * the activation quantizer of one 32-value block (quantize_q8_block, used by the Q8_0 / Q8_1
 * conversion and by STORE_KV into a Q8_0 cache) must write the reference's bytes; and the
 * elementwise formulas of GEGLU and SOFTCAP (geglu_value, softcap_value) must agree with their
 * definitions in runtime/backend.h, evaluated in double, within 1e-5 of max(1, |y|), and with
 * the reference's rows (kiri_cpu_geglu_row, kiri_cpu_softcap_row) within 4e-6; and the hybrid
 * models' helpers (sigmoid, softplus, one short-convolution step, one delta-rule row step)
 * against their definitions in double (check_recurrent); and the backend's supports on the
 * hybrid models' nodes as the runtime asks at load (check_supports).
 * The kernels themselves (indexing, warps, launches) are checked on a GPU by cuda_check. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../kernels/cuda/common.cuh"

extern "C" {
#include "../kernels/cpu/cpu_kernels.h"
}

static int checks, failures;
static uint64_t rng = 0x243F6A8885A308D3ull;

static float frand(void) /* uniform in [-1, 1) */
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

static void check(int ok, const char *what, int type, long long k, double got, double want)
{
    checks++;
    if (!ok) {
        if (failures < 20)
            fprintf(stderr, "cuda_units: %s %s k=%lld: cuda %.9g, cpu %.9g\n", what, kiri_type_name(type), k, got,
                    want);
        failures++;
    }
}

/* The activation row x (k values) in the CUDA layout of format act, from the reference's bytes. */
static void to_cuda_act(int act, const float *x, const void *ref, void *out, int64_t k)
{
    if (act == KIRI_CUDA_ACT_F32) {
        memcpy(out, x, (size_t)k * 4);
    } else if (act == KIRI_CUDA_ACT_F16 || act == KIRI_CUDA_ACT_BF16) {
        for (int64_t i = 0; i < k; i++)
            ((float *)out)[i] = act == KIRI_CUDA_ACT_F16 ? kiri_f16_to_f32(((const kiri_f16 *)ref)[i])
                                                         : kiri_bf16_to_f32(((const kiri_bf16 *)ref)[i]);
    } else if (act == KIRI_CUDA_ACT_Q8_0) {
        for (int64_t b = 0; b < k / 32; b++) {
            const struct kiri_block_q8_0 *r = (const struct kiri_block_q8_0 *)ref + b;
            act_q8_0 *o = (act_q8_0 *)out + b;
            memcpy(o->qs, r->qs, 32);
            o->d = kiri_f16_to_f32(r->d);
        }
    } else if (act == KIRI_CUDA_ACT_Q8_1) {
        for (int64_t b = 0; b < k / 32; b++) {
            const struct kiri_block_q8_1 *r = (const struct kiri_block_q8_1 *)ref + b;
            act_q8_1 *o = (act_q8_1 *)out + b;
            memcpy(o->qs, r->qs, 32);
            o->d = kiri_f16_to_f32(r->d);
            o->s = kiri_f16_to_f32(r->s);
        }
    } else {
        for (int64_t b = 0; b < k / 256; b++) {
            const struct kiri_block_q8_K *r = (const struct kiri_block_q8_K *)ref + b;
            act_q8_k *o = (act_q8_k *)out + b;
            memcpy(o->qs, r->qs, 256);
            o->d = r->d;
            for (int g = 0; g < 16; g++)
                o->bsums[g] = r->bsums[g];
        }
    }
}

template <int T>
static void check_type(int64_t k)
{
    struct kiri_cpu_kernels ref;
    kiri_cpu_kernels_init_ref(&ref);
    const int vt = kiri_cpu_vec_dot_type(T), act = kiri_cuda_act_format(T);
    const size_t row = (size_t)(k / kiri_type_block_size(T)) * kiri_type_size(T);
    float *w = (float *)malloc((size_t)k * 4), *x = (float *)malloc((size_t)k * 4);
    float *deq = (float *)malloc((size_t)k * 4);
    uint8_t *wq = (uint8_t *)calloc(1, row + 64);
    uint8_t *aref = (uint8_t *)calloc(1, (size_t)k * 4 + 1024), *acu = (uint8_t *)calloc(1, (size_t)k * 4 + 1024);
    for (int r = 0; r < 6; r++) {
        for (int64_t i = 0; i < k; i++) {
            w[i] = frand() * (r == 5 ? 0.0f : 1.0f); /* the last row all zero */
            x[i] = frand() * 2.0f;
        }
        kiri_cpu_quantize_row(T, w, wq, k);
        kiri_cpu_dequantize_row(T, wq, deq, k);
        int exact = 1;
        for (int64_t i = 0; i < k; i++) {
            const float v = wt<T>::val(wq, (int)i);
            if (memcmp(&v, &deq[i], 4) != 0) {
                check(0, "val", T, (long long)k, v, deq[i]);
                exact = 0;
                break;
            }
        }
        check(exact, "val", T, (long long)k, 0, 0);
        if (vt == KIRI_TYPE_F32)
            memcpy(aref, x, (size_t)k * 4);
        else
            ref.from_float[vt](x, aref, k);
        float want = 0;
        ref.vec_dot[T](k, &want, wq, aref);
        to_cuda_act(act, x, aref, acu, k);
        const int units = (int)((k + wt<T>::UNIT - 1) / wt<T>::UNIT);
        float got = 0;
        for (int u = 0; u < units; u++)
            got += wt<T>::dot(wq, acu, u, (int)k);
        double scale = 1e-3;
        for (int64_t i = 0; i < k; i++)
            scale += fabs((double)deq[i] * x[i]);
        check(fabs((double)got - want) <= 2e-5 * scale, "dot", T, (long long)k, got, want);
    }
    free(w);
    free(x);
    free(deq);
    free(wq);
    free(aref);
    free(acu);
}

/* quantize_q8_block against the reference's Q8_0 and Q8_1 bytes. */
static void check_quantize_block(void)
{
    float x[64];
    for (int r = 0; r < 200; r++) {
        for (int i = 0; i < 64; i++)
            x[i] = r == 0 ? 0.0f : frand() * (r % 7 == 0 ? 1e-3f : 3.0f);
        if (r == 1)
            x[5] = 127.0f / 2.0f; /* values on rounding boundaries */
        struct kiri_block_q8_0 q0[2];
        struct kiri_block_q8_1 q1[2];
        kiri_cpu_quantize_row(KIRI_TYPE_Q8_0, x, q0, 64);
        kiri_cpu_quantize_row(KIRI_TYPE_Q8_1, x, q1, 64);
        for (int b = 0; b < 2; b++) {
            int8_t qs[32];
            float d;
            const int sum = quantize_q8_block(x + 32 * b, qs, &d);
            check(memcmp(qs, q0[b].qs, 32) == 0 && f16_bits(d) == q0[b].d, "quantize_q8_block (Q8_0)", KIRI_TYPE_Q8_0,
                  32, d, kiri_f16_to_f32(q0[b].d));
            check(memcmp(qs, q1[b].qs, 32) == 0 && f16_bits((float)sum * d) == q1[b].s, "quantize_q8_block (Q8_1 s)",
                  KIRI_TYPE_Q8_1, 32, (float)sum * d, kiri_f16_to_f32(q1[b].s));
        }
    }
}

/* geglu_value and softcap_value over a grid reaching tanh's saturation, against the formulas
 * of runtime/backend.h in double. */
static void check_elementwise(void)
{
    const double k = sqrt(2.0 / 3.14159265358979323846);
    for (int i = -4000; i <= 4000; i++) {
        const float g = (float)i * 0.0025f, u = 1.5f - (float)(i % 7) * 0.5f; /* g in [-10, 10] */
        const double want = 0.5 * g * (1.0 + tanh(k * (g + 0.044715 * (double)g * g * g))) * u;
        const float got = geglu_value(g, u);
        float ref;
        kiri_cpu_geglu_row(&g, &u, &ref, 1);
        check(fabs(got - want) <= 1e-5 * fmax(1.0, fabs(want)), "geglu_value", KIRI_TYPE_F32, i, got, want);
        check(fabs(got - ref) <= 4e-6 * fmax(1.0, fabs(ref)), "geglu_value (cpu)", KIRI_TYPE_F32, i, got, ref);
        const float caps[3] = {1.0f, 30.0f, 50.0f};
        for (int c = 0; c < 3; c++) {
            const float x = (float)i * 0.001f * caps[c]; /* x / c in [-4, 4] */
            const double ws = caps[c] * tanh((double)x / caps[c]);
            const float gs = softcap_value(x, caps[c]);
            float rs;
            kiri_cpu_softcap_row(&x, &rs, 1, caps[c]);
            check(fabs(gs - ws) <= 1e-5 * fmax(1.0, fabs(ws)), "softcap_value", KIRI_TYPE_F32, i, gs, ws);
            check(fabs(gs - rs) <= 4e-6 * fmax(1.0, fabs(rs)), "softcap_value (cpu)", KIRI_TYPE_F32, i, gs, rs);
        }
    }
}

/* The hybrid models' helpers against runtime/backend.h's definitions evaluated in double:
 * sigmoid_value and softplus_value (DELTA_GATES, SIGMOID_MUL) within 4e-6 of max(1, |y|);
 * short_conv_step over a sequence of tokens (zeros before the first, the state strided as the
 * kernel keeps it) within 1e-5 of max(1, sum |w u|), with and without SiLU; delta_row_step for
 * every row of a head's state over a sequence of tokens (decay, delta update, read-out) against
 * the whole S x S recurrence within 1e-5 of max(1, sum |M q|), heads of 16 and 13 (the
 * 8-sum tails). */
static void check_recurrent(void)
{
    for (int i = -3000; i <= 3000; i++) {
        const float x = (float)i * 0.01f; /* [-30, 30]: past softplus's switch at 20 */
        const double ws = 1.0 / (1.0 + exp(-(double)x)), wp = log1p(exp((double)x));
        const float gs = sigmoid_value(x), gp = softplus_value(x);
        check(fabs(gs - ws) <= 4e-6 * fmax(1.0, fabs(ws)), "sigmoid_value", KIRI_TYPE_F32, i, gs, ws);
        check(fabs(gp - wp) <= 4e-6 * fmax(1.0, fabs(wp)), "softplus_value", KIRI_TYPE_F32, i, gp, wp);
    }
    enum { T = 9, STRIDE = 5 };
    for (int k = 2; k <= 4; k++)
        for (int silu = 0; silu < 2; silu++) {
            float w[4], u[T], state[3 * STRIDE];
            for (int j = 0; j < k; j++)
                w[j] = frand();
            for (int t = 0; t < T; t++)
                u[t] = 2.0f * frand();
            for (int j = 0; j < 3 * STRIDE; j++)
                state[j] = 0.0f;
            for (int t = 0; t < T; t++) {
                double want = 0.0, mag = 0.0;
                for (int j = 0; j < k; j++) {
                    const int src = t - k + 1 + j;
                    const double v = src >= 0 ? (double)w[j] * u[src] : 0.0;
                    want += v;
                    mag += fabs(v);
                }
                if (silu)
                    want = want / (1.0 + exp(-want));
                const float got = short_conv_step(state, STRIDE, w, k, u[t], silu);
                check(fabs(got - want) <= 1e-5 * fmax(1.0, mag), silu ? "short_conv_step (silu)" : "short_conv_step",
                      KIRI_TYPE_F32, 100 * k + t, got, want);
            }
        }
    const int sizes[2] = {16, 13};
    for (int c = 0; c < 2; c++) {
        const int S = sizes[c];
        static double M[16][16];
        static float m[16][16];
        memset(M, 0, sizeof M);
        memset(m, 0, sizeof m);
        for (int t = 0; t < T; t++) {
            float q[16], kk[16], v[16];
            for (int i = 0; i < S; i++) {
                q[i] = frand() / 4.0f;
                kk[i] = frand() / 4.0f;
                v[i] = frand();
            }
            const float beta = 0.5f + 0.5f * frand() * 0.9f, g = -0.5f + 0.4f * frand();
            const double decay = exp((double)g);
            double d[16];
            for (int j = 0; j < S; j++) {
                double pred = 0.0;
                for (int i = 0; i < S; i++)
                    pred += (M[j][i] *= decay) * kk[i];
                d[j] = beta * (v[j] - pred);
            }
            for (int j = 0; j < S; j++) {
                double want = 0.0, mag = 0.0;
                for (int i = 0; i < S; i++) {
                    M[j][i] += d[j] * kk[i];
                    want += M[j][i] * q[i];
                    mag += fabs(M[j][i] * q[i]);
                }
                const float got = delta_row_step(m[j], kk, q, v[j], beta, expf(g), S);
                check(fabs(got - want) <= 1e-5 * fmax(1.0, mag), "delta_row_step", KIRI_TYPE_F32, 100 * S + t, got,
                      want);
            }
        }
    }
}

/* The backend's supports on the hybrid models' nodes as runtime/model.c asks at load (tensors not
 * yet on the device) and as the graph builds them: qwen35's short convolution with SiLU over a
 * state view, the delta rule, its gates, SCALE over a strided head view of q, the gated
 * attention's SIGMOID_MUL, state rows read besides those written; refused past the kernels'
 * limits (17 taps, heads of 513), with an I32 tensor in place of an F32 one, and with a third row
 * of state rows. */
extern "C" const struct kiri_backend_iface kiri_cuda_backend_iface;

static struct kiri_tensor f32_rows(int64_t e, int64_t n, size_t row_bytes)
{
    struct kiri_tensor t;
    memset(&t, 0, sizeof t);
    t.type = KIRI_TYPE_F32;
    t.ne[0] = e;
    t.ne[1] = n;
    t.ne[2] = t.ne[3] = 1;
    t.nb[0] = 4;
    t.nb[1] = row_bytes ? row_bytes : 4 * (size_t)e;
    t.nb[2] = t.nb[3] = t.nb[1] * (size_t)n;
    return t;
}

static void check_supports(void)
{
    int (*supports)(struct kiri_backend *, const struct kiri_node *) = kiri_cuda_backend_iface.supports;
    const int64_t S = 16, Hk = 2, Hv = 4, K = 4, n = 3, C = (2 * Hk + Hv) * S, slots = 5;
    const int64_t window = (K - 1) * C, delta = Hv * S * S;
    struct kiri_tensor qkv = f32_rows(C, n, 0), w = f32_rows(K, C, 0), gates = f32_rows(2 * Hv, n, 0);
    struct kiri_tensor state = f32_rows(window, slots, 4 * (size_t)(window + delta));
    struct kiri_tensor dstate = state, y = f32_rows(Hv * S, n, 0), ids = f32_rows(n, 1, 0);
    dstate.ne[0] = delta;
    ids.type = KIRI_TYPE_I32;
    struct kiri_node nd;
    memset(&nd, 0, sizeof nd);
    nd.op = KIRI_OP_SHORT_CONV;
    nd.dst = &qkv;
    nd.src[0] = &qkv;
    nd.src[1] = &w;
    nd.src[2] = &state;
    nd.src[3] = nd.src[4] = &ids;
    nd.p.conv_silu = 1;
    check(supports(NULL, &nd), "supports short_conv", KIRI_TYPE_F32, K, 0, 1);
    struct kiri_tensor w17 = f32_rows(17, C, 0), st17 = f32_rows(16 * C, slots, 0);
    nd.src[1] = &w17;
    nd.src[2] = &st17;
    check(!supports(NULL, &nd), "supports short_conv (17 taps refused)", KIRI_TYPE_F32, 17, 1, 0);
    nd.src[1] = &w;
    nd.src[2] = &ids;
    check(!supports(NULL, &nd), "supports short_conv (I32 state refused)", KIRI_TYPE_I32, K, 1, 0);

    memset(&nd, 0, sizeof nd);
    nd.op = KIRI_OP_DELTA_NET;
    nd.dst = &y;
    nd.src[0] = &qkv;
    nd.src[1] = &gates;
    nd.src[2] = &dstate;
    nd.src[3] = nd.src[4] = &ids;
    nd.p.delta.n_head_k = (int)Hk;
    nd.p.delta.n_head_v = (int)Hv;
    nd.p.delta.head_dim = (int)S;
    nd.p.delta.scale = 0.25f;
    check(supports(NULL, &nd), "supports delta_net", KIRI_TYPE_F32, S, 0, 1);
    /* A speculative step's rows: those written, then those read; a third row is refused. */
    struct kiri_tensor rows2 = f32_rows(n, 2, 0), rows3 = f32_rows(n, 3, 0);
    rows2.type = rows3.type = KIRI_TYPE_I32;
    nd.src[3] = &rows2;
    check(supports(NULL, &nd), "supports delta_net (rows read besides those written)", KIRI_TYPE_I32, n, 0, 1);
    nd.src[3] = &rows3;
    check(!supports(NULL, &nd), "supports delta_net (three rows of rows refused)", KIRI_TYPE_I32, n, 1, 0);
    nd.src[3] = &ids;
    struct kiri_tensor big_x = f32_rows(3 * 513, n, 0), big_g = f32_rows(2, n, 0), big_y = f32_rows(513, n, 0);
    struct kiri_tensor big_s = f32_rows(513 * 513, slots, 0);
    nd.dst = &big_y;
    nd.src[0] = &big_x;
    nd.src[1] = &big_g;
    nd.src[2] = &big_s;
    nd.p.delta.n_head_k = nd.p.delta.n_head_v = 1;
    nd.p.delta.head_dim = 513;
    check(!supports(NULL, &nd), "supports delta_net (head 513 refused)", KIRI_TYPE_F32, 513, 1, 0);

    struct kiri_tensor beta = f32_rows(Hv, n, 0), alpha = f32_rows(Hv, n, 0), dt = f32_rows(Hv, 1, 0);
    memset(&nd, 0, sizeof nd);
    nd.op = KIRI_OP_DELTA_GATES;
    nd.dst = &gates;
    nd.src[0] = &beta;
    nd.src[1] = &alpha;
    nd.src[2] = nd.src[3] = &dt;
    check(supports(NULL, &nd), "supports delta_gates", KIRI_TYPE_F32, Hv, 0, 1);

    /* q's heads inside the fused rows: (S, Hk, n), rows S apart, tokens C apart. */
    struct kiri_tensor qh = f32_rows(S, Hk, 0);
    qh.ne[2] = n;
    qh.nb[2] = qh.nb[3] = 4 * (size_t)C;
    memset(&nd, 0, sizeof nd);
    nd.op = KIRI_OP_SCALE;
    nd.dst = nd.src[0] = &qh;
    nd.p.scale = 0.25f;
    check(supports(NULL, &nd), "supports scale (strided heads)", KIRI_TYPE_F32, S, 0, 1);

    /* The gated attention: (D, H, n) output times the gate's heads, 2D apart. */
    struct kiri_tensor att = f32_rows(S, Hv, 0), gate = f32_rows(S, Hv, 8 * (size_t)S);
    att.ne[2] = gate.ne[2] = n;
    memset(&nd, 0, sizeof nd);
    nd.op = KIRI_OP_SIGMOID_MUL;
    nd.dst = nd.src[0] = &att;
    nd.src[1] = &gate;
    check(supports(NULL, &nd), "supports sigmoid_mul (strided gate)", KIRI_TYPE_F32, S, 0, 1);
}

int main(void)
{
    const int64_t ks[] = {256, 512, 4096};
    for (int i = 0; i < 3; i++) {
        check_type<KIRI_TYPE_F32>(ks[i]);
        check_type<KIRI_TYPE_F16>(ks[i]);
        check_type<KIRI_TYPE_BF16>(ks[i]);
        check_type<KIRI_TYPE_Q4_0>(ks[i]);
        check_type<KIRI_TYPE_Q4_1>(ks[i]);
        check_type<KIRI_TYPE_Q5_0>(ks[i]);
        check_type<KIRI_TYPE_Q5_1>(ks[i]);
        check_type<KIRI_TYPE_Q8_0>(ks[i]);
        check_type<KIRI_TYPE_Q4_K>(ks[i]);
        check_type<KIRI_TYPE_Q5_K>(ks[i]);
        check_type<KIRI_TYPE_Q6_K>(ks[i]);
    }
    /* Plain rows that end inside a 32-value unit. */
    check_type<KIRI_TYPE_F32>(172);
    check_type<KIRI_TYPE_F16>(172);
    check_type<KIRI_TYPE_BF16>(172);
    check_quantize_block();
    check_elementwise();
    check_recurrent();
    check_supports();
    fprintf(stderr, "cuda_units: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
