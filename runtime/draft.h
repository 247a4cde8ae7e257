/* Drafters for speculative decoding (include/kiri.h, enum kiri_spec): each proposes the tokens a
 * sequence is likely to continue with, which the batcher then verifies in one step. A drafter only
 * guesses: a wrong guess costs a little compute, never a changed output.
 *
 * The interface is one small table of functions so that drafters with state of their own (a draft
 * model with its own cache) fit beside the stateless prompt lookup. */
#ifndef KIRI_DRAFT_H
#define KIRI_DRAFT_H

#include <stdint.h>

struct kiri_drafter {
    const char *name;   /* as kiri_spec_name spells it */
    /* Writes at most max (>= 1) tokens likely to follow tokens[0..n) into draft and returns how
     * many (0: no guess). tokens is the whole sequence, prompt and generated. Never fails. */
    int32_t (*propose)(const struct kiri_drafter *d, const int32_t *tokens, int32_t n, int32_t *draft,
                       int32_t max);
};

/* The drafter of an enum kiri_spec kind other than KIRI_SPEC_NONE (borrowed, static), or NULL. */
const struct kiri_drafter *kiri_drafter_get(int kind);

/* Prompt lookup: the longest suffix of tokens[0..n), of KIRI_NGRAM_MAX down to KIRI_NGRAM_MIN
 * tokens, that also occurs earlier (the latest such occurrence, searched over at most the last
 * KIRI_NGRAM_WINDOW positions); the draft is what followed it there. */
#define KIRI_NGRAM_MAX 4
#define KIRI_NGRAM_MIN 2
#define KIRI_NGRAM_WINDOW 16384
int32_t kiri_draft_ngram(const int32_t *tokens, int32_t n, int32_t *draft, int32_t max);

#endif
