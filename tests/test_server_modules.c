/* The server's small modules: metrics (the rendered text is parsed back line by line against the
 * Prometheus text exposition format, version 0.0.4: HELP/TYPE per family, contiguous families,
 * counter and histogram sample names, cumulative buckets ending at +Inf == _count, label escaping,
 * valid UTF-8; the vLLM names routers read), a concurrency smoke test, API-key auth (H19: a
 * missing, wrong, padded or oversized key), configuration (precedence, suffixes, every error
 * path), and the failing allocator over metrics init/render and auth load. */
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "auth.h"
#include "batcher.h"
#include "config.h"
#include "kiri.h"
#include "mem.h"
#include "metrics.h"
#include "platform.h"
#include "test.h"

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static char tmp_dir[64];

static void tmp_open(void)
{
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/kiri-srvmod-XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "mkdtemp failed\n");
        exit(1);
    }
}

static void tmp_close(void) { rmdir(tmp_dir); }

/* Writes n bytes to tmp_dir/name and returns the path (static storage, one per slot). */
static const char *write_file(int slot, const char *name, const void *data, size_t n)
{
    static char paths[4][256];
    snprintf(paths[slot], sizeof paths[slot], "%s/%s", tmp_dir, name);
    FILE *f = fopen(paths[slot], "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK_EQ_INT(fwrite(data, 1, n, f), n);
        fclose(f);
    }
    return paths[slot];
}

static const char *write_text(int slot, const char *name, const char *text)
{
    return write_file(slot, name, text, strlen(text));
}

static char *repeat(char c, size_t n)
{
    char *s = malloc(n + 1);
    memset(s, c, n);
    s[n] = '\0';
    return s;
}

/* ---------------------------------------------------------------------------------------------
 * A Prometheus text-format reader, written from the format's specification
 * ------------------------------------------------------------------------------------------- */

#define MAX_SAMPLES 512
#define MAX_FAMILIES 96
#define MAX_LABELS 4

struct sample {
    char name[96];
    int n_labels;
    char key[MAX_LABELS][32];
    char val[MAX_LABELS][256];   /* unescaped */
    double value;
    int family;
};

struct page {
    struct sample s[MAX_SAMPLES];
    int n;
    char fam[MAX_FAMILIES][96];
    char type[MAX_FAMILIES][16];
    int n_fam;
    int errors;
};

static struct page page;

__attribute__((format(printf, 2, 3))) static void page_error(int line, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "  metrics line %d: ", line);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    page.errors++;
}

static int name_char(int c, int first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

static int valid_utf8(const char *s)
{
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        int n = *u < 0x80 ? 1 : (*u >> 5) == 6 ? 2 : (*u >> 4) == 14 ? 3 : (*u >> 3) == 30 ? 4 : 0;
        if (!n)
            return 0;
        for (int i = 1; i < n; i++)
            if ((u[i] & 0xC0) != 0x80)
                return 0;
        u += n;
    }
    return 1;
}

/* Does sample name s belong to family f of type t? */
static int belongs(const char *s, const char *f, const char *t)
{
    if (strcmp(t, "histogram") != 0)
        return strcmp(s, f) == 0;
    size_t n = strlen(f);
    return strncmp(s, f, n) == 0 &&
           (!strcmp(s + n, "_bucket") || !strcmp(s + n, "_sum") || !strcmp(s + n, "_count"));
}

static void parse_sample(const char *line, int ln, int cur)
{
    if (page.n == MAX_SAMPLES) {
        page_error(ln, "too many samples");
        return;
    }
    struct sample *s = &page.s[page.n];
    memset(s, 0, sizeof *s);
    const char *p = line;
    size_t n = 0;
    if (!name_char((unsigned char)*p, 1)) {
        page_error(ln, "bad metric name");
        return;
    }
    while (name_char((unsigned char)p[n], 0) && n + 1 < sizeof s->name)
        n++;
    memcpy(s->name, p, n);
    p += n;
    if (*p == '{') {
        p++;
        while (*p != '}') {
            if (s->n_labels == MAX_LABELS) {
                page_error(ln, "too many labels");
                return;
            }
            int k = s->n_labels++;
            n = 0;
            while (name_char((unsigned char)p[n], n == 0) && p[n] != ':' && n + 1 < sizeof s->key[k])
                n++;
            if (!n || p[n] != '=' || p[n + 1] != '"') {
                page_error(ln, "bad label in %s", line);
                return;
            }
            memcpy(s->key[k], p, n);
            p += n + 2;
            size_t o = 0;
            while (*p != '"') {
                char c = *p;
                if (!c) {
                    page_error(ln, "unterminated label value");
                    return;
                }
                if (c == '\\') {
                    p++;
                    c = *p == 'n' ? '\n' : *p == '\\' ? '\\' : *p == '"' ? '"' : 0;
                    if (!c) {
                        page_error(ln, "bad escape \\%c", *p);
                        return;
                    }
                }
                if (o + 1 < sizeof s->val[k])
                    s->val[k][o++] = c;
                p++;
            }
            if (!valid_utf8(s->val[k]))
                page_error(ln, "label value is not UTF-8");
            p++;
            if (*p == ',')
                p++;
            else if (*p != '}') {
                page_error(ln, "expected , or } in labels");
                return;
            }
        }
        p++;
    }
    if (*p != ' ') {
        page_error(ln, "expected a space before the value");
        return;
    }
    p++;
    char *end;
    if (!strcmp(p, "+Inf"))
        s->value = INFINITY;
    else if (!strcmp(p, "-Inf"))
        s->value = -INFINITY;
    else if (!strcmp(p, "NaN"))
        s->value = NAN;
    else {
        s->value = strtod(p, &end);
        if (end == p || *end) {
            page_error(ln, "bad value '%s'", p);
            return;
        }
    }
    if (cur < 0 || !belongs(s->name, page.fam[cur], page.type[cur])) {
        page_error(ln, "sample %s outside its family's block", s->name);
        return;
    }
    if (!strcmp(page.type[cur], "counter") &&
        (strlen(s->name) < 6 || strcmp(s->name + strlen(s->name) - 6, "_total") != 0))
        page_error(ln, "counter %s does not end in _total", s->name);
    s->family = cur;
    page.n++;
}

/* Parses text into page; returns the number of format errors. */
static int parse_page(const char *text)
{
    memset(&page, 0, sizeof page);
    size_t len = strlen(text);
    if (!len || text[len - 1] != '\n')
        page_error(0, "the page does not end with a line feed");
    char help_of[96] = "";
    int cur = -1, ln = 0;
    for (const char *p = text; *p;) {
        const char *e = strchr(p, '\n');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        char line[2048];
        if (n >= sizeof line)
            n = sizeof line - 1;
        memcpy(line, p, n);
        line[n] = '\0';
        p += n + (e ? 1 : 0);
        ln++;
        if (!strncmp(line, "# HELP ", 7)) {
            sscanf(line + 7, "%95s", help_of);
            for (int f = 0; f < page.n_fam; f++)
                if (!strcmp(page.fam[f], help_of))
                    page_error(ln, "second HELP for %s", help_of);
        } else if (!strncmp(line, "# TYPE ", 7)) {
            char name[96] = "", type[16] = "";
            sscanf(line + 7, "%95s %15s", name, type);
            if (strcmp(name, help_of) != 0)
                page_error(ln, "TYPE %s without HELP right before", name);
            if (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "histogram"))
                page_error(ln, "unknown type %s", type);
            for (int f = 0; f < page.n_fam; f++)
                if (!strcmp(page.fam[f], name))
                    page_error(ln, "second TYPE for %s", name);
            if (page.n_fam == MAX_FAMILIES) {
                page_error(ln, "too many families");
                continue;
            }
            cur = page.n_fam++;
            snprintf(page.fam[cur], sizeof page.fam[cur], "%s", name);
            snprintf(page.type[cur], sizeof page.type[cur], "%s", type);
            help_of[0] = '\0';
        } else if (line[0] == '#' || line[0] == '\0') {
            page_error(ln, "unexpected line '%s'", line);
        } else {
            parse_sample(line, ln, cur);
        }
    }
    return page.errors;
}

static const char *label(const struct sample *s, const char *key)
{
    for (int i = 0; i < s->n_labels; i++)
        if (!strcmp(s->key[i], key))
            return s->val[i];
    return NULL;
}

/* The value of the sample named name whose labels include the (key, value) pairs given, ending
 * with NULL; NaN when there is none. */
static double get(const char *name, ...)
{
    for (int i = 0; i < page.n; i++) {
        const struct sample *s = &page.s[i];
        if (strcmp(s->name, name) != 0)
            continue;
        va_list ap;
        va_start(ap, name);
        int ok = 1;
        for (const char *k = va_arg(ap, const char *); k; k = va_arg(ap, const char *)) {
            const char *v = va_arg(ap, const char *), *have = label(s, k);
            if (!have || strcmp(have, v) != 0)
                ok = 0;
        }
        va_end(ap);
        if (ok)
            return s->value;
    }
    return NAN;
}

static const char *type_of(const char *family)
{
    for (int f = 0; f < page.n_fam; f++)
        if (!strcmp(page.fam[f], family))
            return page.type[f];
    return "(missing)";
}

/* Buckets ascend in le, counts never fall, the last bucket is +Inf and equals _count. */
static void check_histogram(const char *family)
{
    char bucket[128], count[128];
    snprintf(bucket, sizeof bucket, "%s_bucket", family);
    snprintf(count, sizeof count, "%s_count", family);
    double prev_le = -INFINITY, prev = 0, last = NAN;
    int n = 0;
    for (int i = 0; i < page.n; i++) {
        const struct sample *s = &page.s[i];
        if (strcmp(s->name, bucket) != 0)
            continue;
        const char *le = label(s, "le");
        CHECK(le != NULL);
        if (!le)
            return;
        double x = !strcmp(le, "+Inf") ? INFINITY : strtod(le, NULL);
        CHECK(x > prev_le);
        CHECK(s->value >= prev);
        prev_le = x;
        prev = last = s->value;
        n++;
    }
    CHECK(n >= 2);
    CHECK(isinf(prev_le));
    CHECK_EQ_INT(last, get(count, NULL));
    CHECK(!isnan(get(bucket, NULL)));
}

/* ---------------------------------------------------------------------------------------------
 * Metrics
 * ------------------------------------------------------------------------------------------- */

static struct kiri_batcher_stats sample_stats(void)
{
    struct kiri_batcher_stats s;
    memset(&s, 0, sizeof s);
    s.running = 3;
    s.waiting = 2;
    s.kv_blocks_total = 100;
    s.kv_blocks_used = 25;
    s.kv_blocks_cached = 10;
    s.kv_block_size = 16;
    s.prefix_hit_blocks = 7;
    s.steps = 1000;
    s.preemptions = 4;
    s.last_batch_tokens = 37;
    s.last_batch_seqs = 3;
    s.peak_batch_seqs = 4;
    s.spec_drafted[KIRI_SPEC_NGRAM] = 50;
    s.spec_accepted[KIRI_SPEC_NGRAM] = 30;
    return s;
}

static const struct {
    const char *name, *type;
} families[] = {
    {"kiri_requests_total", "counter"},
    {"kiri_prompt_tokens_total", "counter"},
    {"kiri_generation_tokens_total", "counter"},
    {"kiri_prompt_cached_tokens_total", "counter"},
    {"kiri_auth_failures_total", "counter"},
    {"kiri_client_disconnects_total", "counter"},
    {"kiri_time_to_first_token_seconds", "histogram"},
    {"kiri_inter_token_latency_seconds", "histogram"},
    {"kiri_e2e_request_latency_seconds", "histogram"},
    {"kiri_requests_running", "gauge"},
    {"kiri_requests_waiting", "gauge"},
    {"kiri_kv_blocks_capacity", "gauge"},
    {"kiri_kv_blocks_used", "gauge"},
    {"kiri_kv_blocks_cached", "gauge"},
    {"kiri_kv_block_size_tokens", "gauge"},
    {"kiri_kv_cache_usage_ratio", "gauge"},
    {"kiri_state_slots_capacity", "gauge"},
    {"kiri_spec_state_slots", "gauge"},
    {"kiri_state_slots_used", "gauge"},
    {"kiri_state_bytes", "gauge"},
    {"kiri_state_snapshots_capacity", "gauge"},
    {"kiri_state_snapshots_used", "gauge"},
    {"kiri_state_snapshot_bytes", "gauge"},
    {"kiri_state_snapshot_hits_total", "counter"},
    {"kiri_state_snapshot_misses_total", "counter"},
    {"kiri_prefix_cache_hit_blocks_total", "counter"},
    {"kiri_batch_size_tokens", "gauge"},
    {"kiri_batch_size_sequences", "gauge"},
    {"kiri_batch_size_sequences_peak", "gauge"},
    {"kiri_batch_steps_total", "counter"},
    {"kiri_preemptions_total", "counter"},
    {"kiri_spec_draft_tokens_total", "counter"},
    {"kiri_spec_accepted_tokens_total", "counter"},
    {"vllm:num_requests_running", "gauge"},
    {"vllm:num_requests_waiting", "gauge"},
    {"vllm:kv_cache_usage_perc", "gauge"},
    {"vllm:gpu_cache_usage_perc", "gauge"},
    {"vllm:cache_config_info", "gauge"},
    {"vllm:prompt_tokens_total", "counter"},
    {"vllm:generation_tokens_total", "counter"},
    {"vllm:num_preemptions_total", "counter"},
    {"vllm:prefix_cache_queries_total", "counter"},
    {"vllm:prefix_cache_hits_total", "counter"},
};

static void test_metrics_render(void)
{
    struct kiri_metrics *m = NULL;
    CHECK_EQ_INT(kiri_metrics_init(&m), KIRI_OK);
    if (!m)
        return;
    for (int i = 0; i < 3; i++)
        kiri_metrics_request(m, "/v1/chat/completions", 200);
    kiri_metrics_request(m, "/v1/completions", 400);
    kiri_metrics_request(m, "/secret/../path?x=1", 404);   /* an unknown route: "other" */
    kiri_metrics_request(m, "other", 404);
    kiri_metrics_request(m, NULL, 404);
    kiri_metrics_request(m, "/v1/models", 999);            /* out of range: status "0" */
    kiri_metrics_request(m, "/health", 200);
    kiri_metrics_tokens(m, 100, 20, 64);
    kiri_metrics_tokens(m, -5, 3, 0);                       /* negative amounts are ignored */
    kiri_metrics_ttft(m, 0.005);
    kiri_metrics_ttft(m, 0.01);     /* on a bound: counted in le="0.01" (le means <=) */
    kiri_metrics_ttft(m, 0.3);
    kiri_metrics_ttft(m, 1000);     /* above every bound: only +Inf */
    kiri_metrics_ttft(m, NAN);      /* dropped */
    kiri_metrics_ttft(m, -1);       /* counted as 0 */
    for (int i = 0; i < 10; i++)
        kiri_metrics_inter_token(m, 0.02);
    kiri_metrics_e2e(m, 2.0);
    kiri_metrics_auth_failure(m);
    kiri_metrics_auth_failure(m);
    kiri_metrics_client_disconnect(m);

    struct kiri_batcher_stats st = sample_stats();
    const char *model = "llama \"3\" \\ q4\nx\xff";
    char *text = kiri_metrics_render(m, &st, model);
    CHECK(text != NULL);
    if (!text) {
        kiri_metrics_free(m);
        return;
    }
    CHECK_EQ_INT(parse_page(text), 0);
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        CHECK_STR(type_of(families[i].name), families[i].type);
    CHECK_EQ_INT(page.n_fam, sizeof families / sizeof families[0]);

    CHECK_EQ_INT(get("kiri_requests_total", "endpoint", "/v1/chat/completions", "status", "200", NULL), 3);
    CHECK_EQ_INT(get("kiri_requests_total", "endpoint", "/v1/completions", "status", "400", NULL), 1);
    CHECK_EQ_INT(get("kiri_requests_total", "endpoint", "other", "status", "404", NULL), 3);
    CHECK_EQ_INT(get("kiri_requests_total", "endpoint", "/v1/models", "status", "0", NULL), 1);
    CHECK_EQ_INT(get("kiri_requests_total", "endpoint", "/health", "status", "200", NULL), 1);
    CHECK(strstr(text, "/secret") == NULL);
    CHECK_EQ_INT(get("kiri_prompt_tokens_total", NULL), 100);
    CHECK_EQ_INT(get("kiri_generation_tokens_total", NULL), 23);
    CHECK_EQ_INT(get("kiri_prompt_cached_tokens_total", NULL), 64);
    CHECK_EQ_INT(get("kiri_auth_failures_total", NULL), 2);
    CHECK_EQ_INT(get("kiri_client_disconnects_total", NULL), 1);

    check_histogram("kiri_time_to_first_token_seconds");
    check_histogram("kiri_inter_token_latency_seconds");
    check_histogram("kiri_e2e_request_latency_seconds");
    CHECK_EQ_INT(get("kiri_time_to_first_token_seconds_count", NULL), 5);
    CHECK_NEAR(get("kiri_time_to_first_token_seconds_sum", NULL), 1000.315, 1e-9);
    CHECK_EQ_INT(get("kiri_time_to_first_token_seconds_bucket", "le", "0.01", NULL), 3);
    CHECK_EQ_INT(get("kiri_time_to_first_token_seconds_bucket", "le", "0.25", NULL), 3);
    CHECK_EQ_INT(get("kiri_time_to_first_token_seconds_bucket", "le", "0.5", NULL), 4);
    CHECK_EQ_INT(get("kiri_time_to_first_token_seconds_bucket", "le", "160", NULL), 4);
    CHECK_EQ_INT(get("kiri_time_to_first_token_seconds_bucket", "le", "+Inf", NULL), 5);
    CHECK_EQ_INT(get("kiri_inter_token_latency_seconds_bucket", "le", "0.01", NULL), 0);
    CHECK_EQ_INT(get("kiri_inter_token_latency_seconds_bucket", "le", "0.02", NULL), 10);
    CHECK_NEAR(get("kiri_inter_token_latency_seconds_sum", NULL), 0.2, 1e-12);
    CHECK_EQ_INT(get("kiri_e2e_request_latency_seconds_bucket", "le", "1", NULL), 0);
    CHECK_EQ_INT(get("kiri_e2e_request_latency_seconds_bucket", "le", "2.5", NULL), 1);

    CHECK_EQ_INT(get("kiri_requests_running", NULL), 3);
    CHECK_EQ_INT(get("kiri_requests_waiting", NULL), 2);
    CHECK_EQ_INT(get("kiri_kv_blocks_capacity", NULL), 100);
    CHECK_EQ_INT(get("kiri_kv_blocks_used", NULL), 25);
    CHECK_EQ_INT(get("kiri_kv_blocks_cached", NULL), 10);
    CHECK_EQ_INT(get("kiri_kv_block_size_tokens", NULL), 16);
    CHECK_NEAR(get("kiri_kv_cache_usage_ratio", NULL), 0.25, 0);
    CHECK_EQ_INT(get("kiri_prefix_cache_hit_blocks_total", NULL), 7);
    CHECK_EQ_INT(get("kiri_batch_size_tokens", NULL), 37);
    CHECK_EQ_INT(get("kiri_batch_size_sequences", NULL), 3);
    CHECK_EQ_INT(get("kiri_batch_size_sequences_peak", NULL), 4);
    CHECK_EQ_INT(get("kiri_batch_steps_total", NULL), 1000);
    CHECK_EQ_INT(get("kiri_preemptions_total", NULL), 4);
    CHECK_EQ_INT(get("kiri_spec_draft_tokens_total", "drafter", "ngram", NULL), 50);
    CHECK_EQ_INT(get("kiri_spec_accepted_tokens_total", "drafter", "ngram", NULL), 30);

    /* The model name comes back unchanged through the escapes, the invalid byte as '?'. */
    const char *want = "llama \"3\" \\ q4\nx?";
    CHECK_EQ_INT(get("vllm:num_requests_running", "engine", "0", "model_name", want, NULL), 3);
    CHECK_EQ_INT(get("vllm:num_requests_waiting", "model_name", want, NULL), 2);
    CHECK_NEAR(get("vllm:kv_cache_usage_perc", "model_name", want, NULL), 0.25, 0);
    CHECK_NEAR(get("vllm:gpu_cache_usage_perc", "model_name", want, NULL), 0.25, 0);
    CHECK_EQ_INT(get("vllm:cache_config_info", "block_size", "16", "num_gpu_blocks", "100", NULL), 1);
    CHECK_EQ_INT(get("vllm:prompt_tokens_total", "model_name", want, NULL), 100);
    CHECK_EQ_INT(get("vllm:generation_tokens_total", "model_name", want, NULL), 23);
    CHECK_EQ_INT(get("vllm:num_preemptions_total", "model_name", want, NULL), 4);
    CHECK_EQ_INT(get("vllm:prefix_cache_queries_total", "model_name", want, NULL), 100);
    CHECK_EQ_INT(get("vllm:prefix_cache_hits_total", "model_name", want, NULL), 64);
    /* And on the wire the escapes are exactly \" \\ \n. */
    CHECK(strstr(text, "model_name=\"llama \\\"3\\\" \\\\ q4\\nx?\"") != NULL);
    kiri_mem_free(text);

    /* No statistics, no model name: the families are still there, with zeros. */
    text = kiri_metrics_render(m, NULL, NULL);
    CHECK(text != NULL);
    if (text) {
        CHECK_EQ_INT(parse_page(text), 0);
        CHECK_EQ_INT(get("vllm:num_requests_running", "model_name", "", NULL), 0);
        CHECK_EQ_INT(get("vllm:kv_cache_usage_perc", NULL), 0);
        CHECK_EQ_INT(get("kiri_kv_cache_usage_ratio", NULL), 0);
        kiri_mem_free(text);
    }
    /* More blocks used than exist (a racing snapshot) still reads as at most 1. */
    st.kv_blocks_used = 150;
    text = kiri_metrics_render(m, &st, "m");
    if (text) {
        CHECK_EQ_INT(parse_page(text), 0);
        CHECK_NEAR(get("vllm:kv_cache_usage_perc", NULL), 1.0, 0);
        kiri_mem_free(text);
    }
    kiri_metrics_free(m);

    /* NULL handles are no-ops. */
    kiri_metrics_request(NULL, "/health", 200);
    kiri_metrics_ttft(NULL, 1);
    CHECK(kiri_metrics_render(NULL, NULL, NULL) == NULL);
    kiri_metrics_free(NULL);
}

#define N_THREADS 4
#define N_ITER 20000

static void hammer(void *arg)
{
    struct kiri_metrics *m = arg;
    for (int i = 0; i < N_ITER; i++) {
        kiri_metrics_request(m, i % 2 ? "/v1/completions" : "/v1/chat/completions", 200);
        kiri_metrics_tokens(m, 1, 2, 3);
        kiri_metrics_ttft(m, 0.05);
        kiri_metrics_inter_token(m, 0.01);
        kiri_metrics_e2e(m, 1.0);
        kiri_metrics_auth_failure(m);
        kiri_metrics_client_disconnect(m);
    }
}

static void test_metrics_concurrency(void)
{
    struct kiri_metrics *m = NULL;
    CHECK_EQ_INT(kiri_metrics_init(&m), KIRI_OK);
    if (!m)
        return;
    struct kiri_thread *t[N_THREADS];
    for (int i = 0; i < N_THREADS; i++)
        CHECK_EQ_INT(kiri_platform_thread_start(&t[i], hammer, m), KIRI_OK);
    /* A render racing the writers must still produce a well-formed page. */
    char *mid = kiri_metrics_render(m, NULL, "m");
    CHECK(mid != NULL);
    if (mid) {
        CHECK_EQ_INT(parse_page(mid), 0);
        kiri_mem_free(mid);
    }
    for (int i = 0; i < N_THREADS; i++)
        kiri_platform_thread_join(t[i]);
    char *text = kiri_metrics_render(m, NULL, "m");
    CHECK(text != NULL);
    if (text) {
        const long total = (long)N_THREADS * N_ITER;
        CHECK_EQ_INT(parse_page(text), 0);
        CHECK_EQ_INT(get("kiri_requests_total", "endpoint", "/v1/completions", "status", "200", NULL), total / 2);
        CHECK_EQ_INT(get("kiri_requests_total", "endpoint", "/v1/chat/completions", "status", "200", NULL),
                     total / 2);
        CHECK_EQ_INT(get("kiri_prompt_tokens_total", NULL), total);
        CHECK_EQ_INT(get("kiri_generation_tokens_total", NULL), 2 * total);
        CHECK_EQ_INT(get("kiri_prompt_cached_tokens_total", NULL), 3 * total);
        CHECK_EQ_INT(get("kiri_auth_failures_total", NULL), total);
        CHECK_EQ_INT(get("kiri_client_disconnects_total", NULL), total);
        CHECK_EQ_INT(get("kiri_time_to_first_token_seconds_count", NULL), total);
        CHECK_EQ_INT(get("kiri_time_to_first_token_seconds_bucket", "le", "0.05", NULL), total);
        CHECK_EQ_INT(get("kiri_time_to_first_token_seconds_bucket", "le", "0.025", NULL), 0);
        CHECK_EQ_INT(get("kiri_inter_token_latency_seconds_count", NULL), total);
        CHECK_EQ_INT(get("kiri_e2e_request_latency_seconds_count", NULL), total);
        CHECK_NEAR(get("kiri_e2e_request_latency_seconds_sum", NULL), (double)total, 0);
        kiri_mem_free(text);
    }
    kiri_metrics_free(m);
}

/* Every allocation in init and render fails in turn; each failure is reported cleanly. */
static void test_metrics_nomem(void)
{
    struct kiri_batcher_stats st = sample_stats();
    int done = 0;
    long n;
    for (n = 0; n < 100 && !done; n++) {
        kiri_mem_fail_after(n);
        struct kiri_metrics *m = NULL;
        int rc = kiri_metrics_init(&m);
        if (rc != KIRI_OK) {
            kiri_mem_fail_after(-1);
            CHECK_EQ_INT(rc, KIRI_E_NOMEM);
            CHECK(m == NULL);
            continue;
        }
        for (int i = 0; i < 300; i++)   /* enough request series to make the text grow */
            kiri_metrics_request(m, "/v1/completions", 100 + i);
        char *text = kiri_metrics_render(m, &st, "model");
        kiri_mem_fail_after(-1);
        if (text) {
            done = 1;
            CHECK_EQ_INT(parse_page(text), 0);
            kiri_mem_free(text);
        }
        kiri_metrics_free(m);
    }
    kiri_mem_fail_after(-1);
    CHECK(done);
    CHECK(n >= 4);   /* init (2) plus the model label and at least one text buffer */
}

/* ---------------------------------------------------------------------------------------------
 * Auth
 * ------------------------------------------------------------------------------------------- */

#define KEY1 "sk-live-0123456789abcdef"
#define KEY2 "key-two-ABCDEFGH"

static void test_auth_check(void)
{
    tmp_open();
    char *k512 = repeat('k', 512);
    char content[2048];
    snprintf(content, sizeof content,
             "\xEF\xBB\xBF# production keys\r\n  " KEY1 "  \r\n\r\n\t# an indented comment\n" KEY2 "\n%s", k512);
    const char *path = write_text(0, "keys", content);
    struct kiri_auth *a = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_auth_load(path, &a, &info), KIRI_OK);
    if (!a) {
        fprintf(stderr, "  %s\n", info.message);
        free(k512);
        return;
    }
    static const struct {
        const char *header;
        int want;
    } cases[] = {
        {NULL, 0},
        {"", 0},
        {"Bearer " KEY1, 1},
        {"bearer " KEY1, 1},
        {"BEARER\t" KEY1, 1},
        {"Bearer     " KEY1 "   ", 1},       /* H19: correct key with extra spaces */
        {"  Bearer \t " KEY1, 1},
        {"Bearer " KEY2, 1},
        {KEY1, 0},                             /* H19: "Bearer" missing */
        {"Basic " KEY1, 0},
        {"Bearer" KEY1, 0},
        {"Bearer", 0},                         /* H19: no key */
        {"Bearer    ", 0},
        {"Bearer sk-live-0123456789abcde", 0}, /* a prefix of a key */
        {"Bearer " KEY1 "0", 0},               /* a key plus one byte */
        {"Bearer sk-live-0123456789abcdeF", 0},/* H19: wrong key (one letter's case) */
        {"Bearer sk-live-01234567 89abcdef", 0},/* H19: whitespace inside */
        {"Bearer Bearer " KEY1, 0},
        {"Bearer " KEY1 "\n", 0},
        {"Bearer wrong-key-entirely", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = kiri_auth_check(a, cases[i].header);
        if (got != cases[i].want)
            fprintf(stderr, "  auth case %zu: '%s'\n", i, cases[i].header ? cases[i].header : "(null)");
        CHECK_EQ_INT(got, cases[i].want);
    }
    /* H19: a 10 KB key; the longest key, one byte less and one more; a long key padded past 10 KB. */
    char *big = malloc(20000);
    snprintf(big, 20000, "Bearer %s", k512);
    CHECK_EQ_INT(kiri_auth_check(a, big), 1);
    big[strlen(big) - 1] = '\0';
    CHECK_EQ_INT(kiri_auth_check(a, big), 0);
    snprintf(big, 20000, "Bearer %sk", k512);
    CHECK_EQ_INT(kiri_auth_check(a, big), 0);
    char *k10 = repeat('k', 10240);
    snprintf(big, 20000, "Bearer %s", k10);
    CHECK_EQ_INT(kiri_auth_check(a, big), 0);
    snprintf(big, 20000, "Bearer %s", k10);
    memcpy(big + 7, KEY1, strlen(KEY1));   /* a real key followed by 10 KB of junk */
    CHECK_EQ_INT(kiri_auth_check(a, big), 0);
    CHECK_EQ_INT(kiri_auth_check(NULL, "Bearer " KEY1), 0);   /* no key set: fail closed */
    free(big);
    free(k10);
    free(k512);
    kiri_auth_free(a);
    kiri_auth_free(NULL);
    unlink(path);

    /* Exactly 1024 keys load; the last one matches. */
    size_t cap = 1024 * 32;
    char *many = malloc(cap);
    size_t o = 0;
    for (int i = 0; i < 1024; i++)
        o += (size_t)snprintf(many + o, cap - o, "key-number-%04d\n", i);
    path = write_text(0, "many", many);
    a = NULL;
    CHECK_EQ_INT(kiri_auth_load(path, &a, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_auth_check(a, "Bearer key-number-1023"), 1);
    CHECK_EQ_INT(kiri_auth_check(a, "Bearer key-number-1024"), 0);
    kiri_auth_free(a);
    unlink(path);
    free(many);
    tmp_close();
}

static void test_auth_load_errors(void)
{
    tmp_open();
    static const struct {
        const char *content;
        int code;
        const char *want;     /* in the message */
        const char *secret;   /* never in the message */
    } cases[] = {
        {"good-key-12345678\nbad key-with-space\n", KIRI_E_INVALID_ARG, "line 2: the key has whitespace inside",
         "bad key"},
        {"good-key-12345678\n\tbad\tkey-with-tab\n", KIRI_E_INVALID_ARG, "whitespace inside", "key-with-tab"},
        {"short\n", KIRI_E_INVALID_ARG, "line 1: a key must be 8..512 bytes, this one has 5", "short"},
        {"# only comments\n\n   \n", KIRI_E_INVALID_ARG, "no keys", NULL},
        {"", KIRI_E_INVALID_ARG, "no keys", NULL},
        {"key\x01with-control\n", KIRI_E_INVALID_ARG, "outside printable ASCII", "with-control"},
        {"\xD0\xBA\xD0\xBB\xD1\x8E\xD1\x87-key-1234\n", KIRI_E_INVALID_ARG, "outside printable ASCII", "key-1234"},
    };
    struct kiri_status_info info;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = write_text(0, "keys", cases[i].content);
        struct kiri_auth *a = (struct kiri_auth *)&info;   /* must stay as it is on failure */
        CHECK_EQ_INT(kiri_auth_load(path, &a, &info), cases[i].code);
        CHECK(a == (struct kiri_auth *)&info);
        CHECK(strstr(info.message, cases[i].want) != NULL);
        if (cases[i].secret)
            CHECK(strstr(info.message, cases[i].secret) == NULL);
        if (!strstr(info.message, cases[i].want))
            fprintf(stderr, "  auth load case %zu: %s\n", i, info.message);
        unlink(path);
    }
    struct kiri_auth *a = NULL;
    /* A 513-byte key. */
    char *k = repeat('x', 513);
    const char *path = write_text(0, "keys", k);
    CHECK_EQ_INT(kiri_auth_load(path, &a, &info), KIRI_E_INVALID_ARG);
    CHECK(strstr(info.message, "this one has 513") != NULL);
    CHECK(strstr(info.message, "xxxxxxxx") == NULL);
    free(k);
    /* 1025 keys. */
    size_t cap = 1025 * 32, o = 0;
    char *many = malloc(cap);
    for (int i = 0; i < 1025; i++)
        o += (size_t)snprintf(many + o, cap - o, "key-number-%04d\n", i);
    write_text(0, "keys", many);
    CHECK_EQ_INT(kiri_auth_load(path, &a, &info), KIRI_E_INVALID_ARG);
    CHECK(strstr(info.message, "more than 1024 keys") != NULL);
    free(many);
    /* Larger than 1 MiB. */
    char *huge = repeat('#', ((size_t)1 << 20) + 1);
    write_text(0, "keys", huge);
    CHECK_EQ_INT(kiri_auth_load(path, &a, &info), KIRI_E_INVALID_ARG);
    CHECK(strstr(info.message, "larger than 1 MiB") != NULL);
    huge[(size_t)1 << 20] = '\0';   /* exactly 1 MiB of comment: allowed, but holds no key */
    write_text(0, "keys", huge);
    CHECK_EQ_INT(kiri_auth_load(path, &a, &info), KIRI_E_INVALID_ARG);
    CHECK(strstr(info.message, "no keys") != NULL);
    free(huge);
    unlink(path);
    /* Missing file, a directory, no path. */
    CHECK_EQ_INT(kiri_auth_load("/nonexistent/kiri/keys", &a, &info), KIRI_E_IO);
    CHECK(strstr(info.message, "cannot open") != NULL);
    CHECK_EQ_INT(kiri_auth_load(tmp_dir, &a, &info), KIRI_E_IO);
    CHECK_EQ_INT(kiri_auth_load(NULL, &a, &info), KIRI_E_INVALID_ARG);
    CHECK(a == NULL);
    tmp_close();
}

static void test_auth_nomem(void)
{
    tmp_open();
    const char *path = write_text(0, "keys", KEY1 "\n" KEY2 "\n");
    int done = 0;
    long n;
    for (n = 0; n < 20 && !done; n++) {
        struct kiri_auth *a = NULL;
        struct kiri_status_info info;
        kiri_mem_fail_after(n);
        int rc = kiri_auth_load(path, &a, &info);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK) {
            done = 1;
            CHECK_EQ_INT(kiri_auth_check(a, "Bearer " KEY2), 1);
            kiri_auth_free(a);
        } else {
            CHECK_EQ_INT(rc, KIRI_E_NOMEM);
            CHECK(a == NULL);
            CHECK(strstr(info.message, "out of memory") != NULL);
        }
    }
    CHECK(done);
    CHECK_EQ_INT(n, 5);   /* the file buffer, the record, the lengths, the slots; then success */
    unlink(path);
    tmp_close();
}

/* ---------------------------------------------------------------------------------------------
 * Config
 * ------------------------------------------------------------------------------------------- */

static struct kiri_server_config cfg;
static char err[512];

/* Loads from NULL-terminated lists; a non-NULL file is written and passed as --config first. */
static int load(const char *const *args, const char *const *env, const char *file)
{
    char *argv[32];
    int argc = 0;
    const char *path = NULL;
    if (file) {
        path = write_text(1, "kiri.conf", file);
        argv[argc++] = (char *)"--config";
        argv[argc++] = (char *)path;
    }
    for (; args && *args; args++)
        argv[argc++] = (char *)*args;
    argv[argc] = NULL;
    char *envp[16];
    int n = 0;
    for (; env && *env; env++)
        envp[n++] = (char *)*env;
    envp[n] = NULL;
    err[0] = '\0';
    int rc = kiri_server_config_load(&cfg, argc, argv, envp, err, sizeof err);
    if (path)
        unlink(path);
    return rc;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

static void test_config_defaults(void)
{
    CHECK_EQ_INT(load(ARGS("-m", "models/tiny.gguf"), NULL, NULL), 0);
    CHECK_STR(err, "");
    CHECK_STR(cfg.model, "models/tiny.gguf");
    CHECK_STR(cfg.model_alias, "tiny.gguf");
    CHECK_STR(cfg.host, "127.0.0.1");
    CHECK_EQ_INT(cfg.port, 8080);
    CHECK_EQ_INT(cfg.threads, kiri_platform_n_cpus());
    CHECK_STR(cfg.backend, "auto");
    CHECK_EQ_INT(cfg.ctx, 0);
    CHECK_EQ_INT(cfg.kv_memory, 0);
    CHECK_STR(cfg.kv_type, "f16");
    CHECK_EQ_INT(cfg.parallel, 8);
    CHECK_EQ_INT(cfg.chunk, 64);
    CHECK_EQ_INT(cfg.queue, 64);
    CHECK_STR(cfg.spec, "none");
    CHECK_EQ_INT(cfg.spec_max, KIRI_SPEC_DEFAULT_DRAFT);
    CHECK_EQ_INT(cfg.spec_max_seqs, 4);
    CHECK_STR(cfg.tls_cert, "");
    CHECK_STR(cfg.tls_key, "");
    CHECK_STR(cfg.api_key_file, "");
    CHECK_EQ_INT(cfg.max_body, 4 << 20);
    CHECK_EQ_INT(cfg.max_prompt_tokens, 0);
    CHECK_NEAR(cfg.request_timeout, 600, 0);
    CHECK_NEAR(cfg.idle_timeout, 10, 0);
    CHECK_EQ_INT(cfg.http_threads, 64);
    CHECK_EQ_INT(cfg.log_prompts, 0);
    CHECK_STR(cfg.config_file, "");

    /* Every flag form: --name=value, attached short values, last one wins, NULL envp. */
    char *argv[] = {"-mx.gguf", "-t4", "--port=9000", "--port", "9001", "--alias", "my-model",
                    "--backend", "CPU", "--kv-type", "Q8_0", "--tls-cert", "c.pem", "--tls-key=k.pem",
                    "--ctx", "4096", "--max-prompt-tokens", "4095", "--queue", "0", "--log-prompts", NULL};
    CHECK_EQ_INT(kiri_server_config_load(&cfg, 21, argv, NULL, err, sizeof err), 0);
    CHECK_STR(err, "");
    CHECK_STR(cfg.model, "x.gguf");
    CHECK_EQ_INT(cfg.threads, 4);
    CHECK_EQ_INT(cfg.port, 9001);
    CHECK_STR(cfg.model_alias, "my-model");
    CHECK_STR(cfg.backend, "cpu");
    CHECK_STR(cfg.kv_type, "q8_0");
    CHECK_STR(cfg.tls_cert, "c.pem");
    CHECK_STR(cfg.tls_key, "k.pem");
    CHECK_EQ_INT(cfg.ctx, 4096);
    CHECK_EQ_INT(cfg.max_prompt_tokens, 4095);
    CHECK_EQ_INT(cfg.queue, 0);
    CHECK_EQ_INT(cfg.log_prompts, 1);
}

static void test_config_precedence(void)
{
    tmp_open();
    const char *file = "port = 1111\nthreads = 3\nhost = 0.0.0.0\nparallel = 4\nmodel = file.gguf\n"
                       "log-prompts = no\n";
    /* flag > environment > file > default; an empty variable counts as unset. */
    CHECK_EQ_INT(load(ARGS("--port", "3333"),
                      ARGS("KIRI_PORT=2222", "KIRI_THREADS=5", "KIRI_HOST=", "KIRI_LOG_PROMPTS=yes",
                           "KIRIX_PARALLEL=9", "PATH=/bin", "KIRI_UNKNOWN_THING=1"),
                      file), 0);
    CHECK_STR(err, "");
    CHECK_EQ_INT(cfg.port, 3333);
    CHECK_EQ_INT(cfg.threads, 5);
    CHECK_STR(cfg.host, "0.0.0.0");
    CHECK_EQ_INT(cfg.parallel, 4);
    CHECK_EQ_INT(cfg.chunk, 64);
    CHECK_STR(cfg.model, "file.gguf");
    CHECK_EQ_INT(cfg.log_prompts, 1);
    CHECK(strstr(cfg.config_file, "kiri.conf") != NULL);

    /* The file named by KIRI_CONFIG; --config beats it. */
    const char *p1 = write_text(0, "a.conf", "model = a.gguf\n");
    const char *p2 = write_text(2, "b.conf", "model = b.gguf\n");
    char env1[300];
    snprintf(env1, sizeof env1, "KIRI_CONFIG=%s", p1);
    CHECK_EQ_INT(load(NULL, ARGS(env1), NULL), 0);
    CHECK_STR(cfg.model, "a.gguf");
    CHECK_STR(cfg.config_file, p1);
    CHECK_EQ_INT(load(ARGS("--config", p2), ARGS(env1), NULL), 0);
    CHECK_STR(cfg.model, "b.gguf");
    CHECK_STR(cfg.config_file, p2);
    /* An explicit empty --config reads no file, whatever KIRI_CONFIG says. */
    CHECK_EQ_INT(load(ARGS("--config", "", "-m", "z.gguf"), ARGS(env1), NULL), 0);
    CHECK_STR(cfg.model, "z.gguf");
    CHECK_STR(cfg.config_file, "");
    /* The environment beats the file, the flag beats the environment, for a boolean too. */
    CHECK_EQ_INT(load(ARGS("--log-prompts"), ARGS("KIRI_LOG_PROMPTS=0", "KIRI_MODEL=env.gguf"),
                      "log_prompts = TRUE\nmodel = f.gguf\n"), 0);
    CHECK_EQ_INT(cfg.log_prompts, 1);
    CHECK_STR(cfg.model, "env.gguf");
    CHECK_EQ_INT(load(NULL, ARGS("KIRI_LOG_PROMPTS=off"), "log_prompts = TRUE\nmodel = f.gguf\n"), 0);
    CHECK_EQ_INT(cfg.log_prompts, 0);
    CHECK_EQ_INT(load(ARGS("--log-prompts=false"), NULL, "log_prompts = on\nmodel = f.gguf\n"), 0);
    CHECK_EQ_INT(cfg.log_prompts, 0);
    unlink(p1);
    unlink(p2);
    tmp_close();
}

static void test_config_sizes(void)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } cases[] = {
        {"0", 0}, {"1024", 1024}, {"7B", 7}, {"4K", 4096}, {"4k", 4096}, {"4KB", 4096},
        {"4KiB", 4096}, {"4kib", 4096}, {"0.5K", 512}, {"512M", (uint64_t)512 << 20},
        {"1.5G", (uint64_t)3 << 29}, {"1g", (uint64_t)1 << 30}, {"1GiB", (uint64_t)1 << 30},
        {"1T", (uint64_t)1 << 40}, {"0.25T", (uint64_t)1 << 38}, {"007M", (uint64_t)7 << 20},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_EQ_INT(load(ARGS("-m", "x", "--kv-memory", cases[i].text), NULL, NULL), 0);
        CHECK_EQ_INT(cfg.kv_memory, cases[i].bytes);
        if (cfg.kv_memory != cases[i].bytes)
            fprintf(stderr, "  size case '%s'\n", cases[i].text);
    }
    CHECK_EQ_INT(load(ARGS("-m", "x"), ARGS("KIRI_MAX_BODY=16M", "KIRI_KV_MEMORY=2G"), NULL), 0);
    CHECK_EQ_INT(cfg.max_body, 16 << 20);
    CHECK_EQ_INT(cfg.kv_memory, (uint64_t)2 << 30);
    CHECK_EQ_INT(load(ARGS("-m", "x", "--max-body", "1K"), NULL, NULL), 0);
    CHECK_EQ_INT(cfg.max_body, 1024);
    CHECK_EQ_INT(load(ARGS("-m", "x", "--max-body", "1G"), NULL, NULL), 0);
    CHECK_EQ_INT(cfg.max_body, 1 << 30);
}

static void test_config_file_syntax(void)
{
    tmp_open();
    /* A byte order mark, CRLF, comments, quotes, '_' for '-', whitespace everywhere. */
    const char *file = "\xEF\xBB\xBF# kiri settings\r\n"
                       "\r\n"
                       "   # indented comment\r\n"
                       "model = /models/x.gguf   # trailing comment\r\n"
                       "alias = \"my model # 1\"  # a comment after quotes\r\n"
                       "\tkv_memory\t=\t1G\t\r\n"
                       "host=\"::1\"\r\n"
                       "api-key-file = /etc/kiri/keys#not-a-comment\r\n"
                       "request_timeout = 1.5e2\r\n"
                       "tls-cert = \"  spaced.pem  \"\r\n"
                       "tls-key = k.pem";   /* no final line feed */
    CHECK_EQ_INT(load(NULL, NULL, file), 0);
    CHECK_STR(err, "");
    CHECK_STR(cfg.model, "/models/x.gguf");
    CHECK_STR(cfg.model_alias, "my model # 1");
    CHECK_EQ_INT(cfg.kv_memory, (uint64_t)1 << 30);
    CHECK_STR(cfg.host, "::1");
    CHECK_STR(cfg.api_key_file, "/etc/kiri/keys#not-a-comment");
    CHECK_NEAR(cfg.request_timeout, 150, 0);
    CHECK_STR(cfg.tls_cert, "  spaced.pem  ");
    CHECK_STR(cfg.tls_key, "k.pem");
    /* An empty file and a file of comments are fine. */
    CHECK_EQ_INT(load(ARGS("-m", "x"), NULL, ""), 0);
    CHECK_EQ_INT(load(ARGS("-m", "x"), NULL, "# nothing\n\n"), 0);
    /* An alias longer than the field when derived from the model's file name is cut, not refused. */
    char longname[400];
    memset(longname, 'n', sizeof longname);
    memcpy(longname, "dir/", 4);
    longname[sizeof longname - 1] = '\0';
    CHECK_EQ_INT(load(ARGS("-m", longname), NULL, NULL), 0);
    CHECK_EQ_INT(strlen(cfg.model_alias), sizeof cfg.model_alias - 1);
    tmp_close();
}

static void test_config_errors(void)
{
    tmp_open();
    static const struct {
        const char *args[8];
        const char *env[4];
        const char *file;
        const char *want;
    } cases[] = {
        {{"-m", "x", "--port", "70000"}, {0}, NULL, "--port 70000: must be 1..65535 (from the command line)"},
        {{"-m", "x"}, {"KIRI_PORT=70000"}, NULL, "--port 70000: must be 1..65535 (from KIRI_PORT)"},
        {{"-m", "x"}, {0}, "\n# c\nport = 70000\n", "--port 70000: must be 1..65535 (from "},
        {{"-m", "x"}, {0}, "\n# c\nport = 70000\n", "kiri.conf line 3)"},
        {{"-m", "x", "--port", "80a"}, {0}, NULL, "--port 80a: not an integer (from the command line)"},
        {{"-m", "x", "--port", ""}, {0}, NULL, "--port '': not an integer"},
        {{"-m", "x", "--port", " 80"}, {0}, NULL, "not an integer"},
        {{"-m", "x", "--port", "99999999999999999999999"}, {0}, NULL, "must be 1..65535"},
        {{"-m", "x", "--port"}, {0}, NULL, "--port needs a value (N)"},
        {{"-m", "x", "--prot", "1"}, {0}, NULL, "unknown option '--prot'"},
        {{"-m", "x", "--prot=1"}, {0}, NULL, "unknown option '--prot'"},
        {{"-x"}, {0}, NULL, "unknown option '-x'"},
        {{"--help"}, {0}, NULL, "unknown option '--help'"},
        {{"-m", "x", "stray"}, {0}, NULL, "unexpected argument 'stray'"},
        {{"-m", "x", "-"}, {0}, NULL, "unexpected argument '-'"},
        {{"-m", "x", "--"}, {0}, NULL, "unexpected argument '--'"},
        {{"-m", "x", "--threads", "0"}, {0}, NULL, "--threads 0: must be 1..1024"},
        {{"-m", "x", "--spec", "eagle"}, {0}, NULL, "--spec eagle"},
        {{"-m", "x", "--spec", "draft"}, {0}, NULL, "--spec draft needs --draft-model FILE"},
        {{"-m", "x", "--spec-max", "17"}, {0}, NULL, "--spec-max 17: must be 1..16"},
        {{"--models-dir", "d", "--draft-model", "y"}, {0}, NULL, "--draft-model drafts for the one model of --model"},
        {{"-m", "x", "-t", "2000"}, {0}, NULL, "--threads 2000: must be 1..1024"},
        {{"-m", "x", "--ctx", "-1"}, {0}, NULL, "--ctx -1: must be 0..16777216"},
        {{"-m", "x", "--parallel", "abc"}, {0}, NULL, "--parallel abc: not an integer"},
        {{"-m", "x", "--chunk", "0"}, {0}, NULL, "--chunk 0: must be 1..65536"},
        {{"-m", "x", "--http-threads", "1.5"}, {0}, NULL, "--http-threads 1.5: not an integer"},
        {{"-m", "x", "--kv-memory", "12X"}, {0}, NULL, "--kv-memory 12X: not a size"},
        {{"-m", "x", "--kv-memory", "-1G"}, {0}, NULL, "not a size"},
        {{"-m", "x", "--kv-memory", "1.5"}, {0}, NULL, "not a size"},
        {{"-m", "x", "--kv-memory", "1.G"}, {0}, NULL, "not a size"},
        {{"-m", "x", "--kv-memory", "G"}, {0}, NULL, "not a size"},
        {{"-m", "x", "--kv-memory", "1GB2"}, {0}, NULL, "not a size"},
        {{"-m", "x", "--kv-memory", "2T"}, {0}, NULL, "--kv-memory 2T: must be 0..1T bytes"},
        {{"-m", "x", "--kv-memory", "99999999999999999999G"}, {0}, NULL, "must be 0..1T bytes"},
        {{"-m", "x", "--kv-memory", "16777216T"}, {0}, NULL, "must be 0..1T bytes"},
        {{"-m", "x", "--max-body", "512"}, {0}, NULL, "--max-body 512: must be 1K..1G bytes"},
        {{"-m", "x"}, {"KIRI_MAX_BODY=2G"}, NULL, "--max-body 2G: must be 1K..1G bytes (from KIRI_MAX_BODY)"},
        {{"-m", "x", "--request-timeout", "nan"}, {0}, NULL, "--request-timeout nan: not a number of seconds"},
        {{"-m", "x", "--request-timeout", "inf"}, {0}, NULL, "not a number of seconds"},
        {{"-m", "x", "--request-timeout", "0x10"}, {0}, NULL, "not a number of seconds"},
        {{"-m", "x", "--request-timeout", "1e999"}, {0}, NULL, "must be more than 0 and at most 86400"},
        {{"-m", "x", "--request-timeout", "0"}, {0}, NULL, "--request-timeout 0: must be more than 0 and at most 86400"},
        {{"-m", "x", "--idle-timeout", "-1"}, {0}, NULL, "must be more than 0 and at most 3600"},
        {{"-m", "x", "--kv-type", "q4_0"}, {0}, NULL, "--kv-type q4_0: must be one of f16, f32, q8_0"},
        {{"-m", "x", "--backend", "metal"}, {0}, NULL, "--backend metal: must be one of auto, cpu, vulkan, cuda"},
        {{"-m", "x"}, {"KIRI_LOG_PROMPTS=maybe"}, NULL,
         "--log-prompts maybe: must be 1, 0, true, false, yes, no, on or off (from KIRI_LOG_PROMPTS)"},
        {{"-m", "x", "--log-prompts=perhaps"}, {0}, NULL, "--log-prompts perhaps: must be 1, 0"},
        {{"-m", "x", "--host", ""}, {0}, NULL, "--host '': must not be empty"},
        {{"-m", "x", "--alias", "0123456789012345678901234567890123456789012345678901234567890123456789"
                                "0123456789012345678901234567890123456789012345678901234567890123456789"},
         {0}, NULL, "longer than 127 bytes"},
        {{"--port", "8081"}, {0}, NULL, "--model is required"},
        {{"-m", "x", "--tls-cert", "c.pem"}, {0}, NULL, "--tls-cert and --tls-key must be given together"},
        {{"-m", "x", "--tls-key", "k.pem"}, {0}, NULL, "(only --tls-key is set)"},
        {{"-m", "x", "--ctx", "512", "--max-prompt-tokens", "512"}, {0}, NULL,
         "--max-prompt-tokens 512: must be less than --ctx 512"},
        /* Every source is validated, even a setting that a flag overrides. */
        {{"-m", "x", "--port", "80"}, {0}, "port = 0\n", "--port 0: must be 1..65535"},
        {{"-m", "x"}, {0}, "prot = 8080\n", "line 1: unknown key 'prot'"},
        {{"-m", "x"}, {0}, "-port = 8080\n", "line 1: unknown key '-port'"},
        {{"-m", "x"}, {0}, "m = x\n", "line 1: unknown key 'm'"},
        {{"-m", "x"}, {0}, "# c\n\nport 8080\n", "line 3: expected key = value"},
        {{"-m", "x"}, {0}, "= 5\n", "line 1: expected key = value (the key is missing)"},
        {{"-m", "x"}, {0}, "model = \"x.gguf\n", "line 1: the quoted value has no closing quote"},
        {{"-m", "x"}, {0}, "model = \"x\" junk\n", "line 1: unexpected text after the closing quote"},
        {{"-m", "x"}, {0}, "config = other.conf\n", "line 1: 'config' cannot be set inside a config file"},
        {{"-m", "x"}, {0}, "port = 8080 # http\nthreads = many\n", "--threads many: not an integer (from "},
        {{"-m", "x", "--config", "/nonexistent/kiri.conf"}, {0}, NULL, "--config /nonexistent/kiri.conf: cannot open"},
        {{"-m", "x"}, {"KIRI_CONFIG=/nonexistent/k.conf"}, NULL, "--config /nonexistent/k.conf: cannot open"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        memset(&cfg, 0x5A, sizeof cfg);
        int rc = load(cases[i].args, cases[i].env, cases[i].file);
        CHECK_EQ_INT(rc, -1);
        int found = strstr(err, cases[i].want) != NULL;
        CHECK(found);
        if (!found)
            fprintf(stderr, "  config case %zu: got \"%s\"\n    wanted \"%s\"\n", i, err, cases[i].want);
        /* cfg is written only on success. */
        const unsigned char *b = (const unsigned char *)&cfg;
        size_t bad = 0;
        for (size_t j = 0; j < sizeof cfg; j++)
            bad += b[j] != 0x5A;
        CHECK_EQ_INT(bad, 0);
    }
    /* The file's name in messages about its lines. */
    CHECK_EQ_INT(load(ARGS("-m", "x"), NULL, "prot = 1\n"), -1);
    char want[300];
    snprintf(want, sizeof want, "%s/kiri.conf line 1: unknown key 'prot'", tmp_dir);
    CHECK_STR(err, want);
    /* A small error buffer gets a cut, terminated message; none at all is fine too. */
    char small[8];
    char *argv[] = {"--port", "0", NULL};
    CHECK_EQ_INT(kiri_server_config_load(&cfg, 2, argv, NULL, small, sizeof small), -1);
    CHECK_STR(small, "--port ");
    CHECK_EQ_INT(kiri_server_config_load(&cfg, 2, argv, NULL, NULL, 0), -1);
    CHECK_EQ_INT(kiri_server_config_load(NULL, 2, argv, NULL, err, sizeof err), -1);
    tmp_close();
}

static void test_config_file_limits(void)
{
    tmp_open();
    char *argv[4] = {"-m", "x", "--config", NULL};
    /* A NUL byte. */
    static const char nul[] = "port = 80\nhost = a\0b\n";
    argv[3] = (char *)write_file(0, "nul.conf", nul, sizeof nul - 1);
    CHECK_EQ_INT(kiri_server_config_load(&cfg, 4, argv, NULL, err, sizeof err), -1);
    CHECK(strstr(err, "nul.conf line 2: a NUL byte") != NULL);
    unlink(argv[3]);
    /* Larger than 1 MiB, and exactly 1 MiB (allowed). */
    size_t mib = (size_t)1 << 20;
    char *big = repeat('#', mib + 1);
    argv[3] = (char *)write_file(0, "big.conf", big, mib + 1);
    CHECK_EQ_INT(kiri_server_config_load(&cfg, 4, argv, NULL, err, sizeof err), -1);
    CHECK(strstr(err, "big.conf: larger than 1 MiB") != NULL);
    argv[3] = (char *)write_file(0, "big.conf", big, mib);
    CHECK_EQ_INT(kiri_server_config_load(&cfg, 4, argv, NULL, err, sizeof err), 0);
    unlink(argv[3]);
    free(big);
    /* A directory. */
    argv[3] = tmp_dir;
    CHECK_EQ_INT(kiri_server_config_load(&cfg, 4, argv, NULL, err, sizeof err), -1);
    CHECK(strstr(err, "cannot") != NULL);
    /* Out of memory for the file buffer. */
    argv[3] = (char *)write_text(0, "ok.conf", "port = 80\n");
    kiri_mem_fail_after(0);
    int rc = kiri_server_config_load(&cfg, 4, argv, NULL, err, sizeof err);
    kiri_mem_fail_after(-1);
    CHECK_EQ_INT(rc, -1);
    CHECK(strstr(err, "out of memory") != NULL);
    unlink(argv[3]);
    tmp_close();
}

static void test_config_usage(void)
{
    static char buf[16384];
    kiri_server_config_usage(buf, sizeof buf);
    static const char *const flags[] = {
        "-m, --model FILE", "--alias NAME", "--host ADDR", "--port N", "-t, --threads N", "--backend NAME",
        "--ctx N", "--kv-memory BYTES", "--kv-type TYPE", "--parallel N", "--chunk N", "--queue N",
        "--tls-cert FILE", "--tls-key FILE", "--api-key-file FILE", "--max-body BYTES",
        "--max-prompt-tokens N", "--request-timeout SECONDS", "--idle-timeout SECONDS",
        "--http-threads N", "--log-prompts", "--config FILE",
        "--models-dir DIR", "--models-memory BYTES", "--fleet URL", "--fleet-key FILE", "--fleet-ca FILE",
        "--fleet-interval SECONDS", "--node-name NAME", "--upstream URL", "--upstream-key-file FILE",
        "--upstream-ca FILE", "--route POLICY", "--route-queue N", "--upstream-timeout SECONDS", "--gpu-layers N",
        "--cpu-kernels TIER", "--spec KIND", "--spec-max N", "--spec-max-seqs N", "--draft-model FILE",
    };
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        CHECK(strstr(buf, flags[i]) != NULL);
        if (!strstr(buf, flags[i]))
            fprintf(stderr, "  usage lacks %s\n", flags[i]);
    }
    int defaults = 0;
    for (const char *p = buf; (p = strstr(p, "Default: ")) != NULL; p++)
        defaults++;
    CHECK_EQ_INT(defaults, sizeof flags / sizeof flags[0]);
    CHECK(strstr(buf, "Default: 8080.") != NULL);
    CHECK(strstr(buf, "Default: 127.0.0.1.") != NULL);
    /* Lines fit in 100 columns. */
    size_t longest = 0;
    for (const char *p = buf; *p;) {
        size_t n = strcspn(p, "\n");
        if (n > longest)
            longest = n;
        p += n + (p[n] == '\n');
    }
    CHECK(longest <= 100);
    CHECK(strlen(buf) + 1 < sizeof buf);
    char small[16];
    kiri_server_config_usage(small, sizeof small);
    CHECK_EQ_INT(strlen(small), 15);
    kiri_server_config_usage(small, 0);
}

TEST_MAIN(test_metrics_render, test_metrics_concurrency, test_metrics_nomem, test_auth_check,
          test_auth_load_errors, test_auth_nomem, test_config_defaults, test_config_precedence,
          test_config_sizes, test_config_file_syntax, test_config_errors, test_config_file_limits,
          test_config_usage)
