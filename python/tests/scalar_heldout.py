"""A held-out set of scalar-loss ops for checking that slips are named the same way at small and large sizes.

Five torch.autograd.Function ops in float64 that each return a 0-d loss (a mean or sum over a
batch), each with a hand-written backward and two or three slips: plausible mistakes an op author
makes in backward only (forward is the same for every variant). Every checked input has the batch
as its leading axis; some ops also take a fixed tensor without requires_grad (one-hot targets,
per-sample weights, observed values) of the same batch.

OPS maps an op name to (make, slips). make(variant, large, seed) returns (fn, inputs): variant is
"right" or one of the slip names, fn(*inputs) returns a 0-d tensor, and inputs are float64 CPU
tensors drawn from torch.Generator().manual_seed(seed), the checked ones with requires_grad=True.
With large=False the checked inputs hold at most 200 elements in all and the batch is >= 3, so a
checker can build the full Jacobian. With large=True every checked input holds between 45,000 and
400,000 elements, the batch is >= 64 and its first 8 rows hold at most 20,000 elements, so a
checker has to use random projections. A checker is run on each (op, slip) at both sizes and the
kind of slip it names at the large size is compared with the kind it names at the small size.

Running this file verifies the set: at the small size the right backward passes
torch.autograd.gradcheck and every slip fails it; at the large size the right backward passes a
fast-mode gradcheck and every slip's gradient differs from the right one.
"""
import torch

from draws import generator as _gen, randn as _randn, uniform as _uniform

DT = torch.float64


def _call(cls, variant):
    return lambda *inputs: cls.apply(*inputs, variant)


# xent_mean: mean softmax cross-entropy of logits z (B, C) against fixed one-hot targets y (B, C):
#   L = -(1/B) sum_b sum_c y_bc log softmax(z_b)_c,   dL/dz = g (softmax(z) - y) / B.
# no_batch_mean: the 1/B is left out (gradient B times too large).
# row_term_dropped: the softmax row term of the log-softmax backward is dropped, leaving -g y / B.
class XentMean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, z, y, variant):
        logp = torch.log_softmax(z, dim=1)
        ctx.save_for_backward(logp, y)
        ctx.variant = variant
        return -(y * logp).sum() / z.shape[0]

    @staticmethod
    def backward(ctx, g):
        logp, y = ctx.saved_tensors
        v, b = ctx.variant, logp.shape[0]
        if v == "row_term_dropped":
            dz = -y
        else:
            dz = logp.exp() - y
        scale = 1.0 if v == "no_batch_mean" else 1.0 / b
        return g * dz * scale, None, None


def make_xent_mean(variant, large, seed):
    g = _gen(seed)
    b, c = (256, 256) if large else (5, 7)
    z = (2.0 * _randn(g, b, c)).requires_grad_(True)
    cls = torch.randint(0, c, (b,), generator=g)
    y = torch.nn.functional.one_hot(cls, c).to(DT)
    return _call(XentMean, variant), (z, y)


# weighted_mse: per-sample weighted squared error between predictions p and targets q (B, T, D),
# both checked, with fixed weights w (B,):
#   L = (1/B) sum_b w_b sum_{t,d} (p - q)^2,   dL/dp = 2 g w (p - q) / B,   dL/dq = -dL/dp.
# weights_ignored: w is left out of both gradients.
# target_sign: dL/dq gets the same sign as dL/dp.
# factor_two_missing: the 2 from the derivative of the square is left out of both gradients.
class WeightedMse(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, q, w, variant):
        d = p - q
        ctx.save_for_backward(d, w)
        ctx.variant = variant
        return (w * (d * d).sum(dim=(1, 2))).sum() / p.shape[0]

    @staticmethod
    def backward(ctx, g):
        d, w = ctx.saved_tensors
        v, b = ctx.variant, d.shape[0]
        wb = torch.ones_like(w) if v == "weights_ignored" else w
        two = 1.0 if v == "factor_two_missing" else 2.0
        dp = g * two * wb[:, None, None] * d / b
        dq = dp if v == "target_sign" else -dp
        return dp, dq, None, None


def make_weighted_mse(variant, large, seed):
    g = _gen(seed)
    b, t, d = (64, 30, 30) if large else (3, 4, 5)
    p = _randn(g, b, t, d, grad=True)
    q = _randn(g, b, t, d, grad=True)
    w = _uniform(g, 0.3, 1.7, b)
    return _call(WeightedMse, variant), (p, q, w)


# gauss_nll: mean negative log-likelihood of fixed observations x (B, D) under a Gaussian with
# predicted mean mu and log-variance s (B, D), constants dropped:
#   L = (1/B) sum 0.5 (s + (x - mu)^2 exp(-s)),
#   dL/dmu = -g (x - mu) exp(-s) / B,   dL/ds = 0.5 g (1 - (x - mu)^2 exp(-s)) / B.
# mean_sign: dL/dmu has its sign flipped.
# log_term_dropped: the 1 (from the s term) is dropped from dL/ds.
# var_not_inverted: exp(s) is used where exp(-s) belongs in dL/dmu.
class GaussNll(torch.autograd.Function):
    @staticmethod
    def forward(ctx, mu, s, x, variant):
        r = x - mu
        ctx.save_for_backward(r, s)
        ctx.variant = variant
        return 0.5 * (s + r * r * torch.exp(-s)).sum() / mu.shape[0]

    @staticmethod
    def backward(ctx, g):
        r, s = ctx.saved_tensors
        v, b = ctx.variant, r.shape[0]
        inv = torch.exp(-s)
        dmu = -r * (torch.exp(s) if v == "var_not_inverted" else inv)
        if v == "mean_sign":
            dmu = -dmu
        one = 0.0 if v == "log_term_dropped" else 1.0
        ds = 0.5 * (one - r * r * inv)
        return g * dmu / b, g * ds / b, None, None


def make_gauss_nll(variant, large, seed):
    g = _gen(seed)
    b, d = (256, 256) if large else (4, 6)
    mu = _randn(g, b, d, grad=True)
    s = _uniform(g, -1.0, 1.0, b, d).requires_grad_(True)
    x = _randn(g, b, d)
    return _call(GaussNll, variant), (mu, s, x)


# kl_batchmean: batch-mean KL(P || Q) between P = softmax(a) and Q = softmax(c), a, c (B, C):
#   L = (1/B) sum_b sum_k P_bk r_bk,  r = log P - log Q,
#   dL/da = g P (r - sum_k P r) / B,   dL/dc = g (Q - P) / B.
# row_term_dropped: the per-row KL (sum_k P r) is dropped from dL/da, leaving g P r / B.
# class_mean: both gradients are divided by B*C where B belongs.
# q_sign: dL/dc has its sign flipped, g (P - Q) / B.
class KlBatchmean(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, c, variant):
        logp = torch.log_softmax(a, dim=1)
        logq = torch.log_softmax(c, dim=1)
        ctx.save_for_backward(logp, logq)
        ctx.variant = variant
        return (logp.exp() * (logp - logq)).sum() / a.shape[0]

    @staticmethod
    def backward(ctx, g):
        logp, logq = ctx.saved_tensors
        v, (b, n) = ctx.variant, logp.shape
        p, q, r = logp.exp(), logq.exp(), logp - logq
        if v == "row_term_dropped":
            da = p * r
        else:
            da = p * (r - (p * r).sum(dim=1, keepdim=True))
        dc = p - q if v == "q_sign" else q - p
        scale = 1.0 / (b * n) if v == "class_mean" else 1.0 / b
        return g * da * scale, g * dc * scale, None


def make_kl_batchmean(variant, large, seed):
    g = _gen(seed)
    b, n = (100, 500) if large else (4, 8)
    a = _randn(g, b, n, grad=True)
    c = _randn(g, b, n, grad=True)
    return _call(KlBatchmean, variant), (a, c)


# infonce: contrastive loss between rows of a and k (B, D); row i of a is paired with row i of k
# and the other rows are negatives. S = a k^T / tau (B, B), tau = 0.7, and
#   L = -(1/B) sum_i log softmax(S_i)_i,   G = g (softmax(S) - I) / B (row-wise softmax),
#   dL/da = G k / tau,   dL/dk = G^T a / tau.
# Every row of a gets gradient through every row of k and vice versa. Rows of a and k share an
# 8-dimensional component and are scaled by D^-1/2, so every entry of S (not only the diagonal) is
# O(1) at every size: the softmax rows are neither saturated nor flat, and G is far from symmetric.
# not_transposed: dL/dk uses G where G^T belongs.
# target_term_dropped: the -I (positive-pair term) is dropped from G.
# wrong_input: dL/da uses a where k belongs (G a / tau).
TAU = 0.7


class InfoNce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, k, variant):
        logp = torch.log_softmax(a @ k.T / TAU, dim=1)
        ctx.save_for_backward(a, k, logp)
        ctx.variant = variant
        return -logp.diagonal().sum() / a.shape[0]

    @staticmethod
    def backward(ctx, g):
        a, k, logp = ctx.saved_tensors
        v, b = ctx.variant, a.shape[0]
        gs = logp.exp()
        if v != "target_term_dropped":
            gs = gs - torch.eye(b, dtype=DT)
        gs = g * gs / b
        da = gs @ (a if v == "wrong_input" else k) / TAU
        dk = (gs if v == "not_transposed" else gs.T) @ a / TAU
        return da, dk, None


def make_infonce(variant, large, seed):
    g = _gen(seed)
    b, d = (256, 200) if large else (5, 4)
    basis = _randn(g, 8, d)
    a = 0.5 * (_randn(g, b, 8) @ basis + _randn(g, b, d)) / d ** 0.5
    k = 0.5 * a + 0.5 * (_randn(g, b, 8) @ basis + _randn(g, b, d)) / d ** 0.5
    return _call(InfoNce, variant), (a.requires_grad_(True), k.requires_grad_(True))


OPS = {  # op name -> (make, slips)
    "xent_mean": (make_xent_mean, ("no_batch_mean", "row_term_dropped")),
    "weighted_mse": (make_weighted_mse, ("weights_ignored", "target_sign", "factor_two_missing")),
    "gauss_nll": (make_gauss_nll, ("mean_sign", "log_term_dropped", "var_not_inverted")),
    "kl_batchmean": (make_kl_batchmean, ("row_term_dropped", "class_mean", "q_sign")),
    "infonce": (make_infonce, ("not_transposed", "target_term_dropped", "wrong_input")),
}


def _sizes(inputs):
    """Element counts of the checked inputs, the smallest batch, and the most elements in 8 rows."""
    checked = [t for t in inputs if t.requires_grad]
    first8 = max(t[:8].numel() for t in checked)
    return [t.numel() for t in checked], min(t.shape[0] for t in checked), first8


def _grad(fn, inputs):
    checked = [t for t in inputs if t.requires_grad]
    return torch.cat([t.reshape(-1) for t in torch.autograd.grad(fn(*inputs), checked)])


def _verify(seed=0):
    ok = True
    for name, (make, slips) in OPS.items():
        fn, inputs = make("right", False, seed)
        sizes, batch, _ = _sizes(inputs)
        size_ok = batch >= 3 and sum(sizes) <= 200 and fn(*inputs).dim() == 0
        fn_l, inputs_l = make("right", True, seed)
        sizes_l, batch_l, first8 = _sizes(inputs_l)
        size_ok = size_ok and batch_l >= 64 and first8 <= 20000 and fn_l(*inputs_l).dim() == 0
        size_ok = size_ok and all(45000 <= s <= 400000 for s in sizes_l)
        right_l = _grad(fn_l, inputs_l)
        for variant in ("right",) + slips:
            fn, inputs = make(variant, False, seed)
            small = torch.autograd.gradcheck(fn, inputs, raise_exception=False)
            fn_l, inputs_l = make(variant, True, seed)
            if variant == "right":
                large = torch.autograd.gradcheck(fn_l, inputs_l, fast_mode=True, raise_exception=False)
                good = small and large and size_ok
                detail = "small gradcheck %s, large fast gradcheck %s, sizes small %s large %s" % (
                    small, large, sizes, sizes_l)
                detail += " (batch %d, 8 rows %d)" % (batch_l, first8)
            else:
                diff = ((_grad(fn_l, inputs_l) - right_l).norm() / right_l.norm()).item()
                good = (not small) and diff > 1e-3
                detail = "small gradcheck %s, large gradient relative difference %.3g" % (small, diff)
            ok = ok and good
            print("%-13s %-19s %s  %s" % (name, variant, "ok  " if good else "FAIL", detail))
    return ok


if __name__ == "__main__":
    import warnings
    warnings.filterwarnings("ignore")
    raise SystemExit(0 if _verify() else 1)
