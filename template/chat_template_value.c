/* Chat templates: values, their semantics and their text (see chat_template_value.h). str()
 * and repr() decide how numbers, lists and dicts print, so they match Python to the byte
 * (quoting of strings inside lists, "1e+16").
 */
#include "chat_template_value.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chat_template_text.h"
#include "error.h"
#include "kiri.h"
#include "utf8.h"

/* Deepest nesting of lists, dicts and namespaces that printing and comparing will follow; a
 * namespace can be made to contain itself, so this also ends cycles. */
#define MAX_VALUE_DEPTH 64

/* ---------------------------------------------------------------------------------------------
 * Errors, work and memory accounting
 * ------------------------------------------------------------------------------------------- */

int kiri_chat_fail(struct kiri_chat_render *r, int64_t at, const char *fmt, ...)
{
    if (r->code)
        return -1;
    r->code = KIRI_E_UNSUPPORTED;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at >= 0)
        kiri_chat_error_at(r->info, r->code, r->src, (size_t)at, msg);
    else
        kiri_error_at(r->info, r->code, "chat_template", -1, "chat template: %s", msg);
    return -1;
}

int kiri_chat_fail_code(struct kiri_chat_render *r, int code, const char *field, const char *fmt, ...)
{
    if (r->code)
        return -1;
    r->code = code;
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kiri_error_at(r->info, code, field, -1, "%s", msg);
    return -1;
}

int kiri_chat_step(struct kiri_chat_render *r, uint64_t n)
{
    r->steps += n;
    if (r->steps > r->max_steps)
        return kiri_chat_fail_code(r, KIRI_E_INVALID_ARG, "max_steps",
                                   "chat template stopped after %llu evaluation steps (max_steps)",
                                   (unsigned long long)r->max_steps);
    return 0;
}

int kiri_chat_charge(struct kiri_chat_render *r, size_t bytes)
{
    return kiri_chat_step(r, bytes >> 8);
}

int kiri_chat_memory_limit(struct kiri_chat_render *r)
{
    return kiri_chat_fail_code(r, KIRI_E_INVALID_ARG, "max_memory",
                               "chat template needed more than %zu bytes of memory (max_memory)",
                               r->max_memory);
}

void *kiri_chat_alloc(struct kiri_chat_render *r, size_t n)
{
    void *p = kiri_chat_arena_alloc(&r->arena, n);
    if (!p) {
        if (r->arena.hit_cap)
            kiri_chat_memory_limit(r);
        else
            kiri_chat_fail_code(r, KIRI_E_NOMEM, "", "out of memory rendering the chat template");
    }
    return p;
}

/* ---------------------------------------------------------------------------------------------
 * Values
 * ------------------------------------------------------------------------------------------- */

struct kiri_chat_value kiri_chat_str(const char *p, size_t n)
{
    struct kiri_chat_value v = {KIRI_CHAT_TYPE_STR, {0}};
    v.u.s.p = p;
    v.u.s.n = n;
    return v;
}

struct kiri_chat_value kiri_chat_bool(int b)
{
    struct kiri_chat_value v = {KIRI_CHAT_TYPE_BOOL, {0}};
    v.u.i = b != 0;
    return v;
}

struct kiri_chat_value kiri_chat_int(int64_t i)
{
    struct kiri_chat_value v = {KIRI_CHAT_TYPE_INT, {0}};
    v.u.i = i;
    return v;
}

struct kiri_chat_value kiri_chat_float(double f)
{
    struct kiri_chat_value v = {KIRI_CHAT_TYPE_FLOAT, {0}};
    v.u.f = f;
    return v;
}

struct kiri_chat_value kiri_chat_undef(const char *name, size_t n)
{
    struct kiri_chat_value v = {KIRI_CHAT_TYPE_UNDEF, {0}};
    v.u.s.p = name;
    v.u.s.n = n;
    return v;
}

int kiri_chat_new_str(struct kiri_chat_render *r, size_t n, char **p, struct kiri_chat_value *out)
{
    if (n > r->max_memory)
        return kiri_chat_memory_limit(r);
    if (kiri_chat_charge(r, n) < 0)
        return -1;
    char *m = kiri_chat_alloc(r, n + 1);
    if (!m)
        return -1;
    *p = m;
    *out = kiri_chat_str(m, n);
    return 0;
}

int kiri_chat_new_list(struct kiri_chat_render *r, size_t n, int tuple, struct kiri_chat_value *out)
{
    if (n > r->max_memory / sizeof(struct kiri_chat_value))
        return kiri_chat_memory_limit(r);
    struct kiri_chat_list *l = kiri_chat_alloc(r, sizeof *l + n * sizeof *l->v);
    if (!l || kiri_chat_step(r, n / 16) < 0)
        return -1;
    l->n = n;
    l->tuple = tuple;
    l->v = (struct kiri_chat_value *)(l + 1);
    out->type = KIRI_CHAT_TYPE_LIST;
    out->u.list = l;
    return 0;
}

int kiri_chat_new_dict(struct kiri_chat_render *r, int ns, struct kiri_chat_value *out)
{
    struct kiri_chat_dict *d = kiri_chat_alloc(r, sizeof *d);
    if (!d)
        return -1;
    out->type = ns ? KIRI_CHAT_TYPE_NS : KIRI_CHAT_TYPE_DICT;
    out->u.dict = d;
    return 0;
}

const struct kiri_chat_value *kiri_chat_dict_get(const struct kiri_chat_dict *d,
                                                 struct kiri_chat_value k)
{
    for (size_t i = 0; i < d->n; i++)
        if (kiri_chat_equal(d->k[i], k, 0))
            return &d->v[i];
    return NULL;
}

int kiri_chat_dict_set(struct kiri_chat_render *r, struct kiri_chat_dict *d,
                       struct kiri_chat_value k, struct kiri_chat_value v)
{
    for (size_t i = 0; i < d->n; i++) {
        if (kiri_chat_equal(d->k[i], k, 0)) {
            d->v[i] = v;
            return 0;
        }
    }
    if (kiri_chat_step(r, d->n / 16) < 0)
        return -1;
    if (d->n == d->cap) {
        /* the old arrays stay in the arena; dicts in templates are small */
        size_t nc = d->cap ? d->cap * 2 : 2;
        struct kiri_chat_value *nk = kiri_chat_alloc(r, 2 * nc * sizeof *nk);
        if (!nk)
            return -1;
        if (d->n) {
            memcpy(nk, d->k, d->n * sizeof *nk);
            memcpy(nk + nc, d->v, d->n * sizeof *nk);
        }
        d->k = nk;
        d->v = nk + nc;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

const char *kiri_chat_type_name(struct kiri_chat_value v)
{
    switch (v.type) {
    case KIRI_CHAT_TYPE_UNDEF: return "Undefined";
    case KIRI_CHAT_TYPE_NONE: return "NoneType";
    case KIRI_CHAT_TYPE_BOOL: return "bool";
    case KIRI_CHAT_TYPE_INT: return "int";
    case KIRI_CHAT_TYPE_FLOAT: return "float";
    case KIRI_CHAT_TYPE_STR: return "str";
    case KIRI_CHAT_TYPE_LIST: return v.u.list->tuple ? "tuple" : "list";
    case KIRI_CHAT_TYPE_DICT: return "dict";
    case KIRI_CHAT_TYPE_NS: return "Namespace";
    case KIRI_CHAT_TYPE_LOOP: return "LoopContext";
    case KIRI_CHAT_TYPE_FUNC: return "function";
    case KIRI_CHAT_TYPE_MACRO: return "Macro";
    default: return "missing";
    }
}

int kiri_chat_truthy(struct kiri_chat_value v)
{
    switch (v.type) {
    case KIRI_CHAT_TYPE_BOOL:
    case KIRI_CHAT_TYPE_INT: return v.u.i != 0;
    case KIRI_CHAT_TYPE_FLOAT: return v.u.f != 0;
    case KIRI_CHAT_TYPE_STR: return v.u.s.n != 0;
    case KIRI_CHAT_TYPE_LIST: return v.u.list->n != 0;
    case KIRI_CHAT_TYPE_DICT: return v.u.dict->n != 0;
    case KIRI_CHAT_TYPE_NS:
    case KIRI_CHAT_TYPE_LOOP:
    case KIRI_CHAT_TYPE_FUNC:
    case KIRI_CHAT_TYPE_MACRO: return 1;
    default: return 0;
    }
}

int kiri_chat_is_number(struct kiri_chat_value v)
{
    return v.type == KIRI_CHAT_TYPE_BOOL || v.type == KIRI_CHAT_TYPE_INT ||
           v.type == KIRI_CHAT_TYPE_FLOAT;
}

double kiri_chat_number(struct kiri_chat_value v)
{
    return v.type == KIRI_CHAT_TYPE_FLOAT ? v.u.f : (double)v.u.i;
}

int kiri_chat_equal(struct kiri_chat_value a, struct kiri_chat_value b, int depth)
{
    if (kiri_chat_is_number(a) && kiri_chat_is_number(b)) {
        if (a.type != KIRI_CHAT_TYPE_FLOAT && b.type != KIRI_CHAT_TYPE_FLOAT)
            return a.u.i == b.u.i;
        return kiri_chat_number(a) == kiri_chat_number(b);
    }
    if (a.type != b.type || depth > MAX_VALUE_DEPTH)
        return 0;
    switch (a.type) {
    case KIRI_CHAT_TYPE_UNDEF:
    case KIRI_CHAT_TYPE_NONE: return 1;
    case KIRI_CHAT_TYPE_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case KIRI_CHAT_TYPE_LIST:
        if (a.u.list->tuple != b.u.list->tuple || a.u.list->n != b.u.list->n)
            return 0;
        for (size_t i = 0; i < a.u.list->n; i++)
            if (!kiri_chat_equal(a.u.list->v[i], b.u.list->v[i], depth + 1))
                return 0;
        return 1;
    case KIRI_CHAT_TYPE_DICT:
        if (a.u.dict->n != b.u.dict->n)
            return 0;
        for (size_t i = 0; i < a.u.dict->n; i++) {
            const struct kiri_chat_value *o = kiri_chat_dict_get(b.u.dict, a.u.dict->k[i]);
            if (!o || !kiri_chat_equal(a.u.dict->v[i], *o, depth + 1))
                return 0;
        }
        return 1;
    case KIRI_CHAT_TYPE_NS: return a.u.dict == b.u.dict;
    case KIRI_CHAT_TYPE_LOOP: return a.u.loop == b.u.loop;
    case KIRI_CHAT_TYPE_FUNC: return a.u.i == b.u.i;
    case KIRI_CHAT_TYPE_MACRO: return a.u.macro == b.u.macro;
    default: return 0;
    }
}

/* Python's ordering comparisons, following sequences depth levels down. */
static int order(struct kiri_chat_render *r, int64_t at, enum kiri_chat_order op,
                 struct kiri_chat_value a, struct kiri_chat_value b, int depth, int *res)
{
    int c;
    if (kiri_chat_is_number(a) && kiri_chat_is_number(b)) {
        if (a.type != KIRI_CHAT_TYPE_FLOAT && b.type != KIRI_CHAT_TYPE_FLOAT) {
            c = a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
        } else {
            double x = kiri_chat_number(a), y = kiri_chat_number(b);
            *res = op == KIRI_CHAT_LT ? x < y : op == KIRI_CHAT_LE ? x <= y
                 : op == KIRI_CHAT_GT ? x > y : x >= y;
            return 0;
        }
    } else if (a.type == KIRI_CHAT_TYPE_STR && b.type == KIRI_CHAT_TYPE_STR) {
        /* UTF-8 byte order is code point order */
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        c = memcmp(a.u.s.p, b.u.s.p, m);
        if (c == 0)
            c = a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
        if (kiri_chat_charge(r, m) < 0)
            return -1;
    } else if (a.type == KIRI_CHAT_TYPE_LIST && b.type == KIRI_CHAT_TYPE_LIST &&
               a.u.list->tuple == b.u.list->tuple && depth < MAX_VALUE_DEPTH) {
        size_t i = 0, na = a.u.list->n, nb = b.u.list->n;
        while (i < na && i < nb && kiri_chat_equal(a.u.list->v[i], b.u.list->v[i], depth + 1))
            i++;
        if (i < na && i < nb)
            return order(r, at, op, a.u.list->v[i], b.u.list->v[i], depth + 1, res);
        c = na < nb ? -1 : na > nb;
    } else {
        static const char *const sym[] = {"<", "<=", ">", ">="};
        if (a.type == KIRI_CHAT_TYPE_UNDEF || b.type == KIRI_CHAT_TYPE_UNDEF) {
            struct kiri_chat_value u = a.type == KIRI_CHAT_TYPE_UNDEF ? a : b;
            return kiri_chat_fail(r, at, "'%.*s' is undefined", (int)u.u.s.n, u.u.s.p);
        }
        return kiri_chat_fail(r, at, "'%s' not supported between instances of '%s' and '%s'",
                              sym[op], kiri_chat_type_name(a),
                              kiri_chat_type_name(b));
    }
    *res = op == KIRI_CHAT_LT ? c < 0 : op == KIRI_CHAT_LE ? c <= 0
         : op == KIRI_CHAT_GT ? c > 0 : c >= 0;
    return 0;
}

int kiri_chat_compare(struct kiri_chat_render *r, int64_t at, enum kiri_chat_order op,
                      struct kiri_chat_value a, struct kiri_chat_value b, int *res)
{
    return order(r, at, op, a, b, 0, res);
}

int kiri_chat_less(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value a,
                   struct kiri_chat_value b, int *lt)
{
    return order(r, at, KIRI_CHAT_LT, a, b, 0, lt);
}

int kiri_chat_contains(struct kiri_chat_render *r, int64_t at,
                       struct kiri_chat_value c, struct kiri_chat_value item, int *found)
{
    switch (c.type) {
    case KIRI_CHAT_TYPE_STR:
        if (item.type != KIRI_CHAT_TYPE_STR)
            return kiri_chat_fail(r, at, "'in <string>' requires string as left operand, not %s",
                                  kiri_chat_type_name(item));
        *found = item.u.s.n == 0 || memmem(c.u.s.p, c.u.s.n, item.u.s.p, item.u.s.n) != NULL;
        return kiri_chat_charge(r, c.u.s.n);
    case KIRI_CHAT_TYPE_LIST:
        *found = 0;
        for (size_t i = 0; i < c.u.list->n && !*found; i++)
            *found = kiri_chat_equal(c.u.list->v[i], item, 0);
        return kiri_chat_step(r, c.u.list->n / 16);
    case KIRI_CHAT_TYPE_DICT:
        *found = kiri_chat_dict_get(c.u.dict, item) != NULL;
        return 0;
    case KIRI_CHAT_TYPE_UNDEF:
        *found = 0;
        return 0;
    default:
        return kiri_chat_fail(r, at, "argument of type '%s' is not iterable", kiri_chat_type_name(c));
    }
}

int kiri_chat_iterate(struct kiri_chat_render *r, int64_t at,
                      struct kiri_chat_value v, const struct kiri_chat_value **items, size_t *n)
{
    switch (v.type) {
    case KIRI_CHAT_TYPE_LIST:
        *items = v.u.list->v;
        *n = v.u.list->n;
        return 0;
    case KIRI_CHAT_TYPE_DICT:
        *items = v.u.dict->k;
        *n = v.u.dict->n;
        return 0;
    case KIRI_CHAT_TYPE_UNDEF:
        *items = NULL;
        *n = 0;
        return 0;
    case KIRI_CHAT_TYPE_STR: {
        struct kiri_chat_value l;
        size_t count = kiri_chat_cp_len(v.u.s.p, v.u.s.n), k = 0;
        if (kiri_chat_new_list(r, count, 0, &l) < 0)
            return -1;
        for (size_t i = 0; i < v.u.s.n; k++) {
            uint32_t cp;
            size_t len = kiri_utf8_decode(v.u.s.p + i, v.u.s.n - i, &cp);
            l.u.list->v[k] = kiri_chat_str(v.u.s.p + i, len);
            i += len;
        }
        *items = l.u.list->v;
        *n = count;
        return 0;
    }
    default:
        return kiri_chat_fail(r, at, "'%s' object is not iterable", kiri_chat_type_name(v));
    }
}

int kiri_chat_undefined_error(struct kiri_chat_render *r, int64_t at,
                           struct kiri_chat_value u)
{
    if (u.u.s.n)
        return kiri_chat_fail(r, at, "'%.*s' is undefined", (int)(u.u.s.n > 60 ? 60 : u.u.s.n),
                              u.u.s.p);
    return kiri_chat_fail(r, at, "a value is undefined");
}

int kiri_chat_getattr(struct kiri_chat_render *r, int64_t at,
                      struct kiri_chat_value obj, const char *name, size_t len,
                      struct kiri_chat_value *out)
{
    *out = kiri_chat_undef(name, len);
    if (obj.type == KIRI_CHAT_TYPE_UNDEF)
        return kiri_chat_undefined_error(r, at, obj);
    if (obj.type == KIRI_CHAT_TYPE_DICT || obj.type == KIRI_CHAT_TYPE_NS) {
        const struct kiri_chat_value *v = kiri_chat_dict_get(obj.u.dict, kiri_chat_str(name, len));
        if (v)
            *out = *v;
        return 0;
    }
    if (obj.type == KIRI_CHAT_TYPE_LOOP) {
        const struct kiri_chat_loop *l = obj.u.loop;
        int64_t i = l->index0, n = l->length;
#define IS(s) (len == sizeof(s) - 1 && memcmp(name, s, len) == 0)
        if (IS("index"))
            *out = kiri_chat_int(i + 1);
        else if (IS("index0"))
            *out = kiri_chat_int(i);
        else if (IS("revindex"))
            *out = kiri_chat_int(n - i);
        else if (IS("revindex0"))
            *out = kiri_chat_int(n - i - 1);
        else if (IS("first"))
            *out = kiri_chat_bool(i == 0);
        else if (IS("last"))
            *out = kiri_chat_bool(i == n - 1);
        else if (IS("length"))
            *out = kiri_chat_int(n);
        else if (IS("depth"))
            *out = kiri_chat_int(1);
        else if (IS("depth0"))
            *out = kiri_chat_int(0);
        else if (IS("previtem") && i > 0)
            *out = l->items[i - 1];
        else if (IS("nextitem") && i + 1 < n)
            *out = l->items[i + 1];
#undef IS
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Output and scratch buffers
 * ------------------------------------------------------------------------------------------- */

int kiri_chat_buf_put(struct kiri_chat_render *r, struct kiri_chat_buf *b, const char *s, size_t n)
{
    if (b->is_output) {
        if (n > r->max_output - r->produced)
            return kiri_chat_fail_code(r, KIRI_E_INVALID_ARG, "max_output",
                                       "chat template output exceeds %zu bytes (max_output)",
                                       r->max_output);
        r->produced += n;
    } else if (n > r->max_memory - b->text.len) {
        return kiri_chat_memory_limit(r);
    }
    if (kiri_chat_charge(r, n) < 0)
        return -1;
    if (kiri_buf_append(&b->text, s, n) < 0)
        return kiri_chat_fail_code(r, KIRI_E_NOMEM, "", "out of memory rendering the chat template");
    return 0;
}

int kiri_chat_buf_puts(struct kiri_chat_render *r, struct kiri_chat_buf *b, const char *s)
{
    return kiri_chat_buf_put(r, b, s, strlen(s));
}

void kiri_chat_buf_free(struct kiri_chat_buf *b)
{
    kiri_buf_free(&b->text);
}

int kiri_chat_buf_finish(struct kiri_chat_render *r, struct kiri_chat_buf *b,
                         struct kiri_chat_value *out)
{
    char *p;
    int rc = kiri_chat_new_str(r, b->text.len, &p, out);
    if (rc == 0 && b->text.len)
        memcpy(p, b->text.data, b->text.len);
    kiri_chat_buf_free(b);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Python's str() and repr()
 * ------------------------------------------------------------------------------------------- */

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
        else if (kiri_chat_cp_unprintable(c))
            snprintf(esc, sizeof esc, c < 0x100 ? "\\x%02x" : c < 0x10000 ? "\\u%04x" : "\\U%08x",
                     (unsigned)c);
        if (esc[0]) {
            if (kiri_chat_buf_put(r, b, s + run, i - run) < 0 || kiri_chat_buf_puts(r, b, esc) < 0)
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
    if (kiri_chat_buf_puts(r, b, "{") < 0)
        return -1;
    for (size_t i = 0; i < d->n; i++) {
        if ((i && kiri_chat_buf_puts(r, b, ", ") < 0) || kiri_chat_buf_value(r, b, d->k[i], 1, depth + 1) < 0 ||
            kiri_chat_buf_puts(r, b, ": ") < 0 || kiri_chat_buf_value(r, b, d->v[i], 1, depth + 1) < 0)
            return -1;
    }
    return kiri_chat_buf_puts(r, b, "}");
}

int kiri_chat_buf_value(struct kiri_chat_render *r, struct kiri_chat_buf *b,
                        struct kiri_chat_value v, int repr, int depth)
{
    char tmp[48];
    if (depth > MAX_VALUE_DEPTH)
        return kiri_chat_fail(r, KIRI_CHAT_NOWHERE, "value nested too deeply to print");
    switch (v.type) {
    case KIRI_CHAT_TYPE_UNDEF: return repr ? kiri_chat_buf_puts(r, b, "Undefined") : 0;
    case KIRI_CHAT_TYPE_NONE: return kiri_chat_buf_puts(r, b, "None");
    case KIRI_CHAT_TYPE_BOOL: return kiri_chat_buf_puts(r, b, v.u.i ? "True" : "False");
    case KIRI_CHAT_TYPE_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
        return kiri_chat_buf_puts(r, b, tmp);
    case KIRI_CHAT_TYPE_FLOAT:
        kiri_chat_format_float(v.u.f, tmp, sizeof tmp);
        return kiri_chat_buf_puts(r, b, tmp);
    case KIRI_CHAT_TYPE_STR:
        return repr ? repr_str(r, b, v.u.s.p, v.u.s.n) : kiri_chat_buf_put(r, b, v.u.s.p, v.u.s.n);
    case KIRI_CHAT_TYPE_LIST: {
        const struct kiri_chat_list *l = v.u.list;
        if (kiri_chat_buf_puts(r, b, l->tuple ? "(" : "[") < 0)
            return -1;
        for (size_t i = 0; i < l->n; i++)
            if ((i && kiri_chat_buf_puts(r, b, ", ") < 0) || kiri_chat_buf_value(r, b, l->v[i], 1, depth + 1) < 0)
                return -1;
        if (l->tuple && l->n == 1 && kiri_chat_buf_puts(r, b, ",") < 0)
            return -1;
        return kiri_chat_buf_puts(r, b, l->tuple ? ")" : "]");
    }
    case KIRI_CHAT_TYPE_DICT: return buf_dict(r, b, v.u.dict, depth);
    case KIRI_CHAT_TYPE_NS:
        if (kiri_chat_buf_puts(r, b, "<Namespace ") < 0 || buf_dict(r, b, v.u.dict, depth) < 0)
            return -1;
        return kiri_chat_buf_puts(r, b, ">");
    case KIRI_CHAT_TYPE_LOOP:
        snprintf(tmp, sizeof tmp, "<LoopContext %lld/%lld>", (long long)v.u.loop->index0 + 1,
                 (long long)v.u.loop->length);
        return kiri_chat_buf_puts(r, b, tmp);
    default: return kiri_chat_buf_puts(r, b, "<function>");
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

