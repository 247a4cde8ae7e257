#version 450
#extension GL_GOOGLE_include_directive : require
/* SHORT_CONV: causal depthwise convolution over a step's tokens with per-sequence state
 * (KIRI_OP_SHORT_CONV). Channels are independent, so one invocation takes one channel and walks
 * the step's tokens in batch order (the recurrence): each token's window is its sequence's state
 * row (the K - 1 previous inputs, oldest first, E floats each) and its own input, and the row
 * then shifts by one input. A token at position 0 starts from zeros; one that reads another row
 * (a speculative step's) copies it to its own first. The taps sum in order,
 * oldest input first, as the CPU reference does. In place allowed: a token's input is read before
 * its output is written, and only this invocation touches its channel. Rows outside the state
 * are skipped, as on the CPU. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { float dst[]; };
layout(set = 0, binding = 1) buffer State { float state[]; };
layout(set = 0, binding = 2) readonly buffer U { float u[]; };
layout(set = 0, binding = 3) readonly buffer W { float w[]; };
layout(set = 0, binding = 4) readonly buffer Rows { int rows[]; };
layout(set = 0, binding = 5) readonly buffer Pos { int pos[]; };

layout(push_constant) uniform Params {
    uint u_off, u_nb1;      /* bytes, multiples of 4 */
    uint d_off, d_nb1;
    uint w_off, w_nb1;      /* the kernel: K taps per channel */
    uint s_off, s_nb1;      /* the state: one row per slot */
    uint r_off, p_off;
    uint e, n_tok, k, n_slots, silu;
    uint f_off;             /* the rows each token reads its state from (r_off: the rows written) */
} p;

#include "common.glsl"

void main()
{
    const uint c = group_index() * 64u + gl_LocalInvocationID.x;
    if (c >= p.e)
        return;
    const uint wc = ((p.w_off + c * p.w_nb1) >> 2);
    for (uint t = 0u; t < p.n_tok; t++) {
        const int r = rows[(p.r_off >> 2) + t], f = rows[(p.f_off >> 2) + t];
        if (r < 0 || uint(r) >= p.n_slots || f < 0 || uint(f) >= p.n_slots)
            continue;
        const uint s = ((p.s_off + uint(r) * p.s_nb1) >> 2) + c;
        const uint sf = ((p.s_off + uint(f) * p.s_nb1) >> 2) + c;
        if (pos[(p.p_off >> 2) + t] == 0)
            for (uint j = 0u; j + 1u < p.k; j++)
                state[s + j * p.e] = 0.0;
        else if (f != r)
            for (uint j = 0u; j + 1u < p.k; j++)
                state[s + j * p.e] = state[sf + j * p.e];
        const float xc = u[((p.u_off + t * p.u_nb1) >> 2) + c];
        precise float sum = 0.0;
        for (uint j = 0u; j + 1u < p.k; j++)
            sum += state[s + j * p.e] * w[wc + j];
        sum += xc * w[wc + p.k - 1u];
        for (uint j = 0u; j + 2u < p.k; j++)
            state[s + j * p.e] = state[s + (j + 1u) * p.e];
        state[s + (p.k - 2u) * p.e] = xc;
        dst[((p.d_off + t * p.d_nb1) >> 2) + c] = p.silu != 0u ? div_rn(sum, 1.0 + exp(-sum)) : sum;
    }
}
