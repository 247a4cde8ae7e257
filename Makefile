# Thin wrapper over CMake. `make` builds build/kiri; `make demo` generates a story with the bundled
# model; `make test` installs what is missing, builds, and runs every test tier this machine runs.
BUILD ?= build
JOBS ?= $(shell nproc)
MODEL ?= models/stories260K.gguf

.PHONY: all deps demo test test-c test-asan test-py fuzz clean

all: $(BUILD)/kiri

$(BUILD)/Makefile: CMakeLists.txt
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release >/dev/null

$(BUILD)/kiri: $(BUILD)/Makefile FORCE
	cmake --build $(BUILD) -j $(JOBS)

FORCE:

deps:
	scripts/install-deps.sh

demo: deps $(BUILD)/kiri
	$(BUILD)/kiri run -m $(MODEL) -p "Once upon a time" -n 200 --temp 0

test:
	scripts/install-deps.sh --arm64
	scripts/test.sh

fuzz: deps
	scripts/fuzz.sh

# Cross-build for 64-bit ARM Linux (ports/linux-arm64/README.md): `make arm64` gives
# build-arm64/kiri, one fully static aarch64 binary (musl; runtime, server, TLS);
# `make test-arm64` also runs every test under qemu-aarch64 (QEMU_CPU picks the emulated core for
# the unit tests: max has NEON, dotprod and i8mm).
ARM64_BUILD ?= build-arm64
QEMU_CPU ?= max
.PHONY: arm64 test-arm64

arm64:
	scripts/install-deps.sh --arm64
	scripts/build-deps.sh --arch arm64 --musl
	cmake -S . -B $(ARM64_BUILD) -DCMAKE_TOOLCHAIN_FILE=ports/linux-arm64/toolchain-musl.cmake \
	      -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(ARM64_BUILD) -j $(JOBS)

test-arm64:
	scripts/install-deps.sh --arm64
	BUILD=$(ARM64_BUILD) QEMU_CPU=$(QEMU_CPU) scripts/test-arm64.sh

clean:
	rm -rf build build-asan build-fuzz
