/* Signed fleet manifests: what models a device should hold and where to get them, signed with
 * ECDSA P-256 by the fleet operator and checked against keys pinned on the device before any
 * field of it is believed (docs/fleet.md describes the format and the workflow).
 *
 * A signed manifest travels in an envelope, a JSON object of exactly three strings:
 *   {"key_id": "sha256:<hex of SHA-256 of the signer's DER SubjectPublicKeyInfo>",
 *    "manifest": "<base64 of the manifest bytes>",
 *    "signature": "<base64 of the DER ECDSA signature over SHA-256 of those bytes>"}
 * The signature covers the manifest's exact bytes, so no canonical JSON form is needed: the
 * verifier checks the bytes first and parses only bytes that verified.
 *
 * Invariants of a struct kiri_manifest (kiri_manifest_parse or _verify made it):
 * - 1 <= version <= 2^53 - 1; issued <= expires (seconds since 1970 UTC);
 * - 1..KIRI_MANIFEST_MAX_MODELS models with unique names of 1..64 characters from
 *   [A-Za-z0-9._-] not starting with '.', each with 1 <= size <= 2^50, a 32-byte sha256, type
 *   "gguf" and a URL that starts with https:// or oci:// and holds only printable ASCII;
 * - routing is one of "local", "local-first", "upstream-first", "upstream";
 * - upstream_url and heartbeat_url are NULL or https:// URLs.
 */
#ifndef KIRI_FLEET_MANIFEST_H
#define KIRI_FLEET_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "names.h"

struct kiri_status_info;

#define KIRI_MANIFEST_MAX_BYTES (1u << 20)          /* manifest bytes, before base64 */
#define KIRI_MANIFEST_MAX_ENVELOPE (2u << 20)       /* the whole signed envelope */
#define KIRI_MANIFEST_MAX_MODELS 64
#define KIRI_MANIFEST_MAX_NAME KIRI_MODEL_NAME_MAX   /* a name follows base/names.h */
#define KIRI_MANIFEST_MAX_URL 2048
#define KIRI_MANIFEST_MAX_KEYS 8
#define KIRI_MANIFEST_MAX_VERSION ((UINT64_C(1) << 53) - 1)
#define KIRI_MANIFEST_MAX_SIZE (UINT64_C(1) << 50)
#define KIRI_MANIFEST_DEFAULT_MAX_JUMP (UINT64_C(1) << 20)
#define KIRI_MANIFEST_KEY_ID_LEN 71                 /* "sha256:" + 64 hex digits */

struct kiri_manifest_model {
    char name[KIRI_MANIFEST_MAX_NAME + 1];
    char *url;                  /* owned */
    uint64_t size;              /* bytes */
    uint8_t sha256[32];
    char sha256_hex[65];        /* lower-case hex of sha256 */
    char type[8];               /* "gguf" */
};

struct kiri_manifest {
    uint64_t version;
    int64_t issued;             /* seconds since 1970 UTC */
    int64_t expires;
    char routing[16];
    char *upstream_url;         /* owned, or NULL */
    char *heartbeat_url;        /* owned, or NULL */
    int n_models;
    struct kiri_manifest_model *models;   /* owned, n_models */
    uint8_t sha256[32];         /* of the manifest bytes */
    char key_id[KIRI_MANIFEST_KEY_ID_LEN + 1];   /* the signer's, "" when parsed unsigned */
};

/* Parses and validates manifest JSON (no signature involved: for `kiri fleet sign` to check what
 * it signs, and for tests). Duplicate keys, unknown keys and wrong types are refused; errors
 * name the field ("models[1].sha256"). *out is owned by the caller: kiri_manifest_free. */
int kiri_manifest_parse(const void *json, size_t len, struct kiri_manifest **out,
                        struct kiri_status_info *info);
void kiri_manifest_free(struct kiri_manifest *m);

/* ---- Pinned public keys ---- */

/* A set of up to KIRI_MANIFEST_MAX_KEYS P-256 public keys a device trusts (several allow a key
 * rotation: pin the new key beside the old, then re-sign). Opaque. */
struct kiri_manifest_keys;

int kiri_manifest_keys_init(struct kiri_manifest_keys **out);
void kiri_manifest_keys_free(struct kiri_manifest_keys *k);
/* Adds a PEM (or DER) public key; refuses keys that are not ECDSA P-256. */
int kiri_manifest_keys_add(struct kiri_manifest_keys *k, const void *key, size_t len,
                           struct kiri_status_info *info);
int kiri_manifest_keys_count(const struct kiri_manifest_keys *k);

/* ---- Verification ---- */

/* What a new manifest is compared with: the device's stored high-water marks and clock. */
struct kiri_manifest_policy {
    int have_current;           /* 0 on a device that never accepted a manifest */
    uint64_t current_version;   /* the highest version accepted so far */
    uint8_t current_sha256[32]; /* the bytes of that manifest */
    int64_t time_floor;         /* the latest `issued` accepted so far: the clock never goes below */
    double now;                 /* wall-clock seconds since 1970 */
    double skew;                /* seconds of clock error tolerated around `expires` */
    uint64_t max_jump;          /* refuse versions above current (or 0) + max_jump; 0: default */
};

/* Verifies a signed envelope: the key_id names a pinned key, the signature over the manifest
 * bytes verifies with it, the manifest parses, and then the policy holds:
 * - version > current_version, or equal with the same bytes (*same = 1: nothing new; a repeated
 *   sync stays idempotent); lower is a rollback, equal with other bytes a conflict (F02);
 * - version <= current_version (0 when none) + max_jump (F03 fast-forward);
 * - max(now, time_floor) <= expires + skew (F03 freeze, F04 clock set back).
 * On failure the field names the check: "envelope", "key_id", "signature", "manifest" (or a
 * manifest field), "version", "expires". *out owned by the caller. */
int kiri_manifest_verify(const struct kiri_manifest_keys *keys, const void *envelope, size_t len,
                         const struct kiri_manifest_policy *policy, struct kiri_manifest **out,
                         int *same, struct kiri_status_info *info);

/* ---- Keys and signing (the operator's side) ---- */

/* Generates a P-256 key pair as PEM text: *priv_pem (PKCS#8-free SEC1 "EC PRIVATE KEY") and
 * *pub_pem, both owned NUL-terminated strings (kiri_mem_free). */
int kiri_manifest_keygen(char **priv_pem, char **pub_pem, struct kiri_status_info *info);
/* The key id ("sha256:<hex>") of a public or private key given as PEM or DER. */
int kiri_manifest_key_id(const void *key, size_t len, int is_private,
                         char out[KIRI_MANIFEST_KEY_ID_LEN + 1], struct kiri_status_info *info);
/* Checks manifest JSON with kiri_manifest_parse and signs its exact bytes with a P-256 private
 * key (PEM or DER), returning the envelope as an owned NUL-terminated string ending in "\n". */
int kiri_manifest_sign(const void *priv_key, size_t key_len, const void *manifest, size_t len,
                       char **envelope, size_t *envelope_len, struct kiri_status_info *info);

/* Formats seconds since 1970 as "YYYY-MM-DDTHH:MM:SSZ" (out holds 21 bytes). */
void kiri_manifest_format_time(int64_t t, char out[21]);
/* Parses exactly that form (UTC, no fraction, no offset); 0 or -1. */
int kiri_manifest_parse_time(const char *s, int64_t *out);

#endif
