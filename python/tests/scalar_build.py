"""Ops for measuring how the Python module's float64 check names a slip of a scalar loss at sizes it checks by random
projections: each returns a 0-d loss over a batch, so y has no axis to cut and the op is cut along its inputs' batch.
A slip should get at size the kind it gets at a small size. scalar_heldout.py is the same kind of set, written apart;
python/tools/narrow_table.py reads both.

OPS maps an op's name to (make, slips); make(variant, large, seed) gives (fn, inputs), variant "right" or a slip."""
import torch


def _draw(seed):
    g = torch.Generator().manual_seed(seed)
    return lambda *shape, grad=True: torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)


class _WeightedMSE(torch.autograd.Function):
    """L = Σ_b w_b · ‖p_b − t_b‖² / B over predictions p (B, D), fixed targets t (B, D) and weights w (B, 1):
    p̄ = 2·w·(p − t)·L̄/B."""
    slip = "right"

    @staticmethod
    def forward(ctx, p, t, w):
        ctx.save_for_backward(p, t, w)
        return (w * (p - t) ** 2).sum() / p.shape[0]

    @classmethod
    def backward(cls, ctx, gl):
        p, t, w = ctx.saved_tensors
        gp = 2 * w * (p - t) * gl / p.shape[0]
        if cls.slip == "weights_ignored":
            gp = 2 * (p - t) * gl / p.shape[0]
        if cls.slip == "no_factor_two":
            gp = gp / 2
        return gp, None, None


def make_weighted_mse(variant, large, seed):
    b, d = (256, 256) if large else (4, 5)
    draw = _draw(seed)
    w = torch.rand(b, 1, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64) + 0.5
    cls = type("WeightedMSE", (_WeightedMSE,), {"slip": variant})
    return cls.apply, (draw(b, d), draw(b, d, grad=False), w)


class _CrossEntropy(torch.autograd.Function):
    """L = −Σ_b log softmax(z_b)[target_b] / B over logits z (B, C) and fixed one-hot targets q (B, C):
    z̄ = (softmax(z) − q)·L̄/B."""
    slip = "right"

    @staticmethod
    def forward(ctx, z, q):
        logp = torch.log_softmax(z, -1)
        ctx.save_for_backward(logp, q)
        return -(logp * q).sum() / z.shape[0]

    @classmethod
    def backward(cls, ctx, gl):
        logp, q = ctx.saved_tensors
        p = logp.exp()
        if cls.slip == "probabilities_term_dropped":  # the normalizer's term: −q where p − q belongs
            return -q * gl / p.shape[0], None
        gz = (p - q) * gl / p.shape[0]
        return (-gz if cls.slip == "sign" else gz), None


def make_cross_entropy(variant, large, seed):
    b, c = (512, 128) if large else (4, 5)
    draw = _draw(seed)
    target = torch.randint(0, c, (b,), generator=torch.Generator().manual_seed(seed + 1))
    cls = type("CrossEntropy", (_CrossEntropy,), {"slip": variant})
    return cls.apply, (draw(b, c), torch.nn.functional.one_hot(target, c).double())


class _CosineEmbedding(torch.autograd.Function):
    """L = Σ_b (1 − cos(u_b, v_b)) / B over two batches of embeddings (B, D): ū_b = −(v̂_b − cos·û_b)/‖u_b‖/B."""
    slip = "right"

    @staticmethod
    def forward(ctx, u, v):
        nu, nv = u.norm(dim=-1, keepdim=True), v.norm(dim=-1, keepdim=True)
        cos = (u * v).sum(-1, keepdim=True) / (nu * nv)
        ctx.save_for_backward(u, v, nu, nv, cos)
        return (1 - cos).sum() / u.shape[0]

    @classmethod
    def backward(cls, ctx, gl):
        u, v, nu, nv, cos = ctx.saved_tensors
        scale = gl / u.shape[0]
        gu = -(v / nv - cos * u / nu) / nu * scale
        gv = -(u / nu - cos * v / nv) / nv * scale
        if cls.slip == "projection_dropped":  # the part of v̂ along û left in: −v̂/‖u‖ alone
            gu = -(v / nv) / nu * scale
        if cls.slip == "no_batch_mean":
            gu, gv = gu * u.shape[0], gv * u.shape[0]
        return gu, gv


def make_cosine_embedding(variant, large, seed):
    b, d = (256, 192) if large else (3, 4)
    draw = _draw(seed)
    cls = type("CosineEmbedding", (_CosineEmbedding,), {"slip": variant})
    return cls.apply, (draw(b, d), draw(b, d))


OPS = {
    "weighted_mse": (make_weighted_mse, ("weights_ignored", "no_factor_two")),
    "cross_entropy": (make_cross_entropy, ("probabilities_term_dropped", "sign")),
    "cosine_embedding": (make_cosine_embedding, ("projection_dropped", "no_batch_mean")),
}

if __name__ == "__main__":
    for op, (make, slips) in OPS.items():
        for variant in ("right",) + slips:
            fn, inputs = make(variant, False, 0)
            small = torch.autograd.gradcheck(fn, inputs, raise_exception=False)
            print(f"{op:20} {variant:28} small {'passes' if small else 'fails'}")
