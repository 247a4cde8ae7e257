#!/usr/bin/env python3
"""CPU speed: kiri against llama.cpp's own tools on the same GGUF files and thread count.

The peer is llama.cpp as its users run it: `llama-bench` and `llama-completion`, built from the
llama.cpp source that the pinned llama-cpp-python sdist vendors (bench/build_llama_cpp.sh,
GGML_NATIVE=ON, into a cache outside the repo). For each model (synthetic random weights at real
shapes from bench/make_models.py, and two real files from scripts/real_models.py) each side runs
in its own process, the two alternating process by process (kiri first in even rounds, second in
odd ones):

  speed  `kiri bench -m M -p 512 -n 128 -d 0,512 -t T -r R --json` against
         `llama-bench -m M -p 512 -n 128 -d 0,512 -t T -r R -o json`: at each depth D, a prefill
         of 512 tokens ("pp512 @ dD") and a decode of 128 tokens one at a time ("tg128 @ dD"),
         each timed after D pseudo-random tokens filled the context untimed (both tests start
         right after D tokens), after one untimed warm-up. kiri bench follows llama-bench's
         procedure (cli/main.c, cmd_bench). Reported: the best tokens/s over every timed run of
         every round (llama-bench's samples_ts, kiri's samples_ts).
  rss    ru_maxrss of those same processes, measured by GNU time (/usr/bin/time -f %M) for both
         sides: the high-water mark of resident memory, anonymous and file-backed (mapped
         weights) pages alike, of a process that ran every test. Median over the rounds.
  ttft   a fresh process (the file in the page cache): `kiri run --raw -m M -p PROMPT -n 1
         --temp 0 -t T -c 2048` against `llama-completion -m M -p PROMPT -n 1 --temp 0 -t T
         -c 2048 -no-cnv --no-warmup` (llama.cpp's plain completion tool; --no-warmup so that it
         does the same work: load, tokenize, evaluate the prompt, print one token), wall time
         from spawn to exit. Best of the rounds.

  state  for models with recurrent layers (qwen35, lfm2): the state one sequence keeps in them
         (convolution windows, delta-rule states), kiri's from `kiri info`, llama.cpp's the
         recurrent-state ("RS") buffer llama-completion logs at load for its one sequence.

Decode is also given as a fraction of the memory-bandwidth bound. Per generated token the weights
are read once, so

    bytes/token = sum of the sizes of all weight tensors, except that token_embd counts one row
                  (it is gathered, not multiplied) unless it doubles as the output matrix
                + KV cache read: 2 * n_head_kv * head_dim * 2 bytes (F16) per layer and position,
                  at the mean position of the decode (D + n_gen / 2; a sliding-window layer reads
                  at most its window; a recurrent layer reads none)
    bound tok/s = memory read bandwidth with T threads / bytes/token

where the bandwidth is the best pass of bench/membw.c (streaming reads of 1 GiB), run before every
model and at the end: other work on the machine only lowers it, so the best is the closest to
what the machine can do, and the fraction of the bound is on the low (conservative) side.

The machine is shared: other processes make single runs slower, never faster, so the best of
several alternated runs is reported and the JSON keeps every sample.

Usage: bench_cpu.py [--kiri PATH] [--llama-bin DIR] [--models DIR ...] [--make-dir DIR]
                    [--threads T] [--rounds N] [--reps R] [--depths D ...] [--long]
                    [--ttft-rounds N] [--cpu-kernels TIER] [--all] [--only NAME ...]
                    [--json PATH] [--nice N] [--quick]
  Defaults: /tmp/bench-build/kiri, the folder bench/build_llama_cpp.sh prints (it builds the
  tools once if they are missing, 10-15 minutes), <repo>/build/bench-models, T=2, N=3 rounds of
  R=1 timed run each (best of 3 per side), depths 0 and 512 (--long adds 2048), 3 TTFT rounds,
  <repo>/build/bench-results.json. The default set takes about 18 minutes on 2 idle Zen 3 cores
  (a TinyLlama-shape process runs about 40 s: warm-up, then at each depth a refill and the test;
  --rounds 2: about 12 minutes).
  --models: folders searched in order for <name>.gguf (a folder you may only read is fine);
  a missing synthetic model is written into --make-dir (default: the first folder) by
  make_models.py, from an F16 file in any of the folders. --all adds the types beyond the
  default set (ALL_MODELS). --cpu-kernels TIER passes through to kiri (compare tiers on one box).
  --nice -20 runs the measured processes (both sides, and membw) at a higher priority than other
  work on a shared machine, each in its own session whose autogroup gets that nice value too; it
  needs privileges. The file is read into the page cache before every measured process.
  --quick: 1 round, 1 timed run, 128/32 tokens at depths 0 and 128, 1 TTFT round (a smoke test,
  not a result).
"""

import argparse
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import gguf

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(REPO, "bench")
# Synthetic models (make_models.py, "<shape>-<type>") and real files (scripts/real_models.py
# names, lower case). The default set: a full run in about 18 minutes on 2 idle cores.
MODELS = ["tinyllama-Q4_0", "tinyllama-Q4_K_M", "tinyllama-Q8_0", "smollm-Q4_0", "smollm-Q8_0",
          "smollm2-135m-instruct-q4_1", "gemma-3-270m-q4_k_m"]
MORE_MODELS = ["tinyllama-Q4_1", "tinyllama-Q5_K", "tinyllama-Q6_K", "smollm-Q4_1"]
# The hybrid shapes (recurrent layers beside attention; issue 14): run with --only qwen35 lfm2
# --depths 0 4096, the depth at which their decode should stay flat.
HYBRID_MODELS = ["qwen35-0.8b-Q8_0", "qwen35-0.8b-Q4_K_M", "lfm2-1.2b-Q8_0", "lfm2-1.2b-Q4_K_M"]
ALL_MODELS = MODELS[:5] + MORE_MODELS + MODELS[5:] + HYBRID_MODELS
REAL = {"smollm2-135m-instruct-q4_1": "SmolLM2-135M-Instruct Q4_1, real file",
        "gemma-3-270m-q4_k_m": "Gemma 3 270M Q4_K_M, real file"}
PROMPT = "Once upon a time, there was a little robot who lived in a small town by the sea."
# kiri / llama.cpp (issue 13): prefill >= 1.3, decode never slower; peak RSS and TTFT as before.
TARGETS = {"prefill": 1.3, "decode": 1.0, "rss": 0.6, "ttft": 1.0, "bound_fraction": 0.85}
MiB = 1 << 20


# ------------------------------------------------------------------------------------------------
# Processes
# ------------------------------------------------------------------------------------------------

TIME = "/usr/bin/time"  # GNU time: measures the peak RSS of each child (see spawn)
NICE = 0  # --nice: the scheduling priority of the measured processes (set in main)


def _renice():
    """Runs in the child. With autogroup scheduling (Linux's default for desktops and many VMs)
    CPU time is shared between sessions first, so a process nice value alone does not help
    against other sessions' work: the child starts its own session (start_new_session) and sets
    that session's autogroup nice as well."""
    if not NICE:
        return
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write(str(NICE))
    except OSError:
        pass
    os.setpriority(os.PRIO_PROCESS, 0, NICE)


def warm(path):
    """Reads the file so it is in the page cache: every side starts from the same cache state."""
    with open(path, "rb", buffering=0) as f:
        while f.read(16 << 20):
            pass


def spawn(cmd, timeout):
    """Runs cmd; returns (exit code, wall seconds, peak RSS bytes, stdout, stderr).

    The peak RSS comes from GNU time (%M, the child's ru_maxrss from wait4), not from this
    script's own wait4: Linux carries the parent's high-water RSS into a child's ru_maxrss across
    fork and exec, so a child of this Python process (tens of MiB) would report at least that.
    time's own child is forked from a small process, so its number is the command's alone."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.NamedTemporaryFile("r") as rss_file:
        full = [TIME, "-f", "%M", "-o", rss_file.name] + cmd
        t0 = time.perf_counter()
        p = subprocess.Popen(full, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=_renice)
        timer = threading.Timer(timeout, os.killpg, (p.pid, signal.SIGKILL))  # time and its child
        timer.start()
        try:
            p.wait()
        finally:
            timer.cancel()
        wall = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        words = rss_file.read().split()
        rss = int(words[-1]) * 1024 if words and words[-1].isdigit() else 0
        return (p.returncode, wall, rss,
                out.read().decode(errors="replace"), err.read().decode(errors="replace"))


def last_json(text):
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise ValueError("no JSON line")


def test_key(n_prompt, n_gen, depth):
    return f"pp{n_prompt}@d{depth}" if n_prompt else f"tg{n_gen}@d{depth}"


def run_speed(side, a, path):
    """One process of one side; returns {"tests": {key: [tok/s, ...]}, "rss_bytes", ...}."""
    common = ["-m", path, "-p", str(a.n_prompt), "-n", str(a.n_gen), "-d", ",".join(map(str, a.depths)),
              "-t", str(a.threads), "-r", str(a.reps)]
    if side == "kiri":
        cmd = [a.kiri, "bench"] + common + ["--json"] + (["--cpu-kernels", a.cpu_kernels] if a.cpu_kernels else [])
    else:
        cmd = [os.path.join(a.llama_bin, "llama-bench")] + common + ["-o", "json"]
    load = os.getloadavg()[0]
    rc, wall, rss, out, err = spawn(cmd, a.timeout)
    if rc != 0:
        raise SystemExit(f"{side} bench failed ({rc}): {' '.join(cmd)}\n{err[-3000:]}")
    res = {"rss_bytes": rss, "wall_seconds": wall, "loadavg_before": load, "tests": {}}
    if side == "kiri":
        j = last_json(out)
        res["kernels"] = f"{j['backend']} ({j['kernels']})"
        res["load_seconds"] = j["load_seconds"]
        rows = j["tests"]
    else:
        rows = json.loads(out)
        res["build_commit"] = rows[0].get("build_commit", "") if rows else ""
        res["cpu_info"] = rows[0].get("cpu_info", "") if rows else ""
    for t in rows:
        res["tests"][test_key(t["n_prompt"], t["n_gen"], t["n_depth"])] = [float(x) for x in t["samples_ts"]]
    # -p 0 leaves the prefill tests out (llama-bench's meaning, which kiri bench follows).
    want = ({test_key(a.n_prompt, 0, d) for d in a.depths} if a.n_prompt else set()) | \
        {test_key(0, a.n_gen, d) for d in a.depths}
    if set(res["tests"]) != want:
        raise SystemExit(f"{side} bench ran {sorted(res['tests'])}, expected {sorted(want)}: {' '.join(cmd)}")
    return res


def run_ttft(side, a, path):
    if side == "kiri":
        cmd = [a.kiri, "run", "--raw", "-m", path, "-p", PROMPT, "-n", "1", "--temp", "0",
               "-t", str(a.threads), "-c", "2048"] + (["--cpu-kernels", a.cpu_kernels] if a.cpu_kernels else [])
    else:
        cmd = [os.path.join(a.llama_bin, "llama-completion"), "-m", path, "-p", PROMPT, "-n", "1",
               "--temp", "0", "-t", str(a.threads), "-c", "2048", "-no-cnv", "--no-warmup"]
    rc, wall, rss, _, err = spawn(cmd, a.timeout)
    if rc != 0:
        raise SystemExit(f"{side} ttft failed ({rc}): {' '.join(cmd)}\n{err[-3000:]}")
    return {"seconds": wall, "rss_bytes": rss}


def state_bytes(side, a, path):
    """The recurrent layers' state per sequence, or None for a model without them. kiri: `kiri
    info`'s "delta net:" / "short conv:" line ("... state: X KiB per sequence"); llama.cpp: the
    recurrent-state buffer it logs at load ("RS buffer size = X MiB", only with -v; the last one,
    after its memory-fitting pass), which llama-completion allocates for its one sequence."""
    if side == "kiri":
        r = subprocess.run([a.kiri, "info", "-m", path], capture_output=True, text=True, timeout=a.timeout)
        m = re.findall(r"^(?:delta net|short conv):.*state: ([0-9.]+) KiB per sequence", r.stdout, re.M)
        return float(m[-1]) * 1024 if m else None
    r = subprocess.run([os.path.join(a.llama_bin, "llama-completion"), "-m", path, "-p", PROMPT, "-n", "1",
                        "-t", str(a.threads), "-c", "2048", "-no-cnv", "--no-warmup", "-v"],
                       capture_output=True, text=True, timeout=a.timeout, stdin=subprocess.DEVNULL)
    m = re.findall(r"RS buffer size =\s*([0-9.]+) MiB", r.stdout + r.stderr)
    return float(m[-1]) * MiB if m else None


# ------------------------------------------------------------------------------------------------
# Memory bandwidth and bytes per token
# ------------------------------------------------------------------------------------------------

def membw_exe():
    """bench/membw.c built into build/bench-tools (again when the source is newer)."""
    exe = os.path.join(REPO, "build", "bench-tools", "membw")
    os.makedirs(os.path.dirname(exe), exist_ok=True)
    src = os.path.join(HERE, "membw.c")
    if not os.path.exists(exe) or os.path.getmtime(exe) < os.path.getmtime(src):
        subprocess.run(["cc", "-O2", "-pthread", src, "-o", exe], check=True)
    return exe


def membw(a):
    """One run of bench/membw.c (1 GiB, 10 passes, 1 and T threads): {threads: (best, median) GB/s}."""
    r = subprocess.run([membw_exe(), "1024", "10", "1", str(a.threads)], capture_output=True, text=True,
                       check=True, start_new_session=bool(NICE), preexec_fn=_renice)
    res = {}
    for line in r.stdout.splitlines():
        if line.startswith("threads="):
            kv = dict(x.split("=") for x in line.split())
            res[int(kv["threads"])] = (float(kv["best_gbps"]), float(kv["median_gbps"]))
    return res


def model_shape(path):
    """Weight bytes read per decoded token and the KV cache's per-layer shape, from the GGUF."""
    r = gguf.GGUFReader(path)
    arch = r.fields["general.architecture"].contents()

    def meta(key, default=None):
        f = r.fields.get(f"{arch}.{key}")
        return f.contents() if f is not None else default

    n_layer, n_head = meta("block_count"), meta("attention.head_count")
    # Layers without a KV cache: lfm2 lists 0 KV heads for its convolution layers; qwen35 attends
    # on every full_attention_interval-th layer only (its Gated DeltaNet layers keep a fixed state).
    n_kv = meta("attention.head_count_kv")
    n_kv = list(n_kv) if isinstance(n_kv, list) else [n_kv] * n_layer
    interval = meta("full_attention_interval", 0) if arch == "qwen35" else 0
    if interval:
        n_kv = [h if (i + 1) % interval == 0 else 0 for i, h in enumerate(n_kv)]
    head_dim = meta("attention.key_length", meta("embedding_length") // n_head)
    window = meta("attention.sliding_window", 0)
    # Gemma 3 files carry no pattern key: llama.cpp makes every sixth layer global.
    pattern = meta("attention.sliding_window_pattern", 6 if arch == "gemma3" else 0) if window else 0
    names = {t.name for t in r.tensors}
    weights = 0
    for t in r.tensors:
        n = int(t.n_bytes)
        if t.name == "token_embd.weight" and "output.weight" in names:
            n //= int(t.shape[1])  # one row of (n_embd, n_vocab)
        weights += n
    local = [bool(pattern) and (i + 1) % pattern != 0 for i in range(n_layer)] if window else [False] * n_layer
    return {"weights": weights, "kv_per_layer_position": [2 * h * head_dim * 2 for h in n_kv],
            "layer_is_windowed": local, "window": window, "file": os.path.getsize(path)}


def bytes_per_token(shape, position):
    kv = sum(b * (min(position, shape["window"]) if w else position)
             for b, w in zip(shape["kv_per_layer_position"], shape["layer_is_windowed"]))
    return shape["weights"] + kv


# ------------------------------------------------------------------------------------------------
# Models
# ------------------------------------------------------------------------------------------------

def find_model(a, name):
    """The path of a model: a real file through real_models.py, else <name>.gguf in --models."""
    if name in REAL:
        r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "real_models.py"), name],
                           capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"cannot fetch {name}: {r.stderr.strip()}")
        return r.stdout.strip()
    for d in a.models:
        p = os.path.join(d, name + ".gguf")
        if os.path.exists(p):
            return p
    return None


def make_missing(a, names):
    missing = [n for n in names if n not in REAL and find_model(a, n) is None]
    if missing:
        cmd = [sys.executable, os.path.join(HERE, "make_models.py"), "--out", a.make_dir, "--kiri", a.kiri]
        for d in a.models:
            cmd += ["--f16-from", d]
        subprocess.run(cmd + missing, check=True)


def llama_bin_dir(a):
    if a.llama_bin:
        return a.llama_bin
    r = subprocess.run([os.path.join(HERE, "build_llama_cpp.sh")], stdout=subprocess.PIPE, text=True)
    if r.returncode:
        raise SystemExit("bench/build_llama_cpp.sh failed (its log is above)")
    return r.stdout.strip().splitlines()[-1]


def llama_flavour(bin_dir):
    """How the llama.cpp in bin_dir was built, from the folder name build_llama_cpp.sh gives it."""
    return "AVX2-only build" if "llama.cpp-build-avx2" in os.path.abspath(bin_dir) else "GGML_NATIVE"


# ------------------------------------------------------------------------------------------------
# Report
# ------------------------------------------------------------------------------------------------

def mark(ratio, target, higher_better):
    ok = ratio >= target if higher_better else ratio <= target
    return f"{ratio:.2f}{'' if ok else ' ✗'}"


def label(name):
    if name in REAL:
        return REAL[name]
    shape, _, qtype = name.rpartition("-")
    return {"tinyllama": "TinyLlama-shape", "smollm": "SmolLM-shape", "gemma3-1b": "Gemma 3 1B-shape",
            "phi4mini": "Phi-4-mini-shape", "qwen35-0.8b": "Qwen3.5-0.8B-shape",
            "lfm2-1.2b": "LFM2-1.2B-shape"}.get(shape, shape) + " " + qtype


def fmt_tps(x):
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}"


def table(results, a, machine):
    T = TARGETS
    pp = [test_key(a.n_prompt, 0, d) for d in a.depths]
    tg = [test_key(0, a.n_gen, d) for d in a.depths]
    head = ["model (file MiB)"]
    head += [f"prefill {a.n_prompt} @ d{d} tok/s" for d in a.depths]
    head += [f"decode {a.n_gen} @ d{d} tok/s" for d in a.depths]
    head += [f"decode @ d{d} % of bound" for d in a.depths]
    head += ["peak RSS MiB", "TTFT ms"]
    states = any(r["kiri"].get("state_bytes") for r in results.values())
    if states:
        head.append("state / sequence MiB")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, r in results.items():
        k, l = r["kiri"], r["llama"]
        cells = [f"{label(name)} ({r['shape']['file'] / MiB:.0f})"]
        for key in pp:
            cells.append(f"{fmt_tps(k['best'][key])} / {fmt_tps(l['best'][key])} "
                         f"({mark(r['ratio'][key], T['prefill'], True)})")
        for key in tg:
            cells.append(f"{fmt_tps(k['best'][key])} / {fmt_tps(l['best'][key])} "
                         f"({mark(r['ratio'][key], T['decode'], True)})")
        for key in tg:
            cells.append(f"{100 * r['bound_fraction']['kiri'][key]:.0f}% / "
                         f"{100 * r['bound_fraction']['llama'][key]:.0f}%")
        cells.append(f"{k['peak_rss_bytes'] / MiB:.0f} / {l['peak_rss_bytes'] / MiB:.0f} "
                     f"({mark(r['ratio']['rss'], T['rss'], False)})")
        cells.append(f"{1e3 * k['ttft_seconds']:.0f} / {1e3 * l['ttft_seconds']:.0f} "
                     f"({mark(r['ratio']['ttft'], T['ttft'], False)})" if k.get("ttft_seconds") else "-")
        if states:
            ks, ls = k.get("state_bytes"), l.get("state_bytes")
            cells.append(f"{ks / MiB:.2f} / {ls / MiB:.2f}" if ks and ls else "-")
        lines.append("| " + " | ".join(cells) + " |")
    bw = machine["membw_gbps"]
    lines += ["", (
        f"CPU: {machine['cpu']} ({machine['cores']} cores); kiri kernels: {machine['kiri_kernels']}; llama.cpp "
        f"{machine['llama_cpp']}; {a.threads} threads; memory read bandwidth (bench/membw.c, best pass over "
        f"1 GiB, this run): " + ", ".join(f"{v:.1f} GB/s with {t} thread{'s' if t > 1 else ''}"
                                           for t, v in sorted(bw.items())) + ".")]
    lines.append(
        f"Each cell is kiri / llama.cpp with the ratio in brackets (✗ = the target missed: prefill "
        f"≥ {T['prefill']}, decode ≥ {T['decode']}, peak RSS ≤ {T['rss']}, TTFT ≤ {T['ttft']}). Prefill and "
        f"decode: `kiri bench` against `llama-bench`, -p {a.n_prompt} -n {a.n_gen} -d "
        f"{','.join(map(str, a.depths))}, best of {a.rounds} alternated rounds x {a.reps} timed runs; "
        f"@ dD = after D tokens in the context. % of bound: decode tok/s over bandwidth / (weight bytes per "
        f"token + KV bytes at the mean decode position); the target is {100 * T['bound_fraction']:.0f}%. Peak "
        f"RSS: median of those processes (every test, the largest context included). TTFT: best spawn-to-exit "
        f"time of `kiri run -n 1` against `llama-completion -n 1` over {a.ttft_rounds} rounds." + (
        " State / sequence: the recurrent layers' state of one sequence (convolution windows, delta-rule "
        "states), F32 on both sides: `kiri info` against the RS buffer llama-completion logs at load." if states
        else ""))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description="kiri vs llama.cpp (llama-bench) CPU benchmark")
    ap.add_argument("--kiri", default=os.environ.get("KIRI_BIN", "/tmp/bench-build/kiri"))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN", ""),
                    help="folder with llama-bench and llama-completion (default: bench/build_llama_cpp.sh's)")
    ap.add_argument("--models", nargs="+", default=[os.path.join(REPO, "build", "bench-models")])
    ap.add_argument("--make-dir", default="", help="where missing synthetic models are written")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 512])
    ap.add_argument("--long", action="store_true", help="adds depth 2048")
    ap.add_argument("--ttft-rounds", type=int, default=3)
    ap.add_argument("--n-prompt", type=int, default=512)
    ap.add_argument("--n-gen", type=int, default=128)
    ap.add_argument("--cpu-kernels", default="", help="kiri's --cpu-kernels (default: its best)")
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--all", action="store_true", help="every type, not only the default set")
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--json", default=os.path.join(REPO, "build", "bench-results.json"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--nice", type=int, default=0,
                    help="scheduling priority of the measured processes (negative needs privileges)")
    ap.add_argument("--render", metavar="JSON", help="prints the table of an earlier run's JSON and exits")
    a = ap.parse_args()
    if a.render:
        with open(a.render) as f:
            old = json.load(f)
        vars(a).update(old["settings"])
        old["machine"]["membw_gbps"] = {int(t): v for t, v in old["machine"]["membw_gbps"].items()}
        print(table(old["results"], a, old["machine"]))
        return 0
    global NICE
    NICE = a.nice
    if a.quick:
        a.rounds, a.reps, a.ttft_rounds, a.n_prompt, a.n_gen, a.depths = 1, 1, 1, 128, 32, [0, 128]
    if a.long and 2048 not in a.depths:
        a.depths.append(2048)
    if not (1 <= a.threads <= 1024 and 1 <= a.rounds <= 50 and 1 <= a.reps <= 100 and a.n_prompt >= 1
            and a.n_gen >= 1 and all(0 <= d <= 1 << 20 for d in a.depths) and len(a.depths) <= 16):
        raise SystemExit("an option is out of range")
    a.make_dir = a.make_dir or a.models[0]
    if not os.access(TIME, os.X_OK):
        raise SystemExit(f"{TIME} (GNU time) is needed to measure peak RSS: apt-get install time")
    if not os.access(a.kiri, os.X_OK):
        raise SystemExit(f"no kiri binary at {a.kiri} (build it, or pass --kiri PATH)")
    a.llama_bin = llama_bin_dir(a)
    for tool in ("llama-bench", "llama-completion"):
        if not os.access(os.path.join(a.llama_bin, tool), os.X_OK):
            raise SystemExit(f"no {tool} in {a.llama_bin}: run bench/build_llama_cpp.sh")

    pool = ALL_MODELS if a.all or a.only else MODELS
    names = [m for m in pool if not a.only or any(o in m for o in a.only)]
    # other models named in full, found in --models (the family shapes of make_models.py)
    names += [o for o in (a.only or []) if o not in names and find_model(a, o)]
    make_missing(a, names)

    t_start = time.time()
    bw_samples = []  # membw before every model and at the end; the bound uses the best pass seen

    def sample_bw():
        b = membw(a)
        bw_samples.append(b)
        print("memory read bandwidth, best (median) GB/s: "
              + ", ".join(f"{t} thr {v[0]:.1f} ({v[1]:.1f})" for t, v in sorted(b.items())), file=sys.stderr)

    results, kernels, llama_build = {}, set(), ""
    for name in names:
        sample_bw()
        path = find_model(a, name)
        samples = {"kiri": [], "llama": []}
        ttft = {"kiri": [], "llama": []}
        for rnd in range(a.rounds):
            for side in (("kiri", "llama") if rnd % 2 == 0 else ("llama", "kiri")):
                warm(path)
                s = run_speed(side, a, path)
                samples[side].append(s)
                if side == "kiri":
                    kernels.add(s["kernels"])
                else:
                    llama_build = s["build_commit"]
                print(f"{name} round {rnd} {side:5}: "
                      + ", ".join(f"{k} {max(v):.1f}" for k, v in s["tests"].items())
                      + f" tok/s, rss {s['rss_bytes'] / MiB:.0f} MiB, wall {s['wall_seconds']:.0f} s, "
                      f"load {s['loadavg_before']:.1f}", file=sys.stderr, flush=True)
        for rnd in range(a.ttft_rounds):
            for side in (("kiri", "llama") if rnd % 2 == 0 else ("llama", "kiri")):
                warm(path)
                ttft[side].append(run_ttft(side, a, path))
        if a.ttft_rounds:
            print(f"{name} ttft: " + ", ".join(f"{s} {min(x['seconds'] for x in v) * 1e3:.0f} ms"
                                               for s, v in ttft.items()), file=sys.stderr)

        def summary(side):
            ss = samples[side]
            out = {"best": {k: max(max(s["tests"][k]) for s in ss) for k in ss[0]["tests"]},
                   "peak_rss_bytes": int(statistics.median(s["rss_bytes"] for s in ss))}
            if ttft[side]:
                out["ttft_seconds"] = min(x["seconds"] for x in ttft[side])
            out["state_bytes"] = state_bytes(side, a, path)
            return out

        k, l = summary("kiri"), summary("llama")
        ratio = {key: k["best"][key] / l["best"][key] for key in k["best"]}
        ratio["rss"] = k["peak_rss_bytes"] / l["peak_rss_bytes"]
        if a.ttft_rounds:
            ratio["ttft"] = k["ttft_seconds"] / l["ttft_seconds"]
        results[name] = {"path": path, "shape": model_shape(path), "kiri": k, "llama": l, "ratio": ratio,
                         "samples": samples, "ttft_samples": ttft}

    sample_bw()
    bw = {t: max(b[t][0] for b in bw_samples) for t in bw_samples[0]}
    for r in results.values():
        r["bytes_per_token"], r["bound_tps"] = {}, {}
        r["bound_fraction"] = {"kiri": {}, "llama": {}}
        for d in a.depths:
            key = test_key(0, a.n_gen, d)
            r["bytes_per_token"][key] = bytes_per_token(r["shape"], d + a.n_gen / 2)
            r["bound_tps"][key] = bw[a.threads] * 1e9 / r["bytes_per_token"][key]
            for s in ("kiri", "llama"):
                r["bound_fraction"][s][key] = r[s]["best"][key] / r["bound_tps"][key]
        r["shape"].pop("layer_is_windowed")
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "kernel": platform.release(),
               "kiri_kernels": ", ".join(sorted(kernels)),
               "llama_cpp": f"{llama_build} (llama-cpp-python {llama_cpp_version()} sdist, {llama_flavour(a.llama_bin)})",
               "membw_gbps": bw}
    md = table(results, a, machine)
    out = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)),
        "machine": machine,
        "kiri": {"binary": a.kiri, "version": tool_output([a.kiri, "--version"]),
                 "git_head": tool_output(["git", "-C", REPO, "rev-parse", "HEAD"]),
                 "binary_mtime": time.ctime(os.path.getmtime(a.kiri))},
        "llama_cpp_bin": a.llama_bin,
        "settings": {k: getattr(a, k) for k in ("threads", "rounds", "reps", "depths", "ttft_rounds", "n_prompt",
                                                "n_gen", "cpu_kernels", "nice")},
        "membw_samples_best_median_gbps": bw_samples, "targets": TARGETS, "results": results, "markdown": md,
        "elapsed_seconds": time.time() - t_start, "quick": a.quick,
    }
    save_report(a.json, out, md, t_start)
    return 0


def save_report(path, out, md, t_start, logs=""):
    """Writes a run's JSON record to path and prints its markdown table."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    print(md)
    print(f"\n(results: {path}{', server logs: ' + logs if logs else ''}, {time.time() - t_start:.0f} s)",
          file=sys.stderr)


def llama_cpp_version():
    """The pinned sdist's version, from scripts/llama_cpp_source.py's source path."""
    try:
        src = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "llama_cpp_source.py")],
                             capture_output=True, text=True, timeout=600).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    for part in src.split(os.sep):
        if part.startswith("llama_cpp_python-"):
            return part.split("-", 1)[1]
    return "?"


def tool_output(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def cpu_name():
    """The CPU's model name with what a masked VM name leaves out: family/model (Zen generation
    for AMD) and the widest vector extension, e.g. "AMD EPYC (family 25 model 1, Zen 3; AVX2, no
    AVX-512)"."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                k, _, v = line.partition(":")
                k = k.strip()
                if k in ("vendor_id", "cpu family", "model", "model name", "flags", "Features") and k not in info:
                    info[k] = v.strip()
                if not line.strip() and info:
                    break
    except OSError:
        pass
    name = info.get("model name") or platform.processor() or platform.machine()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    if not flags:
        return name
    extra = []
    if "cpu family" in info and "model" in info:
        fam, mod = int(info["cpu family"]), int(info["model"])
        zen = ""
        if info.get("vendor_id") == "AuthenticAMD":
            zen = {23: "Zen/Zen 2", 26: "Zen 5"}.get(fam, "")
            if fam == 25:
                zen = "Zen 3" if mod < 0x10 or 0x20 <= mod < 0x60 else "Zen 4"
        extra.append(f"family {fam} model {mod}" + (f", {zen}" if zen else ""))
    if "avx512f" in flags:
        simd = "AVX-512" + (" VNNI" if "avx512_vnni" in flags else "")
    elif "avx2" in flags:
        simd = "AVX2, no AVX-512"
    elif "asimd" in flags:
        simd = "NEON" + (" dotprod" if "asimddp" in flags else "") + (" i8mm" if "i8mm" in flags else "")
    else:
        simd = "no AVX2"
    extra.append(simd)
    return f"{name} ({'; '.join(extra)})"


if __name__ == "__main__":
    sys.exit(main())
