/* The CUDA backend: implements the backend interface with the kernels of this folder (one .cu per
 * group of kernels, compiled by nvcc for sm_80, sm_87, sm_90, sm_110 and PTX; cmake/cuda.cmake).
 * The CUDA runtime is linked statically and finds the driver (libcuda.so.1) at run time, so a
 * binary built with this backend still runs where there is no NVIDIA driver: the probe says why
 * and the next backend is taken.
 *
 * How it works:
 * - Scratch and cache buffers are device memory (cudaMalloc), never host-visible: the runtime
 *   moves step inputs and logits with tensor_set / tensor_get.
 * - Weights: on a discrete GPU weight_prepare copies each weight into device memory. On an
 *   integrated GPU (Jetson: the GPU shares DRAM with the CPU) the weights stay where they are, in
 *   the model's file mapping: the first step page-locks the mapped ranges (cudaHostRegister,
 *   read-only and mapped; adjacent weights become one range, so a GGUF file is a single
 *   registration) and the kernels read them through the device addresses of those ranges. A
 *   model that fits in memory once then runs, with no second copy. If registration fails the
 *   weights are copied after all, and describe says so. KIRI_CUDA_WEIGHTS=copy or =map overrides
 *   the choice (map on a discrete GPU reads the weights over the bus: for tests).
 * - compute enqueues one or more kernels per node on the backend's stream and returns;
 *   synchronize waits. Products convert the activations first (cuda_kernels.h); consecutive
 *   products over the same rows (q/k/v, gate/up) share one conversion until a node writes those
 *   rows.
 * - The recurrent state of the hybrid models (SHORT_CONV windows, DELTA_NET matrices) lives in
 *   this backend's buffers, one row per sequence, as the KV cache does; the kernels update the
 *   rows in place (recurrent.cu).
 * - Every entry point selects the backend's device first: the runtime may call from any thread.
 */
#include <cuda_runtime_api.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../runtime/backend.h"
#include "cuda_kernels.h"

/* Rounding of registered ranges: the host page size on Linux/aarch64 and x86-64 systems the
 * backend targets (JetPack uses 4 KiB pages). A range that fails to register is copied. */
#define REG_PAGE ((uintptr_t)4096)

struct kiri_buffer {
    void *dev;     /* owned device memory */
    size_t size;
};

/* A page-locked range of host memory holding mapped weights. */
struct reg {
    uintptr_t lo, hi;  /* page-aligned [lo, hi) */
    char *dev;         /* device address of lo */
    int users;         /* weights that point into it */
};

/* A prepared weight (t->extra). */
struct cu_weight {
    const char *host;  /* mapped: the weight's bytes in the file mapping */
    size_t bytes;
    char *dev;         /* device address of the bytes: owned copy, or inside a registration */
    int owned;         /* dev is our cudaMalloc copy */
    int reg;           /* index of its registration, or -1 */
};

struct kiri_backend {
    int device;
    struct cudaDeviceProp props;
    cudaStream_t stream;
    int map_weights;             /* use mapped weights in place (integrated GPU or forced) */
    int failed;                  /* a CUDA call failed: the context is unusable */
    char weights_note[48];       /* how the weights ended up, for describe */

    struct cu_weight **pending;  /* owned array of borrowed entries: weights awaiting registration */
    int n_pending, cap_pending;
    struct reg *regs;            /* owned, n_regs entries (users == 0: free slot) */
    int n_regs, cap_regs;
    size_t mapped_bytes, copied_bytes;

    void *act;                   /* owned device buffer of converted activations */
    size_t act_cap;
    /* The rows act holds converted: source range, format, values per row, rows. */
    const char *act_lo, *act_hi;
    int act_format, act_valid;
    int64_t act_k, act_n;
};

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

/* The device address of a tensor's element 0, or NULL when the device cannot see it. */
static char *dev_ptr(const struct kiri_tensor *t)
{
    if (t->extra)
        return ((const struct cu_weight *)t->extra)->dev;
    if (t->buffer)
        return (char *)t->buffer->dev + t->offset;
    return NULL;
}

/* The device address of the state rows a recurrent op's tokens read (runtime/backend.h). */
static const int32_t *state_rows_read(const struct kiri_tensor *rows)
{
    char *p = dev_ptr(rows);
    return p ? (const int32_t *)(p + kiri_state_rows_read_offset(rows)) : NULL;
}

static int weight_type_ok(int type) { return kiri_cuda_act_format(type) >= 0; }

static int set_device(struct kiri_backend *be)
{
    if (be->failed || cudaSetDevice(be->device) != cudaSuccess) {
        be->failed = 1;
        return -1;
    }
    return 0;
}

static int ok(struct kiri_backend *be, int err)
{
    if (err != 0)
        be->failed = 1;
    return err == 0 ? 0 : -1;
}

/* ---------------------------------------------------------------------------------------------
 * Probe and init
 * ------------------------------------------------------------------------------------------- */

static const char *kind(const struct cudaDeviceProp *p) { return p->integrated ? "integrated" : "discrete"; }

/* Finds the driver and device cfg->device; 0 on success, else a reason in msg. */
static int find_device(const struct kiri_backend_config *cfg, struct cudaDeviceProp *props, char *msg, size_t cap)
{
    /* The CUDA runtime opens the driver itself; asking first gives the plainest reason. */
    if (cfg->dl_open && !cfg->dl_open("libcuda.so.1")) {
        snprintf(msg, cap, "no CUDA driver (libcuda.so.1 not found)");
        return -1;
    }
    int n = 0;
    const cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        snprintf(msg, cap, "no CUDA driver (%.100s)", cudaGetErrorString(e));
        return -1;
    }
    if (cfg->device < 0 || cfg->device >= n) {
        snprintf(msg, cap, "no CUDA device %d (%d found)", cfg->device, n);
        return -1;
    }
    if (cudaGetDeviceProperties(props, cfg->device) != cudaSuccess) {
        snprintf(msg, cap, "cannot read the properties of CUDA device %d", cfg->device);
        return -1;
    }
    if (props->major < 8) {
        snprintf(msg, cap, "%.64s is sm_%d%d; this build needs sm_80 or newer", props->name, props->major,
                 props->minor);
        return -1;
    }
    return 0;
}

static int cu_probe(const struct kiri_backend_config *cfg, char *msg, size_t cap)
{
    struct cudaDeviceProp props;
    if (cap)
        msg[0] = '\0';
    if (find_device(cfg, &props, msg, cap) != 0)
        return 0;
    snprintf(msg, cap, "%.96s (sm_%d%d, %s)", props.name, props.major, props.minor, kind(&props));
    /* Ahead of Vulkan on the same GPU (300 discrete, 200 integrated). */
    return props.integrated ? 350 : 400;
}

static void release_regs(struct kiri_backend *be)
{
    for (int i = 0; i < be->n_regs; i++)
        if (be->regs[i].users > 0)
            cudaHostUnregister((void *)be->regs[i].lo);
    free(be->regs);
    be->regs = NULL;
    be->n_regs = be->cap_regs = 0;
}

static void cu_free(struct kiri_backend *be)
{
    if (!be)
        return;
    cudaSetDevice(be->device);
    if (be->stream) {
        cudaStreamSynchronize(be->stream);
        cudaStreamDestroy(be->stream);
    }
    cudaFree(be->act);
    release_regs(be);
    free(be->pending);
    free(be);
}

static int cu_init(const struct kiri_backend_config *cfg, struct kiri_backend **out, char *msg, size_t cap)
{
    struct kiri_backend *be = calloc(1, sizeof *be);
    if (!be) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    if (find_device(cfg, &be->props, msg, cap) != 0) {
        free(be);
        return -1;
    }
    be->device = cfg->device;
    int err = cudaSetDevice(be->device);
    if (err == cudaSuccess)
        err = kiri_cuda_check_image();
    if (err == cudaSuccess)
        err = cudaStreamCreateWithFlags(&be->stream, cudaStreamNonBlocking);
    if (err != cudaSuccess) {
        snprintf(msg, cap, "%.64s: %.96s", be->props.name, cudaGetErrorString((cudaError_t)err));
        be->stream = NULL;
        cu_free(be);
        return -1;
    }
    const char *w = getenv("KIRI_CUDA_WEIGHTS");
    be->map_weights = w && strcmp(w, "map") == 0 ? 1 : w && strcmp(w, "copy") == 0 ? 0 : be->props.integrated;
    snprintf(be->weights_note, sizeof be->weights_note, "%s",
             be->map_weights ? "weights in place (unified memory)" : "weights copied to device memory");
    *out = be;
    return 0;
}

/* Device name, architecture, memory, and where the weights live, with their size once prepared
 * (the runtime keeps 96 bytes; it describes the backend before the model's weights are prepared,
 * and `kiri info -m` prints the memory the model needs beside it). */
static void cu_describe(struct kiri_backend *be, char *buf, size_t cap)
{
    const double mib = 1024.0 * 1024.0, bytes = (double)(be->copied_bytes + be->mapped_bytes);
    char size[32] = "";
    if (bytes > 0)
        snprintf(size, sizeof size, ", %.0f MiB", bytes / mib);
    snprintf(buf, cap, "%.32s, sm_%d%d, %s, %.1f GiB: %s%s", be->props.name, be->props.major, be->props.minor,
             kind(&be->props), (double)be->props.totalGlobalMem / (1024.0 * mib), be->weights_note, size);
}

/* ---------------------------------------------------------------------------------------------
 * Buffers and copies
 * ------------------------------------------------------------------------------------------- */

/* Buffers may be allocated and freed while another thread runs a step (the runtime serializes
 * steps and copies, not allocation); cudaMalloc and cudaFree are safe for that. Memory starts
 * zeroed, as the CPU backend's does. */
static int cu_buffer_alloc(struct kiri_backend *be, size_t size, struct kiri_buffer **out, void **host)
{
    if (set_device(be) != 0)
        return -1;
    struct kiri_buffer *b = calloc(1, sizeof *b);
    if (!b)
        return -1;
    b->size = size ? size : 4;
    /* On the backend's stream, so no kernel of it can run before the memory is zeroed. */
    if (cudaMalloc(&b->dev, b->size) != cudaSuccess || cudaMemsetAsync(b->dev, 0, b->size, be->stream) != cudaSuccess) {
        cudaFree(b->dev);
        cudaGetLastError(); /* an allocation failure leaves the context usable */
        free(b);
        return -1;
    }
    *out = b;
    *host = NULL;
    return 0;
}

static void cu_buffer_free(struct kiri_backend *be, struct kiri_buffer *b)
{
    if (!b)
        return;
    cudaSetDevice(be->device);
    cudaFree(b->dev);
    free(b);
}

static int cu_tensor_set(struct kiri_backend *be, struct kiri_tensor *t, const void *src, size_t off, size_t size)
{
    char *d = dev_ptr(t);
    if (!d || set_device(be) != 0 || (t->buffer && t->offset + off + size > t->buffer->size))
        return -1;
    if (size == 0)
        return 0;
    /* From pageable memory the copy returns once src has been read, so src may change after. */
    return ok(be, cudaMemcpyAsync(d + off, src, size, cudaMemcpyHostToDevice, be->stream));
}

static int cu_tensor_get(struct kiri_backend *be, const struct kiri_tensor *t, void *dst, size_t off, size_t size)
{
    const char *d = dev_ptr(t);
    if (!d || set_device(be) != 0 || (t->buffer && t->offset + off + size > t->buffer->size))
        return -1;
    if (size == 0)
        return 0;
    if (ok(be, cudaMemcpyAsync(dst, d + off, size, cudaMemcpyDeviceToHost, be->stream)) != 0)
        return -1;
    return ok(be, cudaStreamSynchronize(be->stream));
}

/* ---------------------------------------------------------------------------------------------
 * Weights
 * ------------------------------------------------------------------------------------------- */

static int copy_weight(struct kiri_backend *be, struct cu_weight *w)
{
    if (cudaMalloc((void **)&w->dev, w->bytes) != cudaSuccess) {
        cudaGetLastError();
        w->dev = NULL;
        return -1;
    }
    /* On the backend's stream: from pageable memory the call returns once the source is read, and
     * the kernels that read the copy come after it on the stream. */
    if (cudaMemcpyAsync(w->dev, w->host, w->bytes, cudaMemcpyHostToDevice, be->stream) != cudaSuccess) {
        cudaFree(w->dev);
        w->dev = NULL;
        return -1;
    }
    w->owned = 1;
    be->copied_bytes += w->bytes;
    return 0;
}

static int cu_weight_prepare(struct kiri_backend *be, struct kiri_tensor *t, char *msg, size_t cap)
{
    if (!weight_type_ok(t->type)) {
        snprintf(msg, cap, "type %s is not supported by the CUDA backend", kiri_type_name(t->type));
        return -1;
    }
    const size_t row = kiri_row_bytes(t->type, t->ne[0]);
    if (t->ne[2] != 1 || t->ne[3] != 1 || t->nb[1] != row || row == 0 || !t->data) {
        snprintf(msg, cap, "only contiguous 1-D and 2-D weights can be used");
        return -1;
    }
    if (set_device(be) != 0) {
        snprintf(msg, cap, "the device failed");
        return -1;
    }
    struct cu_weight *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(msg, cap, "out of memory");
        return -1;
    }
    w->host = t->data;
    w->bytes = row * (size_t)t->ne[1];
    w->reg = -1;
    /* The kernels read some blocks as 32-bit words: mapped weights must be 4-byte aligned (GGUF
     * aligns tensor data to 32 bytes). */
    if (be->map_weights && (uintptr_t)w->host % 4 == 0) {
        if (be->n_pending == be->cap_pending) {
            const int nc = be->cap_pending ? 2 * be->cap_pending : 64;
            struct cu_weight **p = realloc(be->pending, (size_t)nc * sizeof *p);
            if (!p) {
                free(w);
                snprintf(msg, cap, "out of memory");
                return -1;
            }
            be->pending = p;
            be->cap_pending = nc;
        }
        be->pending[be->n_pending++] = w;
    } else if (copy_weight(be, w) != 0) {
        snprintf(msg, cap, "cannot allocate %zu bytes of device memory", w->bytes);
        free(w);
        return -1;
    }
    t->extra = w;
    return 0;
}

static int by_host(const void *a, const void *b)
{
    const uintptr_t x = (uintptr_t)(*(struct cu_weight *const *)a)->host;
    const uintptr_t y = (uintptr_t)(*(struct cu_weight *const *)b)->host;
    return x < y ? -1 : x > y;
}

static int add_reg(struct kiri_backend *be, uintptr_t lo, uintptr_t hi, char **dev)
{
    if (be->n_regs == be->cap_regs) {
        const int nc = be->cap_regs ? 2 * be->cap_regs : 16;
        struct reg *r = realloc(be->regs, (size_t)nc * sizeof *r);
        if (!r)
            return -1;
        be->regs = r;
        be->cap_regs = nc;
    }
    /* Read-only is what a read-only file mapping needs; devices without it can still register
     * writable memory. */
    if (cudaHostRegister((void *)lo, (size_t)(hi - lo), cudaHostRegisterMapped | cudaHostRegisterReadOnly) != cudaSuccess) {
        cudaGetLastError();
        if (cudaHostRegister((void *)lo, (size_t)(hi - lo), cudaHostRegisterMapped) != cudaSuccess) {
            cudaGetLastError();
            return -1;
        }
    }
    void *d = NULL;
    if (cudaHostGetDevicePointer(&d, (void *)lo, 0) != cudaSuccess) {
        cudaGetLastError();
        cudaHostUnregister((void *)lo);
        return -1;
    }
    be->regs[be->n_regs] = (struct reg){lo, hi, d, 0};
    *dev = d;
    return be->n_regs++;
}

/* Registers the pending mapped weights: their page ranges sorted and merged where they touch,
 * one registration per merged range; a weight inside a live registration reuses it; a weight
 * whose range cannot be registered is copied. */
static int map_pending(struct kiri_backend *be)
{
    if (be->n_pending == 0)
        return 0;
    qsort(be->pending, (size_t)be->n_pending, sizeof *be->pending, by_host);
    int i = 0, rc = 0, failures = 0;
    while (i < be->n_pending) {
        const uintptr_t lo = (uintptr_t)be->pending[i]->host & ~(REG_PAGE - 1);
        uintptr_t hi = ((uintptr_t)be->pending[i]->host + be->pending[i]->bytes + REG_PAGE - 1) & ~(REG_PAGE - 1);
        int j = i + 1;
        while (j < be->n_pending && ((uintptr_t)be->pending[j]->host & ~(REG_PAGE - 1)) <= hi) {
            const uintptr_t e = ((uintptr_t)be->pending[j]->host + be->pending[j]->bytes + REG_PAGE - 1) & ~(REG_PAGE - 1);
            hi = e > hi ? e : hi;
            j++;
        }
        /* A live registration that covers the range, else a new one. */
        int r = -1;
        char *dev = NULL;
        for (int k = 0; k < be->n_regs && r < 0; k++)
            if (be->regs[k].users > 0 && be->regs[k].lo <= lo && hi <= be->regs[k].hi) {
                r = k;
                dev = be->regs[k].dev + (lo - be->regs[k].lo);
            }
        int overlaps = 0;
        for (int k = 0; k < be->n_regs && r < 0; k++)
            overlaps |= be->regs[k].users > 0 && be->regs[k].lo < hi && lo < be->regs[k].hi;
        if (r < 0 && !overlaps)
            r = add_reg(be, lo, hi, &dev);
        for (int k = i; k < j; k++) {
            struct cu_weight *w = be->pending[k];
            if (r >= 0) {
                w->dev = dev + ((uintptr_t)w->host - lo);
                w->reg = r;
                be->regs[r].users++;
                be->mapped_bytes += w->bytes;
            } else if (copy_weight(be, w) != 0) {
                rc = -1;
            } else {
                failures++;
            }
        }
        i = j;
    }
    be->n_pending = 0;
    if (failures)
        snprintf(be->weights_note, sizeof be->weights_note, "weights copied (mapping not registrable)");
    return rc;
}

static void cu_weight_release(struct kiri_backend *be, struct kiri_tensor *t)
{
    struct cu_weight *w = t->extra;
    if (!w)
        return;
    cudaSetDevice(be->device);
    if (be->stream)
        cudaStreamSynchronize(be->stream);
    for (int i = 0; i < be->n_pending; i++)
        if (be->pending[i] == w)
            be->pending[i--] = be->pending[--be->n_pending];
    if (w->owned) {
        cudaFree(w->dev);
        be->copied_bytes -= w->bytes;
    } else if (w->reg >= 0 && --be->regs[w->reg].users == 0) {
        cudaHostUnregister((void *)be->regs[w->reg].lo);
    }
    if (w->reg >= 0)
        be->mapped_bytes -= w->bytes;
    free(w);
    t->extra = NULL;
}

/* ---------------------------------------------------------------------------------------------
 * Nodes
 * ------------------------------------------------------------------------------------------- */

/* Every tensor of the node lives where the device sees it (a weight still pending registration
 * counts: compute registers it first). */
static int visible(const struct kiri_node *nd)
{
    if (!nd->dst->buffer)
        return 0;
    for (int i = 0; i < KIRI_OP_MAX_SRC; i++)
        if (nd->src[i] && !nd->src[i]->buffer && !nd->src[i]->extra)
            return 0;
    return 1;
}

/* The largest short-convolution kernel and delta-rule head the kernels take (they have no limit
 * of their own; these are the CPU reference's). */
#define CU_MAX_TAPS 16
#define CU_MAX_HEAD 512

/* The op, types and shapes (the runtime asks this at load, of tensors not yet placed; compute
 * also requires every tensor where the device sees it). */
static int cu_supports(struct kiri_backend *be, const struct kiri_node *nd)
{
    (void)be;
    const struct kiri_tensor *d = nd->dst, *s0 = nd->src[0], *s1 = nd->src[1];
    if (!d || !s0)
        return 0;
    int64_t rows = 0;
    switch (nd->op) {
    case KIRI_OP_GET_ROWS:
        return s1 && weight_type_ok(s0->type) && s1->type == KIRI_TYPE_I32 && d->type == KIRI_TYPE_F32 &&
               d->ne[0] == s0->ne[0] && s0->ne[0] <= 0x7fffffff;
    case KIRI_OP_MATMUL:
        return s1 && weight_type_ok(s0->type) && s1->type == KIRI_TYPE_F32 && d->type == KIRI_TYPE_F32 &&
               s1->ne[0] == s0->ne[0] && d->ne[0] == s0->ne[1] && s0->ne[0] <= 0x7fffffff &&
               kiri_tensor_flat_rows(s1, &rows) == 0 && kiri_tensor_flat_rows(d, &rows) == 0 && s0->ne[2] == 1 && s0->ne[3] == 1 &&
               (kiri_cuda_act_format(s0->type) == KIRI_CUDA_ACT_F32 || s0->ne[0] % kiri_type_block_size(s0->type) == 0);
    case KIRI_OP_RMS_NORM:
        return kiri_node_all_f32(nd, 2) && s0->ne[3] == 1;
    case KIRI_OP_ADD:
    case KIRI_OP_MUL:
    case KIRI_OP_SWIGLU:
    case KIRI_OP_GEGLU:
        return s1 && kiri_node_all_f32(nd, 2) && s1->ne[0] == s0->ne[0] && kiri_tensor_flat_rows(s0, &rows) == 0 &&
               kiri_tensor_flat_rows(s1, &rows) == 0 && kiri_tensor_flat_rows(d, &rows) == 0;
    case KIRI_OP_SCALE:
    case KIRI_OP_SOFTCAP: {
        /* (E, ne1, ne2) with strides of their own (qwen35's q / k head views): dimension 3 must be
         * 1 on both sides. */
        const float c = nd->op == KIRI_OP_SCALE ? nd->p.scale : nd->p.softcap;
        return kiri_node_all_f32(nd, 1) && d->ne[0] == s0->ne[0] && d->ne[1] == s0->ne[1] && d->ne[2] == s0->ne[2] &&
               s0->ne[3] == 1 && d->ne[3] == 1 && isfinite(c) && (nd->op == KIRI_OP_SCALE || c > 0.0f);
    }
    case KIRI_OP_ROPE:
        return kiri_node_rope_ok(nd) && s0->ne[3] == 1 && isfinite(nd->p.rope.attn_factor);
    case KIRI_OP_STORE_KV:
        return s1 && s0->type == KIRI_TYPE_F32 && s1->type == KIRI_TYPE_I32 &&
               (d->type == KIRI_TYPE_F32 || d->type == KIRI_TYPE_F16 ||
                (d->type == KIRI_TYPE_Q8_0 && s0->ne[0] % 32 == 0));
    case KIRI_OP_ATTENTION:
        return kiri_node_attention_ok(nd);
    case KIRI_OP_SHORT_CONV:
        return kiri_node_short_conv_ok(nd, CU_MAX_TAPS) && nd->src[1]->ne[2] == 1 && nd->src[1]->ne[3] == 1;
    case KIRI_OP_SIGMOID_MUL:
        return kiri_node_sigmoid_mul_ok(nd);
    case KIRI_OP_DELTA_GATES:
        return kiri_node_delta_gates_ok(nd);
    case KIRI_OP_DELTA_NET:
        return kiri_node_delta_net_ok(nd, CU_MAX_HEAD);
    default:
        return 0;
    }
}

static int run_matmul(struct kiri_backend *be, const struct kiri_node *nd)
{
    const struct kiri_tensor *w = nd->src[0], *x = nd->src[1], *y = nd->dst;
    const int act = kiri_cuda_act_format(w->type);
    int64_t n = 0;
    kiri_tensor_flat_rows(x, &n);
    const int64_t k = w->ne[0];
    const char *xs = dev_ptr(x);
    const void *a = xs;
    size_t a_stride = x->nb[1];
    if (act != KIRI_CUDA_ACT_F32) {
        const char *hi = xs + kiri_tensor_span_bytes(x);
        a_stride = kiri_cuda_act_row_bytes(act, k);
        if (!(be->act_valid && be->act_format == act && be->act_lo == xs && be->act_hi == hi && be->act_k == k &&
              be->act_n == n)) {
            if (kiri_cuda_quantize(act, (const float *)xs, x->nb[1], be->act, k, n, be->stream) != 0)
                return -1;
            be->act_valid = 1;
            be->act_format = act;
            be->act_lo = xs;
            be->act_hi = hi;
            be->act_k = k;
            be->act_n = n;
        }
        a = be->act;
    }
    return kiri_cuda_matmul(w->type, dev_ptr(w), w->nb[1], w->ne[1], a, a_stride, (float *)dev_ptr(y), y->nb[1], k, n,
                            be->stream);
}

static int run_node(struct kiri_backend *be, const struct kiri_node *nd)
{
    const struct kiri_tensor *d = nd->dst, *s0 = nd->src[0], *s1 = nd->src[1];
    int64_t rows = 0;
    switch (nd->op) {
    case KIRI_OP_GET_ROWS:
        return kiri_cuda_get_rows(s0->type, dev_ptr(s0), s0->nb[1], s0->ne[1], (const int32_t *)dev_ptr(s1), s1->ne[0],
                                  (float *)dev_ptr(d), d->nb[1], s0->ne[0], be->stream);
    case KIRI_OP_MATMUL:
        return run_matmul(be, nd);
    case KIRI_OP_RMS_NORM:
        return kiri_cuda_rms_norm((const float *)dev_ptr(s0), s0->nb[1], s0->nb[2], s1 ? (const float *)dev_ptr(s1) : NULL,
                                  (float *)dev_ptr(d), d->nb[1], d->nb[2], s0->ne[0], s0->ne[1], s0->ne[1] * s0->ne[2],
                                  nd->p.eps, be->stream);
    case KIRI_OP_ADD:
    case KIRI_OP_MUL:
    case KIRI_OP_SWIGLU:
    case KIRI_OP_GEGLU:
    case KIRI_OP_SIGMOID_MUL: {
        int64_t rows_b = 0;
        kiri_tensor_flat_rows(s0, &rows);
        kiri_tensor_flat_rows(s1, &rows_b);
        const int op = nd->op == KIRI_OP_ADD      ? 0
                       : nd->op == KIRI_OP_MUL    ? 1
                       : nd->op == KIRI_OP_SWIGLU ? 2
                       : nd->op == KIRI_OP_GEGLU  ? 3
                                                  : 4;
        return kiri_cuda_binary(op, (const float *)dev_ptr(s0), s0->nb[1], (const float *)dev_ptr(s1),
                                rows_b == 1 ? 0 : s1->nb[1], (float *)dev_ptr(d), d->nb[1], s0->ne[0], rows, be->stream);
    }
    case KIRI_OP_SCALE:
    case KIRI_OP_SOFTCAP:
        return kiri_cuda_unary(nd->op == KIRI_OP_SCALE ? 0 : 1, (const float *)dev_ptr(s0), s0->nb[1], s0->nb[2],
                               (float *)dev_ptr(d), d->nb[1], d->nb[2], s0->ne[0], s0->ne[1], s0->ne[1] * s0->ne[2],
                               nd->op == KIRI_OP_SCALE ? nd->p.scale : nd->p.softcap, be->stream);
    case KIRI_OP_ROPE: {
        const struct kiri_rope_params *rp = &nd->p.rope;
        /* As kiri_cpu_rope_token computes it, with the same C library. */
        const float theta_scale = powf(rp->freq_base, -2.0f / (float)rp->n_rot);
        return kiri_cuda_rope((float *)dev_ptr(s0), s0->nb[1], s0->nb[2], (const int32_t *)dev_ptr(s1),
                              nd->src[2] ? (const float *)dev_ptr(nd->src[2]) : NULL, s0->ne[1], s0->ne[2], rp->n_rot,
                              rp->mode == KIRI_ROPE_NEOX, theta_scale, rp->freq_scale, rp->attn_factor, be->stream);
    }
    case KIRI_OP_STORE_KV:
        return kiri_cuda_store_kv((const float *)dev_ptr(s0), s0->nb[1], (const int32_t *)dev_ptr(s1), dev_ptr(d),
                                  d->nb[1], d->type, s0->ne[0], s0->ne[1], d->ne[1], be->stream);
    case KIRI_OP_ATTENTION: {
        const struct kiri_attn_params *p = &nd->p.attn;
        const struct kiri_cuda_attention a = {
            (const float *)dev_ptr(s0), s0->nb[1], s0->nb[2], dev_ptr(s1), dev_ptr(nd->src[2]), s1->nb[1],
            nd->src[2]->nb[1], (const int32_t *)dev_ptr(nd->src[3]), (const int32_t *)dev_ptr(nd->src[4]),
            (float *)dev_ptr(d), d->nb[1], p->n_head, p->n_head_kv, p->head_dim, p->block_size, s1->type,
            s0->ne[2], s1->ne[1], p->scale, p->window,
        };
        return kiri_cuda_attention(&a, be->stream);
    }
    case KIRI_OP_SHORT_CONV: {
        const struct kiri_tensor *w = s1, *st = nd->src[2];
        const struct kiri_cuda_short_conv a = {
            (const float *)dev_ptr(s0), (const float *)dev_ptr(w), s0->nb[1], w->nb[1], (float *)dev_ptr(st),
            st->nb[1], (const int32_t *)dev_ptr(nd->src[3]), state_rows_read(nd->src[3]),
            (const int32_t *)dev_ptr(nd->src[4]), (float *)dev_ptr(d), d->nb[1], s0->ne[0], s0->ne[1], st->ne[1],
            (int)w->ne[0], nd->p.conv_silu != 0,
        };
        return kiri_cuda_short_conv(&a, be->stream);
    }
    case KIRI_OP_DELTA_GATES:
        return kiri_cuda_delta_gates((const float *)dev_ptr(s0), s0->nb[1], (const float *)dev_ptr(s1), s1->nb[1],
                                     (const float *)dev_ptr(nd->src[2]), (const float *)dev_ptr(nd->src[3]),
                                     (float *)dev_ptr(d), d->nb[1], s0->ne[0], s0->ne[1], be->stream);
    case KIRI_OP_DELTA_NET: {
        const struct kiri_delta_params *p = &nd->p.delta;
        const struct kiri_tensor *st = nd->src[2];
        const struct kiri_cuda_delta_net a = {
            (const float *)dev_ptr(s0), (const float *)dev_ptr(s1), s0->nb[1], s1->nb[1], (float *)dev_ptr(st),
            st->nb[1], (const int32_t *)dev_ptr(nd->src[3]), state_rows_read(nd->src[3]),
            (const int32_t *)dev_ptr(nd->src[4]), (float *)dev_ptr(d), d->nb[1], p->n_head_k, p->n_head_v,
            p->head_dim, s0->ne[1], st->ne[1], p->scale,
        };
        return kiri_cuda_delta_net(&a, be->stream);
    }
    default:
        return -1;
    }
}

static int cu_compute(struct kiri_backend *be, const struct kiri_node *nodes, int n_nodes)
{
    if (set_device(be) != 0 || map_pending(be) != 0)
        return -1;
    size_t act = 0;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiri_node *nd = &nodes[i];
        if (!visible(nd) || !cu_supports(be, nd))
            return -1;
        if (nd->op == KIRI_OP_MATMUL) {
            int64_t n = 0;
            kiri_tensor_flat_rows(nd->src[1], &n);
            const int f = kiri_cuda_act_format(nd->src[0]->type);
            const size_t bytes = f == KIRI_CUDA_ACT_F32 ? 0 : kiri_cuda_act_row_bytes(f, nd->src[0]->ne[0]) * (size_t)n;
            act = bytes > act ? bytes : act;
        }
    }
    if (act > be->act_cap) {
        cudaFree(be->act); /* waits for the steps that used it */
        be->act = NULL;
        be->act_cap = 0;
        if (cudaMalloc(&be->act, act) != cudaSuccess) {
            cudaGetLastError();
            be->act = NULL;
            return -1;
        }
        be->act_cap = act;
    }
    be->act_valid = 0;
    for (int i = 0; i < n_nodes; i++) {
        const struct kiri_node *nd = &nodes[i];
        if (run_node(be, nd) != 0)
            return -1; /* a launch error; a fault in a kernel shows at synchronize */
        /* A write over the converted rows makes them stale. */
        const char *lo = dev_ptr(nd->dst), *hi = lo + kiri_tensor_span_bytes(nd->dst);
        if (be->act_valid && lo < be->act_hi && be->act_lo < hi)
            be->act_valid = 0;
    }
    return 0;
}

static int cu_synchronize(struct kiri_backend *be)
{
    if (set_device(be) != 0)
        return -1;
    return ok(be, cudaStreamSynchronize(be->stream));
}

const struct kiri_backend_iface kiri_cuda_backend_iface = {
    .version = KIRI_BACKEND_VERSION,
    .name = "cuda",
    .probe = cu_probe,
    .init = cu_init,
    .free = cu_free,
    .describe = cu_describe,
    .buffer_alloc = cu_buffer_alloc,
    .buffer_free = cu_buffer_free,
    .tensor_set = cu_tensor_set,
    .tensor_get = cu_tensor_get,
    .weight_prepare = cu_weight_prepare,
    .weight_release = cu_weight_release,
    .supports = cu_supports,
    .compute = cu_compute,
    .synchronize = cu_synchronize,
};
