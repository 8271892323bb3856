#!/usr/bin/env bash
# Builds the libFuzzer targets of fuzz/ with clang (-fsanitize=fuzzer,address,undefined) and runs each for a bounded
# time from its seed corpus in fuzz/corpus/<target>/ (new inputs go to the build directory, not the repository).
#   bash tools/fuzz.sh [SECONDS_PER_TARGET]     default 60; needs clang and libclang-rt-14-dev (tools/dev.sh fuzz)
# Environment: TAPEGRAD_FUZZ_BUILD (default build-fuzz), TAPEGRAD_FUZZ_TARGETS (default "checkpoint config text formula").
# A crash stops the script with exit code 1 and leaves the input in BUILD/crashes/; put a copy in
# fuzz/regressions/<target>/ and tests/reliability_fuzz_test.cpp replays it in every test run.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET=${1:-60}
BUILD=${TAPEGRAD_FUZZ_BUILD:-build-fuzz}
TARGETS=${TAPEGRAD_FUZZ_TARGETS:-checkpoint config text formula}
JOBS=$(nproc 2>/dev/null || echo 2)

cmake -S fuzz -B "$BUILD" -G Ninja -DCMAKE_CXX_COMPILER=clang++ >/dev/null
ninja -C "$BUILD" -j "$JOBS" $(for t in $TARGETS; do echo "fuzz_$t"; done)

mkdir -p "$BUILD/crashes"
# The targets run side by side (the machine's cores shared between them), each for the same wall-clock time.
fuzz_one() {  # fuzz_one TARGET: runs it, its log in $BUILD/fuzz_TARGET.log; exit status non-zero on a crash
  local target=$1
  local work="$BUILD/corpus/$target"
  mkdir -p "$work"
  local extra=()
  [ -f "fuzz/$target.dict" ] && extra+=(-dict="fuzz/$target.dict")
  local seeds=("fuzz/corpus/$target")
  [ -d "fuzz/regressions/$target" ] && seeds+=("fuzz/regressions/$target")
  # Inputs up to 64 KiB; 2 GB of memory and 10 s per input at most; the repository's seeds and regressions are
  # read, new inputs written to $work.
  "./$BUILD/fuzz_$target" -max_total_time="$SECONDS_PER_TARGET" -max_len=65536 -rss_limit_mb=2048 -timeout=10 \
    -print_final_stats=1 "${extra[@]}" -artifact_prefix="$BUILD/crashes/$target-" "$work" "${seeds[@]}" \
    >"$BUILD/fuzz_$target.log" 2>&1
}

echo "fuzzing $TARGETS for ${SECONDS_PER_TARGET}s each, side by side..."
declare -A pids
for target in $TARGETS; do
  fuzz_one "$target" &
  pids[$target]=$!
done
status=0
for target in $TARGETS; do
  log="$BUILD/fuzz_$target.log"
  result="no crash"
  if ! wait "${pids[$target]}"; then
    status=1
    result="CRASH, see $log"
    grep -E "ERROR|SUMMARY|Test unit written" "$log" | head -5 || true
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  corpus=$(find "$BUILD/corpus/$target" -type f | wc -l)
  printf '%-12s %12s executions  %6s corpus inputs  %s\n' "$target" "${runs:-?}" "$corpus" "$result"
done
exit $status
