/* The paged KV cache: block accounting, slots through block tables, exhaustion without partial
 * reservations, reuse of freed blocks, and allocation failures; a windowed pool for sliding-window
 * layers (its size, blocks released as the window slides, prefix sharing cut back to what every
 * layer still has cached); layers of different row sizes and layers that read another layer's
 * keys and values (gemma4); recurrent state per sequence (lfm2) and its snapshots for prefix reuse;
 * rolling a sequence back (rejected speculative tokens) across block boundaries, in both pools,
 * never into a shared block. */
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

/* Three layers, the middle one windowed: window 6 keys, blocks of 4. */
enum { WIN = 6, BS = 4 };
static const uint8_t windowed_layers[3] = {0, 1, 0};

static struct kiri_kvcache *windowed_cache(int32_t n_blocks, int32_t n_window_blocks)
{
    const struct kiri_kvcache_window w = {windowed_layers, WIN, n_window_blocks};
    struct kiri_kvcache *c = NULL;
    CHECK_EQ_INT(kiri_kvcache_init_windowed(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 3, 64, KIRI_TYPE_F16, BS,
                                            n_blocks, &w, &c), 0);
    return c;
}

/* Writes positions [n_tokens, n) as a step does: reserve, then advance. */
static int advance(struct kiri_kvcache *c, struct kiri_kv_seq *s, int32_t n)
{
    const int rc = kiri_kvcache_seq_reserve(c, s, n);
    if (rc == 0)
        s->n_tokens = n;
    return rc;
}

static void test_window_pool(void)
{
    struct kiri_kvcache *c = windowed_cache(30, 8);
    if (!c)
        return;
    /* Two global layers of 120 slots, one windowed layer of 32, F16 rows of 64. */
    CHECK_EQ_INT(kiri_kvcache_bytes(c), 2 * 2 * 64 * 2 * 120 + 1 * 2 * 64 * 2 * 32);
    CHECK_EQ_INT(kiri_kvcache_k(c, 0)->ne[1], 120);
    CHECK_EQ_INT(kiri_kvcache_v(c, 1)->ne[1], 32);
    CHECK(kiri_kvcache_layer_windowed(c, 1) && !kiri_kvcache_layer_windowed(c, 2));
    CHECK_EQ_INT(kiri_kvcache_window(c), WIN);
    CHECK(kiri_kvcache_k(c, 1)->buffer == kiri_kvcache_k(c, 0)->buffer);

    /* Two sequences decode one token at a time past many windows: the global pool grows with
     * them, each holds at most ceil((WIN - 1 + 1) / BS) + 1 windowed blocks, and the live keys
     * of the window never share a slot. */
    struct kiri_kv_seq a = {0}, b = {0};
    for (int32_t n = 1; n <= 56; n++) {
        CHECK_EQ_INT(advance(c, &a, n), 0);
        CHECK_EQ_INT(advance(c, &b, n), 0);
        CHECK_EQ_INT(a.n_blocks, (n + BS - 1) / BS);
        const int32_t first = n - WIN > 0 ? n - WIN : 0; /* the keys a token at n - 1 reads */
        CHECK_EQ_INT(a.w_lo, (n - 1 - WIN + 1 > 0 ? n - 1 - WIN + 1 : 0) / BS);
        CHECK(a.n_blocks - a.w_lo <= (WIN - 1 + 1 + BS - 1) / BS + 1);
        int used[32] = {0};
        for (int32_t p = first; p < n; p++) {
            const int32_t sa = kiri_kvcache_slot_window(c, &a, p), sb = kiri_kvcache_slot_window(c, &b, p);
            CHECK(sa >= 0 && sa < 32 && sb >= 0 && sb < 32);
            used[sa]++;
            used[sb]++;
        }
        for (int i = 0; i < 32; i++)
            CHECK(used[i] <= 1);
    }
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 30 - 2 * 14);
    CHECK(kiri_kvcache_n_free_window(c) >= 8 - 2 * 3);
    /* A chunk of 9 tokens needs its window plus the chunk: 14 keys over at most 5 blocks. */
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 65), KIRI_E_CONTEXT_FULL); /* the global pool is short */
    CHECK_EQ_INT(a.n_blocks, 14);
    kiri_kvcache_seq_clear(c, &b);
    CHECK_EQ_INT(advance(c, &a, 65), 0);
    CHECK(a.n_blocks - a.w_lo <= 5);
    /* Clearing returns both kinds of blocks. */
    kiri_kvcache_seq_free(c, &a);
    kiri_kvcache_seq_free(c, &b);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 30);
    CHECK_EQ_INT(kiri_kvcache_n_free_window(c), 8);
    kiri_kvcache_free(c);
}

/* Speculation writes a step's drafts, then drops the rejected ones: the blocks past the new end
 * go back to both pools (also when the end moves back over a block boundary), the slots of the
 * positions kept are unchanged, and a block that is published (shared) cannot be cut into. */
static void test_truncate(void)
{
    struct kiri_kvcache *c = windowed_cache(30, 8);
    if (!c)
        return;
    struct kiri_kv_seq a = {0};
    CHECK_EQ_INT(advance(c, &a, 7), 0); /* blocks 0, 1 */
    const int32_t slot6 = kiri_kvcache_slot(c, &a, 6);
    /* The pending token at 7 and drafts at 8..13: positions up to 13 over blocks 0..3. */
    CHECK_EQ_INT(advance(c, &a, 14), 0);
    CHECK_EQ_INT(a.n_blocks, 4);
    const int32_t free_before = kiri_kvcache_n_free(c), wfree_before = kiri_kvcache_n_free_window(c);
    /* Two drafts kept: positions [0, 10) stay, block 3 goes back, block 2 is kept. */
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 10), 0);
    CHECK_EQ_INT(a.n_tokens, 10);
    CHECK_EQ_INT(a.n_blocks, 3);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), free_before + 1);
    CHECK_EQ_INT(kiri_kvcache_n_free_window(c), wfree_before + 1);
    CHECK_EQ_INT(kiri_kvcache_slot(c, &a, 6), slot6);
    /* Back over the boundary of block 2 to the end of block 1: no block holds a position past 8. */
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 8), 0);
    CHECK_EQ_INT(a.n_blocks, 2);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), free_before + 2);
    CHECK(a.w_lo <= a.n_blocks);
    /* Past the end, or below zero: refused, nothing changes. */
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 9), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, -1), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(a.n_tokens, 8);
    /* Writing goes on from the new end and reuses blocks as before. */
    CHECK_EQ_INT(advance(c, &a, 13), 0);
    CHECK_EQ_INT(a.n_blocks, 4);
    /* A published block is shared with the prefix cache: cutting into it would overwrite keys
     * other sequences read, so it is refused; cutting at its end is fine. */
    const int32_t toks[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    uint64_t h = 0;
    for (int32_t i = 0; i < 3; i++) {
        h = kiri_kvcache_block_hash(h, toks + i * BS, BS);
        kiri_kvcache_publish(c, &a, i, h, toks + i * BS);
    }
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 11), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 12), 0);
    CHECK_EQ_INT(a.n_blocks, 3);
    kiri_kvcache_seq_free(c, &a);
    CHECK_EQ_INT(kiri_kvcache_n_free(c) + kiri_kvcache_n_cached(c), 30);
    kiri_kvcache_free(c);
}

/* A windowed pool that runs dry refuses the whole reservation, global blocks included. */
static void test_window_pool_full(void)
{
    struct kiri_kvcache *c = windowed_cache(30, 3);
    if (!c)
        return;
    struct kiri_kv_seq a = {0};
    CHECK_EQ_INT(advance(c, &a, 8), 0);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 20), KIRI_E_CONTEXT_FULL); /* 3 more, 1 windowed free */
    CHECK_EQ_INT(a.n_blocks, 2);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 28);
    CHECK_EQ_INT(kiri_kvcache_n_free_window(c), 1);
    kiri_kvcache_seq_free(c, &a);
    kiri_kvcache_free(c);
}

/* Writes tokens [n_tokens, n) and publishes the blocks they complete, as the batcher does. */
static void write_and_publish(struct kiri_kvcache *c, struct kiri_kv_seq *s, const int32_t *tokens, int32_t n,
                              uint64_t *hash, int32_t *n_published)
{
    while (s->n_tokens < n) {
        const int32_t to = s->n_tokens + BS < n ? s->n_tokens + BS : n;
        CHECK_EQ_INT(advance(c, s, to), 0);
        while (*n_published < s->n_tokens / BS) {
            const int32_t *t = tokens + *n_published * BS;
            *hash = kiri_kvcache_block_hash(*hash, t, BS);
            kiri_kvcache_publish(c, s, *n_published, *hash, t);
            ++*n_published;
        }
    }
}

static void test_window_prefix(void)
{
    /* Room for everything in the global pool, 12 windowed blocks. */
    struct kiri_kvcache *c = windowed_cache(64, 12);
    if (!c)
        return;
    int32_t text[48];
    for (int i = 0; i < 48; i++)
        text[i] = 100 + i;
    uint64_t h = 0, hb = 0;
    int32_t np = 0;
    struct kiri_kv_seq a = {0}, b = {0}, d = {0};
    write_and_publish(c, &a, text, 40, &h, &np);
    CHECK_EQ_INT(np, 10);
    CHECK_EQ_INT(kiri_kvcache_n_cached(c), 10);
    kiri_kvcache_seq_clear(c, &a);
    CHECK_EQ_INT(kiri_kvcache_n_available_window(c), 12);

    /* Every layer has it: the whole prefix is shared; the windowed table holds the window before
     * position 40 (keys 35..39, blocks 8 and 9) and stale entries below. */
    uint64_t got = 0;
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &a, text, 10, &got), 10);
    CHECK(got == h);
    CHECK_EQ_INT(a.n_tokens, 40);
    CHECK_EQ_INT(a.w_lo, 8);
    CHECK_EQ_INT(kiri_kvcache_n_available_window(c), 10);
    kiri_kvcache_seq_clear(c, &a);

    /* A sequence sharing the first 6 blocks refreshes windowed blocks 4 and 5 only. */
    int32_t fork[32];
    memcpy(fork, text, 24 * sizeof *fork);
    for (int i = 24; i < 32; i++)
        fork[i] = 7;
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &b, fork, 7, &hb), 6);
    CHECK_EQ_INT(b.w_lo, 4);
    kiri_kvcache_seq_clear(c, &b);
    /* Another text takes 10 windowed blocks: the 2 free ones, then the 8 least recently used
     * (windowed blocks 0-3 and 6-9 of the text; 4 and 5 stay). Its own blocks are not
     * published. */
    struct kiri_kv_seq e = {0};
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &e, 40), 0);
    kiri_kvcache_seq_free(c, &e);
    /* The global blocks of all 40 positions are still cached, but the window before position 40
     * is not: the prefix is cut back to 6 blocks, whose window (blocks 4 and 5) is there. */
    CHECK_EQ_INT(kiri_kvcache_n_cached(c), 10);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &d, text, 10, &got), 6);
    CHECK_EQ_INT(d.n_tokens, 24);
    CHECK_EQ_INT(d.w_lo, 4);
    kiri_kvcache_seq_clear(c, &d);
    /* With those gone too, no prefix is usable: position 4 on needs windowed block 0. */
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &e, 48), 0);
    kiri_kvcache_seq_free(c, &e);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &d, text, 10, &got), 0);
    CHECK_EQ_INT(d.n_tokens, 0);
    CHECK(got == 0);
    /* A sequence that computes the text again publishes its windowed blocks again. */
    h = 0;
    np = 0;
    write_and_publish(c, &d, text, 44, &h, &np);
    kiri_kvcache_seq_clear(c, &d);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &d, text, 11, &got), 11);
    CHECK_EQ_INT(d.w_lo, 9);
    kiri_kvcache_seq_free(c, &d);
    kiri_kvcache_seq_free(c, &b);
    kiri_kvcache_seq_free(c, &a);
    CHECK_EQ_INT(kiri_kvcache_n_available(c), 64);
    CHECK_EQ_INT(kiri_kvcache_n_available_window(c), 12);
    kiri_kvcache_free(c);
}

/* Without windowed layers the cache is the one-pool cache. */
static void test_window_none(void)
{
    const uint8_t none[3] = {0, 0, 0};
    const struct kiri_kvcache_window w = {none, WIN, 8};
    struct kiri_kvcache *c = NULL;
    CHECK_EQ_INT(kiri_kvcache_init_windowed(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 3, 64, KIRI_TYPE_F16, BS,
                                            30, &w, &c), 0);
    if (!c)
        return;
    CHECK_EQ_INT(kiri_kvcache_bytes(c), 3 * 2 * 64 * 2 * 120);
    CHECK_EQ_INT(kiri_kvcache_window(c), 0);
    struct kiri_kv_seq a = {0};
    CHECK_EQ_INT(advance(c, &a, 40), 0);
    CHECK(a.wblocks == NULL);
    kiri_kvcache_seq_free(c, &a);
    kiri_kvcache_free(c);
    const struct kiri_kvcache_window bad = {windowed_layers, 0, 8};
    CHECK_EQ_INT(kiri_kvcache_init_windowed(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 3, 64, KIRI_TYPE_F16, BS,
                                            30, &bad, &c), KIRI_E_INVALID_ARG);
}

/* gemma4's layout: 5 layers, 0 and 3 windowed with rows of 32, 1 and 2 global with rows of 64;
 * layer 4 (windowed) reads layer 3's and stores nothing. */
static void test_layout(void)
{
    const uint8_t wl[5] = {1, 0, 0, 1, 1};
    const int64_t dims[5] = {32, 64, 64, 32, 32};
    const int32_t src[5] = {0, 1, 2, 3, 3};
    const struct kiri_kvcache_window w = {wl, WIN, 8};
    const struct kiri_kvcache_layout lay = {dims, src, NULL};
    struct kiri_kvcache *c = NULL;
    CHECK_EQ_INT(kiri_kvcache_init_layers(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 5, 0, KIRI_TYPE_F16, BS, 30,
                                          &w, &lay, &c), 0);
    if (!c)
        return;
    /* Two global layers of 64 over 120 slots, two windowed ones of 32 over 32 slots. */
    CHECK_EQ_INT(kiri_kvcache_bytes(c), 2 * 2 * 64 * 2 * 120 + 2 * 2 * 32 * 2 * 32);
    CHECK_EQ_INT(kiri_kvcache_k(c, 1)->ne[0], 64);
    CHECK_EQ_INT(kiri_kvcache_k(c, 0)->ne[0], 32);
    CHECK_EQ_INT(kiri_kvcache_k(c, 0)->nb[1], 64);
    CHECK_EQ_INT(kiri_kvcache_k(c, 3)->ne[1], 32);
    CHECK(kiri_kvcache_k(c, 4) == kiri_kvcache_k(c, 3));
    CHECK(kiri_kvcache_v(c, 4) == kiri_kvcache_v(c, 3));
    CHECK_EQ_INT(kiri_kvcache_layer_source(c, 4), 3);
    CHECK_EQ_INT(kiri_kvcache_layer_source(c, 2), 2);
    CHECK(kiri_kvcache_layer_windowed(c, 4));
    /* Every layer's memory lies apart from the others'. */
    const char *k0 = kiri_kvcache_k(c, 0)->data, *v3 = kiri_kvcache_v(c, 3)->data;
    CHECK(k0 && v3 && v3 >= k0 + 2 * 32 * 2 * 32);
    struct kiri_kv_seq a = {0};
    for (int32_t n = 4; n <= 40; n += 4)
        CHECK_EQ_INT(advance(c, &a, n), 0);
    kiri_kvcache_seq_free(c, &a);
    /* Moving it keeps the layout (a layer with its source). */
    CHECK_EQ_INT(kiri_kvcache_place(c, 0, NULL, NULL, &kiri_cpu_backend_iface, be), 0);
    CHECK(kiri_kvcache_k(c, 4) == kiri_kvcache_k(c, 3));
    kiri_kvcache_free(c);

    /* A source that lies later, reads another layer itself, or is in the other pool is refused;
     * any earlier layer of the same pool and row will do. */
    static const int32_t sources[4][5] = {{0, 1, 2, 4, 4}, {0, 1, 2, 3, 2}, {0, 0, 2, 3, 1}, {0, 1, 2, 3, 0}};
    const int32_t chained[5] = {0, 1, 1, 3, 3};
    for (int i = 0; i < 4; i++) {
        const struct kiri_kvcache_layout b = {dims, sources[i], NULL};
        c = NULL;
        int rc = kiri_kvcache_init_layers(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 5, 0, KIRI_TYPE_F16, BS, 30,
                                          &w, &b, &c);
        CHECK_EQ_INT(rc, i == 3 ? 0 : KIRI_E_INVALID_ARG);
        kiri_kvcache_free(c);
    }
    const struct kiri_kvcache_layout ch = {dims, chained, NULL};   /* 2 reads 1, both global: fine */
    c = NULL;
    CHECK_EQ_INT(kiri_kvcache_init_layers(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 5, 0, KIRI_TYPE_F16, BS, 30,
                                          &w, &ch, &c), 0);
    if (c)
        CHECK_EQ_INT(kiri_kvcache_bytes(c), 1 * 2 * 64 * 2 * 120 + 2 * 2 * 32 * 2 * 32);
    kiri_kvcache_free(c);
    const int64_t odd[5] = {32, 64, 64, 32, 48};
    const struct kiri_kvcache_layout od = {odd, src, NULL};
    c = NULL;
    CHECK_EQ_INT(kiri_kvcache_init_layers(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 5, 0, KIRI_TYPE_F16, BS, 30,
                                          &w, &od, &c), KIRI_E_INVALID_ARG);
    const int64_t q8bad[5] = {32, 64, 64, 32, 16};
    const int32_t own[5] = {0, 1, 2, 3, 4};
    const struct kiri_kvcache_layout q8 = {q8bad, own, NULL};
    CHECK_EQ_INT(kiri_kvcache_init_layers(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 5, 0, KIRI_TYPE_Q8_0, BS, 30,
                                          &w, &q8, &c), KIRI_E_INVALID_ARG);
    /* Split between layers 3 and 4: layer 4 would be apart from its source. */
    CHECK_EQ_INT(kiri_kvcache_init_layers(&kiri_cpu_backend_iface, be, 4, &kiri_cpu_backend_iface, be, 5, 0,
                                          KIRI_TYPE_F16, BS, 30, &w, &lay, &c), KIRI_E_INVALID_ARG);
}

static void test_allocation_failures(void)
{
    int ok = 0;
    for (long n = 0; n < 40 && !ok; n++) {
        struct kiri_kvcache *c = NULL;
        struct kiri_kv_seq s = {0};
        const struct kiri_kvcache_window w = {windowed_layers, WIN, 8};
        kiri_mem_fail_after(n);
        int rc = kiri_kvcache_init_windowed(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 3, 64, KIRI_TYPE_F32, 4, 6,
                                            &w, &c);
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

/* A hybrid layout: layers 0 and 2 recurrent (no keys; state of 24 and 40 floats per slot: each
 * layer its own size, as qwen35's and lfm2's differ), 1 and 3 attention; two state slots. A slot
 * comes with the first reservation and goes back with the blocks; a third sequence waits for one
 * (nothing taken); no prefix is shared or published. */
/* The hybrid layout of test_state, blocks of 4, 6 of them, with n_snapshots snapshots and
 * n_slots state slots. */
static struct kiri_kvcache *hybrid_cache_slots(int32_t n_snapshots, int32_t n_slots)
{
    const int64_t dims[4] = {0, 64, 0, 64};
    const int64_t rec[4] = {24, 0, 40, 0};
    const struct kiri_kvcache_state st = {rec, n_slots, n_snapshots};
    const struct kiri_kvcache_layout lay = {dims, NULL, &st};
    struct kiri_kvcache *c = NULL;
    CHECK_EQ_INT(kiri_kvcache_init_layers(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 4, 0, KIRI_TYPE_F16, 4, 6,
                                          NULL, &lay, &c), n_snapshots > (1 << 20) ? KIRI_E_INVALID_ARG : 0);
    return c;
}

static struct kiri_kvcache *hybrid_cache(int32_t n_snapshots) { return hybrid_cache_slots(n_snapshots, 2); }

static void test_state(void)
{
    const int64_t dims[4] = {0, 64, 0, 64};
    const int32_t src[4] = {0, 1, 2, 3};
    const int64_t rec[4] = {24, 0, 40, 0};
    const struct kiri_kvcache_state st = {rec, 2, 0};
    struct kiri_kvcache *c = hybrid_cache(0);
    if (!c)
        return;
    CHECK_EQ_INT(kiri_kvcache_state_bytes(c), (24 + 40) * 4 * 2);
    CHECK_EQ_INT(kiri_kvcache_bytes(c), 2 * 2 * 64 * 2 * 24 + (24 + 40) * 4 * 2);
    CHECK(kiri_kvcache_state(c, 1) == NULL && kiri_kvcache_state(c, 0) && kiri_kvcache_state(c, 2));
    CHECK_EQ_INT(kiri_kvcache_state(c, 0)->ne[0], 24);
    CHECK_EQ_INT(kiri_kvcache_state(c, 2)->ne[0], 40);
    CHECK_EQ_INT(kiri_kvcache_state(c, 2)->ne[1], 2);
    CHECK_EQ_INT(kiri_kvcache_state(c, 2)->nb[1], 40 * 4);
    CHECK(!kiri_kvcache_layer_has_kv(c, 0) && kiri_kvcache_layer_has_kv(c, 1));
    const char *s0 = kiri_kvcache_state(c, 0)->data, *s2 = kiri_kvcache_state(c, 2)->data;
    CHECK(s0 && s2 && (s2 >= s0 + 24 * 4 * 2 || s0 >= s2 + 40 * 4 * 2));

    struct kiri_kv_seq a = {0}, b = {0}, d = {0};
    CHECK_EQ_INT(kiri_kvcache_seq_state_row(&a), -1);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 5), 0);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &b, 1), 0);
    CHECK(kiri_kvcache_seq_state_row(&a) >= 0 && kiri_kvcache_seq_state_row(&b) >= 0);
    CHECK(kiri_kvcache_seq_state_row(&a) != kiri_kvcache_seq_state_row(&b));
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 0);
    /* Blocks are free but no slot is: refused whole. */
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &d, 1), KIRI_E_CONTEXT_FULL);
    CHECK_EQ_INT(d.n_blocks, 0);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 3);
    /* Growing keeps the slot. */
    const int32_t row_a = kiri_kvcache_seq_state_row(&a);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 9), 0);
    CHECK_EQ_INT(kiri_kvcache_seq_state_row(&a), row_a);
    /* Nothing is published or shared from a cache with state. */
    int32_t toks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    a.n_tokens = 8;
    kiri_kvcache_publish(c, &a, 0, kiri_kvcache_block_hash(0, toks, 4), toks);
    CHECK_EQ_INT(kiri_kvcache_n_cached(c), 0);
    uint64_t h = 0;
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &d, toks, 2, &h), 0);
    /* A state's updates cannot be undone: no rollback to a position whose state was not kept. */
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 3), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(a.n_tokens, 8);
    /* Clearing gives the slot back with the blocks. */
    kiri_kvcache_seq_clear(c, &a);
    CHECK_EQ_INT(kiri_kvcache_seq_state_row(&a), -1);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 1);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &d, 1), 0);
    CHECK_EQ_INT(kiri_kvcache_seq_state_row(&d), row_a);
    kiri_kvcache_seq_free(c, &b);
    kiri_kvcache_seq_free(c, &d);
    kiri_kvcache_seq_free(c, &a);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 2);
    CHECK_EQ_INT(kiri_kvcache_n_free(c), 6);
    kiri_kvcache_free(c);

    /* A layer with state must keep no keys; a layer without keys must be its own source. */
    const int64_t keyed[4] = {64, 64, 0, 64};
    const struct kiri_kvcache_layout bad = {keyed, src, &st};
    CHECK_EQ_INT(kiri_kvcache_init_layers(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 4, 0, KIRI_TYPE_F16, 4, 6, NULL,
                                          &bad, &c), KIRI_E_INVALID_ARG);
    const int32_t reads[4] = {0, 1, 1, 3};
    const struct kiri_kvcache_layout bad2 = {dims, reads, NULL};
    CHECK_EQ_INT(kiri_kvcache_init_layers(&kiri_cpu_backend_iface, be, 0, NULL, NULL, 4, 0, KIRI_TYPE_F16, 4, 6, NULL,
                                          &bad2, &c), KIRI_E_INVALID_ARG);
}

/* The state of seq's slot in the hybrid layout's two recurrent layers (24 and 40 floats): set to
 * base + 100 * layer + j, and whether it holds that. */
static void set_state(struct kiri_kvcache *c, const struct kiri_kv_seq *s, float base)
{
    for (int l = 0; l < 4; l += 2) {
        const struct kiri_tensor *t = kiri_kvcache_state(c, l);
        float *row = (float *)t->data + (size_t)kiri_kvcache_seq_state_row(s) * (size_t)t->ne[0];
        for (int64_t j = 0; j < t->ne[0]; j++)
            row[j] = base + 100.0f * (float)l + (float)j;
    }
}

static int state_is(struct kiri_kvcache *c, const struct kiri_kv_seq *s, float base)
{
    int ok = kiri_kvcache_seq_state_row(s) >= 0;
    for (int l = 0; ok && l < 4; l += 2) {
        const struct kiri_tensor *t = kiri_kvcache_state(c, l);
        const float *row = (const float *)t->data + (size_t)kiri_kvcache_seq_state_row(s) * (size_t)t->ne[0];
        for (int64_t j = 0; j < t->ne[0]; j++)
            ok &= row[j] == base + 100.0f * (float)l + (float)j;
    }
    return ok;
}

/* State snapshots (the hybrid layout of test_state, two slots, two snapshots): one is taken only
 * for a published block whose end is the sequence's position, once; a prefix is shared up to the
 * last block with one, whose state lands in the new sequence's own slot, and not at all without a
 * free slot (a miss); a third snapshot evicts the least recently used; a block evicted from the
 * pool takes its snapshot along; a sequence's newer passing snapshot supersedes its older one. */
static void test_state_snapshots(void)
{
    struct kiri_kvcache *c = hybrid_cache(2);
    if (!c)
        return;
    CHECK_EQ_INT(kiri_kvcache_n_snapshots(c), 2);
    CHECK_EQ_INT(kiri_kvcache_snapshot_bytes(c), 2 * (24 + 40) * 4);
    CHECK_EQ_INT(kiri_kvcache_bytes(c), 2 * 2 * 64 * 2 * 24 + (24 + 40) * 4 * 2 + 2 * (24 + 40) * 4);
    const int32_t toks[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    const uint64_t h0 = kiri_kvcache_block_hash(0, toks, 4), h1 = kiri_kvcache_block_hash(h0, toks + 4, 4),
                   h2 = kiri_kvcache_block_hash(h1, toks + 8, 4);
    struct kiri_kv_seq a = {0}, d = {0}, e = {0}, f = {0};
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 12), 0);
    set_state(c, &a, 1000);
    a.n_tokens = 4;
    CHECK_EQ_INT(kiri_kvcache_snapshot(c, &a, 0, h0, toks, 1), 0); /* not published */
    kiri_kvcache_publish(c, &a, 0, h0, toks);
    CHECK_EQ_INT(kiri_kvcache_snapshot(c, &a, 0, h0, toks, 1), 1);
    CHECK_EQ_INT(kiri_kvcache_snapshot(c, &a, 0, h0, toks, 1), 0); /* it has one */
    set_state(c, &a, 2000);
    a.n_tokens = 8;
    kiri_kvcache_publish(c, &a, 1, h1, toks + 4);
    CHECK_EQ_INT(kiri_kvcache_snapshot(c, &a, 0, h0, toks, 1), 0); /* the state is not block 0's end */
    CHECK_EQ_INT(kiri_kvcache_snapshot(c, &a, 1, h1, toks + 4, 1), 1);
    CHECK_EQ_INT(kiri_kvcache_n_snapshots_used(c), 2);

    /* Block 2 is not cached: the prefix stops at block 1, with block 1's state. */
    uint64_t h = 0;
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &d, toks, 3, &h), 2);
    CHECK(h == h1);
    CHECK_EQ_INT(d.n_tokens, 8);
    CHECK(kiri_kvcache_seq_state_row(&d) != kiri_kvcache_seq_state_row(&a));
    CHECK(state_is(c, &d, 2000) && state_is(c, &a, 2000));
    CHECK_EQ_INT(kiri_kvcache_snapshot_hits(c), 1);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 0);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &e, toks, 1, &h), 0); /* no state slot left */
    CHECK_EQ_INT(kiri_kvcache_snapshot_misses(c), 1);
    kiri_kvcache_seq_clear(c, &d);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &e, toks, 1, &h), 1);
    CHECK(state_is(c, &e, 1000));
    kiri_kvcache_seq_clear(c, &e);

    /* A third snapshot takes the least recently used one's slot: block 1's (block 0's was used
     * since), so a prefix of two blocks is cut back to one. */
    set_state(c, &a, 3000);
    a.n_tokens = 12;
    kiri_kvcache_publish(c, &a, 2, h2, toks + 8);
    CHECK_EQ_INT(kiri_kvcache_snapshot(c, &a, 2, h2, toks + 8, 1), 1);
    CHECK_EQ_INT(kiri_kvcache_n_snapshots_used(c), 2);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &d, toks, 3, &h), 3);
    CHECK(state_is(c, &d, 3000));
    kiri_kvcache_seq_clear(c, &d);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &e, toks, 2, &h), 1);
    CHECK(state_is(c, &e, 1000));
    kiri_kvcache_seq_clear(c, &e);

    /* Blocks evicted from the pool take their snapshots with them. */
    kiri_kvcache_seq_clear(c, &a);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &f, 24), 0);
    CHECK_EQ_INT(kiri_kvcache_n_cached(c), 0);
    CHECK_EQ_INT(kiri_kvcache_n_snapshots_used(c), 0);
    kiri_kvcache_seq_clear(c, &f);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &e, toks, 2, &h), 0);

    /* A sequence keeps only its latest passing snapshot. */
    const int32_t other[8] = {9, 9, 9, 9, 8, 8, 8, 8};
    const uint64_t g0 = kiri_kvcache_block_hash(0, other, 4), g1 = kiri_kvcache_block_hash(g0, other + 4, 4);
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 8), 0);
    a.n_tokens = 4;
    kiri_kvcache_publish(c, &a, 0, g0, other);
    CHECK_EQ_INT(kiri_kvcache_snapshot(c, &a, 0, g0, other, 0), 1);
    a.n_tokens = 8;
    kiri_kvcache_publish(c, &a, 1, g1, other + 4);
    CHECK_EQ_INT(kiri_kvcache_snapshot(c, &a, 1, g1, other + 4, 0), 1);
    CHECK_EQ_INT(kiri_kvcache_n_snapshots_used(c), 1);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &d, other, 1, &h), 0);
    CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &e, other, 2, &h), 2);
    kiri_kvcache_seq_free(c, &a);
    kiri_kvcache_seq_free(c, &d);
    kiri_kvcache_seq_free(c, &e);
    kiri_kvcache_seq_free(c, &f);
    kiri_kvcache_free(c);

    /* Snapshot counts beyond the limit are refused. */
    CHECK(hybrid_cache((1 << 20) + 1) == NULL);
}

/* Fills the rows a step wrote as the recurrent ops would: the state after the step's token i
 * (position at + i) is base + position. */
static void run_state_step(struct kiri_kvcache *c, const int32_t *write, int32_t n, int32_t at, float base)
{
    for (int32_t i = 0; i < n; i++)
        for (int l = 0; l < 4; l += 2) {
            const struct kiri_tensor *t = kiri_kvcache_state(c, l);
            float *row = (float *)t->data + (size_t)write[i] * (size_t)t->ne[0];
            for (int64_t j = 0; j < t->ne[0]; j++)
                row[j] = base + (float)(at + i) + 100.0f * (float)l + (float)j;
        }
}

/* The state history that rolls back drafted tokens (six slots, blocks of 4): a step's drafts each
 * write a fresh slot, reading the one before (the first token updates the sequence's own in
 * place), and truncating to any position of the step makes the state after it current (across a
 * block boundary), giving the later ones and their blocks back; a position whose state was not
 * kept is refused, changing nothing; fewer free slots give fewer fresh ones; the history is
 * bounded (oldest dropped) and given back with the sequence. */
static void test_state_history(void)
{
    struct kiri_kvcache *c = hybrid_cache_slots(0, 6);
    if (!c)
        return;
    struct kiri_kv_seq a = {0}, b = {0};
    int32_t w[KIRI_KVCACHE_STATE_HISTORY + 2], r[KIRI_KVCACHE_STATE_HISTORY + 2];
    /* A prompt of 3: in place, nothing kept. */
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 3), 0);
    const int32_t own = kiri_kvcache_seq_state_row(&a);
    CHECK_EQ_INT(kiri_kvcache_seq_state_step(c, &a, 3, 0, w, r), 0);
    for (int i = 0; i < 3; i++)
        CHECK(w[i] == own && r[i] == own);
    run_state_step(c, w, 3, 0, 1000);
    a.n_tokens = 3;
    CHECK_EQ_INT(a.n_hist, 0);
    /* The pending token and 3 drafts, positions 3..6 (over the end of block 0). */
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 7), 0);
    CHECK_EQ_INT(kiri_kvcache_seq_state_step(c, &a, 4, 3, w, r), 3);
    CHECK(w[0] == own && r[0] == own);
    for (int i = 1; i < 4; i++) {
        CHECK_EQ_INT(r[i], w[i - 1]);
        CHECK(w[i] != own && w[i] >= 0 && w[i] < 6);
    }
    CHECK(w[1] != w[2] && w[2] != w[3] && w[1] != w[3]);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 2);
    CHECK_EQ_INT(kiri_kvcache_seq_state_row(&a), w[3]);
    run_state_step(c, w, 4, 3, 2000);
    a.n_tokens = 7;
    /* Position 1's state was never kept: refused, nothing changes. */
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 2), KIRI_E_INVALID_ARG);
    CHECK(a.n_tokens == 7 && a.n_blocks == 2 && kiri_kvcache_seq_state_row(&a) == w[3]);
    /* One draft kept: 5 positions, the state after position 4 (back in block 1). */
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 5), 0);
    CHECK(a.n_tokens == 5 && a.n_blocks == 2);
    CHECK_EQ_INT(kiri_kvcache_seq_state_row(&a), w[1]);
    CHECK(state_is(c, &a, 2000 + 4));
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 4); /* w[2], w[3] back; own kept for position 3 */
    CHECK_EQ_INT(a.n_hist, 1);
    kiri_kvcache_seq_state_forget(c, &a);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 5);
    /* No draft kept: the state after the pending token, which was updated in place. */
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 8), 0);
    const int32_t cur = kiri_kvcache_seq_state_row(&a);
    CHECK_EQ_INT(kiri_kvcache_seq_state_step(c, &a, 3, 2, w, r), 2);
    CHECK(w[0] == cur && r[0] == cur && r[1] == cur && r[2] == w[1]);
    run_state_step(c, w, 3, 5, 3000);
    a.n_tokens = 8;
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 6), 0);
    CHECK(a.n_tokens == 6 && a.n_blocks == 2 && kiri_kvcache_seq_state_row(&a) == cur);
    CHECK(state_is(c, &a, 3000 + 5));
    kiri_kvcache_seq_state_forget(c, &a);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 5);
    /* All kept: the current state stays; the same length is no change. */
    CHECK_EQ_INT(kiri_kvcache_seq_truncate(c, &a, 6), 0);
    CHECK_EQ_INT(kiri_kvcache_seq_state_row(&a), cur);
    /* Fewer free slots than drafts: fewer fresh ones, the first tokens in place. */
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &b, 1), 0);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 4);
    CHECK_EQ_INT(kiri_kvcache_seq_state_step(c, &a, 6, 6, w, r), 4);
    CHECK(w[0] == cur && w[1] == cur && r[1] == cur && r[2] == cur && w[2] != cur);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 0);
    a.n_tokens = 12;
    /* Clearing gives the history back with the slot. */
    kiri_kvcache_seq_clear(c, &a);
    CHECK_EQ_INT(a.n_hist, 0);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 5);
    /* One fresh slot a step (a draft model's loop): the history is bounded, oldest dropped. */
    CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 1), 0);
    for (int32_t p = 0; p < 2 * KIRI_KVCACHE_STATE_HISTORY; p++) {
        CHECK_EQ_INT(kiri_kvcache_seq_state_step(c, &a, 1, 1, w, r), 1);
        a.n_tokens = p + 1;
        CHECK(a.n_hist <= 4); /* 6 slots: b's, a's current, 4 kept */
        CHECK_EQ_INT(kiri_kvcache_n_state_free(c) + a.n_hist + 2, 6);
    }
    CHECK_EQ_INT(a.hist_pos[a.n_hist - 1], 2 * KIRI_KVCACHE_STATE_HISTORY - 2);
    kiri_kvcache_seq_free(c, &a);
    kiri_kvcache_seq_free(c, &b);
    CHECK_EQ_INT(kiri_kvcache_n_state_free(c), 6);
    kiri_kvcache_free(c);
}

TEST_MAIN(test_setup, test_blocks_and_slots, test_bad_shapes, test_window_pool, test_window_pool_full, test_truncate,
          test_window_prefix, test_window_none, test_layout, test_state, test_state_snapshots,
          test_state_history, test_allocation_failures, test_teardown)
