"""kiri's logits against two outside references, for every tiny model (make_tiny_models.py) and
stories260K:

  L  llama.cpp (llama-cpp-python), evaluating the prompt in one batch with logits for every position
  E  exact arithmetic: make_tiny_models.reference_logits, float64 over the file's dequantized weights
  K  kiri, through tests/tools/dump_logits (public API), one token per kiri_context_eval call

Errors are measured per position as max_v |a[v] - b[v]| / (max(b) - min(b)), "relative to the
logit range"; a test takes the maximum over positions and prompts.

Why the tolerances are what they are (measured with llama-cpp-python 0.3.36 on these models; rerun
`pytest -s tests/test_logits.py -k llama_cpp_vs_exact` to see the numbers):

- F32 weights with an F32 KV cache on both sides: llama.cpp is within 7e-7 of E. Any correct F32
  implementation differs only by summation order, so kiri must be within 1e-4 of L.
- F32 weights with the default F16 KV cache: llama.cpp rounds K and V (and, in its matmuls with
  them, Q and the attention weights) to F16 and lands up to 4e-4 from E. kiri must be within 2e-3
  of L, and no further from E than twice llama.cpp's distance (floor 1e-4).
- F16 weights: llama.cpp rounds every matmul's activations to F16 (up to 8e-4 from E); kiri may or
  may not, so it must be within 3e-3 of L.
- Quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): llama.cpp quantizes every matmul's
  activations to 8 bits (Q8_0/Q8_1 blocks of 32, or Q8_K blocks of 256 for K-quants), which alone
  puts it 1e-2 to 2.7e-2 from E, for every weight type alike (emulating that step in E brings
  llama.cpp to 6e-8 of it). So the error budget depends on whether kiri does the same. The test
  asks kiri to be as accurate as llama.cpp: err(K, E) <= max(2 * err(L, E), 2e-3) per prompt.
  Top-1: on a random model the two best logits are often closer than llama.cpp's own error
  (llama.cpp's top-1 matches E's on only 90-100% of positions), so a plain "top-1 equal on 95% of
  positions" would fail on a kiri that is more exact than llama.cpp. Instead, at every position,
  kiri's top-1 token must be within llama.cpp's error of the best: E[k] >= max(E) - margin, with
  margin = 2 * max_v |L - E| at that position + 1e-3. The plain agreement rates are printed.

Greedy continuations (24 tokens) must equal llama.cpp's for the F32 models, and batched prefill
(--batch, --chunk 7) must give the same rows as token-by-token evaluation.

Environment: KIRI_DUMP_LOGITS (default <repo>/build/dump_logits; built from build/libkiri.a into a
temporary folder when missing), KIRI_TINY_MODELS (default <repo>/build/tiny-models), KIRI_BACKEND
(passed through to kiri), KIRI_AGREEMENT_LOG (a file to append one line per measurement to).
"""

import functools
import json
import os
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tiny_models as mtm  # noqa: E402

REPO = mtm.REPO
DUMP = os.environ.get("KIRI_DUMP_LOGITS", os.path.join(REPO, "build", "dump_logits"))
MODELS_DIR = os.environ.get("KIRI_TINY_MODELS", os.path.join(REPO, "build", "tiny-models"))
STORIES = os.path.join(REPO, "models", "stories260K.gguf")
N_CTX = 128
GREEDY_N = 24

TOL_F32_F32KV = 1e-4
TOL_F32_F16KV = 2e-3
TOL_F16 = 3e-3
QUANT_FACTOR, QUANT_FLOOR = 2.0, 2e-3
TOP1_MARGIN_FACTOR, TOP1_MARGIN_FLOOR = 2.0, 1e-3


class Case:
    def __init__(self, name, path, wtype):
        self.name, self.path, self.wtype = name, path, wtype

    def __repr__(self):
        return self.name


CASES = [Case(m.name, m.path, m.wtype) for m in mtm.models(MODELS_DIR)]
CASES.append(Case("stories260K-F32", STORIES, "F32"))
F32_CASES = [c for c in CASES if c.wtype == "F32"]


def log(line):
    print(line)
    path = os.environ.get("KIRI_AGREEMENT_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")


# ------------------------------------------------------------------------------------------------
# Fixtures: models, the dump tool
# ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def tiny_models():
    made, skipped = mtm.ensure(MODELS_DIR, log=lambda s: print(s, file=sys.stderr))
    return {m.path for m in made}, {m.path: why for m, why in skipped}


@pytest.fixture
def model(request, tiny_models):
    case = request.param
    made, skipped = tiny_models
    if case.path in skipped:
        pytest.skip(f"{case.name}: {skipped[case.path]}")
    if not os.path.exists(case.path):
        pytest.skip(f"{case.path} does not exist")
    return case


def _build_dump_tool():
    lib = os.path.join(REPO, "build", "libkiri.a")
    if not os.path.exists(lib):
        return None
    out = os.path.join(tempfile.mkdtemp(prefix="kiri-dump-"), "dump_logits")
    cc = os.environ.get("CC", "cc")
    cmd = [cc, "-std=c11", "-O2", "-I" + os.path.join(REPO, "runtime"),
           os.path.join(REPO, "tests", "tools", "dump_logits.c"), lib,
           "-l:libpcre2-8.a", "-lpthread", "-lm", "-ldl", "-o", out]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        cmd[cmd.index("-l:libpcre2-8.a")] = "-lpcre2-8"
        r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        pytest.fail("building dump_logits failed:\n" + " ".join(cmd) + "\n" + r.stderr)
    return out


@pytest.fixture(scope="session")
def dump_tool():
    if os.path.exists(DUMP):
        return DUMP
    built = _build_dump_tool()
    if built is None:
        pytest.skip(f"no kiri: {DUMP} and build/libkiri.a are missing (build kiri first)")
    return built


def run_dump(tool, path, tokens, *, kv="f16", chunk=1, batch=False, greedy=0, cpu_kernels=None):
    """Returns (rows (r, n_vocab) float32, generated ids)."""
    env = dict(os.environ, KIRI_CPU_KERNELS=cpu_kernels) if cpu_kernels else None
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        cmd = [tool, "--kv", kv, "--n-ctx", str(N_CTX), "--out", out]
        cmd += ["--batch"] if batch else ["--chunk", str(chunk)]
        if greedy:
            cmd += ["--greedy", str(greedy)]
        cmd += [path] + [str(t) for t in tokens]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        if r.returncode:
            pytest.fail(f"dump_logits failed ({r.returncode}): {' '.join(cmd[:12])} ...\n"
                        f"{r.stderr.strip()}")
        info = json.loads(r.stdout)
        rows = np.fromfile(out, dtype=np.float32).reshape(info["rows"], info["n_vocab"])
        return rows, info["generated"]


# ------------------------------------------------------------------------------------------------
# References
# ------------------------------------------------------------------------------------------------

_LLM = {}


@pytest.fixture(scope="module", autouse=True)
def _close_llama():
    """Closes the cached llama.cpp model before the interpreter shuts down (its destructor fails
    when run during shutdown)."""
    yield
    for k in list(_LLM):
        _LLM.pop(k).close()


def llama(path, kv):
    """One llama_cpp.Llama at a time (the full-vocabulary models' score buffers are large)."""
    import llama_cpp
    key = (path, kv)
    if key not in _LLM:
        for k in list(_LLM):
            _LLM.pop(k).close()
        t = 0 if kv == "f32" else 1
        _LLM[key] = llama_cpp.Llama(model_path=path, n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX,
                                    logits_all=True, n_threads=2, n_threads_batch=2,
                                    flash_attn=False, type_k=t, type_v=t, seed=0, verbose=False)
    return _LLM[key]


@functools.lru_cache(maxsize=64)
def llama_logits(path, tokens, kv):
    llm = llama(path, kv)
    llm.reset()
    llm.eval(list(tokens))
    return np.array(llm.scores[: len(tokens)], dtype=np.float64)


def llama_greedy(path, tokens, kv, n):
    llm = llama(path, kv)
    llm.reset()
    llm.eval(list(tokens))
    out = []
    for i in range(n):
        nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(nxt)
        if i + 1 < n:
            llm.eval([nxt])
    return out


@functools.lru_cache(maxsize=64)
def exact_logits(path, tokens):
    return mtm.reference_logits(path, list(tokens))


@functools.lru_cache(maxsize=None)
def prompts(case):
    """Three prompts (1, 7 and 40 tokens), fixed per model: BOS (where the model has one) then
    ids drawn uniformly from the vocabulary."""
    llm = llama(case.path, "f16")
    n_vocab, bos = llm.n_vocab(), llm.token_bos()
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    out = []
    for n in (1, 7, 40):
        ids = [int(x) for x in rng.integers(0, n_vocab, n)]
        if bos >= 0:
            ids[0] = bos
        out.append(tuple(ids))
    return out


# ------------------------------------------------------------------------------------------------
# Measures
# ------------------------------------------------------------------------------------------------

def rel_err(a, ref):
    """Per position: max |a - ref| / range(ref)."""
    return np.abs(a - ref).max(1) / (ref.max(1) - ref.min(1))


def worst(a, ref, label_a, label_ref, extra=None):
    """A sentence locating the largest difference."""
    e = rel_err(a, ref)
    p = int(np.argmax(e))
    v = int(np.argmax(np.abs(a[p] - ref[p])))
    s = (f"position {p}, token {v}: {label_a} {a[p, v]:.6g} vs {label_ref} {ref[p, v]:.6g} "
         f"(abs {abs(a[p, v] - ref[p, v]):.3g}, range {ref[p].max() - ref[p].min():.3g})")
    if extra is not None:
        s += f", {extra[0]} {extra[1][p, v]:.6g}"
    return s


def top1_rate(a, b):
    return float((a.argmax(1) == b.argmax(1)).mean())


# ------------------------------------------------------------------------------------------------
# Tests that need only llama.cpp: the generated files mean what make_tiny_models.py says
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("model", CASES, indirect=True, ids=repr)
def test_llama_cpp_vs_exact(model):
    """Every model loads in llama.cpp, and for F32 weights (F32 KV) llama.cpp agrees with the
    float64 forward pass, which checks that the files say what make_tiny_models.py means (key
    names, tensor layouts, RoPE style, biases, norms, rope_freqs, tied output). For the other
    types this only measures llama.cpp's distance from exact arithmetic (printed)."""
    kv = "f32" if model.wtype == "F32" else "f16"
    errs, agree = [], []
    for toks in prompts(model):
        L, E = llama_logits(model.path, toks, kv), exact_logits(model.path, toks)
        errs.append(rel_err(L, E).max())
        agree += list(L.argmax(1) == E.argmax(1))
        if model.wtype == "F32":
            assert errs[-1] <= 1e-5, f"{model.name}: llama.cpp vs exact {errs[-1]:.2e}: " + \
                worst(L, E, "llama.cpp", "exact")
    log(f"llama.cpp-vs-exact {model.name:28s} kv={kv} max rel err {max(errs):.2e} "
        f"top1 {np.mean(agree):.3f} of {len(agree)} positions")


# ------------------------------------------------------------------------------------------------
# kiri
# ------------------------------------------------------------------------------------------------

def check_rows(case, toks, K, kv, what):
    """The per-type criteria of the module docstring for kiri rows K of prompt toks (all positions).
    Returns a summary line."""
    L, E = llama_logits(case.path, toks, kv), exact_logits(case.path, toks)
    e_kl, e_ke, e_le = rel_err(K, L).max(), rel_err(K, E).max(), rel_err(L, E).max()
    tag = f"{case.name} {what} ({len(toks)} tokens, kv={kv})"
    line = (f"kiri {tag}: vs llama.cpp {e_kl:.2e}, vs exact {e_ke:.2e} "
            f"(llama.cpp vs exact {e_le:.2e}), top1 = llama.cpp {top1_rate(K, L):.3f}, "
            f"= exact {top1_rate(K, E):.3f}")
    log(line)
    if case.wtype == "F32" and kv == "f32":
        assert e_kl <= TOL_F32_F32KV, f"{tag}: kiri vs llama.cpp {e_kl:.2e} > {TOL_F32_F32KV}; " + \
            worst(K, L, "kiri", "llama.cpp", ("exact", E))
    elif case.wtype == "F32":
        assert e_kl <= TOL_F32_F16KV, f"{tag}: kiri vs llama.cpp {e_kl:.2e} > {TOL_F32_F16KV}; " + \
            worst(K, L, "kiri", "llama.cpp", ("exact", E))
        allowed = max(2 * e_le, 1e-4)
        assert e_ke <= allowed, f"{tag}: kiri vs exact {e_ke:.2e} > {allowed:.2e}; " + \
            worst(K, E, "kiri", "exact", ("llama.cpp", L))
    elif case.wtype == "F16":
        assert e_kl <= TOL_F16, f"{tag}: kiri vs llama.cpp {e_kl:.2e} > {TOL_F16}; " + \
            worst(K, L, "kiri", "llama.cpp", ("exact", E))
    else:
        allowed = max(QUANT_FACTOR * e_le, QUANT_FLOOR)
        assert e_ke <= allowed, (f"{tag}: kiri vs exact {e_ke:.2e} > {allowed:.2e} "
                                 f"(= {QUANT_FACTOR} x llama.cpp's {e_le:.2e}); " +
                                 worst(K, E, "kiri", "exact", ("llama.cpp", L)))
        margin = TOP1_MARGIN_FACTOR * np.abs(L - E).max(1) + TOP1_MARGIN_FLOOR
        k1 = K.argmax(1)
        short = E.max(1) - E[np.arange(len(k1)), k1]
        bad = np.nonzero(short > margin)[0]
        assert len(bad) == 0, (
            f"{tag}: kiri's top-1 is worse than llama.cpp's error allows at positions "
            f"{bad.tolist()}; first: kiri picks {k1[bad[0]]} (exact logit "
            f"{E[bad[0], k1[bad[0]]]:.4f}), best is {E[bad[0]].argmax()} ({E[bad[0]].max():.4f}), "
            f"margin {margin[bad[0]]:.4f}; llama.cpp picks {L[bad[0]].argmax()}")
    return line


@pytest.mark.parametrize("model", CASES, indirect=True, ids=repr)
def test_logits_every_position(model, dump_tool):
    kv = "f32" if model.wtype == "F32" else "f16"
    for toks in prompts(model):
        K, _ = run_dump(dump_tool, model.path, toks, kv=kv)
        assert K.shape[0] == len(toks)
        check_rows(model, toks, K.astype(np.float64), kv, "token by token")


@pytest.mark.parametrize("model", F32_CASES, indirect=True, ids=repr)
def test_logits_f32_default_kv(model, dump_tool):
    toks = prompts(model)[2]
    K, _ = run_dump(dump_tool, model.path, toks, kv="f16")
    check_rows(model, toks, K.astype(np.float64), "f16", "token by token")


@pytest.mark.parametrize("model", CASES, indirect=True, ids=repr)
def test_batched_prefill(model, dump_tool):
    """--batch (one call, last row) and --chunk 7 (a row per call) against token-by-token rows
    and the references at the same positions."""
    kv = "f32" if model.wtype == "F32" else "f16"
    toks = prompts(model)[2]
    inc, _ = run_dump(dump_tool, model.path, toks, kv=kv)
    last, _ = run_dump(dump_tool, model.path, toks, kv=kv, batch=True)
    chunked, _ = run_dump(dump_tool, model.path, toks, kv=kv, chunk=7)
    pos = list(range(6, len(toks), 7))
    if pos[-1] != len(toks) - 1:
        pos.append(len(toks) - 1)
    assert last.shape[0] == 1 and chunked.shape[0] == len(pos)
    L, E = llama_logits(model.path, toks, kv), exact_logits(model.path, toks)
    inc64 = inc.astype(np.float64)
    for what, rows, at in (("--batch", last, [len(toks) - 1]), ("--chunk 7", chunked, pos)):
        rows = rows.astype(np.float64)
        e = rel_err(rows, inc64[at]).max()
        log(f"kiri {model.name} {what} vs token by token: {e:.2e}")
        # Batched and single-token paths may use different kernels (and activation rounding),
        # so they are held to the same standard against the references, not to each other.
        _check_subset(model, toks, rows, at, kv, what, L, E)


def _check_subset(case, toks, rows, at, kv, what, L, E):
    Ls, Es = L[at], E[at]
    e_kl, e_ke, e_le = rel_err(rows, Ls).max(), rel_err(rows, Es).max(), rel_err(Ls, Es).max()
    tag = f"{case.name} {what} (positions {at[:3]}{'...' if len(at) > 3 else ''}, kv={kv})"
    if case.wtype == "F32":
        tol = TOL_F32_F32KV if kv == "f32" else TOL_F32_F16KV
        assert e_kl <= tol, f"{tag}: kiri vs llama.cpp {e_kl:.2e} > {tol}; " + \
            worst(rows, Ls, "kiri", "llama.cpp", ("exact", Es))
    elif case.wtype == "F16":
        assert e_kl <= TOL_F16, f"{tag}: kiri vs llama.cpp {e_kl:.2e} > {TOL_F16}; " + \
            worst(rows, Ls, "kiri", "llama.cpp", ("exact", Es))
    else:
        allowed = max(QUANT_FACTOR * rel_err(L, E).max(), QUANT_FLOOR)
        assert e_ke <= allowed, f"{tag}: kiri vs exact {e_ke:.2e} > {allowed:.2e}; " + \
            worst(rows, Es, "kiri", "exact", ("llama.cpp", Ls))


def _cpu_tiers():
    """The CPU kernel tiers (kiri_model_params.cpu_kernels) this machine runs: each holds its own
    kernels to the references, whatever tier the other tests ran on. From the kernel flags Linux
    reports; a tier the CPU lacks is not listed."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((ln for ln in f if ln.startswith(("flags", "Features"))), ":").split(":")[1].split())
    except OSError:
        flags = set()
    tiers = ["c"]
    if {"avx2", "fma", "f16c"} <= flags:
        tiers.append("avx2")
    if {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        tiers.append("avx512")
    for flag, tier in (("asimd", "neon"), ("asimddp", "dotprod"), ("i8mm", "i8mm")):
        if flag in flags:
            tiers.append(tier)
    return tiers


TIER_CASES = [c for c in CASES if c.name.startswith("qwen2-") and "fullvocab" not in c.name]


@pytest.mark.parametrize("tier", _cpu_tiers())
@pytest.mark.parametrize("model", TIER_CASES, indirect=True, ids=repr)
def test_cpu_kernel_tiers(model, tier, dump_tool):
    """Every weight type through each CPU kernel tier (the portable C kernels, AVX2 without
    AVX-512, AVX-512; NEON, dotprod, i8mm), token by token and in chunks of 3 tokens (the
    small-batch products) and 7 (the prefill tiles), held to the same references."""
    kv = "f32" if model.wtype == "F32" else "f16"
    toks = prompts(model)[2]
    K, _ = run_dump(dump_tool, model.path, toks, kv=kv, cpu_kernels=tier)
    check_rows(model, toks, K.astype(np.float64), kv, f"token by token, {tier} kernels")
    # Chunks of 3 take the small-batch products (2-4 tokens), chunks of 7 the prefill tiles.
    L, E = llama_logits(model.path, toks, kv), exact_logits(model.path, toks)
    for chunk in (3, 7):
        rows, _ = run_dump(dump_tool, model.path, toks, kv=kv, chunk=chunk, cpu_kernels=tier)
        pos = list(range(chunk - 1, len(toks), chunk))
        if pos[-1] != len(toks) - 1:
            pos.append(len(toks) - 1)
        _check_subset(model, toks, rows.astype(np.float64), pos, kv, f"--chunk {chunk}, {tier} kernels", L, E)


@pytest.mark.parametrize("model", F32_CASES, indirect=True, ids=repr)
def test_greedy_continuation(model, dump_tool):
    for toks in prompts(model)[1:]:
        want = llama_greedy(model.path, toks, "f32", GREEDY_N)
        _, got = run_dump(dump_tool, model.path, toks, kv="f32", greedy=GREEDY_N)
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert got == want, (f"{model.name}: greedy continuation of {len(toks)} tokens differs "
                             f"from llama.cpp at step {first}: kiri {got} vs llama.cpp {want}")
