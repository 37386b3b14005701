# Tessera — the two commands of the README, and a few more for developers.
#   make demo    install what is missing, build, run the demo job on generated data
#   make test    install what is missing, build, run every test through CTest
#   make fuzz    build the parsers' fuzz targets with clang (build-fuzz) and run each for FUZZ_SECONDS (60)
SHELL := /bin/bash
BUILD ?= build
BUILD_ASAN ?= build-asan
BUILD_FUZZ ?= build-fuzz
FUZZ_SECONDS ?= 60
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo test-asan fuzz bench format lint clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

test: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The demo needs only the tessera binary (the tests are built by `make test`).
demo: configure
	@cmake --build $(BUILD) -j $(JOBS) --target tessera
	@scripts/demo.sh $(BUILD)/app/tessera

# The unit tests again under AddressSanitizer + UndefinedBehaviorSanitizer (CI runs this after `make test`).
test-asan: deps
	@cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTESSERA_SANITIZE=ON -DTESSERA_WERROR=ON -DTESSERA_SIMULATOR=OFF > /dev/null
	@cmake --build $(BUILD_ASAN) -j $(JOBS)
	@# Leak checking stays off: Open MPI, OpenSlide and glib keep allocations until exit by design.
	@cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure -j $(JOBS)

# libFuzzer targets of the parsers (fuzz/), built with clang in their own folder, each run with seed 1 for a fixed
# number of executions (about FUZZ_SECONDS each): the same run every time. Crashes go to
# $(BUILD_FUZZ)/fuzz-work/crashes/<target>/ and fail the run (scripts/fuzz.sh).
fuzz:
	@scripts/install-deps.sh --fuzz
	@cmake -S . -B $(BUILD_FUZZ) -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
		-DTESSERA_FUZZ=ON -DTESSERA_SIMULATOR=OFF > /dev/null
	@cmake --build $(BUILD_FUZZ) -j $(JOBS)
	@FUZZ_SECONDS=$(FUZZ_SECONDS) scripts/fuzz.sh $(BUILD_FUZZ)

# The benchmarks, with the Python tools they compare against (scripts/install-deps.sh --bench).
bench: build
	@scripts/install-deps.sh --bench
	@$(BUILD)/app/tessera bench peak
	@$(BUILD)/app/tessera bench tile
	@$(BUILD)/app/tessera bench infer-slide
	@$(BUILD)/app/tessera bench train --model compact --size 96 --batch 64
	@$(BUILD)/app/tessera bench infer --model compact --size 96 --batch 64
	@$(BUILD)/app/tessera bench train --model resnet18 --size 96 --batch 64
	@$(BUILD)/app/tessera bench infer --model resnet18 --size 96 --batch 64
	@$(BUILD)/app/tessera bench scale --out $(BUILD)/bench-scale

format:
	@git ls-files '*.cpp' '*.h' | xargs clang-format -i

lint: configure
	@git ls-files 'app/*.cpp' 'engine/*.cpp' 'io/*.cpp' 'preprocessing/*.cpp' | xargs clang-tidy -p $(BUILD) --quiet

clean:
	@rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
