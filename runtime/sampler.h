/* Picking the next token from a row of logits: penalties over the recent history, then greedy
 * argmax or a seeded random draw after top-k, top-p, min-p and temperature, in llama.cpp's order.
 *
 * The pipeline, for parameters p (struct kiri_sampling, kiri.h) and logits l[0..n_vocab):
 *   1. NaN logits count as -infinity (never picked while any other token is possible).
 *   2. Penalties, over the last repeat_last_n accepted tokens, once per distinct token t with
 *      c occurrences there: l[t] = l[t] > 0 ? l[t] / repeat_penalty : l[t] * repeat_penalty, then
 *      l[t] -= c * frequency_penalty + presence_penalty (OpenAI's definition).
 *   3. temperature <= 0: the argmax; ties go to the lowest id. Nothing is drawn.
 *   4. Otherwise the candidates are cut, each filter on probabilities at temperature 1 over what
 *      is left of the list: top-k keeps the k largest logits (k <= 0 or >= n_vocab: off); top-p
 *      keeps the shortest prefix of the sorted list whose probability sum reaches top_p (1: off);
 *      min-p keeps tokens whose probability is at least min_p times the largest one (0: off).
 *      Every filter keeps at least one token. Sorted order is logit descending, then id ascending.
 *   5. The survivors' logits are divided by the temperature and softmaxed, and one is drawn with
 *      a uniform number from xoshiro256** seeded by splitmix64(seed): the same seed, parameters
 *      and inputs give the same tokens on every platform (the arithmetic is IEEE float/double;
 *      only a libm whose expf differs in the last bit could move a draw that lands on a boundary).
 *   If every logit is -infinity (or one is +infinity) step 5 has no distribution and the sampler
 *   falls back to step 3's argmax.
 *
 * Invariants of struct kiri_sampler: the parameters were valid at init (kiri_sampling_validate)
 * and never change; every scratch buffer is allocated at init, so sampling never allocates and
 * never fails; the history ring holds the last min(accepted, repeat_last_n) tokens and the count
 * table equals the number of occurrences of each id in the ring (both exist only when a penalty
 * is active). A sampler is used by one thread at a time.
 */
#ifndef KIRI_SAMPLER_H
#define KIRI_SAMPLER_H

#include <stdint.h>

struct kiri_sampling;
struct kiri_status_info;
struct kiri_sampler;

/* One entry of the final distribution (kiri_sampler_dist): the token, its logit after penalties,
 * and its probability after every filter and the temperature. */
struct kiri_sampler_candidate {
    int32_t id;
    float logit;
    float p;
};

/* Largest repeat_last_n that kiri_sampling_validate accepts (it bounds the history ring). */
#define KIRI_SAMPLER_MAX_LAST_N (1 << 20)

/* Checks every field of p; on the first bad one returns KIRI_E_INVALID_ARG with info->field set to
 * the parameter's name and a message saying the allowed range. Ranges: temperature finite and
 * >= 0; top_k any (<= 0 is off); top_p in (0, 1]; min_p in [0, 1]; repeat_penalty finite and > 0;
 * repeat_last_n in [0, KIRI_SAMPLER_MAX_LAST_N]; frequency_penalty and presence_penalty in
 * [-2, 2]; seed any. NaN is rejected everywhere. info may be NULL. */
int kiri_sampling_validate(const struct kiri_sampling *p, struct kiri_status_info *info);

/* Creates a sampler for rows of n_vocab logits with a copy of params. Returns KIRI_E_INVALID_ARG
 * for invalid params (see kiri_sampling_validate for why) or n_vocab <= 0, KIRI_E_NOMEM when
 * allocation fails. *out (owned by the caller, freed with kiri_sampler_free) is written only on
 * success. Memory is about 24 * n_vocab bytes, plus 4 * n_vocab when a penalty is active. */
int kiri_sampler_init(const struct kiri_sampling *params, int32_t n_vocab,
                      struct kiri_sampler **out);
void kiri_sampler_free(struct kiri_sampler *s);

/* Forgets the history and restarts the random sequence from the seed, so the sampler behaves as
 * if it had just been created. */
void kiri_sampler_reset(struct kiri_sampler *s);

/* Appends a token to the history the penalties look at (the caller decides whether prompt tokens
 * count, as llama.cpp's tools do, by accepting them or not). Ids outside [0, n_vocab) are ignored.
 * A no-op when no penalty is active. */
void kiri_sampler_accept(struct kiri_sampler *s, int32_t token);

/* Picks a token from logits (n_vocab floats, not modified) as the pipeline above describes. Does
 * not accept the token: call kiri_sampler_accept with it. Always returns an id in [0, n_vocab). */
int32_t kiri_sampler_sample(struct kiri_sampler *s, const float *logits);

/* The largest logit, ties to the lowest id, NaN never winning: greedy's pick, which drafters share. */
int32_t kiri_sampler_argmax(const float *logits, int32_t n);

/* Verifies a drafted token against the distribution p that kiri_sampler_sample would draw from
 * for these logits, by the rule of speculative sampling for a draft proposed with certainty: draft
 * is kept (*accepted = 1) with probability p(draft); otherwise (*accepted = 0) the token is drawn
 * from p with draft removed and renormalised. Either way the token returned is distributed as p.
 * Greedy: the argmax, kept when it equals draft. Does not accept the token into the history. */
int32_t kiri_sampler_verify(struct kiri_sampler *s, const float *logits, int32_t draft, int *accepted);

/* Runs steps 1-5 without drawing: sets *out to the surviving candidates with their final
 * probabilities (borrowed, valid until the next call on s) and returns their number (>= 1).
 * Greedy gives the argmax with p = 1. The list is sorted (logit descending, id ascending) when
 * top-k or top-p cut it, else in increasing id order. */
int32_t kiri_sampler_dist(struct kiri_sampler *s, const float *logits,
                          const struct kiri_sampler_candidate **out);

#endif
