#!/usr/bin/env bash
# Runs the CUDA backend's checks on a machine with an NVIDIA GPU and its driver, from binaries
# built on another machine: the GPU machine needs no CUDA toolkit (cudart is linked statically
# and only the driver, libcuda.so.1, comes from the machine). Build them first where nvcc is:
#   cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release && cmake --build build-cuda --target kiri-cli cuda_check
# then bring the repository with build-cuda/kiri and build-cuda/cuda_check (about 12 MB; carry
# those two paths, or all of build-cuda) to the GPU machine and run, from the repository root:
#   OUT=/some/folder scripts/cuda-check.sh
# It writes under $OUT (default ./cuda-check-out):
#   info.txt        the GPU (nvidia-smi) and what `kiri info` prints (the backend picked and why)
#   cuda_check.txt  the op table (op, type, shape, max error, tolerance, ok) with weights copied
#                   and with weights mapped in place, whole-model greedy agreement with the CPU,
#                   the batching loop, and decode tokens/s of a TinyLlama-shape Q4_0 model against
#                   the card's memory-bandwidth bound
#   bench.json      `kiri bench --backend cuda --json` on stories260K and the TinyLlama-shape model
#                   (and the CPU on the latter for comparison, KIRI_BENCH_CPU=0 to skip)
# and ends with one line: "cuda-check: ok" or "cuda-check: FAILED (...)". Exit status 0 when the
# checks pass, 77 when there is no usable GPU, 1 otherwise. Takes a few minutes (the TinyLlama-
# shape model, 600 MB, is written to $TMPDIR and removed afterwards).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
B=${KIRI_CUDA_BUILD:-build-cuda}
OUT=${OUT:-$ROOT/cuda-check-out}
TMP=${TMPDIR:-/tmp}/kiri-cuda-check.$$
mkdir -p "$OUT" "$TMP" || exit 1
trap 'rm -rf "$TMP"' EXIT
for f in kiri cuda_check; do
  if [ ! -x "$B/$f" ]; then
    echo "cuda-check: $B/$f is missing: build it where nvcc is (see the top of $0) and bring it along"
    exit 2
  fi
done
export KIRI_STORIES=$ROOT/models/stories260K.gguf
TL=$TMP/tinyllama-shape-q4_0.gguf
failed=()

{
  echo "== $(date -u +%FT%TZ) $(uname -srm)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.memory,pcie.link.gen.max \
             --format=csv 2>&1 || echo "(no nvidia-smi)"
  echo "== kiri info"
  "$B/kiri" info
  echo "== kiri info -m stories260K"
  "$B/kiri" info -m "$KIRI_STORIES"
} >"$OUT/info.txt" 2>&1
cat "$OUT/info.txt"

echo "== cuda_check (log: $OUT/cuda_check.txt)"
(cd "$TMP" && timeout "${KIRI_CHECK_TIMEOUT:-420}" "$ROOT/$B/cuda_check" --tinyllama-out "$TL") \
  >"$OUT/cuda_check.txt" 2>&1
rc=$?
grep -E "FAIL|probe score|cuda_check \[|decode|bound|greedy|requests equal|checks" "$OUT/cuda_check.txt" | head -80
if [ $rc -eq 77 ]; then
  echo "cuda-check: skipped: no usable CUDA device"
  exit 77
fi
[ $rc -eq 0 ] || failed+=("cuda_check (exit $rc)")

echo "== kiri bench --backend cuda"
: >"$OUT/bench.json"
bench() { # label, args...
  local label=$1; shift
  printf '{"run": "%s", "result": ' "$label" >>"$OUT/bench.json"
  if timeout 300 "$B/kiri" bench "$@" --json >"$TMP/bench.out" 2>"$TMP/bench.err"; then
    tr -d '\n' <"$TMP/bench.out" >>"$OUT/bench.json"
  else
    printf 'null' >>"$OUT/bench.json"
    failed+=("bench $label")
    cat "$TMP/bench.err"
  fi
  printf '}\n' >>"$OUT/bench.json"
}
bench "stories260K cuda" -m "$KIRI_STORIES" --backend cuda -p 128 -n 128
if [ -f "$TL" ]; then
  bench "tinyllama-shape Q4_0 cuda" -m "$TL" --backend cuda -p 512 -n 128
  [ "${KIRI_BENCH_CPU:-1}" = 0 ] || bench "tinyllama-shape Q4_0 cpu" -m "$TL" --backend cpu -p 128 -n 32
fi
cat "$OUT/bench.json"

if [ ${#failed[@]} -eq 0 ]; then
  echo "cuda-check: ok"
else
  echo "cuda-check: FAILED (${failed[*]})"
  exit 1
fi
