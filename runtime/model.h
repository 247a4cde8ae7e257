/* A loaded model: its hyperparameters (all from GGUF metadata), its weights as tensor views into
 * the file mapping, its tokenizer, and the backend (with its worker threads) that runs it.
 *
 * Invariants: every weight the architecture needs is present with exactly the expected shape and a
 * type the backend can multiply; optional weights (biases, per-head norms, output, rope factors)
 * are NULL when absent; output points at tok_embd for tied embeddings. Weight data is mapped and
 * lives exactly as long as the model.
 */
#ifndef KIRI_MODEL_H
#define KIRI_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend.h"

struct kiri_gguf;
struct kiri_tokenizer;
struct kiri_threadpool;
struct kiri_mutex;
struct kiri_status_info;
struct kiri_model_params;
struct kiri_kvcache;

enum kiri_arch {
    KIRI_ARCH_LLAMA,
    KIRI_ARCH_QWEN2,
    KIRI_ARCH_QWEN3,
    KIRI_ARCH_GEMMA3,
    KIRI_ARCH_SMOLLM3,
    KIRI_ARCH_GRANITE
};

#define KIRI_MAX_LAYERS 512
#define KIRI_MAX_HEAD_DIM 1024

struct kiri_hparams {
    int arch;                 /* enum kiri_arch */
    int32_t n_vocab;
    int32_t n_ctx_train;
    int32_t n_embd;
    int32_t n_layer;
    int32_t n_head;
    int32_t n_head_kv;
    int32_t head_dim;         /* key_length: n_embd / n_head unless the file says otherwise */
    int32_t n_ff;
    int32_t n_rot;            /* rotated dimensions per head */
    int rope_mode;            /* enum kiri_rope_mode */
    float rope_freq_base;
    float rope_freq_scale;
    float rms_eps;
    int32_t swa_window;       /* keys a sliding-window layer attends (gemma3); 0: no such layers */
    /* The multipliers and options of the families beyond llama (1 or 0 where a family has none).
     * Each layer's RoPE (on or off, base, scale) and window are in struct kiri_layer. */
    float attn_scale;         /* multiplies q.k before the softmax: 1/sqrt(head_dim) unless the file says */
    float embd_scale;         /* multiplies the token embeddings: sqrt(n_embd) on gemma3, granite's
                                 embedding_scale */
    float residual_scale;     /* multiplies each block's output before it joins the residual (granite) */
    float logit_scale;        /* multiplies the logits: 1 / granite's logit_scale */
    float final_softcap;      /* logits = c * tanh(logits / c) when > 0 (gemma3's final_logit_softcapping) */
    float rope_freq_base_swa; /* the RoPE base of sliding-window layers (gemma3) */
    int32_t swa_pattern;      /* gemma3, for descriptions: one layer in every swa_pattern is global; 0:
                                 every layer slides, or the file lists them */
    int ffn_gelu;             /* 1: the feed-forward gate is GELU (GeGLU, gemma3); 0: SiLU (SwiGLU) */
};

struct kiri_layer {
    struct kiri_tensor *attn_norm;   /* (n_embd) F32 */
    struct kiri_tensor *wq;          /* (n_embd, n_head * head_dim) */
    struct kiri_tensor *wk;          /* (n_embd, n_head_kv * head_dim) */
    struct kiri_tensor *wv;          /* (n_embd, n_head_kv * head_dim) */
    struct kiri_tensor *wo;          /* (n_head * head_dim, n_embd) */
    struct kiri_tensor *bq, *bk, *bv;   /* optional biases, F32 */
    struct kiri_tensor *q_norm, *k_norm; /* optional (head_dim) F32: qwen3 */
    struct kiri_tensor *ffn_norm;    /* (n_embd) F32 */
    struct kiri_tensor *w_gate;      /* (n_embd, n_ff) */
    struct kiri_tensor *w_up;        /* (n_embd, n_ff) */
    struct kiri_tensor *w_down;      /* (n_ff, n_embd) */
    struct kiri_tensor *attn_post_norm; /* optional (n_embd) F32: norms the attention block's output
                                           before the residual add (gemma3) */
    struct kiri_tensor *ffn_post_norm;  /* optional (n_embd) F32: the same for the feed-forward block */
    int swa;                         /* 1: attends the last hp.swa_window keys only */
    int rope;                        /* 1: RoPE on q and k; 0 on smollm3's every fourth layer */
    float rope_freq_base;            /* this layer's RoPE base and linear position scale (gemma3's */
    float rope_freq_scale;           /* sliding-window layers have their own) */
};

struct kiri_model {
    struct kiri_gguf *gguf;              /* owned: the mapping every weight points into */
    struct kiri_tokenizer *tokenizer;    /* owned */
    struct kiri_hparams hp;
    const char *arch_name;               /* static */
    int vocab_only;

    struct kiri_tensor *tensors;         /* owned: descriptors of every weight in use */
    int n_tensors;
    struct kiri_tensor *tok_embd;        /* (n_embd, n_vocab) */
    struct kiri_tensor *output_norm;     /* (n_embd) F32 */
    struct kiri_tensor *output;          /* (n_embd, n_vocab); == tok_embd when tied */
    struct kiri_tensor *rope_freqs;      /* optional (n_rot / 2) F32 */
    struct kiri_layer *layers;           /* owned, n_layer */
    size_t weight_bytes;

    /* Execution: one pool per model; steps are serialised by compute_lock. iface/be runs the
     * token embedding, layers [n_offload, n_layer) and the output head: every layer when
     * n_offload is 0. With a partial offload (--gpu-layers N below n_layer) it is the CPU and
     * layers [0, n_offload) run on off_iface/off_be, the GPU backend that was picked. */
    struct kiri_threadpool *pool;        /* owned */
    struct kiri_threads threads;
    const struct kiri_backend_iface *iface;
    struct kiri_backend *be;             /* owned */
    int n_offload;                       /* 0 (no split) .. n_layer - 1 */
    const struct kiri_backend_iface *off_iface;   /* NULL without a split */
    struct kiri_backend *off_be;         /* owned, NULL without a split */
    struct kiri_tensor rope_freqs_off;   /* rope_freqs as off_be prepares it (a tensor holds one
                                            backend's state in extra); unused without both */
    int32_t *layer_t0;                   /* owned (n_layer + 1): index in tensors of each layer's
                                            first weight, and one past the last layer's */
    size_t off_weight_bytes;             /* weights prepared on off_be */
    struct kiri_mutex *compute_lock;     /* owned */
    uint32_t cpu_features;
    char backend_report[512];
    char backend_name[48];               /* kiri_model_backend_name: "cpu", "vulkan+cpu", ... */
};

/* Loads a model from an open GGUF file, taking ownership of g (closed on failure too). */
int kiri_model_load(struct kiri_gguf *g, const struct kiri_model_params *params,
                    struct kiri_model **out, struct kiri_status_info *info);
void kiri_model_free(struct kiri_model *m);

/* A KV cache for this model's contexts: each layer's keys and values on the backend that runs
 * the layer (see kiri_kvcache_init_split). */
int kiri_model_kvcache_init(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                            struct kiri_kvcache **out);

/* The same, with the sliding-window layers (layer.swa, hp.swa_window > 0) keeping only their
 * window in a pool of n_swa_blocks blocks (kiri_kvcache_init_windowed); n_swa_blocks = 0, or a
 * model without such layers, is kiri_model_kvcache_init. */
int kiri_model_kvcache_init_swa(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                                int32_t n_swa_blocks, struct kiri_kvcache **out);
/* Layers that attend only the last hp.swa_window keys (0 when swa_window is 0). */
int kiri_model_n_swa_layers(const struct kiri_model *m);

/* kiri_model_describe_placement (kiri.h): which layers run on which backend. */

/* kiri_model_kv_bytes_per_token, kiri_model_kv_bytes_window (kiri.h): the bytes one token's keys
 * and values take in the global layers, and the sliding-window layers' window. */

#endif
