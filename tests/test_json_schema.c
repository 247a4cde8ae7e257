/* schema/json_schema: error records for bad and hostile schemas, the out-of-memory walk, and the
 * shape of what it returns (the grammar itself is checked against llama.cpp and jsonschema in
 * tests/test_json_schema.py). */
#include "test.h"

#include "json_schema.h"
#include "kiri.h"
#include "mem.h"

static int compile(const char *schema, struct kiri_status_info *info, char **out)
{
    size_t len = 0;
    char *g = NULL;
    int rc = kiri_json_schema_to_gbnf(schema, strlen(schema), NULL, NULL, &g, &len, info);
    if (out)
        *out = g;
    else
        kiri_mem_free(g);
    return rc;
}

static void expect(const char *schema, int code, const char *field, const char *word)
{
    struct kiri_status_info info;
    int rc = compile(schema, &info, NULL);
    CHECK_EQ_INT(rc, code);
    if (field)
        CHECK_STR(info.field, field);
    if (word && !strstr(info.message, word)) {
        fprintf(stderr, "message \"%s\" lacks \"%s\" (schema %s)\n", info.message, word, schema);
        CHECK(0);
    }
}

static void test_refusals(void)
{
    expect("{", KIRI_E_INVALID_ARG, "json_schema", "not JSON");
    expect("[1]", KIRI_E_INVALID_ARG, "#", "schema");
    expect("{\"type\":\"string\",\"not\":{}}", KIRI_E_UNSUPPORTED, "#", "not");
    expect("{\"properties\":{\"a\":{\"type\":\"array\",\"uniqueItems\":true}}}", KIRI_E_UNSUPPORTED,
           "#/properties/a", "uniqueItems");
    expect("{\"type\":\"number\",\"multipleOf\":3}", KIRI_E_UNSUPPORTED, "#", "multipleOf");
    expect("{\"type\":\"object\",\"patternProperties\":{\"a\":{}}}", KIRI_E_UNSUPPORTED, "#", "patternProperties");
    expect("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", KIRI_E_UNSUPPORTED, "#", "backreference");
    expect("{\"type\":\"string\",\"pattern\":\"a(?=b)\"}", KIRI_E_UNSUPPORTED, "#", "lookahead");
    expect("{\"type\":\"string\",\"pattern\":\"(?<=a)b\"}", KIRI_E_UNSUPPORTED, "#", "lookbehind");
    expect("{\"type\":\"string\",\"format\":\"ipv6\"}", KIRI_E_UNSUPPORTED, "#", "format");
    expect("{\"minLength\":\"3\"}", KIRI_E_INVALID_ARG, "#", "minLength");
    expect("{\"type\":7}", KIRI_E_INVALID_ARG, "#", "type");
    expect("{\"type\":\"strin\"}", KIRI_E_INVALID_ARG, "#", "type");
    expect("{\"$ref\":\"http://example.com/s.json\"}", KIRI_E_UNSUPPORTED, "#", "$ref");
    expect("{\"$ref\":\"#/$defs/missing\"}", KIRI_E_INVALID_ARG, "#", "$ref");
    expect("{\"$defs\":{\"a\":{\"$ref\":\"#/$defs/a\"}},\"$ref\":\"#/$defs/a\"}", KIRI_E_UNSUPPORTED, NULL,
           "recursion");
    expect("{\"$defs\":{\"n\":{\"type\":\"object\",\"required\":[\"next\"],\"properties\":{\"next\":{\"$ref\":"
           "\"#/$defs/n\"}}}},\"$ref\":\"#/$defs/n\"}",
           KIRI_E_UNSUPPORTED, "#/$defs/n", "recursion");
    expect("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"string\",\"minLength\":2}]}", KIRI_E_UNSUPPORTED, "#",
           "oneOf");
    expect("{\"enum\":[]}", KIRI_E_UNSUPPORTED, "#", "enum");
    expect("false", KIRI_E_UNSUPPORTED, "#", "false");
    expect("{\"type\":\"integer\",\"minimum\":5,\"maximum\":4}", KIRI_E_UNSUPPORTED, "#", "minimum");
    expect("{\"type\":\"object\",\"required\":[\"a\"],\"additionalProperties\":false}", KIRI_E_UNSUPPORTED, "#",
           "required");
    expect("{\"type\":\"string\"}", KIRI_OK, NULL, NULL);
}

static void test_hostile(void)
{
    /* Deep nesting, a huge enum, many properties: refused, quickly. */
    char *deep = malloc(64 * 1024);
    size_t n = 0;
    for (int i = 0; i < 2000; i++)
        n += (size_t)sprintf(deep + n, "{\"items\":");
    n += (size_t)sprintf(deep + n, "true");
    for (int i = 0; i < 2000; i++)
        deep[n++] = '}';
    deep[n] = 0;
    struct kiri_status_info info;
    int rc = compile(deep, &info, NULL);
    CHECK(rc == KIRI_E_UNSUPPORTED || rc == KIRI_E_INVALID_ARG);
    free(deep);
    char *big = malloc(1 << 20);
    n = (size_t)sprintf(big, "{\"enum\":[");
    for (int i = 0; i < 5000; i++)
        n += (size_t)sprintf(big + n, "%s%d", i ? "," : "", i);
    sprintf(big + n, "]}");
    expect(big, KIRI_E_UNSUPPORTED, "#", "enum");
    free(big);
    /* A reference chain that doubles at each level stays bounded by the rule and step caps. */
    char wide[8192];
    n = (size_t)sprintf(wide, "{\"$defs\":{");
    for (int i = 0; i < 40; i++)
        n += (size_t)sprintf(wide + n, "%s\"d%d\":{\"type\":\"array\",\"items\":{\"anyOf\":[{\"$ref\":\"#/$defs/d%d\"},"
                             "{\"$ref\":\"#/$defs/d%d\"}]}}", i ? "," : "", i, i + 1, i + 1);
    sprintf(wide + n, ",\"d40\":{\"type\":\"null\"}},\"$ref\":\"#/$defs/d0\"}");
    rc = compile(wide, &info, NULL);
    CHECK_EQ_INT(rc, KIRI_OK);
}

static void test_names(void)
{
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}";
    char *g = NULL;
    size_t len;
    struct kiri_status_info info;
    int rc = kiri_json_schema_to_gbnf(s, strlen(s), "tool-args", "t1-", &g, &len, &info);
    CHECK_EQ_INT(rc, KIRI_OK);
    CHECK(g && !strncmp(g, "tool-args ::= ", 14));
    CHECK(g && strlen(g) == len);
    /* Every other rule starts with the prefix. */
    for (const char *p = g ? strchr(g, '\n') : NULL; p && p[1]; p = strchr(p + 1, '\n'))
        CHECK(!strncmp(p + 1, "t1-", 3));
    kiri_mem_free(g);
    rc = kiri_json_schema_to_gbnf(s, strlen(s), "bad name", NULL, &g, &len, &info);
    CHECK_EQ_INT(rc, KIRI_E_INVALID_ARG);
}

static void test_out_of_memory(void)
{
    const char *s = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\",\"pattern\":\"^[a-z]+$\"},"
                    "\"b\":{\"anyOf\":[{\"type\":\"integer\",\"minimum\":3},{\"type\":\"null\"}]},\"c\":{\"type\":"
                    "\"array\",\"items\":{\"$ref\":\"#\"}}},\"required\":[\"a\"],\"additionalProperties\":"
                    "{\"type\":\"boolean\"}}";
    int ok = 0;
    for (long n = 0; n < 5000 && !ok; n++) {
        kiri_mem_fail_after(n);
        char *g = NULL;
        struct kiri_status_info info;
        int rc = compile(s, &info, &g);
        kiri_mem_fail_after(-1);
        CHECK(rc == KIRI_OK || rc == KIRI_E_NOMEM);
        CHECK((rc == KIRI_OK) == (g != NULL));
        ok = rc == KIRI_OK;
        kiri_mem_free(g);
    }
    CHECK(ok);
}

TEST_MAIN(test_refusals, test_hostile, test_names, test_out_of_memory)
