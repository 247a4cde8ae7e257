"""Routing to a cloud upstream (`kiri serve --upstream URL --route ...`), end to end on 127.0.0.1.

The upstream is a second `kiri serve` (stories260K) where a real server is needed, and a small
Python process (FAKE below, started as a subprocess so it can be SIGKILLed) where a fault must be
scripted: an endless slow event stream, a stream cut off before [DONE], a server that sleeps past
the timeout, one answering 500, HTML or invalid JSON. Every case asserts that every client request
is answered, and that X-Kiri-Served-By says where; the figures ("answered as expected / sent")
are printed at the end of the run (conftest.py). Upstream faults F16-F20 (docs/fleet.md, "Routing").

Behaviour under test (docs/fleet.md, "Routing"):
  - cloud-first: forwarded; connect errors, timeouts, 5xx and an open breaker fall back to local;
  - garbage (HTML, invalid JSON) -> 502 with a clear message, not a local fallback: the upstream
    did answer, so the request may have run there, and a proxy or portal answering HTML is a
    fault the operator must see (F17). It still counts as a breaker failure, so after three such
    answers the breaker opens and requests are served locally;
  - a stream that breaks after it began -> an error event, no [DONE], the stream ends (F19);
  - local-first: forwarded when requests wait locally (--route-queue) or the model is not here;
  - an https:// upstream is verified against --upstream-ca (a CA made here by the openssl CLI).
"""
import http.client
import json
import shutil
import signal
import ssl
import subprocess
import sys
import threading
import time

import pytest

from conftest import MODEL_ID, KiriServer, free_port, sse_events

PROMPT = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}

FAKE = r'''
import json, socket, sys, threading, time
mode, log = sys.argv[1], sys.argv[2]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0))
srv.listen(64)
print(srv.getsockname()[1], flush=True)

def send(c, status, ctype, body):
    c.sendall(b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
              % (status, ctype.encode(), len(body)) + body)

def handle(c):
    try:
        data = b""
        while b"\r\n\r\n" not in data:
            d = c.recv(65536)
            if not d:
                return
            data += d
        head, rest = data.split(b"\r\n\r\n", 1)
        n = 0
        for line in head.split(b"\r\n")[1:]:
            k, _, v = line.partition(b":")
            if k.strip().lower() == b"content-length":
                n = int(v)
        while len(rest) < n:
            d = c.recv(65536)
            if not d:
                break
            rest += d
        with open(log, "ab") as f:
            f.write(head + b"\r\n\r\n")
        if mode == "sleep":
            time.sleep(30)
        elif mode == "429":
            c.sendall(b"HTTP/1.1 429 X\r\nRetry-After: 7\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        elif mode == "500":
            send(c, 500, "application/json", b'{"error":{"message":"boom","type":"server_error"}}')
        elif mode == "html":
            send(c, 200, "text/html", b"<html><body><h1>Captive portal: please log in</h1></body></html>")
        elif mode == "badjson":
            send(c, 200, "application/json", b'{"choices": [{"text": "x"')
        elif mode in ("slow-sse", "trunc-sse"):
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n")
            for i in range(100000 if mode == "slow-sse" else 3):
                ev = {"id": "cmpl-fake", "object": "text_completion", "model": "fake",
                      "choices": [{"index": 0, "text": " tok%d" % i, "finish_reason": None}]}
                c.sendall(b"data: " + json.dumps(ev).encode() + b"\n\n")
                time.sleep(0.1)
    finally:
        c.close()

while True:
    c, _ = srv.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
'''


class Fake:
    """The scripted upstream: a subprocess, its port, and the request heads it received."""

    def __init__(self, tmp_path, mode):
        self.log = tmp_path / ("fake-%s.heads" % mode)
        self.proc = subprocess.Popen([sys.executable, "-c", FAKE, mode, str(self.log)], stdout=subprocess.PIPE)
        self.port = int(self.proc.stdout.readline())
        self.url = "http://127.0.0.1:%d" % self.port

    def heads(self):
        return self.log.read_bytes().decode(errors="replace") if self.log.exists() else ""

    def kill(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@pytest.fixture
def fake(tmp_path):
    started = []

    def start(mode):
        f = Fake(tmp_path, mode)
        started.append(f)
        return f
    yield start
    for f in started:
        f.kill()


def served_by(r):
    return r.headers.get("x-kiri-served-by")


def completion(server, body=None, **kw):
    return server.post("/v1/completions", dict(PROMPT, **(body or {})), **kw)


def stream_text(reply):
    text = ""
    for e in sse_events(reply.body):
        if e != "[DONE]":
            text += json.loads(e)["choices"][0]["text"]
    return text


def metric(server, name):
    return server.metrics().get(name, 0.0)


# ---- cloud-first -----------------------------------------------------------------------------------

def test_cloud_first_relays_streams_and_uses_the_upstream_key(start_server, tmp_path, figures):
    key = tmp_path / "upstream.key"
    key.write_text("sk-upstream-7f3a\n")
    up = start_server(["--parallel", "2", "--api-key-file", str(key)])
    front = start_server(["--upstream", up.url, "--route", "cloud-first", "--upstream-key-file", str(key)])
    auth = {"Authorization": "Bearer sk-upstream-7f3a"}
    sent = answered = 0
    for stream in (False, True, False, True):
        body = {"stream": True} if stream else {}
        direct = completion(up, body, headers=auth)
        # The client's own Authorization goes nowhere: the front has no keys, the upstream
        # accepts only the front's key.
        via = completion(front, body, headers={"Authorization": "Bearer client-secret"})
        sent += 1
        assert direct.status == 200 and via.status == 200, (direct, via)
        assert served_by(via) == "upstream"
        if stream:
            # Relayed event by event: the same events, so the same text token by token.
            assert via.headers["content-type"].startswith("text/event-stream")
            assert len(sse_events(via.body)) == len(sse_events(direct.body)) > 3
            assert stream_text(via) == stream_text(direct) != ""
            assert sse_events(via.body)[-1] == "[DONE]"
        else:
            assert via.json["choices"][0]["text"] == direct.json["choices"][0]["text"]
        answered += 1
    m = front.metrics()
    assert m['kiri_route_requests_total{served_by="upstream"}'] == 4
    assert m['kiri_route_requests_total{served_by="local"}'] == 0
    # The upstream really served them (4 direct + 4 forwarded), with the front's key. It counts a
    # request once its handler returns, a moment after the last byte went out.
    name = 'kiri_requests_total{endpoint="/v1/completions",status="200"}'
    t0 = time.monotonic()
    while up.metrics(headers=auth).get(name) != 8 and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert up.metrics(headers=auth)[name] == 8
    assert "sk-upstream-7f3a" not in front.log()
    figures("F route cloud-first happy path (stream relayed)", answered, sent, "all served upstream")


def test_upstream_key_refused_falls_back_with_an_alert(start_server, tmp_path, figures):
    key = tmp_path / "upstream.key"
    key.write_text("sk-right\n")
    wrong = tmp_path / "wrong.key"
    wrong.write_text("sk-wrong-19c2\n")
    up = start_server(["--api-key-file", str(key)])
    front = start_server(["--upstream", up.url, "--route", "cloud-first", "--upstream-key-file", str(wrong)])
    rs = [completion(front) for _ in range(2)]
    assert all(r.status == 200 and served_by(r) == "local" for r in rs), rs
    log = front.log()
    assert "ALERT" in log and "401" in log
    assert "sk-wrong-19c2" not in log
    assert metric(front, 'kiri_upstream_failures_total{reason="auth"}') == 2
    figures("F18 upstream 401 (wrong key)", sum(r.status == 200 for r in rs), len(rs), "-> local, alert logged")


def test_upstream_killed_mid_stream(start_server, fake, figures):
    f = fake("slow-sse")
    front = start_server(["--upstream", f.url, "--route", "cloud-first"])
    c = http.client.HTTPConnection("127.0.0.1", front.port, timeout=15)
    c.request("POST", "/v1/completions", body=json.dumps(dict(PROMPT, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200 and r.getheader("X-Kiri-Served-By") == "upstream"
    events = []
    while len(events) < 3:
        line = r.readline()
        assert line, "the stream ended before the kill"
        if line.startswith(b"data: "):
            events.append(line[6:].strip())
    t_kill = time.monotonic()
    f.kill()
    rest = r.read()   # must end: no hang
    secs = time.monotonic() - t_kill
    c.close()
    tail = [line for line in rest.decode().splitlines() if line.startswith("data: ")]
    assert tail, rest
    last = json.loads(tail[-1][6:])
    assert "error" in last and "upstream" in last["error"]["message"], last
    assert "data: [DONE]" not in tail
    assert secs < 5
    # The next request finds the upstream dead and is served locally.
    r2 = completion(front)
    assert r2.status == 200 and served_by(r2) == "local"
    figures("F19 upstream SIGKILLed mid-stream", 2, 2,
            "-> error event after %.2f s, next request local" % secs)


def test_truncated_stream_ends_with_an_error_event(start_server, fake, figures):
    f = fake("trunc-sse")
    front = start_server(["--upstream", f.url, "--route", "cloud-first"])
    r = completion(front, {"stream": True})
    assert r.status == 200 and served_by(r) == "upstream"
    ev = sse_events(r.body)
    assert len(ev) == 4 and "[DONE]" not in ev
    assert [json.loads(e)["choices"][0]["text"] for e in ev[:3]] == [" tok0", " tok1", " tok2"]
    assert "without its final [DONE]" in json.loads(ev[-1])["error"]["message"]
    figures("F19 upstream stream cut before [DONE]", 1, 1, "-> 3 events relayed + error event")


def test_upstream_dead_breaker_opens_then_recovers(start_server, kiri_bin, tmp_path, figures):
    port = free_port()
    up = KiriServer(kiri_bin, tmp_path, ["--parallel", "2"], port=port).start()
    front = start_server(["--upstream", "http://127.0.0.1:%d" % port, "--route", "cloud-first"])
    assert served_by(completion(front)) == "upstream"
    up.stop(signal.SIGKILL)
    sent = answered = 0
    for _ in range(6):
        r = completion(front)
        sent += 1
        answered += r.status == 200 and served_by(r) == "local"
    assert answered == sent
    m = front.metrics()
    assert m["kiri_upstream_breaker_state"] in (1, 2)      # open (or cooling down to a probe)
    assert m["kiri_upstream_breaker_opens_total"] >= 1
    assert m['kiri_upstream_failures_total{reason="connect"}'] == 3   # then the breaker answered
    assert m['kiri_upstream_failures_total{reason="breaker_open"}'] >= 1
    assert m["kiri_route_fallbacks_total"] == 6
    # The cloud comes back: a half-open probe finds it and the breaker closes.
    up = KiriServer(kiri_bin, tmp_path, ["--parallel", "2"], port=port).start()
    t0 = time.monotonic()
    recovered = None
    while time.monotonic() - t0 < 20:
        r = completion(front)
        sent += 1
        if r.status == 200:
            answered += 1
        if served_by(r) == "upstream":
            recovered = time.monotonic() - t0
            break
        time.sleep(0.25)
    assert recovered is not None, front.log()[-2000:]
    assert metric(front, "kiri_upstream_breaker_state") == 0
    assert answered == sent
    up.check_clean_exit()
    figures("F20 upstream dead, then restored", answered, sent,
            "breaker opened; upstream again after %.1f s" % recovered)


def test_upstream_slow_past_the_timeout(start_server, fake, figures):
    f = fake("sleep")
    front = start_server(["--upstream", f.url, "--route", "cloud-first", "--upstream-timeout", "1"])
    rs, secs = [], []
    for body in ({}, {"stream": True}):
        t0 = time.monotonic()
        rs.append(completion(front, body))
        secs.append(time.monotonic() - t0)
    assert all(r.status == 200 and served_by(r) == "local" for r in rs), rs
    assert stream_text(rs[1]) != "" and sse_events(rs[1].body)[-1] == "[DONE]"
    assert max(secs) < 5
    assert metric(front, 'kiri_upstream_failures_total{reason="timeout"}') == 2
    figures("F16 upstream slow past the 1 s timeout", len(rs), 2, "-> local in <= %.1f s" % max(secs))


def test_upstream_500_falls_back(start_server, fake, tmp_path, figures):
    f = fake("500")
    key = tmp_path / "k"
    key.write_text("sk-front-only\n")
    front = start_server(["--upstream", f.url, "--route", "cloud-first", "--upstream-key-file", str(key)])
    client = {"Authorization": "Bearer client-secret", "Cookie": "session=abc"}
    rs = [completion(front, {"stream": s}, headers=client) for s in (False, True, False)]
    assert all(r.status == 200 and served_by(r) == "local" for r in rs), rs
    assert metric(front, 'kiri_upstream_failures_total{reason="status"}') == 3
    # What the upstream received: the front's key, none of the client's headers.
    heads = f.heads()
    assert heads.count("Authorization: Bearer sk-front-only") == 3
    assert "client-secret" not in heads and "session=abc" not in heads
    figures("F upstream answering 500", len(rs), 3, "-> local")


def test_upstream_429_falls_back_or_passes_retry_after(start_server, fake, figures):
    f = fake("429")
    front = start_server(["--upstream", f.url, "--route", "cloud-first", "--alias", "edge-model"])
    here = completion(front)
    # A model this node does not serve cannot fall back: the upstream's 429 and Retry-After.
    there = completion(front, {"model": "cloud-only-model"})
    assert here.status == 200 and served_by(here) == "local"
    assert there.status == 429 and there.headers["retry-after"] == "7" and served_by(there) == "upstream", there
    assert "cloud-only-model" in there.json["error"]["message"]
    assert metric(front, 'kiri_upstream_failures_total{reason="rate_limited"}') == 2
    figures("F18 upstream 429", 2, 2, "-> local; 429 + Retry-After: 7 for a model not here")


@pytest.mark.parametrize("mode,why", [("html", "HTML"), ("badjson", "not valid JSON")])
def test_upstream_garbage_is_502_then_breaker_serves_locally(start_server, fake, figures, mode, why):
    f = fake(mode)
    front = start_server(["--upstream", f.url, "--route", "cloud-first"])
    first = [completion(front, {"stream": s}) for s in (False, True, False)]
    for r in first:
        assert r.status == 502 and served_by(r) == "upstream", r
        assert why in r.json["error"]["message"] or "not an event stream" in r.json["error"]["message"], r
    # Three failures opened the breaker: now served here.
    later = [completion(front) for _ in range(2)]
    assert all(r.status == 200 and served_by(r) == "local" for r in later), later
    assert metric(front, "kiri_upstream_breaker_state") in (1, 2)
    figures("F17 upstream answering %s" % mode, len(first) + len(later), 5,
            "-> 502 with a reason x3, then breaker open -> local x2")


def test_https_upstream_verified_with_its_ca(start_server, kiri_bin, tmp_path, figures):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command-line tool makes the test certificates (apt-get install openssl)")

    def openssl(*args):
        r = subprocess.run(["openssl", *args], cwd=tmp_path, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
            "-subj", "/CN=route test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign", "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-subj", "/CN=127.0.0.1", "-keyout", "up.key", "-out", "up.csr")
    (tmp_path / "ext.cnf").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "up.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "2",
            "-extfile", "ext.cnf", "-out", "up.pem")
    up = KiriServer(kiri_bin, tmp_path, ["--tls-cert", str(tmp_path / "up.pem"), "--tls-key",
                                         str(tmp_path / "up.key")], tls=True)
    up.ssl_context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
    up.start()
    try:
        trusted = start_server(["--upstream", up.url, "--upstream-ca", str(tmp_path / "ca.pem"),
                                "--route", "cloud-first"])
        rs = [completion(trusted, {"stream": s}) for s in (False, True)]
        assert all(r.status == 200 and served_by(r) == "upstream" for r in rs), rs
        assert sse_events(rs[1].body)[-1] == "[DONE]"
        # Without the CA (the system bundle): the certificate is refused, served here.
        untrusted = start_server(["--upstream", up.url, "--route", "cloud-first"])
        r = completion(untrusted)
        assert r.status == 200 and served_by(r) == "local"
        assert "certificate refused" in untrusted.log()
    finally:
        up.check_clean_exit()
    figures("F route https upstream (own CA; untrusted)", 3, 3, "upstream x2; untrusted -> local")


# ---- local-first -----------------------------------------------------------------------------------

def test_local_first_spills_when_the_queue_is_long(start_server, figures):
    up = start_server(["--parallel", "4"])
    front = start_server(["--upstream", up.url, "--parallel", "1", "--queue", "8", "--route-queue", "1"])
    results = [None] * 8

    def one(i):
        results[i] = completion(front, {"max_tokens": 200, "seed": i})
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(r is not None and r.status == 200 for r in results), results
    where = [served_by(r) for r in results]
    assert set(where) <= {"local", "upstream"}
    assert where.count("upstream") >= 1 and where.count("local") >= 1, where
    m = front.metrics()
    assert m['kiri_route_requests_total{served_by="upstream"}'] == where.count("upstream")
    assert m['kiri_route_requests_total{served_by="local"}'] == where.count("local")
    figures("F route local-first, 8 at once, --parallel 1", len(results), len(results),
            "%d local, %d upstream" % (where.count("local"), where.count("upstream")))


def test_local_first_forwards_models_not_served_here(start_server):
    up = start_server([])
    front = start_server(["--upstream", up.url, "--alias", "edge-model"])
    here = completion(front, {"model": "edge-model"})
    there = completion(front, {"model": MODEL_ID})
    default = completion(front)
    assert here.status == 200 and served_by(here) == "local"
    assert there.status == 200 and served_by(there) == "upstream" and there.json["model"] == MODEL_ID
    assert default.status == 200 and served_by(default) == "local"
    # Errors of the generation endpoints say where too; other endpoints are never routed.
    r = front.post("/v1/completions", "{not json")
    assert r.status == 400 and served_by(r) == "local"
    r = front.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                             "stream": True})
    assert r.status == 200 and served_by(r) == "local"
    assert front.get("/v1/models").headers.get("x-kiri-served-by") is None
