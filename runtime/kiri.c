/* The public API (kiri.h) over the engine's modules: a context is one sequence in a paged KV
 * cache of its own, a graph sized for its batch, and a sampler. */
#include "kiri.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "backend.h"
#include "backends.h"
#include "buf.h"
#include "graph.h"
#include "kvcache.h"
#include "mem.h"
#include "model.h"
#include "platform.h"
#include "sampler.h"
#include "stopper.h"
#include "tokenizer.h"

#define KV_BLOCK_SIZE 16

struct kiri_context {
    struct kiri_model *model;     /* borrowed */
    int32_t n_ctx;
    int32_t n_batch;
    int kv_type;
    struct kiri_kvcache *kv;      /* owned */
    struct kiri_graph *graph;     /* owned */
    struct kiri_kv_seq seq;       /* owned table */
    int32_t *scratch;             /* owned: 4 * n_batch ints for batch building */
    _Atomic int cancel;
};

/* ---------------------------------------------------------------------------------------------
 * Models
 * ------------------------------------------------------------------------------------------- */

void kiri_model_params_default(struct kiri_model_params *p)
{
    memset(p, 0, sizeof *p);
    p->backend = "auto";
    p->gpu_layers = -1;
}

int kiri_model_open(const char *path, const struct kiri_model_params *params, struct kiri_model **out,
                    struct kiri_status_info *info)
{
    kiri_error_clear(info);
    struct kiri_model_params def;
    if (!params) {
        kiri_model_params_default(&def);
        params = &def;
    }
    if (!path || !out)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "model path and output are required");
    struct kiri_gguf *g = NULL;
    int rc = kiri_gguf_open(path, &g, info);
    if (rc < 0)
        return rc;
    return kiri_model_load(g, params, out, info);
}

void kiri_model_close(struct kiri_model *model) { kiri_model_free(model); }

int32_t kiri_model_n_vocab(const struct kiri_model *m) { return m->hp.n_vocab; }
int32_t kiri_model_n_ctx_train(const struct kiri_model *m) { return m->hp.n_ctx_train; }
int32_t kiri_model_bos(const struct kiri_model *m) { return kiri_tokenizer_bos(m->tokenizer); }
int32_t kiri_model_eos(const struct kiri_model *m) { return kiri_tokenizer_eos(m->tokenizer); }

int kiri_model_is_eog(const struct kiri_model *m, int32_t token)
{
    return kiri_tokenizer_is_eog(m->tokenizer, token);
}

/* The describing texts are built whole in a kiri_buf, then given to the caller's fixed buffer cut
 * as snprintf cuts (nothing when memory ran out). */
static void copy_out(struct kiri_buf *b, char *buf, size_t cap)
{
    const size_t n = b->failed ? 0 : b->len < cap - 1 ? b->len : cap - 1;
    if (n)
        memcpy(buf, b->data, n);
    buf[n] = '\0';
    kiri_buf_free(b);
}

void kiri_model_describe(const struct kiri_model *m, char *buf, size_t cap)
{
    if (!cap)
        return;
    struct kiri_buf text = {0};
    kiri_buf_printf(&text, "tokenizer:     %s (pre: %s), %d tokens\n", kiri_tokenizer_model_name(m->tokenizer),
            kiri_tokenizer_pre_name(m->tokenizer), m->hp.n_vocab);
    if (m->vocab_only) {
        kiri_buf_printf(&text, "weights:       none (vocabulary only)\n");
        copy_out(&text, buf, cap);
        return;
    }
    const struct kiri_hparams *hp = &m->hp;
    kiri_buf_printf(&text, "architecture:  %s\n", m->arch_name);
    kiri_buf_printf(&text, "layers:        %d, embedding %d, feed-forward %d\n", hp->n_layer, hp->n_embd, hp->n_ff);
    kiri_buf_printf(&text, "attention:     %d heads, %d kv heads, head size %d, rope %s over %d dims, base %g, scale %g\n",
            hp->n_head, hp->n_head_kv, hp->head_dim, hp->rope_mode == KIRI_ROPE_NEOX ? "neox" : "normal",
            hp->n_rot, (double)hp->rope_freq_base, (double)hp->rope_freq_scale);
    kiri_buf_printf(&text, "context:       %d (trained)\n", hp->n_ctx_train);
    int count[KIRI_TYPE_COUNT] = {0};
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].type >= 0 && m->tensors[i].type < KIRI_TYPE_COUNT)
            count[m->tensors[i].type]++;
    kiri_buf_printf(&text, "tensor types: ");
    for (int t = 0; t < KIRI_TYPE_COUNT; t++)
        if (count[t])
            kiri_buf_printf(&text, " %s x%d", kiri_type_name(t), count[t]);
    kiri_buf_printf(&text, "%s\n", m->output == m->tok_embd ? " (tied embeddings)" : "");
    const double mib = 1024.0 * 1024.0;
    const size_t kv_tok = kiri_model_kv_bytes_per_token(m, KIRI_TYPE_F16);
    kiri_buf_printf(&text, "weights:       %.2f MiB mapped from the file (shared page cache, not copied)\n",
            (double)m->weight_bytes / mib);
    kiri_buf_printf(&text, "kv cache:      %.1f KiB per token (F16); %.2f MiB at the trained context\n",
            (double)kv_tok / 1024.0, (double)kv_tok * hp->n_ctx_train / mib);
    const uint64_t scratch = kiri_graph_scratch_bytes(m, 512, 1, 4096);
    kiri_buf_printf(&text, "memory needed: %.2f MiB resident at the trained context (weights + kv + %.2f MiB scratch)\n",
            ((double)m->weight_bytes + (double)kv_tok * hp->n_ctx_train + (double)scratch) / mib,
            (double)scratch / mib);
    char placement[320];
    kiri_model_describe_placement(m, placement, sizeof placement);
    kiri_buf_printf(&text, "placement:     %s\n", placement);
    kiri_buf_printf(&text, "threads:       %d\n", m->threads.n);
    kiri_buf_printf(&text, "backends:\n%s", m->backend_report);
    copy_out(&text, buf, cap);
}

/* ---------------------------------------------------------------------------------------------
 * Tokens
 * ------------------------------------------------------------------------------------------- */

int kiri_tokenize(const struct kiri_model *m, const char *text, size_t len, int add_bos, int parse_special,
                  int32_t *ids, int cap)
{
    if (!m || (!text && len) || cap < 0 || (cap && !ids))
        return KIRI_E_INVALID_ARG;
    const int bos = add_bos < 0 ? kiri_tokenizer_add_bos(m->tokenizer) : add_bos;
    return kiri_tokenizer_encode(m->tokenizer, text ? text : "", len, bos, 0, parse_special, ids, cap);
}

int kiri_token_to_piece(const struct kiri_model *m, int32_t token, int render_special, char *buf, size_t cap)
{
    return kiri_tokenizer_piece(m->tokenizer, token, render_special, buf, cap);
}

/* ---------------------------------------------------------------------------------------------
 * Contexts
 * ------------------------------------------------------------------------------------------- */

void kiri_context_params_default(struct kiri_context_params *p)
{
    memset(p, 0, sizeof *p);
    p->n_batch = 512;
    p->kv_type = 1;
}

int kiri_context_init(struct kiri_model *m, const struct kiri_context_params *params, struct kiri_context **out,
                      struct kiri_status_info *info)
{
    kiri_error_clear(info);
    struct kiri_context_params def;
    if (!params) {
        kiri_context_params_default(&def);
        params = &def;
    }
    if (!m || !out)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "model and output are required");
    if (m->vocab_only)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "the model was opened for its vocabulary only");
    const int kv_type = params->kv_type;
    if (kv_type != KIRI_TYPE_F16 && kv_type != KIRI_TYPE_F32 && kv_type != KIRI_TYPE_Q8_0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "kv_type must be F32 (0), F16 (1) or Q8_0 (8)");
    if (kv_type == KIRI_TYPE_Q8_0 && m->hp.head_dim % KIRI_QK8_0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "a Q8_0 cache needs a head size that is a multiple of 32");
    int32_t n_ctx = params->n_ctx > 0 ? params->n_ctx : m->hp.n_ctx_train;
    if (n_ctx > (1 << 24))
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "n_ctx %d is too large", n_ctx);
    int32_t n_batch = params->n_batch > 0 ? params->n_batch : 512;
    if (n_batch > n_ctx)
        n_batch = n_ctx;
    if (n_batch > 8192)
        n_batch = 8192;

    struct kiri_context *c = kiri_mem_calloc(1, sizeof *c);
    if (!c)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    c->model = m;
    c->n_ctx = n_ctx;
    c->n_batch = n_batch;
    c->kv_type = kv_type;
    const int32_t n_blocks = (n_ctx + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE;
    int rc = kiri_model_kvcache_init(m, kv_type, KV_BLOCK_SIZE, n_blocks, &c->kv);
    if (rc == 0)
        rc = kiri_graph_init(m, n_batch, 1, n_blocks, &c->graph);
    if (rc == 0 && !(c->scratch = kiri_mem_array((size_t)n_batch * 4, sizeof(int32_t))))
        rc = KIRI_E_NOMEM;
    if (rc < 0) {
        kiri_context_free(c);
        return kiri_error_set(info, rc, "cannot allocate a context of %d tokens (%s)", n_ctx,
                              kiri_status_name(rc));
    }
    *out = c;
    return KIRI_OK;
}

void kiri_context_free(struct kiri_context *c)
{
    if (!c)
        return;
    if (c->kv)
        kiri_kvcache_seq_free(c->kv, &c->seq);
    kiri_graph_free(c->graph);
    kiri_kvcache_free(c->kv);
    kiri_mem_free(c->scratch);
    kiri_mem_free(c);
}

void kiri_context_reset(struct kiri_context *c)
{
    kiri_kvcache_seq_clear(c->kv, &c->seq);
    atomic_store(&c->cancel, 0);
}

void kiri_context_cancel(struct kiri_context *c) { atomic_store(&c->cancel, 1); }

int kiri_context_eval(struct kiri_context *c, const int32_t *tokens, int32_t n, const float **logits,
                      struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!c || !tokens || n < 1 || !logits)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "eval needs at least one token");
    const int32_t start = c->seq.n_tokens;
    if ((int64_t)start + n > c->n_ctx)
        return kiri_error_set(info, KIRI_E_CONTEXT_FULL, "%d tokens do not fit: %d of %d context positions used",
                              n, start, c->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->model->hp.n_vocab)
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "token id %d is outside the vocabulary", tokens[i]);
    int rc = kiri_kvcache_seq_reserve(c->kv, &c->seq, start + n);
    if (rc < 0)
        return kiri_error_set(info, rc, "the KV cache is full");

    int32_t *pos = c->scratch, *slots = pos + c->n_batch, *n_kv = slots + c->n_batch, *off = n_kv + c->n_batch;
    for (int32_t done = 0; done < n;) {
        if (atomic_load(&c->cancel))
            return kiri_error_set(info, KIRI_E_CANCELLED, "cancelled");
        const int32_t chunk = n - done < c->n_batch ? n - done : c->n_batch;
        for (int32_t i = 0; i < chunk; i++) {
            const int32_t p = start + done + i;
            pos[i] = p;
            slots[i] = kiri_kvcache_slot(c->kv, &c->seq, p);
            n_kv[i] = p + 1;
            off[i] = 0;
        }
        const int32_t last = chunk - 1;
        struct kiri_batch b = {
            .n_tokens = chunk,
            .tokens = tokens + done,
            .pos = pos,
            .slots = slots,
            .n_kv = n_kv,
            .table_off = off,
            .tables = c->seq.blocks,
            .n_table_entries = c->seq.n_blocks,
            .out_rows = &last,
            .n_outputs = 1,
        };
        rc = kiri_graph_run(c->graph, c->kv, &b, logits, info);
        if (rc < 0)
            return rc;
        done += chunk;
        c->seq.n_tokens = start + done;
    }
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Generation
 * ------------------------------------------------------------------------------------------- */

int kiri_generate(struct kiri_context *c, const int32_t *prompt, int32_t n_prompt,
                  const struct kiri_generate_params *gp, kiri_token_fn on_token, void *user,
                  struct kiri_generate_result *result, struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!c || !prompt || n_prompt < 1 || !gp || (gp->n_stop && !gp->stop) || gp->n_stop < 0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "generate needs a context, a prompt and parameters");
    int rc = kiri_sampling_validate(&gp->sampling, info);
    if (rc < 0)
        return rc;
    for (int s = 0; s < gp->n_stop; s++)
        if (!gp->stop[s])
            return kiri_error_set(info, KIRI_E_INVALID_ARG, "stop string %d is NULL", s);
    if (n_prompt >= c->n_ctx)
        return kiri_error_set(info, KIRI_E_CONTEXT_FULL, "the prompt (%d tokens) does not fit the context (%d)",
                              n_prompt, c->n_ctx);
    const struct kiri_model *m = c->model;
    struct kiri_sampler *smp = NULL;
    if ((rc = kiri_sampler_init(&gp->sampling, m->hp.n_vocab, &smp)) < 0)
        return kiri_error_set(info, rc, "cannot create the sampler");

    kiri_context_reset(c);
    struct kiri_generate_result res;
    memset(&res, 0, sizeof res);
    res.n_prompt = n_prompt;
    struct kiri_stopper stopper;
    kiri_stopper_init(&stopper, gp->stop, gp->n_stop);
    struct kiri_detok_stream ds = {0};
    char piece[KIRI_DETOK_CAP];
    const float *logits = NULL;

    double t0 = kiri_platform_now();
    rc = kiri_context_eval(c, prompt, n_prompt, &logits, info);
    res.prefill_seconds = kiri_platform_now() - t0;
    for (int32_t i = 0; i < n_prompt; i++)
        kiri_sampler_accept(smp, prompt[i]);
    t0 = kiri_platform_now();
    res.finish = KIRI_FINISH_LENGTH;
    while (rc == 0) {
        if (gp->max_tokens >= 0 && res.n_generated >= gp->max_tokens)
            break;
        const int32_t tok = kiri_sampler_sample(smp, logits);
        kiri_sampler_accept(smp, tok);
        res.n_generated++;
        if (kiri_tokenizer_is_eog(m->tokenizer, tok)) {
            res.finish = KIRI_FINISH_EOS;
            break;
        }
        int n = kiri_detok_push(m->tokenizer, &ds, tok, 0, piece, sizeof piece);
        const char *text;
        size_t text_len;
        const int hit = kiri_stopper_push(&stopper, piece, n > 0 ? (size_t)n : 0, &text, &text_len);
        if (hit < 0) {
            rc = kiri_error_set(info, hit, "out of memory");
            break;
        }
        const int stop_cb = on_token && on_token(user, tok, text, text_len);
        if (hit || stop_cb) {
            res.finish = KIRI_FINISH_STOP;
            break;
        }
        if (gp->max_tokens >= 0 && res.n_generated >= gp->max_tokens)
            break; /* the last token needs no evaluation */
        if (c->seq.n_tokens >= c->n_ctx) {
            res.finish = KIRI_FINISH_CONTEXT;
            break;
        }
        rc = kiri_context_eval(c, &tok, 1, &logits, info);
    }
    if (rc == 0 && res.finish != KIRI_FINISH_STOP && on_token) {
        /* Deliver what was held back for a stop string that never came. */
        int n = kiri_detok_flush(&ds, piece, sizeof piece);
        const char *text;
        size_t text_len;
        if (n > 0 && kiri_stopper_push(&stopper, piece, (size_t)n, &text, &text_len) == 0 && text_len)
            on_token(user, -1, text, text_len);
        kiri_stopper_flush(&stopper, &text, &text_len);
        if (text_len)
            on_token(user, -1, text, text_len);
    }
    res.decode_seconds = kiri_platform_now() - t0;
    kiri_stopper_free(&stopper);
    kiri_sampler_free(smp);
    if (result)
        *result = res;
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * System
 * ------------------------------------------------------------------------------------------- */

double kiri_time_seconds(void) { return kiri_platform_now(); }

uint64_t kiri_peak_rss_bytes(void) { return kiri_platform_peak_rss(); }

static void one_thread_run(void *pool, void (*fn)(void *, int, int), void *arg)
{
    (void)pool;
    fn(arg, 0, 1);
}

static void no_barrier(void *pool) { (void)pool; }

void kiri_system_info(const char *backend, char *buf, size_t cap)
{
    if (!cap)
        return;
    struct kiri_buf text = {0};
    const uint32_t f = kiri_platform_cpu_features();
    kiri_buf_printf(&text, "kiri %s\n", KIRI_VERSION_STRING);
    kiri_buf_printf(&text, "cpu:           %d cores, features:%s%s%s%s%s%s%s%s\n", kiri_platform_n_cpus(),
            f & KIRI_CPU_AVX2 ? " avx2+fma+f16c" : "", f & KIRI_CPU_AVX512 ? " avx512" : "",
            f & KIRI_CPU_AVX512_VNNI ? " avx512-vnni" : "", f & KIRI_CPU_AVX_VNNI ? " avx-vnni" : "",
            f & KIRI_CPU_NEON ? " neon" : "", f & KIRI_CPU_DOTPROD ? " dotprod" : "",
            f & KIRI_CPU_I8MM ? " i8mm" : "", f ? "" : " (portable C only)");
    kiri_buf_printf(&text, "memory:        %.1f GiB\n", (double)kiri_platform_total_memory() / (1024.0 * 1024.0 * 1024.0));
    kiri_buf_printf(&text, "compiled-in backends:");
    for (int i = 0; i < kiri_backends_count(); i++)
        kiri_buf_printf(&text, " %s", kiri_backends_get(i)->name);
    kiri_buf_printf(&text, "\n");
    struct kiri_backend_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.threads.n = 1;
    cfg.threads.run = one_thread_run;
    cfg.threads.barrier = no_barrier;
    cfg.cpu_features = f;
    cfg.dl_open = kiri_platform_dl_open;
    cfg.dl_sym = kiri_platform_dl_sym;
    const struct kiri_backend_iface *iface = NULL;
    struct kiri_backend *be = NULL;
    char report[512];
    struct kiri_status_info info;
    const int rc = kiri_backends_pick(backend, &cfg, &iface, &be, report, sizeof report, &info);
    kiri_buf_printf(&text, "backends:\n%s", report);
    if (rc < 0)
        kiri_buf_printf(&text, "error: %s\n", info.message);
    else
        iface->free(be);
    copy_out(&text, buf, cap);
}
