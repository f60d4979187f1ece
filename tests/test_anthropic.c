/* server/anthropic: a Messages body's translation into a chat body, and the
 * Messages response shapes (body, SSE events, errors), as pure functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "server/anthropic.h"
#include "json_sse.h"

static json_t *tr(const char *body, int count_only, int32_t *mt, char *msg) {
    json_t *b = json_loads(body, 0, NULL);
    assert_non_null(b);
    json_t *chat = NULL;
    int32_t m = -1;
    int st = srv_msg_translate(b, count_only, &chat, &m, msg, 512);
    json_decref(b);
    if (mt) *mt = m;
    if (st) {
        assert_int_equal(st, 400);
        assert_null(chat);
    }
    return chat;
}

static void test_translate_conversation(void **st) {
    (void)st;
    char msg[512];
    int32_t mt;
    json_t *c = tr("{\"model\":\"m\",\"max_tokens\":99999999,\"system\":[{\"type\":\"text\",\"text\":"
                   "\"x-anthropic-billing-header: cc_version=1\"},{\"type\":\"text\",\"text\":\"Be brief.\","
                   "\"cache_control\":{\"type\":\"ephemeral\"}}],\"temperature\":0,\"stream\":true,"
                   "\"metadata\":{\"user_id\":\"u\"},\"stop_sequences\":[\"END\"],"
                   "\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                   "{\"role\":\"assistant\",\"content\":[{\"type\":\"thinking\",\"thinking\":\"hmm\",\"signature\":\"s\"},"
                   "{\"type\":\"text\",\"text\":\"Let me look.\"},"
                   "{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"w\",\"input\":{\"city\":\"Paris\"}}]},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"tool_result\",\"tool_use_id\":\"toolu_1\","
                   "\"content\":[{\"type\":\"text\",\"text\":\"sunny\"}]},{\"type\":\"text\",\"text\":\"and?\"}]}]}",
                   0, &mt, msg);
    assert_non_null(c);
    assert_int_equal(mt, 99999999); /* kept, cut later to the context */
    assert_json(json_object_get(c, "messages"),
                "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
                "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"reasoning_content\":\"hmm\",\"tool_calls\":"
                "[{\"id\":\"toolu_1\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":{\"city\":\"Paris\"}}}]},"
                "{\"role\":\"tool\",\"content\":\"sunny\",\"tool_call_id\":\"toolu_1\"},"
                "{\"role\":\"user\",\"content\":\"and?\"}]");
    assert_json(json_object_get(c, "stop"), "[\"END\"]");
    assert_json(json_object_get(c, "temperature"), "0");
    assert_json(json_object_get(c, "stream"), "true");
    assert_null(json_object_get(c, "max_tokens"));
    assert_null(json_object_get(c, "metadata"));
    json_decref(c);
}

/* Claude Code 2.1.33x sends its environment as a system message after the
 * user's: user text where it stands, joined to the user turn beside it (as
 * the API combines consecutive user turns), so roles still alternate. */
static void test_translate_system_message(void **st) {
    (void)st;
    char msg[512];
    json_t *c = tr("{\"max_tokens\":5,\"system\":\"S\",\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":"
                   "\"text\",\"text\":\"reminder\"},{\"type\":\"text\",\"text\":\"Hi\"}]},"
                   "{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"# Environment\","
                   "\"cache_control\":{\"type\":\"ephemeral\"}}]},{\"role\":\"assistant\",\"content\":\"Hello\"},"
                   "{\"role\":\"system\",\"content\":\"late\"},{\"role\":\"system\",\"content\":[]},{\"role\":\"user\",\"content\":\"Bye\"},"
                   "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"again\"}]}]}",
                   0, NULL, msg);
    assert_non_null(c);
    assert_json(json_object_get(c, "messages"),
                "[{\"role\":\"system\",\"content\":\"S\"},{\"role\":\"user\",\"content\":\"reminder\\n\\nHi\\n\\n"
                "# Environment\"},{\"role\":\"assistant\",\"content\":\"Hello\"},"
                "{\"role\":\"user\",\"content\":\"late\\n\\nBye\\n\\nagain\"}]");
    json_decref(c);
}

static void test_translate_tools(void **st) {
    (void)st;
    char msg[512];
    json_t *c = tr("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],"
                   "\"tools\":[{\"name\":\"w\",\"description\":\"d\",\"input_schema\":{\"type\":\"object\"}}],"
                   "\"tool_choice\":{\"type\":\"tool\",\"name\":\"w\",\"disable_parallel_tool_use\":true},"
                   "\"thinking\":{\"type\":\"disabled\"},\"output_config\":{\"effort\":\"low\"}}",
                   0, NULL, msg);
    assert_non_null(c);
    assert_json(json_object_get(c, "tools"), "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"description\":\"d\","
                                             "\"parameters\":{\"type\":\"object\"}}}]");
    assert_json(json_object_get(c, "tool_choice"), "{\"type\":\"function\",\"function\":{\"name\":\"w\"}}");
    assert_json(json_object_get(c, "parallel_tool_calls"), "false");
    assert_json(json_object_get(c, "chat_template_kwargs"), "{\"enable_thinking\":false}");
    assert_json(json_object_get(c, "reasoning_effort"), "\"low\"");
    json_decref(c);
    c = tr("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"w\"}],"
           "\"tool_choice\":{\"type\":\"any\"}}", 0, NULL, msg);
    assert_json(json_object_get(c, "tool_choice"), "\"required\"");
    json_decref(c);
    /* Claude Code's DeferredToolPlaceholder: a deferred tool stays out of the prompt */
    c = tr("{\"max_tokens\":5,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"w\"},"
           "{\"name\":\"P\",\"input_schema\":{\"type\":\"object\"},\"defer_loading\":true},"
           "{\"name\":\"v\",\"defer_loading\":false}]}", 0, NULL, msg);
    assert_json(json_object_get(c, "tools"), "[{\"type\":\"function\",\"function\":{\"name\":\"w\",\"parameters\":"
                                             "{\"type\":\"object\"}}},{\"type\":\"function\",\"function\":{\"name\":"
                                             "\"v\",\"parameters\":{\"type\":\"object\"}}}]");
    json_decref(c);
}

static void test_translate_refusals(void **st) {
    (void)st;
    static const struct { const char *body, *says; } T[] = {
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "'max_tokens' is required"},
        {"{\"max_tokens\":0,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", "max_tokens"},
        {"{\"max_tokens\":1,\"messages\":[]}", "'messages'"},
        {"{\"max_tokens\":1,\"frequency_penalty\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}",
         "unknown field 'frequency_penalty'"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "'role'"},
        {"{\"max_tokens\":1,\"system\":\"s\",\"messages\":[{\"role\":\"system\",\"content\":[]}]}",
         "nothing but empty system messages"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"system\",\"content\":[{\"type\":\"image\"}]}]}",
         "messages[0].content[0] must be a text block"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image\",\"source\":{}}]}]}",
         "'image' blocks are not supported"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"document\"}]}]}", "'document'"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"tool_use\",\"id\":\"a\","
         "\"name\":\"b\"}]}]}", "'tool_use' is not supported"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"type\":"
         "\"web_search_20250305\",\"name\":\"s\"}]}", "not supported"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tools\":[{\"name\":\"s\","
         "\"defer_loading\":1}]}", "'defer_loading' must be a boolean"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"tool_choice\":{\"type\":\"tool\"}}",
         "needs a string 'name'"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"thinking\":{\"type\":\"on\"}}",
         "'thinking.type'"},
        {"{\"max_tokens\":1,\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"stop_sequences\":\"x\"}",
         "'stop_sequences'"},
        {"[1]", "JSON object"},
    };
    for (size_t i = 0; i < sizeof T / sizeof *T; i++) {
        char msg[512] = "";
        json_t *c = tr(T[i].body, 0, NULL, msg);
        if (c || !strstr(msg, T[i].says)) fail_msg("%s: got '%s', want '%s'", T[i].body, msg, T[i].says);
    }
    char msg[512];
    json_t *c = tr("{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}", 1, NULL, msg); /* count_tokens */
    assert_non_null(c);
    json_decref(c);
}

static void test_error_message(void **st) {
    (void)st;
    char buf[128];
    srv_reject over = {SRV_REJECT_OVER_CONTEXT, 5000, 2048}, other = {0};
    assert_string_equal(srv_msg_error_message("the prompt has 5000 tokens; the context holds 2048", &over, buf,
                                              sizeof buf),
                        "prompt is too long: 5000 tokens > 2047 maximum");
    assert_string_equal(srv_msg_error_message("the prompt is empty", &other, buf, sizeof buf), "the prompt is empty");
    assert_string_equal(srv_msg_error_message("the prompt is empty", NULL, buf, sizeof buf), "the prompt is empty");
    assert_null(srv_msg_error_message(NULL, &other, buf, sizeof buf));
}

static void test_stop(void **st) {
    (void)st;
    const char *stops[] = {"abc", "ab", "zz"};
    assert_string_equal(srv_msg_matched_stop(stops, 3, "hello abc", 9, 6), "ab");
    assert_null(srv_msg_matched_stop(stops, 3, "hello", 5, 5));
    assert_null(srv_msg_matched_stop(stops, 3, "hello", 5, 9));
    assert_string_equal(srv_msg_stop_reason(OSP_FINISH_STOP, 0, "ab"), "stop_sequence");
    assert_string_equal(srv_msg_stop_reason(OSP_FINISH_STOP, 0, NULL), "end_turn");
    assert_string_equal(srv_msg_stop_reason(OSP_FINISH_LENGTH, 0, NULL), "max_tokens");
    assert_string_equal(srv_msg_stop_reason(OSP_FINISH_STOP, 1, NULL), "tool_use");
}

static json_t *calls(void) {
    return json_loads("[{\"id\":\"call_abc\",\"type\":\"function\",\"function\":{\"name\":\"w\",\"arguments\":"
                      "\"{\\\"city\\\":\\\"Paris\\\"}\"}}]", 0, NULL);
}

static void test_body(void **st) {
    (void)st;
    json_t *tc = calls();
    srv_msg_result m = {.id = "msg_1", .model = "fortune", .reasoning = "r", .reasoning_len = 1, .content = "Hi",
                        .content_len = 2, .tool_calls = tc, .stop_reason = "tool_use", .input_tokens = 10,
                        .cached_tokens = 4, .output_tokens = 3};
    json_t *o = srv_msg_body(&m);
    assert_json(o, "{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"model\":\"fortune\",\"content\":["
                   "{\"type\":\"thinking\",\"thinking\":\"r\",\"signature\":\"osprey-local\"},"
                   "{\"type\":\"text\",\"text\":\"Hi\"},"
                   "{\"type\":\"tool_use\",\"id\":\"toolu_abc\",\"name\":\"w\",\"input\":{\"city\":\"Paris\"}}],"
                   "\"stop_reason\":\"tool_use\",\"stop_sequence\":null,\"usage\":{\"input_tokens\":6,"
                   "\"cache_creation_input_tokens\":0,\"cache_read_input_tokens\":4,\"output_tokens\":3}}");
    json_decref(o);
    json_decref(tc);
    srv_msg_result e = {.id = "msg_2", .model = "m", .stop_reason = "stop_sequence", .stop_sequence = "X"};
    o = srv_msg_body(&e); /* an empty reply still has its text block */
    assert_json(json_object_get(o, "content"), "[{\"type\":\"text\",\"text\":\"\"}]");
    assert_json(json_object_get(o, "stop_sequence"), "\"X\"");
    json_decref(o);
}

static void test_sse(void **st) {
    (void)st;
    srv_buf b = {0};
    srv_msg_sse s;
    json_t *tc = calls();
    assert_int_equal(srv_msg_sse_start(&s, &b, "msg_1", "m", 7), 0);
    assert_int_equal(srv_msg_sse_piece(&s, &b, OSP_REPLY_REASONING, "th", 2), 0);
    assert_int_equal(srv_msg_sse_piece(&s, &b, OSP_REPLY_CONTENT, "He", 2), 0);
    assert_int_equal(srv_msg_sse_piece(&s, &b, OSP_REPLY_CONTENT, "llo", 3), 0);
    srv_msg_result m = {.tool_calls = tc, .stop_reason = "tool_use", .input_tokens = 7, .output_tokens = 5};
    assert_int_equal(srv_msg_sse_end(&s, &b, &m), 0);
    assert_int_equal(srv_msg_sse_ping(&b), 0);
    json_t *ev = sse_events(&b);
    static const char *order[] = {"message_start", "content_block_start", "content_block_delta", "content_block_delta",
                                  "content_block_stop", "content_block_start", "content_block_delta",
                                  "content_block_delta", "content_block_stop", "content_block_start",
                                  "content_block_delta", "content_block_stop", "message_delta", "message_stop", "ping"};
    assert_int_equal(json_array_size(ev), sizeof order / sizeof *order);
    for (size_t i = 0; i < json_array_size(ev); i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(ev, i), "type")), order[i]);
    assert_json(json_object_get(json_array_get(ev, 3), "delta"), "{\"type\":\"signature_delta\",\"signature\":\"osprey-local\"}");
    assert_json(json_array_get(ev, 7), "{\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"text_delta\",\"text\":\"llo\"}}");
    assert_json(json_object_get(json_array_get(ev, 9), "content_block"),
                "{\"type\":\"tool_use\",\"id\":\"toolu_abc\",\"name\":\"w\",\"input\":{}}");
    assert_json(json_object_get(json_array_get(ev, 10), "delta"),
                "{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"city\\\":\\\"Paris\\\"}\"}");
    assert_json(json_object_get(json_array_get(ev, 12), "delta"), "{\"stop_reason\":\"tool_use\",\"stop_sequence\":null}");
    assert_json(json_object_get(json_object_get(json_array_get(ev, 12), "usage"), "output_tokens"), "5");
    json_decref(ev);
    json_decref(tc);
    srv_buf_free(&b);
    b = (srv_buf){0};
    assert_int_equal(srv_msg_sse_error(&b, 503, "busy"), 0);
    ev = sse_events(&b);
    assert_json(ev, "[{\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}]");
    json_decref(ev);
    srv_buf_free(&b);
}

static void test_errors(void **st) {
    (void)st;
    json_t *e = srv_msg_error_json(413, "too big");
    assert_json(e, "{\"type\":\"error\",\"error\":{\"type\":\"request_too_large\",\"message\":\"too big\"}}");
    json_decref(e);
    assert_string_equal(srv_msg_error_type(400), "invalid_request_error");
    assert_string_equal(srv_msg_error_type(401), "authentication_error");
    assert_string_equal(srv_msg_error_type(404), "not_found_error");
    assert_string_equal(srv_msg_error_type(500), "api_error");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translate_conversation),
        cmocka_unit_test(test_translate_system_message), cmocka_unit_test(test_translate_tools),
        cmocka_unit_test(test_translate_refusals),     cmocka_unit_test(test_stop), cmocka_unit_test(test_error_message),
        cmocka_unit_test(test_body),                   cmocka_unit_test(test_sse),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
