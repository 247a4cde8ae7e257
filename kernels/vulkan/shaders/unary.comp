#version 450
#extension GL_GOOGLE_include_directive : require
/* SCALE (op 0): dst = x * c; SOFTCAP (op 1): dst = c * tanh(x / c), c > 0. Elementwise over
 * (n, ne1, ne2) with strides of their own in both dimensions (qwen35 scales the query and key
 * heads of its fused q/k/v rows); in place allowed. One invocation per element. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { float dst[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };

layout(push_constant) uniform Params {
    uint x_off, x_nb1, x_nb2; /* bytes, multiples of 4 */
    uint d_off, d_nb1, d_nb2;
    uint n, ne1, rows, op;
    float c;
} p;

#include "common.glsl"
#include "tanh.glsl"

void main()
{
    const uint g = group_index() * 64u + gl_LocalInvocationID.x;
    if (g >= p.n * p.rows)
        return;
    const uint i = g % p.n, r = g / p.n, i1 = r % p.ne1, i2 = r / p.ne1;
    const float v = x[((p.x_off + i1 * p.x_nb1 + i2 * p.x_nb2) >> 2) + i];
    precise float y = p.op == 0u ? v * p.c : p.c * tanh_acc(div_rn(v, p.c));
    dst[((p.d_off + i1 * p.d_nb1 + i2 * p.d_nb2) >> 2) + i] = y;
}
