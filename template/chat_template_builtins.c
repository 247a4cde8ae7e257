/* Chat templates: the built-ins a template can call, as tables from name to function: filters
 * and tests keep jinja2's names, parameters and results (tojson is transformers' replacement:
 * json.dumps with ensure_ascii=False); string, dict, list and loop methods follow Python's; the
 * globals are raise_exception and strftime_now (transformers'), namespace, range and dict. Methods that would
 * modify a list or dict are refused, as ImmutableSandboxedEnvironment refuses them.
 *
 * Case mapping (upper, lower, title, capitalize) covers ASCII, Latin-1, Greek and Cyrillic
 * (chat_template_text.c); other scripts are left as they are, where Python would map a few more
 * letters.
 */
#include "chat_template_builtins.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "chat_template_text.h"
#include "kiri.h"
#include "utf8.h"

#define MAX_JSON_DEPTH 64
#define MAX_RANGE 100000 /* jinja2's sandbox refuses longer ranges too */

static int is(const char *name, size_t len, const char *lit)
{
    return strlen(lit) == len && memcmp(name, lit, len) == 0;
}

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

#define MISSING(v) ((v).type == KIRI_CHAT_TYPE_MISSING)
#define IS_INT(v) ((v).type == KIRI_CHAT_TYPE_INT || (v).type == KIRI_CHAT_TYPE_BOOL)

/* Binds arguments to parameters names[0..n) like a Python call: positional ones first, then
 * keywords. Parameters not passed are MISSING. */
static int bind(struct kiri_chat_render *r, int64_t at, const char *what,
                const struct kiri_chat_args *a, const char *const *names, int n,
                struct kiri_chat_value *p)
{
    int next_pos = 0;
    for (int i = 0; i < n; i++)
        p[i].type = KIRI_CHAT_TYPE_MISSING;
    for (int i = 0; i < a->n; i++) {
        int slot = -1;
        if (!a->kw[i]) {
            slot = next_pos++;
            if (slot >= n)
                return kiri_chat_fail(r, at, "%s takes at most %d argument%s", what, n, n == 1 ? "" : "s");
        } else {
            for (int j = 0; j < n && slot < 0; j++)
                if (is(a->kw[i], a->kw_len[i], names[j]))
                    slot = j;
            if (slot < 0)
                return kiri_chat_fail(r, at, "%s got an unexpected keyword argument '%.*s'", what,
                                      (int)a->kw_len[i], a->kw[i]);
        }
        if (!MISSING(p[slot]))
            return kiri_chat_fail(r, at, "%s got multiple values for '%s'", what, names[slot]);
        p[slot] = a->v[i];
    }
    return 0;
}

static int no_args(struct kiri_chat_render *r, int64_t at, const char *what,
                   const struct kiri_chat_args *a)
{
    return bind(r, at, what, a, NULL, 0, NULL);
}

static int want_str(struct kiri_chat_render *r, int64_t at, const char *what,
                    struct kiri_chat_value v)
{
    if (v.type == KIRI_CHAT_TYPE_STR)
        return 0;
    return kiri_chat_fail(r, at, "%s expects a string, not '%s'", what, kiri_chat_type_name(v));
}

static int copy_str(struct kiri_chat_render *r, const char *s, size_t n, char **p,
                    struct kiri_chat_value *out)
{
    if (kiri_chat_new_str(r, n, p, out) < 0)
        return -1;
    memcpy(*p, s, n);
    return 0;
}

enum { CASE_UPPER, CASE_LOWER, CASE_CAPITALIZE, CASE_TITLE_JINJA, CASE_TITLE_PY };

/* jinja2's title filter starts a word after "-", whitespace, "(", "{", "[" or "<"; Python's
 * str.title after any character that is not a letter. */
static int change_case(struct kiri_chat_render *r, struct kiri_chat_value s, int mode,
                       struct kiri_chat_value *out)
{
    char *p;
    if (copy_str(r, s.u.s.p, s.u.s.n, &p, out) < 0)
        return -1;
    int word_start = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t c;
        size_t k = kiri_utf8_decode(s.u.s.p + i, s.u.s.n - i, &c), sp;
        int up;
        switch (mode) {
        case CASE_UPPER: up = 1; break;
        case CASE_LOWER: up = 0; break;
        case CASE_CAPITALIZE: up = i == 0; break;
        case CASE_TITLE_JINJA:
            sp = kiri_chat_space_at(s.u.s.p, s.u.s.n, i);
            up = word_start;
            word_start = sp || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
            break;
        default:
            up = word_start;
            word_start = !kiri_chat_cp_is_cased(c);
            break;
        }
        /* every mapping above keeps the encoded length, so the character is rewritten in place */
        char mapped[4];
        kiri_utf8_encode(up ? kiri_chat_cp_upper(c) : kiri_chat_cp_lower(c), mapped);
        memcpy(p + i, mapped, k);
        i += k;
    }
    return 0;
}

/* Python's str.islower / str.isupper: some cased character, and none of the other case. */
static int all_case(struct kiri_chat_value s, int lower)
{
    int cased = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t c;
        i += kiri_utf8_decode(s.u.s.p + i, s.u.s.n - i, &c);
        if ((lower && kiri_chat_cp_upper(c) != c) || (!lower && kiri_chat_cp_lower(c) != c))
            cased = 1;
        else if (kiri_chat_cp_is_cased(c))
            return 0;
    }
    return cased;
}

/* Does code point c occur in chars? */
static int in_set(const char *chars, size_t n, uint32_t c)
{
    for (size_t i = 0; i < n;) {
        uint32_t d;
        i += kiri_utf8_decode(chars + i, n - i, &d);
        if (d == c)
            return 1;
    }
    return 0;
}

/* str.strip/lstrip/rstrip: whitespace, or the characters of chars when it is a string. */
static int strip(struct kiri_chat_render *r, int64_t at,
                 struct kiri_chat_value s, struct kiri_chat_value chars, int left, int right,
                 struct kiri_chat_value *out)
{
    size_t a = 0, b = s.u.s.n;
    const char *p = s.u.s.p;
    int ws = MISSING(chars) || chars.type == KIRI_CHAT_TYPE_NONE;
    if (!ws && want_str(r, at, "strip", chars) < 0)
        return -1;
    while (left && a < b) {
        uint32_t c = 0;
        size_t k = ws ? kiri_chat_space_at(p, b, a) : kiri_utf8_decode(p + a, b - a, &c);
        if (!k || (!ws && !in_set(chars.u.s.p, chars.u.s.n, c)))
            break;
        a += k;
    }
    while (right && b > a) {
        size_t k, j = b - 1;
        if (ws) {
            if (!(k = kiri_chat_space_before(p, b)))
                break;
        } else {
            uint32_t c;
            while (j > a && ((unsigned char)p[j] & 0xc0) == 0x80)
                j--;
            k = kiri_utf8_decode(p + j, b - j, &c);
            if (!in_set(chars.u.s.p, chars.u.s.n, c))
                break;
        }
        b -= k;
    }
    *out = kiri_chat_str(p + a, b - a);
    return kiri_chat_charge(r, s.u.s.n);
}

/* Python's str.split(sep, maxsplit); sep NONE or MISSING splits on runs of whitespace. */
static int split(struct kiri_chat_render *r, int64_t at,
                 struct kiri_chat_value s, struct kiri_chat_value sep, struct kiri_chat_value max,
                 struct kiri_chat_value *out)
{
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    int ws = MISSING(sep) || sep.type == KIRI_CHAT_TYPE_NONE;
    if (!MISSING(max) && !IS_INT(max))
        return kiri_chat_fail(r, at, "split: maxsplit must be an integer");
    int64_t maxsplit = MISSING(max) ? -1 : max.u.i;
    if (!ws && want_str(r, at, "split", sep) < 0)
        return -1;
    if (!ws && sep.u.s.n == 0)
        return kiri_chat_fail(r, at, "split: empty separator");
    if (kiri_chat_charge(r, n * 2) < 0)
        return -1;
    /* two passes: count the pieces, then fill them in */
    for (int pass = 0; pass < 2; pass++) {
        size_t count = 0, i = 0;
        int64_t left = maxsplit < 0 ? INT64_MAX : maxsplit;
#define ADD(a, b) do { if (pass) out->u.list->v[count] = kiri_chat_str(p + (a), (b) - (a)); count++; } while (0)
        if (ws) {
            size_t k;
            while (left-- > 0) {
                while (i < n && (k = kiri_chat_space_at(p, n, i)))
                    i += k;
                if (i == n)
                    break;
                size_t j = i;
                while (i < n && !kiri_chat_space_at(p, n, i))
                    i++;
                ADD(j, i);
            }
            while (i < n && (k = kiri_chat_space_at(p, n, i)))
                i += k;
            if (i < n)
                ADD(i, n);
        } else {
            const char *hit;
            while (left-- > 0 && (hit = memmem(p + i, n - i, sep.u.s.p, sep.u.s.n))) {
                size_t j = (size_t)(hit - p);
                ADD(i, j);
                i = j + sep.u.s.n;
            }
            ADD(i, n);
        }
#undef ADD
        if (!pass && kiri_chat_new_list(r, count, 0, out) < 0)
            return -1;
    }
    return 0;
}

/* Python's str.replace; an empty `old` inserts `new` around every character. */
static int replace(struct kiri_chat_render *r, struct kiri_chat_value s, struct kiri_chat_value old,
                   struct kiri_chat_value neu, int64_t count, struct kiri_chat_value *out)
{
    struct kiri_chat_buf b = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    int rc = 0;
    if (count < 0)
        count = INT64_MAX;
    if (old.u.s.n == 0) {
        while (rc == 0 && count > 0) {
            rc = kiri_chat_buf_put(r, &b, neu.u.s.p, neu.u.s.n);
            count--;
            if (i == n)
                break;
            uint32_t c;
            size_t k = kiri_utf8_decode(p + i, n - i, &c);
            if (rc == 0)
                rc = kiri_chat_buf_put(r, &b, p + i, k);
            i += k;
        }
    } else {
        const char *hit;
        while (rc == 0 && count > 0 && (hit = memmem(p + i, n - i, old.u.s.p, old.u.s.n))) {
            size_t j = (size_t)(hit - p);
            rc = kiri_chat_buf_put(r, &b, p + i, j - i);
            if (rc == 0)
                rc = kiri_chat_buf_put(r, &b, neu.u.s.p, neu.u.s.n);
            i = j + old.u.s.n;
            count--;
        }
    }
    if (rc == 0)
        rc = kiri_chat_buf_put(r, &b, p + i, n - i);
    if (rc < 0) {
        kiri_chat_buf_free(&b);
        return -1;
    }
    return kiri_chat_buf_finish(r, &b, out);
}

/* jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0. */
static int attr_path(struct kiri_chat_render *r, int64_t at,
                     struct kiri_chat_value item, struct kiri_chat_value path,
                     struct kiri_chat_value *out)
{
    if (IS_INT(path)) {
        if (item.type == KIRI_CHAT_TYPE_LIST) {
            int64_t n = (int64_t)item.u.list->n, i = path.u.i < 0 ? path.u.i + n : path.u.i;
            *out = i >= 0 && i < n ? item.u.list->v[i] : kiri_chat_undef("item", 4);
            return 0;
        }
        *out = kiri_chat_undef("item", 4);
        return item.type == KIRI_CHAT_TYPE_UNDEF ? kiri_chat_fail(r, at, "a value is undefined") : 0;
    }
    if (want_str(r, at, "attribute", path) < 0)
        return -1;
    const char *s = path.u.s.p;
    size_t n = path.u.s.n, i = 0;
    for (;;) {
        size_t j = i;
        while (j < n && s[j] != '.')
            j++;
        int digits = j > i;
        int64_t idx = 0;
        for (size_t k = i; k < j && digits; k++) {
            digits = s[k] >= '0' && s[k] <= '9' && idx < INT64_MAX / 10;
            idx = idx * 10 + (s[k] - '0');
        }
        if (digits) {
            if (attr_path(r, at, item, kiri_chat_int(idx), &item) < 0)
                return -1;
        } else if (kiri_chat_getattr(r, at, item, s + i, j - i, &item) < 0) {
            return -1;
        }
        if (j >= n)
            break;
        i = j + 1;
    }
    *out = item;
    return 0;
}

static int iterate_list(struct kiri_chat_render *r, int64_t at,
                        struct kiri_chat_value v, struct kiri_chat_value *out)
{
    const struct kiri_chat_value *items;
    size_t n;
    if (kiri_chat_iterate(r, at, v, &items, &n) < 0 || kiri_chat_new_list(r, n, 0, out) < 0)
        return -1;
    if (n)
        memcpy(out->u.list->v, items, n * sizeof *items);
    return 0;
}

enum { DICT_ITEMS, DICT_KEYS, DICT_VALUES };

/* dict.items() (as pairs), keys() or values(), as a list. */
static int dict_entries(struct kiri_chat_render *r, const struct kiri_chat_dict *dict, int which,
                        struct kiri_chat_value *out)
{
    if (kiri_chat_new_list(r, dict->n, 0, out) < 0)
        return -1;
    for (size_t i = 0; i < dict->n; i++) {
        if (which == DICT_ITEMS) {
            struct kiri_chat_value pair;
            if (kiri_chat_new_list(r, 2, 1, &pair) < 0)
                return -1;
            pair.u.list->v[0] = dict->k[i];
            pair.u.list->v[1] = dict->v[i];
            out->u.list->v[i] = pair;
        } else {
            out->u.list->v[i] = which == DICT_KEYS ? dict->k[i] : dict->v[i];
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * JSON (transformers' tojson: Python's json.dumps)
 * ------------------------------------------------------------------------------------------- */

struct json_opts {
    int ensure_ascii, pretty, sort_keys;
    struct kiri_chat_value indent, item_sep, key_sep; /* strings */
};

static int json_str(struct kiri_chat_render *r, struct kiri_chat_buf *b, const char *s, size_t n,
                    int ensure_ascii)
{
    size_t run = 0;
    if (kiri_chat_buf_put(r, b, "\"", 1) < 0)
        return -1;
    for (size_t i = 0; i < n;) {
        uint32_t c;
        size_t k = kiri_utf8_decode(s + i, n - i, &c);
        char esc[16] = "";
        switch (c) {
        case '"': strcpy(esc, "\\\""); break;
        case '\\': strcpy(esc, "\\\\"); break;
        case '\n': strcpy(esc, "\\n"); break;
        case '\r': strcpy(esc, "\\r"); break;
        case '\t': strcpy(esc, "\\t"); break;
        case '\b': strcpy(esc, "\\b"); break;
        case '\f': strcpy(esc, "\\f"); break;
        default:
            if (c < 0x20 || (ensure_ascii && c > 0x7e && c < 0x10000))
                snprintf(esc, sizeof esc, "\\u%04x", (unsigned)c);
            else if (ensure_ascii && c >= 0x10000)
                snprintf(esc, sizeof esc, "\\u%04x\\u%04x", (unsigned)(0xd800 + ((c - 0x10000) >> 10)),
                         (unsigned)(0xdc00 + ((c - 0x10000) & 0x3ff)));
        }
        if (esc[0]) {
            if (kiri_chat_buf_put(r, b, s + run, i - run) < 0 ||
                kiri_chat_buf_put(r, b, esc, strlen(esc)) < 0)
                return -1;
            run = i + k;
        }
        i += k;
    }
    if (kiri_chat_buf_put(r, b, s + run, n - run) < 0)
        return -1;
    return kiri_chat_buf_put(r, b, "\"", 1);
}

static int json_newline(struct kiri_chat_render *r, struct kiri_chat_buf *b,
                        const struct json_opts *o, int level)
{
    if (!o->pretty)
        return 0;
    if (kiri_chat_buf_put(r, b, "\n", 1) < 0)
        return -1;
    for (int i = 0; i < level; i++)
        if (kiri_chat_buf_put(r, b, o->indent.u.s.p, o->indent.u.s.n) < 0)
            return -1;
    return 0;
}

static int json_value(struct kiri_chat_render *r, int64_t at,
                      struct kiri_chat_buf *b, struct kiri_chat_value v, const struct json_opts *o,
                      int level);

static int json_key(struct kiri_chat_render *r, int64_t at,
                    struct kiri_chat_buf *b, struct kiri_chat_value k, const struct json_opts *o)
{
    char tmp[48];
    switch (k.type) {
    case KIRI_CHAT_TYPE_STR: return json_str(r, b, k.u.s.p, k.u.s.n, o->ensure_ascii);
    case KIRI_CHAT_TYPE_BOOL: return json_str(r, b, k.u.i ? "true" : "false", k.u.i ? 4 : 5, 0);
    case KIRI_CHAT_TYPE_NONE: return json_str(r, b, "null", 4, 0);
    case KIRI_CHAT_TYPE_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)k.u.i);
        return json_str(r, b, tmp, strlen(tmp), 0);
    case KIRI_CHAT_TYPE_FLOAT:
        kiri_chat_format_float(k.u.f, tmp, sizeof tmp);
        return json_str(r, b, tmp, strlen(tmp), 0);
    default:
        return kiri_chat_fail(r, at, "keys must be str, int, float, bool or None, not %s",
                              kiri_chat_type_name(k));
    }
}

static int json_dict(struct kiri_chat_render *r, int64_t at,
                     struct kiri_chat_buf *b, const struct kiri_chat_dict *d,
                     const struct json_opts *o, int level)
{
    size_t *order = d->n ? kiri_chat_alloc(r, d->n * sizeof *order) : NULL;
    if (d->n && !order)
        return -1;
    for (size_t i = 0; i < d->n; i++)
        order[i] = i;
    if (o->sort_keys) {
        /* insertion sort: dicts in templates are small, and it needs no callback state */
        for (size_t i = 1; i < d->n; i++) {
            for (size_t j = i; j > 0; j--) {
                int lt;
                if (kiri_chat_less(r, at, d->k[order[j]], d->k[order[j - 1]], &lt) < 0)
                    return -1;
                if (!lt)
                    break;
                size_t t = order[j];
                order[j] = order[j - 1];
                order[j - 1] = t;
            }
        }
    }
    if (kiri_chat_buf_put(r, b, "{", 1) < 0)
        return -1;
    for (size_t i = 0; i < d->n; i++) {
        if (i && kiri_chat_buf_put(r, b, o->item_sep.u.s.p, o->item_sep.u.s.n) < 0)
            return -1;
        if (json_newline(r, b, o, level + 1) < 0 || json_key(r, at, b, d->k[order[i]], o) < 0 ||
            kiri_chat_buf_put(r, b, o->key_sep.u.s.p, o->key_sep.u.s.n) < 0 ||
            json_value(r, at, b, d->v[order[i]], o, level + 1) < 0)
            return -1;
    }
    if (d->n && json_newline(r, b, o, level) < 0)
        return -1;
    return kiri_chat_buf_put(r, b, "}", 1);
}

static int json_value(struct kiri_chat_render *r, int64_t at,
                      struct kiri_chat_buf *b, struct kiri_chat_value v, const struct json_opts *o,
                      int level)
{
    char tmp[48];
    if (level > MAX_JSON_DEPTH)
        return kiri_chat_fail(r, at, "value nested too deeply for tojson");
    switch (v.type) {
    case KIRI_CHAT_TYPE_NONE: return kiri_chat_buf_put(r, b, "null", 4);
    case KIRI_CHAT_TYPE_BOOL: return kiri_chat_buf_put(r, b, v.u.i ? "true" : "false", v.u.i ? 4 : 5);
    case KIRI_CHAT_TYPE_INT:
        snprintf(tmp, sizeof tmp, "%lld", (long long)v.u.i);
        return kiri_chat_buf_put(r, b, tmp, strlen(tmp));
    case KIRI_CHAT_TYPE_FLOAT:
        if (isnan(v.u.f))
            snprintf(tmp, sizeof tmp, "NaN");
        else if (isinf(v.u.f))
            snprintf(tmp, sizeof tmp, v.u.f < 0 ? "-Infinity" : "Infinity");
        else
            kiri_chat_format_float(v.u.f, tmp, sizeof tmp);
        return kiri_chat_buf_put(r, b, tmp, strlen(tmp));
    case KIRI_CHAT_TYPE_STR: return json_str(r, b, v.u.s.p, v.u.s.n, o->ensure_ascii);
    case KIRI_CHAT_TYPE_LIST:
        if (kiri_chat_buf_put(r, b, "[", 1) < 0)
            return -1;
        for (size_t i = 0; i < v.u.list->n; i++) {
            if (i && kiri_chat_buf_put(r, b, o->item_sep.u.s.p, o->item_sep.u.s.n) < 0)
                return -1;
            if (json_newline(r, b, o, level + 1) < 0 ||
                json_value(r, at, b, v.u.list->v[i], o, level + 1) < 0)
                return -1;
        }
        if (v.u.list->n && json_newline(r, b, o, level) < 0)
            return -1;
        return kiri_chat_buf_put(r, b, "]", 1);
    case KIRI_CHAT_TYPE_DICT: return json_dict(r, at, b, v.u.dict, o, level);
    default:
        return kiri_chat_fail(r, at, "Object of type %s is not JSON serializable",
                              kiri_chat_type_name(v));
    }
}

static int filter_tojson(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                         struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    struct kiri_chat_value p[4];
    struct json_opts o;
    char *spaces;
    if (bind(r, at, "tojson", a, names, 4, p) < 0)
        return -1;
    memset(&o, 0, sizeof o);
    o.ensure_ascii = !MISSING(p[0]) && kiri_chat_truthy(p[0]);
    o.sort_keys = !MISSING(p[3]) && kiri_chat_truthy(p[3]);
    o.pretty = !MISSING(p[1]) && p[1].type != KIRI_CHAT_TYPE_NONE;
    if (o.pretty) {
        if (p[1].type == KIRI_CHAT_TYPE_STR) {
            o.indent = p[1];
        } else if (IS_INT(p[1])) {
            int64_t w = p[1].u.i < 0 ? 0 : p[1].u.i > 64 ? 64 : p[1].u.i;
            if (kiri_chat_new_str(r, (size_t)w, &spaces, &o.indent) < 0)
                return -1;
            memset(spaces, ' ', (size_t)w);
        } else {
            return kiri_chat_fail(r, at, "tojson: indent must be an integer or a string");
        }
    }
    o.item_sep = kiri_chat_str(o.pretty ? "," : ", ", o.pretty ? 1 : 2);
    o.key_sep = kiri_chat_str(": ", 2);
    if (!MISSING(p[2]) && p[2].type != KIRI_CHAT_TYPE_NONE) {
        if (p[2].type != KIRI_CHAT_TYPE_LIST || p[2].u.list->n != 2 ||
            p[2].u.list->v[0].type != KIRI_CHAT_TYPE_STR || p[2].u.list->v[1].type != KIRI_CHAT_TYPE_STR)
            return kiri_chat_fail(r, at, "tojson: separators must be two strings");
        o.item_sep = p[2].u.list->v[0];
        o.key_sep = p[2].u.list->v[1];
    }
    struct kiri_chat_buf b = {0};
    if (json_value(r, at, &b, in, &o, 0) < 0) {
        kiri_chat_buf_free(&b);
        return -1;
    }
    return kiri_chat_buf_finish(r, &b, out);
}

/* ---------------------------------------------------------------------------------------------
 * Filters
 * ------------------------------------------------------------------------------------------- */

/* A digit of some base up to 36 (Python's int() takes underscores between any of them). */
static int is_ascii_alnum(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Python's int(str, base) after stripping, then int(float(str)), as jinja2's int filter does. */
static int parse_int(const char *s, size_t n, int base, int64_t *out)
{
    char buf[64];
    size_t m = 0, i = 0;
    while (n && kiri_chat_space_before(s, n))
        n -= kiri_chat_space_before(s, n);
    while (i < n && kiri_chat_space_at(s, n, i))
        i += kiri_chat_space_at(s, n, i);
    for (; i < n && m + 1 < sizeof buf; i++) {
        /* Python allows single underscores between digits */
        if (s[i] == '_' && m > 0 && buf[m - 1] != '_' && i + 1 < n && s[i + 1] != '_' &&
            is_ascii_alnum(buf[m - 1]) && is_ascii_alnum(s[i + 1]))
            continue;
        buf[m++] = s[i];
    }
    if (i < n || m == 0)
        return -1;
    buf[m] = '\0';
    char *end;
    long long v = strtoll(buf, &end, base);
    if (*end == '\0' && v != LLONG_MAX && v != LLONG_MIN)
        return *out = v, 0;
    if (strpbrk(buf, "xXpP"))
        return -1;
    double d = strtod(buf, &end);
    if (*end != '\0' || !isfinite(d) || fabs(d) >= 9.2e18)
        return -1;
    *out = (int64_t)d;
    return 0;
}

/* The arguments of a from index first on, for the filter or test that map and select apply. */
static void args_from(const struct kiri_chat_args *a, int first, struct kiri_chat_args *rest)
{
    for (int i = first; i < a->n; i++) {
        rest->v[rest->n] = a->v[i];
        rest->kw[rest->n] = a->kw[i];
        rest->kw_len[rest->n++] = a->kw_len[i];
    }
}

enum { SELECT_KEEP = 1, SELECT_BY_ATTR = 2 };

/* select, reject, selectattr, rejectattr: the items whose test (or truth) is true (mode
 * SELECT_KEEP) or false, testing an attribute of each (a->v[0]) with SELECT_BY_ATTR. */
static int select_items(struct kiri_chat_render *r, int64_t at, int mode, struct kiri_chat_value in,
                        struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    int by_attr = (mode & SELECT_BY_ATTR) != 0, keep_if = (mode & SELECT_KEEP) != 0;
    int off = by_attr, test = -1;
    struct kiri_chat_args rest = {0};
    const struct kiri_chat_value *items;
    size_t n, k = 0;
    if (!kiri_chat_truthy(in)) /* jinja2 yields nothing for a false value, whatever it is */
        return kiri_chat_new_list(r, 0, 0, out);
    if ((by_attr && (a->n < 1 || a->kw[0])) || (a->n > off && a->kw[off]))
        return kiri_chat_fail(r, at, "%s: bad arguments", by_attr ? "selectattr" : "select");
    if (a->n > off) {
        if (want_str(r, at, "the test name", a->v[off]) < 0)
            return -1;
        if ((test = kiri_chat_test_find(a->v[off].u.s.p, a->v[off].u.s.n)) < 0)
            return kiri_chat_fail(r, at, "unknown test '%.*s'", (int)a->v[off].u.s.n, a->v[off].u.s.p);
        args_from(a, off + 1, &rest);
    }
    if (kiri_chat_iterate(r, at, in, &items, &n) < 0 || kiri_chat_new_list(r, n, 0, out) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        struct kiri_chat_value v = items[i];
        int res;
        if (by_attr && attr_path(r, at, v, a->v[0], &v) < 0)
            return -1;
        if (test < 0)
            res = kiri_chat_truthy(v);
        else if (kiri_chat_test_apply(r, at, test, v, &rest, &res) < 0)
            return -1;
        if (res == keep_if)
            out->u.list->v[k++] = items[i];
    }
    out->u.list->n = k;
    return 0;
}

static int filter_map(struct kiri_chat_render *r, int64_t at,
                      struct kiri_chat_value in, struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    const struct kiri_chat_value *items;
    struct kiri_chat_value attr = {KIRI_CHAT_TYPE_MISSING, {0}}, dflt = attr;
    struct kiri_chat_args rest = {0};
    int filter = -1;
    size_t n;
    if (!kiri_chat_truthy(in)) /* as in select: a false value maps to nothing */
        return kiri_chat_new_list(r, 0, 0, out);
    if (a->n > 0 && !a->kw[0]) {
        if (want_str(r, at, "the filter name", a->v[0]) < 0)
            return -1;
        if ((filter = kiri_chat_filter_find(a->v[0].u.s.p, a->v[0].u.s.n)) < 0)
            return kiri_chat_fail(r, at, "unknown filter '%.*s'", (int)a->v[0].u.s.n, a->v[0].u.s.p);
        args_from(a, 1, &rest);
    } else {
        static const char *const names[] = {"attribute", "default"};
        struct kiri_chat_value p[2];
        if (bind(r, at, "map", a, names, 2, p) < 0)
            return -1;
        if (MISSING(p[0]))
            return kiri_chat_fail(r, at, "map requires a filter name or attribute=");
        attr = p[0];
        dflt = p[1];
    }
    if (kiri_chat_iterate(r, at, in, &items, &n) < 0 || kiri_chat_new_list(r, n, 0, out) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        struct kiri_chat_value *v = &out->u.list->v[i];
        if (filter >= 0) {
            struct kiri_chat_args copy = rest;
            if (kiri_chat_filter_apply(r, at, filter, items[i], &copy, v) < 0)
                return -1;
        } else {
            if (attr_path(r, at, items[i], attr, v) < 0)
                return -1;
            if (v->type == KIRI_CHAT_TYPE_UNDEF && !MISSING(dflt) && dflt.type != KIRI_CHAT_TYPE_NONE)
                *v = dflt;
        }
    }
    return 0;
}

/* jinja2's indent: later lines get the prefix (blank ones only with blank=true). */
static int filter_indent(struct kiri_chat_render *r, int64_t at,
                         struct kiri_chat_value s, struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"width", "first", "blank"};
    struct kiri_chat_value p[3], ind = kiri_chat_str("    ", 4);
    char *sp;
    if (bind(r, at, "indent", a, names, 3, p) < 0)
        return -1;
    if (s.type == KIRI_CHAT_TYPE_UNDEF)
        return kiri_chat_fail(r, at, "'%.*s' is undefined", (int)s.u.s.n, s.u.s.p);
    if (want_str(r, at, "indent", s) < 0)
        return -1;
    if (p[0].type == KIRI_CHAT_TYPE_STR) {
        ind = p[0];
    } else if (IS_INT(p[0])) {
        size_t w = p[0].u.i < 0 ? 0 : p[0].u.i > 256 ? 256 : (size_t)p[0].u.i;
        if (kiri_chat_new_str(r, w, &sp, &ind) < 0)
            return -1;
        memset(sp, ' ', w);
    } else if (!MISSING(p[0])) {
        return kiri_chat_fail(r, at, "indent: width must be an integer or a string");
    }
    int first = !MISSING(p[1]) && kiri_chat_truthy(p[1]);
    int blank = !MISSING(p[2]) && kiri_chat_truthy(p[2]);
    struct kiri_chat_buf b = {0};
    const char *t = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    int line = 0, rc = 0;
    if (first)
        rc = kiri_chat_buf_put(r, &b, ind.u.s.p, ind.u.s.n);
    /* Python's splitlines() of s + "\n": every line ends at one of its line boundaries */
    while (rc == 0 && i <= n) {
        size_t j = i, brk = 0;
        while (j < n) {
            unsigned char c = (unsigned char)t[j];
            uint32_t cp;
            if (c == '\r')
                brk = j + 1 < n && t[j + 1] == '\n' ? 2 : 1;
            else if (c == '\n' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e))
                brk = 1;
            else if (c >= 0xc2 && (kiri_utf8_decode(t + j, n - j, &cp),
                                   cp == 0x85 || cp == 0x2028 || cp == 0x2029))
                brk = cp == 0x85 ? 2 : 3;
            if (brk)
                break;
            j++;
        }
        if (line > 0) {
            rc = kiri_chat_buf_put(r, &b, "\n", 1);
            if (rc == 0 && (blank || j > i))
                rc = kiri_chat_buf_put(r, &b, ind.u.s.p, ind.u.s.n);
        }
        if (rc == 0)
            rc = kiri_chat_buf_put(r, &b, t + i, j - i);
        line++;
        if (j >= n)
            break;
        i = j + brk;
    }
    if (rc < 0) {
        kiri_chat_buf_free(&b);
        return -1;
    }
    return kiri_chat_buf_finish(r, &b, out);
}

static int filter_round(struct kiri_chat_render *r, int64_t at,
                        struct kiri_chat_value v, struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"precision", "method"};
    struct kiri_chat_value p[2];
    if (bind(r, at, "round", a, names, 2, p) < 0)
        return -1;
    int64_t prec = MISSING(p[0]) ? 0 : IS_INT(p[0]) ? p[0].u.i : -1;
    const char *m = p[1].type == KIRI_CHAT_TYPE_STR ? p[1].u.s.p : "common";
    size_t ml = p[1].type == KIRI_CHAT_TYPE_STR ? p[1].u.s.n : 6;
    if (prec < 0 || prec > 30 || !(is(m, ml, "common") || is(m, ml, "ceil") || is(m, ml, "floor")))
        return kiri_chat_fail(r, at, "round: unsupported precision or method");
    if (v.type != KIRI_CHAT_TYPE_FLOAT && !IS_INT(v))
        return kiri_chat_fail(r, at, "round expects a number, not '%s'", kiri_chat_type_name(v));
    double x = v.type == KIRI_CHAT_TYPE_FLOAT ? v.u.f : (double)v.u.i, scale = pow(10, (double)prec);
    if (m[0] == 'c' && m[1] == 'o') {
        if (v.type != KIRI_CHAT_TYPE_FLOAT) {
            *out = kiri_chat_int(v.u.i);
            return 0;
        }
        /* printf rounds the exact binary value half-to-even, as Python's round does */
        char buf[400];
        snprintf(buf, sizeof buf, "%.*f", (int)prec, x);
        x = isfinite(x) ? strtod(buf, NULL) : x;
    } else {
        x = (m[0] == 'c' ? ceil(x * scale) : floor(x * scale)) / scale;
    }
    out->type = KIRI_CHAT_TYPE_FLOAT;
    out->u.f = x;
    return 0;
}


static int filter_abs(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                      struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (no_args(r, at, "abs", a) < 0)
        return -1;
    if (in.type == KIRI_CHAT_TYPE_FLOAT)
        *out = kiri_chat_float(fabs(in.u.f));
    else if (IS_INT(in) && in.u.i != INT64_MIN)
        *out = kiri_chat_int(in.u.i < 0 ? -in.u.i : in.u.i);
    else
        return kiri_chat_fail(r, at, "bad operand type for abs(): '%s'", kiri_chat_type_name(in));
    return 0;
}

/* The case filters print their input first (jinja2 calls str() on it). */
static int case_filter(struct kiri_chat_render *r, int64_t at, int mode, struct kiri_chat_value in,
                       struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    struct kiri_chat_value s;
    if (no_args(r, at, "this filter", a) < 0 || kiri_chat_to_str(r, in, &s) < 0)
        return -1;
    return change_case(r, s, mode, out);
}

static int filter_default(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                          struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"default_value", "boolean"};
    struct kiri_chat_value p[2];
    if (bind(r, at, "default", a, names, 2, p) < 0)
        return -1;
    int use = in.type == KIRI_CHAT_TYPE_UNDEF ||
              (!MISSING(p[1]) && kiri_chat_truthy(p[1]) && !kiri_chat_truthy(in));
    *out = !use ? in : MISSING(p[0]) ? kiri_chat_str("", 0) : p[0];
    return 0;
}

static int filter_escape(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                         struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    struct kiri_chat_buf b = {0};
    struct kiri_chat_value s;
    int rc = no_args(r, at, "escape", a) < 0 || kiri_chat_to_str(r, in, &s) < 0 ? -1 : 0;
    size_t run = 0;
    for (size_t i = 0; rc == 0 && i < s.u.s.n; i++) {
        const char *rep = NULL;
        switch (s.u.s.p[i]) {
        case '&': rep = "&amp;"; break;
        case '<': rep = "&lt;"; break;
        case '>': rep = "&gt;"; break;
        case '"': rep = "&#34;"; break;
        case '\'': rep = "&#39;"; break;
        default: break;
        }
        if (rep) {
            rc = kiri_chat_buf_put(r, &b, s.u.s.p + run, i - run);
            if (rc == 0)
                rc = kiri_chat_buf_puts(r, &b, rep);
            run = i + 1;
        }
    }
    if (rc == 0)
        rc = kiri_chat_buf_put(r, &b, s.u.s.p + run, s.u.s.n - run);
    if (rc < 0) {
        kiri_chat_buf_free(&b);
        return -1;
    }
    return kiri_chat_buf_finish(r, &b, out);
}

/* first and last (last 1): an end item of a sequence, Undefined when it is empty. */
static int end_item(struct kiri_chat_render *r, int64_t at, int last, struct kiri_chat_value in,
                    struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    const struct kiri_chat_value *items;
    size_t n;
    if (no_args(r, at, last ? "last" : "first", a) < 0 || kiri_chat_iterate(r, at, in, &items, &n) < 0)
        return -1;
    *out = n == 0 ? kiri_chat_undef("item", 4) : items[last ? n - 1 : 0];
    return 0;
}

static int filter_float(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                        struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"default"};
    struct kiri_chat_value p[1];
    if (bind(r, at, "float", a, names, 1, p) < 0)
        return -1;
    if (in.type == KIRI_CHAT_TYPE_UNDEF) /* float(Undefined) raises in jinja2 */
        return kiri_chat_fail(r, at, "'%.*s' is undefined", (int)in.u.s.n, in.u.s.p);
    if (in.type == KIRI_CHAT_TYPE_FLOAT || IS_INT(in)) {
        *out = kiri_chat_float(in.type == KIRI_CHAT_TYPE_FLOAT ? in.u.f : (double)in.u.i);
        return 0;
    }
    if (in.type == KIRI_CHAT_TYPE_STR && in.u.s.n < 64 && !memchr(in.u.s.p, 'x', in.u.s.n) &&
        !memchr(in.u.s.p, 'X', in.u.s.n)) {
        char buf[64], *end;
        memcpy(buf, in.u.s.p, in.u.s.n);
        buf[in.u.s.n] = '\0';
        double d = strtod(buf, &end);
        while (*end == ' ' || (*end >= '\t' && *end <= '\r'))
            end++;
        if (end != buf && *end == '\0') {
            *out = kiri_chat_float(d);
            return 0;
        }
    }
    *out = MISSING(p[0]) ? kiri_chat_float(0.0) : p[0];
    return 0;
}

static int filter_int(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                      struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"default", "base"};
    struct kiri_chat_value p[2];
    int64_t v;
    if (bind(r, at, "int", a, names, 2, p) < 0)
        return -1;
    if (in.type == KIRI_CHAT_TYPE_UNDEF)
        return kiri_chat_fail(r, at, "'%.*s' is undefined", (int)in.u.s.n, in.u.s.p);
    int base = IS_INT(p[1]) ? (int)p[1].u.i : 10;
    if (IS_INT(in)) {
        *out = kiri_chat_int(in.u.i);
        return 0;
    }
    if (in.type == KIRI_CHAT_TYPE_FLOAT && isfinite(in.u.f) && fabs(in.u.f) < 9.2e18) {
        *out = kiri_chat_int((int64_t)in.u.f);
        return 0;
    }
    if (in.type == KIRI_CHAT_TYPE_STR && base >= 2 && base <= 36 &&
        parse_int(in.u.s.p, in.u.s.n, base, &v) == 0) {
        *out = kiri_chat_int(v);
        return 0;
    }
    *out = MISSING(p[0]) ? kiri_chat_int(0) : p[0];
    return 0;
}

static int filter_items(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                        struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (no_args(r, at, "items", a) < 0)
        return -1;
    if (in.type == KIRI_CHAT_TYPE_UNDEF)
        return kiri_chat_new_list(r, 0, 0, out);
    if (in.type != KIRI_CHAT_TYPE_DICT)
        return kiri_chat_fail(r, at, "items: can only get item pairs from a mapping");
    return dict_entries(r, in.u.dict, DICT_ITEMS, out);
}

/* jinja2's dictsort(case_sensitive=false, by='key', reverse=false): the (key, value) pairs of a
 * mapping, sorted stably by key or value, strings compared in lower case unless case_sensitive. */
static int filter_dictsort(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                           struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"case_sensitive", "by", "reverse"};
    struct kiri_chat_value p[3];
    if (bind(r, at, "dictsort", a, names, 3, p) < 0)
        return -1;
    if (in.type != KIRI_CHAT_TYPE_DICT)
        return kiri_chat_fail(r, at, "dictsort: you can only sort dictionaries");
    const int case_sensitive = !MISSING(p[0]) && kiri_chat_truthy(p[0]);
    const int reverse = !MISSING(p[2]) && kiri_chat_truthy(p[2]);
    int by_value = 0;
    if (!MISSING(p[1])) {
        if (p[1].type == KIRI_CHAT_TYPE_STR && p[1].u.s.n == 5 && !memcmp(p[1].u.s.p, "value", 5))
            by_value = 1;
        else if (!(p[1].type == KIRI_CHAT_TYPE_STR && p[1].u.s.n == 3 && !memcmp(p[1].u.s.p, "key", 3)))
            return kiri_chat_fail(r, at, "dictsort: you can only sort by either \"key\" or \"value\"");
    }
    const size_t n = in.u.dict->n;
    struct kiri_chat_value keys;
    if (dict_entries(r, in.u.dict, DICT_ITEMS, out) < 0 || kiri_chat_new_list(r, n, 0, &keys) < 0)
        return -1;
    struct kiri_chat_value *items = out->u.list->v, *k = keys.u.list->v;
    for (size_t i = 0; i < n; i++) {
        k[i] = by_value ? in.u.dict->v[i] : in.u.dict->k[i];
        if (!case_sensitive && k[i].type == KIRI_CHAT_TYPE_STR &&
            change_case(r, k[i], CASE_LOWER, &k[i]) < 0)
            return -1;
    }
    /* Insertion sort: stable, and a template's dicts are small; each comparison is a step. */
    for (size_t i = 1; i < n; i++) {
        struct kiri_chat_value ki = k[i], vi = items[i];
        size_t j = i;
        while (j > 0) {
            int before;
            if (kiri_chat_step(r, 1) < 0 ||
                kiri_chat_less(r, at, reverse ? k[j - 1] : ki, reverse ? ki : k[j - 1], &before) < 0)
                return -1;
            if (!before)
                break;
            k[j] = k[j - 1];
            items[j] = items[j - 1];
            j--;
        }
        k[j] = ki;
        items[j] = vi;
    }
    return 0;
}

static int filter_join(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                       struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"d", "attribute"};
    struct kiri_chat_value p[2], sep = kiri_chat_str("", 0);
    struct kiri_chat_buf b = {0};
    const struct kiri_chat_value *items;
    size_t n;
    if (bind(r, at, "join", a, names, 2, p) < 0 || kiri_chat_iterate(r, at, in, &items, &n) < 0 ||
        (!MISSING(p[0]) && kiri_chat_to_str(r, p[0], &sep) < 0))
        return -1;
    for (size_t i = 0; i < n; i++) {
        struct kiri_chat_value v = items[i];
        if ((i && kiri_chat_buf_put(r, &b, sep.u.s.p, sep.u.s.n) < 0) ||
            (!MISSING(p[1]) && p[1].type != KIRI_CHAT_TYPE_NONE && attr_path(r, at, v, p[1], &v) < 0) ||
            kiri_chat_buf_value(r, &b, v, 0, 0) < 0) {
            kiri_chat_buf_free(&b);
            return -1;
        }
    }
    return kiri_chat_buf_finish(r, &b, out);
}

static int filter_length(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                         struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (no_args(r, at, "length", a) < 0)
        return -1;
    switch (in.type) {
    case KIRI_CHAT_TYPE_STR: *out = kiri_chat_int((int64_t)kiri_chat_cp_len(in.u.s.p, in.u.s.n)); break;
    case KIRI_CHAT_TYPE_LIST: *out = kiri_chat_int((int64_t)in.u.list->n); break;
    case KIRI_CHAT_TYPE_DICT: *out = kiri_chat_int((int64_t)in.u.dict->n); break;
    case KIRI_CHAT_TYPE_UNDEF: *out = kiri_chat_int(0); break;
    default: return kiri_chat_fail(r, at, "object of type '%s' has no len()", kiri_chat_type_name(in));
    }
    return kiri_chat_charge(r, in.type == KIRI_CHAT_TYPE_STR ? in.u.s.n : 0);
}

static int filter_list(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                       struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (no_args(r, at, "list", a) < 0)
        return -1;
    return iterate_list(r, at, in, out);
}

static int filter_replace(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                          struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"old", "new", "count"};
    struct kiri_chat_value p[3], s, old, neu;
    if (bind(r, at, "replace", a, names, 3, p) < 0)
        return -1;
    if (MISSING(p[0]) || MISSING(p[1]))
        return kiri_chat_fail(r, at, "replace needs old and new");
    if (kiri_chat_to_str(r, in, &s) < 0 || kiri_chat_to_str(r, p[0], &old) < 0 ||
        kiri_chat_to_str(r, p[1], &neu) < 0)
        return -1;
    int64_t count = IS_INT(p[2]) ? p[2].u.i : -1;
    return replace(r, s, old, neu, count, out);
}

static int filter_reverse(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                          struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (no_args(r, at, "reverse", a) < 0)
        return -1;
    if (in.type == KIRI_CHAT_TYPE_STR) {
        char *w;
        if (kiri_chat_new_str(r, in.u.s.n, &w, out) < 0)
            return -1;
        for (size_t i = 0; i < in.u.s.n;) {
            uint32_t c;
            size_t k = kiri_utf8_decode(in.u.s.p + i, in.u.s.n - i, &c);
            memcpy(w + in.u.s.n - i - k, in.u.s.p + i, k);
            i += k;
        }
        return 0;
    }
    if (iterate_list(r, at, in, out) < 0)
        return -1;
    for (size_t i = 0, j = out->u.list->n; i + 1 < j; i++, j--) {
        struct kiri_chat_value t = out->u.list->v[i];
        out->u.list->v[i] = out->u.list->v[j - 1];
        out->u.list->v[j - 1] = t;
    }
    return 0;
}

/* safe and string: Python's str() (there is no autoescaping to mark text safe from). */
static int filter_string(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                         struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (no_args(r, at, "this filter", a) < 0)
        return -1;
    return kiri_chat_to_str(r, in, out);
}

static int filter_trim(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                       struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"chars"};
    struct kiri_chat_value p[1], s;
    if (bind(r, at, "trim", a, names, 1, p) < 0 || kiri_chat_to_str(r, in, &s) < 0)
        return -1;
    return strip(r, at, s, p[0], 1, 1, out);
}

typedef int filter_fn(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value in,
                      struct kiri_chat_args *a, struct kiri_chat_value *out);
/* One function serving several filters, told apart by the entry's mode. */
typedef int filter_mode_fn(struct kiri_chat_render *r, int64_t at, int mode, struct kiri_chat_value in,
                           struct kiri_chat_args *a, struct kiri_chat_value *out);

/* jinja2's names, aliases included; a filter's id is its index here. Each has fn, or with_mode
 * and its mode. */
static const struct {
    const char *name;
    filter_fn *fn;
    filter_mode_fn *with_mode;
    int mode;
} filters[] = {
    {"abs", filter_abs, NULL, 0},
    {"capitalize", NULL, case_filter, CASE_CAPITALIZE},
    {"count", filter_length, NULL, 0},
    {"d", filter_default, NULL, 0},
    {"default", filter_default, NULL, 0},
    {"dictsort", filter_dictsort, NULL, 0},
    {"e", filter_escape, NULL, 0},
    {"escape", filter_escape, NULL, 0},
    {"first", NULL, end_item, 0},
    {"float", filter_float, NULL, 0},
    {"indent", filter_indent, NULL, 0},
    {"int", filter_int, NULL, 0},
    {"items", filter_items, NULL, 0},
    {"join", filter_join, NULL, 0},
    {"last", NULL, end_item, 1},
    {"length", filter_length, NULL, 0},
    {"list", filter_list, NULL, 0},
    {"lower", NULL, case_filter, CASE_LOWER},
    {"map", filter_map, NULL, 0},
    {"reject", NULL, select_items, 0},
    {"rejectattr", NULL, select_items, SELECT_BY_ATTR},
    {"replace", filter_replace, NULL, 0},
    {"reverse", filter_reverse, NULL, 0},
    {"round", filter_round, NULL, 0},
    {"safe", filter_string, NULL, 0},
    {"select", NULL, select_items, SELECT_KEEP},
    {"selectattr", NULL, select_items, SELECT_KEEP | SELECT_BY_ATTR},
    {"string", filter_string, NULL, 0},
    {"title", NULL, case_filter, CASE_TITLE_JINJA},
    {"tojson", filter_tojson, NULL, 0},
    {"trim", filter_trim, NULL, 0},
    {"upper", NULL, case_filter, CASE_UPPER},
};

int kiri_chat_filter_find(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof filters / sizeof filters[0]; i++)
        if (is(name, len, filters[i].name))
            return (int)i;
    return -1;
}

int kiri_chat_filter_apply(struct kiri_chat_render *r, int64_t at, int id, struct kiri_chat_value in,
                           struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (id < 0 || (size_t)id >= sizeof filters / sizeof filters[0])
        return kiri_chat_fail(r, at, "unknown filter");
    if (filters[id].fn)
        return filters[id].fn(r, at, in, a, out);
    return filters[id].with_mode(r, at, filters[id].mode, in, a, out);
}

/* ---------------------------------------------------------------------------------------------
 * Tests
 * ------------------------------------------------------------------------------------------- */

/* One application of a test: v is the value tested, arg its argument (MISSING when it takes
 * none), types the value types a type test accepts (a bit per enum kiri_chat_type). */
struct test_call {
    struct kiri_chat_render *r;
    int64_t at;
    struct kiri_chat_value v, arg;
    unsigned types;
};

#define TYPE_BIT(t) (1u << (t))
#define ALL_TYPES 0xffffu

/* defined, none, string, ...: is v of one of the types? */
static int test_type(const struct test_call *t, int *res)
{
    *res = t->v.type >= 0 && (t->types & TYPE_BIT(t->v.type)) != 0;
    return 0;
}

static int test_true(const struct test_call *t, int *res)
{
    *res = t->v.type == KIRI_CHAT_TYPE_BOOL && t->v.u.i;
    return 0;
}

static int test_false(const struct test_call *t, int *res)
{
    *res = t->v.type == KIRI_CHAT_TYPE_BOOL && !t->v.u.i;
    return 0;
}

/* Python's `is`: singletons and small ints by value, everything else by identity. */
static int test_sameas(const struct test_call *t, int *res)
{
    struct kiri_chat_value v = t->v, o = t->arg;
    if (v.type != o.type)
        *res = 0;
    else if (v.type == KIRI_CHAT_TYPE_INT)
        *res = v.u.i == o.u.i && v.u.i >= -5 && v.u.i <= 256;
    else if (v.type == KIRI_CHAT_TYPE_STR)
        *res = v.u.s.p == o.u.s.p && v.u.s.n == o.u.s.n;
    else if (v.type == KIRI_CHAT_TYPE_FLOAT)
        *res = 0;
    else
        *res = kiri_chat_equal(v, o, 0) && (v.type <= KIRI_CHAT_TYPE_BOOL || v.u.list == o.u.list);
    return 0;
}

static int test_in(const struct test_call *t, int *res)
{
    return kiri_chat_contains(t->r, t->at, t->arg, t->v, res);
}

/* lower and upper test the text of v. */
static int test_case(const struct test_call *t, int lower, int *res)
{
    struct kiri_chat_value s;
    if (kiri_chat_to_str(t->r, t->v, &s) < 0)
        return -1;
    *res = all_case(s, lower);
    return 0;
}

static int test_lower(const struct test_call *t, int *res)
{
    return test_case(t, 1, res);
}

static int test_upper(const struct test_call *t, int *res)
{
    return test_case(t, 0, res);
}

/* v % d with Python's modulo (the sign of the divisor), as a double; jinja2 defines odd as
 * value % 2 == 1, even as value % 2 == 0 and divisibleby as value % num == 0. */
static int modulo(const struct test_call *t, int64_t d, double *m)
{
    struct kiri_chat_value v = t->v;
    if (!IS_INT(v) && v.type != KIRI_CHAT_TYPE_FLOAT)
        return kiri_chat_fail(t->r, t->at, "this test needs a number, not '%s'", kiri_chat_type_name(v));
    if (d == 0)
        return kiri_chat_fail(t->r, t->at, "divisibleby needs a non-zero integer");
    if (v.type == KIRI_CHAT_TYPE_FLOAT) {
        *m = fmod(v.u.f, (double)d);
        if (*m != 0 && (*m < 0) != (d < 0))
            *m += (double)d;
    } else {
        int64_t im = d == -1 ? 0 : v.u.i % d;
        if (im != 0 && (im < 0) != (d < 0))
            im += d;
        *m = (double)im;
    }
    return 0;
}

static int test_even(const struct test_call *t, int *res)
{
    double m;
    if (modulo(t, 2, &m) < 0)
        return -1;
    *res = m == 0;
    return 0;
}

static int test_odd(const struct test_call *t, int *res)
{
    double m;
    if (modulo(t, 2, &m) < 0)
        return -1;
    *res = m == 1;
    return 0;
}

static int test_divisibleby(const struct test_call *t, int *res)
{
    double m;
    if (modulo(t, IS_INT(t->arg) ? t->arg.u.i : 0, &m) < 0)
        return -1;
    *res = m == 0;
    return 0;
}

static int test_eq(const struct test_call *t, int *res)
{
    *res = kiri_chat_equal(t->v, t->arg, 0);
    return 0;
}

static int test_ne(const struct test_call *t, int *res)
{
    *res = !kiri_chat_equal(t->v, t->arg, 0);
    return 0;
}

static int test_lt(const struct test_call *t, int *res)
{
    return kiri_chat_less(t->r, t->at, t->v, t->arg, res);
}

static int test_gt(const struct test_call *t, int *res)
{
    return kiri_chat_less(t->r, t->at, t->arg, t->v, res);
}

/* a <= b is not (b < a), as jinja2's operator.le gives for the types kiri orders. */
static int test_le(const struct test_call *t, int *res)
{
    if (kiri_chat_less(t->r, t->at, t->arg, t->v, res) < 0)
        return -1;
    *res = !*res;
    return 0;
}

static int test_ge(const struct test_call *t, int *res)
{
    if (kiri_chat_less(t->r, t->at, t->v, t->arg, res) < 0)
        return -1;
    *res = !*res;
    return 0;
}

typedef int test_fn(const struct test_call *t, int *res);

#define NUMBER_TYPES (TYPE_BIT(KIRI_CHAT_TYPE_INT) | TYPE_BIT(KIRI_CHAT_TYPE_BOOL) | TYPE_BIT(KIRI_CHAT_TYPE_FLOAT))
#define SEQUENCE_TYPES (TYPE_BIT(KIRI_CHAT_TYPE_STR) | TYPE_BIT(KIRI_CHAT_TYPE_LIST) | \
                        TYPE_BIT(KIRI_CHAT_TYPE_DICT) | TYPE_BIT(KIRI_CHAT_TYPE_UNDEF))

/* jinja2's names, aliases included; a test's id is its index here. types: for test_type. */
static const struct {
    const char *name;
    test_fn *fn;
    unsigned types;
    int takes_arg; /* the test needs exactly one argument; the others take none */
} tests[] = {
    {"defined", test_type, ALL_TYPES & ~TYPE_BIT(KIRI_CHAT_TYPE_UNDEF), 0},
    {"undefined", test_type, TYPE_BIT(KIRI_CHAT_TYPE_UNDEF), 0},
    {"none", test_type, TYPE_BIT(KIRI_CHAT_TYPE_NONE), 0},
    {"boolean", test_type, TYPE_BIT(KIRI_CHAT_TYPE_BOOL), 0},
    {"true", test_true, 0, 0},
    {"false", test_false, 0, 0},
    {"integer", test_type, TYPE_BIT(KIRI_CHAT_TYPE_INT), 0},
    {"float", test_type, TYPE_BIT(KIRI_CHAT_TYPE_FLOAT), 0},
    {"number", test_type, NUMBER_TYPES, 0},
    {"string", test_type, TYPE_BIT(KIRI_CHAT_TYPE_STR), 0},
    {"mapping", test_type, TYPE_BIT(KIRI_CHAT_TYPE_DICT), 0},
    {"iterable", test_type, SEQUENCE_TYPES | TYPE_BIT(KIRI_CHAT_TYPE_LOOP), 0},
    {"sequence", test_type, SEQUENCE_TYPES, 0},
    {"callable", test_type, TYPE_BIT(KIRI_CHAT_TYPE_FUNC) | TYPE_BIT(KIRI_CHAT_TYPE_MACRO), 0},
    {"sameas", test_sameas, 0, 1},
    {"escaped", test_type, 0, 0}, /* nothing is marked escaped without autoescaping */
    {"in", test_in, 0, 1},
    {"lower", test_lower, 0, 0},
    {"upper", test_upper, 0, 0},
    {"even", test_even, 0, 0},
    {"odd", test_odd, 0, 0},
    {"divisibleby", test_divisibleby, 0, 1},
    {"eq", test_eq, 0, 1},
    {"equalto", test_eq, 0, 1},
    {"ne", test_ne, 0, 1},
    {"lt", test_lt, 0, 1},
    {"lessthan", test_lt, 0, 1},
    {"le", test_le, 0, 1},
    {"gt", test_gt, 0, 1},
    {"greaterthan", test_gt, 0, 1},
    {"ge", test_ge, 0, 1},
};

int kiri_chat_test_find(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof tests / sizeof tests[0]; i++)
        if (is(name, len, tests[i].name))
            return (int)i;
    return -1;
}

int kiri_chat_test_apply(struct kiri_chat_render *r, int64_t at, int id, struct kiri_chat_value v,
                         struct kiri_chat_args *a, int *res)
{
    static const char *const other[] = {"other"};
    struct test_call t = {r, at, v, {KIRI_CHAT_TYPE_MISSING, {0}}, 0};
    if (bind(r, at, "this test", a, other, 1, &t.arg) < 0)
        return -1;
    if (id < 0 || (size_t)id >= sizeof tests / sizeof tests[0])
        return kiri_chat_fail(r, at, "unknown test");
    if (tests[id].takes_arg && MISSING(t.arg))
        return kiri_chat_fail(r, at, "this test needs an argument");
    if (!tests[id].takes_arg && !MISSING(t.arg))
        return kiri_chat_fail(r, at, "this test takes no argument");
    t.types = tests[id].types;
    return tests[id].fn(&t, res);
}

/* ---------------------------------------------------------------------------------------------
 * Methods
 * ------------------------------------------------------------------------------------------- */

enum { STRIP_LEFT = 1, STRIP_RIGHT = 2 };

/* str.strip, lstrip and rstrip: mode says which ends. */
static int strip_method(struct kiri_chat_render *r, int64_t at, int mode, struct kiri_chat_value s,
                        struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"chars"};
    struct kiri_chat_value p[1];
    if (bind(r, at, "strip", a, names, 1, p) < 0)
        return -1;
    return strip(r, at, s, p[0], (mode & STRIP_LEFT) != 0, (mode & STRIP_RIGHT) != 0, out);
}

static int method_split(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value s,
                        struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"sep", "maxsplit"};
    struct kiri_chat_value p[2];
    if (bind(r, at, "split", a, names, 2, p) < 0)
        return -1;
    return split(r, at, s, p[0], p[1], out);
}

/* str.startswith and endswith (end 1): the argument may be a tuple of candidates. */
static int affix_method(struct kiri_chat_render *r, int64_t at, int end, struct kiri_chat_value s,
                        struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"prefix"};
    struct kiri_chat_value p[1];
    const struct kiri_chat_value *cand = p;
    size_t n = 1;
    const char *what = end ? "endswith" : "startswith";
    if (bind(r, at, what, a, names, 1, p) < 0)
        return -1;
    if (p[0].type == KIRI_CHAT_TYPE_LIST) {
        cand = p[0].u.list->v;
        n = p[0].u.list->n;
    }
    *out = kiri_chat_bool(0);
    for (size_t i = 0; i < n; i++) {
        if (want_str(r, at, what, cand[i]) < 0)
            return -1;
        size_t k = cand[i].u.s.n;
        if (k <= s.u.s.n && memcmp(s.u.s.p + (end ? s.u.s.n - k : 0), cand[i].u.s.p, k) == 0)
            *out = kiri_chat_bool(1);
    }
    return 0;
}

static int case_method(struct kiri_chat_render *r, int64_t at, int mode, struct kiri_chat_value s,
                       struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (no_args(r, at, "this method", a) < 0)
        return -1;
    return change_case(r, s, mode, out);
}

static int method_replace(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value s,
                          struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"old", "new", "count"};
    struct kiri_chat_value p[3];
    if (bind(r, at, "replace", a, names, 3, p) < 0 || want_str(r, at, "replace", p[0]) < 0 ||
        want_str(r, at, "replace", p[1]) < 0)
        return -1;
    return replace(r, s, p[0], p[1], IS_INT(p[2]) ? p[2].u.i : -1, out);
}

/* The substring argument of str.find and str.count, after charging for the scan. */
static int substring_arg(struct kiri_chat_render *r, int64_t at, const char *what,
                         struct kiri_chat_value s, struct kiri_chat_args *a,
                         struct kiri_chat_value *sub)
{
    static const char *const names[] = {"sub"};
    if (bind(r, at, what, a, names, 1, sub) < 0 || want_str(r, at, what, *sub) < 0)
        return -1;
    return kiri_chat_charge(r, s.u.s.n);
}

static int method_find(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value s,
                       struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    struct kiri_chat_value sub;
    if (substring_arg(r, at, "find", s, a, &sub) < 0)
        return -1;
    const char *hit = memmem(s.u.s.p, s.u.s.n, sub.u.s.p, sub.u.s.n);
    *out = kiri_chat_int(hit ? (int64_t)kiri_chat_cp_len(s.u.s.p, (size_t)(hit - s.u.s.p)) : -1);
    return 0;
}

static int method_count(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value s,
                        struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    struct kiri_chat_value sub;
    const char *hit;
    int64_t c = 0;
    if (substring_arg(r, at, "count", s, a, &sub) < 0)
        return -1;
    if (sub.u.s.n == 0) {
        c = (int64_t)kiri_chat_cp_len(s.u.s.p, s.u.s.n) + 1;
    } else {
        for (size_t i = 0; (hit = memmem(s.u.s.p + i, s.u.s.n - i, sub.u.s.p, sub.u.s.n)); c++)
            i = (size_t)(hit - s.u.s.p) + sub.u.s.n;
    }
    *out = kiri_chat_int(c);
    return 0;
}

static int method_join(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value s,
                       struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"iterable"};
    struct kiri_chat_value p[1];
    const struct kiri_chat_value *items;
    struct kiri_chat_buf b = {0};
    size_t n;
    if (bind(r, at, "join", a, names, 1, p) < 0 || kiri_chat_iterate(r, at, p[0], &items, &n) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        if (items[i].type != KIRI_CHAT_TYPE_STR) {
            kiri_chat_buf_free(&b);
            return kiri_chat_fail(r, at, "sequence item %zu: expected str instance, %s found", i,
                                  kiri_chat_type_name(items[i]));
        }
        if ((i && kiri_chat_buf_put(r, &b, s.u.s.p, s.u.s.n) < 0) ||
            kiri_chat_buf_put(r, &b, items[i].u.s.p, items[i].u.s.n) < 0) {
            kiri_chat_buf_free(&b);
            return -1;
        }
    }
    return kiri_chat_buf_finish(r, &b, out);
}

static int method_get(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value d,
                      struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"key", "default"};
    struct kiri_chat_value p[2];
    if (bind(r, at, "get", a, names, 2, p) < 0)
        return -1;
    if (MISSING(p[0]))
        return kiri_chat_fail(r, at, "get needs a key");
    const struct kiri_chat_value *v = kiri_chat_dict_get(d.u.dict, p[0]);
    if (v)
        *out = *v;
    else if (!MISSING(p[1]))
        *out = p[1];
    else
        out->type = KIRI_CHAT_TYPE_NONE;
    return 0;
}

/* dict.items, keys and values (which: DICT_ITEMS...). */
static int entries_method(struct kiri_chat_render *r, int64_t at, int which, struct kiri_chat_value d,
                          struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (no_args(r, at, "this method", a) < 0)
        return -1;
    return dict_entries(r, d.u.dict, which, out);
}

/* list.count and list.index (index 1). */
static int list_search(struct kiri_chat_render *r, int64_t at, int index, struct kiri_chat_value l,
                       struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    static const char *const names[] = {"value"};
    struct kiri_chat_value p[1];
    int64_t count = 0, first = -1;
    if (bind(r, at, index ? "index" : "count", a, names, 1, p) < 0)
        return -1;
    for (size_t i = 0; i < l.u.list->n; i++) {
        if (kiri_chat_equal(l.u.list->v[i], p[0], 0)) {
            count++;
            if (first < 0)
                first = (int64_t)i;
        }
    }
    if (index && first < 0)
        return kiri_chat_fail(r, at, "list.index(x): x not in list");
    *out = kiri_chat_int(index ? first : count);
    return kiri_chat_step(r, l.u.list->n / 16);
}

/* loop.cycle(a, b, ...): the argument for this iteration, round robin. */
static int method_cycle(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value loop,
                        struct kiri_chat_args *a, struct kiri_chat_value *out)
{
    if (a->n == 0)
        return kiri_chat_fail(r, at, "no items for cycling given");
    *out = a->v[loop.u.loop->index0 % a->n];
    return 0;
}

typedef int method_fn(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value obj,
                      struct kiri_chat_args *a, struct kiri_chat_value *out);
/* One function serving several methods, told apart by the entry's mode. */
typedef int method_mode_fn(struct kiri_chat_render *r, int64_t at, int mode, struct kiri_chat_value obj,
                           struct kiri_chat_args *a, struct kiri_chat_value *out);

/* Python's methods by receiver type. Each has fn, or with_mode and its mode. */
static const struct {
    int type;
    const char *name;
    method_fn *fn;
    method_mode_fn *with_mode;
    int mode;
} methods[] = {
    {KIRI_CHAT_TYPE_STR, "strip", NULL, strip_method, STRIP_LEFT | STRIP_RIGHT},
    {KIRI_CHAT_TYPE_STR, "lstrip", NULL, strip_method, STRIP_LEFT},
    {KIRI_CHAT_TYPE_STR, "rstrip", NULL, strip_method, STRIP_RIGHT},
    {KIRI_CHAT_TYPE_STR, "split", method_split, NULL, 0},
    {KIRI_CHAT_TYPE_STR, "startswith", NULL, affix_method, 0},
    {KIRI_CHAT_TYPE_STR, "endswith", NULL, affix_method, 1},
    {KIRI_CHAT_TYPE_STR, "upper", NULL, case_method, CASE_UPPER},
    {KIRI_CHAT_TYPE_STR, "lower", NULL, case_method, CASE_LOWER},
    {KIRI_CHAT_TYPE_STR, "title", NULL, case_method, CASE_TITLE_PY},
    {KIRI_CHAT_TYPE_STR, "capitalize", NULL, case_method, CASE_CAPITALIZE},
    {KIRI_CHAT_TYPE_STR, "replace", method_replace, NULL, 0},
    {KIRI_CHAT_TYPE_STR, "find", method_find, NULL, 0},
    {KIRI_CHAT_TYPE_STR, "count", method_count, NULL, 0},
    {KIRI_CHAT_TYPE_STR, "join", method_join, NULL, 0},
    {KIRI_CHAT_TYPE_DICT, "get", method_get, NULL, 0},
    {KIRI_CHAT_TYPE_DICT, "items", NULL, entries_method, DICT_ITEMS},
    {KIRI_CHAT_TYPE_DICT, "keys", NULL, entries_method, DICT_KEYS},
    {KIRI_CHAT_TYPE_DICT, "values", NULL, entries_method, DICT_VALUES},
    {KIRI_CHAT_TYPE_LIST, "count", NULL, list_search, 0},
    {KIRI_CHAT_TYPE_LIST, "index", NULL, list_search, 1},
    {KIRI_CHAT_TYPE_LOOP, "cycle", method_cycle, NULL, 0},
};

int kiri_chat_method_call(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value obj,
                          const char *name, size_t len, struct kiri_chat_args *a,
                          struct kiri_chat_value *out, int *handled)
{
    /* what ImmutableSandboxedEnvironment refuses on lists and dicts */
    static const char *const mutators[] = {"append", "extend", "insert", "pop", "remove", "clear",
                                           "sort", "reverse", "update", "setdefault", "popitem"};
    *handled = 0;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++) {
        if (methods[i].type == obj.type && is(name, len, methods[i].name)) {
            *handled = 1;
            if (methods[i].fn)
                return methods[i].fn(r, at, obj, a, out);
            return methods[i].with_mode(r, at, methods[i].mode, obj, a, out);
        }
    }
    if (obj.type == KIRI_CHAT_TYPE_LIST || obj.type == KIRI_CHAT_TYPE_DICT)
        for (size_t i = 0; i < sizeof mutators / sizeof mutators[0]; i++)
            if (is(name, len, mutators[i]))
                return kiri_chat_fail(r, at, "the sandbox refuses '%s': templates cannot modify a %s",
                                      mutators[i], kiri_chat_type_name(obj));
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Global functions
 * ------------------------------------------------------------------------------------------- */

/* transformers' raise_exception(message): stops the render with the template's message. */
static int global_raise_exception(struct kiri_chat_render *r, int64_t at, struct kiri_chat_args *a,
                                  struct kiri_chat_value *out)
{
    static const char *const names[] = {"message"};
    struct kiri_chat_value p[1], msg;
    (void)out; /* it returns nothing: it always fails */
    if (bind(r, at, "raise_exception", a, names, 1, p) < 0)
        return -1;
    if (MISSING(p[0]))
        p[0] = kiri_chat_str("", 0);
    if (kiri_chat_to_str(r, p[0], &msg) < 0)
        return -1;
    return kiri_chat_fail_code(r, KIRI_E_INVALID_ARG, "raise_exception", "%.*s",
                               (int)(msg.u.s.n > 255 ? 255 : msg.u.s.n), msg.u.s.p);
}

/* transformers' strftime_now(format): datetime.now().strftime(format), the local wall clock (some
 * templates, Granite's among them, put today's date into the system prompt). datetime.now() is
 * naive, so %z and %Z give "" as in Python, and %f is the microseconds; every other directive is
 * the C library's strftime, as CPython uses it. The format and the result are bounded. */
#define MAX_STRFTIME 256
static int global_strftime_now(struct kiri_chat_render *r, int64_t at, struct kiri_chat_args *a,
                               struct kiri_chat_value *out)
{
    static const char *const names[] = {"format"};
    struct kiri_chat_value p[1];
    if (bind(r, at, "strftime_now", a, names, 1, p) < 0)
        return -1;
    if (p[0].type != KIRI_CHAT_TYPE_STR)
        return kiri_chat_fail(r, at, "strftime_now() takes a format string, not '%s'", kiri_chat_type_name(p[0]));
    const char *f = p[0].u.s.p;
    const size_t n = p[0].u.s.n;
    if (n > MAX_STRFTIME || memchr(f, '\0', n))
        return kiri_chat_fail(r, at, "strftime_now() format must be at most %d bytes, without NUL", MAX_STRFTIME);
    struct timespec ts;
    struct tm tm;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0 || !localtime_r(&ts.tv_sec, &tm))
        return kiri_chat_fail(r, at, "strftime_now(): no clock");
    /* Rewrite the Python-only directives into literal text, then let strftime do the rest. */
    char fmt[4 * MAX_STRFTIME + 2], res[4 * MAX_STRFTIME + 256];
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (f[i] != '%' || i + 1 == n) {
            fmt[k++] = f[i];
            continue;
        }
        const char d = f[++i];
        if (d == 'z' || d == 'Z')
            continue;
        if (d == 'f') {
            k += (size_t)snprintf(fmt + k, sizeof fmt - k, "%06ld", (long)(ts.tv_nsec / 1000));
            continue;
        }
        fmt[k++] = '%';
        fmt[k++] = d;
    }
    fmt[k] = '\0';
    /* strftime returns 0 both for an empty result and for one that does not fit; a leading space
     * tells them apart. */
    char spaced[sizeof fmt + 1];
    spaced[0] = ' ';
    memcpy(spaced + 1, fmt, k + 1);
    const size_t got = strftime(res, sizeof res, spaced, &tm);
    if (got == 0)
        return kiri_chat_fail(r, at, "strftime_now(): the result is too long");
    char *dst;
    if (kiri_chat_new_str(r, got - 1, &dst, out) < 0)
        return -1;
    memcpy(dst, res + 1, got - 1);
    return 0;
}

/* namespace() and dict(): positional dicts are copied in, then keyword arguments set. */
static int make_dict(struct kiri_chat_render *r, int64_t at, int ns, struct kiri_chat_args *a,
                     struct kiri_chat_value *out)
{
    if (kiri_chat_new_dict(r, ns, out) < 0)
        return -1;
    for (int i = 0; i < a->n; i++) {
        if (a->kw[i]) {
            if (kiri_chat_dict_set(r, out->u.dict, kiri_chat_str(a->kw[i], a->kw_len[i]), a->v[i]) < 0)
                return -1;
            continue;
        }
        if (a->v[i].type != KIRI_CHAT_TYPE_DICT && a->v[i].type != KIRI_CHAT_TYPE_NS)
            return kiri_chat_fail(r, at, "%s() takes dicts and keyword arguments", ns ? "namespace" : "dict");
        const struct kiri_chat_dict *d = a->v[i].u.dict;
        for (size_t j = 0; j < d->n; j++)
            if (kiri_chat_dict_set(r, out->u.dict, d->k[j], d->v[j]) < 0)
                return -1;
    }
    return 0;
}

static int global_namespace(struct kiri_chat_render *r, int64_t at, struct kiri_chat_args *a,
                            struct kiri_chat_value *out)
{
    return make_dict(r, at, 1, a, out);
}

static int global_dict(struct kiri_chat_render *r, int64_t at, struct kiri_chat_args *a,
                       struct kiri_chat_value *out)
{
    return make_dict(r, at, 0, a, out);
}

static int global_range(struct kiri_chat_render *r, int64_t at, struct kiri_chat_args *a,
                        struct kiri_chat_value *out)
{
    static const char *const names[] = {"start", "stop", "step"};
    struct kiri_chat_value p[3];
    if (bind(r, at, "range", a, names, 3, p) < 0)
        return -1;
    for (int i = 0; i < 3; i++)
        if (!MISSING(p[i]) && !IS_INT(p[i]))
            return kiri_chat_fail(r, at, "range() takes integers, not '%s'", kiri_chat_type_name(p[i]));
    if (MISSING(p[0]))
        return kiri_chat_fail(r, at, "range expected at least 1 argument");
    int64_t start = MISSING(p[1]) ? 0 : p[0].u.i, stop = MISSING(p[1]) ? p[0].u.i : p[1].u.i;
    int64_t step = MISSING(p[2]) ? 1 : p[2].u.i, count = 0;
    if (step == 0)
        return kiri_chat_fail(r, at, "range() arg 3 must not be zero");
    if (step > 0 && start < stop)
        count = (int64_t)(((uint64_t)stop - (uint64_t)start - 1) / (uint64_t)step) + 1;
    else if (step < 0 && start > stop)
        count = (int64_t)(((uint64_t)start - (uint64_t)stop - 1) / ((uint64_t)0 - (uint64_t)step)) + 1;
    if (count > MAX_RANGE)
        return kiri_chat_fail(r, at, "range too big: the sandbox allows at most %d items", MAX_RANGE);
    if (kiri_chat_new_list(r, (size_t)count, 0, out) < 0)
        return -1;
    for (int64_t i = 0; i < count; i++)
        out->u.list->v[i] = kiri_chat_int(start + i * step);
    return 0;
}

typedef int global_fn(struct kiri_chat_render *r, int64_t at, struct kiri_chat_args *a,
                      struct kiri_chat_value *out);

/* The globals a template sees besides its variables; a global's id is its index here. */
static const struct {
    const char *name;
    global_fn *fn;
} globals[] = {
    {"raise_exception", global_raise_exception},
    {"strftime_now", global_strftime_now},
    {"namespace", global_namespace},
    {"range", global_range},
    {"dict", global_dict},
};

int kiri_chat_global_find(const char *name, size_t len)
{
    for (size_t i = 0; i < sizeof globals / sizeof globals[0]; i++)
        if (is(name, len, globals[i].name))
            return (int)i;
    return -1;
}

int kiri_chat_global_call(struct kiri_chat_render *r, int64_t at, int id, struct kiri_chat_args *a,
                          struct kiri_chat_value *out)
{
    if (id < 0 || (size_t)id >= sizeof globals / sizeof globals[0])
        return kiri_chat_fail(r, at, "unknown function");
    return globals[id].fn(r, at, a, out);
}
