# Cross-compiling kiri with the CUDA backend for NVIDIA Jetson (JetPack 6: Ubuntu 22.04 aarch64,
# CUDA 12, Orin = sm_87) from an x86-64 machine:
#   cmake -S . -B build-jetson -DCMAKE_TOOLCHAIN_FILE=ports/jetson/toolchain.cmake -DCMAKE_BUILD_TYPE=Release
#   cmake --build build-jetson --target kiri-cli
# Needs, beside what ports/linux-arm64/toolchain.cmake needs (gcc-aarch64-linux-gnu and the
# target's libpcre2-dev:arm64, libjansson-dev:arm64):
# - g++-aarch64-linux-gnu: nvcc compiles the host side of the kernels with it;
# - the CUDA toolkit's aarch64 target files in <cuda>/targets/aarch64-linux (NVIDIA's
#   cuda-cross-aarch64 package, same CUDA major version as the JetPack on the board).
# Without them the CUDA backend is skipped with one line and the build is CPU-only.
# The binary links glibc dynamically: build against a glibc no newer than the board's (JetPack 6
# has 2.35, Ubuntu 22.04), for example inside an Ubuntu 22.04 container; or build natively on
# the Jetson with ports/jetson/preset.cmake, which is the simpler path (README.md).
include(${CMAKE_CURRENT_LIST_DIR}/../linux-arm64/toolchain.cmake)

set(KIRI_CUDA_TARGET_DIR aarch64-linux CACHE STRING "CUDA targets/ subfolder for cross builds")
# Orin is sm_87; the PTX lets newer Jetsons run it too. Thor (JetPack 7, CUDA 13) is sm_110 and
# uses the sbsa-linux target folder: -DKIRI_CUDA_ARCHS=110 -DKIRI_CUDA_PTX=110 -DKIRI_CUDA_TARGET_DIR=sbsa-linux.
set(KIRI_CUDA_ARCHS "87" CACHE STRING "CUDA architectures compiled to machine code (sm_XX)")
set(KIRI_CUDA_PTX "87" CACHE STRING "CUDA architecture embedded as PTX (empty: none)")
