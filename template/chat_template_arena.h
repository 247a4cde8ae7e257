/* Chat templates: the arena. Every allocation of a parse (the tree of a template) or of a render
 * (its values) comes from one, and is freed all at once; a cap bounds what a hostile template
 * can take. The bottom of the template's modules: it needs only base/mem.
 */
#ifndef KIRI_CHAT_TEMPLATE_ARENA_H
#define KIRI_CHAT_TEMPLATE_ARENA_H

#include <stddef.h>

struct kiri_chat_chunk;

struct kiri_chat_arena {
    struct kiri_chat_chunk *head; /* owned: the chunk being filled, then older ones */
    size_t used;                  /* bytes of chunks held, counted against cap */
    size_t cap;                   /* no allocation may take used beyond this */
    int hit_cap;                  /* the last failure was the cap, not the allocator */
};

/* Zeroed memory, aligned for any type, or NULL (hit_cap says why). */
void *kiri_chat_arena_alloc(struct kiri_chat_arena *a, size_t n);
void kiri_chat_arena_free(struct kiri_chat_arena *a);

#endif
