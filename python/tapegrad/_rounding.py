"""What rounding explains when an op runs at a low precision: the bound tapegrad/_precision.py judges an op by.

An op at precision p (bf16, fp16, float32) is compared with its reference in float64 on the same rounded inputs.
A right kernel errs by about what the reference itself errs when it runs at p; so that is measured, not modeled:
AtPrecision runs the reference's float64 computation with every one of its torch ops (forward and backward) computed
at p, as the composite of torch ops at p computes it on this device (in a reference given for another op, torch's
fused norms and reductions as the composites they decompose into), on x and on x moved by an ulp (MOVED_32 such
points at float32). At float32 each is held against float64 at x, so it carries x̄'s sensitivity to the input at the
precision a float32 computation works in; at bf16 and fp16, where a kernel works in float32 between exact inputs and
rounded stored values, the moved point is held against float64 at its own point: a second sample of how rounding
falls. Two more figures cover what the composite's error may not: a fused kernel keeps its values in float32
between products (Rounding, a Monte Carlo model of that arithmetic: only the products' operands at p), and a fused
kernel sums long in float32 (an allowance by the sum's length: u₃₂·√n·√(‖terms‖₂²/6 + x̄²/9), the rms error of n
float32 terms added one after the other, the worst usual order, whose partial sums wander as the terms' signs do and
grow with their mean, times √(2·ln(2m)), about the largest of m such errors: x̄'s m elements; a sum in blocks or in
pairs errs less).
The result, stored at p, moves by up to half an ulp too: ½ulp(‖x̄₆₄‖∞) = u·2^⌊log₂‖x̄₆₄‖∞⌋. The bound is

        B = MARGIN · max(composite's error at p, fused model's, long sums', ½ulp(‖x̄₆₄‖∞))

with MARGIN = 1.75 < 2, so that a slip erring twice what the composite at p errs is past it whenever the composite's
error is the largest figure, while a right fused kernel, whose order of operations is not the composite's, stays
below it (the Triton example's right kernel at float32 on an H200 erred 1.56 times the composite's figure).
Two rules keep B from passing what a fused kernel at bf16 or fp16 should not err: an op that rounds in no torch op at
p (ArithmeticAt watches it run: a Triton launch, or torch ops in float32) has the composite's figure held to what a
fused kernel's own arithmetic errs, its three sources added: the result's rounding ½ulp(‖x̄₆₄‖∞), the products'
operands at p (the fused model's figure) and the float32 sums (their allowance), since torch's ops at p, which keep
values at p between ops and on some devices sum at p, excuse only an op that computes with them; and each element is
held to MARGIN times the larger of its own ½ulp and the other figures (_Comparison.element_excess), not to the largest
element's ½ulp.
An op that rounds in torch ops at p rounds as its own formula does, which need not be as the reference's: a softmax's
backward written as y ⊙ (ȳ − ⟨ȳ, y⟩) in bf16 ops erred up to 1.8 times the composite's figure, a gated linear
unit's 2.5 times, a linear + GELU's 2.7 times. Such an op is run OWN_RUNS times more with its own roundings falling
otherwise (OwnRounding), and how far that moves x̄ is a figure too, up to OWN_CAP times the composite's, so that its
bound stays within 3.5 times the composite's figure; a slip does not move with the roundings, and stays out of it.
At float32 those runs are made only where the op errs past the bound without them.

At bf16 and fp16 a slip can err by less than an ulp at every element (a scale of 1.004) and pass B. Its error is of
one piece, though, where rounding's errors are nearly independent from element to element; so the share of x̄
itself in the error, r = ⟨x̄ₚ − x̄₆₄, x̄₆₄⟩/⟨x̄₆₄, x̄₆₄⟩, is held to MARGIN times the composite's and the fused
model's own r (and, for an op in torch ops at p, that of its own roundings falling otherwise), or SIGMAS times
the σ that independent errors of their size (and of the kernel's, and of the result's rounding) give it. A slip's r
grows past that σ with the number of elements.
The same share is read block by block (a row, a column, a batch element: tapegrad/_blocks.py), where a slip of one
block hides under both the bound of the largest rows and the share of the whole.
"""

import contextlib
import math
import random
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ._blocks import BlockShares
from ._torch_op import float_outputs

# the unit roundoff u of each float dtype: a value rounded to it is x·(1 + δ), |δ| ≤ u
UNIT_ROUNDOFF = {torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11, torch.float32: 2.0**-24, torch.float64: 2.0**-53}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "float32", torch.float64: "float64"}
DRAWS = 2          # random ȳ per comparison
MARGIN = 1.75      # B = MARGIN · the largest figure of rounding measured (below 2: see the module's text)
LOOSE = 4          # torch's own ops at p erring this many times a fused kernel's (or the result's rounding) are loose
HELD = 2           # an op rounding in no torch op at p: a block's composite share held to this × the tight ones
MOVED_32 = 3       # points moved by an ulp the composite is run at, at float32 (one at bf16 and fp16)
SIGMAS = 5         # r, the error's share along x̄, past this many σ of independent errors is of one piece
OP_UNITS = 3       # Rounding: an op errs by up to this many units of its roundoff, and then rounds
POOL = 1 << 12     # Draws: the least number of draws a pool holds
SIGNS = 4          # random sign patterns that measure ‖terms‖₂ of each element of x̄ (the long sums' allowance)
OWN_RUNS = 4       # OwnRounding: runs of an op in torch ops at p with its own roundings falling otherwise
OWN_CAP = 2        # an op in torch ops at p: how far its own roundings move x̄ counts up to this × the composite's


def _sum_length(func, args, result):
    """The number of terms each element of result adds, for a matrix product or a sum; None for other ops."""
    name = func.overloadpacket.__name__
    if name in ("mm", "bmm", "mv", "dot"):
        return args[0].shape[-1]
    if name in ("addmm", "baddbmm"):
        return args[1].shape[-1] + 1
    if name == "sum" and args[0].is_floating_point() and isinstance(result, torch.Tensor):
        return max(1, args[0].numel() // max(1, result.numel()))
    return None


def _summed_terms(func, args, kwargs, each):
    """Σ each(term) of each result element of a matrix product or a sum, each(t) multiplicative (|t|, t²): the
    product run on each(operand); None for other ops."""
    name = func.overloadpacket.__name__
    if name in ("mm", "bmm", "mv", "dot"):
        return func(each(args[0]), each(args[1]))
    if name in ("addmm", "baddbmm"):
        c, a, b = args[0], args[1], args[2]
        return each(c) + func(torch.zeros_like(c), each(a), each(b))
    if name == "sum" and args[0].is_floating_point():
        return func(each(args[0]), *args[1:], **kwargs)
    return None


def _sums(func, args, kwargs):
    """(Σ|terms| of each result element, the number of terms) for a matrix product or a sum; None for other ops."""
    magnitude = _summed_terms(func, args, kwargs, torch.abs)
    return None if magnitude is None else (magnitude, _sum_length(func, args, magnitude))


class SumLengths(TorchDispatchMode):
    """Records the computation's long sums: lengths[k] = the most terms that an element adds, over the matrix products
    and sums whose results have k elements; with walks, also walks[k] = the largest float32 walk figure of those
    results' elements (_walk: its length, ‖terms‖₂ and the result) and the largest |result|."""

    def __init__(self, walks=False):
        super().__init__()
        self.lengths = {}
        self.walks = {} if walks else None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        n = _sum_length(func, args, out)
        if n is not None:
            k = out.numel()
            self.lengths[k] = max(self.lengths.get(k, 1), n)
            if self.walks is not None and n > 1 and k:
                squares = _summed_terms(func, args, kwargs, torch.square)
                result = out.detach().abs()
                walk, largest = float(torch.max(_walk(n, squares, result))), float(torch.max(result))
                old_walk, old_largest = self.walks.get(k, (0.0, 0.0))
                self.walks[k] = (max(old_walk, walk), max(old_largest, largest))
        return out


def _walk(n, terms_squared, result):
    """The rms of a float32 sum of n terms added one after the other, in units of u₃₂, for terms whose ‖terms‖₂² is
    terms_squared and whose sum is result (numbers or tensors alike). It is Σₖ δₖ·Sₖ over the partial sums Sₖ, δₖ
    uniform in ±u₃₂. Terms tₖ = μ + eₖ make Sₖ = kμ + (a walk of the eₖ), Σₖ Sₖ² ≈ μ²n³/3 + σ²n²/2, so the rms is at
    most u₃₂·√n·√(‖terms‖₂²/6 + result²/9), result = nμ (terms of one sign, a column of positive values or ȳ
    correlated with x̂, err about √n times more than terms of random signs); one term has no mean to wander with."""
    return (n * (terms_squared / 6 + (result * result / 9 if n > 1 else 0 * result))) ** 0.5


def _largest_of(m):
    """About how many times its rms the largest of m independent roundings' errors is: √(2·ln(2m))."""
    return math.sqrt(2 * math.log(2 * max(1, m)))


# torch ops whose results only place their inputs' values, or zeros and ones, computing nothing: a select's or a
# slice's backward (a tensor of zeros with the gradient placed in it; a scan's backward in a Python loop makes one of
# the whole input's size per step) and the tensors made of constants. Neither rounding model moves their results.
_PLACES = frozenset(("select_backward", "slice_backward", "zeros", "zeros_like", "new_zeros", "ones", "ones_like",
                     "new_ones", "empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided"))

# The matrix products, and which of their arguments are the two operands.
_PRODUCTS = {"mm": (0, 1), "bmm": (0, 1), "mv": (0, 1), "dot": (0, 1), "addmm": (1, 2), "baddbmm": (1, 2)}


def _finer(t, dtype):
    """Whether t is a floating-point tensor of a finer precision than dtype."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and \
        UNIT_ROUNDOFF.get(t.dtype, 1) < UNIT_ROUNDOFF[dtype]


def _at_float32(tree, dtype):
    """An aten op's arguments with each tensor of dtype cast to float32: the op's float32 twin (a copy, where it
    writes in place)."""
    return _mapped(lambda t: t.to(torch.float32) if isinstance(t, torch.Tensor) and t.dtype == dtype else t, tree)


def _rounded_to(t, dtype):
    """t's values rounded to dtype, kept in t's own dtype (t itself where it is no finer)."""
    if _finer(t, dtype):
        return t.to(dtype).to(t.dtype)
    return t


class Draws:
    """Random draws for a model of rounding: a window of the size wanted at a random offset into a pool of at least
    twice that size, drawn once per device and kind (from a generator seeded from the check's). Two results' windows
    start at different offsets, so an element's draw differs from op to op; drawing afresh for every element of every
    result was most of a model's time (a scan's backward in a Python loop adds a gradient of the whole input's size at
    every step; a layer norm at 4096 × 256 averaged over stochastic roundings spent 0.64 s of 2.2 in torch.randint).
    A pool is no larger than that needs, POOL at least (each model's run fills its own: pools of 65,536 draws were a
    sixth of a check at 64 × 32), and the offsets come from a Python generator seeded from the check's (a torch
    draw per window was another twentieth)."""

    def __init__(self, generator):
        self.generator = generator
        self.pools = {}
        self.derived = {}  # (device, kind, scale): 1 + scale·ξ over the pool of (device, kind), made once per pool
        self.offsets = random.Random(int(torch.randint(2**62, (), generator=generator)))  # the windows' offsets

    def window(self, shape, device, kind, fill, scale=None):
        """A view of shape into the pool of (device, kind), fill(n, generator) making a pool of n draws where there is
        none of at least twice the size; with scale, into 1 + scale·ξ over that pool instead, the same window (made
        once per pool: a model moves every result of every op by such a factor)."""
        n, key = math.prod(shape), (device, kind)
        pool = self.pools.get(key)
        if pool is None or pool.numel() < 2 * n:
            generator = torch.Generator(device).manual_seed(int(torch.randint(2**62, (), generator=self.generator)))
            pool = fill(max(2 * n, POOL), generator)
            self.pools[key] = pool
        offset = self.offsets.randrange(pool.numel() - n + 1)
        if scale is not None:
            factors = self.derived.get((device, kind, scale))
            if factors is None or factors[0] is not pool:
                factors = (pool, (pool * scale).add_(1))
                self.derived[(device, kind, scale)] = factors
            pool = factors[1]
        return pool[offset:offset + n].view(shape)


class Rounding(TorchDispatchMode):
    """A float64 computation that errs as a fused kernel at dtype does (Monte Carlo arithmetic): the operands of each
    matrix product rounded to dtype (what its tensor cores read), every other value kept at float32 (at dtype where
    that is float32). Each floating-point result r of a torch op is computed as it is, moved to r·(1 + k·u·ξ), then
    rounded to float32 (and kept in its own dtype): an op errs by its result's rounding and, being a library's
    function (exp, erf), by up to k = OP_UNITS units more; ξ is uniform in [−1, 1], one per element of every result
    (_uniform). A matrix product's or a sum's result first moves by what summing its n terms in float32 errs by:
    √n·u₃₂·Σ|terms|·ξ. Views and in-place results are left as they are (a copy would cut them from what they alias),
    and so are results that only place, select or copy values (_PLACES, _EXACT_OPS), which a kernel computes
    exactly: a row's maximum moved would equal no element of its row, and amax's backward divides by how many do."""

    def __init__(self, dtype, generator):
        super().__init__()
        self.dtype = dtype
        self.intermediate = torch.float32 if float32_between(dtype) else dtype
        self.draws = Draws(generator)

    def _uniform(self, t, scale=None):
        """ξ uniform in [−1, 1], one per element of t, of t's dtype (Draws); with scale, 1 + scale·ξ."""
        def fill(n, generator):
            return torch.empty(n, dtype=t.dtype, device=t.device).uniform_(-1, 1, generator=generator)
        return self.draws.window(tuple(t.shape), t.device, t.dtype, fill, scale)

    def _moved(self, t, u):
        """t·(1 + OP_UNITS·u·ξ), rounded to the intermediate precision and kept in t's dtype."""
        return (self._uniform(t, OP_UNITS * u) * t).to(self.intermediate).to(t.dtype)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs, name = kwargs or {}, func.overloadpacket.__name__
        if name in _PLACES or name in _EXACT_OPS:
            return func(*args, **kwargs)
        operands = _PRODUCTS.get(name)
        if operands is not None:
            args = tuple(_rounded_to(a, self.dtype) if k in operands else a for k, a in enumerate(args))
        out = func(*args, **kwargs)
        if _aliases(func):
            return out
        u = UNIT_ROUNDOFF[self.intermediate]
        if isinstance(out, torch.Tensor):
            if not (out.is_floating_point() and out.dtype in UNIT_ROUNDOFF and UNIT_ROUNDOFF[out.dtype] < u):
                return out
            sums = _sums(func, args, kwargs)
            if sums is not None:
                magnitude, n = sums
                accumulator = UNIT_ROUNDOFF[torch.float64 if self.dtype == torch.float64 else torch.float32]
                out = out + self._uniform(out) * magnitude.mul_(math.sqrt(n) * accumulator)
            return self._moved(out, u)

        def rounded(t):
            if (isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype in UNIT_ROUNDOFF
                    and UNIT_ROUNDOFF[t.dtype] < u):
                return self._moved(t, u)
            return t
        return _mapped(rounded, out)


def _float64(t):
    return isinstance(t, torch.Tensor) and t.dtype == torch.float64


_ALIASING = {}


def _aliases(func):
    """Whether a result of the aten op func aliases an input (a view, an in-place op's), kept per op: read from its
    schema at every call, it was a good part of a model's time on a scan's thousands of small ops."""
    found = _ALIASING.get(func)
    if found is None:
        found = _ALIASING[func] = any(r.alias_info is not None for r in func._schema.returns)
    return found


_CONTAINERS = (tuple, list, dict)


def _leaves(tree):
    """The leaves of an aten op's arguments or results (tuples, lists and dicts of tensors and scalars), in order: a
    list, built without generators (this runs at every torch op a model of rounding watches)."""
    if not isinstance(tree, _CONTAINERS):
        return [tree]
    found = []
    _gather_leaves(tree, found)
    return found


def _gather_leaves(tree, found):
    for t in (tree.values() if isinstance(tree, dict) else tree):
        if isinstance(t, _CONTAINERS):
            _gather_leaves(t, found)
        else:
            found.append(t)


def _mapped(f, tree):
    """f applied to each leaf of an aten op's arguments or results, the tuples, lists and dicts kept (another
    container, a named tuple of results, through torch's tree_map)."""
    kind = type(tree)
    if kind is tuple or kind is list:
        return kind([_mapped(f, t) if isinstance(t, _CONTAINERS) else f(t) for t in tree])
    if kind is dict:
        return {k: _mapped(f, t) if isinstance(t, _CONTAINERS) else f(t) for k, t in tree.items()}
    if isinstance(tree, _CONTAINERS):
        return tree_map(f, tree)
    return f(tree)


def _aten_ops(*names):
    """The aten overloads named "op.overload" that this torch has, and has a decomposition for."""
    try:
        from torch._decomp import decomposition_table
    except ImportError:
        return {}
    found = {}
    for name in names:
        op, overload = name.split(".")
        func = getattr(getattr(torch.ops.aten, op, None), overload, None)
        if func is not None and func in decomposition_table:
            found[func] = decomposition_table[func]
    return found


# torch's fused kernels that keep a long sum at the op's own dtype on some devices, and the composite of torch's basic
# ops each one is (torch._decomp). On the CPU, F.layer_norm's backward at bf16 sums w̄ and b̄ over the rows in bf16
# (over 4096 rows of 256: an error of 19 where its composite errs 0.65), group norm's likewise (4.8 against 1.1),
# and torch.linalg.vector_norm sums its squares in bf16 (20.7 against 0.25 over 4096 terms).
_COMPOSED = _aten_ops("native_layer_norm.default", "native_layer_norm_backward.default",
                      "native_group_norm.default", "native_group_norm_backward.default",
                      "native_batch_norm.default", "native_batch_norm_backward.default",
                      "linalg_vector_norm.default", "logsumexp.default",
                      "nll_loss_forward.default", "nll_loss_backward.default")


class AtPrecision(TorchDispatchMode):
    """A float64 computation with each torch op computed at dtype: its float64 tensor arguments cast to dtype, the op
    run there (torch's own kernel at dtype: a product accumulating as torch's does at dtype, a softmax in float32
    inside and rounded once), its results rounded to dtype and kept in float64. An op torch has no kernel for at
    dtype (most of fp16's on the CPU) is computed in float32 and rounded to dtype, as a GPU computes fp16 products.
    With composed, a fused op of _COMPOSED runs as the composite of torch's basic ops it decomposes into, each at
    dtype: the op's math at dtype, which a reference given for another op (F.layer_norm for a fused kernel) measures,
    where torch's fused kernel on this device may keep a long sum at dtype. Views and in-place ops run as they are
    (their values are those of tensors already rounded); a value the computation casts to float32 itself stays
    float32."""

    def __init__(self, dtype, composed=False):
        super().__init__()
        self.dtype = dtype
        self.composed = composed

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _aliases(func) or func.overloadpacket.__name__ in _PLACES:
            return func(*args, **kwargs)

        if not any(_float64(t) for t in _leaves((args, kwargs))):
            return func(*args, **kwargs)

        def run_at(dtype):
            # float64 tensors, and float64 named as a dtype (softmax's backward takes its input's), at dtype
            cast = lambda t: t.to(dtype) if _float64(t) else dtype if t is torch.float64 else t
            at_dtype = _mapped(cast, args), _mapped(cast, kwargs)
            composite = _COMPOSED.get(func) if self.composed else None
            if composite is not None:
                try:
                    return composite(*at_dtype[0], **at_dtype[1])
                except (RuntimeError, TypeError, NotImplementedError):  # one this torch cannot run: the own kernel
                    pass
            return func(*at_dtype[0], **at_dtype[1])
        try:
            out, computed = run_at(self.dtype), self.dtype
        except RuntimeError as error:
            if "not implemented for" not in str(error):
                raise
            out, computed = run_at(torch.float32), torch.float32
        home = lambda t: (t.to(self.dtype).to(torch.float64)
                          if isinstance(t, torch.Tensor) and t.dtype in (computed, torch.float64) else t)
        return _mapped(home, out)


class OwnRounding(Rounding):
    """An op that computes in torch ops at dtype, run with its own roundings falling otherwise: each
    result r that a torch op of it computes at dtype (a product, an exp, a sum, a cast down to dtype) moved by about
    as much as its rounding moved it, r + ξ·(u·|r| + e), and rounded to dtype again, ξ uniform in [−1, 1] (_uniform).
    e is how far a product's or a sum's result at dtype is from the same op on its operands in float32, measured
    (a matrix product at bf16 on some CPUs keeps its partial sums at bf16 and errs 14 times the rounding of its
    result over 512 terms). A sample of how the op's own formula errs at dtype, a
    little wider than its own error, which the op's formula sets and not the reference's (a softmax's
    y ⊙ (ȳ − ⟨ȳ, y⟩) along a row where the difference cancels errs far more than the reference there). Results that
    alias, place or select values are left as they are, as Rounding leaves them."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs, name = kwargs or {}, func.overloadpacket.__name__
        out = func(*args, **kwargs)
        if name in _PLACES or (name in _EXACT_OPS and name != "_to_copy") or \
                _aliases(func):
            return out
        u = UNIT_ROUNDOFF[self.dtype]
        wide = None
        if (name in _PRODUCTS or name in ("sum", "mean")) and isinstance(out, torch.Tensor):
            wide = func(*_at_float32(args, self.dtype), **kwargs)

        def moved(t):
            if not (isinstance(t, torch.Tensor) and t.dtype == self.dtype):
                return t
            if name == "_to_copy" and not any(_finer(a, self.dtype) for a in args):
                return t  # a cast that rounds nothing
            r = t.to(torch.float32)
            spread = r.abs().mul_(u)
            if wide is not None and wide.shape == r.shape:
                spread.add_((r - wide).abs_())
            return r.add_(self._uniform(r) * spread).to(self.dtype)
        return _mapped(moved, out)


# torch ops that move, cast, make or select values without rounding them
_EXACT_OPS = frozenset((
    "_to_copy", "copy_", "clone", "detach", "lift_fresh", "lift_fresh_copy", "empty", "empty_like", "empty_strided",
    "new_empty", "new_empty_strided", "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "full",
    "full_like", "new_full", "fill_", "zero_", "cat", "stack", "index", "index_select", "gather", "scatter",
    "index_put_", "masked_fill", "masked_fill_", "where", "neg", "abs", "constant_pad_nd", "contiguous", "flip",
    "roll", "repeat", "tril", "triu", "embedding", "one_hot", "eq", "ne", "lt", "le", "gt", "ge", "max", "min",
    "amax", "amin", "argmax", "argmin", "sort", "topk", "relu", "threshold_backward", "_unsafe_view", "clamp"))


class ArithmeticAt(TorchDispatchMode):
    """Watches an op run: whether any torch op rounded a result at dtype (took a tensor of that dtype and returned
    one: a product, a sum, an exp at bf16), as a composite of torch ops at a low precision does. A fused kernel's
    launch, and torch ops that only move, cast, make or select values (copies, views, cat, zeros), do not count."""

    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype
        self.seen = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.seen and func.overloadpacket.__name__ not in _EXACT_OPS and \
                not _aliases(func):
            at = lambda t: isinstance(t, torch.Tensor) and t.dtype == self.dtype
            self.seen = any(map(at, _leaves((args, kwargs)))) and any(map(at, _leaves(out)))
        return out


class _Run:
    """One op run once: its outputs at the inputs, kept with the graph for its VJPs; with mode (a function making a
    TorchDispatchMode: AtPrecision, Rounding), its forward and backward run under it; with mode an ArithmeticAt, its
    forward is watched for torch ops that round at its dtype, and rounds_in_torch says whether one did (what the
    comparison reads before any VJP: its backward runs unwatched)."""

    def __init__(self, fn, args, slots, kwargs, who, mode=None):
        self._watch = mode if isinstance(mode, ArithmeticAt) else None
        self.mode = mode if mode is not None and self._watch is None else contextlib.nullcontext
        self.args, self.slots, self.kwargs = list(args), slots, kwargs  # as given: a reference runs on the same
        self.xs = [args[i].detach().requires_grad_() for i in slots]
        args = list(args)
        for i, x in zip(slots, self.xs):
            args[i] = x
        try:
            with torch.enable_grad(), (self.mode() if self._watch is None else self._watch):
                self.ys = float_outputs(fn(*args, **kwargs))
        except Exception as error:
            raise RuntimeError(f"gradcheck: {who} raised {type(error).__name__}: {error}") from error
        if not self.ys:
            raise TypeError(f"gradcheck: {who} returned no floating-point tensor")
        self.fn, self.who = fn, who

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

    @property
    def rounds_in_torch(self):
        """Whether a torch op of the run rounded at the watched dtype (None: not watched)."""
        return None if self._watch is None else self._watch.seen


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


# The figures a bound is the largest of, as the report names them.
FIGURES = ("composite", "fused", "sums", "storage", "own")


def _bound(figures):
    """B: MARGIN times the largest of the figures, the composite's held where it is (_held)."""
    return MARGIN * max(v for _, v in _held(figures))


def _held(figures):
    """The figures a bound is the largest of, the composite's held to figures["cap"] where that is set: (name, value)
    pairs, "cap" in the composite's place where it holds."""
    composite, cap = figures["composite"], figures.get("cap", 0.0)
    return [("cap", cap) if k == "composite" and 0 < cap < composite else (k, figures[k]) for k in FIGURES]


@dataclass
class _Seen:
    """What _Comparison's draws gather for the bounds read after them: the dtype p, whether a 16-bit kernel computes
    in float32 between its values (working), per input and ȳ the element-wise errors (|x̄ₚ − x̄₆₄|, ½ulp of each
    element of x̄₆₄, x̄₆₄), per input [the composite's and fused model's largest |r| along x̄, the noise σ of r, the
    same two of the op's own roundings] (along_rounding), and per input its blocks' shares (BlockShares, or None)."""
    dtype: object
    working: bool
    elements: list
    along_rounding: list
    blocks: list


def _element_excess(figures, elements):
    """The worst element past its own bound, over the ȳ drawn: (its index, its error, x̄₆₄ there, MARGIN × its own
    rounding, MARGIN × the other figures), or None. elements: per ȳ (|x̄ₚ − x̄₆₄|, ½ulp of x̄₆₄'s elements, x̄₆₄)."""
    excess = None
    others = MARGIN * max(v for k, v in _held(figures) if k != "storage")
    for diff, own, exact in elements:
        past = diff - np.maximum(others, MARGIN * own)
        k = int(np.argmax(past)) if past.size else 0
        if past.size and past.reshape(-1)[k] > 0 and (excess is None or diff.reshape(-1)[k] > excess[1]):
            index = np.unravel_index(k, diff.shape)
            excess = (index, float(diff.reshape(-1)[k]), float(exact.reshape(-1)[k]),
                      MARGIN * float(own.reshape(-1)[k]), others)
    return excess


class _Comparison:
    """The kernel's VJPs and values against the reference's, and what rounding explains, per input: the figures
    (FIGURES: the composite's error at p, the fused kernel's model, the long sums' allowance, the result's own
    rounding) and B = MARGIN times the largest."""

    def __init__(self, kernel, reference_at, dtype, cotangents_64, generator, composed):
        # x, and x moved by an ulp at p (MOVED_32 moved points at float32). A right computation at p errs as an exact
        # one does at an input moved by an ulp of the precision it computes in: at float32 that is the inputs' own, so
        # the moved point's figures are against float64 at x and carry x̄'s sensitivity to the input; a 16-bit kernel
        # computes in float32 between exact 16-bit inputs and its stored values, which the composite at p rounds
        # already, so there the moved point is a second sample of how rounding falls, against float64 at its own point.
        with SumLengths(walks=True) as forward_sums:  # a backward may sum again what the forward sums (a row's or a
            # column's); and the forward's own sums are a figure of y's
            reference64 = reference_at(None)
        self.kernel, self.reference64 = kernel, reference64  # kept: the naming compares with them again
        u = UNIT_ROUNDOFF[dtype]
        working = float32_between(dtype)
        # At float32, where no fused model is run, MOVED_32 moved points: the composite's largest error over more
        # samples, a steadier figure for a right kernel erring by chance in another place.
        moves = range(1, 1 + (1 if working else MOVED_32))
        points = [(0, reference64)] + [(k, reference_at(None, move=k) if working else reference64) for k in moves]
        composite = [(reference_at(lambda: AtPrecision(dtype, composed), move=k), exact) for k, exact in points]
        # a fused kernel's float32 between products differs from the composite: its model, at x alone. The model
        # draws its roundings afresh at every run, so at a moved point it was only another sample, as each ȳ is one,
        # and about a sixth of a check at 64 × 32; without it the precision sets' verdicts were the same, and so were
        # the kinds named but for one slip of 1,332 in the partial tables. (Not so the composite's moved point: without
        # it a right causal attention in bf16 torch ops failed by its share along q̄, 1.1 times what rounding
        # explained.)
        fused = [(reference_at(lambda: Rounding(dtype, generator)), reference64)] if working else []
        count = len(kernel.xs)
        self.error = [0.0] * count
        self.own = [0.0] * count  # how far the kernel's x̄ moves with its own roundings falling otherwise, the largest
        self.along = [0.0] * count      # the kernel's share r of x̄₆₄ in its error, the largest |r| over the ȳ drawn
        # [the composite's and fused model's |r|, the noise σ; the op's own roundings' |r| and σ]
        along_rounding = [[0.0, 0.0, 0.0, 0.0] for _ in range(count)]
        self.along_rest = [0.0] * count   # the rms of the rest of that error, d − r·x̄₆₄
        self.rounding_rms = [0.0] * count  # the rms of rounding's error: the composite's, the fused model's, storage's
        self.sizes = [x.numel() for x in kernel.xs]
        self.figures = [dict.fromkeys(FIGURES, 0.0) for _ in range(count)]
        self.worst = [None] * count
        self.values = [(math.nan, math.nan)] * count  # (the kernel's, the reference's) at the worst element
        self.scale = [0.0] * count       # ‖x̄₆₄‖∞, the largest over the ȳ drawn
        self.factor = [[] for _ in range(count)]  # per ȳ: (c, max |x̄ₚ − c·x̄₆₄|), c the least-squares factor
        sums = SumLengths()  # the reference's backward, run here anyway: how many terms its sums add
        terms = _terms_norms(reference64, cotangents_64[0], generator, sums)
        self.output_shapes = [tuple(y.shape) for y in kernel.ys]
        # the share along x̄ block by block (tapegrad/_blocks.py); an op rounding in no torch op at p (a fused kernel,
        # torch ops in float32) has the composite's figures there held to HELD times the tight ones
        held = working and kernel.rounds_in_torch is False
        # an op computing in torch ops at p rounds as its own formula does, which the composite's figures need not
        # show: it is run again with its own roundings falling otherwise (OwnRounding), a figure of its own. At bf16
        # and fp16 always (its blocks are held to them); at float32, where that figure can only widen the bound, only
        # where the op errs past the bound without it (below): a scan in a Python loop is run four times less
        own = _own_runs(kernel, dtype, generator) if kernel.rounds_in_torch and working else []
        later = bool(kernel.rounds_in_torch and not working)
        gots = []  # the op's VJPs per ȳ, kept for those runs
        seen = _Seen(dtype, working, [[] for _ in range(count)], along_rounding,
                     [BlockShares(x.shape, u, HELD if held else None) if working else None for x in kernel.xs])
        elements, blocks = seen.elements, seen.blocks
        outputs = sum(y.numel() for y in kernel.ys)
        # the ȳ drawn and x̄₆₄ at each, the blocks and the elements' errors: kept for the blocks' averaged reading
        # (tapegrad/_averaged.py), which closes the blocks again
        self.cotangents, self.exact, self.blocks, self._elements = cotangents_64, [], blocks, elements
        self.averaged_runs = 0  # set by tapegrad/_averaged.py where it reads blocks again
        for g in cotangents_64:
            exact_at = {id(reference64): reference64.vjp(g)}  # float64's VJP at each point, once
            for _, e in points:
                if id(e) not in exact_at:
                    exact_at[id(e)] = e.vjp(g)
            exact = exact_at[id(reference64)]
            self.exact.append(exact)
            got = kernel.vjp(g)
            if later:
                gots.append(got)
            at_p = [(s.vjp(g), exact_at[id(e)]) for s, e in composite]
            at_fused = [(s.vjp(g), exact_at[id(e)]) for s, e in fused]
            at_own = [s.vjp(g) for s in own]
            for i in range(count):
                self._take_draw(i, got[i], exact[i], (at_p, at_fused), seen, [o[i] - got[i] for o in at_own])
        for i in range(count):
            # a float32 sum of n terms, n the outputs each element of x̄ gathers from (at least one; or the length of
            # the reference's longest product or sum, forward or backward, whose result is the size of x̄, where
            # longer: a weight's gradient sums over the rows, or sums again a column the forward sums)
            size = kernel.xs[i].numel()
            n = max(1.0, outputs / max(1, size), sums.lengths.get(size, 1), forward_sums.lengths.get(size, 1))
            self._sums_and_storage(i, n, terms[i], dtype, held)
        if later and not all(within(e, _bound(f)) for e, f in zip(self.error, self.figures)):
            own = _own_runs(kernel, dtype, generator)
            for g, got in zip(cotangents_64, gots):
                at_own = [s.vjp(g) for s in own]
                for i in range(count):
                    self._own_moves(i, [o[i] - got[i] for o in at_own])
        self.own_sampled = bool(own)
        for f, moved in zip(self.figures, self.own):
            # an op computing in torch ops at p errs as its own formula does: how far its own roundings, falling
            # otherwise, move x̄ counts as a figure, up to OWN_CAP times the composite's (a softmax's backward written
            # as y ⊙ (ȳ − ⟨ȳ, y⟩) in bf16 ops erred up to 1.8 times the composite's figure, a gated linear unit's 2.5)
            f["own"] = min(moved, OWN_CAP * f["composite"])
        self.bound = [_bound(f) for f in self.figures]
        # what rounding may move a VJP at p by, the composite's figure unheld: the noise a structural kind's fit allows
        # (a kernel held to a fused kernel's arithmetic is judged by bound, and its slip named through its noise)
        # (the op's own roundings left out: a running sum kept at bf16 moves with them, and reads as a scale of 0.99
        # in their noise)
        self.noise_bound = [MARGIN * max(f[k] for k in FIGURES if k != "own") for f in self.figures]
        # At bf16 and fp16 the result's rounding moves each element by half an ulp of its own: an element's error is
        # held to MARGIN times the larger of that and the other figures, not to the largest element's half ulp. The
        # worst element past it: (its index, its error, x̄₆₄ there, MARGIN × its own rounding, MARGIN × the others).
        self.element_excess = [_element_excess(self.figures[i], elements[i]) for i in range(count)]
        # |r| rounding explains (bf16, fp16): MARGIN times the composite's or the fused model's own, or SIGMAS times
        # the noise σ its independent errors give r (the composite's, the fused model's, the kernel's own, and the
        # result's rounding: u/√3 rms relative to each element); the op's own roundings' r and σ count up to OWN_CAP
        # times those
        self.along_bound = [max(MARGIN * max(r, min(r_own, OWN_CAP * r)),
                                SIGMAS * max(sigma, min(sigma_own, OWN_CAP * sigma))) if working else math.inf
                            for r, sigma, r_own, sigma_own in along_rounding]
        self.close_blocks()
        y64, yk = reference64.values(), kernel.values()
        self.forward_error = max((_largest([a - b]) if a.shape == b.shape else math.inf) for a, b in zip(yk, y64))
        forward_rounding = max(_largest([a - b]) for s, e in composite + fused for a, b in zip(s.values(), e.values()))
        # y's own rounding as u·‖y₆₄‖∞, up to a whole ulp: a right forward may round an intermediate (a product's
        # result) at p and then its output, two roundings where x̄'s figure above allows one. And a fused kernel's
        # float32 sums, as x̄'s: the walk of the forward's longest product or sum whose result is y's size (its
        # largest element's), carried to y in proportion to their magnitudes where y is the smaller (a product
        # scaled by 1/√d), never enlarged
        self.forward_figures = {"composite": forward_rounding, "storage": u * _largest(y64), "sums": 0.0, "terms": 1}
        for y in y64:
            walk, largest = forward_sums.walks.get(y.size, (0.0, 0.0))
            if walk > 0:
                carried = min(1.0, _largest([y]) / largest) if largest > 0 else 1.0
                figure = UNIT_ROUNDOFF[torch.float32] * walk * _largest_of(y.size) * carried
                if figure > self.forward_figures["sums"]:
                    self.forward_figures.update(sums=figure, terms=forward_sums.lengths[y.size])
        self.forward_bound = MARGIN * max(self.forward_figures[k] for k in ("composite", "storage", "sums"))

    def one_run_verdicts(self):
        """The blocks set aside for the averaged reading judged by their one run instead, and closed."""
        for blocks in self.blocks:
            if blocks is not None:
                blocks.undefer()
        self.close_blocks()

    def close_blocks(self):
        """The blocks' verdicts: per input the block most past its bound (block_excess), and the one block past its
        bound with x̄ within its bound outside it, a slip of that block (block_alone); Blocks (tapegrad/_blocks.py),
        or None."""
        self.block_excess = [None if b is None else b.excess() for b in self.blocks]
        self.block_alone = [None if b is None else b.alone_past([diff for diff, _, _ in self._elements[i]],
                                                                self.bound[i])
                            for i, b in enumerate(self.blocks)]

    def _take_draw(self, i, got, exact, models, seen, own):
        """Input i's VJP at one ȳ: the kernel's (got) against float64's (exact), beside the composite's at p and the
        fused model's (models: their (VJP, float64's at its point) pairs), into the figures; own: how far the
        kernel's VJP moves with its own roundings falling otherwise (an op in torch ops at p); seen: what the bounds
        after the draws read (_Seen)."""
        # a model's sample that is not finite (a value overflowing at p, a division its rounding made 0/0) measures
        # nothing: left out, so that it neither loosens a bound to inf nor leaves a NaN in one. Each model as its
        # error and float64's x̄ at its point, (m − e, e), each array made once (at 4096 × 256 a pass is milliseconds)
        at_p, at_fused = ([(m[i] - e[i], e[i]) for m, e in pairs if np.all(np.isfinite(m[i]))] for pairs in models)
        models = at_p, at_fused
        error = got - exact
        diff = np.abs(error)
        if seen.working:  # each element's own rounding, held against its error once the other figures are known
            seen.elements[i].append((diff, half_ulps(exact, seen.dtype), exact))
        k = largest_past(diff, self.error[i])
        if k is not None:
            self.error[i] = float(diff.reshape(-1)[k])
            self.worst[i] = np.unravel_index(k, diff.shape)
            self.values[i] = (float(got.reshape(-1)[k]), float(exact.reshape(-1)[k]))
        figures = self.figures[i]
        figures["composite"] = max([figures["composite"]] + [_largest([d]) for d, _ in at_p])
        figures["fused"] = max([figures["fused"]] + [_largest([d]) for d, _ in at_fused])
        self.scale[i] = max(self.scale[i], _largest([exact]))
        r, sigma = along(error, exact)
        self.factor[i].append((1 + r, _largest([got - (1 + r) * exact])))
        own = self._own_moves(i, own)
        if not seen.working:
            return
        u = UNIT_ROUNDOFF[seen.dtype]
        if not abs(r) <= abs(self.along[i]):
            self.along[i] = r
            self.along_rest[i] = _rms(got - exact - r * exact)
        rounding = seen.along_rounding[i]
        storage_rms = u / math.sqrt(3) * _rms(exact)  # rounding to p: δ uniform in ±u, relative
        rounding[1] = max(rounding[1], sigma, u / math.sqrt(3) * along(np.abs(exact), exact)[1])
        self.rounding_rms[i] = max(self.rounding_rms[i], storage_rms)
        for d, e in at_p + at_fused:
            r_m, sigma_m = along(d, e)
            rounding[0], rounding[1] = max(rounding[0], abs(r_m)), max(rounding[1], sigma_m)
            self.rounding_rms[i] = max(self.rounding_rms[i], _rms(d))
        for d in own:  # its own roundings, falling otherwise, move x̄ along itself too (a row's rounded statistic)
            r_o, sigma_o = along(d, exact)
            rounding[2], rounding[3] = max(rounding[2], abs(r_o)), max(rounding[3], sigma_o)
        if seen.blocks[i] is not None:
            _block_draw(seen.blocks[i], error, exact, models, u, own)

    def _own_moves(self, i, moves):
        """How far input i's VJP moved in the op's runs with its own roundings falling otherwise (moves, at one ȳ)
        into self.own[i], the largest; the finite ones, which alone measure anything, returned."""
        moves = [d for d in moves if np.all(np.isfinite(d))]
        self.own[i] = max([self.own[i]] + [_largest([d]) for d in moves])
        return moves

    def _sums_and_storage(self, i, n, terms, dtype, held):
        """Input i's figures for a float32 sum of n terms (terms: the 2-norm of what its elements sum) and for the
        result's own rounding; the composite's held to their sum and the fused model's where held."""
        # the walk of n float32 additions (_walk), x̄ⱼ up to ‖x̄₆₄‖∞; the largest of the m·DRAWS elements compared is
        # about _largest_of(m·DRAWS) times its rms
        walk = _walk(n, terms ** 2, self.scale[i])
        self.figures[i]["sums"] = UNIT_ROUNDOFF[torch.float32] * walk * _largest_of(self.sizes[i] * DRAWS)
        self.figures[i]["terms"] = n
        self.figures[i]["storage"] = half_ulp(self.scale[i], dtype)
        # torch's own ops at p (which keep values at p between ops, and on some devices sum at p) excuse only an
        # op that rounds in torch ops at p itself; a fused kernel, or one computing in float32, errs by its own
        # arithmetic: its products' operands at p (the fused model), its float32 sums, and then its result's
        # rounding, which add. The composite's figure is held to their sum. (It was held to twice the larger of the
        # fused model's figure and the result's rounding: a recurrence keeping its state at bf16 erred 2.7 times
        # the result's rounding, twice the composite's own error, and passed under 3.5.)
        f = self.figures[i]
        if held and f["fused"] > 0:
            f["cap"] = f["storage"] + f["fused"] + f["sums"]

    def constant_factor(self, i):
        """c where input i's VJP is c times the reference's at every element, for every ȳ drawn: what is left,
        x̄ₚ − c·x̄₆₄, within max(1, |c|)·B (a computation scaled by c scales its rounding too), c the mean of the
        least-squares factors cₖ of the ȳ drawn; what is left at the k-th is at most |cₖ − c|·‖x̄₆₄‖∞ + its rest with
        cₖ (rounding moves each cₖ a little). None otherwise, or where c is 1 to within B."""
        fits = self.factor[i]
        if not fits or not self.scale[i] > 0:
            return None
        c = sum(ci for ci, _ in fits) / len(fits)
        if all(within(abs(ci - c) * self.scale[i] + rest, max(1.0, abs(c)) * self.bound[i]) for ci, rest in fits) \
                and abs(c - 1) * self.scale[i] > self.bound[i]:
            return c
        return None

    def judged_by(self, i):
        """The figure the bound of input i is MARGIN times ("cap" where the composite's is held to it)."""
        return max(_held(self.figures[i]), key=lambda kv: kv[1])[0]

    def passed(self, i):
        return self.error_within(i) and self.along_passed(i) and self.block_excess[i] is None

    def error_within(self, i):
        """Whether input i's largest error is within B, and each element's within its own (its share along x̄
        aside)."""
        return within(self.error[i], self.bound[i]) and self.element_excess[i] is None

    def only_a_block_fails(self, i):
        """Whether input i is within the bound at every element and along x̄ as a whole, and only a block fails it."""
        return self.error_within(i) and self.along_passed(i) and self.block_excess[i] is not None

    def along_passed(self, i):
        return within(abs(self.along[i]), self.along_bound[i])

    def forward_passed(self):
        return within(self.forward_error, self.forward_bound)


def _block_draw(blocks, d, exact, models, u, own):
    """One ȳ's block shares of an input: the kernel's error d where x̄₆₄ is exact, the composite's and the fused
    model's errors at their points (models: their (error, float64's x̄ at its point) pairs), how far the kernel's own
    roundings falling otherwise move it (own), and the result's rounding (u/√3 rms, relative to each element)."""
    at_p, at_fused = models
    for error, e in at_p:
        blocks.add_rounding(error, e, composite=True)
    for error, e in at_fused:
        blocks.add_rounding(error, e, composite=False)
    for moved in own:
        blocks.add_own(moved, exact)
    blocks.add_kernel(d, exact)
    blocks.add_storage(exact, u)
    blocks.draw(MARGIN, SIGMAS)


def along(d, exact):
    """(r, σ): the share of x̄ itself in an error d = x̄ₚ − x̄₆₄, r = ⟨d, x̄⟩/⟨x̄, x̄⟩ (x̄ₚ ≈ (1 + r)·x̄ + the rest),
    and the σ of r were d's elements independent, √(Σ d²x̄²)/⟨x̄, x̄⟩. Rounding's errors are nearly independent and
    r is then a few σ at most; a slip's error is of one piece, and r grows with x̄'s size past σ: a scale of 1.004 at
    bf16, under half an ulp at each element, is many σ out at a few hundred elements."""
    d, exact = np.asarray(d, dtype=np.float64).reshape(-1), np.asarray(exact, dtype=np.float64).reshape(-1)
    norm = float(np.dot(exact, exact))
    if not norm > 0:
        return 0.0, 0.0
    return float(np.dot(d, exact)) / norm, math.sqrt(float(np.dot(d * d, exact * exact))) / norm


def _rms(a):
    a = np.asarray(a, dtype=np.float64)
    return math.sqrt(float(np.mean(a * a))) if a.size else 0.0


def half_ulp(largest, dtype):
    """The most that rounding to nearest at dtype moves a value of magnitude up to `largest`: half a unit in the last
    place of its binade, u·2^⌊log₂ largest⌋ (between ½·u·largest and u·largest). The binade is taken at
    largest·(1 + 4u), so that a value computed a few roundings above a power of two is held to the binade it is
    stored in."""
    u = UNIT_ROUNDOFF[dtype]
    if not (largest > 0 and math.isfinite(largest)):
        return u * largest
    return u * 2.0 ** math.floor(math.log2(largest * (1 + 4 * u)))


def half_ulps(values, dtype):
    """half_ulp of each element of an array: u·2^⌊log₂ |v|·(1 + 4u)⌋, the binade no lower than dtype's smallest
    normal one (below it, the subnormals' fixed spacing)."""
    u = UNIT_ROUNDOFF[dtype]
    magnitude = np.maximum(np.abs(np.asarray(values, dtype=np.float64)) * (1 + 4 * u), torch.finfo(dtype).tiny)
    return u * np.exp2(np.floor(np.log2(magnitude)))


def float32_between(dtype):
    """Whether a kernel at dtype keeps its values in float32 between its inputs and its stored results (bf16, fp16)."""
    return UNIT_ROUNDOFF[dtype] > UNIT_ROUNDOFF[torch.float32]


def _terms_norms(reference64, cotangents, generator, sums):
    """max over the elements of x̄ of ‖terms‖₂, the terms J_kj·ȳ_k whose sum is x̄_j, per input: the mean of
    (Jᵀ(ȳ ⊙ s))_j² over random signs s is Σ_k (J_kj·ȳ_k)². The first backward runs under sums (a SumLengths: its
    products and sums are the same at every s)."""
    squares = None
    for n in range(SIGNS):
        signed = [g * (torch.randint(0, 2, tuple(g.shape), generator=generator, dtype=torch.float64) * 2 - 1)
                  for g in cotangents]
        with sums if n == 0 else contextlib.nullcontext():
            grads = reference64.vjp(signed)
        squares = [q ** 2 for q in grads] if squares is None else [a + q ** 2 for a, q in zip(squares, grads)]
    return [math.sqrt(_largest([q / SIGNS])) for q in squares]


def largest_past(diff, error):
    """The flat index of diff's largest element where that is past error, or where diff is not finite somewhere (a NaN
    ranked as inf, its own index); None otherwise."""
    if diff.size and (not np.all(np.isfinite(diff)) or float(np.max(diff)) > error):
        return int(np.argmax(np.where(np.isfinite(diff), diff, np.inf)))
    return None


def within(error, bound):
    """An error rounding explains: finite, and at most the bound."""
    return math.isfinite(error) and error <= bound


def _cotangents(run, generator):
    """DRAWS random ȳ in float64 for the run's outputs (rounded to each output's dtype by the VJPs that use them)."""
    return [[torch.randn(tuple(y.shape), generator=generator, dtype=torch.float64).to(y.dtype).to(torch.float64)
             for y in run.ys] for _ in range(DRAWS)]


def _own_runs(kernel, dtype, generator):
    """OWN_RUNS runs of the kernel with its own roundings at dtype falling otherwise (OwnRounding), at its inputs;
    none where one raises (its blocks are then held as before: tapegrad/_blocks.py)."""
    mode = OwnRounding(dtype, generator)
    try:
        return [_Run(kernel.fn, kernel.args, kernel.slots, kernel.kwargs, kernel.who, lambda: mode)
                for _ in range(OWN_RUNS)]
    except (RuntimeError, TypeError):
        return []


def compare(kernel, ref_fn, dtype, generator, label, composed=False, averaged=None):
    """kernel (a _Run of the op at dtype) against ref_fn on the same values (kernel.args, with kernel.kwargs, on their
    device): ref_fn in float64, and with its ops at dtype (and in the fused kernel's model, at bf16 and fp16) on those
    args and on them moved by an ulp, at DRAWS random ȳ drawn from generator. label: how errors name ref_fn ("the
    reference f in float64"). composed: ref_fn is a reference given for another op, whose fused torch ops are measured
    at dtype as their composites (AtPrecision); where the op is its own reference, its fused kernels are what is
    checked. averaged: what judges the blocks of an op in torch ops at dtype that one run put FLOOR units or more
    along themselves (tapegrad/_averaged.py's judge_averaged, given the comparison); without it, their one run's
    verdicts hold."""
    args, slots, kwargs, device = kernel.args, kernel.slots, kernel.kwargs, kernel.xs[0].device
    moved = {}

    def reference_at(mode, move=0):
        """ref_fn run under mode (None: in float64) at args (move 0) or at the move-th point moved by an ulp."""
        if move and move not in moved:
            moved[move] = _nudged(args, slots, dtype, generator)
        who = label if mode is None else f"{label}, with its ops at {DTYPE_NAMES[dtype]}"
        return _Run(ref_fn, _cast(moved[move] if move else args, torch.float64, device), slots, kwargs, who, mode)
    comparison = _Comparison(kernel, reference_at, dtype, _cotangents(kernel, generator), generator, composed)
    if averaged is not None:
        averaged(comparison)
    else:
        comparison.one_run_verdicts()
    return comparison
