#version 450
#extension GL_GOOGLE_include_directive : require
/* The activation rows of a product, converted to the format its weight's dot product takes
 * (QTYPE: ACT_F16, ACT_BF16, ACT_Q8_0, ACT_Q8_1 or ACT_Q8_K of wsizes.glsl), with the CPU
 * reference's arithmetic so the quants are the same bytes kiri_cpu_quantize_row writes: one
 * invocation converts one block (one value for F16 / BF16). src (k, n_tok) F32 rows;
 * dst rows of (k / block) * words-per-block words, one after the other. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { uint dst[]; };
layout(set = 0, binding = 1) readonly buffer Src { float src[]; };

layout(push_constant) uniform Params {
    uint s_off, s_stride;   /* bytes, multiples of 4 */
    uint d_off;             /* bytes, a multiple of 4 */
    uint d_row_words;       /* words per converted row */
    uint k, n_tok;
} p;

#include "common.glsl"

#define WTYPE 0 /* only for the ACT_* names */
#include "wsizes.glsl"

#if QTYPE == ACT_Q8_0 || QTYPE == ACT_Q8_1
#define BS 32u
#elif QTYPE == ACT_Q8_K
#define BS 256u
#else
#define BS 1u
#endif

#if QTYPE == ACT_Q8_0
#define BW 9u
#elif QTYPE == ACT_Q8_1
#define BW 10u
#elif QTYPE == ACT_Q8_K
#define BW 81u
#else
#define BW 1u
#endif

void main()
{
    const uint nb = p.k / BS;
    const uint g = group_index() * 64u + gl_LocalInvocationID.x;
    if (g >= nb * p.n_tok)
        return;
    const uint t = g / nb, b = g % nb;
    const uint x = ((p.s_off + t * p.s_stride) >> 2) + b * BS;
    const uint o = (p.d_off >> 2) + t * p.d_row_words + b * BW;
#if QTYPE == ACT_F16
    dst[o] = floatBitsToUint(f16_round(src[x]));
#elif QTYPE == ACT_BF16
    dst[o] = floatBitsToUint(bf16_round(src[x]));
#elif QTYPE == ACT_Q8_0 || QTYPE == ACT_Q8_1
    float amax = 0.0;
    for (uint j = 0u; j < 32u; j++)
        amax = max(amax, abs(src[x + j]));
    const float d = div_rn(amax, 127.0);
    const float id = d != 0.0 ? div_rn(1.0, d) : 0.0;
    int sum = 0;
    for (uint w = 0u; w < 8u; w++) {
        uint word = 0u;
        for (uint k = 0u; k < 4u; k++) {
            const int q = int(round_away(src[x + 4u * w + k] * id));
            sum += q;
            word |= (uint(q) & 0xffu) << (8u * k);
        }
        dst[o + w] = word;
    }
    dst[o + 8u] = floatBitsToUint(f16_round(d));
#if QTYPE == ACT_Q8_1
    dst[o + 9u] = floatBitsToUint(f16_round(float(sum) * d));
#endif
#else /* ACT_Q8_K: the value of largest magnitude (the first on ties) maps to -127 */
    float amax = 0.0, vmax = 0.0;
    for (uint j = 0u; j < 256u; j++) {
        const float v = src[x + j];
        if (amax < abs(v)) {
            amax = abs(v);
            vmax = v;
        }
    }
    if (amax == 0.0) {
        for (uint w = 0u; w < 81u; w++)
            dst[o + w] = 0u;
        return;
    }
    const float iscale = div_rn(-127.0, vmax);
    for (uint gi = 0u; gi < 16u; gi++) {
        int s = 0;
        for (uint w = 0u; w < 4u; w++) {
            uint word = 0u;
            for (uint k = 0u; k < 4u; k++) {
                const int q = min(int(roundEven(iscale * src[x + 16u * gi + 4u * w + k])), 127);
                s += q;
                word |= (uint(q) & 0xffu) << (8u * k);
            }
            dst[o + 4u * gi + w] = word;
        }
        dst[o + 65u + gi] = uint(s);
    }
    dst[o + 64u] = floatBitsToUint(div_rn(1.0, iscale));
#endif
}
