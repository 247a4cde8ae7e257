/* Chat templates: the evaluator. Runs a parsed template over a conversation with the
 * semantics jinja2 gives it under transformers' settings (see chat_template.h), within the
 * render's limits. Filters, tests, methods and global functions are in
 * chat_template_builtins.c, the printing of values in chat_template_text.c; the value model is
 * described in chat_template_value.h.
 */
#include "chat_template.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_ast.h"
#include "chat_template_value.h"
#include "buf.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "utf8.h"

/* Deepest nesting of lists, dicts and namespaces that printing and comparing will follow; a
 * namespace can be made to contain itself, so this also ends cycles. */
#define MAX_VALUE_DEPTH 64

enum { FLOW_NORMAL = 0, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

/* ---------------------------------------------------------------------------------------------
 * Errors, work and memory accounting
 * ------------------------------------------------------------------------------------------- */

static void line_col(const char *s, size_t pos, int *line, int *col)
{
    int l = 1;
    size_t start = 0;
    for (size_t i = 0; i < pos; i++) {
        if (s[i] == '\n') {
            l++;
            start = i + 1;
        }
    }
    *line = l;
    *col = (int)(pos - start) + 1;
}

int kiri_chat_fail(struct kiri_chat_render *r, const struct kiri_chat_expr *e, const char *fmt, ...)
{
    if (r->code)
        return -1;
    r->code = KIRI_E_UNSUPPORTED;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (e) {
        int line, col;
        line_col(r->t->src, e->pos, &line, &col);
        kiri_error_at(r->info, r->code, "chat_template", (int64_t)e->pos,
                      "chat template line %d, column %d: %s", line, col, msg);
    } else {
        kiri_error_at(r->info, r->code, "chat_template", -1, "chat template: %s", msg);
    }
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

static int memory_limit(struct kiri_chat_render *r)
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
            memory_limit(r);
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
        return memory_limit(r);
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
        return memory_limit(r);
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
    case KIRI_CHAT_TYPE_FUNC: return 1;
    default: return 0;
    }
}

static int is_num(struct kiri_chat_value v)
{
    return v.type == KIRI_CHAT_TYPE_BOOL || v.type == KIRI_CHAT_TYPE_INT ||
           v.type == KIRI_CHAT_TYPE_FLOAT;
}

static double num(struct kiri_chat_value v)
{
    return v.type == KIRI_CHAT_TYPE_FLOAT ? v.u.f : (double)v.u.i;
}

int kiri_chat_equal(struct kiri_chat_value a, struct kiri_chat_value b, int depth)
{
    if (is_num(a) && is_num(b)) {
        if (a.type != KIRI_CHAT_TYPE_FLOAT && b.type != KIRI_CHAT_TYPE_FLOAT)
            return a.u.i == b.u.i;
        return num(a) == num(b);
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
    default: return 0;
    }
}

/* Python's ordering comparisons; op is one of LT, LE, GT, GE. */
static int order(struct kiri_chat_render *r, const struct kiri_chat_expr *e, int op,
                 struct kiri_chat_value a, struct kiri_chat_value b, int depth, int *res)
{
    int c;
    if (is_num(a) && is_num(b)) {
        if (a.type != KIRI_CHAT_TYPE_FLOAT && b.type != KIRI_CHAT_TYPE_FLOAT) {
            c = a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
        } else {
            double x = num(a), y = num(b);
            *res = op == KIRI_CHAT_OP_LT ? x < y : op == KIRI_CHAT_OP_LE ? x <= y
                 : op == KIRI_CHAT_OP_GT ? x > y : x >= y;
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
            return order(r, e, op, a.u.list->v[i], b.u.list->v[i], depth + 1, res);
        c = na < nb ? -1 : na > nb;
    } else {
        static const char *const sym[] = {"<", "<=", ">", ">="};
        if (a.type == KIRI_CHAT_TYPE_UNDEF || b.type == KIRI_CHAT_TYPE_UNDEF) {
            struct kiri_chat_value u = a.type == KIRI_CHAT_TYPE_UNDEF ? a : b;
            return kiri_chat_fail(r, e, "'%.*s' is undefined", (int)u.u.s.n, u.u.s.p);
        }
        return kiri_chat_fail(r, e, "'%s' not supported between instances of '%s' and '%s'",
                              sym[op - KIRI_CHAT_OP_LT], kiri_chat_type_name(a),
                              kiri_chat_type_name(b));
    }
    *res = op == KIRI_CHAT_OP_LT ? c < 0 : op == KIRI_CHAT_OP_LE ? c <= 0
         : op == KIRI_CHAT_OP_GT ? c > 0 : c >= 0;
    return 0;
}

int kiri_chat_less(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                   struct kiri_chat_value a, struct kiri_chat_value b, int *lt)
{
    return order(r, e, KIRI_CHAT_OP_LT, a, b, 0, lt);
}

int kiri_chat_contains(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                       struct kiri_chat_value c, struct kiri_chat_value item, int *found)
{
    switch (c.type) {
    case KIRI_CHAT_TYPE_STR:
        if (item.type != KIRI_CHAT_TYPE_STR)
            return kiri_chat_fail(r, e, "'in <string>' requires string as left operand, not %s",
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
        return kiri_chat_fail(r, e, "argument of type '%s' is not iterable", kiri_chat_type_name(c));
    }
}

int kiri_chat_iterate(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
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
        return kiri_chat_fail(r, e, "'%s' object is not iterable", kiri_chat_type_name(v));
    }
}

static int undefined_error(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                           struct kiri_chat_value u)
{
    if (u.u.s.n)
        return kiri_chat_fail(r, e, "'%.*s' is undefined", (int)(u.u.s.n > 60 ? 60 : u.u.s.n),
                              u.u.s.p);
    return kiri_chat_fail(r, e, "a value is undefined");
}

int kiri_chat_getattr(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                      struct kiri_chat_value obj, const char *name, size_t len,
                      struct kiri_chat_value *out)
{
    *out = kiri_chat_undef(name, len);
    if (obj.type == KIRI_CHAT_TYPE_UNDEF)
        return undefined_error(r, e, obj);
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
        return memory_limit(r);
    }
    if (kiri_chat_charge(r, n) < 0)
        return -1;
    if (kiri_buf_append(&b->text, s, n) < 0)
        return kiri_chat_fail_code(r, KIRI_E_NOMEM, "", "out of memory rendering the chat template");
    return 0;
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
 * Operators
 * ------------------------------------------------------------------------------------------- */

static int type_error(struct kiri_chat_render *r, const struct kiri_chat_expr *e, const char *op,
                      struct kiri_chat_value a, struct kiri_chat_value b)
{
    return kiri_chat_fail(r, e, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                          kiri_chat_type_name(a), kiri_chat_type_name(b));
}

static int overflow(struct kiri_chat_render *r, const struct kiri_chat_expr *e)
{
    return kiri_chat_fail(r, e, "integer overflow (integers are limited to 64 bits)");
}

/* A string or list repeated n times (Python's s * n). */
static int repeat(struct kiri_chat_render *r, struct kiri_chat_value s, int64_t n,
                  struct kiri_chat_value *out)
{
    if (n < 0)
        n = 0;
    if (s.type == KIRI_CHAT_TYPE_STR) {
        char *p;
        if (s.u.s.n && (uint64_t)n > r->max_memory / s.u.s.n)
            return memory_limit(r);
        if (kiri_chat_new_str(r, s.u.s.n * (size_t)n, &p, out) < 0)
            return -1;
        for (int64_t i = 0; i < n; i++)
            memcpy(p + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
        return 0;
    }
    size_t m = s.u.list->n;
    if (m && (uint64_t)n > r->max_memory / sizeof(struct kiri_chat_value) / m)
        return memory_limit(r);
    if (kiri_chat_new_list(r, m * (size_t)n, s.u.list->tuple, out) < 0)
        return -1;
    for (int64_t i = 0; i < n; i++)
        memcpy(out->u.list->v + (size_t)i * m, s.u.list->v, m * sizeof *s.u.list->v);
    return kiri_chat_charge(r, m * (size_t)n * sizeof *s.u.list->v);
}

static int concat2(struct kiri_chat_render *r, struct kiri_chat_value a, struct kiri_chat_value b,
                   struct kiri_chat_value *out)
{
    if (a.type == KIRI_CHAT_TYPE_STR) {
        char *p;
        if (kiri_chat_new_str(r, a.u.s.n + b.u.s.n, &p, out) < 0)
            return -1;
        memcpy(p, a.u.s.p, a.u.s.n);
        memcpy(p + a.u.s.n, b.u.s.p, b.u.s.n);
        return 0;
    }
    size_t na = a.u.list->n, nb = b.u.list->n;
    if (kiri_chat_new_list(r, na + nb, a.u.list->tuple, out) < 0)
        return -1;
    memcpy(out->u.list->v, a.u.list->v, na * sizeof *a.u.list->v);
    memcpy(out->u.list->v + na, b.u.list->v, nb * sizeof *b.u.list->v);
    return 0;
}

static int int_pow(struct kiri_chat_render *r, const struct kiri_chat_expr *e, int64_t a,
                   int64_t b, int64_t *out)
{
    int64_t acc = 1, base = a;
    while (b > 0) {
        if ((b & 1) && __builtin_mul_overflow(acc, base, &acc))
            return overflow(r, e);
        b >>= 1;
        if (b && __builtin_mul_overflow(base, base, &base))
            return overflow(r, e);
    }
    *out = acc;
    return 0;
}

static int float_op(struct kiri_chat_render *r, const struct kiri_chat_expr *e, int op, double x,
                    double y, struct kiri_chat_value *out)
{
    double z;
    if ((op == KIRI_CHAT_OP_DIV || op == KIRI_CHAT_OP_FLOORDIV || op == KIRI_CHAT_OP_MOD) && y == 0)
        return kiri_chat_fail(r, e, "division by zero");
    switch (op) {
    case KIRI_CHAT_OP_ADD: z = x + y; break;
    case KIRI_CHAT_OP_SUB: z = x - y; break;
    case KIRI_CHAT_OP_MUL: z = x * y; break;
    case KIRI_CHAT_OP_DIV: z = x / y; break;
    case KIRI_CHAT_OP_MOD:
    case KIRI_CHAT_OP_FLOORDIV: {
        /* CPython's float_divmod */
        double mod = fmod(x, y), div = (x - mod) / y;
        if (mod != 0) {
            if ((y < 0) != (mod < 0)) {
                mod += y;
                div -= 1.0;
            }
        } else {
            mod = copysign(0.0, y);
        }
        if (div != 0) {
            double f = floor(div);
            if (div - f > 0.5)
                f += 1.0;
            div = f;
        } else {
            div = copysign(0.0, x / y);
        }
        z = op == KIRI_CHAT_OP_MOD ? mod : div;
        break;
    }
    default:
        if (x == 0 && y < 0)
            return kiri_chat_fail(r, e, "0.0 cannot be raised to a negative power");
        if (x < 0 && y != floor(y))
            return kiri_chat_fail(r, e, "a negative number to a fractional power is not supported");
        z = pow(x, y);
        if (isinf(z) && isfinite(x) && isfinite(y))
            return kiri_chat_fail(r, e, "numerical result out of range");
    }
    out->type = KIRI_CHAT_TYPE_FLOAT;
    out->u.f = z;
    return 0;
}

static int binop(struct kiri_chat_render *r, const struct kiri_chat_expr *e, int op,
                 struct kiri_chat_value a, struct kiri_chat_value b, struct kiri_chat_value *out)
{
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (a.type == KIRI_CHAT_TYPE_UNDEF)
        return undefined_error(r, e, a);
    if (b.type == KIRI_CHAT_TYPE_UNDEF)
        return undefined_error(r, e, b);
    if (is_num(a) && is_num(b)) {
        if (a.type == KIRI_CHAT_TYPE_FLOAT || b.type == KIRI_CHAT_TYPE_FLOAT || op == KIRI_CHAT_OP_DIV ||
            (op == KIRI_CHAT_OP_POW && b.u.i < 0))
            return float_op(r, e, op, num(a), num(b), out);
        int64_t x = a.u.i, y = b.u.i, z = 0;
        int bad = 0;
        switch (op) {
        case KIRI_CHAT_OP_ADD: bad = __builtin_add_overflow(x, y, &z); break;
        case KIRI_CHAT_OP_SUB: bad = __builtin_sub_overflow(x, y, &z); break;
        case KIRI_CHAT_OP_MUL: bad = __builtin_mul_overflow(x, y, &z); break;
        case KIRI_CHAT_OP_FLOORDIV:
        case KIRI_CHAT_OP_MOD:
            if (y == 0)
                return kiri_chat_fail(r, e, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) {
                bad = op == KIRI_CHAT_OP_FLOORDIV;
                break;
            }
            z = op == KIRI_CHAT_OP_FLOORDIV ? x / y : x % y;
            if (op == KIRI_CHAT_OP_FLOORDIV && x % y != 0 && ((x < 0) != (y < 0)))
                z--;
            if (op == KIRI_CHAT_OP_MOD && z != 0 && ((z < 0) != (y < 0)))
                z += y;
            break;
        default:
            if (int_pow(r, e, x, y, &z) < 0)
                return -1;
        }
        if (bad)
            return overflow(r, e);
        *out = kiri_chat_int(z);
        return 0;
    }
    int seq_a = a.type == KIRI_CHAT_TYPE_STR || a.type == KIRI_CHAT_TYPE_LIST;
    int seq_b = b.type == KIRI_CHAT_TYPE_STR || b.type == KIRI_CHAT_TYPE_LIST;
    if (op == KIRI_CHAT_OP_ADD && seq_a && a.type == b.type &&
        (a.type == KIRI_CHAT_TYPE_STR || a.u.list->tuple == b.u.list->tuple))
        return concat2(r, a, b, out);
    if (op == KIRI_CHAT_OP_MUL && seq_a && (b.type == KIRI_CHAT_TYPE_INT || b.type == KIRI_CHAT_TYPE_BOOL))
        return repeat(r, a, b.u.i, out);
    if (op == KIRI_CHAT_OP_MUL && seq_b && (a.type == KIRI_CHAT_TYPE_INT || a.type == KIRI_CHAT_TYPE_BOOL))
        return repeat(r, b, a.u.i, out);
    if (op == KIRI_CHAT_OP_MOD && a.type == KIRI_CHAT_TYPE_STR)
        return kiri_chat_fail(r, e, "string formatting with '%%' is not supported");
    return type_error(r, e, sym[op], a, b);
}

/* ---------------------------------------------------------------------------------------------
 * Indexing and slicing (Python semantics; a miss gives Undefined, as jinja2's getitem does)
 * ------------------------------------------------------------------------------------------- */

/* Byte offset of code point k of s (k <= its length). */
static size_t cp_offset(const char *s, size_t n, size_t k)
{
    size_t i = 0;
    for (; i < n; i++) {
        if (((unsigned char)s[i] & 0xc0) != 0x80) {
            if (k == 0)
                return i;
            k--;
        }
    }
    return n;
}

static int getitem(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                   struct kiri_chat_value obj, struct kiri_chat_value key, struct kiri_chat_value *out)
{
    *out = key.type == KIRI_CHAT_TYPE_STR ? kiri_chat_undef(key.u.s.p, key.u.s.n)
                                          : kiri_chat_undef("item", 4);
    int int_key = key.type == KIRI_CHAT_TYPE_INT || key.type == KIRI_CHAT_TYPE_BOOL;
    switch (obj.type) {
    case KIRI_CHAT_TYPE_UNDEF: return undefined_error(r, e, obj);
    case KIRI_CHAT_TYPE_LIST:
        if (int_key) {
            int64_t n = (int64_t)obj.u.list->n, i = key.u.i < 0 ? key.u.i + n : key.u.i;
            if (i >= 0 && i < n)
                *out = obj.u.list->v[i];
        }
        return 0;
    case KIRI_CHAT_TYPE_STR:
        if (int_key) {
            int64_t n = (int64_t)kiri_chat_cp_len(obj.u.s.p, obj.u.s.n);
            int64_t i = key.u.i < 0 ? key.u.i + n : key.u.i;
            if (i >= 0 && i < n) {
                size_t off = cp_offset(obj.u.s.p, obj.u.s.n, (size_t)i);
                uint32_t cp;
                *out = kiri_chat_str(obj.u.s.p + off, kiri_utf8_decode(obj.u.s.p + off, obj.u.s.n - off, &cp));
            }
            return kiri_chat_charge(r, obj.u.s.n);
        }
        return 0;
    case KIRI_CHAT_TYPE_DICT: {
        const struct kiri_chat_value *v = kiri_chat_dict_get(obj.u.dict, key);
        if (v)
            *out = *v;
        return 0;
    }
    case KIRI_CHAT_TYPE_NS:
    case KIRI_CHAT_TYPE_LOOP:
        if (key.type == KIRI_CHAT_TYPE_STR)
            return kiri_chat_getattr(r, e, obj, key.u.s.p, key.u.s.n, out);
        return 0;
    default: return 0;
    }
}

static int slice(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                 struct kiri_chat_value obj, const struct kiri_chat_value part[3],
                 struct kiri_chat_value *out)
{
    /* jinja2 compiles slices to Python's obj[a:b:c] directly, not through its forgiving getitem,
     * so unlike an index, a bad slice is an error rather than Undefined */
    if (obj.type == KIRI_CHAT_TYPE_UNDEF)
        return undefined_error(r, e, obj);
    int is_str = obj.type == KIRI_CHAT_TYPE_STR;
    if (!is_str && obj.type != KIRI_CHAT_TYPE_LIST)
        return kiri_chat_fail(r, e, "'%s' object is not subscriptable", kiri_chat_type_name(obj));
    int64_t len = is_str ? (int64_t)kiri_chat_cp_len(obj.u.s.p, obj.u.s.n) : (int64_t)obj.u.list->n;
    int64_t v[3];
    int given[3];
    for (int k = 0; k < 3; k++) {
        given[k] = part[k].type == KIRI_CHAT_TYPE_INT || part[k].type == KIRI_CHAT_TYPE_BOOL;
        if (!given[k] && part[k].type != KIRI_CHAT_TYPE_NONE && part[k].type != KIRI_CHAT_TYPE_MISSING)
            return kiri_chat_fail(r, e, "slice indices must be integers or None");
        v[k] = given[k] ? part[k].u.i : 0;
    }
    int64_t step = given[2] ? v[2] : 1, start, stop, count;
    if (step == 0)
        return kiri_chat_fail(r, e, "slice step cannot be zero");
    /* CPython's PySlice_AdjustIndices */
    start = given[0] ? v[0] : step < 0 ? len - 1 : 0;
    stop = given[1] ? v[1] : step < 0 ? -1 : len;
    if (given[0]) {
        if (start < 0 && (start += len) < 0)
            start = step < 0 ? -1 : 0;
        else if (start >= len)
            start = step < 0 ? len - 1 : len;
    }
    if (given[1]) {
        if (stop < 0 && (stop += len) < 0)
            stop = step < 0 ? -1 : 0;
        else if (stop >= len)
            stop = step < 0 ? len - 1 : len;
    }
    if (step < 0)
        count = stop < start ? (start - stop - 1) / (-step) + 1 : 0;
    else
        count = start < stop ? (stop - start - 1) / step + 1 : 0;
    if (!is_str) {
        if (kiri_chat_new_list(r, (size_t)count, obj.u.list->tuple, out) < 0)
            return -1;
        for (int64_t i = 0; i < count; i++)
            out->u.list->v[i] = obj.u.list->v[start + i * step];
        return 0;
    }
    const char *s = obj.u.s.p;
    size_t n = obj.u.s.n;
    if (kiri_chat_charge(r, n) < 0)
        return -1;
    if (step == 1) {
        size_t a = cp_offset(s, n, (size_t)start), b = count ? cp_offset(s, n, (size_t)stop) : a;
        *out = kiri_chat_str(s + a, b - a);
        return 0;
    }
    /* offsets of every code point, then pick */
    size_t *off = kiri_chat_alloc(r, ((size_t)len + 1) * sizeof *off), k = 0, total = 0;
    if (!off)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] & 0xc0) != 0x80)
            off[k++] = i;
    off[k] = n;
    for (int64_t i = 0; i < count; i++) {
        int64_t j = start + i * step;
        total += off[j + 1] - off[j];
    }
    char *p;
    if (kiri_chat_new_str(r, total, &p, out) < 0)
        return -1;
    for (int64_t i = 0; i < count; i++) {
        int64_t j = start + i * step;
        memcpy(p, s + off[j], off[j + 1] - off[j]);
        p += off[j + 1] - off[j];
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Scopes: the root holds the render's variables; each loop iteration gets a fresh child, so a
 * {% set %} inside a loop body does not outlive the iteration (jinja2's scoping rule, which is
 * why templates carry state out of loops with namespace()).
 * ------------------------------------------------------------------------------------------- */

struct kiri_chat_var {
    const char *name; /* borrowed from the template */
    size_t n;
    struct kiri_chat_value v;
    struct kiri_chat_var *next;
};

struct kiri_chat_scope {
    struct kiri_chat_scope *parent;
    struct kiri_chat_var *vars;  /* newest first */
    struct kiri_chat_var *spare; /* entries of earlier iterations, reused */
};

static void scope_reset(struct kiri_chat_scope *sc)
{
    while (sc->vars) {
        struct kiri_chat_var *v = sc->vars;
        sc->vars = v->next;
        v->next = sc->spare;
        sc->spare = v;
    }
}

static int scope_set(struct kiri_chat_render *r, struct kiri_chat_scope *sc, const char *name,
                     size_t n, struct kiri_chat_value v)
{
    for (struct kiri_chat_var *x = sc->vars; x; x = x->next) {
        if (x->n == n && memcmp(x->name, name, n) == 0) {
            x->v = v;
            return 0;
        }
    }
    struct kiri_chat_var *x = sc->spare;
    if (x)
        sc->spare = x->next;
    else if (!(x = kiri_chat_alloc(r, sizeof *x)))
        return -1;
    x->name = name;
    x->n = n;
    x->v = v;
    x->next = sc->vars;
    sc->vars = x;
    return 0;
}

static struct kiri_chat_value lookup(struct kiri_chat_render *r, const char *name, size_t n)
{
    static const struct { const char *name; int func; } globals[] = {
        {"raise_exception", KIRI_CHAT_FUNC_RAISE_EXCEPTION},
        {"namespace", KIRI_CHAT_FUNC_NAMESPACE},
        {"range", KIRI_CHAT_FUNC_RANGE},
        {"dict", KIRI_CHAT_FUNC_DICT},
    };
    for (struct kiri_chat_scope *sc = r->scope; sc; sc = sc->parent)
        for (struct kiri_chat_var *x = sc->vars; x; x = x->next)
            if (x->n == n && memcmp(x->name, name, n) == 0)
                return x->v;
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++) {
        if (strlen(globals[i].name) == n && memcmp(globals[i].name, name, n) == 0) {
            struct kiri_chat_value f = {KIRI_CHAT_TYPE_FUNC, {0}};
            f.u.i = globals[i].func;
            return f;
        }
    }
    return kiri_chat_undef(name, n);
}

/* ---------------------------------------------------------------------------------------------
 * Expressions
 * ------------------------------------------------------------------------------------------- */

static int eval(struct kiri_chat_render *r, const struct kiri_chat_expr *e, struct kiri_chat_value *out);

static int eval_args(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                     struct kiri_chat_args *a)
{
    if (e->n_args > KIRI_CHAT_MAX_ARGS)
        return kiri_chat_fail(r, e, "too many arguments (at most %d)", KIRI_CHAT_MAX_ARGS);
    a->n = e->n_args;
    for (int i = 0; i < e->n_args; i++) {
        a->kw[i] = e->args[i].kw;
        a->kw_len[i] = e->args[i].kw_len;
        if (eval(r, e->args[i].e, &a->v[i]) < 0)
            return -1;
    }
    return 0;
}

static int eval_call(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                     struct kiri_chat_value *out)
{
    struct kiri_chat_args a;
    const struct kiri_chat_expr *callee = e->a;
    struct kiri_chat_value f;
    if (callee->kind == KIRI_CHAT_EXPR_GETATTR) {
        /* obj.method(...): methods come before dict keys, as with Python attributes */
        struct kiri_chat_value obj;
        int handled = 0;
        if (eval(r, callee->a, &obj) < 0)
            return -1;
        if (obj.type == KIRI_CHAT_TYPE_UNDEF)
            return undefined_error(r, callee, obj);
        if (eval_args(r, e, &a) < 0 ||
            kiri_chat_method(r, e, obj, callee->name, callee->name_len, &a, out, &handled) < 0)
            return -1;
        if (handled)
            return 0;
        if (kiri_chat_getattr(r, callee, obj, callee->name, callee->name_len, &f) < 0)
            return -1;
        if (f.type == KIRI_CHAT_TYPE_UNDEF)
            return kiri_chat_fail(r, e, "'%s' object has no method '%.*s'", kiri_chat_type_name(obj),
                                  (int)callee->name_len, callee->name);
    } else {
        if (eval(r, callee, &f) < 0 || eval_args(r, e, &a) < 0)
            return -1;
    }
    if (f.type == KIRI_CHAT_TYPE_UNDEF)
        return undefined_error(r, e, f);
    if (f.type != KIRI_CHAT_TYPE_FUNC)
        return kiri_chat_fail(r, e, "'%s' object is not callable", kiri_chat_type_name(f));
    return kiri_chat_call_func(r, e, (int)f.u.i, &a, out);
}

static int eval_getitem(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                        struct kiri_chat_value *out)
{
    struct kiri_chat_value obj, key;
    if (eval(r, e->a, &obj) < 0)
        return -1;
    if (e->b->kind == KIRI_CHAT_EXPR_SLICE) {
        const struct kiri_chat_expr *s = e->b, *parts[3] = {s->a, s->b, s->c};
        struct kiri_chat_value v[3];
        for (int k = 0; k < 3; k++) {
            v[k].type = KIRI_CHAT_TYPE_MISSING;
            if (parts[k] && eval(r, parts[k], &v[k]) < 0)
                return -1;
        }
        return slice(r, e, obj, v, out);
    }
    if (eval(r, e->b, &key) < 0)
        return -1;
    return getitem(r, e, obj, key, out);
}

static int eval_compare(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                        struct kiri_chat_value *out)
{
    struct kiri_chat_value left, right;
    if (eval(r, e->a, &left) < 0)
        return -1;
    for (int i = 0; i < e->n_args; i++) {
        int op = e->args[i].op, res;
        if (eval(r, e->args[i].e, &right) < 0)
            return -1;
        if (op == KIRI_CHAT_OP_EQ || op == KIRI_CHAT_OP_NE) {
            res = kiri_chat_equal(left, right, 0) == (op == KIRI_CHAT_OP_EQ);
        } else if (op == KIRI_CHAT_OP_IN || op == KIRI_CHAT_OP_NOTIN) {
            if (kiri_chat_contains(r, e, right, left, &res) < 0)
                return -1;
            res = res == (op == KIRI_CHAT_OP_IN);
        } else if (order(r, e, op, left, right, 0, &res) < 0) {
            return -1;
        }
        if (!res) {
            *out = kiri_chat_bool(0);
            return 0;
        }
        left = right;
    }
    *out = kiri_chat_bool(1);
    return 0;
}

static int eval_literal(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                        struct kiri_chat_value *out)
{
    if (e->kind == KIRI_CHAT_EXPR_DICT) {
        if (kiri_chat_new_dict(r, 0, out) < 0)
            return -1;
        for (int i = 0; i + 1 < e->n_args; i += 2) {
            struct kiri_chat_value k, v;
            if (eval(r, e->args[i].e, &k) < 0 || eval(r, e->args[i + 1].e, &v) < 0)
                return -1;
            if (k.type != KIRI_CHAT_TYPE_STR && k.type != KIRI_CHAT_TYPE_NONE && !is_num(k))
                return kiri_chat_fail(r, e->args[i].e, "unhashable dict key of type '%s'",
                                      kiri_chat_type_name(k));
            if (kiri_chat_dict_set(r, out->u.dict, k, v) < 0)
                return -1;
        }
        return 0;
    }
    if (kiri_chat_new_list(r, (size_t)e->n_args, e->kind == KIRI_CHAT_EXPR_TUPLE, out) < 0)
        return -1;
    for (int i = 0; i < e->n_args; i++)
        if (eval(r, e->args[i].e, &out->u.list->v[i]) < 0)
            return -1;
    return 0;
}

static int eval_concat(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                       struct kiri_chat_value *out)
{
    struct kiri_chat_buf b = {0};
    for (int i = 0; i < e->n_args; i++) {
        struct kiri_chat_value v;
        if (eval(r, e->args[i].e, &v) < 0 || kiri_chat_buf_value(r, &b, v, 0, 0) < 0) {
            kiri_chat_buf_free(&b);
            return -1;
        }
    }
    return kiri_chat_buf_finish(r, &b, out);
}

static int eval(struct kiri_chat_render *r, const struct kiri_chat_expr *e, struct kiri_chat_value *out)
{
    struct kiri_chat_value a, b;
    struct kiri_chat_args args;
    if (kiri_chat_step(r, 1) < 0)
        return -1;
    switch (e->kind) {
    case KIRI_CHAT_EXPR_CONST:
        out->type = KIRI_CHAT_TYPE_NONE;
        if (e->op == KIRI_CHAT_CONST_BOOL)
            *out = kiri_chat_bool((int)e->i);
        else if (e->op == KIRI_CHAT_CONST_INT)
            *out = kiri_chat_int(e->i);
        else if (e->op == KIRI_CHAT_CONST_STR)
            *out = kiri_chat_str(e->name, e->name_len);
        else if (e->op == KIRI_CHAT_CONST_FLOAT) {
            out->type = KIRI_CHAT_TYPE_FLOAT;
            out->u.f = e->f;
        }
        return 0;
    case KIRI_CHAT_EXPR_NAME:
        *out = lookup(r, e->name, e->name_len);
        return 0;
    case KIRI_CHAT_EXPR_GETATTR:
        if (eval(r, e->a, &a) < 0)
            return -1;
        return kiri_chat_getattr(r, e, a, e->name, e->name_len, out);
    case KIRI_CHAT_EXPR_GETITEM: return eval_getitem(r, e, out);
    case KIRI_CHAT_EXPR_CALL: return eval_call(r, e, out);
    case KIRI_CHAT_EXPR_FILTER:
        if (e->a) {
            if (eval(r, e->a, &a) < 0)
                return -1;
        } else {
            a = r->block_input;
        }
        if (eval_args(r, e, &args) < 0)
            return -1;
        return kiri_chat_filter(r, e, e->id, a, &args, out);
    case KIRI_CHAT_EXPR_TEST: {
        int res;
        if (eval(r, e->a, &a) < 0 || eval_args(r, e, &args) < 0 ||
            kiri_chat_test(r, e, e->id, a, &args, &res) < 0)
            return -1;
        *out = kiri_chat_bool(res);
        return 0;
    }
    case KIRI_CHAT_EXPR_NOT:
        if (eval(r, e->a, &a) < 0)
            return -1;
        *out = kiri_chat_bool(!kiri_chat_truthy(a));
        return 0;
    case KIRI_CHAT_EXPR_NEG:
    case KIRI_CHAT_EXPR_POS:
        if (eval(r, e->a, &a) < 0)
            return -1;
        if (a.type == KIRI_CHAT_TYPE_UNDEF)
            return undefined_error(r, e, a);
        if (!is_num(a))
            return kiri_chat_fail(r, e, "bad operand type for unary %c: '%s'",
                                  e->kind == KIRI_CHAT_EXPR_NEG ? '-' : '+', kiri_chat_type_name(a));
        if (a.type == KIRI_CHAT_TYPE_BOOL)
            a.type = KIRI_CHAT_TYPE_INT;
        if (e->kind == KIRI_CHAT_EXPR_NEG) {
            if (a.type == KIRI_CHAT_TYPE_FLOAT)
                a.u.f = -a.u.f;
            else if (a.u.i == INT64_MIN)
                return overflow(r, e);
            else
                a.u.i = -a.u.i;
        }
        *out = a;
        return 0;
    case KIRI_CHAT_EXPR_BINARY:
        if (eval(r, e->a, &a) < 0 || eval(r, e->b, &b) < 0)
            return -1;
        return binop(r, e, e->op, a, b, out);
    case KIRI_CHAT_EXPR_AND:
    case KIRI_CHAT_EXPR_OR:
        /* Python's and/or yield an operand, not a bool */
        if (eval(r, e->a, &a) < 0)
            return -1;
        if (kiri_chat_truthy(a) == (e->kind == KIRI_CHAT_EXPR_OR)) {
            *out = a;
            return 0;
        }
        return eval(r, e->b, out);
    case KIRI_CHAT_EXPR_COMPARE: return eval_compare(r, e, out);
    case KIRI_CHAT_EXPR_COND:
        if (eval(r, e->b, &a) < 0)
            return -1;
        if (kiri_chat_truthy(a))
            return eval(r, e->a, out);
        if (e->c)
            return eval(r, e->c, out);
        *out = kiri_chat_undef("", 0);
        return 0;
    case KIRI_CHAT_EXPR_LIST:
    case KIRI_CHAT_EXPR_TUPLE:
    case KIRI_CHAT_EXPR_DICT: return eval_literal(r, e, out);
    case KIRI_CHAT_EXPR_CONCAT: return eval_concat(r, e, out);
    default: return kiri_chat_fail(r, e, "unexpected expression");
    }
}

/* ---------------------------------------------------------------------------------------------
 * Statements
 * ------------------------------------------------------------------------------------------- */

static int exec_body(struct kiri_chat_render *r, const struct kiri_chat_stmt *s);

static int assign_one(struct kiri_chat_render *r, const struct kiri_chat_stmt *s,
                      const struct kiri_chat_target *t, struct kiri_chat_value v)
{
    if (!t->attr)
        return scope_set(r, r->scope, t->name, t->name_len, v);
    struct kiri_chat_value ns = lookup(r, t->name, t->name_len);
    if (ns.type != KIRI_CHAT_TYPE_NS) {
        struct kiri_chat_expr at = {0};
        at.pos = s->pos;
        return kiri_chat_fail(r, &at, "cannot assign attribute '%.*s' on non-namespace object '%.*s'",
                              (int)t->attr_len, t->attr, (int)t->name_len, t->name);
    }
    return kiri_chat_dict_set(r, ns.u.dict, kiri_chat_str(t->attr, t->attr_len), v);
}

static int assign(struct kiri_chat_render *r, const struct kiri_chat_stmt *s, struct kiri_chat_value v)
{
    if (s->n_targets == 1)
        return assign_one(r, s, &s->targets[0], v);
    const struct kiri_chat_value *items;
    size_t n;
    struct kiri_chat_expr at = {0};
    at.pos = s->pos;
    if (kiri_chat_iterate(r, &at, v, &items, &n) < 0)
        return -1;
    if (n != (size_t)s->n_targets)
        return kiri_chat_fail(r, &at, "cannot unpack %zu values into %d names", n, s->n_targets);
    for (size_t i = 0; i < n; i++)
        if (assign_one(r, s, &s->targets[i], items[i]) < 0)
            return -1;
    return 0;
}

static int exec_for(struct kiri_chat_render *r, const struct kiri_chat_stmt *s)
{
    struct kiri_chat_value seq, lv = {KIRI_CHAT_TYPE_LOOP, {0}};
    const struct kiri_chat_value *items;
    size_t n;
    if (eval(r, s->expr, &seq) < 0 || kiri_chat_iterate(r, s->expr, seq, &items, &n) < 0)
        return -1;
    struct kiri_chat_scope sc = {r->scope, NULL, NULL}, *saved = r->scope;
    int rc = 0, completed = 0;
    r->scope = &sc;
    if (s->cond) {
        /* `for x in xs if cond`: loop.* then count only the items kept */
        struct kiri_chat_value *kept = n ? kiri_chat_alloc(r, n * sizeof *kept) : NULL, c;
        size_t k = 0;
        if (n && !kept)
            rc = -1;
        for (size_t i = 0; i < n && rc == 0; i++) {
            scope_reset(&sc);
            if (kiri_chat_step(r, 1) < 0 || assign(r, s, items[i]) < 0 || eval(r, s->cond, &c) < 0)
                rc = -1;
            else if (kiri_chat_truthy(c))
                kept[k++] = items[i];
        }
        items = kept;
        n = k;
    }
    struct kiri_chat_loop *lp = rc == 0 ? kiri_chat_alloc(r, sizeof *lp) : NULL;
    if (!lp)
        rc = -1;
    else {
        lp->length = (int64_t)n;
        lp->items = items;
        lv.u.loop = lp;
    }
    for (size_t i = 0; i < n && rc == 0; i++) {
        scope_reset(&sc);
        lp->index0 = (int64_t)i;
        /* an iteration costs a step even when its body is empty */
        if (kiri_chat_step(r, 1) < 0 || assign(r, s, items[i]) < 0 ||
            scope_set(r, &sc, "loop", 4, lv) < 0) {
            rc = -1;
            break;
        }
        rc = exec_body(r, s->body);
        if (rc == FLOW_NORMAL)
            completed = 1;
        if (rc == FLOW_BREAK) {
            rc = 0;
            break;
        }
        if (rc == FLOW_CONTINUE)
            rc = 0;
    }
    r->scope = saved;
    /* jinja2 clears its "no iteration" flag at the end of the body, so the else block also runs
     * when every iteration left early through break or continue */
    if (rc == 0 && !completed && s->orelse)
        rc = exec_body(r, s->orelse);
    return rc;
}

static int exec_set_block(struct kiri_chat_render *r, const struct kiri_chat_stmt *s)
{
    struct kiri_chat_buf capture = {0}, *saved = r->out;
    struct kiri_chat_value v, saved_input = r->block_input;
    capture.is_output = 1;
    r->out = &capture;
    int rc = exec_body(r, s->body);
    r->out = saved;
    if (rc < 0) {
        kiri_chat_buf_free(&capture);
        return -1;
    }
    if (kiri_chat_buf_finish(r, &capture, &v) < 0)
        return -1;
    if (s->filter) {
        r->block_input = v;
        int frc = eval(r, s->filter, &v);
        r->block_input = saved_input;
        if (frc < 0)
            return -1;
    }
    return assign(r, s, v) < 0 ? -1 : rc;
}

static int exec_body(struct kiri_chat_render *r, const struct kiri_chat_stmt *s)
{
    struct kiri_chat_value v;
    int rc;
    for (; s; s = s->next) {
        if (kiri_chat_step(r, 1) < 0)
            return -1;
        switch (s->kind) {
        case KIRI_CHAT_STMT_TEXT:
            if (kiri_chat_buf_put(r, r->out, s->text, s->text_len) < 0)
                return -1;
            break;
        case KIRI_CHAT_STMT_PRINT:
            if (eval(r, s->expr, &v) < 0 || kiri_chat_buf_value(r, r->out, v, 0, 0) < 0)
                return -1;
            break;
        case KIRI_CHAT_STMT_IF:
            if (eval(r, s->expr, &v) < 0)
                return -1;
            if ((rc = exec_body(r, kiri_chat_truthy(v) ? s->body : s->orelse)) != 0)
                return rc;
            break;
        case KIRI_CHAT_STMT_FOR:
            if ((rc = exec_for(r, s)) != 0)
                return rc;
            break;
        case KIRI_CHAT_STMT_SET:
            if (eval(r, s->expr, &v) < 0 || assign(r, s, v) < 0)
                return -1;
            break;
        case KIRI_CHAT_STMT_SET_BLOCK:
            if ((rc = exec_set_block(r, s)) != 0)
                return rc;
            break;
        case KIRI_CHAT_STMT_BREAK: return FLOW_BREAK;
        case KIRI_CHAT_STMT_CONTINUE: return FLOW_CONTINUE;
        case KIRI_CHAT_STMT_BLOCK:
            if ((rc = exec_body(r, s->body)) != 0)
                return rc;
            break;
        default: return kiri_chat_fail(r, NULL, "unexpected statement");
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Public entry
 * ------------------------------------------------------------------------------------------- */

/* index < 0: the argument is not a message's. */
static int text_arg(const char *s, const char *what, int index, struct kiri_status_info *info)
{
    if (!s || kiri_chat_utf8_valid(s, strlen(s)))
        return 0;
    if (index < 0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat template: %s is not valid UTF-8", what);
    return kiri_error_set(info, KIRI_E_INVALID_ARG,
                          "chat template: the %s of message %d is not valid UTF-8", what, index);
}

static int setup(struct kiri_chat_render *r, const struct kiri_chat_message *msgs, int n_msgs,
                 const char *bos, const char *eos, int add_generation_prompt)
{
    struct kiri_chat_scope *root = r->scope;
    struct kiri_chat_value list, none = {KIRI_CHAT_TYPE_NONE, {0}};
    if (kiri_chat_new_list(r, (size_t)n_msgs, 0, &list) < 0)
        return -1;
    for (int i = 0; i < n_msgs; i++) {
        struct kiri_chat_value d;
        const char *c = msgs[i].content;
        if (kiri_chat_new_dict(r, 0, &d) < 0 ||
            kiri_chat_dict_set(r, d.u.dict, kiri_chat_str("role", 4),
                               kiri_chat_str(msgs[i].role, strlen(msgs[i].role))) < 0 ||
            kiri_chat_dict_set(r, d.u.dict, kiri_chat_str("content", 7),
                               c ? kiri_chat_str(c, strlen(c)) : none) < 0)
            return -1;
        list.u.list->v[i] = d;
    }
    if (scope_set(r, root, "messages", 8, list) < 0 ||
        scope_set(r, root, "add_generation_prompt", 21, kiri_chat_bool(add_generation_prompt)) < 0 ||
        scope_set(r, root, "tools", 5, none) < 0 || scope_set(r, root, "documents", 9, none) < 0)
        return -1;
    if (bos && scope_set(r, root, "bos_token", 9, kiri_chat_str(bos, strlen(bos))) < 0)
        return -1;
    if (eos && scope_set(r, root, "eos_token", 9, kiri_chat_str(eos, strlen(eos))) < 0)
        return -1;
    return 0;
}

int kiri_chat_template_render(const struct kiri_chat_template *t,
                              const struct kiri_chat_message *msgs, int n_msgs,
                              const char *bos_token, const char *eos_token,
                              int add_generation_prompt, const struct kiri_chat_limits *limits,
                              char **out, size_t *out_len, struct kiri_status_info *info)
{
    if (!t || !out || !out_len || n_msgs < 0 || (n_msgs > 0 && !msgs))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat template render: bad arguments");
    for (int i = 0; i < n_msgs; i++) {
        if (!msgs[i].role)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "chat template: message %d has no role", i);
        int rc = text_arg(msgs[i].role, "role", i, info);
        if (rc == 0)
            rc = text_arg(msgs[i].content, "content", i, info);
        if (rc)
            return rc;
    }
    if (text_arg(bos_token, "bos_token", -1, info) || text_arg(eos_token, "eos_token", -1, info))
        return KIRI_E_INVALID_ARG;

    struct kiri_chat_render r;
    struct kiri_chat_scope root = {NULL, NULL, NULL};
    struct kiri_chat_buf buf = {0};
    memset(&r, 0, sizeof r);
    r.t = t;
    r.info = info;
    r.max_output = limits && limits->max_output ? limits->max_output : KIRI_CHAT_DEFAULT_MAX_OUTPUT;
    r.max_memory = limits && limits->max_memory ? limits->max_memory : KIRI_CHAT_DEFAULT_MAX_MEMORY;
    r.max_steps = limits && limits->max_steps ? limits->max_steps : KIRI_CHAT_DEFAULT_MAX_STEPS;
    r.arena.cap = r.max_memory;
    buf.is_output = 1;
    r.out = &buf;
    r.scope = &root;
    int rc = setup(&r, msgs, n_msgs, bos_token, eos_token, add_generation_prompt);
    if (rc == 0)
        rc = exec_body(&r, t->body);
    size_t len = 0;
    char *text = rc == 0 ? kiri_buf_take(&buf.text, &len) : NULL;
    if (rc == 0 && !text)
        rc = kiri_chat_fail_code(&r, KIRI_E_NOMEM, "", "out of memory rendering the chat template");
    kiri_chat_arena_free(&r.arena);
    if (rc < 0) {
        kiri_chat_buf_free(&buf);
        return r.code ? r.code : KIRI_E_UNSUPPORTED;
    }
    *out = text;
    *out_len = len;
    return KIRI_OK;
}
