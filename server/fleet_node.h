/* A serving node in a fleet (`kiri serve --fleet URL`): at start it serves what its models
 * directory already holds, named by the manifest held there (kiri_fleet_load_current), without
 * waiting for the network; a background thread then runs one fleet sync pass at once and every
 * interval, hot-swaps each loaded model whose file changed (the new version loads and warms up
 * while the old one serves; a version that fails to load is refused and the old one stays),
 * counts refused manifests, and POSTs a heartbeat to the manifest's heartbeat URL. After a pass
 * that installed and swapped in every model the manifest names, the models the fleet installed
 * that the manifest no longer names are taken out of service and their files (<name>.gguf and
 * .gguf.prev) deleted; one still serving a request is deleted at the first pass after its last
 * request. Files the fleet did not install (not in the directory's state) are never deleted.
 *
 * Invariants: only the node's thread runs syncs and heartbeats; the manifest fields the node
 * keeps (version, routing, upstream and heartbeat URLs) are those of the last accepted manifest
 * and change together under the node's lock; a refused manifest changes nothing.
 */
#ifndef KIRI_SERVER_FLEET_NODE_H
#define KIRI_SERVER_FLEET_NODE_H

#include <stddef.h>
#include <stdint.h>

#include "heartbeat.h"

struct kiri_models;
struct kiri_fleet_node;
struct kiri_metrics_models;
struct kiri_status_info;

struct kiri_fleet_node_params {
    const char *models_dir;
    const char *manifest_url;     /* https:// */
    const char *key_file;         /* the pinned PEM public key */
    const char *ca_file;          /* NULL: the system's CA bundle */
    const char *node_name;        /* "" or NULL: the host name */
    double interval;              /* seconds between passes */
    struct kiri_models *models;   /* borrowed: the registry swaps go to */
    /* Fills the request figures of a heartbeat (running, waiting, totals, uptime). */
    void (*status)(void *user, struct kiri_heartbeat_status *hs);
    void *status_user;
};

/* Reads the pinned key and the manifest the directory holds, and registers the directory's models
 * (the manifest's first model becomes the default). A directory without a manifest is served as
 * it is. Strings are copied. *out is owned: kiri_fleet_node_free. */
int kiri_fleet_node_init(const struct kiri_fleet_node_params *p, struct kiri_fleet_node **out,
                         struct kiri_status_info *info);
/* Starts the sync thread (its first pass runs at once). */
int kiri_fleet_node_start(struct kiri_fleet_node *n, struct kiri_status_info *info);
/* Stops the thread (a download in progress ends within about a second); the node's reports
 * (metrics, policy) keep answering until it is freed. Calling it again does nothing. */
void kiri_fleet_node_stop(struct kiri_fleet_node *n);
/* Stops the thread if it runs, and frees the node. */
void kiri_fleet_node_free(struct kiri_fleet_node *n);

/* Fills the fleet fields of the metrics (fleet = 1, manifest version, counters). */
void kiri_fleet_node_metrics(struct kiri_fleet_node *n, struct kiri_metrics_models *f);

/* What the accepted manifest says about routing, for the request router: routing ("local",
 * "local-first", "upstream-first", "upstream"; "" when no manifest is held) and the upstream URL
 * ("" when none). Returns the manifest's version, 0 when none is held. */
uint64_t kiri_fleet_node_policy(struct kiri_fleet_node *n, char routing[16], char *upstream_url, size_t cap);

#endif
