/* Command-line options from one table: a command describes each of its options once (names,
 * type, range, help text, where the value goes in the command's own struct), and this module
 * parses flags, environment variables and a config file into that struct and writes the usage
 * text, so none of them can disagree with the others. kiri serve, run, bench, pull, fleet ... all
 * use it.
 *
 * Sources, highest precedence first: flags > environment > config file > the struct's initial
 * values (the caller sets the defaults before parsing). A command opts into the environment
 * (env_prefix) and the config file (an option with KIRI_OPTION_CONFIG_FILE); the rules are:
 * - Flags: --name VALUE or --name=VALUE; -x VALUE, -xVALUE or -x=VALUE for a short name. A flag
 *   (KIRI_OPTION_FLAG) takes no value, or --name=BOOL. Given twice, the last one wins (a repeated
 *   option collects them). Bare words are positional arguments where the command takes them, "-"
 *   among them; else, like "--", they are errors.
 * - Environment: PREFIX + the long name upper-cased with '-' as '_' (KIRI_ + kv-memory =
 *   KIRI_KV_MEMORY). An empty value counts as unset; unknown variables are ignored.
 * - Config file: UTF-8 text of at most 1 MiB (a byte order mark is skipped); per line
 *   `key = value`, the key a long name ('-' or '_'); '#' starts a comment line; whitespace around
 *   keys and values is trimmed; a value may be quoted "..." (no escapes), which keeps spaces and
 *   '#'; in an unquoted value, whitespace followed by '#' starts a comment. Its path comes from
 *   the config-file option's last flag, else its environment variable; an explicit empty flag
 *   reads no file.
 * - Values: integers are decimal; numbers and seconds are decimal (no NaN, infinity or hex);
 *   booleans are 1/0, true/false, yes/no, on/off in any case; sizes are bytes or a number
 *   (1.5G) with K, M, G or T, optionally followed by B or iB, each a power of 1024; enum values
 *   match in any case and are stored as the table spells them.
 * - Every source is validated in full, even settings a higher one overrides. Errors are one
 *   sentence: "--port 70000: must be 1..65535 (from KIRI_PORT)", the source being "the command
 *   line", the variable or "FILE line N" (commands without environment or file leave it out).
 * Numbers are read with strtoll/strtod in the C locale (kiri never calls setlocale). */
#ifndef KIRI_OPTIONS_H
#define KIRI_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

enum kiri_option_type {
    KIRI_OPTION_STRING,      /* char[size], copied; lo is the minimum length */
    KIRI_OPTION_STRING_REF,  /* const char *, borrowed from argv or the environment (never a file);
                                lo is the minimum length */
    KIRI_OPTION_STRINGS,     /* const char *[N] with an int count at count_off: repeatable, flags
                                only; lo is the minimum length of each */
    KIRI_OPTION_INT,         /* int32_t (int) or int64_t (size 8) in [lo, hi] */
    KIRI_OPTION_UINT64,      /* uint64_t, any non-negative decimal that fits */
    KIRI_OPTION_SIZE,        /* uint64_t bytes in [lo, hi], K/M/G/T suffixes */
    KIRI_OPTION_FLOAT,       /* float (size 4) or double in [flo, fhi] (no range when both are 0) */
    KIRI_OPTION_SECONDS,     /* double seconds in [flo, fhi] */
    KIRI_OPTION_FLAG,        /* int 0 or 1 */
    KIRI_OPTION_ENUM         /* char[size], one of choices ("a|b|c"), stored as spelled there */
};

enum kiri_option_flags {
    KIRI_OPTION_ABOVE_LO = 1,      /* FLOAT, SECONDS: the value must be more than flo */
    KIRI_OPTION_NO_ENV = 2,        /* not read from the environment */
    KIRI_OPTION_CONFIG_FILE = 4    /* STRING: names the config file (never set inside one) */
};

struct kiri_option {
    const char *name;        /* the long flag without "--"; also the config file's key */
    char short_name;         /* 0: none */
    unsigned char type;      /* enum kiri_option_type */
    unsigned char flags;     /* enum kiri_option_flags */
    size_t off, size;        /* the destination field in the command's struct: KIRI_OPTION_FIELD */
    size_t count_off;        /* STRINGS: the int that counts the array's entries */
    int64_t lo, hi;
    double flo, fhi;
    const char *choices;     /* ENUM: the allowed values separated by '|' */
    const char *arg;         /* the value's name in the usage text: FILE, N, SECONDS */
    const char *help;        /* one sentence or two */
    const char *def;         /* the default as the usage text shows it; NULL: not shown */
};

/* .off and .size of member m of struct type t (m may be nested: fo.https.ca_file). */
#define KIRI_OPTION_FIELD(t, m) .off = offsetof(t, m), .size = sizeof(((t *)0)->m)

/* Options that belong together, with their heading in the usage text. */
struct kiri_option_group {
    const char *title;       /* "sampling options" (NULL: no heading) */
    const struct kiri_option *opts;
    size_t n_opts;
};

/* One command's options. */
struct kiri_option_spec {
    const struct kiri_option_group *groups;
    size_t n_groups;
    const char *env_prefix;  /* "KIRI_": options read PREFIX + NAME from the environment; NULL: none */
    const char *intro;       /* text the usage starts with (NULL: none) */
    int max_positional;      /* bare words the command takes; 0: none */
};

/* Parses the sources into dst (the struct the table's offsets point into, holding the defaults)
 * from argv (argc entries, the first option at argv[0]) and envp (NULL-terminated, may be NULL).
 * Bare words go to positional[0..*n_positional) (capacity spec->max_positional; may be NULL when
 * that is 0). Returns 0, or -1 with one sentence in err; dst may then be partly written. -h and
 * --help are unknown options here: see kiri_options_help_requested. */
int kiri_options_parse(const struct kiri_option_spec *spec, void *dst, int argc, char **argv, char **envp,
                       const char **positional, int *n_positional, char *err, size_t err_cap);

/* Whether argv asks for help: -h or --help where an option may stand (not as a value). */
int kiri_options_help_requested(const struct kiri_option_spec *spec, int argc, char **argv);

/* Writes the usage text of spec's options into buf (always terminated; cut when cap is short):
 * the intro, then each group under its heading, one option per entry with its help wrapped at
 * 100 columns and "Default: X." where the table gives one. */
void kiri_options_usage(const struct kiri_option_spec *spec, char *buf, size_t cap);

#endif
