"""A slip in one block of a gradient: fn's own backward with one row, one column or one batch element of one
input's gradient multiplied by a factor, at one dtype only (fn in float64 stays right). Used by
python/tools/partial_table.py and test_precision.py."""

import torch


def blocks(shape):
    """The blocks a slip may sit in, by name: index expressions into x̄."""
    out = {}
    if len(shape) >= 2 and shape[-2] > 1:
        out["row"] = (Ellipsis, 1, slice(None))
    if len(shape) >= 2 and shape[-1] > 1:
        out["column"] = (Ellipsis, 1)
    if len(shape) >= 3 and shape[0] > 1:
        out["batch"] = (1,)
    return out


def _has(shape, block):
    """Whether x̄ of this shape has the block (index 1 along its axis)."""
    if block == (Ellipsis,):  # the whole gradient
        return True
    if block[0] is Ellipsis:
        return len(shape) >= len(block) - 1 and shape[len(shape) - len(block) + 1] > 1
    return shape[0] > 1


def one_block_off(fn, slot, block, factor, dtype):
    """fn with the gradient of its input `slot` multiplied by factor over `block`, when that input is at dtype."""
    class OneBlockOff(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *xs):
            ctx.xs = xs
            return fn(*xs)

        @staticmethod
        def backward(ctx, g):
            with torch.enable_grad():  # fn again, for its own backward (which the checker may call many times)
                leaves = [x.detach().requires_grad_(x.requires_grad) if isinstance(x, torch.Tensor)
                          and x.is_floating_point() else x for x in ctx.xs]
                y = fn(*leaves)
            wanted = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and x.requires_grad]
            grads = torch.autograd.grad(y, [leaves[i] for i in wanted], g, allow_unused=True)
            out = [None] * len(leaves)
            for i, gr in zip(wanted, grads):
                # the block where x̄ has it (a check may run fn on a cut of its inputs, with fewer rows)
                if i == slot and gr is not None and gr.dtype == dtype and _has(gr.shape, block):
                    gr = gr.clone()
                    gr[block] = (gr[block].double() * factor).to(gr.dtype)
                out[i] = gr
            return tuple(out)
    return OneBlockOff.apply
