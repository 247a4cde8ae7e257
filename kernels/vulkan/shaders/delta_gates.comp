#version 450
#extension GL_GOOGLE_include_directive : require
/* DELTA_GATES: a Gated DeltaNet layer's gates (KIRI_OP_DELTA_GATES), per token: H values
 * beta = sigmoid(b), then H values g = softplus(a + dt) * A, softplus the identity past 20 as the
 * CPU reference writes it. One invocation per (head, token). */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { float dst[]; };
layout(set = 0, binding = 1) readonly buffer B { float b[]; };
layout(set = 0, binding = 2) readonly buffer A { float a[]; };
layout(set = 0, binding = 3) readonly buffer Dt { float dt[]; };
layout(set = 0, binding = 4) readonly buffer Decay { float decay[]; };

layout(push_constant) uniform Params {
    uint b_off, b_nb1;      /* bytes, multiples of 4 */
    uint a_off, a_nb1;
    uint dt_off, decay_off;
    uint d_off, d_nb1;
    uint h, n_tok;
} p;

#include "common.glsl"

void main()
{
    const uint g = group_index() * 64u + gl_LocalInvocationID.x;
    if (g >= p.h * p.n_tok)
        return;
    const uint i = g % p.h, t = g / p.h;
    const float bv = b[((p.b_off + t * p.b_nb1) >> 2) + i];
    precise float x = a[((p.a_off + t * p.a_nb1) >> 2) + i] + dt[(p.dt_off >> 2) + i];
    precise float sp = x > 20.0 ? x : log(1.0 + exp(x));
    const uint d = (p.d_off + t * p.d_nb1) >> 2;
    dst[d + i] = div_rn(1.0, 1.0 + exp(-bv));
    dst[d + p.h + i] = sp * decay[(p.decay_off >> 2) + i];
}
