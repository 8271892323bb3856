"""Standard attention with a hand-derived backward, checked by tapegrad.gradcheck.

The forward is O = P·V with P = softmax(S) row by row and S = Q·Kᵀ/√d. Its backward, derived as in "An explicit
formula for the gradient of the standard attention map" (docs/derivations.md, section 2), for a cotangent dO:

    dV = Pᵀ·dO                        dP = dO·Vᵀ
    dS = P ⊙ (dP − rowsum(dP ⊙ P))    (each row: the softmax's Jacobian diag(p) − p·pᵀ applied to that row of dP)
    dQ = dS·K/√d                      dK = dSᵀ·Q/√d

make_attention(slip) builds it as a torch.autograd.Function, right (slip=None) or with one of three slips a
derivation easily makes; what the checker says of each (run this file to see the reports):

    "transposed_dK"   dK = dS·Q/√d: the transpose of dS forgotten         → transposed_term (k), one_input (k):
                      an (n, n) value of the backward transposed is no axis of k or of y, so no kind of the
                      Jacobian fits; the checker traces this backward into formulas and finds that transposing
                      d_s where the dK line reads it puts the rule right
    "no_row_term"     dS = P ⊙ dP: the −p·pᵀ part of softmax's Jacobian   → term_dropped (q, k), per_row_term (q)
    "no_scale_dQ"     dQ = dS·K: the 1/√d left out                        → scale (c = √d, printed), one_input (q)

The backward is made of torch ops, so torch can differentiate it again (double backward) and
tapegrad.gradcheck(..., order=2) checks H·t. It recomputes P from the saved Q and K: a P saved by forward (where
autograd does not record) is a constant to the double backward, which then misses every term through P — first
order is right, second order is not, and make_attention(saved_p=True) shows the checker saying so.

with_jvp=True adds the forward-mode rule (always right here), so that forward mode is checked too:
    Ṡ = (Q̇·Kᵀ + Q·K̇ᵀ)/√d,   Ṗ = P ⊙ (Ṡ − rowsum(Ṡ ⊙ P)),   Ȯ = Ṗ·V + P·V̇
"""

import math
import sys

import torch

SLIPS = ("transposed_dK", "no_row_term", "no_scale_dQ")


def make_attention(slip=None, saved_p=False, with_jvp=False):
    if slip is not None and slip not in SLIPS:
        raise ValueError(f"no slip {slip!r}; the slips: {', '.join(SLIPS)}")

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            inv_sqrt_d = 1.0 / math.sqrt(q.shape[-1])
            p = torch.softmax(q @ k.transpose(-2, -1) * inv_sqrt_d, dim=-1)
            ctx.save_for_backward(q, k, v, p)
            ctx.forward_inputs = (q, k, v, p)  # for jvp (forward mode has no saved_tensors)
            return p @ v

        @staticmethod
        def backward(ctx, d_out):
            q, k, v, p = ctx.saved_tensors
            inv_sqrt_d = 1.0 / math.sqrt(q.shape[-1])
            if not saved_p:
                p = torch.softmax(q @ k.transpose(-2, -1) * inv_sqrt_d, dim=-1)
            d_v = p.transpose(-2, -1) @ d_out
            d_p = d_out @ v.transpose(-2, -1)
            if slip == "no_row_term":
                d_s = p * d_p
            else:
                d_s = p * (d_p - (d_p * p).sum(dim=-1, keepdim=True))
            d_q = d_s @ k if slip == "no_scale_dQ" else d_s @ k * inv_sqrt_d
            d_k = d_s @ q * inv_sqrt_d if slip == "transposed_dK" else d_s.transpose(-2, -1) @ q * inv_sqrt_d
            return d_q, d_k, d_v

        @staticmethod
        def jvp(ctx, dq, dk, dv):
            q, k, v, p = ctx.forward_inputs
            inv_sqrt_d = 1.0 / math.sqrt(q.shape[-1])
            d_s = (dq @ k.transpose(-2, -1) + q @ dk.transpose(-2, -1)) * inv_sqrt_d
            d_p = p * (d_s - (d_s * p).sum(dim=-1, keepdim=True))
            return d_p @ v + p @ dv

    if not with_jvp:
        del Attention.jvp
    name = "attention" if slip is None else f"attention[{slip}]"
    Attention.__name__ = Attention.__qualname__ = name + ("[saved P]" if saved_p else "")
    return Attention


def inputs(n=8, d=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(n, d, dtype=torch.float64, generator=g, requires_grad=True) for _ in range(3))


def main():
    import tapegrad

    for slip in (None,) + SLIPS:
        report = tapegrad.gradcheck(make_attention(slip).apply, inputs())
        print(report)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
