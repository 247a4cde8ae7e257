/* kiri: an edge LLM inference runtime. This is its public C API: open a GGUF model, create a
 * context, tokenize, generate with a per-token callback, cancel, free.
 *
 * Conventions: every function that can fail returns a status (KIRI_OK = 0, negative on error) and,
 * where it takes a `struct kiri_status_info *`, fills it with a one-sentence message (and for model
 * files, the field and byte offset at fault). Out-parameters are written only on success.
 * Objects are opaque and freed by their paired close/free function. A model may be shared by
 * several contexts; a context is used by one thread at a time, except kiri_context_cancel, which
 * any thread may call.
 */
#ifndef KIRI_H
#define KIRI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KIRI_VERSION_STRING "0.1.0"

enum kiri_status {
    KIRI_OK = 0,
    KIRI_E_INVALID_ARG = -1,     /* a caller-supplied value is out of range */
    KIRI_E_NOMEM = -2,           /* an allocation failed */
    KIRI_E_IO = -3,              /* a file could not be opened, read, written or mapped */
    KIRI_E_MODEL_INVALID = -4,   /* the model file is malformed (field and offset in the info) */
    KIRI_E_UNSUPPORTED = -5,     /* well formed, but an architecture/type/feature kiri lacks */
    KIRI_E_CANCELLED = -6,       /* kiri_context_cancel was called */
    KIRI_E_CONTEXT_FULL = -7,    /* the sequence reached the context length */
    KIRI_E_BACKEND = -8,         /* no backend could run the model, or a device call failed */
    KIRI_E_BUSY = -9             /* the request queue is full: try again later */
};

/* Details of a failure. `field` is empty and `offset` is -1 where they do not apply. */
struct kiri_status_info {
    int code;
    char field[64];
    int64_t offset;
    char message[256];
};

/* A short name for a status code, e.g. "E_MODEL_INVALID". */
const char *kiri_status_name(int code);

struct kiri_model;
struct kiri_context;

struct kiri_model_params {
    const char *backend;   /* "auto" (NULL), "cpu", "vulkan" or "cuda" */
    int n_threads;         /* <= 0: one per core */
    int gpu_layers;        /* with a GPU backend picked: the first gpu_layers layers (and their KV
                              cache) run there, the others, the token embedding and the output
                              head on the CPU, their weights used in place from the mapping;
                              0: the CPU runs everything; < 0 or >= the layer count: all on the
                              GPU, head included. Ignored when the CPU backend is picked. */
    int vocab_only;        /* load only the tokenizer (a GGUF without tensors is fine) */
    const char *cpu_kernels; /* the best CPU kernels to use: "auto" (NULL: the best this CPU
                                runs), "c" (portable), "avx2", "avx512" (x86), "neon",
                                "dotprod", "i8mm" (ARM); a tier this CPU lacks is an error */
};

void kiri_model_params_default(struct kiri_model_params *p);

/* Opens a GGUF model by mapping it (weights are used in place, never copied). */
int kiri_model_open(const char *path, const struct kiri_model_params *params,
                    struct kiri_model **out, struct kiri_status_info *info);
void kiri_model_close(struct kiri_model *model);

int32_t kiri_model_n_vocab(const struct kiri_model *model);
int32_t kiri_model_n_ctx_train(const struct kiri_model *model);
int32_t kiri_model_bos(const struct kiri_model *model);   /* -1 if none */
int32_t kiri_model_eos(const struct kiri_model *model);   /* -1 if none */
/* Is the token an end-of-generation token (EOS, EOT, ...)? */
int kiri_model_is_eog(const struct kiri_model *model, int32_t token);
/* Writes a multi-line human-readable description (architecture, sizes, types, memory, backend). */
void kiri_model_describe(const struct kiri_model *model, char *buf, size_t cap);

/* Tokenizes UTF-8 text. add_bos: -1 follows the model's metadata, 0 never, 1 always. Special-token
 * text is matched only when parse_special is set. Writes at most cap ids and returns the number
 * the text needs (which may exceed cap), or a negative status. */
int kiri_tokenize(const struct kiri_model *model, const char *text, size_t len, int add_bos,
                  int parse_special, int32_t *ids, int cap);

/* Writes the UTF-8 bytes of one token (no terminator) and returns their number, or a negative
 * status. Control tokens render as nothing unless render_special is set. */
int kiri_token_to_piece(const struct kiri_model *model, int32_t token, int render_special,
                        char *buf, size_t cap);

struct kiri_sampling {
    float temperature;      /* 0: greedy */
    int32_t top_k;          /* <= 0: off */
    float top_p;            /* 1: off */
    float min_p;            /* 0: off */
    float repeat_penalty;   /* 1: off */
    int32_t repeat_last_n;  /* tokens the penalties look back over */
    float frequency_penalty;
    float presence_penalty;
    uint64_t seed;
};

void kiri_sampling_default(struct kiri_sampling *s);

struct kiri_context_params {
    int32_t n_ctx;          /* <= 0: the model's training context */
    int32_t n_batch;        /* prompt tokens per forward step; <= 0: 512 */
    int kv_type;            /* KV cache element type: 1 (F16, default), 0 (F32) or 8 (Q8_0) */
};

void kiri_context_params_default(struct kiri_context_params *p);

int kiri_context_init(struct kiri_model *model, const struct kiri_context_params *params,
                      struct kiri_context **out, struct kiri_status_info *info);
void kiri_context_free(struct kiri_context *ctx);

/* Called for each generated token with the text it completes (whole UTF-8 characters only; may be
 * empty while a character is incomplete or while the text could be the start of a stop string).
 * Text held back that no stop string claimed comes last, with token -1. Return non-zero to stop. */
typedef int (*kiri_token_fn)(void *user, int32_t token, const char *text, size_t len);

struct kiri_generate_params {
    int32_t max_tokens;         /* < 0: until EOS or the context is full */
    struct kiri_sampling sampling;
    const char *const *stop;    /* stop strings (not emitted), or NULL */
    int n_stop;
};

/* Why generation ended, written by kiri_generate. */
enum kiri_finish {
    KIRI_FINISH_LENGTH = 0,     /* max_tokens reached */
    KIRI_FINISH_EOS = 1,
    KIRI_FINISH_STOP = 2,       /* stop string or callback */
    KIRI_FINISH_CONTEXT = 3     /* context full */
};

struct kiri_generate_result {
    int finish;                 /* enum kiri_finish */
    int32_t n_prompt;
    int32_t n_generated;
    double prefill_seconds;
    double decode_seconds;
};

/* Clears the context and generates a continuation of the prompt tokens. Returns KIRI_OK, or
 * KIRI_E_CANCELLED (after the tokens already delivered), or an error before any callback. */
int kiri_generate(struct kiri_context *ctx, const int32_t *prompt, int32_t n_prompt,
                  const struct kiri_generate_params *params, kiri_token_fn on_token, void *user,
                  struct kiri_generate_result *result, struct kiri_status_info *info);

/* Runs the model over tokens appended to the context's sequence and returns the logits of the
 * last one (n_vocab floats, valid until the next call), for tools and tests. */
int kiri_context_eval(struct kiri_context *ctx, const int32_t *tokens, int32_t n,
                      const float **logits, struct kiri_status_info *info);
/* Forgets the sequence. */
void kiri_context_reset(struct kiri_context *ctx);

/* Asks a running kiri_generate / kiri_context_eval to stop at the next step. Thread-safe. */
void kiri_context_cancel(struct kiri_context *ctx);

/* ---- tools ---- */

/* Converts a GGUF model's weight matrices to another type: "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
 * "Q4_K", "Q5_K", "Q6_K", "Q4_K_M" (Q4_K with Q6_K for the output and half the value and
 * down-projection layers), "F16", "BF16" or "F32". Norms and other vectors stay F32. The result is
 * written to out_path + ".partial" and renamed when complete. progress (may be NULL) is called after
 * each tensor with the tensors done and the total. */
int kiri_quantize(const char *in_path, const char *out_path, const char *type,
                  void (*progress)(void *user, int64_t done, int64_t total), void *user,
                  struct kiri_status_info *info);

/* Describes the machine: CPU features, compiled-in backends and their probe results, and which
 * one `backend` ("auto" or NULL, or a name) would pick. */
void kiri_system_info(const char *backend, char *buf, size_t cap);

/* Monotonic seconds, and this process's peak resident set size in bytes (0 if unknown). */
double kiri_time_seconds(void);
uint64_t kiri_peak_rss_bytes(void);

#ifdef __cplusplus
}
#endif

#endif
