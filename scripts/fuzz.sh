#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan) and runs each over its seed corpus for
# SECONDS (default 60): the GGUF parser, the GBNF grammar compiler and matcher, the tokenizer (over
# the vocabularies of ../shared/tokenizer-vectors), the JSON Schema compiler (with Jansson) and,
# when the server is built, the OpenAI request parser, the fleet manifest and the chat templates.
# Finds go to build-fuzz/crashes/ and fail the run; the summary line of each target is printed.
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS_PER_TARGET=${1:-60}
CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DKIRI_FUZZ=ON -DKIRI_TESTS=OFF >/dev/null
# The tokenizer target's vocabularies: the shared reference data, as the tests read it.
export KIRI_VOCAB_DIR=${KIRI_VOCAB_DIR:-${KIRI_SHARED_DIR:-../shared}/tokenizer-vectors}
targets=(gguf grammar tokenizer)
[ -f build/deps/install/lib/libcivetweb.a ] && targets+=(openai manifest chat_template)
# JSON Schema -> GBNF builds wherever Jansson is (kiri_schema).
[ -f /usr/include/jansson.h ] && targets+=(json_schema)
mkdir -p build-fuzz/crashes
for t in "${targets[@]}"; do
  cmake --build build-fuzz -j "$(nproc)" --target "fuzz_$t" >/dev/null
  mkdir -p "build-fuzz/corpus/$t"
  echo "fuzz_$t: ${SECONDS_PER_TARGET}s over tests/fuzz/seeds/$t"
  build-fuzz/"fuzz_$t" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -timeout=5 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/ "build-fuzz/corpus/$t" "tests/fuzz/seeds/$t" \
    >"build-fuzz/fuzz_$t.log" 2>&1 || true
  grep -E "^(Done|stat::number_of_executed_units|stat::average_exec_per_sec|stat::peak_rss_mb)|ERROR|SUMMARY" \
    "build-fuzz/fuzz_$t.log" || true
  if ls build-fuzz/crashes/* >/dev/null 2>&1; then
    # Enough to reproduce from a CI log alone: the report, and each input (base64 up to 8 KiB).
    echo "fuzz_$t: crash inputs in build-fuzz/crashes/; the fuzzer's report:"
    grep -v -E "^#[0-9]+|^INFO:|^Done|^stat::" "build-fuzz/fuzz_$t.log" | tail -n 60 || true
    for f in build-fuzz/crashes/*; do
      echo "$f ($(stat -c %s "$f") bytes), base64:"
      head -c 8192 "$f" | base64 -w 100
    done
    exit 1
  fi
done
