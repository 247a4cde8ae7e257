#!/usr/bin/env python3
"""The llama.cpp side of bench_grammar.py: grammar-constrained generation through llama-cpp-python's
low-level API (the C functions, no high-level Llama object), printing one JSON line. llama.cpp's
own tools cannot measure this (llama-bench has no grammar option), which is why a Python wrapper
remains here; bench_cpu.py and bench_serve.py compare with llama-bench, llama-completion and
llama-server instead.

  gen MODEL -t T --prompt TEXT -n N --temp X --seed S [--grammar FILE]
      What `kiri run -p TEXT -n N --temp X --seed S [--grammar FILE]` does: evaluate the prompt,
      then up to N steps of sample-and-decode with top-k 40, top-p 0.95, min-p 0.05 and the
      temperature (greedy at 0), stopping at an end-of-generation token. With a grammar it samples
      the way llama.cpp's own tools do (common_sampler): draw without the grammar, check the drawn
      token against it, and only when it is rejected apply the grammar to the whole vocabulary and
      draw again. Prints the decode-loop seconds, the tokens and the text.

Weights are memory-mapped (use_mmap, llama.cpp's default). Threads: n_threads = n_threads_batch
= T. Everything else is llama.cpp's default (F16 KV cache, flash attention on auto, its CPU weight
repacking).
"""

import argparse
import ctypes
import json
import sys
import time

import llama_cpp as L
import numpy as np


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet(level, text, user):
    if level >= 4:  # GGML_LOG_LEVEL_ERROR
        sys.stderr.write(text.decode(errors="replace"))


def load(path, threads, n_ctx, verbose):
    if not verbose:
        L.llama_log_set(_quiet, None)
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.use_mmap = True
    t0 = time.perf_counter()
    model = L.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise SystemExit(f"llama.cpp cannot load {path}")
    cp = L.llama_context_default_params()
    cp.n_ctx = n_ctx
    cp.n_batch = 512
    cp.n_ubatch = 512
    cp.n_seq_max = 1
    cp.n_threads = threads
    cp.n_threads_batch = threads
    cp.no_perf = True
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama_init_from_model failed")
    return model, ctx, time.perf_counter() - t0


def free_chain(a):
    """The sampler chain without the grammar: kiri run's default filters, then the draw."""
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    if a.temp <= 0:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        return chain
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(40))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(0.95, 1))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(0.05, 1))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(a.temp))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(a.seed))
    return chain


def cmd_gen(a):
    model, ctx, _ = load(a.model, a.threads, a.ctx, a.verbose)
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    text = a.prompt.encode()
    ids = (L.llama_token * (len(text) + 8))()
    n = L.llama_tokenize(vocab, text, len(text), ids, len(ids), True, False)
    if n <= 0:
        raise SystemExit("tokenize failed")
    chain = free_chain(a)
    grammar = None
    if a.grammar:
        with open(a.grammar, "rb") as f:
            grammar = L.llama_sampler_init_grammar(vocab, f.read(), b"root")
        if not grammar:
            raise SystemExit(f"llama.cpp refuses the grammar {a.grammar}")
    one = (L.llama_token_data * 1)()
    one_arr = L.llama_token_data_array(one, 1, -1, False)
    full = np.zeros(n_vocab, dtype=np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)]))
    all_ids = np.arange(n_vocab, dtype=np.int32)
    full_arr = L.llama_token_data_array(full.ctypes.data_as(ctypes.POINTER(L.llama_token_data)),
                                        n_vocab, -1, False)
    if L.llama_decode(ctx, L.llama_batch_get_one(ids, n)) != 0:
        raise SystemExit("prefill failed")
    out = []
    rejected = 0
    tok = (L.llama_token * 1)()
    t0 = time.perf_counter()
    for _ in range(a.n_gen):
        t = L.llama_sampler_sample(chain, ctx, -1)
        if grammar is not None:
            one[0].id, one[0].logit, one[0].p = t, 0.0, 0.0
            one_arr.size, one_arr.selected, one_arr.sorted = 1, -1, False
            L.llama_sampler_apply(grammar, ctypes.byref(one_arr))
            if one[0].logit == float("-inf"):
                rejected += 1
                full["id"] = all_ids
                full["logit"] = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
                full["p"] = 0.0
                full_arr.size, full_arr.selected, full_arr.sorted = n_vocab, -1, False
                L.llama_sampler_apply(grammar, ctypes.byref(full_arr))
                L.llama_sampler_apply(chain, ctypes.byref(full_arr))
                t = int(full["id"][full_arr.selected])
            L.llama_sampler_accept(grammar, t)
        if L.llama_vocab_is_eog(vocab, t):
            break
        out.append(t)
        tok[0] = t
        if L.llama_decode(ctx, L.llama_batch_get_one(tok, 1)) != 0:
            raise SystemExit("decode failed")
    seconds = time.perf_counter() - t0
    buf = ctypes.create_string_buffer(512)
    pieces = []
    for t in out:
        k = L.llama_token_to_piece(vocab, t, buf, len(buf), 0, False)
        pieces.append(buf.raw[:max(k, 0)])
    print(json.dumps({"n_prompt": n, "n_generated": len(out), "decode_seconds": seconds,
                      "rejected": rejected, "text": b"".join(pieces).decode(errors="replace")}),
          flush=True)
    L.llama_sampler_free(chain)
    if grammar is not None:
        L.llama_sampler_free(grammar)
    L.llama_free(ctx)
    L.llama_model_free(model)


def main():
    ap = argparse.ArgumentParser(description="llama.cpp side of bench_grammar.py")
    ap.add_argument("mode", choices=["gen"])
    ap.add_argument("model")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", "--n-gen", type=int, default=128)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--temp", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--grammar")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    cmd_gen(a)
    return 0


if __name__ == "__main__":
    sys.exit(main())
