"""A slip a backward makes at every step of a loop of the forward (tapegrad/_forward_loop.py): the gradient not
carried back through the later steps, and a product's other factor read one step late."""

import pytest
import torch

from test_forward import check, inputs


def leaky_sum(slip=None):
    """h_t = d·h_{t−1} + b·x_t along the rows, h_{−1} = 0, with a decay d and a gain b per column."""

    class LeakySum(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, d, b):
            h = torch.zeros_like(x[0])
            out = []
            for t in range(x.shape[0]):
                h = d * h + b * x[t]
                out.append(h)
            ctx.save_for_backward(x, d, b, torch.stack(out))
            return torch.stack(out)

        @staticmethod
        def backward(ctx, g):
            x, d, b, hs = ctx.saved_tensors
            before = torch.cat((torch.zeros_like(hs[:1]), hs[:-1]))  # h_{t−1}
            carried = torch.zeros_like(g)
            dh = torch.zeros_like(g[0])
            for t in reversed(range(g.shape[0])):
                dh = g[t] + d * dh
                carried[t] = dh
            if slip == "not_carried":
                dd = (g * before).sum(0)
            elif slip == "one_step_late":
                dd = (carried * hs).sum(0)
            else:
                dd = (carried * before).sum(0)
            return carried * b, dd, (carried * x).sum(0)

    return LeakySum


def leaky_inputs():
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(6, 3, dtype=torch.float64, generator=gen).requires_grad_()
    d = (0.5 + 0.4 * torch.rand(3, dtype=torch.float64, generator=gen)).requires_grad_()
    b = (1.0 + 0.3 * torch.randn(3, dtype=torch.float64, generator=gen)).requires_grad_()
    return x, d, b


CASES = [(leaky_sum, "not_carried", leaky_inputs, "d", "wrong_value"),
         (leaky_sum, "one_step_late", leaky_inputs, "d", "wrong_value")]


def message(report, kind, name):
    return next(d.message for d in report.diagnoses if d.kind == kind and d.input == name)


def test_the_right_backward_passes():
    report = check(leaky_sum(), leaky_inputs())
    assert report.passed, str(report)


@pytest.mark.parametrize("make, slip, args, name, kind", CASES, ids=[c[1] for c in CASES])
def test_the_slip_is_named_for_its_input_only(make, slip, args, name, kind):
    report = check(make(slip), args())
    assert not report.passed and report.has(kind, name), str(report)
    assert not [d for d in report.diagnoses if d.input in ("x", "b") and d.check == "vjp"], str(report)


def test_the_gradient_not_carried_through_the_later_steps():
    text = message(check(leaky_sum("not_carried"), leaky_inputs()), "wrong_value", "d")
    assert text.startswith("x̄ is the forward's rule with `h` in `d * h` at test_forward_loop.py:19 detached at every "
                           "one of its 5 runs"), text
    assert "the gradient accumulated through the later steps belongs" in text, text


def test_a_factor_read_one_step_late():
    text = message(check(leaky_sum("one_step_late"), leaky_inputs()), "wrong_value", "d")
    assert text.startswith("x̄ is the forward's rule with the term through `d` in `d * h` at test_forward_loop.py:19 "
                           "read, at each of its 6 runs, with the value `d * h + b * x[t]`"), text
    assert text.endswith("(`h` one step late)"), text


def test_a_term_left_out_at_every_step_of_a_loop_that_carries_nothing():
    """y_t = sin(w·x_t) row by row, whose w̄ leaves out the factor x_t at every row: no operand is carried from one
    step to the next, so no gradient-not-carried slip is named."""

    class RowScale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return torch.stack([torch.sin(w * x[t]) for t in range(x.shape[0])])

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            c = torch.cos(w * x)
            return g * c * w, (g * c).sum(0)  # x_t left out of w̄'s term at every row

    report = check(RowScale, inputs((4, 3), (3,)))
    assert not report.passed and not report.has("wrong_value", "w"), str(report)


def test_a_long_forward_is_searched_within_its_budget_and_the_report_says_so(monkeypatch):
    """Each run of the search over the forward's terms makes as many torch calls as the forward does; past
    SEARCH_CALLS calls in all the search stops, its findings so far kept, and a note says where it stopped. A
    forward of a few dozen calls is searched in full under the budget as it is."""
    import tapegrad._forward_record as record
    x, d, b = leaky_inputs()
    full = check(leaky_sum("one_step_late"), (x, d, b))
    assert not any("search over the forward's terms stopped" in line for line in str(full).splitlines()), full
    calls = 3 * x.shape[0] + 4  # about what one run of LeakySum.forward makes
    monkeypatch.setattr(record, "SEARCH_CALLS", 3 * calls)
    stopped = check(leaky_sum("one_step_late"), (x, d, b))
    assert not stopped.passed
    note = next(line for line in str(stopped).splitlines() if "search over the forward's terms stopped" in line)
    assert "runs of the forward" in note and "torch calls each" in note, stopped
