#version 450
#extension GL_GOOGLE_include_directive : require
/* GEGLU: dst (n, rows) = gelu(g) * u, elementwise, gelu by its tanh approximation
 * 0.5 g (1 + tanh(z)), z = sqrt(2/pi) (g + 0.044715 g^3), computed as the CPU reference computes
 * it: g / (1 + e^-2z), the same function without the cancellation of 1 + tanh(z) for negative g.
 * In place allowed. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { float dst[]; };
layout(set = 0, binding = 1) readonly buffer G { float gate[]; };
layout(set = 0, binding = 2) readonly buffer U { float up[]; };

layout(push_constant) uniform Params {
    uint g_off, g_nb1;      /* bytes, multiples of 4 */
    uint u_off, u_nb1;
    uint d_off, d_nb1;
    uint n, rows;
} p;

#include "common.glsl"

void main()
{
    const uint g = group_index() * 64u + gl_LocalInvocationID.x;
    if (g >= p.n * p.rows)
        return;
    const uint i = g % p.n, r = g / p.n;
    const float x = gate[((p.g_off + r * p.g_nb1) >> 2) + i];
    precise float z2 = 2.0 * 0.7978845608028654 * (x + 0.044715 * x * x * x);
    precise float y = div_rn(x, 1.0 + exp(-z2)) * up[((p.u_off + r * p.u_nb1) >> 2) + i];
    dst[((p.d_off + r * p.d_nb1) >> 2) + i] = y;
}
