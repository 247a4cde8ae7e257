/* Chat templates: the lexer's interface, used by the parser. Tokens carry byte offsets into the
 * normalised source (see chat_template_parse.c) for error messages; names and template data are
 * borrowed from the source, string literals are decoded into the parse's arena.
 */
#ifndef KIRI_CHAT_TEMPLATE_LEX_H
#define KIRI_CHAT_TEMPLATE_LEX_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template_arena.h"

/* Deepest expression tree, statement nesting or bracket nesting a template may have. */
#define KIRI_CHAT_MAX_DEPTH 200

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

#endif
