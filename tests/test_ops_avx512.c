/* Tests of the AVX-512 row operations (kernels/cpu/ops_avx512.c: delta_head, short_conv_row)
 * against the reference kernels of ops.c: the shared checks of tests/ops_check.c, with their cases
 * and tolerances, on the reference table with the AVX2 and then the AVX-512 entries on top (the
 * table the AVX-512 tier runs). Where the build has no x86 kernels or the CPU lacks AVX-512, each
 * test says SKIPPED and checks nothing. */
#include <stdio.h>

#include "../kernels/cpu/cpu_kernels.h"
#include "platform.h"
#include "ops_check.h"
#include "test.h"

/* Runs one shared check on the AVX-512 table, or says why it cannot run here. The delta rule's
 * kernel hands head sizes that are not a multiple of 16 to the reference. */
static void run(const char *test, void (*check)(struct ops_check *))
{
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    const uint32_t need = KIRI_CPU_AVX2 | KIRI_CPU_AVX512;
    if ((kiri_platform_cpu_features() & need) != need) {
        fprintf(stderr, "%s: SKIPPED: this CPU lacks AVX-512 (F, BW, VL)\n", test);
        return;
    }
    struct kiri_cpu_kernels k;
    kiri_cpu_kernels_init_ref(&k);
    kiri_cpu_kernels_init_ops_avx2(&k);
    kiri_cpu_kernels_init_ops_avx512(&k);
    struct ops_check o;
    ops_check_init(&o, &k, test, 8, KIRI_ATTEND_TILE_ROWS, 0xDA3E39CB94B95BDBull, &test_checks, &test_failures);
    check(&o);
#else
    (void)check;
    fprintf(stderr, "%s: SKIPPED: no x86 SIMD kernels in this build\n", test);
#endif
}

static void test_delta_head(void) { run(__func__, ops_check_delta_head); }
static void test_short_conv(void) { run(__func__, ops_check_short_conv); }

TEST_MAIN(test_delta_head, test_short_conv)
