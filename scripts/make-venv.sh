#!/usr/bin/env bash
# Builds the Python venv the test and bench tiers use: gguf (writes test models, independent
# dequantizers), numpy, llama-cpp-python (the llama.cpp reference), the openai client and
# websocket-client (the server tests drive `kiri serve` with the real OpenAI client, and its chat
# page in headless Chromium over the DevTools protocol), compiled once for this CPU and cached
# outside the repo so every clone on the machine shares it.
# llama.cpp's native build probes the CPU at compile time and enables AMX on machines that
# advertise it but fault on it, so the flags are set explicitly from /proc/cpuinfo, AMX never.
set -euo pipefail

VENV="${KIRI_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/kiri/venv}"
LLAMA_CPP_PYTHON_VERSION="0.3.36"
GGUF_VERSION="0.19.0"

# Pure-Python tools added after the venv was first built come in on their own, without rebuilding
# llama-cpp-python: jsonschema (validates constrained output) and the OpenAI Agents SDK (a real
# agent framework driving `kiri serve`).
LIGHT_PKGS=("jsonschema>=4.17" "openai-agents>=0.2")
light() {
  "$VENV/bin/python" -c 'import jsonschema, agents' 2>/dev/null ||
    "$VENV/bin/pip" install -q "${LIGHT_PKGS[@]}" >&2
}

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import llama_cpp, gguf, numpy, pytest, openai, websocket, jinja2' 2>/dev/null; then
  light; echo "$VENV"; exit 0
fi

mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --upgrade pip >&2
"$VENV/bin/pip" install -q numpy "gguf==$GGUF_VERSION" pytest "openai>=1.26" "websocket-client>=1.6" jinja2 >&2

flags="-DGGML_NATIVE=OFF -DGGML_OPENMP=ON -DGGML_BLAS=OFF -DLLAMA_CURL=OFF"
has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }
if [ "$(uname -m)" = x86_64 ]; then
  has avx && flags+=" -DGGML_AVX=ON"
  has avx2 && flags+=" -DGGML_AVX2=ON"
  has fma && flags+=" -DGGML_FMA=ON"
  has f16c && flags+=" -DGGML_F16C=ON"
  has bmi2 && flags+=" -DGGML_BMI2=ON"
  if has avx512f && has avx512bw && has avx512vl; then flags+=" -DGGML_AVX512=ON"; fi
  has avx512_vnni && flags+=" -DGGML_AVX512_VNNI=ON"
  flags+=" -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
fi
echo "make-venv: building llama-cpp-python $LLAMA_CPP_PYTHON_VERSION with $flags" >&2
CMAKE_ARGS="$flags" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
  "$VENV/bin/pip" install -q --no-cache-dir "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2
"$VENV/bin/python" -c 'import llama_cpp, gguf, numpy' >&2
light
echo "$VENV"
