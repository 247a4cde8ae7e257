/* Chat templates: the evaluator (see chat_template_eval.h). Expressions and statements run over
 * the values of chat_template_value.h; the built-ins are called through their tables.
 */
#include "chat_template_eval.h"

#include <math.h>
#include <string.h>

#include "chat_template_builtins.h"
#include "chat_template_text.h"
#include "utf8.h"

enum { FLOW_NORMAL = 0, FLOW_BREAK = 1, FLOW_CONTINUE = 2 };

struct kiri_chat_scope;

/* The state of one render beyond its resources. */
struct eval {
    struct kiri_chat_render *r;         /* the arena, the limits and the first error */
    struct kiri_chat_buf *out;          /* where text goes now (a set block redirects it) */
    struct kiri_chat_scope *scope;      /* innermost variable scope */
    struct kiri_chat_value block_input; /* the body text a {% set %} block's filters receive */
    struct kiri_chat_scope *root;       /* the template's top level, where macros live */
    int macro_depth;                    /* macro calls in progress */
};

/* Nested macro calls (recursion included) allowed at once; each costs C stack. */
#define MAX_MACRO_DEPTH 32

/* ---------------------------------------------------------------------------------------------
 * Operators
 * ------------------------------------------------------------------------------------------- */

static int type_error(struct kiri_chat_render *r, int64_t at, const char *op,
                      struct kiri_chat_value a, struct kiri_chat_value b)
{
    return kiri_chat_fail(r, at, "unsupported operand type(s) for %s: '%s' and '%s'", op,
                          kiri_chat_type_name(a), kiri_chat_type_name(b));
}

static int overflow(struct kiri_chat_render *r, int64_t at)
{
    return kiri_chat_fail(r, at, "integer overflow (integers are limited to 64 bits)");
}

/* Python's -a (neg) or +a. */
static int unary(struct kiri_chat_render *r, int64_t at, int neg, struct kiri_chat_value a,
                 struct kiri_chat_value *out)
{
    if (a.type == KIRI_CHAT_TYPE_UNDEF)
        return kiri_chat_undefined_error(r, at, a);
    if (!kiri_chat_is_number(a))
        return kiri_chat_fail(r, at, "bad operand type for unary %c: '%s'", neg ? '-' : '+',
                              kiri_chat_type_name(a));
    if (a.type == KIRI_CHAT_TYPE_BOOL)
        a.type = KIRI_CHAT_TYPE_INT;
    if (neg) {
        if (a.type == KIRI_CHAT_TYPE_FLOAT)
            a.u.f = -a.u.f;
        else if (a.u.i == INT64_MIN)
            return overflow(r, at);
        else
            a.u.i = -a.u.i;
    }
    *out = a;
    return 0;
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
            return kiri_chat_memory_limit(r);
        if (kiri_chat_new_str(r, s.u.s.n * (size_t)n, &p, out) < 0)
            return -1;
        for (int64_t i = 0; i < n; i++)
            memcpy(p + (size_t)i * s.u.s.n, s.u.s.p, s.u.s.n);
        return 0;
    }
    size_t m = s.u.list->n;
    if (m && (uint64_t)n > r->max_memory / sizeof(struct kiri_chat_value) / m)
        return kiri_chat_memory_limit(r);
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

static int int_pow(struct kiri_chat_render *r, int64_t at, int64_t a,
                   int64_t b, int64_t *out)
{
    int64_t acc = 1, base = a;
    while (b > 0) {
        if ((b & 1) && __builtin_mul_overflow(acc, base, &acc))
            return overflow(r, at);
        b >>= 1;
        if (b && __builtin_mul_overflow(base, base, &base))
            return overflow(r, at);
    }
    *out = acc;
    return 0;
}

static int float_op(struct kiri_chat_render *r, int64_t at, int op, double x,
                    double y, struct kiri_chat_value *out)
{
    double z;
    if ((op == KIRI_CHAT_OP_DIV || op == KIRI_CHAT_OP_FLOORDIV || op == KIRI_CHAT_OP_MOD) && y == 0)
        return kiri_chat_fail(r, at, "division by zero");
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
            return kiri_chat_fail(r, at, "0.0 cannot be raised to a negative power");
        if (x < 0 && y != floor(y))
            return kiri_chat_fail(r, at, "a negative number to a fractional power is not supported");
        z = pow(x, y);
        if (isinf(z) && isfinite(x) && isfinite(y))
            return kiri_chat_fail(r, at, "numerical result out of range");
    }
    out->type = KIRI_CHAT_TYPE_FLOAT;
    out->u.f = z;
    return 0;
}

static int binop(struct kiri_chat_render *r, int64_t at, int op,
                 struct kiri_chat_value a, struct kiri_chat_value b, struct kiri_chat_value *out)
{
    static const char *const sym[] = {"+", "-", "*", "/", "//", "%", "**"};
    if (a.type == KIRI_CHAT_TYPE_UNDEF)
        return kiri_chat_undefined_error(r, at, a);
    if (b.type == KIRI_CHAT_TYPE_UNDEF)
        return kiri_chat_undefined_error(r, at, b);
    if (kiri_chat_is_number(a) && kiri_chat_is_number(b)) {
        if (a.type == KIRI_CHAT_TYPE_FLOAT || b.type == KIRI_CHAT_TYPE_FLOAT || op == KIRI_CHAT_OP_DIV ||
            (op == KIRI_CHAT_OP_POW && b.u.i < 0))
            return float_op(r, at, op, kiri_chat_number(a), kiri_chat_number(b), out);
        int64_t x = a.u.i, y = b.u.i, z = 0;
        int bad = 0;
        switch (op) {
        case KIRI_CHAT_OP_ADD: bad = __builtin_add_overflow(x, y, &z); break;
        case KIRI_CHAT_OP_SUB: bad = __builtin_sub_overflow(x, y, &z); break;
        case KIRI_CHAT_OP_MUL: bad = __builtin_mul_overflow(x, y, &z); break;
        case KIRI_CHAT_OP_FLOORDIV:
        case KIRI_CHAT_OP_MOD:
            if (y == 0)
                return kiri_chat_fail(r, at, "integer division or modulo by zero");
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
            if (int_pow(r, at, x, y, &z) < 0)
                return -1;
        }
        if (bad)
            return overflow(r, at);
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
        return kiri_chat_fail(r, at, "string formatting with '%%' is not supported");
    return type_error(r, at, sym[op], a, b);
}

/* ---------------------------------------------------------------------------------------------
 * Indexing and slicing (Python semantics; a miss gives Undefined, as jinja2's getitem does)
 * ------------------------------------------------------------------------------------------- */

static int getitem(struct kiri_chat_render *r, int64_t at,
                   struct kiri_chat_value obj, struct kiri_chat_value key, struct kiri_chat_value *out)
{
    *out = key.type == KIRI_CHAT_TYPE_STR ? kiri_chat_undef(key.u.s.p, key.u.s.n)
                                          : kiri_chat_undef("item", 4);
    int int_key = key.type == KIRI_CHAT_TYPE_INT || key.type == KIRI_CHAT_TYPE_BOOL;
    switch (obj.type) {
    case KIRI_CHAT_TYPE_UNDEF: return kiri_chat_undefined_error(r, at, obj);
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
                size_t off = kiri_chat_cp_offset(obj.u.s.p, obj.u.s.n, (size_t)i);
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
            return kiri_chat_getattr(r, at, obj, key.u.s.p, key.u.s.n, out);
        return 0;
    default: return 0;
    }
}

static int slice(struct kiri_chat_render *r, int64_t at,
                 struct kiri_chat_value obj, const struct kiri_chat_value part[3],
                 struct kiri_chat_value *out)
{
    /* jinja2 compiles slices to Python's obj[a:b:c] directly, not through its forgiving getitem,
     * so unlike an index, a bad slice is an error rather than Undefined */
    if (obj.type == KIRI_CHAT_TYPE_UNDEF)
        return kiri_chat_undefined_error(r, at, obj);
    int is_str = obj.type == KIRI_CHAT_TYPE_STR;
    if (!is_str && obj.type != KIRI_CHAT_TYPE_LIST)
        return kiri_chat_fail(r, at, "'%s' object is not subscriptable", kiri_chat_type_name(obj));
    int64_t len = is_str ? (int64_t)kiri_chat_cp_len(obj.u.s.p, obj.u.s.n) : (int64_t)obj.u.list->n;
    int64_t v[3];
    int given[3];
    for (int k = 0; k < 3; k++) {
        given[k] = part[k].type == KIRI_CHAT_TYPE_INT || part[k].type == KIRI_CHAT_TYPE_BOOL;
        if (!given[k] && part[k].type != KIRI_CHAT_TYPE_NONE && part[k].type != KIRI_CHAT_TYPE_MISSING)
            return kiri_chat_fail(r, at, "slice indices must be integers or None");
        v[k] = given[k] ? part[k].u.i : 0;
    }
    int64_t step = given[2] ? v[2] : 1, start, stop, count;
    if (step == 0)
        return kiri_chat_fail(r, at, "slice step cannot be zero");
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
        size_t a = kiri_chat_cp_offset(s, n, (size_t)start), b = count ? kiri_chat_cp_offset(s, n, (size_t)stop) : a;
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

static struct kiri_chat_value lookup(struct eval *ev, const char *name, size_t n)
{
    for (struct kiri_chat_scope *sc = ev->scope; sc; sc = sc->parent)
        for (struct kiri_chat_var *x = sc->vars; x; x = x->next)
            if (x->n == n && memcmp(x->name, name, n) == 0)
                return x->v;
    int id = kiri_chat_global_find(name, n);
    if (id >= 0) {
        struct kiri_chat_value f = {KIRI_CHAT_TYPE_FUNC, {0}};
        f.u.i = id;
        return f;
    }
    return kiri_chat_undef(name, n);
}

/* ---------------------------------------------------------------------------------------------
 * Expressions
 * ------------------------------------------------------------------------------------------- */

static int eval(struct eval *ev, const struct kiri_chat_expr *e, struct kiri_chat_value *out);
static int exec_body(struct eval *ev, const struct kiri_chat_stmt *s);

/* Calls macro m with arguments a: a scope of its own under the top level holds the parameters
 * (given, else the default evaluated there, else undefined), and the text its body writes is the
 * result, as jinja2 does. */
static int call_macro(struct eval *ev, int64_t at, const struct kiri_chat_stmt *m,
                      const struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (ev->macro_depth >= MAX_MACRO_DEPTH)
        return kiri_chat_fail(ev->r, at, "macro calls nested deeper than %d", MAX_MACRO_DEPTH);
    struct kiri_chat_value given[KIRI_CHAT_MAX_PARAMS];
    int have[KIRI_CHAT_MAX_PARAMS] = {0}, n_pos = 0;
    for (int i = 0; i < a->n; i++) {
        int j = -1;
        if (a->kw[i]) {
            for (int k = 0; k < m->n_targets && j < 0; k++)
                if (m->targets[k].name_len == a->kw_len[i] &&
                    memcmp(m->targets[k].name, a->kw[i], a->kw_len[i]) == 0)
                    j = k;
            if (j < 0)
                return kiri_chat_fail(ev->r, at, "macro '%.*s' takes no keyword argument '%.*s'",
                                      (int)m->text_len, m->text, (int)a->kw_len[i], a->kw[i]);
        } else {
            if (n_pos >= m->n_targets)
                return kiri_chat_fail(ev->r, at, "macro '%.*s' takes not more than %d argument(s)",
                                      (int)m->text_len, m->text, m->n_targets);
            j = n_pos++;
        }
        if (have[j])
            return kiri_chat_fail(ev->r, at, "macro '%.*s' got multiple values for argument '%.*s'",
                                  (int)m->text_len, m->text, (int)m->targets[j].name_len,
                                  m->targets[j].name);
        have[j] = 1;
        given[j] = a->v[i];
    }
    struct kiri_chat_scope sc = {ev->root, NULL, NULL}, *saved_scope = ev->scope;
    struct kiri_chat_buf capture = {0}, *saved_out = ev->out;
    capture.is_output = 1;
    ev->scope = &sc;
    int rc = 0;
    for (int j = 0; j < m->n_targets && rc == 0; j++) {
        const struct kiri_chat_target *p = &m->targets[j];
        struct kiri_chat_value v = have[j] ? given[j] : kiri_chat_undef(p->name, p->name_len);
        if (!have[j] && m->defaults[j])
            rc = eval(ev, m->defaults[j], &v);
        if (rc == 0)
            rc = scope_set(ev->r, &sc, p->name, p->name_len, v);
    }
    if (rc == 0) {
        ev->out = &capture;
        ev->macro_depth++;
        rc = exec_body(ev, m->body);
        ev->macro_depth--;
        ev->out = saved_out;
    }
    ev->scope = saved_scope;
    if (rc < 0) {
        kiri_chat_buf_free(&capture);
        return -1;
    }
    return kiri_chat_buf_finish(ev->r, &capture, out);
}

static int eval_args(struct eval *ev, const struct kiri_chat_expr *e,
                     struct kiri_chat_args *a)
{
    if (e->n_args > KIRI_CHAT_MAX_ARGS)
        return kiri_chat_fail(ev->r, e->pos, "too many arguments (at most %d)", KIRI_CHAT_MAX_ARGS);
    a->n = e->n_args;
    for (int i = 0; i < e->n_args; i++) {
        a->kw[i] = e->args[i].kw;
        a->kw_len[i] = e->args[i].kw_len;
        if (eval(ev, e->args[i].e, &a->v[i]) < 0)
            return -1;
    }
    return 0;
}

static int eval_call(struct eval *ev, const struct kiri_chat_expr *e,
                     struct kiri_chat_value *out)
{
    struct kiri_chat_args a;
    const struct kiri_chat_expr *callee = e->a;
    struct kiri_chat_value f;
    if (callee->kind == KIRI_CHAT_EXPR_GETATTR) {
        /* obj.method(...): methods come before dict keys, as with Python attributes */
        struct kiri_chat_value obj;
        int handled = 0;
        if (eval(ev, callee->a, &obj) < 0)
            return -1;
        if (obj.type == KIRI_CHAT_TYPE_UNDEF)
            return kiri_chat_undefined_error(ev->r, callee->pos, obj);
        if (eval_args(ev, e, &a) < 0 ||
            kiri_chat_method_call(ev->r, e->pos, obj, callee->name, callee->name_len, &a, out, &handled) < 0)
            return -1;
        if (handled)
            return 0;
        if (kiri_chat_getattr(ev->r, callee->pos, obj, callee->name, callee->name_len, &f) < 0)
            return -1;
        if (f.type == KIRI_CHAT_TYPE_UNDEF)
            return kiri_chat_fail(ev->r, e->pos, "'%s' object has no method '%.*s'", kiri_chat_type_name(obj),
                                  (int)callee->name_len, callee->name);
    } else {
        if (eval(ev, callee, &f) < 0 || eval_args(ev, e, &a) < 0)
            return -1;
    }
    if (f.type == KIRI_CHAT_TYPE_UNDEF)
        return kiri_chat_undefined_error(ev->r, e->pos, f);
    if (f.type == KIRI_CHAT_TYPE_MACRO)
        return call_macro(ev, e->pos, f.u.macro, &a, out);
    if (f.type != KIRI_CHAT_TYPE_FUNC)
        return kiri_chat_fail(ev->r, e->pos, "'%s' object is not callable", kiri_chat_type_name(f));
    return kiri_chat_global_call(ev->r, e->pos, (int)f.u.i, &a, out);
}

static int eval_getitem(struct eval *ev, const struct kiri_chat_expr *e,
                        struct kiri_chat_value *out)
{
    struct kiri_chat_value obj, key;
    if (eval(ev, e->a, &obj) < 0)
        return -1;
    if (e->b->kind == KIRI_CHAT_EXPR_SLICE) {
        const struct kiri_chat_expr *s = e->b, *parts[3] = {s->a, s->b, s->c};
        struct kiri_chat_value v[3];
        for (int k = 0; k < 3; k++) {
            v[k].type = KIRI_CHAT_TYPE_MISSING;
            if (parts[k] && eval(ev, parts[k], &v[k]) < 0)
                return -1;
        }
        return slice(ev->r, e->pos, obj, v, out);
    }
    if (eval(ev, e->b, &key) < 0)
        return -1;
    return getitem(ev->r, e->pos, obj, key, out);
}

/* The value module's ordering for a comparison operator of the tree (LT, LE, GT or GE). */
static enum kiri_chat_order order_of(int op)
{
    switch (op) {
    case KIRI_CHAT_OP_LT: return KIRI_CHAT_LT;
    case KIRI_CHAT_OP_LE: return KIRI_CHAT_LE;
    case KIRI_CHAT_OP_GT: return KIRI_CHAT_GT;
    default: return KIRI_CHAT_GE;
    }
}

static int eval_compare(struct eval *ev, const struct kiri_chat_expr *e,
                        struct kiri_chat_value *out)
{
    struct kiri_chat_value left, right;
    if (eval(ev, e->a, &left) < 0)
        return -1;
    for (int i = 0; i < e->n_args; i++) {
        int op = e->args[i].op, res;
        if (eval(ev, e->args[i].e, &right) < 0)
            return -1;
        if (op == KIRI_CHAT_OP_EQ || op == KIRI_CHAT_OP_NE) {
            res = kiri_chat_equal(left, right, 0) == (op == KIRI_CHAT_OP_EQ);
        } else if (op == KIRI_CHAT_OP_IN || op == KIRI_CHAT_OP_NOTIN) {
            if (kiri_chat_contains(ev->r, e->pos, right, left, &res) < 0)
                return -1;
            res = res == (op == KIRI_CHAT_OP_IN);
        } else if (kiri_chat_compare(ev->r, e->pos, order_of(op), left, right, &res) < 0) {
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

static int eval_literal(struct eval *ev, const struct kiri_chat_expr *e,
                        struct kiri_chat_value *out)
{
    if (e->kind == KIRI_CHAT_EXPR_DICT) {
        if (kiri_chat_new_dict(ev->r, 0, out) < 0)
            return -1;
        for (int i = 0; i + 1 < e->n_args; i += 2) {
            struct kiri_chat_value k, v;
            if (eval(ev, e->args[i].e, &k) < 0 || eval(ev, e->args[i + 1].e, &v) < 0)
                return -1;
            if (k.type != KIRI_CHAT_TYPE_STR && k.type != KIRI_CHAT_TYPE_NONE && !kiri_chat_is_number(k))
                return kiri_chat_fail(ev->r, e->args[i].e->pos, "unhashable dict key of type '%s'",
                                      kiri_chat_type_name(k));
            if (kiri_chat_dict_set(ev->r, out->u.dict, k, v) < 0)
                return -1;
        }
        return 0;
    }
    if (kiri_chat_new_list(ev->r, (size_t)e->n_args, e->kind == KIRI_CHAT_EXPR_TUPLE, out) < 0)
        return -1;
    for (int i = 0; i < e->n_args; i++)
        if (eval(ev, e->args[i].e, &out->u.list->v[i]) < 0)
            return -1;
    return 0;
}

static int eval_concat(struct eval *ev, const struct kiri_chat_expr *e,
                       struct kiri_chat_value *out)
{
    struct kiri_chat_buf b = {0};
    for (int i = 0; i < e->n_args; i++) {
        struct kiri_chat_value v;
        if (eval(ev, e->args[i].e, &v) < 0 || kiri_chat_buf_value(ev->r, &b, v, 0, 0) < 0) {
            kiri_chat_buf_free(&b);
            return -1;
        }
    }
    return kiri_chat_buf_finish(ev->r, &b, out);
}

static struct kiri_chat_value constant(const struct kiri_chat_expr *e)
{
    switch (e->op) {
    case KIRI_CHAT_CONST_BOOL: return kiri_chat_bool((int)e->i);
    case KIRI_CHAT_CONST_INT: return kiri_chat_int(e->i);
    case KIRI_CHAT_CONST_FLOAT: return kiri_chat_float(e->f);
    case KIRI_CHAT_CONST_STR: return kiri_chat_str(e->name, e->name_len);
    default: {
        struct kiri_chat_value none = {KIRI_CHAT_TYPE_NONE, {0}};
        return none;
    }
    }
}

/* a|filter(args); a NULL input is the text of the {% set %} block being filtered. */
static int eval_filter(struct eval *ev, const struct kiri_chat_expr *e, struct kiri_chat_value *out)
{
    struct kiri_chat_value in = ev->block_input;
    struct kiri_chat_args args;
    if ((e->a && eval(ev, e->a, &in) < 0) || eval_args(ev, e, &args) < 0)
        return -1;
    return kiri_chat_filter_apply(ev->r, e->pos, e->id, in, &args, out);
}

static int eval_test(struct eval *ev, const struct kiri_chat_expr *e, struct kiri_chat_value *out)
{
    struct kiri_chat_value v;
    struct kiri_chat_args args;
    int res;
    if (eval(ev, e->a, &v) < 0 || eval_args(ev, e, &args) < 0 ||
        kiri_chat_test_apply(ev->r, e->pos, e->id, v, &args, &res) < 0)
        return -1;
    *out = kiri_chat_bool(res);
    return 0;
}

static int eval(struct eval *ev, const struct kiri_chat_expr *e, struct kiri_chat_value *out)
{
    struct kiri_chat_value a, b;
    if (kiri_chat_step(ev->r, 1) < 0)
        return -1;
    switch (e->kind) {
    case KIRI_CHAT_EXPR_CONST:
        *out = constant(e);
        return 0;
    case KIRI_CHAT_EXPR_NAME:
        *out = lookup(ev, e->name, e->name_len);
        return 0;
    case KIRI_CHAT_EXPR_GETATTR:
        if (eval(ev, e->a, &a) < 0)
            return -1;
        return kiri_chat_getattr(ev->r, e->pos, a, e->name, e->name_len, out);
    case KIRI_CHAT_EXPR_GETITEM: return eval_getitem(ev, e, out);
    case KIRI_CHAT_EXPR_CALL: return eval_call(ev, e, out);
    case KIRI_CHAT_EXPR_FILTER: return eval_filter(ev, e, out);
    case KIRI_CHAT_EXPR_TEST: return eval_test(ev, e, out);
    case KIRI_CHAT_EXPR_NOT:
        if (eval(ev, e->a, &a) < 0)
            return -1;
        *out = kiri_chat_bool(!kiri_chat_truthy(a));
        return 0;
    case KIRI_CHAT_EXPR_NEG:
    case KIRI_CHAT_EXPR_POS:
        if (eval(ev, e->a, &a) < 0)
            return -1;
        return unary(ev->r, e->pos, e->kind == KIRI_CHAT_EXPR_NEG, a, out);
    case KIRI_CHAT_EXPR_BINARY:
        if (eval(ev, e->a, &a) < 0 || eval(ev, e->b, &b) < 0)
            return -1;
        return binop(ev->r, e->pos, e->op, a, b, out);
    case KIRI_CHAT_EXPR_AND:
    case KIRI_CHAT_EXPR_OR:
        /* Python's and/or yield an operand, not a bool */
        if (eval(ev, e->a, &a) < 0)
            return -1;
        if (kiri_chat_truthy(a) == (e->kind == KIRI_CHAT_EXPR_OR)) {
            *out = a;
            return 0;
        }
        return eval(ev, e->b, out);
    case KIRI_CHAT_EXPR_COMPARE: return eval_compare(ev, e, out);
    case KIRI_CHAT_EXPR_COND:
        if (eval(ev, e->b, &a) < 0)
            return -1;
        if (kiri_chat_truthy(a))
            return eval(ev, e->a, out);
        if (e->c)
            return eval(ev, e->c, out);
        *out = kiri_chat_undef("", 0);
        return 0;
    case KIRI_CHAT_EXPR_LIST:
    case KIRI_CHAT_EXPR_TUPLE:
    case KIRI_CHAT_EXPR_DICT: return eval_literal(ev, e, out);
    case KIRI_CHAT_EXPR_CONCAT: return eval_concat(ev, e, out);
    default: return kiri_chat_fail(ev->r, e->pos, "unexpected expression");
    }
}

/* ---------------------------------------------------------------------------------------------
 * Statements
 * ------------------------------------------------------------------------------------------- */

static int assign_one(struct eval *ev, const struct kiri_chat_stmt *s,
                      const struct kiri_chat_target *t, struct kiri_chat_value v)
{
    if (!t->attr)
        return scope_set(ev->r, ev->scope, t->name, t->name_len, v);
    struct kiri_chat_value ns = lookup(ev, t->name, t->name_len);
    if (ns.type != KIRI_CHAT_TYPE_NS) {
        return kiri_chat_fail(ev->r, s->pos, "cannot assign attribute '%.*s' on non-namespace object '%.*s'",
                              (int)t->attr_len, t->attr, (int)t->name_len, t->name);
    }
    return kiri_chat_dict_set(ev->r, ns.u.dict, kiri_chat_str(t->attr, t->attr_len), v);
}

static int assign(struct eval *ev, const struct kiri_chat_stmt *s, struct kiri_chat_value v)
{
    if (s->n_targets == 1)
        return assign_one(ev, s, &s->targets[0], v);
    const struct kiri_chat_value *items;
    size_t n;
    if (kiri_chat_iterate(ev->r, s->pos, v, &items, &n) < 0)
        return -1;
    if (n != (size_t)s->n_targets)
        return kiri_chat_fail(ev->r, s->pos, "cannot unpack %zu values into %d names", n, s->n_targets);
    for (size_t i = 0; i < n; i++)
        if (assign_one(ev, s, &s->targets[i], items[i]) < 0)
            return -1;
    return 0;
}

static int exec_for(struct eval *ev, const struct kiri_chat_stmt *s)
{
    struct kiri_chat_value seq, lv = {KIRI_CHAT_TYPE_LOOP, {0}};
    const struct kiri_chat_value *items;
    size_t n;
    if (eval(ev, s->expr, &seq) < 0 || kiri_chat_iterate(ev->r, s->expr->pos, seq, &items, &n) < 0)
        return -1;
    struct kiri_chat_scope sc = {ev->scope, NULL, NULL}, *saved = ev->scope;
    int rc = 0, completed = 0;
    ev->scope = &sc;
    if (s->cond) {
        /* `for x in xs if cond`: loop.* then count only the items kept */
        struct kiri_chat_value *kept = n ? kiri_chat_alloc(ev->r, n * sizeof *kept) : NULL, c;
        size_t k = 0;
        if (n && !kept)
            rc = -1;
        for (size_t i = 0; i < n && rc == 0; i++) {
            scope_reset(&sc);
            if (kiri_chat_step(ev->r, 1) < 0 || assign(ev, s, items[i]) < 0 || eval(ev, s->cond, &c) < 0)
                rc = -1;
            else if (kiri_chat_truthy(c))
                kept[k++] = items[i];
        }
        items = kept;
        n = k;
    }
    struct kiri_chat_loop *lp = rc == 0 ? kiri_chat_alloc(ev->r, sizeof *lp) : NULL;
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
        if (kiri_chat_step(ev->r, 1) < 0 || assign(ev, s, items[i]) < 0 ||
            scope_set(ev->r, &sc, "loop", 4, lv) < 0) {
            rc = -1;
            break;
        }
        rc = exec_body(ev, s->body);
        if (rc == FLOW_NORMAL)
            completed = 1;
        if (rc == FLOW_BREAK) {
            rc = 0;
            break;
        }
        if (rc == FLOW_CONTINUE)
            rc = 0;
    }
    ev->scope = saved;
    /* jinja2 clears its "no iteration" flag at the end of the body, so the else block also runs
     * when every iteration left early through break or continue */
    if (rc == 0 && !completed && s->orelse)
        rc = exec_body(ev, s->orelse);
    return rc;
}

static int exec_set_block(struct eval *ev, const struct kiri_chat_stmt *s)
{
    struct kiri_chat_buf capture = {0}, *saved = ev->out;
    struct kiri_chat_value v, saved_input = ev->block_input;
    capture.is_output = 1;
    ev->out = &capture;
    int rc = exec_body(ev, s->body);
    ev->out = saved;
    if (rc < 0) {
        kiri_chat_buf_free(&capture);
        return -1;
    }
    if (kiri_chat_buf_finish(ev->r, &capture, &v) < 0)
        return -1;
    if (s->filter) {
        ev->block_input = v;
        int frc = eval(ev, s->filter, &v);
        ev->block_input = saved_input;
        if (frc < 0)
            return -1;
    }
    return assign(ev, s, v) < 0 ? -1 : rc;
}

static int exec_body(struct eval *ev, const struct kiri_chat_stmt *s)
{
    struct kiri_chat_value v;
    int rc;
    for (; s; s = s->next) {
        if (kiri_chat_step(ev->r, 1) < 0)
            return -1;
        switch (s->kind) {
        case KIRI_CHAT_STMT_TEXT:
            if (kiri_chat_buf_put(ev->r, ev->out, s->text, s->text_len) < 0)
                return -1;
            break;
        case KIRI_CHAT_STMT_PRINT:
            if (eval(ev, s->expr, &v) < 0 || kiri_chat_buf_value(ev->r, ev->out, v, 0, 0) < 0)
                return -1;
            break;
        case KIRI_CHAT_STMT_IF:
            if (eval(ev, s->expr, &v) < 0)
                return -1;
            if ((rc = exec_body(ev, kiri_chat_truthy(v) ? s->body : s->orelse)) != 0)
                return rc;
            break;
        case KIRI_CHAT_STMT_FOR:
            if ((rc = exec_for(ev, s)) != 0)
                return rc;
            break;
        case KIRI_CHAT_STMT_SET:
            if (eval(ev, s->expr, &v) < 0 || assign(ev, s, v) < 0)
                return -1;
            break;
        case KIRI_CHAT_STMT_SET_BLOCK:
            if ((rc = exec_set_block(ev, s)) != 0)
                return rc;
            break;
        case KIRI_CHAT_STMT_BREAK: return FLOW_BREAK;
        case KIRI_CHAT_STMT_CONTINUE: return FLOW_CONTINUE;
        case KIRI_CHAT_STMT_BLOCK:
            if ((rc = exec_body(ev, s->body)) != 0)
                return rc;
            break;
        case KIRI_CHAT_STMT_MACRO:
            v.type = KIRI_CHAT_TYPE_MACRO;
            v.u.macro = s;
            if (scope_set(ev->r, ev->scope, s->text, s->text_len, v) < 0)
                return -1;
            break;
        default: return kiri_chat_fail(ev->r, KIRI_CHAT_NOWHERE, "unexpected statement");
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Entry
 * ------------------------------------------------------------------------------------------- */

int kiri_chat_eval_run(struct kiri_chat_render *r, const struct kiri_chat_template *t,
                       const struct kiri_chat_binding *vars, size_t n_vars,
                       struct kiri_chat_buf *out)
{
    struct kiri_chat_scope root = {NULL, NULL, NULL};
    struct eval ev;
    memset(&ev, 0, sizeof ev);
    ev.r = r;
    ev.out = out;
    ev.scope = &root;
    ev.root = &root;
    for (size_t i = 0; i < n_vars; i++)
        if (scope_set(r, &root, vars[i].name, strlen(vars[i].name), vars[i].value) < 0)
            return -1;
    return exec_body(&ev, t->body) < 0 ? -1 : 0;
}
