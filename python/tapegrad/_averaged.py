"""A block of an op in torch ops at p, judged with the op's roundings averaged out.

An op computing in torch ops at bf16 or fp16 rounds as its own formula does, and one run's share along a block of its
x̄ (a row, a column, a batch element: tapegrad/_blocks.py) moves by as much as its own roundings move it. Where those
are large, one run cannot tell a block a few percent off from a rounding that moves it as far: a layer norm in bf16 ops
whose rows move by a unit or two of roundoff from one rounding to the next passed with a row 2% off (5 units) within
the allowances for noise and for its own roundings; a causal attention's second row, whose x̄ is one scalar times
k₀ − k₁, erred 22 units along itself in one run of a right kernel and failed. Many runs can. Rounding each of the op's
results stochastically, to the value below or above with the odds that make its mean the exact one, leaves the op's
formula unchanged on average: its share along a block, averaged over runs, is then the formula's own (a slip's, which
is the same at every run and every ȳ) plus a mean of independent roundings, which shrinks as 1/√runs.

So where one run puts a block of such an op FLOOR units (_blocks.py) or more along itself, whatever the composite errs
there (BlockShares.to_average), the op is run again under StochasticRounding, at the same ȳ: AVERAGED_FIRST times,
and up to AVERAGED_RUNS where a block is not settled by then (within or past rounding by SETTLED standard errors to
spare), and the block is judged by

        r̄_b = Σ ⟨x̄ₚ − x̄₆₄, x̄₆₄⟩ / Σ ⟨x̄₆₄, x̄₆₄⟩ over the block and over the runs and ȳ,   s_b its standard error

alone, in place of its one run's share and the allowances for noise (SIGMAS σ) and for the op's own roundings (OWN
times theirs): it fails where |r̄_b| > max(AVERAGED_UNITS · u, AVERAGED_SE · s_b). Each sample counts by its
⟨x̄₆₄, x̄₆₄⟩ there: at a ȳ where the block's x̄₆₄ nearly vanishes its share is rounding's alone.

What stays in r̄_b besides the formula: constants the op makes at p (a 1/√d stored at bf16, under a unit), results of
ops that cannot be recomputed in float32 (kept as they are), and at fp16 a small bias where a value within an ulp of
a power of two rounds across it. A value the op keeps at p (a running sum, a row statistic) averages out as its
rounding does: a block that fails so is not a precision defect, and one that a value kept at p alone moves passes.
"""

import math

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ._blocks import products
from ._rounding import _EXACT_OPS, _PLACES, UNIT_ROUNDOFF, Draws, _at_float32, _finer, _leaves, _Run

AVERAGED_RUNS = 16   # runs of the op under StochasticRounding, each VJP'd at every ȳ drawn, at most ...
AVERAGED_FIRST = 8   # ... and after this many, none more where every block is settled (_settled)
SETTLED = 4          # standard errors a settled block's share has to spare
AVERAGED_UNITS = 2   # a block's averaged share past this many units of p's roundoff (2% at bf16 is 5.1) ...
AVERAGED_SE = 5      # ... and past this many standard errors of its mean is the formula's, not rounding's


def stochastically_rounded(wide, dtype, draws):
    """wide's values rounded to dtype stochastically: to the neighbour above with probability (x − below)/(above −
    below), so that the mean is x. bf16 is float32's upper half: add a uniform 16-bit integer to float32's bits and
    cut the lower half off. fp16: x + (U − ½)·ulp rounded to nearest, the ulp of x's binade (a value within an ulp
    above a power of two may round into the binade below, a bias of a fraction of an ulp there). draws: a Draws (its
    pools' windows, tapegrad/_rounding.py)."""
    w = wide.detach().to(torch.float32).contiguous()
    shape, device = tuple(w.shape), w.device
    if dtype == torch.bfloat16:
        noise = draws.window(shape, device, "16 bits", lambda n, gen: torch.randint(
            0, 1 << 16, (n,), generator=gen, dtype=torch.int32, device=device))
        return ((w.view(torch.int32) + noise) & -65536).view(torch.float32).to(dtype)
    exact = w.to(dtype)
    _, exponent = torch.frexp(w.double())
    ulp = torch.ldexp(torch.ones_like(w, dtype=torch.float64),
                      torch.clamp(exponent, min=math.frexp(torch.finfo(dtype).tiny)[1])) * UNIT_ROUNDOFF[dtype]
    unit = draws.window(shape, device, "[0, 1)", lambda n, gen: torch.rand(
        n, generator=gen, dtype=torch.float64, device=device))
    return torch.where(exact.to(torch.float64) == w.double(), exact, (w.double() + (unit - 0.5) * ulp).to(dtype))


def _stochastic(result, wide, dtype):
    """Whether a result at dtype has its float32 twin, wide, to be rounded stochastically in its place."""
    return isinstance(result, torch.Tensor) and result.dtype == dtype and isinstance(wide, torch.Tensor) and \
        wide.dtype == torch.float32 and wide.shape == result.shape


class StochasticRounding(TorchDispatchMode):
    """An op computing in torch ops at dtype, each of its roundings to dtype made stochastic: a torch op whose
    floating-point tensors are all at dtype (a product, a sum, an exp; in place too) is computed on them in float32
    instead and its result rounded to dtype stochastically (stochastically_rounded), so that dtype's own kernel, which
    on a CPU without bf16 instructions is the slower, never runs; a cast down to dtype rounds its source so. Ops that
    alias, place or select values run as they are, and so do ops with a dtype= of their own, ops of several results
    and ops with no float32 kernel."""

    def __init__(self, dtype, generator):
        super().__init__()
        self.dtype, self.draws = dtype, Draws(generator)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name, how = _kind(func)
        if how == "cast":  # the source rounded stochastically where it is finer than dtype
            source = args[0] if name == "_to_copy" else args[1]
            if kwargs.get("dtype", args[0].dtype if name == "copy_" else None) == self.dtype and \
                    _finer(source, self.dtype):
                rounded = stochastically_rounded(source, self.dtype, self.draws)
                args = (rounded,) + tuple(args[1:]) if name == "_to_copy" else (args[0], rounded) + tuple(args[2:])
            return func(*args, **kwargs)
        if how == "as is" or "dtype" in kwargs:
            return func(*args, **kwargs)
        floats = [t for t in _leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if not floats or any(t.dtype != self.dtype for t in floats):
            return func(*args, **kwargs)
        try:
            wide = func(*_at_float32(args, self.dtype), **_at_float32(kwargs, self.dtype))  # in place: on a copy
        except (RuntimeError, TypeError, NotImplementedError):
            return func(*args, **kwargs)
        if not isinstance(wide, torch.Tensor):  # several results (a fused norm's): those of dtype rounded so
            out = func(*args, **kwargs)
            if how == "in place" or type(out) not in (tuple, list) or type(wide) not in (tuple, list) or \
                    len(out) != len(wide):
                return out
            return type(out)(
                stochastically_rounded(w, self.dtype, self.draws) if _stochastic(o, w, self.dtype)
                else w.to(o.dtype) if isinstance(o, torch.Tensor) and isinstance(w, torch.Tensor) else o
                for o, w in zip(out, wide))
        if wide.dtype != torch.float32:  # a comparison's booleans, an index
            return wide
        rounded = stochastically_rounded(wide, self.dtype, self.draws)
        if how == "in place":
            with torch.no_grad():
                args[0].copy_(rounded)
            return args[0]
        return rounded


_KINDS = {}


def _kind(func):
    """(name, how StochasticRounding takes the aten op func): "cast" (_to_copy, copy_), "as is" (it places, selects
    or aliases values without writing them), "in place" (it writes its first argument) or "computed"; kept per op."""
    found = _KINDS.get(func)
    if found is None:
        name = func.overloadpacket.__name__
        returns = func._schema.returns
        writes = any(r.alias_info is not None and r.alias_info.is_write for r in returns)
        if name in ("_to_copy", "copy_"):
            how = "cast"
        elif name in _PLACES or name in _EXACT_OPS or \
                any(r.alias_info is not None and not r.alias_info.is_write for r in returns):
            how = "as is"
        else:
            how = "in place" if writes else "computed"
        found = _KINDS[func] = (name, how)
    return found


def weighted_mean(products, weights):
    """Per block, the share pooled over samples, r̄ = Σ ⟨d, e⟩ / Σ ⟨e, e⟩ (each sample weighed by its ⟨e, e⟩: a ȳ at
    which the block's x̄₆₄ nearly vanishes has a share of rounding alone, and counts as little), and its standard
    error, √(Σ w²·(r − r̄)² · S/(S − 1)) / Σ w over the S samples' shares r = ⟨d, e⟩/⟨e, e⟩. 0 where Σ w is 0."""
    p, w = np.array(products, dtype=np.float64), np.array(weights, dtype=np.float64)
    total = w.sum(axis=0)
    safe = np.where(total > 0, total, 1.0)
    mean = np.where(total > 0, p.sum(axis=0) / safe, 0.0)
    r = np.where(w > 0, p / np.where(w > 0, w, 1.0), mean)
    count = len(p)
    spread = (w * w * (r - mean) ** 2).sum(axis=0) * count / max(1, count - 1)
    return mean, np.where(total > 0, np.sqrt(spread) / safe, 0.0)


def judge_averaged(comparison, dtype, seed):
    """Where one run put a block of an op in torch ops at dtype FLOOR units or more along itself
    (BlockShares.to_average), the op's share along that block with its roundings averaged out judges it (the module's
    text); the comparison's blocks closed again. Returns the number of runs made (0 where no block needed them, or
    where the op could not run so: its blocks are then judged by their one run)."""
    blocks = comparison.blocks
    comparison.averaged_runs = 0
    wanted = [i for i, b in enumerate(blocks) if b is not None and b.to_average]
    if not wanted:
        return 0
    kernel, u = comparison.kernel, UNIT_ROUNDOFF[dtype]
    generator = torch.Generator().manual_seed(int(seed) * 7919 + 17)
    mode = StochasticRounding(dtype, generator)
    parts = {i: sorted({k for k, _ in blocks[i].to_average}) for i in wanted}
    # each block's ⟨x̄₆₄, x̄₆₄⟩ at each ȳ (the same at every run), and per sample (a run at a ȳ) its ⟨x̄ₚ − x̄₆₄, x̄₆₄⟩
    weights = {(i, k): [products(exact[i], exact[i], blocks[i].parts[k]) for exact in comparison.exact]
               for i in wanted for k in parts[i]}
    samples = {key: [] for key in weights}
    runs, readings = 0, None
    try:
        while runs < AVERAGED_RUNS:
            if runs == AVERAGED_FIRST:
                readings = _readings(samples, weights)
                if _settled(blocks, readings, u):
                    break
                readings = None
            run = _Run(kernel.fn, kernel.args, kernel.slots, kernel.kwargs, kernel.who, lambda: mode)
            for g, exact in zip(comparison.cotangents, comparison.exact):
                got = run.vjp(g)
                for i, k in samples:
                    samples[i, k].append(products(got[i] - exact[i], exact[i], blocks[i].parts[k]))
            runs += 1
    except (RuntimeError, TypeError):  # an op that cannot run so: its blocks judged by their one run
        comparison.one_run_verdicts()
        return 0
    for (i, k), (mean, error) in (readings or _readings(samples, weights)).items():
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(error))):  # a run overflowed: one run's verdicts
            blocks[i].undefer(k)
            continue
        # a block whose share did not move from run to run was not rounded otherwise (its op ran as it is, a kernel
        # with no float32 twin): the runs say nothing of it, and its one run's verdict holds
        still = error == 0
        blocks[i].undefer(k, still)
        blocks[i].judge_averaged(k, mean, np.maximum(AVERAGED_UNITS * u, AVERAGED_SE * error), runs, ~still)
    comparison.averaged_runs = runs
    comparison.close_blocks()
    return runs


def _readings(samples, weights):
    """Per (input, partition), each block's (r̄, s) over the samples so far (weighted_mean): the runs VJP at each ȳ in
    turn, so sample n is at ȳ number n mod DRAWS, whose ⟨x̄₆₄, x̄₆₄⟩ weighs it."""
    return {key: weighted_mean(found, [weights[key][n % len(weights[key])] for n in range(len(found))])
            for key, found in samples.items()}


def _settled(blocks, readings, u):
    """Whether, after the runs so far, every block to average is settled: within rounding by SETTLED standard
    errors to spare (|r̄| + SETTLED·s ≤ AVERAGED_UNITS·u), or past it so (|r̄| − SETTLED·s > AVERAGED_UNITS·u and
    |r̄| > 2·AVERAGED_SE·s); the verdict more runs would give is then the same."""
    limit = AVERAGED_UNITS * u
    for (i, k), (mean, error) in readings.items():
        at = [j for kk, j in blocks[i].to_average if kk == k]
        r, s = np.abs(mean[at]), error[at]
        if not np.all((r + SETTLED * s <= limit) | ((r - SETTLED * s > limit) & (r > 2 * AVERAGED_SE * s))):
            return False
    return True
