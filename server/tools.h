/* OpenAI tool calling for a chat model: which tool-call syntax a model's chat template speaks, the
 * grammar that makes its calls parse (tool names as a choice, arguments constrained by each
 * function's parameter schema), and the parser that turns the model's output back into content
 * plus tool calls, whole or as it streams. Pure functions over memory (Jansson for JSON).
 *
 * Formats (kiri_tools_detect reads them from the template text):
 *   HERMES   Hermes / Qwen 2.5 / Qwen 3: <tool_call>\n{"name": N, "arguments": {...}}\n</tool_call>,
 *            one block per call.
 *   LLAMA3   Llama 3.1-3.3: a JSON object {"name": N, "parameters": {...}}, optionally after
 *            <|python_tag|>; several separated by ';'.
 *   MISTRAL  [TOOL_CALLS] then a JSON list of {"name", "arguments"} objects (v3), or
 *            [TOOL_CALLS]N[ARGS]{...} per call (v11 and later, with an optional [CALL_ID]id).
 *   GEMMA    FunctionGemma: <start_function_call>call:N{key:<escape>text<escape>,k:1}<end_function_call>.
 *   GENERIC  a template without tool syntax: kiri describes the tools in a system message and the
 *            whole output is one JSON object, {"tool_calls": [{"name", "arguments"}, ...]} or
 *            {"response": "text"} (with tool_choice auto; only the first with required), with at
 *            most as many calls as there are tools.
 *
 * A tools list given to this module is the JSON text openai.c checked: an array of
 * {"type":"function","function":{"name","description"?,"parameters"?}} whose names match
 * [A-Za-z0-9_-]{1,64} and are distinct.
 */
#ifndef KIRI_SERVER_TOOLS_H
#define KIRI_SERVER_TOOLS_H

#include <stddef.h>
#include <stdint.h>

struct kiri_status_info;

enum kiri_tools_format {
    KIRI_TOOLS_GENERIC,
    KIRI_TOOLS_HERMES,
    KIRI_TOOLS_LLAMA3,
    KIRI_TOOLS_MISTRAL,
    KIRI_TOOLS_GEMMA
};

enum kiri_tool_choice {
    KIRI_TOOL_CHOICE_AUTO,     /* free text or calls (the default with tools) */
    KIRI_TOOL_CHOICE_NONE,     /* no calls */
    KIRI_TOOL_CHOICE_REQUIRED, /* at least one call */
    KIRI_TOOL_CHOICE_NAMED     /* exactly the named function */
};

/* The format a chat template's source speaks (GENERIC when it has no tool syntax kiri knows). */
int kiri_tools_detect(const char *template_src, size_t len);
/* "generic", "hermes", ... for logs and tests. */
const char *kiri_tools_format_name(int format);

/* What a request with tools needs from generation. All strings owned (kiri_tools_plan_free). */
struct kiri_tools_plan {
    char *grammar;         /* GBNF text, or NULL when the output is free (tool_choice none) */
    size_t grammar_len;
    char *triggers[3];     /* non-empty: the grammar is lazy and starts at one of these */
    int n_triggers;
};

/* Builds the plan for tools (JSON text, see above) under choice (named: the function's name) and
 * parallel (0: at most one call). Each function's parameters (absent: an object with any
 * properties) is compiled with the JSON Schema compiler; a schema it refuses is
 * KIRI_E_INVALID_ARG or KIRI_E_UNSUPPORTED with info->field "tools[i].function.parameters..."
 * (with the subschema's JSON pointer) and the compiler's message. messages (the conversation as
 * JSON, may be NULL) matters to the GENERIC format under auto only: it offers the functions not
 * called since the last user message, and only the {"response"} form once all have been (a
 * model without tool training otherwise repeats its calls forever). On failure *plan is empty. */
int kiri_tools_plan_init(int format, const char *tools, size_t tools_len, int choice, const char *named,
                         int parallel, const char *messages, size_t messages_len, struct kiri_tools_plan *plan,
                         struct kiri_status_info *info);
void kiri_tools_plan_free(struct kiri_tools_plan *plan);

/* For the GENERIC format: the messages (JSON array text) as the template should see them. A
 * system message describing the tools and the reply format is put first (merged into the
 * conversation's own system message when there is one) unless choice is NONE; an assistant
 * message's tool_calls become its content, as the JSON the model is asked to write; a tool
 * result stays a "tool" message whose content names the call. *out is owned (kiri_mem_free). */
int kiri_tools_generic_messages(const char *messages, size_t messages_len, const char *tools, size_t tools_len,
                                int choice, const char *named, int parallel, char **out, size_t *out_len,
                                struct kiri_status_info *info);

/* ---- parsing the model's output ---- */

/* One parsed call. Strings owned by the parser. arguments is compact JSON text (an object). */
struct kiri_tool_call {
    char id[40];           /* "call_" + 24 letters and digits; 9 of them for MISTRAL */
    char *name;
    char *arguments;
};

struct kiri_tools_parser;

/* A parser for one choice's output in format; seed makes the call ids (distinct seeds, distinct
 * ids); parallel 0 keeps only the first call. *out is owned (kiri_tools_parser_free). */
int kiri_tools_parser_init(int format, int parallel, uint64_t seed, struct kiri_tools_parser **out);
void kiri_tools_parser_free(struct kiri_tools_parser *p);
/* Feeds more output text; content and calls found so far grow. KIRI_E_NOMEM on failure. */
int kiri_tools_parser_feed(struct kiri_tools_parser *p, const char *text, size_t len);
/* The output is complete: text held back (a possible start of a call) or an unfinished call
 * becomes content. */
int kiri_tools_parser_finish(struct kiri_tools_parser *p);
/* The content decided so far (text that is not part of a call): bytes [0, *len) of a buffer that
 * only grows; valid until the next feed or finish. Never NULL. */
const char *kiri_tools_parser_content(const struct kiri_tools_parser *p, size_t *len);
/* Calls complete so far; call i stays valid until the parser is freed. */
int kiri_tools_parser_n_calls(const struct kiri_tools_parser *p);
const struct kiri_tool_call *kiri_tools_parser_call(const struct kiri_tools_parser *p, int i);

#endif
