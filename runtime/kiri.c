/* The public API (kiri.h) over the engine's modules. A context is a one-sequence client of the
 * continuous-batching loop (batcher.c), driven from the caller's thread: generation, stop strings
 * and finish reasons exist only there. */
#include "kiri.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "backends.h"
#include "batcher.h"
#include "buf.h"
#include "error.h"
#include "gguf.h"
#include "graph.h"
#include "mem.h"
#include "model.h"
#include "platform.h"
#include "sampler.h"
#include "tokenizer.h"
#include "utf8.h"

struct kiri_context {
    struct kiri_model *model;     /* borrowed */
    struct kiri_batcher *batcher; /* owned: one sequence, no loop thread */
    /* The sequence kiri_context_eval builds: held in the batcher while n_held > 0. */
    uint64_t held_id;
    int32_t n_held;
    const float *logits;          /* of the held sequence's last token, from its last event */
    int held_status;              /* why the held sequence ended with an error (0: it did not) */
    _Atomic int cancel;
};

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

void kiri_model_params_default(struct kiri_model_params *p)
{
    memset(p, 0, sizeof *p);
    p->backend = "auto";
    p->gpu_layers = -1;
}

int kiri_model_open(const char *path, const struct kiri_model_params *params, struct kiri_model **out,
                    struct kiri_status_info *info)
{
    kiri_error_clear(info);
    struct kiri_model_params def;
    if (!params) {
        kiri_model_params_default(&def);
        params = &def;
    }
    if (!path || !out)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "model path and output are required");
    struct kiri_gguf *g = NULL;
    int rc = kiri_gguf_open(path, &g, info);
    if (rc < 0)
        return rc;
    if ((rc = kiri_model_load(g, params, out, info)) < 0)
        return rc;
    struct kiri_model *m = *out;
    const char *main_be = m->iface && m->iface->name ? m->iface->name : "cpu";
    if (m->n_offload > 0 && m->off_iface && m->off_iface->name)
        snprintf(m->backend_name, sizeof m->backend_name, "%s+%s", m->off_iface->name, main_be);
    else
        snprintf(m->backend_name, sizeof m->backend_name, "%s", main_be);
    return KIRI_OK;
}

void kiri_model_close(struct kiri_model *model) { kiri_model_free(model); }

int32_t kiri_model_n_vocab(const struct kiri_model *m) { return m->hp.n_vocab; }
int32_t kiri_model_n_ctx_train(const struct kiri_model *m) { return m->hp.n_ctx_train; }
int32_t kiri_model_bos(const struct kiri_model *m) { return kiri_tokenizer_bos(m->tokenizer); }
int32_t kiri_model_eos(const struct kiri_model *m) { return kiri_tokenizer_eos(m->tokenizer); }

int kiri_model_is_eog(const struct kiri_model *m, int32_t token)
{
    return kiri_tokenizer_is_eog(m->tokenizer, token);
}

int kiri_model_add_bos(const struct kiri_model *m) { return kiri_tokenizer_add_bos(m->tokenizer); }

int kiri_model_meta_str(const struct kiri_model *m, const char *key, const char **text, size_t *len)
{
    struct kiri_gguf_str str = {0};
    if (!m || !key || !text || !len || kiri_gguf_get_str(m->gguf, key, 0, &str, NULL) != KIRI_OK || !str.ptr)
        return KIRI_E_INVALID_ARG;
    *text = str.ptr;
    *len = (size_t)str.len;
    return KIRI_OK;
}

uint64_t kiri_model_file_bytes(const struct kiri_model *m) { return (uint64_t)kiri_gguf_file_size(m->gguf); }

const char *kiri_model_backend_name(const struct kiri_model *m) { return m->backend_name; }

int kiri_model_file_check(const char *path, struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!path)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "a path is required");
    struct kiri_gguf *g = NULL;
    const int rc = kiri_gguf_open(path, &g, info);
    if (rc == KIRI_OK)
        kiri_gguf_close(g);
    return rc;
}

/* The describing texts are built whole in a kiri_buf, then given to the caller's fixed buffer cut
 * as snprintf cuts (nothing when memory ran out). */
static void copy_out(struct kiri_buf *b, char *buf, size_t cap)
{
    const size_t n = b->failed ? 0 : b->len < cap - 1 ? b->len : cap - 1;
    if (n)
        memcpy(buf, b->data, n);
    buf[n] = '\0';
    kiri_buf_free(b);
}

/* The lines only some families need: sliding-window layers, layers without RoPE, multipliers. */
static void describe_family(const struct kiri_model *m, struct kiri_buf *text)
{
    const struct kiri_hparams *hp = &m->hp;
    int n_swa = 0, n_norope = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        n_swa += m->layers[l].swa;
        n_norope += !m->layers[l].rope;
    }
    if (hp->swa_window > 0) {
        char pattern[64];
        if (hp->swa_pattern > 0)
            snprintf(pattern, sizeof pattern, "pattern %d: one global layer in every %d", hp->swa_pattern,
                     hp->swa_pattern);
        else
            snprintf(pattern, sizeof pattern, "%s", n_swa == hp->n_layer ? "every layer slides" : "listed per layer");
        kiri_buf_printf(text, "sliding window: %d keys on %d of %d layers (%s); rope base %g (scale 1) there, %g on the global "
                        "layers\n", hp->swa_window, n_swa, hp->n_layer, pattern, (double)hp->rope_freq_base_swa,
                        (double)hp->rope_freq_base);
    }
    if (n_norope)
        kiri_buf_printf(text, "no rope:       on %d of %d layers\n", n_norope, hp->n_layer);
    const int n_rec = kiri_model_n_recurrent_layers(m);
    if (n_rec && hp->arch == KIRI_ARCH_QWEN35)
        kiri_buf_printf(text, "delta net:     %d of %d layers are Gated DeltaNet blocks (convolution of %d taps, %d key "
                        "and %d value heads of %d), no attention; their state: %.1f KiB per sequence (F32: the "
                        "convolution windows and the delta-rule states), taken from the kv memory, and as much again "
                        "for each token a speculative step drafts\n", n_rec,
                        hp->n_layer, hp->n_conv_taps, hp->ssm_k_heads, hp->ssm_v_heads, hp->ssm_head_dim,
                        (double)kiri_model_state_bytes(m) / 1024.0);
    else if (n_rec)
        kiri_buf_printf(text, "short conv:    %d of %d layers are gated short-convolution blocks (%d taps), no "
                        "attention; their state: %.1f KiB per sequence (F32), taken from the kv memory, and as much again for "
                        "each token a speculative step drafts\n", n_rec,
                        hp->n_layer, hp->n_conv_taps, (double)kiri_model_state_bytes(m) / 1024.0);
    if (kiri_model_has_mtp(m))
        kiri_buf_printf(text, "mtp head:      1 multi-token-prediction layer after the %d of the trunk%s%s: drafts "
                        "for --spec mtp, its keys and values %.1f KiB more per token (F16)\n", hp->n_layer,
                        m->mtp.embed != m->tok_embd ? ", its own embedding" : "",
                        m->mtp.head != m->output ? ", its own output head" : "",
                        (double)(2 * kiri_row_bytes(KIRI_TYPE_F16, (int64_t)hp->n_head_kv * hp->head_dim)) / 1024.0);
    else if (hp->n_layer_nextn)
        kiri_buf_printf(text, "mtp head:      %d multi-token-prediction layers after the %d of the trunk, loaded and "
                        "not run (--spec mtp runs one)\n", hp->n_layer_nextn, hp->n_layer);
    if (hp->arch == KIRI_ARCH_GEMMA4) {
        int ff_min = hp->n_ff, kv_min = hp->n_head_kv;
        for (int l = 0; l < hp->n_layer; l++) {
            ff_min = m->layers[l].n_ff < ff_min ? m->layers[l].n_ff : ff_min;
            kv_min = m->layers[l].n_head_kv < kv_min ? m->layers[l].n_head_kv : kv_min;
        }
        kiri_buf_printf(text, "per layer:     head size %d (global) / %d (sliding), rope over %d / %d dims, kv heads "
                        "%d..%d, feed-forward %d..%d\n", hp->head_dim, hp->head_dim_swa, hp->n_rot, hp->n_rot_swa,
                        kv_min, hp->n_head_kv, ff_min, hp->n_ff);
        if (hp->n_layer_kv < hp->n_layer)
            kiri_buf_printf(text, "shared kv:     layers %d-%d keep no keys or values; they attend layer %d's "
                            "(sliding) or %d's (global)\n", hp->n_layer_kv, hp->n_layer - 1, hp->n_layer_kv - 2,
                            hp->n_layer_kv - 1);
        if (hp->n_embd_per_layer > 0)
            kiri_buf_printf(text, "per-layer embeddings: %d per layer; their %.2f MiB table stays in the mapping, "
                            "one row read per token\n",
                            hp->n_embd_per_layer,
                            (double)(m->pl_tok_embd->nb[1] * (size_t)m->pl_tok_embd->ne[1]) / (1024.0 * 1024.0));
        if (m->n_tower_tensors)
            kiri_buf_printf(text, "text only:     the file's %d vision/audio tensors are not used\n",
                            m->n_tower_tensors);
    }
    const float default_attn = 1.0f / sqrtf((float)hp->head_dim);
    if (hp->embd_scale != 1.0f || hp->residual_scale != 1.0f || hp->logit_scale != 1.0f || hp->final_softcap > 0.0f ||
        hp->attn_scale != default_attn || hp->ffn_gelu) {
        kiri_buf_printf(text, "multipliers:  ");
        if (hp->embd_scale != 1.0f)
            kiri_buf_printf(text, " embedding x%g", (double)hp->embd_scale);
        if (hp->attn_scale != default_attn)
            kiri_buf_printf(text, " attention x%g", (double)hp->attn_scale);
        if (hp->residual_scale != 1.0f)
            kiri_buf_printf(text, " residual x%g", (double)hp->residual_scale);
        if (hp->logit_scale != 1.0f)
            kiri_buf_printf(text, " logits x%g", (double)hp->logit_scale);
        if (hp->final_softcap > 0.0f)
            kiri_buf_printf(text, " logit soft-cap %g", (double)hp->final_softcap);
        kiri_buf_printf(text, "%s\n", hp->ffn_gelu ? " (feed-forward GeGLU)" : "");
    }
}

void kiri_model_describe(const struct kiri_model *m, char *buf, size_t cap)
{
    if (!cap)
        return;
    struct kiri_buf text = {0};
    kiri_buf_printf(&text, "tokenizer:     %s (pre: %s), %d tokens\n", kiri_tokenizer_model_name(m->tokenizer),
            kiri_tokenizer_pre_name(m->tokenizer), m->hp.n_vocab);
    if (m->vocab_only) {
        kiri_buf_printf(&text, "weights:       none (vocabulary only)\n");
        copy_out(&text, buf, cap);
        return;
    }
    const struct kiri_hparams *hp = &m->hp;
    kiri_buf_printf(&text, "architecture:  %s\n", m->arch_name);
    kiri_buf_printf(&text, "layers:        %d, embedding %d, feed-forward %d\n", hp->n_layer, hp->n_embd, hp->n_ff);
    kiri_buf_printf(&text, "attention:     %d heads, %d kv heads, head size %d, rope %s over %d dims, base %g, scale %g\n",
            hp->n_head, hp->n_head_kv, hp->head_dim, hp->rope_mode == KIRI_ROPE_NEOX ? "neox" : "normal",
            hp->n_rot, (double)hp->rope_freq_base, (double)hp->rope_freq_scale);
    describe_family(m, &text);
    kiri_buf_printf(&text, "context:       %d (trained)\n", hp->n_ctx_train);
    int count[KIRI_TYPE_COUNT] = {0};
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].type >= 0 && m->tensors[i].type < KIRI_TYPE_COUNT && m->tensors[i].data != m->ones)
            count[m->tensors[i].type]++;
    kiri_buf_printf(&text, "tensor types: ");
    for (int t = 0; t < KIRI_TYPE_COUNT; t++)
        if (count[t])
            kiri_buf_printf(&text, " %s x%d", kiri_type_name(t), count[t]);
    kiri_buf_printf(&text, "%s\n", m->output == m->tok_embd ? " (tied embeddings)" : "");
    const double mib = 1024.0 * 1024.0;
    const size_t kv_tok = kiri_model_kv_bytes_per_token(m, KIRI_TYPE_F16);
    const size_t kv_window = kiri_model_kv_bytes_window(m, KIRI_TYPE_F16);
    const int n_swa = kiri_model_n_swa_layers(m);
    /* Sliding-window layers keep at most their window, or the whole context when it is shorter. */
    const int32_t kept = n_swa && hp->n_ctx_train < hp->swa_window ? hp->n_ctx_train : hp->swa_window;
    const double kv_ctx = (double)kv_tok * hp->n_ctx_train + (n_swa ? (double)kv_window * kept / hp->swa_window : 0.0);
    kiri_buf_printf(&text, "weights:       %.2f MiB mapped from the file (shared page cache, not copied)\n",
            (double)m->weight_bytes / mib);
    /* Layers that attend another layer's keys (gemma4's shared ones) store none. */
    int own_global = 0, own_swa = 0;
    for (int l = 0; l < hp->n_layer; l++) {
        const int own = m->layers[l].kv_source == l && !m->layers[l].recurrent, slides = n_swa && m->layers[l].swa;
        own_global += own && !slides;
        own_swa += own && slides;
    }
    if (n_swa)
        kiri_buf_printf(&text, "kv cache:      %.1f KiB per token (F16) in the %d global layers, plus %.2f MiB for the "
                "%d sliding-window layers' %d-token window (per sequence, whatever its length); %.2f MiB at the "
                "trained context\n", (double)kv_tok / 1024.0, own_global, (double)kv_window / mib, own_swa,
                hp->swa_window, kv_ctx / mib);
    else if (kiri_model_n_recurrent_layers(m))
        kiri_buf_printf(&text, "kv cache:      %.1f KiB per token (F16) in the %d attention layers, plus the "
                "%s state per sequence; %.2f MiB at the trained context\n", (double)kv_tok / 1024.0, own_global,
                hp->arch == KIRI_ARCH_QWEN35 ? "Gated DeltaNet" : "short-convolution", kv_ctx / mib);
    else
        kiri_buf_printf(&text, "kv cache:      %.1f KiB per token (F16); %.2f MiB at the trained context\n",
                (double)kv_tok / 1024.0, kv_ctx / mib);
    if (kiri_model_n_recurrent_layers(m))
        kiri_buf_printf(&text, "snapshots:     %.1f KiB each (the state at a block's end, in host memory), %d per "
                "sequence, taken from the kv memory for prefix reuse\n", (double)kiri_model_state_bytes(m) / 1024.0,
                KIRI_BATCHER_SNAPSHOTS_PER_SEQ);
    const uint64_t scratch = kiri_graph_scratch_bytes(m, 512, 1, 4096);
    const double state = (double)kiri_model_state_bytes(m);
    kiri_buf_printf(&text, "memory needed: %.2f MiB resident at the trained context (weights + kv%s + %.2f MiB scratch)\n",
            ((double)m->weight_bytes + kv_ctx + state + (double)scratch) / mib, state > 0 ? " + one sequence's state" : "",
            (double)scratch / mib);
    char placement[320];
    kiri_model_describe_placement(m, placement, sizeof placement);
    kiri_buf_printf(&text, "placement:     %s\n", placement);
    kiri_buf_printf(&text, "threads:       %d\n", m->threads.n);
    kiri_buf_printf(&text, "backends:\n%s", m->backend_report);
    copy_out(&text, buf, cap);
}

/* ---------------------------------------------------------------------------------------------
 * Tokens
 * ------------------------------------------------------------------------------------------- */

int kiri_tokenize(const struct kiri_model *m, const char *text, size_t len, int add_bos, int parse_special,
                  int32_t *ids, int cap)
{
    if (!m || (!text && len) || cap < 0 || (cap && !ids))
        return KIRI_E_INVALID_ARG;
    const int bos = add_bos < 0 ? kiri_tokenizer_add_bos(m->tokenizer) : add_bos;
    return kiri_tokenizer_encode(m->tokenizer, text ? text : "", len, bos, 0, parse_special, ids, cap);
}

int kiri_token_to_piece(const struct kiri_model *m, int32_t token, int render_special, char *buf, size_t cap)
{
    return kiri_tokenizer_piece(m->tokenizer, token, render_special, buf, cap);
}

int64_t kiri_detokenize(const struct kiri_model *m, const int32_t *tokens, int32_t n, char *buf, size_t cap)
{
    if (!m || n < 0 || (n && !tokens) || (cap && !buf))
        return KIRI_E_INVALID_ARG;
    struct kiri_detok_stream ds = {0};
    char stack[KIRI_DETOK_CAP];
    const size_t piece_cap = KIRI_DETOK_CAP_FOR(kiri_tokenizer_max_piece(m->tokenizer));
    char *piece = piece_cap <= sizeof stack ? stack : kiri_mem_alloc(piece_cap);
    if (!piece)
        return KIRI_E_NOMEM;
    const size_t pcap = piece_cap <= sizeof stack ? sizeof stack : piece_cap;
    uint64_t len = 0;
    int64_t rc = 0;
    for (int32_t i = 0; i <= n; i++) {
        const int k = i < n ? kiri_detok_push(m->tokenizer, &ds, tokens[i], 0, piece, pcap)
                            : kiri_detok_flush(&ds, piece, pcap);
        if (k < 0) {
            rc = k;
            break;
        }
        if (k > 0 && len + (uint64_t)k <= cap) /* buf may be NULL when cap is 0 */
            memcpy(buf + len, piece, (size_t)k);
        len += (uint64_t)k;
    }
    if (piece != stack)
        kiri_mem_free(piece);
    return rc < 0 ? rc : (int64_t)len;
}

/* ---------------------------------------------------------------------------------------------
 * Contexts
 * ------------------------------------------------------------------------------------------- */

void kiri_context_params_default(struct kiri_context_params *p)
{
    memset(p, 0, sizeof *p);
    p->n_batch = 512;
    p->kv_type = 1;
}

int kiri_context_init(struct kiri_model *m, const struct kiri_context_params *params, struct kiri_context **out,
                      struct kiri_status_info *info)
{
    kiri_error_clear(info);
    struct kiri_context_params def;
    if (!params) {
        kiri_context_params_default(&def);
        params = &def;
    }
    if (!m || !out)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "model and output are required");
    if (m->vocab_only)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the model was opened for its vocabulary only");
    int32_t n_ctx = params->n_ctx > 0 ? params->n_ctx : m->hp.n_ctx_train;
    if (n_ctx > (1 << 24))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "n_ctx %d is too large", n_ctx);
    int32_t n_batch = params->n_batch > 0 ? params->n_batch : 512;
    if (n_batch > n_ctx)
        n_batch = n_ctx;
    if (n_batch > 8192)
        n_batch = 8192;

    struct kiri_context *c = kiri_mem_calloc(1, sizeof *c);
    if (!c)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    c->model = m;
    /* One sequence of n_ctx tokens, n_batch prompt tokens per step. Without prefix sharing a
     * context computes every position itself, as its callers (reference checks) expect. */
    struct kiri_batcher_params bp;
    kiri_batcher_params_default(&bp);
    bp.n_ctx = n_ctx;
    bp.max_seqs = 1;
    bp.chunk = n_batch;
    bp.queue_cap = 1;
    bp.kv_type = params->kv_type;
    bp.prefix_cache = 0;
    bp.draft_model = params->draft_model;
    bp.spec_states = params->speculative || params->mtp ? -1 : 0;
    bp.mtp = params->mtp;
    const int rc = kiri_batcher_init(m, &bp, &c->batcher, info);
    if (rc < 0) {
        kiri_mem_free(c);
        return rc;
    }
    *out = c;
    return KIRI_OK;
}

void kiri_context_free(struct kiri_context *c)
{
    if (!c)
        return;
    kiri_batcher_free(c->batcher);
    kiri_mem_free(c);
}

/* Events of the held sequence: its logits, or its end. */
static int on_held(void *user, const struct kiri_token_event *ev)
{
    struct kiri_context *c = user;
    if (ev->logits)
        c->logits = ev->logits;
    if (ev->finish >= 0) {
        c->n_held = 0;
        c->held_status = ev->finish == KIRI_FINISH_ERROR ? ev->status : KIRI_OK;
    }
    return 0;
}

void kiri_context_reset(struct kiri_context *c)
{
    if (c->n_held > 0) {
        kiri_batcher_cancel(c->batcher, c->held_id);
        kiri_batcher_run(c->batcher, NULL);
    }
    c->n_held = 0;
    c->logits = NULL;
    atomic_store(&c->cancel, 0);
}

void kiri_context_cancel(struct kiri_context *c) { atomic_store(&c->cancel, 1); }

int kiri_context_eval(struct kiri_context *c, const int32_t *tokens, int32_t n, const float **logits,
                      struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!c || !tokens || n < 1 || !logits)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "eval needs at least one token");
    const int32_t n_ctx = kiri_batcher_n_ctx(c->batcher);
    if ((int64_t)c->n_held + n > n_ctx)
        return kiri_error_set(info, KIRI_E_CONTEXT_FULL, "%d tokens do not fit: %d of %d context positions used",
                              n, c->n_held, n_ctx);
    if (atomic_load(&c->cancel))
        return kiri_error_set(info, KIRI_E_CANCELLED, "cancelled");
    int rc;
    c->logits = NULL;
    if (c->n_held == 0) {
        struct kiri_request r;
        memset(&r, 0, sizeof r);
        r.tokens = tokens;
        r.n_tokens = n;
        rc = kiri_batcher_submit_held(c->batcher, &r, on_held, c, &c->held_id, info);
    } else {
        rc = kiri_batcher_append(c->batcher, c->held_id, tokens, n, info);
    }
    if (rc < 0)
        return rc;
    c->n_held += n;
    c->held_status = KIRI_OK;
    kiri_batcher_run(c->batcher, &c->cancel);
    if (atomic_load(&c->cancel))
        return kiri_error_set(info, KIRI_E_CANCELLED, "cancelled");
    if (!c->logits || c->n_held == 0) {
        const int status = c->held_status < 0 ? c->held_status : KIRI_E_BACKEND;
        return kiri_error_set(info, status, status == KIRI_E_NOMEM ? "out of memory while evaluating"
                                                                   : "the backend failed while evaluating");
    }
    *logits = c->logits;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Generation: one request through the context's batcher
 * ------------------------------------------------------------------------------------------- */

struct generation {
    const struct kiri_model *model;
    kiri_token_fn on_token;
    void *user;
    int user_stopped;           /* on_token asked to stop */
    int finish;                 /* the final event's reason, -1 before it */
    int status;                 /* the final event's status */
    int32_t n_generated;
    double t_first;             /* when the first token arrived */
    char error[128];            /* the final event's error sentence, "" if none */
};

static int on_generated(void *user, const struct kiri_token_event *ev)
{
    struct generation *g = user;
    if (ev->token >= 0 && g->t_first == 0)
        g->t_first = kiri_platform_now();
    if (ev->finish >= 0) {
        g->finish = ev->finish;
        g->status = ev->status;
        g->n_generated = ev->n_generated;
        if (ev->error)
            snprintf(g->error, sizeof g->error, "%s", ev->error);
    }
    if (g->user_stopped || !g->on_token || ev->finish == KIRI_FINISH_CANCELLED || ev->finish == KIRI_FINISH_ERROR)
        return 0;
    /* An end-of-generation token is not the caller's: only what it released is. */
    if (ev->token >= 0 && !kiri_model_is_eog(g->model, ev->token)) {
        g->user_stopped = g->on_token(g->user, ev->token, ev->text, ev->text_len) != 0;
    } else if (ev->text_len) {
        g->on_token(g->user, -1, ev->text, ev->text_len);
    }
    return g->user_stopped;
}

int kiri_generate(struct kiri_context *c, const int32_t *prompt, int32_t n_prompt,
                  const struct kiri_generate_params *gp, kiri_token_fn on_token, void *user,
                  struct kiri_generate_result *result, struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!c || !prompt || n_prompt < 1 || !gp || (gp->n_stop && !gp->stop) || gp->n_stop < 0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "generate needs a context, a prompt and parameters");
    for (int s = 0; s < gp->n_stop; s++)
        if (!gp->stop[s])
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "stop string %d is NULL", s);
    if (n_prompt >= kiri_batcher_n_ctx(c->batcher))
        return kiri_error_set(info, KIRI_E_CONTEXT_FULL, "the prompt (%d tokens) does not fit the context (%d)",
                              n_prompt, kiri_batcher_n_ctx(c->batcher));
    kiri_context_reset(c);
    struct kiri_request r;
    memset(&r, 0, sizeof r);
    r.tokens = prompt;
    r.n_tokens = n_prompt;
    r.max_tokens = gp->max_tokens;
    r.sampling = gp->sampling;
    r.stop = gp->stop;
    r.n_stop = gp->n_stop;
    r.grammar = gp->grammar;
    r.grammar_len = gp->grammar_len;
    r.speculative = gp->speculative;
    r.spec_max = gp->spec_max;
    struct generation g = {c->model, on_token, user, 0, -1, KIRI_OK, 0, 0, ""};
    uint64_t id;
    struct kiri_batcher_stats before, after;
    kiri_batcher_get_stats(c->batcher, &before);
    const double t0 = kiri_platform_now();
    int rc = kiri_batcher_submit(c->batcher, &r, on_generated, &g, &id, info);
    if (rc < 0)
        return rc;
    kiri_batcher_run(c->batcher, &c->cancel);
    const double t1 = kiri_platform_now();
    kiri_batcher_get_stats(c->batcher, &after);

    struct kiri_generate_result res;
    memset(&res, 0, sizeof res);
    res.n_prompt = n_prompt;
    res.n_generated = g.n_generated;
    res.finish = g.finish;
    res.prefill_seconds = (g.t_first > 0 ? g.t_first : t1) - t0;
    res.decode_seconds = g.t_first > 0 ? t1 - g.t_first : 0;
    for (int k = 0; k < KIRI_SPEC_KINDS; k++) {
        res.n_drafted += (int32_t)(after.spec_drafted[k] - before.spec_drafted[k]);
        res.n_accepted += (int32_t)(after.spec_accepted[k] - before.spec_accepted[k]);
    }
    if (g.finish == KIRI_FINISH_CANCELLED && g.user_stopped) {
        res.finish = KIRI_FINISH_STOP;
    } else if (g.finish == KIRI_FINISH_CANCELLED) {
        res.finish = KIRI_FINISH_LENGTH;
        rc = kiri_error_set(info, KIRI_E_CANCELLED, "cancelled");
    } else if (g.finish == KIRI_FINISH_ERROR || g.finish < 0) {
        res.finish = KIRI_FINISH_LENGTH;
        if (g.error[0])
            rc = kiri_error_set(info, g.status, "%s", g.error);
        else if (g.status == KIRI_E_NOMEM)
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory while generating");
        else
            rc = kiri_error_set(info, KIRI_E_BACKEND, "the backend failed while generating");
    }
    if (result)
        *result = res;
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * System
 * ------------------------------------------------------------------------------------------- */

double kiri_time_seconds(void) { return kiri_platform_now(); }

uint64_t kiri_peak_rss_bytes(void) { return kiri_platform_peak_rss(); }

static void one_thread_run(void *pool, void (*fn)(void *, int, int), void *arg)
{
    (void)pool;
    fn(arg, 0, 1);
}

static void no_barrier(void *pool) { (void)pool; }

void kiri_system_info(const char *backend, char *buf, size_t cap)
{
    if (!cap)
        return;
    struct kiri_buf text = {0};
    const uint32_t f = kiri_platform_cpu_features();
    kiri_buf_printf(&text, "kiri %s\n", KIRI_VERSION_STRING);
    kiri_buf_printf(&text, "cpu:           %d cores, features:%s%s%s%s%s%s%s%s\n", kiri_platform_n_cpus(),
            f & KIRI_CPU_AVX2 ? " avx2+fma+f16c" : "", f & KIRI_CPU_AVX512 ? " avx512" : "",
            f & KIRI_CPU_AVX512_VNNI ? " avx512-vnni" : "", f & KIRI_CPU_AVX_VNNI ? " avx-vnni" : "",
            f & KIRI_CPU_NEON ? " neon" : "", f & KIRI_CPU_DOTPROD ? " dotprod" : "",
            f & KIRI_CPU_I8MM ? " i8mm" : "", f ? "" : " (portable C only)");
    kiri_buf_printf(&text, "memory:        %.1f GiB\n", (double)kiri_platform_total_memory() / (1024.0 * 1024.0 * 1024.0));
    kiri_buf_printf(&text, "compiled-in backends:");
    for (int i = 0; i < kiri_backends_count(); i++)
        kiri_buf_printf(&text, " %s", kiri_backends_get(i)->name);
    kiri_buf_printf(&text, "\n");
    struct kiri_backend_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.threads.n = 1;
    cfg.threads.run = one_thread_run;
    cfg.threads.barrier = no_barrier;
    cfg.cpu_features = f;
    cfg.dl_open = kiri_platform_dl_open;
    cfg.dl_sym = kiri_platform_dl_sym;
    const struct kiri_backend_iface *iface = NULL;
    struct kiri_backend *be = NULL;
    char report[512];
    struct kiri_status_info info;
    const int rc = kiri_backends_pick(backend, &cfg, &iface, &be, report, sizeof report, &info);
    kiri_buf_printf(&text, "backends:\n%s", report);
    if (rc < 0)
        kiri_buf_printf(&text, "error: %s\n", info.message);
    else
        iface->free(be);
    copy_out(&text, buf, cap);
}
