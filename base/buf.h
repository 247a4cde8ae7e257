/* A growable byte buffer, the one every layer uses to build text (JSON, SSE events, metrics,
 * template output, HTTP requests). The bytes are always NUL-terminated. A buffer may carry a
 * limit: an append that would pass it fails, so no input can make one grow without bound (nor
 * allocate more than limit + 1 bytes).
 *
 * Invariants: data is NULL or holds len + 1 <= cap bytes with data[len] == 0; after a failed
 * append the contents are unchanged and failed is set, so a caller may check once at the end. */
#ifndef KIRI_BUF_H
#define KIRI_BUF_H

#include <stdarg.h>
#include <stddef.h>

struct kiri_buf {
    char *data;       /* owned */
    size_t len, cap;
    size_t limit;     /* most bytes it may hold; 0: no limit */
    int failed;       /* an append failed (out of memory or past the limit) */
};

/* An empty buffer; zero-initialising one is the same with no limit. */
void kiri_buf_init(struct kiri_buf *b, size_t limit);
void kiri_buf_free(struct kiri_buf *b);
/* Empties it, keeping the memory. */
void kiri_buf_clear(struct kiri_buf *b);
/* Makes room for n more bytes. Returns 0, or KIRI_E_NOMEM / KIRI_E_INVALID_ARG (past the limit). */
int kiri_buf_reserve(struct kiri_buf *b, size_t n);
int kiri_buf_append(struct kiri_buf *b, const void *p, size_t n);
int kiri_buf_puts(struct kiri_buf *b, const char *s);
int kiri_buf_putc(struct kiri_buf *b, char c);
int kiri_buf_printf(struct kiri_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Removes the first n bytes (at most len), as a stream parser does with what it has used. */
void kiri_buf_drop(struct kiri_buf *b, size_t n);
/* Hands the bytes to the caller (free with kiri_mem_free; never NULL unless out of memory) and
 * leaves the buffer empty. */
char *kiri_buf_take(struct kiri_buf *b, size_t *len);

#endif
