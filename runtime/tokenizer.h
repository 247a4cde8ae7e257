/* Text to token ids and back, built from a GGUF file's tokenizer.* metadata: SentencePiece-style
 * ("llama": score-driven merges over the text with spaces as U+2581, byte fallback) and byte-level
 * BPE ("gpt2": ranked merges after a pre-tokenizer split chosen by tokenizer.ggml.pre, run with
 * PCRE2), special/control tokens, and the add-BOS/EOS rules from the metadata.
 *
 * Invariants: every id the tokenizer returns is < n_vocab; token texts are owned copies; the
 * special-token ids it reports are either -1 or valid ids.
 */
#ifndef KIRI_TOKENIZER_H
#define KIRI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

struct kiri_gguf;
struct kiri_status_info;
struct kiri_tokenizer;

/* Builds a tokenizer from the metadata of g (which may be closed afterwards). Fails with
 * KIRI_E_MODEL_INVALID naming the key for malformed vocabularies (counts that disagree, wrong
 * element types, out-of-range special ids, malformed byte tokens or merges) and KIRI_E_UNSUPPORTED
 * for an unknown tokenizer.ggml.model or tokenizer.ggml.pre. */
int kiri_tokenizer_init(const struct kiri_gguf *g, struct kiri_tokenizer **out,
                        struct kiri_status_info *info);
void kiri_tokenizer_free(struct kiri_tokenizer *t);

int32_t kiri_tokenizer_n_vocab(const struct kiri_tokenizer *t);
int32_t kiri_tokenizer_bos(const struct kiri_tokenizer *t);      /* -1 if none */
int32_t kiri_tokenizer_eos(const struct kiri_tokenizer *t);      /* -1 if none */
int kiri_tokenizer_add_bos(const struct kiri_tokenizer *t);      /* from metadata / model type */
int kiri_tokenizer_add_eos(const struct kiri_tokenizer *t);
/* End of generation: EOS, EOT, EOM and the like. */
int kiri_tokenizer_is_eog(const struct kiri_tokenizer *t, int32_t id);
/* Control (special) token? */
int kiri_tokenizer_is_control(const struct kiri_tokenizer *t, int32_t id);
/* The model family name ("llama" or "gpt2") and pre-tokenizer ("default", "llama-bpe", ...). */
const char *kiri_tokenizer_model_name(const struct kiri_tokenizer *t);
const char *kiri_tokenizer_pre_name(const struct kiri_tokenizer *t);
/* Looks a token up by its exact text; -1 if absent. */
int32_t kiri_tokenizer_find(const struct kiri_tokenizer *t, const char *text, size_t len);

/* Encodes UTF-8 text (invalid UTF-8 bytes are encoded as U+FFFD). add_bos/add_eos add those
 * tokens (when the vocabulary has them); parse_special matches special-token texts in the input.
 * Writes at most cap ids; returns the number of ids the text needs (possibly > cap) or a negative
 * status. */
int kiri_tokenizer_encode(const struct kiri_tokenizer *t, const char *text, size_t len, int add_bos,
                          int add_eos, int parse_special, int32_t *ids, int cap);

/* The bytes one token stands for (U+2581 as space and <0xNN> byte tokens as the byte for
 * SentencePiece; the GPT-2 byte mapping reversed for BPE). Control tokens give nothing unless
 * render_special. Returns the byte count (may exceed cap: nothing is written then) or a negative
 * status for an invalid id. */
int kiri_tokenizer_piece(const struct kiri_tokenizer *t, int32_t id, int render_special, char *buf,
                         size_t cap);

/* Streams detokenized text as whole UTF-8 characters: bytes of an incomplete character are held
 * until the next token completes them; invalid sequences come out as U+FFFD. */
struct kiri_detok_stream {
    char pending[8];
    int n_pending;
};

/* Appends token id's piece to the stream and writes out the complete characters (at most cap
 * bytes; cap >= 64 + longest token is always enough). Returns bytes written or a negative status. */
int kiri_detok_push(const struct kiri_tokenizer *t, struct kiri_detok_stream *s, int32_t id,
                    int render_special, char *out, size_t cap);
/* Writes out whatever remains (as U+FFFD for an incomplete character). */
int kiri_detok_flush(struct kiri_detok_stream *s, char *out, size_t cap);

#endif
