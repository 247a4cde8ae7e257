#!/usr/bin/env bash
# Builds the fully static aarch64 kiri (musl; ports/linux-arm64) and tests it for real under
# user-mode QEMU:
#   1. every unit test (ctest) on QEMU's "max" core (NEON, dotprod, i8mm), then the NEON kernel
#      tests again on a Neoverse N1 (dotprod without i8mm) and a Cortex-A72 (NEON without
#      dotprod), so every kernel path runs;
#   2. tests/arm64_smoke.py: the CLI and the server (HTTP and HTTPS) against llama.cpp's
#      recorded greedy outputs.
# Needs scripts/install-deps.sh --arm64 (the Makefile's arm64 targets run it). Prints the
# stripped binary's size. BUILD (default build-arm64) names the build folder.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build-arm64}
JOBS=$(nproc)

scripts/build-deps.sh --arch arm64 --musl >/dev/null
cmake -S . -B "$BUILD" -DCMAKE_TOOLCHAIN_FILE=ports/linux-arm64/toolchain-musl.cmake \
      -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j "$JOBS"
QEMU_CPU=${QEMU_CPU:-max} ctest --test-dir "$BUILD" --output-on-failure
QEMU_CPU=neoverse-n1 ctest --test-dir "$BUILD" -R "test_neon|test_ops_neon" --output-on-failure
QEMU_CPU=cortex-a72 ctest --test-dir "$BUILD" -R "test_neon|test_ops_neon" --output-on-failure
VENV=$(scripts/make-venv.sh)
"$VENV/bin/python" tests/arm64_smoke.py "$BUILD"
aarch64-linux-gnu-strip -o "$BUILD/kiri.stripped" "$BUILD/kiri"
echo "static aarch64 kiri (runtime, server, TLS): $(stat -c %s "$BUILD/kiri.stripped") bytes stripped" \
     "($BUILD/kiri.stripped)"
