# kiri's TLS stack: mbedTLS and CivetWeb, static libraries that scripts/build-deps.sh builds from
# Debian trixie's sources. Included from CMakeLists.txt. Defines the imported targets
#   kiri::mbedtls    mbedTLS's SSL library, bringing kiri::mbedx509 and kiri::mbedcrypto
#   kiri::civetweb   CivetWeb in mbedTLS mode (no file serving, CGI or Lua), bringing kiri::mbedtls
# and leaves KIRI_SERVER ON only when they are there: without them the server is skipped with one
# line saying how to get them, and the rest of kiri builds as before.
#
# KIRI_DEPS_DIR names the install folder; by default the one build-deps.sh fills for this
# toolchain: build/deps/install-arm64-musl when cross-compiling for aarch64 with musl,
# build/deps/install-arm64 with glibc, build/deps/install-musl when the C compiler is musl-gcc,
# build/deps/install otherwise.

option(KIRI_SERVER "Build the HTTPS server (needs the TLS libraries from scripts/build-deps.sh)" ON)

if(CMAKE_CROSSCOMPILING AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$"
   AND CMAKE_C_COMPILER MATCHES "musl")
  set(_kiri_deps_default "${CMAKE_SOURCE_DIR}/build/deps/install-arm64-musl")
  set(_kiri_deps_flag " --arch arm64 --musl")
elseif(CMAKE_CROSSCOMPILING AND CMAKE_SYSTEM_PROCESSOR MATCHES "^(aarch64|arm64|ARM64)$")
  set(_kiri_deps_default "${CMAKE_SOURCE_DIR}/build/deps/install-arm64")
  set(_kiri_deps_flag " --arch arm64")
elseif(CMAKE_C_COMPILER MATCHES "musl")
  set(_kiri_deps_default "${CMAKE_SOURCE_DIR}/build/deps/install-musl")
  set(_kiri_deps_flag " --musl")
else()
  set(_kiri_deps_default "${CMAKE_SOURCE_DIR}/build/deps/install")
  set(_kiri_deps_flag "")
endif()
set(KIRI_DEPS_DIR "${_kiri_deps_default}" CACHE PATH
    "Where scripts/build-deps.sh installed mbedTLS and CivetWeb")

set(_kiri_deps_missing "")
foreach(_f include/civetweb.h include/mbedtls/ssl.h lib/libcivetweb.a lib/libmbedtls.a
           lib/libmbedx509.a lib/libmbedcrypto.a)
  if(NOT EXISTS "${KIRI_DEPS_DIR}/${_f}")
    list(APPEND _kiri_deps_missing "${_f}")
  endif()
endforeach()

if(NOT KIRI_SERVER)
  message(STATUS "kiri: HTTPS server off (KIRI_SERVER=OFF)")
elseif(_kiri_deps_missing)
  # A normal variable shadows the cached option, so the server comes back by itself on the
  # next configure once the libraries are built.
  set(KIRI_SERVER OFF)
  message(STATUS "kiri: HTTPS server skipped: no TLS libraries in ${KIRI_DEPS_DIR} "
                 "(run scripts/build-deps.sh${_kiri_deps_flag}, or set KIRI_DEPS_DIR)")
else()
  find_package(Threads REQUIRED)
  foreach(_lib mbedcrypto mbedx509 mbedtls civetweb)
    if(NOT TARGET kiri::${_lib})
      add_library(kiri::${_lib} STATIC IMPORTED GLOBAL)
      set_target_properties(kiri::${_lib} PROPERTIES
        IMPORTED_LOCATION "${KIRI_DEPS_DIR}/lib/lib${_lib}.a"
        INTERFACE_INCLUDE_DIRECTORIES "${KIRI_DEPS_DIR}/include")
    endif()
  endforeach()
  # mbedTLS is built with MBEDTLS_THREADING_PTHREAD; CivetWeb runs worker threads.
  set_target_properties(kiri::mbedcrypto PROPERTIES INTERFACE_LINK_LIBRARIES Threads::Threads)
  set_target_properties(kiri::mbedx509 PROPERTIES INTERFACE_LINK_LIBRARIES kiri::mbedcrypto)
  set_target_properties(kiri::mbedtls PROPERTIES INTERFACE_LINK_LIBRARIES kiri::mbedx509)
  set_target_properties(kiri::civetweb PROPERTIES
    INTERFACE_LINK_LIBRARIES "kiri::mbedtls;Threads::Threads")

  set(_kiri_deps_stamp "${KIRI_DEPS_DIR}/kiri-deps.stamp")
  set(_kiri_deps_versions "")
  if(EXISTS "${_kiri_deps_stamp}")
    # Rebuilt libraries reconfigure the project, so the message below stays true.
    set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${_kiri_deps_stamp}")
    file(STRINGS "${_kiri_deps_stamp}" _kiri_deps_lines REGEX "^(mbedtls|civetweb) ")
    string(REPLACE ";" ", " _kiri_deps_versions "${_kiri_deps_lines}")
    set(_kiri_deps_versions " (${_kiri_deps_versions})")
  endif()
  message(STATUS "kiri: HTTPS server on, TLS from ${KIRI_DEPS_DIR}${_kiri_deps_versions}")
endif()
