/* The HTTP layer: CivetWeb worker threads parse and validate requests, submit them to the batching
 * loop, and turn the loop's token events into OpenAI responses or Server-Sent Events. Each
 * generation request waits on its own small event queue, filled by the loop thread's callback
 * (which never blocks). */
#include "server.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "civetweb.h"

#include "auth.h"
#include "batcher.h"
#include "chat_page.h"
#include "chat_template.h"
#include "config.h"
#include "error.h"
#include "gguf.h"
#include "kiri.h"
#include "mem.h"
#include "metrics.h"
#include "model.h"
#include "openai.h"
#include "platform.h"
#include "stopper.h"
#include "tokenizer.h"

#define MAX_PIECE KIRI_DETOK_CAP
#define AUTH_FAIL_LIMIT 20

struct kiri_server {
    struct kiri_server_config cfg;
    struct mg_context *mg;
    int port;
    struct kiri_model *model;            /* owned, set once loaded */
    struct kiri_batcher *batcher;        /* owned */
    struct kiri_chat_template *tmpl;     /* owned */
    struct kiri_auth *auth;              /* owned, NULL without keys */
    struct kiri_metrics *metrics;        /* owned */
    _Atomic int ready;                   /* the model is loaded and the loop runs */
    _Atomic int draining;
    _Atomic int active;                  /* generation requests in flight */
    _Atomic uint64_t counter;
    /* Auth-failure rate limit (H19): failures counted per second of kiri_platform_now(); past
     * AUTH_FAIL_LIMIT in one second every request that needs a key is answered 429 until the
     * next second ends, so keys cannot be guessed at line rate. Racy updates only blur the count. */
    _Atomic int64_t auth_second;
    _Atomic int auth_failures;
    _Atomic int64_t auth_blocked_until;
    char model_id[128];
    char bos_text[64], eos_text[64];
    int32_t n_ctx;
    int64_t created;
    char tls_pem[512];                   /* temporary combined PEM, removed after start */
};

/* ---------------------------------------------------------------------------------------------
 * Responses
 * ------------------------------------------------------------------------------------------- */

static const char *status_text(int status)
{
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Payload Too Large";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

/* The connection's user data while a request's body has been read in full (read_body). */
static const char body_read_mark = 1;

/* Does the request carry a body that no one has read? */
static int body_unread(const struct mg_connection *c)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    return (ri->content_length > 0 || mg_get_header(c, "Transfer-Encoding") != NULL) &&
           mg_get_user_connection_data(c) != &body_read_mark;
}

/* Sends a complete response. extra is more header lines ending in \r\n, or "". A response to a
 * request whose body was not read (refused before reading, e.g. 401, 404, 413) closes the
 * connection, and says so, instead of letting CivetWeb read and discard the rest of the body,
 * which may be 10^12 bytes long or chunked without end. */
static int send_body(struct mg_connection *c, int status, const char *type, const char *body, size_t len,
                     const char *extra)
{
    const int close = strstr(extra, "Connection: close") != NULL;
    if (close || body_unread(c))
        mg_disable_connection_keep_alive(c);
    mg_printf(c,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n%s%s\r\n",
              status, status_text(status), type, len, extra, !close && body_unread(c) ? "Connection: close\r\n" : "");
    const char *method = mg_get_request_info(c)->request_method; /* NULL when the request line was bad */
    if (len && !(method && strcmp(method, "HEAD") == 0)) /* HEAD: the headers only */
        mg_write(c, body, len);
    return status;
}

static int send_json(struct mg_connection *c, int status, char *json, const char *extra)
{
    if (!json)
        return send_body(c, 500, "application/json",
                         "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}",
                         84, extra);
    send_body(c, status, "application/json", json, strlen(json), extra);
    kiri_mem_free(json);
    return status;
}

static int send_error(struct mg_connection *c, const struct kiri_api_error *e, const char *extra)
{
    return send_json(c, e->status, kiri_api_error_json(e), extra);
}

static int fail(struct mg_connection *c, int status, const char *type, const char *param, const char *code,
                const char *message, const char *extra)
{
    struct kiri_api_error e;
    kiri_api_error_set(&e, status, type, param, code, "%s", message);
    return send_error(c, &e, extra);
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */

/* ASCII case-insensitive equality (header values such as "100-Continue"). */
static int same_nocase(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        const int x = *a >= 'A' && *a <= 'Z' ? *a + 32 : *a, y = *b >= 'A' && *b <= 'Z' ? *b + 32 : *b;
        if (x != y)
            return 0;
    }
    return *a == *b;
}

/* Reads the body, refusing (413) anything over the limit before reading it all: a declared
 * Content-Length over the limit is refused unread, a chunked body as soon as it passes the limit;
 * either way the connection is closed rather than drained. Answers "Expect: 100-continue" (which
 * CivetWeb leaves to request handlers) once the size is known to be acceptable, and refuses any
 * other expectation with 417. */
static int read_body(struct kiri_server *s, struct mg_connection *c, char **out, size_t *out_len)
{
    const struct mg_request_info *ri = mg_get_request_info(c);
    const uint64_t cap = s->cfg.max_body;
    if (ri->content_length > 0 && (uint64_t)ri->content_length > cap)
        return fail(c, 413, "invalid_request_error", "", "body_too_large", "the request body exceeds the size limit",
                    "Connection: close\r\n");
    const char *expect = mg_get_header(c, "Expect");
    if (expect) {
        if (!same_nocase(expect, "100-continue"))
            return fail(c, 417, "invalid_request_error", "", "expectation_failed",
                        "only \"Expect: 100-continue\" is supported", "Connection: close\r\n");
        if (strcmp(ri->http_version, "1.1") == 0)
            mg_printf(c, "HTTP/1.1 100 Continue\r\n\r\n");
    }
    size_t want = ri->content_length >= 0 ? (size_t)ri->content_length : 0, got = 0;
    size_t capb = ri->content_length >= 0 ? want + 1 : 4096;
    char *buf = kiri_mem_alloc(capb);
    if (!buf)
        return fail(c, 500, "server_error", "", "", "out of memory", "Connection: close\r\n");
    for (;;) {
        if (ri->content_length >= 0 && got == want)
            break;
        if (got > cap) {
            kiri_mem_free(buf);
            return fail(c, 413, "invalid_request_error", "", "body_too_large",
                        "the request body exceeds the size limit", "Connection: close\r\n");
        }
        if (got + 1 >= capb) {
            /* Grow to at most cap + 2 bytes: room for one byte past the limit, and the NUL. */
            size_t nc = capb * 2 > cap + 2 ? (size_t)cap + 2 : capb * 2;
            char *nb = kiri_mem_realloc(buf, nc);
            if (!nb) {
                kiri_mem_free(buf);
                return fail(c, 500, "server_error", "", "", "out of memory", "Connection: close\r\n");
            }
            buf = nb;
            capb = nc;
        }
        const int r = mg_read(c, buf + got, capb - 1 - got);
        if (r < 0) {
            /* A broken chunked encoding or a read error: the framing is lost. */
            kiri_mem_free(buf);
            return fail(c, 400, "invalid_request_error", "", "", "the request body is malformed",
                        "Connection: close\r\n");
        }
        if (r == 0)
            break;
        got += (size_t)r;
    }
    if (got > cap) {
        kiri_mem_free(buf);
        return fail(c, 413, "invalid_request_error", "", "body_too_large", "the request body exceeds the size limit",
                    "Connection: close\r\n");
    }
    if (ri->content_length >= 0 && got != want) {
        kiri_mem_free(buf);
        return fail(c, 400, "invalid_request_error", "", "", "the request body ended early", "Connection: close\r\n");
    }
    buf[got] = '\0';
    mg_set_user_connection_data(c, (void *)&body_read_mark);
    *out = buf;
    *out_len = got;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Generation: events from the loop thread to the HTTP thread
 * ------------------------------------------------------------------------------------------- */

struct event {
    int32_t token;
    int finish;
    float logprob;
    int n_top;
    int32_t top_ids[KIRI_MAX_TOP_LOGPROBS];
    float top_lp[KIRI_MAX_TOP_LOGPROBS];
    int32_t n_prompt, n_cached, n_generated;
    double ttft;
};

/* One choice (n of them per request). Fields above `text` are shared with the loop thread under
 * gen->lock; the rest belong to the HTTP thread. */
struct choice {
    struct gen *gen;
    uint64_t id;
    int submitted;
    struct event *q;          /* owned ring of pending events */
    int q_len, q_cap;
    int finished;             /* final event queued */
    /* HTTP thread only */
    int done;                 /* final event processed */
    int finish;               /* enum kiri_finish or KIRI_FINISH_* */
    int stop_hit;
    struct kiri_detok_stream ds;
    struct kiri_stopper stopper;
    char *text;               /* owned: all delivered text (non-streaming) */
    size_t text_len, text_cap;
    int32_t n_prompt, n_cached, n_generated;
    double ttft, last_token_time;
    /* log-probabilities (non-streaming), owned */
    int n_lp, lp_cap;
    char **lp_tok;
    size_t *lp_len;
    float *lp_val;
    char **top_tok;
    size_t *top_len;
    float *top_val;
};

struct gen {
    struct kiri_server *s;
    struct kiri_mutex *lock;
    struct kiri_cond *cond;
    struct choice ch[KIRI_API_MAX_N];
    int n;
    int n_top;
};

static int on_event(void *user, const struct kiri_token_event *ev)
{
    struct choice *ch = user;
    struct gen *g = ch->gen;
    kiri_platform_mutex_lock(g->lock);
    if (ch->q_len == ch->q_cap) {
        const int cap = ch->q_cap ? ch->q_cap * 2 : 16;
        struct event *q = kiri_mem_realloc(ch->q, (size_t)cap * sizeof *q);
        if (!q) {
            /* Out of memory: end this choice (the final event below still arrives). */
            kiri_platform_mutex_unlock(g->lock);
            return ev->finish < 0;
        }
        ch->q = q;
        ch->q_cap = cap;
    }
    struct event *e = &ch->q[ch->q_len++];
    e->token = ev->token;
    e->finish = ev->finish;
    e->logprob = ev->logprob;
    e->n_top = ev->n_top;
    memcpy(e->top_ids, ev->top_ids, sizeof e->top_ids);
    memcpy(e->top_lp, ev->top_logprobs, sizeof e->top_lp);
    e->n_prompt = ev->n_prompt;
    e->n_cached = ev->n_cached;
    e->n_generated = ev->n_generated;
    e->ttft = ev->first_token_seconds;
    if (ev->finish >= 0)
        ch->finished = 1;
    kiri_platform_cond_broadcast(g->cond);
    kiri_platform_mutex_unlock(g->lock);
    return 0;
}

static int append_text(struct choice *ch, const char *t, size_t n)
{
    if (ch->text_len + n + 1 > ch->text_cap) {
        size_t cap = ch->text_cap ? ch->text_cap : 256;
        while (cap < ch->text_len + n + 1)
            cap *= 2;
        char *b = kiri_mem_realloc(ch->text, cap);
        if (!b)
            return -1;
        ch->text = b;
        ch->text_cap = cap;
    }
    memcpy(ch->text + ch->text_len, t, n);
    ch->text_len += n;
    ch->text[ch->text_len] = '\0';
    return 0;
}

static char *piece_dup(const struct kiri_model *m, int32_t id, size_t *len)
{
    char buf[MAX_PIECE];
    int n = kiri_tokenizer_piece(m->tokenizer, id, 1, buf, sizeof buf);
    if (n < 0 || (size_t)n > sizeof buf)
        n = 0;
    *len = (size_t)n;
    return kiri_mem_strndup(buf, (size_t)n);
}

static int record_logprobs(struct gen *g, struct choice *ch, const struct event *e)
{
    const struct kiri_model *m = g->s->model;
    if (ch->n_lp == ch->lp_cap) {
        const int cap = ch->lp_cap ? ch->lp_cap * 2 : 32;
        const size_t nt = (size_t)cap * (size_t)(g->n_top ? g->n_top : 1);
        char **a = kiri_mem_realloc(ch->lp_tok, (size_t)cap * sizeof *a);
        if (a)
            ch->lp_tok = a;
        size_t *b = kiri_mem_realloc(ch->lp_len, (size_t)cap * sizeof *b);
        if (b)
            ch->lp_len = b;
        float *v = kiri_mem_realloc(ch->lp_val, (size_t)cap * sizeof *v);
        if (v)
            ch->lp_val = v;
        char **ta = kiri_mem_realloc(ch->top_tok, nt * sizeof *ta);
        if (ta)
            ch->top_tok = ta;
        size_t *tb = kiri_mem_realloc(ch->top_len, nt * sizeof *tb);
        if (tb)
            ch->top_len = tb;
        float *tv = kiri_mem_realloc(ch->top_val, nt * sizeof *tv);
        if (tv)
            ch->top_val = tv;
        if (!a || !b || !v || !ta || !tb || !tv)
            return -1;
        ch->lp_cap = cap;
    }
    const int i = ch->n_lp++;
    ch->lp_tok[i] = piece_dup(m, e->token, &ch->lp_len[i]);
    ch->lp_val[i] = e->logprob;
    for (int k = 0; k < g->n_top; k++) {
        const size_t at = (size_t)i * (size_t)g->n_top + (size_t)k;
        if (k < e->n_top) {
            ch->top_tok[at] = piece_dup(m, e->top_ids[k], &ch->top_len[at]);
            ch->top_val[at] = e->top_lp[k];
        } else {
            ch->top_tok[at] = kiri_mem_strndup("", 0);
            ch->top_len[at] = 0;
            ch->top_val[at] = -INFINITY;
        }
    }
    return 0;
}

static void choice_free(struct gen *g, struct choice *ch)
{
    kiri_mem_free(ch->q);
    kiri_stopper_free(&ch->stopper);
    kiri_mem_free(ch->text);
    for (int i = 0; i < ch->n_lp; i++) {
        kiri_mem_free(ch->lp_tok[i]);
        for (int k = 0; k < g->n_top; k++)
            kiri_mem_free(ch->top_tok[(size_t)i * (size_t)g->n_top + (size_t)k]);
    }
    kiri_mem_free(ch->lp_tok);
    kiri_mem_free(ch->lp_len);
    kiri_mem_free(ch->lp_val);
    kiri_mem_free(ch->top_tok);
    kiri_mem_free(ch->top_len);
    kiri_mem_free(ch->top_val);
}

static const char *finish_reason(int finish, int stop_hit)
{
    if (stop_hit || finish == KIRI_FINISH_EOS || finish == KIRI_FINISH_STOP)
        return "stop";
    return "length";
}

/* ---------------------------------------------------------------------------------------------
 * Streaming
 * ------------------------------------------------------------------------------------------- */

struct stream {
    struct mg_connection *c;
    int kind;
    char id[48];
    int64_t created;
    const char *model;
    int started;
    int broken;              /* the client went away */
    int raw;                 /* HTTP/1.0: no chunked encoding; the end of the stream closes the connection */
};

/* Writes part of the event stream (a chunk in HTTP/1.1); marks the stream broken on failure. */
static void stream_write(struct stream *st, const char *data, size_t len)
{
    if (st->broken || len == 0)
        return;
    if ((st->raw ? mg_write(st->c, data, len) : mg_send_chunk(st->c, data, (unsigned)len)) <= 0)
        st->broken = 1;
}

static void stream_send(struct stream *st, char *json)
{
    if (json) {
        stream_write(st, "data: ", 6);
        stream_write(st, json, strlen(json));
        stream_write(st, "\n\n", 2);
    }
    kiri_mem_free(json);
}

static void stream_text(struct stream *st, struct gen *g, struct choice *ch, const char *text, size_t len,
                        const char *finish)
{
    struct kiri_api_choice c;
    memset(&c, 0, sizeof c);
    c.index = (int)(ch - g->ch);
    c.text = text;
    c.text_len = len;
    c.finish_reason = finish;
    stream_send(st, kiri_api_chunk_json(st->kind, st->id, st->created, st->model, &c, 1, !st->started, NULL));
    st->started = 1;
}

/* ---------------------------------------------------------------------------------------------
 * The generation endpoints
 * ------------------------------------------------------------------------------------------- */

static int tokenize_alloc(const struct kiri_model *m, const char *text, int add_bos, int parse_special,
                          int32_t **ids, int32_t *n)
{
    const size_t len = strlen(text);
    const int need = kiri_tokenizer_encode(m->tokenizer, text, len, add_bos, 0, parse_special, NULL, 0);
    if (need < 0)
        return need;
    *ids = kiri_mem_array((size_t)need + 1, sizeof **ids);
    if (!*ids)
        return KIRI_E_NOMEM;
    *n = kiri_tokenizer_encode(m->tokenizer, text, len, add_bos, 0, parse_special, *ids, need);
    return KIRI_OK;
}

/* The prompt's token ids for a parsed request, or an error response already sent (returns status). */
static int build_prompt(struct kiri_server *s, struct mg_connection *c, const struct kiri_api_request *r,
                        int32_t **ids, int32_t *n)
{
    const struct kiri_model *m = s->model;
    const int add_bos = kiri_tokenizer_add_bos(m->tokenizer);
    if (r->kind == KIRI_API_COMPLETIONS) {
        if (r->prompt_tokens) {
            *ids = kiri_mem_array((size_t)r->n_prompt_tokens + 1, sizeof **ids);
            if (!*ids)
                return fail(c, 500, "server_error", "", "", "out of memory", "");
            memcpy(*ids, r->prompt_tokens, (size_t)r->n_prompt_tokens * sizeof **ids);
            *n = r->n_prompt_tokens;
            return 0;
        }
        if (tokenize_alloc(m, r->prompt ? r->prompt : "", add_bos, 1, ids, n) != KIRI_OK)
            return fail(c, 500, "server_error", "", "", "tokenization failed", "");
        return 0;
    }
    struct kiri_chat_message *msgs = kiri_mem_calloc((size_t)r->n_messages, sizeof *msgs);
    if (!msgs)
        return fail(c, 500, "server_error", "", "", "out of memory", "");
    for (int i = 0; i < r->n_messages; i++) {
        msgs[i].role = r->messages[i].role;
        msgs[i].content = r->messages[i].content ? r->messages[i].content : "";
    }
    char *text = NULL;
    size_t text_len = 0;
    struct kiri_status_info info;
    const int rc = kiri_chat_template_render(s->tmpl, msgs, r->n_messages, s->bos_text, s->eos_text, 1, NULL, &text,
                                             &text_len, &info);
    kiri_mem_free(msgs);
    if (rc != KIRI_OK)
        return fail(c, 400, "invalid_request_error", "messages", "chat_template_error", info.message, "");
    /* Templates usually write the BOS text themselves. */
    const int bos = add_bos && !(s->bos_text[0] && strncmp(text, s->bos_text, strlen(s->bos_text)) == 0);
    const int trc = tokenize_alloc(m, text, bos, 1, ids, n);
    kiri_mem_free(text);
    if (trc != KIRI_OK)
        return fail(c, 500, "server_error", "", "", "tokenization failed", "");
    return 0;
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Hands text of a choice to the client: a stream chunk, or the accumulated response. */
static void deliver(struct stream *st, struct gen *g, struct choice *ch, const char *text, size_t len)
{
    if (!len)
        return;
    if (st)
        stream_text(st, g, ch, text, len, NULL);
    else
        append_text(ch, text, len);
}

/* Processes queued events of every choice; returns when all choices are done. */
static void run_generation(struct kiri_server *s, struct gen *g, const struct kiri_api_request *r, struct stream *st,
                           double deadline)
{
    const struct kiri_model *m = s->model;
    struct event *batch = NULL;
    int batch_cap = 0;
    for (;;) {
        int all_done = 1;
        for (int i = 0; i < g->n; i++)
            all_done &= g->ch[i].done;
        if (all_done)
            break;
        /* Wait for events (bounded, to check the deadline). */
        kiri_platform_mutex_lock(g->lock);
        int any = 0;
        for (int i = 0; i < g->n; i++)
            any |= g->ch[i].q_len > 0;
        if (!any)
            kiri_platform_cond_timed_wait(g->cond, g->lock, 0.25);
        kiri_platform_mutex_unlock(g->lock);
        if (kiri_platform_now() > deadline)
            for (int i = 0; i < g->n; i++)
                if (!g->ch[i].done)
                    kiri_batcher_cancel(s->batcher, g->ch[i].id);

        for (int i = 0; i < g->n; i++) {
            struct choice *ch = &g->ch[i];
            kiri_platform_mutex_lock(g->lock);
            const int n_ev = ch->q_len;
            if (n_ev > batch_cap) {
                struct event *nb = kiri_mem_realloc(batch, (size_t)n_ev * sizeof *nb);
                if (nb) {
                    batch = nb;
                    batch_cap = n_ev;
                }
            }
            const int take = n_ev <= batch_cap ? n_ev : batch_cap;
            if (take) { /* ch->q is NULL until the first event: no memmove on it (UBSan) */
                memcpy(batch, ch->q, (size_t)take * sizeof *batch);
                memmove(ch->q, ch->q + take, (size_t)(ch->q_len - take) * sizeof *ch->q);
                ch->q_len -= take;
            }
            kiri_platform_mutex_unlock(g->lock);

            for (int k = 0; k < take && !ch->done; k++) {
                const struct event *e = &batch[k];
                ch->n_prompt = e->n_prompt;
                ch->n_cached = e->n_cached;
                if (e->token >= 0 && !ch->stop_hit) {
                    const double now = kiri_platform_now();
                    if (ch->n_generated == 0)
                        kiri_metrics_ttft(s->metrics, e->ttft);
                    else
                        kiri_metrics_inter_token(s->metrics, now - ch->last_token_time);
                    ch->last_token_time = now;
                    ch->n_generated = e->n_generated;
                    if (!kiri_tokenizer_is_eog(m->tokenizer, e->token)) {
                        char piece[MAX_PIECE];
                        int pn = kiri_detok_push(m->tokenizer, &ch->ds, e->token, 0, piece, sizeof piece);
                        const char *out;
                        size_t out_len;
                        const int hit = kiri_stopper_push(&ch->stopper, piece, pn > 0 ? (size_t)pn : 0, &out, &out_len);
                        deliver(st, g, ch, out, out_len);
                        if (r->logprobs && !st)
                            record_logprobs(g, ch, e);
                        if (hit == 1) {
                            ch->stop_hit = 1;
                            kiri_batcher_cancel(s->batcher, ch->id);
                        }
                    }
                }
                if (e->finish >= 0) {
                    ch->done = 1;
                    ch->finish = e->finish;
                    if (!ch->stop_hit && e->finish != KIRI_FINISH_ERROR) {
                        char piece[MAX_PIECE];
                        const int pn = kiri_detok_flush(&ch->ds, piece, sizeof piece);
                        const char *out;
                        size_t out_len;
                        if (pn > 0 && kiri_stopper_push(&ch->stopper, piece, (size_t)pn, &out, &out_len) == 0)
                            deliver(st, g, ch, out, out_len);
                        kiri_stopper_flush(&ch->stopper, &out, &out_len);
                        deliver(st, g, ch, out, out_len);
                    }
                    if (st)
                        stream_text(st, g, ch, "", 0, finish_reason(ch->finish, ch->stop_hit));
                }
            }
            if (st && st->broken)
                for (int j = 0; j < g->n; j++)
                    if (!g->ch[j].done)
                        kiri_batcher_cancel(s->batcher, g->ch[j].id);
        }
    }
    kiri_mem_free(batch);
}

static int handle_generate(struct kiri_server *s, struct mg_connection *c, int kind, const char *endpoint)
{
    char *body = NULL;
    size_t body_len = 0;
    int status = read_body(s, c, &body, &body_len);
    if (status)
        return status;
    struct kiri_api_limits lim = {s->n_ctx, s->model->hp.n_vocab, 1024};
    struct kiri_api_request r;
    struct kiri_api_error err;
    if (kiri_api_parse(body, body_len, kind, &lim, &r, &err) != KIRI_OK) {
        kiri_mem_free(body);
        return send_error(c, &err, "");
    }
    kiri_mem_free(body);
    if (r.model && r.model[0] && strcmp(r.model, s->model_id) != 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "the model '%.100s' does not exist here; this server has '%.100s'", r.model,
                 s->model_id);
        kiri_api_request_free(&r);
        return fail(c, 404, "invalid_request_error", "model", "model_not_found", msg, "");
    }
    int32_t *ids = NULL, n_ids = 0;
    status = build_prompt(s, c, &r, &ids, &n_ids);
    if (status) {
        kiri_api_request_free(&r);
        return status;
    }
    const int32_t max_prompt = s->cfg.max_prompt_tokens > 0 ? s->cfg.max_prompt_tokens : s->n_ctx - 1;
    if (n_ids < 1 || n_ids > max_prompt || n_ids >= s->n_ctx ||
        (r.max_tokens > 0 && (int64_t)n_ids + r.max_tokens > s->n_ctx)) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "this model's context holds %d tokens; the prompt has %d and %d more were requested", s->n_ctx,
                 n_ids, r.max_tokens > 0 ? r.max_tokens : 0);
        kiri_mem_free(ids);
        kiri_api_request_free(&r);
        return fail(c, 400, "invalid_request_error", n_ids < 1 ? "prompt" : "messages", "context_length_exceeded",
                    msg, "");
    }

    struct gen *g = kiri_mem_calloc(1, sizeof *g);
    if (!g || kiri_platform_mutex_init(&g->lock) != KIRI_OK || kiri_platform_cond_init(&g->cond) != KIRI_OK) {
        if (g) {
            kiri_platform_mutex_free(g->lock);
            kiri_mem_free(g);
        }
        kiri_mem_free(ids);
        kiri_api_request_free(&r);
        return fail(c, 500, "server_error", "", "", "out of memory", "");
    }
    g->s = s;
    g->n = r.n;
    g->n_top = r.top_logprobs;
    const uint64_t seed = r.has_seed ? r.sampling.seed : mix64(atomic_fetch_add(&s->counter, 1) ^ (uint64_t)(kiri_platform_now() * 1e9));
    struct kiri_status_info info;
    int submit_rc = KIRI_OK;
    for (int i = 0; i < g->n; i++) {
        struct choice *ch = &g->ch[i];
        ch->gen = g;
        kiri_stopper_init(&ch->stopper, (const char *const *)r.stop, r.n_stop);
        struct kiri_request req;
        memset(&req, 0, sizeof req);
        req.tokens = ids;
        req.n_tokens = n_ids;
        req.max_tokens = r.max_tokens;
        req.sampling = r.sampling;
        req.sampling.seed = seed + (uint64_t)i;
        req.priority = r.priority;
        req.logprobs = r.logprobs;
        req.top_logprobs = r.top_logprobs;
        submit_rc = kiri_batcher_submit(s->batcher, &req, on_event, ch, &ch->id, &info);
        if (submit_rc != KIRI_OK) {
            ch->done = 1;
            break;
        }
        ch->submitted = 1;
    }
    kiri_mem_free(ids);
    const double t0 = kiri_platform_now();
    if (submit_rc != KIRI_OK) {
        /* Take back what was queued, wait for their final events, answer 429/503/400. */
        for (int i = 0; i < g->n; i++)
            if (g->ch[i].submitted)
                kiri_batcher_cancel(s->batcher, g->ch[i].id);
        run_generation(s, g, &r, NULL, t0 + 60);
        for (int i = 0; i < g->n; i++)
            choice_free(g, &g->ch[i]);
        kiri_platform_cond_free(g->cond);
        kiri_platform_mutex_free(g->lock);
        kiri_mem_free(g);
        kiri_api_request_free(&r);
        if (submit_rc == KIRI_E_BUSY)
            return fail(c, atomic_load(&s->draining) ? 503 : 429, "server_error", "", "overloaded", info.message,
                        "Retry-After: 1\r\n");
        return fail(c, 400, "invalid_request_error", "", "", info.message, "");
    }

    struct stream st;
    memset(&st, 0, sizeof st);
    const uint64_t rid = atomic_fetch_add(&s->counter, 1);
    char id[48];
    snprintf(id, sizeof id, "%s-%016llx", kind == KIRI_API_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)mix64(rid ^ (uint64_t)s->created));
    const int64_t created = (int64_t)time(NULL);
    if (r.stream) {
        st.c = c;
        st.kind = kind;
        memcpy(st.id, id, sizeof st.id);
        st.created = created;
        st.model = s->model_id;
        st.raw = strcmp(mg_get_request_info(c)->http_version, "1.1") != 0;
        if (st.raw)
            mg_disable_connection_keep_alive(c);
        mg_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     "%s\r\nX-Accel-Buffering: no\r\n\r\n",
                  st.raw ? "Connection: close" : "Transfer-Encoding: chunked");
    }
    run_generation(s, g, &r, r.stream ? &st : NULL, t0 + s->cfg.request_timeout);

    struct kiri_api_usage usage = {0, 0, 0};
    usage.prompt_tokens = g->ch[0].n_prompt;
    usage.cached_tokens = g->ch[0].n_cached;
    int errors = 0;
    for (int i = 0; i < g->n; i++) {
        usage.completion_tokens += g->ch[i].n_generated;
        errors += g->ch[i].finish == KIRI_FINISH_ERROR;
    }
    kiri_metrics_tokens(s->metrics, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens);
    if (r.stream) {
        if (r.include_usage)
            stream_send(&st, kiri_api_chunk_json(kind, id, created, s->model_id, NULL, 0, 0, &usage));
        const char done[] = "data: [DONE]\n\n";
        stream_write(&st, done, sizeof done - 1);
        if (!st.broken && !st.raw && mg_send_chunk(c, "", 0) < 0)
            st.broken = 1;
        if (st.broken)
            kiri_metrics_client_disconnect(s->metrics);
        status = 200;
    } else if (errors) {
        status = fail(c, 500, "server_error", "", "", "the model failed while generating", "");
    } else {
        struct kiri_api_choice cs[KIRI_API_MAX_N];
        memset(cs, 0, sizeof cs);
        for (int i = 0; i < g->n; i++) {
            struct choice *ch = &g->ch[i];
            cs[i].index = i;
            cs[i].text = ch->text ? ch->text : "";
            cs[i].text_len = ch->text_len;
            cs[i].finish_reason = finish_reason(ch->finish, ch->stop_hit);
            if (r.logprobs) {
                cs[i].n_logprobs = ch->n_lp;
                cs[i].lp_tokens = (const char *const *)ch->lp_tok;
                cs[i].lp_token_lens = ch->lp_len;
                cs[i].lp_values = ch->lp_val;
                cs[i].n_top = g->n_top;
                cs[i].top_tokens = (const char *const *)ch->top_tok;
                cs[i].top_token_lens = ch->top_len;
                cs[i].top_values = ch->top_val;
            }
        }
        status = send_json(c, 200, kiri_api_response_json(kind, id, created, s->model_id, cs, g->n, &usage), "");
    }
    kiri_metrics_e2e(s->metrics, kiri_platform_now() - t0);
    if (s->cfg.log_prompts && r.prompt)
        fprintf(stderr, "kiri: %s prompt: %.200s\n", endpoint, r.prompt);
    for (int i = 0; i < g->n; i++)
        choice_free(g, &g->ch[i]);
    kiri_platform_cond_free(g->cond);
    kiri_platform_mutex_free(g->lock);
    kiri_mem_free(g);
    kiri_api_request_free(&r);
    return status;
}

/* ---------------------------------------------------------------------------------------------
 * Other endpoints
 * ------------------------------------------------------------------------------------------- */

static int handle_tokenize(struct kiri_server *s, struct mg_connection *c, int kind)
{
    char *body = NULL;
    size_t body_len = 0;
    int status = read_body(s, c, &body, &body_len);
    if (status)
        return status;
    struct kiri_api_limits lim = {s->n_ctx, s->model->hp.n_vocab, 1024};
    struct kiri_api_request r;
    struct kiri_api_error err;
    const int rc = kiri_api_parse(body, body_len, kind, &lim, &r, &err);
    kiri_mem_free(body);
    if (rc != KIRI_OK)
        return send_error(c, &err, "");
    if (kind == KIRI_API_TOKENIZE) {
        int32_t *ids = NULL, n = 0;
        const int add_bos = r.add_special ? kiri_tokenizer_add_bos(s->model->tokenizer) : 0;
        if (tokenize_alloc(s->model, r.content ? r.content : "", add_bos, r.parse_special, &ids, &n) != KIRI_OK)
            status = fail(c, 500, "server_error", "", "", "tokenization failed", "");
        else
            status = send_json(c, 200, kiri_api_tokens_json(ids, n), "");
        kiri_mem_free(ids);
    } else {
        char *text = NULL;
        size_t len = 0, cap = 0;
        struct kiri_detok_stream ds = {0};
        char piece[MAX_PIECE];
        int ok = 1;
        for (int32_t i = 0; i <= r.n_tokens && ok; i++) {
            const int n = i < r.n_tokens ? kiri_detok_push(s->model->tokenizer, &ds, r.tokens[i], 0, piece, sizeof piece)
                                         : kiri_detok_flush(&ds, piece, sizeof piece);
            if (n <= 0)
                continue;
            if (len + (size_t)n + 1 > cap) {
                cap = (len + (size_t)n + 1) * 2;
                char *t = kiri_mem_realloc(text, cap);
                if (!t) {
                    ok = 0;
                    break;
                }
                text = t;
            }
            memcpy(text + len, piece, (size_t)n);
            len += (size_t)n;
        }
        status = ok ? send_json(c, 200, kiri_api_content_json(text ? text : "", len), "")
                    : fail(c, 500, "server_error", "", "", "out of memory", "");
        kiri_mem_free(text);
    }
    kiri_api_request_free(&r);
    return status;
}

static int handle_metrics(struct kiri_server *s, struct mg_connection *c)
{
    struct kiri_batcher_stats st;
    memset(&st, 0, sizeof st);
    if (atomic_load(&s->ready))
        kiri_batcher_get_stats(s->batcher, &st);
    char *text = kiri_metrics_render(s->metrics, &st, s->model_id);
    if (!text)
        return fail(c, 500, "server_error", "", "", "out of memory", "");
    send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text), "");
    kiri_mem_free(text);
    return 200;
}

/* ---------------------------------------------------------------------------------------------
 * Routing
 * ------------------------------------------------------------------------------------------- */

enum route { R_CHAT, R_COMPLETIONS, R_MODELS, R_TOKENIZE, R_DETOKENIZE, R_HEALTH, R_METRICS, R_PAGE, R_NONE };

static const struct {
    const char *path;
    const char *method;
    enum route r;
} routes[] = {
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/v1/completions", "POST", R_COMPLETIONS},
    {"/v1/models", "GET", R_MODELS},
    {"/tokenize", "POST", R_TOKENIZE},
    {"/detokenize", "POST", R_DETOKENIZE},
    {"/health", "GET", R_HEALTH},
    {"/metrics", "GET", R_METRICS},
    {"/", "GET", R_PAGE},
};

/* Is v a Content-Length value as RFC 9110 spells it: digits only (trailing blanks allowed)?
 * CivetWeb reads the number with strtoll and ignores what follows, so "0x5" would be 0 and the
 * body would be parsed as the next request. */
static int valid_length(const char *v)
{
    const char *p = v;
    while (*p >= '0' && *p <= '9')
        p++;
    if (p == v)
        return 0;
    while (*p == ' ' || *p == '\t')
        p++;
    return *p == '\0';
}

/* Refuses framing that could smuggle a second request past a proxy (H12): Content-Length
 * together with Transfer-Encoding, Content-Length twice, or a Content-Length that is not a plain
 * decimal number. CivetWeb keeps only the first MG_MAX_HEADERS header lines and silently drops
 * the rest (which could be a Transfer-Encoding or an Authorization), so a request that fills the
 * table is refused too (H13). Returns 0, or the status of the refusal it sent. */
static int check_framing(struct mg_connection *c, const struct mg_request_info *ri)
{
    if (ri->num_headers >= MG_MAX_HEADERS)
        return fail(c, 431, "invalid_request_error", "", "too_many_headers", "the request has too many header lines",
                    "Connection: close\r\n");
    int n_cl = 0, n_te = 0, bad_cl = 0;
    for (int i = 0; i < ri->num_headers; i++) {
        if (same_nocase(ri->http_headers[i].name, "Content-Length")) {
            n_cl++;
            bad_cl |= !valid_length(ri->http_headers[i].value);
        }
        n_te += same_nocase(ri->http_headers[i].name, "Transfer-Encoding");
    }
    if (bad_cl)
        return fail(c, 400, "invalid_request_error", "", "bad_framing", "Content-Length must be a decimal number",
                    "Connection: close\r\n");
    if (n_cl > 1 || (n_cl && n_te))
        return fail(c, 400, "invalid_request_error", "", "bad_framing",
                    "Content-Length must appear once and not together with Transfer-Encoding", "Connection: close\r\n");
    return 0;
}

/* Is this request refused for the auth-failure rate limit? Counts a failure when failed is set. */
static int auth_limited(struct kiri_server *s, int failed)
{
    const double now = kiri_platform_now();
    const int64_t sec = (int64_t)now;
    if (sec < atomic_load(&s->auth_blocked_until))
        return 1;
    if (!failed)
        return 0;
    int64_t seen = atomic_load(&s->auth_second);
    if (seen != sec && atomic_compare_exchange_strong(&s->auth_second, &seen, sec))
        atomic_store(&s->auth_failures, 0);
    if (atomic_fetch_add(&s->auth_failures, 1) + 1 > AUTH_FAIL_LIMIT) {
        /* Blocked for the rest of this second and all of the next one. */
        atomic_store(&s->auth_blocked_until, sec + 2);
        fprintf(stderr, "kiri: more than %d API key failures in one second; refusing keyed requests for a second\n",
                AUTH_FAIL_LIMIT);
        return 1;
    }
    return 0;
}

static int handle(struct mg_connection *c, void *cbdata)
{
    struct kiri_server *s = cbdata;
    const struct mg_request_info *ri = mg_get_request_info(c);
    const double t0 = kiri_platform_now();
    /* Routes match the path exactly as sent (decode_url is off, dot segments are not removed):
     * "/v1/../health" and "/health%00" name no endpoint. */
    const char *uri = ri->local_uri_raw ? ri->local_uri_raw : ri->local_uri ? ri->local_uri : "";
    int idx = -1;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
        if (strcmp(uri, routes[i].path) == 0)
            idx = (int)i;
    const char *endpoint = idx >= 0 ? routes[idx].path : "other";
    mg_set_user_connection_data(c, NULL); /* no body read yet (the data outlives a keep-alive request) */
    int status = check_framing(c, ri);
    if (status != 0) {
        /* refused: answered by check_framing */
    } else if (idx < 0) {
        status = fail(c, 404, "invalid_request_error", "", "not_found", "no such endpoint", "");
    } else if (strcmp(ri->request_method, routes[idx].method) != 0 &&
               !(strcmp(ri->request_method, "HEAD") == 0 && strcmp(routes[idx].method, "GET") == 0)) {
        char allow[64];
        snprintf(allow, sizeof allow, "Allow: %s\r\n", routes[idx].method);
        status = fail(c, 405, "invalid_request_error", "", "method_not_allowed", "method not allowed here", allow);
    } else if (routes[idx].r == R_HEALTH) {
        status = atomic_load(&s->ready)
                     ? send_body(c, 200, "application/json", "{\"status\":\"ok\"}", 15, "")
                     : send_body(c, 503, "application/json", "{\"status\":\"loading\"}", 20, "Retry-After: 1\r\n");
    } else if (routes[idx].r == R_PAGE) {
        status = send_body(c, 200, "text/html; charset=utf-8", kiri_chat_page_html, kiri_chat_page_html_len,
                           "Content-Security-Policy: default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'\r\n");
    } else if (s->auth && auth_limited(s, 0)) {
        status = fail(c, 429, "invalid_request_error", "", "too_many_auth_failures",
                      "too many requests with a wrong API key; retry later", "Retry-After: 1\r\n");
    } else if (s->auth && !kiri_auth_check(s->auth, mg_get_header(c, "Authorization"))) {
        kiri_metrics_auth_failure(s->metrics);
        status = auth_limited(s, 1)
                     ? fail(c, 429, "invalid_request_error", "", "too_many_auth_failures",
                            "too many requests with a wrong API key; retry later", "Retry-After: 1\r\n")
                     : fail(c, 401, "invalid_request_error", "", "invalid_api_key", "a valid API key is required",
                            "WWW-Authenticate: Bearer\r\n");
    } else if (routes[idx].r == R_METRICS) {
        status = handle_metrics(s, c);
    } else if (!atomic_load(&s->ready)) {
        status = fail(c, 503, "server_error", "", "loading", "the model is loading", "Retry-After: 1\r\n");
    } else if (routes[idx].r == R_MODELS) {
        const char *ids[1] = {s->model_id};
        status = send_json(c, 200, kiri_api_models_json(ids, 1, s->created), "");
    } else if (routes[idx].r == R_TOKENIZE || routes[idx].r == R_DETOKENIZE) {
        status = handle_tokenize(s, c, routes[idx].r == R_TOKENIZE ? KIRI_API_TOKENIZE : KIRI_API_DETOKENIZE);
    } else if (atomic_load(&s->draining)) {
        status = fail(c, 503, "server_error", "", "shutting_down", "the server is shutting down", "Retry-After: 5\r\n");
    } else {
        atomic_fetch_add(&s->active, 1);
        status = handle_generate(s, c, routes[idx].r == R_CHAT ? KIRI_API_CHAT : KIRI_API_COMPLETIONS, endpoint);
        atomic_fetch_sub(&s->active, 1);
    }
    kiri_metrics_request(s->metrics, endpoint, status);
    /* One line per request; never the prompt (unless --log-prompts) nor any header. */
    fprintf(stderr, "kiri: %s %s %s %d %.3fs\n", ri->remote_addr, ri->request_method, idx >= 0 ? endpoint : "(other)",
            status, kiri_platform_now() - t0);
    return status;
}

/* Errors CivetWeb finds itself (a malformed or timed-out request line or headers, a missing or
 * unreadable Content-Length, an unsupported HTTP version) get the same JSON error body as ours, a
 * log line and a metric. CivetWeb closes these connections. */
static int http_error(struct mg_connection *c, int status, const char *msg)
{
    struct kiri_server *s = mg_get_user_data(mg_get_context(c));
    fail(c, status, "invalid_request_error", "", "", msg && msg[0] ? msg : status_text(status), "Connection: close\r\n");
    kiri_metrics_request(s->metrics, "other", status);
    fprintf(stderr, "kiri: %s malformed request %d\n", mg_get_request_info(c)->remote_addr, status);
    return 0;
}

static int log_message(const struct mg_connection *c, const char *message)
{
    (void)c;
    fprintf(stderr, "kiri: http: %s\n", message);
    return 1;
}

/* ---------------------------------------------------------------------------------------------
 * Life cycle
 * ------------------------------------------------------------------------------------------- */

static int load_model(struct kiri_server *s, struct kiri_status_info *info)
{
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.backend = s->cfg.backend[0] ? s->cfg.backend : "auto";
    mp.n_threads = s->cfg.threads;
    int rc = kiri_model_open(s->cfg.model, &mp, &s->model, info);
    if (rc != KIRI_OK)
        return rc;
    struct kiri_batcher_params bp;
    kiri_batcher_params_default(&bp);
    bp.n_ctx = s->cfg.ctx;
    bp.kv_memory = (size_t)s->cfg.kv_memory;
    bp.max_seqs = s->cfg.parallel;
    bp.chunk = s->cfg.chunk;
    bp.queue_cap = s->cfg.queue;
    bp.kv_type = strcmp(s->cfg.kv_type, "f32") == 0 ? KIRI_TYPE_F32 : strcmp(s->cfg.kv_type, "q8_0") == 0 ? KIRI_TYPE_Q8_0 : KIRI_TYPE_F16;
    if ((rc = kiri_batcher_init(s->model, &bp, &s->batcher, info)) != KIRI_OK)
        return rc;
    s->n_ctx = kiri_batcher_n_ctx(s->batcher);
    /* The chat template from the file, or ChatML when it has none. */
    struct kiri_gguf_str t = {0};
    const char *src = kiri_chat_template_chatml();
    size_t len = strlen(src);
    if (kiri_gguf_get_str(s->model->gguf, "tokenizer.chat_template", 0, &t, NULL) == KIRI_OK && t.len) {
        src = t.ptr;
        len = (size_t)t.len;
    }
    if ((rc = kiri_chat_template_init(src, len, &s->tmpl, info)) != KIRI_OK) {
        fprintf(stderr, "kiri: the model's chat template is not usable (%s); using ChatML\n", info->message);
        src = kiri_chat_template_chatml();
        if ((rc = kiri_chat_template_init(src, strlen(src), &s->tmpl, info)) != KIRI_OK)
            return rc;
    }
    const int32_t bos = kiri_tokenizer_bos(s->model->tokenizer), eos = kiri_tokenizer_eos(s->model->tokenizer);
    int n;
    if (bos >= 0 && (n = kiri_tokenizer_piece(s->model->tokenizer, bos, 1, s->bos_text, sizeof s->bos_text - 1)) > 0 &&
        (size_t)n < sizeof s->bos_text)
        s->bos_text[n] = '\0';
    else
        s->bos_text[0] = '\0';
    if (eos >= 0 && (n = kiri_tokenizer_piece(s->model->tokenizer, eos, 1, s->eos_text, sizeof s->eos_text - 1)) > 0 &&
        (size_t)n < sizeof s->eos_text)
        s->eos_text[n] = '\0';
    else
        s->eos_text[0] = '\0';
    if ((rc = kiri_batcher_start(s->batcher)) != KIRI_OK)
        return kiri_error_set(info, rc, "cannot start the batching thread");
    return KIRI_OK;
}

static int setup_tls(struct kiri_server *s, struct kiri_status_info *info)
{
    char *cert = NULL, *key = NULL;
    size_t cl = 0, kl = 0;
    int rc = kiri_platform_read_file(s->cfg.tls_cert, 1 << 20, &cert, &cl, info);
    if (rc == KIRI_OK)
        rc = kiri_platform_read_file(s->cfg.tls_key, 1 << 20, &key, &kl, info);
    if (rc == KIRI_OK) {
        /* CivetWeb's mbedTLS mode reads the certificate chain and the key from one file. */
        char *pem = kiri_mem_alloc(cl + kl + 2);
        if (!pem) {
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
        } else {
            memcpy(pem, cert, cl);
            pem[cl] = '\n';
            memcpy(pem + cl + 1, key, kl);
            rc = kiri_platform_private_temp_file(pem, cl + 1 + kl, s->tls_pem, sizeof s->tls_pem, info);
            memset(pem, 0, cl + kl + 2);
            kiri_mem_free(pem);
        }
    }
    if (key)
        memset(key, 0, kl);
    kiri_mem_free(cert);
    kiri_mem_free(key);
    return rc;
}

int kiri_server_start(const struct kiri_server_config *cfg, struct kiri_server **out, struct kiri_status_info *info)
{
    kiri_error_clear(info);
    struct kiri_server *s = kiri_mem_calloc(1, sizeof *s);
    if (!s)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    s->cfg = *cfg;
    s->created = (int64_t)time(NULL);
    const char *slash = strrchr(cfg->model, '/');
    snprintf(s->model_id, sizeof s->model_id, "%.127s", cfg->model_alias[0] ? cfg->model_alias : slash ? slash + 1 : cfg->model);
    int rc = kiri_metrics_init(&s->metrics);
    if (rc != KIRI_OK) {
        kiri_mem_free(s);
        return kiri_error_set(info, rc, "out of memory");
    }
    if (cfg->api_key_file[0] && (rc = kiri_auth_load(cfg->api_key_file, &s->auth, info)) != KIRI_OK)
        goto fail;
    const int tls = cfg->tls_cert[0] != 0;
    if (tls != (cfg->tls_key[0] != 0)) {
        rc = kiri_error_set(info, KIRI_E_INVALID_ARG, "--tls-cert and --tls-key go together");
        goto fail;
    }
    if (tls && (rc = setup_tls(s, info)) != KIRI_OK)
        goto fail;

    char ports[200], threads[16], timeout[32];
    const int v6 = strchr(cfg->host, ':') != NULL;
    snprintf(ports, sizeof ports, v6 ? "[%s]:%d%s" : "%s:%d%s", cfg->host, cfg->port, tls ? "s" : "");
    snprintf(threads, sizeof threads, "%d", cfg->http_threads);
    snprintf(timeout, sizeof timeout, "%d", (int)(cfg->idle_timeout * 1000));
    const char *options[] = {
        "listening_ports", ports,
        "num_threads", threads,
        "request_timeout_ms", timeout,
        "keep_alive_timeout_ms", "5000",
        "enable_keep_alive", "yes",
        "tcp_nodelay", "1",
        "max_request_size", "16384",
        "listen_backlog", "512",
        "connection_queue", "256",
        "decode_url", "no",
        tls ? "ssl_certificate" : NULL, tls ? s->tls_pem : NULL,
        NULL,
    };
    mg_init_library(tls ? MG_FEATURES_TLS : 0);
    struct mg_callbacks cb;
    memset(&cb, 0, sizeof cb);
    cb.log_message = log_message;
    cb.http_error = http_error;
    struct mg_init_data init = {&cb, s, options};
    struct mg_error_data errd;
    char errtext[256] = "";
    memset(&errd, 0, sizeof errd);
    errd.text = errtext;
    errd.text_buffer_size = sizeof errtext;
    s->mg = mg_start2(&init, &errd);
    if (tls) {
        kiri_platform_file_abort(-1, s->tls_pem); /* loaded: the key material leaves the disk */
        s->tls_pem[0] = '\0';
    }
    if (!s->mg) {
        rc = kiri_error_set(info, KIRI_E_IO, "cannot listen on %s: %s", ports, errtext[0] ? errtext : "unknown error");
        goto fail;
    }
    struct mg_server_port sp[4];
    const int np = mg_get_server_ports(s->mg, 4, sp);
    s->port = np > 0 ? sp[0].port : cfg->port;
    mg_set_request_handler(s->mg, "/", handle, s);
    fprintf(stderr, "kiri: listening on %s://%s:%d, loading %s\n", tls ? "https" : "http", cfg->host, s->port, cfg->model);
    if ((rc = load_model(s, info)) != KIRI_OK)
        goto fail;
    atomic_store(&s->ready, 1);
    fprintf(stderr, "kiri: serving %s (context %d, %d parallel, %s)\n", s->model_id, s->n_ctx, cfg->parallel,
            s->auth ? "API keys required" : "no API keys");
    *out = s;
    return KIRI_OK;
fail:
    kiri_server_stop(s, 0);
    return rc;
}

int kiri_server_port(const struct kiri_server *s) { return s->port; }

void kiri_server_stop(struct kiri_server *s, double grace_seconds)
{
    if (!s)
        return;
    atomic_store(&s->draining, 1);
    if (s->batcher) {
        /* Running requests finish (up to the grace period), new ones get 503. */
        const double end = kiri_platform_now() + grace_seconds;
        while (atomic_load(&s->active) > 0 && kiri_platform_now() < end)
            kiri_batcher_wait_idle(s->batcher, 0.1);
        kiri_batcher_stop(s->batcher, 0);
    }
    if (s->mg)
        mg_stop(s->mg);
    if (s->tls_pem[0])
        kiri_platform_file_abort(-1, s->tls_pem);
    kiri_batcher_free(s->batcher);
    kiri_chat_template_free(s->tmpl);
    kiri_model_close(s->model);
    kiri_auth_free(s->auth);
    kiri_metrics_free(s->metrics);
    kiri_mem_free(s);
}
