/* Reading and writing GGUF files (v2 and v3). The reader maps the file read-only and private and
 * validates every header field, metadata value and tensor descriptor against the file size with
 * overflow-checked arithmetic before anything is allocated for it; errors name the field and its
 * byte offset. Tensor data is used in place from the mapping.
 *
 * Invariants of an open struct kiri_gguf:
 * - every key is unique, valid UTF-8 without NUL, 1..256 bytes;
 * - every string value and string-array element lies inside the mapping and is at most 16 MiB;
 * - every numeric array's bytes lie inside the mapping; arrays are never nested;
 * - every tensor has a unique valid name (< 64 bytes), 1..4 dimensions each >= 1, a known type,
 *   ne[0] a multiple of its block size, and data [data, data + size) inside the mapping at the
 *   expected aligned offset.
 */
#ifndef KIRI_GGUF_H
#define KIRI_GGUF_H

#include <stddef.h>
#include <stdint.h>

struct kiri_status_info;

enum kiri_gguf_type {
    KIRI_GGUF_UINT8 = 0,
    KIRI_GGUF_INT8 = 1,
    KIRI_GGUF_UINT16 = 2,
    KIRI_GGUF_INT16 = 3,
    KIRI_GGUF_UINT32 = 4,
    KIRI_GGUF_INT32 = 5,
    KIRI_GGUF_FLOAT32 = 6,
    KIRI_GGUF_BOOL = 7,
    KIRI_GGUF_STRING = 8,
    KIRI_GGUF_ARRAY = 9,
    KIRI_GGUF_UINT64 = 10,
    KIRI_GGUF_INT64 = 11,
    KIRI_GGUF_FLOAT64 = 12,
    KIRI_GGUF_TYPE_COUNT
};

#define KIRI_GGUF_MAX_KEY 256
#define KIRI_GGUF_MAX_STRING (16u << 20)
#define KIRI_GGUF_MAX_NAME 64 /* tensor names are shorter than this */
#define KIRI_GGUF_DEFAULT_ALIGNMENT 32

/* A string inside the mapping: not NUL-terminated. */
struct kiri_gguf_str {
    const char *ptr;   /* mapped */
    uint64_t len;
};

struct kiri_gguf;

struct kiri_gguf_tensor {
    const char *name;      /* owned by the kiri_gguf, NUL-terminated */
    int type;              /* enum kiri_type */
    int n_dims;
    int64_t ne[4];         /* unused dimensions are 1 */
    uint64_t offset;       /* relative to the data section */
    size_t size;           /* bytes */
    const void *data;      /* mapped */
};

/* Opens and validates a file. On success *out owns the mapping until kiri_gguf_close. */
int kiri_gguf_open(const char *path, struct kiri_gguf **out, struct kiri_status_info *info);
/* Validates a file already in memory (borrowed: must outlive the result). For fuzzing and tests. */
int kiri_gguf_open_memory(const void *data, size_t size, struct kiri_gguf **out,
                          struct kiri_status_info *info);
void kiri_gguf_close(struct kiri_gguf *g);

uint32_t kiri_gguf_version(const struct kiri_gguf *g);
size_t kiri_gguf_file_size(const struct kiri_gguf *g);
const void *kiri_gguf_base(const struct kiri_gguf *g);    /* start of the mapping */
size_t kiri_gguf_alignment(const struct kiri_gguf *g);

/* ---- metadata ---- */
int64_t kiri_gguf_n_kv(const struct kiri_gguf *g);
int64_t kiri_gguf_find_key(const struct kiri_gguf *g, const char *key);   /* index or -1 */
const char *kiri_gguf_key(const struct kiri_gguf *g, int64_t i);
int kiri_gguf_kv_type(const struct kiri_gguf *g, int64_t i);               /* enum kiri_gguf_type */
uint64_t kiri_gguf_kv_offset(const struct kiri_gguf *g, int64_t i);        /* byte offset of the pair */

/* Typed getters by key. They return KIRI_OK, or KIRI_E_MODEL_INVALID naming the key when it is
 * missing (only when required is set; otherwise they return 1 and leave *out untouched) or has a
 * type that cannot represent the result: integer getters accept any integer type whose value fits,
 * float getters accept FLOAT32/FLOAT64, and reject NaN and infinities. */
int kiri_gguf_get_u32(const struct kiri_gguf *g, const char *key, int required, uint32_t *out,
                      struct kiri_status_info *info);
int kiri_gguf_get_i32(const struct kiri_gguf *g, const char *key, int required, int32_t *out,
                      struct kiri_status_info *info);
int kiri_gguf_get_f32(const struct kiri_gguf *g, const char *key, int required, float *out,
                      struct kiri_status_info *info);
int kiri_gguf_get_bool(const struct kiri_gguf *g, const char *key, int required, int *out,
                       struct kiri_status_info *info);
int kiri_gguf_get_str(const struct kiri_gguf *g, const char *key, int required,
                      struct kiri_gguf_str *out, struct kiri_status_info *info);

/* Arrays: element type and count; for numeric element types a pointer to the packed little-endian
 * elements in the mapping (may be unaligned: read with memcpy); string elements by index. */
int kiri_gguf_get_arr(const struct kiri_gguf *g, const char *key, int required, int *elem_type,
                      uint64_t *n, const void **data, struct kiri_status_info *info);
/* The i-th element of a string array (the key must be a string array, i < n). */
struct kiri_gguf_str kiri_gguf_arr_str(const struct kiri_gguf *g, int64_t kv_index, uint64_t i);

/* ---- tensors ---- */
int64_t kiri_gguf_n_tensors(const struct kiri_gguf *g);
const struct kiri_gguf_tensor *kiri_gguf_tensor(const struct kiri_gguf *g, int64_t i);
const struct kiri_gguf_tensor *kiri_gguf_find_tensor(const struct kiri_gguf *g, const char *name);

/* ---- writing ----
 * A writer collects metadata and tensor descriptors, then streams tensor data in the order the
 * tensors were added, to `path.partial`, which finish fsyncs and renames onto path (so a reader
 * never maps a half-written file). Aborting or failing removes the partial file. */
struct kiri_gguf_writer;

int kiri_gguf_writer_init(struct kiri_gguf_writer **out);
void kiri_gguf_writer_free(struct kiri_gguf_writer *w);   /* also aborts an unfinished file */
/* Copies metadata pair i of a reader (any type, arrays included). */
int kiri_gguf_writer_copy_kv(struct kiri_gguf_writer *w, const struct kiri_gguf *g, int64_t i);
int kiri_gguf_writer_set_u32(struct kiri_gguf_writer *w, const char *key, uint32_t v);
int kiri_gguf_writer_set_str(struct kiri_gguf_writer *w, const char *key, const char *v);
/* Declares a tensor; its size follows from type and shape. */
int kiri_gguf_writer_add_tensor(struct kiri_gguf_writer *w, const char *name, int type, int n_dims,
                                const int64_t *ne);
/* Writes header and tensor table to path.partial. */
int kiri_gguf_writer_begin(struct kiri_gguf_writer *w, const char *path, struct kiri_status_info *info);
/* Appends the next tensor's data (size must equal its declared size). */
int kiri_gguf_writer_write_tensor(struct kiri_gguf_writer *w, const void *data, size_t size,
                                  struct kiri_status_info *info);
/* Pads, fsyncs, renames path.partial to path and fsyncs the directory. */
int kiri_gguf_writer_finish(struct kiri_gguf_writer *w, struct kiri_status_info *info);

#endif
