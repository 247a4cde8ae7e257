/* UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF), once for every
 * layer: checking, decoding, encoding and the streaming repair that holds back a character
 * whose bytes have not all arrived. */
#ifndef KIRI_UTF8_H
#define KIRI_UTF8_H

#include <stddef.h>
#include <stdint.h>

/* The replacement character U+FFFD, as UTF-8. */
#define KIRI_UTF8_REPLACEMENT "\xEF\xBF\xBD"

/* Classifies the bytes at s (n >= 1): L > 0 when a valid character of L bytes starts there; -k
 * when the first k bytes are a maximal invalid subsequence (one U+FFFD replaces them, as Unicode
 * recommends); 0 when all n bytes are a valid but unfinished character. */
int kiri_utf8_check(const unsigned char *s, size_t n);

/* Is s[0, n) entirely valid UTF-8? (NUL bytes are valid characters here.) */
int kiri_utf8_valid(const char *s, size_t n);

/* Decodes the character at s[0, n) (n >= 1) into *cp and returns its length; an invalid or
 * unfinished sequence gives U+FFFD and the length of the bytes it replaces (>= 1). */
size_t kiri_utf8_decode(const char *s, size_t n, uint32_t *cp);

/* Writes the UTF-8 form of cp (at most 4 bytes; a surrogate or a value above U+10FFFF writes
 * U+FFFD) and returns its length. */
size_t kiri_utf8_encode(uint32_t cp, char out[4]);

/* The streaming repair of in[0, n): writes its whole characters to out (when out is not NULL),
 * U+FFFD for each invalid subsequence, and returns the bytes written (at most 3 * n); *hold
 * receives the number of trailing bytes that begin a character not yet complete (0..3), which
 * the caller keeps for the next call. */
size_t kiri_utf8_repair(const unsigned char *in, size_t n, char *out, size_t *hold);

/* The longest prefix of valid UTF-8 s[0, n) that ends on a character boundary and holds at most
 * max bytes (for cutting text to a length without splitting a character). */
size_t kiri_utf8_prefix(const char *s, size_t n, size_t max);

#endif
