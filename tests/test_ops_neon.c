/* Tests of the NEON row operations (kernels/neon/ops_neon.c: attend_head, attend_group,
 * attend_tile, swiglu_row, rms_norm_row, geglu_row, scale_row, softcap_row, delta_head, short_conv_row) against the
 * reference kernels of ops.c: the shared checks of tests/ops_check.c, with their cases and
 * tolerances, on the reference table with the NEON entries on top. NEON is part of every AArch64 CPU, so there is nothing to probe.
 *
 * Only built as a test on aarch64 (under qemu-aarch64 when cross-compiled). Elsewhere the program
 * says so and exits 0. */
#if !defined(__aarch64__)
#include <stdio.h>

int main(void)
{
    printf("test_ops_neon: not aarch64\n");
    return 0;
}
#else

#include "../kernels/neon/neon_kernels.h"
#include "ops_check.h"
#include "test.h"

/* Runs one shared check on the NEON table. The kernels hand head sizes that are not a multiple
 * of 4 to the reference; attend_group works on up to 8 heads at once and promises to use only 8
 * floats of scratch per key, which the check holds it to. */
static void run(const char *test, void (*check)(struct ops_check *))
{
    struct kiri_cpu_kernels k;
    kiri_cpu_kernels_init_ref(&k);
    kiri_cpu_kernels_init_ops_neon(&k);
    struct ops_check o;
    ops_check_init(&o, &k, test, 4, 8, 0x5851F42D4C957F2Dull, &test_checks, &test_failures);
    check(&o);
}

static void test_attend_head(void) { run(__func__, ops_check_attend_head); }
static void test_attend_group(void) { run(__func__, ops_check_attend_group); }
static void test_attend_tile(void) { run(__func__, ops_check_attend_tile); }
static void test_rows(void) { run(__func__, ops_check_rows); }
static void test_delta_head(void) { run(__func__, ops_check_delta_head); }
static void test_short_conv(void) { run(__func__, ops_check_short_conv); }

TEST_MAIN(test_attend_head, test_attend_group, test_attend_tile, test_rows, test_delta_head, test_short_conv)

#endif
