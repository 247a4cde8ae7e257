"""Tiny random gemma4 (Gemma 4 E2B/E4B text) files for test_families.py, written with the `gguf`
package under the key and tensor names llama.cpp's gemma4 loader reads (src/models/gemma4.cpp,
src/llama-arch.cpp): a per-layer sliding-window flag array, head sizes key_length (global layers)
and key_length_swa (sliding ones), per-layer head_count_kv and feed_forward_length arrays,
shared_kv_layers, per-layer embeddings, rope_freqs for the global layers' proportional RoPE,
per-layer output scales and final-logit soft-capping.

shared_kv_layers = N: the last N layers keep no keys or values and attend those of layer
n_kv - 2 (sliding ones) or n_kv - 1 (global ones), n_kv = n_layer - N, as llama.cpp maps them;
so every file here has layer n_kv - 1 global and n_kv - 2 sliding, as the real models do.

    python3 tests/tiny_gemma4.py OUT_DIR     writes every file of VARIANTS into OUT_DIR
"""

import math
import os
import sys
from dataclasses import dataclass, field

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_models as mtm  # noqa: E402

ARCH = "gemma4"


@dataclass
class Variant:
    name: str
    what: str
    swa: list                  # per layer: True slides
    n_embd: int = 64
    n_head: int = 4
    head_swa: int = 16
    head_global: int = 32
    kv_swa: int = 2            # KV heads of sliding / global layers (an array when they differ)
    kv_global: int = 1
    n_ff: int = 96
    double_wide: bool = False  # the shared layers' feed-forward twice as wide (an n_ff array)
    shared: int = 0            # shared_kv_layers
    per_layer: int = 0         # embedding_length_per_layer_input (0: no per-layer embeddings)
    window: int = 8
    rot_swa: int = 0           # rope.dimension_count_swa (0: the sliding head size)
    rot_unrotated: int = 0     # global layers' pairs left unrotated by rope_freqs (1e30 factors)
    softcap: float = 0.0       # 0: no final_logit_softcapping key (llama.cpp then caps at 30)
    out_scale: bool = False    # blk.N.layer_output_scale.weight
    no_v: bool = False         # no attn_v: values are the keys' projection (llama.cpp's k_eq_v)
    seed: int = 400
    extra: dict = field(default_factory=dict)   # tensors beyond the text graph (towers, experts)
    extra_kv: dict = field(default_factory=dict)  # keys beyond the text model's (uint32 values)
    base: str = ""             # the weights of this variant (same seed and shapes), plus extra
    malformed: bool = False    # breaks llama.cpp's layout rules on purpose (a refusal case)

    @property
    def path_name(self):
        return f"{self.name}-F32.gguf"


E_PATTERN = [False if (i % 4) == 3 else True for i in range(8)]   # layers 3 and 7 global

VARIANTS = [
    Variant("gemma4-e", "gemma4 as E2B is built: 8 layers (3 and 7 global), the last 4 sharing the "
            "KV of layers 2 and 3, head sizes 16 (sliding) and 32 (global), KV heads 2 and 1, "
            "per-layer embeddings of 8, double-wide feed-forward on the shared layers, proportional "
            "RoPE on the global layers (12 of 16 pairs unrotated), partial rotary 8 of 16 on "
            "sliding layers, layer output scales, soft-capping 2.5, window 8",
            E_PATTERN, double_wide=True, shared=4, per_layer=8, rot_swa=8, rot_unrotated=12,
            softcap=2.5, out_scale=True, seed=401),
    # Files that are not ordinary text models (llama.cpp refuses all three: it counts tensors).
    Variant("gemma4-towers", "gemma4-e's weights plus vision and audio tower tensors and their "
            "projectors (v.*, a.*, mm.*): runs as text", E_PATTERN, double_wide=True, shared=4,
            per_layer=8, rot_swa=8, rot_unrotated=12, softcap=2.5, out_scale=True, seed=401,
            base="gemma4-e", extra={"v.patch_embd.weight": (16, 48), "v.blk.0.attn_q.weight": (16, 16),
                                    "a.conv1d.0.weight": (8, 8), "mm.input_projection.weight": (64, 16)}),
    Variant("gemma4-moe", "gemma4-plain with a mixture-of-experts router on layer 1 (26B-A4B's "
            "ffn_gate_inp and expert tensors), no expert_count key", [True, False, True, True, False, True],
            kv_swa=2, kv_global=2, window=12, no_v=True, seed=402, base="gemma4-plain",
            extra={"blk.1.ffn_gate_inp.weight": (4, 64), "blk.1.ffn_gate_exps.weight": (4, 32, 64)}),
    Variant("gemma4-moe-key", "gemma4-plain with gemma4.expert_count 4", [True, False, True, True, False, True],
            kv_swa=2, kv_global=2, window=12, no_v=True, seed=402, base="gemma4-plain",
            extra_kv={"expert_count": 4, "expert_used_count": 2}),
    Variant("gemma4-bad-share", "gemma4 whose last two layers share KV although layer n_kv - 1 "
            "slides: llama.cpp's mapping would give the shared global layer a sliding layer's keys",
            [True, True, False, True, False, True], kv_swa=2, kv_global=2, shared=2, window=12, seed=403,
            malformed=True),
    Variant("gemma4-plain", "gemma4 without per-layer embeddings or shared KV, one KV head count and "
            "feed-forward width for every layer, no values projection (values are the keys' "
            "projection), rope_freqs all ones, no soft-capping key (capped at 30), window 12",
            [True, False, True, True, False, True], kv_swa=2, kv_global=2, window=12, no_v=True,
            seed=402),
]


def variant(name):
    return next(v for v in VARIANTS if v.name == name)


def _weights(v, n_vocab):
    rng = np.random.default_rng(v.seed)
    n_layer = len(v.swa)
    n_kv = n_layer - v.shared

    def mat(n_out, n_in, gain=1.0):
        return (rng.standard_normal((n_out, n_in)) * (gain / math.sqrt(n_in))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    E = v.n_embd
    w = {"token_embd.weight": (rng.standard_normal((n_vocab, E)) / math.sqrt(E)).astype(np.float32)}
    if v.per_layer:
        P = v.per_layer
        w["per_layer_token_embd.weight"] = (rng.standard_normal((n_vocab, P * n_layer)) /
                                            math.sqrt(P)).astype(np.float32)
        w["per_layer_model_proj.weight"] = mat(P * n_layer, E)
        w["per_layer_proj_norm.weight"] = norm(P)
    half = v.head_global // 2
    w["rope_freqs.weight"] = np.array([1.0] * (half - v.rot_unrotated) + [1e30] * v.rot_unrotated,
                                      dtype=np.float32)
    for i in range(n_layer):
        p = f"blk.{i}."
        D = v.head_swa if v.swa[i] else v.head_global
        Hkv = v.kv_swa if v.swa[i] else v.kv_global
        F = v.n_ff * (2 if v.double_wide and i >= n_kv else 1)
        w[p + "attn_norm.weight"] = norm(E)
        w[p + "attn_q.weight"] = mat(v.n_head * D, E)
        if i < n_kv:
            w[p + "attn_k.weight"] = mat(Hkv * D, E)
            if not v.no_v:
                w[p + "attn_v.weight"] = mat(Hkv * D, E)
            w[p + "attn_k_norm.weight"] = norm(D)
        # Unscaled attention over RMS-normed queries and keys gives scores up to the head size;
        # small query norm weights keep the softmax soft, so rounding (F16 caches, quantized
        # weights) moves the logits little and the comparisons stay sharp.
        w[p + "attn_q_norm.weight"] = (0.25 * norm(D)).astype(np.float32)
        w[p + "attn_output.weight"] = mat(E, v.n_head * D)
        w[p + "post_attention_norm.weight"] = norm(E)
        w[p + "ffn_norm.weight"] = norm(E)
        w[p + "ffn_gate.weight"] = mat(F, E)
        w[p + "ffn_up.weight"] = mat(F, E)
        w[p + "ffn_down.weight"] = mat(E, F, gain=2.0)
        w[p + "post_ffw_norm.weight"] = norm(E)
        if v.per_layer:
            w[p + "inp_gate.weight"] = mat(v.per_layer, E)
            w[p + "proj.weight"] = mat(E, v.per_layer)
            w[p + "post_norm.weight"] = norm(E)
        if v.out_scale:
            w[p + "layer_output_scale.weight"] = np.array([rng.uniform(0.6, 1.4)], dtype=np.float32)
    w["output_norm.weight"] = norm(E)
    extra = np.random.default_rng(v.seed + 1000)
    for name, shape in v.extra.items():
        w[name] = (0.1 * extra.standard_normal(shape)).astype(np.float32)
    return w


def write(v, path):
    vocab = mtm.load_vocab("spm512", 0)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][0])
    n_layer = len(v.swa)
    n_kv = n_layer - v.shared
    assert v.malformed or v.shared == 0 or (not v.swa[n_kv - 1] and v.swa[n_kv - 2])
    tmp = path + ".tmp"
    wr = gguf.GGUFWriter(tmp, ARCH)
    k = ARCH
    wr.add_string("general.name", v.name)
    wr.add_uint32("general.file_type", 0)
    wr.add_uint32(f"{k}.context_length", 512)
    wr.add_uint32(f"{k}.embedding_length", v.n_embd)
    wr.add_uint32(f"{k}.block_count", n_layer)
    if v.double_wide:
        wr.add_array(f"{k}.feed_forward_length",
                     [v.n_ff * (2 if i >= n_kv else 1) for i in range(n_layer)])
    else:
        wr.add_uint32(f"{k}.feed_forward_length", v.n_ff)
    wr.add_uint32(f"{k}.attention.head_count", v.n_head)
    if v.kv_swa != v.kv_global:
        wr.add_array(f"{k}.attention.head_count_kv", [v.kv_swa if s else v.kv_global for s in v.swa])
    else:
        wr.add_uint32(f"{k}.attention.head_count_kv", v.kv_swa)
    wr.add_uint32(f"{k}.attention.key_length", v.head_global)
    wr.add_uint32(f"{k}.attention.value_length", v.head_global)
    wr.add_uint32(f"{k}.attention.key_length_swa", v.head_swa)
    wr.add_uint32(f"{k}.attention.value_length_swa", v.head_swa)
    wr.add_float32(f"{k}.attention.layer_norm_rms_epsilon", 1e-6)
    wr.add_uint32(f"{k}.attention.sliding_window", v.window)
    wr.add_array(f"{k}.attention.sliding_window_pattern", [bool(s) for s in v.swa])
    wr.add_uint32(f"{k}.attention.shared_kv_layers", v.shared)
    wr.add_uint32(f"{k}.embedding_length_per_layer_input", v.per_layer)
    wr.add_float32(f"{k}.rope.freq_base", 1000000.0)
    wr.add_float32(f"{k}.rope.freq_base_swa", 10000.0)
    wr.add_uint32(f"{k}.rope.dimension_count", v.head_global)
    wr.add_uint32(f"{k}.rope.dimension_count_swa", v.rot_swa or v.head_swa)
    if v.softcap:
        wr.add_float32(f"{k}.final_logit_softcapping", v.softcap)
    wr.add_uint32(f"{k}.vocab_size", n_vocab)
    for key, val in v.extra_kv.items():
        wr.add_uint32(f"{k}.{key}", val)
    mtm.finish_tiny(wr, tmp, path, vocab, _weights(v, n_vocab))


def reference_logits(path, tokens):
    """Logits (n_tokens, n_vocab), float64, of gemma4 as llama.cpp's src/models/gemma4.cpp builds
    its graph, over the file's weights: embeddings times sqrt(n_embd); per layer RMS-normed q, k
    (weights) and v (none), RoPE (the sliding layers' base and rotated dimensions; the global
    layers' with rope_freqs), attention unscaled, post-norms, GeGLU (tanh GELU), the per-layer
    embedding block and output scale; final norm, tied output, soft-capping."""
    meta, t = mtm.read_gguf(path)
    a = ARCH

    def hp(key, default=None):
        return meta.get(f"{a}.{key}", default)

    toks = np.asarray(tokens)
    n = len(toks)
    n_layer, E = hp("block_count"), hp("embedding_length")
    eps = hp("attention.layer_norm_rms_epsilon")
    is_swa = [bool(x) for x in hp("attention.sliding_window_pattern")]
    window, shared = hp("attention.sliding_window"), hp("attention.shared_kv_layers", 0)
    n_kv = n_layer - shared
    d_full, d_swa = hp("attention.key_length"), hp("attention.key_length_swa")
    rot_full, rot_swa = hp("rope.dimension_count"), hp("rope.dimension_count_swa")
    base, base_swa = hp("rope.freq_base"), hp("rope.freq_base_swa", 10000.0)
    P = hp("embedding_length_per_layer_input", 0)
    softcap = hp("final_logit_softcapping", 30.0)   # llama.cpp's default for gemma4 (0: none)

    def per_layer(key, default=None):
        v = hp(key, default)
        return list(v) if isinstance(v, (list, tuple)) else [v] * n_layer

    n_head = per_layer("attention.head_count")
    n_head_kv = per_layer("attention.head_count_kv", n_head[0])
    pos = np.arange(n, dtype=np.float64)

    def rope(x, b, n_rot, factors):
        r = mtm._rope(x[..., :n_rot], pos, b, factors, True)
        return np.concatenate([r, x[..., n_rot:]], axis=-1)

    def gelu(g):
        return 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))

    def rms0(x):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)

    x = t["token_embd.weight"][toks] * np.float64(np.float32(math.sqrt(E)))
    if P:
        pl = t["per_layer_token_embd.weight"][toks].reshape(n, n_layer, P) * math.sqrt(P)
        proj = (x @ t["per_layer_model_proj.weight"].T / math.sqrt(E)).reshape(n, n_layer, P)
        proj = mtm._rms(proj, t["per_layer_proj_norm.weight"], eps)
        pl_in = (proj + pl) / math.sqrt(2.0)
    causal = np.triu(np.full((n, n), -np.inf), 1)
    local = causal + np.where(pos[:, None] - pos[None, :] >= window, -np.inf, 0.0)
    cache = {}
    for i in range(n_layer):
        p = f"blk.{i}."
        D = d_swa if is_swa[i] else d_full
        H, Hkv = n_head[i], n_head_kv[i]
        b, nr = (base_swa, rot_swa) if is_swa[i] else (base, rot_full)
        factors = None if is_swa[i] else t["rope_freqs.weight"]
        h = mtm._rms(x, t[p + "attn_norm.weight"], eps)
        q = (h @ t[p + "attn_q.weight"].T).reshape(n, H, D)
        q = rope(mtm._rms(q, t[p + "attn_q_norm.weight"], eps), b, nr, factors)
        if i < n_kv:
            k = (h @ t[p + "attn_k.weight"].T).reshape(n, Hkv, D)
            v = k if p + "attn_v.weight" not in t else (h @ t[p + "attn_v.weight"].T).reshape(n, Hkv, D)
            k = rope(mtm._rms(k, t[p + "attn_k_norm.weight"], eps), b, nr, factors)
            v = rms0(v)
            cache[i] = (k, v)
        else:
            k, v = cache[n_kv - (2 if is_swa[i] else 1)]
        mask = local if is_swa[i] else causal
        g = H // Hkv
        out = np.empty((n, H, D))
        for hh in range(H):
            sc = q[:, hh, :] @ k[:, hh // g, :].T + mask
            sc = np.exp(sc - sc.max(-1, keepdims=True))
            sc /= sc.sum(-1, keepdims=True)
            out[:, hh, :] = sc @ v[:, hh // g, :]
        att = out.reshape(n, H * D) @ t[p + "attn_output.weight"].T
        x = x + mtm._rms(att, t[p + "post_attention_norm.weight"], eps)
        h = mtm._rms(x, t[p + "ffn_norm.weight"], eps)
        f = (gelu(h @ t[p + "ffn_gate.weight"].T) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T
        x = x + mtm._rms(f, t[p + "post_ffw_norm.weight"], eps)
        if P:
            e = gelu(x @ t[p + "inp_gate.weight"].T) * pl_in[:, i, :]
            x = x + mtm._rms(e @ t[p + "proj.weight"].T, t[p + "post_norm.weight"], eps)
        if p + "layer_output_scale.weight" in t:
            x = x * t[p + "layer_output_scale.weight"][0]
    h = mtm._rms(x, t["output_norm.weight"], eps)
    logits = h @ t.get("output.weight", t["token_embd.weight"]).T
    if softcap:
        logits = np.tanh(logits / softcap) * softcap
    return logits


SCRIPT_MTIME = max(os.path.getmtime(__file__), mtm.SCRIPT_MTIME)


def ensure(out_dir, variants=VARIANTS):
    """Writes the files that are missing or older than this script; returns {name: path}."""
    return mtm.ensure_variants(out_dir, variants, write, SCRIPT_MTIME)


if __name__ == "__main__":
    for name, path in ensure(sys.argv[1]).items():
        print(name, path)
