/* Chat templates: text as Python sees it (whitespace, code points, case, float repr), and error
 * messages that name a line and column. The bottom layer with the arena: it knows no template
 * types. Strings are byte ranges of valid
 * UTF-8 (pointer and length, not NUL-terminated).
 */
#ifndef KIRI_CHAT_TEMPLATE_TEXT_H
#define KIRI_CHAT_TEMPLATE_TEXT_H

#include <stddef.h>
#include <stdint.h>

struct kiri_status_info;

/* Byte length of the whitespace character starting at s[i] (i < n), or 0. */
size_t kiri_chat_space_at(const char *s, size_t n, size_t i);
/* Byte length of the whitespace character ending just before s[i], or 0. */
size_t kiri_chat_space_before(const char *s, size_t i);
/* Is s[0..n) valid UTF-8 (kiri_utf8_valid) without NUL bytes? Templates, roles, contents and
 * tokens must be: a NUL would end the C strings the render hands back. */
int kiri_chat_text_valid(const char *s, size_t n);

/* Number of code points in s[0..n). */
size_t kiri_chat_cp_len(const char *s, size_t n);
/* Byte offset of code point k of s[0..n) (k <= its length). */
size_t kiri_chat_cp_offset(const char *s, size_t n, size_t k);
/* Is c one Python's repr() escapes (str.isprintable() false)? */
int kiri_chat_cp_unprintable(uint32_t c);
/* Upper and lower case of ASCII, Latin-1, Greek and Cyrillic letters (other code points are
 * returned as they are); the result always has the same UTF-8 length as c. */
uint32_t kiri_chat_cp_upper(uint32_t c);
uint32_t kiri_chat_cp_lower(uint32_t c);
int kiri_chat_cp_is_cased(uint32_t c);

/* Python's repr of a float (out needs 32 bytes). */
void kiri_chat_format_float(double d, char *out, size_t cap);
/* Records msg as error code in info, at byte pos of the template's normalised source src, with
 * "chat template line L, column C: " before it. */
void kiri_chat_error_at(struct kiri_status_info *info, int code, const char *src, size_t pos,
                        const char *msg);

#endif
