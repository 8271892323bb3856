"""What tapegrad.gradcheck is handed, read: the callable (a torch.autograd.Function's apply, a functools.partial or a
lambda around one, a torch.nn.Module or a plain function; the Function behind it, its name and its parameters'
names), and the call as a whole (read_call: which inputs are checked, their names and float64 values, the checker's
options). Read by the check (_gradcheck.py), the op's rules (_torch_op.py) and the naming from the forward
(_forward.py); it reads torch only where the caller has imported it."""

import functools
import inspect
import math
import sys
from dataclasses import dataclass

import numpy as np

from . import _tapegrad


def _is_torch_tensor(x):
    torch = _torch_if_loaded()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_if_loaded():
    """torch if the caller has imported it (its tensors can only come from there); tapegrad does not load it."""
    return sys.modules.get("torch")


def _unwrap_partial(fn):
    """fn without its functools.partial layers: (the callable, how many leading positional arguments they bind)."""
    bound = 0
    while isinstance(fn, functools.partial):
        bound += len(fn.args)
        fn = fn.func
    return fn, bound


def _is_function_class(c):
    torch = _torch_if_loaded()
    return (torch is not None and isinstance(c, type) and issubclass(c, torch.autograd.Function)
            and c is not torch.autograd.Function)


def _function_class(fn):
    """The torch.autograd.Function whose `apply` fn is or calls: fn itself, a functools.partial's func, or the one
    Function a lambda's (or a function's) body reads `apply` from, found in its closure or its globals; else None."""
    fn, _ = _unwrap_partial(fn)
    target = getattr(fn, "__self__", None)
    if getattr(fn, "__name__", "") == "apply" and _is_function_class(target):
        return target
    code = getattr(fn, "__code__", None)
    if code is None or "apply" not in code.co_names:
        return None
    seen = []
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            seen.append(cell.cell_contents)
        except ValueError:  # a cell not filled yet
            pass
    names = getattr(fn, "__globals__", {})
    seen += [names[n] for n in code.co_names if n in names]
    seen = [getattr(c, "__self__", None) if getattr(c, "__name__", "") == "apply" else c for c in seen]
    found = {c for c in seen if _is_function_class(c)}
    return found.pop() if len(found) == 1 else None


def _function_class_behind(fn):
    """The Function behind fn as _function_class finds it, or, for a module, behind its forward: the one whose
    forward names a slip and whose backward is traced (a module's own name and parameters stay the report's)."""
    return _function_class(fn.forward if _is_module(fn) else fn)


def _is_module(fn):
    torch = _torch_if_loaded()
    return torch is not None and isinstance(fn, torch.nn.Module)


def _positional_names(fn):
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _parameter_names(fn, count):
    """The callable's parameter names, when it has `count`: a lambda's or function's own (those the inputs are bound
    to), else (a partial of a Function's apply, a lambda taking *args) its Function's forward's without ctx and
    without what a partial binds; a Module's forward's."""
    unwrapped, bound = _unwrap_partial(fn)
    function_class = _function_class(fn)
    names = None
    if not (function_class is not None and unwrapped == getattr(function_class, "apply", None)):
        names = _positional_names(fn.forward if _is_module(fn) else fn)
    if (names is None or len(names) < count) and function_class is not None:
        names = _positional_names(function_class.forward)
        if names and names[0] == "ctx":
            names = names[1:]
        names = names[bound:] if names is not None and unwrapped == function_class.apply else names
    return names[:count] if names is not None and len(names) >= count else None


def _op_name(fn):
    function_class = _function_class(fn)
    if function_class is not None:
        return function_class.__name__
    if _is_module(fn):
        return type(fn).__name__
    fn, _ = _unwrap_partial(fn)
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


def read_call(fn, inputs, **given):
    """gradcheck's arguments read into the call its checks run (_Call), each refused with what it must be: given holds
    gradcheck's order, names, inputs_to_check, params, kwargs, name, reference, surrogate, whether fn comes with numpy
    rules (numpy_rules), and the keyword options a float64 check of the same op takes (keywords: eps, atol, rtol,
    fast_mode, projections, seed, diagnose). A module checked with its parameters (params=True) becomes a function of
    its inputs and then its parameters; an op checked against a surrogate (tapegrad/_surrogate.py) becomes the op
    whose backward is checked as the surrogate's derivative."""
    order, names, inputs_to_check, params, kwargs, name, reference, surrogate, numpy_rules, keywords = (
        given[k] for k in ("order", "names", "inputs_to_check", "params", "kwargs", "name", "reference", "surrogate",
                           "numpy_rules", "keywords"))
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order not in (1, 2):
        raise ValueError(f"gradcheck: order must be 1 (VJP and JVP) or 2 (Hessian-vector products), got {order!r}")
    order = int(order)
    options = _options("gradcheck", keywords)
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    inputs = tuple(inputs)
    if kwargs is not None and not isinstance(kwargs, dict):
        raise ValueError(f"gradcheck: kwargs must be a dict of keyword arguments for fn, got {kwargs!r}")
    name = name or _op_name(fn)
    parameter_names = []
    if params:
        if not _is_module(fn):
            raise ValueError(f"gradcheck: params=True checks a torch.nn.Module's parameters; fn is "
                             f"{type(fn).__name__}")
        named = list(fn.named_parameters())
        if not named:
            raise ValueError(f"gradcheck: params=True, but the module {type(fn).__name__} has no parameters")
        parameter_names = [n for n, _ in named]
        if names is None:
            names = (_parameter_names(fn, len(inputs)) or [f"x{i}" for i in range(len(inputs))]) + parameter_names
        if inputs_to_check is None:
            inputs_to_check = list(_checked_slots(inputs, None)) if any(
                _is_torch_tensor(x) and x.requires_grad for x in inputs) else []
            inputs_to_check += range(len(inputs), len(inputs) + len(named))
        fn, inputs = _module_call(fn, len(inputs), parameter_names), inputs + tuple(p for _, p in named)
    slots = _checked_slots(inputs, inputs_to_check)
    if not slots:
        raise ValueError("gradcheck: no input to check (no floating-point tensor or array among the inputs)")
    arrays = [_as_float64_array(inputs[i], i) for i in slots]
    if names is None:
        all_names = _parameter_names(fn, len(inputs)) or [f"x{i}" for i in range(len(inputs))]
    else:
        all_names = list(names)
        if len(all_names) == len(slots) and len(slots) != len(inputs):
            all_names = {s: n for s, n in zip(slots, all_names)}
            all_names = [all_names.get(i, f"x{i}") for i in range(len(inputs))]
        if len(all_names) != len(inputs):
            raise ValueError(f"gradcheck: {len(all_names)} names for {len(inputs)} inputs")
    checked_names = [str(all_names[i]) for i in slots]
    for array, input_name in zip(arrays, checked_names):
        if array.size == 0:  # no element of it to perturb or compare: a check of it would pass having checked nothing
            raise ValueError(f"gradcheck: input '{input_name}' has shape {array.shape}, no elements, so nothing of it "
                             "can be checked (leave it out with inputs_to_check, or give it elements)")

    declared = None
    if surrogate is not None:
        if numpy_rules or order != 1 or not callable(surrogate):
            raise ValueError("gradcheck: surrogate= is a callable on fn's arguments, for a torch op at order 1 "
                             f"(got {type(surrogate).__name__}, order {order}{', with vjp=' if numpy_rules else ''})")
        from ._surrogate import declared as declared_op
        declared = getattr(surrogate, "__name__", type(surrogate).__name__)
        fn, kwargs = declared_op(fn, surrogate, kwargs or {}), None
    return _Call(fn, inputs, slots, checked_names, arrays, name, order, kwargs, options, keywords["fast_mode"],
                 reference, keywords, declared, runs_elsewhere(inputs, slots),
                 None if numpy_rules else _function_class_behind(fn))


def _is_float_array(x):
    return isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating)


def _checked_slots(inputs, inputs_to_check):
    """Which inputs are checked: those named, else (as torch.autograd.gradcheck) the tensors that require grad,
    else every floating-point tensor or array."""
    if inputs_to_check is not None:
        slots = [int(i) for i in inputs_to_check]
        for i in slots:
            if not 0 <= i < len(inputs):
                raise IndexError(f"gradcheck: inputs_to_check names input {i} of {len(inputs)}")
        return slots
    torch = _torch_if_loaded()
    if torch is not None and any(isinstance(x, torch.Tensor) and x.requires_grad for x in inputs):
        return [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor) and x.requires_grad]
    return [i for i, x in enumerate(inputs)
            if (_is_torch_tensor(x) and x.is_floating_point()) or _is_float_array(x)]


def _as_float64_array(x, i):
    """A checked input as a float64 array of its own shape (0-d kept 0-d: np.ascontiguousarray would make it (1,)).
    An integer or bool input is refused, not cast: it has no derivative, and casting it would check another op."""
    dtype = x.dtype if _is_torch_tensor(x) else np.asarray(x).dtype
    floating = x.is_floating_point() if _is_torch_tensor(x) else np.issubdtype(dtype, np.floating)
    if not floating:
        raise ValueError(f"gradcheck: input {i} has dtype {dtype}; a checked input must be floating-point (an "
                         "integer or bool input has no derivative: leave it out of inputs_to_check, and it is passed "
                         "to fn unchanged)")
    if _is_torch_tensor(x):
        x = x.detach().cpu().to(dtype=_torch_if_loaded().float64).numpy()
    return np.array(x, dtype=np.float64, order="C")


def _number(who, option, value, expected, ok):
    """float(value), or a ValueError naming the option, the value and what it must be."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: {option} must be {expected}, got {value!r}") from None
    if not (math.isfinite(x) and ok(x)):
        raise ValueError(f"{who}: {option} must be {expected}, got {value!r}")
    return x


def above_the_limit(limit):
    """The C++ checker's ", above full_jacobian_limit = N)" said in gradcheck's terms (N: the limit, as written):
    Python's gradcheck takes fast_mode, not full_jacobian_limit."""
    return f", above the {limit} that gradcheck takes in full by default)" if limit != "0" else ")"


def _options(who, keywords):
    """The checker's options from gradcheck's or claim's keyword options (eps, atol, rtol, fast_mode, projections,
    seed, diagnose), each refused as `tapegrad gradcheck` and `tapegrad claim` refuse it: a step or a tolerance that
    is NaN or infinite makes every comparison meaningless (NaN compares false, an infinite tolerance accepts
    anything), and a step of 0 divides by zero."""
    eps, atol, rtol, fast_mode, projections, seed, diagnose = (
        keywords[k] for k in ("eps", "atol", "rtol", "fast_mode", "projections", "seed", "diagnose"))
    options = _tapegrad._Options()
    options.eps = _number(who, "eps", eps, "a finite number > 0", lambda x: x > 0)
    options.atol = _number(who, "atol", atol, "a finite number > 0", lambda x: x > 0)
    options.rtol = _number(who, "rtol", rtol, "a finite number ≥ 0", lambda x: x >= 0)
    if isinstance(projections, bool) or not isinstance(projections, (int, np.integer)) or projections < 1:
        raise ValueError(f"{who}: projections must be an integer ≥ 1 (random directions per input), "
                         f"got {projections!r}")
    if fast_mode is not None and not isinstance(fast_mode, (bool, np.bool_)):
        raise ValueError(f"{who}: fast_mode must be True, False or None, got {fast_mode!r}")
    options.projections = int(projections)
    options.seed = int(seed)
    options.diagnose = bool(diagnose)
    if fast_mode is not None:
        options.full_jacobian_limit = 0 if fast_mode else 2**62
    return options


def _module_call(module, count, parameter_names):
    """module as a function of its `count` inputs followed by its parameters (torch's functional_call)."""
    from torch.nn.utils.stateless import functional_call

    def call(*args, **kwargs):
        return functional_call(module, dict(zip(parameter_names, args[count:])), tuple(args[:count]), kwargs)
    return call


@dataclass
class _Call:
    """One gradcheck call, its arguments read: the op, its inputs, which of them are checked (slots) with their names
    and float64 values (arrays), the report's name, the order, fn's keyword arguments, the C++ checker's options,
    fast_mode as given, the reference, the keyword options a float64 check of the same op takes (keywords), and the
    surrogate's name where fn's backward is checked as a surrogate's derivative, whether the check runs at the
    inputs' precision and device (elsewhere), and the torch.autograd.Function behind fn, if any."""
    fn: object
    inputs: tuple
    slots: list
    names: list
    arrays: list
    name: str
    order: int
    kwargs: dict
    options: object
    fast_mode: object
    reference: object
    keywords: dict
    surrogate: str = None  # the name of the callable whose derivative fn's backward declares it takes, if any
    elsewhere: bool = False  # a checked input is a torch tensor below float64 or off the CPU (runs_elsewhere)
    function_class: object = None  # the Function whose apply fn calls (_function_class_behind), if any


def runs_elsewhere(inputs, slots):
    """Whether a checked input is a torch tensor below float64 or off the CPU: then the check runs at its precision
    and on its device (tapegrad/_precision.py)."""
    torch = _torch_if_loaded()
    return torch is not None and any(
        isinstance(inputs[i], torch.Tensor) and inputs[i].is_floating_point()
        and (inputs[i].dtype != torch.float64 or inputs[i].device.type != "cpu") for i in slots)


# What a check with full Jacobians holds at its peak, measured as the growth of the process's peak resident memory
# (Debian's torch 1.13, CPU): 75–132 bytes per Jacobian entry over 11 torch ops (sums, softmax, layer norm, matmul,
# attention, conv1d, scans, a failing Function among them), 40 for numpy rules, and about 2.4 kB more per checked
# input element. The VJP's and the differences' Jacobians, the forward's outputs at x ± εe_k, their copies on each
# side of the boundary and the diagnosis's work on them: 16 float64 numbers per entry bounds every one measured.
_FULL_CHECK_BYTES_PER_ENTRY = 16 * 8
_FULL_CHECK_BYTES_PER_INPUT_ELEMENT = 2500


def require_full_jacobian_memory(impl, name, arrays):
    """Full Jacobians (fast_mode=False): the check's peak, m·n entries (m the output's size, n the checked inputs')
    at _FULL_CHECK_BYTES_PER_ENTRY each and n elements at _FULL_CHECK_BYTES_PER_INPUT_ELEMENT, is held against the
    memory available (TAPEGRAD_MEMORY_LIMIT included) after one forward gives m, before anything of that size is
    allocated."""
    y, _ = impl.forward([a.copy() for a in arrays], False)
    m, n = float(np.size(y)), float(sum(a.size for a in arrays))
    _tapegrad._require_memory(_FULL_CHECK_BYTES_PER_ENTRY * m * n + _FULL_CHECK_BYTES_PER_INPUT_ELEMENT * n,
                              f"gradcheck {name} with full Jacobians ({m:.4g} outputs × {n:.4g} input elements)",
                              "leave fast_mode at None or pass True: random projections check the same rules in "
                              "memory of the inputs' size")
