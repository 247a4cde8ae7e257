/* OpenAI tool calling (tools.h): format detection, the call grammars, the generic format's
 * messages, and the output parser.
 */
#include "tools.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "error.h"
#include "json_schema.h"
#include "kiri.h"
#include "mem.h"
#include "utf8.h"

#define MAX_TOOLS 128
#define MAX_CALLS 64          /* calls kept from one output */
#define MAX_NEST 64           /* nesting of FunctionGemma values */

/* Frees what json_dumps returned, with the allocator Jansson was given. */
static void json_free(void *p)
{
    json_malloc_t m;
    json_free_t f;
    json_get_alloc_funcs(&m, &f);
    if (p)
        f(p);
}

/* ---------------------------------------------------------------------------------------------
 * Formats
 * ------------------------------------------------------------------------------------------- */

static int has(const char *s, size_t n, const char *what)
{
    const size_t w = strlen(what);
    for (size_t i = 0; i + w <= n; i++)
        if (s[i] == what[0] && memcmp(s + i, what, w) == 0)
            return 1;
    return 0;
}

int kiri_tools_detect(const char *src, size_t len)
{
    if (!src)
        return KIRI_TOOLS_GENERIC;
    if (has(src, len, "<tool_call>"))
        return KIRI_TOOLS_HERMES;
    if (has(src, len, "[TOOL_CALLS]"))
        return KIRI_TOOLS_MISTRAL;
    if (has(src, len, "<start_function_call>"))
        return KIRI_TOOLS_GEMMA;
    if (has(src, len, "<|python_tag|>") || (has(src, len, "<|start_header_id|>") && has(src, len, "\"parameters\"")))
        return KIRI_TOOLS_LLAMA3;
    return KIRI_TOOLS_GENERIC;
}

const char *kiri_tools_format_name(int format)
{
    static const char *const names[] = {"generic", "hermes", "llama3", "mistral", "gemma"};
    return format >= 0 && format <= KIRI_TOOLS_GEMMA ? names[format] : "unknown";
}

/* ---------------------------------------------------------------------------------------------
 * Grammars
 * ------------------------------------------------------------------------------------------- */

/* s as a GBNF string literal. */
static void put_literal(struct kiri_buf *b, const char *s)
{
    kiri_buf_putc(b, '"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            kiri_buf_putc(b, '\\');
        if (*s == '\n')
            kiri_buf_puts(b, "\\n");
        else
            kiri_buf_putc(b, *s);
    }
    kiri_buf_putc(b, '"');
}

/* A JSON string, for the generic format's response. */
static const char JSON_STRING_RULES[] =
    "kiri-string ::= \"\\\"\" kiri-char* \"\\\"\"\n"
    "kiri-char ::= [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] "
    "[0-9a-fA-F])\n";

/* FunctionGemma's argument syntax, loosely: keys and <escape>-quoted text, numbers, literals,
 * nested objects and lists. (Its values are not JSON, so the parameter schema is not applied.) */
static const char GEMMA_ARG_RULES[] =
    "fg-pairs ::= (fg-pair (\",\" fg-pair)*)?\n"
    "fg-pair ::= [A-Za-z0-9_]+ \":\" fg-value\n"
    "fg-value ::= \"<escape>\" fg-text \"<escape>\" | \"-\"? [0-9]+ (\".\" [0-9]+)? | \"true\" | \"false\" | "
    "\"null\" | \"{\" fg-pairs \"}\" | \"[\" (fg-value (\",\" fg-value)*)? \"]\"\n"
    "fg-text ::= ([^<] | \"<\" [^e])*\n";

static const char *tool_name(json_t *tool)
{
    return json_string_value(json_object_get(json_object_get(tool, "function"), "name"));
}

/* Rules tool<i>-args for tool i's parameters, from the schema compiler. */
static int put_arguments(struct kiri_buf *b, json_t *tool, size_t i, struct kiri_status_info *info)
{
    json_t *params = json_object_get(json_object_get(tool, "function"), "parameters");
    char *schema = params ? json_dumps(params, JSON_COMPACT) : NULL;
    const char *text = schema ? schema : "{\"type\":\"object\"}";
    char root[32], prefix[32];
    snprintf(root, sizeof root, "tool%zu-args", i);
    snprintf(prefix, sizeof prefix, "tool%zu-", i);
    char *gbnf = NULL;
    size_t len = 0;
    int rc = kiri_json_schema_to_gbnf(text, strlen(text), root, prefix, &gbnf, &len, info);
    json_free(schema);
    if (rc != KIRI_OK) {
        /* The compiler names the subschema by JSON pointer ("#/properties/x" or "/properties/x"). */
        const char *at = info->field[0] == '#' ? info->field + 1 : info->field[0] == '/' ? info->field : "";
        char field[160];
        snprintf(field, sizeof field, "tools[%zu].function.parameters%s", i, at);
        const size_t keep = strlen(field) < sizeof info->field ? strlen(field) : sizeof info->field - 1;
        memcpy(info->field, field, keep);
        info->field[keep] = '\0';
        return rc;
    }
    kiri_buf_append(b, gbnf, len);
    kiri_buf_putc(b, '\n');
    kiri_mem_free(gbnf);
    return KIRI_OK;
}

/* tool<i>-call: the call of tool i in the format's JSON (or FunctionGemma's syntax). */
static void put_call_rule(struct kiri_buf *b, int format, const char *name, size_t i)
{
    char head[160];
    kiri_buf_printf(b, "tool%zu-call ::= ", i);
    if (format == KIRI_TOOLS_GEMMA) {
        snprintf(head, sizeof head, "%s{", name);
        put_literal(b, head);
        kiri_buf_puts(b, " fg-pairs \"}\"\n");
        return;
    }
    snprintf(head, sizeof head, "{\"name\": \"%s\", \"%s\": ", name,
             format == KIRI_TOOLS_LLAMA3 ? "parameters" : "arguments");
    put_literal(b, head);
    kiri_buf_printf(b, " tool%zu-args \"}\"\n", i);
}

/* The names of the functions called since the conversation's last user message (an object of
 * names), or NULL. */
static json_t *called_since_user(const char *messages, size_t len)
{
    json_error_t je;
    json_t *msgs = messages ? json_loadb(messages, len, 0, &je) : NULL;
    json_t *names = json_is_array(msgs) ? json_object() : NULL;
    for (size_t i = json_array_size(msgs); names && i-- > 0;) {
        json_t *m = json_array_get(msgs, i);
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && strcmp(role, "user") == 0)
            break;
        json_t *calls = json_object_get(m, "tool_calls");
        for (size_t k = 0; k < json_array_size(calls); k++) {
            json_t *name = json_object_get(json_object_get(json_array_get(calls, k), "function"), "name");
            if (json_is_string(name))
                json_object_set_new(names, json_string_value(name), json_true());
        }
    }
    json_decref(msgs);
    return names;
}

int kiri_tools_plan_init(int format, const char *tools, size_t tools_len, int choice, const char *named,
                         int parallel, const char *messages, size_t messages_len, struct kiri_tools_plan *plan,
                         struct kiri_status_info *info)
{
    memset(plan, 0, sizeof *plan);
    if (choice == KIRI_TOOL_CHOICE_NONE)
        return KIRI_OK;
    json_error_t je;
    json_t *list = json_loadb(tools, tools_len, 0, &je);
    if (!json_is_array(list) || json_array_size(list) == 0 || json_array_size(list) > MAX_TOOLS) {
        json_decref(list);
        return kiri_error_at(info, KIRI_E_INVALID_ARG, "tools", -1, "tools must be a list of 1 to %d functions",
                             MAX_TOOLS);
    }
    /* A model without tool syntax, left to choose, calls the same tools again and again, so the
     * generic form offers only the tools not yet called since the user spoke (and, when every
     * one has been, only the answer). */
    const int generic_auto = format == KIRI_TOOLS_GENERIC && choice == KIRI_TOOL_CHOICE_AUTO;
    json_t *called = generic_auto ? called_since_user(messages, messages_len) : NULL;
    struct kiri_buf b = {0};
    int rc = KIRI_OK;
    size_t n_used = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *name = tool_name(json_array_get(list, i));
        if ((choice == KIRI_TOOL_CHOICE_NAMED && (!named || strcmp(name, named) != 0)) ||
            json_object_get(called, name))
            continue;
        kiri_buf_printf(&b, "%stool%zu-call", n_used++ ? " | " : "call ::= ", i);
    }
    json_decref(called);
    if (n_used == 0 && !generic_auto)
        rc = kiri_error_at(info, KIRI_E_INVALID_ARG, "tool_choice", -1, "tool_choice names no function in tools");
    kiri_buf_putc(&b, '\n');
    /* Every function's parameters are compiled (a bad schema is refused whatever is offered). */
    for (size_t i = 0; rc == KIRI_OK && i < json_array_size(list); i++) {
        json_t *tool = json_array_get(list, i);
        put_call_rule(&b, format, tool_name(tool), i);
        if (format != KIRI_TOOLS_GEMMA)
            rc = put_arguments(&b, tool, i, info);
    }
    json_decref(list);

    const int many = parallel && choice != KIRI_TOOL_CHOICE_NAMED;
    const int lazy = choice == KIRI_TOOL_CHOICE_AUTO && format != KIRI_TOOLS_GENERIC;
    switch (format) {
    case KIRI_TOOLS_HERMES:
        kiri_buf_printf(&b, "one ::= \"<tool_call>\\n\" call \"\\n</tool_call>\"\nroot ::= one%s\n",
                        many ? " (\"\\n\" one)*" : "");
        plan->triggers[plan->n_triggers++] = kiri_mem_strndup("<tool_call>", 11);
        break;
    case KIRI_TOOLS_LLAMA3:
        kiri_buf_printf(&b, "root ::= \"<|python_tag|>\"? call%s\n", many ? " (\"; \" call)*" : "");
        plan->triggers[plan->n_triggers++] = kiri_mem_strndup("<|python_tag|>", 14);
        plan->triggers[plan->n_triggers++] = kiri_mem_strndup("{\"name\":", 8);
        break;
    case KIRI_TOOLS_MISTRAL:
        kiri_buf_printf(&b, "root ::= \"[TOOL_CALLS]\"? \"[\" call%s \"]\"\n", many ? " (\", \" call)*" : "");
        plan->triggers[plan->n_triggers++] = kiri_mem_strndup("[TOOL_CALLS]", 12);
        break;
    case KIRI_TOOLS_GEMMA:
        kiri_buf_printf(&b, "one ::= \"<start_function_call>call:\" call \"<end_function_call>\"\nroot ::= one%s\n%s",
                        many ? "+" : "", GEMMA_ARG_RULES);
        plan->triggers[plan->n_triggers++] = kiri_mem_strndup("<start_function_call>", 21);
        break;
    default:
        /* Small models without tool training repeat a call until the tokens run out, so the
         * generic form takes at most as many calls as there are tools. */
        if (many && n_used > 1)
            kiri_buf_printf(&b, "calls ::= \"{\\\"tool_calls\\\": [\" call (\", \" call){0,%zu} \"]}\"\n",
                            n_used - 1);
        else if (n_used > 0)
            kiri_buf_puts(&b, "calls ::= \"{\\\"tool_calls\\\": [\" call \"]}\"\n");
        if (choice == KIRI_TOOL_CHOICE_AUTO)
            kiri_buf_printf(&b, "root ::= %s\"{\\\"response\\\": \" kiri-string \"}\"\n%s", n_used ? "calls | " : "",
                            JSON_STRING_RULES);
        else
            kiri_buf_puts(&b, "root ::= calls\n");
        break;
    }
    if (!lazy)
        for (int i = 0; i < plan->n_triggers; i++) {
            kiri_mem_free(plan->triggers[i]);
            plan->triggers[i] = NULL;
        }
    if (!lazy)
        plan->n_triggers = 0;
    for (int i = 0; i < plan->n_triggers; i++)
        if (!plan->triggers[i])
            b.failed = 1;
    if (rc == KIRI_OK && b.failed)
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory building the tool-call grammar");
    if (rc != KIRI_OK) {
        kiri_buf_free(&b);
        kiri_tools_plan_free(plan);
        return rc;
    }
    plan->grammar = kiri_buf_take(&b, &plan->grammar_len);
    return KIRI_OK;
}

void kiri_tools_plan_free(struct kiri_tools_plan *plan)
{
    if (!plan)
        return;
    kiri_mem_free(plan->grammar);
    for (int i = 0; i < plan->n_triggers; i++)
        kiri_mem_free(plan->triggers[i]);
    memset(plan, 0, sizeof *plan);
}

/* ---------------------------------------------------------------------------------------------
 * The generic format's messages
 * ------------------------------------------------------------------------------------------- */

static int append_tools_text(struct kiri_buf *b, json_t *tools, int choice, const char *named, int parallel)
{
    kiri_buf_puts(b, "You can call these tools (JSON Schema of each one's arguments):\n");
    for (size_t i = 0; i < json_array_size(tools); i++) {
        char *fn = json_dumps(json_object_get(json_array_get(tools, i), "function"), JSON_COMPACT);
        if (!fn)
            return -1;
        kiri_buf_puts(b, fn);
        kiri_buf_putc(b, '\n');
        json_free(fn);
    }
    const char *call = parallel ? "{\"tool_calls\": [{\"name\": \"TOOL_NAME\", \"arguments\": {...}}, ...]}"
                                : "{\"tool_calls\": [{\"name\": \"TOOL_NAME\", \"arguments\": {...}}]}";
    if (choice == KIRI_TOOL_CHOICE_AUTO)
        kiri_buf_printf(b, "\nReply with one JSON object and nothing else: %s to call tools, or "
                           "{\"response\": \"...\"} to answer the user directly, in words. Once the results "
                           "you need are in the conversation, do not call again: answer with them.", call);
    else if (choice == KIRI_TOOL_CHOICE_NAMED)
        kiri_buf_printf(b, "\nReply by calling the tool %s, with one JSON object and nothing else: %s",
                        named ? named : "", call);
    else
        kiri_buf_printf(b, "\nReply by calling tools, with one JSON object and nothing else: %s", call);
    return 0;
}

/* An assistant message's tool_calls as the JSON the model writes in the generic format. */
static char *calls_text(json_t *calls)
{
    json_t *out = json_array();
    for (size_t i = 0; out && i < json_array_size(calls); i++) {
        json_t *fn = json_object_get(json_array_get(calls, i), "function");
        json_t *args = json_object_get(fn, "arguments");
        json_array_append_new(out, json_pack("{s:O?,s:O?}", "name", json_object_get(fn, "name"), "arguments", args));
    }
    json_t *wrap = out ? json_pack("{s:o}", "tool_calls", out) : NULL;
    char *s = wrap ? json_dumps(wrap, 0) : NULL;
    json_decref(wrap);
    return s;
}

int kiri_tools_generic_messages(const char *messages, size_t messages_len, const char *tools, size_t tools_len,
                                int choice, const char *named, int parallel, char **out, size_t *out_len,
                                struct kiri_status_info *info)
{
    json_error_t je;
    json_t *msgs = json_loadb(messages, messages_len, 0, &je);
    json_t *list = tools ? json_loadb(tools, tools_len, 0, &je) : NULL;
    int rc = json_is_array(msgs) ? KIRI_OK
                                 : kiri_error_at(info, KIRI_E_INVALID_ARG, "messages", -1, "messages must be a list");
    json_t *names = json_object(); /* call id -> function name */
    if (!names)
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory rewriting the messages");
    for (size_t i = 0; rc == KIRI_OK && i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        json_t *calls = json_object_get(m, "tool_calls");
        const char *role = json_string_value(json_object_get(m, "role"));
        if (role && strcmp(role, "tool") == 0) {
            /* A template without tool syntax knows users and assistants: the result comes back
             * as a user turn saying which call it answers. */
            json_t *name = json_object_get(m, "name");
            json_t *id = json_object_get(m, "tool_call_id");
            if (!json_is_string(name) && json_is_string(id))
                name = json_object_get(names, json_string_value(id));
            json_t *content = json_object_get(m, "content");
            json_t *text = json_sprintf("Result of %s: %s", json_is_string(name) ? json_string_value(name) : "the tool",
                                        json_is_string(content) ? json_string_value(content) : "");
            if (!text || json_object_set_new(m, "content", text) || json_object_set_new(m, "role", json_string("user")))
                rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory rewriting the messages");
            continue;
        }
        if (!json_is_array(calls))
            continue;
        for (size_t k = 0; k < json_array_size(calls); k++) {
            json_t *c = json_array_get(calls, k);
            json_t *id = json_object_get(c, "id");
            json_t *name = json_object_get(json_object_get(c, "function"), "name");
            if (json_is_string(id) && json_is_string(name))
                json_object_set(names, json_string_value(id), name);
        }
        char *text = calls_text(calls);
        if (!text || json_object_set_new(m, "content", json_string(text)) != 0 ||
            json_object_del(m, "tool_calls") != 0)
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory rewriting the messages");
        json_free(text);
    }
    if (rc == KIRI_OK && choice != KIRI_TOOL_CHOICE_NONE && json_is_array(list)) {
        struct kiri_buf b = {0};
        json_t *first = json_array_get(msgs, 0);
        const char *role = json_string_value(json_object_get(first, "role"));
        const int merge = role && strcmp(role, "system") == 0 && json_is_string(json_object_get(first, "content"));
        if (merge) {
            kiri_buf_puts(&b, json_string_value(json_object_get(first, "content")));
            kiri_buf_puts(&b, "\n\n");
        }
        if (append_tools_text(&b, list, choice, named, parallel) < 0 || b.failed)
            rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory rewriting the messages");
        else if (merge)
            json_object_set_new(first, "content", json_stringn(b.data, b.len));
        else
            json_array_insert_new(msgs, 0, json_pack("{s:s,s:s%}", "role", "system", "content", b.data, b.len));
        kiri_buf_free(&b);
    }
    char *text = rc == KIRI_OK ? json_dumps(msgs, JSON_COMPACT) : NULL;
    json_decref(names);
    json_decref(msgs);
    json_decref(list);
    if (rc == KIRI_OK && !text)
        rc = kiri_error_set(info, KIRI_E_NOMEM, "out of memory rewriting the messages");
    if (rc != KIRI_OK)
        return rc;
    *out_len = strlen(text);
    *out = kiri_mem_strndup(text, *out_len);
    json_free(text);
    return *out ? KIRI_OK : kiri_error_set(info, KIRI_E_NOMEM, "out of memory rewriting the messages");
}

/* ---------------------------------------------------------------------------------------------
 * The parser
 * ------------------------------------------------------------------------------------------- */

struct kiri_tools_parser {
    int format, parallel;
    uint64_t seed;
    struct kiri_buf all;      /* every byte fed */
    size_t pos;               /* all[0..pos) is decided: content or calls */
    int in_call;              /* all[pos..] starts with a call's marker */
    int finished;
    size_t response_at;       /* GENERIC: how far the {"response": "..."} string is decoded, or 0 */
    int generic_done;         /* GENERIC: the object was read; what follows it is dropped */
    struct kiri_buf content;
    struct kiri_tool_call *calls;
    int n_calls;
};

static const char *const HERMES_MARKS[] = {"<tool_call>", NULL};
static const char *const LLAMA3_MARKS[] = {"<|python_tag|>", "{\"name\"", "{\"type\": \"function\"", NULL};
static const char *const MISTRAL_MARKS[] = {"[TOOL_CALLS]", "[{\"name\"", NULL};
static const char *const GEMMA_MARKS[] = {"<start_function_call>", NULL};

static const char *const *marks_of(int format)
{
    switch (format) {
    case KIRI_TOOLS_HERMES: return HERMES_MARKS;
    case KIRI_TOOLS_LLAMA3: return LLAMA3_MARKS;
    case KIRI_TOOLS_MISTRAL: return MISTRAL_MARKS;
    case KIRI_TOOLS_GEMMA: return GEMMA_MARKS;
    default: return NULL;
    }
}

int kiri_tools_parser_init(int format, int parallel, uint64_t seed, struct kiri_tools_parser **out)
{
    struct kiri_tools_parser *p = kiri_mem_calloc(1, sizeof *p);
    if (!p)
        return KIRI_E_NOMEM;
    p->format = format;
    p->parallel = parallel;
    p->seed = seed;
    p->calls = kiri_mem_calloc(MAX_CALLS, sizeof *p->calls);
    if (!p->calls) {
        kiri_mem_free(p);
        return KIRI_E_NOMEM;
    }
    *out = p;
    return KIRI_OK;
}

void kiri_tools_parser_free(struct kiri_tools_parser *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_calls; i++) {
        kiri_mem_free(p->calls[i].name);
        kiri_mem_free(p->calls[i].arguments);
    }
    kiri_mem_free(p->calls);
    kiri_buf_free(&p->all);
    kiri_buf_free(&p->content);
    kiri_mem_free(p);
}

const char *kiri_tools_parser_content(const struct kiri_tools_parser *p, size_t *len)
{
    *len = p->content.len;
    return p->content.data ? p->content.data : "";
}

int kiri_tools_parser_n_calls(const struct kiri_tools_parser *p)
{
    return p->n_calls;
}

const struct kiri_tool_call *kiri_tools_parser_call(const struct kiri_tools_parser *p, int i)
{
    return i >= 0 && i < p->n_calls ? &p->calls[i] : NULL;
}

static uint64_t mix(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Adds a call; args must be a JSON object (it is dumped compactly). Returns 1, or -1 when the
 * call is not one (bad name or arguments) and 0 when it is dropped (past the limit). */
static int add_call(struct kiri_tools_parser *p, json_t *name, json_t *args)
{
    if (json_is_string(args)) {
        json_error_t je;
        json_t *inner = json_loads(json_string_value(args), 0, &je);
        int rc = json_is_object(inner) ? add_call(p, name, inner) : -1;
        json_decref(inner);
        return rc;
    }
    if (!args)
        args = json_object();
    else
        json_incref(args);
    int rc = -1;
    if (json_is_string(name) && json_string_length(name) > 0 && json_is_object(args)) {
        rc = 0;
        if (p->n_calls < MAX_CALLS && (p->parallel || p->n_calls == 0)) {
            struct kiri_tool_call *c = &p->calls[p->n_calls];
            char *a = json_dumps(args, JSON_COMPACT | JSON_REAL_PRECISION(15));
            c->name = kiri_mem_strndup(json_string_value(name), json_string_length(name));
            c->arguments = a ? kiri_mem_strndup(a, strlen(a)) : NULL;
            json_free(a);
            if (!c->name || !c->arguments) {
                kiri_mem_free(c->name);
                kiri_mem_free(c->arguments);
                c->name = c->arguments = NULL;
                rc = -2;
            } else {
                static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
                const int n = p->format == KIRI_TOOLS_MISTRAL ? 9 : 24;
                const int at = p->format == KIRI_TOOLS_MISTRAL ? 0 : 5;
                if (at)
                    memcpy(c->id, "call_", 5);
                uint64_t r = mix(p->seed ^ ((uint64_t)p->n_calls * 0x100000001B3ull));
                for (int i = 0; i < n; i++) {
                    if (i % 8 == 7)
                        r = mix(r);
                    c->id[at + i] = digits[r % 62];
                    r /= 62;
                }
                c->id[at + n] = '\0';
                p->n_calls++;
                rc = 1;
            }
        }
    }
    json_decref(args);
    return rc;
}

/* An object {"name", "arguments"|"parameters"} (or {"function": {...}}) as a call. */
static int add_call_object(struct kiri_tools_parser *p, json_t *o)
{
    if (!json_is_object(o))
        return -1;
    json_t *fn = json_object_get(o, "function");
    if (json_is_object(fn))
        o = fn;
    json_t *args = json_object_get(o, "arguments");
    if (!args)
        args = json_object_get(o, "parameters");
    return add_call(p, json_object_get(o, "name"), args);
}

/* The length of the JSON object or array at s[0..n) ('{' or '['), 0 while it is incomplete, -1
 * when s does not start one. Only the structure is checked; Jansson reads it afterwards. */
static long json_extent(const char *s, size_t n)
{
    if (n == 0)
        return 0;
    if (s[0] != '{' && s[0] != '[')
        return -1;
    long depth = 0;
    int in_str = 0;
    for (size_t i = 0; i < n; i++) {
        const char c = s[i];
        if (in_str) {
            if (c == '\\')
                i++;
            else if (c == '"')
                in_str = 0;
        } else if (c == '"') {
            in_str = 1;
        } else if (c == '{' || c == '[') {
            depth++;
        } else if (c == '}' || c == ']') {
            if (--depth == 0)
                return (long)i + 1;
        }
    }
    return 0;
}

static size_t skip_space(const char *s, size_t i, size_t n)
{
    while (i < n && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r'))
        i++;
    return i;
}

static const char *find(const char *s, size_t n, const char *what)
{
    const size_t w = strlen(what);
    for (size_t i = 0; i + w <= n; i++)
        if (memcmp(s + i, what, w) == 0)
            return s + i;
    return NULL;
}

static int starts(const char *s, size_t n, const char *what)
{
    const size_t w = strlen(what);
    return n >= w && memcmp(s, what, w) == 0;
}

/* Parses the JSON at s[0..len) and hands it to add (object or list of objects). */
static int add_json(struct kiri_tools_parser *p, const char *s, size_t len)
{
    json_error_t je;
    json_t *v = json_loadb(s, len, 0, &je);
    int rc = -1;
    if (json_is_object(v)) {
        rc = add_call_object(p, v);
    } else if (json_is_array(v) && json_array_size(v) > 0) {
        rc = 1;
        for (size_t i = 0; rc >= 0 && i < json_array_size(v); i++)
            if (add_call_object(p, json_array_get(v, i)) == -1)
                rc = -1;
    }
    json_decref(v);
    return rc < 0 ? rc : 1;
}

/* ---- FunctionGemma's values, to JSON ---- */

static json_t *fg_value(const char *s, size_t n, size_t *i, int depth);

static json_t *fg_object(const char *s, size_t n, size_t *i, int depth)
{
    json_t *o = json_object();
    if (!o || *i >= n || s[*i] != '{') {
        json_decref(o);
        return NULL;
    }
    (*i)++;
    while (*i < n && s[*i] != '}') {
        size_t k = *i;
        while (k < n && s[k] != ':' && s[k] != '}' && s[k] != ',')
            k++;
        if (k >= n || s[k] != ':' || k == *i)
            break;
        char key[128];
        snprintf(key, sizeof key, "%.*s", (int)(k - *i), s + *i);
        *i = k + 1;
        json_t *v = fg_value(s, n, i, depth + 1);
        if (!v || json_object_set_new(o, key, v) != 0)
            break;
        if (*i < n && s[*i] == ',')
            (*i)++;
    }
    if (*i >= n || s[*i] != '}') {
        json_decref(o);
        return NULL;
    }
    (*i)++;
    return o;
}

static json_t *fg_value(const char *s, size_t n, size_t *i, int depth)
{
    static const char esc[] = "<escape>";
    if (depth > MAX_NEST || *i >= n)
        return NULL;
    if (starts(s + *i, n - *i, esc)) {
        const size_t from = *i + sizeof esc - 1;
        const char *end = find(s + from, n - from, esc);
        if (!end)
            return NULL;
        *i = (size_t)(end - s) + sizeof esc - 1;
        return json_stringn(s + from, (size_t)(end - (s + from)));
    }
    if (s[*i] == '{')
        return fg_object(s, n, i, depth);
    if (s[*i] == '[') {
        json_t *a = json_array();
        (*i)++;
        while (a && *i < n && s[*i] != ']') {
            json_t *v = fg_value(s, n, i, depth + 1);
            if (!v || json_array_append_new(a, v) != 0) {
                json_decref(a);
                return NULL;
            }
            if (*i < n && s[*i] == ',')
                (*i)++;
        }
        if (!a || *i >= n) {
            json_decref(a);
            return NULL;
        }
        (*i)++;
        return a;
    }
    size_t k = *i;
    while (k < n && s[k] != ',' && s[k] != '}' && s[k] != ']')
        k++;
    json_error_t je;
    json_t *v = json_loadb(s + *i, k - *i, JSON_DECODE_ANY, &je);
    if (!v)
        v = json_stringn(s + *i, k - *i);
    *i = k;
    return v;
}

/* call:NAME{...} */
static int add_gemma(struct kiri_tools_parser *p, const char *s, size_t n)
{
    size_t i = skip_space(s, 0, n);
    if (!starts(s + i, n - i, "call:"))
        return -1;
    i += 5;
    const size_t name_at = i;
    while (i < n && s[i] != '{')
        i++;
    if (i >= n || i == name_at)
        return -1;
    json_t *name = json_stringn(s + name_at, i - name_at);
    json_t *args = fg_object(s, n, &i, 0);
    int rc = args ? add_call(p, name, args) : -1;
    json_decref(name);
    json_decref(args);
    return rc;
}

/* ---- one step at p->pos ---- */

/* The call starting at p->pos (at a marker): 1 parsed (pos moved past it), 0 needs more text, -1
 * not a call (-2 out of memory). */
static int parse_call(struct kiri_tools_parser *p)
{
    const char *s = p->all.data + p->pos;
    const size_t n = p->all.len - p->pos;
    size_t used = 0;
    int rc = -1;
    switch (p->format) {
    case KIRI_TOOLS_HERMES:
    case KIRI_TOOLS_GEMMA: {
        const char *open = p->format == KIRI_TOOLS_HERMES ? "<tool_call>" : "<start_function_call>";
        const char *close = p->format == KIRI_TOOLS_HERMES ? "</tool_call>" : "<end_function_call>";
        const size_t from = strlen(open);
        /* A call's body starts at once ({ or call:), so a stray marker is told apart without
         * waiting for a closing tag that may never come. */
        const size_t body = skip_space(s, from, n);
        if (body < n && s[body] != (p->format == KIRI_TOOLS_HERMES ? '{' : 'c'))
            return -1;
        const char *end = find(s + from, n - from, close);
        if (!end && !p->finished)
            return 0;
        const size_t body_len = end ? (size_t)(end - (s + from)) : n - from;
        rc = p->format == KIRI_TOOLS_HERMES ? add_json(p, s + from, body_len) : add_gemma(p, s + from, body_len);
        used = end ? (size_t)(end - s) + strlen(close) : n;
        break;
    }
    case KIRI_TOOLS_LLAMA3:
    case KIRI_TOOLS_MISTRAL: {
        size_t i = 0;
        const char *tag = p->format == KIRI_TOOLS_LLAMA3 ? "<|python_tag|>" : "[TOOL_CALLS]";
        if (starts(s, n, tag))
            i = skip_space(s, strlen(tag), n);
        if (i == n && !p->finished)
            return 0;
        if (p->format == KIRI_TOOLS_MISTRAL && i < n && s[i] != '[' && s[i] != '{') {
            /* v11: NAME[ARGS]{...}, or NAME[CALL_ID]id[ARGS]{...} */
            const char *args = find(s + i, n - i, "[ARGS]");
            if (!args)
                return p->finished ? -1 : 0;
            const char *name_end = find(s + i, (size_t)(args - (s + i)), "[CALL_ID]");
            if (!name_end)
                name_end = args;
            const size_t a = (size_t)(args - s) + 6;
            const long len = json_extent(s + a, n - a);
            if (len == 0)
                return p->finished ? -1 : 0;
            if (len < 0)
                return -1;
            json_error_t je;
            json_t *v = json_loadb(s + a, (size_t)len, 0, &je);
            json_t *name = json_stringn(s + i, (size_t)(name_end - (s + i)));
            rc = v ? add_call(p, name, v) : -1;
            json_decref(v);
            json_decref(name);
            used = a + (size_t)len;
            break;
        }
        const long len = json_extent(s + i, n - i);
        if (len == 0)
            return p->finished ? -1 : 0;
        if (len < 0)
            return -1;
        rc = add_json(p, s + i, (size_t)len);
        used = i + (size_t)len;
        if (p->format == KIRI_TOOLS_LLAMA3) {
            const size_t k = skip_space(s, used, n);
            if (k < n && s[k] == ';')
                used = k + 1;
        }
        break;
    }
    default:
        return -1;
    }
    if (rc < 0)
        return rc;
    p->pos += used;
    return 1;
}

/* Appends decided text to the content. */
static void emit(struct kiri_tools_parser *p, size_t upto)
{
    if (upto > p->pos) {
        kiri_buf_append(&p->content, p->all.data + p->pos, upto - p->pos);
        p->pos = upto;
    }
}

/* How many bytes at the end of s[0..n) could begin a marker (held back until more arrives). */
static size_t partial_mark(const char *s, size_t n, const char *const *marks)
{
    size_t best = 0;
    for (int m = 0; marks[m]; m++) {
        const size_t w = strlen(marks[m]);
        for (size_t k = w - 1; k > best; k--)
            if (k <= n && memcmp(s + n - k, marks[m], k) == 0) {
                best = k;
                break;
            }
    }
    return best;
}

static int hex4(const char *s, uint32_t *v)
{
    *v = 0;
    for (int k = 0; k < 4; k++) {
        const char c = s[k];
        const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v << 4 | (uint32_t)d;
    }
    return 0;
}

/* Decodes the generic form's {"response": "..."} string as far as it has arrived, so the answer
 * streams as text rather than waiting for the closing quote. Returns 1 when the string has ended. */
static int decode_response(struct kiri_tools_parser *p, const char *s, size_t n)
{
    size_t at = p->response_at;
    while (at < n) {
        const char c = s[at];
        if (c == '"') {
            p->response_at = at + 1;
            return 1;
        }
        if (c != '\\') {
            kiri_buf_putc(&p->content, c);
            at++;
            continue;
        }
        if (at + 1 >= n)
            break;
        static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
        const char *e = strchr(from, s[at + 1]);
        if (e && s[at + 1]) {
            kiri_buf_putc(&p->content, to[e - from]);
            at += 2;
            continue;
        }
        uint32_t cp, lo;
        if (s[at + 1] != 'u' || at + 6 > n)
            break;
        if (hex4(s + at + 2, &cp) < 0)
            return 1; /* not JSON: stop here */
        size_t used = 6;
        if (cp >= 0xD800 && cp < 0xDC00) {
            if (at + 12 > n)
                break;
            if (s[at + 6] != '\\' || s[at + 7] != 'u' || hex4(s + at + 8, &lo) < 0 || lo < 0xDC00 || lo > 0xDFFF)
                return 1;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            used = 12;
        } else if (cp >= 0xDC00 && cp < 0xE000) {
            return 1;
        }
        char u[4];
        kiri_buf_append(&p->content, u, kiri_utf8_encode(cp, u));
        at += used;
    }
    p->response_at = at;
    return 0;
}

/* The generic format: the whole output is one JSON object, or plain text when it is not. */
static int step_generic(struct kiri_tools_parser *p)
{
    static const char RESPONSE[] = "{\"response\": \"";
    const char *s = p->all.data ? p->all.data : "";
    const size_t n = p->all.len;
    const size_t i = skip_space(s, 0, n);
    if (p->generic_done) {
        p->pos = n;
        return 0;
    }
    if (p->pos == 0 && (p->response_at || starts(s + i, n - i, RESPONSE))) {
        if (!p->response_at)
            p->response_at = i + sizeof RESPONSE - 1;
        if (decode_response(p, s, n)) {
            p->pos = n; /* the answer is complete; the closing brace and what follows are not content */
            p->generic_done = 1;
        }
        return 0;
    }
    if (p->pos > 0 || (i < n && s[i] != '{')) {
        emit(p, n); /* plain text from the start: it streams as it is */
        return 0;
    }
    const long len = json_extent(s + i, n - i);
    if (len == 0 && !p->finished)
        return 0;
    if (len > 0) {
        json_error_t je;
        json_t *v = json_loadb(s + i, (size_t)len, 0, &je);
        json_t *calls = json_object_get(v, "tool_calls");
        json_t *one = json_object_get(v, "tool_call");
        json_t *resp = json_object_get(v, "response");
        int rc = -1;
        if (json_is_array(calls) && json_array_size(calls) > 0) {
            rc = 1;
            for (size_t k = 0; rc >= 0 && k < json_array_size(calls); k++)
                rc = add_call_object(p, json_array_get(calls, k)) == -1 ? -1 : 1;
        } else if (json_is_object(one)) {
            rc = add_call_object(p, one);
        } else if (json_is_string(resp)) {
            kiri_buf_append(&p->content, json_string_value(resp), json_string_length(resp));
            rc = 1;
        }
        json_decref(v);
        if (rc >= 0) {
            p->pos = n; /* anything after the object is dropped */
            p->generic_done = 1;
            return 0;
        }
    }
    if (p->finished)
        emit(p, n);
    return 0;
}

static int step(struct kiri_tools_parser *p)
{
    const char *const *marks = marks_of(p->format);
    if (!marks)
        return step_generic(p);
    /* Every pass moves pos on or returns, so this ends within two passes a byte. */
    for (;;) {
        const char *s = p->all.data ? p->all.data : "";
        const size_t n = p->all.len;
        if (p->in_call) {
            const int rc = parse_call(p);
            if (rc == 0)
                return 0;
            if (rc == -2)
                return KIRI_E_NOMEM;
            p->in_call = 0;
            if (rc < 0) {
                /* Not a call after all: its first byte is content, and the search goes on. */
                emit(p, p->pos + 1);
            }
            continue;
        }
        /* The earliest marker; each later search stops where the best so far starts (and may
         * overlap it by a marker's length), so a pass costs the distance to the next marker. */
        const char *first = NULL;
        for (int m = 0; marks[m]; m++) {
            const size_t w = strlen(marks[m]);
            const size_t span = first ? (size_t)(first - (s + p->pos)) + w - 1 : n - p->pos;
            const char *at = find(s + p->pos, span < n - p->pos ? span : n - p->pos, marks[m]);
            if (at && (!first || at < first))
                first = at;
        }
        if (first) {
            size_t upto = (size_t)(first - s);
            if (p->n_calls == 0)
                emit(p, upto);
            else
                p->pos = upto; /* between calls: separators, not content */
            p->in_call = 1;
            continue;
        }
        if (p->finished) {
            if (p->n_calls == 0 || skip_space(s, p->pos, n) < n)
                emit(p, n);
            p->pos = n;
            return 0;
        }
        /* Hold back a possible start of a marker, and trailing spaces (they may separate calls). */
        size_t keep = partial_mark(s + p->pos, n - p->pos, marks);
        size_t upto = n - keep;
        while (upto > p->pos && (s[upto - 1] == ' ' || s[upto - 1] == '\n' || s[upto - 1] == '\t' || s[upto - 1] == '\r'))
            upto--;
        if (p->n_calls == 0)
            emit(p, upto);
        return 0;
    }
}

int kiri_tools_parser_feed(struct kiri_tools_parser *p, const char *text, size_t len)
{
    if (kiri_buf_append(&p->all, text, len) != KIRI_OK)
        return KIRI_E_NOMEM;
    int rc = step(p);
    return rc ? rc : p->content.failed ? KIRI_E_NOMEM : KIRI_OK;
}

int kiri_tools_parser_finish(struct kiri_tools_parser *p)
{
    p->finished = 1;
    int rc = step(p);
    return rc ? rc : p->content.failed ? KIRI_E_NOMEM : KIRI_OK;
}
