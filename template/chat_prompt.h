/* A model's chat prompt: renders a conversation with the template its GGUF file carries
 * (tokenizer.chat_template) and turns the text into the token ids to feed the model. The server
 * and the command line both go through it, so a conversation becomes the same tokens wherever
 * it is sent.
 *
 * The template is the file's own, or ChatML (kiri_chat_template_chatml) when the file has none
 * or its template is outside the subset kiri renders; kiri_chat_prompt_fallback says which and
 * why. The template sees the BOS and EOS tokens' texts as bos_token and eos_token. A prompt is
 * immutable once made: several threads may render and tokenize with it at once. It borrows the
 * model, which must outlive it.
 */
#ifndef KIRI_CHAT_PROMPT_H
#define KIRI_CHAT_PROMPT_H

#include <stddef.h>
#include <stdint.h>

struct kiri_chat_message;
struct kiri_model;
struct kiri_status_info;

struct kiri_chat_prompt;

/* Makes the chat prompt of model m into *out (free with kiri_chat_prompt_free). A template that
 * does not parse is not an error: the prompt falls back to ChatML. Errors: KIRI_E_INVALID_ARG
 * for NULL arguments, KIRI_E_NOMEM. */
int kiri_chat_prompt_init(const struct kiri_model *m, struct kiri_chat_prompt **out,
                          struct kiri_status_info *info);
void kiri_chat_prompt_free(struct kiri_chat_prompt *p);

/* NULL when the file's own template is used; otherwise one sentence saying why ChatML is used
 * instead ("the model file has no chat template", or why its template was refused). Borrowed
 * from p. */
const char *kiri_chat_prompt_fallback(const struct kiri_chat_prompt *p);

/* Renders n_msgs messages (add_generation_prompt: end with the assistant's opening, as a reply
 * needs) into *text, NUL-terminated and owned by the caller (free with kiri_mem_free), and
 * *len. Errors are kiri_chat_template_render's (a message the template refuses is
 * KIRI_E_INVALID_ARG: show info->message to whoever wrote the conversation). */
int kiri_chat_prompt_render(const struct kiri_chat_prompt *p, const struct kiri_chat_message *msgs,
                            int n_msgs, int add_generation_prompt, char **text, size_t *len,
                            struct kiri_status_info *info);

/* The same for a conversation given as JSON, with tools (kiri_chat_template_render_json: messages
 * may carry tool_calls and tool results; tools may be NULL). */
int kiri_chat_prompt_render_json(const struct kiri_chat_prompt *p, const char *messages, size_t messages_len,
                                 const char *tools, size_t tools_len, int add_generation_prompt, char **text,
                                 size_t *len, struct kiri_status_info *info);

/* Tokenizes rendered text text[0..len), special-token text included (the template writes them),
 * with the BOS token in front when the model asks for one and the text does not already start
 * with the BOS token's text (templates usually write it themselves). On success *ids
 * (kiri_mem_free) holds *n ids, *n >= 0. Errors: the tokenizer's status, KIRI_E_NOMEM. */
int kiri_chat_prompt_tokenize(const struct kiri_chat_prompt *p, const char *text, size_t len,
                              int32_t **ids, int32_t *n, struct kiri_status_info *info);

#endif
