/* libFuzzer target for the OpenAI wire format: parse the input as a body of each request kind;
 * when it is accepted, check the request's invariants (openai.h) and write parts of it back out
 * with the builders; when it is refused, check the error record and that its JSON parses. The
 * raw input is also written out as response text, which must always give valid JSON.
 *
 * Build: clang -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
 *        -Iinclude -Ibase -Iserver tests/fuzz/fuzz_openai.c server/openai.c base/error.c \
 *        base/mem.c /usr/lib/x86_64-linux-gnu/libjansson.a -lm -o fuzz_openai
 * Run:   ./fuzz_openai -max_total_time=60 corpus/ tests/fuzz/seeds/openai/
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "openai.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts unless s is non-NULL JSON text that Jansson reads back; frees s. Generated text may
 * hold NUL, written as \u0000, which is valid JSON; Jansson's reader refuses it in an object key
 * (a legacy top_logprobs key), so that one refusal is accepted. */
static void must_parse(char *s)
{
    if (!s)
        abort();
    json_error_t e;
    json_t *j = json_loads(s, JSON_ALLOW_NUL, &e);
    if (!j && json_error_code(&e) != json_error_null_byte_in_key)
        abort();
    json_decref(j);
    kiri_mem_free(s);
}

static void check_request(const struct kiri_api_request *r, const struct kiri_api_limits *lim)
{
    if (r->n < 1 || r->n > KIRI_API_MAX_N || r->n_stop < 0 || r->n_stop > KIRI_API_MAX_STOP)
        abort();
    for (int i = 0; i < r->n_stop; i++) {
        size_t n = strlen(r->stop[i]);
        if (n == 0 || n > KIRI_API_MAX_STOP_LEN)
            abort();
    }
    if (r->max_tokens != -1 && (r->max_tokens < 1 || r->max_tokens > lim->max_tokens_cap))
        abort();
    if (r->top_logprobs < 0 || r->top_logprobs > 20 || r->priority < -1000 || r->priority > 1000)
        abort();
    const struct kiri_sampling *s = &r->sampling;
    if (!(s->temperature >= 0 && s->temperature <= 2) || !(s->top_p > 0 && s->top_p <= 1) ||
        !(s->min_p >= 0 && s->min_p <= 1) || s->top_k < 0 || !(s->repeat_penalty > 0))
        abort();
    for (int32_t i = 0; i < r->n_prompt_tokens; i++)
        if (r->prompt_tokens[i] < 0 || r->prompt_tokens[i] >= lim->n_vocab)
            abort();
    for (int32_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= lim->n_vocab)
            abort();
    if (r->kind == KIRI_API_CHAT) {
        if (r->n_messages < 1 || r->n_messages > lim->max_messages)
            abort();
        for (int i = 0; i < r->n_messages; i++)
            if (!r->messages[i].role || !r->messages[i].content)
                abort();
    }
    if (r->kind == KIRI_API_COMPLETIONS && !r->prompt && !r->n_prompt_tokens)
        abort();
}

/* Writes the accepted request's text and ids back out as response bodies. */
static void echo_request(const struct kiri_api_request *r)
{
    const char *text = r->prompt ? r->prompt : r->content ? r->content : "";
    if (r->n_messages > 0)
        text = r->messages[r->n_messages - 1].content;
    struct kiri_api_choice c;
    memset(&c, 0, sizeof c);
    c.text = text;
    c.text_len = strlen(text);
    c.finish_reason = "stop";
    struct kiri_api_usage u = {r->n_prompt_tokens, 1, 0};
    int kind = r->kind == KIRI_API_CHAT ? KIRI_API_CHAT : KIRI_API_COMPLETIONS;
    must_parse(kiri_api_response_json(kind, "id", 1, r->model, &c, 1, &u));
    must_parse(kiri_api_chunk_json(kind, "id", 1, r->model, &c, 1, 1, NULL));
    must_parse(kiri_api_tokens_json(r->prompt_tokens ? r->prompt_tokens : r->tokens,
                                    r->prompt_tokens ? r->n_prompt_tokens : r->n_tokens));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct kiri_api_limits lim = {4096, 32000, 64};
    const char *body = (const char *)data;
    for (int kind = KIRI_API_COMPLETIONS; kind <= KIRI_API_DETOKENIZE; kind++) {
        struct kiri_api_request r;
        struct kiri_api_error e;
        int rc = kiri_api_parse(body, size, kind, &lim, &r, &e);
        if (rc == 0) {
            if (r.kind != kind)
                abort();
            check_request(&r, &lim);
            echo_request(&r);
            kiri_api_request_free(&r);
        } else {
            if (rc != KIRI_E_INVALID_ARG || e.status != 400 || !e.message[0])
                abort();
            if (r.model || r.prompt || r.messages || r.n_stop || r.tokens || r.content)
                abort();
            must_parse(kiri_api_error_json(&e));
        }
    }
    /* Arbitrary bytes as generated text and as a token's text. */
    must_parse(kiri_api_content_json(body, size));
    const char *tok = body;
    size_t tok_len = size;
    float lp = size ? (float)-(double)data[0] : 0.0f;
    struct kiri_api_choice c;
    memset(&c, 0, sizeof c);
    c.text = body;
    c.text_len = size;
    c.n_logprobs = 1;
    c.lp_tokens = &tok;
    c.lp_token_lens = &tok_len;
    c.lp_values = &lp;
    c.n_top = 1;
    c.top_tokens = &tok;
    c.top_token_lens = &tok_len;
    c.top_values = &lp;
    must_parse(kiri_api_chunk_json(KIRI_API_CHAT, "id", 1, "m", &c, 1, 0, NULL));
    must_parse(kiri_api_response_json(KIRI_API_COMPLETIONS, "id", 1, "m", &c, 1, NULL));
    return 0;
}
