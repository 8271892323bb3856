"""SiLU, y = x·σ(x), as a torch.autograd.Function with a hand-written backward, and the slip most often made in it.

The derivative is a product rule's: dy/dx = σ(x) + x·σ(x)(1 − σ(x)). make_silu(slip) builds the Function right
(slip=None) or with its second term left out (slip="dropped_term", x̄ = ȳ·σ(x)), which tapegrad.gradcheck names
from the forward: the term through `s` in `x * s`, and the line that makes `s`.

    PYTHONPATH=build/python:examples/python python3 examples/python/silu.py
"""

import torch

import tapegrad

SLIPS = ("dropped_term",)


def make_silu(slip=None):
    if slip is not None and slip not in SLIPS:
        raise ValueError(f"no slip {slip!r}; the slips: {', '.join(SLIPS)}")

    class SiLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            s = torch.sigmoid(x)
            ctx.save_for_backward(x, s)
            return x * s

        @staticmethod
        def backward(ctx, grad):
            x, s = ctx.saved_tensors
            if slip == "dropped_term":
                return grad * s
            return grad * (s + x * s * (1 - s))

    SiLU.__name__ = "silu" if slip is None else f"silu[{slip}]"
    return SiLU


def inputs(shape=(4, 6), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True),)


def main():
    right = tapegrad.gradcheck(make_silu().apply, inputs())
    slipped = tapegrad.gradcheck(make_silu("dropped_term").apply, inputs())
    print(right)
    print(slipped)
    return 0 if right.passed and not slipped.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
