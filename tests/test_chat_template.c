/* Tests for template/chat_template.c: malformed templates, the sandbox and its caps (G36: a
 * 10 MB template, unbounded work, attribute access like __class__), raise_exception, the
 * failing allocator. Byte-exact agreement with jinja2 on real templates is checked by
 * tests/test_chat_template.py; the expected texts here are the documented ChatML format and
 * Python's own printing rules. */
#include "chat_template.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "test.h"

#ifndef KIRI_SOURCE_DIR
#define KIRI_SOURCE_DIR "."
#endif

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

static const struct kiri_chat_message conv[] = {
    {"system", "You are helpful."},
    {"user", "Hi"},
    {"assistant", "Hello!"},
    {"user", "Bye"},
};
#define N_CONV ((int)(sizeof conv / sizeof conv[0]))

/* Parses and renders src; returns the status, the text in *out (caller frees) on success. */
static int render_n(const char *src, size_t len, const struct kiri_chat_message *msgs, int n,
                    const struct kiri_chat_limits *limits, char **out,
                    struct kiri_status_info *info)
{
    struct kiri_chat_template *t = NULL;
    size_t out_len = 0;
    kiri_error_clear(info);
    *out = NULL;
    int rc = kiri_chat_template_init(src, len, &t, info);
    if (rc != KIRI_OK) {
        CHECK(t == NULL);
        return rc;
    }
    rc = kiri_chat_template_render(t, msgs, n, "<s>", "</s>", 1, limits, out, &out_len, info);
    if (rc == KIRI_OK)
        CHECK_EQ_INT(strlen(*out), out_len);
    else
        CHECK(*out == NULL);
    kiri_chat_template_free(t);
    return rc;
}

static int render(const char *src, const struct kiri_chat_limits *limits, char **out,
                  struct kiri_status_info *info)
{
    return render_n(src, strlen(src), conv, N_CONV, limits, out, info);
}

/* Renders src expecting success and the text want. */
static void expect_text(const char *src, const char *want)
{
    struct kiri_status_info info;
    char *out;
    int rc = render(src, NULL, &out, &info);
    CHECK_EQ_INT(rc, KIRI_OK);
    if (rc != KIRI_OK)
        fprintf(stderr, "  template %s: %s\n", src, info.message);
    else
        CHECK_STR(out, want);
    kiri_mem_free(out);
}

/* Renders src expecting status code, field and a message containing needle. */
static void expect_error(const char *src, size_t len, int code, const char *field, const char *needle)
{
    struct kiri_status_info info;
    char *out;
    int rc = render_n(src, len, conv, N_CONV, NULL, &out, &info);
    CHECK_EQ_INT(rc, code);
    CHECK_EQ_INT(info.code, code);
    if (field)
        CHECK_STR(info.field, field);
    if (needle && !strstr(info.message, needle)) {
        CHECK(strstr(info.message, needle) != NULL);
        fprintf(stderr, "  template \"%.60s\": message \"%s\" lacks \"%s\"\n", src, info.message, needle);
    }
    kiri_mem_free(out);
}

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

/* CPU time of this process: the caps bound work, and wall time on a shared machine says little. */
static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------------------------------
 * Rendering
 * ------------------------------------------------------------------------------------------- */

static void test_chatml(void)
{
    const char *src = kiri_chat_template_chatml();
    expect_text(src, "<|im_start|>system\nYou are helpful.<|im_end|>\n"
                     "<|im_start|>user\nHi<|im_end|>\n"
                     "<|im_start|>assistant\nHello!<|im_end|>\n"
                     "<|im_start|>user\nBye<|im_end|>\n"
                     "<|im_start|>assistant\n");
}

static void test_variables(void)
{
    expect_text("{{ bos_token }}|{{ eos_token }}|{{ add_generation_prompt }}|{{ tools }}|"
                "{{ documents is none }}|{{ messages|length }}|{{ messages[-1].content }}",
                "<s>|</s>|True|None|True|4|Bye");
    /* content NULL is none; bos/eos NULL are undefined */
    struct kiri_chat_message m[2] = {{"user", "q"}, {"assistant", NULL}};
    struct kiri_chat_template *t;
    struct kiri_status_info info;
    char *out;
    size_t len;
    const char *src = "{{ messages[1].content is none }}{{ bos_token is defined }}[{{ eos_token }}]";
    CHECK_EQ_INT(kiri_chat_template_init(src, strlen(src), &t, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_chat_template_render(t, m, 2, NULL, NULL, 0, NULL, &out, &len, &info), KIRI_OK);
    CHECK_STR(out, "TrueFalse[]");
    kiri_mem_free(out);
    /* an empty conversation and an empty template are fine */
    CHECK_EQ_INT(kiri_chat_template_render(t, NULL, 0, NULL, NULL, 0, NULL, &out, &len, &info),
                 KIRI_E_UNSUPPORTED); /* messages[1] of nothing: 'item' is undefined */
    kiri_chat_template_free(t);
    CHECK_EQ_INT(kiri_chat_template_init("", 0, &t, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_chat_template_render(t, NULL, 0, NULL, NULL, 0, NULL, &out, &len, &info), KIRI_OK);
    CHECK_STR(out, "");
    CHECK_EQ_INT(len, 0);
    kiri_mem_free(out);
    kiri_chat_template_free(t);
}

/* Whitespace control as transformers configures jinja2 (trim_blocks, lstrip_blocks, no trailing
 * newline) and Python's printing of values. */
static void test_semantics(void)
{
    static const struct { const char *src, *want; } cases[] = {
        {"  {% if true %}\n  x\n  {% endif %}\n  {{ 1 }}\n", "  x\n  1"},
        {"a  {%- if true -%}  b  {%- endif -%}  c", "abc"},
        {"{# c #}\nA {#- c -#} B", "AB"},
        {"{{ 1.0 }} {{ 1e16 }} {{ 1e15 }} {{ 0.1 + 0.2 }} {{ 1e-5 }} {{ 7 // -2 }} {{ -7 % 3 }}",
         "1.0 1e+16 1000000000000000.0 0.30000000000000004 1e-05 -4 2"},
        {"{{ [1, 'a', none, true] }} {{ {'k': \"it's\"} }} {{ (1,) }}",
         "[1, 'a', None, True] {'k': \"it's\"} (1,)"},
        {"{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + loop.index %}"
         "{% endfor %}{{ ns.n }}",
         "10"},
        {"{% for m in messages if m.role == 'user' %}{{ loop.index }}/{{ loop.length }} {% endfor %}",
         "1/2 2/2 "},
        {"{{ 'héllo'|length }} {{ 'héllo'[1] }} {{ 'abc'[::-1] }} {{ messages[1:]|map(attribute='role')|join(',') }}",
         "5 é cba user,assistant,user"},
        {"{{ {'b': [1, {'c': none}], 'a': 'é'}|tojson }}", "{\"b\": [1, {\"c\": null}], \"a\": \"é\"}"},
        {"{{ ' a b '.split() }} {{ 'x</think>y'.split('</think>')[-1] }} {{ '\\n\\nq\\n'.strip('\\n') }}",
         "['a', 'b'] y q"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_text(cases[i].src, cases[i].want);
}

/* ---------------------------------------------------------------------------------------------
 * Malformed templates: refused at parse time, with the line and column
 * ------------------------------------------------------------------------------------------- */

static void test_malformed(void)
{
    static const struct { const char *src, *needle; } cases[] = {
        {"{% if x %}no end", "expected '{% endif %}'"},
        {"{% for x in y %}{% endif %}", "expected '{% endfor %}'"},
        {"{% endfor %}", "without a matching opening tag"},
        {"{{ x ", "unexpected end of template"},
        {"{{ 'abc }}", "unterminated string"},
        {"{# comment", "missing end of comment tag"},
        {"{% raw %}abc", "missing end of raw directive"},
        {"{{ (1 }}", "expected ')'"},
        {"{{ ) }}", "unexpected ')'"},
        {"{{ [1, 2) }}", "unexpected ')', expected ']'"},
        {"{{ x|nosuchfilter }}", "unknown filter 'nosuchfilter'"},
        {"{{ x is nosuchtest }}", "unknown test 'nosuchtest'"},
        {"{% if x %}{% macro m() %}{% endmacro %}{% endif %}", "macro inside another block"},
        {"{% macro m(a=1, b) %}{% endmacro %}", "without a default follows one with"},
        {"{% call m() %}{% endcall %}", "'call' tag is not supported"},
        {"{% endmacro %}", "'endmacro' without a matching opening tag"},
        {"{% include 'x' %}", "'include' tag is not supported"},
        {"{% frobnicate %}", "unknown tag 'frobnicate'"},
        {"{% break %}", "outside a for loop"},
        {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
        {"{{ '\\N{BULLET}' }}", "\\N{...}"},
        {"{{ '\\x4' }}", "truncated \\x escape"},
        {"{{ '\\x00' }}", "NUL characters"},
        {"{{ 99999999999999999999 }}", "out of range"},
        {"{{ f(*args) }}", "*args and **kwargs"},
        {"{{ x @ y }}", "unexpected character '@'"},
        {"{{ naïve }}", "non-ASCII identifiers"},
        {"{{ 1 }}\nline two {{ 1 + }}", "line 2, column 17"},
        {"{% set x %}", "expected '{% endset %}'"},
        {"{% if %}{% endif %}", "expected an expression"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        expect_error(cases[i].src, strlen(cases[i].src), KIRI_E_UNSUPPORTED, "chat_template",
                     cases[i].needle);
    /* not UTF-8, or with a NUL byte */
    expect_error("{{ '\xff' }}", 8, KIRI_E_INVALID_ARG, "chat_template", "UTF-8");
    expect_error("ab\0cd", 5, KIRI_E_INVALID_ARG, "chat_template", "UTF-8");
    /* NULL arguments */
    struct kiri_chat_template *t;
    struct kiri_status_info info;
    CHECK_EQ_INT(kiri_chat_template_init(NULL, 0, &t, &info), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_chat_template_init("x", 1, NULL, &info), KIRI_E_INVALID_ARG);
    kiri_chat_template_free(NULL);
}

/* Deep nesting is refused by the parser, so neither it nor the evaluator can exhaust the stack. */
static void test_nesting(void)
{
    size_t n = 5000;
    char *s = malloc(4 * n + 16);
    size_t k = 0;
    k += (size_t)sprintf(s + k, "{{ ");
    for (size_t i = 0; i < n; i++)
        s[k++] = '(';
    s[k++] = '1';
    for (size_t i = 0; i < n; i++)
        s[k++] = ')';
    k += (size_t)sprintf(s + k, " }}");
    expect_error(s, k, KIRI_E_UNSUPPORTED, "chat_template", "nested too deeply");
    /* a long left-leaning chain makes a deep tree without deep parser recursion */
    k = (size_t)sprintf(s, "{{ 1");
    for (size_t i = 0; i < 1000; i++)
        k += (size_t)sprintf(s + k, "+1");
    k += (size_t)sprintf(s + k, " }}");
    expect_error(s, k, KIRI_E_UNSUPPORTED, "chat_template", "nested too deeply");
    /* nested blocks */
    k = 0;
    for (size_t i = 0; i < 500; i++)
        k += (size_t)sprintf(s + k, "{%% if 1 %%}");
    expect_error(s, k, KIRI_E_UNSUPPORTED, "chat_template", "nested too deeply");
    /* unbalanced brackets beyond the lexer's stack */
    k = (size_t)sprintf(s, "{{ ");
    for (size_t i = 0; i < 1000; i++)
        s[k++] = '[';
    expect_error(s, k, KIRI_E_UNSUPPORTED, "chat_template", "nested too deeply");
    free(s);
    /* a concat or a list of many items is wide, not deep: fine */
    expect_text("{{ 'a' ~ 'b' ~ 'c' ~ 'd' ~ 'e' ~ 'f' ~ 'g' ~ 'h' ~ 'i' ~ 'j' ~ 'k' ~ 'l' }}",
                "abcdefghijkl");
}

/* ---------------------------------------------------------------------------------------------
 * Hostile templates (G36): size cap, sandbox, work caps, fallback
 * ------------------------------------------------------------------------------------------- */

static void test_size_cap(void)
{
    size_t big = (size_t)10 << 20;
    char *s = malloc(big);
    memset(s, 'x', big);
    expect_error(s, big, KIRI_E_INVALID_ARG, "chat_template", "limit is");
    expect_error(s, KIRI_CHAT_TEMPLATE_MAX_SIZE + 1, KIRI_E_INVALID_ARG, "chat_template", "limit is");
    /* exactly at the cap: accepted (plain text renders as itself) */
    struct kiri_status_info info;
    char *out;
    int rc = render_n(s, KIRI_CHAT_TEMPLATE_MAX_SIZE, conv, N_CONV, NULL, &out, &info);
    CHECK_EQ_INT(rc, KIRI_OK);
    if (rc == KIRI_OK) {
        CHECK_EQ_INT(strlen(out), KIRI_CHAT_TEMPLATE_MAX_SIZE);
        kiri_mem_free(out);
    }
    /* a hostile template at the cap (many tiny expressions) still parses within its memory cap */
    size_t k = 0;
    while (k + 5 <= KIRI_CHAT_TEMPLATE_MAX_SIZE) {
        memcpy(s + k, "{{1}}", 5);
        k += 5;
    }
    rc = render_n(s, k, conv, N_CONV, NULL, &out, &info);
    CHECK_EQ_INT(rc, KIRI_OK);
    kiri_mem_free(out);
    free(s);
}

static void test_sandbox(void)
{
    expect_error("{{ messages.__class__ }}", 24, KIRI_E_UNSUPPORTED, "chat_template", "sandbox refuses");
    expect_error("{{ ''.__class__.__mro__ }}", 26, KIRI_E_UNSUPPORTED, "chat_template", "sandbox refuses");
    expect_error("{% set ns = namespace() %}{% set ns._x = 1 %}", 45, KIRI_E_UNSUPPORTED,
                 "chat_template", "sandbox refuses");
    const char *s;
    s = "{{ messages.append(1) }}";
    expect_error(s, strlen(s), KIRI_E_UNSUPPORTED, "chat_template", "sandbox refuses 'append'");
    s = "{% set d = {'a': 1} %}{{ d.update({'b': 2}) }}";
    expect_error(s, strlen(s), KIRI_E_UNSUPPORTED, "chat_template", "sandbox refuses 'update'");
    /* item access with such names only reaches dict keys: nothing leaks */
    expect_text("[{{ ''['__class__'] }}][{{ {'__x': 1}['__x'] }}]", "[][1]");
    s = "{{ range(1000000)|length }}";
    expect_error(s, strlen(s), KIRI_E_UNSUPPORTED, "chat_template", "range too big");
    /* a namespace holding itself cannot recurse forever */
    s = "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}";
    expect_error(s, strlen(s), KIRI_E_UNSUPPORTED, "chat_template", "nested too deeply");
    s = "{% set ns = namespace(l=[]) %}{% for i in range(200) %}{% set ns.l = [ns.l] %}{% endfor %}"
        "{{ ns.l|tojson }}";
    expect_error(s, strlen(s), KIRI_E_UNSUPPORTED, "chat_template", "nested too deeply");
    /* no I/O: such names are simply undefined; the clock only through transformers' strftime_now */
    expect_text("{{ strftime_now is defined }}{{ open is defined }}{{ cycler is defined }}",
                "TrueFalseFalse");
    s = "{{ strftime_now('%Y' * 200) }}";
    expect_error(s, strlen(s), KIRI_E_UNSUPPORTED, "chat_template", "at most 256 bytes");
}

static void test_raise_exception(void)
{
    const char *gemma = "{% if messages[0]['role'] == 'system' %}"
                        "{{ raise_exception('System role not supported') }}{% endif %}ok";
    expect_error(gemma, strlen(gemma), KIRI_E_INVALID_ARG, "raise_exception", NULL);
    struct kiri_status_info info;
    char *out;
    CHECK_EQ_INT(render(gemma, NULL, &out, &info), KIRI_E_INVALID_ARG);
    CHECK_STR(info.message, "System role not supported");
    /* the message is converted with str(); the rest of the template does not run */
    CHECK_EQ_INT(render("before{{ raise_exception('n=' ~ messages|length) }}after", NULL, &out, &info),
                 KIRI_E_INVALID_ARG);
    CHECK_STR(info.message, "n=4");
    CHECK_STR(info.field, "raise_exception");
    CHECK(out == NULL);
}

/* A template that doubles a string each iteration: stopped by the output cap, quickly. */
static void test_output_cap(void)
{
    const char *s = "{% set ns = namespace(s='ab') %}{% for i in range(64) %}"
                    "{% set ns.s = ns.s ~ ns.s %}{{ ns.s }}{% endfor %}";
    double t0 = now();
    expect_error(s, strlen(s), KIRI_E_INVALID_ARG, "max_output", "max_output");
    CHECK(now() - t0 < 2.0);
    struct kiri_chat_limits lim = {1000, 0, 0};
    struct kiri_status_info info;
    char *out;
    CHECK_EQ_INT(render(s, &lim, &out, &info), KIRI_E_INVALID_ARG);
    CHECK_STR(info.field, "max_output");
    lim.max_output = 0;
    /* a huge repetition is refused before it is allocated */
    CHECK_EQ_INT(render("{{ 'x' * 1000000000000 }}", &lim, &out, &info), KIRI_E_INVALID_ARG);
    CHECK_STR(info.field, "max_memory");
    CHECK_EQ_INT(render("{{ ('x' * 10000000)|length }}", &lim, &out, &info), KIRI_OK);
    CHECK_STR(out, "10000000");
    kiri_mem_free(out);
    /* quadratic growth hits the memory cap */
    s = "{% set ns = namespace(l=[]) %}{% for i in range(100000) %}{% set ns.l = ns.l + [i] %}"
        "{% endfor %}{{ ns.l|length }}";
    CHECK_EQ_INT(render(s, NULL, &out, &info), KIRI_E_INVALID_ARG);
    CHECK_STR(info.field, "max_memory");
    /* text captured by a set block counts towards the output cap */
    lim.max_output = 100;
    CHECK_EQ_INT(render("{% set x %}{% for i in range(50) %}abc{% endfor %}{% endset %}", &lim, &out, &info),
                 KIRI_E_INVALID_ARG);
    CHECK_STR(info.field, "max_output");
}

/* Nested loops and loops over long strings: stopped by the step cap within a second. */
static void test_step_cap(void)
{
    const char *s = "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}";
    double t0 = now();
    expect_error(s, strlen(s), KIRI_E_INVALID_ARG, "max_steps", "max_steps");
    CHECK(now() - t0 < 2.0);
    /* without the shared list, each inner range() is new memory: some cap stops it either way */
    s = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
    t0 = now();
    expect_error(s, strlen(s), KIRI_E_INVALID_ARG, NULL, "max_");
    CHECK(now() - t0 < 2.0);
    /* byte work counts too: scanning a 8 MB string 100000 times */
    s = "{% set big = 'x' * 8000000 %}{% for i in range(100000) %}{% if 'y' in big %}{% endif %}{% endfor %}";
    t0 = now();
    expect_error(s, strlen(s), KIRI_E_INVALID_ARG, "max_steps", NULL);
    CHECK(now() - t0 < 2.0);
    struct kiri_chat_limits lim = {0, 0, 20};
    struct kiri_status_info info;
    char *out;
    CHECK_EQ_INT(render(kiri_chat_template_chatml(), &lim, &out, &info), KIRI_E_INVALID_ARG);
    CHECK_STR(info.field, "max_steps");
}

/* The caller's fallback: a refused template, then ChatML. */
static void test_fallback(void)
{
    struct kiri_chat_template *t = NULL;
    struct kiri_status_info info;
    const char *bad = "{% call render(m) %}{{ m.content }}{% endcall %}";
    CHECK_EQ_INT(kiri_chat_template_init(bad, strlen(bad), &t, &info), KIRI_E_UNSUPPORTED);
    const char *ml = kiri_chat_template_chatml();
    CHECK_EQ_INT(kiri_chat_template_init(ml, strlen(ml), &t, &info), KIRI_OK);
    kiri_chat_template_free(t);
}

static void test_bad_arguments(void)
{
    struct kiri_chat_template *t;
    struct kiri_status_info info;
    char *out = NULL;
    size_t len;
    const char *src = "{{ messages[0].content }}";
    CHECK_EQ_INT(kiri_chat_template_init(src, strlen(src), &t, &info), KIRI_OK);
    struct kiri_chat_message bad_utf8[1] = {{"user", "ab\xc3"}};
    CHECK_EQ_INT(kiri_chat_template_render(t, bad_utf8, 1, NULL, NULL, 0, NULL, &out, &len, &info),
                 KIRI_E_INVALID_ARG);
    CHECK(strstr(info.message, "content of message 0") != NULL);
    struct kiri_chat_message no_role[1] = {{NULL, "x"}};
    CHECK_EQ_INT(kiri_chat_template_render(t, no_role, 1, NULL, NULL, 0, NULL, &out, &len, &info),
                 KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_chat_template_render(t, conv, -1, NULL, NULL, 0, NULL, &out, &len, &info),
                 KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_chat_template_render(t, conv, 1, "\xff", NULL, 0, NULL, &out, &len, &info),
                 KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_chat_template_render(t, conv, 1, NULL, NULL, 0, NULL, NULL, &len, &info),
                 KIRI_E_INVALID_ARG);
    CHECK(out == NULL);
    /* evaluation errors name the line and column */
    kiri_chat_template_free(t);
    src = "ok\n  {{ messages[0].content + 1 }}";
    CHECK_EQ_INT(kiri_chat_template_init(src, strlen(src), &t, &info), KIRI_OK);
    CHECK_EQ_INT(kiri_chat_template_render(t, conv, 1, NULL, NULL, 0, NULL, &out, &len, &info),
                 KIRI_E_UNSUPPORTED);
    CHECK(strstr(info.message, "line 2, column") != NULL);
    CHECK(strstr(info.message, "'str' and 'int'") != NULL);
    kiri_chat_template_free(t);
}

/* Every allocation of parsing and rendering a real template fails in turn: NOMEM each time,
 * nothing leaked (the sanitizer build checks), then success. */
static void test_failing_allocator(void)
{
    size_t len;
    char *src = read_file(KIRI_SOURCE_DIR "/tests/data/chat_templates/llama31.jinja", &len);
    CHECK(src != NULL);
    if (!src)
        return;
    char *want = NULL;
    struct kiri_status_info info;
    CHECK_EQ_INT(render_n(src, len, conv, N_CONV, NULL, &want, &info), KIRI_OK);
    int succeeded = 0;
    for (long n = 0; n < 10000 && !succeeded; n++) {
        char *out = NULL;
        kiri_mem_fail_after(n);
        int rc = render_n(src, len, conv, N_CONV, NULL, &out, &info);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK) {
            succeeded = 1;
            CHECK_STR(out, want);
            kiri_mem_free(out);
        } else {
            CHECK_EQ_INT(rc, KIRI_E_NOMEM);
        }
    }
    CHECK(succeeded);
    kiri_mem_free(want);
    free(src);
}

TEST_MAIN(test_chatml, test_variables, test_semantics, test_malformed, test_nesting,
          test_size_cap, test_sandbox, test_raise_exception, test_output_cap, test_step_cap,
          test_fallback, test_bad_arguments, test_failing_allocator)
