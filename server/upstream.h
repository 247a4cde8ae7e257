/* The cloud upstream of `kiri serve`: an OpenAI-compatible server (vLLM, another kiri, a hosted
 * API) that generation requests are forwarded to by the routing policy, its answer relayed to the
 * client as it arrives (an event stream event by event), with a circuit breaker so that a dead
 * upstream is not hammered, and checks on what comes back (docs/fleet.md, "Routing").
 *
 * Invariants of a struct kiri_upstream:
 * - it is shared by every HTTP worker thread: the target (URL, key, idle clients), the routing
 *   policy and the breaker change only under its lock, and a forward holds a reference to the
 *   target it started with, so kiri_upstream_reconfigure never pulls one out from under it;
 * - the API key lives only in the target's Authorization header line, is zeroed before it is
 *   freed, and appears in no message, log line or metric;
 * - the client's own headers (its Authorization above all) are never forwarded: a forward sends
 *   the request body, the upstream key and nothing else of the client's;
 * - the breaker admits at most one half-open probe at a time.
 */
#ifndef KIRI_FLEET_UPSTREAM_H
#define KIRI_FLEET_UPSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"

struct kiri_status_info;

#define KIRI_UPSTREAM_MAX_RESPONSE ((uint64_t)64 << 20)   /* default cap on one answer's bytes */
#define KIRI_UPSTREAM_MAX_EVENT ((size_t)1 << 20)         /* one Server-Sent Event */
#define KIRI_UPSTREAM_MAX_KEY 4096

/* ---- Routing policy ---- */

enum kiri_route {
    KIRI_ROUTE_LOCAL = 0,       /* never forward (no upstream, or a manifest saying "local") */
    KIRI_ROUTE_LOCAL_FIRST,     /* forward when the local queue is long or the model is not local */
    KIRI_ROUTE_CLOUD_FIRST      /* forward; serve locally when the upstream fails */
};

/* Reads a policy name: local-first, cloud-first, and the manifest's spellings local,
 * upstream-first (= cloud-first) and upstream (= cloud-first: kiri never refuses a request it
 * could serve itself). 0, or -1 for anything else. */
int kiri_route_parse(const char *name, enum kiri_route *out);
const char *kiri_route_name(enum kiri_route r);

/* ---- Circuit breaker (no lock of its own; the upstream holds its lock around these) ---- */

enum kiri_breaker_state { KIRI_BREAKER_CLOSED = 0, KIRI_BREAKER_OPEN = 1, KIRI_BREAKER_HALF_OPEN = 2 };

/* Closed: every request passes; threshold consecutive failures open it. Open: nothing passes
 * until open_until, then it is half-open and one request passes as a probe. The probe's success
 * closes it (cool-down back to base); its failure opens it again for twice the last cool-down
 * (at most max); a neutral probe (429, a client that left) lets the next request probe. */
struct kiri_breaker {
    enum kiri_breaker_state state;
    int threshold;              /* consecutive failures that open it, >= 1 */
    int failures;               /* consecutive failures while closed */
    double base, max;           /* the first and the longest cool-down, seconds */
    double cooldown;            /* the cool-down of the current (or last) opening */
    double open_until;          /* when an open breaker turns half-open (clock of the caller) */
    int probing;                /* a half-open probe is in flight */
    uint64_t opens;             /* times it opened */
};

enum kiri_breaker_ticket { KIRI_BREAKER_REFUSED = 0, KIRI_BREAKER_PASS, KIRI_BREAKER_PROBE };
enum kiri_breaker_result { KIRI_BREAKER_SUCCESS = 0, KIRI_BREAKER_FAILURE, KIRI_BREAKER_NEUTRAL };

/* threshold < 1: 3; base <= 0: 2 s; max < base: 60 s (or base when that is longer). */
void kiri_breaker_init(struct kiri_breaker *b, int threshold, double base, double max);
/* May a request go to the upstream at time now? A ticket other than REFUSED must be given back
 * with kiri_breaker_release. */
enum kiri_breaker_ticket kiri_breaker_acquire(struct kiri_breaker *b, double now);
/* Records how a request that got ticket ended. Results of requests admitted before the breaker
 * opened are ignored once it is open. */
void kiri_breaker_release(struct kiri_breaker *b, enum kiri_breaker_ticket ticket, enum kiri_breaker_result r,
                          double now);

/* ---- Checks on what comes back ---- */

/* Is this a JSON object, as every OpenAI endpoint answers? 0, or -1 with one sentence in why
 * (HTML, empty, not JSON, JSON but not an object). content_type may be NULL. */
int kiri_upstream_check_json(const char *content_type, const void *body, size_t n, char *why, size_t why_cap);

/* Splits an event stream into whole events (each ends with a blank line, LF or CRLF) and checks
 * each: only data/event/id/retry fields and comments, and every data payload JSON or [DONE].
 * Events are passed on whole, so a stream cut off never leaves half an event at the client. */
struct kiri_upstream_sse {
    struct kiri_buf event;      /* bytes of the event being assembled: at most KIRI_UPSTREAM_MAX_EVENT + 1 */
    int done;                   /* a data: [DONE] event was seen */
    uint64_t events;            /* whole events passed on */
};
typedef int (*kiri_upstream_event_fn)(void *user, const char *event, size_t n);

void kiri_upstream_sse_init(struct kiri_upstream_sse *s);
void kiri_upstream_sse_free(struct kiri_upstream_sse *s);
/* Feeds bytes; fn receives each whole event. 0; -1 with why when the stream is malformed or
 * memory ran out; 1 when fn returned non-zero (it is not called again). */
int kiri_upstream_sse_push(struct kiri_upstream_sse *s, const void *data, size_t n, kiri_upstream_event_fn fn,
                           void *user, char *why, size_t why_cap);
/* At the end of the stream: 0 when it ended cleanly ([DONE] seen, no half event left), -1 with
 * why when it was cut off. */
int kiri_upstream_sse_finish(const struct kiri_upstream_sse *s, char *why, size_t why_cap);

/* Reads what routing needs from a request body: the "model" string (or "" when absent or not a
 * string; cut to model_cap - 1 bytes) and "stream" (true or not). 0, or -1 when the body is not a
 * JSON object (the local parser then answers it). */
int kiri_upstream_peek(const void *body, size_t len, char *model, size_t model_cap, int *stream);

/* Splits an upstream URL, http(s)://host[:port][/prefix] (no query, no fragment, no user), into
 * the base every request path is appended to (the URL without trailing '/') and whether the
 * prefix ends in /v1 (then the /v1 of a forwarded /v1/... path is not doubled). 0, or -1. */
int kiri_upstream_parse_url(const char *url, char *base, size_t base_cap, int *prefix_v1);

/* ---- The upstream ---- */

struct kiri_upstream_config {
    const char *url;            /* http(s)://host[:port][/prefix]; NULL or "": none (route local) */
    const char *key_file;       /* its first line is the API key; NULL or "": no key */
    const char *ca_file;        /* PEM CAs for an https upstream; NULL or "": the system bundle */
    enum kiri_route route;      /* with a url, KIRI_ROUTE_LOCAL reads as local-first */
    int route_queue;            /* local-first forwards when at least this many requests wait; >= 1 */
    double connect_timeout;     /* seconds; <= 0: 5 */
    double first_byte_timeout;  /* until the response head (a whole non-stream answer); <= 0: 60 */
    double idle_timeout;        /* longest silence inside an answer; <= 0: 60 */
    uint64_t max_response;      /* bytes of one answer; 0: KIRI_UPSTREAM_MAX_RESPONSE */
    int breaker_threshold;      /* see kiri_breaker_init */
    double breaker_cooldown;
    double breaker_cooldown_max;
};

struct kiri_upstream;

/* Checks the configuration and reads the key file; *out is owned by the caller
 * (kiri_upstream_close). A configuration without a URL gives an upstream that routes nothing,
 * which kiri_upstream_reconfigure can later point somewhere. */
int kiri_upstream_open(const struct kiri_upstream_config *cfg, struct kiri_upstream **out,
                       struct kiri_status_info *info);
/* Frees it; no forward may be running (kiri_upstream_cancel, then wait for them). */
void kiri_upstream_close(struct kiri_upstream *u);
/* Points the upstream at a new configuration (a new manifest's routing policy or URL) while
 * forwards run: they finish on the old target. A changed URL starts a fresh, closed breaker.
 * On failure nothing changes. */
int kiri_upstream_reconfigure(struct kiri_upstream *u, const struct kiri_upstream_config *cfg,
                              struct kiri_status_info *info);
/* Ends running forwards within about half a second and refuses new ones (server shutdown). */
void kiri_upstream_cancel(struct kiri_upstream *u);

/* The policy now in force, and the local-first queue threshold in *route_queue (may be NULL). */
enum kiri_route kiri_upstream_route(struct kiri_upstream *u, int *route_queue);
enum kiri_breaker_state kiri_upstream_breaker_state(struct kiri_upstream *u);

/* Receives a relayed answer. head comes first, once: the status, the content type, and whether
 * the answer is an event stream (then data brings whole events, one per call, as they arrive)
 * or one body (then data is called once with all of it, already checked). A non-zero return
 * from either ends the forward (KIRI_UPSTREAM_CLIENT_GONE). */
struct kiri_upstream_sink {
    int (*head)(void *user, int status, const char *content_type, int stream);
    int (*data)(void *user, const void *bytes, size_t n);
    void *user;
};

enum kiri_upstream_result {
    KIRI_UPSTREAM_DONE = 0,         /* the whole answer went to the sink (any relayed status) */
    KIRI_UPSTREAM_UNAVAILABLE,      /* nothing went to the sink and the upstream could not answer
                                       (breaker open, connect error, timeout, 5xx, 401/403, 429):
                                       serve locally, or answer outcome.status */
    KIRI_UPSTREAM_BAD_ANSWER,       /* nothing went to the sink: the upstream answered garbage
                                       (HTML, invalid JSON, over the size cap): answer 502 */
    KIRI_UPSTREAM_BROKEN,           /* the head and part of a stream went to the sink, then it
                                       broke: end the client's stream with an error event */
    KIRI_UPSTREAM_CLIENT_GONE       /* the sink refused more */
};

struct kiri_upstream_outcome {
    enum kiri_upstream_result result;
    int upstream_status;            /* the upstream's HTTP status, 0 when none arrived */
    int status;                     /* UNAVAILABLE/BAD_ANSWER: what to answer without a fallback
                                       (502, 503, 504, or 429 with retry_after) */
    double retry_after;             /* seconds, from the upstream's 429; -1 when absent */
    char message[256];              /* one sentence, fit for the client and the log */
};

/* Forwards one request: POST base + path with body, Authorization: Bearer <key>, and relays the
 * answer to sink. stream says whether the client asked for an event stream. Never fails in any
 * other way than through out. */
void kiri_upstream_forward(struct kiri_upstream *u, const char *path, const void *body, size_t body_len, int stream,
                           const struct kiri_upstream_sink *sink, struct kiri_upstream_outcome *out);

/* Counted by the server as it routes. */
enum kiri_upstream_counter {
    KIRI_UPSTREAM_SERVED_LOCAL = 0, /* a generation request served here */
    KIRI_UPSTREAM_SERVED_UPSTREAM,  /* relayed from the upstream */
    KIRI_UPSTREAM_FALLBACK,         /* the upstream was tried (or its breaker open) and it was served here */
    KIRI_UPSTREAM_N_COUNTERS
};
void kiri_upstream_count(struct kiri_upstream *u, enum kiri_upstream_counter c);

/* A snapshot of the routing counters, the breaker and the failed forwards by reason, which the
 * server renders on /metrics (kiri_metrics_render_upstream). */
#define KIRI_UPSTREAM_N_REASONS 8
struct kiri_upstream_stats {
    uint64_t counts[KIRI_UPSTREAM_N_COUNTERS];      /* by enum kiri_upstream_counter */
    int configured;                                 /* an upstream URL is in force */
    enum kiri_breaker_state breaker;
    uint64_t breaker_opens;
    uint64_t failures[KIRI_UPSTREAM_N_REASONS];     /* by reason, named in reason_names */
    const char *const *reason_names;                /* static, KIRI_UPSTREAM_N_REASONS */
};
void kiri_upstream_get_stats(struct kiri_upstream *u, struct kiri_upstream_stats *out);

#endif
