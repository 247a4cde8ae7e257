/* Chat templates: the parser. It turns the lexer's tokens (chat_template_lex.c) into the tree
 * of chat_template_parse.h, following jinja2's grammar and operator precedence, and refuses what
 * kiri does not implement with a message naming the line and column. It owns the normalisation
 * of newlines the positions refer to.
 */
#include "chat_template_parse.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "chat_template_text.h"
#include "error.h"
#include "kiri.h"

/* ---------------------------------------------------------------------------------------------
 * Token stream (chat_template_lex.c makes the tokens)
 * ------------------------------------------------------------------------------------------- */

#define QUEUE 4

struct parser {
    struct kiri_chat_template *t;
    struct kiri_chat_lexer lx;
    struct kiri_chat_token q[QUEUE]; /* lookahead ring: q[(head + k) % QUEUE] is the k-th ahead */
    int head, count;
    int depth;      /* recursion depth of the parser itself */
    int loop_depth; /* for loops around the statement being parsed (for break/continue) */
    int block_depth; /* block tags around the statement being parsed (macros go at the top) */
    int failed;
    int code; /* the status of the first error */
    const struct kiri_chat_names *names;
    struct kiri_status_info *info;
};

/* Records the first error (later ones are consequences) and returns NULL for the caller. */
static void *fail(struct parser *p, size_t pos, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void *fail(struct parser *p, size_t pos, const char *fmt, ...)
{
    if (p->failed)
        return NULL;
    p->failed = 1;
    p->code = KIRI_E_UNSUPPORTED;
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    kiri_chat_error_at(p->info, KIRI_E_UNSUPPORTED, p->lx.src, pos, msg);
    return NULL;
}

static void *nomem(struct parser *p)
{
    if (!p->failed) {
        p->failed = 1;
        p->code = p->t->arena.hit_cap ? KIRI_E_UNSUPPORTED : KIRI_E_NOMEM;
        if (p->t->arena.hit_cap)
            kiri_error_set(p->info, KIRI_E_UNSUPPORTED, "chat template is too complex to parse");
        else
            kiri_error_set(p->info, KIRI_E_NOMEM, "out of memory parsing the chat template");
    }
    return NULL;
}

static void *alloc(struct parser *p, size_t n)
{
    void *m = kiri_chat_arena_alloc(&p->t->arena, n);
    return m ? m : nomem(p);
}

/* The k-th token ahead (k < QUEUE). After an error, an endless supply of EOF tokens. */
static const struct kiri_chat_token *peek(struct parser *p, int k)
{
    while (p->count <= k) {
        kiri_chat_lex_next(&p->lx, &p->q[(p->head + p->count) % QUEUE]);
        p->count++;
        if (p->lx.failed && !p->failed) {
            if (p->lx.code == KIRI_E_NOMEM)
                nomem(p);
            else
                fail(p, p->lx.err_pos, "%s", p->lx.err);
        }
    }
    return &p->q[(p->head + k) % QUEUE];
}

static struct kiri_chat_token next(struct parser *p)
{
    struct kiri_chat_token t = *peek(p, 0);
    p->head = (p->head + 1) % QUEUE;
    p->count--;
    return t;
}

static int is_op(const struct kiri_chat_token *t, int op)
{
    return t->kind == KIRI_CHAT_TOK_OP && t->op == op;
}

static int is_name(const struct kiri_chat_token *t, const char *name)
{
    return t->kind == KIRI_CHAT_TOK_NAME && t->n == strlen(name) && memcmp(t->s, name, t->n) == 0;
}

static const char *describe(const struct kiri_chat_token *t, char *buf, size_t cap)
{
    switch (t->kind) {
    case KIRI_CHAT_TOK_EOF: return "end of template";
    case KIRI_CHAT_TOK_DATA: return "template data";
    case KIRI_CHAT_TOK_VAR_BEGIN: return "'{{'";
    case KIRI_CHAT_TOK_VAR_END: return "'}}'";
    case KIRI_CHAT_TOK_BLOCK_BEGIN: return "'{%'";
    case KIRI_CHAT_TOK_BLOCK_END: return "'%}'";
    case KIRI_CHAT_TOK_STRING: return "a string";
    case KIRI_CHAT_TOK_INT:
    case KIRI_CHAT_TOK_FLOAT: return "a number";
    default: snprintf(buf, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); return buf;
    }
}

static void *unexpected(struct parser *p, const struct kiri_chat_token *t, const char *wanted)
{
    char buf[64];
    if (wanted)
        return fail(p, t->pos, "expected %s, got %s", wanted, describe(t, buf, sizeof buf));
    return fail(p, t->pos, "unexpected %s", describe(t, buf, sizeof buf));
}

static int expect_op(struct parser *p, int op, const char *what)
{
    const struct kiri_chat_token *t = peek(p, 0);
    if (!is_op(t, op)) {
        unexpected(p, t, what);
        return -1;
    }
    next(p);
    return 0;
}

static int expect_kind(struct parser *p, int kind, const char *what)
{
    const struct kiri_chat_token *t = peek(p, 0);
    if (t->kind != kind) {
        unexpected(p, t, what);
        return -1;
    }
    next(p);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Expressions (jinja2's precedence, loosest first: conditional, or, and, not, comparisons,
 * + and -, ~, * / // %, **, unary - and +, then primaries with postfix, filters and tests)
 * ------------------------------------------------------------------------------------------- */

static struct kiri_chat_expr *parse_expression(struct parser *p, int with_cond);
static struct kiri_chat_expr *parse_tuple(struct parser *p, int with_cond, int explicit_parens,
                                          const char *end_name);
static struct kiri_chat_expr *parse_unary(struct parser *p, int with_filter);
static struct kiri_chat_expr *parse_primary(struct parser *p);
static struct kiri_chat_expr *parse_postfix(struct parser *p, struct kiri_chat_expr *e);

static struct kiri_chat_expr *mk(struct parser *p, int kind, size_t pos, struct kiri_chat_expr *a,
                                 struct kiri_chat_expr *b, struct kiri_chat_expr *c)
{
    struct kiri_chat_expr *e = alloc(p, sizeof *e);
    if (!e)
        return NULL;
    e->kind = (uint8_t)kind;
    e->pos = (uint32_t)pos;
    int d = 0;
    if (a && a->depth > d)
        d = a->depth;
    if (b && b->depth > d)
        d = b->depth;
    if (c && c->depth > d)
        d = c->depth;
    if (d + 1 > KIRI_CHAT_MAX_DEPTH)
        return fail(p, pos, "expression nested too deeply (more than %d levels)", KIRI_CHAT_MAX_DEPTH);
    e->depth = (uint16_t)(d + 1);
    e->a = a;
    e->b = b;
    e->c = c;
    return e;
}

/* Accounts for the depth of arguments added after mk. */
static struct kiri_chat_expr *deepen(struct parser *p, struct kiri_chat_expr *e)
{
    for (int i = 0; i < e->n_args; i++) {
        if (e->args[i].e && e->args[i].e->depth >= e->depth) {
            if (e->args[i].e->depth + 1 > KIRI_CHAT_MAX_DEPTH)
                return fail(p, e->pos, "expression nested too deeply (more than %d levels)",
                            KIRI_CHAT_MAX_DEPTH);
            e->depth = (uint16_t)(e->args[i].e->depth + 1);
        }
    }
    return e;
}

/* A growable argument list in the arena (old arrays are left behind; argument lists are short). */
static int add_arg(struct parser *p, struct kiri_chat_expr *e, int *cap, const char *kw,
                   size_t kw_len, int op, struct kiri_chat_expr *val)
{
    if (e->n_args == *cap) {
        int nc = *cap ? *cap * 2 : 4;
        struct kiri_chat_arg *na = alloc(p, sizeof *na * (size_t)nc);
        if (!na)
            return -1;
        if (e->n_args)
            memcpy(na, e->args, sizeof *na * (size_t)e->n_args);
        e->args = na;
        *cap = nc;
    }
    struct kiri_chat_arg *a = &e->args[e->n_args++];
    a->kw = kw;
    a->kw_len = kw_len;
    a->op = op;
    a->e = val;
    return 0;
}

static int enter(struct parser *p, size_t pos)
{
    if (++p->depth > KIRI_CHAT_MAX_DEPTH) {
        fail(p, pos, "template nested too deeply (more than %d levels)", KIRI_CHAT_MAX_DEPTH);
        return -1;
    }
    return 0;
}

/* (args) of a call, filter or test: positional ones, then keyword ones. */
static int parse_call_args(struct parser *p, struct kiri_chat_expr *e)
{
    int cap = 0, seen_kw = 0;
    if (expect_op(p, '(', "'('") < 0)
        return -1;
    while (!is_op(peek(p, 0), ')')) {
        if (e->n_args > 0) {
            if (expect_op(p, ',', "',' or ')'") < 0)
                return -1;
            if (is_op(peek(p, 0), ')'))
                break;
        }
        const struct kiri_chat_token *t = peek(p, 0);
        if (is_op(t, '*') || is_op(t, KIRI_CHAT_TOK_POW)) {
            fail(p, t->pos, "*args and **kwargs in calls are not supported");
            return -1;
        }
        const char *kw = NULL;
        size_t kw_len = 0;
        if (t->kind == KIRI_CHAT_TOK_NAME && is_op(peek(p, 1), '=')) {
            kw = t->s;
            kw_len = t->n;
            next(p);
            next(p);
            seen_kw = 1;
        } else if (seen_kw) {
            fail(p, t->pos, "positional argument after keyword arguments");
            return -1;
        }
        struct kiri_chat_expr *v = parse_expression(p, 1);
        if (!v || add_arg(p, e, &cap, kw, kw_len, 0, v) < 0)
            return -1;
    }
    next(p);
    return deepen(p, e) ? 0 : -1;
}

static struct kiri_chat_expr *parse_filter(struct parser *p, struct kiri_chat_expr *in)
{
    while (is_op(peek(p, 0), '|')) {
        next(p);
        struct kiri_chat_token t = next(p);
        if (t.kind != KIRI_CHAT_TOK_NAME)
            return unexpected(p, &t, "a filter name");
        if (is_op(peek(p, 0), '.'))
            return fail(p, t.pos, "dotted filter names are not supported");
        int id = p->names->filter(t.s, t.n);
        if (id < 0)
            return fail(p, t.pos, "unknown filter '%.*s'", (int)(t.n > 40 ? 40 : t.n), t.s);
        struct kiri_chat_expr *f = mk(p, KIRI_CHAT_EXPR_FILTER, t.pos, in, NULL, NULL);
        if (!f)
            return NULL;
        f->id = id;
        f->name = t.s;
        f->name_len = t.n;
        if (is_op(peek(p, 0), '(') && parse_call_args(p, f) < 0)
            return NULL;
        in = f;
    }
    return in;
}

static struct kiri_chat_expr *parse_test(struct parser *p, struct kiri_chat_expr *in)
{
    struct kiri_chat_token is = next(p);
    int negated = 0;
    if (is_name(peek(p, 0), "not")) {
        next(p);
        negated = 1;
    }
    struct kiri_chat_token t = next(p);
    if (t.kind != KIRI_CHAT_TOK_NAME)
        return unexpected(p, &t, "a test name");
    if (is_op(peek(p, 0), '.'))
        return fail(p, t.pos, "dotted test names are not supported");
    int id = p->names->test(t.s, t.n);
    if (id < 0)
        return fail(p, t.pos, "unknown test '%.*s'", (int)(t.n > 40 ? 40 : t.n), t.s);
    struct kiri_chat_expr *e = mk(p, KIRI_CHAT_EXPR_TEST, is.pos, in, NULL, NULL);
    if (!e)
        return NULL;
    e->id = id;
    e->name = t.s;
    e->name_len = t.n;
    const struct kiri_chat_token *c = peek(p, 0);
    if (is_op(c, '(')) {
        if (parse_call_args(p, e) < 0)
            return NULL;
    } else if ((c->kind == KIRI_CHAT_TOK_NAME || c->kind == KIRI_CHAT_TOK_STRING || c->kind == KIRI_CHAT_TOK_INT ||
                c->kind == KIRI_CHAT_TOK_FLOAT || is_op(c, '[') || is_op(c, '{')) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        /* jinja2 takes one bare argument: `x is divisibleby 3`, `x is sameas none` */
        if (is_name(c, "is"))
            return fail(p, c->pos, "tests cannot be chained with 'is'");
        struct kiri_chat_expr *arg = parse_primary(p);
        arg = arg ? parse_postfix(p, arg) : NULL;
        int cap = 0;
        if (!arg || add_arg(p, e, &cap, NULL, 0, 0, arg) < 0 || !deepen(p, e))
            return NULL;
    }
    return negated ? mk(p, KIRI_CHAT_EXPR_NOT, is.pos, e, NULL, NULL) : e;
}

/* [ ... ] after an expression: an index, or a slice start:stop:step with any part left out. */
static struct kiri_chat_expr *parse_subscript(struct parser *p, struct kiri_chat_expr *obj, size_t pos)
{
    struct kiri_chat_expr *part[3] = {NULL, NULL, NULL};
    int slice = 0;
    if (!is_op(peek(p, 0), ':') && !(part[0] = parse_expression(p, 1)))
        return NULL;
    for (int k = 1; k < 3 && is_op(peek(p, 0), ':'); k++) {
        next(p);
        slice = 1;
        const struct kiri_chat_token *t = peek(p, 0);
        if (!is_op(t, ':') && !is_op(t, ']') && !(part[k] = parse_expression(p, 1)))
            return NULL;
    }
    if (is_op(peek(p, 0), ','))
        return fail(p, peek(p, 0)->pos, "tuple subscripts are not supported");
    if (expect_op(p, ']', "']'") < 0)
        return NULL;
    if (!slice && !part[0])
        return fail(p, pos, "empty subscript");
    struct kiri_chat_expr *key = part[0];
    if (slice && !(key = mk(p, KIRI_CHAT_EXPR_SLICE, pos, part[0], part[1], part[2])))
        return NULL;
    return mk(p, KIRI_CHAT_EXPR_GETITEM, pos, obj, key, NULL);
}

static struct kiri_chat_expr *parse_postfix(struct parser *p, struct kiri_chat_expr *e)
{
    while (e) {
        const struct kiri_chat_token *t = peek(p, 0);
        if (is_op(t, '.')) {
            size_t pos = t->pos;
            next(p);
            struct kiri_chat_token a = next(p);
            if (a.kind == KIRI_CHAT_TOK_INT) {
                struct kiri_chat_expr *k = mk(p, KIRI_CHAT_EXPR_CONST, a.pos, NULL, NULL, NULL);
                if (!k)
                    return NULL;
                k->op = KIRI_CHAT_CONST_INT;
                k->i = a.i;
                e = mk(p, KIRI_CHAT_EXPR_GETITEM, pos, e, k, NULL);
                continue;
            }
            if (a.kind != KIRI_CHAT_TOK_NAME)
                return unexpected(p, &a, "an attribute name");
            if (a.s[0] == '_')
                return fail(p, a.pos, "the sandbox refuses attribute '%.*s' (names starting with '_')",
                            (int)(a.n > 40 ? 40 : a.n), a.s);
            e = mk(p, KIRI_CHAT_EXPR_GETATTR, pos, e, NULL, NULL);
            if (e) {
                e->name = a.s;
                e->name_len = a.n;
            }
        } else if (is_op(t, '[')) {
            size_t pos = t->pos;
            next(p);
            e = parse_subscript(p, e, pos);
        } else if (is_op(t, '(')) {
            e = mk(p, KIRI_CHAT_EXPR_CALL, t->pos, e, NULL, NULL);
            if (e && parse_call_args(p, e) < 0)
                return NULL;
        } else {
            break;
        }
    }
    return e;
}

static struct kiri_chat_expr *parse_list_or_dict(struct parser *p, int dict)
{
    struct kiri_chat_token open = next(p);
    struct kiri_chat_expr *e = mk(p, dict ? KIRI_CHAT_EXPR_DICT : KIRI_CHAT_EXPR_LIST, open.pos,
                                  NULL, NULL, NULL);
    int cap = 0, close = dict ? '}' : ']';
    if (!e)
        return NULL;
    while (!is_op(peek(p, 0), close)) {
        if (e->n_args > 0) {
            if (expect_op(p, ',', dict ? "',' or '}'" : "',' or ']'") < 0)
                return NULL;
            if (is_op(peek(p, 0), close))
                break;
        }
        struct kiri_chat_expr *v = parse_expression(p, 1);
        if (!v || add_arg(p, e, &cap, NULL, 0, 0, v) < 0)
            return NULL;
        if (dict) {
            if (expect_op(p, ':', "':'") < 0 || !(v = parse_expression(p, 1)) ||
                add_arg(p, e, &cap, NULL, 0, 0, v) < 0)
                return NULL;
        }
    }
    next(p);
    return deepen(p, e);
}

static struct kiri_chat_expr *parse_primary(struct parser *p)
{
    const struct kiri_chat_token *t = peek(p, 0);
    size_t pos = t->pos;
    struct kiri_chat_expr *e;
    if (t->kind == KIRI_CHAT_TOK_NAME) {
        struct kiri_chat_token nt = next(p);
        e = mk(p, KIRI_CHAT_EXPR_CONST, pos, NULL, NULL, NULL);
        if (!e)
            return NULL;
        if (is_name(&nt, "true") || is_name(&nt, "True") || is_name(&nt, "false") ||
            is_name(&nt, "False")) {
            e->op = KIRI_CHAT_CONST_BOOL;
            e->i = nt.s[0] == 't' || nt.s[0] == 'T';
        } else if (is_name(&nt, "none") || is_name(&nt, "None")) {
            e->op = KIRI_CHAT_CONST_NONE;
        } else {
            e->kind = KIRI_CHAT_EXPR_NAME;
            e->name = nt.s;
            e->name_len = nt.n;
        }
        return e;
    }
    if (t->kind == KIRI_CHAT_TOK_STRING) {
        /* adjacent literals concatenate, as in Python */
        struct kiri_chat_token first = next(p);
        const char *s = first.s;
        size_t n = first.n;
        while (peek(p, 0)->kind == KIRI_CHAT_TOK_STRING) {
            struct kiri_chat_token more = next(p);
            char *c = alloc(p, n + more.n + 1);
            if (!c)
                return NULL;
            memcpy(c, s, n);
            memcpy(c + n, more.s, more.n);
            s = c;
            n += more.n;
        }
        e = mk(p, KIRI_CHAT_EXPR_CONST, pos, NULL, NULL, NULL);
        if (e) {
            e->op = KIRI_CHAT_CONST_STR;
            e->name = s;
            e->name_len = n;
        }
        return e;
    }
    if (t->kind == KIRI_CHAT_TOK_INT || t->kind == KIRI_CHAT_TOK_FLOAT) {
        struct kiri_chat_token nt = next(p);
        e = mk(p, KIRI_CHAT_EXPR_CONST, pos, NULL, NULL, NULL);
        if (e) {
            e->op = nt.kind == KIRI_CHAT_TOK_INT ? KIRI_CHAT_CONST_INT : KIRI_CHAT_CONST_FLOAT;
            e->i = nt.i;
            e->f = nt.f;
        }
        return e;
    }
    if (is_op(t, '(')) {
        next(p);
        e = parse_tuple(p, 1, 1, NULL);
        if (!e || expect_op(p, ')', "')'") < 0)
            return NULL;
        return e;
    }
    if (is_op(t, '['))
        return parse_list_or_dict(p, 0);
    if (is_op(t, '{'))
        return parse_list_or_dict(p, 1);
    return unexpected(p, t, NULL);
}

static struct kiri_chat_expr *parse_unary(struct parser *p, int with_filter)
{
    const struct kiri_chat_token *t = peek(p, 0);
    size_t pos = t->pos;
    struct kiri_chat_expr *e;
    if (enter(p, pos) < 0)
        return NULL;
    if (is_op(t, '-') || is_op(t, '+')) {
        int kind = is_op(t, '-') ? KIRI_CHAT_EXPR_NEG : KIRI_CHAT_EXPR_POS;
        next(p);
        e = parse_unary(p, 0);
        e = e ? mk(p, kind, pos, e, NULL, NULL) : NULL;
    } else {
        e = parse_primary(p);
    }
    e = parse_postfix(p, e);
    while (e && with_filter) {
        const struct kiri_chat_token *c = peek(p, 0);
        if (is_op(c, '|'))
            e = parse_filter(p, e);
        else if (is_name(c, "is"))
            e = parse_test(p, e);
        else if (is_op(c, '(')) {
            e = mk(p, KIRI_CHAT_EXPR_CALL, c->pos, e, NULL, NULL);
            if (e && parse_call_args(p, e) < 0)
                e = NULL;
        } else {
            break;
        }
    }
    p->depth--;
    return e;
}

static struct kiri_chat_expr *binary(struct parser *p, size_t pos, int op,
                                     struct kiri_chat_expr *a, struct kiri_chat_expr *b)
{
    struct kiri_chat_expr *e = b ? mk(p, KIRI_CHAT_EXPR_BINARY, pos, a, b, NULL) : NULL;
    if (e)
        e->op = (uint8_t)op;
    return e;
}

static struct kiri_chat_expr *parse_pow(struct parser *p)
{
    struct kiri_chat_expr *e = parse_unary(p, 1);
    while (e && is_op(peek(p, 0), KIRI_CHAT_TOK_POW)) {
        size_t pos = next(p).pos;
        e = binary(p, pos, KIRI_CHAT_OP_POW, e, parse_unary(p, 1));
    }
    return e;
}

static struct kiri_chat_expr *parse_math2(struct parser *p)
{
    struct kiri_chat_expr *e = parse_pow(p);
    for (;;) {
        const struct kiri_chat_token *t = peek(p, 0);
        int op = is_op(t, '*') ? KIRI_CHAT_OP_MUL : is_op(t, '/') ? KIRI_CHAT_OP_DIV
               : is_op(t, KIRI_CHAT_TOK_FLOORDIV) ? KIRI_CHAT_OP_FLOORDIV : is_op(t, '%') ? KIRI_CHAT_OP_MOD : -1;
        if (!e || op < 0)
            return e;
        size_t pos = next(p).pos;
        e = binary(p, pos, op, e, parse_pow(p));
    }
}

static struct kiri_chat_expr *parse_concat(struct parser *p)
{
    struct kiri_chat_expr *e = parse_math2(p);
    if (!e || !is_op(peek(p, 0), '~'))
        return e;
    struct kiri_chat_expr *c = mk(p, KIRI_CHAT_EXPR_CONCAT, peek(p, 0)->pos, NULL, NULL, NULL);
    int cap = 0;
    if (!c || add_arg(p, c, &cap, NULL, 0, 0, e) < 0)
        return NULL;
    while (is_op(peek(p, 0), '~')) {
        next(p);
        if (!(e = parse_math2(p)) || add_arg(p, c, &cap, NULL, 0, 0, e) < 0)
            return NULL;
    }
    return deepen(p, c);
}

static struct kiri_chat_expr *parse_math1(struct parser *p)
{
    struct kiri_chat_expr *e = parse_concat(p);
    for (;;) {
        const struct kiri_chat_token *t = peek(p, 0);
        int op = is_op(t, '+') ? KIRI_CHAT_OP_ADD : is_op(t, '-') ? KIRI_CHAT_OP_SUB : -1;
        if (!e || op < 0)
            return e;
        size_t pos = next(p).pos;
        e = binary(p, pos, op, e, parse_concat(p));
    }
}

static struct kiri_chat_expr *parse_compare(struct parser *p)
{
    struct kiri_chat_expr *e = parse_math1(p), *c = NULL;
    int cap = 0;
    while (e) {
        const struct kiri_chat_token *t = peek(p, 0);
        int op = -1;
        if (t->kind == KIRI_CHAT_TOK_OP) {
            switch (t->op) {
            case KIRI_CHAT_TOK_EQ: op = KIRI_CHAT_OP_EQ; break;
            case KIRI_CHAT_TOK_NE: op = KIRI_CHAT_OP_NE; break;
            case KIRI_CHAT_TOK_GE: op = KIRI_CHAT_OP_GE; break;
            case KIRI_CHAT_TOK_LE: op = KIRI_CHAT_OP_LE; break;
            case '<': op = KIRI_CHAT_OP_LT; break;
            case '>': op = KIRI_CHAT_OP_GT; break;
            default: break;
            }
        } else if (is_name(t, "in")) {
            op = KIRI_CHAT_OP_IN;
        } else if (is_name(t, "not") && is_name(peek(p, 1), "in")) {
            op = KIRI_CHAT_OP_NOTIN;
            next(p);
        }
        if (op < 0)
            break;
        size_t pos = next(p).pos;
        if (!c && !(c = mk(p, KIRI_CHAT_EXPR_COMPARE, pos, e, NULL, NULL)))
            return NULL;
        struct kiri_chat_expr *r = parse_math1(p);
        if (!r || add_arg(p, c, &cap, NULL, 0, op, r) < 0)
            return NULL;
    }
    return c ? deepen(p, c) : e;
}

static struct kiri_chat_expr *parse_not(struct parser *p)
{
    const struct kiri_chat_token *t = peek(p, 0);
    if (is_name(t, "not")) {
        size_t pos = next(p).pos;
        if (enter(p, pos) < 0)
            return NULL;
        struct kiri_chat_expr *e = parse_not(p);
        p->depth--;
        return e ? mk(p, KIRI_CHAT_EXPR_NOT, pos, e, NULL, NULL) : NULL;
    }
    return parse_compare(p);
}

static struct kiri_chat_expr *parse_and(struct parser *p)
{
    struct kiri_chat_expr *e = parse_not(p);
    while (e && is_name(peek(p, 0), "and")) {
        size_t pos = next(p).pos;
        struct kiri_chat_expr *r = parse_not(p);
        e = r ? mk(p, KIRI_CHAT_EXPR_AND, pos, e, r, NULL) : NULL;
    }
    return e;
}

static struct kiri_chat_expr *parse_or(struct parser *p)
{
    struct kiri_chat_expr *e = parse_and(p);
    while (e && is_name(peek(p, 0), "or")) {
        size_t pos = next(p).pos;
        struct kiri_chat_expr *r = parse_and(p);
        e = r ? mk(p, KIRI_CHAT_EXPR_OR, pos, e, r, NULL) : NULL;
    }
    return e;
}

static struct kiri_chat_expr *parse_expression(struct parser *p, int with_cond)
{
    if (enter(p, peek(p, 0)->pos) < 0)
        return NULL;
    struct kiri_chat_expr *e = parse_or(p);
    while (with_cond && e && is_name(peek(p, 0), "if")) {
        size_t pos = next(p).pos;
        struct kiri_chat_expr *cond = parse_or(p), *other = NULL;
        if (!cond)
            return NULL;
        if (is_name(peek(p, 0), "else")) {
            next(p);
            if (!(other = parse_expression(p, 1)))
                return NULL;
        }
        e = mk(p, KIRI_CHAT_EXPR_COND, pos, e, cond, other);
    }
    p->depth--;
    return e;
}

static int is_tuple_end(struct parser *p, const char *end_name)
{
    const struct kiri_chat_token *t = peek(p, 0);
    return t->kind == KIRI_CHAT_TOK_VAR_END || t->kind == KIRI_CHAT_TOK_BLOCK_END || t->kind == KIRI_CHAT_TOK_EOF || is_op(t, ')') ||
           (end_name && is_name(t, end_name));
}

/* Expressions separated by commas make a tuple, as in jinja2's parse_tuple; `(a,)` is one. */
static struct kiri_chat_expr *parse_tuple(struct parser *p, int with_cond, int explicit_parens,
                                          const char *end_name)
{
    size_t pos = peek(p, 0)->pos;
    struct kiri_chat_expr *first = NULL, *tuple = NULL;
    int cap = 0, n = 0;
    for (;;) {
        if (n > 0 && expect_op(p, ',', "','") < 0)
            return NULL;
        if (is_tuple_end(p, end_name))
            break;
        struct kiri_chat_expr *e = parse_expression(p, with_cond);
        if (!e)
            return NULL;
        if (tuple) {
            if (add_arg(p, tuple, &cap, NULL, 0, 0, e) < 0)
                return NULL;
        } else {
            first = e;
        }
        n++;
        if (!is_op(peek(p, 0), ','))
            break;
        if (!tuple && (!(tuple = mk(p, KIRI_CHAT_EXPR_TUPLE, pos, NULL, NULL, NULL)) ||
                       add_arg(p, tuple, &cap, NULL, 0, 0, first) < 0))
            return NULL;
    }
    if (tuple)
        return deepen(p, tuple);
    if (n)
        return first;
    if (explicit_parens)
        return mk(p, KIRI_CHAT_EXPR_TUPLE, pos, NULL, NULL, NULL);
    return unexpected(p, peek(p, 0), "an expression");
}

/* ---------------------------------------------------------------------------------------------
 * Statements
 * ------------------------------------------------------------------------------------------- */

static struct kiri_chat_stmt *parse_body(struct parser *p, const char *const *ends, int n_ends);

static struct kiri_chat_stmt *mk_stmt(struct parser *p, int kind, size_t pos)
{
    struct kiri_chat_stmt *s = alloc(p, sizeof *s);
    if (s) {
        s->kind = (uint8_t)kind;
        s->pos = (uint32_t)pos;
    }
    return s;
}

/* Assignment targets: names (`a`, `a, b`) or, where allowed, a namespace attribute `ns.attr`. */
static int parse_targets(struct parser *p, struct kiri_chat_stmt *s, int with_ns, const char *end)
{
    struct kiri_chat_target tg[8];
    int n = 0;
    for (;;) {
        struct kiri_chat_token t = next(p);
        if (t.kind != KIRI_CHAT_TOK_NAME || is_name(&t, "true") || is_name(&t, "false") ||
            is_name(&t, "none") || is_name(&t, "True") || is_name(&t, "False") ||
            is_name(&t, "None")) {
            unexpected(p, &t, "a variable name");
            return -1;
        }
        if (n == 8) {
            fail(p, t.pos, "too many assignment targets");
            return -1;
        }
        memset(&tg[n], 0, sizeof tg[n]);
        tg[n].name = t.s;
        tg[n].name_len = t.n;
        if (with_ns && is_op(peek(p, 0), '.')) {
            next(p);
            struct kiri_chat_token a = next(p);
            if (a.kind != KIRI_CHAT_TOK_NAME) {
                unexpected(p, &a, "an attribute name");
                return -1;
            }
            if (a.s[0] == '_') {
                fail(p, a.pos, "the sandbox refuses attribute '%.*s' (names starting with '_')",
                     (int)(a.n > 40 ? 40 : a.n), a.s);
                return -1;
            }
            tg[n].attr = a.s;
            tg[n].attr_len = a.n;
        }
        n++;
        if (!is_op(peek(p, 0), ','))
            break;
        next(p);
        if (is_tuple_end(p, end) || is_op(peek(p, 0), '=') || is_op(peek(p, 0), '|'))
            break;
    }
    s->targets = alloc(p, sizeof *s->targets * (size_t)n);
    if (!s->targets)
        return -1;
    memcpy(s->targets, tg, sizeof *tg * (size_t)n);
    s->n_targets = n;
    return 0;
}

/* `%}` then a body up to one of ends; leaves the end's name as the current token. */
static struct kiri_chat_stmt *parse_block_body(struct parser *p, const char *const *ends,
                                               int n_ends, int *ok)
{
    *ok = 0;
    if (is_op(peek(p, 0), ':'))
        next(p);
    if (expect_kind(p, KIRI_CHAT_TOK_BLOCK_END, "'%}'") < 0)
        return NULL;
    p->block_depth++;
    struct kiri_chat_stmt *b = parse_body(p, ends, n_ends);
    p->block_depth--;
    *ok = !p->failed;
    return b;
}

static int end_tag(struct parser *p, const char *name)
{
    const struct kiri_chat_token *t = peek(p, 0);
    if (!is_name(t, name)) {
        char want[32];
        snprintf(want, sizeof want, "'%s'", name);
        unexpected(p, t, want);
        return -1;
    }
    next(p);
    return 0;
}

static struct kiri_chat_stmt *parse_for(struct parser *p, size_t pos)
{
    static const char *const ends[] = {"endfor", "else"};
    struct kiri_chat_stmt *s = mk_stmt(p, KIRI_CHAT_STMT_FOR, pos);
    int ok;
    if (!s || parse_targets(p, s, 0, "in") < 0 || end_tag(p, "in") < 0)
        return NULL;
    if (!(s->expr = parse_tuple(p, 0, 0, "recursive")))
        return NULL;
    if (is_name(peek(p, 0), "if")) {
        next(p);
        if (!(s->cond = parse_expression(p, 1)))
            return NULL;
    }
    if (is_name(peek(p, 0), "recursive"))
        return fail(p, peek(p, 0)->pos, "recursive loops are not supported");
    p->loop_depth++;
    s->body = parse_block_body(p, ends, 2, &ok);
    p->loop_depth--;
    if (!ok)
        return NULL;
    if (is_name(peek(p, 0), "else")) {
        next(p);
        s->orelse = parse_block_body(p, ends, 1, &ok);
        if (!ok)
            return NULL;
    }
    return end_tag(p, "endfor") < 0 ? NULL : s;
}

static struct kiri_chat_stmt *parse_if(struct parser *p, size_t pos)
{
    static const char *const ends[] = {"endif", "elif", "else"};
    struct kiri_chat_stmt *first = NULL, *cur = NULL;
    int ok;
    for (;;) {
        struct kiri_chat_stmt *s = mk_stmt(p, KIRI_CHAT_STMT_IF, pos);
        if (!s || !(s->expr = parse_tuple(p, 0, 0, NULL)))
            return NULL;
        s->body = parse_block_body(p, ends, 3, &ok);
        if (!ok)
            return NULL;
        if (cur)
            cur->orelse = s;
        else
            first = s;
        cur = s;
        struct kiri_chat_token t = next(p);
        if (is_name(&t, "elif")) {
            pos = t.pos;
            continue;
        }
        if (is_name(&t, "else")) {
            cur->orelse = parse_block_body(p, ends, 1, &ok);
            if (!ok || end_tag(p, "endif") < 0)
                return NULL;
        }
        return first;
    }
}

static struct kiri_chat_stmt *parse_set(struct parser *p, size_t pos)
{
    static const char *const ends[] = {"endset"};
    struct kiri_chat_stmt *s = mk_stmt(p, KIRI_CHAT_STMT_SET, pos);
    int ok;
    if (!s || parse_targets(p, s, 1, NULL) < 0)
        return NULL;
    if (is_op(peek(p, 0), '=')) {
        next(p);
        return (s->expr = parse_tuple(p, 1, 0, NULL)) ? s : NULL;
    }
    if (s->n_targets != 1 || s->targets[0].attr)
        return fail(p, pos, "a {%% set %%} block assigns to one plain name");
    s->kind = KIRI_CHAT_STMT_SET_BLOCK;
    if (is_op(peek(p, 0), '|') && !(s->filter = parse_filter(p, NULL)))
        return NULL;
    s->body = parse_block_body(p, ends, 1, &ok);
    if (!ok || end_tag(p, "endset") < 0)
        return NULL;
    return s;
}

/* {% macro name(a, b=default, ...) %}body{% endmacro %}, at the top level of the template. */
static struct kiri_chat_stmt *parse_macro(struct parser *p, size_t pos)
{
    static const char *const ends[] = {"endmacro"};
    if (p->block_depth)
        return fail(p, pos, "a macro inside another block is not supported");
    struct kiri_chat_token name = next(p);
    if (name.kind != KIRI_CHAT_TOK_NAME)
        return unexpected(p, &name, "a macro name");
    struct kiri_chat_stmt *s = mk_stmt(p, KIRI_CHAT_STMT_MACRO, pos);
    if (!s)
        return NULL;
    s->text = name.s;
    s->text_len = name.n;
    struct kiri_chat_token t = next(p);
    if (!is_op(&t, '('))
        return unexpected(p, &t, "'('");
    struct kiri_chat_target tg[KIRI_CHAT_MAX_PARAMS];
    struct kiri_chat_expr *def[KIRI_CHAT_MAX_PARAMS];
    int n = 0;
    while (!is_op(peek(p, 0), ')')) {
        struct kiri_chat_token a = next(p);
        if (a.kind != KIRI_CHAT_TOK_NAME)
            return unexpected(p, &a, "a parameter name");
        if (n == KIRI_CHAT_MAX_PARAMS)
            return fail(p, a.pos, "too many macro parameters (at most %d)", KIRI_CHAT_MAX_PARAMS);
        memset(&tg[n], 0, sizeof tg[n]);
        tg[n].name = a.s;
        tg[n].name_len = a.n;
        def[n] = NULL;
        if (is_op(peek(p, 0), '=')) {
            next(p);
            if (!(def[n] = parse_expression(p, 1)))
                return NULL;
        } else if (n && def[n - 1]) {
            return fail(p, a.pos, "a parameter without a default follows one with a default");
        }
        n++;
        if (!is_op(peek(p, 0), ','))
            break;
        next(p);
    }
    t = next(p);
    if (!is_op(&t, ')'))
        return unexpected(p, &t, "')'");
    s->targets = alloc(p, sizeof *s->targets * (size_t)(n ? n : 1));
    s->defaults = alloc(p, sizeof *s->defaults * (size_t)(n ? n : 1));
    if (!s->targets || !s->defaults)
        return NULL;
    memcpy(s->targets, tg, sizeof *tg * (size_t)n);
    memcpy(s->defaults, def, sizeof *def * (size_t)n);
    s->n_targets = n;
    int ok, saved_loops = p->loop_depth;
    p->loop_depth = 0;   /* break and continue do not reach through a macro */
    s->body = parse_block_body(p, ends, 1, &ok);
    p->loop_depth = saved_loops;
    if (!ok || end_tag(p, "endmacro") < 0)
        return NULL;
    return s;
}

static struct kiri_chat_stmt *parse_statement(struct parser *p)
{
    static const char *const refused[] = {"call", "filter", "block", "extends",
                                          "include", "import", "from", "with", "autoescape",
                                          "do"};
    static const char *const closers[] = {"endif", "elif", "else", "endfor", "endset",
                                          "endgeneration", "endraw", "endmacro"};
    static const char *const gen_ends[] = {"endgeneration"};
    struct kiri_chat_token t = next(p);
    if (t.kind != KIRI_CHAT_TOK_NAME)
        return unexpected(p, &t, "a tag name");
    if (enter(p, t.pos) < 0)
        return NULL;
    struct kiri_chat_stmt *s = NULL;
    int ok;
    if (is_name(&t, "if")) {
        s = parse_if(p, t.pos);
    } else if (is_name(&t, "for")) {
        s = parse_for(p, t.pos);
    } else if (is_name(&t, "set")) {
        s = parse_set(p, t.pos);
    } else if (is_name(&t, "macro")) {
        s = parse_macro(p, t.pos);
    } else if (is_name(&t, "print")) {
        if ((s = mk_stmt(p, KIRI_CHAT_STMT_PRINT, t.pos)) && !(s->expr = parse_tuple(p, 1, 0, NULL)))
            s = NULL;
    } else if (is_name(&t, "break") || is_name(&t, "continue")) {
        if (p->loop_depth == 0)
            return fail(p, t.pos, "'%.*s' outside a for loop", (int)t.n, t.s);
        s = mk_stmt(p, t.s[0] == 'b' ? KIRI_CHAT_STMT_BREAK : KIRI_CHAT_STMT_CONTINUE, t.pos);
    } else if (is_name(&t, "generation")) {
        /* transformers' marker for assistant tokens; it renders its body unchanged */
        if ((s = mk_stmt(p, KIRI_CHAT_STMT_BLOCK, t.pos))) {
            s->body = parse_block_body(p, gen_ends, 1, &ok);
            if (!ok || end_tag(p, "endgeneration") < 0)
                s = NULL;
        }
    } else {
        for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
            if (is_name(&t, refused[i]))
                return fail(p, t.pos, "the '%s' tag is not supported", refused[i]);
        for (size_t i = 0; i < sizeof closers / sizeof closers[0]; i++)
            if (is_name(&t, closers[i]))
                return fail(p, t.pos, "'%s' without a matching opening tag", closers[i]);
        return fail(p, t.pos, "unknown tag '%.*s'", (int)(t.n > 40 ? 40 : t.n), t.s);
    }
    p->depth--;
    return s;
}

/* Statements until `{% <one of ends>` (consumed up to the name) or the end of the template. */
static struct kiri_chat_stmt *parse_body(struct parser *p, const char *const *ends, int n_ends)
{
    struct kiri_chat_stmt *first = NULL, **tail = &first;
    for (;;) {
        const struct kiri_chat_token *t = peek(p, 0);
        struct kiri_chat_stmt *s = NULL;
        if (p->failed)
            return NULL;
        if (t->kind == KIRI_CHAT_TOK_EOF) {
            if (n_ends) {
                char want[48];
                snprintf(want, sizeof want, "'{%% %s %%}'", ends[0]);
                return unexpected(p, t, want);
            }
            return first;
        }
        if (t->kind == KIRI_CHAT_TOK_DATA) {
            struct kiri_chat_token d = next(p);
            if ((s = mk_stmt(p, KIRI_CHAT_STMT_TEXT, d.pos))) {
                s->text = d.s;
                s->text_len = d.n;
            }
        } else if (t->kind == KIRI_CHAT_TOK_VAR_BEGIN) {
            size_t pos = next(p).pos;
            if ((s = mk_stmt(p, KIRI_CHAT_STMT_PRINT, pos)) &&
                (!(s->expr = parse_tuple(p, 1, 0, NULL)) || expect_kind(p, KIRI_CHAT_TOK_VAR_END, "'}}'") < 0))
                s = NULL;
        } else if (t->kind == KIRI_CHAT_TOK_BLOCK_BEGIN) {
            next(p);
            const struct kiri_chat_token *name = peek(p, 0);
            for (int i = 0; i < n_ends; i++)
                if (is_name(name, ends[i]))
                    return first;
            if (n_ends && name->kind == KIRI_CHAT_TOK_NAME && name->n >= 3 &&
                (memcmp(name->s, "end", 3) == 0 || is_name(name, "else") || is_name(name, "elif"))) {
                char want[48];
                snprintf(want, sizeof want, "'{%% %s %%}'", ends[0]);
                return unexpected(p, name, want);
            }
            if ((s = parse_statement(p)) && expect_kind(p, KIRI_CHAT_TOK_BLOCK_END, "'%}'") < 0)
                s = NULL;
        } else {
            return unexpected(p, t, NULL);
        }
        if (!s)
            return NULL;
        *tail = s;
        while (s->next)
            s = s->next;
        tail = &s->next;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Entry
 * ------------------------------------------------------------------------------------------- */

/* jinja2 splits the source on \r\n, \r and \n, drops a final empty line (keep_trailing_newline
 * is off) and joins with \n; positions in error messages refer to this normalised text. */
static size_t normalise(const char *src, size_t len, char *out)
{
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            out[k++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n')
                i++;
        } else {
            out[k++] = src[i];
        }
    }
    if (k > 0 && out[k - 1] == '\n')
        k--;
    out[k] = '\0';
    return k;
}

int kiri_chat_parse(struct kiri_chat_template *t, const char *src, size_t len,
                    const struct kiri_chat_names *names, struct kiri_status_info *info)
{
    /* The tree of a template is a small multiple of its size (about 35 bytes per byte for the
     * densest, "{{1}}" repeated; real templates, mostly text, far less): 64x plus slack accepts
     * anything within the size cap and still bounds a hostile one. */
    t->arena.cap = len * 64 + ((size_t)1 << 20);
    struct parser p;
    memset(&p, 0, sizeof p);
    p.t = t;
    p.names = names;
    p.info = info;
    char *copy = alloc(&p, len + 1);
    if (copy) {
        t->len = normalise(src, len, copy);
        t->src = copy;
        kiri_chat_lex_init(&p.lx, copy, t->len, &t->arena);
        t->body = parse_body(&p, NULL, 0);
    }
    return p.failed ? p.code : KIRI_OK;
}
