"""Checks kiri's chat-template renderer against jinja2, the renderer Hugging Face transformers uses.

The reference environment is set up the way transformers' chat_template_utils sets up its own:
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols
extension, a `generation` block tag, `raise_exception`, and `tojson` replaced by
json.dumps(ensure_ascii=False). Templates are rendered with messages, add_generation_prompt,
bos_token, eos_token, tools=None and documents=None, as apply_chat_template passes them, and
transformers' strftime_now (datetime.now().strftime). Both sides read the wall clock in UTC (TZ is
set for this process and the renderer it starts); a comparison that straddles a change of the
clock's shown value is rendered again.

The templates: the two inside the tokenizer vectors (Llama 3 and Qwen3), read with gguf-py, and
the published templates of common models written out under tests/data/chat_templates/, each over
several conversations with and without the generation prompt; plus a table of small templates for
the expression language. Output must be byte-identical; where jinja2 fails, kiri must fail too,
and for raise_exception with the same message.

The render_template binary comes from $KIRI_RENDER_TEMPLATE, else $KIRI_BUILD/render_template, else
<repo>/build/render_template; the tests skip when it was not built.
Run: ~/.cache/kiri/venv/bin/python -m pytest -q tests/test_chat_template.py
"""
import functools
import json
import os
import subprocess
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

jinja2 = pytest.importorskip("jinja2")
from jinja2 import nodes  # noqa: E402
from jinja2.exceptions import TemplateError  # noqa: E402
from jinja2.ext import Extension, loopcontrols  # noqa: E402
from jinja2.sandbox import ImmutableSandboxedEnvironment  # noqa: E402

# jinja2 warns about the unknown escape "\\q" that one small template tests on purpose
pytestmark = pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")

ROOT = Path(__file__).resolve().parent.parent
TOOL = os.environ.get("KIRI_RENDER_TEMPLATE") or str(
    Path(os.environ.get("KIRI_BUILD", str(ROOT / "build"))) / "render_template")
if not os.path.exists(TOOL):
    # render_template is built with the server (KIRI_SERVER), which needs Jansson
    pytest.skip(f"{TOOL} not built", allow_module_level=True)
SHARED = Path(os.environ.get("KIRI_SHARED_DIR", str(ROOT.parent / "shared")))
DATA = ROOT / "tests" / "data" / "chat_templates"


class RaisedByTemplate(TemplateError):
    pass


class GenerationTag(Extension):
    """transformers' {% generation %} marker, which renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser):
        next(parser.stream)
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body)


def reference_env():
    def raise_exception(message):
        raise RaisedByTemplate(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    def strftime_now(format):  # transformers' own definition
        return datetime.now().strftime(format)

    env.globals["strftime_now"] = strftime_now
    return env


os.environ["TZ"] = "UTC"
time.tzset()


ENV = reference_env()


def reference(source, messages, bos, eos, gen):
    """('ok', bytes) or ('raise', message) or ('error', description)."""
    msgs = [{"role": r, "content": c} for r, c in messages]
    kwargs = {}
    if bos is not None:
        kwargs["bos_token"] = bos
    if eos is not None:
        kwargs["eos_token"] = eos
    try:
        out = ENV.from_string(source).render(messages=msgs, tools=None, documents=None,
                                             add_generation_prompt=gen, **kwargs)
    except RaisedByTemplate as e:
        return "raise", str(e)
    except Exception as e:  # any jinja2 failure: kiri must fail as well
        return "error", f"{type(e).__name__}: {e}"
    return "ok", out.encode()


def run_render(args):
    """Runs render_template with args: ("ok", bytes), ("raise", message) or ("error", stderr)."""
    p = subprocess.run(args, capture_output=True, timeout=60)
    if p.returncode == 0:
        return "ok", p.stdout
    if p.returncode != 1:
        raise AssertionError(f"render_template crashed ({p.returncode}): {p.stderr.decode()}")
    err = p.stderr.decode()
    if err.startswith("E_INVALID_ARG raise_exception: "):
        return "raise", err[len("E_INVALID_ARG raise_exception: "):].rstrip("\n")
    return "error", err


def kiri(path, messages, bos, eos, gen):
    args = [TOOL, str(path)]
    if bos is not None:
        args += ["--bos", bos]
    if eos is not None:
        args += ["--eos", eos]
    if gen:
        args.append("--gen")
    for role, content in messages:
        args += ["--none", role] if content is None else [role, content]
    return run_render(args)


def same_clock(render_pair, tries=3):
    """render_pair() -> (want, got), rendered again while they differ (at most tries times in all):
    a template that shows the time can see the clock move between the two renders."""
    want, got = render_pair()
    for _ in range(tries - 1):
        if want == got:
            break
        time.sleep(0.2)
        want, got = render_pair()
    return want, got


def check(path, source, messages, bos="<s>", eos="</s>", gen=False):
    want, got = same_clock(lambda: (reference(source, messages, bos, eos, gen),
                                    kiri(path, messages, bos, eos, gen)))
    if want[0] == "error":
        assert got[0] != "ok", f"jinja2 failed ({want[1]}) but kiri rendered {got[1]!r}"
        return want
    assert got == want, f"\njinja2: {want!r}\nkiri:   {got!r}"
    return want


# ------------------------------------------------------------------------------------------------
# Real templates
# ------------------------------------------------------------------------------------------------

CONVERSATIONS = {
    "user": [("user", "Hello!")],
    "system_user": [("system", "You are a helpful assistant."), ("user", "What is 2+2?")],
    "multi_turn": [("user", "Hi"), ("assistant", "Hello! How can I help?"),
                   ("user", "Tell me a joke.")],
    "system_multi_turn": [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello."),
                          ("user", "Bye")],
    "awkward_text": [
        ("system", "  spaces around  \n"),
        ("user", "Line one\nline two\ttab {{ not_jinja }} {% if x %} 'single' \"double\" \\ end"),
        ("assistant", "\n\nüñíçødé 漢字 😀 \u2028 <think>x</think>\n"),
        ("user", " \t "),
    ],
    "thinking": [("user", "2+2?"), ("assistant", "<think>\nadd them\n</think>\n\n4"),
                 ("user", "and 3+3?")],
    "tool": [("user", "Weather?"), ("assistant", "Let me check."), ("tool", '{"temp": 21}'),
             ("tool", "sunny"), ("user", "Thanks")],
    "assistant_none": [("user", "Call it"), ("assistant", None), ("tool", "done"),
                       ("user", "ok")],
    "empty": [],
}


@functools.lru_cache(maxsize=None)
def read_gguf_template(path):
    """The template text, or None when the file or gguf-py is missing (reading is slow: once)."""
    try:
        import gguf
    except ImportError:
        return None
    if not Path(path).exists():
        return None
    field = gguf.GGUFReader(path).fields["tokenizer.chat_template"]
    return bytes(field.parts[field.data[0]]).decode()


def gguf_template(name):
    source = read_gguf_template(str(SHARED / "tokenizer-vectors" / name))
    if source is None:
        pytest.skip(f"no gguf-py or no {name}")
    return source


TEMPLATE_FILES = sorted(p.name for p in DATA.glob("*.jinja"))
GGUF_TEMPLATES = ["ggml-vocab-llama-bpe.gguf", "ggml-vocab-qwen2.gguf"]


@pytest.fixture(scope="module")
def tmpdir_module():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


def template_source(name, tmp):
    if name.endswith(".gguf"):
        source = gguf_template(name)
        path = tmp / (name + ".jinja")
        path.write_text(source, encoding="utf-8")
        return path, source
    path = DATA / name
    return path, path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", TEMPLATE_FILES + GGUF_TEMPLATES)
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("gen", [False, True])
def test_real_template(name, conversation, gen, tmpdir_module):
    path, source = template_source(name, tmpdir_module)
    check(path, source, CONVERSATIONS[conversation], gen=gen)


@pytest.mark.parametrize("name", TEMPLATE_FILES + GGUF_TEMPLATES)
def test_real_template_renders(name, tmpdir_module):
    """Every template renders a plain conversation (no error on either side)."""
    path, source = template_source(name, tmpdir_module)
    # Gemma (1/2) and Mistral v0.1 refuse a system message, on both sides
    no_system = name in ("gemma.jinja", "mistral.jinja")
    conv = CONVERSATIONS["multi_turn" if no_system else "system_multi_turn"]
    assert check(path, source, conv, gen=True)[0] == "ok"


@pytest.mark.parametrize("name", ["chatml.jinja", "zephyr.jinja", "llama31.jinja"])
def test_without_special_tokens(name, tmpdir_module):
    """bos_token and eos_token undefined (a model without them) render as empty."""
    path, source = template_source(name, tmpdir_module)
    check(path, source, CONVERSATIONS["system_multi_turn"], bos=None, eos=None, gen=True)


def test_builtin_chatml_matches_file():
    conv = CONVERSATIONS["system_multi_turn"]
    source = (DATA / "chatml.jinja").read_text(encoding="utf-8")
    want = reference(source, conv, "<s>", "</s>", True)
    assert kiri("-chatml", conv, "<s>", "</s>", True) == want


# ------------------------------------------------------------------------------------------------
# The templates the edge families ship (llama.cpp's tree), with tools, tool calls, tool results and
# enable_thinking, through kiri_chat_template_render_json_vars
# ------------------------------------------------------------------------------------------------

FAMILY_TEMPLATES = [
    "google-gemma-4-31B-it.jinja", "google-gemma-4-31B-it-interleaved.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja", "HuggingFaceTB-SmolLM3-3B.jinja",
    "ibm-granite-granite-3.3-2B-Instruct.jinja", "ibm-granite-granite-4.0.jinja",
    "ibm-granite-granite-4.1.jinja",
]

WEATHER_TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "unit": {"type": "string", "enum": ["c", "f"], "description": "Unit"},
            "days": {"type": "integer"}, "detail": {"type": "boolean", "nullable": True},
            "tags": {"type": "array", "items": {"type": "string"}},
            "where": {"type": "object", "properties": {"lat": {"type": "number"}},
                      "required": ["lat"]}},
            "required": ["city"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time",
                                      "parameters": {"type": "object", "properties": {}}}},
]


def tool_call(name, args, call_id="call_1"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


JSON_CONVERSATIONS = {
    "user": [{"role": "user", "content": "Hello!"}],
    "system_multi": [
        {"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}],
    "tool_round": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 2, "tags": ["a"]})]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
         "content": '{"temp": 21}'},
        {"role": "assistant", "content": "It is 21 degrees."},
        {"role": "user", "content": "Thanks"}],
    "two_calls": [
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": "Checking.", "tool_calls": [
            tool_call("get_weather", {"city": "Oslo", "unit": "c"}, "c1"),
            tool_call("now", {}, "c2")]},
        {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": "cold"},
        {"role": "tool", "tool_call_id": "c2", "name": "now", "content": "noon"}],
    "string_arguments": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "",
         "tool_calls": [tool_call("get_weather", '{"city": "Rome"}')]},
        {"role": "tool", "tool_call_id": "call_1", "content": "warm"}],
    "thinking": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd\n</think>\n\n4"},
        {"role": "user", "content": "and 3+3?"}],
}


def json_reference(source, messages, tools, gen, extra):
    try:
        out = ENV.from_string(source).render(messages=messages, tools=tools, documents=None,
                                             add_generation_prompt=gen, bos_token="<bos>",
                                             eos_token="<eos>", **extra)
    except RaisedByTemplate as e:
        return "raise", str(e)
    except Exception as e:  # any jinja2 failure: kiri must fail as well
        return "error", f"{type(e).__name__}: {e}"
    return "ok", out.encode()


def json_kiri(path, messages, tools, gen, extra, tmp):
    files = {}
    for name, value in (("messages", messages), ("tools", tools), ("vars", extra)):
        files[name] = tmp / f"{name}.json"
        files[name].write_text(json.dumps(value), encoding="utf-8")
    args = [TOOL, str(path), "--json", str(files["messages"]), "--bos", "<bos>", "--eos", "<eos>"]
    if tools is not None:
        args += ["--tools", str(files["tools"])]
    if extra:
        args += ["--vars", str(files["vars"])]
    if gen:
        args.append("--gen")
    return run_render(args)


@functools.lru_cache(maxsize=None)
def family_template(name):
    from conftest import llama_cpp_source
    path = llama_cpp_source() / "models" / "templates" / name
    return path, path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", FAMILY_TEMPLATES + ["gemma3.jinja"])
@pytest.mark.parametrize("conversation", sorted(JSON_CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [False, True])
def test_family_template(name, conversation, with_tools, tmp_path):
    if name == "gemma3.jinja":
        path = DATA / name
        source = path.read_text(encoding="utf-8")
    else:
        path, source = family_template(name)
    messages = JSON_CONVERSATIONS[conversation]
    tools = WEATHER_TOOLS if with_tools else None
    variants = [{}]
    if "enable_thinking" in source:
        variants += [{"enable_thinking": True}, {"enable_thinking": False}]
    for gen in (False, True):
        for extra in variants:
            want, got = same_clock(lambda: (json_reference(source, messages, tools, gen, extra),
                                            json_kiri(path, messages, tools, gen, extra, tmp_path)))
            if want[0] == "error":
                assert got[0] != "ok", f"jinja2 failed ({want[1]}) but kiri rendered {got[1]!r}"
                continue
            assert got == want, f"\n{gen=} {extra=}\njinja2: {want!r}\nkiri:   {got!r}"


@pytest.mark.parametrize("name", FAMILY_TEMPLATES)
def test_family_template_renders(name, tmp_path):
    """A plain conversation and a tool round render on both sides (not only fail alike); Granite
    3.3's puts today's date (strftime_now) into its system prompt."""
    path, source = family_template(name)
    for conv in ("system_multi", "two_calls"):
        want, got = same_clock(lambda: (
            json_reference(source, JSON_CONVERSATIONS[conv], WEATHER_TOOLS, True, {}),
            json_kiri(path, JSON_CONVERSATIONS[conv], WEATHER_TOOLS, True, {}, tmp_path)))
        assert want[0] == "ok", want
        assert got == want


def test_vars_refused(tmp_path):
    path = DATA / "chatml.jinja"
    msgs = JSON_CONVERSATIONS["user"]
    for extra in ({"messages": []}, {"tools": 1}):
        got = json_kiri(path, msgs, None, False, extra, tmp_path)
        assert got[0] == "error" and "vars" in got[1]


# ------------------------------------------------------------------------------------------------
# The expression language, one small template at a time
# ------------------------------------------------------------------------------------------------

SMALL = [
    # whitespace control: trim_blocks, lstrip_blocks, -, +, comments, raw
    "  {% if true %}\n  x\n  {% endif %}\n  {{ 1 }}\n {# c #}\ny",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "a\n  {%+ if true %}b{% endif +%}\nc",
    "{% for i in [1,2] %}\n  {{ i }}\n{% endfor %}\n",
    "x {{- ' y ' -}} z\n\n",
    "{# comment #}\nA{#- c -#}  B  {#+ keep #}\n  {# own line #}\nC",
    "{% raw %}{{ not evaluated }}{% endraw %}\n{%- raw -%}  {% x %}  {%- endraw %}|",
    "line1\r\nline2\rline3\n",
    "{{ '{{' }} {{ '}}' }} {{ {'a': {'b': 1}}['a'] }}",
    "  {{ 'v' }}  \n  {% set x = 1 %}  tail",
    "{% if true %}a{% else %}b{% endif %}\n\n",
    # literals and printing
    "{{ 1.0 }} {{ 0.1+0.2 }} {{ 1e20 }} {{ 1e16 }} {{ 1e15 }} {{ 3/2 }} {{ 4/2 }} {{ 1.5e-7 }} {{ 1_000 }} {{ 0x1f }} {{ 0b101 }} {{ 0o17 }}",
    "{{ [1,'a',none,true,{'k':\"it's\"}] }} {{ {'a':[1.0]} }} {{ (1,) }} {{ () }} {{ (1, 2) }}",
    "{{ 'a\\tb\\x41\\u00e9\\101\\q' }} {{ 'x' 'y' }} {{ \"q'q\" }}",
    "{{ ['a\\'b', 'a\"b', 'a\\'\"b', '\\n\\x01\\x7f\\xa0é\\u200b'] }}",
    "{{ none }} {{ None }} {{ true }} {{ False }} {{ -0.0 }} {{ 1e300*1e300 }}",
    # arithmetic and comparison
    "{{ 10 // 3 }} {{ -10 // 3 }} {{ 10 % -3 }} {{ 7.5 % 2 }} {{ -7.5 // 2 }} {{ 2 ** 0.5 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1/3 }} {{ 10/2 }}",
    "{{ true + 1 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' * 3 }}{{ 3 * 'a' }}{{ [1]*2 }} {{ -(3) }} {{ +2 }}",
    "{{ 'abc' < 'abd' }}{{ [1,2] < [1,3] }}{{ 1 < 2 < 3 }}{{ 3 > 2 > 2 }}{{ 2 >= 2 }}{{ 1 != 1 }}",
    "{{ 'ab' in 'cabd' }}{{ 1 in [1,2] }}{{ 'a' in {'a':1} }}{{ 'z' not in 'abc' }}{{ not 1 in [2] }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ [1] }}",
    "{{ 1 and 'x' }} {{ 0 and 'x' }} {{ '' or 'y' }} {{ 'z' or 'y' }} {{ not '' }}",
    "{{ 'a' if false }}|{{ 'a' if true else 'b' }}|{{ 'a' if false else 'b' if false else 'c' }}",
    "{{ 'a' + 1 }}",
    "{{ 1 < 'a' }}",
    "{{ 1 // 0 }}",
    # undefined
    "{{ x }}|{{ x|length }}{{ x|trim }}|{{ 'a' in x }}|{{ x == y }}|{{ x is defined }}{{ x is undefined }}",
    "{{ x.y }}",
    "{{ x + 1 }}",
    "{{ messages[5] is defined }} {{ messages[0].nope is defined }} {{ messages[0]['role'] }}",
    "{% for c in x %}{{ c }}{% else %}empty{% endfor %}",
    # indexing and slicing
    "{{ 'abc'[::-1] }} {{ [1,2,3][1:] }} {{ 'abc'[-1] }} {{ [1,2][5] }}| {{ 'héllo'[1] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::2] }}",
    "{{ [0,1,2,3,4,5][1:5:2] }} {{ [0,1,2,3][-2:] }} {{ [0,1,2,3][:-1] }} {{ [0,1,2,3][10:] }} {{ [0,1,2,3][::-2] }} {{ 'abc'[5:1:-1] }}",
    "{{ messages[-1]['role'] }} {{ messages[1:]|length }} {{ messages[::-1][0].role }} {{ messages.0.content }}",
    "{{ [1,2,3][1.5] }}|{{ 'abc'['x'] }}|{{ none.x }}|{{ 5.y }}",
    # for loops
    "{% for i in [1,2,3] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }};{% endfor %}",
    "{% for i in [1,2] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('a','b') }};{% endfor %}",
    "{% for a, b in [[1,2],[3,4]] %}{{a}}{{b}}{% endfor %}{% for k in {'x':1,'y':2} %}{{k}}{% endfor %}{% for c in 'hé' %}[{{c}}]{% endfor %}",
    "{% for x in [1,2,3] if x > 1 %}{{ loop.index }}/{{ loop.length }}{% else %}E{% endfor %}{% for x in [] %}{% else %}E{% endfor %}",
    "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% endfor %}",
    "{% for i in 'abc' %}{% break %}{% else %}E{% endfor %}|{% for i in 'ab' %}{% continue %}{% else %}E{% endfor %}|{% for i in 'ab' %}{% if i == 'b' %}{% break %}{% endif %}{% else %}E{% endfor %}",
    "{{ [1, 2][1:] }}{% set z = (messages[0].role == 'user')[1:] %}",
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in {'c': 3}|items %}{{ k }}{{ v }}{% endfor %}",
    "{% for i in [1,2] %}{% for j in [3,4] %}{{ loop.index }}{{ i }}{{ j }} {% endfor %}{{ loop.index }}|{% endfor %}",
    # scoping, set, namespace
    "{% for i in [1,2] %}{% if i == 2 %}{{ x }}{% endif %}{% set x = i %}{% endfor %}[{{ x }}]",
    "{% set x = 5 %}{% for i in [1,2] %}[{{ x }}]{% set x = i %}{% endfor %}{{x}}",
    "{% set x = 5 %}{% if true %}{% set x = 6 %}{% endif %}{{x}}",
    "{% set ns = namespace(a=1, b='x') %}{% for i in [1,2,3] %}{% set ns.a = ns.a + i %}{% endfor %}{{ ns.a }}{{ ns.b }}{{ ns['a'] }} {{ ns }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 1, %}{{ c }}",
    "{% set x %}  a {{ 1 }}\n{% endset %}[{{ x }}]{% set y | upper %}b{% endset %}{{ y }}",
    "{% set d = dict(a=1, b=[2]) %}{{ d }} {{ d.b[0] }} {{ namespace(d, c=3).c }}",
    "{% set x = 1 %}{{ x.y }}",
    "{% set x = 1 %}{% set x.y = 2 %}",
    # filters
    "{{ messages|selectattr('role','equalto','user')|list|length }} {{ messages|map(attribute='role')|join(',') }} {{ messages|selectattr('role','equalto','user')|first }}",
    "{{ [3,1,2]|reverse|join }} {{ 'abc'|reverse }} {{ 'héllo'|length }} {{ [1,2]|count }} {{ {'a':1}|length }}",
    "{{ {'a':1}.items()|list }} {{ {'a':1}|items|list }} {{ {'a':1}.keys()|list }} {{ {'a':1}.values()|list }}",
    "{{ 2.5|round }} {{ 3.5|round }} {{ 0.125|round(2) }} {{ 3|round }} {{ 2.7|round(0, 'floor') }} {{ 2.1|round(method='ceil') }}",
    "{{ '42.7'|int }} {{ 'x'|int(5) }} {{ ' 12 '|int }} {{ '0x1f'|int(0, 16) }} {{ 3.9|int }} {{ '3.5'|float }} {{ 'x'|float }} {{ 2|float }}",
    "{{ 'hello world-foo(bar'|title }} {{ 'HELLO wORLD 1st'.title() }} {{ 'aBC'|capitalize }} {{ 'MiXed'|lower }}{{ 'MiXed'|upper }}",
    "{{ 'héllo wörld'|upper }} {{ 'ÀÉÎ'|lower }} {{ 'ΑΒΓ'|lower }} {{ 'абв'|upper }}",
    "{{ 'a b'|tojson }} {{ {'b':1,'a':[1,{'c':None}]}|tojson(indent=2) }} {{ 1.0|tojson }} {{ (1,2)|tojson }}",
    "{{ 'é<\"\\n\\t\\x01'|tojson }} {{ 'é😀'|tojson(ensure_ascii=true) }} {{ {'b':1,'a':2}|tojson(sort_keys=true) }}",
    "{{ [1,[2]]|tojson(separators=[',', ':']) }} {{ {'a': []}|tojson(indent='--') }} {{ {1: true, none: 1.5}|tojson }}",
    "{{ x|tojson }}",
    "{{ 'x'|indent }}|{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent(2,blank=true) }}|{{ 'a\\n'|indent('>') }}|{{ ''|indent(first=true) }}",
    "{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }} {{ none|default('d') }} {{ x|d }}|",
    "{{ 'abc'|first }}{{ 'abc'|last }}{{ []|first }}|{{ [1,2]|last }}{{ {'k':1}|first }}",
    "{{ [1,'a']|join('-') }} {{ 5|string + 'x' }} {{ none|string }} {{ 'a<b&\"c\\''|e }} {{ 5|safe }}",
    "{{ ' x '|trim }}|{{ 'xxhixx'|trim('x') }}|{{ 5|trim }}|{{ 'aaa'|replace('a','b',2) }} {{ 1234|replace(2, 9) }}",
    "{{ [1,2,3]|select('odd')|list }} {{ [1,2,3]|reject('odd')|list }} {{ [0,1,'']|select|list }} {{ ['A','b']|map('lower')|list }}",
    "{{ messages|rejectattr('role','equalto','user')|map(attribute='content')|list }} {{ messages|map(attribute='nope', default='z')|list }}",
    "{{ [{'a': {'b': 1}}, {'a': {'b': 2}}]|map(attribute='a.b')|list }} {{ [[1,2],[3,4]]|map(attribute='1')|join }}",
    "{{ 0|map('upper')|list }} {{ none|select|list }} {{ ''|rejectattr('x')|list }} {{ [1, 2].count(1) }} {{ ['a', 'b'].index('b') }}",
    "{{ x|int }}",
    "{{ -3|abs }} {{ (-2.5)|abs }} {{ [1,2]|list }} {{ 'ab'|list }} {{ {'x':1}|list }}",
    "{{ 'a'|nope }}",
    # tests
    "{{ 1 is number }}{{ true is number }}{{ true is integer }}{{ none is none }}{{ 'a' is iterable }}{{ x is iterable }}{{ {} is sequence }}{{ {} is mapping }}",
    "{{ 3.25 is odd }}{{ -3 is odd }}{{ 3.0 is odd }}{{ -4.0 is even }}{{ 7 is divisibleby(-2) }}{{ true is odd }}",
    "{{ 2 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ 'a' is lower }}{{ 'A' is upper }}{{ '1' is lower }}",
    "{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 2 is le 2 }}{{ 3 is gt 2 }}{{ 1 is ge 2 }}{{ 1 is in [1] }}{{ none is sameas none }}",
    "{{ true is true }}{{ 1 is true }}{{ false is false }}{{ true is boolean }}{{ 1.5 is float }}{{ 's' is string }}{{ namespace is callable }}",
    "{{ 1 is not none }} {{ x is not defined }} {{ not x is defined }} {{ (1 is number) and (2 is number) }}",
    # string methods
    "{{ 'a,b,,c'.split(',') }}{{ '  a  b '.split() }}{{ 'a b c'.split(' ', 1) }}{{ ' a b '.split(None, 1) }}{{ ''.split() }}{{ ''.split(',') }}",
    "{{ ' x '.strip() }}|{{ 'xxhixx'.strip('x') }}|{{ '  a '.lstrip() }}|{{ ' a  '.rstrip() }}|{{ '\\n\\na\\n'.strip('\\n') }}|{{ '\\u3000a\\xa0'.strip() }}",
    "{{ 'hello'.startswith('he') }}{{ 'hello'.endswith('lo') }}{{ 'hello'.startswith(('x', 'h')) }}{{ 'hi'.endswith('xhi') }}",
    "{{ 'abc'.replace('', '-') }} {{ 'aaa'.replace('a','b',2) }} {{ 'abc'.find('c') }} {{ 'héc'.find('c') }} {{ 'ababa'.count('aba') }} {{ 'ab'.count('') }}",
    "{{ ', '.join(['a', 'b']) }} {{ 'AbC'.upper() }}{{ 'AbC'.lower() }} {{ 'hello world'.capitalize() }}",
    "{{ {'a':1}.get('b', 5) }}{{ {'a':1}.get('a') }}{{ {'a':1}.get('b') }}",
    "{{ ', '.join([1]) }}",
    # globals
    "{{ range(3)|list }} {{ range(1,5,2)|join(',') }} {{ range(5,0,-2)|list }} {{ range(0)|list }}",
    "{{ raise_exception('boom: ' ~ 42) }}",
    "{% if messages|length > 1 %}{{ raise_exception('too many') }}{% endif %}",
    "{{ dict(a=1) == {'a': 1} }} {{ [1, [2]] == [1, [2]] }} {{ (1,) == [1] }} {{ {'a': 1} == {'a': 1.0} }}",
    # macros (top level), dictsort
    "{% macro f(a, b=2, c='x') %}[{{ a }}{{ b }}{{ c }}]{% endmacro %}{{ f(1) }}{{ f(1, 3) }}{{ f(1, c='y') }}{{ f(b=5, a=0) }}{{ f() }}",
    "{% macro down(n) %}{{ n }}{% if n > 0 %},{{ down(n - 1) }}{% endif %}{% endmacro %}{{ down(4) }}|{{ down(2) ~ '!' }}|{{ down(1)|length }}",
    "{% macro g(x) %}{% set y = x * 2 %}{{ y }}{% endmacro %}{% set y = 'top' %}{{ g(3) }}{{ y }}{{ g is callable }}",
    "{% macro h(a) %}{% for i in a %}{{ loop.index }}{{ i }}{% endfor %}{% endmacro %}{% for j in [1] %}{{ h('ab') }}{{ loop.index }}{% endfor %}",
    "{% macro k(a) %}{{ a }}{% endmacro %}{{ k(1, 2) }}",
    "{% macro k(a) %}{{ a }}{% endmacro %}{{ k(b=1) }}",
    "{% macro k(a) %}{{ messages[0].content }}{{ a|default('none') }}{% endmacro %}{{ k() }}",
    "{% for k, v in {'b': 1, 'A': 2, 'a': 3, 'C': 0}|dictsort %}{{ k }}{{ v }};{% endfor %}",
    "{{ {'b': 1, 'A': 2, 'a': 3}|dictsort(true) }} {{ {'x': 2, 'y': 1, 'z': 2}|dictsort(by='value') }} {{ {'x': 1, 'y': 2}|dictsort(reverse=true) }}",
    "{{ [1]|dictsort }}",
    "{{ {'a': 1}|dictsort(by='nope') }}",
    # transformers' strftime_now: the wall clock (UTC here), Python's directives, bad formats
    "{{ strftime_now('%d %B %Y') }}|{{ strftime_now('%Y-%m-%d %A %a %b %j %y %e %U %w %%') }}",
    "{{ strftime_now('%H:%M %p %I') }}|{{ strftime_now(format='[%z][%Z]') }}|{{ strftime_now('') }}|{{ strftime_now('%') }}",
    "{{ strftime_now('%Y') ~ strftime_now('%m')|int }}",
    "{{ strftime_now(5) }}",
    "{{ strftime_now() }}",
    "{{ strftime_now('%Y', 1) }}",
    # generation tag (transformers)
    "{% generation %}{{ messages[0].content }}{% endgeneration %}!",
]


@pytest.mark.parametrize("source", SMALL)
def test_small_template(source, tmpdir_module):
    path = tmpdir_module / "small.jinja"
    path.write_text(source, encoding="utf-8")
    check(path, source, [("user", "hi"), ("assistant", "yo")], gen=True)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
