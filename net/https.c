/* An HTTPS client on mbedTLS over the platform module's TCP sockets (https.h); plain http only
 * for clients created with allow_http.
 *
 * mbedTLS reads and writes through bio_send/bio_recv below, which wait on the socket in slices of
 * at most half a second so that the deadline of the current phase (first byte, idle), the
 * minimum-throughput window and the cancel flag are all checked while a peer is silent. The
 * response is read through one buffer: the head is parsed in place, and body bytes go from the
 * buffer to the caller's callback, decoded from chunks when the response is chunked.
 */
#include "https.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "mbedtls/ctr_drbg.h"
#include "mbedtls/entropy.h"
#include "mbedtls/net_sockets.h"
#include "mbedtls/ssl.h"
#include "mbedtls/x509_crt.h"
#include "psa/crypto.h"

#include "buf.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "net_platform.h"

#define HEAD_MAX (16u << 10)
#define BUF_SIZE (32u << 10)
#define CA_MAX (8u << 20)
#define SLICE 0.5

struct kiri_https_client {
    struct kiri_https_options opt;
    char *allow[KIRI_HTTPS_MAX_ALLOW_HOSTS + 1];   /* owned copies, NULL-terminated */
    mbedtls_x509_crt ca;
    mbedtls_ssl_config conf;
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
};

/* ---------------------------------------------------------------------------------------------
 * URLs
 * ------------------------------------------------------------------------------------------- */

static int host_char(char c)
{
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
           c == '_';
}

int kiri_https_parse_url_any(const char *url, int *tls, char *host, size_t host_cap, int *port, char *path,
                             size_t path_cap)
{
    size_t skip;
    if (strncasecmp(url, "https://", 8) == 0)
        skip = 8;
    else if (strncasecmp(url, "http://", 7) == 0)
        skip = 7;
    else
        return -1;
    if (strlen(url) >= KIRI_HTTPS_MAX_URL)
        return -1;
    for (const char *p = url; *p; p++)
        if (*p <= ' ' || *p > '~')
            return -1;
    const char *a = url + skip, *end = a + strcspn(a, "/?#"), *h = a, *he, *rest;
    if (memchr(a, '@', (size_t)(end - a)))
        return -1; /* no credentials in URLs */
    if (*a == '[') {
        const char *close = memchr(a, ']', (size_t)(end - a));
        if (!close)
            return -1;
        h = a + 1;
        he = close;
        rest = close + 1;
        for (const char *p = h; p < he; p++)
            if (!(host_char(*p) || *p == ':'))
                return -1;
    } else {
        const char *colon = memchr(a, ':', (size_t)(end - a));
        he = colon ? colon : end;
        rest = he;
        for (const char *p = h; p < he; p++)
            if (!host_char(*p))
                return -1;
    }
    if (he == h || (size_t)(he - h) >= host_cap)
        return -1;
    int prt = skip == 8 ? 443 : 80;
    if (rest < end) {
        if (*rest != ':' || rest + 1 == end || end - rest > 6)
            return -1;
        prt = 0;
        for (const char *p = rest + 1; p < end; p++) {
            if (*p < '0' || *p > '9')
                return -1;
            prt = prt * 10 + (*p - '0');
        }
        if (prt < 1 || prt > 65535)
            return -1;
    }
    size_t plen = strcspn(end, "#");
    if (plen + 2 > path_cap)
        return -1;
    size_t o = 0;
    if (*end != '/')
        path[o++] = '/';
    memcpy(path + o, end, plen);
    path[o + plen] = '\0';
    memcpy(host, h, (size_t)(he - h));
    host[he - h] = '\0';
    *port = prt;
    *tls = skip == 8;
    return 0;
}

int kiri_https_parse_url(const char *url, char *host, size_t host_cap, int *port, char *path, size_t path_cap)
{
    int tls = 0;
    if (strncasecmp(url, "https://", 8) != 0)
        return -1;
    return kiri_https_parse_url_any(url, &tls, host, host_cap, port, path, path_cap);
}

/* Resolves a Location header against the URL that sent it, into out (KIRI_HTTPS_MAX_URL). An
 * http:// target is written as it is, so the caller can refuse it by name. */
static int resolve_location(const char *base, const char *loc, char *out)
{
    char host[256], path[KIRI_HTTPS_MAX_URL];
    int port, tls;
    if (strncasecmp(loc, "https://", 8) == 0 || strncasecmp(loc, "http://", 7) == 0 || strstr(loc, "://"))
        return snprintf(out, KIRI_HTTPS_MAX_URL, "%s", loc) < KIRI_HTTPS_MAX_URL ? 0 : -1;
    if (kiri_https_parse_url_any(base, &tls, host, sizeof host, &port, path, sizeof path) != 0)
        return -1;
    const char *scheme = tls ? "https" : "http";
    const int v6 = strchr(host, ':') != NULL;
    char authority[300];
    snprintf(authority, sizeof authority, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
    int n;
    if (loc[0] == '/' && loc[1] == '/') {
        n = snprintf(out, KIRI_HTTPS_MAX_URL, "%s:%s", scheme, loc);
    } else if (loc[0] == '/') {
        n = snprintf(out, KIRI_HTTPS_MAX_URL, "%s://%s%s", scheme, authority, loc);
    } else {
        /* Relative to the directory of the base path (query dropped). */
        path[strcspn(path, "?")] = '\0';
        char *slash = strrchr(path, '/');
        slash[1] = '\0';
        n = snprintf(out, KIRI_HTTPS_MAX_URL, "%s://%s%s%s", scheme, authority, path, loc);
    }
    return n > 0 && n < KIRI_HTTPS_MAX_URL ? 0 : -1;
}

int kiri_https_status_retryable(int status)
{
    return status == 408 || status == 425 || status == 429 || status == 500 || status == 502 || status == 503 ||
           status == 504;
}

int kiri_https_failure_retryable(enum kiri_https_failure f)
{
    return f == KIRI_HTTPS_CONNECT || f == KIRI_HTTPS_TLS || f == KIRI_HTTPS_TIMEOUT || f == KIRI_HTTPS_SLOW ||
           f == KIRI_HTTPS_PROTOCOL || f == KIRI_HTTPS_TRUNCATED;
}

/* ---------------------------------------------------------------------------------------------
 * Client
 * ------------------------------------------------------------------------------------------- */

static double or_default(double v, double d) { return v > 0 ? v : d; }

void kiri_https_client_free(struct kiri_https_client *c)
{
    if (!c)
        return;
    for (int i = 0; c->allow[i]; i++)
        kiri_mem_free(c->allow[i]);
    mbedtls_ssl_config_free(&c->conf);
    mbedtls_x509_crt_free(&c->ca);
    mbedtls_ctr_drbg_free(&c->drbg);
    mbedtls_entropy_free(&c->entropy);
    kiri_mem_free(c);
}

int kiri_https_client_init(const struct kiri_https_options *opt, struct kiri_https_client **out,
                           struct kiri_status_info *info)
{
    /* TLS 1.3 in mbedTLS 3.6 runs on PSA crypto, which must be initialised first (repeat calls
     * are harmless). */
    if (psa_crypto_init() != PSA_SUCCESS)
        return kiri_error_at(info, KIRI_E_IO, "tls", -1, "cannot initialise PSA crypto");
    struct kiri_https_client *c = kiri_mem_calloc(1, sizeof *c);
    if (!c)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory creating an HTTPS client");
    static const struct kiri_https_options none;
    c->opt = opt ? *opt : none;
    c->opt.max_redirects = c->opt.max_redirects < 0 || c->opt.max_redirects > KIRI_HTTPS_MAX_REDIRECTS
                               ? KIRI_HTTPS_MAX_REDIRECTS : c->opt.max_redirects;
    c->opt.connect_timeout = or_default(c->opt.connect_timeout, 10);
    c->opt.first_byte_timeout = or_default(c->opt.first_byte_timeout, 30);
    c->opt.idle_timeout = or_default(c->opt.idle_timeout, 30);
    c->opt.rate_window = or_default(c->opt.rate_window, 30);
    if (c->opt.min_rate == 0)
        c->opt.min_rate = 1024;
    c->opt.allow_hosts = NULL;
    mbedtls_x509_crt_init(&c->ca);
    mbedtls_ssl_config_init(&c->conf);
    mbedtls_entropy_init(&c->entropy);
    mbedtls_ctr_drbg_init(&c->drbg);
    int n_allow = 0, rc = KIRI_OK;
    for (const char *const *h = opt ? opt->allow_hosts : NULL; h && *h; h++) {
        if (n_allow == KIRI_HTTPS_MAX_ALLOW_HOSTS) {
            rc = kiri_error_set(info, KIRI_E_INVALID_ARG, "at most %d allowed hosts", KIRI_HTTPS_MAX_ALLOW_HOSTS);
            break;
        }
        if (!(c->allow[n_allow++] = kiri_mem_strndup(*h, strlen(*h)))) {
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory creating an HTTPS client");
            break;
        }
    }
    const char *ca = opt && opt->ca_file ? opt->ca_file : KIRI_HTTPS_SYSTEM_CA;
    char *pem = NULL;
    size_t pem_len = 0;
    int e = 0;
    /* A client that may speak plain http (a cloud upstream) works without the system bundle
     * (a minimal device image may lack it); its https:// requests then fail verification. */
    const int ca_optional = opt && opt->allow_http && !opt->ca_file &&
                            kiri_platform_file_size(ca, &(uint64_t){0}, NULL) != KIRI_OK;
    if (rc == KIRI_OK && !ca_optional &&
        (rc = kiri_platform_read_file(ca, CA_MAX, &pem, &pem_len, info)) == KIRI_OK) {
        e = mbedtls_x509_crt_parse(&c->ca, (const unsigned char *)pem, pem_len + 1);
        kiri_mem_free(pem);
        /* A positive result counts certificates that failed to parse; a bundle is usable when
         * any certificate in it parsed. */
        if (e < 0 || c->ca.version == 0)
            rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "ca", -1, "%s: no usable CA certificate (mbedTLS -0x%04x)",
                               ca, e < 0 ? -e : 0);
    }
    static const char pers[] = "kiri-fleet-https";
    if (rc == KIRI_OK &&
        ((e = mbedtls_ctr_drbg_seed(&c->drbg, mbedtls_entropy_func, &c->entropy, (const unsigned char *)pers,
                                    sizeof pers - 1)) != 0 ||
         (e = mbedtls_ssl_config_defaults(&c->conf, MBEDTLS_SSL_IS_CLIENT, MBEDTLS_SSL_TRANSPORT_STREAM,
                                          MBEDTLS_SSL_PRESET_DEFAULT)) != 0))
        rc = kiri_error_at(info, KIRI_E_IO, "tls", -1, "cannot set up TLS (mbedTLS -0x%04x)", -e);
    if (rc != KIRI_OK) {
        kiri_https_client_free(c);
        return rc;
    }
    mbedtls_ssl_conf_authmode(&c->conf, MBEDTLS_SSL_VERIFY_REQUIRED);
    mbedtls_ssl_conf_ca_chain(&c->conf, &c->ca, NULL);
    mbedtls_ssl_conf_rng(&c->conf, mbedtls_ctr_drbg_random, &c->drbg);
    mbedtls_ssl_conf_min_tls_version(&c->conf, MBEDTLS_SSL_VERSION_TLS1_2);
    *out = c;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * One connection
 * ------------------------------------------------------------------------------------------- */

struct conn {
    struct kiri_https_client *c;
    int sock;
    int tls;                    /* 0: plain http (options.allow_http) */
    mbedtls_ssl_context ssl;
    int ssl_ready;
    double deadline;            /* of the current phase (monotonic) */
    int in_body;                /* the throughput window runs */
    double rate_t0;             /* start of the current window */
    uint64_t raw_bytes, rate_b0;
    int timed_out, slow, cancelled, reset;
    unsigned char *buf;         /* owned, BUF_SIZE */
    size_t pos, len;            /* unread bytes are buf[pos, len) */
    int eof;
};

static int cancel_set(const struct conn *k)
{
    return k->c->opt.cancel && *k->c->opt.cancel;
}

/* Checks the minimum throughput once per window. */
static int rate_ok(struct conn *k)
{
    if (!k->in_body || k->c->opt.min_rate < 0)
        return 1;
    double now = kiri_platform_now();
    if (now - k->rate_t0 < k->c->opt.rate_window)
        return 1;
    if ((double)(k->raw_bytes - k->rate_b0) < k->c->opt.min_rate * (now - k->rate_t0))
        return 0;
    k->rate_t0 = now;
    k->rate_b0 = k->raw_bytes;
    return 1;
}

static int bio_send(void *ctx, const unsigned char *buf, size_t len)
{
    struct conn *k = ctx;
    for (;;) {
        if (cancel_set(k)) {
            k->cancelled = 1;
            return MBEDTLS_ERR_SSL_TIMEOUT;
        }
        double left = k->deadline - kiri_platform_now();
        if (left <= 0) {
            k->timed_out = 1;
            return MBEDTLS_ERR_SSL_TIMEOUT;
        }
        long r = kiri_platform_sock_send(k->sock, buf, len, left < SLICE ? left : SLICE);
        if (r >= 0)
            return (int)r;
        if (r != KIRI_PLATFORM_SOCK_TIMEOUT) {
            k->reset = 1;
            return MBEDTLS_ERR_NET_SEND_FAILED;
        }
    }
}

static int bio_recv(void *ctx, unsigned char *buf, size_t len)
{
    struct conn *k = ctx;
    for (;;) {
        if (cancel_set(k)) {
            k->cancelled = 1;
            return MBEDTLS_ERR_SSL_TIMEOUT;
        }
        if (!rate_ok(k)) {
            k->slow = 1;
            return MBEDTLS_ERR_SSL_TIMEOUT;
        }
        double left = k->deadline - kiri_platform_now();
        if (left <= 0) {
            k->timed_out = 1;
            return MBEDTLS_ERR_SSL_TIMEOUT;
        }
        long r = kiri_platform_sock_recv(k->sock, buf, len, left < SLICE ? left : SLICE);
        if (r > 0) {
            k->raw_bytes += (uint64_t)r;
            return (int)r;
        }
        if (r == 0)
            return 0; /* mbedTLS reads this as MBEDTLS_ERR_SSL_CONN_EOF */
        if (r != KIRI_PLATFORM_SOCK_TIMEOUT) {
            k->reset = 1;
            return MBEDTLS_ERR_NET_CONN_RESET;
        }
    }
}

static void conn_close(struct conn *k)
{
    if (k->ssl_ready) {
        mbedtls_ssl_free(&k->ssl);
        k->ssl_ready = 0;
    }
    kiri_platform_sock_close(k->sock);
    k->sock = -1;
}

/* Fails the request with a failure kind, a status code and a field. */
static int fail(struct kiri_https_response *resp, enum kiri_https_failure f, struct kiri_status_info *info, int code,
                const char *field, const char *fmt, const char *a, const char *b)
{
    resp->failure = f;
    return kiri_error_at(info, code, field, -1, fmt, a, b);
}

/* Names what stopped a read or write that returned the mbedTLS error e. */
static int io_fail(struct conn *k, int e, struct kiri_https_response *resp, const char *host, const char *phase,
                   struct kiri_status_info *info)
{
    if (k->cancelled)
        return fail(resp, KIRI_HTTPS_CANCELLED, info, KIRI_E_CANCELLED, "cancelled", "%s: cancelled %s", host, phase);
    if (k->slow) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s: below %.0f bytes/s for %.0f s %s", host, k->c->opt.min_rate,
                 k->c->opt.rate_window, phase);
        return fail(resp, KIRI_HTTPS_SLOW, info, KIRI_E_IO, "timeout", "%s%s", msg, "");
    }
    if (k->timed_out)
        return fail(resp, KIRI_HTTPS_TIMEOUT, info, KIRI_E_IO, "timeout", "%s: timed out %s", host, phase);
    if (e == MBEDTLS_ERR_SSL_CONN_EOF || e == MBEDTLS_ERR_NET_CONN_RESET || k->reset)
        return fail(resp, KIRI_HTTPS_TRUNCATED, info, KIRI_E_IO, "truncated", "%s: connection closed %s", host, phase);
    char msg[64];
    snprintf(msg, sizeof msg, " (mbedTLS -0x%04x)", -e);
    return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "tls", "%s: TLS error%s", host, msg);
}

/* Reads more bytes into the buffer (compacting it first). 1: got some, 0: end of stream. */
static int fill(struct conn *k, struct kiri_https_response *resp, const char *host, const char *phase,
                struct kiri_status_info *info)
{
    if (k->pos > 0) {
        memmove(k->buf, k->buf + k->pos, k->len - k->pos);
        k->len -= k->pos;
        k->pos = 0;
    }
    if (k->eof)
        return 0;
    if (k->len == BUF_SIZE) /* callers consume before they read more; a full buffer is a bug */
        return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: read buffer full %s", host, phase);
    for (;;) {
        if (k->in_body)
            k->deadline = kiri_platform_now() + k->c->opt.idle_timeout;
        if (!k->tls) {
            int r = bio_recv(k, k->buf + k->len, BUF_SIZE - k->len);
            if (r > 0) {
                k->len += (size_t)r;
                return 1;
            }
            if (r == 0) {
                k->eof = 1;
                return 0;
            }
            return io_fail(k, r, resp, host, phase, info);
        }
        int r = mbedtls_ssl_read(&k->ssl, k->buf + k->len, BUF_SIZE - k->len);
        if (r > 0) {
            k->len += (size_t)r;
            return 1;
        }
        if (r == MBEDTLS_ERR_SSL_WANT_READ || r == MBEDTLS_ERR_SSL_WANT_WRITE ||
            r == MBEDTLS_ERR_SSL_RECEIVED_NEW_SESSION_TICKET)
            continue;
        if (r == 0 || r == MBEDTLS_ERR_SSL_PEER_CLOSE_NOTIFY) {
            k->eof = 1;
            return 0;
        }
        /* A TCP close without close_notify ends a close-delimited body all the same; whether
         * that body is whole is for the caller to judge (a download knows its length). */
        if (r == MBEDTLS_ERR_SSL_CONN_EOF && !k->timed_out && !k->slow && !k->cancelled) {
            k->eof = 1;
            return 0;
        }
        return io_fail(k, r, resp, host, phase, info);
    }
}

static int write_all(struct conn *k, const char *data, size_t n, struct kiri_https_response *resp, const char *host,
                     struct kiri_status_info *info)
{
    while (n > 0) {
        int r = k->tls ? mbedtls_ssl_write(&k->ssl, (const unsigned char *)data, n)
                       : bio_send(k, (const unsigned char *)data, n);
        if (r == MBEDTLS_ERR_SSL_WANT_READ || r == MBEDTLS_ERR_SSL_WANT_WRITE)
            continue;
        if (r <= 0)
            return io_fail(k, r, resp, host, "sending the request", info);
        data += r;
        n -= (size_t)r;
    }
    return KIRI_OK;
}

static int handshake(struct conn *k, const char *host, struct kiri_https_response *resp, struct kiri_status_info *info)
{
    int e;
    mbedtls_ssl_init(&k->ssl);
    k->ssl_ready = 1;
    if ((e = mbedtls_ssl_setup(&k->ssl, &k->c->conf)) != 0 || (e = mbedtls_ssl_set_hostname(&k->ssl, host)) != 0) {
        char msg[48];
        snprintf(msg, sizeof msg, "(mbedTLS -0x%04x)", -e);
        return fail(resp, KIRI_HTTPS_TLS, info, KIRI_E_IO, "tls", "%s: cannot set up TLS %s", host, msg);
    }
    mbedtls_ssl_set_bio(&k->ssl, k, bio_send, bio_recv, NULL);
    while ((e = mbedtls_ssl_handshake(&k->ssl)) != 0) {
        if (e == MBEDTLS_ERR_SSL_WANT_READ || e == MBEDTLS_ERR_SSL_WANT_WRITE)
            continue;
        uint32_t flags = mbedtls_ssl_get_verify_result(&k->ssl);
        if (e == MBEDTLS_ERR_X509_CERT_VERIFY_FAILED || (flags != 0 && flags != (uint32_t)-1)) {
            const char *why = flags & MBEDTLS_X509_BADCERT_CN_MISMATCH ? "its names do not include this host"
                            : flags & MBEDTLS_X509_BADCERT_NOT_TRUSTED ? "it is not signed by a trusted CA"
                            : flags & MBEDTLS_X509_BADCERT_FUTURE
                                ? "it is not valid yet: clock skew? the device clock may be behind"
                            : flags & MBEDTLS_X509_BADCERT_EXPIRED ? "it has expired (or the device clock is ahead)"
                            : "it failed verification";
            return fail(resp, KIRI_HTTPS_CERT, info, KIRI_E_IO, "certificate", "%s: certificate refused: %s", host, why);
        }
        if (k->timed_out || k->cancelled || k->reset)
            return io_fail(k, e, resp, host, "during the TLS handshake", info);
        char msg[64];
        snprintf(msg, sizeof msg, "(mbedTLS -0x%04x)", -e);
        return fail(resp, KIRI_HTTPS_TLS, info, KIRI_E_IO, "tls", "%s: TLS handshake failed %s", host, msg);
    }
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The response head
 * ------------------------------------------------------------------------------------------- */

struct head {
    int status;
    int chunked;
    int64_t content_length;
    char location[KIRI_HTTPS_MAX_URL];
};

static void copy_value(char *dst, size_t cap, const char *v, size_t n)
{
    if (n >= cap)
        n = cap - 1;
    memcpy(dst, v, n);
    dst[n] = '\0';
}

static int parse_u64(const char *s, size_t n, uint64_t *out)
{
    if (n == 0 || n > 18)
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    return era * 146097 + yoe * 365 + yoe / 4 - yoe / 100 + doy - 719468;
}

/* Retry-After: delay-seconds, or an IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT"). */
static double parse_retry_after(const char *v, size_t n)
{
    uint64_t secs;
    if (parse_u64(v, n, &secs) == 0)
        return (double)secs;
    static const char months[] = "JanFebMarAprMayJunJulAugSepOctNovDec";
    char mon[4];
    int d, y, hh, mm, ss;
    char buf[64];
    copy_value(buf, sizeof buf, v, n);
    if (sscanf(buf, "%*3s, %2d %3s %4d %2d:%2d:%2d GMT", &d, mon, &y, &hh, &mm, &ss) != 6)
        return -1;
    const char *m = strstr(months, mon);
    if (!m || (m - months) % 3 != 0 || d < 1 || d > 31 || hh > 23 || mm > 59 || ss > 60)
        return -1;
    double t = (double)(days_from_civil(y, (int)((m - months) / 3) + 1, d) * 86400 + hh * 3600 + mm * 60 + ss);
    double delay = t - kiri_platform_wall_time();
    return delay > 0 ? delay : 0;
}

static int header_is(const char *name, size_t n, const char *want)
{
    return strlen(want) == n && strncasecmp(name, want, n) == 0;
}

/* Parses the head in buf[0, n) (ending in CRLF CRLF). */
static int parse_head(const char *buf, size_t n, struct head *h, struct kiri_https_response *resp)
{
    memset(h, 0, sizeof *h);
    h->content_length = -1;
    resp->content_length = -1;
    resp->range_total = -1;
    resp->range_start = 0;
    resp->retry_after = -1;
    resp->etag[0] = resp->last_modified[0] = resp->content_type[0] = resp->www_authenticate[0] = '\0';
    resp->content_digest[0] = '\0';
    const char *p = buf, *end = buf + n;
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol || eol - p < 12 || strncmp(p, "HTTP/1.", 7) != 0 || p[8] != ' ' || eol[-1] != '\r')
        return -1;
    for (int i = 9; i < 12; i++)
        if (p[i] < '0' || p[i] > '9')
            return -1;
    h->status = (p[9] - '0') * 100 + (p[10] - '0') * 10 + (p[11] - '0');
    if (h->status < 100 || (eol - p > 12 && p[12] != ' ' && p[12] != '\r'))
        return -1;
    for (p = eol + 1; p < end;) {
        eol = memchr(p, '\n', (size_t)(end - p));
        if (!eol || eol == p || eol[-1] != '\r')
            return -1;
        if (eol - p == 1)
            break; /* the empty line */
        const char *colon = memchr(p, ':', (size_t)(eol - p));
        if (!colon || colon == p || *p == ' ' || *p == '\t')
            return -1; /* no obsolete line folding */
        for (const char *q = p; q < colon; q++)
            if (*q <= ' ' || *q > '~')
                return -1;
        const char *v = colon + 1, *ve = eol - 1;
        while (v < ve && (*v == ' ' || *v == '\t'))
            v++;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        const size_t nn = (size_t)(colon - p), vn = (size_t)(ve - v);
        if (header_is(p, nn, "content-length")) {
            uint64_t cl;
            if (parse_u64(v, vn, &cl) != 0 || (h->content_length >= 0 && (uint64_t)h->content_length != cl))
                return -1;
            h->content_length = (int64_t)cl;
        } else if (header_is(p, nn, "transfer-encoding")) {
            if (!(vn == 7 && strncasecmp(v, "chunked", 7) == 0))
                return -2; /* only chunked is spoken */
            h->chunked = 1;
        } else if (header_is(p, nn, "content-range")) {
            /* bytes START-END/TOTAL or bytes START-END/ * */
            char cr[96];
            copy_value(cr, sizeof cr, v, vn);
            unsigned long long s, e;
            char total[24];
            if (sscanf(cr, "bytes %llu-%llu/%23s", &s, &e, total) != 3 || e < s)
                return -1;
            resp->range_start = s;
            if (strcmp(total, "*") != 0) {
                uint64_t t;
                if (parse_u64(total, strlen(total), &t) != 0 || t <= e)
                    return -1;
                resp->range_total = (int64_t)t;
            }
        } else if (header_is(p, nn, "location")) {
            if (vn >= sizeof h->location)
                return -1;
            copy_value(h->location, sizeof h->location, v, vn);
        } else if (header_is(p, nn, "etag")) {
            copy_value(resp->etag, sizeof resp->etag, v, vn);
        } else if (header_is(p, nn, "last-modified")) {
            copy_value(resp->last_modified, sizeof resp->last_modified, v, vn);
        } else if (header_is(p, nn, "content-type")) {
            copy_value(resp->content_type, sizeof resp->content_type, v, vn);
        } else if (header_is(p, nn, "www-authenticate")) {
            copy_value(resp->www_authenticate, sizeof resp->www_authenticate, v, vn);
        } else if (header_is(p, nn, "docker-content-digest")) {
            copy_value(resp->content_digest, sizeof resp->content_digest, v, vn);
        } else if (header_is(p, nn, "retry-after")) {
            resp->retry_after = parse_retry_after(v, vn);
        }
        p = eol + 1;
    }
    if (h->chunked)
        h->content_length = -1; /* RFC 9112 6.3: chunked wins over Content-Length */
    resp->status = h->status;
    resp->content_length = h->content_length;
    return 0;
}

/* Reads a response head, skipping interim 1xx responses. */
static int read_head(struct conn *k, struct head *h, struct kiri_https_response *resp, const char *host,
                     struct kiri_status_info *info)
{
    for (;;) {
        const unsigned char *found = NULL;
        while (!found) {
            size_t avail = k->len - k->pos;
            if (avail >= 4) {
                const unsigned char *b = k->buf + k->pos;
                for (size_t i = 0; i + 4 <= avail && !found; i++)
                    if (b[i] == '\r' && b[i + 1] == '\n' && b[i + 2] == '\r' && b[i + 3] == '\n')
                        found = b + i + 4;
            }
            if (found)
                break;
            if (avail >= HEAD_MAX)
                return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: response head over 16 KiB%s", host, "");
            int r = fill(k, resp, host, "waiting for the response", info);
            if (r < 0)
                return r;
            if (r == 0)
                return fail(resp, KIRI_HTTPS_TRUNCATED, info, KIRI_E_IO,
                            "truncated", "%s: connection closed before a complete response head%s", host, "");
        }
        size_t n = (size_t)(found - (k->buf + k->pos));
        int pr = parse_head((const char *)k->buf + k->pos, n, h, resp);
        k->pos += n;
        if (pr == -2)
            return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: unsupported transfer coding%s", host, "");
        if (pr != 0)
            return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: malformed response head%s", host, "");
        if (h->status >= 200 || h->status == 101) {
            if (h->status == 101)
                return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: unexpected protocol switch%s", host, "");
            return KIRI_OK;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * The body
 * ------------------------------------------------------------------------------------------- */

struct sink {
    kiri_https_body_fn fn;
    void *user;
    uint64_t max;       /* 0: no limit */
};

/* Passes n bytes to the callback, cutting at the limit. */
static int deliver(struct sink *s, struct kiri_https_response *resp, const unsigned char *p, size_t n,
                   const char *host, struct kiri_status_info *info)
{
    int over = 0;
    if (s->max && resp->body_bytes + n > s->max) {
        n = (size_t)(s->max - resp->body_bytes);
        over = 1;
    }
    if (n > 0) {
        if (s->fn && s->fn(s->user, resp, p, n) != 0)
            return fail(resp, KIRI_HTTPS_ABORTED, info, KIRI_E_CANCELLED, "aborted", "%s: the download was stopped%s",
                        host, "");
        resp->body_bytes += n;
    }
    if (over) {
        char msg[64];
        snprintf(msg, sizeof msg, "%llu", (unsigned long long)s->max);
        return fail(resp, KIRI_HTTPS_TOO_LARGE, info, KIRI_E_IO, "size", "%s: the body runs past %s bytes; cut there",
                    host, msg);
    }
    return KIRI_OK;
}

static int read_body(struct conn *k, const struct head *h, struct sink *s, struct kiri_https_response *resp,
                     const char *host, struct kiri_status_info *info)
{
    k->in_body = 1;
    k->rate_t0 = kiri_platform_now();
    k->rate_b0 = k->raw_bytes;
    int r;
    if (!h->chunked) {
        uint64_t left = h->content_length >= 0 ? (uint64_t)h->content_length : UINT64_MAX;
        for (;;) {
            size_t avail = k->len - k->pos;
            if ((uint64_t)avail > left)
                avail = (size_t)left;
            if (avail > 0) {
                if ((r = deliver(s, resp, k->buf + k->pos, avail, host, info)) != KIRI_OK)
                    return r;
                k->pos += avail;
                left -= avail;
            }
            if (left == 0)
                return KIRI_OK;
            r = fill(k, resp, host, "inside the body", info);
            if (r < 0)
                return r;
            if (r == 0) {
                if (h->content_length < 0)
                    return KIRI_OK; /* close-delimited: the end is the end */
                return fail(resp, KIRI_HTTPS_TRUNCATED, info, KIRI_E_IO, "truncated",
                            "%s: connection closed inside the body%s", host, "");
            }
        }
    }
    /* Chunked: size line (hex, optional extensions), data, CRLF; a zero size ends it, then
     * trailer lines up to an empty one. */
    for (;;) {
        const unsigned char *nl;
        while (!(nl = memchr(k->buf + k->pos, '\n', k->len - k->pos))) {
            if (k->len - k->pos > 1024)
                return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: malformed chunk size%s", host, "");
            if ((r = fill(k, resp, host, "inside the body", info)) < 0)
                return r;
            if (r == 0)
                return fail(resp, KIRI_HTTPS_TRUNCATED, info, KIRI_E_IO, "truncated",
                            "%s: connection closed inside the body%s", host, "");
        }
        const unsigned char *p = k->buf + k->pos;
        uint64_t size = 0;
        int digits = 0;
        for (; p < nl; p++, digits++) {
            int v = *p >= '0' && *p <= '9' ? *p - '0' : *p >= 'a' && *p <= 'f' ? *p - 'a' + 10
                  : *p >= 'A' && *p <= 'F' ? *p - 'A' + 10 : -1;
            if (v < 0)
                break;
            if (digits >= 15)
                return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: chunk size too large%s", host, "");
            size = size * 16 + (uint64_t)v;
        }
        if (digits == 0 || (p < nl && *p != ';' && *p != '\r' && *p != ' ' && *p != '\t'))
            return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: malformed chunk size%s", host, "");
        k->pos = (size_t)(nl + 1 - k->buf);
        if (size == 0) {
            /* Trailers: lines until an empty one. */
            for (;;) {
                while (!(nl = memchr(k->buf + k->pos, '\n', k->len - k->pos))) {
                    if (k->len - k->pos > 8192)
                        return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: trailer too long%s", host, "");
                    if ((r = fill(k, resp, host, "inside the body", info)) < 0)
                        return r;
                    if (r == 0)
                        return KIRI_OK; /* all data arrived; a missing final CRLF harms nothing */
                }
                size_t line = (size_t)(nl - (k->buf + k->pos));
                k->pos += line + 1;
                if (line == 0 || (line == 1 && k->buf[k->pos - 2] == '\r'))
                    return KIRI_OK;
            }
        }
        while (size > 0) {
            if (k->pos == k->len) {
                if ((r = fill(k, resp, host, "inside the body", info)) < 0)
                    return r;
                if (r == 0)
                    return fail(resp, KIRI_HTTPS_TRUNCATED, info, KIRI_E_IO, "truncated",
                                "%s: connection closed inside the body%s", host, "");
            }
            size_t avail = k->len - k->pos;
            if ((uint64_t)avail > size)
                avail = (size_t)size;
            if ((r = deliver(s, resp, k->buf + k->pos, avail, host, info)) != KIRI_OK)
                return r;
            k->pos += avail;
            size -= avail;
        }
        /* CRLF after the data. */
        while (k->len - k->pos < 2) {
            if ((r = fill(k, resp, host, "inside the body", info)) < 0)
                return r;
            if (r == 0)
                return fail(resp, KIRI_HTTPS_TRUNCATED, info, KIRI_E_IO, "truncated",
                            "%s: connection closed inside the body%s", host, "");
        }
        if (k->buf[k->pos] != '\r' || k->buf[k->pos + 1] != '\n')
            return fail(resp, KIRI_HTTPS_PROTOCOL, info, KIRI_E_IO, "http", "%s: chunk not followed by CRLF%s", host, "");
        k->pos += 2;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */

static int header_line_ok(const char *h)
{
    const char *colon = strchr(h, ':');
    if (!colon || colon == h)
        return 0;
    for (const char *p = h; *p; p++)
        if ((*p < ' ' && *p != '\t') || *p == 127)
            return 0;
    return 1;
}

int kiri_https_client_host_allowed(const struct kiri_https_client *c, const char *origin, const char *host)
{
    if (strcasecmp(origin, host) == 0)
        return 1;
    for (int i = 0; c->allow[i]; i++)
        if (strcasecmp(c->allow[i], host) == 0)
            return 1;
    return 0;
}

/* What kiri_https_send adds to a GET: the method and the body. */
struct send_parts {
    const char *method;         /* validated token */
    const void *body;           /* or NULL */
    size_t body_len;
    const char *content_type;   /* validated, no CR/LF */
};

static int method_ok(const char *m)
{
    size_t n = 0;
    for (const char *p = m; *p; p++, n++)
        if (*p < 'A' || *p > 'Z' || n >= 16)
            return 0;
    return n > 0;
}

/* Builds the request head into out (emptied first; its limit is the most a head may take): 0, or
 * -1 when it does not fit. */
static int build_request(struct kiri_buf *out, const char *host, int port, int tls, const char *path,
                         const struct kiri_https_request *req, const struct send_parts *sp, int same_host_as_origin)
{
    const int v6 = strchr(host, ':') != NULL;
    char hostport[300];
    if (port == (tls ? 443 : 80))
        snprintf(hostport, sizeof hostport, "%s%s%s", v6 ? "[" : "", host, v6 ? "]" : "");
    else
        snprintf(hostport, sizeof hostport, "%s%s%s:%d", v6 ? "[" : "", host, v6 ? "]" : "", port);
    kiri_buf_clear(out);
    kiri_buf_printf(out,
                    "%s %s HTTP/1.1\r\nHost: %s\r\nUser-Agent: kiri/%s\r\nAccept-Encoding: identity\r\n"
                    "Connection: close\r\n",
                    sp->method, path, hostport, KIRI_VERSION_STRING);
    /* A body is always framed by Content-Length (never chunked), and so is an empty POST. */
    if (sp->body || (strcmp(sp->method, "GET") != 0 && strcmp(sp->method, "HEAD") != 0))
        kiri_buf_printf(out, "Content-Length: %zu\r\n", sp->body ? sp->body_len : 0);
    if (sp->body)
        kiri_buf_printf(out, "Content-Type: %s\r\n", sp->content_type);
    if (req->range_start > 0) {
        kiri_buf_printf(out, "Range: bytes=%llu-\r\n", (unsigned long long)req->range_start);
        if (req->if_range && *req->if_range)
            kiri_buf_printf(out, "If-Range: %s\r\n", req->if_range);
    }
    for (const char *const *hp = req->headers; hp && *hp && !out->failed; hp++) {
        /* Credentials stay with the host they were meant for. */
        if (!same_host_as_origin && (strncasecmp(*hp, "authorization:", 14) == 0 || strncasecmp(*hp, "cookie:", 7) == 0))
            continue;
        kiri_buf_printf(out, "%s\r\n", *hp);
    }
    kiri_buf_puts(out, "\r\n");
    return out->failed ? -1 : 0;
}

/* One request, following redirects unless it carries a body; kiri_https_get and _send. */
static int run(struct kiri_https_client *c, const struct kiri_https_request *req, const struct send_parts *sp,
               int any_status, kiri_https_body_fn fn, void *user, struct kiri_https_response *resp,
               struct kiri_status_info *info)
{
    if (snprintf(resp->url, sizeof resp->url, "%s", req->url ? req->url : "") >= (int)sizeof resp->url)
        return fail(resp, KIRI_HTTPS_URL, info, KIRI_E_INVALID_ARG, "url", "URL longer than %s bytes%s", "2047", "");
    for (const char *const *hp = req->headers; hp && *hp; hp++)
        if (!header_line_ok(*hp))
            return fail(resp, KIRI_HTTPS_URL, info, KIRI_E_INVALID_ARG, "header", "malformed request header%s%s", "", "");
    if (req->if_range && strpbrk(req->if_range, "\r\n"))
        return fail(resp, KIRI_HTTPS_URL, info, KIRI_E_INVALID_ARG, "header", "malformed If-Range value%s%s", "", "");

    char origin[256], host[256], *path = kiri_mem_alloc(KIRI_HTTPS_MAX_URL);
    struct kiri_buf request;
    kiri_buf_init(&request, 16383);   /* a head of under 16 KiB */
    char (*visited)[KIRI_HTTPS_MAX_URL] = kiri_mem_calloc(KIRI_HTTPS_MAX_REDIRECTS + 1, KIRI_HTTPS_MAX_URL);
    struct head *h = kiri_mem_alloc(sizeof *h);
    struct conn k;
    memset(&k, 0, sizeof k);
    k.sock = -1;
    k.c = c;
    k.buf = kiri_mem_alloc(BUF_SIZE);
    int rc = KIRI_OK, port = 0;
    if (!path || !visited || !h || !k.buf) {
        rc = fail(resp, KIRI_HTTPS_NOMEM, info, KIRI_E_NOMEM, "", "out of memory for a request%s%s", "", "");
        goto done;
    }
    if (kiri_https_parse_url_any(resp->url, &k.tls, origin, sizeof origin, &port, path, KIRI_HTTPS_MAX_URL) != 0 ||
        (!k.tls && !c->opt.allow_http)) {
        rc = fail(resp, KIRI_HTTPS_URL, info, KIRI_E_INVALID_ARG, "url", "not an https:// URL: %.200s%s", resp->url, "");
        goto done;
    }
    for (int hop = 0;; hop++) {
        memcpy(visited[hop], resp->url, KIRI_HTTPS_MAX_URL);
        kiri_https_parse_url_any(resp->url, &k.tls, host, sizeof host, &port, path, KIRI_HTTPS_MAX_URL);
        if (build_request(&request, host, port, k.tls, path, req, sp, strcasecmp(host, origin) == 0) != 0) {
            rc = fail(resp, KIRI_HTTPS_URL, info, KIRI_E_INVALID_ARG, "header", "request head over 16 KiB%s%s", "", "");
            break;
        }
        if ((rc = kiri_platform_tcp_connect(host, port, c->opt.connect_timeout, &k.sock, info)) != KIRI_OK) {
            resp->failure = info && strcmp(info->field, "timeout") == 0 ? KIRI_HTTPS_TIMEOUT : KIRI_HTTPS_CONNECT;
            break;
        }
        k.deadline = kiri_platform_now() + c->opt.first_byte_timeout;
        k.pos = k.len = 0;
        k.eof = k.in_body = k.timed_out = k.slow = k.cancelled = k.reset = 0;
        if ((k.tls && (rc = handshake(&k, host, resp, info)) != KIRI_OK) ||
            (rc = write_all(&k, request.data, request.len, resp, host, info)) != KIRI_OK ||
            (sp->body && sp->body_len && (rc = write_all(&k, sp->body, sp->body_len, resp, host, info)) != KIRI_OK) ||
            (rc = read_head(&k, h, resp, host, info)) != KIRI_OK)
            break;
        const int st = h->status;
        /* A request with a body is not repeated elsewhere: its redirect is the answer. */
        if ((st == 301 || st == 302 || st == 303 || st == 307 || st == 308) && h->location[0] && !sp->body) {
            conn_close(&k);
            char next[KIRI_HTTPS_MAX_URL], nhost[256];
            int nport;
            if (hop >= c->opt.max_redirects) {
                char limit[16];
                snprintf(limit, sizeof limit, "%d", c->opt.max_redirects);
                rc = fail(resp, KIRI_HTTPS_REDIRECT, info, KIRI_E_IO, "redirect", "%s: more than %s redirects", origin,
                          limit);
                break;
            }
            if (resolve_location(resp->url, h->location, next) != 0) {
                rc = fail(resp, KIRI_HTTPS_REDIRECT, info, KIRI_E_IO, "redirect", "%s: malformed redirect target%s", host, "");
                break;
            }
            if (strncasecmp(next, "https://", 8) != 0) {
                rc = fail(resp, KIRI_HTTPS_REDIRECT, info, KIRI_E_IO, "redirect",
                          "%s: redirect to a non-https URL refused: %.120s", host, next);
                break;
            }
            if (kiri_https_parse_url(next, nhost, sizeof nhost, &nport, path, KIRI_HTTPS_MAX_URL) != 0) {
                rc = fail(resp, KIRI_HTTPS_REDIRECT, info, KIRI_E_IO, "redirect", "%s: malformed redirect target%s", host, "");
                break;
            }
            if (!kiri_https_client_host_allowed(c, origin, nhost)) {
                rc = fail(resp, KIRI_HTTPS_REDIRECT, info, KIRI_E_IO, "redirect",
                          "redirect to foreign host %.100s refused (not %.100s nor allowlisted)", nhost, origin);
                break;
            }
            for (int i = 0; i <= hop; i++)
                if (strcmp(visited[i], next) == 0) {
                    rc = fail(resp, KIRI_HTTPS_REDIRECT, info, KIRI_E_IO, "redirect", "%s: redirect loop at %.150s", host,
                              next);
                    break;
                }
            if (rc != KIRI_OK)
                break;
            memcpy(resp->url, next, KIRI_HTTPS_MAX_URL);
            resp->redirects = hop + 1;
            continue;
        }
        const int bodyless = st == 204 || st == 304 || strcmp(sp->method, "HEAD") == 0;
        if (!bodyless && ((st >= 200 && st < 300) || any_status)) {
            if (req->max_body && h->content_length >= 0 && (uint64_t)h->content_length > req->max_body) {
                char msg[64];
                snprintf(msg, sizeof msg, "%lld > %llu", (long long)h->content_length, (unsigned long long)req->max_body);
                rc = fail(resp, KIRI_HTTPS_TOO_LARGE, info, KIRI_E_IO, "size", "%s: declared body length %s bytes",
                          host, msg);
                break;
            }
            struct sink s = {fn, user, req->max_body};
            rc = read_body(&k, h, &s, resp, host, info);
        }
        break;
    }
done:
    conn_close(&k);
    kiri_mem_free(k.buf);
    kiri_mem_free(h);
    kiri_mem_free(visited);
    kiri_buf_free(&request);
    kiri_mem_free(path);
    return rc;
}

static void response_reset(struct kiri_https_response *resp)
{
    memset(resp, 0, sizeof *resp);
    resp->content_length = -1;
    resp->range_total = -1;
    resp->retry_after = -1;
}

int kiri_https_get(struct kiri_https_client *c, const struct kiri_https_request *req, kiri_https_body_fn fn,
                   void *user, struct kiri_https_response *resp, struct kiri_status_info *info)
{
    response_reset(resp);
    const struct send_parts get = {"GET", NULL, 0, NULL};
    return run(c, req, &get, 0, fn, user, resp, info);
}

int kiri_https_send(struct kiri_https_client *c, const struct kiri_https_request *req, kiri_https_body_fn fn,
                    void *user, struct kiri_https_response *resp, struct kiri_status_info *info)
{
    response_reset(resp);
    struct send_parts sp = {req->method ? req->method : "GET", req->body, req->body_len,
                            req->content_type ? req->content_type : "application/json"};
    if (!method_ok(sp.method))
        return fail(resp, KIRI_HTTPS_URL, info, KIRI_E_INVALID_ARG, "method", "malformed request method%s%s", "", "");
    if (strpbrk(sp.content_type, "\r\n") || strlen(sp.content_type) > 200)
        return fail(resp, KIRI_HTTPS_URL, info, KIRI_E_INVALID_ARG, "header", "malformed Content-Type%s%s", "", "");
    if (!sp.body && req->body_len)
        return fail(resp, KIRI_HTTPS_URL, info, KIRI_E_INVALID_ARG, "body", "a body length without a body%s%s", "", "");
    return run(c, req, &sp, req->any_status, fn, user, resp, info);
}

/* ---------------------------------------------------------------------------------------------
 * Small documents
 * ------------------------------------------------------------------------------------------- */

static int collect_body(void *user, const struct kiri_https_response *resp, const void *data, size_t n)
{
    (void)resp;
    return kiri_buf_append(user, data, n) != KIRI_OK;   /* non-zero aborts the transfer */
}

int kiri_https_get_small(struct kiri_https_client *c, const char *url, const char *const *headers, size_t max,
                         char **out, size_t *out_len, struct kiri_https_response *resp,
                         struct kiri_status_info *info)
{
    /* The client cuts the body at max (KIRI_HTTPS_TOO_LARGE) before the buffer's own limit. */
    struct kiri_buf body;
    kiri_buf_init(&body, max);
    struct kiri_https_request req = {.url = url, .headers = headers, .max_body = max};
    int rc = kiri_https_get(c, &req, collect_body, &body, resp, info);
    if (rc == KIRI_E_CANCELLED && resp->failure == KIRI_HTTPS_ABORTED)
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading %.200s", url);
    if (rc != KIRI_OK || resp->status < 200 || resp->status >= 300) {
        kiri_buf_free(&body);
        *out = NULL;
        *out_len = 0;
        return rc;
    }
    if (!(*out = kiri_buf_take(&body, out_len)))
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading %.200s", url);
    return KIRI_OK;
}
