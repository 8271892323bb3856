#!/bin/sh
# ctest memory_estimate: the memory tapegrad train estimates in its header (the run's estimate beside the program's
# own resident memory) against the peak RSS its last line reports, at three sizes: within 0.6x to 1.5x. With
# --sharpness-every (Hessian-vector products after every step), at two sizes: the peak within 1.25x of the estimate
# (a ratio of 0.8 or more), and the estimate within 1.5x of the peak.
#   sh memory_estimate_check.sh TAPEGRAD WORK_DIR
set -eu
tapegrad=$1
work=$2
rm -rf "$work"
mkdir -p "$work"
status=0
sharp="--sharpness-every 1 --sharpness-iterations 2"
for args in "--n-layer 2" "--n-layer 4 --n-head 8 --n-embd 256 --block-size 128 --batch-size 8" \
            "--n-layer 2 --n-embd 64 --block-size 512 --batch-size 8 --attention tiled" \
            "--n-layer 2 $sharp" "--n-layer 4 --n-head 8 --n-embd 256 --block-size 128 --batch-size 8 $sharp"; do
  case "$args" in *--sharpness-every*) low=0.8 ;; *) low=0.6 ;; esac
  # shellcheck disable=SC2086
  "$tapegrad" train $args --max-iters 2 --eval-iters 1 --eval-interval 100 --sample-tokens 0 --out "$work" \
    --name run --overwrite > "$work/out.txt"
  awk -v args="$args" -v low="$low" '
    function mib(v, u) { return u == "GiB" ? v * 1024 : u == "KiB" ? v / 1024 : u == "bytes" ? v / 1048576 : v }
    /^memory: about / { est = mib($3, $4); for (i = 1; i <= NF; i++) if ($i == "program'"'"'s") own = mib($(i+1), $(i+2)) }
    /^done: / { for (i = 1; i <= NF; i++) if ($i == "RSS") peak = mib($(i+1), $(i+2)) }
    END {
      if (est == "" || own == "" || peak == "") { print args ": no estimate or no peak in the output"; exit 1 }
      ratio = (est + own) / peak
      printf "%s: estimated %.1f + %.1f MiB, peak %.1f MiB, ratio %.2f\n", args, est, own, peak, ratio
      exit (ratio >= low && ratio <= 1.5) ? 0 : 1
    }' "$work/out.txt" || status=1
done
exit $status
