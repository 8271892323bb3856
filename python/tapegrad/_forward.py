"""A slip in a torch.autograd.Function's backward named in the terms of its forward.

The right VJP is known without the user's backward: the Function's `forward` run as plain torch code (a stand-in
ctx, float64 inputs that require grad, grad enabled) is differentiated by torch's autograd, x̄_true = grad(y, x, ȳ).
The forward's terms are the edges of its graph: each torch call k and each of its tensor operands j that depends on
the inputs, recorded under a TorchFunctionMode with the user's source line and the exact sub-expression that made
the call (Python's column positions). Running the forward again with operand j of call k detached gives x̄ without
that edge's term, so d_kj = x̄_true − x̄_cut is the term itself; for a call with one such operand of the output's
shape (softmax, exp, a norm's division), running it "straight through" (the value kept, the call's derivative the
identity) gives x̄ with that call's own derivative left out.

The user's error e = x̄_user − x̄_true, at a few random ȳ stacked, is fitted as α·d for one candidate at a time. A fit
whose residual is rounding (≤ 1e-6 of ‖e‖) names the slip: α = −1 a dropped term, α = +1 a term counted twice, α = −2 a
term of the wrong sign, any other α a term with the factor 1 + α (read as a number, a power rule's exponent, or a value
of the forward such as β or √d), and a straight-through fit with α = −1 a gradient built from the wrong value (dP where
dS belongs). Where several edges fit (along a chain every edge carries the same term), the one at the call that joins
two terms (a product, a sum) names it best, and among those the latest. Where no term fits, a term built from the wrong
value is tried: the forward run with one operand of one call replaced by another value it has at that point, of the same
shape (an input, an earlier call's output); x̄_user equal to that run's x̄ says which value the backward reads. Before
that, a term whose factor is a value of the forward element by element (x̄_user = x̄_true − d + d·v or − d + d/v). Last,
where the forward calls one of _PARTS (silu, softmax, …), all of it runs again with those calls written out in their
parts, each part an edge of its own. What still fits nothing goes to the fits of _forward_fits.py: an element-wise
call's derivative written wrong or taken at the wrong value (at most 48 rewritten forwards), a call's or a broadcast's
axis (at most 32), and a loop's step.

It runs only on a failed VJP that no structural kind of the Jacobian explains (gradcheck's caller decides; a per-row
term, which gives the error's shape in each row and not its term, is not one), and costs one forward and backward
per candidate, at most 64 edges: VJPs only, so at any size. Its runs of the forward after the first make at most
SEARCH_CALLS torch calls in all (_forward_record.py): a long forward, a scan written as a Python loop, is searched
as far as that allows, and the report says where the search stopped. Past ON_A_CUT elements it runs on the op cut to
its first two rows along y's axes first (each run then costs those rows), and at the whole size only where the error
does not show there; what it finds on the cut says where.
"""

from dataclasses import replace

import numpy as np
import torch

from ._forward_fits import named_otherwise
from ._forward_rewrite import Search
from ._forward_record import (FIT, Inlined, _Forward, _run_forward, _term, _vjps, best_finding, record, search_budget,
                              spent_into)


def name_from_forward(checked, failing, notes=None):
    """[(kind, input, check, message)] for the inputs in `failing` (names) whose VJP error is one term of the
    forward of the Function checked.fn is the `apply` of; [] where it is no Function or nothing fits. checked:
    gradcheck's call (fn, the Function behind it, inputs, slots, names, arrays, options.seed). A search that spends
    its budget (SEARCH_CALLS) says so in notes."""
    from ._callables import _parameter_names
    function_class = checked.function_class
    if function_class is None or not failing:
        return []
    bare = getattr(checked.fn, "__self__", None) is function_class and not checked.kwargs
    forward = function_class if bare else Inlined(checked.fn, function_class, checked.kwargs)
    with spent_into(notes):
        try:
            parameters = _parameter_names(checked.fn, len(checked.inputs))
            cut = _cut(checked)
            if cut is not None:  # at size, the op cut to its first rows first: each run below costs their size
                found, shown = _name_all(function_class, forward, cut[0], failing, parameters)
                if shown:
                    return [(kind, name, check, cut[1] + message) for kind, name, check, message in found]
            return _name_all(function_class, forward, checked, failing, parameters)[0]
        except Exception:  # a forward that cannot run as plain torch code: the report stands as it is
            return []


def _name_all(function_class, forward, checked, failing, parameters):
    """(the findings of the search over the forward's terms, its parts written out too where it calls one of _PARTS;
    whether the error shows at these inputs)."""
    found, has_parts, shown = _name(function_class, forward, checked, failing, parameters)
    rest = [n for n in failing if n not in {f[1] for f in found}]
    if rest and has_parts:
        found += _name(function_class, forward, checked, rest, parameters, parts=True)[0]
    return found, shown


SHOWS = 1e-9  # an error past this part of x̄ is the rule's: float64 rounding leaves about 1e-16
CUT_ENTRIES = 1 << 24  # a bound on the cut's (outputs × an input's elements): its first two rows, where they fit


def _cut(checked):
    """(checked with the op cut to its first rows along y's axes, the report's words for where) at size, or None.
    A slip of a rule is in every row's formula, and each run of the search costs the size it runs at; where the slip
    does not show on the cut (its error there is rounding's), the search runs at the whole size."""
    from ._cut import ON_A_CUT, first_rows
    cut = first_rows(checked, CUT_ENTRIES) if sum(a.size for a in checked.arrays) > ON_A_CUT else None
    if cut is None:
        return None
    args, where = cut
    arrays = [args[s].detach().to(device="cpu", dtype=torch.float64).numpy() for s in checked.slots]
    return replace(checked, inputs=tuple(args), arrays=arrays), where + ": "


def _fixed(inputs):
    return [x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            for x in inputs]


def _name(function_class, forward, checked, failing, parameters, parts=False):
    """(the findings; whether the forward makes a call of _PARTS: then a second search, over the parts written out,
    may name what the calls as written do not; whether the error shows: past SHOWS of x̄ for some failing input).
    forward: what _run_forward runs, function_class itself where the check was given its bare apply, else the
    wrapper with the apply inlined. Its runs of the forward after the first are held to SEARCH_CALLS torch calls in
    all (a run past them raises SearchSpent)."""
    fixed = _fixed(checked.inputs)
    run = record(checked, function_class, forward, fixed, parts)
    if run.true is None:
        return [], run.recorder.has_parts, False
    with search_budget(len(run.recorder.calls)):
        return _search(forward, checked, failing, parameters, parts, fixed, run)


def _search(forward, checked, failing, parameters, parts, fixed, run):
    """_name's search once the forward is recorded (run: record's)."""
    slots, names, arrays = checked.slots, checked.names, checked.arrays
    recorder, xs, cotangents, true, user = run.recorder, run.xs, run.cotangents, run.true, run.user
    operand, (candidates, tried, total, capped) = run.operand, run.candidates
    values = _named_values(recorder.calls, fixed, parameters, xs, names)

    errors = {i: user[i] - true[i] for i, n in enumerate(names) if n in failing}
    errors = {i: e for i, e in errors.items() if np.linalg.norm(e) > 0}
    shown = any(np.linalg.norm(e) > SHOWS * np.linalg.norm(true[i]) for i, e in errors.items())
    fits = {i: [] for i in errors}
    terms = {i: [] for i in errors}  # (call, j, d at the first ȳ) of every edge, for factors that are values

    full = {}  # (call, operand, how) → the edge's term for every input at all the cotangents

    def full_terms(call, j, how, run=None):
        """The edge's term d = x̄_true − x̄_cut for every input, at all the cotangents; `run`, the cut forward's
        (xs, y) where the screening made it already (its graph is kept), else the cut forward is run here."""
        key = (call.index, j, how)
        if key not in full:
            cut_xs, cut_y = run or _run_forward(forward, fixed, slots, arrays,
                                                _Forward(cut=(call.index, j, how), parts=parts))
            cut = _vjps(cut_xs, cut_y, cotangents)
            full[key] = {i: true[i] - cut[i] for i in errors}
        return full[key]

    def fit(e, d, t):
        """α and the residual of e ≈ α·d, or None where d is nothing next to t (x̄_true)."""
        dd = float(d @ d)
        if dd <= (1e-12 * np.linalg.norm(t)) ** 2 or dd == 0:
            return None
        alpha = float(e @ d) / dd
        return alpha, float(np.linalg.norm(e - alpha * d) / np.linalg.norm(e))

    # Each edge screened at the first ȳ (one backward), the few that fit there compared at all of them.
    for call, j, how in candidates:
        try:
            cut_xs, cut_y = _run_forward(forward, fixed, slots, arrays,
                                         _Forward(cut=(call.index, j, how), parts=parts))
            cut = _vjps(cut_xs, cut_y, cotangents[:1])
        except Exception:
            continue
        screened = False
        for i, e in errors.items():
            n = len(cut[i])
            d = true[i][:n] - cut[i]
            alpha_residual = fit(e[:n], d, true[i][:n])
            if alpha_residual is None:
                continue
            if how == "detach":
                terms[i].append((call, j, d))
            screened = screened or (alpha_residual[1] <= FIT and alpha_residual[0] != 0)
        if not screened:
            continue
        try:
            d_all = full_terms(call, j, how, (cut_xs, cut_y))
        except Exception:
            continue
        for i, e in errors.items():
            alpha_residual = fit(e, d_all[i], true[i])
            if alpha_residual is None:
                continue
            alpha, residual = alpha_residual
            if residual <= FIT and alpha != 0:
                if how == "straight" and abs(alpha + 1) > 1e-6:
                    continue
                fits[i].append((call, j, how, alpha, residual))

    found = []
    note = f" ({tried} of the forward's {total} edges were tried)" if capped else ""
    # the searches past the edges' own terms: over the inputs still unnamed (search.errors)
    search = Search(forward, fixed, slots, arrays, recorder.calls, xs, names, cotangents, true, user,
                    dict(errors), operand, terms, lambda call, j, i: full_terms(call, j, "detach")[i])
    for i in [i for i in errors if not fits[i]]:
        factor = _value_factor(search, i)
        if factor is not None:
            found.append(factor)
            fits[i] = None  # named
    unfitted = {i: e for i, e in errors.items() if fits[i] is not None and not fits[i]}
    if unfitted:
        search.errors = dict(unfitted)
        found += _substitutions(search, parts)
        rest = {i: e for i, e in unfitted.items() if names[i] not in {f[1] for f in found}}
        if rest and not parts:  # a derivative, an axis, a loop's step (_forward_fits.py)
            search.errors = rest
            found += named_otherwise(search)
    for i, candidates_of_i in fits.items():
        if not candidates_of_i:  # None: named by a value's factor; []: nothing fits
            continue
        found.append(best_finding(candidates_of_i, names[i], operand, values, note))
    return found, recorder.has_parts, shown


def _value_factor(search, i):
    """A term with a factor that is a value of the forward, element by element: x̄_user = x̄_true − d + d·v (a factor
    v too many: a power rule's exponent not lowered, x·x² for x²) or − d + d/v (the factor v missing: the other
    factor of a product, a chain rule's inner β of shape (C,)), for one edge's term d and one value v of the forward
    (an input or a call's output) broadcast to the input's shape. No forward is run: the terms are those the edges
    gave at the first ȳ, and a fit there is confirmed at every ȳ (search.full_term: the edge's term at all)."""
    terms, user, true, e = search.terms[i], search.user[i], search.true[i], search.errors[i]
    xs, names, operand = search.xs, search.names, search.operand
    calls = search.calls
    shape = tuple(xs[i].shape)
    values = []  # (name or None, the tensor, its values broadcast to x̄'s shape and stacked as x̄ is)
    for name, value in [(names[q], x) for q, x in enumerate(xs)] + [(None, c.out) for c in calls]:
        try:
            v = np.broadcast_to(value.detach().numpy(), shape).ravel()  # as the terms: at the first ȳ
        except ValueError:
            continue
        if np.all(np.isfinite(v)) and np.abs(v - 1).max() > 1e-12:
            values.append((name, value, v))
    n = xs[i].numel()
    tolerance = FIT * np.linalg.norm(e[:n])
    for call, j, d in terms:
        for name, value, v in values:
            for missing in (False, True):
                if missing and np.any(v == 0):
                    continue
                changed = true[:n] - d + (d / v if missing else d * v)
                if np.linalg.norm(user[:n] - changed) > tolerance:
                    continue
                try:  # at every ȳ
                    d_all = search.full_term(call, j, i)
                except Exception:
                    continue
                v_all = np.tile(v, len(e) // n)
                changed = true - d_all + (d_all / v_all if missing else d_all * v_all)
                if np.linalg.norm(user - changed) > FIT * np.linalg.norm(e):
                    continue
                read = name or operand(value)[0]
                how = (f"the factor `{read}` missing from it (or a division by `{read}` too many)" if missing
                       else f"a factor `{read}` too many (or a division by `{read}` missing)")
                return ("term_factor", names[i], "vjp",
                        f"x̄ has one term of the forward's rule with {how}, element by element (to rounding): "
                        f"{_term(call, j, operand)}")
    return None


MAX_SUBSTITUTIONS = 160  # (edge, value) pairs tried for a term built from the wrong value


def _substitutions(search, parts):
    """A term built from the wrong value: x̄_user is the VJP of the forward with one operand of one call replaced by
    another value the forward has at that point, of the same shape (an input, or an earlier call's output): the
    backward reads that value where the operand belongs (x for x̂, a for silu(a)). Tried for the inputs whose error
    no edge's term fits (search.errors); at most MAX_SUBSTITUTIONS forwards."""
    calls, xs, names, cotangents, user = search.calls, search.xs, search.names, search.cotangents, search.user
    errors, operand = search.errors, search.operand
    tried = 0
    found = {}
    for call in calls:
        if call.name.endswith("_") and not call.name.endswith("__"):
            continue
        for j, target in enumerate(call.operands):
            sources = [(("input", q), x) for q, x in enumerate(xs)]
            sources += [(("call", c.index), c.out) for c in calls if c.index < call.index]
            for source, value in sources:
                if value is target or tuple(value.shape) != tuple(target.shape) or torch.equal(value, target):
                    continue
                if tried >= MAX_SUBSTITUTIONS or len(found) == len(errors):
                    break
                tried += 1
                cut = _Forward(cut=(call.index, j, "substitute", source), parts=parts)
                try:  # screened at the first ȳ, then compared at all of them
                    sub_xs, sub_y = _run_forward(search.function_class, search.fixed, search.slots, search.arrays, cut)
                    first = _vjps(sub_xs, sub_y, cotangents[:1])
                    close = [i for i, e in errors.items() if i not in found and
                             np.linalg.norm(user[i][:len(first[i])] - first[i]) <= FIT * np.linalg.norm(e)]
                    if not close:
                        continue
                    sub = _vjps(sub_xs, sub_y, cotangents)
                except Exception:
                    continue
                for i, e in errors.items():
                    if i not in close:
                        continue
                    if np.linalg.norm(user[i] - sub[i]) <= FIT * np.linalg.norm(e):
                        read = names[source[1]] if source[0] == "input" else operand(value)[0]
                        meant, _ = operand(target)
                        found[i] = ("wrong_value", names[i], "vjp",
                                    f"x̄ is the forward's rule with `{read}` read in place of `{meant}` in "
                                    f"`{call.text}` at {call.where} (to rounding): the backward uses `{read}` where "
                                    f"`{meant}` belongs")
    return list(found.values())


def _named_values(calls, fixed, parameters, xs, names):
    """(name, value) of the forward's scalars a factor may be made of: scalar inputs and numbers passed to it, the
    scalars its calls compute, the numbers its calls take, and the sizes of its inputs' last axes (for √d)."""
    values = []
    for slot, v in enumerate(fixed):
        name = parameters[slot] if parameters and slot < len(parameters) else f"x{slot}"
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            values.append((name, float(v)))
        elif isinstance(v, torch.Tensor) and v.numel() == 1 and v.is_floating_point():
            values.append((name, float(v)))
    for x, name in zip(xs, names):
        if x.numel() == 1:
            values.append((name, float(x)))
    for call in calls:  # a scalar the forward computes: a norm, a sum (‖w‖ for a term divided by it once too often)
        if call.out.numel() == 1 and call.out.is_floating_point() and call.inside is None:
            values.append((call.assigned or call.text, float(call.out)))
    for call in calls:
        for n in call.numbers:
            values.append((f"{n:g}", float(n)))  # shown as the number itself
    for x, name in zip(xs, names):
        if x.dim() >= 1 and x.shape[-1] > 1:
            values.append(("d", float(x.shape[-1])))
    seen, unique = set(), []
    for name, v in values:
        if (name, v) not in seen:
            seen.add((name, v))
            unique.append((name, v))
    return unique
