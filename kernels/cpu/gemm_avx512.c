/* AVX-512 (F, BW, VL) with VNNI tiles of matrix products (kiri_gemm_fn) for Q4_0, Q5_0 and Q8_0
 * weights against Q8_0 activations, Q4_1 and Q5_1 against Q8_1, and Q4_K, Q5_K and Q6_K against
 * Q8_K: the same contract as gemm_avx2.c, for CPUs that have them. Q5_0 and Q5_1 have octets
 * only (prefill): their one to four tokens (decode, small batches) take the AVX2 kernels.
 *
 * The AVX2 kernels fold the partial sums of several (row, token) pairs with horizontal adds; here
 * the rows of a group of 16 go in the 16 int32 lanes of a register instead, so one VNNI
 * instruction (vpdpbusd: 4 byte products summed into each lane) advances 16 dot products by 4
 * values each and nothing needs folding. That takes the weights of 16 rows transposed in groups
 * of 4 bytes (lane i holding row i's bytes 4j .. 4j + 3), which a 4 x 4 transpose of 32-bit
 * elements inside each 128-bit lane produces from four registers of four rows each; the
 * activation's matching 4 bytes are broadcast to every lane. The weights stay where they are in
 * the model's mapping: each group of 16 rows is transposed into registers as it is read, once
 * per block and then used for 16 or 8 tokens (prefill), for the 2 to 4 tokens of a small batch
 * (a serving step with a few sequences: streamed once like one token, not padded to an octet) or
 * for one (Q8_0 decode). K-quant super-blocks are transposed whole into a stack buffer, with
 * their scales as vectors of 16 rows, and then used for every token of an octet. A single
 * K-quant, Q4_0 or Q4_1 token (decode), and a K-quant small batch of 2 to 4 tokens, take other kernels,
 * which read four rows as they lie, with no transposition (see "One token" below): for so few
 * tokens the transposition costs more than it saves, and its sixteen row streams defeat the
 * prefetchers.
 * The Q4_0 and Q4_1 ones add each row's blocks in the order of the transposed kernels, so a token
 * gets the same floats alone or in a small batch (Q4_1's small batches go up to 8 tokens: a
 * verification step of drafted tokens).
 *
 * Integer ranges: vpdpbusd multiplies unsigned by signed bytes. Q4_0 quants enter as their
 * nibbles 0..15 and the term 8 sum a is subtracted afterwards, Q5_0's as 0..31 and 16 sum a;
 * Q8_0 quants w enter as w + 128 (0..255) and the term 128 sum a is subtracted; Q4_1 (0..15) and
 * Q5_1 (0..31) quants are unsigned, their offset added as m s per block, and so are Q4_K
 * (0..15), Q5_K (0..31) and Q6_K (0..63) quants. Sums of 32 products stay far inside int32 (the
 * instruction does not saturate), and so do the K-quants' sums scaled by their 6- or 8-bit
 * scales (vpmulld). As everywhere, the activations hold -127..127.
 *
 * What must stay true: the integer block sums are exactly those of the reference vec_dot
 * (quants.c); only the order of float additions across blocks differs (tests/test_gemm.c).
 * Compiled without -mavx512*: each function carries a target attribute; the entries may only be
 * installed when the CPU and the OS reported KIRI_CPU_AVX512 and KIRI_CPU_AVX512_VNNI.
 */
#include "cpu_kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#define AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
/* Loops over the registers of a tile must be unrolled so they stay in registers. */
#define UNROLL _Pragma("GCC unroll 8")
/* The one-token kernels stay out of line: inlined into the tile entries beside the octet loops,
 * they changed how those were compiled and prefill lost a few percent. */
#define OUT_OF_LINE __attribute__((noinline))
/* The tile drivers take the type's quant unpacker as a constant argument: they must be inlined
 * into each type's entry so the unpacker is inlined too. */
#define SPECIALIZE __attribute__((always_inline))

/* Blocks per pass over k (Q4_0, Q8_0): the per-pass tables of weight scales (16 rows per group)
 * and token values (16 tokens) take CHUNK * 64 bytes per row group and CHUNK * 128 bytes. */
#define CHUNK 64
/* Row groups of a tile whose scales are tabled at once (the tile is split beyond that). */
#define MAX_GROUPS 8

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

/* Row i of a tile of nr rows, repeating the last row past the end. */
static inline const char *tile_row(const void *w, size_t ws, int64_t i, int64_t nr)
{
    return (const char *)w + (size_t)(i < nr ? i : nr - 1) * ws;
}

static inline uint16_t load_u16(const void *p)
{
    uint16_t v;
    memcpy(&v, p, 2);
    return v;
}

static inline int32_t load_i32(const void *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Sum of 32 int8 values. */
AVX512 static inline int32_t sum_i8x32(const int8_t *qs)
{
    const __m256i a = _mm256_loadu_si256((const __m256i *)qs);
    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), a), _mm256_set1_epi16(1));
    __m128i h = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(1, 0, 3, 2)));
    h = _mm_add_epi32(h, _mm_shuffle_epi32(h, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(h);
}

/* Sum of the 32 activation values of a Q8_0 block. */
AVX512 static inline int32_t sum_q8(const struct kiri_block_q8_0 *y)
{
    return sum_i8x32(y->qs);
}

/* ---------------------------------------------------------------------------------------------
 * Transposing 16 rows
 * ------------------------------------------------------------------------------------------- */

/* 16 bytes at p[i] + off for rows i = 0..15, transposed: dword j of the result's lane i is
 * bytes 4j .. 4j + 3 of row i (g[j] for j = 0..3). */
AVX512 static inline void transpose16(const char *const p[16], size_t off, __m512i g[4])
{
    __m512i z[4];
    UNROLL
    for (int k = 0; k < 4; k++) {
        z[k] = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(p[k] + off)));
        z[k] = _mm512_inserti32x4(z[k], _mm_loadu_si128((const __m128i *)(p[k + 4] + off)), 1);
        z[k] = _mm512_inserti32x4(z[k], _mm_loadu_si128((const __m128i *)(p[k + 8] + off)), 2);
        z[k] = _mm512_inserti32x4(z[k], _mm_loadu_si128((const __m128i *)(p[k + 12] + off)), 3);
    }
    /* 128-bit lane L of z[k] holds row 4L + k; transposing 4 x 4 dwords inside each lane puts
     * row 4L + m in dword m of lane L, i.e. row i in dword i. */
    const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    g[0] = _mm512_unpacklo_epi64(t0, t2);
    g[1] = _mm512_unpackhi_epi64(t0, t2);
    g[2] = _mm512_unpacklo_epi64(t1, t3);
    g[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* The 32 quants of block b of 16 rows as 8 registers of unsigned bytes: q[j] lane i holds row i's
 * values 4j .. 4j + 3. The 4-bit types: the nibbles of the 16 bytes at qs (values 0..15 are the
 * low nibbles of bytes 0..15, values 16..31 the high ones). */
AVX512 static inline void nibbles16(const char *const rows[16], size_t qs, __m512i q[8])
{
    __m512i g[4];
    transpose16(rows, qs, g);
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    UNROLL
    for (int j = 0; j < 4; j++) {
        q[j] = _mm512_and_si512(g[j], m4);
        q[j + 4] = _mm512_and_si512(_mm512_srli_epi16(g[j], 4), m4);
    }
}

AVX512 static inline void quants16_q4_0(const char *const rows[16], int64_t b, __m512i q[8])
{
    nibbles16(rows, (size_t)b * sizeof(struct kiri_block_q4_0) + offsetof(struct kiri_block_q4_0, qs), q);
}

AVX512 static inline void quants16_q4_1(const char *const rows[16], int64_t b, __m512i q[8])
{
    nibbles16(rows, (size_t)b * sizeof(struct kiri_block_q4_1) + offsetof(struct kiri_block_q4_1, qs), q);
}

/* The 32-bit word at byte off of 16 rows, row i in lane i. */
AVX512 static inline __m512i words16(const char *const rows[16], size_t off)
{
    return _mm512_setr_epi32(load_i32(rows[0] + off), load_i32(rows[1] + off), load_i32(rows[2] + off),
                             load_i32(rows[3] + off), load_i32(rows[4] + off), load_i32(rows[5] + off),
                             load_i32(rows[6] + off), load_i32(rows[7] + off), load_i32(rows[8] + off),
                             load_i32(rows[9] + off), load_i32(rows[10] + off), load_i32(rows[11] + off),
                             load_i32(rows[12] + off), load_i32(rows[13] + off), load_i32(rows[14] + off),
                             load_i32(rows[15] + off));
}

/* Q5_0, Q5_1: the nibbles plus 16 times the fifth bits, quants 0..31. Value v's bit is bit v of
 * the block's qh, so q[j] (values 4j .. 4j + 3, and 16 + 4(j - 4) .. for j >= 4: again 4j ..)
 * takes bits 4j .. 4j + 3: nibble j % 2 of byte j / 2 of qh (h, a row per lane), copied to the
 * lane's four bytes and tested against each byte's bit. */
AVX512 static inline void fifth_bits16(__m512i h, __m512i q[8])
{
    const __m512i b4 = _mm512_set1_epi8(0x10);
    UNROLL
    for (int j = 0; j < 8; j++) {
        const int c = 0x01010101 * (j / 2); /* byte j / 2 of each 32-bit lane, within 128 bits */
        const __m512i idx = _mm512_set4_epi32(0x0C0C0C0C + c, 0x08080808 + c, 0x04040404 + c, c);
        const __m512i spread = _mm512_shuffle_epi8(h, idx);
        const __mmask64 set = _mm512_test_epi8_mask(spread, _mm512_set1_epi32((int)(0x08040201u << (4 * (j % 2)))));
        q[j] = _mm512_mask_add_epi8(q[j], set, q[j], b4);
    }
}

AVX512 static inline void quants16_q5_0(const char *const rows[16], int64_t b, __m512i q[8])
{
    const size_t o = (size_t)b * sizeof(struct kiri_block_q5_0);
    nibbles16(rows, o + offsetof(struct kiri_block_q5_0, qs), q);
    fifth_bits16(words16(rows, o + offsetof(struct kiri_block_q5_0, qh)), q);
}

AVX512 static inline void quants16_q5_1(const char *const rows[16], int64_t b, __m512i q[8])
{
    const size_t o = (size_t)b * sizeof(struct kiri_block_q5_1);
    nibbles16(rows, o + offsetof(struct kiri_block_q5_1, qs), q);
    fifth_bits16(words16(rows, o + offsetof(struct kiri_block_q5_1, qh)), q);
}

/* Q8_0: the quants plus 128. */
AVX512 static inline void quants16_q8_0(const char *const rows[16], int64_t b, __m512i q[8])
{
    const size_t off = (size_t)b * sizeof(struct kiri_block_q8_0) + offsetof(struct kiri_block_q8_0, qs);
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    transpose16(rows, off, q);
    transpose16(rows, off + 16, q + 4);
    UNROLL
    for (int j = 0; j < 8; j++)
        q[j] = _mm512_xor_si512(q[j], flip);
}

/* The F16 values at byte o of 16 rows as floats, one row per lane. */
AVX512 static inline __m512 halves16(const char *const rows[16], size_t o)
{
    const __m256i h = _mm256_setr_epi16(
        (short)load_u16(rows[0] + o), (short)load_u16(rows[1] + o), (short)load_u16(rows[2] + o),
        (short)load_u16(rows[3] + o), (short)load_u16(rows[4] + o), (short)load_u16(rows[5] + o),
        (short)load_u16(rows[6] + o), (short)load_u16(rows[7] + o), (short)load_u16(rows[8] + o),
        (short)load_u16(rows[9] + o), (short)load_u16(rows[10] + o), (short)load_u16(rows[11] + o),
        (short)load_u16(rows[12] + o), (short)load_u16(rows[13] + o), (short)load_u16(rows[14] + o),
        (short)load_u16(rows[15] + o));
    return _mm512_cvtph_ps(h);
}

/* The scales of block b of 16 rows (blocks of `size` bytes whose first field is the F16 scale). */
AVX512 static inline __m512 scales16(const char *const rows[16], int64_t b, size_t size)
{
    return halves16(rows, (size_t)b * size);
}

/* The offsets m of Q4_1 and Q5_1 blocks (the second field, after d). */
_Static_assert(offsetof(struct kiri_block_q4_1, m) == 2 && offsetof(struct kiri_block_q5_1, m) == 2,
               "Q4_1 and Q5_1 hold m after d");
AVX512 static inline __m512 mins16(const char *const rows[16], int64_t b, size_t size)
{
    return halves16(rows, (size_t)b * size + 2);
}

/* The integer sums of 16 rows' block (q from quants16_*) with one activation block: lane i is
 * sum over 32 values of q_i a. Two chains of four, so the instructions of one token overlap. */
AVX512 static inline __m512i dot16(const __m512i q[8], const int8_t *a)
{
    __m512i s0 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[0], _mm512_set1_epi32(load_i32(a)));
    __m512i s1 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q[4], _mm512_set1_epi32(load_i32(a + 16)));
    UNROLL
    for (int j = 1; j < 4; j++) {
        s0 = _mm512_dpbusd_epi32(s0, q[j], _mm512_set1_epi32(load_i32(a + 4 * j)));
        s1 = _mm512_dpbusd_epi32(s1, q[j + 4], _mm512_set1_epi32(load_i32(a + 16 + 4 * j)));
    }
    return _mm512_add_epi32(s0, s1);
}

/* Stores 16 row results at out (rows below n only); the first pass over k stores, later passes
 * add. */
AVX512 static inline void put16(float *out, __m512 v, int64_t n, int first)
{
    const __mmask16 m = n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << n) - 1);
    if (!first)
        v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, out));
    _mm512_mask_storeu_ps(out, m, v);
}

/* ---------------------------------------------------------------------------------------------
 * Tiles: token octets against row groups, single tokens against row groups
 * ------------------------------------------------------------------------------------------- */

typedef void (*quants16_fn)(const char *const rows[16], int64_t b, __m512i q[8]);

/* Activation blocks of 32 values: Q8_0 (d, qs) against Q4_0, Q5_0 and Q8_0 weights, Q8_1 (d, s,
 * qs) against Q4_1 and Q5_1 (q81), whose offsets m enter as m s per block. */
_Static_assert(offsetof(struct kiri_block_q8_0, d) == 0 && offsetof(struct kiri_block_q8_1, d) == 0,
               "Q8_0 and Q8_1 start with d");
static inline size_t act_size(int q81)
{
    return q81 ? sizeof(struct kiri_block_q8_1) : sizeof(struct kiri_block_q8_0);
}
static inline size_t act_qs(int q81)
{
    return q81 ? offsetof(struct kiri_block_q8_1, qs) : offsetof(struct kiri_block_q8_0, qs);
}

/* tt tokens (8 or 16; those past nt repeat the last) from token t against up to MAX_GROUPS groups
 * of 16 rows, over blocks b0 .. b0 + bn - 1 with the rows' scales in dw (and offsets in dm for
 * q81): per block and group the weights are transposed once and used for the tt tokens (tt
 * accumulators of 16 rows). */
AVX512 SPECIALIZE static inline void tile_tokens(const void *w, size_t ws, quants16_fn quants, int bias, int q81,
                                                 const void *a, size_t as, float *dst, size_t ds, int64_t nr,
                                                 int64_t nt, int64_t t, int tt, int64_t b0, int64_t bn,
                                                 __m512 dw[MAX_GROUPS][CHUNK], __m512 dm[MAX_GROUPS][CHUNK])
{
    const int64_t ng = (nr + 15) / 16;
    const size_t asz = act_size(q81), aqs = act_qs(q81);
    float dy[CHUNK][16];   /* the tokens' scales */
    float sy[CHUNK][16];   /* q81: the tokens' s */
    int32_t cy[CHUNK][16]; /* the tokens' bias * sum a */
    const char *y[16];
    for (int i = 0; i < tt; i++)
        y[i] = tile_row(a, as, t + i, nt) + (size_t)b0 * asz;
    for (int64_t b = 0; b < bn; b++)
        for (int i = 0; i < tt; i++) {
            const char *yb = y[i] + (size_t)b * asz;
            dy[b][i] = _cvtsh_ss(load_u16(yb));
            cy[b][i] = bias ? bias * sum_i8x32((const int8_t *)(yb + aqs)) : 0;
            if (q81)
                sy[b][i] = _cvtsh_ss(load_u16(yb + offsetof(struct kiri_block_q8_1, s)));
        }
    for (int64_t g = 0; g < ng; g++) {
        const char *rows[16];
        for (int i = 0; i < 16; i++)
            rows[i] = tile_row(w, ws, 16 * g + i, nr);
        __m512 acc[16];
        _Pragma("GCC unroll 16")
        for (int i = 0; i < tt; i++)
            acc[i] = _mm512_setzero_ps();
        for (int64_t b = 0; b < bn; b++) {
            __m512i q[8];
            quants(rows, b0 + b, q);
            _Pragma("GCC unroll 16")
            for (int i = 0; i < tt; i++) {
                const int8_t *aq = (const int8_t *)(y[i] + (size_t)b * asz + aqs);
                const __m512i s = _mm512_sub_epi32(dot16(q, aq), _mm512_set1_epi32(cy[b][i]));
                const __m512 d = _mm512_mul_ps(dw[g][b], _mm512_set1_ps(dy[b][i]));
                acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc[i]);
                if (q81)
                    acc[i] = _mm512_fmadd_ps(dm[g][b], _mm512_set1_ps(sy[b][i]), acc[i]);
            }
        }
        for (int i = 0; i < tt && t + i < nt; i++)
            put16(dst + (size_t)(t + i) * ds + (size_t)(16 * g), acc[i], nr - 16 * g, b0 == 0);
    }
}

/* Up to MAX_GROUPS groups of 16 rows against every token of the tile: per pass over CHUNK blocks,
 * the rows' scales (and offsets) are tabled once, then the tokens go 16 at a time (8 for a rest). */
AVX512 SPECIALIZE static inline void tile_octets(int64_t k, const void *w, size_t ws, size_t bsize, quants16_fn quants,
                                                 int bias, int q81, const void *a, size_t as, float *dst, size_t ds,
                                                 int64_t nr, int64_t nt)
{
    const int64_t nb = k / KIRI_QK8_0;
    const int64_t ng = (nr + 15) / 16;
    __m512 dw[MAX_GROUPS][CHUNK]; /* the rows' scales of one pass */
    __m512 dm[MAX_GROUPS][CHUNK]; /* q81: their offsets */
    for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
        const int64_t bn = min64(nb - b0, CHUNK);
        for (int64_t g = 0; g < ng; g++) {
            const char *rows[16];
            for (int i = 0; i < 16; i++)
                rows[i] = tile_row(w, ws, 16 * g + i, nr);
            for (int64_t b = 0; b < bn; b++) {
                dw[g][b] = scales16(rows, b0 + b, bsize);
                if (q81)
                    dm[g][b] = mins16(rows, b0 + b, bsize);
            }
        }
        int64_t t = 0;
        for (; nt - t >= 16; t += 16)
            tile_tokens(w, ws, quants, bias, q81, a, as, dst, ds, nr, nt, t, 16, b0, bn, dw, dm);
        for (; t < nt; t += 8)
            tile_tokens(w, ws, quants, bias, q81, a, as, dst, ds, nr, nt, t, 8, b0, bn, dw, dm);
    }
}

/* One token against the rows, 16 at a time, with the next group's rows prefetched (see
 * prefetch_rows in gemm_avx2.c: each row is too short a stream for the hardware prefetcher). */
AVX512 SPECIALIZE static inline void tile_rows(int64_t k, const void *w, size_t ws, size_t bsize, quants16_fn quants,
                                    int bias, const void *a, float *out, int64_t nr)
{
    const struct kiri_block_q8_0 *y = a;
    const int64_t nb = k / KIRI_QK8_0;
    for (int64_t r = 0; r < nr; r += 16) {
        const char *rows[16], *next[16];
        for (int i = 0; i < 16; i++) {
            rows[i] = tile_row(w, ws, r + i, nr);
            next[i] = r + 16 < nr ? tile_row(w, ws, r + 16 + i, nr) : NULL;
        }
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if (next[0] && (bsize >= 32 || !(b & 1))) { /* prefetches at most 64 bytes apart */
                UNROLL
                for (int i = 0; i < 16; i++)
                    _mm_prefetch(next[i] + (size_t)b * bsize, _MM_HINT_T0);
            }
            __m512i q[8];
            quants(rows, b, q);
            const __m512i s = _mm512_sub_epi32(dot16(q, y[b].qs), _mm512_set1_epi32(bias * sum_q8(&y[b])));
            const __m512 d = _mm512_mul_ps(scales16(rows, b, bsize), _mm512_set1_ps(_cvtsh_ss(y[b].d)));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc);
        }
        put16(out + r, acc, nr - r, 1);
    }
}

/* m (2..8) tokens against the rows, 16 at a time: a small batch (a serving step with a few
 * sequences, a verification step of drafted tokens) is memory-bound like one token, so each
 * block of 16 rows is transposed once for all m tokens and streamed with tile_rows's prefetch,
 * instead of once per token or padded to an octet whose table passes cost more than the tokens
 * they carry. q81: Q8_1 activations against Q4_1 or Q5_1, whose d and m are read as one word per
 * row, and their offsets' terms m s summed in chains of their own (as q4_one does). */
#define ROWS_M_MAX 8
AVX512 SPECIALIZE static inline void tile_rows_m(int64_t k, const void *w, size_t ws, size_t bsize, quants16_fn quants,
                                                 int bias, int q81, const void *a, size_t as, float *dst, size_t ds,
                                                 int64_t nr, int m)
{
    const size_t asz = act_size(q81), aqs = act_qs(q81);
    const char *y[ROWS_M_MAX];
    for (int j = 0; j < ROWS_M_MAX; j++)
        y[j] = tile_row(a, as, j, m); /* the last token repeated */
    const int64_t nb = k / KIRI_QK8_0;
    for (int64_t r = 0; r < nr; r += 16) {
        const char *rows[16], *next[16];
        for (int i = 0; i < 16; i++) {
            rows[i] = tile_row(w, ws, r + i, nr);
            next[i] = r + 16 < nr ? tile_row(w, ws, r + 16 + i, nr) : NULL;
        }
        __m512 acc[ROWS_M_MAX], accm[ROWS_M_MAX]; /* q81: the offsets' terms in chains of their own */
        _Pragma("GCC unroll 8")
        for (int j = 0; j < m; j++)
            acc[j] = accm[j] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if (next[0] && (bsize >= 32 || !(b & 1))) { /* as in tile_rows */
                UNROLL
                for (int i = 0; i < 16; i++)
                    _mm_prefetch(next[i] + (size_t)b * bsize, _MM_HINT_T0);
            }
            __m512i q[8];
            quants(rows, b, q);
            __m512 sw, smin = _mm512_setzero_ps();
            if (q81) { /* d and m, the block's first two halves, in one word */
                const __m512i dm = words16(rows, (size_t)b * bsize);
                sw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
                smin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
            } else {
                sw = scales16(rows, b, bsize);
            }
            _Pragma("GCC unroll 8")
            for (int j = 0; j < m; j++) {
                const char *yb = y[j] + (size_t)b * asz;
                const int8_t *aq = (const int8_t *)(yb + aqs);
                __m512i s = dot16(q, aq);
                if (bias)
                    s = _mm512_sub_epi32(s, _mm512_set1_epi32(bias * sum_i8x32(aq)));
                const __m512 d = _mm512_mul_ps(sw, _mm512_set1_ps(_cvtsh_ss(load_u16(yb))));
                acc[j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), d, acc[j]);
                if (q81)
                    accm[j] = _mm512_fmadd_ps(
                        smin, _mm512_set1_ps(_cvtsh_ss(load_u16(yb + offsetof(struct kiri_block_q8_1, s)))), accm[j]);
            }
        }
        _Pragma("GCC unroll 8")
        for (int j = 0; j < m; j++)
            put16(dst + (size_t)j * ds + r, q81 ? _mm512_add_ps(acc[j], accm[j]) : acc[j], nr - r, 1);
    }
}

/* The octets of tokens of a tile (the last one padded when it would carry 5 to 7), the rows in
 * pieces of MAX_GROUPS groups of 16; returns the first token not done (1 to 4 left, or none). */
AVX512 SPECIALIZE static inline int64_t octets16(int64_t k, const void *w, size_t ws, size_t bsize, quants16_fn quants,
                                                 int bias, int q81, const void *a, size_t as, float *dst, size_t ds,
                                                 int64_t nr, int64_t nt)
{
    int64_t t = nt - nt % 8;
    if (nt - t > 4)
        t = nt;
    if (t > 0)
        for (int64_t r = 0; r < nr; r += 16 * MAX_GROUPS)
            tile_octets(k, (const char *)w + (size_t)r * ws, ws, bsize, quants, bias, q81, a, as, dst + r, ds,
                        min64(nr - r, 16 * MAX_GROUPS), t);
    return t;
}

/* A tile: octets of tokens, then the rest of 1 to 4 tokens streamed over the rows once
 * (tile_rows, tile_rows_m). */
AVX512 SPECIALIZE static inline void gemm16(int64_t k, const void *w, size_t ws, size_t bsize, quants16_fn quants, int bias,
                                 const void *a, size_t as, float *dst, size_t ds, int64_t nr, int64_t nt)
{
    const int64_t t = octets16(k, w, ws, bsize, quants, bias, 0, a, as, dst, ds, nr, nt);
    const void *at = (const char *)a + (size_t)t * as;
    float *dt = dst + (size_t)t * ds;
    switch (nt - t) {
    case 4: tile_rows_m(k, w, ws, bsize, quants, bias, 0, at, as, dt, ds, nr, 4); break;
    case 3: tile_rows_m(k, w, ws, bsize, quants, bias, 0, at, as, dt, ds, nr, 3); break;
    case 2: tile_rows_m(k, w, ws, bsize, quants, bias, 0, at, as, dt, ds, nr, 2); break;
    case 1: tile_rows(k, w, ws, bsize, quants, bias, at, dt, nr); break;
    default: break;
    }
}

/* Q5_0, Q5_1: octets only; one to four tokens (decode, small batches, the rest of a tile)
 * take the AVX2 kernels. Q5_1 adds m s per block (Q8_1 activations); Q5_0's zero point 16
 * enters as 16 sum a. */
#define GEMM_OCTETS16(name, block, quants, bias, q81, small)                                               \
    AVX512 static void name(int64_t k, const void *w, size_t ws, const void *a, size_t as, float *dst,     \
                            size_t ds, int64_t nr, int64_t nt)                                           \
    {                                                                                                    \
        const int64_t t = octets16(k, w, ws, sizeof(block), quants, bias, q81, a, as, dst, ds, nr, nt);  \
        if (t < nt)                                                                                      \
            small(k, w, ws, (const char *)a + (size_t)t * as, as, dst + (size_t)t * ds, ds, nr, nt - t); \
    }

GEMM_OCTETS16(gemm_q5_0_avx512, struct kiri_block_q5_0, quants16_q5_0, 16, 0, kiri_cpu_gemm_small_q5_0_avx2)
GEMM_OCTETS16(gemm_q5_1_avx512, struct kiri_block_q5_1, quants16_q5_1, 0, 1, kiri_cpu_gemm_small_q5_1_avx2)

/* ---------------------------------------------------------------------------------------------
 * K-quants (Q4_K, Q6_K) against Q8_K activations. A super-block of 16 rows is unpacked once into
 * 64 registers' worth of transposed quants (vector v: values 4v .. 4v + 3 of each row) and the
 * rows' scales as vectors, then used for every token of an octet (or the one token).
 * Q4_K: sum x a = d_a (d sum_s sc_s sum_32(q a) - dmin sum_s m_s (bsums of sub-block s)).
 * Q6_K: sum x a = d_a d (sum_g sc_g sum_16(q a) - 32 sum_g sc_g bsums_g), q in 0..63.
 * The bsum terms use vpdpwssd on int16 pairs: [m_2i m_2i+1] against the token's sums over
 * sub-blocks 2i and 2i + 1 (its bsums added in pairs once per octet, kbsums) for Q4_K and Q5_K,
 * [sc_2i sc_2i+1] against bsums (2i, 2i + 1) for Q6_K.
 * ------------------------------------------------------------------------------------------- */

struct sb16 {
    __m512i q[64];   /* transposed quants, unsigned: Q4_K 0..15, Q5_K 0..31, Q6_K 0..63 */
    __m512i sc[16];  /* int32 scale of each row: Q4_K per sub-block of 32 (8), Q6_K per group of 16 */
    __m512i mp[8];   /* int16 pairs for the bsums term (Q4_K, Q5_K: mp[0..3]) */
    __m512 d, dmin;  /* per row; dmin unused for Q6_K */
};

/* Q4_K block layout: d, dmin (F16), 12 bytes of scales and mins, 128 bytes of nibbles (chunk j of
 * 32 bytes: low nibbles values 64j .. 64j + 31, high nibbles 64j + 32 ..). Q5_K has the same
 * header, then 32 bytes of fifth bits before the nibbles. The scales of u from the header at
 * byte base of each row. */
_Static_assert(offsetof(struct kiri_block_q5_K, scales) == offsetof(struct kiri_block_q4_K, scales) &&
                   offsetof(struct kiri_block_q5_K, dmin) == offsetof(struct kiri_block_q4_K, dmin),
               "Q4_K and Q5_K share their header");

AVX512 static inline void scales16_k4(const char *const rows[16], size_t base, struct sb16 *u)
{
    __m512i g[4];
    /* Bytes 0..15: [d dmin] [scales 0-3] [4-7] [8-11], one dword each. */
    transpose16(rows, base, g);
    u->d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(g[0]));
    u->dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(g[0], 16)));
    /* The word operations of get_scale_min_k4 (quants.c), on 16 rows at once. */
    const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f),
                  h2 = _mm512_set1_epi32(0x30303030);
    const __m512i sc03 = _mm512_and_si512(g[1], m6);
    const __m512i sc47 = _mm512_or_si512(_mm512_and_si512(g[3], m4), _mm512_and_si512(_mm512_srli_epi32(g[1], 2), h2));
    const __m512i mn03 = _mm512_and_si512(g[2], m6);
    const __m512i mn47 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(g[3], 4), m4),
                                         _mm512_and_si512(_mm512_srli_epi32(g[2], 2), h2));
    const __m512i byte = _mm512_set1_epi32(0xFF);
    UNROLL
    for (int s = 0; s < 4; s++) {
        u->sc[s] = _mm512_and_si512(_mm512_srli_epi32(sc03, (unsigned)(8 * s)), byte);
        u->sc[s + 4] = _mm512_and_si512(_mm512_srli_epi32(sc47, (unsigned)(8 * s)), byte);
    }
    /* Words [m_2i m_2i+1]: the even bytes of mn03 (mn47) hold m0 m2 (m4 m6), the odd ones m1 m3. */
    const __m512i w8 = _mm512_set1_epi32(0x00FF00FF);
    UNROLL
    for (int h = 0; h < 2; h++) {
        const __m512i mn = h ? mn47 : mn03;
        const __m512i even = _mm512_and_si512(mn, w8), odd = _mm512_and_si512(_mm512_srli_epi32(mn, 8), w8);
        u->mp[2 * h] = _mm512_mask_blend_epi16(0xAAAAAAAA, even, _mm512_slli_epi32(odd, 16));
        u->mp[2 * h + 1] = _mm512_mask_blend_epi16(0xAAAAAAAA, _mm512_srli_epi32(even, 16), odd);
    }
}

/* The nibbles of the 32 bytes at qs (a chunk of values 64j .. 64j + 63) into q[0..15]: q[m] and
 * q[4 + m] are the low nibbles of bytes 4m .. 4m + 3 and 16 + 4m .., q[8 + m] and q[12 + m] the
 * high nibbles of the same bytes (vector v: values 64j + 4v ..). */
AVX512 static inline void nibbles16_k(const char *const rows[16], size_t qs, __m512i q[16])
{
    const __m512i m4b = _mm512_set1_epi8(0x0F);
    __m512i g[4];
    transpose16(rows, qs, g);
    UNROLL
    for (int m = 0; m < 4; m++) {
        q[m] = _mm512_and_si512(g[m], m4b);
        q[8 + m] = _mm512_and_si512(_mm512_srli_epi16(g[m], 4), m4b);
    }
    transpose16(rows, qs + 16, g);
    UNROLL
    for (int m = 0; m < 4; m++) {
        q[4 + m] = _mm512_and_si512(g[m], m4b);
        q[12 + m] = _mm512_and_si512(_mm512_srli_epi16(g[m], 4), m4b);
    }
}

AVX512 static inline void unpack16_q4_K(const char *const rows[16], int64_t b, struct sb16 *u)
{
    const size_t base = (size_t)b * sizeof(struct kiri_block_q4_K);
    scales16_k4(rows, base, u);
    UNROLL
    for (int j = 0; j < 4; j++)
        nibbles16_k(rows, base + offsetof(struct kiri_block_q4_K, qs) + 32 * (size_t)j, u->q + 16 * j);
}

/* Bit `bit` of each byte of h moved to bit 4 (the other bits unspecified). */
AVX512 static inline __m512i bit_to_4(__m512i h, int bit)
{
    return bit <= 4 ? _mm512_slli_epi16(h, (unsigned)(4 - bit)) : _mm512_srli_epi16(h, (unsigned)(bit - 4));
}

/* Q5_K: the Q4_K nibbles with the fifth bits, quants 0..31. Value 64j + l (l < 32) takes bit 2j
 * of qh[l], value 64j + 32 + l bit 2j + 1; qh transposed like the nibbles (h[m]: bytes 4m ..
 * 4m + 3, the l of q[16j + m] and q[16j + 8 + m]). */
AVX512 static inline void unpack16_q5_K(const char *const rows[16], int64_t b, struct sb16 *u)
{
    const size_t base = (size_t)b * sizeof(struct kiri_block_q5_K);
    const __m512i b4 = _mm512_set1_epi8(0x10);
    scales16_k4(rows, base, u);
    __m512i h[8];
    transpose16(rows, base + offsetof(struct kiri_block_q5_K, qh), h);
    transpose16(rows, base + offsetof(struct kiri_block_q5_K, qh) + 16, h + 4);
    UNROLL
    for (int j = 0; j < 4; j++) {
        __m512i *q = u->q + 16 * j;
        nibbles16_k(rows, base + offsetof(struct kiri_block_q5_K, qs) + 32 * (size_t)j, q);
        UNROLL
        for (int m = 0; m < 8; m++) {
            q[m] = _mm512_or_si512(q[m], _mm512_and_si512(bit_to_4(h[m], 2 * j), b4));
            q[8 + m] = _mm512_or_si512(q[8 + m], _mm512_and_si512(bit_to_4(h[m], 2 * j + 1), b4));
        }
    }
}

/* Q6_K block layout: ql (128), qh (64), scales (16 int8), d (F16). Half h of 128 values: value
 * 128h + 32c + l (c = 0..3, l = 0..31) has its low 4 bits in ql[64h + l + 32 (c & 1)] (low nibble
 * for c < 2, high for c >= 2) and its high 2 bits at bit 2c of qh[32h + l]. */
/* The quants of values 128h + 32c + 16 part + 4m (c, m = 0..3) into q[4c + m]: the groups of 16
 * values 8h + 2c + part. */
AVX512 static inline void quants16_q6_K(const char *const rows[16], int64_t b, int h, int part, __m512i q[16])
{
    const size_t base = (size_t)b * sizeof(struct kiri_block_q6_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    __m512i la[4], lb[4], hb[4];
    transpose16(rows, base + 64 * (size_t)h + 16 * (size_t)part, la);
    transpose16(rows, base + 64 * (size_t)h + 32 + 16 * (size_t)part, lb);
    transpose16(rows, base + offsetof(struct kiri_block_q6_K, qh) + 32 * (size_t)h + 16 * (size_t)part, hb);
    UNROLL
    for (int m = 0; m < 4; m++) {
        q[m] = _mm512_or_si512(_mm512_and_si512(la[m], m4), _mm512_and_si512(_mm512_slli_epi16(hb[m], 4), m30));
        q[4 + m] = _mm512_or_si512(_mm512_and_si512(lb[m], m4), _mm512_and_si512(_mm512_slli_epi16(hb[m], 2), m30));
        q[8 + m] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(la[m], 4), m4), _mm512_and_si512(hb[m], m30));
        q[12 + m] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(lb[m], 4), m4),
                                    _mm512_and_si512(_mm512_srli_epi16(hb[m], 2), m30));
    }
}

/* The scales of u (Q6_K). */
AVX512 static inline void scales16_q6_K(const char *const rows[16], int64_t b, struct sb16 *u)
{
    const size_t base = (size_t)b * sizeof(struct kiri_block_q6_K);
    __m512i g[4];
    transpose16(rows, base + offsetof(struct kiri_block_q6_K, scales), g);
    UNROLL
    for (int c = 0; c < 4; c++) {
        UNROLL
        for (int i = 0; i < 4; i++) /* scale 4c + i: byte i of dword c, sign-extended */
            u->sc[4 * c + i] = _mm512_srai_epi32(_mm512_slli_epi32(g[c], (unsigned)(24 - 8 * i)), 24);
        /* Words [sc_4c sc_4c+1] and [sc_4c+2 sc_4c+3], each sign-extended. */
        const __m512i even = _mm512_srai_epi16(_mm512_slli_epi16(g[c], 8), 8); /* [s0 s2] */
        const __m512i odd = _mm512_srai_epi16(g[c], 8);                         /* [s1 s3] */
        u->mp[2 * c] = _mm512_mask_blend_epi16(0xAAAAAAAA, even, _mm512_slli_epi32(odd, 16));
        u->mp[2 * c + 1] = _mm512_mask_blend_epi16(0xAAAAAAAA, _mm512_srli_epi32(even, 16), odd);
    }
    const size_t od = base + offsetof(struct kiri_block_q6_K, d);
    const __m256i dh = _mm256_setr_epi16(
        (short)load_u16(rows[0] + od), (short)load_u16(rows[1] + od), (short)load_u16(rows[2] + od),
        (short)load_u16(rows[3] + od), (short)load_u16(rows[4] + od), (short)load_u16(rows[5] + od),
        (short)load_u16(rows[6] + od), (short)load_u16(rows[7] + od), (short)load_u16(rows[8] + od),
        (short)load_u16(rows[9] + od), (short)load_u16(rows[10] + od), (short)load_u16(rows[11] + od),
        (short)load_u16(rows[12] + od), (short)load_u16(rows[13] + od), (short)load_u16(rows[14] + od),
        (short)load_u16(rows[15] + od));
    u->d = _mm512_cvtph_ps(dh);
    u->dmin = _mm512_setzero_ps();
}

AVX512 static inline void unpack16_q6_K(const char *const rows[16], int64_t b, struct sb16 *u)
{
    scales16_q6_K(rows, b, u);
    UNROLL
    for (int h = 0; h < 2; h++)
        UNROLL
        for (int part = 0; part < 2; part++) {
            __m512i q[16];
            quants16_q6_K(rows, b, h, part, q);
            UNROLL
            for (int c = 0; c < 4; c++)
                UNROLL
                for (int m = 0; m < 4; m++) /* values 128h + 32c + 16 part + 4m */
                    u->q[32 * h + 8 * c + 4 * part + m] = q[4 * c + m];
        }
}

/* s + vpdpbusd(q, the 4 bytes at a in every lane), the bytes broadcast by the instruction's own
 * memory operand: compilers emit a separate broadcast load for the intrinsic, and in the octet
 * loops those loads were as many instructions as the products. */
AVX512 static inline __m512i dpbusd_bcst(__m512i s, __m512i q, const int8_t *a)
{
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(s) : "v"(q), "m"(*(const int32_t(*)[1])a));
    return s;
}

/* s + vpdpwssd(p, the two int16 at b in every lane), broadcast the same way. */
AVX512 static inline __m512i dpwssd_bcst(__m512i s, __m512i p, const int16_t *b)
{
    __asm__("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(s) : "v"(p), "m"(*(const int32_t(*)[1])b));
    return s;
}

/* The sum over n vectors of the transposed quants from vector v0 on, against the activation
 * values from 4 v0 on: lane i is row i's integer sum. One chain: the eight tokens of an octet
 * run eight side by side (two chains each took more registers than there are, and spilled). */
AVX512 static inline __m512i dot_k(const __m512i *q, const int8_t *a, int n)
{
    __m512i s = _mm512_setzero_si512();
    UNROLL
    for (int v = 0; v < n; v++)
        s = dpbusd_bcst(s, q[v], a + 4 * v);
    return s;
}

/* A Q8_K block's sums over its eight sub-blocks of 32 values, as int16 (at most 32 * 127 in
 * magnitude): half as many vpdpwssd for Q4_K's and Q5_K's mins as the bsums of 16 values take. */
AVX512 static inline void kbsums(const struct kiri_block_q8_K *y, int16_t out[8])
{
    const __m256i b = _mm256_loadu_si256((const __m256i *)y->bsums);
    _mm_storeu_si128((__m128i *)out, _mm256_cvtepi32_epi16(_mm256_add_epi16(b, _mm256_srli_epi32(b, 16))));
}

/* The bsums term and the float update of one token (integer sums isum) into acc; ks: the token's
 * kbsums (Q4_K, Q5_K). */
AVX512 static inline __m512 finish_k(const struct sb16 *u, const struct kiri_block_q8_K *y, const int16_t *ks, int q6,
                                     __m512i isum, __m512 acc)
{
    __m512i ib = _mm512_setzero_si512();
    UNROLL
    for (int i = 0; i < 8; i++) {
        if (q6)
            ib = dpwssd_bcst(ib, u->mp[i], y->bsums + 2 * i);
        else if (i < 4)
            ib = dpwssd_bcst(ib, u->mp[i], ks + 2 * i);
    }
    const __m512 dy = _mm512_set1_ps(y->d);
    if (q6) {
        const __m512i s = _mm512_sub_epi32(isum, _mm512_slli_epi32(ib, 5));
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(u->d, dy), acc);
    }
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(u->d, dy), acc);
    return _mm512_fnmadd_ps(_mm512_cvtepi32_ps(ib), _mm512_mul_ps(u->dmin, dy), acc);
}

/* 8 tokens against an unpacked super-block: for each group of quants (held in registers) every
 * token's sum, so the quants are loaded once per group, not once per token. */
AVX512 SPECIALIZE static inline void tokens_k(const struct sb16 *u, const struct kiri_block_q8_K *const *y, int64_t b,
                                              const int16_t (*ks)[8], int q6, __m512 acc[8])
{
    __m512i isum[8];
    UNROLL
    for (int i = 0; i < 8; i++)
        isum[i] = _mm512_setzero_si512();
    const int ng = q6 ? 16 : 8, per = q6 ? 4 : 8;
    UNROLL
    for (int g = 0; g < ng; g++) {
        __m512i q[8];
        UNROLL
        for (int v = 0; v < per; v++)
            q[v] = u->q[per * g + v];
        UNROLL
        for (int i = 0; i < 8; i++)
            isum[i] = _mm512_add_epi32(isum[i], _mm512_mullo_epi32(dot_k(q, y[i][b].qs + 4 * per * g, per), u->sc[g]));
    }
    UNROLL
    for (int i = 0; i < 8; i++)
        acc[i] = finish_k(u, &y[i][b], ks[i], q6, isum[i], acc[i]);
}

typedef void (*unpack16_fn)(const char *const rows[16], int64_t b, struct sb16 *u);

/* Super-blocks of 16 rows unpacked at a time by gemm16_k: 8 of them (2048 values) take 45 KiB,
 * which stay in L1 and L2 while every token of the tile passes over them. */
#define K_CHUNK 8

/* The octets of tokens of a tile of K-quant rows: per group of 16 rows, up to K_CHUNK super-blocks
 * are unpacked once, then serve every token, 8 at a time (16 at a time, the accumulators and
 * sums no longer fit in the 32 registers: one thread, 2048 x 2048 against 512 tokens, Q6_K 24.8
 * -> 14.4 ms, Q4_K and Q5_K 4% faster); the partial sums of a chunk are added to dst. Returns the first token not done (the single tokens left over, 1 or 2, or all of
 * them when nt <= 4), which the one-token kernels below take: up to four tokens, one streaming pass
 * each costs less than a padded octet, whose transposition runs far below the memory's speed
 * (bench_vec_dot's small-batch table). */
AVX512 SPECIALIZE static inline int64_t gemm16_k(int64_t k, const void *w, size_t ws, unpack16_fn unpack, int q6,
                                                 const void *a, size_t as, float *dst, size_t ds, int64_t nr,
                                                 int64_t nt)
{
    const int64_t nb = k / KIRI_QK_K;
    struct sb16 u[K_CHUNK];
    int64_t t_oct = nt <= 4 ? 0 : nt - nt % 8;
    if (nt > 4 && nt - t_oct >= 3)
        t_oct = nt;
    for (int64_t r = 0; r < nr && t_oct > 0; r += 16) {
        const char *rows[16];
        for (int i = 0; i < 16; i++)
            rows[i] = tile_row(w, ws, r + i, nr);
        for (int64_t b0 = 0; b0 < nb; b0 += K_CHUNK) {
            const int64_t b1 = nb - b0 < K_CHUNK ? nb : b0 + K_CHUNK;
            for (int64_t b = b0; b < b1; b++)
                unpack(rows, b, &u[b - b0]);
            for (int64_t t = 0; t < t_oct; t += 8) {
                const struct kiri_block_q8_K *y[8];
                for (int i = 0; i < 8; i++)
                    y[i] = (const struct kiri_block_q8_K *)tile_row(a, as, t + i, t_oct);
                _Alignas(16) int16_t ks[K_CHUNK][8][8]; /* Q4_K, Q5_K: the octet's kbsums */
                for (int64_t b = b0; !q6 && b < b1; b++)
                    for (int i = 0; i < 8; i++)
                        kbsums(&y[i][b], ks[b - b0][i]);
                __m512 acc[8];
                UNROLL
                for (int i = 0; i < 8; i++)
                    acc[i] = _mm512_setzero_ps();
                for (int64_t b = b0; b < b1; b++)
                    tokens_k(&u[b - b0], y, b, (const int16_t (*)[8])ks[b - b0], q6, acc);
                for (int i = 0; i < 8 && t + i < t_oct; i++)
                    put16(dst + (size_t)(t + i) * ds + (size_t)r, acc[i], nr - r, b0 == 0);
            }
        }
    }
    return t_oct;
}

/* ---------------------------------------------------------------------------------------------
 * One token (decode) against K-quant rows, four rows at a time. Decode reads every weight once,
 * so the kernel must keep up with memory: the rows are read as they lie (no transposition), four
 * neighbouring rows side by side, which the hardware prefetchers follow, with the next four rows
 * prefetched in software. Per super-block the activation's registers (and its bsums terms) are
 * loaded once for the four rows. The products use maddubs (u8 x s8 pairs into int16, exact:
 * 2 * 63 * 127 < 2^15) and vpdpwssd, which multiplies those pairs by the int16 sub-block scales
 * and adds them to int32 lanes in one step; a 4-row fold then puts the rows' partial sums side by
 * side ([r0 r1 r2 r3] in each 128-bit lane), so the float work is one conversion and one FMA per
 * super-block for all four rows.
 * ------------------------------------------------------------------------------------------- */

/* Folds four rows' 16 int32 lanes into [r0 r1 r2 r3] partial sums per 128-bit lane. */
AVX512 static inline __m512i fold4(__m512i i0, __m512i i1, __m512i i2, __m512i i3)
{
    const __m512i t0 = _mm512_add_epi32(_mm512_unpacklo_epi32(i0, i1), _mm512_unpackhi_epi32(i0, i1));
    const __m512i t1 = _mm512_add_epi32(_mm512_unpacklo_epi32(i2, i3), _mm512_unpackhi_epi32(i2, i3));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1));
}

/* The four rows' sums of a folded float accumulator (the four 128-bit lanes added). */
AVX512 static inline __m128 fold4_sum(__m512 v)
{
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* 16 bytes at offset off of four rows, row i in 128-bit lane i. */
AVX512 static inline __m512i lanes4(const char *const x[4], size_t off)
{
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(x[0] + off)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x[1] + off)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x[2] + off)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(x[3] + off)), 3);
}

/* Stores the four results of rows r .. r + 3 (those below nr). */
static inline void put4(float *out, const float v[4], int64_t r, int64_t nr)
{
    for (int i = 0; i < 4 && r + i < nr; i++)
        out[r + i] = v[i];
}

/* Stores the results of rows r .. r + 7 (those below nr) from two quads' sums. */
AVX512 static inline void put8(float *out, __m128 acc0, __m128 acc1, int64_t r, int64_t nr)
{
    float v[4];
    _mm_storeu_ps(v, acc0);
    put4(out, v, r, nr);
    if (r + 4 < nr) {
        _mm_storeu_ps(v, acc1);
        put4(out, v, r + 4, nr);
    }
}

/* One-token kernels prefetch the rows this far ahead (two groups of four): the same bytes of
 * those rows as the group now multiplied reads, so the lines arrive about when they are needed.
 * Measured on rows of 1 to 5 KiB: one group ahead, three or four groups ahead, a prefetch to L2
 * only, or a second, farther prefetch to L2 were all slower. */
#define PREFETCH_ROWS 8

/* Where the K-quant one-token and small-batch kernels and the Q4_0 one-token kernel prefetch to.
 * On a Zen 4 (family 19h) the first-level prefetches of those kernels capped a thread's streaming
 * at about a third of the memory bandwidth, and prefetching into L2 instead doubled it
 * (bench_vec_dot, one-token GB/s from DRAM: Q4_K 9.1 -> 12.8, Q6_K 6.8 -> 14.6, Q4_0 4.8-9.5 ->
 * 14.7-16.0); on a Zen 5 the first level was the faster one. */
enum prefetch_level { PREFETCH_L1, PREFETCH_L2 };

/* vpermw indices for the sub-block scales of Q4_K: row i's 8 scales are words 8i .. 8i + 7 of
 * the unpacked vector; vector j of a row's products holds sub-blocks (0|2), (1|3), (4|6), (5|7)
 * in its low and high 256 bits. */
static const uint16_t q4k_scale_idx[4][4][32] = {
#define Q4K_IDX(i, lo, hi)                                                                                   \
    {8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo),         \
     8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo),         \
     8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (lo), 8 * (i) + (hi), 8 * (i) + (hi),         \
     8 * (i) + (hi), 8 * (i) + (hi), 8 * (i) + (hi), 8 * (i) + (hi), 8 * (i) + (hi), 8 * (i) + (hi),         \
     8 * (i) + (hi), 8 * (i) + (hi), 8 * (i) + (hi), 8 * (i) + (hi), 8 * (i) + (hi), 8 * (i) + (hi),         \
     8 * (i) + (hi), 8 * (i) + (hi)}
#define Q4K_ROW(i) {Q4K_IDX(i, 0, 2), Q4K_IDX(i, 1, 3), Q4K_IDX(i, 4, 6), Q4K_IDX(i, 5, 7)}
    Q4K_ROW(0), Q4K_ROW(1), Q4K_ROW(2), Q4K_ROW(3)
#undef Q4K_ROW
#undef Q4K_IDX
};

/* Q4_K (five == 0) or Q5_K (five == 1) rows against m tokens (1..4): sum x a = d_a (d sum_s sc_s
 * sum(q a) - dmin sum_s m_s bsum_s), q in 0..15 or 0..31 (maddubs stays exact: 2 * 31 * 127 <
 * 2^15). Per super-block the four rows' scales and quants are unpacked once and used for each
 * token, so a small batch (a serving step of a few sequences) streams the weights once like one
 * token. Each token's float operations are the one-token kernel's, in its order, so a token gets
 * the same floats alone or in a batch. */
AVX512 SPECIALIZE static inline void q4_K_rows(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int m, enum prefetch_level lv,
                                               int five)
{
    const struct kiri_block_q8_K *y[4];
    for (int t = 0; t < 4; t++)
        y[t] = (const struct kiri_block_q8_K *)((const char *)a + (size_t)(t < m ? t : 0) * as);
    const int64_t nb = k / KIRI_QK_K;
    const size_t bs = five ? sizeof(struct kiri_block_q5_K) : sizeof(struct kiri_block_q4_K);
    const size_t qs_at = five ? offsetof(struct kiri_block_q5_K, qs) : offsetof(struct kiri_block_q4_K, qs);
    const __m512i m4 = _mm512_set1_epi8(0x0F), zero = _mm512_setzero_si512(), b4 = _mm512_set1_epi8(0x10);
    /* Q5_K's fifth bits: the 32 qh bytes in both 256-bit halves; value 64j + l (l < 32) takes bit
     * 2j of qh[l], value 64j + 32 + l bit 2j + 1. The quant vectors v0 .. v3 below hold values
     * (0.., 64..), (32.., 96..), (128.., 192..), (160.., 224..) in their (low, high) 256-bit
     * halves, so they take bits (0, 2), (1, 3), (4, 6), (5, 7), moved to bit 4 by word shifts of
     * at most 4 (no bit of the other byte of a word reaches bit 4). */
    const __m512i sh0 = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1); /* left */
    const __m512i sh1 = _mm512_inserti64x4(_mm512_set1_epi16(3), _mm256_set1_epi16(1), 1); /* left */
    const __m512i sh2 = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1); /* right */
    const __m512i sh3 = _mm512_inserti64x4(_mm512_set1_epi16(1), _mm256_set1_epi16(3), 1); /* right */
    /* The word operations of get_scale_min_k4 (quants.c) on dwords 1..3 (w0 w1 w2) of each lane:
     * [w0 & 3f, w2 & 0f | (w0 >> 2) & 30, w1 & 3f, (w2 >> 4) & 0f | (w1 >> 2) & 30]. */
    const __m512i shl = _mm512_set_epi32(4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0, 4, 0, 0, 0);
    const __m512i mlo = _mm512_set4_epi32(0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f);
    const __m512i mhi = _mm512_set4_epi32(0x30303030, 0, 0x30303030, 0);
    for (int64_t r = 0; r < nr; r += 4) {
        const char *x[4];
        for (int i = 0; i < 4; i++)
            x[i] = tile_row(w, ws, r + i, nr);
        const int pf = r + PREFETCH_ROWS < nr;
        __m512 accq[4], accm[4];
        UNROLL
        for (int t = 0; t < 4; t++)
            accq[t] = accm[t] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const size_t o = (size_t)b * bs;
            if (pf) /* written out: GCC 12 dropped a helper's prefetches in this inlined body */
                for (int i = 0; i < 4; i++)
                    for (size_t po = 0; po < bs; po += 64) {
                        if (lv == PREFETCH_L2)
                            _mm_prefetch(x[i] + PREFETCH_ROWS * ws + o + po, _MM_HINT_T1);
                        else
                            _mm_prefetch(x[i] + PREFETCH_ROWS * ws + o + po, _MM_HINT_T0);
                    }
            /* Each token's activation, in the order of the rows' nibble vectors (see above), and
             * its bsums of each sub-block (pairs of 16) as 8 int16 in every lane. */
            __m512i p[4][4], bs2[4];
            UNROLL
            for (int t = 0; t < 4; t++) {
                if (t >= m)
                    break;
                const int8_t *aq = y[t][b].qs;
                const __m512i a0 = _mm512_loadu_si512(aq), a1 = _mm512_loadu_si512(aq + 64);
                const __m512i a2 = _mm512_loadu_si512(aq + 128), a3 = _mm512_loadu_si512(aq + 192);
                p[t][0] = _mm512_shuffle_i64x2(a0, a1, 0x44);
                p[t][1] = _mm512_shuffle_i64x2(a0, a1, 0xEE);
                p[t][2] = _mm512_shuffle_i64x2(a2, a3, 0x44);
                p[t][3] = _mm512_shuffle_i64x2(a2, a3, 0xEE);
                const __m256i bsv = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)y[t][b].bsums), _mm256_set1_epi16(1));
                const __m128i bs8 = _mm_packs_epi32(_mm256_castsi256_si128(bsv), _mm256_extracti128_si256(bsv, 1));
                bs2[t] = _mm512_broadcast_i32x4(bs8);
            }

            /* Header of the four rows: [d dmin | scales 0-11] in lane i. */
            const __m512i hd = lanes4(x, o);
            const __m512i sa = _mm512_shuffle_epi32(hd, _MM_PERM_DCDB); /* w0 w2 w1 w2 */
            const __m512i sb = _mm512_shuffle_epi32(hd, _MM_PERM_CCBB); /* w0 w0 w1 w1 */
            const __m512i u = _mm512_or_si512(_mm512_and_si512(_mm512_srlv_epi32(sa, shl), mlo),
                                              _mm512_and_si512(_mm512_srli_epi32(sb, 2), mhi));
            const __m512i scw = _mm512_unpacklo_epi8(u, zero); /* lane i: row i's 8 scales */
            const __m512i mnw = _mm512_unpackhi_epi8(u, zero); /* lane i: row i's 8 mins */
            /* d and dmin: [d0 d1 d2 d3] in every lane; dmin per lane of its row. */
            const __m512i dq = _mm512_permutexvar_epi32(_mm512_set4_epi32(12, 8, 4, 0), hd);
            const __m512 dr = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dq));
            const __m512 dmr = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_shuffle_epi32(hd, _MM_PERM_AAAA), 16)));

            __m512i is[4][4];
            UNROLL
            for (int i = 0; i < 4; i++) {
                const char *qs = x[i] + o + qs_at;
                const __m512i q0 = _mm512_loadu_si512(qs), q1 = _mm512_loadu_si512(qs + 64);
                __m512i v0 = _mm512_and_si512(q0, m4), v1 = _mm512_and_si512(_mm512_srli_epi16(q0, 4), m4);
                __m512i v2 = _mm512_and_si512(q1, m4), v3 = _mm512_and_si512(_mm512_srli_epi16(q1, 4), m4);
                if (five) { /* v | (bit moved to 4 & 0x10): ternary-logic table 0xF8 = A | (B & C) */
                    const __m512i h = _mm512_broadcast_i64x4(
                        _mm256_loadu_si256((const __m256i *)(x[i] + o + offsetof(struct kiri_block_q5_K, qh))));
                    v0 = _mm512_ternarylogic_epi32(v0, _mm512_sllv_epi16(h, sh0), b4, 0xF8);
                    v1 = _mm512_ternarylogic_epi32(v1, _mm512_sllv_epi16(h, sh1), b4, 0xF8);
                    v2 = _mm512_ternarylogic_epi32(v2, _mm512_srlv_epi16(h, sh2), b4, 0xF8);
                    v3 = _mm512_ternarylogic_epi32(v3, _mm512_srlv_epi16(h, sh3), b4, 0xF8);
                }
                const __m512i *ix = (const __m512i *)q4k_scale_idx[i];
                const __m512i s0 = _mm512_permutexvar_epi16(_mm512_loadu_si512(ix), scw);
                const __m512i s1 = _mm512_permutexvar_epi16(_mm512_loadu_si512(ix + 1), scw);
                const __m512i s2 = _mm512_permutexvar_epi16(_mm512_loadu_si512(ix + 2), scw);
                const __m512i s3 = _mm512_permutexvar_epi16(_mm512_loadu_si512(ix + 3), scw);
                UNROLL
                for (int t = 0; t < 4; t++) {
                    if (t >= m)
                        break;
                    __m512i s = _mm512_madd_epi16(_mm512_maddubs_epi16(v0, p[t][0]), s0);
                    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(v1, p[t][1]), s1);
                    s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(v2, p[t][2]), s2);
                    is[t][i] = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(v3, p[t][3]), s3);
                }
            }
            UNROLL
            for (int t = 0; t < 4; t++) {
                if (t >= m)
                    break;
                /* The mins term, lane i = row i (four partial sums). */
                const __m512i im = _mm512_madd_epi16(mnw, bs2[t]);
                const __m512 dy = _mm512_set1_ps(y[t][b].d);
                accq[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold4(is[t][0], is[t][1], is[t][2], is[t][3])),
                                          _mm512_mul_ps(dr, dy), accq[t]);
                accm[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(im), _mm512_mul_ps(dmr, dy), accm[t]);
            }
        }
        for (int t = 0; t < m; t++) {
            /* accm holds row i's four partial sums in lane i: transpose them into the fold's order. */
            float q[4], mm[16], v[4];
            _mm_storeu_ps(q, fold4_sum(accq[t]));
            _mm512_storeu_ps(mm, accm[t]);
            for (int i = 0; i < 4; i++)
                v[i] = q[i] - ((mm[4 * i] + mm[4 * i + 1]) + (mm[4 * i + 2] + mm[4 * i + 3]));
            put4(dst + (size_t)t * ds, v, r, nr);
        }
    }
}

/* One token, Q4_K (five == 0) or Q5_K (five == 1). */
AVX512 OUT_OF_LINE static void q4_K_rows4(int64_t k, const void *w, size_t ws, const void *a, float *out, int64_t nr,
                                          enum prefetch_level lv, int five)
{
    if (five) {
        if (lv == PREFETCH_L2)
            q4_K_rows(k, w, ws, a, 0, out, 0, nr, 1, PREFETCH_L2, 1);
        else
            q4_K_rows(k, w, ws, a, 0, out, 0, nr, 1, PREFETCH_L1, 1);
        return;
    }
    if (lv == PREFETCH_L2)
        q4_K_rows(k, w, ws, a, 0, out, 0, nr, 1, PREFETCH_L2, 0);
    else
        q4_K_rows(k, w, ws, a, 0, out, 0, nr, 1, PREFETCH_L1, 0);
}

/* 2-4 tokens; the dispatch turns m into a constant. */
AVX512 SPECIALIZE static inline void q4_K_rows_m(int64_t k, const void *w, size_t ws, const void *a, size_t as, float *dst,
                                      size_t ds, int64_t nr, int m, enum prefetch_level lv, int five)
{
    if (lv == PREFETCH_L2) {
        switch (m) {
        case 2: q4_K_rows(k, w, ws, a, as, dst, ds, nr, 2, PREFETCH_L2, five); break;
        case 3: q4_K_rows(k, w, ws, a, as, dst, ds, nr, 3, PREFETCH_L2, five); break;
        default: q4_K_rows(k, w, ws, a, as, dst, ds, nr, 4, PREFETCH_L2, five); break;
        }
        return;
    }
    switch (m) {
    case 2: q4_K_rows(k, w, ws, a, as, dst, ds, nr, 2, PREFETCH_L1, five); break;
    case 3: q4_K_rows(k, w, ws, a, as, dst, ds, nr, 3, PREFETCH_L1, five); break;
    default: q4_K_rows(k, w, ws, a, as, dst, ds, nr, 4, PREFETCH_L1, five); break;
    }
}

AVX512 OUT_OF_LINE static void q4_K_rows_small(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int m, enum prefetch_level lv,
                                               int five)
{
    if (five)
        q4_K_rows_m(k, w, ws, a, as, dst, ds, nr, m, lv, 1);
    else
        q4_K_rows_m(k, w, ws, a, as, dst, ds, nr, m, lv, 0);
}

/* vpermw indices for Q6_K: vector j of a row's products holds the groups of 16 values 4j .. 4j + 3,
 * one per 128-bit lane; the scales are words 0..15. */
static const uint16_t q6k_scale_idx[4][32] = {
#define Q6K_IDX(j)                                                                                           \
    {4 * (j), 4 * (j), 4 * (j), 4 * (j), 4 * (j), 4 * (j), 4 * (j), 4 * (j),                                 \
     4 * (j) + 1, 4 * (j) + 1, 4 * (j) + 1, 4 * (j) + 1, 4 * (j) + 1, 4 * (j) + 1, 4 * (j) + 1, 4 * (j) + 1, \
     4 * (j) + 2, 4 * (j) + 2, 4 * (j) + 2, 4 * (j) + 2, 4 * (j) + 2, 4 * (j) + 2, 4 * (j) + 2, 4 * (j) + 2, \
     4 * (j) + 3, 4 * (j) + 3, 4 * (j) + 3, 4 * (j) + 3, 4 * (j) + 3, 4 * (j) + 3, 4 * (j) + 3, 4 * (j) + 3}
    Q6K_IDX(0), Q6K_IDX(1), Q6K_IDX(2), Q6K_IDX(3)
#undef Q6K_IDX
};

/* Q6_K rows against m tokens (1..4): sum x a = d_a d (sum_g sc_g sum(q a) - 32 sum_g sc_g bsum_g),
 * q in 0..63. The bias enters the same int32 lanes as (2 sc_g) (-16 bsum_g), both factors in int16
 * range (16 * 16 * 127 < 2^15). Half h of a block: 64 bytes of low nibbles give values
 * 128h .. 128h + 63 (low nibbles) and 128h + 64 .. (high nibbles) in order, and the 32 bytes of
 * high bits, in both 256-bit halves, are shifted into place per half. Per super-block each row's
 * quants and scales are unpacked once and used for each token, so a small batch streams the
 * weights once like one token; each token's float operations are the one-token kernel's, in its
 * order. */
AVX512 SPECIALIZE static inline void q6_K_rows(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int m, enum prefetch_level lv)
{
    const struct kiri_block_q8_K *y[4];
    for (int t = 0; t < 4; t++)
        y[t] = (const struct kiri_block_q8_K *)((const char *)a + (size_t)(t < m ? t : 0) * as);
    const int64_t nb = k / KIRI_QK_K;
    const size_t bs = sizeof(struct kiri_block_q6_K);
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    /* Values 32c + l take bits 2c, 2c + 1 of qh[l]: moved to bits 4, 5. */
    const __m512i sh_lo = _mm512_inserti64x4(_mm512_set1_epi16(4), _mm256_set1_epi16(2), 1); /* c = 0, 1: left */
    const __m512i sh_hi = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(2), 1); /* c = 2, 3: right */
    for (int64_t r = 0; r < nr; r += 4) {
        const char *x[4];
        for (int i = 0; i < 4; i++)
            x[i] = tile_row(w, ws, r + i, nr);
        const int pf = r + PREFETCH_ROWS < nr;
        __m512 acc[4];
        UNROLL
        for (int t = 0; t < 4; t++)
            acc[t] = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const size_t o = (size_t)b * bs;
            if (pf) /* written out, not in a helper: see q4_K_rows */
                for (int i = 0; i < 4; i++)
                    for (size_t po = 0; po < bs; po += 64) {
                        if (lv == PREFETCH_L2)
                            _mm_prefetch(x[i] + PREFETCH_ROWS * ws + o + po, _MM_HINT_T1);
                        else
                            _mm_prefetch(x[i] + PREFETCH_ROWS * ws + o + po, _MM_HINT_T0);
                    }
            __m512i av[4][4], nbs[4];
            UNROLL
            for (int t = 0; t < 4; t++) {
                if (t >= m)
                    break;
                const int8_t *aq = y[t][b].qs;
                av[t][0] = _mm512_loadu_si512(aq);
                av[t][1] = _mm512_loadu_si512(aq + 64);
                av[t][2] = _mm512_loadu_si512(aq + 128);
                av[t][3] = _mm512_loadu_si512(aq + 192);
                nbs[t] = _mm512_zextsi256_si512(
                    _mm256_mullo_epi16(_mm256_loadu_si256((const __m256i *)y[t][b].bsums), _mm256_set1_epi16(-16)));
            }
            __m512i is[4][4];
            UNROLL
            for (int i = 0; i < 4; i++) {
                const struct kiri_block_q6_K *xb = (const struct kiri_block_q6_K *)(x[i] + o);
                const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)xb->scales));
                const __m512i scw = _mm512_castsi256_si512(sc);
                const __m512i sc2 = _mm512_zextsi256_si512(_mm256_add_epi16(sc, sc));
                __m512i s[4];
                UNROLL
                for (int t = 0; t < 4; t++) {
                    if (t >= m)
                        break;
                    s[t] = _mm512_madd_epi16(nbs[t], sc2);
                }
                UNROLL
                for (int h = 0; h < 2; h++) {
                    const __m512i l = _mm512_loadu_si512(xb->ql + 64 * h);
                    const __m512i hb = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(xb->qh + 32 * h)));
                    const __m512i qa = _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_and_si512(_mm512_sllv_epi16(hb, sh_lo), m30));
                    const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
                                                       _mm512_and_si512(_mm512_srlv_epi16(hb, sh_hi), m30));
                    const __m512i pa = _mm512_permutexvar_epi16(_mm512_loadu_si512(q6k_scale_idx[2 * h]), scw);
                    const __m512i pb = _mm512_permutexvar_epi16(_mm512_loadu_si512(q6k_scale_idx[2 * h + 1]), scw);
                    UNROLL
                    for (int t = 0; t < 4; t++) {
                        if (t >= m)
                            break;
                        s[t] = _mm512_dpwssd_epi32(s[t], _mm512_maddubs_epi16(qa, av[t][2 * h]), pa);
                        s[t] = _mm512_dpwssd_epi32(s[t], _mm512_maddubs_epi16(qb, av[t][2 * h + 1]), pb);
                    }
                }
                UNROLL
                for (int t = 0; t < 4; t++) {
                    if (t >= m)
                        break;
                    is[t][i] = s[t];
                }
            }
            const size_t od = o + offsetof(struct kiri_block_q6_K, d);
            const __m128i dh = _mm_setr_epi16((short)load_u16(x[0] + od), (short)load_u16(x[1] + od),
                                              (short)load_u16(x[2] + od), (short)load_u16(x[3] + od), 0, 0, 0, 0);
            const __m512 dx = _mm512_broadcast_f32x4(_mm_cvtph_ps(dh));
            UNROLL
            for (int t = 0; t < 4; t++) {
                if (t >= m)
                    break;
                const __m512 d = _mm512_mul_ps(dx, _mm512_set1_ps(y[t][b].d));
                acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(fold4(is[t][0], is[t][1], is[t][2], is[t][3])), d, acc[t]);
            }
        }
        for (int t = 0; t < m; t++) {
            float v[4];
            _mm_storeu_ps(v, fold4_sum(acc[t]));
            put4(dst + (size_t)t * ds, v, r, nr);
        }
    }
}

AVX512 OUT_OF_LINE static void q6_K_rows4(int64_t k, const void *w, size_t ws, const void *a, float *out, int64_t nr,
                                          enum prefetch_level lv)
{
    if (lv == PREFETCH_L2)
        q6_K_rows(k, w, ws, a, 0, out, 0, nr, 1, PREFETCH_L2);
    else
        q6_K_rows(k, w, ws, a, 0, out, 0, nr, 1, PREFETCH_L1);
}

/* 2-4 tokens; the dispatch turns m into a constant. */
AVX512 OUT_OF_LINE static void q6_K_rows_small(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int m, enum prefetch_level lv)
{
    if (lv == PREFETCH_L2) {
        switch (m) {
        case 2: q6_K_rows(k, w, ws, a, as, dst, ds, nr, 2, PREFETCH_L2); break;
        case 3: q6_K_rows(k, w, ws, a, as, dst, ds, nr, 3, PREFETCH_L2); break;
        default: q6_K_rows(k, w, ws, a, as, dst, ds, nr, 4, PREFETCH_L2); break;
        }
        return;
    }
    switch (m) {
    case 2: q6_K_rows(k, w, ws, a, as, dst, ds, nr, 2, PREFETCH_L1); break;
    case 3: q6_K_rows(k, w, ws, a, as, dst, ds, nr, 3, PREFETCH_L1); break;
    default: q6_K_rows(k, w, ws, a, as, dst, ds, nr, 4, PREFETCH_L1); break;
    }
}

/* Q4_0 (and Q4_1) rows against one token, four rows at a time, in groups of four blocks (72
 * bytes of each row; Q4_1: 80). A row's group is two overlapping 64-byte loads (bytes 0..63 and
 * 8..71; Q4_1: 16..79), from which one word permutation (the quants are word-aligned: block j's
 * 16 bytes are words 9j + 1 .. 9j + 8; Q4_1: 10j + 2 .. 10j + 9) gathers the four blocks'
 * quants, one per 128-bit lane; the scales (words 0, 9, 18, 27; Q4_1: 0, 10, 20, 30, and the
 * offsets m after them) of the four rows go into [r0 r1 r2 r3] per lane, the order of fold4.
 * The activation side (each block's halves by lane, 8 sum a or Q8_1's s, and its scale) is laid
 * out once per call in a table. A group past the end of the rows (nb not a multiple of 4) is read
 * with masked loads and meets zeros there. The float sums follow tile_rows's (Q4_1:
 * tile_rows_m's) order exactly (one chain per row, block by block). */
#define Q4_0_ROWS4_MAX_BLOCKS 512 /* table: 5 vectors per 4 blocks, 40 KiB; longer rows use tile_rows */

struct q4_0_act4 {
    __m512i lo, hi; /* lane j: values 0..15 and 16..31 of block 4g + j */
    __m512i c;      /* lane j: 8 sum a of block 4g + j in every dword (Q4_0) */
    __m512 d;       /* lane j: its scale in every dword */
    __m512 s;       /* lane j: Q8_1's s (d sum a) in every dword (Q4_1) */
};

/* y: Q8_0 blocks, or Q8_1 blocks for q41. */
AVX512 SPECIALIZE static inline void q4_0_act4_fill(const void *y, int64_t nb, int q41, struct q4_0_act4 *t)
{
    const size_t asz = act_size(q41), aqs = act_qs(q41);
    for (int64_t g = 0; 4 * g < nb; g++) {
        __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512(), c = _mm512_setzero_si512();
        __m512 d = _mm512_setzero_ps(), sy = _mm512_setzero_ps();
        for (int j = 0; j < 4 && 4 * g + j < nb; j++) {
            const char *b = (const char *)y + (size_t)(4 * g + j) * asz;
            const int8_t *qs = (const int8_t *)(b + aqs);
            const __mmask16 lane = (__mmask16)(0xFu << (4 * j));
            lo = _mm512_mask_broadcast_i32x4(lo, lane, _mm_loadu_si128((const __m128i *)qs));
            hi = _mm512_mask_broadcast_i32x4(hi, lane, _mm_loadu_si128((const __m128i *)(qs + 16)));
            if (q41)
                sy = _mm512_mask_mov_ps(sy, lane,
                                        _mm512_set1_ps(_cvtsh_ss(load_u16(b + offsetof(struct kiri_block_q8_1, s)))));
            else
                c = _mm512_mask_set1_epi32(c, lane, 8 * sum_i8x32(qs));
            d = _mm512_mask_mov_ps(d, lane, _mm512_set1_ps(_cvtsh_ss(load_u16(b))));
        }
        t[g].lo = lo;
        t[g].hi = hi;
        t[g].c = c;
        t[g].d = d;
        t[g].s = sy;
    }
}

/* vpermw indices: block j's quants into lane j. A block of bw words (9: Q4_0, 10: Q4_1) has its
 * 16 bytes of quants in its last 8 words; words from hw on (4, 8) are taken from the second load,
 * which starts hw words later. */
#define Q4_W(bw, hw, j, i) ((bw) * (j) + (bw) - 8 + (i) < (hw) ? (bw) * (j) + (bw) - 8 + (i) \
                                                             : 32 + (bw) * (j) + (bw) - 8 + (i) - (hw))
#define Q4_LANE(bw, hw, j)                                                                          \
    Q4_W(bw, hw, j, 0), Q4_W(bw, hw, j, 1), Q4_W(bw, hw, j, 2), Q4_W(bw, hw, j, 3), Q4_W(bw, hw, j, 4), \
        Q4_W(bw, hw, j, 5), Q4_W(bw, hw, j, 6), Q4_W(bw, hw, j, 7)
#define Q4_QS_IDX(bw, hw) Q4_LANE(bw, hw, 0), Q4_LANE(bw, hw, 1), Q4_LANE(bw, hw, 2), Q4_LANE(bw, hw, 3)
static const uint16_t q4_0_qs_idx[32] = {Q4_QS_IDX(9, 4)};
static const uint16_t q4_1_qs_idx[32] = {Q4_QS_IDX(10, 8)};
#undef Q4_QS_IDX
#undef Q4_LANE
#undef Q4_W
/* The scales (word 9j) of two rows' loads a, b into words 4j (a) and 4j + 1 (b), then the pairs
 * of rows (0, 1) and (2, 3) into words 4j + i. */
static const uint16_t q4_0_d_idx[32] = {0, 32, 0, 0, 9, 41, 0, 0, 18, 50, 0, 0, 27, 59, 0, 0,
                                        0, 0,  0, 0, 0, 0,  0, 0, 0,  0,  0, 0, 0,  0,  0, 0};
static const uint16_t q4_0_d_pair_idx[32] = {0, 1, 32, 33, 4, 5, 36, 37, 8, 9, 40, 41, 12, 13, 44, 45,
                                             0, 0, 0,  0,  0, 0, 0,  0,  0, 0, 0,  0,  0,  0,  0,  0};
/* Q4_1: block j's d and m (words 10j and 10j + 1) go to words 8j .. 8j + 3 as [d_a d_b m_a m_b]
 * of two rows, then d of row i to word 4j + i and m to word 16 + 4j + i. */
static const uint16_t q4_1_d_idx[32] = {0,  32, 1,  33, 0, 0, 0, 0, 10, 42, 11, 43, 0, 0, 0, 0,
                                        20, 52, 21, 53, 0, 0, 0, 0, 30, 62, 31, 63, 0, 0, 0, 0};
static const uint16_t q4_1_d_pair_idx[32] = {0, 1,  32, 33, 8,  9,  40, 41, 16, 17, 48, 49, 24, 25, 56, 57,
                                             2, 3,  34, 35, 10, 11, 42, 43, 18, 19, 50, 51, 26, 27, 58, 59};

/* Bytes between a group's two loads: the second covers the end of the fourth block. */
static inline size_t q4_rows4_hi(int q41) { return q41 ? 16 : 8; }

/* One group of four blocks of four rows: the integer block sums (Q4_0: minus 8 sum a) as floats
 * (sum), the products of the scales (dd) and the rows' offsets m (mins, Q4_1), [r0 r1 r2 r3]
 * for block 4g + j in lane j. */
AVX512 SPECIALIZE static inline void q4_0_group4(const char *const x[4], size_t o, int full, int q41, __mmask64 mlo,
                                                 __mmask64 mhi, const struct q4_0_act4 *t, __m512 *sum, __m512 *dd,
                                                 __m512 *mins)
{
    const __m512i qidx = _mm512_loadu_si512(q41 ? q4_1_qs_idx : q4_0_qs_idx), m4 = _mm512_set1_epi8(0x0F);
    const size_t hi = q4_rows4_hi(q41);
    __m512i l[4], is[4];
    UNROLL
    for (int i = 0; i < 4; i++) {
        __m512i h;
        if (full) {
            l[i] = _mm512_loadu_si512(x[i] + o);
            h = _mm512_loadu_si512(x[i] + o + hi);
        } else {
            l[i] = _mm512_maskz_loadu_epi8(mlo, x[i] + o);
            h = _mm512_maskz_loadu_epi8(mhi, x[i] + o + hi);
        }
        const __m512i q = _mm512_permutex2var_epi16(l[i], qidx, h);
        const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(q, m4), t->lo);
        is[i] = _mm512_dpbusd_epi32(s, _mm512_and_si512(_mm512_srli_epi16(q, 4), m4), t->hi);
    }
    const __m512i didx = _mm512_loadu_si512(q41 ? q4_1_d_idx : q4_0_d_idx);
    const __m512i pidx = _mm512_loadu_si512(q41 ? q4_1_d_pair_idx : q4_0_d_pair_idx);
    const __m512i d01 = _mm512_permutex2var_epi16(l[0], didx, l[1]);
    const __m512i d23 = _mm512_permutex2var_epi16(l[2], didx, l[3]);
    const __m512i dm = _mm512_permutex2var_epi16(d01, pidx, d23);
    const __m512 d = _mm512_cvtph_ps(_mm512_castsi512_si256(dm));
    const __m512i f = fold4(is[0], is[1], is[2], is[3]);
    *sum = _mm512_cvtepi32_ps(q41 ? f : _mm512_sub_epi32(f, t->c));
    *dd = _mm512_mul_ps(d, t->d);
    *mins = q41 ? _mm512_cvtph_ps(_mm512_extracti64x4_epi64(dm, 1)) : _mm512_setzero_ps();
}

/* Adds block j of a group (lane j) into the rows' chains as tile_rows (Q4_1: tile_rows_m) adds
 * it. */
AVX512 SPECIALIZE static inline __m128 lane4(__m512 v, int j)
{
    switch (j) {
    case 0: return _mm512_castps512_ps128(v);
    case 1: return _mm512_extractf32x4_ps(v, 1);
    case 2: return _mm512_extractf32x4_ps(v, 2);
    default: return _mm512_extractf32x4_ps(v, 3);
    }
}

/* Adds the first n (1..4) blocks of a group into the rows' chains, block by block (Q4_1: the
 * offsets' terms into accm): the same float results as the 2-8-token path, so a sequence decodes
 * alike alone or batched. */
AVX512 SPECIALIZE static inline __m128 q4_0_chain(__m512 sum, __m512 dd, __m512 mins, const struct q4_0_act4 *t,
                                                  int q41, int n, __m128 acc, __m128 *accm)
{
    UNROLL
    for (int j = 0; j < 4; j++)
        if (j < n) {
            acc = _mm_fmadd_ps(lane4(sum, j), lane4(dd, j), acc);
            if (q41)
                *accm = _mm_fmadd_ps(lane4(mins, j), lane4(t->s, j), *accm);
        }
    return acc;
}

/* Eight rows per pass, two quads whose chains of dependent additions interleave. */
AVX512 SPECIALIZE static inline void q4_0_rows4(int64_t k, const void *w, size_t ws, int q41,
                                                const struct q4_0_act4 *t, float *out, int64_t nr,
                                                enum prefetch_level lv)
{
    const size_t bsize = q41 ? sizeof(struct kiri_block_q4_1) : sizeof(struct kiri_block_q4_0);
    const int64_t nb = k / KIRI_QK8_0, ng = (nb + 3) / 4, nfull = nb / 4;
    const size_t span = 4 * bsize, hi = q4_rows4_hi(q41);
    /* The last, partial group: bytes of the blocks there are, in each of the two loads. */
    const unsigned tail = (unsigned)((size_t)(nb % 4) * bsize);
    const __mmask64 mlo = tail >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << tail) - 1);
    const __mmask64 mhi = tail > hi ? (((__mmask64)1 << (tail - hi)) - 1) : 0;
    for (int64_t r = 0; r < nr; r += 8) {
        const char *x[8];
        for (int i = 0; i < 8; i++)
            x[i] = tile_row(w, ws, r + i, nr);
        const int pf = r + PREFETCH_ROWS < nr;
        __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps(), accm0 = acc0, accm1 = acc0;
        for (int64_t g = 0; g < ng; g++) {
            const size_t o = (size_t)g * span;
            if (pf) /* written out, not in a helper: see q4_K_rows */
                for (int i = 0; i < 8; i++)
                    for (size_t po = 0; po < span; po += 64) {
                        if (lv == PREFETCH_L2)
                            _mm_prefetch(x[i] + PREFETCH_ROWS * ws + o + po, _MM_HINT_T1);
                        else
                            _mm_prefetch(x[i] + PREFETCH_ROWS * ws + o + po, _MM_HINT_T0);
                    }
            const int full = g < nfull, n = full ? 4 : (int)(nb % 4);
            __m512 s0, d0, m0, s1, d1, m1;
            q4_0_group4(x, o, full, q41, mlo, mhi, &t[g], &s0, &d0, &m0);
            q4_0_group4(x + 4, o, full, q41, mlo, mhi, &t[g], &s1, &d1, &m1);
            acc0 = q4_0_chain(s0, d0, m0, &t[g], q41, n, acc0, &accm0);
            acc1 = q4_0_chain(s1, d1, m1, &t[g], q41, n, acc1, &accm1);
        }
        if (q41) {
            acc0 = _mm_add_ps(acc0, accm0);
            acc1 = _mm_add_ps(acc1, accm1);
        }
        put8(out, acc0, acc1, r, nr);
    }
}

/* One token of Q4_0 (q41 == 0, Q8_0 activation) or Q4_1 (Q8_1 activation): the activation's table
 * in a frame of its own (not beside the octets' tables). */
AVX512 OUT_OF_LINE static void q4_one(int64_t k, const void *w, size_t ws, int q41, const void *a, float *out,
                                      int64_t nr, enum prefetch_level lv)
{
    struct q4_0_act4 t[Q4_0_ROWS4_MAX_BLOCKS / 4];
    q4_0_act4_fill(a, k / KIRI_QK8_0, q41, t);
    /* Constant arguments, so each call is its own specialization of the loop. */
    if (q41 && lv == PREFETCH_L2)
        q4_0_rows4(k, w, ws, 1, t, out, nr, PREFETCH_L2);
    else if (q41)
        q4_0_rows4(k, w, ws, 1, t, out, nr, PREFETCH_L1);
    else if (lv == PREFETCH_L2)
        q4_0_rows4(k, w, ws, 0, t, out, nr, PREFETCH_L2);
    else
        q4_0_rows4(k, w, ws, 0, t, out, nr, PREFETCH_L1);
}

AVX512 static void gemm_q4_0_avx512(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                    float *dst, size_t ds, int64_t nr, int64_t nt)
{
    if (nt == 1 && k / KIRI_QK8_0 <= Q4_0_ROWS4_MAX_BLOCKS)
        q4_one(k, w, ws, 0, a, dst, nr, PREFETCH_L1);
    else
        gemm16(k, w, ws, sizeof(struct kiri_block_q4_0), quants16_q4_0, 8, a, as, dst, ds, nr, nt);
}

/* Q4_1: one token reads four rows as they lie (q4_one), 2 to 8 tokens (a verification step of
 * drafts, a step of a few sequences) are streamed once through tile_rows_m, with the same floats
 * for each token; more go in octets, and the 1 to 4 tokens they leave to the AVX2 kernels. */
AVX512 SPECIALIZE static inline void gemm_q4_1(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int64_t nt, enum prefetch_level lv)
{
    const size_t bs = sizeof(struct kiri_block_q4_1);
    switch (nt) {
    case 1:
        if (k / KIRI_QK8_0 <= Q4_0_ROWS4_MAX_BLOCKS)
            q4_one(k, w, ws, 1, a, dst, nr, lv);
        else
            tile_rows_m(k, w, ws, bs, quants16_q4_1, 0, 1, a, as, dst, ds, nr, 1);
        return;
    case 2: tile_rows_m(k, w, ws, bs, quants16_q4_1, 0, 1, a, as, dst, ds, nr, 2); return;
    case 3: tile_rows_m(k, w, ws, bs, quants16_q4_1, 0, 1, a, as, dst, ds, nr, 3); return;
    case 4: tile_rows_m(k, w, ws, bs, quants16_q4_1, 0, 1, a, as, dst, ds, nr, 4); return;
    case 5: tile_rows_m(k, w, ws, bs, quants16_q4_1, 0, 1, a, as, dst, ds, nr, 5); return;
    case 6: tile_rows_m(k, w, ws, bs, quants16_q4_1, 0, 1, a, as, dst, ds, nr, 6); return;
    case 7: tile_rows_m(k, w, ws, bs, quants16_q4_1, 0, 1, a, as, dst, ds, nr, 7); return;
    case 8: tile_rows_m(k, w, ws, bs, quants16_q4_1, 0, 1, a, as, dst, ds, nr, 8); return;
    default: break;
    }
    const int64_t t = octets16(k, w, ws, bs, quants16_q4_1, 0, 1, a, as, dst, ds, nr, nt);
    if (t < nt)
        kiri_cpu_gemm_small_q4_1_avx2(k, w, ws, (const char *)a + (size_t)t * as, as, dst + (size_t)t * ds, ds, nr,
                                      nt - t);
}

AVX512 static void gemm_q4_1_avx512(int64_t k, const void *w, size_t ws, const void *a, size_t as, float *dst,
                                    size_t ds, int64_t nr, int64_t nt)
{
    gemm_q4_1(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L1);
}

AVX512 static void gemm_q4_1_avx512_l2(int64_t k, const void *w, size_t ws, const void *a, size_t as, float *dst,
                                       size_t ds, int64_t nr, int64_t nt)
{
    gemm_q4_1(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L2);
}

/* Q8_0 rows against one token, four rows at a time (eight per pass: two quads whose chains
 * interleave), in pairs of blocks (68 bytes of each row) read as they lie, like Q4_0's above:
 * decode of a Q8_0 model (and of its Q8_0 output matrix, the largest one of a model with a big
 * vocabulary) is a stream from memory, and tile_rows's transposition of 16 rows read them as 16
 * short streams with first-level prefetches, which held one thread to about 8 GB/s on a Zen 4.
 * A row's pair is two overlapping 64-byte loads (bytes 0..63 and 4..67), from which one word
 * permutation gathers the two blocks' quants (block 2g's 32 bytes are words 1..16, block
 * 2g + 1's words 18..33, that is words 16..31 of the second load); they enter vpdpbusd as w + 128
 * and the term 128 sum a is subtracted, as in tile_rows. fold4 leaves block 2g's sums of the four
 * rows in 128-bit lanes 0 and 1, block 2g + 1's in lanes 2 and 3. The scales (words 0 and 17) go
 * to [r0 r1 r2 r3] per block. A last single block (an odd count) is read with a masked load and
 * meets zeros in the table. The float sums follow tile_rows's order exactly (one chain per row,
 * block by block), so a token gets the same floats alone as in a small batch (tile_rows_m). */
#define Q8_0_ROWS4_MAX_BLOCKS 512 /* table: one vector (and two sums and scales) per pair, 32 KiB */

struct q8_0_act2 {
    __m512i q;     /* the 64 quants of blocks 2g and 2g + 1 */
    __m128i c[2];  /* 128 sum a of each block, in every dword */
    __m128 d[2];   /* each block's scale, in every lane */
};

AVX512 static inline void q8_0_act2_fill(const struct kiri_block_q8_0 *y, int64_t nb, struct q8_0_act2 *t)
{
    for (int64_t g = 0; 2 * g < nb; g++) {
        const int two = 2 * g + 1 < nb;
        const __m256i lo = _mm256_loadu_si256((const __m256i *)y[2 * g].qs);
        const __m256i hi = two ? _mm256_loadu_si256((const __m256i *)y[2 * g + 1].qs) : _mm256_setzero_si256();
        t[g].q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
        t[g].c[0] = _mm_set1_epi32(128 * sum_q8(&y[2 * g]));
        t[g].c[1] = _mm_set1_epi32(two ? 128 * sum_q8(&y[2 * g + 1]) : 0);
        t[g].d[0] = _mm_set1_ps(_cvtsh_ss(y[2 * g].d));
        t[g].d[1] = _mm_set1_ps(two ? _cvtsh_ss(y[2 * g + 1].d) : 0.0f);
    }
}

/* Word indices: the quants of a pair (see above) from the loads at 0 and 4; the scales (words 0
 * and 17) of two rows' first loads a, b into words [a0 b0 a17 b17]; then of rows (0, 1) and
 * (2, 3) into [r0 r1 r2 r3] of block 2g and of block 2g + 1. */
static const uint16_t q8_0_qs_idx[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                         48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63};
static const uint16_t q8_0_d_idx[32] = {0, 32, 17, 49};
static const uint16_t q8_0_d_pair_idx[32] = {0, 1, 32, 33, 2, 3, 34, 35};

/* One pair of blocks of four rows against the token's table entry: adds block 2g's products
 * and then (when there is one) block 2g + 1's into acc, [r0 r1 r2 r3]. */
AVX512 static inline __m128 q8_0_pair4(const char *const x[4], size_t o, int full, const struct q8_0_act2 *t,
                                       __m128 acc)
{
    const __m512i qidx = _mm512_loadu_si512(q8_0_qs_idx), flip = _mm512_set1_epi8((char)0x80);
    __m512i l[4], is[4];
    UNROLL
    for (int i = 0; i < 4; i++) {
        __m512i h;
        if (full) {
            l[i] = _mm512_loadu_si512(x[i] + o);
            h = _mm512_loadu_si512(x[i] + o + 4);
        } else { /* one block of 34 bytes */
            l[i] = _mm512_maskz_loadu_epi8(((__mmask64)1 << 34) - 1, x[i] + o);
            h = _mm512_setzero_si512();
        }
        const __m512i q = _mm512_xor_si512(_mm512_permutex2var_epi16(l[i], qidx, h), flip);
        is[i] = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, t->q);
    }
    const __m512i f = fold4(is[0], is[1], is[2], is[3]);
    const __m512i didx = _mm512_loadu_si512(q8_0_d_idx), pidx = _mm512_loadu_si512(q8_0_d_pair_idx);
    const __m512i d01 = _mm512_permutex2var_epi16(l[0], didx, l[1]);
    const __m512i d23 = _mm512_permutex2var_epi16(l[2], didx, l[3]);
    const __m256 dw = _mm256_cvtph_ps(_mm512_castsi512_si128(_mm512_permutex2var_epi16(d01, pidx, d23)));
    const __m128i s0 = _mm_add_epi32(_mm512_castsi512_si128(f), _mm512_extracti32x4_epi32(f, 1));
    acc = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_sub_epi32(s0, t->c[0])),
                       _mm_mul_ps(_mm256_castps256_ps128(dw), t->d[0]), acc);
    if (full) {
        const __m128i s1 = _mm_add_epi32(_mm512_extracti32x4_epi32(f, 2), _mm512_extracti32x4_epi32(f, 3));
        acc = _mm_fmadd_ps(_mm_cvtepi32_ps(_mm_sub_epi32(s1, t->c[1])),
                           _mm_mul_ps(_mm256_extractf128_ps(dw, 1), t->d[1]), acc);
    }
    return acc;
}

AVX512 SPECIALIZE static inline void q8_0_rows4(int64_t k, const void *w, size_t ws, const struct q8_0_act2 *t,
                                                float *out, int64_t nr, enum prefetch_level lv)
{
    const int64_t nb = k / KIRI_QK8_0, ng = (nb + 1) / 2, nfull = nb / 2;
    const size_t span = 2 * sizeof(struct kiri_block_q8_0);
    for (int64_t r = 0; r < nr; r += 8) {
        const char *x[8];
        for (int i = 0; i < 8; i++)
            x[i] = tile_row(w, ws, r + i, nr);
        const int pf = r + PREFETCH_ROWS < nr;
        __m128 acc0 = _mm_setzero_ps(), acc1 = _mm_setzero_ps();
        for (int64_t g = 0; g < ng; g++) {
            const size_t o = (size_t)g * span;
            if (pf) /* the pair's first and last line (68 bytes span at most two) */
                for (int i = 0; i < 8; i++) {
                    const char *p = x[i] + PREFETCH_ROWS * ws + o;
                    if (lv == PREFETCH_L2) {
                        _mm_prefetch(p, _MM_HINT_T1);
                        _mm_prefetch(p + span - 1, _MM_HINT_T1);
                    } else {
                        _mm_prefetch(p, _MM_HINT_T0);
                        _mm_prefetch(p + span - 1, _MM_HINT_T0);
                    }
                }
            const int full = g < nfull;
            acc0 = q8_0_pair4(x, o, full, &t[g], acc0);
            acc1 = q8_0_pair4(x + 4, o, full, &t[g], acc1);
        }
        put8(out, acc0, acc1, r, nr);
    }
}

/* One token: the activation's table in a frame of its own (not beside the octets' tables). */
AVX512 OUT_OF_LINE static void q8_0_one(int64_t k, const void *w, size_t ws, const void *a, float *out, int64_t nr,
                                        enum prefetch_level lv)
{
    struct q8_0_act2 t[Q8_0_ROWS4_MAX_BLOCKS / 2];
    q8_0_act2_fill(a, k / KIRI_QK8_0, t);
    if (lv == PREFETCH_L2)
        q8_0_rows4(k, w, ws, t, out, nr, PREFETCH_L2);
    else
        q8_0_rows4(k, w, ws, t, out, nr, PREFETCH_L1);
}

AVX512 static inline void gemm_q8_0(int64_t k, const void *w, size_t ws, const void *a, size_t as, float *dst,
                                     size_t ds, int64_t nr, int64_t nt, enum prefetch_level lv)
{
    if (nt == 1 && k / KIRI_QK8_0 <= Q8_0_ROWS4_MAX_BLOCKS)
        q8_0_one(k, w, ws, a, dst, nr, lv);
    else
        gemm16(k, w, ws, sizeof(struct kiri_block_q8_0), quants16_q8_0, 128, a, as, dst, ds, nr, nt);
}

AVX512 static void gemm_q8_0_avx512(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                    float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_q8_0(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L1);
}

AVX512 static void gemm_q8_0_avx512_l2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_q8_0(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L2);
}

AVX512 static void gemm_q4_0_avx512_l2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt)
{
    if (nt == 1 && k / KIRI_QK8_0 <= Q4_0_ROWS4_MAX_BLOCKS)
        q4_one(k, w, ws, 0, a, dst, nr, PREFETCH_L2);
    else
        gemm16(k, w, ws, sizeof(struct kiri_block_q4_0), quants16_q4_0, 8, a, as, dst, ds, nr, nt);
}

/* Q4_K (five == 0) or Q5_K (five == 1): octets of tokens on the unpacked super-blocks, up to four
 * tokens (decode, small batches) and the one or two tokens the octets leave on the kernels above. */
AVX512 SPECIALIZE static inline void gemm_q45_K(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                                float *dst, size_t ds, int64_t nr, int64_t nt, enum prefetch_level lv,
                                                int five)
{
    if (nt >= 2 && nt <= 4) {
        q4_K_rows_small(k, w, ws, a, as, dst, ds, nr, (int)nt, lv, five);
        return;
    }
    const int64_t t = gemm16_k(k, w, ws, five ? unpack16_q5_K : unpack16_q4_K, 0, a, as, dst, ds, nr, nt);
    for (int64_t i = t; i < nt; i++)
        q4_K_rows4(k, w, ws, (const char *)a + (size_t)i * as, dst + (size_t)i * ds, nr, lv, five);
}

AVX512 static void gemm_q4_K_avx512(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                    float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_q45_K(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L1, 0);
}

AVX512 static void gemm_q4_K_avx512_l2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_q45_K(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L2, 0);
}

AVX512 static void gemm_q5_K_avx512(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                    float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_q45_K(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L1, 1);
}

AVX512 static void gemm_q5_K_avx512_l2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_q45_K(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L2, 1);
}

AVX512 static inline void gemm_q6_K(int64_t k, const void *w, size_t ws, const void *a, size_t as, float *dst,
                                     size_t ds, int64_t nr, int64_t nt, enum prefetch_level lv)
{
    if (nt >= 2 && nt <= 4) {
        q6_K_rows_small(k, w, ws, a, as, dst, ds, nr, (int)nt, lv);
        return;
    }
    const int64_t t = gemm16_k(k, w, ws, unpack16_q6_K, 1, a, as, dst, ds, nr, nt);
    for (int64_t i = t; i < nt; i++)
        q6_K_rows4(k, w, ws, (const char *)a + (size_t)i * as, dst + (size_t)i * ds, nr, lv);
}

AVX512 static void gemm_q6_K_avx512(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                    float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_q6_K(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L1);
}

AVX512 static void gemm_q6_K_avx512_l2(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                       float *dst, size_t ds, int64_t nr, int64_t nt)
{
    gemm_q6_K(k, w, ws, a, as, dst, ds, nr, nt, PREFETCH_L2);
}

/* ---------------------------------------------------------------------------------------------
 * Table
 * ------------------------------------------------------------------------------------------- */

void kiri_cpu_kernels_init_gemm_avx512(struct kiri_cpu_kernels *k)
{
    /* Zen 4 (the one AVX-512 CPU of AMD family 19h): see enum prefetch_level. */
    const int l2 = kiri_cpu_is_amd_family_19h();
    k->gemm[KIRI_TYPE_Q4_0] = l2 ? gemm_q4_0_avx512_l2 : gemm_q4_0_avx512;
    k->gemm[KIRI_TYPE_Q8_0] = l2 ? gemm_q8_0_avx512_l2 : gemm_q8_0_avx512;
    k->gemm[KIRI_TYPE_Q4_K] = l2 ? gemm_q4_K_avx512_l2 : gemm_q4_K_avx512;
    k->gemm[KIRI_TYPE_Q5_K] = l2 ? gemm_q5_K_avx512_l2 : gemm_q5_K_avx512;
    k->gemm[KIRI_TYPE_Q4_1] = l2 ? gemm_q4_1_avx512_l2 : gemm_q4_1_avx512;
    k->gemm[KIRI_TYPE_Q5_0] = gemm_q5_0_avx512;
    k->gemm[KIRI_TYPE_Q5_1] = gemm_q5_1_avx512;
    k->gemm[KIRI_TYPE_Q6_K] = l2 ? gemm_q6_K_avx512_l2 : gemm_q6_K_avx512;
    k->gemm_stream[KIRI_TYPE_Q4_0] = 4; /* gemm16: tile_rows_m */
    k->gemm_stream[KIRI_TYPE_Q8_0] = 4;
    k->gemm_stream[KIRI_TYPE_Q4_K] = 4; /* q4_K_rows_small */
    k->gemm_stream[KIRI_TYPE_Q6_K] = 4; /* q6_K_rows_small */
    k->gemm_stream[KIRI_TYPE_Q5_K] = 4; /* q4_K_rows_small */
    k->gemm_stream[KIRI_TYPE_Q4_1] = ROWS_M_MAX; /* tile_rows_m */
    k->gemm_stream[KIRI_TYPE_Q5_0] = 4;
    k->gemm_stream[KIRI_TYPE_Q5_1] = 4;
    k->path = "avx2+avx512vnni";
}

#else
typedef int kiri_gemm_avx512_unused; /* an empty translation unit is not valid ISO C */
#endif
