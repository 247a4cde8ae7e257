/* Text to token ids and back, built from a GGUF file's tokenizer.* metadata: SentencePiece-style
 * ("llama": score-driven merges over the text with spaces as U+2581, byte fallback), byte-level
 * BPE ("gpt2": ranked merges after a pre-tokenizer split chosen by tokenizer.ggml.pre, run with
 * PCRE2), BPE over raw UTF-8 ("gemma4": spaces as U+2581, <0xHH> byte fallback),
 * special/control tokens, and the add-BOS/EOS rules from the metadata.
 *
 * Invariants: every id the tokenizer returns is < n_vocab; token texts are owned copies; the
 * special-token ids it reports are either -1 or valid ids. A tokenizer is immutable after init, so
 * several threads may encode and decode with one tokenizer at once.
 *
 * Decisions about malformed or unusual vocabularies:
 * - tokens must be a string array of 1..2^24 entries, each at least one byte long and as long as
 *   GGUF allows (real vocabularies reach 1024 bytes; the file bounds them). scores (FLOAT32, no NaN) and token_type (INT32, values
 *   0..6) are optional, but when present must have exactly one element per token; any other
 *   element type is rejected. A BYTE token (type 6) must read <0xHH>. If <arch>.vocab_size is
 *   present it must equal the token count. Duplicate token texts are allowed: lookups find the
 *   lowest id. Checking the count against the embedding tensor is the model loader's job.
 * - Special ids (bos/eos/eot/eom/unknown/padding) must be integers; a value outside [0, n_vocab)
 *   (including the UINT32_MAX and -1 spellings of "none") is treated as if the key were absent,
 *   as llama.cpp does, because real files carry e.g. padding ids equal to n_vocab. Absent ids are
 *   -1, except that "llama" vocabularies default to unknown 0, BOS 1, EOS 2 (the SentencePiece
 *   convention).
 * - merges ("gpt2" only, required) must each be "left right" with exactly one space, both parts
 *   and their concatenation known tokens; a repeated pair keeps its first (best) rank.
 * - End of generation: eos, eot and eom ids, plus tokens whose text is a well-known end-of-turn
 *   marker (<|eot_id|>, <|im_end|>, <|endoftext|>, <end_of_turn>, </s>, ...); such a token is
 *   made CONTROL when the file has it otherwise, as llama.cpp does.
 * - Encoding: CONTROL and UNKNOWN token texts in the input become their ids only when
 *   parse_special is set; USER_DEFINED token texts always do (as in Hugging Face tokenizers and
 *   llama.cpp). Overlapping matches resolve leftmost, then longest. Plain text never produces a
 *   CONTROL, UNKNOWN, BYTE or UNUSED token through merging (SentencePiece's rule). SentencePiece
 *   vocabularies prefix a space to the text and to the text after each special token
 *   (tokenizer.ggml.add_space_prefix, default true); pieces without a token fall back to <0xHH>
 *   byte tokens, then to the unknown token. In byte-level BPE a byte whose character is not a
 *   token becomes the unknown token, or nothing when there is none.
 * - Pre-tokenizers (tokenizer.ggml.pre, absent = "default"): the names llama.cpp knows, each with
 *   the split regexes it stands for (tokenizer_pre.c's table: GPT-2, Llama 3, Qwen2/3.5,
 *   DeepSeek LLM/Coder/V3, Falcon, StarCoder/Refact/Command-R/SmolLM, GPT-4o, Tekken, Bloom,
 *   Chameleon, ...), applied in sequence, each splitting what the previous one left. As in
 *   llama.cpp, the Llama 3 family (not dbrx/smaug-bpe), Tekken, YouTu and MiniCPM5 take a whole
 *   pre-token that is itself a token without merging, and the Llama 3 family, Tekken and
 *   Chameleon add BOS unless the file says otherwise; "gemma4" (and a "gemma4" model) always adds
 *   BOS. Names that need more than a regex split (BERT-style separators, hand-written splitters
 *   such as kimi-k2, afmoe, superbpe, tiny_aya, whitespace; the GLM family's BOS rule) are
 *   KIRI_E_UNSUPPORTED, as is anything unknown.
 * - Decoding: NORMAL tokens decode as described at kiri_tokenizer_piece; USER_DEFINED tokens give
 *   their text verbatim; CONTROL, UNKNOWN and UNUSED tokens give their text only with
 *   render_special.
 */
#ifndef KIRI_TOKENIZER_H
#define KIRI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/* The piece length fixed-size buffers are sized for (the longest token of the Llama 3 and Qwen
 * vocabularies is 256 bytes). Longer tokens exist and load (code vocabularies carry 1024-byte runs
 * of spaces): kiri_tokenizer_max_piece gives a vocabulary's longest piece. */
#define KIRI_TOKENIZER_MAX_TOKEN_LEN 256
/* An output size for kiri_detok_push that is always enough for pieces of up to n bytes: a held
 * partial character plus the piece, with every byte possibly replaced by U+FFFD (3 bytes). */
#define KIRI_DETOK_CAP_FOR(n) (3 * ((size_t)(n) + 8))
#define KIRI_DETOK_CAP KIRI_DETOK_CAP_FOR(KIRI_TOKENIZER_MAX_TOKEN_LEN)

struct kiri_gguf;
struct kiri_status_info;
struct kiri_tokenizer;

/* Builds a tokenizer from the metadata of g (which may be closed afterwards). Fails with
 * KIRI_E_MODEL_INVALID naming the key for malformed vocabularies (counts that disagree, wrong
 * element types, bad token types, malformed byte tokens or merges; out-of-range special ids are
 * treated as absent, see above), KIRI_E_UNSUPPORTED for an unknown tokenizer.ggml.model or
 * tokenizer.ggml.pre, and KIRI_E_NOMEM. On success *out is owned by the caller (free it with
 * kiri_tokenizer_free). */
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
/* The longest piece any token decodes to, in bytes (render_special included). */
size_t kiri_tokenizer_max_piece(const struct kiri_tokenizer *t);
/* Looks a token up by its exact text; -1 if absent. */
int32_t kiri_tokenizer_find(const struct kiri_tokenizer *t, const char *text, size_t len);

/* Encodes UTF-8 text (each maximal invalid UTF-8 subsequence is encoded as U+FFFD). add_bos/add_eos
 * add those tokens (when the vocabulary has them); parse_special matches special-token texts in the
 * input. Writes at most cap ids; returns the number of ids the text needs (possibly > cap) or a
 * negative status: KIRI_E_INVALID_ARG for bad arguments or text over 512 MiB, KIRI_E_NOMEM. */
int kiri_tokenizer_encode(const struct kiri_tokenizer *t, const char *text, size_t len, int add_bos,
                          int add_eos, int parse_special, int32_t *ids, int cap);

/* The bytes one token stands for (U+2581 as space and <0xNN> byte tokens as the byte for
 * SentencePiece; the GPT-2 byte mapping reversed for BPE). Control tokens give nothing unless
 * render_special. Returns the byte count (may exceed cap: nothing is written then) or a negative
 * status for an invalid id. */
int kiri_tokenizer_piece(const struct kiri_tokenizer *t, int32_t id, int render_special, char *buf,
                         size_t cap);

/* Streams detokenized text as whole UTF-8 characters: bytes of an incomplete character are held
 * until the next token completes them; invalid sequences come out as U+FFFD. Zero-initialise the
 * struct before the first push. */
struct kiri_detok_stream {
    char pending[8];
    int n_pending;
};

/* Appends token id's piece to the stream and writes out the complete characters (at most cap
 * bytes; cap >= KIRI_DETOK_CAP_FOR(kiri_tokenizer_max_piece(t)) is always enough, KIRI_DETOK_CAP
 * for the usual vocabulary). Returns bytes written, or KIRI_E_INVALID_ARG for an invalid id or a
 * cap too small for this token's output (KIRI_E_NOMEM when a long piece needs memory that is not
 * there), and then leaves the stream unchanged. */
int kiri_detok_push(const struct kiri_tokenizer *t, struct kiri_detok_stream *s, int32_t id,
                    int render_special, char *out, size_t cap);
/* Writes out whatever remains (one U+FFFD for an incomplete character; needs cap >= 3) and resets
 * the stream. Returns bytes written or KIRI_E_INVALID_ARG. */
int kiri_detok_flush(struct kiri_detok_stream *s, char *out, size_t cap);

#endif
