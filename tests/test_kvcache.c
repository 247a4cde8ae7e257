/* The paged KV cache: block accounting, slots through block tables, exhaustion without partial
 * reservations, reuse of freed blocks, and allocation failures. */
#include <string.h>

#include "backend.h"
#include "kiri.h"
#include "kvcache.h"
#include "mem.h"
#include "test.h"
#include "threadpool.h"

extern const struct kiri_backend_iface kiri_cpu_backend_iface;

static struct kiri_backend *be;
static struct kiri_threadpool *tp;

static void test_blocks_and_slots(void)
{
    struct kiri_kvcache *c = NULL;
    CHECK_EQ_INT(kiri_kvcache_init(&kiri_cpu_backend_iface, be, 2, 64, KIRI_TYPE_F16, 4, 6, &c), 0);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 6);
    CHECK_EQ_INT(kiri_kvcache_bytes(c), 2 * 2 * 64 * 2 * 24);
    CHECK_EQ_INT(kiri_kvcache_k(c, 1)->ne[1], 24);

    struct kiri_kv_seq a = {0}, b = {0};
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 5), 0); /* 2 blocks */
    CHECK_EQ_INT(a.n_blocks, 2);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &b, 8), 0); /* 2 blocks */
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 2);
    /* Slots of different sequences never collide. */
    int used[24] = {0};
    for (int p = 0; p < 8; p++) {
        const int sa = kiri_kvcache_slot(c, &a, p), sb = kiri_kvcache_slot(c, &b, p);
        CHECK(sa >= 0 && sa < 24 && sb >= 0 && sb < 24);
        used[sa]++;
        used[sb]++;
    }
    for (int s = 0; s < 24; s++)
        CHECK(used[s] <= 1);
    /* Positions inside one block are consecutive slots. */
    CHECK_EQ_INT(kiri_kvcache_slot(c, &a, 1), kiri_kvcache_slot(c, &a, 0) + 1);

    /* Asking for more than is free takes nothing. */
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 4 * 5), KIRI_E_CONTEXT_FULL);
    CHECK_EQ_INT(a.n_blocks, 2);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 2);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 16), 0);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 0);

    /* Freed blocks come back and are handed out again. */
    kiri_kvcache_seq_clear(c, &b);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 2);
    CHECK_EQ_INT(b.n_tokens, 0);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &b, 8), 0);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 0);
    kiri_kvcache_seq_free(c, &a);
    kiri_kvcache_seq_free(c, &b);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 6);
    kiri_kvcache_free(c);
}

static void test_bad_shapes(void)
{
    struct kiri_kvcache *c = NULL;
    CHECK_EQ_INT(kiri_kvcache_init(&kiri_cpu_backend_iface, be, 2, 48, KIRI_TYPE_Q8_0, 4, 6, &c), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_kvcache_init(&kiri_cpu_backend_iface, be, 2, 64, KIRI_TYPE_Q4_0, 4, 6, &c), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_kvcache_init(&kiri_cpu_backend_iface, be, 0, 64, KIRI_TYPE_F16, 4, 6, &c), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_kvcache_init(&kiri_cpu_backend_iface, be, 2, 64, KIRI_TYPE_F16, 1 << 20, 1 << 20, &c),
                 KIRI_E_INVALID_ARG);
    CHECK(c == NULL);
}

static void test_allocation_failures(void)
{
    int ok = 0;
    for (long n = 0; n < 20 && !ok; n++) {
        struct kiri_kvcache *c = NULL;
        struct kiri_kv_seq s = {0};
        kiri_mem_fail_after(n);
        int rc = kiri_kvcache_init(&kiri_cpu_backend_iface, be, 2, 64, KIRI_TYPE_F32, 4, 6, &c);
        if (rc == 0)
            rc = kiri_kvcache_seq_reserve(c, &s, 20);
        kiri_mem_fail_after(-1);
        CHECK(rc == 0 || rc == KIRI_E_NOMEM);
        ok = rc == 0;
        if (c)
            kiri_kvcache_seq_free(c, &s);
        kiri_kvcache_free(c);
    }
    CHECK(ok);
}

static void test_setup(void)
{
    kiri_threadpool_init(1, &tp);
    struct kiri_backend_config cfg;
    memset(&cfg, 0, sizeof cfg);
    kiri_threadpool_as_threads(tp, &cfg.threads);
    char msg[64];
    CHECK_EQ_INT(kiri_cpu_backend_iface.init(&cfg, &be, msg, sizeof msg), 0);
}

static void test_teardown(void)
{
    kiri_cpu_backend_iface.free(be);
    kiri_threadpool_free(tp);
}

TEST_MAIN(test_setup, test_blocks_and_slots, test_bad_shapes, test_allocation_failures, test_teardown)
