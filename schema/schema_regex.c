#include "schema_regex.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "kiri.h"
#include "utf8.h"

#define MAX_RANGES 256
#define MAX_GROUP_DEPTH 32
#define CP_MAX 0x10FFFFu

/* A set of code points as sorted, disjoint, non-adjacent ranges. */
struct cset {
    uint32_t lo[MAX_RANGES], hi[MAX_RANGES];
    int n;
};

struct rx {
    const char *s;
    size_t len, pos;
    const char *any_char;
    struct kiri_buf *out;
    char *err;
    size_t err_cap;
    int depth;
};

static int rx_fail(struct rx *r, int code, const char *what)
{
    snprintf(r->err, r->err_cap, "%s (at offset %zu of the pattern)", what, r->pos);
    return code;
}

static int at_end(const struct rx *r)
{
    return r->pos >= r->len;
}

static int peek(const struct rx *r)
{
    return at_end(r) ? -1 : (unsigned char)r->s[r->pos];
}

static uint32_t next_cp(struct rx *r)
{
    uint32_t cp;
    r->pos += kiri_utf8_decode(r->s + r->pos, r->len - r->pos, &cp);
    return cp;
}

/* ---- code-point sets ---- */

static int cset_add(struct cset *c, uint32_t lo, uint32_t hi)
{
    if (lo > hi)
        return 0;
    /* Insert keeping order, then merge overlapping or adjacent neighbours. */
    int i = 0;
    while (i < c->n && c->lo[i] < lo)
        i++;
    if (c->n >= MAX_RANGES)
        return -1;
    memmove(c->lo + i + 1, c->lo + i, (size_t)(c->n - i) * sizeof c->lo[0]);
    memmove(c->hi + i + 1, c->hi + i, (size_t)(c->n - i) * sizeof c->hi[0]);
    c->lo[i] = lo;
    c->hi[i] = hi;
    c->n++;
    int w = 0;
    for (int k = 1; k < c->n; k++) {
        if (c->lo[k] <= c->hi[w] + 1) {
            if (c->hi[k] > c->hi[w])
                c->hi[w] = c->hi[k];
        } else {
            w++;
            c->lo[w] = c->lo[k];
            c->hi[w] = c->hi[k];
        }
    }
    c->n = w + 1;
    return 0;
}

static int cset_complement(struct cset *c)
{
    struct cset t;
    t.n = 0;
    uint32_t next = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->lo[i] > next && cset_add(&t, next, c->lo[i] - 1))
            return -1;
        next = c->hi[i] + 1;
    }
    if (next <= CP_MAX && cset_add(&t, next, CP_MAX))
        return -1;
    *c = t;
    return 0;
}

static int cset_union(struct cset *c, const struct cset *o)
{
    for (int i = 0; i < o->n; i++)
        if (cset_add(c, o->lo[i], o->hi[i]))
            return -1;
    return 0;
}

static int cset_has(const struct cset *c, uint32_t cp)
{
    for (int i = 0; i < c->n; i++)
        if (cp >= c->lo[i] && cp <= c->hi[i])
            return 1;
    return 0;
}

/* c minus [lo, hi]. */
static int cset_remove(struct cset *c, uint32_t lo, uint32_t hi)
{
    struct cset t;
    t.n = 0;
    for (int i = 0; i < c->n; i++) {
        if (c->hi[i] < lo || c->lo[i] > hi) {
            if (cset_add(&t, c->lo[i], c->hi[i]))
                return -1;
            continue;
        }
        if (c->lo[i] < lo && cset_add(&t, c->lo[i], lo - 1))
            return -1;
        if (c->hi[i] > hi && cset_add(&t, hi + 1, c->hi[i]))
            return -1;
    }
    *c = t;
    return 0;
}

/* The ECMA-262 class escapes \d \w \s (negated when upper case). */
static int cset_escape(struct cset *c, int letter)
{
    static const uint32_t space[][2] = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680},
                                        {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F},
                                        {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
    struct cset t;
    t.n = 0;
    switch (letter | 0x20) {
    case 'd': cset_add(&t, '0', '9'); break;
    case 'w':
        cset_add(&t, '0', '9');
        cset_add(&t, 'A', 'Z');
        cset_add(&t, '_', '_');
        cset_add(&t, 'a', 'z');
        break;
    default:
        for (size_t i = 0; i < sizeof space / sizeof space[0]; i++)
            cset_add(&t, space[i][0], space[i][1]);
    }
    if (letter < 'a' && cset_complement(&t))
        return -1;
    return cset_union(c, &t);
}

/* ---- output ---- */

/* One code point inside a GBNF class or literal, ASCII only (llama.cpp's escapes). */
static void put_cp(struct kiri_buf *b, uint32_t cp)
{
    if ((cp >= '0' && cp <= '9') || (cp >= 'A' && cp <= 'Z') || (cp >= 'a' && cp <= 'z') || cp == ' ')
        kiri_buf_putc(b, (char)cp);
    else if (cp < 0x80)
        kiri_buf_printf(b, "\\x%02X", (unsigned)cp);
    else if (cp <= 0xFFFF)
        kiri_buf_printf(b, "\\u%04X", (unsigned)cp);
    else
        kiri_buf_printf(b, "\\U%08X", (unsigned)cp);
}

/* The JSON form of one decoded character, as a GBNF literal. */
static void put_json_char(struct kiri_buf *b, uint32_t cp)
{
    static const char short_esc[] = {'b', 8, 't', 9, 'n', 10, 'f', 12, 'r', 13};
    kiri_buf_putc(b, '"');
    if (cp == '"' || cp == '\\') {
        kiri_buf_printf(b, "\\\\\\%c", (char)cp);
    } else if (cp < 0x20) {
        const char *e = NULL;
        for (size_t i = 0; i < sizeof short_esc; i += 2)
            if ((uint32_t)short_esc[i + 1] == cp)
                e = short_esc + i;
        if (e)
            kiri_buf_printf(b, "\\\\%c", e[0]);
        else
            kiri_buf_printf(b, "\\\\u00%02x", (unsigned)cp);
    } else {
        put_cp(b, cp);
    }
    kiri_buf_putc(b, '"');
}

/* Writes the set as JSON string characters: a GBNF class for what is written raw, and literal
 * alternatives for the characters JSON must escape (" \ and the short escapes). */
static int emit_set(struct rx *r, const struct cset *in)
{
    static const uint32_t escaped[] = {'"', '\\', 8, 9, 10, 12, 13};
    struct cset raw = *in;
    if (cset_remove(&raw, 0, 0x1F) || cset_remove(&raw, '"', '"') || cset_remove(&raw, '\\', '\\') ||
        cset_remove(&raw, 0xD800, 0xDFFF))
        return rx_fail(r, KIRI_E_UNSUPPORTED, "a character class with too many ranges");
    int n_alt = raw.n > 0;
    for (size_t i = 0; i < sizeof escaped / sizeof escaped[0]; i++)
        n_alt += cset_has(in, escaped[i]);
    if (n_alt == 0)
        return rx_fail(r, KIRI_E_UNSUPPORTED, "a character class that matches no JSON string character");
    struct kiri_buf *b = r->out;
    kiri_buf_putc(b, '(');
    int first = 1;
    if (raw.n > 0) {
        /* Whichever of the set and its complement is shorter. */
        struct cset comp = raw;
        int negate = cset_complement(&comp) == 0 && comp.n + 3 < raw.n;
        if (negate) {
            cset_remove(&comp, 0, 0x1F);
            cset_remove(&comp, '"', '"');
            cset_remove(&comp, '\\', '\\');
            cset_remove(&comp, 0xD800, 0xDFFF);
        }
        const struct cset *w = negate ? &comp : &raw;
        kiri_buf_puts(b, negate ? "[^\\x00-\\x1F\\x22\\x5C" : "[");
        for (int i = 0; i < w->n; i++) {
            put_cp(b, w->lo[i]);
            if (w->hi[i] != w->lo[i]) {
                kiri_buf_putc(b, '-');
                put_cp(b, w->hi[i]);
            }
        }
        kiri_buf_putc(b, ']');
        first = 0;
    }
    for (size_t i = 0; i < sizeof escaped / sizeof escaped[0]; i++) {
        if (!cset_has(in, escaped[i]))
            continue;
        if (!first)
            kiri_buf_puts(b, " | ");
        put_json_char(b, escaped[i]);
        first = 0;
    }
    kiri_buf_putc(b, ')');
    return 0;
}

/* ---- parsing ---- */

static int hex_value(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f')
        return (c | 0x20) - 'a' + 10;
    return -1;
}

static int read_hex(struct rx *r, int n, uint32_t *cp)
{
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        int h = hex_value(peek(r));
        if (h < 0)
            return -1;
        v = v * 16 + (uint32_t)h;
        r->pos++;
    }
    *cp = v;
    return 0;
}

/* After a backslash: a class escape (*is_set, the set in *set) or one character (*cp). */
static int parse_escape(struct rx *r, int in_class, struct cset *set, int *is_set, uint32_t *cp)
{
    *is_set = 0;
    if (at_end(r))
        return rx_fail(r, KIRI_E_INVALID_ARG, "the pattern ends with a lone backslash");
    int c = peek(r);
    if (strchr("dDwWsS", c)) {
        r->pos++;
        *is_set = 1;
        set->n = 0;
        if (cset_escape(set, c))
            return rx_fail(r, KIRI_E_UNSUPPORTED, "a character class with too many ranges");
        return 0;
    }
    if (c >= '1' && c <= '9')
        return rx_fail(r, KIRI_E_UNSUPPORTED, "backreference (\\1..\\9) is not a regular language");
    if (c == 'k')
        return rx_fail(r, KIRI_E_UNSUPPORTED, "named backreference \\k<name> is not a regular language");
    if ((c == 'b' || c == 'B') && !in_class)
        return rx_fail(r, KIRI_E_UNSUPPORTED, "word boundary assertion \\b / \\B is not supported");
    if (c == 'p' || c == 'P')
        return rx_fail(r, KIRI_E_UNSUPPORTED, "Unicode property escape \\p{...} is not supported");
    r->pos++;
    switch (c) {
    case 't': *cp = 9; return 0;
    case 'n': *cp = 10; return 0;
    case 'v': *cp = 11; return 0;
    case 'f': *cp = 12; return 0;
    case 'r': *cp = 13; return 0;
    case 'b': *cp = 8; return 0; /* in a class, \b is backspace */
    case '0':
        if (peek(r) >= '0' && peek(r) <= '9')
            return rx_fail(r, KIRI_E_UNSUPPORTED, "octal escape is not supported");
        *cp = 0;
        return 0;
    case 'c': {
        int l = peek(r);
        if (!((l | 0x20) >= 'a' && (l | 0x20) <= 'z'))
            return rx_fail(r, KIRI_E_INVALID_ARG, "\\c must be followed by a letter");
        r->pos++;
        *cp = (uint32_t)(l % 32);
        return 0;
    }
    case 'x':
        if (read_hex(r, 2, cp))
            return rx_fail(r, KIRI_E_INVALID_ARG, "\\x needs two hex digits");
        return 0;
    case 'u':
        if (peek(r) == '{') {
            r->pos++;
            uint32_t v = 0;
            int n = 0;
            while (hex_value(peek(r)) >= 0 && n < 8) {
                v = v * 16 + (uint32_t)hex_value(peek(r));
                r->pos++;
                n++;
            }
            if (n == 0 || peek(r) != '}' || v > CP_MAX)
                return rx_fail(r, KIRI_E_INVALID_ARG, "malformed \\u{...} escape");
            r->pos++;
            *cp = v;
            return 0;
        }
        if (read_hex(r, 4, cp))
            return rx_fail(r, KIRI_E_INVALID_ARG, "\\u needs four hex digits");
        if (*cp >= 0xD800 && *cp <= 0xDBFF && r->pos + 6 <= r->len && r->s[r->pos] == '\\' &&
            r->s[r->pos + 1] == 'u') {
            size_t save = r->pos;
            uint32_t lo;
            r->pos += 2;
            if (read_hex(r, 4, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF)
                *cp = 0x10000 + ((*cp - 0xD800) << 10) + (lo - 0xDC00);
            else
                r->pos = save;
        }
        if (*cp >= 0xD800 && *cp <= 0xDFFF)
            return rx_fail(r, KIRI_E_UNSUPPORTED, "a lone surrogate escape");
        return 0;
    default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
            r->pos--;
            return rx_fail(r, KIRI_E_INVALID_ARG, "unknown escape");
        }
        r->pos--;
        *cp = next_cp(r);
        return 0;
    }
}

static int parse_class(struct rx *r, struct cset *set)
{
    int negate = 0;
    set->n = 0;
    if (peek(r) == '^') {
        negate = 1;
        r->pos++;
    }
    for (;;) {
        if (at_end(r))
            return rx_fail(r, KIRI_E_INVALID_ARG, "unterminated character class");
        if (peek(r) == ']') {
            r->pos++;
            break;
        }
        uint32_t lo, hi;
        int is_set = 0;
        struct cset esc;
        if (peek(r) == '\\') {
            r->pos++;
            int rc = parse_escape(r, 1, &esc, &is_set, &lo);
            if (rc)
                return rc;
        } else {
            lo = next_cp(r);
        }
        if (is_set) {
            if (cset_union(set, &esc))
                return rx_fail(r, KIRI_E_UNSUPPORTED, "a character class with too many ranges");
            continue;
        }
        hi = lo;
        if (peek(r) == '-' && r->pos + 1 < r->len && r->s[r->pos + 1] != ']') {
            r->pos++;
            if (peek(r) == '\\') {
                r->pos++;
                int rc = parse_escape(r, 1, &esc, &is_set, &hi);
                if (rc)
                    return rc;
                if (is_set)
                    return rx_fail(r, KIRI_E_INVALID_ARG, "a class escape cannot end a range");
            } else {
                hi = next_cp(r);
            }
            if (hi < lo)
                return rx_fail(r, KIRI_E_INVALID_ARG, "a character range out of order");
        }
        if (cset_add(set, lo, hi))
            return rx_fail(r, KIRI_E_UNSUPPORTED, "a character class with too many ranges");
    }
    if (negate && cset_complement(set))
        return rx_fail(r, KIRI_E_UNSUPPORTED, "a character class with too many ranges");
    return 0;
}

/* {n}, {n,}, {n,m} at r->pos ('{'); 0 and the bounds (max -1: none), or 1 when the brace is a
 * literal (ECMA-262 Annex B reads a brace that starts no quantifier as itself). */
static int parse_braces(struct rx *r, long *min, long *max)
{
    size_t p = r->pos + 1;
    long a = 0, b = -1;
    int digits = 0;
    while (p < r->len && r->s[p] >= '0' && r->s[p] <= '9' && digits < 9) {
        a = a * 10 + (r->s[p++] - '0');
        digits++;
    }
    if (!digits)
        return 1;
    if (p < r->len && r->s[p] == ',') {
        p++;
        if (p < r->len && r->s[p] >= '0' && r->s[p] <= '9') {
            b = 0;
            digits = 0;
            while (p < r->len && r->s[p] >= '0' && r->s[p] <= '9' && digits < 9) {
                b = b * 10 + (r->s[p++] - '0');
                digits++;
            }
        }
    } else {
        b = a;
    }
    if (p >= r->len || r->s[p] != '}')
        return 1;
    r->pos = p + 1;
    *min = a;
    *max = b;
    return 0;
}

static int parse_disjunction(struct rx *r, int top);

static int parse_atom(struct rx *r)
{
    int c = peek(r);
    struct cset set;
    if (c == '(') {
        r->pos++;
        if (peek(r) == '?') {
            r->pos++;
            int k = peek(r);
            if (k == ':') {
                r->pos++;
            } else if (k == '=' || k == '!') {
                return rx_fail(r, KIRI_E_UNSUPPORTED, k == '=' ? "lookahead (?=...) is not supported"
                                                             : "negative lookahead (?!...) is not supported");
            } else if (k == '<' && r->pos + 1 < r->len && (r->s[r->pos + 1] == '=' || r->s[r->pos + 1] == '!')) {
                return rx_fail(r, KIRI_E_UNSUPPORTED, "lookbehind (?<=...) / (?<!...) is not supported");
            } else if (k == '<') {
                while (!at_end(r) && peek(r) != '>')
                    r->pos++;
                if (at_end(r))
                    return rx_fail(r, KIRI_E_INVALID_ARG, "unterminated group name");
                r->pos++;
            } else {
                return rx_fail(r, KIRI_E_UNSUPPORTED, "this group modifier (?...) is not supported");
            }
        }
        if (++r->depth > MAX_GROUP_DEPTH)
            return rx_fail(r, KIRI_E_UNSUPPORTED, "groups nested too deeply");
        int rc = parse_disjunction(r, 0);
        r->depth--;
        if (rc)
            return rc;
        if (peek(r) != ')')
            return rx_fail(r, KIRI_E_INVALID_ARG, "unbalanced parenthesis");
        r->pos++;
        return 0;
    }
    if (c == '[') {
        r->pos++;
        int rc = parse_class(r, &set);
        return rc ? rc : emit_set(r, &set);
    }
    if (c == '.') {
        r->pos++;
        set.n = 0;
        cset_add(&set, 0x0A, 0x0A);
        cset_add(&set, 0x0D, 0x0D);
        cset_add(&set, 0x2028, 0x2029);
        cset_complement(&set);
        return emit_set(r, &set);
    }
    if (c == '\\') {
        r->pos++;
        uint32_t cp;
        int is_set;
        int rc = parse_escape(r, 0, &set, &is_set, &cp);
        if (rc)
            return rc;
        if (is_set)
            return emit_set(r, &set);
        put_json_char(r->out, cp);
        return 0;
    }
    if (c == '*' || c == '+' || c == '?')
        return rx_fail(r, KIRI_E_INVALID_ARG, "a quantifier with nothing to repeat");
    if (c == ')')
        return rx_fail(r, KIRI_E_INVALID_ARG, "unbalanced parenthesis");
    if (c == '{') {
        long a, b;
        size_t save = r->pos;
        if (parse_braces(r, &a, &b) == 0) {
            r->pos = save;
            return rx_fail(r, KIRI_E_INVALID_ARG, "a quantifier with nothing to repeat");
        }
    }
    put_json_char(r->out, next_cp(r));
    return 0;
}

/* A term: an atom and its quantifier, written as (atom) with a GBNF postfix. */
static int parse_term(struct rx *r)
{
    size_t start = r->out->len;
    kiri_buf_putc(r->out, '(');
    int rc = parse_atom(r);
    if (rc)
        return rc;
    kiri_buf_putc(r->out, ')');
    int c = peek(r);
    long min = 1, max = 1;
    if (c == '*') {
        min = 0, max = -1;
        r->pos++;
    } else if (c == '+') {
        min = 1, max = -1;
        r->pos++;
    } else if (c == '?') {
        min = 0, max = 1;
        r->pos++;
    } else if (c == '{') {
        if (parse_braces(r, &min, &max))
            return 0;
        if (max >= 0 && max < min)
            return rx_fail(r, KIRI_E_INVALID_ARG, "a quantifier {n,m} with m < n");
        if (min > KIRI_SCHEMA_REGEX_MAX_REPEAT || max > KIRI_SCHEMA_REGEX_MAX_REPEAT)
            return rx_fail(r, KIRI_E_UNSUPPORTED, "a quantifier count above 256");
    } else {
        return 0;
    }
    if (peek(r) == '?') /* lazy: the same language */
        r->pos++;
    if (peek(r) == '*' || peek(r) == '+' || peek(r) == '?')
        return rx_fail(r, KIRI_E_INVALID_ARG, "a quantifier with nothing to repeat");
    if (min == 0 && max == 0) {
        r->out->len = start; /* x{0}: the empty string */
        r->out->data[start] = '\0';
        kiri_buf_puts(r->out, "\"\"");
    } else if (min == 0 && max == -1) {
        kiri_buf_putc(r->out, '*');
    } else if (min == 1 && max == -1) {
        kiri_buf_putc(r->out, '+');
    } else if (min == 0 && max == 1) {
        kiri_buf_putc(r->out, '?');
    } else if (min == max) {
        if (min != 1)
            kiri_buf_printf(r->out, "{%ld}", min);
    } else if (max < 0) {
        kiri_buf_printf(r->out, "{%ld,}", min);
    } else {
        kiri_buf_printf(r->out, "{%ld,%ld}", min, max);
    }
    return 0;
}

/* A disjunction; at the top level each alternative may open with ^ and close with $, and one
 * without them gets any text on that side. */
static int parse_disjunction(struct rx *r, int top)
{
    struct kiri_buf *b = r->out;
    kiri_buf_putc(b, '(');
    for (int alt = 0;; alt++) {
        if (alt)
            kiri_buf_puts(b, " | ");
        int anchored_end = 0;
        if (top && peek(r) == '^') {
            r->pos++;
        } else if (top) {
            kiri_buf_printf(b, "%s* ", r->any_char);
        }
        kiri_buf_puts(b, "\"\"");
        while (!at_end(r) && peek(r) != '|' && peek(r) != ')') {
            if (peek(r) == '^')
                return rx_fail(r, KIRI_E_UNSUPPORTED, "^ anywhere but the start of a top-level alternative");
            if (peek(r) == '$') {
                r->pos++;
                if (!top || (!at_end(r) && peek(r) != '|'))
                    return rx_fail(r, KIRI_E_UNSUPPORTED, "$ anywhere but the end of a top-level alternative");
                anchored_end = 1;
                break;
            }
            kiri_buf_putc(b, ' ');
            int rc = parse_term(r);
            if (rc)
                return rc;
            if (b->failed)
                return rx_fail(r, b->limit && b->len + 4096 < b->limit ? KIRI_E_NOMEM : KIRI_E_UNSUPPORTED,
                               "the pattern's grammar is too large");
        }
        if (top && !anchored_end)
            kiri_buf_printf(b, " %s*", r->any_char);
        if (peek(r) != '|')
            break;
        r->pos++;
    }
    if (top && !at_end(r))
        return rx_fail(r, KIRI_E_INVALID_ARG, "unbalanced parenthesis");
    kiri_buf_putc(b, ')');
    return 0;
}

int kiri_schema_regex_to_gbnf(const char *pattern, size_t len, const char *any_char, struct kiri_buf *out,
                              char *err, size_t err_cap)
{
    struct rx r = {pattern, len, 0, any_char, out, err, err_cap, 0};
    if (!kiri_utf8_valid(pattern, len))
        return rx_fail(&r, KIRI_E_INVALID_ARG, "the pattern is not valid UTF-8");
    int rc = parse_disjunction(&r, 1);
    if (out->failed && out->limit && out->len + 4096 < out->limit)
        return rx_fail(&r, KIRI_E_NOMEM, "out of memory");
    if (rc == 0 && out->failed)
        return rx_fail(&r, KIRI_E_UNSUPPORTED, "the pattern's grammar is too large");
    return rc;
}
