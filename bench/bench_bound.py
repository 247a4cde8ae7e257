#!/usr/bin/env python3
"""Decode against the memory-bandwidth bound measured right beside it.

bench_cpu.py divides decode speed by the best bandwidth pass of a whole run. On a machine whose
bandwidth moves from one minute to the next (a VM beside other tenants: 33-77 GB/s with 2 threads
from one pass to the next on the machine of issue 13), that best pass may come from a quiet minute
the decode run never saw, and the fraction of the bound then says more about the neighbours than
about the kernels. This script pairs every decode run with its own bandwidth: each sample is

    membw (T threads, 512 MiB, 3 passes)  ->  one decode process  ->  membw again

and its fraction of the bound is

    decode tok/s * bytes/token / mean(best pass before, best pass after)

with bytes/token as in bench_cpu.py (every weight once, token_embd one row, the KV cache at the
mean decode position). kiri and llama.cpp alternate sample by sample (kiri first in even pairs,
second in odd ones). Reported per model and depth: the median fraction over the samples, their
range, and the median tok/s; the JSON keeps every sample with its two bandwidth passes.

A sample whose two passes disagree (the neighbours came or went while it decoded) has no one bound:
the decode may have run at either rate. So each cell also gives the median over the steady samples
alone, those whose passes agree within STEADY (10%), and how many there were. On this project's VM
the passes jump between two levels (about 31 and 53 GB/s with 2 threads); decode speed does not
follow the higher one, so a sample that straddles a jump reads low or high by chance. Where a run's
passes span two such levels (its fastest over TWO_LEVELS times its slowest), a second table splits
the samples at the midpoint: those whose two passes both lie below it and those whose passes both lie
above, each with its median % of the bound and tok/s. At the lower level memory is what decode waits
on; at the higher one the cores' arithmetic may be, and a decode that speeds up little there says so.
`--report JSON` prints the tables of a saved run again (runs saved before the split included);
given several runs, it then prints each cell's median from every run and the best of them, the
figure a "best of at least three runs" reads, and the tables of all their samples pooled.

The bandwidth passes stream a private buffer with 4 KiB pages, as bench_cpu.py's do. Decoding reads
the model through a mapping of the page cache instead, so each model and depth also gets one
measurement of the rate at which T threads stream that very mapping (`membw -f MODEL`), shown
beside the bound: where the two differ, the pages, not the kernels, would explain it.

Usage: bench_bound.py [--kiri PATH] [--llama-bin DIR] [--models DIR ...] [--threads T]
                      [--samples N] [--n-gen N] [--depths D ...] [--cpu-kernels TIER]
                      [--only NAME ...] [--no-llama] [--nice N] [--json PATH]
       bench_bound.py --report JSON [JSON ...]
  Defaults: /tmp/bench-build/kiri (else build/kiri), llama.cpp from bench/build_llama_cpp.sh,
  tinyllama-Q4_0 and tinyllama-Q4_K_M in <repo>/build/bench-models, T=2, 7 samples a side of
  64 tokens at depths 0 and 512 (each decode process fills its context untimed, warms up, then
  times one run), <repo>/build/bench-bound.json. About 10 minutes for the two default models.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_cpu  # noqa: E402  (its decode runs, membw, model shapes and peer finding)

REPO = bench_cpu.REPO
TARGET = bench_cpu.TARGETS["bound_fraction"]
TWO_LEVELS = 1.3  # a run whose fastest pass is above this times its slowest is also reported by level
SIDE_NAMES = {"kiri": "kiri", "llama": "llama.cpp"}
STEADY = 0.10  # the most two passes beside one sample may differ, as a fraction of the lower, for it to count as steady


def steady(sample):
    lo, hi = sorted((sample["gbps_before"], sample["gbps_after"]))
    return hi - lo <= STEADY * lo


def summary(samples):
    """One side's medians over its samples: % of the bound (all, range, steady ones), GB/s, tok/s."""
    f = [s["fraction"] for s in samples]
    fs = [s["fraction"] for s in samples if steady(s)]
    return {"median_fraction": statistics.median(f), "min_fraction": min(f), "max_fraction": max(f),
            "steady_samples": len(fs), "steady_median_fraction": statistics.median(fs) if fs else None,
            "median_gbps": statistics.median((s["gbps_before"] + s["gbps_after"]) / 2 for s in samples),
            "median_tps": statistics.median(s["tps"] for s in samples)}


def levels(results, sides):
    """The bandwidth level below which a sample's passes count as the lower one: the midpoint of the
    run's slowest and fastest pass, or None when they are within TWO_LEVELS of each other."""
    passes = [x for r in results for side in sides for s in r["samples"][side]
              for x in (s["gbps_before"], s["gbps_after"])]
    lo, hi = min(passes), max(passes)
    return (lo + hi) / 2 if hi > TWO_LEVELS * lo else None


def level_cell(samples, split, lower):
    """Median % of the bound, median tok/s and the number of the samples whose two passes are both
    below split (lower) or both above it."""
    sel = [s for s in samples if all((x < split) == lower for x in (s["gbps_before"], s["gbps_after"]))]
    if not sel:
        return "none"
    return (f"{100 * statistics.median(s['fraction'] for s in sel):.0f}%, "
            f"{statistics.median(s['tps'] for s in sel):.1f} ({len(sel)})")


def report(machine, results, sides):
    """The tables of a run, as markdown: the medians per model and depth, then, where the run's
    passes fall on two levels, the same split by level."""
    n = len(results[0]["samples"]["kiri"]) if results else 0
    lines = [f"{machine['cpu']}, {machine['threads']} threads, kiri kernels {machine['cpu_kernels']}, "
             f"{n} samples a side of {machine.get('n_gen', 64)} tokens, {machine['started']}", "",
             "| model | depth | GB/s beside kiri (the file's mapping) | kiri: median % of bound (range; steady) |"
             " kiri tok/s |" + (" llama.cpp: median % (range; steady) | llama.cpp tok/s |" if len(sides) > 1 else ""),
             "|---|---|---|---|---|" + ("---|---|" if len(sides) > 1 else "")]
    for r in results:
        cells = [r["model"], str(r["depth"]), f"{r['kiri']['median_gbps']:.1f} ({r['file_gbps']:.1f})"]
        for side in sides:
            s = r[side]
            st = (f"{100 * s['steady_median_fraction']:.0f}% of {s['steady_samples']}" if s["steady_samples"]
                  else "none")
            cells += [f"{100 * s['median_fraction']:.0f}% ({100 * s['min_fraction']:.0f}-{100 * s['max_fraction']:.0f};"
                      f" {st})", f"{s['median_tps']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"target: a median of {100 * TARGET:.0f}% of the bound; steady: the median over the samples whose "
                 f"two bandwidth passes agree within {100 * STEADY:.0f}%, and their number")
    split = levels(results, sides)
    if split:
        lines += ["", f"By bandwidth level: the samples whose two passes are both below {split:.1f} GB/s (lower) "
                  "or both above it (higher); median % of the bound, median tok/s (samples):", "",
                  "| model | depth | " + " | ".join(f"{SIDE_NAMES[s]} lower | {SIDE_NAMES[s]} higher" for s in sides) + " |",
                  "|---|---|" + "---|---|" * len(sides)]
        for r in results:
            cells = [r["model"], str(r["depth"])]
            for side in sides:
                cells += [level_cell(r["samples"][side], split, True), level_cell(r["samples"][side], split, False)]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cells_of_runs(runs):
    """The results of several saved runs by (model, depth), each cell's rows in the runs' order."""
    cells = {}
    for run in runs:
        for r in run["results"]:
            cells.setdefault((r["model"], r["depth"]), []).append(r)
    return cells


def best_of_runs(runs, sides):
    """Per model and depth, each saved run's median % of the bound (in the order given) and the best
    of them, as markdown."""
    lines = ["Runs started " + ", ".join(run["machine"]["started"] for run in runs) +
             "; each run's median % of the bound over all its samples, and the best of them:", "",
             "| model | depth | " + " | ".join(f"{SIDE_NAMES[s]}, each run | {SIDE_NAMES[s]}, best" for s in sides) + " |",
             "|---|---|" + "---|---|" * len(sides)]
    for (model, depth), rows in cells_of_runs(runs).items():
        out = [model, str(depth)]
        for side in sides:
            f = [100 * r[side]["median_fraction"] for r in rows]
            out += [", ".join(f"{x:.0f}%" for x in f), f"{max(f):.0f}%"]
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def pooled(runs, sides):
    """Several saved runs as one: each cell's samples of every run together (the file's mapping
    rate the median of the runs'), with the machine of the first run."""
    results = []
    for (model, depth), rows in cells_of_runs(runs).items():
        r = {"model": model, "depth": depth, "samples": {side: [s for row in rows for s in row["samples"][side]]
                                                         for side in sides},
             "file_gbps": statistics.median(row["file_gbps"] for row in rows)}
        for side in sides:
            r[side] = summary(r["samples"][side])
        results.append(r)
    machine = dict(runs[0]["machine"], started=f"{len(runs)} runs pooled, started "
                   + ", ".join(run["machine"]["started"] for run in runs))
    return machine, results


def bandwidth(a, path=None):
    """Best of 3 passes with T threads over 512 MiB of private memory, or over a mapping of the
    file at path; GB/s."""
    what = ["-f", path] if path else ["512"]
    r = subprocess.run([bench_cpu.membw_exe()] + what + ["3", str(a.threads)], capture_output=True, text=True,
                       check=True, start_new_session=bool(bench_cpu.NICE), preexec_fn=bench_cpu._renice)
    for line in r.stdout.splitlines():
        if line.startswith("threads="):
            return float(dict(x.split("=") for x in line.split())["best_gbps"])
    raise SystemExit("membw printed no result:\n" + r.stdout + r.stderr)


def decode(side, a, path, depth):
    """One process: fill `depth` tokens untimed, warm up, time one decode of a.n_gen tokens
    (bench_cpu.run_speed with no prefill test and one timed run)."""
    one = argparse.Namespace(**vars(a))
    one.n_prompt, one.depths, one.reps = 0, [depth], 1
    return bench_cpu.run_speed(side, one, path)["tests"][bench_cpu.test_key(0, a.n_gen, depth)][0]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default_kiri = "/tmp/bench-build/kiri"
    if not os.path.exists(default_kiri):
        default_kiri = os.path.join(REPO, "build", "kiri")
    p.add_argument("--kiri", default=default_kiri)
    p.add_argument("--llama-bin")
    p.add_argument("--models", nargs="+", default=[os.path.join(REPO, "build", "bench-models")])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--samples", type=int, default=7)
    p.add_argument("--n-gen", type=int, default=64)
    p.add_argument("--depths", type=int, nargs="+", default=[0, 512])
    p.add_argument("--cpu-kernels")
    p.add_argument("--only", nargs="+", default=["tinyllama-Q4_0", "tinyllama-Q4_K_M"])
    p.add_argument("--no-llama", action="store_true")
    p.add_argument("--nice", type=int, default=0)
    p.add_argument("--timeout", type=int, default=600)
    p.add_argument("--json", default=os.path.join(REPO, "build", "bench-bound.json"))
    p.add_argument("--report", metavar="JSON", nargs="+",
                   help="print the tables of runs saved by --json (several: also the best of them and the"
                   " samples pooled), and run nothing")
    a = p.parse_args()
    if a.report:
        runs = []
        for path in a.report:
            with open(path) as f:
                runs.append(json.load(f))
        sides = [s for s in ("kiri", "llama") if all(run["results"] and s in run["results"][0]["samples"]
                                                     for run in runs)]
        for run in runs:
            for r in run["results"]:  # runs saved before the steady medians have only the samples' own
                for side in sides:
                    r[side] = summary(r["samples"][side])
            print(report(run["machine"], run["results"], sides) + "\n")
        if len(runs) > 1:
            print(best_of_runs(runs, sides) + "\n")
            print(report(*pooled(runs, sides), sides))
        return
    if a.samples < 1 or a.samples > 100 or a.n_gen < 1 or a.threads < 1:
        p.error("--samples 1..100, --n-gen and --threads at least 1")
    bench_cpu.NICE = a.nice
    sides = ["kiri"] if a.no_llama else ["kiri", "llama"]
    if not a.no_llama:
        a.llama_bin = bench_cpu.llama_bin_dir(a)

    machine = {"cpu": bench_cpu.cpu_name(), "threads": a.threads, "kiri": a.kiri,
               "cpu_kernels": a.cpu_kernels or "best", "llama_bin": a.llama_bin,
               "n_gen": a.n_gen, "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    results = []
    for name in a.only:
        path = bench_cpu.find_model(a, name)
        if not path:
            raise SystemExit(f"{name}.gguf not found in {a.models} (bench/make_models.py writes it)")
        shape = bench_cpu.model_shape(path)
        for depth in a.depths:
            per_token = bench_cpu.bytes_per_token(shape, depth + a.n_gen / 2)
            file_gbps = bandwidth(a, path)
            samples = {s: [] for s in sides}
            for i in range(a.samples):
                order = sides if i % 2 == 0 else sides[::-1]
                for side in order:
                    bench_cpu.warm(path)
                    before = bandwidth(a)
                    tps = decode(side, a, path, depth)
                    after = bandwidth(a)
                    bound = (before + after) / 2 * 1e9 / per_token
                    samples[side].append({"tps": tps, "gbps_before": before, "gbps_after": after,
                                          "fraction": tps / bound, "loadavg": os.getloadavg()[0]})
                    print(f"{name} d{depth} {side:5s} {tps:7.2f} tok/s  bandwidth {before:5.1f} / {after:5.1f} GB/s"
                          f"  {100 * tps / bound:5.1f}% of the bound", flush=True)
            row = {"model": name, "depth": depth, "bytes_per_token": per_token, "samples": samples,
                   "file_gbps": file_gbps}
            for side in sides:
                row[side] = summary(samples[side])
            results.append(row)

    md = report(machine, results, sides)
    print("\n" + md)
    with open(a.json, "w") as f:
        json.dump({"machine": machine, "results": results, "markdown": md}, f, indent=1)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
