#!/usr/bin/env python3
"""Writes tiny random-weight GGUF models for the outside-reference logits tests (test_logits.py).

One model per (architecture, weight type). The architectures cover what kiri's graph has to get
right, each as llama.cpp reads it:

  llama-spm   llama, SentencePiece vocabulary (stories260K's 512 tokens), GQA 4/2, normal RoPE,
              separate output.weight
  llama3-bpe  llama, byte-level BPE vocabulary cut from Llama 3's (1000 tokens), GQA 4/2,
              rope_freqs.weight (Llama 3.1 frequency factors), freq_base 500000, tied embeddings
  qwen2       qwen2, BPE vocabulary cut from Qwen2's (1003 tokens), attn_q/k/v biases, NEOX RoPE,
              separate output.weight
  qwen3       qwen3, the same vocabulary, per-head attn_q_norm/attn_k_norm, NEOX RoPE, head_dim 128
              (so n_head * head_dim = 512 != n_embd = 256, as in Qwen3-0.6B), tied embeddings

and the weight types F32, F16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K. Every 2-D weight (including
token_embd) has the model's type; norms, biases and rope_freqs stay F32. n_embd 256 and n_ff 512
are the smallest sizes whose rows are whole 256-wide K-quant blocks. All types of one architecture
share the same float weights (one seed per architecture), so they differ only by quantization.

Two more models keep a full-size vocabulary so the big-vocabulary paths run (128256 and 151669
rows; the second is not a multiple of anything): llama3-bpe-fullvocab (F16, n_embd 64, tied) and
qwen2-fullvocab (Q8_0, n_embd 64).

Quantization is llama.cpp's own (ggml_quantize_chunk from the ggml library llama-cpp-python ships),
so the files are what llama.cpp's quantizer would write; gguf-py's numpy quantizers are the fallback
for the types they support, and a type neither can make is skipped with a message.

The BPE vocabularies are cut, not invented: the first tokens of the real vocabulary (all 256 byte
tokens come first), the merges whose two parts and result all survive, in their original order,
and the real special tokens appended with their real texts.

With --families it writes instead the family files of test_families.py (FAMILIES below: gemma3,
phi3, smollm3, granite, and llama/qwen2/qwen3 with every optional tensor and key llama.cpp's
graphs read, plus files kiri must refuse), each quantized one with an F32 twin of its
dequantized weights; family_reference_logits is their float64 forward pass.

Usage: make_tiny_models.py [--out DIR] [--force] [--check] [--list] [--families] [NAME ...]
  DIR defaults to $KIRI_TINY_MODELS or <repo>/build/tiny-models. A model is rewritten when it is
  missing or older than this script. --check loads every model in llama-cpp-python and evaluates a
  few tokens. NAME filters by model name (e.g. qwen3-Q4_K) or architecture (e.g. qwen3).
"""

import argparse
import ctypes
import functools
import glob
import math
import os
import sys
from dataclasses import dataclass, field

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.environ.get("KIRI_SHARED_DIR", os.path.join(os.path.dirname(REPO), "shared"))
VOCABS = os.path.join(SHARED, "tokenizer-vectors")
STORIES = os.path.join(SHARED, "models", "stories260K.gguf")
SCRIPT_MTIME = os.path.getmtime(os.path.abspath(__file__))

TYPES = ["F32", "F16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
FILE_TYPES = {  # general.file_type (llama_ftype), informational
    "F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q4_K": 14, "Q5_K": 16, "Q6_K": 18,
}


@dataclass
class Arch:
    name: str            # our name for the variant
    arch: str            # general.architecture
    vocab: str           # "spm512", "llama-bpe", "qwen2"
    n_vocab_cut: int     # ordinary tokens kept from a BPE vocabulary (0: keep all)
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_base: float
    eps: float
    tied: bool
    seed: int
    qkv_bias: bool = False
    qk_norm: bool = False
    rope_freqs: bool = False
    n_ctx_train: int = 512
    types: list = field(default_factory=lambda: list(TYPES))


ARCHS = [
    Arch("llama-spm", "llama", "spm512", 0, 256, 512, 2, 4, 2, 64, 10000.0, 1e-5, False, 101),
    Arch("llama3-bpe", "llama", "llama-bpe", 997, 256, 512, 2, 4, 2, 64, 500000.0, 1e-5, True, 102,
         rope_freqs=True),
    Arch("qwen2", "qwen2", "qwen2", 1000, 256, 512, 2, 4, 2, 64, 1000000.0, 1e-6, False, 103,
         qkv_bias=True),
    Arch("qwen3", "qwen3", "qwen2", 1000, 256, 512, 2, 4, 2, 128, 1000000.0, 1e-6, True, 104,
         qk_norm=True),
    Arch("llama3-bpe-fullvocab", "llama", "llama-bpe", 0, 64, 128, 2, 4, 2, 16, 500000.0, 1e-5,
         True, 105, rope_freqs=True, types=["F16"]),
    Arch("qwen2-fullvocab", "qwen2", "qwen2", 0, 64, 128, 2, 4, 2, 16, 1000000.0, 1e-6, False, 106,
         qkv_bias=True, types=["Q8_0"]),
]


@dataclass
class Model:
    name: str    # e.g. "qwen3-Q4_K"
    arch: Arch
    wtype: str   # one of TYPES
    path: str


def models(out_dir):
    """Every model this script makes, whether or not it exists yet."""
    return [Model(f"{a.name}-{t}", a, t, os.path.join(out_dir, f"{a.name}-{t}.gguf"))
            for a in ARCHS for t in a.types]


# ------------------------------------------------------------------------------------------------
# Vocabularies
# ------------------------------------------------------------------------------------------------

TOKEN_NORMAL, TOKEN_CONTROL = 1, 3
SPECIALS = {  # appended after the cut, in this order: (text, role)
    "llama-bpe": [("<|begin_of_text|>", "bos"), ("<|end_of_text|>", "eos"), ("<|eot_id|>", None)],
    "qwen2": [("<|endoftext|>", "bos"), ("<|im_start|>", None), ("<|im_end|>", "eos")],
}


def _field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


@functools.lru_cache(maxsize=None)
def load_vocab(kind, n_cut):
    """Returns a dict of tokenizer metadata: key -> (value, writer method name)."""
    if kind == "spm512":
        r = gguf.GGUFReader(STORIES)
        return {
            "tokenizer.ggml.model": ("llama", "string"),
            "tokenizer.ggml.tokens": (_field(r, "tokenizer.ggml.tokens"), "array"),
            "tokenizer.ggml.scores": (_field(r, "tokenizer.ggml.scores"), "array"),
            "tokenizer.ggml.token_type": (_field(r, "tokenizer.ggml.token_type"), "array"),
            "tokenizer.ggml.unknown_token_id": (_field(r, "tokenizer.ggml.unknown_token_id"), "uint32"),
            "tokenizer.ggml.bos_token_id": (_field(r, "tokenizer.ggml.bos_token_id"), "uint32"),
            "tokenizer.ggml.eos_token_id": (_field(r, "tokenizer.ggml.eos_token_id"), "uint32"),
        }
    r = gguf.GGUFReader(os.path.join(VOCABS, f"ggml-vocab-{kind}.gguf"))
    tokens = _field(r, "tokenizer.ggml.tokens")
    types = _field(r, "tokenizer.ggml.token_type")
    merges = _field(r, "tokenizer.ggml.merges")
    meta = {
        "tokenizer.ggml.model": (_field(r, "tokenizer.ggml.model"), "string"),
        "tokenizer.ggml.pre": (_field(r, "tokenizer.ggml.pre"), "string"),
    }
    add_bos = _field(r, "tokenizer.ggml.add_bos_token")
    if add_bos is not None:
        meta["tokenizer.ggml.add_bos_token"] = (bool(add_bos), "bool")
    if n_cut == 0:
        meta["tokenizer.ggml.tokens"] = (tokens, "array")
        meta["tokenizer.ggml.token_type"] = (types, "array")
        meta["tokenizer.ggml.merges"] = (merges, "array")
        for role in ("bos", "eos", "padding"):
            v = _field(r, f"tokenizer.ggml.{role}_token_id")
            if v is not None:
                meta[f"tokenizer.ggml.{role}_token_id"] = (v, "uint32")
        return meta
    kept = tokens[:n_cut]
    assert all(t == 1 for t in types[:n_cut]), "the cut must hold ordinary tokens only"
    have = set(kept)
    cut_merges = []
    for m in merges:
        a, b = m.split(" ", 1)
        if a in have and b in have and a + b in have:
            cut_merges.append(m)
    ctypes_ = [TOKEN_NORMAL] * n_cut
    for text, role in SPECIALS[kind]:
        assert text in tokens, text
        if role:
            meta[f"tokenizer.ggml.{role}_token_id"] = (len(kept), "uint32")
        kept = kept + [text]
        ctypes_.append(TOKEN_CONTROL)
    meta["tokenizer.ggml.tokens"] = (kept, "array")
    meta["tokenizer.ggml.token_type"] = (ctypes_, "array")
    meta["tokenizer.ggml.merges"] = (cut_merges, "array")
    return meta


# ------------------------------------------------------------------------------------------------
# Quantization
# ------------------------------------------------------------------------------------------------

def _ggml_lib():
    """libggml-base from the llama_cpp package, or None."""
    try:
        import llama_cpp
    except ImportError:
        return None
    libdir = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    for cand in sorted(glob.glob(os.path.join(libdir, "libggml-base.so*")) +
                       glob.glob(os.path.join(libdir, "libggml-base.dylib"))):
        try:
            lib = ctypes.CDLL(cand)
        except OSError:
            continue
        lib.ggml_quantize_chunk.restype = ctypes.c_size_t
        lib.ggml_quantize_chunk.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                            ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
                                            ctypes.c_void_p]
        lib.ggml_row_size.restype = ctypes.c_size_t
        lib.ggml_row_size.argtypes = [ctypes.c_int, ctypes.c_int64]
        return lib
    return None


_GGML = None
_GGML_TRIED = False


def quantize(w, wtype):
    """w: float32 (rows, n_per_row). Returns (array, raw_dtype) for GGUFWriter.add_tensor, or
    raises NotImplementedError when no quantizer here can make the type."""
    global _GGML, _GGML_TRIED
    if wtype == "F32":
        return w.astype(np.float32), None
    if wtype == "F16":
        return w.astype(np.float16), None
    qt = QT[wtype]
    if not _GGML_TRIED:
        _GGML, _GGML_TRIED = _ggml_lib(), True
    if _GGML is not None:
        rows, n = w.shape
        src = np.ascontiguousarray(w, dtype=np.float32)
        row_bytes = _GGML.ggml_row_size(int(qt), n)
        dst = np.zeros((rows, row_bytes), dtype=np.uint8)
        got = _GGML.ggml_quantize_chunk(int(qt), src.ctypes.data, dst.ctypes.data, 0, rows, n, None)
        assert got == rows * row_bytes, (wtype, got, rows * row_bytes)
        return dst, qt
    try:
        return gguf.quants.quantize(w.astype(np.float32), qt), qt
    except NotImplementedError:
        raise NotImplementedError(f"neither ggml (llama_cpp) nor gguf-py can quantize {wtype}")


# ------------------------------------------------------------------------------------------------
# Weights
# ------------------------------------------------------------------------------------------------

def llama3_rope_factors(head_dim, base, factor=8.0, low=1.0, high=4.0, orig_ctx=256):
    """The frequency factors Llama 3.1's conversion writes to rope_freqs.weight, (head_dim/2), by
    its formula. Llama 3.1's original context is 8192; 256 here makes the factors reach most
    dimensions, so a runtime that ignores the tensor fails within the tests' 40 positions."""
    out = []
    low_wavelen, high_wavelen = orig_ctx / low, orig_ctx / high
    for i in range(0, head_dim, 2):
        freq = 1.0 / base ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (orig_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


_WEIGHTS = {}


def make_weights(a, n_vocab):
    """Float weights, numpy (out, in) layout (GGUF ne = [in, out]). Scales keep every residual
    branch near unit size so each layer moves the logits, and the logits spread over ~+-10.
    Cached per architecture: every type of one architecture quantizes the same floats."""
    key = (a.name, n_vocab)
    if key not in _WEIGHTS:
        _WEIGHTS.clear()
        _WEIGHTS[key] = _make_weights(a, n_vocab)
    return _WEIGHTS[key]


def _make_weights(a, n_vocab):
    rng = np.random.default_rng(a.seed)

    def mat(n_out, n_in, gain=1.0):
        return (rng.standard_normal((n_out, n_in)) * (gain / math.sqrt(n_in))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    q_dim, kv_dim = a.n_head * a.head_dim, a.n_head_kv * a.head_dim
    w = {"token_embd.weight": rng.standard_normal((n_vocab, a.n_embd)).astype(np.float32)}
    for i in range(a.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(a.n_embd)
        w[p + "attn_q.weight"] = mat(q_dim, a.n_embd)
        w[p + "attn_k.weight"] = mat(kv_dim, a.n_embd)
        w[p + "attn_v.weight"] = mat(kv_dim, a.n_embd)
        if a.qkv_bias:
            w[p + "attn_q.bias"] = (0.5 * rng.standard_normal(q_dim)).astype(np.float32)
            w[p + "attn_k.bias"] = (0.5 * rng.standard_normal(kv_dim)).astype(np.float32)
            w[p + "attn_v.bias"] = (0.5 * rng.standard_normal(kv_dim)).astype(np.float32)
        if a.qk_norm:
            w[p + "attn_q_norm.weight"] = norm(a.head_dim)
            w[p + "attn_k_norm.weight"] = norm(a.head_dim)
        w[p + "attn_output.weight"] = mat(a.n_embd, q_dim)
        w[p + "ffn_norm.weight"] = norm(a.n_embd)
        w[p + "ffn_gate.weight"] = mat(a.n_ff, a.n_embd)
        w[p + "ffn_up.weight"] = mat(a.n_ff, a.n_embd)
        w[p + "ffn_down.weight"] = mat(a.n_embd, a.n_ff, gain=2.0)
    w["output_norm.weight"] = norm(a.n_embd)
    if not a.tied:
        w["output.weight"] = mat(n_vocab, a.n_embd, gain=3.0)
    else:
        # Tied: token_embd doubles as the output matrix, so its scale sets the logits' spread.
        w["token_embd.weight"] *= np.float32(3.0 / math.sqrt(a.n_embd))
    if a.rope_freqs:
        w["rope_freqs.weight"] = llama3_rope_factors(a.head_dim, a.rope_base)
    return w


def write_model(m):
    a = m.arch
    vocab = load_vocab(a.vocab, a.n_vocab_cut)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][0])
    weights = make_weights(a, n_vocab)
    tmp = m.path + ".tmp"
    wr = gguf.GGUFWriter(tmp, a.arch)
    wr.add_string("general.name", m.name)
    wr.add_uint32("general.file_type", FILE_TYPES[m.wtype])
    k = a.arch
    wr.add_uint32(f"{k}.context_length", a.n_ctx_train)
    wr.add_uint32(f"{k}.embedding_length", a.n_embd)
    wr.add_uint32(f"{k}.block_count", a.n_layer)
    wr.add_uint32(f"{k}.feed_forward_length", a.n_ff)
    wr.add_uint32(f"{k}.attention.head_count", a.n_head)
    wr.add_uint32(f"{k}.attention.head_count_kv", a.n_head_kv)
    wr.add_float32(f"{k}.attention.layer_norm_rms_epsilon", a.eps)
    wr.add_float32(f"{k}.rope.freq_base", a.rope_base)
    wr.add_uint32(f"{k}.rope.dimension_count", a.head_dim)
    if a.head_dim * a.n_head != a.n_embd:
        wr.add_uint32(f"{k}.attention.key_length", a.head_dim)
        wr.add_uint32(f"{k}.attention.value_length", a.head_dim)
    wr.add_uint32(f"{k}.vocab_size", n_vocab)
    for key, (val, kind) in vocab.items():
        getattr(wr, "add_" + kind)(key, val)
    for name, w in weights.items():
        if w.ndim == 2:
            data, raw = quantize(w, m.wtype)
            wr.add_tensor(name, data, raw_dtype=raw)
        else:
            wr.add_tensor(name, w)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, m.path)


def ensure(out_dir, names=None, force=False, log=print):
    """Writes the models that are missing or older than this script; returns (made, skipped)
    where skipped lists (model, reason) for types no quantizer here can make."""
    os.makedirs(out_dir, exist_ok=True)
    made, skipped = [], []
    for m in models(out_dir):
        if names and not any(n in (m.name, m.arch.name) for n in names):
            continue
        if not force and os.path.exists(m.path) and os.path.getmtime(m.path) >= SCRIPT_MTIME:
            made.append(m)
            continue
        try:
            write_model(m)
            log(f"make_tiny_models: wrote {m.path} ({os.path.getsize(m.path) / 1e6:.1f} MB)")
            made.append(m)
        except NotImplementedError as e:
            log(f"make_tiny_models: SKIP {m.name}: {e}")
            skipped.append((m, str(e)))
    return made, skipped


# ------------------------------------------------------------------------------------------------
# An independent float64 forward pass, straight from a GGUF file (weights dequantized by gguf-py),
# used by test_logits.py to check that llama.cpp reads these files the way this script means them,
# and to measure how far llama.cpp itself is from exact arithmetic for each type.
# ------------------------------------------------------------------------------------------------

def finish_tiny(wr, tmp, path, vocab, tensors):
    """Ends a tiny file of tests/tiny_*.py: the vocabulary's keys and the tensors (float32 arrays,
    or (data, raw type) from quantize()) after the keys written so far, then the file written at
    tmp and renamed to path."""
    for key, (val, kind) in vocab.items():
        getattr(wr, "add_" + kind)(key, val)
    for name, data in tensors.items():
        data, raw = data if isinstance(data, tuple) else (data, None)
        wr.add_tensor(name, data, raw_dtype=raw)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, path)


def tiny_extras(w, v):
    """Adds a tiny variant's extra tensors (v.extra: name -> shape, a refusal case), small random
    F32 from its own seed; returns w."""
    extra = np.random.default_rng(v.seed + 1000)
    for name, shape in v.extra.items():
        w[name] = (0.1 * extra.standard_normal(shape)).astype(np.float32)
    return w


def tiny_typed(w, wtype, keep_f32):
    """A tiny file's weights with every matrix in wtype but those whose name holds keep_f32 (the
    convolution kernels llama.cpp reads as F32 only)."""
    if wtype == "F32":
        return w
    return {name: quantize(a, wtype) if a.ndim == 2 and keep_f32 not in name else a for name, a in w.items()}


def ensure_variants(out_dir, variants, write, script_mtime):
    """Writes the variants' files (write(v, path)) that are missing or older than script_mtime
    into out_dir; returns {name: path}."""
    os.makedirs(out_dir, exist_ok=True)
    out = {}
    for v in variants:
        path = os.path.join(out_dir, v.path_name)
        if not (os.path.exists(path) and os.path.getmtime(path) >= script_mtime):
            write(v, path)
        out[v.name] = path
    return out


@functools.lru_cache(maxsize=2)
def read_gguf(path):
    """(metadata without the vocabulary lists, {name: float64 array in numpy order}); cached,
    so treat the arrays as read-only."""
    r = gguf.GGUFReader(path)
    meta = {k: f.contents() for k, f in r.fields.items()
            if not k.startswith("tokenizer.ggml.") or k.endswith("_id")}
    tensors = {}
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]   # numpy order: (.., ne1, ne0)
        tensors[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float64).reshape(shape)
    return meta, tensors


def _rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def _rope(x, pos, base, factors, neox):
    """x: (n_tok, n_head, d); llama's "normal" RoPE rotates pairs (2i, 2i+1), NEOX pairs (i, i+d/2)."""
    d = x.shape[-1]
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if factors is not None:
        inv = inv / factors
    ang = pos[:, None] * inv[None, :]                           # (n_tok, d/2)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    if neox:
        x0, x1 = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def reference_logits(model_file, tokens):
    """Logits (n_tokens, n_vocab) for every position, float64."""
    meta, t = read_gguf(model_file)
    arch = meta["general.architecture"]

    def hp(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    n_head, n_head_kv = hp("attention.head_count"), hp("attention.head_count_kv")
    n_embd, n_layer = hp("embedding_length"), hp("block_count")
    head_dim = hp("attention.key_length", n_embd // n_head)
    eps, base = hp("attention.layer_norm_rms_epsilon"), hp("rope.freq_base", 10000.0)
    neox = arch in ("qwen2", "qwen3")
    factors = t.get("rope_freqs.weight")
    toks = np.asarray(tokens)
    n = len(toks)
    pos = np.arange(n, dtype=np.float64)
    x = t["token_embd.weight"][toks]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(n_layer):
        p = f"blk.{i}."
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        q, k, v = (h @ t[p + f"attn_{s}.weight"].T for s in "qkv")
        if p + "attn_q.bias" in t:
            q, k, v = q + t[p + "attn_q.bias"], k + t[p + "attn_k.bias"], v + t[p + "attn_v.bias"]
        q = q.reshape(n, n_head, head_dim)
        k = k.reshape(n, n_head_kv, head_dim)
        v = v.reshape(n, n_head_kv, head_dim)
        if p + "attn_q_norm.weight" in t:
            q = _rms(q, t[p + "attn_q_norm.weight"], eps)
            k = _rms(k, t[p + "attn_k_norm.weight"], eps)
        q, k = _rope(q, pos, base, factors, neox), _rope(k, pos, base, factors, neox)
        g = n_head // n_head_kv
        out = np.empty((n, n_head, head_dim))
        for hh in range(n_head):
            s = q[:, hh, :] @ k[:, hh // g, :].T / math.sqrt(head_dim) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            out[:, hh, :] = s @ v[:, hh // g, :]
        x = x + out.reshape(n, n_head * head_dim) @ t[p + "attn_output.weight"].T
        h = _rms(x, t[p + "ffn_norm.weight"], eps)
        gate = h @ t[p + "ffn_gate.weight"].T
        up = h @ t[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T
    h = _rms(x, t["output_norm.weight"], eps)
    out_w = t.get("output.weight", t["token_embd.weight"])
    return h @ out_w.T


# ------------------------------------------------------------------------------------------------
# Families and variants (test_families.py): every optional tensor and key each architecture's
# llama.cpp graph reads is present in one of these files, so a runtime that ignores one of them
# differs from llama.cpp. Written in F32 (and, for a few, quantized with an F32 twin holding the
# same weights dequantized, which stands in for exact arithmetic as test_logits.py's E does).
# ------------------------------------------------------------------------------------------------

@dataclass
class Family:
    name: str              # file stem, e.g. "gemma3-swa"
    arch: str              # general.architecture
    vocab: str             # as Arch.vocab
    n_vocab_cut: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_base: float
    eps: float
    tied: bool
    seed: int
    what: str                                   # one line: what this file covers
    kv: dict = field(default_factory=dict)      # extra metadata: suffix after "<arch>." -> value
    tensors: tuple = ()                         # optional tensor groups, see _family_weights
    rope_dim: int = 0                           # rope.dimension_count (0: head_dim)
    n_ctx_train: int = 4096
    wtypes: tuple = ("F32",)
    refuse: str = ""                            # a negative file: what kiri's error must name
    llama_cpp_loads: bool = True                # False: llama.cpp refuses it too (or aborts)
    # general.name, when the file stem would not do: llama.cpp's vocabulary loader looks up
    # Phi-3's special tokens (<|endoftext|>, absent from a 512-token vocabulary) in any model
    # whose name contains "phi3" or "phi-3".
    general_name: str = ""


# Gemma 3 real values: head_dim 256, RMS eps 1e-6, global base 1e6, local base 1e4, window 512,
# one global layer in 6. Here the window (8 or 12) is shorter than the 40-token prompts.
FAMILIES = [
    Family("gemma3-swa", "gemma3", "spm512", 0, 256, 512, 4, 2, 1, 256, 1000000.0, 1e-6, True, 201,
           "gemma3: window 8, pattern 3 (layers 0, 1, 3 local, 2 global), freq_base_swa 10000, "
           "final_logit_softcapping 6, tied, head_dim 256, GQA 2/1",
           kv={"attention.sliding_window": 8, "attention.sliding_window_pattern": 3,
               "rope.freq_base_swa": 10000.0, "final_logit_softcapping": 6.0},
           tensors=("qk_norm", "post_norms"), wtypes=("F32", "Q8_0", "Q4_K")),
    Family("gemma3-default", "gemma3", "spm512", 0, 256, 512, 7, 2, 1, 256, 1000000.0, 1e-6, False, 202,
           "gemma3: window 12 without pattern or freq_base_swa keys (llama.cpp's defaults: one "
           "global layer in 6, local base 10000), no soft-capping, separate output.weight",
           kv={"attention.sliding_window": 12}, tensors=("qk_norm", "post_norms")),
    Family("gemma3-full", "gemma3", "spm512", 0, 256, 512, 2, 2, 2, 256, 1000000.0, 1e-6, False, 203,
           "gemma3 without a sliding window (every layer global), MHA, q/k/v biases, per-tensor "
           ".scale on q, k, v and attn_output (llama.cpp's gemma3 loads feed-forward .scale "
           "tensors but does not apply them, so no file here has them), separate output.weight",
           tensors=("qk_norm", "post_norms", "qkv_bias", "attn_scales")),
    Family("phi3-fused", "phi3", "spm512", 0, 256, 512, 2, 4, 4, 64, 10000.0, 1e-5, False, 211,
           "phi3 (Phi-3-mini shape): fused attn_qkv and gate-up (ffn_up 2*n_ff), MHA, full rotary",
           tensors=("fused_qkv", "fused_gate_up"), general_name="tiny fused-qkv model"),
    Family("phi4-longrope", "phi3", "llama-bpe", 997, 256, 512, 2, 2, 1, 128, 10000.0, 1e-5, True, 212,
           "phi3 (Phi-4-mini shape): fused qkv with attn_qkv.bias and .scale, fused gate-up, partial "
           "rotary 96 of 128, LongRoPE long and short factors, original_context_length 256, "
           "attn_factor; n_ctx 256 takes the short factors, 512 the long ones",
           kv={"rope.scaling.type": "longrope", "rope.scaling.original_context_length": 256,
               "rope.scaling.attn_factor": 1.19},
           tensors=("fused_qkv", "fused_gate_up", "qkv_bias", "attn_scales", "longrope"),
           rope_dim=96, n_ctx_train=8192, wtypes=("F32", "Q8_0", "Q4_K")),
    Family("smollm3", "smollm3", "llama-bpe", 997, 256, 512, 4, 4, 2, 64, 5000000.0, 1e-6, True, 221,
           "smollm3: no RoPE on every fourth layer (layer 3 of 4), GQA 4/2, tied",
           wtypes=("F32", "Q8_0")),
    Family("smollm3-bias", "smollm3", "llama-bpe", 997, 256, 512, 4, 4, 2, 64, 5000000.0, 1e-6, False, 222,
           "smollm3 with q/k/v biases and a separate output.weight",
           tensors=("qkv_bias",)),
    Family("granite", "granite", "llama-bpe", 997, 256, 512, 2, 4, 2, 64, 10000.0, 1e-5, False, 231,
           "granite: embedding_scale 12, attention.scale 1/64, residual_scale 0.22, logit_scale 8, "
           "separate output.weight",
           kv={"embedding_scale": 12.0, "attention.scale": 0.015625, "residual_scale": 0.22,
               "logit_scale": 8.0},
           wtypes=("F32", "Q8_0", "Q4_K")),
    Family("granite-unset", "granite", "llama-bpe", 997, 256, 512, 2, 4, 2, 64, 10000.0, 1e-5, True, 232,
           "granite: logit_scale 3 only, attention.scale 0 (read as unset: 1/sqrt(head_dim)), "
           "tied, biases on q/k/v, attn_output and the three feed-forward weights",
           kv={"attention.scale": 0.0, "logit_scale": 3.0},
           tensors=("qkv_bias", "o_bias", "ffn_bias")),
    Family("llama-bias", "llama", "llama-bpe", 997, 256, 512, 2, 4, 2, 64, 500000.0, 1e-5, False, 241,
           "llama with biases on q, k, v, attn_output, ffn_gate, ffn_up, ffn_down",
           tensors=("qkv_bias", "o_bias", "ffn_bias"), wtypes=("F32", "Q8_0")),
    Family("qwen2-bias", "qwen2", "qwen2", 1000, 256, 512, 2, 4, 2, 64, 1000000.0, 1e-6, False, 242,
           "qwen2 with q/k/v biases and an output-projection bias (output.bias; llama.cpp's qwen2 "
           "has no feed-forward or attn_output biases: a file with them is refused by it)",
           tensors=("qkv_bias", "output_bias")),
    Family("qwen2-ffn-bias", "qwen2", "qwen2", 1000, 256, 512, 2, 4, 2, 64, 1000000.0, 1e-6, False, 245,
           "qwen2 with feed-forward and attn_output biases, which llama.cpp's qwen2 refuses "
           "(wrong number of tensors): kiri must use them (checked against exact arithmetic) or "
           "refuse the file naming one",
           tensors=("qkv_bias", "o_bias", "ffn_bias"), llama_cpp_loads=False),
    Family("qwen3-scale", "qwen3", "qwen2", 1000, 256, 512, 2, 4, 2, 128, 1000000.0, 1e-6, True, 243,
           "qwen3 with per-tensor .scale on q, k, v, attn_output, ffn_gate, ffn_up, ffn_down and "
           ".input_scale beside them (llama.cpp loads .input_scale and uses it only for NVFP4 "
           "activations, so on F32 weights it changes nothing)",
           tensors=("qk_norm", "attn_scales", "ffn_scales", "input_scales")),
    Family("llama-ropefactor0", "llama", "spm512", 0, 256, 512, 2, 4, 2, 64, 10000.0, 1e-5, False, 244,
           "llama with rope.scaling.type linear and rope.scaling.factor 0 (llama.cpp: no scaling)",
           kv={"rope.scaling.type": "linear", "rope.scaling.factor": 0.0}),
    Family("llama-extra-tensor", "llama", "spm512", 0, 256, 512, 2, 4, 2, 64, 10000.0, 1e-5, False, 251,
           "negative: llama with a tensor no llama graph reads (blk.0.attn_mystery.weight)",
           tensors=("extra",), refuse="blk.0.attn_mystery.weight", llama_cpp_loads=False),
    Family("llama-rope-type", "llama", "spm512", 0, 256, 512, 2, 4, 2, 64, 10000.0, 1e-5, False, 252,
           "negative: llama with rope.scaling.type 'wobble' (llama.cpp aborts on it)",
           kv={"rope.scaling.type": "wobble", "rope.scaling.factor": 2.0},
           refuse="rope.scaling.type", llama_cpp_loads=False),
]


@dataclass
class FamilyModel:
    name: str       # e.g. "gemma3-swa-Q4_K"
    fam: Family
    wtype: str
    path: str
    twin: str       # the F32 file with the same (dequantized) weights, or "" for F32 models


def family_models(out_dir):
    out = []
    for f in FAMILIES:
        for t in f.wtypes:
            path = os.path.join(out_dir, f"{f.name}-{t}.gguf")
            twin = "" if t == "F32" else os.path.join(out_dir, f"{f.name}-{t}-dequant-F32.gguf")
            out.append(FamilyModel(f"{f.name}-{t}", f, t, path, twin))
    return out


def longrope_factors(n, seed, lo, hi):
    """Plausible LongRoPE factor sets: rising from lo to hi across the frequency pairs, jittered."""
    rng = np.random.default_rng(seed)
    base = np.geomspace(lo, hi, n)
    return (base * (1.0 + 0.05 * rng.standard_normal(n))).astype(np.float32)


def _family_weights(f, n_vocab):
    rng = np.random.default_rng(f.seed)
    opt = set(f.tensors)

    def mat(n_out, n_in, gain=1.0):
        return (rng.standard_normal((n_out, n_in)) * (gain / math.sqrt(n_in))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def bias(n):
        return (0.5 * rng.standard_normal(n)).astype(np.float32)

    def scale():   # a per-tensor scale far enough from 1 that ignoring it shows
        return np.array([rng.uniform(0.5, 1.6)], dtype=np.float32)

    q_dim, kv_dim = f.n_head * f.head_dim, f.n_head_kv * f.head_dim
    emb = rng.standard_normal((n_vocab, f.n_embd)).astype(np.float32)
    if f.arch == "gemma3":
        emb *= np.float32(1.0 / math.sqrt(f.n_embd))   # the graph multiplies by sqrt(n_embd)
    if f.arch == "granite":
        emb *= np.float32(1.0 / f.kv.get("embedding_scale", 1.0))   # and granite by this
    w = {"token_embd.weight": emb}
    if f.tied:
        w["token_embd.weight"] = emb * np.float32(3.0 / math.sqrt(f.n_embd) /
                                                  (emb.std() if emb.std() > 0 else 1.0))
    for i in range(f.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(f.n_embd)
        if "fused_qkv" in opt:
            w[p + "attn_qkv.weight"] = mat(q_dim + 2 * kv_dim, f.n_embd)
            if "qkv_bias" in opt:
                w[p + "attn_qkv.bias"] = bias(q_dim + 2 * kv_dim)
            if "attn_scales" in opt:
                w[p + "attn_qkv.scale"] = scale()
        else:
            for s, d in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                w[p + f"attn_{s}.weight"] = mat(d, f.n_embd)
                if "qkv_bias" in opt:
                    w[p + f"attn_{s}.bias"] = bias(d)
                if "attn_scales" in opt:
                    w[p + f"attn_{s}.scale"] = scale()
                if "input_scales" in opt:
                    w[p + f"attn_{s}.input_scale"] = scale()
        if "qk_norm" in opt:
            w[p + "attn_q_norm.weight"] = norm(f.head_dim)
            w[p + "attn_k_norm.weight"] = norm(f.head_dim)
        w[p + "attn_output.weight"] = mat(f.n_embd, q_dim)
        if "o_bias" in opt:
            w[p + "attn_output.bias"] = bias(f.n_embd)
        if "attn_scales" in opt:
            w[p + "attn_output.scale"] = scale()
        if "input_scales" in opt:
            w[p + "attn_output.input_scale"] = scale()
        if "post_norms" in opt:
            w[p + "post_attention_norm.weight"] = norm(f.n_embd)
        w[p + "ffn_norm.weight"] = norm(f.n_embd)
        if "fused_gate_up" in opt:
            w[p + "ffn_up.weight"] = mat(2 * f.n_ff, f.n_embd)     # gate rows first, then up
        else:
            w[p + "ffn_gate.weight"] = mat(f.n_ff, f.n_embd)
            w[p + "ffn_up.weight"] = mat(f.n_ff, f.n_embd)
        w[p + "ffn_down.weight"] = mat(f.n_embd, f.n_ff, gain=2.0)
        for s, d in (("gate", f.n_ff), ("up", f.n_ff), ("down", f.n_embd)):
            if p + f"ffn_{s}.weight" not in w:
                continue
            if "ffn_bias" in opt:
                w[p + f"ffn_{s}.bias"] = bias(d)
            if "ffn_scales" in opt:
                w[p + f"ffn_{s}.scale"] = scale()
            if "input_scales" in opt:
                w[p + f"ffn_{s}.input_scale"] = scale()
        if "post_norms" in opt:
            w[p + "post_ffw_norm.weight"] = norm(f.n_embd)
        if "extra" in opt and i == 0:
            w[p + "attn_mystery.weight"] = mat(f.n_embd, f.n_embd)
    w["output_norm.weight"] = norm(f.n_embd)
    if f.arch == "granite":   # the graph divides the logits by logit_scale: keep their spread
        w["output_norm.weight"] *= np.float32(f.kv["logit_scale"])
    if not f.tied:
        w["output.weight"] = mat(n_vocab, f.n_embd, gain=3.0)
    if "output_bias" in opt:
        w["output.bias"] = bias(n_vocab)
    if "longrope" in opt:
        n = (f.rope_dim or f.head_dim) // 2
        w["rope_factors_long.weight"] = longrope_factors(n, f.seed + 1, 1.0, 24.0)
        w["rope_factors_short.weight"] = longrope_factors(n, f.seed + 2, 1.0, 3.0)
    return w


_QUANT_EXCLUDE = ("_norm.weight", ".bias", ".scale", ".input_scale", "rope_factors")


def _quantized(name, w, wtype):
    """Whether tensor name gets the model's type: 2-D weights do (the fused and separate
    projections, token_embd, output); norms, biases, scales and rope factors stay F32."""
    return w.ndim == 2 and not name.endswith(_QUANT_EXCLUDE)


def _write_gguf(path, f, name, wtype, vocab, tensors):
    """tensors: name -> (array, raw_dtype or None)."""
    n_vocab = len(vocab["tokenizer.ggml.tokens"][0])
    tmp = path + ".tmp"
    wr = gguf.GGUFWriter(tmp, f.arch)
    wr.add_string("general.name", name)
    wr.add_uint32("general.file_type", FILE_TYPES[wtype])
    k = f.arch
    wr.add_uint32(f"{k}.context_length", f.n_ctx_train)
    wr.add_uint32(f"{k}.embedding_length", f.n_embd)
    wr.add_uint32(f"{k}.block_count", f.n_layer)
    wr.add_uint32(f"{k}.feed_forward_length", f.n_ff)
    wr.add_uint32(f"{k}.attention.head_count", f.n_head)
    wr.add_uint32(f"{k}.attention.head_count_kv", f.n_head_kv)
    wr.add_float32(f"{k}.attention.layer_norm_rms_epsilon", f.eps)
    wr.add_float32(f"{k}.rope.freq_base", f.rope_base)
    wr.add_uint32(f"{k}.rope.dimension_count", f.rope_dim or f.head_dim)
    if f.head_dim * f.n_head != f.n_embd:
        wr.add_uint32(f"{k}.attention.key_length", f.head_dim)
        wr.add_uint32(f"{k}.attention.value_length", f.head_dim)
    wr.add_uint32(f"{k}.vocab_size", n_vocab)
    for key, val in f.kv.items():
        if isinstance(val, str):
            wr.add_string(f"{k}.{key}", val)
        elif isinstance(val, bool):
            wr.add_bool(f"{k}.{key}", val)
        elif isinstance(val, int):
            wr.add_uint32(f"{k}.{key}", val)
        else:
            wr.add_float32(f"{k}.{key}", val)
    for key, (val, kind) in vocab.items():
        getattr(wr, "add_" + kind)(key, val)
    for tname, (data, raw) in tensors.items():
        wr.add_tensor(tname, data, raw_dtype=raw)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(tmp, path)


def write_family_model(m):
    f = m.fam
    vocab = load_vocab(f.vocab, f.n_vocab_cut)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][0])
    weights = _family_weights(f, n_vocab)
    tensors = {}
    for name, w in weights.items():
        tensors[name] = quantize(w, m.wtype) if _quantized(name, w, m.wtype) else (w, None)
    _write_gguf(m.path, f, f.general_name or m.name, m.wtype, vocab, tensors)
    if m.twin:
        # The twin: every quantized tensor dequantized back to F32 (gguf-py's dequantizer), the
        # rest as it is, so llama.cpp on it computes in F32 what the quantized file holds.
        twin = {}
        r = gguf.GGUFReader(m.path)
        for t in r.tensors:
            shape = [int(x) for x in reversed(t.shape.tolist())]
            twin[t.name] = (gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32)
                            .reshape(shape), None)
        _write_gguf(m.twin, f, (f.general_name or m.name) + " dequantized", "F32", vocab, twin)


def ensure_families(out_dir, names=None, force=False, log=print):
    """As ensure(), for family_models(); returns (made, skipped)."""
    os.makedirs(out_dir, exist_ok=True)
    made, skipped = [], []
    for m in family_models(out_dir):
        if names and not any(n in (m.name, m.fam.name, m.fam.arch) for n in names):
            continue
        fresh = [p for p in (m.path, m.twin) if p]
        if not force and all(os.path.exists(p) and os.path.getmtime(p) >= SCRIPT_MTIME for p in fresh):
            made.append(m)
            continue
        try:
            write_family_model(m)
            log(f"make_tiny_models: wrote {m.path} ({os.path.getsize(m.path) / 1e6:.1f} MB)")
            made.append(m)
        except NotImplementedError as e:
            log(f"make_tiny_models: SKIP {m.name}: {e}")
            skipped.append((m, str(e)))
    return made, skipped


def family_reference_logits(model_file, tokens, n_ctx):
    """Logits (n_tokens, n_vocab), float64, for the family files (and the llama/qwen2/qwen3 files
    of test_logits.py), from the graphs as llama.cpp's src/models/*.cpp build them: gemma3's
    embedding scale, sliding-window layers, local RoPE base, pre- and post-norms, GeGLU with
    tanh-GELU and soft-capping; phi3's fused QKV and gate-up, partial NEOX rotary, LongRoPE
    factors (long when n_ctx exceeds original_context_length) and attn_factor; smollm3's layers
    without RoPE; granite's four multipliers; biases and per-tensor .scale wherever present.
    n_ctx is the context llama.cpp runs with (it rounds it up to a multiple of 256)."""
    meta, t = read_gguf(model_file)
    arch = meta["general.architecture"]

    def hp(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    n_head, n_head_kv = hp("attention.head_count"), hp("attention.head_count_kv")
    n_embd, n_layer = hp("embedding_length"), hp("block_count")
    head_dim = hp("attention.key_length", n_embd // n_head)
    n_rot = hp("rope.dimension_count", head_dim)
    eps, base = hp("attention.layer_norm_rms_epsilon"), hp("rope.freq_base", 10000.0)
    neox = arch in ("qwen2", "qwen3", "gemma3", "phi3")
    scale_kind = hp("rope.scaling.type", "linear")
    factor = hp("rope.scaling.factor", 0.0)
    freq_scale = 1.0 if not factor else 1.0 / factor
    attn_factor = hp("rope.scaling.attn_factor", 1.0)
    n_ctx_pad = -(-n_ctx // 256) * 256
    if "rope_freqs.weight" in t:
        factors = t["rope_freqs.weight"]
    elif scale_kind == "longrope" and "rope_factors_long.weight" in t:
        orig = hp("rope.scaling.original_context_length", hp("context_length"))
        factors = t["rope_factors_long.weight" if n_ctx_pad > orig else "rope_factors_short.weight"]
    else:
        factors = None
    window = hp("attention.sliding_window", 0) if arch == "gemma3" else 0
    pattern = hp("attention.sliding_window_pattern", 6)
    is_swa = [bool(window) and (il % pattern < pattern - 1) for il in range(n_layer)]
    base_swa = hp("rope.freq_base_swa", 10000.0)
    softcap = hp("final_logit_softcapping", 0.0) if arch == "gemma3" else 0.0
    toks = np.asarray(tokens)
    n = len(toks)
    pos = np.arange(n, dtype=np.float64)

    def lin(name, x, kind="attn"):
        """x @ W.T with the weight's .scale and .bias, in llama.cpp's order: projections scale
        then add the bias (build_lora_mm, build_qkv), the feed-forward adds then scales."""
        y = x @ t[name + ".weight"].T
        s, b = t.get(name + ".scale"), t.get(name + ".bias")
        if kind == "attn":
            y = y * s[0] if s is not None else y
            y = y + b if b is not None else y
        else:
            y = y + b if b is not None else y
            y = y * s[0] if s is not None else y
        return y

    def rope(x, b):
        if n_rot == x.shape[-1]:
            r = _rope(x, pos * freq_scale, b, factors, neox)
            return r * attn_factor
        rot = _rope(x[..., :n_rot], pos * freq_scale, b, factors, neox) * attn_factor
        return np.concatenate([rot, x[..., n_rot:]], axis=-1)

    x = t["token_embd.weight"][toks]
    if arch == "gemma3":
        x = x * np.float64(np.float32(math.sqrt(n_embd)))
    if arch == "granite" and hp("embedding_scale", 0.0):
        x = x * hp("embedding_scale")
    causal = np.triu(np.full((n, n), -np.inf), 1)
    local = causal + np.where(pos[:, None] - pos[None, :] >= max(window, 1), -np.inf, 0.0)
    res_scale = hp("residual_scale", 0.0) if arch == "granite" else 0.0
    for i in range(n_layer):
        p = f"blk.{i}."
        h = _rms(x, t[p + "attn_norm.weight"], eps)
        if p + "attn_qkv.weight" in t:
            qkv = lin(p + "attn_qkv", h)
            qd, kd = n_head * head_dim, n_head_kv * head_dim
            q, k, v = qkv[:, :qd], qkv[:, qd:qd + kd], qkv[:, qd + kd:]
        else:
            q, k, v = (lin(p + f"attn_{s}", h) for s in "qkv")
        q = q.reshape(n, n_head, head_dim)
        k = k.reshape(n, n_head_kv, head_dim)
        v = v.reshape(n, n_head_kv, head_dim)
        if p + "attn_q_norm.weight" in t:
            q = _rms(q, t[p + "attn_q_norm.weight"], eps)
            k = _rms(k, t[p + "attn_k_norm.weight"], eps)
        use_rope = not (arch == "smollm3" and (i + 1) % 4 == 0)
        if use_rope:
            b = base_swa if is_swa[i] else base
            q, k = rope(q, b), rope(k, b)
        kq_scale = 1.0 / math.sqrt(head_dim)
        if arch == "granite" and hp("attention.scale", 0.0):
            kq_scale = hp("attention.scale")
        mask = local if is_swa[i] else causal
        g = n_head // n_head_kv
        out = np.empty((n, n_head, head_dim))
        for hh in range(n_head):
            sc = q[:, hh, :] @ k[:, hh // g, :].T * kq_scale + mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            out[:, hh, :] = sc @ v[:, hh // g, :]
        a = lin(p + "attn_output", out.reshape(n, n_head * head_dim))
        if p + "post_attention_norm.weight" in t:
            a = _rms(a, t[p + "post_attention_norm.weight"], eps)
        if res_scale:
            a = a * res_scale
        x = x + a
        h = _rms(x, t[p + "ffn_norm.weight"], eps)
        if p + "ffn_gate.weight" in t:
            gate, up = lin(p + "ffn_gate", h, "ffn"), lin(p + "ffn_up", h, "ffn")
        else:   # fused: the first half of ffn_up's rows is the gate
            gu = lin(p + "ffn_up", h, "ffn")
            gate, up = gu[:, : gu.shape[1] // 2], gu[:, gu.shape[1] // 2:]
        if arch == "gemma3":
            act = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
        else:
            act = gate / (1 + np.exp(-gate))
        f = lin(p + "ffn_down", act * up, "ffn")
        if p + "post_ffw_norm.weight" in t:
            f = _rms(f, t[p + "post_ffw_norm.weight"], eps)
        if res_scale:
            f = f * res_scale
        x = x + f
    h = _rms(x, t["output_norm.weight"], eps)
    out_w = t.get("output.weight", t["token_embd.weight"])
    logits = h @ out_w.T
    if "output.bias" in t:
        logits = logits + t["output.bias"]
    if arch == "granite":
        logits = logits / hp("logit_scale")
    if softcap:
        logits = np.tanh(logits / softcap) * softcap
    return logits


# ------------------------------------------------------------------------------------------------
# Command line
# ------------------------------------------------------------------------------------------------

def check_loads(m):
    """Loads m in llama-cpp-python and evaluates a few tokens; returns the last logits row."""
    import llama_cpp
    llm = llama_cpp.Llama(model_path=m.path, n_ctx=64, logits_all=True, n_threads=2,
                          n_threads_batch=2, verbose=False)
    try:
        n_vocab = llm.n_vocab()
        toks = [1 % n_vocab, 5, 17, 3 % n_vocab]
        llm.eval(toks)
        row = np.array(llm.scores[len(toks) - 1], dtype=np.float32)
        assert row.shape == (n_vocab,) and np.isfinite(row).all()
        return row
    finally:
        llm.close()


def llama_cpp_refuses(path):
    """Loads path in llama.cpp in a child process (llama.cpp aborts on some bad keys); returns
    the last line of its complaint when it refuses, "" when it loads."""
    import subprocess
    code = ("import llama_cpp, sys\n"
            "llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, verbose=True)\n")
    r = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True,
                       timeout=120)
    if r.returncode == 0:
        return ""
    lines = [ln for ln in r.stderr.splitlines() if "error" in ln.lower() or "assert" in ln.lower()]
    return (lines[-1] if lines else f"exit status {r.returncode}").strip()


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("KIRI_TINY_MODELS",
                                                     os.path.join(REPO, "build", "tiny-models")))
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--families", action="store_true",
                    help="the family files of test_families.py instead of test_logits.py's")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    if args.list:
        for m in (family_models(args.out) if args.families else models(args.out)):
            print(m.name, m.path)
        return 0
    if args.families:
        made, skipped = ensure_families(args.out, args.names, args.force)
    else:
        made, skipped = ensure(args.out, args.names, args.force)
    rc = 0
    if args.check:
        for m in made:
            if args.families and not m.fam.llama_cpp_loads:
                why = llama_cpp_refuses(m.path)
                print(f"check {m.name}: refused by llama.cpp as intended ({why})" if why else
                      f"check {m.name}: FAILED: llama.cpp loads it")
                rc = rc or (0 if why else 1)
                continue
            for path in (m.path, getattr(m, "twin", "")):
                if not path:
                    continue
                try:
                    row = check_loads(Model(os.path.basename(path), None, "", path))
                    print(f"check {os.path.basename(path)}: loads in llama.cpp, logits range "
                          f"[{row.min():.2f}, {row.max():.2f}]")
                except Exception as e:  # report every model, then fail
                    print(f"check {os.path.basename(path)}: FAILED: {e}")
                    rc = 1
    for m, why in skipped:
        print(f"skipped {m.name}: {why}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
