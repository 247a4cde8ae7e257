"""Checks kiri's tokenizer against llama.cpp on every vocabulary llama.cpp ships, and on the real
Gemma 3 270M file.

Two references, neither written here:
- llama.cpp's own tokenizer vectors: models/ggml-vocab-*.gguf with .inp (texts) and .out (the ids
  llama.cpp's tests expect), from the llama.cpp tree llama-cpp-python vendors (conftest's
  llama_cpp_source()). kiri's ids must equal them exactly.
- llama.cpp's tokenizer itself, through llama-cpp-python (vocab_only=True), over a varied text set
  (scripts, whitespace runs, digits, code, emoji, invalid-looking sequences): tokenize (no BOS,
  special texts not parsed) and the concatenated per-token pieces (special tokens hidden) must be
  byte-identical, and so must add-BOS and the BOS id.

The vocabularies whose tokenizer kiri has no family for must be refused with a clear error:
ggml-vocab-bert-bge (BERT WordPiece, an embedding tokenizer) and ggml-vocab-nomic-bert-moe
(Unigram/T5). Everything else must load.

The tokenize_vocab program comes from $KIRI_BUILD/tokenize_vocab, else <repo>/build/tokenize_vocab.
Run: ~/.cache/kiri/venv/bin/python -m pytest -q tests/test_tokenizer_vectors.py
"""
import ctypes
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import llama_cpp_source, real_model

llama_cpp = pytest.importorskip("llama_cpp")

ROOT = Path(__file__).resolve().parent.parent
TOOL = Path(os.environ.get("KIRI_BUILD", str(ROOT / "build"))) / "tokenize_vocab"
SEP = "\n__ggml_vocab_test__\n"

# Vocabularies kiri refuses, and why: neither is a tokenizer of a generative family kiri runs.
REFUSED = {
    "bert-bge": "tokenizer model \"bert\" is not supported",
    "nomic-bert-moe": "tokenizer model \"t5\" is not supported",
}

TEXTS = [
    "Hello world", " Hello world", "Hello World!", "hello  world   ", "   leading spaces",
    "tabs\tand\t\ttabs", "new\nlines\n\n\nand\r\ncrlf\r\n", "\n", "\n\n", " \n \n ", "    ",
    "1", "12", "123", "1234", "1234567890", "3.14159 and 2,718,281", "٣٤٥ ١٢ ۴۵", "Ⅻ ½ ²³",
    "def f(x):\n    return x**2  # square\n", "int main(void) { return 0; }\n\t}\n",
    "if (a != b && c >= d) { x += 1; }", "    \n        indented\n", "self.assertEqual(a, b)",
    "I'm sure you'll see it's 'quoted' and \"double\"", "DON'T SHOUT, We'Ve a'lL",
    "Ünïcödé façade naïve", "Ελληνικά κείμενα", "Русский текст, ещё", "日本語のテキスト、漢字",
    "中文文本：你好，世界！", "한국어 텍스트", "עברית", "العربية", "हिन्दी पाठ", "ไทย ภาษา",
    "emoji 🦙🔥 👩‍👩‍👧‍👦 🇺🇸 ✅", "🦙", "a\u00a0b\u2009c\u3000d", "zero\u200bwidth",
    "mixed CASE camelCase snake_case kebab-case PascalCase", "URL: https://example.com/a?b=c&d=e",
    "email@example.com, @handle #tag $100 50% ~tilde^caret|pipe`tick",
    "<|im_start|>user not special here<|im_end|>", "<s> </s> <unk> <pad>", "a" * 300,
    " " * 40 + "x", "-" * 80, "=" * 17 + "\n", "\u2581already\u2581escaped", "ℂ ℍ ℕ ℙ ℚ ℝ ℤ",
]


def kiri_tokenize(vocab, texts):
    """(header fields, [(ids, decoded bytes)]) from tokenize_vocab."""
    if not TOOL.exists():
        pytest.fail(f"{TOOL} is not built (cmake --build build --target tokenize_vocab)")
    with tempfile.NamedTemporaryFile(suffix=".inp") as f:
        f.write("".join(t + SEP for t in texts).encode())
        f.flush()
        r = subprocess.run([str(TOOL), str(vocab), f.name], capture_output=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(r.stderr.decode(errors="replace").strip())
    lines = r.stdout.decode().split("\n")
    header = lines[0].split()
    out = []
    for i in range(len(texts)):
        ids_line, text_line = lines[1 + 2 * i], lines[2 + 2 * i]
        assert ids_line.startswith("ids") and text_line.startswith("text ")
        out.append(([int(x) for x in ids_line[3:].split()], bytes.fromhex(text_line[5:])))
    return header, out


def inp_texts(path):
    """The texts of a .inp file, split as llama.cpp's test does (a trailing empty piece dropped)."""
    parts = path.read_text(encoding="utf-8").split(SEP)
    if parts and parts[-1] == "":
        parts.pop()
    return parts


def vocab_dir():
    return llama_cpp_source() / "models"


@pytest.fixture(scope="module")
def models():
    d = vocab_dir()
    found = sorted(p.name[len("ggml-vocab-"):-len(".gguf")] for p in d.glob("ggml-vocab-*.gguf"))
    assert len(found) >= 15, f"too few vocabularies under {d}: {found}"
    return d, found


def test_refused_vocabularies(models):
    d, found = models
    for name, why in REFUSED.items():
        assert name in found
        with pytest.raises(RuntimeError, match=why):
            kiri_tokenize(d / f"ggml-vocab-{name}.gguf", ["x"])


def test_llama_cpp_vectors(models):
    """Every vocabulary that ships .inp/.out vectors and is not refused: exact ids."""
    d, found = models
    checked = []
    for name in found:
        inp, out = d / f"ggml-vocab-{name}.gguf.inp", d / f"ggml-vocab-{name}.gguf.out"
        if name in REFUSED or not inp.exists():
            continue
        texts = inp_texts(inp)
        want = [[int(x) for x in line.split()] for line in out.read_text().split("\n")[:len(texts)]]
        _, got = kiri_tokenize(d / f"ggml-vocab-{name}.gguf", texts)
        bad = [(t, w, g[0]) for t, w, g in zip(texts, want, got) if w != g[0]]
        assert not bad, f"{name}: {len(bad)}/{len(texts)} differ, first: {bad[0]!r}"
        checked.append(name)
    # The families issue 12 names, at least.
    for name in ("deepseek-coder", "deepseek-llm", "falcon", "gemma-4", "phi-3", "command-r",
                 "refact", "starcoder", "qwen35", "mpt", "gpt-2", "llama-bpe", "llama-spm", "qwen2"):
        assert name in checked, f"{name} was not checked"


class Reference:
    """llama.cpp's tokenizer over one vocabulary (llama-cpp-python, vocab only)."""

    def __init__(self, path):
        self.llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        self.vocab = self.llm._model.vocab

    def tokenize(self, text):
        return self.llm.tokenize(text.encode(), add_bos=False, special=False)

    def detokenize(self, ids):
        buf = ctypes.create_string_buffer(1 << 16)
        out = b""
        for i in ids:
            n = llama_cpp.llama_token_to_piece(self.vocab, i, buf, len(buf), 0, False)
            assert 0 <= n <= len(buf)
            out += buf.raw[:n]
        return out

    def add_bos(self):
        return int(llama_cpp.llama_vocab_get_add_bos(self.vocab))

    def bos(self):
        return llama_cpp.llama_vocab_bos(self.vocab)

    def close(self):
        self.llm.close()


def compare_with_llama_cpp(path, texts):
    ref = Reference(path)
    try:
        header, got = kiri_tokenize(path, texts)
        assert int(header[2]) == ref.add_bos(), f"{path.name}: add_bos"
        if ref.add_bos():
            assert int(header[3]) == ref.bos(), f"{path.name}: bos id"
        bad = []
        for text, (ids, dec) in zip(texts, got):
            want = ref.tokenize(text)
            if ids != want:
                bad.append(("tokenize", text, want, ids))
            elif dec != ref.detokenize(want):
                bad.append(("detokenize", text, ref.detokenize(want), dec))
        assert not bad, f"{path.name}: {len(bad)}/{len(texts)} differ, first: {bad[0]!r}"
    finally:
        ref.close()


@pytest.mark.parametrize("name", [
    "llama-spm", "phi-3", "baichuan", "gpt-2", "llama-bpe", "qwen2", "qwen35", "mpt", "gpt-neox",
    "aquila", "falcon", "starcoder", "refact", "command-r", "deepseek-llm", "deepseek-coder",
    "gemma-4",
])
def test_against_llama_cpp(models, name):
    d, _ = models
    path = d / f"ggml-vocab-{name}.gguf"
    inp = d / f"ggml-vocab-{name}.gguf.inp"
    compare_with_llama_cpp(path, TEXTS + (inp_texts(inp) if inp.exists() else []))


def test_gemma3_270m():
    """The published Gemma 3 270M file: a 262k SentencePiece vocabulary with byte fallback."""
    compare_with_llama_cpp(real_model("gemma-3-270m-q4_k_m"), TEXTS)
