/* Tests for runtime/gguf.c: malformed files (G01-G24: header, metadata, tensor-info and
 * data-section faults), files still being written (G38) and odd valid ones (G40), built
 * as in-memory images by a small byte writer below; the shared real files (stories260K and the
 * llama.cpp vocabularies); the typed getters; the writer (round trip of stories260K, abort and
 * failure clean-up); a failing-allocator walk; and a G39-style deterministic mutation campaign.
 * Expected values for the real files come from their producers (llama.cpp's converters and the
 * llama2.c checkpoint), not from this reader. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "gguf.h"
#include "kiri.h"
#include "mem.h"
#include "test.h"

#ifndef KIRI_SHARED_DIR
#define KIRI_SHARED_DIR "../shared"
#endif
#ifndef KIRI_SOURCE_DIR
#define KIRI_SOURCE_DIR "."
#endif

#define STORIES KIRI_SHARED_DIR "/models/stories260K.gguf"
#define STORIES_BIN KIRI_SHARED_DIR "/models/stories260K.bin"

/* ---------------------------------------------------------------------------------------------
 * A byte writer for building GGUF images
 * ------------------------------------------------------------------------------------------- */

struct img {
    uint8_t *p;
    size_t n, cap;
};

static void put(struct img *b, const void *d, size_t n)
{
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) {
            fprintf(stderr, "test_gguf: out of memory\n");
            exit(2);
        }
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void u8(struct img *b, uint8_t v) { put(b, &v, 1); }
static void u32(struct img *b, uint32_t v)
{
    uint8_t x[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    put(b, x, 4);
}
static void u64(struct img *b, uint64_t v)
{
    u32(b, (uint32_t)v);
    u32(b, (uint32_t)(v >> 32));
}
static void f32(struct img *b, float v)
{
    uint32_t x;
    memcpy(&x, &v, 4);
    u32(b, x);
}
static void f64(struct img *b, double v)
{
    uint64_t x;
    memcpy(&x, &v, 8);
    u64(b, x);
}
static void str(struct img *b, const char *s)
{
    u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void zeros(struct img *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        u8(b, 0);
}
static void pad(struct img *b, size_t a)
{
    while (b->n % a)
        u8(b, 0);
}
static void hdr(struct img *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    put(b, "GGUF", 4);
    u32(b, version);
    u64(b, n_tensors);
    u64(b, n_kv);
}
static void kv_u32(struct img *b, const char *k, uint32_t v)
{
    str(b, k);
    u32(b, KIRI_GGUF_UINT32);
    u32(b, v);
}
static void kv_str(struct img *b, const char *k, const char *v)
{
    str(b, k);
    u32(b, KIRI_GGUF_STRING);
    str(b, v);
}
static void tinfo(struct img *b, const char *name, uint32_t nd, const uint64_t *ne, uint32_t type,
                  uint64_t off)
{
    str(b, name);
    u32(b, nd);
    for (uint32_t d = 0; d < nd; d++)
        u64(b, ne[d]);
    u32(b, type);
    u64(b, off);
}

static const uint64_t NE4[] = {4}, NE8x2[] = {8, 2};

/* The body every tensor case shares: header with 2 tensors and 1 pair, and the first tensor
 * ("a", F32 [4] at 0). The second tensor comes from the case. */
static void two_tensor_prefix(struct img *b)
{
    hdr(b, 3, 2, 1);
    kv_str(b, "general.architecture", "llama");
    tinfo(b, "a", 1, NE4, KIRI_TYPE_F32, 0);
}

/* A complete valid image: the prefix plus "b" F32 [8,2] at 32, then the data. */
static void valid_image(struct img *b)
{
    two_tensor_prefix(b);
    tinfo(b, "b", 2, NE8x2, KIRI_TYPE_F32, 32);
    pad(b, 32);
    for (int i = 0; i < 4; i++)
        f32(b, (float)i);
    pad(b, 32);
    for (int i = 0; i < 16; i++)
        f32(b, (float)(100 + i));
}

/* A vocabulary-like image: string, bool, numeric and string arrays, no tensors, v2. */
static void vocab_image(struct img *b)
{
    hdr(b, 2, 0, 7);
    kv_str(b, "general.architecture", "llama");
    kv_u32(b, "llama.context_length", 128);
    str(b, "tokenizer.ggml.tokens");
    u32(b, KIRI_GGUF_ARRAY);
    u32(b, KIRI_GGUF_STRING);
    u64(b, 4);
    str(b, "<unk>");
    str(b, "<s>");
    str(b, "");
    str(b, "\xe2\x96\x81the");
    str(b, "tokenizer.ggml.scores");
    u32(b, KIRI_GGUF_ARRAY);
    u32(b, KIRI_GGUF_FLOAT32);
    u64(b, 4);
    for (int i = 0; i < 4; i++)
        f32(b, -(float)i);
    str(b, "tokenizer.ggml.add_bos_token");
    u32(b, KIRI_GGUF_BOOL);
    u8(b, 1);
    str(b, "flags");
    u32(b, KIRI_GGUF_ARRAY);
    u32(b, KIRI_GGUF_BOOL);
    u64(b, 3);
    u8(b, 0);
    u8(b, 1);
    u8(b, 0);
    str(b, "x.f64");
    u32(b, KIRI_GGUF_FLOAT64);
    f64(b, 0.5);
}

/* Quantised tensors with alignment 64. */
static void quant_image(struct img *b)
{
    static const uint64_t q40[] = {64, 2}, q8[] = {32}, q4k[] = {256, 1, 1, 2};
    hdr(b, 3, 3, 3);
    kv_u32(b, "general.alignment", 64);
    kv_str(b, "general.architecture", "qwen2");
    str(b, "i8.neg");
    u32(b, KIRI_GGUF_INT8);
    u8(b, 0xFE);
    tinfo(b, "q4", 2, q40, KIRI_TYPE_Q4_0, 0);     /* 4 blocks of 18 = 72 bytes */
    tinfo(b, "q8", 1, q8, KIRI_TYPE_Q8_0, 128);    /* 34 bytes */
    tinfo(b, "k4", 4, q4k, KIRI_TYPE_Q4_K, 192);   /* 2 blocks of 144 = 288 bytes */
    pad(b, 64);
    for (int i = 0; i < 72; i++)
        u8(b, (uint8_t)i);
    pad(b, 64);
    for (int i = 0; i < 34; i++)
        u8(b, (uint8_t)(i * 3));
    pad(b, 64);
    for (int i = 0; i < 288; i++)
        u8(b, (uint8_t)(i * 7));
}

/* Opens an exact-size heap copy, so AddressSanitizer sees any read past its end. */
static int open_copy(const struct img *b, size_t n, struct kiri_gguf **g, uint8_t **copy,
                     struct kiri_status_info *info)
{
    *copy = malloc(n ? n : 1);
    if (n)
        memcpy(*copy, b->p, n);
    return kiri_gguf_open_memory(*copy, n, g, info);
}

/* ---------------------------------------------------------------------------------------------
 * Malformed images, one case per row (table-driven)
 * ------------------------------------------------------------------------------------------- */

struct bad_case {
    const char *row;
    void (*build)(struct img *b);
    const char *field;     /* expected field (substring), "" for "any" */
    int64_t offset;        /* expected offset, -2 for "any" */
    const char *message;   /* expected substring of the message */
};

static void g01_empty(struct img *b) { (void)b; }
static void g01_short(struct img *b)
{
    hdr(b, 3, 0, 0);
    b->n = 23;
}
static void g01_magic_only(struct img *b) { put(b, "GGUF", 4); }
static void g02_gguG(struct img *b) { put(b, "GGUG\3\0\0\0", 8), zeros(b, 16); }
static void g02_fugg(struct img *b) { put(b, "FUGG\3\0\0\0", 8), zeros(b, 16); }
static void g02_ggjt(struct img *b) { put(b, "tjgg\3\0\0\0", 8), zeros(b, 16); }
static void g02_ggml(struct img *b) { put(b, "GGML", 4), zeros(b, 40); }
static void g03_v0(struct img *b) { hdr(b, 0, 0, 0); }
static void g03_v1(struct img *b) { hdr(b, 1, 0, 0); }
static void g03_v4(struct img *b) { hdr(b, 4, 0, 0); }
static void g03_swapped(struct img *b) { hdr(b, 0x03000000u, 0, 0); }
static void g04_max(struct img *b) { hdr(b, 3, INT64_MAX, 0), zeros(b, 100); }
static void g04_neg(struct img *b) { hdr(b, 3, UINT64_MAX, 0), zeros(b, 100); }
static void g04_big(struct img *b) { hdr(b, 3, 1000, 0), zeros(b, 1000); }
static void g05_max(struct img *b) { hdr(b, 3, 0, INT64_MAX), zeros(b, 100); }
static void g05_big(struct img *b) { hdr(b, 3, 0, 1000), kv_u32(b, "a", 1); }
static void g06_len0(struct img *b) { hdr(b, 3, 0, 1), u64(b, 0), u32(b, 4), u32(b, 1); }
static void g06_lenmax(struct img *b) { hdr(b, 3, 0, 1), u64(b, UINT64_MAX), zeros(b, 8); }
static void g06_past(struct img *b) { hdr(b, 3, 0, 1), u64(b, 100), put(b, "abcdefgh", 8); }
static void g06_cap(struct img *b)
{
    hdr(b, 3, 0, 1);
    u64(b, 257);
    for (int i = 0; i < 257; i++)
        u8(b, 'k');
    u32(b, KIRI_GGUF_UINT8), u8(b, 1);
}
static void g07_utf8(struct img *b) { hdr(b, 3, 0, 1), str(b, "ab\xc0\x80"), u32(b, 0), u8(b, 1); }
static void g07_nul(struct img *b)
{
    hdr(b, 3, 0, 1), u64(b, 3), put(b, "a\0b", 3), u32(b, 0), u8(b, 1);
}
static void g07_surrogate(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "\xed\xa0\x80"), u32(b, 0), u8(b, 1);
}
static void g07_tensor_name(struct img *b)
{
    hdr(b, 3, 1, 0);
    tinfo(b, "w\xff", 1, NE4, KIRI_TYPE_F32, 0);
    pad(b, 32), zeros(b, 16);
}
static void g08_dup(struct img *b)
{
    hdr(b, 3, 0, 3);
    kv_u32(b, "a.b", 1);   /* 24 .. 42 */
    kv_u32(b, "c", 2);     /* 43 .. 59 */
    kv_u32(b, "a.b", 3);   /* 60 */
}
static void g09_13(struct img *b) { hdr(b, 3, 0, 1), str(b, "k"), u32(b, 13), u32(b, 0); }
static void g09_neg(struct img *b) { hdr(b, 3, 0, 1), str(b, "k"), u32(b, UINT32_MAX), u32(b, 0); }
static void g10_nested(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "arr"), u32(b, KIRI_GGUF_ARRAY), u32(b, KIRI_GGUF_ARRAY), u64(b, 1);
    u32(b, KIRI_GGUF_UINT8), u64(b, 1), u8(b, 0);
}
static void g10_elem(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "arr"), u32(b, KIRI_GGUF_ARRAY), u32(b, 13), u64(b, 1), u8(b, 0);
}
static void g11_count(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "arr"), u32(b, KIRI_GGUF_ARRAY), u32(b, KIRI_GGUF_UINT32);
    u64(b, 1ull << 62), zeros(b, 64);
}
static void g11_wrap(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "arr"), u32(b, KIRI_GGUF_ARRAY), u32(b, KIRI_GGUF_UINT64);
    u64(b, 1ull << 61), zeros(b, 64);   /* 2^61 * 8 wraps to 0 */
}
static void g11_strings(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "arr"), u32(b, KIRI_GGUF_ARRAY), u32(b, KIRI_GGUF_STRING);
    u64(b, 1ull << 62), zeros(b, 64);
}
static void g12_past(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "s"), u32(b, KIRI_GGUF_STRING), u64(b, 1000), put(b, "short", 5);
}
static void g12_cap(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "s"), u32(b, KIRI_GGUF_STRING), u64(b, KIRI_GGUF_MAX_STRING + 1u);
    zeros(b, 16);
}
static void g12_elem(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "s"), u32(b, KIRI_GGUF_ARRAY), u32(b, KIRI_GGUF_STRING), u64(b, 2);
    str(b, "ok"), u64(b, 99), zeros(b, 4);
}
static void g13_bool(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "b"), u32(b, KIRI_GGUF_BOOL), u8(b, 2);
}
static void g13_bool_arr(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "b"), u32(b, KIRI_GGUF_ARRAY), u32(b, KIRI_GGUF_BOOL), u64(b, 3);
    u8(b, 1), u8(b, 0), u8(b, 0x80);
}
static void align_case(struct img *b, uint32_t a)
{
    hdr(b, 3, 0, 1), kv_u32(b, "general.alignment", a);
}
static void g14_zero(struct img *b) { align_case(b, 0); }
static void g14_three(struct img *b) { align_case(b, 3); }
static void g14_huge(struct img *b) { align_case(b, 1u << 31); }
static void g14_i32(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "general.alignment"), u32(b, KIRI_GGUF_INT32), u32(b, 32);
}
static void g14_str(struct img *b) { hdr(b, 3, 0, 1), kv_str(b, "general.alignment", "32"); }
static void g14_arr(struct img *b)
{
    hdr(b, 3, 0, 1), str(b, "general.alignment"), u32(b, KIRI_GGUF_ARRAY), u32(b, KIRI_GGUF_UINT32);
    u64(b, 1), u32(b, 32);
}
static void g15_long(struct img *b)
{
    char name[65];
    memset(name, 'n', 64);
    name[64] = 0;
    hdr(b, 3, 1, 0), tinfo(b, name, 1, NE4, KIRI_TYPE_F32, 0), pad(b, 32), zeros(b, 16);
}
static void g15_empty(struct img *b)
{
    hdr(b, 3, 1, 0), tinfo(b, "", 1, NE4, KIRI_TYPE_F32, 0), pad(b, 32), zeros(b, 16);
}
static void g16_dup(struct img *b)
{
    two_tensor_prefix(b);
    tinfo(b, "a", 1, NE4, KIRI_TYPE_F32, 32);
    pad(b, 32), zeros(b, 48);
}
static void ndims_case(struct img *b, uint32_t nd)
{
    static const uint64_t ne[] = {1, 1, 1, 1, 1};
    two_tensor_prefix(b);
    tinfo(b, "b", nd > 5 ? 5 : nd, ne, KIRI_TYPE_F32, 32);
    if (nd > 5) {                  /* rewrite the n_dims field just written */
        size_t at = b->n - 8 - 4 - 5 * 8 - 4;
        for (int k = 0; k < 4; k++)
            b->p[at + k] = (uint8_t)(nd >> (8 * k));
    }
    pad(b, 32), zeros(b, 64);
}
static void g17_0(struct img *b) { ndims_case(b, 0); }
static void g17_5(struct img *b) { ndims_case(b, 5); }
static void g17_max(struct img *b) { ndims_case(b, UINT32_MAX); }
static void ne_case(struct img *b, uint64_t ne0, uint64_t ne1, uint32_t type)
{
    uint64_t ne[] = {ne0, ne1};
    two_tensor_prefix(b);
    tinfo(b, "b", 2, ne, type, 32);
    pad(b, 32), zeros(b, 64);
}
static void g18_neg(struct img *b) { ne_case(b, 4, (uint64_t)-5, KIRI_TYPE_F32); }
static void g18_zero(struct img *b) { ne_case(b, 0, 4, KIRI_TYPE_F32); }
static void g19_elems(struct img *b) { ne_case(b, 1ull << 32, 1ull << 32, KIRI_TYPE_F32); }
static void g19_bytes(struct img *b) { ne_case(b, 1ull << 61, 2, KIRI_TYPE_I32); }
static void g19_row(struct img *b) { ne_case(b, 1ull << 61, 1, KIRI_TYPE_F64); }
static void g19_pad(struct img *b) { ne_case(b, (1ull << 62) - 1, 1, KIRI_TYPE_F32); }
static void g19_q8(struct img *b) { ne_case(b, 1ull << 62, 4, KIRI_TYPE_Q8_0); }
static void g20_q4_2(struct img *b) { ne_case(b, 32, 1, 4); }
static void g20_40(struct img *b) { ne_case(b, 32, 1, 40); }
static void g20_neg(struct img *b) { ne_case(b, 32, 1, UINT32_MAX); }
static void g21_block(struct img *b) { ne_case(b, 33, 1, KIRI_TYPE_Q4_0); }
static void g21_kquant(struct img *b) { ne_case(b, 128, 2, KIRI_TYPE_Q6_K); }
static void g22_order(struct img *b)
{
    two_tensor_prefix(b);
    tinfo(b, "b", 2, NE8x2, KIRI_TYPE_F32, 64);
    pad(b, 32), zeros(b, 128);
}
static void g22_unaligned(struct img *b)
{
    two_tensor_prefix(b);
    tinfo(b, "b", 2, NE8x2, KIRI_TYPE_F32, 17);
    pad(b, 32), zeros(b, 128);
}
static void g22_overlap(struct img *b)
{
    two_tensor_prefix(b);
    tinfo(b, "b", 2, NE8x2, KIRI_TYPE_F32, 0);
    pad(b, 32), zeros(b, 128);
}
static void g23_past(struct img *b)
{
    valid_image(b);
    b->n -= 4;
}
static void g23_huge(struct img *b)
{
    static const uint64_t big[] = {1ull << 40};
    hdr(b, 3, 1, 0), tinfo(b, "a", 1, big, KIRI_TYPE_F32, 0), pad(b, 32), zeros(b, 64);
}
static void g24_pad(struct img *b)
{
    two_tensor_prefix(b);
    tinfo(b, "b", 2, NE8x2, KIRI_TYPE_F32, 32);
    /* The tensor table ends at a position that is not aligned: stop inside the padding. */
    if (b->n % 32 == 0)
        u8(b, 0);
}

/* Offsets: the header is 24 bytes; in two_tensor_prefix the pair takes 8 + 20 + 4 + 8 + 5 = 45
 * bytes, so tensor "a" starts at 69; its info is 8 + 1 + 4 + 8 + 4 + 8 = 33 bytes, so "b" starts at
 * 102: n_dims at 111, ne[0] 115, ne[1] 123, then for two dimensions type at 131, offset at 135,
 * and the table ends at 143. */
static const struct bad_case bad_cases[] = {
    {"G01", g01_empty, "header", 0, "truncated header"},
    {"G01", g01_short, "header", 0, "truncated header"},
    {"G01", g01_magic_only, "header", 0, "truncated header"},
    {"G02", g02_gguG, "magic", 0, "not GGUF (bad magic)"},
    {"G02", g02_fugg, "magic", 0, "byte-swapped"},
    {"G02", g02_ggjt, "magic", 0, "legacy"},
    {"G02", g02_ggml, "magic", 0, "not GGUF"},
    {"G03", g03_v0, "version", 4, "unsupported version 0"},
    {"G03", g03_v1, "version", 4, "unsupported version 1"},
    {"G03", g03_v4, "version", 4, "unsupported version 4"},
    {"G03", g03_swapped, "version", 4, "byte-swapped file?"},
    {"G04", g04_max, "n_tensors", 8, "n_tensors 9223372036854775807"},
    {"G04", g04_neg, "n_tensors", 8, "negative"},
    {"G04", g04_big, "n_tensors", 8, "n_tensors 1000"},
    {"G05", g05_max, "n_kv", 16, "n_kv 9223372036854775807"},
    {"G05", g05_big, "n_kv", 16, "n_kv 1000"},
    {"G06", g06_len0, "kv[0].key", 24, "empty"},
    {"G06", g06_lenmax, "kv[0].key", 24, "256-byte limit"},
    {"G06", g06_past, "kv[0].key", 24, "remaining"},
    {"G06", g06_cap, "kv[0].key", 24, "256-byte limit"},
    {"G07", g07_utf8, "kv[0].key", 32, "UTF-8"},
    {"G07", g07_nul, "kv[0].key", 32, "NUL"},
    {"G07", g07_surrogate, "kv[0].key", 32, "UTF-8"},
    {"G07", g07_tensor_name, "tensor[0].name", 32, "UTF-8"},
    {"G08", g08_dup, "a.b", 60, "duplicate key 'a.b'"},
    {"G09", g09_13, "k", 33, "unknown type 13"},
    {"G09", g09_neg, "k", 33, "unknown type 4294967295"},
    {"G10", g10_nested, "arr", 39, "nested"},
    {"G10", g10_elem, "arr", 39, "unknown array element type 13"},
    {"G11", g11_count, "arr", 43, "array count 4611686018427387904"},
    {"G11", g11_wrap, "arr", 43, "array count 2305843009213693952"},
    {"G11", g11_strings, "arr", 43, "array count"},
    {"G12", g12_past, "s", 37, "exceeds the 5 bytes remaining"},
    {"G12", g12_cap, "s", 37, "16777216-byte limit"},
    {"G12", g12_elem, "s", 59, "element 1"},
    {"G13", g13_bool, "b", 37, "not 0 or 1"},
    {"G13", g13_bool_arr, "b", 51, "element 2"},
    {"G14", g14_zero, "general.alignment", 53, "power of two"},
    {"G14", g14_three, "general.alignment", 53, "power of two"},
    {"G14", g14_huge, "general.alignment", 53, "power of two"},
    {"G14", g14_i32, "general.alignment", 24, "has type i32, expected u32"},
    {"G14", g14_str, "general.alignment", 24, "has type string, expected u32"},
    {"G14", g14_arr, "general.alignment", 24, "has type array of u32, expected u32"},
    {"G15", g15_long, "tensor[0].name", 24, "exceeds 63 bytes"},
    {"G15", g15_empty, "tensor[0].name", 24, "empty name"},
    {"G16", g16_dup, "tensor 'a' name", 102, "duplicate tensor name 'a'"},
    {"G17", g17_0, "tensor 'b' n_dims", 111, "0 dimensions"},
    {"G17", g17_5, "tensor 'b' n_dims", 111, "5 dimensions"},
    {"G17", g17_max, "tensor 'b' n_dims", 111, "4294967295 dimensions"},
    {"G18", g18_neg, "tensor 'b' ne[1]", 123, "ne[1] = -5 is not positive"},
    {"G18", g18_zero, "tensor 'b' ne[0]", 115, "ne[0] = 0 is not positive"},
    {"G19", g19_elems, "tensor 'b' ne[1]", 123, "element count overflows"},
    {"G19", g19_bytes, "tensor 'b' ne", 115, "byte size overflows"},
    {"G19", g19_row, "tensor 'b' ne", 115, "byte size overflows"},
    {"G19", g19_pad, "tensor 'b' offset", 135, "overflows"},
    {"G19", g19_q8, "tensor 'b' ne[1]", 123, "element count overflows"},
    {"G20", g20_q4_2, "tensor 'b' type", 131, "unsupported type 4"},
    {"G20", g20_40, "tensor 'b' type", 131, "unsupported type 40"},
    {"G20", g20_neg, "tensor 'b' type", 131, "unsupported type 4294967295"},
    {"G21", g21_block, "tensor 'b' ne[0]", 115, "not a multiple of the Q4_0 block size 32"},
    {"G21", g21_kquant, "tensor 'b' ne[0]", 115, "Q6_K block size 256"},
    {"G22", g22_order, "tensor 'b' offset", 135, "offset 64, expected 32"},
    {"G22", g22_unaligned, "tensor 'b' offset", 135, "not a multiple of the alignment 32"},
    {"G22", g22_overlap, "tensor 'b' offset", 135, "offset 0, expected 32"},
    {"G23", g23_past, "tensor 'b' offset", 135, "extends past the end of the file"},
    {"G23", g23_huge, "tensor 'a' offset", 49, "extends past the end of the file"},
    {"G24", g24_pad, "data", 143, "truncated inside the padding"},
};

static void test_bad_images(void)
{
    int n = (int)(sizeof bad_cases / sizeof bad_cases[0]);
    for (int i = 0; i < n; i++) {
        const struct bad_case *c = &bad_cases[i];
        struct img b = {0};
        c->build(&b);
        struct kiri_gguf *g = (struct kiri_gguf *)(uintptr_t)1;   /* must stay untouched */
        uint8_t *copy;
        struct kiri_status_info info;
        int rc = open_copy(&b, b.n, &g, &copy, &info);
        int ok = rc == KIRI_E_MODEL_INVALID && info.code == rc && strstr(info.field, c->field) &&
                 (c->offset == -2 || info.offset == c->offset) &&
                 strstr(info.message, c->message) && g == (struct kiri_gguf *)(uintptr_t)1;
        CHECK(ok);
        if (!ok)
            fprintf(stderr, "  case %d (%s): rc %d field '%s' offset %lld: %s\n"
                    "  expected field '%s' offset %lld message '%s'\n",
                    i, c->row, rc, info.field, (long long)info.offset, info.message, c->field,
                    (long long)c->offset, c->message);
        free(copy);
        free(b.p);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Valid images, G38, G40
 * ------------------------------------------------------------------------------------------- */

static void test_valid_image(void)
{
    struct img b = {0};
    valid_image(&b);
    struct kiri_gguf *g;
    uint8_t *copy;
    struct kiri_status_info info;
    CHECK_EQ_INT(open_copy(&b, b.n, &g, &copy, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_gguf_version(g), 3);
    CHECK_EQ_INT(kiri_gguf_n_tensors(g), 2);
    CHECK_EQ_INT(kiri_gguf_alignment(g), 32);
    const struct kiri_gguf_tensor *t = kiri_gguf_find_tensor(g, "b");
    CHECK(t && t == kiri_gguf_tensor(g, 1));
    if (t) {
        CHECK_EQ_INT(t->n_dims, 2);
        CHECK_EQ_INT(t->ne[0], 8);
        CHECK_EQ_INT(t->ne[1], 2);
        CHECK_EQ_INT(t->ne[2], 1);
        CHECK_EQ_INT(t->size, 64);
        CHECK_EQ_INT(t->offset, 32);
        float v;
        memcpy(&v, (const uint8_t *)t->data + 4 * 15, 4);
        CHECK_NEAR(v, 115, 0);
        CHECK((const uint8_t *)t->data + t->size == copy + b.n);
    }
    CHECK(kiri_gguf_find_tensor(g, "c") == NULL);
    CHECK(kiri_gguf_tensor(g, 2) == NULL && kiri_gguf_tensor(g, -1) == NULL);
    kiri_gguf_close(g);
    free(copy);

    /* G40: trailing garbage is accepted. */
    for (int i = 0; i < 100; i++)
        u8(&b, (uint8_t)(0xA5 ^ i));
    CHECK_EQ_INT(open_copy(&b, b.n, &g, &copy, &info), KIRI_OK);
    kiri_gguf_close(g);
    free(copy);
    free(b.p);

    /* Quantised tensors, alignment 64. */
    b = (struct img){0};
    quant_image(&b);
    CHECK_EQ_INT(open_copy(&b, b.n, &g, &copy, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_gguf_alignment(g), 64);
    t = kiri_gguf_find_tensor(g, "k4");
    CHECK(t && t->size == 288 && t->offset == 192 && t->n_dims == 4 && t->ne[3] == 2);
    t = kiri_gguf_find_tensor(g, "q4");
    CHECK(t && t->size == 72 && t->type == KIRI_TYPE_Q4_0);
    int32_t i32;
    CHECK_EQ_INT(kiri_gguf_get_i32(g, "i8.neg", 1, &i32, &info), KIRI_OK);
    CHECK_EQ_INT(i32, -2);
    uint32_t u;
    CHECK_EQ_INT(kiri_gguf_get_u32(g, "i8.neg", 1, &u, &info), KIRI_E_MODEL_INVALID);
    CHECK(strstr(info.message, "does not fit in u32") != NULL);
    kiri_gguf_close(g);
    free(copy);
    free(b.p);
}

static void test_vocab_only(void)
{
    struct img b = {0};
    vocab_image(&b);
    size_t end = b.n;
    struct kiri_gguf *g;
    uint8_t *copy;
    struct kiri_status_info info;
    /* G40: 0 tensors and no data section; then with part of, and all of, the padding. */
    for (int extra = 0; extra <= 40; extra += 5) {
        b.n = end;
        zeros(&b, (size_t)extra);
        CHECK_EQ_INT(open_copy(&b, b.n, &g, &copy, &info), KIRI_OK);
        if (extra == 0) {
            CHECK_EQ_INT(kiri_gguf_version(g), 2);
            CHECK_EQ_INT(kiri_gguf_n_tensors(g), 0);
            CHECK_EQ_INT(kiri_gguf_n_kv(g), 7);
            int64_t k = kiri_gguf_find_key(g, "tokenizer.ggml.tokens");
            CHECK_EQ_INT(k, 2);
            CHECK_STR(kiri_gguf_key(g, k), "tokenizer.ggml.tokens");
            CHECK_EQ_INT(kiri_gguf_kv_type(g, k), KIRI_GGUF_ARRAY);
            CHECK_EQ_INT(kiri_gguf_kv_offset(g, 0), 24);
            int et = -1;
            uint64_t n = 0;
            const void *data = (const void *)1;
            CHECK_EQ_INT(kiri_gguf_get_arr(g, "tokenizer.ggml.tokens", 1, &et, &n, &data, &info),
                         0);
            CHECK_EQ_INT(et, KIRI_GGUF_STRING);
            CHECK_EQ_INT(n, 4);
            CHECK(data == NULL);
            struct kiri_gguf_str s = kiri_gguf_arr_str(g, k, 3);
            CHECK(s.len == 6 && memcmp(s.ptr, "\xe2\x96\x81the", 6) == 0);
            s = kiri_gguf_arr_str(g, k, 2);
            CHECK(s.len == 0 && s.ptr != NULL);
            s = kiri_gguf_arr_str(g, k, 4);
            CHECK(s.ptr == NULL);
            s = kiri_gguf_arr_str(g, 0, 0);   /* not an array */
            CHECK(s.ptr == NULL);
            CHECK_EQ_INT(kiri_gguf_get_arr(g, "tokenizer.ggml.scores", 1, &et, &n, &data, &info),
                         0);
            CHECK(et == KIRI_GGUF_FLOAT32 && n == 4 && data != NULL);
            float f;
            memcpy(&f, (const uint8_t *)data + 12, 4);
            CHECK_NEAR(f, -3, 0);
            int bv = 0;
            CHECK_EQ_INT(kiri_gguf_get_bool(g, "tokenizer.ggml.add_bos_token", 1, &bv, &info), 0);
            CHECK_EQ_INT(bv, 1);
            CHECK_EQ_INT(kiri_gguf_get_f32(g, "x.f64", 1, &f, &info), 0);
            CHECK_NEAR(f, 0.5, 0);
        }
        kiri_gguf_close(g);
        free(copy);
    }
    free(b.p);
}

static void test_partial_refused(void)
{
    /* G38: names ending in .partial are never mapped (files still being written). */
    char dir[] = "/tmp/kiri-gguf-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char path[256];
    snprintf(path, sizeof path, "%s/model.gguf.partial", dir);
    struct img b = {0};
    valid_image(&b);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (f) {
        fwrite(b.p, 1, b.n, f);
        fclose(f);
    }
    struct kiri_gguf *g = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_gguf_open(path, &g, &info), KIRI_E_IO);
    CHECK(g == NULL);
    CHECK(strstr(info.message, "partial") != NULL);
    CHECK_EQ_INT(kiri_gguf_open("/nonexistent/x.gguf", &g, &info), KIRI_E_IO);
    unlink(path);
    rmdir(dir);
    free(b.p);
}

/* ---------------------------------------------------------------------------------------------
 * Real files
 * ------------------------------------------------------------------------------------------- */

static void test_stories(void)
{
    struct kiri_gguf *g;
    struct kiri_status_info info;
    int rc = kiri_gguf_open(STORIES, &g, &info);
    CHECK_EQ_INT(rc, KIRI_OK);
    if (rc) {
        fprintf(stderr, "  %s: %s\n", STORIES, info.message);
        return;
    }
    /* Figures of the file llama.cpp's llama2.c converter wrote for stories260K. */
    CHECK_EQ_INT(kiri_gguf_version(g), 3);
    CHECK_EQ_INT(kiri_gguf_n_kv(g), 19);
    CHECK_EQ_INT(kiri_gguf_n_tensors(g), 48);
    uint32_t u = 0;
    CHECK_EQ_INT(kiri_gguf_get_u32(g, "llama.context_length", 1, &u, &info), 0);
    CHECK_EQ_INT(u, 512);
    CHECK_EQ_INT(kiri_gguf_get_u32(g, "llama.embedding_length", 1, &u, &info), 0);
    CHECK_EQ_INT(u, 64);
    CHECK_EQ_INT(kiri_gguf_get_u32(g, "llama.block_count", 1, &u, &info), 0);
    CHECK_EQ_INT(u, 5);
    struct kiri_gguf_str s;
    CHECK_EQ_INT(kiri_gguf_get_str(g, "general.architecture", 1, &s, &info), 0);
    CHECK(s.len == 5 && memcmp(s.ptr, "llama", 5) == 0);
    float eps = 0;
    CHECK_EQ_INT(kiri_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", 1, &eps, &info), 0);
    CHECK_NEAR(eps, 1e-5, 1e-9);
    int et;
    uint64_t n;
    const void *data;
    CHECK_EQ_INT(kiri_gguf_get_arr(g, "tokenizer.ggml.tokens", 1, &et, &n, &data, &info), 0);
    CHECK_EQ_INT(n, 512);
    s = kiri_gguf_arr_str(g, kiri_gguf_find_key(g, "tokenizer.ggml.tokens"), 1);
    CHECK(s.len == 3 && memcmp(s.ptr, "<s>", 3) == 0);

    /* The -1 ids are stored as u32 0xFFFFFFFF by the converter: an i32 getter must refuse them. */
    int32_t i32;
    CHECK_EQ_INT(kiri_gguf_get_i32(g, "tokenizer.ggml.padding_token_id", 1, &i32, &info),
                 KIRI_E_MODEL_INVALID);
    CHECK(strstr(info.message, "does not fit in i32") != NULL);
    CHECK_STR(info.field, "tokenizer.ggml.padding_token_id");
    CHECK_EQ_INT(info.offset, 10969);

    /* Getter errors (G25/G26 at the API level). */
    CHECK_EQ_INT(kiri_gguf_get_u32(g, "llama.nope", 1, &u, &info), KIRI_E_MODEL_INVALID);
    CHECK_STR(info.message, "missing key llama.nope");
    u = 77;
    CHECK_EQ_INT(kiri_gguf_get_u32(g, "llama.nope", 0, &u, &info), 1);
    CHECK_EQ_INT(u, 77);
    CHECK_EQ_INT(kiri_gguf_get_u32(g, "general.architecture", 1, &u, &info), KIRI_E_MODEL_INVALID);
    CHECK_STR(info.message, "key general.architecture has type string, expected u32");
    CHECK_EQ_INT(info.offset, 10705);
    CHECK_EQ_INT(kiri_gguf_get_f32(g, "llama.block_count", 1, &eps, &info), KIRI_E_MODEL_INVALID);
    CHECK_STR(info.message, "key llama.block_count has type u32, expected f32");
    CHECK_EQ_INT(kiri_gguf_get_str(g, "llama.block_count", 1, &s, &info), KIRI_E_MODEL_INVALID);
    CHECK_EQ_INT(kiri_gguf_get_bool(g, "llama.block_count", 1, &et, &info), KIRI_E_MODEL_INVALID);
    CHECK_EQ_INT(kiri_gguf_get_arr(g, "llama.block_count", 1, &et, &n, &data, &info),
                 KIRI_E_MODEL_INVALID);
    CHECK_EQ_INT(kiri_gguf_get_u32(g, "tokenizer.ggml.scores", 1, &u, &info), KIRI_E_MODEL_INVALID);
    CHECK_STR(info.message, "key tokenizer.ggml.scores has type array of f32, expected u32");

    /* Tensors: token_embd.weight must equal the llama2.c checkpoint's embedding table, which
     * follows its 7-int header. */
    const struct kiri_gguf_tensor *t = kiri_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t != NULL);
    FILE *f = fopen(STORIES_BIN, "rb");
    CHECK(f != NULL);
    if (t && f) {
        CHECK(t->type == KIRI_TYPE_F32 && t->ne[0] == 64 && t->ne[1] == 512 && t->size == 131072);
        int32_t cfg[7];
        CHECK_EQ_INT(fread(cfg, 4, 7, f), 7);
        CHECK_EQ_INT(cfg[0], 64);
        CHECK_EQ_INT(cfg[5] < 0 ? -cfg[5] : cfg[5], 512);
        float *emb = malloc(t->size);
        CHECK_EQ_INT(fread(emb, 1, t->size, f), t->size);
        CHECK(memcmp(emb, t->data, t->size) == 0);
        free(emb);
    }
    if (f)
        fclose(f);
    t = kiri_gguf_find_tensor(g, "blk.4.ffn_norm.weight");
    CHECK(t && t->offset == 1170944 && t->size == 256 && t == kiri_gguf_tensor(g, 47));
    CHECK(t && (const uint8_t *)t->data + t->size ==
                   (const uint8_t *)kiri_gguf_base(g) + kiri_gguf_file_size(g));
    kiri_gguf_close(g);
}

static void test_vocab_files(void)
{
    /* Counts from the files' producers (llama.cpp's vocab conversions of the named tokenizers). */
    static const struct {
        const char *name;
        int64_t n_kv;
        uint64_t n_tokens, n_merges;
    } v[] = {
        {"gpt-2", 16, 50257, 50000},
        {"llama-bpe", 22, 128256, 280147},
        {"llama-spm", 22, 32000, 0},
        {"qwen2", 21, 151669, 151387},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/tokenizer-vectors/ggml-vocab-%s.gguf", KIRI_SHARED_DIR,
                 v[i].name);
        struct kiri_gguf *g;
        struct kiri_status_info info;
        int rc = kiri_gguf_open(path, &g, &info);
        CHECK_EQ_INT(rc, KIRI_OK);
        if (rc) {
            fprintf(stderr, "  %s: %s\n", path, info.message);
            continue;
        }
        CHECK_EQ_INT(kiri_gguf_n_tensors(g), 0);
        CHECK_EQ_INT(kiri_gguf_n_kv(g), v[i].n_kv);
        int et;
        uint64_t n = 0;
        const void *data;
        CHECK_EQ_INT(kiri_gguf_get_arr(g, "tokenizer.ggml.tokens", 1, &et, &n, &data, &info), 0);
        CHECK_EQ_INT(n, v[i].n_tokens);
        n = 0;
        rc = kiri_gguf_get_arr(g, "tokenizer.ggml.merges", 0, &et, &n, &data, &info);
        CHECK_EQ_INT(rc, v[i].n_merges ? 0 : 1);
        CHECK_EQ_INT(n, v[i].n_merges);
        kiri_gguf_close(g);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Writer
 * ------------------------------------------------------------------------------------------- */

static uint8_t *read_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *p = malloc(len > 0 ? (size_t)len : 1);
    *n = fread(p, 1, (size_t)len, f);
    fclose(f);
    return p;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* Copies every pair and tensor of g to path; returns the status. */
static int copy_model(const struct kiri_gguf *g, const char *path, struct kiri_status_info *info)
{
    struct kiri_gguf_writer *w;
    int rc = kiri_gguf_writer_init(&w);
    if (rc)
        return rc;
    for (int64_t i = 0; !rc && i < kiri_gguf_n_kv(g); i++)
        rc = kiri_gguf_writer_copy_kv(w, g, i);
    for (int64_t i = 0; !rc && i < kiri_gguf_n_tensors(g); i++) {
        const struct kiri_gguf_tensor *t = kiri_gguf_tensor(g, i);
        rc = kiri_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne);
    }
    if (!rc)
        rc = kiri_gguf_writer_begin(w, path, info);
    for (int64_t i = 0; !rc && i < kiri_gguf_n_tensors(g); i++) {
        const struct kiri_gguf_tensor *t = kiri_gguf_tensor(g, i);
        rc = kiri_gguf_writer_write_tensor(w, t->data, t->size, info);
    }
    if (!rc)
        rc = kiri_gguf_writer_finish(w, info);
    kiri_gguf_writer_free(w);
    return rc;
}

static void test_writer_roundtrip(void)
{
    char dir[] = "/tmp/kiri-gguf-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char out[256], partial[300];
    snprintf(out, sizeof out, "%s/copy.gguf", dir);
    snprintf(partial, sizeof partial, "%s.partial", out);

    struct kiri_gguf *g, *h;
    struct kiri_status_info info;
    if (kiri_gguf_open(STORIES, &g, &info) != 0) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(copy_model(g, out, &info), KIRI_OK);
    CHECK(!exists(partial));
    /* llama.cpp wrote the original with the same layout rules, so the copy is byte-identical. */
    size_t na = 0, nb = 0;
    uint8_t *a = read_file(STORIES, &na), *b = read_file(out, &nb);
    CHECK(a && b && na == nb && memcmp(a, b, na) == 0);
    free(a);
    free(b);
    CHECK_EQ_INT(kiri_gguf_open(out, &h, &info), KIRI_OK);
    if (h) {
        CHECK_EQ_INT(kiri_gguf_n_tensors(h), kiri_gguf_n_tensors(g));
        CHECK_EQ_INT(kiri_gguf_n_kv(h), kiri_gguf_n_kv(g));
        for (int64_t i = 0; i < kiri_gguf_n_tensors(g); i++) {
            const struct kiri_gguf_tensor *x = kiri_gguf_tensor(g, i), *y = kiri_gguf_tensor(h, i);
            CHECK(strcmp(x->name, y->name) == 0 && x->size == y->size && x->offset == y->offset &&
                  memcmp(x->data, y->data, x->size) == 0);
        }
        kiri_gguf_close(h);
    }

    /* Overriding a value and a non-default alignment: reloadable, data intact. */
    struct kiri_gguf_writer *w;
    CHECK_EQ_INT(kiri_gguf_writer_init(&w), 0);
    for (int64_t i = 0; i < kiri_gguf_n_kv(g); i++)
        CHECK_EQ_INT(kiri_gguf_writer_copy_kv(w, g, i), 0);
    CHECK_EQ_INT(kiri_gguf_writer_set_str(w, "general.name", "copy"), 0);
    CHECK_EQ_INT(kiri_gguf_writer_set_u32(w, "general.alignment", 3), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_gguf_writer_set_u32(w, "general.alignment", 128), 0);
    CHECK_EQ_INT(kiri_gguf_writer_set_u32(w, "", 1), KIRI_E_INVALID_ARG);
    static const int64_t ne1[] = {3}, ne33[] = {33};
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, "x", KIRI_TYPE_F32, 1, ne1), 0);
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, "x", KIRI_TYPE_F32, 1, ne1), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, "q", KIRI_TYPE_Q4_0, 1, ne33), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, "q", 4, 1, ne1), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, "y", KIRI_TYPE_F32, 5, ne1), KIRI_E_INVALID_ARG);
    const struct kiri_gguf_tensor *te = kiri_gguf_find_tensor(g, "output_norm.weight");
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, te->name, te->type, te->n_dims, te->ne), 0);
    CHECK_EQ_INT(kiri_gguf_writer_begin(w, out, &info), 0);
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, "z", KIRI_TYPE_F32, 1, ne1), KIRI_E_INVALID_ARG);
    float x3[3] = {1, 2, 3};
    CHECK_EQ_INT(kiri_gguf_writer_write_tensor(w, x3, sizeof x3, &info), 0);
    CHECK_EQ_INT(kiri_gguf_writer_write_tensor(w, te->data, te->size, &info), 0);
    CHECK_EQ_INT(kiri_gguf_writer_finish(w, &info), 0);
    kiri_gguf_writer_free(w);
    CHECK_EQ_INT(kiri_gguf_open(out, &h, &info), KIRI_OK);
    if (h) {
        CHECK_EQ_INT(kiri_gguf_alignment(h), 128);
        struct kiri_gguf_str s;
        CHECK_EQ_INT(kiri_gguf_get_str(h, "general.name", 1, &s, &info), 0);
        CHECK(s.len == 4 && memcmp(s.ptr, "copy", 4) == 0);
        CHECK_EQ_INT(kiri_gguf_n_kv(h), kiri_gguf_n_kv(g) + 1);
        const struct kiri_gguf_tensor *y = kiri_gguf_find_tensor(h, "output_norm.weight");
        CHECK(y && y->offset == 128 && memcmp(y->data, te->data, te->size) == 0);
        y = kiri_gguf_find_tensor(h, "x");
        CHECK(y && memcmp(y->data, x3, sizeof x3) == 0);
        kiri_gguf_close(h);
    }

    /* Abort (free before finish) and a wrong-size tensor both remove the partial file. */
    unlink(out);
    CHECK_EQ_INT(kiri_gguf_writer_init(&w), 0);
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, "x", KIRI_TYPE_F32, 1, ne1), 0);
    CHECK_EQ_INT(kiri_gguf_writer_begin(w, out, &info), 0);
    CHECK(exists(partial));
    kiri_gguf_writer_free(w);
    CHECK(!exists(partial) && !exists(out));

    CHECK_EQ_INT(kiri_gguf_writer_init(&w), 0);
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, "x", KIRI_TYPE_F32, 1, ne1), 0);
    CHECK_EQ_INT(kiri_gguf_writer_begin(w, out, &info), 0);
    CHECK_EQ_INT(kiri_gguf_writer_write_tensor(w, x3, 8, &info), KIRI_E_INVALID_ARG);
    CHECK(!exists(partial));
    CHECK(kiri_gguf_writer_finish(w, &info) != 0);
    CHECK(!exists(out));
    kiri_gguf_writer_free(w);

    /* finish before all tensors are written fails and cleans up. */
    CHECK_EQ_INT(kiri_gguf_writer_init(&w), 0);
    CHECK_EQ_INT(kiri_gguf_writer_add_tensor(w, "x", KIRI_TYPE_F32, 1, ne1), 0);
    CHECK_EQ_INT(kiri_gguf_writer_begin(w, out, &info), 0);
    CHECK_EQ_INT(kiri_gguf_writer_finish(w, &info), KIRI_E_INVALID_ARG);
    CHECK(!exists(partial) && !exists(out));
    kiri_gguf_writer_free(w);

    /* An unwritable place is an I/O error; vocab-only (0 tensors) output reloads. */
    CHECK_EQ_INT(kiri_gguf_writer_init(&w), 0);
    CHECK_EQ_INT(kiri_gguf_writer_begin(w, "/nonexistent-dir/x.gguf", &info), KIRI_E_IO);
    kiri_gguf_writer_free(w);
    CHECK_EQ_INT(kiri_gguf_writer_init(&w), 0);
    CHECK_EQ_INT(kiri_gguf_writer_set_str(w, "general.architecture", "llama"), 0);
    CHECK_EQ_INT(kiri_gguf_writer_begin(w, out, &info), 0);
    CHECK_EQ_INT(kiri_gguf_writer_finish(w, &info), 0);
    kiri_gguf_writer_free(w);
    CHECK_EQ_INT(kiri_gguf_open(out, &h, &info), KIRI_OK);
    if (h) {
        CHECK_EQ_INT(kiri_gguf_n_tensors(h), 0);
        CHECK_EQ_INT(kiri_gguf_n_kv(h), 1);
        kiri_gguf_close(h);
    }
    unlink(out);
    rmdir(dir);
    kiri_gguf_close(g);
}

/* ---------------------------------------------------------------------------------------------
 * Failing allocator: every allocation failure while opening gives E_NOMEM and leaks nothing
 * (run under AddressSanitizer to check the second half).
 * ------------------------------------------------------------------------------------------- */

static void test_alloc_failures(void)
{
    int done = 0, nomem = 0, other = 0;
    for (long n = 0; n < 1000 && !done; n++) {
        struct kiri_gguf *g = NULL;
        struct kiri_status_info info;
        kiri_mem_fail_after(n);
        int rc = kiri_gguf_open(STORIES, &g, &info);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK) {
            done = 1;
            CHECK_EQ_INT(kiri_gguf_n_tensors(g), 48);
            kiri_gguf_close(g);
        } else if (rc == KIRI_E_NOMEM && info.code == KIRI_E_NOMEM && g == NULL) {
            nomem++;
        } else {
            other++;
        }
    }
    CHECK(done);
    CHECK(nomem >= 5);
    CHECK_EQ_INT(other, 0);
    fprintf(stderr, "  allocation walk: reader failed cleanly at each of %d allocations\n", nomem);

    /* The writer too: each failure is E_NOMEM (or E_IO never), and nothing is left behind. */
    char dir[] = "/tmp/kiri-gguf-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char out[256], partial[300];
    snprintf(out, sizeof out, "%s/w.gguf", dir);
    snprintf(partial, sizeof partial, "%s.partial", out);
    struct kiri_gguf *g;
    struct kiri_status_info info;
    if (kiri_gguf_open(STORIES, &g, &info) != 0) {
        CHECK(0);
        return;
    }
    done = 0, other = 0, nomem = 0;
    for (long n = 0; n < 1000 && !done; n++) {
        kiri_mem_fail_after(n);
        int rc = copy_model(g, out, &info);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK)
            done = 1;
        else if (rc != KIRI_E_NOMEM || exists(partial))
            other++;
        else
            nomem++;
    }
    CHECK(done);
    CHECK_EQ_INT(other, 0);
    fprintf(stderr, "  allocation walk: writer failed cleanly at each of %d allocations\n", nomem);
    kiri_gguf_close(g);
    unlink(out);
    rmdir(dir);
}

/* ---------------------------------------------------------------------------------------------
 * G39: deterministic mutation campaign
 * ------------------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    uint64_t x = rng_state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return rng_state = x;
}

/* Reads everything a consumer could reach, so a wrong pointer or length shows up under ASan. */
static unsigned touch_all(const struct kiri_gguf *g, int *mismatches)
{
    unsigned sum = 0;
    struct kiri_status_info info;
    for (int64_t i = 0; i < kiri_gguf_n_kv(g); i++) {
        const char *k = kiri_gguf_key(g, i);
        if (kiri_gguf_find_key(g, k) != i) {
            fprintf(stderr, "  lookup of key %lld '%s' gives %lld\n", (long long)i, k,
                    (long long)kiri_gguf_find_key(g, k));
            (*mismatches)++;
        }
        uint32_t u;
        int32_t s;
        float f;
        int b;
        struct kiri_gguf_str st;
        int et;
        uint64_t n;
        const void *data;
        if (kiri_gguf_get_u32(g, k, 1, &u, &info) == 0) sum += u;
        if (kiri_gguf_get_i32(g, k, 1, &s, &info) == 0) sum += (unsigned)s;
        if (kiri_gguf_get_f32(g, k, 1, &f, &info) == 0) sum += (unsigned)(f != 0);
        if (kiri_gguf_get_bool(g, k, 1, &b, &info) == 0) sum += (unsigned)b;
        if (kiri_gguf_get_str(g, k, 1, &st, &info) == 0)
            for (uint64_t j = 0; j < st.len; j++)
                sum += (uint8_t)st.ptr[j];
        if (kiri_gguf_get_arr(g, k, 1, &et, &n, &data, &info) == 0) {
            if (et == KIRI_GGUF_STRING) {
                for (uint64_t j = 0; j < n; j++) {
                    st = kiri_gguf_arr_str(g, i, j);
                    for (uint64_t c = 0; c < st.len; c++)
                        sum += (uint8_t)st.ptr[c];
                }
            } else {
                static const size_t sz[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
                for (uint64_t j = 0; j < n * sz[et]; j++)
                    sum += ((const uint8_t *)data)[j];
            }
        }
    }
    for (int64_t i = 0; i < kiri_gguf_n_tensors(g); i++) {
        const struct kiri_gguf_tensor *t = kiri_gguf_tensor(g, i);
        if (kiri_gguf_find_tensor(g, t->name) != t) {
            fprintf(stderr, "  lookup of tensor %lld '%s' fails\n", (long long)i, t->name);
            (*mismatches)++;
        }
        for (size_t j = 0; j < t->size; j++)
            sum += ((const uint8_t *)t->data)[j];
    }
    return sum;
}

static void mutate(struct img *m, const struct img *src)
{
    m->n = 0;
    put(m, src->p, src->n);
    int edits = 1 + (int)(rnd() % 3);
    for (int e = 0; e < edits && m->n > 0; e++) {
        size_t at = (size_t)(rnd() % m->n);
        switch (rnd() % 6) {
        case 0:   /* bit flip */
            m->p[at] ^= (uint8_t)(1u << (rnd() % 8));
            break;
        case 1: { /* interesting byte */
            static const uint8_t v[] = {0, 1, 0x7F, 0x80, 0xFF, 0x40, 13};
            m->p[at] = v[rnd() % sizeof v];
            break;
        }
        case 2: { /* length-field edit: an interesting u64 at an 8-byte-ish position */
            static const uint64_t v[] = {0, 1, 2, 63, 64, 255, 256, 257, 1u << 24,
                                         0x7FFFFFFFFFFFFFFFull, 0xFFFFFFFFFFFFFFFFull, 1ull << 62,
                                         1ull << 32, 0x80000000ull};
            uint64_t x = rnd() % 4 == 0 ? (uint64_t)m->n - at + (rnd() % 5) - 2 : v[rnd() % 14];
            for (int k = 0; k < 8 && at + (size_t)k < m->n; k++)
                m->p[at + (size_t)k] = (uint8_t)(x >> (8 * k));
            break;
        }
        case 3:   /* truncation */
            m->n = at;
            break;
        case 4:   /* small increment/decrement of a byte (counts off by one) */
            m->p[at] = (uint8_t)(m->p[at] + (rnd() % 2 ? 1 : 0xFF));
            break;
        default: { /* copy a chunk of the file over another place */
            size_t from = (size_t)(rnd() % m->n), len = 1 + (size_t)(rnd() % 16);
            if (from + len <= m->n && at + len <= m->n)
                memmove(m->p + at, m->p + from, len);
            break;
        }
        }
    }
}

static void test_mutations(void)
{
    void (*builders[])(struct img *) = {valid_image, vocab_image, quant_image};
    const int per_image = 3400;
    int accepted = 0, rejected = 0, bad_code = 0, slow = 0, lookups = 0;
    unsigned touched = 0;
    double worst = 0;
    for (int k = 0; k < 3; k++) {
        struct img src = {0}, m = {0};
        builders[k](&src);
        for (int it = 0; it < per_image; it++) {
            mutate(&m, &src);
            struct kiri_gguf *g = NULL;
            struct kiri_status_info info;
            uint8_t *copy;
            struct timespec t0, t1;
            clock_gettime(CLOCK_MONOTONIC, &t0);
            int rc = open_copy(&m, m.n, &g, &copy, &info);
            if (rc == KIRI_OK) {
                accepted++;
                touched += touch_all(g, &lookups);
                kiri_gguf_close(g);
            } else if (rc == KIRI_E_MODEL_INVALID && info.message[0] && info.field[0]) {
                rejected++;
            } else {
                bad_code++;
            }
            clock_gettime(CLOCK_MONOTONIC, &t1);
            double dt = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
            if (dt > worst)
                worst = dt;
            if (dt > 1.0)
                slow++;
            free(copy);
        }
        free(src.p);
        free(m.p);
    }
    fprintf(stderr, "  mutations: %d accepted, %d rejected, worst %.3f ms (checksum %08x)\n",
            accepted, rejected, worst * 1e3, touched);
    CHECK_EQ_INT(accepted + rejected, 3 * per_image);
    CHECK_EQ_INT(bad_code, 0);
    CHECK_EQ_INT(slow, 0);
    CHECK_EQ_INT(lookups, 0);
    CHECK(accepted > 0 && rejected > 0);
}

TEST_MAIN(test_bad_images, test_valid_image, test_vocab_only, test_partial_refused, test_stories,
          test_vocab_files, test_writer_roundtrip, test_alloc_failures, test_mutations)
