"""tapegrad.gradcheck: the inputs and options of a Python call, handed to the C++ checker (python/module.cpp)."""

import math
import re
from dataclasses import dataclass

from . import _tapegrad
from ._callables import (_Call, _function_class, _options, _torch_if_loaded, above_the_limit, read_call,
                         require_full_jacobian_memory)
from ._numpy_op import NumpyOp


class GradcheckError(RuntimeError):
    """Raised by gradcheck(..., raise_exception=True) on a failure; .report holds the whole report."""

    def __init__(self, report):
        super().__init__("tapegrad.gradcheck failed:\n" + str(report))
        self.report = report


EDGE_LEFT_FREE = "at every element but those at the edge nothing moved into"  # checker/findings/shifted.cpp's words


def _name_from_forward(report, call):
    """Adds to the report the slip of each failing, unexplained VJP that is one term of a Function's forward."""
    failing = {c.input for c in report.checks if c.check == "vjp" and not c.passed and not c.skipped}
    # Kinds that already say what is wrong with an input's VJP (their sheets' `explains`, checker/findings/); a
    # failure none of them explains is fitted against the terms of the forward (tapegrad/_forward.py). A per-row term
    # and masked positions are not among them: they say what shape the error has in each row or where it lies, not
    # which term of the rule makes it, and the term the forward names is put before them.
    # A Function with several outputs is checked per output ("x→y0", "x→all"); the forward is searched per input.
    # A shift with its edge left free (the last pass of checker/findings/shifted.cpp) is the weakest name the
    # Jacobian gives: the forward's terms are searched past it, and a term they name takes its place.
    explaining = set(_tapegrad._explaining_kinds())
    edge_shifted = {d.input for d in report.diagnoses if d.kind == "shifted" and EDGE_LEFT_FREE in d.message}
    explained = {d.input for d in report.diagnoses if d.kind in explaining and d.input not in edge_shifted}
    if "" in explained:
        return
    base = lambda name: name.split("→")[0]
    failing_checks = {name for name in failing if name not in explained and base(name) not in explained}
    if not failing_checks:
        return
    from ._forward import name_from_forward
    notes = []
    for kind, input_name, check, message in name_from_forward(call, {base(n) for n in failing_checks}, notes):
        # said at each output's check of that input that fails unexplained, where the op has several outputs
        at = sorted(n for n in failing_checks if base(n) == input_name and n != input_name)
        for name in at or [input_name]:
            if name in edge_shifted:
                _tapegrad._drop_diagnoses(report, "shifted", name)
            _tapegrad._add_diagnosis(report, kind, name, check, message)
    if notes:
        report._notes = getattr(report, "_notes", []) + notes


def claim(text, *, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=None, projections=4, seed=20240809, diagnose=True):
    """Checks derivatives claimed as formulas, in the format of docs/claims/README.md (`tapegrad claim --file`):
    one Report per `claim NAME` block. The formulas are evaluated in C++ and the checks are the CLI's."""
    return _tapegrad._claim(text, _options("claim", dict(eps=eps, atol=atol, rtol=rtol, fast_mode=fast_mode,
                                                         projections=projections, seed=seed, diagnose=diagnose)))


# The kink advice of the C++ checker names the C++ test harness's fill; a Python user draws the inputs.
_KINK_ADVICE = ("(Fill::away_from_zero)", "(draw the inputs away from it, e.g. x = torch.randn(...); "
                "x = x + 0.2 * x.sign(), or pass a point whose elements are not at the kink)")


def _in_python_terms(report):
    """The C++ checker's advice said with gradcheck's own arguments: the kink's fill, and full_jacobian_limit (a C++
    option; Python's gradcheck takes fast_mode)."""
    _tapegrad._reword(report, *_KINK_ADVICE)
    for d in report.diagnoses:
        for limit in set(re.findall(r"above full_jacobian_limit = (\d+)\)", d.message)):
            _tapegrad._reword(report, f", above full_jacobian_limit = {limit})", above_the_limit(limit))
        for entries in set(re.findall(r" or raise full_jacobian_limit to (\d+)", d.message)):
            _tapegrad._reword(report, f" or raise full_jacobian_limit to {entries}",
                              f" or pass fast_mode=False (a full Jacobian of {entries} entries)")
        for limit in set(re.findall(r"within full_jacobian_limit = (\d+), checked so", d.message)):
            _tapegrad._reword(report, f"within full_jacobian_limit = {limit}, checked so for what a full check costs "
                              "here", f"fewer than the {limit} that gradcheck takes in full by default, checked so "
                              "for what a full check costs here: two runs of the op per element, or a backward per "
                              "element of y")
        for entries in set(re.findall(r" or set full_jacobian_limit to (\d+), which checks in full at any cost",
                                      d.message)):
            _tapegrad._reword(report, f" or set full_jacobian_limit to {entries}, which checks in full at any cost",
                              " or pass fast_mode=False, which checks in full at any cost")


def _zero_cotangent_rows(report, result, checked_names):
    """The rows "zero ȳ": the backward at ȳ = 0 must run and give x̄ = 0 (torch's check_undefined_grad); result:
    TorchOp.zero_cotangent's."""
    from ._tapegrad import _add_check, _add_diagnosis
    if isinstance(result, tuple):
        error, case = result
        _add_check(report, dict(input="all", check="zero ȳ", mode="exact", passed=False, error=math.nan,
                                worst=f"raised {type(error).__name__}", analytic=math.nan, numeric=0.0,
                                sides=("x̄", "expected")))
        report._notes = getattr(report, "_notes", []) + [
            f"zero ȳ: the backward raised {type(error).__name__}: {error} (called with {case}, as torch's gradcheck "
            "calls it; with ctx.set_materialize_grads(False) an undefined gradient arrives as None)"]
        return
    for name, (largest, where) in zip(checked_names, result):
        at = "" if where is None else f"{name}[{', '.join(map(str, where))}]"
        _add_check(report, dict(input=name, check="zero ȳ", mode="exact", passed=largest == 0, error=largest, worst=at,
                                analytic=largest, numeric=0.0, sides=("x̄", "expected")))
        if largest != 0:
            _add_diagnosis(report, "nonlinear", name, "zero ȳ",
                           f"x̄ is not 0 at ȳ = 0 (|x̄| = {largest:.6g} at {at}): a VJP is linear in ȳ, so a term of "
                           "the backward does not depend on grad_output (multiply it by grad_output)")


def _name_saved_intermediates(report, impl, function_class, arrays):
    """A failed second order of a Function that keeps an intermediate of its inputs for backward: double backward
    differentiates the backward with that value held constant, so its terms along the inputs are lost."""
    from ._tapegrad import _add_diagnosis
    for value, file, line in impl.saved_intermediates(function_class, arrays):
        _add_diagnosis(report, "saved_in_forward", "", "hvp",
                       f"`{value}` was saved in forward ({file}:{line}) and is a constant to double backward: save "
                       "the inputs and recompute it in backward")


def _forward_mode_note(report, impl, fn):
    """A Function without jvp gets one line under the title instead of a "no JVP" diagnosis."""
    from ._tapegrad import _drop_diagnoses
    if impl.no_forward_mode is None:
        return
    torch = _torch_if_loaded()
    function_class = _function_class(fn)
    _drop_diagnoses(report, "no_jvp")
    if function_class is not None and getattr(function_class, "jvp", None) is torch.autograd.Function.jvp:
        note = "forward mode: not written (the Function has no jvp): the jvp and adjoint rows are skipped"
    else:
        note = (f"forward mode: not available ({impl.no_forward_mode.splitlines()[0]}): the jvp and adjoint rows are "
                "skipped")
    report._notes = [note] + getattr(report, "_notes", [])


def gradcheck(fn, inputs, *, vjp=None, jvp=None, hvp=None, order=1, eps=1e-6, atol=1e-5, rtol=1e-3,
              fast_mode=None, projections=4, inputs_to_check=None, names=None, seed=20240809, diagnose=True,
              raise_exception=False, name=None, kwargs=None, params=False, reference=None, edges=None,
              surrogate=None):
    """Checks fn's derivatives at `inputs` with tapegrad's C++ checker and returns its Report.

    fn: a callable on torch tensors (a Function.apply, a module, a function, a lambda or functools.partial around
        one), whose derivatives come from torch (torch.autograd.grad, torch.autograd.forward_ad, double backward for
        order=2); or, when `vjp` is given, a callable on numpy arrays with its own rules: vjp(gout, *xs) → one array
        per input, jvp(tangents, *xs) → an array (absent: a "no JVP" note), hvp(gout, tangents, *xs) → one array
        per input (for order=2).
    inputs: a tuple of tensors or arrays (0-d stays 0-d); other values are passed as they are. Checked:
        inputs_to_check (indices) if given, else the tensors that require grad if any, else every floating-point
        input. An integer or bool input named in inputs_to_check is refused. numpy arrays and float64 CPU tensors
        are checked in float64; torch tensors in bfloat16, float16 or float32, or on a GPU, are checked at that
        precision and on that device (tapegrad/_precision.py): fn runs there, and its VJP is compared with a
        float64 reference on the same rounded inputs, against a bound on rounding that the check measures.
    reference: at a precision below float64, the callable whose float64 values and torch derivatives are the
        reference (the composite torch ops a fused kernel replaces); None: fn itself in float64, checked first
        against finite differences.
    kwargs: keyword arguments passed to fn on every call (not checked).
    params: fn a torch.nn.Module: check its parameters too, after the inputs, named by named_parameters().
    order: 1 checks the VJP, JVP, adjoint identity, accumulation and the backward at ȳ = 0; 2 the Hessian-vector
        product (double backward) against differences of the gradient, and its symmetry.
    eps, atol, rtol: the differences' step and the tolerance |a − n| ≤ atol + rtol·|n|, as torch names them.
    fast_mode: True: random projections (projections of them) for every input; False: full Jacobians; None: full
        where m·n ≤ 40000.
    names: the inputs' names in the report (default: the parameters' names, else x0, x1, ...).
    raise_exception: raise GradcheckError (with the report) on a failure instead of returning it.
    An op returning several tensors is checked output by output (rows "x→y0", ...) and for all outputs at once
    (rows "x→all": each VJP seeds every output with its own random ȳ).
    surrogate: a callable on fn's arguments whose derivative fn's backward declares it takes in place of its own
        forward's (a straight-through estimator: fn rounds, its backward passes ȳ through, the derivative of
        x ↦ x): fn's VJP is checked as the derivative of surrogate, by surrogate's finite differences (at a lower
        precision, surrogate in float64 is the reference unless reference= is given); first order only
        (tapegrad/_surrogate.py).
    edges: True: after the check, fn runs at inputs built to reach the edges of its domain (masked, constant, tied,
        zero, overflowing and tiny rows; a mask row that leaves a query no key) at the inputs' dtype and device:
        no NaN or ∞ where the reference is finite, x̄ exactly 0 at ȳ = 0, x̄ agreeing with the reference's; a row
        "edges" per input and a finding of kind `edge` (with a line that reproduces it) where one breaks
        (tapegrad/_edges.py). A dict {edge: "nan"} declares edges the op defines as undefined: not probed.
    """
    call = read_call(fn, inputs, order=order, names=names, inputs_to_check=inputs_to_check, params=params,
                     kwargs=kwargs, name=name, reference=reference, surrogate=surrogate, numpy_rules=vjp is not None,
                     keywords=dict(eps=eps, atol=atol, rtol=rtol, fast_mode=fast_mode, projections=projections,
                                   seed=seed, diagnose=diagnose))
    fn, inputs, slots, checked_names, arrays = call.fn, call.inputs, call.slots, call.names, call.arrays
    name, kwargs, options = call.name, call.kwargs, call.options
    if vjp is None and _torch_if_loaded() is not None and (reference is not None or call.elsewhere):
        report = _check_at_precision(call)
    elif vjp is not None:
        if reference is not None:
            raise ValueError("gradcheck: reference= goes with a torch op (numpy rules are checked in float64)")
        if kwargs:
            raise ValueError("gradcheck: kwargs= goes with a torch op; numpy rules take their inputs positionally")
        impl = NumpyOp(fn, inputs, slots, vjp, jvp, hvp)
        if fast_mode is not None and not fast_mode:
            require_full_jacobian_memory(impl, name, arrays)
        report = _tapegrad._check(impl, name, arrays, checked_names, call.order, options)
        _in_python_terms(report)
    else:
        if jvp is not None or hvp is not None:
            raise ValueError("gradcheck: jvp= and hvp= go with vjp= (numpy rules); a torch op brings its own")
        report = _check_torch(call)
    if vjp is None and call.order == 1 and not report.passed:
        from ._cut import LOSS_AXIS, factors_per_batch_length
        if any(LOSS_AXIS in d.message for d in report.diagnoses):  # a finding on a scalar loss's first rows
            factors_per_batch_length(report, call)  # a scale there read at the loss's whole batch
    if call.surrogate is not None:
        report._notes = [f"surrogate: {name}'s backward is checked as the derivative of {call.surrogate}, as it "
                         f"declares (not of its own forward)"] + getattr(report, "_notes", [])
    if edges is not None and edges is not False:
        from ._edges import probe_edges
        probe_edges(call, report, edges, numpy_rules=vjp is not None)
    if raise_exception and not report.passed:
        raise GradcheckError(report)
    return report


def _check_torch(call):
    """The checks of a torch op (one per output, and one of all outputs at once, where it has several), then the
    steps that name and complete what they found."""
    from ._torch_op import check_each_output
    report, impls, count, at_zero = check_each_output(call)
    after = _AfterTheCheck(call, report, impls, count, at_zero)
    for step in _AFTER_THE_CHECK:
        step(after)
    return after.report


@dataclass
class _AfterTheCheck:
    """What the steps after the C++ checker's run on a torch op read and amend: the call, its report, the TorchOp of
    each output (of all outputs at once last), how many outputs, the backward at ȳ = 0 (first order:
    TorchOp.zero_cotangent's result, run with the checks), and what the steadiness step found."""
    call: _Call
    report: object
    impls: list
    count: int
    at_zero: object
    rounding_note: str = None
    refused: bool = False

    @property
    def one_output_first_order(self):
        return self.call.order == 1 and self.count == 1


def _steadiness(after):
    """A failed check whose forward is not steady: refused, or made again at the step its rounding allows."""
    if not after.report.passed:
        # impls[-1]: the only output, or every output at once
        from ._rounds_inside import unless_unsteady
        after.report, after.rounding_note, after.refused = unless_unsteady(
            after.report, after.impls[-1], after.call, after.one_output_first_order)


def _terms_of_the_forward(after):
    """A failing VJP that no kind explains, named as one term of a Function's forward (tapegrad/_forward.py); a
    Function with several outputs is searched with them joined (_forward_record.one_output)."""
    if after.call.order == 1 and after.call.options.diagnose and not after.report.passed and not after.refused:
        _name_from_forward(after.report, after.call)


def _named_on_the_cut(after):
    """At size, the inputs random projections left unnamed, or the C++ checker's own cut did: checked in full on the
    op cut along y's axes with its fixed tensors too (tapegrad/_cut.py)."""
    if after.one_output_first_order and after.call.options.diagnose and not after.report.passed and not after.refused:
        from ._cut import AT_SIZE, ON_ITS_CUT, name_on_the_cut
        unexplained = [d for d in after.report.diagnoses if d.kind == "unexplained"]
        unnamed = {d.input for d in unexplained if d.message.startswith(AT_SIZE)}
        on_its_cut = {d.input for d in unexplained if ON_ITS_CUT in d.message} - unnamed
        if unnamed or on_its_cut:
            name_on_the_cut(after.report, after.call, gradcheck, unnamed, on_its_cut)


def _named_in_full(after):
    """At size, the inputs neither random projections nor a cut named, checked in full where that costs little
    (tapegrad/_cut.py, name_in_full)."""
    if after.one_output_first_order and after.call.options.diagnose and not after.report.passed and not after.refused:
        from ._cut import AT_SIZE, name_in_full
        unnamed = {d.input for d in after.report.diagnoses if d.kind == "unexplained" and d.message.startswith(AT_SIZE)}
        if unnamed and after.call.fast_mode is None:  # fast_mode=True: projections asked for, and kept
            name_in_full(after.report, after.call, gradcheck, unnamed)


def _zero_cotangent(after):
    """First order: the rows "zero ȳ" (the backward at ȳ = 0 runs and gives 0)."""
    if after.call.order == 1:
        _zero_cotangent_rows(after.report, after.at_zero, after.call.names)


def _saved_intermediates(after):
    """Second order, failed: the values a Function saved in forward that double backward holds constant."""
    fn = after.call.fn
    if after.call.order == 2 and not after.report.passed and _function_class(fn) is not None:
        _name_saved_intermediates(after.report, after.impls[0], _function_class(fn), after.call.arrays)


def _forward_mode(after):
    """First order: one line under the title where forward mode is not written (at order 2 the tangent comes from
    the backward: nothing is skipped)."""
    if after.call.order == 1:
        for impl in after.impls:
            if impl.no_forward_mode is not None:
                _forward_mode_note(after.report, impl, after.call.fn)
                break


def _rounding(after):
    """The note of a re-check at the step a forward's rounding allows."""
    if after.rounding_note is not None:
        after.report._notes = getattr(after.report, "_notes", []) + [after.rounding_note]


def _summed_down(after):
    """First order, fn a Function's bare apply: an input whose x̄, as the backward returns it, has another shape than
    the input's. Torch sums it down to the input's shape (or broadcasts it up) before anyone sees it, so the check
    passed on that sum; a claim of the same rule is refused for the shape. One line under the title says so."""
    call = after.call
    cls = call.function_class
    if call.order != 1 or after.count != 1 or cls is None or call.fn != getattr(cls, "apply", None):
        return
    import torch
    try:
        args = [a.detach().clone().requires_grad_() if k in call.slots else a for k, a in enumerate(call.inputs)]
        with torch.enable_grad():
            y = call.fn(*args, **(call.kwargs or {}))
            raw = y.grad_fn.apply(torch.ones_like(y))  # the backward's own outputs, before torch reshapes them
    except Exception:  # noqa: BLE001 - an op this cannot run again says nothing here
        return
    raw = raw if isinstance(raw, tuple) else (raw,)
    for k, name in zip(call.slots, call.names):
        r = raw[k] if k < len(raw) else None
        if isinstance(r, torch.Tensor) and tuple(r.shape) != tuple(args[k].shape):
            after.report._notes = getattr(after.report, "_notes", []) + [
                f"{name}: the backward returns x̄ of shape {tuple(r.shape)} for an input of shape "
                f"{tuple(args[k].shape)}; torch sums it down to that shape before the check sees it, so the check "
                f"is of that sum (written as a claim, the rule must sum over the axes {name} is broadcast along "
                f"itself)"]


def _python_terms(after):
    _in_python_terms(after.report)


# What a torch op's check does after the C++ checker's run, in order.
_AFTER_THE_CHECK = (_steadiness, _terms_of_the_forward, _named_on_the_cut, _named_in_full, _zero_cotangent,
                    _saved_intermediates, _forward_mode, _rounding, _summed_down, _python_terms)


def _check_at_precision(call):
    """fn checked at its inputs' precision and device (tapegrad/_precision.py), under the float64 check of fn on the
    same values (with call.keywords, gradcheck's keyword options) where no reference is given."""
    from ._precision import check_at_precision
    torch = _torch_if_loaded()
    fn, inputs, slots = call.fn, call.inputs, call.slots
    if call.order != 1:
        raise ValueError("gradcheck: order=2 runs in float64 (differences of a gradient at a low precision are "
                         "rounding): pass float64 CPU tensors")
    if not call.elsewhere:
        raise ValueError("gradcheck: reference= compares an op run below float64 or on a GPU with float64; the "
                         "checked inputs are float64 on the CPU: pass them at the precision the op runs in")
    device = next(inputs[i].device for i in slots)

    def float64_report(at=inputs, checked=None):
        """The float64 check of fn at the inputs `at` (the inputs as given, or the op's cut of them), of the checked
        inputs numbered in `checked` (positions in slots; every one where None)."""
        def moved(x):
            if isinstance(x, torch.Tensor) and x.is_floating_point():
                return x.detach().to(device="cpu", dtype=torch.float64).requires_grad_(x.requires_grad)
            return x.cpu() if isinstance(x, torch.Tensor) else x
        inputs64 = tuple(moved(x) for x in at)
        fn64 = fn if device.type == "cpu" else _on_device(fn, device)
        which = range(len(slots)) if checked is None else checked
        return gradcheck(fn64, inputs64, inputs_to_check=[slots[i] for i in which],
                         names=[call.names[i] for i in which], name=call.name, kwargs=call.kwargs, **call.keywords)
    return check_at_precision(call, float64_report)


def _on_device(fn, device):
    """fn on CPU float64 tensors: its tensor arguments moved to the device it runs on, its outputs back."""
    torch = _torch_if_loaded()

    def call(*args, **kwargs):
        y = fn(*[a.to(device) if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
        return tuple(t.cpu() for t in y) if isinstance(y, (tuple, list)) else y.cpu()
    call.__qualname__ = getattr(fn, "__qualname__", "fn")
    return call
