#include "stopper.h"

#include <string.h>

#include "kiri.h"
#include "mem.h"

void kiri_stopper_init(struct kiri_stopper *s, const char *const *stop, int n_stop)
{
    memset(s, 0, sizeof *s);
    s->stop = stop;
    s->n_stop = stop ? n_stop : 0;
}

void kiri_stopper_free(struct kiri_stopper *s)
{
    kiri_mem_free(s->buf);
    memset(s, 0, sizeof *s);
}

static void drop_delivered(struct kiri_stopper *s)
{
    memmove(s->buf, s->buf + s->delivered, s->len - s->delivered);
    s->len -= s->delivered;
    s->delivered = 0;
}

int kiri_stopper_push(struct kiri_stopper *s, const char *text, size_t len, const char **out, size_t *out_len)
{
    *out = "";
    *out_len = 0;
    if (s->hit)
        return 1;
    if (s->buf)
        drop_delivered(s);
    if (s->len + len + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 256;
        while (cap < s->len + len + 1)
            cap *= 2;
        char *b = kiri_mem_realloc(s->buf, cap);
        if (!b)
            return KIRI_E_NOMEM;
        s->buf = b;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, text, len);
    s->len += len;
    s->buf[s->len] = '\0';

    /* The earliest complete stop string wins. Only text that could contain one is searched: the
     * new bytes plus the longest stop string before them. */
    size_t cut = s->len;
    for (int i = 0; i < s->n_stop; i++) {
        const size_t sl = strlen(s->stop[i]);
        if (!sl || sl > s->len)
            continue;
        for (size_t at = 0; at + sl <= s->len && at < cut; at++)
            if (memcmp(s->buf + at, s->stop[i], sl) == 0) {
                cut = at;
                break;
            }
    }
    if (cut < s->len) {
        s->hit = 1;
        *out = s->buf;
        *out_len = cut;
        s->delivered = s->len; /* the rest is discarded */
        return 1;
    }
    /* Hold back the longest suffix that is a proper prefix of some stop string. */
    size_t keep = 0;
    for (int i = 0; i < s->n_stop; i++) {
        const size_t sl = strlen(s->stop[i]);
        for (size_t k = sl > 1 ? sl - 1 : 0; k > keep; k--)
            if (k <= s->len && memcmp(s->buf + s->len - k, s->stop[i], k) == 0) {
                keep = k;
                break;
            }
    }
    *out = s->buf;
    *out_len = s->len - keep;
    s->delivered = s->len - keep;
    return 0;
}

void kiri_stopper_flush(struct kiri_stopper *s, const char **out, size_t *out_len)
{
    if (s->buf)
        drop_delivered(s);
    *out = s->hit || !s->buf ? "" : s->buf;
    *out_len = s->hit ? 0 : s->len;
    s->delivered = s->len;
}
