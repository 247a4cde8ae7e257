/* The server's configuration, from one table of options that drives flags, environment variables,
 * the config file and the usage text alike, so the four can never disagree.
 *
 * Rules beyond config.h's:
 * - Flags: --name VALUE or --name=VALUE; -m FILE, -t N (or -mFILE, -t4). --log-prompts takes no
 *   value (--log-prompts=no is accepted too). A flag given twice: the last one wins. Anything
 *   that is not an option (a bare word, "-", "--") is an error, and so is --help: the caller
 *   handles -h/--help before calling kiri_server_config_load.
 * - Environment: KIRI_<NAME>, e.g. KIRI_KV_MEMORY. An empty value counts as unset (systemd's
 *   Environment=KIRI_PORT= and container templates produce those). Unknown KIRI_* variables are
 *   ignored, since other parts of kiri read their own. The config file can come from
 *   KIRI_CONFIG as well as --config; an explicit --config "" reads none.
 * - Config file: UTF-8 text of at most 1 MiB (a byte order mark is skipped); per line
 *   `key = value`, where key is a flag's long name (with '-' or '_': kv-memory, kv_memory);
 *   blank lines and lines starting with '#' are skipped; whitespace around keys and values is
 *   trimmed; a value may be quoted "..." (no escapes inside; the value ends at the next quote),
 *   which keeps leading or trailing spaces and a '#'. In an unquoted value, whitespace followed by
 *   '#' starts a comment; after a closing quote only whitespace and a comment may follow. An
 *   unknown key, a line without '=', or `config = ...` is an error naming the file and line.
 * - Booleans (env, file, --log-prompts=VALUE): 1/0, true/false, yes/no, on/off, any case.
 * - Sizes (--kv-memory, --max-body): bytes, or a number (decimals allowed: 1.5G) with K, M, G or T,
 *   optionally followed by B or iB; every suffix is a power of 1024 (4M = 4MB = 4MiB = 4194304).
 * - Integers are decimal; seconds are decimal numbers (no NaN, no infinity, no hex).
 * - Every source is validated in full, even settings a higher-precedence source overrides.
 * - Errors read "--port 70000: must be 1..65535 (from KIRI_PORT)", with the source being
 *   "the command line", the variable, or "FILE line N".
 * - After all sources: --model or --models-dir is required (not both); --fleet needs --models-dir,
 *   --fleet-key and an https:// URL; --upstream-key-file, --upstream-ca and --route need --upstream
 *   or --fleet, and --upstream an http(s):// URL; --tls-cert and --tls-key go together; a non-zero
 *   --max-prompt-tokens must be below a non-zero --ctx; an empty --alias becomes the model's file
 *   name (the part after the last '/'). Fields documented as "default: the model's" stay 0 for
 *   the server to derive once the model is open (ctx, kv_memory, max_prompt_tokens).
 * Numbers are read with strtoll/strtod in the C locale (kiri never calls setlocale).
 */
#include "config.h"

#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "platform.h"

#define FILE_MAX ((size_t)1 << 20)

/* ---------------------------------------------------------------------------------------------
 * The option table
 * ------------------------------------------------------------------------------------------- */

enum kind {
    K_STR,      /* char[cap]; lo is the minimum length */
    K_INT,      /* int in [lo, hi] */
    K_I32,      /* int32_t in [lo, hi] */
    K_SIZE,     /* uint64_t bytes in [lo, hi] (hi also at most SIZE_MAX) */
    K_DBL,      /* double in (0, dhi] */
    K_BOOL,     /* int 0 or 1 */
    K_CHOICE    /* char[cap], one of choices */
};

struct opt {
    const char *name;       /* the long flag without "--"; also the file key */
    char short_name;        /* 0: none */
    unsigned char kind;     /* enum kind */
    size_t off, cap;        /* the field's offset in struct kiri_server_config and its size */
    int64_t lo, hi;
    double dhi;
    const char *choices;    /* K_CHOICE: allowed values separated by '|' */
    const char *arg;        /* the value's name in the usage text */
    const char *help;       /* one sentence */
    const char *def;        /* the default as the usage text shows it */
};

#define FIELD(f) offsetof(struct kiri_server_config, f), sizeof(((struct kiri_server_config *)0)->f)
#define KIB ((int64_t)1 << 10)
#define GIB ((int64_t)1 << 30)
#define TIB ((int64_t)1 << 40)
#define MAX_TOKENS ((int64_t)1 << 24)

static const struct opt opts[] = {
    {"model", 'm', K_STR, FIELD(model), 0, 0, 0, NULL, "FILE", "The GGUF model file to serve.",
     "none (required)"},
    {"alias", 0, K_STR, FIELD(model_alias), 0, 0, 0, NULL, "NAME",
     "The model id that /v1/models reports.", "the model's file name"},
    {"models-dir", 0, K_STR, FIELD(models_dir), 0, 0, 0, NULL, "DIR",
     "Serves every DIR/NAME.gguf as model NAME, loaded when a request names it (instead of --model).",
     "none"},
    {"models-memory", 0, K_SIZE, FIELD(models_memory), 0, TIB, 0, NULL, "BYTES",
     "With --models-dir: memory for loaded models (file sizes plus KV pools); past it the least "
     "recently used idle model is unloaded; 0 sets no limit.", "0 (no limit)"},
    {"fleet", 0, K_STR, FIELD(fleet_url), 0, 0, 0, NULL, "URL",
     "Follows the signed fleet manifest at this https:// URL: syncs --models-dir from it at start "
     "and every --fleet-interval, hot-swapping models whose files changed.", "none"},
    {"fleet-key", 0, K_STR, FIELD(fleet_key), 0, 0, 0, NULL, "FILE",
     "The pinned PEM public key fleet manifests must be signed with (kiri fleet keygen).", "none"},
    {"fleet-ca", 0, K_STR, FIELD(fleet_ca), 0, 0, 0, NULL, "FILE",
     "A PEM bundle of the CAs trusted for the fleet's servers.", "the system's CA bundle"},
    {"fleet-interval", 0, K_DBL, FIELD(fleet_interval), 0, 0, 86400, NULL, "SECONDS",
     "Seconds between fleet syncs and heartbeats.", "300"},
    {"node-name", 0, K_STR, FIELD(node_name), 0, 0, 0, NULL, "NAME",
     "The node's name in fleet heartbeats.", "the host name"},
    {"upstream", 0, K_STR, FIELD(upstream), 0, 0, 0, NULL, "URL",
     "An OpenAI-compatible server, http(s)://host[:port][/prefix], that generation requests are "
     "routed to by --route.", "none (serve locally)"},
    {"upstream-key-file", 0, K_STR, FIELD(upstream_key_file), 0, 0, 0, NULL, "FILE",
     "A file whose first line is the upstream's API key (sent as Authorization: Bearer).", "none"},
    {"upstream-ca", 0, K_STR, FIELD(upstream_ca), 0, 0, 0, NULL, "FILE",
     "A PEM bundle of the CAs trusted for an https upstream.", "the system's CA bundle"},
    {"route", 0, K_CHOICE, FIELD(route), 0, 0, 0, "local-first|cloud-first", "POLICY",
     "local-first serves here and forwards when --route-queue requests wait or the model is not "
     "here; cloud-first forwards and serves here when the upstream fails.", "local-first"},
    {"route-queue", 0, K_INT, FIELD(route_queue), 0, 65536, 0, NULL, "N",
     "With local-first, forward when at least N requests wait for the model; 0 uses half of --queue.",
     "0 (--queue / 2)"},
    {"upstream-timeout", 0, K_DBL, FIELD(upstream_timeout), 0, 0, 3600, NULL, "SECONDS",
     "The longest wait for the upstream's answer to begin, and the longest silence inside it; past "
     "it the request is served here.", "60"},
    {"host", 0, K_STR, FIELD(host), 1, 0, 0, NULL, "ADDR",
     "The address to listen on (0.0.0.0 listens on every IPv4 interface).", "127.0.0.1"},
    {"port", 0, K_INT, FIELD(port), 1, 65535, 0, NULL, "N", "The TCP port to listen on.", "8080"},
    {"threads", 't', K_INT, FIELD(threads), 1, 1024, 0, NULL, "N",
     "CPU threads that run the model's computation.", "the number of CPU cores"},
    {"backend", 0, K_CHOICE, FIELD(backend), 0, 0, 0, "auto|cpu|vulkan|cuda", "NAME",
     "The compute backend; auto picks the best one this machine can run.", "auto"},
    {"gpu-layers", 0, K_INT, FIELD(gpu_layers), -1, 1 << 20, 0, NULL, "N",
     "With a GPU backend, runs only the first N layers on it and the rest on the CPU (for a model "
     "larger than the GPU's memory); -1 runs all of them there, 0 none.", "-1 (all)"},
    {"cpu-kernels", 0, K_CHOICE, FIELD(cpu_kernels), 0, 0, 0, "auto|c|avx2|avx512|neon|dotprod|i8mm", "TIER",
     "The best CPU kernels to use; auto picks the best this CPU runs, a tier it lacks is an error.",
     "auto"},
    {"ctx", 0, K_I32, FIELD(ctx), 0, MAX_TOKENS, 0, NULL, "N",
     "Most tokens one sequence may hold, prompt and output together; 0 uses the model's training "
     "length.", "0 (the model's)"},
    {"kv-memory", 0, K_SIZE, FIELD(kv_memory), 0, TIB, 0, NULL, "BYTES",
     "Memory for the KV cache pool, with an optional K, M, G or T suffix; 0 sizes it for --ctx "
     "tokens in each of --parallel sequences.", "0 (--ctx times --parallel tokens)"},
    {"kv-type", 0, K_CHOICE, FIELD(kv_type), 0, 0, 0, "f16|f32|q8_0", "TYPE",
     "The element type of the KV cache.", "f16"},
    {"parallel", 0, K_INT, FIELD(parallel), 1, 1024, 0, NULL, "N",
     "Sequences generated together in one batch.", "8"},
    {"chunk", 0, K_I32, FIELD(chunk), 1, 65536, 0, NULL, "N",
     "Prompt tokens processed per batch step (chunked prefill); the compute scratch grows with it.", "64"},
    {"queue", 0, K_INT, FIELD(queue), 0, 65536, 0, NULL, "N",
     "Requests that may wait for a batch slot before new ones are refused with 429.", "64"},
    {"tls-cert", 0, K_STR, FIELD(tls_cert), 0, 0, 0, NULL, "FILE",
     "A PEM certificate chain; with --tls-key the server speaks HTTPS.", "none (plain HTTP)"},
    {"tls-key", 0, K_STR, FIELD(tls_key), 0, 0, 0, NULL, "FILE",
     "The unencrypted PEM private key of --tls-cert.", "none"},
    {"api-key-file", 0, K_STR, FIELD(api_key_file), 0, 0, 0, NULL, "FILE",
     "A file of API keys, one per line, that requests must present as Authorization: Bearer KEY.",
     "none (no authentication)"},
    {"max-body", 0, K_SIZE, FIELD(max_body), KIB, GIB, 0, NULL, "BYTES",
     "The largest request body accepted, with an optional K, M or G suffix.", "4M"},
    {"max-prompt-tokens", 0, K_I32, FIELD(max_prompt_tokens), 0, MAX_TOKENS, 0, NULL, "N",
     "The longest prompt accepted, in tokens; 0 allows --ctx minus 1.", "0 (--ctx minus 1)"},
    {"request-timeout", 0, K_DBL, FIELD(request_timeout), 0, 0, 86400, NULL, "SECONDS",
     "The longest one generation may run before it is ended.", "600"},
    {"idle-timeout", 0, K_DBL, FIELD(idle_timeout), 0, 0, 3600, NULL, "SECONDS",
     "The longest wait for a connection to send its request.", "10"},
    {"http-threads", 0, K_INT, FIELD(http_threads), 1, 4096, 0, NULL, "N",
     "Threads that serve HTTP connections.", "64"},
    {"log-prompts", 0, K_BOOL, FIELD(log_prompts), 0, 1, 0, NULL, NULL,
     "Writes prompts and generated text to the log (off keeps user text out of logs).", "off"},
    {"config", 0, K_STR, FIELD(config_file), 0, 0, 0, NULL, "FILE",
     "Reads settings from FILE, lines of key = value; flags and KIRI_* variables override them.",
     "none"},
};
#define N_OPTS (sizeof opts / sizeof opts[0])

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
 * Errors
 * ------------------------------------------------------------------------------------------- */

struct errbuf {
    char *p;
    size_t cap;
};

__attribute__((format(printf, 2, 3))) static int fail(struct errbuf *e, const char *fmt, ...)
{
    if (e->p && e->cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->p, e->cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* "--name VALUE: reason (from SOURCE)", the value cut at 80 bytes. */
__attribute__((format(printf, 5, 6))) static int bad_value(struct errbuf *e, const struct opt *o, const char *v,
                                                           const char *src, const char *fmt, ...)
{
    char reason[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return fail(e, "--%s %s%.80s%s: %s (from %s)", o->name, *v ? "" : "''", v, strlen(v) > 80 ? "..." : "",
                reason, src);
}

/* ---------------------------------------------------------------------------------------------
 * Value parsing
 * ------------------------------------------------------------------------------------------- */

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

static int eq_nocase(const char *a, const char *b)
{
    while (*a && lower((unsigned char)*a) == lower((unsigned char)*b))
        a++, b++;
    return *a == '\0' && *b == '\0';
}

static int parse_int(const char *s, int64_t *out)
{
    const char *p = s + (*s == '+' || *s == '-');
    if (*p < '0' || *p > '9')
        return -1;
    char *end;
    long long x = strtoll(s, &end, 10);   /* saturates on overflow: the range check catches it */
    if (*end)
        return -1;
    *out = x;
    return 0;
}

/* 0 ok, -1 not a size, -2 does not fit in 64 bits. */
static int parse_size(const char *s, uint64_t *out)
{
    uint64_t mant = 0, pow10 = 1;
    int digits = 0, dot = 0, big = 0;
    const char *p = s;
    for (;; p++) {
        if (*p >= '0' && *p <= '9') {
            if (mant > (UINT64_MAX - 9) / 10 || (dot && pow10 > UINT64_MAX / 10))
                big = 1;
            else {
                mant = mant * 10 + (uint64_t)(*p - '0');
                if (dot)
                    pow10 *= 10;
            }
            digits++;
        } else if (*p == '.' && !dot) {
            dot = 1;
            if (p[1] < '0' || p[1] > '9')
                return -1;
        } else {
            break;
        }
    }
    if (!digits)
        return -1;
    int shift = 0;
    if (*p) {
        int x = lower((unsigned char)*p);
        if (x == 'b' && p[1] == '\0') {
            shift = 0;
        } else {
            shift = x == 'k' ? 10 : x == 'm' ? 20 : x == 'g' ? 30 : x == 't' ? 40 : -1;
            if (shift < 0)
                return -1;
            p++;
            if (lower((unsigned char)*p) == 'i') {
                p++;
                if (lower((unsigned char)*p) != 'b')
                    return -1;
                p++;
            } else if (lower((unsigned char)*p) == 'b') {
                p++;
            }
            if (*p)
                return -1;
        }
    }
    if (dot && shift == 0)
        return -1;   /* a fraction of a byte */
    if (big)
        return -2;
    uint64_t mult = (uint64_t)1 << shift;
    if (mant > UINT64_MAX / mult)
        return -2;
    *out = mant * mult / pow10;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    if (!*s)
        return -1;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-'))
            return -1;
    char *end;
    double x = strtod(s, &end);
    if (*end || end == s)
        return -1;
    *out = x;
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (eq_nocase(s, yes[i])) {
            *out = 1;
            return 0;
        }
        if (eq_nocase(s, no[i])) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

/* "4M", "1T", or plain bytes when not a whole number of KiB. */
static void fmt_size(char *buf, size_t cap, uint64_t v)
{
    static const char units[] = "KMGT";
    int u = -1;
    while (u < 3 && v && v % 1024 == 0) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, cap, "%llu", (unsigned long long)v);
    else
        snprintf(buf, cap, "%llu%c", (unsigned long long)v, units[u]);
}

/* ---------------------------------------------------------------------------------------------
 * Applying one value
 * ------------------------------------------------------------------------------------------- */

static int apply(struct kiri_server_config *c, const struct opt *o, const char *v, const char *src,
                 struct errbuf *e)
{
    char *field = (char *)c + o->off;
    switch (o->kind) {
    case K_STR: {
        size_t n = strlen(v);
        if (n >= o->cap)
            return bad_value(e, o, v, src, "longer than %zu bytes", o->cap - 1);
        if ((int64_t)n < o->lo)
            return bad_value(e, o, v, src, "must not be empty");
        memcpy(field, v, n + 1);
        return 0;
    }
    case K_CHOICE: {
        const char *p = o->choices;
        while (*p) {
            size_t n = strcspn(p, "|");
            if (strlen(v) == n) {
                size_t i = 0;
                while (i < n && lower((unsigned char)v[i]) == p[i])
                    i++;
                if (i == n && n < o->cap) {
                    memcpy(field, p, n);
                    field[n] = '\0';
                    return 0;
                }
            }
            p += n + (p[n] == '|');
        }
        char list[96];
        size_t j = 0;
        for (p = o->choices; *p && j + 3 < sizeof list; p++) {
            if (*p == '|') {
                list[j++] = ',';
                list[j++] = ' ';
            } else {
                list[j++] = *p;
            }
        }
        list[j] = '\0';
        return bad_value(e, o, v, src, "must be one of %s", list);
    }
    case K_INT:
    case K_I32: {
        int64_t x;
        if (parse_int(v, &x))
            return bad_value(e, o, v, src, "not an integer");
        if (x < o->lo || x > o->hi)
            return bad_value(e, o, v, src, "must be %lld..%lld", (long long)o->lo, (long long)o->hi);
        if (o->kind == K_INT)
            *(int *)(void *)field = (int)x;
        else
            *(int32_t *)(void *)field = (int32_t)x;
        return 0;
    }
    case K_SIZE: {
        uint64_t x, hi = (uint64_t)o->hi;
        if ((uint64_t)SIZE_MAX < hi)
            hi = (uint64_t)SIZE_MAX;
        int rc = parse_size(v, &x);
        if (rc == -1)
            return bad_value(e, o, v, src, "not a size (bytes, or a number with K, M, G or T, as in 512M or 1.5G)");
        char lo_s[32], hi_s[32];
        fmt_size(lo_s, sizeof lo_s, (uint64_t)o->lo);
        fmt_size(hi_s, sizeof hi_s, hi);
        if (rc == -2 || x < (uint64_t)o->lo || x > hi)
            return bad_value(e, o, v, src, "must be %s..%s bytes", lo_s, hi_s);
        *(uint64_t *)(void *)field = x;
        return 0;
    }
    case K_DBL: {
        double x;
        if (parse_double(v, &x))
            return bad_value(e, o, v, src, "not a number of seconds");
        if (!(x > 0 && x <= o->dhi))
            return bad_value(e, o, v, src, "must be more than 0 and at most %g", o->dhi);
        *(double *)(void *)field = x;
        return 0;
    }
    case K_BOOL: {
        int x;
        if (parse_bool(v, &x))
            return bad_value(e, o, v, src, "must be 1, 0, true, false, yes, no, on or off");
        *(int *)(void *)field = x;
        return 0;
    }
    }
    return fail(e, "--%s: internal error: unknown option kind", o->name);
}

/* ---------------------------------------------------------------------------------------------
 * Sources
 * ------------------------------------------------------------------------------------------- */

static const struct opt *find_long(const char *name, size_t n)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (strlen(opts[i].name) == n && memcmp(opts[i].name, name, n) == 0)
            return &opts[i];
    return NULL;
}

static const struct opt *find_short(char c)
{
    for (size_t i = 0; i < N_OPTS; i++)
        if (opts[i].short_name && opts[i].short_name == c)
            return &opts[i];
    return NULL;
}

/* Walks argv. With c NULL it only checks the syntax and reports the last --config value in
 * *config; otherwise it applies every option to c. */
static int walk_argv(int argc, char **argv, struct kiri_server_config *c, const char **config, struct errbuf *e)
{
    static const char src[] = "the command line";
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const struct opt *o = NULL;
        const char *v = NULL;
        if (a[0] == '-' && a[1] == '-' && a[2]) {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t n = eq ? (size_t)(eq - name) : strlen(name);
            o = find_long(name, n);
            if (!o)
                return fail(e, "unknown option '%.*s'", (int)(n + 2 > 80 ? 80 : n + 2), a);
            if (eq)
                v = eq + 1;
            else if (o->kind == K_BOOL)
                v = "1";
        } else if (a[0] == '-' && a[1] && a[1] != '-') {
            o = find_short(a[1]);
            if (!o)
                return fail(e, "unknown option '-%c'", a[1]);
            if (a[2])
                v = a + 2 + (a[2] == '=');
        } else {
            return fail(e, "unexpected argument '%.80s' (settings are given as --name VALUE)", a);
        }
        if (!v) {
            if (i + 1 >= argc)
                return fail(e, "--%s needs a value (%s)", o->name, o->arg);
            v = argv[++i];
        }
        if (!c) {
            if (o->off == offsetof(struct kiri_server_config, config_file))
                *config = v;
        } else if (apply(c, o, v, src, e)) {
            return -1;
        }
    }
    return 0;
}

/* Does the environment entry "NAME=VALUE" belong to o? Sets *value when it does. */
static int env_matches(const struct opt *o, const char *entry, const char **value)
{
    if (strncmp(entry, "KIRI_", 5) != 0)
        return 0;
    const char *p = entry + 5;
    for (const char *n = o->name; *n; n++, p++) {
        int want = *n == '-' ? '_' : *n - 'a' + 'A';
        if (*n >= '0' && *n <= '9')
            want = *n;
        if (*p != want)
            return 0;
    }
    if (*p != '=')
        return 0;
    *value = p + 1;
    return 1;
}

static const char *env_get(char **envp, const struct opt *o)
{
    const char *found = NULL, *v;
    for (char **p = envp; p && *p; p++)
        if (env_matches(o, *p, &v))
            found = v;
    return found && *found ? found : NULL;
}

static int apply_env(struct kiri_server_config *c, char **envp, struct errbuf *e)
{
    for (size_t i = 0; i < N_OPTS; i++) {
        const char *v = env_get(envp, &opts[i]);
        if (!v)
            continue;
        char src[48] = "KIRI_";
        size_t j = 5;
        for (const char *n = opts[i].name; *n && j + 1 < sizeof src; n++)
            src[j++] = *n == '-' ? '_' : (char)(*n >= 'a' && *n <= 'z' ? *n - 'a' + 'A' : *n);
        src[j] = '\0';
        if (apply(c, &opts[i], v, src, e))
            return -1;
    }
    return 0;
}

static int is_blank(int c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* Parses the config file text in buf (NUL-terminated, n bytes, modified in place). */
static int apply_file_text(struct kiri_server_config *c, const char *path, char *buf, size_t n,
                           struct errbuf *e)
{
    if (memchr(buf, '\0', n)) {
        size_t at = strlen(buf);
        int line = 1;
        for (size_t i = 0; i < at; i++)
            line += buf[i] == '\n';
        return fail(e, "%s line %d: a NUL byte (is this a text file?)", path, line);
    }
    char *p = buf;
    if (n >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0)
        p += 3;
    for (int line = 1; *p; line++) {
        char *end = strchr(p, '\n');
        char *next = end ? end + 1 : p + strlen(p);
        if (end)
            *end = '\0';
        char *b = p, *t = p + strlen(p);
        p = next;
        while (b < t && is_blank((unsigned char)*b))
            b++;
        while (t > b && is_blank((unsigned char)t[-1]))
            t--;
        *t = '\0';
        if (b == t || *b == '#')
            continue;
        char *eq = strchr(b, '=');
        if (!eq)
            return fail(e, "%s line %d: expected key = value", path, line);
        char *k_end = eq;
        while (k_end > b && is_blank((unsigned char)k_end[-1]))
            k_end--;
        *k_end = '\0';
        for (char *q = b; *q; q++)
            if (*q == '_')
                *q = '-';
        char *v = eq + 1;
        while (is_blank((unsigned char)*v))
            v++;
        if (*v == '"') {
            char *close = strchr(v + 1, '"');
            if (!close)
                return fail(e, "%s line %d: the quoted value has no closing quote", path, line);
            char *after = close + 1;
            while (is_blank((unsigned char)*after))
                after++;
            if (*after && *after != '#')
                return fail(e, "%s line %d: unexpected text after the closing quote", path, line);
            *close = '\0';
            v++;
        } else {
            for (char *q = v; *q; q++)
                if (*q == '#' && q > v && is_blank((unsigned char)q[-1])) {
                    *q = '\0';
                    break;
                }
            char *vt = v + strlen(v);
            while (vt > v && is_blank((unsigned char)vt[-1]))
                vt--;
            *vt = '\0';
        }
        if (!*b)
            return fail(e, "%s line %d: expected key = value (the key is missing)", path, line);
        const struct opt *o = find_long(b, strlen(b));
        if (!o)
            return fail(e, "%s line %d: unknown key '%.64s'", path, line, b);
        if (o->off == offsetof(struct kiri_server_config, config_file))
            return fail(e, "%s line %d: 'config' cannot be set inside a config file", path, line);
        char src[1200];
        snprintf(src, sizeof src, "%s line %d", path, line);
        if (apply(c, o, v, src, e))
            return -1;
    }
    return 0;
}

static int apply_file(struct kiri_server_config *c, const char *path, struct errbuf *e)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(e, "--config %s: cannot open (%s)", path, strerror(errno));
    char *buf = kiri_mem_alloc(FILE_MAX + 2);
    if (!buf) {
        fclose(f);
        return fail(e, "--config %s: out of memory", path);
    }
    size_t n = fread(buf, 1, FILE_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    int rc;
    if (bad) {
        rc = fail(e, "--config %s: cannot read it", path);
    } else if (n > FILE_MAX) {
        rc = fail(e, "--config %s: larger than 1 MiB", path);
    } else {
        buf[n] = '\0';
        rc = apply_file_text(c, path, buf, n, e);
    }
    kiri_mem_free(buf);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

static void default_alias(struct kiri_server_config *c)
{
    const char *base = strrchr(c->model, '/');
    base = base && base[1] ? base + 1 : c->model;
    size_t n = strlen(base);
    if (n >= sizeof c->model_alias) {
        n = sizeof c->model_alias - 1;
        while (n > 0 && ((unsigned char)base[n] & 0xC0) == 0x80)
            n--;   /* do not cut a UTF-8 character in two */
    }
    memcpy(c->model_alias, base, n);
    c->model_alias[n] = '\0';
}

int kiri_server_config_load(struct kiri_server_config *cfg, int argc, char **argv, char **envp,
                            char *err, size_t err_cap)
{
    struct errbuf e = {err, err_cap};
    if (!cfg || argc < 0 || (argc > 0 && !argv))
        return fail(&e, "kiri_server_config_load: invalid arguments");
    /* About 17 KiB: fine on any thread's stack, and cfg stays untouched on failure. */
    struct kiri_server_config c;
    set_defaults(&c);

    const char *config = NULL;
    if (walk_argv(argc, argv, NULL, &config, &e))
        return -1;
    if (!config)   /* an explicit --config "" means no file, whatever KIRI_CONFIG says */
        config = env_get(envp, find_long("config", 6));
    if (config && *config) {
        if (strlen(config) >= sizeof c.config_file)
            return fail(&e, "--config: the path is longer than %zu bytes", sizeof c.config_file - 1);
        if (apply_file(&c, config, &e))
            return -1;
    }
    if (apply_env(&c, envp, &e) || walk_argv(argc, argv, &c, NULL, &e))
        return -1;

    if (!c.model[0] && !c.models_dir[0])
        return fail(&e, "--model is required: the GGUF file to serve (or KIRI_MODEL, or model = FILE "
                        "in the config file), or --models-dir DIR");
    if (c.model[0] && c.models_dir[0])
        return fail(&e, "--model and --models-dir exclude each other: serve one file or a directory");
    if (c.fleet_url[0] && (!c.models_dir[0] || !c.fleet_key[0]))
        return fail(&e, "--fleet needs --models-dir DIR (where the fleet's models live) and --fleet-key FILE "
                        "(the pinned public key)");
    if (!c.fleet_url[0] && (c.fleet_key[0] || c.fleet_ca[0]))
        return fail(&e, "--fleet-key and --fleet-ca apply only with --fleet URL");
    if (!c.upstream[0] && !c.fleet_url[0] && (c.upstream_key_file[0] || c.upstream_ca[0] || c.route[0]))
        return fail(&e, "--upstream-key-file, --upstream-ca and --route apply only with --upstream URL (or --fleet, "
                        "whose manifest may name the upstream)");
    if (c.upstream[0] && strncmp(c.upstream, "http://", 7) != 0 && strncmp(c.upstream, "https://", 8) != 0)
        return fail(&e, "--upstream %.200s: must be an http:// or https:// URL", c.upstream);
    if (c.fleet_url[0] && strncmp(c.fleet_url, "https://", 8) != 0)
        return fail(&e, "--fleet %.200s: must be an https:// URL", c.fleet_url);
    if (!c.tls_cert[0] != !c.tls_key[0])
        return fail(&e, "--tls-cert and --tls-key must be given together (only --%s is set)",
                    c.tls_cert[0] ? "tls-cert" : "tls-key");
    if (c.ctx > 0 && c.max_prompt_tokens >= c.ctx)
        return fail(&e, "--max-prompt-tokens %ld: must be less than --ctx %ld", (long)c.max_prompt_tokens,
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

struct out {
    char *p;
    size_t cap, n;   /* n may pass cap: what does not fit is dropped, the text stays terminated */
};

static void out_put(struct out *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++, o->n++)
        if (o->n + 1 < o->cap)
            o->p[o->n] = s[i];
    if (o->cap)
        o->p[o->n < o->cap ? o->n : o->cap - 1] = '\0';
}

static void out_s(struct out *o, const char *s) { out_put(o, s, strlen(s)); }

#define USAGE_COL 30
#define USAGE_WIDTH 100

/* Writes text word by word from column *col, wrapping before USAGE_WIDTH and indenting
 * continuation lines to USAGE_COL. */
static void out_wrapped(struct out *o, const char *text, size_t *col)
{
    int first = 1;
    for (const char *p = text; *p;) {
        while (*p == ' ')
            p++;
        size_t w = strcspn(p, " ");
        if (!w)
            break;
        if (!first && *col + 1 + w > USAGE_WIDTH) {
            out_s(o, "\n");
            for (*col = 0; *col < USAGE_COL; (*col)++)
                out_s(o, " ");
        } else if (!first) {
            out_s(o, " ");
            (*col)++;
        }
        for (size_t i = 0; i < w; i++)
            out_put(o, p[i] == '\x01' ? " " : p + i, 1);   /* \x01: a space that never breaks */
        *col += w;
        p += w;
        first = 0;
    }
}

void kiri_server_config_usage(char *buf, size_t cap)
{
    struct out o = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    out_s(&o, "Options. Each can also be set by the environment variable KIRI_<NAME> (--kv-memory is\n"
              "KIRI_KV_MEMORY) or by a line `name = value` in the --config file. Precedence: flag >\n"
              "environment > file > default. Sizes take K, M, G or T suffixes (powers of 1024).\n\n");
    for (size_t i = 0; i < N_OPTS; i++) {
        const struct opt *op = &opts[i];
        char head[64];
        if (op->short_name)
            snprintf(head, sizeof head, "  -%c, --%s%s%s", op->short_name, op->name, op->arg ? " " : "",
                     op->arg ? op->arg : "");
        else
            snprintf(head, sizeof head, "      --%s%s%s", op->name, op->arg ? " " : "", op->arg ? op->arg : "");
        out_s(&o, head);
        size_t col = strlen(head);
        if (col + 2 > USAGE_COL) {
            out_s(&o, "\n");
            col = 0;
        }
        while (col < USAGE_COL) {
            out_s(&o, " ");
            col++;
        }
        char text[400];
        snprintf(text, sizeof text, "%s Default:\x01%s.", op->help, op->def);
        out_wrapped(&o, text, &col);
        out_s(&o, "\n");
    }
}
