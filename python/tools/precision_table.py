#!/usr/bin/env python3
"""tapegrad's check at low precision on a set of fused kernels: false failures of right kernels, false passes of
slips that matter at that precision, and whether a caught slip is named with its kind.

    PYTHONPATH=build/python /usr/bin/python3 python/tools/precision_table.py --set heldout|heldout3|build|triton
        [--seeds 3] [--first-seed 0] [--sizes small,large] [--dtypes bf16,float32] [--json FILE] [--only NAME]

--set heldout reads python/tests/precision_heldout.py, --set heldout3 precision_heldout3.py (a third set, written
apart from the first two), --set build python/tests/precision_build.py, --set triton
python/tests/precision_triton.py (the held-out ops as Triton kernels: a CUDA device and Triton needed); each exposes
CASES, a list of cases (name, make(variant) -> Function.apply, reference, f_reference, inputs(size, dtype, seed),
slips: name -> (kind, "low" | "all"), fp16_ok). --dtypes takes bf16, fp16 (cases with fp16_ok only) and float32.

For every case x size x dtype x seed x reference (the composite `reference`, and `f_reference` where it is not
None) x version (the right one and each slip; a slip marked "low" only at bf16/fp16) it runs

    tapegrad.gradcheck(case.make(version), inputs, reference=ref, seed=seed)

and records whether the report passed, the kinds it names (report.kinds) and its time. Besides, and independently
of tapegrad, the runner measures two errors per checked input, with one fixed cotangent ȳ per (case, size, dtype,
seed) drawn in float64 and rounded to the output's dtype, against the composite reference run in float64 on the
same (already rounded) inputs and the same ȳ:

    E_c   the composite reference itself run at the dtype (torch at bf16/float32, torch.autograd.grad): how far a
          plain torch implementation of the same math errs at that precision (max abs error of the input's gradient)
    E_k   the kernel's own VJP error (the version checked): max abs error of its gradient

A slip is "material" at a dtype (for one seed) when, for some input, E_k >= 2 * E_c and E_k > 1.5 * E_k of the
right version for that input: it errs clearly past what the composite's rounding does and past the right kernel.
A slip that is not material is one whose effect rounding at that precision can hide; failing it is not counted
against the checker and passing it is not a false pass.

Each slip marked "all" is also checked once per case and size in float64 (inputs cast to float64, no reference:
fn is its own reference, against finite differences) to record the kinds tapegrad names there.

Printed:
 (a) one table per dtype, a row per reference kind and one for both:
     right      right-version checks run
     false_fail right versions whose report did not pass
     material   material slip checks
     false_pass material slip checks whose report passed
     caught     material slip checks whose report failed
     named      caught checks that name the slip's annotated kind (ACCEPTED below)
     same64     caught checks of slips marked "all" that name a specific kind (not in NON_SPECIFIC) also named at
                float64 for that slip, out of those whose float64 report named a specific kind
     immat      slip checks that are not material / of which the report failed
     errors     checks that raised
     median_s   median time of one tapegrad check at that dtype (all versions)
 (b) every false failure and false pass (and error) with its E_k, E_c, the right version's E_k, and the report's
     verdict lines (those of str(report) with "max error", and its diagnosis lines)
 (c) per slip: its annotated kind, and per dtype how many of its checks were material, caught and named, and the
     kinds tapegrad named (at the dtype and at float64)

Exit status 0 after printing (a measuring tool), 2 when the set named cannot be imported.
"""

import argparse
import inspect
import json
import os
import statistics
import sys
import time
import warnings
from collections import Counter, defaultdict

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")
SETS = {"heldout": "precision_heldout", "heldout3": "precision_heldout3", "build": "precision_build",
        "triton": "precision_triton"}
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "float32": torch.float32}
LOW = (torch.bfloat16, torch.float16)

# tapegrad's kinds (tapegrad.finding_kinds()) that name each annotated kind of slip. The annotated key itself always
# counts, so a kind added to tapegrad under that name counts as soon as it exists. The others are the same slip
# described by its structure: a per-row term dropped is a dropped term; a sign or a factor of one term is a term
# with a wrong factor; a transposed operand is a term built from the wrong value.
ACCEPTED = {
    "sign": {"sign", "term_sign", "term_factor"},
    "scale": {"scale", "term_factor"},
    "per_row_term": {"per_row_term", "per_row_factor", "term_dropped", "term_factor"},
    "transposed": {"transposed", "transposed_jacobian", "transposed_input", "transposed_output", "transposed_term",
                   "wrong_value"},
    "dropped_term": {"dropped_term", "term_dropped", "zero"},
    "wrong_axis": {"wrong_axis", "transposed_input", "transposed_output"},
    # one batch element's (or block's) rows kept: a factor 0 or 1 per row of the batch
    "one_batch_element": {"one_batch_element", "one_row", "masked_positions", "per_row_factor"},
    "wrong_value": {"wrong_value"},
    "precision_defect": {"precision_defect"},
}

# Kinds that say where or how a check failed but not what the slip is; left out of the float64 comparison.
NON_SPECIFIC = {"unexplained", "one_input", "vjp_only", "jvp_only", "no_jvp", "tolerance", "consistent", "adjoint",
                "first_order", "hessian_block", "kink"}


def load_set(which):
    path = os.path.join(TESTS, SETS[which] + ".py")
    if not os.path.exists(path):
        print(f"{path} does not exist (yet): nothing to measure for --set {which}")
        raise SystemExit(2)
    sys.path.insert(0, TESTS)
    return __import__(SETS[which]).CASES


OPS_SETS = ("ops", "ops_heldout", "ops_heldout2")


def load_ops_set(which):
    """The kernels written in torch ops at their dtype: python/tests/precision_ops16.py's BUILD (ops) and HELDOUT
    (ops_heldout), python/tests/precision_ops16c.py's CASES (ops_heldout2, held out again)."""
    sys.path.insert(0, TESTS)
    if which == "ops_heldout2":
        return __import__("precision_ops16c").CASES
    module = __import__("precision_ops16")
    return module.HELDOUT if which == "ops_heldout" else module.BUILD


# ---------------------------------------------------------------------------------------------------------------
# The runner's own error measurement.

def _leaves_like(xs, dtype):
    """Fresh leaves: the floating inputs that require grad, detached and cast to dtype (None: kept), and the rest as
    they are. Returns (inputs, indices of the checked ones)."""
    out, checked = [], []
    for i, x in enumerate(xs):
        if isinstance(x, torch.Tensor) and x.is_floating_point():
            y = x.detach().to(dtype or x.dtype)
            if x.requires_grad:
                y.requires_grad_()
                checked.append(i)
            out.append(y)
        else:
            out.append(x)
    return out, checked


def _vjp(fn, xs, dtype, cotangent):
    """fn's gradients (cast to float64) at xs cast to dtype, with the cotangent cast to the output's dtype."""
    ins, checked = _leaves_like(xs, dtype)
    out = fn(*ins)
    grads = torch.autograd.grad(out, [ins[i] for i in checked], cotangent.to(out.dtype), allow_unused=True)
    return [torch.zeros_like(ins[i], dtype=torch.float64) if g is None else g.detach().double()
            for i, g in zip(checked, grads)]


def _max_errors(grads, exact, names):
    return {n: (g - e).abs().max().item() for n, g, e in zip(names, grads, exact)}


def measure(case, xs, dtype, seed, versions, names):
    """E_c (the composite reference at dtype) and E_k per version, per checked input, against the composite reference
    in float64 on the same rounded inputs, with one cotangent drawn in float64 and rounded to the output's dtype."""
    with torch.no_grad():
        out = case.make("right")(*[x.detach() if isinstance(x, torch.Tensor) else x for x in xs])
    gen = torch.Generator().manual_seed(10_000 + seed)
    cotangent = torch.randn(out.shape, dtype=torch.float64, generator=gen).to(out.dtype).to(out.device).double()
    exact = _vjp(case.reference, xs, torch.float64, cotangent)
    result = {"E_k": {}}
    try:
        result["E_c"] = _max_errors(_vjp(case.reference, xs, dtype, cotangent), exact, names)
    except Exception as error:  # the composite may not run at this dtype on the CPU
        result["E_c"], result["E_c_error"] = {n: float("nan") for n in names}, _first_line(error)
    for v in versions:
        try:
            result["E_k"][v] = _max_errors(_vjp(case.make(v), xs, None, cotangent), exact, names)
        except Exception as error:  # the version's own forward or backward raised: its check will say so too
            result["E_k"][v] = {n: float("nan") for n in names}
            result.setdefault("E_k_error", {})[v] = _first_line(error)
    return result


def is_material(e_k, e_c, e_right):
    """Some input errs by at least twice the composite's rounding error, and by more than 1.5x the right kernel."""
    return any(e_k[n] >= 2 * e_c[n] and e_k[n] > 1.5 * e_right[n] for n in e_k)


# ---------------------------------------------------------------------------------------------------------------
# tapegrad's check.

def _first_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def verdict_lines(text):
    """The lines of a report that say its verdict: each input's "max error" line and the diagnosis lines."""
    lines, in_diagnosis = [], False
    for line in text.splitlines():
        if line.strip() == "diagnosis:":
            in_diagnosis = True
        elif in_diagnosis and line.startswith("    "):
            lines.append(line.strip())
        else:
            in_diagnosis = False
            if "max error" in line:
                lines.append(line.strip())
    return lines


def run_check(fn, xs, reference, seed):
    """(record fields) of one tapegrad.gradcheck."""
    import tapegrad
    start = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report = tapegrad.gradcheck(fn, xs, reference=reference, seed=seed)
    except Exception as error:
        return {"passed": None, "error": _first_line(error), "time": time.perf_counter() - start,
                "kinds": [], "verdict": []}
    elapsed = time.perf_counter() - start
    text = str(report)
    return {"passed": bool(report.passed), "error": None, "time": elapsed, "kinds": sorted(set(report.kinds)),
            "diagnoses": [[d.kind, d.input] for d in report.diagnoses], "verdict": verdict_lines(text)}


def input_names(case, xs):
    try:
        params = list(inspect.signature(case.reference).parameters)
    except (TypeError, ValueError):
        params = []
    return [params[i] if i < len(params) else f"x{i}" for i, x in enumerate(xs)
            if isinstance(x, torch.Tensor) and x.requires_grad]


def run(cases, sizes, dtypes, seeds, log):
    records, float64 = [], []
    for case in cases:
        refs = [("composite", case.reference)] + ([("F", case.f_reference)] if case.f_reference else [])
        runs_at = {d: t for d, t in dtypes.items() if t != torch.float16 or getattr(case, "fp16_ok", False)}
        for d in set(dtypes) - set(runs_at):
            log(f"  {case.name}: {d} skipped (fp16_ok is False)")
        if not runs_at:
            continue
        for size in sizes:
            # The float64 check of each slip that exists at every precision: the kinds tapegrad names there.
            xs64 = case.inputs(size, torch.float64, seeds[0])
            for slip, (kind, where) in case.slips.items():
                if where != "all":
                    continue
                r = run_check(case.make(slip), xs64, None, seeds[0])
                float64.append({"case": case.name, "size": size, "version": slip, **r})
                log(f"  {case.name} {size} float64 {slip}: {'passed' if r['passed'] else 'failed'} {r['kinds']}")
            for dname, dtype in runs_at.items():
                versions = ["right"] + [s for s, (_, where) in case.slips.items() if where == "all" or dtype in LOW]
                for seed in seeds:
                    xs = case.inputs(size, dtype, seed)
                    names = input_names(case, xs)
                    try:
                        errors = measure(case, xs, dtype, seed, versions, names)
                    except Exception as error:  # the reference or the right version raised: no errors measured
                        nan = {n: float("nan") for n in names}
                        errors = {"E_c": nan, "E_k": {v: nan for v in versions},
                                  "E_c_error": f"measuring: {_first_line(error)}"}
                        log(f"  {case.name} {size} {dname} seed {seed}: {errors['E_c_error']}")
                    e_right = errors["E_k"]["right"]
                    for ref_name, ref in refs:
                        for v in versions:
                            kind, where = case.slips[v] if v != "right" else (None, None)
                            r = run_check(case.make(v), xs, ref, seed)
                            rec = {"case": case.name, "size": size, "dtype": dname, "seed": seed,
                                   "reference": ref_name, "version": v, "kind": kind, "where": where, **r,
                                   "E_k": errors["E_k"][v], "E_c": errors["E_c"], "E_k_right": e_right,
                                   "E_c_error": errors.get("E_c_error"),
                                   "E_k_error": errors.get("E_k_error", {}).get(v)}
                            rec["material"] = None if v == "right" else is_material(rec["E_k"], rec["E_c"], e_right)
                            records.append(rec)
                            log(f"  {case.name} {size} {dname} seed {seed} {ref_name} {v}: "
                                f"{'error' if r['error'] else 'passed' if r['passed'] else 'failed'} "
                                f"{r['kinds']} {r['time']:.2f}s"
                                + ("" if v == "right" else f" material={rec['material']}"))
    return records, float64


# ---------------------------------------------------------------------------------------------------------------
# Summaries.

def specific(kinds):
    return set(kinds) - NON_SPECIFIC


def named_as_annotated(rec):
    return bool(set(rec["kinds"]) & (ACCEPTED.get(rec["kind"], set()) | {rec["kind"]}))


def float64_kinds(float64):
    """(case, size, slip) -> the specific kinds the float64 check named."""
    return {(r["case"], r["size"], r["version"]): specific(r["kinds"]) for r in float64}


def tally(recs, kinds64):
    right = [r for r in recs if r["version"] == "right" and not r["error"]]
    slips = [r for r in recs if r["version"] != "right" and not r["error"]]
    material = [r for r in slips if r["material"]]
    caught = [r for r in material if not r["passed"]]
    caught_all = [r for r in caught if r["where"] == "all" and kinds64.get((r["case"], r["size"], r["version"]))]
    same64 = sum(bool(specific(r["kinds"]) & kinds64[(r["case"], r["size"], r["version"])]) for r in caught_all)
    immaterial = [r for r in slips if not r["material"]]
    return {
        "right": len(right),
        "false_fail": sum(not r["passed"] for r in right),
        "material": len(material),
        "false_pass": sum(bool(r["passed"]) for r in material),
        "caught": len(caught),
        "named": sum(named_as_annotated(r) for r in caught),
        "same64": f"{same64}/{len(caught_all)}",
        "immat": f"{len(immaterial)}/{sum(not r['passed'] for r in immaterial)}",
        "errors": sum(bool(r["error"]) for r in recs),
        "median_s": f"{statistics.median(r['time'] for r in recs):.2f}" if recs else "-",
    }


COLUMNS = ["right", "false_fail", "material", "false_pass", "caught", "named", "same64", "immat", "errors", "median_s"]


def print_tables(records, float64, dtypes):
    kinds64 = float64_kinds(float64)
    print("\n(a) per dtype")
    for dname in dtypes:
        recs = [r for r in records if r["dtype"] == dname]
        if not recs:
            continue
        print(f"\n{dname}")
        print(f"  {'reference':<10}" + "".join(f"{c:>11}" for c in COLUMNS))
        for label in ("composite", "F", "both"):
            sub = recs if label == "both" else [r for r in recs if r["reference"] == label]
            if sub:
                t = tally(sub, kinds64)
                print(f"  {label:<10}" + "".join(f"{t[c]!s:>11}" for c in COLUMNS))


def _errs(d):
    return ", ".join(f"{n} {v:.2e}" for n, v in d.items())


def print_misses(records):
    print("\n(b) false failures, false passes and errors")
    misses = [r for r in records if r["error"]
              or (r["version"] == "right" and not r["passed"]) or (r["material"] and r["passed"])]
    if not misses:
        print("  none")
    for r in misses:
        what = ("error" if r["error"] else "false failure" if r["version"] == "right"
                else f"false pass ({r['kind']}, {r['where']})")
        print(f"- {what}: {r['case']} {r['size']} {r['dtype']} seed {r['seed']} reference {r['reference']} "
              f"version {r['version']}")
        if r["error"]:
            print(f"    {r['error']}")
        if r.get("E_k_error"):
            print(f"    measuring E_k: {r['E_k_error']}")
        print(f"    E_k: {_errs(r['E_k'])}")
        print(f"    E_c: {_errs(r['E_c'])}" + (f"  ({r['E_c_error']})" if r.get("E_c_error") else ""))
        if r["version"] != "right":
            print(f"    E_k of the right version: {_errs(r['E_k_right'])}")
        for line in r["verdict"]:
            print(f"    | {line}")


def print_slips(records, float64, dtypes):
    print("\n(c) per slip: material/caught/named checks per dtype; kinds named")
    kinds64 = {(r["case"], r["version"]): set() for r in float64}
    for r in float64:
        kinds64[(r["case"], r["version"])] |= set(r["kinds"])
    by_slip = defaultdict(list)
    for r in records:
        if r["version"] != "right":
            by_slip[(r["case"], r["version"])].append(r)
    for (case, slip), recs in by_slip.items():
        parts = []
        for dname in dtypes:
            sub = [r for r in recs if r["dtype"] == dname and not r["error"]]
            if sub:
                m = [r for r in sub if r["material"]]
                c = [r for r in m if not r["passed"]]
                parts.append(f"{dname} {len(m)}/{len(c)}/{sum(named_as_annotated(r) for r in c)} of {len(sub)}")
        seen = Counter(k for r in recs for k in r["kinds"])
        line = f"  {case}.{slip} ({recs[0]['kind']}, {recs[0]['where']}): " + "; ".join(parts)
        line += f"; named {dict(seen.most_common())}" if seen else "; named nothing"
        if (case, slip) in kinds64:
            line += f"; float64 {sorted(kinds64[(case, slip)])}"
        print(line)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--set", choices=sorted(SETS), required=True)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 (from --first-seed)")
    parser.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--sizes", default="small,large")
    parser.add_argument("--dtypes", default="bf16,float32")
    parser.add_argument("--json", help="write every record here")
    parser.add_argument("--only", help="only the case of this name (comma-separated names allowed)")
    parser.add_argument("--quiet", action="store_true", help="no line per check while running")
    args = parser.parse_args()

    cases = load_set(args.set)
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if c.name in wanted]
        if not cases:
            print(f"no case named {args.only}")
            return 0
    sizes = [s for s in args.sizes.split(",") if s]
    dtypes = {d: DTYPES[d] for d in args.dtypes.split(",") if d}
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))

    def log(line):
        if not args.quiet:
            print(line, flush=True)

    start = time.perf_counter()
    records, float64 = run(cases, sizes, dtypes, seeds, log)
    total = time.perf_counter() - start

    print(f"\nset {args.set}: {len(cases)} cases, sizes {sizes}, dtypes {list(dtypes)}, seeds {seeds}: "
          f"{len(records)} checks at low precision and {len(float64)} in float64 in {total:.0f} s")
    print_tables(records, float64, dtypes)
    print_misses(records)
    print_slips(records, float64, dtypes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"records": records, "float64": float64, "seconds": total}, f, indent=1)
        print(f"\nrecords written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
