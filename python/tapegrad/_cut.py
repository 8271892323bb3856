"""Cutting an op to a size whose Jacobians can be checked in full: its inputs narrowed to their first rows along y's
axes, every tensor argument that has the axis (a fixed mask, target or bias too, which the op would refuse uncut), so
that a slip found by random projections at size, where they show only a scale or a sign, can be named there.

Used by the low-precision check's naming (tapegrad/_precision_names.py) and by the float64 check of a torch op, after
the C++ checker's own cut (checker/diagnose_narrowed.cpp), which cuts only the checked inputs along y's leading axis.
"""

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


def cut_along_y(c, limit, leading_first=False, from_end=False, one_axis=False):
    """(the inputs cut to their first rows along y's leading axes, where: "on the first 2 of 8 along y's axis 0") so
    that every checked input's full
    Jacobian has at most limit entries (the inputs as they are and "" where they fit), or None where no cut fits or the
    op refuses one. An input is cut along y's axis a where it has that axis: the same axis of the same length, its
    shape aligned with y's on the left where its rank is y's or more (the same layout, or an input the op reduces
    over trailing axes), else on the right (a broadcast operand, a per-head bias) or, where the right has no such
    axis and does not give that axis of the input to another of y's of its length, on the left (a (B, T) mask of a
    (B, T, D) op; not a (D,) weight of a (D, D) op). Leading axes are cut first; the first keeps two rows where
    that fits, so that a slip that reads one batch element only still shows. leading_first: the first axis to one
    row before any other is cut (a scan along the second axis, whose slip may not show on one of its steps).
    from_end: the last rows, not the first. one_axis: an op whose y has one axis is cut along it too (the float64
    check's naming; at a low precision the rounding of two rows reads as a structure and is not cut)."""
    fn, ref_fn, inputs, slots, kwargs = c.fn, c.ref_fn, c.inputs, c.slots, c.kwargs
    with torch.no_grad():
        ys = float_outputs(fn(*inputs, **kwargs))
    if len(ys) != 1 or ys[0].dim() < (1 if one_axis else 2):  # no axis to cut: the inputs as they are, where they fit
        outputs = sum(y.numel() for y in ys)
        return (list(inputs), "") if max(outputs * inputs[i].numel() for i in slots) <= limit else None
    shape = tuple(ys[0].shape)

    def entries(args, y_numel):
        return max(y_numel * args[i].numel() for i in slots)

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
        return len(got) == 1 and tuple(got[0].shape) == new_shape and tuple(ref[0].shape) == new_shape

    args, now, said = list(inputs), list(shape), {}

    def fits():
        return entries(args, int(np.prod(now))) <= limit

    # the first axis to two rows, the others to one, in turn; then the first to one where that did not fit
    inner = [(a, 1) for a in range(1, len(shape) - 1)]
    for a, s in [(0, 2)] + ([(0, 1)] + inner if leading_first else inner + [(0, 1)]):
        if fits():
            break
        if s >= now[a]:
            continue
        trial = cut(args, a, s, now[a])
        trial_shape = tuple(now[:a] + [s] + now[a + 1:])
        if accepted(trial, trial_shape):
            args, now = trial, list(trial_shape)
            said[a] = f"the {'last' if from_end else 'first'} {s} of {shape[a]} along y's axis {a}"
    if not fits():
        return None
    return args, f"on {', '.join(said[a] for a in sorted(said))}" if said else ""


def full_jacobian_there(place):
    """The words a finding on a cut begins with: "on the first 2 of 8 along y's axis 0 (a full Jacobian there): "."""
    return f"{place} (a full Jacobian there): " if place else ""


AT_SIZE = "random projections ("  # how the C++ checker's line for an input it could not name at size begins
ON_ITS_CUT = "(a full Jacobian there): none of the known kinds"  # its line for one its own cut did not name
# what does not replace that line: no name, or a finding of the point rather than of the rule (a few elements at a
# kink of another cut, a tolerance)
NOT_A_NAME = {"unexplained", "kink", "tolerance"}


def name_on_the_cut(report, call, gradcheck):
    """The float64 report's inputs that random projections left unnamed, checked again in full (by gradcheck, the
    module's own) on the op cut along y's axes with its fixed tensors (cut_along_y): the cut's findings of those
    inputs replace their line, each saying where it was found. Nothing changes where no cut fits, the op refuses
    every cut, or the cut passes."""
    unnamed = {d.input for d in report.diagnoses if d.kind == "unexplained" and d.message.startswith(AT_SIZE)}
    # the C++ checker's own cut (the checked inputs' first rows) left unnamed: the module's cut traces the backward
    # there too, so a slip of its formulas (a softmax along the wrong axis) may be named; only a name replaces it
    on_its_cut = {d.input for d in report.diagnoses if d.kind == "unexplained" and ON_ITS_CUT in d.message} - unnamed
    unnamed |= on_its_cut
    if not unnamed:
        return
    c = own_reference(call)

    def check_on(cut):
        return gradcheck(call.fn, cut[0], inputs_to_check=call.slots, names=call.names, name=call.name,
                         kwargs=call.kwargs, **{**call.keywords, "fast_mode": False})

    tried = []
    for leading_first in (False, True):  # inner axes cut first, then the leading one first where the slip hid
        cut = cut_along_y(c, CUT_LIMIT, leading_first, one_axis=True)
        if cut is None or not cut[1] or cut[1] in tried:  # no cut fits, nothing was cut, or this cut was tried
            continue
        tried.append(cut[1])
        again = check_on(cut)
        if again.passed:
            continue
        found = [(d.kind, d.input, d.check, full_jacobian_there(cut[1]) + d.message, d.factor) for d in again.diagnoses
                 if d.input in unnamed and d.check and not (d.input in on_its_cut and d.kind in NOT_A_NAME)]
        if any(kind == "scale" for kind, *_ in found) and " 1 of " in cut[1]:
            # one row along an axis, where a factor of each row (a count, a norm) reads as one scale: the same
            # check on the last rows says whether the factor is the same there
            other = cut_along_y(c, CUT_LIMIT, leading_first, from_end=True, one_axis=True)
            if other is not None:
                found = _factors_per_row(found, cut[1], other[1], check_on(other))
        for finding in found:
            _tapegrad._add_diagnosis(report, *finding)
        return


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


def first_rows(call, limit):
    """Past ON_A_CUT checked elements, the op of a gradcheck call (its own reference) cut to its first rows along y's
    axes, as cut_along_y gives it: (the cut inputs, where); None below that size, or where nothing is cut."""
    if sum(call.inputs[s].numel() for s in call.slots) <= ON_A_CUT:
        return None
    cut = cut_along_y(own_reference(call), limit, one_axis=True)
    return cut if cut is not None and cut[1] else None


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
