"""The optional tensors and keys llama.cpp's graphs use, on llama, qwen2, qwen3 and phi3 (biases
on every projection, .scale / .input_scale, fused attn_qkv and gate-up, rope_freqs, LongRoPE's
short and long sets, partial rotary, rope.scaling.factor 0, attention.scale 0), kiri's logits at
every position against llama.cpp's (llama-cpp-python), and the files kiri must refuse naming the
tensor or key. The cases live in tests/tools/check_optional_tensors.py, which also runs alone."""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def test_optional_tensors_against_llama_cpp():
    dump = os.path.join(REPO, "build", "dump_logits")
    if not os.path.exists(dump):
        pytest.fail("build/dump_logits is not built (cmake --build build --target dump_logits)")
    r = subprocess.run([sys.executable, os.path.join(HERE, "tools", "check_optional_tensors.py")],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    report = r.stdout + r.stderr
    assert r.returncode == 0, report[-6000:]
    assert "0 failed" in report, report[-6000:]
