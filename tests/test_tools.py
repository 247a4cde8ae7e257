"""Tool calling: chat templates rendering tools, tool calls and tool results (against jinja2, as
transformers' apply_chat_template renders them), the tool-call parser over each template
family's syntax, and /v1/chat/completions with tools through the openai SDK and the OpenAI
Agents SDK against `kiri serve` on SmolLM2-135M-Instruct.

Run: ~/.cache/kiri/venv/bin/python -m pytest -q tests/test_tools.py
"""
import copy
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from test_chat_template import ENV, RaisedByTemplate, TOOL as RENDER_TOOL, gguf_template

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "chat_templates"
BUILD = Path(os.environ.get("KIRI_BUILD", str(ROOT / "build")))

# ------------------------------------------------------------------------------------------------
# Templates with tool syntax, against jinja2
# ------------------------------------------------------------------------------------------------

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time somewhere.",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"},
                                                    "offset": {"type": "number"}},
                   "required": ["zone"]}}}
TOOLS = [WEATHER, TIME]


def call(i, name, args):
    return {"id": f"call{i:07d}", "type": "function", "function": {"name": name, "arguments": args}}


CONVERSATIONS = {
    "ask": [{"role": "user", "content": "What is the weather in Paris?"}],
    "system_ask": [{"role": "system", "content": "You are helpful."},
                   {"role": "user", "content": "Weather in Oslo, please."}],
    "one_call": [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None,
         "tool_calls": [call(1, "get_weather", {"city": "Paris", "unit": "celsius"})]},
        {"role": "tool", "tool_call_id": "call0000001", "name": "get_weather",
         "content": '{"temperature": 21.5, "sky": "clear"}'},
    ],
    "two_calls_answer": [
        {"role": "system", "content": "Use tools when needed."},
        {"role": "user", "content": "Weather in Rome and the time in Tokyo?"},
        {"role": "assistant", "content": "",
         "tool_calls": [call(2, "get_weather", {"city": "Rome"}),
                        call(3, "get_time", {"zone": "Asia/Tokyo", "offset": 9.5})]},
        {"role": "tool", "tool_call_id": "call0000002", "name": "get_weather", "content": "sunny, 25 C"},
        {"role": "tool", "tool_call_id": "call0000003", "name": "get_time", "content": "18:04"},
        {"role": "assistant", "content": "Rome is sunny (25 C) and it is 18:04 in Tokyo."},
        {"role": "user", "content": "Thanks! ünïcödé 漢字"},
    ],
}

TOOL_TEMPLATES = ["qwen25.jinja", "llama31.jinja", "mistral.jinja", "mistral_v2.jinja", "gemma3.jinja",
                  "smollm2.jinja", "ggml-vocab-qwen2.gguf", "ggml-vocab-llama-bpe.gguf"]


def template_text(name):
    if name.endswith(".gguf"):
        return gguf_template(name)
    return (DATA / name).read_text(encoding="utf-8")


def reference(source, messages, tools, gen):
    try:
        out = ENV.from_string(source).render(messages=copy.deepcopy(messages), tools=copy.deepcopy(tools),
                                             documents=None, add_generation_prompt=gen,
                                             bos_token="<s>", eos_token="</s>")
    except RaisedByTemplate as e:
        return "raise", str(e)
    except Exception as e:  # noqa: BLE001 - any jinja2 failure: kiri must fail as well
        return "error", f"{type(e).__name__}: {e}"
    return "ok", out.encode()


def kiri_render(source, messages, tools, gen):
    with tempfile.TemporaryDirectory() as d:
        tp, mp, tl = Path(d, "t.jinja"), Path(d, "m.json"), Path(d, "tools.json")
        tp.write_text(source, encoding="utf-8")
        mp.write_text(json.dumps(messages, ensure_ascii=False), encoding="utf-8")
        args = [RENDER_TOOL, str(tp), "--json", str(mp), "--bos", "<s>", "--eos", "</s>"]
        if tools is not None:
            tl.write_text(json.dumps(tools, ensure_ascii=False), encoding="utf-8")
            args += ["--tools", str(tl)]
        if gen:
            args.append("--gen")
        p = subprocess.run(args, capture_output=True, timeout=60)
    if p.returncode == 0:
        return "ok", p.stdout
    assert p.returncode == 1, f"render_template crashed ({p.returncode}): {p.stderr.decode()}"
    err = p.stderr.decode()
    if err.startswith("E_INVALID_ARG raise_exception: "):
        return "raise", err[len("E_INVALID_ARG raise_exception: "):].rstrip("\n")
    return "error", err


@pytest.mark.parametrize("name", TOOL_TEMPLATES)
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("with_tools", [True, False])
def test_template_with_tools_matches_jinja2(name, conversation, with_tools):
    source = template_text(name)
    messages = CONVERSATIONS[conversation]
    tools = TOOLS if with_tools else None
    for gen in (False, True):
        want = reference(source, messages, tools, gen)
        got = kiri_render(source, messages, tools, gen)
        if want[0] == "error":
            assert got[0] != "ok", f"jinja2 failed ({want[1]}) but kiri rendered {got[1]!r}"
        else:
            assert got == want, f"\njinja2: {want!r}\nkiri:   {got!r}"


def test_templates_show_the_tools():
    """Guards the comparison above against both sides ignoring the tools."""
    for name, conv in [("qwen25.jinja", "one_call"), ("llama31.jinja", "one_call"),
                       ("ggml-vocab-qwen2.gguf", "two_calls_answer")]:
        kind, text = kiri_render(template_text(name), CONVERSATIONS[conv], TOOLS, True)
        assert kind == "ok" and b"get_weather" in text and b"Current weather" in text, (name, text)


# ------------------------------------------------------------------------------------------------
# Format detection, the tool-call grammars and the output parser (tests/tools/tool_calls.c)
# ------------------------------------------------------------------------------------------------

CALLS_TOOL = str(BUILD / "tool_calls")


def run_tool(*args, check=True):
    p = subprocess.run([CALLS_TOOL, *map(str, args)], capture_output=True, timeout=60)
    if check:
        assert p.returncode == 0, p.stderr.decode()
    return p


@pytest.mark.parametrize("name,want", [
    ("qwen25.jinja", "hermes"), ("ggml-vocab-qwen2.gguf", "hermes"), ("llama31.jinja", "llama3"),
    ("ggml-vocab-llama-bpe.gguf", "generic"), ("smollm2.jinja", "generic"), ("gemma3.jinja", "generic"),
    ("mistral.jinja", "generic"), ("chatml.jinja", "generic")])
def test_detect_format(name, want, tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(template_text(name), encoding="utf-8")
    assert run_tool("detect", path).stdout.decode().strip() == want


def parse(fmt, output, parallel=1, tmp=None):
    """The parser's {content, tool_calls}, checked to be the same however the output is cut."""
    with tempfile.TemporaryDirectory() as d:
        path = Path(d, "out")
        path.write_bytes(output.encode())
        results = [json.loads(run_tool("parse", fmt, parallel, chunk, path).stdout) for chunk in (0, 1, 2, 7)]
    for r in results:
        assert r["growth_ok"], "streamed content was rewritten instead of only growing"
        assert r == results[0], f"cutting the output changed the result: {r} vs {results[0]}"
    return results[0]


def calls_of(r):
    for c in r["tool_calls"]:
        assert c["id"].startswith("call_") and len(c["id"]) == 29 or len(c["id"]) == 9, c["id"]
    return [(c["name"], json.loads(c["arguments"])) for c in r["tool_calls"]]


# Outputs in each family's documented syntax, with what a client must get back.
PARSE_CASES = [
    # Hermes / Qwen: <tool_call> blocks (Qwen 2.5 and Qwen 3 model cards, NousResearch Hermes format)
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', 1,
     "", [("get_weather", {"city": "Paris"})]),
    ("hermes", 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome", "unit": '
     '"celsius"}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {"zone": "Asia/Tokyo"}}\n'
     '</tool_call>', 1, "Let me look.",
     [("get_weather", {"city": "Rome", "unit": "celsius"}), ("get_time", {"zone": "Asia/Tokyo"})]),
    ("hermes", '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", '
     '"arguments": {}}\n</tool_call>', 0, "", [("a", {})]),
    ("hermes", 'No tools needed: 2 < 3 and <tool> is not a tag.', 1,
     "No tools needed: 2 < 3 and <tool> is not a tag.", []),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}\n</tool_call>',
     1, "", [("get_weather", {"city": "Oslo"})]),
    ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lima"}}', 1, "",
     [("get_weather", {"city": "Lima"})]),            # the model stopped before the closing tag
    ("hermes", '<tool_call>\nnot json\n</tool_call>', 1, "<tool_call>\nnot json\n</tool_call>", []),
    # (the Llama 3.0 template in the vectors has no tool syntax)
    # Llama 3.1-3.3: a JSON object with "parameters", optionally after <|python_tag|> (Meta's docs)
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Paris"}}', 1, "",
     [("get_weather", {"city": "Paris"})]),
    ("llama3", '<|python_tag|>{"name": "get_time", "parameters": {"zone": "UTC", "offset": 1.5}}', 1, "",
     [("get_time", {"zone": "UTC", "offset": 1.5})]),
    ("llama3", '{"type": "function", "name": "a", "parameters": {"x": [1, 2]}}; {"name": "b", '
     '"parameters": {}}', 1, "", [("a", {"x": [1, 2]}), ("b", {})]),
    ("llama3", 'The weather is {"name" of the city} nice.', 1, 'The weather is {"name" of the city} nice.', []),
    # Mistral: [TOOL_CALLS] and a JSON list (v3), or NAME[ARGS]{...} (v11+)
    ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcDEF123"}]', 1,
     "", [("get_weather", {"city": "Paris"})]),
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"q": "x"}}, {"name": "b", "arguments": {}}]', 1, "",
     [("a", {"q": "x"}), ("b", {})]),
    ("mistral", '[TOOL_CALLS]get_weather[ARGS]{"city": "Nice"}[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e'
     '[ARGS]{"zone": "CET"}', 1, "", [("get_weather", {"city": "Nice"}), ("get_time", {"zone": "CET"})]),
    ("mistral", 'Plain answer [with brackets].', 1, "Plain answer [with brackets].", []),
    # FunctionGemma: <start_function_call>call:NAME{key:<escape>text<escape>,...}<end_function_call>
    ("gemma", '<start_function_call>call:get_weather{city:<escape>Paris, France<escape>,days:3}'
     '<end_function_call>', 1, "", [("get_weather", {"city": "Paris, France", "days": 3})]),
    ("gemma", 'Sure.<start_function_call>call:set{on:true,tags:[<escape>a<escape>,<escape>b{c}<escape>],'
     'pos:{x:1.5,y:-2}}<end_function_call>', 1, "Sure.",
     [("set", {"on": True, "tags": ["a", "b{c}"], "pos": {"x": 1.5, "y": -2}})]),
    # Generic (a template without tool syntax): one JSON object
    ("generic", '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]}', 1, "",
     [("get_weather", {"city": "Paris"})]),
    ("generic", '{"tool_calls": [{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"k": null}}]}', 1,
     "", [("a", {}), ("b", {"k": None})]),
    ("generic", '{"response": "It is sunny in Paris. \\u00e9\\n"}', 1, "It is sunny in Paris. \u00e9\n", []),
    ("generic", '{"response": "tab\\t quote\\" slash\\/ \\ud83d\\ude00 \\u00e9 end"}\n\nextra', 1,
     'tab\t quote" slash/ \U0001F600 \u00e9 end', []),
    ("generic", '{"response": "cut off mid-answer \\u00', 1, "cut off mid-answer", []),
    ("generic", 'Just text, no JSON.', 1, "Just text, no JSON.", []),
    ("generic", '{"broken": ', 1, '{"broken": ', []),
]


@pytest.mark.parametrize("fmt,output,parallel,content,calls", PARSE_CASES)
def test_parser(fmt, output, parallel, content, calls):
    r = parse(fmt, output, parallel)
    assert r["content"].strip() == content.strip()
    assert calls_of(r) == calls
    ids = [c["id"] for c in r["tool_calls"]]
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("fmt,output", [
    ("hermes", "<tool_call>x" * 3000 + "end"),
    ("llama3", '{"name"' * 3000),
    ("mistral", "[TOOL_CALLS]" * 2000 + "[{"),
    ("gemma", "<start_function_call>call:f{a:" + "[" * 5000 + "<end_function_call>"),
    ("generic", "[" * 100000),
    ("generic", '{"tool_calls": ' + "[" * 10000 + "]" * 10000 + "}"),
])
def test_parser_hostile_output(fmt, output, tmp_path):
    """Output that looks like calls and is not: kept as text, in bounded time, nothing lost."""
    path = tmp_path / "out"
    path.write_text(output)
    for chunk in (0, 3):
        r = json.loads(run_tool("parse", fmt, 1, chunk, path).stdout)
        assert r["tool_calls"] == [] and r["content"] == output


def test_mistral_ids_are_nine_alphanumerics():
    r = parse("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {}}]')
    (c,) = r["tool_calls"]
    assert len(c["id"]) == 9 and c["id"].isalnum()


@pytest.mark.parametrize("fmt", ["generic", "hermes", "llama3", "mistral", "gemma"])
@pytest.mark.parametrize("choice,named,parallel", [("auto", "-", 1), ("required", "-", 1),
                                                   ("required", "-", 0), ("named", "get_time", 1)])
def test_grammars_parse_in_llama_cpp(fmt, choice, named, parallel, tmp_path):
    """Every plan's grammar is GBNF that llama.cpp's own parser accepts; lazy only for auto."""
    llama_cpp = pytest.importorskip("llama_cpp")
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    out = run_tool("plan", fmt, choice, named, parallel, tools).stdout.decode()
    grammar, triggers = out.split("\n%%\n")
    llama_cpp.LlamaGrammar.from_string(grammar, verbose=False)
    assert bool(triggers.strip()) == (choice == "auto" and fmt != "generic")
    if choice == "named":
        # every function's rules are there (each schema is checked); the call offers get_time only
        (offered,) = [line for line in grammar.splitlines() if line.startswith("call ::=")]
        assert offered == "call ::= tool1-call"


def test_plan_none_is_free(tmp_path):
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps(TOOLS))
    assert run_tool("plan", "hermes", "none", "-", 1, tools).stdout.decode().strip() == "%%"


def test_generic_messages(tmp_path):
    m, t = tmp_path / "m.json", tmp_path / "t.json"
    m.write_text(json.dumps(CONVERSATIONS["two_calls_answer"]))
    t.write_text(json.dumps(TOOLS))
    out = json.loads(run_tool("generic", "auto", "-", 1, m, t).stdout)
    assert out[0]["role"] == "system" and out[0]["content"].startswith("Use tools when needed.")
    assert "get_weather" in out[0]["content"] and '"response"' in out[0]["content"]
    calls = json.loads(out[2]["content"])
    assert calls == {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}},
                                    {"name": "get_time", "arguments": {"zone": "Asia/Tokyo", "offset": 9.5}}]}
    assert "tool_calls" not in out[2]
    out = json.loads(run_tool("generic", "none", "-", 1, m, t).stdout)
    assert out[0]["content"] == "Use tools when needed."


# ------------------------------------------------------------------------------------------------
# kiri serve on SmolLM2-135M-Instruct (its template has no tool syntax: the generic format)
# ------------------------------------------------------------------------------------------------

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

from agents_loop import run_two_tool_agent  # noqa: E402
from conftest import serve_with_client  # noqa: E402

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


@pytest.fixture(scope="module")
def served(kiri_bin, smollm2_instruct, tmp_path_factory):
    s, client, model = serve_with_client(kiri_bin, smollm2_instruct, tmp_path_factory.mktemp("tools"))
    yield s, client, model
    s.stop()


def create(served, **kw):
    _, client, model = served
    kw.setdefault("messages", ASK)
    kw.setdefault("tools", TOOLS)
    kw.setdefault("max_tokens", 96)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(model=model, **kw)


def check_calls(calls, names=None):
    """Each call names a tool and its arguments are JSON valid under that tool's schema."""
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in (names or SCHEMAS)
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    assert len({c.id for c in calls}) == len(calls)


@pytest.mark.parametrize("seed", [1, 2])
def test_required(served, seed):
    r = create(served, tool_choice="required", temperature=0.8, seed=seed)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    check_calls(ch.message.tool_calls)
    assert ch.message.role == "assistant"


def test_named(served):
    r = create(served, tool_choice={"type": "function", "function": {"name": "get_time"}})
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls"
    check_calls(ch.message.tool_calls, names=["get_time"])


def test_auto(served):
    r = create(served, tool_choice="auto")
    ch = r.choices[0]
    if ch.message.tool_calls:
        assert ch.finish_reason == "tool_calls"
        check_calls(ch.message.tool_calls)
    else:
        assert ch.message.content and not ch.message.content.lstrip().startswith("{")
        assert ch.finish_reason == "stop"


def test_none(served):
    r = create(served, tool_choice="none", max_tokens=24)
    ch = r.choices[0]
    assert not ch.message.tool_calls and ch.message.content
    assert ch.finish_reason in ("stop", "length")


def test_no_parallel_calls(served):
    r = create(served, tool_choice="required", parallel_tool_calls=False,
               messages=[{"role": "user", "content": "Weather in Rome and the time in Tokyo?"}])
    assert len(r.choices[0].message.tool_calls) == 1


def streamed(served, **kw):
    """Assembles a stream as an OpenAI client does, checking the chunks' shape on the way."""
    calls, content, finish, first = {}, "", None, True
    for chunk in create(served, stream=True, **kw):
        if not chunk.choices:
            continue
        d = chunk.choices[0].delta
        if first:
            assert d.role == "assistant"
            first = False
        content += d.content or ""
        for tc in d.tool_calls or []:
            if tc.index not in calls:
                # the first chunk of a call: id, type and name, arguments empty or a first fragment
                assert tc.id and tc.type == "function" and tc.function.name
                calls[tc.index] = {"id": tc.id, "name": tc.function.name, "arguments": tc.function.arguments or ""}
            else:
                assert tc.id is None and tc.function.name is None
                calls[tc.index]["arguments"] += tc.function.arguments or ""
        if chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert sorted(calls) == list(range(len(calls)))
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_streamed_like_whole(served, choice):
    content, calls, finish = streamed(served, tool_choice=choice)
    assert finish == "tool_calls" and calls
    for c in calls:
        jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
    whole = create(served, tool_choice=choice).choices[0].message
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole.tool_calls]
    assert content == (whole.content or "")


def test_streamed_none(served):
    content, calls, finish = streamed(served, tool_choice="none", max_tokens=16)
    assert content and not calls and finish in ("stop", "length")


def test_two_turns_with_the_tool_result(served):
    r = create(served, tool_choice="required")
    msg = r.choices[0].message
    check_calls(msg.tool_calls)
    history = ASK + [msg.model_dump(exclude_none=True)]
    for c in msg.tool_calls:
        history.append({"role": "tool", "tool_call_id": c.id, "content": json.dumps({"temperature": 21, "sky": "clear"})})
    r2 = create(served, messages=history, tool_choice="none", max_tokens=40)
    assert not r2.choices[0].message.tool_calls and r2.choices[0].finish_reason in ("stop", "length")
    r3 = create(served, messages=history, tool_choice="auto", max_tokens=60)
    ch = r3.choices[0]
    # the same tools are described as in the first turn, and the call and its results come on top
    assert r3.usage.prompt_tokens > r.usage.prompt_tokens
    assert ch.message.content or ch.message.tool_calls
    if ch.message.tool_calls:
        check_calls(ch.message.tool_calls)


def test_agents_sdk_two_tool_loop(served):
    """The OpenAI Agents SDK runs an agent with two tools against kiri serve to completion."""
    agents = pytest.importorskip("agents")
    s, _, model = served
    client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)
    called, result = run_two_tool_agent(agents, agents.OpenAIChatCompletionsModel(model=model, openai_client=client))
    assert called, "the agent called no tool"
    assert {name for name, _ in called} <= {"get_weather", "get_time"}
    assert isinstance(result.final_output, str) and result.final_output.strip()


# ------------------------------------------------------------------------------------------------
# Hostile input: clear 400s naming the field
# ------------------------------------------------------------------------------------------------

def fn(name="f", **extra):
    return {"type": "function", "function": {"name": name, **extra}}


HOSTILE = [
    ("tools_not_list", {"tools": {"type": "function"}}, "tools"),
    ("tool_not_object", {"tools": ["get_weather"]}, "tools[0]"),
    ("tool_wrong_type", {"tools": [{"type": "retrieval"}]}, "tools[0].type"),
    ("tool_no_function", {"tools": [{"type": "function"}]}, "tools[0].function"),
    ("tool_bad_name", {"tools": [fn("get weather!")]}, "tools[0].function.name"),
    ("tool_long_name", {"tools": [fn("x" * 65)]}, "tools[0].function.name"),
    ("tool_duplicate", {"tools": [fn("a"), fn("a")]}, "tools[1].function.name"),
    ("tool_params_not_object", {"tools": [fn(parameters="object")]}, "tools[0].function.parameters"),
    ("tool_params_bad_schema", {"tools": [fn(parameters={"type": "object", "properties": {"a": {"type": "nonsense"}}})]},
     "tools[0].function.parameters"),
    ("tool_params_bad_ref", {"tools": [fn(parameters={"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})]},
     "tools[0].function.parameters"),
    ("too_many_tools", {"tools": [fn(f"t{i}") for i in range(129)]}, "tools"),
    ("choice_unknown_name", {"tools": [fn("a")], "tool_choice": {"type": "function", "function": {"name": "b"}}},
     "tool_choice"),
    ("choice_bad_string", {"tools": [fn("a")], "tool_choice": "always"}, "tool_choice"),
    ("choice_required_without_tools", {"tool_choice": "required"}, "tool_choice"),
    ("parallel_not_bool", {"tools": [fn("a")], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ("tool_result_unknown_id", {"messages": ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "x"}]}, "messages[2].tool_call_id"),
    ("tool_result_before_any_call", {"messages": ASK + [{"role": "tool", "tool_call_id": "call_1", "content": "x"}]},
     "messages[1].tool_call_id"),
    ("tool_call_without_id", {"messages": ASK + [
        {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]},
     "messages[1].tool_calls[0]"),
    ("tool_calls_on_user", {"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
     "messages[0].tool_calls"),
]


@pytest.mark.parametrize("case,extra,param", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_tools(served, case, extra, param):
    s, _, model = served
    body = {"model": model, "messages": ASK, "max_tokens": 4, **extra}
    r = s.post("/v1/chat/completions", json.dumps(body).encode())
    assert r.status == 400, (r.status, r.body[:300])
    err = json.loads(r.body)["error"]
    # a refused parameter schema also names the subschema: tools[0].function.parameters/properties/a
    assert (err["param"] == param or err["param"].startswith(param + "/")) and err["message"], err
