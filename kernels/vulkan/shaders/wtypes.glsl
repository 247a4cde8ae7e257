/* The weight types of products and row look-ups, one section per GGUF type, selected by WTYPE
 * (the type's GGUF id; geometry in wsizes.glsl). Include after common.glsl and after defining
 *   WU8(o), WU16(o), WU32(o), WF32(o)  the weight's bytes at byte offset o
 *   AW(i), AF(i)                       word i of the activations, as uint or float
 * Each section defines
 *   wdot(wo, ao, nv)  the dot product of the weight block at byte wo with the activation block at
 *                     word ao; nv (valid values) matters only for the plain types
 *   wval(wo, i)       value i of the weight block at byte wo, exactly as kiri_cpu_dequantize_row
 *
 * The products follow the CPU reference (kernels/cpu/quants.c): the activations are converted to
 * the type the weight's dot product takes (Q8_0, Q8_1, Q8_K, or rounded to F16 / BF16) by
 * quantize.comp, the integer sums of a block are exact, and each block's float formula is the
 * reference's, operation for operation (`precise` keeps the compiler from fusing them). Only the
 * order in which the block results are added differs.
 */
#include "wsizes.glsl"

/* ---- shared pieces ---- */

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block whose 12 scale bytes
 * start at byte so (get_scale_min_k4 in quants.c). */
void scale_min_k4(uint so, uint j, out uint sc, out uint m)
{
    if (j < 4u) {
        sc = WU8(so + j) & 63u;
        m = WU8(so + j + 4u) & 63u;
    } else {
        sc = (WU8(so + j + 4u) & 0xfu) | ((WU8(so + j - 4u) >> 6) << 4);
        m = (WU8(so + j + 4u) >> 4) | ((WU8(so + j) >> 6) << 4);
    }
}

/* Sum of the 16 Q8_K quants of group g of the activation block at word ao. */
int q8k_bsum(uint ao, uint g) { return int(AW(ao + 65u + g)); }

#if WTYPE == 0 /* ---------------------------------------------------------------- F32 */
float wdot(uint wo, uint ao, uint nv)
{
    float s = 0.0;
    for (uint i = 0u; i < nv; i++)
        s += WF32(wo + 4u * i) * AF(ao + i);
    return s;
}
float wval(uint wo, uint i) { return WF32(wo + 4u * i); }

#elif WTYPE == 1 /* -------------------------------------------------------------- F16 */
float wdot(uint wo, uint ao, uint nv)
{
    float s = 0.0;
    for (uint i = 0u; i < nv; i++)
        s += f16_to_f32(WU16(wo + 2u * i)) * AF(ao + i);
    return s;
}
float wval(uint wo, uint i) { return f16_to_f32(WU16(wo + 2u * i)); }

#elif WTYPE == 30 /* ------------------------------------------------------------ BF16 */
float wdot(uint wo, uint ao, uint nv)
{
    float s = 0.0;
    for (uint i = 0u; i < nv; i++)
        s += bf16_to_f32(WU16(wo + 2u * i)) * AF(ao + i);
    return s;
}
float wval(uint wo, uint i) { return bf16_to_f32(WU16(wo + 2u * i)); }

#elif WTYPE == 2 /* ------------------------------------------------------------- Q4_0 */
/* d (f16), 16 bytes: value j in the low nibble of byte j, value j + 16 in its high nibble. */
float wdot(uint wo, uint ao, uint nv)
{
    int sumi = 0;
    for (uint i = 0u; i < 4u; i++) {
        const uint q = WU32(wo + 2u + 4u * i), a0 = AW(ao + i), a1 = AW(ao + 4u + i);
        for (uint k = 0u; k < 4u; k++)
            sumi += (int((q >> (8u * k)) & 0xfu) - 8) * sbyte(a0, k) +
                    (int((q >> (8u * k + 4u)) & 0xfu) - 8) * sbyte(a1, k);
    }
    precise float r = float(sumi) * (f16_to_f32(WU16(wo)) * AF(ao + 8u));
    return r;
}
float wval(uint wo, uint i)
{
    const uint q = (WU8(wo + 2u + (i & 15u)) >> ((i >> 4) << 2)) & 0xfu;
    return f16_to_f32(WU16(wo)) * float(int(q) - 8);
}

#elif WTYPE == 3 /* ------------------------------------------------------------- Q4_1 */
/* d, m (f16), 16 bytes of nibbles as Q4_0; value = d q + m. */
float wdot(uint wo, uint ao, uint nv)
{
    int sumi = 0;
    for (uint i = 0u; i < 4u; i++) {
        const uint q = WU32(wo + 4u + 4u * i), a0 = AW(ao + i), a1 = AW(ao + 4u + i);
        for (uint k = 0u; k < 4u; k++)
            sumi += int((q >> (8u * k)) & 0xfu) * sbyte(a0, k) + int((q >> (8u * k + 4u)) & 0xfu) * sbyte(a1, k);
    }
    precise float r = float(sumi) * (f16_to_f32(WU16(wo)) * AF(ao + 8u)) + f16_to_f32(WU16(wo + 2u)) * AF(ao + 9u);
    return r;
}
float wval(uint wo, uint i)
{
    const uint q = (WU8(wo + 4u + (i & 15u)) >> ((i >> 4) << 2)) & 0xfu;
    precise float r = f16_to_f32(WU16(wo)) * float(q) + f16_to_f32(WU16(wo + 2u));
    return r;
}

#elif WTYPE == 6 /* ------------------------------------------------------------- Q5_0 */
/* d (f16), qh (32 high bits, little endian), 16 bytes of nibbles; value = d (q - 16). */
float wdot(uint wo, uint ao, uint nv)
{
    const uint qh = WU32(wo + 2u);
    int sumi = 0;
    for (uint i = 0u; i < 4u; i++) {
        const uint q = WU32(wo + 6u + 4u * i), a0 = AW(ao + i), a1 = AW(ao + 4u + i);
        for (uint k = 0u; k < 4u; k++) {
            const uint j = 4u * i + k;
            const int q0 = int(((q >> (8u * k)) & 0xfu) | (((qh >> j) & 1u) << 4)) - 16;
            const int q1 = int(((q >> (8u * k + 4u)) & 0xfu) | (((qh >> (j + 16u)) & 1u) << 4)) - 16;
            sumi += q0 * sbyte(a0, k) + q1 * sbyte(a1, k);
        }
    }
    precise float r = float(sumi) * (f16_to_f32(WU16(wo)) * AF(ao + 8u));
    return r;
}
float wval(uint wo, uint i)
{
    const uint qh = WU32(wo + 2u);
    const uint q = ((WU8(wo + 6u + (i & 15u)) >> ((i >> 4) << 2)) & 0xfu) | (((qh >> i) & 1u) << 4);
    return f16_to_f32(WU16(wo)) * float(int(q) - 16);
}

#elif WTYPE == 7 /* ------------------------------------------------------------- Q5_1 */
float wdot(uint wo, uint ao, uint nv)
{
    const uint qh = WU32(wo + 4u);
    int sumi = 0;
    for (uint i = 0u; i < 4u; i++) {
        const uint q = WU32(wo + 8u + 4u * i), a0 = AW(ao + i), a1 = AW(ao + 4u + i);
        for (uint k = 0u; k < 4u; k++) {
            const uint j = 4u * i + k;
            const int q0 = int(((q >> (8u * k)) & 0xfu) | (((qh >> j) & 1u) << 4));
            const int q1 = int(((q >> (8u * k + 4u)) & 0xfu) | (((qh >> (j + 16u)) & 1u) << 4));
            sumi += q0 * sbyte(a0, k) + q1 * sbyte(a1, k);
        }
    }
    precise float r = float(sumi) * (f16_to_f32(WU16(wo)) * AF(ao + 8u)) + f16_to_f32(WU16(wo + 2u)) * AF(ao + 9u);
    return r;
}
float wval(uint wo, uint i)
{
    const uint qh = WU32(wo + 4u);
    const uint q = ((WU8(wo + 8u + (i & 15u)) >> ((i >> 4) << 2)) & 0xfu) | (((qh >> i) & 1u) << 4);
    precise float r = f16_to_f32(WU16(wo)) * float(q) + f16_to_f32(WU16(wo + 2u));
    return r;
}

#elif WTYPE == 8 /* ------------------------------------------------------------- Q8_0 */
float wdot(uint wo, uint ao, uint nv)
{
    int sumi = 0;
    for (uint i = 0u; i < 8u; i++) {
        const uint q = WU32(wo + 2u + 4u * i), a = AW(ao + i);
        for (uint k = 0u; k < 4u; k++)
            sumi += sbyte(q, k) * sbyte(a, k);
    }
    precise float r = float(sumi) * (f16_to_f32(WU16(wo)) * AF(ao + 8u));
    return r;
}
float wval(uint wo, uint i)
{
    return f16_to_f32(WU16(wo)) * float(bitfieldExtract(int(WU8(wo + 2u + i)), 0, 8));
}

#elif WTYPE == 12 /* ------------------------------------------------------------ Q4_K */
/* d, dmin (f16), 12 bytes of 6-bit scales and mins, 128 bytes of nibbles in chunks of 64 values:
 * 32 low nibbles, then the 32 high nibbles of the same bytes. */
float wdot(uint wo, uint ao, uint nv)
{
    int sumi = 0, summ = 0;
    for (uint c = 0u; c < 4u; c++) {
        uint sc1, m1, sc2, m2;
        scale_min_k4(wo + 4u, 2u * c, sc1, m1);
        scale_min_k4(wo + 4u, 2u * c + 1u, sc2, m2);
        int s1 = 0, s2 = 0;
        for (uint i = 0u; i < 8u; i++) {
            const uint q = WU32(wo + 16u + 32u * c + 4u * i);
            const uint a0 = AW(ao + 16u * c + i), a1 = AW(ao + 16u * c + 8u + i);
            for (uint k = 0u; k < 4u; k++) {
                s1 += int((q >> (8u * k)) & 0xfu) * sbyte(a0, k);
                s2 += int((q >> (8u * k + 4u)) & 0xfu) * sbyte(a1, k);
            }
        }
        sumi += int(sc1) * s1 + int(sc2) * s2;
        summ += int(m1) * (q8k_bsum(ao, 4u * c) + q8k_bsum(ao, 4u * c + 1u)) +
                int(m2) * (q8k_bsum(ao, 4u * c + 2u) + q8k_bsum(ao, 4u * c + 3u));
    }
    const float da = AF(ao + 64u);
    precise float r = da * f16_to_f32(WU16(wo)) * float(sumi) - da * f16_to_f32(WU16(wo + 2u)) * float(summ);
    return r;
}
float wval(uint wo, uint i)
{
    uint sc, m;
    scale_min_k4(wo + 4u, i >> 5, sc, m);
    precise float d1 = f16_to_f32(WU16(wo)) * float(sc);
    precise float m1 = f16_to_f32(WU16(wo + 2u)) * float(m);
    const uint q = (WU8(wo + 16u + 32u * (i >> 6) + (i & 31u)) >> (((i >> 5) & 1u) << 2)) & 0xfu;
    precise float r = d1 * float(q) - m1;
    return r;
}

#elif WTYPE == 13 /* ------------------------------------------------------------ Q5_K */
/* As Q4_K, with 32 bytes qh after the scales: bit j of qh[l] is the fifth bit of value l of
 * sub-block j. */
float wdot(uint wo, uint ao, uint nv)
{
    int sumi = 0, summ = 0;
    for (uint c = 0u; c < 4u; c++) {
        uint sc1, m1, sc2, m2;
        scale_min_k4(wo + 4u, 2u * c, sc1, m1);
        scale_min_k4(wo + 4u, 2u * c + 1u, sc2, m2);
        int s1 = 0, s2 = 0;
        for (uint i = 0u; i < 8u; i++) {
            const uint q = WU32(wo + 48u + 32u * c + 4u * i), h = WU32(wo + 16u + 4u * i);
            const uint a0 = AW(ao + 16u * c + i), a1 = AW(ao + 16u * c + 8u + i);
            for (uint k = 0u; k < 4u; k++) {
                const uint hb = h >> (8u * k);
                s1 += int(((q >> (8u * k)) & 0xfu) | (((hb >> (2u * c)) & 1u) << 4)) * sbyte(a0, k);
                s2 += int(((q >> (8u * k + 4u)) & 0xfu) | (((hb >> (2u * c + 1u)) & 1u) << 4)) * sbyte(a1, k);
            }
        }
        sumi += int(sc1) * s1 + int(sc2) * s2;
        summ += int(m1) * (q8k_bsum(ao, 4u * c) + q8k_bsum(ao, 4u * c + 1u)) +
                int(m2) * (q8k_bsum(ao, 4u * c + 2u) + q8k_bsum(ao, 4u * c + 3u));
    }
    const float da = AF(ao + 64u);
    precise float r = da * f16_to_f32(WU16(wo)) * float(sumi) - da * f16_to_f32(WU16(wo + 2u)) * float(summ);
    return r;
}
float wval(uint wo, uint i)
{
    uint sc, m;
    const uint j = i >> 5, l = i & 31u;
    scale_min_k4(wo + 4u, j, sc, m);
    precise float d1 = f16_to_f32(WU16(wo)) * float(sc);
    precise float m1 = f16_to_f32(WU16(wo + 2u)) * float(m);
    const uint q = ((WU8(wo + 48u + 32u * (i >> 6) + l) >> ((j & 1u) << 2)) & 0xfu) |
                   (((WU8(wo + 16u + l) >> j) & 1u) << 4);
    precise float r = d1 * float(q) - m1;
    return r;
}

#elif WTYPE == 14 /* ------------------------------------------------------------ Q6_K */
/* 128 bytes ql (low 4 bits), 64 bytes qh (high 2 bits), 16 int8 scales (one per 16 values),
 * d (f16). Each half of 128 values: value l + 32 k (k = 0..3) takes the low (k < 2) or high
 * nibble of ql[l + 32 (k & 1)] and bits 2k, 2k + 1 of qh[l]. */
float wdot(uint wo, uint ao, uint nv)
{
    int sumi = 0;
    for (uint g = 0u; g < 16u; g++) {
        const uint h = g >> 3, k = (g & 7u) >> 1, l0 = (g & 1u) << 4;
        const uint qlo = wo + 64u * h + l0 + 32u * (k & 1u), qho = wo + 128u + 32u * h + l0;
        const uint sl = (k >> 1) << 2, sh = 2u * k;
        int sg = 0;
        for (uint w = 0u; w < 4u; w++) {
            const uint ql = WU32(qlo + 4u * w), qh = WU32(qho + 4u * w), a = AW(ao + 4u * g + w);
            for (uint b = 0u; b < 4u; b++) {
                const uint q = ((ql >> (8u * b + sl)) & 0xfu) | (((qh >> (8u * b + sh)) & 3u) << 4);
                sg += (int(q) - 32) * sbyte(a, b);
            }
        }
        sumi += bitfieldExtract(int(WU8(wo + 192u + g)), 0, 8) * sg;
    }
    precise float r = AF(ao + 64u) * f16_to_f32(WU16(wo + 208u)) * float(sumi);
    return r;
}
float wval(uint wo, uint i)
{
    const uint h = i >> 7, k = (i & 127u) >> 5, l = i & 31u;
    const uint ql = WU8(wo + 64u * h + l + 32u * (k & 1u)) >> ((k >> 1) << 2);
    const uint qh = WU8(wo + 128u + 32u * h + l) >> (2u * k);
    const int q = int((ql & 0xfu) | ((qh & 3u) << 4)) - 32;
    precise float dg = f16_to_f32(WU16(wo + 208u)) * float(bitfieldExtract(int(WU8(wo + 192u + (i >> 4))), 0, 8));
    return dg * float(q);
}

#endif
