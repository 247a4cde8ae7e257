/* Stop strings over streamed text: what is delivered, when, and where the cut falls, for pieces
 * that split stop strings, overlapping candidates and multi-byte characters. */
#include <string.h>

#include "stopper.h"
#include "test.h"

struct stop_case {
    const char *stops[3];
    const char *pieces[8];
    const char *delivered;      /* everything delivered, flush included */
    int hit;
};

static const struct stop_case cases[] = {
    {{"park"}, {"in the ", "pa", "rk and"}, "in the ", 1},
    {{"park"}, {"in the ", "pa", "per"}, "in the paper", 0},
    {{"END", "EN"}, {"abcE", "N", "D"}, "abc", 1},               /* the earliest stop wins */
    {{"\n\n"}, {"line\n", "more\n", "\n", "tail"}, "line\nmore", 1},
    {{"é!"}, {"caf", "é", "!"}, "caf", 1},                      /* two-byte character in a stop */
    {{"xyz"}, {"xxy", "xy", "xyz"}, "xxyxy", 1},
    {{NULL}, {"plain ", "text"}, "plain text", 0},
    {{"aa"}, {"a", "a"}, "", 1},
};

static void test_cases(void)
{
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const struct stop_case *tc = &cases[c];
        int n_stop = 0;
        while (n_stop < 3 && tc->stops[n_stop])
            n_stop++;
        struct kiri_stopper s;
        kiri_stopper_init(&s, tc->stops, n_stop);
        char got[256] = "";
        size_t used = 0;
        int hit = 0;
        for (int i = 0; i < 8 && tc->pieces[i] && !hit; i++) {
            const char *out;
            size_t len;
            hit = kiri_stopper_push(&s, tc->pieces[i], strlen(tc->pieces[i]), &out, &len);
            memcpy(got + used, out, len);
            used += len;
        }
        if (!hit) {
            const char *out;
            size_t len;
            kiri_stopper_flush(&s, &out, &len);
            memcpy(got + used, out, len);
            used += len;
        }
        got[used] = '\0';
        CHECK_STR(got, tc->delivered);
        CHECK_EQ_INT(hit, tc->hit);
        kiri_stopper_free(&s);
    }
}

/* Text that cannot start a stop string is delivered at once, not at the end. */
static void test_no_needless_holdback(void)
{
    const char *stops[] = {"STOP"};
    struct kiri_stopper s;
    kiri_stopper_init(&s, stops, 1);
    const char *out;
    size_t len;
    CHECK_EQ_INT(kiri_stopper_push(&s, "hello ", 6, &out, &len), 0);
    CHECK_EQ_INT(len, 6);
    CHECK_EQ_INT(kiri_stopper_push(&s, "ST", 2, &out, &len), 0);
    CHECK_EQ_INT(len, 0);
    CHECK_EQ_INT(kiri_stopper_push(&s, "ART", 3, &out, &len), 0);
    CHECK_EQ_INT(len, 5);
    CHECK(memcmp(out, "START", 5) == 0);
    kiri_stopper_free(&s);
}

TEST_MAIN(test_cases, test_no_needless_holdback)
