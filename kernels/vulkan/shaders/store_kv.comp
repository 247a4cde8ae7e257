#version 450
#extension GL_GOOGLE_include_directive : require
/* STORE_KV: copies src (k, n_tok) F32 rows into the cache rows slots[0..n_tok), converting to the
 * cache type: F32 (one invocation per value), F16 (one per pair of values, so every word has one
 * writer) or Q8_0 (one per block, quantized as the CPU's quant_q8_0). Q8_0 blocks are 34 bytes,
 * so a block shares its first and last words with its neighbours: those are written with atomic
 * AND / OR on the block's own bytes only. Slots outside the cache are skipped, as on the CPU. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Cache { uint cache[]; };
layout(set = 0, binding = 1) readonly buffer Src { float src[]; };
layout(set = 0, binding = 2) readonly buffer Slots { int slots[]; };

layout(push_constant) uniform Params {
    uint s_off, s_nb1;      /* bytes, multiples of 4 */
    uint sl_off;            /* bytes */
    uint c_off, c_nb1;      /* bytes: multiples of 4 for F32 / F16, of 2 for Q8_0 */
    uint k, n_tok, n_slots;
    uint ctype;             /* 0 F32, 1 F16, 8 Q8_0 */
} p;

#include "common.glsl"

void main()
{
    const uint unit = p.ctype == 0u ? 1u : p.ctype == 1u ? 2u : 32u;
    const uint per_row = p.k / unit;
    const uint g = group_index() * 64u + gl_LocalInvocationID.x;
    if (g >= per_row * p.n_tok)
        return;
    const uint t = g / per_row, u = g % per_row;
    const int slot = slots[(p.sl_off >> 2) + t];
    if (slot < 0 || uint(slot) >= p.n_slots)
        return;
    const uint x = ((p.s_off + t * p.s_nb1) >> 2) + u * unit;
    const uint row = p.c_off + uint(slot) * p.c_nb1;
    if (p.ctype == 0u) {
        cache[(row >> 2) + u] = floatBitsToUint(src[x]);
        return;
    }
    if (p.ctype == 1u) {
        cache[(row >> 2) + u] = f32_to_f16(src[x]) | (f32_to_f16(src[x + 1u]) << 16);
        return;
    }
    float amax = 0.0;
    for (uint j = 0u; j < 32u; j++)
        amax = max(amax, abs(src[x + j]));
    const float d = div_rn(amax, 127.0);
    const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    const uint dh = f32_to_f16(d);
    uint q[8];
    for (uint w = 0u; w < 8u; w++) {
        q[w] = 0u;
        for (uint b = 0u; b < 4u; b++)
            q[w] |= (uint(int(round_away(src[x + 4u * w + b] * id))) & 0xffu) << (8u * b);
    }
    /* Byte i of the block: d (2 bytes, little endian), then the 32 quants. */
    const uint o = row + 34u * u;
    for (uint w = o >> 2; w <= (o + 33u) >> 2; w++) {
        uint val = 0u, mask = 0u;
        for (uint b = 0u; b < 4u; b++) {
            const uint at = 4u * w + b;
            if (at < o || at >= o + 34u)
                continue;
            const uint i = at - o;
            const uint byte = i < 2u ? (dh >> (8u * i)) & 0xffu : (q[(i - 2u) >> 2] >> (8u * ((i - 2u) & 3u))) & 0xffu;
            val |= byte << (8u * b);
            mask |= 0xffu << (8u * b);
        }
        if (mask == 0xffffffffu) {
            cache[w] = val;
        } else {
            atomicAnd(cache[w], ~mask);
            atomicOr(cache[w], val);
        }
    }
}
