#include "model.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backends.h"
#include "error.h"
#include "gguf.h"
#include "kiri.h"
#include "kvcache.h"
#include "mem.h"
#include "platform.h"
#include "threadpool.h"
#include "tokenizer.h"

/* ---------------------------------------------------------------------------------------------
 * Architectures
 * ------------------------------------------------------------------------------------------- */

static int gemma3_hparams(struct kiri_model *m, struct kiri_status_info *info);
static int smollm3_hparams(struct kiri_model *m, struct kiri_status_info *info);
static int granite_hparams(struct kiri_model *m, struct kiri_status_info *info);

struct arch_info {
    const char *name;
    int arch;
    int rope_mode;
    int has_qkv_bias;     /* attention biases expected (qwen2) */
    int has_qk_norm;      /* per-head q/k RMS norms (qwen3, gemma3) */
    int has_post_norms;   /* post_attention_norm and post_ffw_norm (gemma3) */
    int rope_freqs;       /* the graph applies rope_freqs.weight when the file has it */
    /* The family's own hyperparameters and per-layer settings, after the weights; NULL: none. */
    int (*family)(struct kiri_model *m, struct kiri_status_info *info);
};

static const struct arch_info archs[] = {
    {"llama", KIRI_ARCH_LLAMA, KIRI_ROPE_NORMAL, 0, 0, 0, 1, NULL},
    {"qwen2", KIRI_ARCH_QWEN2, KIRI_ROPE_NEOX, 1, 0, 0, 1, NULL},
    {"qwen3", KIRI_ARCH_QWEN3, KIRI_ROPE_NEOX, 0, 1, 0, 1, NULL},
    {"gemma3", KIRI_ARCH_GEMMA3, KIRI_ROPE_NEOX, 0, 1, 1, 0, gemma3_hparams},
    {"smollm3", KIRI_ARCH_SMOLLM3, KIRI_ROPE_NORMAL, 0, 0, 0, 0, smollm3_hparams},
    {"granite", KIRI_ARCH_GRANITE, KIRI_ROPE_NORMAL, 0, 0, 0, 1, granite_hparams},
};

/* ---------------------------------------------------------------------------------------------
 * Hyperparameters
 * ------------------------------------------------------------------------------------------- */

static int get_u32_key(const struct kiri_gguf *g, const char *arch, const char *suffix, int required,
                       uint32_t *out, struct kiri_status_info *info)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return kiri_gguf_get_u32(g, key, required, out, info);
}

static int get_f32_key(const struct kiri_gguf *g, const char *arch, const char *suffix, int required,
                       float *out, struct kiri_status_info *info)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    return kiri_gguf_get_f32(g, key, required, out, info);
}

static int bad_hparam(struct kiri_status_info *info, const struct kiri_gguf *g, const char *arch,
                      const char *suffix, const char *why)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const int64_t i = kiri_gguf_find_key(g, key);
    return kiri_error_at(info, KIRI_E_MODEL_INVALID, key, i >= 0 ? (int64_t)kiri_gguf_kv_offset(g, i) : -1,
                         "hyperparameter %s %s", key, why);
}

static int load_hparams(const struct kiri_gguf *g, const struct arch_info *ai, struct kiri_hparams *hp,
                        struct kiri_status_info *info)
{
    const char *a = ai->name;
    uint32_t ctx = 0, embd = 0, layers = 0, ff = 0, head = 0, head_kv = 0, key_len = 0, rot = 0;
    int rc;
    if ((rc = get_u32_key(g, a, "context_length", 1, &ctx, info)) < 0 ||
        (rc = get_u32_key(g, a, "embedding_length", 1, &embd, info)) < 0 ||
        (rc = get_u32_key(g, a, "block_count", 1, &layers, info)) < 0 ||
        (rc = get_u32_key(g, a, "feed_forward_length", 1, &ff, info)) < 0 ||
        (rc = get_u32_key(g, a, "attention.head_count", 1, &head, info)) < 0)
        return rc;
    if (layers == 0 || layers > KIRI_MAX_LAYERS)
        return bad_hparam(info, g, a, "block_count", "must be 1..512");
    if (ctx == 0 || ctx > (1u << 24))
        return bad_hparam(info, g, a, "context_length", "must be 1..2^24");
    if (embd == 0 || embd > (1u << 20))
        return bad_hparam(info, g, a, "embedding_length", "must be 1..2^20");
    if (ff == 0 || ff > (1u << 22))
        return bad_hparam(info, g, a, "feed_forward_length", "must be 1..2^22");
    if (head == 0 || head > 4096)
        return bad_hparam(info, g, a, "attention.head_count", "must be 1..4096");
    head_kv = head;
    if ((rc = get_u32_key(g, a, "attention.head_count_kv", 0, &head_kv, info)) < 0)
        return rc;
    if (head_kv == 0 || head % head_kv != 0)
        return bad_hparam(info, g, a, "attention.head_count_kv", "must divide attention.head_count");
    if ((rc = get_u32_key(g, a, "attention.key_length", 0, &key_len, info)) < 0)
        return rc;
    if (rc == 1) {
        if (embd % head != 0)
            return bad_hparam(info, g, a, "embedding_length", "is not a multiple of attention.head_count");
        key_len = embd / head;
    }
    uint32_t val_len = key_len;
    if ((rc = get_u32_key(g, a, "attention.value_length", 0, &val_len, info)) < 0)
        return rc;
    if (key_len == 0 || key_len > KIRI_MAX_HEAD_DIM || key_len % 2)
        return bad_hparam(info, g, a, "attention.key_length", "must be even and 2..1024");
    if (val_len != key_len)
        return bad_hparam(info, g, a, "attention.value_length", "differs from the key length (unsupported)");
    rot = key_len;
    if ((rc = get_u32_key(g, a, "rope.dimension_count", 0, &rot, info)) < 0)
        return rc;
    if (rot == 0 || rot > key_len || rot % 2)
        return bad_hparam(info, g, a, "rope.dimension_count", "must be even and at most the head size");

    float eps = 1e-5f, base = 10000.0f, factor = 1.0f;
    if ((rc = get_f32_key(g, a, "attention.layer_norm_rms_epsilon", 1, &eps, info)) < 0)
        return rc;
    if (!(eps > 0.0f) || !isfinite(eps) || eps > 1.0f)
        return bad_hparam(info, g, a, "attention.layer_norm_rms_epsilon", "must be in (0, 1]");
    if ((rc = get_f32_key(g, a, "rope.freq_base", 0, &base, info)) < 0)
        return rc;
    if (!(base > 0.0f) || !isfinite(base))
        return bad_hparam(info, g, a, "rope.freq_base", "must be positive and finite");

    char key[128];
    struct kiri_gguf_str st = {0};
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    if ((rc = kiri_gguf_get_str(g, key, 0, &st, info)) < 0)
        return rc;
    const int has_type = rc == KIRI_OK;
    if ((rc = get_f32_key(g, a, "rope.scaling.factor", 0, &factor, info)) < 0)
        return rc;
    if (has_type && !(st.len == 4 && memcmp(st.ptr, "none", 4) == 0) &&
        !(st.len == 6 && memcmp(st.ptr, "linear", 6) == 0))
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, key, -1, "rope scaling type '%.*s' is not supported",
                             (int)(st.len > 32 ? 32 : st.len), st.ptr);
    if (has_type && st.len == 4)
        factor = 1.0f;
    if (!(factor > 0.0f) || !isfinite(factor))
        return bad_hparam(info, g, a, "rope.scaling.factor", "must be positive and finite");

    hp->arch = ai->arch;
    hp->n_ctx_train = (int32_t)ctx;
    hp->n_embd = (int32_t)embd;
    hp->n_layer = (int32_t)layers;
    hp->n_head = (int32_t)head;
    hp->n_head_kv = (int32_t)head_kv;
    hp->head_dim = (int32_t)key_len;
    hp->n_ff = (int32_t)ff;
    hp->n_rot = (int32_t)rot;
    hp->rope_mode = ai->rope_mode;
    hp->rope_freq_base = base;
    hp->rope_freq_scale = 1.0f / factor;
    hp->rms_eps = eps;
    hp->attn_scale = 1.0f / sqrtf((float)key_len);
    hp->embd_scale = 1.0f;
    hp->residual_scale = 1.0f;
    hp->logit_scale = 1.0f;
    hp->rope_freq_base_swa = base;
    return KIRI_OK;
}

/* Split files and mixtures of experts are well-formed GGUF that kiri does not run: refuse them by
 * name (malformed values of those keys are invalid, not merely unsupported). */
static int check_unsupported_layout(const struct kiri_gguf *g, const struct arch_info *ai,
                                    struct kiri_status_info *info)
{
    uint32_t count = 1, no = 0;
    int rc;
    if ((rc = kiri_gguf_get_u32(g, "split.count", 0, &count, info)) < 0 ||
        (rc = kiri_gguf_get_u32(g, "split.no", 0, &no, info)) < 0)
        return rc;
    if (count == 0 || no >= count) {
        const int64_t k = kiri_gguf_find_key(g, "split.no");
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, "split.no", k >= 0 ? (int64_t)kiri_gguf_kv_offset(g, k) : -1,
                             "split.no %u is not below split.count %u", no, count);
    }
    if (count > 1)
        return kiri_error_set(info, KIRI_E_UNSUPPORTED,
                              "this is shard %u of a %u-file split GGUF; merge the shards into one file", no + 1,
                              count);
    uint32_t experts = 0, used = 0;
    if ((rc = get_u32_key(g, ai->name, "expert_count", 0, &experts, info)) < 0 ||
        (rc = get_u32_key(g, ai->name, "expert_used_count", 0, &used, info)) < 0)
        return rc;
    if (used > experts)
        return bad_hparam(info, g, ai->name, "expert_used_count", "exceeds expert_count");
    if (experts > 0)
        return kiri_error_set(info, KIRI_E_UNSUPPORTED, "mixture-of-experts models (%u experts) are not supported",
                              experts);
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */

enum weight_kind { WEIGHT_MATRIX, WEIGHT_VECTOR, WEIGHT_EMBEDDING };

static int supported_matrix_type(int type)
{
    switch (type) {
    case KIRI_TYPE_F32: case KIRI_TYPE_F16: case KIRI_TYPE_BF16: case KIRI_TYPE_Q4_0:
    case KIRI_TYPE_Q4_1: case KIRI_TYPE_Q5_0: case KIRI_TYPE_Q5_1: case KIRI_TYPE_Q8_0:
    case KIRI_TYPE_Q4_K: case KIRI_TYPE_Q5_K: case KIRI_TYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}

/* Finds a tensor, checks its shape and type, and fills the next descriptor. *out is NULL for an
 * absent optional tensor. */
static int take_weight(struct kiri_model *m, const char *name, int64_t ne0, int64_t ne1,
                       enum weight_kind kind, int required, struct kiri_tensor **out,
                       struct kiri_status_info *info)
{
    *out = NULL;
    const struct kiri_gguf_tensor *gt = kiri_gguf_find_tensor(m->gguf, name);
    if (!gt) {
        if (required)
            return kiri_error_at(info, KIRI_E_MODEL_INVALID, name, -1, "required tensor %s is missing", name);
        return KIRI_OK;
    }
    const int want_dims = kind == WEIGHT_VECTOR ? 1 : 2;
    if (gt->n_dims != want_dims || gt->ne[0] != ne0 || (want_dims == 2 && gt->ne[1] != ne1))
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, name, -1,
                             "tensor %s has wrong shape [%lld, %lld], expected [%lld, %lld]", name,
                             (long long)gt->ne[0], (long long)gt->ne[1], (long long)ne0,
                             (long long)(want_dims == 2 ? ne1 : 1));
    if (kind == WEIGHT_VECTOR ? gt->type != KIRI_TYPE_F32 : !supported_matrix_type(gt->type))
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, name, -1, "tensor %s has type %s, which kiri cannot use here",
                             name, kiri_type_name(gt->type));
    struct kiri_tensor *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    t->type = gt->type;
    t->ne[0] = gt->ne[0];
    t->ne[1] = want_dims == 2 ? gt->ne[1] : 1;
    t->ne[2] = t->ne[3] = 1;
    t->nb[0] = kiri_type_size(gt->type);
    t->nb[1] = (size_t)(gt->ne[0] / kiri_type_block_size(gt->type)) * kiri_type_size(gt->type);
    t->nb[2] = t->nb[3] = t->nb[1] * (size_t)t->ne[1];
    t->data = (void *)gt->data;
    t->name = gt->name;
    m->weight_bytes += gt->size;
    *out = t;
    return KIRI_OK;
}

static int load_weights(struct kiri_model *m, const struct arch_info *ai, struct kiri_status_info *info)
{
    const struct kiri_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab, F = hp->n_ff;
    const int64_t Q = (int64_t)hp->n_head * hp->head_dim, KV = (int64_t)hp->n_head_kv * hp->head_dim;
    m->tensors = kiri_mem_calloc((size_t)hp->n_layer * 24 + 8, sizeof *m->tensors);
    m->layers = kiri_mem_calloc((size_t)hp->n_layer, sizeof *m->layers);
    m->layer_t0 = kiri_mem_array((size_t)hp->n_layer + 1, sizeof *m->layer_t0);
    if (!m->tensors || !m->layers || !m->layer_t0)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory for the tensor table");
    int rc;
    if ((rc = take_weight(m, "token_embd.weight", E, V, WEIGHT_EMBEDDING, 1, &m->tok_embd, info)) < 0 ||
        (rc = take_weight(m, "output_norm.weight", E, 1, WEIGHT_VECTOR, 1, &m->output_norm, info)) < 0 ||
        (rc = take_weight(m, "output.weight", E, V, WEIGHT_MATRIX, 0, &m->output, info)) < 0 ||
        (ai->rope_freqs &&
         (rc = take_weight(m, "rope_freqs.weight", hp->n_rot / 2, 1, WEIGHT_VECTOR, 0, &m->rope_freqs, info)) < 0))
        return rc;
    if (!m->output)
        m->output = m->tok_embd; /* tied embeddings */
    for (int l = 0; l < hp->n_layer; l++) {
        struct kiri_layer *L = &m->layers[l];
        char n[KIRI_GGUF_MAX_NAME + 16];
        m->layer_t0[l] = m->n_tensors;
#define W(field, suffix, ne0, ne1, kind, req)                                                      \
        snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                                             \
        if ((rc = take_weight(m, n, ne0, ne1, kind, req, &L->field, info)) < 0)                   \
            return rc;
        W(attn_norm, "attn_norm.weight", E, 1, WEIGHT_VECTOR, 1)
        W(wq, "attn_q.weight", E, Q, WEIGHT_MATRIX, 1)
        W(wk, "attn_k.weight", E, KV, WEIGHT_MATRIX, 1)
        W(wv, "attn_v.weight", E, KV, WEIGHT_MATRIX, 1)
        W(wo, "attn_output.weight", Q, E, WEIGHT_MATRIX, 1)
        W(bq, "attn_q.bias", Q, 1, WEIGHT_VECTOR, ai->has_qkv_bias)
        W(bk, "attn_k.bias", KV, 1, WEIGHT_VECTOR, ai->has_qkv_bias)
        W(bv, "attn_v.bias", KV, 1, WEIGHT_VECTOR, ai->has_qkv_bias)
        W(q_norm, "attn_q_norm.weight", hp->head_dim, 1, WEIGHT_VECTOR, ai->has_qk_norm)
        W(k_norm, "attn_k_norm.weight", hp->head_dim, 1, WEIGHT_VECTOR, ai->has_qk_norm)
        W(ffn_norm, "ffn_norm.weight", E, 1, WEIGHT_VECTOR, 1)
        W(w_gate, "ffn_gate.weight", E, F, WEIGHT_MATRIX, 1)
        W(w_up, "ffn_up.weight", E, F, WEIGHT_MATRIX, 1)
        W(w_down, "ffn_down.weight", F, E, WEIGHT_MATRIX, 1)
        if (ai->has_post_norms) {
            W(attn_post_norm, "post_attention_norm.weight", E, 1, WEIGHT_VECTOR, 1)
            W(ffn_post_norm, "post_ffw_norm.weight", E, 1, WEIGHT_VECTOR, 1)
        }
#undef W
        L->rope = 1;
        L->rope_freq_base = hp->rope_freq_base;
        L->rope_freq_scale = hp->rope_freq_scale;
    }
    m->layer_t0[hp->n_layer] = m->n_tensors;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The families beyond llama: their own keys, read as llama.cpp reads them, into the shared
 * hyperparameters and each layer's settings (load_weights set every layer to the file's RoPE).
 * ------------------------------------------------------------------------------------------- */

/* An optional multiplier key: 0 (or absent) is unset and leaves *out as it is. */
static int get_multiplier(const struct kiri_gguf *g, const char *arch, const char *suffix, float *out,
                          struct kiri_status_info *info)
{
    float v = 0.0f;
    const int rc = get_f32_key(g, arch, suffix, 0, &v, info);
    if (rc < 0)
        return rc;
    if (v != 0.0f)
        *out = v;
    return KIRI_OK;
}

/* gemma3's sliding_window_pattern: a number n (every n-th layer is global, the others slide; 0:
 * every layer slides) or one flag per layer (bool or integer, nonzero: slides). */
static int gemma3_swa_layers(struct kiri_model *m, struct kiri_status_info *info)
{
    const struct kiri_gguf *g = m->gguf;
    struct kiri_hparams *hp = &m->hp;
    const int64_t k = kiri_gguf_find_key(g, "gemma3.attention.sliding_window_pattern");
    if (k >= 0 && kiri_gguf_kv_type(g, k) == KIRI_GGUF_ARRAY) {
        int et = 0;
        uint64_t n = 0;
        const void *data = NULL;
        int rc = kiri_gguf_get_arr(g, "gemma3.attention.sliding_window_pattern", 1, &et, &n, &data, info);
        if (rc < 0)
            return rc;
        const size_t es = et == KIRI_GGUF_BOOL ? 1 : et == KIRI_GGUF_UINT32 || et == KIRI_GGUF_INT32 ? 4 : 0;
        if (!es || n != (uint64_t)hp->n_layer)
            return bad_hparam(info, g, "gemma3", "attention.sliding_window_pattern",
                              "must be a number or one bool/int32/uint32 per layer");
        for (int l = 0; l < hp->n_layer; l++) {
            uint32_t v = 0;
            memcpy(&v, (const char *)data + (size_t)l * es, es);
            m->layers[l].swa = v != 0;
        }
        hp->swa_pattern = 0;
        return KIRI_OK;
    }
    uint32_t pattern = 6;
    int rc = get_u32_key(g, "gemma3", "attention.sliding_window_pattern", 0, &pattern, info);
    if (rc < 0)
        return rc;
    if (pattern > (uint32_t)KIRI_MAX_LAYERS)
        return bad_hparam(info, g, "gemma3", "attention.sliding_window_pattern", "must be 0..512");
    for (int l = 0; l < hp->n_layer; l++)
        m->layers[l].swa = pattern == 0 || (uint32_t)l % pattern < pattern - 1;
    hp->swa_pattern = (int32_t)pattern;
    return KIRI_OK;
}

/* Gemma 3: sliding-window layers with their own RoPE base (10000 unless the file says, at scale
 * 1) beside global layers at the file's base and scaling; embeddings times sqrt(n_embd); logits
 * soft-capped when the file sets a cap; GeGLU. The 27B scales attention by its model width over
 * the heads rather than the head size (gemma_pytorch's query_pre_attn_scalar). */
static int gemma3_hparams(struct kiri_model *m, struct kiri_status_info *info)
{
    const struct kiri_gguf *g = m->gguf;
    struct kiri_hparams *hp = &m->hp;
    uint32_t window = 0;
    int rc = get_u32_key(g, "gemma3", "attention.sliding_window", 0, &window, info);
    if (rc < 0)
        return rc;
    if (window > (1u << 24))
        return bad_hparam(info, g, "gemma3", "attention.sliding_window", "must be 0..2^24");
    if (window > 0) {
        if ((rc = gemma3_swa_layers(m, info)) < 0)
            return rc;
        float base_swa = 10000.0f;
        if ((rc = get_f32_key(g, "gemma3", "rope.freq_base_swa", 0, &base_swa, info)) < 0)
            return rc;
        if (!(base_swa > 0.0f))
            return bad_hparam(info, g, "gemma3", "rope.freq_base_swa", "must be positive");
        hp->swa_window = (int32_t)window;
        hp->rope_freq_base_swa = base_swa;
        for (int l = 0; l < hp->n_layer; l++)
            if (m->layers[l].swa) {
                m->layers[l].rope_freq_base = base_swa;
                m->layers[l].rope_freq_scale = 1.0f;
            }
    }
    float cap = 0.0f;
    if ((rc = get_f32_key(g, "gemma3", "final_logit_softcapping", 0, &cap, info)) < 0)
        return rc;
    if (cap < 0.0f)
        return bad_hparam(info, g, "gemma3", "final_logit_softcapping", "must not be negative");
    hp->final_softcap = cap;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    if (hp->n_layer == 62)
        hp->attn_scale = 1.0f / sqrtf((float)(hp->n_embd / hp->n_head));
    hp->ffn_gelu = 1;
    return KIRI_OK;
}

/* SmolLM3 leaves out RoPE on every fourth layer (3, 7, 11, ...: layer l when (l + 1) % 4 == 0). */
static int smollm3_hparams(struct kiri_model *m, struct kiri_status_info *info)
{
    (void)info;
    for (int l = 0; l < m->hp.n_layer; l++)
        m->layers[l].rope = (l + 1) % 4 != 0;
    return KIRI_OK;
}

/* Granite (dense): embeddings times embedding_scale, each block's output times residual_scale
 * before its residual add, q.k times attention.scale, logits divided by logit_scale (required).
 * A multiplier of 0 is unset. rope.scaling.finetuned false turns RoPE off on every layer. */
static int granite_hparams(struct kiri_model *m, struct kiri_status_info *info)
{
    const struct kiri_gguf *g = m->gguf;
    struct kiri_hparams *hp = &m->hp;
    float logit = 0.0f;
    int rc;
    if ((rc = get_f32_key(g, "granite", "logit_scale", 1, &logit, info)) < 0)
        return rc;
    if (logit == 0.0f)
        return bad_hparam(info, g, "granite", "logit_scale", "must not be 0");
    hp->logit_scale = 1.0f / logit;
    if ((rc = get_multiplier(g, "granite", "embedding_scale", &hp->embd_scale, info)) < 0 ||
        (rc = get_multiplier(g, "granite", "residual_scale", &hp->residual_scale, info)) < 0 ||
        (rc = get_multiplier(g, "granite", "attention.scale", &hp->attn_scale, info)) < 0)
        return rc;
    if (kiri_gguf_find_key(g, "granite.deepstack_mapping") >= 0)
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, "granite.deepstack_mapping", -1,
                             "granite vision models (granite.deepstack_mapping) are not supported");
    int rope = 1;
    if ((rc = kiri_gguf_get_bool(g, "granite.rope.scaling.finetuned", 0, &rope, info)) < 0)
        return rc;
    for (int l = 0; l < hp->n_layer; l++)
        m->layers[l].rope = rope != 0;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

/* Does tensor i belong to a layer that runs on the offload backend? */
static int on_offload(const struct kiri_model *m, int i)
{
    return m->n_offload > 0 && i >= m->layer_t0[0] && i < m->layer_t0[m->n_offload];
}

static int prepare(const struct kiri_backend_iface *iface, struct kiri_backend *be, struct kiri_tensor *t,
                   struct kiri_status_info *info)
{
    char msg[128] = "";
    if (iface->weight_prepare && iface->weight_prepare(be, t, msg, sizeof msg) != 0)
        return kiri_error_set(info, KIRI_E_BACKEND, "%s: cannot prepare %s: %s", iface->name, t->name, msg);
    return KIRI_OK;
}

/* Replaces the report's line about the backend named name (the CPU's "skipped (not requested)"
 * when a name forced the GPU) with line. */
static void report_line(struct kiri_model *m, const char *name, const char *line)
{
    char *r = m->backend_report;
    const size_t n = strlen(name);
    for (char *p = r; *p;) {
        char *end = strchr(p, '\n');
        end = end ? end + 1 : p + strlen(p);
        if (strncmp(p, name, n) == 0 && p[n] == ':') {
            memmove(p, end, strlen(end) + 1);
            break;
        }
        p = end;
    }
    const size_t used = strnlen(r, sizeof m->backend_report);
    if (used + 1 < sizeof m->backend_report)
        snprintf(m->backend_report + used, sizeof m->backend_report - used, "%s\n", line);
}

/* With a GPU backend picked and gpu_layers in [0, n_layer), the GPU keeps the first gpu_layers
 * layers and a CPU backend becomes the model's main one (embedding, the other layers, the output
 * head): the weights it runs stay in the mapping. gpu_layers = 0 leaves the GPU unused. */
static int split_layers(struct kiri_model *m, const struct kiri_model_params *p,
                        const struct kiri_backend_config *cfg, struct kiri_status_info *info)
{
    const int n_layer = m->hp.n_layer;
    if (strcmp(m->iface->name, "cpu") == 0 || p->gpu_layers < 0 || p->gpu_layers >= n_layer)
        return KIRI_OK;
    const struct kiri_backend_iface *gi = m->iface;
    struct kiri_backend *gb = m->be;
    char cpu_report[256];
    m->iface = NULL;
    m->be = NULL;
    const int rc = kiri_backends_pick("cpu", cfg, &m->iface, &m->be, cpu_report, sizeof cpu_report, info);
    char line[160];
    if (rc < 0 || p->gpu_layers == 0) {
        gi->free(gb);
        if (rc < 0)
            return rc;
        snprintf(line, sizeof line, "cpu: runs every layer (gpu layers 0: %s picked, then left unused)", gi->name);
    } else {
        m->off_iface = gi;
        m->off_be = gb;
        m->n_offload = p->gpu_layers;
        snprintf(line, sizeof line, "cpu: runs layers %d-%d of %d, the embedding and the output head (gpu layers %d)",
                 m->n_offload, n_layer - 1, n_layer, m->n_offload);
    }
    report_line(m, "cpu", line);
    return KIRI_OK;
}

static int start_backend(struct kiri_model *m, const struct kiri_model_params *p, struct kiri_status_info *info)
{
    int rc = kiri_platform_mutex_init(&m->compute_lock);
    if (rc < 0)
        return kiri_error_set(info, rc, "out of memory");
    const int n_threads = p->n_threads > 0 ? p->n_threads : kiri_platform_n_cpus();
    if (n_threads > 1024)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "n_threads %d is too large", n_threads);
    if ((rc = kiri_threadpool_init(n_threads, &m->pool)) < 0)
        return kiri_error_set(info, rc, "cannot start %d worker threads", n_threads);
    kiri_threadpool_as_threads(m->pool, &m->threads);
    struct kiri_backend_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.threads = m->threads;
    cfg.cpu_features = m->cpu_features;
    cfg.dl_open = kiri_platform_dl_open;
    cfg.dl_sym = kiri_platform_dl_sym;
    if ((rc = kiri_backends_pick(p->backend, &cfg, &m->iface, &m->be, m->backend_report,
                                 sizeof m->backend_report, info)) < 0)
        return rc;
    if ((rc = split_layers(m, p, &cfg, info)) < 0)
        return rc;
    /* Every weight must be runnable on the backend that runs it; ask before the first request.
     * Weights of CPU layers stay in the mapping (the CPU prepares nothing). */
    for (int i = 0; i < m->n_tensors; i++) {
        const int off = on_offload(m, i);
        if ((rc = prepare(off ? m->off_iface : m->iface, off ? m->off_be : m->be, &m->tensors[i], info)) < 0)
            return rc;
        if (off)
            m->off_weight_bytes += m->tensors[i].nb[1] * (size_t)m->tensors[i].ne[1];
    }
    if (m->n_offload && m->rope_freqs) {
        m->rope_freqs_off = *m->rope_freqs;
        m->rope_freqs_off.extra = NULL;
        if ((rc = prepare(m->off_iface, m->off_be, &m->rope_freqs_off, info)) < 0)
            return rc;
    }
    return KIRI_OK;
}

/* The CPU features the kernels may use: those detected, capped at the tier asked for (for
 * comparing kernel paths, or to step around one that misbehaves on some CPU). */
static int cpu_features_capped(const char *tier, uint32_t *features, struct kiri_status_info *info)
{
    static const struct {
        const char *name;
        uint32_t keep, need;
        const char *lacks;
    } tiers[] = {
        {"c", 0, 0, ""},
        {"avx2", KIRI_CPU_AVX2, KIRI_CPU_AVX2, "AVX2, FMA or F16C"},
        {"avx512", KIRI_CPU_AVX2 | KIRI_CPU_AVX512 | KIRI_CPU_AVX512_VNNI | KIRI_CPU_AVX_VNNI,
         KIRI_CPU_AVX2 | KIRI_CPU_AVX512 | KIRI_CPU_AVX512_VNNI, "AVX-512 with VNNI"},
        {"neon", KIRI_CPU_NEON, KIRI_CPU_NEON, "NEON"},
        {"dotprod", KIRI_CPU_NEON | KIRI_CPU_DOTPROD, KIRI_CPU_NEON | KIRI_CPU_DOTPROD, "the dotprod extension"},
        {"i8mm", KIRI_CPU_NEON | KIRI_CPU_DOTPROD | KIRI_CPU_I8MM, KIRI_CPU_NEON | KIRI_CPU_DOTPROD | KIRI_CPU_I8MM,
         "the dotprod and i8mm extensions"},
    };
    if (!tier || !tier[0] || strcmp(tier, "auto") == 0)
        return KIRI_OK;
    for (size_t i = 0; i < sizeof tiers / sizeof tiers[0]; i++) {
        if (strcmp(tier, tiers[i].name) != 0)
            continue;
        if ((*features & tiers[i].need) != tiers[i].need)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "CPU kernels \"%s\": this CPU lacks %s", tier,
                                  tiers[i].lacks);
        *features &= tiers[i].keep;
        return KIRI_OK;
    }
    return kiri_error_set(info, KIRI_E_INVALID_ARG,
                          "unknown CPU kernels \"%.32s\" (auto, c, avx2, avx512, neon, dotprod or i8mm)", tier);
}

int kiri_model_load(struct kiri_gguf *g, const struct kiri_model_params *p, struct kiri_model **out,
                    struct kiri_status_info *info)
{
    struct kiri_model *m = kiri_mem_calloc(1, sizeof *m);
    if (!m) {
        kiri_gguf_close(g);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    }
    m->gguf = g;
    /* A file without tensors is a vocabulary: it loads for tokenizing only. */
    m->vocab_only = p->vocab_only || kiri_gguf_n_tensors(g) == 0;
    m->cpu_features = kiri_platform_cpu_features();
    int rc = cpu_features_capped(p->cpu_kernels, &m->cpu_features, info);
    if (rc < 0)
        goto fail;
    rc = kiri_tokenizer_init(g, &m->tokenizer, info);
    if (rc < 0)
        goto fail;
    m->hp.n_vocab = kiri_tokenizer_n_vocab(m->tokenizer);
    if (m->vocab_only) {
        *out = m;
        return KIRI_OK;
    }

    struct kiri_gguf_str arch;
    if ((rc = kiri_gguf_get_str(g, "general.architecture", 1, &arch, info)) < 0)
        goto fail;
    const struct arch_info *ai = NULL;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strlen(archs[i].name) == arch.len && memcmp(archs[i].name, arch.ptr, arch.len) == 0)
            ai = &archs[i];
    if (!ai) {
        const int64_t k = kiri_gguf_find_key(g, "general.architecture");
        rc = kiri_error_at(info, KIRI_E_UNSUPPORTED, "general.architecture",
                           (int64_t)kiri_gguf_kv_offset(g, k),
                           "unsupported architecture '%.*s' (kiri runs llama, qwen2, qwen3, gemma3, smollm3, granite)",
                           (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
        goto fail;
    }
    m->arch_name = ai->name;
    if ((rc = check_unsupported_layout(g, ai, info)) < 0)
        goto fail;
    if ((rc = load_hparams(g, ai, &m->hp, info)) < 0)
        goto fail;
    if ((rc = load_weights(m, ai, info)) < 0)
        goto fail;
    if (ai->family && (rc = ai->family(m, info)) < 0)
        goto fail;
    if ((rc = start_backend(m, p, info)) < 0)
        goto fail;
    *out = m;
    return KIRI_OK;
fail:
    kiri_model_free(m);
    return rc;
}

void kiri_model_free(struct kiri_model *m)
{
    if (!m)
        return;
    if (m->be) {
        for (int i = 0; i < m->n_tensors; i++) {
            const int off = on_offload(m, i);
            const struct kiri_backend_iface *fi = off ? m->off_iface : m->iface;
            if (fi->weight_release)
                fi->weight_release(off ? m->off_be : m->be, &m->tensors[i]);
        }
        if (m->n_offload && m->off_iface->weight_release)
            m->off_iface->weight_release(m->off_be, &m->rope_freqs_off);
        m->iface->free(m->be);
    }
    if (m->off_be)
        m->off_iface->free(m->off_be);
    kiri_threadpool_free(m->pool);
    kiri_platform_mutex_free(m->compute_lock);
    kiri_tokenizer_free(m->tokenizer);
    kiri_mem_free(m->tensors);
    kiri_mem_free(m->layers);
    kiri_mem_free(m->layer_t0);
    kiri_gguf_close(m->gguf);
    kiri_mem_free(m);
}

int kiri_model_n_swa_layers(const struct kiri_model *m)
{
    int n = 0;
    for (int l = 0; m->hp.swa_window > 0 && m->layers && l < m->hp.n_layer; l++)
        n += m->layers[l].swa != 0;
    return n;
}

/* Bytes of one token's keys and values in one layer. */
static size_t kv_layer_token_bytes(const struct kiri_model *m, int kv_type)
{
    const int64_t kv_dim = (int64_t)m->hp.n_head_kv * m->hp.head_dim;
    const int64_t bs = kiri_type_block_size(kv_type);
    return bs ? 2 * (size_t)(kv_dim / bs) * kiri_type_size(kv_type) : 0;
}

size_t kiri_model_kv_bytes_per_token(const struct kiri_model *m, int kv_type)
{
    return (size_t)(m->hp.n_layer - kiri_model_n_swa_layers(m)) * kv_layer_token_bytes(m, kv_type);
}

size_t kiri_model_kv_bytes_window(const struct kiri_model *m, int kv_type)
{
    const int n_swa = kiri_model_n_swa_layers(m);
    return n_swa ? (size_t)n_swa * kv_layer_token_bytes(m, kv_type) * (size_t)m->hp.swa_window : 0;
}

int kiri_model_kvcache_init(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                            struct kiri_kvcache **out)
{
    return kiri_model_kvcache_init_swa(m, kv_type, block_size, n_blocks, 0, out);
}

int kiri_model_kvcache_init_swa(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                                int32_t n_swa_blocks, struct kiri_kvcache **out)
{
    uint8_t layers[KIRI_MAX_LAYERS];
    const int n_swa = n_swa_blocks > 0 ? kiri_model_n_swa_layers(m) : 0;
    for (int l = 0; n_swa && l < m->hp.n_layer && l < KIRI_MAX_LAYERS; l++)
        layers[l] = m->layers[l].swa != 0;
    const struct kiri_kvcache_window w = {layers, m->hp.swa_window, n_swa_blocks};
    return kiri_kvcache_init_windowed(m->iface, m->be, m->n_offload, m->off_iface, m->off_be, m->hp.n_layer,
                                      (int64_t)m->hp.n_head_kv * m->hp.head_dim, kv_type, block_size, n_blocks,
                                      n_swa ? &w : NULL, out);
}

void kiri_model_describe_placement(const struct kiri_model *m, char *buf, size_t cap)
{
    const double mib = 1024.0 * 1024.0;
    const int n_layer = m->hp.n_layer;
    if (!m->n_offload)
        snprintf(buf, cap, "all %d layers, the token embedding and the output head on %s", n_layer, m->iface->name);
    else
        snprintf(buf, cap,
                 "%d of %d layers on %s (layers 0-%d, %.2f MiB of weights uploaded); %d on %s (layers %d-%d, with "
                 "the token embedding and the output head, weights used in place)",
                 m->n_offload, n_layer, m->off_iface->name, m->n_offload - 1, (double)m->off_weight_bytes / mib,
                 n_layer - m->n_offload, m->iface->name, m->n_offload, n_layer - 1);
}
