"""tapegrad.gradcheck on numpy functions with rules of their own."""

import numpy as np

import tapegrad


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_vjp(g, x):
    p = softmax(x)
    return p * (g - (p * g).sum(axis=-1, keepdims=True))


def softmax_jvp(tangents, x):
    p = softmax(x)
    (t,) = tangents
    return p * (t - (p * t).sum(axis=-1, keepdims=True))


X = np.random.default_rng(3).standard_normal((4, 6))


def test_rules_that_agree_pass_with_vjp_and_jvp_checked():
    report = tapegrad.gradcheck(softmax, (X,), vjp=softmax_vjp, jvp=softmax_jvp)
    assert report, report
    assert not any(c.skipped for c in report.checks)


def test_without_jvp_the_report_notes_it():
    report = tapegrad.gradcheck(softmax, (X,), vjp=softmax_vjp)
    assert report.passed
    assert report.has("no_jvp")


def test_a_vjp_right_and_a_jvp_wrong_is_jvp_only():
    report = tapegrad.gradcheck(softmax, (X,), vjp=softmax_vjp, jvp=lambda t, x: 2 * softmax_jvp(t, x))
    assert not report
    assert report.has("jvp_only", "x"), report


def test_the_numpy_and_torch_twins_of_a_slip_get_the_same_kinds():
    import torch
    from slips import SLIPS, random_inputs

    op, shapes, kind, _ = SLIPS["per_row_term"]
    (x,) = random_inputs(shapes)
    from_torch = tapegrad.gradcheck(op, (x,))
    from_numpy = tapegrad.gradcheck(softmax, (x.detach().numpy(),), vjp=lambda g, x: softmax(x) * g)
    # the torch Function without jvp says so under the title, the numpy op without jvp= in a "no JVP" note; the torch
    # Function's forward also names the term that is left out (the numpy op has no forward to name it from)
    named_from_the_forward = {"term_dropped", "term_added", "term_sign", "term_factor", "wrong_value"}
    assert "term_dropped" in from_torch.kinds, from_torch
    assert (sorted(k for k in from_torch.kinds if k not in named_from_the_forward)
            == sorted(k for k in from_numpy.kinds if k != "no_jvp"))
    assert kind in from_torch.kinds
    del torch
