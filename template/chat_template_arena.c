#include "chat_template_arena.h"

#include "mem.h"

struct kiri_chat_chunk {
    struct kiri_chat_chunk *next;
    size_t size, used;
    _Alignas(16) unsigned char data[];
};

#define CHUNK_SIZE ((size_t)64 << 10)

void *kiri_chat_arena_alloc(struct kiri_chat_arena *a, size_t n)
{
    a->hit_cap = 0;
    if (n > ((size_t)1 << 40)) {
        a->hit_cap = 1;
        return NULL;
    }
    n = (n + 15) & ~(size_t)15;
    struct kiri_chat_chunk *c = a->head;
    if (c && c->size - c->used >= n) {
        void *p = c->data + c->used;
        c->used += n;
        return p;
    }
    /* A large request gets a chunk of its own, placed behind the current one so the space left
     * in the current one stays usable. */
    size_t size = n > CHUNK_SIZE / 4 ? n : CHUNK_SIZE;
    if (a->used + size + sizeof *c > a->cap) {
        a->hit_cap = 1;
        return NULL;
    }
    struct kiri_chat_chunk *nc = kiri_mem_calloc(1, sizeof *nc + size);
    if (!nc)
        return NULL;
    nc->size = size;
    nc->used = n;
    a->used += size + sizeof *nc;
    if (c && size != CHUNK_SIZE) {
        nc->next = c->next;
        c->next = nc;
    } else {
        nc->next = c;
        a->head = nc;
    }
    return nc->data;
}

void kiri_chat_arena_free(struct kiri_chat_arena *a)
{
    struct kiri_chat_chunk *c = a->head;
    while (c) {
        struct kiri_chat_chunk *next = c->next;
        kiri_mem_free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}
