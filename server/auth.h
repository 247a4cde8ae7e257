/* API keys: loaded from a file (one key per line; blank lines and lines starting with '#'
 * ignored; surrounding whitespace trimmed), checked against an "Authorization: Bearer KEY" header
 * in constant time with respect to the key contents. Keys are never logged or echoed. */
#ifndef KIRI_SERVER_AUTH_H
#define KIRI_SERVER_AUTH_H

#include <stddef.h>

struct kiri_auth;
struct kiri_status_info;

/* Loads keys from path (at most 1024 keys of 8..512 bytes each; a file with none is an error). */
int kiri_auth_load(const char *path, struct kiri_auth **out, struct kiri_status_info *info);
void kiri_auth_free(struct kiri_auth *a);
/* Is the Authorization header value (may be NULL) "Bearer <a loaded key>"? 1 yes, 0 no. */
int kiri_auth_check(const struct kiri_auth *a, const char *authorization);

#endif
