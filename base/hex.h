/* Lower-case hexadecimal, for digests and keys. */
#ifndef KIRI_HEX_H
#define KIRI_HEX_H

#include <stddef.h>
#include <stdint.h>

/* Writes 2 * n lower-case digits and a NUL to out (2 * n + 1 bytes). */
void kiri_hex_encode(const uint8_t *b, size_t n, char *out);
/* The value of one hexadecimal digit (either case), or -1. */
int kiri_hex_digit(char c);
/* Decodes exactly 2 * n digits of s into n bytes. Returns 0, or -1 on a non-digit. */
int kiri_hex_decode(const char *s, uint8_t *out, size_t n);
/* The same for a NUL-terminated s that must be exactly 2 * n digits long (a digest as text). */
int kiri_hex_decode_str(const char *s, uint8_t *out, size_t n);

#endif
