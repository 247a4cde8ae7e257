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

clean:
	rm -rf build build-asan build-fuzz
