/* The Vulkan backend against the CPU reference, for real on whatever Vulkan device is here (Mesa's
 * lavapipe will do: it is forced past its probe score of 0, as --backend vulkan does):
 * - every op on random inputs against the CPU backend with the portable C kernels (the reference):
 *   products of all eleven weight types with one token (mat-vec) and several (tiled mat-mat),
 *   rows that end inside a block, activations converted once for consecutive products; row
 *   look-ups; RMS norm (in place, 3-D views); add and mul (broadcast, in place); SwiGLU and GEGLU;
 *   scale and softcap (in place, 3-D); RoPE (normal and neox, partial rotation, frequency factors,
 *   scaling, attn_factor); STORE_KV into F32, F16 and Q8_0 caches; attention over F32, F16 and
 *   Q8_0 caches with GQA through scrambled block tables, with and without a sliding window (the
 *   table entries below the window poisoned); the hybrid models' ops (backend_check_recurrent_ops:
 *   the sigmoid output gate over a strided gate, the short convolution of lfm2 and qwen35, the
 *   delta-rule gates and the delta rule, each over two interleaved sequences, one starting at
 *   position 0 over a garbage state row, a token naming a row outside the state, and the state
 *   carried across two steps);
 * - all of it twice: once as the device comes (host-memory scratch on lavapipe), once with
 *   device-local scratch behind staging copies and a 256 KiB storage-binding limit, so uploads,
 *   downloads and weights split into chunks run too;
 * - whole models against the CPU backend (the one --backend cpu runs), on models/stories260K.gguf
 *   (F16 and F32 caches) and on tiny random models written here with the GGUF writer: llama with
 *   float weights (F32, F16), llama with every quantized type, GQA and rope_freqs (F16 and Q8_0
 *   caches), qwen2 (biases, neox RoPE, tied embeddings), qwen3 (per-head norms, head size 128
 *   with n_head * head_dim != n_embd). stories260K and the float model: 64 free-running greedy
 *   tokens equal. Quantized random models: logits within 5% of the largest at each of 64
 *   teacher-forced steps (backend_check_model says why not free-running equality); and concurrent
 *   requests through the batching loop equal the CPU's solo runs;
 * - partial offload (gpu_layers): the placement kiri info prints; greedy tokens with 0, 1,
 *   n_layer - 1 and all layers on Vulkan equal the CPU's (stories260K, the float random model;
 *   the quantized random models split after one layer, with the tolerance above), also with
 *   staged device memory; the batching loop with a split model (its cache moved to the split on
 *   the first step) equals the CPU's solo runs; moving a cache's layers between the backends
 *   keeps every byte; a hybrid cache keeps each layer's recurrent state on the backend that runs
 *   it, and refuses to move it; contexts of a split model under a failing allocator.
 * Tolerances (stated with each check): products within 2e-5 of sum |w_i x_i| (both sides quantize
 * the activations the same way and the shaders add block results in the reference's order, so
 * quantized products come out bit-identical; plain F32 / F16 / BF16 rows, summed per block,
 * differ in the last bits); row look-ups, add, mul, scale and STORE_KV exact; norms, SwiGLU,
 * GEGLU, softcap, RoPE and attention over an F32 cache within a few 1e-6 (exp, tanh, sin / cos
 * and reduction order differ);
 * attention over F16 and Q8_0 caches within 1e-4 (see check_attention).
 * The op checks and the model comparisons are tests/backend_check.c's, which cuda_check shares;
 * what is Vulkan's own (the memory modes, partial offload, the start-up choice) is here.
 * Exits 77 (skipped) when there is no Vulkan device at all. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "backend_check.h"
#include "kiri.h"
#include "kvcache.h"
#include "mem.h"
#include "platform.h"
#include "test.h"

#ifndef KIRI_SOURCE_DIR
#define KIRI_SOURCE_DIR "."
#endif
#define STORIES KIRI_SOURCE_DIR "/models/stories260K.gguf"

extern const struct kiri_backend_iface kiri_cpu_backend_iface;
extern const struct kiri_backend_iface kiri_vulkan_backend_iface;
static const struct kiri_backend_iface *const CPU = &kiri_cpu_backend_iface;
static const struct kiri_backend_iface *const VK = &kiri_vulkan_backend_iface;

static struct kiri_backend *cpu, *vk;
static struct backend_check bc; /* the shared checks, on Vulkan */

#define MODE_AS_IS "as the device comes"
#define MODE_STAGING "staging, 256 KiB bindings"

/* Device-local scratch behind staging copies, and (bindings) a 256 KiB storage-binding limit. */
static void set_staging(int on, int bindings, const char *mode)
{
    if (on)
        setenv("KIRI_VULKAN_STAGING", "1", 1);
    else
        unsetenv("KIRI_VULKAN_STAGING");
    if (bindings)
        setenv("KIRI_VULKAN_MAX_BINDING", "262144", 1);
    else
        unsetenv("KIRI_VULKAN_MAX_BINDING");
    bc.mode = mode;
}

/* ---------------------------------------------------------------------------------------------
 * The op checks, in both memory modes
 * ------------------------------------------------------------------------------------------- */

static int start_vulkan(void)
{
    vk = backend_check_start(&bc, stderr);
    return vk ? 0 : -1;
}

/* The shared op checks on vk, then Vulkan closed; the table goes to stderr. */
static void run_op_checks(void)
{
    bc.be = vk;
    backend_check_ops(&bc);
    backend_check_recurrent_ops(&bc);
    backend_check_print_table(&bc, stderr);
    bc.be = NULL;
    VK->free(vk);
    vk = NULL;
}

/* Skips the whole test (77) where there is no Vulkan device at all; lavapipe counts. */
static void test_device(void)
{
    /* Keeps Mesa's lavapipe loaded for the whole run, where it is the driver: the Vulkan loader
     * unloads a driver with its last instance, and the driver's one-time initialisation then looks
     * leaked to LeakSanitizer, from frames with no module left to name. Elsewhere a no-op. */
    (void)kiri_platform_dl_open("libvulkan_lvp.so");
    backend_check_init(&bc, VK, "vulkan", "test_vulkan", STORIES, &test_checks, &test_failures);
    struct kiri_backend_config c;
    backend_check_config(&c);
    char why[160] = "";
    const int score = VK->probe(&c, why, sizeof why);
    fprintf(stderr, "test_vulkan: probe score %d (%s)\n", score, why);
    bc.mode = MODE_AS_IS;
    if (score == 0 && strncmp(why, "software renderer", 17) != 0) {
        printf("test_vulkan: skipped: no Vulkan device (%s)\n", why);
        exit(77);
    }
    CHECK_EQ_INT(start_vulkan(), 0);
    if (!vk)
        exit(1);
}

static void test_ops(void) { run_op_checks(); }

static void test_ops_staging(void)
{
    set_staging(1, 1, MODE_STAGING);
    if (start_vulkan() == 0)
        run_op_checks();
    set_staging(0, 0, MODE_AS_IS);
    CHECK(vk == NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Whole models (tolerances: see backend_check_model)
 * ------------------------------------------------------------------------------------------- */

static void test_models(void)
{
    bc.mode = MODE_AS_IS;
    backend_check_models(&bc);
}

static void test_models_staging(void)
{
    set_staging(1, 1, MODE_STAGING);
    backend_check_model(&bc, STORIES, "stories260K", -1, KIRI_TYPE_F16, "Sam and his mom went to", 1);
    backend_check_tiny_model(&bc, 0, KIRI_TYPE_F32, "Once upon a time", 1);
    backend_check_tiny_model(&bc, 1, KIRI_TYPE_F16, "Once upon a time", 0);
    set_staging(0, 0, MODE_AS_IS);
}

/* ---- partial offload: the first N layers on Vulkan, the rest on the CPU ---- */

/* Opens path on Vulkan with gpu_layers and checks the placement line kiri info prints. */
static void check_placement(const char *path, int gpu_layers, const char *want)
{
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.backend = "vulkan";
    mp.gpu_layers = gpu_layers;
    mp.n_threads = 2;
    struct kiri_model *m = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_model_open(path, &mp, &m, &info), 0);
    if (!m)
        return;
    static char buf[8192];
    kiri_model_describe(m, buf, sizeof buf);
    const char *line = strstr(buf, "placement:");
    CHECK(line != NULL);
    CHECK(line && strstr(line, want) == line);
    if (!line || strstr(line, want) != line)
        fprintf(stderr, "gpu layers %d: want '%s', got:\n%s", gpu_layers, want, buf);
    kiri_model_close(m);
}

/* Layer l's keys (j = 0) or values (j = 1) hold pattern bytes: are they there, read through
 * whichever backend holds them? */
static int cache_holds_pattern(struct kiri_kvcache *c, int n_layer, size_t bytes)
{
    unsigned char *buf = test_xmalloc(bytes);
    int ok = 1;
    for (int l = 0; l < n_layer; l++)
        for (int j = 0; j < 2; j++) {
            const struct kiri_tensor *t = j ? kiri_kvcache_v(c, l) : kiri_kvcache_k(c, l);
            if (t->data)
                memcpy(buf, t->data, bytes);
            else if (kiri_kvcache_backend(c, l) != vk || VK->tensor_get(vk, t, buf, 0, bytes) != 0)
                ok = 0;
            for (size_t i = 0; i < bytes && ok; i++)
                ok = buf[i] == (unsigned char)(l * 7 + j * 3 + (int)i * 13);
        }
    free(buf);
    return ok;
}

/* kiri_kvcache_place moves leading layers of a CPU cache to Vulkan and back, keeping every byte
 * (with host-visible and with staged device memory). */
static void test_kvcache_place(void)
{
    for (int staging = 0; staging < 2; staging++) {
        if (staging)
            setenv("KIRI_VULKAN_STAGING", "1", 1);
        bc.mode = staging ? "staging" : MODE_AS_IS;
        struct kiri_backend_config cc;
        backend_check_config(&cc);
        char msg[128];
        CHECK_EQ_INT(CPU->init(&cc, &cpu, msg, sizeof msg), 0);
        CHECK_EQ_INT(start_vulkan(), 0);
        struct kiri_kvcache *c = NULL;
        enum { LAYERS = 3 };
        const size_t bytes = 64 * 2 * 4 * 6; /* kv_dim 64, F16, 6 blocks of 4 slots */
        CHECK_EQ_INT(kiri_kvcache_init(CPU, cpu, LAYERS, 64, KIRI_TYPE_F16, 4, 6, &c), 0);
        if (c && vk) {
            for (int l = 0; l < LAYERS; l++)
                for (int j = 0; j < 2; j++) {
                    unsigned char *d = (j ? kiri_kvcache_v(c, l) : kiri_kvcache_k(c, l))->data;
                    for (size_t i = 0; i < bytes; i++)
                        d[i] = (unsigned char)(l * 7 + j * 3 + (int)i * 13);
                }
            CHECK_EQ_INT(kiri_kvcache_place(c, 2, VK, vk, CPU, cpu), 0);
            CHECK_EQ_INT(kiri_kvcache_n_first(c), 2);
            CHECK(kiri_kvcache_backend(c, 0) == vk && kiri_kvcache_backend(c, 1) == vk);
            CHECK(kiri_kvcache_backend(c, 2) == cpu);
            CHECK(kiri_kvcache_k(c, 0)->buffer != kiri_kvcache_k(c, 2)->buffer);
            CHECK_EQ_INT(kiri_kvcache_bytes(c), bytes * 2 * LAYERS);
            CHECK(cache_holds_pattern(c, LAYERS, bytes));
            CHECK_EQ_INT(kiri_kvcache_place(c, 2, VK, vk, CPU, cpu), 0); /* already there */
            CHECK_EQ_INT(kiri_kvcache_place(c, 1, VK, vk, CPU, cpu), 0);
            CHECK(kiri_kvcache_backend(c, 0) == vk && kiri_kvcache_backend(c, 1) == cpu);
            CHECK(cache_holds_pattern(c, LAYERS, bytes));
            CHECK_EQ_INT(kiri_kvcache_place(c, 0, NULL, NULL, CPU, cpu), 0);
            CHECK(kiri_kvcache_backend(c, 0) == cpu);
            CHECK(cache_holds_pattern(c, LAYERS, bytes));
            /* Every layer on Vulkan (the other part empty), then as one part, then split again with the
             * rest moving back to the CPU. */
            CHECK_EQ_INT(kiri_kvcache_place(c, LAYERS, VK, vk, CPU, cpu), 0);
            CHECK(kiri_kvcache_backend(c, LAYERS - 1) == vk);
            CHECK(cache_holds_pattern(c, LAYERS, bytes));
            CHECK_EQ_INT(kiri_kvcache_place(c, 0, NULL, NULL, VK, vk), 0);
            CHECK(kiri_kvcache_backend(c, 0) == vk && kiri_kvcache_n_first(c) == 0);
            CHECK(cache_holds_pattern(c, LAYERS, bytes));
            CHECK_EQ_INT(kiri_kvcache_place(c, 2, VK, vk, CPU, cpu), 0);
            CHECK(kiri_kvcache_backend(c, 1) == vk && kiri_kvcache_backend(c, 2) == cpu);
            CHECK(cache_holds_pattern(c, LAYERS, bytes));
            /* A move that cannot allocate leaves the cache as it was. */
            int moved = 0;
            for (long n = 0; n < 8 && !moved; n++) {
                kiri_mem_fail_after(n);
                const int rc = kiri_kvcache_place(c, 1, VK, vk, CPU, cpu);
                kiri_mem_fail_after(-1);
                CHECK(rc == KIRI_OK || rc == KIRI_E_NOMEM);
                moved = rc == KIRI_OK;
                CHECK_EQ_INT(kiri_kvcache_n_first(c), moved ? 1 : 2);
                CHECK(cache_holds_pattern(c, LAYERS, bytes));
            }
            CHECK(moved);
            CHECK_EQ_INT(kiri_kvcache_place(c, 4, VK, vk, CPU, cpu), KIRI_E_INVALID_ARG);
            CHECK_EQ_INT(kiri_kvcache_place(c, 1, NULL, NULL, CPU, cpu), KIRI_E_INVALID_ARG);
        }
        kiri_kvcache_free(c);
        if (vk)
            VK->free(vk);
        vk = NULL;
        CPU->free(cpu);
        unsetenv("KIRI_VULKAN_STAGING");
    }
    bc.mode = MODE_AS_IS;
}

/* A hybrid cache split after layer 1: layer 0's recurrent state (below n_first) on Vulkan, layer
 * 2's on the CPU, each holding what is written to it; moving the attention layer between the
 * backends keeps them, moving a layer with state is refused. A snapshot of a sequence's state
 * taken from both backends lands in another sequence's slot on both. */
static void test_kvcache_state_split(void)
{
    bc.mode = MODE_AS_IS;
    struct kiri_backend_config cc;
    backend_check_config(&cc);
    char msg[128];
    CHECK_EQ_INT(CPU->init(&cc, &cpu, msg, sizeof msg), 0);
    CHECK_EQ_INT(start_vulkan(), 0);
    const int64_t dims[4] = {0, 64, 0, 64}, rec[4] = {24, 0, 40, 0};
    const struct kiri_kvcache_state st = {rec, 2, 1};
    const struct kiri_kvcache_layout lay = {dims, NULL, &st};
    struct kiri_kvcache *c = NULL;
    if (vk)
        CHECK_EQ_INT(kiri_kvcache_init_layers(CPU, cpu, 2, VK, vk, 4, 0, KIRI_TYPE_F16, 4, 6, NULL, &lay, &c), 0);
    if (c) {
        struct kiri_tensor *s0 = kiri_kvcache_state(c, 0), *s2 = kiri_kvcache_state(c, 2);
        CHECK(s0 && s2 && s0->buffer != s2->buffer && s2->data != NULL);
        CHECK_EQ_INT(kiri_kvcache_state_bytes(c), (24 + 40) * 4 * 2);
        float in[48], out[48];
        for (int i = 0; i < 48; i++)
            in[i] = (float)i * 0.5f - 3.0f;
        CHECK_EQ_INT(VK->tensor_set(vk, s0, in, 0, sizeof in), 0);
        memcpy(s2->data, in, 40 * sizeof(float));
        CHECK_EQ_INT(kiri_kvcache_place(c, 1, VK, vk, CPU, cpu), KIRI_OK);
        CHECK(kiri_kvcache_backend(c, 0) == vk && kiri_kvcache_backend(c, 1) == cpu);
        CHECK_EQ_INT(kiri_kvcache_place(c, 0, NULL, NULL, CPU, cpu), KIRI_E_INVALID_ARG);
        CHECK_EQ_INT(kiri_kvcache_place(c, 3, VK, vk, CPU, cpu), KIRI_E_INVALID_ARG);
        CHECK(kiri_kvcache_state(c, 0) == s0 && kiri_kvcache_state(c, 2) == s2);
        CHECK_EQ_INT(VK->tensor_get(vk, s0, out, 0, sizeof out), 0);
        CHECK(memcmp(in, out, sizeof in) == 0);
        CHECK(memcmp(s2->data, in, 40 * sizeof(float)) == 0);
        /* The first sequence takes slot 0 (rows in[0, 24) and in[0, 40)); its snapshot after
         * one block resumes a second sequence in slot 1. */
        const int32_t toks[4] = {5, 6, 7, 8};
        const uint64_t h = kiri_kvcache_block_hash(0, toks, 4);
        struct kiri_kv_seq a = {0}, d = {0};
        CHECK_EQ_INT(kiri_kvcache_seq_reserve(c, &a, 4), 0);
        CHECK_EQ_INT(kiri_kvcache_seq_state_row(&a), 0);
        a.n_tokens = 4;
        kiri_kvcache_publish(c, &a, 0, h, toks);
        CHECK_EQ_INT(kiri_kvcache_snapshot(c, &a, 0, h, toks, 1), 1);
        uint64_t hh = 0;
        CHECK_EQ_INT(kiri_kvcache_seq_share_prefix(c, &d, toks, 1, &hh), 1);
        CHECK_EQ_INT(kiri_kvcache_seq_state_row(&d), 1);
        CHECK_EQ_INT(VK->tensor_get(vk, s0, out, 24 * sizeof(float), 24 * sizeof(float)), 0);
        CHECK(memcmp(in, out, 24 * sizeof(float)) == 0);
        CHECK(memcmp((const float *)s2->data + 40, in, 40 * sizeof(float)) == 0);
        kiri_kvcache_seq_free(c, &a);
        kiri_kvcache_seq_free(c, &d);
    }
    kiri_kvcache_free(c);
    if (vk)
        VK->free(vk);
    vk = NULL;
    CPU->free(cpu);
}

/* Greedy tokens with gpu_layers 0, 1, n_layer - 1 and all equal the CPU's, on stories260K
 * (5 layers) and the float random model (2 layers: 1 is also n_layer - 1); the quantized random
 * models split after their first layer (rope_freqs, biases, tied embeddings, per-head norms on
 * both sides) within the tolerance backend_check_model states for them. */
static void test_gpu_layers(void)
{
    bc.mode = MODE_AS_IS;
    check_placement(STORIES, 1, "placement:     1 of 5 layers on vulkan (layers 0-0, ");
    check_placement(STORIES, 4, "placement:     4 of 5 layers on vulkan (layers 0-3, ");
    check_placement(STORIES, 0, "placement:     all 5 layers, the token embedding and the output head on cpu");
    check_placement(STORIES, 5, "placement:     all 5 layers, the token embedding and the output head on vulkan");
    check_placement(STORIES, 99, "placement:     all 5 layers, the token embedding and the output head on vulkan");
    static const int stories_split[] = {0, 1, 4, 5};
    for (int i = 0; i < 4; i++)
        backend_check_model(&bc, STORIES, "stories260K", stories_split[i], KIRI_TYPE_F16, "Once upon a time", 1);
    backend_check_model(&bc, STORIES, "stories260K", 2, KIRI_TYPE_F32, "Lily wanted to", 1);
    char path[128];
    for (int t = 0; t < 4; t++) {
        snprintf(path, sizeof path, "vk_split_%s.gguf", backend_check_tinies[t].name);
        CHECK_EQ_INT(backend_check_write_tiny(&bc, &backend_check_tinies[t], path), 0);
        char label[64];
        snprintf(label, sizeof label, "tiny random %s", backend_check_tinies[t].name);
        if (t == 0)
            for (int gl = 0; gl <= 2; gl++)
                backend_check_model(&bc, path, label, gl, KIRI_TYPE_F32, "One day, Tom", 1);
        else
            backend_check_model(&bc, path, label, 1, t == 1 ? KIRI_TYPE_Q8_0 : KIRI_TYPE_F16, "One day, Tom", 0);
        remove(path);
    }
}

/* Contexts of a split model with allocations failing one after the other: each attempt fails
 * cleanly or runs. */
static void test_gpu_layers_failing_allocator(void)
{
    struct kiri_model_params mp;
    kiri_model_params_default(&mp);
    mp.backend = "vulkan";
    mp.gpu_layers = 2;
    mp.n_threads = 2;
    struct kiri_model *m = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_model_open(STORIES, &mp, &m, &info), 0);
    if (!m)
        return;
    const int32_t ids[4] = {1, 403, 407, 261};
    int ok = 0;
    for (long n = 0; n < 64 && !ok; n++) {
        struct kiri_context *c = NULL;
        struct kiri_context_params cp;
        kiri_context_params_default(&cp);
        cp.n_ctx = 64;
        const float *logits = NULL;
        kiri_mem_fail_after(n);
        int rc = kiri_context_init(m, &cp, &c, &info);
        if (rc == KIRI_OK)
            rc = kiri_context_eval(c, ids, 4, &logits, &info);
        kiri_mem_fail_after(-1);
        CHECK(rc == KIRI_OK || rc == KIRI_E_NOMEM);
        if (rc != KIRI_OK && rc != KIRI_E_NOMEM)
            fprintf(stderr, "failing after %ld allocations: %s (%s)\n", n, kiri_status_name(rc), info.message);
        ok = rc == KIRI_OK && logits != NULL;
        kiri_context_free(c);
    }
    CHECK(ok);
    kiri_model_close(m);
}

/* The same split with device-local scratch and caches behind staging copies: the residual stream
 * and the step's inputs cross through tensor_set / tensor_get. */
static void test_gpu_layers_staging(void)
{
    set_staging(1, 0, "staging");
    backend_check_model(&bc, STORIES, "stories260K", 2, KIRI_TYPE_F16, "Sam and his mom went to", 1);
    set_staging(0, 0, MODE_AS_IS);
}

/* ---- the batching loop: concurrent greedy requests equal the CPU's solo runs ---- */

static void test_batcher(void) { backend_check_batcher(&bc, -1); }

static void test_batcher_gpu_layers(void)
{
    backend_check_batcher(&bc, 1);
    set_staging(1, 0, "staging");
    backend_check_batcher(&bc, 3);
    set_staging(0, 0, MODE_AS_IS);
}

/* ---- the start-up choice: auto leaves lavapipe to the CPU, a name forces it ---- */

static void test_pick(void)
{
    char buf[2048];
    kiri_system_info("auto", buf, sizeof buf);
    fprintf(stderr, "%s", buf);
    CHECK(strstr(buf, "vulkan: ") != NULL);
    kiri_system_info("vulkan", buf, sizeof buf);
    CHECK(strstr(buf, "vulkan: picked") != NULL);
}

TEST_MAIN(test_device, test_ops, test_ops_staging, test_models, test_models_staging, test_batcher, test_kvcache_place,
          test_kvcache_state_split, test_gpu_layers, test_gpu_layers_failing_allocator, test_gpu_layers_staging, test_batcher_gpu_layers, test_pick)
