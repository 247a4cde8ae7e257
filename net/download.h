/* Downloading one model file into a models directory so that the file a reader finds under its
 * name is always whole and verified: the bytes go to DIR/NAME.partial (resumed with an HTTP Range
 * request after a cut connection, a retry or a restart of the process), are hashed with SHA-256
 * as they arrive, and only when the length and the hash match the expected ones is the file
 * fsynced, renamed to DIR/NAME.new, opened with kiri_gguf_open, and renamed over DIR/NAME (the
 * directory fsynced after each rename). The file it replaces is kept as DIR/NAME.prev (a hard
 * link) where the filesystem allows.
 *
 * Failures (docs/fleet.md): a hash mismatch deletes the partial file and retries (F05); a cut
 * or reset connection resumes from the bytes on disk (F06, F13); a body longer than expected is
 * cut at the expected length (F07); 429/5xx and network errors are retried with exponential
 * backoff and jitter, honouring Retry-After up to the cap (F08); too little free disk space for
 * the rest of the file plus a margin refuses before downloading, and a write that fails (ENOSPC)
 * deletes the partial file (F12); a file with the right hash that is not valid GGUF is deleted
 * and refused (F14). DIR/NAME is touched only by the final rename.
 *
 * Files a download leaves: NAME.partial while unfinished (resumable), NAME.new for an instant
 * between the hash check and the rename (a leftover one is stale), NAME.prev.
 */
#ifndef KIRI_FLEET_DOWNLOAD_H
#define KIRI_FLEET_DOWNLOAD_H

#include <stddef.h>
#include <stdint.h>

struct kiri_status_info;
struct kiri_https_client;

#define KIRI_DOWNLOAD_DEFAULT_MARGIN (64ull << 20)

struct kiri_download_request {
    const char *url;                /* https:// */
    const char *const *headers;     /* extra request headers (NULL-terminated), or NULL */
    const char *dir;                /* the models directory */
    const char *name;               /* the file name inside dir: NAME.gguf, NAME a model name (names.h) */
    uint8_t sha256[32];             /* the expected hash */
    uint64_t size;                  /* the expected length in bytes (>= 1) */
    uint64_t disk_margin;           /* free bytes that must remain after the download */
    int max_attempts;               /* requests in all, >= 1 (<= 0: 5) */
    double backoff_base;            /* seconds before the first retry (<= 0: 1) */
    double backoff_max;             /* the longest wait, Retry-After included (<= 0: 300) */
    int skip_gguf_check;            /* non-zero: install without opening the file as GGUF */
    const volatile int *cancel;     /* non-zero: stop soon with KIRI_E_CANCELLED; may be NULL */
    void (*log)(void *user, const char *line);   /* progress and retry lines; may be NULL */
    void *log_user;
};

/* What happened, filled whatever kiri_download_install returns. */
struct kiri_download_result {
    int attempts;                   /* HTTP requests made */
    int resumed;                    /* of which continued a partial file with Range */
    int restarted;                  /* partial files discarded (server ignored Range, changed, 416) */
    int hash_mismatches;            /* complete files whose SHA-256 was wrong (F05) */
    int retries_after;              /* waits that followed a Retry-After */
    int last_status;                /* the last HTTP status, 0 when none */
    uint64_t bytes_received;        /* body bytes written, over all attempts */
    uint64_t bytes_reused;          /* bytes of a partial file found at the start */
    double seconds;
};

/* Downloads, verifies and installs one file (see the top of this header). Errors:
 * KIRI_E_MODEL_INVALID (field "sha256" after the last attempt, "gguf", "size" when the server's
 * file has another length), KIRI_E_IO (field "disk" for space and writes; "http", "certificate",
 * "redirect", "timeout", ... from the HTTPS client), KIRI_E_BUSY (429/503 until the last
 * attempt), KIRI_E_CANCELLED, KIRI_E_INVALID_ARG. On any error DIR/NAME is as it was. */
int kiri_download_install(struct kiri_https_client *client, const struct kiri_download_request *req,
                          struct kiri_download_result *res, struct kiri_status_info *info);

/* Installs a local file (for a rollback: NAME.prev, or another model's file) as DIR/NAME the
 * same way, if its length and hash are the expected ones: the file is hard-linked to NAME.new,
 * opened as GGUF and renamed over NAME. src itself is left in place. Fails with
 * KIRI_E_UNSUPPORTED where the filesystem has no hard links (then download instead). */
int kiri_download_install_local(const char *src, const struct kiri_download_request *req,
                                struct kiri_status_info *info);

/* SHA-256 of a whole file (not a .partial one), read through a read-only mapping. */
int kiri_download_file_sha256(const char *path, uint8_t out[32], struct kiri_status_info *info);

/* Removes what interrupted downloads left in dir: every NAME.new and NAME.link, and every
 * NAME.partial whose NAME is not in keep (NULL-terminated; NULL keeps none). Returns the number
 * of files removed, or a negative status. */
int kiri_download_remove_stale(const char *dir, const char *const *keep, struct kiri_status_info *info);

#endif
