# The two commands of the README, as make targets:
#   make demo    install what is missing, build, run the flashdecode demo
#   make check   install what is missing, build, run the whole test suite
# Options: BUILD=build  CUDA_ARCHS="80-real;90a-real;..."  (default: all supported)
BUILD ?= build
CUDA_ARCHS ?=
ASAN_BUILD ?= $(BUILD)-asan
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo "-G Ninja")
CUDA_FLAGS := $(if $(CUDA_ARCHS),-DFLASHDECODE_CUDA_ARCHS="$(CUDA_ARCHS)",)
export PATH := $(PATH):/usr/local/cuda/bin

.PHONY: deps configure build demo check test asan docs clean

deps:
	@tests/tools/install-deps.sh

configure: deps
	@test -f $(BUILD)/CMakeCache.txt || cmake -S . -B $(BUILD) $(GENERATOR) -DCMAKE_BUILD_TYPE=Release $(CUDA_FLAGS)

build: configure
	cmake --build $(BUILD) --parallel

demo: build
	$(BUILD)/flashdecode

test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 1800

docs: configure
	cmake --build $(BUILD) --target docs

# Host code under AddressSanitizer + UndefinedBehaviorSanitizer (CPU backend only).
asan: deps
	@test -f $(ASAN_BUILD)/CMakeCache.txt || cmake -S . -B $(ASAN_BUILD) $(GENERATOR) \
	  -DCMAKE_BUILD_TYPE=Debug -DFLASHDECODE_CUDA=OFF -DFLASHDECODE_SANITIZE=ON
	cmake --build $(ASAN_BUILD) --parallel
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -L unit

check: test docs asan
	@echo "make check: all passed"

clean:
	rm -rf $(BUILD) $(ASAN_BUILD)
