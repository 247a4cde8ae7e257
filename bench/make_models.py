#!/usr/bin/env python3
"""Writes synthetic random-weight GGUF models at real shapes for the CPU speed benchmark.

Speed and memory do not depend on what the weights mean, only on their shapes and types, so the
benchmark uses random weights at the shapes of two real models instead of downloading them:

  tinyllama   TinyLlama-1.1B: llama, n_embd 2048, 22 layers, 32 heads, 4 KV heads (head_dim 64),
              n_ff 5632, vocab 32000, ctx 2048, rope base 10000, rms eps 1e-5, separate
              output.weight. Tokenizer: the SentencePiece vocabulary of
              shared/tokenizer-vectors/ggml-vocab-llama-spm.gguf (32000 tokens, the real one), its
              tokenizer.* keys copied.
  qwen05      Qwen2.5-0.5B's widths as a llama model (no projection biases): n_embd 896, 24
              layers, 14 heads, 2 KV heads, n_ff 4864, tied embeddings, with the real Qwen2
              vocabulary of shared/tokenizer-vectors/ggml-vocab-qwen2.gguf (151669 tokens): the
              large-vocabulary case of the grammar benchmark (bench_grammar.py).
  smollm      SmolLM-135M: llama, n_embd 576, 30 layers, 9 heads, 3 KV heads (head_dim 64),
              n_ff 1536, ctx 2048, rope base 10000, rms eps 1e-5, tied embeddings (no
              output.weight). Tokenizer: the gpt2 vocabulary of
              shared/tokenizer-vectors/ggml-vocab-gpt-2.gguf. The real SmolLM vocabulary has 49152
              tokens; this one has 50257, so the vocabulary (token_embd rows) is 50257 here, 2%
              more embedding bytes than the real model.

  gemma3-1b   Gemma 3 1B: gemma3, n_embd 1152, 26 layers, 4 heads, 1 KV head, head_dim 256,
              n_ff 6912, ctx 32768, rope base 1e6 (global layers) and 1e4 (local), sliding window
              512 on five layers in six, rms eps 1e-6, per-head Q/K norms, post-attention and
              post-feed-forward norms, tied embeddings. Tokenizer: the real Gemma 3 vocabulary
              (262144 tokens), its tokenizer.* keys copied from the real Gemma 3 270M file
              (scripts/real_models.py fetches it). No Q4_K_M: rows of 1152 are not whole 256-wide
              K-quant blocks.
  phi4mini    Phi-4-mini: phi3, n_embd 3072, 32 layers, 24 heads, 8 KV heads (head_dim 128),
              partial rotary (96 of 128), fused attn_qkv and gate-up, LongRoPE (long and short
              factor sets, original context 4096, attn_factor 1.19), ctx 131072, rope base 1e4,
              rms eps 1e-5, n_ff 8192, tied embeddings. Tokenizer: Llama 3's byte-level BPE
              vocabulary (shared/tokenizer-vectors/ggml-vocab-llama-bpe.gguf, 128256 tokens)
              padded with control tokens to Phi-4-mini's 200064 rows, so token_embd has the real
              shape (the real o200k vocabulary is not in shared/).

  qwen35-0.8b Qwen3.5-0.8B (text): qwen35, n_embd 1024, 24 layers, full attention every fourth
              (6 layers: 8 heads, 2 KV heads of 256, the query doubled by its output gate, 64
              rotated dimensions in sections (11, 11, 10), rope base 1e7), Gated DeltaNet on the
              other 18 (16 key and 16 value heads of 128, a convolution of 4 taps), n_ff 3584,
              rms eps 1e-6, tied embeddings, vocab 248320: the Qwen2 vocabulary
              (ggml-vocab-qwen2.gguf, 151669 tokens) padded with control tokens to 248320 rows.
              ssm_a is -1 (A_log 0) and ssm_dt.bias 0, so the state decays as the real one does.
  qwen35-0.8b-mtp  the same with a multi-token-prediction block after the trunk (nextn_predict_layers
              1: a gated full-attention block, nextn.eh_proj, enorm, hnorm, shared_head_norm), as
              Qwen3.5's own files carry; random, so its drafts are seldom kept (kiri bench --spec mtp).
  lfm2-1.2b   LFM2-1.2B: lfm2, n_embd 2048, 16 layers, attention (32 heads, 8 KV heads of 64,
              per-head Q/K norms) on layers 2, 5, 8, 10, 12 and 14, gated short convolutions of 3
              taps on the other 10, n_ff 8192 (the config's block_ff_dim 12288 after its
              auto-adjustment to 2/3, a multiple of 256), rope base 1e6, rms eps 1e-5, tied
              embeddings, vocab 65536: the GPT-2 vocabulary padded with control tokens.

Each model is written once as F16 (normal weights, std 0.02, norms 1.0, one fixed seed per
model; generated in chunks so memory stays near one tensor), then converted with
`kiri quantize` to the shape's types (TinyLlama: Q4_0, Q4_1, Q4_K_M, Q5_K, Q6_K, Q8_0; SmolLM: Q4_0,
Q4_1, Q8_0; Qwen3.5 and LFM2: Q4_K_M and Q8_0; runtime/quantize.c's table: Q4_K_M is Q4_K with Q6_K
for the output and V matrices, Q5_K is Q5_K throughout, llama.cpp's Q5_K_S file type, Q6_K is Q6_K
throughout; a tied token_embd is the output matrix, so it takes Q6_K in Q4_K_M as in llama.cpp's
files; the recurrent layers' convolution kernels stay F32). SmolLM gets no K-quants: its rows of 576 are
not whole 256-wide K-quant blocks, so kiri (like llama.cpp) would fall back to another type for
nearly every matrix and the file would not be a K-quant model.

--check loads every quantized file in llama.cpp (llama-cpp-python) and evaluates a few tokens, so
a file llama.cpp rejects is reported with llama.cpp's own log lines.

Usage: make_models.py [--out DIR] [--kiri PATH] [--f16-from DIR ...] [--force] [--check] [--layers N]
                      [NAME ...]
  --f16-from DIR: quantize from DIR's <shape>-F16.gguf when --out has none (DIR is only read),
  so new types can go into a folder of their own beside a shared set of models.
  --layers N writes N layers instead of the model's (a quick check that the files load; not for
  benchmarks: such files are named <name>-<N>L-<type>.gguf).
  DIR defaults to <repo>/build/bench-models (ignored by git). PATH defaults to
  /tmp/bench-build/kiri (the README's bench build), or <repo>/build/kiri where that is missing.
  NAME filters by file stem (e.g. tinyllama-Q4_0) or model (smollm).
  A file that exists is kept unless --force.
"""

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace

import numpy as np

import gguf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("KIRI_SHARED_DIR", os.path.join(os.path.dirname(REPO), "shared"))
VOCABS = os.path.join(SHARED, "tokenizer-vectors")
DEFAULT_OUT = os.path.join(REPO, "build", "bench-models")
# The README's bench build, or the checkout's own build where there is none.
DEFAULT_KIRI = next((p for p in ("/tmp/bench-build/kiri", os.path.join(REPO, "build", "kiri")) if os.path.exists(p)),
                    "/tmp/bench-build/kiri")


@dataclass
class Shape:
    name: str
    vocab_file: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_ctx: int
    rope_base: float
    eps: float
    tied: bool
    seed: int
    types: tuple
    arch: str = "llama"
    head_dim: int = 0          # 0: n_embd / n_head
    rope_dim: int = 0          # 0: head_dim
    kv: tuple = ()             # extra (key suffix after "<arch>.", value) metadata
    vocab_pad: int = 0         # control tokens appended to the vocabulary file's
    vocab_real: str = ""       # a real_models.py name whose tokenizer.* keys to copy instead
    attn_layers: tuple = ()    # qwen35 and lfm2: the layers that attend (the others are recurrent)
    ssm: tuple = ()            # qwen35: (conv taps, state size, key heads, value heads); lfm2: (taps,)
    mtp: bool = False          # qwen35: a multi-token-prediction block after the trunk (--spec mtp)

    @property
    def hd(self):
        return self.head_dim or self.n_embd // self.n_head


SHAPES = [
    Shape("tinyllama", "ggml-vocab-llama-spm.gguf", 32000, 2048, 22, 32, 4, 5632, 2048, 10000.0,
          1e-5, False, 1101, ("Q4_0", "Q4_1", "Q4_K_M", "Q5_K", "Q6_K", "Q8_0")),
    Shape("smollm", "ggml-vocab-gpt-2.gguf", 50257, 576, 30, 9, 3, 1536, 2048, 10000.0,
          1e-5, True, 135, ("Q4_0", "Q4_1", "Q8_0")),
    Shape("qwen05", "ggml-vocab-qwen2.gguf", 151669, 896, 24, 14, 2, 4864, 4096, 1000000.0,
          1e-6, True, 500, ("Q4_0",)),
    Shape("gemma3-1b", "", 262144, 1152, 26, 4, 1, 6912, 32768, 1000000.0, 1e-6, True, 1001,
          ("Q4_0", "Q8_0"), arch="gemma3", head_dim=256,
          kv=(("attention.sliding_window", 512), ("attention.sliding_window_pattern", 6),
              ("rope.freq_base_swa", 10000.0)),
          vocab_real="gemma-3-270m-q4_k_m"),
    Shape("phi4mini", "ggml-vocab-llama-bpe.gguf", 200064, 3072, 32, 24, 8, 8192, 131072, 10000.0,
          1e-5, True, 4004, ("Q4_0", "Q4_K_M", "Q8_0"), arch="phi3", head_dim=128, rope_dim=96,
          kv=(("rope.scaling.type", "longrope"), ("rope.scaling.original_context_length", 4096),
              ("rope.scaling.attn_factor", 1.1902380714238083)),
          vocab_pad=200064 - 128256),
    Shape("qwen35-0.8b", "ggml-vocab-qwen2.gguf", 248320, 1024, 24, 8, 2, 3584, 262144, 10000000.0,
          1e-6, True, 3508, ("Q4_K_M", "Q8_0"), arch="qwen35", head_dim=256, rope_dim=64,
          kv=(("rope.dimension_sections", [11, 11, 10, 0]), ("full_attention_interval", 4),
              ("ssm.conv_kernel", 4), ("ssm.state_size", 128), ("ssm.group_count", 16),
              ("ssm.time_step_rank", 16), ("ssm.inner_size", 16 * 128)),
          vocab_pad=248320 - 151669, attn_layers=tuple(range(3, 24, 4)), ssm=(4, 128, 16, 16)),
    Shape("qwen35-0.8b-mtp", "ggml-vocab-qwen2.gguf", 248320, 1024, 24, 8, 2, 3584, 262144, 10000000.0,
          1e-6, True, 3509, ("Q8_0",), arch="qwen35", head_dim=256, rope_dim=64,
          kv=(("rope.dimension_sections", [11, 11, 10, 0]), ("full_attention_interval", 4),
              ("ssm.conv_kernel", 4), ("ssm.state_size", 128), ("ssm.group_count", 16),
              ("ssm.time_step_rank", 16), ("ssm.inner_size", 16 * 128), ("nextn_predict_layers", 1)),
          vocab_pad=248320 - 151669, attn_layers=tuple(range(3, 24, 4)), ssm=(4, 128, 16, 16), mtp=True),
    Shape("lfm2-1.2b", "ggml-vocab-gpt-2.gguf", 65536, 2048, 16, 32, 8, 8192, 128000, 1000000.0,
          1e-5, True, 1212, ("Q4_K_M", "Q8_0"), arch="lfm2",
          kv=(("shortconv.l_cache", 3),), vocab_pad=65536 - 50257,
          attn_layers=(2, 5, 8, 10, 12, 14), ssm=(3,)),
]

STD = 0.02
CHUNK = 1 << 24  # values generated at a time


def model_paths(out_dir, shape):
    """(F16 path, {type: path}) for one shape."""
    f16 = os.path.join(out_dir, f"{shape.name}-F16.gguf")
    return f16, {t: os.path.join(out_dir, f"{shape.name}-{t}.gguf") for t in shape.types}


def real_vocab_file(name):
    """The cached path of a real model (scripts/real_models.py fetches it when missing)."""
    r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "real_models.py"), name],
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"cannot fetch {name} for its vocabulary: {r.stderr.strip()}")
    return r.stdout.strip()


# ------------------------------------------------------------------------------------------------
# Tokenizer metadata
# ------------------------------------------------------------------------------------------------

def copy_tokenizer(w, path, n_vocab, pad=0):
    """Copies every tokenizer.* key of a vocabulary GGUF into the writer; with pad, appends that
    many control tokens ("<|kiri_pad_N|>") to the token, type and score lists."""
    r = gguf.GGUFReader(path)
    n_tokens = len(r.fields["tokenizer.ggml.tokens"].contents())
    if n_tokens + pad != n_vocab:
        raise SystemExit(f"{path}: {n_tokens} tokens (+{pad} padding), the shape says {n_vocab}")
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vtype = f.types[0]
        val = f.contents()
        if pad and key == "tokenizer.ggml.tokens":
            val = val + [f"<|kiri_pad_{i}|>" for i in range(pad)]
        elif pad and key == "tokenizer.ggml.token_type":
            val = val + [3] * pad
        elif pad and key == "tokenizer.ggml.scores":
            val = val + [0.0] * pad
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, val, vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, val, vtype)


# ------------------------------------------------------------------------------------------------
# F16 writer
# ------------------------------------------------------------------------------------------------

def hybrid_tensor_list(s):
    """tensor_list for qwen35 and lfm2: their recurrent layers, attention on s.attn_layers. The
    third field is False (random F16), True (F32 ones), a float (F32 constant) or "f32" (random
    F32: the convolution kernels, which llama.cpp reads as F32 only)."""
    E, hd = s.n_embd, s.hd
    out = [("token_embd.weight", (s.n_vocab, E), False)]
    ffn = [("ffn_gate.weight", (s.n_ff, E), False), ("ffn_up.weight", (s.n_ff, E), False),
           ("ffn_down.weight", (E, s.n_ff), False)]
    for i in range(s.n_layer):
        p, attends = f"blk.{i}.", i in s.attn_layers
        layer = [("attn_norm.weight", (E,), True)]
        if attends:
            gate = 2 if s.arch == "qwen35" else 1   # qwen35's query rows carry each head's output gate
            layer += [("attn_q.weight", (gate * s.n_head * hd, E), False),
                      ("attn_k.weight", (s.n_head_kv * hd, E), False),
                      ("attn_v.weight", (s.n_head_kv * hd, E), False),
                      ("attn_q_norm.weight", (hd,), True), ("attn_k_norm.weight", (hd,), True),
                      ("attn_output.weight", (E, s.n_head * hd), False)]
        elif s.arch == "qwen35":
            taps, S, hk, hv = s.ssm
            C = 2 * hk * S + hv * S
            layer += [("attn_qkv.weight", (C, E), False), ("attn_gate.weight", (hv * S, E), False),
                      ("ssm_conv1d.weight", (C, taps), "f32"), ("ssm_dt.bias", (hv,), 0.0),
                      ("ssm_a", (hv,), -1.0), ("ssm_beta.weight", (hv, E), False),
                      ("ssm_alpha.weight", (hv, E), False), ("ssm_norm.weight", (S,), True),
                      ("ssm_out.weight", (E, hv * S), False)]
        else:
            layer += [("shortconv.in_proj.weight", (3 * E, E), False),
                      ("shortconv.conv.weight", (E, s.ssm[0]), "f32"),
                      ("shortconv.out_proj.weight", (E, E), False)]
        layer += [("post_attention_norm.weight" if s.arch == "qwen35" else "ffn_norm.weight", (E,), True)]
        out += [(p + n, shape, f) for n, shape, f in layer + ffn]
    if s.mtp:   # the multi-token-prediction block: a gated full-attention block and its nextn tensors
        p = f"blk.{s.n_layer}."
        out += [(p + n, shape, f) for n, shape, f in [
            ("attn_norm.weight", (E,), True), ("attn_q.weight", (2 * s.n_head * hd, E), False),
            ("attn_k.weight", (s.n_head_kv * hd, E), False), ("attn_v.weight", (s.n_head_kv * hd, E), False),
            ("attn_q_norm.weight", (hd,), True), ("attn_k_norm.weight", (hd,), True),
            ("attn_output.weight", (E, s.n_head * hd), False), ("post_attention_norm.weight", (E,), True)] + ffn + [
            ("nextn.eh_proj.weight", (E, 2 * E), False), ("nextn.enorm.weight", (E,), True),
            ("nextn.hnorm.weight", (E,), True), ("nextn.shared_head_norm.weight", (E,), True)]]
    out.append(("output_norm.weight" if s.arch == "qwen35" else "token_embd_norm.weight", (E,), True))
    return out


def tensor_list(s):
    """[(name, numpy shape (rows, cols) or (n,), is_norm)] in file order."""
    if s.arch in ("qwen35", "lfm2"):
        return hybrid_tensor_list(s)
    hd = s.hd
    q, kv = s.n_head * hd, s.n_head_kv * hd
    out = [("token_embd.weight", (s.n_vocab, s.n_embd), False)]
    for i in range(s.n_layer):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (s.n_embd,), True))
        if s.arch == "phi3":
            out.append((p + "attn_qkv.weight", (q + 2 * kv, s.n_embd), False))
        else:
            out += [(p + "attn_q.weight", (q, s.n_embd), False),
                    (p + "attn_k.weight", (kv, s.n_embd), False),
                    (p + "attn_v.weight", (kv, s.n_embd), False)]
        if s.arch == "gemma3":
            out += [(p + "attn_q_norm.weight", (hd,), True), (p + "attn_k_norm.weight", (hd,), True)]
        out.append((p + "attn_output.weight", (s.n_embd, q), False))
        if s.arch == "gemma3":
            out.append((p + "post_attention_norm.weight", (s.n_embd,), True))
        out.append((p + "ffn_norm.weight", (s.n_embd,), True))
        if s.arch == "phi3":
            out.append((p + "ffn_up.weight", (2 * s.n_ff, s.n_embd), False))
        else:
            out += [(p + "ffn_gate.weight", (s.n_ff, s.n_embd), False),
                    (p + "ffn_up.weight", (s.n_ff, s.n_embd), False)]
        out.append((p + "ffn_down.weight", (s.n_embd, s.n_ff), False))
        if s.arch == "gemma3":
            out.append((p + "post_ffw_norm.weight", (s.n_embd,), True))
    out.append(("output_norm.weight", (s.n_embd,), True))
    if not s.tied:
        out.append(("output.weight", (s.n_vocab, s.n_embd), False))
    if s.arch == "phi3":   # LongRoPE factor sets (F32, one per rotated pair), written as ones
        n = (s.rope_dim or hd) // 2
        out += [("rope_factors_long.weight", (n,), True), ("rope_factors_short.weight", (n,), True)]
    return out


def random_f16(rng, shape):
    n = int(np.prod(shape))
    a = np.empty(n, dtype=np.float16)
    for lo in range(0, n, CHUNK):
        hi = min(n, lo + CHUNK)
        a[lo:hi] = rng.standard_normal(hi - lo, dtype=np.float32) * STD
    return a.reshape(shape)


def write_f16(s, path):
    hd = s.hd
    tmp = path + ".tmp"
    w = gguf.GGUFWriter(tmp, s.arch)
    w.add_name(f"{s.name}-synthetic")
    w.add_description("random weights at real shapes, for speed benchmarks only (kiri bench/make_models.py)")
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layer + (1 if s.mtp else 0))
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    if s.arch == "lfm2":   # per layer: 0 marks a short-convolution layer
        w.add_array(f"{s.arch}.attention.head_count_kv",
                    [s.n_head_kv if i in s.attn_layers else 0 for i in range(s.n_layer)])
    else:
        w.add_head_count_kv(s.n_head_kv)
    w.add_rope_dimension_count(s.rope_dim or hd)
    if hd * s.n_head != s.n_embd:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.eps)
    w.add_vocab_size(s.n_vocab)
    w.add_file_type(1)  # MOSTLY_F16
    for key, val in s.kv:
        key = f"{s.arch}.{key}"
        if isinstance(val, str):
            w.add_string(key, val)
        elif isinstance(val, list):
            w.add_array(key, val)
        elif isinstance(val, int):
            w.add_uint32(key, val)
        else:
            w.add_float32(key, val)
    vocab = real_vocab_file(s.vocab_real) if s.vocab_real else os.path.join(VOCABS, s.vocab_file)
    copy_tokenizer(w, vocab, s.n_vocab, s.vocab_pad)

    tensors = tensor_list(s)
    for name, shape, is_norm in tensors:
        dtype = np.float16 if is_norm is False else np.float32
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(s.seed)
    t0 = time.time()
    for k, (name, shape, is_norm) in enumerate(tensors):
        if is_norm is False:
            a = random_f16(rng, shape)
        elif is_norm == "f32":
            a = random_f16(rng, shape).astype(np.float32)
        else:
            a = np.full(shape, 1.0 if is_norm is True else is_norm, dtype=np.float32)
        w.write_tensor_data(a)
        if k % 20 == 0:
            print(f"\r  {s.name}-F16: {k + 1}/{len(tensors)} tensors, {time.time() - t0:.0f} s",
                  end="", file=sys.stderr, flush=True)
    w.close()
    print(file=sys.stderr)
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------
# Quantization and the llama.cpp check
# ------------------------------------------------------------------------------------------------

def quantize(kiri, src, dst, qtype):
    tmp = dst + ".tmp.gguf"
    t0 = time.time()
    r = subprocess.run([kiri, "quantize", src, tmp, qtype], stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        raise SystemExit(f"kiri quantize {qtype} failed:\n{r.stderr[-2000:]}")
    os.replace(tmp, dst)
    print(f"  {os.path.basename(dst)}: {os.path.getsize(dst) / 2**20:.0f} MiB in {time.time() - t0:.0f} s",
          file=sys.stderr)


def check_llama_cpp(path):
    """Loads path in llama.cpp in a child process and evaluates 4 tokens; returns (ok, message)."""
    code = r"""
import sys, ctypes, llama_cpp as L
L.llama_backend_init()
mp = L.llama_model_default_params()
m = L.llama_model_load_from_file(sys.argv[1].encode(), mp)
if not m:
    print("llama_model_load_from_file returned NULL"); sys.exit(1)
cp = L.llama_context_default_params(); cp.n_ctx = 64; cp.n_threads = 2; cp.n_threads_batch = 2
c = L.llama_init_from_model(m, cp)
if not c:
    print("llama_init_from_model returned NULL"); sys.exit(1)
toks = (L.llama_token * 4)(1, 100, 200, 300)
rc = L.llama_decode(c, L.llama_batch_get_one(toks, 4))
if rc != 0:
    print(f"llama_decode returned {rc}"); sys.exit(1)
lg = L.llama_get_logits_ith(c, -1)
n = L.llama_vocab_n_tokens(L.llama_model_get_vocab(m))
v = [lg[i] for i in range(n)]
if any(x != x for x in v):
    print("NaN logits"); sys.exit(1)
print(f"ok, {n} logits, max {max(v):.3f}")
"""
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True)
    if r.returncode == 0:
        return True, r.stdout.strip()
    # llama.cpp logs to stderr; keep the lines that say why.
    why = [l for l in r.stderr.splitlines() if any(k in l.lower() for k in ("error", "failed", "invalid", "unknown", "wrong"))]
    return False, (r.stdout.strip() + "\n" + "\n".join(why[-15:])).strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--kiri", default=os.environ.get("KIRI_BIN", DEFAULT_KIRI))
    ap.add_argument("--f16-from", action="append", default=[])
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("names", nargs="*")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    shapes = SHAPES
    if a.layers:
        shapes = [replace(s, name=f"{s.name}-{a.layers}L", n_layer=a.layers) for s in SHAPES]

    def wanted(stem, shape):
        base = shape.name.rsplit(f"-{a.layers}L", 1)[0] if a.layers else shape.name
        return not a.names or any(n in (shape.name, base, stem) for n in a.names)

    failed = 0
    for s in shapes:
        f16, quants = model_paths(a.out, s)
        todo = {t: p for t, p in quants.items() if wanted(os.path.basename(p)[:-5], s)}
        if not todo:
            continue
        need = [t for t, p in todo.items() if a.force or not os.path.exists(p)]
        if need and not a.force and not os.path.exists(f16):
            f16 = next((p for p in (os.path.join(d, os.path.basename(f16)) for d in a.f16_from)
                        if os.path.exists(p)), f16)
        if need and (a.force or not os.path.exists(f16)):
            print(f"writing {f16}", file=sys.stderr)
            write_f16(s, f16)
        for t in need:
            quantize(a.kiri, f16, todo[t], t)
        if a.check:
            for t, p in todo.items():
                ok, msg = check_llama_cpp(p)
                failed += not ok
                print(f"llama.cpp {'loads' if ok else 'REJECTS'} {os.path.basename(p)}: {msg}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
