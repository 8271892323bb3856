"""The forward of a Function run again with calls rewritten, for the fits of _forward_axis.py, _forward_derivative.py
and _forward_loop.py: a call's axis changed, an operand replaced by a leaf of its broadcast shape, an operand's
value replaced with its derivative kept, a loop step's operand (and, through `after`, what a call's output becomes).
A rewritten forward whose VJP is the user's x̄ at every cotangent says which rewrite the backward made."""

from dataclasses import dataclass

import numpy as np
import torch

from ._forward_record import FIT, _flat, _Forward, _run_forward, _vjps


class Rewritten(_Forward):
    """Runs the forward with the calls of `rewrites` (index → rewrite, the calls counted as _Forward counts those
    that read a tensor requiring grad) made with the arguments rewrite(func, args, kwargs, run) returns, and the
    output of the calls of `after` (index → after) replaced by after(out, func, args, kwargs, run); run is this
    mode, whose `inputs` and `outputs` hold the run's values so far."""

    def __init__(self, rewrites, after=None):
        super().__init__()
        self.rewrites, self.after = rewrites, after or {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        reads = any(isinstance(v, torch.Tensor) and v.requires_grad for v in _flat(list(args) + list(kwargs.values())))
        k = self.count
        if reads and k in self.rewrites:
            args, kwargs = self.rewrites[k](func, args, kwargs, self)
        out = super().__torch_function__(func, types, args, kwargs)
        if reads and k in self.after:
            out = self.after[k](out, func, args, kwargs, self)
        return out


def replace_operand(args, kwargs, target, replacement):
    """args and kwargs with the tensor `target` (by identity) replaced, inside lists and tuples too."""
    def replaced(v):
        if isinstance(v, (list, tuple)):
            return type(v)(replaced(u) for u in v)
        return replacement if v is target else v
    return replaced(args), {key: replaced(v) for key, v in kwargs.items()}


def operands_of(args, kwargs):
    return [v for v in _flat(list(args) + list(kwargs.values())) if isinstance(v, torch.Tensor) and v.requires_grad]


@dataclass
class Search:
    """What the fits after the forward's own edges need: the Function (or the wrapper that inlines it,
    _forward_record.Inlined) and its point, the recorded calls, the run's inputs and their names, the cotangents with
    x̄_true and x̄_user at them (stacked, one vector per input), the inputs still unnamed (index → error), how an
    operand is written, and the edge terms at the first ȳ."""
    function_class: object
    fixed: list
    slots: list
    arrays: list
    calls: list
    xs: list
    names: list
    cotangents: list
    true: list
    user: list
    errors: dict
    operand: object
    terms: dict = None      # input → [(call, j, d at the first ȳ)] of the detached edges
    full_term: object = None  # (call, j, input) → the edge's term at every ȳ

    def run(self, rewrites, after=None):
        """(xs, y) of the forward with the calls of rewrites (index → rewrite) and of after rewritten (Rewritten)."""
        return _run_forward(self.function_class, self.fixed, self.slots, self.arrays, Rewritten(rewrites, after))

    def matches(self, i, xbar):
        """Whether xbar (stacked as x̄_user) is input i's x̄_user to rounding."""
        return np.linalg.norm(self.user[i] - xbar) <= FIT * np.linalg.norm(self.errors[i])

    def named_by_run(self, rewrites, after=None):
        """The unnamed inputs whose x̄_user the rewritten forward's VJP gives: screened at the first ȳ, then at all."""
        xs, y = self.run(rewrites, after)
        if not isinstance(y, torch.Tensor) or not y.requires_grad or tuple(y.shape) != self.cotangents[0].shape:
            return []
        first = _vjps(xs, y, self.cotangents[:1])
        close = [i for i in self.errors if self.matches_first(i, first[i])]
        if not close:
            return []
        rest = _vjps(xs, y, self.cotangents[1:])  # the first ȳ's VJPs are `first`: stacked after them, every ȳ's
        return [i for i in close if self.matches(i, np.concatenate([first[i], rest[i]]))]

    def add_named(self, found, finding, rewrites, after=None):
        """Runs the forward rewritten (named_by_run) and sets found[i] = finding(i) for each input it names that
        found lacks; a rewrite the forward cannot run with names none."""
        try:
            named = self.named_by_run(rewrites, after)
        except Exception:
            return
        for i in named:
            found.setdefault(i, finding(i))

    def matches_first(self, i, xbar):
        n = len(xbar)
        return np.linalg.norm(self.user[i][:n] - xbar) <= FIT * np.linalg.norm(self.errors[i][:n])
