/* Stop strings over streamed text: generated text is held back while its end could be the start
 * of a stop string, delivered once it cannot, and cut where a stop string completes. Text in and
 * out is whole UTF-8 characters; since a stop string starts with a lead byte, a held-back suffix
 * always starts on a character boundary.
 *
 * Invariants: buf holds only text not yet delivered; after a hit, nothing more is accepted. */
#ifndef KIRI_STOPPER_H
#define KIRI_STOPPER_H

#include <stddef.h>

struct kiri_stopper {
    const char *const *stop;    /* borrowed, n_stop non-empty strings */
    int n_stop;
    char *buf;                  /* owned */
    size_t len, cap;
    size_t delivered;           /* bytes of buf handed out by the last push, dropped on the next */
    int hit;
};

void kiri_stopper_init(struct kiri_stopper *s, const char *const *stop, int n_stop);
void kiri_stopper_free(struct kiri_stopper *s);
/* Appends text and sets *out / *out_len to what may be delivered now (valid until the next call).
 * Returns 1 when a stop string completed (the output then ends before it), 0 otherwise, or
 * KIRI_E_NOMEM. */
int kiri_stopper_push(struct kiri_stopper *s, const char *text, size_t len, const char **out, size_t *out_len);
/* Hands out whatever is held back (at the end of generation without a hit). */
void kiri_stopper_flush(struct kiri_stopper *s, const char **out, size_t *out_len);

#endif
