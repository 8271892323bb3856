"""Right kernels written in torch ops at their inputs' dtype (no float32 inside: closed-form backwards in bf16 or
fp16 ops), of families apart from precision_ops16.py's BUILD and HELDOUT and written apart from them, in its
interface (Case; sizes "small", "large", "3d"), used only to report the block-by-block bound
(python/tools/partial_table.py --set ops_heldout2)."""

import math

import torch

from precision_ops16 import SHAPES, Case, _draw


def _rows(t):
    """t with every leading axis folded into one: (rows, last)."""
    return t.reshape(-1, t.shape[-1])


def _x_and_weight(size, dtype, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[size]
    return _draw(gen, shape, dtype, scale), _draw(gen, (shape[-1],), dtype, 0.3, 1.0)


# ---- group norm over channel groups of the last axis, with a weight and a bias ----

GROUPS = 4


def make_group_norm(variant="right"):
    class GroupNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            xg = x.reshape(*x.shape[:-1], GROUPS, x.shape[-1] // GROUPS)
            mean = xg.mean(-1, keepdim=True)
            rstd = torch.rsqrt(((xg - mean) ** 2).mean(-1, keepdim=True) + 1e-5)
            xhat = (xg - mean) * rstd
            ctx.save_for_backward(xhat, rstd, w)
            return xhat.reshape(x.shape) * w + b

        @staticmethod
        def backward(ctx, g):
            xhat, rstd, w = ctx.saved_tensors
            p = (g * w).reshape(xhat.shape)
            gx = rstd * (p - p.mean(-1, keepdim=True) - xhat * (p * xhat).mean(-1, keepdim=True))
            return gx.reshape(g.shape), _rows(g * xhat.reshape(g.shape)).sum(0), _rows(g).sum(0)
    return GroupNorm.apply


def group_norm_reference(x, w, b):
    xg = x.reshape(*x.shape[:-1], GROUPS, x.shape[-1] // GROUPS)
    m = xg.mean(-1, keepdim=True)
    xhat = (xg - m) / torch.sqrt(((xg - m) ** 2).mean(-1, keepdim=True) + 1e-5)
    return xhat.reshape(x.shape) * w + b


def group_norm_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[size]
    return (_draw(gen, shape, dtype, 1.5, 0.5), _draw(gen, (shape[-1],), dtype, 0.3, 1.0),
            _draw(gen, (shape[-1],), dtype, 0.1))


# ---- softmax cross-entropy per row, with fixed integer targets (not checked) ----

def make_cross_entropy(variant="right"):
    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, target):
            m = x.max(-1, keepdim=True).values
            e = torch.exp(x - m)
            s = e.sum(-1, keepdim=True)
            ctx.save_for_backward(e / s, target)
            picked = x.gather(-1, target.unsqueeze(-1))
            return (m + torch.log(s) - picked).squeeze(-1)

        @staticmethod
        def backward(ctx, g):
            p, target = ctx.saved_tensors
            onehot = torch.zeros_like(p).scatter_(-1, target.unsqueeze(-1), 1.0)
            return g.unsqueeze(-1) * (p - onehot), None
    return CrossEntropy.apply


def cross_entropy_reference(x, target):
    m = x.max(-1, keepdim=True).values
    lse = m + torch.log(torch.exp(x - m).sum(-1, keepdim=True))
    return (lse - x.gather(-1, target.unsqueeze(-1))).squeeze(-1)


def cross_entropy_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[size]
    return _draw(gen, shape, dtype, 2.0), torch.randint(0, shape[-1], shape[:-1], generator=gen)


# ---- SwiGLU feed-forward block: (silu(x wg^T) * (x wu^T)) wd^T ----

HIDDEN = 64


def make_swiglu_ffn(variant="right"):
    class SwigluFfn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, wg, wu, wd):
            hg, hu = x @ wg.transpose(0, 1), x @ wu.transpose(0, 1)
            s = torch.sigmoid(hg)
            a = hg * s
            ctx.save_for_backward(x, wg, wu, wd, hg, hu, s, a)
            return (a * hu) @ wd.transpose(0, 1)

        @staticmethod
        def backward(ctx, g):
            x, wg, wu, wd, hg, hu, s, a = ctx.saved_tensors
            dm = g @ wd
            dhu = dm * a
            dhg = dm * hu * s * (1 + hg * (1 - s))
            gx = dhg @ wg + dhu @ wu
            xs = _rows(x)
            return (gx, _rows(dhg).transpose(0, 1) @ xs, _rows(dhu).transpose(0, 1) @ xs,
                    _rows(g).transpose(0, 1) @ _rows(a * hu))
    return SwigluFfn.apply


def swiglu_ffn_reference(x, wg, wu, wd):
    hg = x @ wg.transpose(0, 1)
    return (hg / (1 + torch.exp(-hg)) * (x @ wu.transpose(0, 1))) @ wd.transpose(0, 1)


def swiglu_ffn_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[size]
    c = shape[-1]
    return (_draw(gen, shape, dtype), _draw(gen, (HIDDEN, c), dtype, 1 / math.sqrt(c)),
            _draw(gen, (HIDDEN, c), dtype, 1 / math.sqrt(c)), _draw(gen, (c, HIDDEN), dtype, 1 / math.sqrt(HIDDEN)))


# ---- row squash: x / (1 + ||x||) along the last axis, times a weight ----

def make_row_squash(variant="right"):
    class RowSquash(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            n = torch.sqrt((x * x).sum(-1, keepdim=True))
            ctx.save_for_backward(x, w, n)
            return x / (1 + n) * w

        @staticmethod
        def backward(ctx, g):
            x, w, n = ctx.saved_tensors
            p, d = g * w, 1 / (1 + n)
            gx = p * d - x * (p * x).sum(-1, keepdim=True) * (d * d / n)
            return gx, _rows(g * x * d).sum(0)
    return RowSquash.apply


def row_squash_reference(x, w):
    return x / (1 + torch.sqrt((x * x).sum(-1, keepdim=True))) * w


# ---- rotary position embedding, half-split pairs, fixed cos/sin tables (not checked) ----

def make_rotary(variant="right"):
    class Rotary(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, cos, sin):
            h = x.shape[-1] // 2
            x1, x2 = x[..., :h], x[..., h:]
            ctx.save_for_backward(cos, sin)
            return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

        @staticmethod
        def backward(ctx, g):
            cos, sin = ctx.saved_tensors
            h = g.shape[-1] // 2
            g1, g2 = g[..., :h], g[..., h:]
            return torch.cat([g1 * cos + g2 * sin, g2 * cos - g1 * sin], -1), None, None
    return Rotary.apply


def rotary_reference(x, cos, sin):
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)


def rotary_inputs(size, dtype, seed):
    """x (..., T, D) and the tables (T, D/2) of angle t * 10000^(-2i/D), at x's dtype."""
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[size]
    t, d = shape[-2], shape[-1]
    angle = torch.arange(t, dtype=torch.float64)[:, None] * 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    return _draw(gen, shape, dtype), torch.cos(angle).to(dtype), torch.sin(angle).to(dtype)


# ---- causal single-head attention: softmax(mask(q k^T / sqrt(d))) v, leading axes as batch ----

def _causal(q, k):
    """True where key j comes after query i (masked out)."""
    return torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).triu(1)


def make_causal_attention(variant="right"):
    class CausalAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            scale = 1 / math.sqrt(q.shape[-1])
            s = (q @ k.transpose(-1, -2) * scale).masked_fill(_causal(q, k), -math.inf)
            p = torch.softmax(s, -1)
            ctx.save_for_backward(q, k, v, p)
            return p @ v

        @staticmethod
        def backward(ctx, g):
            q, k, v, p = ctx.saved_tensors
            scale = 1 / math.sqrt(q.shape[-1])
            dp = g @ v.transpose(-1, -2)
            ds = p * (dp - (dp * p).sum(-1, keepdim=True))
            return ds @ k * scale, ds.transpose(-1, -2) @ q * scale, p.transpose(-1, -2) @ g
    return CausalAttention.apply


def causal_attention_reference(q, k, v):
    s = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(_causal(q, k), -math.inf)
    e = torch.exp(s - s.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True) @ v


def causal_attention_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return tuple(_draw(gen, SHAPES[size], dtype) for _ in range(3))


# ---- residual add then RMSNorm: rmsnorm(x + r) * w ----

def make_residual_rms_norm(variant="right"):
    class ResidualRMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, r, w):
            h = x + r
            rs = torch.rsqrt((h * h).mean(-1, keepdim=True) + 1e-6)
            ctx.save_for_backward(h, w, rs)
            return h * rs * w

        @staticmethod
        def backward(ctx, g):
            h, w, rs = ctx.saved_tensors
            p = g * w
            gh = rs * p - h * rs ** 3 * (p * h).mean(-1, keepdim=True)
            return gh, gh, _rows(g * h * rs).sum(0)
    return ResidualRMSNorm.apply


def residual_rms_norm_reference(x, r, w):
    h = x + r
    return h / torch.sqrt((h * h).mean(-1, keepdim=True) + 1e-6) * w


def residual_rms_norm_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[size]
    return _draw(gen, shape, dtype), _draw(gen, shape, dtype, 0.5), _draw(gen, (shape[-1],), dtype, 0.3, 1.0)


# ---- logsumexp pooling over the last axis of x scaled by a learned per-channel temperature ----

def make_lse_pool(variant="right"):
    class LsePool(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, t):
            z = x * t
            m = z.max(-1, keepdim=True).values
            e = torch.exp(z - m)
            s = e.sum(-1, keepdim=True)
            ctx.save_for_backward(x, t, e / s)
            return (m + torch.log(s)).squeeze(-1)

        @staticmethod
        def backward(ctx, g):
            x, t, p = ctx.saved_tensors
            gp = g.unsqueeze(-1) * p
            return gp * t, _rows(gp * x).sum(0)
    return LsePool.apply


def lse_pool_reference(x, t):
    z = x * t
    m = z.max(-1, keepdim=True).values
    return (m + torch.log(torch.exp(z - m).sum(-1, keepdim=True))).squeeze(-1)


CASES = [Case("group_norm16c", make_group_norm, group_norm_reference, group_norm_inputs),
         Case("cross_entropy16c", make_cross_entropy, cross_entropy_reference, cross_entropy_inputs),
         Case("swiglu_ffn16c", make_swiglu_ffn, swiglu_ffn_reference, swiglu_ffn_inputs),
         Case("row_squash16c", make_row_squash, row_squash_reference, _x_and_weight),
         Case("rotary16c", make_rotary, rotary_reference, rotary_inputs, fp16_ok=True),
         Case("causal_attention16c", make_causal_attention, causal_attention_reference, causal_attention_inputs),
         Case("residual_rms_norm16c", make_residual_rms_norm, residual_rms_norm_reference, residual_rms_norm_inputs),
         Case("lse_pool16c", make_lse_pool, lse_pool_reference, lambda s, d, seed: _x_and_weight(s, d, seed, 2.0))]
