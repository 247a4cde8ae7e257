"""Fleet sync end to end: signed manifests, verified resumable downloads and OCI pulls by the
`kiri` binary against real servers on 127.0.0.1, all over TLS with certificates made here by the
openssl command-line tool:
  - nginx (Debian's package, run unprivileged from a config written here: no master process, no
    daemon, logs in the test folder) serves signed manifests and the bundled stories260K model,
    rate-limited paths, redirect loops and chains, and ports whose certificates are for another
    host, from another CA, self-signed, expired or not yet valid;
  - a Python TLS server injects faults nginx cannot script: 503/429 with Retry-After then
    success, a connection reset mid-body, bodies that never end, a larger declared length, a
    one-byte-at-a-time drip;
  - Debian's docker-registry (the CNCF distribution registry 2.8) over TLS, filled through the
    registry HTTP API by this file's own client (blob upload POST + PUT, manifest PUT), and a
    second one with token auth whose tokens (RS256 JWTs signed with the openssl CLI) come from a
    small Python token server.
Every fleet failure case of docs/fleet.md ("Failure behaviour") is driven: F01-F15 and F20. After
every failure the installed model must have the hash it had before, the stored high-water mark
must not have moved, and no *.partial/*.new file may remain unless resuming is the point.
Figures ("answered as expected / sent") are printed at the end of the run.

The binary is KIRI_BIN, else $KIRI_BUILD/kiri, else build/kiri; the tests skip when it has no
fleet commands, when nginx/docker-registry/openssl are missing (scripts/install-deps.sh installs
them), and the tmpfs cases skip when mount is not permitted.
"""
import base64
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import SANITIZER_MARKS, free_port, kiri_binary

REPO = Path(__file__).resolve().parent.parent
MODEL = REPO / "models" / "stories260K.gguf"
MODEL_BYTES = MODEL.read_bytes()
MODEL_SHA = hashlib.sha256(MODEL_BYTES).hexdigest()
MODEL_SIZE = len(MODEL_BYTES)
FAST = ["--backoff", "0.05", "--backoff-max", "0.5"]   # retries without long waits


def sha_of(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def leftovers(d):
    return sorted(p.name for p in Path(d).iterdir() if p.name.endswith((".partial", ".new", ".link")))


def wait_port(port, timeout=30.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    raise AssertionError("nothing listens on port %d" % port)


# ---- The binary -----------------------------------------------------------------------------------

def need(tool):
    if not shutil.which(tool) and not Path("/usr/sbin/" + tool).exists():
        pytest.skip("%s is not installed (scripts/install-deps.sh installs it)" % tool)


@pytest.fixture(scope="module")
def kiri():
    b = kiri_binary()
    if not b.exists():
        pytest.skip("%s is not built" % b)
    if subprocess.run([str(b), "fleet", "--help"], capture_output=True).returncode != 0:
        pytest.skip("%s was built without the fleet (needs the TLS libraries)" % b)
    need("openssl")

    def run(*args, timeout=180, check=None):
        r = subprocess.run([str(b), *map(str, args)], capture_output=True, text=True, timeout=timeout)
        bad = [m for m in SANITIZER_MARKS if m in r.stderr]
        assert not bad, "sanitizer report from kiri %s:\n%s" % (" ".join(map(str, args)), r.stderr[-5000:])
        if check is not None:
            assert r.returncode == check, "kiri %s -> %d\n%s" % (" ".join(map(str, args)), r.returncode, r.stderr[-3000:])
        return r
    run.path = b
    return run


def report(r):
    """The --json report a sync or pull printed."""
    line = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else "{}"
    return json.loads(line)


# ---- Certificates -----------------------------------------------------------------------------------

def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


class PKI:
    """A test CA and certificates: srv (localhost + 127.0.0.1), wronghost (other.example), wrongca
    (localhost, signed by another CA), selfsigned, expired and future (localhost, by the CA)."""

    def __init__(self, d):
        self.d = Path(d)
        d = self.d
        d.mkdir(parents=True, exist_ok=True)
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        for ca in ("ca", "otherca"):
            openssl("req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "30",
                    "-subj", "/CN=kiri fleet test %s" % ca, cwd=d)
        (d / "ca.cnf").write_text(
            "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\n"
            "default_md = sha256\npolicy = any\ncopy_extensions = none\nunique_subject = no\n[any]\ncommonName = supplied\n")
        (d / "index.txt").write_text("")
        (d / "serial").write_text("1000\n")
        for name, cn, san in (("srv", "localhost", "DNS:localhost,IP:127.0.0.1"),
                              ("wronghost", "other.example", "DNS:other.example"),
                              ("wrongca", "localhost", "DNS:localhost,IP:127.0.0.1"),
                              ("selfsigned", "localhost", "DNS:localhost,IP:127.0.0.1"),
                              ("expired", "localhost", "DNS:localhost,IP:127.0.0.1"),
                              ("future", "localhost", "DNS:localhost,IP:127.0.0.1")):
            (d / (name + ".ext")).write_text("subjectAltName=%s\nbasicConstraints=CA:FALSE\n"
                                             "extendedKeyUsage=serverAuth\n" % san)
            if name == "selfsigned":
                openssl("req", "-x509", *ec, "-keyout", name + ".key", "-out", name + ".pem", "-days", "30",
                        "-subj", "/CN=" + cn, "-addext", "subjectAltName=" + san, cwd=d)
                continue
            openssl("req", *ec, "-keyout", name + ".key", "-out", name + ".csr", "-subj", "/CN=" + cn, cwd=d)
            if name in ("expired", "future"):
                start, end = (("20200101000000Z", "20200201000000Z") if name == "expired"
                              else ("20990101000000Z", "20991231000000Z"))
                openssl("ca", "-batch", "-config", "ca.cnf", "-cert", "ca.pem", "-keyfile", "ca.key",
                        "-in", name + ".csr", "-out", name + ".pem", "-startdate", start, "-enddate", end,
                        "-extfile", name + ".ext", "-notext", cwd=d)
            else:
                ca = "otherca" if name == "wrongca" else "ca"
                openssl("x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
                        "-CAcreateserial", "-out", name + ".pem", "-days", "30", "-extfile", name + ".ext", cwd=d)
        self.ca = d / "ca.pem"

    def context(self, name="srv"):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.d / (name + ".pem"), self.d / (name + ".key"))
        return ctx


# ---- nginx ------------------------------------------------------------------------------------------

class Nginx:
    """nginx on free ports: main (srv cert) serving www/, plus one port per bad certificate."""
    BAD = ("wronghost", "wrongca", "selfsigned", "expired", "future")

    def __init__(self, d, pki, port=None):
        self.d = Path(d)
        self.www = self.d / "www"
        self.www.mkdir(parents=True, exist_ok=True)
        (self.d / "tmp").mkdir(exist_ok=True)
        self.pki = pki
        self.port = port or free_port()
        self.ports = {name: free_port() for name in self.BAD}
        self.proc = None

    def conf(self):
        d, k = self.d, self.pki.d
        tls = lambda name: "ssl_certificate %s/%s.pem; ssl_certificate_key %s/%s.key;" % (k, name, k, name)
        chain = "\n".join("    location = /c%d { return 302 /c%d; }" % (i, i + 1) for i in range(1, 6))
        bad = "\n".join("  server { listen 127.0.0.1:%d ssl; %s root %s; }" % (p, tls(n), self.www)
                        for n, p in self.ports.items())
        return """daemon off; master_process off; pid %(d)s/nginx.pid; error_log %(d)s/error.log warn;
events { worker_connections 256; }
http {
  log_format fleet '$request_method $uri $status $body_bytes_sent "$http_range"';
  access_log %(d)s/access.log fleet;
  client_body_temp_path %(d)s/tmp; proxy_temp_path %(d)s/tmp; fastcgi_temp_path %(d)s/tmp;
  uwsgi_temp_path %(d)s/tmp; scgi_temp_path %(d)s/tmp;
  default_type application/octet-stream;
  server {
    listen 127.0.0.1:%(port)d ssl; %(tls)s root %(www)s;
    location /slow/ { alias %(www)s/; limit_rate 150k; }
    location = /loop1 { return 302 /loop2; }
    location = /loop2 { return 302 /loop1; }
    location = /to-http { return 302 http://localhost:%(port)d/stories260K.gguf; }
    location = /to-ip { return 302 https://127.0.0.1:%(port)d/stories260K.gguf; }
%(chain)s
    location = /c6 { return 302 /stories260K.gguf; }
  }
%(bad)s
}
""" % dict(d=d, port=self.port, tls=tls("srv"), www=self.www, chain=chain, bad=bad)

    def start(self):
        (self.d / "nginx.conf").write_text(self.conf())
        self.log_file = open(self.d / "nginx.out", "ab")
        nginx = shutil.which("nginx") or "/usr/sbin/nginx"
        self.proc = subprocess.Popen([nginx, "-c", str(self.d / "nginx.conf"), "-p", str(self.d)],
                                     stdout=self.log_file, stderr=self.log_file)
        wait_port(self.port)
        return self

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def url(self, path, host="localhost", port=None):
        return "https://%s:%d/%s" % (host, port or self.port, path.lstrip("/"))

    def access(self):
        """[(method, uri, status, bytes, range)] from the access log, once it has stopped growing
        for 0.3 s (nginx writes a line when it finishes a request, which can be after the client
        has gone)."""
        out = []
        p = self.d / "access.log"
        size, still, end = -1, time.monotonic(), time.monotonic() + 5
        while time.monotonic() < end:
            now = p.stat().st_size if p.exists() else 0
            if now != size:
                size, still = now, time.monotonic()
            elif time.monotonic() - still >= 0.3:
                break
            time.sleep(0.05)
        if p.exists():
            for line in p.read_text().splitlines():
                m, uri, st, n, rng = line.split(" ", 4)
                out.append((m, uri, int(st), int(n), rng.strip('"')))
        return out


# ---- A fault-injecting TLS server ---------------------------------------------------------------------

class FaultServer:
    """GET server with a script of actions per path (consumed one per request, then "ok"):
    ("ok",) serves the file with Range support; ("status", code, retry_after|None);
    ("cut", n) sends n body bytes after a full-length head, then resets the connection;
    ("endless", prefix) sends prefix then garbage with no length; ("chunked_endless", prefix)
    the same in chunks; ("declare", n) declares Content-Length n; ("drip", seconds) sends one byte
    per interval; ("silent",) sends the head and then nothing."""

    def __init__(self, ctx, files):
        self.files = dict(files)
        self.plans = {}
        self.log = []
        self.lock = threading.Lock()
        owner = self

        class H(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def finish(self):
                try:
                    super().finish()
                except (OSError, ValueError):
                    pass

            def do_GET(self):
                owner.handle(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path):
        return "https://localhost:%d/%s" % (self.port, path.lstrip("/"))

    def plan(self, path, *actions):
        with self.lock:
            self.plans[path] = list(actions)
            self.log = [e for e in self.log if e[0] != path]

    def requests(self, path):
        return [e for e in self.log if e[0] == path]

    def handle(self, h):
        path = h.path.split("?")[0]
        with self.lock:
            plan = self.plans.get(path, [])
            action = plan.pop(0) if plan else ("ok",)
            self.log.append((path, h.headers.get("Range"), action[0]))
        data = self.files.get(path)
        if data is None:
            h.send_response(404)
            h.send_header("Content-Length", "0")
            h.end_headers()
            return
        kind = action[0]
        if kind == "status":
            h.send_response(action[1])
            if action[2] is not None:
                h.send_header("Retry-After", str(action[2]))
            h.send_header("Content-Length", "0")
            h.send_header("Connection", "close")
            h.end_headers()
            return
        start = 0
        rng = h.headers.get("Range")
        if rng and rng.startswith("bytes=") and kind != "endless":
            start = int(rng[6:].split("-")[0])
        try:
            if kind in ("endless", "chunked_endless"):
                h.send_response(200)
                h.send_header("Connection", "close")
                if kind == "chunked_endless":
                    h.send_header("Transfer-Encoding", "chunked")
                h.end_headers()
                sent, prefix = 0, action[1]
                while sent < 64 << 20:
                    piece = prefix[sent:sent + 65536] if sent < len(prefix) else os.urandom(65536)
                    if kind == "chunked_endless":
                        h.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
                    else:
                        h.wfile.write(piece)
                    sent += len(piece)
                return
            body = data[start:]
            h.send_response(206 if start else 200)
            if start:
                h.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
            h.send_header("Content-Length", str(action[1] if kind == "declare" else len(body)))
            h.send_header("ETag", '"%s"' % hashlib.sha256(data).hexdigest()[:16])
            h.send_header("Connection", "close")
            h.end_headers()
            if kind == "cut":
                h.wfile.write(body[:action[1]])
                h.wfile.flush()
                time.sleep(0.3)            # let the bytes reach the client before the reset
                h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                h.connection.close()
                return
            if kind == "drip":
                for b in body:
                    h.wfile.write(bytes([b]))
                    h.wfile.flush()
                    time.sleep(action[1])
                return
            if kind == "silent":
                h.wfile.flush()
                time.sleep(30)
                return
            h.wfile.write(body)
        except (OSError, ValueError):
            pass

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


# ---- Registries ----------------------------------------------------------------------------------------

def b64url(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


class TokenServer:
    """A Bearer token service for the registry: RS256 JWTs with the signing certificate in x5c,
    signed with the openssl CLI. Grants pull and push on whatever scope is asked."""

    def __init__(self, d, ctx):
        self.d = Path(d)
        self.d.mkdir(parents=True, exist_ok=True)
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "tok.key", "-out", "tok.pem",
                "-days", "30", "-subj", "/CN=kiri test token issuer", cwd=self.d)
        der = subprocess.run(["openssl", "x509", "-in", "tok.pem", "-outform", "DER"], cwd=self.d,
                             check=True, capture_output=True).stdout
        self.x5c = base64.b64encode(der).decode()
        self.requests = []
        owner = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_GET(self):
                q = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)
                owner.requests.append(q)
                body = json.dumps({"token": owner.token(q.get("service", [""])[0],
                                                        q.get("scope", []))}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def token(self, service, scopes):
        access = []
        for s in scopes:
            for one in s.split(" "):
                parts = one.split(":")
                if len(parts) >= 3:
                    access.append({"type": parts[0], "name": ":".join(parts[1:-1]), "actions": ["pull", "push"]})
        now = int(time.time())
        header = {"alg": "RS256", "typ": "JWT", "x5c": [self.x5c]}
        claims = {"iss": "kiri-test-issuer", "sub": "kiri", "aud": service, "exp": now + 600, "nbf": now - 60,
                  "iat": now, "jti": os.urandom(8).hex(), "access": access}
        signing_input = b64url(json.dumps(header).encode()) + "." + b64url(json.dumps(claims).encode())
        sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(self.d / "tok.key")],
                             input=signing_input.encode(), check=True, capture_output=True).stdout
        return signing_input + "." + b64url(sig)

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class Registry:
    """docker-registry serve on a free port over TLS; with token=TokenServer, token auth."""

    def __init__(self, d, pki, token=None):
        self.d = Path(d)
        self.d.mkdir(parents=True, exist_ok=True)
        self.pki = pki
        self.port = free_port()
        self.token = token
        auth = ""
        if token:
            auth = ("auth:\n  token:\n    realm: https://127.0.0.1:%d/token\n    service: kiri-test-registry\n"
                    "    issuer: kiri-test-issuer\n    rootcertbundle: %s\n" % (token.port, token.d / "tok.pem"))
        (self.d / "config.yml").write_text(
            "version: 0.1\nlog:\n  level: warn\n  accesslog:\n    disabled: false\nstorage:\n  filesystem:\n"
            "    rootdirectory: %s/data\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:%d\n"
            "  secret: kiri-test-secret\n  tls:\n    certificate: %s\n    key: %s\n%s"
            % (self.d, self.port, pki.d / "srv.pem", pki.d / "srv.key", auth))
        self.log = open(self.d / "registry.log", "ab")
        self.proc = subprocess.Popen(["docker-registry", "serve", str(self.d / "config.yml")],
                                     stdout=self.log, stderr=self.log)
        wait_port(self.port)
        self.ctx = ssl.create_default_context(cafile=str(pki.ca))
        self.auth = None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def _req(self, method, path, body=None, headers=None):
        h = dict(headers or {})
        if self.auth:
            h["Authorization"] = "Bearer " + self.auth
        c = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=60)
        try:
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
        finally:
            c.close()

    def login(self, repo):
        """Gets a push token from the token server (the registry's own challenge names it)."""
        st, hd, _ = self._req("GET", "/v2/")
        if st != 401:
            return
        q = urllib.parse.urlencode({"service": "kiri-test-registry", "scope": "repository:%s:pull,push" % repo})
        c = http.client.HTTPSConnection("127.0.0.1", self.token.port, context=self.ctx, timeout=60)
        c.request("GET", "/token?" + q)
        self.auth = json.loads(c.getresponse().read())["token"]
        c.close()

    def push_blob(self, repo, data):
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        st, hd, _ = self._req("POST", "/v2/%s/blobs/uploads/" % repo)
        assert st == 202, st
        loc = urllib.parse.urlparse(hd["location"])
        path = loc.path + "?" + (loc.query + "&" if loc.query else "") + "digest=" + urllib.parse.quote(digest)
        st, hd, body = self._req("PUT", path, data, {"Content-Type": "application/octet-stream",
                                                     "Content-Length": str(len(data))})
        assert st == 201, (st, body)
        return digest

    def push_model(self, repo, tag, data, media="application/vnd.ollama.image.model", extra_layers=()):
        """An OCI image manifest whose layers are extra_layers (bytes, media type) and the model."""
        if self.token:
            self.login(repo)
        config = b"{}"
        layers = []
        for blob, mt in extra_layers:
            layers.append({"mediaType": mt, "digest": self.push_blob(repo, blob), "size": len(blob)})
        layers.append({"mediaType": media, "digest": self.push_blob(repo, data), "size": len(data),
                       "annotations": {"org.opencontainers.image.title": "model.gguf"}})
        manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                               "digest": self.push_blob(repo, config), "size": len(config)},
                    "layers": layers}
        body = json.dumps(manifest).encode()
        st, hd, resp = self._req("PUT", "/v2/%s/manifests/%s" % (repo, tag), body,
                                 {"Content-Type": "application/vnd.oci.image.manifest.v1+json"})
        assert st == 201, (st, resp)
        return "sha256:" + hashlib.sha256(body).hexdigest()


# ---- Module fixtures -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env(kiri, tmp_path_factory):
    """Keys, PKI, nginx with models and manifests, the fault server, an alternative valid model."""
    need("nginx")
    d = tmp_path_factory.mktemp("fleet")
    pki = PKI(d / "pki")
    kiri("fleet", "keygen", "--out", d / "keys", check=0)
    kiri("fleet", "keygen", "--out", d / "otherkeys", check=0)
    ng = Nginx(d / "nginx", pki)
    shutil.copy(MODEL, ng.www / "stories260K.gguf")
    alt = ng.www / "alt.gguf"   # another valid GGUF: the model quantized to Q8_0
    kiri("quantize", MODEL, alt, "Q8_0", check=0)
    bad = bytearray(b"GGUF" + os.urandom(4096))      # hashes fine, is not a model (F14)
    (ng.www / "notgguf.gguf").write_bytes(bytes(bad))
    (ng.www / "manifests").mkdir()
    ng.start()
    fs = FaultServer(pki.context(), {"/model": MODEL_BYTES})

    class Env:
        pass

    e = Env()
    e.d, e.pki, e.ng, e.fs, e.kiri = d, pki, ng, fs, kiri
    e.priv, e.pub = d / "keys" / "fleet-key.pem", d / "keys" / "fleet-pub.pem"
    e.other_priv = d / "otherkeys" / "fleet-key.pem"
    e.alt_sha, e.alt_size = sha_of(alt), alt.stat().st_size
    e.notgguf_sha, e.notgguf_size = hashlib.sha256(bytes(bad)).hexdigest(), len(bad)
    yield e
    fs.stop()
    ng.stop()


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def publish(e, name, version, models, key=None, issued=None, expires=None, raw=None):
    """Signs a manifest with `kiri fleet sign` and puts it at manifests/<name>.json; returns its URL."""
    now = time.time()
    m = {"version": version, "issued": iso(issued if issued is not None else now - 3600),
         "expires": iso(expires if expires is not None else now + 30 * 86400), "models": models,
         "routing": "local-first", "upstream_url": "https://api.example.com/v1"}
    src = e.d / ("%s.manifest.json" % name)
    src.write_text(raw if raw is not None else json.dumps(m, indent=1))
    r = e.kiri("fleet", "sign", "--key", key or e.priv, src, check=0)
    (e.ng.www / "manifests" / (name + ".json")).write_text(r.stdout)
    return e.ng.url("manifests/%s.json" % name)


def model_entry(name="stories", url=None, sha=MODEL_SHA, size=MODEL_SIZE, e=None):
    return {"name": name, "url": url or e.ng.url("stories260K.gguf"), "size": size, "sha256": sha, "type": "gguf"}


def sync(e, models_dir, url, *extra, pub=None):
    r = e.kiri("fleet", "sync", "--pubkey", pub or e.pub, "--models-dir", models_dir, "--manifest-url", url,
               "--ca", e.pki.ca, "--json", *FAST, *extra)
    return r, report(r)


def state_version(models_dir):
    p = Path(models_dir) / ".kiri-fleet-state.json"
    return json.loads(p.read_text())["version"] if p.exists() else 0


def installed_dir(e, tmp_path, version=1):
    """A models directory that holds manifest `version` with stories installed."""
    md = tmp_path / "models"
    url = publish(e, "base%d" % version, version, [model_entry(e=e)])
    r, rep = sync(e, md, url)
    assert r.returncode == 0 and rep["models"][0]["action"] == "installed", r.stderr
    return md


# ---- Keys, signing and verification --------------------------------------------------------------------

def test_keygen_sign_verify(env, tmp_path, figures):
    e = env
    assert (e.priv.stat().st_mode & 0o777) == 0o600
    r = e.kiri("fleet", "keygen", "--out", e.d / "keys")
    assert r.returncode == 1 and "exists" in r.stderr            # never overwrites a key
    publish(e, "v1", 1, [model_entry(e=e)])
    signed = e.ng.www / "manifests" / "v1.json"
    ok = e.kiri("fleet", "verify", "--pubkey", e.pub, signed)
    assert ok.returncode == 0 and "version 1" in ok.stdout, ok.stderr
    env_json = json.loads(signed.read_text())
    raw = base64.b64decode(env_json["manifest"])
    cases = {}
    t = dict(env_json, manifest=base64.b64encode(raw.replace(b'"version": 1', b'"version": 2')).decode())
    cases["F01 tampered manifest bytes"] = (t, "signature")
    cases["F01 signed by another key"] = (None, "key_id")
    cases["F01 unsigned"] = ({"key_id": env_json["key_id"], "manifest": env_json["manifest"]}, "signature")
    sig = bytearray(base64.b64decode(env_json["signature"]))
    sig[-1] ^= 1
    cases["F01 signature bit flipped"] = (dict(env_json, signature=base64.b64encode(bytes(sig)).decode()), "signature")
    n = 0
    for case, (doc, field) in cases.items():
        p = tmp_path / "bad.json"
        if doc is None:
            publish(e, "wrongkey", 1, [model_entry(e=e)], key=e.other_priv)
            shutil.copy(e.ng.www / "manifests" / "wrongkey.json", p)
        else:
            p.write_text(json.dumps(doc))
        r = e.kiri("fleet", "verify", "--pubkey", e.pub, p)
        assert r.returncode == 1 and ("%s]" % field) in r.stderr, (case, r.stderr)
        n += 1
    figures("fleet F01 verify: tampered/other key/unsigned/flipped", n, len(cases), "all refused by `kiri fleet verify`")


def test_signatures_interoperate_with_openssl(env, tmp_path, figures):
    """The envelope's signature and key id are what the openssl CLI makes and checks: an envelope
    built with `openssl dgst -sha256 -sign` verifies in kiri, and kiri's signature verifies with
    `openssl dgst -verify`."""
    e = env
    man = tmp_path / "m.json"
    man.write_text(json.dumps({"version": 9, "issued": iso(time.time() - 60), "expires": iso(time.time() + 86400),
                               "models": [model_entry(e=e)]}))
    der = subprocess.run(["openssl", "pkey", "-pubin", "-in", str(e.pub), "-outform", "DER"], check=True,
                         capture_output=True).stdout
    sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", str(e.priv), str(man)], check=True,
                         capture_output=True).stdout
    env_doc = {"key_id": "sha256:" + hashlib.sha256(der).hexdigest(),
               "manifest": base64.b64encode(man.read_bytes()).decode(), "signature": base64.b64encode(sig).decode()}
    (tmp_path / "openssl.json").write_text(json.dumps(env_doc))
    r = e.kiri("fleet", "verify", "--pubkey", e.pub, tmp_path / "openssl.json")
    assert r.returncode == 0 and "version 9" in r.stdout, r.stderr
    ours = json.loads(e.kiri("fleet", "sign", "--key", e.priv, man, check=0).stdout)
    assert ours["key_id"] == env_doc["key_id"] and base64.b64decode(ours["manifest"]) == man.read_bytes()
    (tmp_path / "sig.der").write_bytes(base64.b64decode(ours["signature"]))
    v = subprocess.run(["openssl", "dgst", "-sha256", "-verify", str(e.pub), "-signature", str(tmp_path / "sig.der"),
                        str(man)], capture_output=True, text=True)
    assert v.returncode == 0 and "Verified OK" in v.stdout, v.stdout + v.stderr
    figures("fleet signatures vs the openssl CLI", 2, 2, "openssl-signed verifies in kiri; kiri-signed in openssl")


# ---- Sync: install, idempotence, rejections (F01-F03) ---------------------------------------------------

def test_sync_installs_then_idempotent(env, tmp_path, figures):
    e = env
    md = tmp_path / "models"
    url = publish(e, "idem", 1, [model_entry(e=e)])
    before = len(e.ng.access())
    r, rep = sync(e, md, url)
    assert r.returncode == 0, r.stderr
    assert rep["manifest"] == "accepted" and rep["version"] == 1 and rep["models"][0]["action"] == "installed"
    assert sha_of(md / "stories.gguf") == MODEL_SHA
    assert leftovers(md) == []
    r2, rep2 = sync(e, md, url)
    assert r2.returncode == 0 and rep2["same"] and rep2["models"][0]["action"] == "unchanged"
    got = [a for a in e.ng.access()[before:] if a[1].endswith(".gguf")]
    assert len(got) == 1                                         # the second sync downloaded nothing
    figures("fleet sync install + repeat (idempotent)", 2, 2, "1 model GET for 2 syncs")


def test_manifest_rejections_keep_state_and_model(env, tmp_path, figures):
    """F01 tampered / wrong key / unsigned, F02 replay of an older and of an equal version with
    other bytes, F03 expired and a fast-forward jump: each refused, state and model unchanged."""
    e = env
    md = installed_dir(e, tmp_path, version=5)
    good_sha = sha_of(md / "stories.gguf")
    now = time.time()
    signed5 = json.loads((e.ng.www / "manifests" / "base5.json").read_text())
    cases = []
    t = dict(signed5, manifest=base64.b64encode(base64.b64decode(signed5["manifest"]) + b" ").decode())
    (e.ng.www / "manifests" / "tampered.json").write_text(json.dumps(t))
    cases.append(("F01 tampered manifest", e.ng.url("manifests/tampered.json"), "signature"))
    cases.append(("F01 wrong key", publish(e, "wk", 6, [model_entry(e=e)], key=e.other_priv), "key_id"))
    (e.ng.www / "manifests" / "unsigned.json").write_text(json.dumps({"manifest": signed5["manifest"]}))
    cases.append(("F01 unsigned", e.ng.url("manifests/unsigned.json"), "signature"))
    cases.append(("F02 replayed older version 4", publish(e, "old", 4, [model_entry(e=e)]), "version"))
    cases.append(("F02 version 5 again, other bytes",
                  publish(e, "eq", 5, [model_entry(e=e, url=e.ng.url("alt.gguf"), sha=e.alt_sha, size=e.alt_size)]),
                  "version"))
    cases.append(("F03 expired", publish(e, "exp", 6, [model_entry(e=e)], issued=now - 10 * 86400,
                                         expires=now - 86400), "expires"))
    cases.append(("F03 fast-forward to 5 + 2^20 + 1", publish(e, "ff", 5 + (1 << 20) + 1, [model_entry(e=e)]),
                  "version"))
    ok = 0
    for name, url, field in cases:
        r, rep = sync(e, md, url)
        assert r.returncode == 1, (name, r.stderr)
        assert rep["manifest"] == "rejected" and rep["reason"] == field, (name, rep)
        assert "manifest rejected" in r.stderr and "keeping version 5" in r.stderr
        assert state_version(md) == 5 and sha_of(md / "stories.gguf") == good_sha and leftovers(md) == []
        ok += 1
    # The bound is configurable, and the original manifest is still accepted as "the same".
    r, rep = sync(e, md, e.ng.url("manifests/base5.json"))
    assert r.returncode == 0 and rep["same"]
    figures("fleet F01-F03 manifest rejections (sync)", ok, len(cases),
            "state v5 and model hash unchanged after each")


def test_clock_floor_and_skew(env, tmp_path, figures):
    """F04: a manifest issued in the device clock's future is accepted with a clock-skew line; the
    stored floor (latest issued) then judges expiry even if the wall clock is behind."""
    e = env
    md = tmp_path / "models"
    now = time.time()
    url = publish(e, "future-issued", 1, [model_entry(e=e)], issued=now + 2 * 86400, expires=now + 30 * 86400)
    r, rep = sync(e, md, url)
    assert r.returncode == 0 and "clock skew" in r.stderr, r.stderr
    st = json.loads((md / ".kiri-fleet-state.json").read_text())
    assert st["time_floor"] >= int(now + 2 * 86400) - 5
    # v2 expires before the stored floor: refused although the wall clock says it is still valid.
    url2 = publish(e, "below-floor", 2, [model_entry(e=e)], issued=now - 3600, expires=now + 86400)
    r2, rep2 = sync(e, md, url2)
    assert r2.returncode == 1 and rep2["reason"] == "expires" and "clock is behind" in r2.stderr
    figures("fleet F04 clock floor / skew", 2, 2, "future issued accepted + logged; expiry judged by the floor")


# ---- Downloads: hash, truncation, kill -9, disk, retries ------------------------------------------------

def test_sha256_mismatch_retries_then_refuses(env, tmp_path, figures):
    """F05: the file served is not the one the manifest names (the new model alt, same size, one
    byte differs): every attempt ends in a mismatch, the partial file is deleted each time, and
    the model in service stays."""
    e = env
    md = installed_dir(e, tmp_path)
    corrupt = bytearray((e.ng.www / "alt.gguf").read_bytes())
    corrupt[len(corrupt) // 2] ^= 0xFF
    (e.ng.www / "corrupt.gguf").write_bytes(bytes(corrupt))
    url = publish(e, "mismatch", 2, [model_entry(e=e, url=e.ng.url("corrupt.gguf"), sha=e.alt_sha,
                                                 size=e.alt_size)])
    before = len(e.ng.access())
    r, rep = sync(e, md, url, "--retries", "3")
    m = rep["models"][0]
    assert r.returncode == 1 and m["action"] == "failed" and m["error_field"] == "sha256", r.stderr
    assert m["download"]["hash_mismatches"] == 3 and m["download"]["attempts"] == 3
    assert rep["hash_mismatches"] == 3 and "retrying in" in r.stderr
    gets = [a for a in e.ng.access()[before:] if a[1] == "/corrupt.gguf"]
    assert len(gets) == 3 and all(a[4] == "-" for a in gets)      # each restart from byte 0
    assert sha_of(md / "stories.gguf") == MODEL_SHA and leftovers(md) == []
    assert state_version(md) == 2                                 # the manifest itself was valid
    figures("fleet F05 sha256 mismatch", 1, 1, "3/3 attempts mismatched, 3 GETs, partial deleted, model intact")


def test_hash_of_another_file(env, tmp_path, figures):
    """F15: the entry's hash and size belong to another model (alt) but the URL serves stories:
    refused on the declared length before a byte is written."""
    e = env
    md = installed_dir(e, tmp_path)
    url = publish(e, "mixmatch", 2, [model_entry(e=e, sha=e.alt_sha, size=e.alt_size)])
    r, rep = sync(e, md, url)
    m = rep["models"][0]
    assert r.returncode == 1 and m["error_field"] == "size" and m["download"]["bytes_received"] == 0, r.stderr
    assert sha_of(md / "stories.gguf") == MODEL_SHA and leftovers(md) == []
    figures("fleet F15 hash of another file", 1, 1, "refused: length differs, 0 bytes written")


def test_truncated_download_resumes(env, tmp_path, figures):
    """F06: the connection is reset after 400000 body bytes; the retry asks for the rest with
    Range and the file verifies."""
    e = env
    fs = e.fs
    fs.plan("/model", ("cut", 400000), ("ok",))
    md = tmp_path / "m"
    r = e.kiri("pull", fs.url("model"), "--sha256", MODEL_SHA, "--size", MODEL_SIZE, "--models-dir", md, "--name",
               "stories", "--ca", e.pki.ca, "--json", "--disk-margin", "0", *FAST)
    rep = report(r)
    assert r.returncode == 0 and rep["status"] == "installed", r.stderr
    reqs = fs.requests("/model")
    assert len(reqs) == 2 and reqs[0][1] is None and reqs[1][1].startswith("bytes="), reqs
    start = int(reqs[1][1][6:-1])
    assert 0 < start <= 400000       # what arrived before the reset (the kernel may drop the rest)
    d = rep["download"]
    assert d["attempts"] == 2 and d["resumed"] == 1 and d["bytes_received"] == MODEL_SIZE
    assert sha_of(md / "stories.gguf") == MODEL_SHA and leftovers(md) == []
    figures("fleet F06 reset mid-body -> Range resume", 1, 1,
            "2 requests (2nd %s), %d bytes received in all" % (reqs[1][1], d["bytes_received"]))


def test_server_ignoring_range_restarts(env, tmp_path, figures):
    """F06 with a server that answers a Range request with the whole file: the partial file is
    dropped and the download starts over, still verified."""
    e = env
    fs = e.fs
    fs.plan("/model", ("cut", 300000), ("ok",))
    orig = fs.handle

    def no_range(h):
        del h.headers["Range"]
        orig(h)
    fs.handle = no_range
    try:
        md = tmp_path / "m"
        r = e.kiri("pull", fs.url("model"), "--sha256", MODEL_SHA, "--size", MODEL_SIZE, "--models-dir", md,
                   "--name", "stories", "--ca", e.pki.ca, "--json", "--disk-margin", "0", *FAST)
    finally:
        fs.handle = orig
    rep = report(r)
    assert r.returncode == 0 and rep["download"]["restarted"] == 1, r.stderr
    assert sha_of(md / "stories.gguf") == MODEL_SHA
    figures("fleet F06 server ignores Range -> restart", 1, 1, "200 to a Range request: partial dropped, verified")


def test_pull_https_url(env, tmp_path, figures):
    """`kiri pull URL --sha256` learns the size from the server's Content-Length, installs, and a
    second pull finds the file already there; without --sha256 it refuses to start."""
    e = env
    md = tmp_path / "m"
    r = e.kiri("pull", e.ng.url("stories260K.gguf"), "--sha256", MODEL_SHA, "--models-dir", md, "--ca", e.pki.ca,
               "--json", "--disk-margin", "0")
    rep = report(r)
    assert r.returncode == 0 and rep["file"] == "stories260K.gguf" and rep["size"] == MODEL_SIZE, r.stderr
    r = e.kiri("pull", e.ng.url("stories260K.gguf"), "--sha256", MODEL_SHA, "--models-dir", md, "--ca", e.pki.ca,
               "--json")
    assert r.returncode == 0 and report(r)["status"] == "unchanged"
    r = e.kiri("pull", e.ng.url("stories260K.gguf"), "--models-dir", md, "--ca", e.pki.ca)
    assert r.returncode == 2 and "--sha256" in r.stderr
    r = e.kiri("pull", "http://localhost/stories260K.gguf", "--sha256", MODEL_SHA, "--models-dir", md)
    assert r.returncode == 2 and "http://" in r.stderr
    figures("fleet pull https URL (size probe, repeat, no --sha256, http://)", 4, 4, "")


def test_kill9_mid_download_then_restart(env, tmp_path, figures):
    """F13: kill -9 while a rate-limited download is half done: the old model is intact and
    NAME.partial holds a prefix; the next run hashes the partial file and resumes with Range."""
    e = env
    md = tmp_path / "m"
    md.mkdir()
    shutil.copy(e.ng.www / "alt.gguf", md / "stories.gguf")       # the version in service
    old_sha = sha_of(md / "stories.gguf")
    args = [str(e.kiri.path), "pull", e.ng.url("slow/stories260K.gguf"), "--sha256", MODEL_SHA, "--size",
            str(MODEL_SIZE), "--models-dir", str(md), "--name", "stories", "--ca", str(e.pki.ca), "--json",
            "--disk-margin", "0"]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    partial = md / "stories.gguf.partial"
    end = time.monotonic() + 60
    while time.monotonic() < end and (not partial.exists() or partial.stat().st_size < 300000):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    kept = partial.stat().st_size
    assert 300000 <= kept < MODEL_SIZE
    assert sha_of(md / "stories.gguf") == old_sha                   # served model untouched
    assert MODEL_BYTES.startswith(partial.read_bytes())
    before = len(e.ng.access())
    r = subprocess.run(args, capture_output=True, text=True, timeout=120)
    rep = report(r)
    assert r.returncode == 0 and rep["download"]["bytes_reused"] >= kept, r.stderr
    assert "found a partial file" in r.stderr
    ranges = [a[4] for a in e.ng.access()[before:] if a[1].endswith("stories260K.gguf")]
    assert len(ranges) == 1 and ranges[0].startswith("bytes=") and int(ranges[0][6:-1]) >= kept, ranges
    assert sha_of(md / "stories.gguf") == MODEL_SHA and (md / "stories.gguf.prev").exists()
    assert sha_of(md / "stories.gguf.prev") == old_sha and leftovers(md) == []
    figures("fleet F13 kill -9 mid-download -> resume", 1, 1,
            "killed at %d B; restart sent %s, old model intact until the swap" % (kept, ranges[0]))


@pytest.fixture
def tmpfs(tmp_path):
    mounts = []

    def mount(size):
        d = tmp_path / ("tmpfs%d" % len(mounts))
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=%s" % size, "tmpfs", str(d)], capture_output=True)
        if r.returncode != 0:
            pytest.skip("cannot mount a tmpfs here: %s" % r.stderr.decode().strip())
        mounts.append(d)
        return d
    yield mount
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def test_disk_too_small_preflight(env, tmpfs, figures):
    """F12: 1 MiB of disk for a 1.1 MiB model: refused before any request; nothing written."""
    e = env
    md = tmpfs("1m")
    before = len(e.ng.access())
    r = e.kiri("pull", e.ng.url("stories260K.gguf"), "--sha256", MODEL_SHA, "--size", MODEL_SIZE, "--models-dir", md,
               "--name", "stories", "--ca", e.pki.ca, "--json", "--disk-margin", "0")
    rep = report(r)
    assert r.returncode == 1 and rep["error_field"] == "disk" and "not enough disk space" in rep["error"], r.stderr
    assert len(e.ng.access()) == before and leftovers(md) == [] and not (md / "stories.gguf").exists()
    figures("fleet F12 free-space preflight", 1, 1, "refused with 0 requests sent")


def test_disk_full_mid_download(env, tmpfs, figures):
    """F12: the disk fills up while the download runs (another writer): the write fails with
    ENOSPC, the partial file is deleted and the model in service is untouched."""
    e = env
    size = e.alt_size + MODEL_SIZE + 200 * 1024
    md = tmpfs(str(size))
    shutil.copy(e.ng.www / "alt.gguf", md / "stories.gguf")
    old_sha = sha_of(md / "stories.gguf")
    p = subprocess.Popen([str(e.kiri.path), "pull", e.ng.url("slow/stories260K.gguf"), "--sha256", MODEL_SHA,
                          "--size", str(MODEL_SIZE), "--models-dir", str(md), "--name", "stories", "--ca",
                          str(e.pki.ca), "--json", "--disk-margin", "0", "--retries", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    partial = md / "stories.gguf.partial"
    end = time.monotonic() + 60
    while time.monotonic() < end and (not partial.exists() or partial.stat().st_size < 150000):
        time.sleep(0.05)
    with open(md / "filler", "wb") as f:                  # another program takes the rest
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    out, err = p.communicate(timeout=120)
    rep = json.loads(out.strip().splitlines()[-1])
    (md / "filler").unlink()
    assert p.returncode == 1 and rep["error_field"] == "disk", err
    assert "No space left" in rep["error"] and leftovers(md) == []
    assert sha_of(md / "stories.gguf") == old_sha
    figures("fleet F12 ENOSPC mid-download", 1, 1, "write failed, partial deleted, old model intact")


def test_retry_after_then_success(env, tmp_path, figures):
    """F08: 503 (Retry-After 1), 429 (Retry-After 1), 500, then the file: four requests, the
    waits at least what Retry-After asked."""
    e = env
    fs = e.fs
    fs.plan("/model", ("status", 503, 1), ("status", 429, 1), ("status", 500, None), ("ok",))
    md = tmp_path / "m"
    t0 = time.monotonic()
    r = e.kiri("pull", fs.url("model"), "--sha256", MODEL_SHA, "--size", MODEL_SIZE, "--models-dir", md, "--name",
               "stories", "--ca", e.pki.ca, "--json", "--disk-margin", "0", "--backoff", "0.05", "--backoff-max", "5")
    secs = time.monotonic() - t0
    rep = report(r)
    assert r.returncode == 0, r.stderr
    assert [q[2] for q in fs.requests("/model")] == ["status", "status", "status", "ok"]
    assert rep["download"]["attempts"] == 4 and rep["download"]["retries_after"] == 2 and secs >= 2.0
    # Retry-After beyond --backoff-max is capped; a 503 on the last attempt is KIRI_E_BUSY.
    fs.plan("/model", ("status", 503, 3600), ("status", 503, 3600))
    t0 = time.monotonic()
    r2 = e.kiri("pull", fs.url("model"), "--sha256", MODEL_SHA, "--size", MODEL_SIZE, "--models-dir", tmp_path / "m2",
                "--ca", e.pki.ca, "--json", "--disk-margin", "0", "--retries", "2", "--backoff-max", "0.5")
    capped = time.monotonic() - t0
    assert r2.returncode == 1 and "E_BUSY" in r2.stderr and capped < 30
    figures("fleet F08 503/429/500 + Retry-After -> success", 4, 4,
            "4 requests, %.1f s (Retry-After 1+1 honoured); Retry-After 3600 capped to 0.5 s" % secs)


def test_redirects(env, tmp_path, figures):
    """F09: a loop, a chain of 6, a redirect to http:// and to a host that is not the origin are
    refused; a chain of 5 is followed; --allow-host lets the foreign host through."""
    e = env
    base = ["--sha256", MODEL_SHA, "--size", MODEL_SIZE, "--ca", e.pki.ca, "--json", "--disk-margin", "0",
            "--retries", "1"]
    cases = [("loop", "loop1", 1, "redirect loop"), ("6 redirects", "c1", 1, "more than 5 redirects"),
             ("to http://", "to-http", 1, "non-https"), ("to a foreign host", "to-ip", 1, "foreign host"),
             ("5 redirects", "c2", 0, None)]
    ok, sent = 0, {}
    for i, (name, path, rc, msg) in enumerate(cases):
        before = len(e.ng.access())
        r = e.kiri("pull", e.ng.url(path), "--models-dir", tmp_path / str(i), "--name", "m", *base)
        rep = report(r)
        sent[name] = len(e.ng.access()) - before
        assert r.returncode == rc, (name, r.stderr)
        if msg:
            assert rep["error_field"] == "redirect" and msg in rep["error"], (name, rep)
            assert sent[name] <= 6
        ok += 1
    r = e.kiri("pull", e.ng.url("to-ip"), "--models-dir", tmp_path / "allow", "--name", "m", "--allow-host",
               "127.0.0.1", *base)
    assert r.returncode == 0, r.stderr
    figures("fleet F09 redirects (loop/6/http/foreign refused, 5 + allowlist ok)", ok + 1, len(cases) + 1,
            "requests sent: " + ", ".join("%s %d" % kv for kv in sent.items()))


def test_tls_refusals(env, tmp_path, figures):
    """F10: another host's certificate, another CA, self-signed, expired, not yet valid: all
    refused in the handshake, nothing written; the not-yet-valid one names clock skew."""
    e = env
    expect = {"wronghost": "do not include this host", "wrongca": "not signed by a trusted CA",
              "selfsigned": "not signed by a trusted CA", "expired": "expired", "future": "clock skew"}
    ok = 0
    for name, port in e.ng.ports.items():
        md = tmp_path / name
        r = e.kiri("pull", e.ng.url("stories260K.gguf", port=port), "--sha256", MODEL_SHA, "--size", MODEL_SIZE,
                   "--models-dir", md, "--name", "m", "--ca", e.pki.ca, "--json", "--disk-margin", "0")
        rep = report(r)
        assert r.returncode == 1 and rep["error_field"] == "certificate", (name, r.stderr)
        assert expect[name] in rep["error"], (name, rep["error"])
        assert rep["download"]["bytes_received"] == 0 and rep["download"]["attempts"] == 1  # not retried
        ok += 1
    # Without --ca the system bundle is used, which does not know the test CA.
    r = e.kiri("pull", e.ng.url("stories260K.gguf"), "--sha256", MODEL_SHA, "--size", MODEL_SIZE, "--models-dir",
               tmp_path / "sys", "--json")
    assert r.returncode == 1 and report(r)["error_field"] == "certificate"
    figures("fleet F10 TLS host/CA/self-signed/expired/future", ok + 1, len(expect) + 1,
            "refused in the handshake, 0 bytes, no retry")


def test_endless_and_oversized_bodies(env, tmp_path, figures):
    """F07: a chunked body that carries the model and then never ends is cut at the manifest
    length and installs; a close-delimited body of garbage is cut at that length every attempt;
    a declared Content-Length above it is refused before reading."""
    e = env
    fs = e.fs
    base = ["--sha256", MODEL_SHA, "--size", MODEL_SIZE, "--ca", e.pki.ca, "--json", "--disk-margin", "0"] + FAST
    fs.plan("/model", ("chunked_endless", MODEL_BYTES))
    r = e.kiri("pull", fs.url("model"), "--models-dir", tmp_path / "a", "--name", "s", *base)
    rep = report(r)
    assert r.returncode == 0 and rep["download"]["bytes_received"] == MODEL_SIZE, r.stderr
    assert "cut there" in r.stderr
    fs.plan("/model", ("endless", b""), ("endless", b""))
    r = e.kiri("pull", fs.url("model"), "--models-dir", tmp_path / "b", "--name", "s", "--retries", "2", *base)
    rep = report(r)
    assert r.returncode == 1 and rep["error_field"] == "sha256", r.stderr
    assert rep["download"]["bytes_received"] == 2 * MODEL_SIZE and leftovers(tmp_path / "b") == []
    fs.plan("/model", ("declare", MODEL_SIZE + 1))
    r = e.kiri("pull", fs.url("model"), "--models-dir", tmp_path / "c", "--name", "s", *base)
    rep = report(r)
    assert r.returncode == 1 and rep["error_field"] == "size" and rep["download"]["bytes_received"] == 0, r.stderr
    figures("fleet F07 endless / oversized bodies", 3, 3,
            "cut at %d B (installed when the prefix is right), garbage cut per attempt, +1 B declared refused"
            % MODEL_SIZE)


def test_slow_and_silent_servers(env, tmp_path, figures):
    """F11: a 5 B/s drip fails the minimum-throughput check; a server that sends the head and then
    nothing hits the idle timeout; a listener that never answers the handshake hits the
    first-byte timeout."""
    e = env
    fs = e.fs
    base = ["--sha256", MODEL_SHA, "--size", MODEL_SIZE, "--ca", e.pki.ca, "--json", "--disk-margin", "0",
            "--retries", "1"]
    fs.plan("/model", ("drip", 0.2))
    t0 = time.monotonic()
    r = e.kiri("pull", fs.url("model"), "--models-dir", tmp_path / "a", "--min-rate", "1000", "--rate-window", "2",
               *base)
    slow = time.monotonic() - t0
    rep = report(r)
    assert r.returncode == 1 and rep["error_field"] == "timeout" and "bytes/s" in rep["error"], r.stderr
    assert slow < 20
    fs.plan("/model", ("silent",))
    t0 = time.monotonic()
    r = e.kiri("pull", fs.url("model"), "--models-dir", tmp_path / "b", "--idle-timeout", "1", *base)
    idle = time.monotonic() - t0
    assert r.returncode == 1 and report(r)["error_field"] == "timeout" and idle < 20, r.stderr
    with socket.socket() as lst:
        lst.bind(("127.0.0.1", 0))
        lst.listen(4)                      # TCP connects; no TLS handshake ever comes
        t0 = time.monotonic()
        r = e.kiri("pull", "https://localhost:%d/m.gguf" % lst.getsockname()[1], "--models-dir", tmp_path / "c",
                   "--first-byte-timeout", "1", *base)
        fb = time.monotonic() - t0
    assert r.returncode == 1 and report(r)["error_field"] == "timeout" and fb < 20, r.stderr
    figures("fleet F11 drip / idle / no handshake", 3, 3,
            "gave up after %.1f s / %.1f s / %.1f s" % (slow, idle, fb))


def test_valid_hash_invalid_gguf(env, tmp_path, figures):
    """F14: the manifest names a file that matches its hash but is not a GGUF model: refused
    after verification, before it replaces anything."""
    e = env
    md = installed_dir(e, tmp_path)
    url = publish(e, "notgguf", 2, [model_entry(e=e, url=e.ng.url("notgguf.gguf"), sha=e.notgguf_sha,
                                                size=e.notgguf_size)])
    r, rep = sync(e, md, url, "--disk-margin", "0")
    m = rep["models"][0]
    assert r.returncode == 1 and m["error_field"] == "gguf" and m["download"]["hash_mismatches"] == 0, r.stderr
    assert sha_of(md / "stories.gguf") == MODEL_SHA and leftovers(md) == []
    figures("fleet F14 hash ok, GGUF invalid", 1, 1, "refused after the hash, model in service unchanged")


def test_rollback_by_higher_version(env, tmp_path, figures):
    """Roll out v2 (alt), then roll back by publishing v3 pointing at the first model: it comes
    back from NAME.prev without a download."""
    e = env
    md = installed_dir(e, tmp_path)
    r, rep = sync(e, md, publish(e, "roll2", 2, [model_entry(e=e, url=e.ng.url("alt.gguf"), sha=e.alt_sha,
                                                             size=e.alt_size)]))
    assert r.returncode == 0 and rep["models"][0]["action"] == "installed" and sha_of(md / "stories.gguf") == e.alt_sha
    before = len(e.ng.access())
    r, rep = sync(e, md, publish(e, "roll3", 3, [model_entry(e=e)]))
    assert r.returncode == 0 and rep["models"][0]["action"] == "restored", r.stderr
    assert sha_of(md / "stories.gguf") == MODEL_SHA and sha_of(md / "stories.gguf.prev") == e.alt_sha
    assert not [a for a in e.ng.access()[before:] if a[1].endswith(".gguf")]
    figures("fleet rollback = higher version, old model", 1, 1, "restored from .prev, 0 model downloads")


def test_network_down_then_restored(env, kiri, tmp_path, figures):
    """F20: an unresolvable host fails fast with a dns error; a fleet server that is down is
    retried with backoff, and the sync succeeds as soon as it is back."""
    e = env
    md = tmp_path / "m"
    # No network at all: a fresh network namespace (only a loopback that is down), so neither the
    # name lookup nor the connect leaves this machine.
    isolate = ["unshare", "-n"] if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0 else []
    down = {}
    for case, url, reason in (("dns", "https://kiri-fleet-test.invalid/m.json", "dns"),
                              ("no network", e.ng.url("manifests/base1.json"), "connect")):
        if case == "no network" and not isolate:
            continue
        t0 = time.monotonic()
        r = subprocess.run(isolate + [str(kiri.path), "fleet", "sync", "--pubkey", str(e.pub), "--models-dir", str(md),
                                      "--manifest-url", url, "--ca", str(e.pki.ca), "--json", "--retries", "1"],
                           capture_output=True, text=True, timeout=120)
        down[case] = time.monotonic() - t0
        rep = report(r)
        assert r.returncode == 1 and rep["manifest"] == "unavailable" and rep["reason"] == reason, r.stderr
        assert down[case] < 30 and not (md / ".kiri-fleet-state.json").exists()
    # A second nginx on a port where nothing listens yet; it starts 1.5 s into the sync.
    ng2 = Nginx(tmp_path / "ng2", e.pki)
    (ng2.www / "manifests").mkdir(parents=True)
    shutil.copy(MODEL, ng2.www / "stories260K.gguf")
    publish(e, "ng2", 1, [model_entry(e=e, url=ng2.url("stories260K.gguf"))])
    shutil.copy(e.ng.www / "manifests" / "ng2.json", ng2.www / "manifests" / "ng2.json")
    p = subprocess.Popen([str(kiri.path), "fleet", "sync", "--pubkey", str(e.pub), "--models-dir", str(md),
                          "--manifest-url", ng2.url("manifests/ng2.json"), "--ca", str(e.pki.ca), "--json",
                          "--retries", "8", "--backoff", "0.25", "--backoff-max", "1"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(1.5)
    restored = time.monotonic()
    ng2.start()
    try:
        out, err = p.communicate(timeout=120)
    finally:
        ng2.stop()
    recovery = time.monotonic() - restored
    assert p.returncode == 0 and "cannot connect" in err, err
    assert sha_of(md / "stories.gguf") == MODEL_SHA
    figures("fleet F20 DNS failure / no network / server down then back", len(down) + 1, len(down) + 1,
            "failed in %s; synced %.1f s after the server returned"
            % (", ".join("%.0f ms (%s)" % (v * 1e3, k) for k, v in down.items()), recovery))


def test_second_sync_is_locked_out(env, tmp_path, figures):
    e = env
    md = tmp_path / "m"
    url = publish(e, "lock", 1, [model_entry(e=e, url=e.ng.url("slow/stories260K.gguf"))])
    p = subprocess.Popen([str(e.kiri.path), "fleet", "sync", "--pubkey", str(e.pub), "--models-dir", str(md),
                          "--manifest-url", url, "--ca", str(e.pki.ca), "--disk-margin", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    end = time.monotonic() + 30
    while time.monotonic() < end and not (md / "stories.gguf.partial").exists():
        time.sleep(0.05)
    r, rep = sync(e, md, url)
    p.kill()
    p.wait()
    assert r.returncode == 1 and "E_BUSY" in r.stderr and "held by another process" in r.stderr
    figures("fleet concurrent sync on one directory", 1, 1, "second sync refused (E_BUSY)")


# ---- OCI registries --------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def registry(env):
    need("docker-registry")
    reg = Registry(env.d / "registry", env.pki)
    yield reg
    reg.stop()


def test_oci_pull_by_tag_and_digest(env, registry, tmp_path, figures):
    e, reg = env, registry
    digest = reg.push_model("models/stories", "v1", MODEL_BYTES,
                            extra_layers=[(b"license text", "application/vnd.ollama.image.license")])
    ref = "localhost:%d/models/stories:v1" % reg.port
    md = tmp_path / "m"
    r = e.kiri("pull", ref, "--models-dir", md, "--ca", e.pki.ca, "--json", "--disk-margin", "0")
    rep = report(r)
    assert r.returncode == 0 and rep["file"] == "stories-v1.gguf" and rep["sha256"] == MODEL_SHA, r.stderr
    assert sha_of(md / "stories-v1.gguf") == MODEL_SHA
    r = e.kiri("pull", "localhost:%d/models/stories@%s" % (reg.port, digest), "--models-dir", md, "--ca", e.pki.ca,
               "--json", "--sha256", MODEL_SHA, "--disk-margin", "0")
    assert r.returncode == 0 and report(r)["file"] == "stories.gguf", r.stderr
    # A --sha256 that is not the layer's is refused before the download.
    r = e.kiri("pull", ref, "--models-dir", tmp_path / "x", "--ca", e.pki.ca, "--json", "--sha256", e.alt_sha)
    assert r.returncode == 1 and report(r)["error_field"] == "sha256"
    # A digest reference whose manifest does not exist.
    r = e.kiri("pull", "localhost:%d/models/stories@sha256:%s" % (reg.port, "0" * 64), "--models-dir", tmp_path / "y",
               "--ca", e.pki.ca, "--json")
    assert r.returncode == 1 and report(r)["error_field"] == "http"
    figures("fleet OCI pull (tag, digest, wrong --sha256, unknown digest)", 4, 4,
            "docker-registry 2.8 over TLS, ollama media type beside a license layer")


def test_oci_in_manifest_and_mismatch(env, registry, tmp_path, figures):
    """A signed manifest whose model is oci://; then one whose sha256 is not the layer's (F15)."""
    e, reg = env, registry
    reg.push_model("models/alt", "q8", (e.ng.www / "alt.gguf").read_bytes())
    md = tmp_path / "m"
    oci = "oci://localhost:%d/models/alt:q8" % reg.port
    r, rep = sync(e, md, publish(e, "oci1", 1, [model_entry(name="alt", url=oci, sha=e.alt_sha, size=e.alt_size,
                                                            e=e)]), "--disk-margin", "0")
    assert r.returncode == 0 and rep["models"][0]["action"] == "installed", r.stderr
    assert sha_of(md / "alt.gguf") == e.alt_sha
    r, rep = sync(e, md, publish(e, "oci2", 2, [model_entry(name="alt", url=oci, sha=MODEL_SHA, size=MODEL_SIZE,
                                                            e=e)]), "--disk-margin", "0")
    m = rep["models"][0]
    assert r.returncode == 1 and m["error_field"] == "sha256" and "not the file the manifest names" in m["error"]
    assert sha_of(md / "alt.gguf") == e.alt_sha and leftovers(md) == []
    figures("fleet OCI model in a signed manifest; F15 layer mismatch", 2, 2, "installed; mismatch refused unfetched")


def test_oci_token_auth(env, tmp_path, figures):
    need("docker-registry")
    e = env
    tok = TokenServer(e.d / "token", e.pki.context())
    reg = Registry(e.d / "registry-token", e.pki, token=tok)
    try:
        reg.push_model("models/stories", "latest", MODEL_BYTES)
        n_push = len(tok.requests)
        md = tmp_path / "m"
        r = e.kiri("pull", "127.0.0.1:%d/models/stories" % reg.port, "--models-dir", md, "--ca", e.pki.ca, "--json",
                   "--disk-margin", "0")
        assert r.returncode == 0 and "wants a token" in r.stderr, r.stderr
        assert sha_of(md / "stories.gguf") == MODEL_SHA
        asked = tok.requests[n_push:]
        assert len(asked) == 1 and asked[0]["scope"] == ["repository:models/stories:pull"]
        assert asked[0]["service"] == ["kiri-test-registry"]
        # A realm on another host than the registry's is refused unless allowlisted.
        r = e.kiri("pull", "localhost:%d/models/stories" % reg.port, "--models-dir", tmp_path / "x", "--ca",
                   e.pki.ca, "--json")
        assert r.returncode == 1 and "foreign host" in report(r)["error"], r.stderr
        r = e.kiri("pull", "localhost:%d/models/stories" % reg.port, "--models-dir", tmp_path / "y", "--ca",
                   e.pki.ca, "--json", "--allow-host", "127.0.0.1", "--disk-margin", "0")
        assert r.returncode == 0, r.stderr
    finally:
        reg.stop()
        tok.stop()
    figures("fleet OCI bearer-token auth", 3, 3, "401 -> token (1 request) -> pull; foreign realm refused")
