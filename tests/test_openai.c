/* Tests for the OpenAI wire format (server/openai.c): a table of bad request bodies (broken
 * JSON, wrong types, values out of range, invalid UTF-8, unknown roles, unsupported features),
 * each with the status and param it must be refused with; good bodies read into the right
 * request values; the response, chunk and error builders
 * checked by parsing their output back against the shapes of the OpenAI API reference
 * (chat.completion, chat.completion.chunk, text_completion, error objects); and a failing-
 * allocator walk over parsing and building.
 *
 * Build: cc -std=c11 -D_GNU_SOURCE -Iinclude -Ibase -Iserver tests/test_openai.c
 *        server/openai.c base/error.c base/mem.c -ljansson -lm
 *        (add -fsanitize=address,undefined for the leak and UB checks)
 */
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiri.h"
#include "mem.h"
#include "openai.h"
#include "responses.h"
#include "tools.h"
#include "test.h"

static const struct kiri_api_limits lim = {4096, 32000, 16};

#define CHAT_OPEN "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]"
#define CHAT(extra) CHAT_OPEN extra "}"
#define CMPL(extra) "{\"model\":\"m\",\"prompt\":\"hi\"" extra "}"
#define MSG1(m) "{\"messages\":[" m "]}"
/* A response's id, created time and model, with a fingerprint. */
#define ENV(id, created, model) (&(const struct kiri_api_envelope){id, created, model, "fp_x"})

/* ---------------------------------------------------------------------------------------------
 * Refused bodies
 * ------------------------------------------------------------------------------------------- */

struct bad_case {
    const char *row;        /* the case's id, printed when it fails */
    int kind;
    const char *body;
    size_t len;             /* 0: strlen(body) */
    const char *param;      /* the param the refusal must name ("" for none) */
    const char *code;       /* the code it must carry, or NULL for "don't care" */
};

#define C KIRI_API_COMPLETIONS
#define H KIRI_API_CHAT
#define T KIRI_API_TOKENIZE
#define D KIRI_API_DETOKENIZE

static const struct bad_case bad_cases[] = {
    /* H01 malformed */
    {"H01", H, "", 0, "", NULL},
    {"H01", H, "{\"messages\":[{\"role\":\"user\"", 0, "messages", NULL},
    {"H01", C, "{\"prompt\":\"a\",}", 0, "", NULL},
    {"H01", C, "{'prompt':'a'}", 0, "", NULL},
    {"H01", C, "\xEF\xBB\xBF{\"prompt\":\"a\"}", 0, "", NULL},
    {"H01", C, "[{\"prompt\":\"a\"}]", 0, "", NULL},
    {"H01", C, "\"prompt\"", 0, "", NULL},
    {"H01", C, "null", 0, "", NULL},
    {"H01", C, "{\"prompt\":\"a\"} {}", 0, "", NULL},
    {"H01", C, "{\"prompt\":\"a\"}\0", 15, "", NULL},
    {"H01", C, "{\"prompt\":\"a\" \"n\":1}", 0, "", NULL},
    /* H03 numbers */
    {"H03", C, CMPL(",\"max_tokens\":1e999"), 0, "max_tokens", NULL},
    {"H03", C, CMPL(",\"temperature\":-1e999"), 0, "temperature", NULL},
    {"H03", C, CMPL(",\"seed\":18446744073709551616"), 0, "seed", NULL},
    {"H03", C, CMPL(",\"seed\":9223372036854775808"), 0, "seed", NULL},
    {"H03", C, CMPL(",\"max_tokens\":-0"), 0, "max_tokens", NULL},
    {"H03", C, CMPL(",\"priority\":-0"), 0, "priority", NULL},
    {"H03", C, CMPL(",\"max_tokens\":1.0"), 0, "max_tokens", NULL},
    {"H03", C, CMPL(",\"n\":2e0"), 0, "n", NULL},
    {"H03", C, CMPL(",\"temperature\":NaN"), 0, "temperature", NULL},
    {"H03", C, CMPL(",\"temperature\":Infinity"), 0, "temperature", NULL},
    {"H03", C, CMPL(",\"top_p\":-Infinity"), 0, "top_p", NULL},
    {"H03", C, CMPL(",\"n\":9223372036854775807"), 0, "n", NULL},
    {"H03", H, MSG1("{\"role\":\"user\",\"content\":\"a\",\"x\":1e400}"), 0, "messages", NULL},
    /* H04 UTF-8, NUL, surrogates */
    {"H04", H, MSG1("{\"role\":\"user\",\"content\":\"a\xFF\"}"), 0, "messages", NULL},
    {"H04", H, MSG1("{\"role\":\"user\",\"content\":\"\xC0\xAF\"}"), 0, "messages", NULL},
    {"H04", H, MSG1("{\"role\":\"user\",\"content\":\"\xE0\x80\xAF\"}"), 0, "messages", NULL},
    {"H04", H, MSG1("{\"role\":\"user\",\"content\":\"\xED\xA0\x80\"}"), 0, "messages", NULL},
    {"H04", H, MSG1("{\"role\":\"user\",\"content\":\"\xF4\x90\x80\x80\"}"), 0, "messages", NULL},
    {"H04", H, MSG1("{\"role\":\"user\",\"content\":\"\\ud800\"}"), 0, "messages", NULL},
    {"H04", H, MSG1("{\"role\":\"user\",\"content\":\"\\udc00x\"}"), 0, "messages", NULL},
    {"H04", H, MSG1("{\"role\":\"user\",\"content\":\"a\\u0000b\"}"), 0, "messages", NULL},
    {"H04", C, "{\"prompt\":\"a\0b\"}", 15, "prompt", NULL},
    {"H04", C, "{\"prompt\":\"a\nb\"}", 0, "prompt", NULL},
    {"H04", T, "{\"content\":\"\xE2\x82\"}", 0, "content", NULL},
    /* H05 wrong types */
    {"H05", H, "{\"messages\":\"hi\"}", 0, "messages", NULL},
    {"H05", H, "{\"messages\":{\"role\":\"user\"}}", 0, "messages", NULL},
    {"H05", H, CHAT(",\"max_tokens\":\"10\""), 0, "max_tokens", NULL},
    {"H05", H, CHAT(",\"temperature\":true"), 0, "temperature", NULL},
    {"H05", H, CHAT(",\"temperature\":\"0.5\""), 0, "temperature", NULL},
    {"H05", H, CHAT(",\"stop\":5"), 0, "stop", NULL},
    {"H05", H, CHAT(",\"stop\":{}"), 0, "stop", NULL},
    {"H05", H, CHAT(",\"stream\":\"yes\""), 0, "stream", NULL},
    {"H05", H, CHAT(",\"stream\":1"), 0, "stream", NULL},
    {"H05", H, CHAT(",\"n\":\"2\""), 0, "n", NULL},
    {"H05", H, CHAT(",\"model\":5"), 0, "model", NULL},
    {"H05", H, CHAT(",\"logprobs\":1"), 0, "logprobs", NULL},
    {"H05", H, CHAT(",\"top_k\":[1]"), 0, "top_k", NULL},
    {"H05", H, CHAT(",\"stream_options\":\"x\""), 0, "stream_options", NULL},
    {"H05", H, CHAT(",\"stream_options\":{\"include_usage\":1}"), 0,
     "stream_options.include_usage", NULL},
    {"H05", C, CMPL(",\"logprobs\":true"), 0, "logprobs", NULL},
    {"H05", C, "{\"prompt\":5}", 0, "prompt", NULL},
    {"H05", C, "{\"prompt\":{\"text\":\"a\"}}", 0, "prompt", NULL},
    {"H05", C, "{\"model\":\"m\"}", 0, "prompt", NULL},
    /* H06 max_tokens */
    {"H06", C, CMPL(",\"max_tokens\":-1"), 0, "max_tokens", NULL},
    {"H06", C, CMPL(",\"max_tokens\":0"), 0, "max_tokens", NULL},
    {"H06", C, CMPL(",\"max_tokens\":2147483648"), 0, "max_tokens", NULL},
    {"H06", C, CMPL(",\"max_tokens\":4097"), 0, "max_tokens", NULL},
    {"H06", H, CHAT(",\"max_completion_tokens\":0"), 0, "max_completion_tokens", NULL},
    {"H06", H, CHAT(",\"max_tokens\":10,\"max_completion_tokens\":5000"), 0,
     "max_completion_tokens", NULL},
    /* H07 n */
    {"H07", H, CHAT(",\"n\":0"), 0, "n", NULL},
    {"H07", H, CHAT(",\"n\":9"), 0, "n", NULL},
    {"H07", H, CHAT(",\"n\":1000"), 0, "n", NULL},
    {"H07", C, CMPL(",\"n\":-1"), 0, "n", NULL},
    /* H08 messages */
    {"H08", H, "{\"messages\":[]}", 0, "messages", NULL},
    {"H08", H, "{\"model\":\"m\"}", 0, "messages", NULL},
    {"H08", H, "{\"messages\":null}", 0, "messages", NULL},
    {"H08", H, MSG1("{\"role\":\"user\"}"), 0, "messages[0].content", NULL},
    {"H08", H, MSG1("{\"role\":\"user\",\"content\":null}"), 0, "messages[0].content", NULL},
    {"H08", H, MSG1("{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"tool\"}"), 0,
     "messages[1].content", NULL},
    {"H08", H, MSG1("\"hello\""), 0, "messages[0]", NULL},
    {"H08", H, MSG1("{\"role\":\"user\",\"content\":\"a\"},[]"), 0, "messages[1]", NULL},
    {"H08", H,
     MSG1("{\"role\":\"user\",\"content\":\"1\"},{\"role\":\"user\",\"content\":\"2\"},"
          "{\"role\":\"user\",\"content\":\"3\"},{\"role\":\"user\",\"content\":\"4\"},"
          "{\"role\":\"user\",\"content\":\"5\"},{\"role\":\"user\",\"content\":\"6\"},"
          "{\"role\":\"user\",\"content\":\"7\"},{\"role\":\"user\",\"content\":\"8\"},"
          "{\"role\":\"user\",\"content\":\"9\"},{\"role\":\"user\",\"content\":\"10\"},"
          "{\"role\":\"user\",\"content\":\"11\"},{\"role\":\"user\",\"content\":\"12\"},"
          "{\"role\":\"user\",\"content\":\"13\"},{\"role\":\"user\",\"content\":\"14\"},"
          "{\"role\":\"user\",\"content\":\"15\"},{\"role\":\"user\",\"content\":\"16\"},"
          "{\"role\":\"user\",\"content\":\"17\"}"),
     0, "messages", NULL},
    /* H09 roles and parts */
    {"H09", H, MSG1("{\"role\":\"wizard\",\"content\":\"a\"}"), 0, "messages[0].role", NULL},
    {"H09", H, MSG1("{\"role\":\"User\",\"content\":\"a\"}"), 0, "messages[0].role", NULL},
    {"H09", H, MSG1("{\"content\":\"a\"}"), 0, "messages[0].role", NULL},
    {"H09", H, MSG1("{\"role\":5,\"content\":\"a\"}"), 0, "messages[0].role", NULL},
    {"H09", H,
     MSG1("{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"a\"},"
          "{\"type\":\"image_url\",\"image_url\":{\"url\":\"http://x/y.png\"}}]}"),
     0, "messages[0].content[1].type", "unsupported_value"},
    {"H09", H, MSG1("{\"role\":\"user\",\"content\":[{\"type\":\"input_audio\"}]}"), 0,
     "messages[0].content[0].type", "unsupported_value"},
    {"H09", H, MSG1("{\"role\":\"user\",\"content\":[{\"text\":\"a\"}]}"), 0,
     "messages[0].content[0].type", NULL},
    {"H09", H, MSG1("{\"role\":\"user\",\"content\":[{\"type\":\"text\"}]}"), 0,
     "messages[0].content[0].text", NULL},
    {"H09", H, MSG1("{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":5}]}"), 0,
     "messages[0].content[0].text", NULL},
    {"H09", H, MSG1("{\"role\":\"user\",\"content\":[\"a\"]}"), 0, "messages[0].content[0]",
     NULL},
    {"H09", H, MSG1("{\"role\":\"user\",\"content\":5}"), 0, "messages[0].content", NULL},
    {"H09", H,
     MSG1("{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"assistant\",\"content\":null,"
          "\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\"}]}"),
     0, "messages[1].tool_calls[0]", NULL},
    {"H09", H,
     MSG1("{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"tool\",\"content\":\"1\","
          "\"tool_call_id\":\"nope\"}"),
     0, "messages[1].tool_call_id", NULL},
    /* H21 sampling ranges */
    {"H21", H, CHAT(",\"temperature\":-0.1"), 0, "temperature", NULL},
    {"H21", H, CHAT(",\"temperature\":2.0001"), 0, "temperature", NULL},
    {"H21", H, CHAT(",\"top_p\":0"), 0, "top_p", NULL},
    {"H21", H, CHAT(",\"top_p\":-0.0"), 0, "top_p", NULL},
    {"H21", H, CHAT(",\"top_p\":1.5"), 0, "top_p", NULL},
    {"H21", H, CHAT(",\"top_p\":1e-300"), 0, "top_p", NULL},    /* 0.0f as a float */
    {"H21", H, CHAT(",\"top_k\":-1"), 0, "top_k", NULL},
    {"H21", H, CHAT(",\"top_k\":2147483648"), 0, "top_k", NULL},
    {"H21", H, CHAT(",\"min_p\":1.5"), 0, "min_p", NULL},
    {"H21", H, CHAT(",\"min_p\":-0.5"), 0, "min_p", NULL},
    {"H21", H, CHAT(",\"presence_penalty\":2.5"), 0, "presence_penalty", NULL},
    {"H21", H, CHAT(",\"frequency_penalty\":-3"), 0, "frequency_penalty", NULL},
    {"H21", H, CHAT(",\"repetition_penalty\":0"), 0, "repetition_penalty", NULL},
    {"H21", H, CHAT(",\"repeat_penalty\":11"), 0, "repeat_penalty", NULL},
    {"H21", H, CHAT(",\"repeat_last_n\":-1"), 0, "repeat_last_n", NULL},
    {"H21", H, CHAT(",\"seed\":-1"), 0, "seed", NULL},
    {"H21", H, CHAT(",\"seed\":1.5"), 0, "seed", NULL},
    {"H21", H, CHAT(",\"logprobs\":true,\"top_logprobs\":21"), 0, "top_logprobs", NULL},
    {"H21", H, CHAT(",\"top_logprobs\":-1"), 0, "top_logprobs", NULL},
    {"H21", H, CHAT(",\"top_logprobs\":5"), 0, "top_logprobs", NULL},
    {"H21", H, CHAT(",\"logprobs\":false,\"top_logprobs\":5"), 0, "top_logprobs", NULL},
    {"H21", H, CHAT(",\"priority\":1001"), 0, "priority", NULL},
    {"H21", C, CMPL(",\"logprobs\":6"), 0, "logprobs", NULL},
    {"H21", C, CMPL(",\"logprobs\":-1"), 0, "logprobs", NULL},
    /* H22 stop */
    {"H22", H, CHAT(",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]"), 0, "stop", NULL},
    {"H22", H, CHAT(",\"stop\":\"\""), 0, "stop", NULL},
    {"H22", H, CHAT(",\"stop\":[\"a\",\"\"]"), 0, "stop", NULL},
    {"H22", H, CHAT(",\"stop\":[\"a\",1]"), 0, "stop", NULL},
    {"H22", H, CHAT(",\"stop\":[null]"), 0, "stop", NULL},
    /* H23 logit_bias */
    {"H23", H, CHAT(",\"logit_bias\":{\"32000\":1}"), 0, "logit_bias", NULL},
    {"H23", H, CHAT(",\"logit_bias\":{\"-1\":1}"), 0, "logit_bias", NULL},
    {"H23", H, CHAT(",\"logit_bias\":{\"abc\":1}"), 0, "logit_bias", NULL},
    {"H23", H, CHAT(",\"logit_bias\":{\"\":1}"), 0, "logit_bias", NULL},
    {"H23", H, CHAT(",\"logit_bias\":{\"99999999999\":1}"), 0, "logit_bias", NULL},
    {"H23", H, CHAT(",\"logit_bias\":{\"5\":101}"), 0, "logit_bias", NULL},
    {"H23", H, CHAT(",\"logit_bias\":{\"5\":\"x\"}"), 0, "logit_bias", NULL},
    {"H23", H, CHAT(",\"logit_bias\":{\"5\":NaN}"), 0, "logit_bias", NULL},
    {"H23", H, CHAT(",\"logit_bias\":[1]"), 0, "logit_bias", NULL},
    {"H23", H, CHAT(",\"logit_bias\":{\"5\":-100.5}"), 0, "logit_bias", NULL},
    {"H23", C, CMPL(",\"logit_bias\":{\"5\":true}"), 0, "logit_bias", NULL},
    /* H24 token ids */
    {"H24", C, "{\"prompt\":[1,32000]}", 0, "prompt", NULL},
    {"H24", C, "{\"prompt\":[-1]}", 0, "prompt", NULL},
    {"H24", C, "{\"prompt\":[1,1.5]}", 0, "prompt", NULL},
    {"H24", C, "{\"prompt\":[1,\"a\"]}", 0, "prompt", NULL},
    {"H24", C, "{\"prompt\":[1,2147483648]}", 0, "prompt", NULL},
    {"H24", C, "{\"prompt\":[]}", 0, "prompt", NULL},
    {"H24", C, "{\"prompt\":[[1,99999]]}", 0, "prompt[0]", NULL},
    {"H24", C, "{\"prompt\":[[1],[]]}", 0, "prompt[1]", NULL},
    {"H24", C, "{\"prompt\":[\"a\",5]}", 0, "prompt[1]", NULL},
    {"H24", C, "{\"prompt\":[\"a\",{}]}", 0, "prompt[1]", NULL},
    {"H24", C, "{\"prompt\":[[\"a\"]]}", 0, "prompt[0]", NULL},
    {"H24", C, "{\"prompt\":[\"a\",\"b\",\"c\",\"d\",\"e\"],\"n\":8}", 0, "n", NULL},
    {"echo", C, CMPL(",\"echo\":\"yes\""), 0, "echo", NULL},
    {"H24", D, "{\"tokens\":[0,32000]}", 0, "tokens", NULL},
    {"H24", D, "{\"tokens\":\"1 2\"}", 0, "tokens", NULL},
    {"H24", D, "{}", 0, "tokens", NULL},
    /* H26: a duplicate's last value is the one validated */
    {"H26", C, CMPL(",\"max_tokens\":5,\"max_tokens\":0"), 0, "max_tokens", NULL},
    /* H27 response_format */
    {"H27", H, CHAT(",\"response_format\":{\"type\":\"json_schema\"}"), 0,
     "response_format.json_schema", NULL},
    {"H27", H, CHAT(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\"}}"), 0,
     "response_format.json_schema.schema", NULL},
    {"H27", H,
     CHAT(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\","
          "\"schema\":\"{}\"}}"),
     0, "response_format.json_schema.schema", NULL},
    {"H27", H, CHAT(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"a b\",\"schema\":{}}}"),
     0, "response_format.json_schema.name", NULL},
    {"H27", H,
     CHAT(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{},\"strict\":\"yes\"}}"), 0,
     "response_format.json_schema.strict", NULL},
    {"H27", H, CHAT(",\"response_format\":{\"type\":\"json_object\",\"schema\":5}"), 0, "response_format.schema",
     NULL},
    /* what the schema compiler cannot honour is named by its JSON pointer, never relaxed */
    {"H27", H,
     CHAT(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"x\",\"schema\":"
          "{\"type\":\"object\",\"properties\":{\"x\":{\"not\":{\"type\":\"string\"}}}}}}"),
     0, "response_format.json_schema.schema/properties/x", "unsupported_schema"},
    {"H27", C, CMPL(",\"json_schema\":{\"type\":\"object\",\"properties\":{\"x\":{\"not\":{}}}}"), 0,
     "json_schema/properties/x", "unsupported_schema"},
    {"H27", C, CMPL(",\"json_schema\":\"{}\""), 0, "json_schema", NULL},
    /* grammars */
    {"H27", C, CMPL(",\"grammar\":5"), 0, "grammar", NULL},
    {"H27", C, CMPL(",\"grammar\":\"\""), 0, "grammar", NULL},
    {"H27", C, CMPL(",\"grammar\":\"start ::= \\\"x\\\"\""), 0, "grammar", "invalid_grammar"},
    /* one constraint per request */
    {"H27", H, CHAT(",\"response_format\":{\"type\":\"json_object\"},\"grammar\":\"root ::= \\\"x\\\"\""), 0,
     "grammar", "conflicting_parameters"},
    {"H27", C, CMPL(",\"grammar\":\"root ::= \\\"x\\\"\",\"json_schema\":{}"), 0, "json_schema",
     "conflicting_parameters"},
    {"H27", H, CHAT(",\"response_format\":{\"type\":\"xml\"}"), 0, "response_format", NULL},
    {"H27", H, CHAT(",\"response_format\":\"json\""), 0, "response_format", NULL},
    {"H27", H, CHAT(",\"response_format\":{}"), 0, "response_format", NULL},
    /* unsupported features */
    {"tools", H, CHAT(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f g\"}}]"), 0,
     "tools[0].function.name", NULL},
    {"tools", H, CHAT(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}],"
                      "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"g\"}}"), 0,
     "tool_choice", NULL},
    {"tools", C, CMPL(",\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]"), 0,
     "tools", "unsupported_parameter"},
    {"tools", H, CHAT(",\"tools\":{}"), 0, "tools", NULL},
    {"tools", H, CHAT(",\"functions\":[{\"name\":\"f\"}]"), 0, "functions", NULL},
    {"echo", C, CMPL(",\"echo\":1"), 0, "echo", NULL},
    {"best_of", C, CMPL(",\"best_of\":2"), 0, "best_of", NULL},
    {"suffix", C, CMPL(",\"suffix\":\"x\""), 0, "suffix", NULL},
    /* tokenize */
    {"tok", T, "{}", 0, "content", NULL},
    {"tok", T, "{\"content\":5}", 0, "content", NULL},
    {"tok", T, "{\"content\":\"a\",\"add_special\":\"yes\"}", 0, "add_special", NULL},
    {"tok", T, "{\"content\":\"a\",\"parse_special\":0}", 0, "parse_special", NULL},
};

static void check_refused(const char *row, int kind, const char *body, size_t len,
                          const char *param, const char *code)
{
    struct kiri_api_request r;
    struct kiri_api_error e;
    memset(&e, 0, sizeof e);
    int before = test_failures;
    int rc = kiri_api_parse(body, len, kind, &lim, &r, &e);
    CHECK_EQ_INT(rc, KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(e.status, 400);
    CHECK_STR(e.type, "invalid_request_error");
    CHECK_STR(e.param, param);
    if (code)
        CHECK_STR(e.code, code);
    CHECK(e.message[0] != '\0');
    /* *out is left empty. */
    CHECK(r.model == NULL && r.prompts == NULL && r.messages == NULL && r.n_stop == 0 && r.grammar == NULL &&
          r.bias_tokens == NULL);
    if (rc == KIRI_OK)
        kiri_api_request_free(&r);
    if (test_failures != before)
        fprintf(stderr, "  in case %s kind %d: %.120s -> [%s] %s\n", row, kind, body, e.param,
                e.message);
}

static void test_bad_table(void)
{
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const struct bad_case *c = &bad_cases[i];
        check_refused(c->row, c->kind, c->body, c->len ? c->len : strlen(c->body), c->param,
                      c->code);
    }
}

/* A body built at run time: prefix, `count` copies of `unit`, suffix. Owned by the caller. */
static char *repeat(const char *prefix, const char *unit, size_t count, const char *suffix,
                    size_t *len)
{
    size_t np = strlen(prefix), nu = strlen(unit), ns = strlen(suffix);
    char *b = malloc(np + nu * count + ns + 1);
    memcpy(b, prefix, np);
    for (size_t i = 0; i < count; i++)
        memcpy(b + np + i * nu, unit, nu);
    memcpy(b + np + nu * count, suffix, ns + 1);
    *len = np + nu * count + ns;
    return b;
}

/* H02: deep nesting is refused at 64 levels by the byte scan (no recursion), 64 itself passes. */
static void test_depth(void)
{
    size_t len;
    char *b = repeat("", "[", 100000, "", &len);
    check_refused("H02", KIRI_API_CHAT, b, len, "", NULL);
    free(b);
    b = repeat("{\"messages\":", "{\"a\":", 100000, "", &len);
    check_refused("H02", KIRI_API_CHAT, b, len, "messages", NULL);
    free(b);
    b = repeat("{\"prompt\":\"a\",\"x\":", "[", 64, "", &len);   /* 65 with the body's { */
    check_refused("H02", KIRI_API_COMPLETIONS, b, len, "x", NULL);
    free(b);

    char tail[200] = "";
    for (int i = 0; i < 63; i++)
        strcat(tail, "]");
    strcat(tail, "}");
    b = repeat("{\"prompt\":\"a\",\"x\":", "[", 63, tail, &len);    /* exactly 64 */
    struct kiri_api_request r;
    struct kiri_api_error e;
    CHECK_EQ_INT(kiri_api_parse(b, len, KIRI_API_COMPLETIONS, &lim, &r, &e), KIRI_OK);
    kiri_api_request_free(&r);
    free(b);
    /* Brackets inside strings do not count. */
    b = repeat("{\"prompt\":\"", "[{", 1000, "\"}", &len);
    CHECK_EQ_INT(kiri_api_parse(b, len, KIRI_API_COMPLETIONS, &lim, &r, &e), KIRI_OK);
    CHECK_EQ_INT(strlen(r.prompts[0].text), 2000);
    kiri_api_request_free(&r);
    free(b);
}

/* H22 and H23 cases too large for the table. */
static void test_big_bodies(void)
{
    size_t len;
    char *b = repeat(CHAT_OPEN ",\"stop\":\"", "x", 257, "\"}", &len);
    check_refused("H22", KIRI_API_CHAT, b, len, "stop", NULL);
    free(b);
    b = repeat(CHAT_OPEN ",\"stop\":[\"a\",\"", "y", 1 << 20, "\"]}", &len);
    check_refused("H22", KIRI_API_CHAT, b, len, "stop", NULL);
    free(b);
    /* 256 bytes is the largest stop string accepted. */
    b = repeat(CHAT_OPEN ",\"stop\":\"", "x", 256, "\"}", &len);
    struct kiri_api_request r;
    struct kiri_api_error e;
    CHECK_EQ_INT(kiri_api_parse(b, len, KIRI_API_CHAT, &lim, &r, &e), KIRI_OK);
    CHECK_EQ_INT(r.n_stop, 1);
    CHECK_EQ_INT(strlen(r.stop[0]), 256);
    kiri_api_request_free(&r);
    free(b);

    /* 1025 distinct logit_bias entries: over the cap before any is looked at. */
    size_t cap = 1025 * 16 + 256, o;
    b = malloc(cap);
    o = (size_t)snprintf(b, cap, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                                 "\"logit_bias\":{");
    for (int i = 0; i < 1025; i++)
        o += (size_t)snprintf(b + o, cap - o, "%s\"%d\":1", i ? "," : "", i);
    o += (size_t)snprintf(b + o, cap - o, "}}");
    check_refused("H23", KIRI_API_CHAT, b, o, "logit_bias", NULL);
    free(b);
}

/* ---------------------------------------------------------------------------------------------
 * Accepted bodies
 * ------------------------------------------------------------------------------------------- */

static int parse_ok(int kind, const char *body, struct kiri_api_request *r)
{
    struct kiri_api_error e;
    int rc = kiri_api_parse(body, strlen(body), kind, &lim, r, &e);
    if (rc != KIRI_OK)
        fprintf(stderr, "  unexpected refusal of %.120s: [%s] %s\n", body, e.param, e.message);
    return rc;
}

/* tools, tool_choice, parallel_tool_calls and a conversation with a call and its result: the
 * template's messages carry the call with its arguments parsed to an object. */
static void test_chat_tools(void)
{
    const char *body =
        "{\"messages\":[{\"role\":\"user\",\"content\":\"w?\"},"
        "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
        "\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\"}}]},"
        "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"content\":\"sunny\"}],"
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"strict\":true,"
        "\"parameters\":{\"type\":\"object\"}}}],"
        "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"get_weather\"}},"
        "\"parallel_tool_calls\":false}";
    struct kiri_api_request r;
    if (parse_ok(KIRI_API_CHAT, body, &r) != KIRI_OK) {
        CHECK(0);
        return;
    }
    CHECK_STR(r.tools, "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                       "\"parameters\":{\"type\":\"object\"}}}]");
    CHECK_STR(r.messages_json,
              "[{\"role\":\"user\",\"content\":\"w?\"},{\"role\":\"assistant\",\"content\":\"\","
              "\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
              "\"arguments\":{\"city\":\"Paris\"}}}]},{\"role\":\"tool\",\"content\":\"sunny\","
              "\"tool_call_id\":\"call_1\"}]");
    CHECK_EQ_INT(r.tool_choice, KIRI_TOOL_CHOICE_NAMED);
    CHECK_STR(r.tool_choice_name, "get_weather");
    CHECK_EQ_INT(r.parallel_tool_calls, 0);
    kiri_api_request_free(&r);
}

static void test_chat_full(void)
{
    const char *body =
        "{\"model\":\"tiny\",\"messages\":["
        "{\"role\":\"developer\",\"content\":\"Be brief.\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hello, \"},"
        "{\"type\":\"text\",\"text\":\"w\\u00f6rld \\ud83d\\ude00\"}]},"
        "{\"role\":\"assistant\",\"content\":null},"
        "{\"role\":\"tool\",\"content\":\"42\"},"
        "{\"role\":\"user\",\"content\":\"\\\"q\\\"\\n\",\"name\":\"bob\"}],"
        "\"max_completion_tokens\":128,\"temperature\":0.25,\"top_p\":0.9,\"top_k\":40,"
        "\"min_p\":0.05,\"presence_penalty\":-0.5,\"frequency_penalty\":1,"
        "\"repetition_penalty\":1.1,\"repeat_last_n\":128,\"seed\":9223372036854775807,\"n\":8,"
        "\"stop\":[\"\\n\\n\",\"END\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"logprobs\":true,\"top_logprobs\":20,\"priority\":-1000,\"user\":\"u\","
        "\"logit_bias\":{},\"tools\":[],\"response_format\":{\"type\":\"text\"},"
        "\"unknown\":{\"nested\":[1,2,{\"x\":null}]}}";
    struct kiri_api_request r;
    if (parse_ok(KIRI_API_CHAT, body, &r) != KIRI_OK) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(r.kind, KIRI_API_CHAT);
    CHECK_STR(r.model, "tiny");
    CHECK_EQ_INT(r.n_messages, 5);
    CHECK_STR(r.messages[0].role, "system");
    CHECK_STR(r.messages[0].content, "Be brief.");
    CHECK_STR(r.messages[1].role, "user");
    CHECK_STR(r.messages[1].content, "Hello, w\xC3\xB6rld \xF0\x9F\x98\x80");
    CHECK_STR(r.messages[2].role, "assistant");
    CHECK_STR(r.messages[2].content, "");
    CHECK_STR(r.messages[3].role, "tool");
    CHECK_STR(r.messages[3].content, "42");
    CHECK_STR(r.messages[4].content, "\"q\"\n");
    CHECK_EQ_INT(r.max_tokens, 128);
    CHECK_NEAR(r.sampling.temperature, 0.25, 0);
    CHECK_NEAR(r.sampling.top_p, 0.9f, 0);
    CHECK_EQ_INT(r.sampling.top_k, 40);
    CHECK_NEAR(r.sampling.min_p, 0.05f, 0);
    CHECK_NEAR(r.sampling.presence_penalty, -0.5, 0);
    CHECK_NEAR(r.sampling.frequency_penalty, 1.0, 0);
    CHECK_NEAR(r.sampling.repeat_penalty, 1.1f, 0);
    CHECK_EQ_INT(r.sampling.repeat_last_n, 128);
    CHECK(r.sampling.seed == UINT64_C(9223372036854775807));
    CHECK_EQ_INT(r.has_seed, 1);
    CHECK_EQ_INT(r.n, 8);
    CHECK_EQ_INT(r.n_stop, 2);
    CHECK_STR(r.stop[0], "\n\n");
    CHECK_STR(r.stop[1], "END");
    CHECK_EQ_INT(r.stream, 1);
    CHECK_EQ_INT(r.include_usage, 1);
    CHECK_EQ_INT(r.logprobs, 1);
    CHECK_EQ_INT(r.top_logprobs, 20);
    CHECK_EQ_INT(r.priority, -1000);
    CHECK(r.prompts == NULL && r.n_prompts == 0);
    kiri_api_request_free(&r);
    CHECK(r.messages == NULL && r.n_messages == 0);
    kiri_api_request_free(&r);    /* twice is harmless */
}

/* OpenAI's defaults when the fields are absent or null. */
static void test_defaults(void)
{
    struct kiri_api_request r;
    if (parse_ok(KIRI_API_CHAT,
                 MSG1("{\"role\":\"user\",\"content\":\"a\"}"), &r) != KIRI_OK) {
        CHECK(0);
        return;
    }
    CHECK(r.model == NULL);
    CHECK_EQ_INT(r.max_tokens, -1);
    CHECK_NEAR(r.sampling.temperature, 1.0, 0);
    CHECK_NEAR(r.sampling.top_p, 1.0, 0);
    CHECK_EQ_INT(r.sampling.top_k, 0);
    CHECK_NEAR(r.sampling.min_p, 0.0, 0);
    CHECK_NEAR(r.sampling.repeat_penalty, 1.0, 0);
    CHECK_NEAR(r.sampling.presence_penalty, 0.0, 0);
    CHECK_NEAR(r.sampling.frequency_penalty, 0.0, 0);
    CHECK_EQ_INT(r.has_seed, 0);
    CHECK_EQ_INT(r.n, 1);
    CHECK_EQ_INT(r.n_stop, 0);
    CHECK_EQ_INT(r.stream, 0);
    CHECK_EQ_INT(r.include_usage, 0);
    CHECK_EQ_INT(r.logprobs, 0);
    CHECK_EQ_INT(r.top_logprobs, 0);
    CHECK_EQ_INT(r.priority, 0);
    kiri_api_request_free(&r);

    /* null is absent */
    if (parse_ok(KIRI_API_CHAT,
                 CHAT(",\"temperature\":null,\"max_tokens\":null,\"stop\":null,\"seed\":null,"
                      "\"n\":null,\"logit_bias\":null,\"tools\":null,\"stream_options\":null"),
                 &r) == KIRI_OK) {
        CHECK_NEAR(r.sampling.temperature, 1.0, 0);
        CHECK_EQ_INT(r.max_tokens, -1);
        CHECK_EQ_INT(r.has_seed, 0);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
}

struct good_case {
    int kind;
    const char *body;
    int32_t max_tokens;
    float temperature;
    int n_stop;
    int logprobs, top_logprobs;
};

static const struct good_case good_cases[] = {
    /* H03: -0.0 is a real zero; 1e-999 underflows to 0 */
    {H, CHAT(",\"temperature\":-0.0"), -1, 0.0f, 0, 0, 0},
    {H, CHAT(",\"temperature\":1e-999"), -1, 0.0f, 0, 0, 0},
    {H, CHAT(",\"temperature\":2"), -1, 2.0f, 0, 0, 0},
    {H, CHAT(",\"temperature\":0"), -1, 0.0f, 0, 0, 0},
    /* H06 bounds */
    {C, CMPL(",\"max_tokens\":1"), 1, 1.0f, 0, 0, 0},
    {C, CMPL(",\"max_tokens\":4096"), 4096, 1.0f, 0, 0, 0},
    {H, CHAT(",\"max_tokens\":10,\"max_completion_tokens\":20"), 20, 1.0f, 0, 0, 0},
    /* H26 duplicates: the last wins */
    {C, CMPL(",\"max_tokens\":0,\"max_tokens\":7"), 7, 1.0f, 0, 0, 0},
    {H, CHAT(",\"temperature\":5,\"temperature\":0.5"), -1, 0.5f, 0, 0, 0},
    /* stop forms */
    {H, CHAT(",\"stop\":\"x\""), -1, 1.0f, 1, 0, 0},
    {H, CHAT(",\"stop\":[]"), -1, 1.0f, 0, 0, 0},
    {H, CHAT(",\"stop\":[\"a\",\"b\",\"c\",\"d\"]"), -1, 1.0f, 4, 0, 0},
    /* logprobs */
    {H, CHAT(",\"logprobs\":true"), -1, 1.0f, 0, 1, 0},
    {H, CHAT(",\"logprobs\":false,\"top_logprobs\":0"), -1, 1.0f, 0, 0, 0},
    {C, CMPL(",\"logprobs\":0"), -1, 1.0f, 0, 1, 0},
    {C, CMPL(",\"logprobs\":5"), -1, 1.0f, 0, 1, 5},
    {C, CMPL(",\"logprobs\":null"), -1, 1.0f, 0, 0, 0},
    /* other accepted forms */
    {C, CMPL(",\"echo\":false,\"best_of\":1,\"suffix\":\"\""), -1, 1.0f, 0, 0, 0},
    {H, CHAT(",\"response_format\":{\"type\":\"text\"},\"tool_choice\":\"none\""), -1, 1.0f, 0,
     0, 0},
    {C, CMPL(",\"echo\":true,\"logit_bias\":{\"0\":-100,\"31999\":100}"), -1, 1.0f, 0, 0, 0},
};

static void test_good_table(void)
{
    for (size_t i = 0; i < sizeof good_cases / sizeof good_cases[0]; i++) {
        const struct good_case *c = &good_cases[i];
        struct kiri_api_request r;
        int before = test_failures;
        if (parse_ok(c->kind, c->body, &r) != KIRI_OK) {
            CHECK(0);
            continue;
        }
        CHECK_EQ_INT(r.max_tokens, c->max_tokens);
        CHECK_NEAR(r.sampling.temperature, c->temperature, 0);
        CHECK_EQ_INT(r.n_stop, c->n_stop);
        CHECK_EQ_INT(r.logprobs, c->logprobs);
        CHECK_EQ_INT(r.top_logprobs, c->top_logprobs);
        kiri_api_request_free(&r);
        if (test_failures != before)
            fprintf(stderr, "  in good case %zu: %s\n", i, c->body);
    }
}

static void test_prompts(void)
{
    struct kiri_api_request r;
    if (parse_ok(KIRI_API_COMPLETIONS, "{\"prompt\":[0,1,31999]}", &r) == KIRI_OK) {
        CHECK_EQ_INT(r.n_prompts, 1);
        CHECK(r.prompts[0].text == NULL);
        CHECK_EQ_INT(r.prompts[0].n_tokens, 3);
        CHECK_EQ_INT(r.prompts[0].tokens[0], 0);
        CHECK_EQ_INT(r.prompts[0].tokens[2], 31999);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    /* One prompt wrapped in an array (LangChain's form) is that prompt. */
    if (parse_ok(KIRI_API_COMPLETIONS, "{\"prompt\":[\"Once upon\"]}", &r) == KIRI_OK) {
        CHECK_EQ_INT(r.n_prompts, 1);
        CHECK_STR(r.prompts[0].text, "Once upon");
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (parse_ok(KIRI_API_COMPLETIONS, "{\"prompt\":[[5,6]]}", &r) == KIRI_OK) {
        CHECK_EQ_INT(r.prompts[0].n_tokens, 2);
        CHECK_EQ_INT(r.prompts[0].tokens[1], 6);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (parse_ok(KIRI_API_COMPLETIONS, "{\"prompt\":\"\",\"messages\":5}", &r) == KIRI_OK) {
        CHECK_STR(r.prompts[0].text, "");    /* messages is not a completions field: ignored */
        CHECK(r.messages == NULL);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    /* Lists of prompts: strings, token-id arrays, or both; echo. */
    if (parse_ok(KIRI_API_COMPLETIONS, "{\"prompt\":[\"a\",[7,8,9],\"b\"],\"n\":2,\"echo\":true}", &r) == KIRI_OK) {
        CHECK_EQ_INT(r.n_prompts, 3);
        CHECK_STR(r.prompts[0].text, "a");
        CHECK_EQ_INT(r.prompts[1].n_tokens, 3);
        CHECK_EQ_INT(r.prompts[1].tokens[2], 9);
        CHECK_STR(r.prompts[2].text, "b");
        CHECK_EQ_INT(r.n, 2);
        CHECK_EQ_INT(r.echo, 1);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
}

static void test_tokenize(void)
{
    struct kiri_api_request r;
    if (parse_ok(KIRI_API_TOKENIZE, "{\"content\":\"a<s>b\"}", &r) == KIRI_OK) {
        CHECK_STR(r.content, "a<s>b");
        CHECK_EQ_INT(r.add_special, 1);
        CHECK_EQ_INT(r.parse_special, 0);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (parse_ok(KIRI_API_TOKENIZE,
                 "{\"content\":\"\",\"add_special\":false,\"parse_special\":true,"
                 "\"max_tokens\":\"ignored\"}",
                 &r) == KIRI_OK) {
        CHECK_STR(r.content, "");
        CHECK_EQ_INT(r.add_special, 0);
        CHECK_EQ_INT(r.parse_special, 1);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (parse_ok(KIRI_API_DETOKENIZE, "{\"tokens\":[1,2,31999]}", &r) == KIRI_OK) {
        CHECK_EQ_INT(r.n_tokens, 3);
        CHECK_EQ_INT(r.tokens[2], 31999);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (parse_ok(KIRI_API_DETOKENIZE, "{\"tokens\":[]}", &r) == KIRI_OK) {
        CHECK_EQ_INT(r.n_tokens, 0);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
}

static void test_bad_arguments(void)
{
    struct kiri_api_request r;
    struct kiri_api_error e;
    CHECK_EQ_INT(kiri_api_parse("{}", 2, KIRI_API_CHAT, NULL, &r, &e), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_api_parse(NULL, 5, KIRI_API_CHAT, &lim, &r, &e), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(kiri_api_parse("{}", 2, 99, &lim, &r, &e), KIRI_E_INVALID_ARG);
    CHECK_EQ_INT(e.status, 400);
    CHECK_EQ_INT(kiri_api_parse("{\"prompt\":\"a\"}", 14, KIRI_API_COMPLETIONS, &lim, &r, NULL),
                 KIRI_OK);
    kiri_api_request_free(&r);
}

/* ---------------------------------------------------------------------------------------------
 * Builders
 * ------------------------------------------------------------------------------------------- */

/* Parses a builder's output (which it frees) and returns the value, or NULL. */
static json_t *reparse(char *s)
{
    CHECK(s != NULL);
    if (!s)
        return NULL;
    CHECK(strchr(s, '\n') == NULL);   /* one SSE data line */
    json_error_t je;
    json_t *j = json_loads(s, 0, &je);
    if (!j)
        fprintf(stderr, "  builder output does not parse (%s): %s\n", je.text, s);
    CHECK(j != NULL);
    kiri_mem_free(s);
    return j;
}

static const char *jget_str(json_t *o, const char *path)
{
    json_t *v = json_object_get(o, path);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static void test_error_json(void)
{
    struct kiri_api_error e;
    kiri_api_error_set(&e, 400, "invalid_request_error", "temperature", NULL,
                       "temperature must be in [%d, %d], got %s", 0, 2, "\"3\"");
    CHECK_EQ_INT(e.status, 400);
    json_t *j = reparse(kiri_api_error_json(&e));
    json_t *err = json_object_get(j, "error");
    CHECK(json_is_object(err));
    CHECK_STR(jget_str(err, "message"), "temperature must be in [0, 2], got \"3\"");
    CHECK_STR(jget_str(err, "type"), "invalid_request_error");
    CHECK_STR(jget_str(err, "param"), "temperature");
    CHECK(json_is_null(json_object_get(err, "code")));
    CHECK_EQ_INT(json_object_size(j), 1);
    json_decref(j);

    /* Empty param is null; a message cut inside a character is still valid JSON. */
    char msg[400];
    memset(msg, 0, sizeof msg);
    for (int i = 0; i < 150; i++)
        strcat(msg, "\xC3\xA9");
    kiri_api_error_set(&e, 404, "invalid_request_error", NULL, "model_not_found", "%s", msg);
    j = reparse(kiri_api_error_json(&e));
    err = json_object_get(j, "error");
    CHECK(json_is_null(json_object_get(err, "param")));
    CHECK_STR(jget_str(err, "code"), "model_not_found");
    CHECK(jget_str(err, "message") != NULL);
    json_decref(j);

    /* A parse error's message quotes the body's bytes; its JSON must still be valid. */
    struct kiri_api_request r;
    const char *body = "{\"a\":\xFF\xFE}";
    CHECK_EQ_INT(kiri_api_parse(body, strlen(body), KIRI_API_CHAT, &lim, &r, &e),
                 KIRI_E_INVALID_ARG);
    json_decref(reparse(kiri_api_error_json(&e)));
}

static void test_chat_response(void)
{
    struct kiri_api_choice ch[2];
    memset(ch, 0, sizeof ch);
    ch[0].index = 0;
    ch[0].text = "Hi \"there\"\n\t\x01 \xE2\x9C\x93";
    ch[0].text_len = strlen(ch[0].text);
    ch[0].finish_reason = "stop";
    ch[1].index = 1;
    ch[1].text = "Bye";
    ch[1].text_len = 3;
    ch[1].finish_reason = "length";
    struct kiri_api_usage u = {12, 7, 8};
    json_t *j = reparse(kiri_api_response_json(KIRI_API_CHAT, ENV("chatcmpl-abc", 1700000000, "tiny"), ch, 2, &u));
    CHECK_STR(jget_str(j, "id"), "chatcmpl-abc");
    CHECK_STR(jget_str(j, "object"), "chat.completion");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "created")), 1700000000);
    CHECK_STR(jget_str(j, "model"), "tiny");
    json_t *choices = json_object_get(j, "choices");
    CHECK_EQ_INT(json_array_size(choices), 2);
    json_t *c0 = json_array_get(choices, 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(c0, "index")), 0);
    json_t *msg = json_object_get(c0, "message");
    CHECK_STR(jget_str(msg, "role"), "assistant");
    CHECK_STR(jget_str(msg, "content"), ch[0].text);
    CHECK_STR(jget_str(c0, "finish_reason"), "stop");
    CHECK(json_is_null(json_object_get(c0, "logprobs")));
    CHECK_STR(jget_str(json_array_get(choices, 1), "finish_reason"), "length");
    json_t *usage = json_object_get(j, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(usage, "prompt_tokens")), 12);
    CHECK_EQ_INT(json_integer_value(json_object_get(usage, "completion_tokens")), 7);
    CHECK_EQ_INT(json_integer_value(json_object_get(usage, "total_tokens")), 19);
    CHECK_EQ_INT(json_integer_value(
                     json_object_get(json_object_get(usage, "prompt_tokens_details"),
                                     "cached_tokens")),
                 8);
    json_decref(j);
    CHECK(kiri_api_response_json(KIRI_API_TOKENIZE, ENV("x", 0, "m"), ch, 1, NULL) == NULL);
}

/* Token texts and values shared by the logprob tests: token 1 is half of a UTF-8 character. */
static const char *const lp_tokens[2] = {"He", "\xE2\x9C"};
static const size_t lp_lens[2] = {2, 2};
static const float lp_values[2] = {-0.1f, -2.5f};
static const char *const top_tokens[4] = {"He", "Hi", "\xE2\x9C", "\xE2\x9C"};
static const size_t top_lens[4] = {2, 2, 2, 2};
static float top_values[4] = {-0.1f, -2.0f, -2.5f, -3.0f};

static void fill_lp(struct kiri_api_choice *c)
{
    memset(c, 0, sizeof *c);
    c->text = "He\xE2\x9C";
    c->text_len = 4;
    c->finish_reason = "length";
    c->n_logprobs = 2;
    c->lp_tokens = lp_tokens;
    c->lp_token_lens = lp_lens;
    c->lp_values = lp_values;
    c->n_top = 2;
    c->top_tokens = top_tokens;
    c->top_token_lens = top_lens;
    c->top_values = top_values;
}

static void test_chat_logprobs(void)
{
    struct kiri_api_choice c;
    fill_lp(&c);
    top_values[3] = -1.0f / 0.0f;
    char *s = kiri_api_response_json(KIRI_API_CHAT, ENV("chatcmpl-1", 1, "m"), &c, 1, NULL);
    CHECK(s && strstr(s, "\"logprob\":-0.1,") != NULL);    /* the shortest form of -0.1f */
    json_t *j = reparse(s);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_STR(jget_str(json_object_get(c0, "message"), "content"), "He\xEF\xBF\xBD\xEF\xBF\xBD");
    CHECK(json_object_get(j, "usage") == NULL);
    json_t *content = json_object_get(json_object_get(c0, "logprobs"), "content");
    CHECK_EQ_INT(json_array_size(content), 2);
    json_t *t0 = json_array_get(content, 0), *t1 = json_array_get(content, 1);
    CHECK_STR(jget_str(t0, "token"), "He");
    CHECK_NEAR(json_real_value(json_object_get(t0, "logprob")), -0.1, 1e-12);
    json_t *bytes = json_object_get(t0, "bytes");
    CHECK_EQ_INT(json_array_size(bytes), 2);
    CHECK_EQ_INT(json_integer_value(json_array_get(bytes, 0)), 'H');
    json_t *top = json_object_get(t0, "top_logprobs");
    CHECK_EQ_INT(json_array_size(top), 2);
    CHECK_STR(jget_str(json_array_get(top, 1), "token"), "Hi");
    CHECK_NEAR(json_real_value(json_object_get(json_array_get(top, 1), "logprob")), -2.0, 0);
    CHECK(json_object_get(json_array_get(top, 1), "bytes") != NULL);
    CHECK(json_object_get(json_array_get(top, 1), "top_logprobs") == NULL);
    /* The partial character: repaired text, exact bytes. */
    CHECK_STR(jget_str(t1, "token"), "\xEF\xBF\xBD\xEF\xBF\xBD");
    bytes = json_object_get(t1, "bytes");
    CHECK_EQ_INT(json_integer_value(json_array_get(bytes, 0)), 0xE2);
    CHECK_EQ_INT(json_integer_value(json_array_get(bytes, 1)), 0x9C);
    top = json_object_get(t1, "top_logprobs");
    CHECK_NEAR(json_real_value(json_object_get(json_array_get(top, 1), "logprob")), -9999.0, 0);
    json_decref(j);
    top_values[3] = -3.0f;
}

static void test_legacy_logprobs(void)
{
    struct kiri_api_choice c;
    fill_lp(&c);
    struct kiri_api_usage u = {3, 2, 0};
    json_t *j = reparse(kiri_api_response_json(KIRI_API_COMPLETIONS, ENV("cmpl-9", 5, "m"), &c, 1, &u));
    CHECK_STR(jget_str(j, "object"), "text_completion");
    CHECK_STR(jget_str(j, "id"), "cmpl-9");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_STR(jget_str(c0, "text"), "He\xEF\xBF\xBD\xEF\xBF\xBD");
    CHECK_EQ_INT(json_integer_value(json_object_get(c0, "index")), 0);
    CHECK_STR(jget_str(c0, "finish_reason"), "length");
    json_t *lp = json_object_get(c0, "logprobs");
    json_t *tokens = json_object_get(lp, "tokens");
    CHECK_EQ_INT(json_array_size(tokens), 2);
    CHECK_STR(json_string_value(json_array_get(tokens, 0)), "He");
    json_t *values = json_object_get(lp, "token_logprobs");
    CHECK_NEAR(json_real_value(json_array_get(values, 1)), -2.5, 0);
    json_t *offs = json_object_get(lp, "text_offset");
    CHECK_EQ_INT(json_integer_value(json_array_get(offs, 0)), 0);
    CHECK_EQ_INT(json_integer_value(json_array_get(offs, 1)), 2);
    json_t *tops = json_object_get(lp, "top_logprobs");
    CHECK_EQ_INT(json_array_size(tops), 2);
    json_t *t0 = json_array_get(tops, 0);
    CHECK_EQ_INT(json_object_size(t0), 2);
    CHECK_NEAR(json_real_value(json_object_get(t0, "Hi")), -2.0, 0);
    /* Two alternatives with the same (repaired) text: the likelier one is kept. */
    json_t *t1 = json_array_get(tops, 1);
    CHECK_EQ_INT(json_object_size(t1), 1);
    CHECK_NEAR(json_real_value(json_object_get(t1, "\xEF\xBF\xBD\xEF\xBF\xBD")), -2.5, 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")),
                 5);
    json_decref(j);

    /* logprobs=0: the chosen tokens only; top_logprobs is null. */
    c.n_top = 0;
    j = reparse(kiri_api_response_json(KIRI_API_COMPLETIONS, ENV("cmpl-9", 5, "m"), &c, 1, NULL));
    lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    CHECK(json_is_null(json_object_get(lp, "top_logprobs")));
    CHECK_EQ_INT(json_array_size(json_object_get(lp, "tokens")), 2);
    json_decref(j);
}

static void test_chunks(void)
{
    struct kiri_api_choice c;
    memset(&c, 0, sizeof c);
    /* First chunk: delta has the role. */
    c.text = "";
    json_t *j = reparse(kiri_api_chunk_json(KIRI_API_CHAT, ENV("chatcmpl-s", 7, "m"), &c, 1, 1, NULL));
    CHECK_STR(jget_str(j, "object"), "chat.completion.chunk");
    CHECK_STR(jget_str(j, "id"), "chatcmpl-s");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "created")), 7);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *delta = json_object_get(c0, "delta");
    CHECK_STR(jget_str(delta, "role"), "assistant");
    CHECK_STR(jget_str(delta, "content"), "");
    CHECK(json_object_get(c0, "message") == NULL);
    CHECK(json_is_null(json_object_get(c0, "finish_reason")));
    CHECK(json_object_get(j, "usage") == NULL);
    json_decref(j);
    /* A middle chunk: content only. */
    c.text = "wor";
    c.text_len = 3;
    j = reparse(kiri_api_chunk_json(KIRI_API_CHAT, ENV("chatcmpl-s", 7, "m"), &c, 1, 0, NULL));
    delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    CHECK(json_object_get(delta, "role") == NULL);
    CHECK_STR(jget_str(delta, "content"), "wor");
    json_decref(j);
    /* The last chunk of a choice: empty delta and the finish reason. */
    c.text_len = 0;
    c.finish_reason = "stop";
    j = reparse(kiri_api_chunk_json(KIRI_API_CHAT, ENV("chatcmpl-s", 7, "m"), &c, 1, 0, NULL));
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_EQ_INT(json_object_size(json_object_get(c0, "delta")), 0);
    CHECK_STR(jget_str(c0, "finish_reason"), "stop");
    json_decref(j);
    /* The usage chunk: choices is an empty array. */
    struct kiri_api_usage u = {4, 5, 2};
    j = reparse(kiri_api_chunk_json(KIRI_API_CHAT, ENV("chatcmpl-s", 7, "m"), NULL, 0, 0, &u));
    CHECK(json_is_array(json_object_get(j, "choices")));
    CHECK_EQ_INT(json_array_size(json_object_get(j, "choices")), 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(j, "usage"), "total_tokens")),
                 9);
    json_decref(j);
    /* Legacy completions stream text_completion objects with "text". */
    c.text = "abc";
    c.text_len = 3;
    c.finish_reason = NULL;
    c.index = 3;
    j = reparse(kiri_api_chunk_json(KIRI_API_COMPLETIONS, ENV("cmpl-s", 7, "m"), &c, 1, 1, NULL));
    CHECK_STR(jget_str(j, "object"), "text_completion");
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    CHECK_STR(jget_str(c0, "text"), "abc");
    CHECK_EQ_INT(json_integer_value(json_object_get(c0, "index")), 3);
    CHECK(json_is_null(json_object_get(c0, "finish_reason")));
    CHECK(json_is_null(json_object_get(c0, "logprobs")));
    json_decref(j);
}

static void test_small_builders(void)
{
    const char *ids[2] = {"tiny", "tiny-q8"};
    json_t *j = reparse(kiri_api_models_json(ids, 2, 123));
    CHECK_STR(jget_str(j, "object"), "list");
    json_t *data = json_object_get(j, "data");
    CHECK_EQ_INT(json_array_size(data), 2);
    json_t *m = json_array_get(data, 1);
    CHECK_STR(jget_str(m, "id"), "tiny-q8");
    CHECK_STR(jget_str(m, "object"), "model");
    CHECK_EQ_INT(json_integer_value(json_object_get(m, "created")), 123);
    CHECK_STR(jget_str(m, "owned_by"), "kiri");
    json_decref(j);

    const int32_t toks[3] = {1, 0, 31999};
    char *s = kiri_api_tokens_json(toks, 3);
    CHECK_STR(s, "{\"tokens\":[1,0,31999]}");
    kiri_mem_free(s);
    s = kiri_api_tokens_json(NULL, 0);
    CHECK_STR(s, "{\"tokens\":[]}");
    kiri_mem_free(s);

    s = kiri_api_content_json("a\"b\\c\n\xE6\x97\xA5", 9);
    CHECK_STR(s, "{\"content\":\"a\\\"b\\\\c\\n\xE6\x97\xA5\"}");    /* UTF-8 as is */
    kiri_mem_free(s);
    s = kiri_api_content_json("x\0y", 3);
    CHECK_STR(s, "{\"content\":\"x\\u0000y\"}");
    kiri_mem_free(s);
    s = kiri_api_content_json("\xF0\x9F", 2);
    CHECK_STR(s, "{\"content\":\"\xEF\xBF\xBD\xEF\xBF\xBD\"}");
    kiri_mem_free(s);
}

/* ---------------------------------------------------------------------------------------------
 * Failing allocator
 * ------------------------------------------------------------------------------------------- */

static void test_alloc_failures_parse(void)
{
    const char *body =
        "{\"model\":\"tiny\",\"messages\":[{\"role\":\"system\",\"content\":\"You are kind.\"},"
        "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hello \"},"
        "{\"type\":\"text\",\"text\":\"there\"}]},{\"role\":\"assistant\",\"content\":null}],"
        "\"max_tokens\":64,\"temperature\":0.7,\"top_p\":0.95,\"seed\":42,\"n\":2,"
        "\"stop\":[\"\\n\",\"User:\"],\"stream\":true,\"stream_options\":{\"include_usage\":true},"
        "\"logprobs\":true,\"top_logprobs\":3,\"extra\":{\"a\":[1,2,3]}}";
    int done = 0, failures = 0;
    for (long n = 0; n < 10000 && !done; n++) {
        struct kiri_api_request r;
        struct kiri_api_error e;
        kiri_mem_fail_after(n);
        int rc = kiri_api_parse(body, strlen(body), KIRI_API_CHAT, &lim, &r, &e);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK) {
            CHECK_EQ_INT(r.n_messages, 3);
            CHECK_STR(r.messages[1].content, "Hello there");
            CHECK_EQ_INT(r.n_stop, 2);
            kiri_api_request_free(&r);
            done = 1;
        } else {
            failures++;
            CHECK_EQ_INT(rc, KIRI_E_NOMEM);
            CHECK_EQ_INT(e.status, 500);
            CHECK_STR(e.type, "server_error");
            CHECK(r.messages == NULL && r.model == NULL && r.n_stop == 0);
        }
    }
    CHECK(done);
    CHECK(failures > 10);
    /* A completions body with a list of prompts and a logit bias, too. */
    const char *b2 = "{\"prompt\":[[1,2,3,4],\"ab\"],\"stop\":\"x\",\"model\":\"m\","
                     "\"logit_bias\":{\"5\":-100,\"6\":3}}";
    done = 0;
    for (long n = 0; n < 1000 && !done; n++) {
        struct kiri_api_request r;
        struct kiri_api_error e;
        kiri_mem_fail_after(n);
        int rc = kiri_api_parse(b2, strlen(b2), KIRI_API_COMPLETIONS, &lim, &r, &e);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK) {
            CHECK_EQ_INT(r.n_prompts, 2);
            CHECK_EQ_INT(r.prompts[0].n_tokens, 4);
            CHECK_EQ_INT(r.n_bias, 2);
            kiri_api_request_free(&r);
            done = 1;
        } else {
            CHECK_EQ_INT(rc, KIRI_E_NOMEM);
        }
    }
    CHECK(done);
}

/* Each builder call is repeated with the Nth allocation failing until it succeeds; every failed
 * call returns NULL (no partial output, no leak) and the successful one matches the reference. */
static void walk_builder(const char *name, char *(*build)(void))
{
    char *ref = build();
    CHECK(ref != NULL);
    int done = 0;
    for (long n = 0; n < 100000 && !done; n++) {
        kiri_mem_fail_after(n);
        char *s = build();
        kiri_mem_fail_after(-1);
        if (s) {
            CHECK_STR(s, ref);
            kiri_mem_free(s);
            done = 1;
        }
    }
    if (!done)
        fprintf(stderr, "  builder %s never succeeded\n", name);
    CHECK(done);
    kiri_mem_free(ref);
}

static char *build_chat_lp(void)
{
    struct kiri_api_choice c[2];
    fill_lp(&c[0]);
    fill_lp(&c[1]);
    c[1].index = 1;
    struct kiri_api_usage u = {1, 2, 3};
    return kiri_api_response_json(KIRI_API_CHAT, ENV("chatcmpl-x", 9, "m"), c, 2, &u);
}

static char *build_legacy_lp(void)
{
    struct kiri_api_choice c;
    fill_lp(&c);
    struct kiri_api_usage u = {1, 2, 3};
    return kiri_api_response_json(KIRI_API_COMPLETIONS, ENV("cmpl-x", 9, "m"), &c, 1, &u);
}

static char *build_chunk(void)
{
    struct kiri_api_choice c;
    fill_lp(&c);
    c.finish_reason = NULL;
    return kiri_api_chunk_json(KIRI_API_CHAT, ENV("chatcmpl-x", 9, "m"), &c, 1, 1, NULL);
}

static char *build_error(void)
{
    struct kiri_api_error e;
    kiri_api_error_set(&e, 400, "invalid_request_error", "n", "", "n must be in [1, 8]");
    return kiri_api_error_json(&e);
}

static char *build_models(void)
{
    const char *ids[1] = {"tiny"};
    return kiri_api_models_json(ids, 1, 1);
}

static char *build_tokens(void)
{
    const int32_t t[4] = {5, 6, 7, 8};
    return kiri_api_tokens_json(t, 4);
}

static char *build_content(void)
{
    return kiri_api_content_json("caf\xC3\xA9\xFF", 6);
}

static void test_alloc_failures_build(void)
{
    walk_builder("chat+logprobs", build_chat_lp);
    walk_builder("legacy+logprobs", build_legacy_lp);
    walk_builder("chunk", build_chunk);
    walk_builder("error", build_error);
    walk_builder("models", build_models);
    walk_builder("tokens", build_tokens);
    walk_builder("content", build_content);
}

/* ---------------------------------------------------------------------------------------------
 * Structured output, logit_bias, echo and the fingerprint
 * ------------------------------------------------------------------------------------------- */

static void test_structured(void)
{
    struct kiri_api_request r;
    if (parse_ok(KIRI_API_CHAT, CHAT(",\"response_format\":{\"type\":\"json_object\"}"), &r) == KIRI_OK) {
        CHECK_EQ_INT(r.format, KIRI_API_FORMAT_JSON_OBJECT);
        CHECK(r.grammar != NULL && r.grammar_len == strlen(r.grammar) && r.grammar_len > 0);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (parse_ok(KIRI_API_CHAT,
                 CHAT(",\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"pet-1\","
                      "\"strict\":false,\"schema\":{\"type\":\"object\",\"properties\":{\"n\":"
                      "{\"type\":\"integer\"}},\"required\":[\"n\"]}}}"),
                 &r) == KIRI_OK) {
        CHECK_EQ_INT(r.format, KIRI_API_FORMAT_JSON_SCHEMA);
        CHECK(r.grammar != NULL);
        CHECK_STR(r.format_name, "pet-1");
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (parse_ok(KIRI_API_COMPLETIONS, CMPL(",\"grammar\":\"root ::= \\\"yes\\\" | \\\"no\\\"\""), &r) == KIRI_OK) {
        CHECK_EQ_INT(r.format, KIRI_API_FORMAT_GRAMMAR);
        CHECK_STR(r.grammar, "root ::= \"yes\" | \"no\"");
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (parse_ok(KIRI_API_COMPLETIONS,
                 CMPL(",\"json_schema\":{\"type\":\"string\"},\"response_format\":{\"type\":\"text\"}"),
                 &r) == KIRI_OK) {
        CHECK_EQ_INT(r.format, KIRI_API_FORMAT_JSON_SCHEMA);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (parse_ok(KIRI_API_CHAT, CHAT(",\"logit_bias\":{\"7\":-100,\"31999\":2.5}"), &r) == KIRI_OK) {
        CHECK_EQ_INT(r.n_bias, 2);
        CHECK_EQ_INT(r.bias_tokens[0], 7);
        CHECK_NEAR(r.bias_values[0], -100.0, 0);
        CHECK_EQ_INT(r.bias_tokens[1], 31999);
        CHECK_NEAR(r.bias_values[1], 2.5, 0);
        CHECK_EQ_INT(r.format, KIRI_API_FORMAT_TEXT);
        CHECK(r.grammar == NULL);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    /* A bias on a token past a model's vocabulary is within loose limits but not the model's. */
    const struct kiri_api_limits loose = {0, INT32_MAX, 1024}, small = {4096, 100, 16};
    struct kiri_api_error e;
    const char *b = CHAT(",\"logit_bias\":{\"150\":1}");
    if (kiri_api_parse(b, strlen(b), KIRI_API_CHAT, &loose, &r, &e) == KIRI_OK) {
        CHECK(kiri_api_within_limits(&r, &lim));
        CHECK(!kiri_api_within_limits(&r, &small));
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
}

/* The caps on prompts and choices, too large for the table. */
static void test_prompt_caps(void)
{
    size_t len;
    char *b = repeat("{\"prompt\":[\"x\"", ",\"x\"", KIRI_API_MAX_PROMPTS, "]}", &len);   /* one too many */
    check_refused("H24", KIRI_API_COMPLETIONS, b, len, "prompt", NULL);
    free(b);
    b = repeat("{\"prompt\":[[1]", ",[1]", KIRI_API_MAX_PROMPTS - 1, "],\"n\":1}", &len);
    struct kiri_api_request r;
    struct kiri_api_error e;
    CHECK_EQ_INT(kiri_api_parse(b, len, KIRI_API_COMPLETIONS, &lim, &r, &e), KIRI_OK);
    CHECK_EQ_INT(r.n_prompts, KIRI_API_MAX_PROMPTS);
    kiri_api_request_free(&r);
    free(b);
}

static void test_echo_logprobs_and_fingerprint(void)
{
    /* Echoed prompt tokens carry no log-probability: null, as OpenAI writes the first token's. */
    struct kiri_api_choice c;
    fill_lp(&c);
    c.n_unscored = 1;
    const struct kiri_api_envelope env = {"cmpl-e", 3, "m", "fp_0123456789abcdef"};
    json_t *j = reparse(kiri_api_response_json(KIRI_API_COMPLETIONS, &env, &c, 1, NULL));
    CHECK_STR(jget_str(j, "system_fingerprint"), "fp_0123456789abcdef");
    json_t *lp = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    CHECK(json_is_null(json_array_get(json_object_get(lp, "token_logprobs"), 0)));
    CHECK(json_is_real(json_array_get(json_object_get(lp, "token_logprobs"), 1)));
    CHECK(json_is_null(json_array_get(json_object_get(lp, "top_logprobs"), 0)));
    CHECK(json_is_object(json_array_get(json_object_get(lp, "top_logprobs"), 1)));
    CHECK_EQ_INT(json_array_size(json_object_get(lp, "tokens")), 2);
    json_decref(j);
    j = reparse(kiri_api_chunk_json(KIRI_API_CHAT, &env, &c, 1, 1, NULL));
    CHECK_STR(jget_str(j, "system_fingerprint"), "fp_0123456789abcdef");
    json_decref(j);

    char a[20], a2[20], bk[20], m[20];
    kiri_api_fingerprint("cpu", "tiny.gguf", "abc", a);
    kiri_api_fingerprint("cpu", "tiny.gguf", "abc", a2);
    kiri_api_fingerprint("cuda", "tiny.gguf", "abc", bk);
    kiri_api_fingerprint("cpu", "tiny.ggufabc", "", m);
    CHECK_EQ_INT(strlen(a), 19);
    CHECK(strncmp(a, "fp_", 3) == 0 && strspn(a + 3, "0123456789abcdef") == 16);
    CHECK_STR(a, a2);
    CHECK(strcmp(a, bk) != 0 && strcmp(a, m) != 0);
}

/* ---------------------------------------------------------------------------------------------
 * /v1/responses
 * ------------------------------------------------------------------------------------------- */

static int responses_ok(const char *body, struct kiri_api_request *r)
{
    struct kiri_api_error e;
    int rc = kiri_responses_parse(body, strlen(body), &lim, r, &e);
    if (rc != KIRI_OK)
        fprintf(stderr, "  unexpected refusal of %.120s: [%s] %s\n", body, e.param, e.message);
    return rc;
}

static void test_responses_parse(void)
{
    struct kiri_api_request r;
    if (responses_ok("{\"model\":\"m\",\"input\":\"Hello\",\"instructions\":\"Be brief.\",\"max_output_tokens\":64,"
                     "\"temperature\":0.5,\"top_p\":0.9,\"stream\":true,\"store\":true,\"metadata\":{\"a\":\"b\"}}",
                     &r) == KIRI_OK) {
        CHECK_EQ_INT(r.kind, KIRI_API_RESPONSES);
        CHECK_STR(r.model, "m");
        CHECK_EQ_INT(r.n_messages, 2);
        CHECK_STR(r.messages[0].role, "system");
        CHECK_STR(r.messages[0].content, "Be brief.");
        CHECK_STR(r.messages[1].role, "user");
        CHECK_STR(r.messages[1].content, "Hello");
        CHECK_STR(r.instructions, "Be brief.");
        CHECK_EQ_INT(r.max_tokens, 64);
        CHECK_NEAR(r.sampling.temperature, 0.5, 0);
        CHECK_NEAR(r.sampling.top_p, 0.9f, 0);
        CHECK_EQ_INT(r.stream, 1);
        CHECK_EQ_INT(r.n, 1);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
    if (responses_ok("{\"input\":[{\"role\":\"developer\",\"content\":\"Rules\"},"
                     "{\"type\":\"message\",\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"},"
                     "{\"type\":\"input_text\",\"text\":\"b\"}]},{\"type\":\"reasoning\",\"summary\":[]},"
                     "{\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"c\"}]}],"
                     "\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"out\",\"strict\":true,"
                     "\"schema\":{\"type\":\"object\"}}}}",
                     &r) == KIRI_OK) {
        CHECK_EQ_INT(r.n_messages, 3);
        CHECK_STR(r.messages[0].role, "system");
        CHECK_STR(r.messages[1].content, "ab");
        CHECK_STR(r.messages[2].role, "assistant");
        CHECK_STR(r.messages[2].content, "c");
        CHECK_EQ_INT(r.format, KIRI_API_FORMAT_JSON_SCHEMA);
        CHECK(r.grammar != NULL);
        CHECK_STR(r.format_name, "out");
        CHECK(r.instructions == NULL);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
}

struct responses_bad {
    const char *body;
    const char *param;
    const char *code;       /* NULL: don't care */
};

static const struct responses_bad responses_bad_cases[] = {
    {"{}", "input", NULL},
    {"{\"input\":5}", "input", NULL},
    {"{\"input\":[]}", "input", NULL},
    {"{\"input\":[{\"type\":\"reasoning\"}]}", "input", NULL},
    {"{\"input\":[5]}", "input[0]", NULL},
    {"{\"input\":[{\"role\":\"wizard\",\"content\":\"a\"}]}", "input[0].role", NULL},
    {"{\"input\":[{\"role\":\"tool\",\"content\":\"a\"}]}", "input[0].role", NULL},
    {"{\"input\":[{\"role\":\"user\"}]}", "input[0].content", NULL},
    {"{\"input\":[{\"role\":\"user\",\"content\":5}]}", "input[0].content", NULL},
    {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"x\"}]}]}",
     "input[0].content[0].type", "unsupported_value"},
    {"{\"input\":[\"a\",{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]}", "input[0]", NULL},
    {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\"}]}]}", "input[0].content[0].text", NULL},
    {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"msg_1\"}]}", "input[0].type", "unsupported_parameter"},
    {"{\"input\":[{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":\"x\"}]}", "input[0].call_id", NULL},
    {"{\"input\":[\"a\"]}", "input[0]", NULL},
    {"{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"type\":\"function_call\",\"call_id\":\"c1\","
     "\"name\":\"f\",\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":\"c2\","
     "\"output\":\"x\"}]}", "input[2].call_id", NULL},
    {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c1\",\"arguments\":\"{}\"}]}", "input[0].name", NULL},
    {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}", "input[0].call_id", NULL},
    {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":{}}]}",
     "input[0].arguments", NULL},
    {"{\"input\":[{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"{}\"},"
     "{\"type\":\"function_call_output\",\"call_id\":\"c\",\"output\":5}]}", "input[1].output", NULL},
    {"{\"input\":\"a\",\"tools\":[{\"type\":\"web_search\"}]}", "tools[0].type", "unsupported_value"},
    {"{\"input\":\"a\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"},{\"type\":\"file_search\"}]}",
     "tools[1].type", "unsupported_value"},
    {"{\"input\":\"a\",\"tools\":[5]}", "tools[0]", NULL},
    {"{\"input\":\"a\",\"tools\":{}}", "tools", NULL},
    {"{\"input\":\"a\",\"tools\":[{\"type\":\"function\",\"name\":\"bad name\"}]}", "tools[0].name", NULL},
    {"{\"input\":\"a\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":5}]}",
     "tools[0].parameters", NULL},
    {"{\"input\":\"a\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":"
     "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}", "tool_choice", NULL},
    {"{\"input\":\"a\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"tool_choice\":"
     "{\"type\":\"function\",\"name\":\"g\"}}", "tool_choice", NULL},
    {"{\"input\":\"a\",\"tool_choice\":\"required\"}", "tool_choice", NULL},
    {"{\"input\":\"a\",\"tools\":[{\"type\":\"function\",\"name\":\"f\"}],\"parallel_tool_calls\":1}",
     "parallel_tool_calls", NULL},
    {"{\"input\":[{\"type\":5}]}", "input[0].type", NULL},
    {"{\"input\":\"a\",\"instructions\":5}", "instructions", NULL},
    {"{\"input\":\"a\",\"previous_response_id\":\"resp_1\"}", "previous_response_id", "unsupported_parameter"},
    {"{\"input\":\"a\",\"conversation\":\"conv_1\"}", "conversation", "unsupported_parameter"},
    {"{\"input\":\"a\",\"background\":true}", "background", "unsupported_parameter"},
    {"{\"input\":\"a\",\"store\":\"no\"}", "store", NULL},
    {"{\"input\":\"a\",\"max_output_tokens\":0}", "max_output_tokens", NULL},
    {"{\"input\":\"a\",\"max_output_tokens\":4097}", "max_output_tokens", NULL},
    {"{\"input\":\"a\",\"max_output_tokens\":\"5\"}", "max_output_tokens", NULL},
    {"{\"input\":\"a\",\"temperature\":3}", "temperature", NULL},
    {"{\"input\":\"a\",\"top_p\":0}", "top_p", NULL},
    {"{\"input\":\"a\",\"text\":5}", "text", NULL},
    {"{\"input\":\"a\",\"text\":{\"format\":{\"type\":\"xml\"}}}", "text.format", NULL},
    {"{\"input\":\"a\",\"text\":{\"format\":{\"type\":\"json_schema\",\"name\":\"x\"}}}", "text.format.schema", NULL},
    {"{\"input\":\"a\",\"text\":{\"format\":{\"type\":\"json_schema\","
     "\"schema\":{\"properties\":{\"x\":{\"not\":{}}}}}}}",
     "text.format.schema/properties/x", "unsupported_schema"},
    {"{\"input\":\"a\",\"x\":"
     "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[}", "x", NULL},
    {"[\"input\"]", "", NULL},
    {"{\"input\":\"a\",\"max_output_tokens\":-0}", "max_output_tokens", NULL},
};

static void test_responses_bad(void)
{
    for (size_t i = 0; i < sizeof responses_bad_cases / sizeof responses_bad_cases[0]; i++) {
        const struct responses_bad *c = &responses_bad_cases[i];
        struct kiri_api_request r;
        struct kiri_api_error e;
        memset(&e, 0, sizeof e);
        const int before = test_failures;
        const int rc = kiri_responses_parse(c->body, strlen(c->body), &lim, &r, &e);
        CHECK_EQ_INT(rc, KIRI_E_INVALID_ARG);
        CHECK_EQ_INT(e.status, 400);
        CHECK_STR(e.param, c->param);
        if (c->code)
            CHECK_STR(e.code, c->code);
        CHECK(e.message[0] != '\0');
        CHECK(r.messages == NULL && r.model == NULL && r.grammar == NULL && r.instructions == NULL);
        if (rc == KIRI_OK)
            kiri_api_request_free(&r);
        if (test_failures != before)
            fprintf(stderr, "  in responses case %zu: %.120s -> [%s] %s\n", i, c->body, e.param, e.message);
    }
}

/* The shapes of OpenAI's API reference: the Response object and its streaming events. */
static void test_responses_json(void)
{
    struct kiri_api_request r;
    if (responses_ok("{\"input\":\"Hi\",\"instructions\":\"Be kind\",\"max_output_tokens\":8,"
                     "\"temperature\":0.7}",
                     &r) != KIRI_OK) {
        CHECK(0);
        return;
    }
    struct kiri_responses_state st;
    memset(&st, 0, sizeof st);
    st.id = "resp_1";
    st.item_id = "msg_1";
    st.created = 1700000000;
    st.model = "tiny";
    st.r = &r;
    st.status = KIRI_RESPONSES_IN_PROGRESS;
    const char *type = NULL;
    json_t *j = reparse(kiri_responses_event_json(KIRI_RESPONSES_EV_CREATED, 0, &st, NULL, 0, &type));
    CHECK_STR(type, "response.created");
    CHECK_STR(jget_str(j, "type"), "response.created");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "sequence_number")), 0);
    json_t *resp = json_object_get(j, "response");
    CHECK_STR(jget_str(resp, "status"), "in_progress");
    CHECK_EQ_INT(json_array_size(json_object_get(resp, "output")), 0);
    CHECK(json_is_null(json_object_get(resp, "usage")));
    json_decref(j);

    j = reparse(kiri_responses_event_json(KIRI_RESPONSES_EV_TEXT_DELTA, 4, &st, "Hel", 3, &type));
    CHECK_STR(type, "response.output_text.delta");
    CHECK_STR(jget_str(j, "delta"), "Hel");
    CHECK_STR(jget_str(j, "item_id"), "msg_1");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "output_index")), 0);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "content_index")), 0);
    json_decref(j);

    st.status = KIRI_RESPONSES_COMPLETED;
    st.text = "Hello";
    st.text_len = 5;
    st.has_usage = 1;
    st.usage.prompt_tokens = 11;
    st.usage.completion_tokens = 2;
    st.usage.cached_tokens = 3;
    j = reparse(kiri_responses_json(&st));
    CHECK_STR(jget_str(j, "id"), "resp_1");
    CHECK_STR(jget_str(j, "object"), "response");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "created_at")), 1700000000);
    CHECK_STR(jget_str(j, "status"), "completed");
    CHECK_STR(jget_str(j, "model"), "tiny");
    CHECK_STR(jget_str(j, "instructions"), "Be kind");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "max_output_tokens")), 8);
    CHECK_NEAR(json_real_value(json_object_get(j, "temperature")), 0.7, 1e-12);
    CHECK(json_is_false(json_object_get(j, "store")));
    json_t *item = json_array_get(json_object_get(j, "output"), 0);
    CHECK_STR(jget_str(item, "type"), "message");
    CHECK_STR(jget_str(item, "id"), "msg_1");
    CHECK_STR(jget_str(item, "role"), "assistant");
    CHECK_STR(jget_str(item, "status"), "completed");
    json_t *part = json_array_get(json_object_get(item, "content"), 0);
    CHECK_STR(jget_str(part, "type"), "output_text");
    CHECK_STR(jget_str(part, "text"), "Hello");
    CHECK(json_is_array(json_object_get(part, "annotations")));
    json_t *usage = json_object_get(j, "usage");
    CHECK_EQ_INT(json_integer_value(json_object_get(usage, "input_tokens")), 11);
    CHECK_EQ_INT(json_integer_value(json_object_get(usage, "output_tokens")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(usage, "total_tokens")), 13);
    json_t *details = json_object_get(usage, "input_tokens_details");
    CHECK_EQ_INT(json_integer_value(json_object_get(details, "cached_tokens")), 3);
    json_decref(j);

    j = reparse(kiri_responses_event_json(KIRI_RESPONSES_EV_TEXT_DONE, 9, &st, NULL, 0, &type));
    CHECK_STR(type, "response.output_text.done");
    CHECK_STR(jget_str(j, "text"), "Hello");
    json_decref(j);
    st.status = KIRI_RESPONSES_INCOMPLETE;
    j = reparse(kiri_responses_event_json(KIRI_RESPONSES_EV_FINISHED, 12, &st, NULL, 0, &type));
    CHECK_STR(type, "response.incomplete");
    CHECK_STR(jget_str(json_object_get(json_object_get(j, "response"), "incomplete_details"), "reason"),
              "max_output_tokens");
    json_decref(j);
    st.status = KIRI_RESPONSES_FAILED;
    j = reparse(kiri_responses_event_json(KIRI_RESPONSES_EV_FINISHED, 12, &st, NULL, 0, &type));
    CHECK_STR(type, "response.failed");
    CHECK(json_is_object(json_object_get(json_object_get(j, "response"), "error")));
    json_decref(j);
    CHECK(kiri_responses_event_json(99, 0, &st, NULL, 0, &type) == NULL);
    kiri_api_request_free(&r);
}

static const char responses_tools_body[] =
    "{\"input\":[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
    "{\"type\":\"function_call\",\"id\":\"fc_1\",\"call_id\":\"call_1\",\"name\":\"weather\","
    "\"arguments\":\"{\\\"city\\\":\\\"Paris\\\"}\",\"status\":\"completed\"},"
    "{\"type\":\"function_call\",\"call_id\":\"call_2\",\"name\":\"time\",\"arguments\":\"{}\"},"
    "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"sunny\"},"
    "{\"type\":\"function_call_output\",\"call_id\":\"call_2\",\"output\":[{\"type\":\"input_text\","
    "\"text\":\"noon\"}]}],"
    "\"tools\":[{\"type\":\"function\",\"name\":\"weather\",\"description\":\"Weather of a city\","
    "\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}},\"strict\":true},"
    "{\"type\":\"function\",\"name\":\"time\"}],"
    "\"tool_choice\":{\"type\":\"function\",\"name\":\"time\"},\"parallel_tool_calls\":false}";

/* Function tools and call items read as the chat request they stand for. */
static void test_responses_tools_parse(void)
{
    struct kiri_api_request r;
    if (responses_ok(responses_tools_body, &r) != KIRI_OK) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(r.n_messages, 4); /* user, one assistant turn with both calls, two tool results */
    CHECK_STR(r.messages[1].role, "assistant");
    CHECK_STR(r.messages[2].role, "tool");
    CHECK_STR(r.messages[3].content, "noon");
    CHECK_EQ_INT(r.tool_choice, KIRI_TOOL_CHOICE_NAMED);
    CHECK_STR(r.tool_choice_name, "time");
    CHECK_EQ_INT(r.parallel_tool_calls, 0);
    json_t *tools = json_loadb(r.tools, r.tools_len, 0, NULL);
    CHECK_EQ_INT(json_array_size(tools), 2);
    CHECK_STR(jget_str(json_object_get(json_array_get(tools, 0), "function"), "name"), "weather");
    CHECK_STR(jget_str(json_object_get(json_array_get(tools, 0), "function"), "description"), "Weather of a city");
    CHECK(json_is_object(json_object_get(json_object_get(json_array_get(tools, 0), "function"), "parameters")));
    CHECK(json_object_get(json_object_get(json_array_get(tools, 0), "function"), "strict") == NULL);
    json_decref(tools);
    json_t *msgs = json_loadb(r.messages_json, r.messages_json_len, 0, NULL);
    json_t *calls = json_object_get(json_array_get(msgs, 1), "tool_calls");
    CHECK_EQ_INT(json_array_size(calls), 2);
    CHECK_STR(jget_str(json_array_get(calls, 0), "id"), "call_1");
    json_t *fn = json_object_get(json_array_get(calls, 0), "function");
    CHECK_STR(jget_str(fn, "name"), "weather");
    CHECK_STR(jget_str(json_object_get(fn, "arguments"), "city"), "Paris");
    CHECK_STR(jget_str(json_array_get(msgs, 2), "tool_call_id"), "call_1");
    CHECK_STR(jget_str(json_array_get(msgs, 3), "tool_call_id"), "call_2");
    json_decref(msgs);
    kiri_api_request_free(&r);

    /* An assistant message item followed by a call is one assistant turn; a later call a new one. */
    if (responses_ok("{\"input\":[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\","
                     "\"content\":\"Let me look.\"},{\"type\":\"function_call\",\"call_id\":\"a\",\"name\":\"f\","
                     "\"arguments\":\"{}\"},{\"type\":\"function_call_output\",\"call_id\":\"a\",\"output\":\"1\"},"
                     "{\"type\":\"function_call\",\"call_id\":\"b\",\"name\":\"f\",\"arguments\":\"{}\"}]}",
                     &r) == KIRI_OK) {
        CHECK_EQ_INT(r.n_messages, 4);
        CHECK_STR(r.messages[1].content, "Let me look.");
        CHECK_STR(r.messages[3].role, "assistant");
        CHECK(r.tools == NULL);
        kiri_api_request_free(&r);
    } else {
        CHECK(0);
    }
}

/* Call items in the response object and the events of a streamed call. */
static void test_responses_tools_json(void)
{
    struct kiri_api_request r;
    if (responses_ok(responses_tools_body, &r) != KIRI_OK) {
        CHECK(0);
        return;
    }
    char name0[] = "weather", args0[] = "{\"city\":\"Oslo\"}", name1[] = "time", args1[] = "{}";
    struct kiri_tool_call calls[2];
    memset(calls, 0, sizeof calls);
    snprintf(calls[0].id, sizeof calls[0].id, "call_abc");
    calls[0].name = name0;
    calls[0].arguments = args0;
    snprintf(calls[1].id, sizeof calls[1].id, "call_def");
    calls[1].name = name1;
    calls[1].arguments = args1;
    struct kiri_responses_state st;
    memset(&st, 0, sizeof st);
    st.id = "resp_1";
    st.item_id = "msg_1";
    st.r = &r;
    st.status = KIRI_RESPONSES_COMPLETED;
    st.text = "";
    st.no_message = 1;
    st.calls = calls;
    st.n_calls = 2;
    json_t *j = reparse(kiri_responses_json(&st));
    json_t *out = json_object_get(j, "output");
    CHECK_EQ_INT(json_array_size(out), 2);
    json_t *item = json_array_get(out, 0);
    CHECK_STR(jget_str(item, "type"), "function_call");
    CHECK_STR(jget_str(item, "id"), "fc_abc");
    CHECK_STR(jget_str(item, "call_id"), "call_abc");
    CHECK_STR(jget_str(item, "name"), "weather");
    CHECK_STR(jget_str(item, "arguments"), "{\"city\":\"Oslo\"}");
    CHECK_STR(jget_str(item, "status"), "completed");
    CHECK_STR(jget_str(json_array_get(out, 1), "call_id"), "call_def");
    json_t *tool = json_array_get(json_object_get(j, "tools"), 0);
    CHECK_STR(jget_str(tool, "type"), "function");
    CHECK_STR(jget_str(tool, "name"), "weather");
    CHECK(json_is_object(json_object_get(tool, "parameters")));
    CHECK(json_is_null(json_object_get(json_array_get(json_object_get(j, "tools"), 1), "parameters")));
    CHECK_STR(jget_str(json_object_get(j, "tool_choice"), "name"), "time");
    CHECK(json_is_false(json_object_get(j, "parallel_tool_calls")));
    json_decref(j);

    /* With text: the message item first, the calls after it. */
    st.no_message = 0;
    st.text = "Sure.";
    st.text_len = 5;
    j = reparse(kiri_responses_json(&st));
    out = json_object_get(j, "output");
    CHECK_EQ_INT(json_array_size(out), 3);
    CHECK_STR(jget_str(json_array_get(out, 0), "type"), "message");
    CHECK_STR(jget_str(json_array_get(out, 2), "call_id"), "call_def");
    json_decref(j);

    /* The message streamed after the first call: it sits at output_index 1. */
    st.message_index = 1;
    j = reparse(kiri_responses_json(&st));
    out = json_object_get(j, "output");
    CHECK_STR(jget_str(json_array_get(out, 0), "type"), "function_call");
    CHECK_STR(jget_str(json_array_get(out, 1), "type"), "message");
    json_decref(j);
    const char *type = NULL;
    j = reparse(kiri_responses_event_json(KIRI_RESPONSES_EV_TEXT_DELTA, 3, &st, "S", 1, &type));
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "output_index")), 1);
    json_decref(j);
    j = reparse(kiri_responses_call_event_json(KIRI_RESPONSES_EV_CALL_ADDED, 5, &st, 1, &type));
    CHECK_STR(type, "response.output_item.added");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "output_index")), 2);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "sequence_number")), 5);
    CHECK_STR(jget_str(json_object_get(j, "item"), "arguments"), "");
    CHECK_STR(jget_str(json_object_get(j, "item"), "status"), "in_progress");
    json_decref(j);

    st.no_message = 1;
    j = reparse(kiri_responses_call_event_json(KIRI_RESPONSES_EV_CALL_ARGS_DELTA, 6, &st, 0, &type));
    CHECK_STR(type, "response.function_call_arguments.delta");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "output_index")), 0);
    CHECK_STR(jget_str(j, "item_id"), "fc_abc");
    CHECK_STR(jget_str(j, "delta"), "{\"city\":\"Oslo\"}");
    json_decref(j);
    j = reparse(kiri_responses_call_event_json(KIRI_RESPONSES_EV_CALL_ARGS_DONE, 7, &st, 0, &type));
    CHECK_STR(type, "response.function_call_arguments.done");
    CHECK_STR(jget_str(j, "arguments"), "{\"city\":\"Oslo\"}");
    json_decref(j);
    j = reparse(kiri_responses_call_event_json(KIRI_RESPONSES_EV_CALL_DONE, 8, &st, 1, &type));
    CHECK_STR(type, "response.output_item.done");
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "output_index")), 1);
    CHECK_STR(jget_str(json_object_get(j, "item"), "status"), "completed");
    json_decref(j);
    CHECK(kiri_responses_call_event_json(KIRI_RESPONSES_EV_CALL_DONE, 8, &st, 2, &type) == NULL);
    CHECK(kiri_responses_call_event_json(9, 8, &st, 0, &type) == NULL);

    for (int ev = KIRI_RESPONSES_EV_CALL_ADDED; ev <= KIRI_RESPONSES_EV_CALL_DONE; ev++) {
        int built = 0;
        for (long k = 0; k < 2000 && !built; k++) {
            kiri_mem_fail_after(k);
            char *s = kiri_responses_call_event_json(ev, 1, &st, 0, NULL);
            kiri_mem_fail_after(-1);
            built = s != NULL;
            kiri_mem_free(s);
        }
        CHECK(built);
    }
    int built = 0;
    for (long k = 0; k < 4000 && !built; k++) {
        kiri_mem_fail_after(k);
        char *s = kiri_responses_json(&st);
        kiri_mem_fail_after(-1);
        built = s != NULL;
        kiri_mem_free(s);
    }
    CHECK(built);
    for (long n = 0; n < 4000; n++) {
        struct kiri_api_request r2;
        struct kiri_api_error e;
        kiri_mem_fail_after(n);
        const int rc = kiri_responses_parse(responses_tools_body, strlen(responses_tools_body), &lim, &r2, &e);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK) {
            kiri_api_request_free(&r2);
            break;
        }
        CHECK_EQ_INT(rc, KIRI_E_NOMEM);
    }
    kiri_api_request_free(&r);
}

/* Parsing a Responses body and writing its events with the Nth allocation failing. */
static void test_responses_alloc_failures(void)
{
    const char *b = "{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_text\",\"text\":\"a\"}]}],"
                    "\"instructions\":\"x\",\"text\":{\"format\":{\"type\":\"json_object\"}}}";
    int done = 0;
    for (long n = 0; n < 2000 && !done; n++) {
        struct kiri_api_request r;
        struct kiri_api_error e;
        kiri_mem_fail_after(n);
        const int rc = kiri_responses_parse(b, strlen(b), &lim, &r, &e);
        kiri_mem_fail_after(-1);
        if (rc == KIRI_OK) {
            CHECK_EQ_INT(r.n_messages, 2);
            struct kiri_responses_state st;
            memset(&st, 0, sizeof st);
            st.r = &r;
            st.status = KIRI_RESPONSES_COMPLETED;
            st.text = "t";
            st.text_len = 1;
            st.has_usage = 1;
            for (int status = KIRI_RESPONSES_IN_PROGRESS; status <= KIRI_RESPONSES_FAILED; status++)
                for (int ev = KIRI_RESPONSES_EV_CREATED; ev <= KIRI_RESPONSES_EV_FINISHED; ev++) {
                    st.status = status;
                    int built = 0;
                    for (long k = 0; k < 2000 && !built; k++) {
                        kiri_mem_fail_after(k);
                        char *s = kiri_responses_event_json(ev, 1, &st, "d", 1, NULL);
                        kiri_mem_fail_after(-1);
                        built = s != NULL;
                        kiri_mem_free(s);
                    }
                    CHECK(built);
                }
            kiri_api_request_free(&r);
            done = 1;
        } else {
            CHECK_EQ_INT(rc, KIRI_E_NOMEM);
        }
    }
    CHECK(done);
}

TEST_MAIN(test_bad_table, test_depth, test_big_bodies, test_chat_full, test_chat_tools, test_defaults,
          test_good_table, test_prompts, test_tokenize, test_bad_arguments, test_error_json,
          test_chat_response, test_chat_logprobs, test_legacy_logprobs, test_chunks,
          test_small_builders, test_alloc_failures_parse, test_alloc_failures_build, test_structured,
          test_prompt_caps, test_echo_logprobs_and_fingerprint, test_responses_parse, test_responses_bad,
          test_responses_json, test_responses_alloc_failures, test_responses_tools_parse, test_responses_tools_json)
