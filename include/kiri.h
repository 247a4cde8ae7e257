/* kiri: an edge LLM inference runtime. This is its public C API: open a GGUF model, read its
 * metadata, tokenize, and generate, either through a context (one sequence, on the caller's
 * thread) or through the serving loop (many sequences in continuous batches, on a thread of its
 * own). Both are the same engine: a context is a one-sequence client of the serving loop.
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
/* Does the tokenizer's metadata ask for a BOS token at the start of a prompt? */
int kiri_model_add_bos(const struct kiri_model *model);
/* Writes a multi-line human-readable description (architecture, sizes, types, memory, backend). */
void kiri_model_describe(const struct kiri_model *model, char *buf, size_t cap);
/* A string from the file's metadata (e.g. "tokenizer.chat_template"), borrowed from the mapping
 * while the model is open and not NUL-terminated: KIRI_OK with *text and *len, KIRI_E_INVALID_ARG
 * when the key is absent or not a string. */
int kiri_model_meta_str(const struct kiri_model *model, const char *key, const char **text, size_t *len);
/* Whether the model carries a multi-token-prediction head that drafts for KIRI_SPEC_MTP (a qwen35
 * file with nextn_predict_layers 1). */
int kiri_model_has_mtp(const struct kiri_model *model);
/* The size of the model's file in bytes (what its mapping may bring into memory). */
uint64_t kiri_model_file_bytes(const struct kiri_model *model);
/* The memory estimate: bytes of KV cache one token of context takes with kv_type (see
 * kiri_context_params) in the layers that keep every token: all of them, or the global layers of a
 * model with sliding-window layers (Gemma 3). */
size_t kiri_model_kv_bytes_per_token(const struct kiri_model *model, int kv_type);
/* The bytes the sliding-window layers keep for one sequence whatever its length: their window of
 * tokens (a pool adds one prompt chunk per sequence, the keys a step writes before they slide
 * out); 0 for a model without such layers. */
size_t kiri_model_kv_bytes_window(const struct kiri_model *model, int kv_type);
/* Writes one line saying which layers run on which backend. */
void kiri_model_describe_placement(const struct kiri_model *model, char *buf, size_t cap);
/* The backend(s) running the model: "cpu", "vulkan", "cuda", or "vulkan+cpu" when split. */
const char *kiri_model_backend_name(const struct kiri_model *model);

/* Checks that path is a well-formed GGUF file (header, metadata, tensor table against the file
 * size) without loading its model. */
int kiri_model_file_check(const char *path, struct kiri_status_info *info);

/* Tokenizes UTF-8 text. add_bos: -1 follows the model's metadata, 0 never, 1 always. Special-token
 * text is matched only when parse_special is set. Writes at most cap ids and returns the number
 * the text needs (which may exceed cap), or a negative status. */
int kiri_tokenize(const struct kiri_model *model, const char *text, size_t len, int add_bos,
                  int parse_special, int32_t *ids, int cap);

/* Writes the UTF-8 bytes of one token (no terminator) and returns their number, or a negative
 * status. Control tokens render as nothing unless render_special is set. */
int kiri_token_to_piece(const struct kiri_model *model, int32_t token, int render_special,
                        char *buf, size_t cap);

/* Writes the text of a token sequence (control tokens render as nothing, invalid UTF-8 becomes
 * U+FFFD) and returns its length in bytes, which may exceed cap (then nothing useful is written;
 * call again with more room), or a negative status. */
int64_t kiri_detokenize(const struct kiri_model *model, const int32_t *tokens, int32_t n,
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

/* KV cache element types (kiri_context_params.kv_type, kiri_batcher_params.kv_type). */
enum kiri_kv_type { KIRI_KV_F32 = 0, KIRI_KV_F16 = 1, KIRI_KV_Q8_0 = 8 };

struct kiri_context_params {
    int32_t n_ctx;          /* <= 0: the model's training context */
    int32_t n_batch;        /* prompt tokens per forward step; <= 0: 512 */
    int kv_type;            /* KV cache element type: 1 (F16, default), 0 (F32) or 8 (Q8_0) */
    struct kiri_model *draft_model; /* borrowed, or NULL: lets kiri_generate use KIRI_SPEC_DRAFT */
    int speculative;        /* non-zero: kiri_generate may speculate on a model with recurrent
                               layers (its spare state slots, kiri_batcher_params.spec_states, are
                               made); other models speculate either way. Default 0 */
    int mtp;                /* non-zero: lets kiri_generate use KIRI_SPEC_MTP (the model's
                               multi-token-prediction head; kiri_batcher_params.mtp). Default 0 */
};

void kiri_context_params_default(struct kiri_context_params *p);

int kiri_context_init(struct kiri_model *model, const struct kiri_context_params *params,
                      struct kiri_context **out, struct kiri_status_info *info);
void kiri_context_free(struct kiri_context *ctx);

/* Called for each generated token with the text it completes (whole UTF-8 characters only; may be
 * empty while a character is incomplete or while the text could be the start of a stop string).
 * The last token's text includes whatever was held back; after an end-of-generation token, held
 * text comes with token -1. Return non-zero to stop. */
typedef int (*kiri_token_fn)(void *user, int32_t token, const char *text, size_t len);

/* ---- structured output: grammars ----
 *
 * A grammar in llama.cpp's GBNF format (the syntax its grammars/README.md describes: rules
 * `name ::= ...`, literals, character classes, groups, alternation, `*` `+` `?` `{m,n}`, comments)
 * constrains what a sequence may generate: at every step only tokens whose bytes continue a
 * sentence of the grammar can be drawn (the mask is applied before every sampler setting, which
 * then works over what is left), and an end-of-generation token only where the sentence may end.
 * When the sentence is complete and the grammar allows nothing more, the sequence ends
 * (KIRI_FINISH_STOP). Grammars are given as text and compiled at submit; a malformed one is
 * KIRI_E_INVALID_ARG with field "grammar" and the line and column in the message. Matching costs
 * bounded work per byte and per token: a grammar so ambiguous that it would pass the matcher's
 * bounds (more than 4096 live parse stacks, say) ends its own sequence with KIRI_FINISH_ERROR,
 * status KIRI_E_UNSUPPORTED and an error sentence naming the bound (kiri_generate returns them). */

/* Largest grammar text accepted, in bytes. */
#define KIRI_GRAMMAR_MAX_SIZE ((size_t)1 << 20)

/* Checks that gbnf[0..len) is a grammar kiri can use (its rule "root" defined, every rule it
 * names defined, no rule that can only recurse forever on the left). KIRI_OK, or
 * KIRI_E_INVALID_ARG with field "grammar" and a message naming the line, column and reason. */
int kiri_grammar_check(const char *gbnf, size_t len, struct kiri_status_info *info);

struct kiri_generate_params {
    int32_t max_tokens;         /* < 0: until EOS or the context is full */
    struct kiri_sampling sampling;
    const char *const *stop;    /* stop strings (not emitted), or NULL */
    int n_stop;
    const char *grammar;        /* GBNF text constraining the output, or NULL */
    size_t grammar_len;
    int speculative;            /* enum kiri_spec: how tokens are drafted for verification (0: off) */
    int32_t spec_max;           /* most tokens drafted at once (0: KIRI_SPEC_DEFAULT_DRAFT) */
};

/* ---- speculative decoding ----
 *
 * A sequence may draft a few tokens ahead and have one forward step verify them all: the step
 * computes the pending token and the drafts together, and the tokens the model itself would have
 * produced are kept (greedy: the drafts that equal its argmax, then its own next token; sampling:
 * each draft kept with its probability under the full sampling pipeline, else a token drawn from
 * that distribution without the draft), so the output, or its distribution, is exactly that of
 * decoding one token at a time. Rejected positions are dropped from the KV cache. The draft length
 * follows the acceptance rate of each sequence, a sequence whose drafts are mostly rejected pauses
 * drafting, and a step with many decoding sequences drafts nothing (verification is no longer
 * free). A model with recurrent layers (lfm2, qwen35) keeps the state after each drafted token in
 * a spare slot (kiri_batcher_stats.state_slots_spec), the one at the kept length becoming the
 * sequence's. */
enum kiri_spec {
    KIRI_SPEC_NONE = 0,
    KIRI_SPEC_NGRAM = 1,       /* prompt lookup: the tokens that followed the latest earlier
                                  occurrence of the sequence's last few tokens */
    KIRI_SPEC_DRAFT = 2,       /* a draft model with the same vocabulary, greedy
                                  (kiri_batcher_params.draft_model, kiri_context_params.draft_model) */
    KIRI_SPEC_MTP = 3          /* the model's own multi-token-prediction head (qwen35 files with
                                  nextn_predict_layers), greedy, chained on its own hidden state
                                  (kiri_batcher_params.mtp, kiri_context_params.mtp) */
};
#define KIRI_SPEC_KINDS 4
/* Drafted tokens at once: the default and the largest a request may ask for. */
#define KIRI_SPEC_DEFAULT_DRAFT 8
#define KIRI_SPEC_MAX_DRAFT 16
/* "none", "ngram", "draft", "mtp"; NULL for an unknown kind. */
const char *kiri_spec_name(int kind);
/* The kind named (as kiri_spec_name spells it), or -1. */
int kiri_spec_parse(const char *name);

/* Why generation ended (kiri_generate's result, the serving loop's final event). */
enum kiri_finish {
    KIRI_FINISH_LENGTH = 0,     /* max_tokens reached */
    KIRI_FINISH_EOS = 1,        /* an end-of-generation token */
    KIRI_FINISH_STOP = 2,       /* a stop string (or kiri_generate's callback asked to stop) */
    KIRI_FINISH_CONTEXT = 3,    /* the sequence reached the context length */
    KIRI_FINISH_CANCELLED = 4,  /* cancelled, or the serving callback returned non-zero */
    KIRI_FINISH_ERROR = 5       /* the backend failed, or the grammar passed a bound of its matcher
                                   (the final event's status and error); the output is incomplete */
};

struct kiri_generate_result {
    int finish;                 /* enum kiri_finish */
    int32_t n_prompt;
    int32_t n_generated;
    double prefill_seconds;
    double decode_seconds;
    int32_t n_drafted;          /* with speculative: tokens drafted, and of those the ones kept */
    int32_t n_accepted;
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

/* ---- serving: the continuous-batching loop ----
 *
 * One thread drives the model; every step runs one forward pass over the next token of every
 * running sequence plus chunks of waiting prompts (chunked prefill), so the weights are read once
 * per step for all of them. Sequences live in one paged KV cache sized by a memory budget; full
 * prompt blocks are shared between sequences with the same prefix; when blocks run out the
 * lowest-priority, most recently admitted sequence is preempted (its blocks freed, its tokens
 * recomputed later). Requests come from any thread; events go to a callback on the loop thread.
 *
 * Invariants: at most max_seqs sequences run; the waiting queue never exceeds queue_cap; memory is
 * allocated at init (KV pool, graph scratch, per-slot buffers) except each request's copy of its
 * prompt and stop strings; every submitted request gets exactly one final event (finish >= 0),
 * after which its callback is never called again. */

struct kiri_batcher;

struct kiri_batcher_params {
    size_t kv_memory;         /* bytes for the KV block pool; 0: n_ctx tokens for each of max_seqs.
                                 Sliding-window layers take their windows (and a chunk) for each
                                 of max_seqs first; the rest holds the global layers' tokens */
    int32_t n_ctx;            /* most tokens one sequence may hold (prompt + generated); 0: trained */
    int32_t max_seqs;         /* sequences running at once (>= 1) */
    int32_t chunk;            /* prompt tokens per step across all sequences (chunked prefill) */
    int32_t queue_cap;        /* waiting requests beyond which submit answers KIRI_E_BUSY */
    int kv_type;              /* 1 F16 (default), 0 F32, 8 Q8_0 */
    int prefix_cache;         /* share full prompt blocks between sequences (default 1) */
    int swa_full;             /* sliding-window layers keep every token, as global ones do (more
                                 memory, for comparisons); default 0: only their window */
    int32_t draft_rows;       /* drafted tokens one step may verify, over all its sequences (each
                                 costs a row of logits, n_vocab * 4 bytes, on the host and the
                                 backend); 0: no speculation. Default 16, at most chunk */
    int32_t spec_max_seqs;    /* a step drafts only while it decodes at most this many sequences
                                 (default 4) */
    int32_t spec_states;      /* models with recurrent layers (lfm2, qwen35): spare state slots,
                                 each one sequence's state, that keep a drafted token's state until
                                 it is verified; a step drafts at most this many tokens. Default 0:
                                 such a model does not speculate and pays nothing for it; < 0: as
                                 many as draft_rows. From kv_memory when it is set */
    struct kiri_model *draft_model; /* borrowed, or NULL: the model of KIRI_SPEC_DRAFT (the same
                                 vocabulary; its own KV cache of n_ctx tokens per sequence) */
    int mtp;                  /* non-zero: the drafter of KIRI_SPEC_MTP, the model's multi-token-
                                 prediction head, whose keys and values take one more attention
                                 layer in the cache (counted in kv_memory); init fails with
                                 KIRI_E_INVALID_ARG for a model without the head. Default 0 */
};

void kiri_batcher_params_default(struct kiri_batcher_params *p);

#define KIRI_MAX_TOP_LOGPROBS 20

struct kiri_request {
    const int32_t *tokens;        /* the prompt (copied at submit) */
    int32_t n_tokens;
    int32_t max_tokens;           /* < 0: until EOS or n_ctx; 0: the prompt only */
    struct kiri_sampling sampling;
    const char *const *stop;      /* stop strings (copied at submit; not emitted), or NULL */
    int n_stop;
    int priority;                 /* higher runs first and is preempted last */
    int top_logprobs;             /* 0..KIRI_MAX_TOP_LOGPROBS alternatives per token */
    int logprobs;                 /* report the chosen token's log-probability */
    /* GBNF text constraining the output (copied and compiled at submit), or NULL. */
    const char *grammar;
    size_t grammar_len;
    /* With triggers the grammar is lazy: generation is free until its text contains one of these
     * strings; from the first byte of that trigger on, the text must follow the grammar (as tool
     * calls do: free text, then a call whose arguments must parse). */
    const char *const *grammar_triggers;
    int n_grammar_triggers;
    /* Added to the logits of these tokens before sampling (OpenAI's logit_bias, -100..100;
     * -100 or less bans the token). Copied at submit. */
    const int32_t *bias_tokens;
    const float *bias_values;
    int n_bias;
    int speculative;              /* enum kiri_spec (0: off); not for a held sequence */
    int32_t spec_max;             /* most tokens drafted at once, 0..KIRI_SPEC_MAX_DRAFT (0: default) */
};

struct kiri_token_event {
    int32_t token;                /* the generated token, or -1 in a final event without one */
    int finish;                   /* -1 while running, else enum kiri_finish */
    int status;                   /* with KIRI_FINISH_ERROR: why (KIRI_E_NOMEM, KIRI_E_BACKEND, or
                                     KIRI_E_UNSUPPORTED: the grammar passed a bound of its matcher) */
    const char *error;            /* with KIRI_FINISH_ERROR: a sentence naming the cause when known
                                     ("grammar too ambiguous: ..."), else NULL; valid during the
                                     callback only */
    /* The text this event completes: whole UTF-8 characters, stop strings cut, text that may
     * begin a stop string held back until it cannot; a final event also carries what was held
     * (not after a stop string or an error). Valid during the callback only. */
    const char *text;
    size_t text_len;
    float logprob;                /* of token, when requested */
    int n_top;
    int32_t top_ids[KIRI_MAX_TOP_LOGPROBS];
    float top_logprobs[KIRI_MAX_TOP_LOGPROBS];
    int32_t n_prompt;             /* prompt tokens */
    int32_t n_cached;             /* prompt tokens whose keys and values came from the prefix cache */
    int32_t n_generated;          /* so far, this token included */
    double queue_seconds;         /* submit to first step */
    double first_token_seconds;   /* submit to first token (time to first token) */
    const float *logits;          /* the engine's own contexts only (NULL otherwise) */
};

/* Called on the loop thread for each token and once more (or with the last token) at the end.
 * Return non-zero to stop the request. Must not block for long: it delays every sequence. */
typedef int (*kiri_batcher_fn)(void *user, const struct kiri_token_event *ev);

struct kiri_batcher_stats {
    int32_t running;
    int32_t waiting;
    int32_t kv_blocks_total;
    int32_t kv_blocks_used;
    int32_t kv_blocks_cached;
    int32_t kv_block_size;
    uint64_t prefix_hit_blocks;
    uint64_t steps;
    uint64_t preemptions;
    int32_t last_batch_tokens;    /* tokens in the last step */
    int32_t last_batch_seqs;      /* sequences in the last step */
    int32_t peak_batch_seqs;      /* most sequences in one step since init */
    uint64_t prompt_tokens;       /* totals since init */
    uint64_t generated_tokens;
    uint64_t kv_bytes;            /* the KV pool's keys and values: the kv_blocks of the global
                                     layers, plus the sliding-window layers' own pool */
    int32_t kv_window_blocks_total; /* that pool's blocks (0 without one) */
    int32_t kv_window_blocks_used;
    int32_t state_slots_total;    /* recurrent-state slots (lfm2's convolutions; 0 without): one per
                                     sequence, and state_slots_spec */
    int32_t state_slots_used;     /* held by running sequences */
    uint64_t state_bytes;         /* the state store, all slots */
    int32_t snapshots_total;      /* recurrent-state snapshots kept for prefix reuse (0 without) */
    int32_t snapshots_used;       /* holding one */
    uint64_t snapshot_bytes;      /* the snapshot store, all of them */
    uint64_t snapshot_hits;       /* admissions that resumed a prefix from a snapshot */
    uint64_t snapshot_misses;     /* admissions with a whole prompt block that found none */
    uint64_t spec_drafted[KIRI_SPEC_KINDS];  /* tokens drafted, by enum kiri_spec, since init */
    uint64_t spec_accepted[KIRI_SPEC_KINDS]; /* of those, the ones the model kept */
    int32_t state_slots_spec;     /* of state_slots_total, the spare ones that keep the state after
                                     each drafted token, to roll back to (0 without state) */
};

int kiri_batcher_init(struct kiri_model *model, const struct kiri_batcher_params *params,
                      struct kiri_batcher **out, struct kiri_status_info *info);
/* Stops the loop (finishing every request as cancelled) and frees everything. */
void kiri_batcher_free(struct kiri_batcher *b);

/* Starts the loop thread. */
int kiri_batcher_start(struct kiri_batcher *b);
/* Stops taking requests; with drain, waits until running and waiting ones finish, else cancels
 * them. Then stops the loop thread. */
void kiri_batcher_stop(struct kiri_batcher *b, int drain);

/* Queues a request. Returns KIRI_OK and its id, KIRI_E_BUSY when the queue is full or the batcher
 * is stopping, KIRI_E_INVALID_ARG (info names why) for a bad request, such as a prompt that leaves
 * no room to generate within n_ctx. The callback is never called when submit fails. */
int kiri_batcher_submit(struct kiri_batcher *b, const struct kiri_request *r, kiri_batcher_fn fn, void *user,
                        uint64_t *id, struct kiri_status_info *info);
/* Asks for a request to end (any thread). Its final event follows within one step. */
void kiri_batcher_cancel(struct kiri_batcher *b, uint64_t id);

/* Waits until nothing runs or waits (and the statistics are current), at most timeout_seconds.
 * Returns KIRI_OK when idle, KIRI_E_BUSY on timeout. */
int kiri_batcher_wait_idle(struct kiri_batcher *b, double timeout_seconds);

void kiri_batcher_get_stats(struct kiri_batcher *b, struct kiri_batcher_stats *s);
int32_t kiri_batcher_n_ctx(const struct kiri_batcher *b);

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
