"""order=2: H·t by double backward against differences of the gradient."""

import numpy as np
import torch

import tapegrad
from attention_gradient import inputs as attention_inputs, make_attention


def cube(second_order_right):
    """y = x³ whose backward 3x²ȳ is differentiable in x only when second_order_right."""

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return 3 * (x if second_order_right else x.detach()) ** 2 * g

    Cube.__name__ = "cube" if second_order_right else "cube[detached x in backward]"
    return Cube.apply


def opaque_cube():
    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return torch.from_numpy(3 * x.detach().numpy() ** 2 * g.detach().numpy())

    return Cube.apply


X = (torch.randn(2, 3, dtype=torch.float64, requires_grad=True),)


def test_a_correct_double_backward_passes():
    report = tapegrad.gradcheck(cube(True), X, order=2)
    assert report, report
    assert {c.check for c in report.checks} == {"hvp", "symmetry", "accumulate"}


def test_attention_double_backward_passes():
    assert tapegrad.gradcheck(make_attention().apply, attention_inputs(n=3, d=4), order=2)


def test_attention_with_p_saved_by_forward_has_a_wrong_double_backward():
    xs = attention_inputs(n=3, d=4)
    assert tapegrad.gradcheck(make_attention(saved_p=True).apply, xs)
    report = tapegrad.gradcheck(make_attention(saved_p=True).apply, xs, order=2)
    assert not report
    assert report.has("hessian_block"), report


def test_a_wrong_double_backward_fails_with_a_hessian_diagnosis():
    report = tapegrad.gradcheck(cube(False), X, order=2)
    assert not report
    assert report.diagnoses, report
    assert tapegrad.gradcheck(cube(False), X)  # first order is right


def test_a_backward_that_is_not_differentiable_is_said_so():
    report = tapegrad.gradcheck(opaque_cube(), X, order=2)
    hvp = [c for c in report.checks if c.check == "hvp"]
    assert hvp and all(c.skipped for c in hvp)
    assert "not differentiable" in hvp[0].worst
    assert "not differentiable" in str(report)


def test_numpy_rules_to_second_order():
    x = np.random.default_rng(1).standard_normal(5)
    report = tapegrad.gradcheck(np.sin, (x,), vjp=lambda g, x: g * np.cos(x), jvp=lambda t, x: t[0] * np.cos(x),
                                hvp=lambda g, t, x: [-g * np.sin(x) * t[0]], order=2)
    assert report, report
