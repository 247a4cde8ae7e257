#include "kvcache.h"

#include <string.h>

#include "backend.h"
#include "kiri.h"
#include "mem.h"

/* The layers of one backend: keys then values of each of its layers, in one buffer. */
struct part {
    const struct kiri_backend_iface *iface;   /* borrowed */
    struct kiri_backend *be;                  /* borrowed */
    struct kiri_buffer *buffer;               /* owned, NULL when the part holds no layer */
};

struct kiri_kvcache {
    /* part[0] holds layers [0, n_first) (none when n_first is 0), part[1] the others, on the
     * backend the cache was created on. */
    struct part part[2];
    int n_first;
    size_t bytes;
    size_t layer_bytes;                       /* keys or values of one layer */
    int n_layer;
    int block_size;
    int32_t n_blocks;
    struct kiri_tensor *k, *v;                /* owned arrays of n_layer descriptors */
    int32_t *refs;                            /* owned: reference count per block */
    int32_t *free_list;                       /* owned: stack of free block ids */
    int32_t n_free;
    /* Prefix index: a published block is in bucket hash & mask, chained through next. */
    int32_t *buckets;                         /* owned, mask + 1 entries, -1 empty */
    uint32_t mask;
    int32_t *next;                            /* owned, per block */
    uint8_t *cached;                          /* owned, per block: published */
    uint64_t *hash;                           /* owned, per block */
    int32_t *tokens;                          /* owned, per block: its block_size tokens */
    uint64_t *stamp;                          /* owned, per block: last use, for LRU eviction */
    uint64_t clock;
    int32_t n_cached;
    int32_t n_evictable;                      /* cached blocks whose only reference is the cache */
    uint64_t hits;
};

/* Allocates the buffers of a placement (part[1] always, part[0] when n_first > 0) and points
 * the layer descriptors k[l], v[l] into them. On failure nothing is allocated. */
static int alloc_parts(struct kiri_kvcache *c, struct part p[2], int n_first, struct kiri_tensor *k,
                       struct kiri_tensor *v)
{
    void *host[2] = {NULL, NULL};
    const int n[2] = {n_first, c->n_layer - n_first};
    p[0].buffer = p[1].buffer = NULL;
    for (int i = 0; i < 2; i++) {
        if (n[i] == 0)
            continue;
        if (p[i].iface->buffer_alloc(p[i].be, c->layer_bytes * 2 * (size_t)n[i], &p[i].buffer, &host[i]) != 0) {
            p[i].buffer = NULL;
            if (i == 1 && p[0].buffer)
                p[0].iface->buffer_free(p[0].be, p[0].buffer);
            p[0].buffer = NULL;
            return KIRI_E_NOMEM;
        }
    }
    const size_t slots = (size_t)c->n_blocks * (size_t)c->block_size;
    for (int l = 0; l < c->n_layer; l++) {
        const int i = l < n_first ? 0 : 1;
        const size_t local = (size_t)(i ? l - n_first : l);
        struct kiri_tensor *t[2] = {&k[l], &v[l]};
        for (int j = 0; j < 2; j++) {
            const size_t off = (local * 2 + (size_t)j) * c->layer_bytes;
            t[j]->ne[1] = (int64_t)slots;
            t[j]->buffer = p[i].buffer;
            t[j]->offset = off;
            t[j]->data = host[i] ? (char *)host[i] + off : NULL;
        }
    }
    return KIRI_OK;
}

int kiri_kvcache_init_split(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_first,
                            const struct kiri_backend_iface *first_iface, struct kiri_backend *first_be,
                            int n_layer, int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                            struct kiri_kvcache **out)
{
    if (n_layer < 1 || kv_dim < 1 || block_size < 1 || n_blocks < 1 || n_first < 0 || n_first > n_layer ||
        (n_first > 0 && (!first_iface || !first_be)))
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
    c->part[0] = (struct part){n_first ? first_iface : iface, n_first ? first_be : be, NULL};
    c->part[1] = (struct part){iface, be, NULL};
    c->n_first = n_first;
    c->n_layer = n_layer;
    c->block_size = block_size;
    c->n_blocks = n_blocks;
    c->layer_bytes = layer_bytes;
    c->bytes = layer_bytes * 2 * (size_t)n_layer;
    c->k = kiri_mem_calloc((size_t)n_layer, sizeof *c->k);
    c->v = kiri_mem_calloc((size_t)n_layer, sizeof *c->v);
    c->refs = kiri_mem_calloc((size_t)n_blocks, sizeof *c->refs);
    c->free_list = kiri_mem_array((size_t)n_blocks, sizeof *c->free_list);
    uint32_t nb = 1;
    while (nb < (uint32_t)n_blocks)
        nb <<= 1;
    c->mask = nb - 1;
    c->buckets = kiri_mem_array(nb, sizeof *c->buckets);
    c->next = kiri_mem_array((size_t)n_blocks, sizeof *c->next);
    c->cached = kiri_mem_calloc((size_t)n_blocks, 1);
    c->hash = kiri_mem_calloc((size_t)n_blocks, sizeof *c->hash);
    c->stamp = kiri_mem_calloc((size_t)n_blocks, sizeof *c->stamp);
    c->tokens = kiri_mem_array((size_t)n_blocks * (size_t)block_size, sizeof *c->tokens);
    if (!c->k || !c->v || !c->refs || !c->free_list || !c->buckets || !c->next || !c->cached || !c->hash ||
        !c->stamp || !c->tokens) {
        kiri_kvcache_free(c);
        return KIRI_E_NOMEM;
    }
    for (int l = 0; l < n_layer; l++) {
        struct kiri_tensor *t[2] = {&c->k[l], &c->v[l]};
        for (int j = 0; j < 2; j++) {
            t[j]->type = type;
            t[j]->ne[0] = kv_dim;
            t[j]->ne[2] = t[j]->ne[3] = 1;
            t[j]->nb[0] = kiri_type_size(type);
            t[j]->nb[1] = row;
            t[j]->nb[2] = t[j]->nb[3] = row * slots;
            t[j]->name = j ? "cache_v" : "cache_k";
        }
    }
    if (alloc_parts(c, c->part, n_first, c->k, c->v) != KIRI_OK) {
        kiri_kvcache_free(c);
        return KIRI_E_NOMEM;
    }
    for (uint32_t i = 0; i < nb; i++)
        c->buckets[i] = -1;
    /* Hand out low block ids first. */
    for (int32_t i = 0; i < n_blocks; i++)
        c->free_list[i] = n_blocks - 1 - i;
    c->n_free = n_blocks;
    *out = c;
    return KIRI_OK;
}

int kiri_kvcache_init(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_layer,
                      int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                      struct kiri_kvcache **out)
{
    return kiri_kvcache_init_split(iface, be, 0, NULL, NULL, n_layer, kv_dim, type, block_size, n_blocks, out);
}

enum { COPY_CHUNK = 1 << 20 };

/* Copies size bytes of one layer's keys or values between descriptors that may live on different
 * backends, in chunks of at most COPY_CHUNK bytes through tmp (a device's staging buffer need not
 * hold a whole layer). */
static int copy_layer(const struct part *sp, const struct kiri_tensor *src, const struct part *dp,
                      struct kiri_tensor *dst, size_t size, char *tmp)
{
    if (src->data && dst->data) {
        memcpy(dst->data, src->data, size);
        return 0;
    }
    int rc = 0;
    for (size_t off = 0; off < size && rc == 0; off += COPY_CHUNK) {
        const size_t n = size - off < COPY_CHUNK ? size - off : COPY_CHUNK;
        if (src->data)
            rc = dp->iface->tensor_set(dp->be, dst, (const char *)src->data + off, off, n);
        else if (dst->data)
            rc = sp->iface->tensor_get(sp->be, src, (char *)dst->data + off, off, n);
        else if ((rc = sp->iface->tensor_get(sp->be, src, tmp, off, n)) == 0)
            rc = dp->iface->tensor_set(dp->be, dst, tmp, off, n);
    }
    return rc;
}

int kiri_kvcache_place(struct kiri_kvcache *c, int n_first, const struct kiri_backend_iface *first_iface,
                       struct kiri_backend *first_be, const struct kiri_backend_iface *iface, struct kiri_backend *be)
{
    if (n_first < 0 || n_first > c->n_layer || (n_first > 0 && (!first_iface || !first_be)) || !iface || !be)
        return KIRI_E_INVALID_ARG;
    if (n_first == c->n_first && (n_first == 0 || first_be == c->part[0].be) && be == c->part[1].be)
        return KIRI_OK;
    struct part np[2] = {{n_first ? first_iface : iface, n_first ? first_be : be, NULL}, {iface, be, NULL}};
    /* Everything that can run out of memory comes before the first copy, so a failure never
     * leaves copies queued into a buffer that is then freed. */
    struct kiri_tensor *k = kiri_mem_array((size_t)c->n_layer, sizeof *k);
    struct kiri_tensor *v = kiri_mem_array((size_t)c->n_layer, sizeof *v);
    char *tmp = kiri_mem_alloc(c->layer_bytes < COPY_CHUNK ? c->layer_bytes : COPY_CHUNK);
    int rc = k && v && tmp ? KIRI_OK : KIRI_E_NOMEM;
    if (rc == KIRI_OK) {
        memcpy(k, c->k, (size_t)c->n_layer * sizeof *k);
        memcpy(v, c->v, (size_t)c->n_layer * sizeof *v);
        rc = alloc_parts(c, np, n_first, k, v);
    }
    for (int l = 0; l < c->n_layer && rc == KIRI_OK; l++) {
        const struct part *sp = &c->part[l < c->n_first ? 0 : 1], *dp = &np[l < n_first ? 0 : 1];
        if (copy_layer(sp, &c->k[l], dp, &k[l], c->layer_bytes, tmp) != 0 ||
            copy_layer(sp, &c->v[l], dp, &v[l], c->layer_bytes, tmp) != 0)
            rc = KIRI_E_BACKEND;
    }
    if (rc == KIRI_E_BACKEND) {
        /* A device failed mid-copy: reading a byte back from each new buffer completes what was
         * queued into it before it is freed. */
        for (int i = 0; i < 2; i++) {
            const int l = i ? n_first : 0;
            char byte;
            if (np[i].buffer && !k[l].data)
                (void)np[i].iface->tensor_get(np[i].be, &k[l], &byte, 0, 1);
        }
        for (int i = 0; i < 2; i++)
            if (np[i].buffer)
                np[i].iface->buffer_free(np[i].be, np[i].buffer);
    }
    if (rc == KIRI_OK) {
        for (int i = 0; i < 2; i++)
            if (c->part[i].buffer)
                c->part[i].iface->buffer_free(c->part[i].be, c->part[i].buffer);
        c->part[0] = np[0];
        c->part[1] = np[1];
        c->n_first = n_first;
        memcpy(c->k, k, (size_t)c->n_layer * sizeof *k);
        memcpy(c->v, v, (size_t)c->n_layer * sizeof *v);
    }
    kiri_mem_free(k);
    kiri_mem_free(v);
    kiri_mem_free(tmp);
    return rc;
}

int kiri_kvcache_n_first(const struct kiri_kvcache *c) { return c->n_first; }

struct kiri_backend *kiri_kvcache_backend(const struct kiri_kvcache *c, int layer)
{
    return c->part[layer < c->n_first ? 0 : 1].be;
}

void kiri_kvcache_free(struct kiri_kvcache *c)
{
    if (!c)
        return;
    for (int i = 0; i < 2; i++)
        if (c->part[i].buffer)
            c->part[i].iface->buffer_free(c->part[i].be, c->part[i].buffer);
    kiri_mem_free(c->k);
    kiri_mem_free(c->v);
    kiri_mem_free(c->refs);
    kiri_mem_free(c->free_list);
    kiri_mem_free(c->buckets);
    kiri_mem_free(c->next);
    kiri_mem_free(c->cached);
    kiri_mem_free(c->hash);
    kiri_mem_free(c->stamp);
    kiri_mem_free(c->tokens);
    kiri_mem_free(c);
}

int kiri_kvcache_block_size(const struct kiri_kvcache *c) { return c->block_size; }
int32_t kiri_kvcache_n_free(const struct kiri_kvcache *c) { return c->n_free; }
size_t kiri_kvcache_bytes(const struct kiri_kvcache *c) { return c->bytes; }
struct kiri_tensor *kiri_kvcache_k(struct kiri_kvcache *c, int layer) { return &c->k[layer]; }
struct kiri_tensor *kiri_kvcache_v(struct kiri_kvcache *c, int layer) { return &c->v[layer]; }

int32_t kiri_kvcache_n_available(const struct kiri_kvcache *c) { return c->n_free + c->n_evictable; }
int32_t kiri_kvcache_n_cached(const struct kiri_kvcache *c) { return c->n_cached; }
uint64_t kiri_kvcache_prefix_hits(const struct kiri_kvcache *c) { return c->hits; }

/* Drops a block's reference; the last one returns it to the free list. A cached block whose only
 * remaining reference is the cache's becomes evictable. */
static void unref(struct kiri_kvcache *c, int32_t id)
{
    if (id < 0 || id >= c->n_blocks || c->refs[id] <= 0)
        return;
    if (--c->refs[id] == 0)
        c->free_list[c->n_free++] = id;
    else if (c->refs[id] == 1 && c->cached[id])
        c->n_evictable++;
}

static void unlink_cached(struct kiri_kvcache *c, int32_t id)
{
    int32_t *p = &c->buckets[c->hash[id] & c->mask];
    while (*p >= 0 && *p != id)
        p = &c->next[*p];
    if (*p == id)
        *p = c->next[id];
    c->cached[id] = 0;
    c->n_cached--;
}

/* Frees the least recently used cached block that only the cache references. */
static int evict_one(struct kiri_kvcache *c)
{
    int32_t best = -1;
    for (int32_t id = 0; id < c->n_blocks; id++)
        if (c->cached[id] && c->refs[id] == 1 && (best < 0 || c->stamp[id] < c->stamp[best]))
            best = id;
    if (best < 0)
        return 0;
    unlink_cached(c, best);
    c->n_evictable--;
    unref(c, best);
    return 1;
}

uint64_t kiri_kvcache_block_hash(uint64_t parent, const int32_t *tokens, int n)
{
    uint64_t h = parent ^ 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < n; i++) {
        h ^= (uint64_t)(uint32_t)tokens[i] + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
        h *= 0xBF58476D1CE4E5B9ull;
        h ^= h >> 31;
    }
    return h ? h : 1;
}

static int32_t find_cached(const struct kiri_kvcache *c, uint64_t hash, const int32_t *tokens)
{
    for (int32_t id = c->buckets[hash & c->mask]; id >= 0; id = c->next[id])
        if (c->hash[id] == hash &&
            memcmp(c->tokens + (size_t)id * (size_t)c->block_size, tokens, (size_t)c->block_size * sizeof *tokens) == 0)
            return id;
    return -1;
}

static int grow_table(struct kiri_kv_seq *seq, int32_t need)
{
    if (need <= seq->cap)
        return KIRI_OK;
    int32_t cap = seq->cap ? seq->cap : 8;
    while (cap < need)
        cap = cap > INT32_MAX / 2 ? need : cap * 2;
    int32_t *b = kiri_mem_realloc(seq->blocks, (size_t)cap * sizeof *b);
    if (!b)
        return KIRI_E_NOMEM;
    seq->blocks = b;
    seq->cap = cap;
    return KIRI_OK;
}

int kiri_kvcache_seq_share_prefix(struct kiri_kvcache *c, struct kiri_kv_seq *seq, uint64_t hash,
                                  const int32_t *tokens)
{
    if (seq->n_tokens != seq->n_blocks * c->block_size)
        return KIRI_E_INVALID_ARG;
    const int32_t id = find_cached(c, hash, tokens);
    if (id < 0)
        return KIRI_E_INVALID_ARG;
    if (grow_table(seq, seq->n_blocks + 1) != KIRI_OK)
        return KIRI_E_NOMEM;
    if (c->refs[id] == 1)
        c->n_evictable--;
    c->refs[id]++;
    c->stamp[id] = ++c->clock;
    c->hits++;
    seq->blocks[seq->n_blocks++] = id;
    seq->n_tokens += c->block_size;
    return KIRI_OK;
}

void kiri_kvcache_publish(struct kiri_kvcache *c, const struct kiri_kv_seq *seq, int32_t i, uint64_t hash,
                          const int32_t *tokens)
{
    if (i < 0 || i >= seq->n_blocks)
        return;
    const int32_t id = seq->blocks[i];
    if (c->cached[id] || find_cached(c, hash, tokens) >= 0)
        return;
    c->cached[id] = 1;
    c->hash[id] = hash;
    memcpy(c->tokens + (size_t)id * (size_t)c->block_size, tokens, (size_t)c->block_size * sizeof *tokens);
    c->stamp[id] = ++c->clock;
    c->next[id] = c->buckets[hash & c->mask];
    c->buckets[hash & c->mask] = id;
    c->refs[id]++; /* the cache's own reference */
    c->n_cached++;
}

int kiri_kvcache_seq_reserve(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t n_tokens)
{
    if (n_tokens < 0)
        return KIRI_E_INVALID_ARG;
    const int32_t need = (int32_t)(((int64_t)n_tokens + c->block_size - 1) / c->block_size);
    if (need <= seq->n_blocks)
        return KIRI_OK;
    const int32_t more = need - seq->n_blocks;
    if (more > c->n_free + c->n_evictable)
        return KIRI_E_CONTEXT_FULL;
    if (grow_table(seq, need) != KIRI_OK)
        return KIRI_E_NOMEM;
    while (c->n_free < more && evict_one(c))
        ;
    for (int32_t i = 0; i < more; i++) {
        const int32_t id = c->free_list[--c->n_free];
        c->refs[id] = 1;
        seq->blocks[seq->n_blocks++] = id;
    }
    return KIRI_OK;
}

void kiri_kvcache_seq_clear(struct kiri_kvcache *c, struct kiri_kv_seq *seq)
{
    for (int32_t i = 0; i < seq->n_blocks; i++)
        unref(c, seq->blocks[i]);
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
