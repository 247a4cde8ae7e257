/* Tests for runtime/tokenizer.c: llama.cpp's tokenizer vectors for four vocabularies (expected ids
 * made by llama.cpp and Hugging Face's tokenizers, read from KIRI_SHARED_DIR), round trips,
 * streaming detokenization, special tokens, malformed vocabularies built in memory, the failing
 * allocator, and a speed check on about 1 MB of text. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "kiri.h"
#include "mem.h"
#include "platform.h"
#include "test.h"
#include "tokenizer.h"

#ifndef KIRI_SHARED_DIR
#define KIRI_SHARED_DIR "../shared"
#endif

#define VEC_DIR KIRI_SHARED_DIR "/tokenizer-vectors/"
#define LONG_TOKEN 1024

/* ============================================================================================
 * Helpers
 * ============================================================================================ */

/* Test-side memory uses malloc, so that kiri_mem_fail_after only hits the code under test. */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

static int utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = u[i];
        size_t need = c < 0x80 ? 1 : (c >= 0xC2 && c <= 0xDF) ? 2 : (c >= 0xE0 && c <= 0xEF) ? 3
                      : (c >= 0xF0 && c <= 0xF4) ? 4 : 0;
        if (!need || i + need > n)
            return 0;
        for (size_t k = 1; k < need; k++)
            if ((u[i + k] & 0xC0) != 0x80)
                return 0;
        i += need;
    }
    return 1;
}

/* Encodes into a malloc'ed array (ids are returned through *out, the count as the result). */
static int encode(const struct kiri_tokenizer *t, const char *text, size_t len, int add_bos,
                  int parse_special, int32_t **out)
{
    int n = kiri_tokenizer_encode(t, text, len, add_bos, 0, parse_special, NULL, 0);
    *out = NULL;
    if (n < 0)
        return n;
    *out = malloc(((size_t)n + 1) * sizeof(int32_t));
    int m = kiri_tokenizer_encode(t, text, len, add_bos, 0, parse_special, *out, n);
    CHECK_EQ_INT(m, n);
    return n;
}

/* Concatenates the pieces of ids into a malloc'ed string. */
static char *decode(const struct kiri_tokenizer *t, const int32_t *ids, int n, int render_special,
                    size_t *len)
{
    size_t cap = (size_t)n * kiri_tokenizer_max_piece(t) + 1, o = 0;
    char *s = malloc(cap);
    for (int i = 0; i < n; i++) {
        int k = kiri_tokenizer_piece(t, ids[i], render_special, s + o, cap - o);
        CHECK(k >= 0);
        if (k > 0)
            o += (size_t)k;
    }
    s[o] = '\0';
    *len = o;
    return s;
}

/* ============================================================================================
 * The four vocabularies and their vectors
 * ============================================================================================ */

static const struct {
    const char *name;
    int32_t n_vocab;
    const char *model, *pre;
    int32_t bos, eos;
    int add_bos;
} vocabs[] = {
    {"llama-spm", 32000, "llama", "default", 1, 2, 1},
    {"gpt-2", 50257, "gpt2", "gpt-2", 50256, 50256, 0},
    {"llama-bpe", 128256, "gpt2", "llama-bpe", 128000, 128001, 1},
    {"qwen2", 151669, "gpt2", "qwen2", 151643, 151645, 0},
};
#define N_VOCABS 4

static struct kiri_tokenizer *toks[N_VOCABS];

/* Texts of a .inp file: each one is followed by the separator. */
#define MAX_TEXTS 64
struct texts {
    char *buf;
    const char *text[MAX_TEXTS];
    size_t len[MAX_TEXTS];
    int n;
};

static int load_texts(const char *path, struct texts *tx)
{
    static const char sep[] = "\n__ggml_vocab_test__\n";
    size_t len;
    tx->n = 0;
    tx->buf = slurp(path, &len);
    if (!tx->buf)
        return -1;
    const char *p = tx->buf, *end = tx->buf + len;
    while (p < end && tx->n < MAX_TEXTS) {
        const char *q = memmem(p, (size_t)(end - p), sep, sizeof sep - 1);
        if (!q)
            break;
        tx->text[tx->n] = p;
        tx->len[tx->n] = (size_t)(q - p);
        tx->n++;
        p = q + sizeof sep - 1;
    }
    return 0;
}

static void test_load_vocabs(void)
{
    for (int v = 0; v < N_VOCABS; v++) {
        char path[512];
        snprintf(path, sizeof path, VEC_DIR "ggml-vocab-%s.gguf", vocabs[v].name);
        struct kiri_gguf *g = NULL;
        struct kiri_status_info info;
        double t0 = kiri_platform_now();
        int rc = kiri_gguf_open(path, &g, &info);
        CHECK_EQ_INT(rc, KIRI_OK);
        if (rc) {
            fprintf(stderr, "%s: %s\n", path, info.message);
            continue;
        }
        rc = kiri_tokenizer_init(g, &toks[v], &info);
        kiri_gguf_close(g);
        CHECK_EQ_INT(rc, KIRI_OK);
        if (rc) {
            fprintf(stderr, "%s: %s (%s)\n", path, info.message, info.field);
            continue;
        }
        fprintf(stderr, "  %-10s loaded in %.3f s\n", vocabs[v].name, kiri_platform_now() - t0);
        const struct kiri_tokenizer *t = toks[v];
        CHECK_EQ_INT(kiri_tokenizer_n_vocab(t), vocabs[v].n_vocab);
        CHECK_STR(kiri_tokenizer_model_name(t), vocabs[v].model);
        CHECK_STR(kiri_tokenizer_pre_name(t), vocabs[v].pre);
        CHECK_EQ_INT(kiri_tokenizer_bos(t), vocabs[v].bos);
        CHECK_EQ_INT(kiri_tokenizer_eos(t), vocabs[v].eos);
        CHECK_EQ_INT(kiri_tokenizer_add_bos(t), vocabs[v].add_bos);
        CHECK_EQ_INT(kiri_tokenizer_add_eos(t), 0);
        CHECK(kiri_tokenizer_is_eog(t, vocabs[v].eos));
        CHECK(kiri_tokenizer_is_control(t, vocabs[v].eos));
        CHECK(!kiri_tokenizer_is_eog(t, 0));
        CHECK(!kiri_tokenizer_is_eog(t, -1));
        CHECK(!kiri_tokenizer_is_eog(t, vocabs[v].n_vocab));
    }
}

/* Every text of every vocabulary must give exactly the reference ids. */
static void test_vectors(void)
{
    for (int v = 0; v < N_VOCABS; v++) {
        if (!toks[v])
            continue;
        char path[512];
        struct texts tx;
        snprintf(path, sizeof path, VEC_DIR "ggml-vocab-%s.gguf.inp", vocabs[v].name);
        CHECK_EQ_INT(load_texts(path, &tx), 0);
        CHECK_EQ_INT(tx.n, 46);
        size_t olen;
        snprintf(path, sizeof path, VEC_DIR "ggml-vocab-%s.gguf.out", vocabs[v].name);
        char *out = slurp(path, &olen);
        CHECK(out != NULL);
        if (!out || !tx.buf) {
            free(tx.buf);
            free(out);
            continue;
        }
        int passed = 0;
        char *line = out;
        for (int i = 0; i < tx.n; i++) {
            char *nl = strchr(line, '\n');
            if (nl)
                *nl = '\0';
            int32_t want[1024];
            int n_want = 0;
            for (char *p = line; *p;) {
                char *e;
                long x = strtol(p, &e, 10);
                if (e == p)
                    break;
                if (n_want < 1024)
                    want[n_want++] = (int32_t)x;
                p = e;
            }
            line = nl ? nl + 1 : line + strlen(line);

            int32_t *got;
            int n = encode(toks[v], tx.text[i], tx.len[i], 0, 0, &got);
            int ok = n == n_want && memcmp(got, want, (size_t)n * sizeof(int32_t)) == 0;
            CHECK(ok);
            if (!ok) {
                fprintf(stderr, "  %s text %d \"%.*s\": want", vocabs[v].name, i,
                        (int)tx.len[i], tx.text[i]);
                for (int k = 0; k < n_want; k++)
                    fprintf(stderr, " %d", want[k]);
                fprintf(stderr, "\n    got");
                for (int k = 0; k < n; k++)
                    fprintf(stderr, " %d", got[k]);
                fprintf(stderr, "\n");
            }
            passed += ok;
            free(got);
        }
        fprintf(stderr, "  %-10s %d/%d vectors match\n", vocabs[v].name, passed, tx.n);
        free(out);
        free(tx.buf);
    }
}

/* decode(encode(text)) gives the text back (SentencePiece: behind the dummy prefix space), both
 * through kiri_tokenizer_piece and through the detok stream, whose every output must be whole
 * UTF-8 characters. */
static void test_round_trip(void)
{
    for (int v = 0; v < N_VOCABS; v++) {
        if (!toks[v])
            continue;
        char path[512];
        struct texts tx;
        snprintf(path, sizeof path, VEC_DIR "ggml-vocab-%s.gguf.inp", vocabs[v].name);
        if (load_texts(path, &tx) != 0)
            continue;
        int spm = strcmp(vocabs[v].model, "llama") == 0;
        int held = 0;
        for (int i = 0; i < tx.n; i++) {
            int32_t *ids;
            int n = encode(toks[v], tx.text[i], tx.len[i], 1, 0, &ids);
            size_t len;
            char *s = decode(toks[v], ids, n, 0, &len);
            size_t skip = spm && tx.len[i] ? 1 : 0;
            CHECK(len == tx.len[i] + skip && memcmp(s + skip, tx.text[i], tx.len[i]) == 0);
            if (skip)
                CHECK(s[0] == ' ');

            struct kiri_detok_stream st = {0};
            char *cat = malloc(len + 16);
            size_t o = 0;
            for (int k = 0; k < n; k++) {
                char buf[KIRI_DETOK_CAP];
                int w = kiri_detok_push(toks[v], &st, ids[k], 0, buf, sizeof buf);
                CHECK(w >= 0);
                if (w < 0)
                    break;
                CHECK(utf8_valid(buf, (size_t)w));
                if (w == 0 && st.n_pending)
                    held++;
                if (o + (size_t)w <= len)
                    memcpy(cat + o, buf, (size_t)w);
                o += (size_t)w;
            }
            char fl[8];
            CHECK_EQ_INT(kiri_detok_flush(&st, fl, sizeof fl), 0);
            CHECK(o == len && memcmp(cat, s, len) == 0);
            free(cat);
            free(s);
            free(ids);
        }
        /* Every vocabulary splits some emoji or Khmer text into partial-character tokens. */
        CHECK(held > 0);
        free(tx.buf);
    }
}

/* A four-byte character spelled as four byte tokens is held until its last byte; broken
 * sequences come out as U+FFFD. */
static void test_detok_stream(void)
{
    const struct kiri_tokenizer *t = toks[0];   /* llama-spm */
    if (!t)
        return;
    int32_t b[4];
    const unsigned char llama[4] = {0xF0, 0x9F, 0xA6, 0x99};   /* U+1F999 */
    for (int i = 0; i < 4; i++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", llama[i]);
        b[i] = kiri_tokenizer_find(t, name, 6);
        CHECK(b[i] >= 0);
    }
    struct kiri_detok_stream st = {0};
    char out[KIRI_DETOK_CAP];
    for (int i = 0; i < 3; i++)
        CHECK_EQ_INT(kiri_detok_push(t, &st, b[i], 0, out, sizeof out), 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[3], 0, out, sizeof out), 4);
    CHECK(memcmp(out, llama, 4) == 0);
    CHECK_EQ_INT(st.n_pending, 0);

    /* A cap too small leaves the stream as it was. */
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[0], 0, out, sizeof out), 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[1], 0, out, sizeof out), 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[2], 0, out, sizeof out), 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[3], 0, out, 3), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(st.n_pending, 3);
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[3], 0, out, 4), 4);

    /* Interrupted: F0 9F then "a" gives U+FFFD then "a"; a lone continuation byte gives U+FFFD. */
    int32_t a = kiri_tokenizer_find(t, "a", 1);
    CHECK(a >= 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[0], 0, out, sizeof out), 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[1], 0, out, sizeof out), 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, a, 0, out, sizeof out), 4);
    CHECK(memcmp(out, "\xEF\xBF\xBD" "a", 4) == 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[3], 0, out, sizeof out), 3);
    CHECK(memcmp(out, "\xEF\xBF\xBD", 3) == 0);
    /* Unfinished at the end: flush gives one U+FFFD. */
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[0], 0, out, sizeof out), 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, b[1], 0, out, sizeof out), 0);
    CHECK_EQ_INT(kiri_detok_flush(&st, out, 2), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_detok_flush(&st, out, sizeof out), 3);
    CHECK(memcmp(out, "\xEF\xBF\xBD", 3) == 0);
    CHECK_EQ_INT(kiri_detok_flush(&st, out, sizeof out), 0);

    /* Control tokens render only on request; bad ids are errors. */
    CHECK_EQ_INT(kiri_detok_push(t, &st, 1, 0, out, sizeof out), 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, 1, 1, out, sizeof out), 3);
    CHECK(memcmp(out, "<s>", 3) == 0);
    CHECK_EQ_INT(kiri_detok_push(t, &st, 32000, 0, out, sizeof out), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_detok_push(t, &st, -1, 0, out, sizeof out), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_tokenizer_piece(t, 32000, 0, out, sizeof out), KIRI_E_INVALID_ARG);

    /* Pieces: U+2581 reads as a space, byte tokens as their byte; a short buffer gets nothing. */
    int32_t hello = kiri_tokenizer_find(t, "\xE2\x96\x81Hello", 8);
    CHECK(hello >= 0);
    memset(out, 'x', 8);
    CHECK_EQ_INT(kiri_tokenizer_piece(t, hello, 0, out, 3), 6);
    CHECK(out[0] == 'x');
    CHECK_EQ_INT(kiri_tokenizer_piece(t, hello, 0, out, sizeof out), 6);
    CHECK(memcmp(out, " Hello", 6) == 0);
    CHECK_EQ_INT(kiri_tokenizer_piece(t, b[0], 0, out, sizeof out), 1);
    CHECK((unsigned char)out[0] == 0xF0);
    CHECK_EQ_INT(kiri_tokenizer_piece(t, 0, 0, out, sizeof out), 0);   /* <unk> */
    CHECK_EQ_INT(kiri_tokenizer_piece(t, 0, 1, out, sizeof out), 5);
}

/* The same text with and without special-token parsing, BOS/EOS, and invalid UTF-8. */
static void test_special(void)
{
    const struct kiri_tokenizer *q = toks[3], *l3 = toks[2], *spm = toks[0], *g2 = toks[1];
    int32_t *ids, *ids2;
    int n, n2;
    if (q) {
        const char *chat = "<|im_start|>user\nhi<|im_end|>";
        n = encode(q, chat, strlen(chat), 0, 1, &ids);
        CHECK(n >= 3 && ids[0] == 151644 && ids[n - 1] == 151645);
        n2 = encode(q, "user\nhi", 7, 0, 0, &ids2);
        CHECK(n == n2 + 2 && memcmp(ids + 1, ids2, (size_t)n2 * 4) == 0);
        free(ids);
        free(ids2);
        n = encode(q, chat, strlen(chat), 0, 0, &ids);
        for (int i = 0; i < n; i++)
            CHECK(ids[i] != 151644 && ids[i] != 151645);
        free(ids);
        /* <think> is USER_DEFINED: always matched. */
        n = encode(q, "a<think>b", 9, 0, 0, &ids);
        CHECK(n == 3 && ids[1] == 151667);
        free(ids);
        /* Leftmost wins over longer later matches; a partial special text is plain text. */
        n = encode(q, "<|im_start<|im_end|>", 20, 0, 1, &ids);
        CHECK(n >= 2 && ids[n - 1] == 151645);
        free(ids);
        CHECK(kiri_tokenizer_is_eog(q, 151643));   /* <|endoftext|> by text */
        CHECK(!kiri_tokenizer_is_eog(q, 151644));
        CHECK_EQ_INT(kiri_tokenizer_find(q, "<|im_end|>", 10), 151645);
        CHECK_EQ_INT(kiri_tokenizer_find(q, "<|im_end|", 9) == 151645, 0);
        char out[64];
        CHECK_EQ_INT(kiri_tokenizer_piece(q, 151667, 0, out, sizeof out), 7);   /* user-defined */
        CHECK_EQ_INT(kiri_tokenizer_piece(q, 151645, 0, out, sizeof out), 0);
        CHECK_EQ_INT(kiri_tokenizer_piece(q, 151645, 1, out, sizeof out), 10);
    }
    if (l3) {
        CHECK(kiri_tokenizer_is_eog(l3, 128009));   /* <|eot_id|> by text */
        const char *s = "<|begin_of_text|>Hi<|eot_id|>";
        n = encode(l3, s, strlen(s), 1, 1, &ids);
        CHECK(n >= 4 && ids[0] == 128000 && ids[1] == 128000 && ids[n - 1] == 128009);
        free(ids);
        n = kiri_tokenizer_encode(l3, "Hi", 2, 1, 1, 0, NULL, 0);
        CHECK_EQ_INT(n, 3);   /* BOS, Hi, EOS */
    }
    if (spm) {
        /* After a special token SentencePiece prefixes a space again. */
        n = encode(spm, "<s>Hello", 8, 0, 1, &ids);
        n2 = encode(spm, "Hello", 5, 0, 0, &ids2);
        CHECK(n == n2 + 1 && ids[0] == 1 && memcmp(ids + 1, ids2, (size_t)n2 * 4) == 0);
        free(ids);
        free(ids2);
        n = encode(spm, "<s>", 3, 0, 0, &ids);
        CHECK(n > 1);
        for (int i = 0; i < n; i++)
            CHECK(ids[i] != 1);
        free(ids);
        n = encode(spm, "Hi", 2, 1, 0, &ids);
        CHECK(n >= 2 && ids[0] == 1);
        free(ids);
    }
    if (g2) {
        /* Invalid UTF-8 encodes like U+FFFD: one per maximal invalid subsequence. */
        n = encode(g2, "a\xFF" "b\xE2\x82", 5, 0, 0, &ids);
        n2 = encode(g2, "a\xEF\xBF\xBD" "b\xEF\xBF\xBD", 8, 0, 0, &ids2);
        CHECK(n == n2 && memcmp(ids, ids2, (size_t)n * 4) == 0);
        free(ids);
        free(ids2);
        /* Capacity: the count is returned, only cap ids are written. */
        int32_t few[2] = {-7, -7};
        n = kiri_tokenizer_encode(g2, "Hello world, hello", 18, 0, 0, 0, few, 1);
        CHECK(n > 2 && few[0] >= 0 && few[1] == -7);
        CHECK_EQ_INT(kiri_tokenizer_encode(g2, NULL, 3, 0, 0, 0, NULL, 0), KIRI_E_INVALID_ARG);
        CHECK_EQ_INT(kiri_tokenizer_encode(g2, "x", 1, 0, 0, 0, NULL, 5), KIRI_E_INVALID_ARG);
        CHECK_EQ_INT(kiri_tokenizer_encode(g2, "", 0, 0, 0, 0, NULL, 0), 0);
        /* NUL bytes are text like any other. */
        n = kiri_tokenizer_encode(g2, "a\0b", 3, 0, 0, 0, NULL, 0);
        CHECK_EQ_INT(n, 3);
    }
}

/* ============================================================================================
 * Small vocabularies built in memory
 * ============================================================================================ */

struct gb {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv;
};

static void gb_raw(struct gb *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 256;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void gb_u32(struct gb *b, uint32_t v) { gb_raw(b, &v, 4); }
static void gb_u64(struct gb *b, uint64_t v) { gb_raw(b, &v, 8); }
static void gb_s(struct gb *b, const char *s, size_t n)
{
    gb_u64(b, n);
    gb_raw(b, s, n);
}
static void gb_key(struct gb *b, const char *key, uint32_t type)
{
    gb_s(b, key, strlen(key));
    gb_u32(b, type);
    b->n_kv++;
}
static void kv_str(struct gb *b, const char *key, const char *v)
{
    gb_key(b, key, KIRI_GGUF_STRING);
    gb_s(b, v, strlen(v));
}
static void kv_u32(struct gb *b, const char *key, uint32_t v)
{
    gb_key(b, key, KIRI_GGUF_UINT32);
    gb_u32(b, v);
}
static void kv_bool(struct gb *b, const char *key, int v)
{
    uint8_t x = (uint8_t)v;
    gb_key(b, key, KIRI_GGUF_BOOL);
    gb_raw(b, &x, 1);
}
static void kv_arr(struct gb *b, const char *key, uint32_t et, uint64_t n, const void *d,
                   size_t elem)
{
    gb_key(b, key, KIRI_GGUF_ARRAY);
    gb_u32(b, et);
    gb_u64(b, n);
    gb_raw(b, d, (size_t)n * elem);
}
static void kv_strs(struct gb *b, const char *key, uint64_t n, char **s)
{
    gb_key(b, key, KIRI_GGUF_ARRAY);
    gb_u32(b, KIRI_GGUF_STRING);
    gb_u64(b, n);
    for (uint64_t i = 0; i < n; i++)
        gb_s(b, s[i], strlen(s[i]));
}
static void gb_begin(struct gb *b)
{
    memset(b, 0, sizeof *b);
    gb_raw(b, "GGUF", 4);
    gb_u32(b, 3);
    gb_u64(b, 0);   /* tensors */
    gb_u64(b, 0);   /* kv count, patched by gb_end */
}
static void gb_end(struct gb *b) { memcpy(b->p + 16, &b->n_kv, 8); }

/* What to break in a small vocabulary. */
enum {
    V_OK,
    V_SCORES_SHORT,
    V_SCORES_I32,
    V_SCORES_NAN,
    V_TYPES_U8,
    V_TYPES_RANGE,
    V_TOKENS_I32,
    V_TOKEN_EMPTY,
    V_TOKEN_LONG,
    V_BYTE_ZZ,
    V_BYTE_100,
    V_BYTE_NEG,
    V_MODEL_BERT,
    V_MODEL_MISSING,
    V_BOS_RANGE,
    V_BOS_STRING,
    V_VOCAB_SIZE,
    V_MERGES_MISSING,
    V_MERGE_NO_SPACE,
    V_MERGE_UNKNOWN,
    V_MERGE_RESULT,
    V_MERGES_I32,
    V_PRE_UNKNOWN,
    V_PRE_MISSING,
    V_EOS_RANGE,
};

/* SentencePiece: <unk> <s> </s>, 256 byte tokens, then pieces; and one user-defined token. */
#define SPM_BASE 259
static const char *const spm_pieces[] = {"\xE2\x96\x81", "a", "b", "\xE2\x96\x81" "a", "ab",
                                         "\xE2\x96\x81" "ab", "<|user|>"};
#define SPM_N (SPM_BASE + 7)

static void build_spm(struct gb *b, int variant)
{
    static char names[SPM_N][1100];
    char *tok[SPM_N];
    float score[SPM_N];
    int32_t type[SPM_N];
    for (int i = 0; i < SPM_N; i++) {
        tok[i] = names[i];
        score[i] = 0;
        type[i] = 1;
        if (i < 3) {
            strcpy(names[i], i == 0 ? "<unk>" : i == 1 ? "<s>" : "</s>");
            type[i] = i == 0 ? 2 : 3;
        } else if (i < SPM_BASE) {
            snprintf(names[i], sizeof names[i], "<0x%02X>", i - 3);
            type[i] = 6;
        } else {
            strcpy(names[i], spm_pieces[i - SPM_BASE]);
            score[i] = -(float)(i - SPM_BASE);
        }
    }
    score[SPM_BASE + 5] = 1;   /* "▁ab" beats everything */
    type[SPM_N - 1] = 4;
    if (variant == V_TOKEN_EMPTY)
        names[SPM_BASE + 1][0] = '\0';
    if (variant == V_TOKEN_LONG) {
        memset(names[SPM_BASE + 1], 'x', LONG_TOKEN);
        names[SPM_BASE + 1][LONG_TOKEN] = '\0';
    }
    if (variant == V_BYTE_ZZ)
        strcpy(names[3], "<0xZZ>");
    if (variant == V_BYTE_100)
        strcpy(names[3], "<0x100>");
    if (variant == V_BYTE_NEG)
        strcpy(names[3], "<0x-1>");
    if (variant == V_SCORES_NAN)
        score[SPM_BASE] = NAN;
    if (variant == V_TYPES_RANGE)
        type[SPM_BASE] = 9;

    gb_begin(b);
    kv_str(b, "general.architecture", "llama");
    if (variant == V_VOCAB_SIZE)
        kv_u32(b, "llama.vocab_size", SPM_N + 1);
    else
        kv_u32(b, "llama.vocab_size", SPM_N);
    if (variant == V_MODEL_BERT)
        kv_str(b, "tokenizer.ggml.model", "bert");
    else if (variant != V_MODEL_MISSING)
        kv_str(b, "tokenizer.ggml.model", "llama");
    if (variant == V_TOKENS_I32)
        kv_arr(b, "tokenizer.ggml.tokens", KIRI_GGUF_INT32, SPM_N, type, 4);
    else
        kv_strs(b, "tokenizer.ggml.tokens", SPM_N, tok);
    if (variant == V_SCORES_SHORT)
        kv_arr(b, "tokenizer.ggml.scores", KIRI_GGUF_FLOAT32, SPM_N - 1, score, 4);
    else if (variant == V_SCORES_I32)
        kv_arr(b, "tokenizer.ggml.scores", KIRI_GGUF_INT32, SPM_N, type, 4);
    else
        kv_arr(b, "tokenizer.ggml.scores", KIRI_GGUF_FLOAT32, SPM_N, score, 4);
    if (variant == V_TYPES_U8) {
        uint8_t t8[SPM_N];
        for (int i = 0; i < SPM_N; i++)
            t8[i] = (uint8_t)type[i];
        kv_arr(b, "tokenizer.ggml.token_type", KIRI_GGUF_UINT8, SPM_N, t8, 1);
    } else {
        kv_arr(b, "tokenizer.ggml.token_type", KIRI_GGUF_INT32, SPM_N, type, 4);
    }
    if (variant == V_BOS_RANGE)
        kv_u32(b, "tokenizer.ggml.bos_token_id", SPM_N);
    else if (variant == V_BOS_STRING)
        kv_str(b, "tokenizer.ggml.bos_token_id", "1");
    else
        kv_u32(b, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(b, "tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);
    kv_bool(b, "tokenizer.ggml.add_bos_token", 1);
    gb_end(b);
}

/* Byte-level BPE: the 256 GPT-2 byte characters (in byte order), then "ab", "abc", and
 * <|end|> (control). Merges: "a b", "ab c". */
#define BPE_N 259
static void build_bpe(struct gb *b, int variant)
{
    static char names[BPE_N][8];
    char *tok[BPE_N];
    int32_t type[BPE_N];
    int n = 0;
    unsigned next = 256;
    for (unsigned c = 0; c < 256; c++) {
        /* GPT-2's table, written out independently of the tokenizer: printable Latin-1 maps to
         * itself, the rest to 256, 257, ... in byte order. */
        int printable = (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
        unsigned cp = printable ? c : next++;
        char *s = names[n];
        if (cp < 0x80) {
            s[0] = (char)cp;
            s[1] = 0;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
            s[2] = 0;
        }
        tok[n] = s;
        type[n++] = 1;
    }
    strcpy(names[n], "ab");
    tok[n] = names[n];
    type[n++] = 1;
    strcpy(names[n], "abc");
    tok[n] = names[n];
    type[n++] = 1;
    strcpy(names[n], "<|end|>");
    tok[n] = names[n];
    type[n++] = 3;
    char *merges[2] = {"a b", "ab c"};
    if (variant == V_MERGE_NO_SPACE)
        merges[1] = "abc";
    if (variant == V_MERGE_UNKNOWN)
        merges[1] = "ab zz";
    if (variant == V_MERGE_RESULT)
        merges[1] = "b c";

    gb_begin(b);
    kv_str(b, "general.architecture", "gpt2");
    kv_str(b, "tokenizer.ggml.model", "gpt2");
    if (variant == V_PRE_UNKNOWN)
        kv_str(b, "tokenizer.ggml.pre", "no-such-pre");
    else if (variant != V_PRE_MISSING)
        kv_str(b, "tokenizer.ggml.pre", "gpt-2");
    kv_strs(b, "tokenizer.ggml.tokens", BPE_N, tok);
    kv_arr(b, "tokenizer.ggml.token_type", KIRI_GGUF_INT32, BPE_N, type, 4);
    if (variant == V_MERGES_I32)
        kv_arr(b, "tokenizer.ggml.merges", KIRI_GGUF_INT32, 2, type, 4);
    else if (variant != V_MERGES_MISSING)
        kv_strs(b, "tokenizer.ggml.merges", 2, merges);
    kv_u32(b, "tokenizer.ggml.eos_token_id", variant == V_EOS_RANGE ? BPE_N : BPE_N - 1);
    gb_end(b);
}

static int open_built(int bpe, int variant, struct kiri_tokenizer **t,
                      struct kiri_status_info *info, struct gb *b)
{
    struct kiri_gguf *g;
    if (bpe)
        build_bpe(b, variant);
    else
        build_spm(b, variant);
    int rc = kiri_gguf_open_memory(b->p, b->n, &g, info);
    CHECK_EQ_INT(rc, KIRI_OK);
    if (rc) {
        fprintf(stderr, "  built vocabulary rejected by the GGUF reader: %s\n", info->message);
        return rc;
    }
    rc = kiri_tokenizer_init(g, t, info);
    kiri_gguf_close(g);
    return rc;
}

static const struct {
    const char *what;
    int bpe, variant, code;
    const char *field;
} bad_cases[] = {
    {"spm ok", 0, V_OK, KIRI_OK, ""},
    {"scores count short", 0, V_SCORES_SHORT, KIRI_E_MODEL_INVALID, "tokenizer.ggml.scores"},
    {"scores as i32", 0, V_SCORES_I32, KIRI_E_MODEL_INVALID, "tokenizer.ggml.scores"},
    {"NaN score", 0, V_SCORES_NAN, KIRI_E_MODEL_INVALID, "tokenizer.ggml.scores"},
    {"token_type as u8", 0, V_TYPES_U8, KIRI_E_MODEL_INVALID, "tokenizer.ggml.token_type"},
    {"token_type 9", 0, V_TYPES_RANGE, KIRI_E_MODEL_INVALID, "tokenizer.ggml.token_type"},
    {"tokens as i32", 0, V_TOKENS_I32, KIRI_E_MODEL_INVALID, "tokenizer.ggml.tokens"},
    {"empty token", 0, V_TOKEN_EMPTY, KIRI_E_MODEL_INVALID, "tokenizer.ggml.tokens"},
    {"1024-byte token", 0, V_TOKEN_LONG, KIRI_OK, ""},
    {"byte token <0xZZ>", 0, V_BYTE_ZZ, KIRI_E_MODEL_INVALID, "tokenizer.ggml.tokens"},
    {"byte token <0x100>", 0, V_BYTE_100, KIRI_E_MODEL_INVALID, "tokenizer.ggml.tokens"},
    {"byte token <0x-1>", 0, V_BYTE_NEG, KIRI_E_MODEL_INVALID, "tokenizer.ggml.tokens"},
    {"model bert", 0, V_MODEL_BERT, KIRI_E_UNSUPPORTED, "tokenizer.ggml.model"},
    {"model missing", 0, V_MODEL_MISSING, KIRI_E_MODEL_INVALID, "tokenizer.ggml.model"},
    {"bos id = n_vocab", 0, V_BOS_RANGE, KIRI_OK, ""},
    {"bos id a string", 0, V_BOS_STRING, KIRI_E_MODEL_INVALID, "tokenizer.ggml.bos_token_id"},
    {"vocab_size mismatch", 0, V_VOCAB_SIZE, KIRI_E_MODEL_INVALID, "llama.vocab_size"},
    {"bpe ok", 1, V_OK, KIRI_OK, ""},
    {"merges missing", 1, V_MERGES_MISSING, KIRI_E_MODEL_INVALID, "tokenizer.ggml.merges"},
    {"merge without space", 1, V_MERGE_NO_SPACE, KIRI_E_MODEL_INVALID, "tokenizer.ggml.merges"},
    {"merge of unknown token", 1, V_MERGE_UNKNOWN, KIRI_E_MODEL_INVALID, "tokenizer.ggml.merges"},
    {"merge result unknown", 1, V_MERGE_RESULT, KIRI_E_MODEL_INVALID, "tokenizer.ggml.merges"},
    {"merges as i32", 1, V_MERGES_I32, KIRI_E_MODEL_INVALID, "tokenizer.ggml.merges"},
    {"unknown pre", 1, V_PRE_UNKNOWN, KIRI_E_UNSUPPORTED, "tokenizer.ggml.pre"},
    {"pre missing", 1, V_PRE_MISSING, KIRI_OK, ""},
    {"eos id = n_vocab", 1, V_EOS_RANGE, KIRI_OK, ""},
};

/* A token as long as the longest of real vocabularies (1024 bytes in MPT's and Command-R's) loads,
 * is matched whole and decodes whole, through the piece API and the detok stream. */
static void test_long_token(void)
{
    struct kiri_tokenizer *t = NULL;
    struct kiri_status_info info;
    struct gb b;
    int rc = open_built(0, V_TOKEN_LONG, &t, &info, &b);
    free(b.p);
    CHECK_EQ_INT(rc, KIRI_OK);
    if (rc)
        return;
    CHECK_EQ_INT((int)kiri_tokenizer_max_piece(t), LONG_TOKEN);
    static char text[LONG_TOKEN + 1];
    memset(text, 'x', LONG_TOKEN);
    int32_t id = kiri_tokenizer_find(t, text, LONG_TOKEN);
    CHECK(id >= 0);
    static char piece[KIRI_DETOK_CAP_FOR(LONG_TOKEN)];
    CHECK_EQ_INT(kiri_tokenizer_piece(t, id, 0, piece, sizeof piece), LONG_TOKEN);
    CHECK(memcmp(piece, text, LONG_TOKEN) == 0);
    struct kiri_detok_stream ds = {0};
    CHECK_EQ_INT(kiri_detok_push(t, &ds, id, 0, piece, KIRI_DETOK_CAP), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_detok_push(t, &ds, id, 0, piece, sizeof piece), LONG_TOKEN);
    CHECK(memcmp(piece, text, LONG_TOKEN) == 0);
    kiri_tokenizer_free(t);
}

static void test_malformed(void)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        struct kiri_tokenizer *t = (struct kiri_tokenizer *)&t;   /* must stay untouched */
        struct kiri_tokenizer *const sentinel = t;
        struct kiri_status_info info;
        struct gb b;
        kiri_error_clear(&info);
        int rc = open_built(bad_cases[i].bpe, bad_cases[i].variant, &t, &info, &b);
        free(b.p);
        CHECK_EQ_INT(rc, bad_cases[i].code);
        if (rc != bad_cases[i].code)
            fprintf(stderr, "  case \"%s\": %s\n", bad_cases[i].what, info.message);
        if (rc == KIRI_OK) {
            kiri_tokenizer_free(t);
            continue;
        }
        CHECK(t == sentinel);
        CHECK_STR(info.field, bad_cases[i].field);
        CHECK(info.message[0] != '\0');
    }
}

/* Encoding with the small vocabularies, where the expected merges can be worked out by hand. */
static void test_small(void)
{
    struct kiri_tokenizer *t;
    struct kiri_status_info info;
    struct gb b;
    int32_t ids[16];
    if (open_built(0, V_BOS_RANGE, &t, &info, &b) == KIRI_OK) {
        /* Out of range counts as absent, so the SentencePiece default applies. */
        CHECK_EQ_INT(kiri_tokenizer_bos(t), 1);
        kiri_tokenizer_free(t);
    }
    free(b.p);
    if (open_built(1, V_EOS_RANGE, &t, &info, &b) == KIRI_OK) {
        CHECK_EQ_INT(kiri_tokenizer_eos(t), -1);   /* out of range: as if absent */
        CHECK(kiri_tokenizer_is_eog(t, BPE_N - 1));   /* still end of generation: <|end|> by text */
        kiri_tokenizer_free(t);
    }
    free(b.p);
    if (open_built(1, V_PRE_MISSING, &t, &info, &b) == KIRI_OK) {
        CHECK_STR(kiri_tokenizer_pre_name(t), "default");
        kiri_tokenizer_free(t);
    }
    free(b.p);
    if (open_built(0, V_OK, &t, &info, &b) == KIRI_OK) {
        /* "ab" -> ▁ab (best score); "a b" -> ▁a ▁ b; "c" -> ▁ <0x63>; "<|user|>" is matched and
         * the text after it gets its own dummy prefix (▁b is no token: ▁ b). */
        CHECK_EQ_INT(kiri_tokenizer_encode(t, "ab", 2, 0, 0, 0, ids, 16), 1);
        CHECK_EQ_INT(ids[0], SPM_BASE + 5);
        CHECK_EQ_INT(kiri_tokenizer_encode(t, "a b", 3, 0, 0, 0, ids, 16), 3);
        CHECK(ids[0] == SPM_BASE + 3 && ids[1] == SPM_BASE && ids[2] == SPM_BASE + 2);
        CHECK_EQ_INT(kiri_tokenizer_encode(t, "c", 1, 1, 1, 0, ids, 16), 4);
        CHECK(ids[0] == 1 && ids[1] == SPM_BASE && ids[2] == 3 + 'c' && ids[3] == 2);
        CHECK_EQ_INT(kiri_tokenizer_encode(t, "a<|user|>b", 10, 0, 0, 0, ids, 16), 4);
        CHECK(ids[0] == SPM_BASE + 3 && ids[1] == SPM_N - 1 && ids[2] == SPM_BASE &&
              ids[3] == SPM_BASE + 2);
        kiri_tokenizer_free(t);
    }
    free(b.p);
    if (open_built(1, V_OK, &t, &info, &b) == KIRI_OK) {
        CHECK_STR(kiri_tokenizer_pre_name(t), "gpt-2");
        CHECK_EQ_INT(kiri_tokenizer_encode(t, "abc", 3, 0, 0, 0, ids, 16), 1);
        CHECK_EQ_INT(ids[0], 257);
        /* Pre-tokens "abcab" and " a". In "abcab" rank 0 ("a b") merges the leftmost pair first,
         * then the second "a b", then "ab c". Token i < 256 is byte i's character. */
        CHECK_EQ_INT(kiri_tokenizer_encode(t, "abcab a", 7, 0, 0, 0, ids, 16), 4);
        CHECK(ids[0] == 257 && ids[1] == 256 && ids[2] == ' ' && ids[3] == 'a');
        /* Parsed only on request. */
        CHECK_EQ_INT(kiri_tokenizer_encode(t, "a<|end|>", 8, 0, 0, 1, ids, 16), 2);
        CHECK_EQ_INT(ids[1], BPE_N - 1);
        CHECK(kiri_tokenizer_encode(t, "a<|end|>", 8, 0, 0, 0, ids, 16) > 2);
        CHECK(kiri_tokenizer_is_eog(t, BPE_N - 1));
        char out[8];
        CHECK_EQ_INT(kiri_tokenizer_piece(t, 257, 0, out, sizeof out), 3);
        CHECK(memcmp(out, "abc", 3) == 0);
        kiri_tokenizer_free(t);
    }
    free(b.p);
}

/* Every allocation the tokenizer makes, in init and in encode, may fail: the result is
 * KIRI_E_NOMEM and nothing leaks (the sanitizer build checks the leaks). */
static void test_failing_allocator(void)
{
    for (int bpe = 0; bpe < 2; bpe++) {
        struct gb b;
        struct kiri_gguf *g;
        struct kiri_status_info info;
        if (bpe)
            build_bpe(&b, V_OK);
        else
            build_spm(&b, V_OK);
        if (kiri_gguf_open_memory(b.p, b.n, &g, &info) != KIRI_OK) {
            free(b.p);
            CHECK(0);
            continue;
        }
        struct kiri_tokenizer *t = NULL;
        int rc = KIRI_E_NOMEM, k;
        for (k = 0; k < 1000 && rc != KIRI_OK; k++) {
            kiri_mem_fail_after(k);
            rc = kiri_tokenizer_init(g, &t, &info);
            kiri_mem_fail_after(-1);
            CHECK(rc == KIRI_OK || rc == KIRI_E_NOMEM);
        }
        CHECK_EQ_INT(rc, KIRI_OK);
        CHECK(k > 3);
        kiri_gguf_close(g);
        free(b.p);
        if (rc != KIRI_OK)
            continue;
        const char *text = "ab a\xFF b abc  ab<|end|>";
        int want = kiri_tokenizer_encode(t, text, strlen(text), 1, 0, 1, NULL, 0);
        CHECK(want > 0);
        rc = KIRI_E_NOMEM;
        for (k = 0; k < 1000 && rc < 0; k++) {
            kiri_mem_fail_after(k);
            rc = kiri_tokenizer_encode(t, text, strlen(text), 1, 0, 1, NULL, 0);
            kiri_mem_fail_after(-1);
            CHECK(rc == want || rc == KIRI_E_NOMEM);
        }
        CHECK_EQ_INT(rc, want);
        kiri_tokenizer_free(t);
    }
    /* And on a real vocabulary's init (qwen2: the largest). */
    char path[512];
    snprintf(path, sizeof path, VEC_DIR "ggml-vocab-%s.gguf", "qwen2");
    struct kiri_gguf *g;
    struct kiri_status_info info;
    if (kiri_gguf_open(path, &g, &info) == KIRI_OK) {
        struct kiri_tokenizer *t = NULL;
        int rc = KIRI_E_NOMEM;
        for (int k = 0; k < 200 && rc != KIRI_OK; k++) {
            kiri_mem_fail_after(k);
            rc = kiri_tokenizer_init(g, &t, &info);
            kiri_mem_fail_after(-1);
            CHECK(rc == KIRI_OK || rc == KIRI_E_NOMEM);
        }
        CHECK_EQ_INT(rc, KIRI_OK);
        if (rc == KIRI_OK)
            kiri_tokenizer_free(t);
        kiri_gguf_close(g);
    }
}

/* ============================================================================================
 * Speed: about 1 MB of mixed text, and 1 MB runs that would expose quadratic behaviour
 * ============================================================================================ */

static void test_speed(void)
{
    struct texts tx;
    if (load_texts(VEC_DIR "ggml-vocab-gpt-2.gguf.inp", &tx) != 0)
        return;
    const size_t mb = 1u << 20;
    char *mixed = malloc(mb + 4096);
    size_t n = 0;
    for (int i = 0; n < mb; i = (i + 1) % tx.n) {
        memcpy(mixed + n, tx.text[i], tx.len[i]);
        n += tx.len[i];
        mixed[n++] = '\n';
    }
    char *same = malloc(mb), *spaces = malloc(mb), *noise = malloc(mb);
    memset(same, 'a', mb);
    memset(spaces, ' ', mb);
    uint32_t x = 12345;
    for (size_t i = 0; i < mb; i++) {
        x = x * 1103515245u + 12345u;
        noise[i] = (char)(x >> 23);
    }
    const struct { const char *what; const char *s; size_t n; } inputs[] = {
        {"mixed", mixed, n}, {"'a' x 1M", same, mb}, {"' ' x 1M", spaces, mb},
        {"random bytes", noise, mb},
    };
    for (int v = 0; v < N_VOCABS; v++) {
        if (!toks[v])
            continue;
        for (size_t k = 0; k < sizeof inputs / sizeof inputs[0]; k++) {
            double t0 = kiri_platform_now();
            int r = kiri_tokenizer_encode(toks[v], inputs[k].s, inputs[k].n, 0, 0, 0, NULL, 0);
            double dt = kiri_platform_now() - t0;
            CHECK(r > 0);
            CHECK(dt < 30.0);
            fprintf(stderr, "  speed %-10s %-13s %7.2f MB in %6.3f s = %6.2f MB/s, %d tokens\n",
                    vocabs[v].name, inputs[k].what, (double)inputs[k].n / mb, dt,
                    (double)inputs[k].n / mb / dt, r);
        }
    }
    free(mixed);
    free(same);
    free(spaces);
    free(noise);
    free(tx.buf);
}

static void test_free_vocabs(void)
{
    for (int v = 0; v < N_VOCABS; v++) {
        kiri_tokenizer_free(toks[v]);
        toks[v] = NULL;
    }
}

TEST_MAIN(test_load_vocabs, test_vectors, test_round_trip, test_detok_stream, test_special,
          test_long_token,
          test_malformed, test_small, test_failing_allocator, test_speed, test_free_vocabs)
