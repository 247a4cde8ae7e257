"""Speculative decoding with a qwen35 file's own multi-token-prediction (MTP) head (`--spec mtp`,
"speculative": "mtp"), on tiny_qwen35's files with an MTP block: qwen35-b (random block, head
norm of its own, the trunk's embedding and output), qwen35-mtp (its own embedding, head and head
norm) and qwen35-mtp-bare (the required tensors only: the trunk's embedding, output norm and
output). The last two have blocks whose drafts are often right (tiny_qwen35's mtp_copy), so that
drafts are both kept and rejected.

  - The head's logits, against tiny_qwen35.reference_mtp (the block written out in float64 from
    llama.cpp's graph_mtp): over every position of a prompt after the trunk's hidden states, and
    along a chained draft of 4 that feeds the head's own hidden state back; the drafted tokens
    are the reference's argmax (tests/tools/mtp_logits, CPU and Vulkan).
  - The trunk of the files with an MTP block still gives llama.cpp's logits (llama-cpp-python
    loads them, the block included).
  - Greedy `kiri run --spec mtp` prints exactly what `kiri run` prints over 150 tokens (about 10
    KV blocks of 16: every rejected draft rolls back the head's keys with the trunk's, across
    block ends), drafts kept and rejected; on Vulkan too.
  - Served with --spec mtp: mtp, ngram and plain requests batched four at a time give `kiri run`'s
    texts; /metrics counts the drafted and the kept tokens of "mtp"; idle, no block and no state
    slot is held; a cancelled mtp stream gives its blocks and slots back and the next request in
    its slot is still the plain text.
  - The adaptive switch: a head whose drafts are seldom right (qwen35-b's random block) stops
    drafting for the sequence after a few verifications.
  - Refusals: --spec mtp on a model without the head (kiri run, kiri serve), "mtp" asked of a
    server started without it; kiri info names the head.
"""
import json
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hybrid_checks as hc  # noqa: E402
from conftest import free_port  # noqa: E402
import test_families as tf  # noqa: E402
import tiny_qwen35 as tq  # noqa: E402
from test_families import Case, check, dump_tool, prompt, run_dump  # noqa: E402,F401

MODELS_DIR = tf.MODELS_DIR
MTP_FILES = ["qwen35-b", "qwen35-mtp", "qwen35-mtp-bare"]
GOOD_HEADS = ["qwen35-mtp", "qwen35-mtp-bare"]
PROMPT = "the cat sat on the mat and the dog"
SERVE = ["--ctx", "256", "--chunk", "16", "--kv-type", "f32", "--cpu-kernels", "c", "-t", "1"]


@pytest.fixture(scope="module")
def files():
    return tq.ensure(MODELS_DIR)


@pytest.fixture(scope="module")
def mtp_tool():
    return tf._tool("mtp_logits", "KIRI_MTP_LOGITS")


def run_head(tool, path, toks, draft, backend="cpu"):
    out = os.path.join(MODELS_DIR, f"mtp-rows-{os.getpid()}.bin")
    env = dict(os.environ, KIRI_BACKEND=backend, KIRI_THREADS="2")
    r = subprocess.run([tool, "--kv", "f32" if backend == "cpu" else "f16", "--draft", str(draft), "--out", out, path] +
                       [str(t) for t in toks], capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout)
    rows = np.fromfile(out, dtype=np.float32).reshape(j["rows"], j["n_vocab"])
    os.unlink(out)
    return rows, j["drafts"]


def reference_head(path, toks, draft):
    """The head's rows as mtp_logits computes them, from the float64 references: the trunk's
    hidden states of positions 0..n-2, the head over positions 0..n-2 (zeros before position 0),
    then the chain from position n-1, each step's argmax and hidden state fed to the next."""
    n = len(toks)
    _, h = tq.reference_logits(path, toks[:-1], return_hidden=True)
    hs = np.concatenate([np.zeros((1, h.shape[1])), h])
    L, _ = tq.reference_mtp(path, toks[:-1], hs[:-1])
    rows, ids, ctoks, chs = [L], [], list(toks), list(hs)
    for _ in range(draft):
        Lc, hc_ = tq.reference_mtp(path, ctoks, np.array(chs))
        rows.append(Lc[-1:])
        ids.append(int(np.argmax(Lc[-1])))
        ctoks.append(ids[-1])
        chs.append(hc_[-1])
    assert len(ctoks) == n + draft
    return np.concatenate(rows), ids


def rel(K, R):
    return np.abs(K - R).max(axis=-1) / np.abs(R).max(axis=-1)


@pytest.mark.parametrize("name", MTP_FILES)
def test_head_logits_vs_reference(name, files, mtp_tool):
    """Every position's head logits and a chained draft of 4, within 1e-4 of the float64 block
    (measured: a few 1e-6, F32 weights and cache); the drafted tokens are the reference's."""
    path = files[name]
    toks = prompt(Case(hc.TinyModel(tq.variant(name)), tf.N_CTX))[:24]
    K, drafts = run_head(mtp_tool, path, toks, 4)
    R, want = reference_head(path, toks, 4)
    e = rel(K, R)
    tf.log(f"mtp head {name}: worst {e.max():.2e} over {len(e)} rows")
    assert e.max() <= 1e-4, (name, e)
    assert drafts == want, (drafts, want)


@pytest.mark.parametrize("name", GOOD_HEADS)
def test_trunk_still_llama_cpp(name, files, dump_tool):
    """The files with an MTP block (and its optional tensors) load in llama.cpp, and the trunk's
    logits are llama.cpp's at every position (test_families' F32 bounds)."""
    c = Case(hc.TinyModel(tq.variant(name)), tf.N_CTX)
    assert files[name] == c.path
    toks = prompt(c)
    K = run_dump(dump_tool, c, toks, kv="f32", chunk=5)
    check(c, toks, K, tf.chunk_positions(len(toks), 5), "f32", "--chunk 5")


# On these tiny models the head costs about what a step does, so drafting by cost would stop after
# the first drafts: the tests of what the head drafts let acceptance alone decide.
SPEC_ENV = {"KIRI_SPEC_IGNORE_COST": "1"}


def run(kiri_bin, path, spec, n=150, extra=()):
    r = subprocess.run([str(kiri_bin), "run", "-m", path, "--raw", "-p", PROMPT, "-n", str(n), "--temp", "0", "-t",
                        "1", "--cpu-kernels", "c", "--kv-type", "f32", "--spec", spec, *extra],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ, **SPEC_ENV))
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def drafted_kept(log):
    m = re.search(r"speculative \(mtp\): (\d+) tokens drafted, (\d+) kept", log)
    assert m, log
    return int(m.group(1)), int(m.group(2))


@pytest.mark.parametrize("name", MTP_FILES)
def test_run_greedy_same(name, files, kiri_bin):
    """150 greedy tokens: `--spec mtp` prints `kiri run`'s text exactly; the good heads' drafts
    are kept and rejected (every rejection a rollback of the trunk's state and the head's keys),
    and the random head's are mostly rejected."""
    plain, _ = run(kiri_bin, files[name], "none")
    text, log = run(kiri_bin, files[name], "mtp")
    assert text == plain, name
    drafted, kept = drafted_kept(log)
    assert "speculative decoding is off" not in log
    if name in GOOD_HEADS:
        assert drafted > kept > 0.3 * drafted, (name, drafted, kept)
    else:
        assert drafted > 0 and kept < drafted, (name, drafted, kept)


def check_traced_drafts(path, trace):
    """Every proposal the drafter made (KIRI_MTP_TRACE: the sequence up to the pending token, the
    drafts, each one's logit) against the float64 references: the head over every position before
    the pending one after the trunk's hidden states, then chained from the pending token. Each
    draft's logit is the reference's largest within 1e-4 of the row's largest magnitude (a few
    1e-6 measured); a chain is compared up to its first draft that is not the reference's argmax,
    which must then be a near tie. Returns the number of drafts compared."""
    props = [json.loads(ln) for ln in open(trace)]
    assert props, "no proposal was traced"
    longest = max(props, key=lambda pr: len(pr["tokens"]))["tokens"]
    _, h = tq.reference_logits(path, longest, return_hidden=True)
    compared = 0
    for pr in props:
        toks, drafts, logits = pr["tokens"], pr["drafts"], pr["logits"]
        assert toks == longest[:len(toks)], "the proposals are not of one sequence"
        ctoks, chs = list(toks), list(np.concatenate([np.zeros((1, h.shape[1])), h[:len(toks) - 1]]))
        for d, lg in zip(drafts, logits):
            L, hn = tq.reference_mtp(path, ctoks, np.array(chs))
            row = L[-1]
            compared += 1
            assert abs(lg - row.max()) <= 1e-4 * np.abs(row).max(), (len(toks), drafts, lg, row.max())
            if d != int(np.argmax(row)):
                assert row.max() - row[d] <= 1e-4 * np.abs(row).max(), (len(toks), drafts, int(np.argmax(row)))
                break
            ctoks.append(d)
            chs.append(hn[-1])
    return compared


@pytest.mark.parametrize("name", MTP_FILES)
def test_drafts_follow_the_sequence(name, files, kiri_bin, tmp_path):
    """What the drafter proposes in the serving loop is the head of the references at that point:
    its keys and values kept up with every kept position (prompt chunks, accepted drafts) and cut
    back with every rejection, the hidden state before the pending token the trunk's (60 tokens,
    chunks of 5, so prompt chunks and verifications cross block ends)."""
    trace = tmp_path / "mtp.jsonl"
    env = dict(os.environ, KIRI_MTP_TRACE=str(trace), **SPEC_ENV)
    r = subprocess.run([str(kiri_bin), "run", "-m", files[name], "--raw", "-p", PROMPT, "-n", "60", "--temp", "0",
                        "-t", "1", "--cpu-kernels", "c", "--kv-type", "f32", "--spec", "mtp", "--batch-size", "5"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    compared = check_traced_drafts(files[name], trace)
    tf.log(f"mtp drafts {name}: {compared} compared")


def test_random_head_switched_off(files, kiri_bin):
    """A head whose drafts are seldom kept (qwen35-b's random block) stops drafting for good after
    a few verifications: it would cost a pass of the block per token for nothing. It starts at two
    tokens and a rate of one half, so three drafts that keep nothing (2 + 1 + 1 tokens) switch it
    off for the rest of the 150 tokens."""
    _, log = run(kiri_bin, files["qwen35-b"], "mtp")
    drafted, kept = drafted_kept(log)
    assert kept == 0 and drafted == 4, (drafted, kept)


def test_refusals_and_info(files, kiri_bin, start_server):
    """--spec mtp on a file without the head is an error naming it, for kiri run and kiri serve;
    "mtp" asked of a speculating server started without --spec mtp, or of one whose model has no
    head, is a 400 naming "speculative"; kiri info
    says which files carry the head and what it uses."""
    r = subprocess.run([str(kiri_bin), "run", "-m", files["qwen35-a"], "-p", "a", "-n", "4", "--spec", "mtp"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "multi-token-prediction head" in r.stderr, r.stderr
    r = subprocess.run([str(kiri_bin), "serve", "-m", files["qwen35-a"], "--spec", "mtp", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "multi-token-prediction head" in r.stderr, r.stderr
    for path, said in ((files["qwen35-mtp"], "--spec mtp"), (files["qwen35-a"], "this model has none")):
        srv = start_server(["-m", path, "--parallel", "1", "--spec", "ngram"] + SERVE, model=False)
        r = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "speculative": "mtp"})
        assert r.status == 400 and r.json["error"]["param"] == "speculative", r
        assert said in r.json["error"]["message"], r.json
    # One attention layer's keys and values: 2 KV heads x 32 (qwen35-b: 1 x 32), K and V, F16.
    for name, want in (("qwen35-mtp", "its own embedding, its own output head: drafts for --spec mtp, its keys and "
                                      "values 0.2 KiB more per token"),
                       ("qwen35-mtp-bare", "after the 5 of the trunk: drafts for --spec mtp, its keys and values 0.2"),
                       ("qwen35-b", "after the 6 of the trunk: drafts for --spec mtp, its keys and values 0.1")):
        r = subprocess.run([str(kiri_bin), "info", "-m", files[name]], capture_output=True, text=True, timeout=60)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("mtp head:")), "")
        assert want in line, (name, r.stdout)
    r = subprocess.run([str(kiri_bin), "info", "-m", files["qwen35-a"]], capture_output=True, text=True, timeout=60)
    assert "mtp head:" not in r.stdout
    # nextn_predict_layers 1 without the block: the trunk runs (qwen35-a's text), --spec mtp is refused.
    plain, _ = run(kiri_bin, files["qwen35-a"], "none", n=20)
    assert run(kiri_bin, files["qwen35-nextn-gone"], "none", n=20)[0] == plain
    r = subprocess.run([str(kiri_bin), "run", "-m", files["qwen35-nextn-gone"], "-p", "a", "-n", "4", "--spec", "mtp"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "multi-token-prediction head" in r.stderr, r.stderr


def test_bench_spec(files, kiri_bin):
    """kiri bench --spec mtp times greedy generation without and with the head and counts its
    drafts (--json)."""
    r = subprocess.run([str(kiri_bin), "bench", "-m", files["qwen35-mtp-bare"], "--spec", "mtp", "-n", "48", "-r", "1",
                        "-t", "1", "--json", "--text", PROMPT], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **SPEC_ENV))
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    assert j["spec"] == "mtp" and j["drafted"] > j["accepted"] > 0 and j["plain_tok_s"] > 0, j


def test_sampling_runs(files, kiri_bin):
    """Sampling (temperature 0.3, a seed) verifies the head's drafts by the rejection rule: drafts
    are kept and rejected, and the same seed gives the same text again."""
    out = []
    for _ in range(2):
        text, log = run(kiri_bin, files["qwen35-mtp"], "mtp", n=80, extra=("--temp", "0.3", "--seed", "7"))
        drafted, kept = drafted_kept(log)
        assert drafted > kept > 0, log
        out.append(text)
    assert out[0] == out[1]


SERVE_PROMPTS = [PROMPT, "once upon a time there was a cat", "a b c d e f g a b c d e f g a b c", "hello world"]


def cli_text(kiri_bin, path, p, n):
    r = subprocess.run([str(kiri_bin), "run", "-m", path, "--raw", "-p", p, "-n", str(n), "--temp", "0", "-t", "1",
                        "--cpu-kernels", "c", "--kv-type", "f32"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout[:-1] if r.stdout.endswith("\n") else r.stdout


def idle(srv):
    deadline = time.monotonic() + 10
    while True:
        m = srv.metrics()
        if (m["kiri_requests_running"] == 0 and m["kiri_kv_blocks_used"] == 0 and m["kiri_state_slots_used"] == 0) \
                or time.monotonic() > deadline:
            return m
        time.sleep(0.05)


DRAFTED = 'kiri_spec_draft_tokens_total{drafter="mtp"}'
KEPT = 'kiri_spec_accepted_tokens_total{drafter="mtp"}'


@pytest.mark.parametrize("name", GOOD_HEADS)
def test_served_mixed(name, files, kiri_bin, start_server):
    """mtp, ngram and plain requests (four prompts each) batched four at a time on a server with
    --spec mtp: each text is `kiri run --raw`'s over 100 tokens; /metrics counts mtp drafts kept
    and rejected; idle, nothing is held. A request that does not say speculates with mtp (the
    server's --spec)."""
    path, n = files[name], 100
    srv = start_server(["-m", path, "--parallel", "4", "--spec", "mtp"] + SERVE, model=False, env=SPEC_ENV)
    jobs = [(i, spec) for i in range(len(SERVE_PROMPTS)) for spec in ("mtp", "ngram", "none", None)]
    results = [None] * len(jobs)
    barrier = threading.Barrier(len(jobs))

    def go(j):
        barrier.wait()
        i, spec = jobs[j]
        body = {"prompt": SERVE_PROMPTS[i], "max_tokens": n, "temperature": 0}
        if spec:
            body["speculative"] = spec
        results[j] = srv.post("/v1/completions", body)

    threads = [threading.Thread(target=go, args=(j,)) for j in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    want = [cli_text(kiri_bin, path, p, n) for p in SERVE_PROMPTS]
    for (i, spec), r in zip(jobs, results):
        assert r.status == 200, r
        assert r.json["choices"][0]["text"] == want[i], (i, spec)
    m = idle(srv)
    assert m[DRAFTED] > m[KEPT] > 0, m
    assert m["kiri_state_slots_used"] == 0 and m["kiri_kv_blocks_used"] == 0, m


def test_cancelled_stream_frees(files, kiri_bin, start_server):
    """An mtp stream closed after three tokens: once idle no block and no state slot is held, and
    the next mtp request in that slot gives the plain text."""
    path = files["qwen35-mtp"]
    srv = start_server(["-m", path, "--parallel", "1", "--spec", "mtp"] + SERVE, model=False, env=SPEC_ENV)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True,
                       "speculative": "mtp"}).encode()
    hc.close_after_events(srv, body, 3)
    m = idle(srv)
    assert m["kiri_requests_running"] == 0 and m["kiri_state_slots_used"] == 0 and m["kiri_kv_blocks_used"] == 0, m
    assert m[DRAFTED] > 0, m
    r = srv.post("/v1/completions", {"prompt": PROMPT, "max_tokens": 60, "temperature": 0, "speculative": "mtp"})
    assert r.status == 200, r
    assert r.json["choices"][0]["text"] == cli_text(kiri_bin, path, PROMPT, 60)


def test_vulkan(files, mtp_tool, kiri_bin):
    """On the Vulkan backend (lavapipe without a GPU): the head's logits at the GPU bound of
    test_families (1e-2 of the row's largest, F16 cache), and `kiri run --spec mtp` prints what
    `kiri run` prints there."""
    if not tf._vulkan_device():
        pytest.skip("no Vulkan driver on this machine (not even lavapipe)")
    for name in ("qwen35-b", "qwen35-mtp"):
        toks = prompt(Case(hc.TinyModel(tq.variant(name)), tf.N_CTX))[:16]
        K, _ = run_head(mtp_tool, files[name], toks, 2, backend="vulkan")
        R, _ = reference_head(files[name], toks, 2)
        e = rel(K, R)
        tf.log(f"mtp head {name} on vulkan: worst {e.max():.2e}")
        assert e.max() <= 1e-2, (name, e)
    path = files["qwen35-mtp"]
    plain, _ = run(kiri_bin, path, "none", n=40, extra=("--backend", "vulkan"))
    text, log = run(kiri_bin, path, "mtp", n=40, extra=("--backend", "vulkan"))
    assert text == plain
    drafted, kept = drafted_kept(log)
    assert drafted > 0, log
