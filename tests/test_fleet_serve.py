"""`kiri serve` as a fleet node, end to end, against the same machinery as test_fleet.py: a test CA
and nginx over TLS serving signed manifests and models, a node started with --fleet and a one
second --fleet-interval, and a small HTTPS heartbeat collector in this file.

  - the node serves what its directory holds at start (model A: stories260K), before any sync;
  - a new signed manifest points the model at B (a tiny random-weight model from
    make_tiny_models.py): within seconds /v1/models and /metrics show B's file hash and
    completions come from B, while a stream started on A (whose client stops reading, so the
    request holds A across the swap) completes with exactly A's text, and requests sent during
    the swap all get A's or B's answer (H29);
  - a tampered manifest, a replayed older one, one signed with another key and an expired one are
    refused (F01-F03): the rejection counter rises, the version and the model stay, requests are
    served;
  - a model file that passes the hash and the GGUF header check but is not a model (F14) is
    refused at load: the load-failure counter rises once, B keeps serving;
  - heartbeats reach the collector with the node's fields; a collector answering 500 is counted
    and changes nothing;
  - --models-dir with two models serves both by name, and a one-byte --models-memory keeps one
    loaded: the idle one is unloaded, and a request for the other while the loaded one is busy
    gets 503 with Retry-After.
Figures (answered as expected / sent) are printed at the end of the run.
"""
import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import KiriServer, request, sse_events
from test_fleet import MODEL, MODEL_SHA, PKI, Nginx, iso, need, sha_of

REPO = Path(__file__).resolve().parent.parent
INTERVAL = "1"


def wait_for(pred, timeout=20.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = pred()
        if v:
            return v
        time.sleep(0.1)
    raise AssertionError("timed out waiting for " + what)


class Collector:
    """An HTTPS heartbeat collector: records every POST /hb body; answers 500 while fail is set."""

    def __init__(self, ctx):
        self.beats, self.fail, self.lock = [], False, threading.Lock()
        owner = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                with owner.lock:
                    owner.beats.append((self.path, self.headers.get("Content-Type"), body))
                    code = 500 if owner.fail else 204
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def url(self):
        return "https://localhost:%d/hb" % self.port

    def stop(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def make_not_a_model(path):
    """A well-formed GGUF file (header, metadata, no tensors) that no model loader accepts."""
    import gguf
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_context_length(64)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def fl(tmp_path_factory):
    from conftest import kiri_binary
    b = kiri_binary()
    if not b.exists():
        pytest.skip("%s is not built" % b)
    if "--fleet" not in subprocess.run([str(b), "serve", "--help"], capture_output=True, text=True).stdout:
        pytest.skip("%s was built without the fleet node" % b)
    need("openssl")
    need("nginx")
    d = tmp_path_factory.mktemp("fleetnode")
    pki = PKI(d / "pki")

    def kiri(*args, check=0):
        r = subprocess.run([str(b), *map(str, args)], capture_output=True, text=True, timeout=120)
        assert r.returncode == check, "kiri %s -> %d\n%s" % (" ".join(map(str, args)), r.returncode, r.stderr[-2000:])
        return r

    kiri("fleet", "keygen", "--out", d / "keys")
    kiri("fleet", "keygen", "--out", d / "otherkeys")
    ng = Nginx(d / "nginx", pki)
    shutil.copy(MODEL, ng.www / "a.gguf")
    r = subprocess.run([sys.executable, str(REPO / "tests" / "make_tiny_models.py"), "--out", str(d / "tiny"),
                        "llama-spm-F32"], capture_output=True, text=True, timeout=120)
    tiny = d / "tiny" / "llama-spm-F32.gguf"
    if not tiny.exists():
        pytest.skip("make_tiny_models.py could not write the second model: " + r.stderr[-500:])
    shutil.copy(tiny, ng.www / "b.gguf")
    make_not_a_model(ng.www / "notmodel.gguf")
    (ng.www / "manifests").mkdir()
    ng.start()
    col = Collector(pki.context())

    class F:
        pass

    e = F()
    e.d, e.pki, e.ng, e.col, e.kiri, e.bin = d, pki, ng, col, kiri, b
    e.priv, e.pub, e.other_priv = d / "keys" / "fleet-key.pem", d / "keys" / "fleet-pub.pem", d / "otherkeys" / "fleet-key.pem"
    e.files = {n: (sha_of(ng.www / (n + ".gguf")), (ng.www / (n + ".gguf")).stat().st_size)
               for n in ("a", "b", "notmodel")}
    assert e.files["a"][0] == MODEL_SHA
    e.url = ng.url("manifests/node.json")
    yield e
    col.stop()
    ng.stop()


def entry(e, name, file):
    sha, size = e.files[file]
    return {"name": name, "url": e.ng.url(file + ".gguf"), "size": size, "sha256": sha, "type": "gguf"}


def sign(e, version, models, key=None, expires=None, issued=None):
    now = time.time()
    m = {"version": version, "issued": iso(issued if issued is not None else now - 3600),
         "expires": iso(expires if expires is not None else now + 30 * 86400), "models": models,
         "routing": "local-first", "upstream_url": "https://api.example.com/v1",
         "heartbeat_url": e.col.url()}
    src = e.d / ("v%d.json" % version)
    src.write_text(json.dumps(m, indent=1))
    return e.kiri("fleet", "sign", "--key", key or e.priv, src).stdout


def publish(e, envelope):
    """Replaces the node's manifest atomically (nginx never serves half a file)."""
    tmp = e.ng.www / "manifests" / "node.json.tmp"
    tmp.write_text(envelope)
    os.replace(tmp, e.ng.www / "manifests" / "node.json")


def metric(node, name):
    return node.metrics().get(name, 0.0)


def model_info(node):
    """{model id: (sha256, loaded)} from kiri_model_info."""
    out = {}
    for k in node.metrics():
        if k.startswith("kiri_model_info{"):
            labels = dict(p.split("=", 1) for p in k[len("kiri_model_info{"):-1].split(","))
            out[labels["model"].strip('"')] = (labels["sha256"].strip('"'), labels["loaded"].strip('"') == "1")
    return out


def complete(node, body, timeout=60):
    r = node.post("/v1/completions", body, timeout=timeout)
    return r, ([c["text"] for c in sorted(r.json["choices"], key=lambda c: c["index"])] if r.status == 200 else None)


def stream_texts(reply):
    """(events, texts by choice index, finish reasons by index) of a streamed completion."""
    texts, finishes = {}, {}
    events = sse_events(reply.body)
    for ev in events:
        if ev == "[DONE]":
            continue
        for c in json.loads(ev)["choices"]:
            texts[c["index"]] = texts.get(c["index"], "") + c["text"]
            if c.get("finish_reason"):
                finishes[c["index"]] = c["finish_reason"]
    return events, [texts.get(i, "") for i in range(len(texts))], finishes


class Streams:
    """n streaming requests at once, each in its own thread; join() returns their replies. With
    more sequences than --parallel, the later ones wait in the model's queue, so together they
    hold the model for seconds."""

    def __init__(self, port, body, n):
        self.replies = [None] * n
        self.threads = [threading.Thread(target=self.one, args=(port, dict(body, stream=True), i)) for i in range(n)]
        for t in self.threads:
            t.start()

    def one(self, port, body, i):
        try:
            self.replies[i] = request(port, "POST", "/v1/completions", body, timeout=120)
        except OSError as ex:
            self.replies[i] = ex

    def join(self):
        for t in self.threads:
            t.join(150)
        return self.replies


# ---- The fleet node ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def node(fl, tmp_path_factory):
    """A node whose directory already holds manifest v1 (model m = A), installed by `kiri fleet
    sync`; the fleet then serves the same v1 until a test publishes another."""
    md = fl.d / "node-models"
    fl.v1 = sign(fl, 1, [entry(fl, "m", "a")])
    publish(fl, fl.v1)
    fl.kiri("fleet", "sync", "--pubkey", fl.pub, "--models-dir", md, "--manifest-url", fl.url, "--ca", fl.pki.ca)
    s = KiriServer(fl.bin, tmp_path_factory.mktemp("node"),
                   ["--models-dir", md, "--fleet", fl.url, "--fleet-key", fl.pub, "--fleet-ca", fl.pki.ca,
                    "--fleet-interval", INTERVAL, "--node-name", "edge-7", "--parallel", "8", "--queue", "256"],
                   model=False)
    s.start()
    s.md = md
    yield s
    s.check_clean_exit()


GREEDY = {"model": "m", "prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}
STREAMED = {"model": "m", "prompt": "The cat", "max_tokens": 200, "temperature": 0, "n": 4}


def test_serves_held_model_at_start(fl, node, figures):
    r = node.get("/v1/models")
    assert r.status == 200 and [m["id"] for m in r.json["data"]] == ["m"]
    r, texts = complete(node, GREEDY)
    assert r.status == 200 and r.json["model"] == "m" and texts[0], r
    fl.a_text = texts[0]
    assert model_info(node)["m"] == (fl.files["a"][0], True)
    wait_for(lambda: metric(node, "kiri_fleet_syncs_total") >= 1, what="the first sync")
    assert metric(node, "kiri_fleet_manifest_version") == 1
    assert metric(node, "kiri_fleet_manifest_rejections_total") == 0
    figures("fleet node: serves the held manifest at start", 1, 1, "v1 from the directory, sync ok")


def test_hot_swap_during_stream(fl, node, figures):
    """H29: streams and plain requests keep coming while the model is swapped from A to B; each
    one gets exactly A's or B's answer (a stream that started on A ends on A), at least one held A
    across the swap, and afterwards B serves and the metrics show B's hash."""
    r, ref_a = complete(node, STREAMED)
    assert r.status == 200 and len(ref_a) == 4
    answers, streamed, stop = [], [], threading.Event()

    def plain():
        while not stop.is_set():
            try:
                rr = request(node.port, "POST", "/v1/completions", GREEDY, timeout=60)
                answers.append((rr.status, rr.json["choices"][0]["text"] if rr.status == 200 else rr.headers))
            except OSError as ex:
                answers.append((0, str(ex)))

    def streams():
        while not stop.is_set():
            try:
                streamed.append(request(node.port, "POST", "/v1/completions", dict(STREAMED, stream=True), timeout=60))
            except OSError as ex:
                streamed.append(ex)

    workers = [threading.Thread(target=f) for f in (plain, plain, streams, streams, streams)]
    for w in workers:
        w.start()
    time.sleep(0.5)
    fl.v2 = sign(fl, 2, [entry(fl, "m", "b")])
    t0 = time.monotonic()
    publish(fl, fl.v2)
    wait_for(lambda: metric(node, "kiri_model_swaps_total") >= 1, 30, "the swap")
    swap_s = time.monotonic() - t0
    time.sleep(1.0)
    stop.set()
    for w in workers:
        w.join(90)
    assert model_info(node)["m"] == (fl.files["b"][0], True)
    assert metric(node, "kiri_fleet_manifest_version") == 2
    r, texts_b = complete(node, GREEDY)
    assert r.status == 200 and texts_b[0] != fl.a_text, "completions still come from A"
    fl.b_text = texts_b[0]
    r, ref_b = complete(node, STREAMED)
    assert r.status == 200 and ref_b != ref_a
    by = {"A": 0, "B": 0}
    for rep in streamed:
        assert not isinstance(rep, Exception) and rep.status == 200, rep
        events, texts, finishes = stream_texts(rep)
        assert events[-1] == "[DONE]" and set(finishes) == set(range(4)), events[-3:]
        assert texts in (ref_a, ref_b), "a stream mixed or corrupted the two models' text"
        by["A" if texts == ref_a else "B"] += 1
    log = node.log()
    assert "the retired slot's last request ended" in log, "no request held A across the swap"
    assert log.index("swapped to") < log.index("the retired slot's last request ended")
    assert by["A"] and by["B"]
    ok = [a for a in answers if a[0] == 200 and a[1] in (fl.a_text, fl.b_text)]
    retry = [a for a in answers if a[0] == 503 and "retry-after" in a[1]]
    assert len(ok) + len(retry) == len(answers) and answers, answers[:5]
    figures("H29 requests during a hot-swap", len(ok) + len(retry), len(answers),
            "%d by A or B (%d by B), %d 503; swap seen %.1f s after publishing"
            % (len(ok), sum(a[1] == fl.b_text for a in ok), len(retry), swap_s))
    figures("H29 streams during a hot-swap", by["A"] + by["B"], len(streamed),
            "%d with A's text, %d with B's; none mixed" % (by["A"], by["B"]))


def rejected_case(fl, node, figures, label, envelope):
    before = metric(node, "kiri_fleet_manifest_rejections_total")
    publish(fl, envelope)
    wait_for(lambda: metric(node, "kiri_fleet_manifest_rejections_total") > before, 20, label)
    sent, ok = 3, 0
    for _ in range(sent):
        r, texts = complete(node, GREEDY)
        ok += r.status == 200 and texts[0] == fl.b_text
    assert ok == sent
    assert metric(node, "kiri_fleet_manifest_version") == 2
    assert model_info(node)["m"] == (fl.files["b"][0], True)
    figures("fleet node %s" % label, ok, sent, "refused, counted; B serves, version 2")


def test_rejected_manifests_keep_serving(fl, node, figures):
    good3 = sign(fl, 3, [entry(fl, "m", "b")])
    env = json.loads(good3)
    man = base64.b64decode(env["manifest"]).replace(b'"version": 3', b'"version": 4')
    env["manifest"] = base64.b64encode(man).decode()
    rejected_case(fl, node, figures, "F01 tampered manifest", json.dumps(env))
    rejected_case(fl, node, figures, "F01 wrong key", sign(fl, 3, [entry(fl, "m", "b")], key=fl.other_priv))
    rejected_case(fl, node, figures, "F02 replayed older manifest", fl.v1)
    now = time.time()
    rejected_case(fl, node, figures, "F03 expired manifest",
                  sign(fl, 3, [entry(fl, "m", "b")], issued=now - 7200, expires=now - 3600))
    assert metric(node, "kiri_fleet_manifest_rejections_total") >= 4
    assert "manifest refused (signature" in node.log()


def test_invalid_model_is_refused(fl, node, figures):
    """F14: the new file matches its hash and has a GGUF header but does not load."""
    before = metric(node, "kiri_model_load_failures_total")
    publish(fl, sign(fl, 5, [entry(fl, "m", "notmodel")]))
    wait_for(lambda: metric(node, "kiri_model_load_failures_total") > before, 30, "the failed swap")
    assert metric(node, "kiri_fleet_manifest_version") == 5
    sent, ok = 3, 0
    for _ in range(sent):
        r, texts = complete(node, GREEDY)
        ok += r.status == 200 and texts[0] == fl.b_text
    assert ok == sent and model_info(node)["m"] == (fl.files["b"][0], True)
    assert metric(node, "kiri_model_swaps_total") == 1
    time.sleep(2.5)    # two more passes: the same bad file is not loaded again
    assert metric(node, "kiri_model_load_failures_total") == before + 1
    assert "failed to load" in node.log()
    figures("fleet node F14 hash ok, model does not load", ok, sent, "refused once, B serves")


def test_heartbeats(fl, node, figures):
    wait_for(lambda: any(json.loads(b).get("manifest_version") == 5 for _, _, b in fl.col.beats), 20,
             "a heartbeat with version 5")
    path, ctype, body = [x for x in fl.col.beats if json.loads(x[2])["manifest_version"] == 5][-1]
    hb = json.loads(body)
    version = subprocess.run([str(fl.bin), "--version"], capture_output=True, text=True).stdout.split()[-1]
    assert path == "/hb" and ctype == "application/json"
    assert hb["node"] == "edge-7" and hb["kiri_version"] == version and hb["backend"] == "cpu"
    assert hb["models"] == [{"name": "m", "sha256": fl.files["b"][0], "loaded": True}]
    assert hb["requests"]["total"] > 0 and hb["requests"]["running"] >= 0 and hb["uptime_seconds"] > 0
    assert hb["fleet"]["manifest_rejections"] >= 4 and hb["fleet"]["model_swaps"] == 1
    assert hb["fleet"]["model_load_failures"] >= 1
    fl.col.fail = True
    before = metric(node, "kiri_heartbeat_failures_total")
    wait_for(lambda: metric(node, "kiri_heartbeat_failures_total") > before, 20, "a failed heartbeat")
    fl.col.fail = False
    r, texts = complete(node, GREEDY)
    assert r.status == 200 and texts[0] == fl.b_text
    figures("fleet node heartbeats", 1, 1, "%d received; a 500 from the collector counted, serving on" % len(fl.col.beats))


def test_restart_after_invalid_model(fl, node, figures):
    """F14 after a restart: the directory holds the file that does not load (the fleet installed
    it; the version before is <name>.gguf.prev). A restarted node serves that previous version."""
    assert node.stop() == 0
    assert sha_of(node.md / "m.gguf") == fl.files["notmodel"][0] and sha_of(node.md / "m.gguf.prev") == fl.files["b"][0]
    s = KiriServer(fl.bin, node.log_dir, node.args, model=False).start()
    try:
        sent, ok = 3, 0
        for _ in range(sent):
            r, texts = complete(s, GREEDY)
            ok += r.status == 200 and texts[0] == fl.b_text
        assert ok == sent
        assert metric(s, "kiri_model_load_failures_total") == 1
        assert model_info(s)["m"] == ("", True)
        time.sleep(2.5)    # the next passes name the same bad file: not tried again
        assert metric(s, "kiri_model_load_failures_total") == 1
        assert "serving the previous version" in s.log()
        figures("fleet node F14 then restart", ok, sent, "the previous version (.prev) serves")
    finally:
        s.check_clean_exit()


# ---- --models-dir without a fleet ----------------------------------------------------------------------

def test_models_dir_by_name_and_eviction(fl, tmp_path, figures):
    md = tmp_path / "models"
    md.mkdir()
    shutil.copy(fl.ng.www / "a.gguf", md / "a.gguf")
    shutil.copy(fl.ng.www / "b.gguf", md / "b.gguf")
    (md / "notes.txt").write_text("not a model")
    s = KiriServer(fl.bin, tmp_path, ["--models-dir", md, "--models-memory", "1", "--parallel", "8",
                                      "--ctx", "4096"], model=False).start()
    try:
        assert sorted(m["id"] for m in s.get("/v1/models").json["data"]) == ["a", "b"]
        texts, sent, ok = {}, 0, 0
        for name in ("a", "b", "a", "b"):
            r = s.post("/v1/completions", dict(GREEDY, model=name))
            sent += 1
            ok += r.status == 200 and r.json["model"] == name
            texts.setdefault(name, r.json["choices"][0]["text"])
            assert r.json["choices"][0]["text"] == texts[name]
            assert s.metrics()["kiri_models_loaded"] == 1
        assert ok == sent and texts["a"] != texts["b"]
        assert s.metrics()["kiri_model_evictions_total"] >= 3
        r = s.post("/v1/completions", dict(GREEDY, model="c"))
        assert r.status == 404 and r.json["error"]["code"] == "model_not_found"
        # While requests hold b, the one-byte budget cannot take a: 503 with Retry-After.
        # Greedy: on this small-vocabulary model sampled sequences meet EOS within a few hundred
        # tokens, so sampled streams could end before the request for a arrives.
        streams = Streams(s.port, dict(STREAMED, model="b", max_tokens=1000, temperature=0, n=8), 6)
        deadline = time.monotonic() + 20   # b must be serving them (a loaded machine starts late)
        while s.metrics().get("kiri_requests_running", 0) < 1:
            assert time.monotonic() < deadline, "the streams on b never started"
            time.sleep(0.02)
        r = s.post("/v1/completions", dict(GREEDY, model="a"))
        busy_ok = r.status == 503 and "retry-after" in r.headers
        assert all(not isinstance(x, Exception) and x.status == 200 for x in streams.join())
        r2 = s.post("/v1/completions", dict(GREEDY, model="a"))
        assert busy_ok and r2.status == 200, (r, r2)
        assert "unloaded to make room" in s.log()
        figures("--models-dir two models, 1-byte budget", ok + 2, sent + 2,
                "served by name, idle one unloaded; 503 + Retry-After while the other is busy")
    finally:
        s.check_clean_exit()


# ---- Superseded models are removed after a good pass -----------------------------------------------

def test_superseded_models_removed(fl, tmp_path, figures):
    """Superseded models: after a pass that installs and swaps in everything, the models the fleet
    installed that the new manifest no longer names leave /v1/models and the directory (their
    .gguf and .gguf.prev), once their last request has ended; a changed model keeps exactly one
    previous version as .prev; a file put there by hand stays; a refused manifest or a failed
    pass removes nothing."""
    md = tmp_path / "models"
    url = fl.ng.url("manifests/prune.json")

    def pub(envelope):
        tmp = fl.ng.www / "manifests" / "prune.json.tmp"
        tmp.write_text(envelope)
        os.replace(tmp, fl.ng.www / "manifests" / "prune.json")

    def sync():
        fl.kiri("fleet", "sync", "--pubkey", fl.pub, "--models-dir", md, "--manifest-url", url, "--ca", fl.pki.ca)

    a, b = fl.files["a"][0], fl.files["b"][0]
    # x gets a kept previous version: installed as B, then replaced by A.
    pub(sign(fl, 1, [entry(fl, "y", "a"), entry(fl, "x", "b")]))
    sync()
    pub(sign(fl, 2, [entry(fl, "y", "a"), entry(fl, "x", "a")]))
    sync()
    assert sha_of(md / "x.gguf") == a and sha_of(md / "x.gguf.prev") == b and sha_of(md / "y.gguf") == a
    shutil.copy(fl.ng.www / "b.gguf", md / "hand.gguf")    # not the fleet's: never deleted
    s = KiriServer(fl.bin, tmp_path, ["--models-dir", md, "--fleet", url, "--fleet-key", fl.pub,
                                      "--fleet-ca", fl.pki.ca, "--fleet-interval", INTERVAL, "--parallel", "8",
                                      "--ctx", "4096"], model=False).start()

    def ids():
        return sorted(m["id"] for m in s.get("/v1/models").json["data"])

    def x_files():
        return [p.name for p in sorted(md.glob("x.gguf*"))]

    try:
        assert ids() == ["hand", "x", "y"]
        wait_for(lambda: metric(s, "kiri_fleet_syncs_total") >= 1, what="the first pass")
        assert metric(s, "kiri_model_removals_total") == 0

        # A manifest without x signed by another key: refused, nothing removed.
        pub(sign(fl, 3, [entry(fl, "y", "b")], key=fl.other_priv))
        wait_for(lambda: metric(s, "kiri_fleet_manifest_rejections_total") >= 1, 20, "the refusal")
        time.sleep(1.2)   # one more pass over the refused manifest
        assert x_files() == ["x.gguf", "x.gguf.prev"] and ids() == ["hand", "x", "y"]
        assert metric(s, "kiri_model_removals_total") == 0

        # An accepted manifest without x whose y cannot be downloaded: the pass fails, x stays.
        bad_y = dict(entry(fl, "y", "b"), url=fl.ng.url("missing.gguf"))
        pub(sign(fl, 3, [bad_y]))
        wait_for(lambda: metric(s, "kiri_fleet_manifest_version") == 3 and
                 metric(s, "kiri_fleet_sync_failures_total") >= 1, 30, "the failed pass")
        assert x_files() == ["x.gguf", "x.gguf.prev"] and ids() == ["hand", "x", "y"]
        assert metric(s, "kiri_model_removals_total") == 0
        r = s.post("/v1/completions", dict(GREEDY, model="x"))
        assert r.status == 200

        # Streams on x while manifest 4 drops x and changes y to B.
        streams = Streams(s.port, dict(STREAMED, model="x", max_tokens=1500, temperature=1.0, seed=5, n=4), 3)
        wait_for(lambda: metric(s, "kiri_requests_running") > 0, 10, "the streams on x")
        t0 = time.monotonic()
        pub(sign(fl, 4, [entry(fl, "y", "b")]))
        wait_for(lambda: "x" not in ids(), 30, "x leaving /v1/models")
        left_s = time.monotonic() - t0
        held = bool(x_files())     # the streams still hold x: its files wait for them
        replies = streams.join()
        wait_for(lambda: metric(s, "kiri_model_removals_total") >= 1, 30, "the removal")
        gone_s = time.monotonic() - t0
        for rep in replies:
            assert not isinstance(rep, Exception) and rep.status == 200, rep
            events, texts, finishes = stream_texts(rep)
            assert events[-1] == "[DONE]" and set(finishes) == set(range(4)) and all(texts), events[-3:]
        assert held and "after its last request" in s.log(), "no stream held x across the change"

        assert x_files() == []
        assert sha_of(md / "y.gguf") == b and sha_of(md / "y.gguf.prev") == a
        assert sha_of(md / "hand.gguf") == b
        leftovers = sorted(p.name for p in md.iterdir() if not p.name.startswith(".kiri-fleet"))
        assert leftovers == ["hand.gguf", "y.gguf", "y.gguf.prev"], leftovers
        assert "x" not in json.loads((md / ".kiri-fleet-state.json").read_text())["models"]
        assert ids() == ["hand", "y"]
        assert model_info(s)["y"][0] == b and "x" not in model_info(s)
        r = s.post("/v1/completions", dict(GREEDY, model="x"))    # local-first: tried upstream
        assert r.status != 200 and "not served here" in r.json["error"]["message"], r
        assert s.post("/v1/completions", dict(GREEDY, model="y")).status == 200
        assert s.post("/v1/completions", dict(GREEDY, model="hand")).status == 200
        assert metric(s, "kiri_model_removals_total") == 1 and metric(s, "kiri_model_removed_files_total") == 2
        log = s.log()
        assert "removed x.gguf (" in log and "removed x.gguf.prev (" in log
        time.sleep(1.2)   # a later pass removes nothing more
        assert metric(s, "kiri_model_removals_total") == 1 and sorted(p.name for p in md.glob("*.gguf*")) == leftovers
        figures("superseded model removed after a good pass", len(replies), len(replies),
                "streams on x all completed; x out of /v1/models %.1f s, files gone %.1f s after publishing; "
                "refused and failed passes removed nothing" % (left_s, gone_s))
    finally:
        s.check_clean_exit()
