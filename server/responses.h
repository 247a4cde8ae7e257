/* OpenAI's Responses API (/v1/responses), stateless: reading a request body into the same request
 * a chat completion makes (openai.h), and writing the response object and the events of its
 * stream. Pure functions over memory, like openai.h.
 *
 * Reading (docs/server.md repeats it): `input` is a string (one user message) or a list of
 * items: messages ({"type":"message"} or no type) with role user, system, developer or
 * assistant and content as a string or a list of input_text / output_text parts; reasoning
 * items are skipped (they carry nothing a stateless server can use). `instructions` becomes a
 * system message before the input. `max_output_tokens`, `temperature`, `top_p`, `stream` and
 * kiri's sampling extensions (top_k, min_p, seed, penalties, priority) read as in a chat
 * completion; `text.format` is {"type":"text"}, {"type":"json_object"} or {"type":
 * "json_schema","name","schema","strict"} (the flat form of response_format). Function tools are
 * flat ({"type":"function","name","description","parameters","strict"}; other tool types are a 400
 * naming tools[i].type); tool_choice is "none", "auto", "required" or {"type":"function","name"};
 * parallel_tool_calls as in a chat completion. A function_call item ({"call_id","name",
 * "arguments"}) becomes an assistant tool call (consecutive ones, and a message item just before
 * them, one assistant message); a function_call_output item ({"call_id","output"}) a tool message
 * that must answer an earlier function_call (else a 400 naming input[i].call_id). Nothing is stored:
 * `store` is accepted and every response says "store": false; `previous_response_id`,
 * `conversation`, `background` and item references are refused (400, code
 * "unsupported_parameter"), so a client never believes a conversation was kept. Errors name the
 * Responses field ("input[2].content[0].type", "text.format.schema/properties/x", "tools[0].name").
 *
 * Writing: the response object {"id","object":"response","created_at","status","output":[a
 * message item with one output_text part, at output_index message_index, and a function_call item
 * {"type":"function_call","id":"fc_...","call_id","name","arguments","status"} per call; no
 * message item when no_message],"usage":{"input_tokens","output_tokens",
 * "total_tokens",...},...}; status "completed", "incomplete" (incomplete_details.reason
 * "max_output_tokens") or "failed". A stream is the event sequence response.created,
 * response.in_progress, response.output_item.added, response.content_part.added,
 * response.output_text.delta (one per piece of text), response.output_text.done,
 * response.content_part.done, response.output_item.done and response.completed (or
 * response.incomplete / response.failed), each with its sequence_number. A call streams as
 * response.output_item.added (arguments "", status in_progress),
 * response.function_call_arguments.delta, response.function_call_arguments.done and
 * response.output_item.done (kiri_responses_call_event_json).
 */
#ifndef KIRI_SERVER_RESPONSES_H
#define KIRI_SERVER_RESPONSES_H

#include <stddef.h>
#include <stdint.h>

#include "openai.h"

struct kiri_tool_call;

/* Parses a /v1/responses body into *out (kind KIRI_API_RESPONSES, messages as a chat request's,
 * instructions kept), as kiri_api_parse does: KIRI_OK, or KIRI_E_INVALID_ARG / KIRI_E_NOMEM with
 * err filled and *out left empty. The caller frees *out with kiri_api_request_free. */
int kiri_responses_parse(const char *body, size_t len, const struct kiri_api_limits *lim,
                         struct kiri_api_request *out, struct kiri_api_error *err);

/* A chat request's error field as the Responses field it came from, in place:
 * "tools[1].function.parameters/properties/x" becomes "tools[1].parameters/properties/x". */
void kiri_responses_param(char *param);

enum kiri_responses_status {
    KIRI_RESPONSES_IN_PROGRESS,
    KIRI_RESPONSES_COMPLETED,
    KIRI_RESPONSES_INCOMPLETE,      /* the token limit or the context ended it */
    KIRI_RESPONSES_FAILED           /* the model failed while generating */
};

/* What a response says about itself at one moment. Strings and r are borrowed. */
struct kiri_responses_state {
    const char *id;                 /* "resp_..." */
    const char *item_id;            /* the message item's, "msg_..." */
    int64_t created;
    const char *model;
    const struct kiri_api_request *r;   /* the parsed request (instructions, sampling, format) */
    int status;                     /* enum kiri_responses_status */
    const char *text;               /* the output text so far (all of it once finished) */
    size_t text_len;
    int has_usage;
    struct kiri_api_usage usage;
    /* Items: the message item sits at output_index message_index among the calls (0: first);
     * no_message: there is none (calls and no text). */
    int no_message;
    int message_index;
    const struct kiri_tool_call *calls;   /* n_calls of them, contiguous */
    int n_calls;
    const char *grammar_error;      /* failed: the grammar bound that ended it (borrowed), or NULL */
};

/* The response object (owned JSON text, NULL when out of memory). */
char *kiri_responses_json(const struct kiri_responses_state *st);

enum kiri_responses_event {
    KIRI_RESPONSES_EV_CREATED,      /* response.created */
    KIRI_RESPONSES_EV_IN_PROGRESS,  /* response.in_progress */
    KIRI_RESPONSES_EV_ITEM_ADDED,   /* response.output_item.added */
    KIRI_RESPONSES_EV_PART_ADDED,   /* response.content_part.added */
    KIRI_RESPONSES_EV_TEXT_DELTA,   /* response.output_text.delta: delta[0..delta_len) */
    KIRI_RESPONSES_EV_TEXT_DONE,    /* response.output_text.done */
    KIRI_RESPONSES_EV_PART_DONE,    /* response.content_part.done */
    KIRI_RESPONSES_EV_ITEM_DONE,    /* response.output_item.done */
    KIRI_RESPONSES_EV_FINISHED      /* response.completed, .incomplete or .failed, by st->status */
};

/* One event's JSON (owned, NULL when out of memory) and its type name in *type (static text),
 * the SSE "event:" line. */
char *kiri_responses_event_json(int event, int64_t sequence, const struct kiri_responses_state *st,
                                const char *delta, size_t delta_len, const char **type);

enum kiri_responses_call_event {
    KIRI_RESPONSES_EV_CALL_ADDED,       /* response.output_item.added, arguments "" */
    KIRI_RESPONSES_EV_CALL_ARGS_DELTA,  /* response.function_call_arguments.delta: all of them */
    KIRI_RESPONSES_EV_CALL_ARGS_DONE,   /* response.function_call_arguments.done */
    KIRI_RESPONSES_EV_CALL_DONE         /* response.output_item.done */
};

/* One event of call k (< st->n_calls), as kiri_responses_event_json. */
char *kiri_responses_call_event_json(int event, int64_t sequence, const struct kiri_responses_state *st, int k,
                                     const char **type);

#endif
