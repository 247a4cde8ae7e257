#!/usr/bin/env python3
"""The cost of grammar-constrained decoding: kiri against llama.cpp on the same GGUF files,
grammar text, prompt, sampling settings and thread count.

For each model it runs four processes per round, alternating the sides (kiri first on even
rounds, llama.cpp first on odd):

  kiri free          kiri run -m M -p PROMPT -n N --temp X --seed S -t T
  kiri constrained   the same with --grammar G
  llama free         bench/llama_cpp_runner.py gen M --prompt PROMPT -n N --temp X --seed S -t T
  llama constrained  the same with --grammar G (llama.cpp's common_sampler scheme: draw freely,
                     check the token, apply the grammar to the whole vocabulary on a rejection)

G is the GBNF kiri compiles from a JSON Schema (an order record with nested objects, an array,
an enum, a date and a number), so both sides enforce the very same language. Reported per model:
decode tokens/s of each run (the best over the rounds), constrained / free for each side (the
cost of the constraint; 1.00 is free), and kiri / llama.cpp when constrained. Every constrained
output is checked with the `jsonschema` package when it is complete (an output cut by -n is
reported as cut, not as invalid).

Models, by vocabulary size:
  smollm2  SmolLM2-135M-Instruct Q4_1, the real file (scripts/real_models.py), 49152 tokens
  qwen05   Qwen2.5-0.5B's widths with the real Qwen2 vocabulary, 151669 tokens, random weights
           (bench/make_models.py qwen05; Q4_0)
A 262k vocabulary (Gemma 3) is not in the table: kiri does not load that file yet (issue 12).

Usage: bench_grammar.py [--kiri PATH] [--models DIR] [--threads T] [--rounds N] [-n N]
                        [--temp X] [--only NAME ...] [--json PATH]
  Defaults: <repo>/build/kiri, <repo>/build/bench-models, T=2, N=3 rounds, 96 tokens, 0.8.
"""

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(REPO, "bench")
RUNNER = os.path.join(HERE, "llama_cpp_runner.py")
sys.path.insert(0, HERE)
from bench_cpu import cpu_name, membw, spawn, warm  # noqa: E402

PROMPT = ("Write the order as JSON: Ana Lima ordered two lamps and a desk on 2026-03-04, "
          "paid by card, total 129.50 euros, to Rua Nova 7, Porto.\n")
SCHEMA = {
    "type": "object",
    "properties": {
        "customer": {"type": "object",
                     "properties": {"name": {"type": "string"}, "city": {"type": "string"}},
                     "required": ["name", "city"]},
        "items": {"type": "array", "minItems": 1, "maxItems": 8,
                  "items": {"type": "object",
                            "properties": {"product": {"type": "string"},
                                           "quantity": {"type": "integer"}},
                            "required": ["product", "quantity"]}},
        "payment": {"enum": ["card", "cash", "transfer"]},
        "date": {"type": "string", "format": "date"},
        "total": {"type": "number"},
    },
    "required": ["customer", "items", "payment", "date", "total"],
}


def model_path(name, a):
    if name == "smollm2":
        r = subprocess.run([sys.executable, os.path.join(REPO, "scripts", "real_models.py"),
                            "smollm2-135m-instruct-q4_1"], capture_output=True, text=True)
        if r.returncode != 0:
            raise SystemExit(r.stderr)
        return r.stdout.strip()
    path = os.path.join(a.models, "qwen05-Q4_0.gguf")
    if not os.path.exists(path):
        subprocess.run([sys.executable, os.path.join(HERE, "make_models.py"), "--out", a.models,
                        "--kiri", a.kiri, "qwen05"], check=True)
    return path


def compile_schema(a, out_path):
    """kiri's own JSON Schema compiler, through `kiri grammar --json-schema FILE`."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(SCHEMA, f)
    r = subprocess.run([a.kiri, "grammar", "--json-schema", f.name], capture_output=True, text=True)
    os.unlink(f.name)
    if r.returncode != 0:
        raise SystemExit(f"kiri cannot compile the schema: {r.stderr}")
    with open(out_path, "w") as f:
        f.write(r.stdout)


KIRI_TIMING = re.compile(r"generated (\d+) tokens in ([0-9.]+) s")


def run(side, constrained, path, grammar, a, seed):
    if side == "kiri":
        cmd = [a.kiri, "run", "--raw", "-m", path, "-p", PROMPT, "-n", str(a.n), "--temp",
               str(a.temp), "--seed", str(seed), "-t", str(a.threads)]
        if constrained:
            cmd += ["--grammar", grammar]
    else:
        cmd = [sys.executable, RUNNER, "gen", path, "--prompt", PROMPT, "-n", str(a.n), "--temp",
               str(a.temp), "--seed", str(seed), "-t", str(a.threads)]
        if constrained:
            cmd += ["--grammar", grammar]
    warm(path)
    rc, wall, _, out, err = spawn(cmd, 600)
    if rc != 0:
        raise SystemExit(f"{side} failed ({rc}): {' '.join(cmd)}\n{err[-3000:]}")
    if side == "kiri":
        m = KIRI_TIMING.search(err)
        if not m:
            raise SystemExit(f"no timing line from kiri:\n{err[-2000:]}")
        n, secs, text = int(m.group(1)), float(m.group(2)), out
    else:
        j = json.loads(out.strip().splitlines()[-1])
        n, secs, text = j["n_generated"], j["decode_seconds"], j["text"]
    return {"tokens": n, "seconds": secs, "tps": n / secs if secs > 0 else 0.0, "text": text}


def check_output(text):
    import jsonschema
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return "cut"
    try:
        jsonschema.validate(doc, SCHEMA)
    except jsonschema.ValidationError as e:
        return f"INVALID: {e.message}"
    return "valid"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kiri", default=os.path.join(REPO, "build", "kiri"))
    ap.add_argument("--models", default=os.path.join(REPO, "build", "bench-models"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=96)
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("--only", nargs="*", default=["smollm2", "qwen05"])
    ap.add_argument("--json", default=os.path.join(REPO, "build", "bench-grammar.json"))
    a = ap.parse_args()

    grammar = os.path.join(tempfile.gettempdir(), "kiri-bench-order.gbnf")
    compile_schema(a, grammar)
    tier = subprocess.run([a.kiri, "info"], capture_output=True, text=True).stdout
    m = re.search(r"cpu kernels?:\s*(\S+)", tier)
    bw = membw(a)
    print(f"CPU: {cpu_name()} ({platform.machine()}), {a.threads} threads, kiri kernels: "
          f"{m.group(1) if m else '?'}; read bandwidth {bw.get(a.threads, (0, 0))[0]:.1f} GB/s",
          file=sys.stderr)
    results = {}
    invalid = 0
    for name in a.only:
        path = model_path(name, a)
        runs = {(s, c): [] for s in ("kiri", "llama") for c in (False, True)}
        for r in range(a.rounds):
            order = ("kiri", "llama") if r % 2 == 0 else ("llama", "kiri")
            for side in order:
                for constrained in (False, True):
                    res = run(side, constrained, path, grammar, a, seed=r + 1)
                    if constrained:
                        res["check"] = check_output(res["text"])
                        invalid += res["check"].startswith("INVALID")
                    runs[(side, constrained)].append(res)
                    print(f"  {name} {side} {'constrained' if constrained else 'free'} round {r}: "
                          f"{res['tokens']} tokens, {res['tps']:.1f} tok/s"
                          f"{' ' + res['check'] if constrained else ''}", file=sys.stderr)
        results[name] = {f"{s}-{'constrained' if c else 'free'}": v for (s, c), v in runs.items()}

    print("\n| model (vocab) | kiri free / constrained tok/s | kiri constrained/free | "
          "llama.cpp free / constrained tok/s | llama.cpp constrained/free | "
          "kiri/llama.cpp constrained |")
    print("|---|---|---|---|---|---|")
    for name, res in results.items():
        best = {k: max(x["tps"] for x in v) for k, v in res.items()}
        vocab = {"smollm2": "49152", "qwen05": "151669"}.get(name, "?")
        print(f"| {name} ({vocab}) | {best['kiri-free']:.1f} / {best['kiri-constrained']:.1f} | "
              f"{best['kiri-constrained'] / best['kiri-free']:.3f} | "
              f"{best['llama-free']:.1f} / {best['llama-constrained']:.1f} | "
              f"{best['llama-constrained'] / best['llama-free']:.3f} | "
              f"{best['kiri-constrained'] / best['llama-constrained']:.2f} |")
    with open(a.json, "w") as f:
        json.dump({"when": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": cpu_name(),
                   "bandwidth": bw, "args": vars(a), "results": results}, f, indent=1)
    return 1 if invalid else 0


if __name__ == "__main__":
    sys.exit(main())
