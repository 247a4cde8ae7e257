/* libFuzzer target for the GGUF reader: parse the input as a whole file, and when it is accepted,
 * read everything a consumer could reach through the API (every pair with every getter, every
 * string-array element, every tensor's bytes), so a bad pointer or length shows up under ASan.
 *
 * Build: clang -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined -Iruntime tests/fuzz/fuzz_gguf.c \
 *        runtime/gguf.c base/error.c base/mem.c base/platform_posix.c -lm -o fuzz_gguf
 *        (or cmake -DKIRI_FUZZ=ON with clang)
 * Run:   ./fuzz_gguf -max_total_time=120 corpus/ tests/fuzz/seeds/gguf/
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gguf.h"
#include "kiri.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Sinks the bytes read so the compiler cannot drop the reads. */
static volatile unsigned sink;

static void touch(const void *p, uint64_t n)
{
    unsigned s = 0;
    for (uint64_t i = 0; i < n; i++)
        s += ((const uint8_t *)p)[i];
    sink += s;
}

static void touch_all(const struct kiri_gguf *g)
{
    static const size_t elem_size[KIRI_GGUF_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
    struct kiri_status_info info;
    sink += kiri_gguf_version(g) + (unsigned)kiri_gguf_alignment(g);
    sink += (unsigned)kiri_gguf_file_size(g);
    touch(kiri_gguf_base(g), kiri_gguf_file_size(g) < 24 ? kiri_gguf_file_size(g) : 24);
    for (int64_t i = 0; i < kiri_gguf_n_kv(g); i++) {
        const char *k = kiri_gguf_key(g, i);
        if (!k || kiri_gguf_find_key(g, k) != i)
            abort();   /* every key must be found at its own index */
        touch(k, strlen(k));
        sink += (unsigned)kiri_gguf_kv_type(g, i) + (unsigned)kiri_gguf_kv_offset(g, i);
        uint32_t u;
        int32_t s;
        float f;
        int b, et;
        uint64_t n;
        const void *p;
        struct kiri_gguf_str str;
        if (kiri_gguf_get_u32(g, k, 1, &u, &info) == 0)
            sink += u;
        if (kiri_gguf_get_i32(g, k, 0, &s, &info) == 0)
            sink += (unsigned)s;
        if (kiri_gguf_get_f32(g, k, 1, &f, &info) == 0)
            sink += (unsigned)(f > 0);
        if (kiri_gguf_get_bool(g, k, 1, &b, &info) == 0)
            sink += (unsigned)b;
        if (kiri_gguf_get_str(g, k, 1, &str, &info) == 0)
            touch(str.ptr, str.len);
        if (kiri_gguf_get_arr(g, k, 1, &et, &n, &p, &info) == 0) {
            if (et == KIRI_GGUF_STRING) {
                for (uint64_t j = 0; j < n; j++) {
                    str = kiri_gguf_arr_str(g, i, j);
                    if (!str.ptr)
                        abort();
                    touch(str.ptr, str.len);
                }
            } else if (et >= 0 && et < KIRI_GGUF_TYPE_COUNT) {
                touch(p, n * elem_size[et]);
            } else {
                abort();
            }
        }
    }
    for (int64_t i = 0; i < kiri_gguf_n_tensors(g); i++) {
        const struct kiri_gguf_tensor *t = kiri_gguf_tensor(g, i);
        if (!t || kiri_gguf_find_tensor(g, t->name) != t)
            abort();
        touch(t->name, strlen(t->name));
        touch(t->data, t->size);
    }
    sink += kiri_gguf_find_key(g, "general.architecture") >= 0;
    sink += kiri_gguf_find_tensor(g, "token_embd.weight") != NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kiri_gguf *g = NULL;
    struct kiri_status_info info;
    /* An exact-size copy so any read past the end is caught even when libFuzzer's buffer is not. */
    uint8_t *copy = malloc(size ? size : 1);
    if (!copy)
        return 0;
    if (size)
        memcpy(copy, data, size);
    int rc = kiri_gguf_open_memory(copy, size, &g, &info);
    if (rc == KIRI_OK) {
        touch_all(g);
        kiri_gguf_close(g);
    } else if (rc != KIRI_E_MODEL_INVALID && rc != KIRI_E_NOMEM) {
        abort();
    } else if (rc == KIRI_E_MODEL_INVALID && (!info.message[0] || !info.field[0])) {
        abort();   /* every rejection names a field and says why */
    }
    free(copy);
    return 0;
}
