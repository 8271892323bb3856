"""A slip named from a Function's forward is named the same however the Function is handed to gradcheck: its bare
apply, a lambda, a functools.partial, a function called with kwargs=, a module (tapegrad/_forward_record.py,
Inlined)."""

import functools

import pytest
import torch

import tapegrad


class SoftCap(torch.autograd.Function):
    """y = cap·tanh(x/cap), a logit soft-cap; the slip reads tanh(x) where tanh(x/cap) belongs."""

    @staticmethod
    def forward(ctx, x, cap):
        ctx.save_for_backward(x)
        ctx.cap = cap
        return cap * torch.tanh(x / cap)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        t = torch.tanh(x)
        return g * (1 - t * t), None


def soft_cap(x, cap=2.0):
    return SoftCap.apply(x, cap)


class Capped(torch.nn.Module):
    def forward(self, x):
        return SoftCap.apply(x, 2.0)


def x():
    return torch.randn(4, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)


def wrong_value(report):
    found = [d for d in report.diagnoses if d.input == "x" and d.check == "vjp"]
    assert not report.passed and found, report
    return found[0]


def test_the_bare_apply_names_the_slip():
    d = wrong_value(tapegrad.gradcheck(SoftCap.apply, (x(), 2.0), inputs_to_check=[0]))
    assert d.kind == "wrong_value" and "`x / cap`" in d.message, d.message


@pytest.mark.parametrize("how", ["lambda", "partial", "kwargs", "module"])
def test_a_wrapper_names_the_same_slip(how):
    call = {
        "lambda": lambda: tapegrad.gradcheck(lambda x: SoftCap.apply(x, 2.0), (x(),)),
        "partial": lambda: tapegrad.gradcheck(functools.partial(soft_cap, cap=2.0), (x(),)),
        "kwargs": lambda: tapegrad.gradcheck(soft_cap, (x(),), kwargs={"cap": 2.0}),
        "module": lambda: tapegrad.gradcheck(Capped(), (x(),)),
    }[how]
    d = wrong_value(call())
    assert d.kind == "wrong_value" and "`x / cap`" in d.message, d.message


def test_an_apply_the_wrapper_holds_bound_is_not_differentiated_through_its_own_backward():
    # The bound apply is kept in the closure before the check, so the class's apply cannot stand in for it: the
    # forward's terms are not read (the report keeps its structural diagnosis), and nothing is named from the
    # backward under check as if it were the truth.
    apply = SoftCap.apply
    report = tapegrad.gradcheck(lambda x: apply(x, 2.0), (x(),))
    assert not report.passed, report
    assert not any(d.kind == "wrong_value" for d in report.diagnoses), report
    assert SoftCap.apply == apply and "apply" not in SoftCap.__dict__  # the class is as it was


def test_a_module_s_backward_is_traced_and_edited_as_its_function_s():
    # The edit search reads the backward traced into formulas; through a module it finds the Function behind the
    # module's forward, as it does behind a lambda.
    import researcher_ops
    logsumexp = researcher_ops.make("logsumexp", "grad_broadcast_wrong")

    class Module(torch.nn.Module):
        def forward(self, x):
            return logsumexp.apply(x)

    inputs = researcher_ops.inputs("logsumexp", "small")
    bare, wrapped = (tapegrad.gradcheck(fn, inputs) for fn in (logsumexp.apply, Module()))
    assert [d.kind for d in wrapped.diagnoses] == [d.kind for d in bare.diagnoses] == ["wrong_axis"], wrapped
