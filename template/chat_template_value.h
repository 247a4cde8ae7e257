/* Runtime values of the chat-template evaluator and the render state, shared by the evaluator
 * (chat_template_eval.c), the builtins it calls (chat_template_builtins.c: filters, tests,
 * methods, global functions) and the printing of values (chat_template_text.c); nothing else
 * includes this header.
 *
 * Values follow Python's data model as jinja2 exposes it, closely enough for byte-identical
 * output: ints are int64 (overflow is an error, not a bigint), strings are immutable UTF-8
 * slices indexed by code point, lists/tuples and dicts are immutable once built (the sandbox
 * forbids mutation), and only namespace() objects can change, through {% set ns.x = ... %}.
 * Every value lives in the render's arena (or is borrowed from the template or the messages,
 * which outlive the render) and is freed with it, so values are copied freely by value.
 */
#ifndef KIRI_CHAT_TEMPLATE_VALUE_H
#define KIRI_CHAT_TEMPLATE_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "chat_template_ast.h"

struct kiri_status_info;

enum kiri_chat_type {
    KIRI_CHAT_TYPE_MISSING = -1, /* an argument not passed (never a template-visible value) */
    KIRI_CHAT_TYPE_UNDEF,        /* jinja2's Undefined; s names what was looked up */
    KIRI_CHAT_TYPE_NONE,
    KIRI_CHAT_TYPE_BOOL,         /* i is 0 or 1 */
    KIRI_CHAT_TYPE_INT,
    KIRI_CHAT_TYPE_FLOAT,
    KIRI_CHAT_TYPE_STR,
    KIRI_CHAT_TYPE_LIST,         /* also tuples (list->tuple) */
    KIRI_CHAT_TYPE_DICT,
    KIRI_CHAT_TYPE_NS,           /* namespace(): a dict whose attributes can be set */
    KIRI_CHAT_TYPE_LOOP,         /* the `loop` variable of a for loop */
    KIRI_CHAT_TYPE_FUNC          /* a global function; i is enum kiri_chat_func */
};

enum kiri_chat_func {
    KIRI_CHAT_FUNC_RAISE_EXCEPTION,
    KIRI_CHAT_FUNC_NAMESPACE,
    KIRI_CHAT_FUNC_RANGE,
    KIRI_CHAT_FUNC_DICT
};

struct kiri_chat_value {
    int type; /* enum kiri_chat_type */
    union {
        int64_t i;
        double f;
        struct {
            const char *p; /* valid UTF-8, not NUL-terminated */
            size_t n;
        } s;
        struct kiri_chat_list *list;
        struct kiri_chat_dict *dict;
        struct kiri_chat_loop *loop;
    } u;
};

struct kiri_chat_list {
    size_t n;
    int tuple;
    struct kiri_chat_value *v; /* n of them */
};

/* Insertion-ordered; keys are strings, numbers, bools or none, compared as Python does. */
struct kiri_chat_dict {
    size_t n, cap;
    struct kiri_chat_value *k, *v; /* n of each, room for cap */
};

struct kiri_chat_loop {
    int64_t index0, length;
    const struct kiri_chat_value *items; /* the sequence iterated, length of them */
};

/* Text being built on the heap: the output, or scratch text for a conversion. Zeroed is empty;
 * kiri_chat_buf_put does the accounting, the bytes grow in a base buffer. */
struct kiri_chat_buf {
    struct kiri_buf text;
    int is_output; /* counted against max_output rather than max_memory */
};

struct kiri_chat_scope;

struct kiri_chat_render {
    const struct kiri_chat_template *t;
    struct kiri_chat_arena arena;       /* every value of this render */
    struct kiri_chat_buf *out;          /* where text goes now (a set block redirects it) */
    struct kiri_chat_scope *scope;      /* innermost variable scope */
    struct kiri_chat_value block_input; /* the body text a {% set %} block's filters receive */
    size_t produced, max_output, max_memory;
    uint64_t steps, max_steps;
    struct kiri_status_info *info;
    int code; /* status of the first error, 0 while none */
};

/* Up to 8 evaluated arguments: v[i] is keyword kw[i] when kw[i] is non-NULL. */
#define KIRI_CHAT_MAX_ARGS 8
struct kiri_chat_args {
    int n;
    struct kiri_chat_value v[KIRI_CHAT_MAX_ARGS];
    const char *kw[KIRI_CHAT_MAX_ARGS];
    size_t kw_len[KIRI_CHAT_MAX_ARGS];
};

/* ---- chat_template_eval.c; functions returning int return 0 or -1 (the status is r->code) - */

/* Records an evaluation error at e (may be NULL) as KIRI_E_UNSUPPORTED. */
int kiri_chat_fail(struct kiri_chat_render *r, const struct kiri_chat_expr *e, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records a failure with an explicit code and field (limits, raise_exception). */
int kiri_chat_fail_code(struct kiri_chat_render *r, int code, const char *field, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));
/* Counts evaluation work: n steps, or one per 256 bytes scanned or copied. */
int kiri_chat_step(struct kiri_chat_render *r, uint64_t n);
int kiri_chat_charge(struct kiri_chat_render *r, size_t bytes);
void *kiri_chat_alloc(struct kiri_chat_render *r, size_t n);

struct kiri_chat_value kiri_chat_str(const char *p, size_t n);
struct kiri_chat_value kiri_chat_bool(int b);
struct kiri_chat_value kiri_chat_int(int64_t i);
struct kiri_chat_value kiri_chat_undef(const char *name, size_t n);
/* A new string of n bytes in the arena (*p to fill), n checked against max_memory. */
int kiri_chat_new_str(struct kiri_chat_render *r, size_t n, char **p, struct kiri_chat_value *out);
int kiri_chat_new_list(struct kiri_chat_render *r, size_t n, int tuple, struct kiri_chat_value *out);
int kiri_chat_new_dict(struct kiri_chat_render *r, int ns, struct kiri_chat_value *out);
int kiri_chat_dict_set(struct kiri_chat_render *r, struct kiri_chat_dict *d,
                       struct kiri_chat_value k, struct kiri_chat_value v);
/* The value under key k, or NULL. */
const struct kiri_chat_value *kiri_chat_dict_get(const struct kiri_chat_dict *d,
                                                 struct kiri_chat_value k);

const char *kiri_chat_type_name(struct kiri_chat_value v);
int kiri_chat_truthy(struct kiri_chat_value v);
int kiri_chat_equal(struct kiri_chat_value a, struct kiri_chat_value b, int depth);
/* Python's a < b (*lt) for numbers, strings and sequences; an error for other types. */
int kiri_chat_less(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                   struct kiri_chat_value a, struct kiri_chat_value b, int *lt);
int kiri_chat_contains(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                       struct kiri_chat_value container, struct kiri_chat_value item, int *found);
/* The items of an iterable (list, tuple, dict keys, string characters; Undefined is empty). */
int kiri_chat_iterate(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                      struct kiri_chat_value v, const struct kiri_chat_value **items, size_t *n);
/* jinja2's getattr(obj, name): dict keys, namespace and loop attributes; Undefined if absent. */
int kiri_chat_getattr(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                      struct kiri_chat_value obj, const char *name, size_t len,
                      struct kiri_chat_value *out);
/* Byte buffers: kiri_chat_buf_put fails (recording the limit) past max_output or max_memory. */
int kiri_chat_buf_put(struct kiri_chat_render *r, struct kiri_chat_buf *b, const char *s, size_t n);
/* Moves the buffer's text into a string value in the arena and frees the buffer. */
int kiri_chat_buf_finish(struct kiri_chat_render *r, struct kiri_chat_buf *b,
                         struct kiri_chat_value *out);
void kiri_chat_buf_free(struct kiri_chat_buf *b);

/* ---- chat_template_text.c ---------------------------------------------------------------- */

/* Number of code points in a string. */
size_t kiri_chat_cp_len(const char *s, size_t n);
/* Appends Python's str(v) (repr 0) or repr(v) (repr 1). */
int kiri_chat_buf_value(struct kiri_chat_render *r, struct kiri_chat_buf *b,
                        struct kiri_chat_value v, int repr, int depth);
/* Python's str(v) (Undefined gives ""), as a value. */
int kiri_chat_to_str(struct kiri_chat_render *r, struct kiri_chat_value v,
                     struct kiri_chat_value *out);
/* Python's repr of a float (out needs 32 bytes). */
void kiri_chat_format_float(double d, char *out, size_t cap);

/* ---- chat_template_builtins.c: id is a filter or test id -------------------------------- */

int kiri_chat_filter(struct kiri_chat_render *r, const struct kiri_chat_expr *e, int id,
                     struct kiri_chat_value in, struct kiri_chat_args *a,
                     struct kiri_chat_value *out);
int kiri_chat_test(struct kiri_chat_render *r, const struct kiri_chat_expr *e, int id,
                   struct kiri_chat_value in, struct kiri_chat_args *a, int *result);
/* obj.name(args) for strings, dicts and loops; *handled 0 if obj has no such method. */
int kiri_chat_method(struct kiri_chat_render *r, const struct kiri_chat_expr *e,
                     struct kiri_chat_value obj, const char *name, size_t len,
                     struct kiri_chat_args *a, struct kiri_chat_value *out, int *handled);
int kiri_chat_call_func(struct kiri_chat_render *r, const struct kiri_chat_expr *e, int func,
                        struct kiri_chat_args *a, struct kiri_chat_value *out);

#endif
