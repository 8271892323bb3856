"""The edge probes (gradcheck(..., edges=True), tapegrad/_edges.py) on the sets of ops with a bug at an edge:
edge_set.py (the build set) and edge_heldout.py (measured only, against the rate frozen with it)."""

import math

import pytest
import torch
import torch.nn.functional as F

import edge_heldout
import edge_length_one
import edge_other_axes
import edge_set
import tapegrad
from tapegrad.testing import cases

# Fixed versions that break at an edge other than the one the set fixes (a true finding, not one the set intended):
# their frozen expectation, no finding, fails, and is kept as an expected failure rather than rewritten.
FIXED_BREAK_ELSEWHERE = {
    "logsumexp float32": "fixed for overflow; a fully masked row's output is log 0 = −∞, and x̄ at ȳ = 0 is 0·∞",
    "softmax float16": "fixed for overflow; a fully masked row is −∞ − (−∞) = NaN",
}


def _check(case, fn):
    return tapegrad.gradcheck(fn, case.inputs(), edges=case.edges, reference=edge_set.REFERENCES.get(case.name))


def _named(case, report):
    """The edge findings that hold every word of the case's and its reproduction line's piece."""
    return [d for d in report.diagnoses if d.kind == "edge" and "reproduce: " in d.message
            and all(w.lower() in d.message.lower() for w in case.words) and case.repro in d.message]


@pytest.mark.parametrize("case", edge_set.CASES, ids=lambda c: c.name)
def test_each_build_set_bug_is_found_and_named_with_its_reproduction(case):
    report = _check(case, case.buggy)
    assert not report.passed
    assert _named(case, report), str(report)
    row = [c for c in report.checks if c.check == "edges" and not c.passed]
    assert row, "an edge finding fails the report through its row"


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.xfail(
    strict=True, reason=FIXED_BREAK_ELSEWHERE[c.name])) if c.name in FIXED_BREAK_ELSEWHERE else c
    for c in edge_set.CASES], ids=lambda c: c.name)
def test_each_fixed_version_has_no_edge_finding(case):
    report = _check(case, case.fixed)
    assert [d.message for d in report.diagnoses if d.kind == "edge"] == []


@pytest.mark.parametrize("name", sorted(FIXED_BREAK_ELSEWHERE))
def test_the_fixed_versions_that_break_elsewhere_break_where_their_line_says(name):
    """Their finding is true: the line it prints, run on the inputs, gives the NaN it reports."""
    case = next(c for c in edge_set.CASES if c.name == name)
    finding = next(d for d in _check(case, case.fixed).diagnoses if d.kind == "edge")
    assert "reproduce: x[1, :] = -inf" in finding.message
    x = case.inputs()[0].detach().clone()
    x[1, :] = -math.inf
    x.requires_grad_()
    y = case.fixed(x)
    grad, = torch.autograd.grad(y, x, torch.zeros_like(y))
    assert torch.isnan(y).any() or torch.isnan(grad).any()


def test_the_held_out_rate_is_at_least_its_frozen_expectation():
    found = sum(bool(_named(c, _check(c, c.buggy))) for c in edge_heldout.CASES)
    rate = found / len(edge_heldout.CASES)
    print(f"held-out: {found} of {len(edge_heldout.CASES)} found and named ({rate:.0%})")
    assert rate >= edge_heldout.EXPECTED_RATE


# Length-1 fixed versions that break at another edge (a true finding there, not at the length the set fixes).
LENGTH_ONE_FIXED_BREAK_ELSEWHERE = {
    "softmax at temperature n - 1": "a softmax of a fully masked row is 0/0, as torch.softmax's",
}


@pytest.mark.parametrize("case", edge_length_one.BUILD, ids=lambda c: c.name)
def test_each_length_one_build_bug_is_found_and_named_with_its_reproduction(case):
    report = _check(case, case.buggy)
    assert not report.passed
    assert _named(case, report), str(report)


@pytest.mark.parametrize("case", edge_length_one.BUILD + edge_length_one.HELDOUT, ids=lambda c: c.name)
def test_each_length_one_fixed_version_has_no_finding_at_a_length_of_1(case):
    findings = [d.message for d in _check(case, case.fixed).diagnoses if d.kind == "edge"]
    if case.name in LENGTH_ONE_FIXED_BREAK_ELSEWHERE:
        assert findings and not any("a length of 1" in f for f in findings), findings
    else:
        assert findings == []


def test_the_length_one_held_out_rate_is_at_least_its_frozen_expectation():
    found = sum(bool(_named(c, _check(c, c.buggy))) for c in edge_length_one.HELDOUT)
    print(f"length 1, held out: {found} of {len(edge_length_one.HELDOUT)} found and named")
    assert found / len(edge_length_one.HELDOUT) >= edge_length_one.HELDOUT_EXPECTED_RATE


def test_ops_reducing_over_another_axis_are_probed_along_it_at_their_frozen_rate():
    """A max over the batch or over time moves with one element only when that element becomes the max: the axis is
    found by moving elements far too."""
    found = sum(bool(_named(c, _check(c, c.buggy))) for c in edge_other_axes.CASES)
    print(f"other axes: {found} of {len(edge_other_axes.CASES)} found and named")
    assert found / len(edge_other_axes.CASES) >= edge_other_axes.EXPECTED_RATE
    for case in edge_other_axes.CASES:
        assert [d.message for d in _check(case, case.fixed).diagnoses if d.kind == "edge"] == [], case.name


def test_a_length_of_1_the_op_cannot_take_is_a_note_not_a_finding():
    """A matmul's inner length cut in its first input alone no longer fits its second: not probed, and said so."""
    w = _x(5, 2, seed=4)
    report = tapegrad.gradcheck(lambda x: x @ w, (_x(3, 5),), edges=True)
    assert report.passed, str(report)
    assert "not probed at a length of 1 along axis -1" in str(report)


def _softmax(x):
    return F.softmax(x, -1)


def _layer_norm(x):
    return F.layer_norm(x, (x.shape[-1],))


def _logsumexp(x):
    return torch.logsumexp(x, -1)


def _normalize(x):
    return F.normalize(x, dim=-1)


def _attention(q, k, v, mask):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5 + mask
    return torch.softmax(s, -1) @ v


def _causal(n):
    return torch.zeros(n, n, dtype=torch.float64).masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), -math.inf)


def _x(*shape, seed=0):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).requires_grad_()


# torch's own ops, with the edges their documentation defines as NaN declared: a softmax (and an attention) of an
# all −∞ row is 0/0; torch.logsumexp of an all −∞ row is −∞, and its backward exp(x − (−∞)) is NaN even at ȳ = 0.
TORCH_OPS = [
    ("softmax", _softmax, lambda: (_x(3, 5),), {"masked_rows": "nan"}),
    ("layer_norm", _layer_norm, lambda: (_x(3, 5),), True),
    ("logsumexp", _logsumexp, lambda: (_x(3, 5),), {"masked_rows": "nan"}),
    ("normalize", _normalize, lambda: (_x(3, 5),), True),
    ("attention with a causal mask", _attention, lambda: (_x(4, 3, seed=1), _x(4, 3, seed=2), _x(4, 3, seed=3),
                                                          _causal(4)), {"mask_rows": "nan"}),
]


@pytest.mark.parametrize("name,fn,inputs,edges", TORCH_OPS, ids=[t[0] for t in TORCH_OPS])
def test_torch_ops_have_no_edge_finding_where_their_documented_behaviour_holds(name, fn, inputs, edges):
    report = tapegrad.gradcheck(fn, inputs(), edges=edges)
    assert report.passed, str(report)
    assert any(c.check == "edges" for c in report.checks)


def test_a_declared_edge_is_skipped_with_a_line():
    report = tapegrad.gradcheck(_softmax, (_x(3, 5),), edges={"masked_rows": "nan"})
    assert "not probed, declared undefined: masked_rows (nan)" in str(report)
    undeclared = tapegrad.gradcheck(_softmax, (_x(3, 5),), edges=True)
    assert not undeclared.passed and "reproduce: x[1, :] = -inf" in str(undeclared)


def test_the_repository_examples_have_no_edge_finding():
    from layer_norm import inputs as ln_inputs, make_layer_norm
    from silu import inputs as silu_inputs, make_silu
    for fn, args in ((make_layer_norm().apply, ln_inputs()), (make_silu().apply, silu_inputs())):
        report = tapegrad.gradcheck(fn, args, edges=True)
        assert report.passed, str(report)


@pytest.mark.parametrize("bad,said", [("yes", "edges must be"), ({"rows": "nan"}, "edges names no edge 'rows'"),
                                      ({"masked_rows": "zero"}, "edges['masked_rows'] must be"), (1, "edges must be")])
def test_bad_edges_values_are_refused_naming_the_option(bad, said):
    with pytest.raises(ValueError, match=r"gradcheck: edges"):
        tapegrad.gradcheck(_softmax, (_x(3, 5),), edges=bad)
    with pytest.raises(ValueError) as error:
        tapegrad.gradcheck(_softmax, (_x(3, 5),), edges=bad)
    assert said in str(error.value)


def test_numpy_rules_are_refused_edges():
    import numpy as np
    with pytest.raises(ValueError, match="edges="):
        tapegrad.gradcheck(lambda x: 2 * x, (np.ones(3),), vjp=lambda g, x: (2 * g,), edges=True)


@cases(dtypes=[torch.float64], edges=True)
def test_cases_runs_each_case_at_a_point_and_at_the_edges(dtype, device, edges):
    from tapegrad.testing import assert_gradients
    x = torch.randn(3, 5, dtype=dtype, generator=torch.Generator().manual_seed(0)).requires_grad_()
    report = assert_gradients(edge_set.masked_softmax_safe, (x,), edges=edges)
    assert any(c.check == "edges" for c in report.checks) == (edges is not None)


def test_python_md_quotes_the_edge_example_as_it_prints():
    """docs/python.md's edge example runs, and prints the lines it quotes (the table's numbers aside)."""
    import re

    from test_docs import fenced_blocks, run
    text = [(code, quoted) for code, quoted in fenced_blocks("docs/python.md", "python") if "edges=True" in code]
    assert len(text) == 1
    code, quoted = text[0]
    printed, namespace = run(code)
    assert namespace["report"], namespace["report"]

    def masked(line):
        return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", line)
    lines = {masked(line) for line in printed.splitlines()}
    for line in quoted.splitlines():
        assert masked(line) in lines, f"docs/python.md quotes {line!r}; the example printed:\n{printed}"
