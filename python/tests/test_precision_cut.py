"""At a low precision and at size, each failing input is named on the cut of the op along y's axes that its own full
Jacobian fits, where no cut fits every input (tapegrad/_cut.py, fitting_cut): a weight with none of y's axes, whose
Jacobian grows with y's rows however few are kept, no longer keeps the others from theirs. And the naming runs the
op at float32 only where the error is small enough to be a value kept at the low precision."""

import torch

import tapegrad


def linear(slip=None):
    """y = x·w as a Function with a bf16 path of its own (float32 inside), its slip on that path only, so that the
    float64 check of the same Function, which names a slip of every precision, passes; and the dtypes its forward
    ran at."""
    seen = []

    class Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            seen.append(x.dtype)
            ctx.save_for_backward(x, w)
            return (x.float() @ w.float()).to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            at_bf16 = x.dtype == torch.bfloat16
            w_t = w.float() if at_bf16 and slip == "x_transposed" else w.float().t()
            gw = x.float().t() @ g.float()
            if at_bf16 and slip == "w_not_linear":  # no structure: a term of |ȳ|
                gw = gw + 0.3 * (x.float().t() ** 2 @ g.float().abs())
            return (g.float() @ w_t).to(x.dtype), gw.to(w.dtype)
    return Linear.apply, seen


def reference(x, w):
    return x @ w


def inputs(rows=1024, d=128):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d, generator=gen, dtype=torch.float64).to(torch.bfloat16).requires_grad_()
    w = (torch.randn(d, d, generator=gen, dtype=torch.float64) / d ** 0.5).to(torch.bfloat16).requires_grad_()
    return x, w


def test_the_slips_exist_at_bf16_only():
    x, w = inputs(rows=8, d=16)
    for slip in ("x_transposed", "w_not_linear"):
        fn, _ = linear(slip)
        assert tapegrad.gradcheck(fn, (x.detach().double().requires_grad_(), w.detach().double().requires_grad_()))\
            .passed


def test_an_input_is_named_on_its_cut_where_a_weight_fits_none():
    fn, _ = linear("x_transposed")
    report = tapegrad.gradcheck(fn, inputs(), reference=reference)
    assert not report.passed
    (d,) = [d for d in report.diagnoses if d.input == "x"]
    assert d.kind == "transposed_jacobian", report
    # the weight's 16384 elements beside 128 outputs of a row already pass the cut's 131072 entries: x's cut is its own
    assert d.message.startswith("on the first 2 of 1024 along y's axis 0 (a full Jacobian there)"), report
    assert [c.passed for c in report.checks if c.input == "w" and c.check == "vjp bf16"] == [True], report


def test_an_input_no_cut_fits_is_told_so_in_gradchecks_terms_without_a_run_at_float32():
    fn, seen = linear("w_not_linear")
    report = tapegrad.gradcheck(fn, inputs(), reference=reference)
    (d,) = [d for d in report.diagnoses if d.input == "w"]
    assert d.kind == "unexplained", report
    assert "(131072 × 16384 Jacobian entries, above the 40000 that gradcheck takes in full by default)" in d.message
    assert "full_jacobian_limit" not in str(report)
    # its error is hundreds of units of bf16's roundoff: no value kept at bf16, so the op is not run at float32 to
    # see whether the error shrinks with the precision
    assert torch.float32 not in seen and torch.bfloat16 in seen


def test_the_right_version_passes():
    fn, _ = linear()
    assert tapegrad.gradcheck(fn, inputs(), reference=reference).passed
