# A fully static kiri for 64-bit ARM Linux, linked with musl (Debian's musl-dev:arm64, whose
# aarch64-linux-musl-gcc wraps the cross GCC with musl's headers, start files and libc.a):
#   scripts/build-deps.sh --arch arm64 --musl      # mbedTLS, CivetWeb, PCRE2, Jansson for musl
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=ports/linux-arm64/toolchain-musl.cmake
# `make arm64` does both. musl resolves host names itself (no NSS modules), so the static binary
# can reach a fleet server by name on any aarch64 Linux. What it cannot do is dlopen a GPU
# driver: a Vulkan or CUDA backend is reported as skipped, and the CPU (NEON) kernels run; the
# Jetson port (ports/jetson) links against the device's glibc for CUDA.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-musl-gcc)
set(KIRI_MUSL_ROOT /usr/lib/aarch64-linux-musl)
get_filename_component(_kiri_root "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
set(KIRI_MUSL_DEPS "${_kiri_root}/build/deps/install-arm64-musl")

# See toolchain.cmake: Debian 12's aarch64 GCC 12.2 crashes vectorizing an fmax reduction.
execute_process(COMMAND aarch64-linux-gnu-gcc -dumpfullversion OUTPUT_VARIABLE KIRI_CROSS_GCC_VERSION
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(KIRI_CROSS_GCC_VERSION VERSION_GREATER_EQUAL 12 AND KIRI_CROSS_GCC_VERSION VERSION_LESS 12.3)
  set(CMAKE_C_FLAGS_INIT "-fno-tree-loop-vectorize")
endif()
set(CMAKE_EXE_LINKER_FLAGS_INIT "-static")

# musl brings no Linux kernel headers (linux/futex.h and the like): take those, and only those,
# from the cross toolchain's kernel headers (linux-libc-dev-arm64-cross), through a folder of
# links so that no glibc header can be picked up by accident.
set(_kiri_kernel_headers "${_kiri_root}/build/deps/kernel-headers-arm64")
foreach(_d linux asm asm-generic)
  if(NOT EXISTS "${_kiri_kernel_headers}/${_d}")
    file(MAKE_DIRECTORY "${_kiri_kernel_headers}")
    file(CREATE_LINK "/usr/aarch64-linux-gnu/include/${_d}" "${_kiri_kernel_headers}/${_d}" SYMBOLIC)
  endif()
endforeach()
string(APPEND CMAKE_C_FLAGS_INIT " -idirafter ${_kiri_kernel_headers}")

# Libraries and headers only from musl and from the dependencies built for it: never the
# host's glibc-built ones.
set(CMAKE_FIND_ROOT_PATH "${KIRI_MUSL_DEPS}" "${KIRI_MUSL_ROOT}")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest runs the (static) test programs under user-mode QEMU; QEMU_CPU picks the core.
find_program(KIRI_QEMU_AARCH64 qemu-aarch64)
if(KIRI_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KIRI_QEMU_AARCH64})
endif()
