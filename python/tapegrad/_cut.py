"""Cutting an op to a size whose Jacobians can be checked in full: its inputs narrowed to their first rows along y's
axes, every tensor argument that has the axis (a fixed mask, target or bias too, which the op would refuse uncut), so
that a slip found by random projections at size, where they show only a scale or a sign, can be named there. A scalar
loss is cut along its inputs' batch of terms instead: its full Jacobian costs a run of the whole op per element.

Used by the low-precision check's naming (tapegrad/_precision_names.py) and by the float64 check of a torch op, after
the C++ checker's own cut (checker/diagnose_narrowed.cpp), which cuts only the checked inputs along y's leading axis.
"""

import re
from dataclasses import dataclass

import numpy as np
import torch

from . import _tapegrad
from ._rounding import _cast
from ._torch_op import float_outputs

CUT_LIMIT = 1 << 17  # Jacobian entries (outputs × one input's elements) a cut's full Jacobian may have
ON_A_CUT = 1 << 16  # checked elements past which a slip is named on the op's first rows first (_forward.py, and the
#                     float64 check in the low-precision naming, _precision_names.py), at the whole size only where
#                     it does not show there


WHOLE_LOSS = 40000  # checked elements of a scalar loss up to which its full Jacobian is taken whole: each element is a
#                    run of the whole op (the C++ checker's own full-Jacobian limit for one output)
LOSS_CUT = 1 << 11  # checked elements a scalar loss is cut to (its terms' first rows), past WHOLE_LOSS
LOSS_AXIS = "the loss's inputs' axis"  # how a place on a scalar loss's cut names the axis it is cut along
LOSS_ROWS = (8, 4, 2)  # the rows a scalar loss's cut keeps, the most that fit: its rows may interact (a contrastive
#                       loss's softmax over the batch), and two rows of such a loss are a degenerate case of it


def _batch_of_terms(ys, inputs, slots):
    """The shape a scalar loss is cut along (its largest checked input's: a batch of terms, each row's loss added to
    the others'), where y is one 0-d value and the checked inputs hold more than WHOLE_LOSS elements in rows (two
    axes or more); else None."""
    if len(ys) != 1 or ys[0].dim() != 0:
        return None
    checked = [inputs[i] for i in slots if isinstance(inputs[i], torch.Tensor) and inputs[i].dim() > 0]
    if not checked or max(x.numel() for x in checked) <= WHOLE_LOSS:
        return None
    shape = tuple(max(checked, key=lambda x: x.numel()).shape)
    return shape if len(shape) >= 2 else None  # one vector is no batch of rows: the loss may be of all of it


def cut_along_y(c, limit, leading_first=False, from_end=False, one_axis=False, rows=None, loss_batch=True,
                judged=None):
    """(the inputs cut to their first rows along y's leading axes, where: "on the first 2 of 8 along y's axis 0") so
    that every checked input's full
    Jacobian has at most limit entries (the inputs as they are and "" where they fit), or None where no cut fits or the
    op refuses one. An input is cut along y's axis a where it has that axis: the same axis of the same length, its
    shape aligned with y's on the left where its rank is y's or more (the same layout, or an input the op reduces
    over trailing axes), else on the right (a broadcast operand, a per-head bias) or, where the right has no such
    axis and does not give that axis of the input to another of y's of its length, on the left (a (B, T) mask of a
    (B, T, D) op; not a (D,) weight of a (D, D) op). Leading axes are cut first; the first keeps two rows where
    that fits, so that a slip that reads one batch element only still shows. leading_first: the first axis to one
    row before any other is cut (a scan along the second axis, whose slip may not show on one of its steps). rows:
    how many rows the first axis keeps (2, or a scalar loss's LOSS_ROWS, the most that fit); given for a scalar loss,
    exactly those rows, whatever their size (for a measurement that runs the loss, not its Jacobian).
    from_end: the last rows, not the first. one_axis: an op whose y has one axis is cut along it too (the float64
    check's naming; at a low precision the rounding of two rows reads as a structure and is not cut). A scalar loss
    past WHOLE_LOSS elements has no axis of y: it is cut as if y had its largest checked input's shape (the batch of
    its terms: the loss of some rows is a loss the op computes), to at most LOSS_CUT elements, and y stays 0-d;
    loss_batch=False leaves it as y has no axis. judged: the checked inputs whose full Jacobians must fit (all of
    them where not given); the cut is made along every tensor argument with the axis all the same."""
    fn, ref_fn, inputs, slots, kwargs = c.fn, c.ref_fn, c.inputs, c.slots, c.kwargs
    judged = slots if judged is None else judged
    with torch.no_grad():
        ys = float_outputs(fn(*inputs, **kwargs))
    loss = _batch_of_terms(ys, inputs, slots) if loss_batch else None
    if loss is not None:  # a scalar loss past WHOLE_LOSS: cut along its terms' axes, the largest input's, instead
        shape, along = loss, LOSS_AXIS
        limit = min(limit, LOSS_CUT) if rows is None else rows * int(np.prod(shape[1:]))  # rows given: those rows
    elif len(ys) != 1 or ys[0].dim() < (1 if one_axis else 2):  # no axis to cut: the inputs as they are, where they fit
        outputs = sum(y.numel() for y in ys)
        return (list(inputs), "") if max(outputs * inputs[i].numel() for i in judged) <= limit else None
    else:
        shape, along = tuple(ys[0].shape), "y's axis"

    def entries(args, y_numel):
        return max((1 if loss else y_numel) * args[i].numel() for i in judged)

    def cut(args, a, s, length):
        out = list(args)
        for q, x in enumerate(args):
            if not (isinstance(x, torch.Tensor) and x.dim() > 0):
                continue
            offset = len(shape) - x.dim()
            aligned = [a] if offset <= 0 else [a - offset]
            if 0 < offset and a < x.dim() and x.shape[a] != now[a + offset]:
                aligned.append(a)  # on the left only where the right does not give x's axis a to y's of its length
            axis = next((k for k in aligned if 0 <= k < x.dim() and x.shape[k] == length), None)
            if axis is not None:
                start = length - s if from_end else 0
                out[q] = x.detach().narrow(axis, start, s).clone().requires_grad_(x.requires_grad)
        return out

    def accepted(args, new_shape):
        try:
            with torch.no_grad():
                got = float_outputs(fn(*args, **kwargs))
                ref = float_outputs(ref_fn(*_cast(args, torch.float64, c.device), **kwargs))
        except Exception:  # the op refuses the cut: a fixed input of another length, a shape it requires
            return False
        expected = () if loss else new_shape
        return len(got) == 1 and tuple(got[0].shape) == expected and tuple(ref[0].shape) == expected

    args, now, said = list(inputs), list(shape), {}

    def fits():
        return entries(args, int(np.prod(now))) <= limit

    # the first axis to its rows, the others to one, in turn; then the first to one where that did not fit
    inner = [(a, 1) for a in range(1, len(shape) - 1)]
    first = [(0, r) for r in ((rows,) if rows is not None else LOSS_ROWS if loss else (2,))]
    for a, s in first + ([(0, 1)] + inner if leading_first else inner + [(0, 1)]):
        if fits():
            break
        if s >= now[a]:
            continue
        trial = cut(args, a, s, now[a])
        trial_shape = tuple(now[:a] + [s] + now[a + 1:])
        if accepted(trial, trial_shape):
            args, now = trial, list(trial_shape)
            said[a] = f"the {'last' if from_end else 'first'} {s} of {shape[a]} along {along} {a}"
    if not fits():
        return None
    return args, f"on {', '.join(said[a] for a in sorted(said))}" if said else ""


# how a factor c of a scalar loss's VJP can depend on n, the rows of its batch a cut keeps: (f(n), what c = a·f(n)
# means at the whole batch, where a is the part of c that does not depend on n)
_PER_LENGTH = {
    "n": (lambda n: n, "grows as n, the batch's length", "the 1/n of a mean over the batch is left out, or n is "
          "multiplied in"),
    "1/n": (lambda n: 1.0 / n, "falls as 1/n", "a mean's 1/n is applied twice, or a sum's gradient is divided by n"),
    "n/(n − 1)": (lambda n: n / (n - 1), "is n/(n − 1)", "divided by n − 1 where a mean over the batch divides by n"),
    "(n − 1)/n": (lambda n: (n - 1) / n, "is (n − 1)/n", "divided by n where n − 1 belongs"),
}
_PER_LENGTH_FIT = 0.05  # a law of n fits where it predicts c at the second length to within this part of c


def factors_per_batch_length(report, call):
    """A scale found on a scalar loss cut along its batch (cut_along_y: "on the first 2 of 512 along the loss's inputs'
    axis 0"): c measured again with twice the rows; where it changes as a law of the batch's length n does (n, 1/n,
    n/(n − 1), (n − 1)/n), the finding says so and gives c at the whole batch (a missing mean's 1/n reads as c = 2 on
    two rows). A c that does not change is left as it is."""
    place = re.compile(rf"on the first (\d+) of (\d+) along {LOSS_AXIS} 0")
    for d in list(report.diagnoses):
        found = place.search(d.message)
        if d.kind != "scale" or found is None or d.input not in call.names:
            continue
        rows, length = int(found.group(1)), int(found.group(2))
        more = min(length, 2 * rows)
        slot = call.slots[call.names.index(d.input)]
        try:
            c = [_scale_on_rows(call, slot, n) for n in (rows, more)]
        except Exception:  # the op refuses the second cut, or it does not fit: the finding stands
            continue
        if None in c or more == rows:
            continue
        law = _law_of_length(c, rows, more)
        if law is None:
            continue
        f, how, meaning = _PER_LENGTH[law]
        a = c[0] / f(rows)
        a = 1.0 if abs(a - 1.0) <= _PER_LENGTH_FIT else float(f"{a:.3g}")  # past 3 digits: the cut's rounding
        _tapegrad._reword(report, d.message,
                          f"{d.message}; on {more} rows c = {c[1]:.6g}: c {how}, so at all {length} rows c = "
                          f"{_tapegrad._describe_factor(a * f(length))}: {meaning}")


def _law_of_length(c, rows, more):
    """The law of n (a key of _PER_LENGTH) that c at rows and at more rows follows, where one does and a constant
    does not; else None."""
    if abs(c[1] - c[0]) <= _PER_LENGTH_FIT * abs(c[1]):
        return None
    fits = []
    for law, (f, *_) in _PER_LENGTH.items():
        try:
            at_rows, at_more = f(rows), f(more)
        except ZeroDivisionError:  # n − 1 at one row
            continue
        if at_rows == 0:
            continue
        misfit = abs(c[0] / at_rows * at_more - c[1]) / abs(c[1])
        if misfit <= _PER_LENGTH_FIT:
            fits.append((misfit, law))
    return min(fits)[1] if fits else None


def _scale_on_rows(call, slot, rows):
    """c where fn's VJP (ȳ = 1) is c × the reference's derivative, on the scalar loss cut to its first `rows` rows:
    x̄ against a central difference of the reference in float64 along x̄ itself; None where the cut is not made."""
    c = own_reference(call)
    if call.reference is not None:
        c.ref_fn = call.reference
    cut = cut_along_y(c, LOSS_CUT, rows=rows)
    if cut is None or f"first {rows} of" not in cut[1]:
        return None
    args = list(cut[0])
    x = args[slot].detach().requires_grad_(True)
    args[slot] = x
    (g,) = torch.autograd.grad(float_outputs(call.fn(*args, **c.kwargs))[0], x)
    g = g.detach().to(torch.float64)
    size = float(torch.linalg.vector_norm(g))
    if size == 0.0:
        return None
    args64 = _cast(args, torch.float64, c.device)
    x64, step = args64[slot].detach(), 1e-5 * max(1.0, float(args64[slot].detach().abs().max()))
    values = []
    for sign in (1.0, -1.0):
        args64[slot] = x64 + sign * step * g / size
        with torch.no_grad():
            values.append(float(float_outputs(c.ref_fn(*args64, **c.kwargs))[0]))
    numeric = (values[0] - values[1]) / (2 * step)
    return size / numeric if numeric != 0.0 else None


def full_jacobian_there(place):
    """The words a finding on a cut begins with: "on the first 2 of 8 along y's axis 0 (a full Jacobian there): "."""
    return f"{place} (a full Jacobian there): " if place else ""


AT_SIZE = "random projections ("  # how the C++ checker's line for an input it could not name at size begins
ON_ITS_CUT = "(a full Jacobian there): none of the known kinds"  # its line for one its own cut did not name
# what does not replace that line: no name, or a finding of the point rather than of the rule (a few elements at a
# kink of another cut, a tolerance)
NOT_A_NAME = {"unexplained", "kink", "tolerance"}


def name_on_the_cut(report, call, gradcheck, unnamed, on_its_cut):
    """The float64 report's inputs that random projections left unnamed (unnamed), or the C++ checker's own cut (the
    checked inputs' first rows) did (on_its_cut: the module's cut traces the backward there too, so a slip of its
    formulas, a softmax along the wrong axis, may be named; only a name replaces that line), checked again in full
    (by gradcheck, the module's own) on the op cut along y's axes with its fixed tensors (cut_along_y): the cut's
    findings of those inputs replace their line, each saying where it was found. Nothing changes where no cut fits,
    the op refuses every cut, or the cut passes."""
    unnamed = unnamed | on_its_cut
    c = own_reference(call)
    slots, names = _unnamed_only(call, unnamed)

    def check_on(cut):
        """The check on the cut, or None where the op's forward or backward raises there (a backward written for
        the whole shape, which a cut it was never run at breaks, is no finding: the report stands)."""
        try:
            return gradcheck(call.fn, cut[0], inputs_to_check=slots, names=names, name=call.name,
                             kwargs=call.kwargs, **{**call.keywords, "fast_mode": False})
        except Exception:
            return None

    tried = []
    for leading_first in (False, True):  # inner axes cut first, then the leading one first where the slip hid
        cut = cut_along_y(c, CUT_LIMIT, leading_first, one_axis=True)
        if cut is None or not cut[1] or cut[1] in tried:  # no cut fits, nothing was cut, or this cut was tried
            continue
        tried.append(cut[1])
        again = check_on(cut)
        if again is None or again.passed:
            continue
        found = [(d.kind, d.input, d.check, full_jacobian_there(cut[1]) + d.message, d.factor) for d in again.diagnoses
                 if d.input in unnamed and d.check and not (d.input in on_its_cut and d.kind in NOT_A_NAME)]
        if any(kind == "scale" for kind, *_ in found) and " 1 of " in cut[1]:
            # one row along an axis, where a factor of each row (a count, a norm) reads as one scale: the same
            # check on the last rows says whether the factor is the same there
            other = cut_along_y(c, CUT_LIMIT, leading_first, from_end=True, one_axis=True)
            at_last = check_on(other) if other is not None else None
            if at_last is not None:
                found = _factors_per_row(found, cut[1], other[1], at_last)
        for finding in found:
            _tapegrad._add_diagnosis(report, *finding)
        return


CHEAP_ENTRIES = 1 << 20  # Jacobian entries, all checked inputs together, a full check takes to name a slip (8 MB)
CHEAP_ELEMENTS = 1 << 13  # checked elements it may difference (two forwards each)
CHEAP_CALLS = 1 << 19  # torch calls its forwards may make in all (a scan written as a loop makes thousands a run)


class _Calls(torch.overrides.TorchFunctionMode):
    """Counts the torch calls a run makes."""
    count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


def name_in_full(report, call, gradcheck, unnamed):
    """The inputs random projections left unnamed (unnamed: the report's lines of them begin with AT_SIZE) where the
    cuts named nothing either (a scalar loss, an op whose inputs share no axis with y, a cut its forward refuses),
    checked again with full Jacobians where those cost little: at most CHEAP_ENTRIES entries and CHEAP_ELEMENTS checked
    elements in all (the projections' limit, 40000 entries, passed a few times: 64 outputs of a 1024-element input),
    and CHEAP_CALLS torch calls in the forwards that differencing makes (counted, not timed, so that a report does not
    depend on the machine). Its findings of those inputs replace their lines, each saying so. Nothing changes where
    the full check costs more, raises, or passes."""
    calls = _Calls()
    try:
        with torch.no_grad(), calls:
            ys = float_outputs(call.fn(*call.inputs, **(call.kwargs or {})))
    except Exception:
        return
    outputs = sum(int(y.numel()) for y in ys)
    elements = sum(int(np.asarray(a).size) for a in call.arrays)
    if elements > CHEAP_ELEMENTS or outputs * elements > CHEAP_ENTRIES or 2 * elements * calls.count > CHEAP_CALLS:
        return
    slots, names = _unnamed_only(call, unnamed)
    try:
        again = gradcheck(call.fn, call.inputs, inputs_to_check=slots, names=names, name=call.name,
                          kwargs=call.kwargs, **{**call.keywords, "fast_mode": False})
    except Exception:
        return
    if again.passed:
        return
    said = f"in full ({outputs * elements} Jacobian entries, taken to name the slip): "
    for d in again.diagnoses:  # "no known kind" too: the full Jacobian's says where the error lies, and asks nothing
        if d.input in unnamed and d.check and d.kind not in NOT_A_NAME - {"unexplained"}:
            _tapegrad._add_diagnosis(report, d.kind, d.input, d.check, said + d.message, d.factor)


def _unnamed_only(call, unnamed):
    """The checked slots and names of the inputs in unnamed: a check in full differences only those (two runs of the
    op per element; an input the projections named, or found right, is not read again), each input's full Jacobian
    judged on its own as before."""
    kept = [(s, n) for s, n in zip(call.slots, call.names) if n in unnamed]
    return [s for s, _ in kept], [n for _, n in kept]


def _factors_per_row(found, first, last, at_last):
    """found's scale of an input (found on the rows first says), where the check on the last rows (at_last: its
    report, last: where it says) finds another factor or none: one finding of a factor per row instead, with both
    factors."""
    out = []
    for kind, name, check, message, c_first in found:
        there = [d for d in at_last.diagnoses if d.input == name and d.check == check]
        c_last = 1.0 if not there else next((d.factor for d in there if d.kind == "scale"), None)
        if kind != "scale" or c_first is None or c_last is None or abs(c_first - c_last) <= 1e-3 * abs(c_first):
            out.append((kind, name, check, message, c_first))
            continue
        places = f"{first[3:]} and on {last[3:]}"
        out.append(("per_row_factor", name, check,
                    f"on {places} (full Jacobians there): analytic = c × numeric in each, c = {c_first:.6g} and "
                    f"{c_last:.6g}: the factor differs between y's rows — a per-row normalizer (the row's count, "
                    "sum or norm) is missing, applied twice, or the wrong one", None))
    return out


def first_rows(call, limit, apart=False):
    """The op of a gradcheck call at size (its own reference) cut to its first rows along y's axes, as cut_along_y
    gives it: (the cut inputs, where); None where nothing is cut, or for a scalar loss (whose cut's full Jacobian
    costs more than projections of the whole: name_on_the_cut cuts it where they leave a slip unnamed). apart: where
    no cut fits every checked input, the cut that fits those some cut fits (fitting_cut)."""
    c = own_reference(call)
    cut = fitting_cut(c, limit, one_axis=True, loss_batch=False) if apart else \
        cut_along_y(c, limit, one_axis=True, loss_batch=False)
    return cut if cut is not None and cut[1] else None


def fitting_cut(c, limit, slot=None, **options):
    """cut_along_y's cut where every checked input (or the one at slot) fits it; else, where no cut fits them all, the
    cut at which those fit that some cut fits alone: an input with none of y's axes (a weight of a product) has a
    Jacobian that grows with y's rows however few are kept, and stays whole on the cut, checked there by projections
    as at size (each input is named alone, the others held fixed, so one input's size need not keep another from its
    cut). None where no input fits any cut."""
    cut = cut_along_y(c, limit, judged=None if slot is None else [slot], **options)
    if cut is not None or slot is not None or len(c.slots) < 2:
        return cut
    fitting = [s for s in c.slots if cut_along_y(c, limit, judged=[s], **options) is not None]
    return cut_along_y(c, limit, judged=fitting, **options) if fitting else None


def own_reference(call):
    """What cut_along_y reads of a gradcheck call whose op is its own reference: it runs on its inputs' device (a CUDA
    kernel refuses, or misreads, host memory)."""
    device = next((x.device for x in call.inputs if isinstance(x, torch.Tensor)), torch.device("cpu"))
    return _CutCall(call.fn, call.fn, call.inputs, call.slots, call.kwargs or {}, device)


@dataclass
class _CutCall:
    """What cut_along_y reads of a call: the op, the reference whose float64 run must accept the cut too, all its
    arguments, which of them are checked, its keyword arguments, and the device the reference runs on."""
    fn: object
    ref_fn: object
    inputs: tuple
    slots: list
    kwargs: dict
    device: object
