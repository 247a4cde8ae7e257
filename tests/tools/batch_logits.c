/* batch_logits: runs several sequences of token ids through one continuous-batching loop at once
 * and writes the logits of every evaluated chunk of each, so the outside-reference tests can hold
 * batched evaluation (sequences of different lengths and positions in the same forward steps) to
 * llama.cpp's logits, as dump_logits does for one sequence.
 *
 * Usage: batch_logits [--kv f16|f32|q8_0] [--n-ctx N] [--budget N] --out FILE MODEL SEQ ...
 *   SEQ    STEP:ID,ID,...  the sequence's ids, fed STEP tokens per round; every round appends the
 *          next STEP ids of every unfinished sequence and then runs the loop until all of them
 *          are computed, so the rounds put the sequences side by side in the same steps
 *   --budget N  prompt tokens per step across all sequences (kiri_batcher_params.chunk; default
 *          the sum of the STEPs, so one round is one step)
 * Environment: KIRI_BACKEND, KIRI_CPU_KERNELS, KIRI_THREADS as for dump_logits.
 *
 * FILE receives, sequence after sequence, one float32 row [n_vocab] per round of that sequence:
 * the logits of the last token of its chunk. stdout is {"n_vocab": V, "rows": [r0, r1, ...]}.
 * Errors go to stderr with exit status 1. Uses the engine's held sequences (runtime/batcher.h),
 * the mechanism kiri_context_eval is built on, with several of them in one batcher. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "batcher.h"
#include "kiri.h"

#define MAX_SEQS 16
#define MAX_IDS 4096

struct seq {
    int32_t ids[MAX_IDS];
    int n_ids;
    int step;
    int fed;              /* ids appended so far */
    uint64_t id;          /* in the batcher, once submitted */
    float *rows;          /* owned: [rounds][n_vocab] */
    int n_rows;
    int got;              /* a logits event arrived this round */
    int failed;           /* the sequence ended with an error */
};

struct run {
    struct seq seqs[MAX_SEQS];
    int n_seqs;
    int32_t n_vocab;
};

static int32_t n_vocab;   /* of the one model, set before the first event */

/* Events of a held sequence: the logits of its chunk's last token (valid during the call only),
 * or its end. */
static int on_event(void *user, const struct kiri_token_event *ev)
{
    struct seq *s = user;
    if (ev->logits) {
        s->got = 1;
        memcpy(s->rows + (size_t)s->n_rows * (size_t)n_vocab, ev->logits, (size_t)n_vocab * sizeof *ev->logits);
    }
    if (ev->finish == KIRI_FINISH_ERROR)
        s->failed = ev->status ? ev->status : KIRI_E_BACKEND;
    return 0;
}

static int parse_long(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

static int parse_seq(const char *arg, struct seq *s)
{
    char *end;
    errno = 0;
    long step = strtol(arg, &end, 10);
    if (errno || end == arg || *end != ':' || step < 1 || step > MAX_IDS)
        return -1;
    s->step = (int)step;
    const char *p = end + 1;
    while (*p) {
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > INT32_MAX || s->n_ids == MAX_IDS)
            return -1;
        s->ids[s->n_ids++] = (int32_t)v;
        p = end;
        if (*p == ',')
            p++;
        else if (*p)
            return -1;
    }
    return s->n_ids > 0 ? 0 : -1;
}

static void usage(void)
{
    fprintf(stderr, "usage: batch_logits [--kv f16|f32|q8_0] [--n-ctx N] [--budget N] --out FILE MODEL "
                    "STEP:ID,ID,... ...\n");
}

int main(int argc, char **argv)
{
    static struct run r;
    const char *out_path = NULL;
    int kv_type = KIRI_KV_F16;
    long n_ctx = 0, budget = 0;
    int argi = 1;
    for (; argi < argc && !strncmp(argv[argi], "--", 2); argi++) {
        const char *a = argv[argi];
        if (argi + 1 >= argc) {
            usage();
            return 2;
        }
        const char *v = argv[++argi];
        if (!strcmp(a, "--out")) {
            out_path = v;
        } else if (!strcmp(a, "--kv")) {
            kv_type = !strcmp(v, "f32") ? KIRI_KV_F32 : !strcmp(v, "q8_0") ? KIRI_KV_Q8_0 : KIRI_KV_F16;
        } else if (!strcmp(a, "--n-ctx")) {
            if (parse_long(v, 1, 1 << 24, &n_ctx)) {
                usage();
                return 2;
            }
        } else if (!strcmp(a, "--budget")) {
            if (parse_long(v, 1, 1 << 20, &budget)) {
                usage();
                return 2;
            }
        } else {
            usage();
            return 2;
        }
    }
    if (!out_path || argc - argi < 2 || argc - argi - 1 > MAX_SEQS) {
        usage();
        return 2;
    }
    const char *model_path = argv[argi++];
    long total_step = 0;
    for (; argi < argc; argi++, r.n_seqs++) {
        if (parse_seq(argv[argi], &r.seqs[r.n_seqs])) {
            fprintf(stderr, "batch_logits: bad sequence '%s'\n", argv[argi]);
            return 2;
        }
        total_step += r.seqs[r.n_seqs].step;
    }

    struct kiri_status_info info;
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    const char *backend = getenv("KIRI_BACKEND");
    mp.backend = backend && *backend ? backend : NULL;
    mp.cpu_kernels = getenv("KIRI_CPU_KERNELS");
    const char *threads = getenv("KIRI_THREADS");
    long nt;
    if (threads && !parse_long(threads, 0, 4096, &nt))
        mp.n_threads = (int)nt;
    struct kiri_model *model = NULL;
    int rc = kiri_model_open(model_path, &mp, &model, &info);
    if (rc) {
        fprintf(stderr, "batch_logits: %s: %s: %s\n", model_path, kiri_status_name(rc), info.message);
        return 1;
    }
    int status = 1;
    struct kiri_batcher *b = NULL;
    FILE *out = NULL;
    r.n_vocab = n_vocab = kiri_model_n_vocab(model);
    for (int i = 0; i < r.n_seqs; i++) {
        struct seq *s = &r.seqs[i];
        for (int k = 0; k < s->n_ids; k++) {
            if (s->ids[k] >= r.n_vocab) {
                fprintf(stderr, "batch_logits: token id %d is not below n_vocab %d\n", (int)s->ids[k],
                        (int)r.n_vocab);
                goto done;
            }
        }
        int rounds = (s->n_ids + s->step - 1) / s->step;
        s->rows = malloc((size_t)rounds * (size_t)r.n_vocab * sizeof *s->rows);
        if (!s->rows) {
            fprintf(stderr, "batch_logits: out of memory\n");
            goto done;
        }
    }

    struct kiri_batcher_params bp;
    kiri_batcher_params_default(&bp);
    bp.n_ctx = (int32_t)n_ctx;
    bp.max_seqs = r.n_seqs;
    bp.chunk = (int32_t)(budget ? budget : total_step);
    bp.queue_cap = r.n_seqs;
    bp.kv_type = kv_type;
    bp.prefix_cache = 0;
    rc = kiri_batcher_init(model, &bp, &b, &info);
    if (rc) {
        fprintf(stderr, "batch_logits: kiri_batcher_init: %s: %s\n", kiri_status_name(rc), info.message);
        goto done;
    }

    for (int round = 0;; round++) {
        int active = 0;
        for (int i = 0; i < r.n_seqs; i++) {
            struct seq *s = &r.seqs[i];
            if (s->fed >= s->n_ids)
                continue;
            int n = s->n_ids - s->fed < s->step ? s->n_ids - s->fed : s->step;
            s->got = 0;
            if (s->fed == 0) {
                struct kiri_request req;
                memset(&req, 0, sizeof req);
                req.tokens = s->ids;
                req.n_tokens = n;
                rc = kiri_batcher_submit_held(b, &req, on_event, s, &s->id, &info);
            } else {
                rc = kiri_batcher_append(b, s->id, s->ids + s->fed, n, &info);
            }
            if (rc) {
                fprintf(stderr, "batch_logits: sequence %d, round %d: %s: %s\n", i, round,
                        kiri_status_name(rc), info.message);
                goto done;
            }
            s->fed += n;
            active++;
        }
        if (!active)
            break;
        kiri_batcher_run(b, NULL);
        for (int i = 0; i < r.n_seqs; i++) {
            struct seq *s = &r.seqs[i];
            if (s->failed) {
                fprintf(stderr, "batch_logits: sequence %d ended with %s\n", i, kiri_status_name(s->failed));
                goto done;
            }
            if (s->n_rows < (s->fed + s->step - 1) / s->step) {
                if (!s->got) {
                    fprintf(stderr, "batch_logits: sequence %d, round %d: no logits\n", i, round);
                    goto done;
                }
                s->n_rows++;
            }
        }
    }

    out = fopen(out_path, "wb");
    if (!out) {
        fprintf(stderr, "batch_logits: cannot write %s: %s\n", out_path, strerror(errno));
        goto done;
    }
    for (int i = 0; i < r.n_seqs; i++) {
        size_t n = (size_t)r.seqs[i].n_rows * (size_t)r.n_vocab;
        if (fwrite(r.seqs[i].rows, sizeof(float), n, out) != n) {
            fprintf(stderr, "batch_logits: write failed: %s\n", strerror(errno));
            goto done;
        }
    }
    if (fclose(out)) {
        out = NULL;
        fprintf(stderr, "batch_logits: write failed: %s\n", strerror(errno));
        goto done;
    }
    out = NULL;
    printf("{\"n_vocab\": %d, \"rows\": [", (int)r.n_vocab);
    for (int i = 0; i < r.n_seqs; i++)
        printf(i ? ", %d" : "%d", r.seqs[i].n_rows);
    puts("]}");
    status = fflush(stdout) ? 1 : 0;

done:
    if (out)
        fclose(out);
    if (b)
        kiri_batcher_free(b);
    for (int i = 0; i < r.n_seqs; i++)
        free(r.seqs[i].rows);
    kiri_model_close(model);
    return status;
}
