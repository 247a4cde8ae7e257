/* The continuous-batching loop on stories260K: concurrent greedy requests give exactly the tokens
 * each gives alone (through kiri_generate), with chunked prefill, prefix sharing and preemption
 * under a tight KV budget; the text of the events, stop strings included, is llama.cpp's greedy
 * text; cancellation returns blocks; queue and prompt limits; log-probs. Sliding-window layers
 * (stories260K with some layers marked windowed): the cache that keeps only their window gives
 * the logits of a full-size cache with the same windowed attention, batched, in chunks, one token
 * at a time, through prefix reuse and preemption, and the library's contexts; its memory is the
 * global layers' per token plus a constant. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"
#include "hex.h"
#include "kiri.h"
#include "model.h"
#include "platform.h"
#include "test.h"

#ifndef KIRI_SHARED_DIR
#define KIRI_SHARED_DIR "../shared"
#endif

#ifndef KIRI_SOURCE_DIR
#define KIRI_SOURCE_DIR "."
#endif

#define N_REQ 6
#define MAX_GEN 48

static const char *const prompts[N_REQ] = {
    "Once upon a time", "Lily wanted to", "The little dog",
    "One day, Tom", "There was a big red ball", "Sam and his mom went to",
};

struct result {
    int32_t tokens[512];
    int n;
    char text[2048];              /* the events' text, concatenated */
    size_t text_len;
    int finish;
    int n_cached;
    int n_events;
    float logprob_sum;
    int logprob_bad;
};

static struct kiri_mutex *lock;
static struct kiri_cond *done_cond;
static int n_done;

static int on_event(void *user, const struct kiri_token_event *ev)
{
    struct result *r = user;
    kiri_platform_mutex_lock(lock);
    r->n_events++;
    if (ev->token >= 0 && r->n < 512) {
        r->tokens[r->n++] = ev->token;
        if (ev->n_top > 0) {
            /* The chosen greedy token is the most likely one; alternatives are sorted. */
            if (ev->top_ids[0] != ev->token || fabsf(ev->top_logprobs[0] - ev->logprob) > 1e-5f)
                r->logprob_bad++;
            for (int i = 1; i < ev->n_top; i++)
                if (ev->top_logprobs[i] > ev->top_logprobs[i - 1])
                    r->logprob_bad++;
            if (ev->logprob > 0)
                r->logprob_bad++;
        }
    }
    if (r->text_len + ev->text_len < sizeof r->text) {
        memcpy(r->text + r->text_len, ev->text, ev->text_len);
        r->text_len += ev->text_len;
    }
    r->n_cached = ev->n_cached;
    if (ev->finish >= 0) {
        r->finish = ev->finish;
        n_done++;
        kiri_platform_cond_broadcast(done_cond);
    }
    kiri_platform_mutex_unlock(lock);
    return 0;
}

static void wait_done(int n)
{
    kiri_platform_mutex_lock(lock);
    while (n_done < n)
        if (kiri_platform_cond_timed_wait(done_cond, lock, 60.0))
            break;
    kiri_platform_mutex_unlock(lock);
}

static struct kiri_model *model;
static int32_t solo[N_REQ][MAX_GEN];
static int solo_n[N_REQ];

static int collect_solo(void *user, int32_t token, const char *text, size_t len)
{
    int *i = user;
    if (token >= 0 && solo_n[*i] < MAX_GEN)
        solo[*i][solo_n[*i]++] = token;
    return 0;
}

static void test_setup(void)
{
    kiri_platform_mutex_init(&lock);
    kiri_platform_cond_init(&done_cond);
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.n_threads = 2;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_model_open(KIRI_SOURCE_DIR "/models/stories260K.gguf", &mp, &model, &info), 0);
    /* Each prompt alone, greedy, through the plain generate path. */
    struct kiri_context *c = NULL;
    CHECK_EQ_INT(kiri_context_init(model, NULL, &c, &info), 0);
    for (int i = 0; i < N_REQ; i++) {
        int32_t ids[64];
        const int n = kiri_tokenize(model, prompts[i], strlen(prompts[i]), -1, 0, ids, 64);
        struct kiri_generate_params gp;
        memset(&gp, 0, sizeof gp);
        gp.max_tokens = MAX_GEN;
        kiri_sampling_default(&gp.sampling);
        gp.sampling.temperature = 0;
        CHECK_EQ_INT(kiri_generate(c, ids, n, &gp, collect_solo, &i, NULL, &info), 0);
    }
    kiri_context_free(c);
}

static int submit(struct kiri_batcher *b, const char *prompt, int max_tokens, int priority, int top,
                  struct result *r, uint64_t *id)
{
    int32_t ids[512];
    const int n = kiri_tokenize(model, prompt, strlen(prompt), -1, 0, ids, 512);
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.tokens = ids;
    req.n_tokens = n;
    req.max_tokens = max_tokens;
    kiri_sampling_default(&req.sampling);
    req.sampling.temperature = 0;
    req.priority = priority;
    req.top_logprobs = top;
    req.logprobs = top > 0;
    uint64_t dummy;
    return kiri_batcher_submit(b, &req, on_event, r, id ? id : &dummy, NULL);
}

/* All requests at once, with small prefill chunks and a KV budget too small for all of them:
 * outputs equal the solo outputs token for token. */
static void run_concurrent(int32_t chunk, size_t kv_memory, int expect_preemption)
{
    struct kiri_batcher_params p;
    kiri_batcher_params_default(&p);
    p.max_seqs = 4;
    p.chunk = chunk;
    p.n_ctx = 128;
    p.kv_memory = kv_memory;
    struct kiri_batcher *b = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_batcher_init(model, &p, &b, &info), 0);
    if (!b)
        return;
    static struct result res[N_REQ];
    memset(res, 0, sizeof res);
    n_done = 0;
    for (int i = 0; i < N_REQ; i++)
        CHECK_EQ_INT(submit(b, prompts[i], MAX_GEN, 0, i == 0 ? 5 : 0, &res[i], NULL), 0);
    CHECK_EQ_INT(kiri_batcher_start(b), 0);
    wait_done(N_REQ);
    for (int i = 0; i < N_REQ; i++) {
        CHECK_EQ_INT(res[i].finish, KIRI_FINISH_LENGTH);
        CHECK_EQ_INT(res[i].n, solo_n[i]);
        int same = res[i].n == solo_n[i];
        for (int t = 0; same && t < res[i].n; t++)
            same = res[i].tokens[t] == solo[i][t];
        if (!same)
            fprintf(stderr, "request %d (chunk %d) differs from its solo run\n", i, chunk);
        CHECK(same);
        CHECK_EQ_INT(res[i].logprob_bad, 0);
    }
    struct kiri_batcher_stats st;
    CHECK_EQ_INT(kiri_batcher_wait_idle(b, 30), 0);
    kiri_batcher_get_stats(b, &st);
    CHECK(st.peak_batch_seqs > 1); /* all were queued before the loop started: they ran together */
    if (expect_preemption)
        CHECK(st.preemptions > 0);
    CHECK_EQ_INT(st.kv_blocks_used, 0); /* everything returned (cached prefix blocks are reusable) */
    CHECK_EQ_INT(st.generated_tokens, N_REQ * MAX_GEN);
    kiri_batcher_free(b);
}

static void test_concurrent_equals_solo(void) { run_concurrent(256, 0, 0); }
static void test_chunked_prefill(void) { run_concurrent(3, 0, 0); }
/* 11 blocks of 16 tokens: four sequences of up to 54 tokens cannot all fit. */
static void test_preemption(void) { run_concurrent(8, 11 * 16 * 5 * 2 * 2 * 32, 1); }

static void test_prefix_reuse(void)
{
    struct kiri_batcher_params p;
    kiri_batcher_params_default(&p);
    p.max_seqs = 2;
    struct kiri_batcher *b = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_batcher_init(model, &p, &b, &info), 0);
    CHECK_EQ_INT(kiri_batcher_start(b), 0);
    const char *sys = "Once upon a time, there was a little girl named Lily. She loved to play outside in the "
                      "park. One day, she saw a big, red ball. She wanted to play with it.";
    static struct result r1, r2;
    memset(&r1, 0, sizeof r1);
    memset(&r2, 0, sizeof r2);
    n_done = 0;
    CHECK_EQ_INT(submit(b, sys, 8, 0, 0, &r1, NULL), 0);
    wait_done(1);
    CHECK_EQ_INT(submit(b, sys, 8, 0, 0, &r2, NULL), 0);
    wait_done(2);
    CHECK_EQ_INT(r1.n_cached, 0);
    CHECK(r2.n_cached >= 16);
    CHECK_EQ_INT(r1.n, r2.n);
    CHECK(memcmp(r1.tokens, r2.tokens, (size_t)r1.n * sizeof(int32_t)) == 0);
    struct kiri_batcher_stats st;
    kiri_batcher_get_stats(b, &st);
    CHECK(st.prefix_hit_blocks > 0);
    kiri_batcher_free(b);
}

struct canceller {
    struct kiri_batcher *b;
    uint64_t id;
    struct result r;
};

static int cancel_on_third(void *user, const struct kiri_token_event *ev)
{
    struct canceller *c = user;
    on_event(&c->r, ev);
    return ev->n_generated == 3; /* the callback asks to stop */
}

static void test_cancel_and_limits(void)
{
    struct kiri_batcher_params p;
    kiri_batcher_params_default(&p);
    p.max_seqs = 1;
    p.queue_cap = 2;
    p.n_ctx = 64;
    struct kiri_batcher *b = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_batcher_init(model, &p, &b, &info), 0);
    static struct result r[4];
    memset(r, 0, sizeof r);
    n_done = 0;
    /* Not started: the queue fills, then refuses. */
    uint64_t id0, id1;
    CHECK_EQ_INT(submit(b, prompts[0], 200, 0, 0, &r[0], &id0), 0);
    CHECK_EQ_INT(submit(b, prompts[1], 5, 0, 0, &r[1], &id1), 0);
    CHECK_EQ_INT(submit(b, prompts[2], 5, 0, 0, &r[2], NULL), KIRI_E_BUSY);
    kiri_batcher_cancel(b, id0); /* cancelled while waiting */
    CHECK_EQ_INT(kiri_batcher_start(b), 0);
    wait_done(2);
    CHECK_EQ_INT(r[0].finish, KIRI_FINISH_CANCELLED);
    CHECK_EQ_INT(r[0].n, 0);
    CHECK_EQ_INT(r[1].finish, KIRI_FINISH_LENGTH);
    CHECK_EQ_INT(r[1].n, 5);

    /* A callback that returns non-zero ends its request. */
    static struct canceller c;
    memset(&c, 0, sizeof c);
    int32_t ids[8] = {1, 403, 407, 261, 378};
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.tokens = ids;
    req.n_tokens = 5;
    req.max_tokens = 40;
    kiri_sampling_default(&req.sampling);
    CHECK_EQ_INT(kiri_batcher_submit(b, &req, cancel_on_third, &c, &c.id, &info), 0);
    wait_done(3);
    CHECK_EQ_INT(c.r.finish, KIRI_FINISH_CANCELLED);
    CHECK_EQ_INT(c.r.n, 3);

    /* Reaching the context length ends with FINISH_CONTEXT. */
    CHECK_EQ_INT(submit(b, prompts[3], 500, 0, 0, &r[3], NULL), 0);
    wait_done(4);
    CHECK_EQ_INT(r[3].finish, KIRI_FINISH_CONTEXT);
    /* Every position is used: the last token sampled is the one that would not fit. */
    CHECK_EQ_INT(r[3].n, 64 - kiri_tokenize(model, prompts[3], strlen(prompts[3]), -1, 0, NULL, 0) + 1);

    /* Bad requests are refused before queueing. */
    int32_t big[70];
    for (int i = 0; i < 70; i++)
        big[i] = 300;
    req.tokens = big;
    req.n_tokens = 64;
    CHECK_EQ_INT(kiri_batcher_submit(b, &req, on_event, &r[2], &c.id, &info), KIRI_E_INVALID_ARG);
    req.n_tokens = 5;
    big[2] = 512;
    CHECK_EQ_INT(kiri_batcher_submit(b, &req, on_event, &r[2], &c.id, &info), KIRI_E_INVALID_ARG);
    big[2] = 3;
    req.top_logprobs = 21;
    CHECK_EQ_INT(kiri_batcher_submit(b, &req, on_event, &r[2], &c.id, &info), KIRI_E_INVALID_ARG);
    struct kiri_batcher_stats st;
    CHECK_EQ_INT(kiri_batcher_wait_idle(b, 30), 0);
    kiri_batcher_get_stats(b, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0);
    kiri_batcher_free(b);
}

/* llama.cpp's greedy continuations of stories260K (shared reference data): entry k's prompt
 * tokens and the bytes of its output text. Returns 0 when the file has no entry k. */
struct reference {
    int32_t prompt[32];
    int n_prompt;
    int n_output;
    char text[1024];
    size_t text_len;
};

static int read_reference(const char *json, int k, struct reference *ref)
{
    const char *p = json;
    for (int i = 0; i <= k; i++)
        if (!(p = strstr(i ? p + 1 : p, "\"prompt_tokens\"")))
            return 0;
    memset(ref, 0, sizeof *ref);
    p = strchr(p, '[');
    while (p && *p != ']' && ref->n_prompt < 32) {
        char *end;
        const long v = strtol(p + 1, &end, 10);
        if (end == p + 1)
            break;
        ref->prompt[ref->n_prompt++] = (int32_t)v;
        p = end;
        while (*p == ' ' || *p == '\n' || *p == ',')
            p++;
        p--;
    }
    const char *out = strstr(p, "\"output_tokens\"");
    const char *hex = strstr(p, "\"output_bytes_hex\"");
    if (!out || !hex)
        return 0;
    for (const char *q = strchr(out, '['); q && *q != ']'; q++)
        ref->n_output += *q == ',';
    ref->n_output++;
    hex = strchr(hex + 18, '"') + 1;
    while (kiri_hex_digit(hex[0]) >= 0 && kiri_hex_digit(hex[1]) >= 0 && ref->text_len < sizeof ref->text - 1) {
        ref->text[ref->text_len++] = (char)(kiri_hex_digit(hex[0]) << 4 | kiri_hex_digit(hex[1]));
        hex += 2;
    }
    return 1;
}

static void test_text_matches_reference(void)
{
    FILE *f = fopen(KIRI_SHARED_DIR "/reference/stories260K-greedy.json", "rb");
    CHECK(f != NULL);
    if (!f)
        return;
    static char json[1 << 16];
    const size_t n = fread(json, 1, sizeof json - 1, f);
    fclose(f);
    json[n] = '\0';
    static struct reference refs[8];
    int n_refs = 0;
    while (n_refs < 8 && read_reference(json, n_refs, &refs[n_refs]))
        n_refs++;
    CHECK(n_refs >= 4);

    struct kiri_batcher_params p;
    kiri_batcher_params_default(&p);
    p.max_seqs = 8;
    p.chunk = 7; /* prompts split across steps, and mixed with decode tokens */
    struct kiri_batcher *b = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_batcher_init(model, &p, &b, &info), 0);
    CHECK_EQ_INT(kiri_batcher_start(b), 0);
    static struct result r[9];
    memset(r, 0, sizeof r);
    n_done = 0;
    /* One more request: the first prompt again, cut at a stop string from inside its text. */
    const char *stop[] = {"park"};
    for (int i = 0; i <= n_refs; i++) {
        const struct reference *ref = &refs[i < n_refs ? i : 0];
        struct kiri_request req;
        memset(&req, 0, sizeof req);
        req.tokens = ref->prompt;
        req.n_tokens = ref->n_prompt;
        req.max_tokens = ref->n_output;
        kiri_sampling_default(&req.sampling);
        req.sampling.temperature = 0;
        if (i == n_refs) {
            req.stop = stop;
            req.n_stop = 1;
        }
        uint64_t id;
        CHECK_EQ_INT(kiri_batcher_submit(b, &req, on_event, &r[i], &id, &info), 0);
    }
    wait_done(n_refs + 1);
    for (int i = 0; i < n_refs; i++) {
        CHECK_EQ_INT(r[i].finish, KIRI_FINISH_LENGTH);
        CHECK_EQ_INT(r[i].n, refs[i].n_output);
        CHECK_EQ_INT((int)r[i].text_len, (int)refs[i].text_len);
        CHECK(memcmp(r[i].text, refs[i].text, refs[i].text_len) == 0);
    }
    const char *hit = strstr(refs[0].text, "park");
    CHECK(hit != NULL);
    if (hit) {
        CHECK_EQ_INT(r[n_refs].finish, KIRI_FINISH_STOP);
        CHECK_EQ_INT((int)r[n_refs].text_len, (int)(hit - refs[0].text));
        CHECK(memcmp(r[n_refs].text, refs[0].text, (size_t)(hit - refs[0].text)) == 0);
    }
    kiri_batcher_free(b);
}

/* ---------------------------------------------------------------------------------------------
 * Sliding-window layers
 * ------------------------------------------------------------------------------------------- */

#define SW_WINDOW 37            /* not a multiple of the 16-token block */
#define SW_SEQS 3
#define SW_MAXPOS 400

static struct kiri_model *swmodel; /* stories260K, layers 0, 1 and 3 windowed */
static int32_t sw_script[SW_SEQS][SW_MAXPOS];
static const int32_t sw_prompt[SW_SEQS] = {150, 97, 200};

/* The logits after each position of one held sequence. */
struct sw_seq {
    float *logits;              /* owned (SW_MAXPOS, n_vocab) */
    uint8_t have[SW_MAXPOS];
    int32_t first_cached;       /* n_cached of its first logits event, -1 before */
};

static int on_sw(void *user, const struct kiri_token_event *ev)
{
    struct sw_seq *q = user;
    const int32_t V = kiri_model_n_vocab(swmodel);
    if (ev->logits && ev->n_prompt >= 1 && ev->n_prompt <= SW_MAXPOS) {
        memcpy(q->logits + (size_t)(ev->n_prompt - 1) * (size_t)V, ev->logits, (size_t)V * sizeof(float));
        q->have[ev->n_prompt - 1] = 1;
        if (q->first_cached < 0)
            q->first_cached = ev->n_cached;
    }
    return 0;
}

static void sw_seqs_init(struct sw_seq *q, int n)
{
    for (int i = 0; i < n; i++) {
        memset(&q[i], 0, sizeof q[i]);
        q[i].logits = calloc((size_t)SW_MAXPOS * (size_t)kiri_model_n_vocab(swmodel), sizeof(float));
        q[i].first_cached = -1;
        CHECK(q[i].logits != NULL);
    }
}

static void sw_seqs_free(struct sw_seq *q, int n)
{
    for (int i = 0; i < n; i++)
        free(q[i].logits);
}

/* The largest difference between the logits both runs delivered (they must deliver the same
 * positions); *n_compared counts the positions. */
static double sw_diff(const struct sw_seq *a, const struct sw_seq *b, int n, int *n_compared)
{
    const int32_t V = kiri_model_n_vocab(swmodel);
    double worst = 0;
    *n_compared = 0;
    for (int i = 0; i < n; i++)
        for (int p = 0; p < SW_MAXPOS; p++) {
            CHECK_EQ_INT(a[i].have[p], b[i].have[p]);
            if (!a[i].have[p] || !b[i].have[p])
                continue;
            ++*n_compared;
            for (int32_t v = 0; v < V; v++) {
                const double d = fabs((double)a[i].logits[(size_t)p * V + v] - (double)b[i].logits[(size_t)p * V + v]);
                worst = d > worst ? d : worst;
            }
        }
    return worst;
}

static struct kiri_batcher *sw_batcher(int swa_full, int32_t max_seqs, int32_t chunk, size_t kv_memory, int prefix)
{
    struct kiri_batcher_params p;
    kiri_batcher_params_default(&p);
    p.max_seqs = max_seqs;
    p.chunk = chunk;
    p.n_ctx = 512;
    p.kv_memory = kv_memory;
    p.prefix_cache = prefix;
    p.swa_full = swa_full;
    struct kiri_batcher *b = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_batcher_init(swmodel, &p, &b, &info), 0);
    return b;
}

static uint64_t sw_submit(struct kiri_batcher *b, const int32_t *tokens, int32_t n, struct sw_seq *q)
{
    struct kiri_request req;
    memset(&req, 0, sizeof req);
    req.tokens = tokens;
    req.n_tokens = n;
    uint64_t id = 0;
    CHECK_EQ_INT(kiri_batcher_submit_held(b, &req, on_sw, q, &id, NULL), 0);
    return id;
}

/* The script: SW_SEQS held sequences with prompts of several windows computed together, then 40
 * steps that append one token to each (every eighth step a chunk of 29), all driven from this
 * thread. */
static void sw_run(struct kiri_batcher *b, struct sw_seq *q, struct kiri_batcher_stats *st)
{
    uint64_t id[SW_SEQS];
    int32_t at[SW_SEQS];
    for (int i = 0; i < SW_SEQS; i++) {
        id[i] = sw_submit(b, sw_script[i], sw_prompt[i], &q[i]);
        at[i] = sw_prompt[i];
    }
    kiri_batcher_run(b, NULL);
    for (int step = 0; step < 40; step++) {
        for (int i = 0; i < SW_SEQS; i++) {
            const int32_t n = step % 8 == 7 ? 29 : 1;
            CHECK_EQ_INT(kiri_batcher_append(b, id[i], sw_script[i] + at[i], n, NULL), 0);
            at[i] += n;
        }
        kiri_batcher_run(b, NULL);
    }
    kiri_batcher_get_stats(b, st);
    for (int i = 0; i < SW_SEQS; i++)
        kiri_batcher_cancel(b, id[i]);
    kiri_batcher_run(b, NULL);
}

/* Bytes of one token's keys and values in one layer (F16). */
static size_t sw_layer_token(void)
{
    return 2 * (size_t)swmodel->hp.n_head_kv * (size_t)swmodel->hp.head_dim * 2;
}

static void sw_setup(void)
{
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.n_threads = 2;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_model_open(KIRI_SOURCE_DIR "/models/stories260K.gguf", &mp, &swmodel, &info), 0);
    if (!swmodel)
        return;
    swmodel->hp.swa_window = SW_WINDOW;
    swmodel->layers[0].swa = swmodel->layers[1].swa = swmodel->layers[3].swa = 1;
    uint32_t x = 12345;
    for (int i = 0; i < SW_SEQS; i++)
        for (int p = 0; p < SW_MAXPOS; p++) {
            x = x * 1664525u + 1013904223u;
            sw_script[i][p] = (int32_t)(3 + (x >> 8) % 500);
        }
}

/* Batched prompts in chunks and decode steps: the windowed pool against a full-size cache with
 * the same windowed attention, for two chunk sizes; and windowed attention really differs from
 * full attention. */
static void test_window_logits(void)
{
    CHECK(swmodel != NULL);
    if (!swmodel)
        return;
    const int32_t chunks[2] = {64, 7};
    for (int c = 0; c < 2; c++) {
        struct sw_seq win[SW_SEQS], full[SW_SEQS];
        sw_seqs_init(win, SW_SEQS);
        sw_seqs_init(full, SW_SEQS);
        struct kiri_batcher_stats sw, sf;
        struct kiri_batcher *b = sw_batcher(0, SW_SEQS, chunks[c], 0, 0);
        if (b)
            sw_run(b, win, &sw);
        kiri_batcher_free(b);
        b = sw_batcher(1, SW_SEQS, chunks[c], 0, 0);
        if (b)
            sw_run(b, full, &sf);
        kiri_batcher_free(b);
        int n = 0;
        const double d = sw_diff(win, full, SW_SEQS, &n);
        if (d > 1e-6)
            fprintf(stderr, "chunk %d: windowed pool vs full cache differ by %g\n", chunks[c], d);
        CHECK(d <= 1e-6);
        CHECK_EQ_INT(n, SW_SEQS * 41);
        CHECK(sw.kv_bytes < sf.kv_bytes * 6 / 10); /* 2 of 5 layers, plus the windows */
        CHECK(sw.peak_batch_seqs == SW_SEQS);
        if (c == 0) {
            /* Full attention (no layer windowed) gives other logits: the window is applied. */
            struct sw_seq plain[SW_SEQS];
            sw_seqs_init(plain, SW_SEQS);
            swmodel->layers[0].swa = swmodel->layers[1].swa = swmodel->layers[3].swa = 0;
            b = sw_batcher(0, SW_SEQS, chunks[c], 0, 0);
            if (b)
                sw_run(b, plain, &sf);
            kiri_batcher_free(b);
            swmodel->layers[0].swa = swmodel->layers[1].swa = swmodel->layers[3].swa = 1;
            CHECK(sw_diff(plain, full, SW_SEQS, &n) > 1e-3);
            sw_seqs_free(plain, SW_SEQS);
        }
        sw_seqs_free(win, SW_SEQS);
        sw_seqs_free(full, SW_SEQS);
    }
}

/* Preemption under a budget of 40 global blocks (both runs get the same global pool, so the same
 * schedule): preempted sequences are recomputed into the windowed pool and give the same logits. */
static void test_window_preemption(void)
{
    if (!swmodel)
        return;
    struct kiri_batcher_stats st;
    struct kiri_batcher *b = sw_batcher(0, SW_SEQS, 64, 0, 0);
    if (!b)
        return;
    kiri_batcher_get_stats(b, &st);
    kiri_batcher_free(b);
    const size_t global_token = (size_t)(swmodel->hp.n_layer - 3) * sw_layer_token();
    const size_t swa_bytes = st.kv_bytes - (size_t)st.kv_blocks_total * 16 * global_token;
    struct sw_seq win[SW_SEQS], full[SW_SEQS];
    sw_seqs_init(win, SW_SEQS);
    sw_seqs_init(full, SW_SEQS);
    struct kiri_batcher_stats sw, sf;
    b = sw_batcher(0, SW_SEQS, 64, 40 * 16 * global_token + swa_bytes, 0);
    if (b)
        sw_run(b, win, &sw);
    kiri_batcher_free(b);
    b = sw_batcher(1, SW_SEQS, 64, 40 * 16 * (size_t)swmodel->hp.n_layer * sw_layer_token(), 0);
    if (b)
        sw_run(b, full, &sf);
    kiri_batcher_free(b);
    CHECK_EQ_INT(sw.kv_blocks_total, 40);
    CHECK_EQ_INT(sf.kv_blocks_total, 40);
    CHECK(sw.preemptions > 0);
    CHECK_EQ_INT((int)sw.preemptions, (int)sf.preemptions);
    int n = 0;
    const double d = sw_diff(win, full, SW_SEQS, &n);
    if (d > 1e-6)
        fprintf(stderr, "preemption: windowed pool vs full cache differ by %g\n", d);
    CHECK(d <= 1e-6);
    CHECK(n > SW_SEQS * 10);
    sw_seqs_free(win, SW_SEQS);
    sw_seqs_free(full, SW_SEQS);
}

/* Prefix reuse: A's 160-token prompt is cached; B extends it by 20 tokens and decodes 10. With
 * evict, a long unrelated prompt C runs in between, cycling the windowed pool: the global blocks of
 * A stay cached, the windowed ones do not, so B must recompute everything rather than attend keys
 * that are gone. */
static void sw_prefix(int swa_full, int evict, struct sw_seq *q)
{
    struct kiri_batcher *b = sw_batcher(swa_full, 2, 64, 0, 1);
    if (!b)
        return;
    struct sw_seq scratch[1];
    sw_seqs_init(scratch, 1);
    uint64_t id = sw_submit(b, sw_script[0], 160, scratch);
    kiri_batcher_run(b, NULL);
    kiri_batcher_cancel(b, id);
    kiri_batcher_run(b, NULL);
    if (evict) {
        id = sw_submit(b, sw_script[1], 300, scratch);
        kiri_batcher_run(b, NULL);
        kiri_batcher_cancel(b, id);
        kiri_batcher_run(b, NULL);
    }
    static int32_t tokens[200];
    memcpy(tokens, sw_script[0], 160 * sizeof *tokens);
    memcpy(tokens + 160, sw_script[2], 30 * sizeof *tokens);
    id = sw_submit(b, tokens, 180, q);
    kiri_batcher_run(b, NULL);
    for (int i = 180; i < 190; i++) {
        CHECK_EQ_INT(kiri_batcher_append(b, id, tokens + i, 1, NULL), 0);
        kiri_batcher_run(b, NULL);
    }
    kiri_batcher_cancel(b, id);
    kiri_batcher_run(b, NULL);
    struct kiri_batcher_stats st;
    kiri_batcher_get_stats(b, &st);
    CHECK_EQ_INT(st.kv_blocks_used, 0); /* cached blocks are available */
    CHECK_EQ_INT(st.kv_window_blocks_used, 0);
    CHECK_EQ_INT(st.kv_window_blocks_total, swa_full ? 0 : 2 * 8);
    sw_seqs_free(scratch, 1);
    kiri_batcher_free(b);
}

static void test_window_prefix_reuse(void)
{
    if (!swmodel)
        return;
    struct sw_seq q[4];
    sw_seqs_init(q, 4);
    sw_prefix(0, 0, &q[0]); /* windowed blocks cached: the prefix is reused */
    sw_prefix(1, 0, &q[1]);
    sw_prefix(0, 1, &q[2]); /* windowed blocks evicted: recomputed */
    sw_prefix(1, 1, &q[3]); /* the full cache still has every layer's keys */
    CHECK_EQ_INT(q[0].first_cached, 160);
    CHECK_EQ_INT(q[1].first_cached, 160);
    CHECK_EQ_INT(q[2].first_cached, 0);
    CHECK_EQ_INT(q[3].first_cached, 160);
    int n = 0;
    double d = sw_diff(&q[0], &q[1], 1, &n);
    CHECK(d <= 1e-6);
    CHECK_EQ_INT(n, 11);
    CHECK(sw_diff(&q[3], &q[1], 1, &n) <= 1e-6);
    /* Recomputed in other chunks than the cached run: the same up to rounding. */
    d = sw_diff(&q[2], &q[1], 1, &n);
    fprintf(stderr, "windowed prefix recomputed vs reused: logits differ by %g\n", d);
    CHECK(d <= 1e-4);
    sw_seqs_free(q, 4);
}

/* The library's contexts keep only the window too, and give the logits of a full-size cache. */
static void test_window_context(void)
{
    if (!swmodel)
        return;
    struct kiri_context_params cp;
    kiri_context_params_default(&cp);
    cp.n_ctx = 512;
    cp.n_batch = 16;
    struct kiri_context *c = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_context_init(swmodel, &cp, &c, &info), 0);
    if (!c)
        return;
    struct sw_seq q[2];
    sw_seqs_init(q, 2);
    const int32_t V = kiri_model_n_vocab(swmodel);
    const float *lg = NULL;
    CHECK_EQ_INT(kiri_context_eval(c, sw_script[0], 150, &lg, &info), 0);
    if (lg)
        memcpy(q[0].logits + 149 * (size_t)V, lg, (size_t)V * sizeof(float));
    q[0].have[149] = 1;
    for (int p = 150; p < 190; p++) {
        lg = NULL;
        CHECK_EQ_INT(kiri_context_eval(c, sw_script[0] + p, 1, &lg, &info), 0);
        if (lg)
            memcpy(q[0].logits + (size_t)p * V, lg, (size_t)V * sizeof(float));
        q[0].have[p] = 1;
    }
    kiri_context_free(c);
    struct kiri_batcher *b = sw_batcher(1, 1, 16, 0, 0);
    if (b) {
        const uint64_t id = sw_submit(b, sw_script[0], 150, &q[1]);
        kiri_batcher_run(b, NULL);
        for (int p = 150; p < 190; p++) {
            CHECK_EQ_INT(kiri_batcher_append(b, id, sw_script[0] + p, 1, NULL), 0);
            kiri_batcher_run(b, NULL);
        }
    }
    kiri_batcher_free(b);
    int n = 0;
    CHECK(sw_diff(&q[0], &q[1], 1, &n) <= 1e-6);
    CHECK_EQ_INT(n, 41);
    sw_seqs_free(q, 2);
}

/* The pool of a windowed model: its global part grows with the context, its windowed part is a
 * constant of about max_seqs windows plus a chunk each; without windowed layers nothing changes. */
static void test_window_memory(void)
{
    if (!swmodel)
        return;
    struct kiri_batcher_stats st[3];
    const int32_t n_ctx[2] = {256, 512};
    for (int i = 0; i < 3; i++) {
        struct kiri_batcher_params p;
        kiri_batcher_params_default(&p);
        p.max_seqs = 4;
        p.chunk = 64;
        p.n_ctx = i == 2 ? 512 : n_ctx[i];
        p.swa_full = i == 2;
        struct kiri_batcher *b = NULL;
        CHECK_EQ_INT(kiri_batcher_init(swmodel, &p, &b, NULL), 0);
        if (b)
            kiri_batcher_get_stats(b, &st[i]);
        kiri_batcher_free(b);
    }
    const size_t per_layer = sw_layer_token(), global = 2 * per_layer, windowed = 3 * per_layer;
    CHECK_EQ_INT((long long)kiri_model_kv_bytes_per_token(swmodel, KIRI_TYPE_F16), (long long)global);
    CHECK_EQ_INT((long long)kiri_model_kv_bytes_window(swmodel, KIRI_TYPE_F16), (long long)(windowed * SW_WINDOW));
    for (int i = 0; i < 2; i++) {
        CHECK_EQ_INT(st[i].kv_blocks_total, 4 * n_ctx[i] / 16);
        const size_t fixed = (size_t)st[i].kv_bytes - (size_t)st[i].kv_blocks_total * 16 * global;
        /* The window before a step plus its chunk, rounded out to whole blocks, per sequence. */
        CHECK((long long)fixed >= 4LL * (SW_WINDOW + 64) * (long long)windowed);
        CHECK((long long)fixed <= 4LL * (SW_WINDOW + 64 + 2 * 16) * (long long)windowed);
    }
    CHECK_EQ_INT((long long)(st[1].kv_bytes - st[0].kv_bytes), 4LL * 256 * (long long)global);
    CHECK_EQ_INT((long long)st[2].kv_bytes, 4LL * 512 * (long long)(global + windowed));
    fprintf(stderr, "windowed model, 4 x 512 tokens: %llu KV bytes (every token in every layer: %llu)\n",
            (unsigned long long)st[1].kv_bytes, (unsigned long long)st[2].kv_bytes);
    /* kiri info: the global layers' cost per token and the windows' fixed cost. */
    static char text[1 << 14];
    kiri_model_describe(swmodel, text, sizeof text);
    CHECK(strstr(text, "0.2 KiB per token (F16) in the 2 global layers, plus 0.01 MiB for the 3 sliding-window "
                       "layers' 37-token window") != NULL);
}

static void test_teardown(void)
{
    kiri_model_close(model);
    kiri_model_close(swmodel);
    kiri_platform_cond_free(done_cond);
    kiri_platform_mutex_free(lock);
}

TEST_MAIN(test_setup, test_concurrent_equals_solo, test_chunked_prefill, test_preemption, test_prefix_reuse,
          test_cancel_and_limits, test_text_matches_reference, sw_setup, test_window_logits,
          test_window_preemption, test_window_prefix_reuse, test_window_context, test_window_memory, test_teardown)
