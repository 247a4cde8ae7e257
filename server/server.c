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
#include "buf.h"
#include "chat_page.h"
#include "chat_prompt.h"
#include "chat_template.h"
#include "tools.h"
#include "config.h"
#include "error.h"
#include "fleet_node.h"
#include "kiri.h"
#include "mem.h"
#include "metrics.h"
#include "models.h"
#include "openai.h"
#include "platform.h"
#include "responses.h"
#include "upstream.h"

/* Bytes of one token's text: far above any vocabulary's longest token. */
#define MAX_PIECE 1024
#define AUTH_FAIL_LIMIT 20

struct kiri_server {
    struct kiri_server_config cfg;
    struct mg_context *mg;
    int port;
    struct kiri_models *models;          /* owned: the served models (models.h) */
    struct kiri_fleet_node *fleet;       /* owned, NULL without --fleet */
    struct kiri_upstream *upstream;      /* owned; routes nothing without --upstream or a manifest's */
    _Atomic uint64_t routing_version;    /* the manifest whose routing the upstream follows, 0: flags */
    struct kiri_auth *auth;              /* owned, NULL without keys */
    struct kiri_metrics *metrics;        /* owned */
    _Atomic int ready;                   /* the model is loaded and the loop runs */
    _Atomic int draining;
    _Atomic int active;                  /* generation requests in flight */
    _Atomic uint64_t counter;
    _Atomic uint64_t n_requests, n_errors;   /* HTTP requests answered, and those answered 5xx */
    double t_start;                      /* kiri_platform_now() at start */
    /* Auth-failure rate limit: failures counted per second of kiri_platform_now(); past
     * AUTH_FAIL_LIMIT in one second every request that needs a key is answered 429 until the
     * next second ends, so keys cannot be guessed at line rate. Racy updates only blur the count. */
    _Atomic int64_t auth_second;
    _Atomic int auth_failures;
    _Atomic int64_t auth_blocked_until;
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
    case 414: return "URI Too Long";
    case 417: return "Expectation Failed";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 502: return "Bad Gateway";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
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
    /* Every answer of a generation endpoint says where it was served; the upstream's say so in extra. */
    const struct mg_request_info *ri = mg_get_request_info(c);
    const char *uri = ri->local_uri_raw ? ri->local_uri_raw : ri->local_uri;
    const int local = uri &&
                      (strcmp(uri, "/v1/completions") == 0 || strcmp(uri, "/v1/chat/completions") == 0 ||
                       strcmp(uri, "/v1/responses") == 0) &&
                      !strstr(extra, "X-Kiri-Served-By:");
    mg_printf(c,
              "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\nCache-Control: no-store\r\n%s%s%s\r\n",
              status, status_text(status), type, len, extra, !close && body_unread(c) ? "Connection: close\r\n" : "",
              local ? "X-Kiri-Served-By: local\r\n" : "");
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
    /* The buffer's limit is the body's: an append past it is the 413. */
    const size_t want = ri->content_length >= 0 ? (size_t)ri->content_length : 0;
    struct kiri_buf body;
    kiri_buf_init(&body, (size_t)cap);
    if (kiri_buf_reserve(&body, want) != KIRI_OK)
        return fail(c, 500, "server_error", "", "", "out of memory", "Connection: close\r\n");
    char chunk[8192];
    for (;;) {
        if (ri->content_length >= 0 && body.len == want)
            break;
        size_t ask = sizeof chunk;
        if (ri->content_length >= 0 && want - body.len < ask)
            ask = want - body.len;
        const int r = mg_read(c, chunk, ask);
        if (r < 0) {
            /* A broken chunked encoding or a read error: the framing is lost. */
            kiri_buf_free(&body);
            return fail(c, 400, "invalid_request_error", "", "", "the request body is malformed",
                        "Connection: close\r\n");
        }
        if (r == 0)
            break;
        const int rc = kiri_buf_append(&body, chunk, (size_t)r);
        if (rc == KIRI_E_NOMEM) {
            kiri_buf_free(&body);
            return fail(c, 500, "server_error", "", "", "out of memory", "Connection: close\r\n");
        }
        if (rc != KIRI_OK || body.len > cap) { /* (to kiri_buf a limit of 0 is none) */
            kiri_buf_free(&body);
            return fail(c, 413, "invalid_request_error", "", "body_too_large", "the request body exceeds the size limit",
                        "Connection: close\r\n");
        }
    }
    if (ri->content_length >= 0 && body.len != want) {
        kiri_buf_free(&body);
        return fail(c, 400, "invalid_request_error", "", "", "the request body ended early", "Connection: close\r\n");
    }
    mg_set_user_connection_data(c, (void *)&body_read_mark);
    if (!(*out = kiri_buf_take(&body, out_len)))
        return fail(c, 500, "server_error", "", "", "out of memory", "Connection: close\r\n");
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Generation: events from the loop thread to the HTTP thread
 * ------------------------------------------------------------------------------------------- */

struct event {
    int32_t token;
    int finish;
    size_t text_len;          /* its text, next in the choice's queued text */
    float logprob;
    int n_top;
    int32_t top_ids[KIRI_MAX_TOP_LOGPROBS];
    float top_lp[KIRI_MAX_TOP_LOGPROBS];
    int32_t n_prompt, n_cached, n_generated;
    double ttft;
};

/* One choice (n of them per prompt). Fields above `done` are shared with the loop thread under
 * gen->lock; the rest belong to the HTTP thread. */
struct choice {
    struct gen *gen;
    uint64_t id;
    int prompt;               /* index of its prompt (completions with a list of prompts) */
    int submitted;
    struct event *q;          /* owned ring of pending events */
    int q_len, q_cap;
    struct kiri_buf q_text;   /* owned: the pending events' text, in order */
    int finished;             /* final event queued */
    char grammar_error[128];  /* with the final event: the grammar bound that ended it, or "" */
    /* HTTP thread only */
    int done;                 /* final event processed */
    int started;              /* streaming: its first chunk is out (chat: the one with the role) */
    int finish;               /* enum kiri_finish */
    struct kiri_buf text;     /* owned: all delivered text (non-streaming) */
    int32_t n_prompt, n_cached, n_generated;
    double ttft, last_token_time;
    /* tool calls: the parser of this choice's output (owned; NULL without tools), how much of
     * its content and how many of its calls the stream has sent */
    struct kiri_tools_parser *tools;
    size_t content_sent;
    int calls_sent;
    /* log-probabilities (non-streaming), owned; the first n_unscored are echoed prompt tokens */
    int n_lp, lp_cap, n_unscored;
    char **lp_tok;
    size_t *lp_len;
    float *lp_val;
    char **top_tok;
    size_t *top_len;
    float *top_val;
};

struct gen {
    struct kiri_server *s;
    struct kiri_served_model *m;         /* borrowed: the request holds it (acquired) */
    struct kiri_mutex *lock;
    struct kiri_cond *cond;
    struct choice ch[KIRI_API_MAX_CHOICES];
    int n;                               /* choices: prompts times the request's n */
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
    const int text_ok = kiri_buf_append(&ch->q_text, ev->text, ev->text_len) == KIRI_OK;
    if (!text_ok && ev->finish < 0) {
        kiri_platform_mutex_unlock(g->lock);
        return 1; /* out of memory: end this choice */
    }
    struct event *e = &ch->q[ch->q_len++];
    e->token = ev->token;
    e->finish = ev->finish;
    e->text_len = text_ok ? ev->text_len : 0;
    e->logprob = ev->logprob;
    e->n_top = ev->n_top;
    memcpy(e->top_ids, ev->top_ids, sizeof e->top_ids);
    memcpy(e->top_lp, ev->top_logprobs, sizeof e->top_lp);
    e->n_prompt = ev->n_prompt;
    e->n_cached = ev->n_cached;
    e->n_generated = ev->n_generated;
    e->ttft = ev->first_token_seconds;
    if (ev->finish >= 0) {
        ch->finished = 1;
        if (ev->finish == KIRI_FINISH_ERROR && ev->status == KIRI_E_UNSUPPORTED && ev->error)
            snprintf(ch->grammar_error, sizeof ch->grammar_error, "%s", ev->error);
    }
    kiri_platform_cond_broadcast(g->cond);
    kiri_platform_mutex_unlock(g->lock);
    return 0;
}

static char *piece_dup(const struct kiri_model *m, int32_t id, size_t *len)
{
    char buf[MAX_PIECE];
    int n = kiri_token_to_piece(m, id, 1, buf, sizeof buf);
    if (n < 0 || (size_t)n > sizeof buf)
        n = 0;
    *len = (size_t)n;
    return kiri_mem_strndup(buf, (size_t)n);
}

static int record_logprobs(struct gen *g, struct choice *ch, const struct event *e)
{
    const struct kiri_model *m = g->m->model;
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
    kiri_tools_parser_free(ch->tools);
    kiri_mem_free(ch->q);
    kiri_buf_free(&ch->q_text);
    kiri_buf_free(&ch->text);
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

/* The request field a grammar came from: tools, the grammar extension, or the output format. */
static const char *grammar_param(int kind, const struct kiri_api_request *r, int with_tools)
{
    if (with_tools)
        return "tools";
    if (r->format == KIRI_API_FORMAT_GRAMMAR)
        return "grammar";
    return kind == KIRI_API_RESPONSES ? "text.format" : "response_format";
}

/* The first choice a grammar bound ended, or NULL. */
static const struct choice *grammar_failure(const struct gen *g)
{
    for (int i = 0; i < g->n; i++)
        if (g->ch[i].finish == KIRI_FINISH_ERROR && g->ch[i].grammar_error[0])
            return &g->ch[i];
    return NULL;
}

static const char *finish_reason(int finish)
{
    if (finish == KIRI_FINISH_EOS || finish == KIRI_FINISH_STOP)
        return "stop";
    return "length";
}

/* A choice's finish reason: "tool_calls" when it ended by itself after calling tools. */
static const char *choice_finish(const struct choice *ch)
{
    const char *why = finish_reason(ch->finish);
    if (ch->tools && kiri_tools_parser_n_calls(ch->tools) > 0 && strcmp(why, "stop") == 0)
        return "tool_calls";
    return why;
}

/* ---------------------------------------------------------------------------------------------
 * Streaming
 * ------------------------------------------------------------------------------------------- */

struct stream {
    struct mg_connection *c;
    int kind;
    struct kiri_api_envelope env;         /* strings borrowed from generate's frame */
    struct kiri_responses_state *resp;    /* /v1/responses: its events instead of chunks; borrowed */
    int64_t seq;                          /* the next event's sequence_number */
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

/* An event of the Responses API's stream: "event: type" and its data (json, consumed). */
static void stream_typed(struct stream *st, const char *type, char *json)
{
    if (json) {
        stream_write(st, "event: ", 7);
        stream_write(st, type, strlen(type));
        stream_write(st, "\n", 1);
    }
    stream_send(st, json);
}

static void stream_event(struct stream *st, int event, const char *delta, size_t len)
{
    const char *type = "error";
    char *json = kiri_responses_event_json(event, st->seq++, st->resp, delta, len, &type);
    stream_typed(st, type, json);
}

static void stream_text(struct stream *st, struct gen *g, struct choice *ch, const char *text, size_t len,
                        const char *finish)
{
    if (st->resp) {
        if (len && st->resp->no_message) {
            /* With tools the message item opens at its first text, after the calls before it. */
            st->resp->no_message = 0;
            st->resp->message_index = st->resp->n_calls;
            stream_event(st, KIRI_RESPONSES_EV_ITEM_ADDED, NULL, 0);
            stream_event(st, KIRI_RESPONSES_EV_PART_ADDED, NULL, 0);
        }
        if (len)
            stream_event(st, KIRI_RESPONSES_EV_TEXT_DELTA, text, len);
        return;
    }
    struct kiri_api_choice c;
    memset(&c, 0, sizeof c);
    c.index = (int)(ch - g->ch);
    c.text = text;
    c.text_len = len;
    c.finish_reason = finish;
    stream_send(st, kiri_api_chunk_json(st->kind, &st->env, &c, 1, !ch->started, NULL));
    ch->started = 1;
}

/* A Responses stream's events for call k, which the parser has just completed. */
static void stream_call_events(struct stream *st, const struct choice *ch, int k)
{
    st->resp->calls = kiri_tools_parser_call(ch->tools, 0);
    st->resp->n_calls = k + 1;
    for (int ev = KIRI_RESPONSES_EV_CALL_ADDED; ev <= KIRI_RESPONSES_EV_CALL_DONE; ev++) {
        const char *type = "error";
        char *json = kiri_responses_call_event_json(ev, st->seq++, st->resp, k, &type);
        stream_typed(st, type, json);
    }
}

/* Streams what a choice's tool parser has decided since the last time: new content, then each new
 * call as OpenAI streams one (a chunk with its id, type and name, then its arguments; for
 * /v1/responses the call item's events). */
static void stream_tools(struct stream *st, struct gen *g, struct choice *ch)
{
    size_t len;
    const char *content = kiri_tools_parser_content(ch->tools, &len);
    if (len > ch->content_sent) {
        stream_text(st, g, ch, content + ch->content_sent, len - ch->content_sent, NULL);
        ch->content_sent = len;
    }
    for (; ch->calls_sent < kiri_tools_parser_n_calls(ch->tools); ch->calls_sent++) {
        if (st->resp) {
            stream_call_events(st, ch, ch->calls_sent);
            continue;
        }
        const struct kiri_tool_call *tc = kiri_tools_parser_call(ch->tools, ch->calls_sent);
        struct kiri_api_choice c;
        memset(&c, 0, sizeof c);
        c.index = (int)(ch - g->ch);
        c.delta_call = tc;
        c.delta_call_index = ch->calls_sent;
        c.delta_call_head = 1;
        stream_send(st, kiri_api_chunk_json(st->kind, &st->env, &c, 1, !ch->started, NULL));
        ch->started = 1;
        c.delta_call_head = 0;
        c.delta_args = tc->arguments;
        c.delta_args_len = strlen(tc->arguments);
        stream_send(st, kiri_api_chunk_json(st->kind, &st->env, &c, 1, 0, NULL));
    }
}

/* ---------------------------------------------------------------------------------------------
 * The generation endpoints
 * ------------------------------------------------------------------------------------------- */

static int tokenize_alloc(const struct kiri_model *m, const char *text, int add_bos, int parse_special,
                          int32_t **ids, int32_t *n)
{
    const size_t len = strlen(text);
    const int need = kiri_tokenize(m, text, len, add_bos, parse_special, NULL, 0);
    if (need < 0)
        return need;
    *ids = kiri_mem_array((size_t)need + 1, sizeof **ids);
    if (!*ids)
        return KIRI_E_NOMEM;
    *n = kiri_tokenize(m, text, len, add_bos, parse_special, *ids, need);
    return KIRI_OK;
}

/* The tool-call syntax of a model's chat template (GENERIC when the file has none). */
static int tool_format(const struct kiri_served_model *sm)
{
    const char *t = NULL;
    size_t len = 0;
    if (kiri_chat_prompt_fallback(sm->chat) ||
        kiri_model_meta_str(sm->model, "tokenizer.chat_template", &t, &len) != KIRI_OK)
        return KIRI_TOOLS_GENERIC;   /* no template of its own, or ChatML stands in for it */
    return kiri_tools_detect(t, len);
}

/* Renders a conversation with tools or tool calls: the template sees them as transformers passes
 * them, or, for a template without tool syntax, as the generic format's messages. */
static int render_with_tools(const struct kiri_served_model *sm, const struct kiri_api_request *r, char **text,
                             size_t *text_len, struct kiri_status_info *info)
{
    if (tool_format(sm) != KIRI_TOOLS_GENERIC)
        return kiri_chat_prompt_render_json(sm->chat, r->messages_json, r->messages_json_len, r->tools,
                                            r->tools_len, 1, text, text_len, info);
    char *msgs = NULL;
    size_t len = 0;
    int rc = kiri_tools_generic_messages(r->messages_json, r->messages_json_len, r->tools, r->tools_len,
                                         r->tool_choice, r->tool_choice_name, r->parallel_tool_calls, &msgs, &len,
                                         info);
    if (rc == KIRI_OK)
        rc = kiri_chat_prompt_render_json(sm->chat, msgs, len, NULL, 0, 1, text, text_len, info);
    kiri_mem_free(msgs);
    return rc;
}

/* One prompt's token ids, and what echo writes before each of its choices. */
struct prompt {
    int32_t *ids;             /* owned */
    int32_t n;
    int32_t n_added;          /* leading tokens kiri put in (a BOS), not part of what is echoed */
    char *echo;               /* owned: the prompt's text, with echo only */
    size_t echo_len;
};

static void prompts_free(struct prompt *p, int n)
{
    for (int i = 0; i < n; i++) {
        kiri_mem_free(p[i].ids);
        kiri_mem_free(p[i].echo);
    }
}

/* Prompt i of /v1/completions: its ids, and its text for echo (the text as sent, or the ids'). */
static int completion_prompt(const struct kiri_served_model *sm, struct mg_connection *c,
                             const struct kiri_api_request *r, int i, struct prompt *p)
{
    const struct kiri_model *m = sm->model;
    const struct kiri_api_prompt *in = &r->prompts[i];
    if (in->tokens) {
        p->ids = kiri_mem_array((size_t)in->n_tokens + 1, sizeof *p->ids);
        if (!p->ids)
            return fail(c, 500, "server_error", "", "", "out of memory", "");
        memcpy(p->ids, in->tokens, (size_t)in->n_tokens * sizeof *p->ids);
        p->n = in->n_tokens;
    } else {
        const int add_bos = kiri_model_add_bos(m);
        if (tokenize_alloc(m, in->text ? in->text : "", add_bos, 1, &p->ids, &p->n) != KIRI_OK)
            return fail(c, 500, "server_error", "", "", "tokenization failed", "");
        p->n_added = add_bos && p->n > 0 && p->ids[0] == kiri_model_bos(m);
    }
    if (!r->echo)
        return 0;
    if (in->text) {
        p->echo_len = strlen(in->text);
        p->echo = kiri_mem_strndup(in->text, p->echo_len);
    } else {
        const int64_t need = kiri_detokenize(m, p->ids, p->n, NULL, 0);
        p->echo = need >= 0 ? kiri_mem_alloc((size_t)need + 1) : NULL;
        if (p->echo && kiri_detokenize(m, p->ids, p->n, p->echo, (size_t)need) == need) {
            p->echo[need] = '\0';
            p->echo_len = (size_t)need;
        } else {
            kiri_mem_free(p->echo);
            p->echo = NULL;
        }
    }
    return p->echo ? 0 : fail(c, 500, "server_error", "", "", "out of memory", "");
}

/* The prompt of a chat or responses request: its messages through the model's chat template. */
static int chat_prompt(const struct kiri_served_model *sm, struct mg_connection *c, const struct kiri_api_request *r,
                       struct prompt *p)
{
    char *text = NULL;
    size_t text_len = 0;
    struct kiri_status_info info;
    int rc;
    if (r->messages_json) {
        rc = render_with_tools(sm, r, &text, &text_len, &info);
    } else {
        struct kiri_chat_message *msgs = kiri_mem_calloc((size_t)r->n_messages, sizeof *msgs);
        if (!msgs)
            return fail(c, 500, "server_error", "", "", "out of memory", "");
        for (int i = 0; i < r->n_messages; i++) {
            msgs[i].role = r->messages[i].role;
            msgs[i].content = r->messages[i].content ? r->messages[i].content : "";
        }
        rc = kiri_chat_prompt_render(sm->chat, msgs, r->n_messages, 1, &text, &text_len, &info);
        kiri_mem_free(msgs);
    }
    if (rc != KIRI_OK)
        return fail(c, 400, "invalid_request_error", r->kind == KIRI_API_RESPONSES ? "input" : "messages",
                    "chat_template_error", info.message, "");
    const int trc = kiri_chat_prompt_tokenize(sm->chat, text, text_len, &p->ids, &p->n, &info);
    kiri_mem_free(text);
    if (trc != KIRI_OK)
        return fail(c, 500, "server_error", "", "", "tokenization failed", "");
    return 0;
}

/* The prompts of a parsed request, each checked against the context; or an error response
 * already sent (returns its status, with nothing left to free). */
static int build_prompts(const struct kiri_server *s, const struct kiri_served_model *sm, struct mg_connection *c,
                         const struct kiri_api_request *r, struct prompt *out, int *n_out)
{
    const int n = r->kind == KIRI_API_COMPLETIONS ? r->n_prompts : 1;
    const int32_t max_prompt = s->cfg.max_prompt_tokens > 0 ? s->cfg.max_prompt_tokens : sm->n_ctx - 1;
    for (int i = 0; i < n; i++) {
        struct prompt *p = &out[i];
        memset(p, 0, sizeof *p);
        int status = r->kind == KIRI_API_COMPLETIONS ? completion_prompt(sm, c, r, i, p) : chat_prompt(sm, c, r, p);
        if (!status && (p->n < 1 || p->n > max_prompt || p->n >= sm->n_ctx ||
                        (r->max_tokens > 0 && (int64_t)p->n + r->max_tokens > sm->n_ctx))) {
            char msg[200], param[32];
            snprintf(msg, sizeof msg,
                     "this model's context holds %d tokens; the prompt has %d and %d more were requested",
                     sm->n_ctx, p->n, r->max_tokens > 0 ? r->max_tokens : 0);
            snprintf(param, sizeof param, "%s",
                     r->kind == KIRI_API_CHAT ? "messages" : r->kind == KIRI_API_RESPONSES ? "input" : "prompt");
            if (r->kind == KIRI_API_COMPLETIONS && n > 1)
                snprintf(param, sizeof param, "prompt[%d]", i);
            status = fail(c, 400, "invalid_request_error", param, "context_length_exceeded", msg, "");
        }
        if (status) {
            prompts_free(out, i + 1); /* prompt i may hold part of what it needed */
            return status;
        }
    }
    *n_out = n;
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
    if (ch->tools) {
        /* Out of memory here loses text; the parser's content then stops growing. */
        kiri_tools_parser_feed(ch->tools, text, len);
        if (st)
            stream_tools(st, g, ch);
        return;
    }
    if (st)
        stream_text(st, g, ch, text, len, NULL);
    if (!st || st->resp) /* the Responses stream ends with the whole text */
        kiri_buf_append(&ch->text, text, len);
}

/* One event of a choice, with its text, on the HTTP thread. */
static void handle_event(struct kiri_server *s, struct gen *g, struct choice *ch, const struct kiri_api_request *r,
                         struct stream *st, const struct event *e, const char *text)
{
    ch->n_prompt = e->n_prompt;
    ch->n_cached = e->n_cached;
    if (e->token >= 0) {
        const double now = kiri_platform_now();
        if (ch->n_generated == 0)
            kiri_metrics_ttft(s->metrics, e->ttft);
        else
            kiri_metrics_inter_token(s->metrics, now - ch->last_token_time);
        ch->last_token_time = now;
        ch->n_generated = e->n_generated;
    }
    deliver(st, g, ch, text, e->text_len);
    if (e->token >= 0 && r->logprobs && !st && !kiri_model_is_eog(g->m->model, e->token))
        record_logprobs(g, ch, e);
    if (e->finish >= 0) {
        ch->done = 1;
        ch->finish = e->finish;
        if (ch->tools) {
            kiri_tools_parser_finish(ch->tools);
            if (st)
                stream_tools(st, g, ch);
        }
        /* A choice that failed gets no finish reason: the stream's error event says why. */
        if (st && ch->finish != KIRI_FINISH_ERROR)
            stream_text(st, g, ch, "", 0, choice_finish(ch));
    }
}

/* Processes queued events of every choice; returns when all choices are done. */
static void run_generation(struct kiri_server *s, struct gen *g, const struct kiri_api_request *r, struct stream *st,
                           double deadline)
{
    struct kiri_batcher *batcher = g->m->batcher;
    struct event *batch = NULL;
    int batch_cap = 0;
    struct kiri_buf text = {0};
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
                    kiri_batcher_cancel(batcher, g->ch[i].id);

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
            /* All queued events with their text, or none (out of memory: try again later). */
            const int take = n_ev <= batch_cap ? n_ev : 0;
            if (take) {
                memcpy(batch, ch->q, (size_t)take * sizeof *batch);
                ch->q_len = 0;
                const struct kiri_buf t = text;
                text = ch->q_text;
                ch->q_text = t;
                kiri_buf_clear(&ch->q_text);
            }
            kiri_platform_mutex_unlock(g->lock);

            size_t at = 0;
            for (int k = 0; k < take && !ch->done; k++) {
                handle_event(s, g, ch, r, st, &batch[k], text.data ? text.data + at : "");
                at += batch[k].text_len;
            }
            if (st && st->broken)
                for (int j = 0; j < g->n; j++)
                    if (!g->ch[j].done)
                        kiri_batcher_cancel(batcher, g->ch[j].id);
        }
    }
    kiri_buf_free(&text);
    kiri_mem_free(batch);
}

/* Answers a request for a model that cannot be had: 404 for a name not served here, 503 with
 * Retry-After while it loads or cannot load. Returns the status sent. */
static int model_error(struct kiri_server *s, struct mg_connection *c, const char *name, int rc,
                       const struct kiri_status_info *info)
{
    if (rc == KIRI_E_INVALID_ARG && strcmp(info->field, "model") == 0) {
        char have[256] = "", msg[420];
        char ids[4][KIRI_MODELS_ID_MAX];
        const int n = kiri_models_list(s->models, ids, 4);
        size_t at = 0;
        for (int i = 0; i < n && at < sizeof have; i++)
            at += (size_t)snprintf(have + at, sizeof have - at, "%s'%.60s'", i ? ", " : "", ids[i]);
        if (!name || !name[0])
            snprintf(msg, sizeof msg, "no model is installed here yet");
        else
            snprintf(msg, sizeof msg, "the model '%.100s' does not exist here; this server has %s%s", name,
                     n ? have : "none", n == 4 ? ", ..." : "");
        return fail(c, name && name[0] ? 404 : 503, "invalid_request_error", "model", "model_not_found", msg,
                    name && name[0] ? "" : "Retry-After: 5\r\n");
    }
    if (rc == KIRI_E_BUSY)
        return fail(c, 503, "server_error", "model", "model_loading", info->message, "Retry-After: 1\r\n");
    char msg[sizeof info->message + 40];
    snprintf(msg, sizeof msg, "the model cannot be loaded: %s", info->message);
    return fail(c, 503, "server_error", "model", "model_unavailable", msg, "Retry-After: 5\r\n");
}

/* kiri_api_parse, or for /v1/responses its reader. */
static int parse_body(const char *body, size_t len, int kind, const struct kiri_api_limits *lim,
                      struct kiri_api_request *r, struct kiri_api_error *err)
{
    if (kind == KIRI_API_RESPONSES)
        return kiri_responses_parse(body, len, lim, r, err);
    return kiri_api_parse(body, len, kind, lim, r, err);
}

/* Holds the model a request names (NULL or absent: the default) for the request's whole life, so
 * a hot-swap or an unload never frees it under the request, and parses the body (owned,
 * freed here) into *r. It is parsed first with limits any model accepts, to read the name; a
 * request that keeps within the model's own limits parses the same under them, so only one
 * outside them is parsed again, for the model's exact error. Returns 0 with *out and *r set (the
 * caller frees r with kiri_api_request_free), or the status of the answer sent. */
static int acquire_for(struct kiri_server *s, struct mg_connection *c, char *body, size_t body_len, int kind,
                       struct kiri_served_model **out, struct kiri_api_request *r)
{
    const struct kiri_api_limits loose = {0, INT32_MAX, 1024};
    struct kiri_api_error err;
    if (parse_body(body, body_len, kind, &loose, r, &err) != KIRI_OK) {
        kiri_mem_free(body);
        return send_error(c, &err, "");
    }
    struct kiri_status_info info;
    const int rc = kiri_models_acquire(s->models, r->model, out, &info);
    int status = rc == KIRI_OK ? 0 : model_error(s, c, r->model, rc, &info);
    if (!status) {
        const struct kiri_api_limits lim = {(*out)->n_ctx, kiri_model_n_vocab((*out)->model), 1024};
        if (!kiri_api_within_limits(r, &lim)) {
            kiri_api_request_free(r);
            if (parse_body(body, body_len, kind, &lim, r, &err) != KIRI_OK)
                status = send_error(c, &err, "");
        }
        if (status)
            kiri_models_release(s->models, *out);
    }
    if (status)
        kiri_api_request_free(r);
    kiri_mem_free(body);
    return status;
}

/* Frees a request's choices and its event queue (every final event has arrived). */
static void gen_free(struct gen *g)
{
    for (int i = 0; i < g->n; i++)
        choice_free(g, &g->ch[i]);
    kiri_platform_cond_free(g->cond);
    kiri_platform_mutex_free(g->lock);
    kiri_mem_free(g);
}

/* Echo: the prompt's text first in each of its choices, and with logprobs its tokens, whose
 * log-probabilities the batching loop does not compute (written as null). */
static void echo_prompts(struct gen *g, const struct kiri_api_request *r, const struct prompt *prompts,
                         struct stream *st)
{
    if (!r->echo)
        return;
    for (int i = 0; i < g->n; i++) {
        struct choice *ch = &g->ch[i];
        const struct prompt *p = &prompts[ch->prompt];
        if (st) {
            if (p->echo_len)
                stream_text(st, g, ch, p->echo, p->echo_len, NULL);
            continue;
        }
        kiri_buf_append(&ch->text, p->echo, p->echo_len);
        if (!r->logprobs)
            continue;
        for (int32_t k = p->n_added; k < p->n; k++) {
            struct event e;
            memset(&e, 0, sizeof e);
            e.token = p->ids[k];
            if (record_logprobs(g, ch, &e) != 0)
                break;
        }
        ch->n_unscored = ch->n_lp;
    }
}

/* The Responses API's status for how its one choice ended. */
static int responses_status(int finish)
{
    if (finish == KIRI_FINISH_EOS || finish == KIRI_FINISH_STOP)
        return KIRI_RESPONSES_COMPLETED;
    return finish == KIRI_FINISH_ERROR ? KIRI_RESPONSES_FAILED : KIRI_RESPONSES_INCOMPLETE;
}

/* The non-streamed answer of a chat or completions request. */
static int send_choices(struct mg_connection *c, struct gen *g, const struct kiri_api_request *r, int kind,
                        const struct kiri_api_envelope *env, const struct kiri_api_usage *usage)
{
    struct kiri_api_choice *cs = kiri_mem_calloc((size_t)g->n, sizeof *cs);
    if (!cs)
        return fail(c, 500, "server_error", "", "", "out of memory", "");
    for (int i = 0; i < g->n; i++) {
        struct choice *ch = &g->ch[i];
        cs[i].index = i; /* OpenAI's numbering: prompt index * n + j */
        cs[i].text = ch->text.data ? ch->text.data : "";
        cs[i].text_len = ch->text.len;
        if (ch->tools) {
            cs[i].text = kiri_tools_parser_content(ch->tools, &cs[i].text_len);
            cs[i].n_tool_calls = kiri_tools_parser_n_calls(ch->tools);
            cs[i].tool_calls = kiri_tools_parser_call(ch->tools, 0);
        }
        cs[i].finish_reason = choice_finish(ch);
        if (r->logprobs) {
            cs[i].n_logprobs = ch->n_lp;
            cs[i].n_unscored = ch->n_unscored;
            cs[i].lp_tokens = (const char *const *)ch->lp_tok;
            cs[i].lp_token_lens = ch->lp_len;
            cs[i].lp_values = ch->lp_val;
            cs[i].n_top = g->n_top;
            cs[i].top_tokens = (const char *const *)ch->top_tok;
            cs[i].top_token_lens = ch->top_len;
            cs[i].top_values = ch->top_val;
        }
    }
    const int status = send_json(c, 200, kiri_api_response_json(kind, env, cs, g->n, usage), "");
    kiri_mem_free(cs);
    return status;
}

/* One generation request on the model sm it holds; r (parsed by acquire_for) is freed here. */
static int generate(struct kiri_server *s, struct kiri_served_model *sm, struct mg_connection *c, int kind,
                    const char *endpoint, struct kiri_api_request *parsed)
{
    struct kiri_api_request r = *parsed; /* owned from here */
    struct prompt prompts[KIRI_API_MAX_PROMPTS];
    int n_prompts = 0;
    int status = build_prompts(s, sm, c, &r, prompts, &n_prompts);
    if (status) {
        kiri_api_request_free(&r);
        return status;
    }

    struct gen *g = kiri_mem_calloc(1, sizeof *g);
    if (!g || kiri_platform_mutex_init(&g->lock) != KIRI_OK || kiri_platform_cond_init(&g->cond) != KIRI_OK) {
        if (g) {
            kiri_platform_mutex_free(g->lock);
            kiri_mem_free(g);
        }
        prompts_free(prompts, n_prompts);
        kiri_api_request_free(&r);
        return fail(c, 500, "server_error", "", "", "out of memory", "");
    }
    g->s = s;
    g->m = sm;
    g->n = n_prompts * r.n; /* at most KIRI_API_MAX_CHOICES (kiri_api_parse) */
    g->n_top = r.top_logprobs;
    /* Tool calls: the grammar that keeps them parseable, and a parser per choice. */
    struct kiri_tools_plan plan;
    memset(&plan, 0, sizeof plan);
    const int format = tool_format(sm);
    if (r.tools && r.tool_choice != KIRI_TOOL_CHOICE_NONE && r.grammar) {
        /* Tool calls and a response format would each constrain the whole output. */
        gen_free(g);
        prompts_free(prompts, n_prompts);
        kiri_api_request_free(&r);
        return fail(c, 400, "invalid_request_error", "tools", "conflicting_parameters",
                    "tools and a response_format, grammar or json_schema both constrain the output; send one of "
                    "them (or tool_choice \"none\")", "");
    }
    if (r.tools && r.tool_choice != KIRI_TOOL_CHOICE_NONE) {
        struct kiri_status_info pinfo;
        int prc = kiri_tools_plan_init(format, r.tools, r.tools_len, r.tool_choice, r.tool_choice_name,
                                       r.parallel_tool_calls, r.messages_json, r.messages_json_len, &plan, &pinfo);
        for (int i = 0; prc == KIRI_OK && i < g->n; i++)
            prc = kiri_tools_parser_init(format, r.parallel_tool_calls,
                                         mix64(atomic_fetch_add(&s->counter, 1) ^ (uint64_t)s->created), &g->ch[i].tools);
        if (prc != KIRI_OK) {
            char param[sizeof pinfo.field];
            memcpy(param, pinfo.field, sizeof param);
            if (kind == KIRI_API_RESPONSES)
                kiri_responses_param(param);
            kiri_tools_plan_free(&plan);
            gen_free(g);
            prompts_free(prompts, n_prompts);
            kiri_api_request_free(&r);
            if (prc == KIRI_E_NOMEM)
                return fail(c, 500, "server_error", "", "", "out of memory", "");
            return fail(c, 400, "invalid_request_error", param, "invalid_tool_schema", pinfo.message, "");
        }
    }
    const uint64_t seed = r.has_seed ? r.sampling.seed : mix64(atomic_fetch_add(&s->counter, 1) ^ (uint64_t)(kiri_platform_now() * 1e9));
    struct kiri_status_info info;
    int submit_rc = KIRI_OK;
    for (int i = 0; i < g->n; i++) {
        struct choice *ch = &g->ch[i];
        ch->gen = g;
        ch->prompt = i / r.n;
        struct kiri_request req;
        memset(&req, 0, sizeof req);
        req.tokens = prompts[ch->prompt].ids;
        req.n_tokens = prompts[ch->prompt].n;
        req.max_tokens = r.max_tokens;
        req.sampling = r.sampling;
        req.sampling.seed = seed + (uint64_t)i;
        req.stop = (const char *const *)r.stop;
        req.n_stop = r.n_stop;
        req.priority = r.priority;
        req.logprobs = r.logprobs;
        req.top_logprobs = r.top_logprobs;
        req.grammar = plan.grammar ? plan.grammar : r.grammar;
        req.grammar_len = plan.grammar ? plan.grammar_len : r.grammar_len;
        req.grammar_triggers = (const char *const *)plan.triggers;
        req.n_grammar_triggers = plan.n_triggers;
        req.bias_tokens = r.bias_tokens;
        req.bias_values = r.bias_values;
        req.n_bias = r.n_bias;
        req.speculative = r.speculative >= 0 ? r.speculative : kiri_spec_parse(s->cfg.spec);
        req.spec_max = r.spec_max ? r.spec_max : s->cfg.spec_max;
        if (req.speculative < 0)
            req.speculative = KIRI_SPEC_NONE;
        submit_rc = kiri_batcher_submit(sm->batcher, &req, on_event, ch, &ch->id, &info);
        if (submit_rc != KIRI_OK) {
            ch->done = 1;
            break;
        }
        ch->submitted = 1;
    }
    kiri_tools_plan_free(&plan); /* the batcher copied what it needs at submit */
    const double t0 = kiri_platform_now();
    if (submit_rc != KIRI_OK) {
        /* Take back what was queued, wait for their final events, answer 429/503/400. */
        for (int i = 0; i < g->n; i++)
            if (g->ch[i].submitted)
                kiri_batcher_cancel(sm->batcher, g->ch[i].id);
            else
                g->ch[i].done = 1;
        run_generation(s, g, &r, NULL, t0 + 60);
        gen_free(g);
        prompts_free(prompts, n_prompts);
        /* The engine refused the grammar (or another part of the request) at submit: name the
         * field the grammar came from. */
        char param[sizeof info.field];
        snprintf(param, sizeof param, "%s",
                 strcmp(info.field, "grammar") == 0 ? grammar_param(kind, &r, 0) : info.field);
        kiri_api_request_free(&r);
        if (submit_rc == KIRI_E_BUSY)
            return fail(c, atomic_load(&s->draining) ? 503 : 429, "server_error", "", "overloaded", info.message,
                        "Retry-After: 1\r\n");
        return fail(c, 400, "invalid_request_error", param, "", info.message, "");
    }

    struct stream st;
    memset(&st, 0, sizeof st);
    const uint64_t rid = atomic_fetch_add(&s->counter, 1);
    char id[48], item_id[48], fingerprint[20];
    const unsigned long long hid = (unsigned long long)mix64(rid ^ (uint64_t)s->created);
    snprintf(id, sizeof id, "%s%016llx",
             kind == KIRI_API_CHAT ? "chatcmpl-" : kind == KIRI_API_RESPONSES ? "resp_" : "cmpl-", hid);
    snprintf(item_id, sizeof item_id, "msg_%016llx", hid);
    kiri_api_fingerprint(sm->backend, sm->id, sm->sha256_hex, fingerprint);
    const int64_t created = (int64_t)time(NULL);
    const struct kiri_api_envelope env = {id, created, sm->id, fingerprint};
    struct kiri_responses_state rs;
    memset(&rs, 0, sizeof rs);
    rs.id = id;
    rs.item_id = item_id;
    rs.created = created;
    rs.model = sm->id;
    rs.r = &r;
    rs.status = KIRI_RESPONSES_IN_PROGRESS;
    if (r.stream) {
        st.c = c;
        st.kind = kind;
        st.env = env;
        st.resp = kind == KIRI_API_RESPONSES ? &rs : NULL;
        st.raw = strcmp(mg_get_request_info(c)->http_version, "1.1") != 0;
        if (st.raw)
            mg_disable_connection_keep_alive(c);
        mg_printf(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                     "%s\r\nX-Accel-Buffering: no\r\nX-Kiri-Served-By: local\r\n\r\n",
                  st.raw ? "Connection: close" : "Transfer-Encoding: chunked");
        /* With tools the message item waits for text (stream_text). */
        rs.no_message = g->ch[0].tools != NULL;
        if (st.resp)
            for (int ev = KIRI_RESPONSES_EV_CREATED; ev <= (rs.no_message ? KIRI_RESPONSES_EV_IN_PROGRESS
                                                                           : KIRI_RESPONSES_EV_PART_ADDED); ev++)
                stream_event(&st, ev, NULL, 0);
    }
    echo_prompts(g, &r, prompts, r.stream ? &st : NULL);
    run_generation(s, g, &r, r.stream ? &st : NULL, t0 + s->cfg.request_timeout);

    /* Usage: each prompt counted once (its first choice's figures), every choice's tokens. */
    struct kiri_api_usage usage = {0, 0, 0};
    int errors = 0;
    for (int i = 0; i < g->n; i++) {
        if (i % r.n == 0) {
            usage.prompt_tokens += g->ch[i].n_prompt;
            usage.cached_tokens += g->ch[i].n_cached;
        }
        usage.completion_tokens += g->ch[i].n_generated;
        errors += g->ch[i].finish == KIRI_FINISH_ERROR;
    }
    kiri_metrics_tokens(s->metrics, usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens);
    /* A grammar too ambiguous for the matcher ended a choice: the request's grammar is at fault. */
    const struct choice *gfail = grammar_failure(g);
    struct kiri_api_error gerr;
    if (gfail)
        kiri_api_error_set(&gerr, 400, "invalid_request_error", grammar_param(kind, &r, g->ch[0].tools != NULL),
                           "unsupported_grammar", "%s", gfail->grammar_error);
    else if (errors)
        kiri_api_error_set(&gerr, 500, "server_error", "", "", "the model failed while generating");
    rs.status = responses_status(g->ch[0].finish);
    rs.grammar_error =
        g->ch[0].finish == KIRI_FINISH_ERROR && g->ch[0].grammar_error[0] ? g->ch[0].grammar_error : NULL;
    rs.text = g->ch[0].text.data ? g->ch[0].text.data : "";
    rs.text_len = g->ch[0].text.len;
    if (g->ch[0].tools) {
        rs.text = kiri_tools_parser_content(g->ch[0].tools, &rs.text_len);
        rs.calls = kiri_tools_parser_call(g->ch[0].tools, 0);
        rs.n_calls = kiri_tools_parser_n_calls(g->ch[0].tools);
        if (!r.stream)
            rs.no_message = rs.text_len == 0 && rs.n_calls > 0; /* the message item comes first */
    }
    rs.has_usage = 1;
    rs.usage = usage;
    if (r.stream) {
        if (st.resp) {
            for (int ev = rs.no_message ? KIRI_RESPONSES_EV_FINISHED : KIRI_RESPONSES_EV_TEXT_DONE;
                 ev <= KIRI_RESPONSES_EV_FINISHED; ev++)
                stream_event(&st, ev, NULL, 0);
        } else {
            if (r.include_usage)
                stream_send(&st, kiri_api_chunk_json(kind, &env, NULL, 0, 0, &usage));
            if (gfail || errors)
                stream_send(&st, kiri_api_error_json(&gerr));
            const char done[] = "data: [DONE]\n\n";
            stream_write(&st, done, sizeof done - 1);
        }
        if (!st.broken && !st.raw && mg_send_chunk(c, "", 0) < 0)
            st.broken = 1;
        if (st.broken)
            kiri_metrics_client_disconnect(s->metrics);
        status = 200;
    } else if (gfail) {
        status = send_error(c, &gerr, "");
    } else if (errors) {
        status = send_error(c, &gerr, "");
    } else if (kind == KIRI_API_RESPONSES) {
        status = send_json(c, 200, kiri_responses_json(&rs), "");
    } else {
        status = send_choices(c, g, &r, kind, &env, &usage);
    }
    kiri_metrics_e2e(s->metrics, kiri_platform_now() - t0);
    if (s->cfg.log_prompts && r.n_prompts && r.prompts[0].text)
        fprintf(stderr, "kiri: %s prompt: %.200s\n", endpoint, r.prompts[0].text);
    gen_free(g);
    prompts_free(prompts, n_prompts);
    kiri_api_request_free(&r);
    return status;
}

/* ---------------------------------------------------------------------------------------------
 * The cloud upstream (upstream.h): where a generation request is served, and relaying the
 * upstream's answer
 * ------------------------------------------------------------------------------------------- */

/* The upstream's configuration from the flags (strings borrowed from s->cfg). */
static void upstream_config(const struct kiri_server *s, struct kiri_upstream_config *uc)
{
    memset(uc, 0, sizeof *uc);
    uc->url = s->cfg.upstream;
    uc->key_file = s->cfg.upstream_key_file;
    uc->ca_file = s->cfg.upstream_ca;
    if (kiri_route_parse(s->cfg.route, &uc->route) != 0)
        uc->route = KIRI_ROUTE_LOCAL_FIRST;
    uc->route_queue = s->cfg.route_queue > 0 ? s->cfg.route_queue : s->cfg.queue / 2 > 0 ? s->cfg.queue / 2 : 1;
    uc->first_byte_timeout = uc->idle_timeout = s->cfg.upstream_timeout;
    uc->connect_timeout = s->cfg.upstream_timeout < 5 ? s->cfg.upstream_timeout : 5;
}

/* Applies the routing policy and upstream URL of a newly accepted fleet manifest, once per
 * manifest version. A manifest without routing reads as "local"; one that says "local" and names
 * no upstream_url therefore leaves the flags in force, and "local" with an upstream_url turns
 * forwarding off. Otherwise the manifest's policy and URL override the flags'. */
static void follow_manifest(struct kiri_server *s)
{
    if (!s->fleet || atomic_load(&s->draining))
        return;
    char routing[16] = "", url[2048] = "";
    uint64_t seen = atomic_load(&s->routing_version);
    if (kiri_fleet_node_policy(s->fleet, routing, NULL, 0) == seen)
        return; /* the common case, every request: the URL is copied only for a new version */
    const uint64_t v = kiri_fleet_node_policy(s->fleet, routing, url, sizeof url);
    if (v == 0 || v == seen || !atomic_compare_exchange_strong(&s->routing_version, &seen, v))
        return;
    struct kiri_upstream_config uc;
    upstream_config(s, &uc);
    enum kiri_route r = uc.route;
    if (kiri_route_parse(routing, &r) != 0 || (r == KIRI_ROUTE_LOCAL && !url[0]))
        r = uc.route; /* nothing said: the flags' */
    uc.route = r;
    if (url[0])
        uc.url = url;
    if (r == KIRI_ROUTE_LOCAL)
        uc.url = NULL;
    struct kiri_status_info info;
    if (kiri_upstream_reconfigure(s->upstream, &uc, &info) != KIRI_OK)
        fprintf(stderr, "kiri: manifest %llu: routing not applied, the previous one stays: %s\n",
                (unsigned long long)v, info.message);
    else
        fprintf(stderr, "kiri: manifest %llu: routing %s\n", (unsigned long long)v,
                kiri_route_name(kiri_upstream_route(s->upstream, NULL)));
}

/* Relays an upstream answer to the client (kiri_upstream_sink). */
struct proxy {
    struct kiri_server *s;
    struct mg_connection *c;
    struct stream st;           /* for an event stream: c, raw, broken */
    int status;
    int streaming;
};

static int proxy_head(void *user, int status, const char *type, int stream)
{
    (void)type; /* an event stream is sent as one, a body as the JSON it was checked to be */
    struct proxy *p = user;
    p->status = status;
    p->streaming = stream;
    /* Counted before the client can see the answer, so the metrics never lag behind it. */
    kiri_upstream_count(p->s->upstream, KIRI_UPSTREAM_SERVED_UPSTREAM);
    if (!stream)
        return 0;
    p->st.c = p->c;
    p->st.raw = strcmp(mg_get_request_info(p->c)->http_version, "1.1") != 0;
    if (p->st.raw)
        mg_disable_connection_keep_alive(p->c);
    mg_printf(p->c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                    "%s\r\nX-Accel-Buffering: no\r\nX-Kiri-Served-By: upstream\r\n\r\n",
              p->st.raw ? "Connection: close" : "Transfer-Encoding: chunked");
    return 0;
}

static int proxy_data(void *user, const void *bytes, size_t n)
{
    struct proxy *p = user;
    if (!p->streaming) {
        send_body(p->c, p->status, "application/json", bytes, n, "X-Kiri-Served-By: upstream\r\n");
        return 0;
    }
    stream_write(&p->st, bytes, n);
    return p->st.broken;
}

/* Decides where a generation request is served, and serves it when that is the upstream.
 * Returns the status of the answer sent, or 0 to serve it here. */
static int route_request(struct kiri_server *s, struct mg_connection *c, const char *endpoint, const char *body,
                         size_t body_len)
{
    follow_manifest(s);
    int route_queue = 1, stream = 0;
    const enum kiri_route route = kiri_upstream_route(s->upstream, &route_queue);
    char model[KIRI_MODELS_ID_MAX] = "";
    /* A request an upstream kiri forwarded is served here (no loops); one that is not even a JSON
     * object is answered by the local parser. */
    if (route == KIRI_ROUTE_LOCAL || mg_get_header(c, "X-Kiri-Forwarded") ||
        kiri_upstream_peek(body, body_len, model, sizeof model, &stream) != 0) {
        kiri_upstream_count(s->upstream, KIRI_UPSTREAM_SERVED_LOCAL);
        return 0;
    }
    int32_t waiting = 0;
    struct kiri_served_model *sm = kiri_models_acquire_loaded(s->models, model[0] ? model : NULL);
    const int here = sm != NULL || kiri_models_has(s->models, model[0] ? model : NULL); /* loaded, or on disk */
    if (sm) {
        struct kiri_batcher_stats bs;
        kiri_batcher_get_stats(sm->batcher, &bs);
        waiting = bs.waiting;
        kiri_models_release(s->models, sm);
    }
    if (route == KIRI_ROUTE_LOCAL_FIRST && here && waiting < route_queue) {
        kiri_upstream_count(s->upstream, KIRI_UPSTREAM_SERVED_LOCAL);
        return 0;
    }
    struct proxy p;
    memset(&p, 0, sizeof p);
    p.s = s;
    p.c = c;
    const struct kiri_upstream_sink sink = {proxy_head, proxy_data, &p};
    struct kiri_upstream_outcome out;
    kiri_upstream_forward(s->upstream, endpoint, body, body_len, stream, &sink, &out);
    switch (out.result) {
    case KIRI_UPSTREAM_DONE:
        if (p.streaming && !p.st.broken && !p.st.raw)
            mg_send_chunk(c, "", 0); /* the end of the chunked stream */
        return out.upstream_status;
    case KIRI_UPSTREAM_CLIENT_GONE:
        kiri_metrics_client_disconnect(s->metrics);
        return p.status ? p.status : 499;
    case KIRI_UPSTREAM_BROKEN: {
        /* Part of the stream is out: end it with an error event (no [DONE]) and close. */
        fprintf(stderr, "kiri: upstream stream broke off: %s\n", out.message);
        struct kiri_api_error e;
        kiri_api_error_set(&e, 502, "server_error", "", "upstream_stream_broken", "the upstream's stream broke off: %s",
                           out.message);
        stream_send(&p.st, kiri_api_error_json(&e));
        if (!p.st.broken && !p.st.raw)
            mg_send_chunk(c, "", 0);
        mg_disable_connection_keep_alive(c);
        return 200;
    }
    case KIRI_UPSTREAM_BAD_ANSWER:
        kiri_upstream_count(s->upstream, KIRI_UPSTREAM_SERVED_UPSTREAM);
        fprintf(stderr, "kiri: upstream bad answer: %s\n", out.message);
        return fail(c, 502, "server_error", "", "bad_upstream_answer", out.message, "X-Kiri-Served-By: upstream\r\n");
    case KIRI_UPSTREAM_UNAVAILABLE:
    default:
        break;
    }
    /* Nothing reached the client: serve here when the model is here and there is room (a full
     * queue answers 429 itself, except for the upstream's own 429 and a timeout, F16/F18). */
    const int full = waiting >= s->cfg.queue;
    if (here && !(full && (out.status == 429 || out.status == 504))) {
        fprintf(stderr, "kiri: upstream unavailable (%s); serving here\n", out.message);
        kiri_upstream_count(s->upstream, KIRI_UPSTREAM_FALLBACK);
        kiri_upstream_count(s->upstream, KIRI_UPSTREAM_SERVED_LOCAL);
        return 0;
    }
    char extra[96], msg[640];
    if (out.status == 429)
        snprintf(extra, sizeof extra, "Retry-After: %.0f\r\nX-Kiri-Served-By: upstream\r\n",
                 out.retry_after >= 1 && out.retry_after < 86400 ? out.retry_after : 1);
    else
        snprintf(extra, sizeof extra, "Retry-After: 5\r\nX-Kiri-Served-By: upstream\r\n");
    if (here)
        snprintf(msg, sizeof msg, "this server is full and the upstream could not take the request: %s", out.message);
    else
        snprintf(msg, sizeof msg, "the model '%.100s' is not served here and the upstream could not take the request: %s",
                 model, out.message);
    kiri_upstream_count(s->upstream, KIRI_UPSTREAM_SERVED_UPSTREAM);
    return fail(c, out.status, "server_error", "", out.status == 429 ? "overloaded" : "upstream_unavailable", msg,
                extra);
}

static int handle_generate(struct kiri_server *s, struct mg_connection *c, int kind, const char *endpoint)
{
    char *body = NULL;
    size_t body_len = 0;
    int status = read_body(s, c, &body, &body_len);
    if (status)
        return status;
    if ((status = route_request(s, c, endpoint, body, body_len)) != 0) {
        kiri_mem_free(body);
        return status;
    }
    struct kiri_served_model *sm = NULL;
    struct kiri_api_request r;
    if ((status = acquire_for(s, c, body, body_len, kind, &sm, &r)) != 0)
        return status;
    status = generate(s, sm, c, kind, endpoint, &r);
    kiri_models_release(s->models, sm);
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
    struct kiri_served_model *sm = NULL;
    struct kiri_api_request r;
    if ((status = acquire_for(s, c, body, body_len, kind, &sm, &r)) != 0)
        return status;
    if (kind == KIRI_API_TOKENIZE) {
        int32_t *ids = NULL, n = 0;
        const int add_bos = r.add_special ? kiri_model_add_bos(sm->model) : 0;
        if (tokenize_alloc(sm->model, r.content ? r.content : "", add_bos, r.parse_special, &ids, &n) != KIRI_OK)
            status = fail(c, 500, "server_error", "", "", "tokenization failed", "");
        else
            status = send_json(c, 200, kiri_api_tokens_json(ids, n), "");
        kiri_mem_free(ids);
    } else {
        const int64_t need = kiri_detokenize(sm->model, r.tokens, r.n_tokens, NULL, 0);
        char *text = need >= 0 ? kiri_mem_alloc((size_t)need + 1) : NULL;
        if (text && kiri_detokenize(sm->model, r.tokens, r.n_tokens, text, (size_t)need) == need)
            status = send_json(c, 200, kiri_api_content_json(text, (size_t)need), "");
        else
            status = fail(c, 500, "server_error", "", "", need < 0 ? "detokenization failed" : "out of memory", "");
        kiri_mem_free(text);
    }
    kiri_api_request_free(&r);
    kiri_models_release(s->models, sm);
    return status;
}

/* The served models' and the fleet's families for /metrics (metrics.h). */
static char *render_models(struct kiri_server *s, char *page)
{
    struct kiri_models_info *info = kiri_mem_calloc(KIRI_MODELS_MAX, sizeof *info);
    if (!info) {
        kiri_mem_free(page);
        return NULL;
    }
    struct kiri_models_counts mc;
    kiri_models_counts(s->models, &mc);
    struct kiri_metrics_models f;
    memset(&f, 0, sizeof f);
    f.loads = mc.loads;
    f.swaps = mc.swaps;
    f.load_failures = mc.load_failures;
    f.evictions = mc.evictions;
    f.loaded = mc.n_loaded;
    f.memory_bytes = mc.bytes_used;
    if (s->fleet)
        kiri_fleet_node_metrics(s->fleet, &f);
    const char *ids[KIRI_MODELS_MAX], *shas[KIRI_MODELS_MAX];
    int loaded[KIRI_MODELS_MAX];
    f.n_models = kiri_models_snapshot(s->models, info, KIRI_MODELS_MAX);
    for (int i = 0; i < f.n_models; i++) {
        ids[i] = info[i].id;
        shas[i] = info[i].sha256_hex;
        loaded[i] = info[i].loaded;
    }
    f.ids = ids;
    f.sha256_hex = shas;
    f.is_loaded = loaded;
    char *out = kiri_metrics_render_models(page, &f);
    kiri_mem_free(info);
    return out;
}

static int handle_metrics(struct kiri_server *s, struct mg_connection *c)
{
    struct kiri_batcher_stats st;
    memset(&st, 0, sizeof st);
    char def[KIRI_MODELS_ID_MAX] = "";
    if (atomic_load(&s->ready)) {
        kiri_models_stats(s->models, &st);
        kiri_models_default_id(s->models, def);
    }
    char *text = kiri_metrics_render(s->metrics, &st, def);
    if (text && atomic_load(&s->ready))
        text = render_models(s, text);
    if (text && s->upstream) { /* the routing families follow the rest */
        struct kiri_upstream_stats us;
        kiri_upstream_get_stats(s->upstream, &us);
        text = kiri_metrics_render_upstream(text, &us);
    }
    if (!text)
        return fail(c, 500, "server_error", "", "", "out of memory", "");
    send_body(c, 200, "text/plain; version=0.0.4; charset=utf-8", text, strlen(text), "");
    kiri_mem_free(text);
    return 200;
}

/* ---------------------------------------------------------------------------------------------
 * Routing
 * ------------------------------------------------------------------------------------------- */

enum route {
    R_CHAT, R_COMPLETIONS, R_RESPONSES, R_MODELS, R_TOKENIZE, R_DETOKENIZE, R_HEALTH, R_METRICS, R_PAGE, R_NONE
};

static const struct {
    const char *path;
    const char *method;
    enum route r;
} routes[] = {
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/v1/completions", "POST", R_COMPLETIONS},
    {"/v1/responses", "POST", R_RESPONSES},
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

/* Refuses framing that could smuggle a second request past a proxy: Content-Length
 * together with Transfer-Encoding, Content-Length twice, or a Content-Length that is not a plain
 * decimal number. CivetWeb keeps only the first MG_MAX_HEADERS header lines and silently drops
 * the rest (which could be a Transfer-Encoding or an Authorization), so a request that fills the
 * table is refused too. Returns 0, or the status of the refusal it sent. */
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
        /* Draining answers 503 too, so a load balancer stops sending before the listener closes. */
        status = !atomic_load(&s->ready)
                     ? send_body(c, 503, "application/json", "{\"status\":\"loading\"}", 20, "Retry-After: 1\r\n")
                 : atomic_load(&s->draining)
                     ? send_body(c, 503, "application/json", "{\"status\":\"draining\"}", 21, "Retry-After: 5\r\n")
                 : kiri_models_has(s->models, NULL)
                     ? send_body(c, 200, "application/json", "{\"status\":\"ok\"}", 15, "")
                     : send_body(c, 503, "application/json", "{\"status\":\"no model\"}", 21, "Retry-After: 5\r\n");
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
        char(*list)[KIRI_MODELS_ID_MAX] = kiri_mem_array(KIRI_MODELS_MAX, sizeof *list);
        const char *ids[KIRI_MODELS_MAX];
        const int n = list ? kiri_models_list(s->models, list, KIRI_MODELS_MAX) : 0;
        for (int i = 0; i < n; i++)
            ids[i] = list[i];
        status = send_json(c, 200, list ? kiri_api_models_json(ids, n, s->created) : NULL, "");
        kiri_mem_free(list);
    } else if (routes[idx].r == R_TOKENIZE || routes[idx].r == R_DETOKENIZE) {
        status = handle_tokenize(s, c, routes[idx].r == R_TOKENIZE ? KIRI_API_TOKENIZE : KIRI_API_DETOKENIZE);
    } else if (atomic_load(&s->draining)) {
        status = fail(c, 503, "server_error", "", "shutting_down", "the server is shutting down", "Retry-After: 5\r\n");
    } else {
        atomic_fetch_add(&s->active, 1);
        const enum route rt = routes[idx].r;
        status = handle_generate(s, c,
                                 rt == R_CHAT        ? KIRI_API_CHAT
                                 : rt == R_RESPONSES ? KIRI_API_RESPONSES
                                                     : KIRI_API_COMPLETIONS,
                                 endpoint);
        atomic_fetch_sub(&s->active, 1);
    }
    kiri_metrics_request(s->metrics, endpoint, status);
    atomic_fetch_add(&s->n_requests, 1);
    if (status >= 500)
        atomic_fetch_add(&s->n_errors, 1);
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

static void log_line(void *user, const char *line)
{
    (void)user;
    fprintf(stderr, "kiri: %s\n", line);
}

/* What a heartbeat reports about requests (fleet_node.h). */
static void node_status(void *user, struct kiri_heartbeat_status *hs)
{
    struct kiri_server *s = user;
    struct kiri_batcher_stats st;
    kiri_models_stats(s->models, &st);
    hs->running = st.running;
    hs->waiting = st.waiting;
    hs->requests_total = atomic_load(&s->n_requests);
    hs->request_errors = atomic_load(&s->n_errors);
    hs->uptime_seconds = kiri_platform_now() - s->t_start;
}

/* The models to serve: the one file of --model, or every model of --models-dir (named by the
 * fleet's manifest when there is one, which also picks the default). The default model is loaded
 * before the server reports ready; with --model a failure to load it is fatal, with a directory
 * it is logged and the next request for it tries again. */
static int load_models(struct kiri_server *s, struct kiri_status_info *info)
{
    const struct kiri_server_config *cfg = &s->cfg;
    struct kiri_models_params mp;
    memset(&mp, 0, sizeof mp);
    mp.backend = cfg->backend[0] ? cfg->backend : "auto";
    mp.n_threads = cfg->threads;
    mp.gpu_layers = cfg->gpu_layers;
    mp.cpu_kernels = cfg->cpu_kernels;
    mp.n_ctx = cfg->ctx;
    mp.kv_memory = cfg->kv_memory;
    mp.kv_type = strcmp(cfg->kv_type, "f32") == 0 ? KIRI_KV_F32 : strcmp(cfg->kv_type, "q8_0") == 0 ? KIRI_KV_Q8_0 : KIRI_KV_F16;
    mp.max_seqs = cfg->parallel;
    mp.chunk = cfg->chunk;
    mp.queue_cap = cfg->queue;
    mp.spec_max_seqs = cfg->spec_max_seqs;
    mp.draft_model = cfg->draft_model[0] ? cfg->draft_model : NULL;
    mp.speculative = mp.draft_model || kiri_spec_parse(cfg->spec) > 0;
    mp.mtp = kiri_spec_parse(cfg->spec) != KIRI_SPEC_MTP ? 0 : cfg->models_dir[0] ? 2 : 1;
    mp.memory_budget = cfg->models_dir[0] ? cfg->models_memory : 0;
    /* A directory's models change while serving: each one proves it runs before it serves. */
    mp.warm_up = cfg->models_dir[0] != 0;
    mp.log = log_line;
    int rc = kiri_models_init(&mp, &s->models);
    if (rc != KIRI_OK)
        return kiri_error_set(info, rc, "out of memory");
    if (cfg->model[0]) {
        const char *slash = strrchr(cfg->model, '/');
        char id[KIRI_MODELS_ID_MAX];
        snprintf(id, sizeof id, "%.127s", cfg->model_alias[0] ? cfg->model_alias : slash ? slash + 1 : cfg->model);
        if ((rc = kiri_models_add(s->models, id, cfg->model, NULL, info)) < 0)
            return rc;
        return kiri_models_load(s->models, NULL, info);
    }
    if (cfg->fleet_url[0]) {
        struct kiri_fleet_node_params np;
        memset(&np, 0, sizeof np);
        np.models_dir = cfg->models_dir;
        np.manifest_url = cfg->fleet_url;
        np.key_file = cfg->fleet_key;
        np.ca_file = cfg->fleet_ca[0] ? cfg->fleet_ca : NULL;
        np.node_name = cfg->node_name;
        np.interval = cfg->fleet_interval;
        np.models = s->models;
        np.status = node_status;
        np.status_user = s;
        if ((rc = kiri_fleet_node_init(&np, &s->fleet, info)) != KIRI_OK)
            return rc;
    } else if ((rc = kiri_models_scan_dir(s->models, cfg->models_dir, info)) != KIRI_OK) {
        return rc;
    }
    struct kiri_status_info li;
    if (kiri_models_has(s->models, NULL) && kiri_models_load(s->models, NULL, &li) != KIRI_OK)
        fprintf(stderr, "kiri: the default model did not load (%s); requests for it will try again\n", li.message);
    if (!kiri_models_has(s->models, NULL))
        fprintf(stderr, "kiri: %s holds no model yet%s\n", cfg->models_dir,
                s->fleet ? "; the fleet sync will install them" : "");
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
    s->t_start = kiri_platform_now();
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
    struct kiri_upstream_config uc;
    upstream_config(s, &uc);
    if ((rc = kiri_upstream_open(&uc, &s->upstream, info)) != KIRI_OK)
        goto fail;
    if (cfg->upstream[0])
        fprintf(stderr, "kiri: routing %s, upstream %s\n", kiri_route_name(uc.route), cfg->upstream);

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
    fprintf(stderr, "kiri: listening on %s://%s:%d, loading %s\n", tls ? "https" : "http", cfg->host, s->port,
            cfg->model[0] ? cfg->model : cfg->models_dir);
    if ((rc = load_models(s, info)) != KIRI_OK)
        goto fail;
    atomic_store(&s->ready, 1);
    if (s->fleet && (rc = kiri_fleet_node_start(s->fleet, info)) != KIRI_OK)
        goto fail;
    char def[KIRI_MODELS_ID_MAX];
    kiri_models_default_id(s->models, def);
    struct kiri_served_model *dm = kiri_models_acquire_loaded(s->models, NULL);
    fprintf(stderr, "kiri: serving %s (context %d, %d parallel, %s)\n", def[0] ? def : "(no model yet)",
            dm ? (int)dm->n_ctx : 0, cfg->parallel, s->auth ? "API keys required" : "no API keys");
    kiri_models_release(s->models, dm);
    *out = s;
    return KIRI_OK;
fail:
    kiri_server_stop(s, 0);
    return rc;
}


void kiri_server_stop(struct kiri_server *s, double grace_seconds)
{
    if (!s)
        return;
    atomic_store(&s->draining, 1);
    /* The fleet thread first: no swap starts while the server winds down. The node itself lives
     * until the listener is closed (requests read its metrics and routing). */
    kiri_fleet_node_stop(s->fleet);
    if (s->models) {
        /* Running requests finish (up to the grace period), new ones get 503. */
        const double end = kiri_platform_now() + grace_seconds;
        while (atomic_load(&s->active) > 0 && kiri_platform_now() < end)
            kiri_platform_sleep(0.05);
        kiri_models_stop(s->models);
    }
    if (s->upstream)
        kiri_upstream_cancel(s->upstream); /* forwards still running end within half a second */
    if (s->mg)
        mg_stop(s->mg);
    kiri_upstream_close(s->upstream);
    if (s->tls_pem[0])
        kiri_platform_file_abort(-1, s->tls_pem);
    kiri_models_free(s->models);
    kiri_fleet_node_free(s->fleet);
    kiri_auth_free(s->auth);
    kiri_metrics_free(s->metrics);
    kiri_mem_free(s);
}
