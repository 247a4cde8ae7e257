/* Chat templates: the values a render computes with, and the render's resources they are made
 * from. Values follow Python's data model as jinja2 exposes it, closely enough for
 * byte-identical output: ints are int64 (overflow is an error, not a bigint), strings are
 * immutable UTF-8 slices indexed by code point, lists/tuples and dicts are immutable once built
 * (the sandbox forbids mutation), and only namespace() objects can change, through
 * {% set ns.x = ... %}. Every value lives in the render's arena (or is borrowed from the template
 * or the messages, which outlive the render) and is freed with it, so values are copied freely by
 * value and nothing is reference-counted.
 *
 * This module owns making values (within max_memory, counting steps), dicts, Python's truth,
 * equality, ordering, `in`, iteration and attribute lookup, str() and repr(), the text buffers
 * (within max_output), and the recording of the first error. It knows nothing of the template's
 * syntax: an error's place in the source is a byte offset, `at` (KIRI_CHAT_NOWHERE for none).
 *
 * Functions returning int return 0 or -1; after -1 the status is r->code and the message is in
 * r->info.
 */
#ifndef KIRI_CHAT_TEMPLATE_VALUE_H
#define KIRI_CHAT_TEMPLATE_VALUE_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "chat_template_arena.h"

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
    KIRI_CHAT_TYPE_FUNC,         /* a global function; i is its id among the built-ins */
    KIRI_CHAT_TYPE_MACRO         /* a {% macro %}; macro is its statement in the template */
};

struct kiri_chat_stmt;

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
        const struct kiri_chat_stmt *macro;
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

/* The resources and the error state of one render, shared by every module that evaluates. */
struct kiri_chat_render {
    struct kiri_chat_arena arena; /* every value of this render */
    const char *src;              /* the template's normalised source, for line and column */
    size_t produced, max_output, max_memory;
    uint64_t steps, max_steps;
    struct kiri_status_info *info;
    int code; /* status of the first error, 0 while none */
};

/* `at` for an error with no place in the source. */
#define KIRI_CHAT_NOWHERE ((int64_t)-1)

/* ---- errors, work and memory ----------------------------------------------------------- */

/* Records an evaluation error at byte offset at of the source as KIRI_E_UNSUPPORTED. */
int kiri_chat_fail(struct kiri_chat_render *r, int64_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Records a failure with an explicit code and field (limits, raise_exception). */
int kiri_chat_fail_code(struct kiri_chat_render *r, int code, const char *field, const char *fmt,
                        ...) __attribute__((format(printf, 4, 5)));
/* The max_memory failure. */
int kiri_chat_memory_limit(struct kiri_chat_render *r);
/* Counts evaluation work: n steps, or one per 256 bytes scanned or copied. */
int kiri_chat_step(struct kiri_chat_render *r, uint64_t n);
int kiri_chat_charge(struct kiri_chat_render *r, size_t bytes);
void *kiri_chat_alloc(struct kiri_chat_render *r, size_t n);

/* ---- making values --------------------------------------------------------------------- */

struct kiri_chat_value kiri_chat_str(const char *p, size_t n);
struct kiri_chat_value kiri_chat_bool(int b);
struct kiri_chat_value kiri_chat_int(int64_t i);
struct kiri_chat_value kiri_chat_float(double f);
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

/* ---- Python's semantics ---------------------------------------------------------------- */

const char *kiri_chat_type_name(struct kiri_chat_value v);
/* bool, int or float */
int kiri_chat_is_number(struct kiri_chat_value v);
/* A number's value as a double. */
double kiri_chat_number(struct kiri_chat_value v);
int kiri_chat_truthy(struct kiri_chat_value v);
int kiri_chat_equal(struct kiri_chat_value a, struct kiri_chat_value b, int depth);

enum kiri_chat_order { KIRI_CHAT_LT, KIRI_CHAT_LE, KIRI_CHAT_GT, KIRI_CHAT_GE };
/* Python's a < b, a <= b, a > b or a >= b (*res) for numbers, strings and sequences; an error
 * for other types. */
int kiri_chat_compare(struct kiri_chat_render *r, int64_t at, enum kiri_chat_order op,
                      struct kiri_chat_value a, struct kiri_chat_value b, int *res);
int kiri_chat_less(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value a,
                   struct kiri_chat_value b, int *lt);
int kiri_chat_contains(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value container,
                       struct kiri_chat_value item, int *found);
/* The items of an iterable (list, tuple, dict keys, string characters; Undefined is empty). */
int kiri_chat_iterate(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value v,
                      const struct kiri_chat_value **items, size_t *n);
/* jinja2's getattr(obj, name): dict keys, namespace and loop attributes; Undefined if absent. */
int kiri_chat_getattr(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value obj,
                      const char *name, size_t len, struct kiri_chat_value *out);
/* The error for using Undefined u as a value. */
int kiri_chat_undefined_error(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value u);

/* ---- text ------------------------------------------------------------------------------ */

/* Appends s[0..n): fails (recording the limit) past max_output or max_memory. */
int kiri_chat_buf_put(struct kiri_chat_render *r, struct kiri_chat_buf *b, const char *s, size_t n);
int kiri_chat_buf_puts(struct kiri_chat_render *r, struct kiri_chat_buf *b, const char *s);
/* Moves the buffer's text into a string value in the arena and frees the buffer. */
int kiri_chat_buf_finish(struct kiri_chat_render *r, struct kiri_chat_buf *b,
                         struct kiri_chat_value *out);
void kiri_chat_buf_free(struct kiri_chat_buf *b);
/* Appends Python's str(v) (repr 0) or repr(v) (repr 1). */
int kiri_chat_buf_value(struct kiri_chat_render *r, struct kiri_chat_buf *b,
                        struct kiri_chat_value v, int repr, int depth);
/* Python's str(v) (Undefined gives ""), as a value. */
int kiri_chat_to_str(struct kiri_chat_render *r, struct kiri_chat_value v,
                     struct kiri_chat_value *out);

#endif
