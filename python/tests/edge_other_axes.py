"""Ops that reduce over an axis other than the last and break at an edge there, each beside its fixed version: a set
apart from edge_set.py and edge_heldout.py, written to measure where the probes find the axis an op reduces over (a
max or a min moves with one element only when that element becomes the extreme). What is expected was written down
here before it was run (edge_set.EdgeCase's fields); EXPECTED_RATE is the share of buggy versions expected found and
named so.
"""

import torch

from edge_set import EdgeCase

EXPECTED_RATE = 0.75


def _randn(*shape, seed=400):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).requires_grad_()


class _MaxAllTies(torch.autograd.Function):
    """A max along `dim` whose backward sends ȳ to every position equal to the max, not to one of them."""

    @staticmethod
    def forward(ctx, x, dim):
        y = x.amax(dim)
        ctx.save_for_backward(x, y)
        ctx.dim = dim
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g.unsqueeze(ctx.dim) * (x == y.unsqueeze(ctx.dim)).to(x.dtype), None


class _MaxTimeFirst(torch.autograd.Function):
    """The same max-pool, its backward to the first position that holds the max."""

    @staticmethod
    def forward(ctx, x):
        y, i = x.max(1)
        ctx.save_for_backward(i)
        ctx.shape = x.shape
        return y

    @staticmethod
    def backward(ctx, g):
        i, = ctx.saved_tensors
        return torch.zeros(ctx.shape, dtype=g.dtype).scatter(1, i.unsqueeze(1), g.unsqueeze(1))


def max_batch_split(x):
    return x.amax(0)  # torch splits ȳ evenly between tied rows: a subgradient


def normalize_columns_naive(x):  # each column to unit norm, no eps: a zero column is 0/0
    return x / (x * x).sum(0, keepdim=True).sqrt()


def normalize_columns_safe(x):
    return x / ((x * x).sum(0, keepdim=True) + 1e-12).sqrt()


def softmax_over_time_naive(x):  # (B, T, C), a softmax over T without its max: exp(710) overflows
    e = torch.exp(x)
    return e / e.sum(1, keepdim=True)


def softmax_over_time(x):
    return torch.softmax(x, 1)


CASES = [
    EdgeCase("max-pool over time, ties all", lambda x: _MaxAllTies.apply(x, 1), _MaxTimeFirst.apply,
             lambda: (_randn(2, 5, 3, seed=401),), "an exact tie", ("tie",), "x["),
    EdgeCase("max over the batch, ties all", lambda x: _MaxAllTies.apply(x, 0), max_batch_split,
             lambda: (_randn(6, 4, seed=402),), "an exact tie", ("tie",), "x["),
    EdgeCase("columns to unit norm", normalize_columns_naive, normalize_columns_safe,
             lambda: (_randn(5, 3, seed=403),), "a zero row", ("zero",), "x["),
    EdgeCase("softmax over time", softmax_over_time_naive, softmax_over_time,
             lambda: (_randn(2, 4, 3, seed=404),), "large values", ("large",), "x[", {"masked_rows": "nan"}),
]
