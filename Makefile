# Thin wrapper over CMake.
#   make            builds build/kiri whole, server and TLS included: when the TLS libraries are
#                   missing it first runs scripts/install-deps.sh and scripts/build-deps.sh, and
#                   configures again once they are there (SERVER=0 builds without the server)
#   make demo       the same, then generates a story with the bundled model and prints how to
#                   serve that model
#   make check      the C unit tests only, under a minute (no Vulkan or CUDA tests)
#   make test       installs what is missing, builds, and runs every tier scripts/test.sh has;
#                   test-c, test-asan, test-tsan, test-py and fuzz run one tier each
BUILD ?= build
JOBS ?= $(shell nproc)
MODEL ?= models/stories260K.gguf
PORT ?= 8080
SERVER ?= 1
DEPS_DIR := build/deps/install
DEPS_LIB := $(DEPS_DIR)/lib/libcivetweb.a
# The configure step reruns when these change; with the server, also when the TLS libraries
# appear or are rebuilt (cmake/deps.cmake decides at configure time whether the server is built).
CONFIGURE_INPUTS := CMakeLists.txt $(wildcard cmake/*.cmake) $(if $(filter 1,$(SERVER)),$(DEPS_LIB))
# Slower than a unit test: test_vulkan (about 145 s) and the CUDA programs (a GPU's job).
CHECK_EXCLUDE := test_vulkan|cuda_

.PHONY: all deps demo check test test-c test-asan test-tsan test-py fuzz clean FORCE

all: $(BUILD)/kiri

# Missing TLS libraries: the Debian packages first, then mbedTLS and CivetWeb from Debian sources.
$(DEPS_LIB):
	scripts/install-deps.sh
	scripts/build-deps.sh || { echo "make: the TLS libraries did not build; make SERVER=0 builds kiri" \
	  "without the server"; exit 1; }

deps:
	scripts/install-deps.sh
	scripts/build-deps.sh

# One stamp per SERVER setting, so that switching it configures again.
CONFIGURE_STAMP := $(BUILD)/configure-server$(SERVER).stamp
$(CONFIGURE_STAMP): $(CONFIGURE_INPUTS)
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DKIRI_SERVER=$(if $(filter 1,$(SERVER)),ON,OFF) >/dev/null
	rm -f $(BUILD)/configure-server*.stamp
	touch $@

$(BUILD)/kiri: $(CONFIGURE_STAMP) FORCE
	cmake --build $(BUILD) -j $(JOBS)

FORCE:

demo: all
	$(BUILD)/kiri run -m $(MODEL) -p "Once upon a time" -n 200 --temp 0
	@echo
	@if $(BUILD)/kiri serve --help >/dev/null 2>&1; then \
	  echo "Serve the same model over an OpenAI-compatible API (Ctrl-C stops it):"; \
	  echo "  $(BUILD)/kiri serve -m $(MODEL) --port $(PORT)"; \
	  echo "and from another shell:"; \
	  echo "  curl -s http://127.0.0.1:$(PORT)/v1/completions -H 'Content-Type: application/json' \\"; \
	  echo "       -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 50}'"; \
	else \
	  echo "This kiri has no server: it was built without the TLS libraries (scripts/build-deps.sh, then make)."; \
	fi

check: all
	ctest --test-dir $(BUILD) -j $(JOBS) -E '$(CHECK_EXCLUDE)' --output-on-failure

test:
	scripts/install-deps.sh --arm64
	scripts/test.sh

test-c:
	scripts/test.sh unit

test-asan:
	scripts/test.sh asan

test-tsan:
	scripts/test.sh tsan

test-py:
	scripts/test.sh reference

fuzz:
	scripts/install-deps.sh
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

# Keeps build/deps: the TLS libraries take minutes and a download to rebuild.
clean:
	find build -mindepth 1 -maxdepth 1 ! -name deps -exec rm -rf {} + 2>/dev/null || true
	rm -rf build-asan build-tsan build-fuzz build-notls
