/* The kiri command line: run, tokenize, info, quantize, bench. It uses only the public API
 * (kiri.h), as any program embedding libkiri would. Errors go to stderr, one line, exit status 1;
 * usage errors exit with status 2. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiri.h"
#ifdef KIRI_WITH_SERVER
#include "config.h"
#include "fleet_cli.h"
#include "platform.h"
#include "server.h"
#endif

#define MAX_STOP 16

struct options {
    const char *model;
    const char *prompt;
    const char *backend;
    int n_predict;
    int n_threads;
    int gpu_layers;
    const char *cpu_kernels;
    int n_ctx;
    int n_batch;
    int kv_type;
    int no_bos;
    int json;
    int n_prompt_bench;
    int n_gen_bench;
    int repetitions;
    struct kiri_sampling sampling;
    const char *stop[MAX_STOP];
    int n_stop;
    const char *positional[4];
    int n_positional;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kiri <command> [options]\n"
            "\n"
            "commands:\n"
            "  run       -m MODEL -p PROMPT [-n N] [--temp T] [--seed S] [-t THREADS]   generate text\n"
            "  tokenize  -m MODEL [--no-bos] TEXT                                      print token ids\n"
            "  info      [-m MODEL]                                                    model and machine\n"
            "  quantize  IN.gguf OUT.gguf TYPE                                         convert weights\n"
            "  bench     -m MODEL [-p N] [-n N] [-t THREADS] [--json]                  tokens per second\n"
            "  serve     -m MODEL [--host H] [--port P] [...]                          OpenAI-compatible server\n"
            "            (kiri serve --help lists its options)\n"
            "\n"
            "options:\n"
            "  -m, --model FILE        GGUF model\n"
            "  -p, --prompt TEXT       prompt (run); prompt tokens (bench, default 512)\n"
            "  -n, --n-predict N       tokens to generate (run: default 256, -1 until EOS; bench: 128)\n"
            "  -t, --threads N         worker threads (default: one per core)\n"
            "  -c, --ctx-size N        context length (default: the model's)\n"
            "  -b, --batch-size N      prompt tokens per step (default 512)\n"
            "      --backend NAME      auto, cpu, vulkan or cuda (default auto)\n"
            "      --gpu-layers N      with a GPU backend, run only the first N layers on it and the\n"
            "                          rest on the CPU (default -1: all; 0: none)\n"
            "      --cpu-kernels TIER  the best CPU kernels to use: auto (default), c, avx2, avx512,\n"
            "                          neon, dotprod or i8mm\n"
            "      --kv-type TYPE      f16 (default), f32 or q8_0\n"
            "      --temp T            temperature, 0 = greedy (default 0.8)\n"
            "      --top-k N --top-p P --min-p P --repeat-penalty P --repeat-last-n N\n"
            "      --frequency-penalty P --presence-penalty P\n"
            "      --seed S            sampling seed (default 0)\n"
            "      --stop TEXT         stop string (repeatable, up to 16)\n"
            "      --no-bos            do not add the BOS token (tokenize)\n"
            "      --json              machine-readable output (bench)\n"
            "  -r, --repetitions N     bench runs to average (default 3)\n"
            "\n"
            "TYPE for quantize: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q4_K_M Q5_K Q6_K F16 BF16 F32\n");
#ifdef KIRI_WITH_SERVER
    fprintf(f, "\nfleet commands (docs/fleet.md):\n%s", kiri_fleet_cli_usage());
#endif
}

/* Parses a whole decimal integer in [lo, hi]. */
static int parse_int(const char *opt, const char *s, long lo, long hi, int *out)
{
    char *end = NULL;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || !*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "kiri: error: %s needs an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s ? s : "");
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_float(const char *opt, const char *s, float *out)
{
    char *end = NULL;
    errno = 0;
    float v = s ? strtof(s, &end) : 0.0f;
    if (!s || !*s || *end || errno || v != v) {
        fprintf(stderr, "kiri: error: %s needs a number, got '%s'\n", opt, s ? s : "");
        return -1;
    }
    *out = v;
    return 0;
}

static int is_opt(const char *a, const char *s1, const char *s2)
{
    return strcmp(a, s1) == 0 || (s2 && strcmp(a, s2) == 0);
}

static int parse_args(int argc, char **argv, struct options *o)
{
    memset(o, 0, sizeof *o);
    o->n_predict = -2; /* command default */
    o->n_prompt_bench = 512;
    o->n_gen_bench = 128;
    o->repetitions = 3;
    o->kv_type = 1;
    o->backend = "auto";
    o->gpu_layers = -1;
    kiri_sampling_default(&o->sampling);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define IS(s1, s2) is_opt(a, s1, s2)
#define NEED()                                                                              \
        do {                                                                                \
            if (!v) {                                                                       \
                fprintf(stderr, "kiri: error: %s needs a value\n", a);                      \
                return -1;                                                                  \
            }                                                                               \
            i++;                                                                            \
        } while (0)
        if (IS("-m", "--model")) { NEED(); o->model = v; }
        else if (IS("-p", "--prompt")) {
            NEED();
            o->prompt = v;
            if (strcmp(argv[1], "bench") == 0 && parse_int(a, v, 1, 1 << 20, &o->n_prompt_bench))
                return -1;
        }
        else if (IS("-n", "--n-predict")) { NEED(); if (parse_int(a, v, -1, 1 << 24, &o->n_predict)) return -1; }
        else if (IS("-t", "--threads")) { NEED(); if (parse_int(a, v, 1, 1024, &o->n_threads)) return -1; }
        else if (IS("-c", "--ctx-size")) { NEED(); if (parse_int(a, v, 1, 1 << 24, &o->n_ctx)) return -1; }
        else if (IS("-b", "--batch-size")) { NEED(); if (parse_int(a, v, 1, 8192, &o->n_batch)) return -1; }
        else if (IS("-r", "--repetitions")) { NEED(); if (parse_int(a, v, 1, 100, &o->repetitions)) return -1; }
        else if (IS("--backend", NULL)) { NEED(); o->backend = v; }
        else if (IS("--cpu-kernels", NULL)) { NEED(); o->cpu_kernels = v; }
        else if (IS("--gpu-layers", NULL)) { NEED(); if (parse_int(a, v, -1, 1 << 20, &o->gpu_layers)) return -1; }
        else if (IS("--kv-type", NULL)) {
            NEED();
            if (strcmp(v, "f16") == 0) o->kv_type = 1;
            else if (strcmp(v, "f32") == 0) o->kv_type = 0;
            else if (strcmp(v, "q8_0") == 0) o->kv_type = 8;
            else { fprintf(stderr, "kiri: error: --kv-type must be f16, f32 or q8_0\n"); return -1; }
        }
        else if (IS("--temp", NULL)) { NEED(); if (parse_float(a, v, &o->sampling.temperature)) return -1; }
        else if (IS("--top-k", NULL)) { NEED(); if (parse_int(a, v, 0, 1 << 24, &o->sampling.top_k)) return -1; }
        else if (IS("--top-p", NULL)) { NEED(); if (parse_float(a, v, &o->sampling.top_p)) return -1; }
        else if (IS("--min-p", NULL)) { NEED(); if (parse_float(a, v, &o->sampling.min_p)) return -1; }
        else if (IS("--repeat-penalty", NULL)) { NEED(); if (parse_float(a, v, &o->sampling.repeat_penalty)) return -1; }
        else if (IS("--repeat-last-n", NULL)) { NEED(); if (parse_int(a, v, 0, 1 << 20, &o->sampling.repeat_last_n)) return -1; }
        else if (IS("--frequency-penalty", NULL)) { NEED(); if (parse_float(a, v, &o->sampling.frequency_penalty)) return -1; }
        else if (IS("--presence-penalty", NULL)) { NEED(); if (parse_float(a, v, &o->sampling.presence_penalty)) return -1; }
        else if (IS("--seed", NULL)) {
            NEED();
            char *end = NULL;
            errno = 0;
            unsigned long long s = strtoull(v, &end, 10);
            if (!*v || *end || errno || v[0] == '-') {
                fprintf(stderr, "kiri: error: --seed needs a non-negative integer, got '%s'\n", v);
                return -1;
            }
            o->sampling.seed = (uint64_t)s;
        }
        else if (IS("--stop", NULL)) {
            NEED();
            if (o->n_stop == MAX_STOP || !*v) {
                fprintf(stderr, "kiri: error: --stop takes a non-empty string, at most %d times\n", MAX_STOP);
                return -1;
            }
            o->stop[o->n_stop++] = v;
        }
        else if (IS("--no-bos", NULL)) o->no_bos = 1;
        else if (IS("--json", NULL)) o->json = 1;
        else if (IS("-h", "--help")) { usage(stdout); exit(0); }
        else if (a[0] == '-' && a[1] != '\0') {
            fprintf(stderr, "kiri: error: unknown option %s (see kiri --help)\n", a);
            return -1;
        } else {
            if (o->n_positional == 4) {
                fprintf(stderr, "kiri: error: too many arguments\n");
                return -1;
            }
            o->positional[o->n_positional++] = a;
        }
#undef IS
#undef NEED
    }
    return 0;
}

static int fail(const char *what, const struct kiri_status_info *info)
{
    if (info->field[0] && info->offset >= 0)
        fprintf(stderr, "kiri: error: %s: %s [%s, field %s at byte %lld]\n", what, info->message,
                kiri_status_name(info->code), info->field, (long long)info->offset);
    else if (info->field[0])
        fprintf(stderr, "kiri: error: %s: %s [%s, field %s]\n", what, info->message,
                kiri_status_name(info->code), info->field);
    else
        fprintf(stderr, "kiri: error: %s: %s [%s]\n", what, info->message, kiri_status_name(info->code));
    return 1;
}

static int open_model(const struct options *o, int vocab_only, struct kiri_model **m)
{
    if (!o->model) {
        fprintf(stderr, "kiri: error: -m MODEL is required\n");
        return 2;
    }
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.backend = o->backend;
    mp.n_threads = o->n_threads;
    mp.gpu_layers = o->gpu_layers;
    mp.cpu_kernels = o->cpu_kernels;
    mp.vocab_only = vocab_only;
    struct kiri_status_info info;
    if (kiri_model_open(o->model, &mp, m, &info) != KIRI_OK)
        return fail(o->model, &info);
    return 0;
}

/* Tokenizes text into a heap array (*ids, owned by the caller). */
static int tokenize_alloc(struct kiri_model *m, const char *text, int add_bos, int32_t **ids, int *n)
{
    const size_t len = strlen(text);
    int need = kiri_tokenize(m, text, len, add_bos, 0, NULL, 0);
    if (need < 0) {
        fprintf(stderr, "kiri: error: cannot tokenize the text (%s)\n", kiri_status_name(need));
        return 1;
    }
    *ids = malloc(((size_t)need + 1) * sizeof **ids);
    if (!*ids) {
        fprintf(stderr, "kiri: error: out of memory\n");
        return 1;
    }
    *n = kiri_tokenize(m, text, len, add_bos, 0, *ids, need);
    return 0;
}

static int make_context(struct kiri_model *m, const struct options *o, struct kiri_context **c)
{
    struct kiri_context_params cp;
    kiri_context_params_default(&cp);
    cp.n_ctx = o->n_ctx;
    if (o->n_batch)
        cp.n_batch = o->n_batch;
    cp.kv_type = o->kv_type;
    struct kiri_status_info info;
    if (kiri_context_init(m, &cp, c, &info) != KIRI_OK)
        return fail("context", &info);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Commands
 * ------------------------------------------------------------------------------------------- */

static int print_text(void *user, int32_t token, const char *text, size_t len)
{
    (void)user;
    (void)token;
    fwrite(text, 1, len, stdout);
    fflush(stdout);
    return 0;
}

static int cmd_run(const struct options *o)
{
    if (!o->prompt) {
        fprintf(stderr, "kiri: error: -p PROMPT is required\n");
        return 2;
    }
    struct kiri_model *m = NULL;
    struct kiri_context *c = NULL;
    int32_t *ids = NULL;
    int n = 0, rc = open_model(o, 0, &m);
    if (rc == 0)
        rc = tokenize_alloc(m, o->prompt, -1, &ids, &n);
    if (rc == 0 && n == 0) {
        fprintf(stderr, "kiri: error: the prompt is empty and the model adds no BOS token\n");
        rc = 1;
    }
    if (rc == 0)
        rc = make_context(m, o, &c);
    if (rc == 0) {
        struct kiri_generate_params gp;
        memset(&gp, 0, sizeof gp);
        gp.max_tokens = o->n_predict == -2 ? 256 : o->n_predict;
        gp.sampling = o->sampling;
        gp.stop = o->stop;
        gp.n_stop = o->n_stop;
        struct kiri_generate_result res;
        struct kiri_status_info info;
        if (kiri_generate(c, ids, n, &gp, print_text, NULL, &res, &info) != KIRI_OK) {
            rc = fail("generate", &info);
        } else {
            printf("\n");
            fflush(stdout);
            fprintf(stderr, "kiri: prompt %d tokens in %.3f s (%.1f tok/s), generated %d tokens in %.3f s (%.1f tok/s)\n",
                    res.n_prompt, res.prefill_seconds, res.prefill_seconds > 0 ? res.n_prompt / res.prefill_seconds : 0.0,
                    res.n_generated, res.decode_seconds,
                    res.decode_seconds > 0 ? res.n_generated / res.decode_seconds : 0.0);
        }
    }
    free(ids);
    kiri_context_free(c);
    kiri_model_close(m);
    return rc;
}

static int cmd_tokenize(const struct options *o)
{
    if (o->n_positional != 1) {
        fprintf(stderr, "kiri: error: tokenize takes exactly one TEXT argument\n");
        return 2;
    }
    struct kiri_model *m = NULL;
    int32_t *ids = NULL;
    int n = 0, rc = open_model(o, 1, &m);
    if (rc == 0)
        rc = tokenize_alloc(m, o->positional[0], o->no_bos ? 0 : -1, &ids, &n);
    if (rc == 0) {
        for (int i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    free(ids);
    kiri_model_close(m);
    return rc;
}

static int cmd_info(const struct options *o)
{
    char *buf = malloc(1 << 16);
    if (!buf)
        return 1;
    kiri_system_info(o->backend, buf, 1 << 16);
    fputs(buf, stdout);
    int rc = 0;
    if (o->model) {
        struct kiri_model *m = NULL;
        rc = open_model(o, 0, &m);
        if (rc == 0) {
            kiri_model_describe(m, buf, 1 << 16);
            printf("model:         %s\n%s", o->model, buf);
            kiri_model_close(m);
        }
    }
    free(buf);
    return rc;
}

static void progress_bar(void *user, int64_t done, int64_t total)
{
    (void)user;
    const int width = 40, filled = total ? (int)(done * width / total) : width;
    fprintf(stderr, "\rkiri: quantizing [%.*s%*s] %lld/%lld", filled, "########################################",
            width - filled, "", (long long)done, (long long)total);
    if (done == total)
        fprintf(stderr, "\n");
}

static int cmd_quantize(const struct options *o)
{
    if (o->n_positional != 3) {
        fprintf(stderr, "kiri: error: usage: kiri quantize IN.gguf OUT.gguf TYPE\n");
        return 2;
    }
    struct kiri_status_info info;
    if (kiri_quantize(o->positional[0], o->positional[1], o->positional[2], progress_bar, NULL, &info) != KIRI_OK)
        return fail("quantize", &info);
    fprintf(stderr, "kiri: wrote %s\n", o->positional[1]);
    return 0;
}

static int cmd_bench(const struct options *o)
{
    struct kiri_model *m = NULL;
    struct kiri_context *c = NULL;
    const double t_open = kiri_time_seconds();
    int rc = open_model(o, 0, &m);
    const double open_seconds = kiri_time_seconds() - t_open;
    const int n_p = o->n_prompt_bench, n_g = o->n_predict >= 1 ? o->n_predict : o->n_gen_bench;
    struct options oc = *o;
    if (rc == 0 && oc.n_ctx == 0)
        oc.n_ctx = n_p + n_g + 1;
    if (rc == 0)
        rc = make_context(m, &oc, &c);
    int32_t *ids = rc == 0 ? malloc((size_t)n_p * sizeof *ids) : NULL;
    if (rc == 0 && !ids)
        rc = 1;
    double best_p = 0, best_g = 0, first_token = 0;
    for (int r = 0; rc == 0 && r < o->repetitions; r++) {
        /* Deterministic pseudo-random tokens: speed does not depend on their meaning. */
        uint32_t s = 12345u + (uint32_t)r;
        for (int i = 0; i < n_p; i++) {
            s = s * 1664525u + 1013904223u;
            ids[i] = (int32_t)((s >> 8) % (uint32_t)kiri_model_n_vocab(m));
        }
        const float *logits;
        struct kiri_status_info info;
        kiri_context_reset(c);
        double t0 = kiri_time_seconds();
        if (kiri_context_eval(c, ids, n_p, &logits, &info) != KIRI_OK) {
            rc = fail("bench prefill", &info);
            break;
        }
        const double tp = kiri_time_seconds() - t0;
        if (r == 0)
            first_token = tp;
        t0 = kiri_time_seconds();
        int32_t tok = ids[n_p - 1];
        for (int i = 0; i < n_g; i++) {
            if (kiri_context_eval(c, &tok, 1, &logits, &info) != KIRI_OK) {
                rc = fail("bench decode", &info);
                break;
            }
            int32_t best = 0;
            for (int32_t v = 1; v < kiri_model_n_vocab(m); v++)
                if (logits[v] > logits[best])
                    best = v;
            tok = best;
        }
        const double tg = kiri_time_seconds() - t0;
        if (n_p / tp > best_p)
            best_p = n_p / tp;
        if (n_g / tg > best_g)
            best_g = n_g / tg;
    }
    if (rc == 0) {
        const unsigned long long rss = (unsigned long long)kiri_peak_rss_bytes();
        if (o->json)
            printf("{\"model\":\"%s\",\"n_prompt\":%d,\"n_gen\":%d,\"threads\":%d,\"prefill_tps\":%.3f,"
                   "\"decode_tps\":%.3f,\"peak_rss_bytes\":%llu,\"load_seconds\":%.4f,\"first_prefill_seconds\":%.4f}\n",
                   o->model, n_p, n_g, o->n_threads, best_p, best_g, rss, open_seconds, first_token);
        else
            printf("prefill %d tokens: %.2f tok/s\ndecode %d tokens: %.2f tok/s\npeak RSS: %.1f MiB\nload: %.1f ms\n",
                   n_p, best_p, n_g, best_g, (double)rss / (1024.0 * 1024.0), open_seconds * 1e3);
    }
    free(ids);
    kiri_context_free(c);
    kiri_model_close(m);
    return rc;
}

#ifdef KIRI_WITH_SERVER
extern char **environ;

/* kiri serve: runs until SIGTERM/SIGINT, then drains running requests (up to 30 s). */
static int cmd_serve(int argc, char **argv)
{
    for (int i = 2; i < argc; i++)
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            static char help[16384];
            kiri_server_config_usage(help, sizeof help);
            fputs(help, stdout);
            return 0;
        }
    static struct kiri_server_config cfg;
    char err[512];
    if (kiri_server_config_load(&cfg, argc - 2, argv + 2, environ, err, sizeof err) != 0) {
        fprintf(stderr, "kiri: error: %s\n", err);
        return 2;
    }
    if (!cfg.model[0] && !cfg.models_dir[0]) {
        fprintf(stderr, "kiri: error: serve needs a model (-m FILE, KIRI_MODEL or model = in --config)\n");
        return 2;
    }
    kiri_platform_signals_init(); /* before any thread exists */
    struct kiri_server *srv = NULL;
    struct kiri_status_info info;
    if (kiri_server_start(&cfg, &srv, &info) != KIRI_OK)
        return fail("serve", &info);
    int sig;
    while ((sig = kiri_platform_wait_termination(3600.0)) == 0)
        ;
    fprintf(stderr, "kiri: signal %d: draining running requests\n", sig);
    kiri_server_stop(srv, 30.0);
    fprintf(stderr, "kiri: stopped\n");
    return 0;
}
#endif

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (strcmp(argv[1], "--version") == 0) {
        printf("kiri %s\n", KIRI_VERSION_STRING);
        return 0;
    }
#ifdef KIRI_WITH_SERVER
    if (strcmp(argv[1], "serve") == 0)
        return cmd_serve(argc, argv);
    if (strcmp(argv[1], "pull") == 0)
        return kiri_fleet_cli_pull(argc, argv);
    if (strcmp(argv[1], "fleet") == 0)
        return kiri_fleet_cli_fleet(argc, argv);
#endif
    struct options o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    const char *cmd = argv[1];
    if (strcmp(cmd, "run") == 0)
        return cmd_run(&o);
    if (strcmp(cmd, "tokenize") == 0)
        return cmd_tokenize(&o);
    if (strcmp(cmd, "info") == 0)
        return cmd_info(&o);
    if (strcmp(cmd, "quantize") == 0)
        return cmd_quantize(&o);
    if (strcmp(cmd, "bench") == 0)
        return cmd_bench(&o);
    fprintf(stderr, "kiri: error: unknown command '%s' (see kiri --help)\n", cmd);
    return 2;
}
