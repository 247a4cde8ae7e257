/* dump_logits: runs a kiri model over token ids through the public API only (kiri.h) and prints
 * what the outside-reference tests compare with llama.cpp: the logits after each evaluation call,
 * a greedy continuation, or the tokenization of a text.
 *
 * Usage:
 *   dump_logits [options] MODEL [ID ...]      ids from the arguments, else from stdin
 *   dump_logits --tokenize MODEL TEXT          prints {"tokens": [...]} (BOS as the metadata says)
 * Options:
 *   --chunk N    tokens per kiri_context_eval call (default 1, so every position gets a row); one
 *                row is written per call: the logits of the last token of that chunk
 *   --batch      all ids in one call (one row: the last position), to exercise batched prefill
 *   --greedy N   then generate N tokens, one call each, taking the argmax (ties: lowest id)
 *   --out FILE   write the rows to FILE as raw float32 [rows][n_vocab], native byte order
 *                (without it the rows go into the JSON on stdout as "logits")
 *   --kv TYPE    KV cache type: f16 (default), f32 or q8_0
 *   --n-ctx N    context length (default: the model's training context)
 * Environment: KIRI_BACKEND (auto, cpu, vulkan, cuda; default auto), KIRI_THREADS (default: all),
 * KIRI_GPU_LAYERS (as --gpu-layers: the first N layers on the GPU backend, the rest on the CPU).
 *
 * stdout is one JSON object: {"n_vocab": V, "n_tokens": n, "rows": r, "generated": [...]} plus
 * "logits": [[...], ...] when --out is not given. Errors go to stderr with exit status 1.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiri.h"

struct options {
    const char *model;
    const char *out;
    int chunk;          /* 0: all at once */
    int greedy;
    int kv_type;
    int n_ctx;
    int tokenize;
};

static void usage(void)
{
    fprintf(stderr,
            "usage: dump_logits [--chunk N | --batch] [--greedy N] [--out FILE] [--kv f16|f32|q8_0]\n"
            "                   [--n-ctx N] MODEL [ID ...]\n"
            "       dump_logits --tokenize MODEL TEXT\n");
}

static int fail(const char *what, int rc, const struct kiri_status_info *info)
{
    fprintf(stderr, "dump_logits: %s: %s", what, kiri_status_name(rc));
    if (info && info->message[0])
        fprintf(stderr, ": %s", info->message);
    if (info && info->field[0])
        fprintf(stderr, " (field %s, offset %lld)", info->field, (long long)info->offset);
    fputc('\n', stderr);
    return 1;
}

static int parse_int(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

/* Appends to a growing id array; returns -1 when out of memory. */
static int push(int32_t **ids, int *n, int *cap, int32_t id)
{
    if (*n == *cap) {
        int ncap = *cap ? *cap * 2 : 64;
        int32_t *p = realloc(*ids, (size_t)ncap * sizeof *p);
        if (!p)
            return -1;
        *ids = p;
        *cap = ncap;
    }
    (*ids)[(*n)++] = id;
    return 0;
}

/* Reads ids separated by anything that is not a digit or '-' (spaces, commas, brackets). */
static int read_ids_stdin(int32_t **ids, int *n, int *cap)
{
    char buf[32];
    int len = 0, c;
    do {
        c = getchar();
        if (c != EOF && (isdigit(c) || c == '-')) {
            if (len + 1 >= (int)sizeof buf)
                return -1;
            buf[len++] = (char)c;
            continue;
        }
        if (len) {
            long v;
            buf[len] = '\0';
            len = 0;
            if (parse_int(buf, 0, INT32_MAX, &v) || push(ids, n, cap, (int32_t)v))
                return -1;
        }
    } while (c != EOF);
    return 0;
}

static int32_t argmax(const float *x, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return best;
}

static void print_row_json(const float *row, int32_t n)
{
    putchar('[');
    for (int32_t i = 0; i < n; i++) {
        if (i)
            putchar(',');
        if (isfinite(row[i]))
            printf("%.9g", (double)row[i]);
        else
            fputs("null", stdout);
    }
    putchar(']');
}

static int do_tokenize(struct kiri_model *model, const char *text)
{
    size_t len = strlen(text);
    int need = kiri_tokenize(model, text, len, -1, 0, NULL, 0);
    if (need < 0)
        return fail("kiri_tokenize", need, NULL);
    int32_t *ids = malloc((size_t)(need ? need : 1) * sizeof *ids);
    if (!ids)
        return fail("tokenize", KIRI_E_NOMEM, NULL);
    int got = kiri_tokenize(model, text, len, -1, 0, ids, need);
    if (got != need) {
        free(ids);
        return fail("kiri_tokenize (second call)", got < 0 ? got : KIRI_E_INVALID_ARG, NULL);
    }
    printf("{\"tokens\": [");
    for (int i = 0; i < got; i++)
        printf(i ? ", %d" : "%d", (int)ids[i]);
    printf("]}\n");
    free(ids);
    return 0;
}

int main(int argc, char **argv)
{
    struct options o = {.chunk = 1, .kv_type = 1};
    int32_t *ids = NULL;
    int n_ids = 0, cap_ids = 0;
    int argi = 1;
    for (; argi < argc && argv[argi][0] == '-' && argv[argi][1] == '-'; argi++) {
        const char *a = argv[argi];
        long v;
        if (!strcmp(a, "--batch")) {
            o.chunk = 0;
        } else if (!strcmp(a, "--tokenize")) {
            o.tokenize = 1;
        } else if (argi + 1 < argc && !strcmp(a, "--chunk") &&
                   !parse_int(argv[argi + 1], 1, INT32_MAX, &v)) {
            o.chunk = (int)v;
            argi++;
        } else if (argi + 1 < argc && !strcmp(a, "--greedy") &&
                   !parse_int(argv[argi + 1], 0, INT32_MAX, &v)) {
            o.greedy = (int)v;
            argi++;
        } else if (argi + 1 < argc && !strcmp(a, "--n-ctx") &&
                   !parse_int(argv[argi + 1], 1, INT32_MAX, &v)) {
            o.n_ctx = (int)v;
            argi++;
        } else if (argi + 1 < argc && !strcmp(a, "--out")) {
            o.out = argv[++argi];
        } else if (argi + 1 < argc && !strcmp(a, "--kv")) {
            const char *t = argv[++argi];
            if (!strcmp(t, "f16"))
                o.kv_type = 1;
            else if (!strcmp(t, "f32"))
                o.kv_type = 0;
            else if (!strcmp(t, "q8_0"))
                o.kv_type = 8;
            else {
                usage();
                return 2;
            }
        } else {
            usage();
            return 2;
        }
    }
    if (argi >= argc) {
        usage();
        return 2;
    }
    o.model = argv[argi++];
    if (o.tokenize && argi + 1 != argc) {
        usage();
        return 2;
    }

    struct kiri_status_info info;
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    const char *backend = getenv("KIRI_BACKEND");
    mp.backend = backend && *backend ? backend : NULL;
    mp.cpu_kernels = getenv("KIRI_CPU_KERNELS");
    const char *threads = getenv("KIRI_THREADS");
    long nt;
    if (threads && !parse_int(threads, 0, 4096, &nt))
        mp.n_threads = (int)nt;
    const char *gpu_layers = getenv("KIRI_GPU_LAYERS"); /* partial offload, as --gpu-layers */
    if (gpu_layers && !parse_int(gpu_layers, 0, 4096, &nt))
        mp.gpu_layers = (int)nt;
    mp.vocab_only = o.tokenize;
    struct kiri_model *model = NULL;
    int rc = kiri_model_open(o.model, &mp, &model, &info);
    if (rc)
        return fail(o.model, rc, &info);
    if (o.tokenize) {
        int r = do_tokenize(model, argv[argi]);
        kiri_model_close(model);
        return r;
    }

    int status = 1;
    struct kiri_context *ctx = NULL;
    FILE *out = NULL;
    int32_t *generated = NULL;
    float *rows_json = NULL;   /* (rows, n_vocab) kept for stdout when there is no --out */
    const int32_t n_vocab = kiri_model_n_vocab(model);

    for (; argi < argc; argi++) {
        long v;
        if (parse_int(argv[argi], 0, INT32_MAX, &v) || push(&ids, &n_ids, &cap_ids, (int32_t)v)) {
            fprintf(stderr, "dump_logits: bad token id '%s'\n", argv[argi]);
            goto done;
        }
    }
    if (!n_ids && read_ids_stdin(&ids, &n_ids, &cap_ids)) {
        fprintf(stderr, "dump_logits: bad token ids on stdin\n");
        goto done;
    }
    if (!n_ids) {
        fprintf(stderr, "dump_logits: no token ids\n");
        goto done;
    }
    for (int i = 0; i < n_ids; i++) {
        if (ids[i] >= n_vocab) {
            fprintf(stderr, "dump_logits: token id %d is not below n_vocab %d\n", (int)ids[i],
                    (int)n_vocab);
            goto done;
        }
    }

    struct kiri_context_params cp;
    kiri_context_params_default(&cp);
    cp.kv_type = o.kv_type;
    if (o.n_ctx)
        cp.n_ctx = o.n_ctx;
    if (o.chunk == 0 && cp.n_batch > 0 && cp.n_batch < n_ids)
        cp.n_batch = n_ids;
    rc = kiri_context_init(model, &cp, &ctx, &info);
    if (rc) {
        fail("kiri_context_init", rc, &info);
        goto done;
    }

    const int chunk = o.chunk ? o.chunk : n_ids;
    const int n_rows = (n_ids + chunk - 1) / chunk;
    if (o.out) {
        out = fopen(o.out, "wb");
        if (!out) {
            fprintf(stderr, "dump_logits: cannot write %s: %s\n", o.out, strerror(errno));
            goto done;
        }
    } else {
        rows_json = malloc((size_t)n_rows * (size_t)n_vocab * sizeof *rows_json);
        if (!rows_json) {
            fail("rows", KIRI_E_NOMEM, NULL);
            goto done;
        }
    }
    generated = malloc((size_t)(o.greedy ? o.greedy : 1) * sizeof *generated);
    if (!generated) {
        fail("generated", KIRI_E_NOMEM, NULL);
        goto done;
    }

    const float *logits = NULL;
    for (int at = 0, row = 0; at < n_ids; at += chunk, row++) {
        int n = n_ids - at < chunk ? n_ids - at : chunk;
        rc = kiri_context_eval(ctx, ids + at, n, &logits, &info);
        if (rc) {
            char what[64];
            snprintf(what, sizeof what, "kiri_context_eval at position %d", at);
            fail(what, rc, &info);
            goto done;
        }
        if (out) {
            if (fwrite(logits, sizeof *logits, (size_t)n_vocab, out) != (size_t)n_vocab) {
                fprintf(stderr, "dump_logits: write failed: %s\n", strerror(errno));
                goto done;
            }
        } else {
            memcpy(rows_json + (size_t)row * (size_t)n_vocab, logits,
                   (size_t)n_vocab * sizeof *logits);
        }
    }
    for (int i = 0; i < o.greedy; i++) {
        int32_t next = argmax(logits, n_vocab);
        generated[i] = next;
        if (i + 1 == o.greedy)
            break;
        rc = kiri_context_eval(ctx, &next, 1, &logits, &info);
        if (rc) {
            char what[64];
            snprintf(what, sizeof what, "kiri_context_eval at position %d", n_ids + i);
            fail(what, rc, &info);
            goto done;
        }
    }
    if (out) {
        if (fclose(out)) {
            out = NULL;
            fprintf(stderr, "dump_logits: write failed: %s\n", strerror(errno));
            goto done;
        }
        out = NULL;
    }

    printf("{\"n_vocab\": %d, \"n_tokens\": %d, \"rows\": %d, \"generated\": [", (int)n_vocab,
           n_ids, n_rows);
    for (int i = 0; i < o.greedy; i++)
        printf(i ? ", %d" : "%d", (int)generated[i]);
    putchar(']');
    if (rows_json) {
        fputs(", \"logits\": [", stdout);
        for (int r = 0; r < n_rows; r++) {
            if (r)
                fputs(",\n", stdout);
            print_row_json(rows_json + (size_t)r * (size_t)n_vocab, n_vocab);
        }
        putchar(']');
    }
    puts("}");
    status = fflush(stdout) ? 1 : 0;

done:
    if (out)
        fclose(out);
    free(rows_json);
    free(generated);
    free(ids);
    if (ctx)
        kiri_context_free(ctx);
    kiri_model_close(model);
    return status;
}
