// Tests of the jinja engine. The expected texts of the JinjaRender cases are what Python jinja2
// 3.1 renders in transformers' environment (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loopcontrols, HF's tojson); tests/test_chat_template.py checks the same engine
// against jinja2 live, on real chat templates and random templates.

#include "tokenizer/jinja.h"

#include <gtest/gtest.h>

#include <thread>

namespace lathe::jinja {
namespace {

std::vector<std::pair<std::string, Value>> vars_of(const std::string& json) {
    std::vector<std::pair<std::string, Value>> vars;
    const Json parsed = Json::parse(json);
    for (const auto& [k, v] : parsed.items()) vars.emplace_back(k, Value::from_json(v));
    return vars;
}

// Renders `source` with the variables of a JSON object; fails the test on an error.
std::string render(const std::string& source, const std::string& json = "{}") {
    auto t = Template::parse(source, "t");
    if (!t.ok()) {
        ADD_FAILURE() << t.status().message();
        return "<parse error>";
    }
    auto r = t->render(vars_of(json));
    if (!r.ok()) {
        ADD_FAILURE() << r.status().message();
        return "<render error>";
    }
    return *r;
}

// The error message of parsing or rendering `source`; fails the test if both succeed.
std::string error_of(const std::string& source, const std::string& json = "{}") {
    auto t = Template::parse(source, "tmpl.jinja");
    if (!t.ok()) return t.status().message();
    auto r = t->render(vars_of(json));
    if (r.ok()) {
        ADD_FAILURE() << "expected an error, rendered: " << *r;
        return "";
    }
    return r.status().message();
}

TEST(JinjaRender, TextAndComments) {
    EXPECT_EQ(render("a{{ 'b' }}c{# comment #}d", R"json({})json"), "abcd");
}

TEST(JinjaRender, TrimAndLstripBlocks) {
    EXPECT_EQ(render("  {% if true %}\n  x\n  {% endif %}\n  y\n", R"json({})json"), "  x\n  y");
}

TEST(JinjaRender, DashStripsWhitespace) {
    EXPECT_EQ(render("{%- if true -%}  a  {%- endif -%}  b {{- ' c ' -}} d", R"json({})json"),
              "ab c d");
}

TEST(JinjaRender, PlusKeepsWhitespace) {
    EXPECT_EQ(render("{% if true +%}\n  kept\n{%+ endif %}", R"json({})json"), "\n  kept\n");
}

TEST(JinjaRender, LstripOnlyAtLineStart) {
    EXPECT_EQ(render("x  {% if true %}y{% endif %}\n  {{ 'z' }}", R"json({})json"), "x  y  z");
}

TEST(JinjaRender, CommentsTrimmed) {
    EXPECT_EQ(render("line\n  {# c #}\nnext\n{#- s -#}\n  last", R"json({})json"),
              "line\nnextlast");
}

TEST(JinjaRender, RawBlock) {
    EXPECT_EQ(
        render("{% raw %}{{ not evaluated }}{% endraw %}|{%- raw -%}  {% x %}  {%- endraw %}|",
               R"json({})json"),
        "{{ not evaluated }}|{% x %}|");
}

TEST(JinjaRender, NewlinesNormalized) {
    EXPECT_EQ(render("a\r\nb\rc\n{% if true %}\r\nx\r\n{% endif %}\r\n", R"json({})json"),
              "a\nb\nc\nx\n");
}

TEST(JinjaRender, TrailingNewlineDropped) {
    EXPECT_EQ(render("text\n", R"json({})json"), "text");
}

TEST(JinjaRender, StringEscapes) {
    EXPECT_EQ(render("{{ 'it\\'s' }}|{{ \"a\\tb\\n\" }}|{{ '\\u00e9\\x41\\101' }}|{{ 'con' 'cat' "
                     "}}|{{ 'unknown \\d' }}",
                     R"json({})json"),
              "it's|a\tb\n|éAA|concat|unknown \\d");
}

TEST(JinjaRender, IntegerArithmetic) {
    EXPECT_EQ(render("{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** "
                     "10 }} {{ 0x1F + 0b11 + 0o7 + 1_000 }}",
                     R"json({})json"),
              "7 3 -4 2 -2 1024 1041");
}

TEST(JinjaRender, FloatArithmetic) {
    EXPECT_EQ(
        render("{{ 7 / 2 }} {{ 4 / 2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 0.1 + 0.2 }} {{ 1e20 }} "
               "{{ 1e-5 }} {{ 1e16 }} {{ 123456789012345.0 }} {{ 2.5e-7 }} {{ -0.0 }}",
               R"json({})json"),
        "3.5 2.0 3.0 0.5 0.30000000000000004 1e+20 1e-05 1e+16 123456789012345.0 2.5e-07 -0.0");
}

TEST(JinjaRender, Concatenation) {
    EXPECT_EQ(render("{{ 'a' ~ 1 ~ none ~ true ~ 1.0 ~ [1, 'x'] ~ u }} {{ 'a' + 'b' }} {{ [1] + "
                     "[2] }} {{ 'ab' * 2 }} {{ 2 * [0] }}",
                     R"json({})json"),
              "a1NoneTrue1.0[1, 'x'] ab [1, 2] abab [0, 0]");
}

TEST(JinjaRender, Comparisons) {
    EXPECT_EQ(
        render(
            "{{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == (1,) }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ "
            "'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ none == none }} {{ {'a': 1} == {'a': 1} }}",
            R"json({})json"),
        "True True False True False True True True True");
}

TEST(JinjaRender, Membership) {
    EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 3 not in [1] }} {{ 1 "
                     "in d }} {{ u in [1] }}",
                     R"json({"d": {"k": 1}})json"),
              "True True True True False False");
}

TEST(JinjaRender, LogicReturnsOperands) {
    EXPECT_EQ(render("{{ x or 'dflt' }}|{{ x and 'no' }}|{{ 0 or '' or 'last' }}|{{ 'a' if x else "
                     "'b' }}|{{ 'c' if false }}|{{ not x }}",
                     R"json({"x": 0})json"),
              "dflt|0|last|b||True");
}

TEST(JinjaRender, Repr) {
    EXPECT_EQ(render("{{ [1, 2.5, 'é', none, true, {'k': [1, (2, 3)]}] }} {{ (1,) }} {{ () }} {{ "
                     "[\"it's\", 'say \"hi\"', 'a\\nb\\u200b'] }}",
                     R"json({})json"),
              "[1, 2.5, 'é', None, True, {'k': [1, (2, 3)]}] (1,) () [\"it's\", 'say \"hi\"', "
              "'a\\nb\\u200b']");
}

TEST(JinjaRender, Subscripts) {
    EXPECT_EQ(render("{{ l[0] }} {{ l[-1] }} [{{ l[9] }}] {{ l.1 }} {{ d['k'] }} {{ d.k }} [{{ "
                     "d.missing }}] {{ s[1] }} {{ s[-1] }}",
                     R"json({"l": [1, 2, 3], "d": {"k": "v"}, "s": "héllo"})json"),
              "1 3 [] 2 v v [] é o");
}

TEST(JinjaRender, Slices) {
    EXPECT_EQ(render("{{ l[1:] }} {{ l[::-1] }} {{ l[:-1] }} {{ l[::2] }} {{ l[5:] }} {{ s[1:3] }} "
                     "{{ s[::-1] }} {{ s[-2:] }}",
                     R"json({"l": [1, 2, 3, 4], "s": "héllo"})json"),
              "[2, 3, 4] [4, 3, 2, 1] [1, 2, 3] [1, 3] [] él olléh lo");
}

TEST(JinjaRender, MethodsBeforeKeys) {
    EXPECT_EQ(render("{{ d['items'] }} {{ d.get('items') }} {{ d.items()|list }} {{ d.keys()|list "
                     "}} {{ d.values()|list }} {{ d.get('zz', 'no') }} {{ d.get('zz') }}",
                     R"json({"d": {"items": 3}})json"),
              "3 3 [('items', 3)] ['items'] [3] no None");
}

TEST(JinjaRender, StringMethods) {
    EXPECT_EQ(
        render("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' a') }}|{{ s.split() "
               "}}|{{ s.split(' ', 1) }}|{{ s.rsplit(None, 1) }}|{{ 'a,b,,c'.split(',') }}",
               R"json({"s": "  a b\tc  "})json"),
        "a b\tc|a b\tc  |  a b\tc|b\tc|['a', 'b', 'c']|['', ' a b\\tc  ']|['  a b', 'c']|['a', "
        "'b', '', 'c']");
}

TEST(JinjaRender, StringMethods2) {
    EXPECT_EQ(
        render("{{ s.upper() }}|{{ s.lower() }}|{{ s.title() }}|{{ s.capitalize() }}|{{ "
               "s.replace('l', 'L', 1) }}|{{ s.find('l') }}|{{ s.count('l') }}|{{ "
               "s.startswith(('x', 'he')) }}|{{ s.endswith('ß') }}",
               R"json({"s": "hello wörld ß"})json"),
        "HELLO WÖRLD SS|hello wörld ß|Hello Wörld Ss|Hello wörld ß|heLlo wörld ß|2|3|True|True");
}

TEST(JinjaRender, StringMethods3) {
    EXPECT_EQ(render("{{ ', '.join(['a', 'b']) }}|{{ s.splitlines() }}|{{ s.partition('\\n') }}|{{ "
                     "'x'.center(5, '*') }}|{{ '{} and {}'.format(1, 'b') }}|{{ 'Ab1'.isalnum() "
                     "}}|{{ '12'.isdigit() }}",
                     R"json({"s": "a\nb\r\nc"})json"),
              "a, b|['a', 'b', 'c']|('a', '\\n', 'b\\r\\nc')|**x**|1 and b|True|True");
}

TEST(JinjaRender, PercentFormat) {
    EXPECT_EQ(render("{{ '%s is %d, %.2f' % ('Ann', 30, 1.5) }}|{{ '%(a)s' % {'a': 1} }}|{{ "
                     "'%05.1f|%-4d|%x|%r' % (3.14159, 7, 255, 'q') }}|{{ '%s-%d'|format('a', 3) }}",
                     R"json({})json"),
              "Ann is 30, 1.50|1|003.1|7   |ff|'q'|a-3");
}

TEST(JinjaRender, IfElifElse) {
    EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 1 %}one{% elif x == 2 %}two{% else "
                     "%}other{% endif %};{% endfor %}",
                     R"json({})json"),
              "one;two;other;");
}

TEST(JinjaRender, LoopVariables) {
    EXPECT_EQ(render("{% for i in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ "
                     "loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ "
                     "loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }};{% endfor %}",
                     R"json({"l": [5, 6, 7]})json"),
              "1032TrueFalse36a;2121FalseFalse357b;3210FalseTrue36a;");
}

TEST(JinjaRender, LoopFilterAndElse) {
    EXPECT_EQ(render("{% for i in l if i > 1 %}{{ i }}/{{ loop.length }} {% else %}none{% endfor "
                     "%}{% for i in [] %}x{% else %}empty{% endfor %}",
                     R"json({"l": [1, 2, 3]})json"),
              "2/2 3/2 empty");
}

TEST(JinjaRender, LoopUnpackingAndDicts) {
    EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k "
                     "}}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}{% for a, b in [[1, "
                     "2], (3, 4)] %}{{ a }}{{ b }}{% endfor %}",
                     R"json({"d": {"b": 1, "a": 2}})json"),
              "b=1;a=2;ba[h][é]1234");
}

TEST(JinjaRender, LoopControls) {
    EXPECT_EQ(render("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 "
                     "%}{% break %}{% endif %}{{ i }}{% endfor %}",
                     R"json({})json"),
              "0134");
}

TEST(JinjaRender, LoopOverFilterAndReverse) {
    EXPECT_EQ(render("{% for m in l|reverse %}{{ m }}{% endfor %}|{% for m in l|select('odd') %}{{ "
                     "m }}{% endfor %}|{{ range(2, 9, 3)|list }}|{{ range(3)|list }}",
                     R"json({"l": [1, 2, 3]})json"),
              "321|13|[2, 5, 8]|[0, 1, 2]");
}

TEST(JinjaRender, ScopesPerIteration) {
    EXPECT_EQ(render("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }}{% "
                     "endfor %}{{ x }}|{% for i in [1, 2] %}{% if i == 1 %}{% set y = 5 %}{% endif "
                     "%}{{ y }};{% endfor %}",
                     R"json({})json"),
              "1101201|5;;");
}

TEST(JinjaRender, ScopesAsJinjaCompilesThem) {
    EXPECT_EQ(render("{% for i in [1] %}{% for j in [1] %}[{{ x }}]{% endfor %}{% set x = 2 %}{% "
                     "endfor %}[{{ x }}]{% for i in [1] %}[{{ x }}]{% endfor %}{% set x = 3 %}",
                     R"json({"x": 1})json"),
              "[1][1][1]");
}

TEST(JinjaRender, Namespace) {
    EXPECT_EQ(
        render(
            "{% set ns = namespace(n=0, items=[]) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i "
            "%}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.n }} {{ ns.items }} {{ ns }}",
            R"json({})json"),
        "6 [1, 2, 3] <Namespace {'n': 6, 'items': [1, 2, 3]}>");
}

TEST(JinjaRender, SetForms) {
    EXPECT_EQ(render("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}block {{ a }}{% endset %}[{{ t "
                     "}}]{% set u | upper %}up{% endset %}{{ u }}",
                     R"json({})json"),
              "12[block 1]UP");
}

TEST(JinjaRender, Macros) {
    EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ "
                     "greet('Ann') }} {{ greet('Bo', punct='?') }} {{ greet(punct='.', name='Cy') "
                     "}} [{{ greet() }}]",
                     R"json({})json"),
              "Hi Ann! Hi Bo? Hi Cy. [Hi !]");
}

TEST(JinjaRender, CallBlock) {
    EXPECT_EQ(render("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% "
                     "call wrap('b') %}bold {{ 1 + 1 }}{% endcall %}{% macro each(l) %}{% for x in "
                     "l %}{{ caller(x) }}{% endfor %}{% endmacro %}{% call(v) each([1, 2]) %}<{{ v "
                     "}}>{% endcall %}",
                     R"json({})json"),
              "<b>bold 2</b><1><2>");
}

TEST(JinjaRender, MacroVarargsKwargs) {
    EXPECT_EQ(
        render("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}{% macro "
               "n(a, b) %}{{ a }}{{ b }}{% endmacro %}{{ n(*[1, 2]) }}{{ n(**{'a': 3, 'b': 4}) }}",
               R"json({})json"),
        "(1, 2){'k': 3}1234");
}

TEST(JinjaRender, FilterBlockAndWith) {
    EXPECT_EQ(render("{% filter upper %}abc {{ 'd' }}{% endfilter %} {% with a = 1, b = 2 %}{{ a + "
                     "b }}{% endwith %}[{{ a }}]",
                     R"json({})json"),
              "ABC D 3[]");
}

TEST(JinjaRender, StringFilters) {
    EXPECT_EQ(render("{{ s|trim }}|{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ s|capitalize }}|{{ "
                     "s|length }}|{{ s|wordcount }}|{{ s|replace('o', '0') }}|{{ s|trim('( )') }}",
                     R"json({"s": "  hello-world (foo) wörld  "})json"),
              "hello-world (foo) wörld|  HELLO-WORLD (FOO) WÖRLD  |  hello-world (foo) wörld  |  "
              "Hello-World (Foo) Wörld  |  hello-world (foo) wörld  |27|4|  hell0-w0rld (f00) "
              "wörld  |hello-world (foo) wörld");
}

TEST(JinjaRender, ToJson) {
    EXPECT_EQ(
        render("{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ x|tojson(separators=(',', ':')) }}|{{ "
               "x|tojson(sort_keys=true) }}|{{ x|tojson(ensure_ascii=true) }}|{{ [] "
               "|tojson(indent=2) }}",
               R"json({"x": {"b": [1, 2.5, null, true], "a": "é\n\"\\\u0001 🚀", "c": {}}})json"),
        "{\"b\": [1, 2.5, null, true], \"a\": \"é\\n\\\"\\\\\\u0001 🚀\", \"c\": {}}|{\n  \"b\": "
        "[\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"é\\n\\\"\\\\\\u0001 🚀\",\n  "
        "\"c\": {}\n}|{\"b\":[1,2.5,null,true],\"a\":\"é\\n\\\"\\\\\\u0001 🚀\",\"c\":{}}|{\"a\": "
        "\"é\\n\\\"\\\\\\u0001 🚀\", \"b\": [1, 2.5, null, true], \"c\": {}}|{\"b\": [1, 2.5, null, "
        "true], \"a\": \"\\u00e9\\n\\\"\\\\\\u0001 \\ud83d\\ude80\", \"c\": {}}|[]");
}

TEST(JinjaRender, ListFilters) {
    EXPECT_EQ(render("{{ l|first }} {{ l|last }} {{ l|length }} {{ l|count }} {{ l|join('-') }} {{ "
                     "l|sort|list }} {{ l|sort(reverse=true) }} {{ l|unique|list }} {{ l|sum }} {{ "
                     "l|min }} {{ l|max }} {{ l|list }} {{ 'ab'|list }}",
                     R"json({"l": [3, 1, 2, 3]})json"),
              "3 3 4 4 3-1-2-3 [1, 2, 3, 3] [3, 3, 2, 1] [3, 1, 2] 9 1 3 [3, 1, 2, 3] ['a', 'b']");
}

TEST(JinjaRender, CaseInsensitiveSorting) {
    EXPECT_EQ(render("{{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} "
                     "{{ ['a', 'A']|unique|list }} {{ ['b', 'A']|max }} {{ [{'n': 'b'}, {'n': "
                     "'a'}]|sort(attribute='n')|map(attribute='n')|join }}",
                     R"json({})json"),
              "['A', 'b', 'c'] ['A', 'b', 'c'] ['a'] b ab");
}

TEST(JinjaRender, SelectAndMap) {
    EXPECT_EQ(
        render(
            "{{ m|selectattr('role', 'equalto', 'user')|list|length }} {{ m|rejectattr('role', "
            "'eq', 'user')|map(attribute='content')|join(',') }} {{ m|map(attribute='role')|list "
            "}} {{ m|selectattr('x')|list }} {{ [1, 0, 2]|select|list }} {{ [1, 0, 2]|reject|list "
            "}} {{ ['a', 'bb']|map('length')|list }} {{ m|map(attribute='zz', default='-')|list }}",
            R"json({"m": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "x": 1}]})json"),
        "1 b ['user', 'assistant'] [{'role': 'assistant', 'content': 'b', 'x': 1}] [1, 2] [0] [1, "
        "2] ['-', '-']");
}

TEST(JinjaRender, GeneratorsAreOneShot) {
    EXPECT_EQ(render("{% set g = [1, 2, 3]|select %}{{ g|list }}{{ g|list }}{% if [0]|select "
                     "%}truthy{% endif %}{{ [1, 2]|select|first }}",
                     R"json({})json"),
              "[1, 2, 3][]truthy1");
}

TEST(JinjaRender, DefaultFilter) {
    EXPECT_EQ(render("{{ u|default('d') }} [{{ ''|default('d') }}] {{ ''|default('d', true) }} {{ "
                     "none|default('d') }} {{ u|d('x') }}",
                     R"json({})json"),
              "d [] d None x");
}

TEST(JinjaRender, NumberFilters) {
    EXPECT_EQ(render("{{ '3'|int + 1 }} {{ '2.5'|float }} {{ 'x'|int }} {{ 3.7|int }} {{ 2.5|round "
                     "}} {{ 3.5|round }} {{ 3.14159|round(2) }} {{ 3|round }} {{ -1|abs }} {{ "
                     "7|string ~ '!' }} {{ '0x1A'|int(base=16) }}",
                     R"json({})json"),
              "4 2.5 0 3 2.0 4.0 3.14 3 1 7! 26");
}

TEST(JinjaRender, DictFilters) {
    EXPECT_EQ(render("{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) "
                     "}} {{ d|list }} {{ d|length }}",
                     R"json({"d": {"b": 1, "a": 2}})json"),
              "[('b', 1), ('a', 2)] [('a', 2), ('b', 1)] [('a', 2), ('b', 1)] ['b', 'a'] 2");
}

TEST(JinjaRender, TextFilters) {
    EXPECT_EQ(render("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'long text "
                     "here'|truncate(9) }}|{{ '<b>'|e }}|{{ [1, 2, 3, 4, 5]|batch(2)|list }}|{{ "
                     "'x'|center(5) }}",
                     R"json({})json"),
              "a\n  b\n\n  c|  a\n  b|long text here|&lt;b&gt;|[[1, 2], [3, 4], [5]]|  x  ");
}

TEST(JinjaRender, Tests) {
    EXPECT_EQ(
        render("{{ u is defined }} {{ u is undefined }} {{ none is none }} {{ 's' is string }} {{ "
               "1 is number }} {{ true is number }} {{ 1 is integer }} {{ true is integer }} {{ "
               "1.0 is float }} {{ true is boolean }} {{ d is mapping }} {{ l is mapping }}",
               R"json({"d": {}, "l": []})json"),
        "False True True True True True True False True True True False");
}

TEST(JinjaRender, Tests2) {
    EXPECT_EQ(
        render("{{ l is iterable }} {{ 's' is sequence }} {{ 1 is iterable }} {{ true is true }} "
               "{{ 1 is true }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 2 is in "
               "[1, 2] }} {{ 2 is eq 2 }} {{ 2 is ne 3 }} {{ 2 is lt 3 }} {{ 'ab' is lower }} {{ "
               "'AB' is upper }} {{ none is sameas none }} {{ x is not none }}",
               R"json({"l": [], "x": 1})json"),
        "True True False True False True True True True True True True True True True True");
}

TEST(JinjaRender, UndefinedIsLenient) {
    EXPECT_EQ(render("[{{ u }}] [{{ u|trim }}] [{{ u|length }}] {{ u is iterable }} {% for x in u "
                     "%}never{% endfor %} {{ not u }} {{ u == u }} [{{ d.missing }}] {{ d.missing "
                     "is defined }} [{{ u|join(',') }}] {{ u|list }}",
                     R"json({"d": {}})json"),
              "[] [] [0] True  True True [] False [] []");
}

TEST(JinjaRender, UnicodeCase) {
    EXPECT_EQ(render("{{ 'straße'|upper }} {{ 'İ'|lower|length }} {{ 'ΣΑΣ ΟΔΟΣ'|lower }} {{ "
                     "'ǆemal'|capitalize }} {{ 'ǆemal dž'.title() }}",
                     R"json({})json"),
              "STRASSE 2 σας οδος ǅemal ǅemal Dž");
}

// --- errors ---------------------------------------------------------------------------------

TEST(JinjaErrors, SyntaxErrorsNameTemplateLineAndExpectation) {
    std::string e = error_of("a\n{% for m in messages %}\n{{ m }}\n");
    EXPECT_NE(e.find("template 'tmpl.jinja'"), std::string::npos) << e;
    EXPECT_NE(e.find("'{% endfor %}'"), std::string::npos) << e;
    EXPECT_NE(e.find("opened on line 2"), std::string::npos) << e;

    e = error_of("x\ny\n{{ 1 + }}");
    EXPECT_NE(e.find("line 3"), std::string::npos) << e;
    EXPECT_NE(e.find("expression"), std::string::npos) << e;

    e = error_of("{% if true %}{% endfor %}{% endif %}");
    EXPECT_NE(e.find("unknown tag 'endfor'"), std::string::npos) << e;
    EXPECT_NE(e.find("innermost open block is 'if'"), std::string::npos) << e;

    EXPECT_NE(error_of("{{ 'x'|no_such_filter }}").find("no filter named 'no_such_filter'"),
              std::string::npos);
    EXPECT_NE(error_of("{{ 1 is no_such_test }}").find("no test named 'no_such_test'"),
              std::string::npos);
    EXPECT_NE(error_of("{% include 'x' %}").find("not supported"), std::string::npos);
    EXPECT_NE(error_of("{% break %}").find("outside of a for loop"), std::string::npos);
    EXPECT_NE(error_of("{{ 'abc }}").find("unterminated string"), std::string::npos);
    EXPECT_NE(error_of("{{ (1 }}").find("expected ')'"), std::string::npos);
    EXPECT_NE(error_of("{# never closed").find("comment"), std::string::npos);
    EXPECT_NE(error_of("{{ '\\x4' }}").find("escape"), std::string::npos);
    EXPECT_NE(error_of("{% set true = 1 %}").find("constant"), std::string::npos);
}

TEST(JinjaErrors, UnknownFilterInsideIfFailsOnlyWhenRun) {
    EXPECT_EQ(render("{% if x %}{{ 1|no_such_filter }}{% endif %}ok", R"({"x": false})"), "ok");
    EXPECT_NE(error_of("{% if x %}{{ 1|no_such_filter }}{% endif %}", R"({"x": true})")
                  .find("no filter named"),
              std::string::npos);
}

TEST(JinjaErrors, RuntimeErrorsNameTheLine) {
    std::string e = error_of("a\nb\n{{ raise_exception('Roles must alternate') }}");
    EXPECT_NE(e.find("line 3"), std::string::npos) << e;
    EXPECT_NE(e.find("raise_exception: Roles must alternate"), std::string::npos) << e;

    EXPECT_NE(error_of("{{ u.attr }}").find("'u' is undefined"), std::string::npos);
    EXPECT_NE(error_of("{{ 'a' + u }}").find("'u' is undefined"), std::string::npos);
    EXPECT_NE(error_of("{{ d.a.b }}", R"({"d": {}})").find("has no attribute 'a'"),
              std::string::npos);
    EXPECT_NE(error_of("{{ 1 / 0 }}").find("division by zero"), std::string::npos);
    EXPECT_NE(error_of("{{ 1 < 'a' }}").find("not supported between"), std::string::npos);
    EXPECT_NE(error_of("{{ 'a' + 1 }}").find("unsupported operand"), std::string::npos);
    EXPECT_NE(error_of("{% for a, b in [[1, 2, 3]] %}{% endfor %}").find("too many values"),
              std::string::npos);
    EXPECT_NE(error_of("{% set x = 1 %}{% set x.y = 2 %}").find("namespace"), std::string::npos);
    EXPECT_NE(error_of("{{ [1, 2]|select|length }}").find("has no len()"), std::string::npos);
    EXPECT_NE(error_of("{{ range(1000000)|length }}").find("Range too big"), std::string::npos);
    EXPECT_NE(error_of("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}").find("takes not more than 1"),
              std::string::npos);
    EXPECT_NE(
        error_of("{% macro m(a) %}{% endmacro %}{{ m(b=1) }}").find("no keyword argument 'b'"),
        std::string::npos);
    EXPECT_NE(error_of("{{ none() }}").find("not callable"), std::string::npos);
    EXPECT_NE(error_of("{{ 9223372036854775807 + 1 }}").find("overflow"), std::string::npos);
}

TEST(JinjaErrors, RunawayNestingAndRecursionAreErrorsNotCrashes) {
    EXPECT_NE(error_of("{{ " + std::string(2000, '(') + "1" + std::string(2000, ')') + " }}")
                  .find("nested"),
              std::string::npos);
    std::string blocks;
    for (int i = 0; i < 1000; ++i) blocks += "{% if true %}";
    EXPECT_NE(error_of(blocks).find("nested"), std::string::npos);
    EXPECT_NE(error_of("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}").find("recursion"),
              std::string::npos);
    EXPECT_EQ(render("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro "
                     "%}{{ f(5) }}"),
              "54321");
    EXPECT_NE(error_of("{{ 'x' * 1000000000000 }}").find("too large"), std::string::npos);
    // Strings grown past kMaxStringBytes by other means: refused before gigabytes are allocated.
    EXPECT_NE(error_of("{{ 'a'|center(1000000000) }}").find("string result too large"),
              std::string::npos);
    EXPECT_NE(error_of("{{ 'a'.rjust(1000000000) }}").find("string result too large"),
              std::string::npos);
    for (const char* t : {"{{ 'a'.zfill(100000000000) }}", "{{ 'a\nb'|indent(100000000000) }}",
                          "{{ '%100000000000d' % 5 }}", "{{ '%0100000000000d' % 5 }}"})
        EXPECT_NE(error_of(t).find("string result too large"), std::string::npos) << t;
    EXPECT_NE(error_of("{% set ns = namespace(s='x' * 1024) %}{% for i in range(40) %}"
                       "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}")
                  .find("string result too large"),
              std::string::npos);
}

TEST(JinjaErrors, SandboxRefusesMutation) {
    EXPECT_NE(error_of("{{ l.append(1) }}", R"({"l": []})").find("unsafe"), std::string::npos);
    EXPECT_NE(error_of("{{ d.update({}) }}", R"({"d": {}})").find("unsafe"), std::string::npos);
    EXPECT_NE(error_of("{{ d.pop('k') }}", R"({"d": {"k": 1}})").find("unsafe"), std::string::npos);
    EXPECT_EQ(render("[{{ l.__class__ }}]", R"({"l": []})"), "[]");
}

// --- other behaviour -------------------------------------------------------------------------

TEST(JinjaRender, StrftimeNowUsesTheRenderTime) {
    auto t = Template::parse("{{ strftime_now('%d %b %Y') }}", "t");
    ASSERT_TRUE(t.ok());
    RenderOptions options;
    std::tm tm{};
    tm.tm_year = 124;
    tm.tm_mon = 6;
    tm.tm_mday = 26;
    options.now = tm;
    auto r = t->render({}, options);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(*r, "26 Jul 2024");
}

TEST(JinjaRender, GenerationBlocksReportTheirSpans) {
    auto t = Template::parse(
        "ab{% generation %}cd{{ x }}{% endgeneration %}e{% generation %}f{% endgeneration %}", "t");
    ASSERT_TRUE(t.ok());
    std::vector<std::pair<size_t, size_t>> spans;
    RenderOptions options;
    options.generation_spans = &spans;
    auto r = t->render(vars_of(R"({"x": "X"})"), options);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(*r, "abcdXef");
    ASSERT_EQ(spans.size(), 2u);
    EXPECT_EQ(r->substr(spans[0].first, spans[0].second - spans[0].first), "cdX");
    EXPECT_EQ(r->substr(spans[1].first, spans[1].second - spans[1].first), "f");
}

TEST(JinjaRender, ConcurrentRendersAgree) {
    auto t = Template::parse(
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ m.role|upper }}:{{ m.content|trim }};{% endfor %}{{ ns.n }}",
        "t");
    ASSERT_TRUE(t.ok());
    std::vector<std::string> out(8);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < out.size(); ++i) {
        threads.emplace_back([&, i] {
            for (int k = 0; k < 200; ++k) {
                auto r = t->render(vars_of(R"({"messages": [{"role": "user", "content": " hi "},
                                                           {"role": "assistant", "content": "yo"}]})"));
                out[i] = r.ok() ? *r : r.status().message();
            }
        });
    }
    for (auto& th : threads) th.join();
    for (const auto& o : out) EXPECT_EQ(o, "USER:hi;ASSISTANT:yo;2");
}

TEST(JinjaValue, FloatReprMatchesPython) {
    EXPECT_EQ(float_repr(1.0), "1.0");
    EXPECT_EQ(float_repr(0.1), "0.1");
    EXPECT_EQ(float_repr(1e16), "1e+16");
    EXPECT_EQ(float_repr(1e15), "1000000000000000.0");
    EXPECT_EQ(float_repr(1e-4), "0.0001");
    EXPECT_EQ(float_repr(1e-5), "1e-05");
    EXPECT_EQ(float_repr(-2.5e-300), "-2.5e-300");
    EXPECT_EQ(float_repr(1.0 / 3.0), "0.3333333333333333");
}

TEST(JinjaValue, JsonKeyOrderSurvives) {
    const Value v =
        Value::from_json(Json::parse(R"({"z": 1, "a": {"y": [true, null], "b": 2.0}})"));
    EXPECT_EQ(json_dumps(v, {}), R"({"z": 1, "a": {"y": [true, null], "b": 2.0}})");
}

}  // namespace
}  // namespace lathe::jinja
