/* A minimal HTTPS server for tests/test_tls_handshake.py: CivetWeb in its mbedTLS mode, linked
 * from the static libraries scripts/build-deps.sh builds, listening on 127.0.0.1 only.
 *   tls_echo_server PEM [REQUEST_TIMEOUT_MS [NUM_THREADS]]
 * PEM holds the certificate followed by its unencrypted private key (CivetWeb reads both from one
 * file). GET /health answers 200 "ok"; POST /echo sends the request body back. The server takes a
 * free port, prints "port N" on stdout once it accepts connections, and stops when stdin reaches
 * end of file, printing "stopped". Exit status: 0 after a clean stop, 1 if the server cannot
 * start (bad PEM, no port), 2 for bad arguments.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "civetweb.h"

static int health(struct mg_connection *conn, void *cbdata)
{
    (void)cbdata;
    mg_send_http_ok(conn, "text/plain", 3);
    mg_write(conn, "ok\n", 3);
    return 200;
}

/* Reads the whole body (at most 64 KiB) before answering, so a test sees TLS reads and writes. */
static int echo(struct mg_connection *conn, void *cbdata)
{
    char body[65536];
    size_t n = 0;
    int r;
    (void)cbdata;
    while (n < sizeof body && (r = mg_read(conn, body + n, sizeof body - n)) > 0)
        n += (size_t)r;
    mg_send_http_ok(conn, "application/octet-stream", (long long)n);
    mg_write(conn, body, n);
    return 200;
}

static int log_message(const struct mg_connection *conn, const char *message)
{
    (void)conn;
    fprintf(stderr, "tls_echo_server: %s\n", message);
    return 1;
}

static int positive(const char *s)
{
    char *end;
    long v = strtol(s, &end, 10);
    return (*s && !*end && v > 0 && v < 1000000000) ? (int)v : -1;
}

int main(int argc, char **argv)
{
    if (argc < 2 || argc > 4 || (argc > 2 && positive(argv[2]) < 0)
        || (argc > 3 && positive(argv[3]) < 0)) {
        fprintf(stderr, "usage: tls_echo_server PEM [REQUEST_TIMEOUT_MS [NUM_THREADS]]\n");
        return 2;
    }
    const char *options[] = {
        "listening_ports", "127.0.0.1:0s",
        "ssl_certificate", argv[1],
        "request_timeout_ms", argc > 2 ? argv[2] : "10000",
        "num_threads", argc > 3 ? argv[3] : "50",
        NULL,
    };
    struct mg_callbacks callbacks;
    memset(&callbacks, 0, sizeof callbacks);
    callbacks.log_message = log_message;

    mg_init_library(MG_FEATURES_TLS);
    struct mg_context *ctx = mg_start(&callbacks, NULL, options);
    if (!ctx) {
        fprintf(stderr, "tls_echo_server: cannot start (certificate %s)\n", argv[1]);
        mg_exit_library();
        return 1;
    }
    mg_set_request_handler(ctx, "/health$", health, NULL);
    mg_set_request_handler(ctx, "/echo$", echo, NULL);

    struct mg_server_port port;
    if (mg_get_server_ports(ctx, 1, &port) != 1 || !port.is_ssl) {
        fprintf(stderr, "tls_echo_server: no TLS port\n");
        mg_stop(ctx);
        mg_exit_library();
        return 1;
    }
    printf("port %d\n", port.port);
    fflush(stdout);

    char buf[256];
    while (read(STDIN_FILENO, buf, sizeof buf) > 0) {
    }
    mg_stop(ctx);
    mg_exit_library();
    printf("stopped\n");
    return 0;
}
