"""An op checked at its own precision (tapegrad/_precision.py), on the CPU: a right op passes at bf16 and float32
with no tolerance given, a slip of the 16-bit path alone fails there and is named, a sum kept at bf16 is named a
precision defect, and a float64 forward that rounds inside (tapegrad/_rounds_inside.py) no longer fails for noise."""

import math
import re

import numpy as np
import pytest
import torch

import tapegrad
from conftest import SOURCE_DIR
from low_precision import REFERENCE, inputs, make_affine


def precision_rows(report):
    return [c for c in report.checks if c.check.startswith(("vjp ", "forward "))]


def drawn(shapes, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, dtype=torch.float64, generator=g).to(dtype).requires_grad_() for s in shapes)


def test_a_right_op_passes_at_bf16_and_float32_and_the_report_says_what_was_compared():
    for dtype in (torch.bfloat16, torch.float32):
        report = tapegrad.gradcheck(make_affine().apply, inputs(rows=64, dtype=dtype))
        assert report.passed, report
        rows = precision_rows(report)
        assert {c.input for c in rows} == {"x", "g", "b", "y"}
        name = {torch.bfloat16: "bf16", torch.float32: "float32"}[dtype]
        assert all(c.check.endswith(name) and c.passed and math.isfinite(c.max_abs_err) for c in rows), report
        assert any(c.max_abs_err > 0 for c in rows), report  # rounding was there to measure
        text = str(report)
        assert f"affine at {name}" in text and "rounding at" in text and "explains up to" in text
        # no reference given: fn itself is checked in float64 against finite differences in the same report
        assert any(c.check == "vjp" and c.passed for c in report.checks)


@pytest.mark.parametrize("fn,shapes", [
    (lambda x: x * torch.sigmoid(x), [(16, 32)]),
    (lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b), [(8, 64), (64,), (64,)]),
    (lambda x: torch.nn.functional.gelu(x), [(16, 32)]),
    (lambda x: torch.log_softmax(x, -1).sum(), [(8, 32)]),
    (lambda x, w1, w2: torch.relu(x @ w1) @ w2, [(16, 64), (64, 128), (128, 32)]),
], ids=["silu", "layer_norm", "gelu", "log_softmax_sum", "mlp"])
def test_right_composite_ops_pass_at_bf16_and_float32_at_every_seed(fn, shapes):
    for dtype in (torch.bfloat16, torch.float32):
        for seed in range(4):
            report = tapegrad.gradcheck(fn, drawn(shapes, dtype, seed), seed=seed)
            assert report.passed, report


def test_a_slip_of_the_16_bit_path_fails_at_bf16_named_a_scale_and_passes_at_float32():
    slipped = make_affine("unscaled").apply
    report = tapegrad.gradcheck(slipped, inputs(rows=64))
    assert not report.passed
    failing = {(c.input, c.check) for c in report.checks if not c.passed}
    assert failing == {("g", "vjp bf16")}, report  # its float64 rows pass: the slip is in the 16-bit path alone
    scale = [d for d in report.diagnoses if d.kind == "scale" and d.input == "g"]
    assert scale and "c = 1024" in scale[0].message, report
    assert tapegrad.gradcheck(slipped, inputs(rows=64, dtype=torch.float32)).passed
    assert tapegrad.gradcheck(slipped, inputs(rows=64, dtype=torch.float64)).passed


def test_a_slip_in_every_precision_fails_its_float64_rows_too():
    class Negated(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.tanh(x)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return -g * (1 - torch.tanh(x) ** 2)

    report = tapegrad.gradcheck(Negated.apply, drawn([(8, 8)], torch.bfloat16, 0))
    assert not report.passed
    # fn in float64 is the reference: its rows against finite differences fail and name the slip, and the report
    # says that the slip is in every precision
    assert {c.check for c in report.checks if not c.passed} == {"vjp"}
    assert "sign" in report.kinds
    assert "the slip is in every precision" in str(report)


def test_a_long_sum_kept_at_bf16_is_a_precision_defect_not_a_slip():
    report = tapegrad.gradcheck(make_affine("accumulate_low").apply, inputs(rows=512), reference=REFERENCE)
    assert not report.passed
    assert {c.input for c in report.checks if not c.passed} == {"g", "b"}, report
    for name in ("g", "b"):
        defect = [d for d in report.diagnoses if d.input == name]
        assert [d.kind for d in defect] == ["precision_defect"], report
        assert "shrinks with the precision" in defect[0].message
    # at float32 the same running sum is float32's, within what rounding at float32 explains
    assert tapegrad.gradcheck(make_affine("accumulate_low").apply, inputs(rows=512, dtype=torch.float32),
                              reference=REFERENCE).passed


def make_attention(slip=None):
    """Attention with a trainable bias whose forward keeps its scores and softmax in float32, as fused kernels do."""

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, b):
            scale = 1.0 / math.sqrt(q.shape[-1])
            p = torch.softmax((q @ k.transpose(-2, -1)).float() * scale + b.float(), dim=-1)
            ctx.save_for_backward(q, k, v, p)
            return p.to(q.dtype) @ v

        @staticmethod
        def backward(ctx, do):
            q, k, v, p = ctx.saved_tensors
            scale = 1.0 / math.sqrt(q.shape[-1])
            dv = p.to(q.dtype).transpose(-2, -1) @ do
            dp = (do @ v.transpose(-2, -1)).float()
            ds = p * (dp - (p * dp).sum(-1, keepdim=True))
            db = p * dp if slip == "db_no_rowsum" else ds
            ds = ds.to(q.dtype)
            dk = ds.transpose(-2, -1) @ q * scale
            if slip == "dk_scale_twice_16bit" and q.dtype in (torch.bfloat16, torch.float16):
                dk = dk * scale
            dq = ds @ k * scale * (1.02 if slip == "dq_two_percent" else 1.0)
            return dq, dk, dv, db.to(q.dtype)
    return Attention


def attention_reference(q, k, v, b):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]) + b, dim=-1) @ v


ATTENTION = [(2, 8, 16), (2, 8, 16), (2, 8, 16), (2, 8, 8)]


def test_attention_against_a_reference_right_and_with_slips_at_bf16():
    right = tapegrad.gradcheck(make_attention().apply, drawn(ATTENTION, torch.bfloat16, 0),
                               reference=attention_reference)
    assert right.passed, right
    assert "against the reference attention_reference in float64" in str(right)
    rowsum = tapegrad.gradcheck(make_attention("db_no_rowsum").apply, drawn(ATTENTION, torch.bfloat16, 0),
                                reference=attention_reference)
    assert {c.input for c in rowsum.checks if not c.passed} == {"b"}
    assert "per_row_term" in rowsum.kinds, rowsum
    twice = make_attention("dk_scale_twice_16bit").apply
    at16 = tapegrad.gradcheck(twice, drawn(ATTENTION, torch.bfloat16, 0), reference=attention_reference)
    assert {c.input for c in at16.checks if not c.passed} == {"k"}
    assert "scale" in at16.kinds, at16
    assert tapegrad.gradcheck(twice, drawn(ATTENTION, torch.float32, 0), reference=attention_reference).passed


def test_a_float64_forward_that_rounds_inside_is_checked_at_the_step_its_rounding_allows():
    x = drawn(ATTENTION, torch.float64, 1)
    report = tapegrad.gradcheck(make_attention().apply, x)
    assert report.passed, report
    assert "rounds inside at about float32" in str(report)
    slipped = tapegrad.gradcheck(make_attention("db_no_rowsum").apply, x)
    assert not slipped.passed and {c.input for c in slipped.checks if not c.passed} == {"b"}, slipped


def test_no_recheck_of_a_forward_that_rounds_inside_passes_a_rule_two_percent_off():
    slipped = tapegrad.gradcheck(make_attention("dq_two_percent").apply, drawn(ATTENTION, torch.float64, 1))
    assert not slipped.passed, slipped
    assert {c.input for c in slipped.checks if not c.passed} == {"q"}, slipped


def make_noisy(noise, factor):
    """y = 2x plus noise from a generator torch's seed does not reach (a dropout-like forward); x̄ = factor·2·ȳ."""
    rng = np.random.default_rng()

    class Noisy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 2 * x + noise * torch.from_numpy(rng.standard_normal(tuple(x.shape)))

        @staticmethod
        def backward(ctx, g):
            return 2 * factor * g
    return Noisy.apply


@pytest.mark.parametrize("noise,factor", [(1e-3, 1.05), (1e-7, 1.001), (1e-7, 1.0)])
def test_a_forward_that_is_not_a_function_is_refused_in_one_line(noise, factor):
    report = tapegrad.gradcheck(make_noisy(noise, factor), drawn([(4, 5)], torch.float64, 0))
    assert not report.passed, report
    assert report.kinds == ["not_a_function"], report
    assert "returns different values at the same input" in report.diagnoses[0].message


@pytest.mark.parametrize("dtype,named", [(torch.float16, "torch.float16"), (torch.bfloat16, "torch.bfloat16")])
def test_a_float64_forward_rounding_at_16_bits_is_sent_to_that_precision(dtype, named):
    class RoundedExp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.exp(x).to(dtype).to(torch.float64)

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * torch.exp(x)

    report = tapegrad.gradcheck(RoundedExp.apply, drawn([(4, 5)], torch.float64, 0))
    assert not report.passed
    assert report.kinds == ["rounds_inside"], report
    assert named in report.diagnoses[0].message, report


def test_a_smooth_float64_forward_is_not_said_to_round_inside():
    report = tapegrad.gradcheck(lambda x: torch.tanh(x) * 3, drawn([(4, 4)], torch.float64, 0), atol=1e-30, rtol=0)
    assert "rounds inside" not in str(report)


def test_precision_errors_are_clear():
    x = inputs(rows=8)
    with pytest.raises(ValueError, match="order=2 runs in float64"):
        tapegrad.gradcheck(make_affine().apply, x, order=2)
    with pytest.raises(ValueError, match="reference= compares an op run below float64"):
        tapegrad.gradcheck(make_affine().apply, inputs(rows=8, dtype=torch.float64), reference=REFERENCE)

    def broken(x, g, b):
        raise ValueError("no such shape")
    with pytest.raises(RuntimeError, match="the reference broken in float64 raised ValueError: no such shape"):
        tapegrad.gradcheck(make_affine().apply, x, reference=broken)
    with pytest.raises(ValueError, match="input 2 has dtype torch.int64"):
        tapegrad.gradcheck(make_affine().apply, (x[0], x[1], torch.ones(16, dtype=torch.int64)),
                           inputs_to_check=[0, 1, 2])


def test_float16_on_the_cpu_where_torch_has_its_kernels():
    """torch 1.13's CPU kernels of float16 are few (no matmul, sigmoid or softmax): an element-wise op that has them
    passes at every seed; an op that cannot run at the dtype is refused with its own reason, naming it and the dtype."""
    for seed in range(4):
        report = tapegrad.gradcheck(lambda x, y: x * y + x, drawn([(8, 8), (8, 8)], torch.float16, seed), seed=seed)
        assert report.passed, report
        assert "at fp16" in str(report)

    def float32_only(x):
        if x.dtype != torch.float32:
            raise TypeError(f"no kernel for {x.dtype}")
        return x * 2
    with pytest.raises(RuntimeError, match=r"float32_only at fp16 raised TypeError: no kernel for torch.float16"):
        tapegrad.gradcheck(float32_only, drawn([(4, 4)], torch.float16, 0))


def test_the_bound_is_one_and_a_half_times_the_largest_figure_and_the_report_names_it():
    """Every compared input's line, and y's, gives its bound as 1.75 × the figure that judged it, with the others
    beside it; none is above the judged one, and a right kernel's error is within the bound."""
    report = tapegrad.gradcheck(make_affine().apply, inputs(rows=128), reference=REFERENCE)
    assert report.passed, report
    number = r"\d[\d.]*(?:e[+-]?\d+)?"
    lines = {line.split(":")[0].strip(): line for line in str(report).splitlines() if "here (1.75 × " in line}
    assert set(lines) == {"x", "g", "b", "y"}, report
    for name, line in lines.items():
        error, bound = map(float, re.search(rf"max error ({number}); .* up to ({number}) here", line).groups())
        judged = re.search(rf"\(1\.75 × (.*?), ({number})((?:; .*? {number})*)\)$", line)
        assert judged, line
        figure = float(judged.group(2))
        others = [float(v) for v in re.findall(rf" ({number})(?=;|$)", judged.group(3))]
        assert len(others) >= (1 if name == "y" else 2), line
        assert math.isclose(bound, 1.75 * figure, rel_tol=0.05) and error <= bound, line
        assert all(v <= figure * 1.01 for v in others), line
    assert "the reference's own error with its ops at bf16" in lines["x"]


def test_a_slip_twice_the_composites_own_error_fails_where_the_old_bound_passed_it():
    """A fused layer norm whose 16-bit path drops the mean of the projected gradient from x̄: its error is a few
    times what the composite reference errs at bf16, far within the old model's bound (3 units an op, times 2), and
    it fails, named a per-row term."""
    from low_precision import LAYER_NORM_REFERENCE, layer_norm_inputs, make_layer_norm
    for seed in range(3):
        report = tapegrad.gradcheck(make_layer_norm("no_mean_16bit").apply, layer_norm_inputs(seed=seed),
                                    reference=LAYER_NORM_REFERENCE, seed=seed)
        assert not report.passed, report
        assert {c.input for c in report.checks if not c.passed} == {"x"}, report
        assert "per_row_term" in report.kinds, report
        right = tapegrad.gradcheck(make_layer_norm().apply, layer_norm_inputs(seed=seed),
                                   reference=LAYER_NORM_REFERENCE, seed=seed)
        assert right.passed, right


def test_a_scale_under_an_ulp_fails_at_bf16_by_its_share_along_the_gradient():
    """A layer norm whose backward recomputes σ with torch.var's default (n − 1 where the forward has n): w̄ is
    0.9961 times right (x̄ nearly so), less than half an ulp of bf16 at every element, so no element's error shows
    it; their share along x̄ and w̄ themselves, summed over the elements, does, and the report names a scale with
    that factor. The right kernel passes the same test at every seed."""
    from low_precision import LAYER_NORM_REFERENCE, layer_norm_inputs, make_layer_norm
    factor = math.sqrt(127 / 128)
    for seed in range(3):
        report = tapegrad.gradcheck(make_layer_norm("unbiased_backward").apply, layer_norm_inputs(seed=seed),
                                    reference=LAYER_NORM_REFERENCE, seed=seed)
        assert not report.passed, report
        assert all(c.passed for c in report.checks if c.input in ("b", "y")), report
        scales = [d for d in report.diagnoses if d.kind == "scale" and d.input in ("x", "w")]
        assert scales, report
        for d in scales:
            found = re.search(r"̄ is ([\d.]+) × the reference's|c = ([\d.]+)", d.message)
            assert found, d.message
            named = float(found.group(1) or found.group(2))
            assert abs(named - factor) < 3e-4, d.message
        assert "of one piece along" in str(report), report
        right = tapegrad.gradcheck(make_layer_norm().apply, layer_norm_inputs(seed=seed),
                                   reference=LAYER_NORM_REFERENCE, seed=seed)
        assert right.passed, right


class SiluSignSlip(torch.autograd.Function):
    """y = x·σ(x), its backward in float32 at any dtype, with the product rule's x·σ′ term of the wrong sign."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        xf = x.to(torch.float32) if x.dtype != torch.float64 else x
        return (xf * torch.sigmoid(xf)).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        xf = x.to(torch.float32) if x.dtype != torch.float64 else x
        s = torch.sigmoid(xf)
        return (g.to(xf.dtype) * (s - xf * s * (1 - s))).to(x.dtype)


def test_a_slip_of_every_precision_is_named_at_bf16_as_its_float64_check_names_it():
    """A slip the float64 path makes too errs at bf16 as in float64, to rounding: the report names it with the float64
    check's kinds, read at full precision from the forward's terms, and says where the name comes from."""
    x = drawn([(16, 32)], torch.bfloat16, 0)
    report = tapegrad.gradcheck(SiluSignSlip.apply, x, reference=lambda x: x * torch.sigmoid(x))
    assert not report.passed, report
    assert "term_sign" in report.kinds, report
    assert any(d.kind == "term_sign" and d.message.startswith("as in float64") for d in report.diagnoses), report
    float64 = tapegrad.gradcheck(SiluSignSlip.apply, drawn([(16, 32)], torch.float64, 0))
    assert "term_sign" in float64.kinds, float64


class SiluSignSlipPastRow2(torch.autograd.Function):
    """SiluSignSlip's slip in the rows of x past its first two only: a slip the first rows do not show."""

    @staticmethod
    def forward(ctx, x):
        return SiluSignSlip.forward(ctx, x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        xf = x.to(torch.float32) if x.dtype != torch.float64 else x
        s = torch.sigmoid(xf)
        gx = g.to(xf.dtype) * (s + xf * s * (1 - s))
        gx[2:] = g[2:].to(xf.dtype) * (s[2:] - xf[2:] * s[2:] * (1 - s[2:]))
        return gx.to(x.dtype)


def test_at_size_the_float64_check_that_names_a_slip_runs_on_the_first_rows(monkeypatch):
    """Past 2^16 checked elements, the float64 check that names a slip of every precision runs first on the op cut to
    its first two rows, and says so; at the whole size only where the slip does not show there."""
    from tapegrad import _precision_names
    where = []
    names = _precision_names._float64_names

    def spy(report, c, same, float64_report, place):
        where.append(place)
        return names(report, c, same, float64_report, place)
    monkeypatch.setattr(_precision_names, "_float64_names", spy)
    x = drawn([(512, 256)], torch.bfloat16, 0)
    report = tapegrad.gradcheck(SiluSignSlip.apply, x, reference=lambda x: x * torch.sigmoid(x))
    assert not report.passed and "term_sign" in report.kinds, report
    assert any(d.kind == "term_sign" and d.message.startswith(
        "as in float64 (fn's float64 path errs as its bf16 one does, to rounding; its float64 check on the first 2 of "
        "512 along y's axis 0 reads): ") for d in report.diagnoses), report
    assert where == [" on the first 2 of 512 along y's axis 0"], where

    where.clear()
    report = tapegrad.gradcheck(SiluSignSlipPastRow2.apply, x, reference=lambda x: x * torch.sigmoid(x))
    assert not report.passed, report
    assert where == [" on the first 2 of 512 along y's axis 0", ""], where


def make_mean_cross_entropy(slip):
    """The mean over a batch of softmax cross-entropy against class indices, in float32 at any dtype below float64;
    its backward (softmax − one-hot)/n, with slip "no_mean" (the 1/n left out), "twice" (2× the right one) or None."""

    class MeanCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(ctx, z, target):
            zf = z.to(torch.float32) if z.dtype != torch.float64 else z
            logp = torch.log_softmax(zf, -1)
            ctx.save_for_backward(logp, target)
            return (-logp.gather(-1, target[:, None]).mean()).to(z.dtype)

        @staticmethod
        def backward(ctx, g):
            logp, target = ctx.saved_tensors
            d = torch.exp(logp) - torch.nn.functional.one_hot(target, logp.shape[-1]).to(logp.dtype)
            d = d * {"no_mean": 1.0, "twice": 2.0 / logp.shape[0]}.get(slip, 1.0 / logp.shape[0])
            return (g.to(d.dtype) * d).to(g.dtype), None
    return MeanCrossEntropy.apply


def cross_entropy_mean(z, target):
    return torch.nn.functional.cross_entropy(z, target)


@pytest.mark.parametrize("slip, law", [(None, None), ("no_mean", "at all 1024 rows c = 1024"), ("twice", None)])
def test_a_scalar_loss_at_size_is_named_on_its_batchs_first_rows(slip, law):
    """A scalar loss past 40000 checked elements is named on its inputs' first rows (its batch of terms, the targets
    cut too): a full Jacobian of the whole loss costs a run of it per element. A factor that grows with the batch's
    length is measured again on more rows and given at the whole batch."""
    g = torch.Generator().manual_seed(0)
    z = (2 * torch.randn(1024, 48, generator=g, dtype=torch.float64)).to(torch.bfloat16).requires_grad_()
    target = torch.randint(48, (1024,), generator=g)
    report = tapegrad.gradcheck(make_mean_cross_entropy(slip), (z, target), reference=cross_entropy_mean)
    if slip is None:
        assert report.passed, report
        return
    assert not report.passed and report.kinds == ["scale"], report
    (scale,) = [d.message for d in report.diagnoses if d.kind == "scale"]
    if law is None:  # a factor that is the same on any rows: read at the whole size, no law of the batch's length
        assert "rows c =" not in scale and "c = 2" in scale, scale
    else:
        assert "on the first 8 of 1024 along the loss's inputs' axis 0" in scale, scale
        assert "on 16 rows c = 16.0" in scale and law in scale and "the 1/n of a mean" in scale, scale
        # docs/python.md quotes this line, word for word but for the numbers that bf16 products round
        printed = [line for line in str(report).splitlines() if "[scale]" in line]
        quoted = [line for line in (SOURCE_DIR / "docs/python.md").read_text().splitlines()
                  if line.startswith("    [scale] z, vjp bf16: on the first 8 of 1024")]
        assert len(quoted) == 1 and [_numbers_out(q) for q in quoted] == [_numbers_out(p) for p in printed], printed


def _numbers_out(line):
    return re.sub(r"\d+\.\d+", "#", line)


class SumOfSquaresTimesThree(torch.autograd.Function):
    """Σ x² computed in float32 at every dtype (its float64 path rounds too), its backward 3x where 2x is right."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x.float() * x.float()).sum().to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return (3 * x.float() * g.float()).to(x.dtype)


def test_a_scalar_loss_at_size_is_named_on_its_batchs_rows_not_by_a_run_per_element():
    """Named by the structural kinds against the reference (its float64 path is not a float64 one), on the loss's
    first rows: its full Jacobian at 512×256 was 131072 runs of the whole loss."""
    x = drawn([(512, 256)], torch.bfloat16, 0)
    report = tapegrad.gradcheck(SumOfSquaresTimesThree.apply, x, reference=lambda x: (x * x).sum())
    assert not report.passed and report.kinds == ["scale"], report
    (scale,) = [d.message for d in report.diagnoses]
    assert scale.startswith("on the first 8 of 512 along the loss's inputs' axis 0 (a full Jacobian there): "
                            "analytic = c × numeric at every one of 2048 elements, c = 1.49"), scale


def make_logsumexp(save_low):
    """log Σ exp over the last axis, computed in float32; its backward is softmax = exp(x − lse). save_low keeps lse
    at the input's dtype for the backward (the output, rounded), where a fused kernel keeps it in float32."""

    class LogSumExp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            lse = torch.logsumexp(x.to(torch.float32), -1)
            out = lse.to(x.dtype)
            ctx.save_for_backward(x, out.to(torch.float32) if save_low else lse)
            return out

        @staticmethod
        def backward(ctx, g):
            x, lse = ctx.saved_tensors
            return (g.to(torch.float32)[:, None] * torch.exp(x.to(torch.float32) - lse[:, None])).to(x.dtype)
    return LogSumExp.apply


def test_a_value_saved_at_bf16_is_not_passed_for_the_inputs_own_sensitivity():
    """A log-sum-exp whose backward reads lse rounded to bf16 errs several times what the composite reference errs at
    bf16 (|lse| ≈ 10: a relative error of 10 units in every softmax row). Rounding's figures are measured at x and at
    x moved by an ulp, each against float64 at its own point; held against x, the moved point carried x̄'s
    sensitivity to a bf16 ulp of x, which is this slip's size, and passed it."""
    def reference(x):
        m = x.amax(-1, keepdim=True).detach()
        return m.squeeze(-1) + torch.log(torch.exp(x - m).sum(-1))
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x = (3 + 2 * torch.randn(256, 128, dtype=torch.float64, generator=g)).to(torch.bfloat16).requires_grad_()
        assert not tapegrad.gradcheck(make_logsumexp(True), (x,), reference=reference, seed=seed).passed
        right = tapegrad.gradcheck(make_logsumexp(False), (x,), reference=reference, seed=seed)
        assert right.passed, right


def test_a_value_saved_at_bf16_fails_against_torch_s_own_op_that_saves_it_so():
    """torch.logsumexp's backward reads its own bf16 output, so torch's ops at bf16 err as much as a kernel that saves
    lse in bf16. That excuses an op built of torch ops at bf16, not one that computes in float32: the kernel saving
    lse at bf16 fails against torch.logsumexp as the reference, and the right one passes."""
    for seed in range(3):
        g = torch.Generator().manual_seed(seed)
        x = (3 + 2 * torch.randn(256, 128, dtype=torch.float64, generator=g)).to(torch.bfloat16).requires_grad_()
        reference = lambda x: torch.logsumexp(x, -1)
        slip = tapegrad.gradcheck(make_logsumexp(True), (x,), reference=reference, seed=seed)
        assert not slip.passed, slip
        assert "the op rounds in no torch op at bf16, so it is held to a fused kernel's arithmetic" in str(slip)
        right = tapegrad.gradcheck(make_logsumexp(False), (x,), reference=reference, seed=seed)
        assert right.passed, right


def test_a_fused_recurrence_keeping_its_state_at_bf16_fails_and_the_right_one_passes():
    """A kernel that rounds in no torch op is held to what a fused kernel's own arithmetic errs: its result's
    rounding, its products' operands at bf16 and its float32 sums, added. A linear scan whose state is kept at bf16
    errs 2.7 times the result's rounding there, twice what the composite at bf16 errs; held to twice the larger of
    the first two figures, then times 1.75, it passed. The right scan passes at every seed."""
    from precision_heldout import CASES
    scan = next(case for case in CASES if case.name == "linear_scan")
    xs = scan.inputs("small", torch.bfloat16, 2)
    slip = tapegrad.gradcheck(scan.make("state_low"), xs, reference=scan.reference, seed=2)
    assert not slip.passed, slip
    assert "held to a fused kernel's arithmetic" in str(slip)
    assert "precision_defect" in slip.kinds, slip
    for seed in range(3):
        right = tapegrad.gradcheck(scan.make("right"), scan.inputs("small", torch.bfloat16, seed),
                                   reference=scan.reference, seed=seed)
        assert right.passed, right


def test_a_constant_factor_is_read_from_the_vectors_where_the_structural_kinds_name_nothing(monkeypatch):
    """At sizes no cut reaches, the structural kinds read random projections, whose rounding can hide a factor; the
    compared x̄ themselves show it: x̄ₚ = c·x̄₆₄ at every element, what is left within |c| × rounding's bound."""
    import tapegrad._precision_names as names
    monkeypatch.setattr(names, "_name_slips", lambda report, c, failing: ({}, {}))

    class Scaled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):  # a kernel for float32 alone, as a Triton one may be: no float64 path to name from
            if x.dtype != torch.float32:
                raise TypeError("float32 only")
            ctx.save_for_backward(x, w)
            return (x.float() @ w.float()).to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return (g.float() @ w.float().T).to(x.dtype), (8 * x.float().T @ g.float()).to(w.dtype)
    g = torch.Generator().manual_seed(0)
    x, w = (torch.randn(*s, dtype=torch.float64, generator=g).float().requires_grad_() for s in ((64, 32), (32, 16)))
    report = tapegrad.gradcheck(Scaled.apply, (x, w), reference=lambda x, w: x @ w, seed=0)
    assert not report.passed
    scale = [d for d in report.diagnoses if d.kind == "scale" and d.input == "w"]
    assert scale and "c = 8 " in scale[0].message, report
    assert scale[0].factor == pytest.approx(8, rel=1e-5)
    assert not [d for d in report.diagnoses if d.input == "x"], report


def test_each_element_is_held_to_its_own_rounding():
    """A backward that adds 0.012 to the elements of x̄ under 0.25 errs less than 1.75 half-ulps of x̄'s largest
    element (about 3, whose half ulp at bf16 is 0.0078) and passed when every element was held to that; an element
    of 0.2 rounds by at most 0.0005 at bf16, and the row fails there, a line naming the element."""
    def make(offset):
        class Copy(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                return x.float().to(x.dtype)

            @staticmethod
            def backward(ctx, g):
                g32 = g.float()
                return (g32 + offset * (g32.abs() < 0.25)).to(g.dtype)
        return Copy.apply
    x = torch.randn(1000, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    reference = lambda x: x * 1
    right = tapegrad.gradcheck(make(0.0), (x.requires_grad_(),), reference=reference, seed=0)
    assert right.passed, right
    slip = tapegrad.gradcheck(make(0.012), (x,), reference=reference, seed=0)
    assert not slip.passed, slip
    row = next(c for c in slip.checks if c.check == "vjp bf16")
    assert row.max_abs_err < 1.75 * 0.0078 * 2, slip  # within the largest element's allowance
    assert re.search(r"x: at x\[\d+\], where x̄ is -?0\.\d+, the error is 0\.01", str(slip)), slip


def make_column_scale(slip=1.0):
    """y = w ⊙ Σᵣ xᵣ, whose backward sums x's rows again, one after the other in float32, as a kernel looping over
    the rows does: w̄ = ȳ ⊙ Σᵣ xᵣ, a long sum of terms of one sign where x > 0 (slip: a factor on w̄)."""

    class ColumnScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return w * x.sum(0)

        @staticmethod
        def backward(ctx, gy):
            x, w = ctx.saved_tensors
            column = torch.zeros(x.shape[1:], dtype=torch.float32)
            for row in x.float():
                column += row
            return (gy * w).expand_as(x).clone(), (gy * column * slip).to(w.dtype)
    return ColumnScale.apply


def test_a_long_float32_sum_of_terms_of_one_sign_is_allowed_for_by_its_length():
    # 4096 positive terms added one after the other err about u₃₂·|Σ|·√n/3 (here 0.0087, 9 times the composite's
    # own error: torch sums in blocks): the right kernel passes, the sum's figure judging; a factor 1 + 1e-4 on w̄
    # still fails.
    g = torch.Generator().manual_seed(3)
    x = (torch.rand(4096, 16, generator=g, dtype=torch.float64) + 0.5).float().requires_grad_()
    w = torch.randn(16, generator=g, dtype=torch.float64).float().requires_grad_()

    def reference(x, w):
        return w * x.sum(0)
    report = tapegrad.gradcheck(make_column_scale(), (x, w), reference=reference)
    assert report.passed, report
    assert "a float32 sum of 4096 terms" in str(report).split("  w: ")[1].split("(1.75 × ")[1]
    assert not tapegrad.gradcheck(make_column_scale(1 + 1e-4), (x, w), reference=reference).passed


@pytest.mark.parametrize("where, factor, kinds", [("row", 1.02, {"one_row", "per_row_factor"}),
                                                  ("column", 1.02, {"unexplained"})])
def test_a_slip_in_one_block_of_a_fused_kernel_fails_at_bf16_by_its_share_there(where, factor, kinds):
    """A fused layer norm (float32 inside) whose x̄ is 2% off in one row (one column) at bf16 only: the block errs
    by a few ulps of its own elements, within the bound the largest rows set and diluted over the whole of x̄, and
    passed before; in its own block it is of one piece along x̄ there, past what the fused model's rounding puts
    along it (tapegrad/_blocks.py). The report says which block (where the structural kinds see the row's factor
    differ from the others', they name it a per-row factor); the right kernel passes at every seed."""
    from block_slips import blocks, one_block_off
    from precision_build import LAYER_NORM
    for seed in (1, 2):
        xs = LAYER_NORM.inputs("small", torch.bfloat16, seed)
        right = tapegrad.gradcheck(LAYER_NORM.make("right"), xs, reference=LAYER_NORM.reference, seed=seed)
        assert right.passed, right
        block = blocks(tuple(xs[0].shape))[where]
        slip = tapegrad.gradcheck(one_block_off(LAYER_NORM.make("right"), 0, block, factor, torch.bfloat16), xs,
                                  reference=LAYER_NORM.reference, seed=seed)
        assert not slip.passed, slip
        place = "x0̄[1, :]" if where == "row" else "x0̄[..., 1]"  # (the wrapper's inputs are x0, x1, ...)
        assert f"x0: in {place}" in str(slip), slip
        named = [d.kind for d in slip.diagnoses if d.input == "x0"]
        assert len(named) == 1 and named[0] in kinds, slip


def test_kernels_in_bf16_ops_pass_block_by_block():
    """Right kernels whose backwards are torch ops at bf16 (python/tests/precision_ops16.py) round as their own
    formulas do: a softmax's y ⊙ (ȳ − ⟨ȳ, y⟩) errs several percent along a row where the difference cancels. Each
    passes, at every size and seed; a row of the layer norm's x̄ 5% off fails."""
    from block_slips import blocks, one_block_off
    from precision_ops16 import BUILD, HELDOUT
    for case in BUILD + HELDOUT:
        for size in ("small", "3d"):
            xs = case.inputs(size, torch.bfloat16, 1)
            report = tapegrad.gradcheck(case.make("right"), xs, reference=case.reference, seed=1)
            assert report.passed, report
    layer_norm = BUILD[0]
    xs = layer_norm.inputs("small", torch.bfloat16, 1)
    slip = one_block_off(layer_norm.make("right"), 0, blocks(tuple(xs[0].shape))["row"], 1.05, torch.bfloat16)
    assert not tapegrad.gradcheck(slip, xs, reference=layer_norm.reference, seed=1).passed


@pytest.mark.parametrize("name, size, seed, dtype", [("gated16", "small", 6, torch.bfloat16),
                                                     ("log_softmax16", "small", 10, torch.bfloat16),
                                                     ("linear_gelu16", "3d", 5, torch.bfloat16),
                                                     ("attention16", "large", 7, torch.bfloat16),
                                                     ("gated16", "large", 2, torch.float32)])
def test_a_kernel_in_torch_ops_at_its_dtype_is_held_to_its_own_arithmetic(name, size, seed, dtype):
    """Right kernels written in torch ops at their dtype whose formulas err more than the reference's does there
    (1.9 to 2.7 times the composite's figure at these seeds) failed; their own roundings, falling otherwise, are now a
    figure of the bound (up to twice the composite's), and they pass. The same kernel with x̄ 5% off fails."""
    from block_slips import one_block_off
    from precision_ops16 import BUILD, HELDOUT
    case = next(c for c in BUILD + HELDOUT if c.name == name)
    xs = case.inputs(size, dtype, seed)
    report = tapegrad.gradcheck(case.make("right"), xs, reference=case.reference, seed=seed)
    assert report.passed, report
    assert f"own ops at {'bf16' if dtype == torch.bfloat16 else 'float32'} move it" in str(report), report
    slip = one_block_off(case.make("right"), 0, (Ellipsis,), 1.05, dtype)
    assert not tapegrad.gradcheck(slip, xs, reference=case.reference, seed=seed).passed


@pytest.mark.parametrize("name, size, seed, where", [("layer_norm16", "small", 2, "row"),
                                                     ("softmax16", "small", 2, "column"),
                                                     ("attention16", "small", 1, "row")])
def test_a_block_two_percent_off_fails_with_the_ops_roundings_averaged_out(name, size, seed, where):
    """Kernels in bf16 torch ops whose own roundings move a block of x̄ by a unit or two of roundoff from one rounding
    to the next: one row or column 2% off (5 units) passed within the allowances for noise and for those roundings.
    Read again with each of the op's roundings made stochastic, its share there averaged over 8 runs (16 where 8 leave
    it unsettled) is the slip's, and it fails, said so; the right kernel passes. (Whether the right kernel's own
    blocks need that reading depends on the CPU: where its bf16 products keep their sums in float32 and round once,
    as with AVX512_BF16, no block of it moves 2 units in one run; where they keep them at bf16, some do.)"""
    from block_slips import blocks, one_block_off
    from precision_ops16 import BUILD, HELDOUT
    case = next(c for c in BUILD + HELDOUT if c.name == name)
    xs = case.inputs(size, torch.bfloat16, seed)
    right = tapegrad.gradcheck(case.make("right"), xs, reference=case.reference, seed=seed)
    assert right.passed, right
    slip = one_block_off(case.make("right"), 0, blocks(tuple(xs[0].shape))[where], 1.02, torch.bfloat16)
    report = tapegrad.gradcheck(slip, xs, reference=case.reference, seed=seed)
    assert not report.passed, report
    assert re.search(r"averaged over (8|16) runs × 2 ȳ with each of OneBlockOff's roundings at bf16 made stochastic "
                     r"is \+0\.0", str(report)), report
    assert "so the formula itself is off in that block" in str(report), report


def test_a_right_kernels_block_its_one_run_put_past_its_allowances_passes_averaged():
    """A right RMSNorm in bf16 ops whose one run put a column of x̄ 4 units of roundoff along itself, past 4 times what
    its own roundings falling otherwise put there, failed as a precision defect; averaged over 16 runs with its
    roundings stochastic, the column is within rounding, and the check passes. The same column 2% off fails."""
    from block_slips import one_block_off
    from precision_ops16 import BUILD
    case = next(c for c in BUILD if c.name == "rms_norm16")
    xs = case.inputs("large", torch.bfloat16, 3)
    right = tapegrad.gradcheck(case.make("right"), xs, reference=case.reference, seed=3)
    assert right.passed, right
    assert "units of bf16's roundoff or more along themselves in one run are within rounding with RMSNorm's " \
        "roundings averaged out" in str(right), right
    slip = one_block_off(case.make("right"), 0, (Ellipsis, 90), 1.02, torch.bfloat16)
    assert not tapegrad.gradcheck(slip, xs, reference=case.reference, seed=3).passed


@pytest.mark.parametrize("name, size, seed, where", [("linear_gelu", "small", 2, "column"),
                                                     ("linear_gelu", "small", 1, "row"),
                                                     ("attention_bias", "large", 1, "row")])
def test_a_block_two_percent_off_fails_in_a_kernel_whose_products_round_at_bf16(name, size, seed, where):
    """Fused kernels whose products round at bf16 in torch's matmul (the rest in float32): one row or column of x̄ 2%
    off, 2.2 to 5.4 times the composite's error in that block, passed under five times the composite's largest share
    over all the blocks. A block past the composite's share there is now judged by its share with the kernel's
    roundings averaged out over 16 runs, and the report says so; the right kernel passes."""
    from block_slips import blocks, one_block_off
    from precision_build import CASES
    case = next(c for c in CASES if c.name == name)
    xs = case.inputs(size, torch.bfloat16, seed)
    assert tapegrad.gradcheck(case.make("right"), xs, reference=case.reference, seed=seed).passed
    slip = one_block_off(case.make("right"), 0, blocks(tuple(xs[0].shape))[where], 1.02, torch.bfloat16)
    report = tapegrad.gradcheck(slip, xs, reference=case.reference, seed=seed)
    assert not report.passed, report
    assert "so the formula itself is off in that block" in str(report), report


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("against", ["itself", "composite"])
def test_no_slip_two_to_five_percent_off_passes_at_any_dtype(dtype, against):
    """A fused layer norm (examples/python/low_precision.py) at bf16, fp16 and float32, against itself in float64 and
    against its composite: right, it passes; with x̄ 2% off, or one row or one column of x̄ 2% or 5% off, on the
    path of that dtype alone (its float64 path right), it fails. (One column 2% off at bf16 against the composite
    passed before the block-by-block share.)"""
    from block_slips import blocks, one_block_off
    from low_precision import LAYER_NORM_REFERENCE, layer_norm_inputs, make_layer_norm
    reference = None if against == "itself" else LAYER_NORM_REFERENCE
    xs = layer_norm_inputs(rows=64, features=32, dtype=dtype, seed=1)
    assert tapegrad.gradcheck(make_layer_norm().apply, xs, reference=reference).passed
    for where, factor in [("all", 1.02), ("row", 1.02), ("row", 1.05), ("column", 1.02), ("column", 1.05)]:
        block = (Ellipsis,) if where == "all" else blocks((64, 32))[where]
        slip = one_block_off(make_layer_norm().apply, 0, block, factor, dtype)
        report = tapegrad.gradcheck(slip, xs, reference=reference)
        assert not report.passed, (where, factor, report)


def test_an_op_whose_float64_path_rounds_at_bf16_is_told_to_give_a_reference():
    """exp computed at bf16 whatever its input's dtype, checked at bf16 with no reference=: its float64 run rounds at
    bf16 too, so it fails its float64 rows with one "rounds inside" line, and the precision line says that it cannot
    be its own reference (not that a slip is in every precision)."""
    class ExpAtBf16(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.exp(x.to(torch.bfloat16).float()).to(torch.bfloat16).to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            return (g.double() * torch.exp(x.double())).to(g.dtype)
    x = torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    report = tapegrad.gradcheck(ExpAtBf16.apply, (x.requires_grad_(),))
    assert not report.passed
    assert [d.kind for d in report.diagnoses] == ["rounds_inside"], report
    assert "rounds inside too, so it cannot be its own reference: give reference=" in str(report), report
    assert "the slip is in every precision" not in str(report), report
