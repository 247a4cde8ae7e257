/* libFuzzer target for chat templates: the input is a template source. It is parsed; a refusal
 * must carry a message. An accepted template is rendered, under small limits, over a fixed
 * conversation with a system turn, a tool call, a tool result and tools, with and without the
 * generation prompt and with enable_thinking; a render either succeeds with valid UTF-8 or fails
 * with a message, never crashes or runs away.
 *
 * Build: cmake -DKIRI_FUZZ=ON -DKIRI_SERVER=ON with clang (target fuzz_chat_template); run from
 * the repository root:
 *        build-fuzz/fuzz_chat_template -max_total_time=60 corpus/ tests/fuzz/seeds/chat_template/
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chat_template.h"
#include "error.h"
#include "kiri.h"
#include "mem.h"
#include "utf8.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char MESSAGES[] =
    "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
    "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":\"function\","
    "\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1,\"y\":[\"a\"]}}}]},"
    "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"ok\"},"
    "{\"role\":\"assistant\",\"content\":\"<think>t</think>done\"}]";
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"x\":{\"type\":\"integer\"},\"y\":{\"type\":\"array\","
    "\"items\":{\"type\":\"string\"}}},\"required\":[\"x\"]}}}]";
static const char VARS[] = "{\"enable_thinking\":true}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kiri_chat_template *t = NULL;
    struct kiri_status_info info;
    kiri_error_clear(&info);
    if (kiri_chat_template_init((const char *)data, size, &t, &info) != KIRI_OK) {
        if (!info.message[0])
            abort();
        return 0;
    }
    const struct kiri_chat_limits limits = {1 << 16, 4 << 20, 200000};
    for (int v = 0; v < 3; v++) {
        char *out = NULL;
        size_t out_len = 0;
        kiri_error_clear(&info);
        const int rc = kiri_chat_template_render_json_vars(
            t, MESSAGES, sizeof MESSAGES - 1, v ? TOOLS : NULL, v ? sizeof TOOLS - 1 : 0,
            v == 2 ? VARS : NULL, v == 2 ? sizeof VARS - 1 : 0, "<s>", "</s>", v & 1, &limits, &out,
            &out_len, &info);
        if (rc == KIRI_OK) {
            if (!kiri_utf8_valid(out, out_len))
                abort();
            kiri_mem_free(out);
        } else if (!info.message[0]) {
            abort();
        }
    }
    kiri_chat_template_free(t);
    return 0;
}
