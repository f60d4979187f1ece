/* What the translating harnesses (fuzz_messages, fuzz_responses) require of
 * a chat body: what request.c expects, an object whose 'messages' is a
 * non-empty list of messages with a known role and string (or, beside tool
 * calls, null) content. */
#ifndef OSP_FUZZ_CHAT_H
#define OSP_FUZZ_CHAT_H

#include <jansson.h>
#include <string.h>

static void check_chat(const json_t *c) {
    json_t *msgs = json_object_get(c, "messages");
    if (!json_is_array(msgs) || !json_array_size(msgs)) __builtin_trap();
    size_t i;
    json_t *m;
    json_array_foreach(msgs, i, m) {
        const char *r = json_string_value(json_object_get(m, "role"));
        json_t *content = json_object_get(m, "content");
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")))
            __builtin_trap();
        if (!json_is_string(content) && !(json_is_null(content) && json_object_get(m, "tool_calls"))) __builtin_trap();
    }
}

#endif
