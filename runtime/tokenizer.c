#include "tokenizer.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <pcre2.h>

#include "error.h"
#include "gguf.h"
#include "kiri.h"
#include "mem.h"
#include "tokenizer_pre.h"
#include "utf8.h"

/* ============================================================================================
 * Constants and the tokenizer object
 * ============================================================================================ */

/* tokenizer.ggml.token_type values (llama.cpp's enum, which GGUF files use). */
enum {
    TT_UNDEFINED = 0,
    TT_NORMAL = 1,
    TT_UNKNOWN = 2,
    TT_CONTROL = 3,
    TT_USER = 4,
    TT_UNUSED = 5,
    TT_BYTE = 6
};

enum { MODEL_SPM, MODEL_BPE };

#define FLAG_EOG 1u

#define MAX_VOCAB (1 << 24)
#define MAX_MERGES (1 << 25)
/* Longest text encode accepts: keeps every index inside int32 even after escaping (3x). */
#define MAX_TEXT ((size_t)512 << 20)

static const char KEY_MODEL[] = "tokenizer.ggml.model";
static const char KEY_PRE[] = "tokenizer.ggml.pre";
static const char KEY_TOKENS[] = "tokenizer.ggml.tokens";
static const char KEY_SCORES[] = "tokenizer.ggml.scores";
static const char KEY_TYPES[] = "tokenizer.ggml.token_type";
static const char KEY_MERGES[] = "tokenizer.ggml.merges";

/* A byte trie over the texts of USER_DEFINED, CONTROL and UNKNOWN tokens, for splitting the
 * input on them. Children of a node form a singly linked list through `sibling`. */
struct trie_node {
    int32_t child;     /* first child node, or -1 */
    int32_t sibling;   /* next child of the same parent, or -1 */
    int32_t id;        /* token ending here, or -1 */
    uint8_t byte;
};

/* One slot of the merge table: key packs (left id + 1, right id + 1); 0 marks an empty slot. */
struct merge_slot {
    uint64_t key;
    int32_t rank;
    int32_t result;
};

struct kiri_tokenizer {
    int model;                  /* MODEL_SPM or MODEL_BPE */
    char *model_name;           /* owned */
    char *pre_name;             /* owned */
    int32_t n_vocab;

    char *text;                 /* owned: all token texts back to back */
    size_t *text_off;           /* owned, (n_vocab + 1): token i is text[text_off[i], text_off[i+1]) */
    char *piece;                /* owned: the decoded bytes of every token, back to back */
    size_t *piece_off;          /* owned, (n_vocab + 1) */
    float *scores;              /* owned, (n_vocab), or NULL: all scores 0 */
    uint8_t *type;              /* owned, (n_vocab): TT_* */
    uint8_t *flags;             /* owned, (n_vocab): FLAG_* */

    uint32_t *tok_slots;        /* owned, (tok_mask + 1): id + 1 of a token text, 0 = empty */
    size_t tok_mask;

    struct merge_slot *merges;  /* owned, (merge_mask + 1); NULL for SPM */
    size_t merge_mask;

    /* SPM: the <0xHH> token of each byte. BPE: the token of each byte's mapped character. -1
     * where the vocabulary has none. */
    int32_t byte_tok[256];
    /* GPT-2 byte mapping (BPE only): byte -> code point, and code point (< 324) -> byte or -1. */
    uint16_t byte_cp[256];
    int16_t cp_byte[324];

    pcre2_general_context *gctx;   /* owned; routes PCRE2's allocations through kiri_mem */
    pcre2_code *re[KIRI_PRE_MAX_REGEX]; /* owned; applied in sequence */
    int n_re;
    const struct kiri_pre_kind *pre; /* BPE: the pre-tokenizer (static table), else NULL */
    int ignore_merges;             /* take a pre-token that is a token whole (tiktoken-style) */
    int raw;                       /* BPE over raw UTF-8 with U+2581 for spaces (KIRI_PRE_RAW) */
    size_t max_token_len;          /* longest token text in bytes */
    size_t max_piece_len;          /* longest decoded piece in bytes */

    struct trie_node *trie;        /* owned, (n_trie); node 0 is the root */
    int32_t n_trie;
    uint8_t special_first[32];     /* bit set of first bytes of special texts */

    int32_t bos, eos, eot, eom, unk, pad;
    int add_bos, add_eos, add_space_prefix;
};

/* ============================================================================================
 * UTF-8 and the GPT-2 byte mapping
 * ============================================================================================ */

/* UTF-8 itself is base/utf8.h's (RFC 3629; each maximal invalid subsequence is one U+FFFD). */

/* Length of the character at s[0, n) in text already made valid (1 for a stray byte, so that a
 * scan always moves on). */
static size_t char_len(const char *s, size_t n)
{
    const int k = kiri_utf8_check((const unsigned char *)s, n);
    return k > 0 ? (size_t)k : 1;
}

/* GPT-2's byte-level alphabet: printable Latin-1 bytes (0x21-0x7E, 0xA1-0xAC, 0xAE-0xFF) stand for
 * themselves; the other 68 bytes, in increasing order, take code points 256, 257, ... 323 so that
 * every byte is a visible character. */
static void gpt2_tables(uint16_t byte_cp[256], int16_t cp_byte[324])
{
    unsigned next = 256;
    for (unsigned cp = 0; cp < 324; cp++)
        cp_byte[cp] = -1;
    for (unsigned b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        byte_cp[b] = (uint16_t)(printable ? b : next++);
        cp_byte[byte_cp[b]] = (int16_t)b;
    }
}

/* ============================================================================================
 * Hashing and token lookup
 * ============================================================================================ */

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001b3ull;
    }
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static size_t tok_len(const struct kiri_tokenizer *t, int32_t id)
{
    return t->text_off[id + 1] - t->text_off[id];
}

static int32_t vocab_find(const struct kiri_tokenizer *t, const char *s, size_t n)
{
    size_t i = (size_t)hash_bytes(s, n) & t->tok_mask;
    for (;;) {
        uint32_t v = t->tok_slots[i];
        if (!v)
            return -1;
        int32_t id = (int32_t)(v - 1);
        if (tok_len(t, id) == n && memcmp(t->text + t->text_off[id], s, n) == 0)
            return id;
        i = (i + 1) & t->tok_mask;
    }
}

static const struct merge_slot *merge_find(const struct kiri_tokenizer *t, int32_t l, int32_t r)
{
    uint64_t key = ((uint64_t)(uint32_t)(l + 1) << 32) | (uint32_t)(r + 1);
    size_t i = (size_t)hash_u64(key) & t->merge_mask;
    for (;;) {
        const struct merge_slot *m = &t->merges[i];
        if (m->key == key)
            return m;
        if (!m->key)
            return NULL;
        i = (i + 1) & t->merge_mask;
    }
}

/* Can plain text turn into this token by merging? Not for CONTROL, UNKNOWN, BYTE and UNUSED
 * tokens, whose texts are markers, not text (SentencePiece never emits them from text either). */
static int mergeable(const struct kiri_tokenizer *t, int32_t id)
{
    uint8_t ty = t->type[id];
    return ty == TT_NORMAL || ty == TT_UNDEFINED || ty == TT_USER;
}

/* ============================================================================================
 * Loading: errors, tokens, special ids
 * ============================================================================================ */

static int fail(struct kiri_status_info *info, int code, const struct kiri_gguf *g, const char *key,
                const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Fills info naming the metadata key (and its offset when the key exists). */
static int fail(struct kiri_status_info *info, int code, const struct kiri_gguf *g, const char *key,
                const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int64_t k = g ? kiri_gguf_find_key(g, key) : -1;
    int64_t off = k >= 0 ? (int64_t)kiri_gguf_kv_offset(g, k) : -1;
    return kiri_error_at(info, code, key, off, "%s", msg);
}

static int nomem(struct kiri_status_info *info)
{
    return kiri_error_set(info, KIRI_E_NOMEM, "out of memory building the tokenizer");
}

/* Parses "<0xHH>" (either case), returning the byte or -1. */
static int parse_byte_token(const char *s, size_t n)
{
    if (n != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

static int load_model_kind(struct kiri_tokenizer *t, const struct kiri_gguf *g,
                           struct kiri_status_info *info)
{
    struct kiri_gguf_str s;
    int rc = kiri_gguf_get_str(g, KEY_MODEL, 1, &s, info);
    if (rc < 0)
        return rc;
    /* "gemma4" is byte-level-free BPE whose pre-tokenizer is implied by the model name. */
    int gemma4 = s.len == 6 && memcmp(s.ptr, "gemma4", 6) == 0;
    if (s.len == 5 && memcmp(s.ptr, "llama", 5) == 0)
        t->model = MODEL_SPM;
    else if ((s.len == 4 && memcmp(s.ptr, "gpt2", 4) == 0) || gemma4)
        t->model = MODEL_BPE;
    else
        return fail(info, KIRI_E_UNSUPPORTED, g, KEY_MODEL,
                    "tokenizer model \"%.*s\" is not supported (only \"llama\", \"gpt2\" and "
                    "\"gemma4\")",
                    (int)(s.len > 64 ? 64 : s.len), s.ptr);
    t->model_name = kiri_mem_strndup(s.ptr, (size_t)s.len);
    if (!t->model_name)
        return nomem(info);

    rc = kiri_gguf_get_str(g, KEY_PRE, 0, &s, info);
    if (rc < 0)
        return rc;
    if (rc == 1) {
        s.ptr = "default";
        s.len = 7;
    }
    if (gemma4) {
        s.ptr = "gemma4";
        s.len = 6;
    }
    if (s.len > 256)
        return fail(info, KIRI_E_UNSUPPORTED, g, KEY_PRE, "pre-tokenizer name is too long");
    t->pre_name = kiri_mem_strndup(s.ptr, (size_t)s.len);
    if (!t->pre_name)
        return nomem(info);
    if (t->model == MODEL_BPE) {
        t->pre = kiri_tokenizer_pre_find(t->pre_name);
        if (!t->pre)
            return fail(info, KIRI_E_UNSUPPORTED, g, KEY_PRE,
                        "pre-tokenizer \"%.64s\" is not supported", t->pre_name);
        t->ignore_merges = (t->pre->flags & KIRI_PRE_IGNORE_MERGES) != 0;
        t->raw = (t->pre->flags & KIRI_PRE_RAW) != 0;
    }
    return KIRI_OK;
}

/* Reads tokens, scores and token types, validates them, and builds the text arena and the
 * text -> id table. */
static int load_tokens(struct kiri_tokenizer *t, const struct kiri_gguf *g,
                       struct kiri_status_info *info)
{
    int et;
    uint64_t n;
    const void *data;
    int rc = kiri_gguf_get_arr(g, KEY_TOKENS, 1, &et, &n, &data, info);
    if (rc < 0)
        return rc;
    if (et != KIRI_GGUF_STRING)
        return fail(info, KIRI_E_MODEL_INVALID, g, KEY_TOKENS,
                    "tokens must be an array of strings (element type is %d)", et);
    if (n == 0 || n > MAX_VOCAB)
        return fail(info, KIRI_E_MODEL_INVALID, g, KEY_TOKENS,
                    "token count %llu is outside 1..%d", (unsigned long long)n, MAX_VOCAB);
    int64_t kt = kiri_gguf_find_key(g, KEY_TOKENS);
    t->n_vocab = (int32_t)n;

    /* The <arch>.vocab_size key, when present, must agree. */
    struct kiri_gguf_str arch;
    if (kiri_gguf_get_str(g, "general.architecture", 0, &arch, NULL) == KIRI_OK && arch.len < 100) {
        char key[128];
        snprintf(key, sizeof key, "%.*s.vocab_size", (int)arch.len, arch.ptr);
        uint32_t vs;
        rc = kiri_gguf_get_u32(g, key, 0, &vs, info);
        if (rc < 0)
            return rc;
        if (rc == KIRI_OK && vs != (uint32_t)n)
            return fail(info, KIRI_E_MODEL_INVALID, g, key,
                        "%s is %u but the vocabulary has %llu tokens", key, vs,
                        (unsigned long long)n);
    }

    size_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct kiri_gguf_str s = kiri_gguf_arr_str(g, kt, i);
        /* Any length GGUF allows (the reader has bounded it by the file); only empty texts are
         * refused, since no text can match them. */
        if (s.len == 0)
            return fail(info, KIRI_E_MODEL_INVALID, g, KEY_TOKENS, "token %llu is empty",
                        (unsigned long long)i);
        if ((size_t)s.len > t->max_token_len)
            t->max_token_len = (size_t)s.len;
        total += (size_t)s.len;
    }
    t->text = kiri_mem_alloc(total);
    t->text_off = kiri_mem_array((size_t)n + 1, sizeof *t->text_off);
    t->type = kiri_mem_calloc((size_t)n, 1);
    t->flags = kiri_mem_calloc((size_t)n, 1);
    if (!t->text || !t->text_off || !t->type || !t->flags)
        return nomem(info);
    size_t off = 0;
    for (uint64_t i = 0; i < n; i++) {
        struct kiri_gguf_str s = kiri_gguf_arr_str(g, kt, i);
        t->text_off[i] = off;
        memcpy(t->text + off, s.ptr, (size_t)s.len);
        off += (size_t)s.len;
    }
    t->text_off[n] = off;

    rc = kiri_gguf_get_arr(g, KEY_SCORES, 0, &et, &n, &data, info);
    if (rc < 0)
        return rc;
    if (rc == KIRI_OK) {
        if (et != KIRI_GGUF_FLOAT32)
            return fail(info, KIRI_E_MODEL_INVALID, g, KEY_SCORES,
                        "scores must be an array of float32 (element type is %d)", et);
        if (n != (uint64_t)t->n_vocab)
            return fail(info, KIRI_E_MODEL_INVALID, g, KEY_SCORES,
                        "%llu scores for %d tokens", (unsigned long long)n, t->n_vocab);
        t->scores = kiri_mem_array((size_t)n, sizeof(float));
        if (!t->scores)
            return nomem(info);
        memcpy(t->scores, data, (size_t)n * sizeof(float));
        for (uint64_t i = 0; i < n; i++) {
            if (isnan(t->scores[i]))
                return fail(info, KIRI_E_MODEL_INVALID, g, KEY_SCORES, "score %llu is NaN",
                            (unsigned long long)i);
            if (t->scores[i] == 0.0f)
                t->scores[i] = 0.0f;   /* -0 and +0 must order the same in the merge queue */
        }
    }

    rc = kiri_gguf_get_arr(g, KEY_TYPES, 0, &et, &n, &data, info);
    if (rc < 0)
        return rc;
    if (rc == KIRI_OK) {
        if (et != KIRI_GGUF_INT32)
            return fail(info, KIRI_E_MODEL_INVALID, g, KEY_TYPES,
                        "token types must be an array of int32 (element type is %d)", et);
        if (n != (uint64_t)t->n_vocab)
            return fail(info, KIRI_E_MODEL_INVALID, g, KEY_TYPES,
                        "%llu token types for %d tokens", (unsigned long long)n, t->n_vocab);
        for (uint64_t i = 0; i < n; i++) {
            int32_t v;
            memcpy(&v, (const char *)data + i * 4, 4);
            if (v < TT_UNDEFINED || v > TT_BYTE)
                return fail(info, KIRI_E_MODEL_INVALID, g, KEY_TYPES,
                            "token %llu has type %d (must be 0..6)", (unsigned long long)i, v);
            t->type[i] = (uint8_t)v;
        }
    } else {
        memset(t->type, TT_NORMAL, (size_t)t->n_vocab);
    }

    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->type[i] == TT_BYTE &&
            parse_byte_token(t->text + t->text_off[i], tok_len(t, i)) < 0)
            return fail(info, KIRI_E_MODEL_INVALID, g, KEY_TOKENS,
                        "byte token %d is \"%.*s\", not <0xHH>", i, (int)tok_len(t, i),
                        t->text + t->text_off[i]);

    /* Open addressing at load factor <= 1/2. The lowest id wins for duplicate texts. */
    size_t cap = 1;
    while (cap < 2 * (size_t)t->n_vocab)
        cap <<= 1;
    t->tok_slots = kiri_mem_calloc(cap, sizeof *t->tok_slots);
    if (!t->tok_slots)
        return nomem(info);
    t->tok_mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        const char *s = t->text + t->text_off[id];
        size_t len = tok_len(t, id);
        size_t i = (size_t)hash_bytes(s, len) & t->tok_mask;
        for (;;) {
            uint32_t v = t->tok_slots[i];
            if (!v) {
                t->tok_slots[i] = (uint32_t)id + 1;
                break;
            }
            if (tok_len(t, (int32_t)(v - 1)) == len &&
                memcmp(t->text + t->text_off[v - 1], s, len) == 0)
                break;
            i = (i + 1) & t->tok_mask;
        }
    }
    return KIRI_OK;
}

/* Reads one special id into *id. Keys that are absent, or whose value is outside [0, n_vocab),
 * leave *id alone (see the header: out-of-range ids count as absent). Non-integers are errors. */
static int load_special_id(const struct kiri_tokenizer *t, const struct kiri_gguf *g,
                           const char *key, int32_t *id, struct kiri_status_info *info)
{
    if (kiri_gguf_find_key(g, key) < 0)
        return KIRI_OK;
    uint32_t u;
    if (kiri_gguf_get_u32(g, key, 1, &u, NULL) == KIRI_OK) {
        if (u < (uint32_t)t->n_vocab)
            *id = (int32_t)u;
        return KIRI_OK;
    }
    int32_t v;
    if (kiri_gguf_get_i32(g, key, 1, &v, NULL) == KIRI_OK)
        return KIRI_OK;   /* negative: absent */
    int64_t k = kiri_gguf_find_key(g, key);
    int ty = kiri_gguf_kv_type(g, k);
    if (ty == KIRI_GGUF_INT64 || ty == KIRI_GGUF_UINT64)
        return KIRI_OK;   /* an integer too large for any vocabulary: absent */
    return fail(info, KIRI_E_MODEL_INVALID, g, key, "%s must be an integer token id (type is %d)",
                key, ty);
}

static int load_flag(const struct kiri_gguf *g, const char *key, int *v,
                     struct kiri_status_info *info)
{
    int b;
    int rc = kiri_gguf_get_bool(g, key, 0, &b, info);
    if (rc == KIRI_OK)
        *v = b != 0;
    return rc < 0 ? rc : KIRI_OK;
}

/* Texts of tokens that end a turn in common chat formats, so generation stops on them even when
 * the file names only the base model's EOS. Such a token that is not CONTROL in the file is made
 * CONTROL (as llama.cpp does): plain text then never matches it. */
static const char *const eog_texts[] = {
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "</s>", "[EOT]", "[EOS]", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>", "[e~[",
};

static int load_specials(struct kiri_tokenizer *t, const struct kiri_gguf *g,
                         struct kiri_status_info *info)
{
    t->bos = t->eos = t->eot = t->eom = t->unk = t->pad = -1;
    t->add_bos = t->add_eos = t->add_space_prefix = 0;
    if (t->model == MODEL_SPM) {
        if (t->n_vocab > 2) {
            t->unk = 0;
            t->bos = 1;
            t->eos = 2;
        }
        t->add_bos = 1;
        t->add_space_prefix = 1;
    } else {
        t->add_bos = (t->pre->flags & KIRI_PRE_ADD_BOS) != 0;
    }
    static const struct { const char *key; size_t off; } ids[] = {
        {"tokenizer.ggml.bos_token_id", offsetof(struct kiri_tokenizer, bos)},
        {"tokenizer.ggml.eos_token_id", offsetof(struct kiri_tokenizer, eos)},
        {"tokenizer.ggml.eot_token_id", offsetof(struct kiri_tokenizer, eot)},
        {"tokenizer.ggml.eom_token_id", offsetof(struct kiri_tokenizer, eom)},
        {"tokenizer.ggml.unknown_token_id", offsetof(struct kiri_tokenizer, unk)},
        {"tokenizer.ggml.padding_token_id", offsetof(struct kiri_tokenizer, pad)},
    };
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        int rc = load_special_id(t, g, ids[i].key, (int32_t *)((char *)t + ids[i].off), info);
        if (rc < 0)
            return rc;
    }
    int rc = load_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos, info);
    if (rc == KIRI_OK)
        rc = load_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos, info);
    if (rc == KIRI_OK && t->model == MODEL_SPM)
        rc = load_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, info);
    if (rc < 0)
        return rc;
    if (t->model == MODEL_BPE && (t->pre->flags & KIRI_PRE_FORCE_BOS))
        t->add_bos = 1;

    if (t->eos >= 0)
        t->flags[t->eos] |= FLAG_EOG;
    if (t->eot >= 0)
        t->flags[t->eot] |= FLAG_EOG;
    if (t->eom >= 0)
        t->flags[t->eom] |= FLAG_EOG;
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = vocab_find(t, eog_texts[i], strlen(eog_texts[i]));
        if (id < 0)
            continue;
        t->flags[id] |= FLAG_EOG;
        t->type[id] = TT_CONTROL;
    }
    return KIRI_OK;
}

/* ============================================================================================
 * Loading: merges, byte tokens, pieces, the special-token trie
 * ============================================================================================ */

static int load_merges(struct kiri_tokenizer *t, const struct kiri_gguf *g,
                       struct kiri_status_info *info)
{
    int et;
    uint64_t n;
    const void *data;
    int rc = kiri_gguf_get_arr(g, KEY_MERGES, 1, &et, &n, &data, info);
    if (rc < 0)
        return rc;
    if (et != KIRI_GGUF_STRING)
        return fail(info, KIRI_E_MODEL_INVALID, g, KEY_MERGES,
                    "merges must be an array of strings (element type is %d)", et);
    if (n > MAX_MERGES)
        return fail(info, KIRI_E_MODEL_INVALID, g, KEY_MERGES, "%llu merges is too many",
                    (unsigned long long)n);
    int64_t km = kiri_gguf_find_key(g, KEY_MERGES);
    size_t cap = 16;
    while (cap < 2 * (size_t)n)
        cap <<= 1;
    t->merges = kiri_mem_calloc(cap, sizeof *t->merges);
    if (!t->merges)
        return nomem(info);
    t->merge_mask = cap - 1;

    /* A result longer than the longest token cannot be one, so one buffer of that size will do. */
    char *buf = kiri_mem_alloc(t->max_token_len);
    if (!buf)
        return nomem(info);
    rc = KIRI_OK;
    for (uint64_t i = 0; i < n && rc == KIRI_OK; i++) {
        struct kiri_gguf_str s = kiri_gguf_arr_str(g, km, i);
        const char *sp = s.len ? memchr(s.ptr, ' ', (size_t)s.len) : NULL;
        size_t ll = sp ? (size_t)(sp - s.ptr) : 0;
        size_t rl = sp ? (size_t)s.len - ll - 1 : 0;
        if (!sp || ll == 0 || rl == 0 || memchr(sp + 1, ' ', rl)) {
            rc = fail(info, KIRI_E_MODEL_INVALID, g, KEY_MERGES,
                      "merge %llu is not \"left right\" with one space", (unsigned long long)i);
            break;
        }
        int32_t l = vocab_find(t, s.ptr, ll);
        int32_t r = vocab_find(t, sp + 1, rl);
        int32_t res = -1;
        if (l >= 0 && r >= 0 && ll + rl <= t->max_token_len) {
            memcpy(buf, s.ptr, ll);
            memcpy(buf + ll, sp + 1, rl);
            res = vocab_find(t, buf, ll + rl);
        }
        if (res < 0) {
            rc = fail(info, KIRI_E_MODEL_INVALID, g, KEY_MERGES,
                      "merge %llu (\"%.*s\") names a %s that is not a token",
                      (unsigned long long)i, (int)(s.len > 80 ? 80 : s.len), s.ptr,
                      l < 0 || r < 0 ? "part" : "result");
            break;
        }
        uint64_t key = ((uint64_t)(uint32_t)(l + 1) << 32) | (uint32_t)(r + 1);
        size_t j = (size_t)hash_u64(key) & t->merge_mask;
        while (t->merges[j].key && t->merges[j].key != key)
            j = (j + 1) & t->merge_mask;
        if (!t->merges[j].key) {
            t->merges[j].key = key;
            t->merges[j].rank = (int32_t)i;
            t->merges[j].result = res;
        }
    }
    kiri_mem_free(buf);
    return rc;
}

static void find_byte_tokens(struct kiri_tokenizer *t)
{
    for (int b = 0; b < 256; b++)
        t->byte_tok[b] = -1;
    if (t->model == MODEL_BPE && !t->raw) {
        for (unsigned b = 0; b < 256; b++) {
            char buf[4];
            size_t n = kiri_utf8_encode(t->byte_cp[b], buf);
            t->byte_tok[b] = vocab_find(t, buf, n);
        }
        return;
    }
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->type[id] != TT_BYTE)
            continue;
        int b = parse_byte_token(t->text + t->text_off[id], tok_len(t, id));
        if (t->byte_tok[b] < 0)
            t->byte_tok[b] = id;
    }
    for (int b = 0; b < 256; b++) {
        if (t->byte_tok[b] >= 0)
            continue;
        char buf[8];
        snprintf(buf, sizeof buf, "<0x%02X>", b);
        t->byte_tok[b] = vocab_find(t, buf, 6);
    }
}

/* Writes the decoded bytes of token id to out (room for its text length: pieces never grow). */
static size_t decode_token(const struct kiri_tokenizer *t, int32_t id, char *out)
{
    const unsigned char *s = (const unsigned char *)t->text + t->text_off[id];
    size_t n = tok_len(t, id), o = 0;
    uint8_t ty = t->type[id];
    if (ty == TT_BYTE) {
        out[0] = (char)parse_byte_token((const char *)s, n);
        return 1;
    }
    if (ty != TT_NORMAL && ty != TT_UNDEFINED) {
        memcpy(out, s, n);
        return n;
    }
    if (t->model == MODEL_SPM || t->raw) {
        for (size_t i = 0; i < n;) {
            if (i + 3 <= n && s[i] == 0xE2 && s[i + 1] == 0x96 && s[i + 2] == 0x81) {
                out[o++] = ' ';
                i += 3;
            } else {
                out[o++] = (char)s[i++];
            }
        }
        return o;
    }
    /* Byte-level BPE: each character of the GPT-2 alphabet is one byte; anything else (a token
     * stored as raw text) passes through unchanged. */
    for (size_t i = 0; i < n;) {
        const int len = kiri_utf8_check(s + i, n - i);
        if (len <= 0) {
            out[o++] = (char)s[i++];
            continue;
        }
        uint32_t cp;
        kiri_utf8_decode((const char *)s + i, (size_t)len, &cp);
        int byte = cp < 324 ? t->cp_byte[cp] : -1;
        if (byte >= 0) {
            out[o++] = (char)byte;
        } else {
            memcpy(out + o, s + i, (size_t)len);
            o += (size_t)len;
        }
        i += (size_t)len;
    }
    return o;
}

static int build_pieces(struct kiri_tokenizer *t, struct kiri_status_info *info)
{
    t->piece = kiri_mem_alloc(t->text_off[t->n_vocab]);
    t->piece_off = kiri_mem_array((size_t)t->n_vocab + 1, sizeof *t->piece_off);
    if (!t->piece || !t->piece_off)
        return nomem(info);
    size_t off = 0;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        t->piece_off[id] = off;
        size_t len = decode_token(t, id, t->piece + off);
        if (len > t->max_piece_len)
            t->max_piece_len = len;
        off += len;
    }
    t->piece_off[t->n_vocab] = off;
    return KIRI_OK;
}

static int is_special_type(uint8_t ty)
{
    return ty == TT_CONTROL || ty == TT_UNKNOWN || ty == TT_USER;
}

static int build_trie(struct kiri_tokenizer *t, struct kiri_status_info *info)
{
    size_t nodes = 1;
    for (int32_t id = 0; id < t->n_vocab; id++)
        if (is_special_type(t->type[id]))
            nodes += tok_len(t, id);
    if (nodes > INT32_MAX)
        return nomem(info);
    t->trie = kiri_mem_array(nodes, sizeof *t->trie);
    if (!t->trie)
        return nomem(info);
    t->trie[0] = (struct trie_node){-1, -1, -1, 0};
    t->n_trie = 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (!is_special_type(t->type[id]))
            continue;
        const unsigned char *s = (const unsigned char *)t->text + t->text_off[id];
        size_t n = tok_len(t, id);
        int32_t node = 0;
        for (size_t i = 0; i < n; i++) {
            int32_t c = t->trie[node].child;
            while (c >= 0 && t->trie[c].byte != s[i])
                c = t->trie[c].sibling;
            if (c < 0) {
                c = t->n_trie++;
                t->trie[c] = (struct trie_node){-1, t->trie[node].child, -1, s[i]};
                t->trie[node].child = c;
            }
            node = c;
        }
        if (t->trie[node].id < 0)
            t->trie[node].id = id;
        t->special_first[s[0] >> 3] |= (uint8_t)(1u << (s[0] & 7));
    }
    return KIRI_OK;
}

/* ============================================================================================
 * Loading: pre-tokenizer regexes
 * ============================================================================================ */

static void *pcre_alloc(PCRE2_SIZE size, void *ud)
{
    (void)ud;
    return kiri_mem_alloc(size);
}

static void pcre_free(void *p, void *ud)
{
    (void)ud;
    kiri_mem_free(p);
}

static int compile_pre(struct kiri_tokenizer *t, const struct kiri_gguf *g,
                       struct kiri_status_info *info)
{
    t->gctx = pcre2_general_context_create(pcre_alloc, pcre_free, NULL);
    if (!t->gctx)
        return nomem(info);
    pcre2_compile_context *cc = pcre2_compile_context_create(t->gctx);
    if (!cc)
        return nomem(info);
    int rc = KIRI_OK;
    for (int i = 0; i < KIRI_PRE_MAX_REGEX && t->pre->re[i]; i++) {
        int err;
        PCRE2_SIZE erroff;
        /* $ is the end of the piece only, as in the ECMAScript regexes llama.cpp runs. */
        t->re[i] = pcre2_compile((PCRE2_SPTR)t->pre->re[i], PCRE2_ZERO_TERMINATED,
                                 PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &erroff, cc);
        if (!t->re[i]) {
            if (err == PCRE2_ERROR_HEAP_FAILED)
                rc = nomem(info);
            else
                rc = fail(info, KIRI_E_UNSUPPORTED, g, KEY_PRE,
                          "pre-tokenizer regex does not compile (PCRE2 error %d at %zu)", err,
                          (size_t)erroff);
            break;
        }
        t->n_re = i + 1;
        /* Without JIT (not built in, or no executable memory) the interpreter gives the same
         * results, only slower. */
        (void)pcre2_jit_compile(t->re[i], PCRE2_JIT_COMPLETE);
    }
    pcre2_compile_context_free(cc);
    return rc;
}

/* ============================================================================================
 * Init and free, accessors
 * ============================================================================================ */

int kiri_tokenizer_init(const struct kiri_gguf *g, struct kiri_tokenizer **out,
                        struct kiri_status_info *info)
{
    if (!g || !out)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "kiri_tokenizer_init: NULL argument");
    struct kiri_tokenizer *t = kiri_mem_calloc(1, sizeof *t);
    if (!t)
        return nomem(info);
    int rc = load_model_kind(t, g, info);
    if (rc == KIRI_OK)
        rc = load_tokens(t, g, info);
    if (rc == KIRI_OK)
        rc = load_specials(t, g, info);
    gpt2_tables(t->byte_cp, t->cp_byte);
    if (rc == KIRI_OK && t->model == MODEL_BPE)
        rc = load_merges(t, g, info);
    if (rc == KIRI_OK && t->model == MODEL_BPE)
        rc = compile_pre(t, g, info);
    if (rc == KIRI_OK) {
        find_byte_tokens(t);
        rc = build_pieces(t, info);
    }
    if (rc == KIRI_OK)
        rc = build_trie(t, info);
    if (rc < 0) {
        kiri_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return KIRI_OK;
}

void kiri_tokenizer_free(struct kiri_tokenizer *t)
{
    if (!t)
        return;
    for (int i = 0; i < KIRI_PRE_MAX_REGEX; i++)
        if (t->re[i])
            pcre2_code_free(t->re[i]);
    if (t->gctx)
        pcre2_general_context_free(t->gctx);
    kiri_mem_free(t->model_name);
    kiri_mem_free(t->pre_name);
    kiri_mem_free(t->text);
    kiri_mem_free(t->text_off);
    kiri_mem_free(t->piece);
    kiri_mem_free(t->piece_off);
    kiri_mem_free(t->scores);
    kiri_mem_free(t->type);
    kiri_mem_free(t->flags);
    kiri_mem_free(t->tok_slots);
    kiri_mem_free(t->merges);
    kiri_mem_free(t->trie);
    kiri_mem_free(t);
}

int32_t kiri_tokenizer_n_vocab(const struct kiri_tokenizer *t) { return t->n_vocab; }
int32_t kiri_tokenizer_bos(const struct kiri_tokenizer *t) { return t->bos; }
int32_t kiri_tokenizer_eos(const struct kiri_tokenizer *t) { return t->eos; }
int kiri_tokenizer_add_bos(const struct kiri_tokenizer *t) { return t->add_bos && t->bos >= 0; }
int kiri_tokenizer_add_eos(const struct kiri_tokenizer *t) { return t->add_eos && t->eos >= 0; }
const char *kiri_tokenizer_model_name(const struct kiri_tokenizer *t) { return t->model_name; }
const char *kiri_tokenizer_pre_name(const struct kiri_tokenizer *t) { return t->pre_name; }
size_t kiri_tokenizer_max_piece(const struct kiri_tokenizer *t) { return t->max_piece_len; }

int kiri_tokenizer_is_eog(const struct kiri_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && (t->flags[id] & FLAG_EOG);
}

int kiri_tokenizer_is_control(const struct kiri_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_vocab && t->type[id] == TT_CONTROL;
}

int32_t kiri_tokenizer_find(const struct kiri_tokenizer *t, const char *text, size_t len)
{
    if (!text || len == 0 || len > t->max_token_len)
        return -1;
    return vocab_find(t, text, len);
}

/* ============================================================================================
 * Encoding: per-call scratch, output, the merge queue
 * ============================================================================================ */

/* A symbol in a merge sequence: a span of the text (SPM) or a token id (BPE), in a doubly linked
 * list. A symbol absorbed by its left neighbour gets next = -2. */
struct sym {
    int32_t prev, next;
    uint32_t start, len;   /* SPM: span in the escaped text */
    int32_t id;            /* BPE: current token, or -1 for a byte without a token */
};

/* A candidate merge of symbols (left, right). key orders the queue (smallest first): the high
 * half is the priority (SPM: inverted score; BPE: rank), the low half the left index, so ties
 * go to the leftmost pair. a/b/c let a popped entry be checked against the current symbols. */
struct cand {
    uint64_t key;
    int32_t right;
    int32_t a, b, c;   /* SPM: a = merged length, b = token. BPE: a, b = ids, c = result */
};

/* Everything one encode call allocates; freed at its end. */
struct scratch {
    char *text;            /* sanitized input, when the input was not valid UTF-8 */
    char *buf;             /* SPM: escaped fragment; BPE: mapped pre-token */
    size_t buf_cap;
    char *esc;             /* raw BPE: the fragment with spaces as U+2581 */
    size_t esc_cap;
    struct sym *sym;
    size_t sym_cap;
    struct cand *heap;
    size_t heap_n, heap_cap;
    pcre2_match_data *md;
    int32_t *ids;          /* caller's output */
    int64_t cap, n;
};

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return KIRI_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c = c > SIZE_MAX / 2 ? need : 2 * c;
    if (c > SIZE_MAX / elem)
        return KIRI_E_NOMEM;
    void *q = kiri_mem_realloc(*p, c * elem);
    if (!q)
        return KIRI_E_NOMEM;
    *p = q;
    *cap = c;
    return KIRI_OK;
}

static void emit(struct scratch *sc, int32_t id)
{
    if (sc->n < sc->cap)
        sc->ids[sc->n] = id;
    sc->n++;
}

static int heap_push(struct scratch *sc, const struct cand *c)
{
    if (sc->heap_n == sc->heap_cap &&
        grow((void **)&sc->heap, &sc->heap_cap, sc->heap_n + 1, sizeof *sc->heap) < 0)
        return KIRI_E_NOMEM;
    size_t i = sc->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (sc->heap[p].key <= c->key)
            break;
        sc->heap[i] = sc->heap[p];
        i = p;
    }
    sc->heap[i] = *c;
    return KIRI_OK;
}

static struct cand heap_pop(struct scratch *sc)
{
    struct cand top = sc->heap[0];
    struct cand last = sc->heap[--sc->heap_n];
    size_t i = 0, n = sc->heap_n;
    for (;;) {
        size_t l = 2 * i + 1;
        if (l >= n)
            break;
        if (l + 1 < n && sc->heap[l + 1].key < sc->heap[l].key)
            l++;
        if (last.key <= sc->heap[l].key)
            break;
        sc->heap[i] = sc->heap[l];
        i = l;
    }
    if (n)
        sc->heap[i] = last;
    return top;
}

/* Maps a score to a key where a higher score sorts first. */
static uint32_t score_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ~u;
}

/* ============================================================================================
 * Encoding: SentencePiece
 * ============================================================================================ */

static int spm_try(const struct kiri_tokenizer *t, struct scratch *sc, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return KIRI_OK;
    uint32_t len = sc->sym[l].len + sc->sym[r].len;
    if (len > t->max_token_len)
        return KIRI_OK;   /* cannot be a token: keeps the work linear in the text */
    int32_t id = vocab_find(t, sc->buf + sc->sym[l].start, len);
    if (id < 0 || !mergeable(t, id))
        return KIRI_OK;
    float score = t->scores ? t->scores[id] : 0.0f;
    struct cand c = {((uint64_t)score_key(score) << 32) | (uint32_t)l, r, (int32_t)len, id, 0};
    return heap_push(sc, &c);
}

/* Tokenizes one fragment of text between special tokens: spaces become U+2581 (with one more in
 * front when prefix is set), then the adjacent pair whose joined text is the best-scoring token
 * is merged until none is left; pieces that are not tokens become byte tokens. */
static int spm_fragment(const struct kiri_tokenizer *t, struct scratch *sc, const char *s,
                        size_t n, int prefix)
{
    if (grow((void **)&sc->buf, &sc->buf_cap, 3 * n + 3, 1) < 0)
        return KIRI_E_NOMEM;
    size_t m = 0;
    if (prefix) {
        memcpy(sc->buf, "\xE2\x96\x81", 3);
        m = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(sc->buf + m, "\xE2\x96\x81", 3);
            m += 3;
        } else {
            sc->buf[m++] = s[i];
        }
    }
    size_t n_sym = 0;
    for (size_t i = 0; i < m; i += char_len(sc->buf + i, m - i))
        n_sym++;
    if (grow((void **)&sc->sym, &sc->sym_cap, n_sym, sizeof *sc->sym) < 0)
        return KIRI_E_NOMEM;
    size_t k = 0;
    for (size_t i = 0; i < m; k++) {
        size_t len = char_len(sc->buf + i, m - i);
        sc->sym[k] = (struct sym){(int32_t)k - 1, k + 1 < n_sym ? (int32_t)k + 1 : -1,
                                  (uint32_t)i, (uint32_t)len, -1};
        i += len;
    }
    sc->heap_n = 0;
    for (size_t i = 0; i + 1 < n_sym; i++)
        if (spm_try(t, sc, (int32_t)i, (int32_t)i + 1) < 0)
            return KIRI_E_NOMEM;
    while (sc->heap_n) {
        struct cand c = heap_pop(sc);
        int32_t l = (int32_t)(c.key & 0xFFFFFFFFu), r = c.right;
        struct sym *L = &sc->sym[l], *R = &sc->sym[r];
        if (L->next != r || L->len == 0 || R->len == 0 || L->len + R->len != (uint32_t)c.a)
            continue;   /* stale: one side has changed since this pair was queued */
        L->len += R->len;
        R->len = 0;
        L->next = R->next;
        R->next = -2;
        if (L->next >= 0)
            sc->sym[L->next].prev = l;
        if (spm_try(t, sc, L->prev, l) < 0 || spm_try(t, sc, l, L->next) < 0)
            return KIRI_E_NOMEM;
    }
    for (int32_t i = 0; i >= 0 && n_sym; i = sc->sym[i].next) {
        const char *p = sc->buf + sc->sym[i].start;
        int32_t id = vocab_find(t, p, sc->sym[i].len);
        if (id >= 0 && mergeable(t, id)) {
            emit(sc, id);
            continue;
        }
        /* Unmerged symbols are single characters: spell one in byte tokens when the vocabulary
         * has them all, else it is one unknown token. */
        uint32_t j = 0;
        while (j < sc->sym[i].len && t->byte_tok[(unsigned char)p[j]] >= 0)
            j++;
        if (j == sc->sym[i].len) {
            for (j = 0; j < sc->sym[i].len; j++)
                emit(sc, t->byte_tok[(unsigned char)p[j]]);
        } else if (t->unk >= 0) {
            emit(sc, t->unk);
        }
    }
    return KIRI_OK;
}

/* ============================================================================================
 * Encoding: byte-level BPE
 * ============================================================================================ */

static int bpe_try(const struct kiri_tokenizer *t, struct scratch *sc, int32_t l, int32_t r)
{
    if (l < 0 || r < 0 || sc->sym[l].id < 0 || sc->sym[r].id < 0)
        return KIRI_OK;
    const struct merge_slot *m = merge_find(t, sc->sym[l].id, sc->sym[r].id);
    if (!m)
        return KIRI_OK;
    struct cand c = {((uint64_t)(uint32_t)m->rank << 32) | (uint32_t)l, r, sc->sym[l].id,
                     sc->sym[r].id, m->result};
    return heap_push(sc, &c);
}

static void bpe_emit(const struct kiri_tokenizer *t, struct scratch *sc, int32_t id)
{
    if (id >= 0)
        emit(sc, id);
    else if (t->unk >= 0)
        emit(sc, t->unk);
}

/* Spells the bytes of w[0, n) in <0xHH> tokens, leaving out bytes that have none (raw BPE). */
static void emit_bytes(const struct kiri_tokenizer *t, struct scratch *sc, const unsigned char *w,
                       size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (t->byte_tok[w[i]] >= 0)
            emit(sc, t->byte_tok[w[i]]);
}

/* The whole pre-token as one token, when the pre-tokenizer takes such pre-tokens unmerged:
 * tiktoken-style vocabularies, and a run of newlines in raw BPE. -1 otherwise. */
static int32_t whole_token(const struct kiri_tokenizer *t, struct scratch *sc,
                           const unsigned char *w, size_t n)
{
    if (t->raw) {
        for (size_t i = 0; i < n; i++)
            if (w[i] != '\n')
                return -1;
        return n <= t->max_token_len ? vocab_find(t, (const char *)w, n) : -1;
    }
    if (!t->ignore_merges || n > t->max_token_len)
        return -1;
    if (grow((void **)&sc->buf, &sc->buf_cap, 2 * n, 1) < 0)
        return -1;   /* the merges below give the same tokens, only slower */
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        m += kiri_utf8_encode(t->byte_cp[w[i]], sc->buf + m);
    int32_t id = m <= t->max_token_len ? vocab_find(t, sc->buf, m) : -1;
    return id >= 0 && mergeable(t, id) ? id : -1;
}

/* Tokenizes one pre-token: starting from one symbol per byte (per character in raw BPE), merges
 * the adjacent pair with the lowest merge rank (leftmost on ties) until no pair has a merge. */
static int bpe_word(const struct kiri_tokenizer *t, struct scratch *sc, const unsigned char *w,
                    size_t n)
{
    if (n == 0)
        return KIRI_OK;
    if (n == 1 && !t->raw) {
        bpe_emit(t, sc, t->byte_tok[w[0]]);
        return KIRI_OK;
    }
    int32_t whole = whole_token(t, sc, w, n);
    if (whole >= 0) {
        emit(sc, whole);
        return KIRI_OK;
    }
    if (grow((void **)&sc->sym, &sc->sym_cap, n, sizeof *sc->sym) < 0)
        return KIRI_E_NOMEM;
    size_t n_sym = 0;
    for (size_t i = 0; i < n; n_sym++) {
        size_t len = t->raw ? char_len((const char *)w + i, n - i) : 1;
        int32_t id = t->raw ? vocab_find(t, (const char *)w + i, len) : t->byte_tok[w[i]];
        sc->sym[n_sym] = (struct sym){(int32_t)n_sym - 1, -1, (uint32_t)i, (uint32_t)len, id};
        if (n_sym)
            sc->sym[n_sym - 1].next = (int32_t)n_sym;
        i += len;
    }
    sc->heap_n = 0;
    for (size_t i = 0; i + 1 < n_sym; i++)
        if (bpe_try(t, sc, (int32_t)i, (int32_t)i + 1) < 0)
            return KIRI_E_NOMEM;
    while (sc->heap_n) {
        struct cand c = heap_pop(sc);
        int32_t l = (int32_t)(c.key & 0xFFFFFFFFu), r = c.right;
        struct sym *L = &sc->sym[l], *R = &sc->sym[r];
        if (L->next != r || L->id != c.a || R->id != c.b)
            continue;   /* stale */
        L->id = c.c;
        L->len += R->len;
        L->next = R->next;
        R->next = -2;
        if (L->next >= 0)
            sc->sym[L->next].prev = l;
        if (bpe_try(t, sc, L->prev, l) < 0 || bpe_try(t, sc, l, L->next) < 0)
            return KIRI_E_NOMEM;
    }
    for (int32_t i = 0; i >= 0; i = sc->sym[i].next) {
        if (t->raw && sc->sym[i].id < 0)
            emit_bytes(t, sc, w + sc->sym[i].start, sc->sym[i].len);
        else
            bpe_emit(t, sc, sc->sym[i].id);
    }
    return KIRI_OK;
}

/* Applies pre-tokenizer regex `level` to s[0, n): every match and every stretch between matches
 * becomes a piece, split further by the next regex, and finally merged by bpe_word. */
static int bpe_split(const struct kiri_tokenizer *t, struct scratch *sc, int level, const char *s,
                     size_t n)
{
    if (level == t->n_re)
        return bpe_word(t, sc, (const unsigned char *)s, n);
    size_t pos = 0, from = 0;
    int rc;
    while (from < n) {
        int m = pcre2_match(t->re[level], (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, sc->md, NULL);
        if (m == PCRE2_ERROR_JIT_STACKLIMIT)
            m = pcre2_match(t->re[level], (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                            sc->md, NULL);
        if (m == PCRE2_ERROR_NOMATCH)
            break;
        if (m < 0)
            return m == PCRE2_ERROR_NOMEMORY || m == PCRE2_ERROR_HEAPLIMIT ? KIRI_E_NOMEM
                                                                           : KIRI_E_INVALID_ARG;
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(sc->md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) {
            /* An empty match: search again one character on; the character joins the gap. */
            from = ms + (ms < n ? char_len(s + ms, n - ms) : 1);
            continue;
        }
        if (ms > pos && (rc = bpe_split(t, sc, level + 1, s + pos, ms - pos)) < 0)
            return rc;
        if ((rc = bpe_split(t, sc, level + 1, s + ms, me - ms)) < 0)
            return rc;
        pos = from = me;
    }
    if (pos < n && (rc = bpe_split(t, sc, level + 1, s + pos, n - pos)) < 0)
        return rc;
    return KIRI_OK;
}

/* ============================================================================================
 * Encoding: the entry point
 * ============================================================================================ */

/* Returns the valid UTF-8 version of text: text itself when it is valid, else a copy in
 * sc->text with each maximal invalid subsequence replaced by U+FFFD. NULL when out of memory. */
static const char *sanitize(struct scratch *sc, const char *text, size_t len, size_t *out_len)
{
    *out_len = len;
    if (kiri_utf8_valid(text, len))
        return text;
    /* At most 3 bytes per byte replaced, the unfinished tail (one U+FFFD) included. */
    sc->text = kiri_mem_alloc(3 * len);
    if (!sc->text)
        return NULL;
    size_t hold;
    size_t o = kiri_utf8_repair((const unsigned char *)text, len, sc->text, &hold);
    if (hold) {
        memcpy(sc->text + o, KIRI_UTF8_REPLACEMENT, 3);
        o += 3;
    }
    *out_len = o;
    return sc->text;
}

/* The special token whose text is longest at s (among those allowed), ending on a character
 * boundary; -1 if none. */
static int32_t match_special(const struct kiri_tokenizer *t, const unsigned char *s, size_t n,
                             int parse_special, size_t *len)
{
    int32_t best = -1;
    int32_t node = 0;
    for (size_t k = 0; k < n; k++) {
        int32_t c = t->trie[node].child;
        while (c >= 0 && t->trie[c].byte != s[k])
            c = t->trie[c].sibling;
        if (c < 0)
            break;
        node = c;
        int32_t id = t->trie[node].id;
        if (id >= 0 && (parse_special || t->type[id] == TT_USER) &&
            (k + 1 == n || (s[k + 1] & 0xC0) != 0x80)) {
            best = id;
            *len = k + 1;
        }
    }
    return best;
}

/* Tokenizes text between special tokens. Every such fragment starts the text or follows a special
 * token, and SentencePiece gives each one its dummy prefix (as llama.cpp and per-segment
 * SentencePiece encoding do). */
static int encode_fragment(const struct kiri_tokenizer *t, struct scratch *sc, const char *s,
                           size_t n)
{
    if (n == 0)
        return KIRI_OK;
    if (t->model == MODEL_SPM)
        return spm_fragment(t, sc, s, n, t->add_space_prefix);
    if (!t->raw)
        return bpe_split(t, sc, 0, s, n);
    if (n > SIZE_MAX / 3 || grow((void **)&sc->esc, &sc->esc_cap, 3 * n, 1) < 0)
        return KIRI_E_NOMEM;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(sc->esc + m, "\xE2\x96\x81", 3);
            m += 3;
        } else {
            sc->esc[m++] = s[i];
        }
    }
    return bpe_split(t, sc, 0, sc->esc, m);
}

int kiri_tokenizer_encode(const struct kiri_tokenizer *t, const char *text, size_t len, int add_bos,
                          int add_eos, int parse_special, int32_t *ids, int cap)
{
    if (!t || (!text && len) || cap < 0 || (cap > 0 && !ids) || len > MAX_TEXT)
        return KIRI_E_INVALID_ARG;
    struct scratch sc = {0};
    sc.ids = ids;
    sc.cap = cap;
    int rc = KIRI_OK;
    size_t n;
    const char *s = len ? sanitize(&sc, text, len, &n) : "";
    if (!s) {
        rc = KIRI_E_NOMEM;
        goto done;
    }
    if (!len)
        n = 0;
    if (t->model == MODEL_BPE && n) {
        sc.md = pcre2_match_data_create(1, t->gctx);
        if (!sc.md) {
            rc = KIRI_E_NOMEM;
            goto done;
        }
    }
    if (add_bos && t->bos >= 0)
        emit(&sc, t->bos);

    /* Split on special-token texts; the text between them is tokenized normally. */
    const unsigned char *u = (const unsigned char *)s;
    size_t frag = 0;
    for (size_t i = 0; i < n && t->n_trie > 1;) {
        size_t mlen = 0;
        int32_t id = -1;
        if ((t->special_first[u[i] >> 3] >> (u[i] & 7)) & 1)
            id = match_special(t, u + i, n - i, parse_special, &mlen);
        if (id < 0) {
            i++;
            continue;
        }
        if ((rc = encode_fragment(t, &sc, s + frag, i - frag)) < 0)
            goto done;
        emit(&sc, id);
        i += mlen;
        frag = i;
    }
    if (frag < n) {
        if ((rc = encode_fragment(t, &sc, s + frag, n - frag)) < 0)
            goto done;
    }
    if (add_eos && t->eos >= 0)
        emit(&sc, t->eos);
    rc = sc.n > INT_MAX ? KIRI_E_INVALID_ARG : (int)sc.n;
done:
    if (sc.md)
        pcre2_match_data_free(sc.md);
    kiri_mem_free(sc.text);
    kiri_mem_free(sc.buf);
    kiri_mem_free(sc.esc);
    kiri_mem_free(sc.sym);
    kiri_mem_free(sc.heap);
    return rc;
}

/* ============================================================================================
 * Decoding
 * ============================================================================================ */

/* The bytes token id decodes to (see kiri_tokenizer_piece); *len is 0 for hidden tokens. */
static const char *piece_of(const struct kiri_tokenizer *t, int32_t id, int render_special,
                            size_t *len)
{
    uint8_t ty = t->type[id];
    if (!render_special && (ty == TT_CONTROL || ty == TT_UNKNOWN || ty == TT_UNUSED)) {
        *len = 0;
        return "";
    }
    *len = t->piece_off[id + 1] - t->piece_off[id];
    return t->piece + t->piece_off[id];
}

int kiri_tokenizer_piece(const struct kiri_tokenizer *t, int32_t id, int render_special, char *buf,
                         size_t cap)
{
    if (!t || id < 0 || id >= t->n_vocab || (cap && !buf))
        return KIRI_E_INVALID_ARG;
    size_t n;
    const char *p = piece_of(t, id, render_special, &n);
    if (n <= cap)
        memcpy(buf, p, n);
    return (int)n;
}

int kiri_detok_push(const struct kiri_tokenizer *t, struct kiri_detok_stream *s, int32_t id,
                    int render_special, char *out, size_t cap)
{
    if (!t || !s || id < 0 || id >= t->n_vocab || s->n_pending < 0 || s->n_pending > 3 ||
        (cap && !out))
        return KIRI_E_INVALID_ARG;
    size_t n;
    const char *p = piece_of(t, id, render_special, &n);
    /* The held bytes and the piece, joined: on the stack for the usual piece, on the heap for the
     * rare long one (vocabularies of code models carry tokens of a thousand spaces). */
    unsigned char stack[8 + 256];
    unsigned char *buf = stack;
    if (n > sizeof stack - 8) {
        buf = kiri_mem_alloc(n + 8);
        if (!buf)
            return KIRI_E_NOMEM;
    }
    memcpy(buf, s->pending, (size_t)s->n_pending);
    memcpy(buf + s->n_pending, p, n);
    n += (size_t)s->n_pending;
    size_t hold;
    size_t need = kiri_utf8_repair(buf, n, NULL, &hold);
    int rc;
    if (need > cap || need > INT_MAX) {
        rc = KIRI_E_INVALID_ARG;
    } else {
        kiri_utf8_repair(buf, n, out, &hold);
        memcpy(s->pending, buf + n - hold, hold);
        s->n_pending = (int)hold;
        rc = (int)need;
    }
    if (buf != stack)
        kiri_mem_free(buf);
    return rc;
}

int kiri_detok_flush(struct kiri_detok_stream *s, char *out, size_t cap)
{
    if (!s || s->n_pending < 0 || s->n_pending > 3)
        return KIRI_E_INVALID_ARG;
    if (s->n_pending == 0)
        return 0;
    if (cap < 3 || !out)
        return KIRI_E_INVALID_ARG;
    memcpy(out, KIRI_UTF8_REPLACEMENT, 3);
    s->n_pending = 0;
    return 3;
}
