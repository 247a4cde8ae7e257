/* kiri chat: a conversation with a model on the terminal, as `ollama run` and `llama-cli` offer:
 * the history is kept and re-rendered through the model's chat template every turn, answers
 * stream as they are generated, and a line says how fast each one came. Input can be piped
 * (then there is no prompt decoration).
 *
 * The turns run on a one-sequence serving loop (kiri_batcher) with its prefix cache on, so the
 * part of the conversation already computed is reused the next turn instead of recomputed.
 */
#ifndef KIRI_CLI_CHAT_H
#define KIRI_CLI_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "kiri.h"

struct kiri_chat_cli_params {
    const char *system;              /* the system message, or NULL; borrowed */
    struct kiri_sampling sampling;
    const char *const *stop;         /* stop strings (borrowed), n_stop of them */
    int n_stop;
    int32_t max_tokens;              /* per answer; < 0: until the turn ends or the context fills */
    const char *grammar;             /* GBNF every answer follows, or NULL; borrowed */
    size_t grammar_len;
    int32_t n_ctx;                   /* 0: the model's trained length */
    int32_t n_batch;                 /* prompt tokens per step; 0: 512 */
    int kv_type;                     /* as kiri_batcher_params.kv_type */
    int show_stats;                  /* print the speed line after each answer */
    int speculative;                 /* enum kiri_spec (0: off) */
    int32_t spec_max;                /* most drafted tokens at once (0: the default) */
    struct kiri_model *draft_model;  /* borrowed, or NULL: the model of KIRI_SPEC_DRAFT */
};

/* Runs the conversation on stdin and stdout until /exit or the end of input. Messages about the
 * session (notes, errors, the speed line) go to stderr. Returns the exit status: 0, or 1 after
 * printing why the session could not start or went on. */
int kiri_chat_cli_run(struct kiri_model *m, const char *model_name, const struct kiri_chat_cli_params *p);

#endif
