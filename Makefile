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

REPEAT ?= 10
EXTENDED_FUZZ_SECONDS ?= 600
ASAN_EXTENDED := $(shell grep -v -e '^\#' -e '^[[:space:]]*$$' tests/asan-extended.txt 2>/dev/null | paste -sd'|')

.PHONY: all deps configure build test test-network test-browser test-slurm test-torch test-extended test-load test-repeat demo test-asan test-asan-all asan-build ci-extended fuzz \
	bench format lint clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# Random order: a test that needs another to run first, or leaves something behind for the next, fails here.
# The `browser` label (tessera view in headless Chromium; skipped without it: scripts/install-deps.sh --browser), the
# `network` label (test hosts in network namespaces, one at a time) and then the `slurm` label (a Slurm cluster on the
# same test hosts, one test at a time) run after the rest, each timed against its budget.
NETWORK_BUDGET ?= 300
BROWSER_BUDGET ?= 120
SLURM_BUDGET ?= 420
test: build
	@t0=$$(date +%s); status=0; \
	  (cd $(BUILD) && ctest --output-on-failure --schedule-random -j $(JOBS) -LE 'network|browser|slurm|torch|extended') || status=$$?; \
	  echo "every test but the labels below: $$(( $$(date +%s) - t0 )) s"; exit $$status
	@$(MAKE) --no-print-directory test-browser
	@$(MAKE) --no-print-directory test-network
	@$(MAKE) --no-print-directory test-slurm

test-browser: build
	@t0=$$(date +%s); status=0; ctest --test-dir $(BUILD) --output-on-failure -L browser || status=$$?; \
	  echo "label browser: $$(( $$(date +%s) - t0 )) s (budget $(BROWSER_BUDGET) s; screenshots in $(BUILD)/tests/browser-artifacts)"; \
	  exit $$status

test-network: build
	@t0=$$(date +%s); status=0; ctest --test-dir $(BUILD) --output-on-failure -L network || status=$$?; \
	  echo "label network: $$(( $$(date +%s) - t0 )) s (budget $(NETWORK_BUDGET) s)"; exit $$status

# Every architecture of the model registry against PyTorch (scripts/torch_checkpoint.py; installs Debian's
# python3-torch, python3-h5py and python3-torchvision with the benchmarks' packages). Minutes; not in `make test`.
test-torch: build
	@scripts/install-deps.sh --bench
	@ctest --test-dir $(BUILD) --output-on-failure --no-tests=error -L torch

# The benchmark verbs' whole-report runs (label `extended`, tests/app/CMakeLists.txt): minutes; not in `make test`.
test-extended: build
	@scripts/install-deps.sh --bench
	@ctest --test-dir $(BUILD) --output-on-failure --no-tests=error -L extended

test-slurm: build
	@t0=$$(date +%s); status=0; ctest --test-dir $(BUILD) --output-on-failure -L slurm || status=$$?; \
	  echo "label slurm: $$(( $$(date +%s) - t0 )) s (budget $(SLURM_BUDGET) s)"; exit $$status

# The unit tests again while stress-ng keeps every core busy: a test that depends on timing fails here.
test-load: build
	@scripts/under-load.sh ctest --test-dir $(BUILD) -L unit --output-on-failure --schedule-random -j $(JOBS)

# The whole suite REPEAT times on one build, then REPEAT times under load; stops at the first failing run.
test-repeat: build
	@for i in $$(seq $(REPEAT)); do echo "== run $$i of $(REPEAT)"; \
	  (cd $(BUILD) && ctest --output-on-failure --schedule-random -j $(JOBS) -LE torch > $(abspath $(BUILD))/repeat-$$i.log 2>&1) \
	    || { tail -40 $(BUILD)/repeat-$$i.log; echo "run $$i failed: $(BUILD)/repeat-$$i.log"; exit 1; }; \
	  tail -3 $(BUILD)/repeat-$$i.log; done
	@for i in $$(seq $(REPEAT)); do echo "== run $$i of $(REPEAT) under load"; \
	  scripts/under-load.sh ctest --test-dir $(BUILD) --output-on-failure --schedule-random -j $(JOBS) -LE torch \
	    > $(BUILD)/repeat-load-$$i.log 2>&1 \
	    || { tail -40 $(BUILD)/repeat-load-$$i.log; echo "run $$i under load failed: $(BUILD)/repeat-load-$$i.log"; exit 1; }; \
	  tail -3 $(BUILD)/repeat-load-$$i.log; done

# The demo needs only the tessera binary (the tests are built by `make test`).
demo: configure
	@cmake --build $(BUILD) -j $(JOBS) --target tessera
	@scripts/demo.sh $(BUILD)/app/tessera

# The tests under AddressSanitizer + UndefinedBehaviorSanitizer with -Werror (CI runs this after `make test`),
# except the slowest sanitizer cases listed in tests/asan-extended.txt, the `network` and `slurm` labels (the same
# code as the mpi and app labels, across test hosts) and the `browser` label (the viewer's server is tested in-process
# by the `unit` label), which `make test-asan-all` adds, and the `torch` label (PyTorch's side).
test-asan: asan-build
	@# Leak checking stays off: Open MPI, OpenSlide and glib keep allocations until exit by design.
	@cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure --no-tests=error --schedule-random -j $(JOBS) \
	  -LE 'network|slurm|browser|torch|extended' $(if $(ASAN_EXTENDED),-E '$(ASAN_EXTENDED)')

test-asan-all: asan-build
	@cd $(BUILD_ASAN) && ASAN_OPTIONS=detect_leaks=0 ctest --output-on-failure --no-tests=error --schedule-random -j $(JOBS)

asan-build: deps
	@# -g1: line tables only, enough for the sanitizers' stack traces and much quicker to compile than -g.
	@cmake -S . -B $(BUILD_ASAN) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
	  -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DTESSERA_SANITIZE=ON -DTESSERA_WERROR=ON -DTESSERA_SIMULATOR=OFF > /dev/null
	@cmake --build $(BUILD_ASAN) -j $(JOBS)

# What CI leaves out for time, run before resolving an issue: the suite REPEAT times (also under load), every
# sanitizer case, and each fuzz target for EXTENDED_FUZZ_SECONDS (default 600).
ci-extended: test-repeat test-asan-all test-torch test-extended
	@$(MAKE) --no-print-directory fuzz FUZZ_SECONDS=$(EXTENDED_FUZZ_SECONDS)

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
	@$(BUILD)/app/tessera bench train --model compact --size 96 --batch 64 --precision bf16
	@$(BUILD)/app/tessera bench infer --model compact --size 96 --batch 64 --precision bf16
	@$(BUILD)/app/tessera bench train --model resnet18 --size 96 --batch 64 --precision bf16
	@$(BUILD)/app/tessera bench infer --model resnet18 --size 96 --batch 64 --precision bf16
	@$(BUILD)/app/tessera bench scale --out $(BUILD)/bench-scale

format:
	@git ls-files '*.cpp' '*.h' | xargs clang-format -i

lint: configure
	@git ls-files 'app/*.cpp' 'engine/*.cpp' 'io/*.cpp' 'preprocessing/*.cpp' | xargs clang-tidy -p $(BUILD) --quiet

clean:
	@rm -rf $(BUILD) $(BUILD_ASAN) $(BUILD_FUZZ)
