/* Chat templates: memory and text. The arena every parse and render allocates from; UTF-8 and
 * Python's notion of whitespace; and Python's str() and repr() of template values, which decide
 * how numbers, lists and dicts print (so they must match Python to the byte: repr(0.1 + 0.2),
 * "1e+16", quoting of strings inside lists).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_ast.h"
#include "chat_template_value.h"
#include "mem.h"
#include "utf8.h"

/* Deepest nesting of lists, dicts and namespaces printing follows (a namespace can be made to
 * contain itself, so this also ends cycles). */
#define MAX_VALUE_DEPTH 64

/* ---------------------------------------------------------------------------------------------
 * Arena
 * ------------------------------------------------------------------------------------------- */

struct kiri_chat_chunk {
    struct kiri_chat_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define CHUNK_SIZE ((size_t)64 << 10)

void *kiri_chat_arena_alloc(struct kiri_chat_arena *a, size_t n)
{
    a->hit_cap = 0;
    if (n > ((size_t)1 << 40)) {
        a->hit_cap = 1;
        return NULL;
    }
    n = (n + 15) & ~(size_t)15;
    struct kiri_chat_chunk *c = a->head;
    if (c && c->size - c->used >= n) {
        void *p = c->data + c->used;
        c->used += n;
        return p;
    }
    /* A large request gets a chunk of its own, placed behind the current one so the space left
     * in the current one stays usable. */
    size_t size = n > CHUNK_SIZE / 4 ? n : CHUNK_SIZE;
    if (a->used + size + sizeof *c > a->cap) {
        a->hit_cap = 1;
        return NULL;
    }
    struct kiri_chat_chunk *nc = kiri_mem_calloc(1, sizeof *nc + size);
    if (!nc)
        return NULL;
    nc->size = size;
    nc->used = n;
    a->used += size + sizeof *nc;
    if (c && size != CHUNK_SIZE) {
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        a->head = nc;
    }
    return nc->data;
}

void kiri_chat_arena_free(struct kiri_chat_arena *a)
{
    struct kiri_chat_chunk *c = a->head;
    while (c) {
        struct kiri_chat_chunk *next = c->next;
        kiri_mem_free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

/* ---------------------------------------------------------------------------------------------
 * UTF-8 and whitespace
 * ------------------------------------------------------------------------------------------- */

static int is_space_cp(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

size_t kiri_chat_space_at(const char *s, size_t n, size_t i)
{
    unsigned char b = (unsigned char)s[i];
    if (b < 0x80)
        return is_space_cp(b) ? 1 : 0;
    if (b != 0xc2 && b != 0xe1 && b != 0xe2 && b != 0xe3)
        return 0;
    uint32_t cp;
    size_t k = kiri_utf8_decode(s + i, n - i, &cp);
    return is_space_cp(cp) ? k : 0;
}

size_t kiri_chat_space_before(const char *s, size_t i)
{
    if (i == 0)
        return 0;
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80 && i - j < 4)
        j--;
    return kiri_chat_space_at(s, i, j) == i - j ? i - j : 0;
}

int kiri_chat_utf8_valid(const char *s, size_t n)
{
    /* NUL bytes are valid UTF-8, but a template or message holding one is refused */
    return kiri_utf8_valid(s, n) && !memchr(s, '\0', n);
}

size_t kiri_chat_cp_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}

/* ---------------------------------------------------------------------------------------------
 * Python's str() and repr()
 * ------------------------------------------------------------------------------------------- */

static int put_s(struct kiri_chat_render *r, struct kiri_chat_buf *b, const char *s)
{
    return kiri_chat_buf_put(r, b, s, strlen(s));
}

void kiri_chat_format_float(double d, char *out, size_t cap)
{
    if (isnan(d)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    if (d == 0) {
        snprintf(out, cap, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    /* The shortest digits that read back as d (Python's repr), then Python's layout: positional
     * when the decimal exponent is in (-4, 16], scientific with two exponent digits otherwise. */
    char buf[40], digits[24];
    int prec;
    for (prec = 1; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    if (prec == 17)
        snprintf(buf, sizeof buf, "%.16e", d);
    const char *p = buf;
    int nd = 0, neg = *p == '-';
    p += neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1), decpt = exp10 + 1;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    char res[48];
    int m = 0;
    if (neg)
        res[m++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            res[m++] = '0';
            res[m++] = '.';
            for (int i = 0; i < -decpt; i++)
                res[m++] = '0';
            for (int i = 0; i < nd; i++)
                res[m++] = digits[i];
        } else {
            for (int i = 0; i < nd || i < decpt; i++) {
                if (i == decpt)
                    res[m++] = '.';
                res[m++] = i < nd ? digits[i] : '0';
            }
            if (decpt >= nd) {
                res[m++] = '.';
                res[m++] = '0';
            }
        }
        res[m] = '\0';
    } else {
        res[m++] = digits[0];
        if (nd > 1) {
            res[m++] = '.';
            for (int i = 1; i < nd; i++)
                res[m++] = digits[i];
        }
        snprintf(res + m, sizeof res - (size_t)m, "e%c%02d", exp10 < 0 ? '-' : '+',
                 exp10 < 0 ? -exp10 : exp10);
    }
    snprintf(out, cap, "%s", res);
}

/* Is the code point one Python's repr() escapes (str.isprintable() false)? Control and format
 * characters, separators other than the space, private use and the non-characters; unassigned
 * code points are not known here and print as themselves. */
static int unprintable(uint32_t c)
{
    return c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad || (c >= 0x600 && c <= 0x605) ||
           c == 0x61c || c == 0x6dd || c == 0x70f || c == 0x180e || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
           (c >= 0x205f && c <= 0x2064) || (c >= 0x2066 && c <= 0x206f) || c == 0x3000 ||
           (c >= 0xe000 && c <= 0xf8ff) || (c >= 0xfdd0 && c <= 0xfdef) || c == 0xfeff ||
           (c >= 0xfff9 && c <= 0xfffb) || (c & 0xfffe) == 0xfffe || (c >= 0xe0000 && c <= 0xe007f) ||
           c >= 0xf0000;
}

static int repr_str(struct kiri_chat_render *r, struct kiri_chat_buf *b, const char *s, size_t n)
{
    char q = memchr(s, '\'', n) && !memchr(s, '"', n) ? '"' : '\'';
    if (kiri_chat_buf_put(r, b, &q, 1) < 0)
        return -1;
    size_t run = 0; /* start of the pending run of bytes copied as they are */
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t k = kiri_utf8_decode(s + i, n - i, &c);
        char esc[16] = "";
        if (c == (uint32_t)q || c == '\\')
            snprintf(esc, sizeof esc, "\\%c", (char)c);
        else if (c == '\n')
            snprintf(esc, sizeof esc, "\\n");
        else if (c == '\r')
            snprintf(esc, sizeof esc, "\\r");
        else if (c == '\t')
            snprintf(esc, sizeof esc, "\\t");
        else if (unprintable(c))
            snprintf(esc, sizeof esc, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x",
                     (unsigned)c);
        if (esc[0]) {
            if (kiri_chat_buf_put(r, b, s + run, i - run) < 0 || put_s(r, b, esc) < 0)
                return -1;
            run = i + k;
        }
        i += k;
    }
    if (kiri_chat_buf_put(r, b, s + run, n - run) < 0)
        return -1;
    return kiri_chat_buf_put(r, b, &q, 1);
}

static int buf_dict(struct kiri_chat_render *r, struct kiri_chat_buf *b,
                    const struct kiri_chat_dict *d, int depth)
{
    if (put_s(r, b, "{") < 0)
        return -1;
    for (size_t i = 0; i < d->n; i++) {
        if ((i && put_s(r, b, ", ") < 0) || kiri_chat_buf_value(r, b, d->k[i], 1, depth + 1) < 0 ||
            put_s(r, b, ": ") < 0 || kiri_chat_buf_value(r, b, d->v[i], 1, depth + 1) < 0)
            return -1;
    }
    return put_s(r, b, "}");
}

int kiri_chat_buf_value(struct kiri_chat_render *r, struct kiri_chat_buf *b,
                        struct kiri_chat_value v, int repr, int depth)
{
    char tmp[48];
    if (depth > MAX_VALUE_DEPTH)
        return kiri_chat_fail(r, NULL, "value nested too deeply to print");
    switch (v.type) {
    case KIRI_CHAT_TYPE_UNDEF: return repr ? put_s(r, b, "Undefined") : 0;
    case KIRI_CHAT_TYPE_NONE: return put_s(r, b, "None");
    case KIRI_CHAT_TYPE_BOOL: return put_s(r, b, v.u.i ? "True" : "False");
    case KIRI_CHAT_TYPE_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
        return put_s(r, b, tmp);
    case KIRI_CHAT_TYPE_FLOAT:
        kiri_chat_format_float(v.u.f, tmp, sizeof tmp);
        return put_s(r, b, tmp);
    case KIRI_CHAT_TYPE_STR:
        return repr ? repr_str(r, b, v.u.s.p, v.u.s.n) : kiri_chat_buf_put(r, b, v.u.s.p, v.u.s.n);
    case KIRI_CHAT_TYPE_LIST: {
        const struct kiri_chat_list *l = v.u.list;
        if (put_s(r, b, l->tuple ? "(" : "[") < 0)
            return -1;
        for (size_t i = 0; i < l->n; i++)
            if ((i && put_s(r, b, ", ") < 0) || kiri_chat_buf_value(r, b, l->v[i], 1, depth + 1) < 0)
                return -1;
        if (l->tuple && l->n == 1 && put_s(r, b, ",") < 0)
            return -1;
        return put_s(r, b, l->tuple ? ")" : "]");
    }
    case KIRI_CHAT_TYPE_DICT: return buf_dict(r, b, v.u.dict, depth);
    case KIRI_CHAT_TYPE_NS:
        if (put_s(r, b, "<Namespace ") < 0 || buf_dict(r, b, v.u.dict, depth) < 0)
            return -1;
        return put_s(r, b, ">");
    case KIRI_CHAT_TYPE_LOOP:
        snprintf(tmp, sizeof tmp, "<LoopContext %lld/%lld>", (long long)v.u.loop->index0 + 1,
                 (long long)v.u.loop->length);
        return put_s(r, b, tmp);
    default: return put_s(r, b, "<function>");
    }
}

int kiri_chat_to_str(struct kiri_chat_render *r, struct kiri_chat_value v,
                     struct kiri_chat_value *out)
{
    if (v.type == KIRI_CHAT_TYPE_STR) {
        *out = v;
        return 0;
    }
    if (v.type == KIRI_CHAT_TYPE_UNDEF) {
        *out = kiri_chat_str("", 0);
        return 0;
    }
    struct kiri_chat_buf b = {0};
    if (kiri_chat_buf_value(r, &b, v, 0, 0) < 0) {
        kiri_chat_buf_free(&b);
        return -1;
    }
    return kiri_chat_buf_finish(r, &b, out);
}

