"""At size, a slip random projections leave unnamed is named on the op cut along y's axes, its fixed tensors cut too
(tapegrad/_cut.py): the ops of narrow_build.py and of the held-out sets, whose figures python/tools/narrow_table.py
prints (docs/python.md, "At size: the op cut with its fixed tensors")."""

import contextlib
import io
import re

import pytest
import torch

import narrow_build
import narrow_heldout
import narrow_heldout2
import researcher_ops
import tapegrad
from conftest import SOURCE_DIR

SETS = {"build": narrow_build.OPS, "heldout": narrow_heldout.OPS, "heldout2": narrow_heldout2.OPS}
CASES = [(s, op, v) for s, ops in SETS.items() for op, (_, slips) in ops.items() for v in ("right",) + tuple(slips)]


def check(set_name, op, variant, large=True):
    fn, inputs = SETS[set_name][op][0](variant, large, 0)
    return tapegrad.gradcheck(fn, inputs)


@pytest.mark.parametrize("set_name,op,variant", CASES)
def test_a_right_op_passes_at_size_and_a_slip_fails(set_name, op, variant):
    report = check(set_name, op, variant)
    assert report.passed == (variant == "right"), report
    if variant != "right":  # a slip: checked by projections there, which every checked input needs at this size
        assert any(c.mode == "fast" for c in report.checks if c.check == "vjp"), report


def test_a_mask_of_the_batch_is_cut_with_the_inputs_and_a_factor_of_each_row_is_told_from_a_scale():
    report = check("heldout", "masked_mean", "count_T")
    (d,) = [d for d in report.diagnoses if d.input == "x"]
    assert d.kind == "per_row_factor", report
    assert "on the first 1 of 4 along y's axis 0 and on the last 1 of 4 along y's axis 0" in d.message
    factors = [float(c) for c in re.findall(r"c = ([0-9.]+) and ([0-9.]+)", d.message)[0]]
    assert factors[0] != factors[1]


def test_a_target_of_the_batch_is_cut_with_the_logits():
    """Unnamed at the small size too, but the report says where the error lies on the cut, not "share no axis"."""
    report = check("build", "focal_loss", "target_ignored")
    messages = [d.message for d in report.diagnoses]
    assert any(m.startswith("on the first 2 of 8 along y's axis 0 (a full Jacobian there)") for m in messages), report
    assert not any("share no leading axis" in m for m in messages), report


def test_a_scan_is_cut_along_its_batch_before_its_steps():
    report = check("heldout", "masked_cumsum", "first_batch")
    # what a cut names, it names along the batch; what it leaves, the full check names where that costs little
    assert report.diagnoses and all("along y's axis 0" in d.message or d.message.startswith("in full (")
                                    for d in report.diagnoses if d.kind != "unexplained"), report


@pytest.mark.parametrize("set_name", SETS)
def test_the_sets_slips_are_named_at_size_as_at_the_small_size_no_less_often_than_measured(set_name):
    """The figures narrow_table.py printed when the cut was made (docs/python.md): a change that names fewer fails."""
    measured = {"build": 9, "heldout": 9, "heldout2": 9}
    same = 0
    for s, op, variant in CASES:
        if s != set_name or variant == "right":
            continue
        small = {d.kind for d in check(s, op, variant, large=False).diagnoses} - researcher_ops.GENERIC
        large = {d.kind for d in check(s, op, variant).diagnoses} - researcher_ops.GENERIC
        same += bool(large) and large <= small
    assert same >= measured[set_name]


def test_docs_example_prints_the_line_docs_quote():
    text = (SOURCE_DIR / "docs/python.md").read_text()
    section = text[text.index("### At size: the op cut with its fixed tensors"):]
    code = re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)
    quoted = re.search(r"```\n(    \[.*?)\n```", section, flags=re.S).group(1)
    namespace = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<docs>", "exec"), namespace)
    assert quoted in out.getvalue().splitlines(), out.getvalue()


class _RowGain(torch.autograd.Function):
    """y = x·w with a gain w (R, 1) per row; the slip: x̄ = ȳ·w², off by a factor w_r of its own in each row."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g * w * w, (g * x).sum(1, keepdim=True)


def test_the_cpp_cut_to_one_row_tells_a_factor_of_each_row_from_a_scale():
    """No fixed input: the C++ checker's own cut, to the first of 64 rows, where the slip reads as a scale w_0; the
    last row's factor w_63 differs, and the report says both (checker/diagnose_narrowed.cpp); no longer a scale,
    which explains x, the slip is then named from the forward too."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 150, dtype=torch.float64, generator=g, requires_grad=True)
    w = (torch.rand(64, 1, dtype=torch.float64, generator=g) + 0.5).requires_grad_()
    report = tapegrad.gradcheck(_RowGain.apply, (x, w))
    assert {d.kind for d in report.diagnoses if d.input == "x"} == {"one_input", "per_row_factor", "term_factor"}
    (d,) = [d for d in report.diagnoses if d.kind == "per_row_factor"]
    first, last = (float(c) for c in re.search(r"c = ([0-9.]+) and ([0-9.]+)", d.message).groups())
    assert first == pytest.approx(w[0, 0].item(), rel=1e-4) and last == pytest.approx(w[-1, 0].item(), rel=1e-4)


def test_a_backward_that_breaks_on_the_cut_leaves_the_report_as_it_is():
    """A strided transposed convolution, y[b, o, s·t + j] += Σ_c x[b, c, t]·w[c, o, j], as many channels in as out,
    whose backward reads ȳ without the stride. The cut of y's channel axis cuts x's too (its size is y's); the
    product broadcasts there and the backward's in-place sum into x̄ does not, so the check on that cut raises. The
    report at size stands, the slip caught, and no exception reaches the caller."""

    class StridedUp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            steps, taps = x.shape[-1], w.shape[-1]
            y = x.new_zeros(x.shape[0], w.shape[1], 3 * (steps - 1) + taps)
            for j in range(taps):
                y[..., j:j + 3 * (steps - 1) + 1:3] += torch.einsum("bct,co->bot", x, w[..., j])
            ctx.save_for_backward(x, w)
            return y

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            steps, taps = x.shape[-1], w.shape[-1]
            gx = torch.zeros_like(x)
            for j in range(taps):
                gx += torch.einsum("bot,co->bct", g[..., j:j + steps], w[..., j])  # slip: the stride 3 left out
            gw = torch.stack([torch.einsum("bct,bot->co", x, g[..., j:j + 3 * (steps - 1) + 1:3])
                              for j in range(taps)], -1)
            return gx, gw

    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 8, 24, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(8, 8, 2, dtype=torch.float64, generator=gen, requires_grad=True)
    report = tapegrad.gradcheck(StridedUp.apply, (x, w))
    assert not report.passed and any(c.mode == "fast" for c in report.checks if c.check == "vjp"), report


def batch_gram(slip=None):
    """y = xᵀ·x / B over a batch of rows, (B, D) → (D, D): y shares no axis with x that a cut could narrow."""

    class BatchGram(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x.T @ x / x.shape[0]

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            gx = x @ (g + g.T) / x.shape[0]
            return torch.cat([2 * gx[:4], gx[4:]]) if slip == "first_rows_twice" else gx

    return BatchGram


def test_a_slip_no_cut_can_name_is_named_in_full_where_that_costs_little():
    """128 × 16 in, 16 × 16 out: 524,288 Jacobian entries, past the projections' limit, and no cut of y narrows x.
    The full check names the first rows' factor; asked for projections (fast_mode=True), the report keeps them."""
    x = torch.randn(128, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    assert tapegrad.gradcheck(batch_gram().apply, (x,))
    report = tapegrad.gradcheck(batch_gram("first_rows_twice").apply, (x,))
    (d,) = [d for d in report.diagnoses if d.input == "x"]
    assert d.kind == "per_row_factor" and d.message.startswith(
        "in full (524288 Jacobian entries, taken to name the slip): "), report
    line = next(line for line in str(report).splitlines() if line.startswith("    [per-row factor] x"))
    assert line in (SOURCE_DIR / "docs/python.md").read_text().splitlines(), line  # the line docs/python.md quotes
    assert any(c.mode == "fast" for c in report.checks if c.check == "vjp"), report  # the check itself: projections
    asked = tapegrad.gradcheck(batch_gram("first_rows_twice").apply, (x,), fast_mode=True)
    assert not asked.passed and not any("in full (" in d.message for d in asked.diagnoses), asked
