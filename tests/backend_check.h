/* backend_check: the checks every GPU backend must pass against the CPU reference, shared by
 * tests/test_vulkan.c and tests/cuda_check.c, which add what is particular to their backend.
 * - op by op (backend_check_ops): every op of runtime/backend.h on random inputs against the CPU
 *   backend with the portable C kernels (kiri_cpu_backend_iface), tolerances stated with each;
 * - whole models (backend_check_model and the helpers around it): greedy tokens and logits
 *   through kiri_model_open on the backend against --backend cpu, on models/stories260K.gguf and
 *   on tiny random models written with the GGUF writer; the batching loop against solo runs.
 * State: struct backend_check holds the backend under test (borrowed), the random sequence, the
 * table of largest errors per op and the counters the checks go to. Checks count in the caller's
 * test.h counters (checks, failures point at them), so one verdict covers both files. */
#ifndef KIRI_TESTS_BACKEND_CHECK_H
#define KIRI_TESTS_BACKEND_CHECK_H

#include <stdint.h>
#include <stdio.h>

struct kiri_backend;
struct kiri_backend_config;
struct kiri_backend_iface;
struct kiri_model;
struct kiri_context;

/* One row of the error table: "op|type|shape" and the largest error relative to its tolerance's
 * scale. */
struct backend_check_stat {
    char name[64];
    double max_abs, max_scaled, tol;
    int failed;
};

#define BACKEND_CHECK_MAX_STATS 320

struct backend_check {
    const struct kiri_backend_iface *dev; /* borrowed: the backend under test */
    struct kiri_backend *be;              /* borrowed: its instance, for the op checks */
    struct kiri_backend *ref;             /* owned during backend_check_ops: the CPU reference */
    const char *backend;                  /* its name for kiri_model_params.backend: "vulkan" */
    const char *prog;                     /* the program, first word of each message */
    const char *mode;                     /* the memory mode the messages name */
    const char *stories;                  /* path of models/stories260K.gguf */
    int *checks, *failures;               /* borrowed: the caller's test.h counters */
    uint64_t rng;                         /* xorshift state, never 0 */
    struct backend_check_stat stats[BACKEND_CHECK_MAX_STATS];
    int n_stats;
};

/* Fills b for checks of dev, named backend (for kiri_model_params.backend), in the program prog;
 * checks and failures are the caller's test.h counters. The random sequence is a fixed one, or
 * the one KIRI_TEST_SEED names (to look at the spread of differences). The caller sets be and
 * mode as it goes. */
void backend_check_init(struct backend_check *b, const struct kiri_backend_iface *dev, const char *backend,
                        const char *prog, const char *stories, int *checks, int *failures);

/* A backend configuration with one thread, the portable C kernels (no CPU features) and the
 * platform's library loader: what the checks start backends with. */
void backend_check_config(struct kiri_backend_config *c);

/* Starts an instance of b->dev with backend_check_config and prints its description to out;
 * NULL (the reason on stderr) when it cannot start. The caller frees it. */
struct kiri_backend *backend_check_start(struct backend_check *b, FILE *out);

/* Every op against the CPU reference on b->be (which must be started); the largest errors go to
 * the table. */
void backend_check_ops(struct backend_check *b);

/* The hybrid models' ops (SIGMOID_MUL, SHORT_CONV, DELTA_GATES, DELTA_NET, and SCALE over
 * qwen35's strided head views) against the CPU reference on b->be: two interleaved sequences, a sequence starting at position 0 and the state
 * carried across two steps; into the table. */
void backend_check_recurrent_ops(struct backend_check *b);

/* Prints the table (op, type, shape, largest error, tolerance, ok) to f, empties it and returns
 * how many rows failed. */
int backend_check_print_table(struct backend_check *b, FILE *f);

/* A tiny random model: shapes and per-layer weight types (even layers take types[0], odd ones
 * types[1]); embd_type and out_type -1: none (tied). */
struct backend_check_tiny {
    const char *name, *arch;
    int64_t e, f, h, hkv, d, layers;
    int bias, qk_norm, rope_freqs, tied;
    float freq_base;
    int types[2][7]; /* q, k, v, o, gate, up, down */
    int embd_type, out_type;
};

/* llama with float weights, llama with every quantized type (GQA, rope_freqs), qwen2 (biases,
 * neox RoPE, tied embeddings), qwen3 (per-head norms, head size 128). */
#define BACKEND_CHECK_N_TINY 4
extern const struct backend_check_tiny backend_check_tinies[BACKEND_CHECK_N_TINY];

/* Writes m to path (tokenizer from stories260K); 0 on success. */
int backend_check_write_tiny(struct backend_check *b, const struct backend_check_tiny *m, const char *path);

/* Bytes of all weights of m (what one decoded token reads, less the KV cache). */
double backend_check_tiny_bytes(const struct backend_check_tiny *m);

#define BACKEND_CHECK_N_GEN 64

/* One model on one backend, with a context. */
struct backend_check_side {
    struct kiri_model *m;
    struct kiri_context *c;
    int32_t tokens[BACKEND_CHECK_N_GEN];
    int n;
    double tok_s;
};

/* gpu_layers -1: the default placement. 0 on success; s is closable either way. */
int backend_check_side_open(struct backend_check_side *s, const char *path, const char *backend, int gpu_layers,
                            int kv_type);
/* BACKEND_CHECK_N_GEN greedy tokens after ids, free-running. */
int backend_check_side_generate(struct backend_check_side *s, const int32_t *ids, int n);
void backend_check_side_close(struct backend_check_side *s);

/* The backend against the CPU on the model at path: strict > 0 requires equal free-running
 * greedy tokens and teacher-forced logits within 1%; 0 logits within 5%; < 0 only reports
 * (see backend_check.c). */
void backend_check_model(struct backend_check *b, const char *path, const char *label, int gpu_layers, int kv_type,
                         const char *prompt, int strict);

/* backend_check_model on backend_check_tinies[i], written to a file and removed after. */
void backend_check_tiny_model(struct backend_check *b, int i, int kv_type, const char *prompt, int strict);

/* The model set both backends run: stories260K (F16 and F32 caches) and every tiny model. */
void backend_check_models(struct backend_check *b);

/* Concurrent greedy requests through the batching loop on the backend (stories260K, gpu_layers
 * as in side_open) equal the CPU's solo runs. */
void backend_check_batcher(struct backend_check *b, int gpu_layers);

#endif
