"""Ops with a known bug at an edge of their domain, each beside its fixed version: the build set of the edge probes
(tapegrad.gradcheck(..., edges=True)).

Each case is a pair of ops, `buggy` and `fixed`, on the inputs `inputs()` makes. At a random point both are right
(the ordinary check passes); at the edge named in `edge` the buggy one gives NaN, ∞ or a wrong gradient. What is
expected was written down here before the probes existed, and is not changed to fit them:
    buggy: at least one finding of kind "edge" whose message contains every word of `words` and a reproduction
           line containing `repro`;
    fixed: no finding of kind "edge".

    from edge_set import CASES
    case = CASES[0]
    report = tapegrad.gradcheck(case.buggy, case.inputs(), edges=case.edges)

The held-out set (edge_heldout.py) has other ops, written apart, and is only measured.
"""

from dataclasses import dataclass

import torch

INF = float("inf")


@dataclass
class EdgeCase:
    name: str
    buggy: callable
    fixed: callable
    inputs: callable          # () -> tuple of inputs (checked tensors require grad)
    edge: str                 # the edge where the buggy version breaks, in words
    words: tuple              # words the finding's message must contain
    repro: str                # a piece of the reproduction line the finding must hold
    edges: object = True      # the edges= option passed


def _randn(*shape, dtype=torch.float64, seed=0, grad=True):
    x = torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return x.requires_grad_(grad)


# 1. A masked softmax whose fully masked rows are defined as 0, but computed as softmax then zeroed: the softmax of
#    an all −∞ row is 0/0, and its backward sends that NaN back through the zeroed row (pytorch#41508).
def masked_softmax_naive(x):
    dead = torch.isinf(x).all(-1, keepdim=True)
    return torch.where(dead, torch.zeros_like(x), torch.softmax(x, -1))


def masked_softmax_safe(x):
    m = x.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    e = torch.exp(x - m)
    s = e.sum(-1, keepdim=True)
    return e / torch.where(s == 0, torch.ones_like(s), s)


# 2. logsumexp without its max, in float32: exp(90) overflows.
def logsumexp_naive(x):
    return torch.log(torch.exp(x).sum(-1))


def logsumexp_safe(x):
    m = x.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    return torch.log(torch.exp(x - m).sum(-1)) + m.squeeze(-1)


# 3. A layer norm without eps: a constant row has variance 0.
def layer_norm_no_eps(x):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var)


def layer_norm_eps(x):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5)


# 4. An L2 normalize at the zero vector: 0/0.
def l2_normalize_naive(x):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True))


def l2_normalize_eps(x):
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-12)


# 5. A max along the last axis whose backward sends ȳ to every element equal to the max: at a tie it routes the
#    gradient twice.
class MaxTiesTwice(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.amax(-1)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        return g.unsqueeze(-1) * (x == y.unsqueeze(-1)).to(x.dtype)


class MaxTiesSplit(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = x.amax(-1)
        ctx.save_for_backward(x, y)
        return y

    @staticmethod
    def backward(ctx, g):
        x, y = ctx.saved_tensors
        hit = (x == y.unsqueeze(-1)).to(x.dtype)
        return g.unsqueeze(-1) * hit / hit.sum(-1, keepdim=True)


# 6. Causal attention with key padding: a padded first key leaves the first query no key at all.
def _scores(q, k, pad):
    n = q.shape[-2]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    allowed = causal & ~pad.unsqueeze(-2)
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    return s.masked_fill(~allowed, -INF), allowed


def attention_naive(q, k, v, pad):
    s, _ = _scores(q, k, pad)
    return torch.softmax(s, -1) @ v


def attention_safe(q, k, v, pad):
    s, allowed = _scores(q, k, pad)
    return masked_softmax_safe(s) @ v


def _attention_inputs():
    q, k, v = (_randn(2, 4, 3, seed=s) for s in (1, 2, 3))
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[:, 3] = True      # the last key of each sequence is padding; every query keeps a key
    return q, k, v, pad


# 7. A softmax in float16 storing exp(x) at float16 without subtracting the max: exp(12) > 65504. (exp is computed
#    in float32 and stored at float16, as an fp16 kernel does; torch 1.13 has no float16 exp on the CPU.)
def softmax_fp16_naive(x):
    e = torch.exp(x.float()).half()
    return (e / e.sum(-1, keepdim=True)).half()


def softmax_fp16_safe(x):
    e = torch.exp((x - x.detach().amax(-1, keepdim=True)).float()).half()
    return (e / e.sum(-1, keepdim=True)).half()


def _softmax_fp16_reference(x):
    return torch.softmax(x, -1)


# 8. A root mean square, sqrt at zero: x̄ = x / (n·rms) = 0/0 on a zero row.
def rms_naive(x):
    return torch.sqrt((x * x).mean(-1))


def rms_eps(x):
    return torch.sqrt((x * x).mean(-1) + 1e-12)


# 9. The entropy −Σ p·log p: at p = 0, 0·log 0 = 0·(−∞) = NaN.
def entropy_naive(p):
    return -(p * torch.log(p)).sum(-1)


def entropy_safe(p):
    positive = p > 0
    safe = torch.where(positive, p, torch.ones_like(p))
    return -torch.where(positive, p * torch.log(safe), torch.zeros_like(p)).sum(-1)


def _probabilities():
    p = torch.softmax(_randn(3, 5, seed=4, grad=False), -1)
    return (p.requires_grad_(),)


# 10. A cosine similarity at the zero vector: a·b / (|a|·|b|) = 0/0.
def cosine_naive(a, b):
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def cosine_eps(a, b):
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-8)


# 11. A sigmoid written 1/(1 + exp(−x)) with a hand backward exp(−x)/(1 + exp(−x))²: at x = −90 in float32,
#     exp(90) overflows and the backward is ∞/∞.
class SigmoidNaive(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return 1 / (1 + torch.exp(-x))

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        e = torch.exp(-x)
        return g * e / (1 + e) ** 2


class SigmoidSafe(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = torch.sigmoid(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        y, = ctx.saved_tensors
        return g * y * (1 - y)


# 12. The absolute value written sqrt(x²) with its hand backward x/sqrt(x²): at tiny x, x² underflows and x̄ = x/0.
class AbsViaSquare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.sqrt(x * x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * x / torch.sqrt(x * x)


class AbsSign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.abs()

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * torch.sign(x)


# 13. A mean over a 0/1 weight mask, Σ w·x / Σ w: a row with no weight is 0/0.
def masked_mean_naive(x, w):
    return (x * w).sum(-1) / w.sum(-1)


def masked_mean_safe(x, w):
    return (x * w).sum(-1) / w.sum(-1).clamp_min(1)


def _masked_mean_inputs():
    w = torch.ones(3, 5, dtype=torch.float64)
    w[:, 0] = 0
    return _randn(3, 5, seed=5), w


CASES = [
    EdgeCase("masked softmax", masked_softmax_naive, masked_softmax_safe, lambda: (_randn(3, 5),),
             "a fully masked row", ("masked", "NaN"), "= -inf"),
    EdgeCase("logsumexp float32", logsumexp_naive, logsumexp_safe,
             lambda: (_randn(3, 5, dtype=torch.float32, seed=6),), "large values", ("large", "∞"), "90"),
    EdgeCase("layer norm", layer_norm_no_eps, layer_norm_eps, lambda: (_randn(3, 5, seed=7),),
             "a constant row", ("constant", "NaN"), "x[1, :] ="),
    EdgeCase("l2 normalize", l2_normalize_naive, l2_normalize_eps, lambda: (_randn(3, 5, seed=8),),
             "a zero row", ("zero", "NaN"), "= 0"),
    EdgeCase("max with ties", MaxTiesTwice.apply, MaxTiesSplit.apply, lambda: (_randn(3, 5, seed=9),),
             "an exact tie", ("tie",), "x[1, "),
    EdgeCase("causal padded attention", attention_naive, attention_safe, _attention_inputs,
             "a padded first key under a causal mask", ("NaN", "pad"), "pad[0, 0] = True"),
    EdgeCase("softmax float16", softmax_fp16_naive, softmax_fp16_safe,
             lambda: (_randn(3, 5, dtype=torch.float16, seed=10),), "large values at float16", ("large", "NaN"),
             "12"),
    EdgeCase("rms", rms_naive, rms_eps, lambda: (_randn(3, 5, seed=11),), "a zero row", ("zero", "NaN"), "= 0"),
    EdgeCase("entropy", entropy_naive, entropy_safe, _probabilities, "p = 0", ("zero", "NaN"), "= 0"),
    EdgeCase("cosine similarity", cosine_naive, cosine_eps, lambda: (_randn(3, 4, seed=12), _randn(3, 4, seed=13)),
             "a zero row", ("zero", "NaN"), "= 0"),
    EdgeCase("sigmoid float32", SigmoidNaive.apply, SigmoidSafe.apply,
             lambda: (_randn(3, 5, dtype=torch.float32, seed=14),), "large values", ("large", "NaN"), "90"),
    EdgeCase("abs via sqrt(x²)", AbsViaSquare.apply, AbsSign.apply, lambda: (_randn(3, 5, seed=15),),
             "tiny values", ("tiny",), "1e-"),
    EdgeCase("masked mean", masked_mean_naive, masked_mean_safe, _masked_mean_inputs,
             "a row with no weight", ("NaN", "w"), "w["),
]

# The reference= a low-precision case passes (its ops in float64 with torch's derivatives); None: fn itself.
REFERENCES = {"softmax float16": _softmax_fp16_reference}
