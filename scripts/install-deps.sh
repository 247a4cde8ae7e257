#!/usr/bin/env bash
# Installs the Debian packages kiri's build and tests need, and the Python test venv.
# Idempotent: a package or venv already in place is left alone. Runs as root or via sudo.
set -euo pipefail

PKGS=(
  build-essential cmake pkg-config clang llvm libclang-rt-14-dev
  libpcre2-dev libjansson-dev
  python3 python3-venv
)

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
