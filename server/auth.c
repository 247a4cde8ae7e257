/* API keys: a key file read once, and a check of the Authorization header whose running time does
 * not depend on the contents of any key nor on which key (if any) matched.
 *
 * Key file rules (beyond auth.h's): a key is 8..512 bytes of printable ASCII without spaces
 * (0x21..0x7E), since it has to travel in an HTTP header as a bearer token; a line whose key
 * holds a space or tab inside, or any other byte, is refused with its line number (never its
 * text). A UTF-8 byte order mark at the start is skipped. The file may be at most 1 MiB. Repeated
 * keys are allowed and harmless.
 *
 * Header rules: optional spaces or tabs, the scheme "Bearer" in any letter case (RFC 9110 makes
 * auth schemes case-insensitive), one or more spaces or tabs, the token, optional trailing
 * spaces or tabs. "Bearer" alone, another scheme, or no scheme at all never match.
 *
 * Constant time: each key sits zero-padded in a slot of KEY_MAX bytes; the token is copied into a
 * buffer of the same size (a longer token is truncated for the comparison and can never match),
 * and every slot is compared in full against it, lengths included, with no early exit. The work
 * is n_keys * KEY_MAX byte comparisons whatever the token, so timing reveals only the header's
 * length, which the client knows anyway. The match flag is volatile so the compiler cannot stop
 * the loop once it is set.
 */
#include "auth.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "error.h"
#include "kiri.h"
#include "mem.h"

#define KEY_MIN 8
#define KEY_MAX 512
#define MAX_KEYS 1024
#define FILE_MAX ((size_t)1 << 20)

struct kiri_auth {
    int n_keys;            /* 1..MAX_KEYS */
    uint16_t *len;         /* owned, (n_keys) key lengths, KEY_MIN..KEY_MAX */
    unsigned char *slots;  /* owned, (n_keys, KEY_MAX) keys, each zero-padded to KEY_MAX */
};

/* Clears secret memory in a way the compiler may not remove as a dead store. */
static void wipe(void *p, size_t n)
{
    volatile unsigned char *v = p;
    while (n--)
        *v++ = 0;
}

static int is_space(int c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* ---------------------------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------------------------- */

/* Reads the whole file (at most FILE_MAX bytes) into an owned buffer. */
static int read_small_file(const char *path, char **out, size_t *out_n, struct kiri_status_info *info)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return kiri_error_set(info, KIRI_E_IO, "API key file %s: cannot open (%s)", path, strerror(errno));
    char *buf = kiri_mem_alloc(FILE_MAX + 1);
    if (!buf) {
        fclose(f);
        return kiri_error_set(info, KIRI_E_NOMEM, "API key file %s: out of memory", path);
    }
    size_t n = fread(buf, 1, FILE_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    if (bad || n > FILE_MAX) {
        wipe(buf, n);
        kiri_mem_free(buf);
        if (bad)
            return kiri_error_set(info, KIRI_E_IO, "API key file %s: cannot read it", path);
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "API key file %s: larger than 1 MiB", path);
    }
    *out = buf;
    *out_n = n;
    return KIRI_OK;
}

/* Walks the lines; with a NULL a only validates and counts keys into *count. */
static int parse_keys(const char *path, const char *buf, size_t n, struct kiri_auth *a, int *count,
                      struct kiri_status_info *info)
{
    const int e = KIRI_E_INVALID_ARG;
    size_t pos = 0;
    int line = 0, k = 0;
    if (n >= 3 && memcmp(buf, "\xEF\xBB\xBF", 3) == 0)
        pos = 3;
    while (pos < n) {
        line++;
        size_t end = pos;
        while (end < n && buf[end] != '\n')
            end++;
        size_t b = pos, t = end;
        pos = end + 1;
        while (b < t && is_space((unsigned char)buf[b]))
            b++;
        while (t > b && is_space((unsigned char)buf[t - 1]))
            t--;
        if (b == t || buf[b] == '#')
            continue;
        for (size_t i = b; i < t; i++) {
            unsigned char c = (unsigned char)buf[i];
            if (c == ' ' || c == '\t')
                return kiri_error_at(info, e, "api-key-file", (int64_t)b,
                                     "API key file %s line %d: the key has whitespace inside", path, line);
            if (c < 0x21 || c > 0x7E)
                return kiri_error_at(info, e, "api-key-file", (int64_t)b,
                                     "API key file %s line %d: the key has a byte outside printable ASCII",
                                     path, line);
        }
        size_t len = t - b;
        if (len < KEY_MIN || len > KEY_MAX)
            return kiri_error_at(info, e, "api-key-file", (int64_t)b,
                                 "API key file %s line %d: a key must be %d..%d bytes, this one has %zu",
                                 path, line, KEY_MIN, KEY_MAX, len);
        if (k == MAX_KEYS)
            return kiri_error_at(info, e, "api-key-file", (int64_t)b,
                                 "API key file %s: more than %d keys", path, MAX_KEYS);
        if (a) {
            a->len[k] = (uint16_t)len;
            memcpy(a->slots + (size_t)k * KEY_MAX, buf + b, len);
        }
        k++;
    }
    if (k == 0)
        return kiri_error_set(info, e, "API key file %s: no keys (one per line; '#' starts a comment)", path);
    *count = k;
    return KIRI_OK;
}

void kiri_auth_free(struct kiri_auth *a)
{
    if (!a)
        return;
    if (a->slots)
        wipe(a->slots, (size_t)a->n_keys * KEY_MAX);
    kiri_mem_free(a->slots);
    kiri_mem_free(a->len);
    kiri_mem_free(a);
}

int kiri_auth_load(const char *path, struct kiri_auth **out, struct kiri_status_info *info)
{
    if (!path || !out)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "API key file: no path given");
    char *buf = NULL;
    size_t n = 0;
    int rc = read_small_file(path, &buf, &n, info);
    if (rc != KIRI_OK)
        return rc;
    int count = 0;
    rc = parse_keys(path, buf, n, NULL, &count, info);
    struct kiri_auth *a = NULL;
    if (rc == KIRI_OK) {
        a = kiri_mem_calloc(1, sizeof *a);
        if (a) {
            a->n_keys = count;
            a->len = kiri_mem_calloc((size_t)count, sizeof *a->len);
            a->slots = kiri_mem_calloc((size_t)count, KEY_MAX);
        }
        if (!a || !a->len || !a->slots) {
            kiri_auth_free(a);
            a = NULL;
            rc = kiri_error_set(info, KIRI_E_NOMEM, "API key file %s: out of memory", path);
        } else {
            rc = parse_keys(path, buf, n, a, &count, info);
        }
    }
    wipe(buf, n);
    kiri_mem_free(buf);
    if (rc != KIRI_OK) {
        kiri_auth_free(a);
        return rc;
    }
    kiri_error_clear(info);
    *out = a;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Checking
 * ------------------------------------------------------------------------------------------- */

/* With no key set loaded (a == NULL) nothing matches: the server fails closed. */
int kiri_auth_check(const struct kiri_auth *a, const char *authorization)
{
    if (!a || !authorization)
        return 0;
    /* The scheme is public, so parsing it may take data-dependent time. */
    const char *p = authorization;
    while (*p == ' ' || *p == '\t')
        p++;
    static const char scheme[] = "bearer";
    for (size_t i = 0; i < sizeof scheme - 1; i++) {
        char c = p[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (c != scheme[i])
            return 0;
    }
    p += sizeof scheme - 1;
    if (*p != ' ' && *p != '\t')
        return 0;
    while (*p == ' ' || *p == '\t')
        p++;
    size_t n = strlen(p);
    while (n > 0 && (p[n - 1] == ' ' || p[n - 1] == '\t'))
        n--;

    unsigned char tok[KEY_MAX];
    size_t m = n < KEY_MAX ? n : KEY_MAX;
    memcpy(tok, p, m);
    memset(tok + m, 0, KEY_MAX - m);
    uint32_t too_long = n > KEY_MAX;
    volatile uint32_t match = 0;
    for (int k = 0; k < a->n_keys; k++) {
        const unsigned char *key = a->slots + (size_t)k * KEY_MAX;
        unsigned acc = 0;
        for (size_t j = 0; j < KEY_MAX; j++)
            acc |= (unsigned)(tok[j] ^ key[j]);
        uint32_t diff = (uint32_t)acc | ((uint32_t)a->len[k] ^ (uint32_t)m);
        /* diff < 2^16, so the top bit of (diff | -diff) is set exactly when diff != 0. */
        match = match | (((diff | (0u - diff)) >> 31) ^ 1u);
    }
    wipe(tok, sizeof tok);
    return (int)(match & (too_long ^ 1u));
}
