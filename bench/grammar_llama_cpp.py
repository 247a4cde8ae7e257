"""llama.cpp's grammar sampling on the walk bench/grammar_bench times: the same JSON grammar and
text, the model's own tokenizer; per token, the grammar sampler's apply over the whole vocabulary
(what llama.cpp runs before drawing), then accept. Usage: grammar_llama_cpp.py MODEL.gguf"""
import ctypes
import re
import sys
import time
from pathlib import Path

import llama_cpp

SRC = (Path(__file__).resolve().parent / "grammar_bench.c").read_text()


def c_string(name):
    """The C string literal `name` of grammar_bench.c, unescaped (so both benches share one text)."""
    body = re.search(r"static const char \*%s =\n(.*?);\n" % name, SRC, re.S).group(1)
    parts = re.findall(r'"((?:[^"\\]|\\.)*)"', body)
    return "".join(parts).encode().decode("unicode_escape")


def main():
    llm = llama_cpp.Llama(model_path=sys.argv[1], vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    grammar, text = c_string("JSON_GBNF"), c_string("TEXT").encode()
    toks = (llama_cpp.llama_token * 1024)()
    n = llama_cpp.llama_tokenize(vocab, text, len(text), toks, 1024, False, False)
    smpl = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
    assert smpl, "llama.cpp refused the grammar"
    data = (llama_cpp.llama_token_data * n_vocab)()
    total = worst = 0.0
    for i in range(n):
        for t in range(n_vocab):
            data[t].id, data[t].logit, data[t].p = t, 0.0, 0.0
        arr = llama_cpp.llama_token_data_array(data, n_vocab, -1, False)
        t0 = time.perf_counter()
        llama_cpp.llama_sampler_apply(smpl, ctypes.byref(arr))
        dt = time.perf_counter() - t0
        total, worst = total + dt, max(worst, dt)
        llama_cpp.llama_sampler_accept(smpl, toks[i])
    llama_cpp.llama_sampler_free(smpl)
    print("llama.cpp grammar apply, vocabulary %d: %.3f ms/token over %d tokens (worst %.3f ms)"
          % (n_vocab, total / n * 1e3, n, worst * 1e3))


if __name__ == "__main__":
    main()
