/* AVX2 (with FMA and F16C) tiles of matrix products (kiri_gemm_fn) for the weight types of the
 * common model files: Q4_0, Q8_0 (Q4_0 and Q8_0 models), Q4_1, Q5_0, Q5_1 (Q4_1 and Q5 models;
 * Q5_0 also in Q4_K_M files), Q4_K, Q5_K, Q6_K (Q4_K_M and Q5_K_M models), F16, F32.
 *
 * A product spends its time in the integer sums of 32 weights against 32 activations. The
 * quantized kernels below compute four such sums at once, for four (weight block, activation
 * block) pairs, and fold the four vectors of partial sums into one vector before anything else
 * happens to them: two rounds of horizontal adds leave, in each 128-bit half, one int32 per pair
 * ("a folded quad": [s0 s1 s2 s3 | s0 s1 s2 s3], each half holding the sum over its 16 bytes).
 * The conversion to float, the per-block scale and the accumulation then cost one instruction
 * per four pairs instead of one per pair. Two shapes of quad are used:
 * - prefill (several tokens): one weight row against four tokens. Each weight block is unpacked
 *   once and used for four tokens in registers; token-side values that do not depend on the row
 *   (scales, sums of the activations) are computed once per token quad and reused for every row
 *   of the tile.
 * - decode (one token): four weight rows against the token, which shares the activation loads
 *   and the per-block activation terms among the rows (Q4_0 takes eight rows, two per vector).
 *   The rows of a later group (the next one; for Q4_K and Q6_K, whose rows are longer, the one
 *   after) are prefetched in software while a group is multiplied.
 * - small batches (2 to 4 tokens): the decode kernels' row groups with each weight block
 *   unpacked once for every token, so the rows stream from memory once per batch; each token's
 *   floats are exactly those of the one-token path.
 * Tiles whose row or token count is not a multiple of four repeat the last row or token to fill
 * the quad and drop those results. F16 and F32 tiles are plain FMA tiles of 4 rows x 2 tokens.
 *
 * What must stay true:
 * - Same contract as the reference vec_dot (quants.c): the integer sums of each block or
 *   sub-block are exact, and only the order of the float additions across blocks differs
 *   (tests/test_gemm.c checks every kernel against the reference on random data).
 * - The horizontal adds work on int16 lanes only where the sums cannot overflow: a pair sum of
 *   maddubs of a 4-bit weight (0..15) and an int8 activation is at most 2 * 15 * 127 = 3810, four
 *   of them 15240 (and the Q4_0 decode path's eight, 30480). 5-bit weights (0..31, Q5_0, Q5_1,
 *   Q5_K) reach 7874 per pair and fold two rounds as int16 (31496), never three. Q8_0 weights
 *   fold as int32; Q6_K's 6-bit pair sums (up to 16002) fold one round as int16 (32004), the
 *   second as int32.
 * - Activations never hold -128 (the activation quantizers produce -127..127), which the sign
 *   trick for int8 x int8 products relies on, as in quants_avx2.c.
 *
 * Compiled without -mavx2: each function carries a target attribute; the table entries may only
 * be installed after the CPU and the OS reported KIRI_CPU_AVX2.
 */
#include "cpu_kernels.h"

#if defined(__x86_64__)

#include <cpuid.h>
#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
/* Loops over the lanes of a micro-tile must be unrolled so their accumulators live in registers;
 * -O2 does not unroll by itself. */
#define UNROLL _Pragma("GCC unroll 8")

/* 32-value blocks per pass over the token side of a Q4_0/Q8_0 tile: the precomputed token
 * values of one pass take CHUNK * 64 bytes of stack. */
#define CHUNK 128

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

AVX2 static inline float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

AVX2 static inline __m256 bcast_f16(kiri_f16 h)
{
    return _mm256_cvtph_ps(_mm_set1_epi16((short)h));
}

/* The scales of a folded quad: [h0 h1 h2 h3 h0 h1 h2 h3] as floats. */
AVX2 static inline __m256 quad_f16(kiri_f16 h0, kiri_f16 h1, kiri_f16 h2, kiri_f16 h3)
{
    const __m128i v = _mm_setr_epi16((short)h0, (short)h1, (short)h2, (short)h3, (short)h0,
                                     (short)h1, (short)h2, (short)h3);
    return _mm256_cvtph_ps(v);
}

AVX2 static inline __m256 quad_f32(float f0, float f1, float f2, float f3)
{
    return _mm256_setr_ps(f0, f1, f2, f3, f0, f1, f2, f3);
}

/* Folds four vectors of 16 int16 lanes into a quad of int32 (see the top of the file). Four
 * adjacent lanes of each input must sum without overflow. */
AVX2 static inline __m256i fold_i16(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
    const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(p0, p1), _mm256_hadd_epi16(p2, p3));
    return _mm256_madd_epi16(h, _mm256_set1_epi16(1));
}

/* The same before the last widening step: [p0 p0 p1 p1 p2 p2 p3 p3] int16 per half, for callers
 * that widen with a multiplication by a scale (madd with the scale instead of with ones). */
AVX2 static inline __m256i fold_i16_pairs(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
    return _mm256_hadd_epi16(_mm256_hadd_epi16(p0, p1), _mm256_hadd_epi16(p2, p3));
}

/* Folds four vectors of 8 int32 lanes into a quad. */
AVX2 static inline __m256i fold_i32(__m256i p0, __m256i p1, __m256i p2, __m256i p3)
{
    return _mm256_hadd_epi32(_mm256_hadd_epi32(p0, p1), _mm256_hadd_epi32(p2, p3));
}

/* The four sums of a float quad accumulator: low half plus high half. */
AVX2 static inline __m128 quad_sum(__m256 acc)
{
    return _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
}

/* The 32 values of a 32-value block's nibbles in element order, 0..15 each. */
AVX2 static inline __m256i nibbles(const uint8_t *qs)
{
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

AVX2 static inline __m256i load256(const void *p)
{
    return _mm256_loadu_si256((const __m256i *)p);
}

/* Stores the sums of a token quad for weight row r: out[i] is token i's output row; the first
 * pass over k stores, later passes add. */
AVX2 static inline void put_tokens(__m256 acc, float *const out[4], int n_tok, int64_t r, int first)
{
    float v[4];
    _mm_storeu_ps(v, quad_sum(acc));
    for (int i = 0; i < n_tok; i++)
        out[i][r] = first ? v[i] : out[i][r] + v[i];
}

/* The same for the four rows r .. r + 3 of a row group (those below nr). */
AVX2 static inline void put_tokens4(__m256 acc0, __m256 acc1, __m256 acc2, __m256 acc3, float *const out[4],
                                    int n_tok, int64_t r, int64_t nr, int first)
{
    put_tokens(acc0, out, n_tok, r, first);
    if (r + 1 < nr)
        put_tokens(acc1, out, n_tok, r + 1, first);
    if (r + 2 < nr)
        put_tokens(acc2, out, n_tok, r + 2, first);
    if (r + 3 < nr)
        put_tokens(acc3, out, n_tok, r + 3, first);
}

/* Stores the sums of a row quad: rows r .. r + n - 1 of one token's output row. */
AVX2 static inline void put_rows(__m256 acc, float *out, int64_t n)
{
    if (n >= 4) {
        _mm_storeu_ps(out, quad_sum(acc));
    } else {
        float v[4];
        _mm_storeu_ps(v, quad_sum(acc));
        for (int64_t i = 0; i < n; i++)
            out[i] = v[i];
    }
}

/* Row i of a tile of nr rows, repeating the last row past the end. */
static inline const char *tile_row(const void *w, size_t ws, int64_t i, int64_t nr)
{
    return (const char *)w + (size_t)(i < nr ? i : nr - 1) * ws;
}

/* Whether the one-token paths prefetch into L2 rather than L1: set once at start-up, on AMD
 * family 19h. On a Zen 4 running this tier, first-level prefetches held TinyLlama-shape decode
 * to 37 (Q4_0) and 30 (Q4_K_M) tok/s with 2 threads, second-level ones reach 53 and 50 (llama.cpp's
 * AVX2 build: 50, 51); Zen 3 is the same family and was not measured again. */
static int prefetch_to_l2;

/* Software prefetch for the one-token paths. While a group of g rows is multiplied, the same
 * bytes of the next group's rows are fetched (next[i] + off, `span` bytes from there, one line
 * per 64), so each group finds its rows in L1: the hardware prefetchers do not cover this
 * pattern well, each row being a short stream of a few dozen lines with g of them read side by
 * side. next is NULL for the last group. Always inlined: GCC takes a function that only
 * prefetches for one without effects and drops the calls it has not inlined. */
AVX2 static inline __attribute__((always_inline)) void prefetch_rows(const char *const *next, int g, size_t off, size_t span)
{
    if (!next)
        return;
    UNROLL
    for (int i = 0; i < g; i++)
        UNROLL
        for (size_t o = 0; o < span; o += 64) {
            if (prefetch_to_l2)
                _mm_prefetch(next[i] + off + o, _MM_HINT_T1);
            else
                _mm_prefetch(next[i] + off + o, _MM_HINT_T0);
        }
}

/* The rows r + g .. r + 2g - 1 of a tile into next (repeating the last row), or NULL when r + g is
 * past the end. */
static inline const char *const *next_rows(const void *w, size_t ws, int64_t r, int g, int64_t nr,
                                           const char **next)
{
    if (r + g >= nr)
        return NULL;
    for (int i = 0; i < g; i++)
        next[i] = tile_row(w, ws, r + g + i, nr);
    return next;
}

/* Splits a tile into token quads and the rest. Tiles of 1 to 4 tokens (the few decode tokens of a
 * serving step) go to rows (one token) or rows_m (2 to 4), which read the rows once for all of
 * them, as the one-token path does; larger tiles go to tok4 by quads where at least three tokens
 * remain (the fourth is a repeat), and a rest of one or two tokens to rows or rows_m. rows_m is
 * called with a constant m so each count gets its own inlined copy (SPECIALIZE) with the
 * accumulators in registers. */
#define GEMM_DRIVER_SMALL(name, tok4, rows, rows_m)                                              \
    AVX2 static void name(int64_t k, const void *w, size_t ws, const void *a, size_t as,         \
                          float *dst, size_t ds, int64_t nr, int64_t nt)                        \
    {                                                                                            \
        int64_t t = 0;                                                                           \
        for (; nt > 4 && nt - t >= 3; t += 4) {                                                  \
            const void *ap[4];                                                                   \
            float *op[4];                                                                        \
            const int n = (int)min64(nt - t, 4);                                                 \
            for (int i = 0; i < 4; i++) {                                                        \
                const int64_t ti = t + (i < n ? i : n - 1);                                      \
                ap[i] = (const char *)a + (size_t)ti * as;                                       \
                op[i] = dst + (size_t)ti * ds;                                                   \
            }                                                                                    \
            tok4(k, w, ws, ap, op, n, nr);                                                       \
        }                                                                                        \
        if (nt - t == 1)                                                                         \
            rows(k, w, ws, (const char *)a + (size_t)t * as, dst + (size_t)t * ds, nr);          \
        else if (nt - t == 2)                                                                    \
            rows_m(k, w, ws, (const char *)a + (size_t)t * as, as, dst + (size_t)t * ds, ds, nr, 2); \
        else if (nt - t == 3)                                                                    \
            rows_m(k, w, ws, (const char *)a + (size_t)t * as, as, dst + (size_t)t * ds, ds, nr, 3); \
        else if (nt > t)                                                                         \
            rows_m(k, w, ws, (const char *)a + (size_t)t * as, as, dst + (size_t)t * ds, ds, nr, 4); \
    }

/* Small batches are inlined per token count so their accumulators stay in registers. */
#define SPECIALIZE __attribute__((always_inline))

/* The one-token Q4_K and Q6_K kernels are kept out of line: inlined beside the small-batch copies,
 * their loops moved and one-token decode lost about 4%. Where a loop starts within a 64-byte line
 * moves their speed too, so CMakeLists.txt builds this file with -falign-loops=64. */
#define ONE_TOKEN __attribute__((noinline))

/* ---------------------------------------------------------------------------------------------
 * Q4_0 weights, Q8_0 activations: sum (q - 8) a = sum q a - 8 sum a, so the nibbles enter maddubs
 * unsigned and the token-side term 8 sum a is subtracted from the folded quad.
 * ------------------------------------------------------------------------------------------- */

/* One Q4_0 block of one row against a token quad: a0..a3 the tokens' values, corr their terms
 * 8 sum a (folded), dy their scales. */
AVX2 static inline __m256 q4_0_tokens(const struct kiri_block_q4_0 *x, __m256i a0, __m256i a1, __m256i a2,
                                      __m256i a3, __m256i corr, __m256 dy, __m256 acc)
{
    const __m256i u = nibbles(x->qs);
    const __m256i s = _mm256_sub_epi32(fold_i16(_mm256_maddubs_epi16(u, a0), _mm256_maddubs_epi16(u, a1),
                                                _mm256_maddubs_epi16(u, a2), _mm256_maddubs_epi16(u, a3)),
                                       corr);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(bcast_f16(x->d), dy), acc);
}

AVX2 static void q4_0_tok4(int64_t k, const void *w, size_t ws, const void *const ap[4],
                           float *const out[4], int n_tok, int64_t nr)
{
    const struct kiri_block_q8_0 *y[4];
    UNROLL
    for (int i = 0; i < 4; i++)
        y[i] = ap[i];
    const int64_t nb = k / KIRI_QK8_0;
    __m256 dy[CHUNK];
    __m256i corr[CHUNK];
    const __m256i eight = _mm256_set1_epi8(8);
    for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
        const int64_t bn = min64(nb - b0, CHUNK);
        for (int64_t b = 0; b < bn; b++) {
            const int64_t j = b0 + b;
            dy[b] = quad_f16(y[0][j].d, y[1][j].d, y[2][j].d, y[3][j].d);
            corr[b] = fold_i16(_mm256_maddubs_epi16(eight, load256(y[0][j].qs)),
                               _mm256_maddubs_epi16(eight, load256(y[1][j].qs)),
                               _mm256_maddubs_epi16(eight, load256(y[2][j].qs)),
                               _mm256_maddubs_epi16(eight, load256(y[3][j].qs)));
        }
        for (int64_t r = 0; r < nr; r += 4) {
            const struct kiri_block_q4_0 *x[4];
            UNROLL
            for (int i = 0; i < 4; i++)
                x[i] = (const struct kiri_block_q4_0 *)tile_row(w, ws, r + i, nr) + b0;
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
            for (int64_t b = 0; b < bn; b++) {
                const int64_t j = b0 + b;
                const __m256i a0 = load256(y[0][j].qs), a1 = load256(y[1][j].qs);
                const __m256i a2 = load256(y[2][j].qs), a3 = load256(y[3][j].qs);
                acc0 = q4_0_tokens(&x[0][b], a0, a1, a2, a3, corr[b], dy[b], acc0);
                acc1 = q4_0_tokens(&x[1][b], a0, a1, a2, a3, corr[b], dy[b], acc1);
                acc2 = q4_0_tokens(&x[2][b], a0, a1, a2, a3, corr[b], dy[b], acc2);
                acc3 = q4_0_tokens(&x[3][b], a0, a1, a2, a3, corr[b], dy[b], acc3);
            }
            put_tokens4(acc0, acc1, acc2, acc3, out, n_tok, r, nr, b0 == 0);
        }
    }
}

/* One row quad of Q4_0 against one activation block: av its values, c the term 8 sum a in every
 * slot, dy its scale. */
AVX2 static inline __m256 q4_0_quad(const struct kiri_block_q4_0 *x0, const struct kiri_block_q4_0 *x1,
                                    const struct kiri_block_q4_0 *x2, const struct kiri_block_q4_0 *x3,
                                    __m256i av, __m256i c, __m256 dy, __m256 acc)
{
    const __m256i s = _mm256_sub_epi32(fold_i16(_mm256_maddubs_epi16(nibbles(x0->qs), av),
                                                _mm256_maddubs_epi16(nibbles(x1->qs), av),
                                                _mm256_maddubs_epi16(nibbles(x2->qs), av),
                                                _mm256_maddubs_epi16(nibbles(x3->qs), av)),
                                       c);
    const __m256 d = _mm256_mul_ps(quad_f16(x0->d, x1->d, x2->d, x3->d), dy);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
}

/* 8 sum(a) over each 128-bit half of an activation block, in every slot of that half. */
AVX2 static inline __m256i q8_0_corr(__m256i av)
{
    __m256i c = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(8), av), _mm256_set1_epi16(1));
    c = _mm256_hadd_epi32(c, c);
    return _mm256_hadd_epi32(c, c);
}

/* 8 sum(a) over the whole activation block, in every slot (the two halves of q8_0_corr added). */
AVX2 static inline __m256i q8_0_block_corr(__m256i av)
{
    const __m256i c = q8_0_corr(av);
    return _mm256_add_epi32(c, _mm256_permute2x128_si256(c, c, 0x01));
}

/* The quants of two rows' blocks side by side, [row a | row b], 16 bytes each. */
AVX2 static inline __m256i two_rows_q4_0(const struct kiri_block_q4_0 *a, const struct kiri_block_q4_0 *b)
{
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a->qs)),
                                   _mm_loadu_si128((const __m128i *)b->qs), 1);
}

/* Products of two rows' blocks (q from two_rows_q4_0) with one activation block whose first and
 * last 16 values are broadcast to both halves in alo and ahi: the low half holds row a's sums, the
 * high half row b's, 8 int16 each summing 4 products (at most 4 * 15 * 127 = 7620). */
AVX2 static inline __m256i two_rows_dot(__m256i q, __m256i alo, __m256i ahi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    return _mm256_add_epi16(_mm256_maddubs_epi16(lo, alo), _mm256_maddubs_epi16(hi, ahi));
}

/* Blocks of a token (k = 16384 values) up to which q4_0_rows keeps the token's side of every block
 * on the stack (4 KiB) instead of working it out again for every group of rows. */
#define Q4_0_ROWS_TOKEN_BLOCKS 512

/* The token's side of each of its nb blocks: the term 8 sum a (q8_0_block_corr) into corr, the
 * scale as a float into dy. */
AVX2 static inline void q4_0_token_table(const struct kiri_block_q8_0 *y, int64_t nb, int32_t *corr, float *dy)
{
    for (int64_t b = 0; b < nb; b++) {
        corr[b] = _mm256_cvtsi256_si32(q8_0_block_corr(load256(y[b].qs)));
        dy[b] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128((int)y[b].d)));
    }
}

/* One token against rows in groups of 8 (the body of q4_0_rows). Each pair of rows shares a
 * vector (two_rows_dot), so the nibbles of two rows unpack in one go; two rounds of horizontal
 * adds (int16 lanes of at most 7620, then 15240, then 30480: within int16) and the widening madd
 * leave each row's whole block sum in one int32 lane, [r0 r2 r4 r6 | r1 r3 r5 r7]. The term 8 sum
 * a is the same for every row: with `table` it and the token's scale come from corr and dy (block
 * by block, filled once per call), else they are worked out per group. Returns the rows done. */
AVX2 SPECIALIZE static inline int64_t q4_0_rows8(int64_t nb, const void *w, size_t ws,
                                                 const struct kiri_block_q8_0 *y, float *out, int64_t nr,
                                                 int table, const int32_t *corr, const float *dy)
{
    int64_t r = 0;
    for (; nr - r > 4; r += 8) {
        const struct kiri_block_q4_0 *x[8];
        for (int i = 0; i < 8; i++)
            x[i] = (const struct kiri_block_q4_0 *)tile_row(w, ws, r + i, nr);
        const char *nx[8];
        const char *const *pf = next_rows(w, ws, r, 8, nr, nx);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if (!(b & 1)) /* two blocks are 36 bytes: every line gets one prefetch */
                prefetch_rows(pf, 8, (size_t)b * sizeof *x[0], 1);
            const __m256i av = load256(y[b].qs);
            const __m256i alo = _mm256_permute2x128_si256(av, av, 0x00);
            const __m256i ahi = _mm256_permute2x128_si256(av, av, 0x11);
            const __m256i c = table ? _mm256_set1_epi32(corr[b]) : q8_0_block_corr(av);
            const __m256 dyv = table ? _mm256_set1_ps(dy[b]) : bcast_f16(y[b].d);
            const __m256i h0 = _mm256_hadd_epi16(two_rows_dot(two_rows_q4_0(&x[0][b], &x[1][b]), alo, ahi),
                                                 two_rows_dot(two_rows_q4_0(&x[2][b], &x[3][b]), alo, ahi));
            const __m256i h1 = _mm256_hadd_epi16(two_rows_dot(two_rows_q4_0(&x[4][b], &x[5][b]), alo, ahi),
                                                 two_rows_dot(two_rows_q4_0(&x[6][b], &x[7][b]), alo, ahi));
            const __m256i s = _mm256_sub_epi32(
                _mm256_madd_epi16(_mm256_hadd_epi16(h0, h1), _mm256_set1_epi16(1)), c);
            const __m128i dh = _mm_setr_epi16((short)x[0][b].d, (short)x[2][b].d, (short)x[4][b].d,
                                              (short)x[6][b].d, (short)x[1][b].d, (short)x[3][b].d,
                                              (short)x[5][b].d, (short)x[7][b].d);
            const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(dh), dyv);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
        }
        float v[8];
        _mm256_storeu_ps(v, acc);
        static const int lane_row[8] = {0, 2, 4, 6, 1, 3, 5, 7};
        for (int i = 0; i < 8; i++)
            if (r + lane_row[i] < nr)
                out[r + lane_row[i]] = v[i];
    }
    return r;
}

/* One token against rows in groups of 8 (q4_0_rows8), a group of 4 or fewer rows at the end by
 * q4_0_quad. The token's side of a block (its term 8 sum a, a few shuffles, and its scale) is
 * worked out once for all groups: with two threads this kernel computes only a little faster than
 * memory delivers, so its arithmetic still shows in decode (TinyLlama Q4_0, AVX2 tier: +0.3% to
 * +8.8% in four alternated runs, bench/README.md; same bits). */
AVX2 static void q4_0_rows(int64_t k, const void *w, size_t ws, const void *a, float *out, int64_t nr)
{
    const struct kiri_block_q8_0 *y = a;
    const int64_t nb = k / KIRI_QK8_0;
    int64_t r = 0;
    if (nr > 4 && nb <= Q4_0_ROWS_TOKEN_BLOCKS) {
        int32_t corr[Q4_0_ROWS_TOKEN_BLOCKS];
        float dy[Q4_0_ROWS_TOKEN_BLOCKS];
        q4_0_token_table(y, nb, corr, dy);
        r = q4_0_rows8(nb, w, ws, y, out, nr, 1, corr, dy);
    } else {
        r = q4_0_rows8(nb, w, ws, y, out, nr, 0, NULL, NULL);
    }
    if (r < nr) {
        const struct kiri_block_q4_0 *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = (const struct kiri_block_q4_0 *)tile_row(w, ws, r + i, nr);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const __m256i av = load256(y[b].qs);
            acc = q4_0_quad(&x[0][b], &x[1][b], &x[2][b], &x[3][b], av, q8_0_corr(av),
                            bcast_f16(y[b].d), acc);
        }
        put_rows(acc, out + r, nr - r);
    }
}

/* The groups of 8 rows of q4_0_rows_m (see there), with the tokens' side of each block from the
 * tables corr and dy when `table` (as in q4_0_rows8; token j's at j Q4_0_ROWS_TOKEN_BLOCKS).
 * Returns the rows done. */
AVX2 SPECIALIZE static inline int64_t q4_0_rows_m8(int64_t nb, const void *w, size_t ws,
                                                   const struct kiri_block_q8_0 *const y[4], float *dst,
                                                   size_t ds, int64_t nr, int m, int table,
                                                   const int32_t *corr, const float *dy)
{
    static const int lane_row[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    int64_t r = 0;
    for (; nr - r > 4; r += 8) { /* eight rows as in q4_0_rows: two per vector */
        const struct kiri_block_q4_0 *x[8];
        for (int i = 0; i < 8; i++)
            x[i] = (const struct kiri_block_q4_0 *)tile_row(w, ws, r + i, nr);
        const char *nx[8];
        const char *const *pf = next_rows(w, ws, r, 8, nr, nx);
        __m256 acc[4];
        _Pragma("GCC unroll 4")
        for (int j = 0; j < m; j++)
            acc[j] = _mm256_setzero_ps();
        const __m256i m4 = _mm256_set1_epi8(0x0F);
        for (int64_t b = 0; b < nb; b++) {
            if (!(b & 1))
                prefetch_rows(pf, 8, (size_t)b * sizeof *x[0], 1);
            __m256i lo[4], hi[4];
            UNROLL
            for (int p = 0; p < 4; p++) {
                const __m256i q = two_rows_q4_0(&x[2 * p][b], &x[2 * p + 1][b]);
                lo[p] = _mm256_and_si256(q, m4);
                hi[p] = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            }
            const __m128i dh = _mm_setr_epi16((short)x[0][b].d, (short)x[2][b].d, (short)x[4][b].d,
                                              (short)x[6][b].d, (short)x[1][b].d, (short)x[3][b].d,
                                              (short)x[5][b].d, (short)x[7][b].d);
            const __m256 dx = _mm256_cvtph_ps(dh);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < m; j++) {
                const __m256i av = load256(y[j][b].qs);
                const __m256i alo = _mm256_permute2x128_si256(av, av, 0x00);
                const __m256i ahi = _mm256_permute2x128_si256(av, av, 0x11);
                const int64_t tb = j * Q4_0_ROWS_TOKEN_BLOCKS + b; /* token j's block b in the tables */
                const __m256i c = table ? _mm256_set1_epi32(corr[tb]) : q8_0_block_corr(av);
                const __m256 dyv = table ? _mm256_set1_ps(dy[tb]) : bcast_f16(y[j][b].d);
                __m256i d2[4];
                UNROLL
                for (int p = 0; p < 4; p++)
                    d2[p] = _mm256_add_epi16(_mm256_maddubs_epi16(lo[p], alo), _mm256_maddubs_epi16(hi[p], ahi));
                const __m256i h = _mm256_hadd_epi16(_mm256_hadd_epi16(d2[0], d2[1]), _mm256_hadd_epi16(d2[2], d2[3]));
                const __m256i s = _mm256_sub_epi32(_mm256_madd_epi16(h, _mm256_set1_epi16(1)), c);
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx, dyv), acc[j]);
            }
        }
        _Pragma("GCC unroll 4")
        for (int j = 0; j < m; j++) {
            float v[8];
            _mm256_storeu_ps(v, acc[j]);
            for (int i = 0; i < 8; i++)
                if (r + lane_row[i] < nr)
                    dst[(size_t)j * ds + (size_t)(r + lane_row[i])] = v[i];
        }
    }
    return r;
}

/* m (2..4) tokens against rows in groups of 8 as in q4_0_rows (a quad for the last four rows or
 * fewer): per block the rows' nibbles are unpacked once and used for every token, and the next
 * group is prefetched, so the rows stream from memory once for the whole batch. Each token's side
 * of a block comes from a table filled once per call (q4_0_token_table): these steps are bound by
 * arithmetic, and redoing it for every group of rows cost a fifth of them (TinyLlama Q4_0, AVX2
 * tier, 2 threads, steps of 2 and 4 tokens: 53 -> 63 and 61 -> 76 tok/s; same bits). */
AVX2 SPECIALIZE static inline void q4_0_rows_m(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int m)
{
    const struct kiri_block_q8_0 *y[4];
    for (int j = 0; j < 4; j++)
        y[j] = (const struct kiri_block_q8_0 *)tile_row(a, as, j, m); /* the last token repeated */
    const int64_t nb = k / KIRI_QK8_0;
    int64_t r = 0;
    if (nr > 4 && nb <= Q4_0_ROWS_TOKEN_BLOCKS) {
        int32_t corr[4 * Q4_0_ROWS_TOKEN_BLOCKS];
        float dy[4 * Q4_0_ROWS_TOKEN_BLOCKS];
        _Pragma("GCC unroll 4")
        for (int j = 0; j < m; j++)
            q4_0_token_table(y[j], nb, corr + j * Q4_0_ROWS_TOKEN_BLOCKS, dy + j * Q4_0_ROWS_TOKEN_BLOCKS);
        r = q4_0_rows_m8(nb, w, ws, y, dst, ds, nr, m, 1, corr, dy);
    } else {
        r = q4_0_rows_m8(nb, w, ws, y, dst, ds, nr, m, 0, NULL, NULL);
    }
    for (; r < nr; r += 4) { /* the last four rows or fewer */
        const struct kiri_block_q4_0 *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = (const struct kiri_block_q4_0 *)tile_row(w, ws, r + i, nr);
        const char *nx[4];
        const char *const *pf = next_rows(w, ws, r, 4, nr, nx);
        __m256 acc[4];
        _Pragma("GCC unroll 4")
        for (int j = 0; j < m; j++)
            acc[j] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            if (!(b & 1)) /* two blocks are 36 bytes: every line gets one prefetch */
                prefetch_rows(pf, 4, (size_t)b * sizeof *x[0], 1);
            const __m256i u0 = nibbles(x[0][b].qs), u1 = nibbles(x[1][b].qs);
            const __m256i u2 = nibbles(x[2][b].qs), u3 = nibbles(x[3][b].qs);
            const __m256 dx = quad_f16(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < m; j++) {
                const __m256i av = load256(y[j][b].qs);
                const __m256i s = _mm256_sub_epi32(fold_i16(_mm256_maddubs_epi16(u0, av), _mm256_maddubs_epi16(u1, av),
                                                            _mm256_maddubs_epi16(u2, av), _mm256_maddubs_epi16(u3, av)),
                                                   q8_0_corr(av));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx, bcast_f16(y[j][b].d)), acc[j]);
            }
        }
        _Pragma("GCC unroll 4")
        for (int j = 0; j < m; j++)
            put_rows(acc[j], dst + (size_t)j * ds + r, nr - r);
    }
}

GEMM_DRIVER_SMALL(gemm_q4_0_small, q4_0_tok4, q4_0_rows, q4_0_rows_m)

/* Whole token octets go to gemm_octet_avx2.c, the rest (and small batches) to the quads above. */
#define GEMM_OCTETS(name, octets, small)                                                         \
    AVX2 static void name(int64_t k, const void *w, size_t ws, const void *a, size_t as,         \
                          float *dst, size_t ds, int64_t nr, int64_t nt)                        \
    {                                                                                            \
        const int64_t t = nt >= 8 ? octets(k, w, ws, a, as, dst, ds, nr, nt) : 0;                \
        if (t < nt)                                                                              \
            small(k, w, ws, (const char *)a + (size_t)t * as, as, dst + (size_t)t * ds, ds, nr,  \
                  nt - t);                                                                       \
    }

GEMM_OCTETS(gemm_q4_0_avx2, kiri_cpu_gemm_octets_q4_0_avx2, gemm_q4_0_small)

/* ---------------------------------------------------------------------------------------------
 * Q8_0 weights, Q8_0 activations: int8 x int8 through maddubs with |w| and a carrying w's sign;
 * pair sums reach 2 * 128 * 127, so the quads fold as int32.
 * ------------------------------------------------------------------------------------------- */

AVX2 static inline __m256i dot_i8(__m256i aw, __m256i w, __m256i a)
{
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(a, w)), _mm256_set1_epi16(1));
}

AVX2 static inline __m256 q8_0_tokens(const struct kiri_block_q8_0 *x, __m256i a0, __m256i a1, __m256i a2,
                                      __m256i a3, __m256 dy, __m256 acc)
{
    const __m256i q = load256(x->qs);
    const __m256i aq = _mm256_sign_epi8(q, q);
    const __m256i s = fold_i32(dot_i8(aq, q, a0), dot_i8(aq, q, a1), dot_i8(aq, q, a2), dot_i8(aq, q, a3));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(bcast_f16(x->d), dy), acc);
}

AVX2 static void q8_0_tok4(int64_t k, const void *w, size_t ws, const void *const ap[4],
                           float *const out[4], int n_tok, int64_t nr)
{
    const struct kiri_block_q8_0 *y[4];
    UNROLL
    for (int i = 0; i < 4; i++)
        y[i] = ap[i];
    const int64_t nb = k / KIRI_QK8_0;
    __m256 dy[CHUNK];
    for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
        const int64_t bn = min64(nb - b0, CHUNK);
        for (int64_t b = 0; b < bn; b++) {
            const int64_t j = b0 + b;
            dy[b] = quad_f16(y[0][j].d, y[1][j].d, y[2][j].d, y[3][j].d);
        }
        for (int64_t r = 0; r < nr; r += 4) {
            const struct kiri_block_q8_0 *x[4];
            UNROLL
            for (int i = 0; i < 4; i++)
                x[i] = (const struct kiri_block_q8_0 *)tile_row(w, ws, r + i, nr) + b0;
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
            for (int64_t b = 0; b < bn; b++) {
                const int64_t j = b0 + b;
                const __m256i a0 = load256(y[0][j].qs), a1 = load256(y[1][j].qs);
                const __m256i a2 = load256(y[2][j].qs), a3 = load256(y[3][j].qs);
                acc0 = q8_0_tokens(&x[0][b], a0, a1, a2, a3, dy[b], acc0);
                acc1 = q8_0_tokens(&x[1][b], a0, a1, a2, a3, dy[b], acc1);
                acc2 = q8_0_tokens(&x[2][b], a0, a1, a2, a3, dy[b], acc2);
                acc3 = q8_0_tokens(&x[3][b], a0, a1, a2, a3, dy[b], acc3);
            }
            put_tokens4(acc0, acc1, acc2, acc3, out, n_tok, r, nr, b0 == 0);
        }
    }
}

AVX2 static inline __m256i q8_0_row_dot(const struct kiri_block_q8_0 *x, __m256i av)
{
    const __m256i q = load256(x->qs);
    return dot_i8(_mm256_sign_epi8(q, q), q, av);
}

AVX2 static inline __m256 q8_0_quad(const struct kiri_block_q8_0 *x0, const struct kiri_block_q8_0 *x1,
                                    const struct kiri_block_q8_0 *x2, const struct kiri_block_q8_0 *x3,
                                    __m256i av, __m256 dy, __m256 acc)
{
    const __m256i s = fold_i32(q8_0_row_dot(x0, av), q8_0_row_dot(x1, av), q8_0_row_dot(x2, av),
                               q8_0_row_dot(x3, av));
    const __m256 d = _mm256_mul_ps(quad_f16(x0->d, x1->d, x2->d, x3->d), dy);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
}

AVX2 static void q8_0_rows(int64_t k, const void *w, size_t ws, const void *a, float *out, int64_t nr)
{
    const struct kiri_block_q8_0 *y = a;
    const int64_t nb = k / KIRI_QK8_0;
    for (int64_t r = 0; r < nr; r += 4) {
        const struct kiri_block_q8_0 *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = (const struct kiri_block_q8_0 *)tile_row(w, ws, r + i, nr);
        const char *nx[4];
        const char *const *pf = next_rows(w, ws, r, 4, nr, nx);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            prefetch_rows(pf, 4, (size_t)b * sizeof *x[0], 1);
            acc = q8_0_quad(&x[0][b], &x[1][b], &x[2][b], &x[3][b], load256(y[b].qs),
                            bcast_f16(y[b].d), acc);
        }
        put_rows(acc, out + r, nr - r);
    }
}

/* m (2..4) tokens against rows in quads (see q4_0_rows_m): each row's block is loaded and its
 * absolute values taken once for all tokens. */
AVX2 SPECIALIZE static inline void q8_0_rows_m(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int m)
{
    const struct kiri_block_q8_0 *y[4];
    for (int j = 0; j < 4; j++)
        y[j] = (const struct kiri_block_q8_0 *)tile_row(a, as, j, m); /* the last token repeated */
    const int64_t nb = k / KIRI_QK8_0;
    for (int64_t r = 0; r < nr; r += 4) {
        const struct kiri_block_q8_0 *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = (const struct kiri_block_q8_0 *)tile_row(w, ws, r + i, nr);
        const char *nx[4];
        const char *const *pf = next_rows(w, ws, r, 4, nr, nx);
        __m256 acc[4];
        _Pragma("GCC unroll 4")
        for (int j = 0; j < m; j++)
            acc[j] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            prefetch_rows(pf, 4, (size_t)b * sizeof *x[0], 1);
            const __m256i q0 = load256(x[0][b].qs), q1 = load256(x[1][b].qs);
            const __m256i q2 = load256(x[2][b].qs), q3 = load256(x[3][b].qs);
            const __m256i g0 = _mm256_sign_epi8(q0, q0), g1 = _mm256_sign_epi8(q1, q1);
            const __m256i g2 = _mm256_sign_epi8(q2, q2), g3 = _mm256_sign_epi8(q3, q3);
            const __m256 dx = quad_f16(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
            _Pragma("GCC unroll 4")
            for (int j = 0; j < m; j++) {
                const __m256i av = load256(y[j][b].qs);
                const __m256i s = fold_i32(dot_i8(g0, q0, av), dot_i8(g1, q1, av), dot_i8(g2, q2, av), dot_i8(g3, q3, av));
                acc[j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx, bcast_f16(y[j][b].d)), acc[j]);
            }
        }
        _Pragma("GCC unroll 4")
        for (int j = 0; j < m; j++)
            put_rows(acc[j], dst + (size_t)j * ds + r, nr - r);
    }
}

GEMM_DRIVER_SMALL(gemm_q8_0_small, q8_0_tok4, q8_0_rows, q8_0_rows_m)
GEMM_OCTETS(gemm_q8_0_avx2, kiri_cpu_gemm_octets_q8_0_avx2, gemm_q8_0_small)

/* ---------------------------------------------------------------------------------------------
 * Q4_1, Q5_0, Q5_1 weights (Q8_1, Q8_0 and Q8_1 activations): the Q4_0 scheme with other
 * unsigned quants. Each block's quants enter maddubs unsigned, u in 0..15 (Q4_1) or 0..31 (the
 * nibble with the fifth bit from qh), so a pair sum is at most 2 * 31 * 127 = 7874 and the
 * folds' int16 lanes at most 4 * 7874 = 31496. Q5_0 is x = d (u - 16): the token-side term
 * 16 sum a is subtracted as Q4_0's 8 sum a is. Q4_1 and Q5_1 are x = d u + m: the offset's share
 * m s_a (Q8_1 carries s = d_a sum a) is one more product per block, added in the low half of the
 * quad only since the two halves are summed at the end.
 * One body per kernel shape, inlined per type with a constant `t` (an enum q32 below). Whole token
 * octets go to gemm_octet_avx2.c.
 * ------------------------------------------------------------------------------------------- */

enum q32 { Q32_Q4_1, Q32_Q5_0, Q32_Q5_1 };

static inline size_t q32_size(enum q32 t)
{
    return t == Q32_Q4_1 ? sizeof(struct kiri_block_q4_1)
                         : t == Q32_Q5_0 ? sizeof(struct kiri_block_q5_0) : sizeof(struct kiri_block_q5_1);
}

/* The activation type's block: Q8_0 for Q5_0, Q8_1 (d, s, qs) for the others; d comes first. */
static inline size_t q32_act_size(enum q32 t)
{
    return t == Q32_Q5_0 ? sizeof(struct kiri_block_q8_0) : sizeof(struct kiri_block_q8_1);
}

static inline const int8_t *q32_act_qs(enum q32 t, const char *yb)
{
    return t == Q32_Q5_0 ? ((const struct kiri_block_q8_0 *)yb)->qs : ((const struct kiri_block_q8_1 *)yb)->qs;
}

static inline kiri_f16 f16_at(const char *p)
{
    kiri_f16 h;
    memcpy(&h, p, sizeof h);
    return h;
}

/* Every block type starts with d; Q4_1 and Q5_1 follow it with m, Q8_1 with s, Q4_K and Q5_K
 * with dmin. */
static inline kiri_f16 q32_d(const char *xb) { return f16_at(xb); }
static inline kiri_f16 q32_m(const char *xb) { return f16_at(xb + sizeof(kiri_f16)); }

/* 0x10 in byte i where bit i of qh is set, else 0. */
AVX2 static inline __m256i fifth_bits(const uint8_t *qh)
{
    uint32_t bits;
    memcpy(&bits, qh, sizeof bits); /* little-endian, as x86 is */
    const __m256i pick = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll,
                                           0x0101010101010101ll, 0x0000000000000000ll);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i v = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)bits), pick), bit);
    return _mm256_andnot_si256(_mm256_cmpeq_epi8(v, _mm256_setzero_si256()), _mm256_set1_epi8(0x10));
}

/* The 32 unsigned quants of a block in element order. */
AVX2 static inline __m256i q32_unpack(enum q32 t, const char *xb)
{
    if (t == Q32_Q4_1)
        return nibbles(((const struct kiri_block_q4_1 *)xb)->qs);
    if (t == Q32_Q5_0) {
        const struct kiri_block_q5_0 *x = (const struct kiri_block_q5_0 *)xb;
        return _mm256_or_si256(nibbles(x->qs), fifth_bits(x->qh));
    }
    const struct kiri_block_q5_1 *x = (const struct kiri_block_q5_1 *)xb;
    return _mm256_or_si256(nibbles(x->qs), fifth_bits(x->qh));
}

/* 16 sum(a) over each 128-bit half of an activation block, in every slot of that half (Q5_0). */
AVX2 static inline __m256i q5_0_corr(__m256i av)
{
    __m256i c = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(16), av), _mm256_set1_epi16(1));
    c = _mm256_hadd_epi32(c, c);
    return _mm256_hadd_epi32(c, c);
}

/* [f0 f1 f2 f3 0 0 0 0]: the offsets' or the tokens' s of a quad, in the low half only. */
AVX2 static inline __m256 quad_f16_lo(kiri_f16 h0, kiri_f16 h1, kiri_f16 h2, kiri_f16 h3)
{
    return _mm256_cvtph_ps(_mm_setr_epi16((short)h0, (short)h1, (short)h2, (short)h3, 0, 0, 0, 0));
}

/* One block of one row against a token quad (see q4_0_tokens): corr the tokens' 16 sum a (Q5_0),
 * sy their s in the low half (Q4_1, Q5_1). */
AVX2 SPECIALIZE static inline __m256 q32_tokens(enum q32 t, const char *xb, __m256i a0, __m256i a1, __m256i a2,
                                                __m256i a3, __m256i corr, __m256 sy, __m256 dy, __m256 acc)
{
    const __m256i u = q32_unpack(t, xb);
    __m256i s = fold_i16(_mm256_maddubs_epi16(u, a0), _mm256_maddubs_epi16(u, a1), _mm256_maddubs_epi16(u, a2),
                         _mm256_maddubs_epi16(u, a3));
    if (t == Q32_Q5_0)
        s = _mm256_sub_epi32(s, corr);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(bcast_f16(q32_d(xb)), dy), acc);
    if (t != Q32_Q5_0)
        acc = _mm256_fmadd_ps(bcast_f16(q32_m(xb)), sy, acc);
    return acc;
}

/* Four tokens against every row of the tile, four rows at a time, in passes of CHUNK blocks whose
 * token-side values are computed once per pass (as q4_0_tok4). */
AVX2 SPECIALIZE static inline void q32_tok4(enum q32 t, int64_t k, const void *w, size_t ws, const void *const ap[4],
                                            float *const out[4], int n_tok, int64_t nr)
{
    const size_t xs = q32_size(t), ys = q32_act_size(t);
    const char *y[4];
    UNROLL
    for (int i = 0; i < 4; i++)
        y[i] = ap[i];
    const int64_t nb = k / 32;
    __m256 dy[CHUNK], sy[CHUNK];
    __m256i corr[CHUNK];
    const __m256i sixteen = _mm256_set1_epi8(16);
    for (int64_t b0 = 0; b0 < nb; b0 += CHUNK) {
        const int64_t bn = min64(nb - b0, CHUNK);
        for (int64_t b = 0; b < bn; b++) {
            const size_t o = (size_t)(b0 + b) * ys;
            dy[b] = quad_f16(q32_d(y[0] + o), q32_d(y[1] + o), q32_d(y[2] + o), q32_d(y[3] + o));
            if (t == Q32_Q5_0) {
                corr[b] = fold_i16(_mm256_maddubs_epi16(sixteen, load256(q32_act_qs(t, y[0] + o))),
                                   _mm256_maddubs_epi16(sixteen, load256(q32_act_qs(t, y[1] + o))),
                                   _mm256_maddubs_epi16(sixteen, load256(q32_act_qs(t, y[2] + o))),
                                   _mm256_maddubs_epi16(sixteen, load256(q32_act_qs(t, y[3] + o))));
                sy[b] = _mm256_setzero_ps();
            } else {
                corr[b] = _mm256_setzero_si256();
                sy[b] = quad_f16_lo(q32_m(y[0] + o), q32_m(y[1] + o), q32_m(y[2] + o), q32_m(y[3] + o));
            }
        }
        for (int64_t r = 0; r < nr; r += 4) {
            const char *x[4];
            UNROLL
            for (int i = 0; i < 4; i++)
                x[i] = tile_row(w, ws, r + i, nr) + (size_t)b0 * xs;
            __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
            __m256 acc2 = _mm256_setzero_ps(), acc3 = _mm256_setzero_ps();
            for (int64_t b = 0; b < bn; b++) {
                const size_t o = (size_t)(b0 + b) * ys, ox = (size_t)b * xs;
                const __m256i a0 = load256(q32_act_qs(t, y[0] + o)), a1 = load256(q32_act_qs(t, y[1] + o));
                const __m256i a2 = load256(q32_act_qs(t, y[2] + o)), a3 = load256(q32_act_qs(t, y[3] + o));
                acc0 = q32_tokens(t, x[0] + ox, a0, a1, a2, a3, corr[b], sy[b], dy[b], acc0);
                acc1 = q32_tokens(t, x[1] + ox, a0, a1, a2, a3, corr[b], sy[b], dy[b], acc1);
                acc2 = q32_tokens(t, x[2] + ox, a0, a1, a2, a3, corr[b], sy[b], dy[b], acc2);
                acc3 = q32_tokens(t, x[3] + ox, a0, a1, a2, a3, corr[b], sy[b], dy[b], acc3);
            }
            put_tokens4(acc0, acc1, acc2, acc3, out, n_tok, r, nr, b0 == 0);
        }
    }
}

/* One activation block against a row quad whose quants u0..u3, scales dx and offsets mx (low
 * half; Q4_1, Q5_1) are unpacked: the step of q32_rows and, for each token, of q32_rows_m, so a
 * token gets the same floats in both. */
AVX2 SPECIALIZE static inline __m256 q32_quad(enum q32 t, const char *yb, __m256i u0, __m256i u1, __m256i u2,
                                              __m256i u3, __m256 dx, __m256 mx, __m256 acc)
{
    const __m256i av = load256(q32_act_qs(t, yb));
    __m256i s = fold_i16(_mm256_maddubs_epi16(u0, av), _mm256_maddubs_epi16(u1, av), _mm256_maddubs_epi16(u2, av),
                         _mm256_maddubs_epi16(u3, av));
    if (t == Q32_Q5_0)
        s = _mm256_sub_epi32(s, q5_0_corr(av));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx, bcast_f16(q32_d(yb))), acc);
    if (t != Q32_Q5_0)
        acc = _mm256_fmadd_ps(mx, bcast_f16(q32_m(yb)), acc);
    return acc;
}

/* m (1..4) tokens against rows in quads, the next quad prefetched: per block each row's quants
 * are unpacked once and used for every token, so the rows stream from memory once for the batch
 * (m == 1: the one-token path). */
AVX2 SPECIALIZE static inline void q32_rows_m(enum q32 t, int64_t k, const void *w, size_t ws, const void *a,
                                              size_t as, float *dst, size_t ds, int64_t nr, int m)
{
    const size_t xs = q32_size(t), ys = q32_act_size(t);
    const char *y[4];
    for (int j = 0; j < 4; j++)
        y[j] = tile_row(a, as, j, m); /* the last token repeated */
    const int64_t nb = k / 32;
    for (int64_t r = 0; r < nr; r += 4) {
        const char *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = tile_row(w, ws, r + i, nr);
        const char *nx[4];
        const char *const *pf = next_rows(w, ws, r, 4, nr, nx);
        __m256 acc[4];
        _Pragma("GCC unroll 4")
        for (int j = 0; j < m; j++)
            acc[j] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const size_t ox = (size_t)b * xs;
            if (!(b & 1)) /* two blocks are at most 48 bytes: every line gets one prefetch */
                prefetch_rows(pf, 4, ox, 1);
            const __m256i u0 = q32_unpack(t, x[0] + ox), u1 = q32_unpack(t, x[1] + ox);
            const __m256i u2 = q32_unpack(t, x[2] + ox), u3 = q32_unpack(t, x[3] + ox);
            const __m256 dx = quad_f16(q32_d(x[0] + ox), q32_d(x[1] + ox), q32_d(x[2] + ox), q32_d(x[3] + ox));
            const __m256 mx = t == Q32_Q5_0 ? _mm256_setzero_ps()
                                            : quad_f16_lo(q32_m(x[0] + ox), q32_m(x[1] + ox), q32_m(x[2] + ox),
                                                          q32_m(x[3] + ox));
            _Pragma("GCC unroll 4")
            for (int j = 0; j < m; j++)
                acc[j] = q32_quad(t, y[j] + (size_t)b * ys, u0, u1, u2, u3, dx, mx, acc[j]);
        }
        _Pragma("GCC unroll 4")
        for (int j = 0; j < m; j++)
            put_rows(acc[j], dst + (size_t)j * ds + r, nr - r);
    }
}

/* The entry points of one type: the shapes above with t fixed, for GEMM_DRIVER_SMALL. */
#define GEMM_Q32(name, t)                                                                        \
    AVX2 static void name##_tok4(int64_t k, const void *w, size_t ws, const void *const ap[4],  \
                                 float *const out[4], int n_tok, int64_t nr)                    \
    {                                                                                            \
        q32_tok4(t, k, w, ws, ap, out, n_tok, nr);                                               \
    }                                                                                            \
    AVX2 static void name##_rows(int64_t k, const void *w, size_t ws, const void *a, float *out, \
                                 int64_t nr)                                                     \
    {                                                                                            \
        q32_rows_m(t, k, w, ws, a, 0, out, 0, nr, 1);                                            \
    }                                                                                            \
    AVX2 SPECIALIZE static inline void name##_rows_m(int64_t k, const void *w, size_t ws,        \
                                                     const void *a, size_t as, float *dst,       \
                                                     size_t ds, int64_t nr, int m)               \
    {                                                                                            \
        q32_rows_m(t, k, w, ws, a, as, dst, ds, nr, m);                                          \
    }                                                                                            \
    GEMM_DRIVER_SMALL(gemm_##name##_small, name##_tok4, name##_rows, name##_rows_m)

GEMM_Q32(q4_1, Q32_Q4_1)
GEMM_OCTETS(gemm_q4_1_avx2, kiri_cpu_gemm_octets_q4_1_avx2, gemm_q4_1_small)
GEMM_Q32(q5_0, Q32_Q5_0)
GEMM_OCTETS(gemm_q5_0_avx2, kiri_cpu_gemm_octets_q5_0_avx2, gemm_q5_0_small)
GEMM_Q32(q5_1, Q32_Q5_1)
GEMM_OCTETS(gemm_q5_1_avx2, kiri_cpu_gemm_octets_q5_1_avx2, gemm_q5_1_small)

/* ---------------------------------------------------------------------------------------------
 * Q4_K weights, Q8_K activations: x = d sc q - dmin m per sub-block of 32, so
 * sum x a = d_a (d sum_j sc_j sum(q a) - dmin sum_j m_j (bsums of sub-block j)).
 * ------------------------------------------------------------------------------------------- */

/* Unpacks the 8 scales and 8 mins of a Q4_K block (6 bits each in 12 bytes, see
 * get_scale_min_k4 in quants.c): the scales into sc as int16 (the kernels broadcast them from
 * memory), the mins returned repeated per pair of bsums, [m0 m0 m1 m1 ... m7 m7] as int16. */
AVX2 static inline __m256i scales_k4(const uint8_t *p, uint16_t sc[8])
{
    uint32_t v[3], o[4];
    memcpy(v, p, 12);
    o[0] = v[0] & 0x3f3f3f3fu;
    o[1] = (v[2] & 0x0f0f0f0fu) | ((v[0] >> 2) & 0x30303030u);
    o[2] = v[1] & 0x3f3f3f3fu;
    o[3] = ((v[2] >> 4) & 0x0f0f0f0fu) | ((v[1] >> 2) & 0x30303030u);
    const __m128i b = _mm_loadu_si128((const __m128i *)o);
    _mm_storeu_si128((__m128i *)sc, _mm_cvtepu8_epi16(b));
    return _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(b, b));
}

/* One row against four tokens, Q4_K (five == 0) or Q5_K (five == 1; see q5_K_unpack below):
 * per super-block the row's quants are unpacked once; the four tokens' maddubs results fold two
 * rounds into [t0 t0 t1 t1 t2 t2 t3 t3] int16 pairs per half (8 products each, at most 31496),
 * which one madd with the sub-block's scale widens. The two blocks share d, dmin and the scales'
 * layout. */
_Static_assert(offsetof(struct kiri_block_q5_K, scales) == offsetof(struct kiri_block_q4_K, scales) &&
                   offsetof(struct kiri_block_q5_K, dmin) == offsetof(struct kiri_block_q4_K, dmin),
               "Q4_K and Q5_K share their header");

/* The 5-bit quants of chunk j (sub-blocks 2j and 2j + 1) of a Q5_K block: hb is the qh bytes
 * shifted right by 2j, so their bits 0 and 1 are this chunk's. */
AVX2 static inline void q5_K_unpack(const uint8_t *qs, int j, __m256i hb, __m256i *lo, __m256i *hi)
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    const __m256i q = load256(qs + 32 * j);
    *lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_slli_epi16(_mm256_and_si256(hb, one), 4));
    *hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), one), 4));
}

AVX2 SPECIALIZE static inline void k4_tok4(int five, int64_t k, const void *w, size_t ws, const void *const ap[4],
                                           float *const out[4], int n_tok, int64_t nr)
{
    const struct kiri_block_q8_K *y0 = ap[0], *y1 = ap[1], *y2 = ap[2], *y3 = ap[3];
    const int64_t nb = k / KIRI_QK_K;
    const size_t bs = five ? sizeof(struct kiri_block_q5_K) : sizeof(struct kiri_block_q4_K);
    const size_t qs_at = five ? offsetof(struct kiri_block_q5_K, qs) : offsetof(struct kiri_block_q4_K, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t r = 0; r < nr; r++) {
        const char *x = (const char *)w + (size_t)r * ws;
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const char *xb = x + (size_t)b * bs;
            uint16_t sc[8];
            const __m256i m16 = scales_k4((const uint8_t *)xb + offsetof(struct kiri_block_q4_K, scales), sc);
            __m256i isum = _mm256_setzero_si256();
            __m256i hb = five ? load256(xb + offsetof(struct kiri_block_q5_K, qh)) : _mm256_setzero_si256();
            UNROLL
            for (int j = 0; j < 4; j++) {
                __m256i lo, hi;
                if (five) {
                    q5_K_unpack((const uint8_t *)xb + qs_at, j, hb, &lo, &hi);
                    hb = _mm256_srli_epi16(hb, 2);
                } else {
                    const __m256i q = load256(xb + qs_at + 32 * j);
                    lo = _mm256_and_si256(q, m4);
                    hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                }
                const int o = 64 * j;
                const __m256i plo = fold_i16_pairs(_mm256_maddubs_epi16(lo, load256(y0[b].qs + o)),
                                                   _mm256_maddubs_epi16(lo, load256(y1[b].qs + o)),
                                                   _mm256_maddubs_epi16(lo, load256(y2[b].qs + o)),
                                                   _mm256_maddubs_epi16(lo, load256(y3[b].qs + o)));
                const __m256i phi = fold_i16_pairs(_mm256_maddubs_epi16(hi, load256(y0[b].qs + o + 32)),
                                                   _mm256_maddubs_epi16(hi, load256(y1[b].qs + o + 32)),
                                                   _mm256_maddubs_epi16(hi, load256(y2[b].qs + o + 32)),
                                                   _mm256_maddubs_epi16(hi, load256(y3[b].qs + o + 32)));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(plo, _mm256_set1_epi16((short)sc[2 * j])));
                isum = _mm256_add_epi32(isum, _mm256_madd_epi16(phi, _mm256_set1_epi16((short)sc[2 * j + 1])));
            }
            const __m256i imin = fold_i32(_mm256_madd_epi16(load256(y0[b].bsums), m16),
                                          _mm256_madd_epi16(load256(y1[b].bsums), m16),
                                          _mm256_madd_epi16(load256(y2[b].bsums), m16),
                                          _mm256_madd_epi16(load256(y3[b].bsums), m16));
            const __m256 dy = quad_f32(y0[b].d, y1[b].d, y2[b].d, y3[b].d);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(bcast_f16(q32_d(xb)), dy), acc);
            acc = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin), _mm256_mul_ps(bcast_f16(q32_m(xb)), dy), acc);
        }
        put_tokens(acc, out, n_tok, r, 1);
    }
}

AVX2 static void q4_K_tok4(int64_t k, const void *w, size_t ws, const void *const ap[4],
                           float *const out[4], int n_tok, int64_t nr)
{
    k4_tok4(0, k, w, ws, ap, out, n_tok, nr);
}

/* One Q4_K block's header (d, dmin and the 12 bytes of scales and mins, loaded as 16 bytes) into
 * [sc0 .. sc7 | m0 .. m7] bytes: the word operations of get_scale_min_k4 (quants.c) on dwords
 * 1..3 (w0 w1 w2): [w0 & 3f, w2 & 0f | (w0 >> 2) & 30, w1 & 3f, (w2 >> 4) & 0f | (w1 >> 2) & 30]. */
AVX2 static inline __m128i unpack_header_k4(__m128i hd)
{
    const __m128i sa = _mm_shuffle_epi32(hd, _MM_SHUFFLE(3, 2, 3, 1)); /* w0 w2 w1 w2 */
    const __m128i sb = _mm_shuffle_epi32(hd, _MM_SHUFFLE(2, 2, 1, 1)); /* w0 w0 w1 w1 */
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(sa, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    const __m128i hi = _mm_and_si128(_mm_srli_epi32(sb, 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
    return _mm_or_si128(lo, hi);
}

/* Four Q4_K rows against one token. Per super-block each 32-byte piece of the activation is
 * loaded once for the four rows, and the scales are applied once per row: the eight sub-blocks'
 * maddubs results of a row are folded by three rounds of horizontal adds into [s0 .. s7] per
 * 128-bit half (each the sum of 16 products, at most 16 * 15 * 127 < 2^15 in magnitude), which
 * one madd with the row's eight scales turns into int32. The float work (d, dmin, conversion) is
 * done once for the four rows on folded quads. */
AVX2 ONE_TOKEN static void q4_K_rows(int64_t k, const void *w, size_t ws, const void *a, float *out, int64_t nr)
{
    const struct kiri_block_q8_K *y = a;
    const int64_t nb = k / KIRI_QK_K;
    const size_t bs = sizeof(struct kiri_block_q4_K);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t r = 0; r < nr; r += 4) {
        const char *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = tile_row(w, ws, r + i, nr);
        const char *nx[4];
        const char *const *pf = next_rows(w, ws, r + 4, 4, nr, nx); /* two groups ahead */
        __m256 accq = _mm256_setzero_ps(), accm01 = _mm256_setzero_ps(), accm23 = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const size_t o = (size_t)b * bs;
            prefetch_rows(pf, 4, o, bs);
            const int8_t *aq = y[b].qs;
            __m256i h[4][2]; /* per row: sub-blocks 0-3 folded twice, then 4-7 */
            UNROLL
            for (int j = 0; j < 4; j++) {
                const __m256i alo = load256(aq + 64 * j), ahi = load256(aq + 64 * j + 32);
                UNROLL
                for (int i = 0; i < 4; i++) {
                    const __m256i q = load256(x[i] + o + offsetof(struct kiri_block_q4_K, qs) + 32 * j);
                    const __m256i pl = _mm256_maddubs_epi16(_mm256_and_si256(q, m4), alo);
                    const __m256i ph = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), ahi);
                    const __m256i pp = _mm256_hadd_epi16(pl, ph); /* sub-blocks 2j, 2j + 1 */
                    h[i][j / 2] = j % 2 ? _mm256_hadd_epi16(h[i][j / 2], pp) : pp;
                }
            }
            __m128i hd[4], u[4];
            __m256i is[4];
            UNROLL
            for (int i = 0; i < 4; i++) {
                hd[i] = _mm_loadu_si128((const __m128i *)(x[i] + o));
                u[i] = unpack_header_k4(hd[i]);
                const __m256i scw = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(u[i]));
                is[i] = _mm256_madd_epi16(_mm256_hadd_epi16(h[i][0], h[i][1]), scw);
            }
            /* Mins: each sub-block's bsums (pairs of 16 summed) against the rows' mins, two rows
             * per register: [row 0 | row 1] and [row 2 | row 3], four partial sums per row. */
            const __m256i bsv = _mm256_madd_epi16(load256(y[b].bsums), _mm256_set1_epi16(1));
            const __m128i bs8 = _mm_packs_epi32(_mm256_castsi256_si128(bsv), _mm256_extracti128_si256(bsv, 1));
            const __m256i bs2 = _mm256_broadcastsi128_si256(bs8);
            const __m256i mn01 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(u[0], u[1]));
            const __m256i mn23 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(u[2], u[3]));
            /* d and dmin of the four rows: [d0 dm0 d1 dm1 d2 dm2 d3 dm3] times the token's scale. */
            const __m128i dd = _mm_unpacklo_epi64(_mm_unpacklo_epi32(hd[0], hd[1]), _mm_unpacklo_epi32(hd[2], hd[3]));
            const __m256 dv = _mm256_mul_ps(_mm256_cvtph_ps(dd), _mm256_set1_ps(y[b].d));
            const __m256 d = _mm256_permutevar8x32_ps(dv, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
            const __m256 dm01 = _mm256_permutevar8x32_ps(dv, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
            const __m256 dm23 = _mm256_permutevar8x32_ps(dv, _mm256_setr_epi32(5, 5, 5, 5, 7, 7, 7, 7));
            accq = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold_i32(is[0], is[1], is[2], is[3])), d, accq);
            accm01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mn01, bs2)), dm01, accm01);
            accm23 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mn23, bs2)), dm23, accm23);
        }
        float q[4], m[16], v[4];
        _mm_storeu_ps(q, quad_sum(accq));
        _mm256_storeu_ps(m, accm01);
        _mm256_storeu_ps(m + 8, accm23);
        for (int i = 0; i < 4; i++)
            v[i] = q[i] - ((m[4 * i] + m[4 * i + 1]) + (m[4 * i + 2] + m[4 * i + 3]));
        for (int i = 0; i < 4 && r + i < nr; i++)
            out[r + i] = v[i];
    }
}

/* The sums of tokens 2p and 2p + 1 against rows 0..3 of a group, from pair accumulators
 * is[row] = [t0 t0 t1 t1] per 128-bit half (each half holding that half's elements, as in the
 * one-token fold): into quads [r0 r1 r2 r3] per half for token 2p (*t0) and 2p + 1 (*t1). */
AVX2 static inline void unpair(const __m256i is[4], __m256i *t0, __m256i *t1)
{
    const __m256 a = _mm256_castsi256_ps(_mm256_hadd_epi32(is[0], is[1])); /* r0t0 r0t1 r1t0 r1t1 */
    const __m256 b = _mm256_castsi256_ps(_mm256_hadd_epi32(is[2], is[3]));
    *t0 = _mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)));
    *t1 = _mm256_castps_si256(_mm256_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* m (2..4) tokens against rows in groups of four as in q4_K_rows, with the same prefetch: per
 * super-block each row's nibbles are unpacked once and used for every token, so the rows stream
 * from memory once for the batch. Tokens go in pairs, the pair's maddubs results added by one
 * horizontal add (int16 lanes of at most 2 * 3810) before the multiplication by the sub-block's
 * scale, as in q4_K_tok4; an odd last token alone. The integer sums per 128-bit half are exact
 * whatever their order; the float work per token is q4_K_rows' step for step, so each token gets
 * the floats it gets alone. */
AVX2 SPECIALIZE static inline void q4_K_rows_m(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int m)
{
    const struct kiri_block_q8_K *y[4];
    for (int t = 0; t < 4; t++)
        y[t] = (const struct kiri_block_q8_K *)((const char *)a + (size_t)(t < m ? t : m - 1) * as);
    const int np = m / 2, odd = m % 2;
    const int64_t nb = k / KIRI_QK_K;
    const size_t bs = sizeof(struct kiri_block_q4_K);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t r = 0; r < nr; r += 4) {
        const char *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = tile_row(w, ws, r + i, nr);
        const char *nx[4];
        const char *const *pf = next_rows(w, ws, r + 4, 4, nr, nx); /* two groups ahead */
        __m256 accq[4], accm01[4], accm23[4];
        _Pragma("GCC unroll 4")
        for (int t = 0; t < m; t++)
            accq[t] = accm01[t] = accm23[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const size_t o = (size_t)b * bs;
            prefetch_rows(pf, 4, o, bs);
            __m128i hd[4], u[4];
            __m256i isp[2][4], iss[4]; /* [pair][row] and the odd token's [row] */
            UNROLL
            for (int i = 0; i < 4; i++) {
                hd[i] = _mm_loadu_si128((const __m128i *)(x[i] + o));
                u[i] = unpack_header_k4(hd[i]);
                const __m256i scw = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(u[i])); /* [sc0 .. sc7] */
                __m256i ap[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, as1 = _mm256_setzero_si256();
                UNROLL
                for (int j = 0; j < 4; j++) {
                    const __m256i q = load256(x[i] + o + offsetof(struct kiri_block_q4_K, qs) + 32 * j);
                    const __m256i lo = _mm256_and_si256(q, m4);
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
                    const __m256i sl = _mm256_shuffle_epi8(scw, _mm256_set1_epi16((short)(0x0404 * j + 0x0100)));
                    const __m256i sh = _mm256_shuffle_epi8(scw, _mm256_set1_epi16((short)(0x0404 * j + 0x0302)));
                    _Pragma("GCC unroll 2")
                    for (int p = 0; p < np; p++) {
                        const int8_t *a0 = y[2 * p][b].qs + 64 * j, *a1 = y[2 * p + 1][b].qs + 64 * j;
                        const __m256i pl = _mm256_hadd_epi16(_mm256_maddubs_epi16(lo, load256(a0)),
                                                             _mm256_maddubs_epi16(lo, load256(a1)));
                        const __m256i ph = _mm256_hadd_epi16(_mm256_maddubs_epi16(hi, load256(a0 + 32)),
                                                             _mm256_maddubs_epi16(hi, load256(a1 + 32)));
                        ap[p] = _mm256_add_epi32(ap[p], _mm256_add_epi32(_mm256_madd_epi16(pl, sl),
                                                                         _mm256_madd_epi16(ph, sh)));
                    }
                    if (odd) {
                        const int8_t *a2 = y[m - 1][b].qs + 64 * j;
                        const __m256i pl = _mm256_maddubs_epi16(lo, load256(a2));
                        const __m256i ph = _mm256_maddubs_epi16(hi, load256(a2 + 32));
                        as1 = _mm256_add_epi32(as1, _mm256_add_epi32(_mm256_madd_epi16(pl, sl),
                                                                     _mm256_madd_epi16(ph, sh)));
                    }
                }
                _Pragma("GCC unroll 2")
                for (int p = 0; p < np; p++)
                    isp[p][i] = ap[p];
                iss[i] = as1;
            }
            __m256i is[4]; /* per token: [r0 r1 r2 r3] per half, fold_i32 of q4_K_rows' is */
            _Pragma("GCC unroll 2")
            for (int p = 0; p < np; p++)
                unpair(isp[p], &is[2 * p], &is[2 * p + 1]);
            if (odd)
                is[m - 1] = fold_i32(iss[0], iss[1], iss[2], iss[3]);
            const __m256i mn01 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(u[0], u[1]));
            const __m256i mn23 = _mm256_cvtepu8_epi16(_mm_unpackhi_epi64(u[2], u[3]));
            const __m128i dd = _mm_unpacklo_epi64(_mm_unpacklo_epi32(hd[0], hd[1]), _mm_unpacklo_epi32(hd[2], hd[3]));
            const __m256 dx = _mm256_cvtph_ps(dd);
            _Pragma("GCC unroll 4")
            for (int t = 0; t < m; t++) {
                const __m256i bsv = _mm256_madd_epi16(load256(y[t][b].bsums), _mm256_set1_epi16(1));
                const __m128i bs8 = _mm_packs_epi32(_mm256_castsi256_si128(bsv), _mm256_extracti128_si256(bsv, 1));
                const __m256i bs2 = _mm256_broadcastsi128_si256(bs8);
                const __m256 dv = _mm256_mul_ps(dx, _mm256_set1_ps(y[t][b].d));
                const __m256 d = _mm256_permutevar8x32_ps(dv, _mm256_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6));
                const __m256 dm01 = _mm256_permutevar8x32_ps(dv, _mm256_setr_epi32(1, 1, 1, 1, 3, 3, 3, 3));
                const __m256 dm23 = _mm256_permutevar8x32_ps(dv, _mm256_setr_epi32(5, 5, 5, 5, 7, 7, 7, 7));
                accq[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[t]), d, accq[t]);
                accm01[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mn01, bs2)), dm01, accm01[t]);
                accm23[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mn23, bs2)), dm23, accm23[t]);
            }
        }
        _Pragma("GCC unroll 4")
        for (int t = 0; t < m; t++) {
            float q[4], mm[16];
            _mm_storeu_ps(q, quad_sum(accq[t]));
            _mm256_storeu_ps(mm, accm01[t]);
            _mm256_storeu_ps(mm + 8, accm23[t]);
            for (int i = 0; i < 4 && r + i < nr; i++)
                dst[(size_t)t * ds + (size_t)(r + i)] =
                    q[i] - ((mm[4 * i] + mm[4 * i + 1]) + (mm[4 * i + 2] + mm[4 * i + 3]));
        }
    }
}

GEMM_DRIVER_SMALL(gemm_q4_K_small, q4_K_tok4, q4_K_rows, q4_K_rows_m)
GEMM_OCTETS(gemm_q4_K_avx2, kiri_cpu_gemm_octets_q4_K_avx2, gemm_q4_K_small)

/* ---------------------------------------------------------------------------------------------
 * Q5_K weights, Q8_K activations: Q4_K with a fifth bit per quant (x = d sc q - dmin m per
 * sub-block of 32, q in 0..31; chunk j of 64 values takes bits 2j and 2j + 1 of the 32 qh bytes).
 * A pair sum reaches 2 * 31 * 127 = 7874, so where Q4_K folds three rounds in int16 this folds
 * two (31496) and applies the scales then. Whole token octets go to gemm_octet_avx2.c.
 * ------------------------------------------------------------------------------------------- */

AVX2 static void q5_K_tok4(int64_t k, const void *w, size_t ws, const void *const ap[4],
                           float *const out[4], int n_tok, int64_t nr)
{
    k4_tok4(1, k, w, ws, ap, out, n_tok, nr);
}

/* m (1..4) tokens against rows in quads, the group after next prefetched (as q6_K_rows): per
 * super-block each row's quants are unpacked once and used for every token, the integer sums
 * kept per (token, row) as 8 int32 lanes and folded across the rows afterwards, so the float work
 * per token is the same whatever m is (m == 1: the one-token path). */
AVX2 SPECIALIZE static inline void q5_K_rows_m(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int m)
{
    const struct kiri_block_q8_K *y[4];
    for (int t = 0; t < 4; t++)
        y[t] = (const struct kiri_block_q8_K *)((const char *)a + (size_t)(t < m ? t : m - 1) * as);
    const int64_t nb = k / KIRI_QK_K;
    for (int64_t r = 0; r < nr; r += 4) {
        const struct kiri_block_q5_K *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = (const struct kiri_block_q5_K *)tile_row(w, ws, r + i, nr);
        const char *nx[4];
        const char *const *pf = next_rows(w, ws, r + 4, 4, nr, nx); /* two groups ahead */
        __m256 acc[4];
        _Pragma("GCC unroll 4")
        for (int t = 0; t < m; t++)
            acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            prefetch_rows(pf, 4, (size_t)b * sizeof *x[0], sizeof *x[0]);
            __m256i is[4][4], im[4][4]; /* [token][row] */
            UNROLL
            for (int i = 0; i < 4; i++) {
                uint16_t sc[8];
                const __m256i m16 = scales_k4(x[i][b].scales, sc);
                __m256i ai[4];
                _Pragma("GCC unroll 4")
                for (int t = 0; t < m; t++)
                    ai[t] = _mm256_setzero_si256();
                __m256i hb = load256(x[i][b].qh);
                UNROLL
                for (int j = 0; j < 4; j++, hb = _mm256_srli_epi16(hb, 2)) {
                    __m256i lo, hi;
                    q5_K_unpack(x[i][b].qs, j, hb, &lo, &hi);
                    const __m256i sl = _mm256_set1_epi16((short)sc[2 * j]), sh = _mm256_set1_epi16((short)sc[2 * j + 1]);
                    _Pragma("GCC unroll 4")
                    for (int t = 0; t < m; t++) {
                        const int8_t *aq = y[t][b].qs + 64 * j;
                        ai[t] = _mm256_add_epi32(ai[t], _mm256_madd_epi16(_mm256_maddubs_epi16(lo, load256(aq)), sl));
                        ai[t] = _mm256_add_epi32(ai[t], _mm256_madd_epi16(_mm256_maddubs_epi16(hi, load256(aq + 32)), sh));
                    }
                }
                _Pragma("GCC unroll 4")
                for (int t = 0; t < m; t++) {
                    is[t][i] = ai[t];
                    im[t][i] = _mm256_madd_epi16(load256(y[t][b].bsums), m16);
                }
            }
            const __m256 dx = quad_f16(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
            const __m256 dmx = quad_f16(x[0][b].dmin, x[1][b].dmin, x[2][b].dmin, x[3][b].dmin);
            _Pragma("GCC unroll 4")
            for (int t = 0; t < m; t++) {
                const __m256 dy = _mm256_set1_ps(y[t][b].d);
                const __m256i s = fold_i32(is[t][0], is[t][1], is[t][2], is[t][3]);
                const __m256i mn = fold_i32(im[t][0], im[t][1], im[t][2], im[t][3]);
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(dx, dy), acc[t]);
                acc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mn), _mm256_mul_ps(dmx, dy), acc[t]);
            }
        }
        _Pragma("GCC unroll 4")
        for (int t = 0; t < m; t++)
            put_rows(acc[t], dst + (size_t)t * ds + r, nr - r);
    }
}

AVX2 ONE_TOKEN static void q5_K_rows(int64_t k, const void *w, size_t ws, const void *a, float *out, int64_t nr)
{
    q5_K_rows_m(k, w, ws, a, 0, out, 0, nr, 1);
}

GEMM_DRIVER_SMALL(gemm_q5_K_small, q5_K_tok4, q5_K_rows, q5_K_rows_m)
GEMM_OCTETS(gemm_q5_K_avx2, kiri_cpu_gemm_octets_q5_K_avx2, gemm_q5_K_small)

/* ---------------------------------------------------------------------------------------------
 * Q6_K weights, Q8_K activations: x = d sc_g (q - 32) per group of 16, q in 0..63, so
 * sum x a = d_a d (sum_g sc_g sum(q a) - 32 sum_g sc_g bsums_g). A run of 32 values spans two
 * groups: the low 128-bit half holds group g, the high half g + 1, and a byte shuffle spreads
 * scale g over the low half and g + 1 over the high half.
 * ------------------------------------------------------------------------------------------- */

/* Shuffles picking int16 scale 2k (low half) and 2k + 1 (high half) of 8 scales broadcast to both
 * halves. */
static const uint64_t q6_pick_idx[4][4] = {
    {0x0100010001000100ull, 0x0100010001000100ull, 0x0302030203020302ull, 0x0302030203020302ull},
    {0x0504050405040504ull, 0x0504050405040504ull, 0x0706070607060706ull, 0x0706070607060706ull},
    {0x0908090809080908ull, 0x0908090809080908ull, 0x0b0a0b0a0b0a0b0aull, 0x0b0a0b0a0b0a0b0aull},
    {0x0d0c0d0c0d0c0d0cull, 0x0d0c0d0c0d0c0d0cull, 0x0f0e0f0e0f0e0f0eull, 0x0f0e0f0e0f0e0f0eull},
};

AVX2 static inline __m256i q6_pick(__m256i scb, int kk)
{
    return _mm256_shuffle_epi8(scb, load256(q6_pick_idx[kk]));
}

/* The four runs of 32 quants (0..63) of half h of a Q6_K block, in element order. */
AVX2 static inline void q6_unpack(const struct kiri_block_q6_K *x, int h, __m256i q[4])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(0x03);
    const __m256i l0 = load256(x->ql + 64 * h), l1 = load256(x->ql + 64 * h + 32);
    const __m256i hb = load256(x->qh + 32 * h);
    q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                           _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
}

/* The 8 scales of half h as int16, broadcast to both 128-bit halves. */
AVX2 static inline __m256i q6_scales(const struct kiri_block_q6_K *x, int h)
{
    const __m128i s = _mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(x->scales + 8 * h)));
    return _mm256_broadcastsi128_si256(s);
}

AVX2 static inline __m256i q6_scales16(const struct kiri_block_q6_K *x)
{
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x->scales));
}

AVX2 static void q6_K_tok4(int64_t k, const void *w, size_t ws, const void *const ap[4],
                           float *const out[4], int n_tok, int64_t nr)
{
    const struct kiri_block_q8_K *y0 = ap[0], *y1 = ap[1], *y2 = ap[2], *y3 = ap[3];
    const int64_t nb = k / KIRI_QK_K;
    for (int64_t r = 0; r < nr; r++) {
        const struct kiri_block_q6_K *x = (const struct kiri_block_q6_K *)((const char *)w + (size_t)r * ws);
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            __m256i i01 = _mm256_setzero_si256(), i23 = _mm256_setzero_si256();
            UNROLL
            for (int h = 0; h < 2; h++) {
                __m256i q[4];
                q6_unpack(&x[b], h, q);
                const __m256i scb = q6_scales(&x[b], h);
                UNROLL
                for (int kk = 0; kk < 4; kk++) {
                    const int o = 128 * h + 32 * kk;
                    const __m256i sck = q6_pick(scb, kk);
                    const __m256i p0 = _mm256_maddubs_epi16(q[kk], load256(y0[b].qs + o));
                    const __m256i p1 = _mm256_maddubs_epi16(q[kk], load256(y1[b].qs + o));
                    const __m256i p2 = _mm256_maddubs_epi16(q[kk], load256(y2[b].qs + o));
                    const __m256i p3 = _mm256_maddubs_epi16(q[kk], load256(y3[b].qs + o));
                    i01 = _mm256_add_epi32(i01, _mm256_madd_epi16(_mm256_hadd_epi16(p0, p1), sck));
                    i23 = _mm256_add_epi32(i23, _mm256_madd_epi16(_mm256_hadd_epi16(p2, p3), sck));
                }
            }
            const __m256i sc16 = q6_scales16(&x[b]);
            const __m256i bias = fold_i32(_mm256_madd_epi16(load256(y0[b].bsums), sc16),
                                          _mm256_madd_epi16(load256(y1[b].bsums), sc16),
                                          _mm256_madd_epi16(load256(y2[b].bsums), sc16),
                                          _mm256_madd_epi16(load256(y3[b].bsums), sc16));
            const __m256i s = _mm256_sub_epi32(_mm256_hadd_epi32(i01, i23), _mm256_slli_epi32(bias, 5));
            const __m256 dy = quad_f32(y0[b].d, y1[b].d, y2[b].d, y3[b].d);
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(bcast_f16(x[b].d), dy), acc);
        }
        put_tokens(acc, out, n_tok, r, 1);
    }
}

/* One Q6_K block of one row against one activation block: the integer sum with the -32 offset
 * applied, as 8 int32 lanes for a later fold across rows. */
AVX2 static inline __m256i q6_K_row(const struct kiri_block_q6_K *x, const struct kiri_block_q8_K *y)
{
    __m256i s = _mm256_setzero_si256();
    UNROLL
    for (int h = 0; h < 2; h++) {
        __m256i q[4];
        q6_unpack(x, h, q);
        const __m256i scb = q6_scales(x, h);
        UNROLL
        for (int kk = 0; kk < 4; kk++) {
            const __m256i p = _mm256_maddubs_epi16(q[kk], load256(y->qs + 128 * h + 32 * kk));
            s = _mm256_add_epi32(s, _mm256_madd_epi16(p, q6_pick(scb, kk)));
        }
    }
    const __m256i bias = _mm256_madd_epi16(load256(y->bsums), q6_scales16(x));
    return _mm256_sub_epi32(s, _mm256_slli_epi32(bias, 5));
}

AVX2 ONE_TOKEN static void q6_K_rows(int64_t k, const void *w, size_t ws, const void *a, float *out, int64_t nr)
{
    const struct kiri_block_q8_K *y = a;
    const int64_t nb = k / KIRI_QK_K;
    for (int64_t r = 0; r < nr; r += 4) {
        const struct kiri_block_q6_K *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = (const struct kiri_block_q6_K *)tile_row(w, ws, r + i, nr);
        const char *nx[4];
        const char *const *pf = next_rows(w, ws, r + 4, 4, nr, nx); /* two groups ahead */
        __m256 acc = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            prefetch_rows(pf, 4, (size_t)b * sizeof *x[0], sizeof *x[0]);
            const __m256i s = fold_i32(q6_K_row(&x[0][b], &y[b]), q6_K_row(&x[1][b], &y[b]),
                                       q6_K_row(&x[2][b], &y[b]), q6_K_row(&x[3][b], &y[b]));
            const __m256 d = _mm256_mul_ps(quad_f16(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d),
                                           _mm256_set1_ps(y[b].d));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), d, acc);
        }
        put_rows(acc, out + r, nr - r);
    }
}

/* m (2..4) tokens against rows in quads as in q6_K_rows, with the same prefetch: per super-block
 * each row's quants are unpacked once and used for every token (four tokens: see below). Tokens
 * go in pairs as in q4_K_rows_m (a pair's pair sums, at most 2 * 16002, added in int16 as in
 * q6_K_tok4), an odd last token alone. The integer sums per 128-bit half are exact whatever their
 * order; the float work per token is q6_K_rows' step for step. */
AVX2 SPECIALIZE static inline void q6_K_rows_m(int64_t k, const void *w, size_t ws, const void *a, size_t as,
                                               float *dst, size_t ds, int64_t nr, int m)
{
    const struct kiri_block_q8_K *y[4];
    for (int t = 0; t < 4; t++)
        y[t] = (const struct kiri_block_q8_K *)((const char *)a + (size_t)(t < m ? t : m - 1) * as);
    /* Four tokens: q6_K_tok4, one row at a time with the tokens in the lanes, is faster and gives
     * the same floats: per token and 128-bit half the same integer sum, the same products d * d_a
     * and the same order of additions, in a token's lane rather than a row's. */
    if (m == 4) {
        const void *ap[4] = {y[0], y[1], y[2], y[3]};
        float *op[4] = {dst, dst + ds, dst + 2 * ds, dst + 3 * ds};
        q6_K_tok4(k, w, ws, ap, op, 4, nr);
        return;
    }
    const int np = m / 2, odd = m % 2;
    const int64_t nb = k / KIRI_QK_K;
    for (int64_t r = 0; r < nr; r += 4) {
        const struct kiri_block_q6_K *x[4];
        UNROLL
        for (int i = 0; i < 4; i++)
            x[i] = (const struct kiri_block_q6_K *)tile_row(w, ws, r + i, nr);
        const char *nx[4];
        const char *const *pf = next_rows(w, ws, r + 4, 4, nr, nx); /* two groups ahead */
        __m256 acc[4];
        _Pragma("GCC unroll 4")
        for (int t = 0; t < m; t++)
            acc[t] = _mm256_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            prefetch_rows(pf, 4, (size_t)b * sizeof *x[0], sizeof *x[0]);
            __m256i isp[2][4], iss[4]; /* [pair][row] and the odd token's [row] */
            UNROLL
            for (int i = 0; i < 4; i++) {
                __m256i ap[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()}, as1 = _mm256_setzero_si256();
                UNROLL
                for (int h = 0; h < 2; h++) {
                    __m256i q[4];
                    q6_unpack(&x[i][b], h, q);
                    const __m256i scb = q6_scales(&x[i][b], h);
                    UNROLL
                    for (int kk = 0; kk < 4; kk++) {
                        const __m256i sck = q6_pick(scb, kk);
                        const int o = 128 * h + 32 * kk;
                        _Pragma("GCC unroll 2")
                        for (int p = 0; p < np; p++) {
                            const __m256i p0 = _mm256_maddubs_epi16(q[kk], load256(y[2 * p][b].qs + o));
                            const __m256i p1 = _mm256_maddubs_epi16(q[kk], load256(y[2 * p + 1][b].qs + o));
                            ap[p] = _mm256_add_epi32(ap[p], _mm256_madd_epi16(_mm256_hadd_epi16(p0, p1), sck));
                        }
                        if (odd) {
                            const __m256i p2 = _mm256_maddubs_epi16(q[kk], load256(y[m - 1][b].qs + o));
                            as1 = _mm256_add_epi32(as1, _mm256_madd_epi16(p2, sck));
                        }
                    }
                }
                /* The -32 offset: bsums against the scales, in the halves q6_K_row has them. */
                const __m256i sc16 = q6_scales16(&x[i][b]);
                _Pragma("GCC unroll 2")
                for (int p = 0; p < np; p++) {
                    const __m256i bias = _mm256_hadd_epi32(_mm256_madd_epi16(load256(y[2 * p][b].bsums), sc16),
                                                           _mm256_madd_epi16(load256(y[2 * p + 1][b].bsums), sc16));
                    isp[p][i] = _mm256_sub_epi32(ap[p], _mm256_slli_epi32(bias, 5));
                }
                if (odd) {
                    const __m256i bias = _mm256_madd_epi16(load256(y[m - 1][b].bsums), sc16);
                    iss[i] = _mm256_sub_epi32(as1, _mm256_slli_epi32(bias, 5));
                }
            }
            __m256i s[4]; /* per token: [r0 r1 r2 r3] per half, q6_K_rows' fold */
            _Pragma("GCC unroll 2")
            for (int p = 0; p < np; p++)
                unpair(isp[p], &s[2 * p], &s[2 * p + 1]);
            if (odd)
                s[m - 1] = fold_i32(iss[0], iss[1], iss[2], iss[3]);
            const __m256 dx = quad_f16(x[0][b].d, x[1][b].d, x[2][b].d, x[3][b].d);
            _Pragma("GCC unroll 4")
            for (int t = 0; t < m; t++) {
                const __m256 d = _mm256_mul_ps(dx, _mm256_set1_ps(y[t][b].d));
                acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), d, acc[t]);
            }
        }
        _Pragma("GCC unroll 4")
        for (int t = 0; t < m; t++)
            put_rows(acc[t], dst + (size_t)t * ds + r, nr - r);
    }
}

GEMM_DRIVER_SMALL(gemm_q6_K_small, q6_K_tok4, q6_K_rows, q6_K_rows_m)
GEMM_OCTETS(gemm_q6_K_avx2, kiri_cpu_gemm_octets_q6_K_avx2, gemm_q6_K_small)

/* ---------------------------------------------------------------------------------------------
 * F32 and F16: plain FMA tiles of 4 rows x 2 tokens (8 accumulators), values widened on load;
 * a scalar tail when k is not a multiple of 8.
 * ------------------------------------------------------------------------------------------- */

AVX2 static inline __m256 ld8_f32(const void *p, int64_t i) { return _mm256_loadu_ps((const float *)p + i); }
static inline float ld1_f32(const void *p, int64_t i) { return ((const float *)p)[i]; }

AVX2 static inline __m256 ld8_f16(const void *p, int64_t i)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const kiri_f16 *)p + i)));
}

AVX2 static inline float ld1_f16(const void *p, int64_t i) { return _cvtsh_ss(((const kiri_f16 *)p)[i]); }

#define GEMM_FLOAT(name, LD8, LD1)                                                               \
    AVX2 static void name(int64_t k, const void *w, size_t ws, const void *a, size_t as,         \
                          float *dst, size_t ds, int64_t nr, int64_t nt)                        \
    {                                                                                            \
        for (int64_t t = 0; t < nt; t += 2) {                                                    \
            const int n_tok = (int)min64(nt - t, 2);                                             \
            const void *y[2] = {tile_row(a, as, t, nt), tile_row(a, as, t + 1, nt)};             \
            for (int64_t r = 0; r < nr; r += 4) {                                                \
                const void *x[4];                                                                \
                UNROLL                                                                           \
                for (int i = 0; i < 4; i++)                                                      \
                    x[i] = tile_row(w, ws, r + i, nr);                                           \
                __m256 acc[4][2];                                                                \
                UNROLL                                                                           \
                for (int i = 0; i < 4; i++)                                                      \
                    acc[i][0] = acc[i][1] = _mm256_setzero_ps();                                 \
                int64_t e = 0;                                                                   \
                if (n_tok == 2) {                                                                \
                    for (; e + 8 <= k; e += 8) {                                                 \
                        const __m256 y0 = LD8(y[0], e), y1 = LD8(y[1], e);                       \
                        UNROLL                                                                   \
                        for (int i = 0; i < 4; i++) {                                            \
                            const __m256 xv = LD8(x[i], e);                                      \
                            acc[i][0] = _mm256_fmadd_ps(xv, y0, acc[i][0]);                      \
                            acc[i][1] = _mm256_fmadd_ps(xv, y1, acc[i][1]);                      \
                        }                                                                        \
                    }                                                                            \
                } else {                                                                         \
                    for (; e + 8 <= k; e += 8) {                                                 \
                        const __m256 y0 = LD8(y[0], e);                                          \
                        UNROLL                                                                   \
                        for (int i = 0; i < 4; i++)                                              \
                            acc[i][0] = _mm256_fmadd_ps(LD8(x[i], e), y0, acc[i][0]);            \
                    }                                                                            \
                }                                                                                \
                UNROLL                                                                           \
                for (int j = 0; j < n_tok; j++)                                                  \
                    for (int i = 0; i < 4 && r + i < nr; i++) {                                  \
                        float s = hsum_ps(acc[i][j]);                                            \
                        for (int64_t f = e; f < k; f++)                                          \
                            s += LD1(x[i], f) * LD1(y[j], f);                                    \
                        dst[(size_t)(t + j) * ds + (size_t)(r + i)] = s;                         \
                    }                                                                            \
            }                                                                                    \
        }                                                                                        \
    }

GEMM_FLOAT(gemm_f32_avx2, ld8_f32, ld1_f32)
GEMM_FLOAT(gemm_f16_tiles, ld8_f16, ld1_f16)

/* F16 against one token (decode): eight rows side by side, the rows two groups ahead fetched
 * (prefetch_rows) line by line as these are read; four unprefetched rows held one thread to about 11 GB/s, half
 * of llama.cpp's F16 decode on a Zen 4 (SmolLM2-135M F16, 1 thread: 40 -> 81 tok/s, 2 threads:
 * 78 -> 121). Each row's sum is formed in the same order as in gemm_f16_tiles, so a token's floats
 * do not depend on the kernel that computed them. */
AVX2 static void gemm_f16_one(int64_t k, const void *w, size_t ws, const void *a, float *dst, int64_t nr)
{
    const kiri_f16 *y = a;
    for (int64_t r = 0; r < nr; r += 8) {
        const char *x[8], *nx[8];
        UNROLL
        for (int i = 0; i < 8; i++)
            x[i] = tile_row(w, ws, r + i, nr);
        const char *const *next = next_rows(w, ws, r + 8, 8, nr, nx);
        __m256 acc[8];
        UNROLL
        for (int i = 0; i < 8; i++)
            acc[i] = _mm256_setzero_ps();
        int64_t e = 0;
        for (; e + 8 <= k; e += 8) {
            if (e % 32 == 0)
                prefetch_rows(next, 8, (size_t)e * sizeof *y, 64);
            const __m256 y0 = ld8_f16(y, e);
            UNROLL
            for (int i = 0; i < 8; i++)
                acc[i] = _mm256_fmadd_ps(ld8_f16(x[i], e), y0, acc[i]);
        }
        for (int i = 0; i < 8 && r + i < nr; i++) {
            float s = hsum_ps(acc[i]);
            for (int64_t f = e; f < k; f++)
                s += ld1_f16(x[i], f) * ld1_f16(y, f);
            dst[r + i] = s;
        }
    }
}

AVX2 static void gemm_f16_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as, float *dst, size_t ds,
                               int64_t nr, int64_t nt)
{
    if (nt == 1)
        gemm_f16_one(k, w, ws, a, dst, nr);
    else
        gemm_f16_tiles(k, w, ws, a, as, dst, ds, nr, nt);
}

/* The small-batch drivers, which the AVX-512 table keeps for the types whose octets only it has
 * (cpu_kernels.h). */
#define GEMM_SMALL_EXPORT(type)                                                                                \
    AVX2 void kiri_cpu_gemm_small_##type##_avx2(int64_t k, const void *w, size_t ws, const void *a, size_t as, \
                                                float *dst, size_t ds, int64_t nr, int64_t nt)                 \
    {                                                                                                          \
        gemm_##type##_small(k, w, ws, a, as, dst, ds, nr, nt);                                                 \
    }

GEMM_SMALL_EXPORT(q4_1)
GEMM_SMALL_EXPORT(q5_0)
GEMM_SMALL_EXPORT(q5_1)

/* ---------------------------------------------------------------------------------------------
 * Table
 * ------------------------------------------------------------------------------------------- */

int kiri_cpu_is_amd_family_19h(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u) /* "Auth"enticAMD */
        return 0;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    const unsigned base = (a >> 8) & 0xF, ext = (a >> 20) & 0xFF;
    return base == 0xF && base + ext == 0x19;
}

void kiri_cpu_kernels_init_gemm_avx2(struct kiri_cpu_kernels *k)
{
    prefetch_to_l2 = kiri_cpu_is_amd_family_19h();
    k->gemm[KIRI_TYPE_F32] = gemm_f32_avx2;
    k->gemm[KIRI_TYPE_F16] = gemm_f16_avx2;
    k->gemm[KIRI_TYPE_Q4_0] = gemm_q4_0_avx2;
    k->gemm[KIRI_TYPE_Q8_0] = gemm_q8_0_avx2;
    k->gemm[KIRI_TYPE_Q4_1] = gemm_q4_1_avx2;
    k->gemm[KIRI_TYPE_Q5_0] = gemm_q5_0_avx2;
    k->gemm[KIRI_TYPE_Q5_1] = gemm_q5_1_avx2;
    k->gemm[KIRI_TYPE_Q4_K] = gemm_q4_K_avx2;
    k->gemm[KIRI_TYPE_Q5_K] = gemm_q5_K_avx2;
    k->gemm[KIRI_TYPE_Q6_K] = gemm_q6_K_avx2;
    k->gemm_stream[KIRI_TYPE_Q4_0] = 4; /* GEMM_DRIVER_SMALL */
    k->gemm_stream[KIRI_TYPE_Q8_0] = 4;
    k->gemm_stream[KIRI_TYPE_Q4_1] = 4;
    k->gemm_stream[KIRI_TYPE_Q5_0] = 4;
    k->gemm_stream[KIRI_TYPE_Q5_1] = 4;
    k->gemm_stream[KIRI_TYPE_Q4_K] = 4;
    k->gemm_stream[KIRI_TYPE_Q5_K] = 4;
    k->gemm_stream[KIRI_TYPE_Q6_K] = 4;
}

#else
typedef int kiri_gemm_avx2_unused; /* an empty translation unit is not valid ISO C */
#endif
