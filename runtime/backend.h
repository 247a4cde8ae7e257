/* The interface between the engine and its compute backends: tensor element types and their block
 * layouts (as GGUF defines them), tensor descriptors, the operations one forward step is made of,
 * and the table of functions a backend implements.
 *
 * This is the only runtime header a kernel may include. It declares no runtime function.
 *
 * Invariants:
 * - A tensor's ne[0] is its innermost (contiguous) dimension, as in GGUF; for a quantized type
 *   ne[0] is a multiple of the type's block size and nb[0] is the size of one block.
 * - nb[i] is the byte stride of dimension i; rows (dimension 1 and above) may be strided, elements
 *   within a row never are.
 * - A step is a list of nodes executed in order; a node reads only tensors written by earlier
 *   nodes of the same step, by earlier steps, or uploaded weights.
 */
#ifndef KIRI_BACKEND_H
#define KIRI_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../base/cpu_features.h"

/* ---------------------------------------------------------------------------------------------
 * Element types. Values are GGUF's (ggml's) type ids so a file's type field maps directly.
 * ------------------------------------------------------------------------------------------- */

enum kiri_type {
    KIRI_TYPE_F32 = 0,
    KIRI_TYPE_F16 = 1,
    KIRI_TYPE_Q4_0 = 2,
    KIRI_TYPE_Q4_1 = 3,
    KIRI_TYPE_Q5_0 = 6,
    KIRI_TYPE_Q5_1 = 7,
    KIRI_TYPE_Q8_0 = 8,
    KIRI_TYPE_Q8_1 = 9,
    KIRI_TYPE_Q2_K = 10,
    KIRI_TYPE_Q3_K = 11,
    KIRI_TYPE_Q4_K = 12,
    KIRI_TYPE_Q5_K = 13,
    KIRI_TYPE_Q6_K = 14,
    KIRI_TYPE_Q8_K = 15,
    KIRI_TYPE_I8 = 24,
    KIRI_TYPE_I16 = 25,
    KIRI_TYPE_I32 = 26,
    KIRI_TYPE_I64 = 27,
    KIRI_TYPE_F64 = 28,
    KIRI_TYPE_BF16 = 30,
    KIRI_TYPE_COUNT = 40 /* one past the largest id GGUF has defined */
};

#define KIRI_QK4_0 32
#define KIRI_QK4_1 32
#define KIRI_QK5_0 32
#define KIRI_QK5_1 32
#define KIRI_QK8_0 32
#define KIRI_QK8_1 32
#define KIRI_QK_K 256
#define KIRI_K_SCALE_SIZE 12

/* Half-precision values are stored as raw IEEE binary16 / bfloat16 bits. */
typedef uint16_t kiri_f16;
typedef uint16_t kiri_bf16;

/* Block layouts, byte-for-byte those of GGUF files. */
struct kiri_block_q4_0 { kiri_f16 d; uint8_t qs[KIRI_QK4_0 / 2]; };
struct kiri_block_q4_1 { kiri_f16 d; kiri_f16 m; uint8_t qs[KIRI_QK4_1 / 2]; };
struct kiri_block_q5_0 { kiri_f16 d; uint8_t qh[4]; uint8_t qs[KIRI_QK5_0 / 2]; };
struct kiri_block_q5_1 { kiri_f16 d; kiri_f16 m; uint8_t qh[4]; uint8_t qs[KIRI_QK5_1 / 2]; };
struct kiri_block_q8_0 { kiri_f16 d; int8_t qs[KIRI_QK8_0]; };
/* Q8_1 carries s = d * sum(qs) so Q4_1/Q5_1 dot products can apply their offset m cheaply. */
struct kiri_block_q8_1 { kiri_f16 d; kiri_f16 s; int8_t qs[KIRI_QK8_1]; };
struct kiri_block_q4_K {
    kiri_f16 d;                          /* super-block scale for the quantized scales */
    kiri_f16 dmin;                       /* super-block scale for the quantized mins */
    uint8_t scales[KIRI_K_SCALE_SIZE];   /* 8 scales and 8 mins, 6 bits each */
    uint8_t qs[KIRI_QK_K / 2];           /* 4-bit quants */
};
struct kiri_block_q5_K {
    kiri_f16 d;
    kiri_f16 dmin;
    uint8_t scales[KIRI_K_SCALE_SIZE];
    uint8_t qh[KIRI_QK_K / 8];           /* high bit of each quant */
    uint8_t qs[KIRI_QK_K / 2];           /* low 4 bits */
};
struct kiri_block_q6_K {
    uint8_t ql[KIRI_QK_K / 2];           /* low 4 bits */
    uint8_t qh[KIRI_QK_K / 4];           /* high 2 bits */
    int8_t scales[KIRI_QK_K / 16];       /* 8-bit scales, one per 16 values */
    kiri_f16 d;
};
/* Activations for K-quant dot products; bsums[i] is the sum of qs[16*i .. 16*i+15]. */
struct kiri_block_q8_K { float d; int8_t qs[KIRI_QK_K]; int16_t bsums[KIRI_QK_K / 16]; };

/* Elements per block (1 for plain types) and bytes per block; 0 for an unknown or unsupported id.
 * Q2_K and Q3_K are known to the file parser so such files get a precise "unsupported type" error
 * from the model loader rather than a parse error. */
static inline int64_t kiri_type_block_size(int type)
{
    switch (type) {
    case KIRI_TYPE_F32: case KIRI_TYPE_F16: case KIRI_TYPE_BF16: case KIRI_TYPE_I8:
    case KIRI_TYPE_I16: case KIRI_TYPE_I32: case KIRI_TYPE_I64: case KIRI_TYPE_F64:
        return 1;
    case KIRI_TYPE_Q4_0: case KIRI_TYPE_Q4_1: case KIRI_TYPE_Q5_0: case KIRI_TYPE_Q5_1:
    case KIRI_TYPE_Q8_0: case KIRI_TYPE_Q8_1:
        return 32;
    case KIRI_TYPE_Q2_K: case KIRI_TYPE_Q3_K: case KIRI_TYPE_Q4_K: case KIRI_TYPE_Q5_K:
    case KIRI_TYPE_Q6_K: case KIRI_TYPE_Q8_K:
        return KIRI_QK_K;
    default:
        return 0;
    }
}

static inline size_t kiri_type_size(int type)
{
    switch (type) {
    case KIRI_TYPE_F32: return 4;
    case KIRI_TYPE_F16: return 2;
    case KIRI_TYPE_BF16: return 2;
    case KIRI_TYPE_I8: return 1;
    case KIRI_TYPE_I16: return 2;
    case KIRI_TYPE_I32: return 4;
    case KIRI_TYPE_I64: return 8;
    case KIRI_TYPE_F64: return 8;
    case KIRI_TYPE_Q4_0: return sizeof(struct kiri_block_q4_0);
    case KIRI_TYPE_Q4_1: return sizeof(struct kiri_block_q4_1);
    case KIRI_TYPE_Q5_0: return sizeof(struct kiri_block_q5_0);
    case KIRI_TYPE_Q5_1: return sizeof(struct kiri_block_q5_1);
    case KIRI_TYPE_Q8_0: return sizeof(struct kiri_block_q8_0);
    case KIRI_TYPE_Q8_1: return sizeof(struct kiri_block_q8_1);
    case KIRI_TYPE_Q2_K: return 84;
    case KIRI_TYPE_Q3_K: return 110;
    case KIRI_TYPE_Q4_K: return sizeof(struct kiri_block_q4_K);
    case KIRI_TYPE_Q5_K: return sizeof(struct kiri_block_q5_K);
    case KIRI_TYPE_Q6_K: return sizeof(struct kiri_block_q6_K);
    case KIRI_TYPE_Q8_K: return sizeof(struct kiri_block_q8_K);
    default: return 0;
    }
}

static inline const char *kiri_type_name(int type)
{
    switch (type) {
    case KIRI_TYPE_F32: return "F32";
    case KIRI_TYPE_F16: return "F16";
    case KIRI_TYPE_BF16: return "BF16";
    case KIRI_TYPE_I8: return "I8";
    case KIRI_TYPE_I16: return "I16";
    case KIRI_TYPE_I32: return "I32";
    case KIRI_TYPE_I64: return "I64";
    case KIRI_TYPE_F64: return "F64";
    case KIRI_TYPE_Q4_0: return "Q4_0";
    case KIRI_TYPE_Q4_1: return "Q4_1";
    case KIRI_TYPE_Q5_0: return "Q5_0";
    case KIRI_TYPE_Q5_1: return "Q5_1";
    case KIRI_TYPE_Q8_0: return "Q8_0";
    case KIRI_TYPE_Q8_1: return "Q8_1";
    case KIRI_TYPE_Q2_K: return "Q2_K";
    case KIRI_TYPE_Q3_K: return "Q3_K";
    case KIRI_TYPE_Q4_K: return "Q4_K";
    case KIRI_TYPE_Q5_K: return "Q5_K";
    case KIRI_TYPE_Q6_K: return "Q6_K";
    case KIRI_TYPE_Q8_K: return "Q8_K";
    default: return "unknown";
    }
}

/* ---------------------------------------------------------------------------------------------
 * Tensors
 * ------------------------------------------------------------------------------------------- */

#define KIRI_MAX_DIMS 4

struct kiri_buffer; /* backend-defined */

struct kiri_tensor {
    int type;                       /* enum kiri_type */
    int64_t ne[KIRI_MAX_DIMS];      /* elements per dimension, unused dimensions are 1 */
    size_t nb[KIRI_MAX_DIMS];       /* byte strides */
    void *data;                     /* host address of element 0 when host-visible, else NULL:
                                       mapped (weights in the model file) or borrowed (scratch) */
    struct kiri_buffer *buffer;     /* borrowed; the device buffer holding it, NULL on the host */
    size_t offset;                  /* byte offset of element 0 in buffer */
    void *extra;                    /* backend-owned per-tensor state (an uploaded copy), or NULL */
    const char *name;               /* borrowed, for messages */
};

/* ---------------------------------------------------------------------------------------------
 * Operations. Shapes use ne order (innermost first); "n" is the number of tokens in the step.
 * ------------------------------------------------------------------------------------------- */

enum kiri_op {
    KIRI_OP_GET_ROWS,   /* dst (E, n) F32 = dequantized rows src[0] (E, V) any type, ids src[1] (n) I32 */
    KIRI_OP_RMS_NORM,   /* dst (E, R) = src[0] (E, R) / rms * src[1] (E) F32; p.eps; in place allowed */
    KIRI_OP_MATMUL,     /* dst (O, n) F32 = src[1] (I, n) F32 times weight src[0] (I, O) any type */
    KIRI_OP_ADD,        /* dst (E, R) = src[0] (E, R) + src[1] (E, R) or (E, 1) broadcast; in place allowed */
    KIRI_OP_MUL,        /* dst (E, R) = src[0] (E, R) * src[1] (E, R) or (E, 1) broadcast */
    KIRI_OP_SWIGLU,     /* dst (F, n) = silu(src[0] (F, n)) * src[1] (F, n) */
    KIRI_OP_ROPE,       /* src[0] (D, H, n) F32 rotated in place (dst == src[0]) at positions src[1] (n) I32,
                           optional frequency factors src[2] (D/2) F32; p.rope */
    KIRI_OP_STORE_KV,   /* copy src[0] (K, n) F32 into cache dst (K, slots) at rows src[1] (n) I32,
                           converting to dst's type (F32, F16 or Q8_0) */
    KIRI_OP_ATTENTION,  /* dst (D*H, n) F32 = causal attention of queries src[0] (D, H, n) F32 over key
                           cache src[1] (D*Hkv, slots) and value cache src[2] (D*Hkv, slots);
                           src[3] (2, n) I32 gives per token (number of keys to attend, offset of its
                           block table in src[4]); src[4] I32 block tables; key j of a token lives in
                           slot table[j / p.attn.block_size] * block_size + j % block_size; p.attn.
                           With p.attn.window > 0 a token with n keys attends only keys
                           [max(0, n - window), n): table entries of earlier blocks are never read */
    KIRI_OP_GEGLU,      /* dst (F, n) = gelu(src[0] (F, n)) * src[1] (F, n), gelu by its tanh approximation
                           0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))); in place allowed */
    KIRI_OP_SCALE,      /* dst (E, R) = src[0] (E, R) * p.scale; in place allowed */
    KIRI_OP_SOFTCAP,    /* dst (E, R) = p.softcap * tanh(src[0] (E, R) / p.softcap), p.softcap > 0;
                           in place allowed */
    KIRI_OP_SHORT_CONV, /* dst (E, n) F32 = causal depthwise convolution over time of src[0] (E, n) F32
                           with kernel src[1] (K, E) F32, K taps per channel: for token t of a
                           sequence, dst[t][c] = sum_k src[1][c][k] * u[t - K + 1 + k][c], u being
                           the sequence's inputs. The K - 1 inputs before a step's first token of
                           a sequence come from its state: row src[3][t] (I32) of src[2]
                           ((K - 1) * E, slots) F32, the inputs oldest first, E per input; the op
                           updates that row in place to the sequence's last K - 1 inputs. A token
                           at position 0 (src[4] (n) I32) starts its sequence: its state reads as
                           zeros. Tokens of one sequence run in batch order; in place allowed.
                           With p.conv_silu the output is silu of the sum (qwen35). State rows
                           read elsewhere: see KIRI_OP_DELTA_NET */
    KIRI_OP_SIGMOID_MUL, /* dst (E, R) = src[0] (E, R) * sigmoid(src[1] (E, R)); rows may be strided
                           (the attention output times its gate); in place allowed */
    KIRI_OP_DELTA_GATES, /* dst (2H, n) F32, per token: H values sigmoid(src[0] (H, n)), then H
                           values softplus(src[1] (H, n) + src[2] (H)) * src[3] (H): a Gated
                           DeltaNet layer's beta and the logarithm of its decay */
    KIRI_OP_DELTA_NET,  /* dst (Hv*S, n) F32 = the gated delta rule over a step's tokens. src[0] (C, n)
                           F32 holds per token q (Hk heads of S), k (Hk heads of S), then v (Hv heads
                           of S), C = 2*Hk*S + Hv*S (p.delta); src[1] (2*Hv, n) the gates as
                           KIRI_OP_DELTA_GATES writes them (beta, then g). Value head j reads key
                           head j % Hk. Each head keeps a state M (S x S, M[j][i]: value dim j,
                           key dim i) in row src[3][t] (I32) of src[2] (Hv*S*S, slots) F32, head
                           after head; per token M *= exp(g), d = beta * (v - M k), M += d k^T,
                           out = p.delta.scale * M q. A token at position 0 (src[4] (n) I32) starts
                           from a zero state. Tokens of one sequence run in batch order.
                           Both recurrent ops: src[3] may be (n, 2); then token t starts from the
                           state in row src[3][1][t] (the row its sequence's previous token wrote)
                           and leaves the state after it in row src[3][0][t], which takes a copy
                           first when the two differ (and never holds another sequence's state):
                           a speculative step keeps the state after every token, for rollback */
    KIRI_OP_COUNT
};

enum kiri_rope_mode {
    KIRI_ROPE_NORMAL = 0,   /* rotate adjacent pairs (x[2i], x[2i+1]): llama */
    KIRI_ROPE_NEOX = 2      /* rotate halves (x[i], x[i + n_rot/2]): qwen2, qwen3 */
};

struct kiri_rope_params {
    int mode;               /* enum kiri_rope_mode */
    int n_rot;              /* rotated dimensions per head, <= D, even */
    float freq_base;
    float freq_scale;       /* linear position scaling: 1 / scaling factor */
    float attn_factor;      /* multiplies cos and sin (LongRoPE's magnitude correction); 1 for none */
};

struct kiri_delta_params {
    int n_head_k;           /* Hk: query and key heads */
    int n_head_v;           /* Hv: value heads and states, a multiple of Hk */
    int head_dim;           /* S: the size of every head */
    float scale;            /* multiplies the output: 1/sqrt(S) */
};

struct kiri_attn_params {
    int n_head;
    int n_head_kv;          /* divides n_head */
    int head_dim;
    int block_size;         /* KV cache slots per block */
    float scale;            /* usually 1/sqrt(head_dim) */
    int window;             /* sliding window in keys; 0 attends every key */
};

#define KIRI_OP_MAX_SRC 5

struct kiri_node {
    int op;                                 /* enum kiri_op */
    struct kiri_tensor *dst;                /* borrowed */
    struct kiri_tensor *src[KIRI_OP_MAX_SRC]; /* borrowed; unused are NULL */
    union {
        float eps;
        float scale;                        /* KIRI_OP_SCALE */
        float softcap;                      /* KIRI_OP_SOFTCAP */
        struct kiri_rope_params rope;
        struct kiri_attn_params attn;
        struct kiri_delta_params delta;     /* KIRI_OP_DELTA_NET */
        int conv_silu;                      /* KIRI_OP_SHORT_CONV */
    } p;
};

/* ---------------------------------------------------------------------------------------------
 * Threads. The runtime owns the worker threads and lends them to a backend.
 * ------------------------------------------------------------------------------------------- */

struct kiri_threads {
    int n;  /* workers including the caller, >= 1 */
    /* Runs fn(arg, ith, n) once on each of the n workers (ith = 0 is the caller) and returns when
     * all have returned. */
    void (*run)(void *pool, void (*fn)(void *arg, int ith, int nth), void *arg);
    /* Called by all n workers inside fn: returns when every worker has arrived. */
    void (*barrier)(void *pool);
    void *pool;
};

/* Bytes of n elements of a type (whole blocks; 0 for an unknown type). */
static inline size_t kiri_row_bytes(int type, int64_t n)
{
    const int64_t bs = kiri_type_block_size(type);
    return bs ? (size_t)(n / bs) * kiri_type_size(type) : 0;
}

/* Bytes from a tensor's first byte to one past its last. */
static inline size_t kiri_tensor_span_bytes(const struct kiri_tensor *t)
{
    size_t end = kiri_row_bytes(t->type, t->ne[0]);
    for (int d = 1; d < KIRI_MAX_DIMS; d++)
        end += (size_t)(t->ne[d] - 1) * t->nb[d];
    return end;
}

/* The rows of a tensor when dimensions 1..3 can be walked with the single stride nb[1]; -1 when
 * they cannot. */
static inline int kiri_tensor_flat_rows(const struct kiri_tensor *t, int64_t *rows)
{
    if ((t->ne[2] > 1 && t->nb[2] != t->nb[1] * (size_t)t->ne[1]) ||
        (t->ne[3] > 1 && t->nb[3] != t->nb[2] * (size_t)t->ne[2]))
        return -1;
    *rows = t->ne[1] * t->ne[2] * t->ne[3];
    return 0;
}

/* Checks a GPU backend's supports() shares: every tensor of the node F32, and RoPE / attention
 * parameters its kernels can run (the graph never emits others; a hand-made node may). */
static inline int kiri_node_all_f32(const struct kiri_node *nd, int n_src)
{
    if (nd->dst->type != KIRI_TYPE_F32)
        return 0;
    for (int i = 0; i < n_src; i++)
        if (nd->src[i] && nd->src[i]->type != KIRI_TYPE_F32)
            return 0;
    return 1;
}

static inline int kiri_node_rope_ok(const struct kiri_node *nd)
{
    const struct kiri_tensor *s0 = nd->src[0], *s1 = nd->src[1];
    return s1 && s0->type == KIRI_TYPE_F32 && s1->type == KIRI_TYPE_I32 &&
           (!nd->src[2] || nd->src[2]->type == KIRI_TYPE_F32) && nd->p.rope.n_rot > 0 && nd->p.rope.n_rot % 2 == 0 &&
           nd->p.rope.n_rot <= s0->ne[0] && (nd->p.rope.mode == KIRI_ROPE_NORMAL || nd->p.rope.mode == KIRI_ROPE_NEOX);
}

static inline int kiri_node_attention_ok(const struct kiri_node *nd)
{
    const struct kiri_attn_params *p = &nd->p.attn;
    const struct kiri_tensor *s1 = nd->src[1];
    const int t = s1 ? s1->type : -1;
    return s1 && nd->src[2] && nd->src[3] && nd->src[4] && nd->src[2]->type == t &&
           (t == KIRI_TYPE_F32 || t == KIRI_TYPE_F16 || (t == KIRI_TYPE_Q8_0 && p->head_dim % 32 == 0)) &&
           nd->src[0]->type == KIRI_TYPE_F32 && nd->dst->type == KIRI_TYPE_F32 && p->head_dim > 0 &&
           p->head_dim <= 1024 && p->n_head_kv > 0 && p->n_head % p->n_head_kv == 0 && p->block_size > 0 &&
           p->window >= 0;
}

/* The recurrent ops' state rows (src[3]): n I32 rows written, and optionally a second row of
 * those read (backend.h, KIRI_OP_DELTA_NET). */
static inline int kiri_state_rows_ok(const struct kiri_tensor *rows, int64_t n)
{
    return rows->type == KIRI_TYPE_I32 && rows->ne[0] >= n && (rows->ne[1] == 1 || rows->ne[1] == 2) &&
           rows->ne[2] == 1 && rows->ne[3] == 1 && rows->nb[0] == 4 && rows->nb[1] == (size_t)rows->ne[0] * 4;
}

/* Bytes from the rows written to the rows read: 0 when they are the same. */
static inline size_t kiri_state_rows_read_offset(const struct kiri_tensor *rows)
{
    return rows->ne[1] > 1 ? rows->nb[1] : 0;
}

/* The shapes KIRI_OP_SHORT_CONV, KIRI_OP_SIGMOID_MUL (rows walked with one stride each, as a GPU
 * kernel takes them), KIRI_OP_DELTA_GATES and KIRI_OP_DELTA_NET take (every backend
 * that runs them checks these, with the largest kernel / head its kernels hold). */
static inline int kiri_node_short_conv_ok(const struct kiri_node *nd, int64_t max_taps)
{
    const struct kiri_tensor *u = nd->src[0], *w = nd->src[1], *st = nd->src[2];
    return w && st && kiri_node_all_f32(nd, 3) && nd->src[3] && nd->src[4] && nd->src[3]->type == KIRI_TYPE_I32 &&
           nd->src[4]->type == KIRI_TYPE_I32 && w->ne[0] >= 2 && w->ne[0] <= max_taps && w->ne[1] == u->ne[0] &&
           nd->dst->ne[0] == u->ne[0] && nd->dst->ne[1] == u->ne[1] && st->ne[0] == (w->ne[0] - 1) * u->ne[0] &&
           u->ne[2] == 1 && u->ne[3] == 1 && kiri_state_rows_ok(nd->src[3], u->ne[1]) && nd->src[4]->ne[0] >= u->ne[1];
}

static inline int kiri_node_sigmoid_mul_ok(const struct kiri_node *nd)
{
    const struct kiri_tensor *x = nd->src[0], *g = nd->src[1];
    int64_t rows, rows_g, rows_d;
    return g && kiri_node_all_f32(nd, 2) && g->ne[0] == x->ne[0] && nd->dst->ne[0] == x->ne[0] &&
           kiri_tensor_flat_rows(x, &rows) == 0 && kiri_tensor_flat_rows(g, &rows_g) == 0 &&
           kiri_tensor_flat_rows(nd->dst, &rows_d) == 0 && rows_g == rows && rows_d == rows;
}

static inline int kiri_node_delta_gates_ok(const struct kiri_node *nd)
{
    const int64_t H = nd->src[0]->ne[0];
    return nd->src[1] && nd->src[2] && nd->src[3] && kiri_node_all_f32(nd, 4) && nd->src[1]->ne[0] == H &&
           nd->src[1]->ne[1] == nd->src[0]->ne[1] && nd->src[2]->ne[0] == H && nd->src[3]->ne[0] == H &&
           nd->dst->ne[0] == 2 * H && nd->dst->ne[1] == nd->src[0]->ne[1];
}

static inline int kiri_node_delta_net_ok(const struct kiri_node *nd, int64_t max_head)
{
    const struct kiri_delta_params *p = &nd->p.delta;
    const struct kiri_tensor *x = nd->src[0];
    if (!nd->src[1] || !nd->src[2] || !kiri_node_all_f32(nd, 3) || !nd->src[3] || !nd->src[4] ||
        nd->src[3]->type != KIRI_TYPE_I32 || nd->src[4]->type != KIRI_TYPE_I32 || p->n_head_k < 1 ||
        p->n_head_v < 1 || p->n_head_v % p->n_head_k != 0 || p->head_dim < 1 || p->head_dim > max_head)
        return 0;
    const int64_t S = p->head_dim, Hk = p->n_head_k, Hv = p->n_head_v, n = x->ne[1];
    return x->ne[0] == (2 * Hk + Hv) * S && nd->src[1]->ne[0] == 2 * Hv && nd->src[1]->ne[1] == n &&
           nd->src[2]->ne[0] == Hv * S * S && nd->dst->ne[0] == Hv * S && nd->dst->ne[1] == n &&
           kiri_state_rows_ok(nd->src[3], n) && nd->src[4]->ne[0] >= n;
}

/* ---------------------------------------------------------------------------------------------
 * The backend interface
 * ------------------------------------------------------------------------------------------- */

#define KIRI_BACKEND_VERSION 1

/* enum kiri_cpu_feature (base/cpu_features.h): the CPU features the runtime detected. */

struct kiri_backend_config {
    struct kiri_threads threads;   /* borrowed, valid while the backend lives */
    uint32_t cpu_features;         /* enum kiri_cpu_feature bits */
    int device;                    /* GPU ordinal for GPU backends */
    /* Loads a shared library / symbol for backends that find their driver at run time; NULL where
     * the platform has none. */
    void *(*dl_open)(const char *name);
    void *(*dl_sym)(void *lib, const char *sym);
    /* Set while probing for the automatic choice: a probe may then skip work that could not lead
     * to its backend being picked (loading a GPU driver on a machine without a GPU). */
    int automatic;
};

struct kiri_backend;

/* One backend. Entries marked optional may be NULL; the default used then is stated. All entries
 * returning int return 0 on success and a negative value on failure, writing a message of at most
 * `cap` bytes into `msg` where they take one. */
struct kiri_backend_iface {
    int version;            /* KIRI_BACKEND_VERSION */
    const char *name;       /* "cpu", "vulkan", "cuda" */

    /* Is the backend usable here? Returns a score (higher is better, 0 unusable) and a reason. */
    int (*probe)(const struct kiri_backend_config *cfg, char *msg, size_t cap);
    int (*init)(const struct kiri_backend_config *cfg, struct kiri_backend **out, char *msg, size_t cap);
    void (*free)(struct kiri_backend *be);

    /* Describes the kernel paths in use ("avx2", "neon+dotprod", device name) into buf. Optional. */
    void (*describe)(struct kiri_backend *be, char *buf, size_t cap);

    /* Scratch and cache buffers. alloc sets *host to a host pointer when the memory is
     * host-visible (always on the CPU), else NULL. */
    int (*buffer_alloc)(struct kiri_backend *be, size_t size, struct kiri_buffer **out, void **host);
    void (*buffer_free)(struct kiri_backend *be, struct kiri_buffer *buf);
    /* Copies between host memory and a tensor's storage. Optional on host-visible backends. */
    int (*tensor_set)(struct kiri_backend *be, struct kiri_tensor *t, const void *src, size_t off, size_t size);
    int (*tensor_get)(struct kiri_backend *be, const struct kiri_tensor *t, void *dst, size_t off, size_t size);

    /* Makes a weight usable by the backend (t->data points into the mapped file). The CPU uses it
     * in place; a GPU backend uploads it or registers the mapping, storing its state in t->extra.
     * Optional: NULL means used in place. */
    int (*weight_prepare)(struct kiri_backend *be, struct kiri_tensor *t, char *msg, size_t cap);
    void (*weight_release)(struct kiri_backend *be, struct kiri_tensor *t);

    /* Can this backend run this node (op and types)? Optional: NULL means every node. */
    int (*supports)(struct kiri_backend *be, const struct kiri_node *node);

    /* Runs the nodes in order. May return before they finish; synchronize waits. */
    int (*compute)(struct kiri_backend *be, const struct kiri_node *nodes, int n_nodes);
    /* Optional: NULL means compute is synchronous. */
    int (*synchronize)(struct kiri_backend *be);
};

#endif
