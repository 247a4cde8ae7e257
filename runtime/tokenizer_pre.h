/* The pre-tokenizers of byte-level BPE vocabularies: for each tokenizer.ggml.pre name llama.cpp
 * knows (less those that need more than a regex split), the PCRE2 patterns that split text into
 * pre-tokens and how the tokenizer treats those pre-tokens. The patterns apply in sequence, each
 * splitting the pieces the previous one left (matches and the stretches between them); they are
 * written to compile with PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY. The table is static and
 * read-only.
 */
#ifndef KIRI_TOKENIZER_PRE_H
#define KIRI_TOKENIZER_PRE_H

#define KIRI_PRE_MAX_REGEX 6

/* How a pre-tokenizer treats pre-tokens (struct kiri_pre_kind flags). */
enum {
    KIRI_PRE_IGNORE_MERGES = 1, /* a pre-token that is itself a token is taken whole */
    KIRI_PRE_ADD_BOS = 2,       /* add BOS unless tokenizer.ggml.add_bos_token says otherwise */
    KIRI_PRE_FORCE_BOS = 4,     /* add BOS even when the file says not to (Gemma 4, as llama.cpp) */
    KIRI_PRE_RAW = 8            /* SentencePiece-style BPE: spaces become U+2581, no GPT-2 byte
                                 * mapping, <0xHH> byte fallback, a newline run that is a token
                                 * is taken whole */
};

struct kiri_pre_kind {
    const char *re[KIRI_PRE_MAX_REGEX]; /* static; unused slots NULL */
    unsigned flags;                     /* KIRI_PRE_* */
};

/* The pre-tokenizer a tokenizer.ggml.pre name stands for, or NULL when kiri has none. */
const struct kiri_pre_kind *kiri_tokenizer_pre_find(const char *name);

#endif
