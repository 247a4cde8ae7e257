/* kiri_quantize (kiri.h): rewrites a GGUF model with its weight matrices in another type, one
 * tensor at a time (memory stays at one tensor's worth), through the GGUF writer so the output
 * appears only when complete. The rows of a tensor are converted on every CPU: the K-quant
 * searches are slow enough that one thread made a 4B model a matter of most of an hour. */
#include <stdio.h>
#include <string.h>

#include "../base/platform.h"
#include "../kernels/cpu/cpu_kernels.h"
#include "backend.h"
#include "error.h"
#include "gguf.h"
#include "kiri.h"
#include "mem.h"
#include "threadpool.h"

/* Most threads quantize uses: past this the file's reading and writing dominate. */
#define QUANTIZE_MAX_THREADS 64

/* A target: the main type, a file_type value for general.file_type (the numbering GGUF tools
 * share), and for mixes the type of the sensitive tensors. */
struct target {
    const char *name;
    int type;
    int sensitive_type;   /* output, and half of attn_v / ffn_down for _M mixes; -1: same */
    uint32_t file_type;
};

static const struct target targets[] = {
    {"F32", KIRI_TYPE_F32, -1, 0},
    {"F16", KIRI_TYPE_F16, -1, 1},
    {"Q4_0", KIRI_TYPE_Q4_0, -1, 2},
    {"Q4_1", KIRI_TYPE_Q4_1, -1, 3},
    {"Q8_0", KIRI_TYPE_Q8_0, -1, 7},
    {"Q5_0", KIRI_TYPE_Q5_0, -1, 8},
    {"Q5_1", KIRI_TYPE_Q5_1, -1, 9},
    {"Q4_K", KIRI_TYPE_Q4_K, -1, 14},
    {"Q4_K_M", KIRI_TYPE_Q4_K, KIRI_TYPE_Q6_K, 15},
    {"Q5_K", KIRI_TYPE_Q5_K, -1, 16},
    {"Q6_K", KIRI_TYPE_Q6_K, -1, 18},
    {"BF16", KIRI_TYPE_BF16, -1, 32},
};

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* The layer number of "blk.N.*", or -1. */
static int layer_of(const char *name)
{
    int l = -1;
    if (sscanf(name, "blk.%d.", &l) != 1)
        return -1;
    return l;
}

/* Chooses a tensor's new type: vectors stay, and so do the recurrent layers' convolution kernels
 * (matrices of a few taps, which llama.cpp reads as F32 only); matrices take the target (or its
 * sensitive type: the output matrix, which a tied token_embd is), falling back to Q8_0 (or F16)
 * when the row length does not fit the block size. */
static int choose_type(const struct target *tg, const struct kiri_gguf_tensor *t, int n_layer, int tied)
{
    if (t->n_dims < 2 || !ends_with(t->name, ".weight") || strncmp(t->name, "rope_freqs", 10) == 0 ||
        ends_with(t->name, "ssm_conv1d.weight") || ends_with(t->name, "shortconv.conv.weight"))
        return t->type;
    int type = tg->type;
    if (tg->sensitive_type >= 0) {
        const int l = layer_of(t->name);
        const int half = n_layer > 0 && l >= 0 && (l < n_layer / 8 || l >= 7 * n_layer / 8 || (l - n_layer / 8) % 3 == 2);
        if (strcmp(t->name, "output.weight") == 0 || (tied && strcmp(t->name, "token_embd.weight") == 0) ||
            ((ends_with(t->name, "attn_v.weight") || ends_with(t->name, "ffn_down.weight")) && half))
            type = tg->sensitive_type;
    }
    if (t->ne[0] % kiri_type_block_size(type) != 0)
        type = t->ne[0] % KIRI_QK8_0 == 0 ? KIRI_TYPE_Q8_0 : KIRI_TYPE_F16;
    return type;
}

static int readable(int type)
{
    switch (type) {
    case KIRI_TYPE_F32: case KIRI_TYPE_F16: case KIRI_TYPE_BF16: case KIRI_TYPE_Q4_0:
    case KIRI_TYPE_Q4_1: case KIRI_TYPE_Q5_0: case KIRI_TYPE_Q5_1: case KIRI_TYPE_Q8_0:
    case KIRI_TYPE_Q4_K: case KIRI_TYPE_Q5_K: case KIRI_TYPE_Q6_K:
        return 1;
    default:
        return 0;
    }
}

/* One tensor's conversion, split by rows over the pool's workers: every output row has the same
 * size, so each worker writes its own rows in place. */
struct convert_job {
    const struct kiri_gguf_tensor *t;
    int type;
    int64_t row, rows;
    size_t in_row, out_row;
    float *f32;   /* one row of floats per worker */
    void *out;
};

static void convert_rows(void *arg, int ith, int nth)
{
    const struct convert_job *j = arg;
    const int64_t r0 = j->rows * ith / nth, r1 = j->rows * (ith + 1) / nth;
    float *f32 = j->f32 + (size_t)ith * (size_t)j->row;
    for (int64_t r = r0; r < r1; r++) {
        kiri_cpu_dequantize_row(j->t->type, (const char *)j->t->data + (size_t)r * j->in_row, f32, j->row);
        kiri_cpu_quantize_row(j->type, f32, (char *)j->out + (size_t)r * j->out_row, j->row);
    }
}

int kiri_quantize(const char *in_path, const char *out_path, const char *type_name,
                  void (*progress)(void *user, int64_t done, int64_t total), void *user,
                  struct kiri_status_info *info)
{
    kiri_error_clear(info);
    const struct target *tg = NULL;
    for (size_t i = 0; type_name && i < sizeof targets / sizeof targets[0]; i++)
        if (strcmp(targets[i].name, type_name) == 0)
            tg = &targets[i];
    if (!tg)
        return kiri_error_set(info, KIRI_E_INVALID_ARG,
                              "unknown type '%s' (use Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q4_K_M, Q5_K, Q6_K, F16, BF16, F32)",
                              type_name ? type_name : "");
    if (!in_path || !out_path || strcmp(in_path, out_path) == 0)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "input and output must be two different files");

    struct kiri_gguf *g = NULL;
    struct kiri_gguf_writer *w = NULL;
    struct kiri_threadpool *pool = NULL;
    float *f32 = NULL;
    void *q = NULL;
    int rc = kiri_gguf_open(in_path, &g, info);
    if (rc < 0)
        return rc;
    if ((rc = kiri_gguf_writer_init(&w)) < 0) {
        kiri_gguf_close(g);
        return kiri_error_set(info, rc, "out of memory");
    }
    uint32_t n_layer = 0;
    struct kiri_gguf_str arch;
    if (kiri_gguf_get_str(g, "general.architecture", 0, &arch, NULL) == KIRI_OK && arch.len < 64) {
        char key[96];
        snprintf(key, sizeof key, "%.*s.block_count", (int)arch.len, arch.ptr);
        kiri_gguf_get_u32(g, key, 0, &n_layer, NULL);
    }
    for (int64_t i = 0; i < kiri_gguf_n_kv(g) && rc == 0; i++)
        if (strcmp(kiri_gguf_key(g, i), "general.file_type") != 0 &&
            strcmp(kiri_gguf_key(g, i), "general.quantization_version") != 0)
            rc = kiri_gguf_writer_copy_kv(w, g, i);
    if (rc == 0)
        rc = kiri_gguf_writer_set_u32(w, "general.quantization_version", 2);
    if (rc == 0)
        rc = kiri_gguf_writer_set_u32(w, "general.file_type", tg->file_type);
    const int64_t n = kiri_gguf_n_tensors(g);
    int tied = 1;   /* no output.weight: token_embd is also the output matrix */
    for (int64_t i = 0; i < n; i++)
        if (strcmp(kiri_gguf_tensor(g, i)->name, "output.weight") == 0)
            tied = 0;
    int64_t max_elems = 0, max_row = 0;
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const struct kiri_gguf_tensor *t = kiri_gguf_tensor(g, i);
        const int type = choose_type(tg, t, (int)n_layer, tied);
        if (type != t->type && !readable(t->type)) {
            rc = kiri_error_at(info, KIRI_E_UNSUPPORTED, t->name, -1, "cannot convert tensor %s from %s",
                               t->name, kiri_type_name(t->type));
            break;
        }
        const int64_t elems = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        if (elems > max_elems)
            max_elems = elems;
        if (t->ne[0] > max_row)
            max_row = t->ne[0];
        rc = kiri_gguf_writer_add_tensor(w, t->name, type, t->n_dims, t->ne);
    }
    if (rc < 0 && info && info->code == KIRI_OK)
        kiri_error_set(info, rc, "cannot describe the output file");
    int n_threads = kiri_platform_n_cpus();
    n_threads = n_threads < 1 ? 1 : n_threads > QUANTIZE_MAX_THREADS ? QUANTIZE_MAX_THREADS : n_threads;
    if (rc == 0) {
        f32 = kiri_mem_array((size_t)n_threads * (size_t)max_row, sizeof *f32);
        q = kiri_mem_array((size_t)max_elems, sizeof(float));
        if (!f32 || !q)
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory for a tensor of %lld values", (long long)max_elems);
    }
    if (rc == 0 && kiri_threadpool_init(n_threads, &pool) < 0)
        rc = kiri_error_set(info, KIRI_E_NOMEM, "cannot start %d threads", n_threads);
    if (rc == 0)
        rc = kiri_gguf_writer_begin(w, out_path, info);
    for (int64_t i = 0; i < n && rc == 0; i++) {
        const struct kiri_gguf_tensor *t = kiri_gguf_tensor(g, i);
        const int type = choose_type(tg, t, (int)n_layer, tied);
        if (type == t->type) {
            rc = kiri_gguf_writer_write_tensor(w, t->data, t->size, info);
        } else {
            struct convert_job job = {.t = t, .type = type, .row = t->ne[0],
                                      .rows = t->ne[1] * t->ne[2] * t->ne[3], .f32 = f32, .out = q};
            job.in_row = kiri_row_bytes(t->type, job.row);
            job.out_row = kiri_row_bytes(type, job.row);
            kiri_threadpool_run(pool, convert_rows, &job);
            rc = kiri_gguf_writer_write_tensor(w, q, (size_t)job.rows * job.out_row, info);
        }
        if (progress)
            progress(user, i + 1, n);
    }
    if (rc == 0)
        rc = kiri_gguf_writer_finish(w, info);
    kiri_gguf_writer_free(w);
    kiri_threadpool_free(pool);
    kiri_mem_free(f32);
    kiri_mem_free(q);
    kiri_gguf_close(g);
    return rc;
}
