/* libFuzzer target for the tokenizer: the first input byte picks a vocabulary and the flags, the
 * rest is text (any bytes). The text is encoded (add BOS/EOS, parse special or not) and decoded
 * through the streaming detokenizer; every id must be in range, the count must not depend on the
 * output capacity, and every streamed chunk must be valid UTF-8.
 *
 * The vocabularies are the ggml-vocab-*.gguf files of $KIRI_VOCAB_DIR (default
 * ../shared/tokenizer-vectors; llama.cpp's models/ folder gives every pre-tokenizer kiri knows)
 * that load.
 * Build: cmake -DKIRI_FUZZ=ON with clang (target fuzz_tokenizer); run from the repository root:
 *        build-fuzz/fuzz_tokenizer -max_total_time=60 corpus/ tests/fuzz/seeds/tokenizer/
 */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kiri.h"
#include "tokenizer.h"
#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MAX_VOCABS 32

static struct kiri_tokenizer *toks[MAX_VOCABS];
static int n_toks;

static void setup(void)
{
    const char *dir = getenv("KIRI_VOCAB_DIR");
    if (!dir)
        dir = "../shared/tokenizer-vectors";
    DIR *d = opendir(dir);
    if (!d)
        abort();
    struct dirent *e;
    while ((e = readdir(d)) && n_toks < MAX_VOCABS) {
        size_t n = strlen(e->d_name);
        if (strncmp(e->d_name, "ggml-vocab-", 11) != 0 || n < 5 || strcmp(e->d_name + n - 5, ".gguf"))
            continue;
        char path[1024];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct kiri_gguf *g = NULL;
        if (kiri_gguf_open(path, &g, NULL) != KIRI_OK)
            continue;
        if (kiri_tokenizer_init(g, &toks[n_toks], NULL) == KIRI_OK)
            n_toks++;
        kiri_gguf_close(g);
    }
    closedir(d);
    if (!n_toks)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!n_toks)
        setup();
    if (size < 1)
        return 0;
    const struct kiri_tokenizer *t = toks[data[0] % n_toks];
    const int flags = data[0] / n_toks;
    const char *text = (const char *)data + 1;
    const size_t len = size - 1;
    const int n = kiri_tokenizer_encode(t, text, len, flags & 1, flags & 2, flags & 4, NULL, 0);
    if (n < 0)
        return 0;
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (!ids)
        return 0;
    if (kiri_tokenizer_encode(t, text, len, flags & 1, flags & 2, flags & 4, ids, n) != n)
        abort();
    const size_t cap = KIRI_DETOK_CAP_FOR(kiri_tokenizer_max_piece(t));
    char *out = malloc(cap);
    struct kiri_detok_stream ds = {0};
    for (int i = 0; i < n && out; i++) {
        if (ids[i] < 0 || ids[i] >= kiri_tokenizer_n_vocab(t))
            abort();
        const int k = kiri_detok_push(t, &ds, ids[i], flags & 8, out, cap);
        if (k < 0 || !kiri_utf8_valid(out, (size_t)k))
            abort();
    }
    if (out && kiri_detok_flush(&ds, out, cap) < 0)
        abort();
    free(out);
    free(ids);
    return 0;
}
