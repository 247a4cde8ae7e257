/* Tokenizes texts with the tokenizer of one GGUF file (a vocabulary-only file will do), for
 * tests/test_tokenizer_vectors.py:
 *   tokenize_vocab FILE.gguf TEXTS > results
 * TEXTS holds texts, each followed by "\n__ggml_vocab_test__\n" (the layout of llama.cpp's .inp
 * files). The first output line is "model PRE add_bos BOS"; then, per text, "ids I I ..." (no
 * BOS/EOS, special texts not parsed) and "text HEX" (the concatenated pieces of those ids, special
 * tokens hidden, in hex). Exit status 1 with the error on stderr when the tokenizer does not load.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "error.h"
#include "gguf.h"
#include "kiri.h"
#include "mem.h"
#include "platform.h"
#include "tokenizer.h"

static const char SEP[] = "\n__ggml_vocab_test__\n";

static int run_text(const struct kiri_tokenizer *t, const char *s, size_t n)
{
    int need = kiri_tokenizer_encode(t, s, n, 0, 0, 0, NULL, 0);
    if (need < 0)
        return need;
    int32_t *ids = malloc(((size_t)need + 1) * sizeof *ids);
    char *piece = malloc(kiri_tokenizer_max_piece(t) + 1);
    if (!ids || !piece) {
        free(ids);
        free(piece);
        return KIRI_E_NOMEM;
    }
    kiri_tokenizer_encode(t, s, n, 0, 0, 0, ids, need);
    fputs("ids", stdout);
    for (int i = 0; i < need; i++)
        printf(" %d", ids[i]);
    fputs("\ntext ", stdout);
    for (int i = 0; i < need; i++) {
        int k = kiri_tokenizer_piece(t, ids[i], 0, piece, kiri_tokenizer_max_piece(t) + 1);
        for (int j = 0; j < k; j++)
            printf("%02x", (unsigned char)piece[j]);
    }
    fputc('\n', stdout);
    free(ids);
    free(piece);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: tokenize_vocab FILE.gguf TEXTS\n");
        return 2;
    }
    struct kiri_gguf *g = NULL;
    struct kiri_tokenizer *t = NULL;
    struct kiri_status_info info;
    int rc = kiri_gguf_open(argv[1], &g, &info);
    if (rc == KIRI_OK) {
        rc = kiri_tokenizer_init(g, &t, &info);
        kiri_gguf_close(g);
    }
    if (rc != KIRI_OK) {
        fprintf(stderr, "%s: %s (%s)\n", argv[1], info.message, info.field);
        return 1;
    }
    size_t len;
    char *in;
    if (kiri_platform_read_file(argv[2], (size_t)1 << 30, &in, &len, &info) != KIRI_OK) {
        fprintf(stderr, "%s: %s\n", argv[2], info.message);
        kiri_tokenizer_free(t);
        return 1;
    }
    printf("%s %s %d %d\n", kiri_tokenizer_model_name(t), kiri_tokenizer_pre_name(t),
           kiri_tokenizer_add_bos(t), kiri_tokenizer_bos(t));
    const char *p = in, *end = in + len;
    while (p < end && rc == 0) {
        const char *q = memmem(p, (size_t)(end - p), SEP, sizeof SEP - 1);
        if (!q)
            break;
        rc = run_text(t, p, (size_t)(q - p));
        p = q + sizeof SEP - 1;
    }
    kiri_mem_free(in);
    kiri_tokenizer_free(t);
    if (rc != 0)
        fprintf(stderr, "encode failed: %s\n", kiri_status_name(rc));
    return rc != 0;
}
