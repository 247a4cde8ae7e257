#!/bin/sh
# Builds llama.cpp's own llama-bench, llama-server and llama-completion, once, from the llama.cpp
# source that the pinned llama-cpp-python sdist vendors (scripts/llama_cpp_source.py fetches it
# through pip), into a cache outside the repo. Prints the directory holding the programs.
# llama-bench and llama-server are the peers of bench_cpu.py and bench_serve.py; llama-completion
# (the plain prompt-in, text-out tool) times a fresh process's first token for bench_cpu.py.
#
#   bench/build_llama_cpp.sh            (PYTHON=venv python, JOBS=parallel jobs, optional)
#   TIER=avx2 bench/build_llama_cpp.sh  (an AVX2-only build, beside the native one)
#
# CPU only, GGML_NATIVE=ON (the kernels this CPU has, as a user building it here would get),
# static, no network features. TIER=avx2 builds for AVX2+FMA+F16C without AVX-512 (what an
# AVX2-only box runs), so an AVX-512 machine can compare tier for tier with `kiri --cpu-kernels
# avx2`. A finished build is reused; delete the cache folder to rebuild.
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-"$HOME/.cache/kiri/venv/bin/python"}
JOBS=${JOBS:-$(nproc)}
src=$("$PYTHON" "$here/scripts/llama_cpp_source.py")
TIER=${TIER:-native}
case "$TIER" in
    native) flags="-DGGML_NATIVE=ON" ;;
    avx2) flags="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
                 -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF
                 -DGGML_AVX_VNNI=OFF" ;;
    *) echo "build_llama_cpp.sh: TIER is native or avx2, not '$TIER'" >&2; exit 2 ;;
esac
out="$(dirname "$(dirname "$(dirname "$src")")")/llama.cpp-build-$TIER"
tools="llama-bench llama-server llama-completion"
have=1
for t in $tools; do
    [ -x "$out/bin/$t" ] || have=0
done
if [ "$have" = 1 ] && [ -f "$out/.done" ]; then
    echo "$out/bin"
    exit 0
fi
# shellcheck disable=SC2086  # flags is a list of words
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release $flags -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DGGML_OPENMP=ON >&2
cmake --build "$out" -j "$JOBS" --target $tools >&2
touch "$out/.done"
echo "$out/bin"
