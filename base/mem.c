#include "mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Failure injection counter: negative means off. Only tests change it (kiri_mem_fail_after). */
static long fail_countdown = -1;

static int should_fail(void)
{
    if (fail_countdown < 0)
        return 0;
    if (fail_countdown == 0)
        return 1;
    fail_countdown--;
    return 0;
}

void kiri_mem_fail_after(long n) { fail_countdown = n; }

void *kiri_mem_alloc(size_t size)
{
    if (should_fail())
        return NULL;
    return malloc(size ? size : 1);
}

void *kiri_mem_calloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    if (should_fail())
        return NULL;
    return calloc(n ? n : 1, size ? size : 1);
}

void *kiri_mem_array(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    return kiri_mem_alloc(n * size);
}

void *kiri_mem_realloc(void *p, size_t size)
{
    if (should_fail())
        return NULL;
    return realloc(p, size ? size : 1);
}

void kiri_mem_free(void *p) { free(p); }

char *kiri_mem_strndup(const char *s, size_t len)
{
    if (len == SIZE_MAX)
        return NULL;
    char *d = kiri_mem_alloc(len + 1);
    if (!d)
        return NULL;
    memcpy(d, s, len);
    d[len] = '\0';
    return d;
}
