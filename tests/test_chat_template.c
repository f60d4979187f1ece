/* Chat templates (text/chat_template) rendered byte for byte as Hugging
 * Face's apply_chat_template renders them: every line of the goldens in
 * tests/data/templates/goldens (Gemma 3, Llama 3, Qwen 3 from their
 * tokenizer_config.json, Gemma 4 from chat_template.jinja with bos <bos> and
 * eos <eos>), and the bundled model's three golden prompts. Also where a
 * template is found (named templates, chat_template.jinja first, explicit
 * files) and how bos/eos are read. strftime_now is fixed at 2026-12-02, as
 * when the goldens were made. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "text/chat_template.h"

#define DATA "data/templates"

static struct tm fixed_now(void) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    tm.tm_year = 2026 - 1900;
    tm.tm_mon = 11;
    tm.tm_mday = 2;
    tm.tm_isdst = -1;
    mktime(&tm);
    return tm;
}

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    *n = fread(buf, 1, (size_t)len, f);
    buf[*n] = 0;
    fclose(f);
    return buf;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static osp_status render(const osp_chat_template *ct, const json_t *messages, const json_t *tools, int agp,
                         const json_t *extra, char **out, size_t *len) {
    struct tm now = fixed_now();
    osp_jinja_options o = {0};
    o.now = &now;
    return osp_chat_template_render(ct, messages, tools, agp, extra, &o, out, len);
}

/* Every line of goldens/chat-FAMILY.jsonl; returns the number of lines. */
static int run_goldens(const char *family, const osp_chat_template *ct) {
    char path[256];
    snprintf(path, sizeof path, DATA "/goldens/chat-%s.jsonl", family);
    size_t n;
    char *text = slurp(path, &n);
    int lines = 0, failures = 0;
    for (char *line = text, *nl; line < text + n; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl) nl = text + n;
        *nl = 0;
        if (!*line) continue;
        json_error_t e;
        json_t *g = json_loads(line, 0, &e);
        if (!g) fail_msg("%s line %d: %s", path, lines + 1, e.text);
        lines++;
        const char *name = json_string_value(json_object_get(g, "name"));
        json_t *want = json_object_get(g, "rendered");
        char *out = NULL;
        size_t len;
        osp_status st = render(ct, json_object_get(g, "messages"), json_object_get(g, "tools"),
                               json_is_true(json_object_get(g, "add_generation_prompt")), json_object_get(g, "extra"),
                               &out, &len);
        if (st != OSP_OK) {
            print_error("%s %s: %s\n", family, name, osp_last_error());
            failures++;
        } else if (len != json_string_length(want) || memcmp(out, json_string_value(want), len)) {
            print_error("%s %s:\n  want [%s]\n  got  [%.*s]\n", family, name, json_string_value(want), (int)len, out);
            failures++;
        }
        osp_free(out);
        json_decref(g);
    }
    free(text);
    assert_int_equal(failures, 0);
    return lines;
}

static osp_chat_template *load(const char *dir, const char *file) {
    osp_chat_template *ct = NULL;
    if (osp_chat_template_load(dir, file, &ct) != OSP_OK) fail_msg("load %s: %s", dir ? dir : file, osp_last_error());
    return ct;
}

static void test_gemma3(void **s) {
    (void)s;
    osp_chat_template *ct = load(DATA "/gemma3", NULL);
    assert_string_equal(osp_chat_template_bos(ct), "<bos>");
    assert_string_equal(osp_chat_template_eos(ct), "<end_of_turn>");
    assert_int_equal(run_goldens("gemma3", ct), 10);
    osp_chat_template_free(ct);
}

static void test_llama3(void **s) {
    (void)s;
    osp_chat_template *ct = load(DATA "/llama3", NULL);
    assert_string_equal(osp_chat_template_bos(ct), "<|begin_of_text|>");
    assert_string_equal(osp_chat_template_eos(ct), "<|end_of_text|>");
    assert_int_equal(run_goldens("llama3", ct), 10);
    osp_chat_template_free(ct);
}

static void test_qwen3(void **s) {
    (void)s;
    osp_chat_template *ct = load(DATA "/qwen3", NULL);
    assert_null(osp_chat_template_bos(ct)); /* null in the config: not defined in the template */
    assert_string_equal(osp_chat_template_eos(ct), "<|im_end|>");
    assert_int_equal(run_goldens("qwen3", ct), 11);
    osp_chat_template_free(ct);
}

static void test_gemma4(void **s) {
    (void)s;
    /* the folder alone: the template is found, no tokens to read */
    osp_chat_template *ct = load(DATA "/gemma4", NULL);
    assert_null(osp_chat_template_bos(ct));
    osp_chat_template_free(ct);
    size_t n;
    char *src = slurp(DATA "/gemma4/chat_template.jinja", &n);
    assert_int_equal(n, 12133);
    assert_int_equal(osp_chat_template_new(src, n, "<bos>", "<eos>", &ct), OSP_OK);
    free(src);
    assert_int_equal(run_goldens("gemma4", ct), 11);
    osp_chat_template_free(ct);
}

/* The bundled model: golden.safetensors' metadata "prompts" holds each
 * prompt's messages and the text transformers rendered (generation prompt on). */
static void test_fortune(void **s) {
    (void)s;
    FILE *f = fopen("../models/fortune/golden.safetensors", "rb");
    assert_non_null(f);
    unsigned char hl[8];
    assert_int_equal(fread(hl, 1, 8, f), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | hl[i];
    assert_true(n > 0 && n < (1u << 24));
    char *hdr = malloc(n + 1);
    assert_int_equal(fread(hdr, 1, n, f), n);
    hdr[n] = 0;
    fclose(f);
    json_error_t e;
    json_t *h = json_loads(hdr, 0, &e);
    free(hdr);
    assert_non_null(h);
    json_t *prompts = json_loads(json_string_value(json_object_get(json_object_get(h, "__metadata__"), "prompts")), 0, &e);
    assert_non_null(prompts);
    assert_int_equal(json_array_size(prompts), 3);
    osp_chat_template *ct = load("../models/fortune", NULL);
    assert_string_equal(osp_chat_template_bos(ct), "<bos>");
    size_t i;
    json_t *p;
    json_array_foreach(prompts, i, p) {
        char *out;
        size_t len;
        assert_int_equal(render(ct, json_object_get(p, "messages"), NULL, 1, NULL, &out, &len), OSP_OK);
        const char *want = json_string_value(json_object_get(p, "rendered"));
        if (len != strlen(want) || memcmp(out, want, len))
            fail_msg("fortune prompt %zu:\n  want [%s]\n  got  [%.*s]", i, want, (int)len, out);
        osp_free(out);
    }
    /* the same template from tokenizer_config.json gives the same text */
    json_decref(prompts);
    json_decref(h);
    osp_chat_template_free(ct);
}

static char tmpdir[64];

static void mkpath(char *buf, size_t n, const char *name) { snprintf(buf, n, "%s/%s", tmpdir, name); }

static void test_sources(void **s) {
    (void)s;
    snprintf(tmpdir, sizeof tmpdir, "/tmp/osp_chat_XXXXXX");
    assert_non_null(mkdtemp(tmpdir));
    char p[256], q[256];
    json_error_t e;
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, &e);
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", 0, &e);
    json_t *extra = json_loads("{\"who\": \"x\", \"bos_token\": \"[override]\"}", 0, &e);
    char *out;
    size_t len;

    /* named templates: tool_use when tools are given, default otherwise; AddedToken objects */
    mkpath(p, sizeof p, "tokenizer_config.json");
    write_file(p, "{\"bos_token\": {\"content\": \"<B>\", \"lstrip\": false}, \"eos_token\": \"<E>\", \"chat_template\": ["
                  "{\"name\": \"default\", \"template\": \"D:{{ bos_token }}{{ messages[0].content }}{{ eos_token }}\"},"
                  "{\"name\": \"tool_use\", \"template\": \"T:{{ tools[0].function.name }}|{{ who }}|{{ bos_token }}\"}]}");
    osp_chat_template *ct = load(tmpdir, NULL);
    assert_string_equal(osp_chat_template_bos(ct), "<B>");
    assert_int_equal(render(ct, msgs, NULL, 0, NULL, &out, &len), OSP_OK);
    assert_string_equal(out, "D:<B>hi<E>");
    osp_free(out);
    assert_int_equal(render(ct, msgs, tools, 0, extra, &out, &len), OSP_OK);
    assert_string_equal(out, "T:f|x|[override]"); /* extra variables win */
    osp_free(out);
    osp_chat_template_free(ct);

    /* chat_template.jinja is preferred to tokenizer_config.json's; variables as transformers passes them */
    mkpath(q, sizeof q, "chat_template.jinja");
    write_file(q, "{{ tools }}|{{ documents }}|{{ add_generation_prompt }}|{{ bos_token }}|{{ eos_token }}\n");
    ct = load(tmpdir, NULL);
    assert_int_equal(render(ct, msgs, NULL, 1, NULL, &out, &len), OSP_OK);
    assert_string_equal(out, "None|None|True|<B>|<E>"); /* one trailing newline dropped */
    osp_free(out);
    osp_chat_template_free(ct);

    /* an explicit file wins over both; tokens still come from the folder */
    mkpath(q, sizeof q, "other.jinja");
    write_file(q, "other {{ bos_token }}");
    ct = load(tmpdir, q);
    assert_int_equal(render(ct, msgs, NULL, 0, NULL, &out, &len), OSP_OK);
    assert_string_equal(out, "other <B>");
    osp_free(out);
    osp_chat_template_free(ct);
    ct = load(NULL, q);
    assert_int_equal(render(ct, msgs, NULL, 0, NULL, &out, &len), OSP_OK);
    assert_string_equal(out, "other "); /* no folder: bos_token undefined, prints nothing */
    osp_free(out);
    osp_chat_template_free(ct);

    /* errors: no template, a broken one (named), bad arguments */
    mkpath(q, sizeof q, "chat_template.jinja");
    unlink(q);
    write_file(p, "{\"bos_token\": null}");
    assert_int_not_equal(osp_chat_template_load(tmpdir, NULL, &ct), OSP_OK);
    assert_non_null(strstr(osp_last_error(), "no chat template"));
    write_file(p, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"{% if %}\"}]}");
    assert_int_equal(osp_chat_template_load(tmpdir, NULL, &ct), OSP_ERR_FORMAT);
    assert_non_null(strstr(osp_last_error(), "'tool_use'"));
    write_file(p, "{\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"x\"}]}");
    ct = load(tmpdir, NULL);
    assert_int_equal(render(ct, msgs, NULL, 0, NULL, &out, &len), OSP_ERR_UNSUPPORTED);
    assert_int_equal(render(ct, tools, tools, 0, NULL, &out, &len), OSP_OK);
    osp_free(out);
    assert_int_equal(render(ct, extra, NULL, 0, NULL, &out, &len), OSP_ERR_INVALID); /* messages not a list */
    osp_chat_template_free(ct);
    assert_int_equal(osp_chat_template_load("/nonexistent/model", NULL, &ct), OSP_ERR_IO);
    write_file(p, "{not json");
    assert_int_equal(osp_chat_template_load(tmpdir, NULL, &ct), OSP_ERR_FORMAT);

    unlink(p);
    mkpath(q, sizeof q, "other.jinja");
    unlink(q);
    rmdir(tmpdir);
    json_decref(msgs);
    json_decref(tools);
    json_decref(extra);
}

/* The template's own errors reach the caller verbatim. */
static void test_template_errors(void **s) {
    (void)s;
    osp_chat_template *ct = load(DATA "/gemma3", NULL);
    json_error_t e;
    json_t *msgs = json_loads("[{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", \"content\": \"b\"}]", 0, &e);
    char *out;
    size_t len;
    assert_int_equal(render(ct, msgs, NULL, 1, NULL, &out, &len), OSP_ERR_INVALID);
    assert_string_equal(osp_last_error(), "Conversation roles must alternate user/assistant/user/assistant/...");
    json_decref(msgs);
    osp_chat_template_free(ct);
    /* Qwen 3 needs string content: a list of parts is a clear error, as in Python */
    ct = load(DATA "/qwen3", NULL);
    msgs = json_loads("[{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}]}]", 0, &e);
    assert_int_equal(render(ct, msgs, NULL, 1, NULL, &out, &len), OSP_ERR_INVALID);
    assert_non_null(strstr(osp_last_error(), "'list object' has no attribute 'startswith'"));
    json_decref(msgs);
    osp_chat_template_free(ct);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemma3),  cmocka_unit_test(test_llama3),  cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_gemma4),  cmocka_unit_test(test_fortune), cmocka_unit_test(test_sources),
        cmocka_unit_test(test_template_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
