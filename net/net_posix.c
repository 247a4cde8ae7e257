/* The network layer's operating-system calls on POSIX (net_platform.h): files a download
 * resumes and locks, private key files, the wall clock, the random source and TCP sockets. */
#include "net_platform.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "error.h"
#include "kiri.h"
#include "mem.h"

int kiri_platform_file_open_append(const char *path, int *fd_out, uint64_t *size_out,
                                   struct kiri_status_info *info)
{
    int fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0)
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return kiri_error_set(info, KIRI_E_IO, "%s: not a regular file", path);
    }
    *fd_out = fd;
    *size_out = (uint64_t)st.st_size;
    return KIRI_OK;
}

int kiri_platform_file_read(int fd, const char *path, void *buf, size_t n, size_t *got,
                            struct kiri_status_info *info)
{
    for (;;) {
        ssize_t r = read(fd, buf, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return kiri_error_set(info, KIRI_E_IO, "%s: read: %s", path, strerror(errno));
        *got = (size_t)r;
        return KIRI_OK;
    }
}

int kiri_platform_file_create_private(const char *path, struct kiri_status_info *info, int *fd_out)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", path, strerror(errno));
    /* The umask can only remove bits; fchmod makes the mode exact whatever it is. */
    if (fchmod(fd, 0600) != 0) {
        int e = errno;
        close(fd);
        unlink(path);
        return kiri_error_set(info, KIRI_E_IO, "%s: chmod: %s", path, strerror(e));
    }
    *fd_out = fd;
    return KIRI_OK;
}

int kiri_platform_file_remove(const char *path, struct kiri_status_info *info)
{
    if (unlink(path) != 0 && errno != ENOENT)
        return kiri_error_set(info, KIRI_E_IO, "%s: remove: %s", path, strerror(errno));
    return KIRI_OK;
}

/* Links from to a temporary name beside to, then renames that over to, so to always names
 * either its old file or the new one. */
int kiri_platform_file_link(const char *from, const char *to, struct kiri_status_info *info)
{
    size_t n = strlen(to);
    char *tmp = kiri_mem_alloc(n + 6);
    if (!tmp)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory linking %s", to);
    memcpy(tmp, to, n);
    memcpy(tmp + n, ".link", 6);
    unlink(tmp);
    if (link(from, tmp) != 0) {
        int e = errno;
        kiri_mem_free(tmp);
        return kiri_error_set(info, e == EPERM || e == EOPNOTSUPP || e == EXDEV ? KIRI_E_UNSUPPORTED : KIRI_E_IO,
                              "link %s to %s: %s", from, to, strerror(e));
    }
    int rc = kiri_platform_file_rename_durable(tmp, to, info);
    if (rc != KIRI_OK)
        unlink(tmp);
    kiri_mem_free(tmp);
    return rc;
}

int kiri_platform_disk_free(const char *path, uint64_t *out, struct kiri_status_info *info)
{
    struct statvfs v;
    if (statvfs(path, &v) != 0)
        return kiri_error_set(info, KIRI_E_IO, "%s: statvfs: %s", path, strerror(errno));
    *out = (uint64_t)v.f_bavail * (uint64_t)v.f_frsize;
    return KIRI_OK;
}

int kiri_platform_lock_file(const char *path, int *fd_out, struct kiri_status_info *info)
{
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return kiri_error_set(info, KIRI_E_IO, "%s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        if (e == EWOULDBLOCK)
            return kiri_error_set(info, KIRI_E_BUSY, "%s: held by another process", path);
        return kiri_error_set(info, KIRI_E_IO, "%s: lock: %s", path, strerror(e));
    }
    *fd_out = fd;
    return KIRI_OK;
}

void kiri_platform_lock_release(int fd)
{
    if (fd >= 0)
        close(fd); /* closing the last descriptor drops the flock */
}

double kiri_platform_wall_time(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int kiri_platform_random(void *buf, size_t n, struct kiri_status_info *info)
{
    unsigned char *p = buf;
    while (n > 0) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return kiri_error_set(info, KIRI_E_IO, "getrandom: %s", strerror(errno));
        p += r;
        n -= (size_t)r;
    }
    return KIRI_OK;
}

/* Waits until sock is ready for events or timeout seconds pass: 1 ready, 0 timeout, -1 error. */
static int sock_wait(int sock, short events, double timeout)
{
    const double end = kiri_platform_now() + (timeout > 0 ? timeout : 0);
    for (;;) {
        double left = end - kiri_platform_now();
        if (left < 0)
            left = 0;
        int ms = left > 86400.0 ? 86400000 : (int)(left * 1000.0 + 0.999);
        struct pollfd p = {.fd = sock, .events = events, .revents = 0};
        int r = poll(&p, 1, ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -1;
        if (r > 0)
            return 1;
        if (kiri_platform_now() >= end)
            return 0;
    }
}

int kiri_platform_tcp_connect(const char *host, int port, double timeout, int *sock_out,
                              struct kiri_status_info *info)
{
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    /* No AI_ADDRCONFIG: with only a loopback interface (an offline device, a test namespace) it
     * would hide the loopback addresses themselves. Unreachable families just fail to connect. */
    int g = getaddrinfo(host, service, &hints, &res);
    if (g != 0)
        return kiri_error_at(info, KIRI_E_IO, "dns", -1, "cannot resolve %s: %s", host,
                             g == EAI_SYSTEM ? strerror(errno) : gai_strerror(g));
    const double end = kiri_platform_now() + timeout;
    int last_err = ETIMEDOUT;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        double left = end - kiri_platform_now();
        if (left <= 0)
            break;
        int s = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
        if (s < 0) {
            last_err = errno;
            continue;
        }
        int r = connect(s, a->ai_addr, a->ai_addrlen);
        if (r != 0 && errno == EINPROGRESS) {
            int w = sock_wait(s, POLLOUT, left);
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            if (w == 1 && getsockopt(s, SOL_SOCKET, SO_ERROR, &soerr, &sl) == 0 && soerr == 0)
                r = 0;
            else
                errno = w == 0 ? ETIMEDOUT : soerr ? soerr : errno;
        }
        if (r == 0) {
            freeaddrinfo(res);
            *sock_out = s;
            return KIRI_OK;
        }
        last_err = errno;
        close(s);
    }
    freeaddrinfo(res);
    return kiri_error_at(info, KIRI_E_IO, last_err == ETIMEDOUT ? "timeout" : "connect", -1,
                         "cannot connect to %s port %d: %s", host, port, strerror(last_err));
}

long kiri_platform_sock_send(int sock, const void *buf, size_t n, double timeout)
{
    for (;;) {
        ssize_t w = send(sock, buf, n, MSG_NOSIGNAL);
        if (w >= 0)
            return (long)w;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return KIRI_PLATFORM_SOCK_ERROR;
        int r = sock_wait(sock, POLLOUT, timeout);
        if (r == 0)
            return KIRI_PLATFORM_SOCK_TIMEOUT;
        if (r < 0)
            return KIRI_PLATFORM_SOCK_ERROR;
    }
}

long kiri_platform_sock_recv(int sock, void *buf, size_t n, double timeout)
{
    for (;;) {
        ssize_t r = recv(sock, buf, n, 0);
        if (r >= 0)
            return (long)r;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return KIRI_PLATFORM_SOCK_ERROR;
        int w = sock_wait(sock, POLLIN, timeout);
        if (w == 0)
            return KIRI_PLATFORM_SOCK_TIMEOUT;
        if (w < 0)
            return KIRI_PLATFORM_SOCK_ERROR;
    }
}

void kiri_platform_sock_close(int sock)
{
    if (sock >= 0)
        close(sock);
}
