/* base/options: what the server's config tests (test_server_modules) do not reach: positional
 * arguments, borrowed and repeated strings, floats, 64-bit integers, groups in the usage text and
 * finding -h/--help. */
#include <string.h>

#include "options.h"
#include "test.h"

struct cmd {
    const char *model;
    const char *stop[2];
    int n_stop;
    float temp;
    uint64_t seed;
    int64_t big;
    int json;
    char kind[8];
};

#define C(m) KIRI_OPTION_FIELD(struct cmd, m)
static const struct kiri_option main_opts[] = {
    {.name = "model", .short_name = 'm', .type = KIRI_OPTION_STRING_REF, C(model), .arg = "FILE",
     .help = "The model."},
    {.name = "stop", .type = KIRI_OPTION_STRINGS, C(stop), .count_off = offsetof(struct cmd, n_stop), .lo = 1,
     .arg = "TEXT", .help = "Stops."},
    {.name = "json", .short_name = 'j', .type = KIRI_OPTION_FLAG, C(json), .help = "JSON."},
};
static const struct kiri_option more_opts[] = {
    {.name = "temp", .type = KIRI_OPTION_FLOAT, C(temp), .arg = "T", .help = "Temperature.", .def = "0.8"},
    {.name = "seed", .type = KIRI_OPTION_UINT64, C(seed), .arg = "S", .help = "Seed."},
    {.name = "big", .type = KIRI_OPTION_INT, C(big), .lo = 1, .hi = (int64_t)1 << 53, .arg = "N", .help = "Big."},
    {.name = "kind", .type = KIRI_OPTION_ENUM, C(kind), .choices = "f16|q8_0", .arg = "K", .help = "Kind."},
};
static const struct kiri_option_group groups[] = {{NULL, main_opts, 3}, {"more options", more_opts, 4}};
static const struct kiri_option_spec spec = {groups, 2, NULL, NULL, 2};

static struct cmd c;
static char err[256];
static const char *pos[2];
static int n_pos;

static int parse(int argc, char **argv)
{
    memset(&c, 0, sizeof c);
    c.temp = 0.8f;
    return kiri_options_parse(&spec, &c, argc, argv, NULL, pos, &n_pos, err, sizeof err);
}

/* argc, argv of string literals (the parser never writes through argv). */
#define ARGV(...)                                                                               \
    (int)(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)), (char **)(const char *[]){__VA_ARGS__}

static void test_values(void)
{
    CHECK_EQ_INT(parse(ARGV("IN", "-m", "x.gguf", "--stop", "a", "--stop=b", "-j", "--temp", "0.25", "--seed",
                            "18446744073709551615", "--big", "9007199254740992", "--kind", "Q8_0", "-")), 0);
    CHECK_STR(err, "");
    CHECK_STR(c.model, "x.gguf");
    CHECK_EQ_INT(c.n_stop, 2);
    CHECK_STR(c.stop[1], "b");
    CHECK_EQ_INT(c.json, 1);
    CHECK(c.temp == 0.25f);
    CHECK(c.seed == UINT64_MAX);
    CHECK(c.big == (int64_t)1 << 53);
    CHECK_STR(c.kind, "q8_0");
    CHECK_EQ_INT(n_pos, 2);
    CHECK_STR(pos[0], "IN");
    CHECK_STR(pos[1], "-");
}

static void test_errors(void)
{
    static const struct {
        const char *args[6];
        int argc;
        const char *want;
    } cases[] = {
        {{"--stop", "a", "--stop", "b", "--stop", "c"}, 6, "--stop: given more than 2 times"},
        {{"--stop", ""}, 2, "--stop '': must not be empty"},
        {{"--temp", "nan"}, 2, "--temp nan: not a number"},
        {{"--seed", "-1"}, 2, "--seed -1: not a non-negative integer"},
        {{"--seed", "18446744073709551616"}, 2, "not a non-negative integer"},
        {{"--big", "0"}, 2, "--big 0: must be 1..9007199254740992"},
        {{"a", "b", "c"}, 3, "unexpected argument 'c' (the command takes 2)"},
        {{"--", "x"}, 2, "unexpected argument '--'"},
        {{"--nope"}, 1, "unknown option '--nope'"},
        {{"-m"}, 1, "--model needs a value (FILE)"},
        {{"--kind", "f32"}, 2, "--kind f32: must be one of f16, q8_0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK_EQ_INT(parse(cases[i].argc, (char **)cases[i].args), -1);
        CHECK(strstr(err, cases[i].want) != NULL);
        CHECK(strstr(err, "(from") == NULL);   /* no other source: no "(from the command line)" */
        if (!strstr(err, cases[i].want))
            fprintf(stderr, "  case %zu: got \"%s\"\n", i, err);
    }
}

static void test_help(void)
{
    CHECK_EQ_INT(kiri_options_help_requested(&spec, ARGV("-m", "x", "--help")), 1);
    CHECK_EQ_INT(kiri_options_help_requested(&spec, ARGV("--bogus", "-h")), 1);
    CHECK_EQ_INT(kiri_options_help_requested(&spec, ARGV("-m", "--help")), 0);   /* a value */
    CHECK_EQ_INT(kiri_options_help_requested(&spec, ARGV("--stop=-h", "x")), 0);
    CHECK_EQ_INT(parse(ARGV("--help")), -1);
    CHECK(strstr(err, "unknown option '--help'") != NULL);
}

static void test_usage(void)
{
    static char buf[4096];
    kiri_options_usage(&spec, buf, sizeof buf);
    CHECK(strstr(buf, "  -m, --model FILE") == buf);
    CHECK(strstr(buf, "  -j, --json ") != NULL);
    CHECK(strstr(buf, "\nmore options:\n      --temp T") != NULL);
    CHECK(strstr(buf, "Temperature. Default: 0.8.\n") != NULL);
    CHECK(strstr(buf, "Seed.\n") != NULL);
}

TEST_MAIN(test_values, test_errors, test_help, test_usage)
