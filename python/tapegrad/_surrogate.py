"""A backward that is not its forward's derivative by design, checked against the function it declares.

A straight-through estimator rounds in its forward and passes ȳ through in its backward: the backward is the
derivative of x ↦ x, not of round. Checked against its own forward, it fails ("multiply by round′"), rightly for
the forward it has and wrongly for what its author meant. `tapegrad.gradcheck(fn, inputs, surrogate=g)` checks
fn's backward as the derivative of g instead: the op checked is `declared(fn, g)`, whose forward is g's and whose
backward is fn's own (torch's autograd through fn at the same inputs), so finite differences of g judge fn's VJP.
"""

import torch


def declared(fn, surrogate, kwargs):
    """The op whose forward is surrogate(*xs, **kwargs) and whose backward is fn's at the same xs."""

    class Declared(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *xs):
            ctx.xs = xs
            with torch.no_grad():
                return surrogate(*xs, **kwargs)

        @staticmethod
        def backward(ctx, *cotangents):
            xs = [x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor) else x for x in ctx.xs]
            wanted = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad]
            with torch.enable_grad():
                ys = fn(*xs, **kwargs)
                ys = ys if isinstance(ys, (tuple, list)) else (ys,)
                pairs = [(y, g) for y, g in zip(ys, cotangents) if isinstance(y, torch.Tensor) and y.requires_grad
                         and g is not None]
                if not pairs or not wanted:
                    raise ValueError(f"gradcheck: surrogate= checks fn's backward, but no output of fn requires grad "
                                     f"at these inputs (fn: {Declared.__name__})")
                grads = torch.autograd.grad([y for y, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
            by_input = iter(grads)
            return tuple(next(by_input) if isinstance(x, torch.Tensor) and x.requires_grad else None for x in xs)

    Declared.__name__ = Declared.__qualname__ = getattr(fn, "__name__", "op")
    return Declared.apply
