/* AVX2 prefill tiles on token octets: the products of many tokens (prompt chunks) for Q4_0, Q4_1,
 * Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K weights, read in place from the mapping.
 *
 * The quad kernels of gemm_avx2.c give each vector lane a weight row or a token and reduce a
 * block's 32 products to one lane with horizontal adds; on AVX2 machines without fast horizontal
 * adds (AMD Zen: vphaddw costs about four vpmaddubsw) those adds are most of the time. Here the
 * lanes are tokens from the start, so nothing is reduced across lanes:
 * - a pass packs the activations of eight tokens ("an octet") per 32-value block: vector g holds
 *   the values 4g .. 4g + 3 of each token, token t in bytes 4t .. 4t + 3 (an 8 x 8 transpose of
 *   32-bit words), with the tokens' scales and sums beside them;
 * - each weight row's four quants 4g .. 4g + 3 are broadcast to every lane, and one vpmaddubsw
 *   against vector g leaves, in each token's two int16 lanes, two sums of two products. The
 *   eight groups of a block add up in those int16 lanes (4-bit quants: at most
 *   8 * 2 * 15 * 127 = 30480), one vpmaddwd widens them to one int32 per token, and the float
 *   work of the block (conversion, scales) is one instruction per octet.
 * One row against up to four octets (32 tokens) at a time; the packed octets of a pass
 * (OCT_BLOCKS blocks) stay in L1 while the tile's rows go by, and the float sums of the rows
 * wait in a stack array between passes.
 *
 * What must stay true: the contract of kiri_gemm_fn (the integer sums of every block or
 * sub-block are exact; the float sums run over the blocks in order, as vec_dot's do); activations
 * never hold -128 (the activation quantizers give -127..127).
 *
 * Compiled without -mavx2: each function carries a target attribute, and the entry points may only
 * be called after the CPU and the OS reported KIRI_CPU_AVX2.
 */
#include "cpu_kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#define AVX2 __attribute__((target("avx2,fma,f16c")))
#define UNROLL _Pragma("GCC unroll 8")
/* Inlined per octet count so the accumulators stay in registers. */
#define SPECIALIZE __attribute__((always_inline))
/* Keeps a running sum in its register as written: GCC otherwise regroups the additions of the
 * products into a tree whose partial sums no longer fit in the 16 registers. */
#define KEEP(v) __asm__("" : "+x"(v))

/* Octets per pass (32 tokens), weight rows per pass, and 32-value blocks per pass: the packed
 * octets of a pass take OCT_MAX * OCT_BLOCKS * 320 bytes (20 KiB) and the float sums
 * OCT_ROWS * OCT_MAX * 32 bytes (8 KiB) of stack. */
#define OCT_MAX 4
#define OCT_ROWS 64
#define OCT_BLOCKS 16
#define OCT_SUPER (OCT_BLOCKS / 8) /* Q4_K, Q5_K and Q6_K super-blocks per pass */

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

enum oct_type { OCT_Q4_0, OCT_Q4_1, OCT_Q5_0, OCT_Q5_1, OCT_Q8_0, OCT_Q4_K, OCT_Q5_K, OCT_Q6_K };

/* One 32-value block of eight Q8_0, Q8_1 or Q8_K tokens. */
struct octet {
    __m256i g[8]; /* g[j]: values 4j .. 4j + 3 of token t in bytes 4t .. 4t + 3 */
    union {
        __m256i c; /* Q8_0: -8 sum(a) (Q4_0) or -16 sum(a) (Q5_0) per token in its two int16
                    * lanes (each half of the sum); Q8_K: the same for -32 sum(a) over values
                    * 0 .. 15 (Q6_K's sub-block), or for -16 sum(a) over all 32 (Q5_K) */
        __m256 s;  /* Q8_1: the tokens' s (d sum(a)) */
    };
    union {
        __m256 d;    /* Q8_0: the tokens' scales */
        __m256i c1;  /* Q8_K: -32 sum(a) over values 16 .. 31 */
    };
};

/* The 8 x 8 transpose of 32-bit words: v[t] (token t's word j in lane j) into v[j] (token t's word
 * j in lane t). */
AVX2 static inline void transpose8(__m256i v[8])
{
    __m256i t[8], u[8];
    UNROLL
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
    }
    UNROLL
    for (int i = 0; i < 2; i++) { /* tokens 4i .. 4i + 3: words 0 1 2 3 (lanes 0-3), 4 5 6 7 (4-7) */
        u[4 * i + 0] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
        u[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
        u[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    UNROLL
    for (int j = 0; j < 4; j++) {
        v[j] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x20);
        v[j + 4] = _mm256_permute2x128_si256(u[j], u[4 + j], 0x31);
    }
}

/* Packs the 32 values at qs[t] (eight tokens) into o->g; returns, per token in its two int16
 * lanes, the sums of its values 0 .. 15 (*lo) and 16 .. 31 (*hi), at most 16 * 127 each. */
AVX2 static inline void pack_values(const int8_t *const qs[8], struct octet *o, __m256i *lo, __m256i *hi)
{
    __m256i v[8];
    UNROLL
    for (int t = 0; t < 8; t++)
        v[t] = _mm256_loadu_si256((const __m256i *)qs[t]);
    transpose8(v);
    const __m256i one = _mm256_set1_epi8(1);
    __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    UNROLL
    for (int j = 0; j < 8; j++) {
        o->g[j] = v[j];
        s[j / 4] = _mm256_add_epi16(s[j / 4], _mm256_maddubs_epi16(one, v[j]));
    }
    *lo = s[0];
    *hi = s[1];
}

/* Block j of eight Q8_0 tokens (Q4_0, Q5_0 and Q8_0 weights) or Q8_1 tokens (Q4_1, Q5_1) y[0..7]. */
AVX2 static inline void pack_q8_32(enum oct_type t, const char *const y[8], int64_t j, struct octet *o)
{
    const int q8_1 = t == OCT_Q4_1 || t == OCT_Q5_1;
    const size_t bs = q8_1 ? sizeof(struct kiri_block_q8_1) : sizeof(struct kiri_block_q8_0);
    const size_t qs_at = q8_1 ? offsetof(struct kiri_block_q8_1, qs) : offsetof(struct kiri_block_q8_0, qs);
    const int8_t *qs[8];
    kiri_f16 d[8], sa[8];
    UNROLL
    for (int i = 0; i < 8; i++) {
        const char *yb = y[i] + (size_t)j * bs; /* d first in both types, then Q8_1's s */
        qs[i] = (const int8_t *)(yb + qs_at);
        memcpy(&d[i], yb, sizeof d[i]);
        if (q8_1)
            memcpy(&sa[i], yb + offsetof(struct kiri_block_q8_1, s), sizeof sa[i]);
    }
    __m256i lo, hi;
    pack_values(qs, o, &lo, &hi);
    __m128i h;
    if (t == OCT_Q4_0 || t == OCT_Q5_0) { /* 16 * 16 * 127 = 32512 in magnitude: within int16 */
        const __m256i sum = _mm256_add_epi16(lo, hi);
        o->c = _mm256_sub_epi16(_mm256_setzero_si256(), t == OCT_Q5_0 ? _mm256_slli_epi16(sum, 4)
                                                                      : _mm256_slli_epi16(sum, 3));
    } else if (q8_1) {
        memcpy(&h, sa, sizeof h);
        o->s = _mm256_cvtph_ps(h);
    }
    memcpy(&h, d, sizeof h);
    o->d = _mm256_cvtph_ps(h);
}

/* The eight tokens t0 .. t0 + 7 of a tile of nt, repeating the last past the end. */
static inline void octet_rows(const char *a, size_t as, int64_t t0, int64_t nt, const char *y[8])
{
    for (int i = 0; i < 8; i++)
        y[i] = a + (size_t)min64(t0 + i, nt - 1) * as;
}

/* Writes the float sums of rows r0 .. r0 + rn - 1 against tokens t0 .. t0 + 8 n_oct - 1 (those
 * below nt) from acc[row][octet]. Eight rows at a time are transposed so that each token's eight
 * sums go out in one store: one float at a time, the stores (each to another token's row of dst,
 * a different line) took about a tenth of the time of a Q5_K product. */
AVX2 static inline void store_octets(const __m256 (*acc)[OCT_MAX], int64_t rn, int n_oct, float *dst, size_t ds,
                                     int64_t r0, int64_t t0, int64_t nt)
{
    int64_t r = 0;
    for (; r + 8 <= rn; r += 8)
        for (int g = 0; g < n_oct; g++) {
            __m256i v[8];
            UNROLL
            for (int i = 0; i < 8; i++)
                v[i] = _mm256_castps_si256(acc[r + i][g]);
            transpose8(v); /* v[i]: token t0 + 8 g + i, rows r .. r + 7 */
            for (int i = 0; i < 8 && t0 + 8 * g + i < nt; i++)
                _mm256_storeu_si256((__m256i *)(dst + (size_t)(t0 + 8 * g + i) * ds + (size_t)(r0 + r)), v[i]);
        }
    for (; r < rn; r++)
        for (int g = 0; g < n_oct; g++) {
            float v[8];
            _mm256_storeu_ps(v, acc[r][g]);
            for (int i = 0; i < 8 && t0 + 8 * g + i < nt; i++)
                dst[(size_t)(t0 + 8 * g + i) * ds + (size_t)(r0 + r)] = v[i];
        }
}

/* ---------------------------------------------------------------------------------------------
 * Q4_0: sum (q - 8) a = sum q a - 8 sum a per block; q enters maddubs unsigned, and each token's
 * int16 lanes start at their share of -8 sum a. Whatever the order of the additions, a partial
 * sum is sum (q - 8) a over the products added so far minus 8 sum a over the others, at most
 * 16 * 8 * 127 = 16256 in magnitude: no int16 lane overflows.
 * Q5_0: the same with q in 0..31 and -16 sum a (at most 16 * 16 * 127 = 32512). Assembling a
 * quant from qs and qh in each broadcast would cost more than the products, so each row's blocks
 * are unpacked once per pass into 32 bytes each on the stack and broadcast from there.
 * Q4_1: x = d q + m with q 0..15 unsigned (at most 16 * 15 * 127 = 30480 per lane); the offset's
 * share is m s_a, s_a = d_a sum a from the Q8_1 block. Q5_1: the same with Q5_0's quants, 0..31
 * unsigned, whose int16 lanes widen after every four groups (at most 8 * 31 * 127 = 31496).
 * ------------------------------------------------------------------------------------------- */

/* The 32 quants (0..31) of a Q5_0 or Q5_1 block in value order: the nibbles of qs (values 0..15
 * low, 16..31 high), and bit i of the 4 bytes at qh4 as 0x10 in byte i. */
AVX2 static inline void unpack_q5(const uint8_t *qh4, const uint8_t *qs, uint8_t u[32])
{
    uint32_t qh;
    memcpy(&qh, qh4, sizeof qh); /* little-endian, as x86 is */
    const __m128i b = _mm_loadu_si128((const __m128i *)qs);
    const __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
    const __m256i byte_of_bit = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll,
                                                  0x0101010101010101ll, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i set = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), byte_of_bit), bit);
    const __m256i fifth = _mm256_and_si256(_mm256_cmpeq_epi8(set, bit), _mm256_set1_epi8(0x10));
    _mm256_storeu_si256((__m256i *)u, _mm256_or_si256(q, fifth));
}

/* One Q4_0, Q4_1, Q5_0 or Q5_1 row's blocks 0 .. bn - 1 (x) against n_oct packed octets
 * (o[g * OCT_BLOCKS + b]). */
AVX2 SPECIALIZE static inline void q32_row_octets(enum oct_type t, const void *x, int64_t bn,
                                                  const struct octet *o, int n_oct, __m256 acc[OCT_MAX])
{
    const size_t bs = t == OCT_Q4_0 ? sizeof(struct kiri_block_q4_0)
                    : t == OCT_Q4_1 ? sizeof(struct kiri_block_q4_1)
                    : t == OCT_Q5_0 ? sizeof(struct kiri_block_q5_0)
                                    : sizeof(struct kiri_block_q5_1);
    const int five = t == OCT_Q5_0 || t == OCT_Q5_1, offset = t == OCT_Q4_1 || t == OCT_Q5_1;
    const size_t qs_at = t == OCT_Q4_1 ? offsetof(struct kiri_block_q4_1, qs) : offsetof(struct kiri_block_q4_0, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    _Alignas(32) uint8_t u5[OCT_BLOCKS][32]; /* Q5_0, Q5_1: the quants of the pass */
    for (int64_t b = 0; five && b < bn; b++) {
        if (t == OCT_Q5_0) {
            const struct kiri_block_q5_0 *xb = (const struct kiri_block_q5_0 *)x + b;
            unpack_q5(xb->qh, xb->qs, u5[b]);
        } else {
            const struct kiri_block_q5_1 *xb = (const struct kiri_block_q5_1 *)x + b;
            unpack_q5(xb->qh, xb->qs, u5[b]);
        }
    }
    for (int64_t b = 0; b < bn; b++) {
        const char *xb = (const char *)x + (size_t)b * bs;
        __m256i s[OCT_MAX], si[OCT_MAX];
        _Pragma("GCC unroll 4")
        for (int g = 0; g < n_oct; g++)
            s[g] = offset ? _mm256_setzero_si256() : o[g * OCT_BLOCKS + b].c;
        if (five) {
            UNROLL
            for (int h = 0; h < 8; h++) {
                uint32_t q;
                memcpy(&q, u5[b] + 4 * h, sizeof q);
                const __m256i bw = _mm256_set1_epi32((int)q);
                _Pragma("GCC unroll 4")
                for (int g = 0; g < n_oct; g++) {
                    s[g] = _mm256_add_epi16(s[g], _mm256_maddubs_epi16(bw, o[g * OCT_BLOCKS + b].g[h]));
                    KEEP(s[g]);
                }
                if (t == OCT_Q5_1 && h == 3) {
                    _Pragma("GCC unroll 4")
                    for (int g = 0; g < n_oct; g++) {
                        si[g] = _mm256_madd_epi16(s[g], ones);
                        s[g] = _mm256_setzero_si256();
                    }
                }
            }
        } else {
            UNROLL
            for (int h = 0; h < 4; h++) { /* bytes 4h .. 4h + 3: values 4h .. (low), 16 + 4h .. (high) */
                uint32_t q;
                memcpy(&q, xb + qs_at + 4 * h, sizeof q);
                const __m256i bw = _mm256_set1_epi32((int)q);
                const __m256i lo = _mm256_and_si256(bw, m4);
                const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bw, 4), m4);
                _Pragma("GCC unroll 4")
                for (int g = 0; g < n_oct; g++) {
                    const struct octet *ob = &o[g * OCT_BLOCKS + b];
                    s[g] = _mm256_add_epi16(s[g], _mm256_maddubs_epi16(lo, ob->g[h]));
                    s[g] = _mm256_add_epi16(s[g], _mm256_maddubs_epi16(hi, ob->g[h + 4]));
                    KEEP(s[g]);
                }
            }
        }
        kiri_f16 dh, mh;
        memcpy(&dh, xb, sizeof dh); /* every block type starts with d; Q4_1 and Q5_1 follow it with m */
        memcpy(&mh, xb + sizeof dh, sizeof mh);
        const __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16((short)dh));
        const __m256 mw = _mm256_cvtph_ps(_mm_set1_epi16((short)mh));
        _Pragma("GCC unroll 4")
        for (int g = 0; g < n_oct; g++) {
            const struct octet *ob = &o[g * OCT_BLOCKS + b];
            const __m256i sw = _mm256_madd_epi16(s[g], ones);
            const __m256i sum = t == OCT_Q5_1 ? _mm256_add_epi32(si[g], sw) : sw;
            acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, ob->d), acc[g]);
            if (offset)
                acc[g] = _mm256_fmadd_ps(mw, ob->s, acc[g]);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Q8_0: int8 x int8 through maddubs with |w| and a carrying w's sign (a never holds -128, w may);
 * a pair sum reaches 2 * 128 * 127, so each vpmaddubsw result widens to int32 at once.
 * ------------------------------------------------------------------------------------------- */

/* One Q8_0 row's blocks x[0 .. bn - 1] against n_oct packed octets (as q32_row_octets). */
AVX2 SPECIALIZE static inline void q8_0_row_octets(const struct kiri_block_q8_0 *x, int64_t bn,
                                                   const struct octet *o, int n_oct, __m256 acc[OCT_MAX])
{
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t b = 0; b < bn; b++) {
        __m256i s[OCT_MAX];
        _Pragma("GCC unroll 4")
        for (int g = 0; g < n_oct; g++)
            s[g] = _mm256_setzero_si256();
        UNROLL
        for (int h = 0; h < 8; h++) {
            int32_t q;
            memcpy(&q, x[b].qs + 4 * h, sizeof q);
            const __m256i bw = _mm256_set1_epi32(q);
            const __m256i aw = _mm256_abs_epi8(bw);
            _Pragma("GCC unroll 4")
            for (int g = 0; g < n_oct; g++) {
                const __m256i p = _mm256_maddubs_epi16(aw, _mm256_sign_epi8(o[g * OCT_BLOCKS + b].g[h], bw));
                s[g] = _mm256_add_epi32(s[g], _mm256_madd_epi16(p, ones));
                KEEP(s[g]);
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16((short)x[b].d));
        _Pragma("GCC unroll 4")
        for (int g = 0; g < n_oct; g++)
            acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[g]), _mm256_mul_ps(dw, o[g * OCT_BLOCKS + b].d), acc[g]);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Q4_K: x = d sc_j q - dmin m_j over sub-block j (32 values), so per super-block
 * sum x a = d_a (d sum_j sc_j sum(q a) - dmin sum_j m_j sum(a over j)). A sub-block's products
 * add up in int16 lanes as Q4_0's do (at most 30480), one vpmaddwd with sc_j widens them; the
 * mins take one vpmaddwd per two sub-blocks against the tokens' sums packed in int16 pairs.
 *
 * Q5_K: the same with a fifth bit per quant (q 0..31, bit j of qh[l] for value l of sub-block j).
 * Sixteen unsigned 5-bit products would reach 16 * 31 * 127 = 62992 in a lane, so q enters
 * maddubs unsigned with the lanes starting at their share of -16 sum a, as Q4_0's: a partial sum
 * is sum (q - 16) a over the products added so far minus 16 sum a over the others, at most
 * 16 * 16 * 127 = 32512 in magnitude. The widened sums are then sum_j sc_j sum((q - 16) a), and
 * 16 sum_j sc_j sum(a over j) (one vpmaddwd per two sub-blocks, as the mins) restores
 * sum_j sc_j sum(q a) exactly in int32 (at most 8 * 63 * 32 * 31 * 127). Assembling a 5-bit
 * quant from qs and qh in each broadcast would cost more than the products, so each row's
 * super-block is unpacked once per pass into 256 bytes on the stack and broadcast from there; the
 * next row's are unpacked before a row's products, so their stores are done (and the bytes loaded)
 * long before they are read.
 * ------------------------------------------------------------------------------------------- */

/* The token side of one super-block of an octet, beside its eight sub-blocks' struct octet. */
struct octet_k {
    __m256 d;        /* the tokens' scales */
    __m256i sums[4]; /* sums[p]: per token, [sum over sub-block 2p | sum over 2p + 1] as int16 */
};

/* Super-block j of eight Q8_K tokens y[0..7]: sub-blocks into o[0..7], the rest into ok. five:
 * o[].c is Q5_K's -16 sum(a) over all 32 values instead of Q6_K's two halves. */
AVX2 static inline void pack_q8_K(const struct kiri_block_q8_K *const y[8], int64_t j, int five, struct octet *o,
                                  struct octet_k *ok)
{
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i sum[8];
    for (int sb = 0; sb < 8; sb++) {
        const int8_t *qs[8];
        UNROLL
        for (int t = 0; t < 8; t++)
            qs[t] = y[t][j].qs + 32 * sb;
        __m256i lo, hi;
        pack_values(qs, &o[sb], &lo, &hi);
        /* 32 * 16 * 127 = 32512 in magnitude, as is 16 * 2 * 16 * 127; |sum| over 32 values at
         * most 4064: within int16. */
        if (five) {
            o[sb].c = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(_mm256_add_epi16(lo, hi), 4));
        } else {
            o[sb].c = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(lo, 5));
            o[sb].c1 = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(hi, 5));
        }
        sum[sb] = _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones);
    }
    for (int p = 0; p < 4; p++)
        ok->sums[p] = _mm256_blend_epi16(sum[2 * p], _mm256_slli_epi32(sum[2 * p + 1], 16), 0xAA);
    ok->d = _mm256_setr_ps(y[0][j].d, y[1][j].d, y[2][j].d, y[3][j].d, y[4][j].d, y[5][j].d, y[6][j].d,
                           y[7][j].d);
}

/* The 6-bit scales and mins of a Q4_K or Q5_K block (quants.c, get_scale_min_k4). */
static inline void scales_mins_k4(const uint8_t *q, int sc[8], int m[8])
{
    for (int j = 0; j < 4; j++) {
        sc[j] = q[j] & 63;
        m[j] = q[j + 4] & 63;
        sc[j + 4] = (q[j + 8] & 0xF) | ((q[j] >> 6) << 4);
        m[j + 4] = (q[j + 8] >> 4) | ((q[j + 4] >> 6) << 4);
    }
}

_Static_assert(offsetof(struct kiri_block_q5_K, scales) == offsetof(struct kiri_block_q4_K, scales) &&
                   offsetof(struct kiri_block_q5_K, dmin) == offsetof(struct kiri_block_q4_K, dmin) &&
                   offsetof(struct kiri_block_q5_K, d) == offsetof(struct kiri_block_q4_K, d),
               "Q4_K and Q5_K share their header");

/* sum_p sums[p] . (v[2p], v[2p + 1]) per token, int32: the mins' (and Q5_K's offset's) terms. */
AVX2 static inline __m256i pair_sums(const struct octet_k *k, const int v[8])
{
    __m256i s = _mm256_madd_epi16(k->sums[0], _mm256_set1_epi32(v[0] | v[1] << 16));
    s = _mm256_add_epi32(s, _mm256_madd_epi16(k->sums[1], _mm256_set1_epi32(v[2] | v[3] << 16)));
    s = _mm256_add_epi32(s, _mm256_madd_epi16(k->sums[2], _mm256_set1_epi32(v[4] | v[5] << 16)));
    return _mm256_add_epi32(s, _mm256_madd_epi16(k->sums[3], _mm256_set1_epi32(v[6] | v[7] << 16)));
}

/* The 256 quants (0..31) of a Q5_K block in value order. */
AVX2 static inline void unpack_q5_K(const void *x, uint8_t u[KIRI_QK_K])
{
    const struct kiri_block_q5_K *b = x;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m5 = _mm256_set1_epi8(0x10);
    const __m256i hb = _mm256_loadu_si256((const __m256i *)b->qh);
    UNROLL
    for (int j = 0; j < 4; j++) { /* bits 2j and 2j + 1 of qh: values 64 j .. and 64 j + 32 .. */
        const __m256i q = _mm256_loadu_si256((const __m256i *)(b->qs + 32 * j));
        const __m256i h = _mm256_srli_epi16(hb, 2 * j);
        const __m256i lo = _mm256_or_si256(_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_slli_epi16(h, 4), m5));
        const __m256i hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4),
                                           _mm256_and_si256(_mm256_slli_epi16(h, 3), m5));
        _mm256_storeu_si256((__m256i *)(u + 64 * j), lo);
        _mm256_storeu_si256((__m256i *)(u + 64 * j + 32), hi);
    }
}

/* Super-blocks 0 .. bn - 1 of one Q4_K (five == 0) or Q5_K (five == 1) row x against n_oct
 * packed octets: sub-block s of super-block b of octet g at o[g * OCT_BLOCKS + 8 b + s], its
 * other values at ok[g * OCT_SUPER + b]; Q5_K's quants unpacked at u5[b] (unpack_q5_K). */
AVX2 SPECIALIZE static inline void k4_row_octets(int five, const void *x, int64_t bn, const struct octet *o,
                                                 const struct octet_k *ok, const uint8_t (*u5)[KIRI_QK_K],
                                                 int n_oct, __m256 acc[OCT_MAX])
{
    const size_t bs = five ? sizeof(struct kiri_block_q5_K) : sizeof(struct kiri_block_q4_K);
    const size_t qs_at = five ? offsetof(struct kiri_block_q5_K, qs) : offsetof(struct kiri_block_q4_K, qs);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    for (int64_t b = 0; b < bn; b++) {
        const uint8_t *xb = (const uint8_t *)x + (size_t)b * bs;
        const struct kiri_block_q4_K *hd = (const struct kiri_block_q4_K *)xb; /* d, dmin, scales */
        int sc[8], mn[8];
        scales_mins_k4(hd->scales, sc, mn);
        __m256i isum[OCT_MAX], imin[OCT_MAX];
        _Pragma("GCC unroll 4")
        for (int g = 0; g < n_oct; g++)
            isum[g] = _mm256_setzero_si256();
        UNROLL
        for (int sb = 0; sb < 8; sb++) { /* bytes 32 (sb / 2) ..: low nibbles sub-block sb even, high odd */
            const uint8_t *q = xb + qs_at + 32 * (sb / 2);
            __m256i s[OCT_MAX];
            _Pragma("GCC unroll 4")
            for (int g = 0; g < n_oct; g++)
                s[g] = five ? o[g * OCT_BLOCKS + 8 * b + sb].c : _mm256_setzero_si256();
            UNROLL
            for (int h = 0; h < 8; h++) {
                uint32_t w4;
                memcpy(&w4, five ? u5[b] + 32 * sb + 4 * h : q + 4 * h, sizeof w4);
                const __m256i bw = _mm256_set1_epi32((int)w4);
                const __m256i u = five ? bw : _mm256_and_si256(sb % 2 ? _mm256_srli_epi16(bw, 4) : bw, m4);
                _Pragma("GCC unroll 4")
                for (int g = 0; g < n_oct; g++) {
                    s[g] = _mm256_add_epi16(s[g], _mm256_maddubs_epi16(u, o[g * OCT_BLOCKS + 8 * b + sb].g[h]));
                    KEEP(s[g]);
                }
            }
            const __m256i scv = _mm256_set1_epi16((short)sc[sb]);
            _Pragma("GCC unroll 4")
            for (int g = 0; g < n_oct; g++)
                isum[g] = _mm256_add_epi32(isum[g], _mm256_madd_epi16(s[g], scv));
        }
        int sc16[8];
        for (int i = 0; i < 8; i++)
            sc16[i] = 16 * sc[i];
        _Pragma("GCC unroll 4")
        for (int g = 0; g < n_oct; g++) {
            const struct octet_k *k = &ok[g * OCT_SUPER + b];
            if (five)
                isum[g] = _mm256_add_epi32(isum[g], pair_sums(k, sc16));
            imin[g] = pair_sums(k, mn);
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16((short)hd->d));
        const __m256 mw = _mm256_cvtph_ps(_mm_set1_epi16((short)hd->dmin));
        _Pragma("GCC unroll 4")
        for (int g = 0; g < n_oct; g++) {
            const __m256 da = ok[g * OCT_SUPER + b].d;
            acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[g]), _mm256_mul_ps(dw, da), acc[g]);
            acc[g] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(imin[g]), _mm256_mul_ps(mw, da), acc[g]);
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * Q6_K: x = d sc_j (u - 32) over sub-block j (16 values), u 0..63 from 4 bits of ql and 2 of qh.
 * u enters maddubs unsigned and the int16 lanes start at their share of -32 sum a, as Q4_0's:
 * a partial sum is sum (u - 32) a over the products added so far minus 32 sum a over the others,
 * each lane holding 8 values of a sub-block: at most 8 * 32 * 127 = 32512 in magnitude. One
 * vpmaddwd with sc_j (signed) widens a sub-block's sums.
 * ------------------------------------------------------------------------------------------- */

/* Super-blocks x[0 .. bn - 1] of one Q6_K row against n_oct packed octets (as k4_row_octets). */
AVX2 SPECIALIZE static inline void q6_K_row_octets(const struct kiri_block_q6_K *x, int64_t bn,
                                                   const struct octet *o, const struct octet_k *ok, int n_oct,
                                                   __m256 acc[OCT_MAX])
{
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(0x30);
    for (int64_t b = 0; b < bn; b++) {
        __m256i isum[OCT_MAX];
        _Pragma("GCC unroll 4")
        for (int g = 0; g < n_oct; g++)
            isum[g] = _mm256_setzero_si256();
        UNROLL
        for (int sb = 0; sb < 8; sb++) { /* values 32 sb ..: half n, quarter qq of unpack_q6_K */
            const int n = sb / 4, qq = sb % 4;
            const uint8_t *ql = x[b].ql + 64 * n + 32 * (qq & 1), *qh = x[b].qh + 32 * n;
            __m256i s[OCT_MAX];
            UNROLL
            for (int h = 0; h < 8; h++) {
                if (h % 4 == 0) {
                    _Pragma("GCC unroll 4")
                    for (int g = 0; g < n_oct; g++) {
                        const struct octet *ob = &o[g * OCT_BLOCKS + 8 * b + sb];
                        s[g] = h ? ob->c1 : ob->c;
                    }
                }
                uint32_t wl, wh;
                memcpy(&wl, ql + 4 * h, sizeof wl);
                memcpy(&wh, qh + 4 * h, sizeof wh);
                const __m256i bl = _mm256_set1_epi32((int)wl), bh = _mm256_set1_epi32((int)wh);
                const __m256i lo = _mm256_and_si256(qq >= 2 ? _mm256_srli_epi16(bl, 4) : bl, m4);
                const __m256i hb = qq == 0 ? _mm256_slli_epi16(bh, 4)
                                 : qq == 1 ? _mm256_slli_epi16(bh, 2)
                                 : qq == 2 ? bh
                                           : _mm256_srli_epi16(bh, 2);
                const __m256i u = _mm256_or_si256(lo, _mm256_and_si256(hb, m2));
                _Pragma("GCC unroll 4")
                for (int g = 0; g < n_oct; g++) {
                    s[g] = _mm256_add_epi16(s[g], _mm256_maddubs_epi16(u, o[g * OCT_BLOCKS + 8 * b + sb].g[h]));
                    KEEP(s[g]);
                }
                if (h % 4 == 3) {
                    const __m256i scv = _mm256_set1_epi16((short)x[b].scales[2 * sb + h / 4]);
                    _Pragma("GCC unroll 4")
                    for (int g = 0; g < n_oct; g++)
                        isum[g] = _mm256_add_epi32(isum[g], _mm256_madd_epi16(s[g], scv));
                }
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_set1_epi16((short)x[b].d));
        _Pragma("GCC unroll 4")
        for (int g = 0; g < n_oct; g++)
            acc[g] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[g]), _mm256_mul_ps(dw, ok[g * OCT_SUPER + b].d), acc[g]);
    }
}

/* Rows [0, nr) of weight type t against the n_oct octets from token t0 (the last one may be
 * partial), in passes of OCT_BLOCKS 32-value blocks. */
AVX2 SPECIALIZE static inline void octets(enum oct_type t, int64_t k, const void *w, size_t ws, const char *a,
                                          size_t as, float *dst, size_t ds, int64_t nr, int64_t nt, int64_t t0,
                                          int n_oct)
{
    const int kq = t == OCT_Q4_K || t == OCT_Q5_K || t == OCT_Q6_K;
    const int64_t per_pass = kq ? OCT_SUPER : OCT_BLOCKS, nb = k / (kq ? KIRI_QK_K : KIRI_QK8_0);
    struct octet o[OCT_MAX * OCT_BLOCKS];
    struct octet_k ok[OCT_MAX * OCT_SUPER];
    __m256 acc_rows[OCT_ROWS][OCT_MAX];
    /* Q5_K: the quants of the pass of one row, and of the next one, unpacked a row ahead so that
     * the stores are long done (and the row's bytes loaded) when the products read them. */
    _Alignas(32) uint8_t u5[2][OCT_SUPER][KIRI_QK_K];
    for (int64_t r0 = 0; r0 < nr; r0 += OCT_ROWS) {
        const int64_t rn = min64(nr - r0, OCT_ROWS);
        for (int64_t b0 = 0; b0 < nb; b0 += per_pass) {
            const int64_t bn = min64(nb - b0, per_pass);
            for (int g = 0; g < n_oct; g++) {
                const char *y[8];
                octet_rows(a, as, t0 + 8 * g, nt, y);
                for (int64_t b = 0; b < bn; b++)
                    if (kq)
                        pack_q8_K((const struct kiri_block_q8_K *const *)y, b0 + b, t == OCT_Q5_K,
                                  &o[g * OCT_BLOCKS + 8 * b], &ok[g * OCT_SUPER + b]);
                    else
                        pack_q8_32(t, y, b0 + b, &o[g * OCT_BLOCKS + b]);
            }
            for (int64_t b = 0; t == OCT_Q5_K && b < bn; b++)
                unpack_q5_K((const struct kiri_block_q5_K *)((const char *)w + (size_t)r0 * ws) + b0 + b, u5[0][b]);
            for (int64_t r = 0; r < rn; r++) {
                const char *x = (const char *)w + (size_t)(r0 + r) * ws;
                for (int64_t b = 0; t == OCT_Q5_K && r + 1 < rn && b < bn; b++)
                    unpack_q5_K((const struct kiri_block_q5_K *)(x + ws) + b0 + b, u5[(r + 1) % 2][b]);
                __m256 acc[OCT_MAX];
                _Pragma("GCC unroll 4")
                for (int g = 0; g < n_oct; g++)
                    acc[g] = b0 ? acc_rows[r][g] : _mm256_setzero_ps();
                if (t == OCT_Q4_0)
                    q32_row_octets(t, (const struct kiri_block_q4_0 *)x + b0, bn, o, n_oct, acc);
                else if (t == OCT_Q4_1)
                    q32_row_octets(t, (const struct kiri_block_q4_1 *)x + b0, bn, o, n_oct, acc);
                else if (t == OCT_Q5_0)
                    q32_row_octets(t, (const struct kiri_block_q5_0 *)x + b0, bn, o, n_oct, acc);
                else if (t == OCT_Q5_1)
                    q32_row_octets(t, (const struct kiri_block_q5_1 *)x + b0, bn, o, n_oct, acc);
                else if (t == OCT_Q8_0)
                    q8_0_row_octets((const struct kiri_block_q8_0 *)x + b0, bn, o, n_oct, acc);
                else if (t == OCT_Q4_K)
                    k4_row_octets(0, (const struct kiri_block_q4_K *)x + b0, bn, o, ok, NULL, n_oct, acc);
                else if (t == OCT_Q5_K)
                    k4_row_octets(1, (const struct kiri_block_q5_K *)x + b0, bn, o, ok,
                                  (const uint8_t (*)[KIRI_QK_K])u5[r % 2], n_oct, acc);
                else
                    q6_K_row_octets((const struct kiri_block_q6_K *)x + b0, bn, o, ok, n_oct, acc);
                _Pragma("GCC unroll 4")
                for (int g = 0; g < n_oct; g++)
                    acc_rows[r][g] = acc[g];
            }
        }
        store_octets((const __m256 (*)[OCT_MAX])acc_rows, rn, n_oct, dst, ds, r0, t0, nt);
    }
}

/* An entry point (cpu_kernels.h): tile(kind, ...) with a constant n_oct for each pass over the
 * tokens, passes of OCT_MAX octets, then one of the remaining whole octets; returns the tokens
 * covered (a multiple of 8). */
#define OCTET_ENTRY(name, tile, kind)                                                            \
    AVX2 int64_t name(int64_t k, const void *w, size_t ws, const void *a, size_t as, float *dst, \
                      size_t ds, int64_t nr, int64_t nt)                                         \
    {                                                                                            \
        const char *ac = a;                                                                      \
        int64_t t = 0;                                                                           \
        for (; nt - t >= 8 * OCT_MAX; t += 8 * OCT_MAX)                                          \
            tile(kind, k, w, ws, ac, as, dst, ds, nr, nt, t, OCT_MAX);                           \
        const int64_t rest = (nt - t) / 8;                                                       \
        if (rest == 3)                                                                           \
            tile(kind, k, w, ws, ac, as, dst, ds, nr, nt, t, 3);                                 \
        else if (rest == 2)                                                                      \
            tile(kind, k, w, ws, ac, as, dst, ds, nr, nt, t, 2);                                 \
        else if (rest == 1)                                                                      \
            tile(kind, k, w, ws, ac, as, dst, ds, nr, nt, t, 1);                                 \
        return t + 8 * rest;                                                                     \
    }

OCTET_ENTRY(kiri_cpu_gemm_octets_q4_0_avx2, octets, OCT_Q4_0)
OCTET_ENTRY(kiri_cpu_gemm_octets_q4_1_avx2, octets, OCT_Q4_1)
OCTET_ENTRY(kiri_cpu_gemm_octets_q5_0_avx2, octets, OCT_Q5_0)
OCTET_ENTRY(kiri_cpu_gemm_octets_q5_1_avx2, octets, OCT_Q5_1)
OCTET_ENTRY(kiri_cpu_gemm_octets_q8_0_avx2, octets, OCT_Q8_0)
OCTET_ENTRY(kiri_cpu_gemm_octets_q4_K_avx2, octets, OCT_Q4_K)
OCTET_ENTRY(kiri_cpu_gemm_octets_q5_K_avx2, octets, OCT_Q5_K)
OCTET_ENTRY(kiri_cpu_gemm_octets_q6_K_avx2, octets, OCT_Q6_K)

#endif
