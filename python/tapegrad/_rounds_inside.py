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
"""

import numpy as np

from . import _tapegrad

_UNITS = (("float32", 2.0**-24), ("fp16", 2.0**-11), ("bf16", 2.0**-8))


def rounding_inside(impl, arrays, eps, seed):
    """ρ (the relative size of the steps the output moves in) where the forward rounds inside, else None."""
    rng = np.random.default_rng(int(seed))
    v = [rng.choice((-1.0, 1.0), size=a.shape) for a in arrays]

    def second_difference(h):
        ys = [impl.forward([np.array(a + k * h * d, dtype=np.float64) for a, d in zip(arrays, v)], False)[0]
              for k in (0, 1, 2)]
        scale = float(np.max(np.abs(ys[0]))) if np.size(ys[0]) else 0.0
        return float(np.max(np.abs(ys[2] - 2 * ys[1] + ys[0]))) / scale if scale > 0 else 0.0

    below = second_difference(eps / 100)
    if below <= 64 * 2.0**-52:  # a smooth forward: its second difference is float64's rounding at this step
        return None
    at_step = second_difference(eps)
    return max(below, at_step) if below >= 0.1 * at_step else None


def unit_named(rho):
    """The precision whose roundoff is nearest ρ/2 (a second difference spans about two steps)."""
    return min(_UNITS, key=lambda unit: abs(np.log(rho / 2) - np.log(unit[1])))[0]


def recheck(impl, name, arrays, checked_names, options, rho):
    """The check again at the step and tolerance rounding inside allows, and the note that says why."""
    y = impl.forward([a.copy() for a in arrays], False)[0]
    step = rho ** (1.0 / 3.0)
    noise = 4 * rho * float(np.max(np.abs(y))) / step
    again = _tapegrad._Options()
    for field in ("rtol", "full_jacobian_limit", "projections", "seed", "diagnose"):
        setattr(again, field, getattr(options, field))
    again.eps = max(options.eps, step)
    again.atol = max(options.atol, noise)
    # the rules themselves (torch's derivatives of the float32 steps) are as accurate as that rounding: their
    # adjoint identity and linearity hold to it, not to float64's
    again.rounding = max(options.rounding, 64 * rho)
    report = _tapegrad._check(impl, name, arrays, checked_names, 1, again)
    note = (f"the forward rounds inside at about {unit_named(rho)} (its output moves in steps of {rho:.2g} "
            f"relative): at eps={options.eps:g} the differences are noise, so this check is made at eps={again.eps:.2g}"
            f", atol={again.atol:.2g}, where that rounding moves a difference by at most {noise:.2g}; to check the op "
            "at the precision it computes in, pass inputs of that dtype (and reference=)")
    return report, note
