/* A model's chat prompt (chat_prompt.h): its template or the ChatML fallback, its BOS and EOS
 * texts, and the rule for putting the BOS token in front of a rendered conversation. */
#include "chat_prompt.h"

#include <stdio.h>
#include <string.h>

#include "chat_template.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"

struct kiri_chat_prompt {
    const struct kiri_model *model;    /* borrowed */
    struct kiri_chat_template *tmpl;   /* owned: the file's template or ChatML */
    char bos_text[64], eos_text[64];   /* "" when the model has no such token */
    char fallback[320];                /* "" when tmpl is the file's own */
};

/* The text of a special token, or "" when there is none or it does not fit. */
static void token_text(const struct kiri_model *m, int32_t id, char *out, size_t cap)
{
    int n;
    if (id >= 0 && (n = kiri_token_to_piece(m, id, 1, out, cap - 1)) > 0 && (size_t)n < cap)
        out[n] = '\0';
    else
        out[0] = '\0';
}

int kiri_chat_prompt_init(const struct kiri_model *m, struct kiri_chat_prompt **out,
                          struct kiri_status_info *info)
{
    if (!m || !out)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat prompt: NULL argument");
    struct kiri_chat_prompt *p = kiri_mem_calloc(1, sizeof *p);
    if (!p)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    p->model = m;
    const char *src = NULL;
    size_t len = 0;
    if (kiri_model_meta_str(m, "tokenizer.chat_template", &src, &len) != KIRI_OK || len == 0) {
        snprintf(p->fallback, sizeof p->fallback, "the model file has no chat template");
    } else {
        struct kiri_status_info why;
        const int rc = kiri_chat_template_init(src, len, &p->tmpl, &why);
        if (rc == KIRI_E_NOMEM) {
            kiri_mem_free(p);
            return kiri_error_set(info, rc, "out of memory parsing the chat template");
        }
        if (rc != KIRI_OK)
            snprintf(p->fallback, sizeof p->fallback, "the chat template is not usable (%s)", why.message);
    }
    if (!p->tmpl) {
        const char *chatml = kiri_chat_template_chatml();
        const int rc = kiri_chat_template_init(chatml, strlen(chatml), &p->tmpl, info);
        if (rc != KIRI_OK) {
            kiri_mem_free(p);
            return rc;
        }
    }
    token_text(m, kiri_model_bos(m), p->bos_text, sizeof p->bos_text);
    token_text(m, kiri_model_eos(m), p->eos_text, sizeof p->eos_text);
    *out = p;
    return KIRI_OK;
}

void kiri_chat_prompt_free(struct kiri_chat_prompt *p)
{
    if (!p)
        return;
    kiri_chat_template_free(p->tmpl);
    kiri_mem_free(p);
}

const char *kiri_chat_prompt_fallback(const struct kiri_chat_prompt *p)
{
    return p->fallback[0] ? p->fallback : NULL;
}

int kiri_chat_prompt_render(const struct kiri_chat_prompt *p, const struct kiri_chat_message *msgs,
                            int n_msgs, int add_generation_prompt, char **text, size_t *len,
                            struct kiri_status_info *info)
{
    return kiri_chat_template_render(p->tmpl, msgs, n_msgs, p->bos_text, p->eos_text, add_generation_prompt,
                                     NULL, text, len, info);
}

int kiri_chat_prompt_render_json(const struct kiri_chat_prompt *p, const char *messages, size_t messages_len,
                                 const char *tools, size_t tools_len, int add_generation_prompt, char **text,
                                 size_t *len, struct kiri_status_info *info)
{
    return kiri_chat_template_render_json(p->tmpl, messages, messages_len, tools, tools_len, p->bos_text,
                                          p->eos_text, add_generation_prompt, NULL, text, len, info);
}

int kiri_chat_prompt_tokenize(const struct kiri_chat_prompt *p, const char *text, size_t len,
                              int32_t **ids, int32_t *n, struct kiri_status_info *info)
{
    const size_t bos_len = strlen(p->bos_text);
    const int written = bos_len && len >= bos_len && memcmp(text, p->bos_text, bos_len) == 0;
    const int add_bos = kiri_model_add_bos(p->model) && !written;
    const int need = kiri_tokenize(p->model, text, len, add_bos, 1, NULL, 0);
    if (need < 0)
        return kiri_error_set(info, need, "cannot tokenize the prompt (%s)", kiri_status_name(need));
    int32_t *buf = kiri_mem_array((size_t)need + 1, sizeof *buf);
    if (!buf)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    const int got = kiri_tokenize(p->model, text, len, add_bos, 1, buf, need);
    if (got < 0 || got > need) {
        kiri_mem_free(buf);
        return kiri_error_set(info, got < 0 ? got : KIRI_E_INVALID_ARG, "cannot tokenize the prompt");
    }
    *ids = buf;
    *n = got;
    return KIRI_OK;
}
