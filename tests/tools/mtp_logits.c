/* mtp_logits: runs a qwen35 model's multi-token-prediction head (runtime/graph.h,
 * kiri_graph_run_mtp) the way the mtp drafter does, for test_mtp.py to hold against a float64
 * reference of the block:
 *   1. the trunk over ids[0..n-2] in one step, keeping every position's hidden state (the output
 *      norm's, kiri_batch.hidden);
 *   2. the head over positions 0..n-2 (token i with the hidden state of position i - 1, zeros at
 *      0), logits at every row;
 *   3. a chained draft of K tokens from position n - 1: token ids[n-1] with the hidden state of
 *      position n - 2, then each argmax with the head's own hidden state.
 *
 * Usage: mtp_logits [--kv f16|f32|q8_0] [--draft K] --out FILE MODEL ID ...
 * FILE gets raw float32 [n - 1 + K][n_vocab] (step 2's rows, then step 3's); stdout is
 * {"n_vocab": V, "rows": R, "drafts": [...]}. Environment: KIRI_BACKEND, KIRI_THREADS. Errors go
 * to stderr with exit status 1.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"
#include "kiri.h"
#include "kvcache.h"
#include "model.h"
#include "sampler.h"

#define BLOCK 16
#define MAX_IDS 4096

static int fail(const char *what, const struct kiri_status_info *info)
{
    fprintf(stderr, "mtp_logits: %s%s%s\n", what, info && info->message[0] ? ": " : "",
            info ? info->message : "");
    return 1;
}

int main(int argc, char **argv)
{
    int kv_type = KIRI_KV_F16, draft = 0, argi = 1;
    const char *out = NULL;
    for (; argi + 1 < argc && argv[argi][0] == '-'; argi += 2) {
        if (!strcmp(argv[argi], "--kv"))
            kv_type = !strcmp(argv[argi + 1], "f32") ? KIRI_KV_F32 : !strcmp(argv[argi + 1], "q8_0") ? KIRI_KV_Q8_0
                                                                                                      : KIRI_KV_F16;
        else if (!strcmp(argv[argi], "--draft"))
            draft = atoi(argv[argi + 1]);
        else if (!strcmp(argv[argi], "--out"))
            out = argv[argi + 1];
        else
            break;
    }
    const int n = argc - argi - 1;
    if (!out || n < 2 || n > MAX_IDS || draft < 0 || draft > 64) {
        fprintf(stderr, "usage: mtp_logits [--kv f16|f32|q8_0] [--draft K] --out FILE MODEL ID ... (2..%d ids)\n",
                MAX_IDS);
        return 2;
    }
    static int32_t ids[MAX_IDS + 64], pos[MAX_IDS + 64], slots[MAX_IDS + 64], nkv[MAX_IDS + 64], toff[MAX_IDS + 64];
    static int32_t rows[MAX_IDS + 64], state[MAX_IDS + 64], table[(MAX_IDS + 64) / BLOCK + 1];
    for (int i = 0; i < n; i++)
        ids[i] = atoi(argv[argi + 1 + i]);
    const int total = n + draft, n_blocks = (total + BLOCK - 1) / BLOCK;
    for (int i = 0; i < total; i++) {
        pos[i] = slots[i] = rows[i] = i;
        nkv[i] = i + 1;
        toff[i] = state[i] = 0;
    }
    for (int i = 0; i < n_blocks; i++)
        table[i] = i;

    struct kiri_status_info info;
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.backend = getenv("KIRI_BACKEND") ? getenv("KIRI_BACKEND") : "cpu";
    mp.n_threads = getenv("KIRI_THREADS") ? atoi(getenv("KIRI_THREADS")) : 0;
    struct kiri_model *m = NULL;
    if (kiri_model_open(argv[argi], &mp, &m, &info) != KIRI_OK)
        return fail("load", &info);
    if (!kiri_model_has_mtp(m)) {
        kiri_model_close(m);
        return fail("the model has no multi-token-prediction head", NULL);
    }
    const size_t E = (size_t)m->hp.n_embd, V = (size_t)m->hp.n_vocab;
    struct kiri_kvcache *kv = NULL;
    struct kiri_graph *g = NULL;
    float *hidden = calloc((size_t)total * E, sizeof(float)), *h_in = calloc((size_t)total * E, sizeof(float));
    float *rows_out = calloc((size_t)total * V, sizeof(float)), *h_out = calloc((size_t)total * E, sizeof(float));
    int rc = !hidden || !h_in || !rows_out || !h_out;
    if (!rc)
        rc = kiri_model_kvcache_init_mtp(m, kv_type, BLOCK, n_blocks, 0, 1, 0, &kv) != KIRI_OK;
    if (!rc)
        rc = kiri_graph_init(m, total, total, n_blocks, total, &g) != KIRI_OK;
    if (rc) {
        kiri_model_close(m);
        return fail("cannot allocate", NULL);
    }
    const float *lg = NULL;
    /* 1. The trunk over ids[0..n-2]. */
    const int32_t last = n - 2;
    struct kiri_batch tb = {n - 1, ids, pos, slots, nkv, toff, table, n_blocks, &last, 1, NULL, NULL,
                            kiri_model_n_recurrent_layers(m) ? state : NULL, NULL, hidden};
    if (kiri_graph_run(g, kv, &tb, &lg, &info) != KIRI_OK)
        return fail("trunk", &info);
    /* 2. The head over positions 0..n-2, each after the hidden state of the position before. */
    memcpy(h_in + E, hidden, (size_t)(n - 2) * E * sizeof(float));
    struct kiri_batch mb = {n - 1, ids, pos, slots, nkv, toff, table, n_blocks, rows, n - 1, NULL, NULL, NULL, NULL,
                            NULL};
    if (kiri_graph_run_mtp(g, kv, &mb, h_in, h_out, &lg, &info) != KIRI_OK)
        return fail("mtp", &info);
    memcpy(rows_out, lg, (size_t)(n - 1) * V * sizeof(float));
    /* 3. The chained draft. */
    printf("{\"n_vocab\": %zu, \"rows\": %d, \"drafts\": [", V, n - 1 + draft);
    int32_t token = ids[n - 1];
    memcpy(h_in, hidden + (size_t)(n - 2) * E, E * sizeof(float));
    for (int k = 0; k < draft; k++) {
        const int32_t zero = 0;
        struct kiri_batch cb = {1, &token, &pos[n - 1 + k], &slots[n - 1 + k], &nkv[n - 1 + k], toff, table, n_blocks,
                                &zero, 1, NULL, NULL, NULL, NULL, NULL};
        if (kiri_graph_run_mtp(g, kv, &cb, h_in, h_out, &lg, &info) != KIRI_OK)
            return fail("mtp draft", &info);
        memcpy(rows_out + (size_t)(n - 1 + k) * V, lg, V * sizeof(float));
        token = kiri_sampler_argmax(lg, (int32_t)V);
        memcpy(h_in, h_out, E * sizeof(float));
        printf("%s%d", k ? ", " : "", token);
    }
    printf("]}\n");
    FILE *f = fopen(out, "wb");
    rc = !f || fwrite(rows_out, sizeof(float), (size_t)(n - 1 + draft) * V, f) != (size_t)(n - 1 + draft) * V;
    if (f)
        fclose(f);
    kiri_graph_free(g);
    kiri_kvcache_free(kv);
    kiri_model_close(m);
    free(hidden);
    free(h_in);
    free(rows_out);
    free(h_out);
    return rc ? fail("cannot write the rows", NULL) : 0;
}
