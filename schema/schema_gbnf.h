/* Pieces of GBNF text that need no schema, for the JSON Schema compiler (json_schema.c): string
 * literals, repetition suffixes, the string formats, decimal integer ranges, and the check that
 * every rule of a grammar can derive a finite text. All text is ASCII and follows llama.cpp's
 * GBNF; the writers append to a kiri_buf, whose failed flag reports an error once at the end. */
#ifndef KIRI_SCHEMA_GBNF_H
#define KIRI_SCHEMA_GBNF_H

#include <stddef.h>

struct kiri_buf;

/* A GBNF string literal holding the bytes s[0..n) (valid UTF-8). */
void kiri_schema_put_literal(struct kiri_buf *b, const char *s, size_t n);

/* The postfix repeating an atom min..max times (max < 0: no maximum): * + ? {m} {m,} {m,n}. */
void kiri_schema_put_repeat(struct kiri_buf *b, long min, long max);

/* The text of a string of a format (without the quotes): date, time, date-time, uuid, email,
 * hostname, uri, ipv4, each a narrower form that always validates. -1 for another format. */
int kiri_schema_put_format(struct kiri_buf *b, const char *format);

/* The decimals of a..z (0 <= a <= z < 10^16) without leading zeros, as one parenthesised group. */
void kiri_schema_put_natural_range(struct kiri_buf *b, long long a, long long z);

/* Can every rule derive a finite text? names[i] and bodies[i] are the n rules (bodies name
 * other rules only by those names); order lists the rules in an order where a rule usually comes
 * after those it names (fewer passes). 0; 1 (rule *bad can never finish); 2 (too intricate to
 * tell in the passes allowed, *bad undecided); KIRI_E_NOMEM. */
int kiri_schema_check_finite(const char *const *names, const char *const *bodies, const int *order, int n,
                             int *bad);

#endif
