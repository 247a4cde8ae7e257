#include "utf8.h"

#include <string.h>

int kiri_utf8_check(const unsigned char *s, size_t n)
{
    const unsigned c = s[0];
    unsigned lo = 0x80, hi = 0xBF;
    size_t need;
    if (c < 0x80)
        return 1;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0)
            lo = 0xA0;   /* no overlong three-byte forms */
        else if (c == 0xED)
            hi = 0x9F;   /* no surrogates */
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0)
            lo = 0x90;   /* no overlong four-byte forms */
        else if (c == 0xF4)
            hi = 0x8F;   /* nothing above U+10FFFF */
    } else {
        return -1;
    }
    for (size_t i = 1; i < need; i++) {
        if (i >= n)
            return 0;
        if (s[i] < lo || s[i] > hi)
            return -(int)i;
        lo = 0x80;
        hi = 0xBF;
    }
    return (int)need;
}

int kiri_utf8_valid(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        if (u[i] < 0x80) {   /* the common case, without the call */
            i++;
            continue;
        }
        const int k = kiri_utf8_check(u + i, n - i);
        if (k <= 0)
            return 0;
        i += (size_t)k;
    }
    return 1;
}

size_t kiri_utf8_decode(const char *s, size_t n, uint32_t *cp)
{
    const unsigned char *u = (const unsigned char *)s;
    const int k = kiri_utf8_check(u, n);
    if (k <= 0) {
        *cp = 0xFFFD;
        return k < 0 ? (size_t)-k : n;
    }
    switch (k) {
    case 1: *cp = u[0]; break;
    case 2: *cp = ((uint32_t)(u[0] & 0x1F) << 6) | (u[1] & 0x3Fu); break;
    case 3: *cp = ((uint32_t)(u[0] & 0x0F) << 12) | ((uint32_t)(u[1] & 0x3F) << 6) | (u[2] & 0x3Fu); break;
    default:
        *cp = ((uint32_t)(u[0] & 0x07) << 18) | ((uint32_t)(u[1] & 0x3F) << 12) |
              ((uint32_t)(u[2] & 0x3F) << 6) | (u[3] & 0x3Fu);
    }
    return (size_t)k;
}

size_t kiri_utf8_encode(uint32_t cp, char out[4])
{
    if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)
        cp = 0xFFFD;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t kiri_utf8_repair(const unsigned char *in, size_t n, char *out, size_t *hold)
{
    size_t i = 0, o = 0;
    *hold = 0;
    while (i < n) {
        const int r = kiri_utf8_check(in + i, n - i);
        if (r == 0) {
            *hold = n - i;
            break;
        }
        if (r > 0) {
            if (out)
                memcpy(out + o, in + i, (size_t)r);
            o += (size_t)r;
            i += (size_t)r;
        } else {
            if (out)
                memcpy(out + o, KIRI_UTF8_REPLACEMENT, 3);
            o += 3;
            i += (size_t)-r;
        }
    }
    return o;
}

size_t kiri_utf8_prefix(const char *s, size_t n, size_t max)
{
    if (n <= max)
        return n;
    size_t i = max;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    return i;
}
