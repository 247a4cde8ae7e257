/* The engine end to end through the public API on the bundled stories260K model: hyperparameters
 * as published for the model, batched prefill equal to token-by-token evaluation, the three KV
 * cache types, stop strings and max_tokens against llama.cpp's reference text, cancellation,
 * context limits, bad arguments, and every allocation failure while opening. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kiri.h"
#include "mem.h"
#include "test.h"

#ifndef KIRI_SOURCE_DIR
#define KIRI_SOURCE_DIR "."
#endif
#define MODEL KIRI_SOURCE_DIR "/models/stories260K.gguf"

/* The reference continuation of "Once upon a time": llama.cpp's greedy output for stories260K. */
static const char *const reference_text =
    ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw a "
    "big, red ball.";

static struct kiri_model *open_model(void)
{
    struct kiri_model_params p;
    kiri_model_params_default(&p);
    p.n_threads = 2;
    struct kiri_model *m = NULL;
    struct kiri_status_info info;
    if (kiri_model_open(MODEL, &p, &m, &info) != KIRI_OK)
        fprintf(stderr, "open: %s\n", info.message);
    return m;
}

static struct kiri_context *make_ctx(struct kiri_model *m, int n_ctx, int n_batch, int kv_type)
{
    struct kiri_context_params cp;
    kiri_context_params_default(&cp);
    cp.n_ctx = n_ctx;
    cp.n_batch = n_batch;
    cp.kv_type = kv_type;
    struct kiri_context *c = NULL;
    struct kiri_status_info info;
    if (kiri_context_init(m, &cp, &c, &info) != KIRI_OK)
        fprintf(stderr, "context: %s\n", info.message);
    return c;
}

static void test_hparams(void)
{
    struct kiri_model *m = open_model();
    CHECK(m != NULL);
    if (!m)
        return;
    /* stories260K: dim 64, 5 layers, 8 heads, 4 KV heads, 512-token vocabulary, context 512. */
    CHECK_EQ_INT(kiri_model_n_vocab(m), 512);
    CHECK_EQ_INT(kiri_model_n_ctx_train(m), 512);
    CHECK_EQ_INT(kiri_model_bos(m), 1);
    CHECK_EQ_INT(kiri_model_eos(m), 2);
    char buf[4096];
    kiri_model_describe(m, buf, sizeof buf);
    CHECK(strstr(buf, "architecture:  llama") != NULL);
    CHECK(strstr(buf, "layers:        5, embedding 64") != NULL);
    CHECK(strstr(buf, "8 heads, 4 kv heads, head size 8") != NULL);
    CHECK(strstr(buf, "cpu: picked") != NULL);
    kiri_model_close(m);
}

/* One prompt evaluated in chunks of 1, 3 and all tokens gives the same last logits. */
static void test_batched_prefill(void)
{
    struct kiri_model *m = open_model();
    if (!m)
        return;
    int32_t ids[64];
    const char *text = "Lily wanted to play with her friend Tom in the big green park";
    const int n = kiri_tokenize(m, text, strlen(text), -1, 0, ids, 64);
    CHECK(n > 8 && n <= 64);
    float ref[512];
    const int batches[] = {1, 3, 512};
    for (int bi = 0; bi < 3; bi++) {
        struct kiri_context *c = make_ctx(m, 128, batches[bi], 1);
        const float *lg = NULL;
        struct kiri_status_info info;
        if (batches[bi] == 1) {
            for (int i = 0; i < n; i++)
                CHECK_EQ_INT(kiri_context_eval(c, &ids[i], 1, &lg, &info), 0);
            memcpy(ref, lg, sizeof ref);
        } else {
            CHECK_EQ_INT(kiri_context_eval(c, ids, n, &lg, &info), 0);
            double worst = 0;
            for (int v = 0; v < 512; v++) {
                const double d = fabs(lg[v] - ref[v]);
                if (d > worst)
                    worst = d;
            }
            CHECK_NEAR(worst, 0, 1e-4);
        }
        kiri_context_free(c);
    }
    kiri_model_close(m);
}

struct collect {
    char text[4096];
    size_t len;
    int calls;
    struct kiri_context *cancel_ctx;
    int cancel_after;
};

static int collect(void *user, int32_t token, const char *text, size_t len)
{
    struct collect *c = user;
    if (c->len + len < sizeof c->text) {
        memcpy(c->text + c->len, text, len);
        c->len += len;
        c->text[c->len] = '\0';
    }
    if (token >= 0)
        c->calls++;
    if (c->cancel_ctx && c->calls == c->cancel_after)
        kiri_context_cancel(c->cancel_ctx);
    return 0;
}

static int generate(struct kiri_model *m, struct kiri_context *c, const char *prompt, int max_tokens,
                    const char *const *stop, int n_stop, struct collect *out, struct kiri_generate_result *res)
{
    int32_t ids[64];
    const int n = kiri_tokenize(m, prompt, strlen(prompt), -1, 0, ids, 64);
    struct kiri_generate_params gp;
    memset(&gp, 0, sizeof gp);
    gp.max_tokens = max_tokens;
    kiri_sampling_default(&gp.sampling);
    gp.sampling.temperature = 0;
    gp.stop = stop;
    gp.n_stop = n_stop;
    struct kiri_status_info info;
    return kiri_generate(c, ids, n, &gp, collect, out, res, &info);
}

/* Greedy text starts with the reference for every KV cache type. */
static void test_kv_types(void)
{
    struct kiri_model *m = open_model();
    if (!m)
        return;
    const int types[] = {1, 0, 8};
    for (int i = 0; i < 3; i++) {
        if (types[i] == 8) { /* head size 8 cannot hold Q8_0 blocks: a clear refusal */
            struct kiri_context_params cp;
            kiri_context_params_default(&cp);
            cp.kv_type = 8;
            struct kiri_context *c = NULL;
            struct kiri_status_info info;
            CHECK_EQ_INT(kiri_context_init(m, &cp, &c, &info), KIRI_E_INVALID_ARG);
            CHECK(c == NULL);
            continue;
        }
        struct kiri_context *c = make_ctx(m, 0, 0, types[i]);
        struct collect out = {0};
        struct kiri_generate_result res;
        CHECK_EQ_INT(generate(m, c, "Once upon a time", 40, NULL, 0, &out, &res), 0);
        CHECK(strncmp(out.text, reference_text, strlen(reference_text)) == 0);
        CHECK_EQ_INT(res.n_generated, 40);
        CHECK_EQ_INT(res.finish, KIRI_FINISH_LENGTH);
        kiri_context_free(c);
    }
    kiri_model_close(m);
}

static void test_stop_and_cancel(void)
{
    struct kiri_model *m = open_model();
    if (!m)
        return;
    struct kiri_context *c = make_ctx(m, 0, 0, 1);
    struct kiri_generate_result res;

    /* A stop string ends generation and is not delivered; neither is anything after it. */
    const char *stop[] = {"park", "zebra"};
    struct collect out = {0};
    CHECK_EQ_INT(generate(m, c, "Once upon a time", 100, stop, 2, &out, &res), 0);
    CHECK_EQ_INT(res.finish, KIRI_FINISH_STOP);
    CHECK_STR(out.text, ", there was a little girl named Lily. She loved to play outside in the ");

    /* A stop string that never comes: everything is delivered. */
    const char *never[] = {"zebra"};
    struct collect all = {0};
    CHECK_EQ_INT(generate(m, c, "Once upon a time", 30, never, 1, &all, &res), 0);
    CHECK_EQ_INT(res.finish, KIRI_FINISH_LENGTH);
    CHECK(strncmp(all.text, reference_text, 40) == 0);

    /* Cancel from the callback: the call returns E_CANCELLED after the tokens already given. */
    struct collect cc = {0};
    cc.cancel_ctx = c;
    cc.cancel_after = 5;
    CHECK_EQ_INT(generate(m, c, "Once upon a time", 100, NULL, 0, &cc, &res), KIRI_E_CANCELLED);
    CHECK_EQ_INT(cc.calls, 5);

    /* The context is usable again after a cancel. */
    struct collect again = {0};
    CHECK_EQ_INT(generate(m, c, "Once upon a time", 10, NULL, 0, &again, &res), 0);
    CHECK_EQ_INT(res.n_generated, 10);
    kiri_context_free(c);
    kiri_model_close(m);
}

static void test_limits_and_bad_args(void)
{
    struct kiri_model *m = open_model();
    if (!m)
        return;
    struct kiri_context *c = make_ctx(m, 8, 4, 1);
    int32_t ids[12] = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
    const float *lg;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_context_eval(c, ids, 12, &lg, &info), KIRI_E_CONTEXT_FULL);
    CHECK_EQ_INT(kiri_context_eval(c, ids, 8, &lg, &info), 0);
    CHECK_EQ_INT(kiri_context_eval(c, ids, 1, &lg, &info), KIRI_E_CONTEXT_FULL);
    kiri_context_reset(c);
    int32_t bad[2] = {1, 512};
    CHECK_EQ_INT(kiri_context_eval(c, bad, 2, &lg, &info), KIRI_E_INVALID_ARG);
    bad[1] = -3;
    CHECK_EQ_INT(kiri_context_eval(c, bad, 2, &lg, &info), KIRI_E_INVALID_ARG);
    /* Generation that reaches the context length stops with FINISH_CONTEXT. */
    struct collect out = {0};
    struct kiri_generate_result res;
    CHECK_EQ_INT(generate(m, c, "Once upon a time", 100, NULL, 0, &out, &res), 0);
    CHECK_EQ_INT(res.finish, KIRI_FINISH_CONTEXT);
    kiri_context_free(c);

    /* Invalid sampling parameters are refused before any token. */
    c = make_ctx(m, 64, 0, 1);
    struct kiri_generate_params gp;
    memset(&gp, 0, sizeof gp);
    kiri_sampling_default(&gp.sampling);
    gp.sampling.top_p = NAN;
    struct collect none = {0};
    CHECK_EQ_INT(kiri_generate(c, ids, 5, &gp, collect, &none, &res, &info), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(none.calls, 0);
    kiri_context_free(c);

    struct kiri_model *m2 = NULL;
    CHECK_EQ_INT(kiri_model_open(KIRI_SOURCE_DIR "/no/such/model.gguf", NULL, &m2, &info), KIRI_E_IO);
    CHECK(m2 == NULL);
    struct kiri_model_params p;
    kiri_model_params_default(&p);
    p.backend = "no-such-backend";
    CHECK_EQ_INT(kiri_model_open(MODEL, &p, &m2, &info), KIRI_E_INVALID_ARG);
    CHECK(m2 == NULL);
    kiri_model_close(m);
}

/* Every allocation made while opening a model and a context may fail: the error comes back
 * cleanly and nothing leaks (checked by the sanitizer build). */
static void test_failing_allocator(void)
{
    int clean = 0, ok = 0;
    for (long n = 0; n < 400 && !ok; n++) {
        struct kiri_model_params p;
        kiri_model_params_default(&p);
        p.n_threads = 1;
        struct kiri_model *m = NULL;
        struct kiri_context *c = NULL;
        struct kiri_status_info info;
        kiri_mem_fail_after(n);
        int rc = kiri_model_open(MODEL, &p, &m, &info);
        if (rc == KIRI_OK)
            rc = kiri_context_init(m, NULL, &c, &info);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK)
            ok = 1;
        else if (rc == KIRI_E_NOMEM || info.code == KIRI_E_NOMEM)
            clean++;
        else {
            fprintf(stderr, "allocation %ld failed with %s: %s\n", n, kiri_status_name(rc), info.message);
            CHECK(0);
        }
        kiri_context_free(c);
        kiri_model_close(m);
    }
    CHECK(ok);
    CHECK(clean > 10);
}

TEST_MAIN(test_hparams, test_batched_prefill, test_kv_types, test_stop_and_cancel, test_limits_and_bad_args,
          test_failing_allocator)
