"""lfm2 (LFM2 / LFM2.5 text: gated short-convolution blocks among GQA attention layers) on the
tiny files of tiny_lfm2.py, held to llama.cpp (llama-cpp-python) and to tiny_lfm2's float64
reference by test_families.py's criteria (its check(), whose docstring gives the bounds):

  - logits at every position, one token a step, in prompt chunks of 2, 3, 5, 7 and 16 and in one
    batch (a chunk's tokens pass the convolution state along inside one step), F32 and F16 KV,
    on two F32 files and a Q8_0 one (held to llama.cpp at the F32 bound too, see lcheck);
  - on every CPU kernel tier this machine runs (c, avx2, avx512);
  - three sequences side by side in one batching loop (each step's convolution walks several
    sequences' states);
  - through kiri serve: greedy completions unchanged by batching, a repeated prompt (its whole
    blocks reused from a snapshot of the convolution state at a block's end: the same completion
    as the first), a prompt that extends a cached one, preemption in a pool too small for three
    (recomputed from the tokens without room for snapshots, resumed from one with), snapshots
    sized from --kv-memory, and a request after a cancelled one in the same slot;
  - on Vulkan (lavapipe): token by token and in chunks of 5, F32 and Q8_0 files, and with the
    first three layers on Vulkan and the others on the CPU (convolution states on both), and
    three sequences batched;
  - refusals: a sliding-window key, a bidirectional file, a tensor the graph does not read; kiri
    info's state line;
  - LFM2's chat templates against jinja2, and its pre-tokenizer name against llama.cpp.
"""

import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_families as tf  # noqa: E402
import tiny_lfm2 as tl  # noqa: E402
import hybrid_checks as hs  # noqa: E402
from test_families import Case, batch_tool, check, chunk_positions, dump_tool, prompt, run_dump  # noqa: E402,F401
from test_logits import _cpu_tiers, rel_err, worst  # noqa: E402

MODELS_DIR = tf.MODELS_DIR
N_CTX = tf.N_CTX


CASES = [Case(hs.TinyModel(tl.variant(n)), N_CTX) for n in ("lfm2-a", "lfm2-b", "lfm2-q8")]
F32_CASES = [c for c in CASES if c.wtype == "F32"]


@pytest.fixture(scope="session")
def lfm2_files():
    return tl.ensure(MODELS_DIR)


@pytest.fixture
def lc(request, lfm2_files):
    c = request.param
    assert lfm2_files[c.fam.name] == c.path
    return c


def lcheck(c, toks, K, at, kv, what):
    """check(), and for the Q8_0 file with an F32 cache kiri held to llama.cpp at the F32 bound:
    both quantize the activations of a Q8_0 product the same way (measured 1e-7 apart), which
    check()'s quantized rule (against E only) would not see."""
    check(c, toks, K, at, kv, what)
    if c.wtype == "Q8_0" and kv == "f32":
        L = tf.llama_logits(c.path, toks, kv, c.n_ctx)[at]
        e = rel_err(K, L).max()
        assert e <= tf.TOL_F32_F32KV, f"{c.name} {what}: kiri vs llama.cpp {e:.2e}: " + \
            worst(K, L, "kiri", "llama.cpp")


@pytest.mark.parametrize("lc", F32_CASES, indirect=True, ids=repr)
def test_lfm2_llama_cpp_vs_exact(lc):
    """llama.cpp agrees with tiny_lfm2.reference_logits: the keys and tensors (which layers are
    convolutions, the kernel's tap order, B, C and x's rows in in_proj, the final norm's name)
    mean what E computes."""
    toks = prompt(lc)
    E = tf.exact_logits(lc.path, toks, lc.n_ctx)
    L = tf.llama_logits(lc.path, toks, "f32", lc.n_ctx)
    e = rel_err(L, E).max()
    tf.log(f"llama.cpp-vs-exact {lc.name:28s} {e:.2e}")
    assert e <= tf.LLAMA_CPP_EXACT_F32, f"{lc.name}: llama.cpp vs exact {e:.2e}: " + worst(L, E, "llama.cpp", "exact")


@pytest.mark.parametrize("lc", CASES, indirect=True, ids=repr)
def test_lfm2_every_position_and_chunks(lc, dump_tool):
    """Token by token, in chunks of 2, 3, 5, 7 and 16 and in one batch, F32 KV; token by token and
    in chunks of 7 with the F16 KV cache."""
    toks = prompt(lc)
    K = run_dump(dump_tool, lc, toks, kv="f32")
    lcheck(lc, toks, K, list(range(len(toks))), "f32", "token by token")
    for chunk in (2, 3, 5, 7, 16):
        K = run_dump(dump_tool, lc, toks, kv="f32", chunk=chunk)
        lcheck(lc, toks, K, chunk_positions(len(toks), chunk), "f32", f"--chunk {chunk}")
    K = run_dump(dump_tool, lc, toks, kv="f32", batch=True)
    lcheck(lc, toks, K, [len(toks) - 1], "f32", "--batch")
    K = run_dump(dump_tool, lc, toks, kv="f16")
    lcheck(lc, toks, K, list(range(len(toks))), "f16", "token by token")
    K = run_dump(dump_tool, lc, toks, kv="f16", chunk=7)
    lcheck(lc, toks, K, chunk_positions(len(toks), 7), "f16", "--chunk 7")


@pytest.mark.parametrize("tier", _cpu_tiers())
@pytest.mark.parametrize("lc", CASES, indirect=True, ids=repr)
def test_lfm2_cpu_tiers(lc, tier, dump_tool):
    """Each CPU kernel tier, token by token and in chunks of 3 and 7, F32 KV."""
    toks = prompt(lc)
    K = run_dump(dump_tool, lc, toks, kv="f32", cpu_kernels=tier)
    lcheck(lc, toks, K, list(range(len(toks))), "f32", f"token by token, {tier} kernels")
    for chunk in (3, 7):
        K = run_dump(dump_tool, lc, toks, kv="f32", chunk=chunk, cpu_kernels=tier)
        lcheck(lc, toks, K, chunk_positions(len(toks), chunk), "f32", f"--chunk {chunk}, {tier} kernels")


@pytest.mark.parametrize("lc", CASES, indirect=True, ids=repr)
def test_lfm2_batched_with_other_sequences(lc, batch_tool):
    """Three sequences side by side in one batching loop, fed 1, 3 and 7 tokens a round: every
    step's convolutions read and update three sequences' states."""
    tf.run_batched(lc, batch_tool)


# ------------------------------------------------------------------------------------------------
# Refusals and kiri info
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,named", [("lfm2-swa", "lfm2.attention.sliding_window"),
                                        ("lfm2-bidir", "lfm2.attention.causal"),
                                        ("lfm2-colbert", "dense_2_out.weight")])
def test_lfm2_refused(name, named, lfm2_files, dump_tool):
    """A sliding window on the attention layers (not run), a bidirectional (embedding) file and
    LFM2-ColBert's projection (not a text model's tensor) are load errors naming the key or the
    tensor."""
    r = subprocess.run([dump_tool, "--n-ctx", "32", lfm2_files[name], "1", "2"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0, f"{name}: kiri ran it"
    assert named in r.stderr, r.stderr


@pytest.mark.parametrize("lc", [c for c in CASES if c.fam.name in ("lfm2-a", "lfm2-q8")], indirect=True, ids=repr)
def test_lfm2_vulkan(lc, dump_tool):
    """The Vulkan backend (lavapipe on a machine without a GPU) runs every layer, the short
    convolution's state in its memory: token by token at every position and in chunks of 5 (a
    chunk's tokens pass the state along inside one step), F16 KV, at test_families' GPU bounds."""
    tf.run_vulkan_every_position(lc, dump_tool, 5)


@pytest.mark.parametrize("lc", [c for c in CASES if c.fam.name == "lfm2-a"], indirect=True, ids=repr)
def test_lfm2_vulkan_gpu_layers(lc, dump_tool):
    """Layers 0-2 on Vulkan (convolutions 0 and 1, attention 2), 3-5 on the CPU (convolutions 3
    and 5): each layer's convolution state on the backend that runs it."""
    tf.run_vulkan_every_position(lc, dump_tool, 5, gpu_layers=3)


@pytest.mark.parametrize("lc", [c for c in CASES if c.fam.name == "lfm2-a"], indirect=True, ids=repr)
def test_lfm2_vulkan_batched(lc, batch_tool):
    """Three sequences side by side in one batching loop on Vulkan, fed 1, 3 and 7 tokens a
    round: each step's convolution shader walks several sequences' states."""
    tf.run_batched(lc, batch_tool, backend="vulkan")


def test_lfm2_info_shows_state(lfm2_files, kiri_bin):
    """kiri info names the convolution layers and their state per sequence: 4 layers x 2 inputs
    x 64 channels x 4 bytes = 2 KiB; and the snapshots of it kept for prefix reuse, 2 KiB each,
    2 per sequence."""
    r = subprocess.run([str(kiri_bin), "info", "-m", lfm2_files["lfm2-a"]], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("short conv:")), "")
    assert "4 of 6 layers" in line and "3 taps" in line and "2.0 KiB per sequence" in line, r.stdout
    assert "in the 2 attention layers" in r.stdout, r.stdout
    snap = next((ln for ln in r.stdout.splitlines() if ln.startswith("snapshots:")), "")
    assert "2.0 KiB each" in snap and "2 per sequence" in snap, r.stdout


# ------------------------------------------------------------------------------------------------
# kiri serve: batching, a repeated prompt, preemption, a cancelled request
# ------------------------------------------------------------------------------------------------

def test_lfm2_server_batching_and_repeated_prompt(start_server, lfm2_files):
    """hybrid_checks.batching_and_repeated_prompt: batched equals alone equals llama.cpp; a
    repeated prompt reuses its blocks from a state snapshot; a state slot of 2 KiB
    (test_lfm2_info_shows_state) and 2 snapshots for each of the 3 sequences in /metrics."""
    hs.batching_and_repeated_prompt(start_server, lfm2_files["lfm2-a"], "lfm2-a", 2048)


# 2 attention layers x (K + V) x 32 floats x 4 bytes = 512 bytes a token, 8 KiB a block: 8 blocks
# (one 128-token context) and 3 states.
POOL = 8 * 8192 + 3 * 2048


def test_lfm2_server_preemption(start_server, lfm2_files):
    """hybrid_checks.preemption in a pool of 8 blocks and 3 states of 2 KiB: no room for
    snapshots, a preempted sequence is recomputed from its tokens."""
    hs.preemption(start_server, lfm2_files["lfm2-a"], "lfm2-a", POOL)


def test_lfm2_server_preemption_resumes_from_snapshot(start_server, lfm2_files):
    """hybrid_checks.preemption, two sequences at once in a pool of 11 blocks (too few for two of
    6), 2 states and 4 snapshots of 2 KiB: the later one is preempted with its 5 whole blocks
    cached, the other's last block takes only its fifth, and it resumes from the snapshot kept at
    its prompt's last whole block."""
    hs.preemption(start_server, lfm2_files["lfm2-a"], "lfm2-a", 11 * 8192 + 2 * 2048 + 4 * 2048, snapshots=4,
                  parallel=2)


def test_lfm2_server_shared_system_prompt(start_server, lfm2_files):
    """hybrid_checks.shared_system_prompt: the third of three prompts with one opening resumes
    from the snapshot the second kept where they part."""
    hs.shared_system_prompt(start_server, lfm2_files["lfm2-a"], "lfm2-a")


def test_lfm2_server_reused_prefix(start_server, lfm2_files):
    """hybrid_checks.reused_prefix: a repeated long prompt, and one that extends it, reuse its
    blocks from state snapshots and give llama.cpp's continuations."""
    hs.reused_prefix(start_server, lfm2_files["lfm2-a"], "lfm2-a")


@pytest.mark.parametrize("budget,snapshots,blocks", [(POOL, 0, 8), (POOL + 2 * 2048 + 2047, 2, 8),
                                                     (POOL + 6 * 2048 + 3 * 8192, 6, 11)])
def test_lfm2_snapshots_from_the_budget(budget, snapshots, blocks, start_server, lfm2_files):
    """hybrid_checks.snapshots_in_budget: none beyond one context, 2 for 2 states' bytes beyond
    it, all 6 and 3 blocks more."""
    hs.snapshots_in_budget(start_server, lfm2_files["lfm2-a"], budget, snapshots, blocks)


@pytest.mark.parametrize("budget,named", [(POOL - 1, "holds 112 tokens"),
                                          (3 * 2048 - 1, "the recurrent layers' state")])
def test_lfm2_state_from_the_budget(budget, named, lfm2_files, kiri_bin):
    """The state comes off --kv-memory before the blocks: a byte less than the preemption test's
    budget (8 blocks and 3 states) leaves 7 blocks, less than one context; less than the 3
    states is refused naming them."""
    hs.refused_budget(kiri_bin, lfm2_files["lfm2-a"], budget, named)


def test_lfm2_server_after_cancel(start_server, lfm2_files):
    """hybrid_checks.after_cancel: a request after a cancelled one in the same slot."""
    hs.after_cancel(start_server, lfm2_files["lfm2-a"], "lfm2-a")


# ------------------------------------------------------------------------------------------------
# The chat template LFM2 files carry (llama.cpp's tree), against jinja2
# ------------------------------------------------------------------------------------------------

CONVERSATIONS = ["user", "system_multi", "tool_round", "thinking"]


@pytest.mark.parametrize("name", ["LFM2.5-Instruct.jinja", "LFM2-8B-A1B.jinja"])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("with_tools", [False, True])
def test_lfm2_chat_template(name, conversation, with_tools, tmp_path):
    """LFM2's templates (ChatML turns after the BOS, the system prompt with its list of tools,
    past thinking dropped) render byte for byte as jinja2 renders them, as test_chat_template.py
    holds the other families' (its runner, imported here: it skips without jinja2 or the tool)."""
    import test_chat_template as tct
    assert conversation in tct.JSON_CONVERSATIONS
    tct.test_family_template(name, conversation, with_tools, tmp_path)


# ------------------------------------------------------------------------------------------------
# The tokenizer: LFM2's pre-tokenizer name
# ------------------------------------------------------------------------------------------------

def test_lfm2_pre_tokenizer(tmp_path):
    """LFM2 files name their pre-tokenizer "lfm2" (llama.cpp splits it as Llama 3's, with merges
    ignored for whole tokens and BOS added): llama.cpp's llama-bpe vocabulary under that name
    tokenizes in kiri exactly as in llama.cpp, over test_tokenizer_vectors.py's texts and the
    vocabulary's own test inputs."""
    import gguf
    tv = pytest.importorskip("test_tokenizer_vectors")
    d = tv.vocab_dir()
    src = d / "ggml-vocab-llama-bpe.gguf"
    r = gguf.GGUFReader(str(src))
    path = tmp_path / "ggml-vocab-lfm2.gguf"
    wr = gguf.GGUFWriter(str(path), "llama")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = "lfm2" if key == "tokenizer.ggml.pre" else f.contents()
        kind = f.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            wr.add_array(key, value)
        else:
            wr.add_key_value(key, value, kind)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    header, _ = tv.kiri_tokenize(path, ["x"])
    assert header[1] == "lfm2" and header[2] == "1", header  # the pre-tokenizer, BOS added
    tv.compare_with_llama_cpp(path, tv.TEXTS + tv.inp_texts(d / "ggml-vocab-llama-bpe.gguf.inp"))
