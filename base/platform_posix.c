/* platform.h for Linux and other POSIX systems. */
#include "platform.h"

#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

#include "cpu_features.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"

/* ---------------------------------------------------------------------------------------------
 * Files
 * ------------------------------------------------------------------------------------------- */

int kiri_platform_map_file(const char *path, struct kiri_mapping *out, struct kiri_status_info *info)
{
    size_t len = strlen(path);
    if (len >= 8 && strcmp(path + len - 8, ".partial") == 0)
        return kiri_error_set(info, KIRI_E_IO, "%s: refusing to map a partial download", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return kiri_error_set(info, KIRI_E_IO, "%s: not a regular file", path);
    }
    out->addr = NULL;
    out->size = (size_t)st.st_size;
    if (st.st_size > 0) {
        void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return kiri_error_set(info, KIRI_E_IO, "%s: mmap: %s", path, strerror(e));
        }
        out->addr = p;
    }
    close(fd); /* the mapping keeps the file alive */
    return KIRI_OK;
}

void kiri_platform_unmap(struct kiri_mapping *m)
{
    if (m->addr)
        munmap((void *)m->addr, m->size);
    m->addr = NULL;
    m->size = 0;
}

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

double kiri_platform_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int kiri_platform_n_cpus(void)
{
#if defined(__linux__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
#endif
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

uint64_t kiri_platform_peak_rss(void)
{
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0)
        return 0;
    return (uint64_t)ru.ru_maxrss * 1024u; /* Linux reports KiB */
}

uint64_t kiri_platform_total_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES);
    return pages > 0 ? (uint64_t)pages * page_size() : 0;
}

/* ---------------------------------------------------------------------------------------------
 * Durable file output
 * ------------------------------------------------------------------------------------------- */

int kiri_platform_file_create(const char *path, struct kiri_status_info *info, int *fd_out)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", path, strerror(errno));
    *fd_out = fd;
    return KIRI_OK;
}

int kiri_platform_file_write(int fd, const char *path, const void *data, size_t n,
                      struct kiri_status_info *info)
{
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return kiri_error_set(info, KIRI_E_IO, "%s: write: %s", path,
                                  w < 0 ? strerror(errno) : "no progress");
        p += w;
        n -= (size_t)w;
    }
    return KIRI_OK;
}

/* Flushes the file to storage and closes it; the descriptor is closed even on failure. */
int kiri_platform_file_sync_close(int fd, const char *path, struct kiri_status_info *info)
{
    int rc = KIRI_OK;
    if (fsync(fd) != 0)
        rc = kiri_error_set(info, KIRI_E_IO, "%s: fsync: %s", path, strerror(errno));
    if (close(fd) != 0 && rc == KIRI_OK)
        rc = kiri_error_set(info, KIRI_E_IO, "%s: close: %s", path, strerror(errno));
    return rc;
}

/* Renames from onto to and fsyncs the directory holding them, so the rename itself survives a
 * power loss. */
int kiri_platform_file_rename_durable(const char *from, const char *to, struct kiri_status_info *info)
{
    if (rename(from, to) != 0)
        return kiri_error_set(info, KIRI_E_IO, "rename %s to %s: %s", from, to, strerror(errno));
    const char *slash = strrchr(to, '/');
    char *dir = slash ? kiri_mem_strndup(to, slash == to ? 1 : (size_t)(slash - to))
                      : kiri_mem_strndup(".", 1);
    if (!dir)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory syncing the directory of %s", to);
    int rc = KIRI_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0)
        rc = kiri_error_set(info, KIRI_E_IO, "%s: directory fsync: %s", dir, strerror(errno));
    if (fd >= 0)
        close(fd);
    kiri_mem_free(dir);
    return rc;
}

void kiri_platform_file_abort(int fd, const char *path)
{
    if (fd >= 0)
        close(fd);
    if (path)
        unlink(path);
}

int kiri_platform_private_temp_file(const void *data, size_t n, char *path, size_t cap,
                                    struct kiri_status_info *info)
{
    const char *dir = getenv("TMPDIR");
    if (!dir || !*dir)
        dir = "/tmp";
    if ((size_t)snprintf(path, cap, "%s/kiri-XXXXXX", dir) >= cap)
        return kiri_error_set(info, KIRI_E_IO, "temporary directory path too long");
    int fd = mkstemp(path); /* mode 0600 */
    if (fd < 0)
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", path, strerror(errno));
    int rc = kiri_platform_file_write(fd, path, data, n, info);
    if (close(fd) != 0 && rc == KIRI_OK)
        rc = kiri_error_set(info, KIRI_E_IO, "%s: close: %s", path, strerror(errno));
    if (rc != KIRI_OK)
        unlink(path);
    return rc;
}

int kiri_platform_read_file(const char *path, size_t max, char **out, size_t *out_len,
                            struct kiri_status_info *info)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
        close(fd);
        return kiri_error_set(info, KIRI_E_IO, "%s: not a regular file of at most %zu bytes", path, max);
    }
    char *buf = kiri_mem_alloc((size_t)st.st_size + 1);
    if (!buf) {
        close(fd);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading %s", path);
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t r = read(fd, buf + got, (size_t)st.st_size - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *out_len = got;
    return KIRI_OK;
}

static sigset_t termination_set(void)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    return set;
}

void kiri_platform_signals_init(void)
{
    signal(SIGPIPE, SIG_IGN);
    sigset_t set = termination_set();
    pthread_sigmask(SIG_BLOCK, &set, NULL);
}

int kiri_platform_wait_termination(double timeout)
{
    sigset_t set = termination_set();
    struct timespec ts;
    if (timeout < 0)
        timeout = 0;
    ts.tv_sec = (time_t)timeout;
    ts.tv_nsec = (long)((timeout - (double)ts.tv_sec) * 1e9);
    int sig = sigtimedwait(&set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

/* ---------------------------------------------------------------------------------------------
 * CPU features: the CPU must report them and the OS must have enabled their register state.
 * ------------------------------------------------------------------------------------------- */

#if defined(__x86_64__) || defined(__i386__)
static uint64_t read_xcr0(void)
{
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}
#endif

uint32_t kiri_platform_cpu_features(void)
{
    uint32_t f = 0;
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    int osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, fma = (c >> 12) & 1, f16c = (c >> 29) & 1;
    if (!osxsave || !avx)
        return 0;
    uint64_t xcr0 = read_xcr0();
    int ymm_ok = (xcr0 & 0x6) == 0x6;          /* SSE and AVX state */
    int zmm_ok = (xcr0 & 0xe6) == 0xe6;        /* plus opmask and ZMM state */
    if (!ymm_ok)
        return 0;
    unsigned a7, b7, c7, d7;
    if (!__get_cpuid_count(7, 0, &a7, &b7, &c7, &d7))
        return 0;
    int avx2 = (b7 >> 5) & 1;
    if (avx2 && fma && f16c)
        f |= KIRI_CPU_AVX2;
    int avx512f = (b7 >> 16) & 1, avx512bw = (b7 >> 30) & 1, avx512vl = (b7 >> 31) & 1;
    if (zmm_ok && avx512f && avx512bw && avx512vl && (f & KIRI_CPU_AVX2)) {
        f |= KIRI_CPU_AVX512;
        if ((c7 >> 11) & 1)
            f |= KIRI_CPU_AVX512_VNNI;
    }
    unsigned a71, b71, c71, d71;
    if (__get_cpuid_count(7, 1, &a71, &b71, &c71, &d71) && ((a71 >> 4) & 1) && (f & KIRI_CPU_AVX2))
        f |= KIRI_CPU_AVX_VNNI;
#elif defined(__aarch64__)
    f |= KIRI_CPU_NEON; /* mandatory in AArch64 */
#if defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    if (hw & (1ul << 20)) /* HWCAP_ASIMDDP */
        f |= KIRI_CPU_DOTPROD;
    if (hw2 & (1ul << 13)) /* HWCAP2_I8MM */
        f |= KIRI_CPU_I8MM;
#endif
#endif
    return f;
}

/* ---------------------------------------------------------------------------------------------
 * Dynamic libraries
 * ------------------------------------------------------------------------------------------- */

void *kiri_platform_dl_open(const char *name) { return dlopen(name, RTLD_NOW | RTLD_LOCAL); }

void *kiri_platform_dl_sym(void *lib, const char *sym) { return lib ? dlsym(lib, sym) : NULL; }

/* ---------------------------------------------------------------------------------------------
 * Threads
 * ------------------------------------------------------------------------------------------- */

struct kiri_thread {
    pthread_t tid;
    void (*fn)(void *);
    void *arg;
};

static void *thread_entry(void *p)
{
    struct kiri_thread *t = p;
    t->fn(t->arg);
    return NULL;
}

int kiri_platform_thread_start(struct kiri_thread **out, void (*fn)(void *), void *arg)
{
    struct kiri_thread *t = kiri_mem_alloc(sizeof *t);
    if (!t)
        return KIRI_E_NOMEM;
    t->fn = fn;
    t->arg = arg;
    /* An explicit stack size: musl's default (128 KiB) is too small for the kernels' on-stack
     * tiles, glibc's (8 MiB of address space, touched lazily) more than needed. */
    pthread_attr_t attr;
    int rc = pthread_attr_init(&attr);
    if (rc == 0) {
        rc = pthread_attr_setstacksize(&attr, (size_t)2 << 20);
        if (rc == 0)
            rc = pthread_create(&t->tid, &attr, thread_entry, t);
        pthread_attr_destroy(&attr);
    }
    if (rc != 0) {
        kiri_mem_free(t);
        return KIRI_E_NOMEM;
    }
    *out = t;
    return KIRI_OK;
}

void kiri_platform_thread_join(struct kiri_thread *t)
{
    if (!t)
        return;
    pthread_join(t->tid, NULL);
    kiri_mem_free(t);
}

void kiri_platform_wait(const volatile uint32_t *addr, uint32_t expected)
{
#if defined(__linux__)
    syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
#else
    (void)addr;
    (void)expected;
    sched_yield();
#endif
}

void kiri_platform_wake_all(const volatile uint32_t *addr)
{
#if defined(__linux__)
    syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

struct kiri_mutex {
    pthread_mutex_t m;
};

int kiri_platform_mutex_init(struct kiri_mutex **out)
{
    struct kiri_mutex *m = kiri_mem_alloc(sizeof *m);
    if (!m)
        return KIRI_E_NOMEM;
    pthread_mutex_init(&m->m, NULL);
    *out = m;
    return KIRI_OK;
}

void kiri_platform_mutex_free(struct kiri_mutex *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->m);
    kiri_mem_free(m);
}

void kiri_platform_mutex_lock(struct kiri_mutex *m) { pthread_mutex_lock(&m->m); }

void kiri_platform_mutex_unlock(struct kiri_mutex *m) { pthread_mutex_unlock(&m->m); }

struct kiri_cond {
    pthread_cond_t c;
};

int kiri_platform_cond_init(struct kiri_cond **out)
{
    struct kiri_cond *c = kiri_mem_alloc(sizeof *c);
    if (!c)
        return KIRI_E_NOMEM;
    pthread_condattr_t attr;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&c->c, &attr);
    pthread_condattr_destroy(&attr);
    *out = c;
    return KIRI_OK;
}

void kiri_platform_cond_free(struct kiri_cond *c)
{
    if (!c)
        return;
    pthread_cond_destroy(&c->c);
    kiri_mem_free(c);
}

void kiri_platform_cond_wait(struct kiri_cond *c, struct kiri_mutex *m) { pthread_cond_wait(&c->c, &m->m); }

int kiri_platform_cond_timed_wait(struct kiri_cond *c, struct kiri_mutex *m, double seconds)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    if (seconds < 0)
        seconds = 0;
    if (seconds > 1e6)
        seconds = 1e6;
    const long long ns = (long long)ts.tv_nsec + (long long)((seconds - (double)(long long)seconds) * 1e9);
    ts.tv_sec += (time_t)seconds + (time_t)(ns / 1000000000LL);
    ts.tv_nsec = (long)(ns % 1000000000LL);
    return pthread_cond_timedwait(&c->c, &m->m, &ts) == ETIMEDOUT;
}

void kiri_platform_cond_signal(struct kiri_cond *c) { pthread_cond_signal(&c->c); }

void kiri_platform_cond_broadcast(struct kiri_cond *c) { pthread_cond_broadcast(&c->c); }

void kiri_platform_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ volatile("yield");
#endif
}


/* ---------------------------------------------------------------------------------------------
 * Files and directories (the models folder, the fleet), sleeping
 * ------------------------------------------------------------------------------------------- */




int kiri_platform_file_size(const char *path, uint64_t *size, struct kiri_status_info *info)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            return 1;
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode))
        return kiri_error_set(info, KIRI_E_IO, "%s: not a regular file", path);
    *size = (uint64_t)st.st_size;
    return KIRI_OK;
}



int kiri_platform_mkdir(const char *path, struct kiri_status_info *info)
{
    if (mkdir(path, 0755) == 0)
        return KIRI_OK;
    int e = errno;
    struct stat st;
    if (e == EEXIST && stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return KIRI_OK;
    return kiri_error_set(info, KIRI_E_IO, "%s: mkdir: %s", path, strerror(e));
}

int kiri_platform_list_dir(const char *dir, int (*fn)(void *user, const char *name), void *user,
                           struct kiri_status_info *info)
{
    DIR *d = opendir(dir);
    if (!d)
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", dir, strerror(errno));
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        rc = fn(user, e->d_name);
    }
    closedir(d);
    return rc;
}





void kiri_platform_sleep(double seconds)
{
    if (!(seconds > 0))
        return;
    if (seconds > 1e6)
        seconds = 1e6;
    struct timespec ts;
    ts.tv_sec = (time_t)seconds;
    ts.tv_nsec = (long)((seconds - (double)ts.tv_sec) * 1e9);
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

int kiri_platform_is_terminal(int fd) { return isatty(fd) == 1; }
