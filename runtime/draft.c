#include "draft.h"

#include <string.h>

#include "kiri.h"

int32_t kiri_draft_ngram(const int32_t *tokens, int32_t n, int32_t *draft, int32_t max)
{
    if (!tokens || !draft || max < 1)
        return 0;
    const int32_t lo = n > KIRI_NGRAM_WINDOW ? n - KIRI_NGRAM_WINDOW : 0;
    for (int32_t len = KIRI_NGRAM_MAX; len >= KIRI_NGRAM_MIN; len--) {
        if (n - lo < len + 1)
            continue;
        const int32_t *suffix = tokens + n - len;
        /* An occurrence at i ends before the suffix starts over itself, so at least one token
         * follows it: i + len < n. */
        for (int32_t i = n - len - 1; i >= lo; i--) {
            if (tokens[i] != suffix[0] || memcmp(tokens + i, suffix, (size_t)len * sizeof *tokens) != 0)
                continue;
            int32_t k = n - (i + len);
            if (k > max)
                k = max;
            memcpy(draft, tokens + i + len, (size_t)k * sizeof *draft);
            return k;
        }
    }
    return 0;
}

static int32_t ngram_propose(const struct kiri_drafter *d, const int32_t *tokens, int32_t n, int32_t *draft,
                             int32_t max)
{
    (void)d;
    return kiri_draft_ngram(tokens, n, draft, max);
}

static const struct kiri_drafter ngram = {"ngram", ngram_propose};

const struct kiri_drafter *kiri_drafter_get(int kind)
{
    return kind == KIRI_SPEC_NGRAM ? &ngram : NULL;
}

const char *kiri_spec_name(int kind)
{
    switch (kind) {
    case KIRI_SPEC_NONE:
        return "none";
    case KIRI_SPEC_NGRAM:
        return "ngram";
    default:
        return NULL;
    }
}

int kiri_spec_parse(const char *name)
{
    for (int k = 0; name && k < KIRI_SPEC_KINDS; k++)
        if (strcmp(name, kiri_spec_name(k)) == 0)
            return k;
    return -1;
}
