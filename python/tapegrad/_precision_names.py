"""What an error past rounding's bound is (tapegrad/_precision.py): a precision defect, or a slip, named by the
checker's structural diagnoses.

Precision defect: the error shrinks with the precision, as rounding's does and a wrong rule's does not: the same
kernel at float32 on the same values errs by at most SHRINK times its error at p (a rounding error falls by
u₃₂/uₚ = 2⁻¹⁶ from bf16, a slip's stays), and its error at p is at most DEFECT_UNITS units of p's roundoff relative
to |x̄₆₄| (a sum kept at p errs by about u·√n to u·n relative, n its length; a slip of the 16-bit path alone, which
also vanishes at float32, errs by a part of |x̄| itself).

Slip: the C++ checker runs on an op whose forward is the reference in float64 (its Jacobian from finite
differences, as in every float64 check) and whose VJP is the kernel's at p, with the bound B as its tolerance, so
that scale, sign, transposed, per-row and the other structural kinds are read from the kernel's error.
"""

import numpy as np
import torch

from . import _tapegrad
from ._rounding import DTYPE_NAMES, UNIT_ROUNDOFF, _cast, _Run, compare
from ._torch_op import float_outputs

SHRINK = 2.0**-8       # float32's error at most this part of p's: it shrank with the precision
DEFECT_UNITS = 32      # a precision defect's error is at most this many units of p's roundoff relative to |x̄₆₄|


def _float32_comparison(fn, ref_fn, inputs, slots, kwargs, device, seed):
    """The kernel at float32 on the same values against the reference, or None where it does not run at float32."""
    args32 = _cast(list(inputs), torch.float32, device)
    try:
        kernel = _Run(fn, args32, slots, kwargs, "the op at float32")
    except Exception:  # a kernel written for 16-bit types alone: the precisions cannot be compared
        return None
    generator = torch.Generator().manual_seed(int(seed) + 1)
    return compare(kernel, ref_fn, args32, slots, kwargs, torch.float32, device, generator, "the reference")


def _defects(fn, ref_fn, inputs, slots, names, kwargs, dtype, device, comparison, failing, seed):
    """{input index: message} for the failing inputs whose error shrinks with the precision."""
    if dtype not in (torch.bfloat16, torch.float16):
        return {}
    try:
        at32 = _float32_comparison(fn, ref_fn, inputs, slots, kwargs, device, seed)
    except Exception:
        return {}
    if at32 is None:
        return {}
    u, p = UNIT_ROUNDOFF[dtype], DTYPE_NAMES[dtype]
    found = {}
    for i in failing:
        units = comparison.error[i] / (u * comparison.scale[i]) if comparison.scale[i] > 0 else np.inf
        shrinks = at32.error[i] <= SHRINK * comparison.error[i]
        if shrinks and units <= DEFECT_UNITS:
            found[i] = (f"the error shrinks with the precision ({p}: {comparison.error[i]:.2g}, float32: "
                        f"{at32.error[i]:.2g}) and is {units:.0f} units of {p}'s roundoff relative to the largest "
                        f"|{names[i]}̄|: a value kept or summed at {p} where the reference keeps more bits (a long "
                        f"sum accumulated at {p}: its error grows with the sum's length); accumulate in float32 and "
                        "round once at the end. Not a slip of the rule")
    return found


class _KernelAgainstReference:
    """The interface of python/python_function.hpp: forward is the reference in float64 (finite differences of it
    give the reference's Jacobian), and the VJP at the point is the kernel's at its precision."""

    def __init__(self, fn, ref_fn, inputs, slots, kwargs, dtype, device):
        self.fn, self.ref_fn, self.slots, self.kwargs = fn, ref_fn, slots, kwargs
        self.dtype, self.device = dtype, device
        self.fixed64 = _cast(list(inputs), torch.float64, device)
        self.fixed = list(inputs)
        self.no_forward_mode = "the kernel's forward mode is not compared at its precision"

    def _args(self, fixed, arrays, dtype):
        args = list(fixed)
        for slot, a in zip(self.slots, arrays):
            args[slot] = torch.from_numpy(np.array(a, dtype=np.float64)).to(device=self.device, dtype=dtype)
        return args

    def forward(self, arrays, keep):
        with torch.no_grad():
            ys = float_outputs(self.ref_fn(*self._args(self.fixed64, arrays, torch.float64), **self.kwargs))
        y = torch.cat([t.reshape(-1) for t in ys]).cpu().numpy() if len(ys) > 1 else ys[0].cpu().numpy()
        if not keep:
            return y, None
        kernel = _Run(self.fn, self._args(self.fixed, arrays, self.dtype), self.slots, self.kwargs, "the kernel")
        return y, kernel

    def vjp(self, kernel, gout):
        flat, cotangents = torch.from_numpy(np.array(gout, dtype=np.float64)).reshape(-1), []
        for y in kernel.ys:
            cotangents.append(flat[:y.numel()].reshape(y.shape))
            flat = flat[y.numel():]
        return kernel.vjp(cotangents)

    def jvp(self, state, tangents):
        return None


def _name_slips(report, fn, ref_fn, inputs, slots, names, kwargs, dtype, device, comparison, slips, check, seed):
    impl = _KernelAgainstReference(fn, ref_fn, inputs, slots, kwargs, dtype, device)
    # The bound as an absolute and as a relative tolerance: an element errs by up to B, and a random projection
    # ⟨x̄, v⟩, a sum of n elements' errors, by up to about B/‖x̄‖∞ of its own size.
    options = _tapegrad._Options()
    options.atol = max(max(comparison.bound[i] for i in slips), 1e-300)
    options.rtol = max(comparison.bound[i] / comparison.scale[i] if comparison.scale[i] > 0 else 0.0 for i in slips)
    options.seed = int(seed)
    arrays = [inputs[i].detach().to(torch.float64).cpu().numpy() for i in slots]
    structural = _tapegrad._check(impl, "kernel", arrays, list(names), 1, options)
    wanted = {names[i] for i in slips}
    named = {}
    for d in structural.diagnoses:
        # Rounding makes any VJP at p a little nonlinear in ȳ: linearity is the float64 check's to judge.
        if (d.input in wanted and d.check == "vjp" and d.kind not in ("no_jvp", "unexplained", "nonlinear")
                and d.kind not in named.get(d.input, ())):
            _tapegrad._add_diagnosis(report, d.kind, d.input, check, d.message)
            named.setdefault(d.input, set()).add(d.kind)
    why = {d.input: d.message for d in structural.diagnoses if d.kind == "unexplained" and d.input in wanted}
    for i in slips:
        if names[i] not in named:
            _tapegrad._add_diagnosis(report, "unexplained", names[i], check,
                                     f"the error is past rounding's bound and none of the structural kinds fits it "
                                     f"(max error {comparison.error[i]:.2g}, bound {comparison.bound[i]:.2g})"
                                     + (f": {_python_advice(why[names[i]])}" if names[i] in why else ""))


def _python_advice(message):
    """The C++ checker's advice without its C++ option (a Python caller narrows by checking smaller inputs)."""
    cut = message.find(" or raise full_jacobian_limit")
    return message if cut < 0 else message[:cut]


def name_precision_failures(report, fn, ref_fn, inputs, slots, names, kwargs, dtype, device, comparison, failing,
                            check, seed):
    """Adds to the report what each failing input's error is."""
    defects = _defects(fn, ref_fn, inputs, slots, names, kwargs, dtype, device, comparison, failing, seed)
    for i, message in defects.items():
        _tapegrad._add_diagnosis(report, "precision_defect", names[i], check, message)
    slips = [i for i in failing if i not in defects]
    if slips:
        _name_slips(report, fn, ref_fn, inputs, slots, names, kwargs, dtype, device, comparison, slips, check, seed)
