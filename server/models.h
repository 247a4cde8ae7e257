/* The models a server serves, by id: each one a file that may be loaded (a slot: the model, its
 * batching loop, chat template and the texts of its BOS and EOS tokens) or not yet. Requests
 * acquire the slot of the model they name at their start and release it at their end; a hot-swap
 * publishes a new slot and retires the old one, which is freed only when its last request has
 * released it, so a request never sees its model freed under it, even during a hot-swap.
 *
 * Invariants, under the registry's lock:
 * - every entry has a unique id of 1..127 bytes and a path; an entry is removed (a fleet manifest
 *   no longer names it) only while no load or swap of it runs, and its slot then retires;
 * - an entry's published slot (if any) is loaded and started; at most one load or swap of an
 *   entry runs at a time (its `busy` flag);
 * - a slot's refs counts the requests holding it plus one while it is published; the slot is
 *   freed by whoever drops refs to zero, always after it was unpublished;
 * - the memory estimate of every slot not yet freed (published or retired) is in `used`; a load
 *   on demand first unloads the least recently used idle slots until the new one fits the budget.
 */
#ifndef KIRI_SERVER_MODELS_H
#define KIRI_SERVER_MODELS_H

#include <stddef.h>
#include <stdint.h>

struct kiri_model;
struct kiri_batcher;
struct kiri_batcher_stats;
struct kiri_chat_prompt;
struct kiri_models;
struct kiri_status_info;

#define KIRI_MODELS_MAX 256
#define KIRI_MODELS_ID_MAX 128

/* A loaded model. Everything here is read-only once published; it lives until released. */
struct kiri_served_model {
    char id[KIRI_MODELS_ID_MAX];
    char sha256_hex[65];                 /* of the file, "" when unknown */
    struct kiri_model *model;            /* owned */
    struct kiri_model *draft;            /* owned, or NULL: the draft model of its batcher */
    struct kiri_batcher *batcher;        /* owned, started */
    struct kiri_chat_prompt *chat;       /* owned: its template, BOS/EOS texts */
    int32_t n_ctx;                       /* tokens per sequence */
    char backend[32];                    /* "cpu", or "cuda+cpu" when layers are split */
    uint64_t cost;                       /* bytes: the file's size plus the KV pool's */
    /* the registry's, under its lock */
    int refs;
    int published;
    double last_used;
    struct kiri_served_model *next_retired;   /* borrowed: the registry's list of retired slots */
};

/* How every model is loaded (the server's flags). */
struct kiri_models_params {
    const char *backend;      /* "auto", "cpu", ... */
    int n_threads;
    int gpu_layers;           /* as kiri_model_params: < 0 all layers on a GPU backend */
    const char *cpu_kernels;  /* as kiri_model_params; NULL: auto */
    int32_t n_ctx;            /* 0: the model's */
    uint64_t kv_memory;       /* 0: n_ctx * max_seqs tokens */
    int kv_type;              /* enum kiri_kv_type */
    int32_t max_seqs, chunk, queue_cap;
    int32_t spec_max_seqs;    /* as kiri_batcher_params (0: no drafts) */
    const char *draft_model;  /* a file drafting for every model loaded (their vocabulary), or NULL */
    int speculative;          /* speculation was asked for at start-up (--spec, --draft-model): models
                                 with recurrent layers make their spare state slots (else they
                                 serve every request without drafts, and pay nothing for it) */
    int mtp;                  /* --spec mtp: models run their multi-token-prediction head as the
                                 drafter of "mtp"; 1: a model without one fails to load (--model),
                                 2: it serves without (--models-dir) */
    uint64_t memory_budget;   /* bytes for all loaded models together; 0: no limit */
    int warm_up;              /* run one token through a new model before it serves */
    void (*log)(void *user, const char *line);   /* may be NULL */
    void *log_user;
};

/* The registry (params copied; strings borrowed for the registry's lifetime). *out is owned:
 * kiri_models_free, which stops every loaded model (running requests are cancelled). */
int kiri_models_init(const struct kiri_models_params *p, struct kiri_models **out);
void kiri_models_free(struct kiri_models *r);

/* Stops every loaded model's batching loop, ending its requests as cancelled (server shutdown,
 * before the listener closes); the slots stay until kiri_models_free. */
void kiri_models_stop(struct kiri_models *r);

/* Adds a model by id, not loaded; sha256_hex may be NULL or "". An id already present is left
 * as it is (returns 1). */
int kiri_models_add(struct kiri_models *r, const char *id, const char *path, const char *sha256_hex,
                    struct kiri_status_info *info);
/* Adds every DIR/NAME.gguf (a regular file; NAME a model name, base/names.h: 1 to 64 bytes of
 * [A-Za-z0-9._-], not starting with '.') as model NAME. Returns KIRI_OK, or the directory's error. */
int kiri_models_scan_dir(struct kiri_models *r, const char *dir, struct kiri_status_info *info);
/* The same, leaving out the n_skip ids in skip (models being removed). */
int kiri_models_scan_dir_except(struct kiri_models *r, const char *dir, const char *const *skip, int n_skip,
                                struct kiri_status_info *info);
/* Makes id the model a request without a model field gets (the first added one otherwise). */
void kiri_models_set_default(struct kiri_models *r, const char *id);

/* The slot of model id (NULL or "": the default), loading it first when it is not loaded.
 * Release it with kiri_models_release. Errors: KIRI_E_INVALID_ARG, field "model": no such model;
 * KIRI_E_BUSY: it is loading, or the memory budget is held by models in use (retry later); any
 * load error (the model stays unloaded and the next request tries again). */
int kiri_models_acquire(struct kiri_models *r, const char *id, struct kiri_served_model **out,
                        struct kiri_status_info *info);
/* The slot of id only when it is loaded (no load); NULL otherwise. Release it too. */
struct kiri_served_model *kiri_models_acquire_loaded(struct kiri_models *r, const char *id);
void kiri_models_release(struct kiri_models *r, struct kiri_served_model *m);
/* Loads id now if it is not loaded (at start-up). */
int kiri_models_load(struct kiri_models *r, const char *id, struct kiri_status_info *info);

/* Points id at a new file (adding the model when it is new). When id is loaded, the new file is
 * loaded (and warmed up) beside the old slot, which serves until the new one is published and is
 * then retired: *swapped = 1. When that load fails the old slot stays and the error is returned
 * (the entry keeps the old file's hash, and the same hash is not tried again until another
 * arrives). When id is not loaded only the path and hash change. */
int kiri_models_update(struct kiri_models *r, const char *id, const char *path, const char *sha256_hex,
                       int *swapped, struct kiri_status_info *info);

/* Takes id out of the registry: new requests for it get "no such model" and it leaves the lists;
 * its slot retires and is freed when the last request holding it ends (at once when none does).
 * Waits for a load or swap of it that runs. Returns KIRI_OK, 1 when id is not there, or
 * KIRI_E_BUSY when a load of it has not ended in time. The default moves to the first entry left
 * when id was the default. */
int kiri_models_remove(struct kiri_models *r, const char *id, struct kiri_status_info *info);
/* Is a slot of id (published or retired) held by a request now? */
int kiri_models_in_use(struct kiri_models *r, const char *id);

/* Does the registry hold id (loaded or not)? NULL or "": is there a default? */
int kiri_models_has(struct kiri_models *r, const char *id);
/* The ids, in the order added, into ids (cap entries of KIRI_MODELS_ID_MAX bytes); returns the
 * count (at most cap). */
int kiri_models_list(struct kiri_models *r, char (*ids)[KIRI_MODELS_ID_MAX], int cap);

/* One model's state for reports (heartbeats, metrics). */
struct kiri_models_info {
    char id[KIRI_MODELS_ID_MAX];
    char sha256_hex[65];      /* of the loaded file when loaded, else the entry's */
    int loaded;
    char backend[32];         /* as kiri_served_model's, "" when not loaded */
    int32_t running, waiting;
};
/* Fills at most cap entries; returns the count. */
int kiri_models_snapshot(struct kiri_models *r, struct kiri_models_info *out, int cap);
/* The batcher statistics of every loaded model added together (block size: the default's). */
void kiri_models_stats(struct kiri_models *r, struct kiri_batcher_stats *out);
/* The default model's id ("" when none). */
void kiri_models_default_id(struct kiri_models *r, char out[KIRI_MODELS_ID_MAX]);

/* Counters since init. */
struct kiri_models_counts {
    uint64_t loads, load_failures, swaps, evictions;
    int n_loaded;
    uint64_t bytes_used;
};
void kiri_models_counts(struct kiri_models *r, struct kiri_models_counts *out);

#endif
