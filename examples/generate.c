/* A minimal program embedding kiri: open a model, generate greedily from a prompt, print the text.
 * Build against the engine and base libraries (see README.md, "Embedding kiri"):
 *   cc -Iinclude examples/generate.c build/libkiri.a build/libkiri_base.a \
 *      /usr/lib/x86_64-linux-gnu/libpcre2-8.a -lpthread -lm -ldl
 * Usage: generate MODEL.gguf "PROMPT" */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiri.h"

static int on_token(void *user, int32_t token, const char *text, size_t len)
{
    (void)token;
    fwrite(text, 1, len, stdout);
    return ++*(int *)user >= 64; /* stop after 64 tokens */
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: %s MODEL.gguf PROMPT\n", argv[0]);
        return 2;
    }
    struct kiri_status_info info;
    struct kiri_model *model = NULL;
    if (kiri_model_open(argv[1], NULL, &model, &info) != KIRI_OK) {
        fprintf(stderr, "error: %s\n", info.message);
        return 1;
    }
    struct kiri_context *ctx = NULL;
    if (kiri_context_init(model, NULL, &ctx, &info) != KIRI_OK) {
        fprintf(stderr, "error: %s\n", info.message);
        kiri_model_close(model);
        return 1;
    }
    int32_t ids[512];
    const int n = kiri_tokenize(model, argv[2], strlen(argv[2]), -1, 0, ids, 512);
    if (n < 1 || n > 512) {
        fprintf(stderr, "error: the prompt must be 1..512 tokens\n");
        kiri_context_free(ctx);
        kiri_model_close(model);
        return 1;
    }
    struct kiri_generate_params gp = {.max_tokens = -1};
    kiri_sampling_default(&gp.sampling);
    gp.sampling.temperature = 0.0f;
    int count = 0;
    struct kiri_generate_result res;
    const int rc = kiri_generate(ctx, ids, n, &gp, on_token, &count, &res, &info);
    printf("\n");
    if (rc != KIRI_OK)
        fprintf(stderr, "error: %s\n", info.message);
    else
        fprintf(stderr, "%d prompt tokens, %d generated\n", res.n_prompt, res.n_generated);
    kiri_context_free(ctx);
    kiri_model_close(model);
    return rc == KIRI_OK && res.n_generated > 0 ? 0 : 1;
}
