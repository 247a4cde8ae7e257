/* The CPU backend: implements the backend interface over the kernels of this folder. Weights are
 * used in place from the model's mapping. A step runs on all workers of the runtime's pool at
 * once: every worker walks the node list, takes its share of each node's rows, and meets the
 * others at a barrier before a node that depends on what the nodes since the last barrier wrote
 * (or overwrites what they read); the plan of barriers is made once per step, before the run. */
#include <math.h>
#include <stdatomic.h>
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

/* How a node runs, decided per step by plan_step (bits of a byte per node). */
enum {
    PLAN_SYNC = 1,    /* all workers meet at a barrier before the node */
    PLAN_MINE = 2,    /* product: each worker converts the (one-token) activations into its own
                         scratch, so no barrier separates conversion and product */
    PLAN_REUSE = 4    /* product: the activations converted for the previous node (the same
                         tensor, the same dot-product type) are still in place */
};

struct kiri_backend {
    struct kiri_threads threads;
    struct kiri_cpu_kernels k;
    /* Owned scratch of one step: work_shared bytes seen by all workers (converted activations of
     * products of several tokens), then work_mine bytes for each worker (its converted one-token
     * activations, its attention scores and slots). */
    char *work;
    size_t work_size, work_shared, work_mine;
    uint8_t *plan;       /* owned, plan_cap entries: PLAN_* bits of each node of the step */
    _Atomic int64_t *claimed; /* owned, plan_cap entries: output rows of each product handed out
                                 so far (see claim_rows) */
    int plan_cap;
    /* The step being run, for the workers. */
    const struct kiri_node *nodes;
    int n_nodes;
    int status;
};

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static size_t align_up(size_t x) { return (x + WORK_ALIGN - 1) & ~(size_t)(WORK_ALIGN - 1); }

/* The rows [*r0, *r1) of n that worker ith of nth takes. */
static void split_rows(int64_t n, int ith, int nth, int64_t *r0, int64_t *r1)
{
    const int64_t per = (n + nth - 1) / nth;
    *r0 = per * ith < n ? per * ith : n;
    *r1 = *r0 + per < n ? *r0 + per : n;
}

/* The rows [*r0, *r1) of n that worker ith of nth takes, in multiples of `align` rows (but the
 * last), so workers write whole cache lines of the output and the kernels' row groups stay whole. */
static void split_rows_aligned(int64_t n, int64_t align, int ith, int nth, int64_t *r0, int64_t *r1)
{
    int64_t per = (n + nth - 1) / nth;
    per = (per + align - 1) / align * align;
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

/* Attention scores per key in a worker's scratch: one per query row of a tile (see
 * kiri_attend_tile_fn and kiri_attend_group_fn). */
#define ATTN_SCORES KIRI_ATTEND_TILE_ROWS

/* Scratch bytes a node needs, shared by all workers and per worker (see struct kiri_backend):
 * converted activations for products, per-worker score and slot buffers for attention. */
static void node_work_size(const struct kiri_node *nd, size_t *shared, size_t *mine)
{
    *shared = *mine = 0;
    if (nd->op == KIRI_OP_MATMUL) {
        const int vt = kiri_cpu_vec_dot_type(nd->src[0]->type);
        if (vt < 0)
            return;
        const size_t act = align_up(kiri_row_bytes(vt, nd->src[1]->ne[0]) * (size_t)n_rows(nd->src[1]));
        if (n_rows(nd->src[1]) == 1)
            *mine = act;
        else
            *shared = act;
    }
    if (nd->op == KIRI_OP_SHORT_CONV) /* the taps of a worker's channels, tap-major */
        *mine = align_up((size_t)nd->src[1]->ne[0] * (size_t)nd->src[0]->ne[0] * sizeof(float));
    if (nd->op == KIRI_OP_ATTENTION) {
        const size_t slots = (size_t)nd->src[1]->ne[1];
        *mine = align_up(slots * (ATTN_SCORES * sizeof(float) + sizeof(int32_t)));
    }
}

/* Worker ith's own scratch (work_mine bytes). */
static char *work_mine(const struct kiri_backend *be, int ith)
{
    return be->work + be->work_shared + (size_t)ith * be->work_mine;
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

static void run_rms_norm(struct kiri_backend *be, const struct kiri_node *nd, int ith, int nth)
{
    const struct kiri_tensor *x = nd->src[0], *w = nd->src[1];
    const kiri_rms_norm_fn rms_norm = be->k.rms_norm_row ? be->k.rms_norm_row : kiri_cpu_rms_norm_row;
    int64_t r0, r1;
    split_rows(n_rows(x), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        rms_norm((const float *)row_ptr(x, r), w ? (const float *)w->data : NULL,
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

/* The elements [*e0, *e1) of a one-row element-wise node that worker ith of nth takes: the row is
 * split in whole cache lines (one token's feed-forward, the logits). */
static void split_row(int64_t n, int ith, int nth, int64_t *e0, int64_t *e1)
{
    split_rows_aligned(n, 16, ith, nth, e0, e1);
}

/* SwiGLU and GeGLU: dst = act(src[0]) * src[1], row by row (one row: split within it). */
static void run_glu(const struct kiri_node *nd, kiri_swiglu_fn glu, int ith, int nth)
{
    const int64_t n = nd->src[0]->ne[0];
    if (n_rows(nd->src[0]) == 1) {
        int64_t e0, e1;
        split_row(n, ith, nth, &e0, &e1);
        if (e1 > e0)
            glu((const float *)nd->src[0]->data + e0, (const float *)nd->src[1]->data + e0,
                (float *)nd->dst->data + e0, e1 - e0);
        return;
    }
    int64_t r0, r1;
    split_rows(n_rows(nd->src[0]), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        glu((const float *)row_ptr(nd->src[0], r), (const float *)row_ptr(nd->src[1], r),
            (float *)row_ptr(nd->dst, r), n);
}

/* SCALE and SOFTCAP: dst = f(src[0], param), row by row (one row: split within it). */
static void run_map(const struct kiri_node *nd, kiri_map_fn map, float param, int ith, int nth)
{
    const struct kiri_tensor *x = nd->src[0];
    const int64_t n = x->ne[0];
    if (n_rows(x) == 1) {
        int64_t e0, e1;
        split_row(n, ith, nth, &e0, &e1);
        if (e1 > e0)
            map((const float *)x->data + e0, (float *)nd->dst->data + e0, e1 - e0, param);
        return;
    }
    int64_t r0, r1;
    split_rows(n_rows(x), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++)
        map((const float *)row_ptr(x, r), (float *)row_ptr(nd->dst, r), n, param);
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

/* The largest head KIRI_OP_DELTA_NET runs (Qwen3.5's are 128). */
#define DELTA_MAX_HEAD 512

/* Causal depthwise convolution with per-sequence state (KIRI_OP_SHORT_CONV). Channels are
 * independent, so each worker takes a range of them, turns their weights tap-major into its
 * scratch once (the kernels read a tap of consecutive channels as one vector), and walks the
 * step's tokens in order, each token's window being its sequence's state (its K - 1 previous
 * inputs, oldest first, copied first to the row the token writes when it reads another) and its
 * own input (kiri_cpu_short_conv_row, or the table's version of it). In place is safe: a token's
 * input is read before its output is written, and earlier inputs come from the state. */
static void run_short_conv(struct kiri_backend *be, const struct kiri_node *nd, int ith, int nth)
{
    const kiri_short_conv_fn conv = be->k.short_conv_row ? be->k.short_conv_row : kiri_cpu_short_conv_row;
    const struct kiri_tensor *u = nd->src[0], *w = nd->src[1], *st = nd->src[2];
    const int32_t *rows = nd->src[3]->data, *pos = nd->src[4]->data;
    const int32_t *from = (const int32_t *)((const char *)rows + kiri_state_rows_read_offset(nd->src[3]));
    const int64_t E = u->ne[0], n = u->ne[1], K = w->ne[0], slots = st->ne[1];
    int64_t c0, c1;
    split_rows_aligned(E, 16, ith, nth, &c0, &c1);
    const int64_t nc = c1 - c0;
    float *wt = (float *)work_mine(be, ith); /* K x nc, node_work_size's */
    for (int64_t c = c0; c < c1; c++) {
        const float *wc = (const float *)((const char *)w->data + (size_t)c * w->nb[1]);
        for (int64_t k = 0; k < K; k++)
            wt[k * nc + c - c0] = wc[k];
    }
    for (int64_t t = 0; t < n && nc > 0; t++) {
        const int32_t r = rows[t], f = from[t];
        if (r < 0 || r >= slots || f < 0 || f >= slots)
            continue; /* rows are validated by the runtime; never touch outside the state */
        float *state = (float *)((char *)st->data + (size_t)r * st->nb[1]);
        const float *prev = (const float *)((const char *)st->data + (size_t)f * st->nb[1]);
        for (int64_t k = 0; k + 1 < K; k++)
            if (pos[t] == 0)
                memset(state + k * E + c0, 0, (size_t)nc * sizeof(float));
            else if (f != r)
                memcpy(state + k * E + c0, prev + k * E + c0, (size_t)nc * sizeof(float));
        conv(state + c0, (size_t)E, wt, (size_t)nc, K, (const float *)row_ptr(u, t) + c0, nd->p.conv_silu, nc,
             (float *)row_ptr(nd->dst, t) + c0);
    }
}

static float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

/* dst = src[0] * sigmoid(src[1]), row by row (KIRI_OP_SIGMOID_MUL). */
static void run_sigmoid_mul(const struct kiri_node *nd, int ith, int nth)
{
    const int64_t n = nd->src[0]->ne[0];
    int64_t r0, r1;
    split_rows(n_rows(nd->src[0]), ith, nth, &r0, &r1);
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)row_ptr(nd->src[0], r), *g = (const float *)row_ptr(nd->src[1], r);
        float *y = (float *)row_ptr(nd->dst, r);
        for (int64_t i = 0; i < n; i++)
            y[i] = x[i] * sigmoid(g[i]);
    }
}

/* A Gated DeltaNet layer's gates (KIRI_OP_DELTA_GATES), token by token: beta = sigmoid(b), then
 * g = softplus(a + dt) * A, softplus as llama.cpp writes it (the identity past 20). */
static void run_delta_gates(const struct kiri_node *nd, int ith, int nth)
{
    const struct kiri_tensor *b = nd->src[0], *a = nd->src[1];
    const float *dt = nd->src[2]->data, *A = nd->src[3]->data;
    const int64_t H = b->ne[0];
    int64_t t0, t1;
    split_rows(b->ne[1], ith, nth, &t0, &t1);
    for (int64_t t = t0; t < t1; t++) {
        const float *bt = (const float *)row_ptr(b, t), *at = (const float *)row_ptr(a, t);
        float *y = (float *)row_ptr(nd->dst, t);
        for (int64_t h = 0; h < H; h++) {
            const float x = at[h] + dt[h];
            y[h] = sigmoid(bt[h]);
            y[H + h] = (x > 20.0f ? x : logf(1.0f + expf(x))) * A[h];
        }
    }
}

/* The gated delta rule (KIRI_OP_DELTA_NET). Heads are independent, so each worker takes a range
 * of value heads and walks the step's tokens in order, each token updating its sequence's state
 * of those heads (row src[3][t], after a copy from the row it reads when that differs) in place:
 * the state decays, takes the new value where its prediction for the key missed (by beta), and is
 * read by the query (kiri_cpu_delta_head, or the table's version of it). */
static void run_delta_net(struct kiri_backend *be, const struct kiri_node *nd, int ith, int nth)
{
    const kiri_delta_head_fn step = be->k.delta_head ? be->k.delta_head : kiri_cpu_delta_head;
    const struct kiri_tensor *x = nd->src[0], *gates = nd->src[1], *st = nd->src[2];
    const int32_t *rows = nd->src[3]->data, *pos = nd->src[4]->data;
    const int32_t *from = (const int32_t *)((const char *)rows + kiri_state_rows_read_offset(nd->src[3]));
    const int64_t Hk = nd->p.delta.n_head_k, Hv = nd->p.delta.n_head_v, S = nd->p.delta.head_dim;
    const int64_t n = x->ne[1], slots = st->ne[1];
    int64_t h0, h1;
    split_rows(Hv, ith, nth, &h0, &h1);
    for (int64_t t = 0; t < n; t++) {
        const int32_t r = rows[t], f = from[t];
        if (r < 0 || r >= slots || f < 0 || f >= slots)
            continue; /* rows are validated by the runtime; never touch outside the state */
        const float *xt = (const float *)row_ptr(x, t), *gt = (const float *)row_ptr(gates, t);
        float *y = (float *)row_ptr(nd->dst, t);
        for (int64_t h = h0; h < h1; h++) {
            float *M = (float *)((char *)st->data + (size_t)r * st->nb[1]) + h * S * S;
            const float *prev = (const float *)((const char *)st->data + (size_t)f * st->nb[1]) + h * S * S;
            const float *q = xt + (h % Hk) * S, *k = xt + Hk * S + (h % Hk) * S, *v = xt + 2 * Hk * S + h * S;
            const float beta = gt[h], decay = expf(gt[Hv + h]);
            if (pos[t] == 0)
                memset(M, 0, (size_t)(S * S) * sizeof(float));
            else if (f != r)
                memcpy(M, prev, (size_t)(S * S) * sizeof(float));
            step(M, q, k, v, beta, decay, nd->p.delta.scale, S, y + h * S);
        }
    }
}

/* The first key a token with n keys attends: with a sliding window only the last `window` keys
 * (the table entries of the blocks before that key are never read). */
static int32_t attention_first(int32_t n, int window)
{
    return window > 0 && n > window ? n - window : 0;
}

/* Token t's key count from the step's metadata; a negative one, or one whose keys read outnumber
 * the cache's slots, counts as none. With a window the count itself may pass the slots: a cache
 * may keep a sliding-window layer's window only (runtime/kvcache.h). */
static int32_t attention_n_kv(const int32_t *meta, int64_t t, int64_t slots_cap, int window)
{
    const int32_t n = meta[2 * t];
    return n < 0 || n - attention_first(n, window) > slots_cap ? 0 : n;
}

/* Cost of one (token, head) pair of attention: the keys it attends, plus a fixed share for the
 * query's own work. */
static int64_t attention_cost(const int32_t *meta, int64_t t, int64_t slots_cap, int window)
{
    const int32_t n = attention_n_kv(meta, t, slots_cap, window);
    return n - attention_first(n, window) + 16;
}

/* The first (token, head) pair whose work starts at or after `target` (in attention_cost units). */
static int64_t attention_pair_at(const int32_t *meta, int64_t n_tok, int n_head, int64_t slots_cap,
                                 int window, int64_t target)
{
    int64_t sum = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        const int64_t c = attention_cost(meta, t, slots_cap, window);
        if (sum + c * n_head > target) {
            const int64_t k = target > sum ? (target - sum + c - 1) / c : 0;
            return t * n_head + k;
        }
        sum += c * n_head;
    }
    return n_tok * n_head;
}

/* The (token, head) pairs [*j0, *j1) that worker ith of nth takes. Tokens of a prompt see ever more
 * keys (its last one all of them, its first one only itself), so the pairs are split by their
 * cost rather than their count: otherwise the worker with the prompt's end does most of the work
 * while the others wait. */
static void split_attention(const int32_t *meta, int64_t n_tok, int n_head, int64_t slots_cap, int window,
                            int ith, int nth, int64_t *j0, int64_t *j1)
{
    int64_t total = 0;
    for (int64_t t = 0; t < n_tok; t++)
        total += attention_cost(meta, t, slots_cap, window) * n_head;
    *j0 = attention_pair_at(meta, n_tok, n_head, slots_cap, window, total * ith / nth);
    *j1 = ith == nth - 1 ? n_tok * n_head
                         : attention_pair_at(meta, n_tok, n_head, slots_cap, window, total * (ith + 1) / nth);
}

/* The cache slots of a sequence's keys [first, n), from its block table (slots[0] is key first's):
 * only the entries of the blocks holding them are read. */
static void attention_slots(int32_t *slots, const int32_t *table, int first, int n, int block_size)
{
    for (int i = first; i < n; i++)
        slots[i - first] = table[i / block_size] * block_size + i % block_size;
}

/* Whether two tokens of the step share a sequence (the same block table): a prompt, whose tokens
 * attention takes in tiles. */
static int attention_has_prompt(const int32_t *meta, int64_t n_tok)
{
    for (int64_t t = 1; t < n_tok; t++)
        if (meta[2 * t + 1] == meta[2 * t - 1])
            return 1;
    return 0;
}

/* Attention in tiles (kiri_attend_tile_fn): runs of up to `per` consecutive tokens of one sequence
 * times the heads of a key/value head (in chunks of at most KIRI_ATTEND_TILE_ROWS), each tile
 * reading its keys and values once. Tiles go round-robin to the workers: consecutive tiles cost
 * about the same, while a prompt's later tokens see more keys than its first ones. */
static void run_attention_tiles(struct kiri_backend *be, const struct kiri_node *nd, int ith, int nth)
{
    const struct kiri_tensor *q = nd->src[0], *kc = nd->src[1], *vc = nd->src[2];
    const int32_t *meta = nd->src[3]->data;
    const int32_t *tables = nd->src[4]->data;
    const struct kiri_attn_params *p = &nd->p.attn;
    const int64_t n_tok = q->ne[2];
    const int group = p->n_head / p->n_head_kv;
    const int heads = group < KIRI_ATTEND_TILE_ROWS ? group : KIRI_ATTEND_TILE_ROWS;
    const int chunks = (group + heads - 1) / heads;
    const int per = KIRI_ATTEND_TILE_ROWS / heads;
    const size_t slots_cap = (size_t)kc->ne[1];
    char *mine = work_mine(be, ith);
    float *scores = (float *)mine;
    int32_t *slots = (int32_t *)(mine + slots_cap * ATTN_SCORES * sizeof(float));
    const size_t kv_row = kiri_row_bytes(kc->type, (int64_t)p->head_dim);
    const size_t q_tok = q->nb[2] / sizeof(float), q_head = q->nb[1] / sizeof(float);
    const size_t out_tok = nd->dst->nb[1] / sizeof(float);
    int64_t unit = 0;
    for (int64_t t0 = 0, t1; t0 < n_tok; t0 = t1) {
        /* The run's keys are [base, n_max): token i sees [first[i], n_kv[i]) of them. */
        int32_t first[KIRI_ATTEND_TILE_ROWS], n_kv[KIRI_ATTEND_TILE_ROWS];
        int n_max = 0, base = INT32_MAX;
        for (t1 = t0; t1 < n_tok && t1 - t0 < per && meta[2 * t1 + 1] == meta[2 * t0 + 1]; t1++) {
            const int32_t n = attention_n_kv(meta, t1, (int64_t)slots_cap, p->window);
            const int32_t f = attention_first(n, p->window);
            if (t1 > t0 && (n > n_max ? n : n_max) - (f < base ? f : base) > (int64_t)slots_cap)
                break; /* the run's keys must fit its slot list */
            first[t1 - t0] = f;
            n_kv[t1 - t0] = n;
            n_max = n > n_max ? n : n_max;
            base = first[t1 - t0] < base ? first[t1 - t0] : base;
        }
        for (int64_t i = 0; i < t1 - t0; i++) {
            first[i] -= base;
            n_kv[i] -= base;
        }
        int built = 0;
        for (int hk = 0; hk < p->n_head_kv; hk++)
            for (int c = 0; c < chunks; c++, unit++) {
                if (unit % nth != ith)
                    continue;
                if (!built) { /* the run's tokens share one table */
                    attention_slots(slots, tables + meta[2 * t0 + 1], base, n_max, p->block_size);
                    built = 1;
                }
                const int h = hk * group + c * heads;
                const int n_q = group - c * heads < heads ? group - c * heads : heads;
                const float *qh = (const float *)q->data + (size_t)t0 * q_tok + (size_t)h * q_head;
                float *out = (float *)nd->dst->data + (size_t)t0 * out_tok + (size_t)h * (size_t)p->head_dim;
                be->k.attend_tile(qh, q_tok, q_head, (int)(t1 - t0), n_q, (const char *)kc->data + (size_t)hk * kv_row,
                                  kc->nb[1], (const char *)vc->data + (size_t)hk * kv_row, vc->nb[1], kc->type, slots,
                                  first, n_kv, p->head_dim, p->scale, scores, out, out_tok, (size_t)p->head_dim);
            }
    }
}

static void run_attention(struct kiri_backend *be, const struct kiri_node *nd, int ith, int nth)
{
    if (be->k.attend_tile && attention_has_prompt(nd->src[3]->data, nd->src[0]->ne[2])) {
        run_attention_tiles(be, nd, ith, nth);
        return;
    }
    const struct kiri_tensor *q = nd->src[0], *kc = nd->src[1], *vc = nd->src[2];
    const int32_t *meta = nd->src[3]->data;
    const int32_t *tables = nd->src[4]->data;
    const struct kiri_attn_params *p = &nd->p.attn;
    const int64_t n_tok = q->ne[2];
    const int group = p->n_head / p->n_head_kv;
    const size_t slots_cap = (size_t)kc->ne[1];
    char *mine = work_mine(be, ith);
    float *scores = (float *)mine;
    int32_t *slots = (int32_t *)(mine + slots_cap * ATTN_SCORES * sizeof(float));
    const size_t kv_row = kiri_row_bytes(kc->type, (int64_t)p->head_dim);
    const kiri_attend_fn attend = be->k.attend_head ? be->k.attend_head : kiri_cpu_attend_head;

    /* Split (token, head) pairs; the slot list is rebuilt when the token changes. The heads of a
     * worker's share that use the same key/value head go to attend_group together. */
    int64_t j0, j1;
    split_attention(meta, n_tok, p->n_head, (int64_t)slots_cap, p->window, ith, nth, &j0, &j1);
    int64_t built_for = -1;
    int n_kv = 0;
    for (int64_t j = j0; j < j1;) {
        const int64_t t = j / p->n_head;
        const int h = (int)(j % p->n_head);
        if (t != built_for) {
            const int32_t n = attention_n_kv(meta, t, (int64_t)slots_cap, p->window);
            const int32_t first = attention_first(n, p->window);
            attention_slots(slots, tables + meta[2 * t + 1], first, n, p->block_size);
            n_kv = n - first;
            built_for = t;
        }
        const int hk = h / group;
        int n_q = (hk + 1) * group - h; /* the rest of this key/value head's group */
        if (j + n_q > j1)
            n_q = (int)(j1 - j);
        if (!be->k.attend_group)
            n_q = 1;
        const float *qh = (const float *)((const char *)q->data + (size_t)t * q->nb[2] +
                                          (size_t)h * q->nb[1]);
        float *out = (float *)((char *)nd->dst->data + (size_t)t * nd->dst->nb[1]) +
                     (size_t)h * (size_t)p->head_dim;
        const char *k = (const char *)kc->data + (size_t)hk * kv_row;
        const char *v = (const char *)vc->data + (size_t)hk * kv_row;
        if (n_q > 1)
            be->k.attend_group(qh, q->nb[1] / sizeof(float), n_q, k, kc->nb[1], v, vc->nb[1], kc->type,
                               slots, n_kv, p->head_dim, p->scale, scores, out, (size_t)p->head_dim);
        else
            attend(qh, k, kc->nb[1], v, vc->nb[1], kc->type, slots, n_kv, p->head_dim, p->scale, scores, out);
        j += n_q;
    }
}

/* Rows of the weight per gemm call in steps of several tokens: their bytes (at most a few hundred
 * KiB) stay in L2 while every token of the step passes over them, so the weights stream from
 * memory once per step. */
#define GEMM_ROWS 64
/* Steps of up to this many tokens (a serving step's decoding sequences, more than the kernel
 * streams at once) are compute-light enough per weight byte to wait on memory: their products go
 * GEMM_SUB_ROWS rows at a time, each call preceded by a prefetch into L2 of the rows GEMM_ROWS
 * further on, so the weights arrive while earlier rows are multiplied (TinyLlama Q4_0, 2 threads,
 * a step of 8 tokens: 58 -> 76 tok/s on the AVX2 tier, 110 -> 139 on AVX-512). */
#define GEMM_PREFETCH_TOKENS 16
#define GEMM_SUB_ROWS 16

/* Memory-bound products (one token, or the 2 to 4 a kernel streams together) split by a fixed
 * share per worker leave the others waiting at the next barrier whenever one worker is held up
 * (the VM, an interrupt, a slower path to memory). Workers instead claim runs of output rows, each
 * a 2·nth-th of the rows not yet claimed (at least CLAIM_MIN_ROWS, in multiples of 16 so the
 * kernels' row groups and the output's cache lines stay whole): the first runs are long enough for
 * the kernels' prefetch to run on, the last short enough to even out the end (TinyLlama Q4_0,
 * AVX2 tier, 2 threads: the barrier spin fell from 8.6% of a decode's samples to 1.6%, decode
 * 49.4 -> 51.1 tok/s, steps of 2 tokens 66 -> 71). Steps of 5 to 16 tokens keep their fixed
 * shares: their prefetch runs GEMM_ROWS ahead within a share, and runs cut it short (8 tokens:
 * 75 -> 68 tok/s with runs). */
#define CLAIM_MIN_ROWS 32

static int claim_rows(_Atomic int64_t *claimed, int64_t n, int nth, int64_t *r0, int64_t *r1)
{
    int64_t start = atomic_load_explicit(claimed, memory_order_relaxed), end;
    do {
        if (start >= n)
            return 0;
        int64_t len = (n - start) / (2 * nth);
        len = len < CLAIM_MIN_ROWS ? CLAIM_MIN_ROWS : (len + 15) / 16 * 16;
        end = n - start < len ? n : start + len;
    } while (!atomic_compare_exchange_weak_explicit(claimed, &start, end, memory_order_relaxed,
                                                    memory_order_relaxed));
    *r0 = start;
    *r1 = end;
    return 1;
}

/* Products: the activation rows are first converted to the weight's dot-product type (into the
 * shared scratch by all workers, then a barrier; or, for one token, by each worker into its own
 * scratch; or not at all when the previous product converted the same rows), then each worker
 * computes a slice of the weight's rows across all tokens, so a weight row is read once per step
 * however many tokens the step has. */
static void run_matmul(struct kiri_backend *be, const struct kiri_node *nd, unsigned plan,
                       _Atomic int64_t *claimed, int ith, int nth)
{
    const struct kiri_tensor *w = nd->src[0], *x = nd->src[1];
    const int vt = kiri_cpu_vec_dot_type(w->type);
    const int64_t k = x->ne[0], n = n_rows(x);
    const size_t act_row = kiri_row_bytes(vt, k);
    char *act = plan & PLAN_MINE ? work_mine(be, ith) : be->work;
    if (!(plan & PLAN_REUSE)) {
        int64_t r0 = 0, r1 = n;
        if (!(plan & PLAN_MINE))
            split_rows(n, ith, nth, &r0, &r1);
        for (int64_t r = r0; r < r1; r++) {
            const float *src = (const float *)row_ptr(x, r);
            if (vt == KIRI_TYPE_F32)
                memcpy(act + (size_t)r * act_row, src, (size_t)k * sizeof(float));
            else
                be->k.from_float[vt](src, act + (size_t)r * act_row, k);
        }
        if (!(plan & PLAN_MINE))
            be->threads.barrier(be->threads.pool);
    }

    const int64_t n_out = w->ne[1];
    const kiri_gemm_fn gemm = be->k.gemm[w->type];
    const struct kiri_tensor *y = nd->dst;
    int64_t o0, o1;
    split_rows_aligned(n_out, 16, ith, nth, &o0, &o1);
    /* The tile kernels address output rows by one stride: the output must be a plain matrix. */
    if (gemm && n_rows(y) == y->ne[1] && y->nb[1] % sizeof(float) == 0) {
        const char *wr = (const char *)w->data;
        float *yr = (float *)y->data;
        const size_t ys = y->nb[1] / sizeof(float);
        /* One token, or a small batch the kernel streams once for all its tokens: rows in
         * shrinking runs claimed by whichever worker is free (claim_rows), so the kernel's
         * prefetch runs on across tiles and a worker held up does not hold up the barrier. */
        if (n == 1 || n <= be->k.gemm_stream[w->type]) {
            int64_t r0, r1;
            while (claim_rows(claimed, n_out, nth, &r0, &r1))
                gemm(k, wr + (size_t)r0 * w->nb[1], w->nb[1], act, act_row, yr + r0, ys, r1 - r0, n);
            return;
        }
        const int ahead = n <= GEMM_PREFETCH_TOKENS; /* see GEMM_PREFETCH_TOKENS */
        const int64_t rows = ahead ? GEMM_SUB_ROWS : GEMM_ROWS;
        for (int64_t ob = o0; ob < o1; ob += rows) {
            const int64_t nr = o1 - ob < rows ? o1 - ob : rows;
            const int64_t pf = ob + GEMM_ROWS, pe = pf + rows < o1 ? pf + rows : o1;
            for (size_t b = 0; ahead && pf < pe && b < (size_t)(pe - pf) * w->nb[1]; b += 64)
                __builtin_prefetch(wr + (size_t)pf * w->nb[1] + b, 0, 2);
            gemm(k, wr + (size_t)ob * w->nb[1], w->nb[1], act, act_row, yr + ob, ys, nr, n);
        }
        return;
    }
    const kiri_vec_dot_fn dot = be->k.vec_dot[w->type];
    const int64_t tile = 16;
    for (int64_t ob = o0; ob < o1; ob += tile) {
        const int64_t oe = ob + tile < o1 ? ob + tile : o1;
        for (int64_t t = 0; t < n; t++) {
            const char *a = act + (size_t)t * act_row;
            float *yt = (float *)row_ptr(y, t);
            for (int64_t o = ob; o < oe; o++)
                dot(k, &yt[o], (const char *)w->data + (size_t)o * w->nb[1], a);
        }
    }
}

static void worker(void *arg, int ith, int nth)
{
    struct kiri_backend *be = arg;
    for (int i = 0; i < be->n_nodes; i++) {
        const struct kiri_node *nd = &be->nodes[i];
        if (be->plan[i] & PLAN_SYNC)
            be->threads.barrier(be->threads.pool);
        switch (nd->op) {
        case KIRI_OP_GET_ROWS: run_get_rows(nd, ith, nth); break;
        case KIRI_OP_RMS_NORM: run_rms_norm(be, nd, ith, nth); break;
        case KIRI_OP_ADD:
        case KIRI_OP_MUL: run_binary(nd, ith, nth); break;
        case KIRI_OP_SWIGLU:
            run_glu(nd, be->k.swiglu_row ? be->k.swiglu_row : kiri_cpu_swiglu_row, ith, nth);
            break;
        case KIRI_OP_GEGLU:
            run_glu(nd, be->k.geglu_row ? be->k.geglu_row : kiri_cpu_geglu_row, ith, nth);
            break;
        case KIRI_OP_SCALE:
            run_map(nd, be->k.scale_row ? be->k.scale_row : kiri_cpu_scale_row, nd->p.scale, ith, nth);
            break;
        case KIRI_OP_SOFTCAP:
            run_map(nd, be->k.softcap_row ? be->k.softcap_row : kiri_cpu_softcap_row, nd->p.softcap, ith, nth);
            break;
        case KIRI_OP_ROPE: run_rope(nd, ith, nth); break;
        case KIRI_OP_STORE_KV: run_store_kv(be, nd, ith, nth); break;
        case KIRI_OP_ATTENTION: run_attention(be, nd, ith, nth); break;
        case KIRI_OP_MATMUL: run_matmul(be, nd, be->plan[i], &be->claimed[i], ith, nth); break;
        case KIRI_OP_SHORT_CONV: run_short_conv(be, nd, ith, nth); break;
        case KIRI_OP_SIGMOID_MUL: run_sigmoid_mul(nd, ith, nth); break;
        case KIRI_OP_DELTA_GATES: run_delta_gates(nd, ith, nth); break;
        case KIRI_OP_DELTA_NET: run_delta_net(be, nd, ith, nth); break;
        default: break;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * The barrier plan of a step
 * ------------------------------------------------------------------------------------------- */

/* The bytes a tensor spans, [lo, hi); empty for a tensor without host data or elements. */
struct span {
    const char *lo, *hi;
};

static struct span tensor_span(const struct kiri_tensor *t)
{
    struct span s = {NULL, NULL};
    if (!t || !t->data || t->ne[0] <= 0 || t->ne[1] <= 0 || t->ne[2] <= 0 || t->ne[3] <= 0)
        return s;
    size_t end = kiri_row_bytes(t->type, t->ne[0]);
    for (int d = 1; d < KIRI_MAX_DIMS; d++)
        end += (size_t)(t->ne[d] - 1) * t->nb[d];
    s.lo = (const char *)t->data;
    s.hi = s.lo + end;
    return s;
}

static int spans_overlap(struct span a, struct span b) { return a.lo < b.hi && b.lo < a.hi; }

/* What the nodes since the last barrier read and wrote. A node's reads are its sources, its
 * write its destination; products that convert activations for all workers also write the shared
 * scratch, and every product reads the scratch its activations are in. */
#define PLAN_MAX_SPANS 64

struct interval {
    struct span rd[PLAN_MAX_SPANS], wr[PLAN_MAX_SPANS];
    int n_rd, n_wr;
    int shared_rd; /* the shared scratch (written only before a product's own barrier) */
};

static int conflicts(const struct interval *iv, const struct span *rd, int n_rd, struct span wr)
{
    for (int j = 0; j < iv->n_wr; j++) {
        if (spans_overlap(wr, iv->wr[j]))
            return 1;
        for (int r = 0; r < n_rd; r++)
            if (spans_overlap(rd[r], iv->wr[j]))
                return 1;
    }
    for (int j = 0; j < iv->n_rd; j++)
        if (spans_overlap(wr, iv->rd[j]))
            return 1;
    return 0;
}

/* Decides for every node whether a barrier must come first and how products convert their
 * activations. Workers may run ahead into the next node only when it neither reads what a node
 * since the last barrier wrote nor writes what such a node read or wrote: then no worker can see
 * another's half-done rows. Worker-private scratch never conflicts; the shared scratch does. */
static void plan_step(struct kiri_backend *be, const struct kiri_node *nodes, int n_nodes)
{
    struct interval iv;
    memset(&iv, 0, sizeof iv);
    for (int i = 0; i < n_nodes; i++) {
        const struct kiri_node *nd = &nodes[i];
        unsigned plan = 0;
        struct span rd[KIRI_OP_MAX_SRC];
        int n_rd = 0;
        for (int j = 0; j < KIRI_OP_MAX_SRC; j++)
            if (nd->src[j]) {
                const struct span s = tensor_span(nd->src[j]);
                if (s.lo)
                    rd[n_rd++] = s;
            }
        const struct span wr = tensor_span(nd->dst);
        int uses_shared = 0, writes_shared = 0;
        if (nd->op == KIRI_OP_MATMUL) {
            const struct kiri_node *prev = i > 0 ? &nodes[i - 1] : NULL;
            const struct kiri_tensor *x = nd->src[1];
            if (n_rows(x) == 1)
                plan |= PLAN_MINE;
            if (prev && prev->op == KIRI_OP_MATMUL && prev->src[1] && prev->src[1]->data == x->data &&
                prev->src[1]->type == x->type && memcmp(prev->src[1]->ne, x->ne, sizeof x->ne) == 0 &&
                memcmp(prev->src[1]->nb, x->nb, sizeof x->nb) == 0 &&
                kiri_cpu_vec_dot_type(prev->src[0]->type) == kiri_cpu_vec_dot_type(nd->src[0]->type) &&
                !spans_overlap(tensor_span(prev->dst), tensor_span(x)))
                plan |= PLAN_REUSE;
            uses_shared = !(plan & PLAN_MINE);
            writes_shared = uses_shared && !(plan & PLAN_REUSE);
        }
        const int sync = i > 0 && (conflicts(&iv, rd, n_rd, wr) || (writes_shared && iv.shared_rd) ||
                                   iv.n_rd + n_rd > PLAN_MAX_SPANS || iv.n_wr + 1 > PLAN_MAX_SPANS);
        if (sync) {
            plan |= PLAN_SYNC;
            memset(&iv, 0, sizeof iv);
        }
        for (int r = 0; r < n_rd; r++)
            iv.rd[iv.n_rd++] = rd[r];
        if (wr.lo)
            iv.wr[iv.n_wr++] = wr;
        /* A converting product meets the others at its own barrier before it reads the shared
         * scratch; after it, the scratch only has readers. */
        if (uses_shared)
            iv.shared_rd = 1;
        be->plan[i] = (uint8_t)plan;
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
    if (cfg->cpu_features & KIRI_CPU_AVX2) {
        kiri_cpu_kernels_init_avx2(&be->k);
        kiri_cpu_kernels_init_gemm_avx2(&be->k);
        kiri_cpu_kernels_init_ops_avx2(&be->k);
        const uint32_t vnni = KIRI_CPU_AVX512 | KIRI_CPU_AVX512_VNNI;
        if ((cfg->cpu_features & vnni) == vnni) {
            kiri_cpu_kernels_init_gemm_avx512(&be->k);
            kiri_cpu_kernels_init_ops_avx512(&be->k);
        }
    }
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
    free(be->plan);
    free(be->claimed);
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
        return (t == KIRI_TYPE_F32 || t == KIRI_TYPE_F16 || t == KIRI_TYPE_Q8_0) &&
               (nd->op != KIRI_OP_ATTENTION || nd->p.attn.window >= 0);
    }
    if (nd->op == KIRI_OP_SOFTCAP)
        return nd->p.softcap > 0.0f;
    if (nd->op == KIRI_OP_SHORT_CONV)
        return kiri_node_short_conv_ok(nd, KIRI_SHORT_CONV_MAX_TAPS);
    if (nd->op == KIRI_OP_SIGMOID_MUL)
        return kiri_node_all_f32(nd, 2) && nd->src[1]->ne[0] == nd->src[0]->ne[0] &&
               n_rows(nd->src[1]) == n_rows(nd->src[0]);
    if (nd->op == KIRI_OP_DELTA_GATES)
        return kiri_node_delta_gates_ok(nd);
    if (nd->op == KIRI_OP_DELTA_NET)
        return kiri_node_delta_net_ok(nd, DELTA_MAX_HEAD);
    return nd->op >= 0 && nd->op < KIRI_OP_COUNT;
}

static int cpu_compute(struct kiri_backend *be, const struct kiri_node *nodes, int n_nodes)
{
    const int nth = be->threads.n > 0 ? be->threads.n : 1;
    size_t shared = 0, mine = 0;
    for (int i = 0; i < n_nodes; i++) {
        size_t s, m;
        node_work_size(&nodes[i], &s, &m);
        shared = s > shared ? s : shared;
        mine = m > mine ? m : mine;
    }
    const size_t need = shared + (size_t)nth * mine;
    if (need > be->work_size) {
        char *w = aligned_alloc(WORK_ALIGN, align_up(need));
        if (!w)
            return -1;
        free(be->work);
        be->work = w;
        be->work_size = align_up(need);
    }
    be->work_shared = shared;
    be->work_mine = mine;
    if (n_nodes > be->plan_cap) {
        uint8_t *p = malloc((size_t)n_nodes);
        _Atomic int64_t *c = malloc((size_t)n_nodes * sizeof *c);
        if (!p || !c) {
            free(p);
            free(c);
            return -1;
        }
        free(be->plan);
        free(be->claimed);
        be->plan = p;
        be->claimed = c;
        be->plan_cap = n_nodes;
    }
    for (int i = 0; i < n_nodes; i++) /* published to the workers by the pool's start of a run */
        atomic_store_explicit(&be->claimed[i], 0, memory_order_relaxed);
    plan_step(be, nodes, n_nodes);
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
