#version 450
#extension GL_GOOGLE_include_directive : require
/* MATMUL for one token (compiled once per weight type, WTYPE): dst (rows) F32 = weight (k, rows) of
 * WTYPE times the activation row, already in the weight's activation format (wtypes.glsl). One
 * workgroup per output row: its invocations compute 64 block products at a time and the first
 * adds them up in the order of k, as the CPU reference does, so for the quantized types the result
 * is the reference's to the bit. A weight split into chunks (one storage binding each) is run one
 * chunk per dispatch: row0 is the chunk's first row in dst. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { uint dst[]; };
layout(set = 0, binding = 1) readonly buffer Wgt { uint wgt[]; };
layout(set = 0, binding = 2) readonly buffer Act { uint act[]; };

layout(push_constant) uniform Params {
    uint w_off, w_stride;   /* bytes: the chunk's first row, between rows */
    uint a_off, a_stride;   /* bytes (a multiple of 4): the activation row; a_stride unused */
    uint d_off, d_stride;   /* bytes: dst row 0; d_stride unused */
    uint k;                 /* values per row */
    uint rows, row0;        /* rows of this chunk and the first one's index in dst */
    uint n_tok;             /* 1 */
} p;

#include "common.glsl"
KIRI_READERS(wr, wgt)
#define WU8(o) wr_u8(o)
#define WU16(o) wr_u16(o)
#define WU32(o) wr_u32(o)
#define WF32(o) wr_f32(o)
#define AW(i) act[i]
#define AF(i) uintBitsToFloat(act[i])
#include "wtypes.glsl"

shared float partial[64];

void main()
{
    const uint r = group_index(), tid = gl_LocalInvocationID.x;
    if (r >= p.rows)
        return;
    const uint nb = (p.k + WBS - 1u) / WBS, wrow = p.w_off + r * p.w_stride, arow = p.a_off >> 2;
    float acc = 0.0;
    for (uint b0 = 0u; b0 < nb; b0 += 64u) {
        const uint b = b0 + tid;
        partial[tid] = b < nb ? wdot(wrow + b * WBB, arow + b * ABW, min(WBS, p.k - b * WBS)) : 0.0;
        barrier();
        if (tid == 0u)
            for (uint j = 0u; j < min(64u, nb - b0); j++)
                acc += partial[j];
        barrier();
    }
    if (tid == 0u)
        dst[(p.d_off >> 2) + p.row0 + r] = floatBitsToUint(acc);
}
