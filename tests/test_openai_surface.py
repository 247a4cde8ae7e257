"""The rest of the OpenAI surface of `kiri serve`, through the `openai` SDK: structured output
(response_format json_object / json_schema, llama-server's grammar and json_schema fields),
logit_bias, lists of prompts with n and echo in /v1/completions, system_fingerprint, roles in
every streamed choice, and the stateless /v1/responses endpoint, streamed and not.

Where model quality does not matter the bundled stories260K model serves (ChatML fallback
template); where it does, the real SmolLM2-135M-Instruct with its own chat template (the
`smollm2_instruct` fixture). References come from outside kiri: every constrained output is
checked with the `jsonschema` package or `json`, grammars with Python's `re`, the Responses
event sequence against OpenAI's API reference, token ids with /tokenize, and the SDK's own
parsing (client.chat.completions.parse, client.responses.stream) reads what kiri writes.
"""
import json
import re

import pytest

from conftest import MODEL_ID, request, sse_events

openai = pytest.importorskip("openai")
jsonschema = pytest.importorskip("jsonschema")

_clients = []


def client(srv):
    # A sanitizer build of the server decodes many times slower than a release one.
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=600)
    _clients.append(c)
    return c


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _clients:
        _clients.pop().close()


@pytest.fixture(scope="module")
def instruct(kiri_bin, tmp_path_factory, smollm2_instruct):
    """kiri serve on the real instruct model (its own chat template), 4 sequences per batch."""
    from conftest import KiriServer
    s = KiriServer(kiri_bin, tmp_path_factory.mktemp("instruct"),
                   ["-m", str(smollm2_instruct), "--parallel", "4", "--ctx", "2048"], model=False).start()
    yield s
    s.check_clean_exit()


def instruct_id(srv):
    return client(srv).models.list().data[0].id


def token_ids(srv, text):
    r = srv.post("/tokenize", {"content": text, "add_special": False})
    assert r.status == 200, r
    return r.json["tokens"]


# ---- /v1/completions: lists of prompts, n, echo ----------------------------------------------

PROMPTS = ["Once upon a time", "The little dog"]


def test_prompt_list_numbering_and_usage(server):
    c = client(server)
    many = c.completions.create(model=MODEL_ID, prompt=PROMPTS, n=2, max_tokens=6, temperature=0)
    # OpenAI numbers the choices prompt_index * n + j.
    assert [ch.index for ch in many.choices] == [0, 1, 2, 3]
    singles = [c.completions.create(model=MODEL_ID, prompt=p, max_tokens=6, temperature=0) for p in PROMPTS]
    for i, ch in enumerate(many.choices):
        assert ch.text == singles[i // 2].choices[0].text, (i, ch.text)
    assert many.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert many.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)
    assert many.usage.total_tokens == many.usage.prompt_tokens + many.usage.completion_tokens
    # Token-id prompts, as a list of lists.
    ids = [token_ids(server, p) for p in PROMPTS]
    by_ids = c.completions.create(model=MODEL_ID, prompt=ids, max_tokens=6, temperature=0)
    assert [ch.index for ch in by_ids.choices] == [0, 1]
    assert [len(ch.text) > 0 for ch in by_ids.choices] == [True, True]


def test_echo(server):
    c = client(server)
    r = c.completions.create(model=MODEL_ID, prompt=PROMPTS, n=2, echo=True, max_tokens=5, temperature=0)
    plain = c.completions.create(model=MODEL_ID, prompt=PROMPTS, n=2, max_tokens=5, temperature=0)
    for ch, p in zip(r.choices, plain.choices):
        assert ch.text == PROMPTS[ch.index // 2] + p.text
    # With logprobs the prompt's tokens come first, their log-probabilities not computed (null,
    # as OpenAI writes the first token's).
    r = c.completions.create(model=MODEL_ID, prompt=PROMPTS[0], echo=True, logprobs=1, max_tokens=3, temperature=0)
    lp = r.choices[0].logprobs
    n_prompt = len(token_ids(server, PROMPTS[0]))
    assert len(lp.tokens) == n_prompt + 3
    assert lp.token_logprobs[:n_prompt] == [None] * n_prompt
    assert all(isinstance(v, float) and v <= 0 for v in lp.token_logprobs[n_prompt:])
    assert lp.top_logprobs[0] is None and isinstance(lp.top_logprobs[n_prompt], dict)


def test_echo_and_prompt_list_streamed(server):
    c = client(server)
    whole = c.completions.create(model=MODEL_ID, prompt=PROMPTS, n=2, echo=True, max_tokens=5, temperature=0)
    texts = {}
    fingerprints = set()
    for chunk in c.completions.create(model=MODEL_ID, prompt=PROMPTS, n=2, echo=True, max_tokens=5,
                                      temperature=0, stream=True):
        fingerprints.add(chunk.system_fingerprint)
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert texts == {ch.index: ch.text for ch in whole.choices}
    assert fingerprints == {whole.system_fingerprint}


# ---- system_fingerprint and roles ---------------------------------------------------------------

def test_system_fingerprint_everywhere(server):
    c = client(server)
    msgs = [{"role": "user", "content": "Hi"}]
    fps = [c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=2).system_fingerprint,
           c.completions.create(model=MODEL_ID, prompt="a", max_tokens=2).system_fingerprint]
    for chunk in c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=2, stream=True,
                                           stream_options={"include_usage": True}):
        fps.append(chunk.system_fingerprint)
    assert re.fullmatch(r"fp_[0-9a-f]{16}", fps[0]), fps[0]
    assert set(fps) == {fps[0]}, fps


def test_every_streamed_choice_starts_with_role(server):
    c = client(server)
    first = {}
    content = {}
    for chunk in c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Tell a story"}],
                                           n=3, max_tokens=8, temperature=1.0, seed=5, stream=True):
        for ch in chunk.choices:
            first.setdefault(ch.index, ch.delta)
            content[ch.index] = content.get(ch.index, "") + (ch.delta.content or "")
    assert sorted(first) == [0, 1, 2]
    assert all(d.role == "assistant" for d in first.values()), first
    whole = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Tell a story"}],
                                      n=3, max_tokens=8, temperature=1.0, seed=5)
    assert content == {ch.index: ch.message.content for ch in whole.choices}


# ---- logit_bias -----------------------------------------------------------------------------------

def test_logit_bias_bans_and_forces(server):
    c = client(server)
    greedy = c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, temperature=0,
                                  logprobs=0)
    banned_text = greedy.choices[0].logprobs.tokens[0]
    banned = token_ids(server, "Once upon a time" + banned_text)[len(token_ids(server, "Once upon a time"))]
    assert c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, temperature=0,
                                logprobs=0).choices[0].logprobs.tokens[0] == banned_text
    # -100 bans the token at every step, greedy or sampled.
    for temp, seed in ((0, 1), (1.0, 2), (1.5, 3)):
        r = c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=8, temperature=temp,
                                 seed=seed, logprobs=0, logit_bias={str(banned): -100})
        assert banned_text not in r.choices[0].logprobs.tokens, (temp, r.choices[0].logprobs.tokens)
    # +100 forces one: every token is that one, sampled or not, in chat and streamed too.
    r = c.completions.create(model=MODEL_ID, prompt="The little dog", max_tokens=5, temperature=1.0, seed=4,
                             logprobs=0, logit_bias={str(banned): 100})
    assert r.choices[0].logprobs.tokens == [banned_text] * 5, r.choices[0].logprobs.tokens
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, stream=True,
        logit_bias={str(banned): 100}) if ch.choices)
    assert text == banned_text * 4, text


def test_logit_bias_refusals(server):
    c = client(server)
    for bias, what in (({"512": 1}, "past the vocabulary"), ({"5": 101}, "over 100"), ({"x": 1}, "not an id")):
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=MODEL_ID, prompt="a", max_tokens=2, logit_bias=bias)
        assert e.value.body["param"] == "logit_bias", what


# ---- Grammars and schemas on the tiny model (quality does not matter) -------------------------------

YES_NO = 'root ::= ("yes" | "no") "!"'

PET_SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog", "bird"]},
        "good": {"type": "boolean"},
        "legs": {"enum": [0, 2, 4]},
    },
    "required": ["kind", "good"],
    "additionalProperties": False,
}


def test_gbnf_grammar_extension(server):
    c = client(server)
    for temp in (0, 0.8, 1.5):
        for seed in (1, 2):
            r = c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=10, temperature=temp,
                                     seed=seed, extra_body={"grammar": YES_NO})
            assert re.fullmatch(r"(yes|no)!", r.choices[0].text), r.choices[0].text
            assert r.choices[0].finish_reason == "stop"
    # Streamed, n > 1: every choice follows it.
    texts = {}
    for chunk in c.completions.create(model=MODEL_ID, prompt="The dog", max_tokens=10, temperature=1.2, seed=3,
                                      n=3, stream=True, extra_body={"grammar": YES_NO}):
        for ch in chunk.choices:
            texts[ch.index] = texts.get(ch.index, "") + ch.text
    assert len(texts) == 3 and all(re.fullmatch(r"(yes|no)!", t) for t in texts.values()), texts


def test_json_schema_on_tiny_model(server):
    c = client(server)
    outputs = []
    for temp in (0, 0.7, 1.3):
        r = c.chat.completions.create(
            model=MODEL_ID, messages=[{"role": "user", "content": "A pet?"}], max_tokens=60, temperature=temp, seed=7,
            n=2, response_format={"type": "json_schema", "json_schema": {"name": "pet", "strict": True,
                                                                          "schema": PET_SCHEMA}})
        outputs += [ch.message.content for ch in r.choices]
    # llama-server's json_schema field, on /v1/completions.
    for seed in (1, 2):
        r = c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=60, temperature=1.0,
                                 seed=seed, extra_body={"json_schema": PET_SCHEMA})
        outputs.append(r.choices[0].text)
    for text in outputs:
        jsonschema.validate(json.loads(text), PET_SCHEMA)


def test_structured_output_refusals(server):
    c = client(server)
    msgs = [{"role": "user", "content": "Hi"}]
    bad_schema = {"type": "object", "properties": {"x": {"not": {"type": "string"}}}}
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL_ID, messages=msgs, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": bad_schema}})
    assert e.value.body["param"] == "response_format.json_schema.schema/properties/x", e.value.body
    assert "not" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL_ID, prompt="a", extra_body={"grammar": "root ::= ("})
    assert e.value.body["param"] == "grammar" and e.value.body["code"] == "invalid_grammar"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL_ID, messages=msgs, response_format={"type": "json_object"},
                                  extra_body={"grammar": YES_NO})
    assert e.value.body["code"] == "conflicting_parameters"


# Every letter may open a level that one of two rules closes, so the parse stacks double with each
# byte whatever the model writes (and the sentence cannot end before 13 letters): the matcher's
# bound ends the request within a few tokens.
AMBIGUOUS = 'root ::= a\na ::= [a-z] a x | [a-z] a y | [a-z]{13} "."\nx ::= [a-z]\ny ::= [a-z]\n'


def test_ambiguous_grammar_fails_its_request_only(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=32, temperature=0,
                             extra_body={"grammar": AMBIGUOUS})
    body = e.value.body
    assert body["param"] == "grammar" and body["code"] == "unsupported_grammar", body
    assert re.match(r"grammar too ambiguous: (more than 4096 parse stacks|one token mask needs more than)",
                    body["message"]), body
    # Streamed: the headers are out, so the error comes as the last event before [DONE].
    r = request(server.port, "POST", "/v1/chat/completions",
                {"model": MODEL_ID, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 32,
                 "stream": True, "grammar": AMBIGUOUS})
    assert r.status == 200, r
    events = sse_events(r.body)
    assert events[-1] == "[DONE]"
    err = json.loads(events[-2])["error"]
    assert err["code"] == "unsupported_grammar" and err["message"].startswith("grammar too ambiguous"), err
    # The failed choice did not end by length or stop: no chunk gives it a finish reason.
    reasons = [ch.get("finish_reason") for ev in events[:-2] for ch in json.loads(ev).get("choices", [])]
    assert reasons and all(x is None for x in reasons), reasons
    # The server goes on: the next requests, constrained or not, are answered.
    ok = c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=10, temperature=0,
                              extra_body={"grammar": YES_NO})
    assert re.fullmatch(r"(yes|no)!", ok.choices[0].text), ok.choices[0].text
    assert c.completions.create(model=MODEL_ID, prompt="a", max_tokens=3).choices[0].text is not None


# ---- /v1/responses on the tiny model ------------------------------------------------------------------

# OpenAI's API reference: the events of a streamed text response, in order.
RESPONSE_EVENTS_HEAD = ["response.created", "response.in_progress", "response.output_item.added",
                        "response.content_part.added"]
RESPONSE_EVENTS_TAIL = ["response.output_text.done", "response.content_part.done", "response.output_item.done"]


def test_responses_stream_event_sequence(server):
    r = request(server.port, "POST", "/v1/responses", {"model": MODEL_ID, "input": "Once upon a time",
                                                       "max_output_tokens": 6, "stream": True})
    assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream"), r
    blocks = [b for b in r.body.decode().split("\n\n") if b.strip()]
    types, datas = [], []
    for b in blocks:
        lines = b.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: "), b
        types.append(lines[0][7:])
        datas.append(json.loads(lines[1][6:]))
    assert types[:4] == RESPONSE_EVENTS_HEAD
    n_delta = types.count("response.output_text.delta")
    assert n_delta >= 1 and types[4:4 + n_delta] == ["response.output_text.delta"] * n_delta
    assert types[4 + n_delta:4 + n_delta + 3] == RESPONSE_EVENTS_TAIL
    assert types[-1] == "response.incomplete" and len(types) == 8 + n_delta  # max_output_tokens reached
    assert [d["type"] for d in datas] == types
    assert [d["sequence_number"] for d in datas] == list(range(len(datas)))
    text = "".join(d["delta"] for d in datas if d["type"] == "response.output_text.delta")
    assert datas[4 + n_delta]["text"] == text
    final = datas[-1]["response"]
    assert final["output"][0]["content"][0]["text"] == text
    assert final["usage"]["output_tokens"] == 6
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    item_id = datas[2]["item"]["id"]
    assert all(d.get("item_id", item_id) == item_id for d in datas)


def test_responses_through_the_sdk(server):
    c = client(server)
    r = c.responses.create(model=MODEL_ID, input="Once upon a time", max_output_tokens=8, temperature=0)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status == "incomplete" and r.output_text
    assert r.usage.output_tokens == 8 and r.usage.total_tokens == r.usage.input_tokens + 8
    # Greedy: the same text streamed, read by the SDK's own stream accumulator (which ends a
    # response cut by max_output_tokens with response.incomplete, as OpenAI's does).
    with c.responses.stream(model=MODEL_ID, input="Once upon a time", max_output_tokens=8, temperature=0) as s:
        events = list(s)
    deltas = "".join(ev.delta for ev in events if ev.type == "response.output_text.delta")
    assert events[-1].type == "response.incomplete"
    assert deltas == r.output_text == events[-1].response.output_text
    # Items, parts and instructions: what the chat template gets is the same conversation.
    items = c.responses.create(model=MODEL_ID, instructions="Tell stories.", max_output_tokens=8, temperature=0,
                               input=[{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}])
    chat = c.chat.completions.create(model=MODEL_ID, max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": "Tell stories."}, {"role": "user", "content": "Hi"}])
    assert items.output_text == chat.choices[0].message.content
    assert items.instructions == "Tell stories."
    assert items.usage.input_tokens == chat.usage.prompt_tokens


def test_responses_refusals(server):
    c = client(server)
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL_ID, input="Hi", previous_response_id="resp_123")
    assert e.value.body["param"] == "previous_response_id" and e.value.body["code"] == "unsupported_parameter"
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL_ID, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": "data:,"}]}])
    assert e.value.body["param"] == "input[0].content[0].type"
    with pytest.raises(openai.BadRequestError) as e:
        c.responses.create(model=MODEL_ID, input="Hi", max_output_tokens=10 ** 6)
    assert e.value.body["param"] == "max_output_tokens"


# ---- The real instruct model: outputs that must validate --------------------------------------------

PERSON_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer"},
        "city": {"type": "string", "maxLength": 24},
        "languages": {"type": "array", "items": {"enum": ["English", "French", "German", "Spanish"]},
                      "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "city", "languages"],
    "additionalProperties": False,
}


def test_instruct_json_schema_validates(instruct):
    c = client(instruct)
    model = instruct_id(instruct)
    msgs = [{"role": "user", "content": "Describe a person who lives in Paris as JSON."}]
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "strict": True, "schema": PERSON_SCHEMA}}
    for temp in (0, 0.8, 1.3):
        r = c.chat.completions.create(model=model, messages=msgs, response_format=fmt, max_tokens=160,
                                      temperature=temp, seed=11, n=2)
        for ch in r.choices:
            assert ch.finish_reason == "stop", ch.message.content
            jsonschema.validate(json.loads(ch.message.content), PERSON_SCHEMA)
    # Streamed.
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=model, messages=msgs, response_format=fmt, max_tokens=160, temperature=0.9, seed=3, stream=True)
        if ch.choices)
    jsonschema.validate(json.loads(text), PERSON_SCHEMA)


def test_instruct_sdk_parse_with_pydantic(instruct):
    pydantic = pytest.importorskip("pydantic")

    class City(pydantic.BaseModel):
        name: str
        country: str
        population: int

    c = client(instruct)
    r = c.chat.completions.parse(model=instruct_id(instruct), response_format=City, max_tokens=120, temperature=0,
                                 messages=[{"role": "user", "content": "Give the capital of France as JSON."}])
    city = r.choices[0].message.parsed
    assert isinstance(city, City), r.choices[0].message.content
    jsonschema.validate(json.loads(r.choices[0].message.content), City.model_json_schema())


def test_instruct_json_object(instruct):
    c = client(instruct)
    model = instruct_id(instruct)
    msgs = [{"role": "user", "content": "Give a JSON object with the name and age of a fictional person."}]
    for temp, seed in ((0, 1), (0.5, 2), (0.8, 1), (1.0, 2)):
        r = c.chat.completions.create(model=model, messages=msgs, response_format={"type": "json_object"},
                                      max_tokens=300, temperature=temp, seed=seed)
        assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
        assert isinstance(json.loads(r.choices[0].message.content), dict), r.choices[0].message.content
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=model, messages=msgs, response_format={"type": "json_object"}, max_tokens=300, temperature=0.5,
        seed=3, stream=True) if ch.choices)
    assert isinstance(json.loads(text), dict), text


def test_instruct_responses(instruct):
    c = client(instruct)
    model = instruct_id(instruct)
    ask = dict(model=model, instructions="You are a helpful assistant.", max_output_tokens=60, temperature=0,
               input="What is the capital of France? Answer in one word.")
    r = c.responses.create(**ask)
    assert "Paris" in r.output_text, r.output_text
    assert r.status == "completed" and r.incomplete_details is None
    with c.responses.stream(**ask) as s:
        events = [ev.type for ev in s]
        final = s.get_final_response()
    assert final.output_text == r.output_text and final.status == "completed"
    assert events[:4] == RESPONSE_EVENTS_HEAD and events[-4:-1] == RESPONSE_EVENTS_TAIL
    assert events[-1] == "response.completed"
    # text.format: the Responses API's flat json_schema form.
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 30},
                                               "country": {"type": "string", "maxLength": 30}},
              "required": ["capital", "country"], "additionalProperties": False}
    r = c.responses.create(model=model, input="The capital of France, as JSON.", max_output_tokens=80,
                           temperature=0.6, text={"format": {"type": "json_schema", "name": "capital",
                                                             "schema": schema, "strict": True}})
    assert r.status == "completed", r.output_text
    jsonschema.validate(json.loads(r.output_text), schema)
