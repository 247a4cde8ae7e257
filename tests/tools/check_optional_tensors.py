#!/usr/bin/env python3
"""kiri against llama.cpp (llama-cpp-python) on tiny random models that carry the optional tensors
and keys llama.cpp's graphs use: biases on every projection llama.cpp loads for the
architecture, per-tensor .scale and .input_scale tensors, fused attn_qkv, rope_freqs, phi3's fused
gate-up, partial rotary, LongRoPE (short and long factor sets, attn_factor, original context),
rope.scaling.factor 0 and attention.scale 0; and that files with a tensor the graph would not use
are refused, naming it.

Run by tests/test_optional_tensors.py in make test, and alone:
  check_optional_tensors.py [--keep DIR] [NAME ...]
It needs build/dump_logits. Each model is evaluated over a 40-token prompt, logits at every
position, with an F32 KV cache on both sides; the figure is max |kiri - llama.cpp| /
range(llama.cpp) over positions. F32 weights must agree to 1e-4 (llama.cpp's own distance from
exact arithmetic on such models is below 1e-6), quantized ones to 2e-2.
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import make_tiny_models as mtm  # noqa: E402
import gguf  # noqa: E402

REPO = mtm.REPO
DUMP = os.environ.get("KIRI_DUMP_LOGITS", os.path.join(REPO, "build", "dump_logits"))
TOL = 1e-4


def make(path, arch, *, n_embd=256, n_ff=512, n_layer=2, n_head=4, n_head_kv=2, n_rot=None,
         biases=(), scales=(), input_scales=(), fused_qkv=False, fused_qkv_bias=True,
         rope_freqs=False, longrope=None, output_bias=False, qk_norm=False, extra_keys=(),
         extra_tensors=(), seed=1, tied=False, n_ctx_train=1024, wtype="F32"):
    """Writes a tiny model (2-D weights of type wtype, the rest F32). biases/scales name
    projections: q k v o gate up down.
    longrope: (orig_ctx, long_factors, short_factors, attn_factor) or None."""
    rng = np.random.default_rng(seed)
    vocab = mtm.load_vocab("qwen2", 1000)
    n_vocab = len(vocab["tokenizer.ggml.tokens"][0])
    hd = n_embd // n_head
    n_rot = n_rot or hd
    qd, kvd = n_head * hd, n_head_kv * hd

    def mat(o, i, gain=1.0):
        return (rng.standard_normal((o, i)) * (gain / math.sqrt(i))).astype(np.float32)

    def vec(n, s=0.5):
        return (s * rng.standard_normal(n)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    def one(v):
        return np.array([v], dtype=np.float32)

    w = {"token_embd.weight": rng.standard_normal((n_vocab, n_embd)).astype(np.float32)}
    names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output",
             "gate": "ffn_gate", "up": "ffn_up", "down": "ffn_down"}
    for i in range(n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(n_embd)
        proj = {"q": mat(qd, n_embd), "k": mat(kvd, n_embd), "v": mat(kvd, n_embd),
                "o": mat(n_embd, qd)}
        if arch == "phi3":
            proj["up"] = mat(2 * n_ff, n_embd)          # gate rows, then up rows
        else:
            proj["gate"], proj["up"] = mat(n_ff, n_embd), mat(n_ff, n_embd)
        proj["down"] = mat(n_embd, n_ff, 2.0)
        outs = {k: v.shape[0] for k, v in proj.items()}
        if fused_qkv:
            w[p + "attn_qkv.weight"] = np.concatenate([proj.pop(k) for k in "qkv"])
            if "q" in biases:
                if fused_qkv_bias:
                    w[p + "attn_qkv.bias"] = vec(qd + 2 * kvd)
                else:
                    for k in "qkv":
                        w[p + names[k] + ".bias"] = vec(outs[k])
            if "q" in scales:
                w[p + "attn_qkv.scale"] = one(rng.uniform(0.5, 2.0))
            if "q" in input_scales:
                w[p + "attn_qkv.input_scale"] = one(rng.uniform(0.5, 2.0))
        for k, m in proj.items():
            w[p + names[k] + ".weight"] = m
            if k in biases:
                w[p + names[k] + ".bias"] = vec(outs[k])
            if k in scales:
                w[p + names[k] + ".scale"] = one(rng.uniform(0.5, 2.0))
            if k in input_scales:
                w[p + names[k] + ".input_scale"] = one(rng.uniform(0.5, 2.0))
        if qk_norm:
            w[p + "attn_q_norm.weight"] = norm(hd)
            w[p + "attn_k_norm.weight"] = norm(hd)
        w[p + "ffn_norm.weight"] = norm(n_embd)
    w["output_norm.weight"] = norm(n_embd)
    if tied:
        w["token_embd.weight"] *= np.float32(3.0 / math.sqrt(n_embd))
    else:
        w["output.weight"] = mat(n_vocab, n_embd, 3.0)
    if output_bias:
        w["output.bias"] = vec(n_vocab, 1.0)
    if rope_freqs:
        w["rope_freqs.weight"] = mtm.llama3_rope_factors(n_rot, 10000.0)
    if longrope:
        orig, lf, sf, _ = longrope
        w["rope_factors_long.weight"] = np.asarray(lf, dtype=np.float32)
        w["rope_factors_short.weight"] = np.asarray(sf, dtype=np.float32)
    for name, t in extra_tensors:
        w[name] = t

    wr = gguf.GGUFWriter(path + ".tmp", arch)
    k = arch
    wr.add_uint32(f"{k}.context_length", n_ctx_train)
    wr.add_uint32(f"{k}.embedding_length", n_embd)
    wr.add_uint32(f"{k}.block_count", n_layer)
    wr.add_uint32(f"{k}.feed_forward_length", n_ff)
    wr.add_uint32(f"{k}.attention.head_count", n_head)
    wr.add_uint32(f"{k}.attention.head_count_kv", n_head_kv)
    wr.add_float32(f"{k}.attention.layer_norm_rms_epsilon", 1e-5)
    wr.add_float32(f"{k}.rope.freq_base", 10000.0)
    wr.add_uint32(f"{k}.rope.dimension_count", n_rot)
    if longrope:
        wr.add_uint32(f"{k}.rope.scaling.original_context_length", longrope[0])
        wr.add_float32(f"{k}.rope.scaling.attn_factor", longrope[3])
    for key, kind, val in extra_keys:
        getattr(wr, "add_" + kind)(f"{k}.{key}", val)
    for key, (val, kind) in vocab.items():
        getattr(wr, "add_" + kind)(key, val)
    for name, t in w.items():
        if t.ndim == 2 and wtype != "F32":
            data, raw = mtm.quantize(t, wtype)
            wr.add_tensor(name, data, raw_dtype=raw)
        else:
            wr.add_tensor(name, t)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    os.replace(path + ".tmp", path)


def llama_rows(path, toks, n_ctx):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=64, n_ubatch=64, logits_all=True,
                          n_threads=2, n_threads_batch=2, flash_attn=False, type_k=0, type_v=0,
                          seed=0, verbose=False)
    try:
        llm.eval(list(toks))
        return np.array(llm.scores[: len(toks)], dtype=np.float64)
    finally:
        llm.close()


def kiri_rows(path, toks, n_ctx, chunk=1):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "l.f32")
        cmd = [DUMP, "--kv", "f32", "--n-ctx", str(n_ctx), "--chunk", str(chunk), "--out", out, path]
        r = subprocess.run(cmd + [str(t) for t in toks], capture_output=True, text=True)
        if r.returncode:
            return None, r.stderr.strip()
        n_vocab = json.loads(r.stdout)["n_vocab"]
        return np.fromfile(out, dtype=np.float32).astype(np.float64).reshape(-1, n_vocab), None


def rel(a, b):
    return float((np.abs(a - b).max(1) / (b.max(1) - b.min(1))).max())


def longrope_sets(n_rot, seed):
    rng = np.random.default_rng(seed)
    n = n_rot // 2
    return rng.uniform(1.0, 6.0, n), rng.uniform(1.0, 1.5, n)


def cases():
    """(name, make kwargs, n_ctx values to run, expect: 'match' or a substring of kiri's error)."""
    all7 = ("q", "k", "v", "o", "gate", "up", "down")
    attn4 = ("q", "k", "v", "o")
    lf, sf = longrope_sets(64, 7)
    lf48, sf48 = longrope_sets(48, 8)
    af = math.sqrt(1 + math.log(4.0) / math.log(256))
    yield "llama-all-biases-scales", dict(arch="llama", biases=all7, scales=all7, input_scales=all7,
                                          rope_freqs=True), [128], "match"
    yield "llama-fused-qkv", dict(arch="llama", fused_qkv=True, biases=all7, scales=all7,
                                  input_scales=all7), [128], "match"
    yield "llama-fused-qkv-separate-biases", dict(arch="llama", fused_qkv=True, fused_qkv_bias=False,
                                                  biases=("q", "k", "v")), [128], "match"
    yield "llama-ropescale0-attnscale0", dict(arch="llama", extra_keys=[
        ("rope.scaling.factor", "float32", 0.0), ("attention.scale", "float32", 0.0),
        ("rope.scaling.type", "string", "linear")]), [128], "match"
    yield "llama-linear-rope-2", dict(arch="llama", extra_keys=[
        ("rope.scaling.factor", "float32", 2.0), ("rope.scaling.type", "string", "linear")]), [128], "match"
    yield "qwen2-biases-output-bias-scales", dict(arch="qwen2", biases=("q", "k", "v"), scales=attn4,
                                                  input_scales=all7, output_bias=True), [128], "match"
    yield "qwen2-no-qkv-bias", dict(arch="qwen2"), [128], "match"
    yield "qwen2-tied-output-bias", dict(arch="qwen2", biases=("q", "k", "v"), output_bias=True,
                                         tied=True), [128], "match"
    yield "qwen3-scales-input-scales", dict(arch="qwen3", qk_norm=True, biases=("q", "k", "v"),
                                            scales=all7, input_scales=all7), [128], "match"
    yield "qwen3-fused-qkv", dict(arch="qwen3", qk_norm=True, fused_qkv=True, biases=("q",),
                                  scales=all7), [128], "match"
    yield "phi3-plain", dict(arch="phi3", fused_qkv=True, n_head_kv=4), [128], "match"
    yield "phi3-separate-qkv-gqa", dict(arch="phi3", n_head_kv=2, biases=("q", "k", "v"),
                                        scales=attn4, input_scales=all7), [128], "match"
    yield "phi3-longrope", dict(arch="phi3", fused_qkv=True, scales=("q", "o"),
                                longrope=(256, lf, sf, af), extra_keys=[
                                    ("attention.sliding_window", "uint32", 8)]), [256, 512], "match"
    yield "phi3-longrope-attn-factor-1", dict(arch="phi3", fused_qkv=True, longrope=(256, lf, sf, 1.0)), \
        [256, 512], "match"
    yield "llama-longrope", dict(arch="llama", longrope=(256, lf, sf, 1.0), extra_keys=[
        ("rope.scaling.type", "string", "longrope")]), [256, 512], "match"
    # Views into quantized fused rows (kiri quantizes activations as llama.cpp does; 2e-2 is the
    # budget test_logits allows quantized weights).
    yield "phi3-fused-Q4_K", dict(arch="phi3", fused_qkv=True, biases=("q", "k", "v"), scales=("q", "o"),
                                  wtype="Q4_K"), [128], "match"
    yield "llama-fused-qkv-Q8_0", dict(arch="llama", fused_qkv=True, biases=all7, scales=all7,
                                       wtype="Q8_0"), [128], "match"
    yield "phi3-longrope-partial", dict(arch="phi3", fused_qkv=True, n_rot=48,
                                        longrope=(256, lf48, sf48, af)), [256, 512], "match"
    yield "phi3-partial-no-factors", dict(arch="phi3", fused_qkv=True, n_rot=32), [128], "match"
    # Refusals: tensors the graph does not use, variants kiri does not run.
    yield "llama-extra-tensor", dict(arch="llama", extra_tensors=[
        ("blk.0.extra.weight", np.zeros(64, dtype=np.float32))]), [128], "blk.0.extra.weight"
    yield "qwen2-attn-norm-bias", dict(arch="qwen2", extra_tensors=[
        ("blk.1.attn_norm.bias", np.zeros(256, dtype=np.float32))]), [128], "blk.1.attn_norm.bias"
    yield "llama-qk-norm", dict(arch="llama", qk_norm=True), [128], "blk.0.attn_q_norm.weight"
    yield "phi3-rope-freqs", dict(arch="phi3", fused_qkv=True, rope_freqs=True), [128], "rope_freqs.weight"
    yield "llama-yarn", dict(arch="llama", extra_keys=[("rope.scaling.type", "string", "yarn")]), [128], \
        "rope.scaling.type"
    yield "llama-attn-scale", dict(arch="llama", extra_keys=[("attention.scale", "float32", 0.3)]), [128], \
        "attention.scale"


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("--keep")
    ap.add_argument("names", nargs="*")
    args = ap.parse_args(argv)
    d = args.keep or tempfile.mkdtemp(prefix="kiri-opt-")
    os.makedirs(d, exist_ok=True)
    rng = np.random.default_rng(5)
    toks = [int(x) for x in rng.integers(0, 1003, 40)]
    failed = 0
    for name, kw, ctxs, expect in cases():
        if args.names and not any(n in name for n in args.names):
            continue
        path = os.path.join(d, name + ".gguf")
        make(path, **kw)
        for n_ctx in ctxs:
            K, err = kiri_rows(path, toks, n_ctx)
            if expect != "match":
                ok = err is not None and expect in err
                print(f"{'ok  ' if ok else 'FAIL'} {name}: refused: {err}")
                failed += not ok
                break
            if err:
                print(f"FAIL {name} n_ctx={n_ctx}: kiri: {err}")
                failed += 1
                continue
            L = llama_rows(path, toks, n_ctx)
            e = rel(K, L)
            K7, _ = kiri_rows(path, toks, n_ctx, chunk=7)
            at = list(range(6, len(toks), 7)) + ([len(toks) - 1] if (len(toks) - 1) % 7 != 6 else [])
            e7 = rel(K7, L[at])
            tol = TOL if kw.get("wtype", "F32") == "F32" else 2e-2
            ok = e <= tol and e7 <= tol
            failed += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {name} n_ctx={n_ctx}: kiri vs llama.cpp {e:.2e} "
                  f"(chunks of 7: {e7:.2e}), top1 {float((K.argmax(1) == L.argmax(1)).mean()):.3f}")
    print(f"{failed} failed; models in {d}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
