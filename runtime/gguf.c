/* GGUF reader and writer (see gguf.h).
 *
 * Reading is one forward pass over the mapping. Every count and length is compared with the bytes
 * that remain before it is used, and every allocation is sized by something the file has already
 * been shown to hold, so a hostile header cannot make us allocate more than a small multiple of the
 * file size. Nothing here recurses and every loop is bounded by a count that was checked that way.
 *
 * Choices the format leaves open, and what we do:
 * - Only little-endian v2 and v3 files are read (v1 used 32-bit counts and is long obsolete).
 * - A bool byte other than 0 or 1 is rejected, not normalised.
 * - general.alignment, when present, must be a u32 power of two from 1 to 65536.
 * - Tensors must be stored in table order, each at the previous one's offset plus its size rounded
 *   up to the alignment, starting at 0. Every writer we know (ggml, gguf-py) produces exactly this
 *   layout, and requiring it rules out overlapping or aliased tensors without a sort.
 * - With no tensors the data section may be absent: the file may end right after the tensor table
 *   or anywhere in its padding (llama.cpp's vocab-only files do both). With tensors, the padding
 *   and every tensor's bytes must be inside the file; the last tensor's own padding may be missing.
 * - Bytes after the last tensor are ignored (trailing garbage is accepted).
 * - Metadata string values are not checked for UTF-8 (vocabularies hold raw byte pieces); keys and
 *   tensor names are.
 *
 * The writer streams to `path.partial` and renames it into place; see the section at the end.
 */
#include "gguf.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "platform.h"
#include "utf8.h"

#define MAX_ALIGNMENT 65536u

/* The smallest encodings, used to bound counts by the bytes remaining: a pair is a key length, one
 * key byte, a type and a one-byte value; a tensor info is a name length, one name byte, n_dims, one
 * dimension, a type and an offset; a string array element is at least its length field. */
#define MIN_KV_BYTES 14u
#define MIN_TENSOR_INFO_BYTES 33u
#define MIN_STRING_BYTES 8u

/* ---------------------------------------------------------------------------------------------
 * Data structures
 * ------------------------------------------------------------------------------------------- */

struct kv {
    const char *key;     /* owned: in key_arena, NUL-terminated (mapped while parsing) */
    uint64_t offset;     /* file offset of the pair (its key length field) */
    uint64_t val;        /* file offset of the value, right after the type field */
    uint64_t val_size;   /* bytes the value takes in the file */
    uint32_t type;       /* enum kiri_gguf_type */
    uint32_t elem_type;  /* arrays: element type */
    uint64_t n;          /* arrays: element count */
    uint64_t *str_off;   /* owned, string arrays only (n): file offset of each element's length */
};

struct kiri_gguf {
    struct kiri_mapping map;   /* owned when owns_map (kiri_gguf_open), else unused */
    int owns_map;
    const uint8_t *base;       /* mapped or borrowed: the whole file */
    size_t size;
    uint32_t version;
    size_t alignment;
    uint64_t data_offset;      /* file offset of the tensor data section */

    int64_t n_kv;
    struct kv *kvs;            /* owned (n_kv), in file order */
    char *key_arena;           /* owned: every key, NUL-terminated */
    int64_t *kv_order;         /* owned (n_kv): kv indices sorted by key, for lookups */

    int64_t n_tensors;
    struct kiri_gguf_tensor *tensors;  /* owned (n_tensors), in file order */
    uint64_t *tensor_info;     /* owned (n_tensors): file offset of each tensor's info record */
    char *name_arena;          /* owned: every tensor name, NUL-terminated */
    int64_t *tensor_order;     /* owned (n_tensors): tensor indices sorted by name */
};

/* ---------------------------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------------------------- */

static const uint8_t gtype_size[KIRI_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static const char *gtype_name(uint32_t t)
{
    static const char *const names[KIRI_GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64",
        "f64"};
    return t < KIRI_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* Explicit little-endian decoding, so the reader also works on a big-endian host. */
static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }

/* Rounds x up to a multiple of the power of two a into *out; returns -1 if that overflows. */
static int pad_to(uint64_t x, uint64_t a, uint64_t *out)
{
    if (x > UINT64_MAX - (a - 1))
        return -1;
    *out = (x + a - 1) & ~(a - 1);
    return 0;
}

/* Keys and names: valid UTF-8 (base/utf8.h: RFC 3629) without NUL, which would cut them short as
 * C strings. */
static int name_text_ok(const uint8_t *s, size_t n)
{
    return memchr(s, 0, n) == NULL && kiri_utf8_valid((const char *)s, n);
}

/* Formats a field name into buf (fields are short; longer names are cut, the message has them). */
static const char *fieldf(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static const char *fieldf(char *buf, size_t cap, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
    return buf;
}

static int fail(struct kiri_status_info *info, uint64_t at, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct kiri_status_info *info, uint64_t at, const char *field, const char *fmt, ...)
{
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return kiri_error_at(info, KIRI_E_MODEL_INVALID, field, (int64_t)at, "%s", msg);
}

static int nomem(struct kiri_status_info *info, const char *what)
{
    return kiri_error_set(info, KIRI_E_NOMEM, "out of memory while reading the GGUF %s", what);
}

/* Copies a mapped, unterminated name into a terminated buffer of cap bytes for messages. */
static void name_copy(char *dst, size_t cap, const char *src, uint64_t len)
{
    size_t n = len < cap - 1 ? (size_t)len : cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

/* ---------------------------------------------------------------------------------------------
 * Sorted name indices: heapsort (worst case n log n, no recursion, no extra memory), then binary
 * search. A hash table would be faster on average but can be flooded by crafted keys.
 * ------------------------------------------------------------------------------------------- */

typedef const char *(*name_fn)(const struct kiri_gguf *g, int64_t i);

static const char *kv_name(const struct kiri_gguf *g, int64_t i) { return g->kvs[i].key; }
static const char *tensor_name(const struct kiri_gguf *g, int64_t i) { return g->tensors[i].name; }

/* Names compare by bytes, ties (duplicates) by position so the order is total. */
static int name_less(const struct kiri_gguf *g, name_fn nf, int64_t a, int64_t b)
{
    int r = strcmp(nf(g, a), nf(g, b));
    return r < 0 || (r == 0 && a < b);
}

static void sift_down(const struct kiri_gguf *g, name_fn nf, int64_t *v, int64_t root, int64_t n)
{
    for (;;) {
        int64_t child = 2 * root + 1;
        if (child >= n)
            return;
        if (child + 1 < n && name_less(g, nf, v[child], v[child + 1]))
            child++;
        if (!name_less(g, nf, v[root], v[child]))
            return;
        int64_t t = v[root];
        v[root] = v[child];
        v[child] = t;
        root = child;
    }
}

static void sort_names(const struct kiri_gguf *g, name_fn nf, int64_t *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        v[i] = i;
    for (int64_t i = n / 2 - 1; i >= 0; i--)
        sift_down(g, nf, v, i, n);
    for (int64_t end = n - 1; end > 0; end--) {
        int64_t t = v[0];
        v[0] = v[end];
        v[end] = t;
        sift_down(g, nf, v, 0, end);
    }
}

/* Returns the first (in file order) index whose name repeats an earlier one, or -1. */
static int64_t first_duplicate(const struct kiri_gguf *g, name_fn nf, const int64_t *v, int64_t n)
{
    int64_t dup = -1;
    for (int64_t i = 1; i < n; i++)
        if (strcmp(nf(g, v[i - 1]), nf(g, v[i])) == 0 && (dup < 0 || v[i] < dup))
            dup = v[i];
    return dup;
}

static int64_t find_sorted(const struct kiri_gguf *g, name_fn nf, const int64_t *v, int64_t n,
                           const char *name)
{
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int r = strcmp(name, nf(g, v[mid]));
        if (r == 0)
            return v[mid];
        if (r < 0)
            hi = mid;
        else
            lo = mid + 1;
    }
    return -1;
}

/* Moves the names (still pointing into the mapping, their u64 length just before them) into one
 * owned arena of NUL-terminated copies. Lengths were validated, so the total is at most the file
 * size plus one byte per name. */
static char *make_arena(const char **names, size_t stride, int64_t n)
{
    size_t total = 1;
    for (int64_t i = 0; i < n; i++) {
        const char *s = *(const char **)(const void *)((const char *)names + (size_t)i * stride);
        total += (size_t)rd64((const uint8_t *)s - 8) + 1;
    }
    char *arena = kiri_mem_alloc(total);
    if (!arena)
        return NULL;
    char *p = arena;
    for (int64_t i = 0; i < n; i++) {
        const char **slot = (const char **)(void *)((char *)names + (size_t)i * stride);
        size_t len = (size_t)rd64((const uint8_t *)*slot - 8);
        memcpy(p, *slot, len);
        p[len] = '\0';
        *slot = p;
        p += len + 1;
    }
    return arena;
}

/* ---------------------------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------------------------- */

struct parser {
    const uint8_t *base;
    size_t size;
    size_t pos;   /* next byte to read; always <= size */
    struct kiri_status_info *info;
};

static size_t left(const struct parser *p) { return p->size - p->pos; }

static int parse_header(struct parser *p, struct kiri_gguf *g, uint64_t *n_tensors, uint64_t *n_kv)
{
    const uint8_t *b = p->base;
    if (p->size >= 4 && memcmp(b, "GGUF", 4) != 0) {
        const char *hint = "";
        if (memcmp(b, "FUGG", 4) == 0)
            hint = ": the magic is byte-swapped";
        else if (!memcmp(b, "GGML", 4) || !memcmp(b, "GGJT", 4) || !memcmp(b, "GGMF", 4) ||
                 !memcmp(b, "lmgg", 4) || !memcmp(b, "tjgg", 4) || !memcmp(b, "fmgg", 4))
            hint = ": a legacy GGML/GGJT file, convert it to GGUF";
        return fail(p->info, 0, "magic", "not GGUF (bad magic)%s", hint);
    }
    if (p->size < 8)
        return fail(p->info, 0, "header", "truncated header (%zu bytes, need 24)", p->size);
    uint32_t v = rd32(b + 4);
    if (v != 2 && v != 3) {
        uint32_t sw = (v >> 24) | ((v >> 8) & 0xFF00u) | ((v << 8) & 0xFF0000u) | (v << 24);
        return fail(p->info, 4, "version", "unsupported version %u%s", v,
                    (sw >= 1 && sw <= 3) ? " (byte-swapped file?)"
                                         : " (kiri reads GGUF v2 and v3)");
    }
    if (p->size < 24)
        return fail(p->info, 0, "header", "truncated header (%zu bytes, need 24)", p->size);
    g->version = v;
    *n_tensors = rd64(b + 8);
    *n_kv = rd64(b + 16);
    p->pos = 24;
    if (*n_tensors > INT64_MAX)
        return fail(p->info, 8, "n_tensors", "n_tensors %lld is negative",
                    (long long)(int64_t)*n_tensors);
    if (*n_kv > INT64_MAX)
        return fail(p->info, 16, "n_kv", "n_kv %lld is negative", (long long)(int64_t)*n_kv);
    /* Each pair and tensor info takes some bytes, so counts the rest of the file cannot hold are
     * rejected here, before anything is allocated for them. */
    size_t rest = left(p);
    if (*n_kv > rest / MIN_KV_BYTES)
        return fail(p->info, 16, "n_kv",
                    "n_kv %llu is more than the %zu bytes after the header can hold",
                    (unsigned long long)*n_kv, rest);
    if (*n_tensors > (rest - *n_kv * MIN_KV_BYTES) / MIN_TENSOR_INFO_BYTES)
        return fail(p->info, 8, "n_tensors",
                    "n_tensors %llu is more than the %zu bytes after the header can hold",
                    (unsigned long long)*n_tensors, rest);
    return KIRI_OK;
}

/* The value of pair i (type already read and known). kname is the key for messages. */
static int parse_value(struct parser *p, struct kv *kv, const char *kname)
{
    char fb[64];
    const char *field = fieldf(fb, sizeof fb, "%s", kname);
    uint64_t at = p->pos;
    switch (kv->type) {
    case KIRI_GGUF_STRING: {
        if (left(p) < 8)
            return fail(p->info, at, field, "key '%s': truncated inside its string length", kname);
        uint64_t len = rd64(p->base + p->pos);
        if (len > KIRI_GGUF_MAX_STRING)
            return fail(p->info, at, field,
                        "key '%s': string length %llu exceeds the %u-byte limit", kname,
                        (unsigned long long)len, KIRI_GGUF_MAX_STRING);
        if (len > left(p) - 8)
            return fail(p->info, at, field,
                        "key '%s': string length %llu exceeds the %zu bytes remaining", kname,
                        (unsigned long long)len, left(p) - 8);
        p->pos += 8 + (size_t)len;
        return KIRI_OK;
    }
    case KIRI_GGUF_ARRAY: {
        if (left(p) < 12)
            return fail(p->info, at, field, "key '%s': truncated inside the array header", kname);
        uint32_t et = rd32(p->base + p->pos);
        uint64_t n = rd64(p->base + p->pos + 4);
        if (et == KIRI_GGUF_ARRAY)
            return fail(p->info, at, field, "key '%s': nested arrays are not supported", kname);
        if (et >= KIRI_GGUF_TYPE_COUNT)
            return fail(p->info, at, field, "key '%s': unknown array element type %u", kname, et);
        p->pos += 12;
        kv->elem_type = et;
        size_t min = et == KIRI_GGUF_STRING ? MIN_STRING_BYTES : gtype_size[et];
        if (n > left(p) / min)
            return fail(p->info, at + 4, field,
                        "key '%s': array count %llu is more than the %zu bytes remaining can hold",
                        kname, (unsigned long long)n, left(p));
        kv->n = n;
        if (et == KIRI_GGUF_STRING) {
            /* 8 bytes of index per element, each element at least 8 bytes of file. */
            if (n) {
                kv->str_off = kiri_mem_array((size_t)n, sizeof *kv->str_off);
                if (!kv->str_off)
                    return nomem(p->info, "string array index");
            }
            for (uint64_t i = 0; i < n; i++) {
                uint64_t eat = p->pos;
                if (left(p) < 8)
                    return fail(p->info, eat, field,
                                "key '%s': element %llu truncated inside its string length", kname,
                                (unsigned long long)i);
                uint64_t len = rd64(p->base + p->pos);
                if (len > KIRI_GGUF_MAX_STRING)
                    return fail(p->info, eat, field,
                                "key '%s': element %llu string length %llu exceeds the "
                                "%u-byte limit",
                                kname, (unsigned long long)i, (unsigned long long)len,
                                KIRI_GGUF_MAX_STRING);
                if (len > left(p) - 8)
                    return fail(p->info, eat, field,
                                "key '%s': element %llu string length %llu exceeds the %zu bytes "
                                "remaining",
                                kname, (unsigned long long)i, (unsigned long long)len, left(p) - 8);
                kv->str_off[i] = eat;
                p->pos += 8 + (size_t)len;
            }
        } else {
            if (et == KIRI_GGUF_BOOL)
                for (uint64_t i = 0; i < n; i++)
                    if (p->base[p->pos + i] > 1)
                        return fail(p->info, p->pos + i, field,
                                    "key '%s': element %llu is a bool with byte value %u, not "
                                    "0 or 1",
                                    kname, (unsigned long long)i, p->base[p->pos + i]);
            p->pos += (size_t)n * min;
        }
        return KIRI_OK;
    }
    default: {
        size_t sz = gtype_size[kv->type];
        if (left(p) < sz)
            return fail(p->info, at, field, "key '%s': truncated inside its %s value", kname,
                        gtype_name(kv->type));
        if (kv->type == KIRI_GGUF_BOOL && p->base[p->pos] > 1)
            return fail(p->info, at, field, "key '%s': bool with byte value %u, not 0 or 1", kname,
                        p->base[p->pos]);
        p->pos += sz;
        return KIRI_OK;
    }
    }
}

static int parse_kv(struct parser *p, struct kv *kv, int64_t i)
{
    char fb[64];
    uint64_t at = p->pos;
    kv->offset = at;
    if (left(p) < 8)
        return fail(p->info, at, fieldf(fb, sizeof fb, "kv[%lld].key", (long long)i),
                    "metadata pair %lld: truncated inside its key length", (long long)i);
    uint64_t len = rd64(p->base + at);
    if (len == 0)
        return fail(p->info, at, fieldf(fb, sizeof fb, "kv[%lld].key", (long long)i),
                    "metadata pair %lld: the key is empty", (long long)i);
    if (len > KIRI_GGUF_MAX_KEY)
        return fail(p->info, at, fieldf(fb, sizeof fb, "kv[%lld].key", (long long)i),
                    "metadata pair %lld: key length %llu exceeds the %d-byte limit", (long long)i,
                    (unsigned long long)len, KIRI_GGUF_MAX_KEY);
    if (len > left(p) - 8)
        return fail(p->info, at, fieldf(fb, sizeof fb, "kv[%lld].key", (long long)i),
                    "metadata pair %lld: key length %llu exceeds the %zu bytes remaining",
                    (long long)i, (unsigned long long)len, left(p) - 8);
    const uint8_t *k = p->base + at + 8;
    if (!name_text_ok(k, (size_t)len))
        return fail(p->info, at + 8, fieldf(fb, sizeof fb, "kv[%lld].key", (long long)i),
                    "metadata pair %lld: the key is not valid UTF-8 or contains NUL", (long long)i);
    kv->key = (const char *)k;
    p->pos += 8 + (size_t)len;

    char kname[KIRI_GGUF_MAX_KEY + 1];
    name_copy(kname, sizeof kname, (const char *)k, len);
    if (left(p) < 4)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "%s", kname),
                    "key '%s': truncated before its type", kname);
    uint32_t type = rd32(p->base + p->pos);
    if (type >= KIRI_GGUF_TYPE_COUNT)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "%s", kname),
                    "key '%s' has unknown type %u", kname, type);
    p->pos += 4;
    kv->type = type;
    kv->val = p->pos;
    int rc = parse_value(p, kv, kname);
    if (rc)
        return rc;
    kv->val_size = p->pos - kv->val;
    return KIRI_OK;
}

/* " of T" for messages about arrays. */
static const char *array_of(uint32_t elem_type)
{
    static const char *const names[KIRI_GGUF_TYPE_COUNT] = {
        " of u8", " of i8", " of u16", " of i16", " of u32", " of i32", " of f32", " of bool",
        " of string", " of array", " of u64", " of i64", " of f64"};
    return elem_type < KIRI_GGUF_TYPE_COUNT ? names[elem_type] : "";
}

static int parse_alignment(struct parser *p, struct kiri_gguf *g)
{
    g->alignment = KIRI_GGUF_DEFAULT_ALIGNMENT;
    int64_t i = find_sorted(g, kv_name, g->kv_order, g->n_kv, "general.alignment");
    if (i < 0)
        return KIRI_OK;
    const struct kv *kv = &g->kvs[i];
    if (kv->type != KIRI_GGUF_UINT32)
        return fail(p->info, kv->offset, "general.alignment",
                    "key general.alignment has type %s%s, expected u32", gtype_name(kv->type),
                    kv->type == KIRI_GGUF_ARRAY ? array_of(kv->elem_type) : "");
    uint32_t a = rd32(p->base + kv->val);
    if (a == 0 || (a & (a - 1)) != 0 || a > MAX_ALIGNMENT)
        return fail(p->info, kv->val, "general.alignment",
                    "general.alignment %u is not a power of two from 1 to %u", a, MAX_ALIGNMENT);
    g->alignment = a;
    return KIRI_OK;
}

/* Tensor info i. *expected is the offset it must have; on success it becomes the next one's. */
static int parse_tensor_info(struct parser *p, struct kiri_gguf *g, int64_t i, uint64_t *expected)
{
    char fb[64];
    struct kiri_gguf_tensor *t = &g->tensors[i];
    uint64_t at = p->pos;
    g->tensor_info[i] = at;
    if (left(p) < 8)
        return fail(p->info, at, fieldf(fb, sizeof fb, "tensor[%lld].name", (long long)i),
                    "tensor %lld: truncated inside its name length", (long long)i);
    uint64_t len = rd64(p->base + at);
    if (len == 0)
        return fail(p->info, at, fieldf(fb, sizeof fb, "tensor[%lld].name", (long long)i),
                    "tensor %lld has an empty name", (long long)i);
    if (len >= KIRI_GGUF_MAX_NAME)
        return fail(p->info, at, fieldf(fb, sizeof fb, "tensor[%lld].name", (long long)i),
                    "tensor %lld: name length %llu exceeds %d bytes", (long long)i,
                    (unsigned long long)len, KIRI_GGUF_MAX_NAME - 1);
    if (len > left(p) - 8)
        return fail(p->info, at, fieldf(fb, sizeof fb, "tensor[%lld].name", (long long)i),
                    "tensor %lld: name length %llu exceeds the %zu bytes remaining", (long long)i,
                    (unsigned long long)len, left(p) - 8);
    const uint8_t *nm = p->base + at + 8;
    if (!name_text_ok(nm, (size_t)len))
        return fail(p->info, at + 8, fieldf(fb, sizeof fb, "tensor[%lld].name", (long long)i),
                    "tensor %lld: the name is not valid UTF-8 or contains NUL", (long long)i);
    t->name = (const char *)nm;
    p->pos += 8 + (size_t)len;
    char name[KIRI_GGUF_MAX_NAME];
    name_copy(name, sizeof name, (const char *)nm, len);

    if (left(p) < 4)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' n_dims", name),
                    "tensor '%s': truncated inside n_dims", name);
    uint32_t nd = rd32(p->base + p->pos);
    if (nd < 1 || nd > KIRI_MAX_DIMS)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' n_dims", name),
                    "tensor '%s' has %u dimensions, expected 1 to %d", name, nd, KIRI_MAX_DIMS);
    p->pos += 4;
    t->n_dims = (int)nd;
    uint64_t ne_at = p->pos;
    int64_t nelem = 1;
    for (int d = 0; d < KIRI_MAX_DIMS; d++)
        t->ne[d] = 1;
    for (uint32_t d = 0; d < nd; d++) {
        if (left(p) < 8)
            return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' ne[%u]", name, d),
                        "tensor '%s': truncated inside ne[%u]", name, d);
        uint64_t v = rd64(p->base + p->pos);
        if (v == 0 || v > INT64_MAX)
            return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' ne[%u]", name, d),
                        "tensor '%s' ne[%u] = %lld is not positive", name, d,
                        (long long)(int64_t)v);
        if ((int64_t)v > INT64_MAX / nelem)
            return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' ne[%u]", name, d),
                        "tensor '%s': the element count overflows at ne[%u]", name, d);
        t->ne[d] = (int64_t)v;
        nelem *= (int64_t)v;
        p->pos += 8;
    }

    if (left(p) < 4)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' type", name),
                    "tensor '%s': truncated inside its type", name);
    uint32_t type = rd32(p->base + p->pos);
    if (type >= KIRI_TYPE_COUNT || kiri_type_size((int)type) == 0)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' type", name),
                    "tensor '%s' has unknown or unsupported type %u", name, type);
    int64_t bs = kiri_type_block_size((int)type);
    if (t->ne[0] % bs != 0)
        return fail(p->info, ne_at, fieldf(fb, sizeof fb, "tensor '%s' ne[0]", name),
                    "tensor '%s' ne[0] = %lld is not a multiple of the %s block size %lld", name,
                    (long long)t->ne[0], kiri_type_name((int)type), (long long)bs);
    uint64_t row_blocks = (uint64_t)(t->ne[0] / bs), ts = kiri_type_size((int)type);
    uint64_t rows = (uint64_t)(nelem / t->ne[0]);
    if (row_blocks > UINT64_MAX / ts || row_blocks * ts > SIZE_MAX / rows)
        return fail(p->info, ne_at, fieldf(fb, sizeof fb, "tensor '%s' ne", name),
                    "tensor '%s': the byte size overflows", name);
    t->type = (int)type;
    t->size = (size_t)(row_blocks * ts * rows);
    p->pos += 4;

    if (left(p) < 8)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' offset", name),
                    "tensor '%s': truncated inside its offset", name);
    uint64_t off = rd64(p->base + p->pos);
    if (off % g->alignment != 0)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' offset", name),
                    "tensor '%s' offset %llu is not a multiple of the alignment %zu", name,
                    (unsigned long long)off, g->alignment);
    if (off != *expected)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' offset", name),
                    "tensor '%s' offset %llu, expected %llu (tensors are stored in order, each "
                    "padded to the alignment)",
                    name, (unsigned long long)off, (unsigned long long)*expected);
    t->offset = off;
    if (off > UINT64_MAX - t->size || pad_to(off + t->size, g->alignment, expected) != 0)
        return fail(p->info, p->pos, fieldf(fb, sizeof fb, "tensor '%s' offset", name),
                    "tensor '%s': offset plus size overflows", name);
    p->pos += 8;
    return KIRI_OK;
}

/* File offset of tensor i's offset field, for messages about its data. */
static uint64_t offset_field_at(const struct kiri_gguf *g, int64_t i)
{
    uint64_t at = g->tensor_info[i];
    return at + 8 + rd64(g->base + at) + 4 + 8 * (uint64_t)g->tensors[i].n_dims + 4;
}

static int parse_tensors(struct parser *p, struct kiri_gguf *g, uint64_t n)
{
    char fb[64];
    /* The header check counted the whole rest of the file; recheck against what is left now. */
    if (n > left(p) / MIN_TENSOR_INFO_BYTES)
        return fail(p->info, 8, "n_tensors",
                    "n_tensors %llu is more than the %zu bytes after the metadata can hold",
                    (unsigned long long)n, left(p));
    if (n) {
        g->tensors = kiri_mem_calloc((size_t)n, sizeof *g->tensors);
        g->tensor_info = kiri_mem_array((size_t)n, sizeof *g->tensor_info);
        if (!g->tensors || !g->tensor_info)
            return nomem(p->info, "tensor table");
    }
    uint64_t expected = 0;
    for (uint64_t i = 0; i < n; i++) {
        g->n_tensors = (int64_t)i;   /* tensors before i are complete */
        int rc = parse_tensor_info(p, g, (int64_t)i, &expected);
        if (rc)
            return rc;
    }
    g->n_tensors = (int64_t)n;

    uint64_t data;
    if (pad_to(p->pos, g->alignment, &data) != 0)
        return fail(p->info, p->pos, "data", "the data section offset overflows");
    g->data_offset = data;
    if (n == 0)
        return KIRI_OK;
    if (data > p->size)
        return fail(p->info, p->pos, "data",
                    "truncated inside the padding before the tensor data (data at %llu, file %zu "
                    "bytes)",
                    (unsigned long long)data, p->size);
    size_t room = p->size - (size_t)data;
    for (uint64_t i = 0; i < n; i++) {
        struct kiri_gguf_tensor *t = &g->tensors[i];
        if (t->offset > room || t->size > room - t->offset) {
            char name[KIRI_GGUF_MAX_NAME];
            name_copy(name, sizeof name, t->name, rd64((const uint8_t *)t->name - 8));
            return fail(p->info, offset_field_at(g, (int64_t)i),
                        fieldf(fb, sizeof fb, "tensor '%s' offset", name),
                        "tensor '%s' data (%zu bytes at %llu) extends past the end of the file "
                        "(%zu bytes)",
                        name, t->size, (unsigned long long)(data + t->offset), p->size);
        }
        t->data = p->base + data + t->offset;
    }
    return KIRI_OK;
}

static int parse(struct parser *p, struct kiri_gguf *g)
{
    uint64_t n_tensors = 0, n_kv = 0;
    int rc = parse_header(p, g, &n_tensors, &n_kv);
    if (rc)
        return rc;

    if (n_kv) {
        g->kvs = kiri_mem_calloc((size_t)n_kv, sizeof *g->kvs);
        if (!g->kvs)
            return nomem(p->info, "metadata table");
    }
    /* n_kv counts the pairs to free on failure, so it grows with each one started. */
    for (uint64_t i = 0; i < n_kv; i++) {
        g->n_kv = (int64_t)i + 1;
        rc = parse_kv(p, &g->kvs[i], (int64_t)i);
        if (rc) {
            g->n_kv = (int64_t)i + 1;
            return rc;
        }
    }
    g->n_kv = (int64_t)n_kv;
    if (n_kv) {
        g->key_arena = make_arena(&g->kvs[0].key, sizeof *g->kvs, g->n_kv);
        g->kv_order = kiri_mem_array((size_t)n_kv, sizeof *g->kv_order);
        if (!g->key_arena || !g->kv_order)
            return nomem(p->info, "metadata keys");
        sort_names(g, kv_name, g->kv_order, g->n_kv);
        int64_t dup = first_duplicate(g, kv_name, g->kv_order, g->n_kv);
        if (dup >= 0)
            return fail(p->info, g->kvs[dup].offset, g->kvs[dup].key, "duplicate key '%s'",
                        g->kvs[dup].key);
    }
    rc = parse_alignment(p, g);
    if (rc)
        return rc;

    rc = parse_tensors(p, g, n_tensors);
    if (rc)
        return rc;
    if (n_tensors) {
        g->name_arena = make_arena(&g->tensors[0].name, sizeof *g->tensors, g->n_tensors);
        g->tensor_order = kiri_mem_array((size_t)n_tensors, sizeof *g->tensor_order);
        if (!g->name_arena || !g->tensor_order)
            return nomem(p->info, "tensor names");
        sort_names(g, tensor_name, g->tensor_order, g->n_tensors);
        int64_t dup = first_duplicate(g, tensor_name, g->tensor_order, g->n_tensors);
        if (dup >= 0) {
            char fb[64];
            return fail(p->info, g->tensor_info[dup],
                        fieldf(fb, sizeof fb, "tensor '%s' name", g->tensors[dup].name),
                        "duplicate tensor name '%s'", g->tensors[dup].name);
        }
    }
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Opening and closing
 * ------------------------------------------------------------------------------------------- */

void kiri_gguf_close(struct kiri_gguf *g)
{
    if (!g)
        return;
    for (int64_t i = 0; g->kvs && i < g->n_kv; i++)
        kiri_mem_free(g->kvs[i].str_off);
    kiri_mem_free(g->kvs);
    kiri_mem_free(g->key_arena);
    kiri_mem_free(g->kv_order);
    kiri_mem_free(g->tensors);
    kiri_mem_free(g->tensor_info);
    kiri_mem_free(g->name_arena);
    kiri_mem_free(g->tensor_order);
    if (g->owns_map)
        kiri_platform_unmap(&g->map);
    kiri_mem_free(g);
}

static int open_common(const void *data, size_t size, struct kiri_gguf **out,
                       struct kiri_status_info *info, struct kiri_gguf **g_out)
{
    kiri_error_clear(info);
    struct kiri_gguf *g = kiri_mem_calloc(1, sizeof *g);
    if (!g)
        return nomem(info, "reader");
    g->base = data;
    g->size = size;
    *g_out = g;
    struct parser p = {data, size, 0, info};
    /* A NULL base is only possible for an empty file; give the parser something to point at. */
    if (!p.base)
        p.base = (const uint8_t *)"";
    g->base = p.base;
    int rc = parse(&p, g);
    if (rc)
        return rc;
    *out = g;
    return KIRI_OK;
}

int kiri_gguf_open_memory(const void *data, size_t size, struct kiri_gguf **out,
                          struct kiri_status_info *info)
{
    struct kiri_gguf *g = NULL;
    int rc = open_common(data, size, out, info, &g);
    if (rc)
        kiri_gguf_close(g);
    return rc;
}

int kiri_gguf_open(const char *path, struct kiri_gguf **out, struct kiri_status_info *info)
{
    struct kiri_mapping map;
    int rc = kiri_platform_map_file(path, &map, info);
    if (rc)
        return rc;
    struct kiri_gguf *g = NULL;
    rc = open_common(map.addr, map.size, out, info, &g);
    if (g) {
        g->map = map;
        g->owns_map = 1;
    } else {
        kiri_platform_unmap(&map);
    }
    if (rc)
        kiri_gguf_close(g);
    return rc;
}

uint32_t kiri_gguf_version(const struct kiri_gguf *g) { return g->version; }
size_t kiri_gguf_file_size(const struct kiri_gguf *g) { return g->size; }
const void *kiri_gguf_base(const struct kiri_gguf *g) { return g->base; }
size_t kiri_gguf_alignment(const struct kiri_gguf *g) { return g->alignment; }

/* ---------------------------------------------------------------------------------------------
 * Metadata access
 * ------------------------------------------------------------------------------------------- */

int64_t kiri_gguf_n_kv(const struct kiri_gguf *g) { return g->n_kv; }

int64_t kiri_gguf_find_key(const struct kiri_gguf *g, const char *key)
{
    if (!key)
        return -1;
    return find_sorted(g, kv_name, g->kv_order, g->n_kv, key);
}

const char *kiri_gguf_key(const struct kiri_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? g->kvs[i].key : NULL;
}

int kiri_gguf_kv_type(const struct kiri_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? (int)g->kvs[i].type : -1;
}

uint64_t kiri_gguf_kv_offset(const struct kiri_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_kv ? g->kvs[i].offset : UINT64_MAX;
}

/* Finds key for a getter: KIRI_OK with *kv set, 1 when absent and optional, else the missing-key
 * error. */
static int lookup(const struct kiri_gguf *g, const char *key, int required, const struct kv **kv,
                  struct kiri_status_info *info)
{
    int64_t i = kiri_gguf_find_key(g, key);
    if (i < 0) {
        if (required)
            return kiri_error_at(info, KIRI_E_MODEL_INVALID, key, -1, "missing key %s", key);
        return 1;
    }
    *kv = &g->kvs[i];
    return KIRI_OK;
}

static int wrong_type(const struct kv *kv, const char *expected, struct kiri_status_info *info)
{
    return kiri_error_at(info, KIRI_E_MODEL_INVALID, kv->key, (int64_t)kv->offset,
                         "key %s has type %s%s, expected %s", kv->key, gtype_name(kv->type),
                         kv->type == KIRI_GGUF_ARRAY ? array_of(kv->elem_type) : "", expected);
}

/* Reads an integer value as sign and magnitude; returns -1 if the type is not an integer. */
static int int_value(const struct kiri_gguf *g, const struct kv *kv, int *neg, uint64_t *mag)
{
    const uint8_t *p = g->base + kv->val;
    int64_t s;
    switch (kv->type) {
    case KIRI_GGUF_UINT8: *neg = 0, *mag = p[0]; return 0;
    case KIRI_GGUF_UINT16: *neg = 0, *mag = (uint64_t)p[0] | (uint64_t)p[1] << 8; return 0;
    case KIRI_GGUF_UINT32: *neg = 0, *mag = rd32(p); return 0;
    case KIRI_GGUF_UINT64: *neg = 0, *mag = rd64(p); return 0;
    case KIRI_GGUF_INT8: s = (int8_t)p[0]; break;
    case KIRI_GGUF_INT16: s = (int16_t)(uint16_t)((unsigned)p[0] | (unsigned)p[1] << 8); break;
    case KIRI_GGUF_INT32: s = (int32_t)rd32(p); break;
    case KIRI_GGUF_INT64: s = (int64_t)rd64(p); break;
    default: return -1;
    }
    *neg = s < 0;
    *mag = s < 0 ? (uint64_t)0 - (uint64_t)s : (uint64_t)s;
    return 0;
}

static int does_not_fit(const struct kv *kv, int neg, uint64_t mag, const char *expected,
                        struct kiri_status_info *info)
{
    return kiri_error_at(info, KIRI_E_MODEL_INVALID, kv->key, (int64_t)kv->offset,
                         "key %s value %s%llu does not fit in %s", kv->key, neg ? "-" : "",
                         (unsigned long long)mag, expected);
}

int kiri_gguf_get_u32(const struct kiri_gguf *g, const char *key, int required, uint32_t *out,
                      struct kiri_status_info *info)
{
    const struct kv *kv;
    int rc = lookup(g, key, required, &kv, info);
    if (rc)
        return rc;
    int neg;
    uint64_t mag;
    if (int_value(g, kv, &neg, &mag) != 0)
        return wrong_type(kv, "u32", info);
    if (neg || mag > UINT32_MAX)
        return does_not_fit(kv, neg, mag, "u32", info);
    *out = (uint32_t)mag;
    return KIRI_OK;
}

int kiri_gguf_get_i32(const struct kiri_gguf *g, const char *key, int required, int32_t *out,
                      struct kiri_status_info *info)
{
    const struct kv *kv;
    int rc = lookup(g, key, required, &kv, info);
    if (rc)
        return rc;
    int neg;
    uint64_t mag;
    if (int_value(g, kv, &neg, &mag) != 0)
        return wrong_type(kv, "i32", info);
    if (neg ? mag > (uint64_t)INT32_MAX + 1 : mag > INT32_MAX)
        return does_not_fit(kv, neg, mag, "i32", info);
    *out = neg ? (int32_t)(-(int64_t)mag) : (int32_t)mag;
    return KIRI_OK;
}

int kiri_gguf_get_f32(const struct kiri_gguf *g, const char *key, int required, float *out,
                      struct kiri_status_info *info)
{
    const struct kv *kv;
    int rc = lookup(g, key, required, &kv, info);
    if (rc)
        return rc;
    double v;
    if (kv->type == KIRI_GGUF_FLOAT32) {
        uint32_t bits = rd32(g->base + kv->val);
        float f;
        memcpy(&f, &bits, sizeof f);
        v = f;
    } else if (kv->type == KIRI_GGUF_FLOAT64) {
        uint64_t bits = rd64(g->base + kv->val);
        memcpy(&v, &bits, sizeof v);
    } else {
        return wrong_type(kv, "f32", info);
    }
    if (!isfinite(v))
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, kv->key, (int64_t)kv->offset,
                             "key %s is not a finite number", kv->key);
    if (fabs(v) > 3.4028234663852886e38)
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, kv->key, (int64_t)kv->offset,
                             "key %s value %g does not fit in f32", kv->key, v);
    *out = (float)v;
    return KIRI_OK;
}

int kiri_gguf_get_bool(const struct kiri_gguf *g, const char *key, int required, int *out,
                       struct kiri_status_info *info)
{
    const struct kv *kv;
    int rc = lookup(g, key, required, &kv, info);
    if (rc)
        return rc;
    if (kv->type != KIRI_GGUF_BOOL)
        return wrong_type(kv, "bool", info);
    *out = g->base[kv->val] != 0;
    return KIRI_OK;
}

int kiri_gguf_get_str(const struct kiri_gguf *g, const char *key, int required,
                      struct kiri_gguf_str *out, struct kiri_status_info *info)
{
    const struct kv *kv;
    int rc = lookup(g, key, required, &kv, info);
    if (rc)
        return rc;
    if (kv->type != KIRI_GGUF_STRING)
        return wrong_type(kv, "string", info);
    out->len = rd64(g->base + kv->val);
    out->ptr = (const char *)g->base + kv->val + 8;
    return KIRI_OK;
}

/* For string arrays *data is NULL: their elements are reached with kiri_gguf_arr_str. */
int kiri_gguf_get_arr(const struct kiri_gguf *g, const char *key, int required, int *elem_type,
                      uint64_t *n, const void **data, struct kiri_status_info *info)
{
    const struct kv *kv;
    int rc = lookup(g, key, required, &kv, info);
    if (rc)
        return rc;
    if (kv->type != KIRI_GGUF_ARRAY)
        return wrong_type(kv, "array", info);
    if (elem_type)
        *elem_type = (int)kv->elem_type;
    if (n)
        *n = kv->n;
    if (data)
        *data = kv->elem_type == KIRI_GGUF_STRING ? NULL : g->base + kv->val + 12;
    return KIRI_OK;
}

/* Out-of-range arguments give {NULL, 0} rather than undefined behaviour. */
struct kiri_gguf_str kiri_gguf_arr_str(const struct kiri_gguf *g, int64_t kv_index, uint64_t i)
{
    struct kiri_gguf_str s = {NULL, 0};
    if (kv_index < 0 || kv_index >= g->n_kv)
        return s;
    const struct kv *kv = &g->kvs[kv_index];
    if (kv->type != KIRI_GGUF_ARRAY || kv->elem_type != KIRI_GGUF_STRING || i >= kv->n)
        return s;
    s.len = rd64(g->base + kv->str_off[i]);
    s.ptr = (const char *)g->base + kv->str_off[i] + 8;
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * Tensor access
 * ------------------------------------------------------------------------------------------- */

int64_t kiri_gguf_n_tensors(const struct kiri_gguf *g) { return g->n_tensors; }

const struct kiri_gguf_tensor *kiri_gguf_tensor(const struct kiri_gguf *g, int64_t i)
{
    return i >= 0 && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const struct kiri_gguf_tensor *kiri_gguf_find_tensor(const struct kiri_gguf *g, const char *name)
{
    if (!name)
        return NULL;
    int64_t i = find_sorted(g, tensor_name, g->tensor_order, g->n_tensors, name);
    return i >= 0 ? &g->tensors[i] : NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Writer. Pairs keep their serialised value bytes (as they appear after the type field), so
 * copying a pair from a reader is a byte copy and keeps arrays intact. Setting a key that is
 * already present replaces its value in place (its position in the file stays).
 * ------------------------------------------------------------------------------------------- */

#define WBUF_SIZE (64u << 10)

enum { W_BUILD, W_DATA, W_DONE, W_FAILED };

struct wkv {
    char *key;          /* owned */
    uint32_t type;
    uint8_t *val;       /* owned (val_size bytes) */
    size_t val_size;
};

struct wtensor {
    char *name;         /* owned */
    int type;
    int n_dims;
    int64_t ne[KIRI_MAX_DIMS];
    uint64_t offset;    /* in the data section, set by begin */
    size_t size;
};

struct kiri_gguf_writer {
    struct wkv *kvs;    /* owned (n_kv, capacity cap_kv) */
    size_t n_kv, cap_kv;
    struct wtensor *ts; /* owned (n_t, capacity cap_t) */
    size_t n_t, cap_t;
    size_t alignment;
    int state;
    int fd;             /* open while state == W_DATA, else -1 */
    char *path;         /* owned */
    char *partial;      /* owned: path + ".partial" */
    size_t next;        /* the tensor write_tensor expects next */
    uint8_t *buf;       /* owned (WBUF_SIZE): output not yet written */
    size_t buf_used;
    uint64_t pos;       /* bytes produced so far (written or buffered) */
};

int kiri_gguf_writer_init(struct kiri_gguf_writer **out)
{
    struct kiri_gguf_writer *w = kiri_mem_calloc(1, sizeof *w);
    if (!w)
        return KIRI_E_NOMEM;
    w->alignment = KIRI_GGUF_DEFAULT_ALIGNMENT;
    w->fd = -1;
    w->state = W_BUILD;
    *out = w;
    return KIRI_OK;
}

void kiri_gguf_writer_free(struct kiri_gguf_writer *w)
{
    if (!w)
        return;
    if (w->state == W_DATA)
        kiri_platform_file_abort(w->fd, w->partial);
    for (size_t i = 0; i < w->n_kv; i++) {
        kiri_mem_free(w->kvs[i].key);
        kiri_mem_free(w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++)
        kiri_mem_free(w->ts[i].name);
    kiri_mem_free(w->kvs);
    kiri_mem_free(w->ts);
    kiri_mem_free(w->path);
    kiri_mem_free(w->partial);
    kiri_mem_free(w->buf);
    kiri_mem_free(w);
}

/* Takes a copy of val. */
static int put_kv(struct kiri_gguf_writer *w, const char *key, uint32_t type, const void *val,
                  size_t size)
{
    if (w->state != W_BUILD || !key)
        return KIRI_E_INVALID_ARG;
    size_t klen = strlen(key);
    if (klen == 0 || klen > KIRI_GGUF_MAX_KEY || !name_text_ok((const uint8_t *)key, klen))
        return KIRI_E_INVALID_ARG;
    size_t align = w->alignment;
    if (strcmp(key, "general.alignment") == 0) {
        if (type != KIRI_GGUF_UINT32 || size != 4)
            return KIRI_E_INVALID_ARG;
        uint32_t a = rd32(val);
        if (a == 0 || (a & (a - 1)) != 0 || a > MAX_ALIGNMENT)
            return KIRI_E_INVALID_ARG;
        align = a;
    }
    uint8_t *copy = kiri_mem_alloc(size);
    if (!copy)
        return KIRI_E_NOMEM;
    if (size)
        memcpy(copy, val, size);
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            kiri_mem_free(w->kvs[i].val);
            w->kvs[i].type = type;
            w->kvs[i].val = copy;
            w->kvs[i].val_size = size;
            w->alignment = align;
            return KIRI_OK;
        }
    }
    if (w->n_kv == w->cap_kv) {
        size_t cap = w->cap_kv ? w->cap_kv * 2 : 16;
        struct wkv *k = kiri_mem_realloc(w->kvs, cap * sizeof *k);
        if (!k) {
            kiri_mem_free(copy);
            return KIRI_E_NOMEM;
        }
        w->kvs = k;
        w->cap_kv = cap;
    }
    char *kcopy = kiri_mem_strndup(key, klen);
    if (!kcopy) {
        kiri_mem_free(copy);
        return KIRI_E_NOMEM;
    }
    w->kvs[w->n_kv++] = (struct wkv){kcopy, type, copy, size};
    w->alignment = align;
    return KIRI_OK;
}

int kiri_gguf_writer_copy_kv(struct kiri_gguf_writer *w, const struct kiri_gguf *g, int64_t i)
{
    if (i < 0 || i >= g->n_kv)
        return KIRI_E_INVALID_ARG;
    const struct kv *kv = &g->kvs[i];
    return put_kv(w, kv->key, kv->type, g->base + kv->val, (size_t)kv->val_size);
}

int kiri_gguf_writer_set_u32(struct kiri_gguf_writer *w, const char *key, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return put_kv(w, key, KIRI_GGUF_UINT32, b, sizeof b);
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int k = 0; k < 8; k++)
        p[k] = (uint8_t)(v >> (8 * k));
}

int kiri_gguf_writer_set_str(struct kiri_gguf_writer *w, const char *key, const char *v)
{
    if (!v)
        return KIRI_E_INVALID_ARG;
    size_t len = strlen(v);
    if (len > KIRI_GGUF_MAX_STRING)
        return KIRI_E_INVALID_ARG;
    uint8_t *b = kiri_mem_alloc(8 + len);
    if (!b)
        return KIRI_E_NOMEM;
    put64(b, len);
    memcpy(b + 8, v, len);
    int rc = put_kv(w, key, KIRI_GGUF_STRING, b, 8 + len);
    kiri_mem_free(b);
    return rc;
}

int kiri_gguf_writer_add_tensor(struct kiri_gguf_writer *w, const char *name, int type, int n_dims,
                                const int64_t *ne)
{
    if (w->state != W_BUILD || !name || !ne || n_dims < 1 || n_dims > KIRI_MAX_DIMS)
        return KIRI_E_INVALID_ARG;
    size_t len = strlen(name);
    if (len == 0 || len >= KIRI_GGUF_MAX_NAME || !name_text_ok((const uint8_t *)name, len))
        return KIRI_E_INVALID_ARG;
    if (type < 0 || type >= KIRI_TYPE_COUNT || kiri_type_size(type) == 0)
        return KIRI_E_INVALID_ARG;
    struct wtensor t = {NULL, type, n_dims, {1, 1, 1, 1}, 0, 0};
    int64_t nelem = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] < 1 || ne[d] > INT64_MAX / nelem)
            return KIRI_E_INVALID_ARG;
        t.ne[d] = ne[d];
        nelem *= ne[d];
    }
    int64_t bs = kiri_type_block_size(type);
    if (t.ne[0] % bs != 0)
        return KIRI_E_INVALID_ARG;
    uint64_t row_blocks = (uint64_t)(t.ne[0] / bs), ts = kiri_type_size(type);
    uint64_t rows = (uint64_t)(nelem / t.ne[0]);
    if (row_blocks > UINT64_MAX / ts || row_blocks * ts > SIZE_MAX / rows)
        return KIRI_E_INVALID_ARG;
    t.size = (size_t)(row_blocks * ts * rows);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->ts[i].name, name) == 0)
            return KIRI_E_INVALID_ARG;
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? w->cap_t * 2 : 16;
        struct wtensor *n = kiri_mem_realloc(w->ts, cap * sizeof *n);
        if (!n)
            return KIRI_E_NOMEM;
        w->ts = n;
        w->cap_t = cap;
    }
    t.name = kiri_mem_strndup(name, len);
    if (!t.name)
        return KIRI_E_NOMEM;
    w->ts[w->n_t++] = t;
    return KIRI_OK;
}

/* Any failure after begin removes the partial file and leaves the writer unusable. */
static int wfail(struct kiri_gguf_writer *w, int rc)
{
    if (w->state == W_DATA) {
        kiri_platform_file_abort(w->fd, w->partial);
        w->fd = -1;
    }
    w->state = W_FAILED;
    return rc;
}

static int wflush(struct kiri_gguf_writer *w, struct kiri_status_info *info)
{
    int rc = kiri_platform_file_write(w->fd, w->partial, w->buf, w->buf_used, info);
    w->buf_used = 0;
    return rc;
}

/* Buffers small pieces and passes large ones (tensor data) straight through. */
static int wput(struct kiri_gguf_writer *w, const void *data, size_t n,
                struct kiri_status_info *info)
{
    w->pos += n;
    if (n > WBUF_SIZE - w->buf_used) {
        int rc = wflush(w, info);
        if (rc)
            return rc;
        if (n >= WBUF_SIZE)
            return kiri_platform_file_write(w->fd, w->partial, data, n, info);
    }
    memcpy(w->buf + w->buf_used, data, n);
    w->buf_used += n;
    return KIRI_OK;
}

static int wput32(struct kiri_gguf_writer *w, uint32_t v, struct kiri_status_info *info)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return wput(w, b, 4, info);
}

static int wput64(struct kiri_gguf_writer *w, uint64_t v, struct kiri_status_info *info)
{
    uint8_t b[8];
    put64(b, v);
    return wput(w, b, 8, info);
}

static int wput_str(struct kiri_gguf_writer *w, const char *s, struct kiri_status_info *info)
{
    size_t len = strlen(s);
    int rc = wput64(w, len, info);
    return rc ? rc : wput(w, s, len, info);
}

static int wpad(struct kiri_gguf_writer *w, struct kiri_status_info *info)
{
    static const uint8_t zeros[256];
    uint64_t target;
    if (pad_to(w->pos, w->alignment, &target) != 0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "GGUF file size overflows");
    while (w->pos < target) {
        uint64_t n = target - w->pos;
        int rc = wput(w, zeros, n < sizeof zeros ? (size_t)n : sizeof zeros, info);
        if (rc)
            return rc;
    }
    return KIRI_OK;
}

static int write_header(struct kiri_gguf_writer *w, struct kiri_status_info *info)
{
    int rc = wput(w, "GGUF", 4, info);
    if (!rc) rc = wput32(w, 3, info);
    if (!rc) rc = wput64(w, w->n_t, info);
    if (!rc) rc = wput64(w, w->n_kv, info);
    for (size_t i = 0; !rc && i < w->n_kv; i++) {
        rc = wput_str(w, w->kvs[i].key, info);
        if (!rc) rc = wput32(w, w->kvs[i].type, info);
        if (!rc) rc = wput(w, w->kvs[i].val, w->kvs[i].val_size, info);
    }
    for (size_t i = 0; !rc && i < w->n_t; i++) {
        const struct wtensor *t = &w->ts[i];
        rc = wput_str(w, t->name, info);
        if (!rc) rc = wput32(w, (uint32_t)t->n_dims, info);
        for (int d = 0; !rc && d < t->n_dims; d++)
            rc = wput64(w, (uint64_t)t->ne[d], info);
        if (!rc) rc = wput32(w, (uint32_t)t->type, info);
        if (!rc) rc = wput64(w, t->offset, info);
    }
    if (!rc)
        rc = wpad(w, info);
    return rc;
}

int kiri_gguf_writer_begin(struct kiri_gguf_writer *w, const char *path,
                           struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (w->state != W_BUILD || !path || !*path)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "GGUF writer: begin called out of order");
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        w->ts[i].offset = off;
        if (off > UINT64_MAX - w->ts[i].size || pad_to(off + w->ts[i].size, w->alignment, &off))
            return wfail(w, kiri_error_set(info, KIRI_E_INVALID_ARG, "GGUF tensor data overflows"));
    }
    size_t len = strlen(path);
    w->path = kiri_mem_strndup(path, len);
    w->partial = kiri_mem_alloc(len + sizeof ".partial");
    w->buf = kiri_mem_alloc(WBUF_SIZE);
    if (!w->path || !w->partial || !w->buf)
        return wfail(w, kiri_error_set(info, KIRI_E_NOMEM, "out of memory starting %s", path));
    memcpy(w->partial, path, len);
    memcpy(w->partial + len, ".partial", sizeof ".partial");
    int rc = kiri_platform_file_create(w->partial, info, &w->fd);
    if (rc)
        return wfail(w, rc);
    w->state = W_DATA;
    w->next = 0;
    w->pos = 0;
    rc = write_header(w, info);
    return rc ? wfail(w, rc) : KIRI_OK;
}

int kiri_gguf_writer_write_tensor(struct kiri_gguf_writer *w, const void *data, size_t size,
                                  struct kiri_status_info *info)
{
    if (w->state != W_DATA || w->next >= w->n_t)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "GGUF writer: no tensor is expected now");
    const struct wtensor *t = &w->ts[w->next];
    if (size != t->size || (size && !data))
        return wfail(w, kiri_error_set(info, KIRI_E_INVALID_ARG,
                                       "GGUF writer: tensor '%s' is %zu bytes, got %zu", t->name,
                                       t->size, size));
    int rc = wput(w, data, size, info);
    if (!rc)
        rc = wpad(w, info);
    if (rc)
        return wfail(w, rc);
    w->next++;
    return KIRI_OK;
}

int kiri_gguf_writer_finish(struct kiri_gguf_writer *w, struct kiri_status_info *info)
{
    if (w->state != W_DATA)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "GGUF writer: finish called out of order");
    if (w->next != w->n_t)
        return wfail(w, kiri_error_set(info, KIRI_E_INVALID_ARG,
                                       "GGUF writer: %zu of %zu tensors written", w->next, w->n_t));
    int rc = wflush(w, info);
    if (rc)
        return wfail(w, rc);
    int fd = w->fd;
    w->fd = -1;
    rc = kiri_platform_file_sync_close(fd, w->partial, info);
    if (!rc)
        rc = kiri_platform_file_rename_durable(w->partial, w->path, info);
    if (rc) {
        kiri_platform_file_abort(-1, w->partial);
        w->state = W_FAILED;
        return rc;
    }
    w->state = W_DONE;
    return KIRI_OK;
}
