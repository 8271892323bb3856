"""Low-precision fused kernels with hand-written backwards, and slips in them: a held-out set for checks at bf16,
fp16 and float32 against a float64 reference.

Each op is a torch.autograd.Function written the way a fused kernel (Triton, CUDA) is: it reads its inputs at their
own dtype (bf16, fp16 or float32), computes in float32 inside (float64 when given float64, so that the op can also
be checked in float64), keeps row statistics (rstd, lse) in float32, sums parameter gradients as per-block partial
sums in float32, and stores its outputs and gradients at the input's dtype.

    from precision_heldout import CASES
    case = CASES[0]
    fn = case.make("right")                    # or a slip's name: case.slips
    xs = case.inputs("small", torch.bfloat16, seed=0)
    fn(*xs)                                    # the op; its backward is the hand-written one
    case.reference(*xs)                        # the same math in composite torch ops (torch's derivatives)
    case.f_reference                           # the same with torch.nn.functional's fused op, or None

Case fields:
    name         the op's name
    make         make(variant) -> the Function's .apply; variant "right" or a slip's name
    reference    composite torch ops in the forward's own math; runs at any dtype torch supports on the CPU
    f_reference  the same with torch's fused op (F.layer_norm, F.cross_entropy, ...) where one exists, else None
    inputs       inputs(size, dtype, seed) -> tuple: size "small" (a few hundred to a few thousand elements) or
                 "large" (and, for the ops on rows of a matrix, "NxD": N rows of D, as "4096x256"); checked tensors
                 are drawn in float64 from torch.Generator().manual_seed(seed), rounded to dtype and require grad;
                 fixed inputs (integer targets) do not require grad
    slips        slip name -> (kind, where): the kind a careful reader would name it (KINDS), and "low" when the
                 slip exists only on the 16-bit path (bf16/fp16; at float32 and float64 the op is right) or "all"
    fp16_ok      whether the op and both references run at float16 on the CPU (torch 1.13 lacks CPU float16 matmul,
                 exp, sqrt, softmax, sigmoid, ...)

Run this file to verify the set itself: every right version against torch.autograd.gradcheck in float64, and every
slip differing from the right version at the dtype where it lives.

    /usr/bin/python3 python/tests/precision_heldout.py
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

KINDS = {
    "sign": "a sign, of the whole gradient or of one term",
    "scale": "a wrong constant factor (of the whole gradient, or of one term of it)",
    "per_row_term": "a term that depends on a row reduction (a mean, a projection onto the row) dropped or wrong",
    "transposed": "a matrix (or the recurrence's operator) used where its transpose belongs",
    "dropped_term": "a term of the chain or product rule dropped",
    "wrong_axis": "a reduction, softmax or broadcast along the wrong axis",
    "one_batch_element": "a sum over the batch (rows, batch elements, row blocks) that keeps only one of them",
    "wrong_value": "an elementwise derivative or a saved statistic evaluated at the wrong value",
    "precision_defect": "the right formula, with a value kept or a long sum accumulated at the 16-bit dtype",
}

LOW = (torch.bfloat16, torch.float16)


@dataclass
class Case:
    name: str
    make: callable
    reference: callable
    f_reference: callable
    inputs: callable
    slips: dict
    fp16_ok: bool = False


def _compute_dtype(t):
    """The dtype a fused kernel computes in: float32 for 16-bit and float32 inputs, float64 for float64 inputs."""
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def _is_low(t):
    return t.dtype in LOW


def _check_variant(variant, slips):
    if variant != "right" and variant not in slips:
        raise ValueError(f"no variant {variant!r}; the variants: right, {', '.join(slips)}")


def _rows(size, small, large):
    """(rows, columns) of a row-wise op's input at size: "small", "large", or "NxD" (N rows of D)."""
    if size in ("small", "large"):
        return small if size == "small" else large
    n, _, d = size.partition("x")
    if not (n.isdigit() and d.isdigit()):
        raise ValueError(f"size {size!r}: expected small, large or NxD (as 4096x256)")
    return int(n), int(d)


def _draw(gen, shape, dtype, scale=1.0, shift=0.0, grad=True):
    """A tensor drawn in float64 from gen, then rounded to dtype (a leaf that requires grad when grad)."""
    t = (torch.randn(*shape, dtype=torch.float64, generator=gen) * scale + shift).to(dtype)
    return t.requires_grad_(grad)


def _column_sums(t, rows_per_block, acc_dtype, out_dtype):
    """Column sums of a (rows, cols) tensor as a Triton backward makes them: each program sums its block of
    rows_per_block rows into an accumulator of acc_dtype, stores the partial, and the partials are added up
    (in acc_dtype), then stored at out_dtype. Rows past the end are masked (zeros)."""
    rows, cols = t.shape
    blocks = -(-rows // rows_per_block)
    padded = torch.zeros(blocks * rows_per_block, cols, dtype=acc_dtype, device=t.device)
    padded[:rows] = t.to(acc_dtype)
    padded = padded.view(blocks, rows_per_block, cols)
    acc = torch.zeros(blocks, cols, dtype=acc_dtype, device=t.device)
    for r in range(rows_per_block):  # the program's loop over its rows, all programs side by side
        acc = acc + padded[:, r, :]
    total = torch.zeros(cols, dtype=acc_dtype, device=t.device)
    for p in range(blocks):
        total = total + acc[p]
    return total.to(out_dtype)


def _block_partials(t, rows_per_block, acc_dtype):
    """The per-program partial column sums (blocks, cols), before they are added up."""
    rows, cols = t.shape
    blocks = -(-rows // rows_per_block)
    padded = torch.zeros(blocks * rows_per_block, cols, dtype=acc_dtype, device=t.device)
    padded[:rows] = t.to(acc_dtype)
    return padded.view(blocks, rows_per_block, cols).sum(1)


def _named(cls, base, variant):
    cls.__name__ = base if variant == "right" else f"{base}[{variant}]"
    return cls.apply


# ---------------------------------------------------------------------------------------------------------------
# 1. RMSNorm with weight: y = x · rsqrt(mean(x²) + eps) · w, over the last axis; rows (N, D), w (D).
#    x̄ = r·(g − x̂·mean(g·x̂)) with g = ȳ·w, x̂ = x·r;  w̄ = Σ_rows ȳ·x̂ (per-block partials).

RMS_EPS = 1e-5
RMS_BLOCK = 128  # rows per program in the w̄ pass
RMS_SLIPS = {
    "no_projection": ("per_row_term", "all"),        # x̄ without −x̂·mean(g·x̂)
    "projection_mean_n_minus_1": ("per_row_term", "all"),  # mean(g·x̂) as a sum over n−1 (small)
    "w_grad_from_x": ("wrong_value", "all"),          # w̄ = Σ ȳ·x, x where x̂ belongs
    "eps_outside_rsqrt": ("wrong_value", "all"),      # backward recomputes r = 1/(√ms + eps) (small)
    "w_partials_low": ("precision_defect", "low"),    # w̄'s partial sums kept at bf16/fp16
}


def make_rms_norm(variant="right"):
    _check_variant(variant, RMS_SLIPS)

    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            c = _compute_dtype(x)
            xf = x.to(c)
            r = torch.rsqrt((xf * xf).mean(-1, keepdim=True) + RMS_EPS)
            ctx.save_for_backward(x, w, r)
            return (xf * r * w.to(c)).to(x.dtype)

        @staticmethod
        def backward(ctx, gy):
            x, w, r = ctx.saved_tensors
            c = r.dtype
            xf, g_out = x.to(c), gy.to(c)
            if variant == "eps_outside_rsqrt":
                r = 1.0 / (torch.sqrt((xf * xf).mean(-1, keepdim=True)) + RMS_EPS)
            xhat = xf * r
            g = g_out * w.to(c)
            n = x.shape[-1]
            if variant == "no_projection":
                gx = r * g
            elif variant == "projection_mean_n_minus_1":
                gx = r * (g - xhat * (g * xhat).sum(-1, keepdim=True) / (n - 1))
            else:
                gx = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
            rows = g_out * (xf if variant == "w_grad_from_x" else xhat)
            acc = x.dtype if variant == "w_partials_low" and _is_low(x) else c
            gw = _column_sums(rows.reshape(-1, n), RMS_BLOCK, acc, w.dtype)
            return gx.to(x.dtype), gw

    return _named(RMSNorm, "rms_norm", variant)


def rms_norm_reference(x, w):
    return x * ((x * x).mean(-1, keepdim=True) + RMS_EPS).pow(-0.5) * w


def rms_norm_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d = _rows(size, (16, 32), (512, 128))
    return _draw(gen, (n, d), dtype, 1.5, 0.2), _draw(gen, (d,), dtype, 0.2, 1.0)


# ---------------------------------------------------------------------------------------------------------------
# 2. LayerNorm with weight and bias: y = x̂·w + b, x̂ = (x − μ)·rstd, rstd = 1/√(var + eps) (biased var).
#    x̄ = rstd·(g − mean(g) − x̂·mean(g·x̂)), g = ȳ·w;  w̄ = Σ ȳ·x̂, b̄ = Σ ȳ as per-block partials added up.

LN_EPS = 1e-5
LN_BLOCK = 16  # rows per program: each stores a partial of w̄ and b̄
LN_SLIPS = {
    "no_mean_grad": ("per_row_term", "all"),          # x̄ without −mean(g)
    "rstd_unbiased": ("wrong_value", "all"),          # backward recomputes var with x.var() (unbiased, n−1) (small)
    "b_grad_last_partial": ("one_batch_element", "all"),  # every program stores b̄ to one slot: the last block wins
    "projection_sign": ("sign", "all"),               # + x̂·mean(g·x̂)
    "partials_low": ("precision_defect", "low"),      # w̄, b̄ partials and their sum kept at bf16/fp16
}


def make_layer_norm(variant="right"):
    _check_variant(variant, LN_SLIPS)

    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            c = _compute_dtype(x)
            xf = x.to(c)
            mu = xf.mean(-1, keepdim=True)
            var = ((xf - mu) ** 2).mean(-1, keepdim=True)
            rstd = torch.rsqrt(var + LN_EPS)
            ctx.save_for_backward(x, w, b, mu, rstd)
            return ((xf - mu) * rstd * w.to(c) + b.to(c)).to(x.dtype)

        @staticmethod
        def backward(ctx, gy):
            x, w, b, mu, rstd = ctx.saved_tensors
            c = rstd.dtype
            xf, g_out = x.to(c), gy.to(c)
            if variant == "rstd_unbiased":
                rstd = torch.rsqrt(xf.var(-1, keepdim=True) + LN_EPS)
            xhat = (xf - mu) * rstd
            g = g_out * w.to(c)
            proj = xhat * (g * xhat).mean(-1, keepdim=True)
            if variant == "no_mean_grad":
                gx = rstd * (g - proj)
            elif variant == "projection_sign":
                gx = rstd * (g - g.mean(-1, keepdim=True) + proj)
            else:
                gx = rstd * (g - g.mean(-1, keepdim=True) - proj)
            acc = x.dtype if variant == "partials_low" and _is_low(x) else c
            gw = _column_sums(g_out * xhat, LN_BLOCK, acc, w.dtype)
            if variant == "b_grad_last_partial":
                gb = _block_partials(g_out, LN_BLOCK, c)[-1].to(b.dtype)
            else:
                gb = _column_sums(g_out, LN_BLOCK, acc, b.dtype)
            return gx.to(x.dtype), gw, gb

    return _named(LayerNorm, "layer_norm", variant)


def layer_norm_reference(x, w, b):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) * (var + LN_EPS).pow(-0.5) * w + b


def layer_norm_f_reference(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, LN_EPS)


def layer_norm_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d = _rows(size, (48, 32), (512, 128))
    return (_draw(gen, (n, d), dtype, 1.0, 0.5), _draw(gen, (d,), dtype, 0.2, 1.0),
            _draw(gen, (d,), dtype, 0.3))


# ---------------------------------------------------------------------------------------------------------------
# 3. Softmax cross-entropy: logits (N, C), integer targets (N,) → mean over rows of lse − z[target].
#    z̄ = ȳ·(softmax(z) − onehot(t)) / N.

CE_SLIPS = {
    "no_mean": ("scale", "all"),                      # forgets the 1/N of the mean
    "sign": ("sign", "all"),                          # onehot − p
    "softmax_dim0": ("wrong_axis", "all"),            # p recomputed as softmax over the batch axis
    "mean_n_minus_1": ("scale", "all"),               # divides by N − 1 (small)
    "label_smoothing_left_on": ("wrong_value", "all"),  # backward's target is 0.98·onehot + 0.02/C (small)
}


def make_cross_entropy(variant="right"):
    _check_variant(variant, CE_SLIPS)

    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, targets):
            c = _compute_dtype(logits)
            z = logits.to(c)
            m = z.amax(-1, keepdim=True)
            lse = m + torch.log(torch.exp(z - m).sum(-1, keepdim=True))
            loss = (lse.squeeze(-1) - z.gather(-1, targets[:, None]).squeeze(-1)).mean()
            ctx.save_for_backward(logits, targets, lse)
            return loss.to(logits.dtype)

        @staticmethod
        def backward(ctx, gy):
            logits, targets, lse = ctx.saved_tensors
            c = lse.dtype
            z = logits.to(c)
            n, classes = z.shape
            p = torch.softmax(z, dim=0) if variant == "softmax_dim0" else torch.exp(z - lse)
            onehot = torch.zeros_like(p).scatter_(-1, targets[:, None], 1.0)
            if variant == "label_smoothing_left_on":
                onehot = 0.98 * onehot + 0.02 / classes
            d = onehot - p if variant == "sign" else p - onehot
            if variant == "no_mean":
                scale = 1.0
            elif variant == "mean_n_minus_1":
                scale = 1.0 / (n - 1)
            else:
                scale = 1.0 / n
            return (d * (gy.to(c) * scale)).to(logits.dtype), None

    return _named(CrossEntropy, "cross_entropy", variant)


def cross_entropy_reference(logits, targets):
    m = logits.amax(-1, keepdim=True).detach()
    lse = m.squeeze(-1) + torch.log(torch.exp(logits - m).sum(-1))
    return (lse - logits.gather(-1, targets[:, None]).squeeze(-1)).mean()


def cross_entropy_f_reference(logits, targets):
    return F.cross_entropy(logits, targets)


def cross_entropy_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n, classes = (32, 24) if size == "small" else (256, 48)  # a scalar loss: checks of (512, 128) take ~90 s
    logits = _draw(gen, (n, classes), dtype, 2.0)
    targets = torch.randint(classes, (n,), generator=gen)
    return logits, targets


# ---------------------------------------------------------------------------------------------------------------
# 4. Fused linear + GELU (tanh approximation): y = gelu(x·Wᵀ + b), W square (D, D).
#    gelu(h) = ½h(1 + tanh(k(h + a·h³))), k = √(2/π), a = 0.044715;
#    gelu'(h) = ½(1 + t) + ½h(1 − t²)·k(1 + 3a·h²);  dh = ȳ·gelu'(h): x̄ = dh·W, W̄ = dhᵀ·x, b̄ = Σ dh.

GELU_K = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715
GELU_SLIPS = {
    "gelu_prime_at_output": ("wrong_value", "all"),   # gelu'(y) where gelu'(h) belongs
    "w_grad_transposed": ("transposed", "all"),       # W̄ = xᵀ·dh
    "cubic_missing_3": ("scale", "all"),              # k(1 + a·h²): the power rule's 3 left out of one term
    "erf_prime_16bit": ("wrong_value", "low"),        # 16-bit path takes the exact (erf) GELU's derivative (small)
}


def _gelu_tanh_prime(h, cubic=3.0):
    t = torch.tanh(GELU_K * (h + GELU_A * h ** 3))
    return 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * GELU_K * (1 + cubic * GELU_A * h * h)


def make_linear_gelu(variant="right"):
    _check_variant(variant, GELU_SLIPS)

    class LinearGelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            c = _compute_dtype(x)
            h = x.to(c) @ w.to(c).t() + b.to(c)  # the GEMM accumulates in float32, the epilogue applies GELU
            y = 0.5 * h * (1 + torch.tanh(GELU_K * (h + GELU_A * h ** 3)))
            ctx.save_for_backward(x, w, b, y.to(x.dtype))
            return y.to(x.dtype)

        @staticmethod
        def backward(ctx, gy):
            x, w, b, y = ctx.saved_tensors
            c = _compute_dtype(x)
            xf, wf = x.to(c), w.to(c)
            h = xf @ wf.t() + b.to(c)  # recomputed, not stored
            if variant == "gelu_prime_at_output":
                dgelu = _gelu_tanh_prime(y.to(c))
            elif variant == "cubic_missing_3":
                dgelu = _gelu_tanh_prime(h, cubic=1.0)
            elif variant == "erf_prime_16bit" and _is_low(x):
                dgelu = 0.5 * (1 + torch.erf(h / math.sqrt(2.0))) + h * torch.exp(-0.5 * h * h) / math.sqrt(2 * math.pi)
            else:
                dgelu = _gelu_tanh_prime(h)
            dh = gy.to(c) * dgelu
            gx = dh @ wf
            gw = xf.t() @ dh if variant == "w_grad_transposed" else dh.t() @ xf
            gb = dh.sum(0)
            return gx.to(x.dtype), gw.to(w.dtype), gb.to(b.dtype)

    return _named(LinearGelu, "linear_gelu", variant)


def linear_gelu_reference(x, w, b):
    h = x @ w.t() + b
    return 0.5 * h * (1 + torch.tanh(GELU_K * (h + GELU_A * h ** 3)))


def linear_gelu_f_reference(x, w, b):
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def linear_gelu_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d = _rows(size, (16, 24), (512, 64))
    return (_draw(gen, (n, d), dtype), _draw(gen, (d, d), dtype, 1.0 / math.sqrt(d)), _draw(gen, (d,), dtype, 0.5))


# ---------------------------------------------------------------------------------------------------------------
# 5. Attention with a trainable additive bias shared over the batch: q, k, v (B, H, T, D), bias (H, T, T).
#    S = q·kᵀ·s + bias, P = softmax(S) (float32), O = P·v.  Backward as FlashAttention's: P from the saved lse,
#    δ = rowsum(dO ⊙ O), dS = P ⊙ (dO·vᵀ − δ); dq = dS·k·s, dk = dSᵀ·q·s, dv = Pᵀ·dO, dbias = Σ_batch dS.

ATTN_SLIPS = {
    "dk_no_scale": ("scale", "all"),                  # dk without the softmax scale s
    "ds_no_delta": ("per_row_term", "all"),           # dS = P ⊙ dP, the rowsum δ dropped
    "dbias_batch0": ("one_batch_element", "all"),     # dbias = dS of batch element 0 only
    "dv_not_transposed": ("transposed", "all"),       # dv = P·dO
    "dq_unscaled_16bit": ("scale", "low"),            # 16-bit path folds s into q in forward; backward forgets it
}


def make_attention_bias(variant="right"):
    _check_variant(variant, ATTN_SLIPS)

    class AttentionBias(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, bias):
            c = _compute_dtype(q)
            s = 1.0 / math.sqrt(q.shape[-1])
            scores = (q.to(c) @ k.to(c).transpose(-1, -2)) * s + bias.to(c)
            lse = torch.logsumexp(scores, -1, keepdim=True)
            out = torch.exp(scores - lse) @ v.to(c)
            out = out.to(q.dtype)
            ctx.save_for_backward(q, k, v, bias, out, lse)
            return out

        @staticmethod
        def backward(ctx, gy):
            q, k, v, bias, out, lse = ctx.saved_tensors
            c = lse.dtype
            s = 1.0 / math.sqrt(q.shape[-1])
            qf, kf, vf, do = q.to(c), k.to(c), v.to(c), gy.to(c)
            p = torch.exp((qf @ kf.transpose(-1, -2)) * s + bias.to(c) - lse)
            delta = (do * out.to(c)).sum(-1, keepdim=True)
            dp = do @ vf.transpose(-1, -2)
            ds = p * dp if variant == "ds_no_delta" else p * (dp - delta)
            dq = ds @ kf if variant == "dq_unscaled_16bit" and _is_low(q) else (ds @ kf) * s
            dk = ds.transpose(-1, -2) @ qf
            if variant != "dk_no_scale":
                dk = dk * s
            dv = p @ do if variant == "dv_not_transposed" else p.transpose(-1, -2) @ do
            dbias = ds[0] if variant == "dbias_batch0" else ds.sum(0)
            return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias.to(bias.dtype)

    return _named(AttentionBias, "attention_bias", variant)


def attention_bias_reference(q, k, v, bias):
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1]) + bias
    return torch.softmax(scores, -1) @ v


def attention_bias_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    b, h, t, d = (2, 2, 8, 8) if size == "small" else (2, 4, 32, 16)
    return (_draw(gen, (b, h, t, d), dtype), _draw(gen, (b, h, t, d), dtype), _draw(gen, (b, h, t, d), dtype),
            _draw(gen, (h, t, t), dtype, 0.5))


# ---------------------------------------------------------------------------------------------------------------
# 6. SwiGLU on one projection: x (N, 2D) = [a | b] → y = silu(a)·b, silu(a) = a·σ(a).
#    ā = ȳ·b·σ(a)(1 + a(1 − σ(a))), b̄ = ȳ·silu(a).

SWIGLU_SLIPS = {
    "silu_prime_is_sigmoid": ("dropped_term", "all"),  # ā = ȳ·b·σ(a): the product rule's a·σ' term dropped
    "sigmoid_term_sign": ("sign", "all"),              # σ(a)(1 + a(σ(a) − 1))
    "gate_grad_at_sigmoid": ("wrong_value", "all"),    # b̄ = ȳ·σ(a) where silu(a) belongs
    "silu_prime_1_minus_s_16bit": ("dropped_term", "low"),  # 16-bit path: σ(a)(1 + a) (the −a·σ(a) part dropped)
}


def make_swiglu(variant="right"):
    _check_variant(variant, SWIGLU_SLIPS)

    class SwiGLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            c = _compute_dtype(x)
            a, b = x.to(c).chunk(2, dim=-1)
            ctx.save_for_backward(x)
            return (a * torch.sigmoid(a) * b).to(x.dtype)

        @staticmethod
        def backward(ctx, gy):
            (x,) = ctx.saved_tensors
            c = _compute_dtype(x)
            a, b = x.to(c).chunk(2, dim=-1)
            g = gy.to(c)
            sg = torch.sigmoid(a)
            if variant == "silu_prime_is_sigmoid":
                dsilu = sg
            elif variant == "sigmoid_term_sign":
                dsilu = sg * (1 + a * (sg - 1))
            elif variant == "silu_prime_1_minus_s_16bit" and _is_low(x):
                dsilu = sg * (1 + a)
            else:
                dsilu = sg * (1 + a * (1 - sg))
            da = g * b * dsilu
            db = g * (sg if variant == "gate_grad_at_sigmoid" else a * sg)
            return torch.cat([da, db], dim=-1).to(x.dtype)

    return _named(SwiGLU, "swiglu", variant)


def swiglu_reference(x):
    a, b = x.chunk(2, dim=-1)
    return a * torch.sigmoid(a) * b


def swiglu_f_reference(x):
    a, b = x.chunk(2, dim=-1)
    return F.silu(a) * b


def swiglu_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d = _rows(size, (16, 32), (512, 128))
    return (_draw(gen, (n, 2 * d), dtype, 1.5),)


# ---------------------------------------------------------------------------------------------------------------
# 7. First-order linear scan (exponential-decay recurrence) along time: a, x (B, T, D),
#    h_t = a_t·h_{t−1} + x_t, h_{−1} = 0.  Reverse scan: g_t = ȳ_t + a_{t+1}·g_{t+1}; x̄_t = g_t, ā_t = g_t·h_{t−1}.
#    The state is float32 in both directions; the states are recomputed in backward, not stored.

SCAN_SLIPS = {
    "decay_off_by_one": ("wrong_value", "all"),       # g_t = ȳ_t + a_t·g_{t+1}: the decay of the wrong step
    "forward_scan_grad": ("transposed", "all"),       # g by the forward recurrence g_t = ȳ_t + a_t·g_{t−1}
    "a_grad_at_h_t": ("wrong_value", "all"),          # ā_t = g_t·h_t where h_{t−1} belongs
    "state_low": ("precision_defect", "low"),         # the reverse state g kept at bf16/fp16 across T steps
}


def _scan(a, x):
    h, out = torch.zeros_like(x[:, 0]), []
    for t in range(x.shape[1]):
        h = a[:, t] * h + x[:, t]
        out.append(h)
    return torch.stack(out, 1)


def make_linear_scan(variant="right"):
    _check_variant(variant, SCAN_SLIPS)

    class LinearScan(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, x):
            c = _compute_dtype(x)
            ctx.save_for_backward(a, x)
            return _scan(a.to(c), x.to(c)).to(x.dtype)

        @staticmethod
        def backward(ctx, gy):
            a, x = ctx.saved_tensors
            c = _compute_dtype(x)
            af, gyf = a.to(c), gy.to(c)
            h = _scan(af, x.to(c))
            h_prev = torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)
            steps = x.shape[1]
            state_dtype = x.dtype if variant == "state_low" and _is_low(x) else c
            g = torch.zeros_like(gyf[:, 0]).to(state_dtype)
            gs = [None] * steps
            if variant == "forward_scan_grad":
                for t in range(steps):
                    g = (gyf[:, t] + af[:, t] * g).to(state_dtype)
                    gs[t] = g
            else:
                for t in reversed(range(steps)):
                    if t + 1 < steps:
                        decay = af[:, t] if variant == "decay_off_by_one" else af[:, t + 1]
                        g = (gyf[:, t] + decay * g.to(c)).to(state_dtype)
                    else:
                        g = gyf[:, t].to(state_dtype)
                    gs[t] = g
            gx = torch.stack(gs, 1).to(c)
            ga = gx * (h if variant == "a_grad_at_h_t" else h_prev)
            return ga.to(a.dtype), gx.to(x.dtype)

    return _named(LinearScan, "linear_scan", variant)


def linear_scan_reference(a, x):
    return _scan(a, x)


def linear_scan_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    b, t, d = (2, 16, 8) if size == "small" else (4, 128, 16)
    a = (0.9 + 0.09 * torch.tanh(torch.randn(b, t, d, dtype=torch.float64, generator=gen))).to(dtype)
    return a.requires_grad_(), _draw(gen, (b, t, d), dtype)


# ---------------------------------------------------------------------------------------------------------------
# 8. Row cosine similarity: x1, x2 (N, D) → cos (N,) = ⟨x1, x2⟩ / (‖x1‖·‖x2‖).
#    x̄1 = ȳ·(x2/(‖x1‖‖x2‖) − cos·x1/‖x1‖²), and the same with 1 and 2 exchanged.

COS_SLIPS = {
    "no_norm_term": ("dropped_term", "all"),          # the quotient rule's term through the norms dropped
    "x2_grad_uses_norm_1": ("wrong_value", "all"),    # x̄2's second term divided by ‖x1‖² where ‖x2‖² belongs
    "norm_term_sign": ("sign", "all"),                # + cos·x/‖x‖²
    "dot_low": ("precision_defect", "low"),           # backward's dot product and norms summed at bf16/fp16
}


def _rowsum_low(t):
    """Σ over the last axis, accumulated element by element at t's own dtype (an accumulator kept at bf16)."""
    acc = torch.zeros_like(t[..., 0])
    for j in range(t.shape[-1]):
        acc = acc + t[..., j]
    return acc


def make_cosine_similarity(variant="right"):
    _check_variant(variant, COS_SLIPS)

    class CosineSimilarity(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x1, x2):
            c = _compute_dtype(x1)
            a, b = x1.to(c), x2.to(c)
            ctx.save_for_backward(x1, x2)
            return ((a * b).sum(-1) / ((a * a).sum(-1).sqrt() * (b * b).sum(-1).sqrt())).to(x1.dtype)

        @staticmethod
        def backward(ctx, gy):
            x1, x2 = ctx.saved_tensors
            c = _compute_dtype(x1)
            if variant == "dot_low" and _is_low(x1):
                dot = _rowsum_low(x1 * x2).to(c)
                s1, s2 = _rowsum_low(x1 * x1).to(c), _rowsum_low(x2 * x2).to(c)
                a, b = x1.to(c), x2.to(c)
            else:
                a, b = x1.to(c), x2.to(c)
                dot, s1, s2 = (a * b).sum(-1), (a * a).sum(-1), (b * b).sum(-1)
            inv = torch.rsqrt(s1 * s2)
            cos = dot * inv
            sign = 1.0 if variant == "norm_term_sign" else -1.0
            keep = 0.0 if variant == "no_norm_term" else 1.0
            s2_for_x2 = s1 if variant == "x2_grad_uses_norm_1" else s2
            g = gy.to(c)[:, None]
            g1 = g * (b * inv[:, None] + keep * sign * (cos / s1)[:, None] * a)
            g2 = g * (a * inv[:, None] + keep * sign * (cos / s2_for_x2)[:, None] * b)
            return g1.to(x1.dtype), g2.to(x2.dtype)

    return _named(CosineSimilarity, "cosine_similarity", variant)


def cosine_similarity_reference(x1, x2):
    return (x1 * x2).sum(-1) / ((x1 * x1).sum(-1).sqrt() * (x2 * x2).sum(-1).sqrt())


def cosine_similarity_f_reference(x1, x2):
    return F.cosine_similarity(x1, x2, dim=-1, eps=1e-12)


def cosine_similarity_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d = _rows(size, (16, 32), (512, 128))
    x1 = _draw(gen, (n, d), dtype, grad=False)
    x2 = (x1.double() * 0.7 + 0.7 * torch.randn(n, d, dtype=torch.float64, generator=gen)).to(dtype)
    return x1.requires_grad_(), x2.requires_grad_()


# ---------------------------------------------------------------------------------------------------------------
# 9. Row log-sum-exp: x (N, D) → lse (N,) = m + log Σ exp(x − m).  x̄ = ȳ·exp(x − lse) (softmax), lse kept in float32.

LSE_SLIPS = {
    "softmax_dim0": ("wrong_axis", "all"),            # softmax over the rows' axis
    "max_for_lse": ("wrong_value", "all"),            # exp(x − m): the row max where lse belongs (unnormalized)
    "sign": ("sign", "all"),                          # −ȳ·softmax
    "lse_saved_low": ("precision_defect", "low"),     # backward reads the stored 16-bit output for lse
}


def make_logsumexp(variant="right"):
    _check_variant(variant, LSE_SLIPS)

    class LogSumExp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            c = _compute_dtype(x)
            xf = x.to(c)
            m = xf.amax(-1)
            lse = m + torch.log(torch.exp(xf - m[:, None]).sum(-1))
            out = lse.to(x.dtype)
            ctx.save_for_backward(x, lse, m, out)
            return out

        @staticmethod
        def backward(ctx, gy):
            x, lse, m, out = ctx.saved_tensors
            c = lse.dtype
            xf, g = x.to(c), gy.to(c)[:, None]
            if variant == "softmax_dim0":
                p = torch.softmax(xf, dim=0)
            elif variant == "max_for_lse":
                p = torch.exp(xf - m[:, None])
            elif variant == "lse_saved_low" and _is_low(x):
                p = torch.exp(xf - out.to(c)[:, None])
            else:
                p = torch.exp(xf - lse[:, None])
            return ((-g if variant == "sign" else g) * p).to(x.dtype)

    return _named(LogSumExp, "logsumexp", variant)


def logsumexp_reference(x):
    m = x.amax(-1, keepdim=True).detach()
    return m.squeeze(-1) + torch.log(torch.exp(x - m).sum(-1))


def logsumexp_f_reference(x):
    return torch.logsumexp(x, -1)


def logsumexp_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d = _rows(size, (16, 32), (512, 128))
    return (_draw(gen, (n, d), dtype, 2.0, 3.0),)


# ---------------------------------------------------------------------------------------------------------------
# 10. Residual + bias add + LayerNorm fused: s = x + res + bias, y = LN(s)·w + b; x, res (N, D), bias, w, b (D).
#     s̄ = LN's x̄; x̄ = res̄ = s̄, bias̄ = Σ_rows s̄; w̄ = Σ ȳ·ŝ, b̄ = Σ ȳ — column sums as per-block partials.

RLN_EPS = 1e-5
RLN_BLOCK = 32
RLN_SLIPS = {
    "bias_grad_first_row": ("one_batch_element", "all"),  # bias̄ = s̄ of row 0
    "no_projection": ("per_row_term", "all"),         # s̄ without −ŝ·mean(g·ŝ)
    "eps_outside_sqrt": ("wrong_value", "all"),       # backward recomputes rstd = 1/(√var + eps) (small)
    "w_grad_no_rstd": ("wrong_value", "all"),         # w̄ = Σ ȳ·(s − μ): rstd left out of ŝ
    "xhat_from_output_16bit": ("precision_defect", "low"),  # 16-bit path recovers ŝ = (y − b)/w from the stored y
}


def make_residual_layer_norm(variant="right"):
    _check_variant(variant, RLN_SLIPS)

    class ResidualBiasLayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, res, bias, w, b):
            c = _compute_dtype(x)
            s = x.to(c) + res.to(c) + bias.to(c)
            mu = s.mean(-1, keepdim=True)
            var = ((s - mu) ** 2).mean(-1, keepdim=True)
            rstd = torch.rsqrt(var + RLN_EPS)
            y = ((s - mu) * rstd * w.to(c) + b.to(c)).to(x.dtype)
            ctx.save_for_backward(x, res, bias, w, b, mu, rstd, y)
            return y

        @staticmethod
        def backward(ctx, gy):
            x, res, bias, w, b, mu, rstd, y = ctx.saved_tensors
            c = rstd.dtype
            s = x.to(c) + res.to(c) + bias.to(c)
            if variant == "eps_outside_sqrt":
                rstd = 1.0 / (torch.sqrt(((s - mu) ** 2).mean(-1, keepdim=True)) + RLN_EPS)
            if variant == "xhat_from_output_16bit" and _is_low(x):
                shat = (y.to(c) - b.to(c)) / w.to(c)
            else:
                shat = (s - mu) * rstd
            g_out = gy.to(c)
            g = g_out * w.to(c)
            gs = g - g.mean(-1, keepdim=True)
            if variant != "no_projection":
                gs = gs - shat * (g * shat).mean(-1, keepdim=True)
            gs = rstd * gs
            gbias = gs[0] if variant == "bias_grad_first_row" else _column_sums(gs, RLN_BLOCK, c, c)
            w_rows = g_out * ((s - mu) if variant == "w_grad_no_rstd" else shat)
            gw = _column_sums(w_rows, RLN_BLOCK, c, w.dtype)
            gb = _column_sums(g_out, RLN_BLOCK, c, b.dtype)
            return gs.to(x.dtype), gs.to(res.dtype), gbias.to(bias.dtype), gw, gb

    return _named(ResidualBiasLayerNorm, "residual_layer_norm", variant)


def residual_layer_norm_reference(x, res, bias, w, b):
    s = x + res + bias
    mu = s.mean(-1, keepdim=True)
    var = ((s - mu) ** 2).mean(-1, keepdim=True)
    return (s - mu) * (var + RLN_EPS).pow(-0.5) * w + b


def residual_layer_norm_f_reference(x, res, bias, w, b):
    return F.layer_norm(x + res + bias, (x.shape[-1],), w, b, RLN_EPS)


def residual_layer_norm_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d = _rows(size, (32, 32), (512, 128))
    return (_draw(gen, (n, d), dtype), _draw(gen, (n, d), dtype), _draw(gen, (d,), dtype, 0.5),
            _draw(gen, (d,), dtype, 0.1, 1.0), _draw(gen, (d,), dtype, 1.0))


# ---------------------------------------------------------------------------------------------------------------

CASES = [
    Case("rms_norm", make_rms_norm, rms_norm_reference, None, rms_norm_inputs, RMS_SLIPS, fp16_ok=True),
    Case("layer_norm", make_layer_norm, layer_norm_reference, layer_norm_f_reference, layer_norm_inputs, LN_SLIPS),
    Case("cross_entropy", make_cross_entropy, cross_entropy_reference, cross_entropy_f_reference,
         cross_entropy_inputs, CE_SLIPS),
    Case("linear_gelu", make_linear_gelu, linear_gelu_reference, linear_gelu_f_reference, linear_gelu_inputs,
         GELU_SLIPS),
    Case("attention_bias", make_attention_bias, attention_bias_reference, None, attention_bias_inputs, ATTN_SLIPS),
    Case("swiglu", make_swiglu, swiglu_reference, swiglu_f_reference, swiglu_inputs, SWIGLU_SLIPS),
    Case("linear_scan", make_linear_scan, linear_scan_reference, None, linear_scan_inputs, SCAN_SLIPS, fp16_ok=True),
    Case("cosine_similarity", make_cosine_similarity, cosine_similarity_reference, cosine_similarity_f_reference,
         cosine_similarity_inputs, COS_SLIPS),
    Case("logsumexp", make_logsumexp, logsumexp_reference, logsumexp_f_reference, logsumexp_inputs, LSE_SLIPS),
    Case("residual_layer_norm", make_residual_layer_norm, residual_layer_norm_reference,
         residual_layer_norm_f_reference, residual_layer_norm_inputs, RLN_SLIPS),
]

for _case in CASES:
    assert all(kind in KINDS and where in ("low", "all") for kind, where in _case.slips.values()), _case.name


# ---------------------------------------------------------------------------------------------------------------
# Self-check of the set.

def _grads(fn, xs, cotangent):
    leaves = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
    return torch.autograd.grad(fn(*xs), leaves, cotangent)


def _verify(cases=None):
    """Every right version against torch.autograd.gradcheck in float64 (and against both references' gradients),
    every slip differing from the right version at the dtype where it lives (the cases: CASES, or those given, on
    their inputs' device). Returns the number of problems."""
    problems = 0
    for case in CASES if cases is None else cases:
        for size in ("small", "large"):
            xs = case.inputs(size, torch.float64, 0)
            if size == "small":
                ok = torch.autograd.gradcheck(case.make("right"), xs, eps=1e-6, atol=1e-6, rtol=1e-5)
                print(f"{case.name}: right, torch.autograd.gradcheck in float64: {ok}")
            out = case.make("right")(*xs)
            gen = torch.Generator().manual_seed(1)
            cot = torch.randn(out.shape, dtype=torch.float64, generator=gen).to(out.device)
            right = _grads(case.make("right"), xs, cot)
            for ref in (case.reference, case.f_reference):
                if ref is None:
                    continue
                ref_out = ref(*xs)
                err_y = (ref_out - out).abs().max().item()
                err_g = max((a - b).abs().max().item() for a, b in zip(_grads(ref, xs, cot), right))
                bad = err_y > 1e-10 or err_g > 1e-10
                problems += bad
                print(f"  {size}: {ref.__name__} vs right in float64: forward {err_y:.1e}, VJP {err_g:.1e}"
                      + ("  PROBLEM" if bad else ""))
        for dtype in (torch.bfloat16, torch.float32, torch.float64):
            xs = case.inputs("small", dtype, 0)
            out = case.make("right")(*xs)
            gen = torch.Generator().manual_seed(1)
            cot = torch.randn(out.shape, dtype=torch.float64, generator=gen).to(dtype).to(out.device)
            right = _grads(case.make("right"), xs, cot)
            for slip, (kind, where) in case.slips.items():
                lives = where == "all" or dtype in LOW
                diff = max((a.double() - b.double()).abs().max().item()
                           for a, b in zip(_grads(case.make(slip), xs, cot), right))
                bad = (diff == 0) if lives else (diff != 0)
                problems += bad
                if bad or dtype == torch.bfloat16:
                    print(f"  {str(dtype)[6:]:9s} {slip:28s} ({kind}, {where}): differs from right by {diff:.2e}"
                          + ("  PROBLEM" if bad else ""))
    print("problems:", problems)
    return problems


if __name__ == "__main__":
    raise SystemExit(1 if _verify() else 0)
