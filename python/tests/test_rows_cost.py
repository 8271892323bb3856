"""A small input beside a large output (a bias, a scale, a decay) is checked at a cost in proportion to the check: its
Jacobian's rows read by columns where the backward can be differentiated, by projections where it cannot, and in
full, one backward per element of y, where fast_mode=False asks for it; a weight of many elements beside one output,
whose full Jacobian costs two runs of the loss per element, is checked by projections too."""

import pytest
import torch

import tapegrad


def _counted(slip=None):
    """y[t] = tanh(x[t] + b) + γ·y[t−1] as a Function, its backward a loop from the last step down whose steps are
    stacked (torch can differentiate it), counting its calls. slip: "db_twice" (b̄ doubled) or "db_squared"
    (b̄ from ȳ², not linear in ȳ)."""
    calls = {"backward": 0}

    class Scan(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b, gamma):
            ys, prev = [], torch.zeros_like(x[0])
            for t in range(x.shape[0]):
                prev = torch.tanh(x[t] + b) + gamma * prev
                ys.append(prev)
            y = torch.stack(ys)
            ctx.save_for_backward(x, b, gamma, y)
            return y

        @staticmethod
        def backward(ctx, g):
            calls["backward"] += 1
            x, b, gamma, y = ctx.saved_tensors
            # in the forward pass y[t] = tanh(x[t] + b) + γ·y[t−1], so now λ[t] = ȳ[t] + γ·λ[t+1]
            lams, carried = [], torch.zeros_like(g[0])
            for t in range(g.shape[0] - 1, -1, -1):
                carried = g[t] + gamma * carried
                lams.append(carried)
            lam = torch.stack(lams[::-1])
            dpre = lam * (1 - torch.tanh(x + b) ** 2)
            db = dpre.sum(0)
            if slip == "db_twice":
                db = 2 * db
            if slip == "db_squared":
                db = (lam * lam * (1 - torch.tanh(x + b) ** 2)).sum(0)
            previous = torch.cat([torch.zeros_like(y[:1]), y[:-1]])
            dgamma = (lam * previous).sum().reshape(gamma.shape)
            return dpre, db, dgamma

    return Scan, calls


def _in_place(Scan):
    """The same op with its backward's λ written into a buffer in place, so that torch cannot differentiate it."""
    class InPlace(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, b, gamma):
            y = Scan.apply(x, b, gamma).detach()
            ctx.save_for_backward(x, b, gamma, y)
            return y

        @staticmethod
        def backward(ctx, g):
            x, b, gamma, y = ctx.saved_tensors
            lam = torch.empty_like(g)
            lam[-1] = g[-1]
            for t in range(g.shape[0] - 2, -1, -1):
                lam[t] = g[t] + gamma * lam[t + 1]
            dpre = lam * (1 - torch.tanh(x + b) ** 2)
            previous = torch.cat([torch.zeros_like(y[:1]), y[:-1]])
            return dpre, dpre.sum(0), (lam * previous).sum().reshape(gamma.shape)

    return InPlace


def _inputs(steps=24, width=32):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(steps, width, dtype=torch.float64, generator=gen, requires_grad=True),
            torch.randn(width, dtype=torch.float64, generator=gen, requires_grad=True),
            torch.tensor([0.5], dtype=torch.float64, requires_grad=True))


def _modes(report):
    return {c.input: c.mode for c in report.checks if c.check == "vjp"}


def test_a_small_input_beside_a_large_output_is_read_by_columns():
    Scan, calls = _counted()
    report = tapegrad.gradcheck(Scan.apply, _inputs())
    assert report.passed, report
    modes = _modes(report)
    assert modes["b"] == "full" and modes["gamma"] == "full", modes  # b and γ in full, x (768 × 768) by projections
    assert modes["x"] == "fast", modes
    # 768 outputs: one backward per row would be 768 calls; by columns, the check's few (its projections, the random
    # ȳ, the accumulation, ȳ = 0) and one for the columns
    assert calls["backward"] < 20, calls


def test_read_by_columns_a_slip_of_the_small_input_is_caught_and_named():
    Scan, _ = _counted("db_twice")
    report = tapegrad.gradcheck(Scan.apply, _inputs())
    assert not report.passed
    assert any(d.kind == "scale" and d.input == "b" for d in report.diagnoses), report


def test_a_backward_not_linear_in_its_cotangent_is_not_read_by_columns_and_fails():
    Scan, calls = _counted("db_squared")
    report = tapegrad.gradcheck(Scan.apply, _inputs())
    assert not report.passed, report
    assert any(c.input == "b" and not c.passed for c in report.checks), report


def test_rows_that_cannot_be_read_by_columns_are_checked_by_projections_unless_full_is_asked_for():
    Scan, _ = _counted()
    InPlace = _in_place(Scan)
    report = tapegrad.gradcheck(InPlace.apply, _inputs())
    assert report.passed, report
    assert _modes(report)["b"] == "fast", report  # 768 backwards of a Python loop: projections instead
    full = tapegrad.gradcheck(InPlace.apply, _inputs(), fast_mode=False)
    assert full.passed and _modes(full)["b"] == "full", full


def _weighted_loss(slip=None):
    """L = Σ_i mean_j w_ij·x_ij² as a Function: one output and a weight as large as x. slip: "dw_five_percent" (w̄
    × 1.05), "dw_mixed" (w̄ plus 0.3 of itself rolled by 7 rows times cos(3x): no kind fits)."""
    class Loss(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return (w * x * x).mean(1).sum()

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            n = x.shape[1]
            dw = g * x * x / n
            if slip == "dw_five_percent":
                dw = dw * 1.05
            if slip == "dw_mixed":
                dw = dw + 0.3 * torch.roll(dw, 7, 0) * torch.cos(3 * x)
            return g * 2 * w * x / n, dw

    return Loss


def test_a_large_weight_beside_one_output_is_checked_by_projections_unless_full_is_asked_for():
    gen = torch.Generator().manual_seed(1)
    xs = (torch.randn(40, 20, dtype=torch.float64, generator=gen, requires_grad=True),
          torch.randn(40, 20, dtype=torch.float64, generator=gen, requires_grad=True))
    report = tapegrad.gradcheck(_weighted_loss().apply, xs)
    assert report.passed and _modes(report) == {"x": "fast", "w": "fast"}, report  # 2 × 800 runs of the loss each
    full = tapegrad.gradcheck(_weighted_loss().apply, xs, fast_mode=False)
    assert full.passed and _modes(full) == {"x": "full", "w": "full"}, full
    slip = tapegrad.gradcheck(_weighted_loss("dw_five_percent").apply, xs)
    assert not slip.passed and slip.has("scale", input="w"), slip
    assert [d.factor for d in slip.diagnoses if d.kind == "scale"] == [pytest.approx(1.05, rel=1e-6)], slip


def test_an_input_checked_by_projections_for_its_cost_is_told_so_where_nothing_names_its_slip():
    gen = torch.Generator().manual_seed(1)
    xs = tuple(torch.randn(100, 100, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(2))
    # 10,000 entries of w: within the limit, but 20,000 runs of the loss in full
    report = tapegrad.gradcheck(_weighted_loss("dw_mixed").apply, xs)
    assert not report.passed and _modes(report)["w"] == "fast", report
    line = next(d.message for d in report.diagnoses if d.kind == "unexplained" and d.input == "w")
    assert "fewer than the 40000 that gradcheck takes in full by default" in line and "above" not in line, line
    assert "pass fast_mode=False" in line and "full_jacobian_limit" not in line, line
