#include "hex.h"

#include <string.h>

void kiri_hex_encode(const uint8_t *b, size_t n, char *out)
{
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[b[i] >> 4];
        out[2 * i + 1] = digits[b[i] & 15];
    }
    out[2 * n] = '\0';
}

int kiri_hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int kiri_hex_decode(const char *s, uint8_t *out, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const int hi = kiri_hex_digit(s[2 * i]), lo = hi < 0 ? -1 : kiri_hex_digit(s[2 * i + 1]);
        if (lo < 0)
            return -1;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

int kiri_hex_decode_str(const char *s, uint8_t *out, size_t n)
{
    return s && strlen(s) == 2 * n ? kiri_hex_decode(s, out, n) : -1;
}
