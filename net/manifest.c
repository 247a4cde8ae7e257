/* Signed fleet manifests: parsing on Jansson, ECDSA P-256 signatures on mbedTLS (manifest.h).
 *
 * The verifier reads as little as it can before the signature has checked out: the envelope
 * (three base64 strings, strictly decoded), then the signature over the decoded bytes with the
 * pinned key the key_id names, and only then the manifest JSON. Jansson's allocator is left as
 * it is: the server's OpenAI module installs kiri_mem there once per process, and an allocation
 * failure inside json_loadb reads here as a malformed manifest, which is refused either way.
 */
#include "manifest.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "mbedtls/base64.h"
#include "mbedtls/ctr_drbg.h"
#include "mbedtls/ecdsa.h"
#include "mbedtls/ecp.h"
#include "mbedtls/entropy.h"
#include "mbedtls/pk.h"
#include "mbedtls/sha256.h"

#include "error.h"
#include "hex.h"
#include "kiri.h"
#include "mem.h"

/* ---------------------------------------------------------------------------------------------
 * Small helpers: base64, time (hexadecimal is base/hex.h)
 * ------------------------------------------------------------------------------------------- */

/* Strict base64 (RFC 4648 alphabet, padded, no whitespace) into an owned buffer. */
static int b64_decode(const char *s, size_t len, size_t max_out, uint8_t **out, size_t *out_len)
{
    if (len == 0 || len % 4 != 0)
        return -1;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        int ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '+' || c == '/' || (c == '=' && (i == len - 1 || (i == len - 2 && s[len - 1] == '=')));
        if (!ok)
            return -1;
    }
    size_t cap = len / 4 * 3;
    if (cap > max_out + 2)
        return -1;
    uint8_t *buf = kiri_mem_alloc(cap + 1);
    if (!buf)
        return -2;
    size_t n = 0;
    if (mbedtls_base64_decode(buf, cap + 1, &n, (const unsigned char *)s, len) != 0 || n > max_out) {
        kiri_mem_free(buf);
        return -1;
    }
    *out = buf;
    *out_len = n;
    return 0;
}

/* Days since 1970-01-01 of a proleptic Gregorian date (the civil-calendar formula). */
static int64_t days_from_civil(int64_t y, int m, int d)
{
    y -= m <= 2;
    const int64_t era = (y >= 0 ? y : y - 399) / 400;
    const int64_t yoe = y - era * 400;
    const int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    const int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

int kiri_manifest_parse_time(const char *s, int64_t *out)
{
    /* YYYY-MM-DDTHH:MM:SSZ */
    static const char shape[] = "dddd-dd-ddTdd:dd:ddZ";
    if (strlen(s) != sizeof shape - 1)
        return -1;
    for (size_t i = 0; i < sizeof shape - 1; i++) {
        if (shape[i] == 'd' ? (s[i] < '0' || s[i] > '9') : s[i] != shape[i])
            return -1;
    }
#define NUM2(p) ((s[p] - '0') * 10 + (s[(p) + 1] - '0'))
    int y = NUM2(0) * 100 + NUM2(2), mo = NUM2(5), d = NUM2(8), h = NUM2(11), mi = NUM2(14), se = NUM2(17);
#undef NUM2
    static const int mdays[12] = {31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    if (y < 1970 || mo < 1 || mo > 12 || d < 1 || d > mdays[mo - 1] || (mo == 2 && d == 29 && !leap) ||
        h > 23 || mi > 59 || se > 59)
        return -1;
    *out = days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + se;
    return 0;
}

void kiri_manifest_format_time(int64_t t, char out[21])
{
    int64_t days = t >= 0 ? t / 86400 : (t - 86399) / 86400, rem = t - days * 86400;
    /* civil_from_days */
    days += 719468;
    const int64_t era = (days >= 0 ? days : days - 146096) / 146097;
    const int64_t doe = days - era * 146097;
    const int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    const int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    const int64_t mp = (5 * doy + 2) / 153;
    const int d = (int)(doy - (153 * mp + 2) / 5 + 1);
    const int m = (int)(mp < 10 ? mp + 3 : mp - 9);
    const int64_t y = yoe + era * 400 + (m <= 2);
    char tmp[64];
    snprintf(tmp, sizeof tmp, "%04lld-%02d-%02dT%02d:%02d:%02dZ", (long long)(y % 10000), m, d, (int)(rem / 3600),
             (int)(rem / 60 % 60), (int)(rem % 60));
    memcpy(out, tmp, 20);
    out[20] = '\0';
}

static void sha256(const void *data, size_t len, uint8_t out[32])
{
    mbedtls_sha256((const unsigned char *)data, len, out, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------------------------- */

void kiri_manifest_free(struct kiri_manifest *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_models; i++)
        kiri_mem_free(m->models[i].url);
    kiri_mem_free(m->models);
    kiri_mem_free(m->upstream_url);
    kiri_mem_free(m->heartbeat_url);
    kiri_mem_free(m);
}

/* Refuses keys of obj outside the NULL-terminated list allowed; field prefix for the message. */
static int only_keys(json_t *obj, const char *const *allowed, const char *where, struct kiri_status_info *info)
{
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v) {
        int known = 0;
        for (const char *const *a = allowed; *a; a++)
            known |= strcmp(key, *a) == 0;
        if (!known)
            return kiri_error_at(info, KIRI_E_INVALID_ARG, where, -1, "%s: unknown key \"%.64s\"",
                                 where, key);
    }
    return KIRI_OK;
}

/* Printable ASCII without spaces, quotes or backslashes, 1..max bytes, starting with one of the
 * schemes (NULL-terminated list). */
static int url_ok(const char *s, size_t len, const char *const *schemes, size_t max)
{
    if (len == 0 || len > max || strlen(s) != len)
        return 0;
    for (size_t i = 0; i < len; i++)
        if (s[i] <= ' ' || s[i] > '~' || s[i] == '"' || s[i] == '\\' || s[i] == '<' || s[i] == '>')
            return 0;
    for (const char *const *p = schemes; *p; p++) {
        size_t n = strlen(*p);
        if (len > n && strncmp(s, *p, n) == 0 && s[n] != '/')
            return 1;
    }
    return 0;
}

static const char *const https_only[] = {"https://", NULL};
static const char *const model_schemes[] = {"https://", "oci://", NULL};

static int get_time(json_t *root, const char *key, int64_t *out, struct kiri_status_info *info)
{
    json_t *v = json_object_get(root, key);
    if (!v)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, key, -1, "%s is missing", key);
    if (!json_is_string(v) || kiri_manifest_parse_time(json_string_value(v), out) != 0)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, key, -1,
                             "%s must be a UTC time written YYYY-MM-DDTHH:MM:SSZ", key);
    return KIRI_OK;
}

/* Copies an optional https URL member into an owned string (NULL when absent). */
static int get_url(json_t *root, const char *key, char **out, struct kiri_status_info *info)
{
    json_t *v = json_object_get(root, key);
    *out = NULL;
    if (!v)
        return KIRI_OK;
    if (!json_is_string(v) || !url_ok(json_string_value(v), json_string_length(v), https_only, KIRI_MANIFEST_MAX_URL))
        return kiri_error_at(info, KIRI_E_INVALID_ARG, key, -1, "%s must be an https:// URL of at most %d bytes",
                             key, KIRI_MANIFEST_MAX_URL);
    *out = kiri_mem_strndup(json_string_value(v), json_string_length(v));
    return *out ? KIRI_OK : kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading the manifest");
}

static int parse_model(json_t *e, int i, struct kiri_manifest_model *m, struct kiri_status_info *info)
{
    char f[48];
    snprintf(f, sizeof f, "models[%d]", i);
    if (!json_is_object(e))
        return kiri_error_at(info, KIRI_E_INVALID_ARG, f, -1, "%s must be an object", f);
    static const char *const keys[] = {"name", "url", "size", "sha256", "type", NULL};
    int rc = only_keys(e, keys, f, info);
    if (rc)
        return rc;
    json_t *name = json_object_get(e, "name"), *url = json_object_get(e, "url"),
           *size = json_object_get(e, "size"), *hash = json_object_get(e, "sha256"),
           *type = json_object_get(e, "type");
    snprintf(f, sizeof f, "models[%d].name", i);
    if (!json_is_string(name) || !kiri_model_name_ok(json_string_value(name), json_string_length(name)))
        return kiri_error_at(info, KIRI_E_INVALID_ARG, f, -1,
                             "%s must be 1..64 characters of A-Z a-z 0-9 . _ - not starting with '.'", f);
    snprintf(m->name, sizeof m->name, "%s", json_string_value(name));
    snprintf(f, sizeof f, "models[%d].url", i);
    if (!json_is_string(url) || !url_ok(json_string_value(url), json_string_length(url), model_schemes, KIRI_MANIFEST_MAX_URL))
        return kiri_error_at(info, KIRI_E_INVALID_ARG, f, -1, "%s must be an https:// or oci:// reference", f);
    snprintf(f, sizeof f, "models[%d].size", i);
    if (!json_is_integer(size) || json_integer_value(size) < 1 ||
        (uint64_t)json_integer_value(size) > KIRI_MANIFEST_MAX_SIZE)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, f, -1, "%s must be an integer in [1, 2^50]", f);
    m->size = (uint64_t)json_integer_value(size);
    snprintf(f, sizeof f, "models[%d].sha256", i);
    if (!json_is_string(hash) || kiri_hex_decode_str(json_string_value(hash), m->sha256, 32) != 0)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, f, -1, "%s must be 64 hex digits", f);
    kiri_hex_encode(m->sha256, 32, m->sha256_hex);
    snprintf(f, sizeof f, "models[%d].type", i);
    if (type && (!json_is_string(type) || strcmp(json_string_value(type), "gguf") != 0))
        return kiri_error_at(info, KIRI_E_UNSUPPORTED, f, -1, "%s: only \"gguf\" models are supported", f);
    snprintf(m->type, sizeof m->type, "gguf");
    m->url = kiri_mem_strndup(json_string_value(url), json_string_length(url));
    return m->url ? KIRI_OK : kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading the manifest");
}

static int parse_root(json_t *root, struct kiri_manifest *m, struct kiri_status_info *info)
{
    if (!json_is_object(root))
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "manifest", -1, "the manifest must be a JSON object");
    static const char *const keys[] = {"version", "issued", "expires", "models", "routing",
                                       "upstream_url", "heartbeat_url", NULL};
    int rc = only_keys(root, keys, "manifest", info);
    if (rc)
        return rc;
    json_t *v = json_object_get(root, "version");
    if (!json_is_integer(v) || json_integer_value(v) < 1 ||
        (uint64_t)json_integer_value(v) > KIRI_MANIFEST_MAX_VERSION)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "version", -1, "version must be an integer in [1, 2^53 - 1]");
    m->version = (uint64_t)json_integer_value(v);
    if ((rc = get_time(root, "issued", &m->issued, info)) || (rc = get_time(root, "expires", &m->expires, info)))
        return rc;
    if (m->expires < m->issued)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "expires", -1, "expires is before issued");
    json_t *r = json_object_get(root, "routing");
    snprintf(m->routing, sizeof m->routing, "local");
    if (r) {
        const char *s = json_is_string(r) ? json_string_value(r) : "";
        if (strcmp(s, "local") && strcmp(s, "local-first") && strcmp(s, "upstream-first") && strcmp(s, "upstream"))
            return kiri_error_at(info, KIRI_E_INVALID_ARG, "routing", -1,
                                 "routing must be \"local\", \"local-first\", \"upstream-first\" or \"upstream\"");
        snprintf(m->routing, sizeof m->routing, "%s", s);
    }
    if ((rc = get_url(root, "upstream_url", &m->upstream_url, info)) ||
        (rc = get_url(root, "heartbeat_url", &m->heartbeat_url, info)))
        return rc;
    json_t *models = json_object_get(root, "models");
    if (!json_is_array(models) || json_array_size(models) < 1 || json_array_size(models) > KIRI_MANIFEST_MAX_MODELS)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "models", -1, "models must be an array of 1..%d entries",
                             KIRI_MANIFEST_MAX_MODELS);
    size_t n = json_array_size(models);
    m->models = kiri_mem_calloc(n, sizeof *m->models);
    if (!m->models)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading the manifest");
    for (size_t i = 0; i < n; i++) {
        m->n_models = (int)i + 1; /* so free releases what this entry allocates */
        if ((rc = parse_model(json_array_get(models, i), (int)i, &m->models[i], info)))
            return rc;
        for (size_t j = 0; j < i; j++)
            if (strcmp(m->models[j].name, m->models[i].name) == 0) {
                char f[48];
                snprintf(f, sizeof f, "models[%zu].name", i);
                return kiri_error_at(info, KIRI_E_INVALID_ARG, f, -1, "model name \"%s\" appears twice",
                                     m->models[i].name);
            }
    }
    return KIRI_OK;
}

int kiri_manifest_parse(const void *json, size_t len, struct kiri_manifest **out, struct kiri_status_info *info)
{
    if (len > KIRI_MANIFEST_MAX_BYTES)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "manifest", -1, "the manifest is larger than %u bytes",
                             KIRI_MANIFEST_MAX_BYTES);
    json_error_t je;
    json_t *root = json_loadb(json ? json : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "manifest", (int64_t)je.position,
                             "the manifest is not valid JSON: %s", je.text);
    struct kiri_manifest *m = kiri_mem_calloc(1, sizeof *m);
    if (!m) {
        json_decref(root);
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading the manifest");
    }
    int rc = parse_root(root, m, info);
    json_decref(root);
    if (rc != KIRI_OK) {
        kiri_manifest_free(m);
        return rc;
    }
    sha256(json, len, m->sha256);
    *out = m;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Keys
 * ------------------------------------------------------------------------------------------- */

struct kiri_manifest_keys {
    int n;
    mbedtls_pk_context pk[KIRI_MANIFEST_MAX_KEYS];
    char id[KIRI_MANIFEST_MAX_KEYS][KIRI_MANIFEST_KEY_ID_LEN + 1];
};

int kiri_manifest_keys_init(struct kiri_manifest_keys **out)
{
    struct kiri_manifest_keys *k = kiri_mem_calloc(1, sizeof *k);
    if (!k)
        return KIRI_E_NOMEM;
    *out = k;
    return KIRI_OK;
}

void kiri_manifest_keys_free(struct kiri_manifest_keys *k)
{
    if (!k)
        return;
    for (int i = 0; i < k->n; i++)
        mbedtls_pk_free(&k->pk[i]);
    kiri_mem_free(k);
}

int kiri_manifest_keys_count(const struct kiri_manifest_keys *k) { return k ? k->n : 0; }

static int is_p256(const mbedtls_pk_context *pk)
{
    return mbedtls_pk_get_type(pk) == MBEDTLS_PK_ECKEY &&
           mbedtls_ecp_keypair_get_group_id(mbedtls_pk_ec(*pk)) == MBEDTLS_ECP_DP_SECP256R1;
}

/* The key id of a parsed key: SHA-256 of its DER SubjectPublicKeyInfo. */
static int pk_key_id(mbedtls_pk_context *pk, char out[KIRI_MANIFEST_KEY_ID_LEN + 1])
{
    unsigned char der[256];
    int n = mbedtls_pk_write_pubkey_der(pk, der, sizeof der);
    if (n <= 0)
        return -1;
    uint8_t h[32];
    sha256(der + sizeof der - (size_t)n, (size_t)n, h);
    memcpy(out, "sha256:", 7);
    kiri_hex_encode(h, 32, out + 7);
    return 0;
}

/* mbedTLS wants PEM text to include its terminating NUL in the length. */
static int with_nul(const void *key, size_t len, unsigned char **buf, size_t *blen)
{
    *buf = kiri_mem_alloc(len + 1);
    if (!*buf)
        return KIRI_E_NOMEM;
    memcpy(*buf, key, len);
    (*buf)[len] = 0;
    /* PEM is text ending at its NUL; DER may hold zeros and keeps its exact length. */
    *blen = len > 0 && memchr(key, 0, len) == NULL && strstr((const char *)*buf, "-----BEGIN") ? len + 1 : len;
    return KIRI_OK;
}

int kiri_manifest_keys_add(struct kiri_manifest_keys *k, const void *key, size_t len, struct kiri_status_info *info)
{
    if (k->n == KIRI_MANIFEST_MAX_KEYS)
        return kiri_error_set(info, KIRI_E_INVALID_ARG, "at most %d pinned keys", KIRI_MANIFEST_MAX_KEYS);
    unsigned char *buf;
    size_t blen;
    if (with_nul(key, len, &buf, &blen) != KIRI_OK)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading a public key");
    mbedtls_pk_context *pk = &k->pk[k->n];
    mbedtls_pk_init(pk);
    int r = mbedtls_pk_parse_public_key(pk, buf, blen);
    kiri_mem_free(buf);
    if (r != 0) {
        mbedtls_pk_free(pk);
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "key", -1, "not a public key in PEM or DER (mbedTLS -0x%04x)", -r);
    }
    if (!is_p256(pk)) {
        mbedtls_pk_free(pk);
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "key", -1, "not an ECDSA P-256 public key");
    }
    if (pk_key_id(pk, k->id[k->n]) != 0) {
        mbedtls_pk_free(pk);
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "key", -1, "cannot encode the public key");
    }
    k->n++;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Verification
 * ------------------------------------------------------------------------------------------- */

/* Reads the envelope: its three strings, with the manifest and signature decoded. */
static int read_envelope(const void *envelope, size_t len, char key_id[KIRI_MANIFEST_KEY_ID_LEN + 1],
                         uint8_t **manifest, size_t *manifest_len, uint8_t **sig, size_t *sig_len,
                         struct kiri_status_info *info)
{
    if (len > KIRI_MANIFEST_MAX_ENVELOPE)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "envelope", -1, "the signed manifest is larger than %u bytes",
                             KIRI_MANIFEST_MAX_ENVELOPE);
    json_error_t je;
    json_t *root = json_loadb(envelope ? envelope : "", len, JSON_REJECT_DUPLICATES, &je);
    if (!root)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "envelope", (int64_t)je.position,
                             "the signed manifest is not valid JSON: %s", je.text);
    static const char *const keys[] = {"key_id", "manifest", "signature", NULL};
    int rc = KIRI_OK;
    json_t *kid = json_object_get(root, "key_id"), *man = json_object_get(root, "manifest"),
           *sg = json_object_get(root, "signature");
    if (!json_is_object(root))
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "envelope", -1, "the signed manifest must be a JSON object");
    else if ((rc = only_keys(root, keys, "envelope", info)) != KIRI_OK)
        ;
    else if (!json_is_string(man) || !json_is_string(sg))
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "signature", -1,
                           "unsigned: the envelope needs \"manifest\" and \"signature\" strings");
    else if (!json_is_string(kid) || json_string_length(kid) != KIRI_MANIFEST_KEY_ID_LEN)
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "key_id", -1, "key_id must be \"sha256:\" and 64 hex digits");
    if (rc != KIRI_OK) {
        json_decref(root);
        return rc;
    }
    memcpy(key_id, json_string_value(kid), KIRI_MANIFEST_KEY_ID_LEN + 1);
    int r = b64_decode(json_string_value(man), json_string_length(man), KIRI_MANIFEST_MAX_BYTES, manifest, manifest_len);
    if (r == 0) {
        r = b64_decode(json_string_value(sg), json_string_length(sg), MBEDTLS_ECDSA_MAX_LEN, sig, sig_len);
        if (r != 0) {
            kiri_mem_free(*manifest);
            rc = r == -2 ? kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading the signed manifest")
                         : kiri_error_at(info, KIRI_E_INVALID_ARG, "signature", -1, "signature is not base64 of at most %d bytes",
                                         MBEDTLS_ECDSA_MAX_LEN);
        }
    } else {
        rc = r == -2 ? kiri_error_set(info, KIRI_E_NOMEM, "out of memory reading the signed manifest")
                     : kiri_error_at(info, KIRI_E_INVALID_ARG, "envelope", -1, "manifest is not base64 of at most %u bytes",
                                     KIRI_MANIFEST_MAX_BYTES);
    }
    json_decref(root);
    return rc;
}

int kiri_manifest_verify(const struct kiri_manifest_keys *keys, const void *envelope, size_t len,
                         const struct kiri_manifest_policy *pol, struct kiri_manifest **out, int *same,
                         struct kiri_status_info *info)
{
    char key_id[KIRI_MANIFEST_KEY_ID_LEN + 1];
    uint8_t *bytes = NULL, *sig = NULL;
    size_t n_bytes = 0, n_sig = 0;
    int rc = read_envelope(envelope, len, key_id, &bytes, &n_bytes, &sig, &n_sig, info);
    if (rc != KIRI_OK)
        return rc;
    int k = -1;
    for (int i = 0; keys && i < keys->n; i++)
        if (strcmp(keys->id[i], key_id) == 0)
            k = i;
    struct kiri_manifest *m = NULL;
    uint8_t h[32];
    sha256(bytes, n_bytes, h);
    if (k < 0) {
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "key_id", -1, "signed by an unknown key (%.23s...)", key_id);
    } else if (mbedtls_pk_verify((mbedtls_pk_context *)&keys->pk[k], MBEDTLS_MD_SHA256, h, sizeof h, sig, n_sig) != 0) {
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "signature", -1,
                           "the signature does not verify: the manifest was altered or signed by another key");
    } else {
        rc = kiri_manifest_parse(bytes, n_bytes, &m, info);
    }
    kiri_mem_free(bytes);
    kiri_mem_free(sig);
    if (rc != KIRI_OK)
        return rc;
    memcpy(m->key_id, key_id, sizeof m->key_id);

    int is_same = 0;
    const uint64_t jump = pol->max_jump ? pol->max_jump : KIRI_MANIFEST_DEFAULT_MAX_JUMP;
    const uint64_t base = pol->have_current ? pol->current_version : 0;
    if (pol->have_current && m->version < pol->current_version) {
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "version", -1,
                           "rollback refused: version %llu is older than the accepted version %llu",
                           (unsigned long long)m->version, (unsigned long long)pol->current_version);
    } else if (pol->have_current && m->version == pol->current_version) {
        if (memcmp(m->sha256, pol->current_sha256, 32) != 0)
            rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "version", -1,
                               "version %llu was already accepted with different contents",
                               (unsigned long long)m->version);
        is_same = 1;
    } else if (m->version - base > jump) {
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "version", -1,
                           "version %llu jumps more than %llu past the accepted version %llu",
                           (unsigned long long)m->version, (unsigned long long)jump, (unsigned long long)base);
    }
    const double now = pol->now > (double)pol->time_floor ? pol->now : (double)pol->time_floor;
    if (rc == KIRI_OK && now > (double)m->expires + pol->skew) {
        char when[21];
        kiri_manifest_format_time(m->expires, when);
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "expires", -1, "the manifest expired at %s%s", when,
                           pol->now < (double)pol->time_floor ? " (the clock is behind the last accepted manifest)" : "");
    }
    if (rc != KIRI_OK) {
        kiri_manifest_free(m);
        return rc;
    }
    *out = m;
    *same = is_same;
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * Keys and signing
 * ------------------------------------------------------------------------------------------- */

struct rng {
    mbedtls_entropy_context entropy;
    mbedtls_ctr_drbg_context drbg;
};

static int rng_init(struct rng *r)
{
    static const char pers[] = "kiri-fleet-manifest";
    mbedtls_entropy_init(&r->entropy);
    mbedtls_ctr_drbg_init(&r->drbg);
    return mbedtls_ctr_drbg_seed(&r->drbg, mbedtls_entropy_func, &r->entropy, (const unsigned char *)pers,
                                 sizeof pers - 1);
}

static void rng_free(struct rng *r)
{
    mbedtls_ctr_drbg_free(&r->drbg);
    mbedtls_entropy_free(&r->entropy);
}

int kiri_manifest_keygen(char **priv_pem, char **pub_pem, struct kiri_status_info *info)
{
    struct rng r;
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    enum { CAP = 1024 };
    char *priv = kiri_mem_calloc(1, CAP), *pub = kiri_mem_calloc(1, CAP);
    int rc = KIRI_OK, e;
    if (!priv || !pub)
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory generating a key");
    else if ((e = rng_init(&r)) != 0)
        rc = kiri_error_set(info, KIRI_E_IO, "cannot seed the random generator (mbedTLS -0x%04x)", -e);
    else {
        if ((e = mbedtls_pk_setup(&pk, mbedtls_pk_info_from_type(MBEDTLS_PK_ECKEY))) != 0 ||
            (e = mbedtls_ecp_gen_key(MBEDTLS_ECP_DP_SECP256R1, mbedtls_pk_ec(pk), mbedtls_ctr_drbg_random, &r.drbg)) != 0 ||
            (e = mbedtls_pk_write_key_pem(&pk, (unsigned char *)priv, CAP)) != 0 ||
            (e = mbedtls_pk_write_pubkey_pem(&pk, (unsigned char *)pub, CAP)) != 0)
            rc = kiri_error_set(info, KIRI_E_IO, "cannot generate a P-256 key (mbedTLS -0x%04x)", -e);
        rng_free(&r);
    }
    mbedtls_pk_free(&pk);
    if (rc != KIRI_OK) {
        if (priv)
            memset(priv, 0, CAP);
        kiri_mem_free(priv);
        kiri_mem_free(pub);
        return rc;
    }
    *priv_pem = priv;
    *pub_pem = pub;
    return KIRI_OK;
}

static int parse_any_key(mbedtls_pk_context *pk, const void *key, size_t len, int is_private, struct rng *r)
{
    unsigned char *buf;
    size_t blen;
    if (with_nul(key, len, &buf, &blen) != KIRI_OK)
        return MBEDTLS_ERR_PK_ALLOC_FAILED;
    int e = is_private ? mbedtls_pk_parse_key(pk, buf, blen, NULL, 0, mbedtls_ctr_drbg_random, &r->drbg)
                       : mbedtls_pk_parse_public_key(pk, buf, blen);
    memset(buf, 0, len);
    kiri_mem_free(buf);
    return e;
}

int kiri_manifest_key_id(const void *key, size_t len, int is_private, char out[KIRI_MANIFEST_KEY_ID_LEN + 1],
                         struct kiri_status_info *info)
{
    struct rng r;
    int e = rng_init(&r);
    if (e != 0)
        return kiri_error_set(info, KIRI_E_IO, "cannot seed the random generator (mbedTLS -0x%04x)", -e);
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    int rc = KIRI_OK;
    if ((e = parse_any_key(&pk, key, len, is_private, &r)) != 0 || !is_p256(&pk))
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "key", -1, "not an ECDSA P-256 %s key", is_private ? "private" : "public");
    else if (pk_key_id(&pk, out) != 0)
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "key", -1, "cannot encode the public key");
    mbedtls_pk_free(&pk);
    rng_free(&r);
    return rc;
}

int kiri_manifest_sign(const void *priv_key, size_t key_len, const void *manifest, size_t len, char **envelope,
                       size_t *envelope_len, struct kiri_status_info *info)
{
    struct kiri_manifest *m = NULL;
    int rc = kiri_manifest_parse(manifest, len, &m, info);
    if (rc != KIRI_OK)
        return rc;
    kiri_manifest_free(m);

    struct rng r;
    int e = rng_init(&r);
    if (e != 0)
        return kiri_error_set(info, KIRI_E_IO, "cannot seed the random generator (mbedTLS -0x%04x)", -e);
    mbedtls_pk_context pk;
    mbedtls_pk_init(&pk);
    char key_id[KIRI_MANIFEST_KEY_ID_LEN + 1];
    unsigned char sig[MBEDTLS_ECDSA_MAX_LEN];
    size_t n_sig = 0;
    uint8_t h[32];
    sha256(manifest, len, h);
    char *out = NULL;
    if ((e = parse_any_key(&pk, priv_key, key_len, 1, &r)) != 0 || !is_p256(&pk) || pk_key_id(&pk, key_id) != 0) {
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "key", -1, "not an ECDSA P-256 private key in PEM or DER");
    } else if ((e = mbedtls_pk_sign(&pk, MBEDTLS_MD_SHA256, h, sizeof h, sig, sizeof sig, &n_sig,
                                    mbedtls_ctr_drbg_random, &r.drbg)) != 0) {
        rc = kiri_error_set(info, KIRI_E_IO, "signing failed (mbedTLS -0x%04x)", -e);
    } else {
        size_t b64_man = (len + 2) / 3 * 4, b64_sig = (n_sig + 2) / 3 * 4;
        size_t cap = b64_man + b64_sig + KIRI_MANIFEST_KEY_ID_LEN + 64;
        out = kiri_mem_alloc(cap);
        size_t pos = 0, w = 0;
        if (!out) {
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory signing the manifest");
        } else {
            pos += (size_t)snprintf(out, cap, "{\"key_id\":\"%s\",\"manifest\":\"", key_id);
            mbedtls_base64_encode((unsigned char *)out + pos, cap - pos, &w, manifest, len);
            pos += w;
            pos += (size_t)snprintf(out + pos, cap - pos, "\",\"signature\":\"");
            mbedtls_base64_encode((unsigned char *)out + pos, cap - pos, &w, sig, n_sig);
            pos += w;
            pos += (size_t)snprintf(out + pos, cap - pos, "\"}\n");
            *envelope = out;
            *envelope_len = pos;
        }
    }
    mbedtls_pk_free(&pk);
    rng_free(&r);
    return rc;
}
