#version 450
#extension GL_GOOGLE_include_directive : require
/* MATMUL for several tokens (compiled once per weight type, WTYPE): dst (rows, n_tok) F32 = weight
 * (k, rows) of WTYPE times n_tok activation rows in the weight's activation format. A workgroup
 * computes a tile of 32 rows x 16 tokens: it walks k in steps of KSB blocks, copying the weight
 * bytes of its 32 rows (realigned to words) and the activation words of its 16 tokens into
 * shared memory, then each invocation adds the block products of one row and 8 tokens. Block
 * results are added in the order of k, as the CPU reference adds them. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { uint dst[]; };
layout(set = 0, binding = 1) readonly buffer Wgt { uint wgt[]; };
layout(set = 0, binding = 2) readonly buffer Act { uint act[]; };

layout(push_constant) uniform Params {
    uint w_off, w_stride;   /* bytes */
    uint a_off, a_stride;   /* bytes, multiples of 4 */
    uint d_off, d_stride;   /* bytes, multiples of 4 */
    uint k;
    uint rows, row0;
    uint n_tok;
} p;

#include "common.glsl"
KIRI_READERS(wr, wgt)

#define TR 32u
#define TT 16u

#include "wsizes.glsl"

#define WROW_WORDS ((KSB * WBB + 3u) / 4u)   /* weight words of one row per step */
#define AROW_WORDS (KSB * ABW)               /* activation words of one token per step */

shared uint wtile[TR * WROW_WORDS + 1u];
shared uint atile[TT * AROW_WORDS];

KIRI_READERS(ws, wtile)
#define WU8(o) ws_u8(o)
#define WU16(o) ws_u16(o)
#define WU32(o) ws_u32(o)
#define WF32(o) ws_f32(o)
#define AW(i) atile[i]
#define AF(i) uintBitsToFloat(atile[i])
#include "wtypes.glsl"

void main()
{
    const uint tid = gl_LocalInvocationID.x;
    const uint row_tiles = (p.rows + TR - 1u) / TR;
    const uint g = group_index();
    if (g >= row_tiles * ((p.n_tok + TT - 1u) / TT))
        return;
    const uint r0 = (g % row_tiles) * TR, t0 = (g / row_tiles) * TT;
    const uint nb = (p.k + WBS - 1u) / WBS;
    const uint row_bytes = WPLAIN != 0 ? p.k * (WBB / WBS) : nb * WBB;
    const uint my_row = tid % TR, my_tok = (tid / TR) * 8u;
    float acc[8] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);

    for (uint kb = 0u; kb < nb; kb += KSB) {
        /* The weight bytes [kb * WBB, kb * WBB + KSB * WBB) of each row, as words. */
        for (uint i = tid; i < TR * WROW_WORDS; i += 64u) {
            const uint r = i / WROW_WORDS, w = i % WROW_WORDS, byte = kb * WBB + 4u * w;
            wtile[i] = r0 + r < p.rows && byte < row_bytes ? wr_u32(p.w_off + (r0 + r) * p.w_stride + byte) : 0u;
        }
        /* The activation words of the same blocks of each token. */
        for (uint i = tid; i < TT * AROW_WORDS; i += 64u) {
            const uint t = i / AROW_WORDS, w = i % AROW_WORDS;
            const bool inside = WPLAIN != 0 ? kb * WBS + w < p.k : kb + w / ABW < nb;
            atile[i] = t0 + t < p.n_tok && inside ? act[((p.a_off + (t0 + t) * p.a_stride) >> 2) + kb * ABW + w] : 0u;
        }
        barrier();
        for (uint j = 0u; j < KSB && kb + j < nb; j++) {
            const uint nv = min(WBS, p.k - (kb + j) * WBS);
            for (uint tt = 0u; tt < 8u; tt++)
                acc[tt] += wdot(my_row * WROW_WORDS * 4u + j * WBB, (my_tok + tt) * AROW_WORDS + j * ABW, nv);
        }
        barrier();
    }
    if (r0 + my_row >= p.rows)
        return;
    for (uint tt = 0u; tt < 8u; tt++) {
        const uint t = t0 + my_tok + tt;
        if (t < p.n_tok)
            dst[((p.d_off + t * p.d_stride) >> 2) + p.row0 + r0 + my_row] = floatBitsToUint(acc[tt]);
    }
}
