#!/usr/bin/env bash
# Installs the Debian packages kiri's build and tests need, and the Python test venv.
# Idempotent: a package or venv already in place is left alone. Runs as root or via sudo.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config clang llvm libclang-rt-14-dev
  libpcre2-dev libjansson-dev
  python3 python3-venv
  openssl debian-archive-keyring musl-tools curl chromium ca-certificates nginx docker-registry
  glslc libvulkan-dev mesa-vulkan-drivers
)
# Cross-building for 64-bit ARM (make arm64, ports/linux-arm64; `make test` runs the aarch64
# tests too), installed with --arm64 or KIRI_ARM64=1: the cross compiler and its C library,
# musl for aarch64 (the static binary: aarch64-linux-musl-gcc), user-mode QEMU to run the tests,
# and, for a glibc build (ports/linux-arm64/toolchain.cmake, ports/jetson), the target's static
# PCRE2 and Jansson from Debian multiarch, for which dpkg must know the arm64 architecture first.
ARM_PKGS=(
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user file musl-dev:arm64
  libpcre2-dev:arm64 libjansson-dev:arm64
)
if [ "${1:-}" = "--arm64" ] || [ "${KIRI_ARM64:-0}" = "1" ]; then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    echo "install-deps: adding the arm64 architecture to dpkg"
    if [ "$(id -u)" -eq 0 ]; then dpkg --add-architecture arm64; else sudo dpkg --add-architecture arm64; fi
  fi
  PKGS+=("${ARM_PKGS[@]}")
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

if [ "${1:-}" = "--venv" ]; then
  exec "$(dirname "$0")/make-venv.sh"
fi
