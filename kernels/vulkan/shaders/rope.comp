#version 450
#extension GL_GOOGLE_include_directive : require
/* ROPE: rotates x (D, n_head, n_tok) F32 in place at positions pos (n_tok) I32, pairs
 * (x[2i], x[2i+1]) (normal) or (x[i], x[i + n_rot/2]) (neox), optional frequency factors ff
 * (n_rot/2). One invocation per (token, head, pair). The angle is made the way the CPU makes it:
 * theta starts at the position and is multiplied by theta_scale (the host's powf) once per pair,
 * then freq_scale * (theta / ff); cosine and sine are then multiplied by attn_factor (LongRoPE's
 * magnitude correction, 1 for none), as the CPU multiplies them. Sine and cosine are computed
 * here, not by GLSL's sin and cos, whose error Vulkan only bounds on [-pi, pi] (by 2^-11):
 * positions make angles of thousands. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer X { float x[]; };
layout(set = 0, binding = 1) readonly buffer Pos { int pos[]; };
layout(set = 0, binding = 2) readonly buffer FF { float ff[]; };

layout(push_constant) uniform Params {
    uint x_off, x_nb1, x_nb2;   /* bytes, multiples of 4: tensor, head stride, token stride */
    uint pos_off, ff_off, has_ff;
    uint n_head, n_tok, n_pairs, n_rot, neox;
    float theta_scale, freq_scale, attn_factor;
} p;

#include "common.glsl"

/* sin and cos of a within a few ulp for |a| < 2^16 * pi / 2: a = k pi/2 + r with pi/2 in four
 * pieces, the first three short enough that k times each is exact; then the minimax polynomials
 * of Cephes' sinf and cosf on [-pi/4, pi/4]. */
void sin_cos(float a, out float s, out float c)
{
    const float k = roundEven(a * 0.636619772367581343);
    precise float r = a - k * 1.5703125;
    r = r - k * 4.84466552734375e-4;
    r = r + k * 6.407499313354492e-7;
    r = r - k * 9.92093629470503e-10;
    const float z = r * r;
    precise float sr = r + r * z * (-1.6666654611e-1 + z * (8.3321608736e-3 + z * -1.9515295891e-4));
    precise float cr = 1.0 - 0.5 * z + z * z * (4.166664568298827e-2 + z * (-1.388731625493765e-3 + z * 2.443315711809948e-5));
    const int q = int(k) & 3;
    s = q == 0 ? sr : q == 1 ? cr : q == 2 ? -sr : -cr;
    c = q == 0 ? cr : q == 1 ? -sr : q == 2 ? -cr : sr;
}

void main()
{
    const uint g = group_index() * 64u + gl_LocalInvocationID.x;
    if (g >= p.n_pairs * p.n_head * p.n_tok)
        return;
    const uint i = g % p.n_pairs, h = (g / p.n_pairs) % p.n_head, t = g / (p.n_pairs * p.n_head);
    float theta = float(pos[(p.pos_off >> 2) + t]);
    for (uint j = 0u; j < i; j++)
        theta *= p.theta_scale;
    const float f = p.has_ff != 0u ? ff[(p.ff_off >> 2) + i] : 1.0;
    precise float angle = p.freq_scale * div_rn(theta, f);
    float s, c;
    sin_cos(angle, s, c);
    s *= p.attn_factor;
    c *= p.attn_factor;
    const uint base = (p.x_off + t * p.x_nb2 + h * p.x_nb1) >> 2;
    const uint ia = base + (p.neox != 0u ? i : 2u * i);
    const uint ib = p.neox != 0u ? base + i + p.n_rot / 2u : ia + 1u;
    const float a = x[ia], b = x[ib];
    precise float ya = a * c - b * s;
    precise float yb = a * s + b * c;
    x[ia] = ya;
    x[ib] = yb;
}
