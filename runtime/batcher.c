/* The continuous-batching loop (include/kiri.h, runtime/batcher.h). Every generated token goes
 * through here, whoever asked for it: the server's requests, and the library's contexts, which
 * drive a one-sequence batcher from their own thread. */
#include "batcher.h"

#include <math.h>
#include <string.h>

#include "error.h"
#include "graph.h"
#include "kvcache.h"
#include "mem.h"
#include "model.h"
#include "platform.h"
#include "sampler.h"
#include "textstream.h"
#include "tokenizer.h"

/* Tokens per KV block: the unit of paging and of prefix sharing. */
#define BLOCK_SIZE 16

/* One request from submit to its final event. tokens holds the prompt and then every generated
 * token; the first kv.n_tokens of them have keys and values in the cache, the rest are pending
 * (a whole prompt at first, one sampled token while decoding). */
struct seq {
    uint64_t id;
    uint64_t order;                 /* arrival, for FIFO within a priority */
    int priority;
    struct kiri_request req;        /* tokens and stop pointers unused after submit */
    int held;                       /* computed, never sampled: kiri_batcher_submit_held */
    int32_t *tokens;                /* owned, capacity n_ctx + 1 (the last sampled one is never computed) */
    int32_t n_tokens;
    int32_t n_prompt;
    int32_t n_generated;
    int32_t n_cached;
    struct kiri_kv_seq kv;          /* owned block table while running */
    int32_t n_published;            /* leading blocks published to the prefix cache */
    uint64_t chain_hash;            /* hash of block n_published - 1 */
    struct kiri_sampler *sampler;   /* owned while running */
    struct kiri_text_stream text;   /* owned: tokens to text, stop strings */
    int status;                     /* what failed, for a KIRI_FINISH_ERROR */
    kiri_batcher_fn fn;
    void *user;
    _Atomic int cancel;
    double t_submit, t_start, t_first;
    struct seq *next;               /* waiting list link */
};

struct kiri_batcher {
    struct kiri_model *model;       /* borrowed */
    struct kiri_batcher_params p;
    int32_t blocks_per_seq;
    struct kiri_kvcache *kv;        /* owned */
    struct kiri_graph *graph;       /* owned */
    struct seq **running;           /* owned array of max_seqs (entries owned) */
    int32_t n_running;
    struct seq *waiting;            /* owned list, best first */
    int32_t n_waiting;
    uint64_t next_id, next_order;
    /* Step scratch, sized at init. */
    int32_t *b_tokens, *b_pos, *b_slots, *b_nkv, *b_toff, *b_tables, *b_rows;
    struct seq **b_out_seq;
    /* Threading. */
    struct kiri_mutex *lock;        /* owned: guards waiting, running membership, stats, flags */
    struct kiri_cond *wake;         /* owned */
    struct kiri_cond *idle;         /* owned: signalled when nothing runs or waits */
    struct kiri_thread *thread;     /* owned */
    int accepting;
    int is_idle;                    /* the loop is waiting for work, its stats current */
    int stop;
    int drain;
    struct kiri_batcher_stats stats;
};

void kiri_batcher_params_default(struct kiri_batcher_params *p)
{
    memset(p, 0, sizeof *p);
    p->max_seqs = 8;
    p->chunk = 256;
    p->queue_cap = 64;
    p->kv_type = KIRI_TYPE_F16;
    p->prefix_cache = 1;
}

/* ---------------------------------------------------------------------------------------------
 * Set-up
 * ------------------------------------------------------------------------------------------- */

static void batcher_main(void *arg);

int kiri_batcher_init(struct kiri_model *m, const struct kiri_batcher_params *params, struct kiri_batcher **out,
                      struct kiri_status_info *info)
{
    kiri_error_clear(info);
    struct kiri_batcher_params p;
    if (params)
        p = *params;
    else
        kiri_batcher_params_default(&p);
    if (m->vocab_only)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the model has no weights");
    if (p.n_ctx <= 0 || p.n_ctx > m->hp.n_ctx_train)
        p.n_ctx = p.n_ctx <= 0 ? m->hp.n_ctx_train : p.n_ctx;
    if (p.max_seqs < 1 || p.max_seqs > 1024 || p.chunk < 1 || p.chunk > 8192 || p.queue_cap < 0 ||
        p.queue_cap > 1 << 20 || p.n_ctx > (1 << 24))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "batcher limits out of range");
    if (p.kv_type != KIRI_TYPE_F16 && p.kv_type != KIRI_TYPE_F32 && p.kv_type != KIRI_TYPE_Q8_0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "kv type must be F16, F32 or Q8_0");
    if (p.kv_type == KIRI_TYPE_Q8_0 && m->hp.head_dim % KIRI_QK8_0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "a Q8_0 cache needs a head size that is a multiple of 32");
    const size_t per_token = kiri_model_kv_bytes_per_token(m, p.kv_type);
    const int32_t blocks_per_seq = (p.n_ctx + BLOCK_SIZE - 1) / BLOCK_SIZE;
    int64_t n_blocks;
    if (p.kv_memory)
        n_blocks = (int64_t)(p.kv_memory / (per_token * BLOCK_SIZE));
    else
        n_blocks = (int64_t)blocks_per_seq * p.max_seqs;
    if (n_blocks < blocks_per_seq)
        return kiri_error_set(info, KIRI_E_INVALID_ARG,
                              "a KV budget of %zu bytes holds %lld tokens, less than one %d-token context",
                              p.kv_memory, (long long)n_blocks * BLOCK_SIZE, p.n_ctx);
    if (n_blocks > INT32_MAX / BLOCK_SIZE)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "KV budget too large");

    struct kiri_batcher *b = kiri_mem_calloc(1, sizeof *b);
    if (!b)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    b->model = m;
    b->p = p;
    b->blocks_per_seq = blocks_per_seq;
    b->next_id = 1;
    b->accepting = 1;
    const int32_t max_tok = p.chunk + p.max_seqs;
    const size_t tables = (size_t)p.max_seqs * (size_t)blocks_per_seq;
    int rc = kiri_model_kvcache_init(m, p.kv_type, BLOCK_SIZE, (int32_t)n_blocks, &b->kv);
    if (rc == 0)
        rc = kiri_graph_init(m, max_tok, p.max_seqs, (int32_t)tables, &b->graph);
    if (rc == 0) {
        b->running = kiri_mem_calloc((size_t)p.max_seqs, sizeof *b->running);
        b->b_tokens = kiri_mem_array((size_t)max_tok, sizeof(int32_t));
        b->b_pos = kiri_mem_array((size_t)max_tok, sizeof(int32_t));
        b->b_slots = kiri_mem_array((size_t)max_tok, sizeof(int32_t));
        b->b_nkv = kiri_mem_array((size_t)max_tok, sizeof(int32_t));
        b->b_toff = kiri_mem_array((size_t)max_tok, sizeof(int32_t));
        b->b_tables = kiri_mem_array(tables, sizeof(int32_t));
        b->b_rows = kiri_mem_array((size_t)p.max_seqs, sizeof(int32_t));
        b->b_out_seq = kiri_mem_calloc((size_t)p.max_seqs, sizeof *b->b_out_seq);
        if (!b->running || !b->b_tokens || !b->b_pos || !b->b_slots || !b->b_nkv || !b->b_toff || !b->b_tables ||
            !b->b_rows || !b->b_out_seq)
            rc = KIRI_E_NOMEM;
    }
    if (rc == 0)
        rc = kiri_platform_mutex_init(&b->lock);
    if (rc == 0)
        rc = kiri_platform_cond_init(&b->wake);
    if (rc == 0)
        rc = kiri_platform_cond_init(&b->idle);
    if (rc < 0) {
        kiri_batcher_free(b);
        return kiri_error_set(info, rc, "cannot allocate the batcher (%lld KV blocks)", (long long)n_blocks);
    }
    b->stats.kv_blocks_total = (int32_t)n_blocks;
    b->stats.kv_block_size = BLOCK_SIZE;
    *out = b;
    return KIRI_OK;
}

int32_t kiri_batcher_n_ctx(const struct kiri_batcher *b) { return b->p.n_ctx; }

static void seq_free(struct kiri_batcher *b, struct seq *s)
{
    if (!s)
        return;
    kiri_kvcache_seq_free(b->kv, &s->kv);
    kiri_sampler_free(s->sampler);
    kiri_text_stream_free(&s->text);
    kiri_mem_free(s->tokens);
    kiri_mem_free(s);
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------------------------- */

/* Inserts into the waiting list: higher priority first, then arrival order. Lock held. */
static void enqueue(struct kiri_batcher *b, struct seq *s)
{
    struct seq **p = &b->waiting;
    while (*p && ((*p)->priority > s->priority || ((*p)->priority == s->priority && (*p)->order < s->order)))
        p = &(*p)->next;
    s->next = *p;
    *p = s;
    b->n_waiting++;
}

static int submit(struct kiri_batcher *b, const struct kiri_request *r, int held, kiri_batcher_fn fn, void *user,
                  uint64_t *id, struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!r || !fn || !id || !r->tokens || r->n_tokens < 1)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "a request needs a prompt of at least one token");
    if (r->n_stop < 0 || (r->n_stop && !r->stop))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the stop strings are missing");
    if (held ? r->n_tokens > b->p.n_ctx : r->n_tokens >= b->p.n_ctx)
        return kiri_error_set(info, KIRI_E_INVALID_ARG,
                              "the prompt has %d tokens; the context holds %d, leaving no room to generate",
                              r->n_tokens, b->p.n_ctx);
    for (int32_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= b->model->hp.n_vocab)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "token id %d is outside the vocabulary", r->tokens[i]);
    if (r->top_logprobs < 0 || r->top_logprobs > KIRI_MAX_TOP_LOGPROBS)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "top_logprobs must be 0..%d", KIRI_MAX_TOP_LOGPROBS);
    int rc = held ? KIRI_OK : kiri_sampling_validate(&r->sampling, info);
    if (rc < 0)
        return rc;
    struct seq *s = kiri_mem_calloc(1, sizeof *s);
    if (!s || !(s->tokens = kiri_mem_array((size_t)b->p.n_ctx + 1, sizeof *s->tokens)) ||
        kiri_text_stream_init(&s->text, b->model->tokenizer, r->stop, r->n_stop) != KIRI_OK) {
        if (s) {
            kiri_text_stream_free(&s->text);
            kiri_mem_free(s->tokens);
        }
        kiri_mem_free(s);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    }
    memcpy(s->tokens, r->tokens, (size_t)r->n_tokens * sizeof *s->tokens);
    s->req = *r;
    s->req.tokens = NULL;
    s->req.stop = NULL;
    s->held = held;
    s->n_tokens = s->n_prompt = r->n_tokens;
    s->priority = r->priority;
    s->fn = fn;
    s->user = user;
    s->t_submit = kiri_platform_now();

    kiri_platform_mutex_lock(b->lock);
    if (!b->accepting || b->n_waiting >= b->p.queue_cap) {
        const int stopping = !b->accepting;
        kiri_platform_mutex_unlock(b->lock);
        seq_free(b, s);
        return kiri_error_set(info, KIRI_E_BUSY, stopping ? "the server is shutting down" : "the request queue is full");
    }
    s->id = b->next_id++;
    b->is_idle = 0;
    s->order = b->next_order++;
    enqueue(b, s);
    *id = s->id;
    kiri_platform_cond_signal(b->wake);
    kiri_platform_mutex_unlock(b->lock);
    return KIRI_OK;
}

int kiri_batcher_submit(struct kiri_batcher *b, const struct kiri_request *r, kiri_batcher_fn fn, void *user,
                        uint64_t *id, struct kiri_status_info *info)
{
    return submit(b, r, 0, fn, user, id, info);
}

int kiri_batcher_submit_held(struct kiri_batcher *b, const struct kiri_request *r, kiri_batcher_fn fn,
                             void *user, uint64_t *id, struct kiri_status_info *info)
{
    return submit(b, r, 1, fn, user, id, info);
}

/* The request with this id, running or waiting, or NULL. Lock held. */
static struct seq *find(struct kiri_batcher *b, uint64_t id)
{
    for (int32_t i = 0; i < b->n_running; i++)
        if (b->running[i]->id == id)
            return b->running[i];
    for (struct seq *s = b->waiting; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

int kiri_batcher_append(struct kiri_batcher *b, uint64_t id, const int32_t *tokens, int32_t n,
                        struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!tokens || n < 1)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "nothing to append");
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= b->model->hp.n_vocab)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "token id %d is outside the vocabulary", tokens[i]);
    kiri_platform_mutex_lock(b->lock);
    struct seq *s = find(b, id);
    int rc = KIRI_OK;
    if (!s || !s->held)
        rc = kiri_error_set(info, KIRI_E_INVALID_ARG, "no held sequence %llu", (unsigned long long)id);
    else if ((int64_t)s->n_tokens + n > b->p.n_ctx)
        rc = kiri_error_set(info, KIRI_E_CONTEXT_FULL, "%d tokens do not fit: %d of %d context positions used", n,
                            s->n_tokens, b->p.n_ctx);
    if (rc == KIRI_OK) {
        memcpy(s->tokens + s->n_tokens, tokens, (size_t)n * sizeof *tokens);
        s->n_tokens += n;
    }
    kiri_platform_mutex_unlock(b->lock);
    return rc;
}

void kiri_batcher_cancel(struct kiri_batcher *b, uint64_t id)
{
    kiri_platform_mutex_lock(b->lock);
    for (int32_t i = 0; i < b->n_running; i++)
        if (b->running[i]->id == id)
            atomic_store(&b->running[i]->cancel, 1);
    for (struct seq *s = b->waiting; s; s = s->next)
        if (s->id == id)
            atomic_store(&s->cancel, 1);
    kiri_platform_cond_signal(b->wake);
    kiri_platform_mutex_unlock(b->lock);
}

void kiri_batcher_get_stats(struct kiri_batcher *b, struct kiri_batcher_stats *s)
{
    kiri_platform_mutex_lock(b->lock);
    *s = b->stats;
    s->running = b->n_running;
    s->waiting = b->n_waiting;
    kiri_platform_mutex_unlock(b->lock);
}

/* ---------------------------------------------------------------------------------------------
 * The loop
 * ------------------------------------------------------------------------------------------- */

/* Delivers the final event and frees the sequence (already out of the running array). */
static void finish(struct kiri_batcher *b, struct seq *s, int reason, const struct kiri_token_event *last)
{
    struct kiri_token_event ev;
    if (last) {
        ev = *last;
    } else {
        memset(&ev, 0, sizeof ev);
        ev.token = -1;
        ev.n_prompt = s->n_prompt;
        ev.n_cached = s->n_cached;
        ev.n_generated = s->n_generated;
        ev.queue_seconds = s->t_start > 0 ? s->t_start - s->t_submit : kiri_platform_now() - s->t_submit;
        ev.first_token_seconds = s->t_first > 0 ? s->t_first - s->t_submit : 0;
        /* What was held back for a stop string is the request's, except after a failure. */
        kiri_text_stream_begin(&s->text);
        if (reason != KIRI_FINISH_ERROR)
            kiri_text_stream_finish(&s->text);
        ev.text = s->text.out.data ? s->text.out.data : "";
        ev.text_len = s->text.out.len;
    }
    ev.finish = reason;
    ev.status = reason == KIRI_FINISH_ERROR ? (s->status < 0 ? s->status : KIRI_E_BACKEND) : KIRI_OK;
    s->fn(s->user, &ev);
    seq_free(b, s);
}

static void remove_running(struct kiri_batcher *b, int32_t i)
{
    kiri_platform_mutex_lock(b->lock);
    b->running[i] = b->running[--b->n_running];
    b->running[b->n_running] = NULL;
    kiri_platform_mutex_unlock(b->lock);
}

/* Shares the cached blocks of s's longest cached prefix (never its last token, which must be
 * computed for logits). */
static void share_prefix(struct kiri_batcher *b, struct seq *s)
{
    const int32_t full = b->p.prefix_cache ? (s->n_tokens - 1) / BLOCK_SIZE : 0;
    uint64_t h = 0;
    for (int32_t i = 0; i < full; i++) {
        const int32_t *t = s->tokens + (size_t)i * BLOCK_SIZE;
        const uint64_t hi = kiri_kvcache_block_hash(h, t, BLOCK_SIZE);
        if (kiri_kvcache_seq_share_prefix(b->kv, &s->kv, hi, t) != KIRI_OK)
            break;
        h = hi;
        s->n_published = i + 1;
        s->chain_hash = hi;
    }
    s->n_cached = s->kv.n_tokens;
}

/* Moves waiting requests into free running slots while the pool can hold their prompts. Cancelled
 * waiting requests are finished here. */
static void admit(struct kiri_batcher *b)
{
    struct seq *cancelled = NULL;
    kiri_platform_mutex_lock(b->lock);
    for (struct seq **p = &b->waiting; *p;) {
        if (atomic_load(&(*p)->cancel)) {
            struct seq *s = *p;
            *p = s->next;
            b->n_waiting--;
            s->next = cancelled;
            cancelled = s;
        } else {
            p = &(*p)->next;
        }
    }
    while (b->waiting && b->n_running < b->p.max_seqs) {
        struct seq *s = b->waiting;
        const int32_t need = (s->n_tokens + BLOCK_SIZE) / BLOCK_SIZE;
        /* Head of line waits for memory rather than letting smaller requests starve it; an
         * empty batch always admits (the pool holds at least one full context). */
        if (b->n_running > 0 && kiri_kvcache_n_available(b->kv) < need)
            break;
        b->waiting = s->next;
        b->n_waiting--;
        s->next = NULL;
        if (!s->held) {
            if (kiri_sampler_init(&s->req.sampling, b->model->hp.n_vocab, &s->sampler) != KIRI_OK) {
                s->status = KIRI_E_NOMEM;
                s->next = cancelled; /* out of memory: end it rather than stall the queue */
                cancelled = s;
                continue;
            }
            for (int32_t i = 0; i < s->n_tokens; i++)
                kiri_sampler_accept(s->sampler, s->tokens[i]);
        }
        if (s->t_start == 0) {
            s->t_start = kiri_platform_now();
            b->stats.prompt_tokens += (uint64_t)s->n_prompt;
        }
        share_prefix(b, s);
        b->running[b->n_running++] = s;
    }
    kiri_platform_mutex_unlock(b->lock);
    while (cancelled) {
        struct seq *s = cancelled;
        cancelled = s->next;
        finish(b, s, s->sampler || s->held || atomic_load(&s->cancel) ? KIRI_FINISH_CANCELLED : KIRI_FINISH_ERROR,
               NULL);
    }
}

/* Frees the blocks of the lowest-priority, latest-arrived running sequence and puts it back in
 * the queue to be recomputed later. Returns 0 when only `keep` is left. */
static int preempt(struct kiri_batcher *b, const struct seq *keep)
{
    int32_t victim = -1;
    for (int32_t i = 0; i < b->n_running; i++) {
        const struct seq *s = b->running[i];
        if (s == keep)
            continue;
        if (victim < 0 || s->priority < b->running[victim]->priority ||
            (s->priority == b->running[victim]->priority && s->order > b->running[victim]->order))
            victim = i;
    }
    if (victim < 0)
        return 0;
    struct seq *s = b->running[victim];
    remove_running(b, victim);
    kiri_kvcache_seq_clear(b->kv, &s->kv);
    kiri_sampler_free(s->sampler);
    s->sampler = NULL;
    s->n_published = 0;
    s->chain_hash = 0;
    kiri_platform_mutex_lock(b->lock);
    enqueue(b, s);
    b->stats.preemptions++;
    kiri_platform_mutex_unlock(b->lock);
    return 1;
}

/* Log-probabilities of the chosen token and the top alternatives, from raw logits. */
static void logprobs(struct kiri_batcher *b, const struct seq *s, const float *logits, struct kiri_token_event *ev)
{
    const int32_t V = b->model->hp.n_vocab;
    float mx = -INFINITY;
    for (int32_t v = 0; v < V; v++)
        if (logits[v] > mx)
            mx = logits[v];
    double sum = 0;
    for (int32_t v = 0; v < V; v++)
        sum += exp((double)logits[v] - mx);
    const float lse = mx + (float)log(sum);
    ev->logprob = logits[ev->token] - lse;
    const int k = s->req.top_logprobs;
    ev->n_top = 0;
    for (int32_t v = 0; v < V && k > 0; v++) {
        const float lp = logits[v] - lse;
        int pos = ev->n_top < k ? ev->n_top++ : k;
        if (pos == k && lp <= ev->top_logprobs[k - 1])
            continue;
        if (pos == k)
            pos = k - 1;
        while (pos > 0 && ev->top_logprobs[pos - 1] < lp) {
            ev->top_logprobs[pos] = ev->top_logprobs[pos - 1];
            ev->top_ids[pos] = ev->top_ids[pos - 1];
            pos--;
        }
        ev->top_logprobs[pos] = lp;
        ev->top_ids[pos] = v;
    }
}

/* Publishes every newly completed block of s to the prefix cache. */
static void publish(struct kiri_batcher *b, struct seq *s)
{
    const int32_t full = b->p.prefix_cache ? s->kv.n_tokens / BLOCK_SIZE : 0;
    while (s->n_published < full) {
        const int32_t i = s->n_published;
        const int32_t *t = s->tokens + (size_t)i * BLOCK_SIZE;
        s->chain_hash = kiri_kvcache_block_hash(s->chain_hash, t, BLOCK_SIZE);
        kiri_kvcache_publish(b->kv, &s->kv, i, s->chain_hash, t);
        s->n_published++;
    }
}

/* Chooses this step's work: one token for every decoding sequence, then prompt chunks within the
 * chunk budget, reserving their KV blocks. When the pool runs dry a sequence is preempted and the
 * plan starts over (each restart removes one sequence, so this ends). */
static int32_t plan(struct kiri_batcher *b, struct seq **planned, int32_t *take)
{
    for (;;) {
        int32_t n = 0, budget = b->p.chunk;
        int restart = 0;
        for (int pass = 0; pass < 2 && !restart; pass++) {
            for (int32_t i = 0; i < b->n_running; i++) {
                struct seq *s = b->running[i];
                const int32_t pending = s->n_tokens - s->kv.n_tokens;
                if ((pass == 0) != (pending == 1))
                    continue;
                const int32_t k = pass == 0 ? 1 : (pending < budget ? pending : budget);
                if (k <= 0)
                    continue;
                const int rc = kiri_kvcache_seq_reserve(b->kv, &s->kv, s->kv.n_tokens + k);
                if (rc == KIRI_E_CONTEXT_FULL && preempt(b, s)) {
                    restart = 1;
                    break;
                }
                if (rc == KIRI_E_NOMEM)
                    s->status = rc; /* its block table cannot grow: it ends (end_failed) */
                if (rc != KIRI_OK)
                    continue; /* cannot fit even alone: waits for blocks to come back */
                if (pass == 1)
                    budget -= k;
                planned[n] = s;
                take[n++] = k;
            }
        }
        if (!restart)
            return n;
    }
}

/* Takes s out of the running array (it is there). */
static void remove_seq(struct kiri_batcher *b, const struct seq *s)
{
    for (int32_t i = 0; i < b->n_running; i++)
        if (b->running[i] == s) {
            remove_running(b, i);
            return;
        }
}

/* A held sequence's tokens are computed: its one event carries the logits of the last. */
static void deliver_logits(struct seq *s, const float *logits)
{
    struct kiri_token_event ev;
    memset(&ev, 0, sizeof ev);
    ev.token = -1;
    ev.finish = -1;
    ev.text = "";
    ev.logits = logits;
    ev.n_prompt = s->n_tokens;
    s->fn(s->user, &ev);
}

/* Samples s's next token from its logits and fills the event with it and its text. Returns the
 * finish reason it causes, or -1 while generation goes on. The sampled token is the sequence's
 * last; it is computed in the next step, so a sequence ends when that token would not fit. */
static int sample(struct kiri_batcher *b, struct seq *s, const float *logits, double now,
                  struct kiri_token_event *ev)
{
    memset(ev, 0, sizeof *ev);
    ev->token = kiri_sampler_sample(s->sampler, logits);
    ev->finish = -1;
    if (s->req.logprobs || s->req.top_logprobs)
        logprobs(b, s, logits, ev);
    kiri_sampler_accept(s->sampler, ev->token);
    s->tokens[s->n_tokens++] = ev->token;
    s->n_generated++;
    if (s->t_first == 0)
        s->t_first = now;
    ev->n_prompt = s->n_prompt;
    ev->n_cached = s->n_cached;
    ev->n_generated = s->n_generated;
    ev->queue_seconds = s->t_start - s->t_submit;
    ev->first_token_seconds = s->t_first - s->t_submit;
    int reason = -1, text_rc = 0;
    kiri_text_stream_begin(&s->text);
    if (kiri_tokenizer_is_eog(b->model->tokenizer, ev->token))
        reason = KIRI_FINISH_EOS;
    else if ((text_rc = kiri_text_stream_push(&s->text, ev->token)) == 1)
        reason = KIRI_FINISH_STOP;
    else if (text_rc < 0)
        reason = KIRI_FINISH_ERROR, s->status = text_rc;
    else if (s->req.max_tokens >= 0 && s->n_generated >= s->req.max_tokens)
        reason = KIRI_FINISH_LENGTH;
    else if (s->n_tokens > b->p.n_ctx)
        reason = KIRI_FINISH_CONTEXT;
    if (reason >= 0 && reason != KIRI_FINISH_STOP && reason != KIRI_FINISH_ERROR)
        kiri_text_stream_finish(&s->text);
    ev->text = s->text.out.data ? s->text.out.data : "";
    ev->text_len = s->text.out.len;
    return reason;
}

/* Ends the running sequences that were cancelled or failed outside a step (out of memory while
 * planning). Returns the number ended. */
static int end_sequences(struct kiri_batcher *b)
{
    int n = 0;
    for (int32_t i = 0; i < b->n_running;) {
        struct seq *s = b->running[i];
        if (atomic_load(&s->cancel) || s->status < 0) {
            remove_running(b, i);
            finish(b, s, s->status < 0 ? KIRI_FINISH_ERROR : KIRI_FINISH_CANCELLED, NULL);
            n++;
        } else {
            i++;
        }
    }
    return n;
}

/* One forward step over every running sequence. Returns 1 if it did work. */
static int step(struct kiri_batcher *b)
{
    /* Cancelled sequences end first, freeing their blocks for the others. */
    end_sequences(b);
    if (b->n_running == 0)
        return 0;

    struct seq *planned[1024];
    int32_t take[1024];
    const int32_t n_planned = plan(b, planned, take);
    if (n_planned == 0)
        return end_sequences(b);
    int32_t n_tok = 0, n_out = 0, n_tab = 0;
    for (int32_t j = 0; j < n_planned; j++) {
        struct seq *s = planned[j];
        const int32_t toff = n_tab;
        memcpy(b->b_tables + n_tab, s->kv.blocks, (size_t)s->kv.n_blocks * sizeof(int32_t));
        n_tab += s->kv.n_blocks;
        for (int32_t i = 0; i < take[j]; i++) {
            const int32_t p = s->kv.n_tokens + i;
            b->b_tokens[n_tok] = s->tokens[p];
            b->b_pos[n_tok] = p;
            b->b_slots[n_tok] = kiri_kvcache_slot(b->kv, &s->kv, p);
            b->b_nkv[n_tok] = p + 1;
            b->b_toff[n_tok] = toff;
            n_tok++;
        }
        if (s->kv.n_tokens + take[j] == s->n_tokens) {
            b->b_rows[n_out] = n_tok - 1;
            b->b_out_seq[n_out++] = s;
        }
    }
    const float *logits = NULL;
    int rc = KIRI_OK;
    if (n_out > 0 || n_tok > 0) {
        struct kiri_batch batch = {n_tok, b->b_tokens, b->b_pos, b->b_slots, b->b_nkv, b->b_toff, b->b_tables,
                                   n_tab, b->b_rows, n_out > 0 ? n_out : 1};
        if (n_out == 0)
            b->b_rows[0] = n_tok - 1; /* logits nobody reads: a chunk in the middle of a prompt */
        rc = kiri_graph_run(b->graph, b->kv, &batch, &logits, NULL);
    }
    if (rc != KIRI_OK) {
        for (int32_t j = 0; j < n_planned; j++) {
            planned[j]->status = rc;
            remove_seq(b, planned[j]);
            finish(b, planned[j], KIRI_FINISH_ERROR, NULL);
        }
        return 1;
    }
    for (int32_t j = 0; j < n_planned; j++) {
        planned[j]->kv.n_tokens += take[j];
        publish(b, planned[j]);
    }
    kiri_platform_mutex_lock(b->lock);
    b->stats.steps++;
    b->stats.kv_blocks_used = b->stats.kv_blocks_total - kiri_kvcache_n_available(b->kv);
    b->stats.kv_blocks_cached = kiri_kvcache_n_cached(b->kv);
    b->stats.prefix_hit_blocks = kiri_kvcache_prefix_hits(b->kv);
    b->stats.last_batch_tokens = n_tok;
    b->stats.last_batch_seqs = n_planned;
    if (n_planned > b->stats.peak_batch_seqs)
        b->stats.peak_batch_seqs = n_planned;
    kiri_platform_mutex_unlock(b->lock);

    /* Sample for every sequence whose pending tokens are all computed. */
    const double now = kiri_platform_now();
    for (int32_t o = 0; o < n_out; o++) {
        struct seq *s = b->b_out_seq[o];
        const float *lg = logits + (size_t)o * (size_t)b->model->hp.n_vocab;
        if (s->held) {
            deliver_logits(s, lg);
            continue;
        }
        if (s->req.max_tokens == 0) { /* the prompt only */
            remove_seq(b, s);
            finish(b, s, KIRI_FINISH_LENGTH, NULL);
            continue;
        }
        struct kiri_token_event ev;
        int reason = sample(b, s, lg, now, &ev);
        kiri_platform_mutex_lock(b->lock);
        b->stats.generated_tokens++;
        kiri_platform_mutex_unlock(b->lock);
        if (reason < 0) {
            if (s->fn(s->user, &ev) != 0 || atomic_load(&s->cancel))
                reason = KIRI_FINISH_CANCELLED;
            else
                continue;
        }
        remove_seq(b, s);
        finish(b, s, reason, reason == KIRI_FINISH_CANCELLED ? NULL : &ev);
    }
    return 1;
}

static void batcher_main(void *arg)
{
    struct kiri_batcher *b = arg;
    for (;;) {
        kiri_platform_mutex_lock(b->lock);
        while (!b->stop && !b->waiting && b->n_running == 0) {
            b->stats.kv_blocks_used = b->stats.kv_blocks_total - kiri_kvcache_n_available(b->kv);
            b->stats.kv_blocks_cached = kiri_kvcache_n_cached(b->kv);
            b->is_idle = 1;
            kiri_platform_cond_broadcast(b->idle);
            kiri_platform_cond_wait(b->wake, b->lock);
        }
        b->is_idle = 0;
        const int stop = b->stop, drain = b->drain;
        kiri_platform_mutex_unlock(b->lock);
        if (stop && !drain)
            break;
        if (stop && drain && !b->waiting && b->n_running == 0)
            break;
        admit(b);
        step(b);
    }
    /* Whatever is left ends as cancelled. */
    for (;;) {
        kiri_platform_mutex_lock(b->lock);
        struct seq *s = b->waiting;
        if (s) {
            b->waiting = s->next;
            b->n_waiting--;
        }
        kiri_platform_mutex_unlock(b->lock);
        if (!s)
            break;
        finish(b, s, KIRI_FINISH_CANCELLED, NULL);
    }
    while (b->n_running > 0) {
        struct seq *s = b->running[0];
        remove_running(b, 0);
        finish(b, s, KIRI_FINISH_CANCELLED, NULL);
    }
    kiri_platform_mutex_lock(b->lock);
    kiri_platform_cond_broadcast(b->idle);
    kiri_platform_mutex_unlock(b->lock);
}

void kiri_batcher_run(struct kiri_batcher *b, const _Atomic int *cancel)
{
    for (;;) {
        if (cancel && atomic_load(cancel)) {
            kiri_platform_mutex_lock(b->lock);
            for (int32_t i = 0; i < b->n_running; i++)
                atomic_store(&b->running[i]->cancel, 1);
            for (struct seq *s = b->waiting; s; s = s->next)
                atomic_store(&s->cancel, 1);
            kiri_platform_mutex_unlock(b->lock);
        }
        admit(b);
        if (!step(b))
            return;
    }
}

int kiri_batcher_wait_idle(struct kiri_batcher *b, double timeout_seconds)
{
    const double end = kiri_platform_now() + timeout_seconds;
    kiri_platform_mutex_lock(b->lock);
    while (b->thread && !b->is_idle && !b->stop) {
        const double left = end - kiri_platform_now();
        if (left <= 0)
            break;
        kiri_platform_cond_timed_wait(b->idle, b->lock, left);
    }
    const int idle = b->is_idle || !b->thread;
    kiri_platform_mutex_unlock(b->lock);
    return idle ? KIRI_OK : KIRI_E_BUSY;
}

int kiri_batcher_start(struct kiri_batcher *b)
{
    if (b->thread)
        return KIRI_OK;
    return kiri_platform_thread_start(&b->thread, batcher_main, b);
}

void kiri_batcher_stop(struct kiri_batcher *b, int drain)
{
    kiri_platform_mutex_lock(b->lock);
    b->accepting = 0;
    b->stop = 1;
    b->drain = drain;
    kiri_platform_cond_broadcast(b->wake);
    kiri_platform_mutex_unlock(b->lock);
    if (b->thread) {
        kiri_platform_thread_join(b->thread);
        b->thread = NULL;
    } else {
        batcher_main(b); /* never started: finish the queue here */
    }
}

void kiri_batcher_free(struct kiri_batcher *b)
{
    if (!b)
        return;
    if (b->lock && b->wake && b->idle)
        kiri_batcher_stop(b, 0);
    kiri_graph_free(b->graph);
    kiri_kvcache_free(b->kv);
    kiri_mem_free(b->running);
    kiri_mem_free(b->b_tokens);
    kiri_mem_free(b->b_pos);
    kiri_mem_free(b->b_slots);
    kiri_mem_free(b->b_nkv);
    kiri_mem_free(b->b_toff);
    kiri_mem_free(b->b_tables);
    kiri_mem_free(b->b_rows);
    kiri_mem_free(b->b_out_seq);
    kiri_platform_cond_free(b->wake);
    kiri_platform_cond_free(b->idle);
    kiri_platform_mutex_free(b->lock);
    kiri_mem_free(b);
}
