/* The Jinja engine (text/jinja) against Python jinja2 3.1 configured as
 * Hugging Face configures it (ImmutableSandboxedEnvironment, trim_blocks,
 * lstrip_blocks, loopcontrols, HF's tojson, strftime_now at 2026-12-02).
 * Every expected string in the CASES_* tables is what jinja2 printed for
 * that template with the variables in VARS; then the errors and limits:
 * syntax errors name the line, unknown filters/tests are named,
 * raise_exception's message is passed through, runaway templates stop
 * quickly with an error, and templates cannot load other templates. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "text/jinja.h"

typedef struct jcase {
    const char *tmpl, *want;
} jcase;

static const char *VARS =
    "{\"messages\": [{\"role\": \"system\", \"content\": \"sys\"}, {\"role\": \"user\", \"content\": \"hi\"},"
    " {\"role\": \"assistant\", \"content\": \"yo\", \"tool_calls\": [{\"function\": {\"name\": \"f\","
    " \"arguments\": {\"b\": 1, \"a\": [1, 2.5, null, true]}}}]}]}";

static struct tm fixed_now(void) {
    struct tm tm;
    memset(&tm, 0, sizeof tm);
    tm.tm_year = 2026 - 1900;
    tm.tm_mon = 11;
    tm.tm_mday = 2;
    tm.tm_isdst = -1;
    mktime(&tm); /* fills in the weekday */
    return tm;
}

/* Render; returns the status, *out (malloc'd by osp_malloc) on success. */
static osp_status render_opts(const char *tmpl, const char *vars, const osp_jinja_options *opt, char **out,
                              size_t *len) {
    osp_jinja_template *t;
    *out = NULL;
    osp_status st = osp_jinja_parse(tmpl, strlen(tmpl), &t);
    if (st != OSP_OK) return st;
    json_error_t e;
    json_t *v = vars ? json_loads(vars, 0, &e) : NULL;
    st = osp_jinja_render(t, v, opt, out, len);
    json_decref(v);
    osp_jinja_free(t);
    return st;
}

static osp_status render(const char *tmpl, const char *vars, char **out, size_t *len) {
    struct tm now = fixed_now();
    osp_jinja_options o = {0};
    o.now = &now;
    return render_opts(tmpl, vars, &o, out, len);
}

static void run_cases(const jcase *cases, size_t n) {
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        char *out;
        size_t len;
        osp_status st = render(cases[i].tmpl, VARS, &out, &len);
        if (st != OSP_OK) {
            print_error("case %zu %s\n  error: %s\n", i, cases[i].tmpl, osp_last_error());
            failures++;
            continue;
        }
        if (len != strlen(cases[i].want) || memcmp(out, cases[i].want, len)) {
            print_error("case %zu %s\n  want: [%s]\n  got:  [%.*s]\n", i, cases[i].tmpl, cases[i].want, (int)len, out);
            failures++;
        }
        osp_free(out);
    }
    assert_int_equal(failures, 0);
}

#define RUN(table) run_cases(table, sizeof table / sizeof *table)

/* ---- cases: generated with Python jinja2 3.1 (HF environment) ---- */
static const jcase CASES_WHITESPACE[] = {
    {"hello\n",
     "hello"},
    {"hello\n\n",
     "hello\n"},
    {"a\r\nb\rc\n",
     "a\nb\nc"},
    {"{% if true %}\n  x\n{% endif %}\n",
     "  x\n"},
    {"  {% if true %}\nx\n  {% endif %}\ny",
     "x\ny"},
    {"{% if true -%}\n   x  \n  {%- endif %}|",
     "x|"},
    {"a  {{- 'b' -}}  c",
     "abc"},
    {"  {{ 'x' }}\n",
     "  x"},
    {"{%+ if true %}x{% endif %}",
     "x"},
    {"  {%+ if true %}x{% endif %}",
     "  x"},
    {"{% if true +%}\nx{% endif %}",
     "\nx"},
    {"x {# c #}\ny",
     "x y"},
    {"  {# c #}\ny",
     "y"},
    {"{#- c -#}  y",
     "y"},
    {"a\n  {# c\nmulti #}\nb",
     "a\nb"},
    {"{% raw %}{{ x }}{% endraw %}",
     "{{ x }}"},
    {"  {% raw %}\n{{x}}\n  {% endraw %}\nz",
     "\n{{x}}\nz"},
    {"{% for i in range(3) %}\n  {{ i }}\n{% endfor %}\n",
     "  0\n  1\n  2\n"},
    {"a\n{% if true %}\nb\n{% endif %}\nc\n",
     "a\nb\nc"},
    {"a\n  {% if true %}\n  b\n  {% endif %}\nc",
     "a\n  b\nc"},
    {"\t{% if true %}\tb{% endif %}",
     "\tb"},
    {"x\t {% if true %}y{% endif %}",
     "x\t y"},
    {"a\n\302\240\343\200\200{% if true %}b{% endif %}",
     "a\nb"},
    {"{% if true %}\r\nb\r\n{% endif %}\r\n",
     "b\n"},
    {"a {%- if true %} b {% endif -%} c",
     "a b c"},
    {"{% for i in [1,2] -%}\n{{ i }}\n{%- endfor %}",
     "12"},
    {"{{ 'a' -}}\n\n  {{ 'b' }}",
     "ab"},
    {"{#- comment -#}\n  x",
     "x"},
    {"{# a #}{# b #}\n\n",
     ""},
    {"x\n{# c #}   \ny",
     "x\n   \ny"},
    {"{% raw -%}  a  {%- endraw %}",
     "a"},
    {"{%- raw %} a {% endraw -%} b",
     " a b"},
    {"{{ '}}' }}{{ {'a': {'b': 1}} }}",
     "}}{'a': {'b': 1}}"},
    {"{% set x = [\n  1,\n  2\n] %}{{ x }}",
     "[1, 2]"},
    {"{%- for m in messages -%}\n  {{- m.role }}: {{ m.content -}}\n{%- endfor %}",
     "system: sysuser: hiassistant: yo"},
};
static const jcase CASES_CONTROL[] = {
    {"{% for i in range(3) %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
     "1032TrueFalse3;2121FalseFalse3;3210FalseTrue3;"},
    {"{% for i in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }}|{% endfor %}",
     "-2|1-3|2-|"},
    {"{% for i in [1,2,3] %}{{ loop.cycle('a','b') }}{% endfor %}",
     "aba"},
    {"{% for i in range(3) %}{{ loop.changed(i // 2) }}{% endfor %}",
     "TrueFalseTrue"},
    {"{% for i in [] %}x{% else %}empty{% endfor %}",
     "empty"},
    {"{% for i in [1,2,3,4] if i is even %}{{i}}{{loop.length}}{% endfor %}",
     "2242"},
    {"{% for k, v in {'a':1,'b':2}.items() %}{{k}}={{v}};{% endfor %}",
     "a=1;b=2;"},
    {"{% for k in {'a':1,'b':2} %}{{k}}{% endfor %}",
     "ab"},
    {"{% for c in 'h\303\251llo' %}[{{c}}]{% endfor %}",
     "[h][\303\251][l][l][o]"},
    {"{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{i}}{% endfor %}",
     "0134"},
    {"{% for x in [1,2] %}{% for y in [1,2] %}{% if y == 2 %}{% break %}{% endif %}{{ x }}{{ y }}{% endfor %}{% endfor %}",
     "1121"},
    {"{% for a, b in [[1,2],[3,4]] %}{{a+b}}{% endfor %}",
     "37"},
    {"{% for x in undefined_thing %}x{% else %}empty{% endfor %}",
     "empty"},
    {"{% if x is defined %}a{% elif y is defined %}b{% elif true %}c{% else %}d{% endif %}",
     "c"},
    {"{% if 0 %}{% elif '' %}{% else %}else{% endif %}",
     "else"},
    {"{% set x = 1 %}{% set y, z = 2, 3 %}{{ x }}{{ y }}{{ z }}",
     "123"},
    {"{% set ns = namespace(a=1) %}{% for i in range(3) %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}",
     "4"},
    {"{% set x %}  block {{ 1 }} {% endset %}[{{ x }}]",
     "[  block 1 ]"},
    {"{% set x | upper %}abc{% endset %}{{ x }}",
     "ABC"},
    {"{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}",
     "1"},
    {"{% set x = 1 %}{% if true %}{% set x = 2 %}{% endif %}{{ x }}",
     "2"},
    {"{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}[{{x}}]{% endfor %}{{x}}",
     "[5][1][5][2]5"},
    {"{% for i in [1,2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}",
     "[]"},
    {"{% for x in [] %}{% else %}{% set y = 1 %}{% endfor %}{{ y }}|",
     "|"},
    {"{% set ns = namespace() %}{% set ns.x = 5 %}{{ ns.x }}{{ ns.y is defined }}",
     "5False"},
    {"{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}{{ a }}",
     "3"},
    {"{% filter upper %}abc {{ 'd' }}{% endfilter %}",
     "ABC D"},
    {"{% print 'p', 1 %}",
     "p1"},
    {"{% macro m(a, b=2, c='x') %}{{a}}{{b}}{{c}}{% endmacro %}{{ m(1) }}|{{ m(1, 3) }}|{{ m(1, c='z') }}|{{ m(a=5) }}",
     "12x|13x|12z|52x"},
    {"{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(5) }}",
     "54321"},
    {"{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1,2,x=3) }}",
     "(1, 2){'x': 3}"},
    {"{% macro m(a) %}[{{ a }}]{% endmacro %}{{ m() }}{{ m|string }}",
     "[]<Macro 'm'>"},
    {"{% macro outer() %}{{ inner() }}{% endmacro %}{% macro inner() %}in{% endmacro %}{{ outer() }}",
     "in"},
    {"{% set x = 5 %}{% macro m() %}{{ x }}{% endmacro %}{% set x = 6 %}{{ m() }}",
     "6"},
    {"{% macro m() %}{% set y = 1 %}{{ y }}{% endmacro %}{{ m() }}{{ y }}",
     "1"},
    {"{% macro fmt(v, esc=True) %}{% if v is mapping %}{ {%- for k, x in v|dictsort %}{{ k }}:{{ fmt(x, esc=esc) }}{% endfor %}}{% else %}{{ v }}{% endif %}{% endmacro %}{{ fmt({'b': {'c': 1}, 'a': 2}) }}",
     "{a:2b:{c:1}}"},
};
static const jcase CASES_EXPRESSIONS[] = {
    {"{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7.5 % 2 }} {{ -7.5 // 2 }}",
     "7 9 64 4 3.5 3 -4 1 2 1.5 -4.0"},
    {"{{ 1 ~ 2 ~ 'a' }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ (1,) + (2,) }} {{ 'ab' * 3 }} {{ [0] * 3 }} {{ 3 * 'x' }}",
     "12a ab [1, 2] (1, 2) ababab [0, 0, 0] xxx"},
    {"{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 2 in [1,2] }} {{ 'k' in {'k':1} }}",
     "True False True True True True True"},
    {"{{ true and 'x' }} {{ false or 'y' }} {{ 0 or [] }} {{ not none }} {{ none and 1 }}",
     "x y [] True None"},
    {"{{ 'a' if true else 'b' }} {{ 'a' if false else 'b' }} [{{ 'a' if false }}] {{ 1 if 0 else 2 if 0 else 3 }}",
     "a b [] 3"},
    {"{{ not 1 == 2 }}{{ not (1 == 2) }}{{ - 1 + 2 }}{{ -(1+2) }}{{ +3 }}{{ 3 - -3 }}{{ 10 - 2 - 3 }}",
     "TrueTrue1-3365"},
    {"{{ {'a':1} == {'a':1} }}{{ {'a':1} == {'a':2} }}{{ [1,2] == (1,2) }}{{ (1,2) == (1,2) }}{{ 1 == true }}{{ '1' == 1 }}{{ none == false }}",
     "TrueFalseFalseTrueTrueFalseFalse"},
    {"{{ 'abc'[0] }}{{ 'abc'[-1] }}{{ 'abc'[1:] }}{{ 'abc'[:-1] }}{{ 'abc'[::-1] }}{{ 'abcdef'[::2] }}{{ 'abcdef'[-2:0:-2] }}{{ [1,2,3,4][1:3] }}{{ [1,2,3][::-1] }}{{ 'h\303\251llo w\303\266rld'[3:8] }}",
     "acbcabcbaaceec[2, 3][3, 2, 1]lo w\303\266"},
    {"{{ [1,2,3][5] }}|{{ 'abc'[10] }}|{{ {}['x'] }}|{{ none.x }}|{{ none['x'] }}|{{ 'abc'.nosuch is defined }}",
     "|||||False"},
    {"{{ (1,2)[0] }}{{ [[1,2]][0][1] }}{{ {'a':{'b':2}}.a.b }}{{ {'a':[5]}['a'][0] }}{{ [1,2].0 }}",
     "12251"},
    {"{{ {'a': 1}['a'] }}{{ {'a': 1}.a }}{{ {'items': 1}['items'] }}{{ {'get': 5}.get('get') }}",
     "1115"},
    {"{{ 'a\303\251\360\237\230\200'|list }}{{ 'a\303\251\360\237\230\200'[2] }}{{ 'a\303\251\360\237\230\200'[-2:] }}{{ 'a\303\251\360\237\230\200'|length }}{{ 'a\303\251\360\237\230\200'|reverse }}{{ 'a\303\251\360\237\230\200'.find('\360\237\230\200') }}",
     "['a', '\303\251', '\360\237\230\200']\360\237\230\200\303\251\360\237\230\200""3\360\237\230\200\303\251a2"},
    {"{{ '%05.1f|%-4d|%x|%s|%r|%%|%c' % (3.14159, 5, 255, none, 'q', 65) }}{{ '%(a)s-%(b)03d' % {'a':'x','b':7} }}",
     "003.1|5   |ff|None|'q'|%|Ax-007"},
    {"{{ messages[0].role }}{{ messages|length }}{{ messages[-1].tool_calls[0].function.arguments|tojson }}{{ messages[1:]|map(attribute='role')|join(',') }}",
     "system3{\"b\": 1, \"a\": [1, 2.5, null, true]}user,assistant"},
    {"{% for m in messages if m.role != 'system' %}{{ loop.index }}{{ m.role }}{% endfor %}{{ messages[5] is defined }}{{ messages[0].nothere is defined }}",
     "1user2assistantFalseFalse"},
};
static const jcase CASES_LITERALS[] = {
    {"{{ none }} {{ true }} {{ false }} {{ True }} {{ None }} {{ 1.0 }} {{ 1.5e3 }} {{ 1e-7 }} {{ 1e22 }} {{ 0.1 }} {{ 1_000 }} {{ 0x1F }} {{ 0o17 }} {{ 0b101 }}",
     "None True False True None 1.0 1500.0 1e-07 1e+22 0.1 1000 31 15 5"},
    {"{{ [1, 'a', none, true, 1.5, [2], {'k': 'v'}, (1,), ()] }}",
     "[1, 'a', None, True, 1.5, [2], {'k': 'v'}, (1,), ()]"},
    {"{{ {'a': {'b': [1, \"it's\"]}} }}",
     "{'a': {'b': [1, \"it's\"]}}"},
    {"{{ \"a\\\"b\" }} {{ [\"a\\\"b\", \"x'y\", \"q\\\\\"] }}",
     "a\"b ['a\"b', \"x'y\", 'q\\\\']"},
    {"{{ 'tab\\there' }}|{{ 'nl\\nx' }}|{{ '\\x41\\u00e9\\U0001F600' }}|{{ '\\101' }}|{{ '\\q' }}",
     "tab\there|nl\nx|A\303\251\360\237\230\200|A|\\q"},
    {"{{ ['\\n', '\\t', '\\x01', '\\x7f', '\303\251', '\\u200b', '\\u00a0'] }}",
     "['\\n', '\\t', '\\x01', '\\x7f', '\303\251', '\\u200b', '\\xa0']"},
    {"{{ 'a' 'b' \"c\" }}{{ 1, 2 }}{{ [1,2,3,] }}{{ {'a':1,} }}",
     "abc(1, 2)[1, 2, 3]{'a': 1}"},
    {"{{ 'a' ~ none ~ 1.5 ~ true ~ [1] }}",
     "aNone1.5True[1]"},
    {"{{ 0.1 + 0.2 }} {{ 1/3 }} {{ 100.0 }} {{ 1e16 }} {{ 1e15 }} {{ 123456789.123456789 }} {{ 0.0001 }} {{ 0.00001 }} {{ -1.5e-10 }} {{ -0.0 }} {{ 1e308 * 10 }}",
     "0.30000000000000004 0.3333333333333333 100.0 1e+16 1000000000000000.0 123456789.12345679 0.0001 1e-05 -1.5e-10 -0.0 inf"},
    {"{{ messages[2] }}",
     "{'role': 'assistant', 'content': 'yo', 'tool_calls': [{'function': {'name': 'f', 'arguments': {'b': 1, 'a': [1, 2.5, None, True]}}}]}"},
};
static const jcase CASES_FILTERS[] = {
    {"{{ ' x '|trim }}|{{ 'xxaxx'|trim('x') }}|{{ '\\u3000 a\\u00a0'|trim }}|{{ 'Ab'|upper }}{{ 'Ab'|lower }}|{{ 'hELLo wORLD'|capitalize }}|{{ 'hello wORLD-x y(z'|title }}",
     "x|a|a|ABab|Hello world|Hello World-X Y(Z"},
    {"{{ [1,2,3]|length }}{{ 'h\303\251llo'|length }}{{ {'a':1}|count }}{{ x|length }}",
     "3510"},
    {"{{ x|default('d') }}{{ ''|default('e', true) }}{{ 0|d('z', true) }}{{ 0|d('z') }}{{ none|default('n') }}",
     "dez0None"},
    {"{{ [1,2,3]|join(', ') }}|{{ [1,2]|join }}|{{ [{'a':1},{'a':2}]|join('-', attribute='a') }}|{{ 'abc'|join('.') }}",
     "1, 2, 3|12|1-2|a.b.c"},
    {"{{ [1,2,3]|first }}{{ [1,2,3]|last }}{{ 'abc'|first }}{{ 'abc'|last }}{{ []|first }}|{{ {'a':1,'b':2}|first }}",
     "13ac|a"},
    {"{{ ['a','b']|map('upper')|list }}{{ [{'n':1},{'n':2}]|map(attribute='n')|list }}{{ [{'n':1},{}]|map(attribute='n', default=9)|list }}{{ ['a','b']|map('replace', 'a', 'z')|join }}",
     "['A', 'B'][1, 2][1, 9]zb"},
    {"{{ [1,2,3,4]|select('odd')|list }}{{ [1,2,3,4]|reject('odd')|list }}{{ [0,1,'',none,'a']|select|list }}{{ [1,5,10]|select('gt', 4)|list }}{{ [1,5,10]|select('divisibleby', 5)|list }}",
     "[1, 3][2, 4][1, 'a'][5, 10][5, 10]"},
    {"{{ [{'r':'a','x':1},{'r':'b'}]|selectattr('r','equalto','a')|list }}{{ [{'r':'a','x':1},{'r':'b'}]|rejectattr('x')|list }}{{ [{'r':'a','x':1},{'r':'b'}]|selectattr('x','defined')|list }}",
     "[{'r': 'a', 'x': 1}][{'r': 'b'}][{'r': 'a', 'x': 1}]"},
    {"{{ {'b':1,'A':2,'a':3,'c':0}|dictsort }}{{ {'b':1,'A':2}|dictsort(true) }}{{ {'b':1,'a':2}|dictsort(by='value') }}{{ {'b':1,'a':2}|dictsort(reverse=true) }}",
     "[('A', 2), ('a', 3), ('b', 1), ('c', 0)][('A', 2), ('b', 1)][('b', 1), ('a', 2)][('b', 1), ('a', 2)]"},
    {"{{ {'a':1,'b':2}|items|list }}{{ x|items|list }}{{ 'aXbX'|replace('X','-') }}{{ 'aaa'|replace('a','b',2) }}{{ 'abc'|replace('','-') }}",
     "[('a', 1), ('b', 2)][]a-b-bba-a-b-c-"},
    {"{{ 42|string }}{{ none|string }}{{ [1]|string }}{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(5) }} {{ 3.9|int }} {{ '0x1A'|int(0,16) }} {{ ' 7 '|int }} {{ '1_000'|int }} {{ true|int }}",
     "42None[1]42 42 0 5 3 26 7 1000 1"},
    {"{{ '3.5'|float }} {{ 'x'|float }} {{ 2|float }} {{ '1e3'|float }} {{ ' 2.5 '|float }} {{ 'inf'|float }}",
     "3.5 0.0 2.0 1000.0 2.5 inf"},
    {"{{ '<b>'|safe }}{{ '<b>&\"\\''|e }}{{ '<b>'|escape|escape }}{{ none|e }}{{ '<b>'|forceescape }}{{ ('<i>'|safe) + '<' }}",
     "<b>&lt;b&gt;&amp;&#34;&#39;&lt;b&gt;None&lt;b&gt;<i>&lt;"},
    {"{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2, blank=true) }}|{{ 'a\\nb'|indent('> ') }}",
     "a\n    b\n\n    c|  a\n  b|a\n  \n  b|a\n> b"},
    {"{{ -3|abs }}{{ -2.5|abs }}{{ 2.5|round }}{{ 3.5|round }}{{ 2.675|round(2) }}{{ 2.1|round(0,'ceil') }}{{ 2.9|round(method='floor') }}{{ 5|round }}{{ 1234|round(-2) }}",
     "32.52.04.02.673.02.051200"},
    {"{{ [3,1,2,1]|unique|list }}{{ ['a','A','b']|unique|list }}{{ [1,2,3]|reverse|list }}{{ 'abc'|reverse }}{{ [3,1,2]|sort }}{{ [3,1,2]|sort(reverse=true) }}{{ ['b','A','a']|sort }}{{ [{'n':2},{'n':1}]|sort(attribute='n') }}",
     "[3, 1, 2]['a', 'b'][3, 2, 1]cba[1, 2, 3][3, 2, 1]['A', 'a', 'b'][{'n': 1}, {'n': 2}]"},
    {"{{ [1,2,3]|sum }}{{ [{'n':2},{'n':1}]|sum(attribute='n') }}{{ [1,2]|sum(start=10) }}{{ [3,1,2]|min }}{{ [3,1,2]|max }}{{ ['b','A']|min }}",
     "631313A"},
    {"{{ [1,2,3,4,5]|batch(2)|list }}{{ [1,2,3]|batch(2, 0)|list }}{{ 'a b  c'|wordcount }}{{ '%s=%d'|format('a', 3) }}{{ 'x'|center(5) }}",
     "[[1, 2], [3, 4], [5]][[1, 2], [3, 0]]3a=3  x  "},
    {"{{ {'a':1,'b':[1,2,{'c':None}],'\303\251':'\303\274\\n\"'}|tojson }}",
     "{\"a\": 1, \"b\": [1, 2, {\"c\": null}], \"\303\251\": \"\303\274\\n\\\"\"}"},
    {"{{ {'a':1,'b':[1,2]}|tojson(indent=2) }}",
     "{\n  \"a\": 1,\n  \"b\": [\n    1,\n    2\n  ]\n}"},
    {"{{ [1,{'a':[]},{}]|tojson(indent=1) }}",
     "[\n 1,\n {\n  \"a\": []\n },\n {}\n]"},
    {"{{ {'b':1,'a':2}|tojson(sort_keys=true) }}{{ '\303\251'|tojson(ensure_ascii=true) }}{{ '\360\237\230\200'|tojson(true) }}{{ [1.0, 0.1, 1e20, -0.0, 3]|tojson }}{{ {'a': 1}|tojson(separators=(',', ':')) }}",
     "{\"a\": 2, \"b\": 1}\"\\u00e9\"\"\\ud83d\\ude00\"[1.0, 0.1, 1e+20, -0.0, 3]{\"a\":1}"},
    {"{{ {1: 'a', true: 'b', none: 'c', 1.5: 'd'}|tojson }}{{ (1,2)|tojson }}{{ '\\u0000\\x1f\\x7f\342\200\250'|tojson }}{{ '</script>&'|tojson }}",
     "{\"1\": \"b\", \"null\": \"c\", \"1.5\": \"d\"}[1, 2]\"\\u0000\\u001f\177\342\200\250\"\"</script>&\""},
    {"{{ undefined_thing|list }}{{ undefined_thing|join }}{{ undefined_thing|upper }}{{ undefined_thing|trim }}{{ undefined_thing|string }}{{ undefined_thing|first }}",
     "[]"},
    {"{{ '\303\251'|upper }}{{ '\303\237'|upper }}{{ '\303\211COLE'|lower }}{{ '\316\243\316\221\316\243'|lower }}{{ '\357\254\201x'|upper }}{{ 'hello w\303\266rld'|title }}",
     "\303\211SS\303\251cole\317\203\316\261\317\202FIXHello W\303\266rld"},
    {"{{ [[1,'b'],[0,'a']]|sort }}{{ [{'a':{'b':2}},{'a':{'b':1}}]|sort(attribute='a.b')|map(attribute='a.b')|list }}{{ [[1,2],[3,4]]|map(attribute='1')|list }}",
     "[[0, 'a'], [1, 'b']][1, 2][2, 4]"},
};
static const jcase CASES_TESTS[] = {
    {"{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 'a' is string }}{{ 1 is number }}{{ 1.0 is float }}{{ 1 is integer }}{{ true is boolean }}{{ none is none }}{{ {} is mapping }}{{ [] is sequence }}{{ 'a' is sequence }}{{ 1 is iterable }}",
     "TrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrueTrueFalse"},
    {"{{ true is true }}{{ 1 is true }}{{ false is false }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ 1 is eq 1 }}{{ 1 is equalto 2 }}{{ 2 is gt 1 }}{{ 2 is ge 2 }}{{ 1 is lt 2 }}{{ 1 is in [1] }}{{ none is sameas none }}{{ range is callable }}{{ 'upper' is filter }}{{ 'odd' is test }}",
     "TrueFalseTrueTrueTrueTrueFalseTrueTrueTrueTrueTrueTrueTrueTrue"},
    {"{{ x is defined }}{{ x is undefined }}{{ x is not defined }}{{ 1 is not string }}{{ true is number }}{{ true is integer }}{{ {} is sequence }}{{ undefined_thing is sequence }}{{ 'x' is iterable }}{{ 'x' is callable }}",
     "FalseTrueTrueTrueTrueFalseTrueTrueTrueFalse"},
};
static const jcase CASES_METHODS[] = {
    {"{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(none, 1) }}{{ 'a,b,c'.rsplit(',', 1) }}{{ ' a b '.rsplit() }}{{ 'a  b c '.rsplit(None, 1) }}{{ 'a,b'.split(',', maxsplit=0) }}",
     "['a', 'b', '', 'c']['a', 'b']['a', 'b c']['a,b', 'c']['a', 'b']['a  b', 'c']['a,b']"},
    {"{{ '  x  '.strip() }}|{{ 'xxyxx'.strip('x') }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'x\\n\\n'.rstrip('\\n') }}|{{ 'abc'.startswith('a') }}{{ 'abc'.endswith(('x','c')) }}{{ 'abc'.startswith('b', 1) }}",
     "x|y|x\n|x|TrueTrueTrue"},
    {"{{ 'Hello'.upper() }}{{ 'Hello'.lower() }}{{ 'hello world'.title() }}{{ \"they're bill's\".title() }}{{ 'hELLO'.capitalize() }}{{ 'aXa'.replace('a','b') }}{{ 'abcabc'.find('c') }}{{ 'abc'.find('z') }}{{ 'abcabc'.rfind('b') }}{{ 'aaa'.count('a') }}",
     "HELLOhelloHello WorldThey'Re Bill'SHellobXb2-143"},
    {"{{ ', '.join(['a','b']) }}{{ '-'.join('abc') }}{{ 'a\\nb\\r\\nc'.splitlines() }}{{ ' \\t'.isspace() }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}{{ 'AB'.isupper() }}{{ 'ab1'.islower() }}",
     "a, ba-b-c['a', 'b', 'c']TrueTrueTrueTrueTrue"},
    {"{{ 'x'.center(5, '*') }}{{ 'x'.ljust(3,'.') }}{{ 'x'.rjust(3) }}{{ '-5'.zfill(4) }}{{ '{} and {}'.format(1, 'b') }}{{ '{0}{name}'.format(1, name='n') }}{{ 'prefix_x'.removeprefix('prefix_') }}",
     "**x**x..  x-0051 and b1nx"},
    {"{{ {'a':1}.get('a') }}{{ {'a':1}.get('b') }}{{ {'a':1}.get('b', 2) }}{{ {'a':1,'b':2}.keys()|list }}{{ {'a':1,'b':2}.values()|list }}{{ {'a':1}.items()|list }}{{ [1,2,1].count(1) }}{{ [1,2].index(2) }}",
     "1None2['a', 'b'][1, 2][('a', 1)]21"},
    {"{{ [].append }}|{{ 'x'.split('x')|length }}",
     "|2"},
};
static const jcase CASES_GLOBALS[] = {
    {"{{ range(5)|list }}{{ range(1,10,3)|list }}{{ range(5,0,-2)|list }}{{ dict(a=1, b=2) }}{{ dict({'x':1}, y=2) }}{{ namespace(a=1).a }}",
     "[0, 1, 2, 3, 4][1, 4, 7][5, 3, 1]{'a': 1, 'b': 2}{'x': 1, 'y': 2}1"},
    {"{{ strftime_now('%Y-%m-%d %A %b') }}",
     "2026-12-02 Wednesday Dec"},
    {"{{ strftime_now('%d %B %Y') }}",
     "02 December 2026"},
};

static void test_whitespace(void **s) { (void)s; RUN(CASES_WHITESPACE); }
static void test_control(void **s) { (void)s; RUN(CASES_CONTROL); }
static void test_expressions(void **s) { (void)s; RUN(CASES_EXPRESSIONS); }
static void test_literals(void **s) { (void)s; RUN(CASES_LITERALS); }
static void test_filters(void **s) { (void)s; RUN(CASES_FILTERS); }
static void test_tests(void **s) { (void)s; RUN(CASES_TESTS); }
static void test_methods(void **s) { (void)s; RUN(CASES_METHODS); }
static void test_globals(void **s) { (void)s; RUN(CASES_GLOBALS); }

/* ------------------------------------------------------------------ errors */

/* Fails with `code` and a message containing every needle. */
static void expect_error_opts(const char *tmpl, const osp_jinja_options *opt, osp_status code, const char *n1,
                              const char *n2) {
    char *out = NULL;
    size_t len;
    struct tm now = fixed_now();
    osp_jinja_options o = {0};
    if (opt) o = *opt;
    o.now = &now;
    osp_status st = render_opts(tmpl, VARS, &o, &out, &len);
    if (st == OSP_OK) fail_msg("expected an error for %.80s, got output [%.80s]", tmpl, out);
    if (st != code) fail_msg("%.80s: status %s, expected %s (%s)", tmpl, osp_status_name(st), osp_status_name(code), osp_last_error());
    if (n1 && !strstr(osp_last_error(), n1)) fail_msg("%.80s: message [%s] lacks [%s]", tmpl, osp_last_error(), n1);
    if (n2 && !strstr(osp_last_error(), n2)) fail_msg("%.80s: message [%s] lacks [%s]", tmpl, osp_last_error(), n2);
    assert_null(out);
}

static void expect_error(const char *tmpl, osp_status code, const char *n1, const char *n2) {
    expect_error_opts(tmpl, NULL, code, n1, n2);
}

static void test_syntax_errors(void **s) {
    (void)s;
    expect_error("line 1\nline 2\n{{ 1 +* 2 }}", OSP_ERR_FORMAT, "line 3", "unexpected '*'");
    expect_error("a\n{% if x %}\nb\n", OSP_ERR_FORMAT, "line 3", "'endif'");
    expect_error("{% for x in y %}{% endif %}", OSP_ERR_FORMAT, "line 1", "unknown tag 'endif'");
    expect_error("{% frobnicate %}", OSP_ERR_FORMAT, "unknown tag 'frobnicate'", NULL);
    expect_error("{{ 'abc }}", OSP_ERR_FORMAT, "line 1", "unterminated string");
    expect_error("\n\n{# never closed", OSP_ERR_FORMAT, "line 3", "comment");
    expect_error("{{ (1 }}", OSP_ERR_FORMAT, "expected ')'", NULL);
    expect_error("{% macro m(a=1, b) %}{% endmacro %}", OSP_ERR_FORMAT, "non-default argument", NULL);
    expect_error("{% break %}", OSP_ERR_FORMAT, "'break' outside", NULL);
    expect_error("{{ '\\x4' }}", OSP_ERR_FORMAT, "escape", NULL);
    expect_error("{{ '\\UDDDDDDDD' }}", OSP_ERR_FORMAT, "illegal Unicode", NULL); /* was an int overflow (fuzz_jinja) */
    expect_error("{{ x y }}", OSP_ERR_FORMAT, "got 'y'", NULL);
    /* a width or precision with more digits than int64 holds overflowed while parsed (fuzz_jinja) */
    expect_error("{{ '%99999999999999999999999d' % 1 }}", OSP_ERR_RANGE, "width too large", NULL);
    expect_error("{{ '%.99999999999999999999999f' % 1.5 }}", OSP_ERR_RANGE, "width too large", NULL);
    expect_error("\xff{{ x }}", OSP_ERR_FORMAT, "UTF-8", NULL);
}

static void test_unknown_filter_and_test(void **s) {
    (void)s;
    expect_error("\n{{ x | frobnicate }}", OSP_ERR_FORMAT, "No filter named 'frobnicate'", "line 2");
    expect_error("{{ x is frobbed }}", OSP_ERR_FORMAT, "No test named 'frobbed'", NULL);
    /* as in jinja2's compiler: inside an if or an inline if, only when it runs */
    expect_error("{% if true %}{{ x|nope }}{% endif %}", OSP_ERR_INVALID, "No filter named 'nope' found", NULL);
    expect_error("{{ 1 if x is nope else 2 }}", OSP_ERR_INVALID, "No test named 'nope' found", NULL);
    expect_error("{% if true %}{% for i in [1] %}{{ i|nope }}{% endfor %}{% endif %}", OSP_ERR_FORMAT,
                 "No filter named 'nope'.", NULL);
    char *out;
    size_t len;
    assert_int_equal(render("{% if false %}{{ x|nope }}{% endif %}ok", NULL, &out, &len), OSP_OK);
    assert_string_equal(out, "ok");
    osp_free(out);
    /* filter and test names given as strings are looked up when used */
    expect_error("{{ [1]|map('nope')|list }}", OSP_ERR_INVALID, "No filter named 'nope'", NULL);
    expect_error("{{ [1]|select('nope')|list }}", OSP_ERR_INVALID, "No test named 'nope'", NULL);
}

static void test_runtime_errors(void **s) {
    (void)s;
    /* raise_exception: the template's message, verbatim */
    char *out;
    size_t len;
    assert_int_equal(render("{{ raise_exception('Conversation roles must alternate user/assistant') }}", VARS, &out, &len),
                     OSP_ERR_INVALID);
    assert_string_equal(osp_last_error(), "Conversation roles must alternate user/assistant");
    expect_error("{{ nothere() }}", OSP_ERR_INVALID, "'nothere' is undefined", NULL);
    expect_error("\n\n{{ x.y }}", OSP_ERR_INVALID, "'x' is undefined", "line 3");
    expect_error("{{ x + 1 }}", OSP_ERR_INVALID, "'x' is undefined", NULL);
    expect_error("{{ 'a' + 1 }}", OSP_ERR_INVALID, "can only concatenate str (not \"int\") to str", NULL);
    expect_error("{{ 1 < 'a' }}", OSP_ERR_INVALID, "'<' not supported between instances of 'int' and 'str'", NULL);
    expect_error("{{ 1 / 0 }}", OSP_ERR_INVALID, "division by zero", NULL);
    expect_error("{{ 5|length }}", OSP_ERR_INVALID, "has no len()", NULL);
    expect_error("{% for x in none %}{% endfor %}", OSP_ERR_INVALID, "'NoneType' object is not iterable", NULL);
    expect_error("{{ messages|tojson }}{{ x|tojson }}", OSP_ERR_INVALID, "not JSON serializable", NULL);
    expect_error("{% set n = 1 %}{% set n.x = 2 %}", OSP_ERR_INVALID, "non-namespace", NULL);
    expect_error("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", OSP_ERR_INVALID, "takes not more than 1", NULL);
    expect_error("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", OSP_ERR_INVALID, "no keyword argument 'b'", NULL);
    expect_error("{{ 'abc'.nosuch() }}", OSP_ERR_INVALID, "has no attribute 'nosuch'", NULL);
    expect_error("{{ 5() }}", OSP_ERR_INVALID, "not callable", NULL);
    expect_error("{{ range(1000000)|length }}", OSP_ERR_RANGE, "MAX_RANGE", NULL);
}

static void test_sandbox(void **s) {
    (void)s;
    expect_error("{{ messages.append(1) }}", OSP_ERR_INVALID, "SecurityError", "'append' of 'list'");
    expect_error("{{ messages[0].update({}) }}", OSP_ERR_INVALID, "'update' of 'dict' object is unsafe", NULL);
    expect_error("{{ messages.pop() }}", OSP_ERR_INVALID, "unsafe", NULL);
    expect_error("{% include 'other.jinja' %}", OSP_ERR_FORMAT, "'include'", "cannot load");
    expect_error("{% extends 'base.jinja' %}", OSP_ERR_FORMAT, "'extends'", NULL);
    expect_error("{% import 'm.jinja' as m %}", OSP_ERR_FORMAT, "'import'", NULL);
    expect_error("{% from 'm.jinja' import x %}", OSP_ERR_FORMAT, "'from'", NULL);
    expect_error("{{ messages.__class__ }}{{ ''.__class__.__mro__ }}", OSP_ERR_INVALID, NULL, NULL);
}

static void test_limits(void **s) {
    (void)s;
    double t0 = osp_now_s();
    /* runaway loops stop at the step budget */
    expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", OSP_ERR_RANGE,
                 "steps", NULL);
    /* output and string growth stop at the output budget */
    expect_error("{% for i in range(100000) %}{{ 'x' * 100 }}{% endfor %}", OSP_ERR_RANGE, "output", NULL);
    expect_error("{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
                 OSP_ERR_RANGE, "limit", NULL);
    expect_error("{{ 'x' * 10000000000 }}", OSP_ERR_RANGE, NULL, NULL);
    { /* an empty sequence repeated 5e10 times is empty at once (it looped 5e10 times: fuzz_jinja) */
        osp_jinja_template *t;
        const char *src = "{{ ('' * 50000000000)|length }}{{ ([] * 50000000000)|length }}";
        assert_int_equal(osp_jinja_parse(src, strlen(src), &t), OSP_OK);
        char *out = NULL;
        size_t n = 0;
        assert_int_equal(osp_jinja_render(t, NULL, NULL, &out, &n), OSP_OK);
        assert_string_equal(out, "00");
        osp_free(out);
        osp_jinja_free(t);
    }
    /* memory: a list that doubles */
    expect_error("{% set ns = namespace(l=[1]) %}{% for i in range(60) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
                 OSP_ERR_RANGE, NULL, NULL);
    /* recursion */
    expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", OSP_ERR_RANGE, "recursion", NULL);
    /* deep nesting is refused by the parser */
    char deep[20100];
    size_t k = 0;
    k += (size_t)sprintf(deep, "{{ ");
    for (int i = 0; i < 10000; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 10000; i++) deep[k++] = ')';
    strcpy(deep + k, " }}");
    expect_error(deep, OSP_ERR_FORMAT, "nested too deeply", NULL);
    k = 0;
    for (int i = 0; i < 1000; i++) k += (size_t)sprintf(deep + k, "{%% if 1 %%}");
    expect_error(deep, OSP_ERR_FORMAT, "nested too deeply", NULL);
    /* caller-chosen limits */
    osp_jinja_options o = {0};
    o.max_output = 10;
    expect_error_opts("{{ 'x' * 11 }}", &o, OSP_ERR_RANGE, "10 bytes", NULL);
    memset(&o, 0, sizeof o);
    o.max_steps = 1000;
    expect_error_opts("{% for i in range(2000) %}{% endfor %}", &o, OSP_ERR_RANGE, "1000 evaluation steps", NULL);
    memset(&o, 0, sizeof o);
    o.max_depth = 5;
    expect_error_opts("{% macro f(n) %}{{ f(n + 1) if n < 10 }}{% endmacro %}{{ f(0) }}", &o, OSP_ERR_RANGE,
                      "deeper than 5", NULL);
    memset(&o, 0, sizeof o);
    o.max_memory = 1 << 20;
    expect_error_opts("{% for i in range(1000) %}{% set x = 'y' * 100000 %}{% endfor %}", &o, OSP_ERR_RANGE, "memory",
                      NULL);
    double dt = osp_now_s() - t0;
    if (dt > 10) fail_msg("the limit tests took %.1f s", dt);
    /* within the limits, a legitimate macro recursion works */
    char *out;
    size_t len;
    assert_int_equal(render("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(90) }}ok", NULL,
                            &out, &len),
                     OSP_OK);
    assert_string_equal(out, "ok");
    osp_free(out);
}

/* One parsed template rendered by several threads at once. */
typedef struct thread_arg {
    const osp_jinja_template *t;
    int id, failures;
} thread_arg;

static void *render_thread(void *p) {
    thread_arg *a = p;
    for (int i = 0; i < 200; i++) {
        char vars[128], want[128];
        snprintf(vars, sizeof vars, "{\"n\": %d, \"name\": \"t%d\"}", i, a->id);
        snprintf(want, sizeof want, "t%d:%d:%d", a->id, i, i * (i + 1) / 2);
        json_error_t e;
        json_t *v = json_loads(vars, 0, &e);
        char *out = NULL;
        size_t len;
        if (osp_jinja_render(a->t, v, NULL, &out, &len) != OSP_OK || strcmp(out, want)) a->failures++;
        osp_free(out);
        json_decref(v);
    }
    return NULL;
}

static void test_threads(void **s) {
    (void)s;
    const char *src = "{% set ns = namespace(s=0) %}{% for i in range(n + 1) %}{% set ns.s = ns.s + i %}{% endfor %}"
                      "{{ name }}:{{ n }}:{{ ns.s }}";
    osp_jinja_template *t;
    assert_int_equal(osp_jinja_parse(src, strlen(src), &t), OSP_OK);
    pthread_t th[4];
    thread_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thread_arg){t, i, 0};
        pthread_create(&th[i], NULL, render_thread, &args[i]);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].failures, 0);
    }
    osp_jinja_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_whitespace),  cmocka_unit_test(test_control),
        cmocka_unit_test(test_expressions), cmocka_unit_test(test_literals),
        cmocka_unit_test(test_filters),     cmocka_unit_test(test_tests),
        cmocka_unit_test(test_methods),     cmocka_unit_test(test_globals),
        cmocka_unit_test(test_syntax_errors), cmocka_unit_test(test_unknown_filter_and_test),
        cmocka_unit_test(test_runtime_errors), cmocka_unit_test(test_sandbox),
        cmocka_unit_test(test_limits),      cmocka_unit_test(test_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
