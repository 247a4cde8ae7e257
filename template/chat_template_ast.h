/* The parsed form of a chat template and what it takes to make it: shared by the lexer
 * (chat_template_lex.c), the parser (chat_template.c), the evaluator (chat_template_eval.c,
 * chat_template_builtins.c) and the text helpers (chat_template_text.c); nothing else includes
 * this header.
 *
 * Invariants. Every node and string reachable from a struct kiri_chat_template lives in the
 * template's arena and is never written after kiri_chat_template_init returns, so any number of
 * threads may render one template at once. Strings are UTF-8 byte ranges (pointer and length),
 * not NUL-terminated, and always valid UTF-8: the source is checked before it is parsed. An
 * expression tree is at most KIRI_CHAT_MAX_DEPTH nodes deep and statements nest at most
 * KIRI_CHAT_MAX_DEPTH deep (the parser refuses deeper ones), which bounds the evaluator's
 * recursion. Filter and test names are resolved to ids at parse time, so an unknown one is a
 * parse error, as it is in Jinja.
 */
#ifndef KIRI_CHAT_TEMPLATE_AST_H
#define KIRI_CHAT_TEMPLATE_AST_H

#include <stddef.h>
#include <stdint.h>

/* Deepest expression tree or statement nesting the parser accepts. */
#define KIRI_CHAT_MAX_DEPTH 200

/* ---------------------------------------------------------------------------------------------
 * Arena: every allocation of a parse or of a render comes from one, and is freed all at once
 * ------------------------------------------------------------------------------------------- */

struct kiri_chat_chunk;

struct kiri_chat_arena {
    struct kiri_chat_chunk *head; /* owned: the chunk being filled, then older ones */
    size_t used;                  /* bytes of chunks held, counted against cap */
    size_t cap;                   /* no allocation may take used beyond this */
    int hit_cap;                  /* the last failure was the cap, not the allocator */
};

/* Zeroed memory, aligned for any type, or NULL (hit_cap says why). */
void *kiri_chat_arena_alloc(struct kiri_chat_arena *a, size_t n);
void kiri_chat_arena_free(struct kiri_chat_arena *a);

/* ---------------------------------------------------------------------------------------------
 * UTF-8 and Python's idea of whitespace (str.isspace, the regex \s), which strip(), split(),
 * trim and Jinja's whitespace control all use
 * ------------------------------------------------------------------------------------------- */

/* Byte length of the whitespace character starting at s[i], or 0. */
size_t kiri_chat_space_at(const char *s, size_t n, size_t i);
/* Byte length of the whitespace character ending just before s[i], or 0. */
size_t kiri_chat_space_before(const char *s, size_t i);
/* Is s[0..n) valid UTF-8 (kiri_utf8_valid) without NUL bytes? */
int kiri_chat_utf8_valid(const char *s, size_t n);

/* ---------------------------------------------------------------------------------------------
 * Lexer (chat_template_lex.c), used by the parser (chat_template.c)
 * ------------------------------------------------------------------------------------------- */

enum kiri_chat_tok {
    KIRI_CHAT_TOK_EOF,
    KIRI_CHAT_TOK_DATA,        /* template text, whitespace control applied */
    KIRI_CHAT_TOK_VAR_BEGIN,   /* {{ */
    KIRI_CHAT_TOK_VAR_END,     /* }} */
    KIRI_CHAT_TOK_BLOCK_BEGIN, /* {% */
    KIRI_CHAT_TOK_BLOCK_END,   /* %} */
    KIRI_CHAT_TOK_NAME,
    KIRI_CHAT_TOK_STRING,
    KIRI_CHAT_TOK_INT,
    KIRI_CHAT_TOK_FLOAT,
    KIRI_CHAT_TOK_OP
};

/* Operator codes of OP tokens: one-character operators are the character itself, two-character
 * ones these codes, outside the ASCII range. */
enum {
    KIRI_CHAT_TOK_FLOORDIV = 256, /* // */
    KIRI_CHAT_TOK_POW,            /* ** */
    KIRI_CHAT_TOK_EQ,             /* == */
    KIRI_CHAT_TOK_NE,             /* != */
    KIRI_CHAT_TOK_GE,             /* >= */
    KIRI_CHAT_TOK_LE              /* <= */
};

struct kiri_chat_token {
    int kind;      /* enum kiri_chat_tok */
    int op;        /* OP: the operator code */
    size_t pos;    /* byte offset in the normalised source */
    const char *s; /* DATA, NAME: borrowed from the source; STRING: decoded, in the arena */
    size_t n;
    int64_t i;     /* INT */
    double f;      /* FLOAT */
};

enum { KIRI_CHAT_LEX_ROOT, KIRI_CHAT_LEX_BLOCK, KIRI_CHAT_LEX_VAR };

#define KIRI_CHAT_LEX_QUEUE 4

/* Lexer state; its fields are private to chat_template_lex.c except failed, code, err_pos and
 * err, which describe the first error. */
struct kiri_chat_lexer {
    const char *src; /* borrowed: the normalised source */
    size_t len, pos;
    int state;                          /* KIRI_CHAT_LEX_ROOT, _BLOCK or _VAR */
    int line_starting;                  /* the last thing lexed ended a line (for lstrip_blocks) */
    char brackets[KIRI_CHAT_MAX_DEPTH]; /* closers expected inside a tag, innermost last */
    int n_brackets;
    struct kiri_chat_arena *arena;      /* borrowed: where string literals are decoded to */
    struct kiri_chat_token q[KIRI_CHAT_LEX_QUEUE]; /* tokens made but not yet taken */
    int head, count;
    int failed, code;
    size_t err_pos;
    char err[160];
};

void kiri_chat_lex_init(struct kiri_chat_lexer *lx, const char *src, size_t len,
                        struct kiri_chat_arena *arena);
/* The next token; after an error (failed set), KIRI_CHAT_TOK_EOF forever. */
void kiri_chat_lex_next(struct kiri_chat_lexer *lx, struct kiri_chat_token *t);

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
    int32_t id;        /* FILTER, TEST: the builtin's id */
    int32_t n_args;
    const char *name;  /* NAME, GETATTR, FILTER, TEST: the name; CONST STR: the value */
    size_t name_len;
    int64_t i;         /* CONST BOOL and INT */
    double f;          /* CONST FLOAT */
    struct kiri_chat_expr *a, *b, *c;
    struct kiri_chat_arg *args; /* n_args of them */
};

/* Filter and test ids by name (enum values private to the evaluator), or -1 if unknown. */
int kiri_chat_filter_id(const char *name, size_t len);
int kiri_chat_test_id(const char *name, size_t len);

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
    KIRI_CHAT_STMT_BLOCK      /* body run as is ({% generation %} from transformers) */
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
    struct kiri_chat_target *targets; /* FOR, SET, SET_BLOCK: n_targets of them */
    int n_targets;
};

struct kiri_chat_template {
    struct kiri_chat_arena arena; /* owns the source copy and every node */
    const char *src;              /* the normalised source (see chat_template.c) */
    size_t len;
    struct kiri_chat_stmt *body;
};

#endif
