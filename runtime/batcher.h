/* The continuous-batching loop (include/kiri.h declares its public half). This header adds what
 * only the engine uses: a sequence held after its tokens are computed, and driving the loop from
 * the calling thread, which is how a context (kiri_context_*) is a one-sequence client of it. */
#ifndef KIRI_BATCHER_H
#define KIRI_BATCHER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "kiri.h"

/* Recurrent-state snapshots kept for prefix reuse per sequence of max_seqs (a model with
 * recurrent layers, the prefix cache on; fewer when the KV budget cannot hold them). */
#define KIRI_BATCHER_SNAPSHOTS_PER_SEQ 2

/* kiri_batcher_init for a loop of held sequences that kiri_batcher_truncate cuts back on a model
 * with recurrent layers (a draft model's): with held_history, each step of a held sequence keeps
 * the state it passed in a slot of its own (kvcache.h, state history), at most
 * KIRI_KVCACHE_STATE_HISTORY of them per sequence, allocated at init. */
int kiri_batcher_init_held(struct kiri_model *m, const struct kiri_batcher_params *params, int held_history,
                           struct kiri_batcher **out, struct kiri_status_info *info);

/* Queues a held request: its tokens are computed (up to n_ctx of them, none sampled), the
 * callback gets one event with the last token's logits (ev->logits, valid until the next step),
 * and the sequence then waits, keeping its KV blocks, for kiri_batcher_append or a cancel. */
int kiri_batcher_submit_held(struct kiri_batcher *b, const struct kiri_request *r, kiri_batcher_fn fn,
                             void *user, uint64_t *id, struct kiri_status_info *info);
/* Appends tokens to a held sequence; the next steps compute them and send another logits event.
 * KIRI_E_CONTEXT_FULL when they would pass n_ctx, KIRI_E_INVALID_ARG for an unknown id. Only
 * from the thread that drives the loop (kiri_batcher_run). */
int kiri_batcher_append(struct kiri_batcher *b, uint64_t id, const int32_t *tokens, int32_t n,
                        struct kiri_status_info *info);
/* Cuts a held sequence back to its first n tokens (1 <= n <= its length): the later ones are
 * forgotten with their keys and values, and the next steps compute token n - 1 again (when it was
 * computed) so that another logits event follows; then kiri_batcher_append can go on from there.
 * KIRI_E_INVALID_ARG for an unknown id, a bad n, or a cut into blocks published for prefix
 * sharing. Only from the thread that drives the loop. */
int kiri_batcher_truncate(struct kiri_batcher *b, uint64_t id, int32_t n, struct kiri_status_info *info);
struct kiri_drafter;
/* Makes d (borrowed: it outlives the batcher) the drafter of KIRI_SPEC_DRAFT requests in place of
 * a draft model's, before any request: tests of the speculation's adaptation give it drafters of
 * known cost and accuracy. KIRI_E_INVALID_ARG when b cannot verify drafts or has requests. */
int kiri_batcher_set_drafter(struct kiri_batcher *b, struct kiri_drafter *d);
/* Makes b's drafts follow acceptance alone, whatever they cost (what a non-empty environment
 * variable KIRI_SPEC_IGNORE_COST other than "0" does for every loop made while it is set): for
 * tests of what drafts give, on models so small that verifying costs as much as it saves. */
void kiri_batcher_ignore_spec_costs(struct kiri_batcher *b);
/* Runs steps on the calling thread, for a batcher whose loop thread was never started, until
 * there is nothing left to compute. When *cancel becomes non-zero every request is cancelled
 * (and gets its final event) before this returns. */
void kiri_batcher_run(struct kiri_batcher *b, const _Atomic int *cancel);

#endif
