"""Ops whose forward applies an element-wise function inside a composite (its output is no input's shape), with
slips that write that function's derivative wrong: the set the naming of such a slip is built on.
derivative_heldout.py is the same kind of set, written apart; python/tests/test_forward_derivative_inside.py reads
both.

OPS maps an op's name to (make, slips); make(variant, seed) gives (fn, inputs), variant "right" or a slip."""
import torch


def _draw(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda *shape: (0.5 * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()


class _SigmoidAttention(torch.autograd.Function):
    """O = σ(S) V with S = QKᵀ/√d: dS = dA ⊙ σ′(S), σ′ = A ⊙ (1 − A)."""
    slip = "right"

    @staticmethod
    def forward(ctx, q, k, v):
        a = torch.sigmoid(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5)
        ctx.save_for_backward(q, k, v, a)
        return a @ v

    @classmethod
    def backward(cls, ctx, go):
        q, k, v, a = ctx.saved_tensors
        da = go @ v.transpose(-1, -2)
        derivative = {"sigma_for_derivative": a, "right": a * (1 - a)}[cls.slip]
        ds = da * derivative
        c = q.shape[-1] ** -0.5
        return ds @ k * c, ds.transpose(-1, -2) @ q * c, a.transpose(-1, -2) @ go


def make_sigmoid_attention(variant, seed):
    draw = _draw(seed)
    cls = type("SigmoidAttention", (_SigmoidAttention,), {"slip": variant})
    return cls.apply, (draw(2, 5, 4), draw(2, 5, 4), draw(2, 5, 4))


class _TanhLayer(torch.autograd.Function):
    """y = tanh(x W) v over x (N, D), W (D, H), v (H,): the hidden pre-activation's ū = (ȳ vᵀ) ⊙ (1 − h²)."""
    slip = "right"

    @staticmethod
    def forward(ctx, x, w, v):
        h = torch.tanh(x @ w)
        ctx.save_for_backward(x, w, v, h)
        return h @ v

    @classmethod
    def backward(cls, ctx, gy):
        x, w, v, h = ctx.saved_tensors
        gh = gy[:, None] * v[None, :]
        derivative = {"square_left_out": 1 - h, "derivative_left_out": torch.ones_like(h), "right": 1 - h * h}
        gu = gh * derivative[cls.slip]
        return gu @ w.T, x.T @ gu, h.T @ gy


def make_tanh_layer(variant, seed):
    draw = _draw(seed)
    cls = type("TanhLayer", (_TanhLayer,), {"slip": variant})
    return cls.apply, (draw(6, 4), draw(4, 5), draw(5))


OPS = {
    "sigmoid_attention": (make_sigmoid_attention, ("sigma_for_derivative",)),
    "tanh_layer": (make_tanh_layer, ("square_left_out", "derivative_left_out")),
}

if __name__ == "__main__":
    for op, (make, slips) in OPS.items():
        for variant in ("right",) + slips:
            fn, inputs = make(variant, 0)
            ok = torch.autograd.gradcheck(fn, inputs, raise_exception=False)
            print(f"{op:20} {variant:22} {'passes' if ok else 'fails'}")
