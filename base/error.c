#include "error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "kiri.h"

const char *kiri_status_name(int code)
{
    switch (code) {
    case KIRI_OK: return "OK";
    case KIRI_E_INVALID_ARG: return "E_INVALID_ARG";
    case KIRI_E_NOMEM: return "E_NOMEM";
    case KIRI_E_IO: return "E_IO";
    case KIRI_E_MODEL_INVALID: return "E_MODEL_INVALID";
    case KIRI_E_UNSUPPORTED: return "E_UNSUPPORTED";
    case KIRI_E_CANCELLED: return "E_CANCELLED";
    case KIRI_E_CONTEXT_FULL: return "E_CONTEXT_FULL";
    case KIRI_E_BACKEND: return "E_BACKEND";
    case KIRI_E_BUSY: return "E_BUSY";
    default: return "E_UNKNOWN";
    }
}

void kiri_error_clear(struct kiri_status_info *info)
{
    if (!info)
        return;
    info->code = KIRI_OK;
    info->field[0] = '\0';
    info->offset = -1;
    info->message[0] = '\0';
}

static void fill(struct kiri_status_info *info, int code, const char *field, int64_t offset,
                 const char *fmt, va_list ap)
{
    info->code = code;
    snprintf(info->field, sizeof info->field, "%s", field ? field : "");
    info->offset = offset;
    vsnprintf(info->message, sizeof info->message, fmt, ap);
}

int kiri_error_set(struct kiri_status_info *info, int code, const char *fmt, ...)
{
    if (info) {
        va_list ap;
        va_start(ap, fmt);
        fill(info, code, NULL, -1, fmt, ap);
        va_end(ap);
    }
    return code;
}

int kiri_error_at(struct kiri_status_info *info, int code, const char *field, int64_t offset,
                  const char *fmt, ...)
{
    if (info) {
        va_list ap;
        va_start(ap, fmt);
        fill(info, code, field, offset, fmt, ap);
        va_end(ap);
    }
    return code;
}
