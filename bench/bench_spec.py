#!/usr/bin/env python3
"""Speculative decoding: `kiri serve` against llama.cpp's own `llama-server`, each with and without
its speculative decoding, on the same GGUF file and thread count, one server at a time on
127.0.0.1, one client (speculation pays at batch size one, where decode reads every weight once
per token).

Modes, each a fresh server per side (the two sides alternate, kiri first in even rounds):

  plain   kiri serve -m M -t T --parallel 1 --ctx C
          llama-server -m M -t T -tb T -np 1 -c C --no-webui
  ngram   the same plus  kiri: --spec ngram  (prompt lookup)
                         llama-server: --spec-type ngram-simple (its prompt-and-history lookup)
  draft   (with --draft D) kiri: --draft-model D --spec draft
                         llama-server: -md D --spec-type draft-simple -td T

Every other setting is each side's default (kiri drafts at most 8 tokens and adapts the length;
llama-server drafts at most 3 for a draft model and what ngram-simple finds for the lookup).

Tasks (raw completions, greedy, max_tokens N): `copy` asks for a given passage word for word,
`extract` quotes the passage's sentences about one subject, `free` continues a story opening. Each
request streams; its decode rate is (tokens - 1) / (last token - first token) at the client, so
prompt processing is not in it. Each (round, side, mode, task) keeps the better of two requests;
the table reports the best over rounds, the speedup of each side's speculation over its own
plain decoding, and kiri / llama.cpp per mode. Drafted and accepted tokens: kiri's /metrics
(kiri_spec_draft_tokens_total, kiri_spec_accepted_tokens_total), llama-server's final `timings`
(draft_n, draft_n_accepted) when it sends them.

The two sides' greedy texts may differ (different kernels round differently, and a near-tie
flips), which changes how much a lookup can copy; the generated token counts are in the table.

Usage: bench_spec.py [--kiri PATH] [--llama-bin DIR] [--model FILE] [--draft FILE] [--threads T]
                     [--max-tokens N] [--rounds R] [--modes plain ngram draft] [--tasks copy extract
                     free] [--cpu-kernels TIER] [--nice N] [--json PATH] [--no-llama]
  Defaults: build/kiri, bench/build_llama_cpp.sh's folder, the real SmolLM2-135M-Instruct Q4_1
  file (scripts/real_models.py), T=1, N=128, R=3, modes plain and ngram (draft too with --draft),
  all three tasks, <repo>/build/bench-spec.json.
"""

import argparse
import copy
import http.client
import os
import platform
import re
import subprocess
import sys
import time

import bench_cpu  # noqa: E402  (beside this script)
import bench_serve  # noqa: E402
from bench_cpu import cpu_name, tool_output  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PASSAGE = ("The harbour of Kestrel Bay opens at six in the morning, when the first ferry leaves for the "
           "islands. Fishing boats come back around noon and sell their catch on the stone pier. In "
           "summer the harbour master rents small sailing boats to visitors, and on Sundays a brass band "
           "plays beside the lighthouse. The old customs house is now a museum about the town's "
           "shipbuilders, and its café serves soup made from the morning's fish.")
TASKS = {
    "copy": f"Copy the following passage word for word.\n\nPassage: {PASSAGE}\n\nCopy: The harbour of",
    "extract": (f"{PASSAGE}\n\nQuote, word for word, every sentence of the text above that mentions "
                f"boats.\n\nSentences:\n1."),
    "free": "Once upon a time, in a small village at the edge of a forest, there lived",
}
MODE_FLAGS = {  # side -> mode -> extra server flags (the draft model's path is filled in)
    "kiri": {"plain": "", "ngram": "--spec ngram", "draft": "--draft-model {draft} --spec draft"},
    "llama": {"plain": "", "ngram": "--spec-type ngram-simple",
              "draft": "-md {draft} --spec-type draft-simple -td {threads}"},
}


def kiri_spec_counts(port):
    """kiri's drafted and accepted tokens over all drafters, from /metrics."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    total = {"drafted": 0, "accepted": 0}
    for key, name in (("drafted", "kiri_spec_draft_tokens_total"), ("accepted", "kiri_spec_accepted_tokens_total")):
        for m in re.finditer(rf"^{name}\{{[^}}]*\}} (\d+)$", text, re.M):
            total[key] += int(m.group(1))
    return total


def run_mode(a, side, mode, rnd):
    sa = copy.copy(a)
    flags = MODE_FLAGS[side][mode].format(draft=a.draft, threads=a.threads)
    if side == "kiri":
        sa.kiri_args = flags
    else:
        sa.llama_args = flags
    s = bench_serve.start(side, sa, f"{mode}-r{rnd}")
    out = {}
    try:
        for task in a.tasks:
            before = kiri_spec_counts(s.port) if side == "kiri" else None
            best, drafted, accepted, tokens = 0.0, 0, 0, 0
            for _ in range(2):
                r = bench_serve.one_request(s.port, TASKS[task], a.max_tokens, a.request_timeout)
                if r["error"]:
                    raise SystemExit(f"{side} {mode} {task}: {r['error']} (log {s.log_path})")
                rate = bench_serve.decode_rate(r)
                if rate > best:
                    best, tokens = rate, r["tokens"]
                t = r.get("timings") or {}
                drafted += int(t.get("draft_n", 0))
                accepted += int(t.get("draft_n_accepted", 0))
            if side == "kiri":
                after = kiri_spec_counts(s.port)
                drafted, accepted = after["drafted"] - before["drafted"], after["accepted"] - before["accepted"]
            out[task] = {"tps": best, "tokens": tokens, "drafted": drafted, "accepted": accepted,
                         "load": os.getloadavg()[0]}
            print(f"round {rnd} {side:5} {mode:5} {task:7}: {best:7.1f} tok/s ({tokens} tokens, {accepted} of "
                  f"{drafted} drafts kept), load {out[task]['load']:.1f}", file=sys.stderr, flush=True)
    finally:
        s.stop()
    return out


def table(a, best, machine):
    sides = ["kiri"] + ([] if a.no_llama else ["llama"])
    lines = [f"CPU: {machine['cpu']} ({machine['cores']} cores), kiri kernels {machine['kiri_kernels']}, "
             "memory read bandwidth " + ", ".join(f"{v:.1f} GB/s with {t} thread(s)" for t, v in
                                                  machine["membw_gbps"].items()) + " (bench/membw.c, same run); "
             f"{a.threads} thread(s); llama.cpp {machine['llama_cpp']}",
             f"model {os.path.basename(a.model)}" + (f", draft {os.path.basename(a.draft)}" if a.draft else ""),
             "",
             "| task | mode | kiri tok/s | kiri vs its plain | kiri drafts kept | llama.cpp tok/s | "
             "llama.cpp vs its plain | llama.cpp drafts kept | kiri / llama.cpp |",
             "|---|---|---|---|---|---|---|---|---|"]
    for task in a.tasks:
        for mode in a.modes:
            cells = []
            for side in ("kiri", "llama"):
                if side not in sides:
                    cells += ["", "", ""]
                    continue
                r, plain = best[side][mode][task], best[side]["plain"][task]
                cells += [f"{r['tps']:.1f} ({r['tokens']} tok)",
                          "" if mode == "plain" else f"{r['tps'] / plain['tps']:.2f}x",
                          "" if mode == "plain" else f"{r['accepted']} of {r['drafted']}"]
            ratio = (f"{best['kiri'][mode][task]['tps'] / best['llama'][mode][task]['tps']:.2f}"
                     if "llama" in sides and best["llama"][mode][task]["tps"] > 0 else "")
            lines.append(f"| {task} | {mode} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description="speculative decoding: kiri serve vs llama-server")
    ap.add_argument("--kiri", default=os.environ.get("KIRI_BIN", os.path.join(REPO, "build", "kiri")))
    ap.add_argument("--llama-bin", default=os.environ.get("LLAMA_CPP_BIN", ""))
    ap.add_argument("--model", default="")
    ap.add_argument("--draft", default="", help="a draft model with the model's vocabulary")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--modes", nargs="+", default=None, choices=["plain", "ngram", "draft"])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--cpu-kernels", default="")
    ap.add_argument("--request-timeout", type=float, default=600)
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--nice", type=int, default=0)
    ap.add_argument("--json", default=os.path.join(REPO, "build", "bench-spec.json"))
    a = ap.parse_args()
    bench_cpu.NICE = a.nice
    a.modes = a.modes or (["plain", "ngram"] + (["draft"] if a.draft else []))
    if "plain" not in a.modes:
        a.modes.insert(0, "plain")  # every ratio is against it
    if "draft" in a.modes and not a.draft:
        raise SystemExit("mode draft needs --draft FILE")
    if not (1 <= a.threads <= 256 and 1 <= a.max_tokens <= 2048 and 1 <= a.rounds <= 20
            and 256 <= a.ctx <= 1 << 20):
        raise SystemExit("an option is out of range")
    if not a.model:
        a.model = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "real_models.py"),
                                  "smollm2-135m-instruct-q4_1"], capture_output=True, text=True,
                                 check=True).stdout.strip()
    a.kiri = os.path.abspath(a.kiri)
    for path in [a.model] + ([a.draft] if a.draft else []):
        if not os.path.exists(path):
            raise SystemExit(f"no model file {path}")
    # What bench_serve.start and its Server read.
    a.parallel, a.slot_ctx, a.backend = 1, a.ctx, "auto"
    a.kv_memory = f"{-(-a.ctx * bench_serve.kv_bytes_per_token(a.model) // bench_serve.MiB) + 1}M"
    a.kiri_args = a.llama_args = ""
    if not a.no_llama:
        a.llama_bin = bench_cpu.llama_bin_dir(a)
    a.log_dir = os.path.join(os.path.dirname(os.path.abspath(a.json)), "bench-spec-logs")
    os.makedirs(a.log_dir, exist_ok=True)
    bench_serve.renice_self()

    t_start = time.time()
    bw = [bench_cpu.membw(a)]
    sides = ["kiri"] + ([] if a.no_llama else ["llama"])
    runs = {side: {mode: [] for mode in a.modes} for side in sides}
    for rnd in range(a.rounds):
        order = sides if rnd % 2 == 0 else sides[::-1]
        for mode in a.modes:
            for side in order:
                runs[side][mode].append(run_mode(a, side, mode, rnd))
    bw.append(bench_cpu.membw(a))
    best = {side: {mode: {task: max((r[task] for r in runs[side][mode]), key=lambda x: x["tps"])
                          for task in a.tasks} for mode in a.modes} for side in sides}
    machine = {"cpu": cpu_name(), "cores": os.cpu_count(), "kernel": platform.release(),
               "kiri_kernels": bench_serve.kiri_kernels(a),
               "llama_cpp": ("" if a.no_llama else
                             f"{bench_serve.llama_build(a)} from the llama-cpp-python "
                             f"{bench_cpu.llama_cpp_version()} sdist, {bench_cpu.llama_flavour(a.llama_bin)}"),
               "membw_gbps": {t: max(b[t][0] for b in bw) for t in bw[0]}}
    md = table(a, best, machine)
    out = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)), "machine": machine,
           "kiri": {"binary": a.kiri, "git_head": tool_output(["git", "-C", REPO, "rev-parse", "HEAD"])},
           "settings": {k: getattr(a, k) for k in ("model", "draft", "threads", "max_tokens", "rounds", "modes",
                                                   "tasks", "ctx", "cpu_kernels", "nice")},
           "tasks": TASKS, "server_flags": MODE_FLAGS, "runs": runs, "best": best, "markdown": md,
           "elapsed_seconds": time.time() - t_start}
    bench_cpu.save_report(a.json, out, md, t_start, a.log_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
