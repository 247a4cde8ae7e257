"""Shared fixtures for the `kiri serve` tests (test_server*.py).

A KiriServer is `kiri serve` started on 127.0.0.1 with the bundled stories260K model on a free
port, its log in a file. It is ready when GET /health answers 200, and it must stop cleanly: on
SIGTERM the process exits 0 and its log holds no sanitizer report (so the same tests run against
an ASan/UBSan build: KIRI_BIN=build-asan/kiri).

The binary is KIRI_BIN, else $KIRI_BUILD/kiri (scripts/test.sh sets KIRI_BUILD), else
<repo>/build/kiri; the server tests skip when it is missing or was built without the server.

Fixtures:
  kiri_bin      the binary (session)
  server        one shared default server per test module (--parallel 4)
  start_server  a factory for servers with other flags, stopped (and checked) after the test
  figures       records the fault-case figures ("answered / sent"), printed after the run
  smollm2_instruct  the real SmolLM2-135M-Instruct Q4_1 file (scripts/real_models.py: fetched
                with pip once, cached, sha256 checked); a failed fetch fails the test
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "stories260K.gguf"
MODEL_ID = MODEL.name
START_TIMEOUT_S = 60.0      # a loaded machine can be slow to start a process
STOP_TIMEOUT_S = 40.0       # the server drains for at most 30 s
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "WARNING: ThreadSanitizer", "SUMMARY: UndefinedBehaviorSanitizer")


def kiri_binary() -> Path:
    if os.environ.get("KIRI_BIN"):
        return Path(os.environ["KIRI_BIN"])
    if os.environ.get("KIRI_BUILD"):
        return Path(os.environ["KIRI_BUILD"]) / "kiri"
    return REPO / "build" / "kiri"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- HTTP helpers -------------------------------------------------------------------------------

class Reply:
    """One HTTP answer: status, headers (lower-case names), body bytes, and JSON when it parses."""

    def __init__(self, status, headers, body):
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "<Reply %d %r>" % (self.status, self.body[:300])


def request(port, method, path, body=None, headers=None, timeout=60.0, scheme="http", context=None):
    """One request on a fresh connection. body may be a dict (sent as JSON), str or bytes."""
    if isinstance(body, dict) or isinstance(body, list):
        body = json.dumps(body).encode()
    elif isinstance(body, str):
        body = body.encode()
    h = {"Content-Type": "application/json"} if body is not None else {}
    h.update(headers or {})
    if scheme == "https":
        c = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=context)
    else:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return Reply(r.status, {k.lower(): v for k, v in r.getheaders()}, r.read())
    finally:
        c.close()


def raw_exchange(port, data, timeout=10.0, read_until_close=True):
    """Sends raw bytes and reads until the server closes (or timeout). Returns (bytes, closed,
    seconds until the close or the timeout)."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        try:
            s.sendall(data)
        except OSError:
            pass
        out = b""
        closed = False
        s.settimeout(timeout)
        try:
            while True:
                d = s.recv(65536)
                if not d:
                    closed = True
                    break
                out += d
                if not read_until_close and b"\r\n\r\n" in out:
                    break
        except ConnectionResetError:
            closed = True
        except socket.timeout:
            pass
        return out, closed, time.monotonic() - t0


def status_of(raw: bytes) -> int:
    m = re.match(rb"HTTP/\d\.\d (\d{3}) ", raw)
    return int(m.group(1)) if m else 0


def parse_metrics(text: str) -> dict:
    """Prometheus text -> {'name{labels}': value}."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def sse_events(body: bytes):
    """The data: payloads of a Server-Sent Events body, in order."""
    return [line[6:] for line in body.decode().split("\n\n") if line.startswith("data: ")]


# ---- The server --------------------------------------------------------------------------------

class KiriServer:
    def __init__(self, binary, log_dir, args=(), env=None, model=True, port_flag=True, tls=False, port=None):
        """port: the port the configuration (environment or file) sets, with port_flag False."""
        self.binary = binary
        self.fixed_port = port
        self.args = list(args)
        self.env = dict(os.environ)
        self.env.update(env or {})
        self.model = model
        self.port_flag = port_flag
        self.scheme = "https" if tls else "http"
        self.log_dir = Path(log_dir)
        self.proc = None
        self.port = None
        self.log_path = None
        self.ssl_context = None   # set by TLS tests for readiness checks

    def start(self):
        port = self.fixed_port
        for attempt in range(3):
            self.port = port or free_port()
            self.log_path = self.log_dir / ("kiri-serve-%d.log" % self.port)
            cmd = [str(self.binary), "serve"]
            if self.model:
                cmd += ["-m", str(MODEL)]
            if self.port_flag:
                cmd += ["--host", "127.0.0.1", "--port", str(self.port)]
            if not ({"-t", "--threads"} & set(self.args) or "KIRI_THREADS" in self.env):
                # One compute thread: the model is tiny, and on a machine shared by many jobs a
                # thread pool waiting for descheduled workers makes every step many times slower.
                cmd += ["--threads", "1"]
            cmd += self.args
            self.cmd = cmd
            with open(self.log_path, "wb") as log:
                self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                             env=self.env, cwd=str(self.log_dir))
            if self._wait_ready():
                return self
            if "Address already in use" in self.log() and port is None:
                continue
            break
        raise AssertionError("kiri serve did not become ready: %s\n%s" % (" ".join(cmd), self.log()[-3000:]))

    def _wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                r = request(self.port, "GET", "/health", timeout=2, scheme=self.scheme, context=self.ssl_context)
                if r.status == 200:
                    return True
            except OSError:
                pass
            time.sleep(0.05)
        self.proc.kill()
        self.proc.wait()
        return False

    @property
    def url(self):
        return "%s://127.0.0.1:%d" % (self.scheme, self.port)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def get(self, path, **kw):
        return request(self.port, "GET", path, scheme=self.scheme, context=self.ssl_context, **kw)

    def post(self, path, body, **kw):
        return request(self.port, "POST", path, body, scheme=self.scheme, context=self.ssl_context, **kw)

    def metrics(self, headers=None) -> dict:
        r = self.get("/metrics", headers=headers)
        assert r.status == 200, r
        return parse_metrics(r.body.decode())

    def stop(self, sig=signal.SIGTERM, timeout=STOP_TIMEOUT_S):
        """Signals the server and returns its exit status; kills it after timeout."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError("kiri serve did not exit %.0f s after signal %d\n%s"
                                 % (timeout, sig, self.log()[-3000:]))

    def check_clean_exit(self):
        rc = self.stop()
        log = self.log()
        bad = [m for m in SANITIZER_MARKS if m in log]
        assert not bad, "sanitizer report in the server log:\n" + log[-5000:]
        assert rc == 0, "kiri serve exited with %s\n%s" % (rc, log[-3000:])


@pytest.fixture(scope="session")
def kiri_bin():
    b = kiri_binary()
    if not b.exists():
        pytest.skip("%s is not built (set KIRI_BIN or KIRI_BUILD)" % b)
    r = subprocess.run([str(b), "serve", "--help"], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip("%s was built without the server" % b)
    return b


@pytest.fixture(scope="module")
def server(kiri_bin, tmp_path_factory):
    """The module's shared server: default settings, 4 sequences per batch."""
    s = KiriServer(kiri_bin, tmp_path_factory.mktemp("serve"), ["--parallel", "4"]).start()
    yield s
    s.check_clean_exit()


@pytest.fixture
def start_server(kiri_bin, tmp_path):
    """start_server(args, env=None, model=True, port_flag=True, tls=False, port=None) -> a running
    KiriServer, stopped and checked for a clean exit after the test (unless the test did)."""
    started = []

    def start(args=(), **kw):
        s = KiriServer(kiri_bin, tmp_path, args, **kw)
        started.append(s)
        return s.start()

    yield start
    for s in started:
        if s.proc is not None and s.proc.returncode is None:
            s.check_clean_exit()


def llama_cpp_source() -> Path:
    """The llama.cpp tree llama-cpp-python vendors (scripts/llama_cpp_source.py: the sdist through
    pip, cached, sha256 checked): its vocabularies, tokenizer vectors and chat templates."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "llama_cpp_source.py")],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.fail("cannot fetch the llama.cpp source: %s" % r.stderr.strip())
    return Path(r.stdout.strip())


def real_model(name: str) -> Path:
    """The cached path of one of scripts/real_models.py's models, fetched when missing."""
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "real_models.py"), name],
                       capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.fail("cannot fetch the real model %s: %s" % (name, r.stderr.strip()))
    return Path(r.stdout.strip())


@pytest.fixture(scope="session")
def smollm2_instruct():
    return real_model("smollm2-135m-instruct-q4_1")


def serve_with_client(kiri_bin, model_path, log_dir):
    """Starts `kiri serve` on model_path (2048-token context, 2 threads) and returns the server,
    an `openai` client for it and the served model's id; the caller stops the server."""
    import openai
    s = KiriServer(kiri_bin, log_dir, ["-m", str(model_path), "--ctx", "2048", "--threads", "2"], model=False)
    s.start()
    client = openai.OpenAI(base_url=s.url + "/v1", api_key="none", max_retries=0, timeout=300)
    return s, client, client.models.list().data[0].id


# ---- Fault-case figures --------------------------------------------------------------------------

_FIGURES = []


@pytest.fixture(scope="session")
def figures():
    """figures(case, answered_as_expected, sent, note='') records one row of the report."""
    def add(case, answered, sent, note=""):
        _FIGURES.append((case, answered, sent, note))
    return add


def pytest_terminal_summary(terminalreporter):
    if not _FIGURES:
        return
    terminalreporter.section("kiri serve fault-case figures (answered as expected / sent)")
    for case, answered, sent, note in _FIGURES:
        terminalreporter.write_line("%-46s %4d / %-4d %s" % (case, answered, sent, note))
