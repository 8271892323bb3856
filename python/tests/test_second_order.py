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


class DecayScan(torch.autograd.Function):
    """y[t] = x[t] + γ·y[t−1], its backward written into a buffer row by row, reading the row it wrote last: right,
    and not differentiable again by torch (each write moves the version of a tensor the graph saved)."""

    @staticmethod
    def forward(ctx, x, gamma):
        ys, prev = [], torch.zeros_like(x[0])
        for t in range(x.shape[0]):
            prev = x[t] + gamma * prev
            ys.append(prev)
        y = torch.stack(ys)
        ctx.save_for_backward(gamma, y)
        return y

    @staticmethod
    def backward(ctx, g):
        gamma, y = ctx.saved_tensors
        lam = torch.empty_like(g)
        lam[-1] = g[-1]
        for t in range(g.shape[0] - 2, -1, -1):
            lam[t] = g[t] + gamma * lam[t + 1]
        return lam, (lam[1:] * y[:-1]).sum().reshape(gamma.shape)


def test_a_backward_that_writes_in_place_is_said_so_at_order_2_not_raised():
    xs = (torch.randn(5, 3, dtype=torch.float64, requires_grad=True),
          torch.tensor([0.5], dtype=torch.float64, requires_grad=True))
    assert tapegrad.gradcheck(DecayScan.apply, xs), "first order is checked as usual"
    report = tapegrad.gradcheck(DecayScan.apply, xs, order=2)
    assert not report.passed
    hvp = [c for c in report.checks if c.check == "hvp"]
    assert hvp and all(c.skipped for c in hvp), report
    assert "writes in place" in str(report) and "second order cannot be checked" in str(report), report


def test_numpy_rules_to_second_order():
    x = np.random.default_rng(1).standard_normal(5)
    report = tapegrad.gradcheck(np.sin, (x,), vjp=lambda g, x: g * np.cos(x), jvp=lambda t, x: t[0] * np.cos(x),
                                hvp=lambda g, t, x: [-g * np.sin(x) * t[0]], order=2)
    assert report, report
