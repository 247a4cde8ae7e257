/* The CPU backend: implements the backend interface over the kernels of this folder. Weights are
 * used in place from the model's mapping. A step runs on all workers of the runtime's pool at
 * once: every worker walks the node list, takes its share of each node's rows, and meets the
 * others at a barrier before the next node. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_kernels.h"
#if defined(__aarch64__) && defined(KIRI_CPU_NEON_KERNELS)
#include "../neon/neon_kernels.h"
#endif

#define WORK_ALIGN 64

struct kiri_buffer {
    void *data;
    size_t size;
};

struct kiri_backend {
    struct kiri_threads threads;
    struct kiri_cpu_kernels k;
    char *work;          /* owned scratch shared by the workers of one step */
    size_t work_size;
    /* The step being run, for the workers. */
    const struct kiri_node *nodes;
    int n_nodes;
    int status;
};

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static size_t row_bytes(int type, int64_t n)
{
    const int64_t bs = kiri_type_block_size(type);
    return bs ? (size_t)(n / bs) * kiri_type_size(type) : 0;
}

static size_t align_up(size_t x) { return (x + WORK_ALIGN - 1) & ~(size_t)(WORK_ALIGN - 1); }

/* The rows [*r0, *r1) of n that worker ith of nth takes. */
static void split_rows(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1)
{
    const int64_t per = (n + nth - 1) / nth;
    *r0 = per * ith < n ? per * ith : n;
    *r1 = *r0 + per < n ? *r0 + per : n;
}

static int64_t n_rows(const struct kiri_tensor *t) { return t->ne[1] * t->ne[2] * t->ne[3]; }

/* Row r of a tensor whose dimensions 1..3 are flattened into rows. */
static char *row_ptr(const struct kiri_tensor *t, int64_t r)
{
    const int64_t i1 = r % t->ne[1];
    const int64_t i2 = (r / t->ne[1]) % t->ne[2];
    const int64_t i3 = r / (t->ne[1] * t->ne[2]);
    return (char *)t->data + (size_t)i1 * t->nb[1] + (size_t)i2 * t->nb[2] + (size_t)i3 * t->nb[3];
}

/* Scratch bytes a node needs: quantized activations for products, per-worker score and slot
 * buffers for attention. */
static size_t node_work_size(const struct kiri_backend *be, const struct kiri_node *nd, int nth)
{
    if (nd->op == KIRI_OP_MATMUL) {
        const int vt = kiri_cpu_vec_dot_type(nd->src[0]->type);
        if (vt < 0)
            return 0;
        return align_up(row_bytes(vt, nd->src[1]->ne[0]) * (size_t)n_rows(nd->src[1]));
    }
    if (nd->op == KIRI_OP_ATTENTION) {
        const size_t slots = (size_t)nd->src[1]->ne[1];
        return (size_t)nth * align_up(slots * (sizeof(float) + sizeof(int32_t)));
    }
    (void)be;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Node kernels: each runs the share of worker ith of nth; phase 0 runs before a barrier and
 * phase 1 after it (only products use two phases).
 * ------------------------------------------------------------------------------------------- */

static void run_get_rows(const struct kiri_node *nd, int ith, int nth)
{
    const struct kiri_tensor *w = nd->src[0], *ids = nd->src[1];
    const int64_t n = ids->ne[0];
    int64_t r0, r1;
    split_rows(n, ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int32_t id = ((const int32_t *)ids->data)[r];
        if (id < 0 || id >= w->ne[1])
            continue; /* ids are validated by the runtime; never read outside the table */
        kiri_cpu_dequantize_row(w->type, (const char *)w->data + (size_t)id * w->nb[1],
                                (float *)row_ptr(nd->dst, r), w->ne[0]);
    }
}

static void run_rms_norm(const struct kiri_node *nd, int ith, int nth)
{
    const struct kiri_tensor *x = nd->src[0], *w = nd->src[1];
    int64_t r0, r1;
    split_rows(n_rows(x), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        kiri_cpu_rms_norm_row((const float *)row_ptr(x, r), w ? (const float *)w->data : NULL,
                              (float *)row_ptr(nd->dst, r), x->ne[0], nd->p.eps);
}

static void run_binary(const struct kiri_node *nd, int ith, int nth)
{
    const struct kiri_tensor *a = nd->src[0], *b = nd->src[1];
    const int64_t n = a->ne[0];
    int64_t r0, r1;
    split_rows(n_rows(a), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)row_ptr(a, r);
        const float *y = (const float *)row_ptr(b, n_rows(b) == 1 ? 0 : r);
        float *z = (float *)row_ptr(nd->dst, r);
        if (nd->op == KIRI_OP_ADD)
            for (int64_t i = 0; i < n; i++)
                z[i] = x[i] + y[i];
        else
            for (int64_t i = 0; i < n; i++)
                z[i] = x[i] * y[i];
    }
}

static void run_swiglu(const struct kiri_node *nd, int ith, int nth)
{
    int64_t r0, r1;
    split_rows(n_rows(nd->src[0]), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        kiri_cpu_swiglu_row((const float *)row_ptr(nd->src[0], r),
                            (const float *)row_ptr(nd->src[1], r), (float *)row_ptr(nd->dst, r),
                            nd->src[0]->ne[0]);
}

static void run_rope(const struct kiri_node *nd, int ith, int nth)
{
    const struct kiri_tensor *x = nd->src[0];
    const int32_t *pos = nd->src[1]->data;
    const float *ff = nd->src[2] ? nd->src[2]->data : NULL;
    int64_t t0, t1;
    split_rows(x->ne[2], ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        float *row = (float *)((char *)x->data + (size_t)t * x->nb[2]);
        kiri_cpu_rope_token(row, (int)x->ne[1], (int)x->ne[0], pos[t], &nd->p.rope, ff);
    }
}

static void run_store_kv(struct kiri_backend *be, const struct kiri_node *nd, int ith, int nth)
{
    const struct kiri_tensor *src = nd->src[0], *slots = nd->src[1], *cache = nd->dst;
    int64_t r0, r1;
    split_rows(src->ne[1], ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const int32_t slot = ((const int32_t *)slots->data)[r];
        if (slot < 0 || slot >= cache->ne[1])
            continue;
        const float *x = (const float *)row_ptr(src, r);
        char *dst = (char *)cache->data + (size_t)slot * cache->nb[1];
        if (cache->type == KIRI_TYPE_F32)
            memcpy(dst, x, (size_t)src->ne[0] * sizeof(float));
        else
            be->k.from_float[cache->type](x, dst, src->ne[0]);
    }
}

static void run_attention(struct kiri_backend *be, const struct kiri_node *nd, int ith, int nth)
{
    const struct kiri_tensor *q = nd->src[0], *kc = nd->src[1], *vc = nd->src[2];
    const int32_t *meta = nd->src[3]->data;
    const int32_t *tables = nd->src[4]->data;
    const struct kiri_attn_params *p = &nd->p.attn;
    const int64_t n_tok = q->ne[2];
    const int group = p->n_head / p->n_head_kv;
    const size_t slots_cap = (size_t)kc->ne[1];
    char *mine = be->work + (size_t)ith * align_up(slots_cap * (sizeof(float) + sizeof(int32_t)));
    float *scores = (float *)mine;
    int32_t *slots = (int32_t *)(mine + slots_cap * sizeof(float));
    const size_t kv_row = row_bytes(kc->type, (int64_t)p->head_dim);

    /* Split (token, head) pairs; the slot list is rebuilt when the token changes. */
    int64_t j0, j1;
    split_rows(n_tok * p->n_head, ith, nth, &j0, &j1);
    int64_t built_for = -1;
    int n_kv = 0;
    for (int64_t j = j0; j < j1; j++) {
        const int64_t t = j / p->n_head;
        const int h = (int)(j % p->n_head);
        if (t != built_for) {
            n_kv = meta[2 * t];
            if (n_kv < 0 || (size_t)n_kv > slots_cap)
                n_kv = 0;
            const int32_t *table = tables + meta[2 * t + 1];
            for (int i = 0; i < n_kv; i++)
                slots[i] = table[i / p->block_size] * p->block_size + i % p->block_size;
            built_for = t;
        }
        const int hk = h / group;
        const float *qh = (const float *)((const char *)q->data + (size_t)t * q->nb[2] +
                                          (size_t)h * q->nb[1]);
        float *out = (float *)((char *)nd->dst->data + (size_t)t * nd->dst->nb[1]) +
                     (size_t)h * (size_t)p->head_dim;
        kiri_cpu_attend_head(qh, (const char *)kc->data + (size_t)hk * kv_row, kc->nb[1],
                             (const char *)vc->data + (size_t)hk * kv_row, vc->nb[1], kc->type,
                             slots, n_kv, p->head_dim, p->scale, scores, out);
    }
}

/* Products: phase 0 converts the activation rows to the weight's dot-product type, phase 1
 * computes output rows, each worker a slice of the weight's rows across all tokens so a weight
 * row is read once per step however many tokens the step has. */
static void run_matmul(struct kiri_backend *be, const struct kiri_node *nd, int ith, int nth, int phase)
{
    const struct kiri_tensor *w = nd->src[0], *x = nd->src[1];
    const int vt = kiri_cpu_vec_dot_type(w->type);
    const int64_t k = x->ne[0], n = n_rows(x);
    const size_t act_row = row_bytes(vt, k);
    if (phase == 0) {
        int64_t r0, r1;
        split_rows(n, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const float *src = (const float *)row_ptr(x, r);
            if (vt == KIRI_TYPE_F32)
                memcpy(be->work + (size_t)r * act_row, src, (size_t)k * sizeof(float));
            else
                be->k.from_float[vt](src, be->work + (size_t)r * act_row, k);
        }
        return;
    }
    const kiri_vec_dot_fn dot = be->k.vec_dot[w->type];
    const int64_t n_out = w->ne[1];
    int64_t o0, o1;
    split_rows(n_out, ith, nth, &o0, &o1);
    const int64_t tile = 16;
    for (int64_t ob = o0; ob < o1; ob += tile) {
        const int64_t oe = ob + tile < o1 ? ob + tile : o1;
        for (int64_t t = 0; t < n; t++) {
            const char *a = be->work + (size_t)t * act_row;
            float *y = (float *)row_ptr(nd->dst, t);
            for (int64_t o = ob; o < oe; o++)
                dot(k, &y[o], (const char *)w->data + (size_t)o * w->nb[1], a);
        }
    }
}

static void worker(void *arg, int ith, int nth)
{
    struct kiri_backend *be = arg;
    for (int i = 0; i < be->n_nodes; i++) {
        const struct kiri_node *nd = &be->nodes[i];
        switch (nd->op) {
        case KIRI_OP_GET_ROWS: run_get_rows(nd, ith, nth); break;
        case KIRI_OP_RMS_NORM: run_rms_norm(nd, ith, nth); break;
        case KIRI_OP_ADD:
        case KIRI_OP_MUL: run_binary(nd, ith, nth); break;
        case KIRI_OP_SWIGLU: run_swiglu(nd, ith, nth); break;
        case KIRI_OP_ROPE: run_rope(nd, ith, nth); break;
        case KIRI_OP_STORE_KV: run_store_kv(be, nd, ith, nth); break;
        case KIRI_OP_ATTENTION: run_attention(be, nd, ith, nth); break;
        case KIRI_OP_MATMUL:
            run_matmul(be, nd, ith, nth, 0);
            be->threads.barrier(be->threads.pool);
            run_matmul(be, nd, ith, nth, 1);
            break;
        default: break;
        }
        be->threads.barrier(be->threads.pool);
    }
}

/* ---------------------------------------------------------------------------------------------
 * Interface
 * ------------------------------------------------------------------------------------------- */

static int cpu_probe(const struct kiri_backend_config *cfg, char *msg, size_t cap)
{
    (void)cfg;
    if (cap)
        msg[0] = '\0';
    return 1; /* always usable, always the last resort */
}

static int cpu_init(const struct kiri_backend_config *cfg, struct kiri_backend **out, char *msg, size_t cap)
{
    struct kiri_backend *be = calloc(1, sizeof *be);
    if (!be)
        return -1;
    be->threads = cfg->threads;
    kiri_cpu_kernels_init_ref(&be->k);
#if defined(__x86_64__) && defined(KIRI_CPU_AVX2_KERNELS)
    if (cfg->cpu_features & KIRI_CPU_AVX2)
        kiri_cpu_kernels_init_avx2(&be->k);
#endif
#if defined(__aarch64__) && defined(KIRI_CPU_NEON_KERNELS)
    if (cfg->cpu_features & KIRI_CPU_NEON)
        kiri_cpu_kernels_init_neon(&be->k, cfg->cpu_features);
#endif
    *out = be;
    (void)msg;
    (void)cap;
    return 0;
}

static void cpu_free(struct kiri_backend *be)
{
    if (!be)
        return;
    free(be->work);
    free(be);
}

static void cpu_describe(struct kiri_backend *be, char *buf, size_t cap)
{
    if (cap)
        strncpy(buf, be->k.path, cap - 1), buf[cap - 1] = '\0';
}

static int cpu_buffer_alloc(struct kiri_backend *be, size_t size, struct kiri_buffer **out, void **host)
{
    (void)be;
    struct kiri_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return -1;
    b->data = aligned_alloc(WORK_ALIGN, align_up(size ? size : 1));
    if (!b->data) {
        free(b);
        return -1;
    }
    memset(b->data, 0, align_up(size ? size : 1));
    b->size = size;
    *out = b;
    *host = b->data;
    return 0;
}

static void cpu_buffer_free(struct kiri_backend *be, struct kiri_buffer *b)
{
    (void)be;
    if (!b)
        return;
    free(b->data);
    free(b);
}

static int cpu_supports(struct kiri_backend *be, const struct kiri_node *nd)
{
    if (nd->op == KIRI_OP_MATMUL)
        return kiri_cpu_vec_dot_type(nd->src[0]->type) >= 0 && be->k.vec_dot[nd->src[0]->type];
    if (nd->op == KIRI_OP_GET_ROWS)
        return kiri_cpu_vec_dot_type(nd->src[0]->type) >= 0;
    if (nd->op == KIRI_OP_STORE_KV || nd->op == KIRI_OP_ATTENTION) {
        const int t = nd->op == KIRI_OP_STORE_KV ? nd->dst->type : nd->src[1]->type;
        return t == KIRI_TYPE_F32 || t == KIRI_TYPE_F16 || t == KIRI_TYPE_Q8_0;
    }
    return nd->op >= 0 && nd->op < KIRI_OP_COUNT;
}

static int cpu_compute(struct kiri_backend *be, const struct kiri_node *nodes, int n_nodes)
{
    const int nth = be->threads.n > 0 ? be->threads.n : 1;
    size_t need = 0;
    for (int i = 0; i < n_nodes; i++) {
        const size_t s = node_work_size(be, &nodes[i], nth);
        if (s > need)
            need = s;
    }
    if (need > be->work_size) {
        char *w = aligned_alloc(WORK_ALIGN, align_up(need));
        if (!w)
            return -1;
        free(be->work);
        be->work = w;
        be->work_size = align_up(need);
    }
    be->nodes = nodes;
    be->n_nodes = n_nodes;
    be->threads.run(be->threads.pool, worker, be);
    return 0;
}

const struct kiri_backend_iface kiri_cpu_backend_iface = {
    .version = KIRI_BACKEND_VERSION,
    .name = "cpu",
    .probe = cpu_probe,
    .init = cpu_init,
    .free = cpu_free,
    .describe = cpu_describe,
    .buffer_alloc = cpu_buffer_alloc,
    .buffer_free = cpu_buffer_free,
    .supports = cpu_supports,
    .compute = cpu_compute,
};
