#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each over its seed corpus for
# SECONDS (default 60). Finds are written to build-fuzz/crashes/ and fail the run.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKIRI_FUZZ=ON -DKIRI_TESTS=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target fuzz_gguf
mkdir -p build-fuzz/corpus/gguf build-fuzz/crashes
build-fuzz/fuzz_gguf -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -timeout=5 \
  -artifact_prefix=build-fuzz/crashes/ build-fuzz/corpus/gguf tests/fuzz/seeds/gguf 2>&1 | tail -5
