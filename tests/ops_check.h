/* ops_check: the checks every SIMD version of the CPU backend's row operations must pass against
 * the portable reference (kernels/cpu/ops.c), shared by tests/test_ops_avx2.c and
 * tests/test_ops_neon.c, which only pick the kernel table and say when it cannot run here.
 * - attend_head: one query head over F16, F32 and Q8_0 caches, scattered slots, head sizes and key
 *   counts around the kernels' vector widths, scores whose softmax underflows, equal keys;
 * - attend_group: groups of 1 to 16 heads sharing a key/value head, each head against the
 *   reference one at a time;
 * - attend_tile: a prompt's tokens times heads under a causal mask, with a poisoned key (NaN and
 *   infinity) that only the last token sees;
 * - rows: SwiGLU (both tails of the sigmoid, a sweep over the whole range of exp), RMS norm
 *   with and without weights, GeGLU (a sweep through both tails), scaling and soft-capping (a
 *   sweep through tanh's polynomial, its switch and its saturation), in place where allowed;
 * - the recurrent layers' steps: delta_head and short_conv_row.
 * Every check also requires output padding and the floats after the scratch its contract grants to
 * stay untouched. The tolerances and why are stated once, in ops_check.c.
 * State: struct ops_check holds the table under test (borrowed), what the kernels hand to the
 * reference, the largest errors seen and the counters the checks go to. Checks count in the
 * caller's test.h counters (checks, failures point at them), so one verdict covers both files. */
#ifndef KIRI_TESTS_OPS_CHECK_H
#define KIRI_TESTS_OPS_CHECK_H

#include <stdint.h>

struct kiri_cpu_kernels;

struct ops_check {
    const struct kiri_cpu_kernels *k; /* borrowed: the table under test */
    const char *name;                 /* first word of each summary line: the caller's test */
    int head_multiple;                /* see ops_check_init */
    int group_scratch;                /* floats of scratch per key attend_group may use */
    int *checks, *failures;           /* borrowed: the caller's test.h counters */
    double worst_f16, worst_f32;      /* largest attention error of the check under way, by cache */
};

/* Fills o for checks of the table k, summary lines starting with name. head_multiple: the table's
 * attend_head hands head sizes that are not a multiple of it (and Q8_0 caches and head sizes
 * above 1024) to the reference, whose results must then match exactly. group_scratch: the floats
 * per key of scratch its attend_group uses, at most KIRI_ATTEND_TILE_ROWS (the contract); a
 * kernel that promises fewer is held to that. The random inputs restart from seed. checks and
 * failures are the caller's test.h counters. */
void ops_check_init(struct ops_check *o, const struct kiri_cpu_kernels *k, const char *name,
                    int head_multiple, int group_scratch, uint64_t seed, int *checks, int *failures);

/* The checks listed above; each prints one summary line with its count of cases to stderr. */
void ops_check_attend_head(struct ops_check *o);
void ops_check_attend_group(struct ops_check *o);
void ops_check_attend_tile(struct ops_check *o);
void ops_check_rows(struct ops_check *o);
/* delta_head (kiri_cpu_delta_head's contract): head sizes around the vector widths, three tokens
 * of one state, against the reference. */
void ops_check_delta_head(struct ops_check *o);
/* short_conv_row (kiri_cpu_short_conv_row's contract): tap counts, channel counts around the
 * vector widths, with and without SiLU, three tokens of one state and in place, against the
 * reference. */
void ops_check_short_conv(struct ops_check *o);

#endif
