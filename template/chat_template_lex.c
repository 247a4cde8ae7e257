/* Chat templates: the lexer. It reproduces jinja2's lexer under the settings transformers uses,
 * since byte-exact prompts depend on it: newlines are normalised to "\n" before lexing (see
 * kiri_chat_parse), a block or comment tag eats the newline right after it (trim_blocks),
 * spaces and tabs from the start of a line up to a block or comment tag are dropped
 * (lstrip_blocks), "-" inside a delimiter strips all whitespace on that side and "+" turns the
 * trimming off. Template data comes out with that whitespace control already applied; string
 * literals come out decoded (Python's escapes), numbers parsed.
 */
#include "chat_template_lex.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template_text.h"
#include "hex.h"
#include "kiri.h"
#include "utf8.h"

/* Records the first error; the lexer then produces only EOF. */
static void fail(struct kiri_chat_lexer *lx, size_t pos, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void fail(struct kiri_chat_lexer *lx, size_t pos, const char *fmt, ...)
{
    if (lx->failed)
        return;
    lx->failed = 1;
    lx->code = KIRI_E_UNSUPPORTED;
    lx->err_pos = pos;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(lx->err, sizeof lx->err, fmt, ap);
    va_end(ap);
}

static void *alloc(struct kiri_chat_lexer *lx, size_t n)
{
    void *m = kiri_chat_arena_alloc(lx->arena, n);
    if (!m && !lx->failed) {
        lx->failed = 1;
        lx->code = KIRI_E_NOMEM;
        lx->err_pos = lx->pos;
        snprintf(lx->err, sizeof lx->err, "out of memory");
    }
    return m;
}

static void push(struct kiri_chat_lexer *lx, int kind, size_t pos, const char *s, size_t n)
{
    struct kiri_chat_token *t = &lx->q[(lx->head + lx->count) % KIRI_CHAT_LEX_QUEUE];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->pos = pos;
    t->s = s;
    t->n = n;
    lx->count++;
}

/* The token pushed last, to fill in its value. */
static struct kiri_chat_token *last(struct kiri_chat_lexer *lx)
{
    return &lx->q[(lx->head + lx->count - 1) % KIRI_CHAT_LEX_QUEUE];
}

static size_t rstrip_len(const char *s, size_t n)
{
    size_t k;
    while (n > 0 && (k = kiri_chat_space_before(s, n)) > 0)
        n -= k;
    return n;
}

static size_t skip_space(const char *s, size_t n, size_t i)
{
    size_t k;
    while (i < n && (k = kiri_chat_space_at(s, n, i)) > 0)
        i += k;
    return i;
}

/* Length of text s[0..n) after the whitespace control a tag with `sign` asks for: "-" strips all
 * trailing whitespace; otherwise a block or comment tag (not a variable one) strips the spaces
 * before it when they are all that stands between the start of a line and the tag. */
static size_t strip_before_tag(const char *s, size_t n, char sign, char kind, int line_starting)
{
    if (sign == '-')
        return rstrip_len(s, n);
    if (sign == '+' || kind == '{')
        return n;
    size_t l = n;
    while (l > 0 && s[l - 1] != '\n')
        l--;
    if ((l > 0 || line_starting) && l < n && skip_space(s, n, l) == n)
        return l;
    return n;
}

static int starts(const char *s, size_t n, size_t i, const char *lit)
{
    size_t k = strlen(lit);
    return i + k <= n && memcmp(s + i, lit, k) == 0;
}

static int is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

static int is_name_char(char c)
{
    return is_name_start(c) || (c >= '0' && c <= '9');
}

/* Where `{% raw %}` (any sign, any spacing) ends if it starts at i, else 0. */
static size_t match_raw(const char *s, size_t n, size_t i, const char *word)
{
    size_t k = i + 2;
    if (k < n && (s[k] == '-' || s[k] == '+'))
        k++;
    k = skip_space(s, n, k);
    if (!starts(s, n, k, word))
        return 0;
    k = skip_space(s, n, k + strlen(word));
    if (starts(s, n, k, "-%}"))
        return skip_space(s, n, k + 3);
    if (starts(s, n, k, "%}"))
        return k + 2;
    return 0;
}

/* `{% endraw %}` at i: where it ends (with trim_blocks' newline), else 0. */
static size_t match_endraw(const char *s, size_t n, size_t i)
{
    size_t k = i + 2;
    if (k < n && (s[k] == '-' || s[k] == '+'))
        k++;
    k = skip_space(s, n, k);
    if (!starts(s, n, k, "endraw"))
        return 0;
    k = skip_space(s, n, k + 6);
    if (starts(s, n, k, "+%}"))
        return k + 3;
    if (starts(s, n, k, "-%}"))
        return skip_space(s, n, k + 3);
    if (starts(s, n, k, "%}"))
        return k + 2 + (k + 2 < n && s[k + 2] == '\n');
    return 0;
}

static char sign_at(const char *s, size_t n, size_t i)
{
    return i < n && (s[i] == '-' || s[i] == '+') ? s[i] : 0;
}

/* Template data up to the next tag, then the tag's opening token. Comments produce nothing. */
static void lex_root(struct kiri_chat_lexer *lx)
{
    const char *s = lx->src;
    size_t n = lx->len;
    for (;;) {
        size_t pos = lx->pos;
        if (pos >= n) {
            push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
            return;
        }
        size_t i = pos;
        while (i + 1 < n && !(s[i] == '{' && (s[i + 1] == '{' || s[i + 1] == '%' || s[i + 1] == '#')))
            i++;
        if (i + 1 >= n) {
            push(lx, KIRI_CHAT_TOK_DATA, pos, s + pos, n - pos);
            lx->pos = n;
            return;
        }
        char kind = s[i + 1], sign = sign_at(s, n, i + 2);
        size_t raw_end = kind == '%' ? match_raw(s, n, i, "raw") : 0;
        size_t tlen = strip_before_tag(s + pos, i - pos, sign, kind, lx->line_starting);
        if (tlen)
            push(lx, KIRI_CHAT_TOK_DATA, pos, s + pos, tlen);
        if (kind == '#') {
            size_t k = i + 2 + (sign != 0), end = 0;
            for (; k + 1 < n && !end; k++) {
                if (s[k] == '+' && starts(s, n, k + 1, "#}"))
                    end = k + 3;
                else if (s[k] == '-' && starts(s, n, k + 1, "#}"))
                    end = skip_space(s, n, k + 3);
                else if (s[k] == '#' && s[k + 1] == '}')
                    end = k + 2 + (k + 2 < n && s[k + 2] == '\n');
            }
            if (!end) {
                fail(lx, i, "missing end of comment tag");
                push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
                return;
            }
            lx->pos = end;
            lx->line_starting = s[end - 1] == '\n';
            if (tlen)
                return;
            continue;
        }
        if (raw_end) {
            size_t k = raw_end, end = 0;
            for (; k + 1 < n; k++)
                if (s[k] == '{' && s[k + 1] == '%' && (end = match_endraw(s, n, k)) > 0)
                    break;
            if (!end) {
                fail(lx, i, "missing end of raw directive");
                push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
                return;
            }
            size_t blen = strip_before_tag(s + raw_end, k - raw_end, sign_at(s, n, k + 2),
                                           '%', s[raw_end - 1] == '\n');
            lx->pos = end;
            lx->line_starting = s[end - 1] == '\n';
            if (blen)
                push(lx, KIRI_CHAT_TOK_DATA, raw_end, s + raw_end, blen);
            if (tlen || blen)
                return;
            continue;
        }
        lx->pos = i + 2 + (sign != 0);
        lx->state = kind == '{' ? KIRI_CHAT_LEX_VAR : KIRI_CHAT_LEX_BLOCK;
        push(lx, kind == '{' ? KIRI_CHAT_TOK_VAR_BEGIN : KIRI_CHAT_TOK_BLOCK_BEGIN, i, NULL, 0);
        return;
    }
}

/* Decodes a string literal's body s[0..n) the way jinja2 does (Python's "unicode-escape" codec
 * applied after non-ASCII characters were turned into \x, \u or \U escapes), into the arena.
 * The output is never longer than 3 bytes per input byte plus a little. */
static int decode_string(struct kiri_chat_lexer *lx, size_t pos, const char *s, size_t n, struct kiri_chat_token *t)
{
    char *o = alloc(lx, n * 3 + 16);
    if (!o)
        return -1;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\') {
            o[k++] = s[i++];
            continue;
        }
        /* the lexer only accepts a backslash followed by some character */
        char c = s[i + 1];
        i += 2;
        if ((unsigned char)c >= 0x80) {
            /* "\é" is "\\xe9" to the codec: a backslash, then the escape's text */
            uint32_t cp;
            size_t len = kiri_utf8_decode(s + i - 1, n - (i - 1), &cp);
            i += len - 1;
            o[k++] = '\\';
            k += (size_t)sprintf(o + k, cp < 0x100 ? "x%02x" : cp < 0x10000 ? "u%04x" : "U%08x",
                                 (unsigned)cp);
            continue;
        }
        uint32_t cp = 0;
        int digits = 0;
        switch (c) {
        case '\n': break;
        case '\\': o[k++] = '\\'; break;
        case '\'': o[k++] = '\''; break;
        case '"': o[k++] = '"'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'n': o[k++] = '\n'; break;
        case 'r': o[k++] = '\r'; break;
        case 't': o[k++] = '\t'; break;
        case 'v': o[k++] = '\v'; break;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N':
            fail(lx, pos, "\\N{...} escapes in strings are not supported");
            return -1;
        default:
            if (c >= '0' && c <= '7') {
                cp = (uint32_t)(c - '0');
                for (int j = 0; j < 2 && i < n && s[i] >= '0' && s[i] <= '7'; j++)
                    cp = cp * 8 + (uint32_t)(s[i++] - '0');
                k += kiri_utf8_encode(cp, o + k);
            } else {
                o[k++] = '\\';
                o[k++] = c;
            }
        }
        if (digits) {
            for (int j = 0; j < digits; j++) {
                int h = i < n ? kiri_hex_digit(s[i]) : -1;
                if (h < 0) {
                    fail(lx, pos, "truncated \\%c escape in a string", c);
                    return -1;
                }
                cp = cp * 16 + (uint32_t)h;
                i++;
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) {
                fail(lx, pos, "string escape \\%c for an invalid character", c);
                return -1;
            }
            if (cp == 0) {
                fail(lx, pos, "NUL characters in strings are not supported");
                return -1;
            }
            k += kiri_utf8_encode(cp, o + k);
        } else if (c >= '0' && c <= '7' && cp == 0) {
            fail(lx, pos, "NUL characters in strings are not supported");
            return -1;
        }
    }
    t->s = o;
    t->n = k;
    return 0;
}

/* Reads digits with single underscores between them (Python's 1_000); returns the end. */
static size_t digits_end(const char *s, size_t n, size_t i, int base)
{
    size_t k = i;
    for (;;) {
        size_t j = k;
        if (j > i && j < n && s[j] == '_')
            j++;
        if (j < n && kiri_hex_digit(s[j]) >= 0 && kiri_hex_digit(s[j]) < base)
            k = j + 1;
        else
            return k;
    }
}

static int lex_number(struct kiri_chat_lexer *lx, size_t i)
{
    const char *s = lx->src;
    size_t n = lx->len;
    /* A float: digits then a fraction and/or an exponent; never right after a dot. */
    size_t d = digits_end(s, n, i, 10), e = 0;
    if (i == 0 || s[i - 1] != '.') {
        size_t k = d;
        int frac = 0;
        if (k + 1 < n && s[k] == '.' && s[k + 1] >= '0' && s[k + 1] <= '9') {
            k = digits_end(s, n, k + 1, 10);
            frac = 1;
        }
        size_t x = k;
        if (x < n && (s[x] == 'e' || s[x] == 'E')) {
            x++;
            if (x < n && (s[x] == '+' || s[x] == '-'))
                x++;
            if (x < n && s[x] >= '0' && s[x] <= '9')
                k = digits_end(s, n, x, 10), frac = 1;
        }
        if (frac)
            e = k;
    }
    char buf[128];
    if (e) {
        size_t m = 0;
        for (size_t j = i; j < e && m + 1 < sizeof buf; j++)
            if (s[j] != '_')
                buf[m++] = s[j];
        buf[m] = '\0';
        push(lx, KIRI_CHAT_TOK_FLOAT, i, s + i, e - i);
        last(lx)->f = strtod(buf, NULL);
        lx->pos = e;
        return 0;
    }
    int base = 10;
    size_t start = i, end;
    if (s[i] == '0' && i + 1 < n && strchr("bBoOxX", s[i + 1])) {
        char b = (char)(s[i + 1] | 0x20);
        base = b == 'b' ? 2 : b == 'o' ? 8 : 16;
        start = i + 2;
        if (start < n && s[start] == '_')
            start++;
        end = digits_end(s, n, start, base);
        if (end == start)
            return fail(lx, i, "invalid number literal"), -1;
    } else if (s[i] == '0') {
        end = i + 1;
        while (end < n && (s[end] == '0' || (s[end] == '_' && end + 1 < n && s[end + 1] == '0')))
            end++;
    } else {
        end = d;
    }
    uint64_t v = 0;
    for (size_t j = start; j < end; j++) {
        if (s[j] == '_')
            continue;
        uint64_t digit = (uint64_t)kiri_hex_digit(s[j]);
        if (v > ((uint64_t)INT64_MAX - digit) / (uint64_t)base)
            return fail(lx, i, "integer literal out of range"), -1;
        v = v * (uint64_t)base + digit;
    }
    push(lx, KIRI_CHAT_TOK_INT, i, s + i, end - i);
    last(lx)->i = (int64_t)v;
    lx->pos = end;
    return 0;
}

/* One token inside {{ }} or {% %}. */
static void lex_tag(struct kiri_chat_lexer *lx)
{
    const char *s = lx->src;
    size_t n = lx->len;
    for (;;) {
        size_t i = lx->pos;
        if (i >= n) {
            fail(lx, i, "unexpected end of template inside a tag");
            push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
            return;
        }
        if (lx->n_brackets == 0) {
            size_t end = 0;
            if (lx->state == KIRI_CHAT_LEX_BLOCK) {
                if (starts(s, n, i, "+%}"))
                    end = i + 3;
                else if (starts(s, n, i, "-%}"))
                    end = skip_space(s, n, i + 3);
                else if (starts(s, n, i, "%}"))
                    end = i + 2 + (i + 2 < n && s[i + 2] == '\n');
            } else {
                if (starts(s, n, i, "-}}"))
                    end = skip_space(s, n, i + 3);
                else if (starts(s, n, i, "}}"))
                    end = i + 2;
            }
            if (end) {
                push(lx, lx->state == KIRI_CHAT_LEX_BLOCK ? KIRI_CHAT_TOK_BLOCK_END : KIRI_CHAT_TOK_VAR_END, i, NULL, 0);
                lx->pos = end;
                lx->line_starting = s[end - 1] == '\n';
                lx->state = KIRI_CHAT_LEX_ROOT;
                return;
            }
        }
        size_t k = kiri_chat_space_at(s, n, i);
        if (k) {
            lx->pos = i + k;
            continue;
        }
        char c = s[i];
        if (c >= '0' && c <= '9') {
            if (lex_number(lx, i) < 0)
                push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
            return;
        }
        if (is_name_start(c)) {
            size_t e = i + 1;
            while (e < n && is_name_char(s[e]))
                e++;
            if (e < n && (unsigned char)s[e] >= 0x80) {
                fail(lx, i, "non-ASCII identifiers are not supported");
                push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
                return;
            }
            push(lx, KIRI_CHAT_TOK_NAME, i, s + i, e - i);
            lx->pos = e;
            return;
        }
        if (c == '\'' || c == '"') {
            size_t e = i + 1;
            while (e < n && s[e] != c)
                e += s[e] == '\\' ? 2 : 1;
            if (e >= n) {
                fail(lx, i, "unterminated string");
                push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
                return;
            }
            push(lx, KIRI_CHAT_TOK_STRING, i, NULL, 0);
            if (decode_string(lx, i, s + i + 1, e - i - 1, last(lx)) < 0)
                last(lx)->kind = KIRI_CHAT_TOK_EOF;
            lx->pos = e + 1;
            return;
        }
        static const struct { const char *s; int op; } two[] = {
            {"//", KIRI_CHAT_TOK_FLOORDIV}, {"**", KIRI_CHAT_TOK_POW}, {"==", KIRI_CHAT_TOK_EQ},
            {"!=", KIRI_CHAT_TOK_NE},       {">=", KIRI_CHAT_TOK_GE},  {"<=", KIRI_CHAT_TOK_LE},
        };
        for (size_t j = 0; j < sizeof two / sizeof two[0]; j++) {
            if (starts(s, n, i, two[j].s)) {
                push(lx, KIRI_CHAT_TOK_OP, i, s + i, 2);
                last(lx)->op = two[j].op;
                lx->pos = i + 2;
                return;
            }
        }
        if (!strchr("+-/*%~[](){}><=.:|,;", c) || c == '\0') {
            if ((unsigned char)c >= 0x80)
                fail(lx, i, "unexpected non-ASCII character in a tag");
            else
                fail(lx, i, "unexpected character '%c'", c);
            push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
            return;
        }
        if (c == '(' || c == '[' || c == '{') {
            if (lx->n_brackets >= KIRI_CHAT_MAX_DEPTH) {
                fail(lx, i, "brackets nested too deeply");
                push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
                return;
            }
            lx->brackets[lx->n_brackets++] = c == '(' ? ')' : c == '[' ? ']' : '}';
        } else if (c == ')' || c == ']' || c == '}') {
            if (lx->n_brackets == 0 || lx->brackets[lx->n_brackets - 1] != c) {
                if (lx->n_brackets == 0)
                    fail(lx, i, "unexpected '%c'", c);
                else
                    fail(lx, i, "unexpected '%c', expected '%c'", c, lx->brackets[lx->n_brackets - 1]);
                push(lx, KIRI_CHAT_TOK_EOF, n, NULL, 0);
                return;
            }
            lx->n_brackets--;
        }
        push(lx, KIRI_CHAT_TOK_OP, i, s + i, 1);
        last(lx)->op = c;
        lx->pos = i + 1;
        return;
    }
}

void kiri_chat_lex_init(struct kiri_chat_lexer *lx, const char *src, size_t len,
                        struct kiri_chat_arena *arena)
{
    memset(lx, 0, sizeof *lx);
    lx->src = src;
    lx->len = len;
    lx->arena = arena;
    lx->line_starting = 1;
}

void kiri_chat_lex_next(struct kiri_chat_lexer *lx, struct kiri_chat_token *t)
{
    while (lx->count == 0) {
        if (lx->failed)
            push(lx, KIRI_CHAT_TOK_EOF, lx->len, NULL, 0);
        else if (lx->state == KIRI_CHAT_LEX_ROOT)
            lex_root(lx);
        else
            lex_tag(lx);
    }
    *t = lx->q[lx->head];
    lx->head = (lx->head + 1) % KIRI_CHAT_LEX_QUEUE;
    lx->count--;
}
