#!/usr/bin/env python3
"""Serving speed: `kiri serve` against llama.cpp's own `llama-server` on the same GGUF file and
thread count, both on 127.0.0.1, one server at a time.

The peer is llama-server as a user runs it for several clients: continuous batching (its default,
passed explicitly) with as many slots as kiri's --parallel, built from the llama.cpp source that
the pinned llama-cpp-python sdist vendors (bench/build_llama_cpp.sh). For each number of
concurrent clients (default 1, 4, 8, 16) each side gets a fresh server, the two sides alternating
(kiri first at the first level, llama.cpp first at the next, and so on):

  kiri       `kiri serve -m M -t T --parallel P --ctx S --kv-memory KV --backend B --port PORT`
  llama.cpp  `llama-server -m M -t T -tb T -np P -c P*S --cont-batching --no-webui --port PORT`
             (-c is the whole KV cache, split into P slots of S tokens)

S is the per-sequence context (--slot-ctx, default 1024) and KV, unless given, is what P
sequences of S tokens take in an F16 cache, so both servers get the same KV capacity.

After one short warm-up request, C client threads each send streaming `POST /v1/completions`
requests (a 48-token prompt with TinyLlama's vocabulary, max_tokens 64, temperature 0), one after
another, until --duration seconds have passed; requests already started finish. Measured at the
client:

  aggregate tok/s  generated tokens of all requests / (last answer's end - start of the level)
  TTFT             request sent -> first streamed chunk with a choice; p50 and p99 (nearest rank:
                   with fewer than 100 requests p99 is the slowest one)

Generated tokens: the `usage` chunk (both servers send one with stream_options.include_usage),
else max_tokens when finish_reason is "length", else the number of non-empty chunks. Every
request's prompt starts with its own number ("Request 12: ..."), so neither server's prefix reuse
(kiri's prefix cache, llama-server's prompt cache) skips the prompt; --same-prompt sends one
identical prompt instead.

Also measured, on kiri alone:

  single stream  decode tok/s of one streamed request through `kiri serve` ((tokens - 1) / (last
                 token - first token), at the client) against `kiri bench -m M -t T -p NP -n 64
                 -d NP -r 1 --json` with NP = the prompt's token count (decode right after the
                 prompt, as in the server), alternated --rounds times while the server idles; best
                 of each. The target: within 5%.
  memory         /proc/PID/status and smaps of the server after warm-up and, sampled every 0.25 s
                 under load: VmRSS, RssAnon, the resident part of the mapped model file and of the
                 KV pool. The pool's size is kiri_kv_blocks_capacity x kiri_kv_block_size_tokens
                 (/metrics) x the F16 bytes per token (GGUF); it is anonymous memory and counts as
                 RssAnon once touched. "Other" = VmRSS - model file - KV pool (resident): the
                 server's own memory, split into anonymous pages and other files (binary,
                 libraries). Target: <= 20 MB. The peak under --rss-clients (default 8) is reported,
                 with llama-server's VmRSS and RssAnon under the same load.

The report names the CPU, kiri's kernel tier and the memory read bandwidth measured in the same
run (bench/membw.c, as bench_cpu.py).

Usage: bench_serve.py [--kiri PATH] [--llama-bin DIR] [--model FILE] [--threads T]
                      [--clients 1 4 8 16] [--duration S] [--max-tokens N] [--parallel P]
                      [--slot-ctx S] [--kv-memory SIZE] [--backend B] [--cpu-kernels TIER]
                      [--kiri-args "FLAGS"] [--llama-args "FLAGS"] [--rounds N] [--rss-clients C]
                      [--nice N] [--json PATH] [--same-prompt] [--no-llama] [--no-single] [--quick]
  Defaults: build/kiri, the folder bench/build_llama_cpp.sh prints, <repo>/build/bench-models/
  tinyllama-Q4_0.gguf (bench/make_models.py), T=2, 1, 4, 8 and 16 clients, 30 s per level and
  side, P=16, S=1024, KV=P*S tokens, B=auto, 3 single-stream rounds, C=8,
  <repo>/build/bench-serve.json (server logs beside it in bench-serve-logs/).
  --nice -20 runs both servers, kiri bench and this script's clients at a higher priority than
  other work on a shared machine (each server in its own session whose autogroup gets that nice
  value too; needs root). --quick: levels 1 and 4, 6 s each, 1 round (a smoke test, not a result).
"""

import argparse
import http.client
import json
import math
import os
import platform
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

try:
    import gguf  # the test venv's (scripts/make-venv.sh), as in bench_cpu.py
except ImportError:
    raise SystemExit("bench_serve.py needs the gguf package: run it with the test venv's Python "
                     "(V=$(scripts/make-venv.sh); $V/bin/python bench/bench_serve.py ...)")

import bench_cpu  # noqa: E402  (beside this script)
from bench_cpu import _renice, cpu_name, tool_output, warm  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT_BODY = ("Once upon a time, there was a little robot who lived in a small town by the sea. "
               "Every morning it walked along the harbour, counted the boats and wrote a short "
               "story about the people it met.")
# kiri / llama-server at TARGET_CLIENTS clients (issue 13): aggregate >= 1.3x, p99 TTFT no worse.
TARGETS = {"aggregate": 1.3, "ttft_p99": 1.0, "single": 0.95, "other_mb": 20.0}
TARGET_CLIENTS = (4, 8, 16)
MiB = 1 << 20


# ------------------------------------------------------------------------------------------------
# Processes (the nice handling, page-cache warming and machine facts are bench_cpu.py's)
# ------------------------------------------------------------------------------------------------

def renice_self():
    """The client threads measure time: starved of CPU they would add to both sides' TTFT."""
    if not bench_cpu.NICE:
        return
    try:
        os.setsid()  # fails when already a process-group leader (run from an interactive shell)
    except OSError:
        os.setpriority(os.PRIO_PROCESS, 0, bench_cpu.NICE)  # leave the caller's session's autogroup alone
        return
    _renice()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, side, a, log_path):
        self.side = side
        self.port = free_port()
        if side == "kiri":
            self.cmd = [a.kiri, "serve", "-m", a.model, "-t", str(a.threads), "--parallel", str(a.parallel),
                        "--ctx", str(a.slot_ctx), "--kv-memory", a.kv_memory, "--backend", a.backend,
                        "--host", "127.0.0.1", "--port", str(self.port)]
            self.cmd += (["--cpu-kernels", a.cpu_kernels] if a.cpu_kernels else []) + shlex.split(a.kiri_args)
        else:
            self.cmd = [os.path.join(a.llama_bin, "llama-server"), "-m", a.model, "-t", str(a.threads),
                        "-tb", str(a.threads), "-np", str(a.parallel), "-c", str(a.parallel * a.slot_ctx),
                        "--cont-batching", "--no-webui", "--host", "127.0.0.1", "--port", str(self.port)]
            self.cmd += shlex.split(a.llama_args)
        self.ready_path = "/health"  # both: 200 once the model is loaded
        self.log_path = log_path
        self.log = open(log_path, "wb")
        self.t_spawn = time.perf_counter()
        self.p = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  start_new_session=True, preexec_fn=_renice)

    def wait_ready(self, timeout=120):
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.p.poll() is not None:
                break
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                c.request("GET", self.ready_path)
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    return time.perf_counter() - self.t_spawn
            except OSError:
                pass
            time.sleep(0.1)
        self.stop()
        with open(self.log_path, "rb") as f:
            tail = f.read()[-3000:].decode(errors="replace")
        raise SystemExit(f"{self.side} server did not start: {' '.join(self.cmd)}\n{tail}")

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=40)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait()
        self.log.close()


# ------------------------------------------------------------------------------------------------
# Memory of a running server
# ------------------------------------------------------------------------------------------------

def proc_memory(pid, model_path, kv_bytes):
    """VmRSS, RssAnon, RssFile and the resident bytes of the model file's mapping, from
    /proc/PID/status and smaps. The KV pool is one anonymous allocation of kv_bytes; the kernel
    may merge it with a neighbouring anonymous mapping, so its resident part is taken as
    min(kv_bytes, Rss of the largest anonymous mapping at least that big)."""
    out = {"vm_rss": 0, "rss_anon": 0, "rss_file": 0, "model_rss": 0, "kv_bytes": kv_bytes, "kv_rss": 0}
    names = {"VmRSS": "vm_rss", "RssAnon": "rss_anon", "RssFile": "rss_file"}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in names:
                    out[names[k]] = int(v.split()[0]) * 1024
        real_model = os.path.realpath(model_path)
        path, size = None, 0
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                parts = line.split()
                if not parts:
                    continue
                if "-" in parts[0] and not parts[0].endswith(":"):  # a mapping's header line
                    lo, hi = (int(x, 16) for x in parts[0].split("-"))
                    size = hi - lo
                    path = parts[5] if len(parts) > 5 else None
                elif parts[0] == "Rss:":
                    rss = int(parts[1]) * 1024
                    if path == real_model:
                        out["model_rss"] += rss
                    elif path is None and kv_bytes and size >= kv_bytes:
                        out["kv_rss"] = max(out["kv_rss"], min(kv_bytes, rss))
    except OSError:
        pass
    # The server's own memory: everything but the model file and the KV pool, split into
    # anonymous pages (heap, compute scratch, stacks) and other files (the binary, libraries).
    out["other"] = out["vm_rss"] - out["model_rss"] - out["kv_rss"]
    out["other_anon"] = out["rss_anon"] - out["kv_rss"]
    out["other_file"] = out["rss_file"] - out["model_rss"]
    return out


def kv_bytes_per_token(model_path):
    """Bytes one token takes in an F16 KV cache: n_layer * 2 * n_head_kv * head_dim * 2."""
    r = gguf.GGUFReader(model_path)
    arch = r.fields["general.architecture"].contents()

    def meta(key, default=None):
        f = r.fields.get(f"{arch}.{key}")
        return int(f.contents()) if f is not None else default

    head_dim = meta("attention.key_length", meta("embedding_length") // meta("attention.head_count"))
    return meta("block_count") * 2 * meta("attention.head_count_kv") * head_dim * 2


def kv_pool_bytes(port, model_path):
    """The KV pool's size: kiri_kv_blocks_capacity x kiri_kv_block_size_tokens from /metrics,
    times the bytes per token of an F16 cache."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    val = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in ("kiri_kv_blocks_capacity", "kiri_kv_block_size_tokens"):
            val[parts[0]] = int(float(parts[1]))
    return val["kiri_kv_blocks_capacity"] * val["kiri_kv_block_size_tokens"] * kv_bytes_per_token(model_path)


class MemSampler(threading.Thread):
    """Samples a server's memory every 0.25 s; keeps the sample with the highest VmRSS."""

    def __init__(self, pid, model, kv_bytes):
        super().__init__(daemon=True)
        self.args = (pid, model, kv_bytes)
        self.peak = None
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            m = proc_memory(*self.args)
            if self.peak is None or m["vm_rss"] > self.peak["vm_rss"]:
                self.peak = m
            self.halt.wait(0.25)


# ------------------------------------------------------------------------------------------------
# Clients
# ------------------------------------------------------------------------------------------------

def prompt_for(a, client, i):
    return PROMPT_BODY if a.same_prompt else f"Request {client * 1000 + i}: {PROMPT_BODY}"


def one_request(port, prompt, max_tokens, timeout):
    """One streamed completion. Returns timings (perf_counter seconds) and the token count."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    r = {"t_send": time.perf_counter(), "t_first": None, "t_last": None, "chunks": 0,
         "usage": None, "finish": None, "error": None}
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = c.getresponse()
        if resp.status != 200:
            r["error"] = f"HTTP {resp.status}: {resp.read()[:200]!r}"
        else:
            for n, raw in enumerate(resp):
                if n > 100000:
                    break
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                now = time.perf_counter()
                j = json.loads(data)
                if j.get("usage"):
                    r["usage"] = j["usage"]
                if j.get("timings"):  # llama-server's own counts (draft_n, draft_n_accepted)
                    r["timings"] = j["timings"]
                for ch in j.get("choices") or []:
                    if r["t_first"] is None:
                        r["t_first"] = now
                    if ch.get("text"):
                        r["chunks"] += 1
                        r["t_last"] = now
                    if ch.get("finish_reason"):
                        r["finish"] = ch["finish_reason"]
        c.close()
    except (OSError, ValueError, http.client.HTTPException) as e:
        r["error"] = f"{type(e).__name__}: {e}"
    r["t_end"] = time.perf_counter()
    if r["usage"] and "completion_tokens" in r["usage"]:
        r["tokens"] = int(r["usage"]["completion_tokens"])
    elif r["finish"] == "length":
        r["tokens"] = max_tokens
    else:
        r["tokens"] = r["chunks"]
    if r["t_first"] is None and not r["error"]:
        r["error"] = "no token streamed"
    return r


def decode_rate(r):
    """Decode tokens/s of one streamed request: tokens after the first over the time they took."""
    if r["error"] or r["tokens"] < 2 or not r["t_last"] or r["t_last"] <= r["t_first"]:
        return 0.0
    return (r["tokens"] - 1) / (r["t_last"] - r["t_first"])


def pct(values, p):
    """Nearest-rank percentile."""
    v = sorted(values)
    return v[max(0, math.ceil(p / 100 * len(v)) - 1)] if v else float("nan")


def run_level(a, port, clients):
    results, lock = [], threading.Lock()
    t0 = time.perf_counter()
    stop_at = t0 + a.duration

    def client(ci):
        i = 0
        while time.perf_counter() < stop_at and i < 10000:
            r = one_request(port, prompt_for(a, ci, i), a.max_tokens, a.request_timeout)
            r["client"] = ci
            with lock:
                results.append(r)
            if r["error"]:
                time.sleep(0.2)
            i += 1

    ts = [threading.Thread(target=client, args=(ci,), daemon=True) for ci in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    ok = [r for r in results if not r["error"]]
    wall = max((r["t_end"] for r in results), default=t0) - t0
    tokens = sum(r["tokens"] for r in ok)
    ttft = [r["t_first"] - r["t_send"] for r in ok]
    return {
        "clients": clients, "requests": len(ok), "errors": len(results) - len(ok),
        "error_samples": [r["error"] for r in results if r["error"]][:3],
        "tokens": tokens, "wall_seconds": wall, "aggregate_tps": tokens / wall if wall > 0 else 0.0,
        "ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99),
        "ttft_all": ttft, "finish_stop": sum(1 for r in ok if r["finish"] == "stop"),
        "decode_tps_median": statistics.median([decode_rate(r) for r in ok]) if ok else 0.0,
    }


# ------------------------------------------------------------------------------------------------
# Phases
# ------------------------------------------------------------------------------------------------

def start(side, a, tag):
    warm(a.model)
    s = Server(side, a, os.path.join(a.log_dir, f"{side}-{tag}.log"))
    s.ready_s = s.wait_ready()
    w = one_request(s.port, "Hello", 8, a.request_timeout)  # faults in weights and code
    if w["error"]:
        s.stop()
        raise SystemExit(f"{side} warm-up request failed: {w['error']} (log {s.log_path})")
    s.kv_bytes = kv_pool_bytes(s.port, a.model) if side == "kiri" else 0
    return s


def kiri_bench(a, n_prompt):
    cmd = [a.kiri, "bench", "-m", a.model, "-t", str(a.threads), "-p", str(n_prompt), "-n", str(a.max_tokens),
           "-d", str(n_prompt), "-r", "1", "--backend", a.backend, "--json"]
    cmd += ["--cpu-kernels", a.cpu_kernels] if a.cpu_kernels else []
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600, start_new_session=True,
                       preexec_fn=_renice)
    if r.returncode != 0:
        raise SystemExit(f"kiri bench failed: {' '.join(cmd)}\n{r.stderr[-2000:]}")
    for line in reversed(r.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("kiri bench printed no JSON")


def prompt_tokens(port, text):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("POST", "/tokenize", json.dumps({"content": text, "add_special": True}),
              {"Content-Type": "application/json"})
    j = json.loads(c.getresponse().read())
    c.close()
    return len(j["tokens"])


def single_stream(a):
    """Item 8: one client through kiri serve against kiri bench, alternated, best of each."""
    s = start("kiri", a, "single")
    out = {"serve_tps": [], "bench_tps": []}
    try:
        prompt = prompt_for(a, 0, 0)
        out["prompt_tokens"] = prompt_tokens(s.port, prompt)
        out["idle_memory"] = proc_memory(s.p.pid, a.model, s.kv_bytes)
        for rnd in range(a.rounds):
            for what in (("bench", "serve") if rnd % 2 == 0 else ("serve", "bench")):
                load = os.getloadavg()[0]
                if what == "bench":
                    tps = kiri_bench(a, out["prompt_tokens"])["decode_tps"]
                else:
                    tps = max(decode_rate(one_request(s.port, prompt_for(a, 0, rnd * 2 + k), a.max_tokens,
                                                      a.request_timeout)) for k in range(2))
                out[f"{what}_tps"].append(tps)
                print(f"single stream round {rnd} {what:5}: decode {tps:6.1f} tok/s, load {load:.1f}",
                      file=sys.stderr, flush=True)
    finally:
        s.stop()
    out["serve_best"], out["bench_best"] = max(out["serve_tps"]), max(out["bench_tps"])
    out["ratio"] = out["serve_best"] / out["bench_best"]
    return out


def sweep(a):
    levels = []
    for idx, clients in enumerate(a.clients):
        sides = ["kiri"] + ([] if a.no_llama else ["llama"])
        if idx % 2:
            sides.reverse()
        level = {"clients": clients}
        for side in sides:
            s = start(side, a, f"c{clients}")
            try:
                mem_idle = proc_memory(s.p.pid, a.model, s.kv_bytes)
                sampler = MemSampler(s.p.pid, a.model, s.kv_bytes)
                sampler.start()
                load = os.getloadavg()[0]
                r = run_level(a, s.port, clients)
                sampler.halt.set()
                sampler.join()
            finally:
                s.stop()
            r.update({"loadavg_before": load, "ready_seconds": s.ready_s, "memory_idle": mem_idle,
                      "memory_peak": sampler.peak})
            level[side] = r
            print(f"{clients:2d} clients {side:5}: {r['aggregate_tps']:6.1f} tok/s aggregate, TTFT p50 "
                  f"{r['ttft_p50'] * 1e3:7.0f} p99 {r['ttft_p99'] * 1e3:7.0f} ms, {r['requests']} requests"
                  f" ({r['errors']} errors, {r['finish_stop']} ended by EOS), per-request decode "
                  f"{r['decode_tps_median']:.1f} tok/s, peak RSS {sampler.peak['vm_rss'] / MiB:.0f} MiB, "
                  f"load {load:.1f}", file=sys.stderr, flush=True)
            if r["errors"]:
                print(f"  errors: {r['error_samples']}", file=sys.stderr)
        levels.append(level)
    return levels


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------

def mark(ok):
    return "" if ok else " ✗"


def table(a, levels, single, rss_level, machine):
    lines = []
    both = not a.no_llama
    if both:
        lines += ["| clients | aggregate tok/s kiri / llama.cpp | ratio | TTFT p50 ms kiri / llama.cpp "
                  "| TTFT p99 ms kiri / llama.cpp | p99 ratio | requests kiri / llama.cpp |",
                  "|---|---|---|---|---|---|---|"]
    else:
        lines += ["| clients | aggregate tok/s | TTFT p50 ms | TTFT p99 ms | requests |", "|---|---|---|---|---|"]
    for lv in levels:
        k = lv["kiri"]
        if both:
            l = lv["llama"]
            ra = k["aggregate_tps"] / l["aggregate_tps"] if l["aggregate_tps"] else float("nan")
            rp = k["ttft_p99"] / l["ttft_p99"] if l["ttft_p99"] else float("nan")
            target = lv["clients"] in TARGET_CLIENTS
            lines.append(
                f"| {lv['clients']} | {k['aggregate_tps']:.1f} / {l['aggregate_tps']:.1f} "
                f"| {ra:.2f}{mark(ra >= TARGETS['aggregate']) if target else ''} "
                f"| {k['ttft_p50'] * 1e3:.0f} / {l['ttft_p50'] * 1e3:.0f} "
                f"| {k['ttft_p99'] * 1e3:.0f} / {l['ttft_p99'] * 1e3:.0f} "
                f"| {rp:.2f}{mark(rp <= TARGETS['ttft_p99']) if target else ''} "
                f"| {k['requests']} / {l['requests']} |")
        else:
            lines.append(f"| {lv['clients']} | {k['aggregate_tps']:.1f} | {k['ttft_p50'] * 1e3:.0f} "
                         f"| {k['ttft_p99'] * 1e3:.0f} | {k['requests']} |")
    lines.append("")
    bw = machine["membw_gbps"]
    lines.append(f"CPU: {machine['cpu']} ({machine['cores']} cores); kiri kernels: {machine['kiri_kernels']}; "
                 f"memory read bandwidth (bench/membw.c, best pass over 1 GiB, this run): "
                 + ", ".join(f"{v:.1f} GB/s with {t} thread{'s' if t > 1 else ''}" for t, v in sorted(bw.items()))
                 + ".")
    flags = (f"--parallel {a.parallel} --ctx {a.slot_ctx} --kv-memory {a.kv_memory} --backend {a.backend} "
             f"{'--cpu-kernels ' + a.cpu_kernels if a.cpu_kernels else ''} {a.kiri_args}").split()
    llama_flags = f"-np {a.parallel} -c {a.parallel * a.slot_ctx} --cont-batching -t {a.threads} -tb {a.threads} "
    llama = (f", `llama-server {(llama_flags + a.llama_args).strip()}` (llama.cpp {machine['llama_cpp']})"
             if both else "")
    prompt = f"{single['prompt_tokens']} tokens" if single else "about 48 tokens"
    lines.append(f"{a.threads} threads, kiri `{' '.join(flags)}`{llama}; "
                 f"{a.duration:.0f} s of requests per level and side, unique prompts of {prompt}, max_tokens "
                 f"{a.max_tokens}, temperature 0, streamed /v1/completions."
                 + (f" Targets at {', '.join(map(str, TARGET_CLIENTS))} clients: aggregate ≥ {TARGETS['aggregate']}x, "
                    f"p99 TTFT ratio ≤ {TARGETS['ttft_p99']} (✗ = missed)." if both else ""))
    if single:
        lines.append("")
        lines.append(f"Single stream (decode tok/s, best of {a.rounds}): kiri serve {single['serve_best']:.1f}, "
                     f"`kiri bench -p {single['prompt_tokens']} -n {a.max_tokens} -d {single['prompt_tokens']}` "
                     f"{single['bench_best']:.1f}: "
                     f"{single['ratio']:.2f}{mark(single['ratio'] >= TARGETS['single'])} (target ≥ 0.95).")
    if rss_level:
        m, idle = rss_level["kiri"]["memory_peak"], rss_level["kiri"]["memory_idle"]
        other = m["other"] / MiB
        lines.append("")
        lines.append(
            f"kiri serve memory under {rss_level['clients']} clients (peak sample): "
            f"VmRSS {m['vm_rss'] / MiB:.0f} MiB = "
            f"model file {m['model_rss'] / MiB:.0f} + KV pool {m['kv_rss'] / MiB:.0f} resident of "
            f"{m['kv_bytes'] / MiB:.0f} + other {other:.1f}{mark(other * MiB <= TARGETS['other_mb'] * 1e6)} "
            f"(target ≤ 20 MB: {m['other_anon'] / MiB:.1f} anonymous, {m['other_file'] / MiB:.1f} in other files: "
            f"the binary and libraries). After warm-up: VmRSS {idle['vm_rss'] / MiB:.0f}, other "
            f"{idle['other'] / MiB:.1f} MiB.")
        if "llama" in rss_level:
            lm = rss_level["llama"]["memory_peak"]
            lines.append(f"llama-server, same load: VmRSS {lm['vm_rss'] / MiB:.0f} MiB, RssAnon "
                         f"{lm['rss_anon'] / MiB:.0f} MiB (its KV cache of {a.parallel} x {a.slot_ctx} tokens, "
                         f"repacked weights and compute buffers).")
    return "\n".join(lines)


def kiri_kernels(a):
    """The backend and kernel tier kiri picks for the model, from `kiri info` ("cpu: picked (avx2)")."""
    cmd = [a.kiri, "info", "-m", a.model, "--backend", a.backend] + (["--cpu-kernels", a.cpu_kernels]
                                                                     if a.cpu_kernels else [])
    text = tool_output(cmd)
    picked = [line.strip() for line in text.splitlines() if ": picked (" in line]
    if not picked:
        return "?"
    name, _, rest = picked[-1].partition(": picked (")
    return f"{name} ({rest.rstrip(')')})"


def main():
    ap = argparse.ArgumentParser(description="kiri serve vs llama-server benchmark")
    ap.add_argument("--kiri", default=os.environ.get("KIRI_BIN", os.path.join(REPO, "build", "kiri")))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN", ""),
                    help="folder with llama-server (default: bench/build_llama_cpp.sh's)")
    ap.add_argument("--model", default=os.path.join(REPO, "build", "bench-models", "tinyllama-Q4_0.gguf"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--duration", type=float, default=30.0, help="seconds of new requests per level and side")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=16, help="kiri's --parallel and llama-server's -np")
    ap.add_argument("--slot-ctx", type=int, default=1024, help="context per sequence (kiri --ctx, llama -c / -np)")
    ap.add_argument("--kv-memory", default="", help="kiri's --kv-memory (default: parallel x slot-ctx tokens)")
    ap.add_argument("--backend", default="auto", help="kiri's --backend (serve and bench)")
    ap.add_argument("--cpu-kernels", default="", help="kiri's --cpu-kernels (serve and bench)")
    ap.add_argument("--kiri-args", default="", help="more kiri serve flags, e.g. \"--chunk 64\"")
    ap.add_argument("--llama-args", default="", help="more llama-server flags")
    ap.add_argument("--rounds", type=int, default=3, help="single-stream rounds")
    ap.add_argument("--rss-clients", type=int, default=8)
    ap.add_argument("--request-timeout", type=float, default=600)
    ap.add_argument("--same-prompt", action="store_true")
    ap.add_argument("--no-llama", action="store_true", help="kiri alone")
    ap.add_argument("--no-single", action="store_true", help="skip the single-stream comparison")
    ap.add_argument("--json", default=os.path.join(REPO, "build", "bench-serve.json"))
    ap.add_argument("--nice", type=int, default=0)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    bench_cpu.NICE = a.nice
    if a.quick:
        a.clients, a.duration, a.rounds = [1, 4], 6.0, 1
    if not (1 <= a.threads <= 256 and all(1 <= c <= 256 for c in a.clients) and 0 < a.duration <= 3600
            and 1 <= a.max_tokens <= 2048 and 1 <= a.rounds <= 20 and 1 <= a.parallel <= 256
            and 128 <= a.slot_ctx <= 1 << 20):
        raise SystemExit("an option is out of range")
    a.kiri = os.path.abspath(a.kiri)
    if not os.access(a.kiri, os.X_OK):
        raise SystemExit(f"no kiri binary at {a.kiri} (build it, or pass --kiri PATH)")
    if not os.path.exists(a.model):
        raise SystemExit(f"no model {a.model}: run {sys.executable} bench/make_models.py tinyllama-Q4_0")
    if not a.kv_memory:
        a.kv_memory = f"{-(-a.parallel * a.slot_ctx * kv_bytes_per_token(a.model) // MiB)}M"
    if not a.no_llama:
        a.llama_bin = bench_cpu.llama_bin_dir(a)
        if not os.access(os.path.join(a.llama_bin, "llama-server"), os.X_OK):
            raise SystemExit(f"no llama-server in {a.llama_bin}: run bench/build_llama_cpp.sh")
    a.log_dir = os.path.join(os.path.dirname(os.path.abspath(a.json)), "bench-serve-logs")
    os.makedirs(a.log_dir, exist_ok=True)
    renice_self()

    t_start = time.time()
    bw_samples = [bench_cpu.membw(a)]
    single = None if a.no_single else single_stream(a)
    levels = sweep(a)
    bw_samples.append(bench_cpu.membw(a))
    rss_level = next((lv for lv in levels if lv["clients"] == a.rss_clients), levels[-1] if levels else None)
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "kernel": platform.release(),
               "kiri_kernels": kiri_kernels(a),
               "llama_cpp": ("" if a.no_llama else
                             f"{llama_build(a)} from the llama-cpp-python {bench_cpu.llama_cpp_version()} sdist, "
                             f"{bench_cpu.llama_flavour(a.llama_bin)}"),
               "membw_gbps": {t: max(b[t][0] for b in bw_samples) for t in bw_samples[0]}}
    md = table(a, levels, single, rss_level, machine)
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)),
        "machine": machine,
        "kiri": {"binary": a.kiri, "git_head": tool_output(["git", "-C", REPO, "rev-parse", "HEAD"]),
                 "binary_mtime": time.ctime(os.path.getmtime(a.kiri))},
        "llama_cpp_bin": "" if a.no_llama else a.llama_bin,
        "settings": {k: getattr(a, k) for k in ("model", "threads", "clients", "duration", "max_tokens", "parallel",
                                                "slot_ctx", "kv_memory", "backend", "cpu_kernels", "kiri_args",
                                                "llama_args", "rounds", "same_prompt", "nice")},
        "membw_samples_best_median_gbps": bw_samples,
        "targets": TARGETS, "single_stream": single, "levels": levels, "markdown": md,
        "elapsed_seconds": time.time() - t_start, "quick": a.quick,
    }
    bench_cpu.save_report(a.json, out, md, t_start, a.log_dir)
    return 0


def llama_build(a):
    """llama-server's --version line: "0.5.0-dev (build 1, commit 0c1e570)"."""
    text = subprocess.run([os.path.join(a.llama_bin, "llama-server"), "--version"], capture_output=True,
                          text=True, timeout=60)
    for line in (text.stdout + text.stderr).splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip()
    return "?"


if __name__ == "__main__":
    sys.exit(main())
