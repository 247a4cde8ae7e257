"""kiri on stories260K against llama.cpp's recorded outputs (shared/reference/stories260K-greedy.json:
for each prompt, its token ids with BOS, 64 greedy output ids and their text, and for some prompts
the ten largest logits at the last prompt position).

Checked through the public API (tests/tools/dump_logits) and through the command line (kiri
tokenize, kiri run --temp 0):
  - tokenizing the prompt gives prompt_tokens;
  - greedy decoding from prompt_tokens gives output_tokens (token by token and with the prompt
    prefilled in one batch), and `kiri run` prints output_text;
  - the listed top logits match, and the first listed id is kiri's argmax.

The logit tolerance is 1e-2, not 1e-3: the recorded logits come from llama.cpp with flash attention
on, which rounds Q, K and V to F16. Measured with llama-cpp-python 0.3.36, the same llama.cpp with
flash attention reproduces them to 2e-6, but without it they are up to 2.6e-3 (F16 KV cache) or
4.6e-3 (F32 KV cache) away, and exact float64 arithmetic (make_tiny_models.reference_logits) is
4.6e-3 away. A correct kiri therefore cannot be held to 1e-3 unless it copies that rounding; 1e-2
still catches any real defect (the logits are 8-18), and test_logits.py holds stories260K to 1e-4
against llama.cpp at every position with matching settings.

Environment: KIRI_BIN (default <repo>/build/kiri), KIRI_DUMP_LOGITS (see test_logits.py),
KIRI_SHARED_DIR (default <repo>/../shared).
"""

import json
import os
import re
import subprocess

import pytest

from test_logits import REPO, dump_tool, run_dump  # noqa: F401  (dump_tool is a fixture)
import make_tiny_models as mtm

KIRI = os.environ.get("KIRI_BIN", os.path.join(REPO, "build", "kiri"))
MODEL = os.path.join(REPO, "models", "stories260K.gguf")
REFERENCE = os.path.join(mtm.SHARED, "reference", "stories260K-greedy.json")
LOGIT_TOL = 1e-2

with open(REFERENCE) as f:
    ENTRIES = json.load(f)
TOP = [e for e in ENTRIES if e.get("top_logits_last_prompt_pos")]


def ids(entries):
    return [e["prompt"] for e in entries]


@pytest.fixture(scope="session")
def kiri_bin():
    if not os.path.exists(KIRI):
        pytest.skip(f"no kiri command line at {KIRI} (build kiri first)")
    return KIRI


def run(cmd):
    r = subprocess.run(cmd, capture_output=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n" + \
        r.stderr.decode(errors="replace")
    return r.stdout


@pytest.mark.parametrize("entry", ENTRIES, ids=ids(ENTRIES))
def test_prompt_tokens_api(entry, dump_tool):  # noqa: F811
    out = json.loads(run([dump_tool, "--tokenize", MODEL, entry["prompt"]]))
    assert out["tokens"] == entry["prompt_tokens"]


@pytest.mark.parametrize("entry", ENTRIES, ids=ids(ENTRIES))
def test_prompt_tokens_cli(entry, kiri_bin):
    out = run([kiri_bin, "tokenize", "-m", MODEL, entry["prompt"]]).decode()
    got = [int(x) for x in re.findall(r"-?\d+", out)]
    assert got == entry["prompt_tokens"], f"kiri tokenize printed {out!r}"


@pytest.mark.parametrize("batch", [False, True], ids=["token-by-token", "batched-prefill"])
@pytest.mark.parametrize("entry", ENTRIES, ids=ids(ENTRIES))
def test_greedy_ids(entry, batch, dump_tool):  # noqa: F811
    want = entry["output_tokens"]
    _, got = run_dump(dump_tool, MODEL, entry["prompt_tokens"], batch=batch, greedy=len(want))
    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert got == want, f"first difference at output step {first}: kiri {got} vs reference {want}"


@pytest.mark.parametrize("entry", ENTRIES, ids=ids(ENTRIES))
def test_greedy_text_cli(entry, kiri_bin):
    n = len(entry["output_tokens"])
    out = run([kiri_bin, "run", "-m", MODEL, "-p", entry["prompt"], "-n", str(n), "--temp", "0"])
    want = bytes.fromhex(entry["output_bytes_hex"]) + b"\n"
    assert out == want, f"kiri run printed {out!r}, want {want!r}"


@pytest.mark.parametrize("batch", [False, True], ids=["token-by-token", "batched-prefill"])
@pytest.mark.parametrize("entry", TOP, ids=ids(TOP))
def test_top_logits(entry, batch, dump_tool):  # noqa: F811
    rows, _ = run_dump(dump_tool, MODEL, entry["prompt_tokens"], batch=batch)
    last = rows[-1]
    top = entry["top_logits_last_prompt_pos"]
    diffs = [(t["id"], float(last[t["id"]]), t["logit"]) for t in top]
    worst = max(diffs, key=lambda d: abs(d[1] - d[2]))
    assert abs(worst[1] - worst[2]) <= LOGIT_TOL, \
        f"token {worst[0]}: kiri {worst[1]:.6f} vs reference {worst[2]:.6f}; all: {diffs}"
    assert int(last.argmax()) == top[0]["id"]


def test_cpu_kernels_flag(kiri_bin):
    """--cpu-kernels c runs the portable kernels and still prints llama.cpp's text; a tier that does
    not exist, or that this CPU lacks, is a clear error (exit 1), not a crash."""
    entry = ENTRIES[0]
    n = len(entry["output_tokens"])
    out = run([kiri_bin, "run", "-m", MODEL, "-p", entry["prompt"], "-n", str(n), "--temp", "0",
               "--cpu-kernels", "c"])
    assert out == bytes.fromhex(entry["output_bytes_hex"]) + b"\n"
    wrong = "neon" if os.uname().machine in ("x86_64", "AMD64") else "avx2"
    for tier, msg in (("bogus", b"unknown CPU kernels"), (wrong, b"this CPU lacks")):
        r = subprocess.run([kiri_bin, "run", "-m", MODEL, "-p", "x", "-n", "1", "--cpu-kernels", tier],
                           capture_output=True, timeout=60)
        assert r.returncode == 1 and msg in r.stderr, (tier, r.returncode, r.stderr)
