"""What torch.autograd.gradcheck checks, tapegrad checks too, with no false failure on a right backward: the backward
at ȳ = 0, several outputs, 0-d inputs, integer inputs, @once_differentiable at order 2, keyword arguments, modules,
lambdas and partials; and the report says once, in Python terms, what it did not check."""

import functools

import pytest
import torch
from torch.autograd.function import once_differentiable

import tapegrad


def randn(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


class Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


# 1. The backward at ȳ = 0 (torch's check_undefined_grad).

class SumOfSquares(torch.autograd.Function):
    """A loss whose backward ignores grad_output: right for ȳ = 1 only."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x * x).sum()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x


class Unmaterialized(torch.autograd.Function):
    """Two outputs; with set_materialize_grads(False) an unused output's gradient arrives as None."""

    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x.sin(), x.cos()

    @staticmethod
    def backward(ctx, gs, gc):
        (x,) = ctx.saved_tensors
        return gs * x.cos() - gc * x.sin()  # crashes on None


class UnmaterializedRight(Unmaterialized):
    @staticmethod
    def backward(ctx, gs, gc):
        (x,) = ctx.saved_tensors
        dx = torch.zeros_like(x)
        if gs is not None:
            dx = dx + gs * x.cos()
        if gc is not None:
            dx = dx - gc * x.sin()
        return dx


def test_a_backward_that_ignores_grad_output_fails_the_zero_cotangent_row():
    report = tapegrad.gradcheck(SumOfSquares.apply, (randn(3, 4),))
    assert not report
    row = [c for c in report.checks if c.check == "zero ȳ"][0]
    assert row.input == "x" and not row.passed and row.max_abs_err > 0
    # x̄ at ȳ = 0 against the 0 it must be: no finite difference is compared, and the row says so
    assert (row.analytic_is, row.numeric_is) == ("x̄", "expected")
    assert f"(x̄ {row.analytic:.6g}, expected 0)" in str(report), report
    assert report.has("nonlinear", "x"), report
    assert "x̄ is not 0 at ȳ = 0" in str(report)


class UnmaterializedOne(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * x.cos()  # crashes on None


def test_a_backward_that_crashes_on_an_undefined_gradient_fails_and_says_why():
    report = tapegrad.gradcheck(UnmaterializedOne.apply, (randn(5),))
    assert not report
    assert [(c.input, c.passed) for c in report.checks if c.check == "zero ȳ"] == [("all", False)]
    assert "zero ȳ: the backward raised TypeError: unsupported operand" in str(report), report
    with pytest.raises(RuntimeError, match=r"the backward raised TypeError: .*, called with a gradient for output 0 "
                                           r"alone \(the others' are undefined"):
        tapegrad.gradcheck(Unmaterialized.apply, (randn(5),))
    assert tapegrad.gradcheck(UnmaterializedRight.apply, (randn(5),)), "a right backward passes"


def test_a_right_backward_has_zero_cotangent_rows_that_pass():
    report = tapegrad.gradcheck(Square.apply, (randn(3),))
    assert report, report
    assert [c.input for c in report.checks if c.check == "zero ȳ"] == ["x"]


# 2. Several outputs.

class SinCos(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x.sin() * w, x.cos()

    @staticmethod
    def backward(ctx, gs, gc):
        x, w = ctx.saved_tensors
        return gs * w * x.cos() - gc * x.sin(), (gs * x.sin()).sum(0)


class SinCosMixed(SinCos):
    """Mixes the outputs' gradients: right for each output alone, wrong once both are seeded."""

    @staticmethod
    def backward(ctx, gs, gc):
        x, w = ctx.saved_tensors
        return gs * w * x.cos() - gc * x.sin() + gs * gc, (gs * x.sin()).sum(0)


class SinCosSwapped(SinCos):
    @staticmethod
    def backward(ctx, gs, gc):
        x, w = ctx.saved_tensors
        return gc * w * x.cos() - gs * x.sin(), (gs * x.sin()).sum(0)


def test_several_outputs_are_checked_each_and_together():
    report = tapegrad.gradcheck(SinCos.apply, (randn(3, 4), randn(4)))
    assert report, report
    inputs = {c.input for c in report.checks}
    assert {"x→y0", "x→y1", "x→all", "w→y0", "w→y1", "w→all", "x", "w"} <= inputs, inputs
    swapped = tapegrad.gradcheck(SinCosSwapped.apply, (randn(3, 4), randn(4)))
    assert not swapped
    assert {c.input for c in swapped.checks if not c.passed} >= {"x→y0", "x→y1"}


def test_a_backward_that_mixes_the_outputs_fails_only_when_they_are_seeded_together():
    report = tapegrad.gradcheck(SinCosMixed.apply, (randn(3, 4), randn(4)))
    assert not report
    failed = {c.input for c in report.checks if not c.passed}
    assert failed == {"x→all"}, report


def test_the_trace_follows_the_output_checked():
    """dK transposed inside a Function of two outputs is still named from its traced backward."""
    class Gram(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a @ b, a.sum(-1)

        @staticmethod
        def backward(ctx, g, gs):
            a, b = ctx.saved_tensors
            d_a = g @ b.transpose(-2, -1) + gs.unsqueeze(-1) * torch.ones_like(a)
            d_b = a @ g  # a.transpose(-2, -1) @ g is right
            return d_a, d_b

    report = tapegrad.gradcheck(Gram.apply, (randn(4, 4), randn(4, 4)))
    assert not report
    assert report.has("transposed_term", "b→y0") or report.has("transposed_jacobian", "b→y0") or \
        any(d.input == "b→y0" for d in report.diagnoses), report


# 3. 0-d inputs stay 0-d.

class ScaleBy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, beta):
        assert beta.dim() == 0, beta.shape  # the user's code sees the 0-d tensor it was given
        ctx.save_for_backward(x, beta)
        return x * beta

    @staticmethod
    def backward(ctx, g):
        x, beta = ctx.saved_tensors
        return g * beta, (g * x).sum()


def test_a_0d_parameter_reaches_the_op_as_0d_and_its_0d_gradient_passes():
    beta = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    report = tapegrad.gradcheck(ScaleBy.apply, (randn(3, 4), beta))
    assert report, report
    assert {c.input for c in report.checks} == {"x", "beta"}
    assert tapegrad.gradcheck(ScaleBy.apply, (randn(3, 4), beta), order=2), "second order too"


# 4. Integer and bool inputs.

class PickLoss(torch.autograd.Function):
    """A cross-entropy on logits with integer targets."""

    @staticmethod
    def forward(ctx, logits, targets):
        assert targets.dtype == torch.int64  # passed through unchanged
        p = logits.softmax(-1)
        ctx.save_for_backward(p, targets)
        return -(p.log().gather(-1, targets[:, None])).sum()

    @staticmethod
    def backward(ctx, g):
        p, targets = ctx.saved_tensors
        d = p.clone()
        d[torch.arange(len(targets)), targets] -= 1
        return g * d, None


def test_integer_targets_pass_through_and_a_checked_integer_input_is_refused():
    logits, targets = randn(4, 5), torch.tensor([0, 3, 1, 4])
    assert tapegrad.gradcheck(PickLoss.apply, (logits, targets))
    with pytest.raises(ValueError, match=r"input 1 has dtype torch.int64; a checked input must be floating-point"):
        tapegrad.gradcheck(PickLoss.apply, (logits, targets), inputs_to_check=[0, 1])
    with pytest.raises(ValueError, match=r"input 0 has dtype torch.bool"):
        tapegrad.gradcheck(lambda m: m.double() * 2, (torch.tensor([True, False]),), inputs_to_check=[0])


# 5. @once_differentiable at order 2.

class SquareOnce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return 2 * x * g


def test_once_differentiable_is_not_checked_at_order_2_with_its_reason():
    x = randn(3, 4)
    assert tapegrad.gradcheck(SquareOnce.apply, (x,)), "first order is checked as usual"
    report = tapegrad.gradcheck(SquareOnce.apply, (x,), order=2)
    assert not report.passed
    text = str(report)
    assert text.startswith("SquareOnce: NOT CHECKED: "), text
    assert "the backward is marked once_differentiable: its second order cannot be checked" in text
    assert all(c.skipped for c in report.checks) and not report.diagnoses


# 6. Keyword arguments, modules, lambdas, partials.

class Affine(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w, shift):
        ctx.save_for_backward(x, w)
        return x @ w + shift

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w.T, x.T @ g, None


def test_keyword_arguments_are_passed_on_every_call():
    def op(x, w, *, shift, scale=1.0):
        return Affine.apply(x, w, shift) * scale
    report = tapegrad.gradcheck(op, (randn(3, 4), randn(4, 2)), kwargs={"shift": 0.5, "scale": 2.0})
    assert report, report
    assert report.op == "Affine" and {c.input for c in report.checks} == {"x", "w"}
    with pytest.raises(ValueError, match="kwargs must be a dict"):
        tapegrad.gradcheck(op, (randn(3, 4), randn(4, 2)), kwargs=[1])


def test_lambdas_and_partials_keep_the_functions_name_and_input_names():
    x, w = randn(3, 4), randn(4, 2)
    named = tapegrad.gradcheck(lambda *a: Affine.apply(*a, 0.5), (x, w))
    assert named.op == "Affine" and {c.input for c in named.checks} == {"x", "w"}, named
    own = tapegrad.gradcheck(lambda a, b: Affine.apply(a, b, 0.5), (x, w))
    assert own.op == "Affine" and {c.input for c in own.checks} == {"a", "b"}, own
    partial = tapegrad.gradcheck(functools.partial(Affine.apply, x.detach()), (w, 0.5))
    assert partial.op == "Affine" and {c.input for c in partial.checks} == {"w"}, partial


def test_the_trace_runs_through_a_lambda():
    from attention_gradient import inputs, make_attention
    attention = make_attention("transposed_dK")
    report = tapegrad.gradcheck(lambda *qkv: attention.apply(*qkv), inputs())
    assert report.has("transposed_term", "k"), report


class Scaled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(4, 3, dtype=torch.float64))
        self.gain = torch.nn.Parameter(torch.tensor(0.7, dtype=torch.float64))

    def forward(self, inp):
        return torch.tanh(inp @ self.weight) * self.gain


def test_a_modules_parameters_are_checked_with_params_true():
    module = Scaled()
    report = tapegrad.gradcheck(module, (randn(2, 4),), params=True)
    assert report, report
    assert report.op == "Scaled"
    assert {c.input for c in report.checks} == {"inp", "weight", "gain"}
    only_params = tapegrad.gradcheck(module, (torch.randn(2, 4, dtype=torch.float64),), params=True)
    assert {c.input for c in only_params.checks} == {"weight", "gain"}
    assert {c.input for c in tapegrad.gradcheck(module, (randn(2, 4),)).checks} == {"inp"}
    with pytest.raises(ValueError, match="params=True checks a torch.nn.Module"):
        tapegrad.gradcheck(Square.apply, (randn(3),), params=True)


# 7. Quiet where nothing is wrong.

def test_a_function_without_jvp_is_said_once_in_the_header():
    report = tapegrad.gradcheck(Square.apply, (randn(3),))
    assert report and not report.diagnoses, report
    lines = str(report).splitlines()
    assert lines[1] == "  forward mode: not written (the Function has no jvp): the jvp and adjoint rows are skipped"
    assert "no_jvp" not in str(report) and "[no JVP]" not in str(report)


def test_the_kink_advice_is_in_python_terms():
    x = torch.tensor([[0.0, 1.0, -1.0]], dtype=torch.float64, requires_grad=True)
    report = tapegrad.gradcheck(torch.relu, (x,))
    assert report.has("kink"), report
    assert "Fill::" not in str(report) and "x = x + 0.2 * x.sign()" in str(report)


# 8. An intermediate saved in forward is a constant to double backward.

class Softplus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        t = torch.sigmoid(x)
        ctx.save_for_backward(t)  # an intermediate: double backward holds it constant
        return torch.log1p(torch.exp(x))

    @staticmethod
    def backward(ctx, g):
        (t,) = ctx.saved_tensors
        return g * t


class SoftplusRight(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.log1p(torch.exp(x))

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * torch.sigmoid(x)


class SoftplusOnCtx(Softplus):
    @staticmethod
    def forward(ctx, x):
        ctx.s = torch.sigmoid(x)
        return torch.log1p(torch.exp(x))

    @staticmethod
    def backward(ctx, g):
        return g * ctx.s


def test_a_saved_intermediate_is_named_when_second_order_fails():
    x = randn(3, 4)
    assert tapegrad.gradcheck(Softplus.apply, (x,)), "first order is right"
    assert tapegrad.gradcheck(SoftplusRight.apply, (x,), order=2)
    for op, value in ((Softplus, "t"), (SoftplusOnCtx, "s")):
        report = tapegrad.gradcheck(op.apply, (x,), order=2)
        assert not report
        text = str(report)
        assert f"`{value}` was saved in forward (test_torch_parity.py:" in text, text
        assert "is a constant to double backward: save the inputs and recompute it in backward" in text
        assert any(d.kind == "saved_in_forward" for d in report.diagnoses), text


class _LayerNormVarianceSlip(torch.autograd.Function):
    """x̂ = (x − μ)/σ per row, whose backward divides by the variance where σ belongs: each row's gradient is off by
    its own constant ratio 1/σ_r."""

    @staticmethod
    def forward(ctx, x):
        centred = x - x.mean(-1, keepdim=True)
        variance = (centred * centred).mean(-1, keepdim=True) + 1e-5
        xh = centred / torch.sqrt(variance)
        ctx.save_for_backward(xh, variance)
        return xh

    @staticmethod
    def backward(ctx, g):
        xh, variance = ctx.saved_tensors
        return (g - g.mean(-1, keepdim=True) - xh * (g * xh).mean(-1, keepdim=True)) / variance


@pytest.mark.parametrize("shape", [(3, 5), (4, 6), (8, 16)])
def test_a_per_row_ratio_is_named_at_every_shape(shape):
    torch.manual_seed(0)
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    report = tapegrad.gradcheck(_LayerNormVarianceSlip.apply, (x,))
    assert not report.passed
    assert report.has("per_row_factor", "x"), report
