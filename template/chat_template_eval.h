/* Chat templates: the evaluator. It runs a parsed template (chat_template_parse.h) with the
 * semantics jinja2 gives it under transformers' settings: statements, expressions and their
 * operators, indexing and slicing, variable scopes, and the step counting that, with the caps
 * the values enforce (chat_template_value.h), keeps a hostile template from hanging the render.
 * Filters, tests, methods and global functions come from chat_template_builtins.h.
 */
#ifndef KIRI_CHAT_TEMPLATE_EVAL_H
#define KIRI_CHAT_TEMPLATE_EVAL_H

#include <stddef.h>

#include "chat_template_parse.h"
#include "chat_template_value.h"

/* A variable the template starts with; name is NUL-terminated and outlives the render. */
struct kiri_chat_binding {
    const char *name;
    struct kiri_chat_value value;
};

/* Renders t into out (an output buffer: is_output set) within r's limits, with the variables
 * vars[0..n_vars) and the global functions. r->src must be t->src. Returns 0 or -1 (r->code). */
int kiri_chat_eval_run(struct kiri_chat_render *r, const struct kiri_chat_template *t,
                       const struct kiri_chat_binding *vars, size_t n_vars,
                       struct kiri_chat_buf *out);

/* ---- one render, shared by the entry points (chat_template.c, chat_template_json.c) ---- */

#define KIRI_CHAT_MAX_BINDINGS 16

struct kiri_chat_limits;
struct kiri_status_info;

/* Writes the template's variables into vars (room for KIRI_CHAT_MAX_BINDINGS), making values in
 * r; returns how many, or -1 with the error recorded in r. */
typedef int (*kiri_chat_bind_fn)(struct kiri_chat_render *r, void *user, struct kiri_chat_binding *vars);

/* The render behind kiri_chat_template_render and kiri_chat_template_render_json: limits
 * (NULL: defaults), the variables from bind, the text in *out (owned) on success. */
int kiri_chat_template_run(const struct kiri_chat_template *t, const struct kiri_chat_limits *limits,
                           kiri_chat_bind_fn bind, void *user, char **out, size_t *out_len,
                           struct kiri_status_info *info);

/* The variables every entry passes besides messages and tools: add_generation_prompt,
 * documents (none), bos_token and eos_token (only when not NULL). Returns how many (at most 4). */
int kiri_chat_bind_common(const char *bos, const char *eos, int add_generation_prompt,
                          struct kiri_chat_binding *vars);

#endif
