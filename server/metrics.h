/* Server metrics in the Prometheus text format: request counters by endpoint and status, token
 * counters, time-to-first-token / inter-token / end-to-end latency histograms, plus the batcher's
 * gauges (queue depth, running sequences, KV blocks, prefix-cache hits, batch size), exported
 * also under the names vLLM uses (vllm:num_requests_running, vllm:num_requests_waiting,
 * vllm:gpu_cache_usage_perc / vllm:kv_cache_usage_perc) so existing routers balance kiri nodes
 * unchanged. Thread-safe: every function may be called from any thread. */
#ifndef KIRI_SERVER_METRICS_H
#define KIRI_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

struct kiri_metrics;
struct kiri_batcher_stats;
struct kiri_upstream_stats;

int kiri_metrics_init(struct kiri_metrics **out);
void kiri_metrics_free(struct kiri_metrics *m);

/* One finished HTTP request: endpoint is a fixed route name ("/v1/chat/completions", ...,
 * "other" for unknown paths, never the raw path), status its HTTP status. */
void kiri_metrics_request(struct kiri_metrics *m, const char *endpoint, int status);
void kiri_metrics_tokens(struct kiri_metrics *m, int64_t prompt, int64_t generated, int64_t cached);
void kiri_metrics_ttft(struct kiri_metrics *m, double seconds);
void kiri_metrics_inter_token(struct kiri_metrics *m, double seconds);
void kiri_metrics_e2e(struct kiri_metrics *m, double seconds);
void kiri_metrics_auth_failure(struct kiri_metrics *m);
void kiri_metrics_client_disconnect(struct kiri_metrics *m);

/* Renders everything as Prometheus text (owned by the caller, kiri_mem_free), with the batcher's
 * current statistics and the served model's name as a label. NULL when out of memory. */
char *kiri_metrics_render(struct kiri_metrics *m, const struct kiri_batcher_stats *s, const char *model_name);

/* The served models and the fleet, kept by the server and rendered after the page above (their
 * own families): counters of loads, swaps, load failures and evictions, a kiri_model_info sample
 * per model with its id and file hash, and with fleet set the manifest version, manifest
 * rejections, syncs and heartbeat failures. */
struct kiri_metrics_models {
    uint64_t loads, swaps, load_failures, evictions;
    int64_t loaded;                         /* models loaded now */
    uint64_t memory_bytes;                  /* their estimated memory */
    int n_models;
    const char *const *ids;                 /* borrowed, n_models */
    const char *const *sha256_hex;          /* borrowed, n_models; "" unknown */
    const int *is_loaded;                   /* borrowed, n_models */
    int fleet;                              /* the families below are rendered */
    uint64_t manifest_version;              /* 0: none accepted */
    uint64_t manifest_rejections, syncs, sync_failures, model_install_failures;
    uint64_t heartbeats, heartbeat_failures;
    uint64_t removals, removed_files;   /* superseded models deleted, and their files */
};
/* Appends those families to page (an owned string from kiri_metrics_render, reallocated; the
 * result replaces it, or NULL when out of memory, page freed). */
char *kiri_metrics_render_models(char *page, const struct kiri_metrics_models *f);

/* Appends the routing families (upstream.h: requests by where they were served, fallbacks, the
 * breaker, failed forwards by reason) to page, the same way. */
char *kiri_metrics_render_upstream(char *page, const struct kiri_upstream_stats *u);

#endif
