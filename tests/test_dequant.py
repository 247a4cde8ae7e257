"""Checks kiri's reference quantization kernels against gguf-py's NumPy implementation.

Dequantization must be bit-exact for every supported type: random block bytes (with finite f16
scale fields) go through `quant_tool dequant TYPE` and through gguf.quants.dequantize. Quantization
must be byte-identical for the types gguf-py can quantize; the K-quants, which gguf-py cannot
produce, are held to error bounds and compared with the 32-value types of similar size.

The quant_tool binary comes from $KIRI_QUANT_TOOL (default <repo>/build/quant_tool).
Run: ~/.cache/kiri/venv/bin/python -m pytest -q tests/test_dequant.py  (add -s for the tables)
"""
import os
import subprocess
from pathlib import Path

import numpy as np

try:
    import pytest
except ImportError:  # the __main__ runner at the bottom works without pytest
    class pytest:  # noqa: N801 - stands in for the two names used here
        class mark:
            @staticmethod
            def parametrize(*args, **kwargs):
                return lambda f: f

        @staticmethod
        def fail(msg):
            raise AssertionError(msg)
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

REPO = Path(__file__).resolve().parent.parent
TOOL = os.environ.get("KIRI_QUANT_TOOL", str(REPO / "build" / "quant_tool"))

# Byte offsets of the f16 scale fields inside one block, per type.
F16_FIELDS = {
    T.Q4_0: [0], T.Q4_1: [0, 2], T.Q5_0: [0], T.Q5_1: [0, 2], T.Q8_0: [0],
    T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208],
}
QUANT_TYPES = list(F16_FIELDS)
PLAIN_TYPES = [T.F32, T.F16, T.BF16]
N_BLOCKS = 2048


def run_tool(mode, qtype, data: bytes) -> bytes:
    if not os.path.exists(TOOL):
        pytest.fail(f"quant_tool not found at {TOOL} (set KIRI_QUANT_TOOL)")
    r = subprocess.run([TOOL, mode, qtype.name], input=data, capture_output=True, check=False)
    assert r.returncode == 0, r.stderr.decode()
    return r.stdout


def finite_f16_bits(rng, n):
    """Random binary16 bit patterns with a finite value: normals, subnormals, zeros, both signs."""
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    exp = (bits >> 10) & 0x1F
    return np.where(exp == 0x1F, bits & np.uint16(0x83FF), bits).astype(np.uint16)


def random_blocks(qtype, n_blocks, rng):
    bs, ts = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, ts), dtype=np.uint8)
    for off in F16_FIELDS.get(qtype, []):
        raw[:, off:off + 2] = finite_f16_bits(rng, n_blocks).view(np.uint8).reshape(n_blocks, 2)
    return raw


def same_bits(a: np.ndarray, b: np.ndarray):
    """(bit-identical, identical up to NaN payloads, number of differing elements)."""
    ua, ub = a.view(np.uint32), b.view(np.uint32)
    diff = ua != ub
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    up_to_nan = bool(np.array_equal(nan_a, nan_b) and not np.any(diff & ~nan_a))
    return (not diff.any()), up_to_nan, int(diff.sum())


# ---- dequantization ---------------------------------------------------------------------------

@pytest.mark.parametrize("qtype", PLAIN_TYPES + QUANT_TYPES, ids=lambda t: t.name)
def test_dequant_bit_exact(qtype):
    rng = np.random.default_rng(1234 + int(qtype))
    if qtype in PLAIN_TYPES:
        if qtype == T.F32:
            raw = rng.integers(0, 256, size=(N_BLOCKS * 4,), dtype=np.uint8)
        else:  # every 16-bit pattern once (NaN, Inf, subnormals included), then random ones
            allbits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
            raw = np.concatenate([allbits, rng.integers(0, 1 << 16, size=4096).astype(np.uint16)])
            raw = raw.view(np.uint8)
    else:
        raw = random_blocks(qtype, N_BLOCKS, rng)
    ours = np.frombuffer(run_tool("dequant", qtype, raw.tobytes()), dtype=np.float32)
    ref = dequantize(raw.reshape(-1), qtype).astype(np.float32, copy=False).reshape(-1)
    assert ours.shape == ref.shape
    exact, up_to_nan, ndiff = same_bits(ours, ref)
    print(f"\ndequant {qtype.name:5s}: {ref.size} values, bit-exact={exact}, "
          f"equal-up-to-NaN-payload={up_to_nan}, differing={ndiff}")
    assert up_to_nan, f"{qtype.name}: {ndiff} values differ"
    if qtype != T.F32:  # an F32 NaN is passed through by both as raw bits
        assert exact, f"{qtype.name}: NaN payloads differ in {ndiff} values"


# ---- quantization -----------------------------------------------------------------------------

def special_data(n_blocks, bs, rng):
    """Normal data with some special blocks: zeros, a constant, outliers, tiny values, ties."""
    x = rng.standard_normal((n_blocks, bs)).astype(np.float32)
    x[0] = 0.0
    x[1] = 0.75
    x[2] *= 1e-6
    x[3, ::7] *= 50.0
    x[4] = np.round(x[4] * 4) / 4  # many exact ties
    x[5] = np.abs(x[5])             # all positive (mins matter)
    x[6] = -np.abs(x[6])
    return x.reshape(-1)


def rmse(a, b):
    return float(np.sqrt(np.mean((a.astype(np.float64) - b) ** 2)))


# gguf-py quantizes these; ours must produce the same bytes.
@pytest.mark.parametrize("qtype", [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0],
                         ids=lambda t: t.name)
def test_quant_matches_gguf(qtype):
    rng = np.random.default_rng(99 + int(qtype))
    bs, _ = GGML_QUANT_SIZES[qtype]
    x = special_data(N_BLOCKS // max(1, bs // 32), max(bs, 256), rng)
    if qtype in (T.F16, T.BF16):  # also the awkward floats: halfway cases, overflow, subnormals
        x = np.concatenate([x, np.array([65504, 65519.99, 65520, 1e-8, 2.0**-25, 3 * 2.0**-26,
                                         2.0**-24, 1 + 2.0**-11, 1 + 3 * 2.0**-11, np.inf,
                                         -np.inf, 1e38, -0.0], np.float32)])
        rnd = rng.integers(0, 1 << 32, size=1 << 16, dtype=np.uint32).view(np.float32)
        x = np.concatenate([x, rnd[~np.isnan(rnd)]])
    ours = np.frombuffer(run_tool("quant", qtype, x.tobytes()), dtype=np.uint8)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = np.asarray(quantize(x, qtype)).view(np.uint8).reshape(-1)
    assert ours.shape == ref.shape
    nbytes_diff = int((ours != ref).sum())
    print(f"\nquant {qtype.name:5s}: {x.size} values, byte-identical={nbytes_diff == 0}, "
          f"differing bytes={nbytes_diff}")
    assert nbytes_diff == 0


# K-quants: gguf-py has no quantizer for them, so bound the error relative to the data's RMS
# (bounds are about 1.3x what a good search reaches on normal data) and compare with the 32-value
# type of similar size quantized by gguf-py.
K_BOUNDS = {T.Q4_K: (0.092, T.Q4_1), T.Q5_K: (0.047, T.Q5_1), T.Q6_K: (0.023, T.Q8_0)}


@pytest.mark.parametrize("qtype", list(K_BOUNDS), ids=lambda t: t.name)
def test_kquant_error(qtype):
    rng = np.random.default_rng(7 + int(qtype))
    x = rng.standard_normal(256 * 512).astype(np.float32)
    blocks = run_tool("quant", qtype, x.tobytes())
    ours = dequantize(np.frombuffer(blocks, dtype=np.uint8), qtype).reshape(-1)
    ours_tool = np.frombuffer(run_tool("dequant", qtype, blocks), dtype=np.float32)
    assert np.array_equal(ours, ours_tool)
    bound, other = K_BOUNDS[qtype]
    other_err = rmse(dequantize(quantize(x, other), other).reshape(-1), x)
    err = rmse(ours, x)
    rms = float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))
    print(f"\nquant {qtype.name}: rel RMSE {err / rms:.5f} (bound {bound}); "
          f"gguf-py {other.name}: {other_err / rms:.5f}")
    assert err / rms < bound
    # Special blocks stay sane: zeros give zeros, a constant stays close, nothing becomes NaN.
    xs = special_data(8, 256, rng)
    ys = np.frombuffer(run_tool("dequant", qtype, run_tool("quant", qtype, xs.tobytes())),
                       dtype=np.float32)
    assert np.all(np.isfinite(ys))
    assert np.all(ys[:256] == 0.0)
    assert np.max(np.abs(ys[256:512] - 0.75)) < 0.75 * 0.05


if __name__ == "__main__":  # runs without pytest too: python tests/test_dequant.py
    import sys
    cases = [(test_dequant_bit_exact, t) for t in PLAIN_TYPES + QUANT_TYPES]
    cases += [(test_quant_matches_gguf, t) for t in [T.F16, T.BF16, T.Q4_0, T.Q4_1, T.Q5_0,
                                                     T.Q5_1, T.Q8_0]]
    cases += [(test_kquant_error, t) for t in K_BOUNDS]
    failed = 0
    for fn, t in cases:
        try:
            fn(t)
        except Exception as e:  # noqa: BLE001 - report every failure, go on
            failed += 1
            print(f"FAIL {fn.__name__}[{t.name}]: {e}")
    print(f"\n{len(cases) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
