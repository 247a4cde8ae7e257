# Cross-compiling kiri for 64-bit ARM Linux (aarch64) with Debian's cross toolchain:
#   cmake -S . -B build-arm64 -DCMAKE_TOOLCHAIN_FILE=ports/linux-arm64/toolchain.cmake
# Needs gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (the compiler and its C library, under
# /usr/aarch64-linux-gnu), libpcre2-dev:arm64 and libjansson-dev:arm64 (the target's static
# libraries, installed by Debian's multiarch under /usr/lib/aarch64-linux-gnu) and qemu-user to
# run the tests:
#   scripts/install-deps.sh --arm64
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(KIRI_CROSS_TRIPLE aarch64-linux-gnu)
set(CMAKE_C_COMPILER ${KIRI_CROSS_TRIPLE}-gcc)
set(CMAKE_LIBRARY_ARCHITECTURE ${KIRI_CROSS_TRIPLE})

# Debian 12's aarch64 GCC 12.2 crashes (internal compiler error in vect_transform_reduction) when
# it vectorizes a loop reducing doubles with fmax, as tests/test_model.c does; GCC 12 vectorizes
# at -O2. Loop vectorization is off for that compiler: the hot kernels are NEON intrinsics and
# do not depend on it. Later compilers keep it.
execute_process(COMMAND ${CMAKE_C_COMPILER} -dumpfullversion OUTPUT_VARIABLE KIRI_CROSS_GCC_VERSION
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(KIRI_CROSS_GCC_VERSION VERSION_GREATER_EQUAL 12 AND KIRI_CROSS_GCC_VERSION VERSION_LESS 12.3)
  set(CMAKE_C_FLAGS_INIT "-fno-tree-loop-vectorize")
endif()

# Libraries come only from the target's trees: the cross C library and the multiarch folder
# (a path already inside a root is searched as is). Headers may also come from the host's
# /usr/include, where multiarch packages put their architecture-independent headers (pcre2.h).
set(CMAKE_FIND_ROOT_PATH /usr/${KIRI_CROSS_TRIPLE} /usr/lib/${KIRI_CROSS_TRIPLE})
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE ONLY)

# ctest runs the test programs under user-mode QEMU. Its default CPU for aarch64 is "max"
# (NEON, dotprod, i8mm, FP16); set QEMU_CPU in the environment to emulate another core, for
# example QEMU_CPU=cortex-a72 for one without dotprod.
# The dynamic loader and the C library must come from the same glibc build. -L makes the loader
# the cross toolchain's, but once libc6:arm64 is installed (libpcre2-dev:arm64 pulls it in) that
# loader would find the multiarch libc.so.6 in /lib/aarch64-linux-gnu first: a different build,
# and thread creation then hangs in glibc's stack cache. LD_LIBRARY_PATH points the loader at its
# own libc, the one the programs were linked against.
find_program(KIRI_QEMU_AARCH64 qemu-aarch64)
if(KIRI_QEMU_AARCH64)
  set(CMAKE_CROSSCOMPILING_EMULATOR ${KIRI_QEMU_AARCH64} -L /usr/${KIRI_CROSS_TRIPLE}
      -E LD_LIBRARY_PATH=/usr/${KIRI_CROSS_TRIPLE}/lib)
endif()
