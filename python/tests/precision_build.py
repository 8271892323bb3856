"""Fused kernels at a low precision, right and with slips: the set the low-precision verdict is built on.

Each op is a torch.autograd.Function written as a fused kernel is: bf16 or float32 tensors in and out, float32 inside
(statistics, softmax, accumulators), a hand-written backward. Its slips are annotated with the kind a careful reader
names them and whether they live in the 16-bit path alone ("low") or in every precision ("all"). The held-out set,
written apart from this one and not read while the bound was built, is python/tests/precision_heldout.py; both are
run by python/tools/precision_table.py.
"""

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
import torch.nn.functional as F


@dataclass
class Case:
    name: str
    make: Callable                    # make(variant) -> the Function's apply
    reference: Callable               # the forward's math in composite torch ops
    f_reference: Optional[Callable]   # the same through torch.nn.functional's fused op, where there is one
    inputs: Callable                  # inputs(size, dtype, seed) -> tuple of tensors
    slips: dict = field(default_factory=dict)  # slip -> (kind, "low" | "all")
    fp16_ok: bool = False


def _drawn(shapes, size, dtype, seed, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return tuple((torch.randn(*s, dtype=torch.float64, generator=g) * scale).to(dtype).requires_grad_()
                 for s in shapes[size])


def _low(t):
    return t.dtype in (torch.bfloat16, torch.float16)


# --- layer norm: y = (x − μ)/σ · w + b over the last axis -------------------------------------------------------------

def _layer_norm(slip):
    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            xf = x.float()
            mu = xf.mean(-1, keepdim=True)
            rstd = torch.rsqrt(((xf - mu) ** 2).mean(-1, keepdim=True) + 1e-5)
            xhat = (xf - mu) * rstd
            ctx.save_for_backward(x, w, mu, rstd)
            return (xhat * w.float() + b.float()).to(x.dtype)

        @staticmethod
        def backward(ctx, gy):
            x, w, mu, rstd = ctx.saved_tensors
            xhat = (x.float() - mu) * rstd
            g = gy.float()
            gxhat = g * w.float()
            # x̄ = rstd · (ĝ − mean(ĝ) − x̂ · mean(ĝ ⊙ x̂)), ĝ = ȳ ⊙ w
            mean_g = gxhat.mean(-1, keepdim=True)
            if slip == "no_mean" and _low(x):
                mean_g = torch.zeros_like(mean_g)
            mean_gx = (gxhat * xhat).mean(-1, keepdim=True)
            if slip == "no_projection":
                mean_gx = torch.zeros_like(mean_gx)
            gx = rstd * (gxhat - mean_g - xhat * mean_gx)
            # w̄ and b̄: partial sums over blocks of 64 rows, then their sum (as a kernel's programs leave them)
            rows = g.reshape(-1, g.shape[-1])
            parts = torch.stack([(rows[k:k + 64] * xhat.reshape(rows.shape)[k:k + 64]).sum(0)
                                 for k in range(0, rows.shape[0], 64)])
            gw = _running(parts, x.dtype) if slip == "bf16_partials" and _low(x) else parts.sum(0)
            gb = rows.sum(0)
            if slip == "gb_scaled" and _low(x):
                gb = gb * 1.05
            return gx.to(x.dtype), gw.to(w.dtype), gb.to(w.dtype)
    return LayerNorm.apply


def _running(parts, dtype):
    """Σ parts, the running sum kept at dtype (a kernel whose accumulator is 16 bits)."""
    total = torch.zeros(parts.shape[1:], dtype=dtype, device=parts.device)
    for p in parts:
        total = (total.float() + p).to(dtype)
    return total.float()


def _layer_norm_reference(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + 1e-5) * w + b


def _layer_norm_f(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)


LAYER_NORM = Case(
    "layer_norm", _layer_norm, _layer_norm_reference, _layer_norm_f,
    lambda size, dtype, seed: _drawn({"small": [(32, 64), (64,), (64,)], "large": [(1024, 128), (128,), (128,)]},
                                     size, dtype, seed),
    {"no_mean": ("per_row_term", "low"), "no_projection": ("per_row_term", "all"),
     "bf16_partials": ("precision_defect", "low"), "gb_scaled": ("scale", "low")})


# --- softmax over the last axis, float32 inside -----------------------------------------------------------------------

def _softmax(slip):
    class Softmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            p = torch.softmax(x.float(), -1)
            ctx.save_for_backward(p)
            return p.to(x.dtype)

        @staticmethod
        def backward(ctx, gy):
            (p,) = ctx.saved_tensors
            g = gy.float()
            row = (g * p).sum(-1, keepdim=True)
            if slip == "no_row_term" and _low(gy):
                row = torch.zeros_like(row)
            if slip == "row_over_columns":
                row = (g * p).sum(-2, keepdim=True)
            gx = p * (g - row)
            if slip == "negated" and _low(gy):
                gx = -gx
            return gx.to(gy.dtype)
    return Softmax.apply


SOFTMAX = Case(
    "softmax", _softmax, lambda x: torch.exp(x - x.max(-1, keepdim=True).values) /
    torch.exp(x - x.max(-1, keepdim=True).values).sum(-1, keepdim=True), lambda x: torch.softmax(x, -1),
    lambda size, dtype, seed: _drawn({"small": [(16, 32)], "large": [(512, 256)]}, size, dtype, seed, scale=2.0),
    {"no_row_term": ("per_row_term", "low"), "row_over_columns": ("wrong_axis", "all"),
     "negated": ("sign", "low")})


# --- attention with a trainable bias, (B, h, T, d), softmax in float32 ------------------------------------------------

def _attention(slip):
    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, bias):
            scale = 1.0 / math.sqrt(q.shape[-1])
            p = torch.softmax((q @ k.transpose(-2, -1)).float() * scale + bias.float(), -1)
            ctx.save_for_backward(q, k, v, p)
            return p.to(q.dtype) @ v

        @staticmethod
        def backward(ctx, do):
            q, k, v, p = ctx.saved_tensors
            scale = 1.0 / math.sqrt(q.shape[-1])
            dv = p.to(q.dtype).transpose(-2, -1) @ do
            dp = (do @ v.transpose(-2, -1)).float()
            row = (p * dp).sum(-1, keepdim=True)
            if slip == "no_row_term" and _low(q):
                row = torch.zeros_like(row)
            ds = p * (dp - row)
            dbias = ds.sum(0)
            if slip == "dbias_first_batch" and _low(q):
                dbias = ds[0]
            ds = ds.to(q.dtype)
            dq = ds @ k * scale
            if slip == "dq_times_sqrt_d" and _low(q):
                dq = ds @ k * math.sqrt(q.shape[-1])
            dk = ds.transpose(-2, -1) @ q * scale
            return dq, dk, dv, dbias.to(q.dtype)
    return Attention.apply


def _attention_reference(q, k, v, bias):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + bias, -1) @ v


ATTENTION = Case(
    "attention_bias", _attention, _attention_reference, None,
    lambda size, dtype, seed: _drawn({"small": [(2, 3, 8, 16)] * 3 + [(3, 8, 8)],
                                      "large": [(2, 4, 64, 32)] * 3 + [(4, 64, 64)]}, size, dtype, seed),
    {"no_row_term": ("per_row_term", "low"), "dbias_first_batch": ("one_batch_element", "low"),
     "dq_times_sqrt_d": ("scale", "low")})


# --- linear + tanh-GELU: y = gelu(x·Wᵀ + b) ---------------------------------------------------------------------------

_C = math.sqrt(2.0 / math.pi)


def _gelu_tanh(u):
    return 0.5 * u * (1 + torch.tanh(_C * (u + 0.044715 * u ** 3)))


def _linear_gelu(slip):
    class LinearGelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            u = (x @ w.t()).float() + b.float()
            ctx.save_for_backward(x, w, u)
            return _gelu_tanh(u).to(x.dtype)

        @staticmethod
        def backward(ctx, gy):
            x, w, u = ctx.saved_tensors
            t = torch.tanh(_C * (u + 0.044715 * u ** 3))
            inner = _C * (1 + 3 * 0.044715 * u ** 2)
            if slip == "inner_without_cube_rule":
                inner = _C * (1 + 0.044715 * u ** 2)
            dgelu = 0.5 * (1 + t) + 0.5 * u * (1 - t ** 2) * inner
            if slip == "derivative_as_function" and _low(x):
                dgelu = _gelu_tanh(u)
            gu = gy.float() * dgelu
            gx = (gu.to(x.dtype) @ w)
            gw = gu.t() @ x.float()
            if slip == "gw_without_gelu" and _low(x):
                gw = gy.float().t() @ x.float()  # the chain rule's GELU′ left out of W̄
            return gx, gw.to(w.dtype), gu.sum(0).to(w.dtype)
    return LinearGelu.apply


def _linear_gelu_reference(x, w, b):
    return _gelu_tanh(x @ w.t() + b)


LINEAR_GELU = Case(
    "linear_gelu", _linear_gelu, _linear_gelu_reference,
    lambda x, w, b: F.gelu(F.linear(x, w, b), approximate="tanh"),
    lambda size, dtype, seed: _drawn({"small": [(16, 32), (24, 32), (24,)], "large": [(512, 128), (256, 128), (256,)]},
                                     size, dtype, seed, scale=0.7),
    {"inner_without_cube_rule": ("term_factor", "all"), "derivative_as_function": ("wrong_value", "low"),
     "gw_without_gelu": ("dropped_term", "low")})


CASES = [LAYER_NORM, SOFTMAX, ATTENTION, LINEAR_GELU]
