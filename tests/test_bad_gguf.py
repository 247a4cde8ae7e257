"""Runs `kiri info -m FILE` on every file of the malformed-GGUF corpus (tests/bad_gguf.py, cases
G01-G40: malformed headers, metadata, tensor infos, data sections and model contents) and checks
the contract:

- a rejected file makes kiri exit with status 1 (never a signal, never 134/139), within 5 s,
  printing one stderr line that contains "error" and the manifest's substring;
- an accepted file makes it exit 0;
- "any" files (the loader may reject, or accept with a warning) exit 0 or 1, never crash.

KIRI_BIN names the binary (default <repo>/build/kiri); the tests are skipped when it is missing.
KIRI_SHARED_DIR or KIRI_STORIES_GGUF locate stories260K.gguf (default <repo>/../shared).
"""
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True   # keep the source tree clean

import bad_gguf  # noqa: E402

KIRI_BIN = os.environ.get("KIRI_BIN", os.path.join(REPO, "build", "kiri"))
TIMEOUT_S = 5


def _manifest(directory):
    rows = []
    with open(os.path.join(directory, "expected.tsv")) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            name, expect, sub = (line.rstrip("\n").split("\t") + ["", ""])[:3]
            rows.append((name, expect, sub))
    return rows


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    if not os.path.exists(bad_gguf.DEFAULT_MODEL):
        pytest.skip("stories260K.gguf not found at %s" % bad_gguf.DEFAULT_MODEL)
    out = tmp_path_factory.mktemp("bad_gguf")
    assert bad_gguf.main(["bad_gguf.py", str(out)]) == 0
    return str(out)


def _case_names():
    # Names only, so collection does not need the model file or the corpus on disk.
    if not os.path.exists(bad_gguf.DEFAULT_MODEL):
        return ["(model missing)"]
    return [name for name, _, _, _ in bad_gguf.cases()]


def test_manifest_covers_every_row(corpus):
    rows = _manifest(corpus)
    names = [r[0] for r in rows]
    assert len(names) == len(set(names))
    for r in range(1, 41):
        assert any(n.startswith("G%02d-" % r) for n in names), "no case for row G%02d" % r
    for name, expect, _ in rows:
        assert expect in ("reject", "accept", "any"), name
        assert os.path.exists(os.path.join(corpus, name)), name


def test_generator_round_trips_stories(corpus):
    # The corpus is only as good as its writer: re-serialising the original must reproduce it.
    with open(bad_gguf.DEFAULT_MODEL, "rb") as f:
        orig = f.read()
    assert bad_gguf.write_gguf(bad_gguf.read_gguf(orig)) == orig


@pytest.mark.parametrize("name", _case_names())
def test_kiri_info(corpus, name):
    if not os.path.exists(KIRI_BIN):
        pytest.skip("%s not built (set KIRI_BIN)" % KIRI_BIN)
    expect = {n: (e, s) for n, e, s in _manifest(corpus)}
    assert name in expect, "case missing from expected.tsv"
    want, sub = expect[name]
    path = os.path.join(corpus, name)
    try:
        proc = subprocess.run([KIRI_BIN, "info", "-m", path], stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail("%s: kiri info did not finish within %d s" % (name, TIMEOUT_S))
    err = proc.stderr.decode("utf-8", "replace")
    rc = proc.returncode
    # A negative code is a signal; 134/139 are abort/segfault as reported through a shell.
    assert rc >= 0 and rc not in (134, 139), "%s: crashed (status %d)\n%s" % (name, rc, err)
    if want == "accept":
        assert rc == 0, "%s: expected success, got status %d\n%s" % (name, rc, err)
    elif want == "any":
        assert rc in (0, 1), "%s: status %d\n%s" % (name, rc, err)
    else:
        assert rc == 1, "%s: expected status 1, got %d\n%s" % (name, rc, err)
        lines = [l for l in err.splitlines() if "error" in l.lower()]
        assert len(lines) == 1, "%s: want one error line on stderr, got:\n%s" % (name, err)
        assert sub in lines[0], "%s: error line lacks %r:\n%s" % (name, sub, lines[0])
