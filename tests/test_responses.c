/* server/responses: a Responses body's translation into a chat body, the
 * Responses shapes (object, output items, SSE events) and the store, as
 * pure functions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>
#include "server/responses.h"
#include "json_sse.h"

static json_t *tr(const char *body, const char *previous, srv_rsp_req *q, char *msg) {
    json_t *b = json_loads(body, 0, NULL), *p = previous ? json_loads(previous, 0, NULL) : NULL;
    assert_non_null(b);
    json_t *chat = NULL;
    int st = srv_rsp_translate(b, p, &chat, q, msg, 512);
    json_decref(b);
    json_decref(p);
    if (st) {
        assert_int_equal(st, 400);
        assert_null(chat);
    }
    return chat;
}

static void test_translate_conversation(void **st) {
    (void)st;
    char msg[512];
    srv_rsp_req q;
    json_t *c = tr("{\"model\":\"m\",\"instructions\":\"Be brief.\",\"max_output_tokens\":99999999999,\"stream\":true,"
                   "\"store\":false,\"temperature\":0,\"input\":["
                   "{\"type\":\"message\",\"role\":\"developer\",\"content\":[{\"type\":\"input_text\",\"text\":\"Rules.\"}]},"
                   "{\"role\":\"user\",\"content\":\"Hi\"},"
                   "{\"type\":\"reasoning\",\"id\":\"rs_1\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"think\"}],"
                   "\"encrypted_content\":\"x\"},"
                   "{\"type\":\"message\",\"role\":\"assistant\",\"content\":[{\"type\":\"output_text\",\"text\":\"Let me look.\"}]},"
                   "{\"type\":\"function_call\",\"call_id\":\"call_1\",\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"},"
                   "{\"type\":\"custom_tool_call\",\"call_id\":\"call_2\",\"name\":\"g\",\"input\":\"raw\"},"
                   "{\"type\":\"function_call_output\",\"call_id\":\"call_1\",\"output\":\"one\"},"
                   "{\"type\":\"custom_tool_call_output\",\"call_id\":\"call_2\",\"output\":[{\"type\":\"input_text\",\"text\":\"two\"}]},"
                   "{\"type\":\"web_search_call\",\"id\":\"ws\"}]}",
                   "[{\"role\":\"user\",\"content\":\"before\"},{\"role\":\"assistant\",\"content\":\"ok\"}]", &q, msg);
    assert_non_null(c);
    assert_json(c, "{\"stream\":true,\"temperature\":0,\"messages\":["
                   "{\"role\":\"system\",\"content\":\"Be brief.\"},"
                   "{\"role\":\"user\",\"content\":\"before\"},{\"role\":\"assistant\",\"content\":\"ok\"},"
                   "{\"role\":\"system\",\"content\":\"Rules.\"},{\"role\":\"user\",\"content\":\"Hi\"},"
                   "{\"role\":\"assistant\",\"content\":\"Let me look.\",\"reasoning_content\":\"think\",\"tool_calls\":["
                   "{\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1}}},"
                   "{\"id\":\"call_2\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":{\"input\":\"raw\"}}}]},"
                   "{\"role\":\"tool\",\"content\":\"one\",\"tool_call_id\":\"call_1\"},"
                   "{\"role\":\"tool\",\"content\":\"two\",\"tool_call_id\":\"call_2\"}]}");
    assert_int_equal(q.max_tokens, 1 << 30);
    assert_int_equal(q.store, 0);
    assert_int_equal(q.stream, 1);
    /* the conversation kept: without instructions */
    assert_int_equal(json_array_size(q.conversation), 7);
    assert_string_equal(json_string_value(json_object_get(json_array_get(q.conversation, 0), "content")), "before");
    json_decref(c);
    srv_rsp_req_free(&q);
    /* assistant text after assistant text: two turns, the second's calls with it */
    c = tr("{\"input\":[{\"role\":\"assistant\",\"content\":\"A\"},{\"role\":\"assistant\",\"content\":\"B\"},"
           "{\"type\":\"function_call\",\"call_id\":\"c\",\"name\":\"f\",\"arguments\":\"x\"}]}", NULL, &q, msg);
    assert_json(json_object_get(c, "messages"),
                "[{\"role\":\"assistant\",\"content\":\"A\"},{\"role\":\"assistant\",\"content\":\"B\",\"tool_calls\":"
                "[{\"id\":\"c\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"x\"}}]}]");
    json_decref(c);
    srv_rsp_req_free(&q);
    c = tr("{\"input\":\"x\"}", "[{\"role\":\"user\",\"content\":\"before\"}]", &q, msg);
    assert_int_equal(json_array_size(q.conversation), 2); /* the stored turn, then the new input */
    json_decref(c);
    srv_rsp_req_free(&q);
    /* reasoning is never an error: what is not text is left out */
    c = tr("{\"input\":[{\"type\":\"reasoning\",\"summary\":5,\"content\":[{\"type\":\"odd\"},{\"text\":\"t\"}]},"
           "{\"type\":\"reasoning\",\"summary\":[7]},{\"role\":\"assistant\",\"content\":\"A\"}]}", NULL, &q, msg);
    assert_json(json_object_get(c, "messages"), "[{\"role\":\"assistant\",\"content\":\"A\",\"reasoning_content\":\"t\"}]");
    json_decref(c);
    srv_rsp_req_free(&q);
    /* a string input; leading system messages folded into one; store defaults on */
    c = tr("{\"instructions\":\"A.\",\"input\":[{\"role\":\"system\",\"content\":\"B.\"},{\"role\":\"user\",\"content\":\"x\"}],"
           "\"reasoning\":{\"effort\":\"high\",\"summary\":\"auto\"},\"include\":[\"message.output_text.logprobs\"],"
           "\"top_logprobs\":3,\"prompt_cache_key\":\"k\",\"client_metadata\":{},\"truncation\":\"auto\"}",
           NULL, &q, msg);
    assert_json(c, "{\"messages\":[{\"role\":\"system\",\"content\":\"A.\\n\\nB.\"},{\"role\":\"user\",\"content\":\"x\"}],"
                   "\"reasoning_effort\":\"high\",\"logprobs\":true,\"top_logprobs\":3}");
    assert_int_equal(q.store, 1);
    assert_int_equal(q.summary, 1);
    assert_int_equal(q.max_tokens, 0);
    json_decref(c);
    srv_rsp_req_free(&q);
}

static void test_translate_tools(void **st) {
    (void)st;
    char msg[512];
    srv_rsp_req q;
    json_t *c = tr("{\"input\":\"x\",\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"},\"parallel_tool_calls\":false,"
                   "\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"description\":\"d\",\"strict\":true,"
                   "\"parameters\":{\"type\":\"object\"}},{\"type\":\"web_search\"},"
                   "{\"type\":\"namespace\",\"name\":\"mcp\",\"tools\":[]},{\"type\":\"custom\",\"name\":\"apply_patch\","
                   "\"format\":{\"type\":\"grammar\"}}]}", NULL, &q, msg);
    assert_non_null(c);
    assert_json(json_object_get(c, "tools"),
                "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"description\":\"d\",\"parameters\":{\"type\":\"object\"},"
                "\"strict\":true}},"
                "{\"type\":\"custom\",\"name\":\"apply_patch\",\"format\":{\"type\":\"grammar\"}}]");
    assert_json(json_object_get(c, "tool_choice"), "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}");
    assert_json(json_object_get(c, "parallel_tool_calls"), "false");
    assert_int_equal(q.n_dropped, 2);
    assert_string_equal(q.dropped, "web_search,namespace");
    assert_json(q.custom, "[\"apply_patch\"]");
    json_decref(c);
    srv_rsp_req_free(&q);
    /* only hosted tools: no tools at all, and no choice among them */
    c = tr("{\"input\":\"x\",\"tools\":[{\"type\":\"web_search_preview\"}],\"tool_choice\":\"auto\"}", NULL, &q, msg);
    assert_null(json_object_get(c, "tools"));
    assert_null(json_object_get(c, "tool_choice"));
    json_decref(c);
    srv_rsp_req_free(&q);
    assert_null(tr("{\"input\":\"x\",\"tools\":[{\"type\":\"web_search\"}],\"tool_choice\":\"required\"}", NULL, &q, msg));
    assert_non_null(strstr(msg, "hosted tools are left out"));
    assert_null(tr("{\"input\":\"x\",\"tool_choice\":{\"type\":\"function\",\"name\":\"f\"}}", NULL, &q, msg));
    assert_non_null(strstr(msg, "not among"));
}

static void test_translate_refusals(void **st) {
    (void)st;
    static const char *const cases[][2] = {
        {"[]", "JSON object"},
        {"{\"input\":\"x\",\"bogus\":1}", "unknown field 'bogus'"},
        {"{}", "'input'"},
        {"{\"input\":[]}", "'input'"},
        {"{\"input\":[{\"type\":\"reasoning\",\"summary\":[]}]}", "no message"},
        {"{\"input\":[{\"role\":\"user\",\"content\":[{\"type\":\"input_image\",\"image_url\":\"u\"}]}]}", "input_image"},
        {"{\"input\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "'role'"},
        {"{\"input\":[{\"role\":\"user\",\"content\":5}]}", "content parts"},
        {"{\"input\":[{\"type\":\"function_call\",\"name\":\"f\",\"arguments\":\"{}\"}]}", "call_id"},
        {"{\"input\":[{\"type\":\"function_call_output\",\"output\":\"x\"}]}", "call_id"},
        {"{\"input\":[{\"type\":\"item_reference\",\"id\":\"x\"}]}", "item_reference"},
        {"{\"input\":[5]}", "'type'"},
        {"{\"input\":\"x\",\"max_output_tokens\":0}", "max_output_tokens"},
        {"{\"input\":\"x\",\"store\":1}", "'store'"},
        {"{\"input\":\"x\",\"metadata\":[]}", "'metadata'"},
        {"{\"input\":\"x\",\"instructions\":5}", "'instructions'"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"json_schema\"}}}", "json_schema"},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"yaml\"}}}", "yaml"},
        {"{\"input\":\"x\",\"reasoning\":{\"effort\":1}}", "reasoning.effort"},
        {"{\"input\":\"x\",\"include\":[1]}", "'include'"},
        {"{\"input\":\"x\",\"tools\":{}}", "'tools'"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\"}]}", "name"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"function\",\"name\":\"f\",\"parameters\":1}]}", "parameters"},
        {"{\"input\":\"x\",\"tools\":[{\"type\":\"teleport\"}]}", "teleport"},
        {"{\"input\":\"x\",\"tool_choice\":\"sometimes\"}", "tool_choice"},
        {"{\"input\":\"x\",\"tool_choice\":{\"type\":\"web_search\"}}", "hosted"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char msg[512] = "";
        srv_rsp_req q;
        json_t *c = tr(cases[i][0], NULL, &q, msg);
        if (c) fail_msg("accepted: %s", cases[i][0]);
        if (!strstr(msg, cases[i][1])) fail_msg("%s: '%s' does not say '%s'", cases[i][0], msg, cases[i][1]);
        assert_null(q.custom);
        assert_null(q.conversation);
    }
}

static json_t *calls(void) {
    return json_loads("[{\"id\":\"call_7\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}},"
                      "{\"id\":\"call_8\",\"type\":\"function\",\"function\":{\"name\":\"g\",\"arguments\":\"{\\\"input\\\":\\\"p\\\"}\"}}]",
                      0, NULL);
}

static void test_object(void **st) {
    (void)st;
    char msg[512];
    srv_rsp_req q;
    json_t *body = json_loads("{\"input\":\"x\",\"tools\":[{\"type\":\"custom\",\"name\":\"g\"}],\"reasoning\":{\"summary\":\"auto\"},"
                              "\"metadata\":{\"k\":\"v\"}}", 0, NULL);
    json_t *chat = NULL;
    assert_int_equal(srv_rsp_translate(body, NULL, &chat, &q, msg, sizeof msg), 0);
    json_decref(chat);
    json_t *tc = calls();
    srv_rsp_result r = {.reasoning = "hmm", .reasoning_len = 3, .content = "Hi", .content_len = 2, .tool_calls = tc,
                        .finish = OSP_FINISH_STOP, .input_tokens = 10, .cached_tokens = 4, .output_tokens = 5,
                        .status = 200};
    json_t *out = srv_rsp_output("resp_ab", &q, &r);
    assert_json(out, "[{\"id\":\"rs_ab_0\",\"type\":\"reasoning\",\"summary\":[{\"type\":\"summary_text\",\"text\":\"hmm\"}],"
                     "\"content\":[{\"type\":\"reasoning_text\",\"text\":\"hmm\"}]},"
                     "{\"id\":\"msg_ab_1\",\"type\":\"message\",\"status\":\"completed\",\"role\":\"assistant\","
                     "\"content\":[{\"type\":\"output_text\",\"text\":\"Hi\",\"annotations\":[]}]},"
                     "{\"id\":\"fc_ab_2\",\"type\":\"function_call\",\"status\":\"completed\",\"call_id\":\"call_7\","
                     "\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"},"
                     "{\"id\":\"ctc_ab_3\",\"type\":\"custom_tool_call\",\"status\":\"completed\",\"call_id\":\"call_8\","
                     "\"name\":\"g\",\"input\":\"p\"}]");
    json_t *o = srv_rsp_object(body, "resp_ab", 7, "m", out, &r);
    assert_string_equal(json_string_value(json_object_get(o, "status")), "completed");
    assert_json(json_object_get(o, "usage"), "{\"input_tokens\":10,\"input_tokens_details\":{\"cached_tokens\":4},"
                                             "\"output_tokens\":5,\"output_tokens_details\":{\"reasoning_tokens\":0},"
                                             "\"total_tokens\":15}");
    assert_json(json_object_get(o, "metadata"), "{\"k\":\"v\"}");
    assert_json(json_object_get(o, "reasoning"), "{\"effort\":null,\"summary\":\"auto\"}");
    assert_json(json_object_get(o, "store"), "true");
    assert_json(json_object_get(o, "error"), "null");
    json_decref(o);
    /* the conversation's next assistant turn */
    json_t *m = srv_rsp_reply_message(&r);
    assert_string_equal(json_string_value(json_object_get(m, "content")), "Hi");
    assert_string_equal(json_string_value(json_object_get(m, "reasoning_content")), "hmm");
    assert_int_equal(json_array_size(json_object_get(m, "tool_calls")), 2);
    json_decref(m);
    /* cut at max_output_tokens: incomplete; a failure: its code */
    srv_rsp_result cut = {.content = "H", .content_len = 1, .finish = OSP_FINISH_LENGTH, .status = 200};
    json_decref(out);
    out = srv_rsp_output("resp_ab", &q, &cut);
    o = srv_rsp_object(body, "resp_ab", 7, "m", out, &cut);
    assert_string_equal(json_string_value(json_object_get(o, "status")), "incomplete");
    assert_json(json_object_get(o, "incomplete_details"), "{\"reason\":\"max_output_tokens\"}");
    json_decref(o);
    srv_rsp_result bad = {.status = 400, .error = "the prompt exceeds the context"};
    o = srv_rsp_object(body, "resp_ab", 7, "m", out, &bad);
    assert_string_equal(json_string_value(json_object_get(o, "status")), "failed");
    assert_string_equal(json_string_value(json_object_get(json_object_get(o, "error"), "code")), "context_length_exceeded");
    json_decref(o);
    o = srv_rsp_object(body, "resp_ab", 7, "m", NULL, &r);
    assert_string_equal(json_string_value(json_object_get(o, "status")), "in_progress");
    assert_json(json_object_get(o, "usage"), "null");
    json_decref(o);
    json_decref(out);
    json_decref(tc);
    json_decref(body);
    srv_rsp_req_free(&q);
}

/* The SSE events of b, numbered 0, 1, ... */
static json_t *events(const srv_buf *b) {
    json_t *all = sse_events(b);
    for (size_t i = 0; i < json_array_size(all); i++)
        assert_int_equal(json_integer_value(json_object_get(json_array_get(all, i), "sequence_number")), i);
    return all;
}

static void test_sse(void **st) {
    (void)st;
    char msg[512];
    srv_rsp_req q;
    json_t *body = json_loads("{\"input\":\"x\",\"stream\":true,\"reasoning\":{\"summary\":\"auto\"},\"tools\":[{\"type\":\"custom\",\"name\":\"g\"}]}", 0, NULL), *chat;
    assert_int_equal(srv_rsp_translate(body, NULL, &chat, &q, msg, sizeof msg), 0);
    json_decref(chat);
    srv_rsp_sse s = {.body = body, .q = &q, .id = "resp_ab", .model = "m", .created = 7};
    srv_buf b = {0};
    json_t *tc = calls(), *final = NULL;
    srv_rsp_result r = {.tool_calls = tc, .finish = OSP_FINISH_STOP, .status = 200, .output_tokens = 3};
    assert_int_equal(srv_rsp_sse_start(&s, &b), 0);
    assert_int_equal(srv_rsp_sse_piece(&s, &b, OSP_REPLY_REASONING, "hm", 2), 0);
    assert_int_equal(srv_rsp_sse_piece(&s, &b, OSP_REPLY_REASONING, "m", 1), 0);
    assert_int_equal(srv_rsp_sse_piece(&s, &b, OSP_REPLY_CONTENT, "Hi", 2), 0);
    assert_int_equal(srv_rsp_sse_piece(&s, &b, OSP_REPLY_CONTENT, "", 0), 0);
    assert_int_equal(srv_rsp_sse_end(&s, &b, &r, &final), 0);
    json_t *ev = events(&b);
    static const char *const want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.reasoning_summary_part.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta", "response.reasoning_summary_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added", "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
        "response.output_item.done", "response.completed"};
    assert_int_equal(json_array_size(ev), sizeof want / sizeof *want);
    for (size_t i = 0; i < json_array_size(ev); i++)
        assert_string_equal(json_string_value(json_object_get(json_array_get(ev, i), "type")), want[i]);
    assert_json(json_object_get(json_array_get(ev, 9), "text"), "\"hmm\"");
    assert_json(json_object_get(json_array_get(ev, 16), "item_id"), "\"msg_ab_1\"");
    assert_json(json_object_get(json_array_get(ev, 22), "arguments"), "\"{\\\"a\\\":1}\"");
    assert_json(json_object_get(json_object_get(json_array_get(ev, 20), "item"), "arguments"), "\"\"");
    json_t *done = json_object_get(json_array_get(ev, 28), "response");
    assert_true(json_equal(done, final));
    assert_int_equal(json_array_size(json_object_get(done, "output")), 4);
    assert_string_equal(json_string_value(json_object_get(json_array_get(json_object_get(done, "output"), 3), "type")),
                        "custom_tool_call");
    json_decref(ev);
    json_decref(final);
    srv_buf_free(&b);
    srv_rsp_sse_free(&s);
    /* a failure mid-stream: the open item closes, then response.failed */
    s = (srv_rsp_sse){.body = body, .q = &q, .id = "resp_ab", .model = "m", .created = 7};
    srv_rsp_result f = {.status = 503, .error = "the server is shutting down"};
    assert_int_equal(srv_rsp_sse_start(&s, &b), 0);
    assert_int_equal(srv_rsp_sse_piece(&s, &b, OSP_REPLY_CONTENT, "Hi", 2), 0);
    assert_int_equal(srv_rsp_sse_end(&s, &b, &f, &final), 0);
    ev = events(&b);
    json_t *last = json_array_get(ev, json_array_size(ev) - 1);
    assert_string_equal(json_string_value(json_object_get(last, "type")), "response.failed");
    assert_json(json_object_get(json_object_get(last, "response"), "error"),
                "{\"code\":\"server_error\",\"message\":\"the server is shutting down\"}");
    json_decref(ev);
    json_decref(final);
    srv_buf_free(&b);
    srv_rsp_sse_free(&s);
    /* an empty reply still has its message */
    s = (srv_rsp_sse){.body = body, .q = &q, .id = "resp_ab", .model = "m", .created = 7};
    srv_rsp_result e = {.status = 200};
    assert_int_equal(srv_rsp_sse_start(&s, &b), 0);
    assert_int_equal(srv_rsp_sse_end(&s, &b, &e, &final), 0);
    assert_int_equal(json_array_size(json_object_get(final, "output")), 1);
    json_decref(final);
    srv_buf_free(&b);
    srv_rsp_sse_free(&s);
    json_decref(tc);
    json_decref(body);
    srv_rsp_req_free(&q);
}

static void test_store(void **st) {
    (void)st;
    char dir[] = "/tmp/osp_rsp_store_XXXXXX";
    assert_non_null(mkdtemp(dir));
    json_t *resp = json_pack("{s:s}", "id", "resp_a"), *conv = json_pack("[{s:s,s:s}]", "role", "user", "content", "x");
    json_t *r = NULL, *c = NULL;
    srv_rsp_store *s = srv_rsp_store_open(1 << 20, 3600, dir);
    assert_non_null(s);
    assert_int_equal(srv_rsp_store_put(s, "resp_a", resp, conv), 0);
    assert_int_equal(srv_rsp_store_get(s, "resp_a", &r, &c), 0);
    assert_true(json_equal(r, resp) && json_equal(c, conv));
    json_decref(r), json_decref(c);
    assert_int_equal(srv_rsp_store_get(s, "resp_b", &r, &c), -1);
    assert_int_equal(srv_rsp_store_get(s, "../etc/passwd", &r, &c), -1);
    assert_int_equal(srv_rsp_store_put(s, "a/b", resp, conv), -1);
    size_t one = srv_rsp_store_bytes(s);
    assert_true(one > 0);
    srv_rsp_store_close(s);
    /* a restart reads the folder back */
    s = srv_rsp_store_open(1 << 20, 3600, dir);
    assert_int_equal(srv_rsp_store_get(s, "resp_a", &r, &c), 0);
    json_decref(r), json_decref(c);
    assert_int_equal(srv_rsp_store_delete(s, "resp_a"), 0);
    assert_int_equal(srv_rsp_store_delete(s, "resp_a"), -1);
    srv_rsp_store_close(s);
    s = srv_rsp_store_open(1 << 20, 3600, dir);
    assert_int_equal(srv_rsp_store_get(s, "resp_a", &r, &c), -1);
    srv_rsp_store_close(s);
    /* bounded in bytes: the least recently used goes (from the folder too) */
    s = srv_rsp_store_open(one * 2 + one / 2, 3600, dir);
    srv_rsp_store_put(s, "resp_1", resp, conv);
    srv_rsp_store_put(s, "resp_2", resp, conv);
    assert_int_equal(srv_rsp_store_get(s, "resp_1", &r, &c), 0); /* now 2 is the oldest */
    json_decref(r), json_decref(c);
    srv_rsp_store_put(s, "resp_3", resp, conv);
    assert_int_equal(srv_rsp_store_get(s, "resp_2", &r, &c), -1);
    assert_int_equal(srv_rsp_store_get(s, "resp_1", &r, &c), 0);
    json_decref(r), json_decref(c);
    assert_true(srv_rsp_store_bytes(s) <= one * 2 + one / 2);
    char p[200];
    snprintf(p, sizeof p, "%s/resp_2.json", dir);
    assert_int_equal(access(p, F_OK), -1);
    srv_rsp_store_close(s);
    /* past the TTL: gone (and its file) */
    s = srv_rsp_store_open(1 << 20, 1e-9, dir);
    assert_int_equal(srv_rsp_store_get(s, "resp_1", &r, &c), -1);
    srv_rsp_store_put(s, "resp_4", resp, conv);
    usleep(1000);
    assert_int_equal(srv_rsp_store_get(s, "resp_4", &r, &c), -1);
    srv_rsp_store_close(s);
    /* memory only */
    s = srv_rsp_store_open(1 << 20, 3600, NULL);
    assert_int_equal(srv_rsp_store_put(s, "resp_m", resp, conv), 0);
    assert_int_equal(srv_rsp_store_get(s, "resp_m", &r, &c), 0);
    json_decref(r), json_decref(c);
    srv_rsp_store_close(s);
    snprintf(p, sizeof p, "%s/resp_m.json", dir);
    assert_int_equal(access(p, F_OK), -1);
    json_decref(resp), json_decref(conv);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    assert_int_equal(system(cmd), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_translate_conversation), cmocka_unit_test(test_translate_tools),
        cmocka_unit_test(test_translate_refusals),     cmocka_unit_test(test_object),
        cmocka_unit_test(test_sse),                    cmocka_unit_test(test_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
