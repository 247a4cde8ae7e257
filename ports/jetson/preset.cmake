# Native build on a Jetson (JetPack 6, CUDA 12 in /usr/local/cuda), as a CMake initial cache:
#   sudo apt-get install cmake gcc g++ libpcre2-dev libjansson-dev
#   scripts/build-deps.sh          # mbedTLS and CivetWeb for the HTTPS server
#   cmake -S . -B build -C ports/jetson/preset.cmake && cmake --build build -j"$(nproc)" --target kiri-cli
# Orin (Nano, NX, AGX) is sm_87. For Thor (JetPack 7, CUDA 13) pass -DKIRI_CUDA_ARCHS=110
# -DKIRI_CUDA_PTX=110 after the -C option.
set(CMAKE_BUILD_TYPE Release CACHE STRING "Build type")
set(KIRI_CUDA ON CACHE BOOL "Build the CUDA backend")
set(KIRI_CUDA_ARCHS "87" CACHE STRING "CUDA architectures compiled to machine code (sm_XX)")
set(KIRI_CUDA_PTX "87" CACHE STRING "CUDA architecture embedded as PTX (empty: none)")
# A Jetson has no Vulkan driver worth using beside CUDA; leave the backend out of the binary.
set(KIRI_VULKAN OFF CACHE BOOL "Build the Vulkan backend")
