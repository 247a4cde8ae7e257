/* One sync pass of a models directory against a signed manifest (fleet.h). */
#include "fleet.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "hex.h"
#include "kiri.h"
#include "mem.h"
#include "names.h"
#include "oci.h"
#include "net_platform.h"

/* ---------------------------------------------------------------------------------------------
 * Logging and paths
 * ------------------------------------------------------------------------------------------- */

static void say(const struct kiri_fleet_options *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void say(const struct kiri_fleet_options *o, const char *fmt, ...)
{
    if (!o->log)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    o->log(o->log_user, line);
}

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = kiri_mem_alloc(a + b + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b + 1);
    }
    return p;
}

void kiri_fleet_options_default(struct kiri_fleet_options *o)
{
    memset(o, 0, sizeof *o);
    o->https.max_redirects = -1;
    o->disk_margin = KIRI_DOWNLOAD_DEFAULT_MARGIN;
    o->max_attempts = 5;
    o->backoff_base = 1.0;
    o->backoff_max = 300.0;
    o->skew = 300.0;
}

/* ---------------------------------------------------------------------------------------------
 * The state file
 * ------------------------------------------------------------------------------------------- */

/* The state as read: root is the parsed JSON (owned), or NULL when there is no state yet. */
struct state {
    json_t *root;
};

static int state_read(const char *dir, struct state *st, struct kiri_status_info *info)
{
    st->root = NULL;
    char *path = path_join(dir, KIRI_FLEET_STATE_FILE), *text = NULL;
    size_t len = 0;
    uint64_t size;
    if (!path)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading the fleet state");
    int rc = kiri_platform_file_size(path, &size, info);
    if (rc == 1) {
        kiri_mem_free(path);
        return KIRI_OK;
    }
    if (rc == KIRI_OK)
        rc = kiri_platform_read_file(path, KIRI_FLEET_STATE_MAX, &text, &len, info);
    if (rc == KIRI_OK) {
        json_error_t je;
        st->root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
        json_t *v = json_object_get(st->root, "version"), *h = json_object_get(st->root, "manifest_sha256");
        uint8_t tmp[32];
        if (!json_is_object(st->root) || !json_is_integer(v) || json_integer_value(v) < 1 || !json_is_string(h) ||
            kiri_hex_decode_str(json_string_value(h), tmp, 32) != 0) {
            /* Fail closed: a state that cannot be read must not reset the high-water mark. */
            json_decref(st->root);
            st->root = NULL;
            rc = kiri_error_at(info, KIRI_E_IO, "state", -1,
                               "%s is damaged; refusing to sync (delete it to accept any valid manifest again)", path);
        }
    }
    kiri_mem_free(text);
    kiri_mem_free(path);
    return rc;
}

static void state_policy(const struct state *st, struct kiri_manifest_policy *p)
{
    memset(p, 0, sizeof *p);
    if (!st->root)
        return;
    p->have_current = 1;
    p->current_version = (uint64_t)json_integer_value(json_object_get(st->root, "version"));
    kiri_hex_decode_str(json_string_value(json_object_get(st->root, "manifest_sha256")), p->current_sha256, 32);
    json_t *f = json_object_get(st->root, "time_floor");
    p->time_floor = json_is_integer(f) ? (int64_t)json_integer_value(f) : 0;
}

/* Writes the state durably: temporary file, fsync, rename, directory fsync. */
static int state_write(const char *dir, const struct state *st, struct kiri_status_info *info)
{
    char *text = json_dumps(st->root, JSON_INDENT(1) | JSON_SORT_KEYS);
    char *path = path_join(dir, KIRI_FLEET_STATE_FILE), *tmp = path_join(dir, KIRI_FLEET_STATE_FILE ".tmp");
    int rc = KIRI_OK, fd = -1;
    if (!text || !path || !tmp)
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory writing the fleet state");
    else if ((rc = kiri_platform_file_create(tmp, info, &fd)) == KIRI_OK) {
        if ((rc = kiri_platform_file_write(fd, tmp, text, strlen(text), info)) != KIRI_OK) {
            kiri_platform_file_abort(fd, tmp);
        } else if ((rc = kiri_platform_file_sync_close(fd, tmp, info)) != KIRI_OK ||
                   (rc = kiri_platform_file_rename_durable(tmp, path, info)) != KIRI_OK) {
            kiri_platform_file_remove(tmp, NULL);
        }
    }
    kiri_mem_free(text); /* Jansson's allocator is malloc or kiri_mem_alloc: both end in free() */
    kiri_mem_free(path);
    kiri_mem_free(tmp);
    return rc;
}

/* The state's record of an installed model: 1 when it names this hash and size. */
static int state_has_model(const struct state *st, const struct kiri_manifest_model *m)
{
    json_t *e = json_object_get(json_object_get(st->root, "models"), m->name);
    json_t *h = json_object_get(e, "sha256"), *s = json_object_get(e, "size");
    return json_is_string(h) && strcmp(json_string_value(h), m->sha256_hex) == 0 && json_is_integer(s) &&
           (uint64_t)json_integer_value(s) == m->size;
}

static int state_set_model(struct state *st, const struct kiri_manifest_model *m)
{
    json_t *models = json_object_get(st->root, "models");
    if (!json_is_object(models)) {
        models = json_object();
        if (!models || json_object_set_new(st->root, "models", models) != 0)
            return -1;
    }
    char file[KIRI_MANIFEST_MAX_NAME + 6];
    snprintf(file, sizeof file, "%s.gguf", m->name);
    json_t *e = json_pack("{s:s, s:I, s:s}", "sha256", m->sha256_hex, "size", (json_int_t)m->size, "file", file);
    return e ? json_object_set_new(models, m->name, e) : -1;
}

/* ---------------------------------------------------------------------------------------------
 * Fetching the envelope
 * ------------------------------------------------------------------------------------------- */

static int cancelled(const struct kiri_fleet_options *o) { return o->cancel && *o->cancel; }

static int nap(const struct kiri_fleet_options *o, double seconds)
{
    const double end = kiri_platform_now() + seconds;
    while (!cancelled(o)) {
        double left = end - kiri_platform_now();
        if (left <= 0)
            return 0;
        kiri_platform_sleep(left < 0.2 ? left : 0.2);
    }
    return 1;
}

static int fetch_envelope(const struct kiri_fleet_options *o, struct kiri_https_client *c, char **out, size_t *len,
                          struct kiri_status_info *info)
{
    struct kiri_https_response *resp = kiri_mem_alloc(sizeof *resp);
    if (!resp)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory fetching the manifest");
    int rc = KIRI_OK;
    double wait = o->backoff_base > 0 ? o->backoff_base : 1.0;
    const double cap = o->backoff_max > 0 ? o->backoff_max : 300.0;
    const int attempts = o->max_attempts > 0 ? o->max_attempts : 5;
    for (int a = 1;; a++) {
        rc = kiri_https_get_small(c, o->manifest_url, NULL, KIRI_MANIFEST_MAX_ENVELOPE, out, len, resp, info);
        int retry = 0;
        if (rc == KIRI_OK && !*out) {
            retry = kiri_https_status_retryable(resp->status);
            rc = kiri_error_at(info, resp->status == 429 || resp->status == 503 ? KIRI_E_BUSY : KIRI_E_IO, "http", -1,
                               "manifest: HTTP %d from %.200s", resp->status, resp->url);
        } else if (rc != KIRI_OK) {
            retry = kiri_https_failure_retryable(resp->failure);
        }
        if (rc == KIRI_OK || !retry || a >= attempts || cancelled(o))
            break;
        uint32_t r = 0;
        kiri_platform_random(&r, sizeof r, NULL);
        double d = wait * (0.5 + 0.5 * (double)r / 4294967296.0);
        if (resp->retry_after >= 0)
            d = resp->retry_after > cap ? cap : resp->retry_after > d ? resp->retry_after : d;
        say(o, "manifest: attempt %d failed (%s); retrying in %.2f s", a, info ? info->message : "", d);
        if (nap(o, d))
            break;
        wait = wait * 2 > cap ? cap : wait * 2;
    }
    kiri_mem_free(resp);
    if (rc == KIRI_OK && cancelled(o)) {
        kiri_mem_free(*out);
        *out = NULL;
        rc = kiri_error_set(info, KIRI_E_CANCELLED, "cancelled");
    }
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * One model
 * ------------------------------------------------------------------------------------------- */

static int download_model(const struct kiri_fleet_options *o, struct kiri_https_client *c,
                          const struct kiri_manifest_model *m, struct kiri_download_request *dr,
                          struct kiri_fleet_model_status *ms, struct kiri_status_info *info)
{
    if (strncmp(m->url, "oci://", 6) != 0) {
        dr->url = m->url;
        return kiri_download_install(c, dr, &ms->download, info);
    }
    struct kiri_oci_ref ref;
    if (kiri_oci_parse_ref(m->url, &ref) != 0)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "url", -1, "%s: not an OCI reference: %.200s", m->name, m->url);
    int rc = KIRI_OK;
    for (int round = 0; round < 2; round++) {
        struct kiri_oci_blob blob;
        if ((rc = kiri_oci_resolve(c, &ref, &blob, o->log, o->log_user, info)) != KIRI_OK)
            return rc;
        /* F15: the layer must be the very file the manifest names. */
        if (memcmp(blob.sha256, m->sha256, 32) != 0 || blob.size != m->size) {
            kiri_oci_blob_free(&blob);
            return kiri_error_at(info, KIRI_E_MODEL_INVALID, "sha256", -1,
                                 "%s: the registry's layer (%.19s..., %llu bytes) is not the file the manifest names",
                                 m->name, blob.digest, (unsigned long long)blob.size);
        }
        const char *headers[2] = {blob.auth_header, NULL};
        dr->url = blob.url;
        dr->headers = headers;
        rc = kiri_download_install(c, dr, &ms->download, info);
        dr->headers = NULL;
        dr->url = NULL;
        kiri_oci_blob_free(&blob);
        /* A token that expired during a long download: resolve again, once. */
        if (!(rc != KIRI_OK && ms->download.last_status == 401))
            break;
    }
    return rc;
}

static int sync_model(const struct kiri_fleet_options *o, struct kiri_https_client *c, struct state *st,
                      const struct kiri_manifest_model *m, struct kiri_fleet_model_status *ms, int *dirty,
                      struct kiri_status_info *info)
{
    char *path = path_join(o->models_dir, ms->file), *prev = NULL;
    if (!path)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    int rc = KIRI_OK;
    uint64_t size = 0;
    int exists = kiri_platform_file_size(path, &size, NULL) == KIRI_OK;
    if (exists && size == m->size) {
        uint8_t h[32];
        const int known = state_has_model(st, m);
        if (known && !o->verify_installed) {
            ms->action = KIRI_FLEET_UNCHANGED;
            goto done;
        }
        if (kiri_download_file_sha256(path, h, NULL) == KIRI_OK && memcmp(h, m->sha256, 32) == 0) {
            ms->action = KIRI_FLEET_UNCHANGED;
            if (!known)
                *dirty = 1;
            state_set_model(st, m);
            goto done;
        }
        if (o->verify_installed)
            say(o, "%s: the installed file does not have the expected hash; replacing it", m->name);
    }
    struct kiri_download_request dr;
    memset(&dr, 0, sizeof dr);
    dr.dir = o->models_dir;
    dr.name = ms->file;
    memcpy(dr.sha256, m->sha256, 32);
    dr.size = m->size;
    dr.disk_margin = o->disk_margin;
    dr.max_attempts = o->max_attempts;
    dr.backoff_base = o->backoff_base;
    dr.backoff_max = o->backoff_max;
    dr.cancel = o->cancel;
    dr.log = o->log;
    dr.log_user = o->log_user;
    /* A rollback to the version kept beside the model needs no download. */
    char prev_name[KIRI_MANIFEST_MAX_NAME + 11];
    snprintf(prev_name, sizeof prev_name, "%s.prev", ms->file);
    if ((prev = path_join(o->models_dir, prev_name)) != NULL) {
        uint64_t psize;
        struct kiri_status_info le;
        if (kiri_platform_file_size(prev, &psize, NULL) == KIRI_OK && psize == m->size &&
            kiri_download_install_local(prev, &dr, &le) == KIRI_OK) {
            ms->action = KIRI_FLEET_RESTORED;
            *dirty = 1;
            state_set_model(st, m);
            goto done;
        }
    }
    rc = download_model(o, c, m, &dr, ms, info);
    if (rc == KIRI_OK) {
        ms->action = KIRI_FLEET_INSTALLED;
        *dirty = 1;
        state_set_model(st, m);
    }
done:
    kiri_mem_free(prev);
    kiri_mem_free(path);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The pass
 * ------------------------------------------------------------------------------------------- */

void kiri_fleet_report_free(struct kiri_fleet_report *rep)
{
    if (!rep)
        return;
    for (int i = 0; i < rep->n_models; i++)
        kiri_mem_free(rep->models[i].error);
    kiri_mem_free(rep->models);
    kiri_mem_free(rep->manifest_error);
    kiri_manifest_free(rep->manifest);
    memset(rep, 0, sizeof *rep);
}

static int refuse(struct kiri_fleet_report *rep, int rc, const struct kiri_status_info *why)
{
    rep->manifest_status = rc;
    *rep->manifest_error = *why;
    return rc;
}

int kiri_fleet_sync(const struct kiri_fleet_options *o, struct kiri_fleet_report *rep, struct kiri_status_info *info)
{
    memset(rep, 0, sizeof *rep);
    const double t0 = kiri_platform_now();
    struct kiri_status_info local;
    if (!info)
        info = &local;
    kiri_error_clear(info);
    rep->manifest_error = kiri_mem_calloc(1, sizeof *rep->manifest_error);
    if (!rep->manifest_error)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    if (!o->models_dir || !o->keys || kiri_manifest_keys_count(o->keys) == 0 || (!o->manifest_url && !o->envelope))
        return refuse(rep, kiri_error_set(info, KIRI_E_INVALID_ARG,
                                          "fleet sync needs a models directory, pinned keys and a manifest"), info);
    int rc, lock = -1, accepted = 0;
    char *lock_path = path_join(o->models_dir, KIRI_FLEET_LOCK_FILE), *env = NULL;
    size_t env_len = 0;
    struct state st = {NULL};
    struct kiri_https_client *c = NULL;
    struct kiri_manifest *m = NULL;
    if (!lock_path) {
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
        goto out;
    }
    if ((rc = kiri_platform_mkdir(o->models_dir, info)) != KIRI_OK ||
        (rc = kiri_platform_lock_file(lock_path, &lock, info)) != KIRI_OK || (rc = state_read(o->models_dir, &st, info)) != KIRI_OK)
        goto out;
    struct kiri_https_options ho = o->https;
    ho.cancel = o->cancel;
    if ((rc = kiri_https_client_init(&ho, &c, info)) != KIRI_OK)
        goto out;

    struct kiri_manifest_policy pol;
    state_policy(&st, &pol);
    rep->version_before = rep->version = pol.have_current ? pol.current_version : 0;
    if (o->envelope) {
        env = kiri_mem_strndup(o->envelope, o->envelope_len);
        env_len = o->envelope_len;
        if (!env) {
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
            goto out;
        }
    } else if ((rc = fetch_envelope(o, c, &env, &env_len, info)) != KIRI_OK) {
        say(o, "manifest: cannot fetch it (%s); keeping version %llu", info->message,
            (unsigned long long)rep->version_before);
        goto out;
    }
    pol.now = kiri_platform_wall_time();
    pol.skew = o->skew;
    pol.max_jump = o->max_version_jump;
    int same = 0;
    if ((rc = kiri_manifest_verify(o->keys, env, env_len, &pol, &m, &same, info)) != KIRI_OK) {
        rep->manifest_rejected = rc != KIRI_E_NOMEM;
        say(o, "manifest rejected [%s]: %s; keeping version %llu and its models", info->field, info->message,
            (unsigned long long)rep->version_before);
        goto out;
    }
    rep->manifest_same = same;
    rep->version = m->version;
    if ((double)m->issued > pol.now + o->skew)
        say(o, "clock skew: the manifest was issued %.0f s ahead of this device's clock",
            (double)m->issued - pol.now);
    if (!same) {
        /* Raise the marks before any download, so a replay of an older manifest is refused from
         * now on even if the downloads fail. */
        json_t *root = st.root ? json_deep_copy(st.root) : json_object();
        int64_t floor = pol.time_floor > m->issued ? pol.time_floor : m->issued;
        char hex[65];
        kiri_hex_encode(m->sha256, 32, hex);
        if (!root || json_object_set_new(root, "version", json_integer((json_int_t)m->version)) ||
            json_object_set_new(root, "manifest_sha256", json_string(hex)) ||
            json_object_set_new(root, "time_floor", json_integer((json_int_t)floor)) ||
            json_object_set_new(root, "key_id", json_string(m->key_id)) ||
            json_object_set_new(root, "envelope", json_stringn(env, env_len))) {
            json_decref(root);
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory updating the fleet state");
            goto out;
        }
        struct state next = {root};
        if ((rc = state_write(o->models_dir, &next, info)) != KIRI_OK) {
            json_decref(root);
            goto out;
        }
        json_decref(st.root);
        st.root = root;
        say(o, "manifest version %llu accepted (was %llu), %d model%s, signed by %.23s...",
            (unsigned long long)m->version, (unsigned long long)rep->version_before, m->n_models,
            m->n_models == 1 ? "" : "s", m->key_id);
    } else {
        say(o, "manifest version %llu unchanged", (unsigned long long)m->version);
    }
    rep->manifest_status = KIRI_OK;
    accepted = 1;

    rep->models = kiri_mem_calloc((size_t)m->n_models, sizeof *rep->models);
    const char **keep = kiri_mem_calloc((size_t)m->n_models + 1, sizeof *keep);
    if (!rep->models || !keep) {
        kiri_mem_free(keep);
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
        goto out;
    }
    rep->n_models = m->n_models;
    for (int i = 0; i < m->n_models; i++) {
        struct kiri_fleet_model_status *ms = &rep->models[i];
        snprintf(ms->name, sizeof ms->name, "%s", m->models[i].name);
        snprintf(ms->file, sizeof ms->file, "%s.gguf", m->models[i].name);
        memcpy(ms->sha256_hex, m->models[i].sha256_hex, 65);
        ms->size = m->models[i].size;
        keep[i] = ms->file;
    }
    struct kiri_status_info se;
    int removed = kiri_download_remove_stale(o->models_dir, keep, &se);
    kiri_mem_free(keep);
    rep->n_stale_removed = removed > 0 ? removed : 0;
    if (removed > 0)
        say(o, "removed %d stale partial file%s", removed, removed == 1 ? "" : "s");

    int first_error = KIRI_OK;
    for (int i = 0; i < m->n_models; i++) {
        struct kiri_fleet_model_status *ms = &rep->models[i];
        if (!(ms->error = kiri_mem_calloc(1, sizeof *ms->error))) {
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
            goto out;
        }
        kiri_error_clear(ms->error);
        int dirty = 0;
        int r = cancelled(o) ? kiri_error_set(ms->error, KIRI_E_CANCELLED, "cancelled")
                             : sync_model(o, c, &st, &m->models[i], ms, &dirty, ms->error);
        rep->hash_mismatches += ms->download.hash_mismatches;
        if (r != KIRI_OK) {
            ms->action = KIRI_FLEET_FAILED;
            rep->n_failed++;
            say(o, "%s: FAILED [%s]: %s; the installed file (if any) is untouched", ms->name, ms->error->field,
                ms->error->message);
            if (first_error == KIRI_OK) {
                first_error = r;
                *info = *ms->error;
            }
            continue;
        }
        if (ms->action != KIRI_FLEET_UNCHANGED)
            rep->n_changed++;
        struct kiri_status_info we;
        if (dirty && state_write(o->models_dir, &st, &we) != KIRI_OK)
            say(o, "cannot record %s in the state: %s", ms->name, we.message);
        say(o, "%s: %s", ms->name,
            ms->action == KIRI_FLEET_UNCHANGED ? "unchanged" : ms->action == KIRI_FLEET_RESTORED ? "restored from the kept previous file" : "installed");
    }
    rc = first_error;
    rep->manifest = m;
    m = NULL;
out:
    if (!accepted) {
        rep->manifest_status = rc;
        *rep->manifest_error = *info;
    }
    kiri_manifest_free(m);
    kiri_https_client_free(c);
    json_decref(st.root);
    kiri_mem_free(env);
    kiri_platform_lock_release(lock);
    kiri_mem_free(lock_path);
    rep->seconds = kiri_platform_now() - t0;
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Reading the state without syncing
 * ------------------------------------------------------------------------------------------- */

int kiri_fleet_state_policy(const char *models_dir, struct kiri_manifest_policy *policy,
                            struct kiri_status_info *info)
{
    struct state st;
    int rc = state_read(models_dir, &st, info);
    if (rc != KIRI_OK)
        return rc;
    state_policy(&st, policy);
    json_decref(st.root);
    return KIRI_OK;
}

int kiri_fleet_load_current(const char *models_dir, const struct kiri_manifest_keys *keys,
                            struct kiri_manifest **out, int *expired, struct kiri_status_info *info)
{
    struct state st;
    int rc = state_read(models_dir, &st, info);
    if (rc != KIRI_OK)
        return rc;
    json_t *env = json_object_get(st.root, "envelope");
    if (!json_is_string(env)) {
        json_decref(st.root);
        return kiri_error_at(info, KIRI_E_IO, "state", -1, "%s holds no accepted manifest", models_dir);
    }
    struct kiri_manifest_policy pol;
    state_policy(&st, &pol);
    pol.now = 0; /* expiry is reported, not enforced, for what the device already holds */
    pol.time_floor = 0;
    struct kiri_manifest *m = NULL;
    int same = 0;
    rc = kiri_manifest_verify(keys, json_string_value(env), json_string_length(env), &pol, &m, &same, info);
    json_decref(st.root);
    if (rc != KIRI_OK)
        return rc;
    if (!same) {
        kiri_manifest_free(m);
        return kiri_error_at(info, KIRI_E_IO, "state", -1, "the stored manifest does not match the stored version");
    }
    *expired = kiri_platform_wall_time() > (double)m->expires;
    *out = m;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Superseded models
 * ------------------------------------------------------------------------------------------- */

static int manifest_names(const struct kiri_manifest *m, const char *name)
{
    for (int i = 0; i < m->n_models; i++)
        if (strcmp(m->models[i].name, name) == 0)
            return 1;
    return 0;
}

/* Does the state hold exactly manifest m (its version and the hash of its bytes)? */
static int state_holds(const struct state *st, const struct kiri_manifest *m)
{
    struct kiri_manifest_policy p;
    state_policy(st, &p);
    return p.have_current && p.current_version == m->version && memcmp(p.current_sha256, m->sha256, 32) == 0;
}

int kiri_fleet_superseded(const char *models_dir, const struct kiri_manifest *m,
                          char (*names)[KIRI_MANIFEST_MAX_NAME + 1], int cap, struct kiri_status_info *info)
{
    struct state st;
    int rc = state_read(models_dir, &st, info);
    if (rc != KIRI_OK)
        return rc;
    int n = 0;
    const char *key;
    json_t *v;
    json_t *models = json_object_get(st.root, "models");
    if (st.root && state_holds(&st, m) && json_is_object(models))
        json_object_foreach(models, key, v) {
            /* The state names files inside the directory only when its names pass as manifest names. */
            if (n < cap && kiri_model_name_ok(key, strlen(key)) && !manifest_names(m, key))
                snprintf(names[n++], sizeof names[0], "%s", key);
        }
    json_decref(st.root);
    return n;
}

int kiri_fleet_remove_superseded(const char *models_dir, const struct kiri_manifest *m, const char *name,
                                 void (*log)(void *user, const char *line), void *log_user,
                                 struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!kiri_model_name_ok(name, strlen(name)) || manifest_names(m, name))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "%.64s is not a superseded model", name);
    char *lock_path = path_join(models_dir, KIRI_FLEET_LOCK_FILE);
    if (!lock_path)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    int lock = -1, rc = kiri_platform_lock_file(lock_path, &lock, info);
    kiri_mem_free(lock_path);
    if (rc != KIRI_OK)
        return rc;   /* a sync runs (kiri fleet sync): the next pass tries again */
    struct state st = {NULL};
    if ((rc = state_read(models_dir, &st, info)) != KIRI_OK)
        goto out;
    json_t *models = json_object_get(st.root, "models");
    /* Checked again under the lock: a sync that has since accepted another manifest (which may
     * name this model again) wins. */
    if (!st.root || !state_holds(&st, m) || !json_is_object(json_object_get(models, name))) {
        rc = kiri_error_set(info, KIRI_E_BUSY, "the fleet state changed; %s is left in place", name);
        goto out;
    }
    static const char *const suffixes[] = {".gguf", ".gguf.prev", ".gguf.partial"};
    int removed = 0;
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        char file[KIRI_MANIFEST_MAX_NAME + 16], line[KIRI_MANIFEST_MAX_NAME + 96];
        snprintf(file, sizeof file, "%s%s", name, suffixes[i]);
        char *path = path_join(models_dir, file);
        uint64_t size;
        if (!path) {
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
            goto out;
        }
        const int here = kiri_platform_file_size(path, &size, NULL) == KIRI_OK;
        rc = here ? kiri_platform_file_remove(path, info) : KIRI_OK;
        kiri_mem_free(path);
        if (rc != KIRI_OK)
            goto out;   /* the state keeps it: the next pass tries again */
        if (here) {
            removed++;
            snprintf(line, sizeof line, "removed %s (%llu bytes): model %s is no longer in the manifest", file,
                     (unsigned long long)size, name);
            if (log)
                log(log_user, line);
        }
    }
    json_object_del(models, name);
    if ((rc = state_write(models_dir, &st, info)) == KIRI_OK)
        rc = removed;
out:
    json_decref(st.root);
    kiri_platform_lock_release(lock);
    return rc;
}
