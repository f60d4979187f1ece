/* grammar/: regexes, the parser, JSON Schema compile errors, and token
 * masks against their twins: the plain trie walk and a brute force that
 * commits every token and rolls it back (the scalar reference). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include "core/core.h"
#include "grammar/grammar_internal.h"
#include "text/tokenizer.h"

static int dfa_match(const gr_dfa *d, const char *s) {
    int32_t st = 1;
    for (; *s && st; s++) st = gr_dfa_next(d, st, (uint8_t)*s);
    return st && d->accept[st];
}
static int re_match(const char *re, int mode, const char *s) {
    gr_dfa d;
    assert_int_equal(gr_regex_dfa(re, strlen(re), mode, &d), OSP_OK);
    int r = dfa_match(&d, s);
    gr_dfa_free(&d);
    return r;
}

static void test_regex_plain(void **st) {
    (void)st;
    assert_true(re_match("ab*c", GR_RE_PLAIN, "abbbc"));
    assert_true(re_match("ab*c", GR_RE_PLAIN, "ac"));
    assert_false(re_match("ab*c", GR_RE_PLAIN, "abd"));
    assert_true(re_match("(a|bc)+", GR_RE_PLAIN, "abca"));
    assert_false(re_match("(a|bc)+", GR_RE_PLAIN, ""));
    assert_true(re_match("[0-9]{2,3}", GR_RE_PLAIN, "123"));
    assert_false(re_match("[0-9]{2,3}", GR_RE_PLAIN, "1234"));
    assert_false(re_match("[0-9]{2,3}", GR_RE_PLAIN, "1"));
    assert_true(re_match("\\d+\\.\\d?", GR_RE_PLAIN, "12."));
    assert_true(re_match("[^a-c]x", GR_RE_PLAIN, "dx"));
    assert_false(re_match("[^a-c]x", GR_RE_PLAIN, "bx"));
    assert_true(re_match("a{3}", GR_RE_PLAIN, "aaa"));
    assert_true(re_match("(?:ab)?c", GR_RE_PLAIN, "c"));
    assert_true(re_match("a|", GR_RE_PLAIN, ""));
    gr_dfa d;
    assert_int_equal(gr_regex_dfa("(?=a)", 5, GR_RE_PLAIN, &d), OSP_ERR_UNSUPPORTED);
    assert_int_equal(gr_regex_dfa("(a", 2, GR_RE_PLAIN, &d), OSP_ERR_UNSUPPORTED);
    assert_int_equal(gr_regex_dfa("a)", 2, GR_RE_PLAIN, &d), OSP_ERR_UNSUPPORTED);
    assert_int_equal(gr_regex_dfa("\\1", 2, GR_RE_PLAIN, &d), OSP_ERR_UNSUPPORTED);
    assert_int_equal(gr_regex_dfa("*", 1, GR_RE_PLAIN, &d), OSP_ERR_UNSUPPORTED);
    /* a count of many digits is too large, not an overflow (UBSan watches) */
    assert_int_equal(gr_regex_dfa("a{0,36666666666666666666666666}", 31, GR_RE_PLAIN, &d), OSP_ERR_UNSUPPORTED);
}

static void test_regex_json_string(void **st) {
    (void)st;
    /* anchored: the whole string */
    assert_true(re_match("^a+$", GR_RE_JSONSTR, "\"aaa\""));
    assert_false(re_match("^a+$", GR_RE_JSONSTR, "\"ab\""));
    /* unanchored: a search */
    assert_true(re_match("b", GR_RE_JSONSTR, "\"abc\""));
    assert_false(re_match("b", GR_RE_JSONSTR, "\"ac\""));
    /* escapes: a quote, a backslash, a newline in the class */
    assert_true(re_match("^[\"]$", GR_RE_JSONSTR, "\"\\\"\""));
    assert_false(re_match("^[\"]$", GR_RE_JSONSTR, "\"\"\""));
    assert_true(re_match("^.\\\\$", GR_RE_JSONSTR, "\"x\\\\\""));
    assert_true(re_match("^\\s$", GR_RE_JSONSTR, "\"\\n\""));
    /* non-ASCII characters are whole UTF-8 sequences */
    assert_true(re_match("^.{2}$", GR_RE_JSONSTR, "\"\xc3\xa9\xe2\x82\xac\""));
    assert_false(re_match("^.{2}$", GR_RE_JSONSTR, "\"\xc3\xa9\""));
    assert_false(re_match("^.$", GR_RE_JSONSTR, "\"\xc3\""));
}

/* whether a DFA accepts nothing: after renumbering, only a start state that is dead */
static int dfa_empty(const gr_dfa *d) {
    if (d->accept[1]) return 0;
    for (int32_t c = 0; c < d->ncls; c++)
        if (d->next[d->ncls + c]) return 0;
    return 1;
}

static void test_regex_open_ends(void **st) {
    (void)st;
    /* a search keeps a repetition's minimum at an open end: the same language as the search written out */
    static const char *const RES[] = {".{0,50}", "[^\"]{1,25}", "ab{2,5}", "x{3,}y", "(ab){1,3}c{0,9}", "^a{2,4}",
                                      "a{2,4}$", "a|b{1,3}", "(x{1,3})", "q{2}z?", "\\d{2,40}-"};
    for (size_t i = 0; i < sizeof RES / sizeof *RES; i++) {
        char full[128];
        const char *r = RES[i];
        size_t n = strlen(r);
        int s0 = r[0] == '^', e0 = r[n - 1] == '$';
        snprintf(full, sizeof full, "^%s(?:%.*s)%s$", s0 ? "" : "[\\s\\S]*", (int)(n - s0 - e0), r + s0,
                 e0 ? "" : "[\\s\\S]*");
        gr_dfa a, b, x;
        assert_int_equal(gr_regex_dfa(r, n, GR_RE_JSONSTR, &a), OSP_OK);
        assert_int_equal(gr_regex_dfa(full, strlen(full), GR_RE_JSONSTR, &b), OSP_OK);
        for (int k = 0; k < 2; k++) {
            assert_int_equal(gr_dfa_product(k ? &b : &a, k ? &a : &b, GR_DFA_MINUS, &x), OSP_OK);
            if (!dfa_empty(&x)) fprintf(stderr, "%s differs from %s\n", r, full);
            assert_true(dfa_empty(&x));
            gr_dfa_free(&x);
        }
        gr_dfa_free(&a), gr_dfa_free(&b);
    }
    gr_dfa a;
    assert_int_equal(gr_regex_dfa(".{0,500}", 8, GR_RE_JSONSTR, &a), OSP_OK); /* searched: any string */
    assert_true(a.nstates < 100);
    gr_dfa_free(&a);
    /* a hostile regex (nested repetitions, from the fuzzer) is refused by the work bound instead of compiling for
     * seconds */
    static const char hostile[] =
        ":\042a&rray\327,\377\377\377\377\377\377\377\377\377\377a+++++++++++++++++++\002....+++++++++++++++++++++++++++++++++"
        "\000\000\000\000\000\000\000\000++++++++++++++++++++++++++++++\000\000\000\000\000\000\377\377\377\377\377\377\377\377"
        "\000\000\000\000\000\000\000\000\000\000\000||||||||||||||\374|||||||\000\002\000\000icnful,||\000\002\000\000icnful,\230+++++y',"
        "\377";
    gr_dfa d;
    osp_status s = gr_regex_dfa(hostile, sizeof hostile - 1, GR_RE_PLAIN, &d);
    if (s == OSP_OK) gr_dfa_free(&d);
    assert_int_equal(s, OSP_ERR_UNSUPPORTED);
    assert_non_null(strstr(osp_last_error(), "too complex"));
}

static int accepts(osp_grammar *g, const osp_grammar_vocab *v, const char *text) {
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
    int ok = osp_grammar_matcher_commit_bytes(m, text, strlen(text)) && osp_grammar_matcher_accepting(m);
    osp_grammar_matcher_free(m);
    return ok;
}

static osp_grammar_vocab *tiny_vocab(void) {
    static const char *const toks[] = {"{", "}", "[", "]", "\"", ",", ":", " ", "a", "b", "1", "0", "-", ".",
                                       "e", "true", "false", "null", "\"a", "\":", "\": ", ", \"", "\"}", "ab",
                                       "\\", "\\\"", "n", "u", "x", "12", "\"b\"", "}]", "[{", "\xc3", "\xa9",
                                       "\xc3\xa9", "\n", "tr", "ue", "ul", "l", "f", "al", "se", "A", "z"};
    int32_t n = (int32_t)(sizeof toks / sizeof *toks) + 1; /* the last id is EOS */
    const char *b[64];
    uint32_t l[64];
    for (int32_t i = 0; i < n - 1; i++) b[i] = toks[i], l[i] = (uint32_t)strlen(toks[i]);
    b[n - 1] = NULL, l[n - 1] = 0;
    osp_grammar_vocab *v;
    assert_int_equal(osp_grammar_vocab_new(n, b, l, n - 1, &v), OSP_OK);
    return v;
}

static osp_grammar *schema(const char *s) {
    osp_grammar *g;
    osp_status st = osp_grammar_from_json_schema(s, strlen(s), &g);
    if (st) fprintf(stderr, "%s\n", osp_last_error());
    assert_int_equal(st, OSP_OK);
    return g;
}

static void test_schema_parse(void **st) {
    (void)st;
    osp_grammar_vocab *v = tiny_vocab();
    osp_grammar *g = schema("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\"}},"
                            "\"required\":[\"b\"],\"additionalProperties\":false}");
    assert_true(accepts(g, v, "{\"a\": 1, \"b\": \"x\"}"));
    assert_true(accepts(g, v, "{\"b\": \"x\"}"));
    assert_true(accepts(g, v, " {\n  \"b\" : \"x\"\n}"));
    assert_false(accepts(g, v, "{\"a\": 1}"));               /* b is required */
    assert_false(accepts(g, v, "{\"a\": \"1\", \"b\": \"x\"}")); /* a is an integer */
    assert_false(accepts(g, v, "{\"b\": \"x\", \"c\": 1}"));   /* no additional properties */
    assert_false(accepts(g, v, "{\"b\": \"x\"} x"));
    osp_grammar_free(g);
    /* additional properties by default, but not under a declared name */
    g = schema("{\"properties\":{\"a\":{\"type\":\"integer\"}}}");
    assert_true(accepts(g, v, "{\"a\": 1, \"zz\": [1, {\"q\": null}]}"));
    assert_false(accepts(g, v, "{\"zz\": 1, \"a\": \"s\"}"));
    assert_true(accepts(g, v, "\"not an object\""));
    osp_grammar_free(g);
    /* recursion through $ref, arrays with bounds, enums */
    g = schema("{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"k\":{\"type\":\"array\",\"items\":"
               "{\"$ref\":\"#/$defs/n\"},\"maxItems\":2}},\"additionalProperties\":false}},\"$ref\":\"#/$defs/n\"}");
    assert_true(accepts(g, v, "{\"k\": [{\"k\": []}, {}]}"));
    assert_false(accepts(g, v, "{\"k\": [{}, {}, {}]}"));
    osp_grammar_free(g);
    g = schema("{\"enum\":[\"x\", 1, null, {\"a\": [true]}]}");
    assert_true(accepts(g, v, "{\"a\": [true]}"));
    assert_true(accepts(g, v, "null"));
    assert_false(accepts(g, v, "\"y\""));
    osp_grammar_free(g);
    g = schema("{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMaximum\":120}");
    for (int i = -30; i < 300; i++) {
        char b[16];
        snprintf(b, sizeof b, "%d", i);
        assert_int_equal(accepts(g, v, b), i >= -5 && i < 120);
    }
    assert_false(accepts(g, v, "007"));
    osp_grammar_free(g);
    g = schema("{\"type\":\"number\",\"minimum\":-90,\"maximum\":90}");
    static const char *const in[] = {"0", "-90", "90", "90.0", "-89.99", "45.5", "-0.5", "12"};
    static const char *const out[] = {"90.5", "-90.01", "91", "-100", "1e5", "100"};
    for (size_t i = 0; i < sizeof in / sizeof *in; i++) assert_true(accepts(g, v, in[i]));
    for (size_t i = 0; i < sizeof out / sizeof *out; i++) assert_false(accepts(g, v, out[i]));
    osp_grammar_free(g);
    g = schema("{\"type\":\"number\",\"minimum\":1}");
    assert_true(accepts(g, v, "1.5"));
    assert_true(accepts(g, v, "1000"));
    assert_false(accepts(g, v, "0.99"));
    assert_false(accepts(g, v, "-3"));
    osp_grammar_free(g);
    g = schema("{\"type\":\"object\",\"minProperties\":1,\"patternProperties\":{\"^x-\":{\"type\":\"integer\"}},"
               "\"properties\":{\"a\":{}},\"additionalProperties\":false}");
    assert_false(accepts(g, v, "{}"));
    assert_true(accepts(g, v, "{\"a\": 1, \"x-b\": 2}"));
    assert_false(accepts(g, v, "{\"a\": 1, \"x-b\": \"s\"}"));
    assert_false(accepts(g, v, "{\"b\": 1}"));
    osp_grammar_free(g);
    g = schema("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}");
    assert_true(accepts(g, v, "\"ab\""));
    assert_true(accepts(g, v, "\"a\\nb\""));
    assert_false(accepts(g, v, "\"abcd\""));
    assert_false(accepts(g, v, "\"a\""));
    osp_grammar_free(g);
    g = schema("{\"anyOf\":[{\"type\":\"string\",\"format\":\"date\"},{\"type\":\"array\",\"prefixItems\":"
               "[{\"const\":1}],\"items\":false}]}");
    assert_true(accepts(g, v, "\"2024-02-29\""));
    assert_false(accepts(g, v, "\"2024-13-01\""));
    assert_false(accepts(g, v, "\"2023-02-29\""));
    assert_false(accepts(g, v, "\"2024-04-31\""));
    assert_true(accepts(g, v, "\"2000-02-29\""));
    assert_false(accepts(g, v, "\"1900-02-29\""));
    assert_true(accepts(g, v, "[1]"));
    assert_false(accepts(g, v, "[1, 1]"));
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

static void test_schema_errors(void **st) {
    (void)st;
    static const struct { const char *schema, *needle; } cases[] = {
        {"{\"not\":{\"properties\":{\"a\":{}}}}", "not"},
        {"{\"type\":\"object\",\"patternProperties\":{\"^a\":{\"type\":\"integer\"},\"b\":{}}}", "patternProperties"},
        {"{\"type\":\"object\",\"minProperties\":2}", "minProperties"},
        {"{\"type\":\"string\",\"format\":\"hostname\"}", "hostname"},
        {"{\"type\":\"array\",\"uniqueItems\":true}", "uniqueItems"},
        {"{\"type\":\"number\",\"multipleOf\":3}", "multipleOf"},
        {"{\"type\":\"string\",\"pattern\":\"(?<=a)b\"}", "regex"},
        {"{\"$ref\":\"other.json#/x\"}", "$ref"},
        {"{\"if\":{},\"then\":{}}", "if"},
        {"{\"$ref\":\"#\"}", "deep"}, /* a cycle of references with nothing between */
        {"{\"oneOf\":[{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}},{\"type\":\"object\"}]}", "oneOf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        osp_grammar *g = NULL;
        osp_status s = osp_grammar_from_json_schema(cases[i].schema, strlen(cases[i].schema), &g);
        if (s == OSP_OK) fail_msg("%s compiled", cases[i].schema);
        if (!strstr(osp_last_error(), cases[i].needle)) fail_msg("%s: %s", cases[i].schema, osp_last_error());
    }
    osp_grammar *g = NULL;
    assert_int_equal(osp_grammar_from_json_schema("{", 1, &g), OSP_ERR_INVALID);
    /* oneOf with disjoint branches compiles (types, constants, a discriminator) */
    const char *ok = "{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"},{\"type\":\"object\",\"properties\":"
                     "{\"k\":{\"const\":\"a\"}},\"required\":[\"k\"]},{\"type\":\"object\",\"properties\":{\"k\":"
                     "{\"enum\":[\"b\",\"c\"]}},\"required\":[\"k\"]}]}";
    assert_int_equal(osp_grammar_from_json_schema(ok, strlen(ok), &g), OSP_OK);
    osp_grammar_free(g);
}

static void random_paths(osp_grammar *g, const osp_grammar_vocab *v, int paths, int steps, unsigned seed);

/* strings of many characters (chunks), products of pattern/format/length, formats, not */
static void test_schema_strings_not(void **st) {
    (void)st;
    osp_grammar_vocab *v = tiny_vocab();
    char buf[512], body[300];
    osp_grammar *g = schema("{\"type\":\"string\",\"minLength\":65,\"maxLength\":130}");
    for (int n = 60; n <= 135; n++) {
        memset(body, 'a', (size_t)n), body[n] = 0;
        if (n == 100) body[50] = '\xc3', body[51] = '\xa9', body[52] = 'b', body[53] = '\\', body[54] = 'n'; /* 99 characters */
        snprintf(buf, sizeof buf, "\"%s\"", body);
        if (accepts(g, v, buf) != (n >= 65 && n <= 130 && n != 100) + (n == 100))
            fail_msg("length %d", n);
    }
    random_paths(g, v, 4, 80, 99);
    osp_grammar_free(g);
    g = schema("{\"type\":\"string\",\"minLength\":200}"); /* unbounded above, over three chunks */
    memset(body, 'b', 199), body[199] = 0;
    snprintf(buf, sizeof buf, "\"%s\"", body);
    assert_false(accepts(g, v, buf));
    snprintf(buf, sizeof buf, "\"%sbbbb\"", body);
    assert_true(accepts(g, v, buf));
    osp_grammar_free(g);
    g = schema("{\"type\":\"string\",\"pattern\":\"^[ab]+$\",\"maxLength\":3}");
    assert_true(accepts(g, v, "\"aba\""));
    assert_false(accepts(g, v, "\"abab\""));
    assert_false(accepts(g, v, "\"axa\""));
    random_paths(g, v, 6, 8, 5);
    osp_grammar_free(g);
    g = schema("{\"type\":\"string\",\"format\":\"uri\"}");
    assert_true(accepts(g, v, "\"https://example.com/a/b?x=1#f\""));
    assert_true(accepts(g, v, "\"urn:isbn:0451450523\""));
    assert_true(accepts(g, v, "\"http://[::1]:80/\""));
    assert_false(accepts(g, v, "\"not a uri\""));
    assert_false(accepts(g, v, "\"/relative/path\""));
    assert_false(accepts(g, v, "\"http://a b\""));
    osp_grammar_free(g);
    g = schema("{\"type\":\"string\",\"format\":\"uri-reference\"}");
    assert_true(accepts(g, v, "\"/relative/path?q\""));
    assert_false(accepts(g, v, "\"a b\""));
    osp_grammar_free(g);
    g = schema("{\"type\":\"string\",\"format\":\"x-vendor-thing\"}"); /* no validator checks it: an annotation */
    assert_true(accepts(g, v, "\"anything\""));
    osp_grammar_free(g);
    /* not */
    g = schema("{\"not\":{\"type\":[\"string\",\"object\"]}}");
    assert_true(accepts(g, v, "[1]"));
    assert_true(accepts(g, v, "null"));
    assert_false(accepts(g, v, "\"a\""));
    assert_false(accepts(g, v, "{}"));
    osp_grammar_free(g);
    g = schema("{\"type\":\"string\",\"not\":{\"enum\":[\"ab\",\"a\\\"b\"]}}");
    assert_true(accepts(g, v, "\"abb\""));
    assert_false(accepts(g, v, "\"ab\""));
    assert_false(accepts(g, v, "\"\\u0061b\"")); /* the same string, escaped */
    assert_false(accepts(g, v, "\"a\\\"b\""));
    random_paths(g, v, 6, 8, 6);
    osp_grammar_free(g);
    g = schema("{\"not\":{\"pattern\":\"^a*$\"}}");
    assert_true(accepts(g, v, "\"ab\""));
    assert_false(accepts(g, v, "12")); /* a number meets the pattern (it speaks of strings only) */
    assert_false(accepts(g, v, "\"aa\""));
    assert_false(accepts(g, v, "\"\""));
    osp_grammar_free(g);
    g = schema("{\"not\":{\"not\":{\"type\":\"boolean\"}}}");
    assert_true(accepts(g, v, "true"));
    assert_false(accepts(g, v, "1"));
    osp_grammar_free(g);
    g = schema("{\"not\":{\"maxItems\":1}}");
    assert_true(accepts(g, v, "[1, 0]"));
    assert_false(accepts(g, v, "\"a\""));
    assert_false(accepts(g, v, "[1]"));
    osp_grammar_free(g);
    g = schema("{\"type\":\"object\",\"not\":{\"required\":[\"a\",\"b\"]}}");
    assert_true(accepts(g, v, "{\"a\": 1}"));
    assert_true(accepts(g, v, "{\"b\": 1}"));
    assert_false(accepts(g, v, "{\"a\": 1, \"b\": 0}"));
    assert_false(accepts(g, v, "{\"b\": 1, \"a\": 0}"));
    osp_grammar_free(g);
    g = schema("{\"not\":{}}");
    assert_false(accepts(g, v, "1"));
    assert_false(accepts(g, v, "null"));
    osp_grammar_free(g);
    /* patternProperties: its keys take its schema (a declared one both), the others additionalProperties */
    g = schema("{\"type\":\"object\",\"properties\":{\"ab\":{\"type\":\"integer\"}},\"patternProperties\":"
               "{\"^a\":{\"type\":[\"string\",\"integer\"]}},\"additionalProperties\":{\"type\":\"boolean\"}}");
    assert_true(accepts(g, v, "{\"ab\": 1, \"a\": \"x\", \"b\": true}"));
    assert_false(accepts(g, v, "{\"ab\": \"x\"}"));
    assert_false(accepts(g, v, "{\"a\": true}"));
    assert_false(accepts(g, v, "{\"b\": \"x\"}"));
    assert_false(accepts(g, v, "{\"\\u0061\": true}")); /* "a" escaped is still the pattern's */
    random_paths(g, v, 6, 12, 8);
    osp_grammar_free(g);
    /* overlapping oneOf: each branch less the others */
    g = schema("{\"oneOf\":[{\"type\":\"string\"},{\"maxLength\":3}]}");
    assert_true(accepts(g, v, "\"abab\""));
    assert_true(accepts(g, v, "1"));
    assert_false(accepts(g, v, "\"ab\"")); /* both */
    osp_grammar_free(g);
    g = schema("{\"type\":\"object\",\"oneOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}");
    assert_true(accepts(g, v, "{\"a\": 1}"));
    assert_true(accepts(g, v, "{\"b\": 1}"));
    assert_false(accepts(g, v, "{\"a\": 1, \"b\": 0}"));
    assert_false(accepts(g, v, "{}"));
    random_paths(g, v, 6, 10, 9);
    osp_grammar_free(g);
    /* multipleOf of integers */
    g = schema("{\"type\":\"integer\",\"multipleOf\":3,\"minimum\":-10,\"maximum\":20}");
    static const char *const yes[] = {"9", "-9", "0", "18"}, *const no[] = {"10", "21", "-12", "1", "012", "3.0"};
    for (int i = 0; i < 4; i++) if (!accepts(g, v, yes[i])) fail_msg("%s", yes[i]);
    for (int i = 0; i < 6; i++) if (accepts(g, v, no[i])) fail_msg("%s", no[i]);
    random_paths(g, v, 6, 6, 10);
    osp_grammar_free(g);
    g = schema("{\"type\":\"integer\",\"multipleOf\":7}");
    assert_true(accepts(g, v, "1001"));
    assert_false(accepts(g, v, "1002"));
    osp_grammar_free(g);
    /* a oneOf beside an anyOf: both hold */
    g = schema("{\"anyOf\":[{\"type\":\"integer\"},{\"type\":\"string\"}],\"oneOf\":[{\"type\":\"string\"},{\"type\":\"null\"}]}");
    assert_true(accepts(g, v, "\"a\""));
    assert_false(accepts(g, v, "1"));
    assert_false(accepts(g, v, "null"));
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

/* fast mask == plain walk == brute force, along random paths */
static void check_masks(osp_grammar_matcher *m, const osp_grammar_vocab *v, uint32_t *a, uint32_t *b) {
    int32_t n = osp_grammar_vocab_size(v);
    osp_grammar_matcher_mask(m, a);
    osp_grammar_matcher_mask_reference(m, b);
    for (int32_t t = 0; t < n; t++) {
        int fa = (a[t >> 5] >> (t & 31)) & 1, fb = (b[t >> 5] >> (t & 31)) & 1;
        int br = osp_grammar_matcher_commit(m, t);
        if (br && t != osp_grammar_vocab_eos(v)) osp_grammar_matcher_rollback(m, 1);
        if (fa != br || fb != br) fail_msg("token %d: fast %d reference %d brute %d", t, fa, fb, br);
    }
}
static void random_paths(osp_grammar *g, const osp_grammar_vocab *v, int paths, int steps, unsigned seed) {
    int32_t n = osp_grammar_vocab_size(v), w = (n + 31) / 32;
    uint32_t *a = calloc(w, 4), *b = calloc(w, 4);
    srand(seed);
    for (int p = 0; p < paths; p++) {
        osp_grammar_matcher *m;
        assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
        for (int s = 0; s < steps; s++) {
            check_masks(m, v, a, b);
            int32_t allowed[4096], na = 0;
            for (int32_t t = 0; t < n && na < 4096; t++)
                if (((a[t >> 5] >> (t & 31)) & 1) && t != osp_grammar_vocab_eos(v)) allowed[na++] = t;
            if (!na) break;
            int32_t pick = allowed[rand() % na];
            if (getenv("GRAMMAR_TEST_TRACE")) fprintf(stderr, "[%.*s]", (int)v->tok_len[pick], v->tok_bytes[pick]);
            assert_true(osp_grammar_matcher_commit(m, pick));
        }
        osp_grammar_matcher_free(m);
    }
    free(a), free(b);
}

static void test_mask_brute_force(void **st) {
    (void)st;
    osp_grammar_vocab *v = tiny_vocab();
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}},"
        "\"b\":{\"enum\":[\"ab\",true,null]}},\"required\":[\"a\"]}",
        "{\"type\":[\"string\",\"boolean\",\"null\"],\"maxLength\":3}",
        "{\"$defs\":{\"t\":{\"type\":\"array\",\"items\":{\"anyOf\":[{\"$ref\":\"#/$defs/t\"},{\"type\":\"integer\"}]}}},"
        "\"$ref\":\"#/$defs/t\"}",
        "{\"type\":\"string\",\"pattern\":\"^(ab|\\u00e9)+z?$\"}",
        "true",
    };
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        osp_grammar *g = schema(schemas[i]);
        random_paths(g, v, 12, 24, 1234 + (unsigned)i);
        osp_grammar_free(g);
    }
    osp_grammar *g;
    assert_int_equal(osp_grammar_from_regex("(ab|a)*[0-9]{2}", 15, &g), OSP_OK);
    random_paths(g, v, 8, 10, 7);
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

static osp_tokenizer *load_gz(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/tokenizer.json.gz", dir);
    gzFile f = gzopen(p, "rb");
    assert_non_null(f);
    size_t cap = 1 << 24, n = 0;
    char *buf = malloc(cap);
    int r;
    while ((r = gzread(f, buf + n, (unsigned)(cap - n))) > 0)
        if ((n += (size_t)r) == cap) buf = realloc(buf, cap *= 2);
    gzclose(f);
    osp_tokenizer *t;
    assert_int_equal(osp_tokenizer_load_json(buf, n, NULL, 0, dir, &t), OSP_OK);
    free(buf);
    return t;
}

/* Llama 3 (byte-level) and Gemma 3 (SentencePiece): bytes of known tokens,
 * and MaskBench samples walked token by token. */
static void test_real_vocabs(void **st) {
    (void)st;
    osp_tokenizer *tg = load_gz("data/tokenizers/gemma3");
    osp_grammar_vocab *vg;
    assert_int_equal(osp_grammar_vocab_from_tokenizer(tg, &vg), OSP_OK);
    int32_t id = osp_tokenizer_token_id(tg, "\xe2\x96\x81{", 4);
    if (id >= 0) assert_memory_equal(vg->tok_bytes[id], " {", 2);
    id = osp_tokenizer_token_id(tg, "<0x0A>", 6);
    assert_true(id >= 0 && vg->tok_len[id] == 1 && vg->tok_bytes[id][0] == '\n');
    osp_grammar_vocab_free(vg);
    osp_tokenizer_free(tg);

    osp_tokenizer *t = load_gz("data/tokenizers/llama3");
    osp_grammar_vocab *v;
    assert_int_equal(osp_grammar_vocab_from_tokenizer(t, &v), OSP_OK);
    id = osp_tokenizer_token_id(t, "\xc4\xa0{\"", 4); /* "Ġ{\"" */
    assert_true(id >= 0 && v->tok_len[id] == 3 && !memcmp(v->tok_bytes[id], " {\"", 3));
    FILE *f = fopen("data/grammar/maskbench_sample.jsonl", "r");
    assert_non_null(f);
    char *line = NULL;
    size_t cap = 0;
    int32_t n = osp_grammar_vocab_size(v), w = (n + 31) / 32;
    uint32_t *a = calloc(w, 4), *b = calloc(w, 4);
    int checked = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        char *s = json_dumps(json_object_get(j, "schema"), JSON_COMPACT | JSON_PRESERVE_ORDER);
        osp_grammar *g = schema(s);
        free(s);
        size_t i;
        json_t *test;
        json_array_foreach(json_object_get(j, "tests"), i, test) {
            const char *text = json_string_value(json_object_get(test, "text"));
            int valid = json_is_true(json_object_get(test, "valid"));
            int32_t *ids;
            size_t nid;
            assert_int_equal(osp_tokenizer_encode_alloc(t, text, strlen(text), 0, &ids, &nid), OSP_OK);
            osp_grammar_matcher *m;
            assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
            int ok = 1;
            for (size_t k = 0; k < nid && ok; k++) {
                osp_grammar_matcher_mask(m, a);
                if (checked < 6) { /* the fast path against the plain walk on the full vocabulary */
                    osp_grammar_matcher_mask_reference(m, b);
                    assert_memory_equal(a, b, sizeof(uint32_t) * w);
                    checked++;
                }
                ok = (a[ids[k] >> 5] >> (ids[k] & 31)) & 1;
                assert_int_equal(ok, osp_grammar_matcher_commit(m, ids[k]));
            }
            ok = ok && osp_grammar_matcher_accepting(m);
            if (ok != valid) fail_msg("%s: %s", json_string_value(json_object_get(j, "id")), text);
            osp_grammar_matcher_free(m);
            osp_free(ids);
        }
        osp_grammar_free(g);
        json_decref(j);
    }
    free(line), free(a), free(b);
    fclose(f);
    osp_grammar_vocab_free(v);
    osp_tokenizer_free(t);
}

/* The cache's fills (the folded trie for string lexemes) against the plain walk on the Llama 3
 * vocabulary, along paths picked from the masks. */
static void test_fold_vs_reference(void **st) {
    (void)st;
    osp_tokenizer *t = load_gz("data/tokenizers/llama3");
    osp_grammar_vocab *v;
    assert_int_equal(osp_grammar_vocab_from_tokenizer(t, &v), OSP_OK);
    static const char *const schemas[] = {
        "{\"type\":\"string\",\"maxLength\":70}",
        "{\"type\":\"object\",\"properties\":{\"d\":{\"type\":\"string\",\"format\":\"date-time\"},"
        "\"s\":{\"type\":\"string\",\"minLength\":3}},\"required\":[\"d\",\"s\"]}",
        "{\"type\":\"array\",\"items\":{\"type\":\"string\",\"pattern\":\"^[a-z]+\\\\d*$\"}}",
        "{\"type\":\"string\",\"format\":\"uri\",\"not\":{\"enum\":[\"http://a\"]}}",
    };
    int32_t n = osp_grammar_vocab_size(v), w = (n + 31) / 32;
    uint32_t *a = calloc(w, 4), *b = calloc(w, 4);
    uint32_t seed = 7;
    for (size_t i = 0; i < sizeof schemas / sizeof *schemas; i++) {
        osp_grammar *g = schema(schemas[i]);
        for (int p = 0; p < 3; p++) {
            osp_grammar_matcher *m;
            assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
            for (int s = 0; s < 30; s++) {
                osp_grammar_matcher_mask(m, a);
                osp_grammar_matcher_mask_reference(m, b);
                if (memcmp(a, b, sizeof(uint32_t) * w)) fail_msg("schema %zu path %d step %d", i, p, s);
                int32_t na = 0, pick = -1;
                for (int32_t k = 0; k < w; k++) na += __builtin_popcount(a[k]);
                int32_t eos = osp_grammar_vocab_eos(v);
                if (eos >= 0 && (a[eos >> 5] >> (eos & 31) & 1)) na--;
                if (na <= 0) break;
                seed = seed * 1103515245u + 12345u;
                int32_t kth = (int32_t)((seed >> 8) % (uint32_t)na);
                for (int32_t k = 0; k < n && pick < 0; k++)
                    if ((a[k >> 5] >> (k & 31) & 1) && k != eos && kth-- == 0) pick = k;
                assert_true(osp_grammar_matcher_commit(m, pick));
            }
            osp_grammar_matcher_free(m);
        }
        osp_grammar_free(g);
    }
    free(a), free(b);
    osp_grammar_vocab_free(v);
    osp_tokenizer_free(t);
}

/* Matchers on several threads over shared grammars and one vocab give the
 * single thread's masks. Each path picks its tokens from its own masks by a
 * seeded rule, so a wrong mask also changes the path. The cache's budget is
 * small so that clears run while other threads read entries. */
#define MT_THREADS 4
#define MT_PATHS 6
#define MT_STEPS 40
typedef struct mt_run {
    osp_grammar **g;
    int ng;
    const osp_grammar_vocab *v;
    uint64_t *want; /* [ng][MT_PATHS][MT_STEPS]: hash of each mask, 0 after the end */
    uint64_t *got;
    int first;      /* the grammar this thread starts at */
} mt_run;

static uint64_t mask_hash(const uint32_t *a, int32_t w) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t i = 0; i < w; i++) h = (h ^ a[i]) * 1099511628211ull;
    return h | 1;
}
static void *mt_paths(void *arg) {
    mt_run *r = arg;
    int32_t n = osp_grammar_vocab_size(r->v), w = (n + 31) / 32;
    uint32_t *a = malloc(sizeof(uint32_t) * w);
    for (int k = 0; k < r->ng; k++) {
        int gi = (r->first + k) % r->ng;
        for (int p = 0; p < MT_PATHS; p++) {
            osp_grammar_matcher *m;
            if (osp_grammar_matcher_new(r->g[gi], r->v, &m)) break;
            uint64_t *out = r->got + ((size_t)gi * MT_PATHS + p) * MT_STEPS;
            uint32_t seed = 2654435761u * (uint32_t)(gi * MT_PATHS + p + 1);
            for (int s = 0; s < MT_STEPS; s++) {
                osp_grammar_matcher_mask(m, a);
                out[s] = mask_hash(a, w);
                int32_t na = 0, pick = -1;
                for (int32_t i = 0; i < w; i++) na += __builtin_popcount(a[i]);
                int32_t eos = osp_grammar_vocab_eos(r->v);
                if (eos >= 0 && (a[eos >> 5] >> (eos & 31) & 1)) na--;
                if (na <= 0) break;
                seed = seed * 1103515245u + 12345u;
                int32_t kth = (int32_t)((seed >> 8) % (uint32_t)na);
                for (int32_t t = 0; t < n && pick < 0; t++)
                    if ((a[t >> 5] >> (t & 31) & 1) && t != osp_grammar_vocab_eos(r->v) && kth-- == 0) pick = t;
                if (!osp_grammar_matcher_commit(m, pick)) break;
            }
            osp_grammar_matcher_free(m);
        }
    }
    free(a);
    return NULL;
}

static void test_masks_threads(void **st) {
    (void)st;
    osp_tokenizer *t = load_gz("data/tokenizers/llama3");
    FILE *f = fopen("data/grammar/maskbench_sample.jsonl", "r");
    assert_non_null(f);
    char *line = NULL, *texts[16];
    size_t cap = 0;
    int ng = 0;
    while (ng < 15 && getline(&line, &cap, f) > 0) {
        json_t *j = json_loads(line, 0, NULL);
        texts[ng++] = json_dumps(json_object_get(j, "schema"), JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(j);
    }
    texts[ng++] = strdup("{\"type\":\"object\",\"properties\":{\"id\":{\"type\":\"string\",\"pattern\":\"^[a-f0-9]{8}$\"},"
                         "\"n\":{\"type\":\"integer\",\"minimum\":-40,\"maximum\":1234}},\"required\":[\"id\",\"n\"]}");
    free(line), fclose(f);
    size_t cells = (size_t)ng * MT_PATHS * MT_STEPS;
    uint64_t *want = calloc(cells, 8);
    /* one thread, its own vocab and grammars */
    osp_grammar_vocab *v1;
    assert_int_equal(osp_grammar_vocab_from_tokenizer(t, &v1), OSP_OK);
    osp_grammar *g1[16], *g2[16];
    for (int i = 0; i < ng; i++) g1[i] = schema(texts[i]), g2[i] = schema(texts[i]);
    mt_run one = {g1, ng, v1, want, want, 0};
    mt_paths(&one);
    /* threads on a fresh vocab: they bind the grammars and fill the cache together */
    osp_grammar_vocab *v2;
    assert_int_equal(osp_grammar_vocab_from_tokenizer(t, &v2), OSP_OK);
    gr_cache_set_budget(v2->cache, 1u << 20);
    mt_run runs[MT_THREADS];
    pthread_t th[MT_THREADS];
    for (int k = 0; k < MT_THREADS; k++) {
        runs[k] = (mt_run){g2, ng, v2, want, calloc(cells, 8), k % ng};
        assert_int_equal(pthread_create(&th[k], NULL, mt_paths, &runs[k]), 0);
    }
    for (int k = 0; k < MT_THREADS; k++) pthread_join(th[k], NULL);
    size_t steps = 0;
    for (size_t c = 0; c < cells; c++) steps += want[c] != 0;
    assert_true(steps > (size_t)ng * MT_PATHS * 4);
    for (int k = 0; k < MT_THREADS; k++) {
        for (size_t c = 0; c < cells; c++)
            if (runs[k].got[c] != want[c])
                fail_msg("thread %d: schema %zu path %zu step %zu differs", k, c / (MT_PATHS * MT_STEPS),
                         c / MT_STEPS % MT_PATHS, c % MT_STEPS);
        free(runs[k].got);
    }
    for (int i = 0; i < ng; i++) osp_grammar_free(g1[i]), osp_grammar_free(g2[i]), free(texts[i]);
    free(want);
    osp_grammar_vocab_free(v1), osp_grammar_vocab_free(v2);
    osp_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_regex_plain),       cmocka_unit_test(test_regex_json_string),
        cmocka_unit_test(test_regex_open_ends),
        cmocka_unit_test(test_schema_parse),      cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_mask_brute_force),  cmocka_unit_test(test_real_vocabs),
        cmocka_unit_test(test_schema_strings_not), cmocka_unit_test(test_fold_vs_reference),
        cmocka_unit_test(test_masks_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
