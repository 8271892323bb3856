"""A block that passes only because the op rounds in torch ops at p, read again with the op's roundings averaged out.

An op computing in torch ops at bf16 or fp16 rounds as its own formula does, and each block of its x̄ (a row, a
column, a batch element: tapegrad/_blocks.py) is allowed as much as its own roundings, falling otherwise, move it
(OWN times). Where those roundings are large, a block a few percent off hides in that allowance: a layer norm in bf16
ops whose rows move by a unit or two of roundoff from one rounding to the next passed with a row 2% off (5 units).
One run cannot tell the two apart; many can. Rounding each of the op's results stochastically, to the value below or
above with the odds that make its mean the exact one, leaves the op's formula unchanged on average: its share along
a block, averaged over runs, is then the formula's own (a slip's, which is the same at every run and every ȳ) plus
a mean of independent roundings, which shrinks as 1/√runs. So where a block of such an op passes only by its own
allowance (past MARGIN times the composite's share, SIGMAS σ and FLOOR units; BlockShares.adapted), the op is run
AVERAGED_RUNS times more under StochasticRounding, at the same ȳ, and in each such block

        r̄_b = the mean over runs and ȳ of ⟨x̄ₚ − x̄₆₄, x̄₆₄⟩/⟨x̄₆₄, x̄₆₄⟩ over the block,   s_b its standard error

fails where |r̄_b| > max(AVERAGED_UNITS · u, AVERAGED_SE · s_b). Over the 72 right checks at bf16 of the kernels in
bf16 ops of python/tests/precision_ops16.py's BUILD set (seeds 1–2), the largest |r̄_b| was 2.3 units, and its
t = |r̄_b|/s_b then 2.3; each block 2% off there averaged 4.4 to 6.1 units, at t of 6.7 or more.

What stays in r̄_b besides the formula: constants the op makes at p (a 1/√d stored at bf16, under a unit), results of
ops that cannot be recomputed in float32 (kept as they are), and at fp16 a small bias where a value within an ulp of
a power of two rounds across it. A value the op keeps at p (a running sum, a row statistic) averages out as its
rounding does: what is left is not a precision defect.
"""

import math

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from ._blocks import shares
from ._rounding import _EXACT_OPS, _PLACES, UNIT_ROUNDOFF, _Run

AVERAGED_RUNS = 16   # runs of the op under StochasticRounding, each VJP'd at every ȳ drawn
AVERAGED_UNITS = 3   # a block's averaged share past this many units of p's roundoff (2% at bf16 is 5.1) ...
AVERAGED_SE = 5      # ... and past this many standard errors of its mean is the formula's, not rounding's


def stochastically_rounded(wide, dtype, generator):
    """wide's values rounded to dtype stochastically: to the neighbour above with probability (x − below)/(above −
    below), so that the mean is x. bf16 is float32's upper half: add a uniform 16-bit integer to float32's bits and
    cut the lower half off. fp16: x + (U − ½)·ulp rounded to nearest, the ulp of x's binade (a value within an ulp
    above a power of two may round into the binade below, a bias of a fraction of an ulp there)."""
    w = wide.detach().to(torch.float32).contiguous()
    if dtype == torch.bfloat16:
        noise = torch.randint(0, 1 << 16, tuple(w.shape), generator=generator, dtype=torch.int32).to(w.device)
        return ((w.view(torch.int32) + noise) & -65536).view(torch.float32).to(dtype)
    exact = w.to(dtype)
    _, exponent = torch.frexp(w.double())
    ulp = torch.ldexp(torch.ones_like(w, dtype=torch.float64),
                      torch.clamp(exponent, min=math.frexp(torch.finfo(dtype).tiny)[1])) * UNIT_ROUNDOFF[dtype]
    noise = (torch.rand(tuple(w.shape), generator=generator, dtype=torch.float64).to(w.device) - 0.5) * ulp
    return torch.where(exact.to(torch.float64) == w.double(), exact, (w.double() + noise).to(dtype))


def _finer(t, dtype):
    """Whether t is a floating-point tensor of a finer precision than dtype."""
    return isinstance(t, torch.Tensor) and t.is_floating_point() and \
        UNIT_ROUNDOFF.get(t.dtype, 1) < UNIT_ROUNDOFF[dtype]


class StochasticRounding(TorchDispatchMode):
    """An op computing in torch ops at dtype, each of its roundings to dtype made stochastic: a result of dtype that
    a torch op computes (a product, a sum, an exp; in place too) is computed again on its operands in float32 and
    rounded stochastically (stochastically_rounded); a cast down to dtype rounds its source so. Results that alias,
    place or select values are left as they are, and so are those of an op with no float32 kernel."""

    def __init__(self, dtype, generator):
        super().__init__()
        self.dtype, self.generator = dtype, generator

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs, name = kwargs or {}, func.overloadpacket.__name__
        writes = [r.alias_info is not None and r.alias_info.is_write for r in func._schema.returns]
        if name in ("_to_copy", "copy_"):  # a cast: the source rounded stochastically where it is finer than dtype
            source = args[0] if name == "_to_copy" else args[1]
            if kwargs.get("dtype", args[0].dtype if name == "copy_" else None) == self.dtype and \
                    _finer(source, self.dtype):
                rounded = stochastically_rounded(source, self.dtype, self.generator)
                args = (rounded,) + tuple(args[1:]) if name == "_to_copy" else (args[0], rounded) + tuple(args[2:])
            return func(*args, **kwargs)
        if name in _PLACES or name in _EXACT_OPS or \
                any(r.alias_info is not None and not w for r, w in zip(func._schema.returns, writes)):
            return func(*args, **kwargs)
        at_32 = lambda t: t.to(torch.float32) if isinstance(t, torch.Tensor) and t.dtype == self.dtype else t
        in_place = any(writes)
        wide_args = tree_map(at_32, args)
        if in_place:  # the float32 copy of the tensor written takes the write
            wide_args = (args[0].to(torch.float32),) + tuple(wide_args[1:])
        out = func(*args, **kwargs)
        if not (isinstance(out, torch.Tensor) and out.dtype == self.dtype):
            return out
        try:
            wide = func(*wide_args, **tree_map(at_32, kwargs))
        except (RuntimeError, TypeError, NotImplementedError):
            return out
        if not (isinstance(wide, torch.Tensor) and wide.shape == out.shape and wide.is_floating_point()):
            return out
        rounded = stochastically_rounded(wide, self.dtype, self.generator)
        if in_place:
            with torch.no_grad():
                out.copy_(rounded)
            return out
        return rounded


def judge_averaged(comparison, dtype, seed):
    """Where a block of an op in torch ops at dtype passed only by its own allowance (BlockShares.adapted), the op's
    share along that block with its roundings averaged out (the module's text), judged in that block; the comparison's
    blocks closed again. Returns the number of runs made (0 where no block needed them)."""
    blocks = comparison.blocks
    comparison.averaged_runs = 0
    wanted = [i for i, b in enumerate(blocks) if b is not None and b.adapted]
    if not wanted:
        return 0
    kernel, u = comparison.kernel, UNIT_ROUNDOFF[dtype]
    generator = torch.Generator().manual_seed(int(seed) * 7919 + 17)
    mode = StochasticRounding(dtype, generator)
    samples = {i: {k: [] for k in {k for k, _ in blocks[i].adapted}} for i in wanted}
    try:
        for _ in range(AVERAGED_RUNS):
            run = _Run(kernel.fn, kernel.args, kernel.slots, kernel.kwargs, kernel.who, lambda: mode)
            for g, exact in zip(comparison.cotangents, comparison.exact):
                got = run.vjp(g)
                for i in wanted:
                    for k in samples[i]:
                        samples[i][k].append(shares(got[i] - exact[i], exact[i], [blocks[i].parts[k]])[0][0])
    except (RuntimeError, TypeError):  # an op that cannot run so is judged as before
        return 0
    for i in wanted:
        for k, rows in samples[i].items():
            r = np.array(rows)
            if not np.all(np.isfinite(r)):
                continue
            mean = r.mean(axis=0)
            error = r.std(axis=0, ddof=1) / math.sqrt(len(r))
            bound = np.maximum(AVERAGED_UNITS * u, AVERAGED_SE * error)
            blocks[i].judge_averaged(k, mean, bound, AVERAGED_RUNS)
    comparison.averaged_runs = AVERAGED_RUNS
    comparison.close_blocks()
    return AVERAGED_RUNS
