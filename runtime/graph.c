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
    T_SWA_SLOTS,  /* (n) I32 slots in a cache's windowed pool (models with sliding-window layers) */
    T_SWA_TABLES, /* (entries) I32 their block tables */
    T_COUNT
};

/* The scratch of one backend: a buffer laid out by plan() and the descriptors of one step. */
struct side {
    const struct kiri_backend_iface *iface;   /* borrowed */
    struct kiri_backend *be;                  /* borrowed */
    struct kiri_buffer *buffer;               /* owned */
    void *host;                               /* host address of buffer, or NULL */
    size_t offsets[T_COUNT];
    struct kiri_tensor t[T_COUNT];
};

struct kiri_graph {
    struct kiri_model *model;             /* borrowed */
    int32_t max_tokens, max_outputs, max_table_entries;
    /* main: the model's main backend, which runs everything without a split. off: the offload
     * backend's layers of a split model (no head tensors: xo, logits, token ids, output rows are
     * empty); unused, with no buffer, otherwise. */
    struct side main, off;
    struct kiri_node *nodes;              /* owned */
    int max_nodes;
    float *logits_host;                   /* owned copy when the main scratch is not host-visible */
    int32_t *meta_host;                   /* owned (2, max_tokens) staging for a scratch that is not
                                             host-visible, else NULL */
};

struct layout {
    size_t off[T_COUNT];
    size_t total;
};

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Lays out the scratch of n tokens; with_head adds the token ids and what produces the logits. */
static void plan(const struct kiri_hparams *hp, int32_t n, int32_t n_out, int32_t entries, int with_head,
                 int with_swa, struct layout *l)
{
    const size_t E = (size_t)hp->n_embd, Q = (size_t)hp->n_head * (size_t)hp->head_dim;
    const size_t KV = (size_t)hp->n_head_kv * (size_t)hp->head_dim, F = (size_t)hp->n_ff;
    size_t bytes[T_COUNT] = {0};
    bytes[T_X] = bytes[T_XN] = E * (size_t)n * 4;
    bytes[T_Q] = Q * (size_t)n * 4;
    bytes[T_K] = bytes[T_V] = KV * (size_t)n * 4;
    bytes[T_ATT] = Q * (size_t)n * 4;
    bytes[T_GATE] = bytes[T_UP] = F * (size_t)n * 4;
    if (with_head) {
        bytes[T_XO] = E * (size_t)n_out * 4;
        bytes[T_LOGITS] = (size_t)hp->n_vocab * (size_t)n_out * 4;
        bytes[T_TOKENS] = (size_t)n * 4;
        bytes[T_OUT_ROWS] = (size_t)n_out * 4;
    }
    bytes[T_POS] = bytes[T_SLOTS] = (size_t)n * 4;
    bytes[T_META] = (size_t)n * 8;
    bytes[T_TABLES] = (size_t)entries * 4;
    if (with_swa) {
        bytes[T_SWA_SLOTS] = (size_t)n * 4;
        bytes[T_SWA_TABLES] = (size_t)entries * 4;
    }
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
    struct layout l, lo;
    const int swa = kiri_model_n_swa_layers(m) > 0;
    plan(&m->hp, max_tokens, max_outputs, max_table_entries, 1, swa, &l);
    if (!m->n_offload)
        return l.total;
    plan(&m->hp, max_tokens, max_outputs, max_table_entries, 0, swa, &lo);
    return (uint64_t)l.total + lo.total;
}

static int side_init(struct side *s, const struct kiri_backend_iface *iface, struct kiri_backend *be,
                     const struct layout *l)
{
    s->iface = iface;
    s->be = be;
    memcpy(s->offsets, l->off, sizeof l->off);
    if (iface->buffer_alloc(be, l->total, &s->buffer, &s->host) != 0) {
        s->buffer = NULL;
        s->host = NULL;
        return KIRI_E_NOMEM;
    }
    return KIRI_OK;
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
    const int swa = kiri_model_n_swa_layers(m) > 0;
    plan(&m->hp, max_tokens, max_outputs, max_table_entries, 1, swa, &l);
    g->max_nodes = m->hp.n_layer * 32 + 16;
    g->nodes = kiri_mem_calloc((size_t)g->max_nodes, sizeof *g->nodes);
    int rc = g->nodes ? side_init(&g->main, m->iface, m->be, &l) : KIRI_E_NOMEM;
    if (rc == KIRI_OK && m->n_offload) {
        plan(&m->hp, max_tokens, max_outputs, max_table_entries, 0, swa, &l);
        rc = side_init(&g->off, m->off_iface, m->off_be, &l);
    }
    if (rc == KIRI_OK && !g->main.host &&
        !(g->logits_host = kiri_mem_array((size_t)m->hp.n_vocab * (size_t)max_outputs, sizeof(float))))
        rc = KIRI_E_NOMEM;
    if (rc == KIRI_OK && (!g->main.host || (m->n_offload && !g->off.host)) &&
        !(g->meta_host = kiri_mem_array((size_t)max_tokens * 2, sizeof(int32_t))))
        rc = KIRI_E_NOMEM;
    if (rc != KIRI_OK) {
        kiri_graph_free(g);
        return rc;
    }
    *out = g;
    return KIRI_OK;
}

void kiri_graph_free(struct kiri_graph *g)
{
    if (!g)
        return;
    if (g->main.buffer)
        g->main.iface->buffer_free(g->main.be, g->main.buffer);
    if (g->off.buffer)
        g->off.iface->buffer_free(g->off.be, g->off.buffer);
    kiri_mem_free(g->nodes);
    kiri_mem_free(g->logits_host);
    kiri_mem_free(g->meta_host);
    kiri_mem_free(g);
}

/* Shapes a scratch descriptor: contiguous rows of ne0 elements of type. */
static struct kiri_tensor *shape(struct side *s, int id, int type, int64_t ne0, int64_t ne1, int64_t ne2)
{
    struct kiri_tensor *t = &s->t[id];
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
    t->buffer = s->buffer;
    t->offset = s->offsets[id];
    t->data = s->host ? (char *)s->host + s->offsets[id] : NULL;
    return t;
}

static int upload(struct side *s, struct kiri_tensor *t, const void *src, size_t size)
{
    if (t->data) {
        memcpy(t->data, src, size);
        return 0;
    }
    return s->iface->tensor_set(s->be, t, src, 0, size);
}

/* Shapes the activations of a step of n tokens (and n_out logit rows on the side with the head). */
static void shape_step(const struct kiri_hparams *hp, struct side *s, int32_t n, int32_t n_out, int with_head)
{
    const int64_t E = hp->n_embd, D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv, F = hp->n_ff;
    const int f32 = KIRI_TYPE_F32;
    shape(s, T_X, f32, E, n, 1);
    shape(s, T_XN, f32, E, n, 1);
    shape(s, T_Q, f32, D * H, n, 1);
    shape(s, T_Q3, f32, D, H, n);
    shape(s, T_QH, f32, D, H * n, 1);
    shape(s, T_K, f32, D * Hkv, n, 1);
    shape(s, T_K3, f32, D, Hkv, n);
    shape(s, T_KH, f32, D, Hkv * n, 1);
    shape(s, T_V, f32, D * Hkv, n, 1);
    shape(s, T_ATT, f32, D * H, n, 1);
    shape(s, T_GATE, f32, F, n, 1);
    shape(s, T_UP, f32, F, n, 1);
    if (with_head) {
        shape(s, T_XO, f32, E, n_out, 1);
        shape(s, T_LOGITS, f32, hp->n_vocab, n_out, 1);
    }
}

/* Shapes and fills the per-token inputs every layer reads (and, with the head, the token ids and
 * output rows). */
static int upload_inputs(struct kiri_graph *g, struct side *s, const struct kiri_batch *b, int with_head)
{
    const int32_t n = b->n_tokens, n_out = b->n_outputs;
    struct kiri_tensor *pos = shape(s, T_POS, KIRI_TYPE_I32, n, 1, 1);
    struct kiri_tensor *slots = shape(s, T_SLOTS, KIRI_TYPE_I32, n, 1, 1);
    struct kiri_tensor *meta = shape(s, T_META, KIRI_TYPE_I32, 2, n, 1);
    struct kiri_tensor *tables = shape(s, T_TABLES, KIRI_TYPE_I32, b->n_table_entries, 1, 1);
    int rc = 0;
    if (with_head) {
        struct kiri_tensor *tokens = shape(s, T_TOKENS, KIRI_TYPE_I32, n, 1, 1);
        struct kiri_tensor *rows = shape(s, T_OUT_ROWS, KIRI_TYPE_I32, n_out, 1, 1);
        rc |= upload(s, tokens, b->tokens, (size_t)n * 4);
        rc |= upload(s, rows, b->out_rows, (size_t)n_out * 4);
    }
    rc |= upload(s, pos, b->pos, (size_t)n * 4);
    rc |= upload(s, slots, b->slots, (size_t)n * 4);
    rc |= upload(s, tables, b->tables, (size_t)b->n_table_entries * 4);
    if (b->swa_slots) {
        struct kiri_tensor *swa_slots = shape(s, T_SWA_SLOTS, KIRI_TYPE_I32, n, 1, 1);
        struct kiri_tensor *swa_tables = shape(s, T_SWA_TABLES, KIRI_TYPE_I32, b->n_table_entries, 1, 1);
        rc |= upload(s, swa_slots, b->swa_slots, (size_t)n * 4);
        rc |= upload(s, swa_tables, b->swa_tables, (size_t)b->n_table_entries * 4);
    }
    int32_t *mt = meta->data ? meta->data : g->meta_host;
    for (int32_t i = 0; i < n; i++) {
        mt[2 * i] = b->n_kv[i];
        mt[2 * i + 1] = b->table_off[i];
    }
    if (!meta->data)
        rc |= s->iface->tensor_set(s->be, meta, mt, 0, (size_t)n * 8);
    return rc;
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

/* Adds a block's output out (E, n) to the residual stream x, after its post-norm (gemma3) and
 * residual multiplier (granite) where the model has them. */
static void block_out(const struct kiri_hparams *hp, struct kiri_tensor *post_norm, struct kiri_tensor *x,
                      struct kiri_tensor *out, struct builder *b)
{
    struct kiri_node *nd;
    if (post_norm) {
        nd = add(b, KIRI_OP_RMS_NORM, out, out, post_norm);
        nd->p.eps = hp->rms_eps;
    }
    if (hp->residual_scale != 1.0f) {
        nd = add(b, KIRI_OP_SCALE, out, out, NULL);
        nd->p.scale = hp->residual_scale;
    }
    add(b, KIRI_OP_ADD, x, x, out);
}

/* Adds the nodes of layers [l0, l1) on side s. rope_freqs is the descriptor s's backend prepared.
 * A sliding-window layer attends its last hp.swa_window keys, in the cache's windowed pool when it
 * has one (its own slots and tables). */
static void build_layers(const struct kiri_model *m, struct side *s, struct kiri_kvcache *kv,
                         struct kiri_tensor *rope_freqs, int l0, int l1, struct builder *b)
{
    const struct kiri_hparams *hp = &m->hp;
    const int64_t D = hp->head_dim, H = hp->n_head, Hkv = hp->n_head_kv;
    struct kiri_tensor *x = &s->t[T_X], *xn = &s->t[T_XN], *q = &s->t[T_Q], *q3 = &s->t[T_Q3];
    struct kiri_tensor *qh = &s->t[T_QH], *k = &s->t[T_K], *k3 = &s->t[T_K3], *kh = &s->t[T_KH];
    struct kiri_tensor *v = &s->t[T_V], *att = &s->t[T_ATT], *gate = &s->t[T_GATE], *up = &s->t[T_UP];
    struct kiri_tensor *pos = &s->t[T_POS], *slots = &s->t[T_SLOTS], *meta = &s->t[T_META];
    struct kiri_tensor *tables = &s->t[T_TABLES];
    struct kiri_tensor *swa_slots = &s->t[T_SWA_SLOTS], *swa_tables = &s->t[T_SWA_TABLES];
    struct kiri_node *nd;

    for (int l = l0; l < l1; l++) {
        const struct kiri_layer *L = &m->layers[l];
        const struct kiri_rope_params rope = {hp->rope_mode, hp->n_rot, L->rope_freq_base, L->rope_freq_scale, 1.0f};
        const struct kiri_attn_params attn = {(int)H, (int)Hkv, (int)D, kiri_kvcache_block_size(kv), hp->attn_scale,
                                              L->swa ? hp->swa_window : 0};
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
        if (L->rope) {
            nd = add(b, KIRI_OP_ROPE, q3, q3, pos);
            nd->src[2] = rope_freqs;
            nd->p.rope = rope;
            nd = add(b, KIRI_OP_ROPE, k3, k3, pos);
            nd->src[2] = rope_freqs;
            nd->p.rope = rope;
        }
        const int windowed = kiri_kvcache_layer_windowed(kv, l);
        add(b, KIRI_OP_STORE_KV, kiri_kvcache_k(kv, l), k, windowed ? swa_slots : slots);
        add(b, KIRI_OP_STORE_KV, kiri_kvcache_v(kv, l), v, windowed ? swa_slots : slots);
        nd = add(b, KIRI_OP_ATTENTION, att, q3, kiri_kvcache_k(kv, l));
        nd->src[2] = kiri_kvcache_v(kv, l);
        nd->src[3] = meta;
        nd->src[4] = windowed ? swa_tables : tables;
        nd->p.attn = attn;
        add(b, KIRI_OP_MATMUL, xn, L->wo, att);
        block_out(hp, L->attn_post_norm, x, xn, b);
        nd = add(b, KIRI_OP_RMS_NORM, xn, x, L->ffn_norm);
        nd->p.eps = hp->rms_eps;
        add(b, KIRI_OP_MATMUL, gate, L->w_gate, xn);
        add(b, KIRI_OP_MATMUL, up, L->w_up, xn);
        add(b, hp->ffn_gelu ? KIRI_OP_GEGLU : KIRI_OP_SWIGLU, gate, gate, up);
        add(b, KIRI_OP_MATMUL, xn, L->w_down, gate);
        block_out(hp, L->ffn_post_norm, x, xn, b);
    }
}

/* Only the rows that need logits go through the output norm and the vocabulary product. */
static void build_head(const struct kiri_model *m, struct side *s, struct builder *b)
{
    struct kiri_tensor *xo = &s->t[T_XO];
    add(b, KIRI_OP_GET_ROWS, xo, &s->t[T_X], &s->t[T_OUT_ROWS]);
    struct kiri_node *nd = add(b, KIRI_OP_RMS_NORM, xo, xo, m->output_norm);
    nd->p.eps = m->hp.rms_eps;
    struct kiri_tensor *logits = &s->t[T_LOGITS];
    add(b, KIRI_OP_MATMUL, logits, m->output, xo);
    if (m->hp.logit_scale != 1.0f) {
        nd = add(b, KIRI_OP_SCALE, logits, logits, NULL);
        nd->p.scale = m->hp.logit_scale;
    }
    if (m->hp.final_softcap > 0.0f) {
        nd = add(b, KIRI_OP_SOFTCAP, logits, logits, NULL);
        nd->p.softcap = m->hp.final_softcap;
    }
}

/* ---------------------------------------------------------------------------------------------
 * Running
 * ------------------------------------------------------------------------------------------- */

static int run_nodes(const struct side *s, const struct kiri_node *nodes, int n)
{
    int rc = s->iface->compute(s->be, nodes, n);
    if (rc == 0 && s->iface->synchronize)
        rc = s->iface->synchronize(s->be);
    return rc;
}

/* Copies the residual stream (E, n) from one side's scratch to the other's. The main side of a
 * split is the CPU, so one of the two is host-visible. */
static int cross(struct side *from, struct side *to, size_t bytes)
{
    struct kiri_tensor *src = &from->t[T_X], *dst = &to->t[T_X];
    if (src->data)
        return upload(to, dst, src->data, bytes);
    if (dst->data)
        return from->iface->tensor_get(from->be, src, dst->data, 0, bytes);
    return -1;
}

/* One step. Unsplit, the main backend runs every node. Split: the embedding on the main side,
 * layers [0, n_offload) on the offload side, then the other layers and the head on the main side;
 * the residual stream crosses over and back. */
static int run_step(struct kiri_graph *g, struct kiri_kvcache *kv, const struct kiri_batch *b)
{
    struct kiri_model *m = g->model;
    const int n_off = m->n_offload, n_layer = m->hp.n_layer;
    int rc = upload_inputs(g, &g->main, b, 1);
    shape_step(&m->hp, &g->main, b->n_tokens, b->n_outputs, 1);
    if (n_off) {
        rc |= upload_inputs(g, &g->off, b, 0);
        shape_step(&m->hp, &g->off, b->n_tokens, b->n_outputs, 0);
    }
    struct builder bl = {g->nodes, 0, g->max_nodes};
    add(&bl, KIRI_OP_GET_ROWS, &g->main.t[T_X], m->tok_embd, &g->main.t[T_TOKENS]);
    if (m->hp.embd_scale != 1.0f) {
        struct kiri_node *nd = add(&bl, KIRI_OP_SCALE, &g->main.t[T_X], &g->main.t[T_X], NULL);
        nd->p.scale = m->hp.embd_scale;
    }
    const int n_embed = bl.n;
    if (n_off)
        build_layers(m, &g->off, kv, m->rope_freqs ? &m->rope_freqs_off : NULL, 0, n_off, &bl);
    const int n_first = bl.n;
    build_layers(m, &g->main, kv, m->rope_freqs, n_off, n_layer, &bl);
    build_head(m, &g->main, &bl);
    if (rc != 0 || !n_off)
        return rc != 0 ? rc : run_nodes(&g->main, g->nodes, bl.n);
    const size_t xbytes = (size_t)m->hp.n_embd * (size_t)b->n_tokens * sizeof(float);
    rc = run_nodes(&g->main, g->nodes, n_embed);
    if (rc == 0)
        rc = cross(&g->main, &g->off, xbytes);
    if (rc == 0)
        rc = run_nodes(&g->off, g->nodes + n_embed, n_first - n_embed);
    if (rc == 0)
        rc = cross(&g->off, &g->main, xbytes);
    if (rc == 0)
        rc = run_nodes(&g->main, g->nodes + n_first, bl.n - n_first);
    return rc;
}

int kiri_graph_run(struct kiri_graph *g, struct kiri_kvcache *kv, const struct kiri_batch *b,
                   const float **logits, struct kiri_status_info *info)
{
    struct kiri_model *m = g->model;
    const int32_t n = b->n_tokens, n_out = b->n_outputs;
    if (n < 1 || n > g->max_tokens || n_out < 1 || n_out > g->max_outputs ||
        b->n_table_entries < 1 || b->n_table_entries > g->max_table_entries)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "batch of %d tokens / %d outputs exceeds the graph", n, n_out);
    /* Slots must lie in the pool of the layers that write them: the global one (l0 is its first
     * layer) and the windowed one (lw), whose layers are sliding-window layers of this model. */
    int l0 = -1, lw = -1;
    for (int l = 0; l < m->hp.n_layer; l++) {
        if (!kiri_kvcache_layer_windowed(kv, l)) {
            l0 = l0 < 0 ? l : l0;
            continue;
        }
        if (!m->layers[l].swa || m->hp.swa_window <= 0)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "layer %d has no sliding window but its cache does", l);
        lw = lw < 0 ? l : lw;
    }
    if ((lw >= 0) != (b->swa_slots && b->swa_tables))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the batch's sliding-window slots do not match the cache");
    const int32_t slots_cap = l0 >= 0 ? (int32_t)kiri_kvcache_k(kv, l0)->ne[1] : INT32_MAX;
    const int32_t swa_cap = lw >= 0 ? (int32_t)kiri_kvcache_k(kv, lw)->ne[1] : 0;
    for (int32_t i = 0; i < n; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->hp.n_vocab)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "token id %d is outside the vocabulary", b->tokens[i]);
        if (b->slots[i] < 0 || b->slots[i] >= slots_cap || b->n_kv[i] < 1 ||
            b->table_off[i] < 0 || b->table_off[i] >= b->n_table_entries ||
            (lw >= 0 && (b->swa_slots[i] < 0 || b->swa_slots[i] >= swa_cap)))
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "batch token %d has an invalid cache slot", i);
    }
    for (int32_t i = 0; i < n_out; i++)
        if (b->out_rows[i] < 0 || b->out_rows[i] >= n)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "output row %d is outside the batch", b->out_rows[i]);
    /* Each layer's keys and values must sit on the backend that runs the layer, as
     * kiri_model_kvcache_init places them. */
    if (kiri_kvcache_n_first(kv) != m->n_offload ||
        (m->n_offload && kiri_kvcache_backend(kv, 0) != m->off_be) ||
        kiri_kvcache_backend(kv, m->hp.n_layer - 1) != m->be)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the KV cache was not made for this model's placement");

    kiri_platform_mutex_lock(m->compute_lock);
    int rc = run_step(g, kv, b);
    const struct kiri_tensor *lt = &g->main.t[T_LOGITS];
    const size_t lbytes = (size_t)m->hp.n_vocab * (size_t)n_out * sizeof(float);
    if (rc == 0 && !lt->data)
        rc = g->main.iface->tensor_get(g->main.be, lt, g->logits_host, 0, lbytes);
    kiri_platform_mutex_unlock(m->compute_lock);
    if (rc != 0)
        return kiri_error_set(info, KIRI_E_BACKEND, "backend %s failed to run a step",
                              m->n_offload ? m->off_iface->name : m->iface->name);
    *logits = lt->data ? lt->data : g->logits_host;
    return KIRI_OK;
}
