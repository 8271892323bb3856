"""An element-wise call's derivative written wrong, named from the forward.

For a call f applied element by element (sigmoid, tanh, exp, softplus: its Jacobian diagonal), the chain rule's term
through it is d = (what reaches f's output) ⊙ f′(u) ⊙ (u's derivative), and two slips keep the term's shape:

  a wrong derivative   f′ written as another simple function of f's value y: σ′ as σ (the (1 − σ) left out), tanh′
                       as 1 − tanh (the square left out), f′ left out (1). With V that function, x̄_user =
                       x̄_true − d + d ⊙ V/f′ (term_factor). Screened on the edge terms the forward's search
                       already has at the first ȳ (no forward is run for that; a fit found there is confirmed at
                       every ȳ, with the edge's cut forward), where f's output has the input's shape, so that V/f′
                       meets x̄ element by element (as the value factors of _forward._value_factor).
  the wrong point      f and what follows it evaluated at another value s of the forward (an input, an earlier
                       call's output) where its operand u belongs, u's own derivative kept: the forward run with u
                       read as s + (u − detach(u)). x̄_user equal to that run's VJP names the value the backward
                       reads (wrong_value: σ(x) for softplus(βx)'s σ(βx)).
"""

import numpy as np
import torch

from ._forward_record import _term, is_elementwise, lines
from ._forward_rewrite import operands_of, replace_operand

MAX_POINT_RUNS = 48  # forwards with an operand's value or a call's derivative replaced, at most, per fit

# f′ of the element-wise calls a report can write in words, as a function of the call's name.
_DERIVATIVE = {"sigmoid": "sigmoid·(1 − sigmoid)", "tanh": "1 − tanh²", "exp": "exp", "softplus": "sigmoid",
               "log": "1/u", "log1p": "1/(1 + u)", "sin": "cos", "cos": "−sin", "sqrt": "1/(2·sqrt)",
               "rsqrt": "−rsqrt³/2", "reciprocal": "−reciprocal²"}


def _short(call):
    return call.name.strip("_")


def _form_functions(call):
    """(how it is written, V) for the simple functions V of the call's value y (a tensor) a derivative may be written
    as, so that a run of the forward where y has other values can make them (_wrong_derivative_inside)."""
    f = _short(call)
    return [(f"`{f}`", lambda y: y), (f"`1 − {f}`", lambda y: 1 - y), (f"`1 − {f}²`", lambda y: 1 - y * y),
            (f"`{f}·(1 − {f})`", lambda y: y * (1 - y)), (f"`{f}²`", lambda y: y * y), (f"`1 + {f}`", lambda y: 1 + y),
            ("1 (left out)", torch.ones_like)]


def _forms(call):
    """_form_functions at the recorded call's value, as flat arrays."""
    y = call.out.detach()
    return [(written, form(y).numpy().ravel()) for written, form in _form_functions(call)]


def _wrong_derivative(search):
    found = {}
    for i in search.errors:
        x = search.xs[i]
        n = x.numel()
        for call, j, d in (search.terms or {}).get(i, []):
            if tuple(call.out.shape) != tuple(x.shape) or not is_elementwise(call):
                continue
            right, = torch.autograd.grad(call.out, call.operands[0], torch.ones_like(call.out), retain_graph=True)
            right = right.detach().numpy().ravel()
            if np.any(right == 0):
                continue
            for written, v in _forms(call):
                if np.allclose(v, right, rtol=1e-9, atol=0):
                    continue  # the derivative itself
                ratio = v / right
                with np.errstate(invalid="ignore"):  # 0·∞ where a term is infinite (a −∞ mask): NaN, no match
                    trial = search.true[i][:n] - d + d * ratio
                if not search.matches_first(i, trial):
                    continue
                try:
                    d_all = search.full_term(call, j, i)
                except Exception:
                    continue
                if not search.matches(i, search.true[i] - d_all + d_all * np.tile(ratio, len(d_all) // n)):
                    continue
                f = _short(call)
                own = _DERIVATIVE.get(f, f"{f}′")
                found[i] = ("term_factor", search.names[i], "vjp",
                            f"x̄ has the derivative of `{call.text}` at {call.where} written {written} where "
                            f"{f}′ = {own} belongs (to rounding): {_term(call, j, search.operand)} carries the factor "
                            f"{written.strip('`')} in place of {own}")
                break
            if i in found:
                break
    return found


def _wrong_point(search):
    found = {}
    runs = 0
    for call in search.calls:
        if len(found) == len(search.errors) or not is_elementwise(call):
            continue
        target = call.operands[0]
        sources = [(("input", q), x) for q, x in enumerate(search.xs)]
        sources += [(("call", c.index), c.out) for c in search.calls if c.index < call.index]
        for (kind, at), value in sources:
            if value is target or tuple(value.shape) != tuple(target.shape) or torch.equal(value, target):
                continue
            if runs >= MAX_POINT_RUNS:
                return found
            runs += 1

            def rewrite(func, args, kwargs, run, kind=kind, at=at):
                u = operands_of(args, kwargs)[0]
                s = run.inputs[at] if kind == "input" else run.outputs[at]
                return replace_operand(args, kwargs, u, s.detach() + (u - u.detach()))

            read = search.names[at] if kind == "input" else search.operand(value)[0]
            meant, _ = search.operand(target)
            said = (f"x̄ is the forward's rule with `{call.text}` at {call.where}, and what follows it, evaluated at "
                    f"`{read}` where `{meant}` belongs, the chain rule's factors of `{meant}` kept (to rounding): the "
                    f"backward reads `{read}` in place of `{meant}` where it differentiates that call")
            search.add_named(found, lambda i, said=said: ("wrong_value", search.names[i], "vjp", said),
                             {call.index: rewrite})
    return found


def _at_own_value(call):
    """f′ taken at the call's own value y where its operand u belongs (σ′(σ(u)) for σ′(u), 1 − tanh(h)² for 1 − h²),
    as a function of y, for a call of one tensor and nothing else that torch has as torch.<name>; else None."""
    f = getattr(torch, _short(call), None)
    if not callable(f) or len(call.tensors) != 1 or call.numbers:
        return None

    def form(y):
        with torch.enable_grad():
            t = y.detach().clone().requires_grad_()
            slope, = torch.autograd.grad(f(t), t, torch.ones_like(t))
        return slope
    try:
        form(call.out[:1])
    except Exception:  # not a function of its one tensor alone
        return None
    return form


def _wrong_derivative_inside(search):
    """The wrong derivative of an element-wise call whose output is no unnamed input's shape (inside a composite: σ
    of attention's scores, tanh of a hidden layer), where x̄ cannot be screened element by element: the forward run
    with the call's output y made y + (u − detach(u))·V(y), its value kept and its derivative V, for each form V of
    _forms (term_factor), and for f′ taken at y itself (wrong_value: the derivative at the call's output where its
    operand belongs); x̄_user equal to that run's VJP names the form. A line run in a loop is rewritten at every
    run."""
    found, runs = {}, 0
    for group in lines(search.calls):
        call = group[-1]
        if len(found) == len(search.errors) or not is_elementwise(call):
            continue
        if all(tuple(call.out.shape) == tuple(search.xs[i].shape) for i in search.errors):
            continue  # _wrong_derivative screens these
        right, = torch.autograd.grad(call.out, call.operands[0], torch.ones_like(call.out), retain_graph=True)
        f = _short(call)
        own = _DERIVATIVE.get(f, f + '′')
        where = f"`{call.text}` at {call.where}" + (f" (at every one of its {len(group)} runs)" if len(group) > 1
                                                    else "")
        forms = [(form, "term_factor", f"x̄ has the derivative of {where} written {written} where {f}′ = {own} "
                  f"belongs (to rounding): the backward multiplies by {written.strip('`')} where it differentiates "
                  f"that call") for written, form in _form_functions(call)]
        at_own = _at_own_value(call)
        if at_own is not None:
            forms.append((at_own, "wrong_value", f"x̄ has the derivative of {where} taken at the call's own value, "
                          f"{f}′({f}(u)) where {f}′(u) belongs (to rounding): the backward differentiates the call at "
                          f"its output where its operand belongs"))
        for form, kind, said in forms:
            with torch.no_grad():
                if torch.allclose(form(call.out), right, rtol=1e-9, atol=0):
                    continue  # the derivative itself
            if runs >= MAX_POINT_RUNS:
                return found
            runs += 1

            def derivative_written(out, func, args, kwargs, run, form=form):
                u = operands_of(args, kwargs)[0]
                return out.detach() + (u - u.detach()) * form(out.detach())

            search.add_named(found, lambda i, kind=kind, said=said: (kind, search.names[i], "vjp", said), {},
                             after={c.index: derivative_written for c in group})
    return found


# In the order tried: each maps the inputs it names to their finding.
DERIVATIVE_FITS = (_wrong_derivative, _wrong_derivative_inside, _wrong_point)
