"""Attention with a trainable bias on the scores, and its gradient dB, checked by tapegrad.gradcheck.

The forward is O = A·V with A = softmax(S) row by row and S = Q·Kᵀ/√d + B, B of the scores' shape. B enters S
with coefficient 1, so its gradient is the scores' own: dB = dS = A ⊙ (dA − rowsum(A ⊙ dA)) with dA = dO·Vᵀ
("Attention and its gradient", docs/derivations.md section 5). That post's code computes dS this way; its prose
writes dS = dA ⊙ (dA − (dA·Aᵀ)·1), which squares the cotangent. make_attention_bias("prose") builds the prose
version; tapegrad names what is wrong with it: it is not linear in dO, which no backward may be (a VJP is a
linear map of the cotangent), where an allclose against autograd only says that the numbers differ.
"""

import math
import sys

import torch

FORMS = ("code", "prose")


def make_attention_bias(form="code"):
    if form not in FORMS:
        raise ValueError(f"no form {form!r}; the forms: {', '.join(FORMS)}")

    class AttentionBias(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, b):
            inv_sqrt_d = 1.0 / math.sqrt(q.shape[-1])
            a = torch.softmax(q @ k.transpose(-2, -1) * inv_sqrt_d + b, dim=-1)
            ctx.save_for_backward(q, k, v, a)
            return a @ v

        @staticmethod
        def backward(ctx, d_out):
            q, k, v, a = ctx.saved_tensors
            inv_sqrt_d = 1.0 / math.sqrt(q.shape[-1])
            d_a = d_out @ v.transpose(-2, -1)
            if form == "prose":
                d_s = d_a * (d_a - (d_a @ a.transpose(-2, -1)).sum(dim=-1, keepdim=True))
            else:
                d_s = a * (d_a - (a * d_a).sum(dim=-1, keepdim=True))
            return d_s @ k * inv_sqrt_d, d_s.transpose(-2, -1) @ q * inv_sqrt_d, a.transpose(-2, -1) @ d_out, d_s

    AttentionBias.__name__ = AttentionBias.__qualname__ = f"attention_bias[{form}]"
    return AttentionBias


def inputs(n=6, d=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(n, d, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))
    b = torch.randn(n, n, dtype=torch.float64, generator=g, requires_grad=True)
    return q, k, v, b


def main():
    import tapegrad

    for form in FORMS:
        print(tapegrad.gradcheck(make_attention_bias(form).apply, inputs()))
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
