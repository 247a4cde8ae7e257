/* The table of compiled-in backends and the start-up choice among them: each is probed (CUDA,
 * then Vulkan, then the CPU, which is always there and always last), the best usable one is
 * initialised, and one that fails to initialise is skipped with its reason. A name forces one. */
#ifndef KIRI_BACKENDS_H
#define KIRI_BACKENDS_H

#include <stddef.h>

struct kiri_backend;
struct kiri_backend_config;
struct kiri_backend_iface;
struct kiri_status_info;

/* Number of compiled-in backends and the i-th (in probe order). */
int kiri_backends_count(void);
const struct kiri_backend_iface *kiri_backends_get(int i);

/* Picks and initialises a backend. want: NULL or "auto" for the best, else a backend name.
 * Appends one line per backend ("cuda: skipped (no driver)", "cpu: picked (avx2)") to report. */
int kiri_backends_pick(const char *want, const struct kiri_backend_config *cfg,
                       const struct kiri_backend_iface **iface, struct kiri_backend **be,
                       char *report, size_t report_cap, struct kiri_status_info *info);

#endif
