/* The served-model registry (server/models.c): reference counts across hot-swaps (a
 * retired model keeps working until its last holder releases it, H29), a swap to a
 * file that does not load keeps the old model (F14), loading on demand and LRU eviction under a
 * memory budget, and swaps racing with requests on several threads (run under ASan by the
 * sanitizer tier, where a use-after-free would show), and removing a model while a request holds it
 * (fleet manifests that drop a model). The model is the bundled stories260K. */
#include "test.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "batcher.h"
#include "kiri.h"
#include "models.h"
#include "platform.h"

#define MODEL KIRI_SOURCE_DIR "/models/stories260K.gguf"
#define SHA_A "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define SHA_B "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
#define SHA_C "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc"

static struct kiri_models *registry(uint64_t budget)
{
    struct kiri_models_params p;
    memset(&p, 0, sizeof p);
    p.backend = "cpu";
    p.n_threads = 1;
    p.n_ctx = 64;
    p.kv_type = KIRI_TYPE_F16;
    p.max_seqs = 4;
    p.chunk = 64;
    p.queue_cap = 64;
    p.memory_budget = budget;
    p.warm_up = 1;
    struct kiri_models *r = NULL;
    CHECK_EQ_INT(kiri_models_init(&p, &r), KIRI_OK);
    return r;
}

/* ---- A synchronous generation on a slot ---- */

struct wait {
    struct kiri_mutex *lock;
    struct kiri_cond *cond;
    int finish, tokens;
};

static int on_event(void *user, const struct kiri_token_event *ev)
{
    struct wait *w = user;
    kiri_platform_mutex_lock(w->lock);
    if (ev->token >= 0)
        w->tokens++;
    if (ev->finish >= 0) {
        w->finish = ev->finish;
        kiri_platform_cond_broadcast(w->cond);
    }
    kiri_platform_mutex_unlock(w->lock);
    return 0;
}

/* Generates n tokens greedily after BOS; returns the number generated, -1 on failure. */
static int generate(struct kiri_served_model *m, int n)
{
    struct wait w = {NULL, NULL, -1, 0};
    if (kiri_platform_mutex_init(&w.lock) != KIRI_OK || kiri_platform_cond_init(&w.cond) != KIRI_OK)
        return -1;
    int32_t tok = 1;
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.tokens = &tok;
    req.n_tokens = 1;
    req.max_tokens = n;
    kiri_sampling_default(&req.sampling);
    req.sampling.temperature = 0;
    uint64_t id;
    struct kiri_status_info info;
    int got = -1;
    if (kiri_batcher_submit(m->batcher, &req, on_event, &w, &id, &info) == KIRI_OK) {
        kiri_platform_mutex_lock(w.lock);
        while (w.finish < 0)
            kiri_platform_cond_timed_wait(w.cond, w.lock, 0.5);
        kiri_platform_mutex_unlock(w.lock);
        got = w.finish == KIRI_FINISH_ERROR || w.finish == KIRI_FINISH_CANCELLED ? -1 : w.tokens;
    }
    kiri_platform_cond_free(w.cond);
    kiri_platform_mutex_free(w.lock);
    return got;
}

static struct kiri_models_counts counts(struct kiri_models *r)
{
    struct kiri_models_counts c;
    kiri_models_counts(r, &c);
    return c;
}

/* ---- Tests ---- */

static void test_swap_keeps_the_old_slot_alive(void)
{
    struct kiri_models *r = registry(0);
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_models_add(r, "m", MODEL, SHA_A, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_models_add(r, "m", MODEL, SHA_B, &info), 1);   /* present: left as it is */
    struct kiri_served_model *a = NULL, *b = NULL;
    CHECK_EQ_INT(kiri_models_acquire(r, NULL, &a, &info), KIRI_OK);
    if (!a) {
        kiri_models_free(r);
        return;
    }
    CHECK_STR(a->sha256_hex, SHA_A);
    CHECK_EQ_INT(generate(a, 4), 4);
    int swapped = 0;
    CHECK_EQ_INT(kiri_models_update(r, "m", MODEL, SHA_B, &swapped, &info), KIRI_OK);
    CHECK_EQ_INT(swapped, 1);
    CHECK_EQ_INT(counts(r).swaps, 1);
    CHECK_EQ_INT(counts(r).n_loaded, 2);   /* the retired A is still held */
    CHECK_EQ_INT(kiri_models_acquire(r, "m", &b, &info), KIRI_OK);
    CHECK(b != NULL && b != a);
    if (b)
        CHECK_STR(b->sha256_hex, SHA_B);
    /* The request that held A before the swap still runs on it. */
    CHECK_EQ_INT(generate(a, 6), 6);
    kiri_models_release(r, a);
    CHECK_EQ_INT(counts(r).n_loaded, 1);
    struct kiri_models_info mi[2];
    CHECK_EQ_INT(kiri_models_snapshot(r, mi, 2), 1);
    CHECK_STR(mi[0].sha256_hex, SHA_B);
    CHECK_EQ_INT(mi[0].loaded, 1);
    /* The same hash again changes nothing. */
    CHECK_EQ_INT(kiri_models_update(r, "m", MODEL, SHA_B, &swapped, &info), KIRI_OK);
    CHECK_EQ_INT(swapped, 0);
    CHECK_EQ_INT(counts(r).swaps, 1);
    kiri_models_release(r, b);
    kiri_models_free(r);
}

static void test_swap_to_a_bad_file_keeps_the_old_model(void)
{
    char bad[] = "/tmp/kiri-test-models-XXXXXX";
    const int fd = mkstemp(bad);
    CHECK(fd >= 0);
    if (fd < 0)
        return;
    const char junk[] = "GGUF\x03\x00\x00\x00 this is not a model";
    CHECK(write(fd, junk, sizeof junk) == (ssize_t)sizeof junk);
    close(fd);
    struct kiri_models *r = registry(0);
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_models_add(r, "m", MODEL, SHA_A, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_models_load(r, "m", &info), KIRI_OK);
    int swapped = 1;
    CHECK(kiri_models_update(r, "m", bad, SHA_C, &swapped, &info) != KIRI_OK);
    CHECK_EQ_INT(swapped, 0);
    CHECK_EQ_INT(counts(r).load_failures, 1);
    struct kiri_served_model *m = NULL;
    CHECK_EQ_INT(kiri_models_acquire(r, "m", &m, &info), KIRI_OK);
    if (m) {
        CHECK_STR(m->sha256_hex, SHA_A);
        CHECK_EQ_INT(generate(m, 3), 3);
        kiri_models_release(r, m);
    }
    /* The refused hash is not tried again; another one is. */
    CHECK_EQ_INT(kiri_models_update(r, "m", bad, SHA_C, &swapped, &info), KIRI_OK);
    CHECK_EQ_INT(counts(r).load_failures, 1);
    CHECK_EQ_INT(kiri_models_update(r, "m", MODEL, SHA_B, &swapped, &info), KIRI_OK);
    CHECK_EQ_INT(swapped, 1);
    /* A model that never loaded reports the error to its request and stays unloaded. */
    CHECK_EQ_INT(kiri_models_add(r, "broken", bad, NULL, &info), KIRI_OK);
    CHECK(kiri_models_acquire(r, "broken", &m, &info) != KIRI_OK);
    CHECK_EQ_INT(counts(r).load_failures, 2);
    /* The next request within the retry delay is answered at once, without another attempt. */
    CHECK_EQ_INT(kiri_models_acquire(r, "broken", &m, &info), KIRI_E_BUSY);
    CHECK(strstr(info.message, "failed to load") != NULL);
    CHECK_EQ_INT(counts(r).load_failures, 2);
    kiri_models_free(r);

    /* After a restart with that bad file installed, the version the fleet kept as .prev serves. */
    char prev[sizeof bad + 8];
    snprintf(prev, sizeof prev, "%s.prev", bad);
    CHECK_EQ_INT(symlink(MODEL, prev), 0);
    r = registry(0);
    CHECK_EQ_INT(kiri_models_add(r, "m", bad, SHA_C, &info), KIRI_OK);
    m = NULL;
    CHECK_EQ_INT(kiri_models_acquire(r, "m", &m, &info), KIRI_OK);
    CHECK_EQ_INT(counts(r).load_failures, 1);
    if (m) {
        CHECK_STR(m->sha256_hex, "");
        CHECK_EQ_INT(generate(m, 3), 3);
        kiri_models_release(r, m);
    }
    /* The next sync names the same bad file again: not retried. */
    CHECK_EQ_INT(kiri_models_update(r, "m", bad, SHA_C, &swapped, &info), KIRI_OK);
    CHECK_EQ_INT(swapped, 0);
    CHECK_EQ_INT(counts(r).load_failures, 1);
    kiri_models_free(r);
    unlink(prev);
    unlink(bad);
}

static void test_unknown_and_default(void)
{
    struct kiri_models *r = registry(0);
    struct kiri_status_info info;
    struct kiri_served_model *m = NULL;
    CHECK_EQ_INT(kiri_models_acquire(r, NULL, &m, &info), KIRI_E_INVALID_ARG);   /* none yet */
    CHECK_STR(info.field, "model");
    CHECK_EQ_INT(kiri_models_has(r, NULL), 0);
    CHECK_EQ_INT(kiri_models_add(r, "one", MODEL, NULL, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_models_add(r, "two", MODEL, NULL, &info), KIRI_OK);
    CHECK(kiri_models_add(r, "", MODEL, NULL, &info) < 0);
    CHECK_EQ_INT(kiri_models_acquire(r, "three", &m, &info), KIRI_E_INVALID_ARG);
    char def[KIRI_MODELS_ID_MAX];
    kiri_models_default_id(r, def);
    CHECK_STR(def, "one");
    kiri_models_set_default(r, "two");
    kiri_models_default_id(r, def);
    CHECK_STR(def, "two");
    char ids[4][KIRI_MODELS_ID_MAX];
    CHECK_EQ_INT(kiri_models_list(r, ids, 4), 2);
    CHECK_STR(ids[0], "one");
    CHECK_STR(ids[1], "two");
    CHECK(kiri_models_acquire_loaded(r, "two") == NULL);   /* not loaded: no load */
    kiri_models_free(r);
}

static void test_budget_evicts_the_idle_model(void)
{
    struct kiri_models *r = registry(1);   /* one byte: one model at a time */
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_models_add(r, "a", MODEL, NULL, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_models_add(r, "b", MODEL, NULL, &info), KIRI_OK);
    struct kiri_served_model *a = NULL, *b = NULL;
    CHECK_EQ_INT(kiri_models_load(r, "a", &info), KIRI_OK);
    CHECK_EQ_INT(kiri_models_acquire(r, "b", &b, &info), KIRI_OK);   /* a is idle: unloaded */
    CHECK_EQ_INT(counts(r).evictions, 1);
    CHECK_EQ_INT(counts(r).n_loaded, 1);
    CHECK(kiri_models_acquire_loaded(r, "a") == NULL);
    /* b is held: a cannot be loaded within the budget. */
    const double t0 = kiri_platform_now();
    CHECK_EQ_INT(kiri_models_acquire(r, "a", &a, &info), KIRI_E_BUSY);
    CHECK(kiri_platform_now() - t0 < 5.0);
    kiri_models_release(r, b);
    CHECK_EQ_INT(kiri_models_acquire(r, "a", &a, &info), KIRI_OK);
    CHECK_EQ_INT(counts(r).evictions, 2);
    if (a) {
        CHECK_EQ_INT(generate(a, 2), 2);
        kiri_models_release(r, a);
    }
    CHECK(counts(r).bytes_used > 0);
    kiri_models_free(r);
}

/* ---- Swaps racing with requests ---- */

struct racer {
    struct kiri_models *r;
    atomic_int *stop;   /* atomic: set by the main thread while the racers read it */
    int ok, failed;
};

static void race(void *arg)
{
    struct racer *rc = arg;
    for (int i = 0; i < 400 && !atomic_load(rc->stop); i++) {
        struct kiri_served_model *m = NULL;
        struct kiri_status_info info;
        if (kiri_models_acquire(rc->r, NULL, &m, &info) != KIRI_OK) {
            rc->failed++;
            continue;
        }
        if (generate(m, 3) == 3)
            rc->ok++;
        else
            rc->failed++;
        kiri_models_release(rc->r, m);
    }
}

static void test_swaps_race_with_requests(void)
{
    struct kiri_models *r = registry(0);
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_models_add(r, "m", MODEL, SHA_A, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_models_load(r, "m", &info), KIRI_OK);
    atomic_int stop = 0;
    struct racer rc[3];
    struct kiri_thread *t[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        rc[i] = (struct racer){r, &stop, 0, 0};
        CHECK_EQ_INT(kiri_platform_thread_start(&t[i], race, &rc[i]), KIRI_OK);
    }
    const char *shas[2] = {SHA_B, SHA_A};
    int swaps = 0;
    for (int i = 0; i < 6; i++) {
        int swapped = 0;
        CHECK_EQ_INT(kiri_models_update(r, "m", MODEL, shas[i % 2], &swapped, &info), KIRI_OK);
        swaps += swapped;
        kiri_platform_sleep(0.02);
    }
    atomic_store(&stop, 1);
    int ok = 0, failed = 0;
    for (int i = 0; i < 3; i++) {
        if (t[i])
            kiri_platform_thread_join(t[i]);
        ok += rc[i].ok;
        failed += rc[i].failed;
    }
    CHECK_EQ_INT(swaps, 6);
    CHECK_EQ_INT(failed, 0);
    CHECK(ok > 0);
    CHECK_EQ_INT(counts(r).n_loaded, 1);   /* every retired slot was freed */
    printf("  swaps racing with requests: %d swaps, %d requests served, %d failed\n", swaps, ok, failed);
    kiri_models_free(r);
}

/* A model a fleet manifest no longer names leaves the registry at once (lists, lookups, the
 * default), while a request that holds it finishes on it; its slot is freed at the last release,
 * and a scan of the directory leaves out the ids it is told to. */
static void test_remove_while_held(void)
{
    struct kiri_models *r = registry(0);
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_models_add(r, "x", MODEL, SHA_A, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_models_add(r, "y", MODEL, SHA_B, &info), KIRI_OK);
    struct kiri_served_model *x = NULL;
    CHECK_EQ_INT(kiri_models_acquire(r, "x", &x, &info), KIRI_OK);
    if (!x) {
        kiri_models_free(r);
        return;
    }
    CHECK_EQ_INT(kiri_models_in_use(r, "x"), 1);
    CHECK_EQ_INT(kiri_models_in_use(r, "y"), 0);
    CHECK_EQ_INT(kiri_models_remove(r, "x", &info), KIRI_OK);
    CHECK_EQ_INT(kiri_models_remove(r, "x", &info), 1);   /* gone already */
    CHECK_EQ_INT(kiri_models_has(r, "x"), 0);
    char ids[4][KIRI_MODELS_ID_MAX];
    CHECK_EQ_INT(kiri_models_list(r, ids, 4), 1);
    CHECK_STR(ids[0], "y");
    char def[KIRI_MODELS_ID_MAX];
    kiri_models_default_id(r, def);
    CHECK_STR(def, "y");   /* x was the default */
    struct kiri_served_model *again = NULL;
    CHECK_EQ_INT(kiri_models_acquire(r, "x", &again, &info), KIRI_E_INVALID_ARG);
    CHECK(again == NULL);
    /* The holder keeps a working model until it releases it. */
    CHECK_EQ_INT(kiri_models_in_use(r, "x"), 1);
    CHECK_EQ_INT(counts(r).n_loaded, 1);
    CHECK_EQ_INT(generate(x, 4), 4);
    kiri_models_release(r, x);
    CHECK_EQ_INT(kiri_models_in_use(r, "x"), 0);
    CHECK_EQ_INT(counts(r).n_loaded, 0);
    /* Removing an idle loaded model frees it at once. */
    CHECK_EQ_INT(kiri_models_load(r, "y", &info), KIRI_OK);
    CHECK_EQ_INT(counts(r).n_loaded, 1);
    CHECK_EQ_INT(kiri_models_remove(r, "y", &info), KIRI_OK);
    CHECK_EQ_INT(counts(r).n_loaded, 0);
    CHECK_EQ_INT(kiri_models_has(r, NULL), 0);   /* no default left */
    CHECK_EQ_INT(kiri_models_remove(r, NULL, &info), 1);
    /* A scan leaves out the ids given. */
    char dir[] = "/tmp/kiri-test-models-dir-XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0);
        kiri_models_free(r);
        return;
    }
    char pa[64], pb[64];
    snprintf(pa, sizeof pa, "%s/kept.gguf", dir);
    snprintf(pb, sizeof pb, "%s/gone.gguf", dir);
    FILE *f1 = fopen(pa, "w"), *f2 = fopen(pb, "w");
    CHECK(f1 && f2);
    if (f1)
        fclose(f1);
    if (f2)
        fclose(f2);
    const char *skip[] = {"gone"};
    CHECK_EQ_INT(kiri_models_scan_dir_except(r, dir, skip, 1, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_models_has(r, "kept"), 1);
    CHECK_EQ_INT(kiri_models_has(r, "gone"), 0);
    unlink(pa);
    unlink(pb);
    rmdir(dir);
    kiri_models_free(r);
}

TEST_MAIN(test_swap_keeps_the_old_slot_alive, test_swap_to_a_bad_file_keeps_the_old_model, test_unknown_and_default,
          test_budget_evicts_the_idle_model, test_swaps_race_with_requests, test_remove_while_held)
