"""What an error past rounding's bound is (tapegrad/_precision.py): a precision defect, or a slip, named by the
checker's structural diagnoses. In the order tried:

A scale under an ulp: an error within the bound at every element that fails by its share along x̄ (r, _rounding.py)
is a constant factor where what is left of it is rounding's size.

A sign: x̄ₚ = −x̄₆₄ at every element for every ȳ drawn, what is left within the bound, read from the compared
vectors alone, before any check that runs fn again. (Another such constant factor c is a scale, named last, where
nothing else says more: how it grows with a batch's length, the forward's term it is in.)

A slip of every precision: with a reference, where fn run in float64 on the same values errs against it as it does
at p (to within the bound) and by more than the bound, fn's own float64 check names it, reading it at full precision
and from the forward's terms.

Precision defect: the error shrinks with the precision, as rounding's does and a wrong rule's does not: the same
kernel at float32 on the same values errs by at most SHRINK times its error at p (a rounding error falls by
u₃₂/uₚ = 2⁻¹⁶ from bf16, a slip's stays), and its error at p is at most DEFECT_UNITS units of p's roundoff relative
to |x̄₆₄| (a sum kept at p errs by about u·√n to u·n relative, n its length; a slip of the 16-bit path alone, which
also vanishes at float32, errs by a part of |x̄| itself); and its errors do not add up: with e(ȳ) = x̄ₚ(ȳ) − x̄₆₄(ȳ),
e(ȳ₁ + ȳ₂) − e(ȳ₁) − e(ȳ₂) is at least ADDS_UP of e's size. A wrong rule's error is linear in ȳ, as the rule is;
rounding's is not. A slip of the 16-bit path too small to tell from rounding this way is called neither.

Slip: the C++ checker runs on an op whose forward is the reference in float64 (its Jacobian from its backward where
a reference is given, else from finite differences: tapegrad/_kernel_against_reference.py) and whose VJP is the
kernel's at p, one failing input at a time, so that
scale, sign, transposed, per-row and the other structural kinds are read from the kernel's error: on the inputs cut
along y's leading axes where the Jacobians are large (full Jacobians, with the measured rounding as the tolerance),
else on the whole inputs' random projections (with B). The structural kinds come first: a slip of the 16-bit path
alone also shrinks with the precision.
"""

import math
import re
from dataclasses import dataclass, field

import numpy as np
import torch

from . import _tapegrad
from ._rounding import DTYPE_NAMES, MARGIN, UNIT_ROUNDOFF, _cast, _cotangents, _Run, float32_between, largest_past
from ._callables import above_the_limit
from ._cut import CUT_LIMIT, ON_A_CUT, cut_along_y, first_rows, fitting_cut, full_jacobian_there
from ._forward_record import SEARCH_SPENT
from ._kernel_against_reference import kernel_against_reference

SHRINK = 2.0**-8       # float32's error at most this part of p's: it shrank with the precision
DEFECT_UNITS = 32      # a precision defect's error is at most this many units of p's roundoff relative to |x̄₆₄|
ADDS_UP = 0.25         # errors that fail to add up by this part of their size are rounding's, not a rule's
SCALE_REST = 1.5        # an error of one piece is a scale where what is left of it is at most this × rounding's rms


@dataclass
class PrecisionCheck:
    """One check of fn at a precision (tapegrad/_precision.py), as its passes read it: the op and its reference, the
    inputs as given and which of them are checked (slots, names), fn's keyword arguments, the precision and device,
    the seed, the report's check ("vjp bf16"), the comparison once measured (_rounding.compare), and float64_report:
    fn's own float64 check, where a reference is given (to name a slip fn's float64 path makes too), else None."""
    fn: object
    ref_fn: object
    inputs: list
    slots: list
    names: list
    kwargs: dict
    dtype: torch.dtype
    device: torch.device
    seed: int
    check: str
    float64_report: object = None
    comparison: object = None
    measured: dict = field(default_factory=dict)  # what _once measured, by name


def _once(c, measure):
    """measure(c), run once per check: the naming of each failing input asks for the same float32 errors and
    additivity (both drawn from the check's own seed), and a second run would give the same."""
    if measure.__name__ not in c.measured:
        c.measured[measure.__name__] = measure(c)
    return c.measured[measure.__name__]


def _nonadditive(c):
    """Per checked input, ‖e(ȳ₁ + ȳ₂) − e(ȳ₁) − e(ȳ₂)‖∞ / max(‖e(ȳ₁)‖∞, ‖e(ȳ₂)‖∞), e the kernel's error against the
    reference in float64 (the comparison's own runs of both); ȳ₁ + ȳ₂ is rounded to the output's dtype and given to
    both as it is."""
    kernel, reference = c.comparison.kernel, c.comparison.reference64
    generator = torch.Generator().manual_seed(int(c.seed) + 3)
    first, second = ([torch.randn(tuple(y.shape), generator=generator, dtype=torch.float64).to(y.dtype)
                      .to(torch.float64) for y in kernel.ys] for _ in range(2))
    both = [(a + b).to(y.dtype).to(torch.float64) for a, b, y in zip(first, second, kernel.ys)]
    errors = [[k - r for k, r in zip(kernel.vjp(g), reference.vjp(g))] for g in (first, second, both)]
    ratios = []
    for e1, e2, e12 in zip(*errors):
        size = max(float(np.max(np.abs(e1), initial=0.0)), float(np.max(np.abs(e2), initial=0.0)))
        ratios.append(float(np.max(np.abs(e12 - e1 - e2), initial=0.0)) / size if size > 0 else 0.0)
    return ratios


def _float32_errors(c):
    """Per checked input, the kernel's largest error at float32 on the same values against the reference in float64,
    over DRAWS random ȳ (drawn as a comparison at float32 draws them, from the check's seed); None where the kernel
    does not run at float32. Only the errors: the figures of rounding at float32 judge nothing here."""
    args32 = _cast(list(c.inputs), torch.float32, c.device)
    try:
        kernel = _Run(c.fn, args32, c.slots, c.kwargs, "the op at float32")
    except Exception:  # a kernel written for 16-bit types alone: the precisions cannot be compared
        return None
    generator = torch.Generator().manual_seed(int(c.seed) + 1)
    cotangents = _cotangents(kernel, generator)
    reference = _Run(c.ref_fn, _cast(args32, torch.float64, kernel.xs[0].device), c.slots, c.kwargs, "the reference")
    errors = [0.0] * len(kernel.xs)
    for g in cotangents:
        for i, (exact, got) in enumerate(zip(reference.vjp(g), kernel.vjp(g))):
            diff = np.abs(got - exact)
            k = largest_past(diff, errors[i])
            if k is not None:
                errors[i] = float(diff.reshape(-1)[k])
    return errors


def _defects(c, failing):
    """{input index: message} for the failing inputs whose error shrinks with the precision."""
    if not failing or not float32_between(c.dtype):
        return {}
    comparison, names = c.comparison, c.names
    u, p = UNIT_ROUNDOFF[c.dtype], DTYPE_NAMES[c.dtype]
    units = {i: comparison.error[i] / (u * comparison.scale[i]) if comparison.scale[i] > 0 else np.inf
             for i in failing}
    if not any(units[i] <= DEFECT_UNITS for i in failing):  # too large to be a value kept at p: nothing to run
        return {}
    try:
        at32 = _once(c, _float32_errors)
    except Exception:
        return {}
    if at32 is None:
        return {}
    shrinking = [i for i in failing if at32[i] <= SHRINK * comparison.error[i] and units[i] <= DEFECT_UNITS]
    if not shrinking:
        return {}
    try:
        nonadditive = _once(c, _nonadditive)
    except Exception:
        return {}
    found = {}
    for i in shrinking:
        if nonadditive[i] >= ADDS_UP:
            found[i] = (f"the error shrinks with the precision ({p}: {comparison.error[i]:.2g}, float32: "
                        f"{at32[i]:.2g}) and is {units[i]:.0f} units of {p}'s roundoff relative to the largest "
                        f"|{names[i]}̄|: a value kept or summed at {p} where the reference keeps more bits (a long "
                        f"sum accumulated at {p}: its error grows with the sum's length); accumulate in float32 and "
                        "round once at the end. Not a slip of the rule")
    return found


def _name_slips(report, c, slips):
    """{input index: the kinds named} for the failing inputs the structural kinds name (its diagnosis added to the
    report), and {input index: the C++ checker's reason} for those none names. Each failing input is checked alone,
    the others held fixed. At sizes whose Jacobians exceed the full-Jacobian limit, the check is made on the inputs
    cut along y's leading axes (cut_along_y), where every kind can be named (where no cut fits every input, the cut
    that fits the one named: fitting_cut); the whole inputs' projections are used where no cut can be made or the
    slip does not show on the cut."""
    # (inputs, where, full Jacobians up to CUT_LIMIT entries): the cut first, the whole inputs as the float64 check
    # takes them last
    whole = (list(c.inputs), "", False)
    together = cut_along_y(c, CUT_LIMIT)
    comparison, slots, names = c.comparison, c.slots, c.names
    named, why = {}, {}
    for i in slips:
        # the cut every input fits, or, where there is none, the cut this one fits (the others held fixed on it)
        cut = together if together is not None or len(slots) < 2 else fitting_cut(c, CUT_LIMIT, slot=slots[i])
        tries = [whole] if cut is None else [(cut[0], full_jacobian_there(cut[1]), True), whole]
        options = _tapegrad._Options()
        options.seed = int(c.seed)
        default_limit = options.full_jacobian_limit
        for args, where, cut_first in tries:
            if cut_first:
                # Full Jacobians, fitted (not judged) with the measured rounding, B without its margin: relative to
                # x̄'s size, and for an entry as an absolute tolerance that much of the largest entry (rounding errs
                # relative to the terms a value is computed from: an entry near zero errs as its row's largest
                # does). An error of a part of every entry, a scale of 1.05, is then past it.
                options.full_jacobian_limit = max(default_limit, CUT_LIMIT)
                noise = comparison.noise_bound[i] / MARGIN
                options.rtol = noise / comparison.scale[i] if comparison.scale[i] > 0 else 0.0
                largest = _largest_entry(c, args, slots[i])
                options.atol = max(options.rtol * largest, 1e-300)
            else:  # random projections of the whole inputs, which err as VJPs do: by up to B
                options.full_jacobian_limit = default_limit
                options.rtol = comparison.noise_bound[i] / comparison.scale[i] if comparison.scale[i] > 0 else 0.0
                options.atol = max(comparison.noise_bound[i], 1e-300)
            impl = kernel_against_reference(c, args, slots[i])
            array = args[slots[i]].detach().to(torch.float64).cpu().numpy()
            structural = _tapegrad._check(impl, "kernel", [array], [names[i]], 1, options)
            if cut_first and structural.passed:
                continue  # the slip does not show on the cut inputs
            # Rounding makes any VJP at p a little nonlinear in ȳ: linearity is the float64 check's to judge.
            found = [d for d in structural.diagnoses
                     if d.check == "vjp" and d.kind not in ("no_jvp", "unexplained", "nonlinear", "one_input")]
            if len(found) > 1:
                # where the failing elements lie is read through the tolerance (elements a slip moves by less pass
                # it): a kind that models the whole error says more
                found = [d for d in found if d.kind != "masked_positions"]
            for d in found:
                _tapegrad._add_diagnosis(report, d.kind, names[i], c.check, where + d.message, d.factor)
                named.setdefault(i, []).append(d.kind)
            if i not in named:
                why.update({i: d.message for d in structural.diagnoses if d.kind == "unexplained"})
            break
    return named, why


SIGN_FIT = 1e-3  # a constant factor within this of −1 is a sign


def _constant_factor(report, c, i, factor, in_float64):
    """Input i's VJP is factor × the reference's at every element (_Comparison.constant_factor): a sign where the
    factor is −1, else a scale."""
    name = c.names[i]
    said = f"{name}̄ = c × the reference's at every element, for every ȳ drawn, c = "
    after = (" (what is left is within |c| × rounding's bound"
             + ("; fn's float64 path errs the same" if in_float64 else "") + ")")
    if abs(factor + 1) <= SIGN_FIT:
        _tapegrad._add_diagnosis(report, "sign", name, c.check,
                                 f"{said}−1{after}: the VJP has the wrong sign (a sign slip)", factor)
    else:
        _tapegrad._add_diagnosis(report, "scale", name, c.check,
                                 f"{said}{_tapegrad._describe_factor(factor)}{after}: the VJP is off by a constant "
                                 "factor", factor)


def _largest_entry(c, args, slot, rows=8):
    """max |J_kj| over the reference's Jacobian along args[slot], estimated from rows rows of it (the VJPs of unit ȳ
    at random outputs k)."""
    run = _Run(c.ref_fn, _cast(args, torch.float64, c.device), [slot], c.kwargs, "the reference in float64")
    sizes = [y.numel() for y in run.ys]
    generator = torch.Generator().manual_seed(int(c.seed) + 2)
    largest = 0.0
    for k in torch.randint(sum(sizes), (rows,), generator=generator).tolist():
        units = []
        for size, y in zip(sizes, run.ys):
            unit = torch.zeros(size, dtype=torch.float64)
            if 0 <= k < size:
                unit[k] = 1.0
            units.append(unit.reshape(y.shape))
            k -= size
        largest = max([largest] + [float(np.max(np.abs(g))) for g in run.vjp(units) if g.size])
    return largest


def _python_advice(message):
    """The C++ checker's advice without its C++ option (a Python caller narrows by checking smaller inputs), the
    limit it names said in gradcheck's terms."""
    cut = message.find(" or raise full_jacobian_limit")
    message = message if cut < 0 else message[:cut]
    return re.sub(r", above full_jacobian_limit = (\d+)\)", lambda m: above_the_limit(m.group(1)), message)


def _same_in_float64(c, failing):
    """The failing inputs whose error is fn's float64 path's own: fn run on the same values in float64 errs against
    the reference as it does at p, to within rounding's bound, and by more than that bound. Such a slip is in every
    precision, and the float64 check, which reads it at full precision (the forward's terms too), names it."""
    try:
        kernel64 = _Run(c.fn, _cast(list(c.inputs), torch.float64, c.device), c.slots, c.kwargs, "the op in float64")
    except Exception:  # a kernel for 16-bit types alone
        return []
    comparison = c.comparison
    kernel, reference = comparison.kernel, comparison.reference64
    generator = torch.Generator().manual_seed(int(c.seed) + 3)
    same = set(failing)
    for g in _cotangents(kernel, generator):  # random ȳ as a comparison draws them
        exact, at_p, at_64 = reference.vjp(g), kernel.vjp(g), kernel64.vjp(g)
        for i in list(same):
            apart = float(np.max(np.abs(at_p[i] - at_64[i]), initial=0.0))
            off = float(np.max(np.abs(at_64[i] - exact[i]), initial=0.0))
            if not (apart <= comparison.noise_bound[i] and comparison.bound[i] < off):
                same.discard(i)
    return sorted(same)


TWO_ROWS = 1 << 18  # (outputs × an input's elements) of the float64 check's cut: two rows of 256 (512 × 512), where a
#                     slip of one row alone (a bias's x̄ from the first row) shows


def _name_from_float64(report, c, same):
    """{input index: kinds} named by the float64 check of fn for the inputs whose error is its float64 path's. Past
    ON_A_CUT checked elements that check runs first on the op cut to its first rows along y's axes, with the options
    given (a slip of a rule is in every row's formula, and the cut's check costs those rows; where no cut fits every
    input, the cut that fits those some cut fits, an input with none of y's axes kept whole there: fitting_cut); at
    the whole size for the inputs whose slip does not show there, those alone."""
    named, rest = {}, list(same)
    cut = first_rows(c, TWO_ROWS, apart=True) if sum(c.inputs[s].numel() for s in c.slots) > ON_A_CUT else None
    if cut is not None:
        named, shown = _float64_names(report, c, rest, lambda: c.float64_report(cut[0]), f" {cut[1]}")
        rest = [i for i in rest if i not in named and i not in shown]
    if rest:  # after a cut, the inputs its check did not show alone: at the whole size each costs its size in runs
        checked = rest if cut is not None else None
        named.update(_float64_names(report, c, rest, lambda: c.float64_report(checked=checked), "")[0])
    return named


def _float64_names(report, c, same, float64_report, where):
    """({input index: kinds} of the inputs in same that the float64 report names, its diagnosis added to the report
    saying where the float64 check ran ("" at the whole size); the inputs in same whose VJP that check failed)."""
    try:
        report64 = float64_report()
    except Exception:
        return {}, set()
    names, check = c.names, c.check
    failed = {row.input for row in report64.checks if row.check == "vjp" and not row.passed and not row.skipped}
    named, shown = {}, {i for i in same if names[i] in failed}
    for i in same:
        for d in report64.diagnoses:
            if d.input == names[i] and d.kind not in ("unexplained", "nonlinear", "no_jvp", "tolerance", "one_input"):
                _tapegrad._add_diagnosis(report, d.kind, names[i], check,
                                         f"as in float64 (fn's float64 path errs as its {check.split()[-1]} one "
                                         f"does, to rounding; its float64 check{where} reads): {d.message}")
                named.setdefault(i, []).append(d.kind)
    # a search over the forward's terms that gave up there says so here (tapegrad/_forward_record.py)
    spent = [note for note in getattr(report64, "_notes", []) if note.startswith(SEARCH_SPENT)]
    if spent:
        report._notes = getattr(report, "_notes", []) + [f"its float64 check{where}: {note}" for note in spent]
    return named, shown


BLOCK_UNITS = 4  # a block's share within this many units of the dtype's roundoff may be a row statistic kept at it


def _name_block(report, c, i, besides):
    """The diagnosis of input i whose error is of one piece along x̄ in one block (tapegrad/_blocks.py): "one row"
    for a row alone past its bound, else no known kind, with the block and its share. A share of a few units of the
    dtype's roundoff alone is also what a row's statistic kept at that dtype leaves (a dot product, a norm): where the
    error shrinks with the precision as rounding's does, it is named a precision defect."""
    alone = c.comparison.block_alone[i]
    place, words, r, bound, runs = alone or c.comparison.block_excess[i]
    name, units = c.names[i], abs(r) / UNIT_ROUNDOFF[c.dtype]
    # averaged over runs with its roundings stochastic (tapegrad/_averaged.py), a value kept at the dtype averages out
    # as its rounding does: what is left is no precision defect
    averaged = f" with the op's roundings averaged out over {runs} runs" if runs else ""
    seen = (f"in {name}̄{place} ({words}) the error is {r:+.2g} of {name}̄ there ({units:.1f} units of "
            f"{DTYPE_NAMES[c.dtype]}'s roundoff), {abs(r) / bound:.1f}× the share rounding explains in that block"
            f"{averaged}{besides}")
    if units < BLOCK_UNITS and not runs:
        defect = _defects(c, [i])
        if i in defect:
            _tapegrad._add_diagnosis(report, "precision_defect", name, c.check, f"{seen}; {defect[i]}")
            return
    what = ("a factor or a term of that block alone wrong" if alone else
            "other blocks along it are past their bounds too: a slip of more than one block")
    _tapegrad._add_diagnosis(report, "one_row" if alone and words == "one row" else "unexplained", name, c.check,
                             f"{seen}: {what}")


def _along(comparison, i, name):
    """(r, how the report says it): input i's error's share r along x̄ itself, against what rounding explains."""
    r = comparison.along[i]
    times = abs(r) / comparison.along_bound[i] if comparison.along_bound[i] > 0 else math.inf
    return r, f"its error is {r:+.2g} of {name}̄ itself, {times:.1f}× the share rounding's independent errors explain"


def _rest_is_rounding(comparison, i):
    """Whether what is left of input i's error once its share along x̄ is taken out, d − r·x̄₆₄, is rounding's size:
    SCALE_REST times its rms at most."""
    return comparison.along_rest[i] <= SCALE_REST * comparison.rounding_rms[i]


def _scale_of_one_piece(report, c, i, seen):
    """Names input i's error a scale of 1 + r, its share along x̄ (seen: the report's words for it)."""
    r, name = c.comparison.along[i], c.names[i]
    _tapegrad._add_diagnosis(report, "scale", name, c.check,
                             f"{name}̄ is {1 + r:.6g} × the reference's ({seen}; the rest of the error is rounding's "
                             "size): a constant factor in the rule, such as n/(n − 1) for n")


def _a_factor_near_one(report, c, i):
    """Names input i's error a scale where it is past the bound at some element and of one piece along x̄ with
    rounding's size left, d = r·x̄₆₄ + rounding: a factor a few units of roundoff from 1, which rounding moves from ȳ
    to ȳ by more than constant_factor's 1e-6 (a slip in fn's float64 path too is named by the float64 check)."""
    comparison = c.comparison
    if comparison.along_passed(i) or not _rest_is_rounding(comparison, i):
        return False
    _scale_of_one_piece(report, c, i, _along(comparison, i, c.names[i])[1])
    return True


def name_precision_failures(report, c, failing):
    """Adds to the report what each failing input's error is: a slip fn's float64 path makes too is named by the
    float64 check of fn (c.float64_report, where a reference is given); the structural kinds next (a slip with a
    structure is a slip, whichever precision it lives in); an error none names is a precision defect where it
    shrinks with the precision, else unexplained."""
    comparison, names, check = c.comparison, c.names, c.check
    # an error within the bound at every element but of one piece along x̄: a scale under an ulp where what is left
    # of it, d − r·x̄, is rounding's size (SCALE_REST times its rms at most)
    along_only = [i for i in failing if comparison.error_within(i) and not comparison.along_passed(i)]
    for i in along_only:
        name = names[i]
        seen = (f"{_along(comparison, i, name)[1]}; at each element it is within rounding, so only its sum over the "
                f"{comparison.sizes[i]} elements shows it")
        if _rest_is_rounding(comparison, i):
            _scale_of_one_piece(report, c, i, seen)
        else:
            _tapegrad._add_diagnosis(report, "unexplained", name, check,
                                     f"{seen}; the rest is "
                                     f"{comparison.along_rest[i] / max(comparison.rounding_rms[i], 1e-300):.1f}"
                                     f"× rounding's rms, so it is no constant factor: a slip of one piece (a factor "
                                     f"per row, a term) smaller than an ulp of {DTYPE_NAMES[c.dtype]}")
    # within the bound at every element and along x̄ as a whole, but one block (a row, a column, a batch element) of
    # one piece along its own x̄: that block scaled, or a term of that block alone wrong
    block_only = [i for i in failing if comparison.only_a_block_fails(i)]
    for i in block_only:
        _name_block(report, c, i, f"; at each element, and over the whole of {names[i]}̄, it is within rounding")
    failing = [i for i in failing if i not in along_only and i not in block_only]
    same = _same_in_float64(c, failing) if c.float64_report is not None else []
    # a whole VJP −1 times the reference's, read from the compared vectors themselves, is a sign: named before any
    # check that runs fn again (a scalar loss's float64 check differences it once per element, seconds on a GPU). A
    # factor other than −1 is left to the checks below, which can tell how it grows with a batch's length.
    for i in list(failing):
        factor = comparison.constant_factor(i)
        if factor is not None and abs(factor + 1) <= SIGN_FIT:
            _constant_factor(report, c, i, factor, i in same)
            failing.remove(i)
    named64 = _name_from_float64(report, c, [i for i in same if i in failing]) if same else {}
    failing = [i for i in failing if i not in named64]
    # one block alone past its bound, everything outside it within the bound, where fn's float64 path is right (a
    # slip at p only): the block names it. The structural kinds' fit allows rounding's noise at p unheld (the
    # composite's), in which a column 2% off reads as per-row factors from 0.997 to 1.023.
    for i in [i for i in failing if i not in same and comparison.block_alone[i] is not None]:
        _name_block(report, c, i, "")
        failing.remove(i)
    named, why = _name_slips(report, c, failing)
    unnamed = [i for i in failing if i not in named]
    # a whole VJP c times the reference's, where the structural kinds had only projections (large inputs no cut
    # reaches) and their own rounding hid the common factor
    for i in list(unnamed):
        factor = comparison.constant_factor(i)
        if factor is not None:
            _constant_factor(report, c, i, factor, i in same)
            unnamed.remove(i)
    # an error of one piece in one block alone (a row, a column) is a slip there, or, a few units of roundoff that
    # shrink with the precision, a statistic of that block kept at the dtype (_name_block)
    for i in [i for i in unnamed if comparison.block_alone[i] is not None]:
        _name_block(report, c, i, "")
        unnamed.remove(i)
    defects = _defects(c, unnamed)
    for i in unnamed:
        if i in defects:
            _tapegrad._add_diagnosis(report, "precision_defect", names[i], check, defects[i])
        elif i in same or not _a_factor_near_one(report, c, i):
            _tapegrad._add_diagnosis(report, "unexplained", names[i], check,
                                     f"the error is past rounding's bound and none of the structural kinds fits it "
                                     f"(max error {comparison.error[i]:.2g}, bound {comparison.bound[i]:.2g})"
                                     + (f": {_python_advice(why[i])}" if i in why else ""))
