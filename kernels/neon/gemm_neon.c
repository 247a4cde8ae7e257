/* ARM NEON tiles of matrix products (kiri_gemm_fn) for the weight types of the common model
 * files: Q4_0 and Q8_0 against Q8_0 activations, Q4_K and Q6_K (Q4_K_M models) against Q8_K,
 * each with the 8-bit dot product instructions: SDOT (Armv8.2 dotprod) and SMMLA (Armv8.6 i8mm,
 * 8-bit matrix multiply).
 *
 * A product spends its time in the integer sums of quants times activations. Each weight block
 * is unpacked once per micro-tile and used for every token of it in registers; the token-side
 * values that do not depend on the row (the activation scales as floats, the activation sums the
 * K-quants need, for SMMLA also the activations rearranged into token pairs) are computed once
 * per group of tokens and a chunk of blocks, and reused for every row of the tile. Two kinds of
 * micro-tile:
 * - SDOT: 4 weight rows x 1 to 4 tokens. Per block (K-quants: per sub-block) and token, the four
 *   rows' SDOT sums are folded by pairwise adds into one vector with one int32 per row, which is
 *   then scaled and accumulated once; an accumulator's lanes are four consecutive rows of one
 *   token's output, so it is stored as one vector. One token (decode) takes this path too.
 * - SMMLA: 2 pairs of weight rows x 1 to 4 pairs of tokens (K-quants: 1 or 2). SMMLA multiplies
 *   a 2x8 int8 matrix by an 8x2 one into a 2x2 int32 tile, so the 8-byte pieces of two weight
 *   rows are interleaved ([row 0 values 8c..8c+7 | row 1 values 8c..8c+7], one ZIP per piece),
 *   likewise those of two tokens; four SMMLA cover 32 values and leave [r0t0 r0t1 r1t0 r1t1].
 *   A last odd token of a tile is paired with a copy of itself; one token alone goes to SDOT.
 * Tiles whose row count is not a multiple of four repeat the last row and drop those results.
 *
 * What must stay true:
 * - Same contract as the reference vec_dot (kernels/cpu/quants.c): the integer sum of each block
 *   (K-quants: super-block) is exact and the same integer as the reference's, its float scale is
 *   the reference's product, and only the order of the float additions differs
 *   (tests/test_neon.c checks every entry against the reference). The bounds that keep the
 *   integer sums exact in int32 are given with each kernel family below.
 * - The entries are installed only when the CPU reports dotprod (and, for SMMLA, i8mm too; every
 *   i8mm CPU has dotprod, which the SMMLA kernels use for one-token tiles): the file is compiled
 *   without -march flags and the kernels get their instructions from target attributes, so the
 *   binary runs on any AArch64 CPU. Without dotprod the gemm entries stay NULL and the backend
 *   uses the vec_dot entries.
 * - Stack use: at most about 30 KiB per call, for the token side (CHUNK, KCHUNK below).
 */
#include "neon_kernels.h"

#if defined(__aarch64__)

#include <arm_neon.h>
#include <string.h>

#include "neon_sdot.h"

/* SMMLA is compiled in by attribute like SDOT (neon_sdot.h), and for the same reason written as
 * inline assembly with clang. */
#if defined(__clang__)
#define I8MM __attribute__((target("dotprod,i8mm")))
#else
#define I8MM __attribute__((target("arch=armv8.2-a+dotprod+i8mm")))
#endif
/* A kernel body, inlined with constant tile sizes so its accumulator arrays live in registers. */
#define BODY static inline __attribute__((always_inline))
#define UNROLL _Pragma("GCC unroll 8")

/* Blocks of 32 per pass over the token side: the token values of one pass take CHUNK * 16 bytes
 * (SDOT) or CHUNK * 320 bytes (SMMLA) of stack. */
#define CHUNK 64
/* Tokens per micro-tile: SDOT_T for SDOT (more would not leave its accumulators in registers
 * with GCC 12), TILE_T (four pairs) for SMMLA; TILE_T also sizes the token arrays of both. */
#define SDOT_T 4
#define TILE_T 8

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Four half-precision scales as floats (exact). */
static inline float32x4_t h2f4(kiri_f16 h0, kiri_f16 h1, kiri_f16 h2, kiri_f16 h3)
{
    const uint16_t h[4] = {h0, h1, h2, h3};
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(h)));
}

/* acc + the 2x2 products of the two 8-byte halves of a with those of b:
 * [a0.b0, a0.b1, a1.b0, a1.b1]. */
I8MM static inline int32x4_t smmla(int32x4_t acc, int8x16_t a, int8x16_t b)
{
#if defined(__clang__)
    __asm__("smmla %0.4s, %1.16b, %2.16b" : "+w"(acc) : "w"(a), "w"(b));
    return acc;
#else
    return vmmlaq_s32(acc, a, b);
#endif
}

/* 8-byte halves: [lo(a) | lo(b)] and [hi(a) | hi(b)]. */
static inline int8x16_t zip_lo(int8x16_t a, int8x16_t b)
{
    return vreinterpretq_s8_s64(vzip1q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}

static inline int8x16_t zip_hi(int8x16_t a, int8x16_t b)
{
    return vreinterpretq_s8_s64(vzip2q_s64(vreinterpretq_s64_s8(a), vreinterpretq_s64_s8(b)));
}

/* Row i of nr rows of ws bytes each (weights of a tile, or tokens), repeating the last row past
 * the end. */
static inline const char *tile_row(const void *w, size_t ws, int64_t i, int64_t nr)
{
    return (const char *)w + (size_t)(i < nr ? i : nr - 1) * ws;
}

/* The 32 signed values of block b of a Q4_0 (q4 != 0) or Q8_0 row: values 0-15 in lo, 16-31
 * in hi. Q4_0 value j is the low nibble of qs[j] for j < 16, else the high nibble of qs[j - 16],
 * minus 8: a nibble q with its top bit flipped, read as a signed 4-bit number, is q - 8, so both
 * nibbles are flipped at once and sign-extended by arithmetic shifts (one constant register
 * instead of two, which keeps the SDOT tile's accumulators in registers). */
BODY void wblock(int q4, const char *row, int64_t b, int8x16_t *lo, int8x16_t *hi)
{
    if (q4) {
        const uint8x16_t v = vld1q_u8(((const struct kiri_block_q4_0 *)row)[b].qs);
        const int8x16_t f = vreinterpretq_s8_u8(veorq_u8(v, vdupq_n_u8(0x88)));
        *lo = vshrq_n_s8(vshlq_n_s8(f, 4), 4);
        *hi = vshrq_n_s8(f, 4);
    } else {
        const int8_t *q = ((const struct kiri_block_q8_0 *)row)[b].qs;
        *lo = vld1q_s8(q);
        *hi = vld1q_s8(q + 16);
    }
}

BODY kiri_f16 wscale(int q4, const char *row, int64_t b)
{
    return q4 ? ((const struct kiri_block_q4_0 *)row)[b].d : ((const struct kiri_block_q8_0 *)row)[b].d;
}

/* Writes (first pass over k) or adds the n <= 4 values of v to out[0 .. n - 1]. */
static inline void put4(float *out, float32x4_t v, int64_t n, int first)
{
    if (n >= 4) {
        vst1q_f32(out, first ? v : vaddq_f32(vld1q_f32(out), v));
        return;
    }
    float t[4];
    vst1q_f32(t, v);
    for (int64_t i = 0; i < n; i++)
        out[i] = first ? t[i] : out[i] + t[i];
}

/* put4 for an SMMLA micro-tile of rows r .. r + 3 and tokens t = 2p, t' = 2p + 1: a0 is the 2x2
 * tile [r t, r t', r+1 t, r+1 t'], a1 the same for rows r + 2, r + 3, so the even lanes are
 * token t's four rows and the odd lanes token t''s; t' is written only while below nt. */
static inline void put_pair(float *dst, size_t ds, int64_t r, int64_t nr, int p, int nt,
                            float32x4_t a0, float32x4_t a1, int first)
{
    put4(dst + (size_t)(2 * p) * ds + r, vuzp1q_f32(a0, a1), nr - r, first);
    if (2 * p + 1 < nt)
        put4(dst + (size_t)(2 * p + 1) * ds + r, vuzp2q_f32(a0, a1), nr - r, first);
}

/* The tile of a product over no whole block: every dot product is 0, as the reference's. */
static void zero_tile(float *dst, size_t ds, int64_t nr, int64_t nt)
{
    for (int64_t t = 0; t < nt; t++)
        memset(dst + (size_t)t * ds, 0, (size_t)nr * sizeof *dst);
}

/* ---------------------------------------------------------------------------------------------
 * Q4_0 and Q8_0 with SDOT: 4 rows x nt tokens. A block's sum is at most 32 * 128 * 127 in
 * magnitude: exact in int32 and in float.
 * ------------------------------------------------------------------------------------------- */

/* Blocks b0 .. b0 + nb - 1 of all nr rows against the nt (1..SDOT_T) tokens at[0 .. nt - 1], whose
 * scales as floats are da[b * SDOT_T + t] (b counted from b0). */
SDOT BODY void rows_sdot(int q4, int nt, const void *w, size_t ws, int64_t nr, int64_t b0, int64_t nb,
                         const struct kiri_block_q8_0 *const at[TILE_T], const float *da, float *dst,
                         size_t ds, int first)
{
    for (int64_t r = 0; r < nr; r += 4) {
        const char *wr[4];
        for (int i = 0; i < 4; i++)
            wr[i] = tile_row(w, ws, r + i, nr);
        float32x4_t acc[SDOT_T];
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[t] = vdupq_n_f32(0);
        for (int64_t b = 0; b < nb; b++) {
            const int64_t bw = b0 + b;
            int8x16_t lo[4], hi[4];
            UNROLL
            for (int i = 0; i < 4; i++)
                wblock(q4, wr[i], bw, &lo[i], &hi[i]);
            const float32x4_t dw = h2f4(wscale(q4, wr[0], bw), wscale(q4, wr[1], bw),
                                        wscale(q4, wr[2], bw), wscale(q4, wr[3], bw));
            UNROLL
            for (int t = 0; t < nt; t++) {
                const int8x16_t a0 = vld1q_s8(at[t][bw].qs), a1 = vld1q_s8(at[t][bw].qs + 16);
                const int32x4_t zero = vdupq_n_s32(0);
                const int32x4_t p0 = sdot(sdot(zero, lo[0], a0), hi[0], a1);
                const int32x4_t p1 = sdot(sdot(zero, lo[1], a0), hi[1], a1);
                const int32x4_t p2 = sdot(sdot(zero, lo[2], a0), hi[2], a1);
                const int32x4_t p3 = sdot(sdot(zero, lo[3], a0), hi[3], a1);
                /* [sum p0, sum p1, sum p2, sum p3]: the four rows' block sums. */
                const int32x4_t s = vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
                acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(s), vmulq_n_f32(dw, da[b * SDOT_T + t]));
            }
        }
        UNROLL
        for (int t = 0; t < nt; t++)
            put4(dst + (size_t)t * ds + r, acc[t], nr - r, first);
    }
}

/* The SDOT tile for one group of nt <= SDOT_T tokens, chunk by chunk. */
SDOT BODY void group_sdot(int q4, int64_t k, const void *w, size_t ws, int64_t nr,
                          const struct kiri_block_q8_0 *const at[TILE_T], int nt, float *dst, size_t ds)
{
    float da[CHUNK * SDOT_T];
    const int64_t nb = k / KIRI_QK8_0;
    for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
        const int64_t n = min64(CHUNK, nb - b0);
        for (int64_t b = 0; b < n; b++)
            for (int t = 0; t < nt; t++)
                da[b * SDOT_T + t] = h2f(at[t][b0 + b].d);
        const int first = b0 == 0;
        switch (nt) {
        case 1: rows_sdot(q4, 1, w, ws, nr, b0, n, at, da, dst, ds, first); break;
        case 2: rows_sdot(q4, 2, w, ws, nr, b0, n, at, da, dst, ds, first); break;
        case 3: rows_sdot(q4, 3, w, ws, nr, b0, n, at, da, dst, ds, first); break;
        default: rows_sdot(q4, 4, w, ws, nr, b0, n, at, da, dst, ds, first); break;
        }
    }
}

/* Token t of the group starting at t0, repeating the last token past the end. */
static inline void group_tokens(const void *a, size_t as, int64_t t0, int64_t nt,
                                const struct kiri_block_q8_0 *at[TILE_T])
{
    for (int i = 0; i < TILE_T; i++)
        at[i] = (const struct kiri_block_q8_0 *)tile_row(a, as, t0 + i, nt);
}

SDOT BODY void gemm_sdot(int q4, int64_t k, const void *w, size_t ws, const void *a, size_t as,
                         float *dst, size_t ds, int64_t nr, int64_t nt)
{
    if (k < KIRI_QK8_0) {
        zero_tile(dst, ds, nr, nt);
        return;
    }
    for (int64_t t0 = 0; t0 < nt; t0 += SDOT_T) {
        const struct kiri_block_q8_0 *at[TILE_T];
        group_tokens(a, as, t0, nt, at);
        group_sdot(q4, k, w, ws, nr, at, (int)min64(SDOT_T, nt - t0), dst + (size_t)t0 * ds, ds);
    }
}

SDOT static void gemm_q4_0_sdot(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_sdot(1, k, w, ws, a, as, dst, ds, nr, nt);
}

SDOT static void gemm_q8_0_sdot(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_sdot(0, k, w, ws, a, as, dst, ds, nr, nt);
}

/* ---------------------------------------------------------------------------------------------
 * Q4_0 and Q8_0 with SMMLA: 2 row pairs x np token pairs (the same block sums as SDOT's)
 * ------------------------------------------------------------------------------------------- */

/* The token side of one chunk: for block b and token pair p, the four 16-byte pieces
 * [t0 values 8c..8c+7 | t1 values 8c..8c+7] (c = 0..3) and the scales [d_t0 d_t1 d_t0 d_t1]. */
struct pairs {
    int8_t q[CHUNK][TILE_T / 2][64];
    float d[CHUNK][TILE_T / 2][4];
};

/* Blocks b0 .. b0 + nb - 1 of all nr rows against np (1..4) token pairs laid out in tp (b counted
 * from b0); tokens 2p and 2p + 1 of the group write their outputs while below nt. */
I8MM BODY void rows_i8mm(int q4, int np, int nt, const void *w, size_t ws, int64_t nr, int64_t b0,
                         int64_t nb, const struct pairs *tp, float *dst, size_t ds, int first)
{
    for (int64_t r = 0; r < nr; r += 4) {
        const char *wr[4];
        for (int i = 0; i < 4; i++)
            wr[i] = tile_row(w, ws, r + i, nr);
        float32x4_t acc[2][TILE_T / 2];
        UNROLL
        for (int p = 0; p < np; p++)
            acc[0][p] = acc[1][p] = vdupq_n_f32(0);
        for (int64_t b = 0; b < nb; b++) {
            const int64_t bw = b0 + b;
            int8x16_t c[2][4];
            UNROLL
            for (int h = 0; h < 2; h++) {
                int8x16_t lo0, hi0, lo1, hi1;
                wblock(q4, wr[2 * h], bw, &lo0, &hi0);
                wblock(q4, wr[2 * h + 1], bw, &lo1, &hi1);
                c[h][0] = zip_lo(lo0, lo1);
                c[h][1] = zip_hi(lo0, lo1);
                c[h][2] = zip_lo(hi0, hi1);
                c[h][3] = zip_hi(hi0, hi1);
            }
            const float32x4_t d4 = h2f4(wscale(q4, wr[0], bw), wscale(q4, wr[1], bw),
                                        wscale(q4, wr[2], bw), wscale(q4, wr[3], bw));
            /* [d_r0 d_r0 d_r1 d_r1] and [d_r2 d_r2 d_r3 d_r3], matching the 2x2 tiles. */
            const float32x4_t dw[2] = {vzip1q_f32(d4, d4), vzip2q_f32(d4, d4)};
            UNROLL
            for (int p = 0; p < np; p++) {
                const int8_t *q = tp->q[b][p];
                const int8x16_t a0 = vld1q_s8(q), a1 = vld1q_s8(q + 16);
                const int8x16_t a2 = vld1q_s8(q + 32), a3 = vld1q_s8(q + 48);
                const float32x4_t dt = vld1q_f32(tp->d[b][p]);
                UNROLL
                for (int h = 0; h < 2; h++) {
                    int32x4_t s = smmla(vdupq_n_s32(0), c[h][0], a0);
                    s = smmla(s, c[h][1], a1);
                    s = smmla(s, c[h][2], a2);
                    s = smmla(s, c[h][3], a3);
                    acc[h][p] = vfmaq_f32(acc[h][p], vcvtq_f32_s32(s), vmulq_f32(dw[h], dt));
                }
            }
        }
        UNROLL
        for (int p = 0; p < np; p++)
            put_pair(dst, ds, r, nr, p, nt, acc[0][p], acc[1][p], first);
    }
}

/* Fills tp with blocks b0 .. b0 + n - 1 of the np token pairs (at[2p], at[2p + 1]). */
static inline void fill_pairs(struct pairs *tp, const struct kiri_block_q8_0 *const at[TILE_T], int np,
                              int64_t b0, int64_t n)
{
    for (int64_t b = 0; b < n; b++) {
        for (int p = 0; p < np; p++) {
            const struct kiri_block_q8_0 *x = &at[2 * p][b0 + b], *y = &at[2 * p + 1][b0 + b];
            const int8x16_t x0 = vld1q_s8(x->qs), x1 = vld1q_s8(x->qs + 16);
            const int8x16_t y0 = vld1q_s8(y->qs), y1 = vld1q_s8(y->qs + 16);
            int8_t *q = tp->q[b][p];
            vst1q_s8(q, zip_lo(x0, y0));
            vst1q_s8(q + 16, zip_hi(x0, y0));
            vst1q_s8(q + 32, zip_lo(x1, y1));
            vst1q_s8(q + 48, zip_hi(x1, y1));
            const float dx = h2f(x->d), dy = h2f(y->d);
            float *d = tp->d[b][p];
            d[0] = d[2] = dx;
            d[1] = d[3] = dy;
        }
    }
}

I8MM BODY void gemm_i8mm(int q4, int64_t k, const void *w, size_t ws, const void *a, size_t as,
                         float *dst, size_t ds, int64_t nr, int64_t nt)
{
    struct pairs tp;
    const int64_t nb = k / KIRI_QK8_0;
    if (nb == 0) {
        zero_tile(dst, ds, nr, nt);
        return;
    }
    for (int64_t t0 = 0; t0 < nt; t0 += TILE_T) {
        const struct kiri_block_q8_0 *at[TILE_T];
        const int n_tok = (int)min64(TILE_T, nt - t0), np = (n_tok + 1) / 2;
        float *d = dst + (size_t)t0 * ds;
        group_tokens(a, as, t0, nt, at);
        if (n_tok == 1) { /* SMMLA would spend half its work on a copy */
            group_sdot(q4, k, w, ws, nr, at, 1, d, ds);
            continue;
        }
        for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
            const int64_t n = min64(CHUNK, nb - b0);
            const int first = b0 == 0;
            fill_pairs(&tp, at, np, b0, n);
            switch (np) {
            case 1: rows_i8mm(q4, 1, n_tok, w, ws, nr, b0, n, &tp, d, ds, first); break;
            case 2: rows_i8mm(q4, 2, n_tok, w, ws, nr, b0, n, &tp, d, ds, first); break;
            case 3: rows_i8mm(q4, 3, n_tok, w, ws, nr, b0, n, &tp, d, ds, first); break;
            default: rows_i8mm(q4, 4, n_tok, w, ws, nr, b0, n, &tp, d, ds, first); break;
            }
        }
    }
}

I8MM static void gemm_q4_0_i8mm(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_i8mm(1, k, w, ws, a, as, dst, ds, nr, nt);
}

I8MM static void gemm_q8_0_i8mm(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_i8mm(0, k, w, ws, a, as, dst, ds, nr, nt);
}

/* ---------------------------------------------------------------------------------------------
 * K-quants with SDOT: 4 rows x nt tokens per super-block of 256
 *
 * A super-block's integer sum is sum_g sc_g S_g over its sub-blocks g (Q4_K: 8 of 32 values with
 * 6-bit scales; Q6_K: 16 of 16 values with int8 scales), S_g the sum of quants times activations.
 * Per sub-block and token the four rows' S_g are folded into one vector (lanes = rows, as in the
 * Q4_0 tile) and multiplied by the sub-block's scales of the four rows, so the four rows' scales
 * are first transposed into one int32 vector per sub-block. The terms that do not depend on the
 * quants meet the activations' 16-value sums (Q8_K's bsums):
 * - Q4_K: x = d sc q - dmin m, so the mins give dmin * sum_j m_j (bsums[2j] + bsums[2j + 1]),
 *   subtracted in float after the integer sums, as in the reference.
 * - Q6_K: values are q - 32 with q in 0..63; the kernel multiplies q itself and subtracts
 *   32 sum_g sc_g bsums[g] from the integer sum, which is the reference's integer exactly.
 * Bounds: Q4_K's |sum| <= 8 * 63 * 32 * 15 * 127 and Q6_K's q part <= 16 * 128 * 16 * 63 * 127
 * (under 2^29), so every integer sum stays exact in int32.
 * ------------------------------------------------------------------------------------------- */

/* Keeps the compiler from interleaving the unrolled sub-blocks of a super-block, which needs more
 * than the 32 vector registers (GCC 12 then spills partial sums to the stack): an empty volatile
 * asm is a scheduling barrier and costs no instruction. */
#define SCHED_BARRIER() __asm__ volatile("")

/* Super-blocks per pass over the token side: KCHUNK * SDOT_T * 68 bytes of stack. */
#define KCHUNK 16

/* The token side of one pass: scales and the activation sums each sub-block meets. */
struct ktok {
    float d[KCHUNK][SDOT_T];
    int32_t bs[KCHUNK][SDOT_T][16]; /* Q4_K: 8 sums of 32 values; Q6_K: 16 of 16 */
};

/* The activation sum that sub-block or group g (0..15) of y meets: Q6_K's 16-value groups are the
 * bsums themselves; Q4_K's eight 32-value sub-blocks take two bsums each (0 past the eighth). */
static inline int32_t sub_bsum(int q6, const struct kiri_block_q8_K *y, int g)
{
    if (q6)
        return y->bsums[g];
    return g < 8 ? y->bsums[2 * g] + y->bsums[2 * g + 1] : 0;
}

/* Row r's 16 bytes r[0..15] for 4 rows, as 16 int32 vectors: t[g] = [r0[g] r1[g] r2[g] r3[g]]
 * (bytes read as signed). */
static inline void transpose_4x16(int8x16_t r0, int8x16_t r1, int8x16_t r2, int8x16_t r3, int32_t t[16][4])
{
    const int8x16_t a0 = vzip1q_s8(r0, r1), a1 = vzip2q_s8(r0, r1);
    const int8x16_t b0 = vzip1q_s8(r2, r3), b1 = vzip2q_s8(r2, r3);
    const int8x16_t q[4] = {
        vreinterpretq_s8_s16(vzip1q_s16(vreinterpretq_s16_s8(a0), vreinterpretq_s16_s8(b0))),
        vreinterpretq_s8_s16(vzip2q_s16(vreinterpretq_s16_s8(a0), vreinterpretq_s16_s8(b0))),
        vreinterpretq_s8_s16(vzip1q_s16(vreinterpretq_s16_s8(a1), vreinterpretq_s16_s8(b1))),
        vreinterpretq_s8_s16(vzip2q_s16(vreinterpretq_s16_s8(a1), vreinterpretq_s16_s8(b1))),
    };
    for (int k = 0; k < 4; k++) {
        const int16x8_t lo = vmovl_s8(vget_low_s8(q[k])), hi = vmovl_high_s8(q[k]);
        vst1q_s32(t[4 * k], vmovl_s16(vget_low_s16(lo)));
        vst1q_s32(t[4 * k + 1], vmovl_high_s16(lo));
        vst1q_s32(t[4 * k + 2], vmovl_s16(vget_low_s16(hi)));
        vst1q_s32(t[4 * k + 3], vmovl_high_s16(hi));
    }
}

/* The 8 scales (bytes 0-7) and 8 mins (bytes 8-15) of a Q4_K block, 6 bits each in 12 bytes:
 * bytes 0-3 hold scales 0-3 and bytes 4-7 mins 0-3 in their low 6 bits; bytes 8-11 hold the low
 * 4 bits of scale (low nibble) and min (high nibble) 4-7, whose top 2 bits sit in the top bits of
 * bytes 0-3 (scales) and 4-7 (mins). */
static inline int8x16_t scales_mins_q4_K(const uint8_t *p)
{
    uint32_t w[3], o[4];
    memcpy(w, p, sizeof w);
    o[0] = w[0] & 0x3F3F3F3Fu;
    o[1] = (w[2] & 0x0F0F0F0Fu) | ((w[0] >> 6) & 0x03030303u) << 4;
    o[2] = w[1] & 0x3F3F3F3Fu;
    o[3] = ((w[2] >> 4) & 0x0F0F0F0Fu) | ((w[1] >> 6) & 0x03030303u) << 4;
    return vreinterpretq_s8_u32(vld1q_u32(o));
}

/* [S(r0) S(r1) S(r2) S(r3)] from the four rows' partial-sum vectors. */
static inline int32x4_t fold4(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3)
{
    return vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
}

/* Q4_K sub-block j (0..7) of block x: the low (even j) or high nibbles of qs[32 (j / 2) ..],
 * values 0-15 in lo, 16-31 in hi. */
static inline void sub_q4_K(const struct kiri_block_q4_K *x, int j, int8x16_t *lo, int8x16_t *hi)
{
    const uint8x16_t q0 = vld1q_u8(x->qs + 32 * (j / 2)), q1 = vld1q_u8(x->qs + 32 * (j / 2) + 16);
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    *lo = vreinterpretq_s8_u8(j % 2 ? vshrq_n_u8(q0, 4) : vandq_u8(q0, m4));
    *hi = vreinterpretq_s8_u8(j % 2 ? vshrq_n_u8(q1, 4) : vandq_u8(q1, m4));
}

/* Q6_K run u (0..3) of half h (0..1) of block x, the 6-bit quants q (0..63, without the -32):
 * the low (u < 2) or high nibbles of ql[64h + 32 (u & 1) ..], with bits 2u, 2u + 1 of
 * qh[32h ..] on top, as in quants_neon.c's dot_q6_K; values 0-15 in lo, 16-31 in hi. */
static inline void run_q6_K(const struct kiri_block_q6_K *x, int h, int u, int8x16_t *lo, int8x16_t *hi)
{
    const uint8_t *ql = x->ql + 64 * h + 32 * (u & 1), *qh = x->qh + 32 * h;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x30);
    uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16);
    uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
    l0 = u < 2 ? vandq_u8(l0, m4) : vshrq_n_u8(l0, 4);
    l1 = u < 2 ? vandq_u8(l1, m4) : vshrq_n_u8(l1, 4);
    if (u == 0) {
        h0 = vshlq_n_u8(h0, 4);
        h1 = vshlq_n_u8(h1, 4);
    } else if (u == 1) {
        h0 = vshlq_n_u8(h0, 2);
        h1 = vshlq_n_u8(h1, 2);
    } else if (u == 3) {
        h0 = vshrq_n_u8(h0, 2);
        h1 = vshrq_n_u8(h1, 2);
    }
    *lo = vreinterpretq_s8_u8(vorrq_u8(l0, vandq_u8(h0, m2)));
    *hi = vreinterpretq_s8_u8(vorrq_u8(l1, vandq_u8(h1, m2)));
}

/* One 32-value sub-block (a run of Q6_K: two 16-value groups g0, g0 + 1) of 4 rows, values
 * 0-15 in lo[r] and 16-31 in hi[r], against nt tokens whose activations start at offset `off`
 * of their block. sct holds the transposed scales. */
SDOT BODY void sub_k_sdot(int q6, int nt, const int8x16_t lo[4], const int8x16_t hi[4],
                          const struct kiri_block_q8_K *const at[TILE_T], int64_t bw, int off,
                          const int32_t sct[16][4], int g0, int32x4_t sumi[SDOT_T])
{
    const int32x4_t zero = vdupq_n_s32(0);
    UNROLL
    for (int t = 0; t < nt; t++) {
        const int8_t *a = at[t][bw].qs + off;
        const int8x16_t a0 = vld1q_s8(a), a1 = vld1q_s8(a + 16);
        if (q6) {
            const int32x4_t f0 = fold4(sdot(zero, lo[0], a0), sdot(zero, lo[1], a0),
                                       sdot(zero, lo[2], a0), sdot(zero, lo[3], a0));
            sumi[t] = vmlaq_s32(sumi[t], f0, vld1q_s32(sct[g0]));
            const int32x4_t f1 = fold4(sdot(zero, hi[0], a1), sdot(zero, hi[1], a1),
                                       sdot(zero, hi[2], a1), sdot(zero, hi[3], a1));
            sumi[t] = vmlaq_s32(sumi[t], f1, vld1q_s32(sct[g0 + 1]));
        } else {
            const int32x4_t f = fold4(sdot(sdot(zero, lo[0], a0), hi[0], a1), sdot(sdot(zero, lo[1], a0), hi[1], a1),
                                      sdot(sdot(zero, lo[2], a0), hi[2], a1), sdot(sdot(zero, lo[3], a0), hi[3], a1));
            sumi[t] = vmlaq_s32(sumi[t], f, vld1q_s32(sct[g0]));
        }
    }
}

/* Super-blocks b0 .. b0 + nb - 1 of all nr rows (Q4_K, or Q6_K when q6) against nt (1..SDOT_T)
 * tokens with the token side tk (b counted from b0). */
SDOT BODY void rows_k_sdot(int q6, int nt, const void *w, size_t ws, int64_t nr, int64_t b0, int64_t nb,
                           const struct kiri_block_q8_K *const at[TILE_T], const struct ktok *tk,
                           float *dst, size_t ds, int first)
{
    for (int64_t r = 0; r < nr; r += 4) {
        const char *wr[4];
        for (int i = 0; i < 4; i++)
            wr[i] = tile_row(w, ws, r + i, nr);
        float32x4_t acc[SDOT_T];
        UNROLL
        for (int t = 0; t < nt; t++)
            acc[t] = vdupq_n_f32(0);
        for (int64_t b = 0; b < nb; b++) {
            const int64_t bw = b0 + b;
            int32_t sct[16][4];
            int32x4_t sumi[SDOT_T];
            UNROLL
            for (int t = 0; t < nt; t++)
                sumi[t] = vdupq_n_s32(0);
            if (q6) {
                const struct kiri_block_q6_K *x[4];
                for (int i = 0; i < 4; i++)
                    x[i] = (const struct kiri_block_q6_K *)wr[i] + bw;
                transpose_4x16(vld1q_s8(x[0]->scales), vld1q_s8(x[1]->scales), vld1q_s8(x[2]->scales),
                               vld1q_s8(x[3]->scales), sct);
                for (int h = 0; h < 2; h++) {
                    UNROLL
                    for (int u = 0; u < 4; u++) {
                        int8x16_t lo[4], hi[4];
                        UNROLL
                        for (int i = 0; i < 4; i++)
                            run_q6_K(x[i], h, u, &lo[i], &hi[i]);
                        sub_k_sdot(1, nt, lo, hi, at, bw, 128 * h + 32 * u, sct, 8 * h + 2 * u, sumi);
                        SCHED_BARRIER();
                    }
                }
                const float32x4_t dv = h2f4(x[0]->d, x[1]->d, x[2]->d, x[3]->d);
                UNROLL
                for (int t = 0; t < nt; t++) {
                    int32x4_t corr = vdupq_n_s32(0);
                    const int32_t *bs = tk->bs[b][t];
                    for (int g = 0; g < 16; g++)
                        corr = vmlaq_n_s32(corr, vld1q_s32(sct[g]), bs[g]);
                    const int32x4_t s = vsubq_s32(sumi[t], vshlq_n_s32(corr, 5));
                    acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(s), vmulq_n_f32(dv, tk->d[b][t]));
                }
            } else {
                const struct kiri_block_q4_K *x[4];
                for (int i = 0; i < 4; i++)
                    x[i] = (const struct kiri_block_q4_K *)wr[i] + bw;
                transpose_4x16(scales_mins_q4_K(x[0]->scales), scales_mins_q4_K(x[1]->scales),
                               scales_mins_q4_K(x[2]->scales), scales_mins_q4_K(x[3]->scales), sct);
                UNROLL
                for (int j = 0; j < 8; j++) {
                    int8x16_t lo[4], hi[4];
                    UNROLL
                    for (int i = 0; i < 4; i++)
                        sub_q4_K(x[i], j, &lo[i], &hi[i]);
                    sub_k_sdot(0, nt, lo, hi, at, bw, 32 * j, sct, j, sumi);
                    SCHED_BARRIER();
                }
                const float32x4_t dv = h2f4(x[0]->d, x[1]->d, x[2]->d, x[3]->d);
                const float32x4_t mv = h2f4(x[0]->dmin, x[1]->dmin, x[2]->dmin, x[3]->dmin);
                UNROLL
                for (int t = 0; t < nt; t++) {
                    int32x4_t summ = vdupq_n_s32(0);
                    const int32_t *bs = tk->bs[b][t];
                    for (int j = 0; j < 8; j++)
                        summ = vmlaq_n_s32(summ, vld1q_s32(sct[8 + j]), bs[j]);
                    acc[t] = vfmaq_f32(acc[t], vcvtq_f32_s32(sumi[t]), vmulq_n_f32(dv, tk->d[b][t]));
                    acc[t] = vfmsq_f32(acc[t], vcvtq_f32_s32(summ), vmulq_n_f32(mv, tk->d[b][t]));
                }
            }
        }
        UNROLL
        for (int t = 0; t < nt; t++)
            put4(dst + (size_t)t * ds + r, acc[t], nr - r, first);
    }
}

SDOT BODY void gemm_k_sdot(int q6, int64_t k, const void *w, size_t ws, const void *a, size_t as,
                           float *dst, size_t ds, int64_t nr, int64_t nt)
{
    struct ktok tk;
    const int64_t nb = k / KIRI_QK_K;
    if (nb == 0) {
        zero_tile(dst, ds, nr, nt);
        return;
    }
    for (int64_t t0 = 0; t0 < nt; t0 += SDOT_T) {
        const struct kiri_block_q8_K *at[TILE_T];
        const int n_tok = (int)min64(SDOT_T, nt - t0);
        for (int i = 0; i < TILE_T; i++)
            at[i] = (const struct kiri_block_q8_K *)tile_row(a, as, t0 + i, nt);
        float *d = dst + (size_t)t0 * ds;
        for (int64_t b0 = 0; b0 < nb; b0 += KCHUNK) {
            const int64_t n = min64(KCHUNK, nb - b0);
            const int first = b0 == 0;
            for (int64_t b = 0; b < n; b++)
                for (int t = 0; t < n_tok; t++) {
                    const struct kiri_block_q8_K *y = &at[t][b0 + b];
                    tk.d[b][t] = y->d;
                    for (int g = 0; g < 16; g++)
                        tk.bs[b][t][g] = sub_bsum(q6, y, g);
                }
            switch (n_tok) {
            case 1: rows_k_sdot(q6, 1, w, ws, nr, b0, n, at, &tk, d, ds, first); break;
            case 2: rows_k_sdot(q6, 2, w, ws, nr, b0, n, at, &tk, d, ds, first); break;
            case 3: rows_k_sdot(q6, 3, w, ws, nr, b0, n, at, &tk, d, ds, first); break;
            default: rows_k_sdot(q6, 4, w, ws, nr, b0, n, at, &tk, d, ds, first); break;
            }
        }
    }
}

SDOT static void gemm_q4_K_sdot(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_k_sdot(0, k, w, ws, a, as, dst, ds, nr, nt);
}

SDOT static void gemm_q6_K_sdot(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_k_sdot(1, k, w, ws, a, as, dst, ds, nr, nt);
}

/* ---------------------------------------------------------------------------------------------
 * K-quants with SMMLA: 2 row pairs x 1 or 2 token pairs per super-block of 256
 *
 * The same sums as the SDOT tiles, in 2x2 tiles [r0t0 r0t1 r1t0 r1t1] as in the Q4_0 SMMLA
 * tile: a sub-block's scales of a row pair become [sc(r0) sc(r0) sc(r1) sc(r1)], the activation
 * sums of a token pair [s(t0) s(t1) s(t0) s(t1)]. Two token pairs at most, so that the integer
 * and float accumulators and a sub-block's interleaved weights fit the 32 registers.
 * ------------------------------------------------------------------------------------------- */

/* The token side of one pass for up to two token pairs: per super-block and pair, the 256
 * activations interleaved as for the Q4_0 tile (piece c of the 32 values at o sits at
 * 2 o + 16 c), the activation sums of each sub-block and the scales, laid out as above. */
struct kpairs {
    int8_t q[KCHUNK][2][2 * KIRI_QK_K];
    int32_t bs[KCHUNK][2][16][4]; /* Q4_K: 8 sums of 32 values; Q6_K: 16 of 16 */
    float d[KCHUNK][2][4];
};

/* [v0 v0 v1 v1] and [v2 v2 v3 v3]: a vector over four rows spread over the two row pairs' tiles. */
static inline void pair_rows_s32(int32x4_t v, int32x4_t out[2])
{
    out[0] = vzip1q_s32(v, v);
    out[1] = vzip2q_s32(v, v);
}

/* One 32-value sub-block (a run of Q6_K: two 16-value groups g0, g0 + 1) of the two row pairs,
 * interleaved in c, against np token pairs whose activations start at `off` of the super-block. */
I8MM BODY void sub_k_i8mm(int q6, int np, const int8x16_t c[2][4], const struct kpairs *tp, int64_t b,
                          int off, const int32_t sct[16][4], int g0, int32x4_t sumi[2][2])
{
    const int32x4_t zero = vdupq_n_s32(0);
    int32x4_t s0[2], s1[2];
    pair_rows_s32(vld1q_s32(sct[g0]), s0);
    if (q6)
        pair_rows_s32(vld1q_s32(sct[g0 + 1]), s1);
    UNROLL
    for (int p = 0; p < np; p++) {
        const int8_t *q = tp->q[b][p] + 2 * off;
        const int8x16_t a0 = vld1q_s8(q), a1 = vld1q_s8(q + 16);
        const int8x16_t a2 = vld1q_s8(q + 32), a3 = vld1q_s8(q + 48);
        UNROLL
        for (int h = 0; h < 2; h++) {
            if (q6) {
                const int32x4_t t0 = smmla(smmla(zero, c[h][0], a0), c[h][1], a1);
                const int32x4_t t1 = smmla(smmla(zero, c[h][2], a2), c[h][3], a3);
                sumi[h][p] = vmlaq_s32(vmlaq_s32(sumi[h][p], t0, s0[h]), t1, s1[h]);
            } else {
                int32x4_t t = smmla(zero, c[h][0], a0);
                t = smmla(t, c[h][1], a1);
                t = smmla(t, c[h][2], a2);
                t = smmla(t, c[h][3], a3);
                sumi[h][p] = vmlaq_s32(sumi[h][p], t, s0[h]);
            }
        }
    }
}

/* Interleaves the sub-blocks lo/hi of rows 2h, 2h + 1 into c[h] (see the Q4_0 SMMLA tile). */
static inline void interleave_rows(const int8x16_t lo[4], const int8x16_t hi[4], int8x16_t c[2][4])
{
    for (int h = 0; h < 2; h++) {
        c[h][0] = zip_lo(lo[2 * h], lo[2 * h + 1]);
        c[h][1] = zip_hi(lo[2 * h], lo[2 * h + 1]);
        c[h][2] = zip_lo(hi[2 * h], hi[2 * h + 1]);
        c[h][3] = zip_hi(hi[2 * h], hi[2 * h + 1]);
    }
}

/* Super-blocks b0 .. b0 + nb - 1 of all nr rows (Q4_K, or Q6_K when q6) against np (1..2) token
 * pairs in tp (b counted from b0); tokens 2p and 2p + 1 write their outputs while below nt. */
I8MM BODY void rows_k_i8mm(int q6, int np, int nt, const void *w, size_t ws, int64_t nr, int64_t b0,
                           int64_t nb, const struct kpairs *tp, float *dst, size_t ds, int first)
{
    for (int64_t r = 0; r < nr; r += 4) {
        const char *wr[4];
        for (int i = 0; i < 4; i++)
            wr[i] = tile_row(w, ws, r + i, nr);
        float32x4_t acc[2][2];
        UNROLL
        for (int p = 0; p < np; p++)
            acc[0][p] = acc[1][p] = vdupq_n_f32(0);
        for (int64_t b = 0; b < nb; b++) {
            const int64_t bw = b0 + b;
            int32_t sct[16][4];
            int32x4_t sumi[2][2];
            UNROLL
            for (int p = 0; p < np; p++)
                sumi[0][p] = sumi[1][p] = vdupq_n_s32(0);
            float32x4_t d4, m4 = vdupq_n_f32(0);
            if (q6) {
                const struct kiri_block_q6_K *x[4];
                for (int i = 0; i < 4; i++)
                    x[i] = (const struct kiri_block_q6_K *)wr[i] + bw;
                transpose_4x16(vld1q_s8(x[0]->scales), vld1q_s8(x[1]->scales), vld1q_s8(x[2]->scales),
                               vld1q_s8(x[3]->scales), sct);
                for (int h = 0; h < 2; h++) {
                    UNROLL
                    for (int u = 0; u < 4; u++) {
                        int8x16_t lo[4], hi[4], c[2][4];
                        UNROLL
                        for (int i = 0; i < 4; i++)
                            run_q6_K(x[i], h, u, &lo[i], &hi[i]);
                        interleave_rows(lo, hi, c);
                        sub_k_i8mm(1, np, c, tp, b, 128 * h + 32 * u, sct, 8 * h + 2 * u, sumi);
                        SCHED_BARRIER();
                    }
                }
                d4 = h2f4(x[0]->d, x[1]->d, x[2]->d, x[3]->d);
            } else {
                const struct kiri_block_q4_K *x[4];
                for (int i = 0; i < 4; i++)
                    x[i] = (const struct kiri_block_q4_K *)wr[i] + bw;
                transpose_4x16(scales_mins_q4_K(x[0]->scales), scales_mins_q4_K(x[1]->scales),
                               scales_mins_q4_K(x[2]->scales), scales_mins_q4_K(x[3]->scales), sct);
                UNROLL
                for (int j = 0; j < 8; j++) {
                    int8x16_t lo[4], hi[4], c[2][4];
                    UNROLL
                    for (int i = 0; i < 4; i++)
                        sub_q4_K(x[i], j, &lo[i], &hi[i]);
                    interleave_rows(lo, hi, c);
                    sub_k_i8mm(0, np, c, tp, b, 32 * j, sct, j, sumi);
                    SCHED_BARRIER();
                }
                d4 = h2f4(x[0]->d, x[1]->d, x[2]->d, x[3]->d);
                m4 = h2f4(x[0]->dmin, x[1]->dmin, x[2]->dmin, x[3]->dmin);
            }
            /* The per-row scales spread over the row pairs' tiles, as the integer scales. */
            const float32x4_t dw[2] = {vzip1q_f32(d4, d4), vzip2q_f32(d4, d4)};
            const float32x4_t mw[2] = {vzip1q_f32(m4, m4), vzip2q_f32(m4, m4)};
            UNROLL
            for (int p = 0; p < np; p++) {
                const float32x4_t dt = vld1q_f32(tp->d[b][p]);
                UNROLL
                for (int h = 0; h < 2; h++) {
                    /* Q6_K: sum_g sc_g bsums[g], times 32 off the sum; Q4_K: the mins' sum. */
                    int32x4_t extra = vdupq_n_s32(0);
                    for (int g = 0; g < (q6 ? 16 : 8); g++) {
                        int32x4_t sg[2];
                        pair_rows_s32(vld1q_s32(sct[q6 ? g : 8 + g]), sg);
                        extra = vmlaq_s32(extra, sg[h], vld1q_s32(tp->bs[b][p][g]));
                    }
                    if (q6) {
                        const int32x4_t s = vsubq_s32(sumi[h][p], vshlq_n_s32(extra, 5));
                        acc[h][p] = vfmaq_f32(acc[h][p], vcvtq_f32_s32(s), vmulq_f32(dw[h], dt));
                    } else {
                        acc[h][p] = vfmaq_f32(acc[h][p], vcvtq_f32_s32(sumi[h][p]), vmulq_f32(dw[h], dt));
                        acc[h][p] = vfmsq_f32(acc[h][p], vcvtq_f32_s32(extra), vmulq_f32(mw[h], dt));
                    }
                }
            }
        }
        UNROLL
        for (int p = 0; p < np; p++)
            put_pair(dst, ds, r, nr, p, nt, acc[0][p], acc[1][p], first);
    }
}

/* Fills tp with super-blocks b0 .. b0 + n - 1 of the np token pairs (at[2p], at[2p + 1]). */
static inline void fill_kpairs(int q6, struct kpairs *tp, const struct kiri_block_q8_K *const at[TILE_T],
                               int np, int64_t b0, int64_t n)
{
    for (int64_t b = 0; b < n; b++) {
        for (int p = 0; p < np; p++) {
            const struct kiri_block_q8_K *x = &at[2 * p][b0 + b], *y = &at[2 * p + 1][b0 + b];
            int8_t *q = tp->q[b][p];
            for (int o = 0; o < KIRI_QK_K; o += 32) {
                const int8x16_t x0 = vld1q_s8(x->qs + o), x1 = vld1q_s8(x->qs + o + 16);
                const int8x16_t y0 = vld1q_s8(y->qs + o), y1 = vld1q_s8(y->qs + o + 16);
                vst1q_s8(q + 2 * o, zip_lo(x0, y0));
                vst1q_s8(q + 2 * o + 16, zip_hi(x0, y0));
                vst1q_s8(q + 2 * o + 32, zip_lo(x1, y1));
                vst1q_s8(q + 2 * o + 48, zip_hi(x1, y1));
            }
            for (int g = 0; g < 16; g++) {
                const int32_t sx = sub_bsum(q6, x, g), sy = sub_bsum(q6, y, g);
                int32_t *v = tp->bs[b][p][g];
                v[0] = v[2] = sx;
                v[1] = v[3] = sy;
            }
            float *d = tp->d[b][p];
            d[0] = d[2] = x->d;
            d[1] = d[3] = y->d;
        }
    }
}

I8MM BODY void gemm_k_i8mm(int q6, int64_t k, const void *w, size_t ws, const void *a, size_t as,
                           float *dst, size_t ds, int64_t nr, int64_t nt)
{
    struct kpairs tp;
    const int64_t nb = k / KIRI_QK_K;
    if (nb == 0) {
        zero_tile(dst, ds, nr, nt);
        return;
    }
    for (int64_t t0 = 0; t0 < nt; t0 += 4) {
        const int n_tok = (int)min64(4, nt - t0), np = (n_tok + 1) / 2;
        if (n_tok == 1) { /* SMMLA would spend half its work on a copy */
            gemm_k_sdot(q6, k, w, ws, (const char *)a + (size_t)t0 * as, as, dst + (size_t)t0 * ds, ds, nr, 1);
            continue;
        }
        const struct kiri_block_q8_K *at[TILE_T];
        for (int i = 0; i < TILE_T; i++)
            at[i] = (const struct kiri_block_q8_K *)tile_row(a, as, t0 + i, nt);
        float *d = dst + (size_t)t0 * ds;
        for (int64_t b0 = 0; b0 < nb; b0 += KCHUNK) {
            const int64_t n = min64(KCHUNK, nb - b0);
            const int first = b0 == 0;
            fill_kpairs(q6, &tp, at, np, b0, n);
            if (np == 1)
                rows_k_i8mm(q6, 1, n_tok, w, ws, nr, b0, n, &tp, d, ds, first);
            else
                rows_k_i8mm(q6, 2, n_tok, w, ws, nr, b0, n, &tp, d, ds, first);
        }
    }
}

I8MM static void gemm_q4_K_i8mm(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_k_i8mm(0, k, w, ws, a, as, dst, ds, nr, nt);
}

I8MM static void gemm_q6_K_i8mm(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_k_i8mm(1, k, w, ws, a, as, dst, ds, nr, nt);
}

/* ---------------------------------------------------------------------------------------------
 * Table
 * ------------------------------------------------------------------------------------------- */

void kiri_cpu_kernels_init_gemm_neon(struct kiri_cpu_kernels *k, uint32_t cpu_features)
{
    if (!(cpu_features & KIRI_CPU_DOTPROD))
        return;
    const int i8mm = (cpu_features & KIRI_CPU_I8MM) != 0;
    k->gemm[KIRI_TYPE_Q4_0] = i8mm ? gemm_q4_0_i8mm : gemm_q4_0_sdot;
    k->gemm[KIRI_TYPE_Q8_0] = i8mm ? gemm_q8_0_i8mm : gemm_q8_0_sdot;
    k->gemm[KIRI_TYPE_Q4_K] = i8mm ? gemm_q4_K_i8mm : gemm_q4_K_sdot;
    k->gemm[KIRI_TYPE_Q6_K] = i8mm ? gemm_q6_K_i8mm : gemm_q6_K_sdot;
}

#else
typedef int kiri_gemm_neon_unused; /* an empty translation unit is not valid ISO C */
#endif
