"""`kiri bench` follows llama-bench's test matrix, which bench/bench_cpu.py compares it with: at each
depth of -d, a prefill of -p tokens ("pp") and a decode of -n tokens ("tg"), -r timed runs each;
-p 0 or -n 0 leaves that test out (llama-bench's meaning), and both at 0 leave nothing to run.
"""
import json
import subprocess

from conftest import MODEL


def bench(kiri_bin, *args):
    return subprocess.run([str(kiri_bin), "bench", "-m", str(MODEL), "-t", "1", *args],
                          capture_output=True, text=True, timeout=120)


def matrix_of(r):
    assert r.returncode == 0, r.stderr
    j = json.loads(r.stdout.strip().splitlines()[-1])
    return j, [(t["n_prompt"], t["n_gen"], t["n_depth"], len(t["samples_ts"])) for t in j["tests"]]


def test_matrix(kiri_bin):
    j, tests = matrix_of(bench(kiri_bin, "-p", "32", "-n", "8", "-d", "0,16", "-r", "2", "--json"))
    assert tests == [(32, 0, 0, 2), (0, 8, 0, 2), (32, 0, 16, 2), (0, 8, 16, 2)], tests
    assert j["prefill_tps"] > 0 and j["decode_tps"] > 0, j


def test_zero_leaves_a_test_out(kiri_bin):
    j, tests = matrix_of(bench(kiri_bin, "-p", "32", "-n", "0", "-d", "0,16", "-r", "1", "--json"))
    assert tests == [(32, 0, 0, 1), (32, 0, 16, 1)], tests
    assert j["decode_tps"] == 0
    j, tests = matrix_of(bench(kiri_bin, "-p", "0", "-n", "8", "-r", "1", "--json"))
    assert tests == [(0, 8, 0, 1)], tests
    assert j["prefill_tps"] == 0 and j["decode_tps"] > 0
    r = bench(kiri_bin, "-p", "0", "-n", "0")
    assert r.returncode == 2 and "no test to run" in r.stderr, r.stderr
    r = bench(kiri_bin, "-p", "-1")
    assert r.returncode == 2 and "--prompt" in r.stderr, r.stderr
