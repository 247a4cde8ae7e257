#include "backends.h"

#include <stdio.h>
#include <string.h>

#include "backend.h"
#include "error.h"
#include "kiri.h"

/* Backends register here; CMake decides which are compiled in. */
extern const struct kiri_backend_iface kiri_cpu_backend_iface;
#ifdef KIRI_WITH_CUDA
extern const struct kiri_backend_iface kiri_cuda_backend_iface;
#endif
#ifdef KIRI_WITH_VULKAN
extern const struct kiri_backend_iface kiri_vulkan_backend_iface;
#endif

static const struct kiri_backend_iface *const table[] = {
#ifdef KIRI_WITH_CUDA
    &kiri_cuda_backend_iface,
#endif
#ifdef KIRI_WITH_VULKAN
    &kiri_vulkan_backend_iface,
#endif
    &kiri_cpu_backend_iface,
};

int kiri_backends_count(void) { return (int)(sizeof table / sizeof table[0]); }

const struct kiri_backend_iface *kiri_backends_get(int i)
{
    return i >= 0 && i < kiri_backends_count() ? table[i] : NULL;
}

static void append(char *report, size_t cap, const char *fmt, const char *a, const char *b)
{
    if (!report || !cap)
        return;
    size_t used = strnlen(report, cap);
    if (used + 1 < cap)
        snprintf(report + used, cap - used, fmt, a, b);
}

int kiri_backends_pick(const char *want, const struct kiri_backend_config *cfg,
                       const struct kiri_backend_iface **iface, struct kiri_backend **be,
                       char *report, size_t report_cap, struct kiri_status_info *info)
{
    const int any = !want || !*want || strcmp(want, "auto") == 0;
    if (report && report_cap)
        report[0] = '\0';
    int known = any;
    for (int i = 0; i < kiri_backends_count(); i++)
        if (!any && strcmp(table[i]->name, want) == 0)
            known = 1;
    if (!known)
        return kiri_error_set(info, KIRI_E_INVALID_ARG,
                              "backend '%s' is not compiled into this build", want);

    /* Probe all, then try them best score first; ties keep table order (GPUs before the CPU). */
    int score[8] = {0};
    char why[8][160];
    struct kiri_backend_config probe_cfg = *cfg;
    probe_cfg.automatic = any;
    for (int i = 0; i < kiri_backends_count() && i < 8; i++) {
        why[i][0] = '\0';
        if (!any && strcmp(table[i]->name, want) != 0) {
            snprintf(why[i], sizeof why[i], "not requested");
            continue;
        }
        score[i] = table[i]->probe(&probe_cfg, why[i], sizeof why[i]);
        /* A name forces its backend even when the probe scores it 0, which also means "usable
         * but never preferred" (Vulkan on a software renderer); if it cannot run, its init
         * fails and says why. */
        if (!any && score[i] <= 0)
            score[i] = 1;
    }
    for (;;) {
        int best = -1;
        for (int i = 0; i < kiri_backends_count() && i < 8; i++)
            if (score[i] > 0 && (best < 0 || score[i] > score[best]))
                best = i;
        if (best < 0)
            break;
        char msg[128] = "";
        struct kiri_backend *b = NULL;
        if (table[best]->init(cfg, &b, msg, sizeof msg) == 0) {
            char desc[96] = "";
            if (table[best]->describe)
                table[best]->describe(b, desc, sizeof desc);
            for (int i = 0; i < kiri_backends_count() && i < 8; i++)
                if (i != best && score[i] <= 0)
                    append(report, report_cap, "%s: skipped (%s)\n", table[i]->name,
                           why[i][0] ? why[i] : "unusable");
            append(report, report_cap, "%s: picked (%s)\n", table[best]->name, desc);
            *iface = table[best];
            *be = b;
            return KIRI_OK;
        }
        snprintf(why[best], sizeof why[best], "init failed: %.128s", msg[0] ? msg : "unknown");
        score[best] = 0;
    }
    for (int i = 0; i < kiri_backends_count() && i < 8; i++)
        append(report, report_cap, "%s: skipped (%s)\n", table[i]->name, why[i]);
    if (!any)
        for (int i = 0; i < kiri_backends_count() && i < 8; i++)
            if (strcmp(table[i]->name, want) == 0)
                return kiri_error_set(info, KIRI_E_BACKEND, "backend %s cannot run here: %s", want, why[i]);
    return kiri_error_set(info, KIRI_E_BACKEND, "no usable backend");
}
