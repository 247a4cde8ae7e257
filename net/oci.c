/* OCI registry references, manifests and Bearer-token auth (oci.h). */
#include "oci.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "mbedtls/sha256.h"

#include "error.h"
#include "hex.h"
#include "https.h"
#include "kiri.h"
#include "mem.h"

#define MANIFEST_MAX (4u << 20)
#define TOKEN_MAX (64u << 10)

static const char *const accept_manifests =
    "Accept: application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

/* ---------------------------------------------------------------------------------------------
 * References
 * ------------------------------------------------------------------------------------------- */

static int repo_char(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'; }

static int hex64(const char *s)
{
    if (strlen(s) != 64)
        return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
            return 0;
    return 1;
}

int kiri_oci_parse_ref(const char *ref, struct kiri_oci_ref *out)
{
    struct kiri_oci_ref r;
    memset(&r, 0, sizeof r);
    if (strncmp(ref, "oci://", 6) == 0)
        ref += 6;
    const char *slash = strchr(ref, '/');
    if (!slash || slash == ref || (size_t)(slash - ref) >= sizeof r.host)
        return -1;
    char hostport[256];
    memcpy(hostport, ref, (size_t)(slash - ref));
    hostport[slash - ref] = '\0';
    if (!strchr(hostport, '.') && !strchr(hostport, ':') && strcmp(hostport, "localhost") != 0)
        return -1;
    char *colon = strchr(hostport, ':');
    r.port = 443;
    if (colon) {
        *colon = '\0';
        const char *p = colon + 1;
        if (!*p || strlen(p) > 5)
            return -1;
        r.port = 0;
        for (; *p; p++) {
            if (*p < '0' || *p > '9')
                return -1;
            r.port = r.port * 10 + (*p - '0');
        }
        if (r.port < 1 || r.port > 65535)
            return -1;
    }
    for (const char *p = hostport; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' || *p == '-'))
            return -1;
    if (!hostport[0])
        return -1;
    snprintf(r.host, sizeof r.host, "%s", hostport);

    const char *rest = slash + 1, *at = strchr(rest, '@');
    size_t repo_len;
    if (at) {
        repo_len = (size_t)(at - rest);
        if (strncmp(at + 1, "sha256:", 7) != 0 || !hex64(at + 8))
            return -1;
        snprintf(r.digest, sizeof r.digest, "%s", at + 1);
    } else {
        const char *last_slash = strrchr(rest, '/'), *tag = strrchr(last_slash ? last_slash : rest, ':');
        repo_len = tag ? (size_t)(tag - rest) : strlen(rest);
        const char *t = tag ? tag + 1 : "latest";
        size_t tl = strlen(t);
        if (tl == 0 || tl > 128 || t[0] == '.' || t[0] == '-')
            return -1;
        for (const char *p = t; *p; p++)
            if (!((*p >= 'A' && *p <= 'Z') || repo_char(*p)))
                return -1;
        snprintf(r.tag, sizeof r.tag, "%s", t);
    }
    if (repo_len == 0 || repo_len >= sizeof r.repo)
        return -1;
    memcpy(r.repo, rest, repo_len);
    r.repo[repo_len] = '\0';
    /* Path components: non-empty runs of [a-z0-9._-], not "." or "..". */
    for (const char *p = r.repo; *p;) {
        const char *e = strchr(p, '/');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return -1;
        for (size_t i = 0; i < n; i++)
            if (!repo_char(p[i]))
                return -1;
        if (!e)
            break;
        p = e + 1;
        if (!*p)
            return -1;
    }
    *out = r;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Bearer challenges and tokens
 * ------------------------------------------------------------------------------------------- */

int kiri_oci_parse_challenge(const char *v, char *realm, size_t realm_cap, char *service, size_t service_cap,
                             char *scope, size_t scope_cap)
{
    realm[0] = service[0] = scope[0] = '\0';
    while (*v == ' ')
        v++;
    if (strncasecmp(v, "Bearer", 6) != 0 || (v[6] != ' ' && v[6] != '\0'))
        return -1;
    const char *p = v + 6;
    while (*p) {
        while (*p == ' ' || *p == ',' || *p == '\t')
            p++;
        if (!*p)
            break;
        const char *k = p;
        while (*p && *p != '=' && *p != ',' && *p != ' ')
            p++;
        size_t kn = (size_t)(p - k);
        if (*p != '=')
            return -1;
        p++;
        char val[1024];
        size_t n = 0;
        if (*p == '"') {
            p++;
            while (*p && *p != '"') {
                if (*p == '\\' && p[1])
                    p++;
                if (n + 1 < sizeof val)
                    val[n++] = *p;
                p++;
            }
            if (*p != '"')
                return -1;
            p++;
        } else {
            while (*p && *p != ',' && *p != ' ') {
                if (n + 1 < sizeof val)
                    val[n++] = *p;
                p++;
            }
        }
        val[n] = '\0';
        if (kn == 5 && strncasecmp(k, "realm", 5) == 0)
            snprintf(realm, realm_cap, "%s", val);
        else if (kn == 7 && strncasecmp(k, "service", 7) == 0)
            snprintf(service, service_cap, "%s", val);
        else if (kn == 5 && strncasecmp(k, "scope", 5) == 0)
            snprintf(scope, scope_cap, "%s", val);
    }
    return 0;
}

/* Appends s percent-encoded (RFC 3986 unreserved characters kept). */
static size_t url_encode(char *out, size_t cap, size_t n, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    for (; *s && n + 4 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
            c == '_' || c == '~') {
            out[n++] = (char)c;
        } else {
            out[n++] = '%';
            out[n++] = hex[c >> 4];
            out[n++] = hex[c & 15];
        }
    }
    out[n] = '\0';
    return n;
}

static void emit(void (*log)(void *, const char *), void *user, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void emit(void (*log)(void *, const char *), void *user, const char *fmt, ...)
{
    if (!log)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    log(user, line);
}

/* Answers a Bearer challenge: GET realm?service=..&scope=.. and build the Authorization line. */
static int fetch_token(struct kiri_https_client *c, const struct kiri_oci_ref *ref, const char *challenge,
                       char **auth_out, struct kiri_status_info *info)
{
    char realm[1024], service[256], scope[512], host[256];
    int port;
    if (kiri_oci_parse_challenge(challenge, realm, sizeof realm, service, sizeof service, scope, sizeof scope) != 0)
        return kiri_error_at(info, KIRI_E_IO, "http", -1, "%s: HTTP 401 without a Bearer challenge", ref->host);
    char *url = kiri_mem_alloc(KIRI_HTTPS_MAX_URL);
    if (!url)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory fetching a token");
    int rc = KIRI_OK;
    if (kiri_https_parse_url(realm, host, sizeof host, &port, url, KIRI_HTTPS_MAX_URL) != 0) {
        rc = kiri_error_at(info, KIRI_E_IO, "http", -1, "%s: the token realm is not an https:// URL: %.100s", ref->host,
                           realm);
    } else if (!kiri_https_client_host_allowed(c, ref->host, host)) {
        rc = kiri_error_at(info, KIRI_E_IO, "redirect", -1,
                           "%s: token realm on foreign host %.100s refused (not allowlisted)", ref->host, host);
    }
    if (rc != KIRI_OK) {
        kiri_mem_free(url);
        return rc;
    }
    char default_scope[300];
    if (!scope[0]) {
        snprintf(default_scope, sizeof default_scope, "repository:%s:pull", ref->repo);
        snprintf(scope, sizeof scope, "%s", default_scope);
    }
    size_t n = (size_t)snprintf(url, KIRI_HTTPS_MAX_URL, "%s%c", realm, strchr(realm, '?') ? '&' : '?');
    if (service[0]) {
        n += (size_t)snprintf(url + n, KIRI_HTTPS_MAX_URL - n, "service=");
        n = url_encode(url, KIRI_HTTPS_MAX_URL, n, service);
        n += (size_t)snprintf(url + n, KIRI_HTTPS_MAX_URL - n, "&");
    }
    n += (size_t)snprintf(url + n, KIRI_HTTPS_MAX_URL - n, "scope=");
    url_encode(url, KIRI_HTTPS_MAX_URL, n, scope);

    struct kiri_https_response *resp = kiri_mem_alloc(sizeof *resp);
    char *body = NULL;
    size_t len = 0;
    if (!resp) {
        kiri_mem_free(url);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory fetching a token");
    }
    rc = kiri_https_get_small(c, url, NULL, TOKEN_MAX, &body, &len, resp, info);
    if (rc == KIRI_OK && !body)
        rc = kiri_error_at(info, KIRI_E_IO, "http", -1, "token request to %.100s: HTTP %d", host, resp->status);
    json_t *root = NULL;
    if (rc == KIRI_OK) {
        json_error_t je;
        root = json_loadb(body, len, 0, &je);
        json_t *t = json_object_get(root, "token");
        if (!json_is_string(t))
            t = json_object_get(root, "access_token");
        const char *tok = json_is_string(t) ? json_string_value(t) : NULL;
        int ok = tok && *tok && strlen(tok) == json_string_length(t) && strlen(tok) < 8192;
        for (const char *p = tok; ok && *p; p++)
            ok = *p > ' ' && *p <= '~';
        if (!ok) {
            rc = kiri_error_at(info, KIRI_E_IO, "http", -1, "token response from %.100s has no usable token", host);
        } else {
            size_t cap = strlen(tok) + 32;
            char *a = kiri_mem_alloc(cap);
            if (!a)
                rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory fetching a token");
            else {
                snprintf(a, cap, "Authorization: Bearer %s", tok);
                *auth_out = a;
            }
        }
    }
    json_decref(root);
    kiri_mem_free(body);
    kiri_mem_free(resp);
    kiri_mem_free(url);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Manifests
 * ------------------------------------------------------------------------------------------- */

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcasecmp(s + a - b, suffix) == 0;
}

static int pick_layer(json_t *root, struct kiri_oci_blob *b, struct kiri_status_info *info)
{
    json_t *mt = json_object_get(root, "mediaType"), *sv = json_object_get(root, "schemaVersion");
    const char *media = json_is_string(mt) ? json_string_value(mt) : "";
    if (strstr(media, "index") || strstr(media, "manifest.list") || json_object_get(root, "manifests"))
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, "manifest", -1,
                             "the reference names an image index (several platforms); pull one manifest by digest");
    if (!json_is_integer(sv) || json_integer_value(sv) != 2)
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, "manifest", -1, "only schemaVersion 2 image manifests are supported");
    json_t *layers = json_object_get(root, "layers");
    if (!json_is_array(layers) || json_array_size(layers) == 0 || json_array_size(layers) > 1024)
        return kiri_error_at(info, KIRI_E_MODEL_INVALID, "manifest", -1, "the image manifest has no layers");
    int best = -1, best_rank = 0;
    uint64_t best_size = 0;
    size_t i;
    json_t *l;
    json_array_foreach(layers, i, l) {
        json_t *d = json_object_get(l, "digest"), *s = json_object_get(l, "size"), *m = json_object_get(l, "mediaType");
        json_t *title = json_object_get(json_object_get(l, "annotations"), "org.opencontainers.image.title");
        if (!json_is_string(d) || !json_is_integer(s) || json_integer_value(s) < 1)
            return kiri_error_at(info, KIRI_E_MODEL_INVALID, "manifest", -1, "layer %zu has no digest or size", i);
        const char *ms = json_is_string(m) ? json_string_value(m) : "";
        const char *ts = json_is_string(title) ? json_string_value(title) : "";
        int rank = strcmp(ms, "application/vnd.ollama.image.model") == 0 || strstr(ms, "gguf") ? 3
                 : ends_with(ts, ".gguf") ? 2 : 1;
        uint64_t size = (uint64_t)json_integer_value(s);
        if (rank > best_rank || (rank == 1 && best_rank == 1 && size > best_size)) {
            best = (int)i;
            best_rank = rank;
            best_size = size;
            snprintf(b->media_type, sizeof b->media_type, "%s", ms);
            snprintf(b->title, sizeof b->title, "%s", ts);
            snprintf(b->digest, sizeof b->digest, "%s", json_string_value(d));
        }
    }
    b->size = best_size;
    b->n_layers = (int)json_array_size(layers);
    const char *hex = b->digest + 7;
    if (strncmp(b->digest, "sha256:", 7) != 0 || !hex64(hex))
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, "digest", -1, "layer %d: only sha256 digests are supported", best);
    kiri_hex_decode(hex, b->sha256, 32);   /* hex64 checked the digits */
    return KIRI_OK;
}

void kiri_oci_blob_free(struct kiri_oci_blob *b)
{
    if (!b)
        return;
    kiri_mem_free(b->auth_header);
    b->auth_header = NULL;
}

int kiri_oci_resolve(struct kiri_https_client *c, const struct kiri_oci_ref *ref, struct kiri_oci_blob *out,
                     void (*log)(void *user, const char *line), void *log_user, struct kiri_status_info *info)
{
    char *url = kiri_mem_alloc(KIRI_HTTPS_MAX_URL);
    struct kiri_https_response *resp = kiri_mem_alloc(sizeof *resp);
    struct kiri_oci_blob b;
    memset(&b, 0, sizeof b);
    char *body = NULL;
    size_t len = 0;
    int rc = KIRI_OK;
    if (!url || !resp) {
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory resolving %s", ref->repo);
        goto done;
    }
    snprintf(url, KIRI_HTTPS_MAX_URL, "https://%s:%d/v2/%s/manifests/%s", ref->host, ref->port, ref->repo,
             ref->digest[0] ? ref->digest : ref->tag);
    for (int round = 0; round < 2; round++) {
        const char *headers[3] = {accept_manifests, b.auth_header, NULL};
        rc = kiri_https_get_small(c, url, headers, MANIFEST_MAX, &body, &len, resp, info);
        if (rc != KIRI_OK)
            goto done;
        if (resp->status == 401 && round == 0 && !b.auth_header) {
            emit(log, log_user, "%s: the registry wants a token; asking its realm", ref->host);
            if ((rc = fetch_token(c, ref, resp->www_authenticate, &b.auth_header, info)) != KIRI_OK)
                goto done;
            continue;
        }
        break;
    }
    if (!body) {
        rc = kiri_error_at(info, resp->status == 429 || resp->status == 503 ? KIRI_E_BUSY : KIRI_E_IO, "http", -1,
                           "%s/%s: manifest request answered HTTP %d", ref->host, ref->repo, resp->status);
        goto done;
    }
    uint8_t h[32];
    char hex[65];
    mbedtls_sha256((const unsigned char *)body, len, h, 0);
    kiri_hex_encode(h, 32, hex);
    if (ref->digest[0] && strcmp(ref->digest + 7, hex) != 0) {
        rc = kiri_error_at(info, KIRI_E_MODEL_INVALID, "digest", -1,
                           "the manifest's sha256 is %.12s..., not the digest asked for", hex);
        goto done;
    }
    if (resp->content_digest[0] && strncmp(resp->content_digest, "sha256:", 7) == 0 &&
        strcmp(resp->content_digest + 7, hex) != 0) {
        rc = kiri_error_at(info, KIRI_E_MODEL_INVALID, "digest", -1,
                           "the manifest does not match the registry's Docker-Content-Digest");
        goto done;
    }
    json_error_t je;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(root))
        rc = kiri_error_at(info, KIRI_E_MODEL_INVALID, "manifest", -1, "the image manifest is not a JSON object");
    else
        rc = pick_layer(root, &b, info);
    json_decref(root);
    if (rc != KIRI_OK)
        goto done;
    snprintf(b.url, sizeof b.url, "https://%s:%d/v2/%s/blobs/%s", ref->host, ref->port, ref->repo, b.digest);
    emit(log, log_user, "%s/%s: layer %s (%llu bytes, %s%s%s) of %d", ref->host, ref->repo, b.digest,
         (unsigned long long)b.size, b.media_type[0] ? b.media_type : "no media type", b.title[0] ? ", " : "", b.title,
         b.n_layers);
    *out = b;
    b.auth_header = NULL;
done:
    kiri_oci_blob_free(&b);
    kiri_mem_free(body);
    kiri_mem_free(resp);
    kiri_mem_free(url);
    return rc;
}
