#version 450
#extension GL_GOOGLE_include_directive : require
/* RMS_NORM: dst (n, ne1, ne2) = x / sqrt(mean(x^2) + eps) * w (n) over each row; in place allowed
 * (every invocation reads its values before the barrier and writes only its own). One workgroup
 * per row; the sum of squares is added in a tree (the CPU adds in double: the results agree to
 * float rounding). */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { float dst[]; };
layout(set = 0, binding = 1) readonly buffer X { float x[]; };
layout(set = 0, binding = 2) readonly buffer W { float w[]; };

layout(push_constant) uniform Params {
    uint x_off, x_nb1, x_nb2;   /* bytes, multiples of 4 */
    uint d_off, d_nb1, d_nb2;
    uint w_off, has_w;
    uint n, ne1, rows;
    float eps;
} p;

#include "common.glsl"

shared float partial[64];

void main()
{
    const uint r = group_index(), tid = gl_LocalInvocationID.x;
    if (r >= p.rows)
        return;
    const uint i1 = r % p.ne1, i2 = r / p.ne1;
    const uint xr = (p.x_off + i1 * p.x_nb1 + i2 * p.x_nb2) >> 2;
    const uint dr = (p.d_off + i1 * p.d_nb1 + i2 * p.d_nb2) >> 2;
    float s = 0.0;
    for (uint i = tid; i < p.n; i += 64u) {
        const float v = x[xr + i];
        s += v * v;
    }
    partial[tid] = s;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (tid < h)
            partial[tid] += partial[tid + h];
        barrier();
    }
    const float scale = div_rn(1.0, sqrt(div_rn(partial[0], float(p.n)) + p.eps));
    for (uint i = tid; i < p.n; i += 64u) {
        precise float y = x[xr + i] * scale;
        dst[dr + i] = p.has_w != 0u ? y * w[(p.w_off >> 2) + i] : y;
    }
}
