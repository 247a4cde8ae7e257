#version 450
#extension GL_GOOGLE_include_directive : require
/* MUL: dst = a * b, elementwise over (n, rows); b has the rows of a or one row, broadcast to all. In place
 * allowed. One invocation per element. Built with SIGMOID_MUL: dst = a * sigmoid(b)
 * (KIRI_OP_SIGMOID_MUL, the attention output times its gate; rows may be strided). */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { float dst[]; };
layout(set = 0, binding = 1) readonly buffer A { float a[]; };
layout(set = 0, binding = 2) readonly buffer B { float b[]; };

layout(push_constant) uniform Params {
    uint a_off, a_nb1;      /* bytes, multiples of 4 */
    uint b_off, b_nb1;      /* b_nb1 is 0 for a broadcast row */
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
    const uint ai = ((p.a_off + r * p.a_nb1) >> 2) + i, bi = ((p.b_off + r * p.b_nb1) >> 2) + i;
#ifdef SIGMOID_MUL
    dst[((p.d_off + r * p.d_nb1) >> 2) + i] = a[ai] * div_rn(1.0, 1.0 + exp(-b[bi]));
#else
    dst[((p.d_off + r * p.d_nb1) >> 2) + i] = a[ai] * b[bi];
#endif
}
