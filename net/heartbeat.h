/* Heartbeats: a serving node's status, POSTed as JSON to the fleet manifest's heartbeat URL at the
 * sync interval, so an operator sees which version of which model every node runs and how loaded
 * it is. A heartbeat is best effort: a failure is returned for the caller to count and never
 * changes what the node serves.
 *
 * The JSON document (docs/fleet.md shows one):
 *   {"kiri_version", "node", "manifest_version", "backend", "uptime_seconds",
 *    "requests": {"running", "waiting", "total", "errors"},
 *    "fleet": {"manifest_rejections", "model_load_failures", "model_swaps", "heartbeat_failures"},
 *    "models": [{"name", "sha256", "loaded"}]}
 * "sha256" is "" for a model whose hash is not known (a file put in the directory by hand).
 */
#ifndef KIRI_FLEET_HEARTBEAT_H
#define KIRI_FLEET_HEARTBEAT_H

#include <stddef.h>
#include <stdint.h>

struct kiri_https_client;
struct kiri_status_info;

#define KIRI_HEARTBEAT_MAX_MODELS 256

struct kiri_heartbeat_model {
    const char *name;           /* borrowed */
    const char *sha256_hex;     /* borrowed; "" when unknown */
    int loaded;
};

struct kiri_heartbeat_status {
    const char *node;           /* borrowed: the node's name (host name by default) */
    const char *kiri_version;   /* borrowed */
    uint64_t manifest_version;  /* 0 when none was accepted */
    const char *backend;        /* borrowed: the default model's backend, "" when none is loaded */
    double uptime_seconds;
    int32_t running, waiting;
    uint64_t requests_total, request_errors;   /* HTTP requests, and those answered 5xx */
    uint64_t manifest_rejections, model_load_failures, model_swaps, heartbeat_failures;
    int n_models;               /* 0..KIRI_HEARTBEAT_MAX_MODELS */
    const struct kiri_heartbeat_model *models;   /* borrowed, n_models */
};


/* POSTs the status to url with the client (the fleet's CA and timeouts). KIRI_OK when the
 * collector answered 2xx; KIRI_E_IO otherwise (info says why: the network, TLS, or the status).
 * *http_status gets the status answered (0 when none). */
int kiri_heartbeat_send(struct kiri_https_client *c, const char *url, const struct kiri_heartbeat_status *s,
                        int *http_status, struct kiri_status_info *info);

/* This machine's host name into out (cap bytes), "" when it cannot be read. */
void kiri_heartbeat_hostname(char *out, size_t cap);

#endif
