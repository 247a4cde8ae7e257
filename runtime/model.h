/* A loaded model: its hyperparameters (all from GGUF metadata), its weights as tensor views into
 * the file mapping, its tokenizer, and the backend (with its worker threads) that runs it.
 *
 * Invariants: every weight the architecture needs is present with exactly the expected shape and a
 * type the backend can multiply; optional weights (biases, per-head norms, output, rope factors)
 * are NULL when absent; output points at tok_embd for tied embeddings. Every tensor of the file is
 * used by the architecture's graph, or the file was refused at load. A descriptor may be a view of
 * some rows of a fused tensor of the file (attn_qkv, phi3's gate-up ffn_up): it points into the
 * fused tensor's rows, nothing is copied. Weight data is mapped and lives exactly as long as the
 * model.
 *
 * A projection is y = scale * (W x) + b, with the per-tensor scale of a "<weight>.scale" tensor (1
 * when the file has none) and the optional bias; the feed-forward's projections add the bias
 * first, y = scale * (W x + b), as llama.cpp's feed-forward does.
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
    KIRI_ARCH_GRANITE,
    KIRI_ARCH_PHI3,
    KIRI_ARCH_GEMMA4,
    KIRI_ARCH_LFM2,
    KIRI_ARCH_QWEN35
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
    /* These four are the file's scalars, or the largest of its per-layer arrays (gemma4); each
     * layer's own are in struct kiri_layer. */
    int rope_mode;            /* enum kiri_rope_mode */
    float rope_freq_base;
    float rope_freq_scale;
    float rope_attn_factor;   /* rope.scaling.attn_factor: multiplies RoPE's cos and sin; 1 for none */
    int32_t n_ctx_orig;       /* rope.scaling.original_context_length, else n_ctx_train: LongRoPE
                                 takes its long factors for contexts beyond it */
    int rope_longrope;        /* 1: LongRoPE's factor sets (phi3, or rope.scaling.type longrope) */
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
    int32_t n_embd_per_layer; /* gemma4's per-layer embedding width; 0: none */
    int32_t n_layer_kv;       /* layers [0, n_layer_kv) keep keys and values; the others attend an
                                 earlier layer's (gemma4's shared_kv_layers); n_layer otherwise */
    int32_t head_dim_swa;     /* gemma4's key_length_swa and rope.dimension_count_swa (else */
    int32_t n_rot_swa;        /* head_dim and n_rot) */
    int32_t n_conv_taps;      /* lfm2's shortconv.l_cache, qwen35's ssm.conv_kernel: the taps of
                                 the recurrent layers' convolutions, whose state keeps the last
                                 n_conv_taps - 1 inputs; 0: none */
    /* qwen35's Gated DeltaNet layers (0 without): heads of ssm_head_dim (ssm.state_size), ssm_k_heads
     * query/key heads (ssm.group_count) and ssm_v_heads value heads (ssm.time_step_rank). */
    int32_t ssm_head_dim, ssm_k_heads, ssm_v_heads;
    int32_t n_layer_nextn;    /* qwen35's nextn_predict_layers: multi-token-prediction blocks after
                                 the n_layer layers of the trunk (one is run as a drafter:
                                 struct kiri_mtp_head; more are loaded, not run) */
};

struct kiri_layer {
    struct kiri_tensor *attn_norm;   /* (n_embd) F32 */
    struct kiri_tensor *wq;          /* (n_embd, n_head * head_dim); wq, wk, wv may be views of a */
    struct kiri_tensor *wk;          /* (n_embd, n_head_kv * head_dim)  fused attn_qkv.weight  */
    struct kiri_tensor *wv;          /* (n_embd, n_head_kv * head_dim)  (rows q, then k, then v) */
    struct kiri_tensor *wo;          /* (n_head * head_dim, n_embd) */
    struct kiri_tensor *bq, *bk, *bv;   /* optional biases, F32 (views of a fused attn_qkv.bias) */
    struct kiri_tensor *bo;          /* optional (n_embd) F32 */
    float wq_scale, wk_scale, wv_scale, wo_scale;   /* per-tensor scales, 1 when absent */
    struct kiri_tensor *q_norm, *k_norm; /* optional (head_dim) F32: qwen3 */
    struct kiri_tensor *ffn_norm;    /* (n_embd) F32 */
    struct kiri_tensor *w_gate;      /* (n_embd, n_ff); with w_up a view of phi3's fused ffn_up */
    struct kiri_tensor *w_up;        /* (n_embd, n_ff)  (rows: the gate, then the up projection) */
    struct kiri_tensor *w_down;      /* (n_ff, n_embd) */
    struct kiri_tensor *attn_post_norm; /* optional (n_embd) F32: norms the attention block's output
                                           before the residual add (gemma3) */
    struct kiri_tensor *ffn_post_norm;  /* optional (n_embd) F32: the same for the feed-forward block */
    struct kiri_tensor *b_gate, *b_up, *b_down;   /* optional biases, F32 */
    float w_gate_scale, w_up_scale, w_down_scale; /* per-tensor scales, 1 when absent */
    int swa;                         /* 1: attends the last hp.swa_window keys only */
    int rope;                        /* 1: RoPE on q and k; 0 on smollm3's every fourth layer */
    float rope_freq_base;            /* this layer's RoPE base and linear position scale (gemma3's */
    float rope_freq_scale;           /* sliding-window layers have their own) */
    int32_t n_head, n_head_kv;       /* this layer's shapes: the hyperparameters', or gemma4's */
    int32_t head_dim, n_ff, n_rot;   /* per-layer arrays and sliding-window head size */
    int32_t kv_source;               /* the layer whose keys and values this one attends: itself,
                                        or (gemma4's shared layers) an earlier one; such a layer
                                        has no wk, wv, k_norm and stores nothing */
    int rope_factors;                /* 1: RoPE takes the model's frequency factors (every layer,
                                        but only gemma4's global ones) */
    struct kiri_tensor *v_norm;      /* optional (head_dim) F32: gemma4 RMS-norms the values
                                        without a weight; this is a vector of ones */
    /* gemma4's per-layer embedding block after the feed-forward: x += post_norm(proj(
     * gelu(inp_gate x) * this layer's per-layer input)); then x *= out_scale. */
    struct kiri_tensor *pl_gate;     /* (n_embd, n_embd_per_layer) */
    struct kiri_tensor *pl_proj;     /* (n_embd_per_layer, n_embd) */
    struct kiri_tensor *pl_post_norm;/* (n_embd) F32 */
    float out_scale;                 /* layer_output_scale, 1 when absent */
    /* lfm2's gated short-convolution block, in place of attention on a recurrent layer (which
     * has no attention weights and keeps no keys): B, C, x = in_proj h; y = C * conv(B * x);
     * the block's output is out_proj y. The convolution's state is per sequence (kvcache.h). */
    int recurrent;                   /* 1: this layer is a short-convolution block */
    struct kiri_tensor *sc_in;       /* (n_embd, 3 n_embd): rows B, then C, then x */
    struct kiri_tensor *sc_conv;     /* (n_conv_taps, n_embd) F32: each channel's taps, oldest
                                        input first */
    struct kiri_tensor *sc_out;      /* (n_embd, n_embd) */
    /* qwen35's Gated DeltaNet block, in place of attention on its recurrent layers (S the head
     * size, Hk/Hv the key/value heads, C = 2 Hk S + Hv S the convolution's channels): */
    struct kiri_tensor *dn_qkv;      /* (n_embd, C): rows q, k, then v */
    struct kiri_tensor *dn_z;        /* (n_embd, Hv S): the output gate (attn_gate) */
    struct kiri_tensor *dn_conv;     /* (n_conv_taps, C) F32 */
    struct kiri_tensor *dn_dt, *dn_a;/* (Hv) F32: the decay's bias and ssm_a (-exp(A_log)) */
    struct kiri_tensor *dn_beta, *dn_alpha; /* (n_embd, Hv) */
    struct kiri_tensor *dn_norm;     /* (S) F32: the gated norm's weight */
    struct kiri_tensor *dn_out;      /* (Hv S, n_embd) */
    int attn_gated;                  /* qwen35 attention: wq gives each head's query, then its output
                                        gate (2 head_dim rows per head); out *= sigmoid(gate) */
};

/* qwen35's multi-token-prediction head (llama.cpp's graph_mtp): for position q, from the
 * embedding e of token q and the trunk's output-normed hidden state h of position q - 1,
 * x = eh_proj [enorm(e); hnorm(h)], then one gated full-attention block (layers[n_layer], with
 * keys and values of its own in the KV cache's layer n_layer), then head_norm: the head's hidden
 * state, which a chained draft feeds back as h, and through head the logits of token q + 2's
 * guess (the token after q + 1). */
struct kiri_mtp_head {
    struct kiri_tensor *eh_proj;     /* (2 n_embd, n_embd) */
    struct kiri_tensor *enorm, *hnorm; /* (n_embd) F32 */
    struct kiri_tensor *embed;       /* nextn.embed_tokens, else tok_embd */
    struct kiri_tensor *head_norm;   /* nextn.shared_head_norm, else output_norm */
    struct kiri_tensor *head;        /* nextn.shared_head_head, else output */
    float head_scale;                /* output_scale when head is output, else 1 */
};

struct kiri_model {
    struct kiri_gguf *gguf;              /* owned: the mapping every weight points into */
    struct kiri_tokenizer *tokenizer;    /* owned */
    struct kiri_hparams hp;
    const char *arch_name;               /* static */
    int vocab_only;

    struct kiri_tensor *tensors;         /* owned: descriptors of every weight in use */
    int n_tensors;
    uint8_t *tensor_used;                /* owned, only while loading: 1 for each tensor of the file
                                            (by index) that a weight or scale was taken from */
    struct kiri_tensor *tok_embd;        /* (n_embd, n_vocab) */
    struct kiri_tensor *output_norm;     /* (n_embd) F32 */
    struct kiri_tensor *output;          /* (n_embd, n_vocab); == tok_embd when tied */
    struct kiri_tensor *output_b;        /* optional (n_vocab) F32 */
    float output_scale;                  /* per-tensor scale of output, 1 when absent */
    /* RoPE frequency factors (n_rot / 2) F32, each optional: rope_freqs (Llama 3), or LongRoPE's
     * two sets (phi3, or a file whose rope scaling type is longrope), never both kinds. */
    struct kiri_tensor *rope_freqs;
    struct kiri_tensor *rope_long, *rope_short;
    /* gemma4's per-layer embeddings (all NULL without): token rows (n_embd_per_layer * n_layer,
     * n_vocab) gathered per token from the mapping, the projection of the token embedding
     * (n_embd, n_embd_per_layer * n_layer) and its norm (n_embd_per_layer) F32. */
    struct kiri_tensor *pl_tok_embd, *pl_model_proj, *pl_proj_norm;
    float *ones;                         /* owned: the data of the layers' v_norm, or NULL */
    int n_mtp_tensors;                   /* qwen35: tensors of the multi-token-prediction blocks
                                            (blk.N past the trunk) left unused (all but one) */
    struct kiri_mtp_head mtp;            /* qwen35: its one multi-token-prediction block, all
                                            NULL without (kiri_model_has_mtp) */
    int n_tower_tensors;                 /* gemma4: vision/audio tensors (v.*, a.*, mm.*) of the
                                            file, left unused: kiri runs the text model */
    struct kiri_layer *layers;           /* owned, n_layer, and the MTP block's after them */
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
    struct kiri_tensor rope_off[3];      /* rope_freqs, rope_long, rope_short as off_be prepares
                                            them (a tensor holds one backend's state in extra);
                                            unused without a split or without the tensor */
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

/* The RoPE frequency factors a graph built for contexts of n_ctx tokens uses, as the backend
 * that runs the layer prepared them (offload: the split's GPU backend); NULL for none. LongRoPE
 * takes its long factors when n_ctx passes the original context (hp.n_ctx_orig), as llama.cpp
 * decides by its per-sequence context size. */
struct kiri_tensor *kiri_model_rope_factors(struct kiri_model *m, int32_t n_ctx, int offload);

/* A KV cache for this model's contexts: each layer's keys and values on the backend that runs
 * the layer (see kiri_kvcache_init_split). */
int kiri_model_kvcache_init(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                            struct kiri_kvcache **out);

/* The same, with the sliding-window layers (layer.swa, hp.swa_window > 0) keeping only their
 * window in a pool of n_swa_blocks blocks (kiri_kvcache_init_windowed); n_swa_blocks = 0, or a
 * model without such layers, is kiri_model_kvcache_init. The recurrent layers (layer.recurrent)
 * keep no keys but n_state_slots sequences' state and n_snapshots snapshots of it for prefix
 * reuse (kiri_kvcache_state; kiri_model_kvcache_init makes one slot and no snapshot). */
int kiri_model_kvcache_init_swa(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                                int32_t n_swa_blocks, int32_t n_state_slots, int32_t n_snapshots,
                                struct kiri_kvcache **out);
/* kiri_model_kvcache_init_swa with one more attention layer, n_layer, for the MTP block (a
 * model with kiri_model_has_mtp; otherwise the same). */
int kiri_model_kvcache_init_mtp(const struct kiri_model *m, int kv_type, int block_size, int32_t n_blocks,
                                int32_t n_swa_blocks, int32_t n_state_slots, int32_t n_snapshots,
                                struct kiri_kvcache **out);
/* Layers that attend only the last hp.swa_window keys (0 when swa_window is 0). */
int kiri_model_n_swa_layers(const struct kiri_model *m);
/* Recurrent layers (lfm2's short-convolution blocks), and the bytes of one sequence's state in
 * all of them: the last n_conv_taps - 1 inputs of each, F32 (0 without such layers). */
int kiri_model_n_recurrent_layers(const struct kiri_model *m);
size_t kiri_model_state_bytes(const struct kiri_model *m);
/* F32 values of one sequence's state in layer l: lfm2's window of n_conv_taps - 1 inputs of
 * n_embd; qwen35's window of n_conv_taps - 1 inputs of its C channels, then Hv S x S delta-rule
 * states (kiri_model_delta_state_offset floats in); 0 for a layer without state. */
int64_t kiri_model_state_dim(const struct kiri_model *m, int l);
int64_t kiri_model_delta_state_offset(const struct kiri_model *m);

/* kiri_model_describe_placement (kiri.h): which layers run on which backend. */

/* kiri_model_kv_bytes_per_token, kiri_model_kv_bytes_window (kiri.h): the bytes one token's keys
 * and values take in the global layers, and the sliding-window layers' window. */

#endif
