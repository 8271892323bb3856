"""An op checked at the precision and on the device it runs (bfloat16, float16, float32; CPU or CUDA).

The kernel is fn at the inputs as given. Its VJP x̄ₚ = J(x)ᵀȳ, computed at precision p, is compared with a float64
reference x̄₆₄ on exactly the rounded inputs x the kernel saw and the same ȳ (drawn, then rounded to p): the
reference is `reference` (composite torch ops: torch's own derivatives) or else fn itself in float64, whose VJP
the float64 check of the same report compares with finite differences first.

No tolerance is given: what rounding explains is measured (tapegrad/_rounding.py). The reference is run again with
each of its torch ops computed at p (forward and backward), on x and on x moved by about a unit in the last place
(x·(1 + u·ξ), ξ uniform in [−1, 1], rounded to p; at bf16 and fp16 against float64 at that point, at float32
against x̄₆₄, which adds the input's sensitivity at float32): how far that composite at p moves from float64 is what
a right computation at p errs here. Beside it: a fused kernel's model at bf16 and fp16 (only the products' operands at
p, float32 between), a float32 sum's error over the length of x̄'s sums, and the result's own rounding (half an ulp at
p of x̄₆₄'s largest element).
        B = 1.75 · the largest of them
(1.75, below 2: a rule erring twice what the composite at p errs fails). An input's row passes when
max |x̄ₚ − x̄₆₄| ≤ B, over DRAWS random ȳ, and, at bf16 and fp16, when the share of x̄₆₄ itself in that error is
within what rounding's independent errors give it (a scale under an ulp fails there); the forward's value is held
to the same measure.

An error past B is a slip or a precision defect (tapegrad/_precision_names.py): a slip where the checker's
structural diagnoses, run on the kernel's VJP against the reference's Jacobian (finite differences of the float64
reference) with the measured rounding as the tolerance, name it; else a defect where it shrinks with the precision
and does not add up in ȳ, as a long sum accumulated at p makes it; else unexplained.
"""

import torch

from . import _tapegrad
from ._averaged import AVERAGED_SE, AVERAGED_UNITS, judge_averaged
from ._blocks import FLOOR, OWN
from ._precision_names import PrecisionCheck, name_precision_failures
from ._rounding import (DRAWS, DTYPE_NAMES, FIGURES, LOOSE, MARGIN, OWN_CAP, SIGMAS, UNIT_ROUNDOFF, ArithmeticAt,
                        _Run, compare, within)


def _precision_of(inputs, slots):
    """(dtype, device) of the check: the lowest precision among the checked inputs, and their one device."""
    checked = [inputs[i] for i in slots]
    for i, x in zip(slots, checked):
        if not (isinstance(x, torch.Tensor) and x.is_floating_point()):
            raise ValueError(f"gradcheck: input {i} is {type(x).__name__}; at a precision below float64 or on a "
                             "device, every checked input is a floating-point torch tensor")
        if x.dtype not in UNIT_ROUNDOFF:
            raise ValueError(f"gradcheck: input {i} has dtype {x.dtype}; the precisions checked are bfloat16, "
                             "float16, float32 and float64")
    devices = {str(x.device) for x in checked}
    if len(devices) != 1:
        raise ValueError(f"gradcheck: the checked inputs are on {len(devices)} devices ({', '.join(sorted(devices))}); "
                         "an op runs on one")
    dtype = max((x.dtype for x in checked), key=lambda d: UNIT_ROUNDOFF[d])
    return dtype, checked[0].device


def _explained(what, error, bound, ok, dtype):
    """The report's line for one compared value: "x: max error E; rounding at bf16 explains up to B here"."""
    return (f"{what}: max error {error:.2g}; rounding at {DTYPE_NAMES[dtype]} {'explains' if ok else 'explains only'} "
            f"up to {bound:.2g} here")


def _said(p, terms):
    """How a report names each figure of rounding at p (terms: the length of the float32 sum)."""
    return {"composite": f"the reference's own error with its ops at {p}",
            "fused": "a fused kernel's (float32 between products)",
            "sums": f"a float32 sum of {terms:.0f} terms",
            "storage": f"the result's rounding to {p}",
            "own": f"how far the op's own ops at {p} move it with their roundings falling otherwise",
            "cap": "a fused kernel's own error (its result's rounding, products' operands and float32 sums, added)"}


def _forward_figures(comparison, dtype):
    """Which figure judged y's bound, and the others: " (1.75 × a float32 sum of 64 terms, 9e-06; ...)"."""
    f = comparison.forward_figures
    said = _said(DTYPE_NAMES[dtype], f["terms"])
    said["storage"] = f"an ulp of y at {DTYPE_NAMES[dtype]}"
    shown = [k for k in ("composite", "sums", "storage") if k != "sums" or f["sums"] > 0]
    judge = max(shown, key=lambda k: f[k])
    return f" ({MARGIN:g} × {said[judge]}, {f[judge]:.2g}" + "".join(
        f"; {said[k]} {f[k]:.2g}" for k in shown if k != judge) + ")"


def _figures(comparison, i, dtype):
    """Which figure judged input i, and the others: "(1.75 × the reference's own error with its ops at bf16, ...)"."""
    f, p = comparison.figures[i], DTYPE_NAMES[dtype]
    said = _said(p, f["terms"])
    shown = [k for k in FIGURES if not (k in ("fused", "own") and f[k] == 0) and not (k == "sums" and f["terms"] <= 1)]
    judge = comparison.judged_by(i)
    value = f["cap"] if judge == "cap" else f[judge]
    others = "".join(f"; {said[k]} {f[k]:.2g}" for k in shown if k != judge)
    text = f" ({MARGIN:g} × {said[judge]}, {value:.2g}{others})"
    tight = max(f["fused"], f["storage"])
    if judge == "cap":
        text += (f"; the op rounds in no torch op at {p}, so it is held to a fused kernel's arithmetic, not to "
                 f"torch's ops at {p}")
    elif f["fused"] > 0 and f["composite"] > LOOSE * tight:
        text += (f"; torch's own ops at {p} err {f['composite'] / tight:.0f}× a fused kernel's here (a sum or a "
                 f"product kept at {p} on this device), and the op rounds in torch ops at {p} too: an error up to "
                 "theirs passes")
        if comparison.error_within(i) and comparison.error[i] > MARGIN * tight:
            text += (f"; this op errs {comparison.error[i] / tight:.0f}× a fused kernel's, as a value kept at {p} "
                     "does: a reference of composite torch ops, if its own are not loose, tells whether one is")
    return text


def check_at_precision(call, float64_report):
    """The report of call.fn at its inputs' precision and device (see the module's text): call is gradcheck's call
    (its op, inputs, checked slots and names, name, kwargs, reference and options). float64_report() runs the usual
    float64 check of fn on the inputs cast to CPU float64 tensors: first where no reference is given, and with a
    reference only to name a failure that fn's float64 path makes too."""
    fn, inputs, slots, names, name = call.fn, call.inputs, call.slots, call.names, call.name
    reference, seed = call.reference, call.options.seed
    dtype, device = _precision_of(inputs, slots)
    kwargs = dict(call.kwargs or {})
    if dtype == torch.float64 and reference is None:  # float64 on a device: fn is its own reference
        report = float64_report()
        report._notes = [f"device: {device}: the op ran there; what was compared came to the CPU"] + \
            getattr(report, "_notes", [])
        return report
    where = DTYPE_NAMES[dtype] + ("" if device.type == "cpu" else f" on {device}")
    generator = torch.Generator().manual_seed(int(seed))
    ref_fn = fn if reference is None else reference
    ref_name = name if reference is None else (getattr(reference, "__name__", None) or type(reference).__name__)

    kernel = _Run(fn, list(inputs), slots, kwargs, f"{name} at {where}", mode=ArithmeticAt(dtype))
    # blocks an op in torch ops at dtype puts FLOOR units along themselves, judged with its roundings averaged out
    comparison = compare(kernel, ref_fn, dtype, generator, f"the reference {ref_name} in float64",
                         composed=reference is not None, averaged=lambda c: judge_averaged(c, dtype, seed))

    report = float64_report() if reference is None else _tapegrad._merge([], [], name)
    if reference is None:
        head = (f"precision: {name} at {where}, its VJP against {name} itself in float64 on the same rounded inputs "
                f"(its rows above: float64 against finite differences)")
    else:
        head = (f"precision: {name} at {where}, its VJP against the reference {ref_name} in float64 (torch's "
                "derivatives of its ops) on the same rounded inputs")
    if reference is None and any(d.kind == "rounds_inside" for d in report.diagnoses):
        head += (f"; {name} in float64 rounds inside too, so it cannot be its own reference: give reference= the "
                 "op's math in float64 composite torch ops")
    elif reference is None and not report.passed:
        head += (f"; its float64 rows fail, so the slip is in every precision (the {DTYPE_NAMES[dtype]} rows "
                 "compare it with itself)")
    notes = [head, f"rounding: {MARGIN:g} × the largest of: how far {ref_name} moves with each of its ops computed at "
             f"{DTYPE_NAMES[dtype]} (on x and on x moved by an ulp), a fused kernel's model, a float32 sum over the "
             f"length of x̄'s sums, the result's own rounding"
             + (f", how far {name}'s own ops at {DTYPE_NAMES[dtype]} move it with their roundings falling otherwise "
                f"(up to {OWN_CAP:g} × the reference's figure)" if comparison.own_sampled else "")
             + f"; over {DRAWS} random ȳ"]
    check = f"vjp {DTYPE_NAMES[dtype]}"
    for i, input_name in enumerate(names):
        ok = comparison.passed(i)
        at = "" if comparison.worst[i] is None else f"{input_name}[{', '.join(map(str, comparison.worst[i]))}]"
        analytic, numeric = comparison.values[i]
        _tapegrad._add_check(report, dict(input=input_name, check=check, mode="random", passed=ok,
                                          error=comparison.error[i], worst=at, analytic=analytic, numeric=numeric,
                                          sides=(DTYPE_NAMES[dtype], "reference")))
        notes.append(_explained(input_name, comparison.error[i], comparison.bound[i], comparison.error_within(i), dtype)
                     + _figures(comparison, i, dtype))
        if comparison.element_excess[i] is not None and within(comparison.error[i], comparison.bound[i]):
            # the largest error is within the bound: the element past its own rounding is what fails the row
            index, error, value, own, others = comparison.element_excess[i]
            notes.append(f"{input_name}: at {input_name}[{', '.join(map(str, index))}], where {input_name}̄ is "
                         f"{value:.3g}, the error is {error:.2g}; rounding explains up to {max(own, others):.2g} there "
                         f"({MARGIN:g} × its own rounding to {DTYPE_NAMES[dtype]}, {own / MARGIN:.2g}; "
                         f"{MARGIN:g} × the other figures, {others / MARGIN:.2g})")
        if not comparison.along_passed(i):
            r = comparison.along[i]
            notes.append(f"{input_name}: its error is of one piece along {input_name}̄ itself, "
                         f"{input_name}̄ₚ ≈ (1 {'−' if r < 0 else '+'} {abs(r):.2g})·{input_name}̄₆₄ + the rest; "
                         f"rounding's independent errors explain a share up to {comparison.along_bound[i]:.2g} here")
        block = comparison.block_alone[i] or (comparison.block_excess[i] if comparison.only_a_block_fails(i) else None)
        if block is not None and block.runs:  # a block past rounding with the op's roundings averaged out
            notes.append(f"{input_name}: in {input_name}̄{block.place} ({block.words}), {FLOOR} units of "
                         f"{DTYPE_NAMES[dtype]}'s roundoff or more along itself in one run, its share along "
                         f"{input_name}̄ there averaged over "
                         f"{block.runs} runs × {DRAWS} ȳ with each of {name}'s roundings at {DTYPE_NAMES[dtype]} made "
                         f"stochastic is {block.r:+.2g} ({abs(block.r) / UNIT_ROUNDOFF[dtype]:.1f} units of "
                         f"{DTYPE_NAMES[dtype]}'s roundoff): rounding averaged out explains up to {block.bound:.2g} "
                         f"there ({AVERAGED_UNITS} units, or {AVERAGED_SE} standard errors of that mean), so the "
                         "formula itself is off in that block")
        elif comparison.averaged_runs and comparison.blocks[i] is not None and comparison.blocks[i].to_average and \
                not comparison.blocks[i].averaged_past:
            count = len(comparison.blocks[i].to_average)
            notes.append(f"{input_name}: {count} block{'s' if count > 1 else ''} of {input_name}̄ {FLOOR} units of "
                         f"{DTYPE_NAMES[dtype]}'s roundoff or more along {'themselves' if count > 1 else 'itself'} in "
                         f"one run {'are' if count > 1 else 'is'} within rounding with "
                         f"{name}'s roundings averaged out ({comparison.averaged_runs} runs × {DRAWS} ȳ, each rounding "
                         f"at {DTYPE_NAMES[dtype]} made stochastic; up to {AVERAGED_UNITS} units or {AVERAGED_SE} "
                         "standard errors of the mean)")
        if block is not None and not block.runs:  # the block alone failing the row, or the one block past its bound
            place, r = block.place, block.r
            notes.append(f"{input_name}: in {input_name}̄{place} ({block.words}) its error is of one piece along "
                         f"{input_name}̄ there, {input_name}̄ₚ ≈ (1 {'−' if r < 0 else '+'} {abs(r):.2g})·"
                         f"{input_name}̄₆₄ + the rest; rounding explains a share up to {block.bound:.2g} in that block "
                         f"(the largest of {MARGIN:g} × the composite's there, {SIGMAS:g} σ of independent errors, "
                         + (f"{OWN:g} × the op's own roundings' there, " if comparison.own_sampled else "")
                         + f"and {FLOOR} units of {DTYPE_NAMES[dtype]}'s roundoff)")
    forward_ok = comparison.forward_passed()
    _tapegrad._add_check(report, dict(input="y", check=f"forward {DTYPE_NAMES[dtype]}", mode="exact",
                                      passed=forward_ok, error=comparison.forward_error, worst="",
                                      analytic=comparison.forward_error, numeric=comparison.forward_bound,
                                      sides=("error", "bound")))
    notes.append(_explained("y", comparison.forward_error, comparison.forward_bound, forward_ok, dtype)
                 + _forward_figures(comparison, dtype))
    failing = [i for i in range(len(names)) if not comparison.passed(i)]
    if failing:
        context = PrecisionCheck(fn, ref_fn, inputs, slots, names, kwargs, dtype, device, seed, check,
                                 float64_report if reference is not None else None, comparison)
        name_precision_failures(report, context, failing)
    report._notes = getattr(report, "_notes", []) + notes
    return report
