/* libFuzzer target for the OpenAI wire format: parse the input as a body of each request kind
 * (and as a /v1/responses body); when it is accepted, check the request's invariants (openai.h,
 * responses.h) and write parts of it back out with the builders; when it is refused, check the
 * error record and that its JSON parses. The raw input is also written out as response text,
 * which must always give valid JSON.
 *
 * Build: with -DKIRI_FUZZ=ON (CMake links the server, schema and engine libraries it needs).
 * Run:   ./fuzz_openai -max_total_time=60 corpus/ tests/fuzz/seeds/openai/
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mem.h"
#include "openai.h"
#include "responses.h"

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
    if ((r->grammar == NULL) != (r->format == KIRI_API_FORMAT_TEXT) ||
        (r->grammar && r->grammar_len != strlen(r->grammar)))
        abort();
    if (r->n_bias < 0 || r->n_bias > KIRI_API_MAX_LOGIT_BIAS)
        abort();
    for (int i = 0; i < r->n_bias; i++)
        if (r->bias_tokens[i] < 0 || r->bias_tokens[i] >= lim->n_vocab || !(r->bias_values[i] >= -100.0f) ||
            !(r->bias_values[i] <= 100.0f))
            abort();
    const struct kiri_sampling *s = &r->sampling;
    if (!(s->temperature >= 0 && s->temperature <= 2) || !(s->top_p > 0 && s->top_p <= 1) ||
        !(s->min_p >= 0 && s->min_p <= 1) || s->top_k < 0 || !(s->repeat_penalty > 0))
        abort();
    for (int i = 0; i < r->n_prompts; i++) {
        const struct kiri_api_prompt *p = &r->prompts[i];
        if ((p->text == NULL) == (p->tokens == NULL) || (p->tokens && p->n_tokens < 1))
            abort();
        for (int32_t k = 0; k < p->n_tokens; k++)
            if (p->tokens[k] < 0 || p->tokens[k] >= lim->n_vocab)
                abort();
    }
    for (int32_t i = 0; i < r->n_tokens; i++)
        if (r->tokens[i] < 0 || r->tokens[i] >= lim->n_vocab)
            abort();
    if (r->kind == KIRI_API_CHAT || r->kind == KIRI_API_RESPONSES) {
        if (r->n_messages < 1 || r->n_messages > lim->max_messages)
            abort();
        for (int i = 0; i < r->n_messages; i++)
            if (!r->messages[i].role || !r->messages[i].content)
                abort();
    }
    if (r->kind == KIRI_API_COMPLETIONS &&
        (r->n_prompts < 1 || r->n_prompts > KIRI_API_MAX_PROMPTS || r->n_prompts * r->n > KIRI_API_MAX_CHOICES))
        abort();
}

/* Writes the accepted request's text and ids back out as response bodies. */
static void echo_request(const struct kiri_api_request *r)
{
    const char *text = r->n_prompts && r->prompts[0].text ? r->prompts[0].text : r->content ? r->content : "";
    if (r->n_messages > 0)
        text = r->messages[r->n_messages - 1].content;
    struct kiri_api_choice c;
    memset(&c, 0, sizeof c);
    c.text = text;
    c.text_len = strlen(text);
    c.finish_reason = "stop";
    const struct kiri_api_prompt *p0 = r->n_prompts ? &r->prompts[0] : NULL;
    struct kiri_api_usage u = {p0 ? p0->n_tokens : 0, 1, 0};
    const struct kiri_api_envelope env = {"id", 1, r->model, "fp_0000000000000000"};
    if (r->kind == KIRI_API_RESPONSES) {
        struct kiri_responses_state st;
        memset(&st, 0, sizeof st);
        st.id = "resp_1";
        st.item_id = "msg_1";
        st.model = r->model;
        st.r = r;
        st.status = KIRI_RESPONSES_COMPLETED;
        st.text = text;
        st.text_len = strlen(text);
        st.has_usage = 1;
        must_parse(kiri_responses_json(&st));
        for (int ev = KIRI_RESPONSES_EV_CREATED; ev <= KIRI_RESPONSES_EV_FINISHED; ev++)
            must_parse(kiri_responses_event_json(ev, ev, &st, text, strlen(text), NULL));
        return;
    }
    int kind = r->kind == KIRI_API_CHAT ? KIRI_API_CHAT : KIRI_API_COMPLETIONS;
    must_parse(kiri_api_response_json(kind, &env, &c, 1, &u));
    must_parse(kiri_api_chunk_json(kind, &env, &c, 1, 1, NULL));
    must_parse(kiri_api_tokens_json(p0 && p0->tokens ? p0->tokens : r->tokens,
                                    p0 && p0->tokens ? p0->n_tokens : r->n_tokens));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const struct kiri_api_limits lim = {4096, 32000, 64};
    const char *body = (const char *)data;
    for (int kind = KIRI_API_COMPLETIONS; kind <= KIRI_API_RESPONSES; kind++) {
        struct kiri_api_request r;
        struct kiri_api_error e;
        int rc = kind == KIRI_API_RESPONSES ? kiri_responses_parse(body, size, &lim, &r, &e)
                                            : kiri_api_parse(body, size, kind, &lim, &r, &e);
        if (rc == 0) {
            if (r.kind != kind)
                abort();
            check_request(&r, &lim);
            echo_request(&r);
            kiri_api_request_free(&r);
        } else {
            if (rc != KIRI_E_INVALID_ARG || e.status != 400 || !e.message[0])
                abort();
            if (r.model || r.prompts || r.messages || r.n_stop || r.tokens || r.content || r.grammar ||
                r.bias_tokens || r.instructions)
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
    const struct kiri_api_envelope env = {"id", 1, "m", NULL};
    must_parse(kiri_api_chunk_json(KIRI_API_CHAT, &env, &c, 1, 0, NULL));
    c.n_unscored = 1;
    must_parse(kiri_api_response_json(KIRI_API_COMPLETIONS, &env, &c, 1, NULL));
    return 0;
}
