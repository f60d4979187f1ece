/* grammar/gbnf: GBNF grammars (llama-server's `grammar`) accept and reject
 * texts as their rules say, masks follow them, and malformed grammars are
 * errors naming where. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "grammar/grammar.h"
#include "grammar_walk.h"

static osp_grammar *compile(const char *text) {
    osp_grammar *g = NULL;
    osp_status st = osp_grammar_from_gbnf(text, strlen(text), NULL, &g);
    if (st != OSP_OK) fail_msg("grammar did not compile: %s\n%s", osp_last_error(), text);
    return g;
}

#define TAKES(g, v, s) takes_n(g, v, s, sizeof(s) - 1)

static void test_alternatives(void **st) {
    (void)st;
    osp_grammar_vocab *v = byte_vocab();
    osp_grammar *g = compile("root ::= \"yes\" | \"no\"  # a comment\n");
    assert_true(TAKES(g, v, "yes"));
    assert_true(TAKES(g, v, "no"));
    assert_false(TAKES(g, v, "ye"));
    assert_false(TAKES(g, v, "yess"));
    assert_false(TAKES(g, v, ""));
    osp_grammar_free(g);
    /* a rule goes on where a group is open, or where its next line starts with '|' */
    g = compile("# answers\nroot ::= (\n  \"a\"\n  | \"b\" )\n  | \"c\"\nunused ::= \"z\"\n");
    assert_true(TAKES(g, v, "a"));
    assert_true(TAKES(g, v, "b"));
    assert_true(TAKES(g, v, "c"));
    assert_false(TAKES(g, v, "z"));
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

static const char JSON[] = "root   ::= value\n"
                           "value  ::= object | array | string | number | (\"true\" | \"false\" | \"null\") ws\n"
                           "object ::= \"{\" ws ( member ( \",\" ws member )* )? \"}\" ws\n"
                           "member ::= string \":\" ws value\n"
                           "array  ::= \"[\" ws ( value ( \",\" ws value )* )? \"]\" ws\n"
                           "string ::= \"\\\"\" ( [^\"\\\\\\x00-\\x1f] | \"\\\\\" [\"\\\\/bfnrt] )* \"\\\"\" ws\n"
                           "number ::= \"-\"? [0-9]+ (\".\" [0-9]+)? ws\n"
                           "ws     ::= [ \\t\\n]*\n";

static void test_recursive(void **st) {
    (void)st;
    osp_grammar_vocab *v = byte_vocab();
    osp_grammar *g = compile(JSON);
    assert_true(TAKES(g, v, "{\"a\": [1, 2.5, {\"b\": \"c\\n\"}], \"d\": true}"));
    assert_true(TAKES(g, v, "[[[[]]]]"));
    assert_true(TAKES(g, v, "\"caf\xc3\xa9\""));
    assert_true(TAKES(g, v, "-12 "));
    assert_false(TAKES(g, v, "{\"a\" 1}"));
    assert_false(TAKES(g, v, "[1,]"));
    assert_false(TAKES(g, v, "\"a\nb\""));
    assert_false(TAKES(g, v, "[[]"));
    osp_grammar_free(g);
    /* a repetition of a recursive part, bounded and not */
    g = compile("root ::= item{2}\nitem ::= \"(\" item? \")\"\n");
    assert_true(TAKES(g, v, "()()"));
    assert_true(TAKES(g, v, "(())()"));
    assert_false(TAKES(g, v, "()"));
    assert_false(TAKES(g, v, "()()()"));
    osp_grammar_free(g);
    g = compile("root ::= item ws item*\nitem ::= \"(\" item? \")\"\nws ::= \" \"*\n");
    assert_true(TAKES(g, v, "()()"));
    assert_true(TAKES(g, v, "() ()()"));
    assert_true(TAKES(g, v, "()"));
    assert_false(TAKES(g, v, " ()"));
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

static void test_characters(void **st) {
    (void)st;
    osp_grammar_vocab *v = byte_vocab();
    /* classes over code points, matched as whole UTF-8 sequences */
    osp_grammar *g = compile("root ::= [\\u03b1-\\u03c9]+ \"!\"\n");
    assert_true(TAKES(g, v, "\xce\xb1\xce\xb2\xcf\x89!")); /* αβω! */
    assert_false(TAKES(g, v, "abc!"));
    assert_false(TAKES(g, v, "\xce\xb1\xce!"));
    osp_grammar_free(g);
    g = compile("root ::= [^a]\n");
    assert_true(TAKES(g, v, "b"));
    assert_true(TAKES(g, v, "\xc3\xa9"));         /* é */
    assert_true(TAKES(g, v, "\xe2\x82\xac"));     /* € */
    assert_true(TAKES(g, v, "\xf0\x9f\x98\x80")); /* an emoji */
    assert_false(TAKES(g, v, "a"));
    assert_false(TAKES(g, v, "\xff"));
    assert_false(TAKES(g, v, "\xc0\x80"));     /* an overlong NUL */
    assert_false(TAKES(g, v, "\xed\xa0\x80")); /* a surrogate */
    osp_grammar_free(g);
    g = compile("root ::= . \"\xe2\x82\xac\" [a-c\\x41]\n");
    assert_true(TAKES(g, v, "\xf0\x9f\x98\x80\xe2\x82\xac" "A"));
    assert_true(TAKES(g, v, "x\xe2\x82\xac" "b"));
    assert_false(TAKES(g, v, "x\xe2\x82\xac" "d"));
    osp_grammar_free(g);
    g = compile("root ::= [0-9]{2,3} \"-\" [a]{2,} \"|\" \"x\"{0,1}\n");
    assert_true(TAKES(g, v, "12-aa|"));
    assert_true(TAKES(g, v, "123-aaaa|x"));
    assert_false(TAKES(g, v, "1-aa|"));
    assert_false(TAKES(g, v, "1234-aa|"));
    assert_false(TAKES(g, v, "12-a|"));
    assert_false(TAKES(g, v, "12-aa|xx"));
    osp_grammar_free(g);
    /* after a literal prefix (the server's: the close of a reasoning block the prompt opened) */
    assert_int_equal(osp_grammar_from_gbnf("root ::= [0-9]+\n", 16, "</think>\n", &g), OSP_OK);
    assert_true(TAKES(g, v, "</think>\n42"));
    assert_false(TAKES(g, v, "42"));
    assert_false(TAKES(g, v, "</think>\n"));
    osp_grammar_free(g);
    /* a root that takes the empty text */
    g = compile("root ::= \"a\"*\n");
    assert_true(TAKES(g, v, ""));
    assert_true(TAKES(g, v, "aaa"));
    assert_false(TAKES(g, v, "b"));
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

/* Tokens of several bytes: the mask holds exactly those the grammar allows. */
static void test_mask(void **st) {
    (void)st;
    const char *toks[] = {"y", "ye", "yes", "n", "no", "x", "yesno", NULL};
    uint32_t lens[8];
    for (int i = 0; i < 8; i++) lens[i] = toks[i] ? (uint32_t)strlen(toks[i]) : 0;
    osp_grammar_vocab *v;
    assert_int_equal(osp_grammar_vocab_new(8, toks, lens, 7, &v), OSP_OK);
    osp_grammar *g = compile("root ::= \"yes\" | \"no\"\n");
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
    uint32_t mask[1];
    osp_grammar_matcher_mask(m, mask);
    assert_int_equal(mask[0], 0x1f); /* y ye yes n no; not x, yesno, EOS */
    assert_int_equal(osp_grammar_matcher_commit(m, 1), 1); /* ye */
    osp_grammar_matcher_mask(m, mask);
    assert_int_equal(mask[0], 0); /* only "s" would do, and no token is "s" */
    osp_grammar_matcher_rollback(m, 1);
    assert_int_equal(osp_grammar_matcher_commit(m, 2), 1); /* yes */
    osp_grammar_matcher_mask(m, mask);
    assert_int_equal(mask[0], 1u << 7); /* EOS alone */
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

static void expect_error(const char *text, const char *says) {
    osp_grammar *g = NULL;
    osp_status st = osp_grammar_from_gbnf(text, strlen(text), NULL, &g);
    if (st == OSP_OK) fail_msg("compiled, but should not have:\n%s", text);
    assert_null(g);
    if (!strstr(osp_last_error(), says)) fail_msg("error '%s' does not say '%s'", osp_last_error(), says);
}

static void test_errors(void **st) {
    (void)st;
    expect_error("value ::= \"a\"\n", "no 'root' rule");
    expect_error("root ::= thing\n", "rule 'thing' is used but not defined");
    expect_error("root ::= \"a\"\nroot ::= \"b\"\n", "defined twice");
    expect_error("root ::= \"abc\n", "unterminated literal");
    expect_error("root ::= [abc\n", "unterminated character class");
    expect_error("root = \"a\"\n", "'::=' expected");
    expect_error("root ::= \"a\\q\"\n", "unknown escape");
    expect_error("root ::= \"\\xZZ\"\n", "bad hex escape");
    expect_error("root ::= (\"a\" \n", "missing ')'");
    expect_error("root ::= \"a\"{3,2}\n", "n < m");
    expect_error("root ::= \"a\"{2000}\n", "over 1000");
    expect_error("root ::= [z-a]\n", "end comes before its start");
    expect_error("root ::= [^\\x00-\\U0010ffff]\n", "matches no character");
    expect_error("root ::= \"a\" ) \n", "unexpected character");
    expect_error("root ::= \"\xff\"\n", "malformed UTF-8");
    expect_error("\n\nroot ::= \"a\" @\n", "line 3, column 14");
    char deep[512];
    strcpy(deep, "root ::= ");
    memset(deep + 9, '(', 200);
    strcpy(deep + 209, "\"a\"");
    memset(deep + 212, ')', 200);
    strcpy(deep + 412, "\n");
    expect_error(deep, "nested too deep");
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_alternatives), cmocka_unit_test(test_recursive),
                                       cmocka_unit_test(test_characters), cmocka_unit_test(test_mask),
                                       cmocka_unit_test(test_errors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
