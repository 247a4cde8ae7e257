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

test: deps
	scripts/test.sh

fuzz: deps
	scripts/fuzz.sh

# Cross-build for 64-bit ARM Linux (ports/linux-arm64/README.md) and its tests under qemu-aarch64;
# QEMU_CPU picks the emulated core (max: NEON, dotprod, i8mm; cortex-a72: NEON without dotprod).
ARM64_BUILD ?= build-arm64
QEMU_CPU ?= max
.PHONY: arm64 test-arm64

arm64:
	scripts/install-deps.sh --arm64
	cmake -S . -B $(ARM64_BUILD) -DCMAKE_TOOLCHAIN_FILE=ports/linux-arm64/toolchain.cmake \
	      -DCMAKE_BUILD_TYPE=Release >/dev/null
	cmake --build $(ARM64_BUILD) -j $(JOBS)

test-arm64: arm64
	QEMU_CPU=$(QEMU_CPU) ctest --test-dir $(ARM64_BUILD) --output-on-failure

clean:
	rm -rf build build-asan build-fuzz
