"""A third held-out set of low-precision fused kernels with hand-written backwards, each with slips: eight ops of
families that precision_heldout.py does not have (group norm, a "beta" row normalize, a softmax with a learnable
temperature, rotary query-key scores, a gated recurrent scan, linear + Mish, binary cross-entropy with a positive
weight, causal attention with ALiBi slopes).

Every op is a torch.autograd.Function in the manner of a Triton or CUDA kernel. It reads each input at the dtype it
is given (bf16, fp16 or float32), casts to float32 before any arithmetic (to float64 when the inputs are float64, so
that the very same op can be checked in float64), keeps its row statistics (mean, rstd, norm, lse) in float32, sums
parameter gradients over rows as per-block partial sums in float32, and stores its outputs and input gradients at the
input's dtype. Nothing in a right version computes at a 16-bit dtype.

The interface is the one of precision_heldout.py (Case, KINDS, LOW are imported from there):

    from precision_heldout3 import CASES
    case = CASES[0]
    fn = case.make("right")                    # or one of case.slips
    xs = case.inputs("small", torch.bfloat16, seed=0)
    fn(*xs)                                    # forward; backward is the hand-written one
    case.reference(*xs)                        # the same math in composite torch ops, differentiated by torch
    case.f_reference                           # the same through a torch.nn.functional op, or None

    case.inputs(size, dtype, seed): size "small" (a few hundred elements per checked tensor) or "large" (tens of
    thousands to a few hundred thousand); for the ops on rows of a matrix (beta_normalize, temperature_softmax,
    bce_pos_weight) also "NxD". Checked tensors are drawn in float64 from torch.Generator().manual_seed(seed),
    rounded to dtype, and require grad; fixed inputs (targets, pos_weight, cos/sin tables, slopes) do not.
    case.slips: slip name -> (kind, where); kind is a key of KINDS, where is "all" (the backward is wrong at every
    dtype, float64 included) or "low" (wrong only when the inputs are bf16 or fp16; at float32 and float64 that
    variant runs exactly the right code). case.fp16_ok says whether the op and its references run at float16 on the
    CPU with torch 1.13 (only beta_normalize and rotary_scores: torch 1.13 has no CPU float16 exp, sigmoid, matmul,
    sqrt or group norm).

The ops (x̄ is the gradient of x; ȳ the incoming gradient; rows are the last axis unless said otherwise):

    group_norm            x (N, C, L), w, b (C); 4 groups of C/4 channels; x̂ = (x − μ)·r per (sample, group),
                          r = 1/√(σ² + eps), y = x̂·w + b.  x̄ = r·(g − mean(g) − x̂·mean(g·x̂)) over the group,
                          g = ȳ·w; w̄ = Σ ȳ·x̂, b̄ = Σ ȳ over samples and positions.
    beta_normalize        x (N, D); y = x / (1 + ‖x‖).  x̄ = s·ȳ − x·(x·ȳ)·s²/‖x‖ with s = 1/(1 + ‖x‖).
    temperature_softmax   x (N, D), τ (1,); y = softmax(x/τ).  z̄ = y·(ȳ − Σ ȳ·y), x̄ = z̄/τ, τ̄ = −Σ z̄·x/τ².
    rotary_scores         q, k (B, T, d), cos, sin (T, d/2) fixed; S = R(q)·R(k)ᵀ/√d with the half-split rotation
                          R(u) = [u₁c − u₂s, u₂c + u₁s].  q̄ = Rᵀ(S̄·R(k))/√d, k̄ = Rᵀ(S̄ᵀ·R(q))/√d, where
                          Rᵀ(a) = [a₁c + a₂s, a₂c − a₁s].
    gated_scan            g, x (B, T, D); a = σ(g), h_t = a_t·h_{t−1} + (1 − a_t)·x_t, h_{−1} = 0, y = h.
                          δ_t = ȳ_t + a_{t+1}·δ_{t+1}; x̄_t = (1 − a_t)·δ_t; ḡ_t = δ_t·(h_{t−1} − x_t)·a_t·(1 − a_t).
    linear_mish           x (N, K), w (K, K), b (K); h = x·w + b, y = mish(h) = h·tanh(softplus(h)).
                          h̄ = ȳ·(t + h·σ(h)·(1 − t²)) with t = tanh(softplus(h)); x̄ = h̄·wᵀ, w̄ = xᵀ·h̄, b̄ = Σ h̄.
    bce_pos_weight        z (N, C), targets t (N, C) in {0, 1} and pos_weight p (C) fixed;
                          L = mean(−p·t·log σ(z) − (1 − t)·log σ(−z)), a scalar.
                          z̄ = L̄/(N·C)·((1 − t)·σ(z) − p·t·σ(−z)).
    alibi_attention       q, k, v (B, H, T, d), slopes m (H) fixed; S = q·kᵀ/√d − m_h·(i − j), causal (j ≤ i),
                          P = softmax(S), O = P·v.  V̄ = Pᵀ·Ō, P̄ = Ō·vᵀ, S̄ = P·(P̄ − Σ_j P·P̄),
                          q̄ = S̄·k/√d, k̄ = S̄ᵀ·q/√d.

Expected of a checker (frozen before any checker ran on this set)

    Right versions pass: at every dtype (bf16, fp16 where fp16_ok, float32, float64), at every seed, at both sizes,
    and whether the comparison is with case.reference or with case.f_reference. At bf16 and fp16 a right version errs
    less than the composite reference does (it computes in float32 where the reference rounds every intermediate to
    16 bits); at float32 it errs about as much (within a factor of two either way).

    Material slips fail. A slip is material at a dtype when its gradient errs, against the float64 truth on the same
    rounded inputs, by at least twice what the composite reference itself errs at that dtype; a slip below that bar
    may pass or fail. An "all" slip must fail at float64 and at float32, where every one of them is wrong by orders
    of magnitude more than rounding, and at bf16 where it is material. A "low" slip must pass at float32 and float64
    (there it is the right version) and fail at bf16 (and fp16) where material.

    For each "all" slip the checker is expected to name the annotated kind:

        group_norm           mean_term_dropped: per_row_term; projection_scale: scale; channel_axis: wrong_axis
        beta_normalize       projection_sign: sign; projection_dropped: per_row_term; norm_derivative: wrong_value
        temperature_softmax  tau_sign: sign; row_term_dropped: per_row_term; tau_first_block: one_batch_element
        rotary_scores        rotation_sign: sign; missing_scale: scale; dk_transposed: transposed
        gated_scan           adjoint_shift: transposed; gate_chain_dropped: dropped_term; difference_sign: sign
        linear_mish          w_not_transposed: transposed; product_term_dropped: dropped_term;
                             derivative_at_output: wrong_value
        bce_pos_weight       target_term_sign: sign; pos_weight_dropped: scale; negative_sigmoid_flipped: wrong_value
        alibi_attention      missing_scale: scale; row_term_dropped: per_row_term; dv_transposed: transposed

    For a "low" slip the annotated kind is recorded as well, but what is expected is only that the failure is placed
    on the 16-bit path. The precision_defect ones keep a long sum (a parameter gradient over rows, a sum of squares,
    a softmax denominator, a contraction over queries) or a prefix sum at the 16-bit dtype; the others are 16-bit-only
    shortcuts: a tail of rows or columns dropped, the carry between chunks lost, a rational tanh, an exp2 rewrite that
    misses a factor, a mean over a padded grid.

    Where the bar falls, as measured while writing the set (relative L2 error of each gradient against the float64
    truth, seeds 0 and 1, at bf16 unless said): projection_scale (an "all" slip, 1/(M − 1) for 1/M with M = 32 or
    1024) is below it at bf16 at both sizes; bce_pos_weight's sigmoid_low and alibi_attention's row_sum_low are
    below it at both sizes; linear_mish's param_sums_low, temperature_softmax's row_sum_low, gated_scan's
    log_gate_cumsum_low and rotary_scores' dk_sum_low are material only at the large size; beta_normalize's
    sumsq_low only at the large size at bf16 and at neither size at fp16, and its tail_columns_low only at the small
    size (4 of 100 columns, against 8 of 1000); temperature_softmax's tau_first_block is about at the bar at bf16 at
    the small size. The tail slips do nothing where the count divides evenly: tail_block_dropped when N·L is a
    multiple of 24, tail_columns_low when D is a multiple of 16, padded_mean_low when C is a multiple of 16.

Run this file to verify the set itself (gradcheck of every right version and every "all" slip in float64, the
references against the right versions in float64, the "low" slips against the right versions at bf16 and float64,
and every op and reference at bf16, float32 and, where fp16_ok, float16, at both sizes):

    /usr/bin/python3 python/tests/precision_heldout3.py
"""

import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from precision_heldout import (  # noqa: E402
    KINDS, LOW, Case, _check_variant, _column_sums, _compute_dtype, _draw, _is_low, _named, _rows,
)


# ---------------------------------------------------------------------------------------------------------------
# Helpers of this set.

def _kept(t, dtype):
    """t stored at dtype and read back at its own dtype (a value a kernel keeps at a narrower dtype)."""
    return t.to(dtype).to(t.dtype)


def _sum_kept(t, dim, dtype):
    """The sum of t along dim, one term after the other, with the running sum stored at dtype after every step (a
    loop whose accumulator has dtype). Returns t's dtype."""
    acc = torch.zeros_like(t.select(dim, 0))
    for i in range(t.shape[dim]):
        acc = _kept(acc + t.select(dim, i), dtype)
    return acc


def _shape(size, small, large):
    """The shape of an op's inputs at size "small" or "large" (the ops that are not rows of a matrix)."""
    if size not in ("small", "large"):
        raise ValueError(f"size {size!r}: expected small or large")
    return small if size == "small" else large


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def _sigmoid(t):
    """σ(t), written as a kernel writes it: exp of a non-positive argument only."""
    e = torch.exp(-t.abs())
    return torch.where(t >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def _softplus(t):
    """log(1 + exp(t)) without overflow: max(t, 0) + log1p(exp(−|t|))."""
    return torch.clamp(t, min=0) + torch.log1p(torch.exp(-t.abs()))


# ---------------------------------------------------------------------------------------------------------------
# 1. Group norm: x (N, C, L) normalized over each (sample, group of C/G channels), then a per-channel affine map.
#    x̄ = r·(g − mean(g) − x̂·mean(g·x̂)) over the group's M = (C/G)·L elements, with g = ȳ·w;
#    w̄ = Σ_{n,l} ȳ·x̂ and b̄ = Σ_{n,l} ȳ, summed over the N·L positions in blocks of GN_BLOCK rows.

GN_GROUPS = 4
GN_EPS = 1e-5
GN_BLOCK = 24  # positions (rows of the (N·L, C) layout) per program in the w̄, b̄ pass
GN_SLIPS = {
    "mean_term_dropped": ("per_row_term", "all"),   # x̄ = r·(g − x̂·mean(g·x̂)): the mean(g) term missing
    "projection_scale": ("scale", "all"),           # mean(g·x̂) divided by M − 1 instead of M
    "channel_axis": ("wrong_axis", "all"),          # both means taken over each channel's L positions, not the group
    "param_sums_low": ("precision_defect", "low"),  # w̄, b̄: one loop over all rows, a 16-bit accumulator
    "tail_block_dropped": ("dropped_term", "low"),  # 16-bit grid of rows // GN_BLOCK programs: the tail rows lost
}


def make_group_norm(variant="right"):
    _check_variant(variant, GN_SLIPS)

    class GroupNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            cd = _compute_dtype(x)
            n, c, length = x.shape
            xg = x.to(cd).reshape(n, GN_GROUPS, -1)
            mean = xg.mean(-1)
            var = ((xg - mean[..., None]) ** 2).mean(-1)
            rstd = torch.rsqrt(var + GN_EPS)
            xhat = ((xg - mean[..., None]) * rstd[..., None]).reshape(n, c, length)
            y = xhat * w.to(cd)[:, None] + b.to(cd)[:, None]
            ctx.save_for_backward(x, w, mean, rstd)
            return y.to(x.dtype)

        @staticmethod
        def backward(ctx, dy):
            x, w, mean, rstd = ctx.saved_tensors
            cd = _compute_dtype(x)
            low = _is_low(x)
            n, c, length = x.shape
            dy = dy.to(cd)
            xhat = ((x.to(cd).reshape(n, GN_GROUPS, -1) - mean[..., None]) * rstd[..., None]).reshape(n, c, length)
            g = dy * w.to(cd)[:, None]
            if variant == "channel_axis":
                m1 = g.mean(-1, keepdim=True)
                m2 = (g * xhat).mean(-1, keepdim=True)
                dx = (g - m1 - xhat * m2).reshape(n, GN_GROUPS, -1) * rstd[..., None]
            else:
                gg, hh = g.reshape(n, GN_GROUPS, -1), xhat.reshape(n, GN_GROUPS, -1)
                m = gg.shape[-1]
                m1 = gg.mean(-1, keepdim=True)
                m2 = (gg * hh).sum(-1, keepdim=True) / (m - 1 if variant == "projection_scale" else m)
                if variant == "mean_term_dropped":
                    m1 = torch.zeros_like(m1)
                dx = (gg - m1 - hh * m2) * rstd[..., None]
            # w̄, b̄: the (N·L, C) layout, per-program partials of GN_BLOCK rows, added up
            rows_w = (dy * xhat).permute(0, 2, 1).reshape(n * length, c)
            rows_b = dy.permute(0, 2, 1).reshape(n * length, c)
            if low and variant == "tail_block_dropped":
                kept = (n * length // GN_BLOCK) * GN_BLOCK
                rows_w, rows_b = rows_w[:kept], rows_b[:kept]
            if low and variant == "param_sums_low":
                dw = _column_sums(rows_w, rows_w.shape[0], x.dtype, cd)
                db = _column_sums(rows_b, rows_b.shape[0], x.dtype, cd)
            else:
                dw = _column_sums(rows_w, GN_BLOCK, cd, cd)
                db = _column_sums(rows_b, GN_BLOCK, cd, cd)
            return dx.reshape(n, c, length).to(x.dtype), dw.to(w.dtype), db.to(w.dtype)

    return _named(GroupNorm, "group_norm", variant)


def group_norm_reference(x, w, b):
    n, c, length = x.shape
    xg = x.reshape(n, GN_GROUPS, -1)
    mean = xg.mean(-1, keepdim=True)
    var = ((xg - mean) ** 2).mean(-1, keepdim=True)
    xhat = ((xg - mean) / torch.sqrt(var + GN_EPS)).reshape(n, c, length)
    return xhat * w[:, None] + b[:, None]


def group_norm_f_reference(x, w, b):
    return F.group_norm(x, GN_GROUPS, w, b, GN_EPS)


def group_norm_inputs(size, dtype, seed):
    n, c, length = _shape(size, (4, 8, 16), (32, 64, 64))
    gen = _generator(seed)
    x = _draw(gen, (n, c, length), dtype, scale=1.5, shift=0.5)
    w = _draw(gen, (c,), dtype, scale=0.3, shift=1.0)
    b = _draw(gen, (c,), dtype, scale=0.3)
    return x, w, b


# ---------------------------------------------------------------------------------------------------------------
# 2. Beta normalize: y = x / (1 + ‖x‖) per row of x (N, D).
#    With n = ‖x‖ and s = 1/(1 + n): ∂y_i/∂x_j = s·δ_ij − x_i·x_j·s²/n, so x̄ = s·ȳ − x·(x·ȳ)·s²/n.

BN_LANES = 16  # columns per vector load of the 16-bit fast path
BN_SLIPS = {
    "projection_sign": ("sign", "all"),             # x̄ = s·ȳ + x·(x·ȳ)·s²/n
    "projection_dropped": ("per_row_term", "all"),  # x̄ = s·ȳ: the norm treated as a constant
    "norm_derivative": ("wrong_value", "all"),      # d(1/(1 + n))/dn taken as −1/(1 + n), not −1/(1 + n)²
    "sumsq_low": ("precision_defect", "low"),       # backward recomputes ‖x‖² with a 16-bit running sum over columns
    "tail_columns_low": ("per_row_term", "low"),    # the row dot x·ȳ misses the last D mod BN_LANES columns
}


def make_beta_normalize(variant="right"):
    _check_variant(variant, BN_SLIPS)

    class BetaNormalize(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            cd = _compute_dtype(x)
            xc = x.to(cd)
            norm = torch.sqrt((xc * xc).sum(-1))
            ctx.save_for_backward(x, norm)
            return (xc / (1.0 + norm[:, None])).to(x.dtype)

        @staticmethod
        def backward(ctx, dy):
            x, norm = ctx.saved_tensors
            cd = _compute_dtype(x)
            low = _is_low(x)
            xc, dy = x.to(cd), dy.to(cd)
            if low and variant == "sumsq_low":
                norm = torch.sqrt(_sum_kept(xc * xc, 1, x.dtype))
            s = 1.0 / (1.0 + norm)
            terms = xc * dy
            if low and variant == "tail_columns_low":
                full = (x.shape[1] // BN_LANES) * BN_LANES
                terms = terms[:, :full]
            dot = terms.sum(-1)
            coef = (s if variant == "norm_derivative" else s * s) / norm
            proj = xc * (dot * coef)[:, None]
            if variant == "projection_sign":
                dx = s[:, None] * dy + proj
            elif variant == "projection_dropped":
                dx = s[:, None] * dy
            else:
                dx = s[:, None] * dy - proj
            return dx.to(x.dtype)

    return _named(BetaNormalize, "beta_normalize", variant)


def beta_normalize_reference(x):
    return x / (1 + x.norm(dim=-1, keepdim=True))


def beta_normalize_inputs(size, dtype, seed):
    n, d = _rows(size, (6, 100), (150, 1000))
    return (_draw(_generator(seed), (n, d), dtype),)


# ---------------------------------------------------------------------------------------------------------------
# 3. Softmax with a learnable temperature: y = softmax(x/τ) over each row of x (N, D), τ of shape (1,).
#    z = x/τ; z̄ = y·(ȳ − Σ_row ȳ·y); x̄ = z̄/τ; τ̄ = −Σ_all z̄·z/τ (one partial per row, row partials summed in
#    blocks of TS_BLOCK rows). The backward recomputes y from the row's lse, kept in float32.

TS_BLOCK = 4
TS_SLIPS = {
    "tau_sign": ("sign", "all"),                      # τ̄ = +Σ z̄·z/τ
    "row_term_dropped": ("per_row_term", "all"),      # z̄ = y·ȳ
    "tau_first_block": ("one_batch_element", "all"),  # τ̄ from the first program's rows only
    "row_sum_low": ("precision_defect", "low"),       # y recomputed with the row's Σ exp in a 16-bit accumulator
}


def make_temperature_softmax(variant="right"):
    _check_variant(variant, TS_SLIPS)

    class TemperatureSoftmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, tau):
            cd = _compute_dtype(x)
            z = x.to(cd) / tau.to(cd)
            zmax = z.amax(-1, keepdim=True)
            e = torch.exp(z - zmax)
            total = e.sum(-1, keepdim=True)
            lse = zmax + torch.log(total)
            ctx.save_for_backward(x, tau, lse)
            return (e / total).to(x.dtype)

        @staticmethod
        def backward(ctx, dy):
            x, tau, lse = ctx.saved_tensors
            cd = _compute_dtype(x)
            low = _is_low(x)
            t = tau.to(cd)
            z = x.to(cd) / t
            if low and variant == "row_sum_low":
                e = torch.exp(z - z.amax(-1, keepdim=True))
                y = e / _sum_kept(e, 1, x.dtype)[:, None]
            else:
                y = torch.exp(z - lse)
            dy = dy.to(cd)
            if variant == "row_term_dropped":
                dz = y * dy
            else:
                dz = y * (dy - (dy * y).sum(-1, keepdim=True))
            dx = dz / t
            terms = dz * z
            rows = terms.sum(-1)[:, None]
            if variant == "tau_first_block":
                rows = rows[:TS_BLOCK]
            dtau = -_column_sums(rows, TS_BLOCK, cd, cd) / t
            if variant == "tau_sign":
                dtau = -dtau
            return dx.to(x.dtype), dtau.to(tau.dtype)

    return _named(TemperatureSoftmax, "temperature_softmax", variant)


def temperature_softmax_reference(x, tau):
    z = x / tau
    e = torch.exp(z - z.amax(-1, keepdim=True))
    return e / e.sum(-1, keepdim=True)


def temperature_softmax_f_reference(x, tau):
    return F.softmax(x / tau, dim=-1)


def temperature_softmax_inputs(size, dtype, seed):
    n, d = _rows(size, (8, 64), (512, 256))
    gen = _generator(seed)
    x = _draw(gen, (n, d), dtype, scale=2.0)
    tau = _draw(gen, (1,), dtype, scale=0.05, shift=0.8)
    return x, tau


# ---------------------------------------------------------------------------------------------------------------
# 4. Rotary query-key scores: S = R(q)·R(k)ᵀ/√d for q, k (B, T, d), with the half-split rotation by the position's
#    angles, R(u) = [u₁·cos − u₂·sin, u₂·cos + u₁·sin] (u₁, u₂ the two halves of the last axis; cos, sin of shape
#    (T, d/2), fixed). R is linear, and its transpose (the rotation back, for exact tables) is
#    Rᵀ(a) = [a₁·cos + a₂·sin, a₂·cos − a₁·sin], so q̄ = Rᵀ(S̄·R(k))/√d and k̄ = Rᵀ(S̄ᵀ·R(q))/√d.

ROPE_BASE = 10000.0
ROPE_SLIPS = {
    "rotation_sign": ("sign", "all"),             # Rᵀ's second half taken as a₂·cos + a₁·sin
    "missing_scale": ("scale", "all"),            # q̄ without the 1/√d
    "dk_transposed": ("transposed", "all"),       # k̄ from S̄·R(q) instead of S̄ᵀ·R(q)
    "dk_sum_low": ("precision_defect", "low"),    # k̄'s sum over the T queries accumulated at the 16-bit dtype
}


def _rotate(u, cos, sin):
    h = u.shape[-1] // 2
    u1, u2 = u[..., :h], u[..., h:]
    return torch.cat([u1 * cos - u2 * sin, u2 * cos + u1 * sin], -1)


def _rotate_back(a, cos, sin, slip=False):
    h = a.shape[-1] // 2
    a1, a2 = a[..., :h], a[..., h:]
    second = a2 * cos + a1 * sin if slip else a2 * cos - a1 * sin
    return torch.cat([a1 * cos + a2 * sin, second], -1)


def make_rotary_scores(variant="right"):
    _check_variant(variant, ROPE_SLIPS)

    class RotaryScores(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, cos, sin):
            cd = _compute_dtype(q)
            c, s = cos.to(cd), sin.to(cd)
            qr, kr = _rotate(q.to(cd), c, s), _rotate(k.to(cd), c, s)
            ctx.save_for_backward(q, k, cos, sin)
            return (qr @ kr.transpose(-1, -2) / math.sqrt(q.shape[-1])).to(q.dtype)

        @staticmethod
        def backward(ctx, ds):
            q, k, cos, sin = ctx.saved_tensors
            cd = _compute_dtype(q)
            low = _is_low(q)
            scale = 1.0 / math.sqrt(q.shape[-1])
            c, s = cos.to(cd), sin.to(cd)
            qr, kr = _rotate(q.to(cd), c, s), _rotate(k.to(cd), c, s)
            ds = ds.to(cd)
            dqr = ds @ kr
            if variant != "missing_scale":
                dqr = dqr * scale
            if variant == "dk_transposed":
                dkr = ds @ qr * scale
            elif low and variant == "dk_sum_low":
                dkr = _sum_kept(ds[..., None] * qr[:, :, None, :], 1, q.dtype) * scale
            else:
                dkr = ds.transpose(-1, -2) @ qr * scale
            slip = variant == "rotation_sign"
            dq = _rotate_back(dqr, c, s, slip)
            dk = _rotate_back(dkr, c, s, slip)
            return dq.to(q.dtype), dk.to(k.dtype), None, None

    return _named(RotaryScores, "rotary_scores", variant)


def rotary_scores_reference(q, k, cos, sin):
    qr, kr = _rotate(q, cos, sin), _rotate(k, cos, sin)
    # the products summed over d by broadcasting (no matmul, so that it runs at float16 on the CPU)
    return (qr[:, :, None, :] * kr[:, None, :, :]).sum(-1) / math.sqrt(q.shape[-1])


def rotary_scores_inputs(size, dtype, seed):
    b, t, d = _shape(size, (2, 8, 16), (4, 128, 64))
    gen = _generator(seed)
    q = _draw(gen, (b, t, d), dtype)
    k = _draw(gen, (b, t, d), dtype)
    freqs = ROPE_BASE ** (-torch.arange(d // 2, dtype=torch.float64) / (d // 2))
    angles = torch.arange(t, dtype=torch.float64)[:, None] * freqs[None, :]
    return q, k, torch.cos(angles).to(dtype), torch.sin(angles).to(dtype)


# ---------------------------------------------------------------------------------------------------------------
# 5. Gated recurrent scan over T steps of g, x (B, T, D): a = σ(g), h_t = a_t·h_{t−1} + (1 − a_t)·x_t, h_{−1} = 0,
#    the output all the h_t. The backward recomputes the h_t in float32 and runs the adjoint scan backwards:
#    δ_t = ȳ_t + a_{t+1}·δ_{t+1}; x̄_t = (1 − a_t)·δ_t; ḡ_t = δ_t·(h_{t−1} − x_t)·a_t·(1 − a_t).

SCAN_CHUNK = 8  # steps per chunk of the 16-bit path's chunked adjoint scan
GSCAN_SLIPS = {
    "adjoint_shift": ("transposed", "all"),          # δ_t = ȳ_t + a_t·δ_{t+1}: transposed without the index shift
    "gate_chain_dropped": ("dropped_term", "all"),   # ḡ without σ'(g) = a·(1 − a)
    "difference_sign": ("sign", "all"),              # ḡ with (x_t − h_{t−1})
    "log_gate_cumsum_low": ("precision_defect", "low"),  # a_{t+1} = exp(C_{t+1} − C_t), C = Σ log a kept at 16 bits
    "chunk_carry_low": ("dropped_term", "low"),      # chunks of SCAN_CHUNK steps: the carry between them lost
}


def make_gated_scan(variant="right"):
    _check_variant(variant, GSCAN_SLIPS)

    class GatedScan(torch.autograd.Function):
        @staticmethod
        def forward(ctx, g, x):
            cd = _compute_dtype(x)
            a, xc = _sigmoid(g.to(cd)), x.to(cd)
            h = torch.zeros_like(xc[:, 0])
            out = torch.empty_like(xc)
            for t in range(xc.shape[1]):
                h = a[:, t] * h + (1.0 - a[:, t]) * xc[:, t]
                out[:, t] = h
            ctx.save_for_backward(g, x)
            return out.to(x.dtype)

        @staticmethod
        def backward(ctx, dy):
            g, x = ctx.saved_tensors
            cd = _compute_dtype(x)
            low = _is_low(x)
            a, xc, dy = _sigmoid(g.to(cd)), x.to(cd), dy.to(cd)
            steps = xc.shape[1]
            hprev = torch.empty_like(xc)  # h_{t−1}, recomputed
            h = torch.zeros_like(xc[:, 0])
            for t in range(steps):
                hprev[:, t] = h
                h = a[:, t] * h + (1.0 - a[:, t]) * xc[:, t]
            if low and variant == "log_gate_cumsum_low":
                # the gates as ratios of the cumulative products, from the prefix sums of log a stored at 16 bits
                cum = _kept(torch.cumsum(-_softplus(-g.to(cd)), 1), x.dtype)
                gates = torch.exp(cum[:, 1:] - cum[:, :-1])
            else:
                gates = a[:, 1:]
            delta = torch.empty_like(xc)
            carry = torch.zeros_like(xc[:, 0])
            for t in reversed(range(steps)):
                if t + 1 < steps:
                    if low and variant == "chunk_carry_low" and (t + 1) % SCAN_CHUNK == 0:
                        carry = torch.zeros_like(carry)
                    else:
                        gate = a[:, t] if variant == "adjoint_shift" else gates[:, t]
                        carry = gate * carry
                d = dy[:, t] + carry
                delta[:, t] = d
                carry = d
            dx = (1.0 - a) * delta
            diff = xc - hprev if variant == "difference_sign" else hprev - xc
            dsig = torch.ones_like(a) if variant == "gate_chain_dropped" else a * (1.0 - a)
            dg = delta * diff * dsig
            return dg.to(g.dtype), dx.to(x.dtype)

    return _named(GatedScan, "gated_scan", variant)


def gated_scan_reference(g, x):
    a = torch.sigmoid(g)
    h = torch.zeros_like(x[:, 0])
    out = []
    for t in range(x.shape[1]):
        h = a[:, t] * h + (1 - a[:, t]) * x[:, t]
        out.append(h)
    return torch.stack(out, 1)


def gated_scan_inputs(size, dtype, seed):
    b, t, d = _shape(size, (2, 16, 16), (8, 256, 64))
    gen = _generator(seed)
    g = _draw(gen, (b, t, d), dtype, shift=1.0)
    x = _draw(gen, (b, t, d), dtype)
    return g, x


# ---------------------------------------------------------------------------------------------------------------
# 6. Linear + Mish: h = x·w + b with x (N, K), a square w (K, K), b (K); y = h·tanh(softplus(h)).
#    mish'(h) = t + h·σ(h)·(1 − t²) with t = tanh(softplus(h)) (since softplus' = σ);
#    h̄ = ȳ·mish'(h); x̄ = h̄·wᵀ; w̄ = xᵀ·h̄ and b̄ = Σ_rows h̄ as per-program partials over LM_BLOCK rows.

LM_BLOCK = 8
LM_SLIPS = {
    "w_not_transposed": ("transposed", "all"),        # x̄ = h̄·w
    "product_term_dropped": ("dropped_term", "all"),  # mish' = t: the h·σ(h)·(1 − t²) term missing
    "derivative_at_output": ("wrong_value", "all"),   # mish' evaluated at y instead of h
    "param_sums_low": ("precision_defect", "low"),    # w̄, b̄: one loop over all rows, a 16-bit accumulator
    "tanh_fast_low": ("wrong_value", "low"),          # 16-bit path's mish' uses a rational tanh, u(27+u²)/(27+9u²)
}


def _mish_prime(h, fast_tanh=False):
    sp = _softplus(h)
    if fast_tanh:
        t = torch.clamp(sp * (27.0 + sp * sp) / (27.0 + 9.0 * sp * sp), max=1.0)
    else:
        t = torch.tanh(sp)
    return t + h * _sigmoid(h) * (1.0 - t * t)


def _block_matmul_sums(x, dh, rows_per_block):
    """xᵀ·dh as a kernel makes it: one (K, M) partial per program of rows_per_block rows, then the partials added
    up, all in x's dtype."""
    rows = x.shape[0]
    blocks = -(-rows // rows_per_block)
    pad = blocks * rows_per_block - rows
    xp = torch.cat([x, x.new_zeros(pad, x.shape[1])]).reshape(blocks, rows_per_block, -1)
    dp = torch.cat([dh, dh.new_zeros(pad, dh.shape[1])]).reshape(blocks, rows_per_block, -1)
    return (xp.transpose(1, 2) @ dp).sum(0)


def _outer_sums_kept(x, dh, dtype):
    """xᵀ·dh as one loop over the rows, adding x_nᵀ·dh_n into an accumulator stored at dtype after every row."""
    acc = x.new_zeros(x.shape[1], dh.shape[1])
    for n in range(x.shape[0]):
        acc = _kept(acc + x[n, :, None] * dh[n, None, :], dtype)
    return acc


def make_linear_mish(variant="right"):
    _check_variant(variant, LM_SLIPS)

    class LinearMish(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            cd = _compute_dtype(x)
            h = x.to(cd) @ w.to(cd) + b.to(cd)
            ctx.save_for_backward(x, w, b)
            return (h * torch.tanh(_softplus(h))).to(x.dtype)

        @staticmethod
        def backward(ctx, dy):
            x, w, b = ctx.saved_tensors
            cd = _compute_dtype(x)
            low = _is_low(x)
            xc, wc = x.to(cd), w.to(cd)
            h = xc @ wc + b.to(cd)
            dy = dy.to(cd)
            if variant == "product_term_dropped":
                prime = torch.tanh(_softplus(h))
            elif variant == "derivative_at_output":
                prime = _mish_prime(h * torch.tanh(_softplus(h)))
            else:
                prime = _mish_prime(h, fast_tanh=low and variant == "tanh_fast_low")
            dh = dy * prime
            dx = dh @ (wc if variant == "w_not_transposed" else wc.t())
            if low and variant == "param_sums_low":
                dw = _outer_sums_kept(xc, dh, x.dtype)
                db = _column_sums(dh, dh.shape[0], x.dtype, cd)
            else:
                dw = _block_matmul_sums(xc, dh, LM_BLOCK)
                db = _column_sums(dh, LM_BLOCK, cd, cd)
            return dx.to(x.dtype), dw.to(w.dtype), db.to(b.dtype)

    return _named(LinearMish, "linear_mish", variant)


def linear_mish_reference(x, w, b):
    h = x @ w + b
    sp = torch.clamp(h, min=0) + torch.log1p(torch.exp(-h.abs()))
    return h * torch.tanh(sp)


def linear_mish_f_reference(x, w, b):
    # F.mish has no CPU bf16 kernel in torch 1.13: F.linear and F.softplus are the fused ops here
    h = F.linear(x, w.t(), b)
    return h * torch.tanh(F.softplus(h))


def linear_mish_inputs(size, dtype, seed):
    n, k = _shape(size, (16, 32), (512, 256))
    gen = _generator(seed)
    x = _draw(gen, (n, k), dtype)
    w = _draw(gen, (k, k), dtype, scale=1.0 / math.sqrt(k))
    b = _draw(gen, (k,), dtype, scale=0.3)
    return x, w, b


# ---------------------------------------------------------------------------------------------------------------
# 7. Binary cross-entropy with logits and a positive-class weight, mean-reduced to a scalar:
#    L = mean(−p·t·log σ(z) − (1 − t)·log σ(−z)) over z (N, C), with targets t (N, C) and pos_weight p (C) fixed.
#    z̄ = L̄/(N·C)·((1 − t)·σ(z) − p·t·σ(−z)), with σ(−z) computed directly (no 1 − σ(z)).

BCE_BLOCK = 16  # columns per program of the 16-bit path's kernel
BCE_SLIPS = {
    "target_term_sign": ("sign", "all"),             # z̄ ∝ (1 − t)·σ(z) + p·t·σ(−z)
    "pos_weight_dropped": ("scale", "all"),          # z̄ ∝ (1 − t)·σ(z) − t·σ(−z)
    "negative_sigmoid_flipped": ("wrong_value", "all"),  # z̄ ∝ (1 − t)·σ(−z) − p·t·σ(−z)
    "sigmoid_low": ("precision_defect", "low"),      # σ(z) kept at the 16-bit dtype, σ(−z) taken as 1 − σ(z)
    "padded_mean_low": ("scale", "low"),             # 16-bit path divides by N·C rounded up to whole BCE_BLOCKs
}


def make_bce_pos_weight(variant="right"):
    _check_variant(variant, BCE_SLIPS)

    class BCEPosWeight(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z, target, pos_weight):
            cd = _compute_dtype(z)
            zc, t, p = z.to(cd), target.to(cd), pos_weight.to(cd)
            # −log σ(z) = softplus(−z), −log σ(−z) = softplus(z)
            loss = p * t * _softplus(-zc) + (1.0 - t) * _softplus(zc)
            ctx.save_for_backward(z, target, pos_weight)
            return loss.sum().div(z.numel()).to(z.dtype)

        @staticmethod
        def backward(ctx, dl):
            z, target, pos_weight = ctx.saved_tensors
            cd = _compute_dtype(z)
            low = _is_low(z)
            zc, t, p = z.to(cd), target.to(cd), pos_weight.to(cd)
            sig_pos = _sigmoid(zc)
            sig_neg = _sigmoid(-zc)
            if low and variant == "sigmoid_low":
                sig_pos = _kept(sig_pos, z.dtype)
                sig_neg = 1.0 - sig_pos
            if variant == "pos_weight_dropped":
                p = torch.ones_like(p)
            neg = (1.0 - t) * (sig_neg if variant == "negative_sigmoid_flipped" else sig_pos)
            pos = p * t * sig_neg
            dz = neg + pos if variant == "target_term_sign" else neg - pos
            count = z.numel()
            if low and variant == "padded_mean_low":
                count = z.shape[0] * (-(-z.shape[1] // BCE_BLOCK) * BCE_BLOCK)
            dz = dz * (dl.to(cd) / count)
            return dz.to(z.dtype), None, None

    return _named(BCEPosWeight, "bce_pos_weight", variant)


def bce_pos_weight_reference(z, target, pos_weight):
    def log_sigmoid(u):
        return -(torch.clamp(-u, min=0) + torch.log1p(torch.exp(-u.abs())))
    return (-pos_weight * target * log_sigmoid(z) - (1 - target) * log_sigmoid(-z)).mean()


def bce_pos_weight_f_reference(z, target, pos_weight):
    return F.binary_cross_entropy_with_logits(z, target, pos_weight=pos_weight)


def bce_pos_weight_inputs(size, dtype, seed):
    n, c = _rows(size, (32, 20), (1024, 120))
    gen = _generator(seed)
    z = _draw(gen, (n, c), dtype, scale=2.5)
    target = (torch.rand(n, c, dtype=torch.float64, generator=gen) < 0.3).to(dtype)
    pos_weight = (1.0 + 3.0 * torch.rand(c, dtype=torch.float64, generator=gen)).to(dtype)
    return z, target, pos_weight


# ---------------------------------------------------------------------------------------------------------------
# 8. Causal attention with ALiBi slopes: q, k, v (B, H, T, d), slopes m (H) fixed;
#    S = q·kᵀ/√d − m_h·(i − j) for keys j ≤ i (the others masked out), P = softmax(S), O = P·v.
#    The forward keeps lse per query row in float32; the backward recomputes P = exp(S − lse) and takes
#    V̄ = Pᵀ·Ō, P̄ = Ō·vᵀ, S̄ = P·(P̄ − Σ_j P·P̄), q̄ = S̄·k/√d, k̄ = S̄ᵀ·q/√d.

ALIBI_SLIPS = {
    "missing_scale": ("scale", "all"),            # q̄ = S̄·k without the 1/√d
    "row_term_dropped": ("per_row_term", "all"),  # S̄ = P·P̄
    "dv_transposed": ("transposed", "all"),       # V̄ = P·Ō
    "row_sum_low": ("precision_defect", "low"),   # P recomputed with the row's Σ exp in a 16-bit accumulator
    "exp2_bias_low": ("wrong_value", "low"),      # 16-bit path's exp2 recompute: the bias not scaled by log2(e)
}


def _alibi_scores(q, k, slopes):
    t = q.shape[-2]
    pos = torch.arange(t, device=q.device)
    dist = (pos[:, None] - pos[None, :]).to(q.dtype)
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) - slopes[:, None, None] * dist
    return s.masked_fill(pos[None, :] > pos[:, None], float("-inf"))


def make_alibi_attention(variant="right"):
    _check_variant(variant, ALIBI_SLIPS)

    class AlibiAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, slopes):
            cd = _compute_dtype(q)
            s = _alibi_scores(q.to(cd), k.to(cd), slopes.to(cd))
            smax = s.amax(-1, keepdim=True)
            e = torch.exp(s - smax)
            total = e.sum(-1, keepdim=True)
            lse = smax + torch.log(total)
            ctx.save_for_backward(q, k, v, slopes, lse)
            return ((e / total) @ v.to(cd)).to(q.dtype)

        @staticmethod
        def backward(ctx, do):
            q, k, v, slopes, lse = ctx.saved_tensors
            cd = _compute_dtype(q)
            low = _is_low(q)
            scale = 1.0 / math.sqrt(q.shape[-1])
            qc, kc, vc, do = q.to(cd), k.to(cd), v.to(cd), do.to(cd)
            if low and variant == "row_sum_low":
                s = _alibi_scores(qc, kc, slopes.to(cd))
                e = torch.exp(s - s.amax(-1, keepdim=True))
                p = e / _sum_kept(e, 3, q.dtype)[..., None]
            elif low and variant == "exp2_bias_low":
                # exp2((q·kᵀ/√d)·log2(e) − m·(i − j) − lse·log2(e)): the bias enters divided by log2(e)
                p = torch.exp(_alibi_scores(qc, kc, slopes.to(cd) * math.log(2.0)) - lse)
            else:
                p = torch.exp(_alibi_scores(qc, kc, slopes.to(cd)) - lse)
            if variant == "dv_transposed":
                dv = p @ do
            else:
                dv = p.transpose(-1, -2) @ do
            dp = do @ vc.transpose(-1, -2)
            if variant == "row_term_dropped":
                ds = p * dp
            else:
                ds = p * (dp - (p * dp).sum(-1, keepdim=True))
            dq = ds @ kc
            if variant != "missing_scale":
                dq = dq * scale
            dk = ds.transpose(-1, -2) @ qc * scale
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None

    return _named(AlibiAttention, "alibi_attention", variant)


def alibi_attention_reference(q, k, v, slopes):
    s = _alibi_scores(q, k, slopes)
    e = torch.exp(s - s.amax(-1, keepdim=True))
    return (e / e.sum(-1, keepdim=True)) @ v


def alibi_attention_inputs(size, dtype, seed):
    b, h, t, d = _shape(size, (1, 2, 8, 16), (1, 4, 128, 32))
    gen = _generator(seed)
    q = _draw(gen, (b, h, t, d), dtype, scale=0.6)
    k = _draw(gen, (b, h, t, d), dtype, scale=0.6)
    v = _draw(gen, (b, h, t, d), dtype)
    slopes = (2.0 ** (-8.0 * torch.arange(1, h + 1, dtype=torch.float64) / h)).to(dtype)
    return q, k, v, slopes


# ---------------------------------------------------------------------------------------------------------------

CASES = [
    Case("group_norm", make_group_norm, group_norm_reference, group_norm_f_reference, group_norm_inputs, GN_SLIPS),
    Case("beta_normalize", make_beta_normalize, beta_normalize_reference, None, beta_normalize_inputs, BN_SLIPS,
         fp16_ok=True),
    Case("temperature_softmax", make_temperature_softmax, temperature_softmax_reference,
         temperature_softmax_f_reference, temperature_softmax_inputs, TS_SLIPS),
    Case("rotary_scores", make_rotary_scores, rotary_scores_reference, None, rotary_scores_inputs, ROPE_SLIPS,
         fp16_ok=True),
    Case("gated_scan", make_gated_scan, gated_scan_reference, None, gated_scan_inputs, GSCAN_SLIPS),
    Case("linear_mish", make_linear_mish, linear_mish_reference, linear_mish_f_reference, linear_mish_inputs,
         LM_SLIPS),
    Case("bce_pos_weight", make_bce_pos_weight, bce_pos_weight_reference, bce_pos_weight_f_reference,
         bce_pos_weight_inputs, BCE_SLIPS),
    Case("alibi_attention", make_alibi_attention, alibi_attention_reference, None, alibi_attention_inputs,
         ALIBI_SLIPS),
]

for _case in CASES:
    assert all(kind in KINDS and where in ("low", "all") for kind, where in _case.slips.values()), _case.name


# ---------------------------------------------------------------------------------------------------------------
# Self-check of the set.

def _grads(fn, xs, cotangent):
    leaves = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
    return torch.autograd.grad(fn(*xs), leaves, cotangent)


def _cotangent(out, seed=1):
    return torch.randn(out.shape, dtype=torch.float64, generator=_generator(seed)).to(out.dtype)


def _max_diff(a, b):
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b))


def _finite(ts):
    return all(bool(torch.isfinite(t).all()) for t in ts)


def _verify(cases=None):
    """The checks the module docstring lists; prints a summary line per op and returns the number of problems."""
    problems = 0
    for case in CASES if cases is None else cases:
        notes = []
        # the right version in float64: gradcheck, and both references' forward and VJP
        xs = case.inputs("small", torch.float64, 0)
        ok = torch.autograd.gradcheck(case.make("right"), xs, eps=1e-6, atol=1e-6, rtol=1e-5, raise_exception=False)
        if not ok:
            problems += 1
            notes.append("right fails gradcheck")
        for size in ("small", "large"):
            xs = case.inputs(size, torch.float64, 0)
            out = case.make("right")(*xs)
            cot = _cotangent(out)
            right = _grads(case.make("right"), xs, cot)
            for ref in (case.reference, case.f_reference):
                if ref is None:
                    continue
                err_y = (ref(*xs) - out).abs().max().item()
                err_g = _max_diff(_grads(ref, xs, cot), right)
                if err_y > 1e-10 or err_g > 1e-10:
                    problems += 1
                    notes.append(f"{ref.__name__} {size}: forward {err_y:.1e}, VJP {err_g:.1e}")
        # the slips: "all" ones fail gradcheck in float64 and differ at every dtype; "low" ones differ at 16 bits
        low_dtypes = (torch.bfloat16, torch.float16) if case.fp16_ok else (torch.bfloat16,)
        smallest = {}
        for slip, (kind, where) in case.slips.items():
            if where == "all":
                xs = case.inputs("small", torch.float64, 0)
                if torch.autograd.gradcheck(case.make(slip), xs, eps=1e-6, atol=1e-6, rtol=1e-5,
                                            raise_exception=False):
                    problems += 1
                    notes.append(f"{slip} passes gradcheck")
            for dtype in low_dtypes + (torch.float32, torch.float64):
                xs = case.inputs("small", dtype, 0)
                cot = _cotangent(case.make("right")(*xs))
                right = _grads(case.make("right"), xs, cot)
                diff = _max_diff(_grads(case.make(slip), xs, cot), right)
                if where == "all" or dtype in LOW:
                    scale = max(g.double().abs().max().item() for g in right)
                    smallest[slip] = min(smallest.get(slip, math.inf), diff / scale)
                    if diff == 0:
                        problems += 1
                        notes.append(f"{slip} equals right at {str(dtype)[6:]}")
                elif diff != 0:
                    problems += 1
                    notes.append(f"{slip} differs from right at {str(dtype)[6:]} by {diff:.1e}")
        # every op and reference at the working dtypes and both sizes: finite outputs and gradients
        dtypes = (torch.bfloat16, torch.float32) + ((torch.float16,) if case.fp16_ok else ())
        for dtype in dtypes:
            for size in ("small", "large"):
                for fn in (case.make("right"), case.reference, case.f_reference):
                    if fn is None:
                        continue
                    xs = case.inputs(size, dtype, 0)
                    try:
                        out = fn(*xs)
                        grads = _grads(fn, xs, _cotangent(out))
                        good = out.dtype == dtype and _finite((out,) + tuple(grads))
                    except RuntimeError as e:
                        good = False
                        notes.append(f"{getattr(fn, '__name__', fn)} at {dtype}: {str(e)[:60]}")
                    if not good:
                        problems += 1
                        notes.append(f"{getattr(fn, '__name__', 'right')} {size} at {str(dtype)[6:]} not finite")
        least = min(smallest.values())
        print(f"{case.name:20s} gradcheck(right, float64): {ok};  {len(case.slips)} slips "
              f"({sum(w == 'all' for _, w in case.slips.values())} all), smallest relative difference from right "
              f"where a slip lives: {least:.1e};  runs at {', '.join(str(d)[6:] for d in dtypes)}"
              + ("".join("\n    PROBLEM: " + n for n in notes)))
    print("problems:", problems)
    return problems


if __name__ == "__main__":
    raise SystemExit(1 if _verify() else 0)
