/* Chat templates: turns a conversation into the prompt text a model was trained on, using the
 * model's own Jinja template (GGUF key tokenizer.chat_template), rendered the way Hugging Face
 * transformers renders it (jinja2's ImmutableSandboxedEnvironment with trim_blocks and
 * lstrip_blocks, plus raise_exception and transformers' tojson).
 *
 * Only the subset of Jinja that chat templates use is implemented: {{ }}, {% if/elif/else %},
 * {% for %} (with loop.*, an inline `if`, {% else %}, break and continue), {% set %} (names,
 * tuples, namespace attributes and {% set %}...{% endset %} blocks), {% raw %}, {% generation %},
 * comments, whitespace control, Python-like literals and operators, the common filters, tests and
 * string/dict methods. Anything else (macros, includes, unknown filters...) is refused when the
 * template is parsed, with the line and column in the message, so a caller can fall back to
 * another template (kiri_chat_template_chatml) instead of rendering something subtly wrong.
 *
 * The template is untrusted input. Rendering is sandboxed: no I/O (the clock only through
 * strftime_now, transformers' global that shows the local date), no attribute whose
 * name starts with '_', no mutation of lists or dicts, bounded recursion, and caps on the output
 * size, the evaluation steps and the scratch memory (struct kiri_chat_limits), so a hostile
 * template cannot hang or exhaust the server. A parsed template is immutable: several threads may
 * render the same one at once.
 */
#ifndef KIRI_CHAT_TEMPLATE_H
#define KIRI_CHAT_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

struct kiri_status_info;

/* Largest template source kiri_chat_template_init accepts, in bytes. Real chat templates are a
 * few KiB; the biggest published ones (tool-calling ones) stay under 64 KiB. */
#define KIRI_CHAT_TEMPLATE_MAX_SIZE ((size_t)1 << 20)

/* Defaults for struct kiri_chat_limits fields left 0. */
#define KIRI_CHAT_DEFAULT_MAX_OUTPUT ((size_t)8 << 20)
#define KIRI_CHAT_DEFAULT_MAX_MEMORY ((size_t)64 << 20)
#define KIRI_CHAT_DEFAULT_MAX_STEPS ((uint64_t)4000000)

/* One message of a conversation. Both strings are borrowed UTF-8 (NUL-terminated) and must stay
 * valid during kiri_chat_template_render. content may be NULL (the template then sees none, as
 * for an assistant turn that only carries tool calls). */
struct kiri_chat_message {
    const char *role;
    const char *content;
};

/* Bounds on one render; a field left 0 takes its KIRI_CHAT_DEFAULT_ value. Exceeding any of
 * them stops the render with KIRI_E_INVALID_ARG and the limit's name in info->field.
 * max_output counts every byte the template produces, including text captured by set blocks.
 * max_steps counts evaluated statements and expressions plus one per 256 bytes that string
 * operations scan or copy, so it bounds time even for templates that loop over large strings. */
struct kiri_chat_limits {
    size_t max_output;
    size_t max_memory;
    uint64_t max_steps;
};

struct kiri_chat_template;

/* Parses template source src[0..len) (UTF-8; need not be NUL-terminated) into *out, to be freed
 * with kiri_chat_template_free. Errors: KIRI_E_INVALID_ARG for a NULL argument, a source larger
 * than KIRI_CHAT_TEMPLATE_MAX_SIZE or one that is not valid UTF-8; KIRI_E_UNSUPPORTED for a
 * syntax error or a feature outside the subset, with "line L, column C" in the message and the
 * byte offset (in the source after newline normalisation) in info->offset; KIRI_E_NOMEM. */
int kiri_chat_template_init(const char *src, size_t len, struct kiri_chat_template **out,
                            struct kiri_status_info *info);
void kiri_chat_template_free(struct kiri_chat_template *t);

/* Renders n_msgs messages. The template sees the variables transformers passes: messages (a list
 * of {role, content} dicts), add_generation_prompt (a bool), bos_token and eos_token (undefined
 * when NULL), and tools and documents (none); and the globals raise_exception, strftime_now, namespace, range
 * and dict. limits may be NULL for the defaults.
 * On success *out is a NUL-terminated string owned by the caller (free with kiri_mem_free) and
 * *out_len its length. Errors: KIRI_E_INVALID_ARG for bad arguments (roles, contents and tokens
 * must be valid UTF-8), for a limit reached (info->field names it), and when the template calls
 * raise_exception (info->field is "raise_exception" and info->message the template's text, to
 * show the client); KIRI_E_UNSUPPORTED when evaluation fails (a type error, an undefined
 * variable's attribute, a refused sandbox operation); KIRI_E_NOMEM. */
int kiri_chat_template_render(const struct kiri_chat_template *t,
                              const struct kiri_chat_message *msgs, int n_msgs,
                              const char *bos_token, const char *eos_token,
                              int add_generation_prompt, const struct kiri_chat_limits *limits,
                              char **out, size_t *out_len, struct kiri_status_info *info);

/* Renders a conversation given as JSON, with tools, as transformers' apply_chat_template passes
 * them: messages[0..messages_len) is a JSON array of message objects taken as they are (role,
 * content, tool_calls with arguments as objects, tool_call_id, name, ... whatever keys they have),
 * tools[0..tools_len) a JSON array of {"type":"function","function":{name, description,
 * parameters}} objects, or tools NULL (or the text null) for none. JSON objects reach the template
 * as dicts in their key order, numbers as ints or floats, null as none. The other arguments, the
 * result and the errors are kiri_chat_template_render's; text that is not JSON, messages that are
 * not a list of objects and JSON nested deeper than 64 levels are KIRI_E_INVALID_ARG with field
 * "messages" or "tools". Available when kiri is built with Jansson (with the server). */
int kiri_chat_template_render_json(const struct kiri_chat_template *t, const char *messages,
                                   size_t messages_len, const char *tools, size_t tools_len,
                                   const char *bos_token, const char *eos_token, int add_generation_prompt,
                                   const struct kiri_chat_limits *limits, char **out, size_t *out_len,
                                   struct kiri_status_info *info);

/* Most variables kiri_chat_template_render_json_vars takes in vars. */
#define KIRI_CHAT_MAX_EXTRA_VARS 8

/* kiri_chat_template_render_json with further template variables, as keyword arguments to
 * transformers' apply_chat_template reach the template (enable_thinking, ...): vars[0..vars_len)
 * is a JSON object of at most KIRI_CHAT_MAX_EXTRA_VARS members, or vars NULL for none. A member
 * named like a variable the render binds itself (messages, tools, add_generation_prompt,
 * documents, bos_token, eos_token), or anything but an object, is KIRI_E_INVALID_ARG with field
 * "vars". */
int kiri_chat_template_render_json_vars(const struct kiri_chat_template *t, const char *messages,
                                        size_t messages_len, const char *tools, size_t tools_len,
                                        const char *vars, size_t vars_len, const char *bos_token,
                                        const char *eos_token, int add_generation_prompt,
                                        const struct kiri_chat_limits *limits, char **out,
                                        size_t *out_len, struct kiri_status_info *info);

/* The ChatML template (<|im_start|>role\ncontent<|im_end|>\n), the fallback for a model that has
 * no template or whose template kiri refuses. A static string. */
const char *kiri_chat_template_chatml(void);

#endif
