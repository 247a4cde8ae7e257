/* kiri chat (chat.h): reading messages, keeping the history within the context, and streaming
 * each answer from a one-sequence serving loop. */
#include "chat.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "buf.h"
#include "chat_prompt.h"
#include "chat_template.h"
#include "error.h"
#include "mem.h"
#include "platform.h"

#define MAX_MESSAGE_BYTES ((size_t)1 << 20)   /* one message as typed or piped */
#define MAX_TURNS 4096                        /* messages kept; the oldest go first */
#define POLL_SECONDS 0.05                     /* how often a running answer checks for Ctrl-C */

/* Set by the SIGINT handler while an answer runs. A signal handler can only reach a global. */
static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

struct message {
    const char *role;   /* static string */
    char *content;      /* owned */
};

struct chat {
    struct kiri_model *model;              /* borrowed */
    const struct kiri_chat_cli_params *p;  /* borrowed */
    struct kiri_chat_prompt *prompt;       /* owned */
    struct kiri_batcher *batcher;          /* owned, started */
    int32_t n_ctx;
    int tty_in;                            /* decorate: prompts, banner */
    int tty_err;                           /* dim the speed line */
    struct message *msgs;                  /* owned: the system message (kept), then the turns */
    int n_msgs;
    int n_fixed;                           /* leading messages never dropped (the system one) */
};

/* What the loop thread's callback collects for one answer. The main thread reads it only after
 * kiri_batcher_wait_idle, which orders it after the final event. */
struct answer {
    struct kiri_buf text;
    int finish;             /* -1 until the final event */
    int status;
    char error[128];        /* the final event's error sentence, "" if none */
    int32_t n_prompt, n_cached, n_generated;
    double first_token_seconds, t_first, t_end;
};

/* ---------------------------------------------------------------------------------------------
 * Reading a message: a line; a line ending in a backslash continues on the next; a block between
 * lines of triple quotes is taken as it is.
 * ------------------------------------------------------------------------------------------- */

enum { READ_MESSAGE, READ_EOF, READ_TOO_LONG };

/* Reads one line without its end of line into line. Returns READ_EOF at the end of input with
 * nothing read, READ_TOO_LONG for a line past line's limit (read to its end, the start kept). */
static int read_line(struct kiri_buf *line)
{
    kiri_buf_clear(line);
    line->failed = 0;
    char chunk[4096];
    int got = 0;
    while (fgets(chunk, sizeof chunk, stdin)) {
        got = 1;
        size_t n = strlen(chunk);
        const int end = n > 0 && chunk[n - 1] == '\n';
        if (!line->failed)
            kiri_buf_append(line, chunk, n - (size_t)end);
        if (end)
            break;
    }
    if (!got)
        return READ_EOF;
    if (line->failed)
        return READ_TOO_LONG;
    if (line->len && line->data[line->len - 1] == '\r')
        line->data[--line->len] = '\0';
    return READ_MESSAGE;
}

static void prompt_mark(const struct chat *ch, int first)
{
    if (ch->tty_in) {
        fputs(first ? ">>> " : "... ", stdout);
        fflush(stdout);
    }
}

static int ends_with(const struct kiri_buf *b, const char *s)
{
    const size_t n = strlen(s);
    return b->len >= n && memcmp(b->data + b->len - n, s, n) == 0;
}

/* Appends one line of a message, joining lines with a newline. */
static void add_line(struct kiri_buf *msg, int *n_lines, const char *text, size_t len)
{
    if ((*n_lines)++ > 0)
        kiri_buf_putc(msg, '\n');
    kiri_buf_append(msg, text, len);
}

static int blank(const struct kiri_buf *b) { return strspn(b->data ? b->data : "", " \t\r\n") == b->len; }

/* Reads one message into msg, which may be blank. */
static int read_once(const struct chat *ch, struct kiri_buf *msg, int *quoted)
{
    static const char quotes[] = "\"\"\"";
    struct kiri_buf line;
    kiri_buf_init(&line, MAX_MESSAGE_BYTES);
    kiri_buf_clear(msg);
    int rc, block = 0, n_lines = 0, too_long = 0;
    for (;;) {
        prompt_mark(ch, n_lines == 0 && !block);
        rc = read_line(&line);
        if (rc == READ_TOO_LONG) {
            too_long = 1;
            rc = READ_MESSAGE;
        }
        if (rc == READ_EOF) {
            if (ch->tty_in)
                fputc('\n', stdout);
            rc = n_lines ? READ_MESSAGE : READ_EOF;
            break;
        }
        const char *text = line.data ? line.data : "";
        size_t len = line.len;
        if (n_lines == 0 && !block && len >= 3 && memcmp(text, quotes, 3) == 0) {
            block = 1;
            text += 3;
            len -= 3;
            const int closed = len >= 3 && memcmp(text + len - 3, quotes, 3) == 0;
            if (closed || len)
                add_line(msg, &n_lines, text, len - (closed ? 3 : 0));
            if (closed)
                break;
            continue;
        }
        if (block) {
            const int closed = ends_with(&line, quotes);
            if (!closed || len > 3)
                add_line(msg, &n_lines, text, len - (closed ? 3 : 0));
            if (closed)
                break;
            continue;
        }
        const int more = len && text[len - 1] == '\\';
        add_line(msg, &n_lines, text, len - (size_t)more);
        if (more)
            continue;
        if (blank(msg)) {
            kiri_buf_clear(msg);
            n_lines = 0;
            continue;
        }
        break;
    }
    kiri_buf_free(&line);
    *quoted = block;
    if (rc == READ_MESSAGE && (too_long || msg->failed)) {
        kiri_buf_clear(msg);
        msg->failed = 0;
        return READ_TOO_LONG;
    }
    return rc;
}

/* Reads the next message into msg (blank messages are skipped); *quoted says it came in a
 * triple-quoted block (so it is never a command). Returns READ_MESSAGE, READ_EOF, or
 * READ_TOO_LONG (the rest of the message was read and thrown away). */
static int read_message(const struct chat *ch, struct kiri_buf *msg, int *quoted)
{
    int rc;
    while ((rc = read_once(ch, msg, quoted)) == READ_MESSAGE && blank(msg))
        ;
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * The history
 * ------------------------------------------------------------------------------------------- */

static int history_add(struct chat *ch, const char *role, const char *text, size_t len)
{
    if (ch->n_msgs >= MAX_TURNS + 1)
        return KIRI_E_INVALID_ARG;
    char *copy = kiri_mem_strndup(text, len);
    if (!copy)
        return KIRI_E_NOMEM;
    ch->msgs[ch->n_msgs++] = (struct message){role, copy};
    return KIRI_OK;
}

/* Drops the n messages after the fixed ones. */
static void history_drop(struct chat *ch, int n)
{
    const int from = ch->n_fixed;
    if (n > ch->n_msgs - from)
        n = ch->n_msgs - from;
    for (int i = from; i < from + n; i++)
        kiri_mem_free(ch->msgs[i].content);
    memmove(ch->msgs + from, ch->msgs + from + n, (size_t)(ch->n_msgs - from - n) * sizeof *ch->msgs);
    ch->n_msgs -= n;
}

static void history_drop_last(struct chat *ch)
{
    if (ch->n_msgs > ch->n_fixed)
        kiri_mem_free(ch->msgs[--ch->n_msgs].content);
}

static void history_clear(struct chat *ch) { history_drop(ch, ch->n_msgs - ch->n_fixed); }

/* The prompt tokens (*ids, kiri_mem_free) of the conversation without the skip oldest messages
 * after the fixed ones. */
static int render(const struct chat *ch, int skip, int32_t **ids, int32_t *n, struct kiri_status_info *info)
{
    struct kiri_chat_message *msgs = kiri_mem_array((size_t)ch->n_msgs, sizeof *msgs);
    if (!msgs)
        return kiri_error_set(info, KIRI_E_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; i < ch->n_msgs; i++)
        if (i < ch->n_fixed || i >= ch->n_fixed + skip)
            msgs[k++] = (struct kiri_chat_message){ch->msgs[i].role, ch->msgs[i].content};
    char *text = NULL;
    size_t len = 0;
    int rc = kiri_chat_prompt_render(ch->prompt, msgs, k, 1, &text, &len, info);
    kiri_mem_free(msgs);
    if (rc == KIRI_OK)
        rc = kiri_chat_prompt_tokenize(ch->prompt, text, len, ids, n, info);
    kiri_mem_free(text);
    return rc;
}

/* Room an answer should have: the asked-for length, or a quarter of the context, at most half. */
static int32_t answer_room(const struct chat *ch)
{
    int32_t room = ch->p->max_tokens > 0 ? ch->p->max_tokens : ch->n_ctx / 4;
    if (room > ch->n_ctx / 2)
        room = ch->n_ctx / 2;
    return room > 0 ? room : 1;
}

/* Renders the conversation, which ends with the new user message, leaving out the oldest turns
 * until it leaves an answer room in the context; they are forgotten only once it fits. Returns
 * KIRI_OK with the tokens, or an error already reported (the new message is then taken back and
 * the history kept). */
static int fit_context(struct chat *ch, int32_t **ids, int32_t *n)
{
    struct kiri_status_info info;
    const int turns = ch->n_msgs - ch->n_fixed;
    int skip = 0, rc;
    for (;;) {
        *ids = NULL;
        rc = render(ch, skip, ids, n, &info);
        if (rc != KIRI_OK || *n + answer_room(ch) <= ch->n_ctx || turns - skip <= 1)
            break;
        kiri_mem_free(*ids);
        /* A turn is the user's message and the answer to it. */
        const int i = ch->n_fixed + skip;
        skip += turns - skip >= 3 && strcmp(ch->msgs[i + 1].role, "assistant") == 0 ? 2 : 1;
    }
    if (rc == KIRI_OK && *n >= ch->n_ctx) {
        fprintf(stderr, "kiri: this message is too long: the prompt is %d tokens and the context holds %d; "
                        "it was not sent\n", *n, ch->n_ctx);
        kiri_mem_free(*ids);
        rc = KIRI_E_CONTEXT_FULL;
    } else if (rc != KIRI_OK) {
        fprintf(stderr, "kiri: the chat template refused the conversation: %s\n", info.message);
    }
    if (rc != KIRI_OK) {
        history_drop_last(ch);
        return rc;
    }
    if (skip) {
        history_drop(ch, skip);
        fprintf(stderr, "kiri: the conversation is too long for the context (%d tokens): the oldest %d "
                        "message%s %s forgotten\n", ch->n_ctx, skip, skip > 1 ? "s" : "", skip > 1 ? "are" : "is");
    }
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * One answer
 * ------------------------------------------------------------------------------------------- */

/* On the loop thread: streams the text and keeps it for the history. */
static int on_event(void *user, const struct kiri_token_event *ev)
{
    struct answer *a = user;
    if (ev->token >= 0 && a->t_first == 0) {
        a->t_first = kiri_time_seconds();
        a->first_token_seconds = ev->first_token_seconds;
    }
    if (ev->text_len) {
        fwrite(ev->text, 1, ev->text_len, stdout);
        fflush(stdout);
        kiri_buf_append(&a->text, ev->text, ev->text_len);
    }
    if (ev->finish >= 0) {
        a->finish = ev->finish;
        a->status = ev->status;
        if (ev->error)
            snprintf(a->error, sizeof a->error, "%s", ev->error);
        a->n_prompt = ev->n_prompt;
        a->n_cached = ev->n_cached;
        a->n_generated = ev->n_generated;
        a->t_end = kiri_time_seconds();
    }
    return 0;
}

static void print_stats(const struct chat *ch, const struct answer *a)
{
    const double decode = a->t_end - a->t_first;
    const double rate = a->n_generated > 1 && decode > 0 ? (a->n_generated - 1) / decode : 0.0;
    char line[256];
    snprintf(line, sizeof line, "%d tokens, %.1f tok/s, first token %.2f s (prompt %d tokens, %d cached)",
             a->n_generated, rate, a->first_token_seconds, a->n_prompt, a->n_cached);
    if (ch->tty_err)
        fprintf(stderr, "\033[2m%s\033[0m\n", line);
    else
        fprintf(stderr, "%s\n", line);
}

/* Answers the conversation (which ends with the user's message) and adds the answer to it.
 * Returns KIRI_OK, or an error already reported. Ctrl-C ends the answer early; what came so far
 * stays in the history. */
static int answer(struct chat *ch)
{
    int32_t *ids = NULL, n = 0;
    int rc = fit_context(ch, &ids, &n);
    if (rc != KIRI_OK)
        return rc;
    struct kiri_request r;
    memset(&r, 0, sizeof r);
    r.tokens = ids;
    r.n_tokens = n;
    r.max_tokens = ch->p->max_tokens;
    r.sampling = ch->p->sampling;
    r.stop = ch->p->stop;
    r.n_stop = ch->p->n_stop;
    r.grammar = ch->p->grammar;
    r.grammar_len = ch->p->grammar_len;
    r.speculative = ch->p->speculative;
    r.spec_max = ch->p->spec_max;
    struct answer a;
    memset(&a, 0, sizeof a);
    kiri_buf_init(&a.text, 0);
    a.finish = -1;
    struct kiri_status_info info;
    uint64_t id = 0;
    interrupted = 0;
    void (*previous)(int) = signal(SIGINT, on_sigint);
    rc = kiri_batcher_submit(ch->batcher, &r, on_event, &a, &id, &info);
    kiri_mem_free(ids);
    if (rc == KIRI_OK) {
        int cancelled = 0;
        while (kiri_batcher_wait_idle(ch->batcher, POLL_SECONDS) != KIRI_OK)
            if (interrupted && !cancelled) {
                kiri_batcher_cancel(ch->batcher, id);
                cancelled = 1;
            }
    }
    signal(SIGINT, previous == SIG_ERR ? SIG_DFL : previous);
    if (rc != KIRI_OK) {
        fprintf(stderr, "kiri: error: %s [%s]\n", info.message, kiri_status_name(rc));
        history_drop_last(ch);
        kiri_buf_free(&a.text);
        return rc;
    }
    if (a.text.len == 0 || a.text.data[a.text.len - 1] != '\n')
        fputc('\n', stdout);
    fflush(stdout);
    if (a.finish == KIRI_FINISH_CANCELLED)
        fprintf(stderr, "kiri: stopped\n");
    else if (a.finish == KIRI_FINISH_CONTEXT)
        fprintf(stderr, "kiri: the answer filled the context (%d tokens); the next message drops the oldest "
                        "turns to make room\n", ch->n_ctx);
    else if (a.finish == KIRI_FINISH_ERROR)
        fprintf(stderr, "kiri: error: the answer ended early: %s\n",
                a.error[0] ? a.error : a.status == KIRI_E_NOMEM ? "out of memory" : "the backend failed");
    if (ch->p->show_stats)
        print_stats(ch, &a);
    if (ch->tty_in)
        fputc('\n', stdout);
    rc = a.text.failed ? KIRI_E_NOMEM : history_add(ch, "assistant", a.text.data ? a.text.data : "", a.text.len);
    kiri_buf_free(&a.text);
    if (rc != KIRI_OK) {
        fprintf(stderr, "kiri: error: cannot keep the answer in the history (out of memory); starting over\n");
        history_clear(ch);
    }
    return KIRI_OK;
}

/* ---------------------------------------------------------------------------------------------
 * The session
 * ------------------------------------------------------------------------------------------- */

static void help(void)
{
    printf("  /clear   forget the conversation (the system message stays)\n"
           "  /exit    leave (also /bye, /quit, Ctrl-D)\n"
           "  /help    this list\n"
           "A line ending in \\ continues on the next; text between lines of \"\"\" is one message.\n"
           "Ctrl-C stops an answer.\n");
}

enum { COMMAND_NONE, COMMAND_DONE, COMMAND_EXIT };

/* A line starting with '/' is a command. */
static int command(struct chat *ch, const char *msg)
{
    if (msg[0] != '/')
        return COMMAND_NONE;
    char word[32];
    size_t n = strcspn(msg, " \t\n");
    snprintf(word, sizeof word, "%.*s", (int)(n < sizeof word - 1 ? n : sizeof word - 1), msg);
    if (!strcmp(word, "/exit") || !strcmp(word, "/bye") || !strcmp(word, "/quit"))
        return COMMAND_EXIT;
    if (!strcmp(word, "/clear")) {
        history_clear(ch);
        printf("Cleared the conversation.\n");
    } else if (!strcmp(word, "/help") || !strcmp(word, "/?")) {
        help();
    } else {
        printf("Unknown command '%s' (/help lists them; start a message with \"\"\" to send it as text).\n", word);
    }
    fflush(stdout);
    return COMMAND_DONE;
}

static int session_init(struct chat *ch, struct kiri_model *m, const struct kiri_chat_cli_params *p)
{
    struct kiri_status_info info;
    memset(ch, 0, sizeof *ch);
    ch->model = m;
    ch->p = p;
    ch->tty_in = kiri_platform_is_terminal(0) && kiri_platform_is_terminal(1);
    ch->tty_err = kiri_platform_is_terminal(2);
    if (kiri_chat_prompt_init(m, &ch->prompt, &info) != KIRI_OK) {
        fprintf(stderr, "kiri: error: %s\n", info.message);
        return 1;
    }
    if (kiri_chat_prompt_fallback(ch->prompt))
        fprintf(stderr, "kiri: %s; using ChatML\n", kiri_chat_prompt_fallback(ch->prompt));
    struct kiri_batcher_params bp;
    kiri_batcher_params_default(&bp);
    bp.n_ctx = p->n_ctx;
    bp.max_seqs = 1;
    bp.queue_cap = 1;
    bp.chunk = p->n_batch > 0 ? p->n_batch : 512;
    bp.kv_type = p->kv_type;
    bp.prefix_cache = 1;
    bp.draft_model = p->draft_model;
    bp.spec_states = p->speculative > 0 ? -1 : 0;
    bp.mtp = p->speculative == KIRI_SPEC_MTP;
    if (kiri_batcher_init(m, &bp, &ch->batcher, &info) != KIRI_OK) {
        fprintf(stderr, "kiri: error: %s [%s]\n", info.message, kiri_status_name(info.code));
        return 1;
    }
    if (kiri_batcher_start(ch->batcher) != KIRI_OK) {
        fprintf(stderr, "kiri: error: cannot start the generation thread\n");
        return 1;
    }
    ch->n_ctx = kiri_batcher_n_ctx(ch->batcher);
    ch->msgs = kiri_mem_calloc(MAX_TURNS + 1, sizeof *ch->msgs);
    if (!ch->msgs) {
        fprintf(stderr, "kiri: error: out of memory\n");
        return 1;
    }
    if (p->system && history_add(ch, "system", p->system, strlen(p->system)) != KIRI_OK) {
        fprintf(stderr, "kiri: error: out of memory\n");
        return 1;
    }
    ch->n_fixed = ch->n_msgs;
    return 0;
}

static void session_free(struct chat *ch)
{
    if (ch->batcher) {
        kiri_batcher_stop(ch->batcher, 0);
        kiri_batcher_free(ch->batcher);
    }
    for (int i = 0; i < ch->n_msgs; i++)
        kiri_mem_free(ch->msgs[i].content);
    kiri_mem_free(ch->msgs);
    kiri_chat_prompt_free(ch->prompt);
}

int kiri_chat_cli_run(struct kiri_model *m, const char *model_name, const struct kiri_chat_cli_params *p)
{
    struct chat ch;
    int status = session_init(&ch, m, p);
    if (status == 0 && ch.tty_in)
        printf("kiri chat with %s (context %d tokens). /help lists the commands; /exit or Ctrl-D leaves.\n",
               model_name, ch.n_ctx);
    struct kiri_buf msg;
    kiri_buf_init(&msg, MAX_MESSAGE_BYTES);
    while (status == 0) {
        int quoted = 0;
        const int rc = read_message(&ch, &msg, &quoted);
        if (rc == READ_EOF)
            break;
        if (rc == READ_TOO_LONG) {
            fprintf(stderr, "kiri: the message is longer than %zu bytes; it was not sent\n", MAX_MESSAGE_BYTES);
            continue;
        }
        const int cmd = quoted ? COMMAND_NONE : command(&ch, msg.data);
        if (cmd == COMMAND_EXIT)
            break;
        if (cmd == COMMAND_DONE)
            continue;
        if (ch.n_msgs >= MAX_TURNS + 1)
            history_drop(&ch, 2);
        if (history_add(&ch, "user", msg.data, msg.len) != KIRI_OK) {
            fprintf(stderr, "kiri: error: out of memory\n");
            status = 1;
            break;
        }
        answer(&ch);
    }
    kiri_buf_free(&msg);
    session_free(&ch);
    return status;
}
