/* Filling the caller-owned status record (struct kiri_status_info) that kiri.h describes.
 * Every function here accepts a NULL record and then only returns the code. */
#ifndef KIRI_ERROR_H
#define KIRI_ERROR_H

#include <stdint.h>

struct kiri_status_info;

/* Sets code, message (printf-style) and clears field/offset. Returns code. */
int kiri_error_set(struct kiri_status_info *info, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Same, naming the file field at fault and its byte offset. Returns code. */
int kiri_error_at(struct kiri_status_info *info, int code, const char *field, int64_t offset,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Resets a record to "no error". */
void kiri_error_clear(struct kiri_status_info *info);

#endif
