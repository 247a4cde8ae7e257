#!/usr/bin/env bash
# Runs every test tier this machine can run, in order:
#   1. release build + C unit tests and the embedding example (ctest)
#   2. the same tests built with AddressSanitizer and UBSan
#   3. outside-reference tests (pytest): llama.cpp logits and greedy outputs, tokenizer and
#      dequantization references, the malformed-GGUF corpus through the CLI
#   4. a short libFuzzer run of each parser (GGUF, OpenAI request bodies) over its seed corpus
#   5. the static aarch64 build under qemu-aarch64 (scripts/test-arm64.sh): every unit test, the
#      NEON kernels on three emulated cores, the CLI and the server against llama.cpp's outputs
# and ends with one line "N passed, N failed" counting the tiers.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
passed=0; failed=0; failed_names=()

tier() { # name, command...
  local name=$1; shift
  echo "==== $name"
  if "$@"; then passed=$((passed + 1)); echo "==== $name: ok"
  else failed=$((failed + 1)); failed_names+=("$name"); echo "==== $name: FAILED"; fi
}

build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null && cmake --build "$dir" -j "$JOBS"
}

VENV=$(scripts/make-venv.sh) || { echo "test.sh: cannot build the Python venv"; exit 1; }
# The server's TLS stack (mbedTLS, CivetWeb) from Debian's sources; seconds when cached.
scripts/build-deps.sh || { echo "test.sh: cannot build mbedTLS/CivetWeb"; exit 1; }

tier "build" build build
tier "unit tests" ctest --test-dir build --output-on-failure
tier "asan+ubsan build" build build-asan -DKIRI_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
# Mesa's lavapipe driver keeps one-time allocations that leak when the Vulkan loader unloads it
# after a probe, so outside test_vulkan (which keeps the driver loaded) the sanitizer tier hides
# Vulkan devices; the release tier runs every test with them.
tier "unit tests (asan+ubsan)" env ASAN_OPTIONS=detect_leaks=1 VK_ICD_FILENAMES=/nonexistent.json \
  ctest --test-dir build-asan -E test_vulkan --output-on-failure
tier "vulkan (asan+ubsan)" env ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan -R test_vulkan --output-on-failure
tier "reference tests" env KIRI_BUILD="$PWD/build" "$VENV/bin/python" -m pytest -q tests
if command -v clang >/dev/null; then
  tier "fuzz smoke" scripts/fuzz.sh 30
fi
if command -v qemu-aarch64 >/dev/null && command -v aarch64-linux-musl-gcc >/dev/null; then
  tier "arm64 (qemu)" scripts/test-arm64.sh
else
  echo "==== arm64 (qemu): not run (scripts/install-deps.sh --arm64 installs what it needs)"
  failed=$((failed + 1)); failed_names+=("arm64 (qemu): missing packages")
fi

echo
[ ${#failed_names[@]} -eq 0 ] || echo "failed tiers: ${failed_names[*]}"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
