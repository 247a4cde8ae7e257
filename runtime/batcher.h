/* The continuous-batching loop: one thread drives the model; every step runs one forward pass over
 * the next token of every running sequence plus chunks of waiting prompts (chunked prefill), so the
 * weights are read once per step for all of them. Sequences live in one paged KV cache sized by a
 * memory budget; full prompt blocks are shared between sequences with the same prefix; when blocks
 * run out the lowest-priority, most recently admitted sequence is preempted (its blocks freed, its
 * tokens recomputed later). Requests come from any thread; results go to a callback on the loop
 * thread.
 *
 * Invariants: at most max_seqs sequences run; the waiting queue never exceeds queue_cap; memory is
 * allocated at init (KV pool, graph scratch, per-slot buffers) except each request's copy of its
 * prompt; every submitted request gets exactly one final event (finish >= 0), after which its
 * callback is never called again.
 */
#ifndef KIRI_BATCHER_H
#define KIRI_BATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "kiri.h"

struct kiri_model;
struct kiri_batcher;

struct kiri_batcher_params {
    size_t kv_memory;         /* bytes for the KV block pool; 0: n_ctx tokens for each of max_seqs */
    int32_t n_ctx;            /* most tokens one sequence may hold (prompt + generated); 0: trained */
    int32_t max_seqs;         /* sequences running at once (>= 1) */
    int32_t chunk;            /* prompt tokens per step across all sequences (chunked prefill) */
    int32_t queue_cap;        /* waiting requests beyond which submit answers KIRI_E_BUSY */
    int kv_type;              /* 1 F16 (default), 0 F32, 8 Q8_0 */
};

void kiri_batcher_params_default(struct kiri_batcher_params *p);

#define KIRI_MAX_TOP_LOGPROBS 20

/* Extra finish reasons beyond enum kiri_finish. */
enum {
    KIRI_FINISH_CANCELLED = 10,   /* kiri_batcher_cancel, or the callback returned non-zero */
    KIRI_FINISH_ERROR = 11        /* the backend failed; the request's output is incomplete */
};

struct kiri_request {
    const int32_t *tokens;        /* the prompt (copied at submit) */
    int32_t n_tokens;
    int32_t max_tokens;           /* < 0: until EOS or n_ctx */
    struct kiri_sampling sampling;
    int priority;                 /* higher runs first and is preempted last */
    int top_logprobs;             /* 0..KIRI_MAX_TOP_LOGPROBS alternatives per token */
    int logprobs;                 /* report the chosen token's log-probability */
};

struct kiri_token_event {
    int32_t token;                /* the generated token, or -1 in a final event without one */
    int finish;                   /* -1 while running, else enum kiri_finish or KIRI_FINISH_* */
    float logprob;                /* of token, when requested */
    int n_top;
    int32_t top_ids[KIRI_MAX_TOP_LOGPROBS];
    float top_logprobs[KIRI_MAX_TOP_LOGPROBS];
    int32_t n_prompt;             /* prompt tokens */
    int32_t n_cached;             /* prompt tokens whose keys and values came from the prefix cache */
    int32_t n_generated;          /* so far, this token included */
    double queue_seconds;         /* submit to first step */
    double first_token_seconds;   /* submit to first token (time to first token) */
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

#endif
