#!/usr/bin/env python3
"""A slip in part of a gradient, at a low precision: one row, one column or one batch element of x̄ a few percent
off, on the 16-bit or float32 path only (the float64 path right), in the right kernels of a precision set.

    PYTHONPATH=build/python /usr/bin/python3 python/tools/partial_table.py
        --set build|heldout|triton|ops|ops_heldout|ops_heldout2 [--seeds 2] [--sizes small,large]
        [--dtypes bf16,fp16,float32] [--factors 1.02,1.05] [--only NAME] [--device cuda] [--json FILE]

--set build and heldout are the fused kernels of python/tests/precision_build.py and precision_heldout.py (float32
inside), triton the held-out ones as Triton kernels (python/tests/precision_triton.py: a CUDA device); ops and
ops_heldout the kernels in torch ops at their dtype of python/tests/precision_ops16.py (BUILD and HELDOUT; sizes
small, large and 3d), and ops_heldout2 those of python/tests/precision_ops16c.py (CASES, held out again; the same
sizes). Each case's right kernel is wrapped (block_slips.one_block_off): its forward runs as it is, and its
backward's gradient of the first checked input has one block multiplied by a factor: "row" x̄[..., 1, :] (the row's
index 1 along the second-to-last axis, every leading index), "column" x̄[..., 1], and "batch" x̄[1] where x̄ has 3
or more axes. The slip is made only at the checked dtype, so fn in float64 is right and only the comparison
at the dtype can see it.

For each check the runner measures, independently of tapegrad, with one cotangent drawn in float64 and rounded to
the output's dtype, against the composite reference in float64 on the same rounded inputs:

    E_k  the slipped kernel's largest error over the slipped block
    E_c  the composite reference run at the dtype: its largest error over the same block

A slip is "material" when E_k ≥ 2·E_c (in the block where it is). Printed: per set and dtype the right checks and
their false failures, the material slips and their false passes, and the slips that are not material (how many of
them fail); then every false failure and false pass.
"""

import argparse
import json
import os
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from precision_table import DTYPES, OPS_SETS, TESTS, _leaves_like, load_ops_set, load_set  # noqa: E402

sys.path.insert(0, TESTS)
from block_slips import blocks, one_block_off  # noqa: E402


def block_errors(case, fn, xs, dtype, seed, slot, block):
    """(E_k, E_c) over the block of input slot's gradient."""
    gen = torch.Generator().manual_seed(10_000 + seed)
    with torch.no_grad():
        out = case.make("right")(*[x.detach() if isinstance(x, torch.Tensor) else x for x in xs])
    cot = torch.randn(out.shape, dtype=torch.float64, generator=gen)

    def grad(f, at):
        ins, checked = _leaves_like(xs, at)
        y = f(*ins)
        g = torch.autograd.grad(y, [ins[slot]], cot.to(y.dtype).to(y.device), allow_unused=True)[0]
        return g.detach().double().cpu()
    exact = grad(case.reference, torch.float64)
    e_k = (grad(fn, None) - exact)[block].abs().max().item()
    try:
        e_c = (grad(case.reference, dtype) - exact)[block].abs().max().item()
    except Exception:
        e_c = float("nan")
    return e_k, e_c


def _on(xs, device):
    """The inputs on device, the checked ones still leaves that require grad."""
    if device == "cpu":
        return xs
    return tuple(x.detach().to(device).requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x
                 for x in xs)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default="build",
                   choices=["build", "heldout", "triton", "ops", "ops_heldout", "ops_heldout2"])
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--sizes", default="small,large")
    p.add_argument("--dtypes", default="bf16,fp16,float32")
    p.add_argument("--factors", default="1.02,1.05")
    p.add_argument("--only", help="the case of this name alone")
    p.add_argument("--device", default="cpu", help="the device the inputs are moved to (the ops sets: cuda)")
    p.add_argument("--json")
    a = p.parse_args()
    import tapegrad
    cases = load_ops_set(a.set) if a.set in OPS_SETS else load_set(a.set)
    dtypes = [DTYPES[d] for d in a.dtypes.split(",")]
    factors = [float(f) for f in a.factors.split(",")]
    recs = []
    for case in [c for c in cases if a.only in (None, c.name)]:
        for size in a.sizes.split(","):
            for dtype in dtypes:
                if dtype == torch.float16 and not case.fp16_ok and a.device == "cpu":  # fp16_ok: on a CPU
                    continue
                for seed in range(1, a.seeds + 1):
                    xs = _on(case.inputs(size, dtype, seed), a.device)
                    slot = next(i for i, x in enumerate(xs) if isinstance(x, torch.Tensor) and x.requires_grad)
                    variants = [("right", None, 1.0)] + [(b, ix, f) for b, ix in blocks(tuple(xs[slot].shape)).items()
                                                         for f in factors]
                    for where, block, factor in variants:
                        fn = case.make("right")
                        if block is not None:
                            fn = one_block_off(fn, slot, block, factor, dtype)
                        start = time.perf_counter()
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")
                            try:
                                report = tapegrad.gradcheck(fn, xs, reference=case.reference, seed=seed)
                                passed, kinds = bool(report.passed), sorted(set(report.kinds))
                            except Exception as error:
                                passed, kinds = None, [f"{type(error).__name__}: {str(error)[:100]}"]
                        rec = dict(case=case.name, size=size, dtype=str(dtype)[6:], seed=seed, where=where,
                                   factor=factor, passed=passed, kinds=kinds, time=time.perf_counter() - start)
                        if block is not None:
                            rec["E_k"], rec["E_c"] = block_errors(case, fn, xs, dtype, seed, slot, block)
                            rec["material"] = rec["E_k"] >= 2 * rec["E_c"]
                        recs.append(rec)
                        print(json.dumps(rec), flush=True)
    print(f"\n{a.set}: per dtype, right / false failures / material slips / false passes / not material (failed)")
    for dt in sorted({r["dtype"] for r in recs}):
        sub = [r for r in recs if r["dtype"] == dt]
        right = [r for r in sub if r["where"] == "right"]
        slips = [r for r in sub if r["where"] != "right"]
        mat = [r for r in slips if r["material"]]
        imm = [r for r in slips if not r["material"]]
        print(f"  {dt:8s} {len(right):4d} {sum(r['passed'] is not True for r in right):4d} {len(mat):5d} "
              f"{sum(r['passed'] is True for r in mat):4d} {len(imm):5d} ({sum(r['passed'] is False for r in imm)})")
    for r in recs:
        if (r["where"] == "right" and r["passed"] is not True) or (r.get("material") and r["passed"] is True):
            print("  miss:", json.dumps(r))
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(recs, f)
        os.replace(tmp, a.json)


if __name__ == "__main__":
    main()
