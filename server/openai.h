/* The OpenAI-compatible wire format: parsing and validating request bodies of /v1/completions,
 * /v1/chat/completions, /tokenize and /detokenize (with Jansson), and writing response bodies,
 * stream chunks and error objects. Pure functions over memory: no I/O, no model. (The
 * /v1/responses body is read by responses.h, on top of the building blocks at the end.)
 *
 * Parsing rules (documented for clients in docs/server.md): the body must be one JSON object,
 * UTF-8, at most the caller's byte limit, nested at most 64 deep; unknown fields are ignored;
 * duplicate keys: the last one wins; integers must be JSON integers in range (1.0 is refused for
 * an integer field); NaN/Infinity are refused; invalid UTF-8 and NUL characters in strings are
 * refused. Every refusal names the offending parameter.
 */
#ifndef KIRI_SERVER_OPENAI_H
#define KIRI_SERVER_OPENAI_H

#include <stddef.h>
#include <stdint.h>

#include "kiri.h"

enum kiri_api_kind {
    KIRI_API_COMPLETIONS,
    KIRI_API_CHAT,
    KIRI_API_TOKENIZE,      /* {"content": "text", "add_special": bool, "parse_special": bool} */
    KIRI_API_DETOKENIZE,    /* {"tokens": [ids]} */
    KIRI_API_RESPONSES      /* /v1/responses (responses.h): read as a chat request */
};

#define KIRI_API_MAX_STOP 4
#define KIRI_API_MAX_N 8
#define KIRI_API_MAX_STOP_LEN 256
/* Prompts in one /v1/completions request, and choices (prompts times n) in one response: each
 * choice is a sequence of the batching loop, submitted at once. */
#define KIRI_API_MAX_PROMPTS 32
#define KIRI_API_MAX_CHOICES 32
#define KIRI_API_MAX_LOGIT_BIAS 1024

/* What constrains the output (the request's grammar came from it). */
enum kiri_api_format {
    KIRI_API_FORMAT_TEXT,           /* nothing */
    KIRI_API_FORMAT_JSON_OBJECT,    /* response_format json_object: any JSON object */
    KIRI_API_FORMAT_JSON_SCHEMA,    /* response_format json_schema, or the json_schema extension */
    KIRI_API_FORMAT_GRAMMAR         /* the grammar extension (GBNF text) */
};

struct kiri_api_message {
    char *role;         /* owned: "system", "user", "assistant" or "tool" */
    char *content;      /* owned: text (content parts of type "text" joined) */
};

/* One prompt of /v1/completions: text, or token ids (each below the limits' n_vocab). */
struct kiri_api_prompt {
    char *text;             /* owned, or NULL when given as token ids */
    int32_t *tokens;        /* owned, or NULL when given as text */
    int32_t n_tokens;       /* >= 1 when given as token ids */
};

struct kiri_tool_call;

struct kiri_api_limits {
    int32_t max_tokens_cap;     /* largest max_tokens accepted (the context length) */
    int32_t n_vocab;            /* token ids in prompts must be below this */
    int max_messages;           /* e.g. 1024 */
};

struct kiri_api_request {
    int kind;                       /* enum kiri_api_kind */
    char *model;                    /* owned or NULL */
    /* completions: a string, a list of strings, token ids, or a list of token-id lists, read
     * as 1..KIRI_API_MAX_PROMPTS prompts (n_prompts * n <= KIRI_API_MAX_CHOICES) */
    struct kiri_api_prompt *prompts;    /* owned array */
    int n_prompts;
    int echo;                       /* completions: the prompt's text comes before each choice's */
    /* chat */
    struct kiri_api_message *messages;  /* owned array */
    int n_messages;
    /* tokenize / detokenize */
    char *content;                  /* owned (tokenize) */
    int add_special;                /* tokenize: add BOS (default 1) */
    int parse_special;              /* tokenize: match special-token text (default 0) */
    int32_t *tokens;                /* owned (detokenize) */
    int32_t n_tokens;
    /* generation */
    int32_t max_tokens;             /* -1 when absent (generate until EOS or the context ends) */
    int32_t max_tokens_asked;       /* the larger of max_tokens and max_completion_tokens; -1 when
                                       neither is present (kiri_api_within_limits) */
    struct kiri_sampling sampling;  /* OpenAI defaults when absent: temperature 1, top_p 1, no top-k,
                                       no min-p, no penalties; seed from the request or random */
    int has_seed;
    int n;                          /* 1..KIRI_API_MAX_N */
    char *stop[KIRI_API_MAX_STOP];  /* owned, non-empty, at most KIRI_API_MAX_STOP_LEN bytes each */
    int n_stop;
    int stream;
    int include_usage;              /* stream_options.include_usage */
    int logprobs;                   /* chat: bool; completions: integer N -> logprobs=1, top_logprobs=N */
    int top_logprobs;               /* 0..20 */
    int priority;                   /* -1000..1000, default 0 (an extension) */
    int speculative;                /* enum kiri_spec; -1 when absent (the server's default) */
    int32_t spec_max;               /* 1..KIRI_SPEC_MAX_DRAFT; 0 when absent (the server's default) */
    /* structured output: the GBNF text that response_format, grammar or json_schema (at most one
     * of them) asks for, NULL when the output is free */
    int format;                     /* enum kiri_api_format */
    char *grammar;                  /* owned NUL-terminated GBNF text, or NULL */
    size_t grammar_len;
    char *format_name;              /* owned: response_format.json_schema.name, or NULL */
    /* logit_bias: token ids below n_vocab, biases in [-100, 100] (owned, n_bias entries) */
    int32_t *bias_tokens;
    float *bias_values;
    int n_bias;
    /* responses: the instructions (owned, or NULL), written back into the response object */
    char *instructions;
    /* chat with tools. tools: the checked list of functions as compact JSON (owned), NULL when
     * absent or empty; every name matches [A-Za-z0-9_-]{1,64} and they are distinct.
     * messages_json: when there are tools or a message carries tool_calls, the conversation as
     * the chat template should see it (owned JSON array: role, content as text ("" for null),
     * tool_calls with arguments parsed to objects, tool_call_id, name), else NULL. */
    char *tools;
    size_t tools_len;
    char *messages_json;
    size_t messages_json_len;
    int tool_choice;                /* enum kiri_tool_choice (tools.h); AUTO when absent */
    char *tool_choice_name;         /* owned: the function tool_choice names, or NULL */
    int parallel_tool_calls;        /* default 1 */
};

/* An error for the client: HTTP status, OpenAI error type, the parameter at fault (may be
 * empty), a stable code (may be empty) and one sentence. */
struct kiri_api_error {
    int status;
    char type[48];
    char param[160];
    char code[48];
    char message[256];
};

/* Parses a body of the given kind. On failure returns KIRI_E_INVALID_ARG and fills err (status 400,
 * type "invalid_request_error"), or KIRI_E_NOMEM when an allocation failed (status 500, type
 * "server_error"), and leaves *out empty; on success the caller frees *out with
 * kiri_api_request_free. Send err->status as the HTTP status. */
int kiri_api_parse(const char *body, size_t len, int kind, const struct kiri_api_limits *lim,
                   struct kiri_api_request *out, struct kiri_api_error *err);
/* Whether a request kiri_api_parse accepted under looser limits keeps within lim: then parsing
 * its body under lim gives the same request, so it need not be parsed again. */
int kiri_api_within_limits(const struct kiri_api_request *r, const struct kiri_api_limits *lim);
void kiri_api_request_free(struct kiri_api_request *r);

/* Fills an error record (printf-style message). */
void kiri_api_error_set(struct kiri_api_error *e, int status, const char *type, const char *param,
                        const char *code, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* {"error":{"message","type","param","code"}} as an owned NUL-terminated string (kiri_mem_free);
 * NULL only when out of memory. */
char *kiri_api_error_json(const struct kiri_api_error *e);

/* ---- responses (all return owned NUL-terminated JSON, or NULL when out of memory) ---- */

struct kiri_api_choice {
    int index;
    const char *text;               /* generated text of this choice (UTF-8) */
    size_t text_len;
    const char *finish_reason;      /* "stop", "length", "tool_calls" or NULL while streaming */
    /* chat: the tool calls parsed from the output (a whole response), or none */
    const struct kiri_tool_call *tool_calls;
    int n_tool_calls;
    /* chat stream: when delta_call is set the chunk carries this fragment of call number
     * delta_call_index instead of text: with delta_call_head its id, type and name (arguments
     * ""), else arguments text delta_args[0..delta_args_len). */
    const struct kiri_tool_call *delta_call;
    int delta_call_index;
    int delta_call_head;
    const char *delta_args;
    size_t delta_args_len;
    /* log-probabilities: one entry per token, or none; the first n_unscored entries are echoed
     * prompt tokens, whose log-probabilities are not computed (written as null) */
    int n_logprobs;
    int n_unscored;
    const char *const *lp_tokens;   /* token texts */
    const size_t *lp_token_lens;
    const float *lp_values;
    int n_top;                      /* alternatives per token */
    const char *const *top_tokens;  /* n_logprobs * n_top */
    const size_t *top_token_lens;
    const float *top_values;
};

struct kiri_api_usage {
    int32_t prompt_tokens;
    int32_t completion_tokens;
    int32_t cached_tokens;          /* prompt_tokens_details.cached_tokens */
};

/* Identifies a response and every chunk of it. Strings borrowed. */
struct kiri_api_envelope {
    const char *id;
    int64_t created;
    const char *model;
    const char *fingerprint;        /* system_fingerprint (kiri_api_fingerprint), or NULL */
};

/* A stable system_fingerprint for what answers: "fp_" and 16 hex digits of a hash of kiri's
 * version, the backend and the model (its id and its file's sha256, which may be ""). */
void kiri_api_fingerprint(const char *backend, const char *model_id, const char *model_sha256,
                          char out[20]);

/* A whole (non-streamed) response: "text_completion" or "chat.completion". */
char *kiri_api_response_json(int kind, const struct kiri_api_envelope *env,
                             const struct kiri_api_choice *choices, int n_choices,
                             const struct kiri_api_usage *usage);
/* One stream chunk: "text_completion" or "chat.completion.chunk" (with delta.role on the first
 * chunk of a chat choice when first_chunk is set, delta.content otherwise). usage may be NULL;
 * with n_choices 0 and usage set this is the final usage chunk. */
char *kiri_api_chunk_json(int kind, const struct kiri_api_envelope *env,
                          const struct kiri_api_choice *choices, int n_choices, int first_chunk,
                          const struct kiri_api_usage *usage);
/* /v1/models: {"object":"list","data":[{"id","object":"model","created","owned_by":"kiri"}]} */
char *kiri_api_models_json(const char *const *ids, int n, int64_t created);
/* /tokenize: {"tokens":[...]} and /detokenize: {"content":"..."} */
char *kiri_api_tokens_json(const int32_t *ids, int n);
char *kiri_api_content_json(const char *text, size_t len);

/* ---- building blocks for the other request readers (responses.h) ----
 *
 * They follow the parsing rules above. json_t is Jansson's value (struct json_t). */
struct json_t;

/* Reads a body into a JSON value after the raw-byte checks (depth, -0) and with Jansson's
 * allocations routed through kiri_mem. *root is a new reference (json_decref) on success; on
 * failure err is filled as kiri_api_parse fills it. */
int kiri_api_load(const char *body, size_t len, struct json_t **root, struct kiri_api_error *err);
/* kiri_api_parse on an already loaded object (kind KIRI_API_COMPLETIONS or KIRI_API_CHAT). */
int kiri_api_parse_value(struct json_t *body, int kind, const struct kiri_api_limits *lim,
                         struct kiri_api_request *out, struct kiri_api_error *err);
/* Reads an output format into r (format, grammar, format_name), which must hold none yet:
 * {"type": "text" | "json_object" | "json_schema", ...} where a json_schema's name, schema and
 * strict sit in a "json_schema" object (response_format) or, when flat, beside type (the
 * Responses API's text.format). param names the object in errors ("response_format",
 * "text.format"); a schema the compiler cannot honour is named by param, the path to the schema
 * and its JSON pointer. KIRI_OK, or KIRI_E_INVALID_ARG / KIRI_E_NOMEM with err filled. */
int kiri_api_parse_format(struct json_t *format, const char *param, int flat, struct kiri_api_request *r,
                          struct kiri_api_error *err);
/* A JSON string of s[0..n), each invalid UTF-8 byte replaced by U+FFFD (new reference, NULL when
 * out of memory), and a value written compactly as kiri_api_* bodies are (owned text; the value's
 * reference is consumed; NULL when out of memory or root is NULL). */
struct json_t *kiri_api_json_text(const char *s, size_t n);
char *kiri_api_json_dump(struct json_t *root);

#endif
