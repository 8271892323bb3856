"""A slip in one block of x̄ at a low precision: one row, one column, one batch element or one head a few percent off.

At bf16 such a slip can hide under the bound of tapegrad/_rounding.py at every element: the bound follows x̄'s
largest elements, and a row of smaller ones errs by a few of their own ulps only (a layer norm's row 2% off at bf16:
9 times the composite's error in that row, within the bound set by other rows). Its share of x̄ over the whole
tensor, the `along` test there, is diluted by the rows that are right.

So the same share is read block by block. A block is the slice of x̄ at one index along one axis (for a matrix: a
row, a column; for (B, h, T, d): a batch element, a head, a position, a feature), and, with three axes or more, one
row along the last axis. In block b, with d = x̄ₚ − x̄₆₄ and e = x̄₆₄ there,

        r_b = ⟨d, e⟩/⟨e, e⟩,   σ_b = √(Σ d²e²)/⟨e, e⟩

r_b is the block's error along its own x̄ (x̄ₚ ≈ (1 + r_b)·x̄₆₄ + the rest), σ_b what r_b is when d's elements are
independent. A block slipped by a factor 1 + c has r_b = c. A right kernel's r_b is rounding's: a few σ_b of
independent errors, or what a rounded row statistic (a row's sum, its mean) adds along the row, which the composite
at the precision has too, in the same block. For each ȳ drawn, a block fails when

        |r_b| > max(MARGIN · the composite's and the fused model's |r_b| there, SIGMAS · σ_b)

σ_b the largest of the composite's, the fused model's, the result's own rounding's (u/√3 relative, per element) and
that of the kernel's own error once its share is taken out, d − r_b·e (so that a slipped block's own error does not
widen its bound). Each ȳ is judged on its own: a block whose x̄ nearly cancels at one ȳ has a large share of rounding
there, and a slip's share is the same at every ȳ. An op that rounds in no torch op at p (a fused kernel) has the
composite's figures held to HELD times the tight ones (the fused model's, the result's rounding, the kernel's own
rest); an op in torch ops at p rounds as its own formula does, not as the composite, and one run of it cannot tell
a block's rounding from a slip of the same size: a block of it FLOOR units or more along itself is judged by its
share with the op's roundings averaged out over many runs (tapegrad/_averaged.py), whatever the composite errs there.
Only where the op cannot be run so is such a block allowed OWN times the share its own roundings, falling otherwise,
give it (tapegrad/_rounding.py's OwnRounding), up to OWN_MOST times POOLED times the composite's largest share over
all the blocks (POOLED times that where they were not sampled).
"""

from typing import NamedTuple

import numpy as np

# An op computing in torch ops at p rounds as its own formula does, not as the composite's: the right backward of
# softmax(x) ⊙ w in bf16 ops, y ⊙ (p − ⟨p, y⟩) with p = ȳ ⊙ w, errs 13% along a row whose p − ⟨p, y⟩ cancels, where
# the composite errs 1%. Each of its blocks is allowed POOLED times the composite's largest share over the blocks.
POOLED = 5
# A row's statistic rounded once at p (a row sum, a max, a normalizer stored at p) moves that row's x̄ along itself by
# up to about a unit of p's roundoff, through a product or two: a right fused attention kernel's q̄ at fp16 had a row
# 1.5 units along itself. No block is held to less than FLOOR units (at bf16 0.78%; a slip of 2% is 5 units).
FLOOR = 2
# An op in torch ops at p, where its own roundings were sampled (tapegrad/_rounding.py's OwnRounding: OWN_RUNS runs,
# each a little wider than its own rounding): each block is allowed OWN times the largest share they give it, in
# place of the pooled allowance, and at most OWN_MOST times that. A linear + GELU kernel whose products round at bf16
# passed with a row or a column of x̄ 2% off under the pool, which the blocks where the composite rounds most set
# for every block. Over 448 right checks of kernels in torch ops at bf16, one block erred past OWN times its own
# samples (a column of an RMSNorm's x̄, 6 times).
OWN = 4
OWN_MOST = 2


class Block(NamedTuple):
    """A block past its bound: where (x̄[…]), in words ("one row"), its share r_b, the bound, and the runs its share
    was averaged over (tapegrad/_averaged.py; None: one run's)."""
    place: str
    words: str
    r: float
    bound: float
    runs: object = None


def partitions(shape):
    """The ways x̄ of this shape is cut into blocks: (axis, count) for each axis of more than one index (block j:
    index j along that axis), and ("rows", count) for the rows along the last axis where x̄ has three axes or more.
    None for fewer than two axes (a block would be one element, which the element test holds): []."""
    if len(shape) < 2:
        return []
    parts = [(a, n) for a, n in enumerate(shape) if n > 1]
    rows = int(np.prod(shape[:-1]))
    if len(shape) >= 3 and rows > 1 and shape[-1] > 1:
        parts.append(("rows", rows))
    return parts


def _blocks(a, part):
    """a as a 2-D array, one block per row, for a partition of partitions(a.shape) (a copy where the axis is not the
    first)."""
    axis, count = part
    if axis == "rows":
        return a.reshape(count, -1)
    return np.moveaxis(a, axis, 0).reshape(count, -1)


def _sums(a, part):
    """a's sum over each block of a partition, without moving its axes."""
    axis, count = part
    if axis == "rows":
        return a.reshape(count, -1).sum(axis=1)
    return a.sum(axis=tuple(i for i in range(a.ndim) if i != axis))


def products(a, b, part):
    """⟨a, b⟩ over each block of a partition."""
    return _sums(np.asarray(a, dtype=np.float64) * np.asarray(b, dtype=np.float64), part)


def norms(e, parts):
    """What shares reads of e alone: e², and per partition ⟨e, e⟩ over each block with it where positive (1 elsewhere)
    and where it is."""
    e = np.asarray(e, dtype=np.float64)
    ee = e * e
    per_part = []
    for part in parts:
        norm = _sums(ee, part)
        per_part.append((norm, np.where(norm > 0, norm, 1.0), norm > 0))
    return ee, per_part


def shares(d, e, parts, rest=False, of_e=None):
    """(r, σ) per block of each partition: r_b = ⟨d, e⟩/⟨e, e⟩ and σ_b = √(Σ d²e²)/⟨e, e⟩, 0 where e is 0; with
    rest, σ_b of d − r_b·e instead, Σ (d − r_b·e)²e² = Σ d²e² − 2·r_b·Σ d·e³ + r_b²·Σ e⁴. of_e: norms(e, parts),
    where made already (e is the same for several d)."""
    d, e = np.asarray(d, dtype=np.float64), np.asarray(e, dtype=np.float64)
    ee, per_part = of_e if of_e is not None else norms(e, parts)
    de = d * e
    squares, cubes, fourths = de * de, (de * ee if rest else None), (ee * ee if rest else None)
    out = []
    for part, (norm, safe, positive) in zip(parts, per_part):
        r = np.where(positive, _sums(de, part) / safe, 0.0)
        square = _sums(squares, part)
        if rest:
            square = np.maximum(square - 2 * r * _sums(cubes, part) + r * r * _sums(fourths, part), 0.0)
        out.append((r, np.where(positive, np.sqrt(square) / safe, 0.0)))
    return out


def describe(part, index, shape):
    """The block in index notation: x̄[1, :] for a row, x̄[..., 3] for a column, x̄[2, 0, 5, :] for one row of four
    axes."""
    axis, _ = part
    if axis == "rows":
        at = np.unravel_index(index, shape[:-1])
        return "[" + ", ".join(str(int(i)) for i in at) + ", :]", "one row"
    if axis == 0:
        words = "one row" if len(shape) == 2 else "one index along axis 0 (a batch element)"
        return f"[{index}" + ", :" * (len(shape) - 1) + "]", words
    if axis == len(shape) - 1:
        return f"[..., {index}]", "one column" if len(shape) == 2 else f"one index along the last axis ({axis})"
    return "[" + ":, " * axis + f"{index}, ...]", f"one index along axis {axis}"


class BlockShares:
    """One input's x̄ block by block, ȳ by ȳ: for the ȳ at hand the kernel's r_b, the composite's and the fused
    model's largest |r_b| and the largest σ_b (add_kernel, add_rounding, add_storage); draw() closes a ȳ and keeps the
    block most past its bound over the ȳ drawn. Each ȳ is judged on its own: a block whose x̄ nearly cancels at one ȳ
    has a large share of rounding there, and a slip's share is the same at every ȳ."""

    def __init__(self, shape, u, held=None):
        self.shape = tuple(shape)
        self.parts = partitions(self.shape)
        self.floor = FLOOR * u  # u: p's unit roundoff
        self.held = held  # an op rounding in no torch op at p: the composite's figures held to this × the tight ones
        self.worst = None  # (|r_b| / bound, x̄[…], in words, r_b, bound)
        self.alone = [None] * len(self.parts)  # per partition, the one block ever past its bound (False: several)
        # (partition, block) of the blocks of an op in torch ops at p FLOOR units or more along themselves at some ȳ:
        # read again with its roundings averaged out (tapegrad/_averaged.py); their one run's verdicts, deferred
        self.to_average, self.deferred = set(), []
        self.averaged_past = 0  # how many of them are past their bound with the op's roundings averaged out
        self._start()

    def _start(self):
        zeros = [np.zeros(n) for _, n in self.parts]
        # per partition: the kernel's r_b; |r_b| and σ_b of the composite, and of the fused model, the storage and
        # the kernel's own rest (the tight figures)
        self.kernel, self.composite, self.tight = list(zeros), list(zeros), list(zeros)
        self.composite_sigma, self.tight_sigma = list(zeros), list(zeros)
        self.own = None  # |r_b| of the kernel's own roundings falling otherwise, where it computes in torch ops at p
        self._norms = []  # (e, norms(e)) of the x̄₆₄ this ȳ's shares are of: the kernel's, the storage's and the
        #                   models' at x are of one e, the models' at the moved point of another

    def _shares(self, d, e, rest=False):
        """shares(d, e) over this input's partitions, e's own sums made once per ȳ."""
        of_e = next((n for seen, n in self._norms if seen is e), None)
        if of_e is None:
            of_e = norms(e, self.parts)
            self._norms.append((e, of_e))
        return shares(d, e, self.parts, rest, of_e)

    def add_kernel(self, d, e):
        """The kernel's error d where x̄₆₄ is e: its r_b, and the σ_b of what is left of it, d − r_b·e (its own
        independent errors, a slip's share taken out: a block scaled by 1 + c has σ_b of d near c/√(its size))."""
        for k, (r, sigma) in enumerate(self._shares(d, e, rest=True)):
            self.kernel[k] = r
            self.tight_sigma[k] = np.maximum(self.tight_sigma[k], sigma)

    def add_rounding(self, d, e, composite):
        """A rounded computation's error d (the composite's at p, or the fused model's) at a point whose float64 x̄
        is e."""
        for k, (r, sigma) in enumerate(self._shares(d, e)):
            if composite:
                self.composite[k] = np.maximum(self.composite[k], np.abs(r))
                self.composite_sigma[k] = np.maximum(self.composite_sigma[k], sigma)
            else:
                self.tight[k] = np.maximum(self.tight[k], np.abs(r))
                self.tight_sigma[k] = np.maximum(self.tight_sigma[k], sigma)

    def add_own(self, d, e):
        """How far the kernel's x̄ₚ moves with its own roundings falling otherwise (d), where x̄₆₄ is e: its |r_b|."""
        found = [np.abs(r) for r, _ in self._shares(d, e)]
        self.own = found if self.own is None else [np.maximum(a, b) for a, b in zip(self.own, found)]

    def add_storage(self, e, u):
        """The result's rounding at p: independent errors u/√3 rms relative to each element of e."""
        for k, (_, sigma) in enumerate(self._shares(np.abs(e), e)):
            self.tight_sigma[k] = np.maximum(self.tight_sigma[k], u / np.sqrt(3) * sigma)

    def draw(self, margin, sigmas):
        """Closes a ȳ: its block most past max(margin · rounding's |r_b|, sigmas · σ_b), kept if the worst so far."""
        for k, part in enumerate(self.parts):
            composite, composite_sigma = self.composite[k], self.composite_sigma[k]
            pooled = 0.0
            if self.held:  # torch's ops at p excuse only an op that computes with them (tapegrad/_rounding.py)
                cap = self.held * np.maximum(self.tight[k], self.tight_sigma[k])
                composite, composite_sigma = np.minimum(composite, cap), np.minimum(composite_sigma, cap)
            elif composite.size:  # an op in torch ops at p: its own formula's rounding, not the composite's
                pooled = POOLED * float(np.max(composite))
                if self.own is not None:  # block by block, as far as its own roundings falling otherwise move it
                    pooled = np.minimum(OWN * self.own[k], OWN_MOST * pooled)
            bound = np.maximum(np.maximum(margin * np.maximum(composite, self.tight[k]),
                                          sigmas * np.maximum(composite_sigma, self.tight_sigma[k])),
                               np.maximum(pooled, self.floor))
            ratio = np.abs(self.kernel[k]) / np.maximum(bound, 1e-300)
            if np.any(pooled > 0):  # an op in torch ops at p: a block past FLOOR units in one run is judged by its
                # share with the op's roundings averaged out (tapegrad/_averaged.py), whatever the composite errs
                # there; its one run's verdict is kept only for where that reading cannot be made
                averaged = np.abs(self.kernel[k]) > self.floor
                if np.any(averaged):
                    self.to_average.update((k, int(j)) for j in np.flatnonzero(averaged))
                    self.deferred.append((k, np.where(averaged, ratio, 0.0), self.kernel[k], bound))
                    ratio = np.where(averaged, 0.0, ratio)
            self._past(k, ratio, self.kernel[k], bound)
        self._start()

    def _past(self, k, ratio, r, bound, runs=None):
        """Partition k's block most past its bound (ratio: |r_b| over it), if any, kept as the worst so far and as
        the one block past its bound along that axis, unless another is (runs: the averaged runs that judged it)."""
        j = int(np.argmax(ratio))
        if ratio[j] <= 1:
            return
        place, words = describe(self.parts[k], j, self.shape)
        found = (float(ratio[j]), place, words, float(r[j]), float(bound[j]), k, j, runs)
        if self.worst is None or found[0] > self.worst[0]:
            self.worst = found
        past = int(np.count_nonzero(ratio > 1))
        if past > 1 or (self.alone[k] and self.alone[k][1] != place):
            self.alone[k] = False  # more than one block past its bound: not a slip of one block
        elif self.alone[k] is not False and (self.alone[k] is None or found[0] > self.alone[k][0]):
            self.alone[k] = found

    def judge_averaged(self, k, mean, bound, runs, judged=True):
        """Partition k's blocks to average against their shares averaged over runs (tapegrad/_averaged.py): mean
        r̄_b and its bound per block of the partition; only the blocks to average (and judged: a mask) are judged."""
        wanted = np.zeros(len(mean), dtype=bool)
        wanted[[j for kk, j in self.to_average if kk == k]] = True
        wanted &= judged
        ratio = np.where(wanted, np.abs(mean) / np.maximum(bound, 1e-300), 0.0)
        self.averaged_past += int(np.count_nonzero(ratio > 1))
        self._past(k, ratio, mean, bound, runs)

    def undefer(self, part=None, only=True):
        """The blocks to average (of partition part, or all; those of the mask only) judged by their one run, where
        the averaged reading could not be made."""
        for k, ratio, r, bound in self.deferred:
            if part is None or k == part:
                self._past(k, np.where(only, ratio, 0.0), r, bound)
        self.deferred = [d for d in self.deferred if part is not None and d[0] != part]

    def excess(self):
        """The block most past its bound over the ȳ drawn, as a Block, or None."""
        return None if self.worst is None else Block(*self.worst[1:5], self.worst[7])

    def alone_past(self, errors, bound):
        """The block past its bound where no other block along its axis is, at any ȳ drawn, and outside which every
        error (errors: |x̄ₚ − x̄₆₄| per ȳ) is within bound: a slip of that block, not a slip of the whole that many
        blocks show. A Block, or None."""
        for found in sorted((a for a in self.alone if a), key=lambda a: a[0], reverse=True):
            k, j = found[5:7]
            if all(float(np.max(np.delete(_blocks(np.asarray(d), self.parts[k]), j, axis=0), initial=0.0)) <= bound
                   for d in errors):
                return Block(*found[1:5], found[7])
        return None
