"""Speculative decoding through `kiri serve` with the bundled stories260K model: speculative and
plain requests batched together each return the greedy text `kiri run --raw` gives alone (the
CLI without speculation, the reference from outside the server); /metrics counts the drafted and
the kept tokens per drafter; the server default (--spec) applies to requests that do not say,
and a request's "speculative" field overrides it; bad values are a 400 naming the field. A draft
model (--draft-model: stories260K's own Q4_0 copy, made by `kiri quantize`) drafts beside lookup
and plain requests with the same texts; without one, "draft" is a 400.

And on the tiny random files of every architecture (make_tiny_models.py, tiny_gemma4.py,
tiny_lfm2.py, tiny_qwen35.py; sliding windows, shared KV, quantized weights, recurrent layers
among them): `kiri run --spec ngram` and `kiri run --draft-model` with the file drafting for itself
print exactly what `kiri run` prints. The hybrid models (lfm2's short convolutions, qwen35's Gated
DeltaNet) roll their recurrent state back to the kept length: with a draft model that is often
wrong (the F32 file drafting for its Q8_0 twin and back, another variant) over 120 tokens, many
blocks, the text is still `kiri run`'s; served, speculative (lookup, draft model) and plain
requests batched together each give `kiri run --raw`'s text, /metrics shows the spare state slots
and none held once idle, and a speculative stream closed early gives its state slots back.
These run on the portable C kernels, whose products give a position the same bits
whether its step holds one token or several. The SIMD tiers' products of several tokens of K-quant
weights round differently from their one-token products (on qwen2-Q4_K with AVX2, up to 0.17 on
logits spanning 20, as far as each is from the C kernels), so a near tie there can go either way
in a step that verifies drafts, as it can in one that batches several sequences.
"""
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest

from conftest import MODEL, sse_events

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_models as mtm  # noqa: E402
import tiny_gemma4 as tg  # noqa: E402
import tiny_lfm2 as tl  # noqa: E402
import tiny_qwen35 as tq  # noqa: E402
import hybrid_checks as hc  # noqa: E402

TINY_DIR = os.environ.get("KIRI_TINY_MODELS", os.path.join(mtm.REPO, "build", "tiny-models"))

PROMPTS = [
    "Lily went to the park. She saw a big dog. The dog was happy. Lily went to the park. She saw a big",
    "Tom had a red ball. He liked to play with the ball. Tom had a red ball. He liked to",
    "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat",
    "Once upon a time",
    "Sam and his mom went to the store. They bought milk and bread. Sam and his mom went to the",
    "One day, Tom",
]
MAX_TOKENS = 48
DRAFTED = 'kiri_spec_draft_tokens_total{drafter="ngram"}'
# A draft model on these tiny models costs about what the model does, and a step takes a fraction of
# a millisecond, which a loaded machine's noise swamps: drafting by cost would stop after the first
# drafts, or not, by chance. These tests are about what drafts give (exactness, rollback, freed
# blocks), so acceptance alone decides here; tests/test_draft.c tests the cost rule.
SPEC_ENV = {"KIRI_SPEC_IGNORE_COST": "1"}
KEPT = 'kiri_spec_accepted_tokens_total{drafter="ngram"}'


def cli_text(kiri_bin, prompt):
    """Greedy text from `kiri run` without speculation (the prompt tokenized as it is, with BOS,
    as /v1/completions does)."""
    r = subprocess.run([str(kiri_bin), "run", "-m", str(MODEL), "--raw", "-p", prompt, "-n", str(MAX_TOKENS),
                        "--temp", "0", "-t", "1"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n")
    return r.stdout[:-1]


@pytest.fixture(scope="module")
def reference(kiri_bin):
    return [cli_text(kiri_bin, p) for p in PROMPTS]


def completion(srv, prompt, spec=None, **extra):
    body = {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    if spec is not None:
        body["speculative"] = spec
    body.update(extra)
    return srv.post("/v1/completions", body)


def all_at_once(srv, jobs):
    """The completions of jobs [(prompt index, speculative)], sent together from as many threads."""
    results = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(j):
        barrier.wait()
        i, spec = jobs[j]
        results[j] = completion(srv, PROMPTS[i], spec)

    threads = [threading.Thread(target=run, args=(j,)) for j in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def idle_metrics(srv):
    """/metrics once the loop has gone idle (the last response can arrive a moment before the
    loop has freed that sequence's blocks)."""
    deadline = time.monotonic() + 10
    while True:
        m = srv.metrics()
        if (m["kiri_requests_running"] == 0 and m["kiri_kv_blocks_used"] == 0) or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


def test_mixed_batch_equals_plain(start_server, reference):
    """Six speculative and six plain requests at once, four sequences per batch: every text is the
    plain CLI's, drafts were made and some kept, some rejected, and the batch held several."""
    srv = start_server(["--parallel", "4"], env=SPEC_ENV)
    m0 = srv.metrics()
    assert m0[DRAFTED] == 0 and m0[KEPT] == 0
    jobs = [(i, spec) for i in range(len(PROMPTS)) for spec in ("ngram", "none")]
    results = all_at_once(srv, jobs)
    for (i, spec), r in zip(jobs, results):
        assert r.status == 200, r
        assert r.json["choices"][0]["text"] == reference[i], (i, spec)
        assert r.json["usage"]["completion_tokens"] == MAX_TOKENS
    m1 = idle_metrics(srv)
    assert m1[KEPT] > 0, m1
    assert m1[DRAFTED] > m1[KEPT], m1
    assert m1["kiri_batch_size_sequences_peak"] > 1
    # Every block back once idle (cached prefix blocks count as free).
    assert m1["kiri_kv_blocks_used"] == 0


def test_alone_and_streamed(start_server, reference):
    """One speculative request at a time, plain and streamed: the same text, and the drafts kept
    make fewer steps than tokens."""
    srv = start_server(["--parallel", "2"], env=SPEC_ENV)
    m0 = srv.metrics()
    r = completion(srv, PROMPTS[0], {"type": "ngram", "max_draft": 12})
    assert r.status == 200, r
    assert r.json["choices"][0]["text"] == reference[0]
    m1 = srv.metrics()
    steps = m1["kiri_batch_steps_total"] - m0["kiri_batch_steps_total"]
    assert m1[KEPT] > 0
    assert steps < MAX_TOKENS, steps
    s = completion(srv, PROMPTS[2], True, stream=True)
    assert s.status == 200, s
    events = [json.loads(e) for e in sse_events(s.body) if e != "[DONE]"]
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    assert text == reference[2]


def test_server_default_and_override(start_server, reference):
    """--spec ngram speculates for requests without the field; "speculative": false does not."""
    srv = start_server(["--parallel", "2", "--spec", "ngram", "--spec-max", "6"], env=SPEC_ENV)
    m0 = srv.metrics()
    r = completion(srv, PROMPTS[1], False)
    assert r.status == 200 and r.json["choices"][0]["text"] == reference[1]
    m1 = srv.metrics()
    assert m1[DRAFTED] == m0[DRAFTED]
    r = completion(srv, PROMPTS[1])
    assert r.status == 200 and r.json["choices"][0]["text"] == reference[1]
    m2 = srv.metrics()
    assert m2[DRAFTED] > m1[DRAFTED]


@pytest.mark.parametrize("value,param", [
    ("eagle", "speculative"),
    ("", "speculative"),
    (3, "speculative"),
    ({"max_draft": 4}, "speculative.type"),
    ({"type": "lookahead"}, "speculative.type"),
    ({"type": "ngram", "max_draft": 0}, "speculative.max_draft"),
    ({"type": "ngram", "max_draft": 17}, "speculative.max_draft"),
    ({"type": "ngram", "max_draft": 2.5}, "speculative.max_draft"),
])
def test_bad_values(server, value, param):
    r = completion(server, PROMPTS[3], value)
    assert r.status == 400, r
    e = r.json["error"]
    assert e["param"] == param, e
    assert e["type"] == "invalid_request_error"
    # The server goes on serving.
    assert completion(server, PROMPTS[3], "ngram").status == 200


def test_draft_without_draft_model(server):
    r = completion(server, PROMPTS[3], "draft")
    assert r.status == 400, r
    assert r.json["error"]["param"] == "speculative"
    assert "draft model" in r.json["error"]["message"]


@pytest.fixture(scope="module")
def q4_copy(kiri_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("draft") / "stories260K-Q4_0.gguf"
    r = subprocess.run([str(kiri_bin), "quantize", str(MODEL), str(out), "Q4_0"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    return out


def test_draft_model_batched(start_server, reference, q4_copy):
    """--draft-model with lookup and plain requests at once: every text is the plain CLI's, and
    /metrics counts the draft model's guesses apart from lookup's."""
    srv = start_server(["--parallel", "4", "--draft-model", str(q4_copy), "--spec", "draft"], env=SPEC_ENV)
    jobs = [(i, spec) for i in range(len(PROMPTS)) for spec in (None, "ngram", "none")]
    results = all_at_once(srv, jobs)
    for (i, spec), r in zip(jobs, results):
        assert r.status == 200, r
        assert r.json["choices"][0]["text"] == reference[i], (i, spec)
    m = idle_metrics(srv)
    drafted, kept = 'kiri_spec_draft_tokens_total{drafter="draft"}', 'kiri_spec_accepted_tokens_total{drafter="draft"}'
    assert m[kept] > 0 and m[drafted] > m[kept], m
    assert m[KEPT] > 0, m
    assert m["kiri_kv_blocks_used"] == 0


def test_draft_model_refused(kiri_bin, tiny_files, start_server):
    """A draft model whose vocabulary differs is refused at start, naming why; --spec draft
    without a draft model, and --draft-model with --models-dir, are configuration errors."""
    r = subprocess.run([str(kiri_bin), "run", "-m", str(MODEL), "-p", "hi", "-n", "2", "--draft-model",
                        tiny_files["qwen3-F32"]], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "the draft model has 1003 tokens, the model 512" in r.stderr, r.stderr
    r = subprocess.run([str(kiri_bin), "serve", "-m", str(MODEL), "--spec", "draft"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and "--spec draft needs --draft-model" in r.stderr, r.stderr
    r = subprocess.run([str(kiri_bin), "serve", "--models-dir", "/tmp", "--draft-model", str(MODEL)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--draft-model drafts for the one model of --model" in r.stderr, r.stderr


# ---- Every architecture ----------------------------------------------------------------------------

# One file per family and weight type worth telling apart (F32 and a quantized one).
FAMILY_FILES = ["gemma3-swa-F32", "gemma3-swa-Q4_K", "gemma3-default-F32", "phi3-fused-F32", "phi4-longrope-Q8_0",
                "smollm3-F32", "granite-Q4_K", "llama-bias-F32", "qwen2-bias-F32", "qwen3-scale-F32"]
BASE_FILES = ["llama-spm-Q4_0", "llama3-bpe-Q8_0", "qwen2-Q4_K", "qwen3-F32"]
GEMMA4 = ["gemma4-e", "gemma4-plain"]
HYBRID = ["lfm2-a", "lfm2-q8", "qwen35-a", "qwen35-b", "qwen35-q8"]
TINY_PROMPT = "the cat sat on the mat and the cat sat on the mat and the cat sat"


@pytest.fixture(scope="module")
def tiny_files():
    made, skipped = mtm.ensure_families(TINY_DIR, log=lambda s: print(s, file=sys.stderr))
    assert not skipped, skipped
    files = {m.name: m.path for m in made}
    files.update({m.name: m.path for m in mtm.ensure(TINY_DIR, log=lambda s: None)[0]})
    files.update(tg.ensure(TINY_DIR))
    files.update(tl.ensure(TINY_DIR))
    files.update(tq.ensure(TINY_DIR))
    return files


def run_tiny(kiri_bin, path, spec, draft=None, n=40):
    r = subprocess.run([str(kiri_bin), "run", "-m", path, "--raw", "-p", TINY_PROMPT, "-n", str(n), "--temp", "0",
                        "-t", "1", "--cpu-kernels", "c", "--spec", spec] + (["--draft-model", draft] if draft else []),
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, **SPEC_ENV))
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def test_every_architecture_greedy_same(kiri_bin, tiny_files):
    drafted = kept = 0
    for name in FAMILY_FILES + BASE_FILES + GEMMA4 + HYBRID:
        path = tiny_files[name]
        plain, _ = run_tiny(kiri_bin, path, "none")
        text, log = run_tiny(kiri_bin, path, "ngram")
        assert text == plain, name
        # The file drafting for itself: the same text again.
        text, dlog = run_tiny(kiri_bin, path, "draft", path)
        assert text == plain, name
        m = re.search(r"speculative \(draft\): (\d+) tokens drafted, (\d+) kept", dlog)
        assert m, dlog
        assert m.group(1) != "0" and m.group(1) == m.group(2), (name, dlog)
        m = re.search(r"speculative \(ngram\): (\d+) tokens drafted, (\d+) kept", log)
        assert m, log
        assert "speculative decoding is off" not in log + dlog, name
        drafted += int(m.group(1))
        kept += int(m.group(2))
    # Random weights repeat themselves often enough for lookup to draft, and to miss.
    assert kept > 0 and drafted > kept, (drafted, kept)


def test_responses_api(start_server):
    """/v1/responses passes "speculative" on: drafts are made, and a bad value is a 400 naming it."""
    srv = start_server(["--parallel", "2"], env=SPEC_ENV)
    body = {"input": PROMPTS[2], "max_output_tokens": MAX_TOKENS, "temperature": 0, "speculative": "ngram"}
    r = srv.post("/v1/responses", body)
    assert r.status == 200, r
    assert idle_metrics(srv)[DRAFTED] > 0
    body["speculative"] = "eagle"
    r = srv.post("/v1/responses", body)
    assert r.status == 400, r
    assert r.json["error"]["param"] == "speculative"


# ---- Hybrid models: the recurrent state rolled back ------------------------------------------------

# (model, draft model): a quantized twin that often agrees, and a variant that seldom does.
TWINS = [{"lfm2-a", "lfm2-q8"}, {"qwen35-a", "qwen35-q8"}]
HYBRID_PAIRS = [("lfm2-a", "lfm2-q8"), ("lfm2-q8", "lfm2-a"), ("lfm2-a", "lfm2-b"), ("qwen35-a", "qwen35-q8"),
                ("qwen35-q8", "qwen35-a"), ("qwen35-b", "qwen35-a")]


def drafted_kept(log, kind):
    m = re.search(r"speculative \(%s\): (\d+) tokens drafted, (\d+) kept" % kind, log)
    assert m, log
    return int(m.group(1)), int(m.group(2))


def test_hybrid_rollback_greedy_same(kiri_bin, tiny_files):
    """A draft model that is often wrong: every rejection rolls the recurrent state back (across
    block ends: 120 tokens are 8 blocks of 16), and the text is still the plain one."""
    for name, draft in HYBRID_PAIRS:
        plain, _ = run_tiny(kiri_bin, tiny_files[name], "none", n=120)
        text, log = run_tiny(kiri_bin, tiny_files[name], "draft", tiny_files[draft], n=120)
        assert text == plain, (name, draft)
        drafted, kept = drafted_kept(log, "draft")
        assert drafted > kept, (name, draft, log)
        if {name, draft} in TWINS:
            assert kept > 0, (name, draft, log)


HYBRID_PROMPTS = [TINY_PROMPT, "once upon a time there was a cat", "the dog and the cat and the dog and the",
                  "a b c d e f g a b c d e f g a b c"]
HYBRID_SERVE = ["--ctx", "256", "--chunk", "16", "--kv-type", "f32", "--cpu-kernels", "c", "-t", "1"]


def hybrid_cli_text(kiri_bin, path, prompt, n):
    r = subprocess.run([str(kiri_bin), "run", "-m", path, "--raw", "-p", prompt, "-n", str(n), "--temp", "0", "-t", "1",
                        "--cpu-kernels", "c", "--kv-type", "f32"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout


@pytest.mark.parametrize("name,draft", [("qwen35-a", "qwen35-q8"), ("lfm2-a", "lfm2-q8")])
def test_hybrid_served_mixed(start_server, kiri_bin, tiny_files, name, draft):
    """Draft-model, lookup and plain requests on a hybrid model, four sequences a step: each text is
    `kiri run --raw`'s; drafts were made and some rejected; /metrics shows the 16 spare state slots
    (one per draft row) beside one per sequence, and none held once idle."""
    path, n = tiny_files[name], 60
    srv = start_server(["-m", path, "--parallel", "4", "--draft-model", tiny_files[draft]] + HYBRID_SERVE,
                       model=False, env=SPEC_ENV)
    jobs = [(i, spec) for i in range(len(HYBRID_PROMPTS)) for spec in ("draft", "ngram", "none")]
    results = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def run(j):
        barrier.wait()
        i, spec = jobs[j]
        results[j] = srv.post("/v1/completions", {"prompt": HYBRID_PROMPTS[i], "max_tokens": n, "temperature": 0,
                                                  "speculative": spec})

    threads = [threading.Thread(target=run, args=(j,)) for j in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = [hybrid_cli_text(kiri_bin, path, p, n) for p in HYBRID_PROMPTS]
    for (i, spec), r in zip(jobs, results):
        assert r.status == 200, r
        assert r.json["choices"][0]["text"] == want[i], (i, spec)
    m = idle_metrics(srv)
    drafted, kept = 'kiri_spec_draft_tokens_total{drafter="draft"}', 'kiri_spec_accepted_tokens_total{drafter="draft"}'
    assert m[drafted] > m[kept] > 0, m
    assert m["kiri_spec_state_slots"] == 16, m
    assert m["kiri_state_slots_capacity"] == 4 + 16, m
    assert m["kiri_state_bytes"] % 20 == 0, m
    assert m["kiri_state_slots_used"] == 0 and m["kiri_kv_blocks_used"] == 0, m


def test_hybrid_without_spec_pays_nothing(start_server, kiri_bin, tiny_files):
    """A hybrid model served without --spec or --draft-model makes no spare state slots (a state
    can be tens of MiB) and answers a request's "speculative": "ngram" plainly, with the plain
    text; `kiri run` with a draft model still drafts (its context asks for the slots)."""
    path, n = tiny_files["qwen35-a"], 40
    srv = start_server(["-m", path, "--parallel", "2"] + HYBRID_SERVE, model=False, env=SPEC_ENV)
    r = srv.post("/v1/completions", {"prompt": HYBRID_PROMPTS[0], "max_tokens": n, "temperature": 0,
                                     "speculative": "ngram"})
    assert r.status == 200, r
    assert r.json["choices"][0]["text"] == hybrid_cli_text(kiri_bin, path, HYBRID_PROMPTS[0], n)
    m = idle_metrics(srv)
    assert m["kiri_spec_state_slots"] == 0 and m["kiri_state_slots_capacity"] == 2, m
    assert m['kiri_spec_draft_tokens_total{drafter="ngram"}'] == 0, m
    r = subprocess.run([str(kiri_bin), "run", "-m", path, "--raw", "-p", HYBRID_PROMPTS[0], "-n", str(n), "--temp", "0",
                        "-t", "1", "--cpu-kernels", "c", "--kv-type", "f32", "--draft-model", path, "--spec", "draft"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ, **SPEC_ENV))
    assert r.returncode == 0, r.stderr
    assert "tokens drafted" in r.stderr and " 0 tokens drafted" not in r.stderr, r.stderr


def test_hybrid_cancel_frees_state(start_server, kiri_bin, tiny_files):
    """A speculative stream on a hybrid model closed after three tokens: once the loop is idle no
    state slot is held (its own, its drafts' spare ones), and no block."""
    srv = start_server(["-m", tiny_files["qwen35-a"], "--parallel", "1", "--draft-model", tiny_files["qwen35-q8"]] +
                       HYBRID_SERVE, model=False, env=SPEC_ENV)
    body = json.dumps({"prompt": TINY_PROMPT, "max_tokens": 200, "temperature": 0, "stream": True,
                       "speculative": "draft"}).encode()
    hc.close_after_events(srv, body, 3)
    deadline = time.monotonic() + 10
    while True:
        m = srv.metrics()
        if m["kiri_requests_running"] == 0 and m["kiri_state_slots_used"] == 0 and m["kiri_kv_blocks_used"] == 0:
            break
        assert time.monotonic() < deadline, m
        time.sleep(0.01)
    assert m['kiri_spec_draft_tokens_total{drafter="draft"}'] > 0, m
    # The next request in that slot is still the plain text.
    r = srv.post("/v1/completions", {"prompt": TINY_PROMPT, "max_tokens": 30, "temperature": 0, "speculative": "draft"})
    assert r.status == 200, r
    assert r.json["choices"][0]["text"] == hybrid_cli_text(kiri_bin, tiny_files["qwen35-a"], TINY_PROMPT, 30)
