"""Function tools on /v1/responses: flat function tools, function_call / function_call_output
input items, function_call output items and their stream events, read by the openai SDK (and its
stream assembler) and run by the OpenAI Agents SDK's default Responses-API model, against
`kiri serve` on SmolLM2-135M-Instruct. Hostile rows are 400s naming the Responses field.

Run: ~/.cache/kiri/venv/bin/python -m pytest -q tests/test_responses_tools.py
"""
import json

import jsonschema
import openai
import pytest

from agents_loop import run_two_tool_agent
from conftest import serve_with_client

# Responses tools are flat: {"type": "function", "name", "description", "parameters", "strict"}.
FLAT = [
    {"type": "function", "name": "get_weather", "description": "Current weather in a city.", "strict": True,
     "parameters": {"type": "object", "properties": {
         "city": {"type": "string", "description": "City name"},
         "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}},
    {"type": "function", "name": "get_time", "description": "The local time somewhere.", "strict": True,
     "parameters": {"type": "object", "properties": {"zone": {"type": "string"}, "offset": {"type": "number"}},
                    "required": ["zone"]}},
]
SCHEMAS = {t["name"]: t["parameters"] for t in FLAT}
ASK = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def served(kiri_bin, smollm2_instruct, tmp_path_factory):
    s, client, model = serve_with_client(kiri_bin, smollm2_instruct, tmp_path_factory.mktemp("resptools"))
    yield s, client, model
    s.stop()


def create(served, **kw):
    _, client, model = served
    kw.setdefault("input", ASK)
    kw.setdefault("tools", FLAT)
    kw.setdefault("max_output_tokens", 96)
    kw.setdefault("temperature", 0)
    return client.responses.create(model=model, **kw)


def calls_of(response):
    """The function_call items, each checked: ids, name, arguments valid under the tool's schema."""
    calls = [o for o in response.output if o.type == "function_call"]
    for c in calls:
        assert c.id.startswith("fc_") and c.call_id.startswith("call_") and c.status == "completed"
        assert c.name in SCHEMAS
        jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
    assert len({c.call_id for c in calls}) == len(calls)
    return calls


def test_required_call_then_answer(served):
    r = create(served, tool_choice="required")
    assert r.status == "completed"
    calls = calls_of(r)
    assert calls
    # no empty message item before the calls
    assert all(o.type != "message" or o.content[0].text for o in r.output)
    assert r.tool_choice == "required" and [t.name for t in r.tools] == list(SCHEMAS)
    # the second turn: the calls and their outputs sent back as items
    items = [{"role": "user", "content": ASK}] + [c.model_dump(exclude_none=True) for c in calls]
    items += [{"type": "function_call_output", "call_id": c.call_id,
               "output": json.dumps({"temperature": 21, "sky": "clear"})} for c in calls]
    r2 = create(served, input=items, tool_choice="none", max_output_tokens=40)
    assert r2.status in ("completed", "incomplete")
    assert not calls_of(r2)
    assert r2.output_text.strip()
    # under auto the tools are described as in the first turn, and the calls and outputs come on top
    r3 = create(served, input=items, tool_choice="auto", max_output_tokens=60)
    assert r3.usage.input_tokens > r.usage.input_tokens
    assert r3.output_text.strip() or calls_of(r3)


def test_named_choice(served):
    r = create(served, tool_choice={"type": "function", "name": "get_time"}, parallel_tool_calls=False)
    calls = calls_of(r)
    assert [c.name for c in calls] == ["get_time"]
    assert r.tool_choice.name == "get_time" and r.parallel_tool_calls is False


def test_streamed_like_whole(served):
    _, client, model = served
    kw = dict(model=model, input=ASK, tools=FLAT, tool_choice="required", max_output_tokens=96, temperature=0)
    events = []
    with client.responses.stream(**kw) as s:
        for e in s:
            events.append(e)
        final = s.get_final_response()
    calls = calls_of(final)
    assert calls
    whole = calls_of(client.responses.create(**kw))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(c.name, json.loads(c.arguments)) for c in whole]
    seq = [e.sequence_number for e in events]
    assert seq == list(range(len(seq)))
    types = [e.type for e in events]
    assert types[:2] == ["response.created", "response.in_progress"] and types[-1] == "response.completed"
    for k, c in enumerate(calls):
        index = final.output.index(c)
        mine = [e for e in events if getattr(e, "output_index", None) == index]
        assert [e.type for e in mine] == ["response.output_item.added", "response.function_call_arguments.delta",
                                          "response.function_call_arguments.done", "response.output_item.done"]
        assert mine[0].item.arguments == "" and mine[0].item.status == "in_progress"
        assert "".join(e.delta for e in mine if e.type.endswith(".delta")) == c.arguments
        assert mine[2].arguments == c.arguments and mine[2].item_id == c.id
        assert mine[3].item.call_id == c.call_id


def test_raw_stream_through_create(served):
    """stream=True: the SDK parses each event; the completed response carries the calls."""
    _, client, model = served
    events = list(client.responses.create(model=model, input=ASK, tools=FLAT, tool_choice="required",
                                          max_output_tokens=96, temperature=0, stream=True))
    done = [e for e in events if e.type == "response.completed"]
    assert len(done) == 1 and calls_of(done[0].response)


def test_agents_sdk_responses_model(served):
    """The Agents SDK's default model (the Responses API) runs a two-tool loop to an answer."""
    import agents
    s, _, model = served
    client = openai.AsyncOpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)
    called, result = run_two_tool_agent(agents, agents.OpenAIResponsesModel(model=model, openai_client=client))
    assert called, "the agent called no tool"
    assert {name for name, _ in called} <= {"get_weather", "get_time"}
    assert isinstance(result.final_output, str) and result.final_output.strip()


CALL = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}


@pytest.mark.parametrize("body,param", [
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "tools": FLAT + [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[2].type"),
    ({"input": "hi", "tools": [{"type": "function", "name": "no spaces"}]}, "tools[0].name"),
    ({"input": "hi", "tools": [{"type": "function", "name": "f", "parameters": {"type": "object",
                                                                                "properties": {"x": {"not": {}}}}}]},
     "tools[0].parameters/properties/x"),
    ({"input": "hi", "tools": FLAT, "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice"),
    ({"input": [{"role": "user", "content": ASK}, CALL,
                {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
                {"type": "function_call_output", "call_id": "call_9", "output": "x"}], "tools": FLAT},
     "input[3].call_id"),
    ({"input": [{"role": "user", "content": ASK}, {k: v for k, v in CALL.items() if k != "name"}], "tools": FLAT},
     "input[1].name"),
])
def test_hostile(served, body, param):
    s, _, model = served
    r = s.post("/v1/responses", json.dumps({"model": model, "max_output_tokens": 4, **body}).encode())
    assert r.status == 400, (r.status, r.body[:300])
    err = json.loads(r.body)["error"]
    assert err["param"] == param and err["message"], err
    assert s.get("/health").status == 200
