/* A small command-line front end to the reference quantization kernels, for tests/test_dequant.py:
 *   quant_tool dequant TYPE < raw blocks > f32 values
 *   quant_tool quant TYPE   < f32 values > raw blocks
 * TYPE is a GGUF type name (F32, F16, BF16, Q4_0, ..., Q6_K, Q8_K). Links kernels/cpu/quants.c only.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../kernels/cpu/cpu_kernels.h"

static int type_by_name(const char *name)
{
    for (int t = 0; t < KIRI_TYPE_COUNT; t++)
        if (kiri_type_size(t) && strcmp(kiri_type_name(t), name) == 0)
            return t;
    return -1;
}

/* Reads all of stdin into a malloc'd buffer; returns NULL on failure. */
static unsigned char *read_all(size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    unsigned char *buf = malloc(cap);
    if (!buf)
        return NULL;
    for (;;) {
        if (n == cap) {
            unsigned char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(stdin)) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "dequant") != 0 && strcmp(argv[1], "quant") != 0)) {
        fprintf(stderr, "usage: %s dequant|quant TYPE < input > output\n", argv[0]);
        return 2;
    }
    const int type = type_by_name(argv[2]);
    if (type < 0) {
        fprintf(stderr, "quant_tool: unknown type %s\n", argv[2]);
        return 2;
    }
    const int64_t bs = kiri_type_block_size(type);
    const size_t ts = kiri_type_size(type);
    size_t len = 0;
    unsigned char *in = read_all(&len);
    if (!in) {
        fprintf(stderr, "quant_tool: cannot read input\n");
        return 1;
    }
    int rc = 0;
    void *out = NULL;
    size_t out_len = 0;
    if (strcmp(argv[1], "dequant") == 0) {
        if (len % ts != 0) {
            fprintf(stderr, "quant_tool: %zu bytes is not a whole number of %s blocks\n", len, argv[2]);
            rc = 1;
            goto done;
        }
        const int64_t n = (int64_t)(len / ts) * bs;
        out_len = (size_t)n * sizeof(float);
        out = malloc(out_len ? out_len : 1);
        if (!out) {
            rc = 1;
            goto done;
        }
        if (type == KIRI_TYPE_Q8_K) { /* not a weight type: d is a float, qs scale directly */
            const struct kiri_block_q8_K *b = (const void *)in;
            float *y = out;
            for (int64_t i = 0; i < n; i++)
                y[i] = b[i / KIRI_QK_K].d * (float)b[i / KIRI_QK_K].qs[i % KIRI_QK_K];
        } else {
            kiri_cpu_dequantize_row(type, in, out, n);
        }
    } else {
        if (len % (sizeof(float) * (size_t)bs) != 0) {
            fprintf(stderr, "quant_tool: input is not a whole number of %s blocks of f32\n", argv[2]);
            rc = 1;
            goto done;
        }
        const int64_t n = (int64_t)(len / sizeof(float));
        out_len = (size_t)(n / bs) * ts;
        out = malloc(out_len ? out_len : 1);
        float *x = malloc(len ? len : 1);
        if (!out || !x) {
            free(x);
            rc = 1;
            goto done;
        }
        memcpy(x, in, len);
        if (n > 0 && kiri_cpu_quantize_row(type, x, out, n) != out_len) {
            fprintf(stderr, "quant_tool: cannot quantize to %s\n", argv[2]);
            free(x);
            rc = 1;
            goto done;
        }
        free(x);
    }
    if (out_len && fwrite(out, 1, out_len, stdout) != out_len) {
        fprintf(stderr, "quant_tool: write failed\n");
        rc = 1;
    }
done:
    free(out);
    free(in);
    return rc;
}
