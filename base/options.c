/* Command-line options from one table (options.h). */
#include "options.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"

#define FILE_MAX ((size_t)1 << 20)
#define USAGE_COL 30
#define USAGE_WIDTH 100

/* ---------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------- */

struct errbuf {
    char *p;
    size_t cap;
};

__attribute__((format(printf, 2, 3))) static int fail(struct errbuf *e, const char *fmt, ...)
{
    if (e->p && e->cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->p, e->cap, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* "--name VALUE: reason (from SOURCE)", the value cut at 80 bytes; no "(from ...)" without src. */
__attribute__((format(printf, 5, 6))) static int bad_value(struct errbuf *e, const struct kiri_option *o,
                                                           const char *v, const char *src, const char *fmt, ...)
{
    char reason[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    return fail(e, "--%s %s%.80s%s: %s%s%s%s", o->name, *v ? "" : "''", v, strlen(v) > 80 ? "..." : "", reason,
                src ? " (from " : "", src ? src : "", src ? ")" : "");
}

/* ---------------------------------------------------------------------------------------------
 * Value parsing
 * ------------------------------------------------------------------------------------------- */

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c; }

static int eq_nocase(const char *a, const char *b)
{
    while (*a && lower((unsigned char)*a) == lower((unsigned char)*b))
        a++, b++;
    return *a == '\0' && *b == '\0';
}

static int parse_int(const char *s, int64_t *out)
{
    const char *p = s + (*s == '+' || *s == '-');
    if (*p < '0' || *p > '9')
        return -1;
    char *end;
    long long x = strtoll(s, &end, 10);   /* saturates on overflow: the range check catches it */
    if (*end)
        return -1;
    *out = x;
    return 0;
}

static int parse_uint64(const char *s, uint64_t *out)
{
    if (*s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long x = strtoull(s, &end, 10);
    if (*end || errno)
        return -1;
    *out = x;
    return 0;
}

/* 0 ok, -1 not a size, -2 does not fit in 64 bits. */
static int parse_size(const char *s, uint64_t *out)
{
    uint64_t mant = 0, pow10 = 1;
    int digits = 0, dot = 0, big = 0;
    const char *p = s;
    for (;; p++) {
        if (*p >= '0' && *p <= '9') {
            if (mant > (UINT64_MAX - 9) / 10 || (dot && pow10 > UINT64_MAX / 10))
                big = 1;
            else {
                mant = mant * 10 + (uint64_t)(*p - '0');
                if (dot)
                    pow10 *= 10;
            }
            digits++;
        } else if (*p == '.' && !dot) {
            dot = 1;
            if (p[1] < '0' || p[1] > '9')
                return -1;
        } else {
            break;
        }
    }
    if (!digits)
        return -1;
    int shift = 0;
    if (*p) {
        int x = lower((unsigned char)*p);
        if (x == 'b' && p[1] == '\0') {
            shift = 0;
        } else {
            shift = x == 'k' ? 10 : x == 'm' ? 20 : x == 'g' ? 30 : x == 't' ? 40 : -1;
            if (shift < 0)
                return -1;
            p++;
            if (lower((unsigned char)*p) == 'i') {
                p++;
                if (lower((unsigned char)*p) != 'b')
                    return -1;
                p++;
            } else if (lower((unsigned char)*p) == 'b') {
                p++;
            }
            if (*p)
                return -1;
        }
    }
    if (dot && shift == 0)
        return -1;   /* a fraction of a byte */
    if (big)
        return -2;
    uint64_t mult = (uint64_t)1 << shift;
    if (mant > UINT64_MAX / mult)
        return -2;
    *out = mant * mult / pow10;
    return 0;
}

static int parse_double(const char *s, double *out)
{
    if (!*s)
        return -1;
    for (const char *p = s; *p; p++)
        if (!((*p >= '0' && *p <= '9') || *p == '.' || *p == 'e' || *p == 'E' || *p == '+' || *p == '-'))
            return -1;
    char *end;
    double x = strtod(s, &end);
    if (*end || end == s)
        return -1;
    *out = x;
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
        if (eq_nocase(s, yes[i])) {
            *out = 1;
            return 0;
        }
        if (eq_nocase(s, no[i])) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

/* "4M", "1T", or plain bytes when not a whole number of KiB. */
static void fmt_size(char *buf, size_t cap, uint64_t v)
{
    static const char units[] = "KMGT";
    int u = -1;
    while (u < 3 && v && v % 1024 == 0) {
        v /= 1024;
        u++;
    }
    if (u < 0)
        snprintf(buf, cap, "%llu", (unsigned long long)v);
    else
        snprintf(buf, cap, "%llu%c", (unsigned long long)v, units[u]);
}

/* ---------------------------------------------------------------------------------------------
 * Applying one value
 * ------------------------------------------------------------------------------------------- */

static int apply_enum(char *field, const struct kiri_option *o, const char *v, const char *src, struct errbuf *e)
{
    const char *p = o->choices;
    while (*p) {
        size_t n = strcspn(p, "|");
        if (strlen(v) == n) {
            size_t i = 0;
            while (i < n && lower((unsigned char)v[i]) == lower((unsigned char)p[i]))
                i++;
            if (i == n && n < o->size) {
                memcpy(field, p, n);
                field[n] = '\0';
                return 0;
            }
        }
        p += n + (p[n] == '|');
    }
    char list[128];
    size_t j = 0;
    for (p = o->choices; *p && j + 3 < sizeof list; p++) {
        if (*p == '|') {
            list[j++] = ',';
            list[j++] = ' ';
        } else {
            list[j++] = *p;
        }
    }
    list[j] = '\0';
    return bad_value(e, o, v, src, "must be one of %s", list);
}

static int apply_number(char *field, const struct kiri_option *o, const char *v, const char *src, struct errbuf *e)
{
    double x;
    if (parse_double(v, &x))
        return bad_value(e, o, v, src, o->type == KIRI_OPTION_SECONDS ? "not a number of seconds" : "not a number");
    const int ranged = o->flo != 0 || o->fhi != 0;
    if (ranged && (o->flags & KIRI_OPTION_ABOVE_LO) && !(x > o->flo && x <= o->fhi))
        return bad_value(e, o, v, src, "must be more than %g and at most %g", o->flo, o->fhi);
    if (ranged && !(x >= o->flo && x <= o->fhi))
        return bad_value(e, o, v, src, "must be %g..%g", o->flo, o->fhi);
    if (o->size == sizeof(float)) {
        if (x > 3.4e38 || x < -3.4e38)
            return bad_value(e, o, v, src, "out of range");
        *(float *)(void *)field = (float)x;
    } else {
        *(double *)(void *)field = x;
    }
    return 0;
}

/* Sets o's field in dst from the text v, which came from src (NULL: the command line of a
 * command that has no other source). */
static int apply(void *dst, const struct kiri_option *o, const char *v, const char *src, struct errbuf *e)
{
    char *field = (char *)dst + o->off;
    switch (o->type) {
    case KIRI_OPTION_STRING:
    case KIRI_OPTION_STRING_REF:
    case KIRI_OPTION_STRINGS: {
        size_t n = strlen(v);
        if ((int64_t)n < o->lo)
            return bad_value(e, o, v, src, "must not be empty");
        if (o->type == KIRI_OPTION_STRING) {
            if (n >= o->size)
                return bad_value(e, o, v, src, "longer than %zu bytes", o->size - 1);
            memcpy(field, v, n + 1);
        } else if (o->type == KIRI_OPTION_STRING_REF) {
            *(const char **)(void *)field = v;
        } else {
            int *count = (int *)(void *)((char *)dst + o->count_off);
            size_t cap = o->size / sizeof(const char *);
            if (*count < 0 || (size_t)*count >= cap)
                return fail(e, "--%s: given more than %zu times", o->name, cap);
            ((const char **)(void *)field)[(*count)++] = v;
        }
        return 0;
    }
    case KIRI_OPTION_ENUM:
        return apply_enum(field, o, v, src, e);
    case KIRI_OPTION_INT: {
        int64_t x;
        if (parse_int(v, &x))
            return bad_value(e, o, v, src, "not an integer");
        if (x < o->lo || x > o->hi)
            return bad_value(e, o, v, src, "must be %lld..%lld", (long long)o->lo, (long long)o->hi);
        if (o->size == sizeof(int64_t))
            *(int64_t *)(void *)field = x;
        else
            *(int32_t *)(void *)field = (int32_t)x;
        return 0;
    }
    case KIRI_OPTION_UINT64: {
        uint64_t x;
        if (parse_uint64(v, &x))
            return bad_value(e, o, v, src, "not a non-negative integer of at most 64 bits");
        *(uint64_t *)(void *)field = x;
        return 0;
    }
    case KIRI_OPTION_SIZE: {
        uint64_t x, hi = (uint64_t)o->hi;
        if ((uint64_t)SIZE_MAX < hi)
            hi = (uint64_t)SIZE_MAX;
        int rc = parse_size(v, &x);
        if (rc == -1)
            return bad_value(e, o, v, src, "not a size (bytes, or a number with K, M, G or T, as in 512M or 1.5G)");
        char lo_s[32], hi_s[32];
        fmt_size(lo_s, sizeof lo_s, (uint64_t)o->lo);
        fmt_size(hi_s, sizeof hi_s, hi);
        if (rc == -2 || x < (uint64_t)o->lo || x > hi)
            return bad_value(e, o, v, src, "must be %s..%s bytes", lo_s, hi_s);
        *(uint64_t *)(void *)field = x;
        return 0;
    }
    case KIRI_OPTION_FLOAT:
    case KIRI_OPTION_SECONDS:
        return apply_number(field, o, v, src, e);
    case KIRI_OPTION_FLAG: {
        int x;
        if (parse_bool(v, &x))
            return bad_value(e, o, v, src, "must be 1, 0, true, false, yes, no, on or off");
        *(int *)(void *)field = x;
        return 0;
    }
    }
    return fail(e, "--%s: internal error: unknown option type", o->name);
}

/* ---------------------------------------------------------------------------------------------
 * Looking options up
 * ------------------------------------------------------------------------------------------- */

static const struct kiri_option *find_long(const struct kiri_option_spec *s, const char *name, size_t n)
{
    for (size_t g = 0; g < s->n_groups; g++)
        for (size_t i = 0; i < s->groups[g].n_opts; i++) {
            const struct kiri_option *o = &s->groups[g].opts[i];
            if (strlen(o->name) == n && memcmp(o->name, name, n) == 0)
                return o;
        }
    return NULL;
}

static const struct kiri_option *find_short(const struct kiri_option_spec *s, char c)
{
    for (size_t g = 0; g < s->n_groups; g++)
        for (size_t i = 0; i < s->groups[g].n_opts; i++)
            if (s->groups[g].opts[i].short_name == c)
                return &s->groups[g].opts[i];
    return NULL;
}

static const struct kiri_option *find_config_option(const struct kiri_option_spec *s)
{
    for (size_t g = 0; g < s->n_groups; g++)
        for (size_t i = 0; i < s->groups[g].n_opts; i++)
            if (s->groups[g].opts[i].flags & KIRI_OPTION_CONFIG_FILE)
                return &s->groups[g].opts[i];
    return NULL;
}

/* ---------------------------------------------------------------------------------------------
 * The command line
 * ------------------------------------------------------------------------------------------- */

struct walk {
    const struct kiri_option_spec *spec;
    void *dst;               /* NULL: check the syntax only */
    const char *src;         /* the command line's name in messages, or NULL */
    const char **config;     /* set to the last value of the config-file option */
    const char **positional;
    int n_positional;
    int help;                /* stop at -h/--help and report it */
};

/* Walks argv once. Returns 0, -1 on an error, or 1 when w->help is set and help was asked for. */
static int walk_argv(struct walk *w, int argc, char **argv, struct errbuf *e)
{
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const struct kiri_option *o = NULL;
        const char *v = NULL;
        if (w->help && (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0))
            return 1;
        if (a[0] == '-' && a[1] == '-' && a[2]) {
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t n = eq ? (size_t)(eq - name) : strlen(name);
            o = find_long(w->spec, name, n);
            if (!o) {
                if (w->help)
                    continue;   /* an unknown option is taken to have no value */
                return fail(e, "unknown option '%.*s'", (int)(n + 2 > 80 ? 80 : n + 2), a);
            }
            if (eq)
                v = eq + 1;
            else if (o->type == KIRI_OPTION_FLAG)
                v = "1";
        } else if (a[0] == '-' && a[1] && a[1] != '-') {
            o = find_short(w->spec, a[1]);
            if (!o) {
                if (w->help)
                    continue;
                return fail(e, "unknown option '-%c'", a[1]);
            }
            if (a[2])
                v = a + 2 + (a[2] == '=');
            else if (o->type == KIRI_OPTION_FLAG)
                v = "1";
        } else if (w->spec->max_positional > 0 && strcmp(a, "--") != 0) {
            if (w->n_positional >= w->spec->max_positional) {
                if (w->help)
                    continue;
                return fail(e, "unexpected argument '%.80s' (the command takes %d)", a, w->spec->max_positional);
            }
            if (w->positional && w->dst)
                w->positional[w->n_positional] = a;
            w->n_positional++;
            continue;
        } else {
            if (w->help)
                continue;
            return fail(e, "unexpected argument '%.80s' (settings are given as --name VALUE)", a);
        }
        if (!v) {
            if (i + 1 >= argc) {
                if (w->help)
                    return 0;
                return fail(e, "--%s needs a value (%s)", o->name, o->arg ? o->arg : "VALUE");
            }
            v = argv[++i];
        }
        if (!w->dst) {
            if ((o->flags & KIRI_OPTION_CONFIG_FILE) && w->config)
                *w->config = v;
        } else if (apply(w->dst, o, v, w->src, e)) {
            return -1;
        }
    }
    return 0;
}

int kiri_options_help_requested(const struct kiri_option_spec *spec, int argc, char **argv)
{
    struct walk w = {.spec = spec, .help = 1};
    struct errbuf e = {NULL, 0};
    return spec && argv && walk_argv(&w, argc, argv, &e) == 1;
}

/* ---------------------------------------------------------------------------------------------
 * The environment
 * ------------------------------------------------------------------------------------------- */

/* The variable's name for o: PREFIX + NAME upper-cased, '-' as '_'. */
static void env_name(const struct kiri_option_spec *s, const struct kiri_option *o, char *out, size_t cap)
{
    size_t j = 0;
    for (const char *p = s->env_prefix; *p && j + 1 < cap; p++)
        out[j++] = *p;
    for (const char *n = o->name; *n && j + 1 < cap; n++)
        out[j++] = *n == '-' ? '_' : (char)(*n >= 'a' && *n <= 'z' ? *n - 'a' + 'A' : *n);
    out[j] = '\0';
}

static const char *env_get(const struct kiri_option_spec *s, char **envp, const struct kiri_option *o)
{
    if (!s->env_prefix || (o->flags & KIRI_OPTION_NO_ENV) || o->type == KIRI_OPTION_STRINGS)
        return NULL;
    char name[96];
    env_name(s, o, name, sizeof name);
    size_t n = strlen(name);
    const char *found = NULL;
    for (char **p = envp; p && *p; p++)
        if (strncmp(*p, name, n) == 0 && (*p)[n] == '=')
            found = *p + n + 1;
    return found && *found ? found : NULL;
}

static int apply_env(const struct kiri_option_spec *s, void *dst, char **envp, struct errbuf *e)
{
    for (size_t g = 0; g < s->n_groups; g++)
        for (size_t i = 0; i < s->groups[g].n_opts; i++) {
            const struct kiri_option *o = &s->groups[g].opts[i];
            const char *v = env_get(s, envp, o);
            if (!v)
                continue;
            char src[96];
            env_name(s, o, src, sizeof src);
            if (apply(dst, o, v, src, e))
                return -1;
        }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * The config file
 * ------------------------------------------------------------------------------------------- */

static int is_blank(int c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

/* Parses the config file text in buf (NUL-terminated, n bytes, modified in place). */
static int apply_file_text(const struct kiri_option_spec *s, void *dst, const char *path, char *buf, size_t n,
                           struct errbuf *e)
{
    if (memchr(buf, '\0', n)) {
        size_t at = strlen(buf);
        int line = 1;
        for (size_t i = 0; i < at; i++)
            line += buf[i] == '\n';
        return fail(e, "%s line %d: a NUL byte (is this a text file?)", path, line);
    }
    char *p = buf;
    if (n >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0)
        p += 3;
    for (int line = 1; *p; line++) {
        char *end = strchr(p, '\n');
        char *next = end ? end + 1 : p + strlen(p);
        if (end)
            *end = '\0';
        char *b = p, *t = p + strlen(p);
        p = next;
        while (b < t && is_blank((unsigned char)*b))
            b++;
        while (t > b && is_blank((unsigned char)t[-1]))
            t--;
        *t = '\0';
        if (b == t || *b == '#')
            continue;
        char *eq = strchr(b, '=');
        if (!eq)
            return fail(e, "%s line %d: expected key = value", path, line);
        char *k_end = eq;
        while (k_end > b && is_blank((unsigned char)k_end[-1]))
            k_end--;
        *k_end = '\0';
        for (char *q = b; *q; q++)
            if (*q == '_')
                *q = '-';
        char *v = eq + 1;
        while (is_blank((unsigned char)*v))
            v++;
        if (*v == '"') {
            char *close = strchr(v + 1, '"');
            if (!close)
                return fail(e, "%s line %d: the quoted value has no closing quote", path, line);
            char *after = close + 1;
            while (is_blank((unsigned char)*after))
                after++;
            if (*after && *after != '#')
                return fail(e, "%s line %d: unexpected text after the closing quote", path, line);
            *close = '\0';
            v++;
        } else {
            for (char *q = v; *q; q++)
                if (*q == '#' && q > v && is_blank((unsigned char)q[-1])) {
                    *q = '\0';
                    break;
                }
            char *vt = v + strlen(v);
            while (vt > v && is_blank((unsigned char)vt[-1]))
                vt--;
            *vt = '\0';
        }
        if (!*b)
            return fail(e, "%s line %d: expected key = value (the key is missing)", path, line);
        const struct kiri_option *o = find_long(s, b, strlen(b));
        if (!o)
            return fail(e, "%s line %d: unknown key '%.64s'", path, line, b);
        if (o->flags & KIRI_OPTION_CONFIG_FILE)
            return fail(e, "%s line %d: '%s' cannot be set inside a config file", path, line, o->name);
        if (o->type == KIRI_OPTION_STRING_REF || o->type == KIRI_OPTION_STRINGS)
            return fail(e, "%s line %d: '%s' can be given only on the command line", path, line, o->name);
        char src[1200];
        snprintf(src, sizeof src, "%s line %d", path, line);
        if (apply(dst, o, v, src, e))
            return -1;
    }
    return 0;
}

static int apply_file(const struct kiri_option_spec *s, void *dst, const struct kiri_option *config,
                      const char *path, struct errbuf *e)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return fail(e, "--%s %s: cannot open (%s)", config->name, path, strerror(errno));
    char *buf = kiri_mem_alloc(FILE_MAX + 2);
    if (!buf) {
        fclose(f);
        return fail(e, "--%s %s: out of memory", config->name, path);
    }
    size_t n = fread(buf, 1, FILE_MAX + 1, f);
    int bad = ferror(f);
    fclose(f);
    int rc;
    if (bad) {
        rc = fail(e, "--%s %s: cannot read it", config->name, path);
    } else if (n > FILE_MAX) {
        rc = fail(e, "--%s %s: larger than 1 MiB", config->name, path);
    } else {
        buf[n] = '\0';
        rc = apply_file_text(s, dst, path, buf, n, e);
    }
    kiri_mem_free(buf);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Parsing
 * ------------------------------------------------------------------------------------------- */

int kiri_options_parse(const struct kiri_option_spec *spec, void *dst, int argc, char **argv, char **envp,
                       const char **positional, int *n_positional, char *err, size_t err_cap)
{
    struct errbuf e = {err, err_cap};
    if (err && err_cap)
        err[0] = '\0';
    if (!spec || !dst || argc < 0 || (argc > 0 && !argv) || (spec->max_positional > 0 && !positional))
        return fail(&e, "kiri_options_parse: invalid arguments");
    if (n_positional)
        *n_positional = 0;
    const struct kiri_option *config_opt = find_config_option(spec);
    const char *src = spec->env_prefix || config_opt ? "the command line" : NULL;

    /* First the syntax of the whole command line, and which config file it names. */
    const char *config = NULL;
    struct walk check = {.spec = spec, .config = &config};
    if (walk_argv(&check, argc, argv, &e))
        return -1;
    if (config_opt) {
        if (!config)   /* an explicit empty flag means no file, whatever the environment says */
            config = env_get(spec, envp, config_opt);
        if (config && *config) {
            if (config_opt->type == KIRI_OPTION_STRING && strlen(config) >= config_opt->size)
                return fail(&e, "--%s: the path is longer than %zu bytes", config_opt->name, config_opt->size - 1);
            if (apply_file(spec, dst, config_opt, config, &e))
                return -1;
        }
    }
    if (spec->env_prefix && apply_env(spec, dst, envp, &e))
        return -1;
    struct walk w = {.spec = spec, .dst = dst, .src = src, .positional = positional};
    if (walk_argv(&w, argc, argv, &e))
        return -1;
    if (n_positional)
        *n_positional = w.n_positional;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Usage
 * ------------------------------------------------------------------------------------------- */

struct out {
    char *p;
    size_t cap, n;   /* n may pass cap: what does not fit is dropped, the text stays terminated */
};

static void out_put(struct out *o, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++, o->n++)
        if (o->n + 1 < o->cap)
            o->p[o->n] = s[i];
    if (o->cap)
        o->p[o->n < o->cap ? o->n : o->cap - 1] = '\0';
}

static void out_s(struct out *o, const char *s) { out_put(o, s, strlen(s)); }

/* Writes text word by word from column *col, wrapping before USAGE_WIDTH and indenting
 * continuation lines to USAGE_COL. */
static void out_wrapped(struct out *o, const char *text, size_t *col)
{
    int first = 1;
    for (const char *p = text; *p;) {
        while (*p == ' ')
            p++;
        size_t w = strcspn(p, " ");
        if (!w)
            break;
        if (!first && *col + 1 + w > USAGE_WIDTH) {
            out_s(o, "\n");
            for (*col = 0; *col < USAGE_COL; (*col)++)
                out_s(o, " ");
        } else if (!first) {
            out_s(o, " ");
            (*col)++;
        }
        for (size_t i = 0; i < w; i++)
            out_put(o, p[i] == '\x01' ? " " : p + i, 1);   /* \x01: a space that never breaks */
        *col += w;
        p += w;
        first = 0;
    }
}

static void out_option(struct out *o, const struct kiri_option *op)
{
    char head[80];
    const char *arg = op->type == KIRI_OPTION_FLAG ? NULL : op->arg;
    if (op->short_name)
        snprintf(head, sizeof head, "  -%c, --%s%s%s", op->short_name, op->name, arg ? " " : "", arg ? arg : "");
    else
        snprintf(head, sizeof head, "      --%s%s%s", op->name, arg ? " " : "", arg ? arg : "");
    out_s(o, head);
    size_t col = strlen(head);
    if (col + 2 > USAGE_COL) {
        out_s(o, "\n");
        col = 0;
    }
    while (col < USAGE_COL) {
        out_s(o, " ");
        col++;
    }
    char text[600];
    if (op->def)
        snprintf(text, sizeof text, "%s Default:\x01%s.", op->help, op->def);
    else
        snprintf(text, sizeof text, "%s", op->help);
    out_wrapped(o, text, &col);
    out_s(o, "\n");
}

void kiri_options_usage(const struct kiri_option_spec *spec, char *buf, size_t cap)
{
    struct out o = {buf, cap, 0};
    if (cap)
        buf[0] = '\0';
    if (!spec)
        return;
    if (spec->intro)
        out_s(&o, spec->intro);
    for (size_t g = 0; g < spec->n_groups; g++) {
        const struct kiri_option_group *grp = &spec->groups[g];
        if (grp->title) {
            out_s(&o, g || spec->intro ? "\n" : "");
            out_s(&o, grp->title);
            out_s(&o, ":\n");
        }
        for (size_t i = 0; i < grp->n_opts; i++)
            out_option(&o, &grp->opts[i]);
    }
}
