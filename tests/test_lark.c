/* grammar/lark: Lark grammars (OpenAI's custom tools) accept and reject
 * texts as their rules say, the common terminals import, constructs the
 * subset cannot honour are errors naming them, Codex's apply_patch grammar
 * takes a real patch, and a grammar compiled for a JSON string takes the
 * JSON-escaped spelling of its texts byte by byte. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/core.h"
#include "grammar/grammar.h"
#include "grammar_walk.h"

static osp_grammar *compile_f(const char *text, int flags) {
    osp_grammar *g = NULL;
    osp_status st = osp_grammar_from_lark(text, strlen(text), flags, &g);
    if (st != OSP_OK) fail_msg("grammar did not compile: %s\n%s", osp_last_error(), text);
    return g;
}
static osp_grammar *compile(const char *text) { return compile_f(text, 0); }

static int takes(osp_grammar *g, osp_grammar_vocab *v, const char *s) { return takes_n(g, v, s, strlen(s)); }

static void test_syntax(void **st) {
    (void)st;
    osp_grammar_vocab *v = byte_vocab();
    /* alternatives over lines, groups, optional parts, repetition, aliases, comments, rule modifiers */
    osp_grammar *g = compile("// a comment\n"
                             "start: greeting (\",\" NAME)* [\"!\"] -> hello\n"
                             "     | \"bye\"   // another\n"
                             "?greeting: \"hi\" | \"hello\"\n"
                             "NAME: \"a\"..\"z\"+\n");
    assert_true(takes(g, v, "hi"));
    assert_true(takes(g, v, "hello,bob,al!"));
    assert_true(takes(g, v, "bye"));
    assert_false(takes(g, v, "hi,"));
    assert_false(takes(g, v, "hi,B"));
    assert_false(takes(g, v, "bye!"));
    osp_grammar_free(g);
    /* counted repetition both ways, ? and + */
    g = compile("start: A~2 \"-\" B~1..3 \"-\" C{2,} \"-\" D{,1} E? F+\nA: \"a\"\nB: \"b\"\nC: \"c\"\nD: \"d\"\nE: \"e\"\nF: \"f\"\n");
    assert_true(takes(g, v, "aa-b-cc-f"));
    assert_true(takes(g, v, "aa-bbb-cccc-def"));
    assert_false(takes(g, v, "a-b-cc-f"));
    assert_false(takes(g, v, "aa-bbbb-cc-f"));
    assert_false(takes(g, v, "aa-b-c-f"));
    assert_false(takes(g, v, "aa-b-cc-ddf"));
    assert_false(takes(g, v, "aa-b-cc-"));
    osp_grammar_free(g);
    /* strings: escapes, case-insensitive; regexes: flags, escaped slash, whole UTF-8 characters */
    g = compile("start: \"say \\\"\\x41\\u00e9\\\"\\n\" | \"select\"i \" \" /[a-z]+\\/[0-9]/i | /a.b/ | /<.>/s\n");
    assert_true(takes(g, v, "say \"A\xc3\xa9\"\n"));
    assert_true(takes(g, v, "SeLeCt Ab/7"));
    assert_true(takes(g, v, "select xyz/0"));
    assert_false(takes(g, v, "select xyz/a"));
    assert_true(takes(g, v, "a\xc3\xa9" "b"));  /* '.' is one character, two bytes here */
    assert_false(takes(g, v, "a\xc3" "b"));     /* not half of one */
    assert_false(takes(g, v, "a\nb"));          /* '.' takes no newline ... */
    assert_true(takes(g, v, "<\n>"));           /* ... unless the flag s says so */
    osp_grammar_free(g);
    /* an alias at an alternative's end, the next alternative on the next line (the shape of OpenAI's examples) */
    g = compile("start: expr\n"
                "expr: term (SP ADD SP term)* -> add\n"
                "    | term\n"
                "term: factor (SP MUL SP factor)* -> mul\n"
                "    | factor\n"
                "factor: INT\n"
                "SP: \" \"\n"
                "ADD: \"+\"\n"
                "MUL: \"*\"\n"
                "%import common.INT\n");
    assert_true(takes(g, v, "1 + 2 * 3"));
    assert_true(takes(g, v, "42"));
    assert_false(takes(g, v, "1+2"));
    assert_false(takes(g, v, "1 + "));
    osp_grammar_free(g);
    /* recursion: nested brackets */
    g = compile("start: list\nlist: \"[\" [item (\",\" item)*] \"]\"\n?item: list | INT\nINT: /[0-9]+/\n");
    assert_true(takes(g, v, "[]"));
    assert_true(takes(g, v, "[1,[2,[]],[[3]]]"));
    assert_false(takes(g, v, "[1,[2]"));
    assert_false(takes(g, v, "[1,]"));
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

static void test_common(void **st) {
    (void)st;
    osp_grammar_vocab *v = byte_vocab();
    osp_grammar *g = compile("start: \"add \" NUMBER \" \" NUMBER\n%import common.NUMBER\n");
    assert_true(takes(g, v, "add 1 2"));
    assert_true(takes(g, v, "add 3.5 1e10"));
    assert_true(takes(g, v, "add .5 12.25E-3"));
    assert_false(takes(g, v, "add 1"));
    assert_false(takes(g, v, "add -1 2"));
    assert_false(takes(g, v, "add 1  2"));
    osp_grammar_free(g);
    /* %ignore: whitespace between any two terminals of the rules, not inside one */
    g = compile("start: pair (\",\" pair)*\n"
                "pair: CNAME \"=\" value\n"
                "value: SIGNED_INT | ESCAPED_STRING\n"
                "%import common (CNAME, ESCAPED_STRING)\n"
                "%import common.SIGNED_INT\n"
                "%import common.WS\n"
                "%ignore WS\n");
    assert_true(takes(g, v, "a=1"));
    assert_true(takes(g, v, "  a = -1 ,\n b_2=\"x \\\" y\"  "));
    assert_false(takes(g, v, "a b=1"));     /* no space inside a CNAME */
    assert_false(takes(g, v, "a=- 1"));     /* nor inside SIGNED_INT */
    assert_false(takes(g, v, "2a=1"));
    assert_false(takes(g, v, "a=\"x\"y\""));
    osp_grammar_free(g);
    /* renamed and other common terminals */
    g = compile("start: W (SP W)* NL\n%import common.WORD -> W\n%import common.WS_INLINE -> SP\n"
                "%import common.NEWLINE -> NL\n");
    assert_true(takes(g, v, "hello big\tworld\r\n\n"));
    assert_false(takes(g, v, "hello big world"));
    assert_false(takes(g, v, "hello 2\n"));
    osp_grammar_free(g);
    g = compile("start: HEXDIGIT+ \" \" C_COMMENT \" \" SH_COMMENT LF\n%import common (HEXDIGIT, C_COMMENT, SH_COMMENT, LF)\n");
    assert_true(takes(g, v, "0aF /* a * b **/ # x\n"));
    assert_false(takes(g, v, "0aF /* a */ b */ # x\n"));
    assert_false(takes(g, v, "0g /**/ #\n"));
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

static void expect_error(const char *text, const char *says) {
    osp_grammar *g = NULL;
    osp_status st = osp_grammar_from_lark(text, strlen(text), 0, &g);
    if (st == OSP_OK) fail_msg("compiled, but should not have:\n%s", text);
    assert_null(g);
    if (!strstr(osp_last_error(), says)) fail_msg("error '%s' does not say '%s'", osp_last_error(), says);
}

static void test_errors(void **st) {
    (void)st;
    expect_error("begin: \"a\"\n", "no 'start' rule");
    expect_error("start: thing\n", "rule 'thing' is used but not defined");
    expect_error("start: \"a\"\nstart: \"b\"\n", "defined twice");
    expect_error("start: \"abc\n", "unterminated string");
    expect_error("start: /abc\n", "unterminated regex");
    expect_error("start: \"a\\q\"\n", "unknown escape");
    expect_error("start ::= \"a\"\n", "GBNF");
    expect_error("start: (\"a\" \n", "missing ')'");
    expect_error("start: [\"a\" \n", "missing ']'");
    expect_error("start: \"a\"~3..2\n", "m < n");
    expect_error("start: \"a\"{2000}\n", "over 1000");
    expect_error("start: \"z\"..\"a\"\n", "end comes before its start");
    expect_error("start: \"ab\"..\"z\"\n", "single characters");
    expect_error("start: /a/m\n", "regex flag 'm'");
    expect_error("start: /(?=a)b/\n", "lookaround");
    expect_error("start: /a\\1/\n", "backreference");
    expect_error("start: sep{\"a\", \",\"}\nsep{x, s}: x (s x)*\n", "templates");
    expect_error("start: A\nA.2: \"a\"\n", "priorities");
    expect_error("start: \"a\"\n%declare B\n", "directive '%declare'");
    expect_error("start: \"a\"\n%override start: \"b\"\n", "directive '%override'");
    expect_error("start: %json {\"type\": \"integer\"}\n", "%json");
    expect_error("start: <|end|>\n", "special tokens");
    expect_error("start: @sub\n", "grammar references");
    expect_error("start: A & B\nA: \"a\"\nB: \"b\"\n", "'&'");
    expect_error("start: A\nA: \"a\" b\nb: \"b\"\n", "terminal 'A' refers to rule 'b'");
    expect_error("start: \"a\"\n%import foo.BAR\n", "other than from 'common'");
    expect_error("start: X\n%import common.NOPE -> X\n", "'common.NOPE', which is not among");
    expect_error("start: \"a\" \"b\"?????????\n", "over 8 operators");
    expect_error("\n\nstart: \"a\" $\n", "line 3, column 12");
    char deep[512];
    strcpy(deep, "start: ");
    memset(deep + 7, '(', 200);
    strcpy(deep + 207, "\"a\"");
    memset(deep + 210, ')', 200);
    strcpy(deep + 410, "\n");
    expect_error(deep, "nested too deep");
}

/* Codex's apply_patch tool (openai/codex, codex-rs/core/src/tool_apply_patch.lark). */
static const char APPLY_PATCH[] = "start: begin_patch hunk+ end_patch\n"
                                  "begin_patch: \"*** Begin Patch\" LF\n"
                                  "end_patch: \"*** End Patch\" LF?\n"
                                  "\n"
                                  "hunk: add_hunk | delete_hunk | update_hunk\n"
                                  "add_hunk: \"*** Add File: \" filename LF add_line+\n"
                                  "delete_hunk: \"*** Delete File: \" filename LF\n"
                                  "update_hunk: \"*** Update File: \" filename LF change_move? change?\n"
                                  "\n"
                                  "filename: /(.+)/\n"
                                  "add_line: \"+\" /(.*)/ LF -> line\n"
                                  "\n"
                                  "change_move: \"*** Move to: \" filename LF\n"
                                  "change: (change_context | change_line)+ eof_line?\n"
                                  "change_context: (\"@@\" | \"@@ \" /(.+)/) LF\n"
                                  "change_line: (\"+\" | \"-\" | \" \") /(.*)/ LF\n"
                                  "eof_line: \"*** End of File\" LF\n"
                                  "\n"
                                  "%import common.LF\n";

static const char PATCH[] = "*** Begin Patch\n"
                            "*** Add File: docs/hello.md\n"
                            "+# Hello\n"
                            "+\n"
                            "+Say \"hi\" to C:\\temp.\n"
                            "*** Update File: src/main.c\n"
                            "*** Move to: src/app.c\n"
                            "@@ int main(void) {\n"
                            "-    puts(\"old\");\n"
                            "+    puts(\"new\\tone\");\n"
                            "     return 0;\n"
                            "*** End of File\n"
                            "*** Delete File: old.txt\n"
                            "*** End Patch\n";

static void test_apply_patch(void **st) {
    (void)st;
    osp_grammar_vocab *v = byte_vocab();
    osp_grammar *g = compile(APPLY_PATCH);
    assert_true(takes(g, v, PATCH));
    assert_true(takes(g, v, "*** Begin Patch\n*** Delete File: a\n*** End Patch"));
    assert_false(takes(g, v, "*** Begin Patch\n*** End Patch\n"));                         /* no hunk */
    assert_false(takes(g, v, "*** Begin Patch\n*** Add File: a\n*** End Patch\n"));        /* no line added */
    assert_false(takes(g, v, "*** Begin Patch\n*** Update File: a\n?x\n*** End Patch\n")); /* not a change line */
    assert_false(takes(g, v, "*** Begin Patch\n*** Delete File: \n*** End Patch\n"));      /* no file name */
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

/* s as the body of a JSON string. */
static char *json_escape(const char *s) {
    char *o = malloc(strlen(s) * 6 + 1), *q = o;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') *q++ = '\\', *q++ = (char)c;
        else if (c == '\n') *q++ = '\\', *q++ = 'n';
        else if (c == '\t') *q++ = '\\', *q++ = 't';
        else if (c < 0x20) q += sprintf(q, "\\u%04x", c);
        else *q++ = (char)c;
    }
    *q = 0;
    return o;
}

static void test_json_string(void **st) {
    (void)st;
    osp_grammar_vocab *v = byte_vocab();
    osp_grammar *g = compile_f(APPLY_PATCH, OSP_GRAMMAR_JSON_STRING);
    char *e = json_escape(PATCH);
    assert_true(takes(g, v, e));         /* the patch as it travels in a tool call's JSON */
    assert_false(takes(g, v, PATCH));    /* raw newlines and quotes cannot stand in a JSON string */
    char *bad = json_escape("*** Begin Patch\n*** Update File: a\n?x\n*** End Patch\n");
    assert_false(takes(g, v, bad));      /* the escaped spelling of a text outside the language */
    free(e), free(bad);
    osp_grammar_free(g);
    /* the JSON spelling: \" \\, / or \/, \n, and \u00XX for a control character without a short escape */
    g = compile_f("start: \"q\\\"b\\\\s/n\\n\" /[\\x01]/\n", OSP_GRAMMAR_JSON_STRING);
    assert_true(takes(g, v, "q\\\"b\\\\s/n\\n\\u0001"));
    assert_true(takes(g, v, "q\\\"b\\\\s\\/n\\n\\u0001"));
    assert_false(takes(g, v, "q\"b\\\\s/n\\n\\u0001"));
    assert_false(takes(g, v, "q\\\"b\\s/n\\n\\u0001"));
    assert_false(takes(g, v, "q\\\"b\\\\s/n\\n\x01"));
    osp_grammar_free(g);
    /* a regex format, anchors and all */
    osp_grammar *r = NULL;
    const char *re = "^say \"[a-z]+\"$";
    assert_int_equal(osp_grammar_from_regex_flags(re, strlen(re), OSP_GRAMMAR_JSON_STRING, &r), OSP_OK);
    assert_true(takes(r, v, "say \\\"hi\\\""));
    assert_false(takes(r, v, "say \"hi\""));
    assert_false(takes(r, v, "say \\\"Hi\\\""));
    osp_grammar_free(r);
    /* splice into a tool call: literal text around the JSON string's body */
    osp_grammar_part part = {.prefix = "{\"name\": \"add\", \"arguments\": {\"input\": \"",
                             .suffix = "\"}}",
                             .syntax = OSP_GRAMMAR_LARK,
                             .grammar = "start: \"add \" NUMBER \" \" NUMBER\n%import common.NUMBER\n"};
    part.grammar_len = strlen(part.grammar);
    assert_int_equal(osp_grammar_from_parts(&part, 1, &g), OSP_OK);
    assert_true(takes(g, v, "{\"name\": \"add\", \"arguments\": {\"input\": \"add 2 3.5\"}}"));
    assert_false(takes(g, v, "{\"name\": \"add\", \"arguments\": {\"input\": \"add 2\"}}"));
    osp_grammar_free(g);
    part.grammar = "start: (";
    part.grammar_len = strlen(part.grammar);
    assert_int_not_equal(osp_grammar_from_parts(&part, 1, &g), OSP_OK);
    osp_grammar_vocab_free(v);
}

/* Tokens of many bytes across the JSON string's edges: a text split greedily into them passes token by token,
 * the fast mask equal to its reference walk at each step. */
static void test_json_tokens(void **st) {
    (void)st;
    static const char *const multi[] = {"\\\"", "\"}}", "\\n", "say", " \\\"", "\\\"\\n\"}}", "{\"input\": \"",
                                        "hi", "\\\"h", "\"}", "ay \\\""};
    enum { NM = sizeof multi / sizeof *multi, NT = 256 + NM + 1 };
    static char bytes[256][1];
    const char *p[NT];
    uint32_t lens[NT];
    for (int b = 0; b < 256; b++) bytes[b][0] = (char)b, p[b] = bytes[b], lens[b] = 1;
    for (int k = 0; k < NM; k++) p[256 + k] = multi[k], lens[256 + k] = (uint32_t)strlen(multi[k]);
    p[NT - 1] = NULL, lens[NT - 1] = 0;
    osp_grammar_vocab *v;
    assert_int_equal(osp_grammar_vocab_new(NT, p, lens, NT - 1, &v), OSP_OK);
    osp_grammar_part part = {.prefix = "{\"name\": \"say\", \"arguments\": {\"input\": \"", .suffix = "\"}}",
                             .syntax = OSP_GRAMMAR_LARK,
                             .grammar = "start: \"say \\\"\" LCASE_LETTER~1..6 \"\\\"\\n\"\n%import common.LCASE_LETTER\n"};
    part.grammar_len = strlen(part.grammar);
    osp_grammar *g;
    assert_int_equal(osp_grammar_from_parts(&part, 1, &g), OSP_OK);
    const char *text = "{\"name\": \"say\", \"arguments\": {\"input\": \"say \\\"hi\\\"\\n\"}}";
    osp_grammar_matcher *m;
    assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
    uint32_t a[(NT + 31) / 32], b[(NT + 31) / 32];
    int n_multi = 0;
    for (size_t i = 0, n = strlen(text); i < n;) {
        int32_t t = (uint8_t)text[i];
        for (int k = 0; k < NM; k++)
            if (lens[256 + k] > lens[t] && !strncmp(text + i, multi[k], lens[256 + k])) t = 256 + k;
        osp_grammar_matcher_mask(m, a);
        osp_grammar_matcher_mask_reference(m, b);
        assert_memory_equal(a, b, sizeof a);
        assert_true((a[t / 32] >> (t % 32)) & 1);
        assert_false((a[(NT - 1) / 32] >> ((NT - 1) % 32)) & 1); /* no end before the call closes */
        assert_int_equal(osp_grammar_matcher_commit(m, t), 1);
        n_multi += t >= 256;
        i += lens[t];
    }
    assert_true(n_multi >= 4);
    assert_true(osp_grammar_matcher_accepting(m));
    osp_grammar_matcher_free(m);
    /* the same text with a raw quote inside the string is refused at that quote */
    assert_int_equal(osp_grammar_matcher_new(g, v, &m), OSP_OK);
    const char *raw = "{\"name\": \"say\", \"arguments\": {\"input\": \"say \"";
    assert_int_equal(osp_grammar_matcher_commit_bytes(m, raw, strlen(raw) - 1), 1);
    assert_int_equal(osp_grammar_matcher_commit_bytes(m, "\"", 1), 0);
    osp_grammar_matcher_free(m);
    osp_grammar_free(g);
    osp_grammar_vocab_free(v);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_syntax), cmocka_unit_test(test_common),
                                       cmocka_unit_test(test_errors), cmocka_unit_test(test_apply_patch),
                                       cmocka_unit_test(test_json_string), cmocka_unit_test(test_json_tokens)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
