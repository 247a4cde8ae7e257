/* Chat templates: text as Python sees it, below every other template module. Python's idea of
 * whitespace (str.isspace, the regex \s), which strip(), split(), trim and Jinja's whitespace
 * control all use; code points (counting, offsets, the case mapping of upper() and lower(), what
 * repr() escapes); the repr of a float, which decides how numbers print (repr(0.1 + 0.2),
 * "1e+16"); and error messages that name a line and column of the source. Decoding and checking UTF-8 is
 * base/utf8's; every string here is valid UTF-8.
 */
#include "chat_template_text.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "utf8.h"

/* ---------------------------------------------------------------------------------------------
 * Whitespace and validity
 * ------------------------------------------------------------------------------------------- */

static int is_space_cp(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

size_t kiri_chat_space_at(const char *s, size_t n, size_t i)
{
    unsigned char b = (unsigned char)s[i];
    if (b < 0x80)
        return is_space_cp(b) ? 1 : 0;
    if (b != 0xc2 && b != 0xe1 && b != 0xe2 && b != 0xe3)
        return 0;
    uint32_t cp;
    size_t k = kiri_utf8_decode(s + i, n - i, &cp);
    return is_space_cp(cp) ? k : 0;
}

size_t kiri_chat_space_before(const char *s, size_t i)
{
    if (i == 0)
        return 0;
    size_t j = i - 1;
    while (j > 0 && ((unsigned char)s[j] & 0xc0) == 0x80 && i - j < 4)
        j--;
    return kiri_chat_space_at(s, i, j) == i - j ? i - j : 0;
}

int kiri_chat_text_valid(const char *s, size_t n)
{
    /* NUL bytes are valid UTF-8, but a template or message holding one is refused */
    return kiri_utf8_valid(s, n) && !memchr(s, '\0', n);
}

/* ---------------------------------------------------------------------------------------------
 * Code points
 * ------------------------------------------------------------------------------------------- */

size_t kiri_chat_cp_len(const char *s, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}

size_t kiri_chat_cp_offset(const char *s, size_t n, size_t k)
{
    size_t i = 0;
    for (; i < n; i++) {
        if (((unsigned char)s[i] & 0xc0) != 0x80) {
            if (k == 0)
                return i;
            k--;
        }
    }
    return n;
}

/* Is the code point one Python's repr() escapes (str.isprintable() false)? Control and format
 * characters, separators other than the space, private use and the non-characters; unassigned
 * code points are not known here and print as themselves. */
int kiri_chat_cp_unprintable(uint32_t c)
{
    return c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad || (c >= 0x600 && c <= 0x605) ||
           c == 0x61c || c == 0x6dd || c == 0x70f || c == 0x180e || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200f) || (c >= 0x2028 && c <= 0x202f) ||
           (c >= 0x205f && c <= 0x2064) || (c >= 0x2066 && c <= 0x206f) || c == 0x3000 ||
           (c >= 0xe000 && c <= 0xf8ff) || (c >= 0xfdd0 && c <= 0xfdef) || c == 0xfeff ||
           (c >= 0xfff9 && c <= 0xfffb) || (c & 0xfffe) == 0xfffe || (c >= 0xe0000 && c <= 0xe007f) ||
           c >= 0xf0000;
}

uint32_t kiri_chat_cp_upper(uint32_t c)
{
    if ((c >= 'a' && c <= 'z') || (c >= 0xe0 && c <= 0xfe && c != 0xf7) || (c >= 0x430 && c <= 0x44f))
        return c - 0x20;
    if ((c >= 0x3b1 && c <= 0x3c9 && c != 0x3c2))
        return c - 0x20;
    if (c == 0x3c2)
        return 0x3a3;
    if (c >= 0x450 && c <= 0x45f)
        return c - 0x50;
    return c;
}

uint32_t kiri_chat_cp_lower(uint32_t c)
{
    if ((c >= 'A' && c <= 'Z') || (c >= 0xc0 && c <= 0xde && c != 0xd7) || (c >= 0x410 && c <= 0x42f))
        return c + 0x20;
    if (c >= 0x391 && c <= 0x3a9 && c != 0x3a2)
        return c + 0x20;
    if (c >= 0x400 && c <= 0x40f)
        return c + 0x50;
    return c;
}

int kiri_chat_cp_is_cased(uint32_t c)
{
    return kiri_chat_cp_upper(c) != c || kiri_chat_cp_lower(c) != c || c == 0x3c2;
}

/* ---------------------------------------------------------------------------------------------
 * Numbers and positions
 * ------------------------------------------------------------------------------------------- */

void kiri_chat_format_float(double d, char *out, size_t cap)
{
    if (isnan(d)) {
        snprintf(out, cap, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, cap, d < 0 ? "-inf" : "inf");
        return;
    }
    if (d == 0) {
        snprintf(out, cap, signbit(d) ? "-0.0" : "0.0");
        return;
    }
    /* The shortest digits that read back as d (Python's repr), then Python's layout: positional
     * when the decimal exponent is in (-4, 16], scientific with two exponent digits otherwise. */
    char buf[40], digits[24];
    int prec;
    for (prec = 1; prec < 17; prec++) {
        snprintf(buf, sizeof buf, "%.*e", prec - 1, d);
        if (strtod(buf, NULL) == d)
            break;
    }
    if (prec == 17)
        snprintf(buf, sizeof buf, "%.16e", d);
    const char *p = buf;
    int nd = 0, neg = *p == '-';
    p += neg;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    int exp10 = atoi(p + 1), decpt = exp10 + 1;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    char res[48];
    int m = 0;
    if (neg)
        res[m++] = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            res[m++] = '0';
            res[m++] = '.';
            for (int i = 0; i < -decpt; i++)
                res[m++] = '0';
            for (int i = 0; i < nd; i++)
                res[m++] = digits[i];
        } else {
            for (int i = 0; i < nd || i < decpt; i++) {
                if (i == decpt)
                    res[m++] = '.';
                res[m++] = i < nd ? digits[i] : '0';
            }
            if (decpt >= nd) {
                res[m++] = '.';
                res[m++] = '0';
            }
        }
        res[m] = '\0';
    } else {
        res[m++] = digits[0];
        if (nd > 1) {
            res[m++] = '.';
            for (int i = 1; i < nd; i++)
                res[m++] = digits[i];
        }
        snprintf(res + m, sizeof res - (size_t)m, "e%c%02d", exp10 < 0 ? '-' : '+',
                 exp10 < 0 ? -exp10 : exp10);
    }
    snprintf(out, cap, "%s", res);
}

static void line_col(const char *s, size_t pos, int *line, int *col)
{
    int l = 1;
    size_t start = 0;
    for (size_t i = 0; i < pos; i++) {
        if (s[i] == '\n') {
            l++;
            start = i + 1;
        }
    }
    *line = l;
    *col = (int)(pos - start) + 1;
}

void kiri_chat_error_at(struct kiri_status_info *info, int code, const char *src, size_t pos,
                        const char *msg)
{
    int line, col;
    line_col(src, pos, &line, &col);
    kiri_error_at(info, code, "chat_template", (int64_t)pos, "chat template line %d, column %d: %s",
                  line, col, msg);
}
