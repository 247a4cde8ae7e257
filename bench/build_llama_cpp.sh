#!/bin/sh
# Builds llama.cpp's own llama-bench, llama-server and llama-completion, once, from the llama.cpp
# source that the pinned llama-cpp-python sdist vendors (scripts/llama_cpp_source.py fetches it
# through pip), into a cache outside the repo. Prints the directory holding the programs.
# llama-bench and llama-server are the peers of bench_cpu.py and bench_serve.py; llama-completion
# (the plain prompt-in, text-out tool) times a fresh process's first token for bench_cpu.py.
#
#   bench/build_llama_cpp.sh            (PYTHON=venv python, JOBS=parallel jobs, optional)
#
# CPU only, GGML_NATIVE=ON (the kernels this CPU has, as a user building it here would get),
# static, no network features. A finished build is reused; delete the cache folder to rebuild.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-"$HOME/.cache/kiri/venv/bin/python"}
JOBS=${JOBS:-$(nproc)}
src=$("$PYTHON" "$here/scripts/llama_cpp_source.py")
out="$(dirname "$(dirname "$(dirname "$src")")")/llama.cpp-build-native"
tools="llama-bench llama-server llama-completion"
have=1
for t in $tools; do
    [ -x "$out/bin/$t" ] || have=0
done
if [ "$have" = 1 ] && [ -f "$out/.done" ]; then
    echo "$out/bin"
    exit 0
fi
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DGGML_OPENMP=ON >&2
cmake --build "$out" -j "$JOBS" --target $tools >&2
touch "$out/.done"
echo "$out/bin"
