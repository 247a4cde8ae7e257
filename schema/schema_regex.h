/* A JSON Schema "pattern" (the ECMA-262 regular-expression subset that describes a regular
 * language) compiled to a GBNF expression over the characters of a JSON string, i.e. what lies
 * between the quotes: a literal '"' appears as \" and a newline as \n, so every text the
 * expression matches is valid JSON string content whose decoded value the pattern matches.
 *
 * Honoured: literals, escapes (\t \n \r \f \v \0 \xHH \uHHHH \u{H..} \cX and identity escapes),
 * \d \w \s and their negations, classes (ranges, negation, class escapes), '.', groups ((...),
 * (?:...), (?<name>...)), alternation, quantifiers * + ? {n} {n,} {n,m} and their lazy forms,
 * and ^ / $ at the edges of a top-level alternative. The pattern is unanchored as JSON Schema
 * says: an alternative without ^ (or $) may have any text before (or after) it.
 * Refused, naming the construct: backreferences, lookaround, word boundaries, Unicode property
 * escapes, anchors inside groups, quantifiers above KIRI_SCHEMA_REGEX_MAX_REPEAT.
 * Where a class or '.' could also match a character JSON writes as an escape other than \" \\
 * \n \r \t \b \f (the other control characters), the expression leaves that character out: the
 * output still matches, it is only narrower. */
#ifndef KIRI_SCHEMA_REGEX_H
#define KIRI_SCHEMA_REGEX_H

#include <stddef.h>

struct kiri_buf;

#define KIRI_SCHEMA_REGEX_MAX_REPEAT 256

/* Appends to out one GBNF expression (parenthesised) for pattern[0..len) (UTF-8). any_char is the
 * name of a GBNF rule matching one JSON string character, used for the unanchored edges.
 * Returns 0, KIRI_E_UNSUPPORTED (err says which construct), KIRI_E_INVALID_ARG for a malformed
 * pattern, or KIRI_E_NOMEM / the buffer's limit error. */
int kiri_schema_regex_to_gbnf(const char *pattern, size_t len, const char *any_char, struct kiri_buf *out,
                              char *err, size_t err_cap);

#endif
