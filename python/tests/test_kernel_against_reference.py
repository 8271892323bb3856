"""The structural kinds at a precision read the reference's Jacobian from its backward where a reference is given
(tapegrad/_kernel_against_reference.py): a batch of its rows per call, where finite differences take two runs of
the forward per input element."""

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad._kernel_against_reference import _jacobian
from tapegrad._rounding import _Run


def mean_cross_entropy(logits, target):
    return -(logits.log_softmax(-1).gather(-1, target[:, None])).mean()


def make_cross_entropy(slip=None):
    """A fused loss: float32 inside, its result and x̄ at the input's dtype; slip "sign" flips x̄ on the 16-bit and
    float32 path alone (fn in float64 is right, so the slip is named at the dtype, not by fn's float64 check)."""

    class CrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, logits, target):
            p = logits.float().softmax(-1)
            ctx.save_for_backward(p, target)
            return -(p.log().gather(-1, target[:, None])).mean().to(logits.dtype)

        @staticmethod
        def backward(ctx, g):
            p, target = ctx.saved_tensors
            d = p.clone()
            d[torch.arange(len(target)), target] -= 1
            d = d * (g.float() / len(target))
            flip = slip == "sign" and g.dtype != torch.float64
            return (-d if flip else d).to(g.dtype), None

    return CrossEntropy.apply


class Counted:
    """The reference, counting its runs."""

    def __init__(self, fn):
        self.fn, self.runs = fn, 0

    def __call__(self, *args, **kwargs):
        self.runs += 1
        return self.fn(*args, **kwargs)


def inputs(rows=256, classes=48, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(rows, classes, generator=g).to(dtype), torch.randint(classes, (rows,), generator=g)]


def test_the_reference_jacobian_is_its_backward_rows_and_matches_finite_differences():
    x = torch.randn(5, 7, dtype=torch.float64)
    w = torch.randn(7, 3, dtype=torch.float64)

    def f(x):
        return ((x @ w).tanh(), x.sum(-1))

    run = _Run(f, [x], [0], {}, "f")
    jac = _jacobian(run, 5 * 3 + 5)
    eps, numeric = 1e-6, np.zeros((20, 35))
    for k in range(35):
        plus, minus = x.clone().reshape(-1), x.clone().reshape(-1)
        plus[k] += eps
        minus[k] -= eps
        yp = torch.cat([t.reshape(-1) for t in f(plus.reshape(5, 7))])
        ym = torch.cat([t.reshape(-1) for t in f(minus.reshape(5, 7))])
        numeric[:, k] = ((yp - ym) / (2 * eps)).numpy()
    np.testing.assert_allclose(jac, numeric, atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_loss_slip_is_named_from_a_few_runs_of_the_reference(dtype):
    """A loss of 256 × 48 logits with its sign flipped is named a sign at the dtype; the reference's forward runs a
    handful of times, not the 2 × 12288 of finite differences."""
    xs = inputs(dtype=dtype)
    reference = Counted(mean_cross_entropy)
    right = tapegrad.gradcheck(make_cross_entropy(), xs, reference=reference, seed=0)
    assert right.passed, right
    reference.runs = 0
    report = tapegrad.gradcheck(make_cross_entropy("sign"), xs, reference=reference, seed=0)
    assert not report.passed, report
    assert "sign" in report.kinds, report
    assert reference.runs < 100, reference.runs
