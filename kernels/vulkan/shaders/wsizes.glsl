/* The block geometry of the weight type WTYPE (its GGUF id), for shaders that need the sizes
 * before the readers of wtypes.glsl exist (matmat.comp sizes its shared tiles with them):
 *   WBS, WBB   values and bytes per block ("blocks" of 32 values for the plain types)
 *   WPLAIN     1 for F32, F16, BF16, whose rows may end inside a block
 *   ATYPE      the activation format the product takes (below), ABW its words per block
 *   KSB        blocks per step of the tiled product, sized so both tiles fit in 16 KiB
 *
 * Activation formats, all in whole words so each block is written by one invocation:
 *   ACT_F32   the F32 tensor itself, one word per value
 *   ACT_F16, ACT_BF16  one word per value, holding the float rounded to F16 / BF16
 *   ACT_Q8_0  9 words per 32 values: 8 words of int8 quants, then d (an F16 value, as a float)
 *   ACT_Q8_1  10 words: the same, then s = d * sum(quants) rounded to F16, as a float
 *   ACT_Q8_K  81 words per 256 values: 64 words of quants, d (float), 16 sums of 16 quants (int)
 */
#ifndef KIRI_WSIZES
#define KIRI_WSIZES

#define ACT_F32 0
#define ACT_F16 1
#define ACT_BF16 2
#define ACT_Q8_0 3
#define ACT_Q8_1 4
#define ACT_Q8_K 5

#define WPLAIN 0
#if WTYPE == 0 /* F32 */
#define WBS 32u
#define WBB 128u
#define ATYPE ACT_F32
#define ABW 32u
#define KSB 2u
#undef WPLAIN
#define WPLAIN 1
#elif WTYPE == 1 /* F16 */
#define WBS 32u
#define WBB 64u
#define ATYPE ACT_F16
#define ABW 32u
#define KSB 2u
#undef WPLAIN
#define WPLAIN 1
#elif WTYPE == 30 /* BF16 */
#define WBS 32u
#define WBB 64u
#define ATYPE ACT_BF16
#define ABW 32u
#define KSB 2u
#undef WPLAIN
#define WPLAIN 1
#elif WTYPE == 2 /* Q4_0 */
#define WBS 32u
#define WBB 18u
#define ATYPE ACT_Q8_0
#define ABW 9u
#define KSB 8u
#elif WTYPE == 3 /* Q4_1 */
#define WBS 32u
#define WBB 20u
#define ATYPE ACT_Q8_1
#define ABW 10u
#define KSB 8u
#elif WTYPE == 6 /* Q5_0 */
#define WBS 32u
#define WBB 22u
#define ATYPE ACT_Q8_0
#define ABW 9u
#define KSB 8u
#elif WTYPE == 7 /* Q5_1 */
#define WBS 32u
#define WBB 24u
#define ATYPE ACT_Q8_1
#define ABW 10u
#define KSB 8u
#elif WTYPE == 8 /* Q8_0 */
#define WBS 32u
#define WBB 34u
#define ATYPE ACT_Q8_0
#define ABW 9u
#define KSB 8u
#elif WTYPE == 12 /* Q4_K */
#define WBS 256u
#define WBB 144u
#define ATYPE ACT_Q8_K
#define ABW 81u
#define KSB 1u
#elif WTYPE == 13 /* Q5_K */
#define WBS 256u
#define WBB 176u
#define ATYPE ACT_Q8_K
#define ABW 81u
#define KSB 1u
#elif WTYPE == 14 /* Q6_K */
#define WBS 256u
#define WBB 210u
#define ATYPE ACT_Q8_K
#define ABW 81u
#define KSB 1u
#else
#error "unknown WTYPE"
#endif

#endif
