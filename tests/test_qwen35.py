"""qwen35 (Qwen3.5 dense, text: Gated DeltaNet layers among gated full-attention layers) on the tiny
files of tiny_qwen35.py, held to llama.cpp (llama-cpp-python) and to tiny_qwen35's float64
reference by test_families.py's criteria (its check(), whose docstring gives the bounds):

  - logits at every position, one token a step, in prompt chunks of 2, 3, 5 and 16 and in one
    batch (a chunk's tokens pass the convolution window and the delta-rule state along inside one
    step), F32 and F16 KV, on four F32 files (3 of 4, 4 of 6 and 6 of 8 layers recurrent by the
    interval, 3 of 5 listed by attention.recurrent_layers; 2 key heads for 4 value heads, and 1
    for 3; one with Qwen3.5's head sizes and RoPE sections) and a Q8_0 one (held to llama.cpp within a tenth of llama.cpp's distance from exact);
  - on every CPU kernel tier this machine runs (c, avx2, avx512), and on Vulkan (lavapipe): token
    by token and in chunks of 5 on qwen35-a, qwen35-c, qwen35-d and the Q8_0 file, and with the
    first two layers on Vulkan and the others on the CPU (states on both), and three sequences
    batched;
  - three sequences side by side in one batching loop (each step's recurrences walk several
    sequences' states);
  - through kiri serve: greedy completions unchanged by batching, a repeated prompt (its whole
    blocks reused from a snapshot of the delta-rule state and convolution window at a block's
    end: the same completion as the first), a prompt that extends a cached one, preemption in a
    pool too small for three (recomputed without room for snapshots, resumed from one with), and
    a request after a cancelled one in the same slot; the state's and the snapshots' bytes in
    /metrics and taken from --kv-memory;
  - the multi-token-prediction block of qwen35-b loaded for --spec mtp (test_mtp.py) and not run
    by the forward pass; a vision tower's tensors left unused, said so at load;
  - refusals: a mixture of experts (expert_count), RoPE sections that turn pairs by the fourth
    position, a tensor the graph does not read; kiri info's state line;
  - Qwen3.5's chat template against jinja2, and its pre-tokenizer against llama.cpp.
"""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_families as tf  # noqa: E402
import tiny_qwen35 as tq  # noqa: E402
import hybrid_checks as hs  # noqa: E402
from test_families import Case, batch_tool, check, chunk_positions, dump_tool, prompt, run_dump  # noqa: E402,F401
from test_logits import _cpu_tiers, rel_err, worst  # noqa: E402

MODELS_DIR = tf.MODELS_DIR
N_CTX = tf.N_CTX


CASES = [Case(hs.TinyModel(tq.variant(n)), N_CTX) for n in ("qwen35-a", "qwen35-b", "qwen35-c", "qwen35-d", "qwen35-q8")]
F32_CASES = [c for c in CASES if c.wtype == "F32"]


@pytest.fixture(scope="session")
def qwen35_files():
    return tq.ensure(MODELS_DIR)


@pytest.fixture
def qc(request, qwen35_files):
    c = request.param
    assert qwen35_files[c.fam.name] == c.path
    return c


def qcheck(c, toks, K, at, kv, what):
    """check(), and for the Q8_0 file with an F32 cache kiri held to llama.cpp within a tenth of
    llama.cpp's distance from E: both quantize the activations of a Q8_0 product to Q8_0, which
    puts llama.cpp 1e-1 from E (E takes the activations as they are), and which check()'s
    quantized rule (against E only) would not see. Not at the F32 bound, as lfm2's Q8_0 file is:
    the delta rule's sums run in another order in llama.cpp, and an activation that rounds to
    the other Q8_0 step moves the logits by some 1e-3 (measured 5e-3 at most)."""
    check(c, toks, K, at, kv, what)
    if c.wtype == "Q8_0" and kv == "f32":
        L_all = tf.llama_logits(c.path, toks, kv, c.n_ctx)
        L, E = L_all[at], tf.exact_logits(c.path, toks, c.n_ctx)[at]
        e, e_le = rel_err(K, L).max(), rel_err(L, E).max()
        tf.log(f"kiri {c.name} {what}: Q8_0 activations vs llama.cpp {e:.2e} (llama.cpp vs exact {e_le:.2e})")
        assert e <= 0.1 * e_le, f"{c.name} {what}: kiri vs llama.cpp {e:.2e}: " + worst(K, L, "kiri", "llama.cpp")


@pytest.mark.parametrize("qc", F32_CASES, indirect=True, ids=repr)
def test_qwen35_llama_cpp_vs_exact(qc):
    """llama.cpp agrees with tiny_qwen35.reference_logits: the keys and tensors (which layers are
    recurrent, q/k/v's order in attn_qkv, value head j reading key head j mod Hk, the decay's
    sign, the gates, the queries' interleaved output gate, the text-position RoPE sections) mean
    what E computes."""
    toks = prompt(qc)
    E = tf.exact_logits(qc.path, toks, qc.n_ctx)
    L = tf.llama_logits(qc.path, toks, "f32", qc.n_ctx)
    e = rel_err(L, E).max()
    tf.log(f"llama.cpp-vs-exact {qc.name:28s} {e:.2e}")
    assert e <= tf.LLAMA_CPP_EXACT_F32, f"{qc.name}: llama.cpp vs exact {e:.2e}: " + worst(L, E, "llama.cpp", "exact")


@pytest.mark.parametrize("qc", CASES, indirect=True, ids=repr)
def test_qwen35_every_position_and_chunks(qc, dump_tool):
    """Token by token, in chunks of 2, 3, 5 and 16 and in one batch, F32 KV; token by token and
    in chunks of 5 with the F16 KV cache."""
    toks = prompt(qc)
    K = run_dump(dump_tool, qc, toks, kv="f32")
    qcheck(qc, toks, K, list(range(len(toks))), "f32", "token by token")
    for chunk in (2, 3, 5, 16):
        K = run_dump(dump_tool, qc, toks, kv="f32", chunk=chunk)
        qcheck(qc, toks, K, chunk_positions(len(toks), chunk), "f32", f"--chunk {chunk}")
    K = run_dump(dump_tool, qc, toks, kv="f32", batch=True)
    qcheck(qc, toks, K, [len(toks) - 1], "f32", "--batch")
    K = run_dump(dump_tool, qc, toks, kv="f16")
    qcheck(qc, toks, K, list(range(len(toks))), "f16", "token by token")
    K = run_dump(dump_tool, qc, toks, kv="f16", chunk=5)
    qcheck(qc, toks, K, chunk_positions(len(toks), 5), "f16", "--chunk 5")


@pytest.mark.parametrize("tier", _cpu_tiers())
@pytest.mark.parametrize("qc", CASES, indirect=True, ids=repr)
def test_qwen35_cpu_tiers(qc, tier, dump_tool):
    """Each CPU kernel tier, token by token and in chunks of 3 and 16, F32 KV."""
    toks = prompt(qc)
    K = run_dump(dump_tool, qc, toks, kv="f32", cpu_kernels=tier)
    qcheck(qc, toks, K, list(range(len(toks))), "f32", f"token by token, {tier} kernels")
    for chunk in (3, 16):
        K = run_dump(dump_tool, qc, toks, kv="f32", chunk=chunk, cpu_kernels=tier)
        qcheck(qc, toks, K, chunk_positions(len(toks), chunk), "f32", f"--chunk {chunk}, {tier} kernels")


@pytest.mark.parametrize("qc", CASES, indirect=True, ids=repr)
def test_qwen35_batched_with_other_sequences(qc, batch_tool):
    """Three sequences side by side in one batching loop, fed 1, 3 and 7 tokens a round: every
    step's convolutions and delta rules read and update three sequences' states."""
    tf.run_batched(qc, batch_tool)


# ------------------------------------------------------------------------------------------------
# The multi-token-prediction head, refusals and kiri info
# ------------------------------------------------------------------------------------------------

def test_qwen35_mtp_head_loaded_for_drafts(qwen35_files, dump_tool):
    """qwen35-b's block_count counts its multi-token-prediction block (nextn_predict_layers 1):
    its tensors are loaded for --spec mtp (test_mtp.py), the forward pass does not run them (the
    logits above are the trunk's, as llama.cpp's), and the load says nothing of unused tensors."""
    r = subprocess.run([dump_tool, "--n-ctx", "32", "--out", os.devnull, qwen35_files["qwen35-b"], "1", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "not run" not in r.stderr and "not used" not in r.stderr, r.stderr


def test_qwen35_vision_tensors_left_unused(qwen35_files, dump_tool):
    """A file that carries a vision tower (v.*) and its projector (mm.*) runs as text, says so, and
    gives qwen35-a's logits exactly (the same weights otherwise)."""
    c = next(c for c in CASES if c.fam.name == "qwen35-a")
    toks = prompt(c)
    K = run_dump(dump_tool, c, toks, kv="f32", chunk=5)
    with_tower = Case(hs.TinyModel(tq.variant("qwen35-vision")), N_CTX)
    assert qwen35_files["qwen35-vision"] == with_tower.path
    assert (run_dump(dump_tool, with_tower, toks, kv="f32", chunk=5) == K).all()
    r = subprocess.run([dump_tool, "--n-ctx", "32", "--out", os.devnull, with_tower.path, "1", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "the file's 3 vision/audio tensors (v.*, a.*, mm.*) are not used" in r.stderr, \
        r.stderr


@pytest.mark.parametrize("name,named", [("qwen35-moe", "qwen35.expert_count"),
                                        ("qwen35-sections", "qwen35.rope.dimension_sections"),
                                        ("qwen35-extra", "blk.0.ssm_extra.weight"),
                                        ("qwen35-heads", "qwen35.ssm.time_step_rank"),
                                        ("qwen35-taps", "qwen35.ssm.conv_kernel"),
                                        ("qwen35-nextn", "qwen35.nextn_predict_layers")])
def test_qwen35_refused(name, named, qwen35_files, dump_tool):
    """A mixture of experts (qwen35moe's key), RoPE sections that leave rotated pairs to the
    fourth position (which text tokens hold at 0), a tensor no qwen35 graph reads, value heads
    that are no multiple of the key heads, a one-tap convolution and a multi-token-prediction
    count that leaves no trunk are load errors naming the key or the tensor."""
    r = subprocess.run([dump_tool, "--n-ctx", "32", qwen35_files[name], "1", "2"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0, f"{name}: kiri ran it"
    assert named in r.stderr, r.stderr


@pytest.mark.parametrize("qc", [c for c in CASES if c.fam.name in ("qwen35-a", "qwen35-c", "qwen35-d", "qwen35-q8")],
                         indirect=True, ids=repr)
def test_qwen35_vulkan(qc, dump_tool):
    """The Vulkan backend (lavapipe on a machine without a GPU) runs every layer, the convolution
    window and the delta-rule state in its memory, the attention's output gate too: token by
    token at every position and in chunks of 5 (a chunk's tokens pass the states along inside one
    step), F16 KV, at test_families' GPU bounds; qwen35-c has Qwen3.5's head sizes."""
    tf.run_vulkan_every_position(qc, dump_tool, 5)


@pytest.mark.parametrize("qc", [c for c in CASES if c.fam.name == "qwen35-a"], indirect=True, ids=repr)
def test_qwen35_vulkan_gpu_layers(qc, dump_tool):
    """Layers 0 and 1 (Gated DeltaNet) on Vulkan, 2 (Gated DeltaNet) and 3 (gated attention) on
    the CPU: each layer's state on the backend that runs it."""
    tf.run_vulkan_every_position(qc, dump_tool, 5, gpu_layers=2)


@pytest.mark.parametrize("qc", [c for c in CASES if c.fam.name == "qwen35-a"], indirect=True, ids=repr)
def test_qwen35_vulkan_batched(qc, batch_tool):
    """Three sequences side by side in one batching loop on Vulkan, fed 1, 3 and 7 tokens a
    round: each step's convolution and delta-rule shaders walk several sequences' states."""
    tf.run_batched(qc, batch_tool, backend="vulkan")


# qwen35-a's state per sequence: 3 recurrent layers x (3 convolution inputs x 128 channels + 4
# heads x 16 x 16) floats x 4 bytes = 16896 bytes (16.5 KiB).
STATE_A = 3 * (3 * 128 + 4 * 16 * 16) * 4


def test_qwen35_info_shows_state(qwen35_files, kiri_bin):
    """kiri info names the Gated DeltaNet layers and their state per sequence, and the snapshots
    of it kept for prefix reuse (as large, 2 per sequence)."""
    r = subprocess.run([str(kiri_bin), "info", "-m", qwen35_files["qwen35-a"]], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("delta net:")), "")
    assert "3 of 4 layers" in line and "4 taps" in line and f"{STATE_A / 1024:.1f} KiB per sequence" in line, r.stdout
    assert "in the 1 attention layers" in r.stdout, r.stdout
    snap = next((ln for ln in r.stdout.splitlines() if ln.startswith("snapshots:")), "")
    assert f"{STATE_A / 1024:.1f} KiB each" in snap and "2 per sequence" in snap, r.stdout
    r = subprocess.run([str(kiri_bin), "info", "-m", qwen35_files["qwen35-b"]], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0 and "mtp head:      1 multi-token-prediction layer" in r.stdout, r.stdout


# ------------------------------------------------------------------------------------------------
# kiri serve: batching, a repeated prompt, preemption, a cancelled request
# ------------------------------------------------------------------------------------------------

def test_qwen35_server_batching_and_repeated_prompt(start_server, qwen35_files):
    """hybrid_checks.batching_and_repeated_prompt: batched equals alone equals llama.cpp; a
    repeated prompt reuses its blocks from a state snapshot; a state slot of STATE_A and 2
    snapshots for each of the 3 sequences in /metrics."""
    hs.batching_and_repeated_prompt(start_server, qwen35_files["qwen35-a"], "qwen35-a", STATE_A)


# One attention layer x (K + V) x 64 floats x 4 bytes = 512 bytes a token, 8 KiB a block: 8 blocks
# (one 128-token context) and 3 states.
POOL = 8 * 8192 + 3 * STATE_A


def test_qwen35_server_preemption(start_server, qwen35_files):
    """hybrid_checks.preemption in a pool of 8 blocks and 3 states: a preempted sequence's delta-rule
    state and convolution window are freed with its blocks and computed again from its tokens."""
    hs.preemption(start_server, qwen35_files["qwen35-a"], "qwen35-a", POOL)


def test_qwen35_server_preemption_resumes_from_snapshot(start_server, qwen35_files):
    """hybrid_checks.preemption, two sequences at once in a pool of 11 blocks (too few for two of
    6), 2 states and 4 snapshots: the later one is preempted with its 5 whole blocks cached and
    resumes from the snapshot of its delta-rule state kept at its prompt's last whole block."""
    hs.preemption(start_server, qwen35_files["qwen35-a"], "qwen35-a", 11 * 8192 + 2 * STATE_A + 4 * STATE_A,
                  snapshots=4, parallel=2)


def test_qwen35_server_shared_system_prompt(start_server, qwen35_files):
    """hybrid_checks.shared_system_prompt: the third of three prompts with one opening resumes
    from the snapshot the second kept where they part."""
    hs.shared_system_prompt(start_server, qwen35_files["qwen35-a"], "qwen35-a")


def test_qwen35_server_reused_prefix(start_server, qwen35_files):
    """hybrid_checks.reused_prefix: a repeated long prompt, and one that extends it, reuse its
    blocks from snapshots of the delta-rule state and give llama.cpp's continuations."""
    hs.reused_prefix(start_server, qwen35_files["qwen35-a"], "qwen35-a")


@pytest.mark.parametrize("budget,snapshots,blocks", [(POOL, 0, 8), (POOL + 3 * STATE_A - 1, 2, 10),
                                                     (POOL + 6 * STATE_A + 3 * 8192, 6, 11)])
def test_qwen35_snapshots_from_the_budget(budget, snapshots, blocks, start_server, qwen35_files):
    """hybrid_checks.snapshots_in_budget: none beyond one context; 2 for a byte less than 3
    states beyond it, whose rest (a state less a byte) holds 2 more blocks; all 6 and 3 blocks
    more."""
    hs.snapshots_in_budget(start_server, qwen35_files["qwen35-a"], budget, snapshots, blocks)


@pytest.mark.parametrize("budget,named", [(POOL - 1, "holds 112 tokens"),
                                          (3 * STATE_A - 1, "the recurrent layers' state")])
def test_qwen35_state_from_the_budget(budget, named, qwen35_files, kiri_bin):
    """The state comes off --kv-memory before the blocks: a byte less than the preemption test's
    budget leaves 7 blocks, less than one context; less than the 3 states is refused naming
    them."""
    hs.refused_budget(kiri_bin, qwen35_files["qwen35-a"], budget, named)


def test_qwen35_server_after_cancel(start_server, qwen35_files):
    """hybrid_checks.after_cancel: the request after a cancelled one in the same slot starts from a
    zero state and gives llama.cpp's continuation."""
    hs.after_cancel(start_server, qwen35_files["qwen35-a"], "qwen35-a")


# ------------------------------------------------------------------------------------------------
# Qwen3.5's chat template (llama.cpp's tree) against jinja2, and its pre-tokenizer
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("conversation", ["user", "system_multi", "tool_round", "thinking"])
@pytest.mark.parametrize("with_tools", [False, True])
def test_qwen35_chat_template(conversation, with_tools, tmp_path):
    """Qwen3.5's template (ChatML turns, tools in the system prompt as XML-tagged JSON, thinking
    kept only after the last user turn, enable_thinking) renders byte for byte as jinja2 renders
    it, through test_chat_template.py's runner."""
    import test_chat_template as tct
    assert conversation in tct.JSON_CONVERSATIONS
    tct.test_family_template("Qwen3.5-4B.jinja", conversation, with_tools, tmp_path)


def test_qwen35_pre_tokenizer():
    """The pre-tokenizer Qwen3.5 files name ("qwen35") tokenizes in kiri exactly as in llama.cpp,
    over test_tokenizer_vectors.py's texts and llama.cpp's qwen35 vocabulary's test inputs."""
    tv = pytest.importorskip("test_tokenizer_vectors")
    d = tv.vocab_dir()
    path = d / "ggml-vocab-qwen35.gguf"
    header, _ = tv.kiri_tokenize(path, ["x"])
    assert header[1] == "qwen35", header
    inp = d / "ggml-vocab-qwen35.gguf.inp"
    tv.compare_with_llama_cpp(path, tv.TEXTS + (tv.inp_texts(inp) if inp.exists() else []))
