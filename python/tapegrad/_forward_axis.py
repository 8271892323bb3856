"""A reduction or broadcast along the wrong axis, named from the forward (wrong_axis).

Two ways a backward runs along the wrong axis, each fitted as x̄_user = the VJP of a forward changed at one call:

  a call's axis      a call that takes an axis (cumsum, sum, softmax, flip, ...) run along another axis of its
                     operand of the same size: x̄_user is the VJP of the forward so changed (a reversed cumsum along
                     dim 0 for cumsum(x, -1): the adjoint of the call taken along the wrong axis)
  a broadcast        an operand that the call broadcasts (β of shape (C,) in β·x, W of shape (k, m) in A @ W for a
                     batch of A): its gradient is G, the gradient of the operand expanded to the broadcast shape,
                     summed over the broadcast axes B. Reduced otherwise — summed over another axis b of the same
                     size in place of a ∈ B, or one entry along a kept in place of the sum — x̄_user =
                     x̄_true + chain(G′ − G summed), chain the backward from the operand to the inputs.

Each costs one forward (the call changed, or the operand a leaf of the broadcast shape) and a backward per ȳ.
"""

import numpy as np
import torch

from ._forward_record import _ELEMENTWISE_PRODUCT, _MATMUL, _QUOTIENT, _SUM, _vjps
from ._forward_rewrite import operands_of, replace_operand

# Calls whose one int argument (position 1, or dim=/dims=) is an axis of their first operand.
_AXIS_CALLS = {"cumsum", "cumprod", "sum", "mean", "softmax", "log_softmax", "logsumexp", "flip", "amax", "amin",
               "prod", "var", "std", "max", "min", "cummax", "cummin", "unsqueeze", "squeeze", "select"}
_BROADCASTING = _ELEMENTWISE_PRODUCT | _QUOTIENT | _SUM | {"where", "pow", "__pow__", "maximum", "minimum"}
MAX_AXIS_RUNS = 32  # forwards with a call's axis changed, at most


def _with_axis(args, kwargs, written, new):
    """args, kwargs with the axis `written` (an int, or in a list of them) replaced by `new`."""
    def swap(v):
        if isinstance(v, bool):
            return v
        if isinstance(v, int):
            return new if v == written else v
        if isinstance(v, (list, tuple)) and all(isinstance(u, int) for u in v):
            return type(v)(new if u == written else u for u in v)
        return v
    for key in ("dim", "dims"):
        if key in kwargs:
            return args, {**kwargs, key: swap(kwargs[key])}
    return (args[0], swap(args[1]), *args[2:]), kwargs


def _axis_changed(search):
    found = {}
    runs = 0
    for call in search.calls:
        ints = [n for n in call.numbers if isinstance(n, int)]
        if call.name.lstrip("_").rstrip("_") not in _AXIS_CALLS or len(ints) != 1 or not call.operands:
            continue
        shape = tuple(call.operands[0].shape)
        rank = len(shape)
        written = ints[0]
        if not -rank <= written < rank:
            continue
        at = written % rank
        for other in range(rank):
            if other == at or shape[other] != shape[at] or runs >= MAX_AXIS_RUNS or len(found) == len(search.errors):
                continue
            new = other - rank if written < 0 else other
            runs += 1
            rewrite = lambda func, args, kwargs, run, w=written, n=new: _with_axis(args, kwargs, w, n)
            search.add_named(found, lambda i, new=new: (
                "wrong_axis", search.names[i], "vjp",
                f"x̄ is the forward's rule with `{call.text}` at {call.where} taken along axis {new} where the forward "
                f"takes axis {written} (to rounding): the backward's part for that call (its adjoint: a sum, a "
                f"broadcast, a reversed scan) runs along axis {new} of {shape}; it must run along axis {written}"),
                {call.index: rewrite})
    return found


def _broadcast_shape(call, operand):
    """The shape the call broadcasts the operand to, or None where it takes the operand as it is."""
    out = tuple(call.out.shape)
    if call.name in _MATMUL:
        if operand.dim() < 2 or len(out) < 2:
            return None
        shape = out[:-2] + tuple(operand.shape[-2:])
    elif call.name in _BROADCASTING:
        shape = out
    else:
        return None
    return shape if shape != tuple(operand.shape) and operand.numel() < int(np.prod(shape)) else None


def _reduced_otherwise(search):
    found = {}
    for call in search.calls:
        for j, operand in enumerate(call.operands):
            shape = _broadcast_shape(call, operand)
            if shape is None or len(found) == len(search.errors):
                continue
            lead = len(shape) - operand.dim()
            broadcast = [a for a in range(len(shape))
                         if shape[a] > 1 and (a < lead or operand.shape[a - lead] == 1)]
            if not broadcast:
                continue
            try:
                found.update({i: f for i, f in _fit_broadcast(search, call, j, operand, shape, broadcast).items()
                              if i not in found})
            except Exception:
                continue
    return found


def _fit_broadcast(search, call, j, operand, shape, broadcast):
    leaf = {}

    def rewrite(func, args, kwargs, run):
        target = operands_of(args, kwargs)[j]
        leaf["E"] = target.detach().expand(shape).clone().requires_grad_()
        return replace_operand(args, kwargs, target, leaf["E"])

    _, y = search.run({call.index: rewrite})
    if "E" not in leaf or not isinstance(y, torch.Tensor) or not y.requires_grad:
        return {}
    grads = [torch.autograd.grad(y, leaf["E"], torch.from_numpy(g), retain_graph=True)[0]
             for g in search.cotangents]

    reduce = lambda G: G.sum_to_size(operand.shape)
    alternatives = []  # (how the gradient was reduced, G → the operand's gradient)
    for a in broadcast:
        for b in range(len(shape)):
            if b not in broadcast and shape[b] == shape[a]:
                alternatives.append((f"summed over axis {b} where the broadcast axis {a} belongs",
                                     lambda G, a=a, b=b: reduce(G.transpose(a, b))))
        for k, which in ((0, "first"), (shape[a] - 1, "last")):
            alternatives.append((f"not summed over the broadcast axis {a}: its {which} entry is kept",
                                 lambda G, a=a, k=k: reduce(G.narrow(a, k, 1))))
    found = {}
    text, _ = search.operand(operand)
    for how, reduced in alternatives:
        # x̄ of every input for the operand's gradient changed by that much at each ȳ, stacked
        shifted = _vjps(search.xs, operand, [(reduced(G) - reduce(G)).numpy() for G in grads])
        for i in search.errors:
            if i not in found and search.matches(i, search.true[i] + shifted[i]):
                found[i] = ("wrong_axis", search.names[i], "vjp",
                            f"x̄ is the forward's rule with the gradient of `{text}` — broadcast to {shape} by "
                            f"`{call.text}` at {call.where} — {how} (to rounding): the backward must sum that "
                            f"gradient over the axes the forward broadcasts along ({', '.join(map(str, broadcast))})")
    return found


# In the order tried: each maps the inputs it names to their finding.
AXIS_FITS = (_reduced_otherwise, _axis_changed)
