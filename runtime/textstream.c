#include "textstream.h"

#include <string.h>

#include "kiri.h"
#include "mem.h"

int kiri_text_stream_init(struct kiri_text_stream *ts, const struct kiri_tokenizer *t,
                          const char *const *stop, int n_stop)
{
    memset(ts, 0, sizeof *ts);
    ts->tokenizer = t;
    if (stop && n_stop > 0) {
        if (!(ts->stop = kiri_mem_calloc((size_t)n_stop, sizeof *ts->stop)))
            return KIRI_E_NOMEM;
        for (int i = 0; i < n_stop; i++) {
            if (!stop[i] || !stop[i][0])
                continue;
            if (!(ts->stop[ts->n_stop] = kiri_mem_strndup(stop[i], strlen(stop[i])))) {
                kiri_text_stream_free(ts);
                return KIRI_E_NOMEM;
            }
            ts->n_stop++;
        }
    }
    kiri_stopper_init(&ts->stopper, (const char *const *)ts->stop, ts->n_stop);
    return KIRI_OK;
}

void kiri_text_stream_free(struct kiri_text_stream *ts)
{
    kiri_stopper_free(&ts->stopper);
    for (int i = 0; ts->stop && i < ts->n_stop; i++)
        kiri_mem_free(ts->stop[i]);
    kiri_mem_free(ts->stop);
    kiri_buf_free(&ts->out);
    memset(ts, 0, sizeof *ts);
}

void kiri_text_stream_begin(struct kiri_text_stream *ts) { kiri_buf_clear(&ts->out); }

/* Runs text through the stop strings and appends what may be delivered to out. */
static int deliver(struct kiri_text_stream *ts, const char *text, size_t len)
{
    const char *ready;
    size_t ready_len;
    const int hit = kiri_stopper_push(&ts->stopper, text, len, &ready, &ready_len);
    if (hit < 0)
        return hit;
    if (kiri_buf_append(&ts->out, ready, ready_len) < 0)
        return KIRI_E_NOMEM;
    ts->hit |= hit;
    return hit;
}

int kiri_text_stream_push(struct kiri_text_stream *ts, int32_t token)
{
    if (ts->hit)
        return 1;
    /* Vocabularies with tokens longer than the usual buffer (code models' runs of spaces) take
     * a heap buffer for the piece. */
    char stack[KIRI_DETOK_CAP];
    const size_t cap = KIRI_DETOK_CAP_FOR(kiri_tokenizer_max_piece(ts->tokenizer));
    char *piece = cap <= sizeof stack ? stack : kiri_mem_alloc(cap);
    if (!piece)
        return KIRI_E_NOMEM;
    const int n = kiri_detok_push(ts->tokenizer, &ts->detok, token, 0, piece,
                                  cap <= sizeof stack ? sizeof stack : cap);
    const int rc = deliver(ts, piece, n > 0 ? (size_t)n : 0);
    if (piece != stack)
        kiri_mem_free(piece);
    return rc;
}

int kiri_text_stream_finish(struct kiri_text_stream *ts)
{
    if (ts->hit)
        return 0;
    char piece[KIRI_DETOK_CAP];
    const int n = kiri_detok_flush(&ts->detok, piece, sizeof piece);
    if (n > 0 && deliver(ts, piece, (size_t)n) < 0)
        return KIRI_E_NOMEM;
    if (ts->hit)
        return 0;
    const char *held;
    size_t held_len;
    kiri_stopper_flush(&ts->stopper, &held, &held_len);
    return kiri_buf_append(&ts->out, held, held_len) < 0 ? KIRI_E_NOMEM : 0;
}
