/* The paged key/value cache: pools of fixed-size blocks, each block holding block_size token slots
 * of its layers' keys and values, and per-sequence block tables mapping positions to slots.
 * Blocks are reference counted so sequences can share the blocks of a common prefix (a block is
 * written only while its count is 1).
 *
 * Sliding-window layers. A layer that attends only its last `window` keys (layer.swa) may keep
 * them in a pool of its own (kiri_kvcache_init_windowed): the windowed pool, sized for the window
 * of every sequence rather than its whole context, so a long context costs what the global layers
 * need plus a constant. Each sequence then has a second table (wblocks) over the same positions;
 * its entries [0, w_lo) are released blocks, stale ids that the attention never reads (a token
 * with n keys reads only keys [n - window, n)). Before a step writes positions [a, b)
 * (kiri_kvcache_seq_reserve from n_tokens = a), the windowed blocks lying wholly below
 * a - window + 1 go back to the pool, and only blocks for [a - window + 1, b) are reserved.
 * A cache made without a window has one pool and behaves exactly as before.
 *
 * Recurrent state. A layer without attention (lfm2's short convolutions) keeps no keys; what it
 * carries from one token to the next is a fixed-size state per sequence (kiri_kvcache_state):
 * one row of F32 per slot in each such layer, in a buffer allocated beside the pools at init on
 * the backend that runs the layer. A
 * sequence takes a slot with its first reservation and gives it back with its blocks
 * (kiri_kvcache_seq_clear), so admission, preemption and cancellation handle both at once. The
 * state holds only the latest position's, so a prefix is shared only through a snapshot: a host
 * copy of a slot's state taken when a step ends exactly at the end of a cached global block
 * (kiri_kvcache_snapshot), kept with that block in one of a fixed number of snapshot slots
 * allocated at init (none: nothing is shared), dropped with the block when it is evicted or,
 * least recently used first, when a new snapshot needs its slot. A sequence that takes a
 * prefix gets the snapshot of its last block copied into its state slot and computes the rest;
 * a sequence computed from position 0 starts the state from zeros.
 *
 * State history. Rolling back rejected drafted tokens needs the state at an earlier position,
 * which the recurrence overwrote. So a step may write the states after some of its tokens into
 * fresh slots instead (kiri_kvcache_seq_state_step: each such token reads the row its
 * predecessor wrote and writes its own, which costs no copy beyond the first row's), and the
 * sequence keeps the slots of the states it passed, each with its position, in a bounded
 * history; kiri_kvcache_seq_truncate then makes the one at the new end current and gives the
 * later ones back. A cache built for speculation has spare slots beyond one per sequence for
 * that; a sequence gives its history back with its slot.
 *
 * Invariants: a block is either on its pool's free list (count 0) or referenced by at least one
 * sequence or the prefix cache; position p of a sequence lives in slot table[p / block_size] *
 * block_size + p % block_size; a sequence's tables have exactly ceil(n_tokens / block_size)
 * entries after kiri_kvcache_seq_reserve for n_tokens, the windowed one live from w_lo; every
 * windowed block a position in [n_tokens - window, n_tokens) lies in is live. The whole pool is
 * allocated once at init: memory never grows past it (kiri_kvcache_place reallocates it, at the
 * same size). A layer's keys and values live on the backend that runs the layer: layers
 * [0, n_first) on the first backend, the rest on the other.
 */
#ifndef KIRI_KVCACHE_H
#define KIRI_KVCACHE_H

#include <stddef.h>
#include <stdint.h>

struct kiri_backend;
struct kiri_backend_iface;
struct kiri_tensor;
struct kiri_kvcache;

/* Earlier states a sequence keeps at most (kiri_kvcache_seq_state_step): a speculative step's
 * (up to KIRI_SPEC_MAX_DRAFT) and one more. */
#define KIRI_KVCACHE_STATE_HISTORY 18

struct kiri_kv_seq {
    int32_t *blocks;        /* owned: block ids, n_blocks of cap */
    int32_t n_blocks;
    int32_t cap;
    int32_t n_tokens;       /* positions [0, n_tokens) are stored */
    int32_t *wblocks;       /* owned: windowed-pool block ids, n_blocks of cap (entries [0, w_lo)
                               stale); NULL for a cache without a window */
    int32_t w_lo;
    int32_t state;          /* its recurrent-state slot + 1; 0: none (yet) */
    int32_t snap;           /* its latest passing snapshot + 1 (kiri_kvcache_snapshot); 0: none */
    uint64_t snap_gen;      /* that snapshot's generation, to tell a slot since reused */
    int32_t hist_slot[KIRI_KVCACHE_STATE_HISTORY]; /* state slots of earlier positions, oldest first */
    int32_t hist_pos[KIRI_KVCACHE_STATE_HISTORY];  /* the slot holds the state after this position */
    int32_t n_hist;
};

/* The sliding-window layers of kiri_kvcache_init_windowed. */
struct kiri_kvcache_window {
    const uint8_t *layers;  /* borrowed (n_layer): 1 for a layer that keeps only its window */
    int32_t window;         /* keys such a layer attends (> 0) */
    int32_t n_blocks;       /* blocks of the windowed pool (> 0) */
};

/* Allocates the pool on the backend: n_layer layers of keys and values, each row kv_dim
 * elements of type (F32, F16 or Q8_0), n_blocks blocks of block_size slots. */
int kiri_kvcache_init(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_layer,
                      int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                      struct kiri_kvcache **out);
/* The same with the keys and values of layers [0, n_first) in a buffer of their own on another
 * backend (first_iface, first_be): the layers a partly offloaded model runs there. n_first = 0
 * is kiri_kvcache_init. */
int kiri_kvcache_init_split(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_first,
                            const struct kiri_backend_iface *first_iface, struct kiri_backend *first_be,
                            int n_layer, int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                            struct kiri_kvcache **out);
/* The same with the layers w->layers marks in the windowed pool of w->n_blocks blocks, and the
 * others in the global pool of n_blocks. w = NULL, or one that marks no layer, is
 * kiri_kvcache_init_split. */
int kiri_kvcache_init_windowed(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_first,
                               const struct kiri_backend_iface *first_iface, struct kiri_backend *first_be,
                               int n_layer, int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                               const struct kiri_kvcache_window *w, struct kiri_kvcache **out);
/* Layers of different shapes (gemma4): kv_dim[l] elements per row of layer l (NULL: kv_dim for
 * every layer), and source[l], the layer whose keys and values layer l attends (NULL: each its
 * own). A layer with source[l] < l stores nothing (the step that runs it writes no keys) and costs
 * no memory; its source must have its own, lie in the same pool (both windowed or neither), on
 * the same backend (both below n_first or neither), with the same row. */
struct kiri_kvcache_state;
struct kiri_kvcache_layout {
    const int64_t *kv_dim;  /* borrowed (n_layer) or NULL; 0: a layer that keeps no keys (it must
                               be its own source, outside the windowed pool) */
    const int32_t *source;  /* borrowed (n_layer) or NULL: source[l] == l, or an earlier layer */
    const struct kiri_kvcache_state *state; /* borrowed or NULL: no recurrent state */
};
/* Recurrent state: dims[l] F32 per slot in layer l (0: a layer without state), n_slots slots (the
 * sequences that can run at once). A layer with state keeps no keys (kv_dim 0); its state lives on
 * the backend that runs it, as keys do (below n_first: first_be), and stays there:
 * kiri_kvcache_place refuses to move a layer with state to another backend. Each layer has its
 * own size (qwen35's Gated DeltaNet layers keep a convolution window and a delta-rule state,
 * lfm2's a window only). */
struct kiri_kvcache_state {
    const int64_t *dims;    /* borrowed (n_layer) */
    int32_t n_slots;
    int32_t n_snapshots;    /* snapshot slots, each one slot's state, in host memory (0: none) */
};
/* kiri_kvcache_init_windowed with a layout (NULL: every layer kv_dim, its own). */
int kiri_kvcache_init_layers(const struct kiri_backend_iface *iface, struct kiri_backend *be, int n_first,
                             const struct kiri_backend_iface *first_iface, struct kiri_backend *first_be,
                             int n_layer, int64_t kv_dim, int type, int block_size, int32_t n_blocks,
                             const struct kiri_kvcache_window *w, const struct kiri_kvcache_layout *lay,
                             struct kiri_kvcache **out);
/* Moves layers [0, n_first) to a buffer of their own on backend (first_iface, first_be) and the
 * others to one on (iface, be), keeping what they hold (a one-time copy); a no-op when they are
 * already there. On failure (KIRI_E_INVALID_ARG, KIRI_E_NOMEM, KIRI_E_BACKEND) the cache is
 * unchanged. No step may run on the cache meanwhile. */
int kiri_kvcache_place(struct kiri_kvcache *c, int n_first, const struct kiri_backend_iface *first_iface,
                       struct kiri_backend *first_be, const struct kiri_backend_iface *iface,
                       struct kiri_backend *be);
/* Leading layers on a backend of their own (0 when all share one), and the backend that holds
 * a layer's keys and values. */
int kiri_kvcache_n_first(const struct kiri_kvcache *c);
struct kiri_backend *kiri_kvcache_backend(const struct kiri_kvcache *c, int layer);
void kiri_kvcache_free(struct kiri_kvcache *c);

int kiri_kvcache_block_size(const struct kiri_kvcache *c);
/* Free blocks of the global pool (the only one without a window) and of the windowed pool (0
 * without one). */
int32_t kiri_kvcache_n_free(const struct kiri_kvcache *c);
int32_t kiri_kvcache_n_free_window(const struct kiri_kvcache *c);
/* All the pools' keys and values, and the recurrent state. */
size_t kiri_kvcache_bytes(const struct kiri_kvcache *c);
/* The recurrent state: layer's (dim, n_slots) F32, borrowed, or NULL for a layer without; the
 * slots, those free, the bytes, and seq's slot (-1: none). */
struct kiri_tensor *kiri_kvcache_state(struct kiri_kvcache *c, int layer);
int32_t kiri_kvcache_n_state_slots(const struct kiri_kvcache *c);
int32_t kiri_kvcache_n_state_free(const struct kiri_kvcache *c);
size_t kiri_kvcache_state_bytes(const struct kiri_kvcache *c);
int32_t kiri_kvcache_seq_state_row(const struct kiri_kv_seq *seq);
/* Keeps a copy of seq's state as the state after its block i (seq->n_tokens must be exactly
 * (i + 1) * block_size, the block published under hash), with the cached block, evicting the
 * least recently used snapshot when every slot is taken. The sequence's previous passing
 * snapshot (one taken without keep) is dropped first unless a sequence resumed from it, so a
 * sequence holds at most one passing snapshot, its latest, besides those it keeps. Returns 1
 * when taken, 0 when not (no snapshots, no such cached block, or it has one already),
 * KIRI_E_BACKEND when the device failed to copy. */
int kiri_kvcache_snapshot(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t i, uint64_t hash,
                          const int32_t *tokens, int keep);
/* The longest run of tokens' whole blocks (at most n_blocks) cached in the global pool, whether
 * or not they have snapshots. */
int32_t kiri_kvcache_cached_blocks(const struct kiri_kvcache *c, const int32_t *tokens, int32_t n_blocks);
/* Snapshot slots, those holding one, their bytes (all slots), and since init the prefixes resumed
 * from one (hits) and the admissions with a whole block before their last token that found none
 * (misses). */
int32_t kiri_kvcache_n_snapshots(const struct kiri_kvcache *c);
int32_t kiri_kvcache_n_snapshots_used(const struct kiri_kvcache *c);
size_t kiri_kvcache_snapshot_bytes(const struct kiri_kvcache *c);
uint64_t kiri_kvcache_snapshot_hits(const struct kiri_kvcache *c);
uint64_t kiri_kvcache_snapshot_misses(const struct kiri_kvcache *c);
/* Whether layer attends keys kept in the cache (its own or its source's): 0 for a recurrent one. */
int kiri_kvcache_layer_has_kv(const struct kiri_kvcache *c, int layer);
/* The window of the windowed layers (0 without a windowed pool), and whether layer is one. */
int32_t kiri_kvcache_window(const struct kiri_kvcache *c);
int kiri_kvcache_layer_windowed(const struct kiri_kvcache *c, int layer);
/* The key / value cache of one layer as a tensor (kv_dim, n_blocks * block_size) of its pool
 * (of its source layer for one without its own); borrowed. */
struct kiri_tensor *kiri_kvcache_k(struct kiri_kvcache *c, int layer);
struct kiri_tensor *kiri_kvcache_v(struct kiri_kvcache *c, int layer);
/* The layer whose keys and values layer attends: itself, or the earlier layer of the layout. */
int kiri_kvcache_layer_source(const struct kiri_kvcache *c, int layer);

/* Blocks a reservation could take now: free ones plus cached prefix blocks nobody uses; of the
 * global pool and of the windowed one (0 without one). */
int32_t kiri_kvcache_n_available(const struct kiri_kvcache *c);
int32_t kiri_kvcache_n_available_window(const struct kiri_kvcache *c);

/* Makes room for positions [0, n_tokens) in seq, taking blocks from the pools (evicting the least
 * recently used unreferenced prefix blocks when no block is free), and a state slot when the
 * cache has state and seq has none. The next step writes from
 * seq->n_tokens on: windowed blocks wholly below seq->n_tokens - window + 1 are released first
 * (even when the reservation then fails). Returns KIRI_OK or KIRI_E_CONTEXT_FULL (nothing taken)
 * when a pool lacks blocks. */
int kiri_kvcache_seq_reserve(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t n_tokens);
/* Rolls seq back to its first n_tokens positions (rejected drafted tokens): the blocks wholly past
 * the new end go back to their pools, and the next step writes from n_tokens on, over what the
 * dropped positions left in the last block. That block must be seq's own (not shared or
 * published), which holds for any end past the positions that were published. With recurrent
 * state the state after position n_tokens - 1 must be in seq's history (or n_tokens be
 * seq->n_tokens, or 0): it becomes the current one, and the later ones go back. Otherwise, and
 * for n_tokens outside [0, seq->n_tokens], KIRI_E_INVALID_ARG (nothing changes). */
int kiri_kvcache_seq_truncate(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t n_tokens);
/* The state rows of a step of n tokens from seq->n_tokens (seq reserved, so it holds a slot):
 * fills write[i] and read[i] for each token (the batch's state_rows and state_from). The last
 * n_fresh tokens each write a fresh slot, reading the row the token before wrote; the others
 * update seq's slot in place. The slots of the states passed go to seq's history, its oldest
 * entries dropped to make room; fresh slots come from the free ones, so fewer tokens may get
 * one: returns how many did (0..n_fresh), and the step must then run. */
int32_t kiri_kvcache_seq_state_step(struct kiri_kvcache *c, struct kiri_kv_seq *seq, int32_t n, int32_t n_fresh,
                                    int32_t *write, int32_t *read);
/* Gives seq's history back (its current state stays). */
void kiri_kvcache_seq_state_forget(struct kiri_kvcache *c, struct kiri_kv_seq *seq);
/* Returns all of seq's blocks to the pool, and its state slot, and empties it (the table memory
 * is kept). */
void kiri_kvcache_seq_clear(struct kiri_kvcache *c, struct kiri_kv_seq *seq);
/* Frees the table memory too. */
void kiri_kvcache_seq_free(struct kiri_kvcache *c, struct kiri_kv_seq *seq);
/* ---- prefix sharing ----
 * A full block is identified by a chain hash over every token from position 0 to its end, so
 * equal hashes mean equal prefixes (the block's own tokens are compared too, against collisions).
 * Published blocks stay cached after their sequences end, until the pool needs them back (the least
 * recently used first; a sequence's blocks, when it ends, count as used last to first). */

/* The chain hash of a block holding tokens[0..n) whose predecessor block has hash parent (0 for
 * the first block). */
uint64_t kiri_kvcache_block_hash(uint64_t parent, const int32_t *tokens, int n);
/* Gives the empty seq the cached blocks of the longest prefix of tokens, at most n_blocks whole
 * blocks, that is cached in every layer: the global blocks of all its positions and, with a
 * window, the windowed blocks of the window before its end (the keys the next position attends;
 * earlier ones are stale entries). A prefix whose windowed blocks were evicted is cut back to one
 * whose are not, or to none. Returns the blocks shared (seq->n_tokens is that many blocks) and
 * the chain hash of the last in *hash (0 for none); KIRI_E_NOMEM when the tables cannot grow
 * (nothing shared). With recurrent state the prefix must also end in a block with a snapshot:
 * the sequence takes a state slot filled from it (nothing is shared when no slot is free or the
 * device fails the copy). */
int32_t kiri_kvcache_seq_share_prefix(struct kiri_kvcache *c, struct kiri_kv_seq *seq, const int32_t *tokens,
                                      int32_t n_blocks, uint64_t *hash);
/* Publishes block index i of seq (full, its keys and values final) under hash, in each pool
 * independently (the windowed block when it is live); a no-op for a pool where a block with that
 * hash is already cached, and for a cache with recurrent state but no snapshot slots. */
void kiri_kvcache_publish(struct kiri_kvcache *c, const struct kiri_kv_seq *seq, int32_t i, uint64_t hash,
                          const int32_t *tokens);
/* Cached (published) blocks of the global pool, and global blocks shared since init. */
int32_t kiri_kvcache_n_cached(const struct kiri_kvcache *c);
uint64_t kiri_kvcache_prefix_hits(const struct kiri_kvcache *c);

/* The slot of position pos (< blocks reserved * block_size) in the global pool, and in the
 * windowed pool (pos in a live block). */
int32_t kiri_kvcache_slot(const struct kiri_kvcache *c, const struct kiri_kv_seq *seq, int32_t pos);
int32_t kiri_kvcache_slot_window(const struct kiri_kvcache *c, const struct kiri_kv_seq *seq, int32_t pos);

#endif
