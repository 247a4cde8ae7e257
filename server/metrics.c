/* Server metrics: counters and histograms updated under one mutex, rendered in the Prometheus text
 * exposition format (version 0.0.4, the format every Prometheus client and parser speaks).
 *
 * What the text must satisfy, because strict parsers (Go's expfmt.TextParser, which the Gateway
 * API inference extension uses, and Prometheus itself) refuse the whole page otherwise: every
 * family appears once, as one contiguous block, introduced by one # HELP and one # TYPE line;
 * a counter's samples carry the family name itself (ending in _total); a histogram's samples are
 * name_bucket{le="..."} with cumulative counts in ascending le order ending at le="+Inf" (equal to
 * name_count), then name_sum and name_count; label values are valid UTF-8 with \\, \" and \n
 * escaped; numbers use '.' as decimal point (kiri never calls setlocale, so the C locale holds);
 * the page ends with a line feed.
 *
 * Names. kiri's own families start with kiri_. The batcher's block count is exported as
 * kiri_kv_blocks_capacity, not kiri_kv_blocks_total: Prometheus reserves the _total suffix for
 * counters (promtool check metrics flags a gauge named *_total). The batcher's monotonic
 * statistics (prefix hits, steps, preemptions) are counters and keep _total.
 *
 * vLLM names, for routers and autoscalers that were written against vLLM. All carry vLLM V1's
 * labels {engine="0",model_name="..."} (engine is vLLM's data-parallel engine index; kiri has one):
 *   vllm:num_requests_waiting     gauge    The Gateway API inference extension's endpoint picker
 *                                          (EPP) reads it as TotalQueuedRequests (its flag
 *                                          --total-queued-requests-metric defaults to this name).
 *   vllm:num_requests_running     gauge    EPP's TotalRunningRequests (newer model server
 *                                          protocol; --total-running-requests-metric).
 *   vllm:kv_cache_usage_perc      gauge    EPP's KVCacheUtilization in current releases
 *                                          (--kv-cache-usage-percentage-metric); a fraction
 *                                          0..1 despite "perc", as in vLLM.
 *   vllm:gpu_cache_usage_perc     gauge    The same value under the vLLM V0 name, which older EPP
 *                                          releases and many dashboards still read.
 *   vllm:cache_config_info        gauge 1  Labels block_size and num_gpu_blocks, which EPP's
 *                                          prefix-cache scorer reads when present
 *                                          (--cache-info-metric); like vLLM, without model_name.
 *   vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:num_preemptions_total,
 *   vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total   counters that vLLM-based
 *                                          dashboards and autoscalers use; queries and hits count
 *                                          tokens (prompt tokens, and those served from the
 *                                          prefix cache), as vLLM V1's do.
 * Not exported: vllm:lora_requests_info (kiri serves no LoRA adapters; run EPP with
 * --lora-info-metric "" as its docs say for servers without LoRA, or it logs a missing-metric
 * error each scrape), and vLLM's latency histograms (kiri's own are above; routers do not read
 * them).
 */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "kiri.h"
#include "mem.h"
#include "platform.h"
#include "upstream.h"
#include "utf8.h"

/* ---------------------------------------------------------------------------------------------
 * Fixed label sets and buckets
 * ------------------------------------------------------------------------------------------- */

/* The endpoint label's values: the server's routes, and "other" for everything else (any name
 * not in this list is counted as "other", so a caller cannot grow the label set). */
static const char *const endpoints[] = {
    "/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/tokenize", "/detokenize",
    "/health", "/metrics", "other",
};
#define N_ENDPOINTS (sizeof endpoints / sizeof endpoints[0])
#define ENDPOINT_OTHER (N_ENDPOINTS - 1)

/* Statuses 100..599 are counted under their number; anything else under "0". */
#define N_STATUS 600

#define MAX_BOUNDS 20

/* Upper bounds in seconds, chosen for edge hardware: a CPU can take tens of seconds to prefill a
 * long prompt, and decodes at roughly 5 to 100 tokens per second. */
static const double ttft_bounds[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160};
static const double itl_bounds[] = {0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                                    1, 2.5, 5};
static const double e2e_bounds[] = {0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 20, 30, 60, 120, 240, 480, 960};

struct hist {
    const double *bounds;           /* borrowed (static), n_bounds finite bounds, ascending */
    int n_bounds;
    uint64_t bucket[MAX_BOUNDS + 1]; /* (n_bounds + 1) NOT cumulative: bucket[i] counts values in
                                        (bounds[i-1], bounds[i]]; the last one those above all */
    uint64_t count;
    double sum;
};

struct kiri_metrics {
    struct kiri_mutex *lock;                  /* owned; guards every field below */
    uint64_t requests[N_ENDPOINTS][N_STATUS];  /* by endpoint index and status (0 or 100..599) */
    uint64_t prompt_tokens, generation_tokens, cached_tokens;
    uint64_t auth_failures, disconnects;
    struct hist ttft, itl, e2e;
};

/* ---------------------------------------------------------------------------------------------
 * Recording
 * ------------------------------------------------------------------------------------------- */

static void hist_init(struct hist *h, const double *bounds, int n)
{
    h->bounds = bounds;
    h->n_bounds = n;
}

/* Non-finite values are dropped (they would make _sum meaningless); negative ones count as 0. */
static void hist_observe(struct hist *h, double v)
{
    if (!isfinite(v))
        return;
    if (v < 0)
        v = 0;
    int i = 0;
    while (i < h->n_bounds && v > h->bounds[i])
        i++;
    h->bucket[i]++;
    h->count++;
    h->sum += v;
}

int kiri_metrics_init(struct kiri_metrics **out)
{
    struct kiri_metrics *m = kiri_mem_calloc(1, sizeof *m);
    if (!m)
        return KIRI_E_NOMEM;
    int rc = kiri_platform_mutex_init(&m->lock);
    if (rc != KIRI_OK) {
        kiri_mem_free(m);
        return rc < 0 ? rc : KIRI_E_NOMEM;
    }
    hist_init(&m->ttft, ttft_bounds, (int)(sizeof ttft_bounds / sizeof ttft_bounds[0]));
    hist_init(&m->itl, itl_bounds, (int)(sizeof itl_bounds / sizeof itl_bounds[0]));
    hist_init(&m->e2e, e2e_bounds, (int)(sizeof e2e_bounds / sizeof e2e_bounds[0]));
    *out = m;
    return KIRI_OK;
}

void kiri_metrics_free(struct kiri_metrics *m)
{
    if (!m)
        return;
    kiri_platform_mutex_free(m->lock);
    kiri_mem_free(m);
}

static size_t endpoint_index(const char *endpoint)
{
    if (endpoint)
        for (size_t i = 0; i < ENDPOINT_OTHER; i++)
            if (strcmp(endpoint, endpoints[i]) == 0)
                return i;
    return ENDPOINT_OTHER;
}

void kiri_metrics_request(struct kiri_metrics *m, const char *endpoint, int status)
{
    if (!m)
        return;
    size_t e = endpoint_index(endpoint);
    size_t s = status >= 100 && status < N_STATUS ? (size_t)status : 0;
    kiri_platform_mutex_lock(m->lock);
    m->requests[e][s]++;
    kiri_platform_mutex_unlock(m->lock);
}

/* Negative amounts are ignored: counters only go up. */
void kiri_metrics_tokens(struct kiri_metrics *m, int64_t prompt, int64_t generated, int64_t cached)
{
    if (!m)
        return;
    kiri_platform_mutex_lock(m->lock);
    m->prompt_tokens += prompt > 0 ? (uint64_t)prompt : 0;
    m->generation_tokens += generated > 0 ? (uint64_t)generated : 0;
    m->cached_tokens += cached > 0 ? (uint64_t)cached : 0;
    kiri_platform_mutex_unlock(m->lock);
}

static void observe(struct kiri_metrics *m, struct hist *h, double seconds)
{
    kiri_platform_mutex_lock(m->lock);
    hist_observe(h, seconds);
    kiri_platform_mutex_unlock(m->lock);
}

void kiri_metrics_ttft(struct kiri_metrics *m, double seconds)
{
    if (m)
        observe(m, &m->ttft, seconds);
}

void kiri_metrics_inter_token(struct kiri_metrics *m, double seconds)
{
    if (m)
        observe(m, &m->itl, seconds);
}

void kiri_metrics_e2e(struct kiri_metrics *m, double seconds)
{
    if (m)
        observe(m, &m->e2e, seconds);
}

void kiri_metrics_auth_failure(struct kiri_metrics *m)
{
    if (!m)
        return;
    kiri_platform_mutex_lock(m->lock);
    m->auth_failures++;
    kiri_platform_mutex_unlock(m->lock);
}

void kiri_metrics_client_disconnect(struct kiri_metrics *m)
{
    if (!m)
        return;
    kiri_platform_mutex_lock(m->lock);
    m->disconnects++;
    kiri_platform_mutex_unlock(m->lock);
}

/* ---------------------------------------------------------------------------------------------
 * Text building
 * ------------------------------------------------------------------------------------------- */

/* The page is a kiri_buf: an append that fails (out of memory) sets its failed flag, and the
 * page is then dropped whole rather than served cut short. */

/* The page's text, or NULL (everything freed) when an append failed. */
static char *finish(struct kiri_buf *b)
{
    if (b->failed) {
        kiri_buf_free(b);
        return NULL;
    }
    return kiri_buf_take(b, NULL);
}

/* Whole numbers without exponent (160, not 1.6e+02); otherwise the shortest decimal that reads
 * back as v (0.1, not 0.10000000000000001). */
static void fmt_double(char *buf, size_t cap, double v)
{
    if (isnan(v)) {
        snprintf(buf, cap, "NaN");
        return;
    }
    if (isinf(v)) {
        snprintf(buf, cap, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    if (v == floor(v) && fabs(v) < 1e15) {
        snprintf(buf, cap, "%.0f", v);
        return;
    }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v)
            return;
    }
}

/* Appends a label value as the format wants it: \\ " and line feed escaped; bytes that are not
 * valid UTF-8 become '?', one each, since parsers refuse invalid UTF-8 in label values. */
static void put_label(struct kiri_buf *b, const char *s)
{
    if (!s)
        s = "";
    const size_t n = strlen(s);
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        const int len = kiri_utf8_check(u + i, n - i);
        if (len <= 0) {
            kiri_buf_putc(b, '?');
            i++;
        } else if (u[i] == '\\' || u[i] == '"') {
            kiri_buf_putc(b, '\\');
            kiri_buf_putc(b, (char)u[i++]);
        } else if (u[i] == '\n') {
            kiri_buf_puts(b, "\\n");
            i++;
        } else {
            kiri_buf_append(b, u + i, (size_t)len);
            i += (size_t)len;
        }
    }
}

/* HELP texts are fixed strings without backslashes or line feeds, so they need no escaping. */
static void family(struct kiri_buf *b, const char *name, const char *type, const char *help)
{
    kiri_buf_printf(b, "# HELP %s ", name);
    kiri_buf_puts(b, help);
    kiri_buf_printf(b, "\n# TYPE %s %s\n", name, type);
}

static void counter(struct kiri_buf *b, const char *name, const char *help, uint64_t v)
{
    family(b, name, "counter", help);
    kiri_buf_printf(b, "%s %" PRIu64 "\n", name, v);
}

static void gauge_int(struct kiri_buf *b, const char *name, const char *help, int64_t v)
{
    family(b, name, "gauge", help);
    kiri_buf_printf(b, "%s %" PRId64 "\n", name, v);
}

static void gauge_double(struct kiri_buf *b, const char *name, const char *help, double v)
{
    char num[40];
    fmt_double(num, sizeof num, v);
    family(b, name, "gauge", help);
    kiri_buf_printf(b, "%s %s\n", name, num);
}

/* One sample with the vLLM labels; model is the served model's name (escaped here). */
static void vllm_sample(struct kiri_buf *b, const char *name, const char *type, const char *help,
                        const char *model, const char *value)
{
    family(b, name, type, help);
    kiri_buf_printf(b, "%s{engine=\"0\",model_name=\"", name);
    put_label(b, model);
    kiri_buf_printf(b, "\"} %s\n", value);
}

static void histogram(struct kiri_buf *b, const char *name, const char *help, const struct hist *h)
{
    char num[40];
    family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_bounds; i++) {
        cum += h->bucket[i];
        fmt_double(num, sizeof num, h->bounds[i]);
        kiri_buf_printf(b, "%s_bucket{le=\"%s\"} %" PRIu64 "\n", name, num, cum);
    }
    kiri_buf_printf(b, "%s_bucket{le=\"+Inf\"} %" PRIu64 "\n", name, h->count);
    fmt_double(num, sizeof num, h->sum);
    kiri_buf_printf(b, "%s_sum %s\n", name, num);
    kiri_buf_printf(b, "%s_count %" PRIu64 "\n", name, h->count);
}

/* ---------------------------------------------------------------------------------------------
 * Rendering
 * ------------------------------------------------------------------------------------------- */

static void render_requests(struct kiri_buf *b, const struct kiri_metrics *m)
{
    family(b, "kiri_requests_total", "counter",
           "HTTP requests finished, by route (\"other\" for unknown paths) and status code.");
    for (size_t e = 0; e < N_ENDPOINTS; e++)
        for (size_t s = 0; s < N_STATUS; s++)
            if (m->requests[e][s])
                kiri_buf_printf(b, "kiri_requests_total{endpoint=\"%s\",status=\"%zu\"} %" PRIu64 "\n",
                          endpoints[e], s, m->requests[e][s]);
}

static void render_batcher(struct kiri_buf *b, const struct kiri_batcher_stats *s, double usage)
{
    gauge_int(b, "kiri_requests_running", "Sequences in the running batch.", s->running);
    gauge_int(b, "kiri_requests_waiting", "Requests queued for a batch slot.", s->waiting);
    gauge_int(b, "kiri_kv_blocks_capacity", "KV cache blocks in the pool.", s->kv_blocks_total);
    gauge_int(b, "kiri_kv_blocks_used", "KV cache blocks held by sequences.", s->kv_blocks_used);
    gauge_int(b, "kiri_kv_blocks_cached",
              "KV cache blocks published for prefix sharing (held or reclaimable).",
              s->kv_blocks_cached);
    gauge_int(b, "kiri_kv_block_size_tokens", "Tokens per KV cache block.", s->kv_block_size);
    gauge_double(b, "kiri_kv_cache_usage_ratio",
                 "Fraction of KV cache blocks held by sequences (0 to 1).", usage);
    gauge_int(b, "kiri_state_slots_capacity",
              "Recurrent-state slots (one per sequence of a model with recurrent layers, and the spare ones of "
              "speculation).", s->state_slots_total);
    gauge_int(b, "kiri_spec_state_slots",
              "Of the recurrent-state slots, the spare ones that keep the state after each drafted token.",
              s->state_slots_spec);
    gauge_int(b, "kiri_state_slots_used", "Recurrent-state slots held by running sequences.", s->state_slots_used);
    gauge_int(b, "kiri_state_bytes", "Bytes of the recurrent-state store, taken from the KV memory budget.",
              (int64_t)s->state_bytes);
    gauge_int(b, "kiri_state_snapshots_capacity",
              "Recurrent-state snapshots kept at block ends for prefix reuse (0 without recurrent layers).",
              s->snapshots_total);
    gauge_int(b, "kiri_state_snapshots_used", "Recurrent-state snapshots holding a state.", s->snapshots_used);
    gauge_int(b, "kiri_state_snapshot_bytes", "Bytes of the snapshot store, taken from the KV memory budget.",
              (int64_t)s->snapshot_bytes);
    counter(b, "kiri_state_snapshot_hits_total", "Admissions that resumed a cached prefix from a state snapshot.",
            s->snapshot_hits);
    counter(b, "kiri_state_snapshot_misses_total",
            "Admissions with a whole prompt block that found no cached prefix with a state snapshot.",
            s->snapshot_misses);
    counter(b, "kiri_prefix_cache_hit_blocks_total", "KV blocks reused from the prefix cache.",
            s->prefix_hit_blocks);
    gauge_int(b, "kiri_batch_size_tokens", "Tokens in the last batch step.", s->last_batch_tokens);
    gauge_int(b, "kiri_batch_size_sequences", "Sequences in the last batch step.", s->last_batch_seqs);
    gauge_int(b, "kiri_batch_size_sequences_peak", "Most sequences in one batch step since start.",
              s->peak_batch_seqs);
    counter(b, "kiri_batch_steps_total", "Batch steps (forward passes) run.", s->steps);
    counter(b, "kiri_preemptions_total",
            "Sequences preempted for lack of KV blocks (recomputed later).", s->preemptions);
    /* One sample per drafter (enum kiri_spec), zero ones included, so a rate always has a series. */
    family(b, "kiri_spec_draft_tokens_total", "counter", "Tokens drafted for speculative decoding, by drafter.");
    for (int k = KIRI_SPEC_NONE + 1; k < KIRI_SPEC_KINDS; k++)
        kiri_buf_printf(b, "kiri_spec_draft_tokens_total{drafter=\"%s\"} %" PRIu64 "\n", kiri_spec_name(k),
                        s->spec_drafted[k]);
    family(b, "kiri_spec_accepted_tokens_total", "counter",
           "Drafted tokens the model kept (verified equal to its own), by drafter.");
    for (int k = KIRI_SPEC_NONE + 1; k < KIRI_SPEC_KINDS; k++)
        kiri_buf_printf(b, "kiri_spec_accepted_tokens_total{drafter=\"%s\"} %" PRIu64 "\n", kiri_spec_name(k),
                        s->spec_accepted[k]);
}

static void render_vllm(struct kiri_buf *b, const struct kiri_metrics *m, const struct kiri_batcher_stats *s,
                        double usage, const char *model)
{
    char num[40];
    snprintf(num, sizeof num, "%" PRId32, s->running);
    vllm_sample(b, "vllm:num_requests_running", "gauge",
                "Number of requests in model execution batches (vLLM name).", model, num);
    snprintf(num, sizeof num, "%" PRId32, s->waiting);
    vllm_sample(b, "vllm:num_requests_waiting", "gauge",
                "Number of requests waiting to be processed (vLLM name).", model, num);
    fmt_double(num, sizeof num, usage);
    vllm_sample(b, "vllm:kv_cache_usage_perc", "gauge",
                "KV-cache usage, 1 means 100 percent (vLLM name).", model, num);
    vllm_sample(b, "vllm:gpu_cache_usage_perc", "gauge",
                "KV-cache usage, 1 means 100 percent (vLLM V0 name).", model, num);
    family(b, "vllm:cache_config_info", "gauge", "KV cache configuration in labels (vLLM name).");
    kiri_buf_printf(b, "vllm:cache_config_info{block_size=\"%" PRId32 "\",engine=\"0\",num_gpu_blocks=\"%" PRId32
              "\"} 1\n", s->kv_block_size, s->kv_blocks_total);
    snprintf(num, sizeof num, "%" PRIu64, m->prompt_tokens);
    vllm_sample(b, "vllm:prompt_tokens_total", "counter",
                "Number of prefill tokens processed (vLLM name).", model, num);
    snprintf(num, sizeof num, "%" PRIu64, m->generation_tokens);
    vllm_sample(b, "vllm:generation_tokens_total", "counter",
                "Number of generation tokens processed (vLLM name).", model, num);
    snprintf(num, sizeof num, "%" PRIu64, s->preemptions);
    vllm_sample(b, "vllm:num_preemptions_total", "counter",
                "Cumulative number of preemptions (vLLM name).", model, num);
    snprintf(num, sizeof num, "%" PRIu64, m->prompt_tokens);
    vllm_sample(b, "vllm:prefix_cache_queries_total", "counter",
                "Prefix cache queries, in queried tokens (vLLM name).", model, num);
    snprintf(num, sizeof num, "%" PRIu64, m->cached_tokens);
    vllm_sample(b, "vllm:prefix_cache_hits_total", "counter",
                "Prefix cache hits, in cached tokens (vLLM name).", model, num);
}

/* The text is built under the lock so that every number comes from one instant. A NULL s
 * renders the batcher's gauges as zeros (the families must exist for routers either way). */
char *kiri_metrics_render(struct kiri_metrics *m, const struct kiri_batcher_stats *s, const char *model_name)
{
    if (!m)
        return NULL;
    struct kiri_batcher_stats zero;
    if (!s) {
        memset(&zero, 0, sizeof zero);
        s = &zero;
    }
    double usage = 0;
    if (s->kv_blocks_total > 0 && s->kv_blocks_used > 0)
        usage = s->kv_blocks_used >= s->kv_blocks_total
                    ? 1.0 : (double)s->kv_blocks_used / (double)s->kv_blocks_total;

    struct kiri_buf b = {0};
    kiri_buf_reserve(&b, 12 * 1024);
    kiri_platform_mutex_lock(m->lock);
    render_requests(&b, m);
    counter(&b, "kiri_prompt_tokens_total", "Prompt tokens of finished requests.", m->prompt_tokens);
    counter(&b, "kiri_generation_tokens_total", "Tokens generated.", m->generation_tokens);
    counter(&b, "kiri_prompt_cached_tokens_total",
            "Prompt tokens whose keys and values came from the prefix cache.", m->cached_tokens);
    counter(&b, "kiri_auth_failures_total", "Requests refused for a missing or wrong API key.",
            m->auth_failures);
    counter(&b, "kiri_client_disconnects_total", "Requests whose client went away before the end.",
            m->disconnects);
    histogram(&b, "kiri_time_to_first_token_seconds",
              "Seconds from a request's arrival to its first generated token.", &m->ttft);
    histogram(&b, "kiri_inter_token_latency_seconds", "Seconds between consecutive generated tokens.",
              &m->itl);
    histogram(&b, "kiri_e2e_request_latency_seconds",
              "Seconds from a request's arrival to its last byte.", &m->e2e);
    render_batcher(&b, s, usage);
    render_vllm(&b, m, s, usage, model_name);
    kiri_platform_mutex_unlock(m->lock);
    return finish(&b);
}

/* ---------------------------------------------------------------------------------------------
 * Served models and the fleet
 * ------------------------------------------------------------------------------------------- */

/* The page to append to (owned, from kiri_mem_alloc) as a buffer that holds it: the invariant of
 * buf.h (data[len] == 0, len + 1 <= cap) is the string's own. */
static struct kiri_buf page_buf(char *page)
{
    const size_t n = strlen(page);
    struct kiri_buf b = {.data = page, .len = n, .cap = n + 1};
    return b;
}

char *kiri_metrics_render_models(char *page, const struct kiri_metrics_models *f)
{
    if (!page)
        return NULL;
    struct kiri_buf b = page_buf(page);
    counter(&b, "kiri_model_loads_total", "Models loaded (at start, on demand or by a swap).", f->loads);
    counter(&b, "kiri_model_swaps_total", "Hot-swaps to a new version of a model's file.", f->swaps);
    counter(&b, "kiri_model_load_failures_total",
            "Model loads that failed (a swap that failed keeps the old version serving).", f->load_failures);
    counter(&b, "kiri_model_evictions_total", "Idle models unloaded to keep within --models-memory.",
            f->evictions);
    gauge_int(&b, "kiri_models_loaded", "Models loaded now (retired versions still serving included).",
              f->loaded);
    gauge_int(&b, "kiri_models_memory_bytes", "Estimated memory of the loaded models (files and KV pools).",
              (int64_t)f->memory_bytes);
    family(&b, "kiri_model_info", "gauge",
           "One sample per model served: its id, the SHA-256 of its file (empty when unknown) and whether it is loaded.");
    for (int i = 0; i < f->n_models; i++) {
        kiri_buf_puts(&b, "kiri_model_info{model=\"");
        put_label(&b, f->ids[i]);
        kiri_buf_puts(&b, "\",sha256=\"");
        put_label(&b, f->sha256_hex[i]);
        kiri_buf_printf(&b, "\",loaded=\"%d\"} 1\n", f->is_loaded[i] ? 1 : 0);
    }
    if (f->fleet) {
        gauge_int(&b, "kiri_fleet_manifest_version", "Version of the fleet manifest in force (0: none).",
                  (int64_t)f->manifest_version);
        counter(&b, "kiri_fleet_manifest_rejections_total",
                "Fleet manifests refused (signature, key, older version, expired, malformed).",
                f->manifest_rejections);
        counter(&b, "kiri_fleet_syncs_total", "Fleet sync passes run.", f->syncs);
        counter(&b, "kiri_fleet_sync_failures_total",
                "Fleet sync passes that did not end with every model in place.", f->sync_failures);
        counter(&b, "kiri_fleet_model_install_failures_total",
                "Models a sync could not install (download, hash or file checks).", f->model_install_failures);
        counter(&b, "kiri_heartbeats_total", "Heartbeats sent to the manifest's heartbeat URL.", f->heartbeats);
        counter(&b, "kiri_heartbeat_failures_total", "Heartbeats that did not reach the collector.",
                f->heartbeat_failures);
        counter(&b, "kiri_model_removals_total", "Models a fleet manifest superseded whose files were deleted.",
                f->removals);
        counter(&b, "kiri_model_removed_files_total",
                "Files of superseded models deleted (model and kept previous version).", f->removed_files);
    }
    return finish(&b);
}

/* ---------------------------------------------------------------------------------------------
 * Routing to the upstream
 * ------------------------------------------------------------------------------------------- */

char *kiri_metrics_render_upstream(char *page, const struct kiri_upstream_stats *u)
{
    if (!page)
        return NULL;
    struct kiri_buf b = page_buf(page);
    family(&b, "kiri_route_requests_total", "counter", "Generation requests by where they were served.");
    kiri_buf_printf(&b, "kiri_route_requests_total{served_by=\"local\"} %" PRIu64 "\n",
              u->counts[KIRI_UPSTREAM_SERVED_LOCAL]);
    kiri_buf_printf(&b, "kiri_route_requests_total{served_by=\"upstream\"} %" PRIu64 "\n",
              u->counts[KIRI_UPSTREAM_SERVED_UPSTREAM]);
    counter(&b, "kiri_route_fallbacks_total", "Requests the upstream could not take that were served locally.",
            u->counts[KIRI_UPSTREAM_FALLBACK]);
    gauge_int(&b, "kiri_upstream_configured", "Whether a cloud upstream is configured.", u->configured);
    gauge_int(&b, "kiri_upstream_breaker_state", "The upstream circuit breaker: 0 closed, 1 open, 2 half-open.",
              (int64_t)u->breaker);
    counter(&b, "kiri_upstream_breaker_opens_total", "Times the upstream circuit breaker opened.", u->breaker_opens);
    family(&b, "kiri_upstream_failures_total", "counter", "Forwards the upstream did not answer in full, by reason.");
    for (int i = 0; i < KIRI_UPSTREAM_N_REASONS; i++)
        kiri_buf_printf(&b, "kiri_upstream_failures_total{reason=\"%s\"} %" PRIu64 "\n", u->reason_names[i],
                  u->failures[i]);
    return finish(&b);
}
