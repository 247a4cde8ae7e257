/* The served-model registry (models.h): entries by id, slots with reference counts, loading on
 * demand under a memory budget, and hot-swaps that never free a model a request still holds.
 *
 * Loading (seconds for a large model) happens outside the lock, by the thread that asked for it,
 * with the entry marked busy so that a second request for the same model waits for the first
 * load instead of starting another one. Freeing a slot (joining its batching thread, unmapping the
 * file) also happens outside the lock, by whoever dropped its last reference.
 */
#include "models.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chat_prompt.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "names.h"
#include "platform.h"

#define LOAD_WAIT_S 120.0    /* longest wait for another thread's load of the same model */
#define WARM_UP_WAIT_S 120.0
#define ROOM_WAIT_S 1.0      /* how long a load waits for models in use to go idle */
#define RETRY_S 10.0         /* a model that failed to load is not tried again sooner */

struct entry {
    char id[KIRI_MODELS_ID_MAX];
    char path[1024];
    char sha256_hex[65];                /* of the file at path as far as known, "" unknown */
    char rejected_sha256[65];           /* a file that failed to load in a swap: not tried again */
    struct kiri_served_model *slot;     /* published slot or NULL */
    int busy;                           /* a load or swap of this entry runs */
    double failed_at;                   /* when a load on demand last failed, 0 never */
    char failed_msg[160];
};

struct kiri_models {
    struct kiri_models_params p;
    struct kiri_mutex *lock;            /* owned; guards everything below and every slot's refs */
    struct kiri_cond *cond;             /* owned; broadcast when a load or swap ends */
    struct entry *e[KIRI_MODELS_MAX];   /* owned, n of them, in the order added */
    int n;
    int def;                            /* index of the default entry, -1 when none */
    uint64_t used;                      /* bytes of every slot not yet freed */
    struct kiri_served_model *retired;  /* unpublished slots still held by requests */
    struct kiri_models_counts counts;
};

__attribute__((format(printf, 2, 3))) static void logf_(const struct kiri_models *r, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (r->p.log)
        r->p.log(r->p.log_user, line);
}

/* ---------------------------------------------------------------------------------------------
 * Slots
 * ------------------------------------------------------------------------------------------- */

static void slot_free(struct kiri_served_model *m)
{
    if (!m)
        return;
    if (m->batcher) {
        kiri_batcher_stop(m->batcher, 1);
        kiri_batcher_free(m->batcher);
    }
    kiri_chat_prompt_free(m->chat);
    kiri_model_close(m->draft); /* after the batcher that drafted with it */
    kiri_model_close(m->model);
    kiri_mem_free(m);
}

struct warm {
    struct kiri_mutex *lock;
    struct kiri_cond *cond;
    int finish;   /* -1 until the final event */
};

static int warm_event(void *user, const struct kiri_token_event *ev)
{
    struct warm *w = user;
    if (ev->finish >= 0) {
        kiri_platform_mutex_lock(w->lock);
        w->finish = ev->finish;
        kiri_platform_cond_broadcast(w->cond);
        kiri_platform_mutex_unlock(w->lock);
    }
    return 0;
}

/* One token through the whole model: a file whose header parses but whose weights cannot run
 * (F14) fails here, before it replaces a model that works. */
static int warm_up(struct kiri_served_model *m, struct kiri_status_info *info)
{
    struct warm w = {NULL, NULL, -1};
    if (kiri_platform_mutex_init(&w.lock) != KIRI_OK || kiri_platform_cond_init(&w.cond) != KIRI_OK) {
        kiri_platform_mutex_free(w.lock);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    }
    const int32_t bos = kiri_model_bos(m->model);
    int32_t tok = bos >= 0 ? bos : 0;
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.tokens = &tok;
    req.n_tokens = 1;
    req.max_tokens = 1;
    kiri_sampling_default(&req.sampling);
    req.sampling.temperature = 0;
    uint64_t id;
    int rc = kiri_batcher_submit(m->batcher, &req, warm_event, &w, &id, info);
    if (rc == KIRI_OK) {
        const double end = kiri_platform_now() + WARM_UP_WAIT_S;
        kiri_platform_mutex_lock(w.lock);
        while (w.finish < 0) {
            if (kiri_platform_now() > end) {
                /* The final event still comes: wait for it, or w goes out of scope under it. */
                kiri_platform_mutex_unlock(w.lock);
                kiri_batcher_cancel(m->batcher, id);
                kiri_platform_mutex_lock(w.lock);
                while (w.finish < 0)
                    kiri_platform_cond_timed_wait(w.cond, w.lock, 0.5);
                break;
            }
            kiri_platform_cond_timed_wait(w.cond, w.lock, 0.5);
        }
        kiri_platform_mutex_unlock(w.lock);
        if (w.finish == KIRI_FINISH_ERROR || w.finish == KIRI_FINISH_CANCELLED)
            rc = kiri_error_set(info, KIRI_E_BACKEND, "the warm-up forward pass failed");
    }
    kiri_platform_cond_free(w.cond);
    kiri_platform_mutex_free(w.lock);
    return rc;
}

static int slot_load(const struct kiri_models *r, const char *id, const char *path, const char *sha,
                     struct kiri_served_model **out, struct kiri_status_info *info)
{
    struct kiri_served_model *m = kiri_mem_calloc(1, sizeof *m);
    if (!m)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    snprintf(m->id, sizeof m->id, "%s", id);
    snprintf(m->sha256_hex, sizeof m->sha256_hex, "%s", sha ? sha : "");
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.backend = r->p.backend && r->p.backend[0] ? r->p.backend : "auto";
    mp.n_threads = r->p.n_threads;
    mp.gpu_layers = r->p.gpu_layers;
    mp.cpu_kernels = r->p.cpu_kernels;
    int rc = kiri_model_open(path, &mp, &m->model, info);
    if (rc != KIRI_OK) {
        kiri_mem_free(m);
        return rc;
    }
    struct kiri_batcher_params bp;
    kiri_batcher_params_default(&bp);
    bp.n_ctx = r->p.n_ctx;
    bp.kv_memory = (size_t)r->p.kv_memory;
    bp.max_seqs = r->p.max_seqs;
    bp.chunk = r->p.chunk;
    bp.queue_cap = r->p.queue_cap;
    bp.kv_type = r->p.kv_type;
    bp.spec_max_seqs = r->p.spec_max_seqs;
    bp.spec_states = r->p.speculative ? -1 : 0;
    bp.mtp = r->p.mtp == 1 || (r->p.mtp == 2 && kiri_model_has_mtp(m->model));
    if (!bp.spec_max_seqs)
        bp.draft_rows = 0;
    if (r->p.draft_model && r->p.draft_model[0]) {
        if ((rc = kiri_model_open(r->p.draft_model, &mp, &m->draft, info)) != KIRI_OK)
            goto fail;
        bp.draft_model = m->draft;
    }
    if ((rc = kiri_batcher_init(m->model, &bp, &m->batcher, info)) != KIRI_OK)
        goto fail;
    m->n_ctx = kiri_batcher_n_ctx(m->batcher);
    /* The chat template from the file, or ChatML when it has none or it does not parse. */
    if ((rc = kiri_chat_prompt_init(m->model, &m->chat, info)) != KIRI_OK)
        goto fail;
    if (kiri_chat_prompt_fallback(m->chat))
        logf_(r, "model %s: %s; using ChatML", id, kiri_chat_prompt_fallback(m->chat));
    if ((rc = kiri_batcher_start(m->batcher)) != KIRI_OK) {
        rc = kiri_error_set(info, rc, "cannot start the batching thread");
        goto fail;
    }
    if (r->p.warm_up && (rc = warm_up(m, info)) != KIRI_OK)
        goto fail;
    struct kiri_batcher_stats st;
    kiri_batcher_get_stats(m->batcher, &st);
    m->cost = kiri_model_file_bytes(m->model) + st.kv_bytes;
    /* A split (--gpu-layers below the layer count) runs on two backends, both named. */
    snprintf(m->backend, sizeof m->backend, "%s", kiri_model_backend_name(m->model));
    *out = m;
    return KIRI_OK;
fail:
    slot_free(m);
    return rc;
}

/* Drops one reference under the lock; returns the slot when that was the last (the caller frees
 * it after unlocking). */
static struct kiri_served_model *unref_locked(struct kiri_models *r, struct kiri_served_model *m)
{
    if (--m->refs > 0)
        return NULL;
    for (struct kiri_served_model **p = &r->retired; *p; p = &(*p)->next_retired)
        if (*p == m) {
            *p = m->next_retired;
            break;
        }
    r->used -= m->cost <= r->used ? m->cost : r->used;
    r->counts.n_loaded--;
    return m;
}

/* Takes the entry's slot out of service (under the lock); returns it when it is to be freed. */
static struct kiri_served_model *unpublish_locked(struct kiri_models *r, struct entry *e)
{
    struct kiri_served_model *m = e->slot;
    if (!m)
        return NULL;
    e->slot = NULL;
    m->published = 0;
    if (m->refs > 1) {
        m->next_retired = r->retired;
        r->retired = m;
    }
    return unref_locked(r, m);
}

/* Publishes a new slot (under the lock) with the caller's reference too when hold is set. */
static void publish_locked(struct kiri_models *r, struct entry *e, struct kiri_served_model *m, int hold)
{
    m->refs = 1 + (hold != 0);
    m->published = 1;
    m->last_used = kiri_platform_now();
    e->slot = m;
    r->used += m->cost;
    r->counts.n_loaded++;
    r->counts.loads++;
}

/* ---------------------------------------------------------------------------------------------
 * The registry
 * ------------------------------------------------------------------------------------------- */

int kiri_models_init(const struct kiri_models_params *p, struct kiri_models **out)
{
    struct kiri_models *r = kiri_mem_calloc(1, sizeof *r);
    if (!r)
        return KIRI_E_NOMEM;
    r->p = *p;
    r->def = -1;
    if (kiri_platform_mutex_init(&r->lock) != KIRI_OK || kiri_platform_cond_init(&r->cond) != KIRI_OK) {
        kiri_platform_mutex_free(r->lock);
        kiri_mem_free(r);
        return KIRI_E_NOMEM;
    }
    *out = r;
    return KIRI_OK;
}

void kiri_models_free(struct kiri_models *r)
{
    if (!r)
        return;
    for (int i = 0; i < r->n; i++) {
        /* Requests have ended by now (the server stopped its listener first); a slot still held
         * would be a bug, and is freed regardless so its thread does not outlive the process. */
        if (r->e[i]->slot)
            slot_free(r->e[i]->slot);
        kiri_mem_free(r->e[i]);
    }
    while (r->retired) {
        struct kiri_served_model *m = r->retired;
        r->retired = m->next_retired;
        slot_free(m);
    }
    kiri_platform_cond_free(r->cond);
    kiri_platform_mutex_free(r->lock);
    kiri_mem_free(r);
}

void kiri_models_stop(struct kiri_models *r)
{
    struct kiri_served_model *held[KIRI_MODELS_MAX];
    int n = 0;
    kiri_platform_mutex_lock(r->lock);
    for (int i = 0; i < r->n; i++)
        if (r->e[i]->slot) {
            held[n] = r->e[i]->slot;
            held[n++]->refs++;
        }
    for (struct kiri_served_model *m = r->retired; m && n < KIRI_MODELS_MAX; m = m->next_retired) {
        held[n] = m;
        held[n++]->refs++;
    }
    kiri_platform_mutex_unlock(r->lock);
    for (int i = 0; i < n; i++) {
        kiri_batcher_stop(held[i]->batcher, 0);
        kiri_models_release(r, held[i]);
    }
}

static struct entry *find_locked(struct kiri_models *r, const char *id)
{
    if (!id || !id[0])
        return r->def >= 0 ? r->e[r->def] : NULL;
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->e[i]->id, id) == 0)
            return r->e[i];
    return NULL;
}

static int add_locked(struct kiri_models *r, const char *id, const char *path, const char *sha,
                      struct kiri_status_info *info)
{
    if (find_locked(r, id) && id[0])
        return 1;
    if (!id[0] || strlen(id) >= KIRI_MODELS_ID_MAX)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "a model id must have 1 to %d bytes", KIRI_MODELS_ID_MAX - 1);
    if (strlen(path) >= sizeof r->e[0]->path)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the model path is too long");
    if (r->n == KIRI_MODELS_MAX)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "at most %d models", KIRI_MODELS_MAX);
    struct entry *e = kiri_mem_calloc(1, sizeof *e);
    if (!e)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    snprintf(e->id, sizeof e->id, "%s", id);
    snprintf(e->path, sizeof e->path, "%s", path);
    snprintf(e->sha256_hex, sizeof e->sha256_hex, "%s", sha ? sha : "");
    r->e[r->n++] = e;
    if (r->def < 0)
        r->def = r->n - 1;
    return KIRI_OK;
}

int kiri_models_add(struct kiri_models *r, const char *id, const char *path, const char *sha256_hex,
                    struct kiri_status_info *info)
{
    kiri_platform_mutex_lock(r->lock);
    const int rc = add_locked(r, id, path, sha256_hex, info);
    kiri_platform_mutex_unlock(r->lock);
    return rc;
}

struct scan {
    struct kiri_models *r;
    const char *dir;
    const char *const *skip;
    int n_skip;
};

static int scan_one(void *user, const char *name)
{
    struct scan *sc = user;
    const size_t n = strlen(name);
    if (!kiri_model_file_ok(name))
        return 0;
    char path[1024], id[KIRI_MODELS_ID_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", sc->dir, name) >= sizeof path)
        return 0;
    uint64_t size;
    struct kiri_status_info info;
    if (kiri_platform_file_size(path, &size, &info) != KIRI_OK)
        return 0;   /* not a regular file */
    snprintf(id, sizeof id, "%.*s", (int)(n - 5), name);
    for (int i = 0; i < sc->n_skip; i++)
        if (strcmp(sc->skip[i], id) == 0)
            return 0;
    if (kiri_models_add(sc->r, id, path, NULL, &info) == KIRI_OK)
        logf_(sc->r, "model %s: found %s", id, path);
    return 0;
}

int kiri_models_scan_dir_except(struct kiri_models *r, const char *dir, const char *const *skip, int n_skip,
                                struct kiri_status_info *info)
{
    struct scan sc = {r, dir, skip, skip ? n_skip : 0};
    return kiri_platform_list_dir(dir, scan_one, &sc, info);
}

int kiri_models_scan_dir(struct kiri_models *r, const char *dir, struct kiri_status_info *info)
{
    return kiri_models_scan_dir_except(r, dir, NULL, 0, info);
}

void kiri_models_set_default(struct kiri_models *r, const char *id)
{
    kiri_platform_mutex_lock(r->lock);
    for (int i = 0; i < r->n; i++)
        if (strcmp(r->e[i]->id, id) == 0)
            r->def = i;
    kiri_platform_mutex_unlock(r->lock);
}

/* Unloads idle models, least recently used first, until need more bytes fit the budget (under
 * the lock). The slots to free are appended to victims (KIRI_MODELS_MAX entries, *n_victims
 * used: each entry is unloaded once, so it never overflows). Returns 0 when it fits (or nothing
 * else is loaded), -1 when models in use hold the budget. */
static int make_room_locked(struct kiri_models *r, const struct entry *keep, uint64_t need,
                            struct kiri_served_model **victims, int *n_victims)
{
    if (!r->p.memory_budget)
        return 0;
    while (r->used + need > r->p.memory_budget) {
        struct entry *lru = NULL;
        for (int i = 0; i < r->n; i++) {
            struct entry *e = r->e[i];
            if (e == keep || e->busy || !e->slot || e->slot->refs != 1)
                continue;
            if (!lru || e->slot->last_used < lru->slot->last_used)
                lru = e;
        }
        if (!lru)
            return r->used == 0 ? 0 : -1;
        logf_(r, "model %s: unloaded to make room (memory budget %llu bytes)", lru->id,
              (unsigned long long)r->p.memory_budget);
        r->counts.evictions++;
        struct kiri_served_model *dead = unpublish_locked(r, lru);
        if (dead && *n_victims < KIRI_MODELS_MAX)
            victims[(*n_victims)++] = dead;
    }
    return 0;
}

/* The memory a model will take before it is loaded: its file, and the KV pool when it is set. */
static uint64_t estimate(const struct kiri_models *r, const char *path)
{
    uint64_t size = 0;
    struct kiri_status_info info;
    if (kiri_platform_file_size(path, &size, &info) != KIRI_OK)
        size = 0;
    return size + r->p.kv_memory;
}

/* Loads e (the caller set e->busy and holds no lock) and publishes it; hold: keep a reference. */
static int load_entry(struct kiri_models *r, struct entry *e, int hold, struct kiri_served_model **out,
                      struct kiri_status_info *info)
{
    char id[KIRI_MODELS_ID_MAX], path[1024], sha[65];
    kiri_platform_mutex_lock(r->lock);
    memcpy(id, e->id, sizeof id);
    memcpy(path, e->path, sizeof path);
    memcpy(sha, e->sha256_hex, sizeof sha);
    struct kiri_served_model *victims[KIRI_MODELS_MAX];
    int n_victims = 0;
    /* A request that has just been answered may not have released its model yet: wait a moment
     * for models in use to go idle before refusing. */
    const double end = kiri_platform_now() + ROOM_WAIT_S;
    int room;
    while ((room = make_room_locked(r, e, estimate(r, path), victims, &n_victims)) != 0 && kiri_platform_now() < end)
        kiri_platform_cond_timed_wait(r->cond, r->lock, 0.05);
    kiri_platform_mutex_unlock(r->lock);
    for (int i = 0; i < n_victims; i++)
        slot_free(victims[i]);
    int rc, fell_back = 0;
    struct kiri_served_model *m = NULL;
    if (room != 0) {
        rc = kiri_error_set(info, KIRI_E_BUSY, "the memory budget is held by models in use; retry later");
    } else {
        logf_(r, "model %s: loading %s", id, path);
        const double t0 = kiri_platform_now();
        rc = slot_load(r, id, path, sha, &m, info);
        char placement[320];
        if (rc == KIRI_OK)
            kiri_model_describe_placement(m->model, placement, sizeof placement);
        if (rc == KIRI_OK && strchr(m->backend, '+'))
            logf_(r, "model %s: loaded in %.2f s (%s: %s; context %d, %.1f MiB)", id, kiri_platform_now() - t0,
                  m->backend, placement, (int)m->n_ctx, (double)m->cost / 1048576.0);
        else if (rc == KIRI_OK)
            logf_(r, "model %s: loaded in %.2f s (%s, context %d, %.1f MiB)", id, kiri_platform_now() - t0,
                  m->backend, (int)m->n_ctx, (double)m->cost / 1048576.0);
        else
            logf_(r, "model %s: cannot load %s: %s", id, path, info->message);
        /* A fleet sync keeps the version it replaced as PATH.prev: when the installed file does
         * not load (F14, found at a restart), the previous version serves (its hash unknown)
         * until a manifest names a file that loads. */
        char prev[sizeof path + 8];
        uint64_t size;
        struct kiri_status_info pi;
        if (rc != KIRI_OK && rc != KIRI_E_NOMEM && (size_t)snprintf(prev, sizeof prev, "%s.prev", path) < sizeof prev &&
            kiri_platform_file_size(prev, &size, &pi) == KIRI_OK && slot_load(r, id, prev, "", &m, &pi) == KIRI_OK) {
            logf_(r, "model %s: serving the previous version %s instead", id, prev);
            fell_back = 1;
            rc = KIRI_OK;
        }
    }
    kiri_platform_mutex_lock(r->lock);
    e->busy = 0;
    if (fell_back) {
        r->counts.load_failures++;
        snprintf(e->rejected_sha256, sizeof e->rejected_sha256, "%s", sha);
    }
    if (rc == KIRI_OK) {
        publish_locked(r, e, m, hold);
        e->failed_at = 0;
    } else if (room == 0) {
        r->counts.load_failures++;
        e->failed_at = kiri_platform_now();
        snprintf(e->failed_msg, sizeof e->failed_msg, "%.159s", info->message);
    }
    kiri_platform_cond_broadcast(r->cond);
    kiri_platform_mutex_unlock(r->lock);
    if (rc == KIRI_OK && out)
        *out = m;
    if (fell_back)
        kiri_error_clear(info);
    return rc;
}

int kiri_models_acquire(struct kiri_models *r, const char *id, struct kiri_served_model **out,
                        struct kiri_status_info *info)
{
    kiri_error_clear(info);
    kiri_platform_mutex_lock(r->lock);
    struct entry *e = find_locked(r, id);
    if (!e) {
        kiri_platform_mutex_unlock(r->lock);
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "model", -1, "no such model");
    }
    const double end = kiri_platform_now() + LOAD_WAIT_S;
    for (;;) {
        if (e->slot) {
            e->slot->refs++;
            e->slot->last_used = kiri_platform_now();
            *out = e->slot;
            kiri_platform_mutex_unlock(r->lock);
            return KIRI_OK;
        }
        if (!e->busy) {
            /* A file that just failed to load (a slow failure, such as a large model whose
             * warm-up fails, would otherwise be retried by every request) waits a while. */
            const double ago = kiri_platform_now() - e->failed_at;
            if (e->failed_at > 0 && ago < RETRY_S) {
                const int rc = kiri_error_set(info, KIRI_E_BUSY,
                                              "the model failed to load %.0f s ago (%s); it is tried again after %.0f s",
                                              ago, e->failed_msg, RETRY_S);
                kiri_platform_mutex_unlock(r->lock);
                return rc;
            }
            break;
        }
        if (kiri_platform_now() > end) {
            kiri_platform_mutex_unlock(r->lock);
            return kiri_error_set(info, KIRI_E_BUSY, "the model is loading; retry later");
        }
        kiri_platform_cond_timed_wait(r->cond, r->lock, 0.5);
        /* The entry may have been removed while the lock was let go. */
        if (!(e = find_locked(r, id))) {
            kiri_platform_mutex_unlock(r->lock);
            return kiri_error_at(info, KIRI_E_INVALID_ARG, "model", -1, "no such model");
        }
    }
    e->busy = 1;
    kiri_platform_mutex_unlock(r->lock);
    return load_entry(r, e, 1, out, info);
}

struct kiri_served_model *kiri_models_acquire_loaded(struct kiri_models *r, const char *id)
{
    kiri_platform_mutex_lock(r->lock);
    struct entry *e = find_locked(r, id);
    struct kiri_served_model *m = e ? e->slot : NULL;
    if (m)
        m->refs++;
    kiri_platform_mutex_unlock(r->lock);
    return m;
}

void kiri_models_release(struct kiri_models *r, struct kiri_served_model *m)
{
    if (!m)
        return;
    kiri_platform_mutex_lock(r->lock);
    m->last_used = kiri_platform_now();
    struct kiri_served_model *dead = unref_locked(r, m);
    if (m->refs == 1)
        kiri_platform_cond_broadcast(r->cond);   /* idle now: a load waiting for room may go on */
    kiri_platform_mutex_unlock(r->lock);
    if (dead) {
        logf_(r, "model %s: the retired slot's last request ended; freed", dead->id);
        slot_free(dead);
    }
}

int kiri_models_load(struct kiri_models *r, const char *id, struct kiri_status_info *info)
{
    struct kiri_served_model *m = NULL;
    const int rc = kiri_models_acquire(r, id, &m, info);
    if (rc == KIRI_OK)
        kiri_models_release(r, m);
    return rc;
}

int kiri_models_update(struct kiri_models *r, const char *id, const char *path, const char *sha256_hex,
                       int *swapped, struct kiri_status_info *info)
{
    kiri_error_clear(info);
    *swapped = 0;
    const char *sha = sha256_hex ? sha256_hex : "";
    kiri_platform_mutex_lock(r->lock);
    struct entry *e = find_locked(r, id);
    if (!e || !id[0]) {
        const int rc = add_locked(r, id, path, sha, info);
        kiri_platform_mutex_unlock(r->lock);
        return rc < 0 ? rc : KIRI_OK;
    }
    const double end = kiri_platform_now() + LOAD_WAIT_S;
    while (e && e->busy && kiri_platform_now() < end) {
        kiri_platform_cond_timed_wait(r->cond, r->lock, 0.5);
        e = find_locked(r, id);
    }
    if (!e || e->busy) {
        kiri_platform_mutex_unlock(r->lock);
        return kiri_error_set(info, KIRI_E_BUSY, "model %s is %s", id, e ? "loading" : "being removed");
    }
    if (!e->slot) {
        /* Not loaded: the next load reads the new file. */
        snprintf(e->path, sizeof e->path, "%s", path);
        snprintf(e->sha256_hex, sizeof e->sha256_hex, "%s", sha);
        e->rejected_sha256[0] = '\0';
        e->failed_at = 0;   /* a new file: the next request tries it */
        kiri_platform_mutex_unlock(r->lock);
        return KIRI_OK;
    }
    if ((sha[0] && strcmp(e->slot->sha256_hex, sha) == 0) || (sha[0] && strcmp(e->rejected_sha256, sha) == 0)) {
        kiri_platform_mutex_unlock(r->lock);
        return KIRI_OK;
    }
    e->busy = 1;
    const uint64_t need = estimate(r, path);
    struct kiri_served_model *victims[KIRI_MODELS_MAX];
    int n_victims = 0;
    if (make_room_locked(r, e, need, victims, &n_victims) != 0)
        logf_(r, "model %s: the swap goes over the memory budget for a while (both versions loaded)", id);
    kiri_platform_mutex_unlock(r->lock);
    for (int i = 0; i < n_victims; i++)
        slot_free(victims[i]);

    logf_(r, "model %s: loading the new version %.16s from %s beside the one in service", id, sha, path);
    const double t0 = kiri_platform_now();
    struct kiri_served_model *m = NULL;
    const int rc = slot_load(r, id, path, sha, &m, info);
    struct kiri_served_model *dead = NULL;
    kiri_platform_mutex_lock(r->lock);
    e->busy = 0;
    if (rc == KIRI_OK) {
        dead = unpublish_locked(r, e);
        publish_locked(r, e, m, 0);
        snprintf(e->path, sizeof e->path, "%s", path);
        snprintf(e->sha256_hex, sizeof e->sha256_hex, "%s", sha);
        e->rejected_sha256[0] = '\0';
        r->counts.swaps++;
        *swapped = 1;
    } else {
        snprintf(e->rejected_sha256, sizeof e->rejected_sha256, "%s", sha);
        r->counts.load_failures++;
    }
    kiri_platform_cond_broadcast(r->cond);
    kiri_platform_mutex_unlock(r->lock);
    if (rc == KIRI_OK)
        logf_(r, "model %s: swapped to %.16s in %.2f s; the old version retires after its last request", id, sha,
              kiri_platform_now() - t0);
    else
        logf_(r, "model %s: the new version %.16s failed to load (%s); the old one keeps serving", id, sha,
              info->message);
    if (dead)
        slot_free(dead);
    return rc;
}

int kiri_models_remove(struct kiri_models *r, const char *id, struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!id || !id[0])
        return 1;
    kiri_platform_mutex_lock(r->lock);
    struct entry *e = find_locked(r, id);
    const double end = kiri_platform_now() + LOAD_WAIT_S;
    while (e && e->busy && kiri_platform_now() < end) {
        kiri_platform_cond_timed_wait(r->cond, r->lock, 0.5);
        e = find_locked(r, id);
    }
    if (!e) {
        kiri_platform_mutex_unlock(r->lock);
        return 1;
    }
    if (e->busy) {
        kiri_platform_mutex_unlock(r->lock);
        return kiri_error_set(info, KIRI_E_BUSY, "model %s is loading", id);
    }
    struct kiri_served_model *dead = unpublish_locked(r, e);
    const int held = !dead && r->retired && strcmp(r->retired->id, id) == 0;
    int at = 0;
    while (at < r->n && r->e[at] != e)
        at++;
    for (int i = at; i + 1 < r->n; i++)
        r->e[i] = r->e[i + 1];
    r->n--;
    if (r->def == at)
        r->def = r->n > 0 ? 0 : -1;
    else if (r->def > at)
        r->def--;
    kiri_platform_cond_broadcast(r->cond);
    kiri_platform_mutex_unlock(r->lock);
    kiri_mem_free(e);
    logf_(r, "model %s: removed from service%s", id, held ? "; its requests in flight finish first" : "");
    if (dead)
        slot_free(dead);
    return KIRI_OK;
}

int kiri_models_in_use(struct kiri_models *r, const char *id)
{
    kiri_platform_mutex_lock(r->lock);
    const struct entry *e = id && id[0] ? find_locked(r, id) : NULL;
    int used = e && e->slot && e->slot->refs > 1;
    for (const struct kiri_served_model *m = r->retired; m && id && !used; m = m->next_retired)
        used = strcmp(m->id, id) == 0;
    kiri_platform_mutex_unlock(r->lock);
    return used;
}

/* ---------------------------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------------------------- */

int kiri_models_has(struct kiri_models *r, const char *id)
{
    kiri_platform_mutex_lock(r->lock);
    const int has = find_locked(r, id) != NULL;
    kiri_platform_mutex_unlock(r->lock);
    return has;
}

int kiri_models_list(struct kiri_models *r, char (*ids)[KIRI_MODELS_ID_MAX], int cap)
{
    kiri_platform_mutex_lock(r->lock);
    int n = 0;
    for (int i = 0; i < r->n && n < cap; i++)
        memcpy(ids[n++], r->e[i]->id, KIRI_MODELS_ID_MAX);
    kiri_platform_mutex_unlock(r->lock);
    return n;
}

int kiri_models_snapshot(struct kiri_models *r, struct kiri_models_info *out, int cap)
{
    struct kiri_served_model *held[KIRI_MODELS_MAX];
    kiri_platform_mutex_lock(r->lock);
    int n = 0;
    for (int i = 0; i < r->n && n < cap; i++, n++) {
        const struct entry *e = r->e[i];
        memset(&out[n], 0, sizeof out[n]);
        memcpy(out[n].id, e->id, sizeof out[n].id);
        memcpy(out[n].sha256_hex, e->slot ? e->slot->sha256_hex : e->sha256_hex, sizeof out[n].sha256_hex);
        out[n].loaded = e->slot != NULL;
        snprintf(out[n].backend, sizeof out[n].backend, "%s", e->slot ? e->slot->backend : "");
        held[n] = e->slot;
        if (e->slot)
            e->slot->refs++;   /* the batcher's statistics are read below, outside the lock */
    }
    kiri_platform_mutex_unlock(r->lock);
    for (int i = 0; i < n; i++) {
        if (!held[i])
            continue;
        struct kiri_batcher_stats st;
        kiri_batcher_get_stats(held[i]->batcher, &st);
        out[i].running = st.running;
        out[i].waiting = st.waiting;
        kiri_models_release(r, held[i]);
    }
    return n;
}

void kiri_models_stats(struct kiri_models *r, struct kiri_batcher_stats *out)
{
    memset(out, 0, sizeof *out);
    struct kiri_served_model *held[KIRI_MODELS_MAX];
    int n = 0, def = -1;
    kiri_platform_mutex_lock(r->lock);
    for (int i = 0; i < r->n; i++)
        if (r->e[i]->slot) {
            if (i == r->def)
                def = n;
            held[n] = r->e[i]->slot;
            held[n++]->refs++;
        }
    kiri_platform_mutex_unlock(r->lock);
    for (int i = 0; i < n; i++) {
        struct kiri_batcher_stats st;
        kiri_batcher_get_stats(held[i]->batcher, &st);
        out->running += st.running;
        out->waiting += st.waiting;
        out->kv_blocks_total += st.kv_blocks_total;
        out->kv_blocks_used += st.kv_blocks_used;
        out->kv_blocks_cached += st.kv_blocks_cached;
        out->state_slots_total += st.state_slots_total;
        out->state_slots_used += st.state_slots_used;
        out->state_bytes += st.state_bytes;
        out->state_slots_spec += st.state_slots_spec;
        out->snapshots_total += st.snapshots_total;
        out->snapshots_used += st.snapshots_used;
        out->snapshot_bytes += st.snapshot_bytes;
        out->snapshot_hits += st.snapshot_hits;
        out->snapshot_misses += st.snapshot_misses;
        if (i == def || !out->kv_block_size)
            out->kv_block_size = st.kv_block_size;
        out->prefix_hit_blocks += st.prefix_hit_blocks;
        out->steps += st.steps;
        out->preemptions += st.preemptions;
        for (int k = 0; k < KIRI_SPEC_KINDS; k++) {
            out->spec_drafted[k] += st.spec_drafted[k];
            out->spec_accepted[k] += st.spec_accepted[k];
        }
        out->last_batch_tokens += st.last_batch_tokens;
        out->last_batch_seqs += st.last_batch_seqs;
        if (st.peak_batch_seqs > out->peak_batch_seqs)
            out->peak_batch_seqs = st.peak_batch_seqs;
        out->prompt_tokens += st.prompt_tokens;
        out->generated_tokens += st.generated_tokens;
        kiri_models_release(r, held[i]);
    }
}

void kiri_models_default_id(struct kiri_models *r, char out[KIRI_MODELS_ID_MAX])
{
    kiri_platform_mutex_lock(r->lock);
    if (r->def >= 0)
        memcpy(out, r->e[r->def]->id, KIRI_MODELS_ID_MAX);
    else
        out[0] = '\0';
    kiri_platform_mutex_unlock(r->lock);
}

void kiri_models_counts(struct kiri_models *r, struct kiri_models_counts *out)
{
    kiri_platform_mutex_lock(r->lock);
    *out = r->counts;
    out->bytes_used = r->used;
    kiri_platform_mutex_unlock(r->lock);
}
