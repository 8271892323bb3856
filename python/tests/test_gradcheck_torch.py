"""tapegrad.gradcheck on torch ops: correct ops pass, each planted slip is named by the C++ checker's kind."""

import numpy as np
import pytest
import torch

import tapegrad
from attention_gradient import SLIPS as ATTENTION_SLIPS, inputs as attention_inputs, make_attention
from slips import CORRECT, SLIPS, random_inputs


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_op_passes(name):
    op, shapes = CORRECT[name]
    report = tapegrad.gradcheck(op, random_inputs(shapes))
    assert report, report
    assert report.diagnoses == []  # a Function without jvp: a line under the title, not a diagnosis
    assert "forward mode: not written (the Function has no jvp)" in str(report)


@pytest.mark.parametrize("slip", sorted(SLIPS))
def test_a_planted_slip_is_named(slip):
    op, shapes, kind, input_name = SLIPS[slip]
    report = tapegrad.gradcheck(op, random_inputs(shapes))
    assert not report
    assert report.has(kind, input_name), report


def test_torch_builtins_are_checked_in_both_modes():
    x = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    report = tapegrad.gradcheck(lambda t: torch.tanh(t) @ t.T, (x,))
    assert report, report
    rows = {(c.input, c.check) for c in report.checks if not c.skipped}
    assert ("t", "vjp") in rows and ("t", "jvp") in rows  # forward-mode AD ran: nothing skipped


def test_a_function_without_jvp_gets_a_forward_mode_line_not_a_failure():
    op, shapes = CORRECT["sin"]
    report = tapegrad.gradcheck(op, random_inputs(shapes))
    assert report.passed
    assert [c for c in report.checks if c.check == "jvp"][0].skipped
    assert "forward mode: not written" in str(report) and not report.has("no_jvp")


def test_attention_passes_and_each_slip_is_named():
    assert tapegrad.gradcheck(make_attention().apply, attention_inputs())
    # dK = Ω·Q for Ωᵀ·Q transposes an intermediate (n, n), not an axis of k or of y: no kind of the Jacobian fits
    # it; the backward traced into formulas, one transpose put around Ω puts it right (transposed_term).
    expected = {"transposed_dK": ("transposed_term", "k"), "no_row_term": ("per_row_term", "q"),
                "no_scale_dQ": ("scale", "q")}
    assert set(expected) == set(ATTENTION_SLIPS)
    for slip, (kind, input_name) in expected.items():
        report = tapegrad.gradcheck(make_attention(slip).apply, attention_inputs())
        assert not report, slip
        assert report.has(kind, input_name), f"{slip}: expected {kind} for {input_name}\n{report}"
    transposed = tapegrad.gradcheck(make_attention("transposed_dK").apply, attention_inputs())
    assert transposed.has("one_input", "k") and not transposed.has("unexplained")
    message = [d for d in transposed.diagnoses if d.kind == "transposed_term"][0].message
    # the value by its name in the backward, the lines that make it and read it, the formula before and after
    assert "once `d_s` (8, 8), made at attention_gradient.py:" in message, message
    assert "matmul(d_s, q) * 0.25 → matmul(transpose(d_s), q) * 0.25" in message, message


def test_the_scale_slip_names_its_factor():
    report = tapegrad.gradcheck(make_attention("no_scale_dQ").apply, attention_inputs(d=16))
    scale = [d for d in report.diagnoses if d.kind == "scale"][0]
    assert "4" in scale.message, scale.message  # √16


def test_report_rows_names_and_options():
    q, k, v = attention_inputs(n=4, d=4)
    report = tapegrad.gradcheck(make_attention().apply, (q, k, v), fast_mode=True, atol=1e-6, rtol=1e-4)
    assert report
    assert {c.input for c in report.checks} == {"q", "k", "v"}
    assert {c.mode for c in report.checks if c.check == "vjp"} == {"fast"}
    checked = tapegrad.gradcheck(make_attention().apply, (q, k.detach(), v.detach()))
    assert {c.input for c in checked.checks} == {"q"}  # as torch: the inputs that require grad
    named = tapegrad.gradcheck(make_attention().apply, (q, k, v), names=["Q", "K", "V"], inputs_to_check=[2])
    assert {c.input for c in named.checks} == {"V"}


def test_float32_inputs_are_checked_in_float64():
    x = torch.randn(3, 4, dtype=torch.float32, requires_grad=True)
    assert tapegrad.gradcheck(torch.sin, (x,))
    assert tapegrad.gradcheck(np.sin, (x.detach().numpy(),), vjp=lambda g, x: g * np.cos(x))


def test_raise_exception_raises_with_the_report():
    op, shapes, _, _ = SLIPS["sign"]
    with pytest.raises(tapegrad.GradcheckError) as caught:
        tapegrad.gradcheck(op, random_inputs(shapes), raise_exception=True)
    assert "[sign]" in str(caught.value)
    assert not caught.value.report.passed


def test_advice_at_size_is_in_gradchecks_own_arguments():
    # A slip at a size checked by projections, with nothing to cut: the advice names fast_mode, which gradcheck
    # takes, not the C++ option full_jacobian_limit.
    class SumOfSquares(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return (x * x).sum()

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return (2 * x + 0.1 * x.roll(1)) * g  # a term of the neighbour: a slip with no name at this size

    report = tapegrad.gradcheck(SumOfSquares.apply, (torch.randn(50000, dtype=torch.float64),))
    assert not report.passed
    text = str(report)
    assert "full_jacobian_limit" not in text, text
    assert "above the 40000 that gradcheck takes in full by default" in text, text
    assert "or pass fast_mode=False (a full Jacobian of 50000 entries)" in text, text


class _RoundSTE(torch.autograd.Function):
    """Quantizes to quarters; its backward passes ȳ through (times `scale`, 1 when right)."""
    scale = 1.0

    @staticmethod
    def forward(ctx, x):
        return torch.round(x * 4) / 4

    @staticmethod
    def backward(ctx, g):
        return g * _RoundSTE.scale


def test_a_straight_through_estimator_is_checked_against_the_surrogate_it_declares(monkeypatch):
    x = torch.randn(5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    assert not tapegrad.gradcheck(_RoundSTE.apply, (x,)).passed  # against its own forward: round′ = 0 or a jump

    def identity(x):
        return x
    report = tapegrad.gradcheck(_RoundSTE.apply, (x,), surrogate=identity)
    assert report.passed, report
    assert "backward is checked as the derivative of identity, as it declares" in str(report)
    # and the docs' example prints that line
    assert str(report).splitlines()[1].strip().startswith("surrogate: _RoundSTE's backward")
    monkeypatch.setattr(_RoundSTE, "scale", 4.0)
    wrong = tapegrad.gradcheck(_RoundSTE.apply, (x,), surrogate=identity)
    assert not wrong.passed and [d.kind for d in wrong.diagnoses] == ["scale"], wrong
    assert wrong.diagnoses[0].factor == pytest.approx(4.0)
    # at bf16 the surrogate is the float64 reference too
    xb = x.detach().to(torch.bfloat16).requires_grad_()
    assert not tapegrad.gradcheck(_RoundSTE.apply, (xb,), surrogate=identity).passed
    monkeypatch.setattr(_RoundSTE, "scale", 1.0)
    assert tapegrad.gradcheck(_RoundSTE.apply, (xb,), surrogate=identity).passed


def test_surrogate_is_refused_where_it_has_no_meaning():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="surrogate="):
        tapegrad.gradcheck(_RoundSTE.apply, (x,), surrogate=lambda x: x, order=2)
    with pytest.raises(ValueError, match="surrogate="):
        tapegrad.gradcheck(_RoundSTE.apply, (x,), surrogate="x")
    with pytest.raises(ValueError, match="no output of fn requires grad"):
        tapegrad.gradcheck(lambda x: x.detach() * 2, (x,), surrogate=lambda x: x)


def test_at_size_one_backward_per_cotangent_serves_every_input():
    """Random projections share their cotangents ȳ across the inputs: one backward gives every input's x̄, so checking
    three inputs takes no more backwards than checking one (only the forwards of the differences are per input)."""
    backwards = []

    class Fma(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b, c):
            ctx.save_for_backward(a, b)
            return a * b + c

        @staticmethod
        def backward(ctx, g):
            backwards.append(1)
            a, b = ctx.saved_tensors
            return g * b, g * a, g

    xs = [torch.randn(300, 200, dtype=torch.float64, generator=torch.Generator().manual_seed(k), requires_grad=True)
          for k in range(3)]
    counts = {}
    for checked in ([0], [0, 1, 2]):
        backwards.clear()
        report = tapegrad.gradcheck(Fma.apply, xs, inputs_to_check=checked)
        assert report.passed and all(row.mode == "fast" for row in report.checks if row.check == "vjp"), report
        counts[len(checked)] = len(backwards)
    assert counts[3] == counts[1], counts


class _ScaledRelu(torch.autograd.Function):
    """relu, its backward times k (k = 1: right)."""

    @staticmethod
    def forward(ctx, h, k):
        ctx.save_for_backward(h)
        ctx.k = k
        return h.clamp_min(0)

    @staticmethod
    def backward(ctx, g):
        h, = ctx.saved_tensors
        return g * (h > 0) * ctx.k, None


def _near_a_kink(seed, offset):
    """x (16, 64) and w (64, 128) where the pre-activation (x @ w)[0, 0] is `offset`: a step of ε = 1e-6 along a
    random direction moves it by about 1e-5, so most directions cross relu's kink there at offset 1e-5."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(16, 64, dtype=torch.float64, generator=generator)
    w = torch.randn(64, 128, dtype=torch.float64, generator=generator)
    w[0, 0] -= ((x @ w)[0, 0] - offset) / x[0, 0]
    return x.requires_grad_(), w.requires_grad_()


def test_at_size_a_direction_whose_step_crosses_a_kink_is_drawn_again():
    """A point 1e-5 from a relu's kink is differentiable, but a random direction's step of ε crosses the kink and its
    central difference averages two slopes: such a direction says nothing of the rule and another is drawn. A right
    rule passes (or, where every direction drawn crosses, is told it sits at a kink); a rule 5% off fails."""
    passed = 0
    for seed in range(6):
        xs = _near_a_kink(seed, 1e-5)
        right = tapegrad.gradcheck(lambda x, w: _ScaledRelu.apply(x @ w, 1.0), xs, fast_mode=True)
        assert right.passed or "kink" in right.kinds, right
        passed += right.passed
        slip = tapegrad.gradcheck(lambda x, w: _ScaledRelu.apply(x @ w, 1.05), xs, fast_mode=True)
        assert not slip.passed and "kink" not in slip.kinds, slip
    assert passed >= 5


def test_at_size_a_point_on_a_kink_is_named_a_kink():
    xs = _near_a_kink(0, 0.0)
    report = tapegrad.gradcheck(lambda x, w: _ScaledRelu.apply(x @ w, 1.0), xs, fast_mode=True)
    assert not report.passed
    kink = next(d for d in report.diagnoses if d.kind == "kink")
    assert "crosses a kink" in kink.message and "says nothing of the rule" in kink.message, report


class _Temperature(torch.autograd.Function):
    """softmax(x/τ) for a 0-d τ, its backward returning dτ per element of x (summed: `summed=True`)."""

    @staticmethod
    def forward(ctx, x, tau, summed):
        ctx.save_for_backward(x, tau)
        ctx.summed = summed
        return torch.softmax(x / tau, -1)

    @staticmethod
    def backward(ctx, g):
        x, tau = ctx.saved_tensors
        y = torch.softmax(x / tau, -1)
        dz = y * (g - (y * g).sum(-1, keepdim=True))
        dtau = -dz * x / tau ** 2
        return dz / tau, dtau.sum() if ctx.summed else dtau, None


@pytest.mark.parametrize("summed", [True, False])
def test_a_gradient_torch_sums_down_to_its_input_s_shape_is_noted(summed):
    """torch sums a dτ of x's shape down to τ's shape before the check sees it: the check passes on that sum, and one
    line says that the backward left the sum to torch."""
    x = torch.randn(2, 4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    tau = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    report = tapegrad.gradcheck(_Temperature.apply, (x, tau, summed))
    assert report.passed, report
    note = "tau: the backward returns x̄ of shape (2, 4, 5) for an input of shape (); torch sums it down"
    assert (note in str(report)) == (not summed), report


def causal_conv(slip=None):
    """y[b, t] = Σ_u w[u]·x[b, t − u], x padded with k − 1 zeros on the left (a causal convolution)."""

    class CausalConv(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            taps, steps = w.shape[0], x.shape[-1]
            padded = torch.nn.functional.pad(x, (taps - 1, 0))
            ctx.save_for_backward(padded, w)
            return sum(w[u] * padded[:, taps - 1 - u:taps - 1 - u + steps] for u in range(taps))

        @staticmethod
        def backward(ctx, g):
            padded, w = ctx.saved_tensors
            taps, steps = w.shape[0], g.shape[-1]
            gp = torch.zeros_like(padded)  # the gradient of the padded input, then cut to x's steps
            for u in range(taps):
                gp[:, taps - 1 - u:taps - 1 - u + steps] += w[u] * g
            start = taps - 2 if slip == "cut_one_early" else taps - 1
            gw = torch.stack([(g * padded[:, taps - 1 - u:taps - 1 - u + steps]).sum() for u in range(taps)])
            return gp[:, start:start + steps], gw

    return CausalConv


def test_a_gradient_cut_from_its_padded_buffer_one_place_off_is_a_shift():
    """x̄ moved by one step along x's axis, the first step reading the padding's gradient: named a shift (the
    element nothing moved into left free), where the strict shift (0 there) does not fit."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 7, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(3, dtype=torch.float64, generator=gen, requires_grad=True)
    assert tapegrad.gradcheck(causal_conv().apply, (x, w))
    report = tapegrad.gradcheck(causal_conv("cut_one_early").apply, (x, w))
    assert report.has("shifted", "x") and not report.has("unexplained", "x"), report
    message = next(d.message for d in report.diagnoses if d.kind == "shifted")
    assert "axis 1 of x (2, 7) moved by +1, at every element but those at the edge nothing moved into" in message
    from tapegrad._gradcheck import EDGE_LEFT_FREE
    assert EDGE_LEFT_FREE in message  # the words by which the Python side knows this pass's finding


def test_a_term_the_forward_names_takes_the_place_of_a_shift_with_its_edge_left_free():
    """A scan whose decay's gradient reads h_t where h_(t−1) belongs is also x̄ moved one step with its edge free; the
    forward's terms name which value it reads, and that name alone is given."""
    import researcher_ops
    report = tapegrad.gradcheck(researcher_ops.make("ema_scan", "da_uses_h_t").apply,
                                researcher_ops.inputs("ema_scan", "small"))
    assert report.has("wrong_value") and not report.has("shifted"), report
