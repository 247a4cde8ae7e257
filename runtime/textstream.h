/* Generated tokens to text, once for every caller (the serving loop's events, and so contexts,
 * the CLI and the server): streaming detokenization in whole UTF-8 characters, stop strings cut
 * and text that could begin one held back, and what is held released at the end.
 *
 * Use per event: kiri_text_stream_begin, then _push for the sampled token (not for an
 * end-of-generation token) and, for the final event, _finish; the event's text is then out. */
#ifndef KIRI_TEXTSTREAM_H
#define KIRI_TEXTSTREAM_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "stopper.h"
#include "tokenizer.h"

struct kiri_text_stream {
    const struct kiri_tokenizer *tokenizer;   /* borrowed */
    char **stop;                              /* owned copies of the stop strings */
    int n_stop;
    struct kiri_detok_stream detok;
    struct kiri_stopper stopper;
    struct kiri_buf out;                      /* owned: this event's text */
    int hit;                                  /* a stop string completed */
};

/* Copies the stop strings (empty ones are dropped). Returns KIRI_OK or KIRI_E_NOMEM. */
int kiri_text_stream_init(struct kiri_text_stream *ts, const struct kiri_tokenizer *t,
                          const char *const *stop, int n_stop);
void kiri_text_stream_free(struct kiri_text_stream *ts);
/* Starts an event: out becomes empty. */
void kiri_text_stream_begin(struct kiri_text_stream *ts);
/* Adds a generated token's text to out. Returns 1 when a stop string completed (out ends before
 * it; nothing is added afterwards), 0, or KIRI_E_NOMEM. */
int kiri_text_stream_push(struct kiri_text_stream *ts, int32_t token);
/* End of generation without a stop string: adds the held text (an unfinished character becomes
 * U+FFFD). Returns 0 or KIRI_E_NOMEM. */
int kiri_text_stream_finish(struct kiri_text_stream *ts);

#endif
