#!/usr/bin/env python3
"""Both checkers on researcher-style ops: which slips each catches, what tapegrad names them, and how long each takes.

    PYTHONPATH=build/python /usr/bin/python3 python/tools/slip_table.py [--size small|large|both] [--only OP]
                                                  [--repeat 3] [--json FILE] [--set FILE] [--first-order]
                                                  [--no-torch] [--torch-full] [--right-only]

The ops and their slips are python/tests/researcher_ops.py: torch.autograd.Functions with a hand-written backward,
each with its right version and slips annotated with the kind of slip they are; --set FILE reads another module
with the same names (OPS, make, inputs, KINDS, GENERIC, EXPECTED), a set of ops kept apart from the one the checker
was built on. For every (op, version) and size:

  torch      torch.autograd.gradcheck, and gradgradcheck where the second order is checked; an exception from
             either is "caught" (torch says only that it failed, and where)
  tapegrad   tapegrad.gradcheck, and gradcheck(order=2) where the second order is checked; a report that fails is
             "caught", an exception is an "error" (neither a catch nor a pass)

The second order is checked for the right versions (their backwards are torch ops, so they have a double backward)
and for the slips of kind second_order_only. Both checkers use the same step and tolerance (eps 1e-6, atol 1e-5,
rtol 1e-3). At the small size both use full Jacobians; at the large one tapegrad picks random projections itself
(every op has an input whose Jacobian has more than 40,000 entries) and torch is run with fast_mode=True, its own
projections, as one would at that size (on a failure torch's fast mode computes the full Jacobians again for its
message, so its large times on caught slips are those of a full check). --torch-full runs torch in full mode at the
large size too: its default, which compares every Jacobian entry, and the peer for a right version's time.
--right-only measures the right versions alone (their verdicts and times).

Per slip the kinds tapegrad named are those of its report's diagnoses (Report.diagnoses[i].kind, the keys that
tapegrad.finding_kinds() lists). A kind is "specific" unless it is in GENERIC; it is "expected" when it is in
EXPECTED[the slip's annotated kind]. Times are the median of --repeat runs of each check, first and second order
together; the ratio tapegrad/torch is taken per version on the small size.
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import researcher_ops as R  # noqa: E402
import tapegrad  # noqa: E402

GENERIC, EXPECTED = R.GENERIC, R.EXPECTED  # what counts as a name, kept with the set they measure

EPS, ATOL, RTOL = 1e-6, 1e-5, 1e-3
SECOND_ORDER = True  # --first-order: a set whose backwards are not written to be differentiated again
WITH_TORCH = True    # --no-torch: tapegrad's verdicts and names alone (torch's columns then read "skipped")
TORCH_FULL = False   # --torch-full: torch in full mode at the large size too
OUT_OF_MEMORY = "out of memory"  # torch's status where its Jacobians do not fit: neither a catch nor a pass


def _first_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:160]


def _timed(check, repeat):
    """(the check's result, the median of its times in seconds)."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = check()
        times.append(time.perf_counter() - start)
    return result, statistics.median(times)


def _torch_check(fn, xs, order, fast):
    check = torch.autograd.gradcheck if order == 1 else torch.autograd.gradgradcheck
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check(fn, xs, eps=EPS, atol=ATOL, rtol=RTOL, fast_mode=fast)
        return {"status": "pass"}
    except MemoryError as error:  # torch's Jacobians past the memory there is (full mode at the large size)
        return {"status": OUT_OF_MEMORY, "message": _first_line(error)}
    except Exception as error:  # gradcheck's GradcheckError, or the op failing under its calls: both are catches
        if "DefaultCPUAllocator" in str(error) or "not enough memory" in str(error):
            return {"status": OUT_OF_MEMORY, "message": _first_line(error)}
        return {"status": "caught", "message": _first_line(error)}


def _tapegrad_check(fn, xs, order):
    try:
        # At the large size tapegrad chooses (projections where m·n > 40,000, as the summary says), as a user
        # who passes nothing gets; torch is asked for its fast mode, which it would not choose itself.
        report = tapegrad.gradcheck(fn, xs, order=order, eps=EPS, atol=ATOL, rtol=RTOL)
    except Exception as error:
        return {"status": "error", "message": _first_line(error), "kinds": [], "findings": []}
    findings = [{"kind": d.kind, "input": d.input, "check": d.check, "message": d.message} for d in report.diagnoses]
    return {"status": "pass" if report.passed else "FAIL", "kinds": sorted({d.kind for d in report.diagnoses}),
            "findings": findings, "modes": sorted({c.mode for c in report.checks if not c.skipped})}


def run_version(op, version, size, repeat):
    spec = R.OPS[op]
    expected = "right" if version == "right" else spec.slips[version].kind
    orders = [1, 2] if (version == "right" or expected == "second_order_only") and SECOND_ORDER else [1]
    fn = R.make(op, version).apply
    fast = size == "large" and not TORCH_FULL
    row = {"op": op, "version": version, "size": size, "expected": expected,
           "description": "" if version == "right" else spec.slips[version].description,
           "torch": {}, "tapegrad": {}, "time_torch": 0.0, "time_tapegrad": 0.0}
    for order in orders:
        if WITH_TORCH:
            xs = R.inputs(op, size)
            result, seconds = _timed(lambda: _torch_check(fn, xs, order, fast), repeat)
            row["torch"][order] = result
            row["time_torch"] += seconds
        else:
            row["torch"][order] = {"status": "skipped"}
        xs = R.inputs(op, size)
        result, seconds = _timed(lambda: _tapegrad_check(fn, xs, order), repeat)
        row["tapegrad"][order] = result
        row["time_tapegrad"] += seconds
    row["torch_caught"] = any(r["status"] not in ("pass", "skipped", OUT_OF_MEMORY) for r in row["torch"].values())
    row["torch_out_of_memory"] = any(r["status"] == OUT_OF_MEMORY for r in row["torch"].values())
    row["tapegrad_caught"] = any(r["status"] == "FAIL" for r in row["tapegrad"].values())
    row["tapegrad_error"] = any(r["status"] == "error" for r in row["tapegrad"].values())
    kinds = sorted({k for r in row["tapegrad"].values() if r["status"] == "FAIL" for k in r["kinds"]})
    row["kinds"] = kinds
    specific = [k for k in kinds if k not in GENERIC]
    row["specific"] = bool(specific)
    accepted = EXPECTED.get(expected, set()) | {expected}
    row["expected_named"] = (bool(specific) if expected == "other" else any(k in accepted for k in kinds)) \
        if version != "right" else None
    return row


def _mark(flag):
    return "yes" if flag else "—"


def _status(results):
    return " / ".join(results[o]["status"] for o in sorted(results))


def print_op_table(op, rows):
    print(f"\n### {op} ({rows[0]['size']})\n")
    print("| version | expected | torch | tapegrad | kinds named | specific | expected named | torch ms | "
          "tapegrad ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        errors = [v["message"] for v in r["tapegrad"].values() if v["status"] == "error"]
        kinds = ", ".join(r["kinds"]) or ("error: " + errors[0][:90] if errors else "")
        print(f"| {r['version']} | {r['expected']} | {_status(r['torch'])} | {_status(r['tapegrad'])} | {kinds} | "
              f"{'' if r['version'] == 'right' else _mark(r['specific'])} | "
              f"{'' if r['version'] == 'right' else _mark(r['expected_named'])} | "
              f"{1000 * r['time_torch']:.1f} | {1000 * r['time_tapegrad']:.1f} |")


def _percent(part, whole):
    return f"{part}/{whole} ({100.0 * part / whole:.0f}%)" if whole else "0/0"


def summary(rows, size):
    rows = [r for r in rows if r["size"] == size]
    if not rows:
        return
    rights = [r for r in rows if r["version"] == "right"]
    slips = [r for r in rows if r["version"] != "right"]
    torch_mode = "torch full mode" if TORCH_FULL else "torch fast_mode"
    print(f"\n## Summary ({size}: {'full Jacobians' if size == 'small' else 'tapegrad chooses; ' + torch_mode})\n")
    right_torch = [r for r in rights if not r["torch_caught"]]
    right_tape = [r for r in rights if not r["tapegrad_caught"] and not r["tapegrad_error"]]
    torch_said = _percent(len(right_torch), len(rights)) if WITH_TORCH else "not run"
    print(f"- right versions passing: torch {torch_said}, tapegrad {_percent(len(right_tape), len(rights))}")
    for r in rights:
        if r not in right_tape:
            what = [v.get("message", "") or ", ".join(v["kinds"]) for v in r["tapegrad"].values()
                    if v["status"] != "pass"]
            print(f"  - tapegrad fails right {r['op']}: {'; '.join(dict.fromkeys(what))}")
        if r not in right_torch:
            what = [v["message"] for v in r["torch"].values() if v["status"] != "pass"]
            print(f"  - torch fails right {r['op']}: {'; '.join(dict.fromkeys(what))}")
    caught_by_torch = _percent(sum(r['torch_caught'] for r in slips), len(slips)) if WITH_TORCH else "not run"
    print(f"- slips caught: torch {caught_by_torch}, "
          f"tapegrad {_percent(sum(r['tapegrad_caught'] for r in slips), len(slips))}")
    missed = [r for r in slips if r["torch_caught"] and not r["tapegrad_caught"]]
    print(f"- slips torch catches that tapegrad misses: {len(missed)}")
    for r in missed:
        why = dict.fromkeys(v.get("message", "passed")[:110] for v in r["tapegrad"].values())
        print(f"  - {r['op']}/{r['version']} ({r['expected']}): tapegrad {_status(r['tapegrad'])} {'; '.join(why)}")
    extra = [r for r in slips if r["tapegrad_caught"] and not r["torch_caught"]]
    print(f"- slips tapegrad catches that torch misses: {len(extra)}"
          + ("".join(f"\n  - {r['op']}/{r['version']}" for r in extra)))
    print(f"- named with a specific kind: {_percent(sum(r['specific'] for r in slips), len(slips))}")
    print(f"- named with the expected kind: {_percent(sum(bool(r['expected_named']) for r in slips), len(slips))}")
    ratios = [r["time_tapegrad"] / r["time_torch"] for r in rows
              if r["time_torch"] > 0 and not r["torch_out_of_memory"]]
    out_of_memory = [r for r in rows if r["torch_out_of_memory"]]
    if out_of_memory:
        print(f"- torch ran out of memory on {len(out_of_memory)} (their times left out of the ratio): "
              + ", ".join(f"{r['op']}/{r['version']}" for r in out_of_memory))
    if ratios:
        print(f"- time tapegrad/torch per version: median {statistics.median(ratios):.2f}× "
              f"(min {min(ratios):.2f}×, max {max(ratios):.2f}×); "
              f"total torch {sum(r['time_torch'] for r in rows):.1f} s,"
              f" tapegrad {sum(r['time_tapegrad'] for r in rows):.1f} s")
    print("\n| expected kind | slips | torch caught | tapegrad caught | specific | expected | kinds named (count) |")
    print("|---|---|---|---|---|---|---|")
    for kind in R.KINDS:
        group = [r for r in slips if r["expected"] == kind]
        if not group:
            continue
        named = {}
        for r in group:
            for k in r["kinds"] or ["(none)"]:
                named[k] = named.get(k, 0) + 1
        names = ", ".join(f"{k} {n}" for k, n in sorted(named.items(), key=lambda kv: (-kv[1], kv[0])))
        print(f"| {kind} | {len(group)} | {sum(r['torch_caught'] for r in group)} | "
              f"{sum(r['tapegrad_caught'] for r in group)} | {sum(r['specific'] for r in group)} | "
              f"{sum(bool(r['expected_named']) for r in group)} | {names} |")
    known = set(GENERIC).union(*EXPECTED.values())
    unmapped = sorted({k for r in slips for k in r["kinds"]} - known)
    if unmapped:
        print(f"\nkinds named that neither GENERIC nor EXPECTED lists (counted specific, never expected): "
              f"{', '.join(unmapped)}")


def _use_set(path):
    """Measures the ops of the module at path instead of researcher_ops.py."""
    global R, GENERIC, EXPECTED
    import importlib.util
    spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
    spec.loader.exec_module(module)
    R, GENERIC, EXPECTED = module, module.GENERIC, module.EXPECTED


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=["small", "large", "both"], default="both")
    parser.add_argument("--only", action="append", metavar="OP", help=f"one op (repeatable): {', '.join(R.OPS)}")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each check; the median time is kept")
    parser.add_argument("--json", metavar="FILE", help="write every row as JSON")
    parser.add_argument("--set", metavar="FILE", help="a module of ops with researcher_ops.py's names to measure")
    parser.add_argument("--first-order", action="store_true", help="check the first order only")
    parser.add_argument("--no-torch", action="store_true", help="run tapegrad alone (its names, not the comparison)")
    parser.add_argument("--torch-full", action="store_true", help="torch in full mode at the large size too")
    parser.add_argument("--right-only", action="store_true", help="the right versions alone")
    args = parser.parse_args()
    if args.set:
        _use_set(args.set)
    global SECOND_ORDER, WITH_TORCH, TORCH_FULL
    SECOND_ORDER, WITH_TORCH, TORCH_FULL = not args.first_order, not args.no_torch, args.torch_full
    if args.repeat < 1:
        parser.error(f"--repeat must be at least 1, got {args.repeat}")
    for op in args.only or []:
        if op not in R.OPS:
            parser.error(f"--only: no op {op!r}; the ops are {', '.join(R.OPS)}")
    torch.set_num_threads(1)
    sizes = ["small", "large"] if args.size == "both" else [args.size]
    ops = args.only or list(R.OPS)
    print(f"{len(ops)} ops, {sum(len(R.OPS[o].slips) for o in ops)} slips; torch {torch.__version__}")
    rows = []
    for size in sizes:
        for op in ops:
            versions = ["right"] if args.right_only else R.OPS[op].versions
            op_rows = [run_version(op, version, size, args.repeat) for version in versions]
            print_op_table(op, op_rows)
            sys.stdout.flush()
            rows += op_rows
    for size in sizes:
        summary(rows, size)
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1, ensure_ascii=False)
            out.write("\n")


if __name__ == "__main__":
    main()
