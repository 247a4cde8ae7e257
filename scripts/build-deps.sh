#!/usr/bin/env bash
# Builds kiri's TLS stack, mbedTLS and CivetWeb, as static libraries from Debian trixie's source
# packages, into build/deps/install{,-arm64,-musl,-arm64-musl}/{include,lib}. The musl variants
# also get PCRE2 and Jansson (Debian's static libraries are built for glibc).
#
#   scripts/build-deps.sh [--arch arm64] [--musl] [--latest] [--force]
#
#   --arch arm64  cross-build with aarch64-linux-gnu-gcc into build/deps/install-arm64
#   --musl        build with musl-gcc (Debian's musl-tools) into build/deps/install-musl; with
#                 --arch arm64, with aarch64-linux-musl-gcc (Debian's musl-dev:arm64) into
#                 build/deps/install-arm64-musl
#   --latest      take the newest trixie versions instead of the pinned ones below (to bump them)
#   --force       rebuild even when the stamp says the install is up to date
#
# Debian 12 ships mbedTLS 2.28 (end of life) and CivetWeb 1.15 (no mbedTLS support, no fix for
# CVE-2025-55763), so the sources come from trixie through `apt-get source` with an apt
# configuration of our own under build/deps/apt: its own sources.list (deb-src lines for the
# mirror host this machine's apt already uses), state and cache. The system's apt state is never
# read or written. Trust comes from the archive signature: apt checks the Release file against
# debian-archive-keyring, and every file is checked against the SHA-256 the signed Sources index
# gives for it, by apt while downloading and again here (the same check also guards the cached
# copies in build/deps/dl, so a rerun needs no network). A missing .dsc is fine: the .orig and
# .debian tarballs are enough for a "3.0 (quilt)" source package.
#
# Each source tree is Debian's upstream tarball plus Debian's patch series, plus kiri's own
# patches from scripts/patches/civetweb-*.patch in name order, and mbedTLS gets the configuration
# Debian's rules file sets (threading on: CivetWeb shares one RNG between its worker threads).
# CivetWeb is built in its native mbedTLS mode (USE_MBEDTLS, the OpenSSL API off and OpenSSL
# never searched for), with IPv6, without CGI, Lua, Duktape or websockets, and without file
# serving (NO_FILES: no URL maps to a file, so neither static files nor SSI pages are served; the
# SSI code stays in, reachable only through the error_pages option, which kiri must not set.
# NO_FILESYSTEMS would drop it, but needs logging hooks of our own compiled into CivetWeb.)
# Native builds also produce CivetWeb without kiri's patches in build/deps/unpatched-civetweb,
# which tests/test_tls_handshake.py uses as the control that shows the handshake spin.
#
# Release builds with -O2 plus the stack protector and fortified string functions of Debian's
# hardening, no -fPIC (the compiler's default PIE code links into PIE programs all the same).
# A stamp file in the install folder records the versions, the compiler, the patches and this
# script; a rerun that matches it returns at once.
# Needs: cmake, gcc, python3, tar with xz and bzip2, patch (build-essential brings them), apt-get.
set -euo pipefail

MBEDTLS_VERSION="3.6.6-0.1~deb13u1"
CIVETWEB_VERSION="1.16+dfsg-2+deb13u1"
PCRE2_VERSION="10.46-1~deb13u3"
JANSSON_VERSION="2.14-2"
SUITE=trixie

ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEPS="$ROOT/build/deps"
JOBS=${KIRI_JOBS:-$(nproc)}

die() { echo "build-deps: $*" >&2; exit 1; }
log() { echo "build-deps: $*" >&2; }

arch=native musl=0 latest=0 force=0
while [ $# -gt 0 ]; do
  case $1 in
    --arch) [ $# -ge 2 ] || die "--arch needs a value"; arch=$2; shift 2 ;;
    --arch=*) arch=${1#--arch=}; shift ;;
    --musl) musl=1; shift ;;
    --latest) latest=1; shift ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1" ;;
  esac
done

# ---- Variant: compiler, CMake cross settings, install folder ----------------------------------

cmake_cross=()
case $arch in
  native|"$(uname -m)")
    arch=native; cc=${CC:-gcc}; prefix="$DEPS/install" ;;
  arm64|aarch64)
    arch=arm64; cc=aarch64-linux-gnu-gcc; prefix="$DEPS/install-arm64"
    cmake_cross=(-DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64
                 -DCMAKE_FIND_ROOT_PATH_MODE_PROGRAM=NEVER) ;;
  *) die "unsupported --arch $arch (supported: arm64)" ;;
esac
if [ "$musl" = 1 ]; then
  if [ "$arch" = native ]; then cc=musl-gcc; prefix="$DEPS/install-musl"
  else cc=aarch64-linux-musl-gcc; prefix="$DEPS/install-arm64-musl"; fi
fi
command -v "$cc" >/dev/null || die "compiler $cc not found (install-deps.sh installs it)"
for tool in cmake python3 xz bzip2 patch apt-get sha256sum flock; do
  command -v $tool >/dev/null || die "$tool not found"
done
variant=$arch; [ "$musl" = 1 ] && variant=$arch-musl

# One run at a time: builds of different variants share the download and source folders.
mkdir -p "$DEPS"
exec 9>"$DEPS/.lock"
flock 9

# ---- Private apt configuration -----------------------------------------------------------------

APT_DIR="$DEPS/apt"
apt_opts=()

# The Debian mirror this machine's apt uses, read from one-line and deb822 source lists; the
# security archive is taken from the same files, else from the same host. KIRI_DEBIAN_MIRROR and
# KIRI_DEBIAN_SECURITY_MIRROR override them. There is no built-in fallback: with neither, the
# script stops and says so.
system_mirrors() {
  local files=() f
  [ -f /etc/apt/sources.list ] && files+=(/etc/apt/sources.list)
  for f in /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || return 0
  awk '
    /^[ \t]*#/ { next }
    /^[ \t]*deb(-src)?[ \t]/ {           # one-line format: deb [options] URI suite components
      for (i = 2; i <= NF; i++) if ($i ~ /^[a-z+]+:\/\//) { print $i; break }
      next }
    /^URIs:/ { for (i = 2; i <= NF; i++) print $i }
  ' "${files[@]}"
}

setup_apt() {
  local mirror=${KIRI_DEBIAN_MIRROR:-} security=${KIRI_DEBIAN_SECURITY_MIRROR:-} uri
  while read -r uri; do
    uri=${uri%/}
    case $uri in
      */debian-security) [ -n "$security" ] || security=$uri ;;
      */debian) [ -n "$mirror" ] || mirror=$uri ;;
    esac
  done < <(system_mirrors)
  [ -n "$mirror" ] || die "no Debian mirror: none of /etc/apt/sources.list, /etc/apt/sources.list.d/*.list \
or *.sources names a URI ending in /debian. Set KIRI_DEBIAN_MIRROR to the mirror's URL (the folder \
that holds dists/ and pool/)."
  security=${security:-${mirror%/debian}/debian-security}
  APT_MIRROR=$mirror APT_SECURITY=$security
  local keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [ -f "$keyring" ] || die "$keyring not found (package debian-archive-keyring)"

  mkdir -p "$APT_DIR/etc/preferences.d" "$APT_DIR/state/lists/partial" \
           "$APT_DIR/cache/archives/partial"
  : > "$APT_DIR/state/status"
  cat > "$APT_DIR/etc/sources.list" <<EOF
deb-src [signed-by=$keyring] $mirror $SUITE main
deb-src [signed-by=$keyring] $security $SUITE-security main
EOF
  apt_opts=(
    -o "Dir::Etc::SourceList=$APT_DIR/etc/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::Etc::Preferences=/dev/null"
    -o "Dir::Etc::PreferencesParts=$APT_DIR/etc/preferences.d"
    -o "Dir::State=$APT_DIR/state"
    -o "Dir::State::status=$APT_DIR/state/status"
    -o "Dir::Cache=$APT_DIR/cache"
    -o "Acquire::Languages=none"
  )
  # As root, apt downloads as the _apt user, who cannot write into this tree; it would fall back
  # to root with a warning, so say so up front. Files are checked against the signed index anyway.
  [ "$(id -u)" -ne 0 ] || apt_opts+=(-o "APT::Sandbox::User=root")
  log "apt: deb-src $mirror $SUITE, $security $SUITE-security"
  apt-get "${apt_opts[@]}" -qq update >&2 || die "apt-get update failed for $mirror $SUITE"
}

# Prints "sha256 size name" for each file of source package $1 version $2, from the signed index.
index_sha256() {
  apt-cache "${apt_opts[@]}" showsrc --only-source "$1" | awk -v ver="$2" '
    /^$/ { inrec = 0; insha = 0; next }
    /^Version: / { inrec = ($2 == ver) }
    /^[^ ]/ { insha = inrec && /^Checksums-Sha256:/; next }
    insha && /^ / { print $1, $2, $3 }'
}

newest_version() {
  apt-cache "${apt_opts[@]}" showsrc --only-source "$1" | awk '/^Version: / { print $2 }' |
    sort -V | tail -n 1
}

# ---- Fetch and verify --------------------------------------------------------------------------

DL="$DEPS/dl"
apt_ready=0

# Fetches source package $1 version $2 into $DL and leaves $DL/$1_$2.sha256, the list of its
# files and their checksums from the signed index, with every file except the .dsc present and
# verified.
fetch_source() {
  local pkg=$1 ver=$2 sums="$DL/${1}_${2}.sha256"
  mkdir -p "$DL"
  if [ -s "$sums" ] && (cd "$DL" && grep -v '\.dsc$' "$sums" | sha256sum --check --status -); then
    return 0
  fi
  [ "$apt_ready" = 1 ] || { setup_apt; apt_ready=1; }
  index_sha256 "$pkg" "$ver" | awk '{ print $1 "  " $3 }' > "$sums.new"
  [ -s "$sums.new" ] || die "$pkg $ver is not in $SUITE's Sources index any more; newest is \
$(newest_version "$pkg"). Bump the version at the top of $0 (rerun with --latest to try it) \
and check scripts/patches still apply."
  log "fetching $pkg $ver"
  # apt-get fails as a whole when one file is missing on the mirror (some mirrors lack the
  # .dsc); what counts is that the tarballs arrive and match the signed index.
  (cd "$DL" && apt-get "${apt_opts[@]}" -qq --download-only source "$pkg=$ver" >&2) ||
    log "apt-get source $pkg=$ver reported errors; checking what arrived"
  # A mirror may list a security update in both indexes yet keep its files only in the security
  # pool: fetch what is missing from either pool (the checksums below decide what is kept).
  local f sub
  sub=$(case $pkg in lib*) echo "${pkg:0:4}" ;; *) echo "${pkg:0:1}" ;; esac)
  while read -r _ f; do
    case $f in *.dsc) continue ;; esac
    [ -s "$DL/$f" ] && continue
    for base in "$APT_SECURITY/pool/updates/main" "$APT_MIRROR/pool/main"; do
      curl -fsS -o "$DL/$f.part" "$base/$sub/$pkg/$f" 2>/dev/null && mv "$DL/$f.part" "$DL/$f" && break
      rm -f "$DL/$f.part"
    done
  done < "$sums.new"
  grep -q '\.orig\.tar\.' "$sums.new" && grep -qE '\.debian\.tar\.|\.diff\.gz$' "$sums.new" ||
    die "$pkg $ver has no .orig tarball with a .debian tarball or .diff.gz"
  (cd "$DL" && grep -v '\.dsc$' "$sums.new" | sha256sum --check --quiet -) ||
    die "$pkg $ver: downloaded files do not match the signed Sources index"
  mv "$sums.new" "$sums"
}

# ---- Unpack and patch --------------------------------------------------------------------------

# Unpacks source package $1 version $2 into folder $3 and applies Debian's patch series, then the
# kiri patches given after it, the way dpkg-source -x does for "3.0 (quilt)". A tree whose stamp
# matches is reused.
unpack_source() {
  local pkg=$1 ver=$2 dir=$3; shift 3
  local uver=${ver%-*} orig deb stamp p
  uver=${uver#*:}
  stamp="$pkg $ver $(cat "$@" /dev/null | sha256sum | cut -c1-16)"
  if [ -f "$dir/.kiri-src-stamp" ] && [ "$(cat "$dir/.kiri-src-stamp")" = "$stamp" ]; then
    return 0
  fi
  orig=$(ls "$DL/${pkg}_${uver}".orig.tar.* | head -n 1)
  ls "$DL/${pkg}_${uver}".orig-*.tar.* >/dev/null 2>&1 &&
    die "$pkg $ver has component tarballs; teach unpack_source about them"
  rm -rf "$dir" && mkdir -p "$dir"
  tar -xf "$orig" -C "$dir" --strip-components=1
  if [ -f "$DL/${pkg}_${ver}.diff.gz" ]; then
    # "1.0": one diff carries debian/ and any change to the upstream files.
    zcat "$DL/${pkg}_${ver}.diff.gz" | patch -d "$dir" -p1 --batch --forward --quiet ||
      die "$pkg $ver: the Debian diff does not apply"
  else
    deb=$(ls "$DL/${pkg}_${ver}".debian.tar.* | head -n 1)
    tar -xf "$deb" -C "$dir"
    [ "$(cat "$dir/debian/source/format" 2>/dev/null)" = "3.0 (quilt)" ] ||
      die "$pkg $ver: source format is not \"3.0 (quilt)\""
  fi
  if [ -f "$dir/debian/patches/series" ]; then
    local name opt
    while read -r name opt; do
      case $name in ''|'#'*) continue ;; esac
      patch -d "$dir" ${opt:--p1} --batch --forward --quiet < "$dir/debian/patches/$name" ||
        die "$pkg $ver: Debian patch $name does not apply"
    done < "$dir/debian/patches/series"
  fi
  for p in "$@"; do
    patch -d "$dir" -p1 --batch --forward --quiet < "$p" ||
      die "$pkg $ver: $(basename "$p") does not apply; refresh it for this version"
  done
  echo "$stamp" > "$dir/.kiri-src-stamp"
}

# ---- Build -------------------------------------------------------------------------------------

# Debian's hardening flags that matter here; mbedTLS's CMakeLists replaces the Release flags with
# its own -O2, so they go into CMAKE_C_FLAGS.
HARDENING="-fstack-protector-strong -D_FORTIFY_SOURCE=2"

failed() { # step, source dir, log
  tail -n 30 "$3" >&2
  die "$1 $(basename "$2") failed (log: $3)"
}

cmake_common() { # source dir, build dir, install prefix, extra C flags, extra CMake args...
  local src=$1 obj=$2 pfx=$3 cflags=$4; shift 4
  rm -rf "$obj"
  cmake -S "$src" -B "$obj" -G "Unix Makefiles" -Wno-dev \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER="$cc" \
    -DCMAKE_C_FLAGS="$HARDENING $cflags" \
    -DCMAKE_C_FLAGS_RELEASE="-O2" \
    -DCMAKE_POSITION_INDEPENDENT_CODE=OFF \
    -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_INSTALL_PREFIX="$pfx" \
    -DCMAKE_INSTALL_LIBDIR=lib \
    -DCMAKE_INSTALL_INCLUDEDIR=include \
    "${cmake_cross[@]}" "$@" > "$obj.configure.log" 2>&1 ||
    failed configuring "$src" "$obj.configure.log"
  cmake --build "$obj" -j "$JOBS" > "$obj.build.log" 2>&1 ||
    failed building "$src" "$obj.build.log"
  cmake --install "$obj" > /dev/null
}

# mbedTLS with the configuration Debian's rules file sets, threading above all.
configure_mbedtls() { # source dir
  local opt
  for opt in MBEDTLS_DEPRECATED_WARNING MBEDTLS_THREADING_C MBEDTLS_THREADING_PTHREAD \
             MBEDTLS_CMAC_C MBEDTLS_SSL_DTLS_SRTP; do
    python3 "$1/scripts/config.py" -f "$1/include/mbedtls/mbedtls_config.h" set $opt
  done
}

build_mbedtls() { # source dir, build dir, prefix
  cmake_common "$1" "$2" "$3" "" \
    -DENABLE_PROGRAMS=OFF -DENABLE_TESTING=OFF \
    -DUSE_STATIC_MBEDTLS_LIBRARY=ON -DUSE_SHARED_MBEDTLS_LIBRARY=OFF \
    -DMBEDTLS_FATAL_WARNINGS=OFF -DGEN_FILES=OFF
}

build_civetweb() { # source dir, build dir, prefix, mbedTLS prefix
  # CivetWeb's project() enables C++ although only its C++ wrapper, which is off, uses it. A
  # cross build need not have a C++ cross compiler, so CMake is told one exists (the C one,
  # never run) with the identity CivetWeb's CMakeLists tests.
  local cxx=()
  [ "$arch" = native ] || cxx=(-DCMAKE_CXX_COMPILER="$cc" -DCMAKE_CXX_COMPILER_FORCED=ON
                               -DCMAKE_CXX_COMPILER_ID=GNU
                               -DCMAKE_CXX_COMPILER_VERSION="$("$cc" -dumpfullversion)")
  cmake_common "$1" "$2" "$3" "-DUSE_MBEDTLS -I$4/include" "${cxx[@]}" \
    -DCIVETWEB_ENABLE_SSL=ON -DCIVETWEB_ENABLE_SSL_DYNAMIC_LOADING=OFF \
    -DCIVETWEB_SSL_OPENSSL_API_1_0=OFF -DCIVETWEB_SSL_OPENSSL_API_1_1=OFF \
    -DCIVETWEB_SSL_OPENSSL_API_3_0=OFF -DCMAKE_DISABLE_FIND_PACKAGE_OpenSSL=ON \
    -DCIVETWEB_SERVE_NO_FILES=ON -DCIVETWEB_SERVE_NO_FILESYSTEMS=OFF \
    -DCIVETWEB_DISABLE_CGI=ON -DCIVETWEB_ENABLE_LUA=OFF -DCIVETWEB_ENABLE_DUKTAPE=OFF \
    -DCIVETWEB_ENABLE_WEBSOCKETS=OFF -DCIVETWEB_ENABLE_IPV6=ON -DCIVETWEB_ENABLE_ZLIB=OFF \
    -DCIVETWEB_ENABLE_CXX=OFF -DCIVETWEB_ENABLE_SERVER_EXECUTABLE=OFF \
    -DCIVETWEB_INSTALL_EXECUTABLE=OFF -DCIVETWEB_BUILD_TESTING=OFF \
    -DCIVETWEB_ENABLE_ASAN=OFF -DCIVETWEB_ENABLE_MEMORY_DEBUGGING=OFF
  # The flags the library was built with; a program that includes civetweb.h needs none of
  # them, but this says what the .a contains.
  echo "USE_MBEDTLS NO_FILES NO_CGI USE_IPV6 (no Lua, Duktape, websockets)" \
    > "$3/lib/civetweb.features"
}

# PCRE2 (8-bit, with JIT) and Jansson for the musl variants, static, without programs or tests.
build_pcre2() { # source dir, build dir, prefix
  cmake_common "$1" "$2" "$3" "" \
    -DPCRE2_BUILD_PCRE2_8=ON -DPCRE2_BUILD_PCRE2_16=OFF -DPCRE2_BUILD_PCRE2_32=OFF \
    -DPCRE2_SUPPORT_JIT=ON -DPCRE2_SUPPORT_UNICODE=ON -DPCRE2_BUILD_PCRE2GREP=OFF \
    -DPCRE2_BUILD_TESTS=OFF -DPCRE2_SUPPORT_LIBBZ2=OFF -DPCRE2_SUPPORT_LIBZ=OFF \
    -DPCRE2_SUPPORT_LIBEDIT=OFF -DPCRE2_SUPPORT_LIBREADLINE=OFF
}

build_jansson() { # source dir, build dir, prefix
  cmake_common "$1" "$2" "$3" "" \
    -DJANSSON_BUILD_SHARED_LIBS=OFF -DJANSSON_BUILD_DOCS=OFF -DJANSSON_EXAMPLES=OFF \
    -DJANSSON_WITHOUT_TESTS=ON -DJANSSON_COVERAGE=OFF
}

# ---- Main --------------------------------------------------------------------------------------

if [ "$latest" = 1 ]; then
  setup_apt; apt_ready=1
  MBEDTLS_VERSION=$(newest_version mbedtls)
  CIVETWEB_VERSION=$(newest_version civetweb)
  PCRE2_VERSION=$(newest_version pcre2)
  JANSSON_VERSION=$(newest_version jansson)
  [ -n "$MBEDTLS_VERSION" ] && [ -n "$CIVETWEB_VERSION" ] && [ -n "$PCRE2_VERSION" ] &&
    [ -n "$JANSSON_VERSION" ] || die "no versions in the index"
fi

kiri_patches=()
for p in "$ROOT"/scripts/patches/civetweb-*.patch; do [ -f "$p" ] && kiri_patches+=("$p"); done

stamp_file="$prefix/kiri-deps.stamp"
stamp="variant $variant ($cc)
mbedtls $MBEDTLS_VERSION
civetweb $CIVETWEB_VERSION
$([ "$musl" = 1 ] && echo "pcre2 $PCRE2_VERSION, jansson $JANSSON_VERSION" || true)
kiri-patches $(for p in "${kiri_patches[@]}"; do basename "$p"; done | tr '\n' ' ')
inputs $(cat "$0" "${kiri_patches[@]}" | sha256sum | cut -c1-16)"

report() {
  echo "build-deps ($variant): mbedTLS $MBEDTLS_VERSION, CivetWeb $CIVETWEB_VERSION" \
       "+ ${#kiri_patches[@]} kiri patch(es)$([ "$musl" = 1 ] && echo ", PCRE2 $PCRE2_VERSION, Jansson $JANSSON_VERSION" || true)," \
       "in ${prefix#"$ROOT"/}"
  local a
  for a in "$prefix"/lib/lib*.a; do
    printf '  %-18s %8d bytes\n' "$(basename "$a")" "$(stat -c %s "$a")"
  done
}

if [ "$force" = 0 ] && [ -f "$stamp_file" ] && [ "$(cat "$stamp_file")" = "$stamp" ]; then
  report; exit 0
fi

fetch_source mbedtls "$MBEDTLS_VERSION"
fetch_source civetweb "$CIVETWEB_VERSION"
if [ "$musl" = 1 ]; then
  fetch_source pcre2 "$PCRE2_VERSION"
  fetch_source jansson "$JANSSON_VERSION"
fi

mb_src="$DEPS/src/mbedtls-$MBEDTLS_VERSION"
cw_src="$DEPS/src/civetweb-$CIVETWEB_VERSION"
unpack_source mbedtls "$MBEDTLS_VERSION" "$mb_src"
configure_mbedtls "$mb_src"
unpack_source civetweb "$CIVETWEB_VERSION" "$cw_src" "${kiri_patches[@]}"

obj="$DEPS/obj/$variant"
rm -rf "$prefix" && mkdir -p "$obj"
log "building mbedTLS $MBEDTLS_VERSION ($variant, $cc)"
build_mbedtls "$mb_src" "$obj/mbedtls" "$prefix"
log "building CivetWeb $CIVETWEB_VERSION ($variant, $cc)"
build_civetweb "$cw_src" "$obj/civetweb" "$prefix" "$prefix"
if [ "$musl" = 1 ]; then
  pc_src="$DEPS/src/pcre2-$PCRE2_VERSION"
  ja_src="$DEPS/src/jansson-$JANSSON_VERSION"
  unpack_source pcre2 "$PCRE2_VERSION" "$pc_src"
  unpack_source jansson "$JANSSON_VERSION" "$ja_src"
  log "building PCRE2 $PCRE2_VERSION ($variant, $cc)"
  build_pcre2 "$pc_src" "$obj/pcre2" "$prefix"
  log "building Jansson $JANSSON_VERSION ($variant, $cc)"
  build_jansson "$ja_src" "$obj/jansson" "$prefix"
fi

if [ "$variant" = native ]; then
  # The control for tests/test_tls_handshake.py: Debian's CivetWeb without kiri's patches.
  cw_plain="$DEPS/src/civetweb-$CIVETWEB_VERSION-unpatched"
  unpack_source civetweb "$CIVETWEB_VERSION" "$cw_plain"
  rm -rf "$DEPS/unpatched-civetweb"
  log "building CivetWeb $CIVETWEB_VERSION without kiri patches (test control)"
  build_civetweb "$cw_plain" "$obj/civetweb-unpatched" "$DEPS/unpatched-civetweb" "$prefix"
fi

echo "$stamp" > "$stamp_file"
report
