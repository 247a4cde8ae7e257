#include "schema_gbnf.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "kiri.h"
#include "mem.h"

#define MAX_CHECK_PASSES 64

static uint32_t hash_name(const char *s, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* A GBNF string literal holding the bytes s[0..n) (UTF-8), ASCII only. */
void kiri_schema_put_literal(struct kiri_buf *b, const char *s, size_t n)
{
    kiri_buf_putc(b, '"');
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            kiri_buf_putc(b, '\\');
            kiri_buf_putc(b, (char)ch);
        } else if (ch < 0x20 || ch == 0x7F) {
            kiri_buf_printf(b, "\\x%02X", ch);
        } else if (ch < 0x80) {
            kiri_buf_putc(b, (char)ch);
        } else {
            /* Decode one UTF-8 character (Jansson gave us valid UTF-8). */
            uint32_t cp;
            int extra = ch >= 0xF0 ? 3 : ch >= 0xE0 ? 2 : 1;
            cp = ch & (0x3F >> extra);
            for (int k = 0; k < extra && i + 1 < n; k++)
                cp = (cp << 6) | ((unsigned char)s[++i] & 0x3F);
            if (cp <= 0xFFFF)
                kiri_buf_printf(b, "\\u%04X", (unsigned)cp);
            else
                kiri_buf_printf(b, "\\U%08X", (unsigned)cp);
        }
    }
    kiri_buf_putc(b, '"');
}

/* " {min,max}" or "*" / "+" / "?" for a repeated atom; max < 0: no maximum. */
void kiri_schema_put_repeat(struct kiri_buf *b, long min, long max)
{
    if (min == 0 && max < 0)
        kiri_buf_putc(b, '*');
    else if (min == 1 && max < 0)
        kiri_buf_putc(b, '+');
    else if (min == 0 && max == 1)
        kiri_buf_putc(b, '?');
    else if (max < 0)
        kiri_buf_printf(b, "{%ld,}", min);
    else if (min == max)
        kiri_buf_printf(b, "{%ld}", min);
    else
        kiri_buf_printf(b, "{%ld,%ld}", min, max);
}

/* ---- formats ---- */

static const char date_gbnf[] =
    "[1-9] [0-9]{3} \"-\" ( ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) | "
    "( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) | \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | "
    "\"2\" [0-8] ) )";
static const char time_gbnf[] =
    "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,6} )? ( \"Z\" | [+-] ( [01] "
    "[0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";

/* The text of a string format (without the quotes). */
int kiri_schema_put_format(struct kiri_buf *b, const char *format)
{
    if (!strcmp(format, "date"))
        kiri_buf_puts(b, date_gbnf);
    else if (!strcmp(format, "time"))
        kiri_buf_puts(b, time_gbnf);
    else if (!strcmp(format, "date-time"))
        kiri_buf_printf(b, "%s \"T\" %s", date_gbnf, time_gbnf);
    else if (!strcmp(format, "uuid"))
        kiri_buf_puts(b, "[0-9a-f]{8} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{4} \"-\" [0-9a-f]{12}");
    else if (!strcmp(format, "email"))
        kiri_buf_puts(b, "[a-z0-9]{1,16} ( \".\" [a-z0-9]{1,16} ){0,2} \"@\" [a-z0-9]{1,20} ( \".\" [a-z0-9]{1,20} "
                         "){0,2} \".\" [a-z]{2,6}");
    else if (!strcmp(format, "hostname"))
        kiri_buf_puts(b, "[a-z0-9]{1,20} ( \".\" [a-z0-9]{1,20} ){0,3}");
    else if (!strcmp(format, "uri"))
        kiri_buf_puts(b, "\"https://\" [a-z0-9]{1,20} ( \".\" [a-z0-9]{1,20} ){0,2} \".\" [a-z]{2,6} ( \"/\" "
                         "[a-zA-Z0-9._~-]{1,20} ){0,5}");
    else if (!strcmp(format, "ipv4"))
        kiri_buf_puts(b, "( \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9] ) ( \".\" ( "
                         "\"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9] ) ){3}");
    else
        return -1;
    return 0;
}

/* ---- integer ranges ---- */


/* Digit strings x and y of equal length n, x <= y: every decimal of that length between them. */
static void put_same_len(struct kiri_buf *b, const char *x, const char *y, size_t n)
{
    if (n == 0)
        return;
    if (!strncmp(x, y, n)) {
        kiri_buf_printf(b, "\"%.*s\"", (int)n, x);
        return;
    }
    if (x[0] == y[0]) {
        kiri_buf_printf(b, "\"%c\" ", x[0]);
        put_same_len(b, x + 1, y + 1, n - 1);
        return;
    }
    int x_low = strspn(x + 1, "0") == n - 1, y_high = strspn(y + 1, "9") == n - 1;
    char lo = x_low ? x[0] : (char)(x[0] + 1), hi = y_high ? y[0] : (char)(y[0] - 1);
    kiri_buf_puts(b, "( ");
    int alt = 0;
    if (!x_low) {
        char nines[20];
        memset(nines, '9', n - 1);
        nines[n - 1] = '\0';
        kiri_buf_printf(b, "\"%c\" ", x[0]);
        put_same_len(b, x + 1, nines, n - 1);
        alt = 1;
    }
    if (lo <= hi) {
        kiri_buf_printf(b, "%s[%c-%c]", alt ? " | " : "", lo, hi);
        if (n > 1)
            kiri_buf_printf(b, " [0-9]{%zu}", n - 1);
        alt = 1;
    }
    if (!y_high) {
        char zeros[20];
        memset(zeros, '0', n - 1);
        zeros[n - 1] = '\0';
        kiri_buf_printf(b, "%s\"%c\" ", alt ? " | " : "", y[0]);
        put_same_len(b, zeros, y + 1, n - 1);
    }
    kiri_buf_puts(b, " )");
}

/* 0 <= a <= b: their decimals without leading zeros. */
void kiri_schema_put_natural_range(struct kiri_buf *b, long long a, long long z)
{
    kiri_buf_puts(b, "( ");
    long long p10 = 1;
    int alt = 0;
    for (int len = 1; len <= 16 && a <= z; len++, p10 *= 10) {
        long long top = p10 * 10 - 1;
        if (a > top)
            continue;
        long long lo = a, hi = z < top ? z : top;
        char x[24], y[24];
        snprintf(x, sizeof x, "%lld", lo);
        snprintf(y, sizeof y, "%lld", hi);
        if (alt++)
            kiri_buf_puts(b, " | ");
        put_same_len(b, x, y, strlen(x));
        a = top + 1;
    }
    kiri_buf_puts(b, " )");
}

/* ---- the finite-value check ---- */


struct checker {
    const char *const *names;
    int *table;       /* open addressing: rule index + 1 */
    size_t cap;
    char *prod;       /* per rule: can it derive a finite text? */
};

static int lookup(const struct checker *k, const char *name, size_t n)
{
    for (size_t i = hash_name(name, n) & (k->cap - 1);; i = (i + 1) & (k->cap - 1)) {
        int r = k->table[i];
        if (!r)
            return -1;
        const char *rn = k->names[r - 1];
        if (strlen(rn) == n && !memcmp(rn, name, n))
            return r - 1;
    }
}

/* Parses alternatives up to ')' or the end; returns whether one of them is productive. */
static int prod_alts(const struct checker *k, const char **pp)
{
    const char *p = *pp;
    int any = 0, all = 1;
    for (;;) {
        while (*p == ' ')
            p++;
        if (!*p || *p == ')' || *p == '|') {
            any |= all;
            if (*p != '|')
                break;
            p++;
            all = 1;
            continue;
        }
        int item = 1;
        if (*p == '"' || *p == '[') {
            char close = *p == '"' ? '"' : ']';
            for (p++; *p && *p != close; p++)
                if (*p == '\\' && p[1])
                    p++;
            if (*p)
                p++;
        } else if (*p == '(') {
            p++;
            item = prod_alts(k, &p);
            if (*p == ')')
                p++;
        } else {
            const char *s = p;
            while ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '-')
                p++;
            if (p == s) {
                p++;
                continue;
            }
            int r = lookup(k, s, (size_t)(p - s));
            item = r >= 0 && k->prod[r];
        }
        if (*p == '*' || *p == '?') {
            item = 1;
            p++;
        } else if (*p == '+') {
            p++;
        } else if (*p == '{') {
            if (p[1] == '0' && (p[2] == ',' || p[2] == '}'))
                item = 1;
            while (*p && *p != '}')
                p++;
            if (*p)
                p++;
        }
        all &= item;
    }
    *pp = p;
    return any;
}

int kiri_schema_check_finite(const char *const *names, const char *const *bodies, const int *order, int n,
                             int *bad)
{
    struct checker k = {names, NULL, 1, NULL};
    while (k.cap < (size_t)n * 2 + 2)
        k.cap *= 2;
    k.table = kiri_mem_calloc(k.cap, sizeof *k.table);
    k.prod = kiri_mem_calloc((size_t)n + 1, 1);
    int rc = 0;
    if (!k.table || !k.prod) {
        rc = KIRI_E_NOMEM;
        goto done;
    }
    for (int i = 0; i < n; i++) {
        size_t j = hash_name(names[i], strlen(names[i])) & (k.cap - 1);
        while (k.table[j])
            j = (j + 1) & (k.cap - 1);
        k.table[j] = i + 1;
    }
    int changed = 1;
    for (int pass = 0; changed && pass < MAX_CHECK_PASSES; pass++) {
        changed = 0;
        for (int d = 0; d < n; d++) {
            int i = order[d];
            const char *p = bodies[i];
            if (!k.prod[i] && prod_alts(&k, &p)) {
                k.prod[i] = 1;
                changed = 1;
            }
        }
    }
    for (int i = 0; i < n && rc == 0; i++)
        if (!k.prod[i]) {
            *bad = i;
            rc = changed ? 2 : 1;
        }
done:
    kiri_mem_free(k.table);
    kiri_mem_free(k.prod);
    return rc;
}
