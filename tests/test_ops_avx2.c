/* Tests of the AVX2 row operations (kernels/cpu/ops_avx2.c: attend_head, attend_group,
 * attend_tile, swiglu_row, rms_norm_row, geglu_row, scale_row, softcap_row, delta_head, short_conv_row) against the
 * reference kernels of ops.c: the shared checks of tests/ops_check.c, with their cases and
 * tolerances, on the reference table with the AVX2 entries on top. Where the build has no AVX2
 * kernels or the CPU lacks AVX2, FMA or F16C, each test says SKIPPED and checks nothing. */
#include <stdio.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "platform.h"
#include "ops_check.h"
#include "test.h"

/* Runs one shared check on the AVX2 table, or says why it cannot run here. The kernels hand head
 * sizes that are not a multiple of 8 to the reference; attend_group runs tiles of up to 16 heads,
 * using the scratch the contract grants (KIRI_ATTEND_TILE_ROWS floats per key). */
static void run(const char *test, void (*check)(struct ops_check *))
{
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    if (!(kiri_platform_cpu_features() & KIRI_CPU_AVX2)) {
        fprintf(stderr, "%s: SKIPPED: this CPU lacks AVX2, FMA or F16C\n", test);
        return;
    }
    struct kiri_cpu_kernels k;
    kiri_cpu_kernels_init_ref(&k);
    kiri_cpu_kernels_init_ops_avx2(&k);
    struct ops_check o;
    ops_check_init(&o, &k, test, 8, KIRI_ATTEND_TILE_ROWS, 0x853C49E6748FEA9Bull, &test_checks, &test_failures);
    check(&o);
#else
    (void)check;
    fprintf(stderr, "%s: SKIPPED: no AVX2 kernels in this build\n", test);
#endif
}

static void test_attend_head(void) { run(__func__, ops_check_attend_head); }
static void test_attend_group(void) { run(__func__, ops_check_attend_group); }
static void test_attend_tile(void) { run(__func__, ops_check_attend_tile); }
static void test_rows(void) { run(__func__, ops_check_rows); }
static void test_delta_head(void) { run(__func__, ops_check_delta_head); }
static void test_short_conv(void) { run(__func__, ops_check_short_conv); }

TEST_MAIN(test_attend_head, test_attend_group, test_attend_tile, test_rows, test_delta_head, test_short_conv)
