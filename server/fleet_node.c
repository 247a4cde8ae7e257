/* The serving node's fleet loop (fleet_node.h): sync, swap, count, heartbeat. */
#include "fleet_node.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "fleet.h"
#include "https.h"
#include "kiri.h"
#include "manifest.h"
#include "mem.h"
#include "metrics.h"
#include "models.h"
#include "platform.h"

#define KEY_FILE_MAX (64u << 10)
#define PATH_MAX_ 1024

struct kiri_fleet_node {
    char models_dir[PATH_MAX_];
    char manifest_url[KIRI_MANIFEST_MAX_URL + 1];
    char ca_file[PATH_MAX_];
    char node_name[128];
    double interval;
    struct kiri_models *models;                  /* borrowed */
    void (*status)(void *user, struct kiri_heartbeat_status *hs);
    void *status_user;
    struct kiri_manifest_keys *keys;             /* owned */
    struct kiri_https_client *hb_client;         /* owned, the thread's, made at the first heartbeat */
    struct kiri_thread *thread;                  /* owned */
    struct kiri_mutex *lock;                     /* owned; guards the fields below */
    struct kiri_cond *wake;                      /* owned; signalled to stop */
    volatile int cancel;
    uint64_t version;                            /* of the accepted manifest, 0 none */
    char routing[16];
    char *upstream_url, *heartbeat_url;          /* owned or NULL */
    uint64_t rejections, syncs, sync_failures, install_failures, heartbeats, heartbeat_failures;
    uint64_t removals, removed_files;            /* superseded models deleted, and their files */
};

/* Names of superseded models (kiri_fleet_superseded), at most KIRI_MODELS_MAX of them a pass. */
struct names {
    char v[KIRI_MODELS_MAX][KIRI_MANIFEST_MAX_NAME + 1];
    const char *p[KIRI_MODELS_MAX];
    int n;
};

__attribute__((format(printf, 1, 2))) static void say(const char *fmt, ...)
{
    char line[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "kiri: fleet: %s\n", line);
}

static void sync_log(void *user, const char *line)
{
    (void)user;
    say("%s", line);
}

static char *dup_or_null(const char *s) { return s ? kiri_mem_strndup(s, strlen(s)) : NULL; }

/* Takes the accepted manifest's routing fields (under the lock). */
static void keep_manifest(struct kiri_fleet_node *n, const struct kiri_manifest *m)
{
    char *up = dup_or_null(m->upstream_url), *hb = dup_or_null(m->heartbeat_url);
    kiri_platform_mutex_lock(n->lock);
    kiri_mem_free(n->upstream_url);
    kiri_mem_free(n->heartbeat_url);
    n->upstream_url = up;
    n->heartbeat_url = hb;
    n->version = m->version;
    snprintf(n->routing, sizeof n->routing, "%s", m->routing);
    kiri_platform_mutex_unlock(n->lock);
}

/* Points the registry at the manifest's models that are in the directory (hot-swapping the loaded
 * ones whose file changed) and makes the first of them the default. skip[i] set: model i failed to
 * install, its previous file (if any) stays as it is. Returns the number of swaps; *refused counts
 * the new versions that failed to load (may be NULL). */
static int apply_models(struct kiri_fleet_node *n, const struct kiri_manifest *m, const int *skip, int *refused)
{
    int swaps = 0, def_set = 0;
    for (int i = 0; i < m->n_models; i++) {
        const struct kiri_manifest_model *mm = &m->models[i];
        char path[PATH_MAX_ + KIRI_MANIFEST_MAX_NAME + 8];
        snprintf(path, sizeof path, "%s/%s.gguf", n->models_dir, mm->name);
        uint64_t size;
        struct kiri_status_info info;
        if ((skip && skip[i]) || kiri_platform_file_size(path, &size, &info) != KIRI_OK)
            continue;
        int swapped = 0;
        if (kiri_models_update(n->models, mm->name, path, mm->sha256_hex, &swapped, &info) != KIRI_OK) {
            say("model %s: version %.16s refused: %s", mm->name, mm->sha256_hex, info.message);
            if (refused)
                (*refused)++;
        }
        swaps += swapped;
        if (!def_set && kiri_models_has(n->models, mm->name)) {
            kiri_models_set_default(n->models, mm->name);
            def_set = 1;
        }
    }
    return swaps;
}

/* Models of m whose loaded version is not m's (a refused version that is not tried again). */
static int not_in_service(struct kiri_fleet_node *n, const struct kiri_manifest *m)
{
    struct kiri_models_info *mi = kiri_mem_calloc(KIRI_MODELS_MAX, sizeof *mi);
    if (!mi)
        return 1;
    const int nm = kiri_models_snapshot(n->models, mi, KIRI_MODELS_MAX);
    int bad = 0;
    for (int i = 0; i < m->n_models; i++)
        for (int j = 0; j < nm; j++)
            if (strcmp(mi[j].id, m->models[i].name) == 0 && mi[j].loaded &&
                strcmp(mi[j].sha256_hex, m->models[i].sha256_hex) != 0)
                bad++;
    kiri_mem_free(mi);
    return bad;
}

/* Makes the manifest's first model in the registry the default. */
static void set_default(struct kiri_fleet_node *n, const struct kiri_manifest *m)
{
    for (int i = 0; i < m->n_models; i++)
        if (kiri_models_has(n->models, m->models[i].name)) {
            kiri_models_set_default(n->models, m->models[i].name);
            return;
        }
}

/* The superseded models of manifest m (the state's records m does not name) into nm. */
static void superseded(struct kiri_fleet_node *n, const struct kiri_manifest *m, struct names *nm)
{
    struct kiri_status_info info;
    const int c = kiri_fleet_superseded(n->models_dir, m, nm->v, KIRI_MODELS_MAX, &info);
    nm->n = c > 0 ? c : 0;
    for (int i = 0; i < nm->n; i++)
        nm->p[i] = nm->v[i];
    if (c < 0)
        say("cannot read the installed models: %s", info.message);
}

/* After a pass that installed and swapped in everything manifest m names: takes the superseded
 * models out of the registry and deletes their files. One still serving a request keeps its
 * files until a later pass finds it idle (its requests end on the retired slot). */
static void remove_superseded(struct kiri_fleet_node *n, const struct kiri_manifest *m, const struct names *nm)
{
    for (int i = 0; i < nm->n; i++) {
        const char *name = nm->v[i];
        struct kiri_status_info info;
        if (kiri_models_remove(n->models, name, &info) < 0) {
            say("model %s: not in the manifest, but %s; removed at a later pass", name, info.message);
            continue;
        }
        if (kiri_models_in_use(n->models, name)) {
            say("model %s: not in the manifest; its files are removed at a later pass, after its last request", name);
            continue;
        }
        const int files = kiri_fleet_remove_superseded(n->models_dir, m, name, sync_log, n, &info);
        if (files < 0) {
            say("model %s: not in the manifest, left in place for now: %s", name, info.message);
            continue;
        }
        say("model %s: removed (superseded by manifest version %llu, %d file%s deleted)", name,
            (unsigned long long)m->version, files, files == 1 ? "" : "s");
        kiri_platform_mutex_lock(n->lock);
        n->removals++;
        n->removed_files += (uint64_t)files;
        kiri_platform_mutex_unlock(n->lock);
    }
}

int kiri_fleet_node_init(const struct kiri_fleet_node_params *p, struct kiri_fleet_node **out,
                         struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!p->models_dir || !p->manifest_url || !p->key_file || !p->models)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the fleet needs a models directory, a URL and a key");
    struct kiri_fleet_node *n = kiri_mem_calloc(1, sizeof *n);
    if (!n)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    snprintf(n->models_dir, sizeof n->models_dir, "%s", p->models_dir);
    snprintf(n->manifest_url, sizeof n->manifest_url, "%s", p->manifest_url);
    snprintf(n->ca_file, sizeof n->ca_file, "%s", p->ca_file ? p->ca_file : "");
    if (p->node_name && p->node_name[0])
        snprintf(n->node_name, sizeof n->node_name, "%s", p->node_name);
    else
        kiri_heartbeat_hostname(n->node_name, sizeof n->node_name);
    n->interval = p->interval > 0 ? p->interval : 300;
    n->models = p->models;
    n->status = p->status;
    n->status_user = p->status_user;
    int rc = KIRI_E_NOMEM;
    if (kiri_platform_mutex_init(&n->lock) != KIRI_OK || kiri_platform_cond_init(&n->wake) != KIRI_OK ||
        kiri_manifest_keys_init(&n->keys) != KIRI_OK) {
        kiri_error_set(info, rc, "out of memory");
        goto fail;
    }
    char *pem = NULL;
    size_t len = 0;
    if ((rc = kiri_platform_read_file(p->key_file, KEY_FILE_MAX, &pem, &len, info)) != KIRI_OK)
        goto fail;
    rc = kiri_manifest_keys_add(n->keys, pem, len, info);
    kiri_mem_free(pem);
    if (rc != KIRI_OK) {
        kiri_error_set(info, rc, "--fleet-key %s: %s", p->key_file, info->message);
        goto fail;
    }
    if ((rc = kiri_platform_mkdir(n->models_dir, info)) != KIRI_OK)
        goto fail;
    /* What the directory holds, as the last accepted manifest names it: served at once. */
    struct kiri_manifest *m = NULL;
    int expired = 0;
    struct kiri_status_info li;
    if (kiri_fleet_load_current(n->models_dir, n->keys, &m, &expired, &li) == KIRI_OK) {
        say("holding manifest version %llu%s", (unsigned long long)m->version,
            expired ? " (expired: kept until a newer one arrives)" : "");
        keep_manifest(n, m);
        apply_models(n, m, NULL, NULL);
    } else {
        say("no manifest held in %s yet (%s)", n->models_dir, li.message);
    }
    /* Models put in the directory by hand (kiri pull) are served too; those the fleet installed
     * and the held manifest superseded are not (the first good pass deletes them). */
    struct names *sup = kiri_mem_calloc(1, sizeof *sup);
    if (sup && m)
        superseded(n, m, sup);
    kiri_manifest_free(m);
    rc = sup ? kiri_models_scan_dir_except(n->models, n->models_dir, sup->p, sup->n, info)
             : kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    kiri_mem_free(sup);
    if (rc != KIRI_OK)
        goto fail;
    *out = n;
    return KIRI_OK;
fail:
    kiri_fleet_node_free(n);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The thread
 * ------------------------------------------------------------------------------------------- */

static void sync_once(struct kiri_fleet_node *n)
{
    struct kiri_fleet_options o;
    kiri_fleet_options_default(&o);
    o.models_dir = n->models_dir;
    o.manifest_url = n->manifest_url;
    o.keys = n->keys;
    o.https.ca_file = n->ca_file[0] ? n->ca_file : NULL;
    o.cancel = &n->cancel;
    o.log = sync_log;
    /* A fleet that is down is tried again at the next pass; retries within one pass stay short so
     * that shutdown and heartbeats are not held up for minutes. */
    o.max_attempts = 3;
    o.backoff_max = n->interval < 30 ? n->interval : 30;
    if (o.backoff_base > o.backoff_max)
        o.backoff_base = o.backoff_max;
    struct kiri_fleet_report rep;
    struct kiri_status_info info;
    const int rc = kiri_fleet_sync(&o, &rep, &info);
    int rejected = 0, failures = 0, swaps = 0, refused = 0;
    if (rep.manifest_rejected) {
        rejected = 1;
        say("manifest refused (%s: %s); keeping version %llu and the models in service",
            rep.manifest_error ? rep.manifest_error->field : "?", rep.manifest_error ? rep.manifest_error->message : "?",
            (unsigned long long)rep.version_before);
    } else if (rep.manifest_status != KIRI_OK) {
        say("no manifest this time (%s); serving what is installed",
            rep.manifest_error ? rep.manifest_error->message : info.message);
    }
    if (rep.manifest_status == KIRI_OK && rep.manifest) {
        int skip[KIRI_MANIFEST_MAX_MODELS] = {0};
        for (int i = 0; i < rep.n_models && i < KIRI_MANIFEST_MAX_MODELS; i++)
            if (rep.models[i].action == KIRI_FLEET_FAILED) {
                skip[i] = 1;
                failures++;
                say("model %s not installed (%s); the installed version keeps serving", rep.models[i].name,
                    rep.models[i].error ? rep.models[i].error->message : "?");
            }
        if (!rep.manifest_same)
            say("accepted manifest version %llu (was %llu)", (unsigned long long)rep.version,
                (unsigned long long)rep.version_before);
        keep_manifest(n, rep.manifest);
        swaps = apply_models(n, rep.manifest, skip, &refused);
        struct names *sup = kiri_mem_calloc(1, sizeof *sup);
        if (sup) {
            superseded(n, rep.manifest, sup);
            /* Only after a pass where everything the manifest names is in service: a failed
             * install or a refused version may still need what it replaced. */
            if (rc == KIRI_OK && failures == 0 && refused == 0 && not_in_service(n, rep.manifest) == 0) {
                remove_superseded(n, rep.manifest, sup);
                set_default(n, rep.manifest);
            } else if (sup->n) {
                say("%d model(s) no longer in the manifest kept until a pass installs everything", sup->n);
            }
        }
        /* New files the manifest does not name (kiri pull) are picked up as well; superseded
         * ones are not served again. */
        kiri_models_scan_dir_except(n->models, n->models_dir, sup ? sup->p : NULL, sup ? sup->n : 0, &info);
        kiri_mem_free(sup);
    }
    kiri_platform_mutex_lock(n->lock);
    n->syncs++;
    n->sync_failures += rc != KIRI_OK;
    n->rejections += (uint64_t)rejected;
    n->install_failures += (uint64_t)failures;
    kiri_platform_mutex_unlock(n->lock);
    if (swaps)
        say("%d model(s) swapped", swaps);
    kiri_fleet_report_free(&rep);
}

static void heartbeat(struct kiri_fleet_node *n)
{
    char url[KIRI_MANIFEST_MAX_URL + 1] = "";
    kiri_platform_mutex_lock(n->lock);
    if (n->heartbeat_url)
        snprintf(url, sizeof url, "%s", n->heartbeat_url);
    const uint64_t version = n->version;
    struct kiri_heartbeat_status hs;
    memset(&hs, 0, sizeof hs);
    hs.manifest_rejections = n->rejections;
    hs.heartbeat_failures = n->heartbeat_failures;
    kiri_platform_mutex_unlock(n->lock);
    if (!url[0])
        return;
    struct kiri_status_info info;
    if (!n->hb_client) {
        struct kiri_https_options ho;
        memset(&ho, 0, sizeof ho);
        ho.ca_file = n->ca_file[0] ? n->ca_file : NULL;
        ho.max_redirects = 0;
        ho.connect_timeout = 5;
        ho.first_byte_timeout = 10;
        ho.idle_timeout = 10;
        ho.min_rate = -1;
        ho.cancel = &n->cancel;
        if (kiri_https_client_init(&ho, &n->hb_client, &info) != KIRI_OK) {
            say("heartbeat: %s", info.message);
            kiri_platform_mutex_lock(n->lock);
            n->heartbeats++;
            n->heartbeat_failures++;
            kiri_platform_mutex_unlock(n->lock);
            return;
        }
    }
    struct kiri_models_info *mi = kiri_mem_calloc(KIRI_MODELS_MAX, sizeof *mi);
    struct kiri_heartbeat_model *hm = kiri_mem_calloc(KIRI_MODELS_MAX, sizeof *hm);
    int nm = mi && hm ? kiri_models_snapshot(n->models, mi, KIRI_MODELS_MAX) : 0;
    char def[KIRI_MODELS_ID_MAX];
    kiri_models_default_id(n->models, def);
    hs.backend = "";
    for (int i = 0; i < nm; i++) {
        hm[i].name = mi[i].id;
        hm[i].sha256_hex = mi[i].sha256_hex;
        hm[i].loaded = mi[i].loaded;
        if (mi[i].loaded && (!hs.backend[0] || strcmp(mi[i].id, def) == 0))
            hs.backend = mi[i].backend;
    }
    struct kiri_models_counts mc;
    kiri_models_counts(n->models, &mc);
    hs.node = n->node_name;
    hs.kiri_version = KIRI_VERSION_STRING;
    hs.manifest_version = version;
    hs.model_load_failures = mc.load_failures;
    hs.model_swaps = mc.swaps;
    hs.n_models = nm > KIRI_HEARTBEAT_MAX_MODELS ? KIRI_HEARTBEAT_MAX_MODELS : nm;
    hs.models = hm;
    if (n->status)
        n->status(n->status_user, &hs);
    int http_status = 0;
    const int rc = kiri_heartbeat_send(n->hb_client, url, &hs, &http_status, &info);
    kiri_mem_free(mi);
    kiri_mem_free(hm);
    kiri_platform_mutex_lock(n->lock);
    n->heartbeats++;
    n->heartbeat_failures += rc != KIRI_OK;
    kiri_platform_mutex_unlock(n->lock);
    if (rc != KIRI_OK)
        say("heartbeat to %s failed: %s", url, info.message);
}

static void node_main(void *arg)
{
    struct kiri_fleet_node *n = arg;
    for (;;) {
        sync_once(n);
        if (n->cancel)
            break;
        heartbeat(n);
        kiri_platform_mutex_lock(n->lock);
        const double end = kiri_platform_now() + n->interval;
        while (!n->cancel && kiri_platform_now() < end) {
            const double left = end - kiri_platform_now();
            kiri_platform_cond_timed_wait(n->wake, n->lock, left > 1 ? 1 : left > 0 ? left : 0.001);
        }
        const int stop = n->cancel;
        kiri_platform_mutex_unlock(n->lock);
        if (stop)
            break;
    }
}

int kiri_fleet_node_start(struct kiri_fleet_node *n, struct kiri_status_info *info)
{
    if (kiri_platform_thread_start(&n->thread, node_main, n) != KIRI_OK)
        return kiri_error_set(info, KIRI_E_NOMEM, "cannot start the fleet thread");
    say("following %s every %g s", n->manifest_url, n->interval);
    return KIRI_OK;
}

void kiri_fleet_node_stop(struct kiri_fleet_node *n)
{
    if (!n || !n->thread)
        return;
    kiri_platform_mutex_lock(n->lock);
    n->cancel = 1;
    kiri_platform_cond_broadcast(n->wake);
    kiri_platform_mutex_unlock(n->lock);
    kiri_platform_thread_join(n->thread);
    n->thread = NULL;
}

void kiri_fleet_node_free(struct kiri_fleet_node *n)
{
    if (!n)
        return;
    kiri_fleet_node_stop(n);
    kiri_https_client_free(n->hb_client);
    kiri_manifest_keys_free(n->keys);
    kiri_mem_free(n->upstream_url);
    kiri_mem_free(n->heartbeat_url);
    kiri_platform_cond_free(n->wake);
    kiri_platform_mutex_free(n->lock);
    kiri_mem_free(n);
}

/* ---------------------------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------------------------- */

void kiri_fleet_node_metrics(struct kiri_fleet_node *n, struct kiri_metrics_models *f)
{
    kiri_platform_mutex_lock(n->lock);
    f->fleet = 1;
    f->manifest_version = n->version;
    f->manifest_rejections = n->rejections;
    f->syncs = n->syncs;
    f->sync_failures = n->sync_failures;
    f->model_install_failures = n->install_failures;
    f->heartbeats = n->heartbeats;
    f->heartbeat_failures = n->heartbeat_failures;
    f->removals = n->removals;
    f->removed_files = n->removed_files;
    kiri_platform_mutex_unlock(n->lock);
}

uint64_t kiri_fleet_node_policy(struct kiri_fleet_node *n, char routing[16], char *upstream_url, size_t cap)
{
    kiri_platform_mutex_lock(n->lock);
    snprintf(routing, 16, "%s", n->routing);
    if (cap)
        snprintf(upstream_url, cap, "%s", n->upstream_url ? n->upstream_url : "");
    const uint64_t v = n->version;
    kiri_platform_mutex_unlock(n->lock);
    return v;
}
