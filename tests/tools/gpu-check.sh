#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The whole GPU check in one go, on a machine with an NVIDIA GPU:
#
#   tests/tools/gpu-check.sh <build-dir>
#
# Steps: the GPU test suite (ctest -L gpu, verbose: every case's errors),
# compute-sanitizer memcheck, racecheck, initcheck and synccheck over the GPU
# test program in quick mode, the flashdecode demo on the GPU, and the timing
# against PyTorch SDPA (needs python3 with torch). Logs go to $OUT if set,
# else <build-dir>/gpu-check; a summary table is printed last.
#
# Build first, anywhere with nvcc (the GPU machine needs no compiler), e.g.
#   cmake -S . -B build-h200 -G Ninja -DFLASHDECODE_CUDA_ARCHS=90a-real -DCMAKE_PREFIX_PATH=$PWD/.deps/usr
#   cmake --build build-h200
#
# FD_GPU_CHECK_STEPS picks steps (default: "tests python memcheck racecheck
# initcheck synccheck demo sdpa"); FD_GPU_CHECK_TIMEOUT bounds each step in
# seconds. FD_GPU_CHECK_PARALLEL=1 runs the test, python and sanitizer steps
# at once, each as an instance of this script with its logs in a folder of
# its own (racecheck: an instance a filter), then the timing steps (demo,
# sdpa, quantized) alone; the summary lists every instance's lines, and the
# folders are packed into parallel-logs.tar.gz. The sanitizers are bound by
# the host's cores more than the GPU: on an H200 with 16 cores, the suite in
# 8 shards, python, memcheck, initcheck, synccheck and racecheck (its default
# filters in three instances) took 287 s together this way; on an H100
# beside the suite's 8 shards, memcheck, initcheck and synccheck each
# needed more than 330 s, so in this mode a step's default limit is 540 s.
# FD_GPU_CHECK_SHARDS=N (default 1) runs the GPU test program as N
# processes at once, each every N-th test (FD_GPU_TEST_SHARD): its float64
# references run on the host, so the suite takes a fraction of its serial
# time on a machine with several cores. racecheck tracks every shared-memory
# access and takes about 11 s a case on the tensor-core kernel, so it runs
# on the tests matching
# FD_GPU_CHECK_RACECHECK_FILTERS (globs; default: every tensor-core case,
# the first ten matrix cases, which mix both split kernels and the merge, the
# compact tiles', rows kernels' and balanced schedule's tests, the first ten
# 8-bit and variant cases, appends, fd_merge_states and the merge paths,
# whose fused merges share the split kernel's shared memory).
# The python step runs the Python binding's pytest suite (its GPU tests use
# PyTorch and CuPy tensors) against this build's library
# (FD_GPU_CHECK_SDPA_TIMEOUT the SDPA comparison, default 540);
# FD_GPU_CHECK_SDPA_ARGS adds arguments to compare_sdpa.py (e.g.
# "--dtypes float16 --shapes 1,2,3"). The quantized step (not among the
# defaults) times the 8-bit caches with compare_quantized.py, arguments
# FD_GPU_CHECK_QUANTIZED_ARGS (default "--parts decode"; e.g. add
# "--base-lib base=ab/base/libflashdecode.so.0" for an A/B; its time limit
# is the SDPA comparison's). The Triton split-K reference kernel (labelled
# seed in the results) is timed when .seed/flash_decode_splitk.py
# exists (copy it from ../shared/seed/). The mmasync step (not among the
# defaults) checks the whole-tile rows kernels' mma.sync form, the device
# code of sm_100 and sm_120 builds, on an sm_90 card: this build's GPU test
# program runs the rows and variant tests, and racecheck the rows test,
# against the libflashdecode.so.0 in FD_GPU_CHECK_MMASYNC_DIR (default
# ab/mmasync), a build made with
#   tests/tools/build-variant.sh mmasync HEAD -DFD_ROWS_WGMMA=0
set -uo pipefail

if [ $# -ne 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 <build-dir>" >&2
  exit 2
fi
build=$(cd "$1" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
logs=${OUT:-$build/gpu-check}
mkdir -p "$logs"
steps=${FD_GPU_CHECK_STEPS:-tests python memcheck racecheck initcheck synccheck demo sdpa}
racecheck_filters=${FD_GPU_CHECK_RACECHECK_FILTERS:-tensor_core_case_* matrix_case_00? test_compact_tiles test_rows_kernel
  test_balanced_schedule quantized_case_0? variant_case_00? test_append_matches_cpu test_merge_states
  test_merge_paths_on_caller_workspace test_longest_first}
step_timeout=${FD_GPU_CHECK_TIMEOUT:-240}
shards=${FD_GPU_CHECK_SHARDS:-1}
sdpa_timeout=${FD_GPU_CHECK_SDPA_TIMEOUT:-540}
export PATH="$PATH:/usr/local/cuda/bin"
export PYTHONUNBUFFERED=1
test_program=$build/tests/gpu/test_cuda_decode
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/compute-sanitizer/compute-sanitizer)

summary=()
failed=0

# run_step NAME COMMAND...: runs with a time limit, tees into NAME.log, and
# records a summary line (NOTE is set by the caller after the step).
run_step() {
  local name=$1
  shift
  local start=$SECONDS
  echo "=== $name: $*" | tee "$logs/$name.log"
  timeout --kill-after=10 "$step_timeout" "$@" 2>&1 | tee -a "$logs/$name.log"
  local rc=${PIPESTATUS[0]}
  local verdict=PASS
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    verdict="TIMEOUT"
  elif [ "$rc" -ne 0 ]; then
    verdict="FAIL($rc)"
  fi
  [ "$verdict" = PASS ] || failed=1
  summary+=("$(printf '%-10s %-11s %5ds  ' "$name" "$verdict" $((SECONDS - start)))")
}

# Appends a note (the step's key result line) to the last summary line.
note() { summary[${#summary[@]}-1]+="$1"; }

sanitize() {
  local tool=$1
  shift
  local name=$tool${FD_GPU_TEST_FILTER:+-${FD_GPU_TEST_FILTER//[^a-z0-9_]/}}
  FD_GPU_TEST_QUICK=1 run_step "$name" "$sanitizer" --tool "$tool" --error-exitcode 1 --print-limit 20 "$@" \
    "$test_program"
  note "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$logs/$name.log" | tr -s ' =' ' ' | tr '\n' ';' | cut -c1-110)"
}

# At most 8 files under $OUT come back from the device tool: the four
# sanitizer logs are joined into sanitizers.log at the end, leaving tests.log,
# sanitizers.log, demo.log, sdpa.log, sdpa.json and sdpa.png.
machine=$( (nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 ||
  true) | head -1; ("$sanitizer" --version 2>&1 || true) | tail -1)
echo "=== machine: $machine"

# FD_GPU_CHECK_PARALLEL: the untimed steps as instances at once (see above);
# the timing steps below, alone.
if [ "${FD_GPU_CHECK_PARALLEL:-0}" = 1 ]; then
  export FD_GPU_CHECK_TIMEOUT=${FD_GPU_CHECK_TIMEOUT:-540}
  instances=()
  timing_steps=
  start_instance() { # NAME STEP [racecheck filter]
    mkdir -p "$logs/$1"
    FD_GPU_CHECK_PARALLEL=0 FD_GPU_CHECK_STEPS=$2 FD_GPU_CHECK_RACECHECK_FILTERS=${3:-none} OUT="$logs/$1" \
      bash "$0" "$build" >"$logs/$1/console.log" 2>&1 &
    instances+=("$1:$!")
  }
  for step in $steps; do
    case $step in
      demo | sdpa | quantized) timing_steps+=" $step" ;;
      racecheck)
        for filter in $racecheck_filters; do
          start_instance "racecheck-${filter//[^a-z0-9_]/}" racecheck "$filter"
        done
        ;;
      *) start_instance "$step" "$step" ;;
    esac
  done
  for instance in "${instances[@]}"; do
    name=${instance%%:*}
    wait "${instance##*:}" || failed=1
    # The instance's summary lines: after its header and the two machine lines.
    mapfile -t lines < <(sed -n '/^=== gpu-check summary/,$p' "$logs/$name/console.log" | tail -n +4)
    [ ${#lines[@]} -gt 0 ] || lines=("$(printf '%-10s %-11s' "$name" 'NO SUMMARY')")
    summary+=("${lines[@]}")
    if [ "$name" = tests ]; then grep -A 8 '^worst errors' "$logs/$name/console.log" | grep -v '^--'; fi
  done
  names=("${instances[@]%%:*}")
  (cd "$logs" && tar czf parallel-logs.tar.gz "${names[@]}" && rm -rf "${names[@]}")
  steps=$timing_steps
fi

for step in $steps; do
  case $step in
    tests)
      if [ "$shards" -gt 1 ]; then
        # shellcheck disable=SC2016 # the inner script's variables are its arguments
        run_step tests bash -c '
          build=$1 shards=$2 limit=$3 logs=$4 rc=0
          ctest --test-dir "$build" -L gpu -E "^test_cuda_decode\$" -V --timeout "$limit" || rc=1
          for ((i = 0; i < shards; i++)); do
            FD_GPU_TEST_SHARD=$i/$shards "$build/tests/gpu/test_cuda_decode" >"$logs/tests-shard$i.log" 2>&1 &
          done
          for ((i = 0; i < shards; i++)); do wait -n || rc=1; done
          for ((i = 0; i < shards; i++)); do cat "$logs/tests-shard$i.log" && rm -f "$logs/tests-shard$i.log"; done
          exit $rc' _ "$build" "$shards" "$step_timeout" "$logs"
      else
        run_step tests ctest --test-dir "$build" -L gpu -V --timeout "$step_timeout"
      fi
      note "$(grep -E 'PASSED|FAILED|tests passed|Skipped' "$logs/tests.log" | tr -s ' ' | tr '\n' ';' | cut -c1-110)"
      ;;
    memcheck) sanitize memcheck ;;
    racecheck)
      for filter in $racecheck_filters; do
        FD_GPU_TEST_FILTER=$filter sanitize racecheck --racecheck-report all
      done
      ;;
    python)
      run_step python env FLASHDECODE_LIBRARY="$build/src/libflashdecode.so.0" PYTHONPATH="$root/bindings/python/src" \
        PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -rs -p no:cacheprovider "$root/bindings/python/tests"
      note "$(grep -E '[0-9]+ (passed|failed)' "$logs/python.log" | tail -1 | cut -c1-110)"
      ;;
    initcheck) sanitize initcheck ;;
    mmasync)
      mmasync_dir=${FD_GPU_CHECK_MMASYNC_DIR:-$root/ab/mmasync}
      # shellcheck disable=SC2016 # the inner script's variables are its arguments
      run_step mmasync bash -c '
        dir=$1 program=$2 sanitizer=$3
        if [ ! -f "$dir/libflashdecode.so.0" ]; then
          echo "no $dir/libflashdecode.so.0: build it with tests/tools/build-variant.sh mmasync HEAD -DFD_ROWS_WGMMA=0"
          exit 1
        fi
        export LD_LIBRARY_PATH=$dir
        FD_GPU_TEST_FILTER=test_rows_kernel "$program" &&
          FD_GPU_TEST_FILTER="variant_case_*" "$program" &&
          FD_GPU_TEST_QUICK=1 FD_GPU_TEST_FILTER=test_rows_kernel "$sanitizer" --tool racecheck --error-exitcode 1 \
            "$program"' _ "$mmasync_dir" "$test_program" "$sanitizer"
      note "$(tail -n +2 "$logs/mmasync.log" | grep -E 'PASSED|FAILED|RACECHECK SUMMARY|^no .*libflashdecode' | sed 's/^=* *//' | tr -s ' ' | tr '\n' ';' | cut -c1-110)"
      ;;
    synccheck) sanitize synccheck ;;
    demo)
      run_step demo bash -c "'$build/flashdecode' --backend cuda --iters 50 &&
        '$build/flashdecode' --backend cuda --batch 1 --kv-len 32768 --iters 50 &&
        '$build/flashdecode' --backend cuda --batch 8 --q-heads 40 --kv-heads 8 --head-dim 72 --dtype bf16 --kv-len 3000 --iters 20 &&
        '$build/flashdecode' --bench 1x32/8x32768x128,32x32/8x2048x128,8x64/8x16384x128,256x32/32x512x128,1x32/32x2048x128,4x16/16x65536x64,2x8/1x262144x128,4x8/4x16384x256 --iters 20"
      note "$(grep -E 'effective bandwidth' "$logs/demo.log" | sed 's/effective bandwidth: //' | tr '\n' ';' | cut -c1-110)"
      ;;
    quantized)
      # shellcheck disable=SC2086 # FD_GPU_CHECK_QUANTIZED_ARGS is a word list
      step_timeout=$sdpa_timeout run_step quantized python3 "$root/tests/bench/compare_quantized.py" \
        --lib "$build/src/libflashdecode.so.0" --json "$logs/quantized.json" --plot "$logs/quantized.png" \
        ${FD_GPU_CHECK_QUANTIZED_ARGS:---parts decode}
      ;;
    sdpa)
      # shellcheck disable=SC2086 # FD_GPU_CHECK_SDPA_ARGS is a word list
      step_timeout=$sdpa_timeout run_step sdpa python3 "$root/tests/bench/compare_sdpa.py" \
        --lib "$build/src/libflashdecode.so.0" --json "$logs/sdpa.json" --plot "$logs/sdpa.png" \
        ${FD_GPU_CHECK_SDPA_ARGS:-}
      ;;
    *) echo "unknown step: $step" >&2 ;;
  esac
done

echo
if [ -f "$logs/tests.log" ]; then
  grep -A 8 '^worst errors' "$logs/tests.log" | grep -v '^--'
  echo
fi
if [ -f "$logs/sdpa.log" ]; then
  sed -n '/^ceilings:/p; /=== results/,$p' "$logs/sdpa.log"
  echo
fi
if [ -f "$logs/quantized.log" ]; then
  sed -n '/^ceilings/p; /=== decode/,$p' "$logs/quantized.log"
  echo
fi
for log in "$logs"/memcheck*.log "$logs"/racecheck*.log "$logs"/initcheck*.log "$logs"/synccheck*.log; do
  if [ -f "$log" ]; then
    cat "$log" >>"$logs/sanitizers.log"
    rm -f "$log"
  fi
done
echo "=== gpu-check summary ($build, logs in $logs)"
echo "$machine"
printf '%s\n' "${summary[@]}"
exit $failed
