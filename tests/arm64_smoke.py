"""Smoke test of the static aarch64 kiri under qemu-aarch64 (run by scripts/test-arm64.sh, not
collected by pytest): the CLI and the server, checked against llama.cpp's recorded greedy outputs
for the bundled stories260K (shared/reference/stories260K-greedy.json).

  python tests/arm64_smoke.py BUILD_DIR

BUILD_DIR holds the aarch64 `kiri`; the script runs it through small wrappers that exec
qemu-aarch64, so the same helpers as the x86 server tests (conftest.py) start and stop it.
Checks:
  - `kiri info` reports the NEON kernels and a statically linked binary runs without a sysroot;
  - `kiri run --temp 0` prints llama.cpp's greedy text for every reference prompt;
  - `kiri serve` over HTTP: /health, /v1/models, a greedy completion equal to llama.cpp's text, a
    streamed completion (SSE ending in [DONE]) with the same text, a 400 for a bad body and the
    next request still served, and a clean exit 0 on SIGTERM;
  - `kiri serve` over HTTPS (mbedTLS) with a certificate from a CA made here: the client verifies
    the chain and the host, a completion comes back, and plain HTTP to the TLS port gets no answer.
"""
import json
import os
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conftest  # noqa: E402  (the server helpers; importing it only defines them)
import make_tiny_models as mtm  # noqa: E402

REFERENCE = Path(mtm.SHARED) / "reference" / "stories260K-greedy.json"


def wrapper(build: Path, tmp: Path, cpu: str) -> Path:
    w = tmp / "kiri"
    w.write_text('#!/bin/sh\nQEMU_CPU=%s exec qemu-aarch64 "%s" "$@"\n' % (cpu, build / "kiri"))
    w.chmod(0o755)
    return w


def check(cond, what):
    if not cond:
        raise AssertionError(what)
    print("ok   %s" % what)


def main():
    build = Path(sys.argv[1] if len(sys.argv) > 1 else "build-arm64").resolve()
    entries = json.loads(REFERENCE.read_text())
    tmp = Path(tempfile.mkdtemp(prefix="kiri-arm64-"))
    kiri = wrapper(build, tmp, os.environ.get("QEMU_CPU", "max"))

    file_out = subprocess.run(["file", "-b", str(build / "kiri")], capture_output=True, text=True).stdout
    check("aarch64" in file_out and "statically linked" in file_out, "kiri is a static aarch64 executable")
    info = subprocess.run([str(kiri), "info"], capture_output=True, text=True, timeout=120)
    check(info.returncode == 0 and "neon" in info.stdout, "kiri info picks the NEON kernels")

    for e in entries:
        r = subprocess.run([str(kiri), "run", "-m", str(conftest.MODEL), "-p", e["prompt"], "-n",
                            str(len(e["output_tokens"])), "--temp", "0"],
                           capture_output=True, timeout=300)
        want = bytes.fromhex(e["output_bytes_hex"]) + b"\n"
        check(r.returncode == 0 and r.stdout == want, "kiri run %r = llama.cpp's greedy text" % e["prompt"][:30])

    e = entries[0]
    n = len(e["output_tokens"])
    body = {"prompt": e["prompt"], "max_tokens": n, "temperature": 0}
    srv = conftest.KiriServer(kiri, tmp).start()
    try:
        check(srv.get("/health").status == 200, "serve: /health 200")
        models = srv.get("/v1/models").json
        check(models["data"][0]["id"] == conftest.MODEL_ID, "serve: /v1/models lists the model")
        r = srv.post("/v1/completions", body)
        check(r.status == 200 and r.json["choices"][0]["text"] == e["output_text"],
              "serve: greedy completion = llama.cpp's text")
        r = srv.post("/v1/completions", dict(body, stream=True))
        events = conftest.sse_events(r.body)
        text = "".join(json.loads(d)["choices"][0]["text"] for d in events[:-1] if json.loads(d)["choices"])
        check(r.status == 200 and events[-1] == "[DONE]" and text == e["output_text"],
              "serve: streamed completion (SSE, [DONE]) = the same text")
        r = srv.post("/v1/completions", "{\"prompt\": ")
        check(r.status == 400 and r.json["error"]["type"] == "invalid_request_error", "serve: bad JSON -> 400")
        check(srv.post("/v1/completions", body).status == 200, "serve: next request served")
    finally:
        rc = srv.stop()
    check(rc == 0, "serve: SIGTERM -> exit 0")

    pki = tmp / "pki"
    pki.mkdir()
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    run = lambda *a: subprocess.run(["openssl", *a], cwd=pki, check=True, capture_output=True)
    run("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=kiri arm64 test CA")
    run("req", *ec, "-keyout", "srv.key", "-out", "srv.csr", "-subj", "/CN=localhost")
    (pki / "srv.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                                 "extendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "srv.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-out", "srv.pem", "-days", "2", "-extfile", "srv.ext")
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    srv = conftest.KiriServer(kiri, tmp, args=["--tls-cert", str(pki / "srv.pem"), "--tls-key",
                                               str(pki / "srv.key")], tls=True)
    srv.ssl_context = ctx
    srv.start()
    try:
        r = conftest.request(srv.port, "POST", "/v1/completions", body, scheme="https", context=ctx)
        check(r.status == 200 and r.json["choices"][0]["text"] == e["output_text"],
              "serve over TLS: verified chain and host, greedy completion = llama.cpp's text")
        raw, closed, _ = conftest.raw_exchange(srv.port, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=10)
        check(conftest.status_of(raw) == 0, "serve over TLS: plain HTTP gets no HTTP answer")
        r = conftest.request(srv.port, "GET", "/health", scheme="https", context=ctx)
        check(r.status == 200, "serve over TLS: still serving after the plain-HTTP attempt")
    finally:
        rc = srv.stop()
    check(rc == 0, "serve over TLS: SIGTERM -> exit 0")
    print("arm64 smoke: all checks passed")


if __name__ == "__main__":
    main()
