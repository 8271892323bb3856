#!/usr/bin/env python3
"""Every report tapegrad.gradcheck gives on the measuring sets, as text, to tell whether a change of the checker's
code changed any report (a refactor must change none).

    PYTHONPATH=build/python /usr/bin/python3 python/tools/report_snapshot.py write OUT.json \
        [--sets researcher,heldout,build]
    /usr/bin/python3 python/tools/report_snapshot.py compare BEFORE.json AFTER.json

write: for the researcher's ops (python/tests/researcher_ops.py: each op right and with each slip, at the small
size, in float64, order 1; order 2 for the right version and for slips of the second order only) and for the
precision sets (python/tests/precision_heldout.py, precision_build.py: each case at both sizes, bf16, fp16 where the
case runs it, float32, against its composite and its F reference, right and with each slip, seed 0), str(report),
or the exception a check raised, keyed "set/op/…/version". compare: the keys whose text differs, with the first
lines of each difference; exit status 1 when any differs or a key is missing on one side, else 0.
"""

import argparse
import difflib
import json
import os
import sys
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))


def _report(check):
    try:
        return str(check())
    except Exception as error:  # a check that raises is a report too: its text is compared
        return f"raised {type(error).__name__}: {error}"


def researcher_reports():
    import researcher_ops as R
    import tapegrad
    out = {}
    for op, spec in R.OPS.items():
        for version in ["right"] + list(spec.slips):
            second_only = version != "right" and spec.slips[version].kind == "second_order_only"
            orders = [2] if second_only else [1, 2] if version == "right" else [1]
            for order in orders:
                fn = R.make(op, version).apply
                out[f"researcher/{op}/order{order}/{version}"] = _report(
                    lambda: tapegrad.gradcheck(fn, R.inputs(op), order=order))
    return out


def precision_reports(which):
    import torch
    import tapegrad
    cases = __import__("precision_" + which).CASES
    dtypes = (("bf16", torch.bfloat16), ("fp16", torch.float16), ("float32", torch.float32))
    out = {}
    for case in cases:
        for size in ("small", "large"):
            for dname, dtype in dtypes:
                if dtype == torch.float16 and not case.fp16_ok:
                    continue
                for rname, ref in (("composite", case.reference), ("F", case.f_reference)):
                    if ref is None:
                        continue
                    for version in ["right"] + list(case.slips):
                        out[f"{which}/{case.name}/{size}/{dname}/{rname}/{version}"] = _report(
                            lambda: tapegrad.gradcheck(case.make(version), case.inputs(size, dtype, 0),
                                                       reference=ref, seed=0))
    return out


def write(path, sets):
    warnings.filterwarnings("ignore")
    reports = {}
    for which in sets:
        reports.update(researcher_reports() if which == "researcher" else precision_reports(which))
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(reports, f, indent=0, sort_keys=True)
    os.replace(tmp, path)
    print(f"{len(reports)} reports written to {path}")
    return 0


def compare(before_path, after_path):
    before, after = (json.load(open(p)) for p in (before_path, after_path))
    missing = sorted(set(before) ^ set(after))
    differ = sorted(k for k in set(before) & set(after) if before[k] != after[k])
    for key in missing:
        print(f"only in {'the first' if key in before else 'the second'}: {key}")
    for key in differ:
        print(f"differs: {key}")
        lines = difflib.unified_diff(before[key].splitlines(), after[key].splitlines(), lineterm="", n=0)
        for line in list(lines)[2:12]:
            print("    " + line[:200])
    print(f"{len(set(before) & set(after))} reports compared: {len(differ)} differ, {len(missing)} on one side only")
    return 1 if differ or missing else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write", help="write every report's text to a JSON file")
    w.add_argument("out")
    w.add_argument("--sets", default="researcher,heldout,build")
    c = sub.add_parser("compare", help="the reports whose text differs between two such files")
    c.add_argument("before")
    c.add_argument("after")
    args = parser.parse_args()
    if args.command == "write":
        return write(args.out, args.sets.split(","))
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
