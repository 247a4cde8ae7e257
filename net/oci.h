/* Finding a GGUF model in an OCI registry (the distribution API v2, as Docker Hub, GHCR, the
 * CNCF distribution registry and Ollama's registry speak it): parse a reference, fetch its image
 * manifest (OCI or Docker v2 schema 2), pick the layer holding the model, and hand back the
 * blob's URL, digest and size, so the download module fetches and verifies it like any other
 * model file. Registries that answer 401 with a Bearer challenge get an anonymous token from the
 * realm named in the challenge (which must be https:// on the registry's host or an allowlisted
 * one); the token then goes with every request to the registry's host.
 *
 * The layer is, in order of preference: the first layer whose media type is
 * application/vnd.ollama.image.model or contains "gguf"; else the first whose
 * org.opencontainers.image.title annotation ends in ".gguf"; else the largest layer.
 */
#ifndef KIRI_FLEET_OCI_H
#define KIRI_FLEET_OCI_H

#include <stddef.h>
#include <stdint.h>

struct kiri_status_info;
struct kiri_https_client;

/* host[:port]/repo[/more]:tag or host[:port]/repo@sha256:<64 hex>, optionally after "oci://".
 * The tag defaults to "latest". The host must contain '.' or ':' or be "localhost" (so
 * "library/x" is not mistaken for a host). */
struct kiri_oci_ref {
    char host[256];
    int port;                  /* 443 unless given */
    char repo[256];            /* lower-case path components [a-z0-9._-/] */
    char tag[129];             /* "" when a digest is given */
    char digest[72];           /* "sha256:<hex>" or "" */
};

int kiri_oci_parse_ref(const char *ref, struct kiri_oci_ref *out);

/* The chosen layer and how to fetch it. */
struct kiri_oci_blob {
    char digest[72];           /* "sha256:<hex>" */
    uint8_t sha256[32];
    uint64_t size;
    char media_type[128];
    char title[128];           /* the title annotation, or "" */
    char url[2048];            /* https://host:port/v2/<repo>/blobs/<digest> */
    char *auth_header;         /* owned "Authorization: Bearer <token>", or NULL */
    int n_layers;
};

/* Resolves ref to its model layer (see the top of this header). Errors: KIRI_E_INVALID_ARG (bad
 * reference), KIRI_E_IO (network, HTTP status: field "http"), KIRI_E_UNSUPPORTED (an image
 * index, a schema-1 manifest), KIRI_E_MODEL_INVALID (a manifest that does not match its digest
 * or is malformed: field "digest" or "manifest"). *out is filled only on success; release it
 * with kiri_oci_blob_free. log may be NULL. */
int kiri_oci_resolve(struct kiri_https_client *c, const struct kiri_oci_ref *ref, struct kiri_oci_blob *out,
                     void (*log)(void *user, const char *line), void *log_user, struct kiri_status_info *info);
void kiri_oci_blob_free(struct kiri_oci_blob *b);

/* Parses the WWW-Authenticate value of a Bearer challenge into realm, service and scope
 * (each "" when absent). 0, or -1 when it is not a Bearer challenge. For tests. */
int kiri_oci_parse_challenge(const char *v, char *realm, size_t realm_cap, char *service, size_t service_cap,
                             char *scope, size_t scope_cap);

#endif
