/* Measures this machine's memory read bandwidth: the ceiling for decoding, which reads every
 * weight once per token. Each of T threads streams through its own share of one buffer much larger
 * than the last-level cache and sums it (the sum is printed so the reads cannot be dropped); the
 * best pass of several is reported, since other load on the machine only ever makes a pass slower.
 *
 * With -f FILE it streams a read-only shared mapping of FILE instead (a model, which decoding
 * reads through such a mapping of the page cache): the rate at which this machine reads those very
 * pages, whatever their placement and page sizes. The file is read once before the passes, so the
 * passes find it in the page cache.
 *
 * Build: cc -O2 -pthread bench/membw.c -o membw
 * Usage: membw [MiB (default 1024)] [passes (default 7)] [threads ... (default 1 2)]
 *        membw -f FILE [passes (default 7)] [threads ...]
 * Output: one line per thread count, "threads=T best_gbps=X median_gbps=Y" (GB = 1e9 bytes). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#endif

/* ---------------------------------------------------------------------------------------------
 * Streaming read kernels
 * ------------------------------------------------------------------------------------------- */

/* Portable: four independent sums so the loads are not serialised behind one add chain. */
static uint64_t sum_plain(const uint64_t *p, size_t n)
{
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= n; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
    }
    return a + b + c + d;
}

#ifdef HAVE_AVX2_PATH
/* 32-byte loads, 4 accumulators, 128 bytes (two cache lines) per iteration. n is a multiple of 16. */
__attribute__((target("avx2"))) static uint64_t sum_avx2(const uint64_t *p, size_t n)
{
    __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
    for (size_t i = 0; i + 16 <= n; i += 16) {
        a = _mm256_add_epi64(a, _mm256_load_si256((const __m256i *)(p + i)));
        b = _mm256_add_epi64(b, _mm256_load_si256((const __m256i *)(p + i + 4)));
        c = _mm256_add_epi64(c, _mm256_load_si256((const __m256i *)(p + i + 8)));
        d = _mm256_add_epi64(d, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    a = _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}
#endif

/* ---------------------------------------------------------------------------------------------
 * Threads
 * ------------------------------------------------------------------------------------------- */

struct job {
    const uint64_t *p; /* borrowed: this thread's share of the buffer */
    size_t n;          /* words in the share, a multiple of 16 */
    int avx2;
    pthread_barrier_t *start;
    uint64_t sum;
    double t0, t1; /* when this thread began and ended its share */
};

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *run_job(void *arg)
{
    struct job *j = arg;
    pthread_barrier_wait(j->start);
    j->t0 = now();
#ifdef HAVE_AVX2_PATH
    if (j->avx2)
        j->sum = sum_avx2(j->p, j->n);
    else
#endif
        j->sum = sum_plain(j->p, j->n);
    j->t1 = now();
    return NULL;
}

/* One pass over the whole buffer with t threads; returns seconds from the first thread's start to
 * the last one's end. The threads time themselves: with as many threads as cores, the main thread
 * may not run again until a worker is done, so its own clock would start late and a pass would
 * look faster than it was (64 MiB passes of 2 threads on 2 cores read as 100-90000 GB/s). */
static double pass(const uint64_t *buf, size_t n_words, int t, int avx2, uint64_t *sum)
{
    pthread_t th[64];
    struct job jobs[64];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)t + 1);
    const size_t share = n_words / (size_t)t / 16 * 16;
    for (int i = 0; i < t; i++) {
        jobs[i] = (struct job){buf + (size_t)i * share, share, avx2, &start, 0, 0.0, 0.0};
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    pthread_barrier_wait(&start);
    double t0 = 0.0, t1 = 0.0;
    for (int i = 0; i < t; i++) {
        pthread_join(th[i], NULL);
        *sum += jobs[i].sum;
        t0 = i == 0 || jobs[i].t0 < t0 ? jobs[i].t0 : t0;
        t1 = jobs[i].t1 > t1 ? jobs[i].t1 : t1;
    }
    pthread_barrier_destroy(&start);
    return t1 - t0;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* A read-only mapping of the file at path, its size a multiple of 128 bytes (the tail past it is
 * not read); NULL with a message on failure. */
static const uint64_t *map_file(const char *path, size_t *n_words)
{
    const int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size < (off_t)(64 << 20)) {
        fprintf(stderr, "membw: cannot open %s, or it is under 64 MiB\n", path);
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p == MAP_FAILED) {
        fprintf(stderr, "membw: cannot map %s\n", path);
        return NULL;
    }
    *n_words = (size_t)st.st_size / 128 * 16;
    return p;
}

int main(int argc, char **argv)
{
    const char *file = NULL;
    if (argc > 2 && strcmp(argv[1], "-f") == 0) {
        file = argv[2];
        argv += 1; /* argv[1] is now the file: the passes and threads follow as below */
        argc -= 1;
    }
    const size_t mib = file ? 0 : argc > 1 ? (size_t)strtoul(argv[1], NULL, 10) : 1024;
    const int passes = argc > 2 ? atoi(argv[2]) : 7;
    int threads[16] = {1, 2}, n_threads = 2;
    if (argc > 3) {
        n_threads = 0;
        for (int i = 3; i < argc && n_threads < 16; i++)
            threads[n_threads++] = atoi(argv[i]);
    }
    if ((!file && mib < 64) || passes < 1 || passes > 100) {
        fprintf(stderr, "usage: membw [MiB >= 64] [passes 1..100] [threads ...]\n"
                        "       membw -f FILE [passes 1..100] [threads ...]\n");
        return 2;
    }
    size_t n_words = (mib << 20) / sizeof(uint64_t);
    uint64_t *own = NULL;
    const uint64_t *buf;
    if (file) {
        buf = map_file(file, &n_words);
        if (!buf)
            return 1;
    } else {
        own = aligned_alloc(4096, n_words * sizeof(uint64_t));
        if (!own) {
            fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib);
            return 1;
        }
        /* Touch every page with non-zero data so no pass reads the shared zero page. */
        for (size_t i = 0; i < n_words; i++)
            own[i] = i * 0x9E3779B97F4A7C15ull;
        buf = own;
    }

    int avx2 = 0;
#ifdef HAVE_AVX2_PATH
    __builtin_cpu_init();
    avx2 = __builtin_cpu_supports("avx2");
#endif
    printf("buffer_mib=%zu passes=%d kernel=%s%s%s\n", n_words * sizeof(uint64_t) >> 20, passes,
           avx2 ? "avx2" : "plain", file ? " file=" : "", file ? file : "");
    uint64_t sum = 0;
    if (file)
        pass(buf, n_words, 1, avx2, &sum); /* into the page cache, before any warm-up */
    for (int k = 0; k < n_threads; k++) {
        const int t = threads[k];
        if (t < 1 || t > 64)
            continue;
        double secs[100];
        pass(buf, n_words, t, avx2, &sum); /* warm-up */
        for (int i = 0; i < passes; i++)
            secs[i] = pass(buf, n_words, t, avx2, &sum);
        qsort(secs, (size_t)passes, sizeof secs[0], cmp_double);
        const double read = (double)(n_words / (size_t)t / 16 * 16 * (size_t)t * sizeof(uint64_t));
        printf("threads=%d best_gbps=%.2f median_gbps=%.2f\n", t, read / secs[0] * 1e-9,
               read / secs[passes / 2] * 1e-9);
    }
    fprintf(stderr, "membw: checksum %llx\n", (unsigned long long)sum);
    if (file)
        munmap((void *)buf, n_words * sizeof(uint64_t));
    free(own);
    return 0;
}
