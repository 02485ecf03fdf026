# SPDX-License-Identifier: Apache-2.0
# The two commands of the README, as make targets:
#   make demo    install what building is missing, build, run the flashdecode demo
#   make check   install what is missing, check the formatting, build, run
#                the whole test suite (with the ASan, TSan and fuzz runs below)
#   make format  apply .clang-format to the sources format-check covers
#   make fuzz    fuzz fd_decode, then fd_append_kv and fd_merge_states, FUZZ_SECONDS each (tests/fuzz/README.md)
#   make tsan    the threaded tests under ThreadSanitizer
# Options: BUILD=build  CUDA_ARCHS="80-real;90a-real;..."  (default: all supported)
#          FUZZ_SECONDS=60  TSAN_TESTS=<ctest -R regex>
BUILD ?= build
CUDA_ARCHS ?=
ASAN_BUILD ?= $(BUILD)-asan
TSAN_BUILD ?= $(BUILD)-tsan
FUZZ_BUILD ?= $(BUILD)-fuzz
FUZZ_SECONDS ?= 60
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
CUDA_FLAGS := $(if $(CUDA_ARCHS),-DFLASHDECODE_CUDA_ARCHS="$(CUDA_ARCHS)",)
export PATH := $(PATH):/usr/local/cuda/bin
CLANG_FORMAT ?= clang-format
# The C, C++ and CUDA sources under src/ include/ tests/ docs/examples/ that
# git tracks or would track (new, not ignored: build directories are
# skipped); files deleted from the working tree but still tracked are left
# out. Outside a git checkout, every such file there.
FORMAT_FILES = $(wildcard $(shell { git ls-files --cached --others --exclude-standard -- src include tests docs/examples \
  2>/dev/null || find src include tests docs/examples -type f; } | grep -E '\.(c|h|cpp|cu|cuh)$$' | sort -u))

.PHONY: deps build-deps configure build demo check test asan tsan fuzz docs format format-check clean

# Everything the tests, docs, format check, sanitizers and bindings need.
deps:
	@tests/tools/install-deps.sh

# What configuring and building need, for `make demo`.
build-deps:
	@tests/tools/install-deps.sh --build

configure: build-deps
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release $(CUDA_FLAGS)

build: configure
	cmake --build $(BUILD) --parallel

demo: build
	$(BUILD)/flashdecode

test: deps build
	cd $(BUILD) && ctest --output-on-failure --timeout 1800

docs: deps configure
	cmake --build $(BUILD) --target docs

# Host code under AddressSanitizer + UndefinedBehaviorSanitizer (CPU backend only).
asan: deps
	@test -f $(ASAN_BUILD)/CMakeCache.txt || cmake -S . -B $(ASAN_BUILD) $(GENERATOR) \
	  -DCMAKE_BUILD_TYPE=Debug -DFLASHDECODE_CUDA=OFF -DFLASHDECODE_SANITIZE=ON
	cmake --build $(ASAN_BUILD) --parallel
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -L unit

# The unit tests that run threads, under ThreadSanitizer (CPU backend,
# Debug). Every unit test passes under TSan, but test_cpu_numerics takes
# minutes there: `make tsan TSAN_TESTS=.` runs them all. (A TSan "unexpected
# memory mapping" abort means a kernel with more mmap randomisation than
# this TSan knows: sysctl vm.mmap_rnd_bits=28.)
TSAN_TESTS ?= ^(test_concurrency|test_thread_pool|test_api)$$
tsan: deps
	@test -f $(TSAN_BUILD)/CMakeCache.txt || cmake -S . -B $(TSAN_BUILD) $(GENERATOR) \
	  -DCMAKE_BUILD_TYPE=Debug -DFLASHDECODE_CUDA=OFF \
	  -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_CXX_FLAGS=-fsanitize=thread \
	  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread
	cmake --build $(TSAN_BUILD) --parallel
	cd $(TSAN_BUILD) && TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
	  ctest --output-on-failure -L unit -R '$(TSAN_TESTS)'

# libFuzzer on fd_decode, fd_workspace_size and fd_describe_plan
# (fuzz_decode), then on fd_append_kv and fd_merge_states (fuzz_cache), each
# for FUZZ_SECONDS (CPU backend; tests/fuzz/README.md): the library and the
# harnesses built by clang with ASan, UBSan and coverage (comparison tracing
# off: it halves the speed), from the checked-in seeds; new inputs go to
# $(FUZZ_BUILD)/corpus and corpus-cache, a failing one to
# $(FUZZ_BUILD)/artifacts/. `make fuzz FUZZ_SECONDS=3600` for a long run.
FUZZ_CFLAGS := -fsanitize=fuzzer-no-link -fno-sanitize-coverage=trace-cmp
# $(call run_fuzzer,HARNESS,SEEDS,CORPUS,LOG): one harness from SEEDS and
# $(FUZZ_BUILD)/CORPUS, logging to $(FUZZ_BUILD)/LOG.
define run_fuzzer
	@mkdir -p $(FUZZ_BUILD)/$(3) $(FUZZ_BUILD)/artifacts
	@echo "fuzz: $(FUZZ_SECONDS) s of $(1); log in $(FUZZ_BUILD)/$(4)"
	@UBSAN_OPTIONS=print_stacktrace=1 $(FUZZ_BUILD)/tests/fuzz/$(1) -max_total_time=$(FUZZ_SECONDS) \
	  -max_len=512 -timeout=60 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/artifacts/$(1)- \
	  $(FUZZ_BUILD)/$(3) $(2) >$(FUZZ_BUILD)/$(4) 2>&1 || { \
	  sed -n '/$(1): FAILED\|ERROR: \|runtime error: /,$$p' $(FUZZ_BUILD)/$(4) | head -n 150 | grep . || \
	  tail -n 60 $(FUZZ_BUILD)/$(4); \
	  echo "fuzz: $(1) FAILED; the input is in $(FUZZ_BUILD)/artifacts/, see tests/fuzz/README.md" >&2; exit 1; }
	@grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec)' $(FUZZ_BUILD)/$(4)
endef
fuzz: deps
	@test -f $(FUZZ_BUILD)/CMakeCache.txt || CC=clang CXX=clang++ cmake -S . -B $(FUZZ_BUILD) $(GENERATOR) \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFLASHDECODE_CUDA=OFF -DFLASHDECODE_TESTS=OFF \
	  -DFLASHDECODE_SANITIZE=ON -DFLASHDECODE_FUZZ=ON \
	  "-DCMAKE_C_FLAGS=$(FUZZ_CFLAGS)" "-DCMAKE_CXX_FLAGS=$(FUZZ_CFLAGS)"
	cmake --build $(FUZZ_BUILD) --parallel --target fuzz_decode fuzz_cache
	$(call run_fuzzer,fuzz_decode,tests/fuzz/corpus,corpus,fuzz.log)
	$(call run_fuzzer,fuzz_cache,tests/fuzz/corpus-cache,corpus-cache,fuzz-cache.log)

# Formatting against .clang-format (Debian 12's clang-format 14; another
# version may lay out some lines differently).
format-check: deps
	@test -n "$(FORMAT_FILES)" || { echo "format-check: no sources found" >&2; exit 1; }
	@$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_FILES) || { \
	  echo "format-check: $$($(CLANG_FORMAT) --version) wants the changes above; 'make format' applies them" >&2; \
	  exit 1; }

format:
	$(CLANG_FORMAT) -i $(FORMAT_FILES)

# format-check first, so that a formatting slip fails before the long build.
check: format-check test docs asan tsan fuzz
	@echo "make check: all passed"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) $(TSAN_BUILD) $(FUZZ_BUILD)
