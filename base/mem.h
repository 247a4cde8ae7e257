/* The one path all of kiri's heap memory takes. Tests can make the Nth allocation fail to walk
 * every error path (kiri_mem_fail_after), the way Lua's test build does. Sizes are checked for
 * overflow here so callers can pass products directly to kiri_mem_array. */
#ifndef KIRI_MEM_H
#define KIRI_MEM_H

#include <stddef.h>

/* malloc/calloc/realloc/free semantics; return NULL on failure (or on a simulated failure). */
void *kiri_mem_alloc(size_t size);
void *kiri_mem_calloc(size_t n, size_t size);   /* zeroed; NULL if n * size overflows */
void *kiri_mem_array(size_t n, size_t size);    /* uninitialised; NULL if n * size overflows */
void *kiri_mem_realloc(void *p, size_t size);
void kiri_mem_free(void *p);
/* A NUL-terminated copy of len bytes of s (owned by the caller). */
char *kiri_mem_strndup(const char *s, size_t len);

/* Testing only: the next n allocations succeed, every later one fails, until called with n < 0.
 * Not thread-safe; tests call it from one thread. */
void kiri_mem_fail_after(long n);

#endif
