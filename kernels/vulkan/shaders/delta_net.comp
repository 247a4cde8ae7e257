#version 450
#extension GL_GOOGLE_include_directive : require
/* DELTA_NET: the gated delta rule over a step's tokens (KIRI_OP_DELTA_NET). Row j of a head's
 * state M (value dimension j, S floats over the key dimensions) evolves on its own: per token
 * M_j *= exp(g), d_j = beta (v_j - M_j . k), M_j += d_j k, out_j = scale M_j . q. So one
 * invocation takes one (value head, row) pair and walks the step's tokens in batch order (the
 * recurrence), reading and writing its row of the token's state row in place (copied first from
 * the row the token reads when that differs); a token at position 0 starts from zeros. The dot products add in 8 running sums combined as the CPU
 * reference's dot_f32 does, so the results differ from it only by exp. Rows outside the state are
 * skipped, as on the CPU. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { float dst[]; };
layout(set = 0, binding = 1) buffer State { float state[]; };
layout(set = 0, binding = 2) readonly buffer X { float x[]; };
layout(set = 0, binding = 3) readonly buffer Gates { float gates[]; };
layout(set = 0, binding = 4) readonly buffer Rows { int rows[]; };
layout(set = 0, binding = 5) readonly buffer Pos { int pos[]; };

layout(push_constant) uniform Params {
    uint x_off, x_nb1;      /* bytes, multiples of 4 */
    uint g_off, g_nb1;
    uint s_off, s_nb1;
    uint r_off, p_off;
    uint d_off, d_nb1;
    uint hk, hv, s, n_tok, n_slots;
    float scale;
    uint f_off;             /* the rows each token reads its state from (r_off: the rows written) */
} p;

#include "common.glsl"

/* The CPU's dot_f32 order: 8 running sums, combined pairwise, then the tail in order. */
float combine(float acc[8])
{
    precise float r = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    return r;
}

void main()
{
    const uint g = group_index() * 64u + gl_LocalInvocationID.x;
    if (g >= p.hv * p.s)
        return;
    const uint h = g / p.s, j = g % p.s, S = p.s;
    const uint full = S - S % 8u;
    for (uint t = 0u; t < p.n_tok; t++) {
        const int r = rows[(p.r_off >> 2) + t], f = rows[(p.f_off >> 2) + t];
        if (r < 0 || uint(r) >= p.n_slots || f < 0 || uint(f) >= p.n_slots)
            continue;
        const uint m = ((p.s_off + uint(r) * p.s_nb1) >> 2) + (h * S + j) * S;
        const uint mf = ((p.s_off + uint(f) * p.s_nb1) >> 2) + (h * S + j) * S;
        const uint xt = (p.x_off + t * p.x_nb1) >> 2, gt = (p.g_off + t * p.g_nb1) >> 2;
        const uint q = xt + (h % p.hk) * S, k = xt + p.hk * S + (h % p.hk) * S;
        const float v = x[xt + 2u * p.hk * S + h * S + j];
        const float beta = gates[gt + h], decay = exp(gates[gt + p.hv + h]);
        if (pos[(p.p_off >> 2) + t] == 0)
            for (uint i = 0u; i < S; i++)
                state[m + i] = 0.0;
        else if (f != r)
            for (uint i = 0u; i < S; i++)
                state[m + i] = state[mf + i];
        /* Decay, then the row's prediction for k. */
        float acc[8] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        for (uint i = 0u; i < full; i += 8u)
            for (uint l = 0u; l < 8u; l++) {
                precise float mv = state[m + i + l] * decay;
                state[m + i + l] = mv;
                precise float a = acc[l] + mv * x[k + i + l];
                acc[l] = a;
            }
        precise float pred = combine(acc);
        for (uint i = full; i < S; i++) {
            precise float mv = state[m + i] * decay;
            state[m + i] = mv;
            pred += mv * x[k + i];
        }
        precise float d = (v - pred) * beta;
        /* The update, then the row's read-out by q. */
        for (uint l = 0u; l < 8u; l++)
            acc[l] = 0.0;
        for (uint i = 0u; i < full; i += 8u)
            for (uint l = 0u; l < 8u; l++) {
                precise float mv = state[m + i + l] + d * x[k + i + l];
                state[m + i + l] = mv;
                precise float a = acc[l] + mv * x[q + i + l];
                acc[l] = a;
            }
        precise float yj = combine(acc);
        for (uint i = full; i < S; i++) {
            precise float mv = state[m + i] + d * x[k + i];
            state[m + i] = mv;
            yj += mv * x[q + i];
        }
        dst[((p.d_off + t * p.d_nb1) >> 2) + h * S + j] = yj * p.scale;
    }
}
