/* Chat templates: rendering a conversation given as JSON (kiri_chat_template_render_json in
 * chat_template.h). The JSON is read with Jansson and turned into the template's values as
 * Python's json.loads would give them to jinja2: objects become dicts in their key order, arrays
 * lists, integers ints, other numbers floats, true/false bools, null none. This is how messages
 * with tool_calls (arguments as a dict), tool results and the tools list reach a template, as
 * transformers' apply_chat_template passes them.
 *
 * Built only where Jansson is (CMake adds this file to kiri_template when it finds it).
 */
#include "chat_template.h"

#include <jansson.h>
#include <string.h>

#include "chat_template_eval.h"
#include "chat_template_text.h"
#include "chat_template_value.h"
#include "error.h"
#include "kiri.h"

/* Deeper JSON than this is refused; a message or a tool schema needs far less. */
#define MAX_JSON_DEPTH 64

/* The template value for JSON value j (whose strings Jansson keeps, valid for the render). */
static int to_value(struct kiri_chat_render *r, json_t *j, int depth, struct kiri_chat_value *out)
{
    if (depth > MAX_JSON_DEPTH)
        return kiri_chat_fail_code(r, KIRI_E_INVALID_ARG, "messages",
                                   "chat template: JSON nested deeper than %d levels", MAX_JSON_DEPTH);
    if (kiri_chat_step(r, 1) < 0)
        return -1;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        if (kiri_chat_new_dict(r, 0, out) < 0)
            return -1;
        const char *key;
        json_t *v;
        json_object_foreach(j, key, v) {
            struct kiri_chat_value item;
            if (to_value(r, v, depth + 1, &item) < 0 ||
                kiri_chat_dict_set(r, out->u.dict, kiri_chat_str(key, strlen(key)), item) < 0)
                return -1;
        }
        return 0;
    }
    case JSON_ARRAY: {
        const size_t n = json_array_size(j);
        if (kiri_chat_new_list(r, n, 0, out) < 0)
            return -1;
        for (size_t i = 0; i < n; i++)
            if (to_value(r, json_array_get(j, i), depth + 1, &out->u.list->v[i]) < 0)
                return -1;
        return 0;
    }
    case JSON_STRING:
        *out = kiri_chat_str(json_string_value(j), json_string_length(j));
        return 0;
    case JSON_INTEGER:
        *out = kiri_chat_int((int64_t)json_integer_value(j));
        return 0;
    case JSON_REAL:
        *out = kiri_chat_float(json_real_value(j));
        return 0;
    case JSON_TRUE:
        *out = kiri_chat_bool(1);
        return 0;
    case JSON_FALSE:
        *out = kiri_chat_bool(0);
        return 0;
    default:
        out->type = KIRI_CHAT_TYPE_NONE;
        return 0;
    }
}

struct json_binder {
    json_t *messages, *tools; /* borrowed; tools NULL for none */
    json_t *vars;             /* borrowed: an object of further variables, or NULL */
    const char *bos, *eos;
    int add_generation_prompt;
};

static int bind_json(struct kiri_chat_render *r, void *user, struct kiri_chat_binding *vars)
{
    const struct json_binder *jb = user;
    struct kiri_chat_value messages, tools = {KIRI_CHAT_TYPE_NONE, {0}};
    if (to_value(r, jb->messages, 0, &messages) < 0 || (jb->tools && to_value(r, jb->tools, 0, &tools) < 0))
        return -1;
    int n = 0;
    const char *key;
    json_t *v;
    if (jb->vars)
        json_object_foreach(jb->vars, key, v) {
            struct kiri_chat_value x;
            if (to_value(r, v, 1, &x) < 0)
                return -1;
            vars[n++] = (struct kiri_chat_binding){key, x};
        }
    vars[n++] = (struct kiri_chat_binding){"messages", messages};
    vars[n++] = (struct kiri_chat_binding){"tools", tools};
    return n + kiri_chat_bind_common(jb->bos, jb->eos, jb->add_generation_prompt, vars + n);
}

static json_t *load(const char *text, size_t len, const char *field, struct kiri_status_info *info)
{
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!j)
        kiri_error_at(info, KIRI_E_INVALID_ARG, field, -1, "chat template: %s is not JSON: %s (line %d)",
                      field, je.text, je.line);
    return j;
}

/* The names every render binds itself; further variables may not take them. */
static int reserved_name(const char *k)
{
    static const char *const names[] = {"messages", "tools", "add_generation_prompt", "documents",
                                        "bos_token", "eos_token"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(k, names[i]))
            return 1;
    return 0;
}

int kiri_chat_template_render_json(const struct kiri_chat_template *t, const char *messages,
                                   size_t messages_len, const char *tools, size_t tools_len,
                                   const char *bos_token, const char *eos_token, int add_generation_prompt,
                                   const struct kiri_chat_limits *limits, char **out, size_t *out_len,
                                   struct kiri_status_info *info)
{
    return kiri_chat_template_render_json_vars(t, messages, messages_len, tools, tools_len, NULL, 0,
                                               bos_token, eos_token, add_generation_prompt, limits,
                                               out, out_len, info);
}

int kiri_chat_template_render_json_vars(const struct kiri_chat_template *t, const char *messages,
                                        size_t messages_len, const char *tools, size_t tools_len,
                                        const char *vars, size_t vars_len, const char *bos_token,
                                        const char *eos_token, int add_generation_prompt,
                                        const struct kiri_chat_limits *limits, char **out,
                                        size_t *out_len, struct kiri_status_info *info)
{
    if (!t || !messages || !out || !out_len)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat template render: bad arguments");
    if ((bos_token && !kiri_chat_text_valid(bos_token, strlen(bos_token))) ||
        (eos_token && !kiri_chat_text_valid(eos_token, strlen(eos_token))))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat template: a special token is not valid UTF-8");
    struct json_binder jb = {NULL, NULL, NULL, bos_token, eos_token, add_generation_prompt};
    jb.messages = load(messages, messages_len, "messages", info);
    if (!jb.messages)
        return KIRI_E_INVALID_ARG;
    int rc = KIRI_OK;
    if (!json_is_array(jb.messages))
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "messages", -1, "chat template: messages must be a list");
    for (size_t i = 0; rc == KIRI_OK && i < json_array_size(jb.messages); i++)
        if (!json_is_object(json_array_get(jb.messages, i)))
            rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "messages", -1,
                               "chat template: message %zu is not an object", i);
    if (rc == KIRI_OK && tools) {
        jb.tools = load(tools, tools_len, "tools", info);
        if (!jb.tools)
            rc = KIRI_E_INVALID_ARG;
        else if (json_is_null(jb.tools)) {
            json_decref(jb.tools);
            jb.tools = NULL;
        }
    }
    if (rc == KIRI_OK && vars) {
        jb.vars = load(vars, vars_len, "vars", info);
        if (!jb.vars)
            rc = KIRI_E_INVALID_ARG;
        else if (!json_is_object(jb.vars) || json_object_size(jb.vars) > KIRI_CHAT_MAX_EXTRA_VARS)
            rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "vars", -1,
                               "chat template: vars must be an object of at most %d variables",
                               KIRI_CHAT_MAX_EXTRA_VARS);
        const char *key;
        json_t *v;
        if (rc == KIRI_OK)
            json_object_foreach(jb.vars, key, v) {
                if (rc == KIRI_OK && (reserved_name(key) || !kiri_chat_text_valid(key, strlen(key))))
                    rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "vars", -1,
                                       "chat template: \"%.40s\" cannot be a variable here", key);
            }
    }
    if (rc == KIRI_OK)
        rc = kiri_chat_template_run(t, limits, bind_json, &jb, out, out_len, info);
    json_decref(jb.vars);
    json_decref(jb.tools);
    json_decref(jb.messages);
    return rc;
}
