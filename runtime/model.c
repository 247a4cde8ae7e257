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
static int gemma4_shapes(struct kiri_model *m, struct kiri_status_info *info);
static int gemma4_hparams(struct kiri_model *m, struct kiri_status_info *info);
static int lfm2_shapes(struct kiri_model *m, struct kiri_status_info *info);
static int qwen35_shapes(struct kiri_model *m, struct kiri_status_info *info);

struct arch_info {
    const char *name;
    int arch;
    int rope_mode;
    int has_qk_norm;      /* per-head q/k RMS norms, required (qwen3, gemma3) */
    int has_post_norms;   /* post_attention_norm and post_ffw_norm (gemma3) */
    int rope_freqs;       /* the graph applies rope_freqs.weight when the file has it */
    int fused_ffn_up;     /* ffn_up.weight holds the gate's rows, then the up projection's (phi3) */
    int longrope;         /* LongRoPE factor sets whatever rope.scaling.type says (phi3) */
    int attn_scale_key;   /* the family reads attention.scale itself (granite), or has its own (gemma4) */
    int layer_arrays;     /* head_count, head_count_kv, feed_forward_length may be per-layer arrays */
    const char *output_norm; /* the final norm's tensor: output_norm.weight unless named here */
    const char *ffn_norm;    /* each layer's feed-forward norm: ffn_norm.weight unless named here */
    int nextn;            /* block_count counts nextn_predict_layers multi-token-prediction blocks
                             after the trunk (qwen35) */
    /* Each layer's shapes and attention kind, before the weights are looked up; NULL: every
     * layer has the hyperparameters' shapes. */
    int (*shapes)(struct kiri_model *m, struct kiri_status_info *info);
    /* The family's own hyperparameters and per-layer settings, after the weights; NULL: none. */
    int (*family)(struct kiri_model *m, struct kiri_status_info *info);
};

/* Biases, per-tensor scales and fused Q/K/V are optional on every projection of every
 * architecture (see load_proj); what an architecture requires beyond the llama layout is here. */
static const struct arch_info archs[] = {
    {.name = "llama", .arch = KIRI_ARCH_LLAMA, .rope_mode = KIRI_ROPE_NORMAL, .rope_freqs = 1},
    {.name = "qwen2", .arch = KIRI_ARCH_QWEN2, .rope_mode = KIRI_ROPE_NEOX, .rope_freqs = 1},
    {.name = "qwen3", .arch = KIRI_ARCH_QWEN3, .rope_mode = KIRI_ROPE_NEOX, .has_qk_norm = 1, .rope_freqs = 1},
    {.name = "gemma3", .arch = KIRI_ARCH_GEMMA3, .rope_mode = KIRI_ROPE_NEOX, .has_qk_norm = 1,
     .has_post_norms = 1, .family = gemma3_hparams},
    {.name = "smollm3", .arch = KIRI_ARCH_SMOLLM3, .rope_mode = KIRI_ROPE_NORMAL, .family = smollm3_hparams},
    {.name = "granite", .arch = KIRI_ARCH_GRANITE, .rope_mode = KIRI_ROPE_NORMAL, .rope_freqs = 1,
     .attn_scale_key = 1, .family = granite_hparams},
    /* Phi-3/3.5-mini, Phi-4-mini. Their files may set attention.sliding_window; llama.cpp
     * disables the window for phi3 (the converters do not say which layers have it), and so does
     * kiri: every layer attends the whole context. */
    {.name = "phi3", .arch = KIRI_ARCH_PHI3, .rope_mode = KIRI_ROPE_NEOX, .fused_ffn_up = 1, .longrope = 1},
    /* Gemma 4 text (E2B, E4B): gemma3's layout with per-layer shapes, shared KV, per-layer
     * embeddings; rope_freqs applies to its global layers only. */
    {.name = "gemma4", .arch = KIRI_ARCH_GEMMA4, .rope_mode = KIRI_ROPE_NEOX, .has_qk_norm = 1,
     .has_post_norms = 1, .rope_freqs = 1, .attn_scale_key = 1, .layer_arrays = 1, .shapes = gemma4_shapes,
     .family = gemma4_hparams},
    /* LFM2 / LFM2.5: gated short-convolution blocks (the layers whose head_count_kv is 0) among
     * GQA attention layers with Q/K norms; the final norm is named token_embd_norm. */
    {.name = "lfm2", .arch = KIRI_ARCH_LFM2, .rope_mode = KIRI_ROPE_NEOX, .has_qk_norm = 1, .layer_arrays = 1,
     .output_norm = "token_embd_norm.weight", .shapes = lfm2_shapes},
    /* Qwen3.5 dense (text): Gated DeltaNet layers among full-attention layers whose queries carry
     * an output gate; Q/K norms; the feed-forward's norm is named post_attention_norm; RoPE on
     * part of each head. */
    {.name = "qwen35", .arch = KIRI_ARCH_QWEN35, .rope_mode = KIRI_ROPE_NEOX, .has_qk_norm = 1,
     .ffn_norm = "post_attention_norm.weight", .nextn = 1, .shapes = qwen35_shapes},
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

/* The array key "<arch>.<suffix>" of one int32/uint32 (or, with bools, bool) per layer. */
static int layer_array(const struct kiri_gguf *g, const char *arch, const char *suffix, int n_layer, int bools,
                       int *et, const void **data, struct kiri_status_info *info)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint64_t n = 0;
    const int rc = kiri_gguf_get_arr(g, key, 1, et, &n, data, info);
    if (rc < 0)
        return rc;
    if ((*et != KIRI_GGUF_UINT32 && *et != KIRI_GGUF_INT32 && !(bools && *et == KIRI_GGUF_BOOL)) ||
        n != (uint64_t)n_layer)
        return bad_hparam(info, g, arch, suffix,
                          bools ? "must be a number or one bool/int32/uint32 per layer"
                                : "must be a number or one int32/uint32 per layer");
    return KIRI_OK;
}

/* The array key "<arch>.<suffix>" of n_array bools (or int32/uint32) as flags (0 or 1) of its
 * first n_layer entries. */
static int get_layer_flags(const struct kiri_gguf *g, const char *arch, const char *suffix, int n_array, int n_layer,
                           uint8_t *flags, struct kiri_status_info *info)
{
    int et = 0;
    const void *data = NULL;
    const int rc = layer_array(g, arch, suffix, n_array, 1, &et, &data, info);
    if (rc < 0)
        return rc;
    const size_t es = et == KIRI_GGUF_BOOL ? 1 : 4;
    for (int l = 0; l < n_layer; l++) {
        uint32_t v = 0;
        memcpy(&v, (const char *)data + (size_t)l * es, es);
        flags[l] = v != 0;
    }
    return KIRI_OK;
}

/* A key that is one number for every layer or an array of one per layer (int32 or uint32), as
 * llama.cpp's get_key_or_arr reads it: vals gets n_layer values. Returns 1 when it is absent
 * (vals untouched), KIRI_OK, or an error. */
static int get_layer_u32(const struct kiri_gguf *g, const char *arch, const char *suffix, int required, int n_layer,
                         uint32_t *vals, struct kiri_status_info *info)
{
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    const int64_t k = kiri_gguf_find_key(g, key);
    if (k < 0 || kiri_gguf_kv_type(g, k) != KIRI_GGUF_ARRAY) {
        uint32_t v = 0;
        const int rc = kiri_gguf_get_u32(g, key, required, &v, info);
        for (int l = 0; rc == KIRI_OK && l < n_layer; l++)
            vals[l] = v;
        return rc;
    }
    int et = 0;
    const void *data = NULL;
    int rc = layer_array(g, arch, suffix, n_layer, 0, &et, &data, info);
    if (rc < 0)
        return rc;
    for (int l = 0; l < n_layer; l++) {
        uint32_t v;
        memcpy(&v, (const char *)data + (size_t)l * 4, 4);
        if (et == KIRI_GGUF_INT32 && (int32_t)v < 0)
            return bad_hparam(info, g, arch, suffix, "must not be negative");
        vals[l] = v;
    }
    return KIRI_OK;
}

/* The largest of a per-layer key's values (see get_layer_u32). */
static int get_layer_max(const struct kiri_gguf *g, const char *arch, const char *suffix, int required, int n_layer,
                         uint32_t *out, struct kiri_status_info *info)
{
    uint32_t vals[KIRI_MAX_LAYERS];
    const int rc = get_layer_u32(g, arch, suffix, required, n_layer, vals, info);
    if (rc != KIRI_OK)
        return rc;
    *out = 0;
    for (int l = 0; l < n_layer; l++)
        *out = vals[l] > *out ? vals[l] : *out;
    return KIRI_OK;
}

/* rope.scaling.type and its factor, read as llama.cpp reads them: no type means linear; "none"
 * never scales; the factor (rope.scaling.factor, or the older rope.scale_linear) scales positions
 * linearly, and 0, which llama.cpp's model saver writes for "unset", means no scaling. longrope
 * switches the frequency factors from rope_freqs to LongRoPE's two sets. Other types (yarn, ...)
 * are refused by name. */
static int load_rope_scaling(const struct kiri_gguf *g, const char *a, float *factor, int *longrope,
                             struct kiri_status_info *info)
{
    char key[128];
    struct kiri_gguf_str st = {0};
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    int rc = kiri_gguf_get_str(g, key, 0, &st, info);
    if (rc < 0)
        return rc;
    const int has_type = rc == KIRI_OK;
#define IS(lit) (st.len == sizeof lit - 1 && memcmp(st.ptr, lit, sizeof lit - 1) == 0)
    const int none = has_type && IS("none");
    if (has_type && !none && !IS("linear") && !IS("longrope"))
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, key, (int64_t)kiri_gguf_kv_offset(g, kiri_gguf_find_key(g, key)),
                             "rope scaling type '%.*s' is not supported (kiri runs none, linear and longrope)",
                             (int)(st.len > 32 ? 32 : st.len), st.ptr);
    if (has_type && IS("longrope"))
        *longrope = 1;
#undef IS
    const char *which = "rope.scaling.factor";
    *factor = 0.0f;
    if ((rc = get_f32_key(g, a, which, 0, factor, info)) < 0)
        return rc;
    if (rc == 1) {
        which = "rope.scale_linear";
        if ((rc = get_f32_key(g, a, which, 0, factor, info)) < 0)
            return rc;
    }
    if (*factor < 0.0f || !isfinite(*factor))
        return bad_hparam(info, g, a, which, "must be positive, finite or 0 (no scaling)");
    if (*factor == 0.0f || none)
        *factor = 1.0f;
    return KIRI_OK;
}

/* attention.scale: llama.cpp does not read it for most architectures here (their graphs scale
 * scores by 1/sqrt(head size)), and its saver writes 0 for "unset". 0 and the default load;
 * another value is a variant kiri would have to guess at, so it is refused by name. */
static int check_attention_scale(const struct kiri_gguf *g, const char *a, uint32_t head_dim,
                                 struct kiri_status_info *info)
{
    float scale = 0.0f;
    const int rc = get_f32_key(g, a, "attention.scale", 0, &scale, info);
    if (rc < 0)
        return rc;
    const float def = 1.0f / sqrtf((float)head_dim);
    if (scale == 0.0f || fabsf(scale - def) <= 1e-6f * def)
        return KIRI_OK;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.scale", a);
    return kiri_error_at(info, KIRI_E_UNSUPPORTED, key, (int64_t)kiri_gguf_kv_offset(g, kiri_gguf_find_key(g, key)),
                         "%s %g is not supported for %s (its graph scales attention by 1/sqrt(head size) = %g)",
                         key, (double)scale, a, (double)def);
}

static int load_hparams(const struct kiri_gguf *g, const struct arch_info *ai, struct kiri_hparams *hp,
                        struct kiri_status_info *info)
{
    const char *a = ai->name;
    uint32_t ctx = 0, embd = 0, layers = 0, ff = 0, head = 0, head_kv = 0, key_len = 0, rot = 0;
    int rc;
    if ((rc = get_u32_key(g, a, "context_length", 1, &ctx, info)) < 0 ||
        (rc = get_u32_key(g, a, "embedding_length", 1, &embd, info)) < 0 ||
        (rc = get_u32_key(g, a, "block_count", 1, &layers, info)) < 0)
        return rc;
    if (layers == 0 || layers > KIRI_MAX_LAYERS)
        return bad_hparam(info, g, a, "block_count", "must be 1..512");
    uint32_t nextn = 0;
    if (ai->nextn && (rc = get_u32_key(g, a, "nextn_predict_layers", 0, &nextn, info)) < 0)
        return rc;
    if (nextn >= layers)
        return bad_hparam(info, g, a, "nextn_predict_layers", "must be below block_count");
    if (ai->layer_arrays) {
        if ((rc = get_layer_max(g, a, "feed_forward_length", 1, (int)layers, &ff, info)) < 0 ||
            (rc = get_layer_max(g, a, "attention.head_count", 1, (int)layers, &head, info)) < 0)
            return rc;
    } else if ((rc = get_u32_key(g, a, "feed_forward_length", 1, &ff, info)) < 0 ||
               (rc = get_u32_key(g, a, "attention.head_count", 1, &head, info)) < 0) {
        return rc;
    }
    if (ctx == 0 || ctx > (1u << 24))
        return bad_hparam(info, g, a, "context_length", "must be 1..2^24");
    if (embd == 0 || embd > (1u << 20))
        return bad_hparam(info, g, a, "embedding_length", "must be 1..2^20");
    if (ff == 0 || ff > (1u << 22))
        return bad_hparam(info, g, a, "feed_forward_length", "must be 1..2^22");
    if (head == 0 || head > 4096)
        return bad_hparam(info, g, a, "attention.head_count", "must be 1..4096");
    head_kv = head;
    /* Per-layer counts are checked layer by layer (gemma4_shapes). */
    if (ai->layer_arrays)
        rc = get_layer_max(g, a, "attention.head_count_kv", 0, (int)layers, &head_kv, info);
    else
        rc = get_u32_key(g, a, "attention.head_count_kv", 0, &head_kv, info);
    if (rc < 0)
        return rc;
    if (head_kv == 0 || (!ai->layer_arrays && head % head_kv != 0))
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

    int longrope = ai->longrope;
    if ((rc = load_rope_scaling(g, a, &factor, &longrope, info)) < 0)
        return rc;
    float attn_factor = 1.0f;
    if ((rc = get_f32_key(g, a, "rope.scaling.attn_factor", 0, &attn_factor, info)) < 0)
        return rc;
    if (!(attn_factor > 0.0f) || !isfinite(attn_factor))
        return bad_hparam(info, g, a, "rope.scaling.attn_factor", "must be positive and finite");
    /* 0 (what llama.cpp's saver writes when unset) means the training context, as in llama.cpp. */
    uint32_t ctx_orig = 0;
    if ((rc = get_u32_key(g, a, "rope.scaling.original_context_length", 0, &ctx_orig, info)) < 0)
        return rc;
    if (ctx_orig == 0)
        ctx_orig = ctx;
    if (ctx_orig > (1u << 24))
        return bad_hparam(info, g, a, "rope.scaling.original_context_length", "must be at most 2^24");
    if (!ai->attn_scale_key && (rc = check_attention_scale(g, a, key_len, info)) < 0)
        return rc;

    hp->arch = ai->arch;
    hp->n_ctx_train = (int32_t)ctx;
    hp->n_embd = (int32_t)embd;
    hp->n_layer = (int32_t)(layers - nextn);
    hp->n_layer_nextn = (int32_t)nextn;
    hp->n_head = (int32_t)head;
    hp->n_head_kv = (int32_t)head_kv;
    hp->head_dim = (int32_t)key_len;
    hp->n_ff = (int32_t)ff;
    hp->n_rot = (int32_t)rot;
    hp->rope_mode = ai->rope_mode;
    hp->rope_freq_base = base;
    hp->rope_freq_scale = 1.0f / factor;
    hp->rope_attn_factor = attn_factor;
    hp->rope_longrope = longrope;
    hp->n_ctx_orig = (int32_t)ctx_orig;
    hp->rms_eps = eps;
    hp->attn_scale = 1.0f / sqrtf((float)key_len);
    hp->embd_scale = 1.0f;
    hp->residual_scale = 1.0f;
    hp->logit_scale = 1.0f;
    hp->rope_freq_base_swa = base;
    hp->n_layer_kv = hp->n_layer;
    hp->head_dim_swa = (int32_t)key_len;
    hp->n_rot_swa = (int32_t)rot;
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
        return kiri_error_set(info, KIRI_E_UNSUPPORTED,
                              "mixture-of-experts models (%s.expert_count %u) are not supported", ai->name, experts);
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */

enum weight_kind { WEIGHT_MATRIX, WEIGHT_VECTOR, WEIGHT_EMBEDDING };

/* Room in the descriptor table: per layer, and for the weights outside the layers. */
#define TENSORS_PER_LAYER 32
#define TENSORS_GLOBAL 16
#define MAX_PARTS 3

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

/* Finds a file tensor and records that the graph uses it (see check_all_used). */
static const struct kiri_gguf_tensor *find_used(struct kiri_model *m, const char *name)
{
    const struct kiri_gguf_tensor *gt = kiri_gguf_find_tensor(m->gguf, name);
    if (gt)
        m->tensor_used[gt - kiri_gguf_tensor(m->gguf, 0)] = 1;
    return gt;
}

/* Fills the next descriptor with a view of file tensor gt: elements [first, first + count) of a
 * vector, rows [first, first + count) of a matrix (the whole tensor when it is not fused). */
static int describe(struct kiri_model *m, const struct kiri_gguf_tensor *gt, int dims, int64_t first, int64_t count,
                    struct kiri_tensor **out, struct kiri_status_info *info)
{
    if (m->n_tensors >= (m->hp.n_layer + 1) * TENSORS_PER_LAYER + TENSORS_GLOBAL)
        return kiri_error_set(info, KIRI_E_MODEL_INVALID, "too many weights (at %s)", gt->name);
    struct kiri_tensor *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    t->type = gt->type;
    t->nb[0] = kiri_type_size(gt->type);
    t->nb[1] = kiri_row_bytes(gt->type, gt->ne[0]);
    size_t skip, bytes;
    if (dims == 1) {
        t->ne[0] = count;
        t->ne[1] = 1;
        t->nb[1] = t->nb[0] * (size_t)count;
        skip = (size_t)first * t->nb[0];
        bytes = t->nb[1];
    } else {
        t->ne[0] = gt->ne[0];
        t->ne[1] = count;
        skip = (size_t)first * t->nb[1];
        bytes = (size_t)count * t->nb[1];
    }
    t->ne[2] = t->ne[3] = 1;
    t->nb[2] = t->nb[3] = t->nb[1] * (size_t)t->ne[1];
    t->data = (char *)gt->data + skip;
    t->name = gt->name;
    m->weight_bytes += bytes;
    *out = t;
    return KIRI_OK;
}

/* Finds a tensor, checks its shape and type, and fills one descriptor per part: a vector of
 * n = sum(parts) elements or a matrix (ne0, n), split into consecutive parts of parts[i] elements
 * or rows (a fused tensor). outs[i] are all NULL for an absent optional tensor. */
static int take_parts(struct kiri_model *m, const char *name, int64_t ne0, int n_parts, const int64_t *parts,
                      enum weight_kind kind, int required, struct kiri_tensor **outs, struct kiri_status_info *info)
{
    int64_t n = 0;
    for (int i = 0; i < n_parts; i++) {
        outs[i] = NULL;
        n += parts[i];
    }
    const struct kiri_gguf_tensor *gt = find_used(m, name);
    if (!gt) {
        if (required)
            return kiri_error_at(info, KIRI_E_MODEL_INVALID, name, -1, "required tensor %s is missing", name);
        return KIRI_OK;
    }
    const int want_dims = kind == WEIGHT_VECTOR ? 1 : 2;
    const int64_t want0 = want_dims == 1 ? n : ne0, want1 = want_dims == 1 ? 1 : n;
    if (gt->n_dims != want_dims || gt->ne[0] != want0 || (want_dims == 2 && gt->ne[1] != want1))
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, name, -1,
                             "tensor %s has wrong shape [%lld, %lld], expected [%lld, %lld]", name,
                             (long long)gt->ne[0], (long long)gt->ne[1], (long long)want0, (long long)want1);
    if (kind == WEIGHT_VECTOR ? gt->type != KIRI_TYPE_F32 : !supported_matrix_type(gt->type))
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, name, -1, "tensor %s has type %s, which kiri cannot use here",
                             name, kiri_type_name(gt->type));
    int64_t first = 0;
    for (int i = 0; i < n_parts; i++) {
        const int rc = describe(m, gt, want_dims, first, parts[i], &outs[i], info);
        if (rc < 0)
            return rc;
        first += parts[i];
    }
    return KIRI_OK;
}

/* One tensor as a whole: a vector of ne0 elements or a matrix (ne0, ne1). */
static int take_weight(struct kiri_model *m, const char *name, int64_t ne0, int64_t ne1,
                       enum weight_kind kind, int required, struct kiri_tensor **out,
                       struct kiri_status_info *info)
{
    const int64_t n = kind == WEIGHT_VECTOR ? ne0 : ne1;
    return take_parts(m, name, ne0, 1, &n, kind, required, out, info);
}

/* A weight's per-tensor scale tensors, "<base>.scale" and "<base>.input_scale", shape {1} F32.
 * The scale multiplies the weight's product (it is what NVFP4's second-level scale and similar
 * per-tensor schemes store); it is read here from the mapping, 1 when absent.
 *
 * The input scale is a calibration value for quantizing the activations that enter the product
 * (static activation quantization). llama.cpp loads it on every projection and no graph of its
 * uses it: its products, like kiri's, take the activations as they are, so the value does not
 * change the result. kiri likewise checks it and accepts it without using it. */
static int take_scales(struct kiri_model *m, const char *base, float *scale, struct kiri_status_info *info)
{
    static const char *const suffixes[2] = {"scale", "input_scale"};
    *scale = 1.0f;
    for (int i = 0; i < 2; i++) {
        char name[KIRI_GGUF_MAX_NAME + 32];
        snprintf(name, sizeof name, "%s.%s", base, suffixes[i]);
        const struct kiri_gguf_tensor *gt = find_used(m, name);
        if (!gt)
            continue;
        if (gt->type != KIRI_TYPE_F32 || gt->n_dims != 1 || gt->ne[0] != 1)
            return kiri_error_at(info, KIRI_E_UNSUPPORTED, name, -1,
                                 "tensor %s must be one F32 value (it is %s [%lld])", name,
                                 kiri_type_name(gt->type), (long long)gt->ne[0]);
        float v;
        memcpy(&v, gt->data, sizeof v);
        if (!isfinite(v))
            return kiri_error_at(info, KIRI_E_MODEL_INVALID, name, -1, "tensor %s is not finite", name);
        if (i == 0)
            *scale = v;
    }
    return KIRI_OK;
}

/* A projection "<base>.weight" of n_in inputs and sum(parts) outputs, with its optional bias
 * "<base>.bias" and scales; n_parts > 1 splits a fused weight (and its bias) into views by rows.
 * ws[i] stay NULL when an optional weight is absent (its bias and scales are not looked for). */
static int take_proj(struct kiri_model *m, const char *base, int64_t n_in, int n_parts, const int64_t *parts,
                     int required, struct kiri_tensor **ws, struct kiri_tensor **bs, float *scale,
                     struct kiri_status_info *info)
{
    char name[KIRI_GGUF_MAX_NAME + 32];
    snprintf(name, sizeof name, "%s.weight", base);
    int rc = take_parts(m, name, n_in, n_parts, parts, WEIGHT_MATRIX, required, ws, info);
    *scale = 1.0f;
    if (rc < 0 || !ws[0])
        return rc;
    snprintf(name, sizeof name, "%s.bias", base);
    if ((rc = take_parts(m, name, 0, n_parts, parts, WEIGHT_VECTOR, 0, bs, info)) < 0)
        return rc;
    return take_scales(m, base, scale, info);
}

/* A gemma4 layer that attends an earlier layer's cache never computes keys or values: llama.cpp
 * loads its attn_k, attn_v and attn_k_norm when a file has them and no graph reads them (the
 * layer's attention reads its source's cache), so a file that carries them means the same as
 * one that does not. They are checked for shape and accepted. */
static int take_unread_kv(struct kiri_model *m, int l, const struct kiri_layer *L, struct kiri_status_info *info)
{
    const int64_t E = m->hp.n_embd, KV = (int64_t)L->n_head_kv * L->head_dim;
    static const char *const names[3] = {"attn_k.weight", "attn_v.weight", "attn_k_norm.weight"};
    for (int i = 0; i < 3; i++) {
        char name[KIRI_GGUF_MAX_NAME + 32];
        snprintf(name, sizeof name, "blk.%d.%s", l, names[i]);
        const struct kiri_gguf_tensor *gt = find_used(m, name);
        const int64_t want0 = i == 2 ? L->head_dim : E, want1 = i == 2 ? 1 : KV;
        if (gt && (gt->ne[0] != want0 || (gt->n_dims == 2 ? gt->ne[1] : 1) != want1))
            return kiri_error_at(info, KIRI_E_MODEL_INVALID, name, -1, "tensor %s has wrong shape", name);
    }
    return KIRI_OK;
}

/* Q, K and V: three weights, or one fused attn_qkv.weight (rows q, then k, then v) used as three
 * views, as llama.cpp accepts for every architecture here. The fused weight's bias is
 * attn_qkv.bias, or, without it, separate q/k/v biases. */
static int take_qkv(struct kiri_model *m, int l, struct kiri_layer *L, struct kiri_status_info *info)
{
    const int64_t E = m->hp.n_embd, KV = (int64_t)L->n_head_kv * L->head_dim;
    const int64_t Q = (int64_t)(L->attn_gated ? 2 : 1) * L->n_head * L->head_dim;
    const int64_t parts[3] = {Q, KV, KV};
    struct kiri_tensor **ws[3] = {&L->wq, &L->wk, &L->wv}, **bs[3] = {&L->bq, &L->bk, &L->bv};
    float *scales[3] = {&L->wq_scale, &L->wk_scale, &L->wv_scale};
    static const char *const names[3] = {"attn_q", "attn_k", "attn_v"};
    char base[64], name[KIRI_GGUF_MAX_NAME + 32];
    int rc;
    snprintf(name, sizeof name, "blk.%d.attn_qkv.weight", l);
    if (kiri_gguf_find_tensor(m->gguf, name)) {
        struct kiri_tensor *w[3], *b[3];
        snprintf(base, sizeof base, "blk.%d.attn_qkv", l);
        if ((rc = take_proj(m, base, E, 3, parts, 1, w, b, &L->wq_scale, info)) < 0)
            return rc;
        L->wk_scale = L->wv_scale = L->wq_scale;
        for (int i = 0; i < 3; i++) {
            *ws[i] = w[i];
            *bs[i] = b[i];
            if (b[0])
                continue;
            snprintf(name, sizeof name, "blk.%d.%s.bias", l, names[i]);
            if ((rc = take_weight(m, name, parts[i], 1, WEIGHT_VECTOR, 0, bs[i], info)) < 0)
                return rc;
        }
        return KIRI_OK;
    }
    /* gemma4: a layer that attends an earlier layer's cache needs only its queries; values
     * may be absent, and then are the keys' projection (llama.cpp's attention_k_eq_v). */
    const int shared = L->kv_source != l, v_optional = m->hp.arch == KIRI_ARCH_GEMMA4;
    for (int i = 0; i < (shared ? 1 : 3); i++) {
        snprintf(base, sizeof base, "blk.%d.%s", l, names[i]);
        if ((rc = take_proj(m, base, E, 1, &parts[i], !(i == 2 && v_optional), ws[i], bs[i], scales[i], info)) < 0)
            return rc;
    }
    if (!shared && !L->wv) {
        L->wv = L->wk;
        L->bv = L->bk;
        L->wv_scale = L->wk_scale;
    }
    return shared ? take_unread_kv(m, l, L, info) : KIRI_OK;
}

/* The feed-forward's three projections; phi3's ffn_up.weight holds the gate's n_ff rows, then
 * the up projection's (llama.cpp's phi3 graph applies SwiGLU's SiLU to the first half), used
 * as two views. */
static int take_ffn(struct kiri_model *m, const struct arch_info *ai, int l, struct kiri_layer *L,
                    struct kiri_status_info *info)
{
    const int64_t E = m->hp.n_embd, F = L->n_ff;
    const int64_t two[2] = {F, F};
    char base[64];
    int rc;
    if (ai->fused_ffn_up) {
        struct kiri_tensor *w[2], *b[2];
        snprintf(base, sizeof base, "blk.%d.ffn_up", l);
        if ((rc = take_proj(m, base, E, 2, two, 1, w, b, &L->w_up_scale, info)) < 0)
            return rc;
        L->w_gate = w[0];
        L->w_up = w[1];
        L->b_gate = b[0];
        L->b_up = b[1];
        L->w_gate_scale = L->w_up_scale;
    } else {
        snprintf(base, sizeof base, "blk.%d.ffn_gate", l);
        if ((rc = take_proj(m, base, E, 1, &F, 1, &L->w_gate, &L->b_gate, &L->w_gate_scale, info)) < 0)
            return rc;
        snprintf(base, sizeof base, "blk.%d.ffn_up", l);
        if ((rc = take_proj(m, base, E, 1, &F, 1, &L->w_up, &L->b_up, &L->w_up_scale, info)) < 0)
            return rc;
    }
    snprintf(base, sizeof base, "blk.%d.ffn_down", l);
    return take_proj(m, base, F, 1, &E, 1, &L->w_down, &L->b_down, &L->w_down_scale, info);
}

/* Every tensor of the file must be one the graph uses: one it would skip is a variant kiri does
 * not know, and running without it would give wrong results. */
static int check_all_used(struct kiri_model *m, struct kiri_status_info *info)
{
    const int64_t n = kiri_gguf_n_tensors(m->gguf);
    for (int64_t i = 0; i < n; i++) {
        if (m->tensor_used[i])
            continue;
        const char *name = kiri_gguf_tensor(m->gguf, i)->name;
        /* qwen35's multi-token-prediction blocks (blk.N. past the trunk) beyond the one the
         * drafter runs: loaded, left unused, and said so (n_mtp_tensors). */
        int blk = -1, len = 0;
        if (m->hp.n_layer_nextn > 0 && sscanf(name, "blk.%d.%n", &blk, &len) == 1 && len > 0 &&
            blk >= m->hp.n_layer && blk < m->hp.n_layer + m->hp.n_layer_nextn) {
            m->n_mtp_tensors++;
            continue;
        }
        /* gemma4 and qwen35 files may carry the vision and audio towers (and their projectors):
         * kiri runs the text model and leaves them alone, and says so (n_tower_tensors). A
         * mixture of experts is refused by name rather than as an unused tensor. */
        if (m->hp.arch == KIRI_ARCH_GEMMA4 || m->hp.arch == KIRI_ARCH_QWEN35) {
            if (strncmp(name, "v.", 2) == 0 || strncmp(name, "a.", 2) == 0 || strncmp(name, "mm.", 3) == 0) {
                m->n_tower_tensors++;
                continue;
            }
            if (strstr(name, ".ffn_gate_inp.") || strstr(name, "_exps."))
                return kiri_error_at(info, KIRI_E_UNSUPPORTED, name, -1,
                                     "tensor %s: %s mixture-of-experts layers are not supported", name, m->arch_name);
        }
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, name, -1,
                             "tensor %s is not used by kiri's %s graph (a variant kiri does not run)", name,
                             m->arch_name);
    }
    return KIRI_OK;
}

/* The next descriptor: n ones (F32) from the model's own vector, for an RMS norm without a
 * weight (the norm op always multiplies by one). */
static int take_ones(struct kiri_model *m, int64_t n, struct kiri_tensor **out, struct kiri_status_info *info)
{
    if (m->n_tensors >= (m->hp.n_layer + 1) * TENSORS_PER_LAYER + TENSORS_GLOBAL)
        return kiri_error_set(info, KIRI_E_MODEL_INVALID, "too many weights (at a norm)");
    if (!m->ones) {
        if (!(m->ones = kiri_mem_array(KIRI_MAX_HEAD_DIM, sizeof *m->ones)))
            return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
        for (int i = 0; i < KIRI_MAX_HEAD_DIM; i++)
            m->ones[i] = 1.0f;
    }
    struct kiri_tensor *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    t->type = KIRI_TYPE_F32;
    t->ne[0] = n;
    t->ne[1] = t->ne[2] = t->ne[3] = 1;
    t->nb[0] = 4;
    t->nb[1] = t->nb[2] = t->nb[3] = 4 * (size_t)n;
    t->data = m->ones;
    t->name = "ones";
    *out = t;
    return KIRI_OK;
}

/* gemma4's per-layer embedding block of layer l and its output scale. */
static int take_per_layer(struct kiri_model *m, int l, struct kiri_layer *L, struct kiri_status_info *info)
{
    const int64_t E = m->hp.n_embd, P = m->hp.n_embd_per_layer;
    char n[KIRI_GGUF_MAX_NAME + 32];
    int rc;
    if (P > 0) {
        snprintf(n, sizeof n, "blk.%d.inp_gate.weight", l);
        if ((rc = take_weight(m, n, E, P, WEIGHT_MATRIX, 1, &L->pl_gate, info)) < 0)
            return rc;
        snprintf(n, sizeof n, "blk.%d.proj.weight", l);
        if ((rc = take_weight(m, n, P, E, WEIGHT_MATRIX, 1, &L->pl_proj, info)) < 0)
            return rc;
        snprintf(n, sizeof n, "blk.%d.post_norm.weight", l);
        if ((rc = take_weight(m, n, E, 1, WEIGHT_VECTOR, 1, &L->pl_post_norm, info)) < 0)
            return rc;
    }
    snprintf(n, sizeof n, "blk.%d.layer_output_scale.weight", l);
    const struct kiri_gguf_tensor *gt = find_used(m, n);
    L->out_scale = 1.0f;
    if (!gt)
        return KIRI_OK;
    if (gt->type != KIRI_TYPE_F32 || gt->n_dims != 1 || gt->ne[0] != 1)
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, n, -1, "tensor %s must be one F32 value", n);
    memcpy(&L->out_scale, gt->data, sizeof L->out_scale);
    if (!isfinite(L->out_scale))
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, n, -1, "tensor %s is not finite", n);
    return KIRI_OK;
}

/* lfm2's short-convolution block of layer l: in_proj (n_embd -> 3 n_embd), the depthwise kernel
 * (n_conv_taps, n_embd) F32 (llama.cpp's convolution reads F32 only) and out_proj. */
static int take_short_conv(struct kiri_model *m, int l, struct kiri_layer *L, struct kiri_status_info *info)
{
    const int64_t E = m->hp.n_embd;
    char n[KIRI_GGUF_MAX_NAME + 32];
    int rc;
    snprintf(n, sizeof n, "blk.%d.shortconv.in_proj.weight", l);
    if ((rc = take_weight(m, n, E, 3 * E, WEIGHT_MATRIX, 1, &L->sc_in, info)) < 0)
        return rc;
    snprintf(n, sizeof n, "blk.%d.shortconv.out_proj.weight", l);
    if ((rc = take_weight(m, n, E, E, WEIGHT_MATRIX, 1, &L->sc_out, info)) < 0)
        return rc;
    snprintf(n, sizeof n, "blk.%d.shortconv.conv.weight", l);
    const struct kiri_gguf_tensor *gt = find_used(m, n);
    if (!gt)
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, n, -1, "required tensor %s is missing", n);
    if (gt->n_dims != 2 || gt->ne[0] != m->hp.n_conv_taps || gt->ne[1] != E)
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, n, -1,
                             "tensor %s has wrong shape [%lld, %lld], expected [%d, %lld]", n, (long long)gt->ne[0],
                             (long long)gt->ne[1], m->hp.n_conv_taps, (long long)E);
    if (gt->type != KIRI_TYPE_F32)
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, n, -1, "tensor %s has type %s; the convolution's kernel must be F32",
                             n, kiri_type_name(gt->type));
    return describe(m, gt, 2, 0, E, &L->sc_conv, info);
}

/* qwen35's Gated DeltaNet block of layer l (see struct kiri_layer): the fused q/k/v projection,
 * the output gate, the convolution's kernel (F32, as llama.cpp's convolution reads it), the
 * decay's bias and ssm_a, the beta and alpha projections, the gated norm and the output. */
static int take_delta_net(struct kiri_model *m, int l, struct kiri_layer *L, struct kiri_status_info *info)
{
    const struct kiri_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, S = hp->ssm_head_dim, Hv = hp->ssm_v_heads;
    const int64_t V = Hv * S, C = 2 * (int64_t)hp->ssm_k_heads * S + V;
    char n[KIRI_GGUF_MAX_NAME + 32];
    int rc;
#define DN(field, suffix, ne0, ne1, kind)                                                          \
    snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                                                 \
    if ((rc = take_weight(m, n, ne0, ne1, kind, 1, &L->field, info)) < 0)                          \
        return rc;
    DN(dn_qkv, "attn_qkv.weight", E, C, WEIGHT_MATRIX)
    DN(dn_z, "attn_gate.weight", E, V, WEIGHT_MATRIX)
    DN(dn_dt, "ssm_dt.bias", Hv, 1, WEIGHT_VECTOR)
    DN(dn_a, "ssm_a", Hv, 1, WEIGHT_VECTOR)
    DN(dn_beta, "ssm_beta.weight", E, Hv, WEIGHT_MATRIX)
    DN(dn_alpha, "ssm_alpha.weight", E, Hv, WEIGHT_MATRIX)
    DN(dn_norm, "ssm_norm.weight", S, 1, WEIGHT_VECTOR)
    DN(dn_out, "ssm_out.weight", V, E, WEIGHT_MATRIX)
#undef DN
    snprintf(n, sizeof n, "blk.%d.ssm_conv1d.weight", l);
    const struct kiri_gguf_tensor *gt = find_used(m, n);
    if (!gt)
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, n, -1, "required tensor %s is missing", n);
    if (gt->n_dims != 2 || gt->ne[0] != hp->n_conv_taps || gt->ne[1] != C)
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, n, -1,
                             "tensor %s has wrong shape [%lld, %lld], expected [%d, %lld]", n, (long long)gt->ne[0],
                             (long long)gt->ne[1], hp->n_conv_taps, (long long)C);
    if (gt->type != KIRI_TYPE_F32)
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, n, -1, "tensor %s has type %s; the convolution's kernel must be F32",
                             n, kiri_type_name(gt->type));
    return describe(m, gt, 2, 0, C, &L->dn_conv, info);
}

/* The attention block's weights of layer l: q, k, v, the output projection, the per-head norms
 * where the family has them (a layer that attends another's cache has no k norm) and gemma4's
 * weightless value norm. */
static int take_attention(struct kiri_model *m, const struct arch_info *ai, int l, struct kiri_layer *L,
                          struct kiri_status_info *info)
{
    const int64_t E = m->hp.n_embd;
    char n[KIRI_GGUF_MAX_NAME + 32];
    int rc;
    if ((rc = take_qkv(m, l, L, info)) < 0)
        return rc;
    snprintf(n, sizeof n, "blk.%d.attn_output", l);
    if ((rc = take_proj(m, n, (int64_t)L->n_head * L->head_dim, 1, &E, 1, &L->wo, &L->bo, &L->wo_scale, info)) < 0)
        return rc;
    if (ai->has_qk_norm) {
        snprintf(n, sizeof n, "blk.%d.attn_q_norm.weight", l);
        if ((rc = take_weight(m, n, L->head_dim, 1, WEIGHT_VECTOR, 1, &L->q_norm, info)) < 0)
            return rc;
        snprintf(n, sizeof n, "blk.%d.attn_k_norm.weight", l);
        if (L->kv_source == l && (rc = take_weight(m, n, L->head_dim, 1, WEIGHT_VECTOR, 1, &L->k_norm, info)) < 0)
            return rc;
    }
    if (m->hp.arch == KIRI_ARCH_GEMMA4 && L->kv_source == l && (rc = take_ones(m, L->head_dim, &L->v_norm, info)) < 0)
        return rc;
    return KIRI_OK;
}

/* qwen35's multi-token-prediction block (struct kiri_mtp_head), layer n_layer: a gated
 * full-attention block as the trunk's, and the nextn tensors that feed and read it; the embedding,
 * the head's norm and the head fall back to the trunk's, as llama.cpp's graph_mtp does. */
static int take_mtp(struct kiri_model *m, const struct arch_info *ai, struct kiri_status_info *info)
{
    const struct kiri_hparams *hp = &m->hp;
    const int l = hp->n_layer;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    struct kiri_layer *L = &m->layers[l];
    struct kiri_mtp_head *h = &m->mtp;
    char n[KIRI_GGUF_MAX_NAME + 32];
    int rc;
    /* A file that keeps the count but not the block (converted without it) runs as the trunk,
     * as llama.cpp's does; a block that is there must be whole. */
    snprintf(n, sizeof n, "blk.%d.nextn.eh_proj.weight", l);
    if (!kiri_gguf_find_tensor(m->gguf, n))
        return KIRI_OK;
    *L = (struct kiri_layer){.n_head = hp->n_head, .n_head_kv = hp->n_head_kv, .head_dim = hp->head_dim,
                             .n_ff = hp->n_ff, .n_rot = hp->n_rot, .kv_source = l, .rope_factors = 1,
                             .out_scale = 1.0f, .attn_gated = 1, .rope = 1, .rope_freq_base = hp->rope_freq_base,
                             .rope_freq_scale = hp->rope_freq_scale};
#define W(dst, suffix, ne0, ne1, kind, req)                                                        \
    snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                                                 \
    if ((rc = take_weight(m, n, ne0, ne1, kind, req, dst, info)) < 0)                             \
        return rc;
    W(&L->attn_norm, "attn_norm.weight", E, 1, WEIGHT_VECTOR, 1)
    if ((rc = take_attention(m, ai, l, L, info)) < 0)
        return rc;
    W(&L->ffn_norm, ai->ffn_norm ? ai->ffn_norm : "ffn_norm.weight", E, 1, WEIGHT_VECTOR, 1)
    if ((rc = take_ffn(m, ai, l, L, info)) < 0)
        return rc;
    W(&h->eh_proj, "nextn.eh_proj.weight", 2 * E, E, WEIGHT_MATRIX, 1)
    W(&h->enorm, "nextn.enorm.weight", E, 1, WEIGHT_VECTOR, 1)
    W(&h->hnorm, "nextn.hnorm.weight", E, 1, WEIGHT_VECTOR, 1)
    W(&h->embed, "nextn.embed_tokens.weight", E, V, WEIGHT_EMBEDDING, 0)
    W(&h->head_norm, "nextn.shared_head_norm.weight", E, 1, WEIGHT_VECTOR, 0)
    W(&h->head, "nextn.shared_head_head.weight", E, V, WEIGHT_MATRIX, 0)
#undef W
    h->head_scale = h->head ? 1.0f : m->output_scale;
    if (!h->embed)
        h->embed = m->tok_embd;
    if (!h->head_norm)
        h->head_norm = m->output_norm;
    if (!h->head)
        h->head = m->output;
    return KIRI_OK;
}

int kiri_model_has_mtp(const struct kiri_model *m) { return m && m->mtp.eh_proj != NULL; }

static int load_weights(struct kiri_model *m, const struct arch_info *ai, struct kiri_status_info *info)
{
    const struct kiri_hparams *hp = &m->hp;
    const int64_t E = hp->n_embd, V = hp->n_vocab;
    /* One MTP block is run as a drafter (llama.cpp runs exactly one); with more, all are left
     * unused. Its layer follows the trunk's. */
    const int mtp = hp->n_layer_nextn == 1;
    m->tensors = kiri_mem_calloc((size_t)(hp->n_layer + mtp) * TENSORS_PER_LAYER + TENSORS_GLOBAL, sizeof *m->tensors);
    m->layers = kiri_mem_calloc((size_t)hp->n_layer + (size_t)mtp, sizeof *m->layers);
    m->layer_t0 = kiri_mem_array((size_t)hp->n_layer + 1, sizeof *m->layer_t0);
    m->tensor_used = kiri_mem_calloc((size_t)kiri_gguf_n_tensors(m->gguf) + 1, 1);
    if (!m->tensors || !m->layers || !m->layer_t0 || !m->tensor_used)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory for the tensor table");
    for (int l = 0; l < hp->n_layer; l++) {
        struct kiri_layer *L = &m->layers[l];
        L->n_head = hp->n_head;
        L->n_head_kv = hp->n_head_kv;
        L->head_dim = hp->head_dim;
        L->n_ff = hp->n_ff;
        L->n_rot = hp->n_rot;
        L->kv_source = l;
        L->rope_factors = 1;
        L->out_scale = 1.0f;
    }
    int rc;
    if (ai->shapes && (rc = ai->shapes(m, info)) < 0)
        return rc;
    if ((rc = take_weight(m, "token_embd.weight", E, V, WEIGHT_EMBEDDING, 1, &m->tok_embd, info)) < 0 ||
        (rc = take_weight(m, ai->output_norm ? ai->output_norm : "output_norm.weight", E, 1, WEIGHT_VECTOR, 1,
                          &m->output_norm, info)) < 0 ||
        (rc = take_proj(m, "output", E, 1, &V, 0, &m->output, &m->output_b, &m->output_scale, info)) < 0)
        return rc;
    if (hp->rope_longrope) {
        if ((rc = take_weight(m, "rope_factors_long.weight", hp->n_rot / 2, 1, WEIGHT_VECTOR, 0, &m->rope_long,
                              info)) < 0 ||
            (rc = take_weight(m, "rope_factors_short.weight", hp->n_rot / 2, 1, WEIGHT_VECTOR, 0, &m->rope_short,
                              info)) < 0)
            return rc;
    } else if (ai->rope_freqs) {
        /* gemma4: one factor per pair of the global head (its proportional RoPE), required when
         * a layer is global, as llama.cpp loads it. */
        const int gemma4 = hp->arch == KIRI_ARCH_GEMMA4;
        int global = 0;
        for (int l = 0; gemma4 && l < hp->n_layer; l++)
            global |= !m->layers[l].swa;
        if ((rc = take_weight(m, "rope_freqs.weight", (gemma4 ? hp->head_dim : hp->n_rot) / 2, 1, WEIGHT_VECTOR,
                              gemma4 && global, &m->rope_freqs, info)) < 0)
            return rc;
    }
    if (hp->n_embd_per_layer > 0) {
        const int64_t PL = (int64_t)hp->n_embd_per_layer * hp->n_layer;
        if ((rc = take_weight(m, "per_layer_token_embd.weight", PL, V, WEIGHT_EMBEDDING, 1, &m->pl_tok_embd,
                              info)) < 0 ||
            (rc = take_weight(m, "per_layer_model_proj.weight", E, PL, WEIGHT_MATRIX, 1, &m->pl_model_proj,
                              info)) < 0 ||
            (rc = take_weight(m, "per_layer_proj_norm.weight", hp->n_embd_per_layer, 1, WEIGHT_VECTOR, 1,
                              &m->pl_proj_norm, info)) < 0)
            return rc;
    }
    if (!m->output) {
        /* Tied embeddings; a bias on the logits still applies (llama.cpp's qwen2 reads one). */
        m->output = m->tok_embd;
        if ((rc = take_weight(m, "output.bias", V, 1, WEIGHT_VECTOR, 0, &m->output_b, info)) < 0)
            return rc;
    }
    for (int l = 0; l < hp->n_layer; l++) {
        struct kiri_layer *L = &m->layers[l];
        char n[KIRI_GGUF_MAX_NAME + 16];
        m->layer_t0[l] = m->n_tensors;
#define W(field, suffix, ne0, ne1, kind, req)                                                      \
        snprintf(n, sizeof n, "blk.%d.%s", l, suffix);                                             \
        if ((rc = take_weight(m, n, ne0, ne1, kind, req, &L->field, info)) < 0)                   \
            return rc;
        W(attn_norm, "attn_norm.weight", E, 1, WEIGHT_VECTOR, 1)
        if (!L->recurrent)
            rc = take_attention(m, ai, l, L, info);
        else
            rc = hp->arch == KIRI_ARCH_QWEN35 ? take_delta_net(m, l, L, info) : take_short_conv(m, l, L, info);
        if (rc < 0)
            return rc;
        W(ffn_norm, ai->ffn_norm ? ai->ffn_norm : "ffn_norm.weight", E, 1, WEIGHT_VECTOR, 1)
        if ((rc = take_ffn(m, ai, l, L, info)) < 0)
            return rc;
        if (ai->has_post_norms) {
            W(attn_post_norm, "post_attention_norm.weight", E, 1, WEIGHT_VECTOR, 1)
            W(ffn_post_norm, "post_ffw_norm.weight", E, 1, WEIGHT_VECTOR, 1)
        }
        if (hp->arch == KIRI_ARCH_GEMMA4 && (rc = take_per_layer(m, l, L, info)) < 0)
            return rc;
#undef W
        L->rope = 1;
        L->rope_freq_base = hp->rope_freq_base;
        L->rope_freq_scale = hp->rope_freq_scale;
    }
    m->layer_t0[hp->n_layer] = m->n_tensors;
    if (mtp && (rc = take_mtp(m, ai, info)) < 0)
        return rc;
    return check_all_used(m, info);
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
 * every layer slides) or one flag per layer (bool or integer, nonzero: slides). gemma4's is
 * always the array (array_only). */
static int gemma3_swa_layers(struct kiri_model *m, int array_only, struct kiri_status_info *info)
{
    const struct kiri_gguf *g = m->gguf;
    struct kiri_hparams *hp = &m->hp;
    const char *a = m->arch_name;
    char key[128];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", a);
    const int64_t k = kiri_gguf_find_key(g, key);
    if (array_only && (k < 0 || kiri_gguf_kv_type(g, k) != KIRI_GGUF_ARRAY))
        return k < 0 ? kiri_error_at(info, KIRI_E_MODEL_INVALID, key, -1, "required key %s is missing", key)
                     : bad_hparam(info, g, a, "attention.sliding_window_pattern", "must be one bool per layer");
    if (k >= 0 && kiri_gguf_kv_type(g, k) == KIRI_GGUF_ARRAY) {
        uint8_t swa[KIRI_MAX_LAYERS];
        int rc = get_layer_flags(g, a, "attention.sliding_window_pattern", hp->n_layer, hp->n_layer, swa, info);
        if (rc < 0)
            return rc;
        for (int l = 0; l < hp->n_layer; l++)
            m->layers[l].swa = swa[l];
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
        if ((rc = gemma3_swa_layers(m, 0, info)) < 0)
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

/* Gemma 4, before its weights: which layers slide (an array, required), each layer's head size
 * (key_length on global layers, key_length_swa on sliding ones, both required equal to their
 * value lengths), rotated dimensions (rope.dimension_count and _swa), KV heads, query heads and
 * feed-forward width (numbers or per-layer arrays), the layers that share an earlier layer's KV,
 * and the per-layer embedding width. */
static int gemma4_shapes(struct kiri_model *m, struct kiri_status_info *info)
{
    const struct kiri_gguf *g = m->gguf;
    struct kiri_hparams *hp = &m->hp;
    const char *a = "gemma4";
    const int n_layer = hp->n_layer;
    uint32_t window = 0, kswa = 0, vswa = 0, rot_swa = 0, shared = 0, per_layer = 0;
    int rc;
    if ((rc = gemma3_swa_layers(m, 1, info)) < 0 ||
        (rc = get_u32_key(g, a, "attention.sliding_window", 1, &window, info)) < 0 ||
        (rc = get_u32_key(g, a, "attention.key_length_swa", 1, &kswa, info)) < 0 ||
        (rc = get_u32_key(g, a, "attention.value_length_swa", 1, &vswa, info)) < 0 ||
        (rc = get_u32_key(g, a, "embedding_length_per_layer_input", 1, &per_layer, info)) < 0)
        return rc;
    if (window == 0 || window > (1u << 24))
        return bad_hparam(info, g, a, "attention.sliding_window", "must be 1..2^24");
    if (kswa == 0 || kswa > KIRI_MAX_HEAD_DIM || kswa % 2)
        return bad_hparam(info, g, a, "attention.key_length_swa", "must be even and 2..1024");
    if (vswa != kswa)
        return bad_hparam(info, g, a, "attention.value_length_swa", "differs from key_length_swa (unsupported)");
    rot_swa = (uint32_t)hp->n_rot;
    if ((rc = get_u32_key(g, a, "rope.dimension_count_swa", 0, &rot_swa, info)) < 0)
        return rc;
    if (rot_swa == 0 || rot_swa > kswa || rot_swa % 2)
        return bad_hparam(info, g, a, "rope.dimension_count_swa", "must be even and at most key_length_swa");
    if ((rc = get_u32_key(g, a, "attention.shared_kv_layers", 0, &shared, info)) < 0)
        return rc;
    if (shared > 0 && shared + 2 > (uint32_t)n_layer)
        return bad_hparam(info, g, a, "attention.shared_kv_layers", "must leave at least two layers with their own KV");
    if (per_layer > 4096)
        return bad_hparam(info, g, a, "embedding_length_per_layer_input", "must be 0..4096");
    uint32_t heads[KIRI_MAX_LAYERS], kv_heads[KIRI_MAX_LAYERS], ff[KIRI_MAX_LAYERS];
    if ((rc = get_layer_u32(g, a, "attention.head_count", 1, n_layer, heads, info)) < 0 ||
        (rc = get_layer_u32(g, a, "feed_forward_length", 1, n_layer, ff, info)) < 0)
        return rc;
    memcpy(kv_heads, heads, sizeof heads);
    if ((rc = get_layer_u32(g, a, "attention.head_count_kv", 0, n_layer, kv_heads, info)) < 0)
        return rc;
    hp->head_dim_swa = (int32_t)kswa;
    hp->n_rot_swa = (int32_t)rot_swa;
    hp->n_embd_per_layer = (int32_t)per_layer;
    hp->n_layer_kv = n_layer - (int32_t)shared;
    hp->swa_window = (int32_t)window;
    for (int l = 0; l < n_layer; l++) {
        struct kiri_layer *L = &m->layers[l];
        if (heads[l] == 0 || heads[l] > 4096)
            return bad_hparam(info, g, a, "attention.head_count", "must be 1..4096 on every layer");
        if (kv_heads[l] == 0 || heads[l] % kv_heads[l])
            return bad_hparam(info, g, a, "attention.head_count_kv", "must divide attention.head_count on every layer");
        if (ff[l] == 0 || ff[l] > (1u << 22))
            return bad_hparam(info, g, a, "feed_forward_length", "must be 1..2^22 on every layer");
        L->n_head = (int32_t)heads[l];
        L->n_head_kv = (int32_t)kv_heads[l];
        L->n_ff = (int32_t)ff[l];
        L->head_dim = L->swa ? (int32_t)kswa : hp->head_dim;
        L->n_rot = L->swa ? (int32_t)rot_swa : hp->n_rot;
        L->rope_factors = !L->swa;
        /* llama.cpp's mapping: a shared sliding layer reads layer n_kv - 2, a shared global one
         * layer n_kv - 1; that layer must be of the same kind (its keys are its kind's shape). */
        if (l >= hp->n_layer_kv) {
            const int src = hp->n_layer_kv - (L->swa ? 2 : 1);
            if (m->layers[src].swa != L->swa)
                return bad_hparam(info, g, a, "attention.shared_kv_layers",
                                  "maps a layer to the KV of a layer of the other kind (sliding or global)");
            L->kv_source = src;
        }
    }
    for (int l = hp->n_layer_kv; l < n_layer; l++) {
        const struct kiri_layer *S = &m->layers[m->layers[l].kv_source];
        if (S->n_head_kv != m->layers[l].n_head_kv)
            return bad_hparam(info, g, a, "attention.head_count_kv", "differs between a shared layer and its source");
    }
    return KIRI_OK;
}

/* Gemma 4, after its weights: gemma3's RoPE bases (freq_base_swa, default 10000, on the sliding
 * layers), embeddings times sqrt(n_embd), GeGLU; attention scale 1 (its queries and keys are
 * RMS-normed, llama.cpp ignores attention.scale). The logits are soft-capped at 30 unless the file
 * says otherwise (0: not capped), as llama.cpp reads the key for gemma4 (gemma3's default is 0). */
static int gemma4_hparams(struct kiri_model *m, struct kiri_status_info *info)
{
    const struct kiri_gguf *g = m->gguf;
    struct kiri_hparams *hp = &m->hp;
    float base_swa = 10000.0f, cap = 30.0f;
    int rc;
    if ((rc = get_f32_key(g, "gemma4", "rope.freq_base_swa", 0, &base_swa, info)) < 0 ||
        (rc = get_f32_key(g, "gemma4", "final_logit_softcapping", 0, &cap, info)) < 0)
        return rc;
    if (!(base_swa > 0.0f) || !isfinite(base_swa))
        return bad_hparam(info, g, "gemma4", "rope.freq_base_swa", "must be positive");
    if (cap < 0.0f || !isfinite(cap))
        return bad_hparam(info, g, "gemma4", "final_logit_softcapping", "must not be negative");
    hp->rope_freq_base_swa = base_swa;
    for (int l = 0; l < hp->n_layer; l++)
        if (m->layers[l].swa) {
            m->layers[l].rope_freq_base = base_swa;
            m->layers[l].rope_freq_scale = 1.0f;
        }
    hp->final_softcap = cap;
    hp->embd_scale = sqrtf((float)hp->n_embd);
    hp->attn_scale = 1.0f;
    hp->ffn_gelu = 1;
    return KIRI_OK;
}

/* LFM2, before its weights: shortconv.l_cache (the convolution's taps, required) and which layers
 * are short-convolution blocks, those whose head_count_kv is 0 in the per-layer array (as
 * llama.cpp decides). The others attend with their own KV head count, which must divide
 * head_count. A sliding window on the attention layers (attention.sliding_window) and
 * bidirectional files (attention.causal false) are not run. */
static int lfm2_shapes(struct kiri_model *m, struct kiri_status_info *info)
{
    const struct kiri_gguf *g = m->gguf;
    struct kiri_hparams *hp = &m->hp;
    const char *a = "lfm2";
    uint32_t taps = 0, window = 0, kv[KIRI_MAX_LAYERS];
    int rc;
    if ((rc = get_u32_key(g, a, "shortconv.l_cache", 1, &taps, info)) < 0)
        return rc;
    if (taps < 2 || taps > 16)
        return bad_hparam(info, g, a, "shortconv.l_cache", "must be 2..16");
    if ((rc = get_u32_key(g, a, "attention.sliding_window", 0, &window, info)) < 0)
        return rc;
    if (window > 0)
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, "lfm2.attention.sliding_window", -1,
                             "lfm2.attention.sliding_window %u: lfm2 with sliding-window attention is not supported",
                             window);
    /* LFM2.5's embedding models (Lfm2BidirectionalModel) attend both ways and pad their
     * convolutions on both sides: not a text generator. */
    int causal = 1;
    if ((rc = kiri_gguf_get_bool(g, "lfm2.attention.causal", 0, &causal, info)) < 0)
        return rc;
    if (!causal)
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, "lfm2.attention.causal", -1,
                             "lfm2.attention.causal is false: bidirectional lfm2 (embedding) models are not supported");
    for (int l = 0; l < hp->n_layer; l++)
        kv[l] = (uint32_t)hp->n_head;
    if ((rc = get_layer_u32(g, a, "attention.head_count_kv", 0, hp->n_layer, kv, info)) < 0)
        return rc;
    uint32_t heads[KIRI_MAX_LAYERS], ff[KIRI_MAX_LAYERS];
    if ((rc = get_layer_u32(g, a, "attention.head_count", 1, hp->n_layer, heads, info)) < 0 ||
        (rc = get_layer_u32(g, a, "feed_forward_length", 1, hp->n_layer, ff, info)) < 0)
        return rc;
    for (int l = 0; l < hp->n_layer; l++) {
        struct kiri_layer *L = &m->layers[l];
        if (heads[l] != (uint32_t)hp->n_head || ff[l] != (uint32_t)hp->n_ff)
            return bad_hparam(info, g, a, heads[l] != (uint32_t)hp->n_head ? "attention.head_count" : "feed_forward_length",
                              "must be the same on every layer (lfm2)");
        L->recurrent = kv[l] == 0;
        if (!L->recurrent && hp->n_head % (int32_t)kv[l] != 0)
            return bad_hparam(info, g, a, "attention.head_count_kv", "must divide attention.head_count on every "
                              "attention layer");
        L->n_head_kv = L->recurrent ? hp->n_head_kv : (int32_t)kv[l];
    }
    hp->n_conv_taps = (int32_t)taps;
    return KIRI_OK;
}

/* Qwen3.5, before its weights (as llama.cpp's qwen35 loader reads it): the Gated DeltaNet layers
 * are those attention.recurrent_layers marks, or without that array every layer but each
 * full_attention_interval-th (4 unless the file says); their shapes come from ssm.conv_kernel,
 * ssm.state_size (the head size of keys and values), ssm.group_count (key heads),
 * ssm.time_step_rank (value heads, a multiple of the key heads) and ssm.inner_size (value heads
 * times the head size). The attention layers' queries carry their output gate. Their RoPE is
 * llama.cpp's interleaved multi-section one, which at text positions (the first three sections
 * at the token's position, the fourth at 0) is NEOX RoPE over rope.dimension_count when every
 * rotated pair falls to one of the first three sections; sections that leave pairs to the
 * fourth are refused. */
static int qwen35_shapes(struct kiri_model *m, struct kiri_status_info *info)
{
    const struct kiri_gguf *g = m->gguf;
    struct kiri_hparams *hp = &m->hp;
    const char *a = "qwen35";
    uint32_t taps = 0, inner = 0, S = 0, Hv = 0, Hk = 0, interval = 4;
    int rc;
    if ((rc = get_u32_key(g, a, "ssm.conv_kernel", 1, &taps, info)) < 0 ||
        (rc = get_u32_key(g, a, "ssm.inner_size", 1, &inner, info)) < 0 ||
        (rc = get_u32_key(g, a, "ssm.state_size", 1, &S, info)) < 0 ||
        (rc = get_u32_key(g, a, "ssm.time_step_rank", 1, &Hv, info)) < 0 ||
        (rc = get_u32_key(g, a, "ssm.group_count", 1, &Hk, info)) < 0)
        return rc;
    if (taps < 2 || taps > 16)
        return bad_hparam(info, g, a, "ssm.conv_kernel", "must be 2..16");
    if (S < 1 || S > 256)
        return bad_hparam(info, g, a, "ssm.state_size", "must be 1..256");
    if (Hk < 1 || Hk > 4096)
        return bad_hparam(info, g, a, "ssm.group_count", "must be 1..4096");
    if (Hv < 1 || Hv > 4096 || Hv % Hk != 0)
        return bad_hparam(info, g, a, "ssm.time_step_rank", "must be 1..4096 and a multiple of ssm.group_count");
    if ((uint64_t)inner != (uint64_t)Hv * S)
        return bad_hparam(info, g, a, "ssm.inner_size", "must be ssm.time_step_rank times ssm.state_size");
    char key[128];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", a);
    if (kiri_gguf_find_key(g, key) >= 0) {
        uint8_t rec[KIRI_MAX_LAYERS];
        if ((rc = get_layer_flags(g, a, "attention.recurrent_layers", hp->n_layer + hp->n_layer_nextn, hp->n_layer,
                                  rec, info)) < 0)
            return rc;
        for (int l = 0; l < hp->n_layer; l++)
            m->layers[l].recurrent = rec[l];
    } else {
        if ((rc = get_u32_key(g, a, "full_attention_interval", 0, &interval, info)) < 0)
            return rc;
        if (interval < 1 || interval > KIRI_MAX_LAYERS)
            return bad_hparam(info, g, a, "full_attention_interval", "must be 1..512");
        for (int l = 0; l < hp->n_layer; l++)
            m->layers[l].recurrent = (uint32_t)(l + 1) % interval != 0;
    }
    for (int l = 0; l < hp->n_layer; l++)
        m->layers[l].attn_gated = !m->layers[l].recurrent;
    /* rope.dimension_sections: four counts (llama.cpp reads 4, allowing a longer array). */
    snprintf(key, sizeof key, "%s.rope.dimension_sections", a);
    int et = 0;
    uint64_t n_sec = 0;
    const void *data = NULL;
    if ((rc = kiri_gguf_get_arr(g, key, 1, &et, &n_sec, &data, info)) < 0)
        return rc;
    if ((et != KIRI_GGUF_INT32 && et != KIRI_GGUF_UINT32) || n_sec < 4)
        return bad_hparam(info, g, a, "rope.dimension_sections", "must be at least four int32/uint32 counts");
    int32_t sec[4];
    memcpy(sec, data, sizeof sec);
    int64_t total = 0;
    for (int i = 0; i < 4; i++) {
        if (sec[i] < 0 || sec[i] > 4096)
            return bad_hparam(info, g, a, "rope.dimension_sections", "must hold counts 0..4096");
        total += sec[i];
    }
    if (total == 0)
        return bad_hparam(info, g, a, "rope.dimension_sections", "must not all be 0");
    for (int i = 0; i < hp->n_rot / 2; i++) {
        const int sector = (int)(i % total);
        const int by_pos = (sector % 3 == 0 && sector < 3 * sec[0]) || (sector % 3 == 1 && sector < 3 * sec[1]) ||
                           (sector % 3 == 2 && sector < 3 * sec[2]);
        if (!by_pos)
            return kiri_error_at(info, KIRI_E_UNSUPPORTED, "qwen35.rope.dimension_sections", -1,
                                 "qwen35.rope.dimension_sections [%d, %d, %d, %d] turn rotated pair %d by the "
                                 "fourth (extra) position, which text tokens do not have: not supported",
                                 sec[0], sec[1], sec[2], sec[3], i);
    }
    hp->n_conv_taps = (int32_t)taps;
    hp->ssm_head_dim = (int32_t)S;
    hp->ssm_k_heads = (int32_t)Hk;
    hp->ssm_v_heads = (int32_t)Hv;
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
    /* gemma4: the per-layer inputs are made beside the embedding, and a shared layer attends its
     * source's cache; a split would have to carry both across (not done). */
    if (p->gpu_layers > 0 && m->hp.n_embd_per_layer > 0)
        return kiri_error_set(info, KIRI_E_UNSUPPORTED,
                              "gpu layers %d: a model with per-layer embeddings runs on one backend (gpu layers 0 "
                              "or all %d)", p->gpu_layers, n_layer);
    for (int l = p->gpu_layers; l < n_layer && p->gpu_layers > 0; l++)
        if (m->layers[l].kv_source < p->gpu_layers)
            return kiri_error_set(info, KIRI_E_UNSUPPORTED,
                                  "gpu layers %d would run layer %d apart from layer %d, whose KV it attends",
                                  p->gpu_layers, l, m->layers[l].kv_source);
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

/* The backend that runs a recurrent layer must run its ops: the short convolution
 * (KIRI_OP_SHORT_CONV), and on qwen35 the delta rule (KIRI_OP_DELTA_NET; its gates come with
 * it), and the one that runs a qwen35 attention layer its output gate (KIRI_OP_SIGMOID_MUL); a
 * GPU backend without them refuses the model here, before any request, naming the op. The
 * nodes asked about have the shapes of the graph's (their scratch descriptors carry no data). */
static int check_recurrent_ops(struct kiri_model *m, struct kiri_status_info *info)
{
    const struct kiri_hparams *hp = &m->hp;
    const int qwen35 = hp->arch == KIRI_ARCH_QWEN35;
    const int64_t S = hp->ssm_head_dim, Hk = hp->ssm_k_heads, Hv = hp->ssm_v_heads;
    const int64_t C = qwen35 ? (2 * Hk + Hv) * S : hp->n_embd;
    for (int l = 0; l < hp->n_layer; l++) {
        const struct kiri_layer *L = &m->layers[l];
        const int off = l < m->n_offload;
        const struct kiri_backend_iface *fi = off ? m->off_iface : m->iface;
        if (L->attn_gated) {
            /* The attention output times its gate's sigmoid, the gate a strided view. */
            const int64_t D = L->head_dim;
            struct kiri_tensor att = {.type = KIRI_TYPE_F32, .ne = {D, L->n_head, 1, 1},
                                      .nb = {4, 4 * (size_t)D, 4 * (size_t)D * (size_t)L->n_head,
                                             4 * (size_t)D * (size_t)L->n_head}};
            struct kiri_tensor gate = att;
            gate.nb[1] = 8 * (size_t)D;
            gate.nb[2] = gate.nb[3] = gate.nb[1] * (size_t)L->n_head;
            const struct kiri_node nd = {.op = KIRI_OP_SIGMOID_MUL, .dst = &att, .src = {&att, &gate}};
            if (fi->supports && !fi->supports(off ? m->off_be : m->be, &nd))
                return kiri_error_set(info, KIRI_E_UNSUPPORTED,
                                      "backend %s cannot run %s's gated attention (op sigmoid_mul, layer %d); run it "
                                      "on the CPU (--backend cpu, or --gpu-layers %d)", fi->name, m->arch_name, l, l);
        }
        if (!L->recurrent)
            continue;
        struct kiri_tensor u = {.type = KIRI_TYPE_F32, .ne = {C, 1, 1, 1}, .nb = {4, 4 * (size_t)C, 4 * (size_t)C,
                                                                                 4 * (size_t)C}};
        struct kiri_tensor st = {.type = KIRI_TYPE_F32, .ne = {(hp->n_conv_taps - 1) * C, 1, 1, 1}};
        struct kiri_tensor ids = {.type = KIRI_TYPE_I32, .ne = {1, 1, 1, 1}, .nb = {4, 4, 4, 4}};
        st.nb[0] = 4;
        st.nb[1] = st.nb[2] = st.nb[3] = 4 * (size_t)st.ne[0];
        struct kiri_node nd = {.op = KIRI_OP_SHORT_CONV, .dst = &u,
                               .src = {&u, qwen35 ? L->dn_conv : L->sc_conv, &st, &ids, &ids}};
        nd.p.conv_silu = qwen35;
        const char *op = "short_conv";
        int ok = !fi->supports || fi->supports(off ? m->off_be : m->be, &nd);
        if (ok && qwen35) {
            struct kiri_tensor y = u, gates = u, ds = st;
            y.ne[0] = Hv * S;
            gates.ne[0] = 2 * Hv;
            ds.ne[0] = Hv * S * S;
            struct kiri_node dn = {.op = KIRI_OP_DELTA_NET, .dst = &y, .src = {&u, &gates, &ds, &ids, &ids}};
            dn.p.delta = (struct kiri_delta_params){(int)Hk, (int)Hv, (int)S, 1.0f / sqrtf((float)S)};
            op = "delta_net";
            ok = !fi->supports || fi->supports(off ? m->off_be : m->be, &dn);
        }
        if (!ok)
            return kiri_error_set(info, KIRI_E_UNSUPPORTED,
                                  "backend %s cannot run %s's recurrent layers (op %s, layer %d); run it on the CPU "
                                  "(--backend cpu, or --gpu-layers %d)", fi->name, m->arch_name, op, l, l);
    }
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
    if ((rc = check_recurrent_ops(m, info)) < 0)
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
    struct kiri_tensor *const factors[3] = {m->rope_freqs, m->rope_long, m->rope_short};
    for (int i = 0; i < 3 && m->n_offload; i++) {
        if (!factors[i])
            continue;
        m->rope_off[i] = *factors[i];
        m->rope_off[i].extra = NULL;
        if ((rc = prepare(m->off_iface, m->off_be, &m->rope_off[i], info)) < 0)
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
                           "unsupported architecture '%.*s' (kiri runs llama, qwen2, qwen3, gemma3, gemma4, smollm3, "
                           "granite, phi3, lfm2, qwen35)",
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
    if (m->n_mtp_tensors)
        fprintf(stderr, "kiri: %s: the file's multi-token-prediction head (%d layer%s, %d tensors) is loaded and not "
                "run\n", ai->name, m->hp.n_layer_nextn, m->hp.n_layer_nextn == 1 ? "" : "s", m->n_mtp_tensors);
    if (m->n_tower_tensors)
        fprintf(stderr, "kiri: %s: running the text model; the file's %d vision/audio tensors (v.*, a.*, mm.*) are "
                "not used\n", ai->name, m->n_tower_tensors);
    kiri_mem_free(m->tensor_used);
    m->tensor_used = NULL;
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
        for (int i = 0; i < 3 && m->n_offload && m->off_iface->weight_release; i++)
            m->off_iface->weight_release(m->off_be, &m->rope_off[i]);
        m->iface->free(m->be);
    }
    if (m->off_be)
        m->off_iface->free(m->off_be);
    kiri_threadpool_free(m->pool);
    kiri_platform_mutex_free(m->compute_lock);
    kiri_tokenizer_free(m->tokenizer);
    kiri_mem_free(m->tensors);
    kiri_mem_free(m->tensor_used);
    kiri_mem_free(m->layers);
    kiri_mem_free(m->layer_t0);
    kiri_mem_free(m->ones);
    kiri_gguf_close(m->gguf);
    kiri_mem_free(m);
}

int kiri_model_n_recurrent_layers(const struct kiri_model *m)
{
    int n = 0;
    for (int l = 0; m->layers && l < m->hp.n_layer; l++)
        n += m->layers[l].recurrent != 0;
    return n;
}

int64_t kiri_model_delta_state_offset(const struct kiri_model *m)
{
    const struct kiri_hparams *hp = &m->hp;
    return (int64_t)(hp->n_conv_taps - 1) * (2 * (int64_t)hp->ssm_k_heads + hp->ssm_v_heads) * hp->ssm_head_dim;
}

int64_t kiri_model_state_dim(const struct kiri_model *m, int l)
{
    const struct kiri_hparams *hp = &m->hp;
    if (!m->layers || l < 0 || l >= hp->n_layer || !m->layers[l].recurrent)
        return 0;
    if (hp->arch == KIRI_ARCH_QWEN35)
        return kiri_model_delta_state_offset(m) + (int64_t)hp->ssm_v_heads * hp->ssm_head_dim * hp->ssm_head_dim;
    return (int64_t)(hp->n_conv_taps - 1) * hp->n_embd;
}

size_t kiri_model_state_bytes(const struct kiri_model *m)
{
    size_t n = 0;
    for (int l = 0; l < m->hp.n_layer; l++)
        n += (size_t)kiri_model_state_dim(m, l) * sizeof(float);
    return n;
}

int kiri_model_n_swa_layers(const struct kiri_model *m)
{
    int n = 0;
    for (int l = 0; m->hp.swa_window > 0 && m->layers && l < m->hp.n_layer; l++)
        n += m->layers[l].swa != 0;
    return n;
}

struct kiri_tensor *kiri_model_rope_factors(struct kiri_model *m, int32_t n_ctx, int offload)
{
    int i = 0;
    if (m->hp.rope_longrope)
        i = n_ctx > m->hp.n_ctx_orig ? 1 : 2;
    struct kiri_tensor *const factors[3] = {m->rope_freqs, m->rope_long, m->rope_short};
    if (!factors[i])
        return NULL;
    return offload ? &m->rope_off[i] : factors[i];
}

/* Bytes of one token's keys and values in layer l: 0 for a layer that attends another's. */
static size_t kv_layer_token_bytes(const struct kiri_model *m, int l, int kv_type)
{
    const struct kiri_layer *L = &m->layers[l];
    if (L->kv_source != l || L->recurrent)
        return 0;
    return 2 * kiri_row_bytes(kv_type, (int64_t)L->n_head_kv * L->head_dim);
}

static int windowed_layer(const struct kiri_model *m, int l)
{
    return m->hp.swa_window > 0 && m->layers[l].swa;
}

size_t kiri_model_kv_bytes_per_token(const struct kiri_model *m, int kv_type)
{
    size_t n = 0;
    for (int l = 0; l < m->hp.n_layer; l++)
        n += windowed_layer(m, l) ? 0 : kv_layer_token_bytes(m, l, kv_type);
    return n;
}

size_t kiri_model_kv_bytes_window(const struct kiri_model *m, int kv_type)
{
    size_t n = 0;
    for (int l = 0; l < m->hp.n_layer; l++)
        n += windowed_layer(m, l) ? kv_layer_token_bytes(m, l, kv_type) : 0;
    return n * (size_t)(m->hp.swa_window > 0 ? m->hp.swa_window : 0);
}

int kiri_model_kvcache_init(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                            struct kiri_kvcache **out)
{
    return kiri_model_kvcache_init_swa(m, kv_type, block_size, n_blocks, 0, 1, 0, out);
}

/* The cache of kiri_model_kvcache_init_swa, with the MTP block's layer after the trunk's when
 * with_mtp (on the main backend, as the head). */
static int kvcache_init(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                        int32_t n_swa_blocks, int32_t n_state_slots, int32_t n_snapshots, int with_mtp,
                        struct kiri_kvcache **out)
{
    uint8_t layers[KIRI_MAX_LAYERS + 1];
    int64_t kv_dim[KIRI_MAX_LAYERS + 1], state_dim[KIRI_MAX_LAYERS + 1];
    int32_t source[KIRI_MAX_LAYERS + 1];
    const int n_swa = n_swa_blocks > 0 ? kiri_model_n_swa_layers(m) : 0;
    const int n_layer = m->hp.n_layer + (with_mtp ? 1 : 0);
    for (int l = 0; l < n_layer && l <= KIRI_MAX_LAYERS; l++) {
        const struct kiri_layer *L = &m->layers[l];
        layers[l] = n_swa && L->swa;
        state_dim[l] = kiri_model_state_dim(m, l);
        kv_dim[l] = L->recurrent ? 0 : (int64_t)L->n_head_kv * L->head_dim;
        source[l] = L->kv_source;
    }
    const struct kiri_kvcache_window w = {layers, m->hp.swa_window, n_swa_blocks};
    const struct kiri_kvcache_state st = {state_dim, n_state_slots, n_snapshots};
    const struct kiri_kvcache_layout lay = {kv_dim, source, kiri_model_n_recurrent_layers(m) ? &st : NULL};
    return kiri_kvcache_init_layers(m->iface, m->be, m->n_offload, m->off_iface, m->off_be, n_layer,
                                    (int64_t)m->hp.n_head_kv * m->hp.head_dim, kv_type, block_size, n_blocks,
                                    n_swa ? &w : NULL, &lay, out);
}

int kiri_model_kvcache_init_swa(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                                int32_t n_swa_blocks, int32_t n_state_slots, int32_t n_snapshots,
                                struct kiri_kvcache **out)
{
    return kvcache_init(m, kv_type, block_size, n_blocks, n_swa_blocks, n_state_slots, n_snapshots, 0, out);
}

int kiri_model_kvcache_init_mtp(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                                int32_t n_swa_blocks, int32_t n_state_slots, int32_t n_snapshots,
                                struct kiri_kvcache **out)
{
    return kvcache_init(m, kv_type, block_size, n_blocks, n_swa_blocks, n_state_slots, n_snapshots,
                        kiri_model_has_mtp(m), out);
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
