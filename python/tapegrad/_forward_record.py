"""The forward of a torch.autograd.Function recorded for naming a slip from it (tapegrad/_forward.py and the fits
of _forward_fits.py): each torch call a _Call with the user's line and sub-expression, run under the _Forward mode
(which can cut one operand's edge, run a call straight through, or write a call out in its parts), the VJPs of the
run at stacked cotangents, and each edge's term named in the forward's own words."""

import contextlib
import functools
import inspect
import itertools
import linecache
import math
import os
import re
import sys
from dataclasses import dataclass

import numpy as np
import torch
from torch.overrides import TorchFunctionMode
from ._trace import _Context, _absolute

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))

MAX_EDGES = 64      # edges of the forward tried, in the order the forward makes them
# Each run of the forward in a search over its terms (one a candidate edge, substitution or rewrite) makes as many
# torch calls as the forward does. A search stops once its runs have made SEARCH_CALLS calls in all: a forward of a
# few dozen calls is searched in full, and a long one (a scan written as a Python loop makes a thousand calls a run)
# as far as that allows, the report saying so: unbounded, the search over a gated scan of 256 steps was 78 s of its
# 97 s check at bf16.
SEARCH_CALLS = 1 << 18
SEARCH_SPENT = "the search over the forward's terms stopped"  # how the report's note of it begins
COTANGENTS = 3      # random ȳ the error is fitted at, stacked
FIT = 1e-6          # a fit's residual at most this fraction of ‖e‖: the rest is rounding
_ASSIGNMENT = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9]*)\s*=(?!=)\s*(.*?)\s*(#.*)?$")
_PRODUCT = {"mul", "__mul__", "__rmul__", "multiply", "matmul", "__matmul__", "mm", "bmm", "einsum", "outer"}
_QUOTIENT = {"div", "__truediv__", "__rtruediv__", "divide", "true_divide"}
_SUM = {"add", "__add__", "__radd__", "sub", "__sub__", "__rsub__", "subtract"}
_MATMUL = {"matmul", "__matmul__", "mm", "bmm"}  # products of matrices, batched or not
_ELEMENTWISE_PRODUCT = _PRODUCT - _MATMUL - {"einsum", "outer"}


def _user_place():
    """(file, line, expression) of the innermost frame outside torch and tapegrad: the user's call, with the exact
    sub-expression that made it where Python knows its columns."""
    frame = sys._getframe(1)
    while frame is not None:
        path = _absolute(frame.f_code.co_filename)
        if not path.startswith(_TORCH_DIR) and not path.startswith(_PACKAGE_DIR):
            break
        frame = frame.f_back
    if frame is None:
        return "?", 0, ""
    path = frame.f_code.co_filename
    line = frame.f_lineno or 0
    expression = ""
    try:
        first, last, start, end = next(itertools.islice(frame.f_code.co_positions(), frame.f_lasti // 2, None))
        text = linecache.getline(path, first)
        if first == last and start is not None and end is not None:
            expression = text[start:end]
        line = first or line
    except (StopIteration, ValueError, TypeError):
        pass
    _paths.setdefault(os.path.basename(path), path)  # a wrapper's lines may come from another file than forward's
    return os.path.basename(path), line, expression.strip()


class _Call:
    """One torch call of the forward whose output depends on the inputs."""

    def __init__(self, index, name, place, operands, numbers, out, tensors=()):
        self.index, self.name, self.place = index, name, place
        self.operands = operands  # the tensors it reads that require grad, in argument order
        self.tensors = tensors    # every tensor it reads, in argument order (operands among them)
        self.numbers = numbers    # the Python numbers among its arguments (a power's exponent, a scale)
        self.out = out
        self.assigned = None      # the name a line `name = <this call's expression>` gives its value
        self.inside = None        # (name, formula) of the call of _PARTS this one is a part of, when written out

    @property
    def where(self):
        return f"{self.place[0]}:{self.place[1]}"

    @property
    def text(self):
        expression = self.place[2] or f"{self.name}(...)"
        return expression if len(expression) <= 70 else expression[:67] + "..."


def lines(calls):
    """The calls grouped by their line and function (a call written out in parts left out): a line run in a loop is
    one group of all its runs, in order."""
    groups = {}
    for call in calls:
        if call.inside is None:
            groups.setdefault((call.place, call.name), []).append(call)
    return list(groups.values())


def _flat(values):
    for v in values:
        if isinstance(v, (list, tuple)):
            yield from _flat(v)
        else:
            yield v


def _softmax_parts(x, dim=None, *rest, **kwargs):
    dim = kwargs.get("dim", dim)
    e = torch.exp(x - x.amax(dim, keepdim=True).detach())
    return e / e.sum(dim, keepdim=True)


def _softplus_parts(x, beta=1, threshold=20):
    return torch.log1p(torch.exp(beta * x)) / beta


def _logsumexp_parts(x, dim, keepdim=False):
    m = x.amax(dim, keepdim=True).detach()
    out = m + torch.log(torch.exp(x - m).sum(dim, keepdim=True))
    return out if keepdim else out.squeeze(dim)


# Calls that are several terms in one, written out in their parts (themselves torch calls, so each part is an edge)
# when no term of the forward as written fits: silu(a) = a·σ(a) has a product rule's two terms inside one call.
_SOFTMAX = ("softmax", "exp(s − max s) / sum(exp(s − max s))", _softmax_parts)
_LOGSUMEXP = ("logsumexp", "max s + log sum(exp(s − max s))", _logsumexp_parts)
_PARTS = {
    torch.nn.functional.silu: ("silu", "a·sigmoid(a)", lambda x, inplace=False: x * torch.sigmoid(x)),
    torch.nn.functional.mish: ("mish", "x·tanh(softplus(x))",
                               lambda x, inplace=False: x * torch.tanh(_softplus_parts(x))),
    torch.nn.functional.softplus: ("softplus", "log1p(exp(β·x))/β", _softplus_parts),
    torch.softmax: _SOFTMAX,
    torch.nn.functional.softmax: _SOFTMAX,
    torch.Tensor.softmax: _SOFTMAX,
    torch.logsumexp: _LOGSUMEXP,
    torch.Tensor.logsumexp: _LOGSUMEXP,
}


class _Forward(TorchFunctionMode):
    """Records the forward's calls (record=True), or runs it with one edge cut: (k, j, "detach") reads operand j
    of call k detached; (k, j, "straight") keeps call k's value with its derivative the identity in operand j;
    (k, j, "substitute", source) reads another value of the forward in place of operand j of call k: source is
    ("input", i) or ("call", m), the output of an earlier call m of the same run."""

    def __init__(self, cut=None, record=False, parts=False):
        super().__init__()
        self.cut, self.record, self.parts = cut, record, parts
        self.has_parts = False  # the forward makes a call of _PARTS
        self.inside = None      # while a call of _PARTS runs as its parts: its (name, formula)
        self.calls = []
        self.count = 0
        self.outputs = []  # each call's output in this run, by index
        self.inputs = []   # the run's inputs (set by _run_forward)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _PARTS:
            self.has_parts = True
            if self.parts and self.inside is None:
                name, formula, parts = _PARTS[func]
                self.inside = (name, formula)
                try:
                    with self:  # the parts are calls of their own, recorded (or cut) as the forward's
                        return parts(*args, **kwargs)
                finally:
                    self.inside = None
        operands = [v for v in _flat(list(args) + list(kwargs.values()))
                    if isinstance(v, torch.Tensor) and v.requires_grad]
        if not operands:
            return func(*args, **kwargs)
        k = self.count
        self.count += 1
        cut = self.cut if self.cut is not None and self.cut[0] == k else None
        if cut is not None and cut[2] in ("detach", "substitute"):
            target = operands[cut[1]]
            if cut[2] == "detach":
                replacement = target.detach()
            else:
                kind, at = cut[3]
                replacement = self.inputs[at] if kind == "input" else self.outputs[at]

            def replaced(v):
                if isinstance(v, (list, tuple)):
                    return type(v)(replaced(u) for u in v)
                return replacement if v is target else v

            args, kwargs = replaced(args), {key: replaced(v) for key, v in kwargs.items()}
        out = func(*args, **kwargs)
        self.outputs.append(out)
        if cut is not None and cut[2] == "straight":
            source = operands[cut[1]]
            out = source + (out - source).detach()
        if self.record and isinstance(out, torch.Tensor):
            name = getattr(func, "__name__", str(func))
            numbers = [v for v in _flat(list(args) + list(kwargs.values()))
                       if isinstance(v, (int, float)) and not isinstance(v, bool)]
            tensors = [v for v in _flat(list(args) + list(kwargs.values())) if isinstance(v, torch.Tensor)]
            self.calls.append(_Call(k, name, _user_place(), operands, numbers, out, tensors))
            self.calls[-1].inside = self.inside
        return out


def _plain_forward(function_class, args):
    """function_class's forward at args as plain torch code, on a stand-in ctx (a forward written for a separate
    setup_context takes none)."""
    if getattr(function_class, "setup_context", None) is not getattr(torch.autograd.Function, "setup_context", None):
        return function_class.forward(*args)
    return function_class.forward(_Context(len(args)), *args)


class SearchSpent(Exception):
    """A search over the forward's terms has spent its SEARCH_CALLS (search_budget)."""


class _Budget:
    """The torch calls a run of the forward makes, and the runs made, in the search under way (calls 0: none); spent:
    what a search said when its budget ran out, kept for its caller (a search catches its candidates' exceptions,
    SearchSpent among them, and goes on to the next, each refused at once)."""
    calls = 0
    runs = 0
    spent = None


@contextlib.contextmanager
def search_budget(calls):
    """Counts the runs of a forward of `calls` torch calls that _run_forward makes inside: past SEARCH_CALLS calls in
    all, the next run raises SearchSpent."""
    saved = _Budget.calls, _Budget.runs
    _Budget.calls, _Budget.runs = max(1, calls), 0
    try:
        yield
    finally:
        _Budget.calls, _Budget.runs = saved


@contextlib.contextmanager
def spent_into(notes):
    """Adds to notes what a search inside said when its budget ran out (nothing where none ran out)."""
    _Budget.spent = None
    try:
        yield
    finally:
        if _Budget.spent is not None and notes is not None:
            notes.append(_Budget.spent)


def _run_forward(function_class, args, slots, arrays, mode):
    """The forward of function_class (a Function, or an Inlined wrapper) as plain torch code at arrays (in the checked
    slots), under mode: (xs, y). Inside search_budget, a run past its budget raises SearchSpent instead."""
    if _Budget.calls:
        if (_Budget.runs + 1) * _Budget.calls > SEARCH_CALLS:
            _Budget.spent = (f"{SEARCH_SPENT} after {_Budget.runs} runs of the forward ({_Budget.calls} torch calls "
                             f"each, {SEARCH_CALLS} in all): a forward this long is searched no further, and the "
                             "check's findings stand as they are")
            raise SearchSpent(_Budget.spent)
        _Budget.runs += 1
    args = list(args)
    xs = [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for a in arrays]
    for slot, x in zip(slots, xs):
        args[slot] = x
    mode.inputs = xs
    with torch.enable_grad(), mode:
        y = _plain_forward(function_class, args)
    return xs, one_output(y)


def one_output(y):
    """The forward's output as one tensor: a Function with several outputs (a scan's states and its last one) gives
    its floating-point ones flattened and joined, so that a cotangent of the joined vector is one ȳ of each."""
    if isinstance(y, (tuple, list)):
        tensors = [t for t in y if isinstance(t, torch.Tensor) and t.is_floating_point()]
        if len(tensors) == 1:
            return tensors[0]
        if tensors:
            return torch.cat([t.reshape(-1) for t in tensors])
    return y


class Inlined:
    """A callable around a Function's apply (a lambda, a functools.partial, a function or a module, called with the
    check's keyword arguments) run as plain torch code, where _run_forward runs a Function: while it runs, the
    Function's apply is its forward on a stand-in ctx, so that autograd differentiates the forward itself and the
    recorder sees its calls, and the wrapper's own calls beside them. An apply the wrapper holds bound where the class
    cannot reach it (kept in a closure before the call) is not inlined: then the forward is refused (RuntimeError),
    not differentiated through the backward under check."""

    setup_context = getattr(torch.autograd.Function, "setup_context", None)  # _plain_forward passes a ctx

    def __init__(self, fn, function_class, kwargs):
        self.fn, self.function_class, self.kwargs = fn, function_class, dict(kwargs or {})

    def forward(self, _ctx, *args):
        function_class, inlined = self.function_class, []

        def apply(*a):
            inlined.append(True)
            return _plain_forward(function_class, a)

        own = function_class.__dict__.get("apply")
        function_class.apply = staticmethod(apply)
        try:
            y = _call_inlined(self.fn, args, self.kwargs, function_class, apply)
        finally:
            if own is None:
                del function_class.apply
            else:
                function_class.apply = own
        if not inlined:
            raise RuntimeError(f"the wrapper called {function_class.__name__}.apply where it could not be inlined")
        return y


def _call_inlined(fn, args, kwargs, function_class, apply):
    """fn(*args, **kwargs), a functools.partial's layers opened so that an apply they hold is the inlined one."""
    if isinstance(fn, functools.partial):
        return _call_inlined(fn.func, fn.args + tuple(args), {**fn.keywords, **kwargs}, function_class, apply)
    if getattr(fn, "__name__", "") == "apply" and getattr(fn, "__self__", None) is function_class:
        return apply(*args, **kwargs)
    return fn(*args, **kwargs)


def _vjps(xs, y, cotangents):
    """x̄ for each x, the VJPs at each cotangent flattened and stacked: one vector per input."""
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        return [np.zeros(x.numel() * len(cotangents)) for x in xs]
    per_input = [[] for _ in xs]
    for g in cotangents:
        grads = torch.autograd.grad(y, xs, torch.from_numpy(g), retain_graph=True, allow_unused=True)
        for i, (x, gx) in enumerate(zip(xs, grads)):
            per_input[i].append(np.zeros(x.numel()) if gx is None else gx.detach().numpy().ravel())
    return [np.concatenate(v) for v in per_input]


@dataclass
class Recorded:
    """The forward recorded at the check's point (recorder: its calls; xs: its inputs as leaves) and its VJPs at
    COTANGENTS random ȳ, stacked per input: the true ones (torch's autograd through the plain forward; None where the
    forward's output has no derivative) and the user's backward's; each call's operand named (operand) and the edges
    to try (candidates: (edges, tried, total, capped), as _candidates gives them)."""
    recorder: object
    xs: list = None
    cotangents: list = None
    true: list = None
    user: list = None
    operand: dict = None
    candidates: tuple = None


def record(checked, function_class, forward, fixed, parts):
    """The forward of the Function checked (gradcheck's call checked) recorded at its point: forward, what
    _run_forward runs (function_class itself or the wrapper with its apply inlined), on fixed (the arguments in
    float64), its calls written out in their parts where parts."""
    fn, slots, names, arrays, seed = checked.fn, checked.slots, checked.names, checked.arrays, checked.options.seed
    recorder = _Forward(record=True, parts=parts)
    xs, y = _run_forward(forward, fixed, slots, arrays, recorder)
    if not isinstance(y, torch.Tensor) or not y.requires_grad:
        return Recorded(recorder)
    rng = np.random.default_rng(seed ^ 0x666F7277)  # "forw": its own stream, apart from the checks' draws
    cotangents = [rng.standard_normal(tuple(y.shape)) for _ in range(COTANGENTS)]
    true = _vjps(xs, y, cotangents)

    # The user's backward: the Function's apply under autograd, as the check ran it.
    args = list(fixed)
    user_xs = [torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True) for a in arrays]
    for slot, x in zip(slots, user_xs):
        args[slot] = x
    with torch.enable_grad():
        user_y = fn(*args, **(checked.kwargs or {}))
    user = _vjps(user_xs, one_output(user_y), cotangents)

    for call in recorder.calls:
        frame_file = call.place[0]
        if frame_file not in _paths:
            _paths[frame_file] = _source_path(function_class, frame_file)
    return Recorded(recorder, xs, cotangents, true, user, _name_calls(recorder.calls, names, xs),
                    _candidates(recorder.calls))


def _source_path(function_class, basename):
    """The full path of the file the forward's lines come from (the calls keep its base name)."""
    try:
        path = inspect.getsourcefile(function_class.forward)
        if path and os.path.basename(path) == basename:
            return path
    except (TypeError, OSError):
        pass
    return basename


def _name_calls(calls, names, xs):
    """Each call's `assigned` name, and a function that writes an operand: an input's name, the name its value was
    assigned to, or the expression that made it."""
    for call in calls:
        match = _ASSIGNMENT.match(linecache.getline(_full_path(call), call.place[1]) or "")
        if match and call.place[2] and match.group(2).rstrip(";") == call.place[2]:
            call.assigned = match.group(1)
    made_by = {id(c.out): c for c in calls}
    input_name = {id(x): n for x, n in zip(xs, names)}

    def operand(t):
        if id(t) in input_name:
            return input_name[id(t)], None
        call = made_by.get(id(t))
        if call is None:
            return "a value of the forward", None
        if call.inside is not None:  # a part of a call written out: its own op
            return call.name, call
        return (call.assigned or call.text), call

    return operand


_paths = {}


def _full_path(call):
    return _paths.get(call.place[0], call.place[0])


def _fraction(f):
    """f as a small fraction p/q (q ≤ 6), or None."""
    for q in range(1, 7):
        p = round(f * q)
        if p != 0 and abs(f * q - p) <= 1e-6 * max(1.0, abs(f * q)):
            return f"{p}" if q == 1 else f"{p}/{q}"
    return None


def _describe_factor(f, values):
    """What the factor f = 1 + α of a term reads as: "2/3", "1/beta (beta = 1.7)", "1/√16"; values maps a name of
    the forward (a scalar input, a number in a call, a size) to its value."""
    close = lambda a, b: abs(a - b) <= 1e-6 * max(abs(a), abs(b))
    for name, v in values:
        if v in (0.0, 1.0, -1.0) or not math.isfinite(v):
            continue
        shown = f"{name} (= {v:.6g})" if name != f"{v:g}" else name
        for text, value in ((shown, v), (f"1/{shown}", 1 / v), (f"{shown}²", v * v)):
            if close(f, value):
                return text, name
        if v > 0:
            for text, value in ((f"√{shown}", math.sqrt(v)), (f"1/√{shown}", 1 / math.sqrt(v))):
                if close(f, value):
                    return text, name
    fraction = _fraction(f)
    return (fraction or f"{f:.6g}"), None


def _role(call, j, operand_text):
    """Which term of call's rule the edge into its operand j is."""
    joined = len(call.operands) > 1
    if call.name in _PRODUCT and joined:
        return f"the product rule's term through `{operand_text}`"
    if call.name in _QUOTIENT and joined:
        return (f"the quotient rule's term through the denominator `{operand_text}`" if j == 1
                else f"the quotient rule's term through the numerator `{operand_text}`")
    if call.name in _SUM and joined:
        return f"the term of `{operand_text}`"
    if call.name in ("pow", "__pow__") and call.numbers:
        return f"the power rule's term through `{operand_text}`"
    return f"the chain rule's term through `{operand_text}`"


def _term(call, j, operand):
    text, producer = operand(call.operands[j])
    if call.inside is not None:
        name, formula = call.inside
        return f"{_role(call, j, text)} in {name} = {formula}, written out, of `{call.text}` at {call.where}"
    term = f"{_role(call, j, text)} in `{call.text}` at {call.where}"
    if producer is not None and producer.assigned == text:
        term += f" (`{text}` = `{producer.text}` at {producer.where})"
    return term


def _candidates(calls):
    """Every (call, operand, how) tried: each edge detached, and calls with one dependent operand of the output's
    shape run straight through."""
    edges = [(c, j) for c in calls for j in range(len(c.operands))
             if not (c.name.endswith("_") and not c.name.endswith("__")) and c.name not in ("detach", "__setitem__")]
    capped = len(edges) > MAX_EDGES
    tried = edges[:MAX_EDGES]
    out = []
    for call, j in tried:
        out.append((call, j, "detach"))
        if (len(call.operands) == 1 and call.name not in _PRODUCT | _QUOTIENT | _SUM
                and tuple(call.out.shape) == tuple(call.operands[0].shape)):
            out.append((call, j, "straight"))
    return out, len(tried), len(edges), capped


def is_elementwise(call):
    """Whether call is one operand's function element by element: its output of the operand's shape, and its VJP at
    a random v equal to v times its VJP at ones (a diagonal Jacobian)."""
    if len(call.operands) != 1 or tuple(call.out.shape) != tuple(call.operands[0].shape) or call.out.numel() < 2:
        return False
    try:
        v = torch.randn(call.out.shape, dtype=call.out.dtype, generator=torch.Generator().manual_seed(7))
        at_v, = torch.autograd.grad(call.out, call.operands[0], v, retain_graph=True)
        at_one, = torch.autograd.grad(call.out, call.operands[0], torch.ones_like(v), retain_graph=True)
    except RuntimeError:
        return False
    return torch.allclose(at_v, v * at_one, rtol=1e-9, atol=1e-12)


def best_finding(fits, input_name, operand, values, note):
    """The finding of the fit that names input_name's slip best, of its fits (call, j, how, α, residual): the first
    by _preference. The edges along one chain fit alike: a power among them says where the factor comes from."""
    best = min(fits, key=lambda c: _preference(c, values))
    chain = [c for c in fits if c[2] == best[2] and abs(c[3] - best[3]) <= 1e-6 * max(1, abs(best[3]))]
    return _finding(best, chain, input_name, operand, values, note)


def _preference(fit, values):
    """Order of the fits: a dropped term, a term counted twice, a term of the wrong sign, a wrong value, a factor the
    forward's values explain, any factor; then the call that joins two terms; then the latest call."""
    call, j, how, alpha, _ = fit
    if how == "straight":
        rank = 2
    elif abs(alpha + 1) <= 1e-6:
        rank = 0
    elif abs(alpha - 1) <= 1e-6:
        rank = 1
    elif abs(alpha + 2) <= 1e-6:
        rank = 1.5
    else:
        rank = 3 if _describe_factor(1 + alpha, values)[1] is not None or _fraction(1 + alpha) else 4
    return rank, -len(call.operands), -call.index


def _finding(fit, chain, input_name, operand, values, note):
    call, j, how, alpha, _ = fit
    if how == "straight":
        text, _ = operand(call.operands[j])
        made = call.assigned or call.text
        if is_elementwise(call):  # a diagonal Jacobian left out is a factor f′ missing, not a value read wrong
            return ("term_factor", input_name, "vjp",
                    f"x̄ misses the chain rule's factor of `{call.text}` at {call.where}, its derivative (the error is "
                    f"−1 × that call's part, to rounding): the backward takes the gradient of `{made}` as that of "
                    f"`{text}`; it must multiply it by {call.name.strip('_')}′{note}")
        return ("wrong_value", input_name, "vjp",
                f"x̄ is the forward's rule with the derivative of `{call.text}` at {call.where} left out (the error is "
                f"−1 × that call's part, to rounding): the backward uses the gradient of `{made}` where the gradient "
                f"of `{text}` belongs; it must take it through that call's derivative{note}")
    term = _term(call, j, operand)
    if abs(alpha + 1) <= 1e-6:
        return ("term_dropped", input_name, "vjp",
                f"x̄ misses one term of the forward's rule (the error is −1 × that term, to rounding): {term}; the "
                f"backward must add it{note}")
    if abs(alpha - 1) <= 1e-6:
        return ("term_added", input_name, "vjp",
                f"x̄ counts one term of the forward's rule twice (the error is +1 × that term, to rounding): {term}; "
                f"the backward must count it once{note}")
    if abs(alpha + 2) <= 1e-6:
        return ("term_sign", input_name, "vjp",
                f"x̄ has one term of the forward's rule with the wrong sign (the error is −2 × that term, to "
                f"rounding): {term}; the backward must add it where it subtracts it, or the reverse{note}")
    factor = 1 + alpha
    described, value_name = _describe_factor(factor, values)
    hint = ""
    exponents = [n for c in chain if c[0].name in ("pow", "__pow__") for n in c[0].numbers if n not in (0, 1)]
    if exponents and value_name is None:
        written = factor * exponents[0]
        if abs(written - round(written)) <= 1e-6:
            hint = f"; the power rule's factor {exponents[0]:g} is written {round(written):g}"
    elif value_name is not None:
        # The call along the chain that multiplies by that value, where the forward has one.
        value = dict(values).get(value_name)
        home = next((c[0] for c in sorted(chain, key=lambda c: c[0].index)
                     if value in c[0].numbers or re.search(rf"\b{re.escape(value_name)}\b", c[0].text)), None)
        at = f" (of `{home.text}` at {home.where})" if home is not None and home is not call else ""
        # The same error either way round: a factor left out of the term, or a division by it written once too often.
        hint = (f"; the factor {value_name}{at} is missing from it, or it is divided by {value_name} once too often"
                if described.startswith("1/")
                else f"; it has a factor {value_name}{at} too many, or a division by {value_name} is missing")
    return ("term_factor", input_name, "vjp",
            f"x̄ has one term of the forward's rule {described} times (the error is {alpha:.6g} × that term, to "
            f"rounding): {term}{hint}{note}")
