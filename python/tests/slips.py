"""Small torch ops with a hand-written backward, right or with one planted slip, as the C++ suite plants them
(tests/gradcheck_test.cpp): each is a torch.autograd.Function without a jvp, so only reverse mode is checked."""

import torch


def function(name, forward, backward):
    """A torch.autograd.Function of its inputs from a forward and a backward(inputs, y, ȳ) → gradients."""

    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *xs):
            y = forward(*xs)
            ctx.save_for_backward(*xs, y)
            return y

        @staticmethod
        def backward(ctx, g):
            *xs, y = ctx.saved_tensors
            return backward(xs, y, g)

    Op.__name__ = Op.__qualname__ = name
    return Op.apply


def softmax_rows(x):
    return torch.softmax(x, dim=-1)


def gated(x, w, b):
    """y = (x·W) ⊙ x + b: a product gated by its input, with a bias."""
    return (x @ w) * x + b


def gated_vjp(x, w, g, slip=False):
    """x̄ = (ȳ ⊙ x)·Wᵀ + ȳ ⊙ (x·W), W̄ = xᵀ·(ȳ ⊙ x), b̄ = Σ_rows ȳ; slip=True subtracts the first term of x̄."""
    d_x = g * (x @ w) - (g * x) @ w.T if slip else (g * x) @ w.T + g * (x @ w)
    return d_x, x.T @ (g * x), g.sum(0)


# slip → (op, input shapes, the finding kind the checker must name, the input it names)
SLIPS = {
    "sign": (function("sin[sign]", torch.sin, lambda xs, y, g: (-torch.cos(xs[0]) * g,)),
             [(3, 4)], "sign", "x0"),
    "scale": (function("square[scale]", torch.square, lambda xs, y, g: (xs[0] * g,)),
              [(3, 4)], "scale", "x0"),
    "zero": (function("exp[zero]", torch.exp, lambda xs, y, g: (torch.zeros_like(g),)),
             [(3, 4)], "zero", "x0"),
    "not_finite": (function("exp[nan]", torch.exp, lambda xs, y, g: (g * float("nan"),)),
                   [(3, 4)], "not_finite", "x0"),
    "transposed_input": (function("matmul[dW transposed]", torch.matmul,
                                  lambda xs, y, g: (g @ xs[1].T, (xs[0].T @ g).T)),
                         [(3, 4), (4, 4)], "transposed_input", "x1"),
    "one_input": (function("mul[db]", torch.mul, lambda xs, y, g: (g * xs[1], g * xs[0] * 1.5)),
                  [(3, 4), (3, 4)], "one_input", "x1"),
    "per_row_term": (function("softmax[no −<p, ȳ> p]", softmax_rows, lambda xs, y, g: (y * g,)),
                     [(4, 5)], "per_row_term", "x0"),
    "transposed_term": (function("gram[ȳ for ȳᵀ]", lambda x: x @ x.T,
                                 lambda xs, y, g: (g @ xs[0] + g @ xs[0],)),
                        [(4, 3)], "transposed_term", "x0"),
    "term_sign": (function("gated[− for +]", gated, lambda xs, y, g: gated_vjp(*xs[:2], g, slip=True)),
                  [(4, 3), (3, 3), (3,)], "term_sign", "x0"),
    "diagonal": (function("softmax[no p ⊙ ȳ]", softmax_rows,
                          lambda xs, y, g: (-y * (y * g).sum(-1, keepdim=True),)),
                 [(4, 5)], "diagonal", "x0"),
}

CORRECT = {
    "sin": (function("sin", torch.sin, lambda xs, y, g: (torch.cos(xs[0]) * g,)), [(3, 4)]),
    "matmul": (function("matmul", torch.matmul, lambda xs, y, g: (g @ xs[1].T, xs[0].T @ g)), [(3, 4), (4, 4)]),
    "gated": (function("gated", gated, lambda xs, y, g: gated_vjp(*xs[:2], g)), [(4, 3), (3, 3), (3,)]),
    "softmax": (function("softmax", softmax_rows,
                         lambda xs, y, g: (y * (g - (y * g).sum(-1, keepdim=True)),)), [(4, 5)]),
}


def random_inputs(shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, dtype=torch.float64, generator=gen, requires_grad=True) for s in shapes)
