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
