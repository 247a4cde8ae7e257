/* Keeping a models directory in step with a signed fleet manifest: fetch the signed manifest,
 * verify it against the pinned keys and the directory's stored high-water marks, raise the marks,
 * then make every model the manifest names present and verified as DIR/<name>.gguf, downloading
 * (https:// or oci://) only what is missing or different. One call does one pass and reports
 * what changed, so `kiri fleet sync` runs it once and a server can run it from a background
 * thread on a timer (the cancel flag stops it between reads).
 *
 * The directory holds, besides the models:
 * - .kiri-fleet-state.json: the accepted manifest's version and SHA-256, the clock floor (the
 *   latest `issued` accepted), the signed envelope itself (so the manifest is known at start
 *   without the network), and the hash and size of each model installed. Written to a temporary
 *   file, fsynced and renamed over the old one (then the directory fsynced): it is always
 *   either the old state or the new one.
 * - .kiri-fleet.lock: held (flock) for the whole of a sync; a second sync fails with KIRI_E_BUSY.
 * - <name>.gguf.partial, .new, .prev: see download.h. Partial files of models the manifest no
 *   longer names, and leftover .new files, are deleted at the start of each sync.
 * A model the manifest no longer names is left in place by the sync (the server may still be
 * serving it); a serving node deletes it later with kiri_fleet_remove_superseded, once nothing
 * uses it. The state's "models" records say which files the fleet installed: only those are
 * ever deleted, never a file put in the directory by hand.
 *
 * A rejected manifest changes nothing on disk: the state and the models stay as they were.
 */
#ifndef KIRI_FLEET_H
#define KIRI_FLEET_H

#include <stddef.h>
#include <stdint.h>

#include "download.h"
#include "https.h"
#include "manifest.h"

struct kiri_status_info;

#define KIRI_FLEET_STATE_FILE ".kiri-fleet-state.json"
#define KIRI_FLEET_LOCK_FILE ".kiri-fleet.lock"
#define KIRI_FLEET_STATE_MAX (8u << 20)

struct kiri_fleet_options {
    const char *models_dir;
    const char *manifest_url;           /* https:// URL of the signed envelope, or NULL when given: */
    const char *envelope;               /* a signed envelope at hand (from a file, a USB stick) */
    size_t envelope_len;
    const struct kiri_manifest_keys *keys;   /* borrowed: the pinned public keys */
    struct kiri_https_options https;    /* CA, allowlist, timeouts (cancel is set from below) */
    uint64_t disk_margin;               /* see kiri_download_request */
    int max_attempts;
    double backoff_base, backoff_max;
    double skew;                        /* seconds of clock error tolerated for `expires` */
    uint64_t max_version_jump;          /* 0: KIRI_MANIFEST_DEFAULT_MAX_JUMP */
    int verify_installed;               /* re-hash installed models instead of trusting the state */
    const volatile int *cancel;         /* may be NULL */
    void (*log)(void *user, const char *line);   /* one line per event; may be NULL */
    void *log_user;
};

/* Defaults: margin KIRI_DOWNLOAD_DEFAULT_MARGIN, 5 attempts, backoff 1 s doubling to 300 s,
 * skew 300 s, https timeouts as https.h documents. */
void kiri_fleet_options_default(struct kiri_fleet_options *o);

enum kiri_fleet_action {
    KIRI_FLEET_UNCHANGED = 0,   /* already present with the right hash */
    KIRI_FLEET_INSTALLED,       /* downloaded and installed (new, or replacing another version) */
    KIRI_FLEET_RESTORED,        /* installed from the kept previous file, without a download */
    KIRI_FLEET_FAILED           /* error says why; the file in place (if any) is untouched */
};

struct kiri_fleet_model_status {
    char name[KIRI_MANIFEST_MAX_NAME + 1];
    char file[KIRI_MANIFEST_MAX_NAME + 6];   /* name + ".gguf", inside the models directory */
    char sha256_hex[65];
    uint64_t size;
    int action;                              /* enum kiri_fleet_action */
    struct kiri_status_info *error;          /* owned; code KIRI_OK unless FAILED */
    struct kiri_download_result download;
};

struct kiri_fleet_report {
    int manifest_status;                /* KIRI_OK when a manifest was accepted (new or the same) */
    int manifest_rejected;              /* one was fetched and refused (signature, version, expiry,
                                           format); 0 when none could be fetched or read */
    struct kiri_status_info *manifest_error;  /* owned: why it was refused */
    int manifest_same;                  /* the accepted manifest is the one already held */
    uint64_t version_before;            /* 0 when the directory had none */
    uint64_t version;                   /* the version held now */
    struct kiri_manifest *manifest;     /* owned: the accepted manifest, NULL when refused */
    int n_models;
    struct kiri_fleet_model_status *models;   /* owned, n_models, in manifest order */
    int n_changed, n_failed;
    int n_stale_removed;
    int hash_mismatches;                /* over all downloads (F05 counter) */
    double seconds;
};

/* One sync pass. Returns KIRI_OK when the manifest was accepted and every model is in place;
 * otherwise the first error (the manifest's refusal, or a model's failure), with the report
 * saying what happened to each. The report is filled whatever the result: free it with
 * kiri_fleet_report_free. */
int kiri_fleet_sync(const struct kiri_fleet_options *opt, struct kiri_fleet_report *rep,
                    struct kiri_status_info *info);
void kiri_fleet_report_free(struct kiri_fleet_report *rep);

/* The verification policy a models directory's state gives (for checking a manifest without
 * applying it): have_current, version, hash and clock floor; now, skew and max_jump are left
 * for the caller. A directory without a state file gives have_current = 0. */
int kiri_fleet_state_policy(const char *models_dir, struct kiri_manifest_policy *policy,
                            struct kiri_status_info *info);

/* The manifest the directory holds (re-verified from the stored envelope with keys, expiry not
 * checked: a device keeps serving what it has), for a server starting without the network.
 * *expired tells whether its `expires` has passed by the wall clock. */
int kiri_fleet_load_current(const char *models_dir, const struct kiri_manifest_keys *keys,
                            struct kiri_manifest **out, int *expired, struct kiri_status_info *info);

/* The models the directory's state records as installed by the fleet that manifest m does not
 * name: named by an earlier manifest, superseded now. Only when the state holds m itself (its
 * version and hash); otherwise none. Their names go to names (cap entries); returns the count, or
 * a negative status when the state cannot be read. */
int kiri_fleet_superseded(const char *models_dir, const struct kiri_manifest *m,
                          char (*names)[KIRI_MANIFEST_MAX_NAME + 1], int cap, struct kiri_status_info *info);

/* Deletes superseded model name (DIR/<name>.gguf, .gguf.prev and .gguf.partial) and drops its
 * record from the state, holding the directory's sync lock. Checked again under the lock: the
 * state must still hold manifest m and record name, and m must not name it (KIRI_E_BUSY or
 * KIRI_E_INVALID_ARG otherwise, nothing deleted); KIRI_E_BUSY too while a sync holds the lock.
 * log (may be NULL) gets one line per file deleted. Returns the number of files deleted (0: only
 * the record was left), or a negative status (a file that cannot be deleted keeps the record, so
 * a later call tries again). */
int kiri_fleet_remove_superseded(const char *models_dir, const struct kiri_manifest *m, const char *name,
                                 void (*log)(void *user, const char *line), void *log_user,
                                 struct kiri_status_info *info);

#endif
