"""`kiri serve` over HTTPS with a certificate chain made here: a self-signed test CA (EC P-256)
signs the server's certificate for 127.0.0.1. Clients that trust that CA (curl --cacert, the
`openai` client, Python's ssl) are served; clients that do not refuse the server; plain HTTP sent
to the TLS port gets no HTTP answer and a closed connection, and the port keeps serving.

Certificates come from the openssl command-line tool (Debian package openssl); curl is the Debian
package curl. The handshake's own fault cases (idle and half-open connections, cipher policy) are
in test_tls_handshake.py, against the same CivetWeb + mbedTLS build.
"""
import json
import shutil
import socket
import ssl
import subprocess
import time

import pytest

from conftest import MODEL_ID, KiriServer, raw_exchange

openai = pytest.importorskip("openai")


def openssl(*args, cwd):
    r = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command-line tool makes the test certificates (apt-get install openssl)")
    d = tmp_path_factory.mktemp("pki")
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=d)
    openssl("req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "2", "-subj", "/CN=kiri test CA",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-out", "ca.pem", cwd=d)
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "server.key", cwd=d)
    openssl("req", "-new", "-key", "server.key", "-subj", "/CN=127.0.0.1", "-out", "server.csr", cwd=d)
    (d / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                               "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
                               "authorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-days", "2", "-sha256", "-extfile", "ext.cnf", "-out", "server.pem", cwd=d)
    return d


@pytest.fixture(scope="module")
def tls_server(kiri_bin, pki, tmp_path_factory):
    s = KiriServer(kiri_bin, tmp_path_factory.mktemp("tls"),
                   ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
                    "--parallel", "2", "--idle-timeout", "3"], tls=True)
    s.ssl_context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    s.start()
    yield s
    s.check_clean_exit()


def curl(*args):
    if shutil.which("curl") is None:
        pytest.fail("curl is needed (apt-get install curl)")
    return subprocess.run(["curl", "-sS", "--max-time", "60", *args], capture_output=True, text=True, timeout=90)


def test_curl_over_https(tls_server, pki):
    url = tls_server.url
    r = curl("--cacert", str(pki / "ca.pem"), "-w", "\n%{http_code} %{ssl_verify_result}", url + "/health")
    assert r.returncode == 0, r.stderr
    body, _, tail = r.stdout.rpartition("\n")
    assert json.loads(body) == {"status": "ok"} and tail == "200 0"
    r = curl("--cacert", str(pki / "ca.pem"), "-H", "Content-Type: application/json", url + "/v1/chat/completions",
             "-d", json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5, "temperature": 0}))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["usage"]["completion_tokens"] == 5
    # Streaming over TLS: every event arrives, ending in [DONE].
    r = curl("-N", "--cacert", str(pki / "ca.pem"), url + "/v1/completions", "-H", "Content-Type: application/json",
             "-d", json.dumps({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": True}))
    assert r.returncode == 0, r.stderr
    events = [e[6:] for e in r.stdout.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) == 8, events


def test_untrusted_certificate_refused(tls_server):
    """Without the test CA the client refuses the server (curl exit 60: certificate problem)."""
    r = curl(tls_server.url + "/health")
    assert r.returncode == 60, (r.returncode, r.stderr)
    with pytest.raises(ssl.SSLCertVerificationError):
        with socket.create_connection(("127.0.0.1", tls_server.port), timeout=10) as s:
            ssl.create_default_context().wrap_socket(s, server_hostname="127.0.0.1")


def test_openai_client_over_https(tls_server, pki):
    http_client = openai.DefaultHttpxClient(verify=ssl.create_default_context(cafile=str(pki / "ca.pem")))
    with openai.OpenAI(base_url=tls_server.url + "/v1", api_key="unused", max_retries=0, timeout=60,
                       http_client=http_client) as c:
        assert [m.id for m in c.models.list().data] == [MODEL_ID]
        whole = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=12, temperature=0)
        parts = c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=12, temperature=0, stream=True)
        assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == \
            whole.choices[0].message.content
        with pytest.raises(openai.BadRequestError):
            c.chat.completions.create(model=MODEL_ID, messages=[{"role": "user", "content": "Hi"}], top_p=7)


def test_plain_http_to_tls_port(tls_server, figures):
    """H20: plaintext HTTP gets no HTTP answer (nothing the client could take for one) and the
    connection is closed promptly; HTTPS clients are served meanwhile and after."""
    n = 5
    for _ in range(n):
        out, closed, secs = raw_exchange(tls_server.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
                                         timeout=10)
        assert closed and secs < 5, (closed, secs)
        assert not out.startswith(b"HTTP/"), out[:200]
        assert tls_server.get("/health").status == 200
    # A client that connects and sends nothing is dropped at the idle timeout (3 s here).
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", tls_server.port), timeout=10) as s:
        assert tls_server.get("/health").status == 200
        assert s.recv(100) == b""
    assert 2.0 <= time.monotonic() - t0 <= 6.0
    r = tls_server.post("/v1/completions", {"prompt": "Once", "max_tokens": 2})
    assert r.status == 200, r
    figures("H20 plain HTTP to the TLS port", n, n, "no HTTP answer, closed; HTTPS served meanwhile")
