/* The operating-system calls only the network layer needs (downloads, the fleet, the HTTPS
 * client): resumable and private files, locks, hard links, free disk space, the wall clock, the
 * random source and TCP client sockets. net_posix.c implements them for POSIX systems. */
#ifndef KIRI_NET_PLATFORM_H
#define KIRI_NET_PLATFORM_H

#include <stddef.h>
#include <stdint.h>

#include "platform.h"


/* Opens path for reading and appending (created with mode 0644 when absent) and reports its
 * current size, so an interrupted download can be hashed and then continued. */
int kiri_platform_file_open_append(const char *path, int *fd_out, uint64_t *size_out,
                                   struct kiri_status_info *info);
/* Reads at most n bytes at the descriptor's position into buf; *got is 0 at the end. */
int kiri_platform_file_read(int fd, const char *path, void *buf, size_t n, size_t *got,
                            struct kiri_status_info *info);
/* Creates a new file (failing when path exists) that only this user may read or write (0600),
 * for private keys. */
int kiri_platform_file_create_private(const char *path, struct kiri_status_info *info, int *fd_out);
/* Removes a file; a missing file is not an error. */
int kiri_platform_file_remove(const char *path, struct kiri_status_info *info);
/* Gives the file at from a second name to (a hard link), replacing whatever to named, and
 * flushes the directory. Fails with KIRI_E_UNSUPPORTED where the filesystem has no hard links. */
int kiri_platform_file_link(const char *from, const char *to, struct kiri_status_info *info);
/* Bytes an unprivileged writer may still use on the filesystem holding path (statvfs). */
int kiri_platform_disk_free(const char *path, uint64_t *out, struct kiri_status_info *info);
/* Takes an exclusive advisory lock on path (created when absent) without waiting: KIRI_E_BUSY
 * when another process holds it. The lock lasts until kiri_platform_lock_release or the
 * process ends (kill -9 included). */
int kiri_platform_lock_file(const char *path, int *fd_out, struct kiri_status_info *info);
void kiri_platform_lock_release(int fd);

/* Wall-clock seconds since 1970-01-01 UTC; unlike kiri_platform_now it can jump. */
double kiri_platform_wall_time(void);
/* Fills buf with n bytes from the operating system's random source. */
int kiri_platform_random(void *buf, size_t n, struct kiri_status_info *info);

/* TCP client sockets. connect resolves host (getaddrinfo, any address family) and tries each
 * address until one connects, within timeout seconds in all (name resolution itself is not
 * bounded by it). send and recv wait at most timeout seconds for the socket to be ready and
 * return the bytes moved (> 0), 0 from recv at the peer's orderly end,
 * KIRI_PLATFORM_SOCK_TIMEOUT, or KIRI_PLATFORM_SOCK_ERROR (reset, refused, ...). */
#define KIRI_PLATFORM_SOCK_ERROR (-1)
#define KIRI_PLATFORM_SOCK_TIMEOUT (-2)
int kiri_platform_tcp_connect(const char *host, int port, double timeout, int *sock_out,
                              struct kiri_status_info *info);
long kiri_platform_sock_send(int sock, const void *buf, size_t n, double timeout);
long kiri_platform_sock_recv(int sock, void *buf, size_t n, double timeout);
void kiri_platform_sock_close(int sock);

#endif
