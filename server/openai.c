/* The OpenAI-compatible wire format (openai.h): request parsing and validation with Jansson, and
 * response, stream-chunk and error bodies written with Jansson.
 *
 * Decisions a client can see (docs/server.md repeats them):
 *   - The body must be one JSON object nested at most KIRI_API_MAX_DEPTH deep. The depth is
 *     counted by a scan of the raw bytes before Jansson runs, so a body of 100k '[' is refused
 *     without recursion.
 *   - Duplicate keys: the last one wins (Jansson's behaviour without JSON_REJECT_DUPLICATES).
 *     Unknown fields are ignored. A field set to null counts as absent.
 *   - Numbers: integer fields take JSON integers only (1.0 is refused); an integer outside int64
 *     or a real that overflows a double (1e999) is refused by Jansson and reported against the
 *     top-level field it sits in; NaN and Infinity are not JSON and are refused. The integer
 *     literal -0 is refused anywhere in the body (it would silently read as 0); a real -0.0 reads
 *     as 0.0 and is then range-checked.
 *   - Strings: invalid UTF-8 (overlongs, surrogates), lone \uD800 escapes and \u0000 are refused.
 *   - max_tokens / max_completion_tokens: an integer in [1, limit]; max_completion_tokens wins
 *     when both are set. Absent means "until EOS or the context ends" (not OpenAI's 16 for legacy
 *     completions). Larger than the limit is a 400 naming the field, never a silent clamp.
 *   - prompt: a string, an array of token ids, an array of strings or an array of token-id
 *     arrays (a list of prompts, at most KIRI_API_MAX_PROMPTS, and at most KIRI_API_MAX_CHOICES
 *     choices with n); an empty prompt array or token-id array is refused.
 *   - logit_bias: token-id string keys (digits) below n_vocab, numbers in [-100, 100], at most
 *     KIRI_API_MAX_LOGIT_BIAS entries.
 *   - Structured output: response_format {"type":"text"}, {"type":"json_object"} (any JSON
 *     object; llama-server's "schema" beside the type narrows it to that schema) or
 *     {"type":"json_schema","json_schema":{"name","schema","strict"}}, and llama-server's
 *     "grammar" (GBNF text, checked here) and "json_schema" (a schema object). The schema is
 *     compiled to GBNF (schema/json_schema.h); what the compiler cannot honour is a 400 whose
 *     param is the field and the JSON pointer inside it (response_format.json_schema.schema/
 *     properties/x), never a looser grammar. strict false constrains exactly as true does. Two
 *     constraints in one request are a 400 (code "conflicting_parameters").
 *   - tools (chat): a list of at most 128 {"type":"function","function":{name, description,
 *     parameters}}, names ^[A-Za-z0-9_-]{1,64}$ and distinct; tool_choice none/auto/required or a
 *     named function that is in tools; an assistant message's tool_calls need an id and a
 *     function name; a tool message's tool_call_id must match a call of an earlier message.
 *   - functions, tools in /v1/completions, best_of > 1 and suffix are refused (code
 *     "unsupported_parameter"); echo is read for completions.
 *   - The "developer" role is read as "system". Text content parts are joined with nothing
 *     between them; any other part type is refused.
 *   - Extensions: top_k, min_p, repetition_penalty (also spelled repeat_penalty), repeat_last_n,
 *     priority, speculative ("ngram"/"draft"/"mtp"/"none", true/false, or {"type", "max_draft"}: drafted tokens
 *     verified in one step, with the same output; absent: the server's --spec). Penalties look
 *     back over repeat_last_n tokens (default 64), not the whole text.
 *   - Out of memory while parsing is KIRI_E_NOMEM with a 500 "server_error".
 * Responses: log-probabilities that are not finite (or below -9999) are written as -9999.0,
 * OpenAI's "very unlikely" value; floats are written with the fewest digits that read back as
 * the same float; token text that is not valid UTF-8 has each bad byte replaced by U+FFFD (the
 * exact bytes are in "bytes" for chat); legacy text_offset counts bytes from the start of the
 * choice's text in this response or chunk.
 *
 * Jansson's allocations are routed through kiri_mem_* once per process (see use_kiri_allocator):
 * json_set_alloc_funcs is process-wide, so this module keeps the state that goes with it: a
 * once-flag, and a thread-local flag that tells an allocation failure inside json_loadb apart
 * from a syntax error.
 */
#include "openai.h"

#include "tools.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "json_schema.h"
#include "mem.h"
#include "utf8.h"

#define KIRI_API_MAX_DEPTH 64
#define MAX_LEGACY_LOGPROBS 5
#define MAX_TOP_LOGPROBS 20
#define MAX_LAST_N (1 << 20)          /* KIRI_SAMPLER_MAX_LAST_N */
#define DEFAULT_MAX_MESSAGES 1024
#define LOGPROB_FLOOR (-9999.0)

/* ---------------------------------------------------------------------------------------------
 * Jansson's allocator
 * ------------------------------------------------------------------------------------------- */

/* Jansson reports an allocation failure inside its lexer as a syntax error (or with an empty
 * message), so the allocator records failures itself: set on this thread by a failed
 * allocation, cleared before each parse. */
static _Thread_local int jansson_alloc_failed;

static void *jansson_alloc(size_t size)
{
    void *p = kiri_mem_alloc(size);
    if (!p)
        jansson_alloc_failed = 1;
    return p;
}

/* 0: not set, 1: one thread is setting it, 2: set. Setting the functions twice would be harmless
 * but a data race; switching while another thread holds Jansson values is safe because
 * kiri_mem_free is free(). */
static atomic_int jansson_alloc_state;

static void use_kiri_allocator(void)
{
    if (atomic_load_explicit(&jansson_alloc_state, memory_order_acquire) == 2)
        return;
    int expected = 0;
    if (atomic_compare_exchange_strong(&jansson_alloc_state, &expected, 1)) {
        json_set_alloc_funcs(jansson_alloc, kiri_mem_free);
        atomic_store_explicit(&jansson_alloc_state, 2, memory_order_release);
        return;
    }
    /* Another thread is two stores away from finishing. */
    while (atomic_load_explicit(&jansson_alloc_state, memory_order_acquire) != 2) {
    }
}

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

void kiri_api_error_set(struct kiri_api_error *e, int status, const char *type, const char *param,
                        const char *code, const char *fmt, ...)
{
    if (!e)
        return;
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "");
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    snprintf(e->code, sizeof e->code, "%s", code ? code : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

/* ---------------------------------------------------------------------------------------------
 * UTF-8
 * ------------------------------------------------------------------------------------------- */

/* A copy of s[0..n) with every byte that does not start a valid character replaced by U+FFFD,
 * one each, as the header says (owned; NULL when out of memory). Writes its length to *out_n. */
static char *repair_bytes(const char *s, size_t n, size_t *out_n)
{
    struct kiri_buf b = {0};
    kiri_buf_reserve(&b, n + 6);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const int k = kiri_utf8_check(u + i, n - i);
        if (k > 0) {
            kiri_buf_append(&b, s + i, (size_t)k);
            i += (size_t)k;
        } else {
            kiri_buf_puts(&b, KIRI_UTF8_REPLACEMENT);
            i++;
        }
    }
    if (b.failed) {
        kiri_buf_free(&b);
        return NULL;
    }
    return kiri_buf_take(&b, out_n);
}

/* ---------------------------------------------------------------------------------------------
 * The raw-byte scan: depth cap, integer -0, and which top-level key a byte offset falls in
 * ------------------------------------------------------------------------------------------- */

enum scan_result { SCAN_OK, SCAN_TOO_DEEP, SCAN_NEG_ZERO };

struct scan {
    int result;             /* enum scan_result */
    int in_value;           /* the stop offset lies in the value of a top-level key */
    size_t key_off, key_len;    /* that key's bytes inside the body (escapes not decoded) */
};

/* Walks body[0..stop) the way a JSON lexer would (strings with backslash escapes, brackets
 * elsewhere), without recursion. It stops early at a nesting deeper than KIRI_API_MAX_DEPTH or at
 * an integer literal -0. For valid JSON it agrees with Jansson byte for byte; where the body is
 * malformed Jansson refuses it no later than where the two could disagree. */
static void scan_body(const char *b, size_t len, size_t stop, struct scan *s)
{
    int depth = 0, top_object = 0, expect_key = 0;
    size_t cand_off = 0, cand_len = 0;
    memset(s, 0, sizeof *s);
    if (stop > len)
        stop = len;
    for (size_t i = 0; i < stop; i++) {
        char c = b[i];
        if (c == '"') {
            size_t start = i + 1, j = start;
            while (j < len && b[j] != '"')
                j += b[j] == '\\' ? 2 : 1;
            if (j > len)
                j = len;
            if (depth == 1 && top_object && expect_key) {   /* in_value is 0 here */
                cand_off = start;
                cand_len = j - start;
            }
            i = j;
            continue;
        }
        switch (c) {
        case '{':
        case '[':
            depth++;
            if (depth == 1) {
                top_object = c == '{';
                expect_key = top_object;
            }
            if (depth > KIRI_API_MAX_DEPTH) {
                s->result = SCAN_TOO_DEEP;
                return;
            }
            break;
        case '}':
        case ']':
            if (depth > 0)
                depth--;
            break;
        case ':':
            if (depth == 1 && top_object && expect_key) {
                s->key_off = cand_off;
                s->key_len = cand_len;
                s->in_value = 1;
                expect_key = 0;
            }
            break;
        case ',':
            if (depth == 1 && top_object) {
                expect_key = 1;
                s->in_value = 0;
            }
            break;
        case '-':
            if (i + 1 < len && b[i + 1] == '0') {
                char n = i + 2 < len ? b[i + 2] : ' ';
                if (n != '.' && n != 'e' && n != 'E' && !(n >= '0' && n <= '9')) {
                    s->result = SCAN_NEG_ZERO;
                    return;
                }
            }
            break;
        default:
            break;
        }
    }
}

/* The top-level key the scan stopped in, when it is short printable ASCII without escapes. */
static void scan_param(const char *b, const struct scan *s, char *param, size_t cap)
{
    param[0] = '\0';
    if (!s->in_value || s->key_len == 0 || s->key_len >= cap)
        return;
    for (size_t i = 0; i < s->key_len; i++) {
        char c = b[s->key_off + i];
        if (c < 0x20 || c > 0x7E || c == '\\')
            return;
    }
    memcpy(param, b + s->key_off, s->key_len);
    param[s->key_len] = '\0';
}

/* ---------------------------------------------------------------------------------------------
 * Field readers. Each returns 0, or KIRI_E_INVALID_ARG / KIRI_E_NOMEM with the error filled.
 * ------------------------------------------------------------------------------------------- */

struct parser {
    const struct kiri_api_limits *lim;
    struct kiri_api_error *err;
    json_t *messages;       /* owned: the conversation for the template (see messages_json) */
    json_t *call_ids;       /* owned: ids of the tool calls seen so far, as object keys */
    int has_tool_calls;     /* some message carries tool_calls */
};

static int bad(struct parser *p, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int bad(struct parser *p, const char *param, const char *code, const char *fmt, ...)
{
    struct kiri_api_error *e = p->err;
    kiri_api_error_set(e, 400, "invalid_request_error", param, code, "%s", "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return KIRI_E_INVALID_ARG;
}

static int oom(struct parser *p)
{
    kiri_api_error_set(p->err, 500, "server_error", "", "",
                       "out of memory while reading the request");
    return KIRI_E_NOMEM;
}

static int unsupported(struct parser *p, const char *param, const char *what)
{
    return bad(p, param, "unsupported_parameter", "%s is not supported", what);
}

/* The field's value, or NULL when it is absent or null. */
static json_t *field(json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    return json_is_null(v) ? NULL : v;
}

static int read_int(struct parser *p, json_t *obj, const char *name, int64_t lo, int64_t hi,
                    int64_t *out, int *present)
{
    json_t *v = field(obj, name);
    if (present)
        *present = v != NULL;
    if (!v)
        return 0;
    if (!json_is_integer(v))
        return bad(p, name, "", "%s must be an integer", name);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return bad(p, name, "", "%s must be between %lld and %lld, got %lld", name, (long long)lo,
                   (long long)hi, (long long)x);
    *out = x;
    return 0;
}

/* A number in [lo, hi], or (lo, hi] when lo_open. */
static int read_float(struct parser *p, json_t *obj, const char *name, double lo, int lo_open,
                      double hi, float *out)
{
    json_t *v = field(obj, name);
    if (!v)
        return 0;
    if (!json_is_number(v))
        return bad(p, name, "", "%s must be a number", name);
    double x = json_number_value(v);
    float f = (float)x;
    /* The float is checked too: 1e-300 is above 0 but rounds to 0.0f. */
    if (!(lo_open ? x > lo && f > lo : x >= lo) || !(x <= hi))
        return bad(p, name, "", "%s must be in %c%g, %g], got %g", name, lo_open ? '(' : '[', lo,
                   hi, x);
    *out = f;
    return 0;
}

static int read_bool(struct parser *p, json_t *obj, const char *name, int *out)
{
    json_t *v = field(obj, name);
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return bad(p, name, "", "%s must be true or false", name);
    *out = json_is_true(v);
    return 0;
}

static int copy_string(struct parser *p, json_t *v, char **out)
{
    char *s = kiri_mem_strndup(json_string_value(v), json_string_length(v));
    if (!s)
        return oom(p);
    *out = s;
    return 0;
}

/* An optional string field (required when `required`). */
static int read_string(struct parser *p, json_t *obj, const char *name, int required, char **out)
{
    json_t *v = field(obj, name);
    if (!v)
        return required ? bad(p, name, "", "%s is required", name) : 0;
    if (!json_is_string(v))
        return bad(p, name, "", "%s must be a string", name);
    return copy_string(p, v, out);
}

/* An array of token ids in [0, n_vocab) into an owned int32 array (NULL for an empty array). */
static int read_token_ids(struct parser *p, json_t *arr, const char *param, int32_t **out,
                          int32_t *n_out)
{
    size_t n = json_array_size(arr);
    if (n > INT32_MAX)
        return bad(p, param, "", "%s has too many tokens", param);
    int32_t n_vocab = p->lim->n_vocab;
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v))
            return bad(p, param, "", "invalid tokens: %s[%zu] is not an integer token id", param,
                       i);
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= n_vocab)
            return bad(p, param, "", "invalid tokens: %s[%zu] = %lld is not in [0, %ld)", param, i,
                       (long long)id, (long)n_vocab);
    }
    int32_t *ids = NULL;
    if (n) {
        ids = kiri_mem_array(n, sizeof *ids);
        if (!ids)
            return oom(p);
        for (size_t i = 0; i < n; i++)
            ids[i] = (int32_t)json_integer_value(json_array_get(arr, i));
    }
    *out = ids;
    *n_out = (int32_t)n;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Request parts
 * ------------------------------------------------------------------------------------------- */

/* One prompt: a string, or a non-empty array of token ids. */
static int read_one_prompt(struct parser *p, json_t *v, const char *param, struct kiri_api_prompt *out)
{
    if (json_is_string(v))
        return copy_string(p, v, &out->text);
    if (!json_is_array(v))
        return bad(p, param, "", "%s must be a string or an array of token ids", param);
    if (json_array_size(v) == 0)
        return bad(p, param, "", "%s must not be an empty array", param);
    return read_token_ids(p, v, param, &out->tokens, &out->n_tokens);
}

static int parse_prompt(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    json_t *v = field(body, "prompt");
    if (!v)
        return bad(p, "prompt", "", "prompt is required");
    if (!json_is_string(v) && !json_is_array(v))
        return bad(p, "prompt", "", "prompt must be a string, an array of strings, an array of token ids or "
                   "an array of token-id arrays");
    if (json_is_array(v) && json_array_size(v) == 0)
        return bad(p, "prompt", "", "prompt must not be an empty array");
    /* An array of strings or of arrays is a list of prompts; anything else is one prompt. */
    json_t *first = json_is_array(v) ? json_array_get(v, 0) : NULL;
    const int list = first && (json_is_string(first) || json_is_array(first));
    const size_t n = list ? json_array_size(v) : 1;
    if (n > KIRI_API_MAX_PROMPTS)
        return bad(p, "prompt", "", "prompt holds %zu prompts; at most %d are accepted", n, KIRI_API_MAX_PROMPTS);
    r->prompts = kiri_mem_calloc(n, sizeof *r->prompts);
    if (!r->prompts)
        return oom(p);
    r->n_prompts = (int)n;     /* zeroed entries: a failure below frees what was read */
    for (size_t i = 0; i < n; i++) {
        char param[32] = "prompt";
        if (list)
            snprintf(param, sizeof param, "prompt[%zu]", i);
        int rc = read_one_prompt(p, list ? json_array_get(v, i) : v, param, &r->prompts[i]);
        if (rc)
            return rc;
    }
    return 0;
}

static const char *canonical_role(const char *role)
{
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(role, roles[i]) == 0)
            return roles[i];
    if (strcmp(role, "developer") == 0)
        return "system";
    return NULL;
}

/* The text of one message's content: a string, or an array of {"type":"text","text":...} parts
 * joined. Absent or null content is allowed for the assistant only (it reads as ""). */
static int parse_content(struct parser *p, json_t *m, int i, int assistant, char **out)
{
    char param[64];
    json_t *c = field(m, "content");
    if (!c) {
        if (!assistant) {
            snprintf(param, sizeof param, "messages[%d].content", i);
            return bad(p, param, "", "%s is required for this role", param);
        }
        char *s = kiri_mem_strndup("", 0);
        if (!s)
            return oom(p);
        *out = s;
        return 0;
    }
    if (json_is_string(c))
        return copy_string(p, c, out);
    if (!json_is_array(c)) {
        snprintf(param, sizeof param, "messages[%d].content", i);
        return bad(p, param, "", "%s must be a string or an array of content parts", param);
    }
    size_t total = 0, n = json_array_size(c);
    for (size_t j = 0; j < n; j++) {
        json_t *part = json_array_get(c, j);
        if (!json_is_object(part)) {
            snprintf(param, sizeof param, "messages[%d].content[%zu]", i, j);
            return bad(p, param, "", "%s must be an object", param);
        }
        json_t *type = json_object_get(part, "type");
        snprintf(param, sizeof param, "messages[%d].content[%zu].type", i, j);
        if (!json_is_string(type))
            return bad(p, param, "", "%s must be a string", param);
        if (strcmp(json_string_value(type), "text") != 0)
            return bad(p, param, "unsupported_value", "unsupported content part type '%.32s'",
                       json_string_value(type));
        json_t *text = json_object_get(part, "text");
        if (!json_is_string(text)) {
            snprintf(param, sizeof param, "messages[%d].content[%zu].text", i, j);
            return bad(p, param, "", "%s must be a string", param);
        }
        total += json_string_length(text);     /* bounded by the body's size */
    }
    char *s = kiri_mem_alloc(total + 1);
    if (!s)
        return oom(p);
    size_t o = 0;
    for (size_t j = 0; j < n; j++) {
        json_t *text = json_object_get(json_array_get(c, j), "text");
        memcpy(s + o, json_string_value(text), json_string_length(text));
        o += json_string_length(text);
    }
    s[o] = '\0';
    *out = s;
    return 0;
}

/* ---- tools ---- */

#define MAX_TOOLS 128
#define MAX_TOOL_CALLS 128

/* OpenAI's rule for function names: ^[a-zA-Z0-9_-]{1,64}$ (which also keeps them safe to put in
 * a grammar's literals). */
static int valid_tool_name(json_t *v)
{
    if (!json_is_string(v) || json_string_length(v) < 1 || json_string_length(v) > 64)
        return 0;
    for (const char *c = json_string_value(v); *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '_' ||
              *c == '-'))
            return 0;
    return 1;
}

/* An assistant message's tool_calls, checked, as the template sees them (arguments parsed to an
 * object when they are a JSON object's text, as transformers expects). */
static int template_calls(struct parser *p, json_t *calls, int i, json_t *out)
{
    char param[80];
    snprintf(param, sizeof param, "messages[%d].tool_calls", i);
    if (!json_is_array(calls))
        return bad(p, param, "", "%s must be an array of tool calls", param);
    if (json_array_size(calls) > MAX_TOOL_CALLS)
        return bad(p, param, "", "%s has %zu entries; at most %d are accepted", param, json_array_size(calls),
                   MAX_TOOL_CALLS);
    for (size_t k = 0; k < json_array_size(calls); k++) {
        json_t *c = json_array_get(calls, k);
        json_t *fn = json_object_get(c, "function");
        json_t *id = json_object_get(c, "id");
        json_t *type = field(c, "type");
        json_t *name = json_object_get(fn, "name");
        json_t *args = field(fn, "arguments");
        snprintf(param, sizeof param, "messages[%d].tool_calls[%zu]", i, k);
        if (!json_is_object(c) || !json_is_object(fn))
            return bad(p, param, "", "%s must be {\"id\", \"type\": \"function\", \"function\": {\"name\", "
                       "\"arguments\"}}", param);
        if (!json_is_string(id) || json_string_length(id) == 0)
            return bad(p, param, "", "%s.id must be a non-empty string", param);
        if (type && (!json_is_string(type) || strcmp(json_string_value(type), "function") != 0))
            return bad(p, param, "", "%s.type must be \"function\"", param);
        if (!json_is_string(name))
            return bad(p, param, "", "%s.function.name must be a string", param);
        if (args && !json_is_string(args) && !json_is_object(args))
            return bad(p, param, "", "%s.function.arguments must be a string of JSON", param);
        json_t *parsed = NULL;
        if (json_is_string(args)) {
            json_error_t je;
            parsed = json_loadb(json_string_value(args), json_string_length(args), 0, &je);
            if (jansson_alloc_failed)
                return oom(p);
            if (!json_is_object(parsed)) {
                json_decref(parsed);
                parsed = json_incref(args);
            }
        } else {
            parsed = args ? json_incref(args) : json_object();
        }
        json_t *tc = json_pack("{s:O,s:s,s:{s:O,s:o}}", "id", id, "type", "function", "function", "name", name,
                               "arguments", parsed);
        if (!tc || json_array_append_new(out, tc) || json_object_set_new(p->call_ids, json_string_value(id),
                                                                         json_true()))
            return oom(p);
    }
    p->has_tool_calls |= json_array_size(calls) > 0;
    return 0;
}

/* Message i as the chat template sees it: role, content (text), tool_calls, tool_call_id, name. A
 * tool result must answer a call made earlier in the conversation. */
static int template_message(struct parser *p, json_t *m, int i, const char *role, const char *content)
{
    if (!p->messages && !(p->messages = json_array()))
        return oom(p);
    if (!p->call_ids && !(p->call_ids = json_object()))
        return oom(p);
    json_t *jm = json_pack("{s:s,s:s}", "role", role, "content", content ? content : "");
    if (!jm || json_array_append_new(p->messages, jm))
        return oom(p);
    char param[64];
    json_t *calls = field(m, "tool_calls");
    if (calls && strcmp(role, "assistant") != 0) {
        snprintf(param, sizeof param, "messages[%d].tool_calls", i);
        return bad(p, param, "", "only assistant messages carry tool_calls");
    }
    if (calls) {
        json_t *list = json_array();
        if (!list || json_object_set_new(jm, "tool_calls", list))
            return oom(p);
        int rc = template_calls(p, calls, i, list);
        if (rc)
            return rc;
    }
    json_t *id = field(m, "tool_call_id"), *name = field(m, "name");
    if (strcmp(role, "tool") == 0 && id) {
        snprintf(param, sizeof param, "messages[%d].tool_call_id", i);
        if (!json_is_string(id))
            return bad(p, param, "", "%s must be a string", param);
        if (!json_object_get(p->call_ids, json_string_value(id)))
            return bad(p, param, "", "%s '%.64s' matches no tool call of an earlier assistant message", param,
                       json_string_value(id));
        if (json_object_set(jm, "tool_call_id", id))
            return oom(p);
    }
    if (json_is_string(name) && json_object_set(jm, "name", name))
        return oom(p);
    return 0;
}

/* One entry of tools, checked, as {"type":"function","function":{name, description?, parameters?}}. */
static int parse_tool(struct parser *p, json_t *t, size_t i, json_t *names, json_t *out)
{
    char param[64];
    snprintf(param, sizeof param, "tools[%zu]", i);
    if (!json_is_object(t))
        return bad(p, param, "", "%s must be {\"type\": \"function\", \"function\": {...}}", param);
    json_t *type = json_object_get(t, "type");
    snprintf(param, sizeof param, "tools[%zu].type", i);
    if (!json_is_string(type))
        return bad(p, param, "", "%s must be \"function\"", param);
    if (strcmp(json_string_value(type), "function") != 0)
        return bad(p, param, "unsupported_value", "tool type '%.32s' is not supported (only \"function\")",
                   json_string_value(type));
    json_t *fn = json_object_get(t, "function");
    snprintf(param, sizeof param, "tools[%zu].function", i);
    if (!json_is_object(fn))
        return bad(p, param, "", "%s must be an object with a name", param);
    json_t *name = json_object_get(fn, "name"), *desc = field(fn, "description"), *params = field(fn, "parameters");
    snprintf(param, sizeof param, "tools[%zu].function.name", i);
    if (!valid_tool_name(name))
        return bad(p, param, "", "%s must be 1 to 64 letters, digits, '_' or '-'", param);
    if (json_object_get(names, json_string_value(name)))
        return bad(p, param, "", "two tools are named '%s'", json_string_value(name));
    snprintf(param, sizeof param, "tools[%zu].function.description", i);
    if (desc && !json_is_string(desc))
        return bad(p, param, "", "%s must be a string", param);
    snprintf(param, sizeof param, "tools[%zu].function.parameters", i);
    if (params && !json_is_object(params))
        return bad(p, param, "", "%s must be a JSON Schema object", param);
    json_t *f = json_pack("{s:O}", "name", name);
    json_t *entry = f ? json_pack("{s:s,s:o}", "type", "function", "function", f) : NULL;
    if (!entry || json_array_append_new(out, entry)) /* out owns entry (and f) from here */
        return oom(p);
    if ((desc && json_object_set(f, "description", desc)) || (params && json_object_set(f, "parameters", params)) ||
        json_object_set_new(names, json_string_value(name), json_true()))
        return oom(p);
    return 0;
}

/* tools, tool_choice, parallel_tool_calls; then the template's messages when they are needed. */
static int parse_tools(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    r->parallel_tool_calls = 1;
    r->tool_choice = KIRI_TOOL_CHOICE_AUTO;
    json_t *v = field(body, "tools");
    if (v && !json_is_array(v))
        return bad(p, "tools", "", "tools must be an array of {\"type\": \"function\", \"function\": {...}}");
    if (v && json_array_size(v) > MAX_TOOLS)
        return bad(p, "tools", "", "tools has %zu entries; at most %d are accepted", json_array_size(v), MAX_TOOLS);
    const size_t n = v ? json_array_size(v) : 0;
    json_t *list = json_array(), *names = json_object();
    int rc = list && names ? 0 : oom(p);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = parse_tool(p, json_array_get(v, i), i, names, list);
    if (rc == 0 && n > 0) {
        r->tools = json_dumps(list, JSON_COMPACT);
        r->tools_len = r->tools ? strlen(r->tools) : 0;
        if (!r->tools)
            rc = oom(p);
    }
    json_decref(list);

    json_t *tc = field(body, "tool_choice");
    if (rc == 0 && tc) {
        if (json_is_string(tc)) {
            const char *c = json_string_value(tc);
            if (strcmp(c, "none") == 0)
                r->tool_choice = KIRI_TOOL_CHOICE_NONE;
            else if (strcmp(c, "required") == 0)
                r->tool_choice = KIRI_TOOL_CHOICE_REQUIRED;
            else if (strcmp(c, "auto") != 0)
                rc = bad(p, "tool_choice", "", "tool_choice must be \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}");
        } else {
            json_t *type = json_object_get(tc, "type");
            json_t *name = json_object_get(json_object_get(tc, "function"), "name");
            if (!json_is_object(tc) || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
                !json_is_string(name))
                rc = bad(p, "tool_choice", "", "tool_choice must be \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}");
            else if (!json_object_get(names, json_string_value(name)))
                rc = bad(p, "tool_choice", "", "tool_choice names the function '%.64s', which is not in tools",
                         json_string_value(name));
            else if ((rc = copy_string(p, name, &r->tool_choice_name)) == 0)
                r->tool_choice = KIRI_TOOL_CHOICE_NAMED;
        }
        if (rc == 0 && r->tool_choice == KIRI_TOOL_CHOICE_REQUIRED && n == 0)
            rc = bad(p, "tool_choice", "", "tool_choice \"required\" needs tools");
    }
    json_decref(names);
    if (rc == 0)
        rc = read_bool(p, body, "parallel_tool_calls", &r->parallel_tool_calls);
    if (rc == 0 && (r->tools || p->has_tool_calls) && p->messages) {
        r->messages_json = json_dumps(p->messages, JSON_COMPACT);
        r->messages_json_len = r->messages_json ? strlen(r->messages_json) : 0;
        if (!r->messages_json)
            rc = oom(p);
    }
    return rc;
}

static int parse_messages(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    json_t *v = field(body, "messages");
    if (!v)
        return bad(p, "messages", "", "messages is required");
    if (!json_is_array(v))
        return bad(p, "messages", "", "messages must be an array of message objects");
    size_t n = json_array_size(v);
    int cap = p->lim->max_messages > 0 ? p->lim->max_messages : DEFAULT_MAX_MESSAGES;
    if (n == 0)
        return bad(p, "messages", "", "messages must not be empty");
    if (n > (size_t)cap)
        return bad(p, "messages", "", "messages has %zu entries; at most %d are accepted", n, cap);
    r->messages = kiri_mem_calloc(n, sizeof *r->messages);
    if (!r->messages)
        return oom(p);
    char param[64];
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(v, i);
        if (!json_is_object(m)) {
            snprintf(param, sizeof param, "messages[%zu]", i);
            return bad(p, param, "", "%s must be an object", param);
        }
        snprintf(param, sizeof param, "messages[%zu].role", i);
        json_t *role = field(m, "role");
        if (!role)
            return bad(p, param, "", "%s is required", param);
        if (!json_is_string(role))
            return bad(p, param, "", "%s must be a string", param);
        const char *canon = canonical_role(json_string_value(role));
        if (!canon)
            return bad(p, param, "", "unknown role '%.32s' (system, user, assistant, tool or "
                       "developer)", json_string_value(role));
        int assistant = strcmp(canon, "assistant") == 0;
        struct kiri_api_message *msg = &r->messages[i];
        r->n_messages = (int)i + 1;    /* so a failure below frees this entry too */
        msg->role = kiri_mem_strndup(canon, strlen(canon));
        if (!msg->role)
            return oom(p);
        int rc = parse_content(p, m, (int)i, assistant, &msg->content);
        if (rc || (rc = template_message(p, m, (int)i, canon, msg->content)))
            return rc;
    }
    return 0;
}

/* Entry i of stop, which is one string or an array of them. */
static json_t *stop_item(json_t *v, size_t i)
{
    return json_is_array(v) ? json_array_get(v, i) : v;
}

static int parse_stop(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    json_t *v = field(body, "stop");
    if (!v)
        return 0;
    if (!json_is_array(v) && !json_is_string(v))
        return bad(p, "stop", "", "stop must be a string or an array of strings");
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (n > KIRI_API_MAX_STOP)
        return bad(p, "stop", "", "stop has %zu entries; at most %d are accepted", n,
                   KIRI_API_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_t *s = stop_item(v, i);
        if (!json_is_string(s))
            return bad(p, "stop", "", "stop[%zu] must be a string", i);
        size_t len = json_string_length(s);
        if (len == 0)
            return bad(p, "stop", "", "stop strings must not be empty");
        if (len > KIRI_API_MAX_STOP_LEN)
            return bad(p, "stop", "", "stop strings must be at most %d bytes, got %zu",
                       KIRI_API_MAX_STOP_LEN, len);
    }
    for (size_t i = 0; i < n; i++) {
        int rc = copy_string(p, stop_item(v, i), &r->stop[i]);
        if (rc)
            return rc;
        r->n_stop = (int)i + 1;
    }
    return 0;
}

/* Token-id string keys below n_vocab, biases in [-100, 100], into r->bias_*. */
static int parse_logit_bias(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    json_t *v = field(body, "logit_bias");
    if (!v)
        return 0;
    if (!json_is_object(v))
        return bad(p, "logit_bias", "", "logit_bias must be an object of token ids to biases");
    const size_t n = json_object_size(v);
    if (n > KIRI_API_MAX_LOGIT_BIAS)
        return bad(p, "logit_bias", "", "logit_bias has %zu entries; at most %d are accepted", n,
                   KIRI_API_MAX_LOGIT_BIAS);
    if (n == 0)
        return 0;
    r->bias_tokens = kiri_mem_array(n, sizeof *r->bias_tokens);
    r->bias_values = kiri_mem_array(n, sizeof *r->bias_values);
    if (!r->bias_tokens || !r->bias_values)
        return oom(p);
    const char *key;
    json_t *bias;
    json_object_foreach(v, key, bias) {
        size_t klen = strlen(key);
        int64_t id = 0;
        int ok = klen > 0 && klen <= 10;
        for (size_t i = 0; ok && i < klen; i++) {
            if (key[i] < '0' || key[i] > '9')
                ok = 0;
            else
                id = id * 10 + (key[i] - '0');
        }
        if (!ok || id >= p->lim->n_vocab)
            return bad(p, "logit_bias", "", "logit_bias key '%.16s' is not a token id in [0, %ld)",
                       key, (long)p->lim->n_vocab);
        if (!json_is_number(bias) || !(json_number_value(bias) >= -100.0) ||
            !(json_number_value(bias) <= 100.0))
            return bad(p, "logit_bias", "", "logit_bias[\"%.16s\"] must be a number in [-100, 100]", key);
        r->bias_tokens[r->n_bias] = (int32_t)id;
        r->bias_values[r->n_bias] = (float)json_number_value(bias);
        r->n_bias++;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Structured output: response_format, grammar, json_schema
 * ------------------------------------------------------------------------------------------- */

/* a followed by b into out[cap] (cut at cap - 1 bytes): a param and the path inside it. */
static void join(char *out, size_t cap, const char *a, const char *b)
{
    const size_t na = strnlen(a, cap - 1);
    memcpy(out, a, na);
    const size_t nb = strnlen(b, cap - 1 - na);
    memcpy(out + na, b, nb);
    out[na + nb] = '\0';
}

/* What "any JSON object" is, as a schema. */
static const char json_object_schema[] = "{\"type\":\"object\"}";

/* Compiles schema text into r->grammar; errors name param and the pointer inside it. */
static int schema_text_grammar(struct parser *p, const char *text, size_t len, const char *param, int format,
                               struct kiri_api_request *r)
{
    struct kiri_status_info info;
    memset(&info, 0, sizeof info);
    char *gbnf = NULL;
    size_t gbnf_len = 0;
    /* The compiler reads the text with Jansson, whose allocation failures look like syntax errors
     * (see jansson_alloc_failed). */
    jansson_alloc_failed = 0;
    const int rc = kiri_json_schema_to_gbnf(text, len, NULL, NULL, &gbnf, &gbnf_len, &info);
    if (rc == KIRI_E_NOMEM || (rc != KIRI_OK && jansson_alloc_failed))
        return oom(p);
    if (rc != KIRI_OK) {
        /* The compiler names a JSON pointer ("/properties/x", perhaps as "#/properties/x"). */
        const char *ptr = info.field[0] == '#' ? info.field + 1 : info.field;
        char where[sizeof p->err->param];
        join(where, sizeof where, param, ptr[0] == '/' ? ptr : "");
        return bad(p, where, rc == KIRI_E_UNSUPPORTED ? "unsupported_schema" : "invalid_schema", "%s: %s", where,
                   info.message[0] ? info.message : "the schema cannot be used");
    }
    r->grammar = gbnf;
    r->grammar_len = gbnf_len;
    r->format = format;
    return 0;
}

static int schema_grammar(struct parser *p, json_t *schema, const char *param, int format,
                          struct kiri_api_request *r)
{
    if (!json_is_object(schema))
        return bad(p, param, "", "%s must be a JSON Schema object", param);
    char *text = json_dumps(schema, JSON_COMPACT);
    if (!text)
        return oom(p);
    const int rc = schema_text_grammar(p, text, strlen(text), param, format, r);
    kiri_mem_free(text);
    return rc;
}

/* A json_schema format's name, strict and description beside its schema (in holder). */
static int check_schema_fields(struct parser *p, json_t *holder, const char *param)
{
    char where[sizeof p->err->param];
    json_t *name = field(holder, "name");
    join(where, sizeof where, param, ".name");
    if (name) {
        if (!json_is_string(name))
            return bad(p, where, "", "%s must be a string", where);
        const char *s = json_string_value(name);
        const size_t n = json_string_length(name);
        int ok = n >= 1 && n <= 64;
        for (size_t i = 0; ok && i < n; i++)
            ok = (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
                 s[i] == '_' || s[i] == '-';
        if (!ok)
            return bad(p, where, "", "%s must be 1 to 64 letters, digits, '_' or '-'", where);
    }
    json_t *strict = field(holder, "strict");
    join(where, sizeof where, param, ".strict");
    if (strict && !json_is_boolean(strict))
        return bad(p, where, "", "%s must be true or false", where);
    json_t *desc = field(holder, "description");
    join(where, sizeof where, param, ".description");
    if (desc && !json_is_string(desc))
        return bad(p, where, "", "%s must be a string", where);
    return 0;
}

static int parse_format(struct parser *p, json_t *fmt, const char *param, int flat, struct kiri_api_request *r)
{
    json_t *type = json_is_object(fmt) ? json_object_get(fmt, "type") : NULL;
    if (!json_is_string(type))
        return bad(p, param, "", "%s must be an object with a string \"type\"", param);
    const char *t = json_string_value(type);
    char where[sizeof p->err->param];
    if (strcmp(t, "text") == 0)
        return 0;
    if (strcmp(t, "json_object") == 0) {
        json_t *schema = field(fmt, "schema");
        join(where, sizeof where, param, ".schema");
        if (schema)
            return schema_grammar(p, schema, where, KIRI_API_FORMAT_JSON_OBJECT, r);
        return schema_text_grammar(p, json_object_schema, sizeof json_object_schema - 1, param,
                                   KIRI_API_FORMAT_JSON_OBJECT, r);
    }
    if (strcmp(t, "json_schema") != 0)
        return bad(p, param, "", "unknown %s type '%.32s' (text, json_object or json_schema)", param, t);
    json_t *holder = fmt;
    char base[sizeof p->err->param];
    join(base, sizeof base, param, "");
    if (!flat) {
        join(base, sizeof base, param, ".json_schema");
        holder = field(fmt, "json_schema");
        if (!holder)
            return bad(p, base, "", "%s is required for type \"json_schema\"", base);
        if (!json_is_object(holder))
            return bad(p, base, "", "%s must be an object", base);
    }
    int rc = check_schema_fields(p, holder, base);
    if (rc)
        return rc;
    json_t *schema = field(holder, "schema");
    join(where, sizeof where, base, ".schema");
    if (!schema)
        return bad(p, where, "", "%s is required", where);
    if ((rc = schema_grammar(p, schema, where, KIRI_API_FORMAT_JSON_SCHEMA, r)))
        return rc;
    json_t *name = field(holder, "name");
    if (name && !(r->format_name = kiri_mem_strndup(json_string_value(name), json_string_length(name))))
        return oom(p);
    return 0;
}

/* The GBNF extension: text kiri_grammar_check accepts. */
static int parse_grammar(struct parser *p, json_t *g, struct kiri_api_request *r)
{
    if (!json_is_string(g))
        return bad(p, "grammar", "", "grammar must be a string of GBNF text");
    const size_t n = json_string_length(g);
    if (n == 0)
        return bad(p, "grammar", "", "grammar must not be empty");
    if (n > KIRI_GRAMMAR_MAX_SIZE)
        return bad(p, "grammar", "", "grammar has %zu bytes; at most %zu are accepted", n,
                   (size_t)KIRI_GRAMMAR_MAX_SIZE);
    struct kiri_status_info info;
    memset(&info, 0, sizeof info);
    int rc = kiri_grammar_check(json_string_value(g), n, &info);
    if (rc == KIRI_E_NOMEM)
        return oom(p);
    if (rc != KIRI_OK)
        return bad(p, "grammar", "invalid_grammar", "%s%s", strncmp(info.message, "grammar", 7) ? "grammar: " : "",
                   info.message[0] ? info.message : "not a grammar kiri can use");
    if ((rc = copy_string(p, g, &r->grammar)))
        return rc;
    r->grammar_len = n;
    r->format = KIRI_API_FORMAT_GRAMMAR;
    return 0;
}

/* response_format, grammar and json_schema: at most one of them constrains the output. */
static int parse_structured(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    json_t *rf = field(body, "response_format"), *g = field(body, "grammar"), *js = field(body, "json_schema");
    json_t *rf_type = json_is_object(rf) ? json_object_get(rf, "type") : NULL;
    const int rf_text = json_is_string(rf_type) && strcmp(json_string_value(rf_type), "text") == 0;
    const char *set[3];
    int n_set = 0;
    if (rf && !rf_text)
        set[n_set++] = "response_format";
    if (g)
        set[n_set++] = "grammar";
    if (js)
        set[n_set++] = "json_schema";
    if (n_set > 1)
        return bad(p, set[1], "conflicting_parameters", "%s and %s both constrain the output; send one of them",
                   set[0], set[1]);
    if (rf && !rf_text)
        return parse_format(p, rf, "response_format", 0, r);
    if (g)
        return parse_grammar(p, g, r);
    if (js)
        return schema_grammar(p, js, "json_schema", KIRI_API_FORMAT_JSON_SCHEMA, r);
    return 0;
}

static int parse_unsupported(struct parser *p, json_t *body, int kind)
{
    json_t *functions = field(body, "functions");
    if (functions && (!json_is_array(functions) || json_array_size(functions) > 0))
        return unsupported(p, "functions", "functions (use tools)");
    json_t *tools = field(body, "tools");
    if (kind == KIRI_API_COMPLETIONS && tools && (!json_is_array(tools) || json_array_size(tools) > 0))
        return unsupported(p, "tools", "tools in /v1/completions");
    if (kind == KIRI_API_COMPLETIONS) {
        int64_t best_of = 1;
        int rc = read_int(p, body, "best_of", 1, 20, &best_of, NULL);
        if (rc)
            return rc;
        if (best_of != 1)
            return unsupported(p, "best_of", "best_of other than 1");
        json_t *suffix = field(body, "suffix");
        if (suffix && !json_is_string(suffix))
            return bad(p, "suffix", "", "suffix must be a string");
        if (suffix && json_string_length(suffix) > 0)
            return unsupported(p, "suffix", "suffix");
    }
    return 0;
}

static int parse_max_tokens(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    int64_t cap = p->lim->max_tokens_cap > 0 ? p->lim->max_tokens_cap : INT32_MAX;
    static const char *const names[] = {"max_tokens", "max_completion_tokens"};
    for (size_t i = 0; i < 2; i++) {
        json_t *v = field(body, names[i]);
        if (!v)
            continue;
        if (!json_is_integer(v))
            return bad(p, names[i], "", "%s must be an integer", names[i]);
        json_int_t x = json_integer_value(v);
        if (x < 1)
            return bad(p, names[i], "", "%s must be at least 1, got %lld", names[i], (long long)x);
        if (x > cap)
            return bad(p, names[i], "", "%s must be at most %lld (the context length), got %lld",
                       names[i], (long long)cap, (long long)x);
        r->max_tokens = (int32_t)x;
        if (x > r->max_tokens_asked)
            r->max_tokens_asked = (int32_t)x;
    }
    return 0;
}

/* speculative (an extension): "ngram", "draft", "mtp" or "none", true (ngram) or false, or an
 * object {"type": "ngram"|"draft"|"mtp"|"none", "max_draft": 1..KIRI_SPEC_MAX_DRAFT}. */
static int parse_speculative(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    json_t *v = field(body, "speculative");
    if (!v)
        return 0;
    if (json_is_boolean(v)) {
        r->speculative = json_is_true(v) ? KIRI_SPEC_NGRAM : KIRI_SPEC_NONE;
        return 0;
    }
    json_t *type = json_is_object(v) ? field(v, "type") : v;
    if (json_is_object(v) && !type)
        return bad(p, "speculative.type", "", "speculative.type is required: \"ngram\", \"draft\", \"mtp\" or \"none\"");
    if (!json_is_string(type) || (r->speculative = kiri_spec_parse(json_string_value(type))) < 0)
        return bad(p, json_is_object(v) ? "speculative.type" : "speculative", "",
                   "speculative must be \"ngram\", \"draft\", \"mtp\", \"none\", true, false or an object "
                   "{\"type\", \"max_draft\"}");
    json_t *m = json_is_object(v) ? field(v, "max_draft") : NULL;
    if (!m)
        return 0;
    if (!json_is_integer(m) || json_integer_value(m) < 1 || json_integer_value(m) > KIRI_SPEC_MAX_DRAFT)
        return bad(p, "speculative.max_draft", "", "speculative.max_draft must be an integer in [1, %d]",
                   KIRI_SPEC_MAX_DRAFT);
    r->spec_max = (int32_t)json_integer_value(m);
    return 0;
}

static int parse_generation(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    struct kiri_sampling *s = &r->sampling;
    int64_t x;
    int present, rc;
    if ((rc = parse_unsupported(p, body, r->kind)) || (rc = parse_max_tokens(p, body, r)) ||
        (rc = read_float(p, body, "temperature", 0.0, 0, 2.0, &s->temperature)) ||
        (rc = read_float(p, body, "top_p", 0.0, 1, 1.0, &s->top_p)) ||
        (rc = read_float(p, body, "min_p", 0.0, 0, 1.0, &s->min_p)) ||
        (rc = read_float(p, body, "presence_penalty", -2.0, 0, 2.0, &s->presence_penalty)) ||
        (rc = read_float(p, body, "frequency_penalty", -2.0, 0, 2.0, &s->frequency_penalty)) ||
        (rc = read_float(p, body, "repeat_penalty", 0.0, 1, 10.0, &s->repeat_penalty)) ||
        (rc = read_float(p, body, "repetition_penalty", 0.0, 1, 10.0, &s->repeat_penalty)))
        return rc;
    if ((rc = read_int(p, body, "top_k", 0, INT32_MAX, &x, &present)))
        return rc;
    if (present)
        s->top_k = (int32_t)x;
    if ((rc = read_int(p, body, "repeat_last_n", 0, MAX_LAST_N, &x, &present)))
        return rc;
    if (present)
        s->repeat_last_n = (int32_t)x;
    if ((rc = read_int(p, body, "seed", 0, INT64_MAX, &x, &present)))
        return rc;
    if (present) {
        s->seed = (uint64_t)x;
        r->has_seed = 1;
    }
    if ((rc = read_int(p, body, "n", 1, KIRI_API_MAX_N, &x, &present)))
        return rc;
    if (present)
        r->n = (int)x;
    if ((rc = read_int(p, body, "priority", -1000, 1000, &x, &present)))
        return rc;
    if (present)
        r->priority = (int)x;
    if ((rc = parse_stop(p, body, r)) || (rc = read_bool(p, body, "stream", &r->stream)) ||
        (rc = parse_logit_bias(p, body, r)) || (rc = parse_structured(p, body, r)) ||
        (rc = parse_speculative(p, body, r)))
        return rc;
    if (r->kind == KIRI_API_COMPLETIONS) {
        if ((rc = read_bool(p, body, "echo", &r->echo)))
            return rc;
        if ((int64_t)r->n_prompts * r->n > KIRI_API_MAX_CHOICES)
            return bad(p, "n", "", "n = %d for %d prompts asks for %d choices; at most %d are accepted", r->n,
                       r->n_prompts, r->n_prompts * r->n, KIRI_API_MAX_CHOICES);
    }

    json_t *so = field(body, "stream_options");
    if (so) {
        if (!json_is_object(so))
            return bad(p, "stream_options", "", "stream_options must be an object");
        json_t *iu = field(so, "include_usage");
        if (iu && !json_is_boolean(iu))
            return bad(p, "stream_options.include_usage", "",
                       "stream_options.include_usage must be true or false");
        r->include_usage = json_is_true(iu);
    }

    if (r->kind == KIRI_API_COMPLETIONS) {
        /* Legacy: logprobs is the number of alternatives; 0 still returns the chosen tokens'. */
        if ((rc = read_int(p, body, "logprobs", 0, MAX_LEGACY_LOGPROBS, &x, &present)))
            return rc;
        if (present) {
            r->logprobs = 1;
            r->top_logprobs = (int)x;
        }
    } else {
        if ((rc = read_bool(p, body, "logprobs", &r->logprobs)))
            return rc;
        if ((rc = read_int(p, body, "top_logprobs", 0, MAX_TOP_LOGPROBS, &x, &present)))
            return rc;
        if (present) {
            if (x > 0 && !r->logprobs)
                return bad(p, "top_logprobs", "", "top_logprobs requires logprobs to be true");
            r->top_logprobs = (int)x;
        }
    }
    return 0;
}

static void request_defaults(struct kiri_api_request *r, int kind)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
    r->add_special = 1;
    r->max_tokens = -1;
    r->max_tokens_asked = -1;
    r->n = 1;
    /* OpenAI's defaults, not kiri_sampling_default's llama.cpp-like ones. */
    r->sampling.temperature = 1.0f;
    r->sampling.top_k = 0;
    r->sampling.top_p = 1.0f;
    r->sampling.min_p = 0.0f;
    r->sampling.repeat_penalty = 1.0f;
    r->sampling.repeat_last_n = 64;
    r->speculative = -1;
}

static int parse_object(struct parser *p, json_t *body, struct kiri_api_request *r)
{
    int rc;
    switch (r->kind) {
    case KIRI_API_TOKENIZE:
        if ((rc = read_string(p, body, "content", 1, &r->content)) ||
            (rc = read_bool(p, body, "add_special", &r->add_special)))
            return rc;
        return read_bool(p, body, "parse_special", &r->parse_special);
    case KIRI_API_DETOKENIZE: {
        json_t *t = field(body, "tokens");
        if (!t)
            return bad(p, "tokens", "", "tokens is required");
        if (!json_is_array(t))
            return bad(p, "tokens", "", "tokens must be an array of token ids");
        return read_token_ids(p, t, "tokens", &r->tokens, &r->n_tokens);
    }
    case KIRI_API_COMPLETIONS:
    case KIRI_API_CHAT:
        if ((rc = read_string(p, body, "model", 0, &r->model)))
            return rc;
        rc = r->kind == KIRI_API_CHAT ? parse_messages(p, body, r) : parse_prompt(p, body, r);
        if (rc == 0 && r->kind == KIRI_API_CHAT)
            rc = parse_tools(p, body, r);
        return rc ? rc : parse_generation(p, body, r);
    default:
        return bad(p, "", "", "unknown request kind");
    }
}

/* Is this Jansson syntax error about one value's token ("invalid token", "invalid Unicode",
 * "invalid escape", raw control characters in a string) rather than the structure? */
static int value_error(const char *text)
{
    return strncmp(text, "invalid ", 8) == 0 || strncmp(text, "control character", 17) == 0 ||
           strncmp(text, "unexpected newline", 18) == 0;
}

int kiri_api_load(const char *body, size_t len, json_t **root, struct kiri_api_error *err)
{
    struct kiri_api_error scratch;
    struct parser p = {NULL, err ? err : &scratch, NULL, NULL, 0};
    if (!root || (!body && len)) {
        kiri_api_error_set(p.err, 500, "server_error", "", "", "kiri_api_load: bad arguments");
        return KIRI_E_INVALID_ARG;
    }
    *root = NULL;
    use_kiri_allocator();

    char param[64];
    struct scan s;
    scan_body(body, len, len, &s);
    if (s.result != SCAN_OK) {
        scan_param(body, &s, param, sizeof param);
        if (s.result == SCAN_TOO_DEEP)
            return bad(&p, param, "", "invalid JSON: nested deeper than %d levels",
                       KIRI_API_MAX_DEPTH);
        return bad(&p, param, "", "invalid JSON: the integer -0 is not accepted");
    }

    json_error_t je;
    jansson_alloc_failed = 0;
    json_t *v = json_loadb(body ? body : "", len, 0, &je);
    if (jansson_alloc_failed) {
        json_decref(v);
        return oom(&p);
    }
    if (!v) {
        enum json_error_code code = json_error_code(&je);
        param[0] = '\0';
        /* An error inside one value (a bad number, string or literal, or the body ending
         * there) is reported against the top-level field holding it; structural errors name
         * no field. */
        if (code == json_error_numeric_overflow || code == json_error_invalid_utf8 ||
            code == json_error_null_character || code == json_error_premature_end_of_input ||
            (code == json_error_invalid_syntax && value_error(je.text))) {
            scan_body(body, len, je.position > 0 ? (size_t)je.position : 0, &s);
            scan_param(body, &s, param, sizeof param);
        }
        return bad(&p, param, "", "invalid JSON: %s (line %d, column %d)", je.text, je.line,
                   je.column);
    }
    if (!json_is_object(v)) {
        json_decref(v);
        return bad(&p, "", "", "the request body must be a JSON object");
    }
    *root = v;
    return KIRI_OK;
}

int kiri_api_parse_value(json_t *body, int kind, const struct kiri_api_limits *lim,
                         struct kiri_api_request *out, struct kiri_api_error *err)
{
    struct kiri_api_error scratch;
    struct parser p = {lim, err ? err : &scratch, NULL, NULL, 0};
    if (out)
        memset(out, 0, sizeof *out);
    if (!out || !lim || !json_is_object(body)) {
        kiri_api_error_set(p.err, 500, "server_error", "", "", "kiri_api_parse_value: bad arguments");
        return KIRI_E_INVALID_ARG;
    }
    use_kiri_allocator();
    struct kiri_api_request r;
    request_defaults(&r, kind);
    int rc = parse_object(&p, body, &r);
    json_decref(p.messages);
    json_decref(p.call_ids);
    if (rc) {
        kiri_api_request_free(&r);
        return rc;
    }
    *out = r;
    return KIRI_OK;
}

int kiri_api_parse(const char *body, size_t len, int kind, const struct kiri_api_limits *lim,
                   struct kiri_api_request *out, struct kiri_api_error *err)
{
    if (out)
        memset(out, 0, sizeof *out);
    if (!out || !lim) {
        kiri_api_error_set(err, 500, "server_error", "", "", "kiri_api_parse: bad arguments");
        return KIRI_E_INVALID_ARG;
    }
    json_t *root;
    int rc = kiri_api_load(body, len, &root, err);
    if (rc)
        return rc;
    rc = kiri_api_parse_value(root, kind, lim, out, err);
    json_decref(root);
    return rc;
}

int kiri_api_parse_format(json_t *format, const char *param, int flat, struct kiri_api_request *r,
                          struct kiri_api_error *err)
{
    struct kiri_api_error scratch;
    struct parser p = {NULL, err ? err : &scratch, NULL, NULL, 0};
    use_kiri_allocator();
    return parse_format(&p, format, param, flat, r);
}

/* The checks the limits govern, as kiri_api_parse makes them (read_token_ids, parse_messages,
 * parse_max_tokens, parse_logit_bias). */
int kiri_api_within_limits(const struct kiri_api_request *r, const struct kiri_api_limits *lim)
{
    const int64_t cap = lim->max_tokens_cap > 0 ? lim->max_tokens_cap : INT32_MAX;
    const int max_messages = lim->max_messages > 0 ? lim->max_messages : DEFAULT_MAX_MESSAGES;
    if (r->max_tokens_asked > cap || r->n_messages > max_messages)
        return 0;
    for (int i = 0; i < r->n_prompts; i++)
        for (int32_t k = 0; k < r->prompts[i].n_tokens; k++)
            if (r->prompts[i].tokens[k] >= lim->n_vocab)
                return 0;
    for (int32_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] >= lim->n_vocab)
            return 0;
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias_tokens[i] >= lim->n_vocab)
            return 0;
    return 1;
}

void kiri_api_request_free(struct kiri_api_request *r)
{
    if (!r)
        return;
    kiri_mem_free(r->model);
    for (int i = 0; i < r->n_prompts; i++) {
        kiri_mem_free(r->prompts[i].text);
        kiri_mem_free(r->prompts[i].tokens);
    }
    kiri_mem_free(r->prompts);
    for (int i = 0; i < r->n_messages; i++) {
        kiri_mem_free(r->messages[i].role);
        kiri_mem_free(r->messages[i].content);
    }
    kiri_mem_free(r->messages);
    kiri_mem_free(r->content);
    kiri_mem_free(r->tokens);
    for (int i = 0; i < r->n_stop; i++)
        kiri_mem_free(r->stop[i]);
    kiri_mem_free(r->grammar);
    kiri_mem_free(r->format_name);
    kiri_mem_free(r->bias_tokens);
    kiri_mem_free(r->bias_values);
    kiri_mem_free(r->instructions);
    kiri_mem_free(r->tools);
    kiri_mem_free(r->messages_json);
    kiri_mem_free(r->tool_choice_name);
    memset(r, 0, sizeof *r);
}

/* ---------------------------------------------------------------------------------------------
 * Response building. Every helper returns a new reference or NULL when out of memory; the
 * json_*_set_new calls consume their value even when they fail, so one check covers both.
 * ------------------------------------------------------------------------------------------- */

/* A JSON string of s[0..n), repaired to valid UTF-8 when it is not. */
static json_t *jtext(const char *s, size_t n)
{
    if (!s)
        return json_string_nocheck("");
    if (kiri_utf8_valid(s, n))
        return json_stringn_nocheck(s, n);
    size_t m;
    char *fixed = repair_bytes(s, n, &m);
    if (!fixed)
        return NULL;
    json_t *j = json_stringn_nocheck(fixed, m);
    kiri_mem_free(fixed);
    return j;
}

static json_t *jstr_or_null(const char *s)
{
    return s ? jtext(s, strlen(s)) : json_null();
}

/* A log-probability as the double nearest the shortest decimal that reads back as the same
 * float, so JSON_REAL_PRECISION(9) writes "-0.1" rather than "-0.100000001". */
static json_t *jlogprob(float v)
{
    if (!isfinite(v) || v < LOGPROB_FLOOR)
        return json_real(LOGPROB_FLOOR);
    char buf[32];
    for (int prec = 1; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, (double)v);
        if (strtof(buf, NULL) == v)
            return json_real(strtod(buf, NULL));
    }
    return json_real((double)v);
}

static json_t *jbytes(const char *s, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer((unsigned char)s[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static char *dump(json_t *root)
{
    if (!root)
        return NULL;
    char *s = json_dumps(root, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(root);
    return s;
}

/* A new array or object set as o[key]; returns it (borrowed from o) or NULL when out of memory.
 * Creating each child only when attaching it means a failure never strands one. */
static json_t *add_array(json_t *o, const char *key)
{
    json_t *a = json_array();
    return json_object_set_new(o, key, a) ? NULL : a;
}

static json_t *add_object(json_t *o, const char *key)
{
    json_t *a = json_object();
    return json_object_set_new(o, key, a) ? NULL : a;
}

static json_t *usage_json(const struct kiri_api_usage *u)
{
    json_t *o = json_object(), *d = json_object();
    if (!o || !d || json_object_set_new(o, "prompt_tokens", json_integer(u->prompt_tokens)) ||
        json_object_set_new(o, "completion_tokens", json_integer(u->completion_tokens)) ||
        json_object_set_new(o, "total_tokens",
                            json_integer((json_int_t)u->prompt_tokens + u->completion_tokens)) ||
        json_object_set_new(d, "cached_tokens", json_integer(u->cached_tokens))) {
        json_decref(o);
        json_decref(d);
        return NULL;
    }
    if (json_object_set_new(o, "prompt_tokens_details", d)) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* Index of alternative k of token t in the top_* arrays. */
static size_t top_at(const struct kiri_api_choice *c, int t, int k)
{
    return (size_t)t * (size_t)c->n_top + (size_t)k;
}

/* {"token","logprob","bytes"} for alternative k of token t (chat), plus "top_logprobs" when
 * top is set. */
static json_t *chat_lp_entry(const struct kiri_api_choice *c, int t, int k, int top)
{
    const char *tok = k < 0 ? c->lp_tokens[t] : c->top_tokens[top_at(c, t, k)];
    size_t len = k < 0 ? c->lp_token_lens[t] : c->top_token_lens[top_at(c, t, k)];
    float v = k < 0 ? c->lp_values[t] : c->top_values[top_at(c, t, k)];
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "token", jtext(tok, len)) ||
        json_object_set_new(o, "logprob", jlogprob(v)) ||
        json_object_set_new(o, "bytes", jbytes(tok, len)))
        goto fail;
    if (top) {
        json_t *alts = add_array(o, "top_logprobs");
        if (!alts)
            goto fail;
        for (int j = 0; j < c->n_top; j++)
            if (json_array_append_new(alts, chat_lp_entry(c, t, j, 0)))
                goto fail;
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

/* Chat: {"content":[...]}; legacy: {"tokens","token_logprobs","top_logprobs","text_offset"}. */
static json_t *logprobs_json(int kind, const struct kiri_api_choice *c)
{
    if (c->n_logprobs <= 0)
        return json_null();
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (kind == KIRI_API_CHAT) {
        json_t *content = add_array(o, "content");
        if (!content)
            goto fail;
        for (int t = 0; t < c->n_logprobs; t++)
            if (json_array_append_new(content, chat_lp_entry(c, t, -1, 1)))
                goto fail;
        return o;
    }
    json_t *tokens, *values, *tops = NULL, *offsets;
    if (!(tokens = add_array(o, "tokens")) || !(values = add_array(o, "token_logprobs")))
        goto fail;
    if (c->n_top > 0 ? !(tops = add_array(o, "top_logprobs"))
                     : json_object_set_new(o, "top_logprobs", json_null()))
        goto fail;
    if (!(offsets = add_array(o, "text_offset")))
        goto fail;
    size_t offset = 0;
    for (int t = 0; t < c->n_logprobs; t++) {
        const int unscored = t < c->n_unscored;
        if (json_array_append_new(tokens, jtext(c->lp_tokens[t], c->lp_token_lens[t])) ||
            json_array_append_new(values, unscored ? json_null() : jlogprob(c->lp_values[t])) ||
            json_array_append_new(offsets, json_integer((json_int_t)offset)))
            goto fail;
        offset += c->lp_token_lens[t];
        if (c->n_top <= 0)
            continue;
        if (unscored) {
            if (json_array_append_new(tops, json_null()))
                goto fail;
            continue;
        }
        json_t *alts = json_object();
        if (json_array_append_new(tops, alts))
            goto fail;
        for (int k = 0; k < c->n_top; k++) {
            size_t at = top_at(c, t, k);
            json_t *key = jtext(c->top_tokens[at], c->top_token_lens[at]);
            if (!key)
                goto fail;
            /* Two alternatives with the same text: keep the first, the likelier one. */
            int rc = 0;
            if (!json_object_getn(alts, json_string_value(key), json_string_length(key)))
                rc = json_object_setn_new_nocheck(alts, json_string_value(key),
                                                  json_string_length(key),
                                                  jlogprob(c->top_values[at]));
            json_decref(key);
            if (rc)
                goto fail;
        }
    }
    return o;
fail:
    json_decref(o);
    return NULL;
}

/* A tool call as OpenAI writes it: {"index"? , "id", "type", "function": {"name", "arguments"}}
 * with head set (index < 0: none), or {"index", "function": {"arguments": args}} without. */
static json_t *tool_call_json(const struct kiri_tool_call *tc, int index, int head, const char *args,
                              size_t args_len)
{
    json_t *o = json_object(), *fn = json_object();
    if (!o || !fn || (index >= 0 && json_object_set_new(o, "index", json_integer(index)))) {
        json_decref(fn);
        json_decref(o);
        return NULL;
    }
    int bad_ = 0;
    if (head) {
        bad_ |= json_object_set_new(o, "id", jtext(tc->id, strlen(tc->id)));
        bad_ |= json_object_set_new(o, "type", json_string_nocheck("function"));
    }
    bad_ |= json_object_set_new(o, "function", fn);
    if (head)
        bad_ |= json_object_set_new(fn, "name", jtext(tc->name, strlen(tc->name)));
    if (head && index < 0)
        bad_ |= json_object_set_new(fn, "arguments", jtext(tc->arguments, strlen(tc->arguments)));
    else
        bad_ |= json_object_set_new(fn, "arguments", jtext(args ? args : "", args ? args_len : 0));
    if (bad_) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* A stream chunk's delta.tool_calls: one fragment of one call. */
static json_t *delta_call_json(const struct kiri_api_choice *c)
{
    json_t *list = json_array();
    if (list && json_array_append_new(list, tool_call_json(c->delta_call, c->delta_call_index, c->delta_call_head,
                                                            c->delta_args, c->delta_args_len))) {
        json_decref(list);
        return NULL;
    }
    return list;
}

/* One choice of a response (stream = 0) or a chunk (stream = 1). */
static json_t *choice_json(int kind, const struct kiri_api_choice *c, int stream, int first_chunk)
{
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "index", json_integer(c->index)))
        goto fail;
    if (kind == KIRI_API_COMPLETIONS) {
        if (json_object_set_new(o, "text", jtext(c->text, c->text_len)))
            goto fail;
    } else {
        json_t *m = add_object(o, stream ? "delta" : "message");
        if (!m)
            goto fail;
        if (!stream || first_chunk)
            if (json_object_set_new(m, "role", json_string_nocheck("assistant")))
                goto fail;
        if (stream && c->delta_call) {
            if (json_object_set_new(m, "tool_calls", delta_call_json(c)))
                goto fail;
        } else if (!stream && c->n_tool_calls > 0) {
            /* With tool calls, content is null unless the model also wrote text. */
            json_t *calls = json_array();
            if (json_object_set_new(m, "content", c->text_len ? jtext(c->text, c->text_len) : json_null()) ||
                json_object_set_new(m, "tool_calls", calls))
                goto fail;
            for (int k = 0; k < c->n_tool_calls; k++)
                if (json_array_append_new(calls, tool_call_json(&c->tool_calls[k], -1, 1, NULL, 0)))
                    goto fail;
        } else if (!stream || first_chunk || c->text_len > 0 || !c->finish_reason) {
            /* The last chunk of a choice carries finish_reason and an empty delta. */
            if (json_object_set_new(m, "content", jtext(c->text, c->text_len)))
                goto fail;
        }
    }
    if (json_object_set_new(o, "logprobs", logprobs_json(kind, c)) ||
        json_object_set_new(o, "finish_reason", jstr_or_null(c->finish_reason)))
        goto fail;
    return o;
fail:
    json_decref(o);
    return NULL;
}

static json_t *envelope(const char *object, const struct kiri_api_envelope *env)
{
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "id", jstr_or_null(env->id ? env->id : "")) ||
        json_object_set_new(o, "object", json_string_nocheck(object)) ||
        json_object_set_new(o, "created", json_integer(env->created)) ||
        json_object_set_new(o, "model", jstr_or_null(env->model ? env->model : "")) ||
        json_object_set_new(o, "system_fingerprint", jstr_or_null(env->fingerprint))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

static json_t *build(int kind, const char *object, const struct kiri_api_envelope *env,
                     const struct kiri_api_choice *choices, int n_choices,
                     int stream, int first_chunk, const struct kiri_api_usage *usage)
{
    if ((kind != KIRI_API_COMPLETIONS && kind != KIRI_API_CHAT) || n_choices < 0 ||
        (n_choices > 0 && !choices) || !env)
        return NULL;
    json_t *o = envelope(object, env);
    json_t *arr = o ? add_array(o, "choices") : NULL;
    if (!arr) {
        json_decref(o);
        return NULL;
    }
    for (int i = 0; i < n_choices; i++)
        if (json_array_append_new(arr, choice_json(kind, &choices[i], stream, first_chunk))) {
            json_decref(o);
            return NULL;
        }
    if (usage && json_object_set_new(o, "usage", usage_json(usage))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

char *kiri_api_response_json(int kind, const struct kiri_api_envelope *env,
                             const struct kiri_api_choice *choices, int n_choices,
                             const struct kiri_api_usage *usage)
{
    use_kiri_allocator();
    const char *object = kind == KIRI_API_CHAT ? "chat.completion" : "text_completion";
    return dump(build(kind, object, env, choices, n_choices, 0, 0, usage));
}

char *kiri_api_chunk_json(int kind, const struct kiri_api_envelope *env,
                          const struct kiri_api_choice *choices, int n_choices, int first_chunk,
                          const struct kiri_api_usage *usage)
{
    use_kiri_allocator();
    const char *object = kind == KIRI_API_CHAT ? "chat.completion.chunk" : "text_completion";
    return dump(build(kind, object, env, choices, n_choices, 1, first_chunk, usage));
}

/* FNV-1a over the parts, each followed by a NUL so ("ab", "c") and ("a", "bc") differ. */
void kiri_api_fingerprint(const char *backend, const char *model_id, const char *model_sha256,
                          char out[20])
{
    const char *parts[] = {KIRI_VERSION_STRING, backend, model_id, model_sha256};
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const char *s = parts[i] ? parts[i] : "";
        for (size_t k = 0; k <= strlen(s); k++) {
            h ^= (unsigned char)s[k];
            h *= 0x100000001b3ull;
        }
    }
    snprintf(out, 20, "fp_%016llx", (unsigned long long)h);
}

json_t *kiri_api_json_text(const char *s, size_t n)
{
    use_kiri_allocator();
    return jtext(s, n);
}

char *kiri_api_json_dump(json_t *root)
{
    use_kiri_allocator();
    return dump(root);
}

/* A string field of the error record (at most cap bytes, perhaps cut mid-character), or null
 * when empty and nullable. */
static json_t *jfield(const char *s, size_t cap, int nullable)
{
    size_t n = strnlen(s, cap);
    return n == 0 && nullable ? json_null() : jtext(s, n);
}

char *kiri_api_error_json(const struct kiri_api_error *e)
{
    use_kiri_allocator();
    if (!e)
        return NULL;
    json_t *o = json_object(), *inner = json_object();
    if (!o || !inner ||
        json_object_set_new(inner, "message", jfield(e->message, sizeof e->message, 0)) ||
        json_object_set_new(inner, "type", jfield(e->type, sizeof e->type, 0)) ||
        json_object_set_new(inner, "param", jfield(e->param, sizeof e->param, 1)) ||
        json_object_set_new(inner, "code", jfield(e->code, sizeof e->code, 1))) {
        json_decref(o);
        json_decref(inner);
        return NULL;
    }
    if (json_object_set_new(o, "error", inner)) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}

char *kiri_api_models_json(const char *const *ids, int n, int64_t created)
{
    use_kiri_allocator();
    if (n < 0 || (n > 0 && !ids))
        return NULL;
    json_t *o = json_object(), *data;
    if (!o || json_object_set_new(o, "object", json_string_nocheck("list")) ||
        !(data = add_array(o, "data"))) {
        json_decref(o);
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        json_t *m = json_object();
        if (json_array_append_new(data, m) ||
            json_object_set_new(m, "id", jstr_or_null(ids[i] ? ids[i] : "")) ||
            json_object_set_new(m, "object", json_string_nocheck("model")) ||
            json_object_set_new(m, "created", json_integer(created)) ||
            json_object_set_new(m, "owned_by", json_string_nocheck("kiri"))) {
            json_decref(o);
            return NULL;
        }
    }
    return dump(o);
}

char *kiri_api_tokens_json(const int32_t *ids, int n)
{
    use_kiri_allocator();
    if (n < 0 || (n > 0 && !ids))
        return NULL;
    json_t *o = json_object(), *arr;
    if (!o || !(arr = add_array(o, "tokens"))) {
        json_decref(o);
        return NULL;
    }
    for (int i = 0; i < n; i++)
        if (json_array_append_new(arr, json_integer(ids[i]))) {
            json_decref(o);
            return NULL;
        }
    return dump(o);
}

char *kiri_api_content_json(const char *text, size_t len)
{
    use_kiri_allocator();
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "content", jtext(text, len))) {
        json_decref(o);
        return NULL;
    }
    return dump(o);
}
