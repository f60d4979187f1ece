/* libFuzzer: an OpenAI Responses body → the chat body it becomes
 * (server/responses' translation; the first byte's low bit: with a stored
 * conversation before it), and the reply shapes it leads to: the object, the
 * output items and the SSE events, whole and failed. A translated body must
 * be what request.c expects of a chat body: an object whose 'messages' is a
 * non-empty list of messages with a known role and string (or, beside tool
 * calls, null) content; the conversation kept must hold at most one
 * message fewer (the instructions). */
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "server/responses.h"
#include "fuzz_chat.h"

static void check_sse(const json_t *body, const srv_rsp_req *q, const char *text, size_t n, const json_t *calls, int status) {
    srv_rsp_sse s = {.body = body, .q = q, .id = "resp_x", .model = "m", .created = 1};
    srv_buf b = {0};
    json_t *final = NULL;
    srv_rsp_result r = {.content = text, .content_len = n, .tool_calls = calls, .status = status, .error = "failed"};
    if (srv_rsp_sse_start(&s, &b) || srv_rsp_sse_piece(&s, &b, OSP_REPLY_REASONING, text, n / 3) ||
        srv_rsp_sse_piece(&s, &b, OSP_REPLY_CONTENT, text, n / 2) || srv_rsp_sse_end(&s, &b, &r, &final) || !final)
        __builtin_trap();
    json_decref(final);
    srv_buf_free(&b);
    srv_rsp_sse_free(&s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!size) return 0;
    json_t *body = json_loadb((const char *)data + 1, size - 1, JSON_REJECT_DUPLICATES, NULL);
    if (!body) return 0;
    json_t *prev = data[0] & 1 ? json_pack("[{s:s,s:s},{s:s,s:s}]", "role", "user", "content", "a", "role", "assistant",
                                           "content", "b")
                               : NULL;
    char msg[512] = "";
    json_t *chat = NULL;
    srv_rsp_req q;
    int st = srv_rsp_translate(body, prev, &chat, &q, msg, sizeof msg);
    if (st) {
        if (st != 400 || chat || !msg[0] || q.custom || q.conversation) __builtin_trap();
    } else {
        if (!chat || q.max_tokens < 0 || !json_is_array(q.custom) || !json_array_size(q.conversation)) __builtin_trap();
        check_chat(chat);
        size_t nm = json_array_size(json_object_get(chat, "messages")), nc = json_array_size(q.conversation);
        /* + instructions, - leading system messages folded into one */
        if (nm > nc + 1 || (prev && nc < 2)) __builtin_trap();
        /* the shapes of a reply to it: its text as content, a call to each of its tools */
        char *text = json_dumps(chat, JSON_COMPACT);
        size_t n = text ? strlen(text) : 0;
        json_t *calls = json_array(), *t;
        size_t i;
        json_array_foreach(json_object_get(chat, "tools"), i, t)
            json_array_append_new(calls, json_pack("{s:s,s:s,s:{s:O,s:s}}", "id", "call_1", "type", "function", "function",
                                                   "name", json_object_get(json_object_get(t, "function"), "name"),
                                                   "arguments", i & 1 ? "{\"input\":\"x\"}" : "not json"));
        srv_rsp_result r = {.content = text, .content_len = n / 2, .reasoning = text, .reasoning_len = n / 3,
                            .tool_calls = calls, .status = 200, .finish = (osp_finish)(data[0] >> 1 & 1)};
        json_t *out = srv_rsp_output("resp_x", &q, &r), *o = srv_rsp_object(body, "resp_x", 1, "m", out, &r);
        json_t *m = srv_rsp_reply_message(&r);
        if (!out || !o || !m || json_array_size(out) < json_array_size(calls)) __builtin_trap();
        json_decref(out), json_decref(o), json_decref(m);
        check_sse(body, &q, text, n, calls, 200);
        check_sse(body, &q, text, n, calls, 500);
        json_decref(calls);
        free(text);
        json_decref(chat);
        srv_rsp_req_free(&q);
    }
    json_decref(prev);
    json_decref(body);
    return 0;
}
