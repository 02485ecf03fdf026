#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The flashdecode program's command line, as a user meets it: --help and
# --version on stdout with status 0; an unknown option, a missing or bad
# value named on stderr with status 2; a small benchmark on the CPU backend
# (a table and its JSON); progress on stderr; and the demo on auto, which
# either runs on CUDA or says why not.
#   cli_check.sh <path to flashdecode> <work dir>
set -euo pipefail
program=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
fail() { echo "cli_check: $*"; echo "--- stdout"; cat "$work/out"; echo "--- stderr"; cat "$work/err"; exit 1; }

# expect <status> <what stdout must contain or ''> <what stderr must contain or ''> -- <arguments...>
expect() {
  local want=$1 out_has=$2 err_has=$3
  shift 4
  local status=0
  "$program" "$@" >"$work/out" 2>"$work/err" || status=$?
  [ "$status" = "$want" ] || fail "flashdecode $*: exit status $status, expected $want"
  [ -z "$out_has" ] || grep -qF -- "$out_has" "$work/out" || fail "flashdecode $*: stdout lacks '$out_has'"
  [ -z "$err_has" ] || grep -qF -- "$err_has" "$work/err" || fail "flashdecode $*: stderr lacks '$err_has'"
  echo "ok: flashdecode $* (exit $status)"
}

expect 0 "usage: " "" -- --help
[ ! -s "$work/err" ] || fail "--help wrote to stderr"
expect 0 "usage: " "" -- -h
expect 0 "flashdecode " "" -- --version
expect 2 "" "unknown option '--frobnicate'" -- --frobnicate
[ ! -s "$work/out" ] || fail "an unknown option wrote to stdout"
expect 2 "" "unknown option '--kv_len'" -- --batch 2 --kv_len 100
expect 2 "" "unexpected argument 'cpu'" -- cpu
expect 2 "" "option '--iters' needs a value" -- --iters
expect 2 "" "--batch takes a non-negative integer, not 'two'" -- --batch two
expect 2 "" "--backend must be auto, cpu or cuda, not 'gpu'" -- --backend gpu
expect 2 "" "bad shape '2x8x100'" -- --backend cpu --bench 2x8x100
expect 2 "" "--mask must be causal or none, not 'sliding'" -- --mask sliding
expect 2 "" "--q-len must be 1 to 64, not '65'" -- --q-len 65
expect 2 "" "--softcap takes a finite non-negative number, not '-1'" -- --softcap -1
expect 2 "" "unexpected argument '1'" -- --alibi 1

# Every attention variant at once, checked against the float64 reference; and benchmarked.
expect 0 "check against float64 reference: ok" "" -- --backend cpu --batch 2 --kv-len 300 --q-len 4 --mask none \
  --window 100 --softcap 30 --alibi --sinks --iters 1
grep -qF "q_len=4 mask-none window=100 softcap=30 alibi=random sinks" "$work/out" || fail "the problem line lacks the variants"
expect 0 "f32 benchmark, q_len 3, window 64, softcap 20, alibi, sinks" "" -- --backend cpu --bench 1x8/2x512x64 \
  --dtype f32 --q-len 3 --window 64 --softcap 20 --alibi --sinks --iters 2 --json "$work/variants.json"
grep -qE "^1x8/2x512x64 +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+  cpu " "$work/out" || fail "no result row with variants"
grep -qF '"variants": {"q_len": 3, "mask": "causal", "window": 64, "softcap": 20, "alibi": true, "sinks": true}' \
  "$work/variants.json" || fail "the JSON does not name the variants"

# A small benchmark on the CPU backend: one row per shape, and the same rows in the JSON.
expect 0 "CPU backend" "" -- --backend cpu --threads 2 --bench 1x8/2x512x64,2x4/1x300x32 --dtype bf16 --iters 3 \
  --json "$work/bench.json"
for shape in 1x8/2x512x64 2x4/1x300x32; do
  grep -qE "^$shape +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+  cpu " "$work/out" || fail "no result row for $shape"
  grep -qF "\"shape\": \"$shape\"" "$work/bench.json" || fail "no JSON result for $shape"
done
grep -qF '"backend": "cpu", "dtype": "bf16"' "$work/bench.json" || fail "the JSON does not name the backend and dtype"
if command -v python3 >/dev/null; then
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1]))["results"]; assert len(r) == 2, r' "$work/bench.json" ||
    fail "bench.json is not JSON with two results"
fi
# Progress of every step with --progress 0, on stderr only.
expect 0 "1x4/2x64x16" "flashdecode: shape 1 of 1 (1x4/2x64x16), run 3 of 3" -- --backend cpu --bench 1x4/2x64x16 \
  --iters 2 --progress 0
if grep -q "run 3 of 3" "$work/out"; then fail "progress went to stdout"; fi
expect 0 "check against float64 reference: ok" "flashdecode: run 2 of 2" -- --backend cpu --batch 1 --kv-len 64 \
  --iters 1 --progress 0
# A shape too large for this machine is refused, not attempted.
expect 1 "failed" "more than half of this machine's" -- --backend cpu --bench 1000x32/8x1000000x128 --iters 1
# The same from a shapes file.
printf '# shapes\n1x4/4x64x16\n\n' > "$work/shapes.txt"
expect 0 "1x4/4x64x16" "" -- --backend cpu --bench-file "$work/shapes.txt" --iters 1

# auto: CUDA when usable, else the CPU and the library's reason.
expect 0 "check against float64 reference: ok" "" -- --batch 1 --kv-len 256 --iters 1
if grep -qF "CPU backend" "$work/out"; then
  grep -qE "^why not CUDA: .+" "$work/out" || fail "auto took the CPU without saying why"
  echo "auto: $(grep '^why not CUDA' "$work/out")"
fi
echo "cli_check: all passed"
