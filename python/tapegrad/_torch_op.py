"""A torch callable behind the interface of python/python_function.hpp: its rules are torch's autograd.

    forward      fn on float64 tensors over the checker's arrays (torch.from_numpy: no copy); when the node is
                 recorded, with grad enabled, keeping (xs, y) for the rules
    vjp          x̄ = torch.autograd.grad(y, xs, ȳ): the op's backward (a Function's hand-written one)
    jvp          forward-mode AD (dual tensors); None when the op has none, e.g. a Function without `jvp`
    vjp_tangent  ẋ̄ = ∂/∂x ⟨grad(⟨ȳ, f(x)⟩, x, create_graph=True), ẋ⟩: double backward; a str naming the reason
                 when the backward is not differentiable
    vjp_formulas the op's backward as tapegrad formulas (tapegrad/_trace.py), for the checker's edit search: a
                 Function's forward and backward called directly, any other callable through autograd; where
                 they cannot be written, a str saying why (the aten op and the line), which the report adds
In the second-order check a Function without `jvp` gets its tangent ẏ = Jẋ from the backward instead
(∂/∂ȳ ⟨Jᵀȳ, ẋ⟩), which the forward-over-reverse sweep needs only to carry on.
"""

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD

from . import _tapegrad
from ._callables import _options, require_full_jacobian_memory


def _unravel(k, shape):
    """The index of element k of a C-ordered array of that shape."""
    index = []
    for n in reversed(shape):
        index.append(k % n)
        k //= n
    return tuple(reversed(index))


def _point(arrays):
    """A point's key, to know it again: each input's shape and bytes."""
    return tuple((a.shape, a.tobytes()) for a in arrays)


def _numpy(t):
    """A torch tensor's values as a float64 numpy array, apart from any graph."""
    return t.detach().to(torch.float64).numpy()


def _inner_product(grads, tangents, like):
    """Σᵢ ⟨gᵢ, tᵢ⟩ over the gradients that depend on what is differentiated (a scalar of like's dtype)."""
    return sum(((g * torch.from_numpy(t)).sum() for g, t in zip(grads, tangents)
                if g is not None and t is not None and g.requires_grad), torch.zeros((), dtype=like.dtype))


def _lacks_forward_mode(error):
    text = str(error)
    return isinstance(error, NotImplementedError) or "jvp" in text or "forward AD" in text or "forward-mode" in text


_ONCE_DIFFERENTIABLE = ("op '{}': the backward is marked once_differentiable: its second order cannot be checked")


def _is_once_differentiable(grad):
    """Whether a gradient came from a backward under @once_differentiable: torch hangs an error node on it, which
    raises when it is differentiated (and which leads nowhere near the inputs)."""
    return grad is not None and type(grad.grad_fn).__name__ in ("Error", "DelayedError")


def float_outputs(y):
    """The op's outputs that have derivatives: its floating-point tensors (a tuple's others, such as indices, are
    left out as torch's gradcheck leaves them out)."""
    ys = list(y) if isinstance(y, (tuple, list)) else [y]
    return [t for t in ys if isinstance(t, torch.Tensor) and t.is_floating_point()]


def unit_vjp_rows(vjp, yshape):
    """vjp(e_j) for every unit ȳ = e_j of yshape, j over its elements in order: the rows of the full Jacobians."""
    for j in range(int(np.prod(yshape))):
        unit = np.zeros(yshape)
        unit.flat[j] = 1.0
        yield vjp(unit)


# gradcheck's default checks an input in full where that costs in proportion to the rest of the check (about 8
# forwards and 4 backwards an input): its 2n forwards, the differences, for at most ELEMENTS_AT_MOST elements, and its
# rows, one backward per element of y, for a y of at most ROWS_AT_MOST elements or where they are read by columns
# (rows_by_columns); an input past either is checked by projections, as one above the limit of entries is.
ELEMENTS_AT_MOST = 512
ROWS_AT_MOST = 256
# Reading J_i by columns costs a backward through the backward per element of x_i, about twice a backward each;
# by rows, one backward per element of y.
COLUMN_COST = 3


def rows_by_columns(state, yshape, wanted, seed=0x5eed):
    """The rows vjp_rows gives, J_iᵀ e_j for every j, read from the columns of J_i instead, where the wanted inputs'
    elements (times COLUMN_COST) are fewer than y's: x̄ = J_iᵀȳ is linear in ȳ, so its derivative in ȳ_j is row j,
    and one backward of x̄_ik through the backward's own graph gives column k, ∂x̄_ik/∂ȳ, at once for every j. That
    holds only where the backward's graph is all of it: where x̄ is not linear in ȳ (a slip such as ȳ² or ȳ + c) or
    part of it is computed outside torch's graph (detached, numpy, a kernel), the columns do not sum back to x̄ by
    Euler's identity Σ_j ȳ_j ∂x̄/∂ȳ_j = x̄ at a random ȳ; there, and where the backward cannot be differentiated, None:
    the unit rows are read, one backward each, as they always can be."""
    xs, y = state
    m = int(np.prod(yshape))
    wanted_elements = sum(x.numel() for x, want in zip(xs, wanted) if want)
    if not y.requires_grad or COLUMN_COST * wanted_elements + 2 > m:
        return None
    u = torch.from_numpy(np.random.default_rng(seed).standard_normal(tuple(yshape))).to(y.dtype).requires_grad_()
    columns = [None] * len(xs)
    try:
        with torch.enable_grad():
            grads = torch.autograd.grad(y, xs, u, retain_graph=True, create_graph=True, allow_unused=True)
            for i, (g, want) in enumerate(zip(grads, wanted)):
                if not want or g is None:
                    continue
                if g.grad_fn is None or _is_once_differentiable(g):
                    return None
                flat = g.reshape(-1)
                unit = torch.zeros_like(flat)
                by_column = []
                for k in range(flat.numel()):
                    unit[k] = 1.0
                    (column,) = torch.autograd.grad(flat, u, unit, retain_graph=True, allow_unused=True)
                    unit[k] = 0.0
                    by_column.append(torch.zeros(m, dtype=y.dtype) if column is None else column.reshape(-1))
                jacobian = torch.stack(by_column, 1).detach()  # m × |x_i|
                summed = jacobian.T @ u.detach().reshape(-1)
                scale = jacobian.abs().T @ u.detach().abs().reshape(-1)
                if not bool(((summed - flat.detach()).abs() <= 1e-9 * scale + 1e-300).all()):
                    return None
                columns[i] = _numpy(jacobian)
    except RuntimeError:
        return None
    return [[None if c is None else c[j].reshape(xs[i].shape) for i, c in enumerate(columns)] for j in range(m)]


def check_each_output(call):
    """The C++ checker's run on call's op (gradcheck's call): (its report, merged over the outputs where there are
    several; the TorchOp of each check; how many outputs; at first order, the backward at ȳ = 0, zero_cotangent's
    result, else None)."""
    impls = per_output(call)
    count = 1 if len(impls) == 1 else len(impls) - 1
    reports = []
    for impl in impls:
        options = call.options
        if impl.output == "all" and call.fast_mode is None:
            # every output at once: random ȳ over all of them (a full Jacobian's rows seed one output at a time,
            # which the checks above have made)
            options = _options("gradcheck", {**call.keywords, "fast_mode": True})
        if call.fast_mode is not None and not call.fast_mode:
            require_full_jacobian_memory(impl, call.name, call.arrays)
        reports.append(_tapegrad._check(impl, call.name, call.arrays, call.names, call.order, options))
    at_zero = impls[0].zero_cotangent(call.arrays) if call.order == 1 else None
    if count == 1:
        return reports[0], impls, count, at_zero
    return _tapegrad._merge(reports, [f"y{k}" for k in range(count)] + ["all"], call.name), impls, count, at_zero


def per_output(call):
    """The TorchOp of each check of call's op (gradcheck's call): the op's own for an op of one output; for an op of
    several, one per output and one of all of them at once, sharing one set of runs at x ± εe_k."""
    probe = TorchOp(call)
    with torch.no_grad():
        count = len(probe.outputs([torch.from_numpy(a.copy()) for a in call.arrays]))
    steps = {}  # fn's runs at x ± εe_k, every output of each: one set of runs for all the outputs' checks
    return [TorchOp(call, output=output, steps=steps)
            for output in ([None] if count == 1 else list(range(count)) + ["all"])]


class TorchOp:
    """output: None for an op of one output; k for output k of a multi-output op (the backward gets None, or zeros
    where the Function materializes them, for the others, as in a loss that uses only that one); "all" for every
    output at once, flattened and concatenated, so each VJP seeds each output with its own part of ȳ and the
    backward is called once with all of them."""

    def __init__(self, call, output=None, steps=None):
        """call: the gradcheck call (tapegrad/_callables.py's _Call): fn, its inputs, the checked slots, the name, the
        order (2: the rules' second order is checked too) and fn's keyword arguments."""
        self.fn, self.name, self.function_class = call.fn, call.name, call.function_class
        self.slots = call.slots
        self.fixed = [x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                      for x in call.inputs]
        self.kwargs = dict(call.kwargs or {})
        self.second_order = call.order == 2
        self.output = output
        self.no_forward_mode = None  # why forward mode failed, once it has
        self._recorded = None        # (the inputs' shapes and bytes, forward's result) of the last recording
        self._columns = None         # (the point, rows_by_columns' rows there) for vjp_rows, from full_worth_its_cost
        # unit_steps' runs of fn, every output of each, by point and step: a dict shared by the checks of one op's
        # outputs, which evaluate fn at the same points
        self.steps = {} if steps is None else steps

    def outputs(self, xs):
        """Every floating-point output of fn at xs in the checked slots."""
        args = list(self.fixed)
        for slot, x in zip(self.slots, xs):
            args[slot] = x
        y = self.fn(*args, **self.kwargs)
        ys = float_outputs(y)
        if not ys:
            raise TypeError(f"tapegrad.gradcheck: the op returns {type(y).__name__}, not a torch.Tensor")
        return ys

    def _call(self, xs):
        return self._select(self.outputs(xs))

    def _select(self, ys):
        """The output checked, of all of fn's: the only one, output k, or all of them flattened and concatenated."""
        if self.output is None:
            if len(ys) != 1:
                raise TypeError(f"tapegrad.gradcheck: the op returned {len(ys)} outputs where it returned 1 before")
            return ys[0]
        if self.output == "all":
            return torch.cat([y.reshape(-1) for y in ys])
        return ys[self.output]

    def zero_cotangent(self, arrays):
        """The backward at ȳ = 0, as torch's gradcheck calls it (check_undefined_grad): every output's gradient
        undefined (a Function gets zeros, or None under ctx.set_materialize_grads(False)), then for an op of several
        outputs each output's alone undefined and the others' zero. Returns x̄ per checked input, its largest
        |element| and where, or the exception the backward raised, with the case it raised in."""
        worst = [(0.0, None)] * len(arrays)
        xs = [torch.from_numpy(a.copy()).requires_grad_() for a in arrays]
        with torch.enable_grad():
            first = [y for y in self.outputs(xs) if y.requires_grad]  # the first case's graph: each case has its own
        cases = [None] + (list(range(len(first))) if len(first) > 1 else [])
        for case, undefined in enumerate(cases):
            with torch.enable_grad():
                ys = first if case == 0 else [y for y in self.outputs(xs) if y.requires_grad]
                if not ys:
                    return worst
                ys = [torch._C._functions.UndefinedGrad()(y) if undefined in (None, k) else y for k, y in enumerate(ys)]
                try:
                    grads = torch.autograd.grad(ys, xs, [torch.zeros_like(y) for y in ys], allow_unused=True)
                except Exception as error:  # whatever the backward raises is the finding
                    case = ("every output's gradient undefined" if undefined is None
                            else f"output {undefined}'s gradient undefined, the others' zero")
                    return error, case
            for i, g in enumerate(grads):
                if g is None:
                    continue
                a = g.detach().abs().reshape(-1)
                if a.numel() and float(a.max()) > worst[i][0]:
                    k = int(a.argmax())
                    worst[i] = (float(a.max()), _unravel(k, g.shape))
        return worst

    def vjp_formulas(self, arrays, gout, names):
        from ._trace import TracePoint, vjp_formulas, vjp_formulas_of_callable
        function_class = self.function_class
        if self.output == "all":
            return None
        try:
            if function_class is not None:
                call = self._apply_call(function_class, arrays)
                if call is not None:
                    args, slots = call
                    return vjp_formulas(function_class, TracePoint(args, slots, names, arrays), gout,
                                        output=self.output)
            if self.output is not None:
                return None
            return vjp_formulas_of_callable(self.fn, TracePoint(self.fixed, self.slots, names, arrays), gout)
        except Exception as error:  # the formulas only add a diagnosis: without them the report stands as it is
            return f"the backward could not be traced into formulas: {type(error).__name__}: {error}"

    def saved_intermediates(self, function_class, arrays):
        """The tensors the Function's forward keeps for backward (on ctx or by save_for_backward) that are neither
        an input nor an output and change with the checked inputs: double backward sees each as a constant. Each as
        (name, file, line); forward is run outside autograd with a ctx that records where each was kept."""
        from ._trace import _Context
        import os
        import sys

        def run(arrays):
            call = self._apply_call(function_class, arrays)
            if call is None:
                return None
            args, slots = call
            for slot, a in zip(slots, arrays):
                args[slot] = torch.from_numpy(np.array(a, dtype=np.float64))
            kept = []

            class Recording(_Context):
                def __setattr__(self, name, value):
                    if isinstance(value, torch.Tensor) and name not in ("saved_tensors", "needs_input_grad"):
                        frame = sys._getframe(1)
                        kept.append((name, value, frame.f_code.co_filename, frame.f_lineno))
                    object.__setattr__(self, name, value)

                def save_for_backward(self, *tensors):
                    frame = sys._getframe(1)
                    for t in tensors:
                        name = next((k for k, v in frame.f_locals.items() if v is t), "a saved tensor")
                        kept.append((name, t, frame.f_code.co_filename, frame.f_lineno))
                    object.__setattr__(self, "saved_tensors", tensors)

            with torch.no_grad():
                y = function_class.forward(Recording(len(args)), *args)
            ys = list(y) if isinstance(y, (tuple, list)) else [y]
            own = [a for a in args if isinstance(a, torch.Tensor)] + [t for t in ys if isinstance(t, torch.Tensor)]
            return [k for k in kept if not any(k[1] is t for t in own)]

        try:
            first = run(arrays)
            moved = run([a + 1e-3 * (1 + np.abs(a)) for a in arrays])
        except Exception:  # a note only: without it the report stands as it is
            return []
        if not first or moved is None or len(moved) != len(first):
            return []
        return [(name, os.path.basename(file), line) for (name, t, file, line), (_, u, _, _) in zip(first, moved)
                if t.shape == u.shape and not torch.equal(t, u)]

    def _apply_call(self, function_class, arrays):
        """The arguments function_class.apply receives when fn runs at arrays (fn may be a lambda or a partial
        around it, with arguments of its own), and where in them the checked inputs are: (args, slots), or None
        where apply is not called exactly once or a checked input does not reach it as itself."""
        import functools
        fn, bound = self.fn, []
        while isinstance(fn, functools.partial):  # partial(partial(f, a), b) calls f(a, b, ...)
            bound[:0] = fn.args
            fn = fn.func
        if fn == function_class.apply:  # apply itself: its arguments are the inputs, after what partials bind
            return bound + list(self.fixed), [len(bound) + slot for slot in self.slots]
        xs = [torch.from_numpy(a.copy()) for a in arrays]
        calls = []
        original = function_class.__dict__.get("apply")
        real = function_class.apply

        def recording_apply(*args):
            calls.append(args)
            return real(*args)
        function_class.apply = recording_apply
        try:
            with torch.no_grad():
                self.outputs(xs)
        finally:
            if original is None:
                del function_class.apply
            else:
                function_class.apply = original
        if len(calls) != 1:
            return None
        args = list(calls[0])
        slots = [next((i for i, a in enumerate(args) if a is x), None) for x in xs]
        return None if None in slots else (args, slots)

    def forward(self, arrays, keep):
        """(y, state): state the recorded graph (xs, y) where keep. At first order a recording at the inputs of the
        last one is that one again: every backward keeps the graph (retain_graph), so the checks at one point (each
        input's VJP, accumulation, linearity) share one forward, as torch's gradcheck runs its backwards on one. At
        second order a double backward frees the graph, and each recording is a forward of its own."""
        if keep and not self.second_order:
            key = _point(arrays)
            if self._recorded is not None and self._recorded[0] == key:
                return self._recorded[1]
        xs = [torch.from_numpy(a) for a in arrays]
        if not keep:
            with torch.no_grad():
                y = self._call(xs)
            return _numpy(y), None
        xs = [x.requires_grad_() for x in xs]
        with torch.enable_grad():
            y = self._call(xs)
        result = _numpy(y), (xs, y)
        if not self.second_order:
            self._recorded = (key, result)
        return result

    def vjp_rows(self, arrays, yshape, wanted):
        """x̄ of the inputs wanted names (None for the others) for every unit ȳ = e_j, j over y's elements in order
        (the rows of the full Jacobians), from one recorded forward whose graph each backward keeps: one backward per
        element of y, or, where the wanted inputs are few beside y (a scale, a bias, a kernel beside a large output),
        the same rows read by columns (rows_by_columns)."""
        kept, self._columns = self._columns, None
        if kept is not None and kept[0] == (tuple(yshape), tuple(wanted), _point(arrays)) and kept[1] is not None:
            return kept[1]  # full_worth_its_cost read them at this point, on a forward of its own
        _, state = self.forward(arrays, True)
        columns = rows_by_columns(state, yshape, wanted)
        if columns is not None:
            return columns
        return [[g if want else None for g, want in zip(row, wanted)]
                for row in unit_vjp_rows(lambda unit: self.vjp(state, unit), yshape)]

    def full_worth_its_cost(self, arrays, yshape, wanted):
        """Of the wanted inputs (gradcheck's default limit), those whose full Jacobian costs in proportion to the
        check (ELEMENTS_AT_MOST, ROWS_AT_MOST); the rows read by columns are kept for vjp_rows."""
        worth = [want and a.size <= ELEMENTS_AT_MOST for want, a in zip(wanted, arrays)]
        if int(np.prod(yshape)) <= ROWS_AT_MOST or not any(worth):
            return worth
        _, state = self.forward(arrays, True)
        columns = rows_by_columns(state, yshape, worth)
        self._columns = ((tuple(yshape), tuple(worth), _point(arrays)), columns)
        return worth if columns is not None else [False] * len(worth)

    def unit_steps(self, arrays, i, eps):
        """f at the arrays with element k of input i moved by +eps and by −eps, for every k: (plus, minus), row k
        holding y flattened. Each point is the checker's x + (±ε)·e_k: adding ε·0 elsewhere turns a −0 into +0 on the
        plus side (and subtracting it leaves the minus side as it is). Every run gets fresh copies of the inputs, as
        a run one point at a time does; its outputs are kept in self.steps for the checks of the op's other outputs."""
        key = (i, eps, _point(arrays))
        if key not in self.steps:
            plus_base = arrays[i].copy()
            plus_base += 0.0  # in place: a 0-d input stays an array
            base = {1: plus_base, -1: arrays[i]}
            runs = {1: [], -1: []}
            with torch.no_grad():
                for k in range(arrays[i].size):
                    for sign in (1, -1):
                        moved = base[sign].copy()
                        moved.flat[k] = arrays[i].flat[k] + sign * eps
                        xs = [torch.from_numpy(moved if q == i else a.copy()) for q, a in enumerate(arrays)]
                        runs[sign].append(self.outputs(xs))
            self.steps[key] = runs
        rows = {sign: [_numpy(self._select(ys)).reshape(-1) for ys in runs] for sign, runs in self.steps[key].items()}
        width = rows[1][0].size if rows[1] else 0
        if any(row.size != width for sign in (1, -1) for row in rows[sign]):
            raise ValueError(f"tapegrad.gradcheck: op '{self.name}': the output's size changes when input {i} moves "
                             f"by ±eps (it is {width} at the first point)")
        return tuple(np.array(rows[sign], dtype=np.float64).reshape(-1, width) for sign in (1, -1))

    def vjp(self, state, gout):
        xs, y = state
        if not y.requires_grad:
            return [None] * len(xs)
        try:
            grads = torch.autograd.grad(y, xs, torch.from_numpy(gout).to(y.dtype), retain_graph=True,
                                        allow_unused=True)
        except Exception as error:
            if not isinstance(self.output, int):
                raise
            raise RuntimeError(f"tapegrad.gradcheck: op '{self.name}': the backward raised {type(error).__name__}: "
                               f"{error}, called with a gradient for output {self.output} alone (the others' are "
                               "undefined: zeros, or None under ctx.set_materialize_grads(False), as torch passes "
                               "them when a loss uses only that output)") from error
        return [None if g is None else _numpy(g) for g in grads]

    def jvp(self, state, tangents):
        if self.no_forward_mode is not None:
            return self._jvp_by_double_backward(state, tangents) if self.second_order else None
        xs, _ = state
        try:
            with fwAD.dual_level():
                duals = [fwAD.make_dual(x.detach(), torch.from_numpy(t) if t is not None else torch.zeros_like(x))
                         for x, t in zip(xs, tangents)]
                y = self._call(duals)
                tangent = fwAD.unpack_dual(y).tangent
                return _numpy(torch.zeros_like(y) if tangent is None else tangent)
        except (NotImplementedError, RuntimeError) as error:
            if not _lacks_forward_mode(error):
                raise
            self.no_forward_mode = str(error)
        if not self.second_order:
            return None
        return self._jvp_by_double_backward(state, tangents)

    def _jvp_by_double_backward(self, state, tangents):
        xs, y = state
        u = torch.zeros_like(y, requires_grad=True)
        try:
            with torch.enable_grad():
                grads = torch.autograd.grad(y, xs, u, create_graph=True, allow_unused=True)
                s = _inner_product(grads, tangents, y)
                if not s.requires_grad:
                    return _numpy(torch.zeros_like(y))
                (jt,) = torch.autograd.grad(s, u, allow_unused=True)
        except RuntimeError as error:
            return self._why_not_twice(error)
        return _numpy(torch.zeros_like(y) if jt is None else jt)

    def vjp_tangent(self, state, gout, tangents):
        xs, y = state
        if not y.requires_grad:
            return [None] * len(xs)
        u = torch.from_numpy(gout).to(y.dtype).requires_grad_()
        try:
            with torch.enable_grad():
                grads = torch.autograd.grad(y, xs, u, create_graph=True, allow_unused=True)
                # Jᵀȳ depends on ȳ linearly: a backward built from differentiable ops leaves a graph behind it.
                if any(_is_once_differentiable(g) for g in grads):
                    return _ONCE_DIFFERENTIABLE.format(self.name)
                opaque = [i for i, g in enumerate(grads) if g is not None and g.grad_fn is None]
                if opaque:
                    return (f"op '{self.name}': its backward is not differentiable (the gradient of input "
                            f"{opaque[0]} has no graph: "
                            "the backward is not built from differentiable torch ops), so its second order "
                            "cannot be checked")
                s = _inner_product(grads, tangents, y)
                if not s.requires_grad:
                    return [None] * len(xs)
                second = torch.autograd.grad(s, xs, allow_unused=True)
        except RuntimeError as error:
            return self._why_not_twice(error)
        return [None if g is None else _numpy(g) for g in second]

    def _why_not_twice(self, error):
        """The reason torch's error while differentiating the backward says the second order cannot be checked (the
        str the checker reports, the check then skipped, not failed); an error of another kind is raised again."""
        text = str(error)
        if "once_differentiable" in text:
            return _ONCE_DIFFERENTIABLE.format(self.name)
        if "differentiable" in text or "does not require grad" in text:
            return (f"op '{self.name}': its backward is not differentiable ({text}), so its second order cannot be "
                    "checked")
        if "modified by an inplace operation" in text:
            return (f"op '{self.name}': its backward writes in place into a tensor its own graph needs, so torch "
                    f"cannot differentiate it and its second order cannot be checked ({text.splitlines()[0]}); build "
                    "the steps' results as a list and torch.stack them, or mark the backward once_differentiable")
        raise error
