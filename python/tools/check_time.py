#!/usr/bin/env python3
"""How long tapegrad.gradcheck takes on a precision set's row-wise ops at one size, at each dtype against float64,
right and with one slip each, beside torch.autograd.gradcheck's fast mode in float64 on the right version (its
full Jacobians, which it computes to report a failure, do not fit at this size): medians of --repeat runs, and what
each check said.

    PYTHONPATH=build/python /usr/bin/python3 python/tools/check_time.py --set heldout|triton [--size 4096x256]
        [--cases layer_norm,rms_norm] [--dtypes bf16,float32] [--repeat 3] [--json FILE]
    ... --set ops|ops_heldout|ops_heldout2|heldout3|build --size small --cases all   (every case of a set)

A check at bf16, fp16 or float32 runs against the case's composite reference (the float64 comparison on the same
rounded inputs); a float64 check runs the op against finite differences, as a float64 op is checked. The slip of a
case is its first slip that exists at every dtype (its kind in the set); the kernels written in bf16 torch ops
(precision_ops16.py, precision_ops16c.py) have their right versions only. Each row says the device, the time, the
verdict and the kinds named, and the ratio of the median to the float64 check's; the last lines, the median and the
largest ratio per dtype and version. Timings are measured, never tested.
Exit status 0 after printing, 2 on a bad argument.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from precision_table import DTYPES, OPS_SETS, load_ops_set, load_set  # noqa: E402

ROW_WISE = ("rms_norm", "layer_norm", "cosine_similarity", "logsumexp", "residual_layer_norm", "swiglu")


def timed(repeat, run):
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = run()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def tapegrad_check(fn, xs, reference, seed):
    import tapegrad
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = tapegrad.gradcheck(fn, xs, reference=reference, seed=seed)
    said = ("passed" if report.passed else "failed") + (f" {sorted(set(report.kinds))}" if report.kinds else "")
    return said, str(report)


def show(version, said, text):
    """A right version's report, where it failed: a false failure, printed whole."""
    if version == "right" and not said.startswith("passed"):
        print("    " + text.replace("\n", "\n    "))


def torch_check(fn, xs):
    try:
        torch.autograd.gradcheck(fn, xs, fast_mode=True)
        return "passed"
    except Exception as error:  # GradcheckError: its first line says where
        return "failed: " + str(error).splitlines()[0][:80]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", choices=("heldout", "triton", "heldout3", "build") + OPS_SETS, default="heldout")
    parser.add_argument("--size", default="4096x256")
    parser.add_argument("--cases", default=",".join(ROW_WISE[:2]))
    parser.add_argument("--dtypes", default="bf16,float32")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    cases = {c.name: c for c in (load_ops_set(args.set) if args.set in OPS_SETS else load_set(args.set))}
    names = list(cases) if args.cases == "all" else args.cases.split(",")
    unknown = [n for n in names if n not in cases or (n not in ROW_WISE and args.cases != "all")]
    bad_dtypes = [d for d in args.dtypes.split(",") if d not in DTYPES]
    if unknown or bad_dtypes or args.repeat < 1:
        print(f"check_time: unknown row-wise case {unknown} or dtype {bad_dtypes} (row-wise cases: {ROW_WISE}; "
              f"dtypes: {list(DTYPES)}; or --cases all), or --repeat below 1", file=sys.stderr)
        return 2
    device = (torch.cuda.get_device_name() if args.set == "triton" else platform.processor() or platform.machine())
    print(f"device: {device}; torch {torch.__version__}, {torch.get_num_threads()} threads; size {args.size}; "
          f"median of {args.repeat}")
    rows = []
    for name in names:
        case = cases[name]
        slips = getattr(case, "slips", None) or {}
        slip = next((s for s, (_, where) in slips.items() if where == "all"), None)
        for version in ("right",) + ((slip,) if slip else ()):
            fn = case.make(version)
            xs64 = case.inputs(args.size, torch.float64, 0)
            tapegrad_check(fn, xs64, None, 0)  # warm: Triton compiles its kernels once per dtype
            t64, (said64, text64) = timed(args.repeat, lambda: tapegrad_check(fn, xs64, None, 0))
            row = {"case": name, "version": version, "dtype": "float64", "seconds": t64, "said": said64}
            peer = ""
            if version == "right":  # on a failure torch's fast mode computes the full Jacobians to report
                row["torch_fast_seconds"], row["torch_said"] = timed(args.repeat, lambda: torch_check(fn, xs64))
                peer = f"  | torch fast mode {row['torch_fast_seconds'] * 1e3:.1f} ms {row['torch_said']}"
            rows.append(row)
            print(f"{name:20} {version:24} float64 {t64 * 1e3:8.1f} ms  {said64}{peer}")
            show(version, said64, text64)
            for dname in args.dtypes.split(","):
                xs = case.inputs(args.size, DTYPES[dname], 0)
                tapegrad_check(fn, xs, case.reference, 0)
                t, (said, text) = timed(args.repeat, lambda: tapegrad_check(fn, xs, case.reference, 0))
                rows.append({"case": name, "version": version, "dtype": dname, "seconds": t, "said": said,
                             "over_float64": t / t64})
                print(f"{name:20} {version:24} {dname:7} {t * 1e3:8.1f} ms  {said}  ({t / t64:.2f}× float64's)",
                      flush=True)
                show(version, said, text)
    for dname in args.dtypes.split(","):
        for version in ("right", "slip"):
            ratios = [r["over_float64"] for r in rows if r["dtype"] == dname and (r["version"] == "right") ==
                      (version == "right")]
            if ratios:
                print(f"{dname} {version} versions: {len(ratios)} checks, {statistics.median(ratios):.2f}× the float64 "
                      f"check's time (median), at most {max(ratios):.2f}×")
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"device": device, "size": args.size, "rows": rows}, f, indent=1)
        os.replace(tmp, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
