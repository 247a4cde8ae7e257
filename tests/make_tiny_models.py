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

Usage: make_tiny_models.py [--out DIR] [--force] [--check] [--list] [NAME ...]
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


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.environ.get("KIRI_TINY_MODELS",
                                                     os.path.join(REPO, "build", "tiny-models")))
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    if args.list:
        for m in models(args.out):
            print(m.name, m.path)
        return 0
    made, skipped = ensure(args.out, args.names, args.force)
    rc = 0
    if args.check:
        for m in made:
            try:
                row = check_loads(m)
                print(f"check {m.name}: loads in llama.cpp, logits range "
                      f"[{row.min():.2f}, {row.max():.2f}]")
            except Exception as e:  # report every model, then fail
                print(f"check {m.name}: FAILED: {e}")
                rc = 1
    for m, why in skipped:
        print(f"skipped {m.name}: {why}")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
