/* Tests for the cloud upstream's logic (server/upstream.c) and the HTTP parts of the
 * HTTPS client it relies on (https.c: http:// URLs, kiri_https_send's argument checks):
 * - the circuit breaker, step by step on a fake clock, in a table: K consecutive failures open
 *   it, the cool-down lets exactly one probe through, a failed probe doubles the cool-down up to
 *   its maximum, a successful one closes it, neutral results and late answers change nothing;
 * - upstream URLs and routing names, good and bad;
 * - garbage detection (docs/fleet.md F17, F19): HTML, empty, invalid or non-object JSON; event
 *   streams fed at every split point, CRLF or LF, unknown fields, non-JSON data, a stream cut
 *   off inside an event or before [DONE], an event over 1 MiB;
 * - forwarding to a port where nothing listens: every forward reports UNAVAILABLE before any
 *   byte reaches the sink, and after the threshold the breaker answers without connecting;
 * - key files, reconfiguration, and a failing-allocator walk over the event splitter.
 * Expected values are written from the rules in upstream.h and the SSE specification.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "https.h"
#include "kiri.h"
#include "mem.h"
#include "metrics.h"
#include "upstream.h"
#include "test.h"

/* ---------------------------------------------------------------------------------------------
 * Circuit breaker
 * ------------------------------------------------------------------------------------------- */

enum op { ACQ, REL };

struct step {
    double t;                       /* fake clock, seconds */
    enum op op;
    int slot;                       /* which held ticket (0..3) the step takes or gives back */
    int want_ticket;                /* ACQ: the expected ticket */
    enum kiri_breaker_result res;   /* REL: the result given back */
    enum kiri_breaker_state want_state;   /* after the step */
};

#define C KIRI_BREAKER_CLOSED
#define O KIRI_BREAKER_OPEN
#define H KIRI_BREAKER_HALF_OPEN
#define PASS KIRI_BREAKER_PASS
#define PROBE KIRI_BREAKER_PROBE
#define NO KIRI_BREAKER_REFUSED
#define OK_ KIRI_BREAKER_SUCCESS
#define FAIL KIRI_BREAKER_FAILURE
#define NEU KIRI_BREAKER_NEUTRAL

/* Threshold 3, cool-down 2 s doubling up to 5 s. */
static const struct step breaker_steps[] = {
    /* two failures, a success: the count starts again */
    {0, ACQ, 0, PASS, 0, C}, {0, REL, 0, 0, FAIL, C},
    {0, ACQ, 0, PASS, 0, C}, {0, REL, 0, 0, FAIL, C},
    {0, ACQ, 0, PASS, 0, C}, {0, REL, 0, 0, OK_, C},
    /* neutral results do not count */
    {1, ACQ, 0, PASS, 0, C}, {1, REL, 0, 0, NEU, C},
    {1, ACQ, 0, PASS, 0, C}, {1, REL, 0, 0, FAIL, C},
    {1, ACQ, 0, PASS, 0, C}, {1, REL, 0, 0, FAIL, C},
    /* a request admitted while closed whose answer comes late */
    {1, ACQ, 3, PASS, 0, C},
    {1, ACQ, 0, PASS, 0, C}, {10, REL, 0, 0, FAIL, O},     /* third failure at t=10: open until 12 */
    {10, REL, 3, 0, OK_, O},                                /* late success: ignored while open */
    {11.9, ACQ, 0, NO, 0, O},
    {12, ACQ, 0, PROBE, 0, H},                              /* cool-down over: one probe */
    {12, ACQ, 1, NO, 0, H},                                 /* a second request while it runs */
    {13, REL, 0, 0, FAIL, O},                               /* probe failed: open for 4 s, until 17 */
    {16.9, ACQ, 0, NO, 0, O},
    {17, ACQ, 0, PROBE, 0, H}, {17, REL, 0, 0, FAIL, O},   /* 8 s capped at 5: until 22 */
    {21.9, ACQ, 0, NO, 0, O},
    {22, ACQ, 0, PROBE, 0, H}, {22, REL, 0, 0, NEU, H},    /* neutral probe: the next one probes */
    {22, ACQ, 0, PROBE, 0, H}, {23, REL, 0, 0, OK_, C},    /* success closes it */
    /* closed again with the count at zero and the cool-down back at 2 s */
    {23, ACQ, 0, PASS, 0, C}, {23, REL, 0, 0, FAIL, C},
    {23, ACQ, 0, PASS, 0, C}, {23, REL, 0, 0, FAIL, C},
    {23, ACQ, 0, PASS, 0, C}, {30, REL, 0, 0, FAIL, O},
    {31.9, ACQ, 0, NO, 0, O},
    {32, ACQ, 0, PROBE, 0, H}, {32, REL, 0, 0, OK_, C},
};

static void test_breaker(void)
{
    struct kiri_breaker b;
    kiri_breaker_init(&b, 3, 2, 5);
    CHECK_EQ_INT(b.state, C);
    enum kiri_breaker_ticket held[4] = {NO, NO, NO, NO};
    for (size_t i = 0; i < sizeof breaker_steps / sizeof breaker_steps[0]; i++) {
        const struct step *s = &breaker_steps[i];
        if (s->op == ACQ) {
            held[s->slot] = kiri_breaker_acquire(&b, s->t);
            if ((int)held[s->slot] != s->want_ticket)
                fprintf(stderr, "breaker step %zu\n", i);
            CHECK_EQ_INT(held[s->slot], s->want_ticket);
        } else {
            kiri_breaker_release(&b, held[s->slot], s->res, s->t);
            held[s->slot] = NO;
        }
        if (b.state != s->want_state)
            fprintf(stderr, "breaker step %zu\n", i);
        CHECK_EQ_INT(b.state, s->want_state);
    }
    CHECK_EQ_INT(b.opens, 4);

    /* Defaults for out-of-range arguments. */
    kiri_breaker_init(&b, 0, -1, 0);
    CHECK_EQ_INT(b.threshold, 3);
    CHECK_NEAR(b.base, 2, 0);
    CHECK_NEAR(b.max, 60, 0);
    kiri_breaker_init(&b, 1, 90, 10);
    CHECK_NEAR(b.max, 90, 0);
    /* threshold 1: one failure opens it */
    enum kiri_breaker_ticket t = kiri_breaker_acquire(&b, 0);
    kiri_breaker_release(&b, t, FAIL, 0);
    CHECK_EQ_INT(b.state, O);
    CHECK_EQ_INT(kiri_breaker_acquire(&b, 89), NO);
}

/* ---------------------------------------------------------------------------------------------
 * URLs and names
 * ------------------------------------------------------------------------------------------- */

static void test_urls(void)
{
    static const struct {
        const char *url;
        int ok;
        const char *base;
        int v1;
    } rows[] = {
        {"http://127.0.0.1:8080", 1, "http://127.0.0.1:8080", 0},
        {"http://127.0.0.1:8080/", 1, "http://127.0.0.1:8080", 0},
        {"https://api.example.com/v1", 1, "https://api.example.com/v1", 1},
        {"https://api.example.com/v1/", 1, "https://api.example.com/v1", 1},
        {"https://gw.example.com/openai", 1, "https://gw.example.com/openai", 0},
        {"https://gw.example.com/xv1", 1, "https://gw.example.com/xv1", 0},   /* not a /v1 segment */
        {"HTTP://[::1]:9000/p", 1, "HTTP://[::1]:9000/p", 0},
        {"ftp://host/", 0, NULL, 0},
        {"http://host/?q=1", 0, NULL, 0},
        {"http://host/#frag", 0, NULL, 0},
        {"http://user:pw@host/", 0, NULL, 0},
        {"http://host:0/", 0, NULL, 0},
        {"http://ho st/", 0, NULL, 0},
        {"host:8080", 0, NULL, 0},
        {"", 0, NULL, 0},
        {NULL, 0, NULL, 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char base[KIRI_HTTPS_MAX_URL] = "";
        int v1 = -1;
        const int rc = kiri_upstream_parse_url(rows[i].url, base, sizeof base, &v1);
        if ((rc == 0) != rows[i].ok)
            fprintf(stderr, "url row %zu: %s\n", i, rows[i].url ? rows[i].url : "(null)");
        CHECK_EQ_INT(rc == 0, rows[i].ok);
        if (rows[i].ok && rc == 0) {
            CHECK_STR(base, rows[i].base);
            CHECK_EQ_INT(v1, rows[i].v1);
        }
    }
    char base[64];
    int v1;
    CHECK_EQ_INT(kiri_upstream_parse_url("https://h/a/v1", base, sizeof base, &v1), 0);
    CHECK_EQ_INT(v1, 1);
    CHECK_EQ_INT(kiri_upstream_parse_url("https://h/a/v1", base, 8, &v1), -1);   /* does not fit */

    char host[256], path[256];
    int port = 0, tls = -1;
    CHECK_EQ_INT(kiri_https_parse_url_any("http://example.com/a?b", &tls, host, sizeof host, &port, path, sizeof path), 0);
    CHECK_EQ_INT(tls, 0);
    CHECK_EQ_INT(port, 80);
    CHECK_STR(host, "example.com");
    CHECK_STR(path, "/a?b");
    CHECK_EQ_INT(kiri_https_parse_url_any("https://example.com", &tls, host, sizeof host, &port, path, sizeof path), 0);
    CHECK_EQ_INT(tls, 1);
    CHECK_EQ_INT(port, 443);
    CHECK_EQ_INT(kiri_https_parse_url_any("http://h:65536/", &tls, host, sizeof host, &port, path, sizeof path), -1);
    /* The https-only parser still refuses http://. */
    CHECK_EQ_INT(kiri_https_parse_url("http://example.com/", host, sizeof host, &port, path, sizeof path), -1);

    enum kiri_route r = KIRI_ROUTE_LOCAL;
    CHECK_EQ_INT(kiri_route_parse("local-first", &r), 0);
    CHECK_EQ_INT(r, KIRI_ROUTE_LOCAL_FIRST);
    CHECK_EQ_INT(kiri_route_parse("cloud-first", &r), 0);
    CHECK_EQ_INT(r, KIRI_ROUTE_CLOUD_FIRST);
    CHECK_EQ_INT(kiri_route_parse("upstream-first", &r), 0);
    CHECK_EQ_INT(r, KIRI_ROUTE_CLOUD_FIRST);
    CHECK_EQ_INT(kiri_route_parse("upstream", &r), 0);
    CHECK_EQ_INT(r, KIRI_ROUTE_CLOUD_FIRST);
    CHECK_EQ_INT(kiri_route_parse("local", &r), 0);
    CHECK_EQ_INT(r, KIRI_ROUTE_LOCAL);
    CHECK_EQ_INT(kiri_route_parse("Cloud-First", &r), -1);
    CHECK_EQ_INT(kiri_route_parse("", &r), -1);
    CHECK_EQ_INT(kiri_route_parse(NULL, &r), -1);
    CHECK_STR(kiri_route_name(KIRI_ROUTE_CLOUD_FIRST), "cloud-first");
    CHECK_STR(kiri_route_name(KIRI_ROUTE_LOCAL_FIRST), "local-first");
}

/* ---------------------------------------------------------------------------------------------
 * Garbage detection
 * ------------------------------------------------------------------------------------------- */

static void test_check_json(void)
{
    static const struct {
        const char *type;
        const char *body;
        int ok;
        const char *why_has;
    } rows[] = {
        {"application/json", "{\"choices\":[]}", 1, NULL},
        {"application/json; charset=utf-8", " \n{\"a\":1}\n", 1, NULL},
        {NULL, "{}", 1, NULL},
        {"text/html", "{\"a\":1}", 0, "HTML"},
        {"application/json", "<html><body>502 Bad Gateway</body></html>", 0, "HTML"},
        {"application/json", "\n  <!DOCTYPE html>", 0, "HTML"},
        {"application/json", "", 0, "empty"},
        {"application/json", " \r\n", 0, "empty"},
        {"application/json", "{\"a\":", 0, "not valid JSON"},
        {"application/json", "{\"a\":1} trailing", 0, "not valid JSON"},
        {"application/json", "{\"a\":1,\"a\":2}", 0, "not valid JSON"},
        {"application/json", "[1,2]", 0, "not an object"},
        {"application/json", "\"text\"", 0, "not an object"},
        {"text/plain", "Internal Server Error", 0, "not valid JSON"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        char why[200] = "";
        const int rc = kiri_upstream_check_json(rows[i].type, rows[i].body, strlen(rows[i].body), why, sizeof why);
        if ((rc == 0) != rows[i].ok)
            fprintf(stderr, "json row %zu\n", i);
        CHECK_EQ_INT(rc == 0, rows[i].ok);
        if (rows[i].why_has && !strstr(why, rows[i].why_has))
            fprintf(stderr, "json row %zu: %s\n", i, why);
        if (rows[i].why_has)
            CHECK(strstr(why, rows[i].why_has) != NULL);
    }
}

struct collect {
    char out[4096];
    size_t n;
    int events;
    int stop_after;     /* > 0: return non-zero at that event */
};

static int collect_event(void *user, const char *ev, size_t n)
{
    struct collect *c = user;
    /* Every event passed on is whole: it ends with a blank line. */
    CHECK(n >= 2 && ev[n - 1] == '\n' && (ev[n - 2] == '\n' || (n >= 3 && ev[n - 2] == '\r' && ev[n - 3] == '\n')));
    if (c->n + n < sizeof c->out) {
        memcpy(c->out + c->n, ev, n);
        c->n += n;
        c->out[c->n] = '\0';
    }
    c->events++;
    return c->stop_after > 0 && c->events == c->stop_after;
}

static const char good_stream[] =
    ": keep-alive comment\n\n"
    "data: {\"choices\":[{\"text\":\"Once\"}]}\n\n"
    "event: message\nid: 7\nretry: 100\ndata: {\"choices\":\n"
    "data: [{\"text\":\" upon\"}]}\n\n"
    "data: {\"choices\":[{\"text\":\" a time\",\"finish_reason\":\"length\"}]}\r\n\r\n"
    "data: [DONE]\n\n";

static void test_sse(void)
{
    const size_t n = sizeof good_stream - 1;
    /* Split into two pushes at every position, and byte by byte: the same 5 events, and the
     * bytes passed on are exactly the bytes fed. */
    for (size_t cut = 0; cut <= n; cut++) {
        struct kiri_upstream_sse s;
        kiri_upstream_sse_init(&s);
        struct collect c;
        memset(&c, 0, sizeof c);
        char why[200] = "";
        CHECK_EQ_INT(kiri_upstream_sse_push(&s, good_stream, cut, collect_event, &c, why, sizeof why), 0);
        CHECK_EQ_INT(kiri_upstream_sse_push(&s, good_stream + cut, n - cut, collect_event, &c, why, sizeof why), 0);
        CHECK_EQ_INT(c.events, 5);
        CHECK_STR(c.out, good_stream);
        CHECK_EQ_INT(kiri_upstream_sse_finish(&s, why, sizeof why), 0);
        kiri_upstream_sse_free(&s);
    }
    {
        struct kiri_upstream_sse s;
        kiri_upstream_sse_init(&s);
        struct collect c;
        memset(&c, 0, sizeof c);
        for (size_t i = 0; i < n; i++)
            CHECK_EQ_INT(kiri_upstream_sse_push(&s, good_stream + i, 1, collect_event, &c, NULL, 0), 0);
        CHECK_EQ_INT(c.events, 5);
        CHECK_STR(c.out, good_stream);
        kiri_upstream_sse_free(&s);
    }

    /* Malformed streams: refused at push (-1) or at finish (-1), each with its reason. */
    static const struct {
        const char *bytes;
        int push;               /* expected push result */
        int finish;             /* expected finish result when push gave 0 */
        int events;             /* events passed on before the refusal */
        const char *why_has;
    } bad[] = {
        {"<html>\n<body>oops</body>\n\n", -1, 0, 0, "unknown field"},
        {"data: {\"a\":1}\n\ndata: not json\n\n", -1, 0, 1, "JSON object"},
        {"data: [1,2]\n\n", -1, 0, 0, "JSON object"},
        {"data: {\"a\":1}\n\ndata: {\"choices\":[{\"te", 0, -1, 1, "inside an event"},
        {"data: {\"a\":1}\n\n", 0, -1, 1, "without its final [DONE]"},
        {"", 0, -1, 0, "without its final [DONE]"},
        {"data: {\"a\":1}\n\ndata: [DONE]\n\n\n", 0, 0, 2, NULL},   /* trailing blank lines are harmless */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        struct kiri_upstream_sse s;
        kiri_upstream_sse_init(&s);
        struct collect c;
        memset(&c, 0, sizeof c);
        char why[200] = "";
        const int rc = kiri_upstream_sse_push(&s, bad[i].bytes, strlen(bad[i].bytes), collect_event, &c, why, sizeof why);
        if (rc != bad[i].push)
            fprintf(stderr, "sse row %zu\n", i);
        CHECK_EQ_INT(rc, bad[i].push);
        CHECK_EQ_INT(c.events, bad[i].events);
        if (rc == 0) {
            CHECK_EQ_INT(kiri_upstream_sse_finish(&s, why, sizeof why), bad[i].finish);
        }
        if (bad[i].why_has)
            CHECK(strstr(why, bad[i].why_has) != NULL);
        kiri_upstream_sse_free(&s);
    }

    /* An event longer than 1 MiB is refused, in bounded memory. */
    {
        struct kiri_upstream_sse s;
        kiri_upstream_sse_init(&s);
        char *chunk = test_xmalloc(65536);
        memset(chunk, 'x', 65536);
        memcpy(chunk, "data: \"", 7);
        char why[200] = "";
        int rc = 0, pushes = 0;
        for (; pushes < 40 && rc == 0; pushes++)
            rc = kiri_upstream_sse_push(&s, chunk, 65536, NULL, NULL, why, sizeof why);
        CHECK_EQ_INT(rc, -1);
        CHECK(pushes <= 18);
        CHECK(s.event.cap <= KIRI_UPSTREAM_MAX_EVENT + 2);   /* MAX + 1 bytes held, and the NUL */
        CHECK(strstr(why, "longer than 1 MiB") != NULL);
        free(chunk);
        kiri_upstream_sse_free(&s);
    }

    /* A callback that asks to stop: push returns 1 and passes nothing more on. */
    {
        struct kiri_upstream_sse s;
        kiri_upstream_sse_init(&s);
        struct collect c;
        memset(&c, 0, sizeof c);
        c.stop_after = 2;
        CHECK_EQ_INT(kiri_upstream_sse_push(&s, good_stream, n, collect_event, &c, NULL, 0), 1);
        CHECK_EQ_INT(c.events, 2);
        kiri_upstream_sse_free(&s);
    }
}

static void test_peek(void)
{
    char model[16];
    int stream = -1;
    static const char a[] = "{\"model\":\"stories260K.gguf\",\"stream\":true,\"prompt\":\"x\"}";
    CHECK_EQ_INT(kiri_upstream_peek(a, sizeof a - 1, model, sizeof model, &stream), 0);
    CHECK_STR(model, "stories260K.ggu");   /* cut to 15 bytes and the NUL */
    CHECK_EQ_INT(stream, 1);
    static const char b[] = "{\"prompt\":\"x\",\"stream\":\"yes\",\"model\":7}";
    CHECK_EQ_INT(kiri_upstream_peek(b, sizeof b - 1, model, sizeof model, &stream), 0);
    CHECK_STR(model, "");
    CHECK_EQ_INT(stream, 0);
    static const char c[] = "[1]";
    CHECK_EQ_INT(kiri_upstream_peek(c, sizeof c - 1, model, sizeof model, &stream), -1);
    static const char d[] = "{\"model\":";
    CHECK_EQ_INT(kiri_upstream_peek(d, sizeof d - 1, model, sizeof model, &stream), -1);
}

/* ---------------------------------------------------------------------------------------------
 * The upstream object
 * ------------------------------------------------------------------------------------------- */

static int sink_calls;

static int sink_head(void *user, int status, const char *type, int stream)
{
    (void)user, (void)status, (void)type, (void)stream;
    sink_calls++;
    return 0;
}

static int sink_data(void *user, const void *p, size_t n)
{
    (void)user, (void)p, (void)n;
    sink_calls++;
    return 0;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_forward_dead_port(void)
{
    struct kiri_upstream_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.url = "http://127.0.0.1:1";   /* a privileged port nothing listens on */
    cfg.route = KIRI_ROUTE_CLOUD_FIRST;
    cfg.route_queue = 2;
    cfg.connect_timeout = 2;
    cfg.breaker_threshold = 2;
    cfg.breaker_cooldown = 30;
    struct kiri_upstream *u = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_upstream_open(&cfg, &u, &info), KIRI_OK);
    if (!u)
        return;
    int q = 0;
    CHECK_EQ_INT(kiri_upstream_route(u, &q), KIRI_ROUTE_CLOUD_FIRST);
    CHECK_EQ_INT(q, 2);
    const struct kiri_upstream_sink sink = {sink_head, sink_data, NULL};
    static const char body[] = "{\"prompt\":\"x\"}";
    struct kiri_upstream_outcome out;
    for (int i = 0; i < 4; i++) {
        kiri_upstream_forward(u, "/v1/completions", body, sizeof body - 1, i & 1, &sink, &out);
        CHECK_EQ_INT(out.result, KIRI_UPSTREAM_UNAVAILABLE);
        CHECK_EQ_INT(out.upstream_status, 0);
        CHECK(out.status == 502 || out.status == 503);
        CHECK(out.message[0] != '\0');
        /* two refused connections open the breaker; then it answers without connecting */
        CHECK_EQ_INT(kiri_upstream_breaker_state(u), i < 1 ? KIRI_BREAKER_CLOSED : KIRI_BREAKER_OPEN);
        if (i >= 2)
            CHECK(strstr(out.message, "circuit breaker") != NULL);
    }
    CHECK_EQ_INT(sink_calls, 0);
    struct kiri_upstream_stats us;
    kiri_upstream_get_stats(u, &us);
    char *m = kiri_metrics_render_upstream(kiri_mem_calloc(1, 1), &us);
    CHECK(m != NULL);
    if (m) {
        CHECK(strstr(m, "kiri_upstream_breaker_state 1\n") != NULL);
        CHECK(strstr(m, "kiri_upstream_failures_total{reason=\"connect\"} 2\n") != NULL);
        CHECK(strstr(m, "kiri_upstream_failures_total{reason=\"breaker_open\"} 2\n") != NULL);
        CHECK(strstr(m, "kiri_upstream_breaker_opens_total 1\n") != NULL);
        kiri_mem_free(m);
    }

    /* Reconfiguring to another URL starts a closed breaker; to no URL, routing stops. */
    cfg.url = "http://127.0.0.1:2/v1";
    CHECK_EQ_INT(kiri_upstream_reconfigure(u, &cfg, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_upstream_breaker_state(u), KIRI_BREAKER_CLOSED);
    cfg.url = "gopher://x";
    CHECK(kiri_upstream_reconfigure(u, &cfg, &info) != KIRI_OK);
    CHECK(strstr(info.message, "--upstream") != NULL);
    CHECK_EQ_INT(kiri_upstream_route(u, NULL), KIRI_ROUTE_CLOUD_FIRST);   /* unchanged */
    cfg.url = NULL;
    CHECK_EQ_INT(kiri_upstream_reconfigure(u, &cfg, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_upstream_route(u, NULL), KIRI_ROUTE_LOCAL);
    kiri_upstream_forward(u, "/v1/completions", body, sizeof body - 1, 0, &sink, &out);
    CHECK_EQ_INT(out.result, KIRI_UPSTREAM_UNAVAILABLE);
    kiri_upstream_cancel(u);
    kiri_upstream_close(u);
}

static void test_key_files(void)
{
    const char *path = "test_upstream_key.txt";
    struct kiri_upstream_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.url = "http://127.0.0.1:1";
    cfg.route_queue = 1;
    cfg.key_file = path;
    static const struct {
        const char *text;
        int ok;
    } rows[] = {
        {"sk-abc123\n", 1},
        {"  sk-abc123  \r\nsecond line ignored\n", 1},
        {"sk-abc123", 1},
        {"", 0},
        {"\n", 0},
        {"sk abc\n", 0},
        {"sk-\x01\n", 0},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        write_file(path, rows[i].text);
        struct kiri_upstream *u = NULL;
        struct kiri_status_info info;
        memset(&info, 0, sizeof info);
        const int rc = kiri_upstream_open(&cfg, &u, &info);
        if ((rc == KIRI_OK) != rows[i].ok)
            fprintf(stderr, "key row %zu\n", i);
        CHECK_EQ_INT(rc == KIRI_OK, rows[i].ok);
        /* The message names the file, never the key. */
        CHECK(strstr(info.message, "abc") == NULL);
        kiri_upstream_close(u);
    }
    remove(path);
    struct kiri_upstream *u = NULL;
    struct kiri_status_info info;
    cfg.key_file = "/nonexistent/key";
    CHECK(kiri_upstream_open(&cfg, &u, &info) != KIRI_OK);
    CHECK(u == NULL);
    cfg.key_file = NULL;
    cfg.route_queue = 0;
    CHECK_EQ_INT(kiri_upstream_open(&cfg, &u, &info), KIRI_E_INVALID_ARG);
    /* No URL: an upstream that routes nothing. */
    cfg.url = "";
    CHECK_EQ_INT(kiri_upstream_open(&cfg, &u, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_upstream_route(u, NULL), KIRI_ROUTE_LOCAL);
    kiri_upstream_close(u);
}

static void test_send_arguments(void)
{
    struct kiri_https_options opt;
    memset(&opt, 0, sizeof opt);
    struct kiri_https_client *c = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_https_client_init(&opt, &c, &info), KIRI_OK);
    if (!c)
        return;
    struct kiri_https_response resp;
    struct kiri_https_request req;
    memset(&req, 0, sizeof req);
    /* http:// without allow_http is refused before any connection. */
    req.url = "http://127.0.0.1:1/";
    CHECK_EQ_INT(kiri_https_send(c, &req, NULL, NULL, &resp, &info), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(resp.failure, KIRI_HTTPS_URL);
    req.url = "https://127.0.0.1:1/";
    req.method = "PO ST";
    CHECK_EQ_INT(kiri_https_send(c, &req, NULL, NULL, &resp, &info), KIRI_E_INVALID_ARG);
    req.method = "post";
    CHECK_EQ_INT(kiri_https_send(c, &req, NULL, NULL, &resp, &info), KIRI_E_INVALID_ARG);
    req.method = "POST";
    req.content_type = "application/json\r\nX-Injected: 1";
    CHECK_EQ_INT(kiri_https_send(c, &req, NULL, NULL, &resp, &info), KIRI_E_INVALID_ARG);
    req.content_type = NULL;
    req.body_len = 5;
    CHECK_EQ_INT(kiri_https_send(c, &req, NULL, NULL, &resp, &info), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(resp.failure, KIRI_HTTPS_URL);
    kiri_https_client_free(c);
}

static void test_alloc_failures(void)
{
    int ok_at = -1;
    for (long n = 0; n < 100 && ok_at < 0; n++) {
        struct kiri_upstream_sse s;
        kiri_upstream_sse_init(&s);
        struct collect c;
        memset(&c, 0, sizeof c);
        char why[200] = "";
        kiri_mem_fail_after(n);
        const int rc = kiri_upstream_sse_push(&s, good_stream, sizeof good_stream - 1, collect_event, &c, why, sizeof why);
        kiri_mem_fail_after(-1);
        if (rc == 0) {
            ok_at = (int)n;
            CHECK_EQ_INT(c.events, 5);
        } else {
            CHECK_EQ_INT(rc, -1);
            CHECK(strstr(why, "out of memory") != NULL);
        }
        kiri_upstream_sse_free(&s);
    }
    CHECK(ok_at > 0);
}

TEST_MAIN(test_breaker, test_urls, test_check_json, test_sse, test_peek, test_forward_dead_port, test_key_files,
          test_send_arguments, test_alloc_failures)
