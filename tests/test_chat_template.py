"""`lathe chat render` / `lathe chat encode` against transformers' own apply_chat_template.

Reference: transformers' AutoTokenizer loaded from the shared tokenizer.json and
tokenizer_config.json (no torch needed), rendering with apply_chat_template(messages, tools=...,
chat_template=..., add_generation_prompt=..., tokenize=False, **kwargs) and tokenizing with
tokenize=True. Nothing of transformers' rendering is re-implemented here.

Checked:
  * llama3 and qwen3 (the shared tokenizer_config.json templates): many varied conversations
    (system or not, multi-turn, Unicode, empty content, tool calls and tool results, reasoning,
    tools, enable_thinking), with and without add_generation_prompt: identical text.
  * llama2: the shared config has no chat_template (lathe and transformers both refuse), and a
    Llama-2-style [INST] template written here, with the config's special tokens, incl. its
    raise_exception.
  * the engine, construct by construct, and randomly generated templates (whitespace control
    and expressions, fixed seeds): identical text, or both raise.
  * loading: named template lists (and transformers' tool_use choice), chat_template.jinja
    beside the config, syntax and runtime errors naming the template and line.
  * `lathe chat encode`: for every shared tokenizer_config (llama2 with the Llama-2-style
    template), the whole token sequence equals apply_chat_template(tokenize=True) (nothing is
    appended after a template that ends its turns itself), and the labels keep exactly the
    assistant turns as GPT-NeoX's build_chat() slices them from apply_chat_template's prefix
    tokens; a plain-text template that marks no end of turn gets eos_token appended after a
    final assistant turn; the documented behaviour where a template rewrites earlier turns
    (qwen3 reasoning).
"""

import functools
import json
import os
import random
import shutil
import subprocess
import tempfile
from pathlib import Path

import jinja2
import pytest
from transformers import AutoTokenizer

LATHE = os.environ.get("LATHE_BIN", str(Path(__file__).resolve().parents[1] / "build" / "lathe"))
SHARED = Path(os.environ.get("LATHE_SHARED_DIR", Path(__file__).resolve().parents[2] / "shared"))
IGNORE = -100
SHOW = 3
NAMES = ["llama2", "llama3", "qwen3"]


# --- the reference: transformers' apply_chat_template -----------------------------------------

@functools.lru_cache(maxsize=None)
def hf_tokenizer(name):
    """AutoTokenizer from the shared NAME.json and NAME.tokenizer_config.json."""
    with tempfile.TemporaryDirectory(prefix=f"lathe_hf_{name}_") as folder:
        shutil.copy(SHARED / "tokenizers" / f"{name}.json", Path(folder) / "tokenizer.json")
        shutil.copy(shared_config(name), Path(folder) / "tokenizer_config.json")
        return AutoTokenizer.from_pretrained(folder)


def hf_render(name, messages, add_generation_prompt=False, tools=None, kwargs=None,
              template=None):
    """apply_chat_template(messages, tools=tools, tokenize=False, ...): text, or the exception."""
    try:
        return hf_tokenizer(name).apply_chat_template(
            messages, tools=tools, chat_template=template,
            add_generation_prompt=add_generation_prompt, tokenize=False, **(kwargs or {}))
    except Exception as e:  # noqa: BLE001 - the reference's failure is part of the comparison
        return e


def hf_ids(name, messages, add_generation_prompt=False, tools=None, template=None):
    """apply_chat_template(messages, tokenize=True): the token ids."""
    ids = hf_tokenizer(name).apply_chat_template(
        messages, tools=tools, chat_template=template, add_generation_prompt=add_generation_prompt,
        tokenize=True, return_dict=False)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids), type(ids)
    return ids


# --- lathe -----------------------------------------------------------------------------------

def shared_config(name):
    path = SHARED / "tokenizers" / f"{name}.tokenizer_config.json"
    if not path.exists():
        pytest.fail(f"{path} is missing (LATHE_SHARED_DIR={SHARED})")
    return path


def run_lathe(args, lines, tmp_path, name="in.jsonl"):
    inp = tmp_path / name
    inp.write_text("".join(json.dumps(l, ensure_ascii=False) + "\n" for l in lines), encoding="utf-8")
    out = tmp_path / (name + ".out")
    proc = subprocess.run([LATHE, "-q", "chat", *args, "--input", str(inp), "--output", str(out)],
                          capture_output=True, text=True)
    return proc, out


def lathe_render(config_path, convs, tmp_path, add_generation_prompt=False, template_file=None,
                 kwargs=None):
    """Renders each {"messages", "tools"?, "chat_template_kwargs"?}; returns texts or raises."""
    args = ["render", "--tokenizer-config", str(config_path)]
    if add_generation_prompt:
        args.append("--add-generation-prompt")
    if template_file is not None:
        args += ["--chat-template", str(template_file)]
    if kwargs is not None:
        args += ["--kwargs", json.dumps(kwargs)]
    proc, out = run_lathe(args, convs, tmp_path)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip())
    with open(out, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def compare_renders(name, convs, tmp_path, add_generation_prompt=False, kwargs=None,
                    template=None, template_file=None):
    """lathe's rendering of each conversation with NAME's config (or `template`) equals
    transformers'."""
    config_path = shared_config(name)
    expected = [hf_render(name, c["messages"], add_generation_prompt, c.get("tools"),
                          {**(kwargs or {}), **c.get("chat_template_kwargs", {})}, template)
                for c in convs]
    failing = [i for i, e in enumerate(expected) if isinstance(e, Exception)]
    assert not failing, f"reference failed on conversation {failing[0]}: {expected[failing[0]]}"
    got = lathe_render(config_path, convs, tmp_path, add_generation_prompt, template_file, kwargs)
    assert len(got) == len(expected)
    bad = [i for i in range(len(got)) if got[i] != expected[i]]
    print(f"{len(convs)} conversations, add_generation_prompt={add_generation_prompt}: "
          f"{len(bad)} mismatches")
    for i in bad[:SHOW]:
        print("messages:", json.dumps(convs[i]["messages"], ensure_ascii=False)[:400])
        print("  transformers:", repr(expected[i])[:600])
        print("  lathe: ", repr(got[i])[:600])
    assert not bad


# --- conversations -----------------------------------------------------------------------------

TEXTS = [
    "Hello, how are you?",
    "",
    "   padded on both sides   \n\n",
    "Ünïcödé: 日本語のテキスト, русский текст, العربية, हिन्दी, ελληνικά",
    "emoji 👩‍👩‍👧‍👦 and flags 🇯🇵 and combining e\u0301\u0302",
    "line one\nline two\r\n\nline four\ttabbed",
    "Quotes \" and ' and a backslash \\ and braces {{ not_a_variable }} {% raw %}",
    "<think>\nI should reason first.\n</think>\n\nThe answer is 42.",
    "<tool_response>\n{\"temp\": 3}\n</tool_response>",
    "What's the weather like in Oslo and Stockholm?",
    "\u00a0non-breaking\u3000ideographic space\u2028separator",
    "x" * 300,
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_current_weather",
        "description": "Get the current weather in a given location",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city, e.g. Zürich"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web — any language",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}, "n": {"type": "integer"}}}}},
]


def make_conversation(rng, *, tools=False, reasoning=False, system=None):
    msgs = []
    if system if system is not None else rng.random() < 0.5:
        msgs.append({"role": "system", "content": rng.choice(TEXTS)})
    turns = rng.randint(1, 4)
    for t in range(turns):
        msgs.append({"role": "user", "content": rng.choice(TEXTS)})
        last = t == turns - 1
        if last and rng.random() < 0.4:
            break  # conversations may end with the user
        reply = {"role": "assistant", "content": rng.choice(TEXTS)}
        if reasoning and rng.random() < 0.3:
            reply["reasoning_content"] = rng.choice(["Let me think.", "\nsteps\n", ""])
        if tools and rng.random() < 0.35:
            args = rng.choice([{"location": "Oslo", "unit": "celsius"}, '{"location": "Zürich"}', {}])
            calls = [{"type": "function", "function": {"name": "get_current_weather", "arguments": args}}]
            if rng.random() < 0.3:
                calls.append({"name": "search", "arguments": {"q": "日本", "n": 3}})
            reply["tool_calls"] = calls
            if rng.random() < 0.5:
                reply["content"] = ""
            msgs.append(reply)
            for _ in calls:
                msgs.append({"role": "tool", "content": rng.choice(['{"temp": 3}', "Ünïcödé result", ""])})
            if not last:
                msgs.append({"role": "assistant", "content": rng.choice(TEXTS)})
            continue
        msgs.append(reply)
    return msgs


# --- the shared templates ----------------------------------------------------------------------

@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_llama3_matches_transformers(tmp_path, add_generation_prompt):
    rng = random.Random(3)
    convs = [{"messages": make_conversation(rng)} for _ in range(150)]
    compare_renders("llama3", convs, tmp_path, add_generation_prompt)


@pytest.mark.parametrize("add_generation_prompt", [False, True])
def test_qwen3_matches_transformers(tmp_path, add_generation_prompt):
    rng = random.Random(7 + add_generation_prompt)
    convs = []
    for i in range(200):
        c = {"messages": make_conversation(rng, tools=i % 2 == 0, reasoning=True)}
        if i % 3 == 0:
            c["tools"] = TOOLS
        if i % 5 == 0:
            c["chat_template_kwargs"] = {"enable_thinking": False}
        convs.append(c)
    compare_renders("qwen3", convs, tmp_path, add_generation_prompt)
    # --kwargs applies to every line.
    compare_renders("qwen3", convs[:40], tmp_path, add_generation_prompt,
                    kwargs={"enable_thinking": False})


def test_llama2_config_has_no_template(tmp_path):
    config_path = shared_config("llama2")
    assert json.loads(config_path.read_text()).get("chat_template") is None
    assert isinstance(hf_render("llama2", [{"role": "user", "content": "hi"}]), ValueError)
    with pytest.raises(RuntimeError) as err:
        lathe_render(config_path, [{"messages": [{"role": "user", "content": "hi"}]}], tmp_path)
    message = str(err.value)
    assert "llama2.tokenizer_config.json" in message and "--chat-template" in message


# A Llama-2-chat style template ([INST] ... [/INST], <<SYS>> block), written for this test.
LLAMA2_STYLE = (
    "{%- if messages and messages[0]['role'] == 'system' -%}\n"
    "    {%- set system = messages[0]['content'] -%}\n"
    "    {%- set turns = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set system = false -%}\n"
    "    {%- set turns = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for m in turns -%}\n"
    "    {%- if (m['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}\n"
    "    {%- endif -%}\n"
    "    {%- if loop.first and system != false -%}\n"
    "        {%- set text = '<<SYS>>\\n' + system + '\\n<</SYS>>\\n\\n' + m['content'] -%}\n"
    "    {%- else -%}\n"
    "        {%- set text = m['content'] -%}\n"
    "    {%- endif -%}\n"
    "    {%- if m['role'] == 'user' -%}\n"
    "        {{ bos_token + '[INST] ' + text.strip() + ' [/INST]' }}\n"
    "    {%- else -%}\n"
    "        {{ ' ' + text.strip() + ' ' + eos_token }}\n"
    "    {%- endif -%}\n"
    "{%- endfor -%}\n"
)


def test_llama2_style_template_matches_transformers(tmp_path):
    config_path = shared_config("llama2")
    template_file = tmp_path / "llama2_style.jinja"
    template_file.write_text(LLAMA2_STYLE, encoding="utf-8")
    rng = random.Random(11)
    convs = []
    for _ in range(100):
        msgs = [{"role": "system", "content": rng.choice(TEXTS)}] if rng.random() < 0.5 else []
        for t in range(rng.randint(1, 4)):
            msgs.append({"role": "user", "content": rng.choice(TEXTS)})
            msgs.append({"role": "assistant", "content": rng.choice(TEXTS)})
        if rng.random() < 0.5:
            msgs.pop()
        convs.append({"messages": msgs})
    for agp in (False, True):
        compare_renders("llama2", convs, tmp_path, agp, template=LLAMA2_STYLE,
                        template_file=template_file)

    # The template's raise_exception() becomes an error naming the template and the message.
    bad = [{"messages": [{"role": "assistant", "content": "first"}]}]
    assert isinstance(hf_render("llama2", bad[0]["messages"], template=LLAMA2_STYLE),
                      jinja2.TemplateError)
    with pytest.raises(RuntimeError) as err:
        lathe_render(config_path, bad, tmp_path, template_file=template_file)
    message = str(err.value)
    assert "Conversation roles must alternate" in message
    assert "llama2_style.jinja" in message and "line 10" in message and "in.jsonl:1" in message


# --- the engine, construct by construct --------------------------------------------------------

# (template, variables). Each is rendered by jinja2 and by lathe; both must give the same text or
# both must raise. Variables reach the template through --kwargs.
CONSTRUCTS = [
    # output, comments, whitespace control, trim_blocks / lstrip_blocks, raw
    ("a{{ 'b' }}c{# comment #}d", {}),
    ("  {% if true %}\n  x\n  {% endif %}\n  y\n", {}),
    ("{%- if true -%}  a  {%- endif -%}  b {{- ' c ' -}} d", {}),
    ("{% if true +%}\n  kept\n{%+ endif %}", {}),
    ("line\n  {# lstripped comment #}\nnext\n{#- stripped -#}\n  last", {}),
    ("{% raw %}{{ not evaluated }}{% endraw %}|{%- raw -%}  {% x %}  {%- endraw %}|", {}),
    ("crlf\r\nendings\r\n{% if true %}\r\nx\r\n{% endif %}\r\n", {}),
    ("trailing newline dropped\n", {}),
    # literals and operators
    ("{{ 'it\\'s' }} {{ \"a\\tb\\n\" }} {{ '\\u00e9\\x41\\101' }} {{ 'con' 'cat' }}", {}),
    ("{{ 1 + 2 * 3 - 4 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7.5 // 2 }}", {}),
    ("{{ 'a' ~ 1 ~ none ~ true ~ 1.0 ~ [1, 'x'] ~ u }}", {}),
    ("{{ 1 == 1.0 }} {{ true == 1 }} {{ [1] == (1,) }} {{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }}", {}),
    ("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 3 not in [1] }} {{ not 0 }}", {"d": {"k": 1}}),
    ("{{ x or 'dflt' }} {{ x and 'no' }} {{ 0 or '' or 'last' }} {{ 'a' if x else 'b' }} [{{ 'c' if false }}]", {"x": 0}),
    ("{{ [1, 2.5, 'é', none, true, {'k': [1, (2, 3)]}] }} {{ (1,) }} {{ () }} {{ 1e20 }} {{ 0.1 + 0.2 }} {{ 1e-5 }}", {}),
    # subscripts, slices, attributes, methods
    ("{{ l[0] }} {{ l[-1] }} [{{ l[9] }}] {{ l[1:] }} {{ l[::-1] }} {{ l[:-1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s[-2] }}", {"l": [1, 2, 3], "s": "héllo"}),
    ("{{ d.k }} {{ d['k'] }} {{ d.get('k') }} {{ d.get('z', 'no') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list }}", {"d": {"k": 1, "j": [2]}}),
    ("{{ m.content.startswith('<tool') }} {{ m.content.endswith(('x', '>')) }} {{ m.content.split('>')[0] }}", {"m": {"content": "<tool_response>"}}),
    ("{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ s.strip(' a') }}|{{ s.split() }}|{{ s.split(' ', 1) }}|{{ s.rsplit(None, 1) }}", {"s": "  a b\tc  "}),
    ("{{ s.upper() }} {{ s.lower() }} {{ s.title() }} {{ s.capitalize() }} {{ s.replace('l', 'L', 1) }} {{ s.find('l') }} {{ s.count('l') }}", {"s": "hello wörld ß"}),
    ("{{ ', '.join(['a', 'b']) }} {{ s.splitlines() }} {{ s.partition('\\n') }} {{ 'x'.center(5, '*') }} {{ '{} and {}'.format(1, 'b') }}", {"s": "a\nb\r\nc"}),
    ("{{ '%s is %d years, %.2f' % ('Ann', 30, 1.5) }} {{ '%(a)s' % {'a': 1} }} {{ '%05.1f|%-4d|%x' % (3.14159, 7, 255) }}", {}),
    # if / for / loop / set / namespace / macro / call / filter / with
    ("{% if x == 1 %}one{% elif x == 2 %}two{% else %}other{% endif %}", {"x": 2}),
    ("{% for i in l %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('a', 'b') }};{% endfor %}", {"l": [5, 6, 7]}),
    ("{% for i in l if i > 1 %}{{ i }}/{{ loop.length }} {% else %}none{% endfor %}{% for i in [] %}x{% else %}empty{% endfor %}", {"l": [1, 2, 3]}),
    ("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}{% for c in 'hé' %}[{{ c }}]{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}", {}),
    ("{% for m in l|reverse %}{{ m }}{% endfor %}{% for m in l[::-1] %}{{ m }}{% endfor %}{{ range(2, 9, 3)|list }}", {"l": [1, 2, 3]}),
    ("{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }}{% endfor %}{{ x }}", {}),
    ("{% for i in [1] %}{% for j in [1] %}[{{ x }}]{% endfor %}{% set x = 2 %}{% endfor %}[{{ x }}]", {"x": 1}),
    ("{% set ns = namespace(n=0, items=[]) %}{% for i in [1, 2, 3] %}{% set ns.n = ns.n + i %}{% set ns.items = ns.items + [i] %}{% endfor %}{{ ns.n }} {{ ns.items }}", {}),
    ("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t %}block {{ a }}{% endset %}[{{ t }}]{% set u | upper %}up{% endset %}{{ u }}", {}),
    ("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', punct='?') }} {{ greet(punct='.', name='Cy') }}", {}),
    ("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 + 1 }}{% endcall %}", {}),
    ("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}{% macro n(a, b) %}{{ a }}{{ b }}{% endmacro %}{{ n(*[1, 2]) }}{{ n(**{'a': 3, 'b': 4}) }}", {}),
    ("{% filter upper %}abc {{ 'd' }}{% endfilter %} {% with a = 1, b = 2 %}{{ a + b }}{% endwith %}", {}),
    ("{% generation %}assistant part{% endgeneration %} rest", {}),
    # filters
    ("{{ s|trim }}|{{ s|upper }}|{{ s|lower }}|{{ s|title }}|{{ s|capitalize }}|{{ s|length }}|{{ s|wordcount }}|{{ s|replace('o', '0') }}", {"s": "  hello-world (foo) wörld  "}),
    ("{{ x|tojson }}|{{ x|tojson(indent=2) }}|{{ x|tojson(separators=(',', ':')) }}|{{ x|tojson(sort_keys=true) }}|{{ x|tojson(ensure_ascii=true) }}", {"x": {"b": [1, 2.5, None, True], "a": "é\n\"\\\u0001 🚀", "c": {}}}),
    ("{{ l|first }} {{ l|last }} {{ l|length }} {{ l|count }} {{ l|join('-') }} {{ l|sort|list }} {{ l|sort(reverse=true) }} {{ l|unique|list }} {{ l|sum }} {{ l|min }} {{ l|max }}", {"l": [3, 1, 2, 3]}),
    ("{{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ ['a', 'A']|unique|list }} {{ ['b', 'A']|max }}", {}),
    ("{{ m|selectattr('role', 'equalto', 'user')|list|length }} {{ m|rejectattr('role', 'eq', 'user')|map(attribute='content')|join(',') }} {{ m|map(attribute='role')|list }} {{ m|selectattr('x')|list }}", {"m": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b", "x": 1}]}),
    ("{{ [1, 0, 2]|select|list }} {{ [1, 0, 2]|reject|list }} {{ [1, 2, 3]|select('odd')|list }} {{ ['a', 'bb']|map('length')|list }} {{ ['a', 'b']|map('upper')|list }}", {}),
    ("{{ u|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }} {{ u|d('x') }}", {}),
    ("{{ '3'|int + 1 }} {{ '2.5'|float }} {{ 'x'|int }} {{ 3.7|int }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ -1|abs }} {{ 7|string ~ '!' }}", {}),
    ("{{ d|items|list }} {{ d|dictsort }} {{ d|dictsort(by='value', reverse=true) }} {{ d|list }}", {"d": {"b": 1, "a": 2}}),
    ("{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'long text here'|truncate(9) }}|{{ '<b>'|e }}|{{ [1, 2, 3, 4, 5]|batch(2)|list }}", {}),
    # tests
    ("{{ u is defined }} {{ u is undefined }} {{ none is none }} {{ 's' is string }} {{ 1 is number }} {{ true is number }} {{ 1 is integer }} {{ 1.0 is float }} {{ true is boolean }}", {}),
    ("{{ d is mapping }} {{ l is mapping }} {{ l is iterable }} {{ 's' is sequence }} {{ 1 is iterable }} {{ true is true }} {{ 1 is true }} {{ false is false }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }}", {"d": {}, "l": []}),
    ("{{ 2 is in [1, 2] }} {{ 2 is eq 2 }} {{ 2 is ne 3 }} {{ 2 is lt 3 }} {{ 'ab' is lower }} {{ 'AB' is upper }} {{ none is sameas none }} {{ f is callable }} {{ 'length' is filter }} {{ 'odd' is test }}", {"f": None}),
    # undefined behaviour
    ("[{{ u }}] [{{ u|trim }}] [{{ u|length }}] {{ u is iterable }} {% for x in u %}never{% endfor %} {{ not u }} {{ u == u }} [{{ d.missing }}] {{ d.missing is defined }}", {"d": {}}),
    # sandbox and errors: both must raise
    ("{{ u.attr }}", {}),
    ("{{ 'a' + u }}", {}),
    ("{{ l.append(1) }}", {"l": []}),
    ("{{ d.update({}) }}", {"d": {}}),
    ("{{ 1 / 0 }}", {}),
    ("{{ 1 < 'a' }}", {}),
    ("{{ raise_exception('boom') }}", {}),
    ("{% for a, b in [[1, 2, 3]] %}{% endfor %}", {}),
    ("{% set x = 1 %}{% set x.attr = 2 %}", {}),
    ("{{ [1, 2]|select|length }}", {}),
    ("{{ range(1000000)|length }}", {}),
    ("{{ 'x'|no_such_filter }}", {}),
    ("{% if x %}{{ 'x'|no_such_filter }}{% endif %}ok", {"x": False}),
    ("{% for x in [1] %}", {}),
    ("{{ 1 + }}", {}),
    ("{% include 'other' %}", {}),
    ("{% endif %}", {}),
]


# transformers refuses an empty conversation; the engine cases do not read this one message.
ONE_MESSAGE = [{"role": "user", "content": "unused"}]


def render_many_templates(cases, name, tmp_path):
    """(lathe result or 'ERROR', transformers' result or 'ERROR') per (template, variables)."""
    config_path = shared_config(name)
    results = []
    for i, (template, variables) in enumerate(cases):
        ref = hf_render(name, ONE_MESSAGE, False, None, variables, template)
        tfile = tmp_path / f"t{i}.jinja"
        tfile.write_text(template, encoding="utf-8", newline="")
        try:
            got = lathe_render(config_path, [{"messages": ONE_MESSAGE}], tmp_path,
                               template_file=tfile, kwargs=variables)[0]
        except RuntimeError:
            got = "ERROR"
        results.append((got, "ERROR" if isinstance(ref, Exception) else ref))
    return results


def check_cases(cases, tmp_path, min_rendered=0):
    results = render_many_templates(cases, "qwen3", tmp_path)
    bad = [i for i, (got, ref) in enumerate(results) if got != ref]
    rendered = sum(1 for got, ref in results if ref != "ERROR")
    print(f"{len(cases)} templates ({rendered} render, {len(cases) - rendered} raise in transformers): "
          f"{len(bad)} mismatches")
    for i in bad[:SHOW]:
        print("template:", repr(cases[i][0])[:400])
        print("  transformers:", repr(results[i][1])[:400])
        print("  lathe: ", repr(results[i][0])[:400])
    assert not bad
    assert rendered >= min_rendered


def test_engine_constructs(tmp_path):
    check_cases(CONSTRUCTS, tmp_path, min_rendered=45)


def random_whitespace_template(rng, pieces):
    texts = ["", " ", "  ", "\n", "\n\n", "a", " a ", "\t", "x\n  ", "\n  ", "  \n", "\r\n", " \u00a0",
             "\u3000\n", "é"]

    def sign():
        return rng.choice(["", "", "-", "+"])

    def piece(depth=0):
        r = rng.random()
        if r < 0.3:
            return rng.choice(texts)
        if r < 0.45:
            return ("{{" + rng.choice(["", "-"]) + rng.choice(["", " ", "\n"]) +
                    rng.choice(["'v'", "1", "x", "loop.index if loop is defined else 0"]) +
                    rng.choice(["", " ", "\t"]) + rng.choice(["", "-"]) + "}}")
        if r < 0.55:
            return "{#" + sign() + rng.choice([" c ", "", "\n"]) + sign() + "#}"
        if r < 0.62:
            return "{%" + sign() + rng.choice([" ", "\n", "\t"]) + "set x = 2 " + sign() + "%}"
        if r < 0.67:
            return ("{%" + rng.choice(["", "-"]) + " raw " + rng.choice(["", "-"]) + "%}" + rng.choice(texts) +
                    "{{ y }}" + rng.choice(texts) + "{%" + sign() + " endraw " + sign() + "%}")
        if depth > 2:
            return rng.choice(texts)
        body = "".join(piece(depth + 1) for _ in range(rng.randint(0, 4)))
        if r < 0.85:
            other = "".join(piece(depth + 1) for _ in range(2))
            return ("{%" + sign() + " if " + rng.choice(["true", "false", "x"]) + " " + sign() + "%}" + body +
                    rng.choice(["", "{%" + sign() + " else " + sign() + "%}" + other]) +
                    "{%" + sign() + " endif " + sign() + "%}")
        return ("{%" + sign() + " for i in [1, 2] " + sign() + "%}" + body +
                "{%" + sign() + " endfor " + sign() + "%}")

    return "".join(piece() for _ in range(pieces))


def test_random_whitespace_templates(tmp_path):
    rng = random.Random(2024)
    cases = [(random_whitespace_template(rng, 25), {"x": 1}) for _ in range(40)]
    check_cases(cases, tmp_path, min_rendered=40)


EXPR_ATOMS = ["1", "0", "-3", "2.5", "0.1", "1e20", "'a'", "'Hello World'", "''", "' x '", "'é\\nü'", "none",
              "true", "false", "[1, 2, 3]", "[]", "['b', 'A', 'c']", "(1, 'x')", "{'k': 1, 'j': [2]}", "{}", "u",
              "s", "n", "f", "l", "d", "m", "m[0]", "m[-1]", "d.k", "l[1:]", "s[::-1]", "d.get('z', 5)", "l|first"]
EXPR_OPS = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "and", "or"]
EXPR_FILTERS = ["length", "upper", "lower", "title", "capitalize", "trim", "string", "list", "first", "last",
                "reverse|list", "tojson", "tojson(indent=2)", "int", "float", "abs", "default('D')",
                "default('D', true)", "join(',')", "sort|list", "unique|list", "items|list", "dictsort", "round",
                "sum", "max", "min", "select|list", "reject|list", "map('string')|list", "replace('a', 'X')",
                "wordcount", "batch(2)|list", "center(9)", "truncate(9)"]
EXPR_TESTS = ["defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable",
              "sequence", "boolean", "true", "false", "odd", "even", "divisibleby(3)", "in([1, 'a'])", "eq(1)",
              "lower", "upper", "callable"]
EXPR_METHODS = ["upper()", "lower()", "strip()", "split()", "split(',')", "startswith('a')", "endswith('d')",
                "replace('l', 'L')", "title()", "find('l')", "count('l')", "rstrip('d ')", "capitalize()",
                "splitlines()", "isdigit()", "keys()|list", "values()|list", "items()|list", "index(2)"]
EXPR_VARS = {"s": "Hello, World", "n": 7, "f": -1.5, "l": [3, 1, 2], "d": {"k": 1, "j": [2]},
             "m": [{"role": "user", "content": "hi"}]}


def random_expression(rng, depth=0):
    r = rng.random()
    if depth > 2 or r < 0.3:
        return rng.choice(EXPR_ATOMS)
    sub = lambda: random_expression(rng, depth + 1)  # noqa: E731
    if r < 0.55:
        return f"({sub()} {rng.choice(EXPR_OPS)} {sub()})"
    if r < 0.7:
        return f"({sub()})|{rng.choice(EXPR_FILTERS)}"
    if r < 0.8:
        return f"({sub()} is {rng.choice(['', 'not '])}{rng.choice(EXPR_TESTS)})"
    if r < 0.88:
        return f"({sub()}).{rng.choice(EXPR_METHODS)}"
    if r < 0.94:
        return f"({sub()} if {sub()} else {sub()})"
    return f"(not {sub()})"


def test_random_expressions(tmp_path):
    """Expressions that render in jinja2 are packed 25 to a template; others one to a template."""
    rng = random.Random(99)
    ok, failing = [], []
    while len(ok) < 1000:
        e = random_expression(rng)
        ref = hf_render("qwen3", ONE_MESSAGE, kwargs=EXPR_VARS, template="{{ " + e + " }}")
        if isinstance(ref, Exception):
            if len(failing) < 20 and "OverflowError" not in type(ref).__name__:
                failing.append(e)
        elif "Markup" not in ref and "at 0x" not in ref and len(str(ref)) < 2000:
            ok.append(e)
    cases = [("|".join("{{ " + e + " }}" for e in ok[i:i + 25]), EXPR_VARS) for i in range(0, len(ok), 25)]
    cases += [("{{ " + e + " }}", EXPR_VARS) for e in failing]
    check_cases(cases, tmp_path, min_rendered=40)


# --- loading ------------------------------------------------------------------------------------

def test_named_templates_and_tool_use(tmp_path):
    config = {"bos_token": {"content": "<B>", "special": True}, "eos_token": "<E>",
              "chat_template": [
                  {"name": "default", "template": "{{ bos_token }}default:{{ messages|length }}{{ eos_token }}"},
                  {"name": "tool_use", "template": "tool_use:{{ tools|length }}"},
                  {"name": "rag", "template": "rag"}]}
    path = tmp_path / "tokenizer_config.json"
    path.write_text(json.dumps(config))
    m = [{"role": "user", "content": "x"}]
    # transformers picks "tool_use" when tools are given, "default" otherwise.
    assert lathe_render(path, [{"messages": m}, {"messages": m, "tools": TOOLS}], tmp_path) == \
        ["<B>default:1<E>", "tool_use:2"]
    proc, _ = run_lathe(["render", "--tokenizer-config", str(path), "--template-name", "rag"], [{"messages": m}], tmp_path)
    assert proc.returncode == 0
    proc, _ = run_lathe(["render", "--tokenizer-config", str(path), "--template-name", "nope"], [{"messages": m}], tmp_path)
    assert proc.returncode != 0 and "'nope'" in proc.stderr and "'rag'" in proc.stderr


def test_chat_template_jinja_beside_config(tmp_path):
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}\n")
    got = lathe_render(tmp_path / "tokenizer_config.json", [{"messages": [{"role": "user", "content": "a"}]}], tmp_path)
    assert got == ["a</s>"]


def test_errors_name_template_and_line(tmp_path):
    config_path = shared_config("qwen3")
    tfile = tmp_path / "broken.jinja"
    tfile.write_text("line one\n{% for m in messages %}\n{{ m.content }}\n")
    with pytest.raises(RuntimeError) as err:
        lathe_render(config_path, [{"messages": []}], tmp_path, template_file=tfile)
    assert "broken.jinja" in str(err.value) and "endfor" in str(err.value) and "line 2" in str(err.value)
    tfile.write_text("a\nb\n{{ messages[0].content.nope.deeper }}")
    with pytest.raises(RuntimeError) as err:
        lathe_render(config_path, [{"messages": [{"role": "user", "content": "x"}]}], tmp_path, template_file=tfile)
    assert "broken.jinja', line 3" in str(err.value) and "in.jsonl:1" in str(err.value)
    # A malformed input line names the file and line.
    inp = tmp_path / "bad.jsonl"
    inp.write_text('{"messages": [{"role": "user", "content": "x"}]}\n{"messages": [}\n')
    proc = subprocess.run([LATHE, "chat", "render", "--tokenizer-config", str(config_path), "--input", str(inp)],
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "bad.jsonl:2" in proc.stderr


# --- token ids and labels -------------------------------------------------------------------------

def gptneox_build_chat(name, chat, generation_role="assistant", only_last=False, tools=None,
                       template=None, append_eos=False):
    """GPT-NeoX's build_chat() (masking on), its apply_chat_template being transformers' own:
    the tokens each prefix adds beyond the previous prefix's form that turn. GPT-NeoX appends
    eos_token after every conversation; `append_eos` says whether lathe does for this one."""
    tokens, mask = [], []
    for i, turn in enumerate(chat):
        add_gen = False if i == len(chat) - 1 else chat[i + 1]["role"] == generation_role
        chat_tokens = hf_ids(name, chat[:i + 1], add_gen, tools, template)[len(tokens):]
        tokens.extend(chat_tokens)
        if (only_last and i != len(chat) - 1) or turn["role"] != generation_role:
            mask.extend([IGNORE] * len(chat_tokens))
        else:
            mask.extend(chat_tokens)
    if append_eos:
        eos_id = hf_tokenizer(name).eos_token_id
        mask.append(eos_id if mask[-1] != IGNORE else IGNORE)
        tokens.append(eos_id)
    return tokens, mask


def mask_trailing_header(name, chat, ref, generation_role="assistant"):
    """GPT-NeoX's labels with the Llama-3 base template's trailing assistant header (rendered
    after the last turn's <|eot_id|>, even without add_generation_prompt) masked: build_chat
    slices it into the last turn, lathe gives it no loss, as it gives none to every other header."""
    ids, labels = ref
    if name != "llama3" or chat[-1]["role"] != generation_role:
        return ref
    header = hf_tokenizer(name).encode("<|start_header_id|>assistant<|end_header_id|>\n\n",
                                       add_special_tokens=False)
    assert ids[-len(header):] == header
    return ids, labels[:-len(header)] + [IGNORE] * len(header)


def prefix_tokens_stable(name, chat, tools=None, template=None):
    """Whether every prefix rendering's tokens start the full rendering's tokens."""
    full = hf_ids(name, chat, False, tools, template)
    for i in range(len(chat) - 1):
        add_gen = chat[i + 1]["role"] == "assistant"
        ids = hf_ids(name, chat[:i + 1], add_gen, tools, template)
        if full[:len(ids)] != ids:
            return False
    return True


def lathe_encode(name, convs, tmp_path, extra=(), template_file=None):
    args = ["encode", "--tokenizer", str(SHARED / "tokenizers" / f"{name}.json"),
            "--tokenizer-config", str(shared_config(name)), *extra]
    if template_file is not None:
        args += ["--chat-template", str(template_file)]
    proc, out = run_lathe(args, convs, tmp_path, name=f"{name}.jsonl")
    assert proc.returncode == 0, proc.stderr
    with open(out) as f:
        return [json.loads(line) for line in f]


# Where each assistant turn's body starts and what opens a turn, per template, to read the loss
# text off the full rendering without lathe's alignment.
TURN_MARKUP = {"llama3": ("<|end_header_id|>\n\n", "<|start_header_id|>"),
               "qwen3": ("\n", "<|im_start|>")}


def expected_loss_text(name, text, messages):
    """What carries loss, read off the full rendering's structure (independently of lathe):
    each assistant turn's body after its header, end-of-turn included."""
    header, open_tag = TURN_MARKUP[name]
    blocks = text.split(open_tag)[1:]
    out = ""
    for i, block in enumerate(blocks):
        role, _, body = block.partition(header)
        if role != "assistant":
            continue
        last = i == len(blocks) - 1
        if name == "llama3" and last:
            # The Llama-3 base template always ends with an (empty) assistant header; it follows
            # the last turn's <|eot_id|> and carries no loss.
            continue
        out += body
    return out


def llama2_conversation(rng):
    msgs = [{"role": "system", "content": rng.choice(TEXTS)}] if rng.random() < 0.5 else []
    for _ in range(rng.randint(1, 4)):
        msgs.append({"role": "user", "content": rng.choice(TEXTS)})
        msgs.append({"role": "assistant", "content": rng.choice(TEXTS)})
    if rng.random() < 0.3:
        msgs.pop()
    return msgs


def encode_cases(name, rng, n):
    """(conversations, chat template override or None) for one shared tokenizer_config."""
    if name == "llama2":  # the shared config has no template: the Llama-2-style one
        return [{"messages": llama2_conversation(rng)} for _ in range(n)], LLAMA2_STYLE
    convs = []
    for i in range(n):
        c = {"messages": make_conversation(rng, tools=name == "qwen3", reasoning=True)}
        if name == "qwen3" and i % 3 == 0:
            c["tools"] = TOOLS
        convs.append(c)
    return convs, None


@pytest.mark.parametrize("name", NAMES)
def test_encode_equals_apply_chat_template(tmp_path, name):
    """The whole token sequence is transformers' apply_chat_template(tokenize=True), with no
    end token appended (each template ends its turns itself); labels keep each assistant turn,
    as GPT-NeoX's build_chat() slices it where prefixes are token-stable, except the Llama-3
    template's trailing assistant header, which lathe masks (mask_trailing_header)."""
    rng = random.Random(5)
    convs, template = encode_cases(name, rng, 60)
    template_file = None
    if template is not None:
        template_file = tmp_path / f"{name}.jinja"
        template_file.write_text(template, encoding="utf-8")
    assert any(c["messages"][0]["role"] == "system" for c in convs)
    assert sum(1 for c in convs if sum(m["role"] == "assistant" for m in c["messages"]) > 1) >= 5
    if name == "qwen3":
        assert sum(1 for c in convs if "tools" in c) >= 10
        assert any(m.get("tool_calls") for c in convs for m in c["messages"])
    stable = [prefix_tokens_stable(name, c["messages"], c.get("tools"), template) for c in convs]
    print(f"{name}: {sum(stable)} of {len(convs)} conversations have prefix-stable tokens")
    assert sum(stable) >= 5
    tok = hf_tokenizer(name)
    for extra, only_last in [((), False), (("--only-last",), True)]:
        got = lathe_encode(name, convs, tmp_path, extra, template_file)
        assert len(got) == len(convs)
        bad = 0
        for c, g, st in zip(convs, got, stable):
            msgs, tools = c["messages"], c.get("tools")
            full = hf_ids(name, msgs, False, tools, template)
            assert g["ids"] == full, (msgs, g["ids"][-5:], full[-5:])
            assert len(g["labels"]) == len(g["ids"])
            assert all(l in (IGNORE, i) for i, l in zip(g["ids"], g["labels"]))
            if st:  # GPT-NeoX's labels whenever prefixes are token-stable
                ref = mask_trailing_header(
                    name, msgs, gptneox_build_chat(name, msgs, only_last=only_last, tools=tools,
                                                   template=template))
                ok = (g["ids"], g["labels"]) == ref
            else:  # otherwise GPT-NeoX mis-slices; the loss is each assistant turn's own text.
                ref = None
                kept = [i for i, l in zip(g["ids"], g["labels"]) if l != IGNORE]
                text = hf_render(name, msgs, tools=tools, template=template)
                want = expected_loss_text(name, text, msgs)
                if only_last:
                    ok = not kept or msgs[-1]["role"] == "assistant"
                else:
                    # (through the tokenizer, so that its normalizer, e.g. qwen3's NFC, applies)
                    want = tok.decode(tok.encode(want, add_special_tokens=False),
                                      skip_special_tokens=False)
                    ok = tok.decode(kept, skip_special_tokens=False) == want
            if not ok:
                bad += 1
                if bad <= SHOW:
                    print("messages:", json.dumps(msgs, ensure_ascii=False)[:300])
                    print("  expected:", ref[1] if ref else want)
                    print("  lathe:   ", g["labels"])
        assert bad == 0
    # --no-mask: labels are the ids (GPT-NeoX --no-mask).
    got = lathe_encode(name, convs[:10], tmp_path, ("--no-mask",), template_file)
    for c, g in zip(convs, got):
        full = hf_ids(name, c["messages"], False, c.get("tools"), template)
        assert g["ids"] == full and g["labels"] == full


def test_qwen3_conversation_ends_with_one_im_end(tmp_path):
    """qwen3's template ends a turn with <|im_end|>\\n; lathe appends no second <|im_end|>."""
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "Seven."}]
    g = lathe_encode("qwen3", [{"messages": msgs}], tmp_path)[0]
    tok = hf_tokenizer("qwen3")
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == im_end
    assert g["ids"] == hf_ids("qwen3", msgs)
    assert g["ids"][-2:] == [im_end, tok.convert_tokens_to_ids("\u010a")]  # "<|im_end|>", "\n"
    assert g["ids"].count(im_end) == 3
    assert g["labels"][-2:] == g["ids"][-2:]


# A plain-text template: no special token marks the end of a turn.
PLAIN = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"


def test_eos_appended_only_where_the_template_does_not_end_the_turn(tmp_path):
    template_file = tmp_path / "plain.jinja"
    template_file.write_text(PLAIN, encoding="utf-8")
    rng = random.Random(17)
    convs = [{"messages": llama2_conversation(rng)} for _ in range(30)]
    ends_with_assistant = [c["messages"][-1]["role"] == "assistant" for c in convs]
    assert 0 < sum(ends_with_assistant) < len(convs)
    tok = hf_tokenizer("llama2")
    eos = tok.convert_tokens_to_ids("</s>")
    got = lathe_encode("llama2", convs, tmp_path, (), template_file)
    for c, g, appended in zip(convs, got, ends_with_assistant):
        msgs = c["messages"]
        full = hf_ids("llama2", msgs, template=PLAIN)
        # eos_token follows a final assistant turn, with its loss; nothing follows a user turn.
        assert g["ids"] == full + ([eos] if appended else [])
        if prefix_tokens_stable("llama2", msgs, template=PLAIN):
            assert (g["ids"], g["labels"]) == gptneox_build_chat("llama2", msgs, template=PLAIN,
                                                                 append_eos=appended)
        if appended:
            assert g["labels"][-1] == eos
    # --no-eos: never appended.
    got = lathe_encode("llama2", convs, tmp_path, ("--no-eos",), template_file)
    for c, g in zip(convs, got):
        assert g["ids"] == hf_ids("llama2", c["messages"], template=PLAIN)


def test_llama2_encode_without_template_fails(tmp_path):
    args = ["encode", "--tokenizer", str(SHARED / "tokenizers" / "llama2.json"),
            "--tokenizer-config", str(shared_config("llama2"))]
    proc, _ = run_lathe(args, [{"messages": [{"role": "user", "content": "hi"}]}], tmp_path)
    assert proc.returncode != 0 and "--chat-template" in proc.stderr, proc.stderr


def test_labels_when_template_rewrites_history(tmp_path):
    """qwen3 drops an assistant turn's reasoning once a later user turn exists, so the rendering
    of a prefix is not a prefix of the full rendering. GPT-NeoX then slices tokens by count and
    emits tokens of no rendering; lathe keeps the full rendering's tokens and gives each assistant
    turn exactly its text in that rendering."""
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\nIt is 4."},
        {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "<think>\nadd again\n</think>\n\nIt is 6."},
    ]
    full_text = hf_render("qwen3", msgs)
    assert "add them" not in full_text and "add again" in full_text  # history rewritten
    assert not prefix_tokens_stable("qwen3", msgs)
    ref_ids, _ = gptneox_build_chat("qwen3", msgs)
    full = hf_ids("qwen3", msgs)
    assert ref_ids != full  # GPT-NeoX's tokens are not the conversation's tokens

    g = lathe_encode("qwen3", [{"messages": msgs}], tmp_path)[0]
    assert g["ids"] == full
    kept = [i for i, l in zip(g["ids"], g["labels"]) if l != IGNORE]
    # The loss covers each assistant turn as the full rendering shows it, end-of-turn included;
    # nothing else (headers, system, user) carries loss.
    assert hf_tokenizer("qwen3").decode(kept, skip_special_tokens=False) == (
        "It is 4.<|im_end|>\n" + "<think>\nadd again\n</think>\n\nIt is 6.<|im_end|>\n")
