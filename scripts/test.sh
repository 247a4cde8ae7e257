#!/usr/bin/env bash
# Runs the test tiers, every one this machine can run or those named:
#   scripts/test.sh [unit] [asan] [tsan] [reference] [fuzz] [arm64]
#   unit       release build + C unit tests and the embedding example (ctest)
#   asan       the same tests built with AddressSanitizer and UBSan
#   tsan       the scheduler, thread pool and server tests built with ThreadSanitizer
#              (test_batcher, test_model, test_models, test_server_modules, and a few server
#              pytest tests against the TSan kiri)
#   reference  outside-reference tests (pytest): llama.cpp logits and greedy outputs, tokenizer
#              and dequantization references, the malformed-GGUF corpus through the CLI, the server
#   fuzz       a short libFuzzer run of each parser (GGUF, grammars, tokenizer, JSON Schema, OpenAI
#              request bodies, fleet manifests, chat templates) over its seeds
#   arm64      the static aarch64 build under qemu-aarch64 (scripts/test-arm64.sh): every unit
#              test, the NEON kernels on three emulated cores, the CLI and the server
# Every build here has KIRI_WERROR on: a warning fails the tier. Prints each tier's seconds; ends with one line
# "N passed, N failed" counting the tiers.
set -uo pipefail
cd "$(dirname "$0")/.."
JOBS=$(nproc)
passed=0; failed=0; failed_names=(); failed_logs=()
ALL_TIERS=(unit asan tsan reference fuzz arm64)
for t in "$@"; do
  case " ${ALL_TIERS[*]} " in *" $t "*) ;; *) echo "test.sh: unknown tier '$t' (tiers: ${ALL_TIERS[*]})"; exit 2 ;; esac
done
TIERS=("${@:-${ALL_TIERS[@]}}")
wants() { case " ${TIERS[*]} " in *" $1 "*) return 0 ;; esac; return 1; }

# Each tier's output is also kept in build-logs/, so that the end of the run can repeat what a
# failed tier said (a CI log is often read from its tail, far below the failure).
LOGS=build-logs
mkdir -p "$LOGS"
tier() { # name, command...
  local name=$1 start=$SECONDS log="$LOGS/${1//[^A-Za-z0-9]/_}.log"; shift
  echo "==== $name"
  if "$@" 2>&1 | tee "$log"; then passed=$((passed + 1)); echo "==== $name: ok ($((SECONDS - start)) s)"
  else failed=$((failed + 1)); failed_names+=("$name"); failed_logs+=("$log"); echo "==== $name: FAILED ($((SECONDS - start)) s)"; fi
}

build() { # dir, extra cmake args...
  local dir=$1; shift
  cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=Release -DKIRI_WERROR=ON "$@" >/dev/null && cmake --build "$dir" -j "$JOBS"
}

# ThreadSanitizer maps its shadow memory at fixed addresses, which fails ("unexpected memory
# mapping") where the kernel randomises mmap with more bits than it expects (vm.mmap_rnd_bits
# above 28 on x86-64, as on recent Ubuntu kernels): run it without address randomisation there.
tsan_run() {
  local bits
  bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 0)
  if [ "$bits" -gt 28 ] && command -v setarch >/dev/null; then setarch "$(uname -m)" -R "$@"; else "$@"; fi
}

# The server tests that run the TSan kiri: requests batched together, cancelled mid-stream,
# refused when the queue is full, and a clean drain on SIGTERM (a few minutes at TSan's speed).
TSAN_PYTESTS=(
  "tests/test_server.py::test_batching_changes_nothing"
  "tests/test_server.py::test_openai_chat_stream_equals_non_stream"
  "tests/test_server.py::test_disconnect_mid_stream"
  "tests/test_server.py::test_queue_full_429"
  "tests/test_server.py::test_metrics_and_health"
  "tests/test_server.py::test_sigterm_drains"
)

tsan_tier() {
  # Vulkan devices hidden as in the sanitizer tier: TSan does not see into the driver's threads.
  local -x VK_ICD_FILENAMES=/nonexistent.json
  cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=Release -DKIRI_WERROR=ON -DKIRI_TSAN=ON >/dev/null &&
    cmake --build build-tsan -j "$JOBS" --target test_batcher test_model test_models test_server_modules kiri-cli ||
    return 1
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" tsan_run \
    ctest --test-dir build-tsan -R '^(test_batcher|test_model|test_models|test_server_modules)$' --output-on-failure ||
    return 1
  local tests=() t
  for t in "${TSAN_PYTESTS[@]}"; do
    "$VENV/bin/python" -m pytest -q --collect-only "$t" >/dev/null 2>&1 && tests+=("$t")
  done
  [ ${#tests[@]} -gt 0 ] || { echo "tsan: none of the server tests is there"; return 1; }
  TSAN_OPTIONS="halt_on_error=1 exitcode=66" KIRI_BUILD="$PWD/build-tsan" tsan_run \
    "$VENV/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}"
}

VENV=$(scripts/make-venv.sh) || { echo "test.sh: cannot build the Python venv"; exit 1; }
# The server's TLS stack (mbedTLS, CivetWeb) from Debian's sources; seconds when cached.
scripts/build-deps.sh || { echo "test.sh: cannot build mbedTLS/CivetWeb"; exit 1; }

if wants unit || wants reference; then
  tier "build" build build
fi
if wants unit; then
  tier "unit tests" ctest --test-dir build --output-on-failure
fi
if wants asan; then
  tier "asan+ubsan build" build build-asan -DKIRI_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
  # Mesa's lavapipe driver keeps one-time allocations that leak when the Vulkan loader unloads it
  # after a probe, so outside test_vulkan (which keeps the driver loaded) the sanitizer tier hides
  # Vulkan devices; the release tier runs every test with them.
  tier "unit tests (asan+ubsan)" env ASAN_OPTIONS=detect_leaks=1 VK_ICD_FILENAMES=/nonexistent.json \
    ctest --test-dir build-asan -E test_vulkan --output-on-failure
  tier "vulkan (asan+ubsan)" env ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan -R test_vulkan --output-on-failure
fi
if wants tsan; then
  tier "threads (tsan)" tsan_tier
fi
if wants reference; then
  tier "reference tests" env KIRI_BUILD="$PWD/build" "$VENV/bin/python" -m pytest -q --durations=12 tests
fi
if wants fuzz && command -v clang >/dev/null; then
  tier "fuzz smoke" scripts/fuzz.sh 30
fi
if wants arm64; then
  if command -v qemu-aarch64 >/dev/null && command -v aarch64-linux-musl-gcc >/dev/null; then
    tier "arm64 (qemu)" scripts/test-arm64.sh
  else
    echo "==== arm64 (qemu): not run (scripts/install-deps.sh --arm64 installs what it needs)"
    failed=$((failed + 1)); failed_names+=("arm64 (qemu): missing packages")
  fi
fi

echo
for log in "${failed_logs[@]}"; do
  echo "---- the last 40 lines of $log"
  tail -n 40 "$log"
done
[ ${#failed_names[@]} -eq 0 ] || echo "failed tiers: ${failed_names[*]}"
echo "$passed passed, $failed failed ($((SECONDS / 60)) min $((SECONDS % 60)) s)"
[ "$failed" -eq 0 ]
