#include "graph.h"

#include <math.h>
#include <string.h>

#include "backend.h"
#include "error.h"
#include "kiri.h"
#include "kvcache.h"
#include "mem.h"
#include "model.h"
#include "platform.h"

/* Activation tensors of one step. Each buffer holds max_tokens rows; the descriptors are re-shaped
 * to the step's token count before every run. */
enum {
    T_X,        /* (E, n) residual stream */
    T_XN,       /* (E, n) normalised input of a block */
    T_Q,        /* (D*H, n) queries as the product writes them */
    T_Q3,       /* (D, H, n) the same memory per head */
    T_QH,       /* (D, H*n) the same memory as rows of one head, for per-head norms */
    T_K, T_K3, T_KH,
    T_V,        /* (D*Hkv, n) */
    T_ATT,      /* (D*H, n) attention output */
    T_GATE,     /* (F, n) */
    T_UP,       /* (F, n) */
    T_XO,       /* (E, n_out) rows that produce logits */
    T_LOGITS,   /* (V, n_out) */
    T_TOKENS,   /* (n) I32 */
    T_POS,      /* (n) I32 */
    T_SLOTS,    /* (n) I32 */
    T_META,     /* (2, n) I32 keys to attend and table offset per token */
    T_TABLES,   /* (entries) I32 */
    T_OUT_ROWS, /* (n_out) I32 */
    T_COUNT
};

struct kiri_graph {
    struct kiri_model *model;             /* borrowed */
    int32_t max_tokens, max_outputs, max_table_entries;
    struct kiri_buffer *buffer;           /* owned, on the model's backend */
    void *host;                           /* host address of buffer, or NULL */
    size_t offsets[T_COUNT];
    struct kiri_tensor t[T_COUNT];
    struct kiri_node *nodes;              /* owned */
    int max_nodes;
    float *logits_host;                   /* owned copy when the backend is not host-visible */
};

struct layout {
    size_t off[T_COUNT];
    size_t total;
};

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

static void plan(const struct kiri_hparams *hp, int32_t n, int32_t n_out, int32_t entries, struct layout *l)
{
    const size_t E = (size_t)hp->n_embd, Q = (size_t)hp->n_head * (size_t)hp->head_dim;
    const size_t KV = (size_t)hp->n_head_kv * (size_t)hp->head_dim, F = (size_t)hp->n_ff;
    size_t bytes[T_COUNT] = {0};
    bytes[T_X] = bytes[T_XN] = E * (size_t)n * 4;
    bytes[T_Q] = Q * (size_t)n * 4;
    bytes[T_K] = bytes[T_V] = KV * (size_t)n * 4;
    bytes[T_ATT] = Q * (size_t)n * 4;
    bytes[T_GATE] = bytes[T_UP] = F * (size_t)n * 4;
    bytes[T_XO] = E * (size_t)n_out * 4;
    bytes[T_LOGITS] = (size_t)hp->n_vocab * (size_t)n_out * 4;
    bytes[T_TOKENS] = bytes[T_POS] = bytes[T_SLOTS] = (size_t)n * 4;
    bytes[T_META] = (size_t)n * 8;
    bytes[T_TABLES] = (size_t)entries * 4;
    bytes[T_OUT_ROWS] = (size_t)n_out * 4;
    size_t off = 0;
    for (int i = 0; i < T_COUNT; i++) {
        l->off[i] = off;
        off += align64(bytes[i]);
    }
    /* Views share the memory of their base tensor. */
    l->off[T_Q3] = l->off[T_QH] = l->off[T_Q];
    l->off[T_K3] = l->off[T_KH] = l->off[T_K];
    l->total = off;
}

uint64_t kiri_graph_scratch_bytes(const struct kiri_model *m, int32_t max_tokens, int32_t max_outputs,
                                  int32_t max_table_entries)
{
    struct layout l;
    plan(&m->hp, max_tokens, max_outputs, max_table_entries, &l);
    return l.total;
}

int kiri_graph_init(struct kiri_model *m, int32_t max_tokens, int32_t max_outputs, int32_t max_table_entries,
                    struct kiri_graph **out)
{
    if (max_tokens < 1 || max_outputs < 1 || max_outputs > max_tokens || max_table_entries < 1)
        return KIRI_E_INVALID_ARG;
    struct kiri_graph *g = kiri_mem_calloc(1, sizeof *g);
    if (!g)
        return KIRI_E_NOMEM;
    g->model = m;
    g->max_tokens = max_tokens;
    g->max_outputs = max_outputs;
    g->max_table_entries = max_table_entries;
    struct layout l;
    plan(&m->hp, max_tokens, max_outputs, max_table_entries, &l);
    memcpy(g->offsets, l.off, sizeof l.off);
    g->max_nodes = m->hp.n_layer * 24 + 8;
    g->nodes = kiri_mem_calloc((size_t)g->max_nodes, sizeof *g->nodes);
    if (!g->nodes || m->iface->buffer_alloc(m->be, l.total, &g->buffer, &g->host) != 0) {
        g->buffer = NULL;
        kiri_graph_free(g);
        return KIRI_E_NOMEM;
    }
    if (!g->host) {
        g->logits_host = kiri_mem_array((size_t)m->hp.n_vocab * (size_t)max_outputs, sizeof(float));
        if (!g->logits_host) {
            kiri_graph_free(g);
            return KIRI_E_NOMEM;
        }
    }
    *out = g;
    return KIRI_OK;
}

void kiri_graph_free(struct kiri_graph *g)
{
    if (!g)
        return;
    if (g->buffer)
        g->model->iface->buffer_free(g->model->be, g->buffer);
    kiri_mem_free(g->nodes);
    kiri_mem_free(g->logits_host);
    kiri_mem_free(g);
}

/* Shapes a scratch descriptor: contiguous rows of ne0 elements of type. */
static struct kiri_tensor *shape(struct kiri_graph *g, int id, int type, int64_t ne0, int64_t ne1, int64_t ne2)
{
    struct kiri_tensor *t = &g->t[id];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->ne[2] = ne2;
    t->ne[3] = 1;
    t->nb[0] = kiri_type_size(type);
    t->nb[1] = t->nb[0] * (size_t)ne0;
    t->nb[2] = t->nb[1] * (size_t)ne1;
    t->nb[3] = t->nb[2] * (size_t)ne2;
    t->buffer = g->buffer;
    t->offset = g->offsets[id];
    t->data = g->host ? (char *)g->host + g->offsets[id] : NULL;
    return t;
}

static int upload(struct kiri_graph *g, struct kiri_tensor *t, const void *src, size_t size)
{
    if (t->data) {
        memcpy(t->data, src, size);
        return 0;
    }
    return g->model->iface->tensor_set(g->model->be, t, src, 0, size);
}

/* ---------------------------------------------------------------------------------------------
 * Building the node list
 * ------------------------------------------------------------------------------------------- */

struct builder {
    struct kiri_node *nodes;
    int n, cap;
};

static struct kiri_node *add(struct builder *b, int op, struct kiri_tensor *dst, struct kiri_tensor *s0,
                             struct kiri_tensor *s1)
{
    struct kiri_node *nd = &b->nodes[b->n++]; /* cap is sized for the largest layer count */
    memset(nd, 0, sizeof *nd);
    nd->op = op;
    nd->dst = dst;
    nd->src[0] = s0;
    nd->src[1] = s1;
    return nd;
}

static void build(struct kiri_graph *g, struct kiri_kvcache *kv, int32_t n, int32_t n_out, struct builder *b)
{
    const struct kiri_model *m = g->model;
    const struct kiri_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv, F = hp->n_ff;
    const int f32 = KIRI_TYPE_F32;
    struct kiri_tensor *x = shape(g, T_X, f32, E, n, 1);
    struct kiri_tensor *xn = shape(g, T_XN, f32, E, n, 1);
    struct kiri_tensor *q = shape(g, T_Q, f32, D * H, n, 1);
    struct kiri_tensor *q3 = shape(g, T_Q3, f32, D, H, n);
    struct kiri_tensor *qh = shape(g, T_QH, f32, D, H * n, 1);
    struct kiri_tensor *k = shape(g, T_K, f32, D * Hkv, n, 1);
    struct kiri_tensor *k3 = shape(g, T_K3, f32, D, Hkv, n);
    struct kiri_tensor *kh = shape(g, T_KH, f32, D, Hkv * n, 1);
    struct kiri_tensor *v = shape(g, T_V, f32, D * Hkv, n, 1);
    struct kiri_tensor *att = shape(g, T_ATT, f32, D * H, n, 1);
    struct kiri_tensor *gate = shape(g, T_GATE, f32, F, n, 1);
    struct kiri_tensor *up = shape(g, T_UP, f32, F, n, 1);
    struct kiri_tensor *xo = shape(g, T_XO, f32, E, n_out, 1);
    struct kiri_tensor *logits = shape(g, T_LOGITS, f32, hp->n_vocab, n_out, 1);
    struct kiri_tensor *tokens = &g->t[T_TOKENS], *pos = &g->t[T_POS], *slots = &g->t[T_SLOTS];
    struct kiri_tensor *meta = &g->t[T_META], *tables = &g->t[T_TABLES], *rows = &g->t[T_OUT_ROWS];

    const struct kiri_rope_params rope = {hp->rope_mode, hp->n_rot, hp->rope_freq_base, hp->rope_freq_scale};
    const struct kiri_attn_params attn = {(int)H, (int)Hkv, (int)D, kiri_kvcache_block_size(kv),
                                          1.0f / sqrtf((float)D)};
    struct kiri_node *nd;

    add(b, KIRI_OP_GET_ROWS, x, m->tok_embd, tokens);
    for (int l = 0; l < hp->n_layer; l++) {
        const struct kiri_layer *L = &m->layers[l];
        nd = add(b, KIRI_OP_RMS_NORM, xn, x, L->attn_norm);
        nd->p.eps = hp->rms_eps;
        add(b, KIRI_OP_MATMUL, q, L->wq, xn);
        add(b, KIRI_OP_MATMUL, k, L->wk, xn);
        add(b, KIRI_OP_MATMUL, v, L->wv, xn);
        if (L->bq)
            add(b, KIRI_OP_ADD, q, q, L->bq);
        if (L->bk)
            add(b, KIRI_OP_ADD, k, k, L->bk);
        if (L->bv)
            add(b, KIRI_OP_ADD, v, v, L->bv);
        if (L->q_norm) {
            nd = add(b, KIRI_OP_RMS_NORM, qh, qh, L->q_norm);
            nd->p.eps = hp->rms_eps;
        }
        if (L->k_norm) {
            nd = add(b, KIRI_OP_RMS_NORM, kh, kh, L->k_norm);
            nd->p.eps = hp->rms_eps;
        }
        nd = add(b, KIRI_OP_ROPE, q3, q3, pos);
        nd->src[2] = m->rope_freqs;
        nd->p.rope = rope;
        nd = add(b, KIRI_OP_ROPE, k3, k3, pos);
        nd->src[2] = m->rope_freqs;
        nd->p.rope = rope;
        add(b, KIRI_OP_STORE_KV, kiri_kvcache_k(kv, l), k, slots);
        add(b, KIRI_OP_STORE_KV, kiri_kvcache_v(kv, l), v, slots);
        nd = add(b, KIRI_OP_ATTENTION, att, q3, kiri_kvcache_k(kv, l));
        nd->src[2] = kiri_kvcache_v(kv, l);
        nd->src[3] = meta;
        nd->src[4] = tables;
        nd->p.attn = attn;
        add(b, KIRI_OP_MATMUL, xn, L->wo, att);
        add(b, KIRI_OP_ADD, x, x, xn);
        nd = add(b, KIRI_OP_RMS_NORM, xn, x, L->ffn_norm);
        nd->p.eps = hp->rms_eps;
        add(b, KIRI_OP_MATMUL, gate, L->w_gate, xn);
        add(b, KIRI_OP_MATMUL, up, L->w_up, xn);
        add(b, KIRI_OP_SWIGLU, gate, gate, up);
        add(b, KIRI_OP_MATMUL, xn, L->w_down, gate);
        add(b, KIRI_OP_ADD, x, x, xn);
    }
    /* Only the rows that need logits go through the output norm and the vocabulary product. */
    add(b, KIRI_OP_GET_ROWS, xo, x, rows);
    nd = add(b, KIRI_OP_RMS_NORM, xo, xo, m->output_norm);
    nd->p.eps = hp->rms_eps;
    add(b, KIRI_OP_MATMUL, logits, m->output, xo);
}

/* ---------------------------------------------------------------------------------------------
 * Running
 * ------------------------------------------------------------------------------------------- */

int kiri_graph_run(struct kiri_graph *g, struct kiri_kvcache *kv, const struct kiri_batch *b,
                   const float **logits, struct kiri_status_info *info)
{
    struct kiri_model *m = g->model;
    const int32_t n = b->n_tokens, n_out = b->n_outputs;
    if (n < 1 || n > g->max_tokens || n_out < 1 || n_out > g->max_outputs ||
        b->n_table_entries < 1 || b->n_table_entries > g->max_table_entries)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "batch of %d tokens / %d outputs exceeds the graph", n, n_out);
    const int32_t slots_cap = (int32_t)kiri_kvcache_k(kv, 0)->ne[1];
    for (int32_t i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->hp.n_vocab)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "token id %d is outside the vocabulary", b->tokens[i]);
        if (b->slots[i] < 0 || b->slots[i] >= slots_cap || b->n_kv[i] < 1 ||
            b->table_off[i] < 0 || b->table_off[i] >= b->n_table_entries)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "batch token %d has an invalid cache slot", i);
    }
    for (int32_t i = 0; i < n_out; i++)
        if (b->out_rows[i] < 0 || b->out_rows[i] >= n)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "output row %d is outside the batch", b->out_rows[i]);

    struct kiri_tensor *tokens = shape(g, T_TOKENS, KIRI_TYPE_I32, n, 1, 1);
    struct kiri_tensor *pos = shape(g, T_POS, KIRI_TYPE_I32, n, 1, 1);
    struct kiri_tensor *slots = shape(g, T_SLOTS, KIRI_TYPE_I32, n, 1, 1);
    struct kiri_tensor *meta = shape(g, T_META, KIRI_TYPE_I32, 2, n, 1);
    struct kiri_tensor *tables = shape(g, T_TABLES, KIRI_TYPE_I32, b->n_table_entries, 1, 1);
    struct kiri_tensor *rows = shape(g, T_OUT_ROWS, KIRI_TYPE_I32, n_out, 1, 1);

    kiri_platform_mutex_lock(m->compute_lock);
    int rc = 0;
    rc |= upload(g, tokens, b->tokens, (size_t)n * 4);
    rc |= upload(g, pos, b->pos, (size_t)n * 4);
    rc |= upload(g, slots, b->slots, (size_t)n * 4);
    rc |= upload(g, tables, b->tables, (size_t)b->n_table_entries * 4);
    rc |= upload(g, rows, b->out_rows, (size_t)n_out * 4);
    if (meta->data) {
        int32_t *mt = meta->data;
        for (int32_t i = 0; i < n; i++) {
            mt[2 * i] = b->n_kv[i];
            mt[2 * i + 1] = b->table_off[i];
        }
    } else {
        int32_t tmp[2];
        for (int32_t i = 0; i < n && rc == 0; i++) {
            tmp[0] = b->n_kv[i];
            tmp[1] = b->table_off[i];
            rc |= m->iface->tensor_set(m->be, meta, tmp, (size_t)i * 8, 8);
        }
    }
    struct builder bl = {g->nodes, 0, g->max_nodes};
    build(g, kv, n, n_out, &bl);
    if (rc == 0)
        rc = m->iface->compute(m->be, g->nodes, bl.n);
    if (rc == 0 && m->iface->synchronize)
        rc = m->iface->synchronize(m->be);
    const struct kiri_tensor *lt = &g->t[T_LOGITS];
    const size_t lbytes = (size_t)m->hp.n_vocab * (size_t)n_out * sizeof(float);
    if (rc == 0 && !lt->data)
        rc = m->iface->tensor_get(m->be, lt, g->logits_host, 0, lbytes);
    kiri_platform_mutex_unlock(m->compute_lock);
    if (rc != 0)
        return kiri_error_set(info, KIRI_E_BACKEND, "backend %s failed to run a step", m->iface->name);
    *logits = lt->data ? lt->data : g->logits_host;
    return KIRI_OK;
}
