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

/* The blocks of one pool: reference counts, the free list and the prefix index. */
struct pool {
    int32_t n_blocks;
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

struct kiri_kvcache {
    /* part[0] holds layers [0, n_first) (none when n_first is 0), part[1] the others, on the
     * backend the cache was created on. */
    struct part part[2];
    int n_first;
    size_t bytes;
    int n_layer;
    int block_size;
    /* pool[0] holds the global layers, pool[1] (with a window only) the windowed ones. */
    struct pool pool[2];
    int32_t window;                           /* 0: no windowed pool */
    uint8_t *windowed;                        /* owned (n_layer): layer l is in pool[1]; NULL
                                                 without a window */
    size_t *row;                              /* owned (n_layer): bytes of one slot of layer l's
                                                 keys (or values) */
    int32_t *source;                          /* owned (n_layer): the layer whose keys and values
                                                 layer l attends; l for a layer with its own */
    struct kiri_tensor *k, *v;                /* owned arrays of n_layer descriptors (a layer
                                                 without its own: unused, see kiri_kvcache_k) */
    /* Recurrent state (kiri_kvcache_state): one row per slot in each recurrent layer, on the
     * backend that runs the layer: layers below n_first in state_part[0]'s buffer, the others in
     * state_part[1]'s (each NULL when it holds none); none when n_state_slots is 0. The state
     * stays where it was made (kiri_kvcache_place never moves it). */
    int32_t n_state_slots;
    struct kiri_tensor *state;                /* owned (n_layer): ne[1] == 0 for a layer without */
    struct part state_part[2];                /* their buffers owned */
    size_t state_bytes;
    int32_t *state_free;                      /* owned: stack of free slots */
    int32_t n_state_free;
    /* State snapshots (kiri_kvcache_snapshot): n_snap host copies of one slot's state (every
     * recurrent layer's row, snap_bytes in all), each kept with the cached global block it ends. */
    int32_t n_snap;
    size_t snap_bytes;
    char *snap;                               /* owned: n_snap * snap_bytes */
    int32_t *snap_block;                      /* owned (n_snap): its global block, -1 free */
    uint64_t *snap_stamp;                     /* owned (n_snap): last use, for LRU eviction */
    uint64_t *snap_gen;                       /* owned (n_snap): bumped at each take */
    uint8_t *snap_shared;                     /* owned (n_snap): a sequence resumed from it */
    int32_t *snap_of;                         /* owned (global blocks): its snapshot, -1 none */
    int32_t n_snap_used;
    uint64_t snap_clock, snap_hits, snap_misses;
};

static struct pool *pool_of(struct kiri_kvcache *c, int layer)
{
    return &c->pool[c->windowed && c->windowed[layer] ? 1 : 0];
}

/* The bytes of layer l's keys (or values) in its pool: 0 for a layer that reads another's, or
 * keeps none (a recurrent layer). */
static size_t layer_bytes(struct kiri_kvcache *c, int l)
{
    if (c->source[l] != l || c->row[l] == 0)
        return 0;
    return c->row[l] * (size_t)pool_of(c, l)->n_blocks * (size_t)c->block_size;
}

/* Allocates the buffers of a placement (part[1] always, part[0] when n_first > 0) and points
 * the layer descriptors k[l], v[l] into them. On failure nothing is allocated. */
static int alloc_parts(struct kiri_kvcache *c, struct part p[2], int n_first, struct kiri_tensor *k,
                       struct kiri_tensor *v)
{
    void *host[2] = {NULL, NULL};
    size_t size[2] = {0, 0};
    for (int l = 0; l < c->n_layer; l++)
        size[l < n_first ? 0 : 1] += layer_bytes(c, l) * 2;
    p[0].buffer = p[1].buffer = NULL;
    for (int i = 0; i < 2; i++) {
        if (size[i] == 0)
            continue;
        if (p[i].iface->buffer_alloc(p[i].be, size[i], &p[i].buffer, &host[i]) != 0) {
            p[i].buffer = NULL;
            if (i == 1 && p[0].buffer)
                p[0].iface->buffer_free(p[0].be, p[0].buffer);
            p[0].buffer = NULL;
            return KIRI_E_NOMEM;
        }
    }
    size_t off[2] = {0, 0};
    for (int l = 0; l < c->n_layer; l++) {
        const int i = l < n_first ? 0 : 1;
        const struct pool *pl = pool_of(c, l);
        const size_t bytes = layer_bytes(c, l);
        struct kiri_tensor *t[2] = {&k[l], &v[l]};
        for (int j = 0; j < 2 && bytes; j++) {
            t[j]->ne[1] = (int64_t)pl->n_blocks * c->block_size;
            t[j]->buffer = p[i].buffer;
            t[j]->offset = off[i];
            t[j]->data = host[i] ? (char *)host[i] + off[i] : NULL;
            off[i] += bytes;
        }
    }
    return KIRI_OK;
}

static int pool_init(struct pool *p, int32_t n_blocks, int block_size)
{
    p->n_blocks = n_blocks;
    p->refs = kiri_mem_calloc((size_t)n_blocks, sizeof *p->refs);
    p->free_list = kiri_mem_array((size_t)n_blocks, sizeof *p->free_list);
    uint32_t nb = 1;
    while (nb < (uint32_t)n_blocks)
        nb <<= 1;
    p->mask = nb - 1;
    p->buckets = kiri_mem_array(nb, sizeof *p->buckets);
    p->next = kiri_mem_array((size_t)n_blocks, sizeof *p->next);
    p->cached = kiri_mem_calloc((size_t)n_blocks, 1);
    p->hash = kiri_mem_calloc((size_t)n_blocks, sizeof *p->hash);
    p->stamp = kiri_mem_calloc((size_t)n_blocks, sizeof *p->stamp);
    p->tokens = kiri_mem_array((size_t)n_blocks * (size_t)block_size, sizeof *p->tokens);
    if (!p->refs || !p->free_list || !p->buckets || !p->next || !p->cached || !p->hash || !p->stamp || !p->tokens)
        return KIRI_E_NOMEM;
    for (uint32_t i = 0; i < nb; i++)
        p->buckets[i] = -1;
    /* Hand out low block ids first. */
    for (int32_t i = 0; i < n_blocks; i++)
        p->free_list[i] = n_blocks - 1 - i;
    p->n_free = n_blocks;
    return KIRI_OK;
}

static void pool_free(struct pool *p)
{
    kiri_mem_free(p->refs);
    kiri_mem_free(p->free_list);
    kiri_mem_free(p->buckets);
    kiri_mem_free(p->next);
    kiri_mem_free(p->cached);
    kiri_mem_free(p->hash);
    kiri_mem_free(p->stamp);
    kiri_mem_free(p->tokens);
}

/* The bytes of one layer's keys or values in a pool of n_blocks, or 0 when they overflow. */
static size_t layer_size(size_t row, int32_t n_blocks, int block_size, int n_layer)
{
    const size_t slots = (size_t)n_blocks * (size_t)block_size;
    if (slots > INT32_MAX || row > SIZE_MAX / slots || row * slots > SIZE_MAX / 4 / (size_t)n_layer)
        return 0;
    return row * slots;
}

/* Allocates n snapshots of bytes each (none for n = 0). */
static int snap_init(struct kiri_kvcache *c, int32_t n, size_t bytes)
{
    if (n < 0 || n > (1 << 20) || (n && bytes > SIZE_MAX / 4 / (size_t)n))
        return KIRI_E_INVALID_ARG;
    if (n == 0)
        return KIRI_OK;
    const int32_t nb = c->pool[0].n_blocks;
    c->snap = kiri_mem_alloc((size_t)n * bytes);
    c->snap_block = kiri_mem_array((size_t)n, sizeof *c->snap_block);
    c->snap_stamp = kiri_mem_calloc((size_t)n, sizeof *c->snap_stamp);
    c->snap_gen = kiri_mem_calloc((size_t)n, sizeof *c->snap_gen);
    c->snap_shared = kiri_mem_calloc((size_t)n, 1);
    c->snap_of = kiri_mem_array((size_t)nb, sizeof *c->snap_of);
    if (!c->snap || !c->snap_block || !c->snap_stamp || !c->snap_gen || !c->snap_shared || !c->snap_of)
        return KIRI_E_NOMEM;
    for (int32_t i = 0; i < n; i++)
        c->snap_block[i] = -1;
    for (int32_t i = 0; i < nb; i++)
        c->snap_of[i] = -1;
    c->n_snap = n;
    c->snap_bytes = bytes;
    c->bytes += (size_t)n * bytes;
    return KIRI_OK;
}

/* Allocates the recurrent state of st's layers, each on its part's backend: a layer with keys of
 * its own cannot have state (KIRI_E_INVALID_ARG). */
static int state_init(struct kiri_kvcache *c, const struct kiri_kvcache_state *st)
{
    size_t total = 0, part_total[2] = {0, 0};
    if (st->n_slots < 1 || st->n_slots > (1 << 20))
        return KIRI_E_INVALID_ARG;
    for (int l = 0; st->dims && l < c->n_layer; l++) {
        const int64_t dim = st->dims[l];
        if (dim == 0)
            continue;
        if (dim < 0 || c->row[l] != 0 ||
            (uint64_t)dim > (SIZE_MAX / 2 - total) / sizeof(float) / (size_t)st->n_slots)
            return KIRI_E_INVALID_ARG;
        total += (size_t)dim * sizeof(float) * (size_t)st->n_slots;
        part_total[l < c->n_first ? 0 : 1] += (size_t)dim * sizeof(float) * (size_t)st->n_slots;
    }
    if (total == 0)
        return KIRI_OK;
    c->state = kiri_mem_calloc((size_t)c->n_layer, sizeof *c->state);
    c->state_free = kiri_mem_array((size_t)st->n_slots, sizeof *c->state_free);
    if (!c->state || !c->state_free)
        return KIRI_E_NOMEM;
    void *host[2] = {NULL, NULL};
    for (int p = 0; p < 2; p++) {
        struct part *sp = &c->state_part[p];
        if (!part_total[p])
            continue;
        *sp = (struct part){c->part[p].iface, c->part[p].be, NULL};
        if (sp->iface->buffer_alloc(sp->be, part_total[p], &sp->buffer, &host[p]) != 0) {
            sp->buffer = NULL;
            return KIRI_E_NOMEM;
        }
    }
    size_t offs[2] = {0, 0};
    for (int l = 0; l < c->n_layer; l++) {
        if (!st->dims[l])
            continue;
        const int p = l < c->n_first ? 0 : 1;
        const size_t row = (size_t)st->dims[l] * sizeof(float), layer = row * (size_t)st->n_slots;
        const size_t off = offs[p];
        struct kiri_tensor *t = &c->state[l];
        t->type = KIRI_TYPE_F32;
        t->ne[0] = st->dims[l];
        t->ne[1] = st->n_slots;
        t->ne[2] = t->ne[3] = 1;
        t->nb[0] = sizeof(float);
        t->nb[1] = row;
        t->nb[2] = t->nb[3] = layer;
        t->buffer = c->state_part[p].buffer;
        t->offset = off;
        t->data = host[p] ? (char *)host[p] + off : NULL;
        t->name = "state";
        offs[p] += layer;
    }
    c->n_state_slots = st->n_slots;
    c->state_bytes = total;
    c->bytes += c->state_bytes;
    for (int32_t i = 0; i < st->n_slots; i++)
        c->state_free[i] = st->n_slots - 1 - i;
    c->n_state_free = st->n_slots;
    return snap_init(c, st->n_snapshots, total / (size_t)st->n_slots);
}

int kiri_kvcache_init_layers(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_first,
                            const struct kiri_backend_iface *first_iface, struct kiri_backend *first_be,
                            int n_layer, int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                            const struct kiri_kvcache_window *w, const struct kiri_kvcache_layout *lay,
                            struct kiri_kvcache **out)
{
    if (n_layer < 1 || block_size < 1 || n_blocks < 1 || n_first < 0 || n_first > n_layer ||
        (n_first > 0 && (!first_iface || !first_be)))
        return KIRI_E_INVALID_ARG;
    if (type != KIRI_TYPE_F32 && type != KIRI_TYPE_F16 && type != KIRI_TYPE_Q8_0)
        return KIRI_E_INVALID_ARG;
    int n_windowed = 0;
    for (int l = 0; w && w->layers && l < n_layer; l++)
        n_windowed += w->layers[l] != 0;
    if (n_windowed && (w->window < 1 || w->n_blocks < 1))
        return KIRI_E_INVALID_ARG;
    /* Each layer's row, and where a layer without keys of its own reads: an earlier layer that
     * has its own, in the same pool and on the same backend. */
    for (int l = 0; l < n_layer; l++) {
        const int64_t dim = lay && lay->kv_dim ? lay->kv_dim[l] : kv_dim;
        const int32_t src = lay && lay->source ? lay->source[l] : l;
        if (dim < 0 || dim % kiri_type_block_size(type) != 0 || src < 0 || src > l ||
            (dim == 0 && (src != l || (n_windowed && w->layers[l]))))
            return KIRI_E_INVALID_ARG;
        const size_t row = (size_t)(dim / kiri_type_block_size(type)) * kiri_type_size(type);
        if (dim && !layer_size(row, n_windowed && w->layers[l] ? w->n_blocks : n_blocks, block_size, n_layer))
            return KIRI_E_INVALID_ARG;
        if (src == l)
            continue;
        const int32_t src_src = lay->source[src];
        const int own_w = n_windowed && w->layers[l], src_w = n_windowed && w->layers[src];
        if (src_src != src || own_w != src_w || (l < n_first) != (src < n_first) ||
            (lay->kv_dim && lay->kv_dim[src] != dim))
            return KIRI_E_INVALID_ARG;
    }

    struct kiri_kvcache *c = kiri_mem_calloc(1, sizeof *c);
    if (!c)
        return KIRI_E_NOMEM;
    c->part[0] = (struct part){n_first ? first_iface : iface, n_first ? first_be : be, NULL};
    c->part[1] = (struct part){iface, be, NULL};
    c->n_first = n_first;
    c->n_layer = n_layer;
    c->block_size = block_size;
    c->k = kiri_mem_calloc((size_t)n_layer, sizeof *c->k);
    c->v = kiri_mem_calloc((size_t)n_layer, sizeof *c->v);
    c->row = kiri_mem_array((size_t)n_layer, sizeof *c->row);
    c->source = kiri_mem_array((size_t)n_layer, sizeof *c->source);
    int rc = c->k && c->v && c->row && c->source ? pool_init(&c->pool[0], n_blocks, block_size) : KIRI_E_NOMEM;
    if (rc == KIRI_OK && n_windowed) {
        c->window = w->window;
        c->windowed = kiri_mem_alloc((size_t)n_layer);
        rc = c->windowed ? pool_init(&c->pool[1], w->n_blocks, block_size) : KIRI_E_NOMEM;
        for (int l = 0; c->windowed && l < n_layer; l++)
            c->windowed[l] = w->layers[l] != 0;
    }
    if (rc != KIRI_OK) {
        kiri_kvcache_free(c);
        return KIRI_E_NOMEM;
    }
    for (int l = 0; l < n_layer; l++) {
        const int64_t dim = lay && lay->kv_dim ? lay->kv_dim[l] : kv_dim;
        const size_t row = (size_t)(dim / kiri_type_block_size(type)) * kiri_type_size(type);
        const size_t slots = (size_t)pool_of(c, l)->n_blocks * (size_t)block_size;
        c->row[l] = row;
        c->source[l] = lay && lay->source ? lay->source[l] : l;
        c->bytes += layer_bytes(c, l) * 2;
        struct kiri_tensor *t[2] = {&c->k[l], &c->v[l]};
        for (int j = 0; j < 2; j++) {
            t[j]->type = type;
            t[j]->ne[0] = dim;
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
    if (lay && lay->state && (rc = state_init(c, lay->state)) != KIRI_OK) {
        kiri_kvcache_free(c);
        return rc;
    }
    *out = c;
    return KIRI_OK;
}

int kiri_kvcache_init_windowed(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_first,
                               const struct kiri_backend_iface *first_iface, struct kiri_backend *first_be,
                               int n_layer, int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                               const struct kiri_kvcache_window *w, struct kiri_kvcache **out)
{
    return kiri_kvcache_init_layers(iface, be, n_first, first_iface, first_be, n_layer, kv_dim, type, block_size,
                                    n_blocks, w, NULL, out);
}

int kiri_kvcache_init_split(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_first,
                            const struct kiri_backend_iface *first_iface, struct kiri_backend *first_be,
                            int n_layer, int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                            struct kiri_kvcache **out)
{
    return kiri_kvcache_init_windowed(iface, be, n_first, first_iface, first_be, n_layer, kv_dim, type, block_size,
                                      n_blocks, NULL, out);
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
    for (int l = 0; l < c->n_layer; l++) {
        if ((l < n_first) != (c->source[l] < n_first))
            return KIRI_E_INVALID_ARG;   /* a layer and the cache it reads stay together */
        /* The recurrent state stays where it was made (moving it is not done): a layer with
         * state keeps its backend. */
        if (c->state && c->state[l].ne[1] && (l < n_first ? first_be : be) != kiri_kvcache_backend(c, l))
            return KIRI_E_INVALID_ARG;
    }
    if (n_first == c->n_first && (n_first == 0 || first_be == c->part[0].be) && be == c->part[1].be)
        return KIRI_OK;
    struct part np[2] = {{n_first ? first_iface : iface, n_first ? first_be : be, NULL}, {iface, be, NULL}};
    /* Everything that can run out of memory comes before the first copy, so a failure never
     * leaves copies queued into a buffer that is then freed. */
    struct kiri_tensor *k = kiri_mem_array((size_t)c->n_layer, sizeof *k);
    struct kiri_tensor *v = kiri_mem_array((size_t)c->n_layer, sizeof *v);
    size_t largest = 1;
    for (int l = 0; l < c->n_layer; l++)
        largest = layer_bytes(c, l) > largest ? layer_bytes(c, l) : largest;
    char *tmp = kiri_mem_alloc(largest < COPY_CHUNK ? largest : COPY_CHUNK);
    int rc = k && v && tmp ? KIRI_OK : KIRI_E_NOMEM;
    if (rc == KIRI_OK) {
        memcpy(k, c->k, (size_t)c->n_layer * sizeof *k);
        memcpy(v, c->v, (size_t)c->n_layer * sizeof *v);
        rc = alloc_parts(c, np, n_first, k, v);
    }
    for (int l = 0; l < c->n_layer && rc == KIRI_OK; l++) {
        const struct part *sp = &c->part[l < c->n_first ? 0 : 1], *dp = &np[l < n_first ? 0 : 1];
        const size_t size = layer_bytes(c, l);
        if (size && (copy_layer(sp, &c->k[l], dp, &k[l], size, tmp) != 0 ||
                     copy_layer(sp, &c->v[l], dp, &v[l], size, tmp) != 0))
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
    pool_free(&c->pool[0]);
    pool_free(&c->pool[1]);
    kiri_mem_free(c->windowed);
    kiri_mem_free(c->row);
    kiri_mem_free(c->source);
    for (int p = 0; p < 2; p++)
        if (c->state_part[p].buffer)
            c->state_part[p].iface->buffer_free(c->state_part[p].be, c->state_part[p].buffer);
    kiri_mem_free(c->state);
    kiri_mem_free(c->state_free);
    kiri_mem_free(c->snap);
    kiri_mem_free(c->snap_block);
    kiri_mem_free(c->snap_stamp);
    kiri_mem_free(c->snap_gen);
    kiri_mem_free(c->snap_shared);
    kiri_mem_free(c->snap_of);
    kiri_mem_free(c);
}

int kiri_kvcache_block_size(const struct kiri_kvcache *c) { return c->block_size; }
int32_t kiri_kvcache_n_free(const struct kiri_kvcache *c) { return c->pool[0].n_free; }
int32_t kiri_kvcache_n_free_window(const struct kiri_kvcache *c) { return c->pool[1].n_free; }
size_t kiri_kvcache_bytes(const struct kiri_kvcache *c) { return c->bytes; }
int32_t kiri_kvcache_window(const struct kiri_kvcache *c) { return c->window; }
struct kiri_tensor *kiri_kvcache_k(struct kiri_kvcache *c, int layer) { return &c->k[c->source[layer]]; }
struct kiri_tensor *kiri_kvcache_v(struct kiri_kvcache *c, int layer) { return &c->v[c->source[layer]]; }
int kiri_kvcache_layer_source(const struct kiri_kvcache *c, int layer) { return c->source[layer]; }

struct kiri_tensor *kiri_kvcache_state(struct kiri_kvcache *c, int layer)
{
    return c->state && layer >= 0 && layer < c->n_layer && c->state[layer].ne[1] ? &c->state[layer] : NULL;
}

int32_t kiri_kvcache_n_state_slots(const struct kiri_kvcache *c) { return c->n_state_slots; }
int32_t kiri_kvcache_n_state_free(const struct kiri_kvcache *c) { return c->n_state_free; }
size_t kiri_kvcache_state_bytes(const struct kiri_kvcache *c) { return c->state_bytes; }
int32_t kiri_kvcache_seq_state_row(const struct kiri_kv_seq *seq) { return seq->state - 1; }

int kiri_kvcache_layer_has_kv(const struct kiri_kvcache *c, int layer)
{
    return layer >= 0 && layer < c->n_layer && c->row[c->source[layer]] != 0;
}

int kiri_kvcache_layer_windowed(const struct kiri_kvcache *c, int layer)
{
    return c->windowed && layer >= 0 && layer < c->n_layer && c->windowed[layer];
}

static int32_t available(const struct pool *p) { return p->n_free + p->n_evictable; }

int32_t kiri_kvcache_n_available(const struct kiri_kvcache *c) { return available(&c->pool[0]); }
int32_t kiri_kvcache_n_available_window(const struct kiri_kvcache *c) { return available(&c->pool[1]); }
int32_t kiri_kvcache_n_cached(const struct kiri_kvcache *c) { return c->pool[0].n_cached; }
uint64_t kiri_kvcache_prefix_hits(const struct kiri_kvcache *c) { return c->pool[0].hits; }

/* Drops a block's reference; the last one returns it to the free list. A cached block whose only
 * remaining reference is the cache's becomes evictable. */
static void unref(struct pool *p, int32_t id)
{
    if (id < 0 || id >= p->n_blocks || p->refs[id] <= 0)
        return;
    if (--p->refs[id] == 0)
        p->free_list[p->n_free++] = id;
    else if (p->refs[id] == 1 && p->cached[id])
        p->n_evictable++;
}

static void unlink_cached(struct pool *p, int32_t id)
{
    int32_t *at = &p->buckets[p->hash[id] & p->mask];
    while (*at >= 0 && *at != id)
        at = &p->next[*at];
    if (*at == id)
        *at = p->next[id];
    p->cached[id] = 0;
    p->n_cached--;
}

/* Frees snapshot i (it is taken). */
static void snap_drop(struct kiri_kvcache *c, int32_t i)
{
    c->snap_of[c->snap_block[i]] = -1;
    c->snap_block[i] = -1;
    c->snap_shared[i] = 0;
    c->n_snap_used--;
}

/* Frees the least recently used cached block that only the cache references, and its snapshot. */
static int evict_one(struct kiri_kvcache *c, struct pool *p)
{
    int32_t best = -1;
    for (int32_t id = 0; id < p->n_blocks; id++)
        if (p->cached[id] && p->refs[id] == 1 && (best < 0 || p->stamp[id] < p->stamp[best]))
            best = id;
    if (best < 0)
        return 0;
    unlink_cached(p, best);
    if (p == &c->pool[0] && c->snap_of && c->snap_of[best] >= 0)
        snap_drop(c, c->snap_of[best]);
    p->n_evictable--;
    unref(p, best);
    return 1;
}

/* Takes n blocks (n <= available(p)) into ids, evicting cached blocks when too few are free. */
static void take(struct kiri_kvcache *c, struct pool *p, int32_t n, int32_t *ids)
{
    while (p->n_free < n && evict_one(c, p))
        ;
    for (int32_t i = 0; i < n; i++) {
        const int32_t id = p->free_list[--p->n_free];
        p->refs[id] = 1;
        ids[i] = id;
    }
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

static int32_t find_cached(const struct pool *p, int block_size, uint64_t hash, const int32_t *tokens)
{
    for (int32_t id = p->buckets[hash & p->mask]; id >= 0; id = p->next[id])
        if (p->hash[id] == hash &&
            memcmp(p->tokens + (size_t)id * (size_t)block_size, tokens, (size_t)block_size * sizeof *tokens) == 0)
            return id;
    return -1;
}

/* Takes a reference on a cached block for a sequence. */
static void share_block(struct pool *p, int32_t id)
{
    if (p->refs[id] == 1)
        p->n_evictable--;
    p->refs[id]++;
    p->stamp[id] = ++p->clock;
    p->hits++;
}

static void publish_block(struct pool *p, int block_size, int32_t id, uint64_t hash, const int32_t *tokens)
{
    if (p->cached[id] || find_cached(p, block_size, hash, tokens) >= 0)
        return;
    p->cached[id] = 1;
    p->hash[id] = hash;
    memcpy(p->tokens + (size_t)id * (size_t)block_size, tokens, (size_t)block_size * sizeof *tokens);
    p->stamp[id] = ++p->clock;
    p->next[id] = p->buckets[hash & p->mask];
    p->buckets[hash & p->mask] = id;
    p->refs[id]++; /* the cache's own reference */
    p->n_cached++;
}

/* Grows seq's tables (the windowed one too when the cache has a window) to hold need blocks. */
static int grow_table(const struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t need)
{
    if (need <= seq->cap && (!c->window || seq->wblocks))
        return KIRI_OK;
    int32_t cap = seq->cap ? seq->cap : 8;
    while (cap < need)
        cap = cap > INT32_MAX / 2 ? need : cap * 2;
    int32_t *b = kiri_mem_realloc(seq->blocks, (size_t)cap * sizeof *b);
    if (!b)
        return KIRI_E_NOMEM;
    seq->blocks = b;
    if (c->window) {
        int32_t *w = kiri_mem_realloc(seq->wblocks, (size_t)cap * sizeof *w);
        if (!w)
            return KIRI_E_NOMEM;
        seq->wblocks = w;
    }
    seq->cap = cap;
    return KIRI_OK;
}

/* The first windowed block the positions from pos on still attend: the one holding key
 * pos - window + 1. */
static int32_t window_first_block(const struct kiri_kvcache *c, int64_t pos)
{
    const int64_t first_key = pos - c->window + 1;
    return first_key <= 0 ? 0 : (int32_t)(first_key / c->block_size);
}

/* Returns the windowed blocks no position from seq->n_tokens on attends. */
static void release_window(struct kiri_kvcache *c, struct kiri_kv_seq *seq)
{
    if (!c->window || !seq->wblocks)
        return;
    int32_t lo = window_first_block(c, seq->n_tokens);
    if (lo > seq->n_blocks)
        lo = seq->n_blocks;
    while (seq->w_lo < lo)
        unref(&c->pool[1], seq->wblocks[seq->w_lo++]);
}

/* Copies state slot `row` to snapshot i (to_snap) or snapshot i into the slot, layer by layer. */
static int snap_copy(struct kiri_kvcache *c, int32_t row, int32_t i, int to_snap)
{
    char *snap = c->snap + (size_t)i * c->snap_bytes;
    size_t at = 0;
    for (int l = 0; l < c->n_layer; l++) {
        struct kiri_tensor *t = &c->state[l];
        if (!t->ne[1])
            continue;
        const struct part *pt = &c->state_part[l < c->n_first ? 0 : 1];
        const size_t n = t->nb[1], off = (size_t)row * n;
        int rc = 0;
        if (t->data)
            memcpy(to_snap ? snap + at : (char *)t->data + off, to_snap ? (char *)t->data + off : snap + at, n);
        else if (to_snap)
            rc = pt->iface->tensor_get(pt->be, t, snap + at, off, n);
        else
            rc = pt->iface->tensor_set(pt->be, t, snap + at, off, n);
        if (rc != 0)
            return KIRI_E_BACKEND;
        at += n;
    }
    return KIRI_OK;
}

/* A snapshot slot for a new one: a free slot, else the least recently used one's. */
static int32_t snap_slot(struct kiri_kvcache *c)
{
    int32_t best = -1;
    for (int32_t i = 0; i < c->n_snap; i++) {
        if (c->snap_block[i] < 0)
            return i;
        if (best < 0 || c->snap_stamp[i] < c->snap_stamp[best])
            best = i;
    }
    snap_drop(c, best);
    return best;
}

int kiri_kvcache_snapshot(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t i, uint64_t hash,
                          const int32_t *tokens, int keep)
{
    if (!c->n_snap || seq->state <= 0 || i < 0 || i >= seq->n_blocks ||
        (int64_t)seq->n_tokens != (int64_t)(i + 1) * c->block_size)
        return 0;
    const int32_t id = find_cached(&c->pool[0], c->block_size, hash, tokens);
    if (id < 0 || c->snap_of[id] >= 0)
        return 0;
    /* The sequence's own earlier passing snapshot is superseded by this one unless another
     * sequence resumed from it (a slot since reused has another generation). */
    const int32_t prev = seq->snap - 1;
    if (prev >= 0 && prev < c->n_snap && c->snap_gen[prev] == seq->snap_gen && c->snap_block[prev] >= 0 &&
        !c->snap_shared[prev])
        snap_drop(c, prev);
    seq->snap = 0;
    const int32_t k = snap_slot(c);
    if (snap_copy(c, seq->state - 1, k, 1) != KIRI_OK)
        return KIRI_E_BACKEND;
    c->snap_block[k] = id;
    c->snap_of[id] = k;
    c->snap_stamp[k] = ++c->snap_clock;
    c->snap_gen[k]++;
    c->snap_shared[k] = 0;
    c->n_snap_used++;
    if (!keep) {
        seq->snap = k + 1;
        seq->snap_gen = c->snap_gen[k];
    }
    return 1;
}

int32_t kiri_kvcache_cached_blocks(const struct kiri_kvcache *c, const int32_t *tokens, int32_t n_blocks)
{
    uint64_t h = 0;
    int32_t i = 0;
    for (; i < n_blocks; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)c->block_size;
        h = kiri_kvcache_block_hash(h, t, c->block_size);
        if (find_cached(&c->pool[0], c->block_size, h, t) < 0)
            break;
    }
    return i;
}

int32_t kiri_kvcache_n_snapshots(const struct kiri_kvcache *c) { return c->n_snap; }
int32_t kiri_kvcache_n_snapshots_used(const struct kiri_kvcache *c) { return c->n_snap_used; }
size_t kiri_kvcache_snapshot_bytes(const struct kiri_kvcache *c) { return (size_t)c->n_snap * c->snap_bytes; }
uint64_t kiri_kvcache_snapshot_hits(const struct kiri_kvcache *c) { return c->snap_hits; }
uint64_t kiri_kvcache_snapshot_misses(const struct kiri_kvcache *c) { return c->snap_misses; }

int32_t kiri_kvcache_seq_share_prefix(struct kiri_kvcache *c, struct kiri_kv_seq *seq, const int32_t *tokens,
                                      int32_t n_blocks, uint64_t *hash)
{
    *hash = 0;
    /* With recurrent state a prefix is resumed only from a snapshot of the state at its end,
     * into a state slot of the sequence's own. */
    const int stateful = c->n_state_slots != 0;
    if (seq->n_blocks != 0 || n_blocks <= 0)
        return 0;
    if (stateful && (!c->n_snap || seq->state || c->n_state_free == 0)) {
        c->snap_misses += c->n_snap != 0;
        return 0;
    }
    const int bs = c->block_size;
    struct pool *g = &c->pool[0], *w = &c->pool[1];
    /* The longest run of cached global blocks; with a window, the longest prefix of it whose
     * window is cached too (the last windowed miss lies before that window). */
    int32_t best = 0, last_miss = -1;
    uint64_t h = 0;
    for (int32_t i = 0; i < n_blocks; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)bs;
        h = kiri_kvcache_block_hash(h, t, bs);
        if (find_cached(g, bs, h, t) < 0)
            break;
        if (c->window && find_cached(w, bs, h, t) < 0)
            last_miss = i;
        if ((!c->window || last_miss < window_first_block(c, (int64_t)(i + 1) * bs)) &&
            (!stateful || c->snap_of[find_cached(g, bs, h, t)] >= 0))
            best = i + 1;
    }
    if (stateful)
        c->snap_misses += best == 0;
    if (best == 0)
        return 0;
    if (grow_table(c, seq, best) != KIRI_OK)
        return KIRI_E_NOMEM;
    if (stateful) {
        /* The state after the prefix: its last block's snapshot, into a slot of the sequence's. */
        uint64_t hh = 0;
        for (int32_t i = 0; i < best; i++)
            hh = kiri_kvcache_block_hash(hh, tokens + (size_t)i * (size_t)bs, bs);
        const int32_t k = c->snap_of[find_cached(g, bs, hh, tokens + (size_t)(best - 1) * (size_t)bs)];
        const int32_t row = c->state_free[c->n_state_free - 1];
        if (snap_copy(c, row, k, 0) != KIRI_OK)
            return 0; /* a device failed: the prompt is computed whole */
        c->n_state_free--;
        seq->state = row + 1;
        c->snap_stamp[k] = ++c->snap_clock;
        c->snap_shared[k] = 1;
        c->snap_hits++;
    }
    const int32_t lo = c->window ? window_first_block(c, (int64_t)best * bs) : 0;
    h = 0;
    for (int32_t i = 0; i < best; i++) {
        const int32_t *t = tokens + (size_t)i * (size_t)bs;
        h = kiri_kvcache_block_hash(h, t, bs);
        const int32_t id = find_cached(g, bs, h, t);
        share_block(g, id);
        seq->blocks[i] = id;
        if (c->window) {
            const int32_t wid = i >= lo ? find_cached(w, bs, h, t) : -1;
            if (wid >= 0)
                share_block(w, wid);
            seq->wblocks[i] = wid >= 0 ? wid : 0; /* a stale entry: never read */
        }
    }
    seq->n_blocks = best;
    seq->n_tokens = best * bs;
    seq->w_lo = lo;
    *hash = h;
    return best;
}

void kiri_kvcache_publish(struct kiri_kvcache *c, const struct kiri_kv_seq *seq, int32_t i, uint64_t hash,
                          const int32_t *tokens)
{
    if (i < 0 || i >= seq->n_blocks || (c->n_state_slots && !c->n_snap))
        return; /* nothing is shared from a cache with state but no snapshots */
    publish_block(&c->pool[0], c->block_size, seq->blocks[i], hash, tokens);
    if (c->window && seq->wblocks && i >= seq->w_lo)
        publish_block(&c->pool[1], c->block_size, seq->wblocks[i], hash, tokens);
}

int kiri_kvcache_seq_reserve(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t n_tokens)
{
    if (n_tokens < 0)
        return KIRI_E_INVALID_ARG;
    release_window(c, seq);
    const int32_t need = (int32_t)(((int64_t)n_tokens + c->block_size - 1) / c->block_size);
    const int new_state = c->n_state_slots && !seq->state;
    if (need <= seq->n_blocks && !new_state)
        return KIRI_OK;
    /* Every new block holds positions this step writes, so the windowed table needs them all. */
    const int32_t more = need > seq->n_blocks ? need - seq->n_blocks : 0;
    if (more > available(&c->pool[0]) || (c->window && more > available(&c->pool[1])) ||
        (new_state && c->n_state_free == 0))
        return KIRI_E_CONTEXT_FULL;
    if (more && grow_table(c, seq, need) != KIRI_OK)
        return KIRI_E_NOMEM;
    take(c, &c->pool[0], more, seq->blocks + seq->n_blocks);
    if (c->window)
        take(c, &c->pool[1], more, seq->wblocks + seq->n_blocks);
    if (more)
        seq->n_blocks = need;
    if (new_state)
        seq->state = c->state_free[--c->n_state_free] + 1;
    return KIRI_OK;
}

/* Gives state slot + 1 `slot1` back (0: none). */
static void state_release(struct kiri_kvcache *c, int32_t slot1)
{
    if (slot1 > 0 && slot1 <= c->n_state_slots && c->n_state_free < c->n_state_slots)
        c->state_free[c->n_state_free++] = slot1 - 1;
}

/* Drops seq's history entries from i on, giving their slots back. */
static void hist_cut(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t i)
{
    for (int32_t j = i; j < seq->n_hist; j++)
        state_release(c, seq->hist_slot[j] + 1);
    if (seq->n_hist > i)
        seq->n_hist = i;
}

/* Drops seq's oldest history entry. */
static void hist_drop_oldest(struct kiri_kvcache *c, struct kiri_kv_seq *seq)
{
    state_release(c, seq->hist_slot[0] + 1);
    memmove(seq->hist_slot, seq->hist_slot + 1, (size_t)(seq->n_hist - 1) * sizeof *seq->hist_slot);
    memmove(seq->hist_pos, seq->hist_pos + 1, (size_t)(seq->n_hist - 1) * sizeof *seq->hist_pos);
    seq->n_hist--;
}

/* Keeps slot `row` in seq's history as the state after position pos (none before position 0). */
static void hist_push(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t row, int32_t pos)
{
    if (pos < 0) {
        state_release(c, row + 1);
        return;
    }
    if (seq->n_hist == KIRI_KVCACHE_STATE_HISTORY)
        hist_drop_oldest(c, seq);
    seq->hist_slot[seq->n_hist] = row;
    seq->hist_pos[seq->n_hist++] = pos;
}

void kiri_kvcache_seq_state_forget(struct kiri_kvcache *c, struct kiri_kv_seq *seq) { hist_cut(c, seq, 0); }

int32_t kiri_kvcache_seq_state_step(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t n, int32_t n_fresh,
                                    int32_t *write, int32_t *read)
{
    const int32_t cur = seq->state - 1;
    if (n_fresh > n)
        n_fresh = n;
    if (n_fresh > KIRI_KVCACHE_STATE_HISTORY - 1)
        n_fresh = KIRI_KVCACHE_STATE_HISTORY - 1;
    if (cur < 0 || n_fresh < 0)
        n_fresh = 0;
    /* The step passes n_fresh states (the current one among them): make room in the history,
     * oldest first, and take the slots while they are free. */
    while (seq->n_hist > 0 && seq->n_hist + n_fresh > KIRI_KVCACHE_STATE_HISTORY)
        hist_drop_oldest(c, seq);
    while (seq->n_hist > 0 && c->n_state_free < n_fresh)
        hist_drop_oldest(c, seq);
    if (n_fresh > c->n_state_free)
        n_fresh = c->n_state_free;
    const int32_t first = n - n_fresh, at = seq->n_tokens;
    for (int32_t i = 0; i < n; i++) {
        read[i] = i > first ? write[i - 1] : cur;
        write[i] = i >= first ? c->state_free[--c->n_state_free] : cur;
    }
    if (n_fresh > 0) {
        hist_push(c, seq, cur, at + first - 1);
        for (int32_t i = first; i + 1 < n; i++)
            hist_push(c, seq, write[i], at + i);
        seq->state = write[n - 1] + 1;
    }
    return n_fresh;
}

int kiri_kvcache_seq_truncate(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t n_tokens)
{
    if (n_tokens < 0 || n_tokens > seq->n_tokens)
        return KIRI_E_INVALID_ARG;
    /* With state: the history entry of the new end's state (-1: the current one stays). */
    int32_t h = -1;
    if (c->n_state_slots && n_tokens != seq->n_tokens && n_tokens > 0) {
        for (int32_t i = 0; i < seq->n_hist && h < 0; i++)
            if (seq->hist_pos[i] == n_tokens - 1)
                h = i;
        if (h < 0)
            return KIRI_E_INVALID_ARG;
    }
    const int32_t bs = c->block_size;
    const int32_t need = (int32_t)(((int64_t)n_tokens + bs - 1) / bs);
    if (need > seq->n_blocks || (n_tokens % bs && c->pool[0].refs[seq->blocks[need - 1]] > 1))
        return KIRI_E_INVALID_ARG;
    if (h >= 0) {
        state_release(c, seq->state);
        seq->state = seq->hist_slot[h] + 1;
        seq->hist_slot[h] = -1; /* now current: not given back with the entries after it */
        for (int32_t j = h + 1; j < seq->n_hist; j++)
            state_release(c, seq->hist_slot[j] + 1);
        seq->n_hist = h;
    } else if (c->n_state_slots && n_tokens < seq->n_tokens) {
        hist_cut(c, seq, 0); /* back to position 0: the next token starts the state afresh */
    }
    for (int32_t i = need; i < seq->n_blocks; i++) {
        unref(&c->pool[0], seq->blocks[i]);
        if (seq->wblocks && i >= seq->w_lo)
            unref(&c->pool[1], seq->wblocks[i]);
    }
    seq->n_blocks = need;
    if (seq->w_lo > need)
        seq->w_lo = need;
    seq->n_tokens = n_tokens;
    return KIRI_OK;
}

void kiri_kvcache_seq_clear(struct kiri_kvcache *c, struct kiri_kv_seq *seq)
{
    /* Its cached blocks become the most recently used, the last first, so eviction takes a
     * prefix from its end and what stays is still a prefix. */
    for (int32_t i = seq->n_blocks - 1; i >= 0; i--)
        if (c->pool[0].cached[seq->blocks[i]])
            c->pool[0].stamp[seq->blocks[i]] = ++c->pool[0].clock;
    for (int32_t i = seq->n_blocks - 1; seq->wblocks && i >= seq->w_lo; i--)
        if (c->pool[1].cached[seq->wblocks[i]])
            c->pool[1].stamp[seq->wblocks[i]] = ++c->pool[1].clock;
    for (int32_t i = 0; i < seq->n_blocks; i++)
        unref(&c->pool[0], seq->blocks[i]);
    for (int32_t i = seq->w_lo; seq->wblocks && i < seq->n_blocks; i++)
        unref(&c->pool[1], seq->wblocks[i]);
    seq->n_blocks = 0;
    seq->n_tokens = 0;
    seq->w_lo = 0;
    state_release(c, seq->state);
    hist_cut(c, seq, 0);
    seq->state = 0;
    seq->snap = 0;
}

void kiri_kvcache_seq_free(struct kiri_kvcache *c, struct kiri_kv_seq *seq)
{
    kiri_kvcache_seq_clear(c, seq);
    kiri_mem_free(seq->blocks);
    kiri_mem_free(seq->wblocks);
    memset(seq, 0, sizeof *seq);
}

int32_t kiri_kvcache_slot(const struct kiri_kvcache *c, const struct kiri_kv_seq *seq, int32_t pos)
{
    return seq->blocks[pos / c->block_size] * c->block_size + pos % c->block_size;
}

int32_t kiri_kvcache_slot_window(const struct kiri_kvcache *c, const struct kiri_kv_seq *seq, int32_t pos)
{
    return seq->wblocks[pos / c->block_size] * c->block_size + pos % c->block_size;
}
