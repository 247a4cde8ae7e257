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
    /* gemma4's per-layer embeddings (P = n_embd_per_layer, L = n_layer; empty without): */
    T_PL_TOK,   /* (P*L, n) the tokens' per-layer rows */
    T_PL_PROJ,  /* (P*L, n) the embedding's projection, then the per-layer inputs, token-major */
    T_PL_PROJ_ROWS, /* (P, L*n) the same memory as rows of one layer's input */
    T_PL_IN,    /* (P, L*n) the inputs layer-major: layer l's (P, n) at row l*n */
    T_PL_ROWS,  /* (L*n) I32 the rows of T_PL_PROJ_ROWS that make T_PL_IN */
    T_PL_GATE,  /* (P, n) */
    /* lfm2's short-convolution blocks (empty without): */
    T_BCX,      /* (3E, n) the input projection: B, C and x of each token */
    T_BCX_B, T_BCX_C, T_BCX_X, /* (E, n) views of its three parts (rows of 3E) */
    T_CONV_OUT, /* (E, n) the block's output, over T_BCX's memory */
    T_STATE_ROWS, /* (n, 2) I32 each token's recurrent-state slot written, then the one read */
    /* qwen35 (empty without; S head size, Hk/Hv key/value heads, C = 2 Hk S + Hv S): */
    T_QG,       /* (2 D H, n) the gated attention's query projection: per head D queries, D gates */
    T_QG_Q, T_QG_GATE, /* (D, H n) views of its queries and gates (rows 2 D apart) */
    T_ATT_H,    /* (D, H n) the attention output per head (T_ATT's memory) */
    T_QKV,      /* (C, n) a Gated DeltaNet layer's q, k, v; convolved in place */
    T_QKV_Q, T_QKV_K, /* (S, Hk, n) views of its queries and keys */
    T_Z,        /* (Hv S, n) the output gate */
    T_BETA, T_ALPHA, /* (Hv, n) the gates' projections */
    T_GATES,    /* (2 Hv, n) beta, then the decay's logarithm */
    T_DN_OUT,   /* (Hv S, n) the delta rule's output */
    T_DN_OUT_H, /* (S, Hv n) the same per head */
    /* qwen35's multi-token-prediction head (empty without): */
    T_HN,       /* (E, n) every token's output-normed hidden state, for kiri_batch.hidden */
    T_EH,       /* (2E, n) the MTP block's input: the normed embedding, then the normed hidden state */
    T_EH_E, T_EH_H, /* (E, n) views of its two halves (rows of 2E) */
    T_COUNT
};

/* The activations whose shapes are a layer's own (gemma4's per-layer heads and widths): one
 * descriptor of each per layer, over the memory of the T_ tensor of the same name. */
enum {
    LT_Q, LT_Q3, LT_QH, LT_K, LT_K3, LT_KH, LT_V, LT_VH, LT_ATT, LT_GATE, LT_UP, LT_PL_IN,
    LT_CONV_STATE, LT_DELTA_STATE, /* qwen35: views of the layer's recurrent state (kvcache) */
    LT_COUNT
};

/* The scratch of one backend: a buffer laid out by plan() and the descriptors of one step. */
struct side {
    const struct kiri_backend_iface *iface;   /* borrowed */
    struct kiri_backend *be;                  /* borrowed */
    struct kiri_buffer *buffer;               /* owned */
    void *host;                               /* host address of buffer, or NULL */
    size_t offsets[T_COUNT];
    struct kiri_tensor t[T_COUNT];
    struct kiri_tensor *lt;                   /* owned (n_layer * LT_COUNT) */
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
    struct kiri_tensor *rope_main, *rope_off; /* borrowed from the model: the RoPE frequency factors
                                             for this graph's context size on each side, or NULL */
    float *logits_host;                   /* owned copy when the main scratch is not host-visible */
    int32_t *meta_host;                   /* owned (2, max_tokens) staging for a scratch that is not
                                             host-visible, else NULL */
    int32_t *pl_rows;                     /* owned (max_tokens * n_layer): T_PL_ROWS of a step, for
                                             a model with per-layer embeddings, else NULL */
};

struct layout {
    size_t off[T_COUNT];
    size_t total;
};

static size_t align64(size_t x) { return (x + 63) & ~(size_t)63; }

/* Lays out the scratch of n tokens; with_head adds the token ids and what produces the logits.
 * The per-layer activations take the largest of the layers' shapes. */
static void plan(const struct kiri_model *m, int32_t n, int32_t n_out, int32_t entries, int with_head,
                 int with_swa, struct layout *l)
{
    const int recurrent = kiri_model_n_recurrent_layers(m) > 0;
    const struct kiri_hparams *hp = &m->hp;
    const size_t E = (size_t)hp->n_embd, PL = (size_t)hp->n_embd_per_layer * (size_t)hp->n_layer;
    size_t Q = 0, KV = 0, F = 0;
    for (int i = 0; i < hp->n_layer; i++) {
        const struct kiri_layer *L = &m->layers[i];
        const size_t q = (size_t)L->n_head * (size_t)L->head_dim, kv = (size_t)L->n_head_kv * (size_t)L->head_dim;
        Q = q > Q ? q : Q;
        KV = kv > KV ? kv : KV;
        F = (size_t)L->n_ff > F ? (size_t)L->n_ff : F;
    }
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
    if (PL) {
        bytes[T_PL_TOK] = bytes[T_PL_PROJ] = bytes[T_PL_IN] = PL * (size_t)n * 4;
        bytes[T_PL_ROWS] = (size_t)hp->n_layer * (size_t)n * 4;
        bytes[T_PL_GATE] = (size_t)hp->n_embd_per_layer * (size_t)n * 4;
    }
    if (recurrent) {
        bytes[T_BCX] = hp->arch == KIRI_ARCH_LFM2 ? 3 * E * (size_t)n * 4 : 0;
        bytes[T_STATE_ROWS] = 2 * (size_t)n * 4; /* the rows written, then those read */
    }
    const size_t S = (size_t)hp->ssm_head_dim, Hv = (size_t)hp->ssm_v_heads;
    const size_t C = (2 * (size_t)hp->ssm_k_heads + Hv) * S;
    if (kiri_model_has_mtp(m)) {
        bytes[T_HN] = E * (size_t)n * 4;
        bytes[T_EH] = 2 * E * (size_t)n * 4;
    }
    if (hp->arch == KIRI_ARCH_QWEN35) {
        bytes[T_QG] = 2 * Q * (size_t)n * 4;
        bytes[T_QKV] = C * (size_t)n * 4;
        bytes[T_Z] = bytes[T_DN_OUT] = Hv * S * (size_t)n * 4;
        bytes[T_BETA] = bytes[T_ALPHA] = Hv * (size_t)n * 4;
        bytes[T_GATES] = 2 * Hv * (size_t)n * 4;
    }
    size_t off = 0;
    for (int i = 0; i < T_COUNT; i++) {
        l->off[i] = off;
        off += align64(bytes[i]);
    }
    /* Views share the memory of their base tensor. */
    l->off[T_Q3] = l->off[T_QH] = l->off[T_Q];
    l->off[T_K3] = l->off[T_KH] = l->off[T_K];
    l->off[T_PL_PROJ_ROWS] = l->off[T_PL_PROJ];
    l->off[T_BCX_B] = l->off[T_CONV_OUT] = l->off[T_BCX];
    l->off[T_BCX_C] = l->off[T_BCX] + E * 4;
    l->off[T_BCX_X] = l->off[T_BCX] + 2 * E * 4;
    l->off[T_QG_Q] = l->off[T_QG];
    l->off[T_QG_GATE] = l->off[T_QG] + (size_t)hp->head_dim * 4;
    l->off[T_ATT_H] = l->off[T_ATT];
    l->off[T_QKV_Q] = l->off[T_QKV];
    l->off[T_QKV_K] = l->off[T_QKV] + (size_t)hp->ssm_k_heads * S * 4;
    l->off[T_DN_OUT_H] = l->off[T_DN_OUT];
    l->off[T_EH_E] = l->off[T_EH];
    l->off[T_EH_H] = l->off[T_EH] + E * 4;
    l->total = off;
}

uint64_t kiri_graph_scratch_bytes(const struct kiri_model *m, int32_t max_tokens, int32_t max_outputs,
                                  int32_t max_table_entries)
{
    struct layout l, lo;
    const int swa = kiri_model_n_swa_layers(m) > 0;
    plan(m, max_tokens, max_outputs, max_table_entries, 1, swa, &l);
    if (!m->n_offload)
        return l.total;
    plan(m, max_tokens, max_outputs, max_table_entries, 0, swa, &lo);
    return (uint64_t)l.total + lo.total;
}

/* The layers a graph runs: the trunk's, and the MTP block's after them. */
static int n_graph_layers(const struct kiri_model *m) { return m->hp.n_layer + (kiri_model_has_mtp(m) ? 1 : 0); }

static int side_init(struct side *s, const struct kiri_backend_iface *iface, struct kiri_backend *be,
                     const struct layout *l, int n_layer)
{
    s->iface = iface;
    s->be = be;
    memcpy(s->offsets, l->off, sizeof l->off);
    if (!(s->lt = kiri_mem_calloc((size_t)n_layer * LT_COUNT, sizeof *s->lt)))
        return KIRI_E_NOMEM;
    if (iface->buffer_alloc(be, l->total, &s->buffer, &s->host) != 0) {
        s->buffer = NULL;
        s->host = NULL;
        return KIRI_E_NOMEM;
    }
    return KIRI_OK;
}

int kiri_graph_init(struct kiri_model *m, int32_t max_tokens, int32_t max_outputs, int32_t max_table_entries,
                    int32_t n_ctx, struct kiri_graph **out)
{
    if (max_tokens < 1 || max_outputs < 1 || max_outputs > max_tokens || max_table_entries < 1 || n_ctx < 1)
        return KIRI_E_INVALID_ARG;
    struct kiri_graph *g = kiri_mem_calloc(1, sizeof *g);
    if (!g)
        return KIRI_E_NOMEM;
    g->model = m;
    g->max_tokens = max_tokens;
    g->max_outputs = max_outputs;
    g->max_table_entries = max_table_entries;
    g->rope_main = kiri_model_rope_factors(m, n_ctx, 0);
    g->rope_off = m->n_offload ? kiri_model_rope_factors(m, n_ctx, 1) : NULL;
    struct layout l;
    const int swa = kiri_model_n_swa_layers(m) > 0;
    plan(m, max_tokens, max_outputs, max_table_entries, 1, swa, &l);
    g->max_nodes = n_graph_layers(m) * 64 + 32;
    g->nodes = kiri_mem_calloc((size_t)g->max_nodes, sizeof *g->nodes);
    int rc = g->nodes ? side_init(&g->main, m->iface, m->be, &l, n_graph_layers(m)) : KIRI_E_NOMEM;
    if (rc == KIRI_OK && m->n_offload) {
        plan(m, max_tokens, max_outputs, max_table_entries, 0, swa, &l);
        rc = side_init(&g->off, m->off_iface, m->off_be, &l, n_graph_layers(m));
    }
    if (rc == KIRI_OK && !g->main.host &&
        !(g->logits_host = kiri_mem_array((size_t)m->hp.n_vocab * (size_t)max_outputs, sizeof(float))))
        rc = KIRI_E_NOMEM;
    if (rc == KIRI_OK && (!g->main.host || (m->n_offload && !g->off.host)) &&
        !(g->meta_host = kiri_mem_array((size_t)max_tokens * 2, sizeof(int32_t))))
        rc = KIRI_E_NOMEM;
    if (rc == KIRI_OK && m->hp.n_embd_per_layer > 0 &&
        !(g->pl_rows = kiri_mem_array((size_t)max_tokens * (size_t)m->hp.n_layer, sizeof(int32_t))))
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
    kiri_mem_free(g->main.lt);
    kiri_mem_free(g->off.lt);
    kiri_mem_free(g->nodes);
    kiri_mem_free(g->logits_host);
    kiri_mem_free(g->meta_host);
    kiri_mem_free(g->pl_rows);
    kiri_mem_free(g);
}

/* Shapes descriptor t over the scratch at offset: contiguous rows of ne0 elements of type. */
static struct kiri_tensor *shape_at(struct side *s, struct kiri_tensor *t, size_t offset, int type, int64_t ne0,
                                    int64_t ne1, int64_t ne2)
{
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
    t->offset = offset;
    t->data = s->host ? (char *)s->host + offset : NULL;
    return t;
}

/* Shapes scratch descriptor id. */
static struct kiri_tensor *shape(struct side *s, int id, int type, int64_t ne0, int64_t ne1, int64_t ne2)
{
    return shape_at(s, &s->t[id], s->offsets[id], type, ne0, ne1, ne2);
}

static int upload(struct side *s, struct kiri_tensor *t, const void *src, size_t size)
{
    if (t->data) {
        memcpy(t->data, src, size);
        return 0;
    }
    return s->iface->tensor_set(s->be, t, src, 0, size);
}

static int download(struct side *s, const struct kiri_tensor *t, void *dst, size_t size)
{
    if (t->data) {
        memcpy(dst, t->data, size);
        return 0;
    }
    return s->iface->tensor_get(s->be, t, dst, 0, size);
}

/* Shapes id as rows of ne0 elements, ne1 per token, the tokens row_stride bytes apart. */
static void shape_rows(struct side *s, int id, int64_t ne0, int64_t ne1, int32_t n, size_t row_stride)
{
    struct kiri_tensor *t = shape(s, id, KIRI_TYPE_F32, ne0, ne1, n);
    t->nb[2] = row_stride;
    t->nb[3] = row_stride * (size_t)n;
}

/* qwen35's activations of a step of n tokens. */
static void shape_qwen35(const struct kiri_model *m, struct side *s, int32_t n)
{
    const struct kiri_hparams *hp = &m->hp;
    const int64_t D = hp->head_dim, H = hp->n_head, S = hp->ssm_head_dim, Hk = hp->ssm_k_heads;
    const int64_t Hv = hp->ssm_v_heads, C = (2 * Hk + Hv) * S;
    const int f32 = KIRI_TYPE_F32;
    shape(s, T_QG, f32, 2 * D * H, n, 1);
    for (int id = T_QG_Q; id <= T_QG_GATE; id++) {
        struct kiri_tensor *t = shape(s, id, f32, D, H * n, 1);
        t->nb[1] = 2 * (size_t)D * 4; /* each head's queries, then its gates */
        t->nb[2] = t->nb[3] = t->nb[1] * (size_t)(H * n);
    }
    shape(s, T_ATT_H, f32, D, H * n, 1);
    shape(s, T_QKV, f32, C, n, 1);
    shape_rows(s, T_QKV_Q, S, Hk, n, (size_t)C * 4);
    shape_rows(s, T_QKV_K, S, Hk, n, (size_t)C * 4);
    shape(s, T_Z, f32, Hv * S, n, 1);
    shape(s, T_BETA, f32, Hv, n, 1);
    shape(s, T_ALPHA, f32, Hv, n, 1);
    shape(s, T_GATES, f32, 2 * Hv, n, 1);
    shape(s, T_DN_OUT, f32, Hv * S, n, 1);
    shape(s, T_DN_OUT_H, f32, S, Hv * n, 1);
}

/* Shapes the activations of a step of n tokens (and n_out logit rows on the side with the head):
 * the shared ones, and each layer's in s->lt. */
static void shape_step(const struct kiri_model *m, struct side *s, int32_t n, int32_t n_out, int with_head)
{
    const struct kiri_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, P = hp->n_embd_per_layer, NL = hp->n_layer;
    const int f32 = KIRI_TYPE_F32;
    shape(s, T_X, f32, E, n, 1);
    shape(s, T_XN, f32, E, n, 1);
    for (int l = 0; l < n_graph_layers(m); l++) {
        const struct kiri_layer *L = &m->layers[l];
        const int64_t D = L->head_dim, H = L->n_head, Hkv = L->n_head_kv, F = L->n_ff;
        struct kiri_tensor *t = &s->lt[(size_t)l * LT_COUNT];
        const size_t *o = s->offsets;
        shape_at(s, &t[LT_Q], o[T_Q], f32, D * H, n, 1);
        shape_at(s, &t[LT_Q3], o[T_Q], f32, D, H, n);
        shape_at(s, &t[LT_QH], o[T_Q], f32, D, H * n, 1);
        shape_at(s, &t[LT_K], o[T_K], f32, D * Hkv, n, 1);
        shape_at(s, &t[LT_K3], o[T_K], f32, D, Hkv, n);
        shape_at(s, &t[LT_KH], o[T_K], f32, D, Hkv * n, 1);
        shape_at(s, &t[LT_V], o[T_V], f32, D * Hkv, n, 1);
        shape_at(s, &t[LT_VH], o[T_V], f32, D, Hkv * n, 1);
        shape_at(s, &t[LT_ATT], o[T_ATT], f32, D * H, n, 1);
        shape_at(s, &t[LT_GATE], o[T_GATE], f32, F, n, 1);
        shape_at(s, &t[LT_UP], o[T_UP], f32, F, n, 1);
        if (P)
            shape_at(s, &t[LT_PL_IN], o[T_PL_IN] + (size_t)l * (size_t)P * (size_t)n * 4, f32, P, n, 1);
    }
    if (P) {
        shape(s, T_PL_TOK, f32, P * NL, n, 1);
        shape(s, T_PL_PROJ, f32, P * NL, n, 1);
        shape(s, T_PL_PROJ_ROWS, f32, P, NL * n, 1);
        shape(s, T_PL_IN, f32, P, NL * n, 1);
        shape(s, T_PL_GATE, f32, P, n, 1);
    }
    if (with_head) {
        shape(s, T_XO, f32, E, n_out, 1);
        shape(s, T_LOGITS, f32, hp->n_vocab, n_out, 1);
    }
    if (hp->arch == KIRI_ARCH_QWEN35)
        shape_qwen35(m, s, n);
    if (kiri_model_has_mtp(m)) {
        shape(s, T_HN, f32, E, n, 1);
        shape(s, T_EH, f32, 2 * E, n, 1);
        for (int id = T_EH_E; id <= T_EH_H; id++) {
            struct kiri_tensor *t = shape(s, id, f32, E, n, 1);
            t->nb[1] = 2 * (size_t)E * 4; /* rows of the whole input */
            t->nb[2] = t->nb[3] = t->nb[1] * (size_t)n;
        }
    }
    if (hp->arch == KIRI_ARCH_LFM2 && kiri_model_n_recurrent_layers(m)) {
        shape(s, T_BCX, f32, 3 * E, n, 1);
        shape(s, T_CONV_OUT, f32, E, n, 1);
        for (int id = T_BCX_B; id <= T_BCX_X; id++) {
            struct kiri_tensor *t = shape(s, id, f32, E, n, 1);
            t->nb[1] = 3 * (size_t)E * 4; /* rows of the whole projection */
            t->nb[2] = t->nb[3] = t->nb[1] * (size_t)n;
        }
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
        if (g->pl_rows) {
            /* Layer l's input for token t is row t * L + l of the token-major inputs. */
            const int32_t L = g->model->hp.n_layer;
            struct kiri_tensor *pr = shape(s, T_PL_ROWS, KIRI_TYPE_I32, (int64_t)L * n, 1, 1);
            for (int32_t l = 0; l < L; l++)
                for (int32_t t = 0; t < n; t++)
                    g->pl_rows[l * n + t] = t * L + l;
            rc |= upload(s, pr, g->pl_rows, (size_t)L * (size_t)n * 4);
        }
    }
    rc |= upload(s, pos, b->pos, (size_t)n * 4);
    rc |= upload(s, slots, b->slots, (size_t)n * 4);
    rc |= upload(s, tables, b->tables, (size_t)b->n_table_entries * 4);
    if (b->state_rows) {
        struct kiri_tensor *rows = shape(s, T_STATE_ROWS, KIRI_TYPE_I32, n, 2, 1);
        const int32_t *from = b->state_from ? b->state_from : b->state_rows;
        if (rows->data) {
            memcpy(rows->data, b->state_rows, (size_t)n * 4);
            memcpy((char *)rows->data + (size_t)n * 4, from, (size_t)n * 4);
        } else {
            rc |= s->iface->tensor_set(s->be, rows, b->state_rows, 0, (size_t)n * 4);
            rc |= s->iface->tensor_set(s->be, rows, from, (size_t)n * 4, (size_t)n * 4);
        }
    }
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

/* A projection (see model.h): dst = scale * (w src) + bias, or with bias_first (the
 * feed-forward's order) dst = scale * (w src + bias). A scale of 1 adds no node. */
static void project(struct builder *b, struct kiri_tensor *dst, struct kiri_tensor *w, struct kiri_tensor *bias,
                    float scale, int bias_first, struct kiri_tensor *src)
{
    add(b, KIRI_OP_MATMUL, dst, w, src);
    if (bias && bias_first)
        add(b, KIRI_OP_ADD, dst, dst, bias);
    if (scale != 1.0f)
        add(b, KIRI_OP_SCALE, dst, dst, NULL)->p.scale = scale;
    if (bias && !bias_first)
        add(b, KIRI_OP_ADD, dst, dst, bias);
}

static void rms_norm(struct builder *b, struct kiri_tensor *dst, struct kiri_tensor *src, struct kiri_tensor *w,
                     float eps)
{
    add(b, KIRI_OP_RMS_NORM, dst, src, w)->p.eps = eps;
}

/* The feed-forward block of a layer whose activations are t, from the residual stream. */
static void ffn(const struct kiri_model *m, struct side *s, const struct kiri_layer *L, struct kiri_tensor *t,
                struct builder *b)
{
    const struct kiri_hparams *hp = &m->hp;
    struct kiri_tensor *x = &s->t[T_X], *xn = &s->t[T_XN], *gate = &t[LT_GATE], *up = &t[LT_UP];
    rms_norm(b, xn, x, L->ffn_norm, hp->rms_eps);
    project(b, gate, L->w_gate, L->b_gate, L->w_gate_scale, 1, xn);
    project(b, up, L->w_up, L->b_up, L->w_up_scale, 1, xn);
    add(b, hp->ffn_gelu ? KIRI_OP_GEGLU : KIRI_OP_SWIGLU, gate, gate, up);
    project(b, xn, L->w_down, L->b_down, L->w_down_scale, 1, gate);
    block_out(hp, L->ffn_post_norm, x, xn, b);
}

/* lfm2's gated short-convolution block on the normed input xn, added to the residual stream:
 * B, C, x = in_proj xn; out_proj (C * conv(B * x)), the convolution reading and updating each
 * token's sequence state in the cache (kiri_kvcache_state). */
static void build_short_conv(struct side *s, struct kiri_kvcache *kv, const struct kiri_layer *L, int l,
                             struct builder *b)
{
    struct kiri_tensor *xn = &s->t[T_XN], *out = &s->t[T_CONV_OUT];
    add(b, KIRI_OP_MATMUL, &s->t[T_BCX], L->sc_in, xn);
    add(b, KIRI_OP_MUL, xn, &s->t[T_BCX_B], &s->t[T_BCX_X]);
    struct kiri_node *nd = add(b, KIRI_OP_SHORT_CONV, xn, xn, L->sc_conv);
    nd->src[2] = kiri_kvcache_state(kv, l);
    nd->src[3] = &s->t[T_STATE_ROWS];
    nd->src[4] = &s->t[T_POS];
    add(b, KIRI_OP_MUL, xn, &s->t[T_BCX_C], xn);
    add(b, KIRI_OP_MATMUL, out, L->sc_out, xn);
    add(b, KIRI_OP_ADD, &s->t[T_X], &s->t[T_X], out);
}

/* A view of layer l's recurrent state (slots rows of the cache's state), dim floats from first. */
static struct kiri_tensor *state_view(struct kiri_tensor *t, const struct kiri_tensor *state, int64_t first,
                                      int64_t dim)
{
    *t = *state;
    t->ne[0] = dim;
    t->offset += (size_t)first * 4;
    t->data = state->data ? (char *)state->data + (size_t)first * 4 : NULL;
    return t;
}

/* qwen35's Gated DeltaNet block on the normed input xn, added to the residual stream (see
 * struct kiri_layer): q, k, v through the causal convolution and SiLU (the window in the
 * layer's state), q and k L2-normed as llama.cpp writes it (an RMS norm with eps / S, times
 * 1/sqrt(S)), the delta rule over the step's tokens (its state after the window), the gated
 * norm (RMS norm with dn_norm, times silu(z)), the output projection. */
static void build_delta_net(const struct kiri_model *m, struct side *s, struct kiri_kvcache *kv,
                            const struct kiri_layer *L, int l, struct builder *b)
{
    const struct kiri_hparams *hp = &m->hp;
    const int64_t S = hp->ssm_head_dim;
    const struct kiri_tensor *state = kiri_kvcache_state(kv, l);
    struct kiri_tensor *lt = &s->lt[(size_t)l * LT_COUNT], *t = s->t;
    struct kiri_tensor *xn = &t[T_XN], *qkv = &t[T_QKV], *out = &t[T_DN_OUT];
    const int64_t window = kiri_model_delta_state_offset(m);
    add(b, KIRI_OP_MATMUL, qkv, L->dn_qkv, xn);
    add(b, KIRI_OP_MATMUL, &t[T_Z], L->dn_z, xn);
    add(b, KIRI_OP_MATMUL, &t[T_BETA], L->dn_beta, xn);
    add(b, KIRI_OP_MATMUL, &t[T_ALPHA], L->dn_alpha, xn);
    struct kiri_node *nd = add(b, KIRI_OP_DELTA_GATES, &t[T_GATES], &t[T_BETA], &t[T_ALPHA]);
    nd->src[2] = L->dn_dt;
    nd->src[3] = L->dn_a;
    nd = add(b, KIRI_OP_SHORT_CONV, qkv, qkv, L->dn_conv);
    nd->src[2] = state_view(&lt[LT_CONV_STATE], state, 0, window);
    nd->src[3] = &t[T_STATE_ROWS];
    nd->src[4] = &t[T_POS];
    nd->p.conv_silu = 1;
    for (int id = T_QKV_Q; id <= T_QKV_K; id++) {
        rms_norm(b, &t[id], &t[id], NULL, hp->rms_eps / (float)S);
        add(b, KIRI_OP_SCALE, &t[id], &t[id], NULL)->p.scale = 1.0f / sqrtf((float)S);
    }
    nd = add(b, KIRI_OP_DELTA_NET, out, qkv, &t[T_GATES]);
    nd->src[2] = state_view(&lt[LT_DELTA_STATE], state, window, (int64_t)hp->ssm_v_heads * S * S);
    nd->src[3] = &t[T_STATE_ROWS];
    nd->src[4] = &t[T_POS];
    nd->p.delta = (struct kiri_delta_params){hp->ssm_k_heads, hp->ssm_v_heads, (int)S, 1.0f / sqrtf((float)S)};
    rms_norm(b, &t[T_DN_OUT_H], &t[T_DN_OUT_H], L->dn_norm, hp->rms_eps);
    add(b, KIRI_OP_SWIGLU, out, &t[T_Z], out);
    add(b, KIRI_OP_MATMUL, xn, L->dn_out, out);
    add(b, KIRI_OP_ADD, &t[T_X], &t[T_X], xn);
}

/* Adds the nodes of layers [l0, l1) on side s. rope_freqs is the descriptor s's backend prepared
 * (applied on the layers with rope_factors). A sliding-window layer attends its last
 * hp.swa_window keys, in the cache's windowed pool when it has one (its own slots and tables). A
 * layer that attends another layer's cache (kv_source) computes only its queries. */
static void build_layers(const struct kiri_model *m, struct side *s, struct kiri_kvcache *kv,
                         struct kiri_tensor *rope_freqs, int l0, int l1, struct builder *b)
{
    const struct kiri_hparams *hp = &m->hp;
    const float eps = hp->rms_eps;
    struct kiri_tensor *x = &s->t[T_X], *xn = &s->t[T_XN];
    struct kiri_tensor *pos = &s->t[T_POS], *slots = &s->t[T_SLOTS], *meta = &s->t[T_META];
    struct kiri_tensor *tables = &s->t[T_TABLES];
    struct kiri_tensor *swa_slots = &s->t[T_SWA_SLOTS], *swa_tables = &s->t[T_SWA_TABLES];
    struct kiri_node *nd;

    for (int l = l0; l < l1; l++) {
        const struct kiri_layer *L = &m->layers[l];
        if (L->recurrent) {
            rms_norm(b, xn, x, L->attn_norm, eps);
            if (hp->arch == KIRI_ARCH_QWEN35)
                build_delta_net(m, s, kv, L, l, b);
            else
                build_short_conv(s, kv, L, l, b);
            ffn(m, s, L, &s->lt[(size_t)l * LT_COUNT], b);
            continue;
        }
        struct kiri_tensor *t = &s->lt[(size_t)l * LT_COUNT];
        struct kiri_tensor *q = &t[LT_Q], *q3 = &t[LT_Q3], *qh = &t[LT_QH], *k = &t[LT_K], *k3 = &t[LT_K3];
        struct kiri_tensor *kh = &t[LT_KH], *v = &t[LT_V], *vh = &t[LT_VH], *att = &t[LT_ATT];
        const int own_kv = L->kv_source == l;
        const struct kiri_rope_params rope = {hp->rope_mode, L->n_rot, L->rope_freq_base, L->rope_freq_scale,
                                              hp->rope_attn_factor};
        const struct kiri_attn_params attn = {L->n_head, L->n_head_kv, L->head_dim, kiri_kvcache_block_size(kv),
                                              hp->attn_scale, L->swa ? hp->swa_window : 0};
        rms_norm(b, xn, x, L->attn_norm, eps);
        /* qwen35: each head's queries come with their output gate; the norm gathers the queries. */
        project(b, L->attn_gated ? &s->t[T_QG] : q, L->wq, L->bq, L->wq_scale, 0, xn);
        if (own_kv) {
            project(b, k, L->wk, L->bk, L->wk_scale, 0, xn);
            project(b, v, L->wv, L->bv, L->wv_scale, 0, xn);
        }
        if (L->q_norm)
            rms_norm(b, qh, L->attn_gated ? &s->t[T_QG_Q] : qh, L->q_norm, eps);
        if (L->k_norm && own_kv)
            rms_norm(b, kh, kh, L->k_norm, eps);
        if (L->v_norm && own_kv)
            rms_norm(b, vh, vh, L->v_norm, eps);
        if (L->rope) {
            nd = add(b, KIRI_OP_ROPE, q3, q3, pos);
            nd->src[2] = L->rope_factors ? rope_freqs : NULL;
            nd->p.rope = rope;
            if (own_kv) {
                nd = add(b, KIRI_OP_ROPE, k3, k3, pos);
                nd->src[2] = L->rope_factors ? rope_freqs : NULL;
                nd->p.rope = rope;
            }
        }
        const int windowed = kiri_kvcache_layer_windowed(kv, l);
        if (own_kv) {
            add(b, KIRI_OP_STORE_KV, kiri_kvcache_k(kv, l), k, windowed ? swa_slots : slots);
            add(b, KIRI_OP_STORE_KV, kiri_kvcache_v(kv, l), v, windowed ? swa_slots : slots);
        }
        nd = add(b, KIRI_OP_ATTENTION, att, q3, kiri_kvcache_k(kv, l));
        nd->src[2] = kiri_kvcache_v(kv, l);
        nd->src[3] = meta;
        nd->src[4] = windowed ? swa_tables : tables;
        nd->p.attn = attn;
        if (L->attn_gated)
            add(b, KIRI_OP_SIGMOID_MUL, &s->t[T_ATT_H], &s->t[T_ATT_H], &s->t[T_QG_GATE]);
        project(b, xn, L->wo, L->bo, L->wo_scale, 0, att);
        block_out(hp, L->attn_post_norm, x, xn, b);
        ffn(m, s, L, t, b);
        if (L->pl_gate) {
            /* gemma4: x += post_norm(proj(gelu(inp_gate x) * this layer's per-layer input)). */
            struct kiri_tensor *pg = &s->t[T_PL_GATE];
            add(b, KIRI_OP_MATMUL, pg, L->pl_gate, x);
            add(b, KIRI_OP_GEGLU, pg, pg, &t[LT_PL_IN]);
            add(b, KIRI_OP_MATMUL, xn, L->pl_proj, pg);
            rms_norm(b, xn, xn, L->pl_post_norm, eps);
            add(b, KIRI_OP_ADD, x, x, xn);
        }
        if (L->out_scale != 1.0f)
            add(b, KIRI_OP_SCALE, x, x, NULL)->p.scale = L->out_scale;
    }
}

/* gemma4's per-layer inputs, after the scaled token embedding x: the tokens' rows
 * of per_layer_token_embd times sqrt(P), plus the RMS-normed projection of x times
 * 1/sqrt(n_embd), all times 1/sqrt(2); then gathered layer-major so each layer reads a
 * contiguous (P, n). */
static void build_per_layer_inputs(const struct kiri_model *m, struct side *s, struct builder *b)
{
    const struct kiri_hparams *hp = &m->hp;
    struct kiri_tensor *tok = &s->t[T_PL_TOK], *proj = &s->t[T_PL_PROJ];
    add(b, KIRI_OP_GET_ROWS, tok, m->pl_tok_embd, &s->t[T_TOKENS]);
    add(b, KIRI_OP_SCALE, tok, tok, NULL)->p.scale = sqrtf((float)hp->n_embd_per_layer);
    add(b, KIRI_OP_MATMUL, proj, m->pl_model_proj, &s->t[T_X]);
    add(b, KIRI_OP_SCALE, proj, proj, NULL)->p.scale = 1.0f / sqrtf((float)hp->n_embd);
    rms_norm(b, &s->t[T_PL_PROJ_ROWS], &s->t[T_PL_PROJ_ROWS], m->pl_proj_norm, hp->rms_eps);
    add(b, KIRI_OP_ADD, proj, proj, tok);
    add(b, KIRI_OP_SCALE, proj, proj, NULL)->p.scale = 1.0f / sqrtf(2.0f);
    add(b, KIRI_OP_GET_ROWS, &s->t[T_PL_IN], &s->t[T_PL_PROJ_ROWS], &s->t[T_PL_ROWS]);
}

/* Only the rows that need logits go through the output norm and the vocabulary product. */
static void build_head(const struct kiri_model *m, struct side *s, struct builder *b)
{
    struct kiri_tensor *xo = &s->t[T_XO];
    add(b, KIRI_OP_GET_ROWS, xo, &s->t[T_X], &s->t[T_OUT_ROWS]);
    struct kiri_node *nd = add(b, KIRI_OP_RMS_NORM, xo, xo, m->output_norm);
    nd->p.eps = m->hp.rms_eps;
    struct kiri_tensor *logits = &s->t[T_LOGITS];
    project(b, logits, m->output, m->output_b, m->output_scale, 0, xo);
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
    shape_step(m, &g->main, b->n_tokens, b->n_outputs, 1);
    if (n_off) {
        rc |= upload_inputs(g, &g->off, b, 0);
        shape_step(m, &g->off, b->n_tokens, b->n_outputs, 0);
    }
    struct builder bl = {g->nodes, 0, g->max_nodes};
    add(&bl, KIRI_OP_GET_ROWS, &g->main.t[T_X], m->tok_embd, &g->main.t[T_TOKENS]);
    if (m->hp.embd_scale != 1.0f) {
        struct kiri_node *nd = add(&bl, KIRI_OP_SCALE, &g->main.t[T_X], &g->main.t[T_X], NULL);
        nd->p.scale = m->hp.embd_scale;
    }
    if (m->pl_tok_embd)
        build_per_layer_inputs(m, &g->main, &bl);
    const int n_embed = bl.n;
    if (n_off)
        build_layers(m, &g->off, kv, g->rope_off, 0, n_off, &bl);
    const int n_first = bl.n;
    build_layers(m, &g->main, kv, g->rope_main, n_off, n_layer, &bl);
    if (b->hidden) /* every token's hidden state, as the head norms it (the MTP block's input) */
        rms_norm(&bl, &g->main.t[T_HN], &g->main.t[T_X], m->output_norm, m->hp.rms_eps);
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

/* Every token's id, cache slots (below slots_cap; in the windowed pool below swa_cap when that is
 * not 0), keys and table offset, and every output row, are in range. */
static int check_tokens(const struct kiri_model *m, const struct kiri_batch *b, int32_t slots_cap, int32_t swa_cap,
                        struct kiri_status_info *info)
{
    for (int32_t i = 0; i < b->n_tokens; i++) {
        if (b->tokens[i] < 0 || b->tokens[i] >= m->hp.n_vocab)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "token id %d is outside the vocabulary", b->tokens[i]);
        if (b->slots[i] < 0 || b->slots[i] >= slots_cap || b->n_kv[i] < 1 ||
            b->table_off[i] < 0 || b->table_off[i] >= b->n_table_entries ||
            (swa_cap > 0 && (b->swa_slots[i] < 0 || b->swa_slots[i] >= swa_cap)))
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "batch token %d has an invalid cache slot", i);
    }
    for (int32_t i = 0; i < b->n_outputs; i++)
        if (b->out_rows[i] < 0 || b->out_rows[i] >= b->n_tokens)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "output row %d is outside the batch", b->out_rows[i]);
    return KIRI_OK;
}

int kiri_graph_run(struct kiri_graph *g, struct kiri_kvcache *kv, const struct kiri_batch *b,
                   const float **logits, struct kiri_status_info *info)
{
    struct kiri_model *m = g->model;
    const int32_t n = b->n_tokens, n_out = b->n_outputs;
    int rc;
    if (n < 1 || n > g->max_tokens || n_out < 1 || n_out > g->max_outputs ||
        b->n_table_entries < 1 || b->n_table_entries > g->max_table_entries)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "batch of %d tokens / %d outputs exceeds the graph", n, n_out);
    /* Slots must lie in the pool of the layers that write them: the global one (l0 is its first
     * layer) and the windowed one (lw), whose layers are sliding-window layers of this model. */
    int l0 = -1, lw = -1;
    for (int l = 0; l < m->hp.n_layer; l++) {
        if (m->layers[l].recurrent != !kiri_kvcache_layer_has_kv(kv, l))
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "the KV cache's layer %d does not match the model's", l);
        if (m->layers[l].recurrent)
            continue;
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
    if ((rc = check_tokens(m, b, slots_cap, swa_cap, info)) < 0)
        return rc;
    /* Recurrent layers: the cache's state has their shape, and every token names a slot of it. */
    const int recurrent = kiri_model_n_recurrent_layers(m) > 0;
    for (int l = 0; recurrent && l < m->hp.n_layer; l++) {
        const struct kiri_tensor *st = kiri_kvcache_state(kv, l);
        if (m->layers[l].recurrent && (!st || st->ne[0] != kiri_model_state_dim(m, l)))
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "the KV cache has no state for recurrent layer %d", l);
    }
    if (recurrent != (b->state_rows != NULL))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the batch's state slots do not match the model");
    for (int32_t i = 0; recurrent && i < n; i++)
        if (b->state_rows[i] < 0 || b->state_rows[i] >= kiri_kvcache_n_state_slots(kv) ||
            (b->state_from && (b->state_from[i] < 0 || b->state_from[i] >= kiri_kvcache_n_state_slots(kv))))
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "batch token %d has an invalid state slot", i);
    /* Each layer's keys and values must sit on the backend that runs the layer, as
     * kiri_model_kvcache_init places them. */
    if (kiri_kvcache_n_first(kv) != m->n_offload ||
        (m->n_offload && kiri_kvcache_backend(kv, 0) != m->off_be) ||
        kiri_kvcache_backend(kv, m->hp.n_layer - 1) != m->be)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the KV cache was not made for this model's placement");

    if (b->hidden && !kiri_model_has_mtp(m))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "hidden states are kept only for a model with an MTP head");

    kiri_platform_mutex_lock(m->compute_lock);
    rc = run_step(g, kv, b);
    const struct kiri_tensor *lt = &g->main.t[T_LOGITS];
    const size_t lbytes = (size_t)m->hp.n_vocab * (size_t)n_out * sizeof(float);
    if (rc == 0 && !lt->data)
        rc = g->main.iface->tensor_get(g->main.be, lt, g->logits_host, 0, lbytes);
    if (rc == 0 && b->hidden)
        rc = download(&g->main, &g->main.t[T_HN], b->hidden, (size_t)m->hp.n_embd * (size_t)n * sizeof(float));
    kiri_platform_mutex_unlock(m->compute_lock);
    if (rc != 0)
        return kiri_error_set(info, KIRI_E_BACKEND, "backend %s failed to run a step",
                              m->n_offload ? m->off_iface->name : m->iface->name);
    *logits = lt->data ? lt->data : g->logits_host;
    return KIRI_OK;
}

/* The MTP block over the step's tokens (see struct kiri_mtp_head), on the main side: the
 * embedding and the hidden states h normed and joined, eh_proj, the block (its keys and values in
 * the cache's layer n_layer), and for the output rows the head's norm and the logits. */
static int run_mtp(struct kiri_graph *g, struct kiri_kvcache *kv, const struct kiri_batch *b, const float *h)
{
    struct kiri_model *m = g->model;
    const struct kiri_mtp_head *mh = &m->mtp;
    struct side *s = &g->main;
    const int l = m->hp.n_layer;
    const float eps = m->hp.rms_eps;
    int rc = upload_inputs(g, s, b, 1);
    shape_step(m, s, b->n_tokens, b->n_outputs, 1);
    rc |= upload(s, &s->t[T_XN], h, (size_t)m->hp.n_embd * (size_t)b->n_tokens * sizeof(float));
    if (rc != 0)
        return rc;
    struct builder bl = {g->nodes, 0, g->max_nodes};
    struct kiri_tensor *x = &s->t[T_X], *xo = &s->t[T_XO];
    add(&bl, KIRI_OP_GET_ROWS, x, mh->embed, &s->t[T_TOKENS]);
    rms_norm(&bl, &s->t[T_EH_E], x, mh->enorm, eps);
    rms_norm(&bl, &s->t[T_EH_H], &s->t[T_XN], mh->hnorm, eps);
    add(&bl, KIRI_OP_MATMUL, x, mh->eh_proj, &s->t[T_EH]);
    build_layers(m, s, kv, g->rope_main, l, l + 1, &bl);
    if (b->n_outputs > 0) {
        add(&bl, KIRI_OP_GET_ROWS, xo, x, &s->t[T_OUT_ROWS]);
        rms_norm(&bl, xo, xo, mh->head_norm, eps);
        project(&bl, &s->t[T_LOGITS], mh->head, NULL, mh->head_scale, 0, xo);
    }
    return run_nodes(s, g->nodes, bl.n);
}

int kiri_graph_run_mtp(struct kiri_graph *g, struct kiri_kvcache *kv, const struct kiri_batch *b, const float *h,
                       float *h_out, const float **logits, struct kiri_status_info *info)
{
    struct kiri_model *m = g->model;
    const int l = m->hp.n_layer;
    const int32_t n = b->n_tokens, n_out = b->n_outputs;
    if (!kiri_model_has_mtp(m))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the model has no multi-token-prediction head");
    if (!kiri_kvcache_layer_has_kv(kv, l) || kiri_kvcache_layer_windowed(kv, l) ||
        kiri_kvcache_backend(kv, l) != m->be)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the KV cache has no layer for the MTP head");
    if (n < 1 || n > g->max_tokens || n_out < 0 || n_out > g->max_outputs || b->n_table_entries < 1 ||
        b->n_table_entries > g->max_table_entries || !h || (n_out > 0 && (!h_out || !logits)))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "batch of %d tokens / %d outputs exceeds the graph", n, n_out);
    int rc = check_tokens(m, b, (int32_t)kiri_kvcache_k(kv, l)->ne[1], 0, info);
    if (rc < 0)
        return rc;
    kiri_platform_mutex_lock(m->compute_lock);
    rc = run_mtp(g, kv, b, h);
    const struct kiri_tensor *lt = &g->main.t[T_LOGITS];
    if (rc == 0 && n_out > 0 && !lt->data)
        rc = g->main.iface->tensor_get(g->main.be, lt, g->logits_host, 0,
                                       (size_t)m->hp.n_vocab * (size_t)n_out * sizeof(float));
    if (rc == 0 && n_out > 0)
        rc = download(&g->main, &g->main.t[T_XO], h_out, (size_t)m->hp.n_embd * (size_t)n_out * sizeof(float));
    kiri_platform_mutex_unlock(m->compute_lock);
    if (rc != 0)
        return kiri_error_set(info, KIRI_E_BACKEND, "backend %s failed to run the MTP head", m->iface->name);
    if (n_out > 0)
        *logits = lt->data ? lt->data : g->logits_host;
    return KIRI_OK;
}
