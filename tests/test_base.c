/* The shared small tools of base/: the growable buffer (limits, the failed flag, taking the
 * bytes), UTF-8 (RFC 3629 edge cases, decoding, encoding, the streaming repair and its hold-back
 * across calls), hexadecimal and the model-name rule. */
#include <stdint.h>
#include <string.h>

#include "buf.h"
#include "hex.h"
#include "kiri.h"
#include "mem.h"
#include "names.h"
#include "test.h"
#include "utf8.h"

#define U(s) ((const unsigned char *)(s))

/* ---- buf ---- */

static void test_buf_append(void)
{
    struct kiri_buf b = {0};   /* zero-initialised: empty, no limit */
    CHECK_EQ_INT(kiri_buf_puts(&b, "abc"), KIRI_OK);
    CHECK_EQ_INT(kiri_buf_putc(&b, '-'), KIRI_OK);
    CHECK_EQ_INT(kiri_buf_printf(&b, "%d:%s", 42, "x"), KIRI_OK);
    CHECK_EQ_INT(kiri_buf_append(&b, "\0z", 2), KIRI_OK);   /* NUL bytes are data */
    CHECK_EQ_INT(b.len, 10);
    CHECK(memcmp(b.data, "abc-42:x\0z", 11) == 0);          /* and the terminator after them */
    CHECK(b.cap >= b.len + 1);
    CHECK(!b.failed);

    /* Growth well past the first allocation, through every appender. */
    kiri_buf_clear(&b);
    CHECK_EQ_INT(b.len, 0);
    CHECK_STR(b.data, "");
    for (int i = 0; i < 5000; i++)
        kiri_buf_printf(&b, "%04d|", i);
    CHECK_EQ_INT(b.len, 25000);
    CHECK(!b.failed);
    CHECK(memcmp(b.data + 5 * 4321, "4321|", 5) == 0);
    CHECK_EQ_INT(b.data[b.len], 0);
    char big[300];
    memset(big, 'q', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    kiri_buf_clear(&b);
    CHECK_EQ_INT(kiri_buf_printf(&b, "<%s>", big), KIRI_OK);   /* longer than any first guess */
    CHECK_EQ_INT(b.len, 301);
    CHECK_EQ_INT(b.data[300], '>');

    /* Dropping what a parser has used keeps the rest, still a string. */
    struct kiri_buf d = {0};
    kiri_buf_puts(&d, "event one\n\nrest");
    kiri_buf_drop(&d, 11);
    CHECK_EQ_INT(d.len, 4);
    CHECK_STR(d.data, "rest");
    kiri_buf_drop(&d, 99);
    CHECK_EQ_INT(d.len, 0);
    CHECK_STR(d.data, "");
    kiri_buf_free(&d);
    kiri_buf_drop(&d, 1);   /* nothing allocated: nothing to do */
    CHECK(d.data == NULL && d.len == 0);

    size_t n = 1;
    char *s = kiri_buf_take(&b, &n);
    CHECK_EQ_INT(n, 301);
    CHECK(s && s[0] == '<' && s[301] == '\0');
    kiri_mem_free(s);
    CHECK(b.data == NULL && b.len == 0 && b.cap == 0);

    /* Taking from an empty buffer still gives a string. */
    s = kiri_buf_take(&b, &n);
    CHECK(s != NULL && n == 0 && s[0] == '\0');
    kiri_mem_free(s);
    kiri_buf_free(&b);
}

static void test_buf_limit(void)
{
    struct kiri_buf b;
    kiri_buf_init(&b, 8);
    CHECK_EQ_INT(kiri_buf_puts(&b, "12345"), KIRI_OK);
    /* One byte too many: refused, the contents unchanged, the failure remembered. */
    CHECK_EQ_INT(kiri_buf_puts(&b, "6789"), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(b.len, 5);
    CHECK_STR(b.data, "12345");
    CHECK(b.failed);
    /* Exactly up to the limit still fits; the flag stays set until cleared. */
    CHECK_EQ_INT(kiri_buf_puts(&b, "678"), KIRI_OK);
    CHECK_STR(b.data, "12345678");
    CHECK(b.failed);
    CHECK_EQ_INT(kiri_buf_putc(&b, '9'), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_buf_printf(&b, "%d", 9), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_buf_reserve(&b, 1), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_buf_reserve(&b, 0), KIRI_OK);
    CHECK_STR(b.data, "12345678");
    /* A limited buffer never allocates more than it may hold (and its NUL). */
    CHECK(b.cap <= b.limit + 1);

    const size_t cap = b.cap;
    kiri_buf_clear(&b);
    CHECK(!b.failed && b.len == 0 && b.cap == cap);   /* memory kept */
    CHECK_EQ_INT(kiri_buf_printf(&b, "%s", "123456789"), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(b.len, 0);
    CHECK_STR(b.data, "");
    kiri_buf_free(&b);

    /* A large limit: the allocation stops at the limit, not the next power of two. */
    kiri_buf_init(&b, 1000);
    char chunk[100];
    memset(chunk, 'a', sizeof chunk);
    int refused = 0;
    for (int i = 0; i < 11; i++)
        refused += kiri_buf_append(&b, chunk, sizeof chunk) != KIRI_OK;
    CHECK_EQ_INT(refused, 1);
    CHECK_EQ_INT(b.len, 1000);
    CHECK(b.cap == 1001);
    CHECK(b.failed);
    kiri_buf_free(&b);

    /* A size that would wrap around is refused, not allocated. */
    struct kiri_buf u = {0};
    kiri_buf_puts(&u, "x");
    CHECK_EQ_INT(kiri_buf_reserve(&u, SIZE_MAX), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_buf_reserve(&u, SIZE_MAX - 1), KIRI_E_INVALID_ARG);
    CHECK(u.failed && u.len == 1);
    kiri_buf_free(&u);
}

/* ---- utf8 ---- */

/* An independent statement of the rule: decode by the bit patterns, then refuse overlongs,
 * surrogates and values above U+10FFFF. The length of the valid character at s, or 0. */
static int reference_len(const unsigned char *s, size_t n)
{
    const unsigned c = s[0];
    int len;
    uint32_t cp, min;
    if (c < 0x80)
        return 1;
    if ((c & 0xE0) == 0xC0)
        len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0)
        len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0)
        len = 4, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (n < (size_t)len)
        return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    return cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF) ? 0 : len;
}

static void test_utf8_check(void)
{
    struct { const char *s; size_t n; int want; } cases[] = {
        {"A", 1, 1},
        {"\x7F", 1, 1},
        {"\xC3\xA9", 2, 2},
        {"\xE2\x82\xAC", 3, 3},
        {"\xF0\x9F\x98\x80", 4, 4},
        {"\xE0\xA0\x80", 3, 3},          /* U+0800, the first three-byte character */
        {"\xED\x9F\xBF", 3, 3},          /* U+D7FF, just below the surrogates */
        {"\xF0\x90\x80\x80", 4, 4},      /* U+10000 */
        {"\xF4\x8F\xBF\xBF", 4, 4},      /* U+10FFFF, the last */
        {"\xC0\x80", 2, -1},             /* overlong NUL: C0 never starts a character */
        {"\xC1\xBF", 2, -1},
        {"\xE0\x80\x80", 3, -1},         /* overlong three-byte form */
        {"\xE0\x9F\xBF", 3, -1},
        {"\xED\xA0\x80", 3, -1},         /* U+D800, a surrogate */
        {"\xED\xBF\xBF", 3, -1},
        {"\xF0\x80\x80\x80", 4, -1},     /* overlong four-byte form */
        {"\xF0\x8F\xBF\xBF", 4, -1},
        {"\xF4\x90\x80\x80", 4, -1},     /* U+110000 */
        {"\xF5\x80\x80\x80", 4, -1},
        {"\xFF", 1, -1},
        {"\x80", 1, -1},                 /* a lone continuation byte */
        {"\xE2\x82", 2, 0},              /* truncated: unfinished, not invalid */
        {"\xE2", 1, 0},
        {"\xF0\x9F\x98", 3, 0},
        {"\xE2\x82\x41", 3, -2},         /* truncated by another character: E2 82 is one error */
        {"\xF0\x9F\x98\x41", 4, -3},
        {"\xF0\x9F\x41", 3, -2},
        {"\xC3\x41", 2, -1},
        {"\xF4\x8F\xBF\x7F", 4, -3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int got = kiri_utf8_check(U(cases[i].s), cases[i].n);
        if (got != cases[i].want)
            fprintf(stderr, "case %zu\n", i);
        CHECK_EQ_INT(got, cases[i].want);
    }

    /* Every one-, two- and three-byte sequence agrees with the reference on what is valid. */
    int mismatches = 0;
    for (unsigned a = 0; a < 256; a++)
        for (unsigned b = 0; b < 256; b++)
            for (unsigned c = 0; c < 256; c++) {
                const unsigned char s[3] = {(unsigned char)a, (unsigned char)b, (unsigned char)c};
                const int k = kiri_utf8_check(s, 3), want = reference_len(s, 3);
                mismatches += k > 0 ? k != want : want != 0;
            }
    /* Four-byte leads, with continuation bytes at and beyond the edges of their ranges. */
    static const unsigned char edge[] = {0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF};
    for (unsigned a = 0xF0; a < 0x100; a++)
        for (size_t b = 0; b < sizeof edge; b++)
            for (size_t c = 0; c < sizeof edge; c++)
                for (size_t d = 0; d < sizeof edge; d++) {
                    const unsigned char s[4] = {(unsigned char)a, edge[b], edge[c], edge[d]};
                    const int k = kiri_utf8_check(s, 4), want = reference_len(s, 4);
                    mismatches += k > 0 ? k != want : want != 0;
                }
    CHECK_EQ_INT(mismatches, 0);

    CHECK(kiri_utf8_valid("", 0));
    CHECK(kiri_utf8_valid("caf\xC3\xA9 \xE2\x82\xAC", 9));
    CHECK(kiri_utf8_valid("a\0b", 3));                  /* NUL is a character here */
    CHECK(!kiri_utf8_valid("a\xE2\x82", 3));            /* unfinished at the end */
    CHECK(!kiri_utf8_valid("\xED\xA0\x80", 3));
    CHECK(!kiri_utf8_valid("ok\xC0\x80", 4));
}

static void test_utf8_decode_encode(void)
{
    uint32_t cp = 0;
    CHECK_EQ_INT(kiri_utf8_decode("\xE2\x82\xAC!", 4, &cp), 3);
    CHECK_EQ_INT(cp, 0x20AC);
    CHECK_EQ_INT(kiri_utf8_decode("\xF4\x8F\xBF\xBF", 4, &cp), 4);
    CHECK_EQ_INT(cp, 0x10FFFF);
    CHECK_EQ_INT(kiri_utf8_decode("\xE2\x82\x41", 3, &cp), 2);   /* the bytes one U+FFFD replaces */
    CHECK_EQ_INT(cp, 0xFFFD);
    CHECK_EQ_INT(kiri_utf8_decode("\xED\xA0\x80", 3, &cp), 1);
    CHECK_EQ_INT(cp, 0xFFFD);
    CHECK_EQ_INT(kiri_utf8_decode("\xF0\x9F\x98", 3, &cp), 3);   /* unfinished: all of it */
    CHECK_EQ_INT(cp, 0xFFFD);

    char out[4];
    CHECK_EQ_INT(kiri_utf8_encode(0x41, out), 1);
    CHECK_EQ_INT(out[0], 'A');
    CHECK_EQ_INT(kiri_utf8_encode(0xE9, out), 2);
    CHECK(memcmp(out, "\xC3\xA9", 2) == 0);
    CHECK_EQ_INT(kiri_utf8_encode(0x1F600, out), 4);
    CHECK(memcmp(out, "\xF0\x9F\x98\x80", 4) == 0);
    CHECK_EQ_INT(kiri_utf8_encode(0xD800, out), 3);             /* a surrogate: U+FFFD */
    CHECK(memcmp(out, KIRI_UTF8_REPLACEMENT, 3) == 0);
    CHECK_EQ_INT(kiri_utf8_encode(0x110000, out), 3);
    CHECK(memcmp(out, KIRI_UTF8_REPLACEMENT, 3) == 0);

    /* Every scalar value survives encode then decode, at the length RFC 3629 gives it. */
    int bad = 0;
    for (uint32_t c = 0; c <= 0x10FFFF; c++) {
        if (c >= 0xD800 && c <= 0xDFFF)
            continue;
        const size_t n = kiri_utf8_encode(c, out);
        const size_t want = c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
        uint32_t back = 0;
        bad += n != want || kiri_utf8_decode(out, n, &back) != n || back != c;
    }
    CHECK_EQ_INT(bad, 0);
}

/* Repairs s[0, n) in one call; the held-back tail is left in *hold. */
static size_t repair(const char *s, size_t n, char *out, size_t *hold)
{
    const size_t need = kiri_utf8_repair(U(s), n, NULL, hold);
    const size_t got = kiri_utf8_repair(U(s), n, out, hold);
    CHECK_EQ_INT(need, got);   /* the measuring pass agrees with the writing one */
    CHECK(got <= 3 * n);
    return got;
}

static void test_utf8_repair(void)
{
    char out[64];
    size_t hold = 9, n;

    n = repair("plain \xC3\xA9", 8, out, &hold);
    CHECK(n == 8 && memcmp(out, "plain \xC3\xA9", 8) == 0 && hold == 0);

    /* One U+FFFD per maximal invalid subsequence. */
    n = repair("a\xC0\x80z", 4, out, &hold);            /* C0 and 80 are two errors */
    CHECK(n == 8 && memcmp(out, "a" KIRI_UTF8_REPLACEMENT KIRI_UTF8_REPLACEMENT "z", 8) == 0 && hold == 0);
    n = repair("\xE0\x80\x80", 3, out, &hold);          /* overlong: three */
    CHECK(n == 9 && memcmp(out, KIRI_UTF8_REPLACEMENT KIRI_UTF8_REPLACEMENT KIRI_UTF8_REPLACEMENT, 9) == 0);
    n = repair("\xED\xA0\x80", 3, out, &hold);          /* surrogate: three */
    CHECK_EQ_INT(n, 9);
    n = repair("\xF4\x90\x80\x80", 4, out, &hold);      /* above U+10FFFF: four */
    CHECK_EQ_INT(n, 12);
    n = repair("\xF0\x9F\x98\x41", 4, out, &hold);      /* a cut-off character: one, then A */
    CHECK(n == 4 && memcmp(out, KIRI_UTF8_REPLACEMENT "A", 4) == 0 && hold == 0);

    /* An unfinished character at the end is held back, not replaced. */
    n = repair("ab\xE2\x82", 4, out, &hold);
    CHECK(n == 2 && memcmp(out, "ab", 2) == 0 && hold == 2);
    n = repair("\xF0", 1, out, &hold);
    CHECK(n == 0 && hold == 1);
    n = repair("\xC3\xA9\xF0\x9F\x98", 5, out, &hold);
    CHECK(n == 2 && hold == 3);
    /* A tail that no byte can complete is not held: ED A0 (a surrogate) is two errors now. */
    n = repair("ab\xED\xA0", 4, out, &hold);
    CHECK(n == 8 && memcmp(out, "ab" KIRI_UTF8_REPLACEMENT KIRI_UTF8_REPLACEMENT, 8) == 0 && hold == 0);
}

/* Streams pieces through the repair the way a caller does: the held bytes lead the next call. */
static void test_utf8_repair_stream(void)
{
    struct { const char *pieces[5]; const char *want; } cases[] = {
        {{"\xF0", "\x9F", "\x98", "\x80!"}, "\xF0\x9F\x98\x80!"},        /* one byte at a time */
        {{"caf\xC3", "\xA9 \xE2\x82", "\xAC"}, "caf\xC3\xA9 \xE2\x82\xAC"},
        {{"x\xE2\x82", "A"}, "x" KIRI_UTF8_REPLACEMENT "A"},             /* the held bytes go bad */
        {{"\xF0\x9F", "\x98", "\xF0\x9F\x98\x80"}, KIRI_UTF8_REPLACEMENT "\xF0\x9F\x98\x80"},
        {{"\xED", "\xA0\x80"}, KIRI_UTF8_REPLACEMENT KIRI_UTF8_REPLACEMENT KIRI_UTF8_REPLACEMENT},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        unsigned char pending[4 + 16];
        size_t n_pending = 0;
        char got[128];
        size_t o = 0;
        for (int p = 0; p < 5 && cases[c].pieces[p]; p++) {
            unsigned char in[sizeof pending];
            const size_t len = strlen(cases[c].pieces[p]);
            memcpy(in, pending, n_pending);
            memcpy(in + n_pending, cases[c].pieces[p], len);
            size_t hold;
            o += kiri_utf8_repair(in, n_pending + len, got + o, &hold);
            CHECK(hold <= 3);
            memcpy(pending, in + n_pending + len - hold, hold);
            n_pending = hold;
        }
        CHECK_EQ_INT(n_pending, 0);
        got[o] = '\0';
        if (strcmp(got, cases[c].want) != 0)
            fprintf(stderr, "stream case %zu\n", c);
        CHECK_STR(got, cases[c].want);
    }
}

static void test_utf8_prefix(void)
{
    const char *s = "h\xC3\xA9llo";   /* h é l l o */
    CHECK_EQ_INT(kiri_utf8_prefix(s, 6, 10), 6);
    CHECK_EQ_INT(kiri_utf8_prefix(s, 6, 6), 6);
    CHECK_EQ_INT(kiri_utf8_prefix(s, 6, 3), 3);
    CHECK_EQ_INT(kiri_utf8_prefix(s, 6, 2), 1);        /* not through the middle of é */
    CHECK_EQ_INT(kiri_utf8_prefix(s, 6, 1), 1);
    CHECK_EQ_INT(kiri_utf8_prefix("\xE2\x82\xAC", 3, 2), 0);
    CHECK_EQ_INT(kiri_utf8_prefix("\xF0\x9F\x98\x80x", 5, 4), 4);
    CHECK_EQ_INT(kiri_utf8_prefix("abc", 3, 0), 0);
}

/* ---- hex ---- */

static void test_hex(void)
{
    const uint8_t b[] = {0x00, 0x01, 0x7F, 0x80, 0xAB, 0xFF};
    char s[2 * sizeof b + 1];
    memset(s, '#', sizeof s);
    kiri_hex_encode(b, sizeof b, s);
    CHECK_STR(s, "00017f80abff");
    kiri_hex_encode(b, 0, s);
    CHECK_STR(s, "");

    CHECK_EQ_INT(kiri_hex_digit('0'), 0);
    CHECK_EQ_INT(kiri_hex_digit('9'), 9);
    CHECK_EQ_INT(kiri_hex_digit('a'), 10);
    CHECK_EQ_INT(kiri_hex_digit('F'), 15);
    const char not_digits[] = "/:@G`g x+-";
    for (size_t i = 0; i < sizeof not_digits - 1; i++)
        CHECK_EQ_INT(kiri_hex_digit(not_digits[i]), -1);
    CHECK_EQ_INT(kiri_hex_digit('\0'), -1);

    uint8_t out[8];
    CHECK_EQ_INT(kiri_hex_decode("00017F80aBfF", out, 6), 0);   /* either case */
    CHECK(memcmp(out, b, 6) == 0);
    CHECK_EQ_INT(kiri_hex_decode("0g", out, 1), -1);
    CHECK_EQ_INT(kiri_hex_decode("g0", out, 1), -1);
    CHECK_EQ_INT(kiri_hex_decode("+f", out, 1), -1);            /* no signs, no spaces (sscanf took them) */
    CHECK_EQ_INT(kiri_hex_decode(" f", out, 1), -1);
    CHECK_EQ_INT(kiri_hex_decode("0x", out, 1), -1);
    CHECK_EQ_INT(kiri_hex_decode("abc", out, 2), -1);           /* too short: stops at the NUL */
    CHECK_EQ_INT(kiri_hex_decode("", out, 1), -1);

    /* The string form: exactly 2 * n digits, no more, no fewer. */
    CHECK_EQ_INT(kiri_hex_decode_str("00017f80abff", out, 6), 0);
    CHECK(memcmp(out, b, 6) == 0);
    CHECK_EQ_INT(kiri_hex_decode_str("00017f80abff0", out, 6), -1);
    CHECK_EQ_INT(kiri_hex_decode_str("00017f80abf", out, 6), -1);
    CHECK_EQ_INT(kiri_hex_decode_str("00017f80abfz", out, 6), -1);
    CHECK_EQ_INT(kiri_hex_decode_str(NULL, out, 6), -1);

    /* Round trip over every byte value. */
    uint8_t all[256], back[256];
    char text[513];
    for (int i = 0; i < 256; i++)
        all[i] = (uint8_t)i;
    kiri_hex_encode(all, 256, text);
    CHECK_EQ_INT(strlen(text), 512);
    CHECK_EQ_INT(kiri_hex_decode(text, back, 256), 0);
    CHECK(memcmp(all, back, 256) == 0);
}

/* ---- names ---- */

static void test_names(void)
{
    char longest[KIRI_MODEL_NAME_MAX + 2];
    memset(longest, 'm', sizeof longest);
    longest[KIRI_MODEL_NAME_MAX] = '\0';

    const char *good[] = {"stories", "a", "Llama-3.1_8B.Q4_K_M", "x.", "-dash", "_", longest};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++)
        CHECK(kiri_model_name_ok(good[i], strlen(good[i])));
    const char *bad[] = {"", ".hidden", "..", ".", "a/b", "/abs", "a b", "a\\b", "caf\xC3\xA9", "a:b", "a\n"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (kiri_model_name_ok(bad[i], strlen(bad[i])))
            fprintf(stderr, "name \"%s\" accepted\n", bad[i]);
        CHECK(!kiri_model_name_ok(bad[i], strlen(bad[i])));
    }
    CHECK(!kiri_model_name_ok("m\0x", 3));              /* a NUL inside the name */
    CHECK(kiri_model_name_ok("m\0x", 1));
    longest[KIRI_MODEL_NAME_MAX] = 'm';
    longest[KIRI_MODEL_NAME_MAX + 1] = '\0';
    CHECK(!kiri_model_name_ok(longest, KIRI_MODEL_NAME_MAX + 1));   /* one byte too long */

    CHECK(kiri_model_file_ok("stories.gguf"));
    CHECK(kiri_model_file_ok("a.b.gguf"));
    CHECK(!kiri_model_file_ok(".gguf"));
    CHECK(!kiri_model_file_ok("gguf"));
    CHECK(!kiri_model_file_ok("m.GGUF"));
    CHECK(!kiri_model_file_ok("m.gguf.prev"));
    CHECK(!kiri_model_file_ok("m.gguf.partial"));
    CHECK(!kiri_model_file_ok(".m.gguf"));
    CHECK(!kiri_model_file_ok("d/m.gguf"));
    char file[KIRI_MODEL_NAME_MAX + 8];
    memset(file, 'n', KIRI_MODEL_NAME_MAX);
    memcpy(file + KIRI_MODEL_NAME_MAX, ".gguf", 6);
    CHECK(kiri_model_file_ok(file));
    memset(file, 'n', KIRI_MODEL_NAME_MAX + 1);
    memcpy(file + KIRI_MODEL_NAME_MAX + 1, ".gguf", 6);
    CHECK(!kiri_model_file_ok(file));
}

TEST_MAIN(test_buf_append, test_buf_limit, test_utf8_check, test_utf8_decode_encode, test_utf8_repair,
          test_utf8_repair_stream, test_utf8_prefix, test_hex, test_names)
