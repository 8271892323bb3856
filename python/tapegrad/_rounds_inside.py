"""A forward that rounds inside: float64 in and out, but a step of it computed at float32 (a softmax kept in float32,
as fused kernels keep it). Its output moves in steps of float32's roundoff, so finite differences at the usual step
(1e-6) are noise of about u·|y|/eps, larger than the derivative's own scale allows; a right backward then fails.

Recognised by the second difference along a random direction v:
        ρ(h) = ‖y(x + 2hv) − 2·y(x + hv) + y(x)‖∞ / ‖y‖∞
A smooth forward's ρ is h²·|y″|/|y|, which falls 10⁴-fold when h falls 100-fold; a forward that rounds inside keeps
ρ at its rounding, u·|y| steps, at any h. ρ at eps/100 above 64 float64 units, and not a tenth of ρ at eps, is
rounding inside, at a unit about ρ.
Then the check is made again at the step where rounding and truncation balance, eps′ = ρ^(1/3) (central
differences: truncation eps′²·|y‴|/6 against noise ρ·‖y‖/eps′), with atol raised to 4·ρ·‖y‖∞/eps′, the largest
noise that rounding puts into a difference there (rtol as given covers the truncation), and the adjoint identity
held to 64·ρ (torch's rules of the rounding steps are as accurate as they are). All are measured, not tuned; the
report says so.

Two forwards are refused instead, the report failing with one line that says why, since a loosened check would pass
wrong rules on them:
- a forward that is not a function: run again at the same point, it returns other values (noise from a generator
  the check's seed does not reach, a sum in a nondeterministic order). Its differences are its noise at any step.
- a forward that rounds at fp16 or bf16 inside: the step and atol its rounding needs (eps′ ≈ 0.01–0.06, atol′ a
  part of |y| itself) would pass a backward a few percent off. It is checked at that precision instead. For the
  same reason a re-check is made only where its atol′ is at most LOOSEST_ATOL of the largest |x̄| a VJP gives: a
  rule 2% off then still errs several atol′.
"""

import numpy as np

from . import _tapegrad

_UNITS = (("float32", 2.0**-24), ("fp16", 2.0**-11), ("bf16", 2.0**-8))
LOOSEST_ATOL = 0.005  # a re-check's atol′ at most this part of max |x̄|: a rule 2% off still fails it


def unless_unsteady(report, impl, call, may_recheck):
    """A failed float64 check whose forward is not steady (the module's text): refused where the forward is not a
    function, or rounds inside too coarsely for a re-check to resolve a wrong rule; made again at the step its
    rounding allows where it rounds at about float32 (and may_recheck). (the report to keep, a note or None, whether
    it was refused)."""
    arrays, options = call.arrays, call.options
    moved = differs_when_run_again(impl, arrays)
    if moved is not None:
        return _refused(report, "not_a_function", not_a_function_message(*moved)), None, True
    if not may_recheck:
        return report, None, False
    rho = rounding_inside(impl, arrays, options.eps, options.seed)
    if rho is None:
        return report, None, False
    step, noise = recheck_noise(impl, arrays, rho)
    if (unit_named(rho) != "float32"
            or noise > LOOSEST_ATOL * largest_gradient(impl, arrays, options.seed)):
        return _refused(report, "rounds_inside", rounds_coarsely_message(rho)), None, True
    report, note = recheck(impl, call, rho, step, noise)
    return report, note, False


def _refused(report, kind, message):
    """The failed report with one diagnosis, the reason nothing could be judged (the others were read from noise)."""
    for other in {d.kind for d in report.diagnoses}:
        _tapegrad._drop_diagnoses(report, other)
    _tapegrad._add_diagnosis(report, kind, "", "vjp", message)
    return report


def differs_when_run_again(impl, arrays):
    """(largest difference, largest |y|) between two runs of the forward at the same point, or None where they agree
    bit for bit (NaN where NaN)."""
    first, second = (impl.forward([a.copy() for a in arrays], False)[0] for _ in range(2))
    first, second = np.asarray(first, dtype=np.float64), np.asarray(second, dtype=np.float64)
    if first.shape == second.shape and np.array_equal(first, second, equal_nan=True):
        return None
    if first.shape != second.shape:
        return np.inf, 0.0
    finite = np.isfinite(first) & np.isfinite(second)
    nan_moved = bool(np.any(np.isnan(first) != np.isnan(second)))
    difference = np.inf if nan_moved else float(np.max(np.abs(first - second)[finite], initial=0.0))
    return difference, float(np.max(np.abs(first[finite]), initial=0.0))


def not_a_function_message(difference, scale):
    size = "a different shape" if scale == 0.0 and np.isinf(difference) else (
        f"up to {difference:.2g} apart" + (f", {difference / scale:.2g} of max |y|" if scale > 0 else ""))
    return (f"the forward returns different values at the same input ({size}): it has no derivative to compare, "
            "so nothing was judged. Seed its randomness from torch's generator inside each call (or draw the noise "
            "once, outside, and pass it in as a fixed input), or make its sums run in a fixed order, and check again")


def rounds_coarsely_message(rho):
    unit = unit_named(rho)
    dtype = {"fp16": "torch.float16", "bf16": "torch.bfloat16"}.get(unit)
    how = (f"pass {dtype} inputs to tapegrad.gradcheck (with reference= the op in float64 composite ops)" if dtype
           else "pass inputs of the dtype it computes in to tapegrad.gradcheck (with reference=)")
    return (f"the forward rounds inside at about {unit} (its output moves in steps of {rho:.2g} relative): finite "
            f"differences in float64 read those steps, and a check loose enough to step over them would pass a rule "
            f"a few percent off; check the op at the precision it computes in: {how}")


def rounding_inside(impl, arrays, eps, seed):
    """ρ (the relative size of the steps the output moves in) where the forward rounds inside, else None."""
    rng = np.random.default_rng(int(seed))
    v = [rng.choice((-1.0, 1.0), size=a.shape) for a in arrays]

    def at(h):
        return impl.forward([np.array(a + h * d, dtype=np.float64) for a, d in zip(arrays, v)], False)[0]

    y = at(0.0)
    scale = float(np.max(np.abs(y))) if np.size(y) else 0.0
    if scale == 0:
        return None
    coarse = _step_of_constant_pieces(at, y, eps)
    if coarse is not None:
        return coarse

    def second_difference(h):
        return float(np.max(np.abs(at(2 * h) - 2 * at(h) + y))) / scale

    below = second_difference(eps / 100)
    if below <= 64 * 2.0**-52:  # a smooth forward: its second difference is float64's rounding at this step
        return None
    at_step = second_difference(eps)
    return max(below, at_step) if below >= 0.1 * at_step else None


def _step_of_constant_pieces(at, y, eps):
    """Where a move by eps/100 leaves most of y exactly as it is (a forward rounding more coarsely than the step, at
    fp16 or bf16: constant between its steps), the relative size of its smallest step, found by growing the move
    until the elements move; else None."""
    nonzero = y != 0
    if not np.any(nonzero) or np.mean(at(eps / 100)[nonzero] == y[nonzero]) < 0.5:
        return None
    for h in eps * 10.0 ** np.arange(0, 7):
        y_moved = at(h)
        moved = (y_moved != y) & nonzero
        if np.any(moved):
            return float(np.min(np.abs(y_moved[moved] - y[moved]) / np.abs(y[moved])))
    return None


def unit_named(rho):
    """The precision whose roundoff is nearest ρ/2 (a second difference spans about two steps)."""
    return min(_UNITS, key=lambda unit: abs(np.log(rho / 2) - np.log(unit[1])))[0]


def largest_gradient(impl, arrays, seed):
    """max |x̄| over the inputs for one random ȳ of ±1s (the size a re-check's atol′ is weighed against)."""
    y, state = impl.forward([a.copy() for a in arrays], True)
    rng = np.random.default_rng(int(seed) + 1)
    grads = impl.vjp(state, rng.choice((-1.0, 1.0), size=np.shape(y)))
    return max((float(np.max(np.abs(g))) for g in grads if g is not None and np.size(g)), default=0.0)


def recheck_noise(impl, arrays, rho):
    """(eps′, atol′) of a re-check at the step where rounding and truncation balance."""
    y = impl.forward([a.copy() for a in arrays], False)[0]
    step = rho ** (1.0 / 3.0)
    return step, 4 * rho * float(np.max(np.abs(y))) / step


def recheck(impl, call, rho, step, noise):
    """The check again at the step and tolerance rounding inside allows, and the note that says why. call: the
    gradcheck call (its name, checked inputs' names and float64 values, options)."""
    options = call.options
    again = _tapegrad._Options()
    for field in ("rtol", "full_jacobian_limit", "projections", "seed", "diagnose"):
        setattr(again, field, getattr(options, field))
    again.eps = max(options.eps, step)
    again.atol = max(options.atol, noise)
    # the rules themselves (torch's derivatives of the float32 steps) are as accurate as that rounding: their
    # adjoint identity and linearity hold to it, not to float64's
    again.rounding = max(options.rounding, 64 * rho)
    report = _tapegrad._check(impl, call.name, call.arrays, call.names, 1, again)
    note = (f"the forward rounds inside at about {unit_named(rho)} (its output moves in steps of {rho:.2g} "
            f"relative): at eps={options.eps:g} the differences are noise, so this check is made at eps={again.eps:.2g}"
            f", atol={again.atol:.2g}, where that rounding moves a difference by at most {noise:.2g}; to check the op "
            "at the precision it computes in, pass inputs of that dtype (and reference=)")
    return report, note
