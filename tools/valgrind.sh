#!/usr/bin/env bash
# valgrind memcheck of a short training run (train, then sample and evaluate from its checkpoint, then resume it)
# and of the gradcheck of every op: exit code 1 on any memcheck error or definite leak.
#   bash tools/valgrind.sh      needs valgrind (tools/dev.sh valgrind installs it)
# Environment: TAPEGRAD_VALGRIND_BUILD, the build directory of the tapegrad program (default build; built if needed).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${TAPEGRAD_VALGRIND_BUILD:-build}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if ! { [ -f "$BUILD/build.ninja" ] || cmake -S . -B "$BUILD" -G Ninja; } >"$work/build.log" 2>&1 ||
   ! ninja -C "$BUILD" tapegrad_cli >>"$work/build.log" 2>&1; then
  cat "$work/build.log"
  exit 1
fi
program="$PWD/$BUILD/tapegrad"
head -c 20000 data/tinyshakespeare.txt >"$work/text.txt"
export OPENBLAS_NUM_THREADS=1  # OpenBLAS's own threads add nothing to check and slow valgrind down

status=0
check() {  # check NAME ARGS...: runs the program under memcheck in $work
  local name=$1
  shift
  local log="$work/$name.valgrind"
  local t0=$SECONDS
  if (cd "$work" && valgrind --error-exitcode=99 --leak-check=full --errors-for-leak-kinds=definite \
        --show-leak-kinds=definite --num-callers=40 --log-file="$log" "$program" "$@" >"$work/$name.out" 2>&1); then
    printf '%-10s %s; %s (%ds)\n' "$name" "$(grep -o 'ERROR SUMMARY: [0-9]* errors' "$log")" \
      "$(grep -o 'definitely lost: [0-9,]* bytes' "$log" || echo 'definitely lost: 0 bytes')" $((SECONDS - t0))
  else
    status=1
    echo "$name: FAILED under valgrind (tapegrad $*)"
    tail -n 20 "$work/$name.out"
    cat "$log"
  fi
}

tiny=(--data text.txt --n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4 --eval-iters 1 --out runs -q)
check train train "${tiny[@]}" --max-iters 4 --eval-interval 2 --sample-tokens 20 --stop-after 2
check resume train "${tiny[@]}" --max-iters 4 --eval-interval 2 --sample-tokens 20 --resume
check sample sample --checkpoint runs/softmax/checkpoint.safetensors --tokens 20
check evaluate evaluate --checkpoint runs/softmax/checkpoint.safetensors --text "First Citizen"
check gradcheck gradcheck
exit $status
