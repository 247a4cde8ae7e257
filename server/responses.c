/* OpenAI's Responses API (responses.h): a /v1/responses body is checked field by field and
 * rewritten as the chat completion body it stands for, which openai.c then reads with every rule
 * a chat completion has; the response object and stream events are written with Jansson.
 *
 * Why a rewrite rather than a second reader: sampling fields, limits and structured output then
 * follow one set of rules, and a later chat feature (tools) reaches this endpoint by extending
 * the rewrite. Everything the rewrite could get wrong is checked before it, so an error still
 * names the Responses field (the chat reader only sees values already known to be well formed,
 * except the pass-through sampling fields, which have the same names in both APIs).
 */
#include "responses.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "tools.h"

/* Fields read by the chat reader under the same name (kiri's extensions included). */
static const char *const pass_through[] = {
    "model", "temperature", "top_p", "stream", "seed", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repeat_penalty", "repetition_penalty", "repeat_last_n", "priority", "parallel_tool_calls", "speculative",
};

#define DEFAULT_MAX_ITEMS 1024
/* Function calls joined into one assistant message (the chat reader's cap on a message's). */
#define MAX_CALLS_PER_TURN 64

/* ---------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------- */

/* Fills err as a 400 naming param and returns KIRI_E_INVALID_ARG. */
#define refuse(err, param, code, ...) \
    (kiri_api_error_set((err), 400, "invalid_request_error", (param), (code), __VA_ARGS__), KIRI_E_INVALID_ARG)

static int oom(struct kiri_api_error *err)
{
    kiri_api_error_set(err, 500, "server_error", "", "", "out of memory while reading the request");
    return KIRI_E_NOMEM;
}

/* The field's value, or NULL when it is absent or null. */
static json_t *field(json_t *obj, const char *name)
{
    json_t *v = json_object_get(obj, name);
    return json_is_null(v) ? NULL : v;
}

/* Appends {"role": role, "content": content} to messages (content: a new reference, consumed). */
static int add_message(json_t *messages, const char *role, json_t *content, struct kiri_api_error *err)
{
    json_t *m = json_object();
    if (!m) {
        json_decref(content);
        return oom(err);
    }
    if (json_object_set_new(m, "content", content)) {
        json_decref(m);
        return oom(err);
    }
    if (json_object_set_new(m, "role", json_string(role))) {
        json_decref(m);
        return oom(err);
    }
    return json_array_append_new(messages, m) ? oom(err) : 0;
}

static int is_role(const char *role)
{
    static const char *const roles[] = {"user", "system", "developer", "assistant"};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(role, roles[i]) == 0)
            return 1;
    return 0;
}

/* A message item's content (or a function_call_output's output, by key): a string, or input_text
 * / output_text parts, as chat content. */
static int item_content(json_t *item, size_t i, const char *key, json_t **out, struct kiri_api_error *err)
{
    char param[64];
    snprintf(param, sizeof param, "input[%zu].%s", i, key);
    json_t *c = field(item, key);
    if (!c)
        return refuse(err, param, "", "%s is required", param);
    if (json_is_string(c)) {
        *out = json_incref(c);
        return 0;
    }
    if (!json_is_array(c))
        return refuse(err, param, "", "%s must be a string or an array of content parts", param);
    json_t *parts = json_array();
    if (!parts)
        return oom(err);
    for (size_t j = 0; j < json_array_size(c); j++) {
        json_t *part = json_array_get(c, j), *type = json_is_object(part) ? json_object_get(part, "type") : NULL;
        snprintf(param, sizeof param, "input[%zu].%s[%zu].type", i, key, j);
        int rc = 0;
        if (!json_is_string(type))
            rc = refuse(err, param, "", "%s must be a string", param);
        else if (strcmp(json_string_value(type), "input_text") != 0 &&
                 strcmp(json_string_value(type), "output_text") != 0)
            rc = refuse(err, param, "unsupported_value", "unsupported content part type '%.32s' (input_text or "
                        "output_text)", json_string_value(type));
        json_t *text = rc ? NULL : json_object_get(part, "text");
        if (!rc && !json_is_string(text)) {
            snprintf(param, sizeof param, "input[%zu].%s[%zu].text", i, key, j);
            rc = refuse(err, param, "", "%s must be a string", param);
        }
        json_t *p = rc ? NULL : json_object();
        if (!rc && (!p || json_object_set_new(p, "type", json_string("text")) || json_object_set(p, "text", text))) {
            json_decref(p);
            rc = oom(err);
        } else if (!rc && json_array_append_new(parts, p)) { /* which consumed p */
            rc = oom(err);
        }
        if (rc) {
            json_decref(parts);
            return rc;
        }
    }
    *out = parts;
    return 0;
}

/* tools: Responses' flat function tools ({"type":"function","name","description","parameters",
 * "strict"}) as chat's {"type":"function","function":{...}}. The chat reader then checks names and
 * schemas; its errors are renamed back (kiri_responses_param). strict is accepted and changes nothing:
 * the grammar always holds the arguments to the schema. */
static int rewrite_tools(json_t *body, json_t *chat, struct kiri_api_error *err)
{
    json_t *tools = field(body, "tools");
    if (!tools)
        return 0;
    if (!json_is_array(tools))
        return refuse(err, "tools", "", "tools must be an array of {\"type\": \"function\", \"name\", ...}");
    json_t *list = json_array();
    if (!list || json_object_set_new(chat, "tools", list))
        return oom(err);
    char param[64];
    for (size_t i = 0; i < json_array_size(tools); i++) {
        json_t *t = json_array_get(tools, i), *type = json_is_object(t) ? json_object_get(t, "type") : NULL;
        snprintf(param, sizeof param, "tools[%zu]", i);
        if (!json_is_object(t))
            return refuse(err, param, "", "%s must be {\"type\": \"function\", \"name\", \"parameters\", ...}", param);
        snprintf(param, sizeof param, "tools[%zu].type", i);
        if (!json_is_string(type))
            return refuse(err, param, "", "%s must be a string", param);
        if (strcmp(json_string_value(type), "function") != 0)
            return refuse(err, param, "unsupported_value", "tool type '%.32s' is not supported (only \"function\")",
                          json_string_value(type));
        json_t *fn = json_object();
        if (!fn || json_array_append_new(list, json_pack("{s:s,s:o}", "type", "function", "function", fn)))
            return oom(err);
        static const char *const keys[] = {"name", "description", "parameters"};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
            json_t *v = json_object_get(t, keys[k]);
            if (v && json_object_set(fn, keys[k], v))
                return oom(err);
        }
    }
    return 0;
}

/* tool_choice: "none", "auto", "required" or {"type":"function","name"}, as chat's. */
static int rewrite_tool_choice(json_t *body, json_t *chat, struct kiri_api_error *err)
{
    json_t *tc = field(body, "tool_choice");
    if (!tc)
        return 0;
    if (json_is_string(tc))
        return json_object_set(chat, "tool_choice", tc) ? oom(err) : 0;
    json_t *type = json_object_get(tc, "type"), *name = json_object_get(tc, "name");
    if (!json_is_object(tc) || !json_is_string(type) || strcmp(json_string_value(type), "function") != 0 ||
        !json_is_string(name))
        return refuse(err, "tool_choice", "", "tool_choice must be \"none\", \"auto\", \"required\" or "
                      "{\"type\": \"function\", \"name\": ...}");
    json_t *c = json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", name);
    return !c || json_object_set_new(chat, "tool_choice", c) ? oom(err) : 0;
}

void kiri_responses_param(char *param)
{
    char *fn = param && strncmp(param, "tools[", 6) == 0 ? strstr(param, "].function") : NULL;
    if (fn)
        memmove(fn + 1, fn + 10, strlen(fn + 10) + 1);
}

/* A function_call item: the call in chat's form, appended to the assistant message just before
 * (consecutive calls, and a message item followed by calls, are one assistant turn) or to a new
 * one. Its call_id is remembered in call_ids for the outputs that answer it. */
static int function_call_item(json_t *item, size_t i, json_t *messages, json_t *call_ids,
                              struct kiri_api_error *err)
{
    char param[64];
    json_t *id = field(item, "call_id"), *name = field(item, "name"), *args = field(item, "arguments");
    snprintf(param, sizeof param, "input[%zu].call_id", i);
    if (!json_is_string(id) || json_string_length(id) == 0)
        return refuse(err, param, "", "%s must be a non-empty string", param);
    snprintf(param, sizeof param, "input[%zu].name", i);
    if (!json_is_string(name) || json_string_length(name) == 0)
        return refuse(err, param, "", "%s must be a non-empty string", param);
    snprintf(param, sizeof param, "input[%zu].arguments", i);
    if (!json_is_string(args))
        return refuse(err, param, "", "%s must be a string of JSON", param);
    json_t *last = json_array_get(messages, json_array_size(messages) - 1);
    json_t *calls = json_object_get(last, "tool_calls");
    if (!calls || json_array_size(calls) >= MAX_CALLS_PER_TURN) {
        const char *role = json_string_value(json_object_get(last, "role"));
        if (!role || strcmp(role, "assistant") != 0 || calls) {
            int rc = add_message(messages, "assistant", json_string(""), err);
            if (rc)
                return rc;
            last = json_array_get(messages, json_array_size(messages) - 1);
        }
        if (!(calls = json_array()) || json_object_set_new(last, "tool_calls", calls))
            return oom(err);
    }
    json_t *c = json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function", "name", name,
                          "arguments", args);
    if (!c || json_array_append_new(calls, c) || json_object_set_new(call_ids, json_string_value(id), json_true()))
        return oom(err);
    return 0;
}

/* A function_call_output item: a tool message answering a call made earlier in input. */
static int function_output_item(json_t *item, size_t i, json_t *messages, json_t *call_ids,
                                struct kiri_api_error *err)
{
    char param[64];
    json_t *id = field(item, "call_id");
    snprintf(param, sizeof param, "input[%zu].call_id", i);
    if (!json_is_string(id))
        return refuse(err, param, "", "%s must be a string", param);
    if (!json_object_get(call_ids, json_string_value(id)))
        return refuse(err, param, "", "%s '%.64s' matches no function_call item earlier in input", param,
                      json_string_value(id));
    json_t *content = NULL;
    int rc = item_content(item, i, "output", &content, err);
    if (rc || (rc = add_message(messages, "tool", content, err)))
        return rc;
    json_t *m = json_array_get(messages, json_array_size(messages) - 1);
    return json_object_set(m, "tool_call_id", id) ? oom(err) : 0;
}

/* input (and instructions before it) as chat messages; call_ids collects the function calls'. */
static int input_items(json_t *body, const struct kiri_api_limits *lim, json_t *messages, json_t *call_ids,
                       struct kiri_api_error *err)
{
    json_t *instr = field(body, "instructions");
    if (instr && !json_is_string(instr))
        return refuse(err, "instructions", "", "instructions must be a string");
    int rc;
    if (instr && json_string_length(instr) > 0 && (rc = add_message(messages, "system", json_incref(instr), err)))
        return rc;
    json_t *input = field(body, "input");
    if (!input)
        return refuse(err, "input", "", "input is required");
    if (json_is_string(input))
        return add_message(messages, "user", json_incref(input), err);
    if (!json_is_array(input))
        return refuse(err, "input", "", "input must be a string or an array of input items");
    const size_t n = json_array_size(input);
    const size_t cap = lim->max_messages > 0 ? (size_t)lim->max_messages : DEFAULT_MAX_ITEMS;
    if (n == 0)
        return refuse(err, "input", "", "input must not be empty");
    if (n + (instr ? 1 : 0) > cap)
        return refuse(err, "input", "", "input has %zu items; at most %zu are accepted", n, cap - (instr ? 1 : 0));
    char param[64];
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_array_get(input, i);
        snprintf(param, sizeof param, "input[%zu]", i);
        if (!json_is_object(item))
            return refuse(err, param, "", "%s must be an object", param);
        json_t *type = field(item, "type");
        snprintf(param, sizeof param, "input[%zu].type", i);
        if (type && !json_is_string(type))
            return refuse(err, param, "", "%s must be a string", param);
        const char *t = type ? json_string_value(type) : "message";
        if (strcmp(t, "reasoning") == 0)
            continue;
        if (strcmp(t, "item_reference") == 0)
            return refuse(err, param, "unsupported_parameter",
                          "item references need stored responses; this server is stateless: send the items");
        if (strcmp(t, "function_call") == 0 || strcmp(t, "function_call_output") == 0) {
            rc = t[13] ? function_output_item(item, i, messages, call_ids, err)
                       : function_call_item(item, i, messages, call_ids, err);
            if (rc)
                return rc;
            continue;
        }
        if (strcmp(t, "message") != 0)
            return refuse(err, param, "unsupported_value", "unsupported input item type '%.32s'", t);
        json_t *role = field(item, "role");
        snprintf(param, sizeof param, "input[%zu].role", i);
        if (!json_is_string(role))
            return refuse(err, param, "", "%s must be a string", param);
        if (!is_role(json_string_value(role)))
            return refuse(err, param, "", "unknown role '%.32s' (user, system, developer or assistant)",
                          json_string_value(role));
        json_t *content = NULL;
        if ((rc = item_content(item, i, "content", &content, err)) ||
            (rc = add_message(messages, json_string_value(role), content, err)))
            return rc;
    }
    if (json_array_size(messages) == 0)
        return refuse(err, "input", "", "input holds no message");
    return 0;
}

static int input_messages(json_t *body, const struct kiri_api_limits *lim, json_t *messages,
                          struct kiri_api_error *err)
{
    json_t *call_ids = json_object();
    const int rc = call_ids ? input_items(body, lim, messages, call_ids, err) : oom(err);
    json_decref(call_ids);
    return rc;
}

/* The stateless server's refusals: nothing is stored, so nothing can be continued. */
static int check_stateless(json_t *body, struct kiri_api_error *err)
{
    static const char *const stored[] = {"previous_response_id", "conversation"};
    for (size_t i = 0; i < sizeof stored / sizeof stored[0]; i++)
        if (field(body, stored[i]))
            return refuse(err, stored[i], "unsupported_parameter",
                          "%s needs stored responses; this server is stateless: send the whole conversation in input",
                          stored[i]);
    json_t *store = field(body, "store"), *bg = field(body, "background");
    if (store && !json_is_boolean(store))
        return refuse(err, "store", "", "store must be true or false");
    if (bg && !json_is_boolean(bg))
        return refuse(err, "background", "", "background must be true or false");
    if (json_is_true(bg))
        return refuse(err, "background", "unsupported_parameter",
                      "background responses need stored responses; this server is stateless");
    return 0;
}

/* max_output_tokens, checked here so the error names it, then read as max_completion_tokens. */
static int output_limit(json_t *body, const struct kiri_api_limits *lim, json_t *chat, struct kiri_api_error *err)
{
    json_t *v = field(body, "max_output_tokens");
    if (!v)
        return 0;
    const json_int_t cap = lim->max_tokens_cap > 0 ? lim->max_tokens_cap : INT32_MAX;
    if (!json_is_integer(v))
        return refuse(err, "max_output_tokens", "", "max_output_tokens must be an integer");
    if (json_integer_value(v) < 1 || json_integer_value(v) > cap)
        return refuse(err, "max_output_tokens", "", "max_output_tokens must be between 1 and %lld (the context "
                      "length), got %lld", (long long)cap, (long long)json_integer_value(v));
    return json_object_set(chat, "max_completion_tokens", v) ? oom(err) : 0;
}

static int rewrite(json_t *body, const struct kiri_api_limits *lim, json_t *chat, struct kiri_api_error *err)
{
    int rc;
    if ((rc = check_stateless(body, err)) || (rc = rewrite_tools(body, chat, err)) ||
        (rc = rewrite_tool_choice(body, chat, err)) || (rc = output_limit(body, lim, chat, err)))
        return rc;
    for (size_t i = 0; i < sizeof pass_through / sizeof pass_through[0]; i++) {
        json_t *v = json_object_get(body, pass_through[i]);
        if (v && json_object_set(chat, pass_through[i], v))
            return oom(err);
    }
    json_t *messages = json_array();
    if (!messages || json_object_set_new(chat, "messages", messages))
        return oom(err);
    return input_messages(body, lim, messages, err);
}

/* text: {"format": {...}, "verbosity": ...}; only the format matters here. */
static int read_text(json_t *body, struct kiri_api_request *r, struct kiri_api_error *err)
{
    json_t *text = field(body, "text");
    if (!text)
        return 0;
    if (!json_is_object(text))
        return refuse(err, "text", "", "text must be an object");
    json_t *format = field(text, "format");
    return format ? kiri_api_parse_format(format, "text.format", 1, r, err) : 0;
}

int kiri_responses_parse(const char *body, size_t len, const struct kiri_api_limits *lim,
                         struct kiri_api_request *out, struct kiri_api_error *err)
{
    struct kiri_api_error scratch;
    if (!err)
        err = &scratch;
    if (out)
        memset(out, 0, sizeof *out);
    if (!out || !lim) {
        kiri_api_error_set(err, 500, "server_error", "", "", "kiri_responses_parse: bad arguments");
        return KIRI_E_INVALID_ARG;
    }
    json_t *root;
    int rc = kiri_api_load(body, len, &root, err);
    if (rc)
        return rc;
    json_t *chat = json_object();
    rc = chat ? rewrite(root, lim, chat, err) : oom(err);
    struct kiri_api_request r;
    memset(&r, 0, sizeof r);
    if (!rc && (rc = kiri_api_parse_value(chat, KIRI_API_CHAT, lim, &r, err)) != 0) {
        if (strncmp(err->param, "messages", 8) == 0)
            snprintf(err->param, sizeof err->param, "input"); /* not reached for items checked above */
        kiri_responses_param(err->param);
    }
    if (!rc && (rc = read_text(root, &r, err)) == 0) {
        json_t *instr = field(root, "instructions");
        if (instr && !(r.instructions = kiri_mem_strndup(json_string_value(instr), json_string_length(instr))))
            rc = oom(err);
    }
    json_decref(chat);
    json_decref(root);
    if (rc) {
        kiri_api_request_free(&r);
        return rc;
    }
    r.kind = KIRI_API_RESPONSES;
    *out = r;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Writing. Every helper returns a new reference or NULL when out of memory; json_*_set_new
 * consumes its value even when it fails, so one check covers both.
 * ------------------------------------------------------------------------------------------- */

static json_t *jstr(const char *s)
{
    return s ? kiri_api_json_text(s, strlen(s)) : json_null();
}

static json_t *jreal(double x)
{
    /* The request's floats as the shortest decimal (0.7f reads 0.7, not 0.699999988). */
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", x);
    return json_real(strtod(buf, NULL));
}

static const char *status_name(int status)
{
    switch (status) {
    case KIRI_RESPONSES_COMPLETED: return "completed";
    case KIRI_RESPONSES_INCOMPLETE: return "incomplete";
    case KIRI_RESPONSES_FAILED: return "failed";
    default: return "in_progress";
    }
}

/* {"type":"output_text","text","annotations":[],"logprobs":[]} */
static json_t *text_part(const char *text, size_t len)
{
    json_t *p = json_object();
    if (!p || json_object_set_new(p, "type", json_string("output_text")) ||
        json_object_set_new(p, "text", kiri_api_json_text(text, len)) ||
        json_object_set_new(p, "annotations", json_array()) || json_object_set_new(p, "logprobs", json_array())) {
        json_decref(p);
        return NULL;
    }
    return p;
}

/* The message item; with_text: its one output_text part, else no content yet. */
static json_t *message_item(const struct kiri_responses_state *st, int with_text)
{
    json_t *m = json_object(), *content = json_array();
    if (!m || !content || json_object_set_new(m, "type", json_string("message")) ||
        json_object_set_new(m, "id", jstr(st->item_id)) ||
        json_object_set_new(m, "status", json_string(status_name(st->status))) ||
        json_object_set_new(m, "role", json_string("assistant"))) {
        json_decref(m);
        json_decref(content);
        return NULL;
    }
    if (json_object_set_new(m, "content", content) ||
        (with_text && json_array_append_new(content, text_part(st->text, st->text_len)))) {
        json_decref(m);
        return NULL;
    }
    return m;
}

/* Call k's output_index: after the message item when that comes first. */
static int call_index(const struct kiri_responses_state *st, int k)
{
    return k + (!st->no_message && st->message_index <= k);
}

/* {"type":"function_call","id":"fc_...","call_id","name","arguments","status"}; in_progress: as
 * first streamed, with no arguments yet. */
static json_t *call_item(const struct kiri_responses_state *st, int k, int in_progress)
{
    const struct kiri_tool_call *tc = &st->calls[k];
    const char *suffix = strncmp(tc->id, "call_", 5) == 0 ? tc->id + 5 : tc->id;
    char id[sizeof tc->id + 4];
    snprintf(id, sizeof id, "fc_%s", suffix);
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "type", json_string("function_call")) ||
        json_object_set_new(o, "id", jstr(id)) || json_object_set_new(o, "call_id", jstr(tc->id)) ||
        json_object_set_new(o, "name", jstr(tc->name)) ||
        json_object_set_new(o, "arguments", jstr(in_progress ? "" : tc->arguments)) ||
        json_object_set_new(o, "status", json_string(in_progress ? "in_progress" : "completed"))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* The output items of a finished response, in output_index order. */
static json_t *output_json(const struct kiri_responses_state *st)
{
    json_t *out = json_array();
    const int n_calls = st->calls ? st->n_calls : 0;
    for (int k = 0; out && k <= n_calls; k++) {
        if (!st->no_message && st->message_index == k && json_array_append_new(out, message_item(st, 1)))
            goto fail;
        if (k < n_calls && json_array_append_new(out, call_item(st, k, 0)))
            goto fail;
    }
    return out;
fail:
    json_decref(out);
    return NULL;
}

/* The request's tools in the Responses form (they were read as chat's nested form). */
static json_t *tools_json(const struct kiri_api_request *r)
{
    json_t *out = json_array();
    json_t *chat = r && r->tools ? json_loadb(r->tools, r->tools_len, 0, NULL) : NULL;
    for (size_t i = 0; out && i < json_array_size(chat); i++) {
        json_t *fn = json_object_get(json_array_get(chat, i), "function");
        json_t *t = json_pack("{s:s,s:O,s:O,s:b}", "type", "function", "name", json_object_get(fn, "name"),
                              "parameters", field(fn, "parameters") ? field(fn, "parameters") : json_null(),
                              "strict", 1);
        if (!t || (field(fn, "description") && json_object_set(t, "description", field(fn, "description")))) {
            json_decref(t);
            t = NULL;
        }
        if (!t || json_array_append_new(out, t)) { /* which consumed t */
            json_decref(out);
            out = NULL;
        }
    }
    json_decref(chat);
    return out;
}

static json_t *tool_choice_json(const struct kiri_api_request *r)
{
    if (!r || !r->tools || r->tool_choice == KIRI_TOOL_CHOICE_NONE)
        return json_string("none");
    if (r->tool_choice == KIRI_TOOL_CHOICE_NAMED)
        return json_pack("{s:s,s:s}", "type", "function", "name", r->tool_choice_name ? r->tool_choice_name : "");
    return json_string(r->tool_choice == KIRI_TOOL_CHOICE_REQUIRED ? "required" : "auto");
}

/* A new object set as o[key]; returns it (borrowed from o) or NULL when out of memory. */
static json_t *add_object(json_t *o, const char *key)
{
    json_t *a = json_object();
    return json_object_set_new(o, key, a) ? NULL : a;
}

static json_t *usage_json(const struct kiri_api_usage *u)
{
    json_t *o = json_object(), *in, *out;
    if (!o || json_object_set_new(o, "input_tokens", json_integer(u->prompt_tokens)) ||
        !(in = add_object(o, "input_tokens_details")) ||
        json_object_set_new(in, "cached_tokens", json_integer(u->cached_tokens)) ||
        json_object_set_new(o, "output_tokens", json_integer(u->completion_tokens)) ||
        !(out = add_object(o, "output_tokens_details")) ||
        json_object_set_new(out, "reasoning_tokens", json_integer(0)) ||
        json_object_set_new(o, "total_tokens", json_integer((json_int_t)u->prompt_tokens + u->completion_tokens))) {
        json_decref(o);
        return NULL;
    }
    return o;
}

/* text: {"format": {"type": ...}} as the request asked. */
static json_t *text_json(const struct kiri_api_request *r)
{
    const char *type = r->format == KIRI_API_FORMAT_JSON_OBJECT   ? "json_object"
                       : r->format == KIRI_API_FORMAT_JSON_SCHEMA ? "json_schema"
                                                                  : "text";
    json_t *t = json_object(), *f = json_object();
    if (!t || !f || json_object_set_new(f, "type", json_string(type)) ||
        (r->format_name && json_object_set_new(f, "name", jstr(r->format_name)))) {
        json_decref(t);
        json_decref(f);
        return NULL;
    }
    if (json_object_set_new(t, "format", f)) {
        json_decref(t);
        return NULL;
    }
    return t;
}

static json_t *error_json(const struct kiri_responses_state *st)
{
    if (st->status != KIRI_RESPONSES_FAILED)
        return json_null();
    if (st->grammar_error)
        return json_pack("{s:s,s:s}", "code", "unsupported_grammar", "message", st->grammar_error);
    return json_pack("{s:s,s:s}", "code", "server_error", "message", "the model failed while generating");
}

static json_t *incomplete_json(int status)
{
    return status == KIRI_RESPONSES_INCOMPLETE ? json_pack("{s:s}", "reason", "max_output_tokens") : json_null();
}

static json_t *response_object(const struct kiri_responses_state *st)
{
    const struct kiri_api_request *r = st->r;
    const int finished = st->status != KIRI_RESPONSES_IN_PROGRESS;
    json_t *o = json_object();
    if (!o)
        return NULL;
    if (json_object_set_new(o, "id", jstr(st->id)) || json_object_set_new(o, "object", json_string("response")) ||
        json_object_set_new(o, "created_at", json_integer(st->created)) ||
        json_object_set_new(o, "status", json_string(status_name(st->status))) ||
        json_object_set_new(o, "error", error_json(st)) ||
        json_object_set_new(o, "incomplete_details", incomplete_json(st->status)) ||
        json_object_set_new(o, "instructions", jstr(r ? r->instructions : NULL)) ||
        json_object_set_new(o, "max_output_tokens",
                            r && r->max_tokens > 0 ? json_integer(r->max_tokens) : json_null()) ||
        json_object_set_new(o, "model", jstr(st->model ? st->model : "")) ||
        json_object_set_new(o, "output", finished ? output_json(st) : json_array()) ||
        json_object_set_new(o, "parallel_tool_calls", json_boolean(r && r->tools && r->parallel_tool_calls)) ||
        json_object_set_new(o, "previous_response_id", json_null()) ||
        json_object_set_new(o, "store", json_false()) ||
        json_object_set_new(o, "temperature", jreal(r ? r->sampling.temperature : 1.0)) ||
        json_object_set_new(o, "top_p", jreal(r ? r->sampling.top_p : 1.0)) ||
        json_object_set_new(o, "text", r ? text_json(r) : json_object()) ||
        json_object_set_new(o, "tool_choice", tool_choice_json(r)) || json_object_set_new(o, "tools", tools_json(r)) ||
        json_object_set_new(o, "truncation", json_string("disabled")) ||
        json_object_set_new(o, "metadata", json_object()) ||
        json_object_set_new(o, "usage", finished && st->has_usage ? usage_json(&st->usage) : json_null()))
        goto fail;
    return o;
fail:
    json_decref(o);
    return NULL;
}

char *kiri_responses_json(const struct kiri_responses_state *st)
{
    return st ? kiri_api_json_dump(response_object(st)) : NULL;
}

char *kiri_responses_event_json(int event, int64_t sequence, const struct kiri_responses_state *st,
                                const char *delta, size_t delta_len, const char **type)
{
    static const char *const names[] = {
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    };
    if (!st || event < 0 || event > KIRI_RESPONSES_EV_FINISHED)
        return NULL;
    const char *name = names[event];
    if (event == KIRI_RESPONSES_EV_FINISHED)
        name = st->status == KIRI_RESPONSES_FAILED       ? "response.failed"
               : st->status == KIRI_RESPONSES_INCOMPLETE ? "response.incomplete"
                                                         : "response.completed";
    if (type)
        *type = name;
    json_t *o = json_object();
    if (!o || json_object_set_new(o, "type", json_string(name)) ||
        json_object_set_new(o, "sequence_number", json_integer(sequence)))
        goto fail;
    int rc = 0;
    switch (event) {
    case KIRI_RESPONSES_EV_CREATED:
    case KIRI_RESPONSES_EV_IN_PROGRESS:
    case KIRI_RESPONSES_EV_FINISHED:
        rc = json_object_set_new(o, "response", response_object(st));
        break;
    case KIRI_RESPONSES_EV_ITEM_ADDED:
    case KIRI_RESPONSES_EV_ITEM_DONE:
        rc = json_object_set_new(o, "output_index", json_integer(st->message_index)) ||
             json_object_set_new(o, "item", message_item(st, event == KIRI_RESPONSES_EV_ITEM_DONE));
        break;
    default:
        /* The part and text events point at the one part of the one item. */
        rc = json_object_set_new(o, "item_id", jstr(st->item_id)) ||
             json_object_set_new(o, "output_index", json_integer(st->message_index)) ||
             json_object_set_new(o, "content_index", json_integer(0));
        if (rc)
            break;
        if (event == KIRI_RESPONSES_EV_PART_ADDED)
            rc = json_object_set_new(o, "part", text_part("", 0));
        else if (event == KIRI_RESPONSES_EV_PART_DONE)
            rc = json_object_set_new(o, "part", text_part(st->text, st->text_len));
        else if (event == KIRI_RESPONSES_EV_TEXT_DELTA)
            rc = json_object_set_new(o, "delta", kiri_api_json_text(delta, delta_len)) ||
                 json_object_set_new(o, "logprobs", json_array());
        else
            rc = json_object_set_new(o, "text", kiri_api_json_text(st->text, st->text_len)) ||
                 json_object_set_new(o, "logprobs", json_array());
        break;
    }
    if (rc)
        goto fail;
    return kiri_api_json_dump(o);
fail:
    json_decref(o);
    return NULL;
}

char *kiri_responses_call_event_json(int event, int64_t sequence, const struct kiri_responses_state *st, int k,
                                     const char **type)
{
    static const char *const names[] = {
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
    };
    if (!st || !st->calls || k < 0 || k >= st->n_calls || event < 0 || event > KIRI_RESPONSES_EV_CALL_DONE)
        return NULL;
    if (type)
        *type = names[event];
    const struct kiri_tool_call *tc = &st->calls[k];
    json_t *o = json_object(), *item = call_item(st, k, event == KIRI_RESPONSES_EV_CALL_ADDED);
    if (!o || !item || json_object_set_new(o, "type", json_string(names[event])) ||
        json_object_set_new(o, "sequence_number", json_integer(sequence)) ||
        json_object_set_new(o, "output_index", json_integer(call_index(st, k))))
        goto fail;
    int rc;
    if (event == KIRI_RESPONSES_EV_CALL_ADDED || event == KIRI_RESPONSES_EV_CALL_DONE) {
        rc = json_object_set_new(o, "item", item);
        item = NULL;
    } else {
        rc = json_object_set(o, "item_id", json_object_get(item, "id")) ||
             json_object_set_new(o, event == KIRI_RESPONSES_EV_CALL_ARGS_DELTA ? "delta" : "arguments",
                                 jstr(tc->arguments));
    }
    if (rc)
        goto fail;
    json_decref(item);
    return kiri_api_json_dump(o);
fail:
    json_decref(item);
    json_decref(o);
    return NULL;
}
