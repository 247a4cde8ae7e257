"""TLS tests for the CivetWeb + mbedTLS stack kiri links statically (scripts/build-deps.sh).

CivetWeb 1.16 in its mbedTLS mode runs the server handshake on a non-blocking socket and calls
mbedtls_ssl_handshake() again at once whenever it wants to read: one idle TCP connection to the
TLS port keeps a worker spinning on a whole core for ever. scripts/patches/civetweb-mbedtls-
handshake-wait.patch makes the handshake wait on the socket and give up after the request
timeout, and civetweb-mbedtls-tls-policy.patch restricts it to TLS 1.2+ with forward-secret AEAD
suites (CivetWeb ignores its own protocol and cipher options in mbedTLS mode). These tests drive
tests/tools/tls_echo_server.c, compiled here against the built static libraries, and check that:
  1. a Python ssl client gets 200 from GET /health over TLS 1.2 and over TLS 1.3, with a modern
     cipher suite, and that suites without forward secrecy or AEAD are refused;
  2. plain HTTP sent to the TLS port is refused cleanly: no HTTP answer, the connection closed;
  3. with 20 idle TCP connections and 20 half-open handshakes (half a ClientHello, then silence)
     held open, the server's CPU time over 5 s stays near zero, and a good client still gets its
     answer within 1 s;
  4. the server closes every stalled connection once the request timeout has passed, and not
     before, and stops promptly while handshakes are stalled.
The control test runs scenario 3 against CivetWeb built without kiri's patches
(build/deps/unpatched-civetweb) and expects the CPU to burn, which shows scenario 3 detects the
spin. Certificates come from the openssl command-line tool.

Skips only when build/deps has not been built. Stdlib only; run with
  python3 -m pytest -q tests/test_tls_handshake.py      (add -s for the measurements)
KIRI_DEPS_DIR overrides the install folder (default build/deps/install), CC the compiler; e.g.
  CC="musl-gcc -static" KIRI_DEPS_DIR=build/deps/install-musl python3 -m pytest ...
runs everything against a fully static musl server, and
  CC="aarch64-linux-gnu-gcc -static" KIRI_EMULATOR=qemu-aarch64 \
  KIRI_DEPS_DIR=build/deps/install-arm64 python3 -m pytest ...
against the arm64 build under qemu (KIRI_EMULATOR runs the server).
"""
import os
import selectors
import shlex
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DEPS = REPO / "build" / "deps" / "install"
DEPS = Path(os.environ.get("KIRI_DEPS_DIR", DEFAULT_DEPS))
UNPATCHED = REPO / "build" / "deps" / "unpatched-civetweb"   # native build only
EMULATOR = shlex.split(os.environ.get("KIRI_EMULATOR", ""))  # e.g. qemu-aarch64 for arm64
SERVER_SRC = REPO / "tests" / "tools" / "tls_echo_server.c"

REQUEST_TIMEOUT_MS = 8000   # the server's request_timeout_ms, which bounds a handshake
N_IDLE = 20                 # TCP connections that never send a byte
N_HALF_OPEN = 20            # connections that send half a ClientHello, then nothing
CPU_WINDOW_S = 5.0          # how long the server's CPU time is watched
CPU_IDLE_LIMIT_S = 0.25     # "near zero": the patched server uses a few milliseconds
CPU_SPIN_MIN_S = 0.5        # the unpatched server burns whole cores: several seconds on an idle
                            # machine, still well over this on a loaded one
GOOD_CLIENT_LIMIT_S = 1.0

MODERN_SUITES = {
    "TLS_AES_256_GCM_SHA384", "TLS_AES_128_GCM_SHA256", "TLS_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256",
    "ECDHE-ECDSA-CHACHA20-POLY1305",
}

if not (DEPS / "lib" / "libcivetweb.a").exists():
    pytest.skip(f"{DEPS} has no TLS libraries: run scripts/build-deps.sh", allow_module_level=True)


# ---- Building and running the server ----------------------------------------------------------

def compile_server(civetweb_dir: Path, out: Path) -> Path:
    """Links tls_echo_server against civetweb_dir's CivetWeb and DEPS's mbedTLS."""
    lib = DEPS / "lib"
    cmd = [*shlex.split(os.environ.get("CC", "cc")), "-std=c11", "-O2", "-Wall", "-Wextra",
           "-D_GNU_SOURCE", f"-I{civetweb_dir / 'include'}", "-o", str(out), str(SERVER_SRC),
           str(civetweb_dir / "lib" / "libcivetweb.a"), str(lib / "libmbedtls.a"),
           str(lib / "libmbedx509.a"), str(lib / "libmbedcrypto.a"), "-lpthread"]
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if r.returncode != 0:
        pytest.fail(f"cannot build tls_echo_server:\n{' '.join(cmd)}\n{r.stderr}")
    return out


def make_cert(d: Path, name: str, keyargs):
    """A self-signed certificate for localhost: (server PEM holding the certificate and then
    its key, the certificate alone for clients to trust)."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", *keyargs, "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=DNS:localhost,IP:127.0.0.1",
                    "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.crt")],
                   check=True, capture_output=True)
    pem = d / f"{name}.pem"
    pem.write_bytes((d / f"{name}.crt").read_bytes() + (d / f"{name}.key").read_bytes())
    return pem, d / f"{name}.crt"


@pytest.fixture(scope="module")
def certdir(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command-line tool is needed to make the test certificates "
                    "(Debian package openssl)")
    return tmp_path_factory.mktemp("certs")


@pytest.fixture(scope="module")
def certs(certdir):
    """P-256 ECDSA."""
    return make_cert(certdir, "ec", ["ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"])


@pytest.fixture(scope="module")
def rsa_certs(certdir):
    """RSA 2048: with an RSA key a server could also offer suites without forward secrecy."""
    return make_cert(certdir, "rsa", ["rsa:2048"])


@pytest.fixture(scope="module")
def patched_binary(tmp_path_factory):
    return compile_server(DEPS, tmp_path_factory.mktemp("bin") / "tls_echo_server")


class Server:
    """A running tls_echo_server; closing its stdin asks it to stop."""

    def __init__(self, binary, pem, timeout_ms=REQUEST_TIMEOUT_MS, threads=50):
        # CivetWeb logs to stderr; a file, unlike a pipe nobody reads, never fills up.
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([*EMULATOR, str(binary), str(pem), str(timeout_ms),
                                      str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log)
        line = self.proc.stdout.readline().decode()
        if not line.startswith("port "):
            self.kill()
            pytest.fail(f"server did not start: {line!r} {self.stderr()}")
        self.port = int(line.split()[1])

    def stderr(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def cpu_seconds(self) -> float:
        """User plus system time of all the server's threads, from /proc/<pid>/stat."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def runnable_threads(self) -> int:
        """Threads running or waiting for a CPU (state R). A thread that waits on a socket
        sleeps (S); a spinning one is always R, however busy the machine is."""
        n = 0
        for task in Path(f"/proc/{self.proc.pid}/task").iterdir():
            try:
                stat = (task / "stat").read_text()
            except OSError:
                continue
            n += stat[stat.rindex(")") + 2] == "R"
        return n

    def stop(self, timeout) -> float:
        """Closes stdin and returns how long the server took to exit (inf if it did not)."""
        t0 = time.monotonic()
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
            return time.monotonic() - t0
        except subprocess.TimeoutExpired:
            return float("inf")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout, self.log):
            f.close()


@pytest.fixture(scope="module")
def server(patched_binary, certs):
    s = Server(patched_binary, certs[0])
    yield s
    s.kill()


# ---- Clients ----------------------------------------------------------------------------------

def client_context(cafile, version=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(cafile))
    if version is not None:
        ctx.minimum_version = ctx.maximum_version = version
    return ctx


def https_get(port, ctx, path="/health", timeout=5.0):
    """One HTTPS request; returns (status line, body, TLS version, cipher suite)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
                      .encode())
            data = b""
            while chunk := s.recv(4096):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            return head.split(b"\r\n")[0].decode(), body, s.version(), s.cipher()[0]


def client_hello() -> bytes:
    """The first flight of a real TLS client, made without a socket."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="localhost")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


def open_stalled(port):
    """N_IDLE silent connections and N_HALF_OPEN that stop half-way through the ClientHello."""
    hello = client_hello()
    socks = []
    for i in range(N_IDLE + N_HALF_OPEN):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i >= N_IDLE:
            s.sendall(hello[:len(hello) // 2])
        s.setblocking(False)
        socks.append(s)
    return socks


def still_open(s) -> bool:
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


def stalled_scenario(srv: Server, cafile):
    """Holds the stalled connections open for CPU_WINDOW_S with a good request in the middle.
    Returns (CPU seconds used, most runnable threads seen, good client's latency or None,
    stalled sockets still open at the end, the sockets, the time they were opened)."""
    opened = time.monotonic()
    socks = open_stalled(srv.port)
    time.sleep(0.5)                      # let the server accept and start every handshake
    cpu0, t0 = srv.cpu_seconds(), time.monotonic()
    runnable = 0

    def watch(until):
        nonlocal runnable
        while time.monotonic() < until:
            runnable = max(runnable, srv.runnable_threads())
            time.sleep(0.25)

    watch(t0 + CPU_WINDOW_S / 2)
    latency = None
    try:
        g0 = time.monotonic()
        status, _, _, _ = https_get(srv.port, client_context(cafile), timeout=10)
        if status.endswith("200 OK"):
            latency = time.monotonic() - g0
    except OSError:
        pass
    watch(t0 + CPU_WINDOW_S)
    cpu = srv.cpu_seconds() - cpu0
    n_open = sum(still_open(s) for s in socks)
    return cpu, runnable, latency, n_open, socks, opened


# ---- 1. Good clients, modern suites only ------------------------------------------------------

@pytest.mark.parametrize("version", [ssl.TLSVersion.TLSv1_2, ssl.TLSVersion.TLSv1_3],
                         ids=["TLSv1.2", "TLSv1.3"])
def test_health_over_tls(server, certs, version):
    status, body, got_version, suite = https_get(server.port, client_context(certs[1], version))
    assert status == "HTTP/1.1 200 OK"
    assert body == b"ok\n"
    assert got_version == {ssl.TLSVersion.TLSv1_2: "TLSv1.2",
                           ssl.TLSVersion.TLSv1_3: "TLSv1.3"}[version]
    assert suite in MODERN_SUITES


@pytest.fixture(scope="module")
def rsa_server(patched_binary, rsa_certs):
    s = Server(patched_binary, rsa_certs[0])
    yield s
    s.kill()


def test_health_over_tls_rsa(rsa_server, rsa_certs):
    status, _, _, suite = https_get(rsa_server.port,
                                    client_context(rsa_certs[1], ssl.TLSVersion.TLSv1_2))
    assert status == "HTTP/1.1 200 OK"
    assert suite in {"ECDHE-RSA-AES256-GCM-SHA384", "ECDHE-RSA-AES128-GCM-SHA256",
                     "ECDHE-RSA-CHACHA20-POLY1305"}


# Each list holds suites mbedTLS's default preset accepts with that key type.
@pytest.mark.parametrize("key,suites", [
    ("ec", "ECDHE-ECDSA-AES128-SHA256:ECDHE-ECDSA-AES256-SHA384"),   # CBC, no AEAD
    ("ec", "ECDHE-ECDSA-AES128-SHA:ECDHE-ECDSA-AES256-SHA"),         # CBC with SHA-1
    ("ec", "ECDHE-ECDSA-AES128-CCM:ECDHE-ECDSA-ARIA128-GCM-SHA256"), # AEAD, not in kiri's list
    ("rsa", "ECDHE-RSA-AES128-SHA256:ECDHE-RSA-AES128-SHA"),         # CBC, no AEAD
    ("rsa", "AES128-GCM-SHA256:AES256-GCM-SHA384"),                  # RSA key transport, no PFS
    ("rsa", "AES128-SHA:AES256-SHA256"),                             # both
], ids=["ec-cbc-sha2", "ec-cbc-sha1", "ec-ccm-aria", "rsa-cbc", "rsa-no-pfs", "rsa-cbc-no-pfs"])
def test_weak_suites_refused(request, key, suites):
    srv = request.getfixturevalue("server" if key == "ec" else "rsa_server")
    ca = request.getfixturevalue("certs" if key == "ec" else "rsa_certs")[1]
    ctx = client_context(ca, ssl.TLSVersion.TLSv1_2)
    ctx.set_ciphers(suites + ":@SECLEVEL=0")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        https_get(srv.port, ctx)


# ---- 2. Plain HTTP on the TLS port ------------------------------------------------------------

def test_plain_http_refused(server, certs):
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as s:
        t0 = time.monotonic()
        s.sendall(b"GET /health HTTP/1.1\r\nHost: localhost\r\n\r\n")
        data = b""
        try:
            while chunk := s.recv(4096):
                data += chunk
        except ConnectionResetError:
            pass
        closed_after = time.monotonic() - t0
    assert not data.startswith(b"HTTP/"), data
    assert len(data) < 64, data              # at most a TLS alert
    assert closed_after < 2.0
    status, _, _, _ = https_get(server.port, client_context(certs[1]))
    assert status == "HTTP/1.1 200 OK"


# ---- 3 and 4. Idle and half-open connections --------------------------------------------------

def test_stalled_handshakes_cost_no_cpu_and_time_out(patched_binary, certs):
    srv = Server(patched_binary, certs[0])
    socks = []
    try:
        cpu, runnable, latency, n_open, socks, opened = stalled_scenario(srv, certs[1])
        print(f"\n{DEPS}: {cpu:.3f} s CPU in {CPU_WINDOW_S:.0f} s with "
              f"{N_IDLE} idle + {N_HALF_OPEN} half-open connections, at most {runnable} "
              f"threads runnable; good client "
              f"{'failed' if latency is None else f'{latency * 1000:.0f} ms'}")
        assert cpu < CPU_IDLE_LIMIT_S
        assert latency is not None and latency < GOOD_CLIENT_LIMIT_S
        # They must still be open: a server that dropped them at once would pass the CPU check
        # without waiting on anything.
        assert n_open == len(socks)

        # Every stalled connection is closed by the server once the handshake timeout passes.
        sel = selectors.DefaultSelector()
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        closed_at = {}
        deadline = opened + REQUEST_TIMEOUT_MS / 1000 + 3.0
        while len(closed_at) < len(socks) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.2):
                try:
                    eof = key.fileobj.recv(4096) == b""
                except BlockingIOError:
                    continue
                except OSError:
                    eof = True
                if eof:
                    closed_at[key.fileobj] = time.monotonic() - opened
                    sel.unregister(key.fileobj)
        sel.close()
        if closed_at:
            print(f"stalled connections closed after {min(closed_at.values()):.1f}"
                  f"-{max(closed_at.values()):.1f} s (request timeout "
                  f"{REQUEST_TIMEOUT_MS / 1000:.0f} s)")
        assert len(closed_at) == len(socks), f"{len(socks) - len(closed_at)} never closed"
        assert min(closed_at.values()) > REQUEST_TIMEOUT_MS / 1000 - 1.0
        status, _, _, _ = https_get(srv.port, client_context(certs[1]))
        assert status == "HTTP/1.1 200 OK"
    finally:
        for s in socks:
            s.close()
        srv.kill()


def test_stop_not_delayed_by_stalled_handshakes(patched_binary, certs):
    # CivetWeb polls in slices of at most 2 s and checks its stop flag between them.
    srv = Server(patched_binary, certs[0], timeout_ms=60000)
    socks = []
    try:
        socks = open_stalled(srv.port)
        time.sleep(0.5)
        took = srv.stop(timeout=10)
        assert took < 4.0, "server did not stop while handshakes were stalled"
        assert srv.proc.stdout.read().decode().strip() == "stopped"
        assert srv.proc.returncode == 0
    finally:
        for s in socks:
            s.close()
        srv.kill()


# ---- Control: the same scenario catches the spin ----------------------------------------------

def test_control_unpatched_civetweb_spins(certs, tmp_path):
    if DEPS != DEFAULT_DEPS:
        pytest.skip("the unpatched control exists for the native build only")
    if not (UNPATCHED / "lib" / "libcivetweb.a").exists():
        pytest.skip(f"{UNPATCHED} absent: scripts/build-deps.sh builds it for native builds")
    srv = Server(compile_server(UNPATCHED, tmp_path / "tls_echo_server_unpatched"), certs[0])
    socks = []
    try:
        cpu, runnable, latency, _, socks, _ = stalled_scenario(srv, certs[1])
        print(f"\nunpatched control: {cpu:.3f} s CPU in {CPU_WINDOW_S:.0f} s, at most "
              f"{runnable} threads runnable; good client "
              f"{'failed' if latency is None else f'{latency * 1000:.0f} ms'}")
        # Both signs of the spin: CPU burnt, and a runnable thread per stalled connection.
        assert cpu > CPU_SPIN_MIN_S, "the scenario no longer shows the handshake spin"
        assert runnable >= N_IDLE + N_HALF_OPEN
    finally:
        for s in socks:
            s.close()
        srv.kill()    # its spinning workers never see the stop flag, so mg_stop would hang
