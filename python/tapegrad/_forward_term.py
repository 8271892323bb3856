"""One term of one call written with a value's entries moved, named from the forward.

A backward writes each operand's term of a call by hand: for y = A @ B, Ā = ȳ·Bᵀ and B̄ = Aᵀ·ȳ; for a
convolution, x̄ correlates ȳ with the kernel turned by 180°; for a permute, ȳ is permuted back. Its slips there keep
every shape and move the entries of one factor of one term: Bᵀ·ȳ for Aᵀ·ȳ, the kernel unturned, a gradient
permuted the forward's way. Each is fitted as x̄_user = the VJP of the forward with operand j's term of one call
changed — of every run of its line, where the line runs in a loop — and the call's value kept:

  another operand moved   the term of operand j with operand k transposed (two of its axes of one size exchanged) or
                          reversed (along one axis, or two together: a kernel turned by 180°): the call's output gets
                          Δ − detach(Δ) added, Δ = f(o_j, o_k′) − f(o_j, o_k) with every operand but o_j detached, so
                          that o_j's derivative is f's at o_k′ and every other operand's is the forward's
  ȳ moved                 the term of operand j with the gradient that reaches the call transposed (two axes of one
                          size of its output exchanged): Δ = f(o_j)ᵀ − f(o_j); at a call that only moves entries
                          (permute, transpose, …) that is two of its axes exchanged (wrong_axis)
  a layout call left out  a call that only moves entries, passed through as its operand reshaped: the backward
                          reshapes ȳ without the call's permutation (a bare reshape)
  an input moved          where no one call's term fits: x̄ the VJP of the forward at another input w moved as
                          above, in every call that reads it (a convolution written as a sum of shifted products,
                          its input's gradient correlated with the kernel unturned)

Each costs one forward and a backward at the first ȳ (then at every ȳ where that one fits), at most MAX_TERM_RUNS.
"""

import itertools

import numpy as np
import torch

from ._forward_record import _MATMUL, _flat, _Forward, _run_forward, _vjps, lines
from ._forward_rewrite import replace_operand

MAX_TERM_RUNS = 64  # forwards with one term moved, at most
MAX_OPERANDS = 8    # a call of more tensors than this (a cat of many) has no operand moved in another's term
# Calls that only move their operand's entries (their adjoint moves them back)
_LAYOUT = {"permute", "transpose", "t", "T", "mT", "flip", "fliplr", "flipud", "roll", "movedim", "moveaxis",
           "swapaxes", "swapdims", "rot90"}
# Calls that keep their operand's entries in order and change its shape alone: ȳ moved there is an axis moved too
_RESHAPE = {"reshape", "view", "flatten", "unflatten", "view_as", "reshape_as"}


def _short(call):
    return call.name.strip("_")


def _moves(shape, reversals=True):
    """(words, kind of move, move) for the ways to move a tensor's entries that keep its shape: two axes of one size
    exchanged, then (where reversals) one axis reversed, then two reversed together."""
    rank = len(shape)
    moves = [(f"transposed (its axes {a} and {b} exchanged)", "transposed", lambda t, a=a, b=b: t.transpose(a, b))
             for a, b in itertools.combinations(range(rank), 2) if shape[a] == shape[b] > 1]
    if reversals:
        moves += [(f"reversed along its axis {a}", "reversed", lambda t, a=a: t.flip(a))
                  for a in range(rank) if shape[a] > 1]
        moves += [(f"turned by 180° in its axes {a} and {b}", "reversed", lambda t, a=a, b=b: t.flip((a, b)))
                  for a, b in itertools.combinations(range(rank), 2) if shape[a] > 1 and shape[b] > 1]
        moves += [(f"reflected in the anti-diagonal of its axes {a} and {b}", "reversed",
                   lambda t, a=a, b=b: t.transpose(a, b).flip((a, b)))
                  for a, b in itertools.combinations(range(rank), 2) if shape[a] == shape[b] > 1]
    return moves


def _tensors(args, kwargs):
    return [v for v in _flat(list(args) + list(kwargs.values())) if isinstance(v, torch.Tensor)]


def _term_changed(j, k, move):
    """after() for Rewritten: operand j's term (tensor argument j) of the call made with tensor argument k moved, or
    with ȳ moved where k is None; the call's value as it was."""
    def after(out, func, args, kwargs, run):
        tensors = _tensors(args, kwargs)
        if not isinstance(out, torch.Tensor) or len(tensors) <= max(j, -1 if k is None else k):
            return out
        live = tensors[j]
        if not live.requires_grad or (k is not None and tensors[k] is live):
            return out
        for t in tensors:
            if t is not live:
                args, kwargs = replace_operand(args, kwargs, t, t.detach())
        term = func(*args, **kwargs)
        if k is None:
            moved = move(term)
        else:
            held = _tensors(args, kwargs)[k]
            moved_args, moved_kwargs = replace_operand(args, kwargs, held, move(held))
            moved = func(*moved_args, **moved_kwargs)
        delta = moved - term
        if tuple(delta.shape) != tuple(out.shape):
            return out
        return out + (delta - delta.detach())
    return after


def _left_out(out, func, args, kwargs, run):
    """after() for Rewritten: a call that moves entries, differentiated as its operand reshaped."""
    source = _tensors(args, kwargs)[0]
    if not isinstance(out, torch.Tensor) or source.numel() != out.numel() or not source.requires_grad:
        return out
    passed = source.reshape(out.shape)
    return out + (passed - passed.detach()) - (out - out.detach())


def _written(search, call, t, position):
    """How the report writes tensor argument `position` of call: its name or expression, or its place and shape
    where the forward made it out of sight (an index the recording does not see)."""
    text, _ = search.operand(t)
    return f"`{text}`" if text != "a value of the forward" else f"its argument {position}, of shape {tuple(t.shape)}"


def _candidates(search):
    """(group, after, kind, what the report says) for each term to try, in order: ȳ transposed and another operand
    transposed, then reversals, then layout calls left out."""
    first, later = [], []
    for group in lines(search.calls):
        call = max(group, key=lambda c: len(c.operands))
        if not isinstance(call.out, torch.Tensor) or not call.tensors:
            continue
        name = _short(call)
        layout = name in _LAYOUT or name in _RESHAPE
        where = f"`{call.text}` at {call.where}" + (f" (at every one of its {len(group)} runs)" if len(group) > 1
                                                    else "")
        for j, live in enumerate(call.tensors):
            if not live.requires_grad:
                continue
            text = _written(search, call, live, j)
            for words, _, move in _moves(tuple(call.out.shape), reversals=False):
                if layout:
                    axes = words[words.index("axes"):words.index(" exchanged")]
                    said = (f"x̄ is the forward's rule with the gradient reaching {where} with its {axes} exchanged "
                            f"(to rounding): the backward moves the gradient's entries back along the wrong axes")
                else:
                    said = (f"x̄ is the forward's rule with ȳ of {where} {words} in the term through {text} (to "
                            f"rounding): the backward uses the gradient reaching that call transposed where the "
                            f"gradient as it is belongs")
                first.append((group, _term_changed(j, None, move), "wrong_axis" if layout else "transposed_term",
                              said))
            if layout or len(call.tensors) > MAX_OPERANDS:
                continue
            for k, held in enumerate(call.tensors):
                if k == j or held is live or held.dim() == 0:
                    continue
                held_text = _written(search, call, held, k)
                for words, how, move in _moves(tuple(held.shape), reversals=name not in _MATMUL):
                    said = (f"x̄ is the forward's rule with {held_text} {words} in the term through {text} of "
                            f"{where} (to rounding): the backward reads {held_text} so moved where the rule reads "
                            f"it as the forward has it")
                    (first if how == "transposed" else later).append(
                        (group, _term_changed(j, k, move), "transposed_term", said))
        if name in _LAYOUT and call.tensors[0].requires_grad:
            later.append((group, _left_out, "wrong_axis",
                          f"x̄ is the forward's rule with {where} left out, its operand passed on reshaped (to "
                          f"rounding): the backward reshapes the gradient without moving its entries back as the "
                          f"call's adjoint does"))
    return first + later


def _moved_term(search):
    found = {}
    for tried, (group, after, kind, said) in enumerate(_candidates(search)):
        if tried >= MAX_TERM_RUNS or len(found) == len(search.errors):
            break
        search.add_named(found, lambda i, kind=kind, said=said: (kind, search.names[i], "vjp", said), {},
                         after={c.index: after for c in group})
    return found


def _input_moved(search):
    found, tried = {}, 0
    for k, held in enumerate(search.xs):
        for words, _, move in _moves(tuple(held.shape)):
            if tried >= MAX_TERM_RUNS or len(found) == len(search.errors):
                return found
            if all(i == k for i in search.errors):
                break
            tried += 1
            arrays = list(search.arrays)
            arrays[k] = move(torch.from_numpy(np.asarray(arrays[k], dtype=np.float64))).contiguous().numpy()
            try:
                xs, y = _run_forward(search.function_class, search.fixed, search.slots, arrays, _Forward())
                if not isinstance(y, torch.Tensor) or tuple(y.shape) != search.cotangents[0].shape:
                    continue
                first = _vjps(xs, y, search.cotangents[:1])
                close = [i for i in search.errors if i != k and search.matches_first(i, first[i])]
                if not close:
                    continue
                rest = _vjps(xs, y, search.cotangents[1:])
            except Exception:
                continue
            name = search.names[k]
            for i in close:
                if i not in found and search.matches(i, np.concatenate([first[i], rest[i]])):
                    found[i] = ("transposed_term", search.names[i], "vjp",
                                f"x̄ is the forward's rule at `{name}` {words} (to rounding): the backward reads "
                                f"`{name}` so moved, in every term through it, where the rule reads it as the "
                                f"forward has it")
    return found


# In the order tried: each maps the inputs it names to their finding.
TERM_FITS = (_moved_term, _input_moved)
