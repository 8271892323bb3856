"""tapegrad.gradcheck on the researcher-style ops of researcher_ops.py: every right backward passes (first order and,
as each has a differentiable backward, second order), as it passes torch's gradcheck and gradgradcheck; and every
slip that torch's checks catch, tapegrad's catches. A gap found later is marked xfail(strict) with the gap named (in
RIGHT_GAPS, SLIP_GAPS), so that it turns into a failure, to be unmarked, once the gap is closed.

python/tools/slip_table.py measures the same set at both sizes, with the kinds named and the times."""

import warnings

import pytest
import torch

import researcher_ops as R
import tapegrad

EPS, ATOL, RTOL = 1e-6, 1e-5, 1e-3

# The gaps at the small size, measured by python/tools/slip_table.py: none now (a 0-d input, an op of two outputs and a
# loss whose backward ignores grad_output were the last three).
RIGHT_GAPS = {}
SLIP_GAPS = {}


def _marked(cases, gaps):
    """pytest params of the cases (keys of gaps, or not), each gap marked as an expected failure that must fail."""
    return [pytest.param(*(case if isinstance(case, tuple) else (case,)),
                         marks=[pytest.mark.xfail(strict=True, reason=gaps[case])] if case in gaps else [])
            for case in cases]


RIGHTS = _marked(list(R.OPS), RIGHT_GAPS)
SLIPS = _marked([(op, slip) for op, spec in R.OPS.items() for slip in spec.slips], SLIP_GAPS)


def _torch_catches(fn, xs, order):
    check = torch.autograd.gradcheck if order == 1 else torch.autograd.gradgradcheck
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            check(fn, xs, eps=EPS, atol=ATOL, rtol=RTOL)
    except Exception:
        return True
    return False


def test_the_set_covers_the_kinds_of_slip():
    assert len(R.OPS) >= 22
    assert R.slip_count() >= 55
    kinds = {slip.kind for spec in R.OPS.values() for slip in spec.slips.values()}
    assert kinds >= set(R.KINDS) - {"masked"}, set(R.KINDS) - kinds
    for spec in R.OPS.values():
        assert 2 <= len(spec.slips) <= 5, spec.name


@pytest.mark.parametrize("op", [op for op in R.OPS])
def test_large_inputs_make_the_checker_use_projections(op):
    """At the large size some input's Jacobian has more than 40,000 entries (output size × input size)."""
    fn = R.make(op).apply
    xs = R.inputs(op, "large")
    with torch.no_grad():
        ys = fn(*xs)
    m = sum(y.numel() for y in (ys if isinstance(ys, tuple) else (ys,)))
    assert max(m * x.numel() for x in xs if x.requires_grad) > 40000


@pytest.mark.parametrize("op", [op for op in R.OPS])
def test_torch_passes_every_right_version(op):
    fn = R.make(op).apply
    assert not _torch_catches(fn, R.inputs(op), 1)
    assert not _torch_catches(fn, R.inputs(op), 2)


@pytest.mark.parametrize("op", RIGHTS)
def test_tapegrad_passes_every_right_version(op):
    fn = R.make(op).apply
    report = tapegrad.gradcheck(fn, R.inputs(op))
    assert report, report
    report = tapegrad.gradcheck(fn, R.inputs(op), order=2)
    assert report, report


@pytest.mark.parametrize("op, slip", SLIPS)
def test_tapegrad_catches_every_slip_torch_catches(op, slip):
    fn = R.make(op, slip).apply
    order = 2 if R.OPS[op].slips[slip].kind == "second_order_only" else 1
    assert _torch_catches(fn, R.inputs(op), order), f"{op}/{slip} passes torch's check: not a slip"
    report = tapegrad.gradcheck(fn, R.inputs(op), order=order)
    assert not report, report
    if order == 2:  # right at first order, which is what makes it a second-order slip
        assert tapegrad.gradcheck(fn, R.inputs(op))


def test_most_slips_are_named_with_a_specific_kind():
    """At the small size (full Jacobians) at least 85% of the slips get a kind that says what the slip is, not only
    where it is (R.GENERIC); python/tools/slip_table.py prints which, per slip, and at the large size too."""
    named, slips = [], 0
    for op, spec in R.OPS.items():
        for slip, s in spec.slips.items():
            order = 2 if s.kind == "second_order_only" else 1
            report = tapegrad.gradcheck(R.make(op, slip).apply, R.inputs(op), order=order)
            slips += 1
            if {d.kind for d in report.diagnoses} - R.GENERIC:
                named.append(f"{op}/{slip}")
    assert len(named) >= 0.85 * slips, f"{len(named)} of {slips} named: {named}"
