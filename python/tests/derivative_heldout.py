"""Held-out ops in which an element-wise function sits inside a larger composite, with slips in its derivative.

Each op is a torch.autograd.Function in float64 whose backward is written by hand. Its forward applies one
element-wise function f (sigmoid, tanh, exp or softplus) to an intermediate u whose shape differs from every input's
shape (a product of two inputs, or pairwise scores), then continues with a product or a sum. Each slip writes f'(u)
wrong in the backward -- as another simple function of f's own value, or left out (multiplied by 1) -- and keeps
everything else right. The set measures whether a checker names the slipped derivative, e.g. "the derivative of tanh
written as 1 - tanh where 1 - tanh^2 belongs".

    from derivative_heldout import OPS
    make, slips = OPS["gated_mlp"]
    fn, inputs = make("right", seed=0)   # or a slip's name from slips
    fn(*inputs)                          # one output tensor; every input requires grad

Run this file to verify the set: every right version passes torch.autograd.gradcheck and every slip fails it.

    /usr/bin/python3 python/tests/derivative_heldout.py
"""
import torch

RIGHT = "right"

# f'(u) for each element-wise function, as written in the right backward and in each slip; y = f(u).
DERIVATIVES = {
    "tanh": {
        RIGHT: lambda y, u: 1 - y * y,
        "square_left_out": lambda y, u: 1 - y,                           # 1 - tanh where 1 - tanh^2 belongs
        "derivative_left_out": lambda y, u: torch.ones_like(y),          # tanh' dropped (multiplied by 1)
    },
    "sigmoid": {
        RIGHT: lambda y, u: y * (1 - y),
        "sigma_for_derivative": lambda y, u: y,                          # sigma where sigma (1 - sigma) belongs
        "one_minus_sigma_for_derivative": lambda y, u: 1 - y,            # 1 - sigma where sigma (1 - sigma) belongs
    },
    "exp": {
        RIGHT: lambda y, u: y,
        "derivative_left_out": lambda y, u: torch.ones_like(y),          # exp' written as 1
        "sign_flipped": lambda y, u: -y,                                 # exp' written as -exp
    },
    "softplus": {
        RIGHT: lambda y, u: torch.sigmoid(u),
        "softplus_for_derivative": lambda y, u: y,                       # softplus where sigmoid belongs
        "derivative_left_out": lambda y, u: torch.ones_like(y),          # softplus' dropped (multiplied by 1)
    },
}


def _deriv(func, variant, y, u):
    table = DERIVATIVES[func]
    if variant not in table:
        raise ValueError(f"unknown variant {variant!r} for an op built on {func}")
    return table[variant](y, u)


def _randn(gen, *shape, scale=1.0):
    return (scale * torch.randn(*shape, generator=gen, dtype=torch.float64)).requires_grad_()


# gated_mlp: y = (tanh(x W1) * (x W2)) W3; x (N, D), W1 and W2 (D, H), W3 (H, D), H != D. tanh acts on u = x W1 (N, H).
#   square_left_out      tanh' written 1 - tanh
#   derivative_left_out  tanh' written 1
class GatedMLP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w1, w2, w3, variant):
        u = x @ w1
        h = torch.tanh(u)
        p = x @ w2
        ctx.save_for_backward(x, w1, w2, w3, u, h, p)
        ctx.variant = variant
        return (h * p) @ w3

    @staticmethod
    def backward(ctx, g):
        x, w1, w2, w3, u, h, p = ctx.saved_tensors
        gq = g @ w3.T
        gw3 = (h * p).T @ g
        gu = gq * p * _deriv("tanh", ctx.variant, h, u)
        gp = gq * h
        return gu @ w1.T + gp @ w2.T, x.T @ gu, x.T @ gp, gw3, None


def make_gated_mlp(variant, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d, h = 3, 4, 5
    inputs = (_randn(gen, n, d), _randn(gen, d, h, scale=0.5), _randn(gen, d, h, scale=0.5),
              _randn(gen, h, d, scale=0.5))
    return (lambda *a: GatedMLP.apply(*a, variant)), inputs


# sigmoid_pair_pool: y_i = sum_j sigmoid(a_i . b_j) c_j; a (N, D), b (M, D), c (M, E). sigmoid acts on the pairwise
# scores u = a b^T (N, M).
#   sigma_for_derivative            sigma' written sigma (the factor 1 - sigma left out)
#   one_minus_sigma_for_derivative  sigma' written 1 - sigma (the factor sigma left out)
class SigmoidPairPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b, c, variant):
        u = a @ b.T
        s = torch.sigmoid(u)
        ctx.save_for_backward(a, b, c, u, s)
        ctx.variant = variant
        return s @ c

    @staticmethod
    def backward(ctx, g):
        a, b, c, u, s = ctx.saved_tensors
        gu = (g @ c.T) * _deriv("sigmoid", ctx.variant, s, u)
        return gu @ b, gu.T @ a, s.T @ g, None


def make_sigmoid_pair_pool(variant, seed):
    gen = torch.Generator().manual_seed(seed)
    n, m, d, e = 3, 5, 4, 2
    inputs = (_randn(gen, n, d, scale=0.5), _randn(gen, m, d, scale=0.5), _randn(gen, m, e))
    return (lambda *a: SigmoidPairPool.apply(*a, variant)), inputs


# exp_kernel_sum: y_i = sum_j exp(-|x_i - z_j|^2 / 2) v_j; x (N, P), z (M, P), v (M, K). exp acts on
# u_ij = -|x_i - z_j|^2 / 2 (N, M); du_ij/dx_i = -(x_i - z_j), du_ij/dz_j = x_i - z_j.
#   derivative_left_out  exp' written 1
#   sign_flipped         exp' written -exp
class ExpKernelSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, z, v, variant):
        diff = x[:, None, :] - z[None, :, :]
        u = -0.5 * (diff * diff).sum(-1)
        k = torch.exp(u)
        ctx.save_for_backward(v, diff, u, k)
        ctx.variant = variant
        return k @ v

    @staticmethod
    def backward(ctx, g):
        v, diff, u, k = ctx.saved_tensors
        gu = (g @ v.T) * _deriv("exp", ctx.variant, k, u)
        gdiff = gu[:, :, None] * diff
        return -gdiff.sum(1), gdiff.sum(0), k.T @ g, None


def make_exp_kernel_sum(variant, seed):
    gen = torch.Generator().manual_seed(seed)
    n, m, p, k = 3, 4, 2, 3
    inputs = (_randn(gen, n, p, scale=0.5), _randn(gen, m, p, scale=0.5), _randn(gen, m, k))
    return (lambda *a: ExpKernelSum.apply(*a, variant)), inputs


# softplus_bilinear: y = softplus(x A z^T) v; x (N, D), A (D, E), z (M, E), v (M, K). softplus acts on the bilinear
# scores u = x A z^T (N, M); softplus' = sigmoid.
#   softplus_for_derivative  softplus' written softplus
#   derivative_left_out      softplus' written 1
class SoftplusBilinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, a, z, v, variant):
        u = x @ a @ z.T
        s = torch.nn.functional.softplus(u)
        ctx.save_for_backward(x, a, z, v, u, s)
        ctx.variant = variant
        return s @ v

    @staticmethod
    def backward(ctx, g):
        x, a, z, v, u, s = ctx.saved_tensors
        gu = (g @ v.T) * _deriv("softplus", ctx.variant, s, u)
        return gu @ z @ a.T, x.T @ gu @ z, gu.T @ x @ a, s.T @ g, None


def make_softplus_bilinear(variant, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d, e, m, k = 3, 4, 3, 5, 2
    inputs = (_randn(gen, n, d, scale=0.5), _randn(gen, d, e, scale=0.5), _randn(gen, m, e, scale=0.5),
              _randn(gen, m, k))
    return (lambda *a: SoftplusBilinear.apply(*a, variant)), inputs


# tanh_capped_logits: y = c tanh(x W^T / c) V with a fixed cap c = 3; x (N, D), W (M, D), V (M, K). tanh acts on the
# scaled logits u = x W^T / c (N, M).
#   square_left_out      tanh' written 1 - tanh
#   derivative_left_out  tanh' written 1
CAP = 3.0


class TanhCappedLogits(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, v, variant):
        u = x @ w.T / CAP
        t = torch.tanh(u)
        ctx.save_for_backward(x, w, v, u, t)
        ctx.variant = variant
        return CAP * t @ v

    @staticmethod
    def backward(ctx, g):
        x, w, v, u, t = ctx.saved_tensors
        gu = CAP * (g @ v.T) * _deriv("tanh", ctx.variant, t, u)
        return gu @ w / CAP, gu.T @ x / CAP, CAP * t.T @ g, None


def make_tanh_capped_logits(variant, seed):
    gen = torch.Generator().manual_seed(seed)
    n, d, m, k = 3, 4, 5, 3
    inputs = (_randn(gen, n, d), _randn(gen, m, d), _randn(gen, m, k, scale=0.5))
    return (lambda *a: TanhCappedLogits.apply(*a, variant)), inputs


OPS = {  # op name -> (make, slips)
    "gated_mlp": (make_gated_mlp, ("square_left_out", "derivative_left_out")),
    "sigmoid_pair_pool": (make_sigmoid_pair_pool, ("sigma_for_derivative", "one_minus_sigma_for_derivative")),
    "exp_kernel_sum": (make_exp_kernel_sum, ("derivative_left_out", "sign_flipped")),
    "softplus_bilinear": (make_softplus_bilinear, ("softplus_for_derivative", "derivative_left_out")),
    "tanh_capped_logits": (make_tanh_capped_logits, ("square_left_out", "derivative_left_out")),
}


if __name__ == "__main__":
    ok = True
    for name, (make, slips) in OPS.items():
        for variant in (RIGHT,) + slips:
            fn, inputs = make(variant, seed=0)
            out = fn(*inputs)
            sizes = [out.numel() * x.numel() for x in inputs]
            passed = torch.autograd.gradcheck(fn, inputs, raise_exception=False)
            good = passed == (variant == RIGHT) and max(sizes) <= 10_000
            ok = ok and good
            print(f"{name:20s} {variant:32s} gradcheck {'pass' if passed else 'fail'}"
                  f"  max jacobian {max(sizes):5d}  {'ok' if good else 'WRONG'}")
    print("all as expected" if ok else "SOME NOT AS EXPECTED")
