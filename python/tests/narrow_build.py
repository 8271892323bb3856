"""Ops for measuring how the Python module's float64 check names a slip at sizes it checks by random projections:
each op takes a fixed tensor (a mask, a target, a bias broadcast from the right) beside the checked ones, so that a
cut along y's axes must cut the fixed tensor too. A slip should get at size the kind it gets at a small size, where
the Jacobian is checked in full. narrow_heldout.py is the same kind of set, written apart; python/tools/narrow_table.py
reads both.

OPS maps an op's name to (make, slips); make(variant, large, seed) gives (fn, inputs), variant "right" or a slip."""
import torch


def _draw(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda *shape, grad=True: torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)


def _softmax_backward(a, da, slip=False):
    """A = softmax(S) along the last axis: dS = A ⊙ (dA − rowsum(A ⊙ dA)); the slip drops the row term."""
    return a * da if slip else a * (da - (a * da).sum(-1, keepdim=True))


def _attention_forward(ctx, q, k, v, additive):
    """O = softmax(Q Kᵀ/√d + additive) V, saving Q, K, V and A = softmax(·) for the backward."""
    a = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + additive, -1)
    ctx.save_for_backward(q, k, v, a)
    return a @ v


class _AttentionWithBias(torch.autograd.Function):
    """O = softmax(Q Kᵀ/√d + bias) V over (B, h, T, d), with a trainable bias (h, T, T) shared by the batch."""
    slip = "right"

    @staticmethod
    def forward(ctx, q, k, v, bias):
        return _attention_forward(ctx, q, k, v, bias)

    @classmethod
    def backward(cls, ctx, go):
        q, k, v, a = ctx.saved_tensors
        s = q.shape[-1] ** -0.5
        ds = _softmax_backward(a, go @ v.transpose(-1, -2), cls.slip == "row_term")
        dbias = ds[0] if cls.slip == "first_batch" else ds.sum(0)  # the bias is added to every batch element
        dq = ds @ k * (q.shape[-1] ** 0.5 if cls.slip == "sqrt_d" else s)
        return dq, ds.transpose(-1, -2) @ q * s, a.transpose(-1, -2) @ go, dbias


def make_attention_with_bias(variant, large, seed):
    b, h, t, d = (4, 3, 16, 16) if large else (2, 2, 3, 4)
    draw = _draw(seed)
    cls = type("AttentionWithBias", (_AttentionWithBias,), {"slip": variant})
    return cls.apply, (draw(b, h, t, d), draw(b, h, t, d), draw(b, h, t, d), draw(h, t, t))


class _CrossAttentionPadded(torch.autograd.Function):
    """O = softmax(Q Kᵀ/√d + M) V with queries (B, T, d), keys and values (B, Tk, d) and a fixed padding mask M of
    shape (B, 1, Tk): 0 where a key is real, −∞ where it is padding (every row keeps at least one key)."""
    slip = "right"

    @staticmethod
    def forward(ctx, q, k, v, mask):
        return _attention_forward(ctx, q, k, v, mask)

    @classmethod
    def backward(cls, ctx, go):
        q, k, v, a = ctx.saved_tensors
        s = q.shape[-1] ** -0.5
        da = go @ v.transpose(-1, -2)
        ds = _softmax_backward(a, da, cls.slip == "row_term")
        dv = a.transpose(-1, -2) @ go
        if cls.slip == "dv_sign":
            dv = -dv
        return ds @ k * s, ds.transpose(-1, -2) @ q * s, dv, None


def make_cross_attention_padded(variant, large, seed):
    b, t, tk, d = (4, 16, 16, 16) if large else (2, 3, 3, 4)
    draw = _draw(seed)
    mask = torch.zeros(b, 1, tk, dtype=torch.float64)
    for i in range(b):
        mask[i, 0, tk - i % tk:] = float("-inf") if i % tk else 0.0  # element i pads its last i keys
    cls = type("CrossAttentionPadded", (_CrossAttentionPadded,), {"slip": variant})
    return cls.apply, (draw(b, t, d), draw(b, tk, d), draw(b, tk, d), mask)


class _FocalLoss(torch.autograd.Function):
    """Per-element focal loss L = −(1 − p)^γ · log p with p = softmax(z)[target] over classes, z (B, N, C), the
    fixed target as a one-hot (B, N, C), γ = 2: dL/dz = (dL/dp)·p·(onehot − P), dL/dp = γ(1 − p)^(γ−1) log p −
    (1 − p)^γ / p."""
    slip = "right"

    @staticmethod
    def forward(ctx, z, onehot):
        probs = torch.softmax(z, -1)
        p = (probs * onehot).sum(-1)
        ctx.save_for_backward(probs, onehot, p)
        return -(1 - p) ** 2 * torch.log(p)

    @classmethod
    def backward(cls, ctx, gl):
        probs, onehot, p = ctx.saved_tensors
        gamma = 2.0
        dl_dp = gamma * (1 - p) * torch.log(p) - (1 - p) ** 2 / p
        if cls.slip == "focal_term_dropped":  # the weight's own derivative left out, as for cross-entropy
            dl_dp = -(1 - p) ** 2 / p
        if cls.slip == "sign":
            dl_dp = -dl_dp
        grad_z = (gl * dl_dp * p).unsqueeze(-1) * (onehot - probs)
        if cls.slip == "target_ignored":  # softmax's Jacobian row of class 0, not the target's
            grad_z = (gl * dl_dp * p).unsqueeze(-1) * (torch.nn.functional.one_hot(
                torch.zeros_like(p, dtype=torch.long), probs.shape[-1]).double() - probs)
        return grad_z, None


def make_focal_loss(variant, large, seed):
    b, n, c = (8, 16, 24) if large else (2, 3, 4)
    draw = _draw(seed)
    target = torch.randint(1, c, (b, n), generator=torch.Generator().manual_seed(seed + 1))
    onehot = torch.nn.functional.one_hot(target, c).double()
    cls = type("FocalLoss", (_FocalLoss,), {"slip": variant})
    return cls.apply, (draw(b, n, c), onehot)


class _BiasDropoutAdd(torch.autograd.Function):
    """y = residual + keep ⊙ (x + b) / (1 − p) with a fixed keep-mask (B, T, D) drawn once, b (D) broadcast on the
    right, p = 0.25: x̄ = keep ⊙ ȳ/(1 − p), b̄ = Σ over (B, T) of x̄, r̄ = ȳ."""
    slip = "right"

    @staticmethod
    def forward(ctx, x, b, residual, keep):
        ctx.save_for_backward(keep)
        return residual + keep * (x + b) / 0.75

    @classmethod
    def backward(cls, ctx, gy):
        (keep,) = ctx.saved_tensors
        gx = gy / 0.75 if cls.slip == "mask_ignored" else keep * gy / 0.75
        if cls.slip == "unscaled":
            gx = keep * gy
        gb = gx.sum((0, 1))
        return gx, gb, gy, None


def make_bias_dropout_add(variant, large, seed):
    b, t, d = (6, 24, 32) if large else (2, 3, 4)
    draw = _draw(seed)
    keep = (torch.rand(b, t, d, generator=torch.Generator().manual_seed(seed + 1)) > 0.25).double()
    cls = type("BiasDropoutAdd", (_BiasDropoutAdd,), {"slip": variant})
    return cls.apply, (draw(b, t, d), draw(d), draw(b, t, d), keep)


OPS = {
    "attention_with_bias": (make_attention_with_bias, ("row_term", "first_batch", "sqrt_d")),
    "cross_attention_padded": (make_cross_attention_padded, ("row_term", "dv_sign")),
    "focal_loss": (make_focal_loss, ("focal_term_dropped", "sign", "target_ignored")),
    "bias_dropout_add": (make_bias_dropout_add, ("mask_ignored", "unscaled")),
}

if __name__ == "__main__":
    for op, (make, slips) in OPS.items():
        for variant in ("right",) + slips:
            fn, inputs = make(variant, False, 0)
            small = torch.autograd.gradcheck(fn, inputs, raise_exception=False)
            fn, inputs = make(variant, True, 0)
            large = torch.autograd.gradcheck(fn, inputs, fast_mode=True, raise_exception=False)
            verdicts = ["passes" if ok else "fails" for ok in (small, large)]
            print(f"{op:24} {variant:20} small {verdicts[0]}, large {verdicts[1]}")
