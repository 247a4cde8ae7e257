/* The forward pass, written once against the backend interface: turns a batch of tokens (from one
 * or many sequences, prompt chunks and decode steps mixed) into a list of backend nodes over the
 * model's weights and the paged KV cache, runs it, and returns the logits of the rows asked for.
 *
 * Invariants: a graph's scratch buffer is sized at init for max_tokens tokens and max_outputs
 * logit rows and never grows; a batch larger than that is refused, not truncated. A model split
 * by gpu_layers gets a second scratch buffer on its GPU backend (the layers' activations and
 * inputs only); the residual stream crosses to it and back once per step.
 */
#ifndef KIRI_GRAPH_H
#define KIRI_GRAPH_H

#include <stdint.h>

struct kiri_model;
struct kiri_kvcache;
struct kiri_graph;
struct kiri_status_info;

/* One forward step's input. For token i: its id, its position in its sequence, the cache slot
 * its key and value are written to, and how many keys it attends to (pos + 1) through the block
 * table starting at tables[table_off[i]]. Logits come out for the tokens listed in out_rows.
 * With a cache whose sliding-window layers have a pool of their own (kiri_kvcache_window), those
 * layers write token i to swa_slots[i] and read through swa_tables (same offsets and entry
 * count; entries below a token's window are stale and never read); NULL otherwise. A model
 * with recurrent layers reads and updates token i's sequence state in row state_rows[i] of the
 * cache's (kiri_kvcache_state), the tokens of one sequence in order, a token at position 0
 * starting it from zeros; NULL for a model without. With state_from (NULL: the same rows) token
 * i starts from the state in row state_from[i] instead, and row state_rows[i] receives the state
 * after it (a speculative step keeps the state after each of its tokens:
 * kiri_kvcache_seq_state_step). */
struct kiri_batch {
    int32_t n_tokens;
    const int32_t *tokens;
    const int32_t *pos;
    const int32_t *slots;
    const int32_t *n_kv;
    const int32_t *table_off;
    const int32_t *tables;
    int32_t n_table_entries;
    const int32_t *out_rows;
    int32_t n_outputs;
    const int32_t *swa_slots;
    const int32_t *swa_tables;
    const int32_t *state_rows;
    const int32_t *state_from;
    float *hidden;          /* NULL, or (a model with an MTP head) receives every token's hidden
                               state as the output norm leaves it, n_embd floats a token: the
                               MTP head's input */
};

/* n_ctx is the longest sequence the graph will run (the batcher's per-sequence context): it
 * picks LongRoPE's factor set (kiri_model_rope_factors). */
int kiri_graph_init(struct kiri_model *m, int32_t max_tokens, int32_t max_outputs,
                    int32_t max_table_entries, int32_t n_ctx, struct kiri_graph **out);
void kiri_graph_free(struct kiri_graph *g);
/* Scratch bytes a graph of these limits takes (for memory reports). */
uint64_t kiri_graph_scratch_bytes(const struct kiri_model *m, int32_t max_tokens, int32_t max_outputs,
                                  int32_t max_table_entries);

/* Runs one step. *logits (n_vocab * n_outputs floats, row i for out_rows[i]) is owned by the
 * graph and valid until the next run. kv must come from kiri_model_kvcache_init (each layer's
 * keys and values on the backend that runs the layer); another placement is KIRI_E_INVALID_ARG. */
int kiri_graph_run(struct kiri_graph *g, struct kiri_kvcache *kv, const struct kiri_batch *b,
                   const float **logits, struct kiri_status_info *info);

/* Runs the model's multi-token-prediction head (struct kiri_mtp_head) over b's tokens: token i
 * at its position with h's row i (n_embd floats) as the hidden state before it, its keys and
 * values written to the cache's MTP layer (kiri_model_kvcache_init_mtp) at its slot (tables as
 * for the trunk; no windowed slots, no state rows, b->hidden unused). For the n_outputs rows
 * (0: none, only the keys are written) the head's logits come out as kiri_graph_run's, and its
 * hidden state, which a chained draft feeds back as h, is written to h_out (n_embd floats a
 * row). KIRI_E_INVALID_ARG for a model without the head or a cache without its layer. */
int kiri_graph_run_mtp(struct kiri_graph *g, struct kiri_kvcache *kv, const struct kiri_batch *b, const float *h,
                       float *h_out, const float **logits, struct kiri_status_info *info);

#endif
