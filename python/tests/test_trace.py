"""A Function's backward traced into formulas (tapegrad/_trace.py) for the checker's edit search."""

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad._trace import vjp_formulas
from attention_gradient import inputs as attention_inputs, make_attention


def gram(slip=None):
    """y = x·xᵀ, x̄ = (ȳ + ȳᵀ)·x; slip "no_transpose": x̄ = ȳ·x + ȳ·x; slip "cumsum": a term through an op the
    formula language lacks."""

    class Gram(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x @ x.t()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            if slip == "cumsum":
                return g @ x + g @ x + torch.cumsum(x, 0) * 0
            ones = torch.ones_like(x)  # a constant: its values depend on neither x nor ȳ
            g_t = g if slip == "no_transpose" else g.t()
            d = g @ x
            d.mul_(ones)  # in place, recorded as a new value
            return d + g_t @ x

    return Gram


def test_the_right_attention_backward_becomes_formulas_named_as_in_the_code():
    q, k, v = (x.detach() for x in attention_inputs(n=4, d=4))
    fn = make_attention()
    g = np.random.default_rng(0).standard_normal((4, 4))
    traced = vjp_formulas(fn, (q, k, v), [0, 1, 2], ["q", "k", "v"], [q.numpy(), k.numpy(), v.numpy()], g)
    names = [name for name, _, _ in traced["lets"]]
    assert "d_s" in names and "p" in names, traced["lets"]
    assert traced["vjp"][1] == "d_k" or "transpose(d_s)" in dict((n, f) for n, f, _ in traced["lets"])["d_k"]
    labels = [label for _, _, label in traced["lets"]]
    assert all(label.startswith("attention_gradient.py:") for label in labels), labels
    assert traced["constants"] == {}


def test_a_missing_transpose_of_the_cotangent_is_named_with_constants_and_in_place_ops_traced():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert tapegrad.gradcheck(gram().apply, (x,))
    report = tapegrad.gradcheck(gram("no_transpose").apply, (x,))
    assert report.has("transposed_term", "x") and not report.has("unexplained"), report
    message = [d for d in report.diagnoses if d.kind == "transposed_term"][0].message
    assert "`g` (4, 4) is transposed" in message, message


def test_a_backward_through_an_op_the_formulas_lack_keeps_no_known_kind():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    report = tapegrad.gradcheck(gram("cumsum").apply, (x,))
    assert report.has("unexplained", "x") and not report.has("transposed_term"), report
    traced = vjp_formulas(gram("cumsum"), (x.detach(),), [0], ["x"], [x.detach().numpy()], np.ones((4, 4)))
    assert traced is None


def test_names_that_are_not_identifiers_are_not_traced_and_the_check_still_runs():
    q, k, v = attention_inputs(n=4, d=4)
    report = tapegrad.gradcheck(make_attention("transposed_dK").apply, (q, k, v), names=["Q[0]", "K[0]", "V[0]"])
    assert report.has("unexplained", "K[0]") and not report.has("transposed_term"), report


@pytest.mark.parametrize("shape", [(2, 5, 4), (2, 2, 5, 4)])
@pytest.mark.parametrize("saved_p", [False, True])
def test_batched_attention_dk_slip_is_named_through_torch_matmuls_reshapes(shape, saved_p):
    gen = torch.Generator().manual_seed(1)
    xs = tuple(torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    report = tapegrad.gradcheck(make_attention("transposed_dK", saved_p=saved_p).apply, xs)
    assert report.has("transposed_term", "k") and not report.has("unexplained"), report


def test_a_bias_gradient_summed_over_the_leading_axis_is_traced():
    from slips import SLIPS, random_inputs
    op, shapes, _, _ = SLIPS["term_sign"]
    xs = [x.detach() for x in random_inputs(shapes)]
    traced = vjp_formulas(op.__self__, tuple(xs), [0, 1, 2], ["x", "w", "b"], [x.numpy() for x in xs],
                          np.ones((4, 3)))
    assert traced is not None and traced["vjp"][2] is not None, traced
    assert "sum(g, -2)" in traced["vjp"][2] or any("sum(g, -2)" in f for _, f, _ in traced["lets"]), traced
