"""`kiri serve` end to end: servers started here on 127.0.0.1 with the bundled stories260K model
(no chat template, so chat uses the ChatML fallback), driven by the real `openai` client, raw
sockets and http.client.

Covered: the OpenAI client (chat, completions, streaming, usage, errors); continuous batching
gives each request exactly the tokens it gets alone while the batch holds several sequences;
prefix-cache reuse lowers the time to first token; malformed and hostile HTTP requests
(H01-H12, H16, H17, H19, H23, H24, H27, H28, H30, and H13/H14 at the HTTP layer; /v1/responses
bodies too), each followed by a good request that must still be answered; /health, /v1/models, /tokenize and /detokenize against `kiri
tokenize`, SIGTERM draining, configuration through KIRI_* variables and --config, and API keys.
TLS is in test_server_tls.py, the chat page in a browser in test_server_page.py.

Reference outputs come from outside the server: greedy text from `kiri run` (the CLI over the
public API, not the batching loop) and token ids from `kiri tokenize`.
"""
import http.client
import json
import os
import re
import socket
import subprocess
import threading
import time

import pytest

from conftest import MODEL, MODEL_ID, KiriServer, free_port, raw_exchange, request, sse_events, status_of

openai = pytest.importorskip("openai")

GOOD_COMPLETION = {"prompt": "Once upon a time", "max_tokens": 2, "temperature": 0}


_clients = []


def client(srv, key="unused", **kw):
    """An OpenAI client for srv, closed at the end of the test (an idle keep-alive connection
    holds a CivetWeb worker, which makes the server's stop wait for its 2 s poll slice)."""
    c = openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=60, **kw)
    _clients.append(c)
    return c


@pytest.fixture(autouse=True)
def _close_clients():
    yield
    while _clients:
        _clients.pop().close()


def assert_good_request(srv, headers=None):
    """The server still answers a well-formed generation request."""
    r = srv.post("/v1/completions", GOOD_COMPLETION, headers=headers)
    assert r.status == 200, r
    assert r.json["usage"]["completion_tokens"] == 2


def error_of(reply, status):
    """Checks an OpenAI-style error body and returns its error object."""
    assert reply.status == status, reply
    assert reply.headers["content-type"].startswith("application/json")
    e = reply.json["error"]
    assert set(e) == {"message", "type", "param", "code"}, e
    assert isinstance(e["message"], str) and e["message"]
    return e


def kiri_cli(kiri_bin, *args):
    r = subprocess.run([str(kiri_bin), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


# ---- The OpenAI client ----------------------------------------------------------------------------

def test_openai_models_and_health(server):
    assert server.get("/health").json == {"status": "ok"}
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL_ID]
    assert models.data[0].object == "model"


def test_openai_completion_matches_kiri_run(server, kiri_bin):
    """Greedy completion equals `kiri run --temp 0` (the CLI, one sequence, no batching loop)."""
    want = kiri_cli(kiri_bin, "run", "-m", str(MODEL), "-p", "Once upon a time", "-n", "24", "--temp", "0")
    r = client(server).completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=24,
                                          temperature=0)
    assert r.object == "text_completion"
    assert r.model == MODEL_ID
    assert r.choices[0].text == want.rstrip("\n")
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 24
    assert r.usage.prompt_tokens == len(kiri_cli(kiri_bin, "tokenize", "-m", str(MODEL), "Once upon a time").split())
    assert r.usage.total_tokens == r.usage.prompt_tokens + 24


def test_openai_chat(server, kiri_bin):
    c = client(server)
    r = c.chat.completions.create(model=MODEL_ID, max_tokens=12, temperature=0,
                                  messages=[{"role": "system", "content": "You tell stories."},
                                            {"role": "user", "content": "Tell me about a cat."}])
    assert r.object == "chat.completion"
    msg = r.choices[0].message
    assert msg.role == "assistant" and msg.content
    assert r.choices[0].finish_reason in ("length", "stop")
    assert 1 <= r.usage.completion_tokens <= 12
    # The model has no chat template: the prompt is the ChatML rendering, tokenized as `kiri
    # tokenize` does it.
    chatml = ("<|im_start|>system\nYou tell stories.<|im_end|>\n<|im_start|>user\nTell me about a cat."
              "<|im_end|>\n<|im_start|>assistant\n")
    assert r.usage.prompt_tokens == len(kiri_cli(kiri_bin, "tokenize", "-m", str(MODEL), chatml).split())
    again = c.chat.completions.create(model=MODEL_ID, max_tokens=12, temperature=0,
                                      messages=[{"role": "system", "content": "You tell stories."},
                                                {"role": "user", "content": "Tell me about a cat."}])
    assert again.choices[0].message.content == msg.content


def test_openai_chat_stream_equals_non_stream(server):
    c = client(server)
    msgs = [{"role": "user", "content": "Once upon a time there was a dog."}]
    whole = c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=20, temperature=0)
    stream = c.chat.completions.create(model=MODEL_ID, messages=msgs, max_tokens=20, temperature=0, stream=True,
                                       stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(ch.object == "chat.completion.chunk" for ch in chunks)
    assert len({ch.id for ch in chunks}) == 1
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_openai_completion_stream(server):
    c = client(server)
    whole = c.completions.create(model=MODEL_ID, prompt="The sun", max_tokens=16, temperature=0)
    chunks = list(c.completions.create(model=MODEL_ID, prompt="The sun", max_tokens=16, temperature=0,
                                       stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(ch.usage is None for ch in chunks)   # no include_usage: no usage chunk


def test_openai_n_stop_and_logprobs(server):
    c = client(server)
    r = c.completions.create(model=MODEL_ID, prompt="Once upon a time", max_tokens=30, temperature=0,
                             stop=[" named"])
    assert r.choices[0].finish_reason == "stop"
    assert " named" not in r.choices[0].text and r.choices[0].text
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                  temperature=0.8, seed=7, n=3)
    assert [ch.index for ch in r.choices] == [0, 1, 2]
    r = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], max_tokens=6,
                                  temperature=0, logprobs=True, top_logprobs=3)
    lp = r.choices[0].logprobs.content
    assert len(lp) == r.usage.completion_tokens
    assert "".join(t.token for t in lp) == r.choices[0].message.content
    for t in lp:
        assert len(t.top_logprobs) == 3 and t.logprob <= 0
        assert t.logprob == pytest.approx(max(a.logprob for a in t.top_logprobs), abs=1e-4)  # greedy


def test_openai_seeded_sampling_repeats(server):
    c = client(server)
    kw = dict(model=MODEL_ID, prompt="Once upon a time", max_tokens=20, temperature=1.0, seed=1234)
    assert c.completions.create(**kw).choices[0].text == c.completions.create(**kw).choices[0].text


def test_openai_errors(server):
    c = client(server)
    msgs = [{"role": "user", "content": "Hi"}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL_ID, messages=msgs, temperature=5)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    with pytest.raises(openai.NotFoundError) as e:
        c.chat.completions.create(model="gpt-4o", messages=msgs)
    assert e.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model=MODEL_ID, prompt="word " * 600, max_tokens=4)
    assert e.value.body["code"] == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=MODEL_ID, messages=[])
    assert e.value.body["param"] == "messages"
    with pytest.raises(openai.BadRequestError):   # streaming requests are validated before the stream
        c.chat.completions.create(model=MODEL_ID, messages=msgs, stream=True, max_tokens=-3)
    assert_good_request(server)


# ---- Batching and prefix reuse ------------------------------------------------------------------

BATCH_PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went", "One day, a bird",
                 "Tom had a red ball", "The sun was"]


def test_batching_changes_nothing(server):
    """Concurrent greedy requests return exactly what each returns alone, while the batch holds
    more than one sequence (the batch-size gauge, and fewer steps than tokens)."""
    body = lambda p: {"prompt": p, "max_tokens": 40, "temperature": 0, "logprobs": 1}
    alone = []
    for p in BATCH_PROMPTS:
        r = server.post("/v1/completions", body(p))
        assert r.status == 200, r
        alone.append(r.json)
    # Prompts shorter than one KV block: nothing comes from the prefix cache.
    assert all(a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 for a in alone)

    m0 = server.metrics()
    results = [None] * len(BATCH_PROMPTS)
    barrier = threading.Barrier(len(BATCH_PROMPTS))
    seen_batch = []
    done = threading.Event()

    def run(i):
        barrier.wait()
        results[i] = server.post("/v1/completions", body(BATCH_PROMPTS[i]))

    def watch():
        while not done.is_set():
            seen_batch.append(server.metrics()["kiri_batch_size_sequences"])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(BATCH_PROMPTS))]
    w = threading.Thread(target=watch)
    w.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    w.join()
    m1 = server.metrics()
    for a, r in zip(alone, results):
        assert r.status == 200, r
        got, want = r.json["choices"][0], a["choices"][0]
        assert got["logprobs"]["tokens"] == want["logprobs"]["tokens"]
        assert got["text"] == want["text"]
    generated = sum(r.json["usage"]["completion_tokens"] for r in results)
    steps = m1["kiri_batch_steps_total"] - m0["kiri_batch_steps_total"]
    # Fewer steps than tokens proves steps held several sequences; the sampled gauge may miss them.
    assert steps < generated, (steps, generated)
    assert 1 < m1["kiri_batch_size_sequences_peak"] <= 4, m1   # --parallel 4
    assert max(seen_batch) <= 4


def test_prefix_reuse_lowers_ttft(start_server):
    """A second request with the same long system prompt takes its keys and values from the
    prefix cache (usage and metrics say so) and gets its first token sooner. --chunk 16 makes a
    cold prefill of ~450 tokens take ~28 steps and a warm one a single step."""
    srv = start_server(["--chunk", "16", "--parallel", "2"])
    c = client(srv)
    stories = ["%s %s" % (opening, " ".join(["the happy little cat played in the warm sun with a red ball"] * 20))
               for opening in ("Anna", "Max went", "Under a tree")]

    def ttft(system, user):
        t0 = time.monotonic()
        stream = c.chat.completions.create(model=MODEL_ID, max_tokens=3, temperature=0, stream=True,
                                           stream_options={"include_usage": True},
                                           messages=[{"role": "system", "content": system},
                                                     {"role": "user", "content": user}])
        first, usage = None, None
        for ch in stream:
            if first is None and ch.choices and ch.choices[0].delta.content:
                first = time.monotonic() - t0
            usage = ch.usage or usage
        return first, usage

    cold, warm = [], []
    for i, s in enumerate(stories):
        hits0 = srv.metrics()["kiri_prefix_cache_hit_blocks_total"]
        t, u = ttft(s, "Tell me more.")
        # Cold: at most the first block, which holds only the ChatML header every chat shares.
        assert u.prompt_tokens > 300 and u.prompt_tokens_details.cached_tokens <= 16, u
        cold.append(t)
        hits1 = srv.metrics()["kiri_prefix_cache_hit_blocks_total"]
        t, u = ttft(s, "And then what happened %d?" % i)
        # Everything but the last partial block of the shared system prompt comes from the cache.
        assert u.prompt_tokens_details.cached_tokens >= 16 * ((u.prompt_tokens - 40) // 16), u
        warm.append(t)
        hits2 = srv.metrics()["kiri_prefix_cache_hit_blocks_total"]
        assert hits1 - hits0 <= 1 and hits2 - hits1 >= (u.prompt_tokens - 40) // 16, (hits0, hits1, hits2)
    cold.sort()
    warm.sort()
    assert warm[1] < cold[1], (warm, cold)   # medians
    assert warm[0] < cold[0], (warm, cold)


# ---- Bad inputs: malformed JSON request bodies ---------------------------------------------------

USER = [{"role": "user", "content": "Hi"}]
CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
RESPONSES = "/v1/responses"

# (row, case, path, raw body, status, expected param or None, expected code or None)
BAD_BODIES = [
    ("H01", "truncated JSON", CHAT, b'{"messages":[{"role":"user","content":"Hi"}', 400, None, None),
    ("H01", "trailing comma", CHAT, b'{"messages":[{"role":"user","content":"Hi"}],}', 400, None, None),
    ("H01", "single quotes", CHAT, b"{'messages':[]}", 400, None, None),
    ("H01", "byte order mark", CHAT, b'\xef\xbb\xbf{"messages":[{"role":"user","content":"Hi"}]}', 400, None, None),
    ("H01", "not an object", CHAT, b'[1,2,3]', 400, None, None),
    ("H01", "empty body", CHAT, b'', 400, None, None),
    ("H02", "nesting 100k deep", CHAT, b'{"messages":' + b"[" * 100000 + b"]" * 100000 + b"}", 400, None, None),
    ("H03", "1e999", COMPL, b'{"prompt":"a","max_tokens":1e999}', 400, "max_tokens", None),
    ("H03", "2^64", COMPL, b'{"prompt":"a","max_tokens":18446744073709551616}', 400, "max_tokens", None),
    ("H03", "1.0 for an integer", COMPL, b'{"prompt":"a","max_tokens":1.0}', 400, "max_tokens", None),
    ("H03", "NaN literal", COMPL, b'{"prompt":"a","temperature":NaN}', 400, "temperature", None),
    ("H03", "Infinity literal", COMPL, b'{"prompt":"a","top_p":Infinity}', 400, "top_p", None),
    ("H03", "-0 max_tokens", COMPL, b'{"prompt":"a","max_tokens":-0}', 400, "max_tokens", None),
    ("H04", "invalid UTF-8 byte", CHAT, b'{"messages":[{"role":"user","content":"a\xffb"}]}', 400, None, None),
    ("H04", "overlong encoding", CHAT, b'{"messages":[{"role":"user","content":"a\xc0\xafb"}]}', 400, None, None),
    ("H04", "lone surrogate", CHAT, b'{"messages":[{"role":"user","content":"a\\ud800b"}]}', 400, None, None),
    ("H04", "NUL escape", CHAT, b'{"messages":[{"role":"user","content":"a\\u0000b"}]}', 400, None, None),
    ("H05", "messages as string", CHAT, b'{"messages":"hello"}', 400, "messages", None),
    ("H05", "max_tokens as string", CHAT, b'{"messages":[{"role":"user","content":"Hi"}],"max_tokens":"10"}', 400, "max_tokens", None),
    ("H05", "temperature as bool", CHAT, b'{"messages":[{"role":"user","content":"Hi"}],"temperature":true}', 400, "temperature", None),
    ("H05", "stop as number", CHAT, b'{"messages":[{"role":"user","content":"Hi"}],"stop":5}', 400, "stop", None),
    ("H05", "prompt as object", COMPL, b'{"prompt":{"a":1}}', 400, "prompt", None),
    ("H06", "max_tokens -1", COMPL, b'{"prompt":"a","max_tokens":-1}', 400, "max_tokens", None),
    ("H06", "max_tokens 0", COMPL, b'{"prompt":"a","max_tokens":0}', 400, "max_tokens", None),
    ("H06", "max_tokens 2^31", COMPL, b'{"prompt":"a","max_tokens":2147483648}', 400, "max_tokens", None),
    ("H06", "max_tokens past the context", COMPL, b'{"prompt":"a","max_tokens":511}', 400, None, "context_length_exceeded"),
    ("H07", "n 0", COMPL, b'{"prompt":"a","n":0}', 400, "n", None),
    ("H07", "n 1000", COMPL, b'{"prompt":"a","n":1000}', 400, "n", None),
    ("H08", "messages empty", CHAT, b'{"messages":[]}', 400, "messages", None),
    ("H08", "message without content", CHAT, b'{"messages":[{"role":"user"}]}', 400, "messages[0].content", None),
    ("H08", "user content null", CHAT, b'{"messages":[{"role":"user","content":null}]}', 400, "messages[0].content", None),
    ("H08", "messages missing", CHAT, b'{"model":"x"}', 400, "messages", None),
    ("H09", "unknown role", CHAT, b'{"messages":[{"role":"wizard","content":"Hi"}]}', 400, "messages[0].role", None),
    ("H09", "unknown part type", CHAT, b'{"messages":[{"role":"user","content":[{"type":"video","x":1}]}]}', 400, "messages[0].content[0].type", None),
    ("H09", "image part", CHAT, b'{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:,"}}]}]}', 400, "messages[0].content[0].type", None),
    ("H10", "prompt longer than the context", COMPL, json.dumps({"prompt": "cat " * 700}).encode(), 400, None, "context_length_exceeded"),
    ("H10", "chat longer than the context", CHAT, json.dumps({"messages": [{"role": "user", "content": "cat " * 700}]}).encode(), 400, None, "context_length_exceeded"),
    ("H21", "temperature 2.5", COMPL, b'{"prompt":"a","temperature":2.5}', 400, "temperature", None),
    ("H21", "top_p 0", COMPL, b'{"prompt":"a","top_p":0}', 400, "top_p", None),
    ("H21", "top_k -1", COMPL, b'{"prompt":"a","top_k":-1}', 400, "top_k", None),
    ("H21", "seed -1", COMPL, b'{"prompt":"a","seed":-1}', 400, "seed", None),
    ("H21", "top_logprobs 21", CHAT, b'{"messages":[{"role":"user","content":"Hi"}],"logprobs":true,"top_logprobs":21}', 400, "top_logprobs", None),
    ("H22", "five stops", COMPL, b'{"prompt":"a","stop":["a","b","c","d","e"]}', 400, "stop", None),
    ("H22", "empty stop", COMPL, b'{"prompt":"a","stop":[""]}', 400, "stop", None),
    ("H22", "1 MB stop", COMPL, json.dumps({"prompt": "a", "stop": ["x" * 1000000]}).encode(), 400, "stop", None),
    ("H24", "token id out of range", COMPL, b'{"prompt":[1,2,99999]}', 400, "prompt", None),
    ("H24", "negative token id", COMPL, b'{"prompt":[1,-2]}', 400, "prompt", None),
    ("H25", "unknown model", CHAT, b'{"model":"gpt-4","messages":[{"role":"user","content":"Hi"}]}', 404, "model", "model_not_found"),
    ("H04", "detokenize bad id", "/detokenize", b'{"tokens":[1,100000]}', 400, "tokens", None),
    # Structured output, logit_bias, lists of prompts and /v1/responses (test_openai_surface.py
    # has the accepted forms).
    ("H23", "logit_bias id past the vocabulary", COMPL, b'{"prompt":"a","logit_bias":{"512":1}}', 400, "logit_bias", None),
    ("H23", "logit_bias NaN", COMPL, b'{"prompt":"a","logit_bias":{"5":NaN}}', 400, "logit_bias", None),
    ("H23", "logit_bias 101", CHAT, b'{"messages":[{"role":"user","content":"Hi"}],"logit_bias":{"5":101}}', 400, "logit_bias", None),
    ("H23", "200k logit_bias entries", COMPL,
     json.dumps({"prompt": "a", "logit_bias": {str(i): 1 for i in range(200000)}}).encode(), 400, "logit_bias", None),
    ("H24", "33 prompts", COMPL, json.dumps({"prompt": ["a"] * 33}).encode(), 400, "prompt", None),
    ("H24", "prompts times n over the cap", COMPL, json.dumps({"prompt": ["a"] * 5, "n": 8}).encode(), 400, "n", None),
    ("H24", "empty prompt in a list", COMPL, b'{"prompt":[[1],[]]}', 400, "prompt[1]", None),
    ("H24", "token id out of range in a list", COMPL, b'{"prompt":[[1],[2,600]]}', 400, "prompt[1]", None),
    ("H27", "schema nested 10k deep", CHAT,
     b'{"messages":[{"role":"user","content":"Hi"}],"response_format":{"type":"json_schema","json_schema":{"name":"x",'
     b'"schema":' + b'{"properties":{"a":' * 10000 + b'{}' + b'}}' * 10000 + b'}}}', 400, "response_format", None),
    ("H27", "schema without its schema", CHAT, json.dumps({"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x"}}}).encode(), 400, "response_format.json_schema.schema", None),
    ("H27", "schema keyword kiri cannot honour", CHAT, json.dumps({"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"x": {"not": {"type": "string"}}}}}}}).encode(),
     400, "response_format.json_schema.schema/properties/x", "unsupported_schema"),
    ("H27", "huge enum", CHAT, json.dumps({"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"enum": ["v%d" % i for i in range(100000)]}}}}).encode(),
     400, "response_format.json_schema.schema", "unsupported_schema"),
    ("H27", "$ref cycle", CHAT, json.dumps({"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}}}}).encode(),
     400, None, "unsupported_schema"),  # named by the pointer where the cycle is found
    ("H27", "minimum above maximum", CHAT, json.dumps({"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 5, "maximum": 1}}}}).encode(),
     400, "response_format.json_schema.schema", "unsupported_schema"),
    ("H27", "empty enum", COMPL, json.dumps({"prompt": "a", "json_schema": {"enum": []}}).encode(), 400, "json_schema", "unsupported_schema"),
    ("H27", "schema no value satisfies", CHAT, json.dumps({"messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "required": ["a"], "additionalProperties": False}}}}).encode(),
     400, "response_format.json_schema.schema", "unsupported_schema"),
    ("H27", "json_schema not an object", COMPL, b'{"prompt":"a","json_schema":"{}"}', 400, "json_schema", None),
    ("H27", "malformed grammar", COMPL, json.dumps({"prompt": "a", "grammar": "root ::= ("}).encode(), 400, "grammar", "invalid_grammar"),
    ("H27", "grammar without root", COMPL, json.dumps({"prompt": "a", "grammar": 'start ::= "x"'}).encode(), 400, "grammar", "invalid_grammar"),
    ("H27", "left-recursive grammar", COMPL, json.dumps({"prompt": "a", "grammar": 'root ::= root "a" | "b"'}).encode(), 400, "grammar", "invalid_grammar"),
    ("H27", "two constraints", CHAT, json.dumps({"messages": USER, "response_format": {"type": "json_object"},
                                                  "grammar": 'root ::= "x"'}).encode(), 400, "grammar", "conflicting_parameters"),
    ("H27", "unknown response_format type", CHAT, json.dumps({"messages": USER, "response_format": {"type": "xml"}}).encode(), 400, "response_format", None),
    ("H05", "responses without input", RESPONSES, b'{"model":"x"}', 400, "input", None),
    ("H05", "responses input as number", RESPONSES, b'{"input":5}', 400, "input", None),
    ("H09", "responses image part", RESPONSES, b'{"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:,"}]}]}', 400, "input[0].content[0].type", None),
    ("H09", "responses unknown role", RESPONSES, b'{"input":[{"role":"wizard","content":"Hi"}]}', 400, "input[0].role", None),
    ("H02", "responses nesting 100k deep", RESPONSES, b'{"input":' + b"[" * 100000 + b"]" * 100000 + b"}", 400, "input", None),
    ("H06", "responses max_output_tokens 0", RESPONSES, b'{"input":"Hi","max_output_tokens":0}', 400, "max_output_tokens", None),
    ("H10", "responses input longer than the context", RESPONSES, json.dumps({"input": "cat " * 700}).encode(), 400, "input", "context_length_exceeded"),
    ("H26", "responses previous_response_id", RESPONSES, b'{"input":"Hi","previous_response_id":"resp_1"}', 400, "previous_response_id", "unsupported_parameter"),
    ("H27", "responses text.format schema", RESPONSES, json.dumps({"input": "Hi", "text": {"format": {
        "type": "json_schema", "name": "x", "schema": {"properties": {"x": {"not": {}}}}}}}).encode(),
     400, "text.format.schema/properties/x", "unsupported_schema"),
    ("H05", "tokenize content as number", "/tokenize", b'{"content":5}', 400, "content", None),
]


@pytest.mark.parametrize("row,case,path,body,status,param,code", BAD_BODIES,
                         ids=["%s %s" % (b[0], b[1]) for b in BAD_BODIES])
def test_bad_body(server, figures, row, case, path, body, status, param, code):
    r = request(server.port, "POST", path, body, headers={"Content-Type": "application/json"})
    e = error_of(r, status)
    assert e["type"] == ("invalid_request_error" if status < 500 else "server_error")
    if param is not None:
        assert e["param"] == param, e
    if code is not None:
        assert e["code"] == code, e
    assert_good_request(server)
    figures("%s %s" % (row, case), 1, 1, "-> %d, next good request 200" % r.status)


def test_duplicate_keys_and_unknown_fields(server):
    """H26: the last duplicate key wins; unknown fields are ignored."""
    body = b'{"prompt":"a","max_tokens":500,"max_tokens":3,"temperature":0,"frobnicate":{"x":[1]}}'
    r = request(server.port, "POST", COMPL, body)
    assert r.status == 200, r
    assert r.json["usage"]["completion_tokens"] == 3


# ---- Bad inputs: HTTP framing and transport -----------------------------------------------------

def post_raw(path, body, extra=b"", length=True):
    head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    if length:
        head += b"Content-Length: %d\r\n" % len(body)
    return head + extra + b"\r\n" + body


@pytest.fixture(scope="module")
def small_body_server(kiri_bin, tmp_path_factory):
    """A server with a 64 KiB body cap and a 2 s header timeout, so the size and slowloris cases
    take little time."""
    s = KiriServer(kiri_bin, tmp_path_factory.mktemp("small"),
                   ["--max-body", "64K", "--idle-timeout", "2", "--parallel", "2"]).start()
    yield s
    s.check_clean_exit()


def test_body_over_cap_with_length(small_body_server, figures):
    srv = small_body_server
    body = json.dumps({"prompt": "x" * 70000}).encode()
    out, closed, secs = raw_exchange(srv.port, post_raw(COMPL, body))
    assert status_of(out) == 413 and closed, out[:300]
    assert b'"code":"body_too_large"' in out
    # A body of exactly the cap is read (and refused only for what it says).
    body = b'{"prompt":"' + b"x" * (65536 - 13) + b'"}'
    assert len(body) == 65536
    r = request(srv.port, "POST", COMPL, body)
    assert r.status == 400 and r.json["error"]["code"] == "context_length_exceeded", r
    assert_good_request(srv)
    figures("H11 body over the cap (Content-Length)", 1, 1, "-> 413, closed")


def test_content_length_10e12(small_body_server, figures):
    """Refused from the header alone: the answer comes at once and the connection closes without
    the server waiting for (or draining) a terabyte."""
    srv = small_body_server
    out, closed, secs = raw_exchange(srv.port, post_raw(COMPL, b'{"prompt":', length=False,
                                                        extra=b"Content-Length: 1000000000000\r\n"))
    assert status_of(out) == 413 and closed, out[:300]
    assert secs < 1.5, secs
    assert_good_request(srv)
    figures("H11 Content-Length 10^12", 1, 1, "-> 413 in %.2f s, closed" % secs)


def test_chunked_body_over_cap(small_body_server, figures):
    """A chunked body is cut off once it passes the cap: the server answers 413 and closes while
    the client is still sending, having read about the cap, not the 64 MiB offered."""
    srv = small_body_server
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Transfer-Encoding: chunked\r\n\r\n")
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
    sent, total = 0, 64 << 20
    s.settimeout(5)
    try:
        while sent < total:
            s.sendall(chunk)
            sent += 0x4000
    except OSError:   # reset or broken pipe: the server closed on us
        pass
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
    except OSError:
        pass
    s.close()
    assert status_of(out) == 413, out[:300]
    assert sent < total, "the server read the whole 64 MiB chunked body"
    assert_good_request(srv)
    figures("H11 chunked body over the cap", 1, 1, "-> 413 after %d KiB of 65536 sent" % (sent >> 10))


FRAMING = [
    ("H12", "Content-Length and Transfer-Encoding",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     (400,)),
    ("H12", "two Content-Length headers",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", (400,)),
    ("H12", "negative Content-Length",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\nhello", (400, 411)),
    ("H12", "garbage Content-Length",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\nhello", (400, 411)),
    ("H12", "Content-Length 12abc",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 12abc\r\n\r\nhello", (400,)),
    ("H12", "Content-Length 0x5 (smuggles the body as a request)",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 0x5\r\n\r\n"
     b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", (400,)),
    ("H12", "Content-Length +5",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\nhello", (400,)),
    ("H12", "Transfer-Encoding gzip",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\nhello", (400, 501)),
    ("H12", "bad chunk size",
     b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n", (400,)),
    ("H13", "header line over 16 KiB",
     b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n", (431,)),
    ("H13", "request line over 16 KiB",
     b"GET /health?" + b"a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", (414,)),
    ("H13", "200 header lines",
     b"GET /health HTTP/1.1\r\n" + b"".join(b"X-H%d: y\r\n" % i for i in range(200)) + b"\r\n", (431,)),
    ("H30", "Expect: something-else",
     post_raw(COMPL, b'{"prompt":"a","max_tokens":1}', extra=b"Expect: teapot\r\n"), (417,)),
    ("H30", "HTTP/2.0 request line", b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n", (400, 505)),
    ("H01", "not HTTP at all", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\x00" * 64 + b"\r\n\r\n", (400,)),
]


@pytest.mark.parametrize("row,case,data,statuses", FRAMING, ids=["%s %s" % (f[0], f[1]) for f in FRAMING])
def test_bad_framing_closes(server, figures, row, case, data, statuses):
    """Refused with a 4xx and the connection closed: nothing left in the stream can be taken for
    a second request."""
    out, closed, secs = raw_exchange(server.port, data, timeout=8)
    assert status_of(out) in statuses, out[:300]
    head, _, body = out.partition(b"\r\n\r\n")
    assert b"Content-Type: application/json" in head and b"Connection: close" in head, out
    assert set(json.loads(body)["error"]) == {"message", "type", "param", "code"}
    assert closed and secs < 4, (closed, secs)
    assert len(re.findall(rb"HTTP/\d\.\d \d{3} ", out)) == 1, out   # no smuggled second answer
    assert_good_request(server)
    figures("%s %s" % (row, case), 1, 1, "-> %d, closed" % status_of(out))


def test_expect_100_continue(server):
    """H30: the interim 100 comes before the client sends its body; the answer follows."""
    body = json.dumps(GOOD_COMPLETION).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(post_raw(COMPL, b"", extra=b"Expect: 100-continue\r\nContent-Length: %d\r\n" % len(body),
                           length=False))
        interim = s.recv(4096)
        assert interim.startswith(b"HTTP/1.1 100 Continue\r\n\r\n"), interim
        s.sendall(body)
        out = interim[25:]
        while b'"usage"' not in out:
            out += s.recv(65536)
        assert status_of(out) == 200, out
    # A body over the limit is refused before the 100: the client never sends it.
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
                  b"Content-Length: 99999999\r\n\r\n")
        out = s.recv(4096)
        assert status_of(out) == 413, out


def test_keep_alive_pipelining_and_http10(server):
    """H30: three pipelined requests on one connection get three answers in order; HTTP/1.0
    gets a complete answer and a close, also for a stream (no chunked encoding in 1.0)."""
    gen = json.dumps(GOOD_COMPLETION).encode()
    data = (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + post_raw(COMPL, gen) +
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    out, closed, _ = raw_exchange(server.port, data)
    assert closed
    answers = re.findall(rb"HTTP/1\.1 (\d{3}) ", out)
    assert answers == [b"200", b"200", b"200"], out
    assert out.index(b'"status":"ok"') < out.index(b'"text_completion"') < out.index(b'"object":"list"')

    # A refusal after the body was read keeps the connection; one before reading it (here 404 for
    # a POST with a body) closes it and says so, so a client never reuses a connection the server
    # is closing.
    data = (post_raw(COMPL, b'{"prompt": oops}') + post_raw("/v1/nothing", gen) +
            b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    out, closed, _ = raw_exchange(server.port, data)
    assert closed and re.findall(rb"HTTP/1\.1 (\d{3}) ", out) == [b"400", b"404"], out
    assert out.count(b"Connection: close\r\n") == 1 and out.index(b"Connection: close") > out.index(b"404")

    # HEAD: the GET answer's headers, no body, so the next answer on the connection stays in step.
    out, closed, _ = raw_exchange(server.port, b"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n"
                                  b"HEAD /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
                                  b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    heads = out.split(b"\r\n\r\n")
    assert [status_of(h) for h in heads[:3]] == [200, 200, 200] and heads[3] == b'{"status":"ok"}', out
    assert b"Content-Length: 15\r\n" in heads[0]

    out, closed, _ = raw_exchange(server.port, b"GET /health HTTP/1.0\r\n\r\n")
    assert status_of(out) == 200 and closed and out.endswith(b'{"status":"ok"}'), out
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "stream": True}).encode()
    out, closed, _ = raw_exchange(server.port, b"POST /v1/completions HTTP/1.0\r\nContent-Length: %d\r\n\r\n"
                                  % len(body) + body)
    assert status_of(out) == 200 and closed, out[:300]
    head, _, payload = out.partition(b"\r\n\r\n")
    assert b"chunked" not in head.lower()
    events = sse_events(payload)
    assert events[-1] == "[DONE]" and len(events) == 7, events   # 5 tokens, the finish, [DONE]


PATHS = [
    ("GET", "/nope", 404), ("GET", "/v1/chat", 404), ("GET", "/v1/../health", 404),
    ("GET", "/../../etc/passwd", 404), ("GET", "/health%00", 404), ("GET", "/health%00.html", 404),
    ("GET", "/v1/models%2F..%2F..", 404), ("GET", "/HEALTH", 404), ("POST", "/nope", 404),
    ("GET", "/v1/chat/completions", 405), ("PUT", "/v1/completions", 405), ("DELETE", "/v1/models", 405),
    ("POST", "/health", 405), ("GET", "/tokenize", 405),
]


def test_unknown_paths_and_methods(server, figures):
    """H28: exact routes only; the path is matched as sent, so dot segments and %00 match nothing."""
    for method, path, want in PATHS:
        out, closed, _ = raw_exchange(server.port, b"%s %s HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                                      % (method.encode(), path.encode()))
        assert status_of(out) == want, (method, path, out[:300])
        if want == 405:
            assert re.search(rb"\r\nAllow: (GET|POST)\r\n", out), out
        assert b'"error"' in out
    assert server.get("/health").status == 200
    assert server.get("/health?probe=1").status == 200   # a query string is not part of the path
    figures("H28 wrong method / unknown path / .. / %00", len(PATHS), len(PATHS), "-> 404/405")


def test_slowloris(small_body_server, figures):
    """H14: a client sending one header byte per second is cut off at the header timeout (2 s
    here); meanwhile other clients are served at once."""
    srv = small_body_server
    slow = [socket.create_connection(("127.0.0.1", srv.port), timeout=10) for _ in range(3)]
    t0 = time.monotonic()
    closed_at = [None] * len(slow)
    req = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    good = []
    for i in range(len(req)):
        for k, s in enumerate(slow):
            if closed_at[k] is None:
                try:
                    s.send(req[i:i + 1])
                    s.setblocking(False)
                    try:
                        if s.recv(4096, socket.MSG_PEEK) is not None:
                            closed_at[k] = time.monotonic() - t0
                    except BlockingIOError:
                        pass
                    s.setblocking(True)
                except OSError:
                    closed_at[k] = time.monotonic() - t0
        if all(c is not None for c in closed_at):
            break
        t = time.monotonic()
        r = request(srv.port, "GET", "/health", timeout=5)
        good.append((r.status, time.monotonic() - t))
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
    for s in slow:
        s.close()
    assert all(c is not None for c in closed_at), closed_at
    assert all(1.8 <= c <= 4.5 for c in closed_at), closed_at
    assert good and all(st == 200 and secs < 1.0 for st, secs in good), good
    assert_good_request(srv)
    figures("H14 slowloris (1 header byte/s, 3 clients)", len(good), len(good),
            "good requests served meanwhile; slow ones closed after %.1f-%.1f s" % (min(closed_at), max(closed_at)))


def test_disconnect_mid_stream(server, figures):
    """H17: closing the socket mid-stream stops the generation and returns its KV blocks."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 500, "temperature": 0, "stream": True}).encode()
    rounds = 3
    steps_after = []
    for _ in range(rounds):
        m0 = server.metrics()
        s = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        s.sendall(post_raw(COMPL, body))
        got = b""
        while got.count(b"data: ") < 3:
            got += s.recv(4096)
        steps_at_close = server.metrics()["kiri_batch_steps_total"]   # live, one step per token here
        s.close()
        deadline = time.monotonic() + 10
        while True:   # the HTTP thread counts the disconnect after the request's tokens
            m = server.metrics()
            if m["kiri_requests_running"] == 0 and m["kiri_kv_blocks_used"] == 0 and \
                    m["kiri_client_disconnects_total"] > m0["kiri_client_disconnects_total"]:
                break
            assert time.monotonic() < deadline, m
            time.sleep(0.01)
        generated = m["kiri_generation_tokens_total"] - m0["kiri_generation_tokens_total"]
        # The stream ended early (500 were asked for, about a second of work), soon after the
        # close: the socket error comes at the next write, then the HTTP thread cancels. (At 2 ms
        # a step, a loaded machine's scheduling delays are worth tens of steps.)
        after_close = m["kiri_batch_steps_total"] - steps_at_close
        assert 3 <= generated < 500 and after_close <= 200, (generated, after_close)
        steps_after.append(after_close)
        assert m["kiri_client_disconnects_total"] == m0["kiri_client_disconnects_total"] + 1
    assert_good_request(server)
    figures("H17 disconnect mid-stream", rounds, rounds,
            "stopped %s steps after the close; KV blocks back to 0" % "/".join("%d" % x for x in steps_after))


def test_queue_full_429(start_server, figures):
    """H16: with one slot and one queue place, while a long request runs a burst of requests gets
    one 200 (the queued one) and 429 + Retry-After for the rest; afterwards the server serves
    normally."""
    srv = start_server(["--parallel", "1", "--queue", "1"])
    n = 5
    # The burst must land while the long request runs; on a loaded machine the threads may start
    # too late, so a burst that ended after the long request is tried again.
    for attempt in range(4):
        first = [None]
        long_req = threading.Thread(target=lambda: first.__setitem__(0, srv.post(
            COMPL, {"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0})))
        long_req.start()
        deadline = time.monotonic() + 10
        while srv.metrics()["kiri_requests_running"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.005)
        barrier = threading.Barrier(n)
        results = [None] * n

        def run(i):
            barrier.wait()
            results[i] = srv.post(COMPL, {"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0})

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        long_req.join()
        # Every burst request sent while the long one ran gets 429 but the one that takes the
        # queue place; more 200s mean the long request ended before the burst arrived.
        if sum(r.status == 429 for r in results) >= n - 1:
            break
    assert first[0].status == 200, first[0]
    statuses = sorted(r.status for r in results)
    assert set(statuses) <= {200, 429}, results
    assert statuses.count(200) >= 1 and statuses.count(429) >= 3, statuses
    for r in results:
        if r.status == 429:
            assert r.headers.get("retry-after") == "1"
            assert error_of(r, 429)["code"] == "overloaded"
    assert_good_request(srv)
    figures("H16 queue full (--parallel 1 --queue 1)", n, n,
            "while one runs: %d x 200, %d x 429 with Retry-After" % (statuses.count(200), statuses.count(429)))


# ---- Other endpoints ----------------------------------------------------------------------------

TEXTS = ["Once upon a time", "héllo wörld 🙂\nsecond line", "  spaces  and\ttabs  ", "1234 + 5678 = ?"]


@pytest.mark.parametrize("text", TEXTS)
def test_tokenize_round_trip(server, kiri_bin, text):
    want = [int(t) for t in kiri_cli(kiri_bin, "tokenize", "-m", str(MODEL), text).split()]
    r = server.post("/tokenize", {"content": text})
    assert r.status == 200, r
    assert r.json["tokens"] == want
    nobos = [int(t) for t in kiri_cli(kiri_bin, "tokenize", "-m", str(MODEL), "--no-bos", text).split()]
    assert server.post("/tokenize", {"content": text, "add_special": False}).json["tokens"] == nobos
    back = server.post("/detokenize", {"tokens": nobos})
    assert back.status == 200, back
    assert back.json["content"].lstrip(" ") == text.lstrip(" ")


def test_metrics_and_health(server):
    m = server.metrics()
    assert m["kiri_kv_blocks_capacity"] > 0
    assert m['vllm:num_requests_running{engine="0",model_name="%s"}' % MODEL_ID] == 0
    r = server.get("/health")
    assert r.status == 200 and r.json == {"status": "ok"}
    page = server.get("/")
    assert page.status == 200 and page.headers["content-type"].startswith("text/html")
    assert b"<textarea" in page.body and "default-src 'self'" in page.headers["content-security-policy"]


# ---- Shutdown -------------------------------------------------------------------------------------

def test_sigterm_drains(start_server):
    """SIGTERM while a stream runs: the stream completes (all its tokens, [DONE]), a new
    generation request is refused with 503 and /health says draining (503), then the process
    exits 0."""
    srv = start_server(["--parallel", "2"])
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}).encode()
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=60)
    s.sendall(post_raw(COMPL, body))
    got = b""
    while got.count(b"data: ") < 2:
        got += s.recv(4096)
    srv.proc.send_signal(15)
    # Requests that arrive once the signal is handled get 503 (before that, 200).
    deadline = time.monotonic() + 5
    while True:
        late = srv.post(COMPL, GOOD_COMPLETION)
        if late.status != 200 or time.monotonic() > deadline:
            break
    while not got.endswith(b"0\r\n\r\n"):
        d = s.recv(65536)
        if not d:
            break
        got += d
    s.close()
    assert late.status == 503 and late.headers.get("retry-after"), late
    health = srv.get("/health")   # load balancers see the node draining
    assert health.status == 503 and health.json["status"] == "draining", health
    events = [e for e in sse_events(re.sub(rb"\r\n[0-9a-f]+\r\n", b"", got.partition(b"\r\n\r\n")[2]))]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert len([c for c in chunks if c["choices"][0]["text"]]) >= 300
    assert srv.proc.wait(timeout=40) == 0
    assert "draining" in srv.log()
    srv.check_clean_exit()


# ---- Configuration ---------------------------------------------------------------------------------

def test_config_env_file_and_flag_precedence(start_server, tmp_path):
    """Settings from KIRI_* variables and from --config FILE; flag > environment > file."""
    port = free_port()
    srv = start_server(env={"KIRI_MODEL": str(MODEL), "KIRI_PORT": str(port), "KIRI_HOST": "127.0.0.1",
                            "KIRI_ALIAS": "from-env", "KIRI_PARALLEL": "2"}, model=False, port_flag=False, port=port)
    assert [m["id"] for m in srv.get("/v1/models").json["data"]] == ["from-env"]
    assert "2 parallel" in srv.log()
    srv.check_clean_exit()

    keyfile = tmp_path / "keys"
    keyfile.write_text("# test key\nconfig-file-key-123\n")
    port = free_port()
    cfg = tmp_path / "kiri.conf"
    cfg.write_text("# kiri serve settings\nmodel = %s\nhost = 127.0.0.1\nport = %d\nalias = from-file\n"
                   "api-key-file = %s\nparallel = 3\n" % (MODEL, port, keyfile))
    auth = {"Authorization": "Bearer config-file-key-123"}
    srv = start_server(["--config", str(cfg)], model=False, port_flag=False, port=port)
    assert srv.get("/v1/models").status == 401
    assert [m["id"] for m in srv.get("/v1/models", headers=auth).json["data"]] == ["from-file"]
    assert "3 parallel" in srv.log()
    srv.check_clean_exit()

    srv = start_server(["--config", str(cfg)], env={"KIRI_ALIAS": "env-wins"}, model=False, port_flag=False,
                       port=port)
    assert srv.get("/v1/models", headers=auth).json["data"][0]["id"] == "env-wins"
    srv.check_clean_exit()

    srv = start_server(["--config", str(cfg), "--alias", "flag-wins"], env={"KIRI_ALIAS": "env"}, model=False,
                       port_flag=False, port=port)
    assert srv.get("/v1/models", headers=auth).json["data"][0]["id"] == "flag-wins"


def test_config_errors_name_the_setting(kiri_bin, tmp_path):
    """A bad setting stops the start with one line naming it and its source, exit status 2."""
    cases = [(["--parallel", "zero"], {}, "--parallel"), ([], {"KIRI_QUEUE": "-3"}, "KIRI_QUEUE"),
             (["--frobnicate", "1"], {}, "--frobnicate")]
    for args, env, name in cases:
        r = subprocess.run([str(kiri_bin), "serve", "-m", str(MODEL), *args], capture_output=True, text=True,
                           env={**os.environ, **env}, timeout=60)
        assert r.returncode == 2, (args, env, r.stderr)
        assert name in r.stderr, r.stderr


# ---- API keys ---------------------------------------------------------------------------------------

KEY = "kiri-test-key-5f3a9c0b7d21"
BAD_KEYS = [
    ("no header", None),
    ("wrong key", "Bearer kiri-test-key-00000000000"),
    ("Bearer missing", KEY),
    ("other scheme", "Basic " + KEY),
    ("Bearer alone", "Bearer"),
    ("key with whitespace inside", "Bearer " + KEY[:8] + " " + KEY[8:]),
    ("key plus suffix", "Bearer " + KEY + "x"),
    ("key prefix", "Bearer " + KEY[:-1]),
    ("10 KB key", "Bearer " + "k" * 10240),
]


@pytest.fixture
def keyed_server(start_server, tmp_path):
    keys = tmp_path / "api-keys"
    keys.write_text("# keys for the tests\n\nanother-key-abcdefgh\n  %s  \n" % KEY)
    return start_server(["--api-key-file", str(keys), "--parallel", "2"])


def test_api_keys(keyed_server, figures):
    """H19: every endpoint but /health and / needs the key; bad keys get 401 and never appear in
    the log; the server keeps serving good requests."""
    srv = keyed_server
    good = {"Authorization": "Bearer " + KEY}
    calls = [("GET", "/v1/models", None), ("GET", "/metrics", None), ("POST", "/tokenize", {"content": "a"}),
             ("POST", "/detokenize", {"tokens": [1]}), ("POST", COMPL, GOOD_COMPLETION),
             ("POST", CHAT, {"messages": USER, "max_tokens": 2})]
    assert srv.get("/health").status == 200
    assert srv.get("/").status == 200
    sent = answered = 0
    for method, path, body in calls:
        # Every kind of bad key on the chat endpoint, a missing one on the others: 14 failures,
        # under the rate limit of 20 a second.
        for name, header in BAD_KEYS if path == CHAT else BAD_KEYS[:1]:
            r = request(srv.port, method, path, body, headers={"Authorization": header} if header else {})
            e = error_of(r, 401)
            assert e["code"] == "invalid_api_key" and r.headers.get("www-authenticate") == "Bearer"
            sent += 1
            answered += 1
        r = request(srv.port, method, path, body, headers=good)
        assert r.status == 200, (path, r)
        # Scheme in any letter case and surrounding blanks are allowed (RFC 9110).
        assert request(srv.port, method, path, body, headers={"Authorization": "bearer  " + KEY + " "}).status == 200
    assert srv.metrics(headers=good)["kiri_auth_failures_total"] == sent
    c = client(srv, key=KEY)
    assert c.completions.create(model=MODEL_ID, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    with pytest.raises(openai.AuthenticationError):
        client(srv, key="not-the-key-at-all").models.list()
    log = srv.log()
    for secret in [KEY, KEY[:8], "kiri-test-key-00000000000", "k" * 64, "not-the-key-at-all"]:
        assert secret not in log
    figures("H19 bad API keys (9 kinds; 6 endpoints)", answered, sent, "-> 401; key never logged")


def test_auth_failure_rate_limit(keyed_server, figures):
    """H19: past 20 failures in a second every keyed request gets 429 + Retry-After (a correct key
    too, so guessing gains nothing) for about a second; then the correct key works again."""
    srv = keyed_server
    conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
    statuses = []
    for i in range(80):
        conn.request("GET", "/v1/models", headers={"Authorization": "Bearer wrong-key-%06d" % i})
        r = conn.getresponse()
        r.read()
        statuses.append(r.status)
        if r.status == 429:
            assert r.getheader("Retry-After") == "1"
            break
    conn.close()
    assert statuses[-1] == 429, statuses
    assert 20 <= statuses.count(401) <= 40, statuses
    good = {"Authorization": "Bearer " + KEY}
    assert srv.get("/v1/models", headers=good).status == 429
    assert srv.get("/health").status == 200          # not keyed
    t0 = time.monotonic()
    while srv.get("/v1/models", headers=good).status != 200:
        assert time.monotonic() - t0 < 3.0
        time.sleep(0.05)
    figures("H19 auth-failure rate limit", 1, 1,
            "429 after %d failures; good key back after %.1f s" % (statuses.count(401), time.monotonic() - t0))
