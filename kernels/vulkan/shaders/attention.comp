#version 450
#extension GL_GOOGLE_include_directive : require
/* ATTENTION: dst (D*H, n_tok) F32 = causal attention of the queries q (D, H, n_tok) over the keys
 * and values cached in slots found through block tables: token t attends to its first
 * meta[2t] keys; key j lives in slot table[j / block_size] * block_size + j % block_size, table
 * starting at entry meta[2t + 1] of the tables. With a sliding window (window > 0) the token
 * attends only keys [max(0, n - window), n) of its n: the loops start there, so table entries of
 * earlier blocks (which may name blocks since reused) are never read. Query head h reads cache
 * head h / (H / Hkv).
 * Caches F32, F16 or Q8_0, read as kiri_cpu_attend_head reads them: the query and the attention
 * weights rounded to F16 for a reduced-precision cache, dot products and the weighted sum of
 * values added in key order.
 *
 * One workgroup per (token, head). A first pass over the keys finds the largest score and the
 * softmax denominator (each invocation keeps a running max and sum over every 64th key, then a
 * tree combines them); a second pass recomputes the scores 64 keys at a time, turns them into
 * weights in shared memory, and each invocation adds weight x value over those keys for its own
 * dimensions. */
layout(local_size_x = 64) in;

layout(set = 0, binding = 0) buffer Dst { float dst[]; };
layout(set = 0, binding = 1) readonly buffer Q { float qbuf[]; };
layout(set = 0, binding = 2) readonly buffer K { uint kc[]; };
layout(set = 0, binding = 3) readonly buffer V { uint vc[]; };
layout(set = 0, binding = 4) readonly buffer Meta { int meta[]; };
layout(set = 0, binding = 5) readonly buffer Tables { int tables[]; };

layout(push_constant) uniform Params {
    uint q_off, q_nb1, q_nb2;   /* bytes, multiples of 4: head and token strides */
    uint k_off, k_nb1;          /* bytes: cache tensor, slot stride */
    uint v_off, v_nb1;
    uint m_off, t_off;          /* bytes */
    uint d_off, d_nb1;          /* bytes, multiples of 4 */
    uint n_head, n_head_kv, head_dim, block_size, n_tok, n_slots;
    uint kv_type;               /* 0 F32, 1 F16, 8 Q8_0 */
    float scale;
    uint window;                /* keys a token attends at most; 0: all */
} p;

#include "common.glsl"
KIRI_READERS(kr, kc)
KIRI_READERS(vr, vc)

#define MAX_D 1024u

shared float qs[MAX_D];
shared float wsh[64];
shared uint ssh[64];
shared float red_m[64], red_l[64];

uint row_bytes() { return p.kv_type == 0u ? 4u * p.head_dim : p.kv_type == 1u ? 2u * p.head_dim : p.head_dim / 32u * 34u; }

uint slot_of(uint table, uint j)
{
    return uint(tables[(p.t_off >> 2) + table + j / p.block_size]) * p.block_size + j % p.block_size;
}

/* q . key (sequential over the dimensions, as the CPU) times scale. */
float score(uint krow)
{
    float s = 0.0;
    if (p.kv_type == 0u) {
        for (uint i = 0u; i < p.head_dim; i++)
            s += qs[i] * kr_f32(krow + 4u * i);
    } else if (p.kv_type == 1u) {
        for (uint i = 0u; i < p.head_dim; i++)
            s += qs[i] * f16_to_f32(kr_u16(krow + 2u * i));
    } else {
        for (uint b = 0u; b < p.head_dim / 32u; b++) {
            const uint blk = krow + 34u * b;
            float bs = 0.0;
            for (uint i = 0u; i < 32u; i++)
                bs += qs[32u * b + i] * float(bitfieldExtract(int(kr_u8(blk + 2u + i)), 0, 8));
            s += bs * f16_to_f32(kr_u16(blk));
        }
    }
    return s * p.scale;
}

/* Value dimension d of the cache row at byte vrow times the weight w (Q8_0: (d_block * w) * q). */
float weighted_value(uint vrow, uint d, float w)
{
    if (p.kv_type == 0u)
        return w * vr_f32(vrow + 4u * d);
    if (p.kv_type == 1u)
        return w * f16_to_f32(vr_u16(vrow + 2u * d));
    const uint blk = vrow + 34u * (d / 32u);
    precise float dv = f16_to_f32(vr_u16(blk)) * w;
    return dv * float(bitfieldExtract(int(vr_u8(blk + 2u + d % 32u)), 0, 8));
}

void main()
{
    const uint g = group_index(), tid = gl_LocalInvocationID.x;
    if (g >= p.n_tok * p.n_head)
        return;
    const uint t = g / p.n_head, h = g % p.n_head;
    const uint hk = h / (p.n_head / p.n_head_kv);
    const uint D = p.head_dim;
    const uint qrow = (p.q_off + t * p.q_nb2 + h * p.q_nb1) >> 2;
    for (uint i = tid; i < D; i += 64u)
        qs[i] = p.kv_type == 0u ? qbuf[qrow + i] : f16_round(qbuf[qrow + i]);
    /* A windowed token's key count may pass the cache's slots (a windowed pool keeps only the
     * windows): only the keys it reads must fit. */
    int nk = meta[(p.m_off >> 2) + 2u * t];
    if (nk < 0)
        nk = 0;
    const uint j_lo = p.window != 0u && uint(nk) > p.window ? uint(nk) - p.window : 0u;
    if (uint(nk) - j_lo > p.n_slots)
        nk = int(j_lo);
    const uint n_kv = uint(nk), table = uint(meta[(p.m_off >> 2) + 2u * t + 1u]);
    const uint kbase = p.k_off + hk * row_bytes(), vbase = p.v_off + hk * row_bytes();
    barrier();

    /* Pass 1: the largest score and the sum of exp(score - largest). */
    float m = -1.0 / 0.0, l = 0.0;
    for (uint j = j_lo + tid; j < n_kv; j += 64u) {
        const float s = score(kbase + slot_of(table, j) * p.k_nb1);
        if (s > m) {
            l = l * exp(m - s) + 1.0;
            m = s;
        } else {
            l += exp(s - m);
        }
    }
    red_m[tid] = m;
    red_l[tid] = l;
    barrier();
    for (uint half_ = 32u; half_ > 0u; half_ >>= 1) {
        if (tid < half_) {
            const float m1 = red_m[tid], m2 = red_m[tid + half_];
            const float l1 = red_l[tid], l2 = red_l[tid + half_];
            const float mm = max(m1, m2);
            red_m[tid] = mm;
            red_l[tid] = (l1 > 0.0 ? l1 * exp(m1 - mm) : 0.0) + (l2 > 0.0 ? l2 * exp(m2 - mm) : 0.0);
        }
        barrier();
    }
    const float mx = red_m[0], sum = red_l[0];
    const float inv = sum > 0.0 ? div_rn(1.0, sum) : 0.0;

    /* Pass 2: out[d] = sum over keys of weight * value, keys in order. */
    float acc[MAX_D / 64u];
    for (uint i = 0u; i < MAX_D / 64u; i++)
        acc[i] = 0.0;
    for (uint j0 = j_lo; j0 < n_kv; j0 += 64u) {
        const uint j = j0 + tid;
        barrier();
        if (j < n_kv) {
            const uint slot = slot_of(table, j);
            float w = exp(score(kbase + slot * p.k_nb1) - mx) * inv;
            if (p.kv_type != 0u)
                w = f16_round(w);
            wsh[tid] = w;
            ssh[tid] = slot;
        }
        barrier();
        const uint nj = min(64u, n_kv - j0);
        for (uint i = 0u; i * 64u + tid < D; i++) {
            const uint d = i * 64u + tid;
            for (uint jj = 0u; jj < nj; jj++)
                acc[i] += weighted_value(vbase + ssh[jj] * p.v_nb1, d, wsh[jj]);
        }
    }
    const uint orow = (p.d_off + t * p.d_nb1) >> 2;
    for (uint i = 0u; i * 64u + tid < D; i++)
        dst[orow + h * D + i * 64u + tid] = acc[i];
}
