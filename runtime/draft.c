#include "draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"
#include "error.h"
#include "graph.h"
#include "kiri.h"
#include "kvcache.h"
#include "mem.h"
#include "model.h"
#include "sampler.h"

int32_t kiri_draft_ngram(const int32_t *tokens, int32_t n, int32_t *draft, int32_t max)
{
    if (!tokens || !draft || max < 1)
        return 0;
    const int32_t lo = n > KIRI_NGRAM_WINDOW ? n - KIRI_NGRAM_WINDOW : 0;
    for (int32_t len = KIRI_NGRAM_MAX; len >= KIRI_NGRAM_MIN; len--) {
        if (n - lo < len + 1)
            continue;
        const int32_t *suffix = tokens + n - len;
        /* An occurrence at i ends before the suffix starts over itself, so at least one token
         * follows it: i + len < n. */
        for (int32_t i = n - len - 1; i >= lo; i--) {
            if (tokens[i] != suffix[0] || memcmp(tokens + i, suffix, (size_t)len * sizeof *tokens) != 0)
                continue;
            int32_t k = n - (i + len);
            if (k > max)
                k = max;
            memcpy(draft, tokens + i + len, (size_t)k * sizeof *draft);
            return k;
        }
    }
    return 0;
}

static int32_t ngram_propose(struct kiri_drafter *d, uint64_t seq, const int32_t *tokens, int32_t n, int32_t *draft,
                             int32_t max)
{
    (void)d;
    (void)seq;
    return kiri_draft_ngram(tokens, n, draft, max);
}

static struct kiri_drafter ngram = {"ngram", ngram_propose, NULL, NULL, NULL};

struct kiri_drafter *kiri_drafter_ngram(void) { return &ngram; }

/* ---------------------------------------------------------------------------------------------
 * A draft model
 * ------------------------------------------------------------------------------------------- */

/* What the draft model holds for one sequence of the target: a held sequence of its loop, and a
 * copy of its tokens (to find how much of them the target kept). */
struct draft_slot {
    uint64_t seq;           /* the target's sequence; 0: a free slot */
    uint64_t held;          /* the held sequence's id in the draft loop */
    int32_t *tokens;        /* owned, capacity n_ctx + 1 */
    int32_t n;
};

struct model_drafter {
    struct kiri_drafter base;
    struct kiri_batcher *loop;      /* owned: the draft model's loop, driven from the caller */
    int32_t n_vocab, n_ctx;
    struct draft_slot *slots;       /* owned (n_slots) */
    int32_t n_slots;
    const float *logits;            /* the latest logits event's, valid until the next step */
    uint64_t ended;                 /* a held sequence whose final event came (an error) */
};

static int on_draft_event(void *user, const struct kiri_token_event *ev)
{
    struct model_drafter *d = user;
    if (ev->logits)
        d->logits = ev->logits;
    if (ev->finish >= 0)
        d->ended = 1;
    return 0;
}

/* Ends the slot's held sequence and frees the slot. */
static void slot_drop(struct model_drafter *d, struct draft_slot *sl)
{
    if (sl->held) {
        kiri_batcher_cancel(d->loop, sl->held);
        kiri_batcher_run(d->loop, NULL);
    }
    sl->seq = 0;
    sl->held = 0;
    sl->n = 0;
}

static struct draft_slot *slot_of(struct model_drafter *d, uint64_t seq, int take)
{
    struct draft_slot *free_slot = NULL;
    for (int32_t i = 0; i < d->n_slots; i++) {
        if (d->slots[i].seq == seq)
            return &d->slots[i];
        if (!d->slots[i].seq && !free_slot)
            free_slot = &d->slots[i];
    }
    if (take && free_slot)
        free_slot->seq = seq;
    return take ? free_slot : NULL;
}

/* Runs the draft loop over what was appended; the logits after the sequence's last token, or
 * NULL when it failed. */
static const float *draft_step(struct model_drafter *d)
{
    d->logits = NULL;
    d->ended = 0;
    kiri_batcher_run(d->loop, NULL);
    return d->ended ? NULL : d->logits;
}

static int32_t model_propose(struct kiri_drafter *base, uint64_t seq, const int32_t *tokens, int32_t n,
                             int32_t *draft, int32_t max)
{
    struct model_drafter *d = (struct model_drafter *)base;
    if (n < 1 || max < 1 || n >= d->n_ctx)
        return 0;
    if (max > d->n_ctx - n + 1)
        max = d->n_ctx - n + 1;
    struct draft_slot *sl = slot_of(d, seq, 1);
    if (!sl)
        return 0;
    /* The tokens the draft sequence already holds that the target kept; at least the last of the
     * target's is computed again, for its logits. */
    int32_t keep = 0;
    while (keep < sl->n && keep < n - 1 && sl->tokens[keep] == tokens[keep])
        keep++;
    int rc = KIRI_OK;
    if (sl->held && keep == 0)
        slot_drop(d, sl), sl->seq = seq;
    if (!sl->held) {
        struct kiri_request r;
        memset(&r, 0, sizeof r);
        r.tokens = tokens;
        r.n_tokens = n;
        rc = kiri_batcher_submit_held(d->loop, &r, on_draft_event, d, &sl->held, NULL);
    } else {
        rc = kiri_batcher_truncate(d->loop, sl->held, keep, NULL);
        if (rc == KIRI_OK)
            rc = kiri_batcher_append(d->loop, sl->held, tokens + keep, n - keep, NULL);
    }
    if (rc == KIRI_OK) {
        memcpy(sl->tokens, tokens, (size_t)n * sizeof *tokens);
        sl->n = n;
    }
    int32_t k = 0;
    while (rc == KIRI_OK && k < max) {
        const float *lg = draft_step(d);
        if (!lg) {
            rc = KIRI_E_BACKEND;
            break;
        }
        draft[k] = kiri_sampler_argmax(lg, d->n_vocab);
        if (++k == max)
            break;
        if ((rc = kiri_batcher_append(d->loop, sl->held, &draft[k - 1], 1, NULL)) == KIRI_OK)
            sl->tokens[sl->n++] = draft[k - 1];
    }
    if (rc < 0) { /* no guess; the next proposal starts the sequence afresh */
        slot_drop(d, sl);
        return 0;
    }
    return k;
}

static void model_release(struct kiri_drafter *base, uint64_t seq)
{
    struct model_drafter *d = (struct model_drafter *)base;
    struct draft_slot *sl = slot_of(d, seq, 0);
    if (sl)
        slot_drop(d, sl);
}

static void model_free(struct kiri_drafter *base)
{
    struct model_drafter *d = (struct model_drafter *)base;
    if (!d)
        return;
    kiri_batcher_free(d->loop);
    for (int32_t i = 0; d->slots && i < d->n_slots; i++)
        kiri_mem_free(d->slots[i].tokens);
    kiri_mem_free(d->slots);
    kiri_mem_free(d);
}

/* Same vocabulary: the same size, BOS and EOS, and every token's text. */
static int same_vocabulary(const struct kiri_model *a, const struct kiri_model *b, struct kiri_status_info *info)
{
    const int32_t n = kiri_model_n_vocab(a);
    if (n != kiri_model_n_vocab(b))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the draft model has %d tokens, the model %d",
                              kiri_model_n_vocab(b), n);
    if (kiri_model_bos(a) != kiri_model_bos(b) || kiri_model_eos(a) != kiri_model_eos(b))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the draft model's BOS or EOS token differs from the model's");
    char pa[512], pb[512];
    for (int32_t t = 0; t < n; t++) {
        const int la = kiri_token_to_piece(a, t, 1, pa, sizeof pa), lb = kiri_token_to_piece(b, t, 1, pb, sizeof pb);
        if (la != lb || (la > 0 && la <= (int)sizeof pa && memcmp(pa, pb, (size_t)la) != 0))
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "token %d differs between the model and the draft model",
                                  t);
    }
    return KIRI_OK;
}

int kiri_drafter_model_init(const struct kiri_model *target, struct kiri_model *draft, int32_t max_seqs,
                            int32_t n_ctx, int32_t chunk, struct kiri_drafter **out, struct kiri_status_info *info)
{
    int rc = same_vocabulary(target, draft, info);
    if (rc < 0)
        return rc;
    struct model_drafter *d = kiri_mem_calloc(1, sizeof *d);
    if (!d)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    d->base = (struct kiri_drafter){"draft", model_propose, model_release, model_free, NULL};
    d->n_vocab = kiri_model_n_vocab(draft);
    d->n_ctx = n_ctx;
    /* Its own loop: no prefix sharing (each sequence computes its own), no drafts of its own;
     * a draft model with recurrent layers keeps the state of each step, so that its sequences
     * can be cut back to what the target kept. */
    struct kiri_batcher_params bp;
    kiri_batcher_params_default(&bp);
    bp.n_ctx = n_ctx;
    bp.max_seqs = max_seqs;
    bp.chunk = chunk;
    bp.queue_cap = max_seqs;
    bp.prefix_cache = 0;
    bp.draft_rows = 0;
    if ((rc = kiri_batcher_init_held(draft, &bp, 1, &d->loop, info)) < 0) {
        model_free(&d->base);
        return rc;
    }
    d->n_ctx = kiri_batcher_n_ctx(d->loop);
    d->n_slots = max_seqs;
    if (!(d->slots = kiri_mem_calloc((size_t)max_seqs, sizeof *d->slots))) {
        model_free(&d->base);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    }
    for (int32_t i = 0; i < max_seqs; i++)
        if (!(d->slots[i].tokens = kiri_mem_array((size_t)d->n_ctx + 1, sizeof(int32_t)))) {
            model_free(&d->base);
            return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
        }
    *out = &d->base;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The model's multi-token-prediction head
 * ------------------------------------------------------------------------------------------- */

/* What the head keeps for one sequence: its block table, how far the head's keys go, and the
 * hidden state of the position before that (the next position's input). */
struct mtp_slot {
    uint64_t seq;                   /* 0: a free slot */
    const struct kiri_kv_seq *kv;   /* borrowed: the sequence's table */
    int32_t done;                   /* the head's keys and values hold positions [0, done) */
    float *h;                       /* owned (n_embd): the hidden state of position done - 1 */
};

struct mtp_drafter {
    struct kiri_drafter base;
    struct kiri_model *model;       /* borrowed */
    struct kiri_kvcache *kv;        /* borrowed */
    struct kiri_graph *graph;       /* borrowed */
    int32_t n_embd, n_vocab, max_tokens;
    struct mtp_slot *slots;         /* owned (n_slots) */
    int32_t n_slots;
    /* One run's inputs (max_tokens rows). */
    int32_t *tokens, *pos, *cells, *n_kv, *toff;
    float *h_in;                    /* (n_embd, max_tokens) */
    float *h_out;                   /* (n_embd) */
    FILE *trace;                    /* owned, or NULL: KIRI_MTP_TRACE's file */
};

static struct mtp_slot *mtp_slot_of(struct mtp_drafter *d, uint64_t seq, int take)
{
    struct mtp_slot *free_slot = NULL;
    for (int32_t i = 0; i < d->n_slots; i++) {
        if (d->slots[i].seq == seq)
            return &d->slots[i];
        if (!d->slots[i].seq && !free_slot)
            free_slot = &d->slots[i];
    }
    if (!take || !free_slot)
        return NULL;
    free_slot->seq = seq;
    free_slot->kv = NULL;
    free_slot->done = 0;
    return free_slot;
}

/* Runs the head over positions [p0, p0 + n) of sl's sequence, tokens[i] at p0 + i with row i of
 * d->h_in before it; the logits of the last row when want (NULL on failure or without). */
static int mtp_run(struct mtp_drafter *d, const struct mtp_slot *sl, const int32_t *tokens, int32_t p0, int32_t n,
                   int want, const float **logits)
{
    for (int32_t i = 0; i < n; i++) {
        d->tokens[i] = tokens[i];
        d->pos[i] = p0 + i;
        d->cells[i] = kiri_kvcache_slot(d->kv, sl->kv, p0 + i);
        d->n_kv[i] = p0 + i + 1;
        d->toff[i] = 0;
    }
    const int32_t last = n - 1;
    struct kiri_batch b = {n, d->tokens, d->pos, d->cells, d->n_kv, d->toff, sl->kv->blocks, sl->kv->n_blocks,
                           &last, want ? 1 : 0, NULL, NULL, NULL, NULL, NULL};
    return kiri_graph_run_mtp(d->graph, d->kv, &b, d->h_in, d->h_out, logits, NULL);
}

static void mtp_observe(struct kiri_drafter *base, uint64_t seq, const struct kiri_kv_seq *kv, const int32_t *tokens,
                        int32_t p0, int32_t n, const float *hidden)
{
    struct mtp_drafter *d = (struct mtp_drafter *)base;
    struct mtp_slot *sl = mtp_slot_of(d, seq, 1);
    if (!sl || n < 1 || p0 < 0)
        return;
    const size_t E = (size_t)d->n_embd;
    sl->kv = kv;
    /* A start past the head's keys (a shared prefix, a recomputation): the state before p0 is
     * not known, and the head starts from zeros, as at position 0; the keys below stay what the
     * cache holds (drafts may suffer, never the output). */
    if (p0 != sl->done)
        memset(sl->h, 0, E * sizeof(float));
    for (int32_t at = 0; at < n;) {
        const int32_t k = n - at < d->max_tokens ? n - at : d->max_tokens;
        memcpy(d->h_in, sl->h, E * sizeof(float));
        memcpy(d->h_in + E, hidden + (size_t)at * E, (size_t)(k - 1) * E * sizeof(float));
        if (mtp_run(d, sl, tokens + p0 + at, p0 + at, k, 0, NULL) != KIRI_OK) {
            sl->done = -1; /* no keys to trust: no drafts until the sequence starts afresh */
            return;
        }
        memcpy(sl->h, hidden + (size_t)(at + k - 1) * E, E * sizeof(float));
        at += k;
    }
    sl->done = p0 + n;
}

/* With KIRI_MTP_TRACE naming a file (a test's hook), each proposal goes there as a line of JSON:
 * the sequence up to the pending token, the drafts, and each draft's logit. */
static void mtp_trace(struct mtp_drafter *d, const int32_t *tokens, int32_t n, const int32_t *draft,
                      const float *logit, int32_t k)
{
    if (!d->trace)
        return;
    fputs("{\"tokens\": [", d->trace);
    for (int32_t i = 0; i < n; i++)
        fprintf(d->trace, "%s%d", i ? ", " : "", tokens[i]);
    fputs("], \"drafts\": [", d->trace);
    for (int32_t i = 0; i < k; i++)
        fprintf(d->trace, "%s%d", i ? ", " : "", draft[i]);
    fputs("], \"logits\": [", d->trace);
    for (int32_t i = 0; i < k; i++)
        fprintf(d->trace, "%s%.9g", i ? ", " : "", (double)logit[i]);
    fputs("]}\n", d->trace);
    fflush(d->trace);
}

static int32_t mtp_propose(struct kiri_drafter *base, uint64_t seq, const int32_t *tokens, int32_t n, int32_t *draft,
                           int32_t max)
{
    struct mtp_drafter *d = (struct mtp_drafter *)base;
    struct mtp_slot *sl = mtp_slot_of(d, seq, 0);
    /* The head has seen every position before the pending token's, n - 1. */
    if (!sl || !sl->kv || n < 2 || sl->done != n - 1 || max < 1)
        return 0;
    const size_t E = (size_t)d->n_embd;
    int32_t token = tokens[n - 1];
    float logit[KIRI_SPEC_MAX_DRAFT];
    if (max > KIRI_SPEC_MAX_DRAFT)
        max = KIRI_SPEC_MAX_DRAFT;
    memcpy(d->h_in, sl->h, E * sizeof(float));
    for (int32_t k = 0; k < max; k++) {
        const float *lg = NULL;
        if (mtp_run(d, sl, &token, n - 1 + k, 1, 1, &lg) != KIRI_OK || !lg)
            return k;
        token = draft[k] = kiri_sampler_argmax(lg, d->n_vocab);
        logit[k] = lg[token];
        memcpy(d->h_in, d->h_out, E * sizeof(float));
    }
    mtp_trace(d, tokens, n, draft, logit, max);
    return max;
}

static void mtp_release(struct kiri_drafter *base, uint64_t seq)
{
    struct mtp_slot *sl = mtp_slot_of((struct mtp_drafter *)base, seq, 0);
    if (sl) {
        sl->seq = 0;
        sl->kv = NULL;
    }
}

static void mtp_free(struct kiri_drafter *base)
{
    struct mtp_drafter *d = (struct mtp_drafter *)base;
    if (!d)
        return;
    for (int32_t i = 0; d->slots && i < d->n_slots; i++)
        kiri_mem_free(d->slots[i].h);
    kiri_mem_free(d->slots);
    kiri_mem_free(d->tokens);
    kiri_mem_free(d->pos);
    kiri_mem_free(d->cells);
    kiri_mem_free(d->n_kv);
    kiri_mem_free(d->toff);
    kiri_mem_free(d->h_in);
    kiri_mem_free(d->h_out);
    if (d->trace)
        fclose(d->trace);
    kiri_mem_free(d);
}

int kiri_drafter_mtp_init(struct kiri_model *m, struct kiri_kvcache *kv, struct kiri_graph *graph, int32_t max_seqs,
                          int32_t max_tokens, struct kiri_drafter **out, struct kiri_status_info *info)
{
    if (!kiri_model_has_mtp(m))
        return kiri_error_set(info, KIRI_E_INVALID_ARG,
                              "the model has no multi-token-prediction head (nextn_predict_layers) to draft with");
    if (max_seqs < 1 || max_tokens < 1)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the MTP drafter needs at least one sequence and token");
    struct mtp_drafter *d = kiri_mem_calloc(1, sizeof *d);
    if (!d)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    d->base = (struct kiri_drafter){"mtp", mtp_propose, mtp_release, mtp_free, mtp_observe};
    d->model = m;
    d->kv = kv;
    d->graph = graph;
    d->n_embd = m->hp.n_embd;
    d->n_vocab = m->hp.n_vocab;
    d->max_tokens = max_tokens;
    d->n_slots = max_seqs;
    const char *trace = getenv("KIRI_MTP_TRACE");
    d->trace = trace && trace[0] ? fopen(trace, "a") : NULL;
    const size_t E = (size_t)d->n_embd, T = (size_t)max_tokens;
    int ok = (d->slots = kiri_mem_calloc((size_t)max_seqs, sizeof *d->slots)) != NULL;
    for (int32_t i = 0; ok && i < max_seqs; i++)
        ok = (d->slots[i].h = kiri_mem_array(E, sizeof(float))) != NULL;
    ok = ok && (d->tokens = kiri_mem_array(T, sizeof(int32_t))) && (d->pos = kiri_mem_array(T, sizeof(int32_t))) &&
         (d->cells = kiri_mem_array(T, sizeof(int32_t))) && (d->n_kv = kiri_mem_array(T, sizeof(int32_t))) &&
         (d->toff = kiri_mem_array(T, sizeof(int32_t))) && (d->h_in = kiri_mem_array(E * T, sizeof(float))) &&
         (d->h_out = kiri_mem_array(E, sizeof(float)));
    if (!ok) {
        mtp_free(&d->base);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    }
    *out = &d->base;
    return KIRI_OK;
}

const char *kiri_spec_name(int kind)
{
    switch (kind) {
    case KIRI_SPEC_NONE:
        return "none";
    case KIRI_SPEC_NGRAM:
        return "ngram";
    case KIRI_SPEC_DRAFT:
        return "draft";
    case KIRI_SPEC_MTP:
        return "mtp";
    default:
        return NULL;
    }
}

int kiri_spec_parse(const char *name)
{
    for (int k = 0; name && k < KIRI_SPEC_KINDS; k++)
        if (strcmp(name, kiri_spec_name(k)) == 0)
            return k;
    return -1;
}
