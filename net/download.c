/* Verified, resumable model downloads into a models directory (download.h).
 *
 * One struct job carries a download across its attempts: the partial file's descriptor, the
 * SHA-256 state of the bytes in it (so a retry in the same process does not re-read them; a new
 * process hashes the partial file once before resuming), and the validator the server gave, sent
 * back with If-Range. Every attempt is one GET; the body callback checks the response against the
 * expected length before it writes a byte and stops exactly at that length.
 */
#include "download.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "mbedtls/sha256.h"

#include "error.h"
#include "https.h"
#include "kiri.h"
#include "mem.h"
#include "names.h"
#include "net_platform.h"

#define READ_CHUNK (1u << 20)

struct job {
    const struct kiri_download_request *req;
    struct kiri_download_result *res;
    char *final, *partial, *staged, *prev;   /* owned paths */
    int fd;                                  /* the partial file, or -1 */
    uint64_t have;                           /* bytes in the partial file */
    mbedtls_sha256_context sha;              /* over the partial file's bytes */
    uint64_t hashed;                         /* bytes the state covers; == have when in step */
    char validator[128];                     /* ETag or Last-Modified of the last response */
    /* Set by the body callback for the attempt in progress: */
    int checked;                             /* the response was checked against the request */
    int cut;                                 /* stopped at the expected length (more was coming) */
    int size_mismatch;                       /* the server's file has another length */
    int write_failed;
    struct kiri_status_info write_error;
};

static void logf_(const struct job *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void logf_(const struct job *j, const char *fmt, ...)
{
    if (!j->req->log)
        return;
    char line[400];
    int n = snprintf(line, sizeof line, "%s: ", j->req->name);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n, fmt, ap);
    va_end(ap);
    j->req->log(j->req->log_user, line);
}

static char *join(const char *dir, const char *name, const char *suffix)
{
    size_t a = strlen(dir), b = strlen(name), c = strlen(suffix);
    char *p = kiri_mem_alloc(a + b + c + 2);
    if (p) {
        memcpy(p, dir, a);
        p[a] = '/';
        memcpy(p + a + 1, name, b);
        memcpy(p + a + 1 + b, suffix, c + 1);
    }
    return p;
}

static int cancelled(const struct job *j) { return j->req->cancel && *j->req->cancel; }

/* ---------------------------------------------------------------------------------------------
 * The partial file
 * ------------------------------------------------------------------------------------------- */

static void close_partial(struct job *j)
{
    if (j->fd >= 0)
        kiri_platform_file_abort(j->fd, NULL);
    j->fd = -1;
}

/* Deletes the partial file and starts the hash over. */
static void discard_partial(struct job *j)
{
    close_partial(j);
    kiri_platform_file_remove(j->partial, NULL);
    j->have = 0;
    j->hashed = 0;
    j->validator[0] = '\0';
    mbedtls_sha256_starts(&j->sha, 0);
}

/* Opens the partial file and brings the hash state in step with its bytes. */
static int open_partial(struct job *j, struct kiri_status_info *info)
{
    int rc;
    if (j->fd < 0 && (rc = kiri_platform_file_open_append(j->partial, &j->fd, &j->have, info)) != KIRI_OK)
        return rc;
    if (j->have > j->req->size) {
        logf_(j, "the partial file is longer than the model (%llu bytes); starting over", (unsigned long long)j->have);
        discard_partial(j);
        j->res->restarted++;
        return open_partial(j, info);
    }
    if (j->hashed == j->have)
        return KIRI_OK;
    /* A partial file left by an earlier process: hash what it holds. */
    mbedtls_sha256_starts(&j->sha, 0);
    j->hashed = 0;
    unsigned char *buf = kiri_mem_alloc(READ_CHUNK);
    if (!buf)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory hashing %s", j->partial);
    rc = KIRI_OK;
    while (j->hashed < j->have) {
        size_t got = 0;
        if ((rc = kiri_platform_file_read(j->fd, j->partial, buf, READ_CHUNK, &got, info)) != KIRI_OK)
            break;
        if (got == 0)
            break;
        if ((uint64_t)got > j->have - j->hashed)
            got = (size_t)(j->have - j->hashed);
        mbedtls_sha256_update(&j->sha, buf, got);
        j->hashed += got;
        if (cancelled(j)) {
            rc = kiri_error_set(info, KIRI_E_CANCELLED, "cancelled");
            break;
        }
    }
    kiri_mem_free(buf);
    if (rc == KIRI_OK && j->hashed != j->have) {
        logf_(j, "the partial file shrank while it was read; starting over");
        discard_partial(j);
        return open_partial(j, info);
    }
    if (rc == KIRI_OK && j->have > 0) {
        j->res->bytes_reused = j->have;
        logf_(j, "found a partial file of %llu bytes", (unsigned long long)j->have);
    }
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * One attempt
 * ------------------------------------------------------------------------------------------- */

/* Checks a response before its first byte is written: 206 must continue exactly where the
 * partial file ends; 200 is the whole file, so a partial file is dropped first. Returns 0 to go
 * on, 1 to stop. */
static int check_response(struct job *j, const struct kiri_https_response *r)
{
    j->checked = 1;
    const uint64_t size = j->req->size;
    if (r->status == 206) {
        if (j->have == 0 || r->range_start != j->have || (r->range_total >= 0 && (uint64_t)r->range_total != size) ||
            (r->content_length >= 0 && (uint64_t)r->content_length > size - j->have)) {
            j->size_mismatch = r->range_total >= 0 && (uint64_t)r->range_total != size;
            logf_(j, "the server resumed at byte %llu of %lld, not %llu of %llu; starting over",
                  (unsigned long long)r->range_start, (long long)r->range_total, (unsigned long long)j->have,
                  (unsigned long long)size);
            return 1;
        }
    } else {
        if (r->content_length >= 0 && (uint64_t)r->content_length != size) {
            j->size_mismatch = 1;
            return 1;
        }
        if (j->have > 0) {
            logf_(j, "the server sent the whole file instead of the rest; starting over");
            discard_partial(j);
            j->res->restarted++;
            struct kiri_status_info e;
            if (open_partial(j, &e) != KIRI_OK) {
                j->write_failed = 1;
                j->write_error = e;
                return 1;
            }
        }
    }
    if (r->etag[0])
        snprintf(j->validator, sizeof j->validator, "%s", r->etag);
    else if (r->last_modified[0])
        snprintf(j->validator, sizeof j->validator, "%s", r->last_modified);
    return 0;
}

static int on_body(void *user, const struct kiri_https_response *r, const void *data, size_t n)
{
    struct job *j = user;
    if (!j->checked && check_response(j, r))
        return 1;
    int stop = 0;
    if (j->have + n > j->req->size) {
        n = (size_t)(j->req->size - j->have); /* F07: not one byte past the expected length */
        j->cut = 1;
        stop = 1;
    }
    if (n > 0) {
        if (kiri_platform_file_write(j->fd, j->partial, data, n, &j->write_error) != KIRI_OK) {
            j->write_failed = 1;
            return 1;
        }
        mbedtls_sha256_update(&j->sha, data, n);
        j->have += n;
        j->hashed += n;
        j->res->bytes_received += n;
    }
    return stop || cancelled(j);
}

/* ---------------------------------------------------------------------------------------------
 * Installing a verified file
 * ------------------------------------------------------------------------------------------- */

/* Opens the staged file as GGUF (F14), keeps the file it replaces as NAME.prev and renames the
 * staged file over NAME. The staged file is removed on failure. */
static int promote(struct job *j, struct kiri_status_info *info)
{
    if (!j->req->skip_gguf_check) {
        struct kiri_status_info ge;
        if (kiri_model_file_check(j->staged, &ge) != KIRI_OK) {
            kiri_platform_file_remove(j->staged, NULL);
            return kiri_error_at(info, KIRI_E_MODEL_INVALID, "gguf", -1,
                                 "the file has the expected hash but is not a valid GGUF model (%.150s); not installed",
                                 ge.message);
        }
    }
    uint64_t old;
    if (kiri_platform_file_size(j->final, &old, NULL) == KIRI_OK) {
        struct kiri_status_info le;
        if (kiri_platform_file_link(j->final, j->prev, &le) != KIRI_OK)
            logf_(j, "cannot keep the previous file (%s)", le.message);
    }
    int rc = kiri_platform_file_rename_durable(j->staged, j->final, info);
    if (rc != KIRI_OK)
        kiri_platform_file_remove(j->staged, NULL);
    return rc;
}

/* Flushes the verified partial file, renames it to NAME.new and promotes it. */
static int install(struct job *j, struct kiri_status_info *info)
{
    int fd = j->fd;
    j->fd = -1;
    int rc = kiri_platform_file_sync_close(fd, j->partial, info);
    if (rc == KIRI_OK)
        rc = kiri_platform_file_rename_durable(j->partial, j->staged, info);
    if (rc != KIRI_OK) {
        kiri_platform_file_remove(j->partial, NULL);
        return rc;
    }
    return promote(j, info);
}

/* ---------------------------------------------------------------------------------------------
 * The retry loop
 * ------------------------------------------------------------------------------------------- */

/* Sleeps seconds in slices, returning early (non-zero) when cancelled. */
static int nap(const struct job *j, double seconds)
{
    const double end = kiri_platform_now() + seconds;
    for (;;) {
        if (cancelled(j))
            return 1;
        double left = end - kiri_platform_now();
        if (left <= 0)
            return 0;
        kiri_platform_sleep(left < 0.2 ? left : 0.2);
    }
}

/* Exponential backoff with "equal jitter": half the step fixed, half random. */
static double backoff(const struct kiri_download_request *req, int attempt, double retry_after)
{
    const double base = req->backoff_base > 0 ? req->backoff_base : 1.0;
    const double cap = req->backoff_max > 0 ? req->backoff_max : 300.0;
    double d = base;
    for (int i = 1; i < attempt && d < cap; i++)
        d *= 2;
    if (d > cap)
        d = cap;
    uint32_t r = 0;
    kiri_platform_random(&r, sizeof r, NULL);
    d = d * 0.5 + d * 0.5 * ((double)r / 4294967296.0);
    if (retry_after >= 0)
        d = retry_after > cap ? cap : retry_after > d ? retry_after : d;
    return d;
}

int kiri_download_install(struct kiri_https_client *client, const struct kiri_download_request *req,
                          struct kiri_download_result *res, struct kiri_status_info *info)
{
    memset(res, 0, sizeof *res);
    const double t0 = kiri_platform_now();
    if (!req->url || !req->dir || !req->name || !kiri_model_file_ok(req->name) || req->size == 0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "download: bad request (url, dir, name and size are needed)");
    struct job j;
    memset(&j, 0, sizeof j);
    j.req = req;
    j.res = res;
    j.fd = -1;
    mbedtls_sha256_init(&j.sha);
    mbedtls_sha256_starts(&j.sha, 0);
    j.final = join(req->dir, req->name, "");
    j.partial = join(req->dir, req->name, ".partial");
    j.staged = join(req->dir, req->name, ".new");
    j.prev = join(req->dir, req->name, ".prev");
    const int max_attempts = req->max_attempts > 0 ? req->max_attempts : 5;
    int rc = KIRI_OK;
    if (!j.final || !j.partial || !j.staged || !j.prev) {
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory starting a download");
        goto done;
    }
    for (int attempt = 1;; attempt++) {
        double retry_after = -1;
        if (cancelled(&j)) {
            rc = kiri_error_set(info, KIRI_E_CANCELLED, "%s: cancelled", req->name);
            break;
        }
        if ((rc = open_partial(&j, info)) != KIRI_OK)
            break;
        /* F12: room for the rest of the file and the margin, before a byte is fetched. */
        uint64_t avail = 0;
        if ((rc = kiri_platform_disk_free(req->dir, &avail, info)) != KIRI_OK)
            break;
        const uint64_t need = req->size - j.have + req->disk_margin;
        if (avail < need) {
            discard_partial(&j);
            close_partial(&j);
            rc = kiri_error_at(info, KIRI_E_IO, "disk", -1,
                               "%s: not enough disk space: %llu bytes free, %llu needed (the rest of the file "
                               "and a %llu-byte margin)",
                               req->name, (unsigned long long)avail, (unsigned long long)need,
                               (unsigned long long)req->disk_margin);
            break;
        }
        int retryable = 0;
        if (j.have < req->size) {
            struct kiri_https_request hr = {.url = req->url, .headers = req->headers, .range_start = j.have,
                                            .if_range = j.validator[0] ? j.validator : NULL};
            struct kiri_https_response *resp = kiri_mem_alloc(sizeof *resp);
            if (!resp) {
                rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory downloading %s", req->name);
                break;
            }
            j.checked = j.cut = j.size_mismatch = j.write_failed = 0;
            const uint64_t before = res->bytes_received;
            res->attempts++;
            if (j.have > 0) {
                res->resumed++;
                logf_(&j, "attempt %d/%d: resuming at byte %llu of %llu", attempt, max_attempts,
                      (unsigned long long)j.have, (unsigned long long)req->size);
            } else {
                logf_(&j, "attempt %d/%d: downloading %llu bytes", attempt, max_attempts, (unsigned long long)req->size);
            }
            rc = kiri_https_get(client, &hr, on_body, &j, resp, info);
            res->last_status = resp->status;
            retry_after = resp->retry_after;
            if (j.write_failed) {
                /* F12: a full disk (or another write error) deletes the partial file. */
                discard_partial(&j);
                close_partial(&j);
                rc = kiri_error_at(info, j.write_error.code ? j.write_error.code : KIRI_E_IO, "disk", -1, "%s: %.200s",
                                   req->name, j.write_error.message);
                break;
            }
            if (j.size_mismatch) {
                rc = kiri_error_at(info, KIRI_E_MODEL_INVALID, "size", -1,
                                   "%s: the server's file is %lld bytes, the manifest says %llu", req->name,
                                   (long long)(resp->range_total >= 0 ? resp->range_total : resp->content_length),
                                   (unsigned long long)req->size);
                kiri_mem_free(resp);
                discard_partial(&j);
                close_partial(&j);
                break;
            }
            if (rc == KIRI_E_CANCELLED && resp->failure == KIRI_HTTPS_ABORTED && j.checked && !j.cut && !cancelled(&j)) {
                /* check_response refused a 206 that does not continue our bytes. */
                discard_partial(&j);
                res->restarted++;
                retryable = 1;
            } else if (rc == KIRI_E_CANCELLED && j.cut) {
                logf_(&j, "the server sent more than %llu bytes; cut there", (unsigned long long)req->size);
                rc = KIRI_OK;
            } else if (rc != KIRI_OK) {
                retryable = kiri_https_failure_retryable(resp->failure);
                if (rc == KIRI_E_CANCELLED && resp->failure != KIRI_HTTPS_ABORTED) {
                    kiri_mem_free(resp);
                    break;
                }
                if (cancelled(&j)) {
                    rc = kiri_error_set(info, KIRI_E_CANCELLED, "%s: cancelled", req->name);
                    kiri_mem_free(resp);
                    break;
                }
                logf_(&j, "attempt %d failed after %llu new bytes: %s", attempt,
                      (unsigned long long)(res->bytes_received - before),
                      info ? info->message : "");
            } else if (resp->status == 416) {
                logf_(&j, "the server cannot serve byte %llu on (HTTP 416); starting over", (unsigned long long)j.have);
                discard_partial(&j);
                res->restarted++;
                rc = kiri_error_at(info, KIRI_E_IO, "http", -1, "%s: HTTP 416", req->name);
                retryable = 1;
            } else if (resp->status < 200 || resp->status >= 300) {
                retryable = kiri_https_status_retryable(resp->status);
                rc = kiri_error_at(info, resp->status == 429 || resp->status == 503 ? KIRI_E_BUSY : KIRI_E_IO, "http",
                                   -1, "%s: HTTP %d from %.150s", req->name, resp->status, resp->url);
                logf_(&j, "attempt %d: HTTP %d%s", attempt, resp->status, resp->retry_after >= 0 ? " with Retry-After" : "");
            } else if (j.have < req->size) {
                rc = kiri_error_at(info, KIRI_E_IO, "truncated", -1, "%s: the body ended at byte %llu of %llu",
                                   req->name, (unsigned long long)j.have, (unsigned long long)req->size);
                logf_(&j, "attempt %d: %s", attempt, info ? info->message : "truncated");
                retryable = 1;
            }
            kiri_mem_free(resp);
        }
        if (rc == KIRI_OK && j.have == req->size) {
            uint8_t got[32];
            mbedtls_sha256_context fin;
            mbedtls_sha256_init(&fin);
            mbedtls_sha256_clone(&fin, &j.sha);
            mbedtls_sha256_finish(&fin, got);
            mbedtls_sha256_free(&fin);
            if (memcmp(got, req->sha256, 32) == 0) {
                rc = install(&j, info);
                if (rc == KIRI_OK)
                    logf_(&j, "installed (%llu bytes, sha256 verified)", (unsigned long long)req->size);
                break;
            }
            /* F05: never keep or install bytes with the wrong hash. */
            res->hash_mismatches++;
            discard_partial(&j);
            rc = kiri_error_at(info, KIRI_E_MODEL_INVALID, "sha256", -1,
                               "%s: sha256 mismatch: the downloaded file is not the one the manifest names",
                               req->name);
            logf_(&j, "attempt %d: sha256 mismatch; partial file deleted", attempt);
            retryable = 1;
        }
        if (!retryable || attempt >= max_attempts)
            break;
        const double wait = backoff(req, attempt, retry_after);
        if (retry_after >= 0)
            res->retries_after++;
        logf_(&j, "retrying in %.2f s", wait);
        close_partial(&j);
        if (nap(&j, wait)) {
            rc = kiri_error_set(info, KIRI_E_CANCELLED, "%s: cancelled", req->name);
            break;
        }
    }
done:
    close_partial(&j);
    mbedtls_sha256_free(&j.sha);
    kiri_mem_free(j.final);
    kiri_mem_free(j.partial);
    kiri_mem_free(j.staged);
    kiri_mem_free(j.prev);
    res->seconds = kiri_platform_now() - t0;
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Helpers for callers
 * ------------------------------------------------------------------------------------------- */

int kiri_download_file_sha256(const char *path, uint8_t out[32], struct kiri_status_info *info)
{
    struct kiri_mapping m;
    int rc = kiri_platform_map_file(path, &m, info);
    if (rc != KIRI_OK)
        return rc;
    mbedtls_sha256((const unsigned char *)(m.addr ? m.addr : ""), m.size, out, 0);
    kiri_platform_unmap(&m);
    return KIRI_OK;
}

int kiri_download_install_local(const char *src, const struct kiri_download_request *req,
                                struct kiri_status_info *info)
{
    if (!req->dir || !req->name || !kiri_model_file_ok(req->name))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "install: bad request (dir and name are needed)");
    uint64_t size = 0;
    int rc = kiri_platform_file_size(src, &size, info);
    if (rc == 1)
        return kiri_error_set(info, KIRI_E_IO, "%s: no such file", src);
    if (rc != KIRI_OK)
        return rc;
    if (size != req->size)
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, "size", -1, "%s is %llu bytes, not %llu", src,
                             (unsigned long long)size, (unsigned long long)req->size);
    uint8_t h[32];
    if ((rc = kiri_download_file_sha256(src, h, info)) != KIRI_OK)
        return rc;
    if (memcmp(h, req->sha256, 32) != 0)
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, "sha256", -1, "%s: sha256 mismatch", src);
    struct job j;
    memset(&j, 0, sizeof j);
    struct kiri_download_result res;
    memset(&res, 0, sizeof res);
    j.req = req;
    j.res = &res;
    j.fd = -1;
    j.final = join(req->dir, req->name, "");
    j.staged = join(req->dir, req->name, ".new");
    j.prev = join(req->dir, req->name, ".prev");
    if (!j.final || !j.staged || !j.prev)
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory installing %s", req->name);
    else if ((rc = kiri_platform_file_link(src, j.staged, info)) == KIRI_OK)
        rc = promote(&j, info);
    if (rc == KIRI_OK)
        logf_(&j, "installed from %s (sha256 verified, no download)", src);
    kiri_mem_free(j.final);
    kiri_mem_free(j.staged);
    kiri_mem_free(j.prev);
    return rc;
}

struct stale {
    const char *dir;
    const char *const *keep;
    int removed;
};

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a > b && strcmp(s + a - b, suffix) == 0;
}

static int visit_stale(void *user, const char *name)
{
    struct stale *s = user;
    int drop = 0;
    if (ends_with(name, ".new") || ends_with(name, ".link")) {
        drop = 1;
    } else if (ends_with(name, ".partial")) {
        drop = 1;
        size_t n = strlen(name) - 8;
        for (const char *const *k = s->keep; k && *k; k++)
            if (strlen(*k) == n && strncmp(*k, name, n) == 0)
                drop = 0;
    }
    if (drop && name[0] != '.') {
        char *p = join(s->dir, name, "");
        if (p && kiri_platform_file_remove(p, NULL) == KIRI_OK)
            s->removed++;
        kiri_mem_free(p);
    }
    return 0;
}

int kiri_download_remove_stale(const char *dir, const char *const *keep, struct kiri_status_info *info)
{
    struct stale s = {dir, keep, 0};
    int rc = kiri_platform_list_dir(dir, visit_stale, &s, info);
    return rc < 0 ? rc : s.removed;
}
