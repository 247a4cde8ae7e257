/* The cloud upstream (upstream.h): routing names, the circuit breaker, checks on answers, and
 * forwarding over the HTTPS client (https.h, with allow_http for a plain upstream).
 *
 * An HTTPS client is used by one thread at a time, and setting one up parses the CA bundle, so
 * each target keeps a few idle clients that forwards borrow and give back under the lock. A
 * forward reads the answer through one callback that decides, on the first bytes, what the
 * answer is: an event stream to relay event by event, a body to buffer and check, or a status
 * the client never sees (5xx, 401/403, 429) whose body is not read at all.
 */
#include "upstream.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "error.h"
#include "https.h"
#include "kiri.h"
#include "mem.h"
#include "platform.h"

#define POOL_MAX 16
#define KEY_FILE_MAX (64u << 10)
#define ALERT_EVERY 60.0        /* seconds between repeated alerts of one kind in the log */

enum reason { R_CONNECT, R_TIMEOUT, R_STATUS, R_AUTH, R_RATE, R_BAD, R_BROKEN, R_BREAKER, N_REASONS };
_Static_assert(N_REASONS == KIRI_UPSTREAM_N_REASONS, "upstream.h sizes the failures by reason");
static const char *const reason_names[N_REASONS] = {"connect", "timeout", "status", "auth", "rate_limited",
                                                     "bad_answer", "broken_stream", "breaker_open"};

/* ---------------------------------------------------------------------------------------------
 * Routing names
 * ------------------------------------------------------------------------------------------- */

int kiri_route_parse(const char *name, enum kiri_route *out)
{
    static const struct {
        const char *name;
        enum kiri_route r;
    } names[] = {{"local", KIRI_ROUTE_LOCAL},           {"local-first", KIRI_ROUTE_LOCAL_FIRST},
                 {"cloud-first", KIRI_ROUTE_CLOUD_FIRST}, {"upstream-first", KIRI_ROUTE_CLOUD_FIRST},
                 {"upstream", KIRI_ROUTE_CLOUD_FIRST}};
    for (size_t i = 0; name && i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i].name) == 0) {
            *out = names[i].r;
            return 0;
        }
    return -1;
}

const char *kiri_route_name(enum kiri_route r)
{
    return r == KIRI_ROUTE_LOCAL_FIRST ? "local-first" : r == KIRI_ROUTE_CLOUD_FIRST ? "cloud-first" : "local";
}

/* ---------------------------------------------------------------------------------------------
 * Circuit breaker
 * ------------------------------------------------------------------------------------------- */

void kiri_breaker_init(struct kiri_breaker *b, int threshold, double base, double max)
{
    memset(b, 0, sizeof *b);
    b->threshold = threshold >= 1 ? threshold : 3;
    b->base = base > 0 ? base : 2;
    b->max = max >= b->base ? max : (b->base > 60 ? b->base : 60);
    b->cooldown = b->base;
    b->state = KIRI_BREAKER_CLOSED;
}

static void breaker_open(struct kiri_breaker *b, double cooldown, double now)
{
    b->state = KIRI_BREAKER_OPEN;
    b->cooldown = cooldown < b->max ? cooldown : b->max;
    b->open_until = now + b->cooldown;
    b->probing = 0;
    b->opens++;
}

enum kiri_breaker_ticket kiri_breaker_acquire(struct kiri_breaker *b, double now)
{
    if (b->state == KIRI_BREAKER_CLOSED)
        return KIRI_BREAKER_PASS;
    if (b->state == KIRI_BREAKER_OPEN) {
        if (now < b->open_until)
            return KIRI_BREAKER_REFUSED;
        b->state = KIRI_BREAKER_HALF_OPEN;
        b->probing = 0;
    }
    if (b->probing)
        return KIRI_BREAKER_REFUSED;
    b->probing = 1;
    return KIRI_BREAKER_PROBE;
}

void kiri_breaker_release(struct kiri_breaker *b, enum kiri_breaker_ticket ticket, enum kiri_breaker_result r,
                          double now)
{
    if (ticket == KIRI_BREAKER_PROBE && b->state == KIRI_BREAKER_HALF_OPEN && b->probing) {
        b->probing = 0;
        if (r == KIRI_BREAKER_SUCCESS) {
            b->state = KIRI_BREAKER_CLOSED;
            b->failures = 0;
            b->cooldown = b->base;
        } else if (r == KIRI_BREAKER_FAILURE) {
            breaker_open(b, b->cooldown * 2, now);
        }
        return;
    }
    if (ticket != KIRI_BREAKER_PASS || b->state != KIRI_BREAKER_CLOSED)
        return; /* a late answer to a request admitted before the breaker opened */
    if (r == KIRI_BREAKER_SUCCESS) {
        b->failures = 0;
    } else if (r == KIRI_BREAKER_FAILURE && ++b->failures >= b->threshold) {
        b->failures = 0;
        breaker_open(b, b->base, now);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Checks on answers
 * ------------------------------------------------------------------------------------------- */

static void say(char *why, size_t cap, const char *msg)
{
    if (why && cap)
        snprintf(why, cap, "%s", msg);
}

static int type_is(const char *content_type, const char *want)
{
    const size_t n = strlen(want);
    return content_type && strncasecmp(content_type, want, n) == 0 &&
           (content_type[n] == '\0' || content_type[n] == ';' || content_type[n] == ' ');
}

int kiri_upstream_check_json(const char *content_type, const void *body, size_t n, char *why, size_t why_cap)
{
    const unsigned char *p = body;
    size_t i = 0;
    while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n'))
        i++;
    if (type_is(content_type, "text/html") || (i < n && p[i] == '<')) {
        say(why, why_cap, "the upstream answered an HTML page, not JSON (a login portal or a proxy error page?)");
        return -1;
    }
    if (i == n) {
        say(why, why_cap, "the upstream answered an empty body, not JSON");
        return -1;
    }
    json_error_t err;
    json_t *root = json_loadb(body, n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &err);
    if (!root) {
        char msg[200];
        snprintf(msg, sizeof msg, "the upstream's answer is not valid JSON (at byte %d)", err.position);
        say(why, why_cap, msg);
        return -1;
    }
    const int obj = json_is_object(root);
    json_decref(root);
    if (!obj) {
        say(why, why_cap, "the upstream's answer is JSON but not an object");
        return -1;
    }
    return 0;
}

void kiri_upstream_sse_init(struct kiri_upstream_sse *s)
{
    memset(s, 0, sizeof *s);
    kiri_buf_init(&s->event, KIRI_UPSTREAM_MAX_EVENT + 1);
}

void kiri_upstream_sse_free(struct kiri_upstream_sse *s)
{
    kiri_buf_free(&s->event);
    memset(s, 0, sizeof *s);
}

/* Checks one whole event (its bytes up to and including the blank line). */
static int check_event(struct kiri_upstream_sse *s, const char *ev, size_t n, char *why, size_t why_cap)
{
    /* The data lines joined by '\n', as the SSE specification assembles them. */
    struct kiri_buf data = {0};
    int has_data = 0, rc = 0;
    for (size_t i = 0; i < n && rc == 0;) {
        const char *line = ev + i, *nl = memchr(line, '\n', n - i);
        size_t len = nl ? (size_t)(nl - line) : n - i;
        i += len + (nl != NULL);
        if (len && line[len - 1] == '\r')
            len--;
        if (len == 0 || line[0] == ':')
            continue;
        const char *colon = memchr(line, ':', len);
        const size_t fn = colon ? (size_t)(colon - line) : len;
        const char *v = colon ? colon + 1 : line + len;
        size_t vn = (size_t)(line + len - v);
        if (vn && *v == ' ')
            v++, vn--;
        if (fn == 4 && memcmp(line, "data", 4) == 0) {
            if (has_data)
                kiri_buf_putc(&data, '\n');
            if (kiri_buf_append(&data, v, vn) != KIRI_OK || data.failed) {
                say(why, why_cap, "out of memory reading the upstream's stream");
                rc = -1;
                break;
            }
            has_data = 1;
        } else if (!((fn == 5 && memcmp(line, "event", 5) == 0) || (fn == 2 && memcmp(line, "id", 2) == 0) ||
                     (fn == 5 && memcmp(line, "retry", 5) == 0))) {
            say(why, why_cap, "the upstream's stream is not Server-Sent Events (an unknown field)");
            rc = -1;
        }
    }
    if (rc == 0 && has_data) {
        if (data.len == 6 && memcmp(data.data, "[DONE]", 6) == 0) {
            s->done = 1;
        } else {
            json_error_t err;
            json_t *root = json_loadb(data.data ? data.data : "", data.len, JSON_REJECT_DUPLICATES, &err);
            if (!root || !json_is_object(root)) {
                say(why, why_cap, "an event of the upstream's stream does not hold a JSON object");
                rc = -1;
            }
            json_decref(root);
        }
    }
    kiri_buf_free(&data);
    return rc;
}

/* Where the blank line ending an event ends in b[0, n): the offset just past it, or 0. */
static size_t event_end(const char *b, size_t n, size_t from)
{
    for (size_t i = from; i < n; i++) {
        if (b[i] != '\n')
            continue;
        if (i + 1 < n && b[i + 1] == '\n')
            return i + 2;
        if (i + 2 < n && b[i + 1] == '\r' && b[i + 2] == '\n')
            return i + 3;
    }
    return 0;
}

int kiri_upstream_sse_push(struct kiri_upstream_sse *s, const void *data, size_t n, kiri_upstream_event_fn fn,
                           void *user, char *why, size_t why_cap)
{
    const char *p = data;
    struct kiri_buf *b = &s->event;
    while (n > 0) {
        /* Take what fits under the limit, so that an event that never ends is refused in
         * bounded memory. */
        if (b->len > KIRI_UPSTREAM_MAX_EVENT) {
            say(why, why_cap, "an event of the upstream's stream is longer than 1 MiB");
            return -1;
        }
        const size_t room = KIRI_UPSTREAM_MAX_EVENT + 1 - b->len, take = room < n ? room : n;
        const size_t old = b->len;
        if (kiri_buf_append(b, p, take) != KIRI_OK) {
            say(why, why_cap, "out of memory reading the upstream's stream");
            return -1;
        }
        p += take;
        n -= take;
        /* Pass on every whole event now in the buffer (the scan restarts 2 bytes back, where a
         * boundary split across calls may begin). */
        size_t start = 0, from = old > 2 ? old - 2 : 0, end;
        while ((end = event_end(b->data, b->len, from > start ? from : start)) != 0) {
            if (check_event(s, b->data + start, end - start, why, why_cap) != 0)
                return -1;
            s->events++;
            if (fn && fn(user, b->data + start, end - start) != 0)
                return 1;
            start = end;
        }
        kiri_buf_drop(b, start);
    }
    return 0;
}

int kiri_upstream_sse_finish(const struct kiri_upstream_sse *s, char *why, size_t why_cap)
{
    for (size_t i = 0; i < s->event.len; i++)
        if (s->event.data[i] != '\n' && s->event.data[i] != '\r' && s->event.data[i] != ' ') {
            say(why, why_cap, "the upstream's stream was cut off inside an event");
            return -1;
        }
    if (!s->done) {
        say(why, why_cap, "the upstream's stream ended without its final [DONE] event");
        return -1;
    }
    return 0;
}

int kiri_upstream_peek(const void *body, size_t len, char *model, size_t model_cap, int *stream)
{
    json_error_t err;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &err);
    if (!root || !json_is_object(root)) {
        json_decref(root);
        return -1;
    }
    const json_t *m = json_object_get(root, "model");
    if (model_cap)
        snprintf(model, model_cap, "%s", json_is_string(m) ? json_string_value(m) : "");
    *stream = json_is_true(json_object_get(root, "stream"));
    json_decref(root);
    return 0;
}

int kiri_upstream_parse_url(const char *url, char *base, size_t base_cap, int *prefix_v1)
{
    char host[256], path[KIRI_HTTPS_MAX_URL];
    int port, tls;
    if (!url || kiri_https_parse_url_any(url, &tls, host, sizeof host, &port, path, sizeof path) != 0 ||
        strpbrk(url, "?#"))
        return -1;
    size_t n = strlen(url);
    while (n > 0 && url[n - 1] == '/')
        n--;
    if (n + 1 > base_cap)
        return -1;
    memcpy(base, url, n);
    base[n] = '\0';
    size_t pn = strlen(path);
    while (pn > 0 && path[pn - 1] == '/')
        pn--;
    *prefix_v1 = pn >= 3 && strncmp(path + pn - 3, "/v1", 3) == 0;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Targets: where forwards go, and the clients that take them there
 * ------------------------------------------------------------------------------------------- */

struct target {
    int refs;                               /* under the upstream's lock */
    char base[KIRI_HTTPS_MAX_URL];
    int prefix_v1;
    char *auth;                             /* owned "Authorization: Bearer KEY" or NULL; zeroed when freed */
    char ca_file[1024];
    struct kiri_https_options opt;          /* ca_file points into this struct */
    uint64_t max_response;
    struct kiri_https_client *idle[POOL_MAX];   /* owned, under the lock */
    int n_idle;
};

struct kiri_upstream {
    struct kiri_mutex *lock;
    struct target *t;                       /* owned reference, or NULL: none */
    enum kiri_route route;
    int route_queue;
    struct kiri_breaker br;
    volatile int cancel;                    /* read by the HTTPS clients of every forward */
    double last_alert[N_REASONS];           /* under the lock */
    _Atomic uint64_t counts[KIRI_UPSTREAM_N_COUNTERS];
    _Atomic uint64_t failures[N_REASONS];
};

static void target_free(struct target *t)
{
    if (!t)
        return;
    for (int i = 0; i < t->n_idle; i++)
        kiri_https_client_free(t->idle[i]);
    if (t->auth) {
        volatile char *p = t->auth;
        for (size_t i = 0; p[i]; i++)
            p[i] = 0;
        kiri_mem_free(t->auth);
    }
    kiri_mem_free(t);
}

/* Reads the key: the first line of the file, trimmed, of visible ASCII only. */
static int read_key(const char *path, char **auth, struct kiri_status_info *info)
{
    char *text = NULL;
    size_t len = 0;
    int rc = kiri_platform_read_file(path, KEY_FILE_MAX, &text, &len, info);
    if (rc != KIRI_OK)
        return kiri_error_set(info, rc, "--upstream-key-file %.200s: cannot be read", path);
    size_t a = 0;
    while (a < len && (text[a] == ' ' || text[a] == '\t'))
        a++;
    size_t b = a;
    while (b < len && text[b] != '\n' && text[b] != '\r')
        b++;
    while (b > a && (text[b - 1] == ' ' || text[b - 1] == '\t'))
        b--;
    for (size_t i = a; i < b && rc == KIRI_OK; i++)
        if (text[i] <= ' ' || text[i] > '~')
            rc = kiri_error_set(info, KIRI_E_INVALID_ARG,
                                "--upstream-key-file %.200s: the key holds a character other than visible ASCII", path);
    if (rc == KIRI_OK && (b == a || b - a > KIRI_UPSTREAM_MAX_KEY))
        rc = kiri_error_set(info, KIRI_E_INVALID_ARG, "--upstream-key-file %.200s: the first line must hold a key of "
                            "1 to %d characters", path, KIRI_UPSTREAM_MAX_KEY);
    if (rc == KIRI_OK) {
        static const char pre[] = "Authorization: Bearer ";
        *auth = kiri_mem_alloc(sizeof pre + (b - a));
        if (!*auth) {
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
        } else {
            memcpy(*auth, pre, sizeof pre - 1);
            memcpy(*auth + sizeof pre - 1, text + a, b - a);
            (*auth)[sizeof pre - 1 + (b - a)] = '\0';
        }
    }
    memset(text, 0, len);
    kiri_mem_free(text);
    return rc;
}

static int target_new(const struct kiri_upstream_config *cfg, const volatile int *cancel, struct target **out,
                      struct kiri_status_info *info)
{
    struct target *t = kiri_mem_calloc(1, sizeof *t);
    if (!t)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    t->refs = 1;
    if (kiri_upstream_parse_url(cfg->url, t->base, sizeof t->base, &t->prefix_v1) != 0) {
        target_free(t);
        return kiri_error_set(info, KIRI_E_INVALID_ARG,
                              "--upstream %.200s: not an http(s)://host[:port][/prefix] URL (no query, no user)",
                              cfg->url);
    }
    if (cfg->ca_file && cfg->ca_file[0]) {
        if (strlen(cfg->ca_file) >= sizeof t->ca_file) {
            target_free(t);
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "--upstream-ca: the path is too long");
        }
        snprintf(t->ca_file, sizeof t->ca_file, "%s", cfg->ca_file);
    }
    int rc;
    if (cfg->key_file && cfg->key_file[0] && (rc = read_key(cfg->key_file, &t->auth, info)) != KIRI_OK) {
        target_free(t);
        return rc;
    }
    t->opt.ca_file = t->ca_file[0] ? t->ca_file : NULL;
    t->opt.max_redirects = 0;
    t->opt.connect_timeout = cfg->connect_timeout > 0 ? cfg->connect_timeout : 5;
    t->opt.first_byte_timeout = cfg->first_byte_timeout > 0 ? cfg->first_byte_timeout : 60;
    t->opt.idle_timeout = cfg->idle_timeout > 0 ? cfg->idle_timeout : 60;
    t->opt.min_rate = -1; /* a token stream may be slow; the idle timeout bounds silence */
    t->opt.cancel = cancel;
    t->opt.allow_http = 1;
    t->max_response = cfg->max_response ? cfg->max_response : KIRI_UPSTREAM_MAX_RESPONSE;
    /* One client now, so a bad CA file is refused at start rather than on the first request. */
    struct kiri_https_client *c;
    if ((rc = kiri_https_client_init(&t->opt, &c, info)) != KIRI_OK) {
        target_free(t);
        return rc;
    }
    t->idle[t->n_idle++] = c;
    *out = t;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The upstream object
 * ------------------------------------------------------------------------------------------- */

/* Builds everything a configuration needs without touching u: the target, the policy. */
static int prepare(struct kiri_upstream *u, const struct kiri_upstream_config *cfg, struct target **t,
                   enum kiri_route *route, struct kiri_status_info *info)
{
    *t = NULL;
    *route = KIRI_ROUTE_LOCAL;
    if (!cfg || !cfg->url || !cfg->url[0])
        return KIRI_OK;
    if (cfg->route_queue < 1)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "--route-queue must be at least 1");
    *route = cfg->route == KIRI_ROUTE_CLOUD_FIRST ? KIRI_ROUTE_CLOUD_FIRST : KIRI_ROUTE_LOCAL_FIRST;
    return target_new(cfg, &u->cancel, t, info);
}

int kiri_upstream_open(const struct kiri_upstream_config *cfg, struct kiri_upstream **out,
                       struct kiri_status_info *info)
{
    struct kiri_upstream *u = kiri_mem_calloc(1, sizeof *u);
    if (!u || kiri_platform_mutex_init(&u->lock) != KIRI_OK) {
        kiri_mem_free(u);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    }
    int rc = prepare(u, cfg, &u->t, &u->route, info);
    if (rc != KIRI_OK) {
        kiri_platform_mutex_free(u->lock);
        kiri_mem_free(u);
        return rc;
    }
    u->route_queue = cfg && cfg->route_queue > 0 ? cfg->route_queue : 1;
    kiri_breaker_init(&u->br, cfg ? cfg->breaker_threshold : 0, cfg ? cfg->breaker_cooldown : 0,
                      cfg ? cfg->breaker_cooldown_max : 0);
    *out = u;
    return KIRI_OK;
}

void kiri_upstream_close(struct kiri_upstream *u)
{
    if (!u)
        return;
    target_free(u->t);
    kiri_platform_mutex_free(u->lock);
    kiri_mem_free(u);
}

int kiri_upstream_reconfigure(struct kiri_upstream *u, const struct kiri_upstream_config *cfg,
                              struct kiri_status_info *info)
{
    struct target *t;
    enum kiri_route route;
    int rc = prepare(u, cfg, &t, &route, info);
    if (rc != KIRI_OK)
        return rc;
    kiri_platform_mutex_lock(u->lock);
    struct target *old = u->t;
    const int moved = !old || !t || strcmp(old->base, t->base) != 0;
    u->t = t;
    u->route = route;
    u->route_queue = cfg && cfg->route_queue > 0 ? cfg->route_queue : 1;
    if (moved)
        kiri_breaker_init(&u->br, cfg ? cfg->breaker_threshold : 0, cfg ? cfg->breaker_cooldown : 0,
                          cfg ? cfg->breaker_cooldown_max : 0);
    const int last = old && --old->refs == 0;
    kiri_platform_mutex_unlock(u->lock);
    if (last)
        target_free(old);
    return KIRI_OK;
}

void kiri_upstream_cancel(struct kiri_upstream *u) { u->cancel = 1; }

enum kiri_route kiri_upstream_route(struct kiri_upstream *u, int *route_queue)
{
    kiri_platform_mutex_lock(u->lock);
    const enum kiri_route r = u->t ? u->route : KIRI_ROUTE_LOCAL;
    if (route_queue)
        *route_queue = u->route_queue;
    kiri_platform_mutex_unlock(u->lock);
    return r;
}

enum kiri_breaker_state kiri_upstream_breaker_state(struct kiri_upstream *u)
{
    kiri_platform_mutex_lock(u->lock);
    enum kiri_breaker_state s = u->br.state;
    /* An open breaker whose cool-down ended lets the next request probe: report it half-open. */
    if (s == KIRI_BREAKER_OPEN && kiri_platform_now() >= u->br.open_until)
        s = KIRI_BREAKER_HALF_OPEN;
    kiri_platform_mutex_unlock(u->lock);
    return s;
}

void kiri_upstream_count(struct kiri_upstream *u, enum kiri_upstream_counter c)
{
    if (c < KIRI_UPSTREAM_N_COUNTERS)
        atomic_fetch_add(&u->counts[c], 1);
}

void kiri_upstream_get_stats(struct kiri_upstream *u, struct kiri_upstream_stats *out)
{
    memset(out, 0, sizeof *out);
    kiri_platform_mutex_lock(u->lock);
    out->breaker_opens = u->br.opens;
    out->configured = u->t != NULL;
    kiri_platform_mutex_unlock(u->lock);
    out->breaker = kiri_upstream_breaker_state(u);
    for (int i = 0; i < KIRI_UPSTREAM_N_COUNTERS; i++)
        out->counts[i] = atomic_load(&u->counts[i]);
    for (int i = 0; i < N_REASONS; i++)
        out->failures[i] = atomic_load(&u->failures[i]);
    out->reason_names = reason_names;
}

/* ---------------------------------------------------------------------------------------------
 * Forwarding
 * ------------------------------------------------------------------------------------------- */

enum mode { M_UNDECIDED = 0, M_EVENTS, M_BUFFER, M_DISCARD };

struct fwd {
    const struct kiri_upstream_sink *sink;
    int stream;
    enum mode mode;
    int head_sent;
    int client_gone;
    int bad;                    /* the answer was judged garbage in the callback */
    int relay;                  /* a checked body waits in buf for the sink */
    char why[200];
    char content_type[128];
    struct kiri_upstream_sse sse;
    struct kiri_buf body;       /* M_BUFFER: the answer (the HTTPS client keeps it to max_response) */
};

static int relay_event(void *user, const char *ev, size_t n)
{
    struct fwd *f = user;
    if (!f->head_sent) {
        f->head_sent = 1;
        if (f->sink->head(f->sink->user, 200, f->content_type, 1) != 0) {
            f->client_gone = 1;
            return 1;
        }
    }
    if (f->sink->data(f->sink->user, ev, n) != 0) {
        f->client_gone = 1;
        return 1;
    }
    return 0;
}

/* Statuses relayed to the client as the upstream's own judgement of the request. */
static int relayed_status(int st)
{
    return (st >= 200 && st < 300) || (st >= 400 && st < 500 && st != 401 && st != 403 && st != 408 && st != 429);
}

static int on_body(void *user, const struct kiri_https_response *resp, const void *data, size_t n)
{
    struct fwd *f = user;
    if (f->mode == M_UNDECIDED) {
        snprintf(f->content_type, sizeof f->content_type, "%s", resp->content_type);
        for (char *p = f->content_type; *p; p++)
            if (*p < ' ' || *p > '~')
                *p = '?'; /* it goes into the client's response head */
        const int st = resp->status;
        if (st >= 200 && st < 300 && f->stream) {
            if (!type_is(resp->content_type, "text/event-stream")) {
                f->bad = 1;
                snprintf(f->why, sizeof f->why, "the upstream answered a stream request with %.60s, not an event stream",
                         resp->content_type[0] ? f->content_type : "no content type");
                return 1;
            }
            f->mode = M_EVENTS;
        } else {
            f->mode = relayed_status(st) ? M_BUFFER : M_DISCARD;
        }
    }
    if (f->mode == M_DISCARD)
        return 1; /* the client never sees this body: stop reading it */
    if (f->mode == M_EVENTS) {
        const int r = kiri_upstream_sse_push(&f->sse, data, n, relay_event, f, f->why, sizeof f->why);
        if (r < 0)
            f->bad = 1;
        return r != 0;
    }
    if (kiri_buf_append(&f->body, data, n) != KIRI_OK) {
        f->bad = 1;
        snprintf(f->why, sizeof f->why, "out of memory buffering the upstream's answer");
        return 1;
    }
    return 0;
}

static void outcome(struct kiri_upstream_outcome *out, enum kiri_upstream_result r, int status, const char *msg)
{
    out->result = r;
    out->status = status;
    snprintf(out->message, sizeof out->message, "%s", msg);
}

/* Logs an alert at most once a minute per reason (never with the key: messages hold none). */
static void alert(struct kiri_upstream *u, enum reason r, const char *msg)
{
    const double now = kiri_platform_now();
    kiri_platform_mutex_lock(u->lock);
    const int due = u->last_alert[r] == 0 || now - u->last_alert[r] >= ALERT_EVERY;
    if (due)
        u->last_alert[r] = now;
    kiri_platform_mutex_unlock(u->lock);
    if (due)
        fprintf(stderr, "kiri: upstream ALERT: %s\n", msg);
}

/* Classifies a finished exchange into out; returns what the breaker should learn. */
static enum kiri_breaker_result classify(struct kiri_upstream *u, struct fwd *f, int rc,
                                         const struct kiri_https_response *resp, const struct kiri_status_info *info,
                                         const struct target *t, struct kiri_upstream_outcome *out)
{
    char msg[256];
    const int st = resp->status;
    out->upstream_status = st;
    if (f->client_gone) {
        outcome(out, KIRI_UPSTREAM_CLIENT_GONE, 499, "the client went away");
        return f->head_sent ? KIRI_BREAKER_SUCCESS : KIRI_BREAKER_NEUTRAL;
    }
    if (f->bad) {
        atomic_fetch_add(&u->failures[f->head_sent ? R_BROKEN : R_BAD], 1);
        outcome(out, f->head_sent ? KIRI_UPSTREAM_BROKEN : KIRI_UPSTREAM_BAD_ANSWER, 502, f->why);
        return KIRI_BREAKER_FAILURE;
    }
    /* Our own stop of a body we do not relay reads as a whole exchange. */
    const int discarded = f->mode == M_DISCARD && resp->failure == KIRI_HTTPS_ABORTED;
    if (rc != KIRI_OK && !discarded) {
        const enum kiri_https_failure why = resp->failure;
        if (why == KIRI_HTTPS_CANCELLED) {
            outcome(out, f->head_sent ? KIRI_UPSTREAM_BROKEN : KIRI_UPSTREAM_UNAVAILABLE, 503,
                    "the server is shutting down");
            return KIRI_BREAKER_NEUTRAL;
        }
        if (why == KIRI_HTTPS_TOO_LARGE) {
            atomic_fetch_add(&u->failures[f->head_sent ? R_BROKEN : R_BAD], 1);
            snprintf(msg, sizeof msg, "the upstream's answer is larger than the %llu-byte limit",
                     (unsigned long long)t->max_response);
            outcome(out, f->head_sent ? KIRI_UPSTREAM_BROKEN : KIRI_UPSTREAM_BAD_ANSWER, 502, msg);
            return KIRI_BREAKER_FAILURE;
        }
        const int timeout = why == KIRI_HTTPS_TIMEOUT || why == KIRI_HTTPS_SLOW;
        atomic_fetch_add(&u->failures[f->head_sent ? R_BROKEN : timeout ? R_TIMEOUT : R_CONNECT], 1);
        /* The HTTPS client's messages name the host and the failure, never a header. */
        snprintf(msg, sizeof msg, "upstream %s: %.200s", timeout ? "timeout" : "failure",
                 info->message[0] ? info->message : "no answer");
        outcome(out, f->head_sent ? KIRI_UPSTREAM_BROKEN : KIRI_UPSTREAM_UNAVAILABLE, timeout ? 504 : 502, msg);
        return KIRI_BREAKER_FAILURE;
    }
    if (f->mode == M_EVENTS || (f->stream && st >= 200 && st < 300 && f->mode == M_UNDECIDED)) {
        if (kiri_upstream_sse_finish(&f->sse, f->why, sizeof f->why) != 0) {
            atomic_fetch_add(&u->failures[f->head_sent ? R_BROKEN : R_BAD], 1);
            outcome(out, f->head_sent ? KIRI_UPSTREAM_BROKEN : KIRI_UPSTREAM_BAD_ANSWER, 502, f->why);
            return KIRI_BREAKER_FAILURE;
        }
        outcome(out, KIRI_UPSTREAM_DONE, st, "");
        return KIRI_BREAKER_SUCCESS;
    }
    if (relayed_status(st)) {
        if (kiri_upstream_check_json(resp->content_type, f->body.data ? f->body.data : "", f->body.len, f->why, sizeof f->why) != 0) {
            atomic_fetch_add(&u->failures[R_BAD], 1);
            outcome(out, KIRI_UPSTREAM_BAD_ANSWER, 502, f->why);
            return KIRI_BREAKER_FAILURE;
        }
        f->relay = 1; /* by the caller, once the breaker has learnt the outcome */
        outcome(out, KIRI_UPSTREAM_DONE, st, "");
        return KIRI_BREAKER_SUCCESS;
    }
    if (st == 429) {
        atomic_fetch_add(&u->failures[R_RATE], 1);
        out->retry_after = resp->retry_after;
        outcome(out, KIRI_UPSTREAM_UNAVAILABLE, 429, "the upstream is rate-limiting this node (HTTP 429)");
        return KIRI_BREAKER_NEUTRAL;
    }
    if (st == 401 || st == 403) {
        atomic_fetch_add(&u->failures[R_AUTH], 1);
        snprintf(msg, sizeof msg, "the upstream refused this node's API key (HTTP %d): check --upstream-key-file", st);
        alert(u, R_AUTH, msg);
        outcome(out, KIRI_UPSTREAM_UNAVAILABLE, 502, msg);
        return KIRI_BREAKER_FAILURE;
    }
    if (st >= 500 || st == 408) {
        atomic_fetch_add(&u->failures[R_STATUS], 1);
        snprintf(msg, sizeof msg, "the upstream answered HTTP %d", st);
        outcome(out, KIRI_UPSTREAM_UNAVAILABLE, st == 504 || st == 408 ? 504 : 502, msg);
        return KIRI_BREAKER_FAILURE;
    }
    atomic_fetch_add(&u->failures[R_BAD], 1);
    snprintf(msg, sizeof msg, "the upstream answered an unexpected HTTP %d", st);
    outcome(out, KIRI_UPSTREAM_BAD_ANSWER, 502, msg);
    return KIRI_BREAKER_FAILURE;
}

void kiri_upstream_forward(struct kiri_upstream *u, const char *path, const void *body, size_t body_len, int stream,
                           const struct kiri_upstream_sink *sink, struct kiri_upstream_outcome *out)
{
    memset(out, 0, sizeof *out);
    out->retry_after = -1;
    if (u->cancel) {
        outcome(out, KIRI_UPSTREAM_UNAVAILABLE, 503, "the server is shutting down");
        return;
    }
    /* Take a reference to the target, a ticket from the breaker and an idle client. */
    const double t0 = kiri_platform_now();
    kiri_platform_mutex_lock(u->lock);
    struct target *t = u->t;
    enum kiri_breaker_ticket ticket = KIRI_BREAKER_REFUSED;
    double wait = 0;
    if (t) {
        ticket = kiri_breaker_acquire(&u->br, t0);
        wait = u->br.open_until - t0;
    }
    struct kiri_https_client *c = NULL;
    if (t && ticket != KIRI_BREAKER_REFUSED) {
        t->refs++;
        if (t->n_idle > 0)
            c = t->idle[--t->n_idle];
    }
    kiri_platform_mutex_unlock(u->lock);
    if (!t) {
        outcome(out, KIRI_UPSTREAM_UNAVAILABLE, 503, "no upstream is configured");
        return;
    }
    if (ticket == KIRI_BREAKER_REFUSED) {
        atomic_fetch_add(&u->failures[R_BREAKER], 1);
        char msg[160];
        snprintf(msg, sizeof msg, "the upstream is failing; its circuit breaker is open%s",
                 wait > 0 ? " until the cool-down ends" : " while a probe runs");
        outcome(out, KIRI_UPSTREAM_UNAVAILABLE, 503, msg);
        return;
    }

    struct kiri_status_info info;
    memset(&info, 0, sizeof info);
    struct kiri_https_response *resp = kiri_mem_alloc(sizeof *resp);
    struct fwd f;
    memset(&f, 0, sizeof f);
    f.sink = sink;
    f.stream = stream;
    kiri_upstream_sse_init(&f.sse);
    char url[KIRI_HTTPS_MAX_URL];
    const char *tail = t->prefix_v1 && strncmp(path, "/v1/", 4) == 0 ? path + 3 : path;
    const int url_ok = snprintf(url, sizeof url, "%s%s", t->base, tail) < (int)sizeof url;
    enum kiri_breaker_result br = KIRI_BREAKER_NEUTRAL;
    if (!resp || !url_ok) {
        outcome(out, KIRI_UPSTREAM_UNAVAILABLE, 502, !resp ? "out of memory" : "the upstream URL is too long");
    } else if (!c && kiri_https_client_init(&t->opt, &c, &info) != KIRI_OK) {
        char msg[256];
        snprintf(msg, sizeof msg, "cannot set up a client for the upstream: %.200s", info.message);
        outcome(out, KIRI_UPSTREAM_UNAVAILABLE, 502, msg);
        c = NULL;
    } else {
        const char *headers[4];
        int nh = 0;
        if (t->auth)
            headers[nh++] = t->auth;
        headers[nh++] = stream ? "Accept: text/event-stream" : "Accept: application/json";
        headers[nh++] = "X-Kiri-Forwarded: 1"; /* an upstream kiri serves it itself: no loops */
        headers[nh] = NULL;
        struct kiri_https_request req;
        memset(&req, 0, sizeof req);
        req.url = url;
        req.headers = headers;
        req.max_body = t->max_response;
        req.method = "POST";
        req.body = body;
        req.body_len = body_len;
        req.content_type = "application/json";
        req.any_status = 1;
        const int rc = kiri_https_send(c, &req, on_body, &f, resp, &info);
        br = classify(u, &f, rc, resp, &info, t, out);
    }

    kiri_platform_mutex_lock(u->lock);
    if (t == u->t) /* after a move to another URL, this answer says nothing about the new one */
        kiri_breaker_release(&u->br, ticket, br, kiri_platform_now());
    if (c && t->n_idle < POOL_MAX && t == u->t) {
        t->idle[t->n_idle++] = c;
        c = NULL;
    }
    const int last = --t->refs == 0;
    kiri_platform_mutex_unlock(u->lock);
    kiri_https_client_free(c);
    if (last)
        target_free(t);
    /* A whole body goes out only now, so that whoever reads it sees the breaker already updated. */
    if (f.relay && (sink->head(sink->user, out->upstream_status, "application/json", 0) != 0 ||
                    sink->data(sink->user, f.body.data ? f.body.data : "", f.body.len) != 0))
        outcome(out, KIRI_UPSTREAM_CLIENT_GONE, 499, "the client went away");
    kiri_upstream_sse_free(&f.sse);
    kiri_buf_free(&f.body);
    kiri_mem_free(resp);
}
