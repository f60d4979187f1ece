/* Structured output's pieces outside the HTTP routes: grammars composed of
 * literal text around JSON Schema values (grammar/compose.c), the server's
 * grammar cache (server/structured.c: hits, the LRU bound, an entry a job
 * holds surviving eviction), and a stream held to a grammar
 * (osp_gen_params.grammar) over the bundled model, sampled at a high
 * temperature: every reply is in the grammar's language. */
#include <regex.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "server/server_internal.h"
#include "text/tokenizer.h"

/* every byte is a token, and a few longer ones */
static osp_grammar_vocab *byte_vocab(void) {
    static char one[256][1];
    static const char *more[] = {"<c>", "</c>", "{\"a\":", "12", "!"};
    const int nm = sizeof more / sizeof *more;
    const char *bytes[256 + 5];
    uint32_t lens[256 + 5];
    for (int i = 0; i < 256; i++) one[i][0] = (char)i, bytes[i] = one[i], lens[i] = 1;
    for (int i = 0; i < nm; i++) bytes[256 + i] = more[i], lens[256 + i] = (uint32_t)strlen(more[i]);
    osp_grammar_vocab *v;
    assert_int_equal(osp_grammar_vocab_new(256 + nm, bytes, lens, -1, &v), OSP_OK);
    return v;
}

static int accepts(osp_grammar *g, osp_grammar_vocab *v, const char *text) {
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
    int ok = osp_grammar_matcher_commit_bytes(m, text, strlen(text)) && osp_grammar_matcher_accepting(m);
    osp_grammar_matcher_free(m);
    return ok;
}

static void test_compose(void **state) {
    (void)state;
    osp_grammar_vocab *v = byte_vocab();
    const char *schema = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":9}},"
                         "\"required\":[\"a\"],\"additionalProperties\":false}";
    osp_grammar_part alts[] = {{.prefix = "<c>", .schema = schema, .schema_len = strlen(schema), .suffix = "</c>"},
                               {.prefix = "<d>", .suffix = "!"},
                               {.schema = "true", .schema_len = 4}};
    osp_grammar *g;
    assert_int_equal(osp_grammar_from_parts(alts, 3, &g), OSP_OK);
    assert_true(accepts(g, v, "<c>{\"a\":5}</c>"));
    assert_true(accepts(g, v, "<c> {\"a\": 7} </c>")); /* JSON's whitespace around the value */
    assert_true(accepts(g, v, "<d>!"));
    assert_true(accepts(g, v, "true"));
    assert_false(accepts(g, v, "<c>{\"a\":12}</c>")); /* out of range */
    assert_false(accepts(g, v, "<c>{\"a\":5}"));       /* no suffix */
    assert_false(accepts(g, v, "<d>{\"a\":5}!"));      /* nothing between */
    assert_false(accepts(g, v, "<x>"));
    /* the mask agrees with its reference walk inside the spliced schema */
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
    assert_true(osp_grammar_matcher_commit_bytes(m, "<c>{\"a\":", 8));
    uint32_t a[(256 + 5 + 31) / 32], b[(256 + 5 + 31) / 32];
    osp_grammar_matcher_mask(m, a);
    osp_grammar_matcher_mask_reference(m, b);
    assert_memory_equal(a, b, sizeof a);
    assert_true(a['7' >> 5] >> ('7' & 31) & 1);
    assert_false(a[(256 + 3) >> 5] >> ((256 + 3) & 31) & 1); /* "12" */
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);
    /* a schema that does not compile names its alternative */
    osp_grammar_part bad[] = {{.prefix = "<c>", .schema = "{}", .schema_len = 2},
                              {.prefix = "<d>", .schema = "{\"dependencies\":{\"a\":[\"b\"]}}", .schema_len = 28}};
    assert_int_not_equal(osp_grammar_from_parts(bad, 2, &g), OSP_OK);
    assert_non_null(strstr(osp_last_error(), "alternative 1"));
    osp_grammar_vocab_free(v);
}

static void test_cache(void **state) {
    (void)state;
    osp_grammar_vocab *v = byte_vocab();
    srv_gcache *c = srv_gcache_new();
    char err[400], s[128];
    long long hits, misses;
    int n;
    srv_grammar *held = srv_grammar_schema(c, "{\"enum\":[\"x\"]}", 14, err, sizeof err);
    assert_non_null(held);
    srv_grammar *again = srv_grammar_schema(c, "{\"enum\":[\"x\"]}", 14, err, sizeof err);
    assert_ptr_equal(held, again);
    srv_grammar_release(again);
    osp_grammar_part p = {.prefix = "<", .schema = "{\"enum\":[\"x\"]}", .schema_len = 14, .suffix = ">"};
    srv_grammar *parts = srv_grammar_parts(c, &p, 1, err, sizeof err);
    assert_ptr_not_equal(parts, held); /* pieces are another key than the schema alone */
    srv_grammar_release(parts);
    for (int i = 0; i < 80; i++) { /* many others: the held entry is least recently used */
        snprintf(s, sizeof s, "{\"type\":\"integer\",\"minimum\":%d}", i);
        srv_grammar *g = srv_grammar_schema(c, s, strlen(s), err, sizeof err);
        assert_non_null(g);
        srv_grammar_release(g);
    }
    srv_gcache_counts(c, &hits, &misses, &n);
    assert_int_equal(hits, 1);
    assert_int_equal(misses, 82);
    assert_true(n <= 32);
    assert_true(accepts(srv_grammar_of(held), v, "\"x\"")); /* still whole: it was held */
    assert_null(srv_grammar_schema(c, "{\"type\":\"strin\"}", 16, err, sizeof err));
    assert_non_null(strstr(err, "type"));
    srv_grammar_release(held);
    srv_gcache_free(c);
    osp_grammar_vocab_free(v);
}

typedef struct out {
    char text[4096];
    size_t len;
} out;

static int on_text(void *user, int32_t token, const char *text, size_t len) {
    (void)token;
    out *o = user;
    if (o->len + len < sizeof o->text) memcpy(o->text + o->len, text, len), o->len += len;
    return 0;
}

static void test_stream(void **state) {
    (void)state;
    osp_model *m;
    osp_tokenizer *tok;
    if (osp_model_load("../models/fortune", &m) != OSP_OK) fail_msg("%s", osp_last_error());
    assert_int_equal(osp_tokenizer_load("../models/fortune", &tok), OSP_OK);
    osp_grammar_vocab *gv;
    assert_int_equal(osp_grammar_vocab_from_tokenizer(tok, &gv), OSP_OK);
    osp_grammar *g;
    const char *re = "[a-z]{2,6}-[0-9]{2}( [A-Z][a-z]+)?";
    assert_int_equal(osp_grammar_from_regex(re, strlen(re), &g), OSP_OK);
    regex_t rx;
    assert_int_equal(regcomp(&rx, "^[a-z]{2,6}-[0-9]{2}( [A-Z][a-z]+)?$", REG_EXTENDED | REG_NOSUB), 0);
    int32_t eos[32], prompt[64];
    size_t np = 0;
    int32_t *ids = NULL;
    assert_int_equal(osp_tokenizer_encode_alloc(tok, "Here is a code:", 15, 1, &ids, &np), OSP_OK);
    memcpy(prompt, ids, sizeof(int32_t) * np);
    osp_free(ids);
    int stopped = 0;
    for (int seed = 1; seed <= 12; seed++) {
        osp_gen_params p;
        osp_gen_defaults(m, tok, &p, eos);
        p.sampler.temperature = 1.5f, p.sampler.top_p = 1, p.sampler.top_k = 0, p.sampler.seed = (uint64_t)seed;
        p.max_tokens = 40;
        osp_grammar_matcher *gm;
        assert_int_equal(osp_grammar_matcher_new(g, gv, &gm), OSP_OK);
        p.grammar = gm;
        osp_session *s;
        assert_int_equal(osp_session_new(m, 1, (int32_t)np + 64, &s), OSP_OK);
        out o = {0};
        osp_gen_stats st;
        assert_int_equal(osp_generate(s, tok, prompt, (int32_t)np, &p, on_text, &o, &st), OSP_OK);
        o.text[o.len] = 0;
        if (st.finish == OSP_FINISH_STOP) {
            stopped++;
            if (regexec(&rx, o.text, 0, NULL, 0)) fail_msg("seed %d: '%s' is not in the grammar's language", seed, o.text);
        }
        osp_session_free(s);
        osp_grammar_matcher_free(gm);
    }
    assert_true(stopped >= 6);
    regfree(&rx);
    osp_grammar_free(g);
    osp_grammar_vocab_free(gv);
    osp_tokenizer_free(tok);
    osp_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_compose), cmocka_unit_test(test_cache),
                                       cmocka_unit_test(test_stream)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
