"""tapegrad.gradcheck: the inputs and options of a Python call, handed to the C++ checker (python/module.cpp)."""

import inspect
import math
import sys

import numpy as np

from . import _tapegrad
from ._numpy_op import NumpyOp


class GradcheckError(RuntimeError):
    """Raised by gradcheck(..., raise_exception=True) on a failure; .report holds the whole report."""

    def __init__(self, report):
        super().__init__("tapegrad.gradcheck failed:\n" + str(report))
        self.report = report


def _is_torch_tensor(x):
    torch = _torch_if_loaded()
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_if_loaded():
    """torch if the caller has imported it (its tensors can only come from there); tapegrad does not load it."""
    return sys.modules.get("torch")


def _is_float_array(x):
    return isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating)


def _function_class(fn):
    """The class whose `apply` fn is (a torch.autograd.Function), or None."""
    target = getattr(fn, "__self__", None)
    return target if getattr(fn, "__name__", "") == "apply" and isinstance(target, type) else None


def _parameter_names(fn, count):
    """The callable's parameter names (a torch.autograd.Function's forward without ctx), when it has `count`."""
    function_class = _function_class(fn)
    if function_class is not None:
        fn = function_class.forward
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params]
    if names and names[0] == "ctx":
        names = names[1:]
    return names[:count] if len(names) >= count else None


def _op_name(fn):
    function_class = _function_class(fn)
    if function_class is not None:
        return function_class.__name__
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


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
    if _is_torch_tensor(x):
        x = x.detach().cpu().to(dtype=_torch_if_loaded().float64).numpy()
    x = np.asarray(x)
    if not np.issubdtype(x.dtype, np.floating):
        raise TypeError(f"gradcheck: input {i} has dtype {x.dtype}; a checked input must be floating-point")
    return np.ascontiguousarray(x, dtype=np.float64)


def _number(who, option, value, expected, ok):
    """float(value), or a ValueError naming the option, the value and what it must be."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{who}: {option} must be {expected}, got {value!r}") from None
    if not (math.isfinite(x) and ok(x)):
        raise ValueError(f"{who}: {option} must be {expected}, got {value!r}")
    return x


def _options(who, eps, atol, rtol, fast_mode, projections, seed, diagnose):
    """The checker's options, each refused as `tapegrad gradcheck` and `tapegrad claim` refuse it: a step or a
    tolerance that is NaN or infinite makes every comparison meaningless (NaN compares false, an infinite tolerance
    accepts anything), and a step of 0 divides by zero."""
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


def _require_full_jacobian_memory(impl, name, arrays):
    """Full Jacobians (fast_mode=False) have the checker hold m·n float64 numbers for the VJP's rows and as many for
    the differences (m the output's size, n the checked inputs'): one forward gives m, and the estimate is held
    against the memory available (TAPEGRAD_MEMORY_LIMIT included) before anything of that size is allocated."""
    y, _ = impl.forward([a.copy() for a in arrays], False)
    m, n = float(np.size(y)), float(sum(a.size for a in arrays))
    _tapegrad._require_memory(2 * 8 * m * n, f"gradcheck {name} with full Jacobians ({m:.4g} outputs × {n:.4g} "
                              "input elements)", "leave fast_mode at None or pass True: random projections check "
                              "the same rules in memory of the inputs' size")


# Kinds that already say what is wrong with an input's VJP; a failure none of them explains is fitted against the
# terms of the forward (tapegrad/_forward.py).
_EXPLAINING = {"not_finite", "zero", "nonlinear", "sign", "scale", "transposed_jacobian", "transposed_input",
               "transposed_output", "transposed_term", "term_sign", "masked_positions", "per_row_term", "kink",
               "tolerance", "overwrites"}


def _name_from_forward(report, fn, inputs, slots, names, arrays, seed):
    """Adds to the report the slip of each failing, unexplained VJP that is one term of a Function's forward."""
    failing = {c.input for c in report.checks if c.check == "vjp" and not c.passed and not c.skipped}
    for d in report.diagnoses:
        if d.kind in _EXPLAINING:
            if d.input:
                failing.discard(d.input)
            else:
                failing.clear()
    if not failing:
        return
    from ._forward import name_from_forward
    for kind, input_name, check, message in name_from_forward(fn, inputs, slots, names, arrays, failing, seed):
        _tapegrad._add_diagnosis(report, kind, input_name, check, message)


def claim(text, *, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=None, projections=4, seed=20240809, diagnose=True):
    """Checks derivatives claimed as formulas, in the format of docs/claims/README.md (`tapegrad claim --file`):
    one Report per `claim NAME` block. The formulas are evaluated in C++ and the checks are the CLI's."""
    return _tapegrad._claim(text, _options("claim", eps, atol, rtol, fast_mode, projections, seed, diagnose))


def gradcheck(fn, inputs, *, vjp=None, jvp=None, hvp=None, order=1, eps=1e-6, atol=1e-5, rtol=1e-3,
              fast_mode=None, projections=4, inputs_to_check=None, names=None, seed=20240809, diagnose=True,
              raise_exception=False, name=None):
    """Checks fn's derivatives at `inputs` with tapegrad's C++ checker and returns its Report.

    fn: a callable on torch tensors (a Function.apply, a module, a function), whose derivatives come from torch
        (torch.autograd.grad, torch.autograd.forward_ad, double backward for order=2); or, when `vjp` is given, a
        callable on numpy arrays with its own rules: vjp(gout, *xs) → one array per input, jvp(tangents, *xs) → an
        array (absent: a "no JVP" note), hvp(gout, tangents, *xs) → one array per input (for order=2).
    inputs: a tuple of tensors or arrays (any float dtype: the check runs in float64); other values are passed as
        they are. Checked: inputs_to_check (indices) if given, else the tensors that require grad if any, else every
        floating-point input.
    order: 1 checks the VJP, JVP, adjoint identity and accumulation; 2 the Hessian-vector product (double
        backward) against differences of the gradient, and its symmetry.
    eps, atol, rtol: the differences' step and the tolerance |a − n| ≤ atol + rtol·|n|, as torch names them.
    fast_mode: True: random projections (projections of them) for every input; False: full Jacobians; None: full
        where m·n ≤ 40000.
    names: the inputs' names in the report (default: the parameters' names, else x0, x1, ...).
    raise_exception: raise GradcheckError (with the report) on a failure instead of returning it.
    """
    if isinstance(order, bool) or not isinstance(order, (int, np.integer)) or order not in (1, 2):
        raise ValueError(f"gradcheck: order must be 1 (VJP and JVP) or 2 (Hessian-vector products), got {order!r}")
    order = int(order)
    options = _options("gradcheck", eps, atol, rtol, fast_mode, projections, seed, diagnose)
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    inputs = tuple(inputs)
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

    name = name or _op_name(fn)
    if vjp is not None:
        impl = NumpyOp(fn, inputs, slots, vjp, jvp, hvp)
    else:
        if jvp is not None or hvp is not None:
            raise ValueError("gradcheck: jvp= and hvp= go with vjp= (numpy rules); a torch op brings its own")
        from ._torch_op import TorchOp
        impl = TorchOp(fn, inputs, slots, name, second_order=order == 2)

    if fast_mode is not None and not fast_mode:
        _require_full_jacobian_memory(impl, name, arrays)
    report = _tapegrad._check(impl, name, arrays, checked_names, order, options)
    if order == 1 and vjp is None and options.diagnose and not report.passed:
        _name_from_forward(report, fn, inputs, slots, checked_names, arrays, options.seed)
    if raise_exception and not report.passed:
        raise GradcheckError(report)
    return report
