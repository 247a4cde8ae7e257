/* The server's configuration: one option table (base/options.h) drives the flags, the KIRI_*
 * environment variables, the config file and the usage text alike, so they never disagree.
 * options.h gives the syntax of each source; here, beyond it:
 * - -h/--help is an unknown option: kiri serve checks kiri_server_config_help_requested first.
 *   Bare words are errors. The config file comes from --config or KIRI_CONFIG; an explicit
 *   --config "" reads none. Unknown KIRI_* variables are ignored, since other parts of kiri read
 *   their own; an empty one counts as unset (systemd's Environment=KIRI_PORT= gives those).
 * - After all sources: --model or --models-dir is required (not both); --draft-model goes with
 *   --model only, and --spec draft needs it; --fleet needs --models-dir,
 *   --fleet-key and an https:// URL; --upstream-key-file, --upstream-ca and --route need --upstream
 *   or --fleet, and --upstream an http(s):// URL; --tls-cert and --tls-key go together; a non-zero
 *   --max-prompt-tokens must be below a non-zero --ctx; an empty --alias becomes the model's file
 *   name (the part after the last '/'). Fields documented as "default: the model's" stay 0 for
 *   the server to derive once the model is open (ctx, kv_memory, max_prompt_tokens).
 */
#include "config.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "kiri.h"
#include "options.h"
#include "platform.h"
#include "utf8.h"

/* ---------------------------------------------------------------------------------------------
 * The option table
 * ------------------------------------------------------------------------------------------- */

#define F(m) KIRI_OPTION_FIELD(struct kiri_server_config, m)
#define KIB ((int64_t)1 << 10)
#define GIB ((int64_t)1 << 30)
#define TIB ((int64_t)1 << 40)
#define MAX_TOKENS ((int64_t)1 << 24)
/* Seconds more than 0 and at most max. */
#define SECONDS_UPTO(max) .type = KIRI_OPTION_SECONDS, .flags = KIRI_OPTION_ABOVE_LO, .fhi = (max)

static const struct kiri_option opts[] = {
    {.name = "model", .short_name = 'm', .type = KIRI_OPTION_STRING, F(model), .arg = "FILE",
     .help = "The GGUF model file to serve.",
     .def = "none (required)"},
    {.name = "alias", .type = KIRI_OPTION_STRING, F(model_alias), .arg = "NAME",
     .help = "The model id that /v1/models reports.",
     .def = "the model's file name"},
    {.name = "models-dir", .type = KIRI_OPTION_STRING, F(models_dir), .arg = "DIR",
     .help = "Serves every DIR/NAME.gguf as model NAME, loaded when a request names it (instead of --model).",
     .def = "none"},
    {.name = "models-memory", .type = KIRI_OPTION_SIZE, F(models_memory), .lo = 0, .hi = TIB, .arg = "BYTES",
     .help = "With --models-dir: memory for loaded models (file sizes plus KV pools); past it the least "
     "recently used idle model is unloaded; 0 sets no limit.",
     .def = "0 (no limit)"},
    {.name = "fleet", .type = KIRI_OPTION_STRING, F(fleet_url), .arg = "URL",
     .help = "Follows the signed fleet manifest at this https:// URL: syncs --models-dir from it at start "
     "and every --fleet-interval, hot-swapping models whose files changed.",
     .def = "none"},
    {.name = "fleet-key", .type = KIRI_OPTION_STRING, F(fleet_key), .arg = "FILE",
     .help = "The pinned PEM public key fleet manifests must be signed with (kiri fleet keygen).",
     .def = "none"},
    {.name = "fleet-ca", .type = KIRI_OPTION_STRING, F(fleet_ca), .arg = "FILE",
     .help = "A PEM bundle of the CAs trusted for the fleet's servers.",
     .def = "the system's CA bundle"},
    {.name = "fleet-interval", F(fleet_interval), SECONDS_UPTO(86400), .arg = "SECONDS",
     .help = "Seconds between fleet syncs and heartbeats.",
     .def = "300"},
    {.name = "node-name", .type = KIRI_OPTION_STRING, F(node_name), .arg = "NAME",
     .help = "The node's name in fleet heartbeats.",
     .def = "the host name"},
    {.name = "upstream", .type = KIRI_OPTION_STRING, F(upstream), .arg = "URL",
     .help = "An OpenAI-compatible server, http(s)://host[:port][/prefix], that generation requests are "
     "routed to by --route.",
     .def = "none (serve locally)"},
    {.name = "upstream-key-file", .type = KIRI_OPTION_STRING, F(upstream_key_file), .arg = "FILE",
     .help = "A file whose first line is the upstream's API key (sent as Authorization: Bearer).",
     .def = "none"},
    {.name = "upstream-ca", .type = KIRI_OPTION_STRING, F(upstream_ca), .arg = "FILE",
     .help = "A PEM bundle of the CAs trusted for an https upstream.",
     .def = "the system's CA bundle"},
    {.name = "route", .type = KIRI_OPTION_ENUM, F(route), .choices = "local-first|cloud-first", .arg = "POLICY",
     .help = "local-first serves here and forwards when --route-queue requests wait or the model is not "
     "here; cloud-first forwards and serves here when the upstream fails.",
     .def = "local-first"},
    {.name = "route-queue", .type = KIRI_OPTION_INT, F(route_queue), .lo = 0, .hi = 65536, .arg = "N",
     .help = "With local-first, forward when at least N requests wait for the model; 0 uses half of --queue.",
     .def = "0 (--queue / 2)"},
    {.name = "upstream-timeout", F(upstream_timeout), SECONDS_UPTO(3600), .arg = "SECONDS",
     .help = "The longest wait for the upstream's answer to begin, and the longest silence inside it; past "
     "it the request is served here.",
     .def = "60"},
    {.name = "host", .type = KIRI_OPTION_STRING, F(host), .lo = 1, .arg = "ADDR",
     .help = "The address to listen on (0.0.0.0 listens on every IPv4 interface).",
     .def = "127.0.0.1"},
    {.name = "port", .type = KIRI_OPTION_INT, F(port), .lo = 1, .hi = 65535, .arg = "N",
     .help = "The TCP port to listen on.",
     .def = "8080"},
    {.name = "threads", .short_name = 't', .type = KIRI_OPTION_INT, F(threads), .lo = 1, .hi = 1024, .arg = "N",
     .help = "CPU threads that run the model's computation.",
     .def = "the number of CPU cores"},
    {.name = "backend", .type = KIRI_OPTION_ENUM, F(backend), .choices = "auto|cpu|vulkan|cuda", .arg = "NAME",
     .help = "The compute backend; auto picks the best one this machine can run.",
     .def = "auto"},
    {.name = "gpu-layers", .type = KIRI_OPTION_INT, F(gpu_layers), .lo = -1, .hi = 1 << 20, .arg = "N",
     .help = "With a GPU backend, runs only the first N layers on it and the rest on the CPU (for a model "
     "larger than the GPU's memory); -1 runs all of them there, 0 none.",
     .def = "-1 (all)"},
    {.name = "cpu-kernels", .type = KIRI_OPTION_ENUM, F(cpu_kernels), .choices = "auto|c|avx2|avx512|neon|dotprod|i8mm",
     .arg = "TIER",
     .help = "The best CPU kernels to use; auto picks the best this CPU runs, a tier it lacks is an error.",
     .def = "auto"},
    {.name = "ctx", .type = KIRI_OPTION_INT, F(ctx), .lo = 0, .hi = MAX_TOKENS, .arg = "N",
     .help = "Most tokens one sequence may hold, prompt and output together; 0 uses the model's training "
     "length.",
     .def = "0 (the model's)"},
    {.name = "kv-memory", .type = KIRI_OPTION_SIZE, F(kv_memory), .lo = 0, .hi = TIB, .arg = "BYTES",
     .help = "Memory for the KV cache pool, with an optional K, M, G or T suffix; 0 sizes it for --ctx "
     "tokens in each of --parallel sequences.",
     .def = "0 (--ctx times --parallel tokens)"},
    {.name = "kv-type", .type = KIRI_OPTION_ENUM, F(kv_type), .choices = "f16|f32|q8_0", .arg = "TYPE",
     .help = "The element type of the KV cache.",
     .def = "f16"},
    {.name = "parallel", .type = KIRI_OPTION_INT, F(parallel), .lo = 1, .hi = 1024, .arg = "N",
     .help = "Sequences generated together in one batch.",
     .def = "8"},
    {.name = "chunk", .type = KIRI_OPTION_INT, F(chunk), .lo = 1, .hi = 65536, .arg = "N",
     .help = "Prompt tokens processed per batch step (chunked prefill); the compute scratch grows with it.",
     .def = "64"},
    {.name = "spec", .type = KIRI_OPTION_ENUM, F(spec), .choices = "none|ngram|draft|mtp", .arg = "KIND",
     .help = "Speculative decoding for requests without a \"speculative\" field: ngram drafts tokens by looking "
     "the text's last few tokens up in the prompt and the text so far, draft has --draft-model guess them, "
     "mtp the model's own multi-token-prediction head (qwen35 files that carry one; requests may then ask "
     "for \"mtp\"); one step verifies them (the output is the same).",
     .def = "none"},
    {.name = "draft-model", .type = KIRI_OPTION_STRING, F(draft_model), .arg = "FILE",
     .help = "A smaller model with the same vocabulary as --model (or a lower-precision copy of it) that drafts "
     "tokens for speculative decoding (\"speculative\": \"draft\", or --spec draft).",
     .def = "none"},
    {.name = "spec-max", .type = KIRI_OPTION_INT, F(spec_max), .lo = 1, .hi = KIRI_SPEC_MAX_DRAFT, .arg = "N",
     .help = "Most tokens drafted at once for requests that do not say (the draft length adapts below it).",
     .def = "8"},
    {.name = "spec-max-seqs", .type = KIRI_OPTION_INT, F(spec_max_seqs), .lo = 0, .hi = 1024, .arg = "N",
     .help = "Drafts are made only in steps that decode at most N sequences: past that, verifying them is no "
     "longer free; 0 turns speculation off.",
     .def = "4"},
    {.name = "queue", .type = KIRI_OPTION_INT, F(queue), .lo = 0, .hi = 65536, .arg = "N",
     .help = "Requests that may wait for a batch slot before new ones are refused with 429.",
     .def = "64"},
    {.name = "tls-cert", .type = KIRI_OPTION_STRING, F(tls_cert), .arg = "FILE",
     .help = "A PEM certificate chain; with --tls-key the server speaks HTTPS.",
     .def = "none (plain HTTP)"},
    {.name = "tls-key", .type = KIRI_OPTION_STRING, F(tls_key), .arg = "FILE",
     .help = "The unencrypted PEM private key of --tls-cert.",
     .def = "none"},
    {.name = "api-key-file", .type = KIRI_OPTION_STRING, F(api_key_file), .arg = "FILE",
     .help = "A file of API keys, one per line, that requests must present as Authorization: Bearer KEY.",
     .def = "none (no authentication)"},
    {.name = "max-body", .type = KIRI_OPTION_SIZE, F(max_body), .lo = KIB, .hi = GIB, .arg = "BYTES",
     .help = "The largest request body accepted, with an optional K, M or G suffix.",
     .def = "4M"},
    {.name = "max-prompt-tokens", .type = KIRI_OPTION_INT, F(max_prompt_tokens), .lo = 0, .hi = MAX_TOKENS,
     .arg = "N",
     .help = "The longest prompt accepted, in tokens; 0 allows --ctx minus 1.",
     .def = "0 (--ctx minus 1)"},
    {.name = "request-timeout", F(request_timeout), SECONDS_UPTO(86400), .arg = "SECONDS",
     .help = "The longest one generation may run before it is ended.",
     .def = "600"},
    {.name = "idle-timeout", F(idle_timeout), SECONDS_UPTO(3600), .arg = "SECONDS",
     .help = "The longest wait for a connection to send its request.",
     .def = "10"},
    {.name = "http-threads", .type = KIRI_OPTION_INT, F(http_threads), .lo = 1, .hi = 4096, .arg = "N",
     .help = "Threads that serve HTTP connections.",
     .def = "64"},
    {.name = "log-prompts", .type = KIRI_OPTION_FLAG, F(log_prompts),
     .help = "Writes prompts and generated text to the log (off keeps user text out of logs).",
     .def = "off"},
    {.name = "config", .type = KIRI_OPTION_STRING, F(config_file), .flags = KIRI_OPTION_CONFIG_FILE, .arg = "FILE",
     .help = "Reads settings from FILE, lines of key = value; flags and KIRI_* variables override them.",
     .def = "none"},
};

static const struct kiri_option_group groups[] = {{NULL, opts, sizeof opts / sizeof opts[0]}};

static const struct kiri_option_spec spec = {
    .groups = groups,
    .n_groups = 1,
    .env_prefix = "KIRI_",
    .intro = "Options. Each can also be set by the environment variable KIRI_<NAME> (--kv-memory is\n"
             "KIRI_KV_MEMORY) or by a line `name = value` in the --config file. Precedence: flag >\n"
             "environment > file > default. Sizes take K, M, G or T suffixes (powers of 1024).\n\n",
};

static void set_defaults(struct kiri_server_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8080;
    c->threads = kiri_platform_n_cpus();
    if (c->threads > 1024)   /* the flag's range */
        c->threads = 1024;
    snprintf(c->backend, sizeof c->backend, "auto");
    snprintf(c->cpu_kernels, sizeof c->cpu_kernels, "auto");
    c->gpu_layers = -1;
    snprintf(c->kv_type, sizeof c->kv_type, "f16");
    c->parallel = 8;
    snprintf(c->spec, sizeof c->spec, "none");
    c->spec_max = KIRI_SPEC_DEFAULT_DRAFT;
    c->spec_max_seqs = 4;
    c->chunk = 64;
    c->queue = 64;
    c->max_body = (uint64_t)4 << 20;
    c->request_timeout = 600;
    c->idle_timeout = 10;
    c->http_threads = 64;
    c->fleet_interval = 300;
    c->upstream_timeout = 60;
}

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

static void default_alias(struct kiri_server_config *c)
{
    const char *base = strrchr(c->model, '/');
    base = base && base[1] ? base + 1 : c->model;
    /* Cut to the field, never through a UTF-8 character. */
    const size_t n = kiri_utf8_prefix(base, strlen(base), sizeof c->model_alias - 1);
    memcpy(c->model_alias, base, n);
    c->model_alias[n] = '\0';
}

/* Writes one sentence into err (snprintf takes a NULL buffer of size 0) and returns -1. */
#define FAIL(...) (snprintf(err, err ? err_cap : 0, __VA_ARGS__), -1)

int kiri_server_config_load(struct kiri_server_config *cfg, int argc, char **argv, char **envp,
                            char *err, size_t err_cap)
{
    if (!cfg || argc < 0 || (argc > 0 && !argv))
        return FAIL("kiri_server_config_load: invalid arguments");
    /* About 17 KiB: fine on any thread's stack, and cfg stays untouched on failure. */
    struct kiri_server_config c;
    set_defaults(&c);
    if (kiri_options_parse(&spec, &c, argc, argv, envp, NULL, NULL, err, err_cap))
        return -1;

    if (!c.model[0] && !c.models_dir[0])
        return FAIL("--model is required: the GGUF file to serve (or KIRI_MODEL, or model = FILE "
                        "in the config file), or --models-dir DIR");
    if (c.model[0] && c.models_dir[0])
        return FAIL("--model and --models-dir exclude each other: serve one file or a directory");
    if (c.draft_model[0] && !c.model[0])
        return FAIL("--draft-model drafts for the one model of --model, not for --models-dir");
    if (strcmp(c.spec, "draft") == 0 && !c.draft_model[0])
        return FAIL("--spec draft needs --draft-model FILE");
    if (c.fleet_url[0] && (!c.models_dir[0] || !c.fleet_key[0]))
        return FAIL("--fleet needs --models-dir DIR (where the fleet's models live) and --fleet-key FILE "
                        "(the pinned public key)");
    if (!c.fleet_url[0] && (c.fleet_key[0] || c.fleet_ca[0]))
        return FAIL("--fleet-key and --fleet-ca apply only with --fleet URL");
    if (!c.upstream[0] && !c.fleet_url[0] && (c.upstream_key_file[0] || c.upstream_ca[0] || c.route[0]))
        return FAIL("--upstream-key-file, --upstream-ca and --route apply only with --upstream URL (or --fleet, "
                        "whose manifest may name the upstream)");
    if (c.upstream[0] && strncmp(c.upstream, "http://", 7) != 0 && strncmp(c.upstream, "https://", 8) != 0)
        return FAIL("--upstream %.200s: must be an http:// or https:// URL", c.upstream);
    if (c.fleet_url[0] && strncmp(c.fleet_url, "https://", 8) != 0)
        return FAIL("--fleet %.200s: must be an https:// URL", c.fleet_url);
    if (!c.tls_cert[0] != !c.tls_key[0])
        return FAIL("--tls-cert and --tls-key must be given together (only --%s is set)",
                    c.tls_cert[0] ? "tls-cert" : "tls-key");
    if (c.ctx > 0 && c.max_prompt_tokens >= c.ctx)
        return FAIL("--max-prompt-tokens %ld: must be less than --ctx %ld", (long)c.max_prompt_tokens,
                    (long)c.ctx);
    if (!c.model_alias[0] && c.model[0])
        default_alias(&c);
    *cfg = c;
    if (err && err_cap)
        err[0] = '\0';
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Usage
 * ------------------------------------------------------------------------------------------- */

void kiri_server_config_usage(char *buf, size_t cap)
{
    kiri_options_usage(&spec, buf, cap);
}

int kiri_server_config_help_requested(int argc, char **argv)
{
    return kiri_options_help_requested(&spec, argc, argv);
}
