/* Chat templates: the parser and the tree it makes (the AST), which the evaluator runs.
 *
 * Invariants. Every node and string reachable from a struct kiri_chat_template lives in the
 * template's arena and is never written after kiri_chat_parse returns, so any number of threads
 * may render one template at once. Strings are UTF-8 byte ranges (pointer and length), not
 * NUL-terminated, and always valid UTF-8: the source is checked before it is parsed. An
 * expression tree is at most KIRI_CHAT_MAX_DEPTH nodes deep and statements nest at most
 * KIRI_CHAT_MAX_DEPTH deep (the parser refuses deeper ones), which bounds the evaluator's
 * recursion. Filter and test names are resolved when the template is parsed, through
 * struct kiri_chat_names, so an unknown one is a parse error, as it is in Jinja; the parser
 * itself knows no built-in.
 */
#ifndef KIRI_CHAT_TEMPLATE_PARSE_H
#define KIRI_CHAT_TEMPLATE_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template_arena.h"
#include "chat_template_lex.h"

struct kiri_status_info;

/* ---------------------------------------------------------------------------------------------
 * Expressions
 * ------------------------------------------------------------------------------------------- */

enum kiri_chat_expr_kind {
    KIRI_CHAT_EXPR_CONST,   /* op: enum kiri_chat_const; i, f or name as the value */
    KIRI_CHAT_EXPR_NAME,    /* name */
    KIRI_CHAT_EXPR_GETATTR, /* a.name */
    KIRI_CHAT_EXPR_GETITEM, /* a[b] */
    KIRI_CHAT_EXPR_SLICE,   /* a:b:c inside a GETITEM's b; any of them may be NULL */
    KIRI_CHAT_EXPR_CALL,    /* a(args) */
    KIRI_CHAT_EXPR_FILTER,  /* a|name(args), id resolved; a NULL: the body of a {% set %} block */
    KIRI_CHAT_EXPR_TEST,    /* a is name(args), id resolved */
    KIRI_CHAT_EXPR_NOT,     /* not a */
    KIRI_CHAT_EXPR_NEG,     /* -a */
    KIRI_CHAT_EXPR_POS,     /* +a */
    KIRI_CHAT_EXPR_BINARY,  /* a op b, op an enum kiri_chat_op arithmetic operator */
    KIRI_CHAT_EXPR_AND,     /* a and b */
    KIRI_CHAT_EXPR_OR,      /* a or b */
    KIRI_CHAT_EXPR_COMPARE, /* a args[0].op args[0].e args[1].op ... (Python chaining) */
    KIRI_CHAT_EXPR_COND,    /* a if b else c (c NULL: undefined) */
    KIRI_CHAT_EXPR_LIST,    /* [args...] */
    KIRI_CHAT_EXPR_TUPLE,   /* (args...) */
    KIRI_CHAT_EXPR_DICT,    /* {args[0]: args[1], ...} */
    KIRI_CHAT_EXPR_CONCAT   /* args[0] ~ args[1] ~ ... */
};

enum kiri_chat_const {
    KIRI_CHAT_CONST_NONE,
    KIRI_CHAT_CONST_BOOL,
    KIRI_CHAT_CONST_INT,
    KIRI_CHAT_CONST_FLOAT,
    KIRI_CHAT_CONST_STR
};

enum kiri_chat_op {
    KIRI_CHAT_OP_ADD,
    KIRI_CHAT_OP_SUB,
    KIRI_CHAT_OP_MUL,
    KIRI_CHAT_OP_DIV,
    KIRI_CHAT_OP_FLOORDIV,
    KIRI_CHAT_OP_MOD,
    KIRI_CHAT_OP_POW,
    KIRI_CHAT_OP_EQ,
    KIRI_CHAT_OP_NE,
    KIRI_CHAT_OP_LT,
    KIRI_CHAT_OP_LE,
    KIRI_CHAT_OP_GT,
    KIRI_CHAT_OP_GE,
    KIRI_CHAT_OP_IN,
    KIRI_CHAT_OP_NOTIN
};

/* One argument of a call, filter or test, one element of a list, tuple or dict literal, or one
 * operand of a comparison. kw is the keyword of a keyword argument, else NULL. */
struct kiri_chat_arg {
    const char *kw; /* borrowed from the template source */
    size_t kw_len;
    int op;         /* COMPARE only: enum kiri_chat_op */
    struct kiri_chat_expr *e;
};

struct kiri_chat_expr {
    uint8_t kind;      /* enum kiri_chat_expr_kind */
    uint8_t op;        /* by kind: see enum kiri_chat_expr_kind */
    uint16_t depth;    /* 1 + the depth of the deepest operand */
    uint32_t pos;      /* byte offset in the normalised source, for error messages */
    int32_t id;        /* FILTER, TEST: what struct kiri_chat_names resolved the name to */
    int32_t n_args;
    const char *name;  /* NAME, GETATTR, FILTER, TEST: the name; CONST STR: the value */
    size_t name_len;
    int64_t i;         /* CONST BOOL and INT */
    double f;          /* CONST FLOAT */
    struct kiri_chat_expr *a, *b, *c;
    struct kiri_chat_arg *args; /* n_args of them */
};

/* ---------------------------------------------------------------------------------------------
 * Statements: a body is a linked list of them
 * ------------------------------------------------------------------------------------------- */

enum kiri_chat_stmt_kind {
    KIRI_CHAT_STMT_TEXT,      /* text: template data, whitespace control already applied */
    KIRI_CHAT_STMT_PRINT,     /* {{ expr }} */
    KIRI_CHAT_STMT_IF,        /* if expr: body, else orelse (an elif is an IF inside orelse) */
    KIRI_CHAT_STMT_FOR,       /* for targets in expr [if cond]: body, else orelse */
    KIRI_CHAT_STMT_SET,       /* set targets = expr */
    KIRI_CHAT_STMT_SET_BLOCK, /* set targets[0] [| filter] %}body{% endset */
    KIRI_CHAT_STMT_BREAK,
    KIRI_CHAT_STMT_CONTINUE,
    KIRI_CHAT_STMT_BLOCK,     /* body run as is ({% generation %} from transformers) */
    KIRI_CHAT_STMT_MACRO      /* macro text(targets = defaults): body; only at the top level */
};

/* An assignment target: a name, or a namespace attribute name.attr (attr non-NULL). */
struct kiri_chat_target {
    const char *name; /* borrowed from the template source */
    size_t name_len;
    const char *attr;
    size_t attr_len;
};

struct kiri_chat_stmt {
    uint8_t kind; /* enum kiri_chat_stmt_kind */
    uint32_t pos; /* byte offset in the normalised source */
    struct kiri_chat_stmt *next;
    const char *text; /* TEXT: borrowed from the normalised source */
    size_t text_len;
    struct kiri_chat_expr *expr;   /* PRINT, IF, FOR (the sequence), SET */
    struct kiri_chat_expr *cond;   /* FOR: the inline filter, or NULL */
    struct kiri_chat_expr *filter; /* SET_BLOCK: filters applied to the body's text, or NULL */
    struct kiri_chat_stmt *body, *orelse;
    struct kiri_chat_target *targets; /* FOR, SET, SET_BLOCK, MACRO (parameters): n_targets */
    int n_targets;
    struct kiri_chat_expr **defaults; /* MACRO: each parameter's default, or NULL */
};

/* Most parameters a macro may declare. */
#define KIRI_CHAT_MAX_PARAMS 16

struct kiri_chat_template {
    struct kiri_chat_arena arena; /* owns the source copy and every node */
    const char *src;              /* the normalised source (see kiri_chat_parse) */
    size_t len;
    struct kiri_chat_stmt *body;
};

/* How the parser resolves filter and test names: each returns an id >= 0 that it stores in the
 * node (struct kiri_chat_expr id), or -1 for a name that does not exist. */
struct kiri_chat_names {
    int (*filter)(const char *name, size_t len);
    int (*test)(const char *name, size_t len);
};

/* Parses src[0..len) (valid UTF-8 without NUL bytes) into t (zeroed), whose arena then owns a
 * normalised copy of the source and every node. Returns 0, or KIRI_E_UNSUPPORTED (a syntax
 * error or a feature outside the subset: "line L, column C" in info's message, the byte offset
 * in info->offset) or KIRI_E_NOMEM; on failure the caller frees t->arena. */
int kiri_chat_parse(struct kiri_chat_template *t, const char *src, size_t len,
                    const struct kiri_chat_names *names, struct kiri_status_info *info);

#endif
