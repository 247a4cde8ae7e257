#!/usr/bin/env python3
"""A developer's check of the gemma3, smollm3 and granite graphs against llama.cpp: writes tiny
random models of each (and variants: sliding-window patterns, RoPE bases, soft-capping, the
granite multipliers), evaluates a prompt longer than the sliding window in llama.cpp
(llama-cpp-python, logits for every position) and in kiri (build/dump_logits) one token per call
and in chunks, and prints max_v |kiri - llama.cpp| / (logit range) per model and mode. For gemma3 with an F32
cache it also prints both runtimes' distance from a float64 forward pass written here from the
family's definition (llama.cpp's GELU goes through an F16 table, which is most of its 1e-4).

Not a test of the suite (tests/ has the permanent family tests); run it by hand:
  ~/.cache/kiri/venv/bin/python tests/tools/check_families.py [--kv f32|f16] [NAME ...]
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

import gguf

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "tests"))
import make_tiny_models as mtm  # noqa: E402

DUMP = os.environ.get("KIRI_DUMP_LOGITS", os.path.join(REPO, "build", "dump_logits"))
N_CTX = 128


def variants():
    """(name, arch, options) of every model this script checks."""
    g = dict(n_embd=256, n_ff=512, n_head=2, n_head_kv=1, head_dim=256, eps=1e-6, base=1e6)
    return [
        ("gemma3-default", "gemma3", dict(g, n_layer=7, window=8)),                  # pattern 6
        ("gemma3-p3-swabase", "gemma3", dict(g, n_layer=6, window=8, pattern=3, base_swa=5000.0,
                                              softcap=6.0)),
        ("gemma3-array", "gemma3", dict(g, n_layer=4, window=5, pattern_arr=[True, False, True, True],
                                        rope_linear=4.0)),
        ("gemma3-noswa", "gemma3", dict(g, n_layer=3, softcap=8.0)),
        ("gemma3-p0", "gemma3", dict(g, n_layer=2, window=6, pattern=0, n_head=4, n_head_kv=2,
                                     head_dim=64)),
        ("smollm3", "smollm3", dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, eps=1e-6,
                                    base=5e6, n_layer=8, untied=True)),
        ("granite", "granite", dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64, eps=1e-6,
                                    base=1e4, n_layer=3, logit_scale=2.5, embedding_scale=3.0,
                                    residual_scale=0.5, attention_scale=0.05, untied=True)),
        ("granite-min", "granite", dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=4, head_dim=64,
                                        eps=1e-5, base=1e4, n_layer=2, logit_scale=0.5,
                                        residual_scale=0.0, attention_scale=0.0)),
        ("granite-norope", "granite", dict(n_embd=256, n_ff=512, n_head=4, n_head_kv=2, head_dim=64,
                                           eps=1e-5, base=1e4, n_layer=2, logit_scale=1.5,
                                           finetuned=False)),
    ]


def write(path, name, arch, o, seed):
    rng = np.random.default_rng(seed)
    vocab = mtm.load_vocab("spm512", 0)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][0])
    E, F, L = o["n_embd"], o["n_ff"], o["n_layer"]
    H, Hkv, D = o["n_head"], o["n_head_kv"], o["head_dim"]

    def mat(n_out, n_in, gain=1.0):
        return (rng.standard_normal((n_out, n_in)) * (gain / math.sqrt(n_in))).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": rng.standard_normal((n_vocab, E)).astype(np.float32)}
    if not o.get("untied"):
        w["token_embd.weight"] *= np.float32(3.0 / math.sqrt(E))
    for i in range(L):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(E)
        w[p + "attn_q.weight"] = mat(H * D, E)
        w[p + "attn_k.weight"] = mat(Hkv * D, E)
        w[p + "attn_v.weight"] = mat(Hkv * D, E)
        w[p + "attn_output.weight"] = mat(E, H * D)
        w[p + "ffn_norm.weight"] = norm(E)
        w[p + "ffn_gate.weight"] = mat(F, E)
        w[p + "ffn_up.weight"] = mat(F, E)
        w[p + "ffn_down.weight"] = mat(E, F, gain=2.0)
        if arch == "gemma3":
            w[p + "attn_q_norm.weight"] = norm(D)
            w[p + "attn_k_norm.weight"] = norm(D)
            w[p + "post_attention_norm.weight"] = norm(E)
            w[p + "post_ffw_norm.weight"] = norm(E)
    w["output_norm.weight"] = norm(E)
    if o.get("untied"):
        w["output.weight"] = mat(n_vocab, E, gain=3.0)

    wr = gguf.GGUFWriter(path, arch)
    wr.add_string("general.name", name)
    wr.add_uint32("general.file_type", 0)
    wr.add_uint32(f"{arch}.context_length", 512)
    wr.add_uint32(f"{arch}.embedding_length", E)
    wr.add_uint32(f"{arch}.block_count", L)
    wr.add_uint32(f"{arch}.feed_forward_length", F)
    wr.add_uint32(f"{arch}.attention.head_count", H)
    wr.add_uint32(f"{arch}.attention.head_count_kv", Hkv)
    wr.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", o["eps"])
    wr.add_float32(f"{arch}.rope.freq_base", o["base"])
    if H * D != E:
        wr.add_uint32(f"{arch}.attention.key_length", D)
        wr.add_uint32(f"{arch}.attention.value_length", D)
    if "window" in o:
        wr.add_uint32(f"{arch}.attention.sliding_window", o["window"])
    if "pattern" in o:
        wr.add_uint32(f"{arch}.attention.sliding_window_pattern", o["pattern"])
    if "pattern_arr" in o:
        wr.add_array(f"{arch}.attention.sliding_window_pattern", o["pattern_arr"])
    if "base_swa" in o:
        wr.add_float32(f"{arch}.rope.freq_base_swa", o["base_swa"])
    if "softcap" in o:
        wr.add_float32(f"{arch}.final_logit_softcapping", o["softcap"])
    if "rope_linear" in o:
        wr.add_string(f"{arch}.rope.scaling.type", "linear")
        wr.add_float32(f"{arch}.rope.scaling.factor", o["rope_linear"])
    for k in ("logit_scale", "embedding_scale", "residual_scale"):
        if k in o:
            wr.add_float32(f"{arch}.{k}", o[k])
    if "attention_scale" in o:
        wr.add_float32(f"{arch}.attention.scale", o["attention_scale"])
    if "finetuned" in o:
        wr.add_bool(f"{arch}.rope.scaling.finetuned", o["finetuned"])
    wr.add_uint32(f"{arch}.vocab_size", n_vocab)
    for key, (val, kind) in vocab.items():
        getattr(wr, "add_" + kind)(key, val)
    for tname, t in w.items():
        wr.add_tensor(tname, t)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()


def rms(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def gemma3_ref(path, tokens):
    """Gemma 3's logits (n_tokens, n_vocab) in float64, from its definition: embeddings times
    sqrt(n_embd), per-head q/k norms, RoPE at the local or global base, a causal mask that also
    hides keys window or more positions back on sliding layers, post-norms, tanh-GELU GeGLU, the
    optional soft-cap."""
    meta, t = mtm.read_gguf(path)

    def hp(key, default=None):
        return meta.get(f"gemma3.{key}", default)

    H, Hkv = hp("attention.head_count"), hp("attention.head_count_kv")
    E, L = hp("embedding_length"), hp("block_count")
    D, eps = hp("attention.key_length", E // H), hp("attention.layer_norm_rms_epsilon")
    window, pattern = hp("attention.sliding_window", 0), hp("attention.sliding_window_pattern", 6)
    if not window:
        swa = [False] * L
    elif isinstance(pattern, list):
        swa = [bool(x) for x in pattern]
    else:
        swa = [pattern == 0 or i % pattern < pattern - 1 for i in range(L)]
    base, base_swa = hp("rope.freq_base"), hp("rope.freq_base_swa", 10000.0)
    scale, cap = 1.0 / hp("rope.scaling.factor", 1.0), hp("final_logit_softcapping", 0.0)
    toks = np.asarray(tokens)
    n = len(toks)
    pos = np.arange(n, dtype=np.float64)
    i_q, i_k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    x = t["token_embd.weight"][toks] * math.sqrt(E)
    for i in range(L):
        p = f"blk.{i}."
        h = rms(x, t[p + "attn_norm.weight"], eps)
        q = rms((h @ t[p + "attn_q.weight"].T).reshape(n, H, D), t[p + "attn_q_norm.weight"], eps)
        k = rms((h @ t[p + "attn_k.weight"].T).reshape(n, Hkv, D), t[p + "attn_k_norm.weight"], eps)
        v = (h @ t[p + "attn_v.weight"].T).reshape(n, Hkv, D)
        b, sc = (base_swa, 1.0) if swa[i] else (base, scale)
        q, k = mtm._rope(q, pos * sc, b, None, True), mtm._rope(k, pos * sc, b, None, True)
        hidden = (i_k > i_q) | ((i_q - i_k >= window) if swa[i] else False)
        mask = np.where(hidden, -np.inf, 0.0)
        out = np.empty((n, H, D))
        for hh in range(H):
            s = q[:, hh] @ k[:, hh * Hkv // H].T / math.sqrt(D) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            out[:, hh] = (s / s.sum(-1, keepdims=True)) @ v[:, hh * Hkv // H]
        x = x + rms(out.reshape(n, H * D) @ t[p + "attn_output.weight"].T, t[p + "post_attention_norm.weight"], eps)
        h = rms(x, t[p + "ffn_norm.weight"], eps)
        gate, up = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
        gelu = 0.5 * gate * (1 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate ** 3)))
        x = x + rms((gelu * up) @ t[p + "ffn_down.weight"].T, t[p + "post_ffw_norm.weight"], eps)
    logits = rms(x, t["output_norm.weight"], eps) @ t.get("output.weight", t["token_embd.weight"]).T
    return cap * np.tanh(logits / cap) if cap else logits


def llama_logits(path, tokens, kv):
    import llama_cpp
    t = 0 if kv == "f32" else 1
    llm = llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, logits_all=True,
                          n_threads=2, n_threads_batch=2, flash_attn=False, type_k=t, type_v=t, seed=0,
                          verbose=False)
    try:
        llm.eval(list(tokens))
        return np.array(llm.scores[: len(tokens)], dtype=np.float64)
    finally:
        llm.close()


def kiri_rows(path, tokens, kv, chunk):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.f32")
        cmd = [DUMP, "--kv", kv, "--n-ctx", str(N_CTX), "--out", out, "--chunk", str(chunk), path]
        r = subprocess.run(cmd + [str(t) for t in tokens], capture_output=True, text=True)
        if r.returncode:
            raise RuntimeError(r.stderr.strip())
        info = json.loads(r.stdout)
        return np.fromfile(out, dtype=np.float32).reshape(info["rows"], info["n_vocab"])


def rel_err(a, b):
    return np.abs(a - b).max(-1) / (b.max(-1) - b.min(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kv", default="f32")
    ap.add_argument("--n", type=int, default=40, help="prompt length")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args()
    rng = np.random.default_rng(7)
    tokens = [1] + [int(x) for x in rng.integers(3, 512, args.n - 1)]
    worst = 0.0
    with tempfile.TemporaryDirectory() as d:
        for i, (name, arch, o) in enumerate(variants()):
            if args.names and not any(n in name for n in args.names):
                continue
            path = os.path.join(d, name + ".gguf")
            write(path, name, arch, o, 1000 + i)
            ref = llama_logits(path, tokens, args.kv)
            line = f"{name:20s} kv {args.kv}"
            for chunk in (1, 7, len(tokens)):
                try:
                    k = kiri_rows(path, tokens, args.kv, chunk)
                except RuntimeError as e:
                    line += f"  chunk {chunk}: FAILED {e}"
                    continue
                rows = [min(c + chunk, len(tokens)) - 1 for c in range(0, len(tokens), chunk)]
                e = rel_err(k.astype(np.float64), ref[rows])
                worst = max(worst, float(e.max()))
                line += f"  chunk {chunk:2d}: max {e.max():.2e}"
                w = o.get("window", 0)
                if chunk == 1 and 0 < w < len(tokens):
                    line += f" (before the window's edge {e[:w].max():.2e})"
            if arch == "gemma3" and args.kv == "f32":
                ex = gemma3_ref(path, tokens)
                k = kiri_rows(path, tokens, args.kv, 1).astype(np.float64)
                line += f"  | float64 reference: kiri {rel_err(k, ex).max():.2e}, llama.cpp {rel_err(ref, ex).max():.2e}"
            print(line, flush=True)
    print(f"worst {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
