"""What the hybrid families' tests (test_lfm2.py, test_qwen35.py) share: models whose recurrent
layers keep a per-sequence state beside the KV cache. TinyModel puts a tiny file's variant in
the shape test_families' Case and prompt() read; the kiri serve checks take the tiny file, a tag
for the log and the family's numbers (its state per sequence, a pool too small for three), and
hold every completion to llama.cpp's greedy continuation (test_families.held_to_llama_cpp, an
F32 cache, logprobs within 1e-3). A prefix is reused from a snapshot of the recurrent state kept
at a block's end (16 tokens a block): cached_tokens in usage counts its tokens."""

import json
import os
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

import test_families as tf
from conftest import free_port
from test_server import COMPL, post_raw

N_CTX = tf.N_CTX
STORY = "Once upon a time, there was a little girl named Lily. She loved to play outside in the sun with her dog. "
OPENINGS = ["Lily saw a bird. ", "The sun was hot. ", "Her dog barked. ", "A cat sat down. ", "The rain fell. ",
            "Tom had a kite. ", "The boat was red. ", "Sam ate a pie. ", "A frog jumped. "]
# No speculation: its spare state slots (test_speculative.py) would take from the budgets here.
SERVE = ["--ctx", str(N_CTX), "--chunk", "16", "--kv-type", "f32", "--spec-max-seqs", "0"]
BLOCK = 16
SNAPSHOTS_PER_SEQ = 2


class TinyModel:
    """A tiny file's variant v (tiny_lfm2, tiny_qwen35) in the shape Case and prompt() read."""

    def __init__(self, v):
        self.name, self.wtype, self.twin, self.v = f"{v.name}-{v.wtype}", v.wtype, "", v
        self.path = os.path.join(tf.MODELS_DIR, v.path_name)
        self.fam = v


def complete(srv, text, n=12):
    r = srv.post(COMPL, {"prompt": text, "max_tokens": n, "temperature": 0, "logprobs": 1})
    assert r.status == 200, r
    return r.json


def at_once(srv, prompts):
    out = [None] * len(prompts)
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, complete(srv, prompts[i])))
               for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def reusable(prompt_tokens):
    """The tokens a repeated prompt of prompt_tokens reuses: its whole blocks before its last
    token (which is computed for the logits)."""
    return (prompt_tokens - 1) // BLOCK * BLOCK


def equal_logprobs(a, b, tol=1e-5):
    """Two completions of one prompt: the same text, each token's logprob within tol."""
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    err = np.abs(np.array(a["choices"][0]["logprobs"]["token_logprobs"]) -
                 np.array(b["choices"][0]["logprobs"]["token_logprobs"])).max()
    assert err <= tol, err


def batching_and_repeated_prompt(start_server, path, tag, state_bytes):
    """Three requests at once (batched) give llama.cpp's greedy continuations, the same tokens as
    one at a time (which they follow, so each reuses its own prompt's prefix); the same prompt
    alone again reuses its whole blocks (cached_tokens) from a state snapshot and gives the same
    completion, logprobs and all; /metrics shows a state slot of state_bytes for each of the 3
    sequences, none held once every request has ended (within 10 s of the last answer), and 2
    snapshots of that size per sequence, some taken and hit."""
    srv = start_server(["-m", path, "--parallel", "3"] + SERVE, model=False)
    prompts = [s + STORY for s in OPENINGS[:3]]
    alone = [complete(srv, p) for p in prompts]
    together = at_once(srv, prompts)
    for p, a, b in zip(prompts, alone, together):
        tf.held_to_llama_cpp(path, p, b, tag, 1e-3)
        # A step of several tokens may take other product kernels: the same tokens, logprobs
        # within float rounding.
        equal_logprobs(a, b)
    again = complete(srv, prompts[0])
    n = again["usage"]["prompt_tokens"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == reusable(n) > 0, again["usage"]
    tf.held_to_llama_cpp(path, prompts[0], again, tag, 1e-3)
    equal_logprobs(again, alone[0])
    # The loop frees a sequence's slot after its last event reached the client: wait for it.
    deadline = time.monotonic() + 10
    while (m := srv.metrics())["kiri_state_slots_used"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (m["kiri_state_slots_capacity"], m["kiri_state_bytes"], m["kiri_state_slots_used"]) == \
        (3, 3 * state_bytes, 0), m
    n_snap = 3 * SNAPSHOTS_PER_SEQ
    assert (m["kiri_state_snapshots_capacity"], m["kiri_state_snapshot_bytes"]) == (n_snap, n_snap * state_bytes), m
    assert 0 < m["kiri_state_snapshots_used"] <= n_snap, m
    # alone's three found nothing; together's three and again resumed from a snapshot.
    assert (m["kiri_state_snapshot_misses_total"], m["kiri_state_snapshot_hits_total"]) == (3, 4), m


def reused_prefix(start_server, path, tag):
    """A long prompt in prompt chunks of 40 tokens (a chunk that would end inside a block stops at
    the block's end, where the state is kept): the same prompt again reuses every whole block
    before its last token and gives the same completion, logprobs and all; the prompt with more
    text after it reuses at least the blocks they share; each completion is llama.cpp's; /metrics
    counts one miss (the first) and two hits."""
    srv = start_server(["-m", path, "--parallel", "2", "--ctx", str(N_CTX), "--chunk", "40", "--kv-type", "f32"],
                       model=False)
    text = OPENINGS[4] + STORY + STORY
    first = complete(srv, text)
    n = first["usage"]["prompt_tokens"]
    assert n > 4 * BLOCK and first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, first["usage"]
    tf.held_to_llama_cpp(path, text, first, tag, 1e-3)
    second = complete(srv, text)
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == reusable(n), second["usage"]
    tf.held_to_llama_cpp(path, text, second, tag, 1e-3)
    equal_logprobs(first, second)
    longer = text + OPENINGS[5]
    third = complete(srv, longer)
    assert third["usage"]["prompt_tokens_details"]["cached_tokens"] >= reusable(n) - BLOCK, third["usage"]
    tf.held_to_llama_cpp(path, longer, third, tag, 1e-3)
    m = srv.metrics()
    assert (m["kiri_state_snapshot_misses_total"], m["kiri_state_snapshot_hits_total"]) == (1, 2), m


def shared_system_prompt(start_server, path, tag):
    """Three prompts that share a long opening (a system prompt) and differ after it: the first
    finds nothing; the second finds the shared blocks cached without a snapshot at their end (a
    miss), so its prompt chunk stops there and keeps one; the third resumes from it (cached_tokens
    at least 4 blocks, a hit). Prompt chunks of 40 tokens; every completion is llama.cpp's."""
    srv = start_server(["-m", path, "--parallel", "2", "--ctx", str(N_CTX), "--chunk", "40", "--kv-type", "f32"],
                       model=False)
    system = OPENINGS[6] + STORY + STORY
    cached = []
    for user in OPENINGS[7:9] + OPENINGS[:1]:
        res = complete(srv, system + user)
        tf.held_to_llama_cpp(path, system + user, res, tag, 1e-3)
        cached.append(res["usage"]["prompt_tokens_details"]["cached_tokens"])
    m = srv.metrics()
    assert cached[0] == cached[1] == 0 and cached[2] >= 4 * BLOCK, cached
    assert (m["kiri_state_snapshot_misses_total"], m["kiri_state_snapshot_hits_total"]) == (2, 1), m


def snapshots_in_budget(start_server, path, budget, snapshots, blocks):
    """With --kv-memory the snapshots come off what the budget holds beyond the 3 states and one
    context of blocks: `snapshots` of the 6 fit, and `blocks` blocks are left."""
    srv = start_server(["-m", path, "--parallel", "3", "--kv-memory", str(budget)] + SERVE, model=False)
    m = srv.metrics()
    assert (m["kiri_state_snapshots_capacity"], m["kiri_kv_blocks_capacity"]) == (snapshots, blocks), m


def preemption(start_server, path, tag, budget, snapshots=0, parallel=3):
    """Three requests at once in a pool of `budget` bytes (the states come off it first, then too
    few blocks for three): one is preempted, its blocks and state slot freed, and later resumed
    (from a snapshot of its state where its blocks are still cached, else recomputed from its
    tokens); every completion is llama.cpp's. The round is sent again (at most three times) until
    the server counts a preemption, as a late thread may miss the others. With `snapshots` (the
    budget holds them beyond one context), a preempted sequence resumes from one: the round also
    needs a snapshot hit; without, the budget holds none and nothing is reused. `parallel`
    sequences run at once."""
    srv = start_server(["-m", path, "--parallel", str(parallel), "--kv-memory", str(budget)] + SERVE, model=False)
    seen = []
    for r in range(3):
        m0 = srv.metrics()
        assert m0["kiri_state_snapshots_capacity"] == snapshots, m0
        prompts = [s + STORY + STORY for s in OPENINGS[3 * r:3 * r + 3]]
        for p, res in zip(prompts, at_once(srv, prompts)):
            tf.held_to_llama_cpp(path, p, res, tag, 1e-3)
        m = srv.metrics()
        hit = m["kiri_state_snapshot_hits_total"] > m0["kiri_state_snapshot_hits_total"]
        assert snapshots or not hit, m
        preempted = m["kiri_preemptions_total"] > m0["kiri_preemptions_total"]
        if preempted and hit == (snapshots > 0):
            return
        seen.append((preempted, hit))
    pytest.fail("no round with a preemption" + (" resumed from a snapshot" if snapshots else "") +
                f": (preempted, hit) per round {seen}")


def refused_budget(kiri_bin, path, budget, named):
    """kiri serve with three sequences in `budget` bytes of KV memory fails, naming `named`."""
    r = subprocess.run([str(kiri_bin), "serve", "-m", path, "--port", str(free_port()), "--parallel", "3",
                        "--kv-memory", str(budget)] + SERVE, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and named in r.stderr, r.stderr


def close_after_events(srv, body, n):
    """Sends a streamed completion request (body: JSON bytes) and closes the connection once n
    events have arrived."""
    s = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
    s.sendall(post_raw(COMPL, body))
    got = b""
    while got.count(b"data: ") < n:
        part = s.recv(4096)
        assert part, got.decode(errors="replace")
        got += part
    s.close()


def after_cancel(start_server, path, tag):
    """One slot: a streamed request closed after three tokens is cancelled (its blocks and its
    state slot come back), and the next request in that slot gives llama.cpp's continuation. The
    tiny model may write all it was asked for before the server sees the close, so the round is
    tried again (at most three times) until the server counts the disconnect early."""
    srv = start_server(["-m", path, "--parallel", "1", "--ctx", "512", "--chunk", "16", "--kv-type", "f32"],
                       model=False)
    body = json.dumps({"prompt": OPENINGS[0] + STORY, "max_tokens": 440, "temperature": 0, "stream": True}).encode()
    cancelled = False
    for _ in range(3):
        m0 = srv.metrics()
        close_after_events(srv, body, 3)
        # The HTTP thread counts the disconnect after the request's end: wait for both (a
        # request that ran to its end before the close counts none).
        deadline, idle_since = time.monotonic() + 10, None
        while True:
            m = srv.metrics()
            idle = (m["kiri_requests_running"] == 0 and m["kiri_kv_blocks_used"] == 0 and
                    m["kiri_state_slots_used"] == 0)
            idle_since = (idle_since or time.monotonic()) if idle else None
            if idle and (m["kiri_client_disconnects_total"] > m0["kiri_client_disconnects_total"] or
                         time.monotonic() - idle_since > 1.0):
                break
            assert time.monotonic() < deadline, {k: v for k, v in m.items() if "running" in k or "blocks" in k}
            time.sleep(0.01)
        generated = m["kiri_generation_tokens_total"] - m0["kiri_generation_tokens_total"]
        if m["kiri_client_disconnects_total"] > m0["kiri_client_disconnects_total"] and generated < 440:
            cancelled = True
            break
    assert cancelled, "the server wrote every token before it saw the close, three times"
    text = OPENINGS[1] + STORY
    tf.held_to_llama_cpp(path, text, complete(srv, text), tag, 1e-3)
