"""A torch.autograd.Function's hand-written backward as tapegrad formulas, for the checker's edit search.

When no kind of the Jacobian explains a failing VJP, the C++ checker tries editing the rule one edit at a time (a
transpose put around a square value or taken from one, the sign of a term flipped) and names the edit that puts it
right (ops/formulas/edits.hpp).
It edits formulas in tapegrad's expression language (docs/claims/README.md), so a torch op's backward is first
written in it: the Function's forward and backward run once at the point, outside autograd, under a dispatch mode
that records each aten op and the user's source line that called it. The ops the language has become formulas:

    mm, bmm, matmul → matmul     t, transpose, permute (one swap) → transpose
    _softmax, _log_softmax (over the last axis)
    add, sub, mul, div (tensors or a number)   neg, exp, log, tanh, relu, sqrt
    sum, mean over one axis, kept, or the leading one dropped (a bias's x.sum(0))
    where     detach, clone, alias; views and reshapes that keep the last two axes → the value itself
(Axes are written from the end, -1 the last, so that they mean the same where torch.matmul merged batch axes.)

A value made on one source line and read once, on that line, is written inside the formula that reads it, so that a
line of the backward becomes one formula; a value an assignment `name = ...` leaves is called by that name. A value
that depends on no input and no cotangent (torch.ones_like(...), a tensor kept on ctx) is a constant. Anything else
(an op the language lacks, a sum that drops its axis) and there is no formula: vjp_formulas returns None and the
report keeps its "no known kind". The checker itself checks that the formulas give the backward's own values before
it edits them.
"""

import keyword
import os
import re
import traceback

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_ASSIGNMENT = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9]*)\s*=[^=]")
_TAKEN = {"y", "g"}


class _Untraceable(Exception):
    pass


class _Context:
    """What a Function's forward and backward use of ctx, outside autograd."""

    def __init__(self, count):
        self.needs_input_grad = (True,) * count
        self.saved_tensors = ()

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors

    def save_for_forward(self, *tensors):
        self.saved_for_forward = tensors

    def mark_non_differentiable(self, *tensors):
        pass

    def mark_dirty(self, *tensors):
        pass

    def set_materialize_grads(self, value):
        pass


class _Node:
    """One recorded op: its formula with {0}, {1}, ... for the values it reads, and where it was written."""

    def __init__(self, template, reads, where, infix=False):
        self.template, self.reads, self.where, self.infix = template, reads, where, infix
        self.uses = 0


def _source_place():
    """(file, line, text) of the innermost frame outside torch and tapegrad: the user's line."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith(_TORCH_DIR) and not path.startswith(_PACKAGE_DIR):
            return os.path.basename(path), frame.lineno, (frame.line or "").strip()
    return "?", 0, ""


def _number(x):
    return repr(float(x))


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.value_of = {}   # id(tensor) → ("leaf", name) | ("const", name) | ("node", index)
        self.alive = []      # every tensor seen, kept so that no id is reused during the trace
        self.nodes = []
        self.constants = {}
        self.failure = None

    def leaf(self, tensor, name):
        self.alive.append(tensor)
        self.value_of[id(tensor)] = ("leaf", name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.failure is None:
            try:
                self._record(func, args, kwargs, out)
            except _Untraceable as why:
                self.failure = str(why)
        return out

    def _is_traced(self, t):
        return isinstance(t, torch.Tensor) and self.value_of.get(id(t), ("const",))[0] != "const"

    def _operand(self, t):
        """A read of tensor t: its value's reference; a tensor not seen before is a constant, named here."""
        if not isinstance(t, torch.Tensor):
            raise _Untraceable(f"an operand of type {type(t).__name__}")
        if id(t) not in self.value_of:
            leaves = {name for kind, name in self.value_of.values() if kind == "leaf"}
            n = len(self.constants)
            while f"c{n}" in leaves or f"c{n}" in self.constants:
                n += 1
            name = f"c{n}"
            self.constants[name] = t.detach().to(torch.float64).numpy().copy()
            self.alive.append(t)
            self.value_of[id(t)] = ("const", name)
        return self.value_of[id(t)]

    def _bind(self, out, template, reads, infix=False):
        self.alive.append(out)
        self.nodes.append(_Node(template, [self._operand(r) for r in reads], _source_place(), infix))
        self.value_of[id(out)] = ("node", len(self.nodes) - 1)

    def _record(self, func, args, kwargs, out):
        name = func.overloadpacket.__name__
        if not isinstance(out, torch.Tensor):
            raise _Untraceable(f"aten.{name} returns {type(out).__name__}")
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if not any(self._is_traced(t) for t in tensors) or name.endswith("_like"):
            self._operand(out)  # depends on no input and no cotangent: a constant
            return
        in_place = name.endswith("_") and not name.startswith("_")
        base = name[:-1] if in_place else name
        if in_place and args[0] is not out:
            raise _Untraceable(f"aten.{name} returns another tensor than it writes")
        x = args[0]

        def scalar(v):
            if isinstance(v, (int, float)):
                return _number(v)
            if isinstance(v, torch.Tensor) and v.dim() == 0 and not self._is_traced(v):
                return _number(v.item())
            return None

        if base in ("mm", "bmm", "matmul"):
            return self._bind(out, "matmul({0}, {1})", args[:2])
        if base in ("detach", "clone", "alias", "lift_fresh", "_to_copy", "contiguous"):
            return self._bind(out, "{0}", [x])
        if base in ("view", "reshape", "_reshape_alias", "_unsafe_view", "expand"):
            # torch.matmul on batches: leading axes merged for bmm and split again (or broadcast), the matrices
            # kept. The formulas keep the value's own shape (their matmul takes any batch axes); should the
            # shapes part ways, the checker finds the formulas differ from the backward and edits nothing.
            if tuple(out.shape) == tuple(x.shape) or (
                    x.dim() >= 2 and out.dim() >= 2 and tuple(out.shape[-2:]) == tuple(x.shape[-2:])):
                return self._bind(out, "{0}", [x])
            raise _Untraceable(f"aten.{name} from {tuple(x.shape)} to {tuple(out.shape)}")
        if base == "t":
            return self._bind(out, "transpose({0})" if x.dim() == 2 else "{0}", [x])
        if base == "transpose":
            a, b = sorted(d % x.dim() for d in args[1:3])
            if a == b:
                return self._bind(out, "{0}", [x])
            if (a, b) == (x.dim() - 2, x.dim() - 1):
                return self._bind(out, "transpose({0})", [x])
            return self._bind(out, f"transpose({{0}}, {a - x.dim()}, {b - x.dim()})", [x])
        if base == "permute":  # a permutation that swaps two axes is a transpose
            order = [d % x.dim() for d in args[1]]
            moved = [d for d in range(x.dim()) if order[d] != d]
            if not moved:
                return self._bind(out, "{0}", [x])
            if len(moved) != 2:
                raise _Untraceable(f"aten.permute by {list(args[1])}, more than one swap")
            a, b = moved
            if (a, b) == (x.dim() - 2, x.dim() - 1):
                return self._bind(out, "transpose({0})", [x])
            return self._bind(out, f"transpose({{0}}, {a - x.dim()}, {b - x.dim()})", [x])
        if base in ("_softmax", "_log_softmax"):
            if args[1] % x.dim() != x.dim() - 1:
                raise _Untraceable(f"aten.{name} over axis {args[1]}, not the last")
            return self._bind(out, ("softmax" if base == "_softmax" else "log_softmax") + "({0})", [x])
        if base in ("neg", "exp", "log", "tanh", "relu"):
            return self._bind(out, base + "({0})", [x])
        if base == "sqrt":
            return self._bind(out, "exp(log({0}) * 0.5)", [x])
        if base in ("sum", "mean") and len(args) == 1 and not kwargs.get("dim"):
            return self._bind(out, base + "({0})", [x])
        if base in ("sum", "mean"):
            dims = args[1] if len(args) > 1 else kwargs.get("dim")
            keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
            if dims is None or len(dims) != 1:
                raise _Untraceable(f"aten.{name} over {dims}: the formulas sum over one axis")
            axis = int(dims[0]) % x.dim()
            if not keep and axis != 0:  # a dropped leading axis broadcasts as the kept one of size 1; another not
                raise _Untraceable(f"aten.{name} over axis {axis} without keepdim=True")
            return self._bind(out, f"{base}({{0}}, {axis - x.dim()})", [x])
        if base == "pow" and scalar(args[1]) == "2.0":
            return self._bind(out, "mul({0}, {0})", [x])
        if base == "where":
            return self._bind(out, "where({0}, {1}, {2})", args[:3])
        if base in ("add", "sub", "mul", "div", "rsub"):
            alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
            left, right = scalar(args[0]), scalar(args[1])
            op = {"add": "+", "sub": "-", "mul": "*", "div": "/", "rsub": "-"}[base]
            if base == "rsub":  # other − alpha·x
                if right is None:
                    raise _Untraceable("aten.rsub of two tensors")
                return self._bind(out, f"{right} - {{0}} * {_number(alpha)}" if alpha != 1 else f"{right} - {{0}}",
                                  [x], infix=True)
            if right is not None:
                if base in ("add", "sub") and alpha != 1:
                    right = _number(float(right) * alpha)
                return self._bind(out, f"{{0}} {op} {right}", [x], infix=True)
            if left is not None:
                return self._bind(out, f"{left} {op} {{0}}", [args[1]], infix=True)
            if base in ("add", "sub") and alpha != 1:
                return self._bind(out, f"{{0}} {op} {{1}} * {_number(alpha)}", args[:2], infix=True)
            return self._bind(out, f"{{0}} {op} {{1}}", args[:2], infix=True)
        raise _Untraceable(f"aten.{name}, which the formula language does not have")


def _identifier(name):
    return name.isidentifier() and not keyword.iskeyword(name) and name not in _TAKEN


def _formulas(recorder, outputs):
    """lets [(name, formula, label)] and one formula per output (or None), from the recorded nodes."""
    for node in recorder.nodes:
        for kind, ref in node.reads:
            if kind == "node":
                recorder.nodes[ref].uses += 1
    for out in outputs:
        if out is not None and recorder.value_of.get(id(out), ("",))[0] == "node":
            recorder.nodes[recorder.value_of[id(out)][1]].uses += 1

    # A node read once, by a node of the same source line, is written inside it.
    inlined = set()
    for node in recorder.nodes:
        for kind, ref in node.reads:
            if kind == "node" and recorder.nodes[ref].uses == 1 and recorder.nodes[ref].where == node.where:
                inlined.add(ref)

    taken = set(_TAKEN) | {name for kind, name in recorder.value_of.values() if kind in ("leaf", "const")}
    names = {}
    text = {}

    def reference(kind, ref, inside_infix=False):
        """A read of a value: its name, or its formula where it is written inline (in parentheses where both it and
        the formula that reads it are operators: a * (b + c))."""
        if kind != "node":
            return ref
        if ref in inlined:
            return f"({text[ref]})" if inside_infix and recorder.nodes[ref].infix else text[ref]
        return names[ref]

    def fresh(node):
        match = _ASSIGNMENT.match(node.where[2])
        base = match.group(1) if match and _identifier(match.group(1)) else f"t{node.where[1]}"
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        return name

    needed = set()

    def need(kind, ref):
        if kind == "node" and ref not in needed:
            needed.add(ref)
            for read in recorder.nodes[ref].reads:
                need(*read)

    for out in outputs:
        if out is not None:
            need(*recorder.value_of[id(out)])

    lets = []
    for i, node in enumerate(recorder.nodes):
        if i not in needed:
            continue
        text[i] = node.template.format(*(reference(*read, node.infix) for read in node.reads))
        if i in inlined:
            continue
        names[i] = fresh(node)
        file, line, source = node.where
        lets.append((names[i], text[i], f"{file}:{line}" + (f" `{source}`" if source else "")))
    results = [None if out is None else reference(*recorder.value_of[id(out)]) for out in outputs]
    return lets, results


def vjp_formulas(function_class, fixed, slots, names, arrays, gout, output=None):
    """The backward of function_class (a torch.autograd.Function) at the inputs `fixed` with `arrays` in the
    checked slots, for the cotangent gout, as {"lets", "vjp", "constants"}; None where it cannot be written.
    output: for a Function of several outputs, the one gout is for (the others' gradients are zeros, constants)."""
    if not all(_identifier(n) for n in names) or len(set(names)) != len(names):
        return None
    args = list(fixed)
    xs = [torch.from_numpy(np.array(a, dtype=np.float64)) for a in arrays]
    for slot, x in zip(slots, xs):
        args[slot] = x
    g = torch.from_numpy(np.array(gout, dtype=np.float64))
    recorder = _Recorder()
    for x, name in zip(xs, names):
        recorder.leaf(x, name)
    recorder.leaf(g, "g")
    ctx = _Context(len(args))
    try:
        with torch.no_grad(), recorder:
            y = function_class.forward(ctx, *args)
            if output is not None:
                ys = [t for t in y if isinstance(t, torch.Tensor) and t.is_floating_point()]
                gs = [torch.zeros_like(t) for t in ys]
                y, gs[output] = ys[output], g
            if not isinstance(y, torch.Tensor) or y.shape != g.shape:
                return None
            grads = function_class.backward(ctx, *(gs if output is not None else (g,)))
    except Exception:  # the op ran under autograd in the check; outside it, it may not: then no formulas
        return None
    if recorder.failure is not None:
        return None
    grads = grads if isinstance(grads, tuple) else (grads,)
    if len(grads) < len(args):
        return None
    outputs = [grads[slot] for slot in slots]
    if any(o is not None and id(o) not in recorder.value_of for o in outputs):
        return None
    lets, vjp = _formulas(recorder, outputs)
    return {"lets": lets, "vjp": vjp, "constants": recorder.constants}
