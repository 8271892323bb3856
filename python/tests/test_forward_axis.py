"""A reduction or broadcast along the wrong axis (wrong_axis), and an element-wise call's derivative written wrong
(term_factor) or taken at the wrong value (wrong_value): named by an edit of the traced backward
(checker/formulas/edits.cpp) or from the forward (tapegrad/_forward_axis.py, _forward_derivative.py)."""

import pytest
import torch

from test_forward import check, inputs


def channel_scale(slip=None):
    """y = x·w with one weight per column: w̄ sums over the rows."""

    class ChannelScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            gw = g * x
            dw = gw.sum(1) if slip == "dw_over_columns" else gw.sum(0)
            return g * w, 0.5 * dw if slip == "half_dw" else dw

    return ChannelScale


def row_cumsum(slip=None):
    """y = cumsum(2x) along each row; its adjoint is a reversed cumsum along the rows."""

    class RowCumsum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return torch.cumsum(2.0 * x, dim=1)

        @staticmethod
        def backward(ctx, g):
            axis = 0 if slip == "down_the_columns" else 1
            return 2.0 * torch.flip(torch.flip(g, [axis]).cumsum(axis), [axis])

    return RowCumsum


def batch_scale(slip=None):
    """y = a·w, a of shape (3, 4) and w of shape (4,): w broadcast over the rows of a."""

    class BatchScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, w):
            ctx.save_for_backward(a, w)
            return torch.tanh(a) * w

        @staticmethod
        def backward(ctx, g):
            a, w = ctx.saved_tensors
            t = torch.tanh(a)
            dw = (g * t)[0] if slip == "first_row" else (g * t).sum(0)
            return g * w * (1 - t * t), dw

    return BatchScale


def elementwise(name, forward, derivative):
    """y = forward(x) element by element, with the backward g·derivative(x)."""

    class Elementwise(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return forward(x)

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return g * derivative(x)

    Elementwise.__name__ = Elementwise.__qualname__ = name
    return Elementwise


def steep_sigmoid(slip=None):
    """y = σ(2x); the slip writes σ′ as σ."""
    s = lambda x: torch.sigmoid(2.0 * x)
    prime = s if slip == "prime_as_value" else lambda x: s(x) * (1 - s(x))
    return elementwise("SteepSigmoid", lambda x: torch.sigmoid(2.0 * x), lambda x: 2.0 * prime(x))


def half_tanh(slip=None):
    """y = tanh(x/2); the slip takes tanh at x."""
    at = (lambda x: x) if slip == "tanh_of_x" else lambda x: 0.5 * x
    return elementwise("HalfTanh", lambda x: torch.tanh(0.5 * x), lambda x: 0.5 * (1 - torch.tanh(at(x)) ** 2))


def x_sin(slip=None):
    """y = x·sin(x); the slip leaves out sin′ = cos."""
    inner = (lambda x: 1.0) if slip == "no_cos" else torch.cos
    return elementwise("XSin", lambda x: x * torch.sin(x), lambda x: torch.sin(x) + x * inner(x))


CASES = [
    (channel_scale, "dw_over_columns", lambda: inputs((4, 4), (4,)), "w", "wrong_axis"),
    (row_cumsum, "down_the_columns", lambda: inputs((5, 5)), "x", "wrong_axis"),
    (batch_scale, "first_row", lambda: inputs((3, 4), (4,)), "w", "wrong_axis"),
    (steep_sigmoid, "prime_as_value", lambda: inputs((4, 5)), "x", "term_factor"),
    (half_tanh, "tanh_of_x", lambda: inputs((4, 5)), "x", "wrong_value"),
    (x_sin, "no_cos", lambda: inputs((4, 5)), "x", "term_factor"),
]


def message(report, kind, name):
    return next(d.message for d in report.diagnoses if d.kind == kind and d.input == name)


@pytest.mark.parametrize("make, slip, args, name, kind", CASES, ids=[c[1] for c in CASES])
def test_the_slip_is_named_with_its_kind_and_its_right_version_passes(make, slip, args, name, kind):
    report = check(make(slip), args())
    assert not report.passed and report.has(kind, name), str(report)
    right = check(make(), args())
    assert right.passed, str(right)


def test_a_sum_over_the_wrong_axis_is_the_edit_of_that_axis():
    text = message(check(channel_scale("dw_over_columns"), inputs((4, 4), (4,))), "wrong_axis", "w")
    # the trace writes gw.sum(1) as squeeze(sum(gw, -1), -1): the edit moves both to the rows' axis
    assert "reduces over axis -2, not -1" in text and "squeeze(sum(gw, -2), -2)" in text, text
    assert "test_forward_axis.py:24 `dw = gw.sum(1) if slip" in text, text


def test_a_scan_along_the_wrong_axis_is_the_forwards_call_along_it():
    text = message(check(row_cumsum("down_the_columns"), inputs((5, 5))), "wrong_axis", "x")
    assert ("`torch.cumsum(2.0 * x, dim=1)` at test_forward_axis.py:36 taken along axis 0 where the forward takes "
            "axis 1" in text), text


def test_a_broadcast_operand_whose_gradient_keeps_one_entry():
    text = message(check(batch_scale("first_row"), inputs((3, 4), (4,))), "wrong_axis", "w")
    assert "the gradient of `w` — broadcast to (3, 4) by `torch.tanh(a) * w`" in text, text
    assert "not summed over the broadcast axis 0: its first entry is kept" in text, text


def test_a_broadcast_along_an_axis_of_another_size_is_no_axis_slip():
    """w̄ half what it is, w of shape (4,) over (3, 4): no other axis of the size of the broadcast one, so no sum
    over another axis is a candidate, nor is one row's gradient."""

    report = check(channel_scale("half_dw"), inputs((3, 4), (4,)))
    assert not report.passed and not report.has("wrong_axis"), str(report)


def test_a_derivative_written_as_the_calls_value():
    text = message(check(steep_sigmoid("prime_as_value"), inputs((4, 5))), "term_factor", "x")
    assert text.startswith("x̄ has the derivative of `torch.sigmoid(2.0 * x)` at test_forward_axis.py:87 written "
                           "`sigmoid` where sigmoid′ = sigmoid·(1 − sigmoid) belongs"), text


def test_a_derivative_taken_at_the_wrong_value_names_that_value():
    text = message(check(half_tanh("tanh_of_x"), inputs((4, 5))), "wrong_value", "x")
    assert "`torch.tanh(0.5 * x)` at test_forward_axis.py:93, and what follows it, evaluated at `x` where " \
           "`0.5 * x` belongs" in text, text


def test_an_element_wise_calls_derivative_left_out_is_a_missing_factor():
    text = message(check(x_sin("no_cos"), inputs((4, 5))), "term_factor", "x")
    assert text.startswith("x̄ misses the chain rule's factor of `torch.sin(x)` at test_forward_axis.py:99"), text
