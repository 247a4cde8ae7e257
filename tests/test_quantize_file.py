"""`kiri quantize` on whole files against gguf-py's quantizer.

A small F32 model file (the `gguf` package writes it) is converted by `kiri quantize` to the
types gguf-py can produce; every matrix of the output must be byte for byte gguf-py's
quantization of the same F32 values, the vectors must stay F32, and the metadata must be copied
with general.file_type set. The rows of a tensor are split across worker threads, so row counts
that do not divide evenly (and a matrix of a single row) are part of the file.
"""
import subprocess

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFReader, GGUFWriter
from gguf.quants import quantize

# name -> (rows, row length): odd row counts, one row, a row length of several blocks.
MATRICES = {
    "token_embd.weight": (37, 256),
    "blk.0.attn_q.weight": (256, 256),
    "blk.0.ffn_up.weight": (101, 256),
    "blk.0.ffn_down.weight": (1, 512),
}
VECTORS = {"blk.0.attn_norm.weight": 256, "output_norm.weight": 256}
FILE_TYPES = {T.Q8_0: 7, T.Q4_0: 2, T.Q4_1: 3, T.Q5_0: 8, T.Q5_1: 9}


@pytest.fixture(scope="module")
def f32_model(tmp_path_factory):
    rng = np.random.default_rng(2026)
    path = tmp_path_factory.mktemp("quantize") / "f32.gguf"
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_string("test.note", "copied as is")
    tensors = {}
    for name, (rows, cols) in MATRICES.items():
        tensors[name] = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
    for name, n in VECTORS.items():
        tensors[name] = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, tensors


@pytest.mark.parametrize("qtype", list(FILE_TYPES), ids=lambda t: t.name)
def test_quantize_file_matches_gguf(kiri_bin, f32_model, tmp_path, qtype):
    src, tensors = f32_model
    out = tmp_path / f"{qtype.name}.gguf"
    r = subprocess.run([str(kiri_bin), "quantize", str(src), str(out), qtype.name],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    reader = GGUFReader(str(out))
    got = {t.name: t for t in reader.tensors}
    assert set(got) == set(tensors)
    for name in MATRICES:
        t = got[name]
        assert t.tensor_type == qtype, name
        ref = np.asarray(quantize(tensors[name], qtype)).view(np.uint8).reshape(-1)
        ours = np.asarray(t.data).view(np.uint8).reshape(-1)
        assert ours.shape == ref.shape, name
        assert int((ours != ref).sum()) == 0, f"{name}: bytes differ from gguf-py's {qtype.name}"
    for name in VECTORS:
        t = got[name]
        assert t.tensor_type == T.F32, name
        assert np.array_equal(np.asarray(t.data).reshape(-1), tensors[name])
    fields = reader.fields
    assert int(fields["general.file_type"].parts[-1][0]) == FILE_TYPES[qtype]
    note = fields["test.note"]
    assert bytes(note.parts[-1]).decode() == "copied as is"


def test_quantize_refuses_same_path(kiri_bin, f32_model):
    src, _ = f32_model
    before = src.read_bytes()
    r = subprocess.run([str(kiri_bin), "quantize", str(src), str(src), "Q8_0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "two different files" in r.stderr
    assert src.read_bytes() == before


def test_quantize_mix_tied_embedding_and_convolutions(kiri_bin, tmp_path):
    """Q4_K_M as llama.cpp's llama-quant.cpp mixes it: a token_embd that is also the output matrix
    (no output.weight) takes the output's Q6_K, an untied one the main type; the recurrent layers'
    convolution kernels (ssm_conv1d, shortconv.conv: rows of a few taps) stay F32."""
    rng = np.random.default_rng(7)
    mats = {"token_embd.weight": (64, 256), "blk.0.attn_q.weight": (256, 256),
            "blk.0.ssm_conv1d.weight": (256, 4), "blk.1.shortconv.conv.weight": (256, 3)}
    for tied in (True, False):
        src, out = tmp_path / f"f32-{tied}.gguf", tmp_path / f"q4km-{tied}.gguf"
        w = GGUFWriter(str(src), "llama")
        w.add_block_count(2)
        for name, shape in list(mats.items()) + ([] if tied else [("output.weight", (64, 256))]):
            w.add_tensor(name, (rng.standard_normal(shape) * 0.05).astype(np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        r = subprocess.run([str(kiri_bin), "quantize", str(src), str(out), "Q4_K_M"],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        got = {t.name: t.tensor_type for t in GGUFReader(str(out)).tensors}
        assert got["token_embd.weight"] == (T.Q6_K if tied else T.Q4_K)
        assert got["blk.0.attn_q.weight"] == T.Q4_K
        assert got["blk.0.ssm_conv1d.weight"] == T.F32
        assert got["blk.1.shortconv.conv.weight"] == T.F32
        if not tied:
            assert got["output.weight"] == T.Q6_K
