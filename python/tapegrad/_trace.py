"""A torch op's backward as tapegrad formulas, for the checker's edit search.

When no kind of the Jacobian explains a failing VJP, the C++ checker tries editing the rule one edit at a time (a
transpose put around a square value or taken from one, the sign of a term flipped) and names the edit that puts it
right (checker/formulas/edits.hpp).
It edits formulas in tapegrad's expression language (docs/claims/README.md), so a torch op's backward is first
written in it: the op runs once at the point under a dispatch mode that records each aten op and the user's source
line that called it. A torch.autograd.Function's forward and backward are called directly, outside autograd; any
other callable (a lambda or functools.partial around Function.apply, an nn.Module) runs its forward with grad
enabled and torch.autograd.grad(y, xs, ȳ) under the same mode, so that whatever backward runs is recorded, with the
lines of the Python backward that called each op. The ops the language has become formulas:

    mm, bmm, matmul, addmm → matmul          t, transpose, permute (as swaps) → transpose
    _softmax, _log_softmax (any axis: moved last and back)
    add, sub, mul, div, rsub (tensors or a number)   neg, exp, log, tanh, relu, sqrt, rsqrt, sigmoid, reciprocal,
    pow by a number              sum, mean, the 2-norm over axes, kept or dropped (squeeze)     unsqueeze, squeeze
    where, masked_fill (a mask by a number, ±inf included: `inf` in the formulas)     tril, triu
    detach, clone, alias, contiguous, copy_; views and reshapes that keep the last two axes, or put in or take away
    axes of size 1; a slice that keeps every element (the `:` of g[None, :])
    in-place ops and out= forms: the written tensor is the new value from then on
(Axes are written from the end, -1 the last, so that they mean the same where torch.matmul merged batch axes.)
A value with a bool or integer dtype (a comparison, a mask) is a constant: nothing flows through it. The forward's
output, where an op the language lacks made it (a max with its indices), is read as y, which the formulas have.

A value made on one source line and read once, in the same statement, is written inside the formula that reads
it, so that a statement of the backward becomes one formula; a value an assignment leaves is called by the name it
is assigned to (read from the line's syntax: `dp, ds = a, b` and `dp = a; ds = b` name each its own). A value that
depends on no input and no cotangent (torch.ones_like(...), a tensor kept on ctx) is a constant. An op the language
lacks (cumsum, indexing, a view that reorders elements, ...) leaves a value that cannot be written; only if an x̄
needs it is there no formula, and vjp_formulas then returns one line saying which aten op at which line of the
user's code stopped the trace, which the report adds to its "no known kind". The checker itself checks that the
formulas give the backward's own values before it edits them.
"""

import ast
import functools
import keyword
import linecache
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_TAKEN = {"y", "g", "inf"}
_LACKS = "which the formula language does not have"


def _axis(d, rank):
    """Axis d of a tensor of that rank, counted from the end (-1 the last)."""
    return int(d) % rank - rank


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


class _Place:
    """Where an op was called: the user's file, line and its text, and the name the statement assigns the op's
    value to (None where it assigns none)."""

    def __init__(self, file="?", line=0, text="", target=None, statement=None):
        self.file, self.line, self.text, self.target, self.statement = file, line, text, target, statement

    def __str__(self):
        return f"{self.file}:{self.line}" if self.line else "torch's own backward"

    def label(self):
        return str(self) + (f" `{self.text}`" if self.text else "")

    def said(self):
        """Where, in a sentence: "at file.py:12 `line`", or "in torch's own backward"."""
        return f"at {self.label()}" if self.line else f"in {self}"


class _Node:
    """One recorded op: its formula with {0}, {1}, ... for the values it reads, and where it was written."""

    def __init__(self, template, reads, where, infix=False):
        self.template, self.reads, self.where, self.infix = template, reads, where, infix
        self.uses = 0


@functools.lru_cache(maxsize=64)
def _statements(filename):
    """Every statement of a source file, parsed once: to read what a line assigns."""
    try:
        tree = ast.parse("".join(linecache.getlines(filename)))
    except (SyntaxError, ValueError):
        return ()
    return tuple(n for n in ast.walk(tree) if isinstance(n, ast.stmt) and hasattr(n, "end_lineno"))


def _within(node, line, col):
    return (node.lineno, node.col_offset) <= (line, col) <= (node.end_lineno, node.end_col_offset)


@functools.lru_cache(maxsize=4096)  # a file's syntax does not change within a check; its statements are many
def _assigned_name(filename, line, col):
    """(the name the innermost statement at (line, col) gives the value computed there, the statement), from the
    file's syntax: `a = ...`, `a += ...`, `a: T = ...`, the element of `a, b = e1, e2` that holds the column, the
    tensor of an in-place call `a.mul_(...)`; None where it names none."""
    if col is None:
        return None, None
    found = [s for s in _statements(filename) if _within(s, line, col)]
    if not found:
        return None, None
    stmt = min(found, key=lambda s: (s.end_lineno - s.lineno, s.end_col_offset - s.col_offset))
    if any(isinstance(n, ast.Lambda) and _within(n.body, line, col) for n in ast.walk(stmt)):
        return None, (stmt.lineno, stmt.col_offset)  # inside a lambda: the statement assigns the lambda itself
    name = None
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target, value = stmt.targets[0], stmt.value
        if isinstance(target, ast.Name):
            name = target.id
        elif isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) \
                and len(target.elts) == len(value.elts):
            for t, v in zip(target.elts, value.elts):
                if isinstance(t, ast.Name) and _within(v, line, col):
                    name = t.id
    elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)) and isinstance(stmt.target, ast.Name):
        name = stmt.target.id
    elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) \
            and isinstance(stmt.value.func, ast.Attribute) and stmt.value.func.attr.endswith("_") \
            and isinstance(stmt.value.func.value, ast.Name):
        name = stmt.value.func.value.id
    return name, (stmt.lineno, stmt.col_offset)


@functools.lru_cache(maxsize=256)
def _positions(code):
    return list(code.co_positions())


@functools.lru_cache(maxsize=1024)
def _normalized(path):
    return os.path.normpath(path)


def _absolute(path):
    """os.path.abspath(path), kept per name where it does not depend on the working directory (an absolute one):
    every recorded call asks it of each frame of the stack."""
    return _normalized(path) if os.path.isabs(path) else os.path.abspath(path)


def _source_place():
    """The innermost frame outside torch and tapegrad, past the recorder's own frames: the user's line. None of
    them before tapegrad's frames again (the op was called by torch's own backward, a C++ derivative of autograd,
    run from _autograd_backward): no line of the user's."""
    frame = sys._getframe(1)
    while frame is not None and _absolute(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
    while frame is not None:
        path = _absolute(frame.f_code.co_filename)
        if path.startswith(_PACKAGE_DIR):
            return _Place()
        if not path.startswith(_TORCH_DIR):
            break
        frame = frame.f_back
    if frame is None:
        return _Place()
    filename, line, col = frame.f_code.co_filename, frame.f_lineno, None
    try:
        start, _, col, _ = _positions(frame.f_code)[frame.f_lasti // 2]
        line = start or line
    except (IndexError, ValueError, AttributeError):
        pass
    text = linecache.getline(filename, line).strip()
    target, statement = _assigned_name(filename, line, col)
    return _Place(os.path.basename(filename), line, text, target, (filename, statement or line))


def _number(x):
    return repr(float(x))


def _memory(t):
    """Where t's elements live (the address of its storage), or None where it has none to read."""
    try:
        storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        return storage.data_ptr()
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def _swaps(order):
    """A permutation as the swaps of two axes that make it, in order: x.permute(order) is x with each swapped."""
    current = list(range(len(order)))
    swaps = []
    for i in range(len(order)):
        if current[i] != order[i]:
            j = current.index(order[i])
            current[i], current[j] = current[j], current[i]
            swaps.append((i, j))
    return swaps


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        # id(tensor) → ("leaf", name) | ("const", name) | ("node", index) | ("bad", why): a value no formula writes
        self.value_of = {}
        self.alive = []      # every tensor seen, once, kept so that no id is reused during the trace
        self.nodes = []
        self.constants = {}
        self.leaves = set()  # the leaves' names, which no constant takes
        self._writing = None  # the in-place op being recorded, for the message of the views it invalidates

    def leaf(self, tensor, name):
        self.alive.append(tensor)
        self.value_of[id(tensor)] = ("leaf", name)
        self.leaves.add(name)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._record(func, args, kwargs, out)
        except _Untraceable as why:
            # The value cannot be written: an x̄ that reads it has no formula, and the trace says why.
            what, *detail = why.args
            said = f"{what}" + (f", {detail[0]}," if detail else "") + f" {_source_place().said()}"
            name = func.overloadpacket.__name__
            wrote = kwargs.get("out") is not None or (name.endswith("_") and not name.startswith("_"))
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    if wrote:  # only a write changes what its aliases hold; a view an op made is no write
                        self._writing = name
                        self._forget_aliases(t)
                    self._seen(t)
                    self.value_of[id(t)] = ("bad", said)
        return out

    def _seen(self, t):
        """Keeps t alive for the trace, once (an in-place write returns the tensor it wrote, seen before)."""
        if id(t) not in self.value_of:
            self.alive.append(t)

    def _is_traced(self, t):
        return isinstance(t, torch.Tensor) and self.value_of.get(id(t), ("const",))[0] != "const"

    def _constant(self, t):
        """A constant with t's values now, named afresh (a tensor written in place has new values). A tensor read
        again is in `alive` already: appended once, each write walks it once (appended at every write, a buffer
        written row by row doubled the walk at each row)."""
        n = len(self.constants)
        while f"c{n}" in self.leaves or f"c{n}" in self.constants:
            n += 1
        name = f"c{n}"
        self.constants[name] = t.detach().to(torch.float64).numpy().copy()
        self._seen(t)
        self.value_of[id(t)] = ("const", name)
        return self.value_of[id(t)]

    def _operand(self, t):
        """A read of tensor t: its value's reference; a tensor not seen before is a constant, named here."""
        if not isinstance(t, torch.Tensor):
            raise _Untraceable(f"an operand of type {type(t).__name__}")
        if id(t) not in self.value_of:
            return self._constant(t)
        return self.value_of[id(t)]

    def _forget_aliases(self, written):
        """After `written` is written (in place, out=): every other tensor seen that shares its memory has new
        values too. A full alias (same shape, strides and offset) takes the written value, a constant is read
        again, and any other view can no longer be written as a formula."""
        storage = _memory(written)
        if storage is None:
            return
        for t in list(self.alive):  # the tensors seen before this write, each once
            if t is written or id(t) not in self.value_of or _memory(t) != storage:
                continue
            if (t.shape, t.stride(), t.storage_offset()) == (written.shape, written.stride(),
                                                             written.storage_offset()):
                if id(written) in self.value_of:
                    self.value_of[id(t)] = self.value_of[id(written)]
            elif self.value_of[id(t)][0] == "const":
                self._constant(t)
            else:
                self.value_of[id(t)] = ("bad", "a view of a tensor written in place by aten."
                                               f"{self._writing} {_source_place().said()}")

    def _bind(self, out, template, reads, infix=False):
        refs = [self._operand(r) for r in reads]
        self._seen(out)
        bad = [ref for ref in refs if ref[0] == "bad"]
        if bad:
            self.value_of[id(out)] = bad[0]
        else:
            self.nodes.append(_Node(template, refs, _source_place(), infix))
            self.value_of[id(out)] = ("node", len(self.nodes) - 1)

    def _record(self, func, args, kwargs, out):
        name = func.overloadpacket.__name__
        written = kwargs.get("out")
        in_place = name.endswith("_") and not name.startswith("_")
        base = name[:-1] if in_place else name
        if in_place:
            written = args[0]
        if isinstance(out, (tuple, list)) or not isinstance(out, torch.Tensor):
            if isinstance(out, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in out):
                raise _Untraceable(f"aten.{name} (more than one result)", _LACKS)
            return  # a number, a bool, a shape: no value of the formulas
        if written is not None and written is not out:
            raise _Untraceable(f"aten.{name} returns another tensor than it writes")
        tensors = [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor) and a is not written]
        if in_place and base not in ("zero", "fill", "copy"):
            tensors.append(written)
        if written is not None:
            self._writing = name
            self._forget_aliases(out)
        depends = any(self._is_traced(t) for t in tensors)
        if not depends or name.endswith("_like") or base in ("zero", "fill") \
                or out.dtype == torch.bool or not (out.is_floating_point() or out.is_complex()):
            # Depends on no input and no cotangent, or a mask, an index: a constant
            self._constant(out)
            return
        self._write(name, base, args, kwargs, out)

    def _write(self, name, base, args, kwargs, out):
        x = args[0]
        if base in ("mm", "bmm", "matmul"):
            return self._bind(out, "matmul({0}, {1})", args[:2])
        if base == "addmm":
            beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
            if beta != 1 or alpha != 1:
                raise _Untraceable(f"aten.addmm with beta={beta}, alpha={alpha}", _LACKS)
            return self._bind(out, "{0} + matmul({1}, {2})", args[:3], infix=True)
        if base in ("detach", "clone", "alias", "lift_fresh", "lift_fresh_copy", "_to_copy", "contiguous"):
            return self._bind(out, "{0}", [x])
        if base == "copy":  # dst.copy_(src): dst's values are src's from here on
            src = args[1]
            if tuple(src.shape) != tuple(out.shape):
                raise _Untraceable(f"aten.copy_ from {tuple(src.shape)} into {tuple(out.shape)}")
            return self._bind(out, "{0}", [src])
        if base == "slice" and tuple(out.shape) == tuple(x.shape):  # x[:, ...]: every element, the value itself
            return self._bind(out, "{0}", [x])
        if base in ("view", "reshape", "_reshape_alias", "_unsafe_view", "squeeze", "unsqueeze", "expand",
                    "view_as", "reshape_as", "expand_as"):
            return self._reshape(name, x, out)
        if base == "t":
            return self._bind(out, "transpose({0})" if x.dim() == 2 else "{0}", [x])
        if base == "transpose":
            a, b = sorted(d % x.dim() for d in args[1:3])
            if a == b:
                return self._bind(out, "{0}", [x])
            if (a, b) == (x.dim() - 2, x.dim() - 1):
                return self._bind(out, "transpose({0})", [x])
            return self._bind(out, f"transpose({{0}}, {a - x.dim()}, {b - x.dim()})", [x])
        if base == "permute":  # as the swaps of two axes that make it
            template = "{0}"
            for a, b in _swaps([d % x.dim() for d in args[1]]):
                template = (f"transpose({template})" if (a, b) == (x.dim() - 2, x.dim() - 1)
                            else f"transpose({template}, {a - x.dim()}, {b - x.dim()})")
            return self._bind(out, template, [x])
        if base in ("_softmax", "_log_softmax"):
            f = "softmax" if base == "_softmax" else "log_softmax"
            a = _axis(args[1], x.dim())
            if a == -1:
                return self._bind(out, f + "({0})", [x])
            return self._bind(out, f"transpose({f}(transpose({{0}}, {a}, -1)), {a}, -1)", [x])
        return self._write_pointwise(name, base, args, kwargs, out)

    def _write_pointwise(self, name, base, args, kwargs, out):
        """_write's element-wise ops, reductions, masks and torch's own backward formulas."""
        x = args[0]
        # The derivatives of torch's own backward (a callable that is not a Function) for the ops above.
        if base == "_softmax_backward_data":  # (ḡ, y, dim): y ⊙ (ḡ − Σ ḡ ⊙ y), the sum kept
            a = _axis(args[2], x.dim())
            return self._bind(out, f"{{1}} * ({{0}} - sum({{0}} * {{1}}, {a}))", args[:2], infix=True)
        if base == "tanh_backward":  # (ḡ, y): ḡ ⊙ (1 − y²)
            return self._bind(out, "{0} * (1 - {1} * {1})", args[:2], infix=True)
        if base == "sigmoid_backward":  # (ḡ, y): ḡ ⊙ y ⊙ (1 − y)
            return self._bind(out, "{0} * {1} * (1 - {1})", args[:2], infix=True)
        if base == "threshold_backward":  # (ḡ, x, t): ḡ where x > t, the mask a constant at this point
            return self._bind(out, "where({1}, {0}, 0)", [x, args[1] > args[2]])
        if base in ("neg", "exp", "log", "tanh", "relu"):
            return self._bind(out, base + "({0})", [x])
        if base == "sqrt":
            return self._bind(out, "exp(log({0}) * 0.5)", [x])
        if base == "rsqrt":
            return self._bind(out, "exp(log({0}) * -0.5)", [x])
        if base == "sigmoid":
            return self._bind(out, "1 / (1 + exp(-{0}))", [x], infix=True)
        if base == "reciprocal":
            return self._bind(out, "1 / {0}", [x], infix=True)
        if base == "pow" and self._scalar(args[1]) is not None and self._is_traced(x):
            p = float(args[1]) if not isinstance(args[1], torch.Tensor) else args[1].item()
            if p in (1.0, 2.0, 3.0, 4.0):
                return self._bind(out, "mul(" * (int(p) - 1) + "{0}" + ", {0})" * (int(p) - 1), [x])
            if bool((x > 0).all()):  # xᵖ = exp(p·log x) where x > 0, as it is at this point
                return self._bind(out, f"exp(log({{0}}) * {_number(p)})", [x])
            raise _Untraceable(f"aten.pow by {p} of a value ≤ 0 somewhere", _LACKS)
        if base in ("sum", "mean"):
            return self._reduce(name, base, args, kwargs, out)
        if base in ("norm", "linalg_vector_norm"):  # the 2-norm over axes: norm(x, p, dim, keepdim), (x, ord, ...)
            order = args[1] if len(args) > 1 else kwargs.get("p", kwargs.get("ord", 2))
            dims = args[2] if len(args) > 2 else kwargs.get("dim")
            keep = args[3] if len(args) > 3 else kwargs.get("keepdim", False)
            if order not in (2, 2.0, None) or dims is None or kwargs.get("dtype") is not None:
                raise _Untraceable(f"aten.{name} other than the 2-norm over given axes", _LACKS)
            return self._reduce(name, "norm", (x, dims, keep), {}, out)  # a norm of norms is the norm over both
        if base in ("tril", "triu"):
            k = int(args[1]) if len(args) > 1 else int(kwargs.get("diagonal", 0))
            if base == "tril":
                return self._bind(out, f"tril({{0}}, {k})", [x])
            return self._bind(out, f"{{0}} - tril({{0}}, {k - 1})", [x], infix=True)
        if base == "masked_fill":  # x where the mask is off, the number where it is on
            value = self._scalar(args[2])
            if value is None:
                raise _Untraceable(f"aten.{name} by a tensor that depends on the inputs", _LACKS)
            return self._bind(out, f"where({{1}}, {value}, {{0}})", [x, args[1]])
        if base == "where":
            cond, a, b = args[:3]
            sides = [self._scalar(a), self._scalar(b)]
            reads = [cond] + [v for v, s in zip((a, b), sides) if s is None]
            slot = iter(range(1, 3))
            text = [s if s is not None else f"{{{next(slot)}}}" for s in sides]
            return self._bind(out, f"where({{0}}, {text[0]}, {text[1]})", reads)
        if base in ("add", "sub", "mul", "div", "rsub"):
            return self._write_arithmetic(base, args, kwargs, out)
        what = {"slice": "slicing", "select": "indexing", "index": "indexing", "gather": "indexing",
                "index_select": "indexing"}.get(base)
        raise _Untraceable(f"aten.{name}" + (f" ({what})" if what else ""), _LACKS)

    def _write_arithmetic(self, base, args, kwargs, out):
        """x + y, x − y, x·y, x / y and other − alpha·x, with a number on either side written as one."""
        x = args[0]
        if base == "div" and kwargs.get("rounding_mode") is not None:
            raise _Untraceable(f"aten.div with rounding_mode={kwargs['rounding_mode']!r}", _LACKS)
        alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
        left, right = self._scalar(args[0]), self._scalar(args[1])
        op = {"add": "+", "sub": "-", "mul": "*", "div": "/", "rsub": "-"}[base]
        if base == "rsub":  # other − alpha·x
            if right is None:
                return self._bind(out, f"{{1}} - {{0}} * {_number(alpha)}" if alpha != 1 else "{1} - {0}",
                                  args[:2], infix=True)
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

    def _scalar(self, v):
        """v written as a number where it is one (a Python number, or a 0-d tensor the trace does not follow)."""
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return _number(v)
        if isinstance(v, torch.Tensor) and v.dim() == 0 and not self._is_traced(v):
            return _number(v.item())
        return None

    def _reshape(self, name, x, out):
        """A view or reshape: the value itself where the shape stays, or where the last two axes stay (torch.matmul
        on batches merges the leading axes for bmm and splits them again, or broadcasts them: the formulas keep
        the value's own shape, their matmul taking any batch axes, and should the shapes part ways the checker
        finds the formulas differ from the backward and edits nothing); squeeze and unsqueeze where only axes of
        size 1 come or go."""
        before, after = tuple(x.shape), tuple(out.shape)
        if before == after or name.startswith("expand"):
            return self._bind(out, "{0}", [x])
        if [d for d in before if d != 1] == [d for d in after if d != 1]:
            template, rank = "{0}", len(before)
            for a in reversed([a for a, d in enumerate(before) if d == 1]):  # the last first: the axes after a
                template = f"squeeze({template}, {a - rank})"                 # are gone, so a - rank counts to it
                rank -= 1
            for a in reversed([a for a, d in enumerate(after) if d == 1]):   # the last first: a's place from the
                template = f"unsqueeze({template}, {a - len(after)})"        # end of the result is a - len(after)
            return self._bind(out, template, [x])
        if len(before) >= 2 and len(after) >= 2 and before[-2:] == after[-2:]:
            return self._bind(out, "{0}", [x])
        raise _Untraceable(f"aten.{name} from {before} to {after} (a reshape that regroups elements)", _LACKS)

    def _reduce(self, name, base, args, kwargs, out):
        x = args[0]
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keep = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if kwargs.get("dtype") is not None and not kwargs["dtype"].is_floating_point:
            raise _Untraceable(f"aten.{name} to {kwargs['dtype']}")
        if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
            return self._bind(out, base + "({0})", [x])
        dims = [dims] if isinstance(dims, int) else list(dims)
        rank = x.dim()
        axes = sorted({int(d) % rank for d in dims})
        template = "{0}"
        for a in axes:  # over each axis, kept; a mean of means is the mean over both
            template = f"{base}({template}, {a - rank})"
        if not keep:
            for a in reversed(axes):
                template = f"squeeze({template}, {a - rank})"
                rank -= 1
        return self._bind(out, template, [x])


def _identifier(name):
    return name.isidentifier() and not keyword.iskeyword(name) and name not in _TAKEN


def _formulas(recorder, outputs):
    """lets [(name, formula, label)] and one formula per output (or None), from the recorded nodes; raises
    _Untraceable naming the op and line when an output needs a value no formula writes."""
    needed = set()

    def need(kind, ref):
        if kind == "bad":
            raise _Untraceable(ref)
        if kind == "node" and ref not in needed:
            needed.add(ref)
            for read in recorder.nodes[ref].reads:
                need(*read)

    for out in outputs:
        if out is not None:
            need(*recorder.value_of[id(out)])

    for i in needed:
        for kind, ref in recorder.nodes[i].reads:
            if kind == "node":
                recorder.nodes[ref].uses += 1
    for out in outputs:
        if out is not None and recorder.value_of[id(out)][0] == "node":
            recorder.nodes[recorder.value_of[id(out)][1]].uses += 1

    # A node read once, by a node of the same statement that assigns to the same name, is written inside it.
    def written_at(node):
        return node.where.statement, node.where.target

    inlined = set()
    for i in needed:
        node = recorder.nodes[i]
        for kind, ref in node.reads:
            if kind == "node" and recorder.nodes[ref].uses == 1 and node.where.statement is not None \
                    and written_at(recorder.nodes[ref]) == written_at(node):
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
        target = node.where.target
        base = target if target and _identifier(target) else (f"t{node.where.line}" if node.where.line else "t")
        name, n = base, 2
        while name in taken:
            name, n = f"{base}_{n}", n + 1
        taken.add(name)
        return name

    lets = []
    for i, node in enumerate(recorder.nodes):
        if i not in needed:
            continue
        text[i] = node.template.format(*(reference(*read, node.infix) for read in node.reads))
        if i in inlined:
            continue
        names[i] = fresh(node)
        lets.append((names[i], text[i], node.where.label()))
    results = [None if out is None else reference(*recorder.value_of[id(out)]) for out in outputs]
    return lets, results


def _bad_names(names):
    if not all(_identifier(n) for n in names):
        bad = next(n for n in names if not _identifier(n))
        return (f"the input name {bad!r} cannot be a name in formulas (an identifier other than "
                f"{', '.join(sorted(_TAKEN))})")
    if len(set(names)) != len(names):
        return "two inputs have the same name"
    return None


@dataclass
class TracePoint:
    """Where a backward is traced: fn's inputs (fixed), the checked slots with their names, and their float64 values
    (arrays) there, which take the slots' places."""
    fixed: tuple
    slots: list
    names: list
    arrays: list


def _point(at, gout):
    args = list(at.fixed)
    xs = [torch.from_numpy(np.array(a, dtype=np.float64)) for a in at.arrays]
    for slot, x in zip(at.slots, xs):
        args[slot] = x
    return args, xs, torch.from_numpy(np.array(gout, dtype=np.float64))


def _result(recorder, outputs):
    if any(o is not None and id(o) not in recorder.value_of for o in outputs):
        return "a gradient the backward returns was made outside the trace"
    try:
        lets, vjp = _formulas(recorder, outputs)
    except _Untraceable as why:
        return f"the backward could not be traced into formulas: {why}"
    return {"lets": lets, "vjp": vjp, "constants": recorder.constants}


def vjp_formulas(function_class, at, gout, output=None):
    """The backward of function_class (a torch.autograd.Function) at the point `at` (a TracePoint), for the cotangent
    gout, as {"lets", "vjp", "constants"}; where it cannot be written, one line saying why (the aten op and the user's
    line that stopped the trace).
    output: for a Function of several outputs, the one gout is for (the others' gradients are zeros, constants)."""
    bad = _bad_names(at.names)
    if bad:
        return bad
    args, xs, g = _point(at, gout)
    recorder = _Recorder()
    for x, name in zip(xs, at.names):
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
                return "the forward, run again outside autograd, gave another output than the check's"
            if recorder.value_of.get(id(y), ("",))[0] == "bad":  # made by an op the formulas lack (max with its
                recorder.leaf(y, "y")                             # indices): the backward reads it as y itself
            grads = function_class.backward(ctx, *(gs if output is not None else (g,)))
    except Exception as error:  # the op ran under autograd in the check; outside it, it may not
        return f"the forward or backward, run again outside autograd, raised {type(error).__name__}: {error}"
    grads = grads if isinstance(grads, tuple) else (grads,)
    if len(grads) < len(args):
        return f"the backward returns {len(grads)} gradients for {len(args)} inputs"
    return _result(recorder, [grads[slot] for slot in at.slots])


def _autograd_backward(fn, args, xs, g):
    """fn's forward with grad, then its backward by torch.autograd.grad: whatever backward the op has runs, under
    the caller's dispatch mode. (Its name marks, for _source_place, where tapegrad's own frames begin.)"""
    with torch.enable_grad():
        y = fn(*args)
        if isinstance(y, (tuple, list)) and len(y) == 1:
            y = y[0]
        if not isinstance(y, torch.Tensor) or y.shape != g.shape or not y.requires_grad:
            return None
        return torch.autograd.grad(y, xs, g, allow_unused=True)


def vjp_formulas_of_callable(fn, at, gout):
    """As vjp_formulas, for any callable on torch tensors (a lambda or functools.partial around a Function's
    apply, an nn.Module): its forward runs with grad and the backward through torch.autograd.grad, both under the
    dispatch mode, so that a Function's backward called by autograd is recorded line by line, and a derivative of
    torch's own as its aten ops (with no line of the user's)."""
    bad = _bad_names(at.names)
    if bad:
        return bad
    args, xs, g = _point(at, gout)
    xs = [x.requires_grad_() for x in xs]
    recorder = _Recorder()
    for x, name in zip(xs, at.names):
        recorder.leaf(x, name)
    recorder.leaf(g, "g")
    try:
        with recorder:
            grads = _autograd_backward(fn, args, xs, g)
    except Exception as error:
        return f"the forward or backward, run again, raised {type(error).__name__}: {error}"
    if grads is None:
        return "the op, run again, gave another output than the check's"
    return _result(recorder, list(grads))
