#include "kvcache.h"

#include <string.h>

#include "backend.h"
#include "kiri.h"
#include "mem.h"

struct kiri_kvcache {
    const struct kiri_backend_iface *iface;   /* borrowed */
    struct kiri_backend *be;                  /* borrowed */
    struct kiri_buffer *buffer;               /* owned: all layers' keys then values */
    size_t bytes;
    int n_layer;
    int block_size;
    int32_t n_blocks;
    struct kiri_tensor *k, *v;                /* owned arrays of n_layer descriptors */
    int32_t *refs;                            /* owned: reference count per block */
    int32_t *free_list;                       /* owned: stack of free block ids */
    int32_t n_free;
};

int kiri_kvcache_init(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_layer,
                      int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                      struct kiri_kvcache **out)
{
    if (n_layer < 1 || kv_dim < 1 || block_size < 1 || n_blocks < 1)
        return KIRI_E_INVALID_ARG;
    if (type != KIRI_TYPE_F32 && type != KIRI_TYPE_F16 && type != KIRI_TYPE_Q8_0)
        return KIRI_E_INVALID_ARG;
    if (kv_dim % kiri_type_block_size(type) != 0)
        return KIRI_E_INVALID_ARG;
    const size_t row = (size_t)(kv_dim / kiri_type_block_size(type)) * kiri_type_size(type);
    const size_t slots = (size_t)n_blocks * (size_t)block_size;
    if (slots > INT32_MAX || row > SIZE_MAX / slots || row * slots > SIZE_MAX / 2 / (size_t)n_layer)
        return KIRI_E_INVALID_ARG;
    const size_t layer_bytes = row * slots;

    struct kiri_kvcache *c = kiri_mem_calloc(1, sizeof *c);
    if (!c)
        return KIRI_E_NOMEM;
    c->iface = iface;
    c->be = be;
    c->n_layer = n_layer;
    c->block_size = block_size;
    c->n_blocks = n_blocks;
    c->bytes = layer_bytes * 2 * (size_t)n_layer;
    c->k = kiri_mem_calloc((size_t)n_layer, sizeof *c->k);
    c->v = kiri_mem_calloc((size_t)n_layer, sizeof *c->v);
    c->refs = kiri_mem_calloc((size_t)n_blocks, sizeof *c->refs);
    c->free_list = kiri_mem_array((size_t)n_blocks, sizeof *c->free_list);
    void *host = NULL;
    if (!c->k || !c->v || !c->refs || !c->free_list ||
        iface->buffer_alloc(be, c->bytes, &c->buffer, &host) != 0) {
        c->buffer = NULL;
        kiri_kvcache_free(c);
        return KIRI_E_NOMEM;
    }
    for (int l = 0; l < n_layer; l++) {
        struct kiri_tensor *t[2] = {&c->k[l], &c->v[l]};
        for (int j = 0; j < 2; j++) {
            const size_t off = ((size_t)l * 2 + (size_t)j) * layer_bytes;
            t[j]->type = type;
            t[j]->ne[0] = kv_dim;
            t[j]->ne[1] = (int64_t)slots;
            t[j]->ne[2] = t[j]->ne[3] = 1;
            t[j]->nb[0] = kiri_type_size(type);
            t[j]->nb[1] = row;
            t[j]->nb[2] = t[j]->nb[3] = row * slots;
            t[j]->buffer = c->buffer;
            t[j]->offset = off;
            t[j]->data = host ? (char *)host + off : NULL;
            t[j]->name = j ? "cache_v" : "cache_k";
        }
    }
    /* Hand out low block ids first. */
    for (int32_t i = 0; i < n_blocks; i++)
        c->free_list[i] = n_blocks - 1 - i;
    c->n_free = n_blocks;
    *out = c;
    return KIRI_OK;
}

void kiri_kvcache_free(struct kiri_kvcache *c)
{
    if (!c)
        return;
    if (c->buffer)
        c->iface->buffer_free(c->be, c->buffer);
    kiri_mem_free(c->k);
    kiri_mem_free(c->v);
    kiri_mem_free(c->refs);
    kiri_mem_free(c->free_list);
    kiri_mem_free(c);
}

int kiri_kvcache_block_size(const struct kiri_kvcache *c) { return c->block_size; }
int32_t kiri_kvcache_n_blocks(const struct kiri_kvcache *c) { return c->n_blocks; }
int32_t kiri_kvcache_n_free(const struct kiri_kvcache *c) { return c->n_free; }
size_t kiri_kvcache_bytes(const struct kiri_kvcache *c) { return c->bytes; }
struct kiri_tensor *kiri_kvcache_k(struct kiri_kvcache *c, int layer) { return &c->k[layer]; }
struct kiri_tensor *kiri_kvcache_v(struct kiri_kvcache *c, int layer) { return &c->v[layer]; }

int kiri_kvcache_seq_reserve(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t n_tokens)
{
    if (n_tokens < 0)
        return KIRI_E_INVALID_ARG;
    const int32_t need = (int32_t)(((int64_t)n_tokens + c->block_size - 1) / c->block_size);
    if (need <= seq->n_blocks)
        return KIRI_OK;
    const int32_t more = need - seq->n_blocks;
    if (more > c->n_free)
        return KIRI_E_CONTEXT_FULL;
    if (need > seq->cap) {
        int32_t cap = seq->cap ? seq->cap : 8;
        while (cap < need)
            cap = cap > INT32_MAX / 2 ? need : cap * 2;
        int32_t *b = kiri_mem_realloc(seq->blocks, (size_t)cap * sizeof *b);
        if (!b)
            return KIRI_E_NOMEM;
        seq->blocks = b;
        seq->cap = cap;
    }
    for (int32_t i = 0; i < more; i++) {
        const int32_t id = c->free_list[--c->n_free];
        c->refs[id] = 1;
        seq->blocks[seq->n_blocks++] = id;
    }
    return KIRI_OK;
}

void kiri_kvcache_seq_clear(struct kiri_kvcache *c, struct kiri_kv_seq *seq)
{
    for (int32_t i = 0; i < seq->n_blocks; i++) {
        const int32_t id = seq->blocks[i];
        if (id >= 0 && id < c->n_blocks && c->refs[id] > 0 && --c->refs[id] == 0)
            c->free_list[c->n_free++] = id;
    }
    seq->n_blocks = 0;
    seq->n_tokens = 0;
}

void kiri_kvcache_seq_free(struct kiri_kvcache *c, struct kiri_kv_seq *seq)
{
    kiri_kvcache_seq_clear(c, seq);
    kiri_mem_free(seq->blocks);
    memset(seq, 0, sizeof *seq);
}

int32_t kiri_kvcache_slot(const struct kiri_kvcache *c, const struct kiri_kv_seq *seq, int32_t pos)
{
    return seq->blocks[pos / c->block_size] * c->block_size + pos % c->block_size;
}
