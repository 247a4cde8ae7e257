"""Tiny random qwen35 (Qwen3.5 dense, text) files for test_qwen35.py, written with the `gguf`
package under the key and tensor names llama.cpp's qwen35 loader reads (src/models/qwen35.cpp,
src/llama-arch.cpp): ssm.{conv_kernel,inner_size,state_size,time_step_rank,group_count},
full_attention_interval (every interval-th layer attends, the others are Gated DeltaNet layers),
rope.dimension_sections, partial rotary (rope.dimension_count below key_length). A linear-attention
layer has attn_qkv (q, k, v of the convolution's channels), attn_gate (z), ssm_conv1d, ssm_dt.bias,
ssm_a (-exp(A_log), as the converter stores it), ssm_beta, ssm_alpha, ssm_norm, ssm_out; a
full-attention layer has attn_q (each head's query then its output gate), attn_k, attn_v, attn_q_norm,
attn_k_norm, attn_output; every layer attn_norm, post_attention_norm and the SwiGLU feed-forward.
A variant with nextn_predict_layers carries one multi-token-prediction block after the trunk
(llama.cpp's load_block_mtp: a gated full-attention block, nextn.eh_proj, nextn.enorm, nextn.hnorm,
and optionally nextn.shared_head_norm, nextn.embed_tokens, nextn.shared_head_head). mtp_copy > 0
makes its drafts often right, so that the speculative tests see drafts kept and rejected: the
trunk's layers add little to the embedding (their outputs scaled by 0.01), so its next token is
mostly a function of the current one through the output head, and the block passes its input
token's normed embedding on (eh_proj) with little of its own (outputs scaled by 0.05) to a head
near the trunk's: it guesses that same function of the token it is given.

    python3 tests/tiny_qwen35.py OUT_DIR     writes every file of VARIANTS into OUT_DIR
"""

import math
import os
import sys
from dataclasses import dataclass, field

import gguf
import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_models as mtm  # noqa: E402

ARCH = "qwen35"


@dataclass
class Variant:
    name: str
    what: str
    n_layer: int = 4
    interval: int = 4          # full_attention_interval
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 32
    n_rot: int = 8
    sections: tuple = (2, 1, 1, 0)
    n_ff: int = 96
    conv: int = 4              # ssm.conv_kernel
    state: int = 16            # ssm.state_size: the key and value head size of the linear layers
    k_heads: int = 2           # ssm.group_count
    v_heads: int = 4           # ssm.time_step_rank (a multiple of k_heads)
    untied: bool = False
    nextn: int = 0             # nextn_predict_layers: MTP blocks after the trunk
    mtp_head_norm: bool = True     # nextn.shared_head_norm (else the head norms with output_norm)
    mtp_own: tuple = ()        # optional MTP tensors: "embed_tokens", "shared_head_head"
    mtp_copy: float = 0.0      # the echo path's gain (0: a random block)
    mtp_block: bool = True     # False: nextn_predict_layers counts a block the file does not carry
    recurrent: tuple = ()      # attention.recurrent_layers (bools) in place of the interval
    seed: int = 700
    wtype: str = "F32"         # the projections' type (norms, the convolution, ssm_a and ssm_dt stay F32)
    base: str = ""             # same weights as this variant, plus extra
    extra: dict = field(default_factory=dict)      # tensors beyond the graph (a refusal case)
    extra_kv: dict = field(default_factory=dict)   # keys beyond the text model's (uint32 values)

    @property
    def path_name(self):
        return f"{self.name}-{self.wtype}.gguf"


VARIANTS = [
    Variant("qwen35-a", "Qwen3.5's layout: 4 layers, Gated DeltaNet on 0-2 (2 key heads, 4 value heads of 16), "
            "full attention on 3 (4 heads, 2 KV heads of 32, 8 rotated dimensions), a kernel of 4, tied embeddings",
            seed=701),
    Variant("qwen35-b", "6 layers, full attention every third (2 and 5), one key head for 3 value heads of 8, "
            "a kernel of 3, 12 rotated dimensions in sections (2, 2, 2), an output matrix of its own, and a "
            "multi-token-prediction block", n_layer=6, interval=3, n_head=2, n_head_kv=1, head_dim=32, n_rot=12,
            sections=(2, 2, 2, 0), conv=3, state=8, k_heads=1, v_heads=3, untied=True, nextn=1, seed=702),
    Variant("qwen35-c", "Qwen3.5's head shapes: value and key heads of 128 (2 key heads, 4 value heads), attention "
            "heads of 256 with 64 rotated dimensions in sections (11, 11, 10), 8 layers, attention on 3 and 7",
            n_layer=8, n_embd=128, n_head=2, n_head_kv=1, head_dim=256, n_rot=64, sections=(11, 11, 10, 0),
            n_ff=160, state=128, k_heads=2, v_heads=4, seed=705),
    Variant("qwen35-d", "5 layers listed by attention.recurrent_layers (Gated DeltaNet on 0, 2 and 3, attention "
            "on 1 and 4) rather than an interval", n_layer=5, recurrent=(True, False, True, True, False), seed=706),
    Variant("qwen35-mtp", "qwen35-a's shapes with a multi-token-prediction block that has its own token "
            "embedding, output head and head norm, its drafts often right", seed=707, nextn=1, untied=True,
            mtp_own=("embed_tokens", "shared_head_head"), mtp_copy=30.0),
    Variant("qwen35-mtp-bare", "qwen35-d's layout with a multi-token-prediction block of the required tensors "
            "only (the trunk's embedding, output norm and output), its drafts often right", n_layer=5,
            recurrent=(True, False, True, True, False), seed=708, nextn=1, untied=True, mtp_head_norm=False,
            mtp_copy=30.0),
    Variant("qwen35-nextn-gone", "qwen35-a's weights and a nextn_predict_layers of 1 without the block (a file "
            "converted without it): the trunk runs, no head", seed=701, base="qwen35-a", nextn=1, mtp_block=False),
    Variant("qwen35-q8", "qwen35-a's weights with every projection and the embedding in Q8_0", seed=701,
            wtype="Q8_0"),
    # Refusals.
    Variant("qwen35-moe", "qwen35-a with expert_count 4 (qwen35moe's key)", seed=701, base="qwen35-a",
            extra_kv={"expert_count": 4}),
    Variant("qwen35-sections", "qwen35-a whose sections (1, 1, 0, 2) leave rotated pairs to the fourth "
            "(extra) position, which text tokens hold at 0", seed=701, base="qwen35-a", sections=(1, 1, 0, 2)),
    Variant("qwen35-extra", "qwen35-a with a tensor no qwen35 graph reads", seed=701, base="qwen35-a",
            extra={"blk.0.ssm_extra.weight": (8, 64)}),
    Variant("qwen35-vision", "qwen35-a with a vision tower's and its projector's tensors (left unused)", seed=701,
            base="qwen35-a", extra={"v.patch_embd.weight": (32, 48), "v.blk.0.attn_qkv.weight": (96, 32),
                                    "mm.0.weight": (64, 32)}),
    Variant("qwen35-heads", "3 key heads for 4 value heads (not a multiple)", k_heads=3, seed=703),
    Variant("qwen35-taps", "a convolution of one tap", conv=1, seed=704),
    Variant("qwen35-nextn", "qwen35-a whose nextn_predict_layers counts every block", seed=701, base="qwen35-a",
            extra_kv={"nextn_predict_layers": 4}),
]


def variant(name):
    return next(v for v in VARIANTS if v.name == name)


def is_recurrent(v, i):
    if v.recurrent:
        return i < v.n_layer and v.recurrent[i]
    return i < v.n_layer and (i + 1) % v.interval != 0


def _weights(v, n_vocab):
    rng = np.random.default_rng(v.seed)

    def mat(n_out, n_in, gain=1.0):
        return (rng.standard_normal((n_out, n_in)) * (gain / math.sqrt(n_in))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    E, H, Hkv, D = v.n_embd, v.n_head, v.n_head_kv, v.head_dim
    S, Hk, Hv = v.state, v.k_heads, v.v_heads
    C = 2 * Hk * S + Hv * S
    w = {"token_embd.weight": (rng.standard_normal((n_vocab, E)) / math.sqrt(E)).astype(np.float32)}

    def attention(p):
        w[p + "attn_q.weight"] = mat(2 * H * D, E)
        w[p + "attn_k.weight"] = mat(Hkv * D, E)
        w[p + "attn_v.weight"] = mat(Hkv * D, E)
        w[p + "attn_q_norm.weight"] = norm(D)
        w[p + "attn_k_norm.weight"] = norm(D)
        w[p + "attn_output.weight"] = mat(E, H * D)

    def ffn(p):
        w[p + "ffn_gate.weight"] = mat(v.n_ff, E)
        w[p + "ffn_up.weight"] = mat(v.n_ff, E)
        w[p + "ffn_down.weight"] = mat(E, v.n_ff, gain=2.0)

    for i in range(v.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(E)
        if is_recurrent(v, i):
            w[p + "attn_qkv.weight"] = mat(C, E, gain=2.0)
            w[p + "attn_gate.weight"] = mat(Hv * S, E)
            # numpy (C, K): ne = [K, C], each channel's taps oldest input first.
            w[p + "ssm_conv1d.weight"] = (rng.standard_normal((C, v.conv)) / math.sqrt(v.conv)).astype(np.float32)
            w[p + "ssm_dt.bias"] = (0.5 * rng.standard_normal(Hv)).astype(np.float32)
            w[p + "ssm_a"] = (-np.exp(0.5 * rng.standard_normal(Hv))).astype(np.float32)
            w[p + "ssm_beta.weight"] = mat(Hv, E, gain=2.0)
            w[p + "ssm_alpha.weight"] = mat(Hv, E, gain=2.0)
            w[p + "ssm_norm.weight"] = norm(S)
            w[p + "ssm_out.weight"] = mat(E, Hv * S)
        else:
            attention(p)
        w[p + "post_attention_norm.weight"] = norm(E)
        ffn(p)
    for i in range(v.n_layer, v.n_layer + (v.nextn if v.mtp_block else 0)):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(E)
        attention(p)
        w[p + "post_attention_norm.weight"] = norm(E)
        ffn(p)
        w[p + "nextn.eh_proj.weight"] = mat(E, 2 * E)
        w[p + "nextn.enorm.weight"] = norm(E)
        w[p + "nextn.hnorm.weight"] = norm(E)
        if v.mtp_head_norm:
            w[p + "nextn.shared_head_norm.weight"] = norm(E)
    w["output_norm.weight"] = norm(E)
    if v.untied:
        w["output.weight"] = mat(n_vocab, E, gain=3.0)
    for i in range(v.n_layer, v.n_layer + (v.nextn if v.mtp_block else 0)):
        p = f"blk.{i}."
        embed = w["token_embd.weight"]
        head = w.get("output.weight", embed)
        if "embed_tokens" in v.mtp_own:
            noise = rng.standard_normal((n_vocab, E)) / math.sqrt(E)
            w[p + "nextn.embed_tokens.weight"] = (embed + 0.05 * noise if v.mtp_copy else noise).astype(np.float32)
        if "shared_head_head" in v.mtp_own:
            noise = mat(n_vocab, E, gain=3.0)
            w[p + "nextn.shared_head_head.weight"] = (head + 0.1 * noise if v.mtp_copy else noise).astype(np.float32)
        if v.mtp_copy:
            w[p + "nextn.eh_proj.weight"][:, :E] += v.mtp_copy * np.eye(E, dtype=np.float32)
            w[p + "attn_output.weight"] *= 0.05
            w[p + "ffn_down.weight"] *= 0.05
            for j in range(v.n_layer):
                for name in ("attn_output", "ssm_out", "ffn_down"):
                    if f"blk.{j}.{name}.weight" in w:
                        w[f"blk.{j}.{name}.weight"] *= 0.01
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
    wr.add_uint32(f"{k}.block_count", v.n_layer + v.nextn)
    wr.add_uint32(f"{k}.feed_forward_length", v.n_ff)
    wr.add_uint32(f"{k}.attention.head_count", v.n_head)
    wr.add_uint32(f"{k}.attention.head_count_kv", v.n_head_kv)
    wr.add_uint32(f"{k}.attention.key_length", v.head_dim)
    wr.add_uint32(f"{k}.attention.value_length", v.head_dim)
    wr.add_float32(f"{k}.attention.layer_norm_rms_epsilon", 1e-6)
    wr.add_float32(f"{k}.rope.freq_base", 10000000.0)
    wr.add_uint32(f"{k}.rope.dimension_count", v.n_rot)
    wr.add_array(f"{k}.rope.dimension_sections", list(v.sections))
    wr.add_uint32(f"{k}.ssm.conv_kernel", v.conv)
    wr.add_uint32(f"{k}.ssm.inner_size", v.v_heads * v.state)
    wr.add_uint32(f"{k}.ssm.state_size", v.state)
    wr.add_uint32(f"{k}.ssm.time_step_rank", v.v_heads)
    wr.add_uint32(f"{k}.ssm.group_count", v.k_heads)
    if v.recurrent:
        # One flag per block, the MTP blocks' (attention) included, as llama.cpp reads them.
        wr.add_array(f"{k}.attention.recurrent_layers", [bool(x) for x in v.recurrent] + [False] * v.nextn)
    else:
        wr.add_uint32(f"{k}.full_attention_interval", v.interval)
    if v.nextn:
        wr.add_uint32(f"{k}.nextn_predict_layers", v.nextn)
    wr.add_uint32(f"{k}.vocab_size", n_vocab)
    for key, val in v.extra_kv.items():
        wr.add_uint32(f"{k}.{key}", val)
    mtm.finish_tiny(wr, tmp, path, vocab, mtm.tiny_typed(_weights(v, n_vocab), v.wtype, "ssm_conv1d"))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _rope_text(x, pos, base, n_rot, sections):
    """llama.cpp's interleaved multi-section RoPE (imrope) at text positions: the first three
    sections' positions are the token's and the fourth's is 0. Pair i of the first n_rot dimensions
    (NEOX halves: i and i + n_rot/2) turns by position * base^(-2i/n_rot) when its sector
    (i mod the sections' sum) falls to one of the first three sections in the interleaved order,
    by 0 otherwise; the dimensions past n_rot are left alone."""
    s0, s1, s2, s3 = sections
    total = s0 + s1 + s2 + s3
    half = n_rot // 2
    i = np.arange(half)
    sector = i % total
    moves = (((sector % 3 == 0) & (sector < 3 * s0)) | ((sector % 3 == 1) & (sector < 3 * s1)) |
             ((sector % 3 == 2) & (sector < 3 * s2)))
    inv = base ** (-2.0 * i / n_rot) * moves
    ang = pos[:, None] * inv[None, :]
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_rot]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c, x[..., n_rot:]], axis=-1)


def _gated_attention(meta, t, p, h):
    """A full-attention layer's output (before the residual) for the normed input h (n, E) at
    positions 0..n-1: each head's query and output gate from attn_q, RMS-normed q and k, the
    text-position RoPE on the first n_rot dimensions, causal attention at 1/sqrt(head size), the
    output times sigmoid(gate), attn_output."""
    def hp(key):
        return meta[f"{ARCH}.{key}"]

    n = h.shape[0]
    H, Hkv, D = hp("attention.head_count"), hp("attention.head_count_kv"), hp("attention.key_length")
    eps, base, n_rot = hp("attention.layer_norm_rms_epsilon"), hp("rope.freq_base"), hp("rope.dimension_count")
    sections = list(hp("rope.dimension_sections"))
    pos = np.arange(n, dtype=np.float64)
    causal = np.triu(np.full((n, n), -np.inf), 1)
    qg = (h @ t[p + "attn_q.weight"].T).reshape(n, H, 2 * D)
    q, gate = qg[..., :D], qg[..., D:]
    q = mtm._rms(q, t[p + "attn_q_norm.weight"], eps)
    k = mtm._rms((h @ t[p + "attn_k.weight"].T).reshape(n, Hkv, D), t[p + "attn_k_norm.weight"], eps)
    v = (h @ t[p + "attn_v.weight"].T).reshape(n, Hkv, D)
    q, k = _rope_text(q, pos, base, n_rot, sections), _rope_text(k, pos, base, n_rot, sections)
    g = H // Hkv
    att = np.empty((n, H, D))
    for hh in range(H):
        sc = q[:, hh, :] @ k[:, hh // g, :].T / math.sqrt(D) + causal
        sc = np.exp(sc - sc.max(-1, keepdims=True))
        sc /= sc.sum(-1, keepdims=True)
        att[:, hh, :] = sc @ v[:, hh // g, :]
    att = att * _sigmoid(gate)
    return att.reshape(n, H * D) @ t[p + "attn_output.weight"].T


def _ffn_block(meta, t, p, x):
    """x plus the SwiGLU feed-forward of post_attention_norm(x)."""
    h = mtm._rms(x, t[p + "post_attention_norm.weight"], meta[f"{ARCH}.attention.layer_norm_rms_epsilon"])
    gt = h @ t[p + "ffn_gate.weight"].T
    return x + (gt * _sigmoid(gt) * (h @ t[p + "ffn_up.weight"].T)) @ t[p + "ffn_down.weight"].T


def reference_logits(path, tokens, return_hidden=False):
    """Logits (n_tokens, n_vocab), float64, of qwen35 as llama.cpp's src/models/qwen35.cpp and
    delta-net-base.cpp build the graph, over the file's weights. Per layer an RMS norm, then either
    Gated DeltaNet: qkv = attn_qkv h through a causal depthwise convolution (zeros before the first
    token) and SiLU; q and k L2-normed (x / sqrt(sum x^2 + eps)); value head j reads key head
    j mod n_k_heads; beta = sigmoid(ssm_beta h), decay = exp(softplus(ssm_alpha h + dt) * ssm_a);
    per token S = decay S, S += k (beta (v - S^T k))^T, out = S^T q / sqrt(head size); the out RMS
    norm per head with ssm_norm times silu(attn_gate h); ssm_out. Or attention: each head's query
    and gate from attn_q, RMS-normed q and k, the text-position RoPE on the first n_rot dimensions,
    scale 1/sqrt(head size), the output times sigmoid(gate), attn_output. Then the residual,
    post_attention_norm, the SwiGLU feed-forward, the residual; output_norm; the output. The
    recurrent layers are those attention.recurrent_layers marks, else all but every
    full_attention_interval-th. With return_hidden, also the output-normed hidden states (the MTP
    block's input)."""
    meta, t = mtm.read_gguf(path)
    a = ARCH

    def hp(key, default=None):
        return meta.get(f"{a}.{key}", default)

    toks = np.asarray(tokens)
    n = len(toks)
    eps = hp("attention.layer_norm_rms_epsilon")
    K, S, Hk, Hv = hp("ssm.conv_kernel"), hp("ssm.state_size"), hp("ssm.group_count"), hp("ssm.time_step_rank")
    interval = hp("full_attention_interval", 4)
    listed = meta.get(f"{a}.attention.recurrent_layers")
    n_layer = hp("block_count") - hp("nextn_predict_layers", 0)
    x = t["token_embd.weight"][toks]
    for i in range(n_layer):
        p = f"blk.{i}."
        h = mtm._rms(x, t[p + "attn_norm.weight"], eps)
        if (listed[i] if listed is not None else (i + 1) % interval != 0):
            qkv = h @ t[p + "attn_qkv.weight"].T                      # (n, C)
            C = qkv.shape[1]
            u = np.concatenate([np.zeros((K - 1, C)), qkv])
            w = t[p + "ssm_conv1d.weight"]                            # (C, K)
            y = sum(u[k:k + n] * w[:, k] for k in range(K))
            y = y * _sigmoid(y)
            q = y[:, :Hk * S].reshape(n, Hk, S)
            k = y[:, Hk * S:2 * Hk * S].reshape(n, Hk, S)
            v = y[:, 2 * Hk * S:].reshape(n, Hv, S)
            q = q / np.sqrt((q * q).sum(-1, keepdims=True) + eps)
            k = k / np.sqrt((k * k).sum(-1, keepdims=True) + eps)
            beta = _sigmoid(h @ t[p + "ssm_beta.weight"].T)            # (n, Hv)
            alpha = h @ t[p + "ssm_alpha.weight"].T + t[p + "ssm_dt.bias"]
            decay = np.exp(np.logaddexp(0.0, alpha) * t[p + "ssm_a"])
            out = np.empty((n, Hv, S))
            for j in range(Hv):
                st = np.zeros((S, S))                                 # st[key dim][value dim]
                kj = j % Hk
                for tt in range(n):
                    st = st * decay[tt, j]
                    d = (v[tt, j] - st.T @ k[tt, kj]) * beta[tt, j]
                    st = st + np.outer(k[tt, kj], d)
                    out[tt, j] = st.T @ q[tt, kj] / math.sqrt(S)
            z = (h @ t[p + "attn_gate.weight"].T).reshape(n, Hv, S)
            o = mtm._rms(out, t[p + "ssm_norm.weight"], eps) * (z * _sigmoid(z))
            out = o.reshape(n, Hv * S) @ t[p + "ssm_out.weight"].T
        else:
            out = _gated_attention(meta, t, p, h)
        x = _ffn_block(meta, t, p, x + out)
    h = mtm._rms(x, t["output_norm.weight"], eps)
    if return_hidden:
        return h @ t.get("output.weight", t["token_embd.weight"]).T, h
    return h @ t.get("output.weight", t["token_embd.weight"]).T


def reference_mtp(path, tokens, hidden):
    """The multi-token-prediction block as llama.cpp's graph_mtp (src/models/qwen35.cpp) builds it,
    float64 over the file's weights, at positions 0..n-1: token i (its row of nextn.embed_tokens,
    else token_embd) with hidden[i], the hidden state before it (the trunk's output-normed state of
    position i - 1, zeros at 0, or the block's own when chained); x = eh_proj [rms(e) enorm;
    rms(h) hnorm]; then the gated full-attention block (q/k norms, the text-position RoPE, causal
    attention over its own keys, the output times sigmoid(gate)), the residual, post_attention_norm,
    the SwiGLU feed-forward, the residual; then nextn.shared_head_norm (else output_norm): the
    block's hidden state; then nextn.shared_head_head (else output, else token_embd). Returns
    (logits (n, n_vocab), that hidden state (n, n_embd))."""
    meta, t = mtm.read_gguf(path)
    a = ARCH

    def hp(key, default=None):
        return meta.get(f"{a}.{key}", default)

    toks = np.asarray(tokens)
    eps = hp("attention.layer_norm_rms_epsilon")
    p = f"blk.{hp('block_count') - hp('nextn_predict_layers')}."
    e = t.get(p + "nextn.embed_tokens.weight", t["token_embd.weight"])[toks]
    x = np.concatenate([mtm._rms(e, t[p + "nextn.enorm.weight"], eps),
                        mtm._rms(np.asarray(hidden, dtype=np.float64), t[p + "nextn.hnorm.weight"], eps)], axis=-1)
    x = x @ t[p + "nextn.eh_proj.weight"].T
    x = _ffn_block(meta, t, p, x + _gated_attention(meta, t, p, mtm._rms(x, t[p + "attn_norm.weight"], eps)))
    hn = mtm._rms(x, t.get(p + "nextn.shared_head_norm.weight", t["output_norm.weight"]), eps)
    head = t.get(p + "nextn.shared_head_head.weight", t.get("output.weight", t["token_embd.weight"]))
    return hn @ head.T, hn


SCRIPT_MTIME = max(os.path.getmtime(__file__), mtm.SCRIPT_MTIME)


def ensure(out_dir, variants=VARIANTS):
    """Writes the files that are missing or older than this script; returns {name: path}."""
    return mtm.ensure_variants(out_dir, variants, write, SCRIPT_MTIME)


if __name__ == "__main__":
    for name, path in ensure(sys.argv[1]).items():
        print(name, path)
