"""The measured model of rounding that tapegrad/_precision.py judges an op at a low precision by.

Rounding(dtype) runs a float64 computation as one at dtype errs (Monte Carlo arithmetic: each op's result moved by
up to OP_UNITS units of dtype's roundoff, then rounded to it; a product's or a sum's result first by a float32
accumulator's error); its fused form rounds only the products' operands to dtype and keeps every other value in
float32, as a fused kernel does. _Run is one op run (at a precision, or in float64 under Rounding) kept for its
VJPs; _Comparison sets the kernel's VJPs against the reference's and measures, from two runs of the reference under
Rounding (on x and on x moved by an ulp), what rounding explains: B = MARGIN · max(largest deviation, u·‖x̄‖∞).
"""

import contextlib
import math

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ._torch_op import float_outputs

# the unit roundoff u of each float dtype: a value rounded to it is x·(1 + δ), |δ| ≤ u
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24, torch.float64: 2.0**-53}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "float32", torch.float64: "float64"}
DRAWS = 2          # random ȳ per comparison
MARGIN = 2.0       # B = MARGIN · the largest rounding error measured
OP_UNITS = 3       # an op at a precision errs by up to this many units of its roundoff, and then rounds


def _sums(func, args, kwargs):
    """(Σ|terms| of each result element, the number of terms) for a matrix product or a sum; None for other ops."""
    name = func.overloadpacket.__name__
    if name in ("mm", "bmm", "mv", "dot"):
        a, b = args[0], args[1]
        return func(a.abs(), b.abs()), a.shape[-1]
    if name in ("addmm", "baddbmm"):
        c, a, b = args[0], args[1], args[2]
        return c.abs() + func(torch.zeros_like(c), a.abs(), b.abs()), a.shape[-1] + 1
    if name == "sum" and args[0].is_floating_point():
        x = args[0]
        total = func(x.abs(), *args[1:], **kwargs)
        return total, max(1, x.numel() // max(1, total.numel()))
    return None


# The matrix products, and which of their arguments are the two operands.
_PRODUCTS = {"mm": (0, 1), "bmm": (0, 1), "mv": (0, 1), "dot": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}


def _rounded_to(t, dtype):
    """t's values rounded to dtype, kept in t's own dtype (t itself where it is no finer)."""
    if isinstance(t, torch.Tensor) and t.is_floating_point() and UNIT_ROUNDOFF.get(t.dtype, 1) < UNIT_ROUNDOFF[dtype]:
        return t.to(dtype).to(t.dtype)
    return t


class Rounding(TorchDispatchMode):
    """A float64 computation that errs as one at dtype does (Monte Carlo arithmetic). Each floating-point result r
    of a torch op is computed as it is, moved to r·(1 + k·u·ξ), then rounded to dtype (and kept in its own dtype):
    an op at dtype errs by its result's rounding and, being a library's function (exp, erf, a fused normalization),
    by up to k = OP_UNITS units more; ξ is uniform in [−1, 1], drawn afresh for every element of every result. A
    matrix product's or a sum's result first moves by what summing its n terms in float32 (the accumulator of
    low-precision products) errs by: √n·u₃₂·Σ|terms|·ξ (the probabilistic size of a float sum's error). Views and
    in-place results are left as they are (a copy would cut them from what they alias).

    fused: as a fused kernel at dtype computes instead: the operands of each matrix product rounded to dtype (what
    its tensor cores read), every other value kept in float32 (the same moves at float32's unit roundoff)."""

    def __init__(self, dtype, generator, fused=False):
        super().__init__()
        self.dtype = dtype
        self.intermediate = torch.float32 if fused and UNIT_ROUNDOFF[dtype] > UNIT_ROUNDOFF[torch.float32] else dtype
        self.fused = fused
        self.generator = generator
        self.generators = {}

    def _uniform(self, t):
        """ξ uniform in [−1, 1], one per element of t, drawn on t's device (a generator per device, seeded from the
        check's)."""
        generator = self.generators.get(t.device)
        if generator is None:
            generator = torch.Generator(t.device).manual_seed(int(torch.randint(2**62, (), generator=self.generator)))
            self.generators[t.device] = generator
        return torch.rand(tuple(t.shape), generator=generator, dtype=t.dtype, device=t.device) * 2 - 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        operands = _PRODUCTS.get(func.overloadpacket.__name__) if self.fused else None
        if operands is not None:
            args = tuple(_rounded_to(a, self.dtype) if k in operands else a for k, a in enumerate(args))
        out = func(*args, **kwargs)
        if any(r.alias_info is not None for r in func._schema.returns):
            return out
        u = UNIT_ROUNDOFF[self.intermediate]
        if isinstance(out, torch.Tensor):
            if not (out.is_floating_point() and out.dtype in UNIT_ROUNDOFF and UNIT_ROUNDOFF[out.dtype] < u):
                return out
            sums = _sums(func, args, kwargs)
            if sums is not None:
                magnitude, n = sums
                accumulator = UNIT_ROUNDOFF[torch.float64 if self.dtype == torch.float64 else torch.float32]
                out = out + math.sqrt(n) * accumulator * magnitude * self._uniform(out)
            return (out * (1 + OP_UNITS * u * self._uniform(out))).to(self.intermediate).to(out.dtype)

        def rounded(t):
            if (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype in UNIT_ROUNDOFF
                    and UNIT_ROUNDOFF[t.dtype] < u):
                return (t * (1 + OP_UNITS * u * self._uniform(t))).to(self.intermediate).to(t.dtype)
            return t
        return tree_map(rounded, out)


class _Run:
    """One op at one precision: its outputs at the inputs, kept with the graph for its VJPs; with rounding_to, its
    forward and backward run under Rounding(rounding_to)."""

    def __init__(self, fn, args, slots, kwargs, who, rounding_to=None, generator=None, fused=False):
        self.mode = ((lambda: Rounding(rounding_to, generator, fused)) if rounding_to is not None
                     else contextlib.nullcontext)
        self.xs = [args[i].detach().requires_grad_() for i in slots]
        args = list(args)
        for i, x in zip(slots, self.xs):
            args[i] = x
        try:
            with torch.enable_grad(), self.mode():
                self.ys = float_outputs(fn(*args, **kwargs))
        except Exception as error:
            raise RuntimeError(f"gradcheck: {who} raised {type(error).__name__}: {error}") from error
        if not self.ys:
            raise TypeError(f"gradcheck: {who} returned no floating-point tensor")
        self.who = who

    def vjp(self, cotangents):
        """x̄ᵢ = Σ_k J_kᵢᵀ ȳ_k as float64 numpy arrays (zeros where an input does not reach the outputs)."""
        pairs = [(y, g.to(device=y.device, dtype=y.dtype)) for y, g in zip(self.ys, cotangents) if y.requires_grad]
        if not pairs:
            return [np.zeros(tuple(x.shape)) for x in self.xs]
        try:
            with self.mode():
                grads = torch.autograd.grad([y for y, _ in pairs], self.xs, [g for _, g in pairs],
                                            retain_graph=True, allow_unused=True)
        except Exception as error:
            raise RuntimeError(f"gradcheck: the backward of {self.who} raised {type(error).__name__}: {error}") \
                from error
        return [np.zeros(tuple(x.shape)) if g is None else g.detach().to(torch.float64).cpu().numpy() for x, g in
                zip(self.xs, grads)]

    def values(self):
        return [y.detach().to(torch.float64).cpu().numpy() for y in self.ys]


def _cast(args, dtype, device):
    """The arguments with every floating-point tensor cast to dtype (the reference sees the kernel's own values)."""
    return [a.detach().to(device=device, dtype=dtype) if isinstance(a, torch.Tensor) and a.is_floating_point()
            else a for a in args]


def _nudged(args, slots, dtype, generator):
    """The checked inputs moved by about one unit in the last place at dtype: x·(1 + u·ξ), rounded to dtype."""
    u = UNIT_ROUNDOFF[dtype]
    out = list(args)
    for i in slots:
        x = args[i].detach()
        xi = torch.rand(tuple(x.shape), generator=generator, dtype=torch.float64) * 2 - 1
        out[i] = (x.to(torch.float64) * (1 + u * xi.to(x.device))).to(dtype)
    return out


def _largest(arrays):
    return max((float(np.max(np.abs(a))) for a in arrays if a.size), default=0.0)


class _Comparison:
    """The kernel's VJPs and values against the reference's, and the rounding model's bound, per input."""

    def __init__(self, kernel, reference_at, dtype, cotangents_64, fused=False):
        reference64 = reference_at(None, None)
        u = UNIT_ROUNDOFF[dtype]
        samples = [reference_at(dtype, None), reference_at(dtype, "nudged")]
        # the same model as a fused kernel computes (Rounding's fused): a second, tighter bound, said beside the first
        fused_samples = [reference_at(dtype, None, True), reference_at(dtype, "nudged", True)] if fused else []
        count = len(kernel.xs)
        self.error = [0.0] * count
        self.rounding = [0.0] * count
        self.fused_rounding = [0.0] * count
        self.scale = [0.0] * count
        self.worst = [None] * count
        self.values = [(math.nan, math.nan)] * count  # (the kernel's, the reference's) at the worst element
        for g in cotangents_64:
            exact = reference64.vjp(g)
            got = kernel.vjp(g)
            moved = [s.vjp(g) for s in samples]
            moved_fused = [s.vjp(g) for s in fused_samples]
            for i in range(count):
                diff = np.abs(got[i] - exact[i])
                if diff.size and (not np.all(np.isfinite(diff)) or float(np.max(diff)) > self.error[i]):
                    k = int(np.argmax(np.where(np.isfinite(diff), diff, np.inf)))
                    self.error[i] = float(diff.reshape(-1)[k])
                    self.worst[i] = np.unravel_index(k, diff.shape)
                    self.values[i] = (float(got[i].reshape(-1)[k]), float(exact[i].reshape(-1)[k]))
                self.rounding[i] = max([self.rounding[i]] + [_largest([m[i] - exact[i]]) for m in moved])
                self.fused_rounding[i] = max([self.fused_rounding[i]] +
                                             [_largest([m[i] - exact[i]]) for m in moved_fused])
                self.scale[i] = max(self.scale[i], _largest([exact[i]]))
        self.bound = [MARGIN * max(r, u * s) for r, s in zip(self.rounding, self.scale)]
        self.fused_bound = [MARGIN * max(r, u * s) for r, s in zip(self.fused_rounding, self.scale)] if fused else None
        y64, yk = reference64.values(), kernel.values()
        self.forward_error = max((_largest([a - b]) if a.shape == b.shape else math.inf) for a, b in zip(yk, y64))
        forward_rounding = max(_largest([a - b]) for s in samples for a, b in zip(s.values(), y64))
        self.forward_bound = MARGIN * max(forward_rounding, u * _largest(y64))

    def passed(self, i):
        return within(self.error[i], self.bound[i])

    def forward_passed(self):
        return within(self.forward_error, self.forward_bound)


def within(error, bound):
    """An error rounding explains: finite, and at most the bound."""
    return math.isfinite(error) and error <= bound


def _cotangents(run, generator):
    """DRAWS random ȳ in float64 for the run's outputs (rounded to each output's dtype by the VJPs that use them)."""
    return [[torch.randn(tuple(y.shape), generator=generator, dtype=torch.float64).to(y.dtype).to(torch.float64)
             for y in run.ys] for _ in range(DRAWS)]


def compare(kernel, ref_fn, args, slots, kwargs, dtype, device, generator, label, fused=False):
    """kernel (a _Run of the op at dtype on args) against ref_fn on the same values: ref_fn in float64, and in float64
    under Rounding at dtype on args and on args moved by an ulp (and in Rounding's fused form where asked), at DRAWS
    random ȳ drawn from generator."""
    nudged = _nudged(args, slots, dtype, generator)

    def reference_at(rounding_to, how, fused=False):
        source = nudged if how == "nudged" else args
        who = label + ("" if rounding_to is None else f", rounding to {DTYPE_NAMES[rounding_to]}")
        return _Run(ref_fn, _cast(source, torch.float64, device), slots, kwargs, who, rounding_to, generator, fused)
    return _Comparison(kernel, reference_at, dtype, _cotangents(kernel, generator), fused)
