#include "buf.h"

#include <stdio.h>
#include <string.h>

#include "kiri.h"
#include "mem.h"

void kiri_buf_init(struct kiri_buf *b, size_t limit)
{
    memset(b, 0, sizeof *b);
    b->limit = limit;
}

void kiri_buf_free(struct kiri_buf *b)
{
    kiri_mem_free(b->data);
    b->data = NULL;
    b->len = b->cap = 0;
}

void kiri_buf_clear(struct kiri_buf *b)
{
    b->len = 0;
    b->failed = 0;
    if (b->data)
        b->data[0] = '\0';
}

int kiri_buf_reserve(struct kiri_buf *b, size_t n)
{
    if (n > (size_t)-1 / 2 - b->len || (b->limit && b->len + n > b->limit)) {
        b->failed = 1;
        return KIRI_E_INVALID_ARG;
    }
    const size_t need = b->len + n + 1;
    if (need <= b->cap)
        return KIRI_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap *= 2;
    if (b->limit && cap - 1 > b->limit)
        cap = b->limit + 1;   /* a limited buffer never allocates more than it may hold */
    char *d = kiri_mem_realloc(b->data, cap);
    if (!d) {
        b->failed = 1;
        return KIRI_E_NOMEM;
    }
    d[b->len] = '\0';   /* a first allocation is a string too */
    b->data = d;
    b->cap = cap;
    return KIRI_OK;
}

int kiri_buf_append(struct kiri_buf *b, const void *p, size_t n)
{
    const int rc = kiri_buf_reserve(b, n);
    if (rc < 0)
        return rc;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return KIRI_OK;
}

int kiri_buf_puts(struct kiri_buf *b, const char *s) { return kiri_buf_append(b, s, strlen(s)); }

int kiri_buf_putc(struct kiri_buf *b, char c) { return kiri_buf_append(b, &c, 1); }

static int buf_vprintf(struct kiri_buf *b, const char *fmt, va_list ap)
{
    va_list copy;
    va_copy(copy, ap);
    const int n = vsnprintf(NULL, 0, fmt, copy);
    va_end(copy);
    if (n < 0) {
        b->failed = 1;
        return KIRI_E_INVALID_ARG;
    }
    const int rc = kiri_buf_reserve(b, (size_t)n);
    if (rc < 0)
        return rc;
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    b->len += (size_t)n;
    return KIRI_OK;
}

int kiri_buf_printf(struct kiri_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    const int rc = buf_vprintf(b, fmt, ap);
    va_end(ap);
    return rc;
}

void kiri_buf_drop(struct kiri_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
    } else {
        memmove(b->data, b->data + n, b->len - n);
        b->len -= n;
    }
    if (b->data)
        b->data[b->len] = '\0';
}

char *kiri_buf_take(struct kiri_buf *b, size_t *len)
{
    if (!b->data && kiri_buf_reserve(b, 0) < 0)
        return NULL;
    char *d = b->data;
    if (len)
        *len = b->len;
    b->data = NULL;
    b->len = b->cap = 0;
    b->failed = 0;
    return d;
}
