"""Ops written the way a researcher writes a new op: a torch.autograd.Function with a hand-written backward
(save_for_backward, values kept on ctx, grad_output), each with its right backward and a few slips of the kinds that
are made when such a backward is derived by hand.

    make(op, slip="right")   the Function class (its .apply is the op)
    inputs(op, size)         the inputs one would pass to a check: float64 tensors that require grad (integer targets
                             and constant tables as they are), "small" for full Jacobians or "large", where the output
                             size times an input's size passes 40,000 so that a checker switches to random projections
    OPS[op].slips            slip → Slip(kind, description): the kind of slip it is, from KINDS

This is the set that python/tools/slip_table.py measures both checkers on and python/tests/test_researcher_ops.py
holds to; its ops are not the suite's own cases, so it measures what a user of the checker meets.
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# The kinds of slip, as a person who made one would describe it.
KINDS = {
    "term_dropped": "a term of the chain or product rule left out (a whole branch included)",
    "term_factor": "one term with a wrong factor: a chain rule's inner factor, a power rule's exponent",
    "scale": "the whole gradient of an input off by one constant (1/N, 1/√d, 1/τ)",
    "sign": "a sign, of the whole gradient or of one term",
    "transposed": "a value (or the adjoint) used where its transpose belongs",
    "per_row": "a per-row term or factor (a row's normalizer, mean or projection) wrong or forgotten",
    "wrong_value": "a term built from the wrong intermediate (dP where dS belongs, x where x̂ belongs)",
    "wrong_axis": "a reduction or broadcast along the wrong axis",
    "ignores_grad_output": "the backward does not multiply by grad_output",
    "second_order_only": "a value computed in forward kept on ctx: right at first order, a constant to double backward",
    "masked": "wrong only at masked or clipped positions",
    "other": "none of the above",
}


@dataclass
class Slip:
    kind: str
    description: str


@dataclass
class Op:
    name: str
    build: callable                 # slip → Function class
    slips: dict                     # slip → Slip
    small: callable                 # torch.Generator → inputs
    large: callable
    outputs: int = 1
    notes: str = ""
    versions: list = field(default_factory=list)


OPS = {}
DTYPE = torch.float64


def _op(name, slips, small, large, outputs=1, notes=""):
    def register(build):
        table = {key: Slip(*value) for key, value in slips.items()}
        for key, slip in table.items():
            assert slip.kind in KINDS, (name, key, slip.kind)
        OPS[name] = Op(name, build, table, small, large, outputs, notes, ["right", *table])
        return build
    return register


def make(op, slip="right"):
    """The Function class of `op` with its right backward, or with `slip`."""
    spec = OPS[op]
    if slip != "right" and slip not in spec.slips:
        raise KeyError(f"{op} has no slip {slip!r}; it has {', '.join(spec.slips)}")
    cls = spec.build(slip)
    cls.__name__ = cls.__qualname__ = f"{cls.__name__}[{slip}]" if slip != "right" else cls.__name__
    return cls


def inputs(op, size="small", seed=0):
    gen = torch.Generator().manual_seed(seed)
    spec = OPS[op]
    return (spec.small if size == "small" else spec.large)(gen)


def slip_count():
    return sum(len(spec.slips) for spec in OPS.values())


def _randn(gen, *shape, scale=1.0, grad=True):
    return (torch.randn(*shape, generator=gen, dtype=DTYPE) * scale).requires_grad_(grad)


def _uniform(gen, lo, hi, *shape, grad=True):
    return (lo + (hi - lo) * torch.rand(*shape, generator=gen, dtype=DTYPE)).requires_grad_(grad)


# ---------------------------------------------------------------------------------------------------------------
# Activations

@_op("gelu_tanh", {
    "product_second": ("term_dropped", "dy/dx = ½(1 + tanh u): the product rule's second term ½x·sech²u·u' dropped"),
    "power_rule": ("term_factor", "u' = c(1 + k·x²): the 3 of d(x³)/dx left out"),
    "inner_sqrt": ("term_factor", "u' = 1 + 3k·x²: the chain rule's factor √(2/π) left out"),
    "saved_tanh": ("second_order_only", "tanh(u) kept on ctx by forward: right gradient, constant to double backward"),
}, small=lambda g: (_randn(g, 4, 5),), large=lambda g: (_randn(g, 16, 16),))
def _gelu_tanh(slip):
    c, k = math.sqrt(2.0 / math.pi), 0.044715

    class GeluTanh(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            u = c * (x + k * x ** 3)
            t = torch.tanh(u)
            ctx.save_for_backward(x)
            if slip == "saved_tanh":
                ctx.t = t
            return 0.5 * x * (1.0 + t)

        @staticmethod
        def backward(ctx, grad_output):
            x, = ctx.saved_tensors
            if slip == "saved_tanh":
                t = ctx.t
            else:
                t = torch.tanh(c * (x + k * x ** 3))
            if slip == "power_rule":
                du = c * (1.0 + k * x ** 2)
            elif slip == "inner_sqrt":
                du = 1.0 + 3.0 * k * x ** 2
            else:
                du = c * (1.0 + 3.0 * k * x ** 2)
            if slip == "product_second":
                dy = 0.5 * (1.0 + t)
            else:
                dy = 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * du
            return grad_output * dy

    return GeluTanh


@_op("silu_beta", {
    "inner_beta": ("term_factor", "dx = σ + x·σ(1−σ): the chain rule's β of σ(βx) left out"),
    "product_second": ("term_dropped", "dx = σ(βx): the product rule's second term x·β·σ' dropped"),
    "dbeta_axis": ("wrong_axis", "dβ summed over the channels (dim 1) instead of the batch (dim 0)"),
}, small=lambda g: (_randn(g, 5, 5), (1.0 + 0.3 * torch.randn(5, generator=g, dtype=DTYPE)).requires_grad_()),
   large=lambda g: (_randn(g, 24, 24), (1.0 + 0.3 * torch.randn(24, generator=g, dtype=DTYPE)).requires_grad_()))
def _silu_beta(slip):
    class SwishBeta(torch.autograd.Function):
        """y = x·σ(βx) with a learnable β per channel (the last axis)."""

        @staticmethod
        def forward(ctx, x, beta):
            ctx.save_for_backward(x, beta)
            return x * torch.sigmoid(beta * x)

        @staticmethod
        def backward(ctx, grad_output):
            x, beta = ctx.saved_tensors
            s = torch.sigmoid(beta * x)
            ds = s * (1 - s)
            if slip == "inner_beta":
                dx = s + x * ds
            elif slip == "product_second":
                dx = s
            else:
                dx = s + x * beta * ds
            dbeta_all = grad_output * x * x * ds
            if slip == "dbeta_axis":
                dbeta = dbeta_all.sum(1)
            else:
                dbeta = dbeta_all.sum(0)
            return grad_output * dx, dbeta

    return SwishBeta


@_op("softplus_beta", {
    "extra_beta": ("scale", "dx = β·σ(βx): the chain rule's β kept though the forward divides by β"),
    "inner_beta": ("wrong_value", "dx = σ(x): β left out inside the sigmoid"),
    "saved_sigmoid": ("second_order_only", "σ(βx) kept on ctx in forward: a constant to double backward"),
}, small=lambda g: (_randn(g, 4, 5),), large=lambda g: (_randn(g, 16, 16),))
def _softplus_beta(slip):
    beta = 2.0

    class SoftplusBeta(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            if slip == "saved_sigmoid":
                ctx.s = torch.sigmoid(beta * x)
            return torch.log1p(torch.exp(beta * x)) / beta

        @staticmethod
        def backward(ctx, grad_output):
            x, = ctx.saved_tensors
            if slip == "saved_sigmoid":
                s = ctx.s
            elif slip == "inner_beta":
                s = torch.sigmoid(x)
            else:
                s = torch.sigmoid(beta * x)
            if slip == "extra_beta":
                return grad_output * beta * s
            return grad_output * s

    return SoftplusBeta


@_op("mish", {
    "product_second": ("term_dropped", "dx = tanh(sp): the product rule's second term x·sech²(sp)·σ(x) dropped"),
    "tanh_prime": ("term_factor", "sech² written 1 − tanh instead of 1 − tanh²"),
    "no_sigmoid": ("term_factor", "softplus' = σ(x) left out of the chain rule"),
}, small=lambda g: (_randn(g, 4, 5),), large=lambda g: (_randn(g, 16, 16),))
def _mish(slip):
    class Mish(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * torch.tanh(F.softplus(x))

        @staticmethod
        def backward(ctx, grad_output):
            x, = ctx.saved_tensors
            t = torch.tanh(F.softplus(x))
            sech2 = 1 - t if slip == "tanh_prime" else 1 - t * t
            inner = 1.0 if slip == "no_sigmoid" else torch.sigmoid(x)
            if slip == "product_second":
                d = t
            else:
                d = t + x * sech2 * inner
            return grad_output * d

    return Mish


# ---------------------------------------------------------------------------------------------------------------
# Normalizations with affine weights

def _affine_inputs(n, d, bias=True):
    def build(gen):
        x = _randn(gen, n, d)
        w = (1.0 + 0.2 * torch.randn(d, generator=gen, dtype=DTYPE)).requires_grad_()
        if not bias:
            return x, w
        return x, w, _randn(gen, d, scale=0.1)
    return build


@_op("layernorm", {
    "no_projection": ("per_row", "dx̂'s projection −x̂·mean(dx̂·x̂) left out: each row misses a rank-one term"),
    "no_rstd": ("per_row", "dx not multiplied by the row's 1/σ: each row off by its own scale"),
    "dw_from_x": ("wrong_value", "dw = Σ g·x where x̂ belongs"),
    "db_axis": ("wrong_axis", "db = g.sum(1) (over features) instead of g.sum(0)"),
    "saved_rstd": ("second_order_only", "1/σ kept on ctx in forward: a constant to double backward"),
}, small=_affine_inputs(6, 6), large=_affine_inputs(32, 32))
def _layernorm(slip):
    eps = 1e-5

    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight, bias):
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            rstd = 1.0 / torch.sqrt(var + eps)
            xhat = (x - mu) * rstd
            ctx.save_for_backward(x, weight)
            if slip == "saved_rstd":
                ctx.rstd = rstd
            return xhat * weight + bias

        @staticmethod
        def backward(ctx, grad_out):
            x, weight = ctx.saved_tensors
            mu = x.mean(-1, keepdim=True)
            if slip == "saved_rstd":
                rstd = ctx.rstd
            else:
                var = ((x - mu) ** 2).mean(-1, keepdim=True)
                rstd = 1.0 / torch.sqrt(var + eps)
            xhat = (x - mu) * rstd
            dxhat = grad_out * weight
            if slip == "no_projection":
                dx = rstd * (dxhat - dxhat.mean(-1, keepdim=True))
            elif slip == "no_rstd":
                dx = dxhat - dxhat.mean(-1, keepdim=True) - xhat * (dxhat * xhat).mean(-1, keepdim=True)
            else:
                dx = rstd * (dxhat - dxhat.mean(-1, keepdim=True) - xhat * (dxhat * xhat).mean(-1, keepdim=True))
            dw = (grad_out * x).sum(0) if slip == "dw_from_x" else (grad_out * xhat).sum(0)
            db = grad_out.sum(1) if slip == "db_axis" else grad_out.sum(0)
            return dx, dw, db

    return LayerNorm


@_op("rmsnorm", {
    "no_mean_term": ("per_row", "dx = r·(g·w): the −x·r³·mean(g·w·x) term of each row left out"),
    "r_squared": ("term_factor", "d(ms^−½) written with r² where r³ belongs (the power rule's exponent)"),
    "dw_no_r": ("per_row", "dw = Σ g·x without each row's 1/rms"),
}, small=_affine_inputs(6, 6, bias=False), large=_affine_inputs(32, 32, bias=False))
def _rmsnorm(slip):
    eps = 1e-6

    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, weight):
            r = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
            ctx.save_for_backward(x, weight)
            return x * r * weight

        @staticmethod
        def backward(ctx, grad_out):
            x, weight = ctx.saved_tensors
            r = torch.rsqrt((x * x).mean(-1, keepdim=True) + eps)
            gw = grad_out * weight
            if slip == "no_mean_term":
                dx = r * gw
            elif slip == "r_squared":
                dx = r * gw - x * r ** 2 * (gw * x).mean(-1, keepdim=True)
            else:
                dx = r * gw - x * r ** 3 * (gw * x).mean(-1, keepdim=True)
            if slip == "dw_no_r":
                dw = (grad_out * x).sum(0)
            else:
                dw = (grad_out * x * r).sum(0)
            return dx, dw

    return RMSNorm


# ---------------------------------------------------------------------------------------------------------------
# Losses (scalar outputs)

def _classification_inputs(n, c):
    def build(gen):
        logits = _randn(gen, n, c)
        target = torch.randint(0, c, (n,), generator=gen)
        return logits, target
    return build


@_op("softmax_xent", {
    "no_mean": ("scale", "(p − onehot) without the 1/N of the mean"),
    "onehot_sign": ("sign", "p + onehot: the one-hot term's sign"),
    "ignores_grad_output": ("ignores_grad_output", "returns (p − onehot)/N, not multiplied by grad_output"),
    "log_probs": ("wrong_value", "log p − onehot: the log-probabilities where the probabilities belong"),
}, small=_classification_inputs(5, 4), large=_classification_inputs(256, 160))
def _softmax_xent(slip):
    class SoftmaxCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target):
            logp = torch.log_softmax(logits, dim=-1)
            ctx.save_for_backward(logits, target)
            return -logp.gather(1, target[:, None]).mean()

        @staticmethod
        def backward(ctx, grad_output):
            logits, target = ctx.saved_tensors
            n = logits.shape[0]
            onehot = F.one_hot(target, logits.shape[-1]).to(logits.dtype)
            if slip == "log_probs":
                p = torch.log_softmax(logits, dim=-1)
            else:
                p = torch.softmax(logits, dim=-1)
            d = p + onehot if slip == "onehot_sign" else p - onehot
            if slip != "no_mean":
                d = d / n
            if slip == "ignores_grad_output":
                return d, None
            return grad_output * d, None

    return SoftmaxCrossEntropy


@_op("huber", {
    "ignores_grad_output": ("ignores_grad_output", "returns dℓ/dpred, not multiplied by grad_output"),
    "linear_region": ("wrong_value", "r where δ·sign(r) belongs, in the linear region |r| > δ"),
    "no_mean": ("scale", "the mean's 1/numel left out"),
}, small=lambda g: (_randn(g, 4, 5), _randn(g, 4, 5, grad=False)),
   large=lambda g: (_randn(g, 256, 160), _randn(g, 256, 160, grad=False)))
def _huber(slip):
    delta = 0.5

    class HuberLoss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, pred, target):
            r = pred - target
            a = r.abs()
            ctx.save_for_backward(pred, target)
            return torch.where(a <= delta, 0.5 * r * r, delta * (a - 0.5 * delta)).mean()

        @staticmethod
        def backward(ctx, grad_output):
            pred, target = ctx.saved_tensors
            r = pred - target
            if slip == "linear_region":
                dr = r
            else:
                dr = torch.where(r.abs() <= delta, r, delta * torch.sign(r))
            if slip != "no_mean":
                dr = dr / r.numel()
            if slip == "ignores_grad_output":
                return dr, None
            return grad_output * dr, None

    return HuberLoss


# ---------------------------------------------------------------------------------------------------------------
# Attention

def _attention_backward(p, g, v, q, k, scale):
    """The shared parts a researcher would factor out: dv, dP and dS of softmax(q·kᵀ·scale)·v."""
    dv = p.transpose(-2, -1) @ g
    dp = g @ v.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
    return dv, dp, ds


@_op("causal_attention", {
    "dq_no_scale": ("scale", "dQ = dS·K without the 1/√d"),
    "dk_not_transposed": ("transposed", "dK = dS·Q where dSᵀ·Q belongs"),
    "dq_from_dp": ("wrong_value", "dQ = dP·K/√d: dP used where dS belongs"),
    "no_rowsum": ("per_row", "dS = P ⊙ dP: the softmax's −rowsum(dP ⊙ P) left out"),
    "saved_p": ("second_order_only", "P kept on ctx in forward: right gradients, a constant to double backward"),
}, small=lambda g: tuple(_randn(g, 5, 4) for _ in range(3)),
   large=lambda g: tuple(_randn(g, 16, 16) for _ in range(3)))
def _causal_attention(slip):
    class CausalAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            t, d = q.shape
            scale = 1.0 / math.sqrt(d)
            mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
            s = (q @ k.T) * scale
            s = s.masked_fill(mask, float("-inf"))
            p = torch.softmax(s, dim=-1)
            ctx.save_for_backward(q, k, v)
            if slip == "saved_p":
                ctx.p = p
            return p @ v

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v = ctx.saved_tensors
            t, d = q.shape
            scale = 1.0 / math.sqrt(d)
            if slip == "saved_p":
                p = ctx.p
            else:
                mask = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)
                s = (q @ k.T) * scale
                s = s.masked_fill(mask, float("-inf"))
                p = torch.softmax(s, dim=-1)
            dv = p.T @ grad_out
            dp = grad_out @ v.T
            if slip == "no_rowsum":
                ds = p * dp
            else:
                ds = p * (dp - (dp * p).sum(-1, keepdim=True))
            if slip == "dq_no_scale":
                dq = ds @ k
            elif slip == "dq_from_dp":
                dq = dp @ k * scale
            else:
                dq = ds @ k * scale
            if slip == "dk_not_transposed":
                dk = ds @ q * scale
            else:
                dk = ds.T @ q * scale
            return dq, dk, dv

    return CausalAttention


@_op("mha", {
    "dk_not_transposed": ("transposed", "dK = dS·Q where dSᵀ·Q belongs (per head)"),
    "dv_not_transposed": ("transposed", "dV = P·dO where Pᵀ·dO belongs"),
    "dq_inv_d": ("scale", "dQ scaled by 1/d where the forward has 1/√d"),
}, small=lambda g: tuple(_randn(g, 2, 2, 4, 3) for _ in range(3)),
   large=lambda g: tuple(_randn(g, 2, 2, 8, 8) for _ in range(3)))
def _mha(slip):
    class MultiHeadAttention(torch.autograd.Function):
        """softmax(Q·Kᵀ/√d)·V on (batch, heads, tokens, head_dim)."""

        @staticmethod
        def forward(ctx, q, k, v):
            scale = q.shape[-1] ** -0.5
            attn = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
            ctx.save_for_backward(q, k, v)
            return attn @ v

        @staticmethod
        def backward(ctx, do):
            q, k, v = ctx.saved_tensors
            d = q.shape[-1]
            scale = d ** -0.5
            attn = torch.softmax(q @ k.transpose(-2, -1) * scale, dim=-1)
            if slip == "dv_not_transposed":
                dv = attn @ do
            else:
                dv = attn.transpose(-2, -1) @ do
            dattn = do @ v.transpose(-2, -1)
            dscores = attn * (dattn - (dattn * attn).sum(dim=-1, keepdim=True))
            if slip == "dq_inv_d":
                dq = dscores @ k / d
            else:
                dq = dscores @ k * scale
            if slip == "dk_not_transposed":
                dk = dscores @ q * scale
            else:
                dk = dscores.transpose(-2, -1) @ q * scale
            return dq, dk, dv

    return MultiHeadAttention


def _alibi_inputs(h, t, d):
    def build(gen):
        q, k, v = (_randn(gen, h, t, d) for _ in range(3))
        slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / h) for i in range(h)], dtype=DTYPE).requires_grad_()
        return q, k, v, slopes
    return build


@_op("alibi", {
    "dslope_from_dp": ("wrong_value", "d(slope) = Σ dP ⊙ dist: dP used where dS belongs"),
    "dist_transposed": ("sign", "the distance written i − j (distᵀ) in the backward where the forward has j − i"),
    "dq_no_scale": ("scale", "dQ = dS·K without the 1/√d"),
}, small=_alibi_inputs(2, 4, 3), large=_alibi_inputs(2, 12, 12))
def _alibi(slip):
    class ALiBiAttention(torch.autograd.Function):
        """Causal attention with a learnable ALiBi slope per head: s = q·kᵀ/√d + m_h·(j − i)."""

        @staticmethod
        def forward(ctx, q, k, v, slopes):
            t, d = q.shape[-2], q.shape[-1]
            pos = torch.arange(t, dtype=q.dtype)
            dist = pos[None, :] - pos[:, None]
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
            s = q @ k.transpose(-2, -1) / math.sqrt(d) + slopes[:, None, None] * dist
            p = torch.softmax(s.masked_fill(causal, float("-inf")), -1)
            ctx.save_for_backward(q, k, v, slopes)
            return p @ v

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, slopes = ctx.saved_tensors
            t, d = q.shape[-2], q.shape[-1]
            pos = torch.arange(t, dtype=q.dtype)
            dist = pos[None, :] - pos[:, None]
            causal = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
            s = q @ k.transpose(-2, -1) / math.sqrt(d) + slopes[:, None, None] * dist
            p = torch.softmax(s.masked_fill(causal, float("-inf")), -1)
            dv, dp, ds = _attention_backward(p, grad_out, v, q, k, 1.0 / math.sqrt(d))
            if slip == "dq_no_scale":
                dq = ds @ k
            else:
                dq = ds @ k / math.sqrt(d)
            dk = ds.transpose(-2, -1) @ q / math.sqrt(d)
            if slip == "dslope_from_dp":
                dslopes = (dp * dist).sum((-2, -1))
            elif slip == "dist_transposed":
                dslopes = (ds * dist.T).sum((-2, -1))
            else:
                dslopes = (ds * dist).sum((-2, -1))
            return dq, dk, dv, dslopes

    return ALiBiAttention


def _rotary_inputs(t, d):
    def build(gen):
        x = _randn(gen, t, d)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=DTYPE) / d))
        angles = torch.arange(t, dtype=DTYPE)[:, None] * inv_freq[None, :]
        angles = torch.cat((angles, angles), dim=-1)
        return x, torch.cos(angles), torch.sin(angles)
    return build


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


@_op("rotary", {
    "rotate_not_adjoint": ("sign", "rotate_half(g·sin) where its adjoint −rotate_half(g·sin) belongs"),
    "sin_term_dropped": ("term_dropped", "dx = g·cos: the rotated term left out"),
    "pair_convention": ("other", "the adjoint rotates interleaved pairs (0, 1), (2, 3), … where the forward rotates "
                                 "halves"),
}, small=_rotary_inputs(6, 8), large=_rotary_inputs(32, 16))
def _rotary(slip):
    class RotaryEmbedding(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin):
            ctx.save_for_backward(cos, sin)
            return x * cos + _rotate_half(x) * sin

        @staticmethod
        def backward(ctx, grad_output):
            cos, sin = ctx.saved_tensors
            if slip == "rotate_not_adjoint":
                dx = grad_output * cos + _rotate_half(grad_output * sin)
            elif slip == "sin_term_dropped":
                dx = grad_output * cos
            elif slip == "pair_convention":
                gs = grad_output * sin
                dx = grad_output * cos - torch.stack((-gs[..., 1::2], gs[..., ::2]), dim=-1).flatten(-2)
            else:
                dx = grad_output * cos - _rotate_half(grad_output * sin)
            return dx, None, None

    return RotaryEmbedding


# ---------------------------------------------------------------------------------------------------------------
# Gated and products

def _swiglu_inputs(n, d, h):
    def build(gen):
        return _randn(gen, n, d), _randn(gen, d, h, scale=d ** -0.5), _randn(gen, d, h, scale=d ** -0.5)
    return build


@_op("swiglu", {
    "gate_branch_dropped": ("term_dropped", "dx = (g·b·silu'(a))·Wᵀ: the value branch's (g·silu(a))·Vᵀ dropped"),
    "silu_prime_sigmoid": ("term_dropped", "silu'(a) = σ(a): the product rule's a·σ(a)(1−σ(a)) dropped"),
    "dv_uses_a": ("wrong_value", "dV = xᵀ·(g·a): a used where silu(a) belongs"),
}, small=_swiglu_inputs(4, 3, 5), large=_swiglu_inputs(16, 16, 16))
def _swiglu(slip):
    class SwiGLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, v):
            a = x @ w
            b = x @ v
            ctx.save_for_backward(x, w, v)
            return F.silu(a) * b

        @staticmethod
        def backward(ctx, g):
            x, w, v = ctx.saved_tensors
            a = x @ w
            b = x @ v
            sig = torch.sigmoid(a)
            silu = a * sig
            if slip == "silu_prime_sigmoid":
                dsilu = sig
            else:
                dsilu = sig * (1 + a * (1 - sig))
            ga = g * b * dsilu
            gb = g * a if slip == "dv_uses_a" else g * silu
            if slip == "gate_branch_dropped":
                dx = ga @ w.T
            else:
                dx = ga @ w.T + gb @ v.T
            return dx, x.T @ ga, x.T @ gb

    return SwiGLU


@_op("bcast_matmul", {
    "dw_mean": ("scale", "dW = mean over the batch of Aᵀ·G where the broadcast sums it"),
    "dw_first_batch": ("wrong_axis", "dW = A[0]ᵀ·G[0]: the broadcast batch axis not reduced, its first entry kept"),
    "da_w_not_transposed": ("transposed", "dA = G·W where G·Wᵀ belongs"),
}, small=lambda g: (_randn(g, 2, 3, 4), _randn(g, 4, 4)),
   large=lambda g: (_randn(g, 4, 8, 8), _randn(g, 8, 8)))
def _bcast_matmul(slip):
    class BatchedLinear(torch.autograd.Function):
        """(B, n, k) @ (k, m): one weight broadcast over the batch."""

        @staticmethod
        def forward(ctx, a, w):
            ctx.save_for_backward(a, w)
            return a @ w

        @staticmethod
        def backward(ctx, grad):
            a, w = ctx.saved_tensors
            da = grad @ w if slip == "da_w_not_transposed" else grad @ w.T
            if slip == "dw_mean":
                dw = (a.transpose(-1, -2) @ grad).mean(0)
            elif slip == "dw_first_batch":
                dw = a[0].T @ grad[0]
            else:
                dw = (a.transpose(-1, -2) @ grad).sum(0)
            return da, dw

    return BatchedLinear


def _scan_inputs(t, d):
    def build(gen):
        return _randn(gen, t, d), _uniform(gen, 0.5, 0.95, d)
    return build


@_op("ema_scan", {
    "adjoint_forward": ("transposed", "the adjoint recursion run forward in time (dh_t = g_t + a·dh_{t−1})"),
    "da_uses_h_t": ("wrong_value", "da = Σ dh_t·h_t where h_{t−1} belongs"),
    "da_uses_g": ("wrong_value", "da = Σ g_t·h_{t−1}: the output gradient where the accumulated dh_t belongs"),
}, small=_scan_inputs(6, 3), large=_scan_inputs(32, 16))
def _ema_scan(slip):
    class LinearScan(torch.autograd.Function):
        """h_t = a ⊙ h_{t−1} + x_t along the first axis, h_{−1} = 0, a learnable decay per channel."""

        @staticmethod
        def forward(ctx, x, a):
            h = torch.zeros_like(x[0])
            hs = []
            for t in range(x.shape[0]):
                h = a * h + x[t]
                hs.append(h)
            ctx.save_for_backward(x, a)
            return torch.stack(hs)

        @staticmethod
        def backward(ctx, grad_out):
            x, a = ctx.saved_tensors
            steps = x.shape[0]
            hs, h = [], torch.zeros_like(x[0])
            for t in range(steps):
                h = a * h + x[t]
                hs.append(h)
            h_prev = [torch.zeros_like(x[0])] + hs[:-1]
            dhs = [None] * steps
            dh = torch.zeros_like(x[0])
            order = range(steps) if slip == "adjoint_forward" else reversed(range(steps))
            for t in order:
                dh = grad_out[t] + a * dh
                dhs[t] = dh
            dx = torch.stack(dhs)
            if slip == "da_uses_h_t":
                da = sum(dhs[t] * hs[t] for t in range(steps))
            elif slip == "da_uses_g":
                da = sum(grad_out[t] * h_prev[t] for t in range(steps))
            else:
                da = sum(dhs[t] * h_prev[t] for t in range(steps))
            return dx, da

    return LinearScan


@_op("cumsum", {
    "no_flip": ("transposed", "dx = cumsum(g): the forward's cumsum where its adjoint, a reversed cumsum, belongs"),
    "flip_once": ("other", "dx = flip(g).cumsum(): the result not flipped back"),
    "wrong_dim": ("wrong_axis", "the reversed cumsum taken along dim 0 instead of the summed axis"),
}, small=lambda g: (_randn(g, 5, 5),), large=lambda g: (_randn(g, 16, 16),))
def _cumsum(slip):
    class CumSum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.cumsum(x, dim=-1)

        @staticmethod
        def backward(ctx, g):
            if slip == "no_flip":
                return torch.cumsum(g, dim=-1)
            if slip == "flip_once":
                return torch.flip(g, [-1]).cumsum(-1)
            if slip == "wrong_dim":
                return torch.flip(torch.flip(g, [0]).cumsum(0), [0])
            return torch.flip(torch.flip(g, [-1]).cumsum(-1), [-1])

    return CumSum


@_op("logsumexp", {
    "no_normalizer": ("per_row", "dx = g·exp(x): each row's 1/Σexp forgotten"),
    "grad_broadcast_wrong": ("wrong_axis", "g[None, :] where g[:, None] belongs"),
}, small=lambda g: (_randn(g, 5, 5),), large=lambda g: (_randn(g, 40, 40),))
def _logsumexp(slip):
    class LogSumExp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            m = x.max(dim=-1, keepdim=True).values
            y = m.squeeze(-1) + torch.log(torch.exp(x - m).sum(-1))
            ctx.save_for_backward(x, y)
            return y

        @staticmethod
        def backward(ctx, g):
            x, y = ctx.saved_tensors
            if slip == "no_normalizer":
                return g[:, None] * torch.exp(x)
            if slip == "grad_broadcast_wrong":
                return g[None, :] * torch.exp(x - y[:, None])
            return g[:, None] * torch.exp(x - y[:, None])

    return LogSumExp


@_op("gated", {
    "dz_no_x": ("term_factor", "dz = g·σ'(z): the product's other factor x left out"),
    "sigmoid_prime": ("term_factor", "σ'(z) written σ(z) (the (1 − σ) factor dropped)"),
    "gate_branch_dropped": ("term_dropped", "the gate's gradient left out (None for z)"),
}, small=lambda g: (_randn(g, 4, 5), _randn(g, 4, 5)), large=lambda g: (_randn(g, 16, 16), _randn(g, 16, 16)))
def _gated(slip):
    class Gated(torch.autograd.Function):
        """y = x ⊙ σ(z)."""

        @staticmethod
        def forward(ctx, x, z):
            ctx.save_for_backward(x, z)
            return x * torch.sigmoid(z)

        @staticmethod
        def backward(ctx, g):
            x, z = ctx.saved_tensors
            s = torch.sigmoid(z)
            dx = g * s
            if slip == "gate_branch_dropped":
                return dx, None
            if slip == "dz_no_x":
                dz = g * s * (1 - s)
            elif slip == "sigmoid_prime":
                dz = g * x * s
            else:
                dz = g * x * s * (1 - s)
            return dx, dz

    return Gated


@_op("cube", {
    "coefficient_2": ("scale", "d(x³) = 2x²: the power rule's coefficient wrong"),
    "exponent_not_lowered": ("term_factor", "d(x³) = 3x³: the power rule's exponent not lowered"),
    "saved_square": ("second_order_only", "x² kept on ctx in forward: a constant to double backward"),
}, small=lambda g: (_randn(g, 4, 5),), large=lambda g: (_randn(g, 16, 16),))
def _cube(slip):
    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            if slip == "saved_square":
                ctx.x2 = x * x
            return x ** 3

        @staticmethod
        def backward(ctx, grad_output):
            x, = ctx.saved_tensors
            if slip == "coefficient_2":
                return grad_output * 2 * x ** 2
            if slip == "exponent_not_lowered":
                return grad_output * 3 * x ** 3
            if slip == "saved_square":
                return grad_output * 3 * ctx.x2
            return grad_output * 3 * x ** 2

    return Cube


# ---------------------------------------------------------------------------------------------------------------
# Softmax with a temperature

@_op("temp_softmax", {
    "no_inv_tau": ("scale", "dx without the 1/τ of softmax(x/τ)"),
    "no_rowsum": ("per_row", "dx = p·g/τ: the −rowsum(g·p) term left out"),
    "rowsum_axis": ("wrong_axis", "Σ(g·p) over dim 0 where the softmax's axis (−1) belongs"),
}, small=lambda g: (_randn(g, 5, 5),), large=lambda g: (_randn(g, 16, 16),))
def _temp_softmax(slip):
    tau = 0.7

    class TemperatureSoftmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            p = torch.softmax(x / tau, dim=-1)
            ctx.save_for_backward(p)
            return p

        @staticmethod
        def backward(ctx, g):
            p, = ctx.saved_tensors
            if slip == "no_rowsum":
                dx = p * g
            elif slip == "rowsum_axis":
                dx = p * (g - (g * p).sum(0, keepdim=True))
            else:
                dx = p * (g - (g * p).sum(-1, keepdim=True))
            if slip == "no_inv_tau":
                return dx
            return dx / tau

    return TemperatureSoftmax


def _scalar_temperature_inputs(n, c):
    def build(gen):
        return _randn(gen, n, c), torch.tensor(1.3, dtype=DTYPE, requires_grad=True)
    return build


@_op("scalar_temperature", {
    "dx_no_beta": ("scale", "dx without the chain rule's β of softmax(β·x)"),
    "dbeta_no_rowsum": ("term_dropped", "dβ = Σ p·g·x: the softmax's −rowsum(g·p) term left out of dβ"),
    "dbeta_from_g": ("wrong_value", "dβ = Σ g·x: the output gradient where the softmax's dS belongs"),
}, small=_scalar_temperature_inputs(4, 5), large=_scalar_temperature_inputs(24, 24),
   notes="β is 0-d, as torch.tensor(1.3, requires_grad=True) makes it; the backward returns dbeta.sum()")
def _scalar_temperature(slip):
    class InverseTemperatureSoftmax(torch.autograd.Function):
        """softmax(β·x) with a learnable 0-d β."""

        @staticmethod
        def forward(ctx, x, beta):
            ctx.save_for_backward(x, beta)
            return torch.softmax(beta * x, dim=-1)

        @staticmethod
        def backward(ctx, g):
            x, beta = ctx.saved_tensors
            p = torch.softmax(beta * x, dim=-1)
            ds = p * (g - (g * p).sum(-1, keepdim=True))
            dx = ds if slip == "dx_no_beta" else beta * ds
            if slip == "dbeta_no_rowsum":
                dbeta = p * g * x
            elif slip == "dbeta_from_g":
                dbeta = g * x
            else:
                dbeta = ds * x
            return dx, dbeta.sum()

    return InverseTemperatureSoftmax


# ---------------------------------------------------------------------------------------------------------------
# Row-wise ops

@_op("row_moments", {
    "var_unbiased": ("term_factor", "the variance's term divided by D − 1 though the forward divides by D"),
    "var_branch_dropped": ("term_dropped", "dx = g_mean/D: the variance output's gradient left out"),
    "mean_sign": ("sign", "dx = −g_mean/D + …: the mean branch's sign"),
}, small=lambda g: (_randn(g, 4, 5),), large=lambda g: (_randn(g, 64, 64),), outputs=2,
   notes="two outputs, (mean, var) of each row")
def _row_moments(slip):
    class RowMoments(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            mean = x.mean(-1)
            var = ((x - mean[:, None]) ** 2).mean(-1)
            ctx.save_for_backward(x)
            return mean, var

        @staticmethod
        def backward(ctx, g_mean, g_var):
            x, = ctx.saved_tensors
            d = x.shape[-1]
            centered = x - x.mean(-1, keepdim=True)
            dmean = -g_mean[:, None] / d if slip == "mean_sign" else g_mean[:, None] / d
            if slip == "var_branch_dropped":
                return dmean * torch.ones_like(x)
            denom = d - 1 if slip == "var_unbiased" else d
            return dmean + g_var[:, None] * 2 * centered / denom

    return RowMoments


@_op("l2_normalize", {
    "no_projection": ("per_row", "dx = g/‖x‖: the −y·⟨g, y⟩ projection of each row left out"),
    "norm_squared": ("per_row", "divided by ‖x‖² where ‖x‖ belongs: each row off by its own scale"),
    "projection_sign": ("sign", "+y·⟨g, y⟩: the projection's sign"),
}, small=lambda g: (_randn(g, 4, 5),), large=lambda g: (_randn(g, 16, 16),))
def _l2_normalize(slip):
    class L2Normalize(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            norm = x.norm(dim=-1, keepdim=True)
            ctx.save_for_backward(x)
            return x / norm

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            norm = x.norm(dim=-1, keepdim=True)
            y = x / norm
            if slip == "no_projection":
                inner = g
            elif slip == "projection_sign":
                inner = g + y * (g * y).sum(-1, keepdim=True)
            else:
                inner = g - y * (g * y).sum(-1, keepdim=True)
            if slip == "norm_squared":
                return inner / norm ** 2
            return inner / norm

    return L2Normalize


# Findings that say where the error is, or what was not checked, but not what the slip is: "no known kind" names
# only the input and where the error concentrates; "one input" and "VJP only"/"JVP only" say which input or which
# mode fails; "diagonal" and "one row" say where on the Jacobian the errors sit; "Hessian block" which block of the
# Hessian fails; "first order" that the second-order check fails because the first order does; "no JVP" is a note;
# "tolerance" and "kink" say that the differences themselves are in doubt, not the rule; "consistent" and "adjoint"
# compare the two modes with each other. A slip named only by these is counted as not named.
GENERIC = {
    "unexplained", "one_input", "vjp_only", "jvp_only", "diagonal", "one_row", "hessian_block", "first_order",
    "no_jvp", "tolerance", "kink", "consistent", "adjoint",
}

# The checker's kinds that name each kind of slip truly. A slip's kind is what a person would call it; the
# checker may name the same slip by its structure (a sign of one term is also "a term with the factor −1", dSᵀ for
# dS is also "a term from the wrong value", a per-row term left out is also "a dropped term"), and each of those is
# a right name. A key equal to the slip's own kind always counts, so kinds added to the checker under these names
# count as soon as they exist.
EXPECTED = {
    "term_dropped": {"term_dropped", "zero", "elementwise"},  # zero: the whole of an input's gradient left out
    "term_factor": {"term_factor", "term_added", "elementwise"},
    "scale": {"scale", "term_factor"},
    "sign": {"sign", "term_sign", "term_factor"},
    "transposed": {"transposed_jacobian", "transposed_input", "transposed_output", "transposed_term",
                   "wrong_value"},
    "per_row": {"per_row_term", "per_row_factor", "term_dropped", "term_factor"},
    "wrong_value": {"wrong_value"},
    "wrong_axis": {"wrong_axis", "transposed_input", "transposed_output"},
    "ignores_grad_output": {"nonlinear", "ignores_cotangent", "ignores_grad_output"},
    "second_order_only": {"saved_on_ctx", "saved_in_forward", "second_order_only"},
    "masked": {"masked_positions"},
    "other": set(),  # any specific kind
}
