/* Reply splitting (server/reply): reasoning, content and tool calls of Qwen,
 * Llama 3 and Gemma 4 replies. Every case is checked whole, in every 2-way
 * split and character by character (cuts only between UTF-8 characters):
 * the concatenated content, the concatenated reasoning and the tool calls
 * must not depend on the cuts. Also streaming (what is emitted before the
 * end), cancellation, and format detection on the real templates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "server/reply.h"

#define DATA "data/templates"
#define CAP 16384

typedef struct cfg {
    osp_reply_format fmt;
    int reasoning, tools, start_in;
} cfg;

typedef struct result {
    char content[CAP], reasoning[CAP], calls[CAP]; /* calls: "name args\n" each */
    int n_emits, stop_after;                          /* stop_after > 0: cancel on that emit */
} result;

static void append(char *dst, const char *s, size_t n) {
    size_t l = strlen(dst);
    assert_true(l + n < CAP);
    memcpy(dst + l, s, n);
    dst[l + n] = 0;
}

static int collect(void *user, osp_reply_kind kind, const char *text, size_t len) {
    result *r = user;
    assert_true(len > 0);
    append(kind == OSP_REPLY_REASONING ? r->reasoning : r->content, text, len);
    r->n_emits++;
    return r->stop_after > 0 && r->n_emits >= r->stop_after;
}

/* Checks the OpenAI shape and summarizes the calls as "name args\n". */
static void summarize(json_t *calls, char *out) {
    assert_true(json_is_array(calls));
    out[0] = 0;
    for (size_t i = 0; i < json_array_size(calls); i++) {
        json_t *c = json_array_get(calls, i);
        const char *id = json_string_value(json_object_get(c, "id"));
        assert_non_null(id);
        assert_true(strncmp(id, "call_", 5) == 0 && strlen(id) > 5);
        for (size_t j = 0; j < i; j++)
            assert_string_not_equal(id, json_string_value(json_object_get(json_array_get(calls, j), "id")));
        assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
        json_t *fn = json_object_get(c, "function");
        const char *name = json_string_value(json_object_get(fn, "name"));
        const char *args = json_string_value(json_object_get(fn, "arguments"));
        assert_non_null(name);
        assert_non_null(args);
        json_error_t err;
        json_t *parsed = json_loads(args, 0, &err); /* arguments: a serialized object */
        assert_true(json_is_object(parsed));
        json_decref(parsed);
        append(out, name, strlen(name));
        append(out, " ", 1);
        append(out, args, strlen(args));
        append(out, "\n", 1);
    }
}

/* Feed text cut at cuts[0..nc) (increasing offsets), then finish. */
static void run_cuts(cfg c, const char *text, const size_t *cuts, int nc, result *res) {
    memset(res, 0, sizeof *res);
    osp_reply *r;
    assert_int_equal(osp_reply_new(c.fmt, c.reasoning, c.tools, c.start_in, &r), OSP_OK);
    size_t n = strlen(text), at = 0;
    for (int i = 0; i <= nc; i++) {
        size_t end = i < nc ? cuts[i] : n;
        assert_int_equal(osp_reply_feed(r, text + at, end - at, collect, res), OSP_OK);
        at = end;
    }
    json_t *calls = NULL;
    assert_int_equal(osp_reply_finish(r, collect, res, &calls), OSP_OK);
    summarize(calls, res->calls);
    json_decref(calls);
    osp_reply_free(r);
}

static int char_start(const char *text, size_t i) { return ((unsigned char)text[i] & 0xC0) != 0x80; }

static void same(const result *a, const result *b, const char *text, const char *how) {
    if (strcmp(a->content, b->content) || strcmp(a->reasoning, b->reasoning) || strcmp(a->calls, b->calls))
        fail_msg("%s differs for %s\ncontent [%s] vs [%s]\nreasoning [%s] vs [%s]\ncalls [%s] vs [%s]", how,
                 text, a->content, b->content, a->reasoning, b->reasoning, a->calls, b->calls);
}

static void check(cfg c, const char *text, const char *content, const char *reasoning, const char *calls) {
    static result whole, part;
    run_cuts(c, text, NULL, 0, &whole);
    if (strcmp(whole.content, content) || strcmp(whole.reasoning, reasoning) || strcmp(whole.calls, calls))
        fail_msg("text [%s]\ncontent [%s] want [%s]\nreasoning [%s] want [%s]\ncalls [%s] want [%s]", text,
                 whole.content, content, whole.reasoning, reasoning, whole.calls, calls);
    size_t n = strlen(text);
    for (size_t i = 0; i <= n; i++) {
        if (i < n && !char_start(text, i)) continue;
        run_cuts(c, text, &i, 1, &part);
        char how[64];
        snprintf(how, sizeof how, "split at %zu", i);
        same(&whole, &part, text, how);
    }
    size_t *cuts = malloc((n + 1) * sizeof *cuts);
    int nc = 0;
    for (size_t i = 1; i < n; i++)
        if (char_start(text, i)) cuts[nc++] = i;
    run_cuts(c, text, cuts, nc, &part);
    same(&whole, &part, text, "character by character");
    free(cuts);
}

static const cfg QWEN = {OSP_REPLY_QWEN, 1, 1, 0};
static const cfg LLAMA = {OSP_REPLY_LLAMA3, 1, 1, 0};
static const cfg GEMMA = {OSP_REPLY_GEMMA4, 1, 1, 0};

#define QCALL(name, args) "<tool_call>\n{\"name\": \"" name "\", \"arguments\": " args "}\n</tool_call>"

static void test_qwen_reasoning(void **st) {
    (void)st;
    check(QWEN, "<think>\nLet me think.\nTwo lines.\n</think>\n\nThe answer is 4.", "The answer is 4.",
          "Let me think.\nTwo lines.", "");
    check(QWEN, "<think>\n\n</think>\n\nHello", "Hello", "", "");
    check(QWEN, "\n<think>r</think>c", "c", "r", "");
    check(QWEN, "<think>\nstill thinking  \n", "", "still thinking", ""); /* unterminated */
    check(QWEN, "Hello there", "Hello there", "", "");
    check(QWEN, "  Hello  world  ", "  Hello  world  ", "", "");
    /* only at the start; an unopened closer is content */
    check(QWEN, "Hello <think>x</think> y", "Hello <think>x</think> y", "", "");
    check(QWEN, "foo</think>bar", "foo</think>bar", "", "");
    /* lookalikes and a dangling '<' */
    check(QWEN, "<thinking> a <tool_calls> b <", "<thinking> a <tool_calls> b <", "", "");
    check(QWEN, "<thi", "<thi", "", "");
    check(QWEN, "<think>\n思考… 🎉\n</think>\n\n答え: 42 ✓", "答え: 42 ✓", "思考… 🎉", "");
    cfg in = QWEN;
    in.start_in = 1;
    check(in, "\nLet me think.\n</think>\n\nHi", "Hi", "Let me think.", "");
    check(in, "no closer at all", "", "no closer at all", "");
    check(in, "</think>Hi", "Hi", "", "");
}

static void test_qwen_tools(void **st) {
    (void)st;
    check(QWEN, "<think>\nNeed weather.\n</think>\n\n" QCALL("get_weather", "{\"city\": \"Paris\"}"), "",
          "Need weather.", "get_weather {\"city\":\"Paris\"}\n");
    check(QWEN,
          "Let me check both.\n" QCALL("get_weather", "{\"city\": \"Paris\"}") "\n" QCALL(
              "get_weather", "{\"city\": \"London\", \"days\": [1, 2]}") "\n",
          "Let me check both.", "", "get_weather {\"city\":\"Paris\"}\nget_weather {\"city\":\"London\",\"days\":[1,2]}\n");
    check(QWEN, "A\n" QCALL("f", "{}") "\nB", "AB", "", "f {}\n");
    /* numbers as written, escapes kept, unicode, nested */
    check(QWEN, QCALL("calc", "{\"x\": 0.1, \"y\": 1e3, \"q\": \"a\\\"b \\u00e9 Zürich\", \"o\": {\"k\": [true, null]}}"),
          "", "", "calc {\"x\":0.1,\"y\":1e3,\"q\":\"a\\\"b \\u00e9 Zürich\",\"o\":{\"k\":[true,null]}}\n");
    /* "parameters" synonym, serialized arguments, no arguments */
    check(QWEN, "<tool_call>{\"name\": \"f\", \"parameters\": {\"a\": 1}}</tool_call>", "", "", "f {\"a\":1}\n");
    check(QWEN, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>", "", "",
          "f {\"a\": 1}\n");
    check(QWEN, "<tool_call>{\"name\": \"f\"}</tool_call>", "", "", "f {}\n");
}

static void test_qwen_malformed(void **st) {
    (void)st;
    const char *bad[] = {
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {bad}}\n</tool_call>",
        "<tool_call>\n{\"arguments\": {}}\n</tool_call>",                    /* no name */
        "<tool_call>\n{\"name\": \"f\", \"arguments\": [1]}\n</tool_call>",  /* not an object */
        "<tool_call>\n{\"name\": \"f\", \"arguments\": \"nope\"}\n</tool_call>",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}} extra\n</tool_call>",
        "<tool_call></tool_call>",
        "Sure.\n<tool_call>\n{\"name\": \"f\"", /* never closed */
        "Sure. <tool_",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) check(QWEN, bad[i], bad[i], "", "");
    /* a bad block between good ones keeps its place (whitespace next to a
     * good block is dropped, as always) */
    check(QWEN, "x " QCALL("f", "{}") " <tool_call>oops</tool_call> " QCALL("g", "{}"),
          "x<tool_call>oops</tool_call>", "", "f {}\ng {}\n");
    check(QWEN, "x <tool_call>oops</tool_call> y", "x <tool_call>oops</tool_call> y", "", "");
}

static void test_disabled(void **st) {
    (void)st;
    const char *t = "<think>\nr\n</think>\n\n" QCALL("f", "{}");
    check((cfg){OSP_REPLY_QWEN, 0, 0, 0}, t, t, "", "");
    check((cfg){OSP_REPLY_QWEN, 0, 0, 1}, t, t, "", ""); /* start_in ignored without reasoning */
    check((cfg){OSP_REPLY_QWEN, 1, 0, 0}, t, QCALL("f", "{}"), "r", "");
    check((cfg){OSP_REPLY_QWEN, 0, 1, 0}, t, "<think>\nr\n</think>", "", "f {}\n");
    check((cfg){OSP_REPLY_NONE, 1, 1, 1}, t, t, "", "");
    const char *g = "<|channel>thought\nhm<channel|><|tool_call>call:f{}<tool_call|>";
    check((cfg){OSP_REPLY_GEMMA4, 0, 0, 0}, g, g, "", "");
    const char *l = "{\"name\": \"f\", \"parameters\": {}}";
    check((cfg){OSP_REPLY_LLAMA3, 1, 0, 0}, l, l, "", "");
    check((cfg){OSP_REPLY_LLAMA3, 1, 0, 0}, "<think>x</think>", "<think>x</think>", "", "");
}

static void test_llama3(void **st) {
    (void)st;
    check(LLAMA, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", "", "",
          "get_weather {\"city\":\"Paris\"}\n");
    check(LLAMA, "\n <|python_tag|> {\"name\": \"f\", \"arguments\": {}}", "", "", "f {}\n");
    check(LLAMA, "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {\"y\": [2.50]}};", "",
          "", "a {\"x\":1}\nb {\"y\":[2.50]}\n");
    check(LLAMA, "{\"name\": \"a\", \"parameters\": {}}\n{\"name\": \"b\", \"parameters\": {\"s\": \"é;\\n\"}}\n", "", "",
          "a {}\nb {\"s\":\"é;\\n\"}\n");
    const char *content[] = {
        "The weather is {nice}.",
        "{\"foo\": 1}",
        "{not json",
        "{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\"", /* all or nothing */
        "{\"name\": \"a\", \"parameters\": {}} and more",
        "<|python_tag|>brave_search.call(query=\"x\")",
        "<|python_tag|>",
        "<|python",
        "  ",
        "",
    };
    for (size_t i = 0; i < sizeof content / sizeof *content; i++) check(LLAMA, content[i], content[i], "", "");
}

static void test_gemma4_reasoning(void **st) {
    (void)st;
    check(GEMMA, "<|channel>thought\nI should think.\n<channel|>The answer.", "The answer.", "I should think.", "");
    check(GEMMA, "<|channel>thought\n<channel|>Hello", "Hello", "", "");
    check(GEMMA, "<|channel>thought\n<channel|>\n\n", "", "", "");
    check(GEMMA, "<|channel>thought\nunterminated", "", "unterminated", "");
    check(GEMMA, "<|channel>the plan<channel|>ok", "ok", "the plan", "");
    check(GEMMA, "<|channel>thou", "", "thou", "");
    check(GEMMA, "A <turn|> B", "A <turn|> B", "", ""); /* no call: nothing special */
    cfg in = GEMMA;
    in.start_in = 1;
    check(in, "Thinking here\n<channel|>Answer", "Answer", "Thinking here", "");
}

static void test_gemma4_tools(void **st) {
    (void)st;
    check(GEMMA,
          "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,unit:<|\"|>celsius<|\"|>,days:[1,2],opts:{deep:true}}"
          "<tool_call|>",
          "", "", "get_weather {\"city\":\"Paris\",\"unit\":\"celsius\",\"days\":[1,2],\"opts\":{\"deep\":true}}\n");
    check(GEMMA,
          "<|channel>thought\nTwo cities.<channel|>Checking.\n<|tool_call>call:a{x:1}<tool_call|>"
          "<|tool_call>call:b{}<tool_call|><turn|>",
          "Checking.", "Two cities.", "a {\"x\":1}\nb {}\n");
    /* strings hold anything, the closer included */
    check(GEMMA,
          "<|tool_call>call:f{s:<|\"|>a{b},c:d \"q\" \\ <tool_call|> x\n\ty<|\"|>,u:<|\"|>Zürich 東京 🎉<|\"|>,e:<|\"|><|\"|>}"
          "<tool_call|>",
          "", "", "f {\"s\":\"a{b},c:d \\\"q\\\" \\\\ <tool_call|> x\\n\\ty\",\"u\":\"Zürich 東京 🎉\",\"e\":\"\"}\n");
    check(GEMMA,
          "<|tool_call>call:f{a:18,b:-2.5,c:1e3,d:0,e:true,f:false,g:null,h:[],i:{},"
          "j:[[1,[2]],{k:<|\"|>v<|\"|>}],my-key.v2_x:1,<|\"|>quoted key<|\"|>:2}<tool_call|>",
          "", "",
          "f {\"a\":18,\"b\":-2.5,\"c\":1e3,\"d\":0,\"e\":true,\"f\":false,\"g\":null,\"h\":[],\"i\":{},"
          "\"j\":[[1,[2]],{\"k\":\"v\"}],\"my-key.v2_x\":1,\"quoted key\":2}\n");
    check(GEMMA, "<|tool_call>call:f{ x : +1 , y : .5 , z : [ 1 , 2 ] }<tool_call|>", "", "",
          "f {\"x\":1,\"y\":0.5,\"z\":[1,2]}\n");
    /* the reply ends at <|tool_response> after a call */
    check(GEMMA, "<|tool_call>call:f{}<tool_call|><|tool_response>response:f{value:1}<tool_response|>", "", "",
          "f {}\n");
    check(GEMMA, "Ok <|tool_call>call:f{}<tool_call|> done <turn|>junk", "Okdone", "", "f {}\n");
}

static void test_gemma4_malformed(void **st) {
    (void)st;
    const char *bad[] = {
        "<|tool_call>call:f{city:Paris}<tool_call|>",        /* bare string */
        "<|tool_call>f{}<tool_call|>",                       /* no call: */
        "<|tool_call>call:{}<tool_call|>",                   /* no name */
        "<|tool_call>call:f{a:1,}<tool_call|>",              /* trailing comma */
        "<|tool_call>call:f{a:1} x<tool_call|>",             /* trailing text */
        "<|tool_call>call:f{a:truex}<tool_call|>",
        "<|tool_call>call:f{a:1e}<tool_call|>",
        "<|tool_call>call:f{a:[1,2}<tool_call|>",
        "<|tool_call>call:f{a:<|\"|>x}<tool_call|>",         /* string never closed: block never closed */
        "<|tool_call>call:f{a:1}",                           /* never closed */
        "<|tool_",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) check(GEMMA, bad[i], bad[i], "", "");
    /* deep nesting is refused, not a crash */
    char deep[1024] = "<|tool_call>call:f{a:";
    for (int i = 0; i < 200; i++) strcat(deep, "[");
    strcat(deep, "<tool_call|>");
    check(GEMMA, deep, deep, "", "");
}

/* What is emitted before the end of the stream. */
typedef struct stream {
    osp_reply *r;
    result res;
} stream;

static void feed(stream *s, const char *t) {
    assert_int_equal(osp_reply_feed(s->r, t, strlen(t), collect, &s->res), OSP_OK);
}

static void test_streaming(void **st) {
    (void)st;
    stream s = {0};
    assert_int_equal(osp_reply_new(OSP_REPLY_QWEN, 1, 1, 0, &s.r), OSP_OK);
    feed(&s, "<thi");
    assert_string_equal(s.res.reasoning, "");
    feed(&s, "nk>\nstep one ");
    assert_string_equal(s.res.reasoning, "step one"); /* the space waits */
    feed(&s, "two</thi");
    assert_string_equal(s.res.reasoning, "step one two");
    feed(&s, "nk>\n\nHello <tool_");
    assert_string_equal(s.res.content, "Hello");
    feed(&s, "calx");
    assert_string_equal(s.res.content, "Hello <tool_calx");
    feed(&s, " " QCALL("f", "{}"));
    assert_string_equal(s.res.content, "Hello <tool_calx");
    json_t *calls;
    assert_int_equal(osp_reply_finish(s.r, collect, &s.res, &calls), OSP_OK);
    assert_int_equal(json_array_size(calls), 1);
    json_decref(calls);
    assert_int_equal(osp_reply_feed(s.r, "x", 1, collect, &s.res), OSP_ERR_INVALID); /* after finish */
    assert_int_equal(osp_reply_finish(s.r, collect, &s.res, &calls), OSP_ERR_INVALID);
    assert_null(calls);
    osp_reply_free(s.r);

    /* Llama 3 with tools: prose streams at once, a '{' waits for the end */
    memset(&s, 0, sizeof s);
    assert_int_equal(osp_reply_new(OSP_REPLY_LLAMA3, 0, 1, 0, &s.r), OSP_OK);
    feed(&s, "Hello");
    assert_string_equal(s.res.content, "Hello");
    osp_reply_free(s.r);
    memset(&s, 0, sizeof s);
    assert_int_equal(osp_reply_new(OSP_REPLY_LLAMA3, 0, 1, 0, &s.r), OSP_OK);
    feed(&s, "{\"name\"");
    feed(&s, ": \"x\"} is not a call");
    assert_int_equal(s.res.n_emits, 0);
    assert_int_equal(osp_reply_finish(s.r, collect, &s.res, NULL), OSP_OK);
    assert_string_equal(s.res.content, "{\"name\": \"x\"} is not a call");
    osp_reply_free(s.r);
}

static void test_cancel(void **st) {
    (void)st;
    stream s = {0};
    s.res.stop_after = 1;
    assert_int_equal(osp_reply_new(OSP_REPLY_QWEN, 1, 1, 0, &s.r), OSP_OK);
    assert_int_equal(osp_reply_feed(s.r, "<think>a</think>b", 17, collect, &s.res), OSP_REPLY_CANCELLED);
    assert_int_equal(s.res.n_emits, 1);
    assert_int_equal(osp_reply_feed(s.r, "c", 1, collect, &s.res), OSP_REPLY_CANCELLED);
    json_t *calls = (json_t *)1;
    assert_int_equal(osp_reply_finish(s.r, collect, &s.res, &calls), OSP_REPLY_CANCELLED);
    assert_null(calls);
    assert_int_equal(s.res.n_emits, 1);
    osp_reply_free(s.r);
}

static void test_many_calls_unique_ids(void **st) {
    (void)st;
    static char text[CAP];
    text[0] = 0;
    for (int i = 0; i < 60; i++) strcat(text, "<|tool_call>call:f{}<tool_call|>");
    static result res;
    run_cuts(GEMMA, text, NULL, 0, &res); /* summarize() checks the ids differ */
    assert_int_equal(strlen(res.calls), 60 * strlen("f {}\n"));
}

static void test_bad_args(void **st) {
    (void)st;
    osp_reply *r = (osp_reply *)1;
    assert_int_equal(osp_reply_new((osp_reply_format)42, 1, 1, 0, &r), OSP_ERR_INVALID);
    assert_null(r);
    assert_int_equal(osp_reply_new(OSP_REPLY_QWEN, 1, 1, 0, NULL), OSP_ERR_INVALID);
    assert_int_equal(osp_reply_feed(NULL, "x", 1, NULL, NULL), OSP_ERR_INVALID);
    osp_reply_free(NULL);
    /* a NULL callback discards the text but still collects calls */
    assert_int_equal(osp_reply_new(OSP_REPLY_QWEN, 1, 1, 0, &r), OSP_OK);
    const char *t = "hi " QCALL("f", "{}");
    assert_int_equal(osp_reply_feed(r, t, strlen(t), NULL, NULL), OSP_OK);
    json_t *calls;
    assert_int_equal(osp_reply_finish(r, NULL, NULL, &calls), OSP_OK);
    assert_int_equal(json_array_size(calls), 1);
    json_decref(calls);
    osp_reply_free(r);
}

static char *template_of(const char *path) {
    json_error_t err;
    json_t *cfgj = json_load_file(path, JSON_DECODE_INT_AS_REAL, &err); /* model_max_length overflows */
    if (!cfgj) fail_msg("cannot read %s: %s", path, err.text);
    const char *t = json_string_value(json_object_get(cfgj, "chat_template"));
    assert_non_null(t);
    char *s = strdup(t);
    json_decref(cfgj);
    return s;
}

static void test_detect(void **st) {
    (void)st;
    assert_int_equal(osp_reply_format_detect(NULL), OSP_REPLY_NONE);
    assert_int_equal(osp_reply_format_detect("{{ messages }}"), OSP_REPLY_NONE);
    assert_int_equal(osp_reply_format_detect("<|channel>"), OSP_REPLY_GEMMA4);
    assert_int_equal(osp_reply_format_detect("<tool_call> <|start_header_id|>"), OSP_REPLY_QWEN);
    assert_int_equal(osp_reply_format_detect("<|python_tag|>"), OSP_REPLY_LLAMA3);
    struct {
        const char *path;
        osp_reply_format f;
    } files[] = {
        {DATA "/qwen3/tokenizer_config.json", OSP_REPLY_QWEN},
        {DATA "/llama3/tokenizer_config.json", OSP_REPLY_LLAMA3},
        {DATA "/gemma3/tokenizer_config.json", OSP_REPLY_NONE},
    };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *t = template_of(files[i].path);
        assert_int_equal(osp_reply_format_detect(t), files[i].f);
        free(t);
    }
    FILE *f = fopen(DATA "/gemma4/chat_template.jinja", "rb");
    assert_non_null(f);
    static char g[65536];
    size_t n = fread(g, 1, sizeof g - 1, f);
    fclose(f);
    g[n] = 0;
    assert_int_equal(osp_reply_format_detect(g), OSP_REPLY_GEMMA4);

    assert_string_equal(osp_reply_format_name(OSP_REPLY_NONE), "none");
    assert_string_equal(osp_reply_format_name(OSP_REPLY_QWEN), "qwen");
    assert_string_equal(osp_reply_format_name(OSP_REPLY_LLAMA3), "llama3");
    assert_string_equal(osp_reply_format_name(OSP_REPLY_GEMMA4), "gemma4");
}

static void test_prompt_opens_reasoning(void **st) {
    (void)st;
    struct {
        osp_reply_format f;
        const char *prompt;
        int open;
    } cases[] = {
        {OSP_REPLY_QWEN, "<|im_start|>assistant\n<think>\n", 1},
        {OSP_REPLY_QWEN, "<|im_start|>assistant\n<think>", 1},
        {OSP_REPLY_QWEN, "<|im_start|>assistant\n<think>\n\n</think>\n\n", 0},
        {OSP_REPLY_QWEN, "<|im_start|>assistant\n", 0},
        {OSP_REPLY_GEMMA4, "<|turn>model\n<|channel>thought\n", 1},
        {OSP_REPLY_GEMMA4, "<|turn>model\n<|channel>thought\n<channel|>", 0},
        {OSP_REPLY_GEMMA4, "<|turn>model\n", 0},
        {OSP_REPLY_LLAMA3, "<think>\n", 0},
        {OSP_REPLY_NONE, "<think>\n", 0},
        {OSP_REPLY_QWEN, "", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
        assert_int_equal(osp_reply_prompt_opens_reasoning(cases[i].f, cases[i].prompt, strlen(cases[i].prompt)),
                         cases[i].open);
    assert_int_equal(osp_reply_prompt_opens_reasoning(OSP_REPLY_QWEN, NULL, 0), 0);
}

/* The formats' table: a row per enum value, each complete for what it has,
 * and each row's own detection markers detecting it (no earlier row shadows it). */
static void test_table(void **st) {
    (void)st;
    for (int f = OSP_REPLY_NONE; f <= OSP_REPLY_GEMMA4; f++) {
        const osp_reply_spec *sp = osp_reply_spec_of((osp_reply_format)f);
        assert_non_null(sp);
        assert_int_equal(sp->format, f);
        assert_string_equal(sp->name, osp_reply_format_name((osp_reply_format)f));
        assert_int_equal(sp->think_open != NULL, sp->think_close != NULL);
        assert_true(!sp->think_label || sp->think_open);
        int block = sp->calls == OSP_REPLY_CALLS_JSON_BLOCK || sp->calls == OSP_REPLY_CALLS_GEMMA_BLOCK;
        assert_int_equal(block, sp->tool_open && sp->tool_close);
        assert_int_equal(sp->calls == OSP_REPLY_CALLS_JSON_REPLY, sp->call_tag != NULL);
        if (sp->calls != OSP_REPLY_CALLS_NONE)
            assert_true(sp->force.open && sp->force.any && sp->force.name_pre && sp->force.name_post);
        assert_true(!sp->force.close_think || sp->think_open);
        for (int k = 0; k < 2; k++)
            if (sp->detect[k]) assert_int_equal(osp_reply_format_detect(sp->detect[k]), f);
    }
    assert_null(osp_reply_spec_of((osp_reply_format)42));
    assert_string_equal(osp_reply_format_name((osp_reply_format)42), "unknown");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen_reasoning),
        cmocka_unit_test(test_qwen_tools),
        cmocka_unit_test(test_qwen_malformed),
        cmocka_unit_test(test_disabled),
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_gemma4_reasoning),
        cmocka_unit_test(test_gemma4_tools),
        cmocka_unit_test(test_gemma4_malformed),
        cmocka_unit_test(test_streaming),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_many_calls_unique_ids),
        cmocka_unit_test(test_bad_args),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_prompt_opens_reasoning),
        cmocka_unit_test(test_table),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
