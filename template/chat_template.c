/* Chat templates: the public API (chat_template.h). It checks what callers pass, parses with the
 * built-ins' names (chat_template_parse.h, chat_template_builtins.h), and renders: it sets the
 * limits, builds the variables transformers passes (messages, add_generation_prompt, the tokens,
 * tools and documents) and hands them to the evaluator (chat_template_eval.h).
 */
#include "chat_template.h"

#include <string.h>

#include "buf.h"
#include "chat_template_builtins.h"
#include "chat_template_eval.h"
#include "chat_template_parse.h"
#include "chat_template_text.h"
#include "chat_template_value.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"

int kiri_chat_template_init(const char *src, size_t len, struct kiri_chat_template **out,
                            struct kiri_status_info *info)
{
    if (!src || !out)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat template: NULL argument");
    if (len > KIRI_CHAT_TEMPLATE_MAX_SIZE)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "chat_template", -1,
                             "chat template is %zu bytes; the limit is %zu", len,
                             KIRI_CHAT_TEMPLATE_MAX_SIZE);
    if (!kiri_chat_text_valid(src, len))
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "chat_template", -1,
                             "chat template is not valid UTF-8 (or contains NUL bytes)");
    struct kiri_chat_template *t = kiri_mem_calloc(1, sizeof *t);
    if (!t)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory parsing the chat template");
    static const struct kiri_chat_names builtins = {kiri_chat_filter_find, kiri_chat_test_find};
    int rc = kiri_chat_parse(t, src, len, &builtins, info);
    if (rc != KIRI_OK) {
        kiri_chat_arena_free(&t->arena);
        kiri_mem_free(t);
        return rc;
    }
    *out = t;
    return KIRI_OK;
}

void kiri_chat_template_free(struct kiri_chat_template *t)
{
    if (!t)
        return;
    kiri_chat_arena_free(&t->arena);
    kiri_mem_free(t);
}

int kiri_chat_bind_common(const char *bos, const char *eos, int add_generation_prompt,
                          struct kiri_chat_binding *vars)
{
    const struct kiri_chat_value none = {KIRI_CHAT_TYPE_NONE, {0}};
    int n = 0;
    vars[n++] = (struct kiri_chat_binding){"add_generation_prompt", kiri_chat_bool(add_generation_prompt)};
    vars[n++] = (struct kiri_chat_binding){"documents", none};
    if (bos)
        vars[n++] = (struct kiri_chat_binding){"bos_token", kiri_chat_str(bos, strlen(bos))};
    if (eos)
        vars[n++] = (struct kiri_chat_binding){"eos_token", kiri_chat_str(eos, strlen(eos))};
    return n;
}

const char *kiri_chat_template_chatml(void)
{
    return "{% for message in messages %}"
           "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
           "{% endfor %}"
           "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
}

/* index < 0: the argument is not a message's. */
static int text_arg(const char *s, const char *what, int index, struct kiri_status_info *info)
{
    if (!s || kiri_chat_text_valid(s, strlen(s)))
        return 0;
    if (index < 0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat template: %s is not valid UTF-8", what);
    return kiri_error_set(info, KIRI_E_INVALID_ARG,
                          "chat template: the %s of message %d is not valid UTF-8", what, index);
}

struct message_binder {
    const struct kiri_chat_message *msgs;
    int n_msgs;
    const char *bos, *eos;
    int add_generation_prompt;
};

/* The variables transformers passes: messages as {role, content} dicts, the generation flag, the
 * tokens when given, and no tools or documents. Returns how many it wrote to vars, or -1. */
static int bind_messages(struct kiri_chat_render *r, void *user,
                         struct kiri_chat_binding vars[KIRI_CHAT_MAX_BINDINGS])
{
    const struct message_binder *mb = user;
    const struct kiri_chat_message *msgs = mb->msgs;
    const int n_msgs = mb->n_msgs;
    struct kiri_chat_value list, none = {KIRI_CHAT_TYPE_NONE, {0}};
    int n = 0;
    if (kiri_chat_new_list(r, (size_t)n_msgs, 0, &list) < 0)
        return -1;
    for (int i = 0; i < n_msgs; i++) {
        struct kiri_chat_value d;
        const char *c = msgs[i].content;
        if (kiri_chat_new_dict(r, 0, &d) < 0 ||
            kiri_chat_dict_set(r, d.u.dict, kiri_chat_str("role", 4),
                               kiri_chat_str(msgs[i].role, strlen(msgs[i].role))) < 0 ||
            kiri_chat_dict_set(r, d.u.dict, kiri_chat_str("content", 7),
                               c ? kiri_chat_str(c, strlen(c)) : none) < 0)
            return -1;
        list.u.list->v[i] = d;
    }
    vars[n++] = (struct kiri_chat_binding){"messages", list};
    vars[n++] = (struct kiri_chat_binding){"tools", none};
    return n + kiri_chat_bind_common(mb->bos, mb->eos, mb->add_generation_prompt, vars + n);
}

/* Sets up a render within limits, lets bind write the variables, runs t and hands back the text
 * (see chat_template_eval.h). */
int kiri_chat_template_run(const struct kiri_chat_template *t, const struct kiri_chat_limits *limits,
                           kiri_chat_bind_fn bind, void *user, char **out, size_t *out_len,
                           struct kiri_status_info *info)
{
    struct kiri_chat_render r;
    struct kiri_chat_buf buf = {0};
    struct kiri_chat_binding vars[KIRI_CHAT_MAX_BINDINGS];
    memset(&r, 0, sizeof r);
    r.src = t->src;
    r.info = info;
    r.max_output = limits && limits->max_output ? limits->max_output : KIRI_CHAT_DEFAULT_MAX_OUTPUT;
    r.max_memory = limits && limits->max_memory ? limits->max_memory : KIRI_CHAT_DEFAULT_MAX_MEMORY;
    r.max_steps = limits && limits->max_steps ? limits->max_steps : KIRI_CHAT_DEFAULT_MAX_STEPS;
    r.arena.cap = r.max_memory;
    buf.is_output = 1;
    int n_vars = bind(&r, user, vars);
    int rc = n_vars < 0 ? -1 : kiri_chat_eval_run(&r, t, vars, (size_t)n_vars, &buf);
    size_t len = 0;
    char *text = rc == 0 ? kiri_buf_take(&buf.text, &len) : NULL;
    if (rc == 0 && !text)
        rc = kiri_chat_fail_code(&r, KIRI_E_NOMEM, "", "out of memory rendering the chat template");
    kiri_chat_arena_free(&r.arena);
    if (rc < 0) {
        kiri_chat_buf_free(&buf);
        return r.code ? r.code : KIRI_E_UNSUPPORTED;
    }
    *out = text;
    *out_len = len;
    return KIRI_OK;
}

int kiri_chat_template_render(const struct kiri_chat_template *t,
                              const struct kiri_chat_message *msgs, int n_msgs,
                              const char *bos_token, const char *eos_token,
                              int add_generation_prompt, const struct kiri_chat_limits *limits,
                              char **out, size_t *out_len, struct kiri_status_info *info)
{
    if (!t || !out || !out_len || n_msgs < 0 || (n_msgs > 0 && !msgs))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat template render: bad arguments");
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].role)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat template: message %d has no role", i);
        int rc = text_arg(msgs[i].role, "role", i, info);
        if (rc == 0)
            rc = text_arg(msgs[i].content, "content", i, info);
        if (rc)
            return rc;
    }
    if (text_arg(bos_token, "bos_token", -1, info) || text_arg(eos_token, "eos_token", -1, info))
        return KIRI_E_INVALID_ARG;

    struct message_binder mb = {msgs, n_msgs, bos_token, eos_token, add_generation_prompt};
    return kiri_chat_template_run(t, limits, bind_messages, &mb, out, out_len, info);
}
