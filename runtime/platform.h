/* The operating-system primitives kiri needs. No other module includes OS headers; one .c per OS
 * implements this (platform_posix.c for Linux and other POSIX systems). */
#ifndef KIRI_PLATFORM_H
#define KIRI_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

struct kiri_status_info;

/* A read-only private mapping of a whole file. */
struct kiri_mapping {
    const void *addr;   /* NULL for an empty file */
    size_t size;
};

/* Maps path read-only with MAP_PRIVATE. Refuses names ending in ".partial" (files still being
 * written) and anything that is not a regular file. Fills info and returns KIRI_E_IO on failure. */
int kiri_platform_map_file(const char *path, struct kiri_mapping *out, struct kiri_status_info *info);
void kiri_platform_unmap(struct kiri_mapping *m);
/* Advises the kernel that [addr, addr + size) of a mapping will be read soon (or sequentially). */
void kiri_platform_advise_willneed(const void *addr, size_t size);

/* Durable output: create (truncating) a file for writing, write all of data, flush it to storage
 * and close it, rename it over another name and flush the directory so the rename survives a
 * power loss; abort closes the descriptor (if >= 0) and removes the file. Errors fill info with
 * KIRI_E_IO naming the path. */
int kiri_platform_file_create(const char *path, struct kiri_status_info *info, int *fd_out);
int kiri_platform_file_write(int fd, const char *path, const void *data, size_t n, struct kiri_status_info *info);
int kiri_platform_file_sync_close(int fd, const char *path, struct kiri_status_info *info);
int kiri_platform_file_rename_durable(const char *from, const char *to, struct kiri_status_info *info);
void kiri_platform_file_abort(int fd, const char *path);

size_t kiri_platform_page_size(void);
/* Monotonic seconds. */
double kiri_platform_now(void);
/* Online CPU cores available to this process (>= 1). */
int kiri_platform_n_cpus(void);
/* CPU features usable here (enum kiri_cpu_feature bits), asking both the CPU and the OS. */
uint32_t kiri_platform_cpu_features(void);
/* Peak resident set size of this process in bytes, 0 if unknown. */
uint64_t kiri_platform_peak_rss(void);
/* Total physical memory in bytes, 0 if unknown. */
uint64_t kiri_platform_total_memory(void);

/* Dynamic libraries for backends that find their driver at run time. NULL when absent. */
void *kiri_platform_dl_open(const char *name);
void *kiri_platform_dl_sym(void *lib, const char *sym);

/* Threads and synchronisation for the thread pool. */
struct kiri_thread;
int kiri_platform_thread_start(struct kiri_thread **out, void (*fn)(void *), void *arg);
void kiri_platform_thread_join(struct kiri_thread *t);
/* A futex-like wait: sleeps while *addr == expected (spurious wake-ups allowed). */
void kiri_platform_wait(const volatile uint32_t *addr, uint32_t expected);
void kiri_platform_wake_all(const volatile uint32_t *addr);
/* A mutual-exclusion lock (not recursive). */
struct kiri_mutex;
int kiri_platform_mutex_init(struct kiri_mutex **out);
void kiri_platform_mutex_free(struct kiri_mutex *m);
void kiri_platform_mutex_lock(struct kiri_mutex *m);
void kiri_platform_mutex_unlock(struct kiri_mutex *m);
/* A condition variable used with a kiri_mutex. timed_wait returns 0 when signalled (or
 * spuriously) and 1 on timeout. */
struct kiri_cond;
int kiri_platform_cond_init(struct kiri_cond **out);
void kiri_platform_cond_free(struct kiri_cond *c);
void kiri_platform_cond_wait(struct kiri_cond *c, struct kiri_mutex *m);
int kiri_platform_cond_timed_wait(struct kiri_cond *c, struct kiri_mutex *m, double seconds);
void kiri_platform_cond_signal(struct kiri_cond *c);
void kiri_platform_cond_broadcast(struct kiri_cond *c);
/* A hint inside spin loops. */
void kiri_platform_cpu_relax(void);
/* Gives the core to another runnable thread (for spin loops that waited too long). */
void kiri_platform_yield(void);

#endif
