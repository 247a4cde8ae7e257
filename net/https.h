/* An HTTPS client for fleet downloads and the cloud upstream, written directly on mbedTLS
 * (CivetWeb has no outgoing HTTPS client): GET (kiri_https_get) or any method with a body
 * (kiri_https_send), one request per connection, TLS 1.2 or 1.3 with the peer certificate
 * verified against a CA bundle and the URL's host name (VERIFY_REQUIRED + set_hostname; F10).
 * Plain http:// is spoken only by a client created with options.allow_http (an upstream on a
 * trusted network), never for fleet downloads; a redirect never leads to http://.
 *
 * Limits it enforces on every request:
 * - connect, first byte (TLS handshake to the end of the response head) and idle (longest
 *   silence inside the body) timeouts, and a minimum throughput averaged over a window, so a
 *   server dribbling one byte a second is dropped too (F11);
 * - at most max_redirects (<= 5) redirects, each to https:// on the same host name (any port) or
 *   an allowlisted host; Authorization headers are not sent to another host (F09);
 * - a response head of at most 16 KiB; a body of at most max_body bytes: a larger declared
 *   Content-Length is refused before any byte of it is read, and a chunked or close-delimited body
 *   is cut exactly at max_body (F07);
 * - chunked transfer coding is decoded; other transfer codings are refused.
 *
 * Invariant of a struct kiri_https_client: it owns its CA chain, TLS configuration and random
 * generator, which stay unchanged after init; one thread uses a client at a time.
 */
#ifndef KIRI_FLEET_HTTPS_H
#define KIRI_FLEET_HTTPS_H

#include <stddef.h>
#include <stdint.h>

struct kiri_status_info;

#define KIRI_HTTPS_SYSTEM_CA "/etc/ssl/certs/ca-certificates.crt"
#define KIRI_HTTPS_MAX_URL 2048
#define KIRI_HTTPS_MAX_REDIRECTS 5
#define KIRI_HTTPS_MAX_ALLOW_HOSTS 16

struct kiri_https_options {
    const char *ca_file;            /* PEM bundle of trusted CAs; NULL: KIRI_HTTPS_SYSTEM_CA */
    const char *const *allow_hosts; /* other hosts redirects may lead to (NULL-terminated) or NULL */
    int max_redirects;              /* 0..5; negative: 5 */
    double connect_timeout;         /* seconds for TCP connect; <= 0: 10 */
    double first_byte_timeout;      /* seconds from connect to the end of the response head; <= 0: 30 */
    double idle_timeout;            /* longest silence inside the body; <= 0: 30 */
    double min_rate;                /* bytes per second over rate_window; 0: 1024; < 0: no check */
    double rate_window;             /* seconds; <= 0: 30 */
    const volatile int *cancel;     /* when it becomes non-zero, requests end with KIRI_E_CANCELLED
                                       within about half a second; may be NULL */
    int allow_http;                 /* also speak plain http:// (a cloud upstream or a heartbeat
                                       collector on a trusted network); never for fleet downloads.
                                       With it and no ca_file, a missing system bundle is no error
                                       (https:// requests then fail verification) */
};

/* Why a request failed, for retry decisions. */
enum kiri_https_failure {
    KIRI_HTTPS_OK = 0,
    KIRI_HTTPS_URL,            /* the URL (or method, header) is malformed, or http:// without allow_http */
    KIRI_HTTPS_CONNECT,        /* name resolution or TCP connect failed (retryable) */
    KIRI_HTTPS_TLS,            /* the TLS handshake failed for another reason (retryable) */
    KIRI_HTTPS_CERT,           /* the certificate did not verify (not retryable) */
    KIRI_HTTPS_TIMEOUT,        /* connect, first-byte or idle timeout (retryable) */
    KIRI_HTTPS_SLOW,           /* below the minimum throughput (retryable) */
    KIRI_HTTPS_PROTOCOL,       /* a malformed response head or chunk (retryable) */
    KIRI_HTTPS_TRUNCATED,      /* the connection ended before the body did (retryable) */
    KIRI_HTTPS_TOO_LARGE,      /* the body is longer than max_body */
    KIRI_HTTPS_REDIRECT,       /* too many redirects, or one to http:// or a foreign host */
    KIRI_HTTPS_ABORTED,        /* the body callback returned non-zero */
    KIRI_HTTPS_CANCELLED,      /* the options' cancel flag was set */
    KIRI_HTTPS_NOMEM
};

struct kiri_https_request {
    const char *url;                /* https://host[:port]/path[?query] */
    const char *const *headers;     /* extra "Name: value" lines (NULL-terminated) or NULL */
    uint64_t range_start;           /* > 0: send Range: bytes=range_start- */
    const char *if_range;           /* with range_start: an ETag or Last-Modified for If-Range */
    uint64_t max_body;              /* the most body bytes wanted; 0: no limit */
    /* kiri_https_send only: */
    const char *method;             /* "POST", "GET", ...; NULL: GET */
    const void *body;               /* request body (Content-Length is sent), or NULL */
    size_t body_len;
    const char *content_type;       /* of the body; NULL: application/json */
    int any_status;                 /* pass the body of every status to fn, not only 2xx */
};

/* Filled by kiri_https_get whatever it returns (it is how a failure is explained). */
struct kiri_https_response {
    int status;                     /* HTTP status of the last response, 0 when none arrived */
    int64_t content_length;         /* declared body length, -1 when none (chunked or close) */
    uint64_t range_start;           /* first byte of a 206 response (Content-Range) */
    int64_t range_total;            /* the whole resource's size from Content-Range, -1 unknown */
    double retry_after;             /* seconds from Retry-After (delay or date), -1 when absent */
    char etag[128];
    char last_modified[64];
    char content_type[128];
    char www_authenticate[1024];
    char content_digest[96];        /* Docker-Content-Digest */
    char url[KIRI_HTTPS_MAX_URL];   /* the URL that answered, after redirects */
    int redirects;
    uint64_t body_bytes;            /* body bytes passed to the callback */
    enum kiri_https_failure failure;
};

/* Receives body bytes of a 2xx response (of any status with any_status) as they arrive; resp
 * holds the status and headers by then. Returning non-zero stops the request
 * (KIRI_E_CANCELLED, failure KIRI_HTTPS_ABORTED). */
typedef int (*kiri_https_body_fn)(void *user, const struct kiri_https_response *resp, const void *data, size_t n);

struct kiri_https_client;

/* Reads the CA bundle and sets up TLS. The options are copied (allow_hosts too); *out is owned
 * by the caller: kiri_https_client_free. */
int kiri_https_client_init(const struct kiri_https_options *opt, struct kiri_https_client **out,
                           struct kiri_status_info *info);
void kiri_https_client_free(struct kiri_https_client *c);

/* GETs a URL, following redirects. Returns KIRI_OK once a whole response has arrived, whatever
 * its status: the body of a 2xx response went to fn (which may be NULL to discard it), other
 * bodies are not read. Errors: KIRI_E_INVALID_ARG (bad URL), KIRI_E_IO (network, TLS, protocol,
 * truncation, a body over max_body: resp->failure says which, info->field names it),
 * KIRI_E_CANCELLED. Because the body streams, fn may already have received part of a body when
 * an error ends the request (resp->body_bytes says how much): it is a prefix of the body. */
int kiri_https_get(struct kiri_https_client *c, const struct kiri_https_request *req, kiri_https_body_fn fn,
                   void *user, struct kiri_https_response *resp, struct kiri_status_info *info);

/* Sends any request: the method and body from req (a request with a body follows no redirect),
 * otherwise as kiri_https_get. With req->any_status, fn receives the body whatever the status
 * (a proxy relays error bodies too). */
int kiri_https_send(struct kiri_https_client *c, const struct kiri_https_request *req, kiri_https_body_fn fn,
                    void *user, struct kiri_https_response *resp, struct kiri_status_info *info);

/* GETs a small document (a manifest, a token) of at most max bytes into an owned NUL-terminated
 * buffer. A non-2xx status is returned as KIRI_OK with resp->status set and *out NULL. */
int kiri_https_get_small(struct kiri_https_client *c, const char *url, const char *const *headers, size_t max,
                         char **out, size_t *out_len, struct kiri_https_response *resp,
                         struct kiri_status_info *info);

/* The same for an http:// or https:// URL: *tls says which (the default port is 80 or 443). */
int kiri_https_parse_url_any(const char *url, int *tls, char *host, size_t host_cap, int *port, char *path,
                             size_t path_cap);

/* URL parts of an https:// URL: host without brackets (out host, cap bytes), port, and the
 * path with its query (out path, cap bytes). 0, or -1 when malformed or not https. */
int kiri_https_parse_url(const char *url, char *host, size_t host_cap, int *port, char *path, size_t path_cap);

/* May a request that started at origin_host be sent on to host (the same name, case aside, or
 * one of the client's allowed hosts)? */
int kiri_https_client_host_allowed(const struct kiri_https_client *c, const char *origin_host, const char *host);

/* Is this status worth retrying later (408, 425, 429, 500, 502, 503, 504)? */
int kiri_https_status_retryable(int status);
/* Is this failure worth retrying later? */
int kiri_https_failure_retryable(enum kiri_https_failure f);

#endif
