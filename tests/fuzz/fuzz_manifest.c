/* libFuzzer target for the fleet manifest (net/manifest.c). Each input is read three
 * ways: as manifest JSON by kiri_manifest_parse; as a signed envelope by kiri_manifest_verify with
 * a fixed pinned key, so the envelope reader, the strict base64 decoder and the DER signature
 * check see arbitrary bytes; and, when the input parses as a manifest, wrapped in an envelope
 * signed with that key, so the version and time rules run on whatever the parser accepted.
 * Accepted manifests are checked against the invariants manifest.h states.
 *
 * Build: cmake -DKIRI_FUZZ=ON (CC=clang) --target fuzz_manifest
 * Run:   ./fuzz_manifest -max_total_time=60 corpus/ tests/fuzz/seeds/manifest/
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiri.h"
#include "manifest.h"
#include "mem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A fixed P-256 key pair made for this target only (not used anywhere else). */
static const char priv_pem[] =
    "-----BEGIN EC PRIVATE KEY-----\n"
    "MHcCAQEEIEf13VZ+NB3uSbb06kCsznumuBpfcsBMs6q9Kljxt62goAoGCCqGSM49\n"
    "AwEHoUQDQgAETDdEwypvbNZp3+8yceiESViIpXP9Y98fpxh0EbFEoc+Zaj2dwGVW\n"
    "CVcDXbeQWfhjIiX2G0rFP2On/ZmFbCEkdQ==\n"
    "-----END EC PRIVATE KEY-----\n";
static const char pub_pem[] =
    "-----BEGIN PUBLIC KEY-----\n"
    "MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAETDdEwypvbNZp3+8yceiESViIpXP9\n"
    "Y98fpxh0EbFEoc+Zaj2dwGVWCVcDXbeQWfhjIiX2G0rFP2On/ZmFbCEkdQ==\n"
    "-----END PUBLIC KEY-----\n";

static struct kiri_manifest_keys *keys;

static void check(const struct kiri_manifest *m)
{
    if (m->version < 1 || m->version > KIRI_MANIFEST_MAX_VERSION || m->expires < m->issued || m->n_models < 1 ||
        m->n_models > KIRI_MANIFEST_MAX_MODELS)
        abort();
    for (int i = 0; i < m->n_models; i++) {
        const struct kiri_manifest_model *x = &m->models[i];
        size_t n = strlen(x->name);
        if (n < 1 || n > KIRI_MANIFEST_MAX_NAME || x->name[0] == '.' || strchr(x->name, '/') || x->size < 1 ||
            x->size > KIRI_MANIFEST_MAX_SIZE || strlen(x->sha256_hex) != 64 || !x->url ||
            (strncmp(x->url, "https://", 8) != 0 && strncmp(x->url, "oci://", 6) != 0))
            abort();
        for (int j = 0; j < i; j++)
            if (strcmp(m->models[j].name, x->name) == 0)
                abort();
    }
    if (m->upstream_url && strncmp(m->upstream_url, "https://", 8) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kiri_status_info info;
    if (!keys) {
        if (kiri_manifest_keys_init(&keys) != KIRI_OK || kiri_manifest_keys_add(keys, pub_pem, strlen(pub_pem), &info) != KIRI_OK)
            abort();
    }
    struct kiri_manifest_policy pol;
    memset(&pol, 0, sizeof pol);
    pol.now = 1735689600.0;
    pol.skew = 300;
    if (size > 0) {
        pol.have_current = data[0] & 1;
        pol.current_version = data[0] >> 1;
    }

    struct kiri_manifest *m = NULL;
    if (kiri_manifest_parse(data, size, &m, &info) == KIRI_OK) {
        check(m);
        kiri_manifest_free(m);
        m = NULL;
        char *env = NULL;
        size_t len = 0;
        if (kiri_manifest_sign(priv_pem, strlen(priv_pem), data, size, &env, &len, &info) != KIRI_OK)
            abort(); /* it parsed, so it must sign */
        int same = 0;
        if (kiri_manifest_verify(keys, env, len, &pol, &m, &same, &info) == KIRI_OK) {
            check(m);
            if (memcmp(m->key_id, "sha256:", 7) != 0)
                abort();
        } else if (strcmp(info.field, "version") != 0 && strcmp(info.field, "expires") != 0) {
            abort(); /* a signed, parsable manifest can only fail the policy */
        }
        kiri_manifest_free(m);
        kiri_mem_free(env);
        m = NULL;
    }
    int same = 0;
    if (kiri_manifest_verify(keys, data, size, &pol, &m, &same, &info) == KIRI_OK)
        check(m);
    kiri_manifest_free(m);
    return 0;
}
