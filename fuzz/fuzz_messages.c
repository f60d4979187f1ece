/* libFuzzer: an Anthropic Messages body → the chat body it becomes
 * (server/anthropic's translation; the first byte's low bit: count_tokens),
 * and that chat body's reply shapes. A translated body must be what
 * request.c expects of a chat body: an object whose 'messages' is a
 * non-empty list of messages with a known role and string (or, beside tool
 * calls, null) content. */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/anthropic.h"
#include "fuzz_chat.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    json_t *body = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, NULL);
    if (!body) return 0;
    char msg[512] = "";
    json_t *chat = NULL;
    int32_t max_tokens = -1;
    int st = srv_msg_translate(body, data[0] & 1, &chat, &max_tokens, msg, sizeof msg);
    if (st) {
        if (st != 400 || chat || !msg[0]) __builtin_trap();
        json_t *e = srv_msg_error_json(st, msg);
        if (!json_is_object(json_object_get(e, "error"))) __builtin_trap();
        json_decref(e);
    } else {
        if (!chat || max_tokens < 0 || (!(data[0] & 1) && max_tokens < 1)) __builtin_trap();
        check_chat(chat);
        /* the shapes of a reply to it: its text as content, a stop string from it */
        char *text = json_dumps(chat, JSON_COMPACT);
        size_t n = text ? strlen(text) : 0;
        srv_msg_result m = {.id = "msg_x", .model = "m", .content = text, .content_len = n / 2, .reasoning = text,
                            .reasoning_len = n / 3, .stop_reason = "end_turn"};
        json_t *o = srv_msg_body(&m);
        if (!o) __builtin_trap();
        json_decref(o);
        srv_buf b = {0};
        srv_msg_sse s;
        if (srv_msg_sse_start(&s, &b, "msg_x", "m", 1) || srv_msg_sse_piece(&s, &b, OSP_REPLY_REASONING, text, n / 3) ||
            srv_msg_sse_piece(&s, &b, OSP_REPLY_CONTENT, text, n / 2) || srv_msg_sse_end(&s, &b, &m))
            __builtin_trap();
        srv_buf_free(&b);
        const char *stops[] = {text ? text + n / 2 : ""};
        if (n && srv_msg_matched_stop(stops, 1, text, n, n / 2) != stops[0]) __builtin_trap();
        free(text);
        json_decref(chat);
    }
    json_decref(body);
    return 0;
}
