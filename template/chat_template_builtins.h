/* Chat templates: the built-ins (filters, tests, methods, global functions), each a table from
 * name to function. The parser resolves filter and test names to ids with the _find functions
 * (through struct kiri_chat_names, so it needs no built-in); the evaluator calls them by id with
 * the arguments it evaluated. Built-ins work on values only: they know nothing of the
 * evaluator, and map and select apply filters and tests from these same tables.
 *
 * `at` is the byte offset of the call in the source, for error messages (chat_template_value.h);
 * functions returning int return 0 or -1, the status then being r->code.
 */
#ifndef KIRI_CHAT_TEMPLATE_BUILTINS_H
#define KIRI_CHAT_TEMPLATE_BUILTINS_H

#include <stddef.h>
#include <stdint.h>

#include "chat_template_value.h"

/* Up to 8 evaluated arguments: v[i] is keyword kw[i] when kw[i] is non-NULL. */
#define KIRI_CHAT_MAX_ARGS 8
struct kiri_chat_args {
    int n;
    struct kiri_chat_value v[KIRI_CHAT_MAX_ARGS];
    const char *kw[KIRI_CHAT_MAX_ARGS];
    size_t kw_len[KIRI_CHAT_MAX_ARGS];
};

/* The id of the filter, test or global function of that name, or -1 if there is none. */
int kiri_chat_filter_find(const char *name, size_t len);
int kiri_chat_test_find(const char *name, size_t len);
int kiri_chat_global_find(const char *name, size_t len);

/* in|filter(args) */
int kiri_chat_filter_apply(struct kiri_chat_render *r, int64_t at, int id, struct kiri_chat_value in,
                           struct kiri_chat_args *a, struct kiri_chat_value *out);
/* v is test(args), into *res */
int kiri_chat_test_apply(struct kiri_chat_render *r, int64_t at, int id, struct kiri_chat_value v,
                         struct kiri_chat_args *a, int *res);
/* obj.name(args) for strings, dicts, lists and loops; *handled 0 if obj has no such method (a
 * method that would modify a list or dict is handled: it fails). */
int kiri_chat_method_call(struct kiri_chat_render *r, int64_t at, struct kiri_chat_value obj,
                          const char *name, size_t len, struct kiri_chat_args *a,
                          struct kiri_chat_value *out, int *handled);
/* The global function id (the i of a KIRI_CHAT_TYPE_FUNC value) called with args. */
int kiri_chat_global_call(struct kiri_chat_render *r, int64_t at, int id, struct kiri_chat_args *a,
                          struct kiri_chat_value *out);

#endif
