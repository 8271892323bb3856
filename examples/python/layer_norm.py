"""Layer norm over the last axis as a torch.autograd.Function with a hand-written backward, and a slip that a first
derivation easily makes in it, checked by tapegrad.gradcheck.

Per row: x̂ = (x − mean x)·ρ with ρ = 1/√(var x + ε), y = w ⊙ x̂ + b. With ĝ = w ⊙ ȳ the backward is

    x̄ = ρ·(ĝ − mean(ĝ) − x̂·mean(x̂ ⊙ ĝ)),    w̄ = Σ_rows ȳ ⊙ x̂,    b̄ = Σ_rows ȳ

(docs/learn.md, section 4). make_layer_norm(slip) builds it right (slip=None) or with the last term of x̄ left
out (slip="dropped_row_term", x̄ = ρ·(ĝ − mean ĝ)): the term through ρ, which every entry of the row moves.
tapegrad names it from the forward (the product rule's term through rho, dropped), then its per-row term; w, b right.

    PYTHONPATH=build/python:examples/python python3 examples/python/layer_norm.py
"""

import sys

import torch

SLIPS = ("dropped_row_term",)
EPS = 1e-5


def make_layer_norm(slip=None):
    if slip is not None and slip not in SLIPS:
        raise ValueError(f"no slip {slip!r}; the slips: {', '.join(SLIPS)}")

    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            xc = x - x.mean(dim=-1, keepdim=True)
            rho = 1.0 / torch.sqrt((xc * xc).mean(dim=-1, keepdim=True) + EPS)
            xh = xc * rho
            ctx.save_for_backward(x, w)
            return w * xh + b

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            xc = x - x.mean(dim=-1, keepdim=True)
            rho = 1.0 / torch.sqrt((xc * xc).mean(dim=-1, keepdim=True) + EPS)
            xh = xc * rho
            gh = w * g
            if slip == "dropped_row_term":
                dx = rho * (gh - gh.mean(dim=-1, keepdim=True))
            else:
                dx = rho * (gh - gh.mean(dim=-1, keepdim=True) - xh * (xh * gh).mean(dim=-1, keepdim=True))
            rows = tuple(range(g.dim() - 1))
            return dx, (g * xh).sum(dim=rows), g.sum(dim=rows)

    LayerNorm.__name__ = LayerNorm.__qualname__ = "layer_norm" if slip is None else f"layer_norm[{slip}]"
    return LayerNorm


def inputs(rows=4, cols=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(cols, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(cols, dtype=torch.float64, generator=gen, requires_grad=True)
    return x, w, b


def main():
    import tapegrad

    right = tapegrad.gradcheck(make_layer_norm().apply, inputs())
    slipped = tapegrad.gradcheck(make_layer_norm("dropped_row_term").apply, inputs())
    print(right)
    print()
    print(slipped)
    return 0 if right.passed and not slipped.passed else 1


if __name__ == "__main__":
    sys.exit(main())
