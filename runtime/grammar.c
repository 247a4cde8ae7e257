/* GBNF grammars: the parser and compiler, the byte-level pushdown matcher, the vocabulary trie and
 * the mask cache (runtime/grammar.h describes the design and its invariants). */
#include "grammar.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "hex.h"
#include "kiri.h"
#include "mem.h"
#include "tokenizer.h"
#include "utf8.h"

#define NONE UINT32_MAX

/* An element of a compiled alternative. END closes an alternative; REF names a rule (arg); RANGE
 * matches one byte in [lo, hi]; SET one byte in bitmap arg (8 words). */
enum { EL_END, EL_REF, EL_RANGE, EL_SET };

struct elem {
    uint8_t kind, lo, hi, pad;
    uint32_t arg;
};

struct kiri_grammar {
    struct elem *elems;     /* owned: every alternative, each closed by an END */
    uint32_t n_elems;
    uint32_t *alts;         /* owned: start of each live alternative, grouped by rule */
    uint32_t *rule_alts;    /* owned (n_rules + 1): rule r's alternatives are alts[rule_alts[r]..[r+1]) */
    uint32_t n_rules, root;
    uint32_t *sets;         /* owned: 8 words per byte set */
    uint32_t n_sets;
    uint64_t fp[2];         /* fingerprint of the text, for the mask cache */
};

static uint64_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    return x ^ (x >> 33);
}

static uint64_t hash_bytes(const void *p, size_t n, uint64_t seed)
{
    const uint8_t *s = p;
    uint64_t h = seed ^ (n * 0x9E3779B97F4A7C15ull);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, s + i, 8);
        h = mix64(h ^ w) + 0x9E3779B97F4A7C15ull;
    }
    uint64_t w = 0;
    for (size_t k = 0; i + k < n; k++)
        w |= (uint64_t)s[i + k] << (8 * k);
    return mix64(h ^ w ^ 0xA5A5A5A5ull);
}

/* ---------------------------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------------------------- */

struct body {
    struct elem *v;         /* owned */
    uint32_t n, cap;
};

struct prule {
    const char *name;       /* borrowed from the text; NULL for generated rules */
    uint32_t name_len;
    size_t at;              /* where it is defined (or first named, or the construct made it) */
    int defined;
    struct body body;
};

#define NAME_TABLE (2 * KIRI_GRAMMAR_MAX_RULES)

struct parser {
    const char *s;
    size_t n, i;
    struct prule *rules;    /* owned */
    uint32_t n_rules, cap_rules;
    uint32_t *names;        /* owned hash table of named rule ids (NAME_TABLE entries) */
    uint32_t *sets;         /* owned */
    uint32_t n_sets, cap_sets;
    uint32_t total;
    int nest;
    uint32_t any_rule;
    struct kiri_status_info *info;
    int rc;
};

static int perr(struct parser *P, size_t at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int perr(struct parser *P, size_t at, const char *fmt, ...)
{
    if (P->rc)
        return P->rc;
    char msg[192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    unsigned line = 1, col = 1;
    for (size_t k = 0; k < at && k < P->n; k++) {
        if (P->s[k] == '\n')
            line++, col = 1;
        else if (((unsigned char)P->s[k] & 0xC0) != 0x80)
            col++;
    }
    P->rc = KIRI_E_INVALID_ARG;
    kiri_error_at(P->info, P->rc, "grammar", (int64_t)at, "grammar line %u, column %u: %s", line, col, msg);
    return P->rc;
}

static int nomem(struct parser *P)
{
    if (!P->rc) {
        P->rc = KIRI_E_NOMEM;
        kiri_error_at(P->info, P->rc, "grammar", -1, "out of memory compiling the grammar");
    }
    return P->rc;
}

static void push(struct parser *P, uint32_t r, uint8_t kind, uint8_t lo, uint8_t hi, uint32_t arg)
{
    if (P->rc)
        return;
    if (P->total >= KIRI_GRAMMAR_MAX_ELEMS) {
        perr(P, P->i, "the grammar compiles to more than %d elements", KIRI_GRAMMAR_MAX_ELEMS);
        return;
    }
    struct body *b = &P->rules[r].body;
    if (b->n == b->cap) {
        uint32_t cap = b->cap ? 2 * b->cap : 8;
        struct elem *v = kiri_mem_realloc(b->v, (size_t)cap * sizeof *v);
        if (!v) {
            nomem(P);
            return;
        }
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = (struct elem){kind, lo, hi, 0, arg};
    P->total++;
}

static uint32_t new_rule(struct parser *P, const char *name, uint32_t len, size_t at)
{
    if (P->rc)
        return NONE;
    if (P->n_rules >= KIRI_GRAMMAR_MAX_RULES) {
        perr(P, at, "the grammar needs more than %d rules", KIRI_GRAMMAR_MAX_RULES);
        return NONE;
    }
    if (P->n_rules == P->cap_rules) {
        uint32_t cap = P->cap_rules ? 2 * P->cap_rules : 32;
        struct prule *v = kiri_mem_realloc(P->rules, (size_t)cap * sizeof *v);
        if (!v) {
            nomem(P);
            return NONE;
        }
        P->rules = v;
        P->cap_rules = cap;
    }
    struct prule *r = &P->rules[P->n_rules];
    memset(r, 0, sizeof *r);
    r->name = name;
    r->name_len = len;
    r->at = at;
    return P->n_rules++;
}

/* The id of the named rule, created (undefined) at its first mention. */
static uint32_t named_rule(struct parser *P, const char *name, uint32_t len, size_t at)
{
    uint32_t h = (uint32_t)hash_bytes(name, len, 7) % NAME_TABLE;
    for (;;) {
        const uint32_t k = P->names[h];
        if (k == NONE)
            break;
        if (P->rules[k].name_len == len && memcmp(P->rules[k].name, name, len) == 0)
            return k;
        h = (h + 1) % NAME_TABLE;
    }
    const uint32_t r = new_rule(P, name, len, at);
    if (r != NONE)
        P->names[h] = r;
    return r;
}

static int is_name_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

/* Skips blanks and comments; newlines too when nested (inside a group) or newlines is set. */
static void skip_space(struct parser *P, int newlines)
{
    while (P->i < P->n) {
        const char c = P->s[P->i];
        if (c == ' ' || c == '\t' || c == '\r' || (c == '\n' && newlines)) {
            P->i++;
        } else if (c == '#') {
            while (P->i < P->n && P->s[P->i] != '\n')
                P->i++;
        } else {
            break;
        }
    }
}

/* One character of a literal or class, escapes decoded. */
static uint32_t parse_char(struct parser *P)
{
    const size_t at = P->i;
    if (P->i >= P->n) {
        perr(P, at, "the text ends inside a literal or class");
        return 0;
    }
    const unsigned char c = (unsigned char)P->s[P->i];
    if (c != '\\') {
        const int len = kiri_utf8_check((const unsigned char *)P->s + P->i, P->n - P->i);
        if (len <= 0) {
            perr(P, at, "invalid UTF-8");
            return 0;
        }
        uint32_t cp;
        P->i += kiri_utf8_decode(P->s + P->i, P->n - P->i, &cp);
        return cp;
    }
    if (P->i + 1 >= P->n) {
        perr(P, at, "the text ends inside an escape");
        return 0;
    }
    const char e = P->s[P->i + 1];
    P->i += 2;
    int digits = 0;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case '\\': case '"': case '[': case ']': case '-': case '\'': case '/': case '^': case '.':
        return (uint32_t)e;
    case 'x': digits = 2; break;
    case 'u': digits = 4; break;
    case 'U': digits = 8; break;
    default:
        perr(P, at, "unknown escape '\\%c'", e);
        return 0;
    }
    uint32_t cp = 0;
    for (int k = 0; k < digits; k++) {
        const int h = P->i < P->n ? kiri_hex_digit(P->s[P->i]) : -1;
        if (h < 0) {
            perr(P, at, "'\\%c' needs %d hex digits", e, digits);
            return 0;
        }
        cp = cp << 4 | (uint32_t)h;
        P->i++;
    }
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) {
        perr(P, at, "U+%X is not a Unicode scalar value", cp);
        return 0;
    }
    return cp;
}

static void push_cp(struct parser *P, uint32_t r, uint32_t cp)
{
    char u[4];
    const size_t n = kiri_utf8_encode(cp, u);
    for (size_t k = 0; k < n; k++)
        push(P, r, EL_RANGE, (uint8_t)u[k], (uint8_t)u[k], 0);
}

/* Appends the alternatives matching the UTF-8 forms of code points [lo, hi] (no surrogates) to
 * rule r: each a sequence of byte ranges, found by splitting the range where the encoded length
 * changes and where a continuation byte does not cover its full 0x80..0xBF span. */
static void utf8_seqs(struct parser *P, uint32_t r, uint32_t lo, uint32_t hi)
{
    if (P->rc || lo > hi)
        return;
    static const uint32_t bounds[3] = {0x7F, 0x7FF, 0xFFFF};
    for (int k = 0; k < 3; k++)
        if (lo <= bounds[k] && hi > bounds[k]) {
            utf8_seqs(P, r, lo, bounds[k]);
            utf8_seqs(P, r, bounds[k] + 1, hi);
            return;
        }
    const int n = hi < 0x80 ? 1 : hi <= 0x7FF ? 2 : hi <= 0xFFFF ? 3 : 4;
    for (int k = 1; k < n; k++) {
        const uint32_t m = (1u << (6 * k)) - 1;
        if ((lo & ~m) != (hi & ~m)) {
            if ((lo & m) != 0) {
                utf8_seqs(P, r, lo, lo | m);
                utf8_seqs(P, r, (lo | m) + 1, hi);
                return;
            }
            if ((hi & m) != m) {
                utf8_seqs(P, r, lo, (hi & ~m) - 1);
                utf8_seqs(P, r, hi & ~m, hi);
                return;
            }
        }
    }
    char a[4], b[4];
    kiri_utf8_encode(lo, a);
    kiri_utf8_encode(hi, b);
    for (int k = 0; k < n; k++)
        push(P, r, EL_RANGE, (uint8_t)a[k], (uint8_t)b[k], 0);
    push(P, r, EL_END, 0, 0, 0);
}

static uint32_t new_set(struct parser *P, const uint32_t bits[8])
{
    if (P->n_sets == P->cap_sets) {
        uint32_t cap = P->cap_sets ? 2 * P->cap_sets : 16;
        uint32_t *v = kiri_mem_realloc(P->sets, (size_t)cap * 8 * sizeof *v);
        if (!v) {
            nomem(P);
            return 0;
        }
        P->sets = v;
        P->cap_sets = cap;
    }
    memcpy(P->sets + (size_t)P->n_sets * 8, bits, 8 * sizeof *bits);
    return P->n_sets++;
}

struct range {
    uint32_t lo, hi;
};

static int range_cmp(const void *a, const void *b)
{
    const struct range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Emits the code point ranges rs[0..n) (sorted, merged, no surrogates) into rule r's current
 * sequence: one byte element for pure ASCII, else a reference to a generated rule. */
static void emit_ranges(struct parser *P, uint32_t r, struct range *rs, size_t n, size_t at)
{
    uint32_t bits[8] = {0};
    int ascii = 0, multi = 0;
    for (size_t k = 0; k < n; k++) {
        for (uint32_t c = rs[k].lo; c <= rs[k].hi && c < 0x80; c++)
            bits[c / 32] |= 1u << (c % 32), ascii = 1;
        if (rs[k].hi >= 0x80)
            multi = 1;
    }
    if (!ascii && !multi) {
        perr(P, at, "the character class matches nothing");
        return;
    }
    if (!multi && n == 1) {
        push(P, r, EL_RANGE, (uint8_t)rs[0].lo, (uint8_t)rs[0].hi, 0);
        return;
    }
    uint32_t set = 0;
    if (ascii) {
        set = new_set(P, bits);
        if (!multi) {
            push(P, r, EL_SET, 0, 0, set);
            return;
        }
    }
    const uint32_t g = new_rule(P, NULL, 0, at);
    if (g == NONE)
        return;
    if (ascii) {
        push(P, g, EL_SET, 0, 0, set);
        push(P, g, EL_END, 0, 0, 0);
    }
    for (size_t k = 0; k < n; k++)
        if (rs[k].hi >= 0x80)
            utf8_seqs(P, g, rs[k].lo < 0x80 ? 0x80 : rs[k].lo, rs[k].hi);
    push(P, r, EL_REF, 0, 0, g);
}

/* Sorts and merges ranges, complements them when negated, and removes the surrogates. Returns
 * the new count (the array has room for n + 2). */
static size_t normalize_ranges(struct range *rs, size_t n, int negate)
{
    qsort(rs, n, sizeof *rs, range_cmp);
    size_t m = 0;
    for (size_t k = 0; k < n; k++) {
        if (m && rs[k].lo <= rs[m - 1].hi + 1) {
            if (rs[k].hi > rs[m - 1].hi)
                rs[m - 1].hi = rs[k].hi;
        } else {
            rs[m++] = rs[k];
        }
    }
    n = m;
    if (negate) {
        uint32_t next = 0;
        m = 0;
        for (size_t k = 0; k < n; k++) {
            const struct range cur = rs[k];
            if (cur.lo > next)
                rs[m++] = (struct range){next, cur.lo - 1};
            next = cur.hi + 1;
        }
        if (next <= 0x10FFFF)
            rs[m++] = (struct range){next, 0x10FFFF};
        n = m;
    }
    /* Surrogates have no UTF-8 form. The ranges are disjoint and sorted, so at most one spans
     * the whole block and splits in two; the array has room for that one more. */
    m = 0;
    for (size_t k = 0; k < n; k++) {
        const struct range cur = rs[k];
        if (cur.hi < 0xD800 || cur.lo > 0xDFFF) {
            rs[m++] = cur;
            continue;
        }
        if (cur.lo < 0xD800)
            rs[m++] = (struct range){cur.lo, 0xD7FF};
        if (cur.hi > 0xDFFF) {
            const size_t rest = n - k - 1;
            memmove(rs + m + 1, rs + k + 1, rest * sizeof *rs);
            rs[m] = (struct range){0xE000, cur.hi};
            return m + 1 + rest;
        }
    }
    return m;
}

static void parse_class(struct parser *P, uint32_t r)
{
    const size_t at = P->i++;
    int negate = 0;
    if (P->i < P->n && P->s[P->i] == '^')
        negate = 1, P->i++;
    size_t n = 0, cap = 8;
    struct range *rs = kiri_mem_array(cap + 2, sizeof *rs);
    if (!rs) {
        nomem(P);
        return;
    }
    while (!P->rc && P->i < P->n && P->s[P->i] != ']') {
        const uint32_t lo = parse_char(P);
        uint32_t hi = lo;
        if (!P->rc && P->i + 1 < P->n && P->s[P->i] == '-' && P->s[P->i + 1] != ']') {
            P->i++;
            hi = parse_char(P);
            if (!P->rc && hi < lo)
                perr(P, at, "the class range U+%X-U+%X is reversed", lo, hi);
        }
        if (P->rc)
            break;
        if (n == cap) {
            cap *= 2;
            struct range *v = kiri_mem_realloc(rs, (cap + 2) * sizeof *rs);
            if (!v) {
                nomem(P);
                break;
            }
            rs = v;
        }
        rs[n++] = (struct range){lo, hi};
    }
    if (!P->rc && P->i >= P->n)
        perr(P, at, "the character class is not closed with ']'");
    if (!P->rc) {
        P->i++;
        n = normalize_ranges(rs, n, negate);
        emit_ranges(P, r, rs, n, at);
    }
    kiri_mem_free(rs);
}

/* The rule for `.`, any character, made once. */
static uint32_t any_rule(struct parser *P, size_t at)
{
    if (P->any_rule != NONE)
        return P->any_rule;
    const uint32_t g = new_rule(P, NULL, 0, at);
    if (g == NONE)
        return NONE;
    struct range rs[4] = {{0, 0x10FFFF}};
    const size_t n = normalize_ranges(rs, 1, 0);
    emit_ranges(P, g, rs, n, at);
    push(P, g, EL_END, 0, 0, 0);
    P->any_rule = g;
    return g;
}

static uint32_t parse_count(struct parser *P)
{
    const size_t at = P->i;
    uint32_t v = 0;
    int digits = 0;
    while (P->i < P->n && P->s[P->i] >= '0' && P->s[P->i] <= '9') {
        v = v * 10 + (uint32_t)(P->s[P->i++] - '0');
        digits++;
        if (v > KIRI_GRAMMAR_MAX_REPEAT) {
            perr(P, at, "a repetition count above %d", KIRI_GRAMMAR_MAX_REPEAT);
            return 0;
        }
    }
    if (!digits)
        perr(P, at, "expected a number");
    return v;
}

/* Applies x{min,max} (max NONE: unbounded) to the unit at body[unit..] of rule r. */
static void repeat(struct parser *P, uint32_t r, uint32_t unit, uint32_t min, uint32_t max, size_t at)
{
    uint32_t len = P->rules[r].body.n - unit;
    struct elem x;
    if (len == 1) {
        x = P->rules[r].body.v[unit];
    } else {
        const uint32_t w = new_rule(P, NULL, 0, at);
        if (w == NONE)
            return;
        for (uint32_t k = 0; k < len; k++) {
            const struct elem e = P->rules[r].body.v[unit + k];
            push(P, w, e.kind, e.lo, e.hi, e.arg);
        }
        push(P, w, EL_END, 0, 0, 0);
        x = (struct elem){EL_REF, 0, 0, 0, w};
    }
    P->rules[r].body.n = unit;
    P->total -= len;
    for (uint32_t k = 0; k < min && !P->rc; k++)
        push(P, r, x.kind, x.lo, x.hi, x.arg);
    if (max == NONE) {
        const uint32_t g = new_rule(P, NULL, 0, at);
        if (g == NONE)
            return;
        push(P, g, x.kind, x.lo, x.hi, x.arg);
        push(P, g, EL_REF, 0, 0, g);
        push(P, g, EL_END, 0, 0, 0);
        push(P, g, EL_END, 0, 0, 0);
        push(P, r, EL_REF, 0, 0, g);
    } else if (max > min) {
        uint32_t prev = NONE;
        for (uint32_t k = min; k < max && !P->rc; k++) {
            const uint32_t g = new_rule(P, NULL, 0, at);
            if (g == NONE)
                return;
            push(P, g, x.kind, x.lo, x.hi, x.arg);
            if (prev != NONE)
                push(P, g, EL_REF, 0, 0, prev);
            push(P, g, EL_END, 0, 0, 0);
            push(P, g, EL_END, 0, 0, 0);
            prev = g;
        }
        push(P, r, EL_REF, 0, 0, prev);
    }
}

static void parse_alts(struct parser *P, uint32_t r, int nested);

/* A sequence of elements into rule r, up to '|', ')', the end of the line (top level) or text. */
static void parse_seq(struct parser *P, uint32_t r, int nested)
{
    uint32_t unit = NONE;
    for (;;) {
        skip_space(P, nested);
        if (P->rc || P->i >= P->n)
            return;
        const char c = P->s[P->i];
        const size_t at = P->i;
        const uint32_t start = P->rules[r].body.n;
        if (c == '"') {
            P->i++;
            while (!P->rc && P->i < P->n && P->s[P->i] != '"')
                push_cp(P, r, parse_char(P));
            if (!P->rc && P->i >= P->n)
                perr(P, at, "the literal is not closed with '\"'");
            P->i++;
            unit = start;
        } else if (c == '[') {
            parse_class(P, r);
            unit = start;
        } else if (c == '.') {
            P->i++;
            const uint32_t g = any_rule(P, at);
            push(P, r, EL_REF, 0, 0, g);
            unit = start;
        } else if (c == '(') {
            if (P->nest >= KIRI_GRAMMAR_MAX_NEST) {
                perr(P, at, "groups nest deeper than %d", KIRI_GRAMMAR_MAX_NEST);
                return;
            }
            P->i++;
            const uint32_t g = new_rule(P, NULL, 0, at);
            if (g == NONE)
                return;
            P->nest++;
            parse_alts(P, g, 1);
            P->nest--;
            skip_space(P, 1);
            if (!P->rc && (P->i >= P->n || P->s[P->i] != ')'))
                perr(P, at, "the group is not closed with ')'");
            P->i++;
            push(P, r, EL_REF, 0, 0, g);
            unit = start;
        } else if (is_name_char(c)) {
            while (P->i < P->n && is_name_char(P->s[P->i]))
                P->i++;
            const uint32_t len = (uint32_t)(P->i - at);
            size_t k = P->i;
            while (k < P->n && (P->s[k] == ' ' || P->s[k] == '\t'))
                k++;
            if (k + 3 <= P->n && memcmp(P->s + k, "::=", 3) == 0) {
                perr(P, at, "a new rule must start on a line of its own");
                return;
            }
            const uint32_t ref = named_rule(P, P->s + at, len, at);
            push(P, r, EL_REF, 0, 0, ref);
            unit = start;
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            if (unit == NONE) {
                perr(P, at, "'%c' has nothing before it to repeat", c);
                return;
            }
            P->i++;
            uint32_t min = 0, max = NONE;
            if (c == '+')
                min = 1;
            else if (c == '?')
                max = 1;
            else if (c == '{') {
                skip_space(P, 0);
                min = max = parse_count(P);
                skip_space(P, 0);
                if (!P->rc && P->i < P->n && P->s[P->i] == ',') {
                    P->i++;
                    skip_space(P, 0);
                    max = NONE;
                    if (P->i < P->n && P->s[P->i] != '}')
                        max = parse_count(P);
                    skip_space(P, 0);
                }
                if (!P->rc && (P->i >= P->n || P->s[P->i] != '}'))
                    perr(P, at, "expected '}' to close the repetition");
                if (!P->rc && max < min)
                    perr(P, at, "the repetition {%u,%u} has its maximum below its minimum", min, max);
                P->i++;
            }
            if (!P->rc)
                repeat(P, r, unit, min, max, at);
        } else {
            return;
        }
    }
}

static void parse_alts(struct parser *P, uint32_t r, int nested)
{
    parse_seq(P, r, nested);
    push(P, r, EL_END, 0, 0, 0);
    while (!P->rc) {
        skip_space(P, nested);
        const size_t save = P->i;
        skip_space(P, 1); /* an alternative may continue on the next line after a leading '|' */
        if (P->i < P->n && P->s[P->i] == '|') {
            P->i++;
            skip_space(P, 1);
            parse_seq(P, r, nested);
            push(P, r, EL_END, 0, 0, 0);
        } else {
            P->i = save;
            return;
        }
    }
}

static void parse_grammar(struct parser *P)
{
    skip_space(P, 1);
    while (!P->rc && P->i < P->n) {
        const size_t at = P->i;
        if (!is_name_char(P->s[at])) {
            perr(P, at, "expected a rule name");
            return;
        }
        while (P->i < P->n && is_name_char(P->s[P->i]))
            P->i++;
        const uint32_t len = (uint32_t)(P->i - at);
        skip_space(P, 0);
        if (P->i + 3 > P->n || memcmp(P->s + P->i, "::=", 3) != 0) {
            perr(P, P->i, "expected '::=' after the rule name");
            return;
        }
        P->i += 3;
        const uint32_t r = named_rule(P, P->s + at, len, at);
        if (r == NONE)
            return;
        if (P->rules[r].defined) {
            perr(P, at, "rule '%.*s' is defined twice", (int)len, P->s + at);
            return;
        }
        P->rules[r].defined = 1;
        P->rules[r].at = at;
        skip_space(P, 1);
        parse_alts(P, r, 0);
        skip_space(P, 0);
        if (!P->rc && P->i < P->n && P->s[P->i] != '\n')
            perr(P, P->i, "unexpected '%c'", P->s[P->i]);
        skip_space(P, 1);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Compiling: flattening and the checks
 * ------------------------------------------------------------------------------------------- */

/* Worklist fixpoint over alternatives: a rule is marked once one of its alternatives has every
 * reference marked (and, with terminals_block, no byte element). Used for "productive" (derives
 * some finite text) and "nullable" (derives the empty text). alt_rule maps alternatives to rules,
 * alt_start to their first element; live filters alternatives (NULL: all). */
static int fixpoint(const struct kiri_grammar *g, const uint32_t *alt_rule, const uint32_t *alt_start,
                    uint32_t n_alts, const uint8_t *live, int terminals_block, uint8_t *marked)
{
    const uint32_t R = g->n_rules;
    uint32_t *need = kiri_mem_calloc(n_alts + 1, sizeof *need);
    uint32_t *occ_off = kiri_mem_calloc((size_t)R + 1, sizeof *occ_off);
    uint32_t *occ = kiri_mem_array((size_t)g->n_elems + 1, sizeof *occ);
    uint32_t *work = kiri_mem_array((size_t)R + 1, sizeof *work);
    int rc = need && occ_off && occ && work ? KIRI_OK : KIRI_E_NOMEM;
    uint32_t n_work = 0;
    if (rc == KIRI_OK) {
        memset(marked, 0, R);
        for (uint32_t a = 0; a < n_alts; a++) {
            if (live && !live[a]) {
                need[a] = NONE;
                continue;
            }
            for (uint32_t p = alt_start[a]; g->elems[p].kind != EL_END; p++) {
                if (g->elems[p].kind == EL_REF) {
                    need[a]++;
                } else if (terminals_block) {
                    need[a] = NONE;
                    break;
                }
            }
            if (need[a] != NONE)
                for (uint32_t p = alt_start[a]; g->elems[p].kind != EL_END; p++)
                    if (g->elems[p].kind == EL_REF)
                        occ_off[g->elems[p].arg + 1]++;
        }
        for (uint32_t r = 0; r < R; r++)
            occ_off[r + 1] += occ_off[r];
        uint32_t *fill = work; /* reused as a cursor before the worklist starts */
        memcpy(fill, occ_off, (size_t)R * sizeof *fill);
        for (uint32_t a = 0; a < n_alts; a++) {
            if (need[a] == NONE)
                continue;
            for (uint32_t p = alt_start[a]; g->elems[p].kind != EL_END; p++)
                if (g->elems[p].kind == EL_REF)
                    occ[fill[g->elems[p].arg]++] = a;
        }
        for (uint32_t a = 0; a < n_alts; a++)
            if (need[a] == 0 && !marked[alt_rule[a]]) {
                marked[alt_rule[a]] = 1;
                work[n_work++] = alt_rule[a];
            }
        while (n_work) {
            const uint32_t r = work[--n_work];
            for (uint32_t k = occ_off[r]; k < occ_off[r + 1]; k++) {
                const uint32_t a = occ[k];
                if (need[a] != NONE && need[a] > 0 && --need[a] == 0 && !marked[alt_rule[a]]) {
                    marked[alt_rule[a]] = 1;
                    work[n_work++] = alt_rule[a];
                }
            }
        }
    }
    kiri_mem_free(need);
    kiri_mem_free(occ_off);
    kiri_mem_free(occ);
    kiri_mem_free(work);
    return rc;
}

/* Finds a rule that reaches itself through a left edge (a reference preceded only by nullable
 * elements). Returns the rule or NONE; KIRI_E_NOMEM through *rc. */
static uint32_t left_cycle(const struct kiri_grammar *g, const uint8_t *nullable, int *rc)
{
    const uint32_t R = g->n_rules;
    uint8_t *color = kiri_mem_calloc(R, 1);
    uint32_t *stack_r = kiri_mem_array(R, sizeof *stack_r), *stack_a = kiri_mem_array(R, sizeof *stack_a);
    uint32_t *stack_p = kiri_mem_array(R, sizeof *stack_p);
    uint32_t found = NONE;
    if (!color || !stack_r || !stack_a || !stack_p) {
        *rc = KIRI_E_NOMEM;
    } else {
        for (uint32_t s = 0; s < R && found == NONE; s++) {
            if (color[s])
                continue;
            uint32_t top = 0;
            stack_r[0] = s, stack_a[0] = g->rule_alts[s], stack_p[0] = NONE;
            color[s] = 1;
            while (top != NONE && found == NONE) {
                const uint32_t r = stack_r[top];
                uint32_t next = NONE;
                /* The next left edge of r: stack_a is the alternative, stack_p the element. */
                while (next == NONE && stack_a[top] < g->rule_alts[r + 1]) {
                    uint32_t p = stack_p[top] == NONE ? g->alts[stack_a[top]] : stack_p[top];
                    const struct elem *e = &g->elems[p];
                    if (e->kind == EL_REF) {
                        next = e->arg;
                        stack_p[top] = nullable[e->arg] ? p + 1 : NONE;
                        if (!nullable[e->arg])
                            stack_a[top]++;
                    } else {
                        stack_p[top] = NONE;
                        stack_a[top]++;
                    }
                }
                if (next == NONE) {
                    color[r] = 2;
                    top = top == 0 ? NONE : top - 1;
                } else if (color[next] == 1) {
                    found = next;
                } else if (color[next] == 0) {
                    color[next] = 1;
                    top++;
                    stack_r[top] = next, stack_a[top] = g->rule_alts[next], stack_p[top] = NONE;
                }
            }
        }
    }
    kiri_mem_free(color);
    kiri_mem_free(stack_r);
    kiri_mem_free(stack_a);
    kiri_mem_free(stack_p);
    return found;
}

static void parser_free(struct parser *P)
{
    for (uint32_t r = 0; r < P->n_rules; r++)
        kiri_mem_free(P->rules[r].body.v);
    kiri_mem_free(P->rules);
    kiri_mem_free(P->names);
    kiri_mem_free(P->sets);
}

void kiri_grammar_free(struct kiri_grammar *g)
{
    if (!g)
        return;
    kiri_mem_free(g->elems);
    kiri_mem_free(g->alts);
    kiri_mem_free(g->rule_alts);
    kiri_mem_free(g->sets);
    kiri_mem_free(g);
}

/* Flattens the parsed rules into g and runs the checks. */
static void build(struct parser *P, struct kiri_grammar *g)
{
    const uint32_t R = P->n_rules;
    g->n_rules = R;
    g->elems = kiri_mem_array((size_t)P->total + 1, sizeof *g->elems);
    g->rule_alts = kiri_mem_calloc((size_t)R + 1, sizeof *g->rule_alts);
    uint32_t n_alts = 0;
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t k = 0; k < P->rules[r].body.n; k++)
            n_alts += P->rules[r].body.v[k].kind == EL_END;
    uint32_t *alt_start = kiri_mem_array((size_t)n_alts + 1, sizeof *alt_start);
    uint32_t *alt_rule = kiri_mem_array((size_t)n_alts + 1, sizeof *alt_rule);
    uint8_t *live = kiri_mem_array((size_t)n_alts + 1, 1);
    uint8_t *prod = kiri_mem_array((size_t)R + 1, 1), *nullable = kiri_mem_array((size_t)R + 1, 1);
    g->alts = kiri_mem_array((size_t)n_alts + 1, sizeof *g->alts);
    if (!g->elems || !g->rule_alts || !alt_start || !alt_rule || !live || !prod || !nullable || !g->alts) {
        nomem(P);
        goto out;
    }
    uint32_t n = 0, a = 0;
    for (uint32_t r = 0; r < R; r++) {
        const struct body *b = &P->rules[r].body;
        uint32_t start = n;
        for (uint32_t k = 0; k < b->n; k++) {
            g->elems[n++] = b->v[k];
            if (b->v[k].kind == EL_END) {
                alt_rule[a] = r;
                alt_start[a++] = start;
                start = n;
            }
        }
    }
    g->n_elems = n;
    /* Productive rules; alternatives naming an unproductive rule can never complete. */
    if (fixpoint(g, alt_rule, alt_start, n_alts, NULL, 0, prod) < 0) {
        nomem(P);
        goto out;
    }
    if (!prod[g->root]) {
        perr(P, P->rules[g->root].at, "no finite text matches rule 'root' (every alternative recurses forever)");
        goto out;
    }
    for (uint32_t k = 0; k < n_alts; k++) {
        live[k] = 1;
        for (uint32_t p = alt_start[k]; g->elems[p].kind != EL_END; p++)
            if (g->elems[p].kind == EL_REF && !prod[g->elems[p].arg])
                live[k] = 0;
    }
    uint32_t m = 0, k = 0;
    for (uint32_t r = 0; r < R; r++) {
        g->rule_alts[r] = m;
        for (; k < n_alts && alt_rule[k] == r; k++)
            if (live[k])
                g->alts[m++] = alt_start[k];
    }
    g->rule_alts[R] = m;
    /* No rule may reach itself without consuming input. */
    if (fixpoint(g, alt_rule, alt_start, n_alts, live, 1, nullable) < 0) {
        nomem(P);
        goto out;
    }
    int rc = KIRI_OK;
    const uint32_t cyc = left_cycle(g, nullable, &rc);
    if (rc < 0) {
        nomem(P);
    } else if (cyc != NONE) {
        const struct prule *pr = &P->rules[cyc];
        if (pr->name)
            perr(P, pr->at, "rule '%.*s' is left-recursive (it can reach itself without consuming input)",
                 (int)pr->name_len, pr->name);
        else
            perr(P, pr->at, "this repetition or group can repeat without consuming input (left recursion)");
    }
out:
    kiri_mem_free(alt_start);
    kiri_mem_free(alt_rule);
    kiri_mem_free(live);
    kiri_mem_free(prod);
    kiri_mem_free(nullable);
}

static int start_fits(const struct kiri_grammar *g, char *why, size_t cap);

int kiri_grammar_compile(const char *text, size_t len, struct kiri_grammar **out, struct kiri_status_info *info)
{
    kiri_error_clear(info);
    struct parser P;
    memset(&P, 0, sizeof P);
    P.s = text;
    P.n = len;
    P.info = info;
    P.any_rule = NONE;
    if (!text && len)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "grammar", -1, "the grammar text is missing");
    if (len > KIRI_GRAMMAR_MAX_SIZE)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "grammar", -1, "the grammar is larger than %zu bytes",
                             (size_t)KIRI_GRAMMAR_MAX_SIZE);
    P.names = kiri_mem_array(NAME_TABLE, sizeof *P.names);
    struct kiri_grammar *g = kiri_mem_calloc(1, sizeof *g);
    if (!P.names || !g) {
        kiri_mem_free(P.names);
        kiri_mem_free(g);
        return kiri_error_at(info, KIRI_E_NOMEM, "grammar", -1, "out of memory compiling the grammar");
    }
    memset(P.names, 0xFF, NAME_TABLE * sizeof *P.names);
    parse_grammar(&P);
    uint32_t root = NONE;
    for (uint32_t r = 0; r < P.n_rules && !P.rc; r++) {
        if (P.rules[r].name && !P.rules[r].defined)
            perr(&P, P.rules[r].at, "rule '%.*s' is used but never defined", (int)P.rules[r].name_len,
                 P.rules[r].name);
        if (P.rules[r].name && P.rules[r].name_len == 4 && memcmp(P.rules[r].name, "root", 4) == 0)
            root = r;
    }
    if (!P.rc && root == NONE)
        perr(&P, 0, "the grammar has no rule named 'root'");
    if (!P.rc) {
        g->root = root;
        build(&P, g);
    }
    if (!P.rc) {
        g->sets = P.sets;
        g->n_sets = P.n_sets;
        P.sets = NULL;
        g->fp[0] = hash_bytes(text, len, 1);
        g->fp[1] = hash_bytes(text, len, 0x51ED27);
        /* The start state must fit the bounds. */
        char why[128];
        const int rc = start_fits(g, why, sizeof why);
        if (rc == KIRI_E_NOMEM)
            nomem(&P);
        else if (rc < 0)
            perr(&P, 0, "the start of rule 'root' does not fit the matcher: %s", why);
    }
    const int rc = P.rc;
    parser_free(&P);
    if (rc) {
        kiri_grammar_free(g);
        return rc;
    }
    *out = g;
    return KIRI_OK;
}

int kiri_grammar_check(const char *gbnf, size_t len, struct kiri_status_info *info)
{
    struct kiri_grammar *g = NULL;
    const int rc = kiri_grammar_compile(gbnf, len, &g, info);
    kiri_grammar_free(g);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Matching
 * ------------------------------------------------------------------------------------------- */

/* A stack entry: a position and the entry below it (NONE at the bottom). */
struct node {
    uint32_t pos, parent, depth, pad;
    uint64_t h;             /* content hash of the whole stack from here down */
};

/* A set of stacks: their top node ids, and whether the empty stack is in it. */
struct set {
    uint32_t *v;            /* owned */
    uint32_t n, cap;
    int acc;
};

#define LEVELS (KIRI_TOKENIZER_MAX_TOKEN_LEN + 2)
#define MAX_NODES (1u << 24)
#define MAX_EXPAND 2048

struct kiri_grammar_state {
    const struct kiri_grammar *g;   /* borrowed */
    struct node *nodes;             /* owned arena */
    uint32_t *seen;                 /* owned, one stamp per node: already in the set being built */
    uint32_t n_nodes, cap_nodes, stamp, compact_at;
    uint32_t *table;                /* owned: interning hash table of node ids */
    uint32_t table_cap;
    struct set cur;                 /* the state */
    struct set tmp[2];              /* feed scratch */
    struct set lv[LEVELS];          /* mask walk: the set after each byte of the trie path */
    uint32_t mark[LEVELS];          /* arena size when each level was made */
    uint32_t *mask;                 /* owned: the mask when there is no cache */
    size_t mask_words;
    uint8_t *key;                   /* owned: cache key scratch */
    size_t key_cap;
    uint64_t *order;                /* owned: sort scratch for the key */
    uint32_t order_cap;
    /* The mask walk's memo: the distinct stack sets met in one walk, numbered (their node ids in
     * pool[off[s] .. off[s] + n[s]), sorted), each with its transitions by byte (trans[s * 256 + c]:
     * MEMO_UNKNOWN, MEMO_DEAD, or the next set). All owned; emptied at the start of every walk. */
    uint32_t *ms_pool, *ms_off, *ms_n, *ms_table;
    uint8_t *ms_acc;
    int32_t *ms_trans;
    uint32_t ms_pool_n, ms_pool_cap, ms_count, ms_cap;
    /* The references one advance has expanded, keyed (position << 32 | parent) and valid when their
     * stamp is st->stamp: a reference reached again over the same parent adds nothing new, so an
     * ambiguous grammar whose paths converge costs one expansion, not one per path. Owned. */
    uint64_t *vis_key;
    uint32_t *vis_stamp;
    uint32_t vis_cap, vis_n;
    /* Work of the current call (stacks moved, elements expanded) and its budget. */
    uint64_t steps, budget, budget_n;
    const char *budget_what;        /* static: what the budget is for, for the message */
    uint32_t peak;                  /* the most stacks one set has held since the last reset */
    int err;
    char why[128];                  /* which bound the last KIRI_E_UNSUPPORTED passed */
};

#define MEMO_MAX 4096
#define MEMO_TABLE (2 * MEMO_MAX)
#define MEMO_UNKNOWN (-2)
#define MEMO_DEAD (-1)

/* Records that a bound was passed (the first one of a call is the one reported). */
static void over(struct kiri_grammar_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void over(struct kiri_grammar_state *st, const char *fmt, ...)
{
    if (st->err)
        return;
    st->err = KIRI_E_UNSUPPORTED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(st->why, sizeof st->why, fmt, ap);
    va_end(ap);
}

static void over_stacks(struct kiri_grammar_state *st)
{
    over(st, "grammar too ambiguous: more than %d parse stacks", KIRI_GRAMMAR_MAX_STACKS);
}

/* Allows n more steps of work, for what (a static phrase: "one byte"). st->steps counts the work
 * of the whole call (zeroed where a call starts). */
static void budget(struct kiri_grammar_state *st, uint64_t n, const char *what)
{
    st->budget = st->steps + n;
    st->budget_what = what;
    st->budget_n = n;
}

/* Counts n steps of work against the budget. */
static int work(struct kiri_grammar_state *st, uint64_t n)
{
    st->steps += n;
    if (st->steps <= st->budget)
        return 1;
    over(st, "grammar too ambiguous: %s needs more than %llu matching steps", st->budget_what,
         (unsigned long long)st->budget_n);
    return 0;
}

static uint32_t slot_of(uint32_t pos, uint32_t parent)
{
    return (uint32_t)(mix64((uint64_t)pos << 32 | parent) >> 32);
}

static int rehash(struct kiri_grammar_state *st, uint32_t cap)
{
    uint32_t *t = kiri_mem_array(cap, sizeof *t);
    if (!t)
        return KIRI_E_NOMEM;
    memset(t, 0xFF, (size_t)cap * sizeof *t);
    for (uint32_t k = 0; k < st->n_nodes; k++) {
        uint32_t i = slot_of(st->nodes[k].pos, st->nodes[k].parent) & (cap - 1);
        while (t[i] != NONE)
            i = (i + 1) & (cap - 1);
        t[i] = k;
    }
    kiri_mem_free(st->table);
    st->table = t;
    st->table_cap = cap;
    return KIRI_OK;
}

/* The node for (pos, parent), made if new. NONE with st->err set past the bounds. */
static uint32_t intern(struct kiri_grammar_state *st, uint32_t pos, uint32_t parent)
{
    uint32_t m = st->table_cap - 1, i = slot_of(pos, parent) & m;
    for (uint32_t k; (k = st->table[i]) != NONE; i = (i + 1) & m)
        if (st->nodes[k].pos == pos && st->nodes[k].parent == parent)
            return k;
    const uint32_t depth = parent == NONE ? 1 : st->nodes[parent].depth + 1;
    if (depth > KIRI_GRAMMAR_MAX_DEPTH) {
        over(st, "grammar nests deeper than %d levels", KIRI_GRAMMAR_MAX_DEPTH);
        return NONE;
    }
    if (st->n_nodes >= MAX_NODES) {
        over(st, "grammar state needs more than %u stack entries", MAX_NODES);
        return NONE;
    }
    if (st->n_nodes == st->cap_nodes) {
        const uint32_t cap = st->cap_nodes * 2;
        struct node *nv = kiri_mem_realloc(st->nodes, (size_t)cap * sizeof *nv);
        if (nv)
            st->nodes = nv;
        uint32_t *sv = nv ? kiri_mem_realloc(st->seen, (size_t)cap * sizeof *sv) : NULL;
        if (!sv) {
            st->err = KIRI_E_NOMEM;
            return NONE;
        }
        st->seen = sv;
        st->cap_nodes = cap;
    }
    if ((st->n_nodes + 1) * 2 > st->table_cap) {
        if (rehash(st, st->table_cap * 2) < 0) {
            st->err = KIRI_E_NOMEM;
            return NONE;
        }
        m = st->table_cap - 1;
        for (i = slot_of(pos, parent) & m; st->table[i] != NONE; i = (i + 1) & m) {
        }
    }
    const uint32_t k = st->n_nodes++;
    st->nodes[k] = (struct node){pos, parent, depth, 0, mix64((parent == NONE ? 0x1234567ull : st->nodes[parent].h) * 0x9E3779B97F4A7C15ull + pos + 1)};
    st->seen[k] = 0;
    st->table[i] = k;
    return k;
}

/* Forgets the nodes made since the arena held mark of them (the latest first, which keeps the
 * linear-probing table exact). */
static void truncate_nodes(struct kiri_grammar_state *st, uint32_t mark)
{
    const uint32_t m = st->table_cap - 1;
    while (st->n_nodes > mark) {
        const uint32_t k = --st->n_nodes;
        uint32_t i = slot_of(st->nodes[k].pos, st->nodes[k].parent) & m;
        while (st->table[i] != k)
            i = (i + 1) & m;
        st->table[i] = NONE;
    }
}

static void set_add(struct kiri_grammar_state *st, struct set *s, uint32_t k)
{
    if (st->seen[k] == st->stamp)
        return;
    st->seen[k] = st->stamp;
    if (s->n >= KIRI_GRAMMAR_MAX_STACKS) {
        over_stacks(st);
        return;
    }
    if (s->n == s->cap) {
        const uint32_t cap = s->cap ? 2 * s->cap : 16;
        uint32_t *v = kiri_mem_realloc(s->v, (size_t)cap * sizeof *v);
        if (!v) {
            st->err = KIRI_E_NOMEM;
            return;
        }
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = k;
    if (s->n > st->peak)
        st->peak = s->n;
}

/* Marks reference position pos over parent as expanded in this advance; 0 when it already was. */
static int first_visit(struct kiri_grammar_state *st, uint32_t pos, uint32_t parent)
{
    if ((st->vis_n + 1) * 2 > st->vis_cap) {
        const uint32_t cap = st->vis_cap ? 2 * st->vis_cap : 256;
        uint64_t *key = kiri_mem_array(cap, sizeof *key);
        uint32_t *stamp = kiri_mem_calloc(cap, sizeof *stamp);
        if (!key || !stamp) {
            kiri_mem_free(key);
            kiri_mem_free(stamp);
            st->err = KIRI_E_NOMEM;
            return 0;
        }
        for (uint32_t k = 0; k < st->vis_cap; k++) {
            if (st->vis_stamp[k] != st->stamp)
                continue;
            uint32_t i = (uint32_t)mix64(st->vis_key[k]) & (cap - 1);
            while (stamp[i] == st->stamp)
                i = (i + 1) & (cap - 1);
            key[i] = st->vis_key[k];
            stamp[i] = st->stamp;
        }
        kiri_mem_free(st->vis_key);
        kiri_mem_free(st->vis_stamp);
        st->vis_key = key;
        st->vis_stamp = stamp;
        st->vis_cap = cap;
    }
    const uint64_t key = (uint64_t)pos << 32 | parent;
    const uint32_t m = st->vis_cap - 1;
    uint32_t i = (uint32_t)mix64(key) & m;
    for (; st->vis_stamp[i] == st->stamp; i = (i + 1) & m)
        if (st->vis_key[i] == key)
            return 0;
    st->vis_key[i] = key;
    st->vis_stamp[i] = st->stamp;
    st->vis_n++;
    return 1;
}

/* Adds to out every stack that starts at pos over parent, references expanded. */
static void expand(struct kiri_grammar_state *st, struct set *out, uint32_t pos, uint32_t parent, int depth)
{
    const struct kiri_grammar *g = st->g;
    for (;;) {
        if (st->err || !work(st, 1))
            return;
        const struct elem *e = &g->elems[pos];
        if (e->kind == EL_END) {
            if (parent == NONE) {
                out->acc = 1;
                return;
            }
            pos = st->nodes[parent].pos;
            parent = st->nodes[parent].parent;
            continue;
        }
        if (e->kind != EL_REF) {
            const uint32_t k = intern(st, pos, parent);
            if (k != NONE)
                set_add(st, out, k);
            return;
        }
        if (!first_visit(st, pos, parent))
            return;
        if (depth >= MAX_EXPAND) {
            over(st, "grammar expands more than %d references without reading a byte", MAX_EXPAND);
            return;
        }
        uint32_t cparent = parent;
        if (g->elems[pos + 1].kind != EL_END && (cparent = intern(st, pos + 1, parent)) == NONE)
            return;
        const uint32_t a0 = g->rule_alts[e->arg], a1 = g->rule_alts[e->arg + 1];
        if (a0 == a1)
            return;
        for (uint32_t a = a0; a + 1 < a1; a++)
            expand(st, out, g->alts[a], cparent, depth + 1);
        pos = g->alts[a1 - 1];
        parent = cparent;
        depth++;
    }
}

static int byte_ok(const struct kiri_grammar *g, const struct elem *e, uint8_t c)
{
    if (e->kind == EL_RANGE)
        return c >= e->lo && c <= e->hi;
    return (g->sets[(size_t)e->arg * 8 + c / 32] >> (c % 32)) & 1;
}

static void next_stamp(struct kiri_grammar_state *st)
{
    st->vis_n = 0;
    if (++st->stamp == 0) {
        memset(st->seen, 0, (size_t)st->cap_nodes * sizeof *st->seen);
        if (st->vis_stamp)
            memset(st->vis_stamp, 0, (size_t)st->vis_cap * sizeof *st->vis_stamp);
        st->stamp = 1;
    }
}

/* out = the stacks of in after byte c. */
static void advance(struct kiri_grammar_state *st, const struct set *in, uint8_t c, struct set *out)
{
    const struct kiri_grammar *g = st->g;
    out->n = 0;
    out->acc = 0;
    next_stamp(st);
    if (!work(st, in->n))
        return;
    for (uint32_t k = 0; k < in->n && !st->err; k++) {
        const struct node *nd = &st->nodes[in->v[k]];
        if (byte_ok(g, &g->elems[nd->pos], c)) {
            const uint32_t pos = nd->pos + 1, parent = nd->parent;
            expand(st, out, pos, parent, 0);
        }
    }
}

void kiri_grammar_state_reset(struct kiri_grammar_state *st)
{
    st->n_nodes = 0;
    memset(st->table, 0xFF, (size_t)st->table_cap * sizeof *st->table);
    st->err = 0;
    st->why[0] = 0;
    st->cur.n = 0;
    st->cur.acc = 0;
    st->peak = 0;
    st->steps = 0;
    next_stamp(st);
    budget(st, KIRI_GRAMMAR_MAX_BYTE_WORK, "the start of rule 'root'");
    const struct kiri_grammar *g = st->g;
    for (uint32_t a = g->rule_alts[g->root]; a < g->rule_alts[g->root + 1]; a++)
        expand(st, &st->cur, g->alts[a], NONE, 0);
}

void kiri_grammar_state_free(struct kiri_grammar_state *st)
{
    if (!st)
        return;
    kiri_mem_free(st->nodes);
    kiri_mem_free(st->seen);
    kiri_mem_free(st->table);
    kiri_mem_free(st->cur.v);
    for (int k = 0; k < 2; k++)
        kiri_mem_free(st->tmp[k].v);
    for (int k = 0; k < LEVELS; k++)
        kiri_mem_free(st->lv[k].v);
    kiri_mem_free(st->mask);
    kiri_mem_free(st->key);
    kiri_mem_free(st->order);
    kiri_mem_free(st->ms_pool);
    kiri_mem_free(st->ms_off);
    kiri_mem_free(st->ms_n);
    kiri_mem_free(st->ms_table);
    kiri_mem_free(st->ms_acc);
    kiri_mem_free(st->ms_trans);
    kiri_mem_free(st->vis_key);
    kiri_mem_free(st->vis_stamp);
    kiri_mem_free(st);
}

/* A state at the start of g's root; *out is set (and owned by the caller) unless out of memory,
 * even when the start passes a bound. */
static int state_open(const struct kiri_grammar *g, struct kiri_grammar_state **out)
{
    struct kiri_grammar_state *st = kiri_mem_calloc(1, sizeof *st);
    if (!st)
        return KIRI_E_NOMEM;
    st->g = g;
    st->cap_nodes = 256;
    st->table_cap = 1024;
    st->compact_at = 1 << 16;
    st->nodes = kiri_mem_array(st->cap_nodes, sizeof *st->nodes);
    st->seen = kiri_mem_calloc(st->cap_nodes, sizeof *st->seen);
    st->table = kiri_mem_array(st->table_cap, sizeof *st->table);
    if (!st->nodes || !st->seen || !st->table) {
        kiri_grammar_state_free(st);
        return KIRI_E_NOMEM;
    }
    kiri_grammar_state_reset(st);
    if (st->err == KIRI_E_NOMEM) {
        kiri_grammar_state_free(st);
        return KIRI_E_NOMEM;
    }
    *out = st;
    return st->err;
}

int kiri_grammar_state_init(const struct kiri_grammar *g, struct kiri_grammar_state **out)
{
    struct kiri_grammar_state *st = NULL;
    const int rc = state_open(g, &st);
    if (rc < 0) {
        kiri_grammar_state_free(st);
        return rc;
    }
    *out = st;
    return KIRI_OK;
}

/* Does the start state fit the bounds? KIRI_OK, or the error and in why the bound it passed. */
static int start_fits(const struct kiri_grammar *g, char *why, size_t cap)
{
    struct kiri_grammar_state *st = NULL;
    const int rc = state_open(g, &st);
    if (rc < 0 && st)
        snprintf(why, cap, "%s", st->why);
    kiri_grammar_state_free(st);
    return rc;
}

/* Keeps only the nodes the current stacks use (parents always precede their children). */
static int compact(struct kiri_grammar_state *st)
{
    uint32_t *remap = kiri_mem_array(st->n_nodes + 1, sizeof *remap);
    if (!remap)
        return KIRI_E_NOMEM;
    next_stamp(st);
    for (uint32_t k = 0; k < st->cur.n; k++)
        for (uint32_t x = st->cur.v[k]; x != NONE && st->seen[x] != st->stamp; x = st->nodes[x].parent)
            st->seen[x] = st->stamp;
    uint32_t n = 0;
    for (uint32_t k = 0; k < st->n_nodes; k++) {
        if (st->seen[k] != st->stamp) {
            remap[k] = NONE;
            continue;
        }
        struct node nd = st->nodes[k];
        if (nd.parent != NONE)
            nd.parent = remap[nd.parent];
        remap[k] = n;
        st->nodes[n] = nd;
        st->seen[n++] = 0;
    }
    st->n_nodes = n;
    for (uint32_t k = 0; k < st->cur.n; k++)
        st->cur.v[k] = remap[st->cur.v[k]];
    kiri_mem_free(remap);
    next_stamp(st);
    return rehash(st, st->table_cap);
}

int kiri_grammar_state_feed(struct kiri_grammar_state *st, const void *bytes, size_t n)
{
    const uint8_t *b = bytes;
    const uint32_t mark = st->n_nodes;
    const struct set *in = &st->cur;
    st->err = 0;
    st->steps = 0;
    for (size_t i = 0; i < n; i++) {
        struct set *out = &st->tmp[i & 1];
        budget(st, KIRI_GRAMMAR_MAX_BYTE_WORK, "one byte");
        advance(st, in, b[i], out);
        if (st->err || (out->n == 0 && !out->acc)) {
            const int rc = st->err ? st->err : KIRI_E_INVALID_ARG;
            truncate_nodes(st, mark);
            st->err = 0;
            return rc;
        }
        in = out;
    }
    if (n) {
        struct set t = st->cur;
        st->cur = *in;
        st->tmp[(n - 1) & 1] = t;
    }
    if (st->n_nodes > st->compact_at) {
        const int rc = compact(st);
        if (rc < 0)
            return rc;
        st->compact_at = st->n_nodes * 2 > (1u << 16) ? st->n_nodes * 2 : 1u << 16;
    }
    return KIRI_OK;
}

int kiri_grammar_state_can_end(const struct kiri_grammar_state *st) { return st->cur.acc; }

const char *kiri_grammar_state_error(const struct kiri_grammar_state *st) { return st->why; }

void kiri_grammar_state_stats(const struct kiri_grammar_state *st, struct kiri_grammar_stats *out)
{
    out->n_stacks = st->cur.n;
    out->peak_stacks = st->peak;
    out->steps = st->steps;
}

int kiri_grammar_state_done(const struct kiri_grammar_state *st) { return st->cur.n == 0; }

/* ---------------------------------------------------------------------------------------------
 * The vocabulary trie
 * ------------------------------------------------------------------------------------------- */

struct kiri_grammar_vocab {
    int32_t n_vocab;
    uint8_t *pieces;        /* owned: every kept token's bytes */
    uint32_t *piece_off;    /* owned (n_vocab + 1): token id's bytes are pieces[off[id]..off[id+1]) */
    /* The trie in preorder: node i's subtree is [i, end[i]); tokens whose bytes end at node i are
     * tok_ids[tok[i] .. tok[i] + n_tok[i]). */
    uint32_t n_nodes;
    uint8_t *byte;
    uint16_t *depth;
    uint32_t *end;
    uint32_t *tok;
    uint16_t *n_tok;
    int32_t *tok_ids;
    int32_t *eog;           /* owned: end-of-generation ids */
    int32_t n_eog;
};

void kiri_grammar_vocab_free(struct kiri_grammar_vocab *v)
{
    if (!v)
        return;
    kiri_mem_free(v->pieces);
    kiri_mem_free(v->piece_off);
    kiri_mem_free(v->byte);
    kiri_mem_free(v->depth);
    kiri_mem_free(v->end);
    kiri_mem_free(v->tok);
    kiri_mem_free(v->n_tok);
    kiri_mem_free(v->tok_ids);
    kiri_mem_free(v->eog);
    kiri_mem_free(v);
}

int32_t kiri_grammar_vocab_n_vocab(const struct kiri_grammar_vocab *v) { return v->n_vocab; }

const uint8_t *kiri_grammar_vocab_piece(const struct kiri_grammar_vocab *v, int32_t id, size_t *len)
{
    if (id < 0 || id >= v->n_vocab) {
        *len = 0;
        return NULL;
    }
    *len = v->piece_off[id + 1] - v->piece_off[id];
    return *len ? v->pieces + v->piece_off[id] : NULL;
}

struct sort_item {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
};

static int item_cmp(const void *a, const void *b)
{
    const struct sort_item *x = a, *y = b;
    const uint32_t n = x->len < y->len ? x->len : y->len;
    const int c = memcmp(x->p, y->p, n);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int kiri_grammar_vocab_init(const struct kiri_tokenizer *t, struct kiri_grammar_vocab **out)
{
    const int32_t V = kiri_tokenizer_n_vocab(t);
    struct kiri_grammar_vocab *v = kiri_mem_calloc(1, sizeof *v);
    struct sort_item *items = NULL;
    int rc = KIRI_E_NOMEM;
    if (!v)
        return rc;
    v->n_vocab = V;
    v->piece_off = kiri_mem_array((size_t)V + 1, sizeof *v->piece_off);
    v->eog = kiri_mem_array((size_t)V + 1, sizeof *v->eog);
    size_t cap = (size_t)V * 8 + 256, used = 0;
    v->pieces = kiri_mem_alloc(cap);
    if (!v->piece_off || !v->eog || !v->pieces)
        goto fail;
    uint32_t n_items = 0;
    for (int32_t id = 0; id < V; id++) {
        v->piece_off[id] = (uint32_t)used;
        if (kiri_tokenizer_is_eog(t, id)) {
            v->eog[v->n_eog++] = id;
            continue;
        }
        if (kiri_tokenizer_is_control(t, id))
            continue;
        if (used + KIRI_TOKENIZER_MAX_TOKEN_LEN + 8 > cap) {
            cap *= 2;
            uint8_t *p = kiri_mem_realloc(v->pieces, cap);
            if (!p)
                goto fail;
            v->pieces = p;
        }
        const int n = kiri_tokenizer_piece(t, id, 0, (char *)v->pieces + used, KIRI_TOKENIZER_MAX_TOKEN_LEN + 8);
        if (n > 0 && n <= KIRI_TOKENIZER_MAX_TOKEN_LEN) {
            used += (size_t)n;
            n_items++;
        }
    }
    v->piece_off[V] = (uint32_t)used;
    items = kiri_mem_array((size_t)n_items + 1, sizeof *items);
    /* At most one node per byte of every piece. */
    v->byte = kiri_mem_array(used + 1, 1);
    v->depth = kiri_mem_array(used + 1, sizeof *v->depth);
    v->end = kiri_mem_array(used + 1, sizeof *v->end);
    v->tok = kiri_mem_array(used + 1, sizeof *v->tok);
    v->n_tok = kiri_mem_array(used + 1, sizeof *v->n_tok);
    v->tok_ids = kiri_mem_array((size_t)n_items + 1, sizeof *v->tok_ids);
    if (!items || !v->byte || !v->depth || !v->end || !v->tok || !v->n_tok || !v->tok_ids)
        goto fail;
    n_items = 0;
    for (int32_t id = 0; id < V; id++) {
        const uint32_t len = v->piece_off[id + 1] - v->piece_off[id];
        if (len)
            items[n_items++] = (struct sort_item){v->pieces + v->piece_off[id], len, id};
    }
    qsort(items, n_items, sizeof *items, item_cmp);
    uint32_t path[KIRI_TOKENIZER_MAX_TOKEN_LEN + 1];
    uint32_t plen = 0, n = 0;
    for (uint32_t k = 0; k < n_items; k++) {
        const struct sort_item *it = &items[k];
        v->tok_ids[k] = it->id;
        uint32_t l = 0;
        if (k > 0) {
            const struct sort_item *pv = &items[k - 1];
            while (l < pv->len && l < it->len && pv->p[l] == it->p[l])
                l++;
            if (l == it->len && l == pv->len) { /* the same bytes as the previous token */
                if (v->n_tok[path[l - 1]] < UINT16_MAX) {
                    v->n_tok[path[l - 1]]++;
                    continue;
                }
                l--; /* (never in real vocabularies) a sibling node with the same byte */
            }
        }
        while (plen > l)
            v->end[path[--plen]] = n;
        for (; plen < it->len; plen++) {
            v->byte[n] = it->p[plen];
            v->depth[n] = (uint16_t)(plen + 1);
            v->tok[n] = 0;
            v->n_tok[n] = 0;
            path[plen] = n++;
        }
        v->tok[path[plen - 1]] = k;
        v->n_tok[path[plen - 1]] = 1;
    }
    while (plen > 0)
        v->end[path[--plen]] = n;
    v->n_nodes = n;
    kiri_mem_free(items);
    *out = v;
    return KIRI_OK;
fail:
    kiri_mem_free(items);
    kiri_grammar_vocab_free(v);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Masks and their cache
 * ------------------------------------------------------------------------------------------- */

struct centry {
    uint64_t hash;
    struct centry *hnext;           /* bucket chain */
    struct centry *prev, *next;     /* LRU list, most recent first */
    uint32_t key_len;
    int32_t n_allowed;
    size_t bytes;
    uint8_t *key;                   /* in the same allocation */
    uint32_t *mask;                 /* in the same allocation */
};

struct kiri_grammar_cache {
    size_t budget, used;
    struct centry **buckets;        /* owned */
    uint32_t n_buckets, n_entries;
    struct centry lru;              /* sentinel */
    uint64_t computed, hits;
};

int kiri_grammar_cache_init(size_t budget, struct kiri_grammar_cache **out)
{
    struct kiri_grammar_cache *c = kiri_mem_calloc(1, sizeof *c);
    if (!c)
        return KIRI_E_NOMEM;
    c->budget = budget;
    c->n_buckets = 1024;
    c->buckets = kiri_mem_calloc(c->n_buckets, sizeof *c->buckets);
    if (!c->buckets) {
        kiri_mem_free(c);
        return KIRI_E_NOMEM;
    }
    c->lru.prev = c->lru.next = &c->lru;
    *out = c;
    return KIRI_OK;
}

void kiri_grammar_cache_free(struct kiri_grammar_cache *c)
{
    if (!c)
        return;
    for (struct centry *e = c->lru.next; e != &c->lru;) {
        struct centry *nx = e->next;
        kiri_mem_free(e);
        e = nx;
    }
    kiri_mem_free(c->buckets);
    kiri_mem_free(c);
}

void kiri_grammar_cache_counts(const struct kiri_grammar_cache *c, uint64_t *computed, uint64_t *hits)
{
    *computed = c->computed;
    *hits = c->hits;
}

static void lru_unlink(struct centry *e)
{
    e->prev->next = e->next;
    e->next->prev = e->prev;
}

static void lru_front(struct kiri_grammar_cache *c, struct centry *e)
{
    e->next = c->lru.next;
    e->prev = &c->lru;
    c->lru.next->prev = e;
    c->lru.next = e;
}

static void evict(struct kiri_grammar_cache *c)
{
    struct centry *e = c->lru.prev;
    lru_unlink(e);
    struct centry **p = &c->buckets[e->hash & (c->n_buckets - 1)];
    while (*p != e)
        p = &(*p)->hnext;
    *p = e->hnext;
    c->used -= e->bytes;
    c->n_entries--;
    kiri_mem_free(e);
}

static int order_cmp(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The length of the state's cache key. States whose key would pass KEY_MAX (thousands of deep
 * stacks, which no practical grammar keeps) are not cached: writing and comparing such keys would
 * cost more than the bounded walk. */
#define KEY_MAX ((size_t)1 << 18)

static size_t key_size(const struct kiri_grammar_state *st)
{
    size_t need = 32;
    for (uint32_t k = 0; k < st->cur.n; k++)
        need += 4 + 4 * (size_t)st->nodes[st->cur.v[k]].depth;
    return need;
}

/* Writes the state's exact content (grammar, vocabulary size, end flag, every stack in order of
 * its hash) into st->key. Returns its length, or 0 when out of memory. */
static size_t state_key(struct kiri_grammar_state *st, int32_t n_vocab)
{
    const size_t need = key_size(st);
    if (st->cur.n > st->order_cap) {
        uint64_t *o = kiri_mem_realloc(st->order, (size_t)st->cur.n * sizeof *o);
        if (!o)
            return 0;
        st->order = o;
        st->order_cap = st->cur.n;
    }
    for (uint32_t k = 0; k < st->cur.n; k++) {
        const struct node *nd = &st->nodes[st->cur.v[k]];
        /* hash in the high bits, position in the set in the low ones (unique, so sorting is total) */
        st->order[k] = (nd->h & ~0xFFFFull) | k;
    }
    if (need > st->key_cap) {
        uint8_t *p = kiri_mem_realloc(st->key, need * 2);
        if (!p)
            return 0;
        st->key = p;
        st->key_cap = need * 2;
    }
    if (st->cur.n > 1)
        qsort(st->order, st->cur.n, sizeof *st->order, order_cmp);
    uint8_t *w = st->key;
    memcpy(w, st->g->fp, 16), w += 16;
    memcpy(w, &n_vocab, 4), w += 4;
    const uint32_t head = (uint32_t)st->cur.acc | st->cur.n << 1;
    memcpy(w, &head, 4), w += 4;
    for (uint32_t k = 0; k < st->cur.n; k++) {
        uint32_t x = st->cur.v[st->order[k] & 0xFFFF];
        memcpy(w, &st->nodes[x].depth, 4), w += 4;
        for (; x != NONE; x = st->nodes[x].parent)
            memcpy(w, &st->nodes[x].pos, 4), w += 4;
    }
    return (size_t)(w - st->key);
}

static int u32_cmp(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

/* The memo number of set s (sorted in place), added if new. NONE when the memo is full or out of
 * memory: the walk then goes on without it. */
static uint32_t memo_state(struct kiri_grammar_state *st, struct set *s)
{
    if (s->n > 1)
        qsort(s->v, s->n, sizeof *s->v, u32_cmp);
    uint64_t h = (uint64_t)s->acc + 0x9E37;
    for (uint32_t k = 0; k < s->n; k++)
        h = mix64(h + s->v[k]);
    uint32_t i = (uint32_t)h & (MEMO_TABLE - 1);
    for (uint32_t x; (x = st->ms_table[i]) != NONE; i = (i + 1) & (MEMO_TABLE - 1))
        if (st->ms_n[x] == s->n && st->ms_acc[x] == s->acc &&
            (s->n == 0 || memcmp(st->ms_pool + st->ms_off[x], s->v, (size_t)s->n * sizeof *s->v) == 0))
            return x;
    if (st->ms_count >= MEMO_MAX)
        return NONE;
    if (st->ms_count == st->ms_cap) {
        const uint32_t cap = st->ms_cap ? 2 * st->ms_cap : 16;
        uint32_t *off = kiri_mem_realloc(st->ms_off, (size_t)cap * sizeof *off);
        if (off)
            st->ms_off = off;
        uint32_t *n = off ? kiri_mem_realloc(st->ms_n, (size_t)cap * sizeof *n) : NULL;
        if (n)
            st->ms_n = n;
        uint8_t *acc = n ? kiri_mem_realloc(st->ms_acc, cap) : NULL;
        if (acc)
            st->ms_acc = acc;
        int32_t *tr = acc ? kiri_mem_realloc(st->ms_trans, (size_t)cap * 256 * sizeof *tr) : NULL;
        if (!tr)
            return NONE;
        st->ms_trans = tr;
        st->ms_cap = cap;
    }
    if (st->ms_pool_n + s->n > st->ms_pool_cap) {
        const uint32_t cap = (st->ms_pool_n + s->n) * 2 + 64;
        uint32_t *pool = kiri_mem_realloc(st->ms_pool, (size_t)cap * sizeof *pool);
        if (!pool)
            return NONE;
        st->ms_pool = pool;
        st->ms_pool_cap = cap;
    }
    const uint32_t x = st->ms_count++;
    st->ms_off[x] = st->ms_pool_n;
    st->ms_n[x] = s->n;
    st->ms_acc[x] = (uint8_t)s->acc;
    if (s->n)
        memcpy(st->ms_pool + st->ms_pool_n, s->v, (size_t)s->n * sizeof *s->v);
    st->ms_pool_n += s->n;
    for (int c = 0; c < 256; c++)
        st->ms_trans[(size_t)x * 256 + (size_t)c] = MEMO_UNKNOWN;
    st->ms_table[i] = x;
    return x;
}

/* The mask walk over numbered stack sets: a transition met once (the same set and byte under
 * another trie node) costs one table read afterwards, so a state whose sets repeat (inside a
 * string nearly every byte leads back to the same set) walks the trie at a few nanoseconds a
 * node. Returns KIRI_E_BUSY when the memo fills up (the caller then walks without it). */
static int compute_mask_memo(struct kiri_grammar_state *st, const struct kiri_grammar_vocab *v, uint32_t *m,
                             int32_t *count)
{
    if (!st->ms_table && !(st->ms_table = kiri_mem_array(MEMO_TABLE, sizeof *st->ms_table)))
        return KIRI_E_NOMEM;
    if (!st->ms_pool) {
        if (!(st->ms_pool = kiri_mem_array(64, sizeof *st->ms_pool)))
            return KIRI_E_NOMEM;
        st->ms_pool_cap = 64;
    }
    memset(st->ms_table, 0xFF, MEMO_TABLE * sizeof *st->ms_table);
    st->ms_count = st->ms_pool_n = 0;
    const uint32_t base = st->n_nodes;
    st->err = 0;
    uint32_t sid[LEVELS];
    if ((sid[0] = memo_state(st, &st->cur)) == NONE)
        return KIRI_E_BUSY;
    int32_t allowed = 0;
    int rc = KIRI_OK;
    struct set *tmp = &st->tmp[0];
    for (uint32_t i = 0; i < v->n_nodes;) {
        const uint32_t d = v->depth[i];
        const size_t at = (size_t)sid[d - 1] * 256 + v->byte[i];
        int32_t t = st->ms_trans[at];
        if (t == MEMO_UNKNOWN) {
            const uint32_t from = sid[d - 1];
            const struct set in = {st->ms_pool + st->ms_off[from], st->ms_n[from], 0, st->ms_acc[from]};
            advance(st, &in, v->byte[i], tmp);
            if (st->err) {
                rc = st->err;
                break;
            }
            if (tmp->n == 0 && !tmp->acc) {
                t = MEMO_DEAD;
            } else {
                const uint32_t x = memo_state(st, tmp);
                if (x == NONE) {
                    rc = KIRI_E_BUSY;
                    break;
                }
                t = (int32_t)x;
            }
            st->ms_trans[at] = t;
        }
        if (t == MEMO_DEAD) {
            i = v->end[i];
            continue;
        }
        for (uint32_t k = 0; k < v->n_tok[i]; k++) {
            const int32_t id = v->tok_ids[v->tok[i] + k];
            m[id / 32] |= 1u << (id % 32);
            allowed++;
        }
        if (st->ms_n[t] == 0) {
            i = v->end[i];
            continue;
        }
        sid[d] = (uint32_t)t;
        i++;
    }
    truncate_nodes(st, base);
    st->err = 0;
    *count = allowed;
    return rc;
}

/* The work a mask may take. A walk's work grows with the vocabulary only where the memo cannot
 * serve it (each trie node then moves its stacks), hence a part per trie node. */
static uint64_t mask_budget(const struct kiri_grammar_vocab *v)
{
    return KIRI_GRAMMAR_MASK_WORK + (uint64_t)KIRI_GRAMMAR_MASK_WORK_PER_NODE * v->n_nodes;
}

static int compute_mask(struct kiri_grammar_state *st, const struct kiri_grammar_vocab *v, uint32_t *m,
                        int32_t *count)
{
    const size_t words = ((size_t)v->n_vocab + 31) / 32;
    memset(m, 0, words * sizeof *m);
    int32_t allowed = 0;
    budget(st, mask_budget(v), "one token mask");
    int rc = compute_mask_memo(st, v, m, &allowed);
    if (rc != KIRI_E_BUSY) {
        if (rc == KIRI_OK)
            goto end_tokens;
        return rc;
    }
    memset(m, 0, words * sizeof *m);
    allowed = 0;
    const uint32_t base = st->n_nodes;
    st->err = 0;
    st->mark[0] = base;
    for (uint32_t i = 0; i < v->n_nodes;) {
        const uint32_t d = v->depth[i];
        const struct set *in = d == 1 ? &st->cur : &st->lv[d - 1];
        struct set *out = &st->lv[d];
        truncate_nodes(st, st->mark[d - 1]);
        advance(st, in, v->byte[i], out);
        if (st->err)
            break;
        if (out->n == 0 && !out->acc) {
            i = v->end[i];
            continue;
        }
        for (uint32_t k = 0; k < v->n_tok[i]; k++) {
            const int32_t id = v->tok_ids[v->tok[i] + k];
            m[id / 32] |= 1u << (id % 32);
            allowed++;
        }
        if (out->n == 0) {
            i = v->end[i];
            continue;
        }
        st->mark[d] = st->n_nodes;
        i++;
    }
    truncate_nodes(st, base);
    rc = st->err;
    st->err = 0;
    if (rc)
        return rc;
end_tokens:
    if (st->cur.acc)
        for (int32_t k = 0; k < v->n_eog; k++) {
            m[v->eog[k] / 32] |= 1u << (v->eog[k] % 32);
            allowed++;
        }
    *count = allowed;
    return KIRI_OK;
}

int kiri_grammar_state_mask(struct kiri_grammar_state *st, const struct kiri_grammar_vocab *v,
                            struct kiri_grammar_cache *c, const uint32_t **mask, int32_t *n_allowed)
{
    const size_t words = ((size_t)v->n_vocab + 31) / 32;
    int32_t count = 0;
    int rc;
    st->steps = 0;
    if (c && c->budget >= words * 4 + 256 && key_size(st) <= KEY_MAX) {
        const size_t klen = state_key(st, v->n_vocab);
        if (klen == 0)
            return KIRI_E_NOMEM;
        const uint64_t h = hash_bytes(st->key, klen, 99);
        for (struct centry *e = c->buckets[h & (c->n_buckets - 1)]; e; e = e->hnext)
            if (e->hash == h && e->key_len == klen && memcmp(e->key, st->key, klen) == 0) {
                lru_unlink(e);
                lru_front(c, e);
                c->hits++;
                *mask = e->mask;
                if (n_allowed)
                    *n_allowed = e->n_allowed;
                return KIRI_OK;
            }
        const size_t bytes = sizeof(struct centry) + words * 4 + klen;
        struct centry *e = kiri_mem_alloc(bytes);
        if (!e)
            return KIRI_E_NOMEM;
        e->mask = (uint32_t *)(e + 1);
        e->key = (uint8_t *)(e->mask + words);
        rc = compute_mask(st, v, e->mask, &count);
        if (rc < 0) {
            kiri_mem_free(e);
            return rc;
        }
        c->computed++;
        memcpy(e->key, st->key, klen);
        e->key_len = (uint32_t)klen;
        e->hash = h;
        e->bytes = bytes;
        e->n_allowed = count;
        while (c->used + bytes > c->budget && c->n_entries)
            evict(c);
        if (c->n_entries + 1 > c->n_buckets && c->n_buckets < (1u << 24)) {
            struct centry **nb = kiri_mem_calloc((size_t)c->n_buckets * 2, sizeof *nb);
            if (nb) {
                for (uint32_t b = 0; b < c->n_buckets; b++)
                    for (struct centry *x = c->buckets[b], *nx; x; x = nx) {
                        nx = x->hnext;
                        x->hnext = nb[x->hash & (c->n_buckets * 2 - 1)];
                        nb[x->hash & (c->n_buckets * 2 - 1)] = x;
                    }
                kiri_mem_free(c->buckets);
                c->buckets = nb;
                c->n_buckets *= 2;
            }
        }
        e->hnext = c->buckets[h & (c->n_buckets - 1)];
        c->buckets[h & (c->n_buckets - 1)] = e;
        lru_front(c, e);
        c->used += bytes;
        c->n_entries++;
        *mask = e->mask;
        if (n_allowed)
            *n_allowed = count;
        return KIRI_OK;
    }
    if (st->mask_words < words) {
        uint32_t *m = kiri_mem_realloc(st->mask, words * sizeof *m);
        if (!m)
            return KIRI_E_NOMEM;
        st->mask = m;
        st->mask_words = words;
    }
    rc = compute_mask(st, v, st->mask, &count);
    if (rc < 0)
        return rc;
    if (c)
        c->computed++;
    *mask = st->mask;
    if (n_allowed)
        *n_allowed = count;
    return KIRI_OK;
}

int kiri_grammar_state_allows(struct kiri_grammar_state *st, const struct kiri_grammar_vocab *v, int32_t id)
{
    for (int32_t k = 0; k < v->n_eog; k++)
        if (v->eog[k] == id)
            return st->cur.acc;
    size_t len;
    const uint8_t *p = kiri_grammar_vocab_piece(v, id, &len);
    if (!p)
        return 0;
    const uint32_t base = st->n_nodes;
    const struct set *in = &st->cur;
    st->err = 0;
    st->steps = 0;
    int ok = 1;
    for (size_t i = 0; i < len && ok; i++) {
        struct set *out = &st->lv[1 + (i & 1)];
        budget(st, KIRI_GRAMMAR_MAX_BYTE_WORK, "one byte");
        advance(st, in, p[i], out);
        ok = !st->err && (out->n > 0 || out->acc);
        in = out;
    }
    truncate_nodes(st, base);
    const int rc = st->err;
    st->err = 0;
    return rc < 0 ? rc : ok;
}
