#!/usr/bin/env python3
"""Fetches the llama.cpp source that llama-cpp-python vendors (its sdist, from PyPI through pip) and
unpacks it into a cache outside the repo. Tests read its reference data: the vocabulary files and
tokenizer vectors under models/ (ggml-vocab-*.gguf with .inp/.out), the chat templates under
models/templates/. The benches build llama.cpp's own tools from it.

    scripts/llama_cpp_source.py          prints the path of the unpacked llama.cpp tree

The version is pinned to the llama-cpp-python the test venv installs, so the logits reference and
this source are one llama.cpp. The archive's sha256 is checked. The cache is
$KIRI_PEER_CACHE, else a folder `peer` beside real_models.py's model cache
(~/.cache/kiri/peer). Exit status 0 with the path on stdout, else non-zero
with the reason on stderr.
"""
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402  (the cache root and the digest, shared)

VERSION = "0.3.36"
SDIST = f"llama_cpp_python-{VERSION}.tar.gz"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"


def cache_dir() -> Path:
    d = os.environ.get("KIRI_PEER_CACHE")
    return Path(d) if d else real_models.cache_dir().parent / "peer"


def fetch_archive(d: Path) -> Path:
    dest = d / SDIST
    for _ in range(2):
        if not dest.exists():
            with tempfile.TemporaryDirectory(prefix="kiri-sdist-", dir=d) as tmp:
                cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                       "-d", tmp, f"llama-cpp-python=={VERSION}"]
                subprocess.run(cmd, check=True, stdout=sys.stderr)
                got = Path(tmp) / SDIST
                if not got.exists():
                    raise RuntimeError(f"pip download did not produce {SDIST}")
                got.rename(dest)
        if real_models.sha256_of(dest) == SHA256:
            return dest
        dest.unlink()
    raise RuntimeError(f"{SDIST}: sha256 does not match {SHA256} after a fresh download")


def source_path() -> Path:
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    tree = d / f"llama_cpp_python-{VERSION}" / "vendor" / "llama.cpp"
    done = d / f"llama_cpp_python-{VERSION}.unpacked"
    if done.exists() and tree.is_dir():
        return tree
    archive = fetch_archive(d)
    shutil.rmtree(d / f"llama_cpp_python-{VERSION}", ignore_errors=True)
    with tarfile.open(archive) as t:
        t.extractall(d, filter="data")
    if not tree.is_dir():
        raise RuntimeError(f"{SDIST} holds no vendor/llama.cpp")
    done.write_text(SHA256 + "\n")
    return tree


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    try:
        print(source_path())
    except (RuntimeError, subprocess.CalledProcessError, OSError, tarfile.TarError) as e:
        print(f"llama_cpp_source: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
