"""Held-out ops with hand-written backwards and slips in them, for checks at a small and a large size.

Each op is a torch.autograd.Function in float64 whose backward is written by hand; each slip is a plausible mistake
in that backward only (the forward is the same). Every op takes at least one fixed tensor (a mask, a weight, a
per-sample scale) that shares the batch axis with the checked inputs or is broadcast against them. At the small size
the Jacobian of every checked input is small enough to be formed in full; at the large size it is not (between 2e5
and 3e6 entries per checked input), and one batch element alone still has at least 4e4 entries for some checked
input. The set measures whether a slip is named with the same kind at both sizes.

    from narrow_heldout import OPS
    make, slips = OPS["masked_mean"]
    fn, inputs = make("right", large=False, seed=0)   # or a slip's name from slips; large=True for the large size
    fn(*inputs)                                       # one output tensor; checked inputs require grad

Run this file to verify the set: every right version passes torch.autograd.gradcheck (in full at the small size,
fast mode at the large size) and every slip fails it at the small size.

    /usr/bin/python3 python/tests/narrow_heldout.py
"""
import torch

RIGHT = "right"


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rand(gen, *shape):
    return torch.rand(*shape, generator=gen, dtype=torch.float64)


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen, dtype=torch.float64)


def _keep_mask(gen, b, t, p_keep=0.7):
    """A fixed (b, t) 0/1 mask with at least two kept and at least one dropped position per row."""
    m = (_rand(gen, b, t) < p_keep).double()
    m[:, 0] = 1.0
    m[:, 1] = 1.0
    m[:, -1] = 0.0
    return m


# masked_mean: y[b, d] = sum_t m[b, t] x[b, t, d] / sum_t m[b, t]; x (B, T, D) checked, m (B, T) fixed 0/1.
#   count_T       divides by T (the padded length) instead of the per-row count sum_t m[b, t]
#   mask_ignored  spreads g / count over every position, masked ones included
class MaskedMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, m, slip):
        count = m.sum(1, keepdim=True)
        ctx.save_for_backward(m, count)
        ctx.slip = slip
        return (x * m[:, :, None]).sum(1) / count

    @staticmethod
    def backward(ctx, g):
        m, count = ctx.saved_tensors
        t = m.shape[1]
        if ctx.slip == "count_T":
            gx = m[:, :, None] * (g / t)[:, None, :]
        elif ctx.slip == "mask_ignored":
            gx = (g / count)[:, None, :].expand(-1, t, -1).clone()
        else:
            gx = m[:, :, None] * (g / count)[:, None, :]
        return gx, None, None


def make_masked_mean(variant, large, seed):
    gen = _gen(seed)
    b, t, d = (4, 12, 64) if large else (3, 5, 4)
    x = _randn(gen, b, t, d).requires_grad_()
    m = _keep_mask(gen, b, t)
    return (lambda x, m: MaskedMean.apply(x, m, variant)), (x, m)


# weighted_huber: per-sample weighted Huber loss with the factor-2 convention, h(r) = r^2 for |r| <= delta and
# 2 delta |r| - delta^2 beyond, r = pred - target; loss[b] = sum_j w[b, j] h(r[b, j]) (a weighted sum over C, L).
# pred and target (B, C, L) checked, w (B, C, L) fixed positive weights.
#   half_scale  drops the factor 2 of h' (r instead of 2r, delta sign(r) instead of 2 delta sign(r)): gradients halved
#   sign_flip   gives target the gradient of pred (+h' instead of -h')
#   unclipped   uses h'(r) = 2r everywhere, forgetting to clip at |r| = delta
class WeightedHuber(torch.autograd.Function):
    DELTA = 1.0

    @staticmethod
    def forward(ctx, pred, target, w, slip):
        r = pred - target
        a = r.abs()
        d = WeightedHuber.DELTA
        h = torch.where(a <= d, r * r, 2 * d * a - d * d)
        ctx.save_for_backward(r, w)
        ctx.slip = slip
        return (w * h).flatten(1).sum(1)

    @staticmethod
    def backward(ctx, g):
        r, w = ctx.saved_tensors
        d = WeightedHuber.DELTA
        if ctx.slip == "unclipped":
            dh = 2 * r
        else:
            dh = 2 * r.clamp(-d, d)
        if ctx.slip == "half_scale":
            dh = dh / 2
        gp = g.view(-1, *([1] * (r.dim() - 1))) * w * dh
        gt = gp if ctx.slip == "sign_flip" else -gp
        return gp, gt, None, None


def make_weighted_huber(variant, large, seed):
    gen = _gen(seed)
    b, c, n = (4, 8, 6000) if large else (3, 4, 8)
    pred = (1.5 * _randn(gen, b, c, n)).requires_grad_()
    target = _randn(gen, b, c, n).requires_grad_()
    w = 0.2 + 1.8 * _rand(gen, b, c, n)
    return (lambda p, t, w: WeightedHuber.apply(p, t, w, variant)), (pred, target, w)


# head_rmsnorm: per-head RMSNorm with a learnable (H, d) weight and a fixed per-sample scale s (B, 1, 1, 1):
# y = s * x / rms(x) * w, rms over the last axis (d); x (B, T, H, d) and w (H, d) checked.
#   proj_dropped       grad_x = g s w / rms, dropping the term -xhat mean(g s w xhat) / rms that comes from rms(x)
#   scale_ignored      leaves s out of both gradients (as if s were 1)
#   wgrad_first_batch  sums grad_w over batch element 0 only instead of over the whole batch
class HeadRMSNorm(torch.autograd.Function):
    EPS = 1e-6

    @staticmethod
    def forward(ctx, x, w, s, slip):
        rstd = torch.rsqrt((x * x).mean(-1, keepdim=True) + HeadRMSNorm.EPS)
        xhat = x * rstd
        ctx.save_for_backward(xhat, rstd, w, s)
        ctx.slip = slip
        return s * xhat * w

    @staticmethod
    def backward(ctx, g):
        xhat, rstd, w, s = ctx.saved_tensors
        gs = g if ctx.slip == "scale_ignored" else g * s
        gy = gs * w
        if ctx.slip == "proj_dropped":
            gx = rstd * gy
        else:
            gx = rstd * (gy - xhat * (gy * xhat).mean(-1, keepdim=True))
        gw_terms = gs * xhat
        if ctx.slip == "wgrad_first_batch":
            gw = gw_terms[0].sum(0)
        else:
            gw = gw_terms.sum((0, 1))
        return gx, gw, None, None


def make_head_rmsnorm(variant, large, seed):
    gen = _gen(seed)
    b, t, h, d = (4, 2, 6, 32) if large else (2, 2, 2, 4)
    x = _randn(gen, b, t, h, d).requires_grad_()
    w = (0.5 + _rand(gen, h, d)).requires_grad_()
    s = 0.5 + 1.5 * _rand(gen, b, 1, 1, 1)
    return (lambda x, w, s: HeadRMSNorm.apply(x, w, s, variant)), (x, w, s)


# grouped_softmax: p = softmax(x + a, over T) for each group; x (B, G, T) checked, a (B, 1, T) a fixed additive mask
# (0 kept, -1e4 masked) broadcast over the groups. grad_x = p (g - sum_T p g).
#   mask_ignored    recomputes p in backward as softmax(x), without the mask a
#   sum_wrong_axis  takes the correction sum p g over the group axis G instead of T
#   sign_flip       adds the correction instead of subtracting it: p (g + sum_T p g)
class GroupedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, slip):
        p = torch.softmax(x + a, dim=-1)
        ctx.save_for_backward(x, p)
        ctx.slip = slip
        return p

    @staticmethod
    def backward(ctx, g):
        x, p = ctx.saved_tensors
        if ctx.slip == "mask_ignored":
            p = torch.softmax(x, dim=-1)
        axis = 1 if ctx.slip == "sum_wrong_axis" else -1
        corr = (p * g).sum(axis, keepdim=True)
        if ctx.slip == "sign_flip":
            return p * (g + corr), None, None
        return p * (g - corr), None, None


def make_grouped_softmax(variant, large, seed):
    gen = _gen(seed)
    b, grp, t = (4, 8, 32) if large else (2, 3, 6)
    x = _randn(gen, b, grp, t).requires_grad_()
    a = ((_keep_mask(gen, b, t) - 1.0) * 1e4)[:, None, :]
    return (lambda x, a: GroupedSoftmax.apply(x, a, variant)), (x, a)


# masked_cumsum: y[b, t] = sum_{s <= t} m[b, s] x[b, s]; x (B, T, D) checked, m (B, T) fixed 0/1 keep-mask.
# grad_x[b, s] = m[b, s] sum_{t >= s} g[b, t] (a reverse cumulative sum).
#   forward_cumsum    uses the forward cumulative sum sum_{t <= s} g[b, t]: the transposed (lower-triangular) Jacobian
#   mask_wrong_index  applies the mask at the output index t inside the sum, sum_{t >= s} m[b, t] g[b, t]
#   first_batch       writes the gradient of batch element 0 only; the others get zeros
class MaskedCumsum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, m, slip):
        ctx.save_for_backward(m)
        ctx.slip = slip
        return torch.cumsum(x * m[:, :, None], dim=1)

    @staticmethod
    def backward(ctx, g):
        (m,) = ctx.saved_tensors
        mm = m[:, :, None]
        if ctx.slip == "forward_cumsum":
            return mm * torch.cumsum(g, dim=1), None, None
        if ctx.slip == "mask_wrong_index":
            return torch.cumsum((mm * g).flip(1), dim=1).flip(1), None, None
        gx = mm * torch.cumsum(g.flip(1), dim=1).flip(1)
        if ctx.slip == "first_batch":
            gx = torch.cat([gx[:1], torch.zeros_like(gx[1:])])
        return gx, None, None


def make_masked_cumsum(variant, large, seed):
    gen = _gen(seed)
    b, t, d = (4, 16, 16) if large else (2, 5, 3)
    x = _randn(gen, b, t, d).requires_grad_()
    m = _keep_mask(gen, b, t)
    return (lambda x, m: MaskedCumsum.apply(x, m, variant)), (x, m)


OPS = {  # op name -> (make, slips)
    "masked_mean": (make_masked_mean, ("count_T", "mask_ignored")),
    "weighted_huber": (make_weighted_huber, ("half_scale", "sign_flip", "unclipped")),
    "head_rmsnorm": (make_head_rmsnorm, ("proj_dropped", "scale_ignored", "wgrad_first_batch")),
    "grouped_softmax": (make_grouped_softmax, ("mask_ignored", "sum_wrong_axis", "sign_flip")),
    "masked_cumsum": (make_masked_cumsum, ("forward_cumsum", "mask_wrong_index", "first_batch")),
}


def _jacobian_sizes(fn, inputs, per_batch=False):
    """(output elements) x (input elements) for each checked input; per_batch: for batch element 0 alone (the
    output and every input with the batch axis cut to one element; a parameter without that axis kept whole)."""
    out, b = fn(*inputs), inputs[0].shape[0]
    n_out = out.numel() // b if per_batch else out.numel()
    return [n_out * (x.numel() // b if per_batch and x.dim() >= 3 and x.shape[0] == b else x.numel())
            for x in inputs if x.requires_grad]


if __name__ == "__main__":
    failures = 0
    for op, (make, slips) in OPS.items():
        for variant in (RIGHT,) + slips:
            fn, inputs = make(variant, False, 0)
            small = _jacobian_sizes(fn, inputs)
            passed = torch.autograd.gradcheck(fn, inputs, raise_exception=False)
            ok = passed == (variant == RIGHT) and max(small) <= 20000
            line = f"{op:16s} {variant:18s} small gradcheck {'pass' if passed else 'FAIL'} sizes {small}"
            if variant == RIGHT:
                fn, inputs = make(variant, True, 0)
                large = _jacobian_sizes(fn, inputs)
                per_batch = _jacobian_sizes(fn, inputs, per_batch=True)
                passed = torch.autograd.gradcheck(fn, inputs, fast_mode=True, raise_exception=False)
                ok = ok and passed and all(2e5 <= n <= 3e6 for n in large) and max(per_batch) >= 40000
                ok = ok and inputs[0].shape[0] >= 4
                line += f"; large fast gradcheck {'pass' if passed else 'FAIL'} sizes {large} per-batch {per_batch}"
            failures += not ok
            print(("ok    " if ok else "WRONG ") + line)
    print(f"{failures} wrong")
    raise SystemExit(1 if failures else 0)
