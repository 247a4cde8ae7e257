/* The operating-system primitives kiri needs. No other module includes OS headers; one .c per OS
 * implements this (platform_posix.c for Linux and other POSIX systems). */
#ifndef KIRI_PLATFORM_H
#define KIRI_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#include "cpu_features.h"

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

/* Durable output: create (truncating) a file for writing, write all of data, flush it to storage
 * and close it, rename it over another name and flush the directory so the rename survives a
 * power loss; abort closes the descriptor (if >= 0) and removes the file. Errors fill info with
 * KIRI_E_IO naming the path. */
int kiri_platform_file_create(const char *path, struct kiri_status_info *info, int *fd_out);
int kiri_platform_file_write(int fd, const char *path, const void *data, size_t n, struct kiri_status_info *info);
int kiri_platform_file_sync_close(int fd, const char *path, struct kiri_status_info *info);
int kiri_platform_file_rename_durable(const char *from, const char *to, struct kiri_status_info *info);
void kiri_platform_file_abort(int fd, const char *path);

/* Creates a file readable only by this user in the temporary directory (for key material that a
 * library wants as a file), writes data to it and returns its path in path (cap bytes). Remove it
 * with kiri_platform_file_abort(-1, path). */
int kiri_platform_private_temp_file(const void *data, size_t n, char *path, size_t cap,
                                    struct kiri_status_info *info);
/* Reads a whole file of at most max bytes into an owned, NUL-terminated buffer. */
int kiri_platform_read_file(const char *path, size_t max, char **out, size_t *out_len,
                            struct kiri_status_info *info);

/* Termination: call once at start, before any thread is created. SIGTERM, SIGINT and SIGHUP are
 * blocked in every thread (to be taken by kiri_platform_wait_termination) and SIGPIPE is ignored,
 * so a write to a closed socket fails with EPIPE instead of ending the process. */
void kiri_platform_signals_init(void);
/* Waits for SIGTERM/SIGINT/SIGHUP at most timeout seconds: the signal number, or 0. */
int kiri_platform_wait_termination(double timeout);

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

/* ---- Files and directories (the server's models folder, the fleet) ---- */

/* The size of a regular file: KIRI_OK with *size, 1 when nothing is at path, KIRI_E_IO when it
 * cannot be examined or is not a regular file. */
int kiri_platform_file_size(const char *path, uint64_t *size, struct kiri_status_info *info);

/* Creates a directory (0755); an existing directory is not an error. */
int kiri_platform_mkdir(const char *path, struct kiri_status_info *info);

/* Calls fn(user, name) for every entry of dir except "." and ".."; a non-zero return from fn
 * stops the listing and is returned. The order is the filesystem's. */
int kiri_platform_list_dir(const char *dir, int (*fn)(void *user, const char *name), void *user,
                           struct kiri_status_info *info);

/* Sleeps for seconds (<= 0: returns at once). */
void kiri_platform_sleep(double seconds);

/* Is file descriptor fd (0 stdin, 1 stdout, 2 stderr) a terminal? */
int kiri_platform_is_terminal(int fd);

#endif
