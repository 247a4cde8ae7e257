#version 450
#extension GL_GOOGLE_include_directive : require
/* GET_ROWS (compiled once per source type, WTYPE): dst (ncols, n) F32 = rows ids[0..n) of src,
 * dequantized exactly as kiri_cpu_dequantize_row. One workgroup per id. A source split into
 * chunks runs one dispatch per chunk; ids outside [row0, row0 + rows) belong to another chunk
 * (or to no row at all, and are left alone as the CPU leaves them). */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { uint dst[]; };
layout(set = 0, binding = 1) readonly buffer Src { uint src[]; };
layout(set = 0, binding = 2) readonly buffer Ids { int ids[]; };

layout(push_constant) uniform Params {
    uint s_off, s_stride;   /* bytes: the chunk's first row, between rows */
    uint i_off;             /* bytes */
    uint d_off, d_stride;   /* bytes, multiples of 4 */
    uint ncols;             /* values per row */
    uint rows, row0;        /* rows of this chunk, the first one's id */
    uint n;                 /* ids */
} p;

#include "common.glsl"
KIRI_READERS(sr, src)
#define WU8(o) sr_u8(o)
#define WU16(o) sr_u16(o)
#define WU32(o) sr_u32(o)
#define WF32(o) sr_f32(o)
#define AW(i) 0u
#define AF(i) 0.0
#include "wtypes.glsl"

void main()
{
    const uint r = group_index();
    if (r >= p.n)
        return;
    const int id = ids[(p.i_off >> 2) + r];
    if (id < int(p.row0) || id >= int(p.row0 + p.rows))
        return;
    const uint row = p.s_off + uint(id - int(p.row0)) * p.s_stride;
    const uint out_row = (p.d_off + r * p.d_stride) >> 2;
    for (uint i = gl_LocalInvocationID.x; i < p.ncols; i += 64u)
        dst[out_row + i] = floatBitsToUint(wval(row + (i / WBS) * WBB, i % WBS));
}
