"""A second held-out set of ops for checking that slips are named the same way at small and large sizes.

Five torch.autograd.Function ops in float64, each with a hand-written backward and two or three
slips: plausible mistakes an op author makes in backward only (forward is the same for every
variant). Every op also takes a fixed tensor without requires_grad (targets, a keep mask,
per-channel scale, a per-sample temperature, per-point weights, position tables) that shares the
batch axis with the checked inputs or is broadcast against them.

OPS maps an op name to (make, slips). make(variant, large, seed) returns (fn, inputs): variant is
"right" or one of the slip names, fn(*inputs) returns one tensor of at least two dimensions, and
inputs are float64 CPU tensors drawn from torch.Generator().manual_seed(seed), the checked ones
with requires_grad=True. With large=False the shapes are small (output elements x input elements
<= 20000 for every checked input, batch axis 2, fixed tensors that differ between batch
elements), so a checker can build the full Jacobian. With large=True that product is between
2e5 and 3e6, the batch axis is 4 long and one batch element alone still gives >= 40000 entries,
so a checker has to use random projections. A checker is run on each (op, slip) at both sizes
and the kind of slip it names at the large size is compared with the kind it names at the small
size.

Running this file verifies the set: at the small size the right backward passes
torch.autograd.gradcheck and every slip fails it; at the large size the right backward passes a
fast-mode gradcheck and every slip's vector-Jacobian product (random output gradient) differs
from the right one.
"""
import torch

from draws import generator as _gen, randn as _randn, uniform as _uniform

DT = torch.float64


def _mask(g, b, n):
    """A 0/1 mask (b, n) with both values in every row and neighbouring rows different."""
    m = (torch.rand(b, n, generator=g) > 0.35).to(DT)
    for i in range(b):
        m[i, i % n] = 0.0
        m[i, (i + 1) % n] = 1.0
    return m


# rope: rotary position embedding of x (B, h, T, d) split in halves x = [x1, x2]:
#   y1 = x1 * cos - x2 * sin,  y2 = x1 * sin + x2 * cos,
# with fixed tables cos, sin (B, 1, T, d/2) from per-sample position offsets, broadcast over heads.
# T == d/2, so each sample's table is square. backward is the inverse rotation:
#   dx1 = g1 * cos + g2 * sin,  dx2 = g2 * cos - g1 * sin.
# sin_sign: the sign of sin flipped in both halves (rotates the gradient forward, not back).
# table_transposed: the square tables read transposed (position and frequency axes swapped).
class Rope(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, cos, sin, variant):
        ctx.save_for_backward(cos, sin)
        ctx.variant = variant
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)

    @staticmethod
    def backward(ctx, gy):
        cos, sin = ctx.saved_tensors
        if ctx.variant == "table_transposed":
            cos, sin = cos.transpose(-1, -2), sin.transpose(-1, -2)
        if ctx.variant == "sin_sign":
            sin = -sin
        g1, g2 = gy.chunk(2, dim=-1)
        return torch.cat((g1 * cos + g2 * sin, g2 * cos - g1 * sin), dim=-1), None, None, None


def make_rope(variant, large, seed):
    g = _gen(seed)
    b, h, t = (4, 2, 8) if large else (2, 2, 4)
    x = _randn(g, b, h, t, 2 * t, grad=True)
    offset = _uniform(g, 0.0, 6.0, b, 1, 1, 1)
    pos = torch.arange(t, dtype=DT).view(1, 1, t, 1) + offset
    freq = 0.15 + 1.1 * torch.arange(t, dtype=DT) / t + _uniform(g, 0.0, 0.05, t)
    ang = pos * freq
    return (lambda x, c, s: Rope.apply(x, c, s, variant)), (x, ang.cos(), ang.sin())


# token_xent: per-token cross-entropy with reduction none. Logits z (B, T, V), fixed one-hot
# targets q (B, T, V) and a fixed keep mask m (B, T) (0 = ignored token):
#   y[b, t] = m * (logsumexp_v z - sum_v q * z),   dz = g * m * (softmax(z) - q).
# softmax_term_dropped: dz = -g * m * q (the softmax row term left out).
# mask_ignored: dz = g * (softmax(z) - q) (ignored tokens get a gradient).
# sign_flip: dz = g * m * (q - softmax(z)).
class TokenXent(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, q, m, variant):
        ctx.save_for_backward(z, q, m)
        ctx.variant = variant
        return m * (torch.logsumexp(z, dim=-1) - (q * z).sum(-1))

    @staticmethod
    def backward(ctx, gy):
        z, q, m = ctx.saved_tensors
        v = ctx.variant
        p = torch.zeros_like(z) if v == "softmax_term_dropped" else torch.softmax(z, dim=-1)
        scale = gy if v == "mask_ignored" else gy * m
        d = q - p if v == "sign_flip" else p - q
        return scale.unsqueeze(-1) * d, None, None, None


def make_token_xent(variant, large, seed):
    g = _gen(seed)
    b, t, v = (4, 32, 64) if large else (2, 5, 8)
    z = _randn(g, b, t, v, grad=True)
    target = torch.randint(0, v, (b, t), generator=g)
    q = torch.nn.functional.one_hot(target, v).to(DT)
    m = _mask(g, b, t)
    return (lambda z, q, m: TokenXent.apply(z, q, m, variant)), (z, q, m)


# masked_layernorm: layer norm over the last axis of x (B, T, D) with a fixed per-channel scale
# w (D,) and a fixed keep mask m (B, T) on the output:
#   xh = (x - mean(x)) / sqrt(var(x) + eps),   y = m * w * xh.
# With gh = g * m * w:  dx = (gh - mean(gh) - xh * mean(gh * xh)) / sqrt(var(x) + eps).
# mean_dropped: the mean(gh) term left out.
# output_read: the output y read where xh belongs in the last term (y * mean(gh * y)).
# var_term_sign: xh * mean(gh * xh) added instead of subtracted.
class MaskedLayerNorm(torch.autograd.Function):
    EPS = 1e-5

    @staticmethod
    def forward(ctx, x, w, m, variant):
        mu = x.mean(-1, keepdim=True)
        rstd = ((x - mu).pow(2).mean(-1, keepdim=True) + MaskedLayerNorm.EPS).rsqrt()
        xh = (x - mu) * rstd
        y = m.unsqueeze(-1) * w * xh
        ctx.save_for_backward(xh, rstd, w, m, y)
        ctx.variant = variant
        return y

    @staticmethod
    def backward(ctx, gy):
        xh, rstd, w, m, y = ctx.saved_tensors
        v = ctx.variant
        gh = gy * m.unsqueeze(-1) * w
        mean_term = 0.0 if v == "mean_dropped" else gh.mean(-1, keepdim=True)
        r = y if v == "output_read" else xh
        var_term = r * (gh * r).mean(-1, keepdim=True)
        if v == "var_term_sign":
            var_term = -var_term
        return (gh - mean_term - var_term) * rstd, None, None, None


def make_masked_layernorm(variant, large, seed):
    g = _gen(seed)
    b, t, d = (4, 8, 32) if large else (2, 5, 12)
    x = (1.5 * _randn(g, b, t, d) + 0.3).requires_grad_(True)
    w = _uniform(g, 0.5, 1.5, d)
    m = _mask(g, b, t)
    return (lambda x, w, m: MaskedLayerNorm.apply(x, w, m, variant)), (x, w, m)


# temp_logsoftmax: log-softmax over the last axis of x / tau, x (B, T, V), with a fixed
# per-sample temperature tau (B, 1, 1):
#   y = log_softmax(x / tau),   dx = (g - softmax(x / tau) * sum_v g) / tau.
# temp_first_sample: tau[0] used for every sample in backward.
# temp_multiplied: multiplies by tau instead of dividing.
class TempLogSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, tau, variant):
        y = torch.log_softmax(x / tau, dim=-1)
        ctx.save_for_backward(y, tau)
        ctx.variant = variant
        return y

    @staticmethod
    def backward(ctx, gy):
        y, tau = ctx.saved_tensors
        v = ctx.variant
        gz = gy - y.exp() * gy.sum(-1, keepdim=True)
        if v == "temp_first_sample":
            tau = tau[:1]
        return (gz * tau if v == "temp_multiplied" else gz / tau), None, None


def make_temp_logsoftmax(variant, large, seed):
    g = _gen(seed)
    b, t, v = (4, 8, 32) if large else (2, 3, 8)
    x = _randn(g, b, t, v, grad=True)
    tau = _uniform(g, 0.5, 2.5, b, 1, 1)
    tau[1] = tau[0] + 0.6  # samples 0 and 1 always differ
    return (lambda x, tau: TempLogSoftmax.apply(x, tau, variant)), (x, tau)


# pair_sqdist: weighted pairwise squared distances between the rows of x (B, N, D), with fixed
# per-point weights w (B, N):
#   y[b, i, j] = w[b, i] * w[b, j] * |x[b, i] - x[b, j]|^2.
# With a = g * w_i * w_j and s = a + a^T:  dx_i = 2 * sum_j s_ij * (x_i - x_j).
# factor_two_dropped: the factor 2 left out (gradient halved).
# transpose_term_dropped: s = a (x_i counted only as the first point of a pair).
# weight_ignored: a = g (the weights left out).
class PairSqDist(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, variant):
        ctx.save_for_backward(x, w)
        ctx.variant = variant
        diff = x.unsqueeze(2) - x.unsqueeze(1)
        return w.unsqueeze(2) * w.unsqueeze(1) * diff.pow(2).sum(-1)

    @staticmethod
    def backward(ctx, gy):
        x, w = ctx.saved_tensors
        v = ctx.variant
        a = gy if v == "weight_ignored" else gy * w.unsqueeze(2) * w.unsqueeze(1)
        s = a if v == "transpose_term_dropped" else a + a.transpose(1, 2)
        dx = s.sum(-1, keepdim=True) * x - s @ x
        return (dx if v == "factor_two_dropped" else 2.0 * dx), None, None


def make_pair_sqdist(variant, large, seed):
    g = _gen(seed)
    b, n, d = (4, 16, 16) if large else (2, 5, 4)
    x = _randn(g, b, n, d, grad=True)
    w = _uniform(g, 0.5, 1.5, b, n)
    return (lambda x, w: PairSqDist.apply(x, w, variant)), (x, w)


OPS = {  # op name -> (make, slips)
    "rope": (make_rope, ("sin_sign", "table_transposed")),
    "token_xent": (make_token_xent, ("softmax_term_dropped", "mask_ignored", "sign_flip")),
    "masked_layernorm": (make_masked_layernorm, ("mean_dropped", "output_read", "var_term_sign")),
    "temp_logsoftmax": (make_temp_logsoftmax, ("temp_first_sample", "temp_multiplied")),
    "pair_sqdist": (make_pair_sqdist, ("factor_two_dropped", "transpose_term_dropped", "weight_ignored")),
}


def _sizes(fn, inputs):
    """(output elements x input elements) for each checked input, and the batch length."""
    n_out = fn(*inputs).numel()
    return [n_out * t.numel() for t in inputs if t.requires_grad], inputs[0].shape[0]


def _vjp(fn, inputs, go):
    checked = [t for t in inputs if t.requires_grad]
    return torch.autograd.grad(fn(*inputs), checked, go)


def _verify(seed=0):
    ok = True
    for name, (make, slips) in OPS.items():
        fn, inputs = make("right", False, seed)
        sizes, batch = _sizes(fn, inputs)
        size_ok = batch >= 2 and all(s <= 20000 for s in sizes) and fn(*inputs).dim() >= 2
        fn_l, inputs_l = make("right", True, seed)
        sizes_l, batch_l = _sizes(fn_l, inputs_l)
        size_ok = size_ok and batch_l >= 4 and all(200000 <= s <= 3000000 for s in sizes_l)
        size_ok = size_ok and max(sizes_l) // batch_l ** 2 >= 40000
        go = torch.randn(fn_l(*inputs_l).shape, generator=_gen(seed + 1), dtype=DT)
        right_l = _vjp(fn_l, inputs_l, go)
        for variant in ("right",) + slips:
            fn, inputs = make(variant, False, seed)
            small = torch.autograd.gradcheck(fn, inputs, raise_exception=False)
            fn_l, inputs_l = make(variant, True, seed)
            if variant == "right":
                large = torch.autograd.gradcheck(fn_l, inputs_l, fast_mode=True, raise_exception=False)
                good = small and large and size_ok
                detail = "small gradcheck %s, large fast gradcheck %s, sizes small %s large %s (batch %d)" % (
                    small, large, sizes, sizes_l, batch_l)
            else:
                got = _vjp(fn_l, inputs_l, go)
                diff = max(((a - b).norm() / b.norm()).item() for a, b in zip(got, right_l))
                good = (not small) and diff > 1e-3
                detail = "small gradcheck %s, large vjp relative difference %.3g" % (small, diff)
            ok = ok and good
            print("%-17s %-23s %s  %s" % (name, variant, "ok  " if good else "FAIL", detail))
    return ok


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    raise SystemExit(0 if _verify() else 1)
