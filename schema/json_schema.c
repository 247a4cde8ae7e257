/* JSON Schema -> GBNF. One recursive pass over the schema writes one rule per subschema (rules
 * with the same body are shared); a $ref target becomes a named rule reserved before its body is
 * compiled, so recursive schemas compile to recursive rules. A last pass over the rules checks
 * that each can derive a finite text (a $ref cycle without a base case cannot), so no sequence
 * can be led into a rule it can never leave.
 *
 * Where the schema leaves the generator free, the grammar takes a narrower but always valid
 * choice: bounded whitespace, bounded number digits, no surrogate \u escapes, extra object keys
 * of [a-zA-Z0-9_-], integers for a bounded "number", repetition counts above MAX_REPEAT cut to
 * MAX_REPEAT when the minimum allows. */
#include "json_schema.h"

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "schema_gbnf.h"
#include "schema_regex.h"

#define MAX_DEPTH 128         /* nested subschema compilations (a $ref target counts too) */
#define MAX_RULES 4096
#define MAX_ENUM 1024         /* values of one enum */
#define MAX_ALTERNATIVES 128  /* anyOf / oneOf / allOf members */
#define MAX_PROPERTIES 512    /* properties and prefixItems of one subschema */
#define MAX_KEY_LEN 128       /* a property name that extra keys must avoid */
#define MAX_STEPS 200000      /* subschemas visited, all passes together */
#define MAX_REPEAT 256        /* minItems / minLength; larger maxima are cut to this */
#define MAX_HOPS 32           /* $ref / allOf expansions in one chain */
#define INT_LIMIT 999999999999999LL /* the widest integer a bounded range writes (15 digits) */
#define PATH_CAP 512

enum { T_NULL = 1, T_BOOL = 2, T_OBJ = 4, T_ARR = 8, T_STR = 16, T_NUM = 32, T_INT = 64, T_ANY = 63 };

enum { P_WS, P_CHAR, P_STRING, P_NUMBER, P_INTEGER, P_BOOLEAN, P_NULL, P_VALUE, P_OBJECT, P_ARRAY, P_KEYCHAR, P_N };

static const char *const prim_names[P_N] = {"ws",      "char", "string", "number", "integer", "boolean",
                                            "null",    "value", "object", "array", "keychar"};
static const char *const prim_bodies[P_N] = {
    "( \" \" | \"\\n\" [ ]{0,8} )?",
    ("[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] "
     "[0-9a-fA-F]{2} ) )"),
    "\"\\\"\" %char* \"\\\"\"",
    "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,15} )? ( [eE] [-+]? [0-9]{1,3} )?",
    "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )",
    "\"true\" | \"false\"",
    "\"null\"",
    "%object | %array | %string | %number | %boolean | %null",
    "\"{\" %ws ( %string %ws \":\" %ws %value %ws ( \",\" %ws %string %ws \":\" %ws %value %ws )* )? \"}\"",
    "\"[\" %ws ( %value %ws ( \",\" %ws %value %ws )* )? \"]\"",
    "[a-zA-Z0-9_-]",
};

struct rule {
    char *name;     /* owned */
    char *body;     /* owned; NULL while a $ref target is being compiled */
    uint32_t hash;  /* of body */
    char src[64];   /* the JSON pointer it was made for, for errors */
};

struct ref_memo {
    char *ref;      /* owned: the $ref text */
    int rule;
};

struct compiler {
    json_t *root;               /* borrowed */
    const char *prefix, *root_name;
    struct rule *rules;
    int n_rules, cap_rules;
    int *done;                  /* rule indices in the order their bodies were finished */
    int n_done;
    struct ref_memo *refs;
    int n_refs, cap_refs;
    int prim[P_N];              /* rule index + 1 of each primitive made, 0: not yet */
    long steps;
    size_t total;               /* bytes of all bodies */
    char path[PATH_CAP];        /* JSON pointer of the subschema being compiled */
    size_t path_len;
    struct kiri_status_info *info;
};

/* ---- errors and the path ---- */

static int fail(struct compiler *c, int code, const char *keyword, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int fail(struct compiler *c, int code, const char *keyword, const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    char field[64];
    snprintf(field, sizeof field, "#%.62s", c->path);
    if (keyword)
        return kiri_error_at(c->info, code, field, -1, "%s: %s", keyword, msg);
    return kiri_error_at(c->info, code, field, -1, "%s", msg);
}

static int unsupported(struct compiler *c, const char *keyword, const char *why)
{
    return fail(c, KIRI_E_UNSUPPORTED, keyword, "%s", why);
}

static int bad_value(struct compiler *c, const char *keyword, const char *want)
{
    return fail(c, KIRI_E_INVALID_ARG, keyword, "must be %s", want);
}

static int buf_error(struct compiler *c, const struct kiri_buf *b)
{
    if (b->limit && b->len + 4096 >= b->limit)
        return unsupported(c, NULL, "the grammar would be larger than KIRI_GRAMMAR_MAX_SIZE");
    return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
}

/* Appends one reference token (escaped as RFC 6901 says); returns the length to restore. */
static size_t path_push(struct compiler *c, const char *seg)
{
    size_t mark = c->path_len;
    if (c->path_len + 1 < PATH_CAP)
        c->path[c->path_len++] = '/';
    for (const char *p = seg; *p && c->path_len + 2 < PATH_CAP; p++) {
        if (*p == '~' || *p == '/') {
            c->path[c->path_len++] = '~';
            c->path[c->path_len++] = *p == '~' ? '0' : '1';
        } else {
            c->path[c->path_len++] = *p;
        }
    }
    c->path[c->path_len] = '\0';
    return mark;
}

static size_t path_push_index(struct compiler *c, size_t i)
{
    char num[24];
    snprintf(num, sizeof num, "%zu", i);
    return path_push(c, num);
}

static void path_pop(struct compiler *c, size_t mark)
{
    c->path_len = mark;
    c->path[mark] = '\0';
}

static int step(struct compiler *c)
{
    if (++c->steps > MAX_STEPS)
        return unsupported(c, NULL, "the schema needs too many steps to compile");
    return 0;
}

/* ---- rules ---- */

static uint32_t hash_text(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

static int name_ok(const char *s, int may_be_empty)
{
    if (!*s)
        return may_be_empty;
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '-'))
            return 0;
    return 1;
}

/* Reserves a rule named prefix + hint (its word characters) + "-N"; its body comes later. */
static int rule_reserve(struct compiler *c, const char *hint, const char *fixed, int *out)
{
    if (c->n_rules >= MAX_RULES)
        return unsupported(c, NULL, "the schema needs more than 4096 grammar rules");
    if (c->n_rules == c->cap_rules) {
        int cap = c->cap_rules ? c->cap_rules * 2 : 64;
        struct rule *r = kiri_mem_realloc(c->rules, (size_t)cap * sizeof *r);
        int *d = r ? kiri_mem_realloc(c->done, (size_t)cap * sizeof *d) : NULL;
        if (r)
            c->rules = r;
        if (!r || !d)
            return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
        c->done = d;
        c->cap_rules = cap;
    }
    char name[96];
    if (fixed) {
        snprintf(name, sizeof name, "%s%s", c->prefix, fixed);
    } else {
        char clean[24];
        size_t n = 0;
        for (const char *p = hint; *p && n + 1 < sizeof clean; p++)
            if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9'))
                clean[n++] = *p;
            else if (n && clean[n - 1] != '-')
                clean[n++] = '-';
        if (n == 0)
            clean[n++] = 'r';
        clean[n] = '\0';
        snprintf(name, sizeof name, "%s%s%s%d", c->prefix, clean, n && clean[n - 1] != '-' ? "-" : "", c->n_rules);
    }
    if (!strcmp(name, c->root_name))
        return kiri_error_at(c->info, KIRI_E_INVALID_ARG, "root_name", -1,
                             "the root rule name %s is also the name of a generated rule", name);
    struct rule *r = &c->rules[c->n_rules];
    memset(r, 0, sizeof *r);
    r->name = kiri_mem_strndup(name, strlen(name));
    if (!r->name)
        return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    snprintf(r->src, sizeof r->src, "#%.62s", c->path);
    *out = c->n_rules++;
    return 0;
}

/* Gives rule idx the body held in b (b is emptied). */
static int rule_finish(struct compiler *c, int idx, struct kiri_buf *b)
{
    if (b->failed)
        return buf_error(c, b);
    c->total += b->len + strlen(c->rules[idx].name) + 6;
    if (c->total > KIRI_GRAMMAR_MAX_SIZE)
        return unsupported(c, NULL, "the grammar would be larger than KIRI_GRAMMAR_MAX_SIZE");
    size_t len;
    char *body = kiri_buf_take(b, &len);
    if (!body)
        return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    c->rules[idx].body = body;
    c->rules[idx].hash = hash_text(body);
    c->done[c->n_done++] = idx;
    return 0;
}

/* A rule with body b (emptied), shared with an earlier rule of the same body; its name is
 * appended to out. */
static int rule_make(struct compiler *c, const char *hint, struct kiri_buf *b, struct kiri_buf *out)
{
    if (b->failed)
        return buf_error(c, b);
    uint32_t h = hash_text(b->data ? b->data : "");
    for (int i = 0; i < c->n_rules; i++) {
        const struct rule *r = &c->rules[i];
        if (r->body && r->hash == h && !strcmp(r->body, b->data ? b->data : "")) {
            kiri_buf_clear(b);
            kiri_buf_puts(out, r->name);
            return 0;
        }
    }
    int idx, rc = rule_reserve(c, hint, NULL, &idx);
    if (rc == 0)
        rc = rule_finish(c, idx, b);
    if (rc == 0)
        kiri_buf_puts(out, c->rules[idx].name);
    return rc;
}

/* Appends the name of a primitive rule, making it (and what it names) on first use. */
static int prim(struct compiler *c, int p, struct kiri_buf *out)
{
    if (!c->prim[p]) {
        int idx, rc = rule_reserve(c, NULL, prim_names[p], &idx);
        if (rc)
            return rc;
        c->prim[p] = idx + 1;
        struct kiri_buf b;
        kiri_buf_init(&b, KIRI_GRAMMAR_MAX_SIZE);
        for (const char *s = prim_bodies[p]; *s; s++) {
            if (*s != '%') {
                kiri_buf_putc(&b, *s);
                continue;
            }
            size_t n = strspn(s + 1, "abcdefghijklmnopqrstuvwxyz");
            int q = 0;
            while (q < P_N && !(strlen(prim_names[q]) == n && !strncmp(prim_names[q], s + 1, n)))
                q++;
            if (q == P_N || (rc = prim(c, q, &b)) != 0) {
                kiri_buf_free(&b);
                return rc ? rc : kiri_error_set(c->info, KIRI_E_INVALID_ARG, "internal: bad primitive");
            }
            s += n;
        }
        rc = rule_finish(c, idx, &b);
        kiri_buf_free(&b);
        if (rc)
            return rc;
    }
    kiri_buf_puts(out, c->rules[c->prim[p] - 1].name);
    return 0;
}

/* The literal of a JSON value written compactly. */
static int put_json_literal(struct kiri_buf *b, const json_t *v)
{
    char *text = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!text) {
        b->failed = 1;
        return KIRI_E_NOMEM;
    }
    kiri_schema_put_literal(b, text, strlen(text));
    free(text);
    return 0;
}

/* ---- keywords ---- */

static int is_annotation(const char *k)
{
    static const char *const names[] = {"title",      "description", "default",         "examples",
                                        "$schema",    "$id",         "$comment",        "deprecated",
                                        "readOnly",   "writeOnly",   "$anchor",         "$dynamicAnchor",
                                        "$vocabulary", "contentEncoding", "contentMediaType", "contentSchema",
                                        "$defs",      "definitions", "strict",          "discriminator"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(k, names[i]))
            return 1;
    return 0;
}

static const char *const unsupported_keywords[] = {
    "not", "if", "then", "else", "patternProperties", "propertyNames", "dependentRequired",
    "dependentSchemas", "dependencies", "contains", "minContains", "maxContains", "unevaluatedProperties",
    "unevaluatedItems", "$dynamicRef", "$recursiveRef", "$recursiveAnchor", "extends", "disallow", "divisibleBy",
};

/* Checks the type of every keyword's value and refuses the keywords kiri does not honour. */
static int check_keywords(struct compiler *c, json_t *s)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        for (size_t i = 0; i < sizeof unsupported_keywords / sizeof unsupported_keywords[0]; i++)
            if (!strcmp(k, unsupported_keywords[i]))
                return unsupported(c, k, "this keyword is not supported in a grammar");
        if (!strcmp(k, "type")) {
            if (!json_is_string(v) && !(json_is_array(v) && json_array_size(v) > 0))
                return bad_value(c, k, "a type name or a non-empty array of type names");
        } else if (!strcmp(k, "enum")) {
            if (!json_is_array(v))
                return bad_value(c, k, "an array");
        } else if (!strcmp(k, "required")) {
            if (!json_is_array(v))
                return bad_value(c, k, "an array of strings");
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e) if (!json_is_string(e)) return bad_value(c, k, "an array of strings");
        } else if (!strcmp(k, "properties") || !strcmp(k, "$defs") || !strcmp(k, "definitions")) {
            if (!json_is_object(v))
                return bad_value(c, k, "an object");
        } else if (!strcmp(k, "additionalProperties") || !strcmp(k, "additionalItems")) {
            if (!json_is_object(v) && !json_is_boolean(v))
                return bad_value(c, k, "a schema");
        } else if (!strcmp(k, "items")) {
            if (!json_is_object(v) && !json_is_boolean(v) && !json_is_array(v))
                return bad_value(c, k, "a schema or an array of schemas");
        } else if (!strcmp(k, "prefixItems") || !strcmp(k, "anyOf") || !strcmp(k, "oneOf") || !strcmp(k, "allOf")) {
            if (!json_is_array(v) || json_array_size(v) == 0)
                return bad_value(c, k, "a non-empty array of schemas");
            if (json_array_size(v) > MAX_ALTERNATIVES)
                return unsupported(c, k, "more than 128 schemas");
        } else if (!strcmp(k, "minLength") || !strcmp(k, "maxLength") || !strcmp(k, "minItems") ||
                   !strcmp(k, "maxItems") || !strcmp(k, "minProperties") || !strcmp(k, "maxProperties")) {
            if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) != floor(json_number_value(v)))
                return bad_value(c, k, "a non-negative integer");
        } else if (!strcmp(k, "minimum") || !strcmp(k, "maximum") || !strcmp(k, "multipleOf")) {
            if (!json_is_number(v))
                return bad_value(c, k, "a number");
            if (!strcmp(k, "multipleOf") && !(json_number_value(v) > 0))
                return bad_value(c, k, "a number above 0");
        } else if (!strcmp(k, "exclusiveMinimum") || !strcmp(k, "exclusiveMaximum")) {
            if (!json_is_number(v) && !json_is_boolean(v))
                return bad_value(c, k, "a number (or, in draft 4, a boolean)");
        } else if (!strcmp(k, "pattern") || !strcmp(k, "format") || !strcmp(k, "$ref")) {
            if (!json_is_string(v))
                return bad_value(c, k, "a string");
        } else if (!strcmp(k, "uniqueItems")) {
            if (!json_is_boolean(v))
                return bad_value(c, k, "a boolean");
        }
    }
    return 0;
}

/* The keywords the compiler honours (others are annotations, refused, or unknown and ignored). */
static int is_constraint(const char *k)
{
    static const char *const names[] = {
        "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
        "additionalItems", "minItems", "maxItems", "uniqueItems", "anyOf", "oneOf", "allOf", "$ref", "minLength",
        "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
        "multipleOf", "minProperties", "maxProperties"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(k, names[i]))
            return 1;
    return 0;
}

/* Does s carry a constraining keyword other than those listed (NULL-terminated)? Names the
 * first such keyword in *which. */
static int has_other(json_t *s, const char *const *allowed, const char **which)
{
    const char *k;
    json_t *v;
    json_object_foreach(s, k, v) {
        (void)v;
        if (!is_constraint(k))
            continue;
        int ok = 0;
        for (const char *const *a = allowed; *a && !ok; a++)
            ok = !strcmp(k, *a);
        if (!ok) {
            if (which)
                *which = k;
            return 1;
        }
    }
    return 0;
}

static long get_count(json_t *s, const char *k, long dflt)
{
    json_t *v = json_object_get(s, k);
    if (!v)
        return dflt;
    double d = json_number_value(v);
    return d > 1e9 ? 1000000000L : (long)d;
}

static int type_bit(const char *name)
{
    static const char *const names[] = {"null", "boolean", "object", "array", "string", "number", "integer"};
    for (int i = 0; i < 7; i++)
        if (!strcmp(name, names[i]))
            return 1 << i;
    return 0;
}

/* The types of the "type" keyword (T_ANY | T_INT when absent), or a negative status. */
static int declared_types(struct compiler *c, json_t *s)
{
    json_t *t = json_object_get(s, "type");
    if (!t)
        return T_ANY | T_INT;
    int bits = 0;
    if (json_is_string(t)) {
        bits = type_bit(json_string_value(t));
        if (!bits)
            return bad_value(c, "type", "one of null, boolean, object, array, string, number, integer");
        return bits;
    }
    size_t i;
    json_t *e;
    json_array_foreach(t, i, e) {
        int b = json_is_string(e) ? type_bit(json_string_value(e)) : 0;
        if (!b)
            return bad_value(c, "type", "one of null, boolean, object, array, string, number, integer");
        bits |= b;
    }
    return bits;
}

/* The types the compiler generates for s (it picks those the keywords point at when "type" is
 * absent). number and integer together generate number. */
static int generated_types(struct compiler *c, json_t *s)
{
    int bits = declared_types(c, s);
    if (bits < 0)
        return bits;
    if (!json_object_get(s, "type")) {
        static const char *const kw_obj[] = {"properties", "required", "additionalProperties", "minProperties",
                                             "maxProperties", NULL};
        static const char *const kw_arr[] = {"items", "prefixItems", "additionalItems", "minItems", "maxItems",
                                             "uniqueItems", NULL};
        static const char *const kw_str[] = {"minLength", "maxLength", "pattern", "format", NULL};
        static const char *const kw_num[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                             "multipleOf", NULL};
        static const char *const *const groups[] = {kw_obj, kw_arr, kw_str, kw_num};
        static const int group_bits[] = {T_OBJ, T_ARR, T_STR, T_NUM};
        int inferred = 0;
        for (int g = 0; g < 4; g++)
            for (const char *const *k = groups[g]; *k; k++)
                if (json_object_get(s, *k))
                    inferred |= group_bits[g];
        bits = inferred ? inferred : T_ANY;
    }
    if ((bits & T_NUM) && (bits & T_INT))
        bits &= ~T_INT;
    return bits;
}

static int value_type(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return T_OBJ;
    case JSON_ARRAY: return T_ARR;
    case JSON_STRING: return T_STR;
    case JSON_INTEGER: return T_INT | T_NUM;
    case JSON_REAL: return json_real_value(v) == floor(json_real_value(v)) ? T_INT | T_NUM : T_NUM;
    case JSON_TRUE:
    case JSON_FALSE: return T_BOOL;
    default: return T_NULL;
    }
}

/* ---- $ref ---- */

/* The subschema a local reference names, in *out. */
static int resolve(struct compiler *c, const char *ref, json_t **out)
{
    if (ref[0] != '#')
        return unsupported(c, "$ref", "only local references (\"#/...\") are supported");
    if (ref[1] && ref[1] != '/')
        return unsupported(c, "$ref", "anchor references (\"#name\") are not supported");
    json_t *at = c->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char seg[256];
        size_t n = 0;
        while (*p && *p != '/') {
            char ch = *p++;
            if (ch == '%' && p[0] && p[1]) {
                char hex[3] = {p[0], p[1], 0};
                char *end;
                long v = strtol(hex, &end, 16);
                if (*end == '\0') {
                    ch = (char)v;
                    p += 2;
                }
            }
            if (n + 1 < sizeof seg)
                seg[n++] = ch;
        }
        seg[n] = '\0';
        /* RFC 6901: ~1 is '/', ~0 is '~' (in that order). */
        size_t w = 0;
        for (size_t r = 0; r < n; r++) {
            if (seg[r] == '~' && seg[r + 1] == '1') {
                seg[w++] = '/';
                r++;
            } else if (seg[r] == '~' && seg[r + 1] == '0') {
                seg[w++] = '~';
                r++;
            } else {
                seg[w++] = seg[r];
            }
        }
        seg[w] = '\0';
        if (json_is_object(at)) {
            at = json_object_get(at, seg);
        } else if (json_is_array(at)) {
            char *end;
            unsigned long i = strtoul(seg, &end, 10);
            at = (*seg && *end == '\0') ? json_array_get(at, i) : NULL;
        } else {
            at = NULL;
        }
        if (!at)
            return fail(c, KIRI_E_INVALID_ARG, "$ref", "%.120s does not point into the schema", ref);
    }
    if (!json_is_object(at) && !json_is_boolean(at))
        return fail(c, KIRI_E_INVALID_ARG, "$ref", "%.120s does not point at a schema", ref);
    *out = at;
    return 0;
}

/* Follows a schema that is only a $ref (with annotations) to what it names, at most MAX_HOPS. */
static json_t *deref(struct compiler *c, json_t *s)
{
    static const char *const only_ref[] = {"$ref", NULL};
    for (int hop = 0; json_is_object(s) && json_object_get(s, "$ref"); hop++) {
        if (hop >= MAX_HOPS || has_other(s, only_ref, NULL))
            return s;
        json_t *t;
        if (resolve(c, json_string_value(json_object_get(s, "$ref")), &t))
            return NULL;
        s = t;
    }
    return s;
}

/* ---- allOf: merging object-like schemas ---- */

static int merge_into(struct compiler *c, json_t *acc, json_t *src);

static json_t *all_of2(json_t *a, json_t *b)
{
    return json_pack("{s:[OO]}", "allOf", a, b);
}

/* Merges s (a member of an allOf, or a schema with $ref and other keywords) into acc. */
static int flatten(struct compiler *c, json_t *acc, json_t *s, int depth)
{
    int rc = step(c);
    if (rc)
        return rc;
    if (depth > MAX_HOPS)
        return unsupported(c, "allOf", "allOf / $ref nest too deeply (a cycle?)");
    if (json_is_true(s))
        return 0;
    if (json_is_false(s))
        return unsupported(c, "allOf", "a member is false: no value satisfies the schema");
    if (!json_is_object(s))
        return fail(c, KIRI_E_INVALID_ARG, "allOf", "a member is not a schema");
    if ((rc = check_keywords(c, s)) != 0)
        return rc;
    json_t *rest = json_copy(s);
    if (!rest)
        return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    json_t *ref = json_object_get(s, "$ref");
    json_t *all = json_object_get(s, "allOf");
    json_object_del(rest, "$ref");
    json_object_del(rest, "allOf");
    if (ref) {
        json_t *t = NULL;
        rc = resolve(c, json_string_value(ref), &t);
        if (rc == 0)
            rc = flatten(c, acc, t, depth + 1);
    }
    size_t i;
    json_t *m;
    if (rc == 0 && all)
        json_array_foreach(all, i, m) if ((rc = flatten(c, acc, m, depth + 1)) != 0) break;
    if (rc == 0)
        rc = merge_into(c, acc, rest);
    json_decref(rest);
    return rc;
}

static int set_new(struct compiler *c, json_t *obj, const char *k, json_t *v)
{
    if (!v || json_object_set_new(obj, k, v))
        return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    return 0;
}

/* A property schema constrained by the other side's additionalProperties (absent: unchanged). */
static json_t *with_additional(json_t *v, json_t *addl)
{
    if (!addl || json_is_true(addl))
        return json_incref(v);
    if (json_is_false(addl))
        return json_false();
    return all_of2(v, addl);
}

static int merge_objects(struct compiler *c, json_t *acc, json_t *src)
{
    json_t *ap = json_object_get(acc, "properties"), *sp = json_object_get(src, "properties");
    json_t *aa = json_object_get(acc, "additionalProperties"), *sa = json_object_get(src, "additionalProperties");
    json_t *props = json_object();
    if (!props)
        return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    const char *k;
    json_t *v;
    int rc = 0;
    json_object_foreach(ap, k, v) {
        json_t *o = json_object_get(sp, k);
        rc = set_new(c, props, k, o ? all_of2(v, o) : with_additional(v, sa));
        if (rc)
            break;
    }
    json_object_foreach(sp, k, v) {
        if (rc || json_object_get(props, k))
            continue;
        rc = set_new(c, props, k, with_additional(v, aa));
    }
    /* Required names neither side lists are held to both additionalProperties. */
    json_t *req[2] = {json_object_get(acc, "required"), json_object_get(src, "required")};
    for (int side = 0; side < 2 && !rc; side++) {
        size_t i;
        json_t *e;
        json_array_foreach(req[side], i, e) {
            const char *name = json_string_value(e);
            if (rc || json_object_get(props, name))
                continue;
            json_t *x = json_true();
            json_t *y = with_additional(x, aa);
            json_t *z = y ? with_additional(y, sa) : NULL;
            json_decref(x);
            json_decref(y);
            if (z && json_is_true(z))
                json_decref(z);
            else
                rc = set_new(c, props, name, z);
        }
    }
    if (!rc && (ap || sp || json_object_size(props)))
        rc = set_new(c, acc, "properties", json_incref(props));
    json_decref(props);
    if (!rc && sa) {
        json_t *m = !aa || json_is_true(aa) ? json_incref(sa)
                    : json_is_true(sa)     ? json_incref(aa)
                    : json_is_false(aa) || json_is_false(sa) ? json_false()
                                                            : all_of2(aa, sa);
        rc = set_new(c, acc, "additionalProperties", m);
    }
    return rc;
}

static int merge_into(struct compiler *c, json_t *acc, json_t *src)
{
    int rc = 0;
    if (json_object_get(src, "properties") || json_object_get(src, "additionalProperties") ||
        (json_object_get(src, "required") && json_object_get(acc, "additionalProperties")) ||
        (json_object_get(acc, "required") && json_object_get(src, "additionalProperties")))
        if ((rc = merge_objects(c, acc, src)) != 0)
            return rc;
    const char *k;
    json_t *v;
    json_object_foreach(src, k, v) {
        if (is_annotation(k) || !strcmp(k, "properties") || !strcmp(k, "additionalProperties"))
            continue;
        json_t *cur = json_object_get(acc, k);
        if (!cur) {
            if (json_object_set(acc, k, v))
                return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
            continue;
        }
        if (json_equal(cur, v))
            continue;
        if (!strcmp(k, "type")) {
            int a = declared_types(c, acc), b = declared_types(c, src);
            if (a < 0 || b < 0)
                return a < 0 ? a : b;
            if ((a & T_NUM) && !(b & T_NUM) && (b & T_INT))
                a |= T_INT;
            if ((b & T_NUM) && !(a & T_NUM) && (a & T_INT))
                b |= T_INT;
            int both = a & b;
            if (!both)
                return unsupported(c, "allOf", "the members' types have nothing in common");
            static const char *const names[] = {"null", "boolean", "object", "array", "string", "number", "integer"};
            json_t *arr = json_array();
            for (int i = 0; i < 7 && arr; i++)
                if (both & (1 << i))
                    json_array_append_new(arr, json_string(names[i]));
            if ((rc = set_new(c, acc, "type", arr)) != 0)
                return rc;
        } else if (!strcmp(k, "required")) {
            size_t i;
            json_t *e;
            json_array_foreach(v, i, e) {
                int seen = 0;
                size_t j;
                json_t *f;
                json_array_foreach(cur, j, f) seen |= json_equal(e, f);
                if (!seen && json_array_append(cur, e))
                    return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
            }
        } else if (!strcmp(k, "enum")) {
            json_t *both = json_array();
            size_t i, j;
            json_t *e, *f;
            json_array_foreach(cur, i, e) {
                int seen = 0;
                json_array_foreach(v, j, f) seen |= json_equal(e, f);
                if (seen && both)
                    json_array_append(both, e);
            }
            if ((rc = set_new(c, acc, "enum", both)) != 0)
                return rc;
        } else if (!strcmp(k, "minLength") || !strcmp(k, "minItems") || !strcmp(k, "minimum") ||
                   !strcmp(k, "minProperties") || !strcmp(k, "maxLength") || !strcmp(k, "maxItems") ||
                   !strcmp(k, "maximum") || !strcmp(k, "maxProperties") ||
                   (json_is_number(v) && json_is_number(cur) &&
                    (!strcmp(k, "exclusiveMinimum") || !strcmp(k, "exclusiveMaximum")))) {
            int want_max = !strncmp(k, "min", 3) || !strcmp(k, "exclusiveMinimum");
            double a = json_number_value(cur), b = json_number_value(v);
            if (want_max ? b > a : b < a)
                if (json_object_set(acc, k, v))
                    return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
        } else if (!strcmp(k, "items") && !json_is_array(v) && !json_is_array(cur)) {
            if ((rc = set_new(c, acc, k, all_of2(cur, v))) != 0)
                return rc;
        } else if (!strcmp(k, "$defs") || !strcmp(k, "definitions")) {
            continue; /* references resolve from the document root */
        } else {
            return fail(c, KIRI_E_UNSUPPORTED, "allOf", "the members disagree on %s", k);
        }
    }
    return 0;
}

/* ---- oneOf: are the alternatives exclusive as generated? ---- */

static int overlap(int gen, int acc)
{
    if (gen & acc & ~T_INT)
        return 1;
    if ((gen & T_INT) && (acc & (T_INT | T_NUM)))
        return 1;
    return (gen & T_NUM) && (acc & T_INT);
}

/* Do all values the compiler generates for a fail to validate against b? A proof, or 0. */
static int excludes(struct compiler *c, json_t *a, json_t *b, int depth)
{
    if (depth > 8)
        return 0;
    a = deref(c, a);
    b = deref(c, b);
    if (!a || !b)
        return 0;
    if (json_is_false(b) || json_is_false(a))
        return 1;
    if (!json_is_object(a) || !json_is_object(b))
        return 0;
    if (json_object_get(a, "$ref") || json_object_get(a, "allOf") || json_object_get(a, "anyOf") ||
        json_object_get(a, "oneOf") || json_object_get(b, "$ref"))
        return 0;
    json_t *alts = json_object_get(b, "anyOf") ? json_object_get(b, "anyOf") : json_object_get(b, "oneOf");
    if (alts) {
        size_t i;
        json_t *e;
        json_array_foreach(alts, i, e) if (!excludes(c, a, e, depth + 1)) return 0;
        return 1;
    }
    json_t *ball = json_object_get(b, "allOf");
    if (ball) {
        size_t i;
        json_t *e;
        json_array_foreach(ball, i, e) if (excludes(c, a, e, depth + 1)) return 1;
    }
    int acc = declared_types(c, b);
    if (acc < 0)
        return 0;
    if (acc & T_NUM)
        acc |= T_INT;
    /* The values a generates, when it lists them. */
    json_t *aconst = json_object_get(a, "const"), *aenum = json_object_get(a, "enum");
    json_t *bconst = json_object_get(b, "const"), *benum = json_object_get(b, "enum");
    if (aconst || aenum) {
        json_t *one = aconst ? json_pack("[O]", aconst) : json_incref(aenum);
        int all_fail = one != NULL;
        size_t i;
        json_t *e;
        json_array_foreach(one, i, e) {
            int fails = !overlap(value_type(e), acc);
            if (!fails && bconst)
                fails = !json_equal(e, bconst);
            if (!fails && benum) {
                int in = 0;
                size_t j;
                json_t *f;
                json_array_foreach(benum, j, f) in |= json_equal(e, f);
                fails = !in;
            }
            all_fail &= fails;
        }
        json_decref(one);
        return all_fail;
    }
    int gen = generated_types(c, a);
    if (gen < 0)
        return 0;
    if (!overlap(gen, acc))
        return 1;
    if (gen != T_OBJ)
        return 0;
    json_t *ap = json_object_get(a, "properties"), *bp = json_object_get(b, "properties");
    json_t *aa = json_object_get(a, "additionalProperties"), *ba = json_object_get(b, "additionalProperties");
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(a, "required"), i, e) {
        const char *name = json_string_value(e);
        json_t *as = json_object_get(ap, name);
        json_t *bs = json_object_get(bp, name);
        if (!bs && json_is_false(ba))
            return 1;
        if (!bs)
            bs = ba;
        if (!as)
            as = aa;
        if (as && bs && excludes(c, as, bs, depth + 1))
            return 1;
    }
    /* a never writes a key that b requires: a has no extra keys and does not list it. */
    int a_extras = json_is_true(aa) || json_is_object(aa) || (!aa && !ap && !json_object_get(a, "required"));
    json_array_foreach(json_object_get(b, "required"), i, e) {
        const char *name = json_string_value(e);
        int listed = json_object_get(ap, name) != NULL;
        size_t j;
        json_t *f;
        json_array_foreach(json_object_get(a, "required"), j, f) listed |= json_equal(e, f);
        if (!listed && !a_extras)
            return 1;
    }
    return 0;
}

/* ---- generators ---- */

static int gen(struct compiler *c, json_t *s, int depth, struct kiri_buf *out);

#define BUF(b) struct kiri_buf b; kiri_buf_init(&b, KIRI_GRAMMAR_MAX_SIZE)

static int gen_enum(struct compiler *c, json_t *s, struct kiri_buf *out)
{
    static const char *const allowed[] = {"enum", "const", "type", NULL};
    const char *other;
    if (has_other(s, allowed, &other))
        return fail(c, KIRI_E_UNSUPPORTED, other, "enum / const together with %s is not supported", other);
    int types = declared_types(c, s);
    if (types < 0)
        return types;
    if (types & T_NUM)
        types |= T_INT;
    json_t *k = json_object_get(s, "const"), *e = json_object_get(s, "enum");
    if (e && json_array_size(e) > MAX_ENUM)
        return unsupported(c, "enum", "more than 1024 values");
    BUF(b);
    int n = 0, rc = 0;
    json_t *vals = k ? json_pack("[O]", k) : json_incref(e);
    size_t i;
    json_t *v;
    json_array_foreach(vals, i, v) {
        if (!(value_type(v) & types))
            continue;
        if (k && e) {
            int in = 0;
            size_t j;
            json_t *f;
            json_array_foreach(e, j, f) in |= json_equal(v, f);
            if (!in)
                continue;
        }
        if (n++)
            kiri_buf_puts(&b, " | ");
        put_json_literal(&b, v);
    }
    json_decref(vals);
    if (n == 0)
        rc = unsupported(c, k ? "const" : "enum", "no value satisfies the schema");
    else
        rc = rule_make(c, k ? "const" : "enum", &b, out);
    kiri_buf_free(&b);
    return rc;
}

static int gen_alternatives(struct compiler *c, json_t *s, int depth, struct kiri_buf *out)
{
    json_t *any = json_object_get(s, "anyOf"), *one = json_object_get(s, "oneOf");
    if (any && one)
        return unsupported(c, "oneOf", "anyOf and oneOf in one schema are not supported");
    const char *kw = any ? "anyOf" : "oneOf";
    json_t *arr = any ? any : one;
    static const char *const allowed[] = {"anyOf", "oneOf", NULL};
    int siblings = has_other(s, allowed, NULL);
    json_t *rest = NULL;
    if (siblings) {
        rest = json_copy(s);
        if (!rest)
            return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
        json_object_del(rest, kw);
    }
    size_t n = json_array_size(arr);
    json_t **alts = kiri_mem_calloc(n, sizeof *alts);
    int rc = alts ? 0 : kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    size_t mark = path_push(c, kw);
    size_t top = mark;
    for (size_t i = 0; i < n && rc == 0; i++) {
        json_t *a = json_array_get(arr, i);
        if (!siblings) {
            alts[i] = json_incref(a);
            continue;
        }
        alts[i] = json_object();
        size_t m = path_push_index(c, i);
        rc = alts[i] ? flatten(c, alts[i], rest, 0) : KIRI_E_NOMEM;
        if (rc == 0)
            rc = flatten(c, alts[i], a, 0);
        path_pop(c, m);
        if (rc == 0 && json_object_get(alts[i], "anyOf") && json_object_get(alts[i], "oneOf"))
            rc = unsupported(c, kw, "anyOf and oneOf meet in one alternative");
    }
    if (rc == 0 && one) {
        path_pop(c, top);
        for (size_t i = 0; i < n && rc == 0; i++)
            for (size_t j = i + 1; j < n && rc == 0; j++) {
                if ((rc = step(c)) != 0)
                    break;
                if (!excludes(c, alts[i], alts[j], 0) || !excludes(c, alts[j], alts[i], 0))
                    rc = fail(c, KIRI_E_UNSUPPORTED, "oneOf",
                              "alternatives %zu and %zu are not provably exclusive (use anyOf, or tell them apart "
                              "by type or a const property)", i, j);
            }
        if (rc == 0)
            path_push(c, kw);
    }
    BUF(b);
    int n_out = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (json_is_false(alts[i]))
            continue;
        size_t m = path_push_index(c, i);
        if (n_out++)
            kiri_buf_puts(&b, " | ");
        rc = gen(c, alts[i], depth + 1, &b);
        path_pop(c, m);
    }
    path_pop(c, mark);
    if (rc == 0 && n_out == 0)
        rc = unsupported(c, kw, "every alternative is false: no value satisfies the schema");
    if (rc == 0)
        rc = rule_make(c, kw, &b, out);
    kiri_buf_free(&b);
    for (size_t i = 0; alts && i < n; i++)
        json_decref(alts[i]);
    kiri_mem_free(alts);
    json_decref(rest);
    return rc;
}

static int gen_ref(struct compiler *c, json_t *s, int depth, struct kiri_buf *out)
{
    const char *ref = json_string_value(json_object_get(s, "$ref"));
    for (int i = 0; i < c->n_refs; i++)
        if (!strcmp(c->refs[i].ref, ref)) {
            kiri_buf_puts(out, c->rules[c->refs[i].rule].name);
            return 0;
        }
    json_t *t;
    int rc = resolve(c, ref, &t);
    if (rc)
        return rc;
    if (c->n_refs == c->cap_refs) {
        int cap = c->cap_refs ? c->cap_refs * 2 : 16;
        struct ref_memo *m = kiri_mem_realloc(c->refs, (size_t)cap * sizeof *m);
        if (!m)
            return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
        c->refs = m;
        c->cap_refs = cap;
    }
    const char *last = strrchr(ref, '/');
    int idx;
    rc = rule_reserve(c, last ? last + 1 : "root", NULL, &idx);
    if (rc)
        return rc;
    snprintf(c->rules[idx].src, sizeof c->rules[idx].src, "%.63s", ref);
    c->refs[c->n_refs].ref = kiri_mem_strndup(ref, strlen(ref));
    if (!c->refs[c->n_refs].ref)
        return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    c->refs[c->n_refs++].rule = idx;
    char saved[PATH_CAP];
    size_t saved_len = c->path_len;
    memcpy(saved, c->path, saved_len + 1);
    snprintf(c->path, sizeof c->path, "%s", ref + 1);
    c->path_len = strlen(c->path);
    BUF(b);
    rc = gen(c, t, depth + 1, &b);
    memcpy(c->path, saved, saved_len + 1);
    c->path_len = saved_len;
    if (rc == 0)
        rc = rule_finish(c, idx, &b);
    kiri_buf_free(&b);
    if (rc == 0)
        kiri_buf_puts(out, c->rules[idx].name);
    return rc;
}

/* Keys that are none of names[0..n) (sorted, of [a-zA-Z0-9_-] only), starting at character d of
 * the names that share the prefix names[0][0..d): one rule per trie node. */
static int gen_key_avoiding(struct compiler *c, const char **names, int n, size_t d, struct kiri_buf *out)
{
    int rc = step(c);
    if (rc)
        return rc;
    BUF(b);
    int terminal = 0, alt = 0;
    char firsts[64];
    int n_firsts = 0;
    for (int i = 0; i < n && rc == 0;) {
        if (strlen(names[i]) == d) {
            terminal = 1;
            i++;
            continue;
        }
        char ch = names[i][d];
        int j = i;
        while (j < n && strlen(names[j]) > d && names[j][d] == ch)
            j++;
        if (n_firsts < (int)sizeof firsts)
            firsts[n_firsts++] = ch;
        if (alt++)
            kiri_buf_puts(&b, " | ");
        kiri_schema_put_literal(&b, &ch, 1);
        kiri_buf_putc(&b, ' ');
        rc = gen_key_avoiding(c, names + i, j - i, d + 1, &b);
        i = j;
    }
    if (rc == 0) {
        /* Any other next character, then anything. */
        static const char alphabet[] = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz";
        BUF(cls);
        for (const char *a = alphabet; *a; a++)
            if (!memchr(firsts, *a, (size_t)n_firsts))
                kiri_buf_printf(&cls, "\\x%02X", (unsigned char)*a);
        if (cls.len) {
            if (alt++)
                kiri_buf_puts(&b, " | ");
            kiri_buf_printf(&b, "[%s] ", cls.data);
            rc = prim(c, P_KEYCHAR, &b);
            kiri_buf_putc(&b, '*');
        }
        kiri_buf_free(&cls);
        if (!terminal && d > 0)
            kiri_buf_puts(&b, alt++ ? " | \"\"" : "\"\"");
    }
    if (rc == 0)
        rc = rule_make(c, "key", &b, out);
    kiri_buf_free(&b);
    return rc;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The key of an extra property: any string when no property is named, else one of
 * [a-zA-Z0-9_-] that names none of them. */
static int gen_extra_key(struct compiler *c, json_t *props, struct kiri_buf *out)
{
    size_t n = json_object_size(props);
    if (n == 0)
        return prim(c, P_STRING, out);
    const char **names = kiri_mem_calloc(n, sizeof *names);
    if (!names)
        return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    int k = 0, rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v) {
        (void)v;
        if (strspn(key, "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz") != strlen(key))
            continue; /* never generated as an extra key */
        if (strlen(key) > MAX_KEY_LEN) {
            rc = unsupported(c, "additionalProperties", "a property name longer than 128 characters");
            break;
        }
        names[k++] = key;
    }
    if (rc == 0) {
        qsort(names, (size_t)k, sizeof *names, cmp_str);
        BUF(b);
        kiri_buf_puts(&b, "\"\\\"\" ");
        rc = gen_key_avoiding(c, names, k, 0, &b);
        kiri_buf_puts(&b, " \"\\\"\"");
        if (rc == 0)
            rc = rule_make(c, "extra-key", &b, out);
        kiri_buf_free(&b);
    }
    kiri_mem_free(names);
    return rc;
}

struct prop {
    const char *key;   /* borrowed from the schema */
    json_t *schema;    /* borrowed */
    int required;
};

static int gen_object(struct compiler *c, json_t *s, int depth, struct kiri_buf *out)
{
    json_t *props = json_object_get(s, "properties");
    json_t *req = json_object_get(s, "required");
    json_t *addl = json_object_get(s, "additionalProperties");
    size_t n_max = json_object_size(props) + json_array_size(req);
    if (n_max > MAX_PROPERTIES)
        return unsupported(c, "properties", "more than 512 properties");
    struct prop *list = kiri_mem_calloc(n_max ? n_max : 1, sizeof *list);
    char **kv = kiri_mem_calloc(n_max ? n_max : 1, sizeof *kv);
    if (!list || !kv) {
        kiri_mem_free(list);
        kiri_mem_free(kv);
        return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    }
    int n = 0, rc = 0;
    const char *key;
    json_t *v;
    json_object_foreach(props, key, v) {
        int r = 0;
        size_t i;
        json_t *e;
        json_array_foreach(req, i, e) r |= !strcmp(json_string_value(e), key);
        if (json_is_false(v)) {
            if (r) {
                size_t m = path_push(c, "properties");
                path_push(c, key);
                rc = fail(c, KIRI_E_UNSUPPORTED, "required", "%.60s is required but its schema is false", key);
                path_pop(c, m);
                break;
            }
            continue;
        }
        list[n++] = (struct prop){key, v, r};
    }
    /* Required names without a schema of their own. */
    size_t i;
    json_t *e;
    json_array_foreach(req, i, e) {
        if (rc)
            break;
        const char *name = json_string_value(e);
        if (json_object_get(props, name))
            continue;
        int dup = 0;
        for (int j = 0; j < n; j++)
            dup |= !strcmp(list[j].key, name);
        if (dup)
            continue;
        if (json_is_false(addl)) {
            rc = fail(c, KIRI_E_UNSUPPORTED, "required", "%.60s is required but additionalProperties is false",
                      name);
            break;
        }
        list[n++] = (struct prop){name, addl ? addl : json_true(), 1};
    }
    int n_req = 0;
    for (int j = 0; j < n; j++)
        n_req += list[j].required;
    int extras = json_is_true(addl) || json_is_object(addl) || (!addl && !props && !req);
    long min_p = get_count(s, "minProperties", 0), max_p = get_count(s, "maxProperties", -1);
    if (rc == 0 && min_p > n_req)
        rc = unsupported(c, "minProperties", "more than the required properties is not supported");
    if (rc == 0 && max_p >= 0 && (extras || max_p < n))
        rc = unsupported(c, "maxProperties", "fewer than the listed properties (or with additional ones) is not "
                                             "supported");
    /* One "key": value text per property. */
    BUF(ws);
    if (rc == 0)
        rc = prim(c, P_WS, &ws);
    for (int j = 0; j < n && rc == 0; j++) {
        BUF(b);
        json_t *k = json_string(list[j].key);
        rc = k ? put_json_literal(&b, k) : KIRI_E_NOMEM;
        json_decref(k);
        kiri_buf_printf(&b, " %s \":\" %s ", ws.data, ws.data);
        size_t m = path_push(c, "properties");
        size_t m2 = path_push(c, list[j].key);
        if (rc == 0)
            rc = gen(c, list[j].schema, depth + 1, &b);
        path_pop(c, m2);
        path_pop(c, m);
        kiri_buf_printf(&b, " %s", ws.data);
        if (rc == 0 && b.failed)
            rc = buf_error(c, &b);
        if (rc == 0)
            kv[j] = kiri_buf_take(&b, NULL);
        kiri_buf_free(&b);
        if (rc == 0 && !kv[j])
            rc = kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    }
    /* The extra pair, when additional properties are generated. */
    BUF(extra);
    if (rc == 0 && extras) {
        BUF(b);
        rc = gen_extra_key(c, props, &b);
        kiri_buf_printf(&b, " %s \":\" %s ", ws.data, ws.data);
        size_t m = path_push(c, "additionalProperties");
        if (rc == 0)
            rc = json_is_object(addl) ? gen(c, addl, depth + 1, &b) : prim(c, P_VALUE, &b);
        path_pop(c, m);
        kiri_buf_printf(&b, " %s", ws.data);
        if (rc == 0)
            rc = rule_make(c, "extra", &b, &extra);
        kiri_buf_free(&b);
    }
    /* rest[j]: properties j.. after something was written (each with its comma); first[j]: the
     * same when nothing was written yet. Both are rules or short texts. */
    BUF(rest);
    BUF(first);
    if (rc == 0 && extras) {
        kiri_buf_printf(&rest, "( \",\" %s %s )*", ws.data, extra.data);
        kiri_buf_printf(&first, "( %s ( \",\" %s %s )* )?", extra.data, ws.data, extra.data);
    }
    for (int j = n - 1; j >= 0 && rc == 0; j--) {
        BUF(r);
        BUF(f);
        if (list[j].required)
            kiri_buf_printf(&r, "\",\" %s %s %s", ws.data, kv[j], rest.data ? rest.data : "");
        else
            kiri_buf_printf(&r, "( \",\" %s %s )? %s", ws.data, kv[j], rest.data ? rest.data : "");
        if (list[j].required)
            kiri_buf_printf(&f, "%s %s", kv[j], rest.data ? rest.data : "");
        else if (first.len)
            kiri_buf_printf(&f, "%s %s | %s", kv[j], rest.data ? rest.data : "", first.data);
        else
            kiri_buf_printf(&f, "( %s %s )?", kv[j], rest.data ? rest.data : "");
        kiri_buf_clear(&rest);
        kiri_buf_clear(&first);
        if (j > 0)
            rc = rule_make(c, "rest", &r, &rest);
        if (rc == 0 && list[j].required)
            kiri_buf_puts(&first, f.data ? f.data : "");
        else if (rc == 0)
            rc = rule_make(c, "props", &f, &first);
        kiri_buf_free(&r);
        kiri_buf_free(&f);
    }
    if (rc == 0) {
        BUF(b);
        kiri_buf_printf(&b, "\"{\" %s %s \"}\"", ws.data, first.data ? first.data : "");
        rc = rule_make(c, "object", &b, out);
        kiri_buf_free(&b);
    }
    kiri_buf_free(&ws);
    kiri_buf_free(&extra);
    kiri_buf_free(&rest);
    kiri_buf_free(&first);
    for (size_t j = 0; j < n_max; j++)
        kiri_mem_free(kv[j]);
    kiri_mem_free(kv);
    kiri_mem_free(list);
    return rc;
}

static int gen_array(struct compiler *c, json_t *s, int depth, struct kiri_buf *out)
{
    json_t *items = json_object_get(s, "items");
    json_t *prefix = json_object_get(s, "prefixItems");
    json_t *tail = items;
    if (json_is_array(items)) { /* draft 4 to 2019-09 tuples */
        if (prefix)
            return unsupported(c, "items", "an array of items together with prefixItems");
        prefix = items;
        tail = json_object_get(s, "additionalItems");
    }
    size_t k = json_array_size(prefix);
    if (k > MAX_PROPERTIES)
        return unsupported(c, "prefixItems", "more than 512 items");
    long min = get_count(s, "minItems", 0), max = get_count(s, "maxItems", -1);
    if (json_is_false(tail))
        max = max < 0 || max > (long)k ? (long)k : max;
    if (max >= 0 && min > max)
        return unsupported(c, "minItems", "minItems is above maxItems (or the items allowed): no value");
    if (min > MAX_REPEAT)
        return unsupported(c, "minItems", "more than 256 items are not supported");
    if (max > MAX_REPEAT && max > (long)k)
        max = MAX_REPEAT > (long)k ? MAX_REPEAT : (long)k;
    json_t *unique = json_object_get(s, "uniqueItems");
    if (json_is_true(unique) && (max < 0 || max > 1))
        return unsupported(c, "uniqueItems", "uniqueItems true is not supported (unless maxItems <= 1)");
    BUF(ws);
    int rc = prim(c, P_WS, &ws);
    /* The element after the tuple. */
    BUF(t);
    if (rc == 0 && (max < 0 || max > (long)k)) {
        size_t m = path_push(c, json_is_array(items) ? "additionalItems" : "items");
        if (!tail || json_is_true(tail))
            rc = prim(c, P_VALUE, &t);
        else
            rc = gen(c, tail, depth + 1, &t);
        path_pop(c, m);
    }
    BUF(seq);
    if (rc == 0 && (max < 0 || max > (long)k)) {
        long tmin = min > (long)k ? min - (long)k : 0, tmax = max < 0 ? -1 : max - (long)k;
        if (k > 0) {
            kiri_buf_printf(&seq, "( \",\" %s %s %s )", ws.data, t.data, ws.data);
            kiri_schema_put_repeat(&seq, tmin, tmax);
        } else if (tmin >= 1) {
            kiri_buf_printf(&seq, "%s %s", t.data, ws.data);
            if (tmax != 1) {
                kiri_buf_printf(&seq, " ( \",\" %s %s %s )", ws.data, t.data, ws.data);
                kiri_schema_put_repeat(&seq, tmin - 1, tmax < 0 ? -1 : tmax - 1);
            }
        } else {
            kiri_buf_printf(&seq, "( %s %s", t.data, ws.data);
            if (tmax != 1) {
                kiri_buf_printf(&seq, " ( \",\" %s %s %s )", ws.data, t.data, ws.data);
                kiri_schema_put_repeat(&seq, 0, tmax < 0 ? -1 : tmax - 1);
            }
            kiri_buf_puts(&seq, " )?");
        }
    }
    for (long j = (long)k - 1; j >= 0 && rc == 0; j--) {
        if (max >= 0 && j >= max)
            continue;
        BUF(e);
        BUF(b);
        size_t m = path_push(c, json_is_array(items) ? "items" : "prefixItems");
        size_t m2 = path_push_index(c, (size_t)j);
        rc = gen(c, json_array_get(prefix, (size_t)j), depth + 1, &e);
        path_pop(c, m2);
        path_pop(c, m);
        BUF(elem);
        if (j > 0)
            kiri_buf_printf(&elem, "\",\" %s ", ws.data);
        kiri_buf_printf(&elem, "%s %s %s", e.data ? e.data : "", ws.data, seq.data ? seq.data : "");
        kiri_buf_printf(&b, j < min ? "%s" : "( %s )?", elem.data ? elem.data : "");
        kiri_buf_free(&elem);
        kiri_buf_clear(&seq);
        if (rc == 0)
            rc = rule_make(c, "tuple", &b, &seq);
        kiri_buf_free(&e);
        kiri_buf_free(&b);
    }
    if (rc == 0) {
        BUF(b);
        kiri_buf_printf(&b, "\"[\" %s %s \"]\"", ws.data, seq.data ? seq.data : "");
        rc = rule_make(c, "array", &b, out);
        kiri_buf_free(&b);
    }
    kiri_buf_free(&ws);
    kiri_buf_free(&t);
    kiri_buf_free(&seq);
    return rc;
}

/* ---- strings ---- */

static int gen_string(struct compiler *c, json_t *s, struct kiri_buf *out)
{
    json_t *format = json_object_get(s, "format"), *pattern = json_object_get(s, "pattern");
    int has_len = json_object_get(s, "minLength") || json_object_get(s, "maxLength");
    long min = get_count(s, "minLength", 0), max = get_count(s, "maxLength", -1);
    if (format && (pattern || has_len))
        return unsupported(c, "format", "format together with pattern or minLength/maxLength is not supported");
    if (pattern && has_len)
        return unsupported(c, "pattern", "pattern together with minLength/maxLength is not supported");
    if (max >= 0 && min > max)
        return unsupported(c, "minLength", "minLength is above maxLength: no value");
    if (min > MAX_REPEAT)
        return unsupported(c, "minLength", "more than 256 characters are not supported");
    if (max > MAX_REPEAT)
        max = MAX_REPEAT;
    BUF(b);
    int rc = 0;
    kiri_buf_puts(&b, "\"\\\"\" ");
    if (format) {
        if (kiri_schema_put_format(&b, json_string_value(format)))
            rc = fail(c, KIRI_E_UNSUPPORTED, "format", "%.60s is not supported (date, time, date-time, uuid, email, "
                      "hostname, uri, ipv4 are)", json_string_value(format));
    } else if (pattern) {
        BUF(any);
        rc = prim(c, P_CHAR, &any);
        char err[160];
        const char *p = json_string_value(pattern);
        if (rc == 0) {
            rc = kiri_schema_regex_to_gbnf(p, json_string_length(pattern), any.data, &b, err, sizeof err);
            if (rc)
                rc = fail(c, rc == KIRI_E_NOMEM ? KIRI_E_NOMEM : rc, "pattern", "%s", err);
        }
        kiri_buf_free(&any);
    } else {
        rc = prim(c, P_CHAR, &b);
        kiri_schema_put_repeat(&b, min, max);
    }
    kiri_buf_puts(&b, " \"\\\"\"");
    if (rc == 0)
        rc = rule_make(c, format ? json_string_value(format) : pattern ? "pattern" : "string", &b, out);
    kiri_buf_free(&b);
    return rc;
}

static int gen_number(struct compiler *c, json_t *s, int integer, struct kiri_buf *out)
{
    json_t *mult = json_object_get(s, "multipleOf");
    if (mult && json_number_value(mult) != 1.0)
        return unsupported(c, "multipleOf", "multipleOf other than 1 is not supported");
    if (mult)
        integer = 1;
    json_t *mn = json_object_get(s, "minimum"), *mx = json_object_get(s, "maximum");
    json_t *emn = json_object_get(s, "exclusiveMinimum"), *emx = json_object_get(s, "exclusiveMaximum");
    if (!mn && !mx && !json_is_number(emn) && !json_is_number(emx))
        return prim(c, integer ? P_INTEGER : P_NUMBER, out);
    /* A bounded number is written as an integer of the range (narrower, always valid). */
    double lo = -(double)INT_LIMIT, hi = (double)INT_LIMIT;
    if (mn)
        lo = json_is_true(emn) ? floor(json_number_value(mn)) + 1 : ceil(json_number_value(mn));
    if (json_is_number(emn) && floor(json_number_value(emn)) + 1 > lo)
        lo = floor(json_number_value(emn)) + 1;
    if (mx)
        hi = json_is_true(emx) ? ceil(json_number_value(mx)) - 1 : floor(json_number_value(mx));
    if (json_is_number(emx) && ceil(json_number_value(emx)) - 1 < hi)
        hi = ceil(json_number_value(emx)) - 1;
    if (lo < -(double)INT_LIMIT)
        lo = -(double)INT_LIMIT;
    if (hi > (double)INT_LIMIT)
        hi = (double)INT_LIMIT;
    if (lo > hi)
        return unsupported(c, mn ? "minimum" : "exclusiveMinimum",
                           integer ? "no integer lies within the bounds" : "bounds with no integer inside are not supported");
    long long a = (long long)lo, z = (long long)hi;
    BUF(b);
    int alt = 0;
    if (a < 0) {
        long long mag_lo = z < 0 ? -z : 1, mag_hi = -a;
        kiri_buf_puts(&b, "\"-\" ");
        kiri_schema_put_natural_range(&b, mag_lo, mag_hi);
        alt = 1;
    }
    if (z >= 0) {
        if (alt)
            kiri_buf_puts(&b, " | ");
        kiri_schema_put_natural_range(&b, a > 0 ? a : 0, z);
    }
    int rc = rule_make(c, integer ? "integer" : "number", &b, out);
    kiri_buf_free(&b);
    return rc;
}

/* ---- the dispatcher ---- */

static int gen_type(struct compiler *c, json_t *s, int type, int depth, struct kiri_buf *out)
{
    switch (type) {
    case T_NULL: return prim(c, P_NULL, out);
    case T_BOOL: return prim(c, P_BOOLEAN, out);
    case T_OBJ: return gen_object(c, s, depth, out);
    case T_ARR: return gen_array(c, s, depth, out);
    case T_STR: return gen_string(c, s, out);
    case T_NUM: return gen_number(c, s, 0, out);
    default: return gen_number(c, s, 1, out);
    }
}

static int gen(struct compiler *c, json_t *s, int depth, struct kiri_buf *out)
{
    int rc = step(c);
    if (rc)
        return rc;
    if (depth > MAX_DEPTH)
        return unsupported(c, NULL, "the schema nests deeper than 128 levels");
    if (json_is_true(s))
        return prim(c, P_VALUE, out);
    if (json_is_false(s))
        return unsupported(c, NULL, "the schema is false: no value satisfies it");
    if (!json_is_object(s))
        return fail(c, KIRI_E_INVALID_ARG, NULL, "a schema must be an object or a boolean");
    if ((rc = check_keywords(c, s)) != 0)
        return rc;
    static const char *const only_ref[] = {"$ref", NULL};
    if (json_object_get(s, "$ref") && !has_other(s, only_ref, NULL))
        return gen_ref(c, s, depth, out);
    if (json_object_get(s, "allOf") || json_object_get(s, "$ref")) {
        json_t *merged = json_object();
        if (!merged)
            return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
        rc = flatten(c, merged, s, 0);
        if (rc == 0)
            rc = gen(c, merged, depth + 1, out);
        json_decref(merged);
        return rc;
    }
    if (json_object_get(s, "anyOf") || json_object_get(s, "oneOf"))
        return gen_alternatives(c, s, depth, out);
    if (json_object_get(s, "enum") || json_object_get(s, "const"))
        return gen_enum(c, s, out);
    int types = generated_types(c, s);
    if (types < 0)
        return types;
    if (types == T_ANY && !json_object_get(s, "type"))
        return prim(c, P_VALUE, out);
    int n_types = 0;
    for (int t = 1; t <= T_INT; t <<= 1)
        n_types += (types & t) != 0;
    if (n_types == 1)
        return gen_type(c, s, types, depth, out);
    BUF(b);
    int alt = 0;
    for (int t = 1; t <= T_INT && rc == 0; t <<= 1) {
        if (!(types & t))
            continue;
        if (alt++)
            kiri_buf_puts(&b, " | ");
        rc = gen_type(c, s, t, depth, &b);
    }
    if (rc == 0)
        rc = rule_make(c, "types", &b, out);
    kiri_buf_free(&b);
    return rc;
}

/* Refuses a grammar with a rule that can never finish (a $ref cycle without a base case). */
static int check_finite(struct compiler *c)
{
    const char **names = kiri_mem_calloc((size_t)c->n_rules + 1, sizeof *names);
    const char **bodies = kiri_mem_calloc((size_t)c->n_rules + 1, sizeof *bodies);
    int rc = names && bodies ? 0 : KIRI_E_NOMEM, bad = 0;
    for (int i = 0; i < c->n_rules && rc == 0; i++) {
        names[i] = c->rules[i].name;
        bodies[i] = c->rules[i].body;
    }
    if (rc == 0)
        rc = kiri_schema_check_finite(names, bodies, c->done, c->n_rules, &bad);
    kiri_mem_free(names);
    kiri_mem_free(bodies);
    if (rc == KIRI_E_NOMEM)
        return kiri_error_set(c->info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
    if (rc)
        return kiri_error_at(c->info, KIRI_E_UNSUPPORTED, c->rules[bad].src, -1,
                             rc == 2 ? "$ref: the references nest too intricately to check"
                                     : "$ref: this recursion can never end (no finite value satisfies it)");
    return 0;
}

/* ---- entry ---- */

int kiri_json_schema_to_gbnf(const char *schema, size_t len, const char *root_name, const char *prefix,
                             char **gbnf, size_t *gbnf_len, struct kiri_status_info *info)
{
    kiri_error_clear(info);
    if (!schema || !gbnf || !gbnf_len)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "json_schema", -1, "no schema text");
    if (len > KIRI_GRAMMAR_MAX_SIZE)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "json_schema", -1, "the schema is larger than 1 MiB");
    root_name = root_name ? root_name : "root";
    prefix = prefix ? prefix : "";
    if (!name_ok(root_name, 0) || !name_ok(prefix, 1) || strlen(root_name) > 32 || strlen(prefix) > 32)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "json_schema", -1,
                             "rule names and prefixes are 1 to 32 of [a-zA-Z0-9-]");
    json_error_t jerr;
    json_t *root = json_loadb(schema, len, JSON_DECODE_ANY, &jerr);
    if (!root)
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "json_schema", jerr.position,
                             "not JSON: %s (line %d, column %d)", jerr.text, jerr.line, jerr.column);
    struct compiler c;
    memset(&c, 0, sizeof c);
    c.root = root;
    c.prefix = prefix;
    c.root_name = root_name;
    c.info = info;
    BUF(top);
    BUF(out);
    int rc = gen(&c, root, 0, &top);
    if (rc == 0 && top.failed)
        rc = buf_error(&c, &top);
    if (rc == 0)
        rc = check_finite(&c);
    if (rc == 0) {
        kiri_buf_printf(&out, "%s ::= %s\n", root_name, top.data);
        for (int i = 0; i < c.n_rules; i++)
            kiri_buf_printf(&out, "%s ::= %s\n", c.rules[i].name, c.rules[i].body);
        if (out.failed)
            rc = buf_error(&c, &out);
    }
    if (rc == 0) {
        size_t n;
        char *text = kiri_buf_take(&out, &n);
        if (!text) {
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory compiling the JSON schema");
        } else {
            *gbnf = text;
            *gbnf_len = n;
        }
    }
    kiri_buf_free(&top);
    kiri_buf_free(&out);
    for (int i = 0; i < c.n_rules; i++) {
        kiri_mem_free(c.rules[i].name);
        kiri_mem_free(c.rules[i].body);
    }
    for (int i = 0; i < c.n_refs; i++)
        kiri_mem_free(c.refs[i].ref);
    kiri_mem_free(c.rules);
    kiri_mem_free(c.done);
    kiri_mem_free(c.refs);
    json_decref(root);
    if (rc && info && info->code == KIRI_OK)
        kiri_error_set(info, rc, "the JSON schema could not be compiled");
    return rc;
}
