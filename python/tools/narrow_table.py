#!/usr/bin/env python3
"""A slip named at size as at a small size: the float64 check of ops that take a fixed tensor beside their checked
ones (python/tests/narrow_build.py, the set the naming is built on, and narrow_heldout.py and narrow_heldout2.py,
written apart from it and from each other).

    PYTHONPATH=build/python /usr/bin/python3 python/tools/narrow_table.py [--set build|heldout|heldout2|all]
                                                                        [--dtype bf16] [--json FILE]

Per (op, version): tapegrad.gradcheck at the small size (full Jacobians) and at the large one (random projections,
every checked input's Jacobian above the full-Jacobian limit), seed 0. A slip's small kinds are those of its report
less GENERIC (researcher_ops.py's: kinds that say where, not what); at size it is "same" when it names at least one
of them and none that the small report does not, "other" when it names only others, "unnamed" when it names none.
A right version is counted where it fails (a false failure). Times are one run each, in seconds. With --dtype below
float64, both sizes run at that dtype against the op's right version as the reference (an op that raises there is
listed as such).
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import researcher_ops  # noqa: E402
import tapegrad  # noqa: E402

GENERIC = researcher_ops.GENERIC
# python/tests/narrow_<set>.py, and the scalar losses: scalar_<set>.py
SETS = ("build", "heldout", "heldout2", "scalar_build", "scalar_heldout")


def named(report):
    return sorted({d.kind for d in report.diagnoses} - GENERIC)


def run(make, variant, large, dtype=torch.float64):
    """(the report, or None where the op raised at that dtype; seconds)."""
    fn, inputs = make(variant, large, 0)
    keywords = {}
    if dtype != torch.float64:  # the op at a low precision against its right version in float64
        inputs = tuple(x.detach().to(dtype).requires_grad_(x.requires_grad)
                       if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs)
        keywords["reference"] = make("right", large, 0)[0]
    start = time.perf_counter()
    try:
        report = tapegrad.gradcheck(fn, inputs, raise_exception=False, **keywords)
    except RuntimeError:  # an op written for float64 alone
        report = None
    return report, time.perf_counter() - start


def table(set_name, dtype=torch.float64):
    ops = __import__(set_name if set_name.startswith("scalar_") else f"narrow_{set_name}").OPS
    rows = []
    for op, (make, slips) in ops.items():
        for variant in ("right",) + tuple(slips):
            small, t_small = run(make, variant, False, dtype)
            large, t_large = run(make, variant, True, dtype)
            if small is None or large is None:
                print(f"{set_name:8} {op:26} {variant:20} raised at this dtype", flush=True)
                continue
            s, g = named(small), named(large)
            if variant == "right":
                verdict = "ok" if small.passed and large.passed else "FALSE FAILURE"
            elif large.passed:
                verdict = "FALSE PASS"
            elif not g:
                verdict = "unnamed"
            elif set(g) <= set(s):
                verdict = "same"
            else:
                verdict = "other" if not set(g) & set(s) else "same+other"
            rows.append({"set": set_name, "op": op, "version": variant, "small": s, "large": g, "verdict": verdict,
                         "seconds": [round(t_small, 2), round(t_large, 2)],
                         "large_messages": [d.message[:160] for d in large.diagnoses]})
            print(f"{set_name:8} {op:26} {variant:20} {verdict:13} small {','.join(s) or '-':28} "
                  f"large {','.join(g) or '-':28} {t_small:5.2f}s {t_large:5.2f}s", flush=True)
    slips = [r for r in rows if r["version"] != "right"]
    same = sum(r["verdict"] == "same" for r in slips)
    print(f"{set_name}: {same}/{len(slips)} slips named at size as at the small size; "
          f"{sum(r['verdict'] == 'unnamed' for r in slips)} unnamed, "
          f"{sum(r['verdict'] in ('other', 'same+other') for r in slips)} with another kind, "
          f"{sum(r['verdict'] == 'FALSE PASS' for r in slips)} passed; "
          f"{sum(r['verdict'] == 'FALSE FAILURE' for r in rows)} right versions failed")
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", choices=SETS + ("all",), default="all")
    parser.add_argument("--json")
    parser.add_argument("--dtype", choices=("float64", "bf16", "fp16", "float32"), default="float64",
                        help="the inputs' dtype at both sizes (below float64, the right version is the reference)")
    args = parser.parse_args()
    dtype = {"float64": torch.float64, "bf16": torch.bfloat16, "fp16": torch.float16,
             "float32": torch.float32}[args.dtype]
    torch.set_num_threads(1)
    rows = []
    for set_name in SETS if args.set == "all" else (args.set,):
        rows += table(set_name, dtype)
    if args.json:
        with open(args.json + ".tmp", "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
