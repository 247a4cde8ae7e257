/* A small assertion header for kiri's C tests: each failed check prints both sides, the file and
 * the line, counts as a failure, and the test goes on; TEST_MAIN's return value is the verdict.
 * Usage: static void test_x(void) { CHECK_EQ_INT(a, b); }  then  TEST_MAIN(test_x, test_y)  */
#ifndef KIRI_TEST_H
#define KIRI_TEST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures;
static int test_checks;

#define CHECK(cond)                                                                          \
    do {                                                                                     \
        test_checks++;                                                                       \
        if (!(cond)) {                                                                       \
            test_failures++;                                                                 \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond);         \
        }                                                                                    \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                                   \
    do {                                                                                     \
        long long va_ = (long long)(a), vb_ = (long long)(b);                                \
        test_checks++;                                                                       \
        if (va_ != vb_) {                                                                    \
            test_failures++;                                                                 \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n", __FILE__, __LINE__, #a,  \
                    #b, va_, vb_);                                                           \
        }                                                                                    \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                                \
    do {                                                                                     \
        double va_ = (double)(a), vb_ = (double)(b);                                         \
        test_checks++;                                                                       \
        if (!(fabs(va_ - vb_) <= (tol))) {                                                   \
            test_failures++;                                                                 \
            fprintf(stderr, "%s:%d: |%s - %s| <= %g failed: %.9g vs %.9g\n", __FILE__,         \
                    __LINE__, #a, #b, (double)(tol), va_, vb_);                              \
        }                                                                                    \
    } while (0)

#define CHECK_STR(a, b)                                                                      \
    do {                                                                                     \
        const char *va_ = (a), *vb_ = (b);                                                   \
        test_checks++;                                                                       \
        if (!va_ || !vb_ || strcmp(va_, vb_) != 0) {                                         \
            test_failures++;                                                                 \
            fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n", __FILE__, __LINE__,  \
                    #a, #b, va_ ? va_ : "(null)", vb_ ? vb_ : "(null)");                     \
        }                                                                                    \
    } while (0)

/* Deterministic random numbers (splitmix64); a test file may pick its own sequence by defining
 * TEST_RNG_SEED before including this header. */
#ifndef TEST_RNG_SEED
#define TEST_RNG_SEED 0x9E3779B97F4A7C15ull
#endif
static uint64_t test_rng_state = TEST_RNG_SEED;

static inline uint64_t test_rand_u64(void)
{
    uint64_t z = (test_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static inline float test_rand_sym(void)
{
    return (float)((double)(test_rand_u64() >> 11) / 4503599627370496.0 - 1.0);
}

/* malloc that ends the test program when memory runs out. */
static inline void *test_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    return p;
}

typedef void (*test_fn)(void);

static int test_run_all(const char *file, const test_fn *fns, const char *names)
{
    int i = 0;
    for (const test_fn *f = fns; *f; f++, i++)
        (*f)();
    fprintf(stderr, "%s: %d checks in %d tests (%s): %d failed\n", file, test_checks, i, names,
            test_failures);
    return test_failures ? 1 : 0;
}

#define TEST_MAIN(...)                                                                       \
    int main(void)                                                                           \
    {                                                                                        \
        static const test_fn fns_[] = {__VA_ARGS__, NULL};                                   \
        return test_run_all(__FILE__, fns_, #__VA_ARGS__);                                   \
    }

#endif
