/* Drafters for speculative decoding (include/kiri.h, enum kiri_spec): each proposes the tokens a
 * sequence is likely to continue with, which the batcher then verifies in one step. A drafter only
 * guesses: a wrong guess costs a little compute, never a changed output.
 *
 * The interface is one small table of functions so that drafters with state of their own (a draft
 * model with its own cache) fit beside the stateless prompt lookup. A drafter is used by one
 * thread at a time (the loop's). */
#ifndef KIRI_DRAFT_H
#define KIRI_DRAFT_H

#include <stdint.h>

struct kiri_batcher;
struct kiri_graph;
struct kiri_kvcache;
struct kiri_kv_seq;
struct kiri_model;
struct kiri_status_info;

struct kiri_drafter {
    const char *name;   /* as kiri_spec_name spells it */
    /* Writes at most max (>= 1) tokens likely to follow tokens[0..n) into draft and returns how
     * many (0: no guess). tokens is the whole sequence, prompt and generated; seq names it for a
     * drafter that keeps state per sequence. Never fails (a failure is no guess). */
    int32_t (*propose)(struct kiri_drafter *d, uint64_t seq, const int32_t *tokens, int32_t n, int32_t *draft,
                       int32_t max);
    /* Forgets what it keeps for seq (the sequence ended). NULL for a stateless drafter. */
    void (*release)(struct kiri_drafter *d, uint64_t seq);
    /* Frees the drafter. NULL for a static one. */
    void (*free)(struct kiri_drafter *d);
    /* The model computed positions [p0, p0 + n) of seq and kept them: tokens is the sequence, kv
     * its block table (valid until release), hidden those positions' hidden states as the output
     * norm leaves them (kiri_batch.hidden, n_embd floats each). Called for every kept step of
     * seq, in order; a p0 past what was seen before starts afresh there (a shared prefix, a
     * recomputation after preemption). NULL for a drafter that needs none. */
    void (*observe)(struct kiri_drafter *d, uint64_t seq, const struct kiri_kv_seq *kv, const int32_t *tokens,
                    int32_t p0, int32_t n, const float *hidden);
};

/* The prompt-lookup drafter (static: never freed). */
struct kiri_drafter *kiri_drafter_ngram(void);

/* A draft model: draft, a model with the same vocabulary as target (every token's text, BOS and
 * EOS equal), run greedily in a serving loop of its own (max_seqs sequences of n_ctx tokens,
 * chunk prompt tokens a step) driven from the caller's thread. Each sequence keeps its keys and
 * values there between proposals; what the target rejected is cut away before the next one, and
 * only the tokens the draft model has not seen are computed. KIRI_E_INVALID_ARG when the
 * vocabularies differ or the draft model has recurrent layers (lfm2), KIRI_E_NOMEM. */
int kiri_drafter_model_init(const struct kiri_model *target, struct kiri_model *draft, int32_t max_seqs,
                            int32_t n_ctx, int32_t chunk, struct kiri_drafter **out, struct kiri_status_info *info);

/* The model's own multi-token-prediction head (struct kiri_mtp_head) as a drafter, for the
 * sequences of one serving loop (its cache, made by kiri_model_kvcache_init_mtp, and its graph,
 * of max_tokens tokens): observe runs the head over every kept position, so that its keys and
 * values follow the sequence's (in the cache's MTP layer, at the sequence's own slots: a rollback
 * of the sequence rolls them back too); propose then chains it from the pending token: the first
 * guess from the pending token and the hidden state before it, each further one from the guess
 * before and the head's own hidden state, greedy. The positions it drafts must be reserved in the
 * sequence's table. KIRI_E_INVALID_ARG for a model without the head, KIRI_E_NOMEM. The environment
 * variable KIRI_MTP_TRACE may name a file that each proposal is appended to (JSON lines: the
 * sequence up to the pending token, the drafts), for tests. */
int kiri_drafter_mtp_init(struct kiri_model *m, struct kiri_kvcache *kv, struct kiri_graph *graph, int32_t max_seqs,
                          int32_t max_tokens, struct kiri_drafter **out, struct kiri_status_info *info);

/* Prompt lookup: the longest suffix of tokens[0..n), of KIRI_NGRAM_MAX down to KIRI_NGRAM_MIN
 * tokens, that also occurs earlier (the latest such occurrence, searched over at most the last
 * KIRI_NGRAM_WINDOW positions); the draft is what followed it there. */
/* Three tokens at least: two-token matches ("of the") recur by chance in free text, and their
 * drafts cost verification more often than they pay (measured in bench/bench_spec.py). */
#define KIRI_NGRAM_MAX 4
#define KIRI_NGRAM_MIN 3
#define KIRI_NGRAM_WINDOW 16384
int32_t kiri_draft_ngram(const int32_t *tokens, int32_t n, int32_t *draft, int32_t max);

#endif
