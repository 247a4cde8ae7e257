/* The kiri command line: run, chat, tokenize, info, quantize, bench, and in a build with the server
 * serve, pull and fleet. Each command's flags and its --help text come from one option table
 * (base/options.h). The engine commands use only the public API (kiri.h), as any program
 * embedding libkiri would. Errors go to stderr, one line, exit status 1; usage errors (a bad
 * flag, a command this build lacks) exit with status 2. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "chat.h"
#include "chat_prompt.h"
#include "chat_template.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "options.h"
#include "platform.h"
#ifdef KIRI_WITH_SERVER
#include "config.h"
#include "fleet_cli.h"
#include "server.h"
#endif
#ifdef KIRI_WITH_SCHEMA
#include "json_schema.h"
#endif

#define MAX_STOP 16

/* What the commands' option tables fill; the defaults are set by options_default. */
struct options {
    const char *model;          /* borrowed from argv, like every string here */
    const char *prompt;
    const char *system;
    const char *json_schema;
    const char *backend;
    const char *cpu_kernels;
    int n_predict;
    int n_predict_chat;
    int raw;
    int show_prompt;
    int no_stats;
    int n_threads;
    int gpu_layers;
    int n_ctx;
    int n_batch;
    char kv_type[8];
    int no_bos;
    int json;
    int n_prompt_bench;
    int n_gen_bench;
    int repetitions;
    const char *depths;         /* kiri bench -d: a comma-separated list of context depths */
    int no_warmup;
    struct kiri_sampling sampling;
    const char *stop[MAX_STOP];
    int n_stop;
    const char *grammar_file;
    char spec[8];               /* enum kiri_spec as spelled by kiri_spec_name */
    const char *draft_model;    /* --draft-model FILE */
    int spec_max;
    const char *bench_text;     /* kiri bench --spec: the prompt of the generation test */
};

static void options_default(struct options *o)
{
    memset(o, 0, sizeof *o);
    o->n_predict = 256;
    o->n_predict_chat = -1;
    o->n_prompt_bench = 512;
    o->n_gen_bench = 128;
    o->repetitions = 3;
    snprintf(o->kv_type, sizeof o->kv_type, "f16");
    o->backend = "auto";
    o->gpu_layers = -1;
    kiri_sampling_default(&o->sampling);
    snprintf(o->spec, sizeof o->spec, "none");
}

/* ---------------------------------------------------------------------------------------------
 * The option tables, one group per concern; each command takes the groups it uses.
 * ------------------------------------------------------------------------------------------- */

#define O(m) KIRI_OPTION_FIELD(struct options, m)
#define MODEL_OPTION                                                                                \
    {.name = "model", .short_name = 'm', .type = KIRI_OPTION_STRING_REF, O(model), .arg = "FILE",    \
     .help = "The GGUF model file."}

static const struct kiri_option model_opts[] = {
    MODEL_OPTION,
    {.name = "threads", .short_name = 't', .type = KIRI_OPTION_INT, O(n_threads), .lo = 1, .hi = 1024, .arg = "N",
     .help = "Worker threads.", .def = "one per core"},
    {.name = "backend", .type = KIRI_OPTION_STRING_REF, O(backend), .arg = "NAME",
     .help = "The compute backend: auto, cpu, vulkan or cuda.", .def = "auto"},
    {.name = "gpu-layers", .type = KIRI_OPTION_INT, O(gpu_layers), .lo = -1, .hi = 1 << 20, .arg = "N",
     .help = "With a GPU backend, runs only the first N layers on it and the rest on the CPU; -1 runs all of "
             "them there, 0 none.", .def = "-1"},
    {.name = "cpu-kernels", .type = KIRI_OPTION_STRING_REF, O(cpu_kernels), .arg = "TIER",
     .help = "The best CPU kernels to use: auto, c, avx2, avx512, neon, dotprod or i8mm; a tier this CPU "
             "lacks is an error.", .def = "auto"},
};

static const struct kiri_option context_opts[] = {
    {.name = "ctx-size", .short_name = 'c', .type = KIRI_OPTION_INT, O(n_ctx), .lo = 1, .hi = 1 << 24, .arg = "N",
     .help = "Context length in tokens.", .def = "the model's"},
    {.name = "batch-size", .short_name = 'b', .type = KIRI_OPTION_INT, O(n_batch), .lo = 1, .hi = 8192, .arg = "N",
     .help = "Prompt tokens per step.", .def = "512"},
    {.name = "kv-type", .type = KIRI_OPTION_ENUM, O(kv_type), .choices = "f16|f32|q8_0", .arg = "TYPE",
     .help = "The element type of the KV cache: f16, f32 or q8_0.", .def = "f16"},
};

#define S(m) KIRI_OPTION_FIELD(struct options, sampling.m)
static const struct kiri_option sampling_opts[] = {
    {.name = "temp", .type = KIRI_OPTION_FLOAT, S(temperature), .arg = "T",
     .help = "Temperature; 0 is greedy.", .def = "0.8"},
    {.name = "top-k", .type = KIRI_OPTION_INT, S(top_k), .lo = 0, .hi = 1 << 24, .arg = "N",
     .help = "Keeps the N likeliest tokens; 0 keeps all.", .def = "40"},
    {.name = "top-p", .type = KIRI_OPTION_FLOAT, S(top_p), .arg = "P",
     .help = "Keeps the likeliest tokens whose probabilities add up to P; 1 keeps all.", .def = "0.95"},
    {.name = "min-p", .type = KIRI_OPTION_FLOAT, S(min_p), .arg = "P",
     .help = "Drops tokens less likely than P times the likeliest.", .def = "0.05"},
    {.name = "repeat-penalty", .type = KIRI_OPTION_FLOAT, S(repeat_penalty), .arg = "P",
     .help = "Divides the logits of recent tokens by P; 1 is off.", .def = "1"},
    {.name = "repeat-last-n", .type = KIRI_OPTION_INT, S(repeat_last_n), .lo = 0, .hi = 1 << 20, .arg = "N",
     .help = "Recent tokens the penalties look back over.", .def = "64"},
    {.name = "frequency-penalty", .type = KIRI_OPTION_FLOAT, S(frequency_penalty), .arg = "P",
     .help = "Subtracts P times a recent token's count from its logit.", .def = "0"},
    {.name = "presence-penalty", .type = KIRI_OPTION_FLOAT, S(presence_penalty), .arg = "P",
     .help = "Subtracts P from the logit of every recent token.", .def = "0"},
    {.name = "seed", .type = KIRI_OPTION_UINT64, S(seed), .arg = "S", .help = "The sampling seed.", .def = "0"},
    {.name = "stop", .type = KIRI_OPTION_STRINGS, O(stop), .count_off = offsetof(struct options, n_stop), .lo = 1,
     .arg = "TEXT", .help = "Ends generation at TEXT (repeatable, up to 16 times)."},
};

#define SYSTEM_OPTION                                                                               \
    {.name = "system", .type = KIRI_OPTION_STRING_REF, O(system), .arg = "TEXT",                     \
     .help = "A system message before the conversation (with a chat template)."}
#define GRAMMAR_OPTION                                                                              \
    {.name = "grammar", .type = KIRI_OPTION_STRING_REF, O(grammar_file), .arg = "FILE",              \
     .help = "Constrains the output to a GBNF grammar (llama.cpp's format) read from FILE."}
#define JSON_SCHEMA_OPTION                                                                          \
    {.name = "json-schema", .type = KIRI_OPTION_STRING_REF, O(json_schema), .arg = "FILE",           \
     .help = "Constrains the output to JSON that validates against the JSON Schema in FILE."}

static const struct kiri_option run_opts[] = {
    {.name = "prompt", .short_name = 'p', .type = KIRI_OPTION_STRING_REF, O(prompt), .arg = "TEXT",
     .help = "The prompt (required). With a model whose file has a chat template it is sent as a user "
             "message through that template, ready for the answer; see --raw."},
    {.name = "n-predict", .short_name = 'n', .type = KIRI_OPTION_INT, O(n_predict), .lo = -1, .hi = 1 << 24,
     .arg = "N", .help = "Tokens to generate; -1 generates until the end-of-sequence token.", .def = "256"},
    SYSTEM_OPTION,
    {.name = "raw", .type = KIRI_OPTION_FLAG, O(raw),
     .help = "Tokenizes the prompt as it is, without the chat template (what a model without one gets)."},
    {.name = "show-prompt", .type = KIRI_OPTION_FLAG, O(show_prompt),
     .help = "Prints the prompt text as the model would get it (after the template) and exits."},
    GRAMMAR_OPTION,
    JSON_SCHEMA_OPTION,
};

static const struct kiri_option chat_opts[] = {
    SYSTEM_OPTION,
    {.name = "n-predict", .short_name = 'n', .type = KIRI_OPTION_INT, O(n_predict_chat), .lo = -1, .hi = 1 << 24,
     .arg = "N", .help = "Most tokens per answer; -1 lets an answer run until the model ends its turn or the "
             "context is full.", .def = "-1"},
    {.name = "no-stats", .type = KIRI_OPTION_FLAG, O(no_stats),
     .help = "Does not print the speed line (tokens, tok/s, time to the first token) after each answer."},
    GRAMMAR_OPTION,
    JSON_SCHEMA_OPTION,
};

static const struct kiri_option spec_opts[] = {
    {.name = "spec", .type = KIRI_OPTION_ENUM, O(spec), .choices = "none|ngram|draft|mtp", .arg = "KIND",
     .help = "Speculative decoding: ngram drafts tokens by looking the text's last few tokens up in the "
             "prompt and the text so far, draft has --draft-model guess them, mtp the model's own "
             "multi-token-prediction head (qwen35 files that carry one); one step verifies them, and "
             "the output is the same.", .def = "none (draft with --draft-model)"},
    {.name = "draft-model", .type = KIRI_OPTION_STRING_REF, O(draft_model), .arg = "FILE",
     .help = "A smaller model with the same vocabulary (or a lower-precision copy of the model) that drafts "
             "tokens for --spec draft."},
    {.name = "spec-max", .type = KIRI_OPTION_INT, O(spec_max), .lo = 1, .hi = KIRI_SPEC_MAX_DRAFT, .arg = "N",
     .help = "Most tokens drafted at once (the draft length adapts below it).", .def = "8"},
};

static const struct kiri_option grammar_opts[] = {
    GRAMMAR_OPTION,
    JSON_SCHEMA_OPTION,
};

static const struct kiri_option bench_opts[] = {
    {.name = "prompt", .short_name = 'p', .type = KIRI_OPTION_INT, O(n_prompt_bench), .lo = 0, .hi = 1 << 20,
     .arg = "N", .help = "Prompt tokens to process; 0: no prefill test.", .def = "512"},
    {.name = "n-predict", .short_name = 'n', .type = KIRI_OPTION_INT, O(n_gen_bench), .lo = -1, .hi = 1 << 24,
     .arg = "N", .help = "Tokens to generate; 0: no decode test (with --spec, and -1: the default).", .def = "128"},
    {.name = "repetitions", .short_name = 'r', .type = KIRI_OPTION_INT, O(repetitions), .lo = 1, .hi = 100,
     .arg = "N", .help = "Timed runs of each test.", .def = "3"},
    {.name = "depth", .short_name = 'd', .type = KIRI_OPTION_STRING_REF, O(depths), .arg = "D[,D...]",
     .help = "Context depths, as llama-bench's -d: before every timed run, D pseudo-random tokens fill the "
             "context untimed, then the prefill of -p tokens or the decode of -n tokens is timed at that depth "
             "(each from D, not one after the other). A list runs both tests at each depth.", .def = "0"},
    {.name = "no-warmup", .type = KIRI_OPTION_FLAG, O(no_warmup),
     .help = "Skips the untimed warm-up (one prefill of -p tokens and one decode step) before the timed runs."},
    {.name = "json", .type = KIRI_OPTION_FLAG, O(json), .help = "Prints one JSON object."},
    {.name = "text", .type = KIRI_OPTION_STRING_REF, O(bench_text), .arg = "TEXT",
     .help = "With --spec: the prompt of the generation test (tokenized as it is, with BOS).",
     .def = "a passage and the request to copy it"},
};

static const struct kiri_option tokenize_opts[] = {
    MODEL_OPTION,
    {.name = "no-bos", .type = KIRI_OPTION_FLAG, O(no_bos), .help = "Does not add the BOS token."},
};

#define GROUP(title, opts) {title, opts, sizeof opts / sizeof opts[0]}
static const struct kiri_option_group run_groups[] = {
    GROUP(NULL, run_opts), GROUP("model options", model_opts), GROUP("context options", context_opts),
    GROUP("sampling options", sampling_opts), GROUP("speculative decoding", spec_opts)};
static const struct kiri_option_group chat_groups[] = {
    GROUP(NULL, chat_opts), GROUP("model options", model_opts), GROUP("context options", context_opts),
    GROUP("sampling options", sampling_opts), GROUP("speculative decoding", spec_opts)};
static const struct kiri_option_group bench_groups[] = {
    GROUP(NULL, bench_opts), GROUP("model options", model_opts), GROUP("context options", context_opts),
    GROUP("speculative decoding", spec_opts)};
static const struct kiri_option_group info_groups[] = {GROUP(NULL, model_opts)};
static const struct kiri_option_group grammar_groups[] = {GROUP(NULL, grammar_opts)};
static const struct kiri_option_group tokenize_groups[] = {GROUP(NULL, tokenize_opts)};

#define SPEC(groups, max_positional) {groups, sizeof groups / sizeof groups[0], NULL, NULL, max_positional}
static const struct kiri_option_spec run_spec = SPEC(run_groups, 0);
static const struct kiri_option_spec chat_spec = SPEC(chat_groups, 0);
static const struct kiri_option_spec bench_spec = SPEC(bench_groups, 0);
static const struct kiri_option_spec info_spec = SPEC(info_groups, 0);
static const struct kiri_option_spec grammar_spec = SPEC(grammar_groups, 0);
static const struct kiri_option_spec tokenize_spec = SPEC(tokenize_groups, 1);
static const struct kiri_option_spec quantize_spec = {NULL, 0, NULL, NULL, 3};

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

/* Tokenizes text into a heap array (*ids, owned by the caller: kiri_mem_free). */
static int tokenize_alloc(struct kiri_model *m, const char *text, int add_bos, int32_t **ids, int *n)
{
    const size_t len = strlen(text);
    int need = kiri_tokenize(m, text, len, add_bos, 0, NULL, 0);
    if (need < 0) {
        fprintf(stderr, "kiri: error: cannot tokenize the text (%s)\n", kiri_status_name(need));
        return 1;
    }
    *ids = kiri_mem_array((size_t)need + 1, sizeof **ids);
    if (!*ids) {
        fprintf(stderr, "kiri: error: out of memory\n");
        return 1;
    }
    *n = kiri_tokenize(m, text, len, add_bos, 0, *ids, need);
    return 0;
}

static int kv_type_code(const struct options *o)
{
    return strcmp(o->kv_type, "f32") == 0 ? 0 : strcmp(o->kv_type, "q8_0") == 0 ? 8 : 1;
}

/* --spec and --draft-model: the kind (--draft-model alone means draft), or -1 after saying why
 * not. */
static int spec_kind(const struct options *o)
{
    int kind = kiri_spec_parse(o->spec);
    if (kind == KIRI_SPEC_NONE && o->draft_model)
        kind = KIRI_SPEC_DRAFT;
    if (kind == KIRI_SPEC_DRAFT && !o->draft_model) {
        fprintf(stderr, "kiri: error: --spec draft needs --draft-model FILE\n");
        return -1;
    }
    if (kind != KIRI_SPEC_DRAFT && o->draft_model) {
        fprintf(stderr, "kiri: error: --draft-model drafts only for --spec draft, not --spec %s\n", o->spec);
        return -1;
    }
    return kind;
}

/* The --draft-model, opened as the model is (NULL without one). */
static int open_draft_model(const struct options *o, struct kiri_model **m)
{
    *m = NULL;
    if (!o->draft_model)
        return 0;
    struct options d = *o;
    d.model = o->draft_model;
    return open_model(&d, 0, m);
}

static int make_context(struct kiri_model *m, const struct options *o, struct kiri_model *draft,
                        struct kiri_context **c)
{
    struct kiri_context_params cp;
    kiri_context_params_default(&cp);
    cp.draft_model = draft;
    cp.speculative = spec_kind(o) > 0;
    cp.mtp = spec_kind(o) == KIRI_SPEC_MTP;
    cp.n_ctx = o->n_ctx;
    if (o->n_batch)
        cp.n_batch = o->n_batch;
    cp.kv_type = kv_type_code(o);
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

/* The prompt through the model's chat template: a user message (after the system one), ready
 * for the answer. Tokens in *ids (kiri_mem_free); with --show-prompt the text is printed instead
 * and *ids stays NULL. */
static int templated_prompt(struct kiri_model *m, const struct options *o, int32_t **ids, int *n)
{
    struct kiri_chat_prompt *cp = NULL;
    struct kiri_status_info info;
    if (kiri_chat_prompt_init(m, &cp, &info) != KIRI_OK)
        return fail("chat template", &info);
    if (kiri_chat_prompt_fallback(cp))
        fprintf(stderr, "kiri: %s; using ChatML (--raw sends the prompt as it is)\n", kiri_chat_prompt_fallback(cp));
    struct kiri_chat_message msgs[2];
    int n_msgs = 0;
    if (o->system)
        msgs[n_msgs++] = (struct kiri_chat_message){"system", o->system};
    msgs[n_msgs++] = (struct kiri_chat_message){"user", o->prompt};
    char *text = NULL;
    size_t len = 0;
    int rc = kiri_chat_prompt_render(cp, msgs, n_msgs, 1, &text, &len, &info);
    if (rc != KIRI_OK) {
        rc = fail("chat template", &info);
    } else if (o->show_prompt) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
    } else {
        int32_t count = 0;
        if (kiri_chat_prompt_tokenize(cp, text, len, ids, &count, &info) != KIRI_OK)
            rc = fail("prompt", &info);
        *n = count;
    }
    kiri_mem_free(text);
    kiri_chat_prompt_free(cp);
    return rc;
}

/* The prompt's tokens: through the chat template when the file has one (unless --raw), else the
 * text as it is. */
static int run_prompt(struct kiri_model *m, const struct options *o, int32_t **ids, int *n)
{
    const char *t = NULL;
    size_t t_len = 0;
    if (!o->raw && kiri_model_meta_str(m, "tokenizer.chat_template", &t, &t_len) == KIRI_OK && t_len > 0)
        return templated_prompt(m, o, ids, n);
    if (o->system)
        fprintf(stderr, "kiri: --system is ignored: %s\n",
                o->raw ? "--raw sends the prompt as it is" : "the model file has no chat template");
    if (o->show_prompt) {
        fputs(o->prompt, stdout);
        fflush(stdout);
        return 0;
    }
    return tokenize_alloc(m, o->prompt, -1, ids, n);
}

/* The grammar of --grammar FILE, or the one --json-schema FILE compiles to, checked (*gbnf
 * NULL when there is neither; kiri_mem_free). Returns the exit status for an error. */
static int load_grammar(const struct options *o, char **gbnf, size_t *len)
{
    *gbnf = NULL;
    *len = 0;
    if (o->grammar_file && o->json_schema) {
        fprintf(stderr, "kiri: error: --grammar and --json-schema exclude each other\n");
        return 2;
    }
    const char *path = o->grammar_file ? o->grammar_file : o->json_schema;
    if (!path)
        return 0;
    char *text = NULL;
    size_t text_len = 0;
    struct kiri_status_info info;
    memset(&info, 0, sizeof info);
    if (kiri_platform_read_file(path, KIRI_GRAMMAR_MAX_SIZE, &text, &text_len, &info) != KIRI_OK) {
        fprintf(stderr, "kiri: error: %s\n", info.message);
        return 1;
    }
    int rc = KIRI_OK;
    if (o->json_schema) {
#ifdef KIRI_WITH_SCHEMA
        rc = kiri_json_schema_to_gbnf(text, text_len, NULL, NULL, gbnf, len, &info);
#else
        rc = kiri_error_set(&info, KIRI_E_UNSUPPORTED, "this build has no JSON Schema compiler (it needs Jansson)");
#endif
        kiri_mem_free(text);
    } else {
        *gbnf = text;
        *len = text_len;
    }
    if (rc == KIRI_OK)
        rc = kiri_grammar_check(*gbnf, *len, &info);
    if (rc != KIRI_OK) {
        if (info.field[0] && strcmp(info.field, "grammar") != 0 && strcmp(info.field, "json_schema") != 0)
            fprintf(stderr, "kiri: error: %s: %s (at %s)\n", path, info.message, info.field);
        else
            fprintf(stderr, "kiri: error: %s: %s\n", path, info.message);
        kiri_mem_free(*gbnf);
        *gbnf = NULL;
        *len = 0;
        return 1;
    }
    return 0;
}

static int cmd_run(const struct options *o, const char **args, int n_args)
{
    (void)args;
    (void)n_args;
    if (!o->prompt) {
        fprintf(stderr, "kiri: error: -p PROMPT is required\n");
        return 2;
    }
    const int spec = spec_kind(o);
    if (spec < 0)
        return 2;
    struct kiri_model *m = NULL, *dm = NULL;
    struct kiri_context *c = NULL;
    int32_t *ids = NULL;
    char *grammar = NULL;
    size_t grammar_len = 0;
    int n = 0, rc = load_grammar(o, &grammar, &grammar_len);
    if (rc != 0)
        return rc;
    rc = open_model(o, o->show_prompt, &m);
    if (rc == 0 && !o->show_prompt)
        rc = open_draft_model(o, &dm);
    if (rc == 0)
        rc = run_prompt(m, o, &ids, &n);
    if (rc == 0 && o->show_prompt) {
        kiri_mem_free(grammar);
        kiri_model_close(m);
        return 0;
    }
    if (rc == 0 && n == 0) {
        fprintf(stderr, "kiri: error: the prompt is empty and the model adds no BOS token\n");
        rc = 1;
    }
    if (rc == 0)
        rc = make_context(m, o, dm, &c);
    if (rc == 0) {
        struct kiri_generate_params gp;
        memset(&gp, 0, sizeof gp);
        gp.max_tokens = o->n_predict;
        gp.sampling = o->sampling;
        gp.stop = o->stop;
        gp.n_stop = o->n_stop;
        gp.grammar = grammar;
        gp.grammar_len = grammar_len;
        gp.speculative = spec;
        gp.spec_max = o->spec_max;
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
            if (gp.speculative)
                fprintf(stderr, "kiri: speculative (%s): %d tokens drafted, %d kept\n", kiri_spec_name(spec),
                        res.n_drafted, res.n_accepted);
        }
    }
    kiri_mem_free(ids);
    kiri_mem_free(grammar);
    kiri_context_free(c);
    kiri_model_close(dm);
    kiri_model_close(m);
    return rc;
}

static int cmd_chat(const struct options *o, const char **args, int n_args)
{
    (void)args;
    (void)n_args;
    const int spec = spec_kind(o);
    if (spec < 0)
        return 2;
    struct kiri_model *m = NULL, *dm = NULL;
    char *grammar = NULL;
    size_t grammar_len = 0;
    int rc = load_grammar(o, &grammar, &grammar_len);
    if (rc != 0)
        return rc;
    rc = open_model(o, 0, &m);
    if (rc == 0)
        rc = open_draft_model(o, &dm);
    if (rc != 0) {
        kiri_mem_free(grammar);
        kiri_model_close(m);
        return rc;
    }
    struct kiri_chat_cli_params p;
    memset(&p, 0, sizeof p);
    p.system = o->system;
    p.sampling = o->sampling;
    p.stop = o->stop;
    p.n_stop = o->n_stop;
    p.max_tokens = o->n_predict_chat;
    p.n_ctx = o->n_ctx;
    p.n_batch = o->n_batch;
    p.kv_type = kv_type_code(o);
    p.show_stats = !o->no_stats;
    p.grammar = grammar;
    p.grammar_len = grammar_len;
    p.speculative = spec;
    p.spec_max = o->spec_max;
    p.draft_model = dm;
    rc = kiri_chat_cli_run(m, o->model, &p);
    kiri_mem_free(grammar);
    kiri_model_close(dm);
    kiri_model_close(m);
    return rc;
}

/* Checks a grammar, or prints the GBNF a JSON Schema compiles to (what --json-schema enforces,
 * for reading, editing, or handing to another tool). */
static int cmd_grammar(const struct options *o, const char **args, int n_args)
{
    (void)args;
    (void)n_args;
    if (!o->grammar_file && !o->json_schema) {
        fprintf(stderr, "kiri: error: give --grammar FILE or --json-schema FILE\n");
        return 2;
    }
    char *gbnf = NULL;
    size_t len = 0;
    int rc = load_grammar(o, &gbnf, &len);
    if (rc != 0)
        return rc;
    if (o->json_schema)
        fwrite(gbnf, 1, len, stdout);
    else
        fprintf(stderr, "kiri: %s: a valid grammar\n", o->grammar_file);
    kiri_mem_free(gbnf);
    return 0;
}

static int cmd_tokenize(const struct options *o, const char **args, int n_args)
{
    if (n_args != 1) {
        fprintf(stderr, "kiri: error: tokenize takes exactly one TEXT argument\n");
        return 2;
    }
    struct kiri_model *m = NULL;
    int32_t *ids = NULL;
    int n = 0, rc = open_model(o, 1, &m);
    if (rc == 0)
        rc = tokenize_alloc(m, args[0], o->no_bos ? 0 : -1, &ids, &n);
    if (rc == 0) {
        for (int i = 0; i < n; i++)
            printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    kiri_mem_free(ids);
    kiri_model_close(m);
    return rc;
}

static int cmd_info(const struct options *o, const char **args, int n_args)
{
    (void)args;
    (void)n_args;
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

static int cmd_quantize(const struct options *o, const char **args, int n_args)
{
    (void)o;
    if (n_args != 3) {
        fprintf(stderr, "kiri: error: usage: kiri quantize IN.gguf OUT.gguf TYPE\n");
        return 2;
    }
    struct kiri_status_info info;
    /* The bar redraws one line with \r: only a terminal shows it as such, a log would get one
     * line per tensor. */
    void (*progress)(void *, int64_t, int64_t) = kiri_platform_is_terminal(2) ? progress_bar : NULL;
    if (kiri_quantize(args[0], args[1], args[2], progress, NULL, &info) != KIRI_OK)
        return fail("quantize", &info);
    fprintf(stderr, "kiri: wrote %s\n", args[1]);
    return 0;
}

/* kiri bench measures the way llama-bench does, so the two print comparable numbers: two tests
 * per depth, the prefill of n_prompt tokens ("pp") and the decode of n_gen tokens one at a time
 * ("tg"), each repeated; before every timed run the context is cleared and refilled with `depth`
 * pseudo-random tokens, untimed, so both tests start right after `depth` tokens. Decode feeds
 * pseudo-random tokens too (nothing is sampled). One untimed warm-up (a prefill and one decode
 * step) comes first, as llama-bench's. */
#define BENCH_MAX_DEPTHS 16
#define BENCH_MAX_DEPTH (1 << 20)

struct bench_test {
    int n_prompt, n_gen, n_depth;   /* one of n_prompt, n_gen is 0, as in llama-bench's tests */
    double seconds[100];            /* one per repetition (options cap -r at 100) */
    int n_runs;
};

/* Parses "0,512,2048" into depths[]; returns the count, or -1 with a message in err. */
static int parse_depths(const char *text, int *depths, char *err, size_t cap)
{
    if (!text || !*text) {
        depths[0] = 0;
        return 1;
    }
    int n = 0;
    const char *p = text;
    for (;;) {
        long v = 0;
        int digits = 0;
        while (*p >= '0' && *p <= '9' && digits < 9) {
            v = v * 10 + (*p++ - '0');
            digits++;
        }
        if (!digits || v > BENCH_MAX_DEPTH || (*p && *p != ',') || n == BENCH_MAX_DEPTHS) {
            snprintf(err, cap, "--depth wants up to %d comma-separated depths of 0 to %d tokens, not '%s'",
                     BENCH_MAX_DEPTHS, BENCH_MAX_DEPTH, text);
            return -1;
        }
        depths[n++] = (int)v;
        if (!*p)
            return n;
        p++;
    }
}

static void fill_random(int32_t *ids, int n, uint32_t *state, int32_t n_vocab)
{
    for (int i = 0; i < n; i++) {
        *state = *state * 1664525u + 1013904223u;
        ids[i] = (int32_t)((*state >> 8) % (uint32_t)n_vocab);
    }
}

static double tokens_per_second(const struct bench_test *t, int i)
{
    return (t->n_prompt + t->n_gen) / t->seconds[i];
}

/* llama-bench's summary of a test: the mean and sample standard deviation of the per-run tok/s. */
static void test_stats(const struct bench_test *t, double *best, double *avg, double *stddev)
{
    double sum = 0, sq = 0;
    *best = 0;
    for (int i = 0; i < t->n_runs; i++) {
        const double ts = tokens_per_second(t, i);
        sum += ts;
        if (ts > *best)
            *best = ts;
    }
    *avg = t->n_runs ? sum / t->n_runs : 0;
    for (int i = 0; i < t->n_runs; i++)
        sq += (tokens_per_second(t, i) - *avg) * (tokens_per_second(t, i) - *avg);
    *stddev = t->n_runs > 1 ? sqrt(sq / (t->n_runs - 1)) : 0;
}

/* What kiri_model_describe reports: the backend picked ("cpu: picked (avx2)": name and detail)
 * and the worker threads ("threads:       2"; 0 when the line is missing). */
struct bench_setup {
    char backend[32], kernels[64];
    int threads;
};

static void describe_setup(const struct kiri_model *m, struct bench_setup *out)
{
    snprintf(out->backend, sizeof out->backend, "?");
    snprintf(out->kernels, sizeof out->kernels, "?");
    out->threads = 0;
    char *buf = malloc(1 << 16);
    if (!buf)
        return;
    kiri_model_describe(m, buf, 1 << 16);
    const char *pick = strstr(buf, ": picked (");
    if (pick) {
        const char *line = pick;
        while (line > buf && line[-1] != '\n' && line[-1] != ' ')
            line--;
        const char *open = pick + strlen(": picked (");
        const char *close = strchr(open, ')');
        if (close) {
            snprintf(out->backend, sizeof out->backend, "%.*s", (int)(pick - line), line);
            snprintf(out->kernels, sizeof out->kernels, "%.*s", (int)(close - open), open);
        }
    }
    const char *threads = strstr(buf, "\nthreads:");
    if (threads)
        out->threads = atoi(threads + strlen("\nthreads:"));
    free(buf);
}

/* Prints s as a JSON string (quotes, backslashes and control bytes escaped). */
static void print_json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        const unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            printf("\\%c", ch);
        else if (ch < 0x20)
            printf("\\u%04x", ch);
        else
            putchar(ch);
    }
    putchar('"');
}

/* One timed run of a test: clear, fill to the depth (untimed), then the prefill or the decode. */
static int bench_run(struct kiri_context *c, struct bench_test *t, int32_t *ids, uint32_t *state,
                     int32_t n_vocab, double *seconds)
{
    const float *logits;
    struct kiri_status_info info;
    kiri_context_reset(c);
    if (t->n_depth > 0) {
        fill_random(ids, t->n_depth, state, n_vocab);
        if (kiri_context_eval(c, ids, t->n_depth, &logits, &info) != KIRI_OK)
            return fail("bench depth fill", &info);
    }
    if (t->n_prompt > 0) {
        fill_random(ids, t->n_prompt, state, n_vocab);
        const double t0 = kiri_time_seconds();
        if (kiri_context_eval(c, ids, t->n_prompt, &logits, &info) != KIRI_OK)
            return fail("bench prefill", &info);
        *seconds = kiri_time_seconds() - t0;
        return 0;
    }
    int32_t tok;
    fill_random(&tok, 1, state, n_vocab);
    const double t0 = kiri_time_seconds();
    for (int i = 0; i < t->n_gen; i++) {
        if (kiri_context_eval(c, &tok, 1, &logits, &info) != KIRI_OK)
            return fail("bench decode", &info);
        fill_random(&tok, 1, state, n_vocab);
    }
    *seconds = kiri_time_seconds() - t0;
    return 0;
}

static void print_bench(const struct options *o, const struct bench_test *tests, int n_tests, const int *depths,
                        int n_depths, int n_g, const struct bench_setup *setup, double open_seconds,
                        double first_prefill)
{
    const unsigned long long rss = (unsigned long long)kiri_peak_rss_bytes();
    double best, avg, sd, pp_first = 0, tg_first = 0;
    for (int i = 0; i < n_tests; i++)
        if (tests[i].n_depth == depths[0]) {
            test_stats(&tests[i], &best, &avg, &sd);
            *(tests[i].n_prompt ? &pp_first : &tg_first) = best;
        }
    if (!o->json) {
        printf("backend: %s (%s), %d threads\n", setup->backend, setup->kernels, setup->threads);
        printf("%-16s %12s %20s\n", "test", "best tok/s", "avg ± stddev tok/s");
        for (int i = 0; i < n_tests; i++) {
            const struct bench_test *t = &tests[i];
            char name[48];
            int len = snprintf(name, sizeof name, "%s%d", t->n_prompt ? "pp" : "tg", t->n_prompt + t->n_gen);
            if (t->n_depth > 0)
                snprintf(name + len, sizeof name - (size_t)len, " @ d%d", t->n_depth);
            test_stats(t, &best, &avg, &sd);
            printf("%-16s %12.2f %12.2f ± %.2f\n", name, best, avg, sd);
        }
        printf("peak RSS: %.1f MiB\nload: %.1f ms\n", (double)rss / (1024.0 * 1024.0), open_seconds * 1e3);
        return;
    }
    printf("{\"model\":");
    print_json_string(o->model);
    printf(",\"backend\":");
    print_json_string(setup->backend);
    printf(",\"kernels\":");
    print_json_string(setup->kernels);
    printf(",\"n_prompt\":%d,\"n_gen\":%d,\"n_depth\":%d,\"depths\":[", o->n_prompt_bench, n_g, depths[0]);
    for (int i = 0; i < n_depths; i++)
        printf(i ? ",%d" : "%d", depths[i]);
    printf("],\"threads\":%d,\"repetitions\":%d,\"warmup\":%s,\"prefill_tps\":%.3f,\"decode_tps\":%.3f,"
           "\"peak_rss_bytes\":%llu,\"load_seconds\":%.4f,\"first_prefill_seconds\":%.4f,\"tests\":[",
           setup->threads, o->repetitions, o->no_warmup ? "false" : "true", pp_first, tg_first, rss, open_seconds,
           first_prefill);
    for (int i = 0; i < n_tests; i++) {
        const struct bench_test *t = &tests[i];
        test_stats(t, &best, &avg, &sd);
        printf("%s{\"n_prompt\":%d,\"n_gen\":%d,\"n_depth\":%d,\"best_ts\":%.3f,\"avg_ts\":%.3f,\"stddev_ts\":%.3f,"
               "\"samples_ts\":[", i ? "," : "", t->n_prompt, t->n_gen, t->n_depth, best, avg, sd);
        for (int k = 0; k < t->n_runs; k++)
            printf(k ? ",%.3f" : "%.3f", tokens_per_second(t, k));
        printf("]}");
    }
    printf("]}\n");
}

/* kiri bench --spec: greedy generation of -n tokens from a text, timed without and with the
 * drafter in turn (-r times each, alternating, after an untimed warm-up of each), and the ratio. */
static const char bench_spec_default_text[] =
    "Once upon a time, there was a little girl named Lily. She loved to play in the park with her red ball. "
    "One day, she saw a big dog under a tree. The dog was sad because it was lost. Lily helped the dog find "
    "its home, and they became best friends.\n\nThe same story, word for word:\n\nOnce upon a time, there";

struct spec_run {
    double seconds, tok_s;
    int32_t n_generated, n_drafted, n_accepted;
};

static int bench_generate(struct kiri_context *c, const int32_t *ids, int n, int n_gen, int spec, int spec_max,
                          struct spec_run *out)
{
    struct kiri_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = n_gen;
    kiri_sampling_default(&gp.sampling);
    gp.sampling.temperature = 0;
    gp.speculative = spec;
    gp.spec_max = spec_max;
    struct kiri_generate_result res;
    struct kiri_status_info info;
    if (kiri_generate(c, ids, n, &gp, NULL, NULL, &res, &info) != KIRI_OK)
        return fail("bench generate", &info);
    out->seconds = res.decode_seconds;
    out->n_generated = res.n_generated;
    out->n_drafted = res.n_drafted;
    out->n_accepted = res.n_accepted;
    /* The first token comes from the prompt's step: decode speed counts the ones after it. */
    out->tok_s = res.decode_seconds > 0 && res.n_generated > 1 ? (res.n_generated - 1) / res.decode_seconds : 0;
    return 0;
}

static int bench_speculative(const struct options *o, int spec)
{
    const int n_g = o->n_gen_bench >= 1 ? o->n_gen_bench : 128;
    const char *text = o->bench_text ? o->bench_text : bench_spec_default_text;
    struct kiri_model *m = NULL, *dm = NULL;
    struct kiri_context *c = NULL;
    int rc = open_model(o, 0, &m);
    if (rc == 0)
        rc = open_draft_model(o, &dm);
    int32_t *ids = NULL;
    int n = 0;
    if (rc == 0) {
        const int cap = (int)strlen(text) + 8;
        ids = malloc((size_t)cap * sizeof *ids);
        n = ids ? kiri_tokenize(m, text, strlen(text), -1, 0, ids, cap) : -1;
        if (n < 1) {
            fprintf(stderr, "kiri: error: cannot tokenize the --text prompt\n");
            rc = 1;
        }
    }
    struct options oc = *o;
    if (rc == 0 && oc.n_ctx == 0)
        oc.n_ctx = n + n_g + KIRI_SPEC_MAX_DRAFT + 1;
    if (rc == 0)
        rc = make_context(m, &oc, dm, &c);
    struct spec_run plain[100], drafted[100], warm;
    const int kinds[2] = {KIRI_SPEC_NONE, spec};
    for (int k = 0; rc == 0 && !o->no_warmup && k < 2; k++)
        rc = bench_generate(c, ids, n, n_g, kinds[k], o->spec_max, &warm);
    for (int r = 0; rc == 0 && r < o->repetitions; r++) {
        rc = bench_generate(c, ids, n, n_g, KIRI_SPEC_NONE, 0, &plain[r]);
        if (rc == 0)
            rc = bench_generate(c, ids, n, n_g, spec, o->spec_max, &drafted[r]);
    }
    if (rc == 0) {
        double a = 0, b = 0;
        int32_t generated = 0, drafts = 0, kept = 0;
        for (int r = 0; r < o->repetitions; r++) {
            a += plain[r].tok_s;
            b += drafted[r].tok_s;
            generated += drafted[r].n_generated;
            drafts += drafted[r].n_drafted;
            kept += drafted[r].n_accepted;
        }
        a /= o->repetitions;
        b /= o->repetitions;
        if (o->json)
            printf("{\"prompt_tokens\": %d, \"generated\": %d, \"repetitions\": %d, \"plain_tok_s\": %.2f, "
                   "\"spec\": \"%s\", \"spec_tok_s\": %.2f, \"ratio\": %.3f, \"drafted\": %d, \"accepted\": %d}\n",
                   n, generated / o->repetitions, o->repetitions, a, kiri_spec_name(spec), b, a > 0 ? b / a : 0.0,
                   drafts, kept);
        else
            printf("prompt %d tokens, greedy decode of %d tokens, %d runs each, alternating\n"
                   "plain          %8.2f tok/s\n%-14s %8.2f tok/s  (%d of %d drafted tokens kept)\nratio          %8.3f\n",
                   n, generated / o->repetitions, o->repetitions, a, kiri_spec_name(spec), b, kept, drafts,
                   a > 0 ? b / a : 0.0);
    }
    free(ids);
    kiri_context_free(c);
    kiri_model_close(dm);
    kiri_model_close(m);
    return rc;
}

static int cmd_bench(const struct options *o, const char **args, int n_args)
{
    (void)args;
    (void)n_args;
    const int spec = spec_kind(o);
    if (spec < 0)
        return 2;
    if (spec > KIRI_SPEC_NONE)
        return bench_speculative(o, spec);
    struct kiri_model *dm = NULL; /* the plain tests run without one */
    int depths[BENCH_MAX_DEPTHS];
    char err[160];
    const int n_depths = parse_depths(o->depths, depths, err, sizeof err);
    if (n_depths < 0) {
        fprintf(stderr, "kiri: error: %s\n", err);
        return 2;
    }
    /* As llama-bench: -p 0 or -n 0 leaves that test out. */
    const int n_p = o->n_prompt_bench, n_g = o->n_gen_bench >= 0 ? o->n_gen_bench : 128;
    if (n_p == 0 && n_g == 0) {
        fprintf(stderr, "kiri: error: -p 0 and -n 0 leave no test to run\n");
        return 2;
    }
    int max_depth = 0, n_tests = 0;
    struct bench_test tests[2 * BENCH_MAX_DEPTHS];
    memset(tests, 0, sizeof tests);
    for (int i = 0; i < n_depths; i++) {
        if (n_p > 0)
            tests[n_tests++] = (struct bench_test){.n_prompt = n_p, .n_depth = depths[i]};
        if (n_g > 0)
            tests[n_tests++] = (struct bench_test){.n_gen = n_g, .n_depth = depths[i]};
        if (depths[i] > max_depth)
            max_depth = depths[i];
    }

    struct kiri_model *m = NULL;
    struct kiri_context *c = NULL;
    const double t_open = kiri_time_seconds();
    int rc = open_model(o, 0, &m);
    const double open_seconds = kiri_time_seconds() - t_open;
    struct options oc = *o;
    if (rc == 0 && oc.n_ctx == 0)
        oc.n_ctx = max_depth + (n_p > n_g ? n_p : n_g) + 1;
    if (rc == 0)
        rc = make_context(m, &oc, dm, &c);
    const int n_ids = max_depth > n_p ? max_depth : n_p > 0 ? n_p : 1;
    int32_t *ids = rc == 0 ? malloc((size_t)n_ids * sizeof *ids) : NULL;
    if (rc == 0 && !ids)
        rc = 1;
    const int32_t n_vocab = rc == 0 ? kiri_model_n_vocab(m) : 1;
    uint32_t state = 12345u;
    double first_prefill = 0;
    if (rc == 0 && !o->no_warmup) {
        struct bench_test warm_pp = {.n_prompt = n_p}, warm_tg = {.n_gen = 1};
        if (n_p > 0)
            rc = bench_run(c, &warm_pp, ids, &state, n_vocab, &first_prefill);
        double unused;
        if (rc == 0)
            rc = bench_run(c, &warm_tg, ids, &state, n_vocab, &unused);
    }
    for (int i = 0; rc == 0 && i < n_tests; i++)
        for (int r = 0; rc == 0 && r < o->repetitions; r++) {
            rc = bench_run(c, &tests[i], ids, &state, n_vocab, &tests[i].seconds[r]);
            if (rc == 0 && tests[i].seconds[r] <= 0)
                tests[i].seconds[r] = 1e-9;
            tests[i].n_runs += rc == 0;
            if (rc == 0 && i == 0 && r == 0 && o->no_warmup && tests[i].n_prompt)
                first_prefill = tests[i].seconds[r];
        }
    if (rc == 0) {
        struct bench_setup setup;
        describe_setup(m, &setup);
        print_bench(o, tests, n_tests, depths, n_depths, n_g, &setup, open_seconds, first_prefill);
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
    if (kiri_server_config_help_requested(argc - 2, argv + 2)) {
        static char help[16384];
        kiri_server_config_usage(help, sizeof help);
        printf("usage: kiri serve -m MODEL [options]\n\nServes the model over an OpenAI-compatible HTTP(S) API "
               "(docs/server.md).\n\n%s", help);
        return 0;
    }
    static struct kiri_server_config cfg;
    char err[512];
    if (kiri_server_config_load(&cfg, argc - 2, argv + 2, environ, err, sizeof err) != 0) {
        fprintf(stderr, "kiri: error: %s (see kiri serve --help)\n", err);
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

/* ---------------------------------------------------------------------------------------------
 * The command table
 * ------------------------------------------------------------------------------------------- */

struct command {
    const char *name;
    const char *synopsis;      /* after "kiri NAME " */
    const char *summary;
    const struct kiri_option_spec *spec;   /* NULL: the command parses its own (serve, pull, fleet) */
    int (*run)(const struct options *o, const char **args, int n_args);
    int (*run_argv)(int argc, char **argv);   /* commands of the server build; NULL when it is off */
    const char *epilog;        /* printed after the options */
};

#ifdef KIRI_WITH_SERVER
#define SERVER_COMMAND(f) f
#else
#define SERVER_COMMAND(f) NULL
#endif

static const struct command commands[] = {
    {"run", "-m MODEL -p PROMPT [options]", "generate text", &run_spec, cmd_run, NULL, NULL},
    {"chat", "-m MODEL [options]", "talk with the model", &chat_spec, cmd_chat, NULL,
     "In the conversation: /clear forgets it, /exit (or Ctrl-D) leaves, /help lists the commands.\n"
     "A line ending in \\ continues on the next; text between lines of \"\"\" is one message.\n"
     "Ctrl-C stops an answer. Input may be piped: each line (or block) is one message.\n"},
    {"grammar", "--grammar FILE | --json-schema FILE", "check a GBNF grammar, compile a JSON Schema", &grammar_spec,
     cmd_grammar, NULL, NULL},
    {"tokenize", "-m MODEL [--no-bos] TEXT", "print token ids", &tokenize_spec, cmd_tokenize, NULL, NULL},
    {"info", "[-m MODEL] [options]", "describe the machine and the model", &info_spec, cmd_info, NULL, NULL},
    {"quantize", "IN.gguf OUT.gguf TYPE", "convert weights", &quantize_spec, cmd_quantize, NULL,
     "TYPE: Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q4_K Q4_K_M Q5_K Q6_K F16 BF16 F32\n"},
    {"bench", "-m MODEL [-p N] [-n N] [-d D,...] [options]", "tokens per second", &bench_spec, cmd_bench, NULL, NULL},
    {"serve", "-m MODEL [--host H] [--port P] [options]", "OpenAI-compatible HTTP(S) server", NULL, NULL,
     SERVER_COMMAND(cmd_serve), NULL},
    {"pull", "REF --models-dir DIR [options]", "fetch a model (OCI registry or https)", NULL, NULL,
     SERVER_COMMAND(kiri_fleet_cli_pull), NULL},
    {"fleet", "keygen | sign | verify | sync [options]", "signed model manifests (docs/fleet.md)", NULL, NULL,
     SERVER_COMMAND(kiri_fleet_cli_fleet), NULL},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *f)
{
    fprintf(f, "usage: kiri <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < N_COMMANDS; i++) {
        const struct command *c = &commands[i];
        int absent = !c->run && !c->run_argv;
        fprintf(f, "  %-9s %-44s %s%s\n", c->name, c->synopsis, c->summary,
                absent ? " (not in this build)" : "");
    }
    fprintf(f, "\n`kiri COMMAND --help` lists the options of one command; kiri --version prints the version.\n");
}

static void command_usage(const struct command *c)
{
    static char text[16384];
    kiri_options_usage(c->spec, text, sizeof text);
    printf("usage: kiri %s %s\n  %s\n\n%s%s%s", c->name, c->synopsis, c->summary, text,
           text[0] && c->epilog ? "\n" : "", c->epilog ? c->epilog : "");
}

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
    const struct command *c = NULL;
    for (size_t i = 0; i < N_COMMANDS && !c; i++)
        if (strcmp(argv[1], commands[i].name) == 0)
            c = &commands[i];
    if (!c) {
        fprintf(stderr, "kiri: error: unknown command '%s' (see kiri --help)\n", argv[1]);
        return 2;
    }
    if (c->run_argv)
        return c->run_argv(argc, argv);
    if (!c->run) {
        fprintf(stderr, "kiri: '%s' is not in this build: it was built without the TLS libraries "
                        "(run scripts/build-deps.sh, then make)\n", c->name);
        return 2;
    }
    if (kiri_options_help_requested(c->spec, argc - 2, argv + 2)) {
        command_usage(c);
        return 0;
    }
    struct options o;
    options_default(&o);
    const char *args[4];
    int n_args = 0;
    char err[512];
    if (kiri_options_parse(c->spec, &o, argc - 2, argv + 2, NULL, args, &n_args, err, sizeof err) != 0) {
        fprintf(stderr, "kiri: error: %s (see kiri %s --help)\n", err, c->name);
        return 2;
    }
    return c->run(&o, args, n_args);
}
