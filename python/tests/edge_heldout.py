"""Held-out ops with a known bug at an edge of their domain, each beside its fixed version: only measured, never
tuned on (the probes were built on edge_set.py). The same fields as edge_set.EdgeCase; what is expected was written
down before the probes existed:
    buggy: at least one finding of kind "edge" whose message contains every word of `words` and a reproduction
           line containing `repro`;
    fixed: no finding of kind "edge".
EXPECTED_RATE is the share of buggy versions expected found and named so, frozen with the set.
"""

import torch

from edge_set import EdgeCase

EXPECTED_RATE = 0.75


def _randn(*shape, dtype=torch.float64, seed=100, grad=True):
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return x.requires_grad_(grad)


# 1. softplus written log(1 + exp(x)) in float32: exp(90) overflows to ∞ where the softplus is 90.
def softplus_naive(x):
    return torch.log(1 + torch.exp(x))


def softplus_safe(x):
    return torch.clamp_min(x, 0) + torch.log1p(torch.exp(-x.abs()))


# 2. tanh written (eˣ − e⁻ˣ)/(eˣ + e⁻ˣ) in float32: ∞/∞ at ±90.
def tanh_naive(x):
    a, b = torch.exp(x), torch.exp(-x)
    return (a - b) / (a + b)


def tanh_safe(x):
    return torch.tanh(x)


# 3. log-softmax written x − log Σ exp(x) in float32: overflows at 90.
def log_softmax_naive(x):
    return x - torch.log(torch.exp(x).sum(-1, keepdim=True))


def log_softmax_safe(x):
    return torch.log_softmax(x, -1)


# 4. A batch norm over the first axis without eps: a column constant over the batch has variance 0.
def batch_norm_no_eps(x):
    mu = x.mean(0, keepdim=True)
    return (x - mu) / ((x - mu) ** 2).mean(0, keepdim=True).sqrt()


def batch_norm_eps(x):
    mu = x.mean(0, keepdim=True)
    return (x - mu) / (((x - mu) ** 2).mean(0, keepdim=True) + 1e-5).sqrt()


# 5. A min along the first axis as a Function whose backward sends ȳ to every element equal to the min.
class MinTiesAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.amin(0)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g * (x == y).to(x.dtype)


class MinTiesFirst(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y, i = x.min(0)
        ctx.save_for_backward(i)
        ctx.shape = x.shape
        return y

    @staticmethod
    def backward(ctx, g):
        i, = ctx.saved_tensors
        out = torch.zeros(ctx.shape, dtype=g.dtype)
        return out.scatter(0, i.unsqueeze(0), g.unsqueeze(0))


# 6. Attention pooling over a sequence with a padding mask (True = padding): a sequence wholly padded has no position
#    to pool, and the naive version gives NaN.
def pool_naive(x, w, pad):
    s = (x @ w).masked_fill(pad, -float("inf"))
    return (torch.softmax(s, -1).unsqueeze(-1) * x).sum(-2)


def pool_safe(x, w, pad):
    s = (x @ w).masked_fill(pad, -float("inf"))
    m = s.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(s - m)
    z = e.sum(-1, keepdim=True)
    a = e / torch.where(z == 0, torch.ones_like(z), z)
    return (a.unsqueeze(-1) * x).sum(-2)


def _pool_inputs():
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[:, 3] = True
    return _randn(2, 4, 3, seed=101), _randn(3, seed=102), pad


# 7. A unit vector's angle feature: x / |x| times |x|'s log, a Function whose backward divides by |x|² (0 at a zero
#    row) — written as the Euclidean norm's gradient x / |x| computed by hand.
class NormNaive(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        n = x.norm(dim=-1)
        ctx.save_for_backward(x, n)
        return n

    @staticmethod
    def backward(ctx, g):
        x, n = ctx.saved_tensors
        return g.unsqueeze(-1) * x / n.unsqueeze(-1)


class NormSafe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        n = x.norm(dim=-1)
        ctx.save_for_backward(x, n)
        return n

    @staticmethod
    def backward(ctx, g):
        x, n = ctx.saved_tensors
        safe = torch.where(n > 0, n, torch.ones_like(n))
        return g.unsqueeze(-1) * x / safe.unsqueeze(-1)


# 8. A softmax cross-entropy against targets, written −Σ t·log(softmax(x)): a fully −∞ row of logits is NaN, even
#    where the row's target weight is 0 (the row is ignored).
def xent_naive(x, t):
    return -(t * torch.log(torch.softmax(x, -1))).sum(-1) * (t.sum(-1) > 0)


def xent_safe(x, t):
    keep = torch.isfinite(x).any(-1, keepdim=True)
    x = torch.where(keep, x, torch.zeros_like(x))
    lsm = torch.log_softmax(x, -1)
    lsm = torch.where(torch.isfinite(lsm), lsm, torch.zeros_like(lsm))
    return -(t * lsm).sum(-1) * (t.sum(-1) > 0)


def _xent_inputs():
    t = torch.softmax(_randn(3, 5, seed=103, grad=False), -1)
    return _randn(3, 5, seed=104), t


# 9. The geometric-mean-like log of a row's product, Σ log|x| written log(Π|x|): at tiny values the product
#    underflows to 0 and the log is −∞.
def log_prod_naive(x):
    return torch.log(torch.prod(x.abs(), -1))


def log_prod_safe(x):
    return torch.log(x.abs()).sum(-1)


CASES = [
    EdgeCase("softplus float32", softplus_naive, softplus_safe, lambda: (_randn(3, 5, dtype=torch.float32),),
             "large values", ("large", "∞"), "90"),
    EdgeCase("tanh float32", tanh_naive, tanh_safe, lambda: (_randn(3, 5, dtype=torch.float32, seed=105),),
             "large values", ("large", "NaN"), "90"),
    EdgeCase("log-softmax float32", log_softmax_naive, log_softmax_safe,
             lambda: (_randn(3, 5, dtype=torch.float32, seed=106),), "large values", ("large",), "90"),
    EdgeCase("batch norm", batch_norm_no_eps, batch_norm_eps, lambda: (_randn(4, 3, seed=107),),
             "a column constant over the batch", ("constant", "NaN"), "x[:, 1] ="),
    EdgeCase("min with ties", MinTiesAll.apply, MinTiesFirst.apply, lambda: (_randn(4, 3, seed=108),),
             "an exact tie", ("tie",), "x["),
    EdgeCase("padded pooling", pool_naive, pool_safe, _pool_inputs, "a wholly padded sequence", ("NaN", "pad"),
             "pad["),
    EdgeCase("norm", NormNaive.apply, NormSafe.apply, lambda: (_randn(3, 4, seed=109),), "a zero row",
             ("zero", "NaN"), "= 0"),
    EdgeCase("cross-entropy", xent_naive, xent_safe, _xent_inputs, "a fully masked row", ("masked", "NaN"),
             "= -inf"),
    EdgeCase("log of a product", log_prod_naive, log_prod_safe, lambda: (_randn(3, 5, seed=110),), "tiny values",
             ("tiny",), "1e-"),
]
