"""Tiny random lfm2 (LFM2 / LFM2.5 text) files for test_lfm2.py, written with the `gguf` package
under the key and tensor names llama.cpp's lfm2 loader reads (src/models/lfm2.cpp,
src/llama-arch.cpp): shortconv.l_cache (the convolution's taps), a per-layer head_count_kv array
whose zeros mark the short-convolution layers, blk.N.shortconv.{in_proj,conv,out_proj} on those,
GQA attention with attn_q_norm / attn_k_norm on the others, the final norm under the name
token_embd_norm, tied embeddings unless the variant writes output.weight.

    python3 tests/tiny_lfm2.py OUT_DIR     writes every file of VARIANTS into OUT_DIR
"""

import math
import os
import sys
from dataclasses import dataclass, field

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_models as mtm  # noqa: E402

ARCH = "lfm2"


@dataclass
class Variant:
    name: str
    what: str
    kv: list                   # head_count_kv per layer: 0 for a short-convolution layer
    n_embd: int = 64
    n_head: int = 4
    n_ff: int = 96
    taps: int = 3              # shortconv.l_cache
    untied: bool = False       # output.weight of its own
    seed: int = 500
    extra: dict = field(default_factory=dict)      # tensors beyond the graph (a refusal case)
    extra_kv: dict = field(default_factory=dict)   # keys beyond the text model's (uint32 values)
    extra_bool: dict = field(default_factory=dict)  # the same, bool values
    base: str = ""             # same weights as this variant, plus extra
    wtype: str = "F32"         # the projections' type (the norms and the convolution's kernel stay F32)

    @property
    def path_name(self):
        return f"{self.name}-{self.wtype}.gguf"


VARIANTS = [
    Variant("lfm2-a", "LFM2's layout: 6 layers, convolutions on 0, 1, 3 and 5, GQA attention (4 heads, "
            "2 KV heads) on 2 and 4, 3 taps, tied embeddings", [0, 0, 2, 0, 2, 0], seed=501),
    Variant("lfm2-b", "attention first (one KV head), convolutions of 4 taps on 1, 2 and 4, an output "
            "matrix of its own", [1, 0, 0, 1, 0], taps=4, untied=True, seed=502),
    Variant("lfm2-q8", "lfm2-a's weights with every projection and the embedding in Q8_0", [0, 0, 2, 0, 2, 0],
            seed=501, wtype="Q8_0"),
    # Refusals.
    Variant("lfm2-swa", "lfm2-a with attention.sliding_window 8", [0, 0, 2, 0, 2, 0], seed=501, base="lfm2-a",
            extra_kv={"attention.sliding_window": 8}),
    Variant("lfm2-bidir", "lfm2-a with attention.causal false (LFM2.5's embedding models)", [0, 0, 2, 0, 2, 0],
            seed=501, base="lfm2-a", extra_bool={"attention.causal": False}),
    Variant("lfm2-colbert", "lfm2-a with the dense_2_out projection of LFM2-ColBert", [0, 0, 2, 0, 2, 0],
            seed=501, base="lfm2-a", extra={"dense_2_out.weight": (32, 64)}),
]


def variant(name):
    return next(v for v in VARIANTS if v.name == name)


def _weights(v, n_vocab):
    rng = np.random.default_rng(v.seed)

    def mat(n_out, n_in, gain=1.0):
        return (rng.standard_normal((n_out, n_in)) * (gain / math.sqrt(n_in))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    E, H = v.n_embd, v.n_head
    D = E // H
    w = {"token_embd.weight": (rng.standard_normal((n_vocab, E)) / math.sqrt(E)).astype(np.float32)}
    for i, kv in enumerate(v.kv):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(E)
        if kv == 0:
            w[p + "shortconv.in_proj.weight"] = mat(3 * E, E, gain=1.5)
            # numpy (E, taps): ne = [taps, E], each channel's taps oldest input first.
            w[p + "shortconv.conv.weight"] = (rng.standard_normal((E, v.taps)) / math.sqrt(v.taps)).astype(np.float32)
            w[p + "shortconv.out_proj.weight"] = mat(E, E)
        else:
            w[p + "attn_q.weight"] = mat(H * D, E)
            w[p + "attn_k.weight"] = mat(kv * D, E)
            w[p + "attn_v.weight"] = mat(kv * D, E)
            w[p + "attn_q_norm.weight"] = (0.5 * norm(D)).astype(np.float32)
            w[p + "attn_k_norm.weight"] = norm(D)
            w[p + "attn_output.weight"] = mat(E, H * D)
        w[p + "ffn_norm.weight"] = norm(E)
        w[p + "ffn_gate.weight"] = mat(v.n_ff, E)
        w[p + "ffn_up.weight"] = mat(v.n_ff, E)
        w[p + "ffn_down.weight"] = mat(E, v.n_ff, gain=2.0)
    w["token_embd_norm.weight"] = norm(E)
    if v.untied:
        w["output.weight"] = mat(n_vocab, E, gain=3.0)
    return mtm.tiny_extras(w, v)


def write(v, path):
    vocab = mtm.load_vocab("spm512", 0)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][0])
    tmp = path + ".tmp"
    wr = gguf.GGUFWriter(tmp, ARCH)
    k = ARCH
    wr.add_string("general.name", v.name)
    wr.add_uint32("general.file_type", 0)
    wr.add_uint32(f"{k}.context_length", 512)
    wr.add_uint32(f"{k}.embedding_length", v.n_embd)
    wr.add_uint32(f"{k}.block_count", len(v.kv))
    wr.add_uint32(f"{k}.feed_forward_length", v.n_ff)
    wr.add_uint32(f"{k}.attention.head_count", v.n_head)
    wr.add_array(f"{k}.attention.head_count_kv", list(v.kv))
    wr.add_float32(f"{k}.attention.layer_norm_rms_epsilon", 1e-5)
    wr.add_float32(f"{k}.rope.freq_base", 1000000.0)
    wr.add_uint32(f"{k}.shortconv.l_cache", v.taps)
    wr.add_uint32(f"{k}.vocab_size", n_vocab)
    for key, val in v.extra_kv.items():
        wr.add_uint32(f"{k}.{key}", val)
    for key, val in v.extra_bool.items():
        wr.add_bool(f"{k}.{key}", val)
    mtm.finish_tiny(wr, tmp, path, vocab, mtm.tiny_typed(_weights(v, n_vocab), v.wtype, "shortconv.conv"))


def reference_logits(path, tokens):
    """Logits (n_tokens, n_vocab), float64, of lfm2 as llama.cpp's src/models/lfm2.cpp builds its
    graph, over the file's weights: per layer an RMS norm, then either the gated short
    convolution (B, C, x = in_proj h; y[t] = sum_k w[k] (B x)[t - taps + 1 + k], zeros before
    the first token; out_proj (C y)) or attention (RMS-normed q and k, NEOX RoPE, scale
    1/sqrt(head size)); the residual; the SwiGLU feed-forward; token_embd_norm; the output."""
    meta, t = mtm.read_gguf(path)
    a = ARCH

    def hp(key, default=None):
        return meta.get(f"{a}.{key}", default)

    toks = np.asarray(tokens)
    n = len(toks)
    E, H = hp("embedding_length"), hp("attention.head_count")
    D = E // H
    eps, base, taps = hp("attention.layer_norm_rms_epsilon"), hp("rope.freq_base"), hp("shortconv.l_cache")
    kv = list(hp("attention.head_count_kv"))
    pos = np.arange(n, dtype=np.float64)
    causal = np.triu(np.full((n, n), -np.inf), 1)
    x = t["token_embd.weight"][toks]
    for i, Hkv in enumerate(kv):
        p = f"blk.{i}."
        h = mtm._rms(x, t[p + "attn_norm.weight"], eps)
        if Hkv == 0:
            bcx = h @ t[p + "shortconv.in_proj.weight"].T
            b, c, xx = bcx[:, :E], bcx[:, E:2 * E], bcx[:, 2 * E:]
            u = np.concatenate([np.zeros((taps - 1, E)), b * xx])
            w = t[p + "shortconv.conv.weight"]                     # (E, taps)
            y = sum(u[k:k + n] * w[:, k] for k in range(taps))
            out = (c * y) @ t[p + "shortconv.out_proj.weight"].T
        else:
            q = mtm._rms((h @ t[p + "attn_q.weight"].T).reshape(n, H, D), t[p + "attn_q_norm.weight"], eps)
            k = mtm._rms((h @ t[p + "attn_k.weight"].T).reshape(n, Hkv, D), t[p + "attn_k_norm.weight"], eps)
            v = (h @ t[p + "attn_v.weight"].T).reshape(n, Hkv, D)
            q, k = mtm._rope(q, pos, base, None, True), mtm._rope(k, pos, base, None, True)
            g = H // Hkv
            att = np.empty((n, H, D))
            for hh in range(H):
                sc = q[:, hh, :] @ k[:, hh // g, :].T / math.sqrt(D) + causal
                sc = np.exp(sc - sc.max(-1, keepdims=True))
                sc /= sc.sum(-1, keepdims=True)
                att[:, hh, :] = sc @ v[:, hh // g, :]
            out = att.reshape(n, H * D) @ t[p + "attn_output.weight"].T
        x = x + out
        h = mtm._rms(x, t[p + "ffn_norm.weight"], eps)
        gt = h @ t[p + "ffn_gate.weight"].T
        x = x + (gt / (1 + np.exp(-gt)) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
    h = mtm._rms(x, t["token_embd_norm.weight"], eps)
    return h @ t.get("output.weight", t["token_embd.weight"]).T


SCRIPT_MTIME = max(os.path.getmtime(__file__), mtm.SCRIPT_MTIME)


def ensure(out_dir, variants=VARIANTS):
    """Writes the files that are missing or older than this script; returns {name: path}."""
    return mtm.ensure_variants(out_dir, variants, write, SCRIPT_MTIME)


if __name__ == "__main__":
    for name, path in ensure(sys.argv[1]).items():
        print(name, path)
