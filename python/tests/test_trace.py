"""A Function's backward traced into formulas (tapegrad/_trace.py) for the checker's edit search."""

import numpy as np
import pytest
import torch

import tapegrad
from tapegrad._trace import TracePoint, vjp_formulas, vjp_formulas_of_callable
from attention_gradient import inputs as attention_inputs, make_attention


def gram(slip=None):
    """y = x·xᵀ, x̄ = (ȳ + ȳᵀ)·x; slip "no_transpose": x̄ = ȳ·x + ȳ·x; slip "cumsum": a term added through an op the
    formula language lacks (one that no term of the forward, nor a value of it moved, makes)."""

    class Gram(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x @ x.t()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            if slip == "cumsum":
                return g @ x + g.t() @ x + 0.1 * g.sum() * torch.cumsum(x, 1)
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
    traced = vjp_formulas(fn, TracePoint((q, k, v), [0, 1, 2], ["q", "k", "v"], [q.numpy(), k.numpy(), v.numpy()]), g)
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
    traced = vjp_formulas(gram("cumsum"), TracePoint((x.detach(),), [0], ["x"], [x.detach().numpy()]), np.ones((4, 4)))
    assert isinstance(traced, str) and traced.startswith(
        "the backward could not be traced into formulas: aten.cumsum, which the formula language does not have, at "
        "test_trace.py:"), traced


def test_names_that_are_not_identifiers_are_not_traced_and_the_check_still_runs():
    q, k, v = attention_inputs(n=4, d=4)
    report = tapegrad.gradcheck(make_attention("transposed_dK").apply, (q, k, v), names=["Q[0]", "K[0]", "V[0]"])
    # not traced into formulas (whose names are identifiers); the forward's terms name it (tapegrad/_forward_term.py)
    named = [d.message for d in report.diagnoses if d.kind == "transposed_term" and d.input == "K[0]"]
    assert named and named[0].startswith("x̄ is the forward's rule with ȳ of `q @ k.transpose(-2, -1)`"), report


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
    traced = vjp_formulas(op.__self__, TracePoint(tuple(xs), [0, 1, 2], ["x", "w", "b"], [x.numpy() for x in xs]),
                          np.ones((4, 3)))
    assert traced is not None and traced["vjp"][2] is not None, traced
    assert "sum(g, -2)" in traced["vjp"][2] or any("sum(g, -2)" in f for _, f, _ in traced["lets"]), traced


def causal_attention(slip=None, mask_as="masked_fill"):
    """Causal attention, O = softmax(mask(Q·Kᵀ/√d))·V, with the mask written as researchers write it: masked_fill or
    torch.where with −inf (on either side), made from torch.triu/tril(ones).bool() inside the backward or passed in.
    slip "transposed_dK": dK = dS·Q/√d for dSᵀ·Q/√d."""

    def masked(s, mask):
        if mask_as == "masked_fill":
            return s.masked_fill(mask, float("-inf"))
        if mask_as == "where":
            return torch.where(mask, float("-inf"), s)
        return torch.where(~mask, s, -float("inf"))  # "where_kept": the kept positions first

    def make_mask(n):
        if mask_as == "where_kept":
            return ~torch.tril(torch.ones(n, n)).bool()
        return torch.triu(torch.ones(n, n), diagonal=1).bool()

    class CausalAttention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, mask=None):
            mask = make_mask(q.shape[-2]) if mask is None else mask
            p = torch.softmax(masked(q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5, mask), dim=-1)
            ctx.save_for_backward(q, k, v, mask)
            return p @ v

        @staticmethod
        def backward(ctx, d_out):
            q, k, v, mask = ctx.saved_tensors
            scale = 1 / q.shape[-1] ** 0.5
            s = masked(q @ k.transpose(-2, -1) * scale, mask)
            p = torch.softmax(s, dim=-1)
            d_v = p.transpose(-2, -1) @ d_out
            d_p = d_out @ v.transpose(-2, -1)
            d_s = p * (d_p - (d_p * p).sum(-1, keepdim=True))
            d_s = d_s.masked_fill(mask, 0.0)
            d_q = d_s @ k * scale
            d_k = (d_s if slip == "transposed_dK" else d_s.transpose(-2, -1)) @ q * scale
            return d_q, d_k, d_v, None

    return CausalAttention


@pytest.mark.parametrize("mask_as", ["masked_fill", "where", "where_kept"])
@pytest.mark.parametrize("mask_input", [False, True])
def test_causal_attention_dk_slip_is_named_a_transposed_term_through_the_mask(mask_as, mask_input):
    q, k, v = attention_inputs(n=5, d=4)
    fn = causal_attention(mask_as=mask_as).apply
    args = (q, k, v)
    if mask_input:
        args = (q, k, v, torch.triu(torch.ones(5, 5), diagonal=1).bool())
    assert tapegrad.gradcheck(fn, args)
    report = tapegrad.gradcheck(causal_attention("transposed_dK", mask_as=mask_as).apply, args)
    assert report.has("transposed_term", "k") and not report.has("unexplained"), report
    message = report.find("transposed_term", "k").message if hasattr(report, "find") else \
        [d for d in report.diagnoses if d.kind == "transposed_term"][0].message
    # d_s as the mask's line leaves it (the second value called d_s)
    assert "`d_s_2` (5, 5), made at test_trace.py:" in message and "d_s.masked_fill(mask, 0.0)" in message, message


def test_the_causal_backward_reads_inf_in_its_formulas():
    q, k, v = (x.detach() for x in attention_inputs(n=5, d=4))
    g = np.random.default_rng(0).standard_normal((5, 4))
    traced = vjp_formulas(causal_attention(),
                          TracePoint((q, k, v), [0, 1, 2], ["q", "k", "v"], [q.numpy(), k.numpy(), v.numpy()]), g)
    formulas = dict((n, f) for n, f, _ in traced["lets"])
    assert any(f.startswith("where(") and ", -inf, " in f for f in formulas.values()), formulas
    assert "where(" in formulas["d_s_2"] and ", 0.0, d_s)" in formulas["d_s_2"], formulas


def gram_with(body):
    """y = x·xᵀ with backward body(x, g) → x̄ (right: (g + gᵀ)·x)."""

    class Gram(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x @ x.t()

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return body(x, g)

    return Gram


def in_place_body(slip):
    def body(x, g):
        d = torch.empty_like(x)
        torch.mm(g, x, out=d)          # out=
        d.mul_(2.0)
        d.add_(-1.0 * d)               # d is 0 now... then the real terms
        d.zero_()
        e = torch.zeros_like(x)
        e.copy_(g @ x)
        d += e
        d.add_((g if slip else g.t()) @ x)
        return d
    return body


def view_body(slip):
    def body(x, g):
        g3 = g.unsqueeze(0).view(1, 4, 4).reshape(4, 4).contiguous()
        gt = g3.permute(1, 0) if not slip else g3.expand(4, 4)
        x3 = x.unsqueeze(-1).squeeze(-1)
        return g3 @ x3 + gt.transpose(0, 1).t() @ x3
    return body


@pytest.mark.parametrize("body", [in_place_body, view_body])
def test_in_place_ops_and_views_are_followed(body):
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    assert tapegrad.gradcheck(gram_with(body(False)).apply, (x,))
    report = tapegrad.gradcheck(gram_with(body(True)).apply, (x,))
    assert report.has("transposed_term", "x") and not report.has("unexplained"), report


def test_a_view_written_in_place_after_it_was_taken_is_said():
    def body(x, g):
        d = g @ x
        d_t = d.t()
        d.mul_(2.0)  # d_t sees the new values: a view written through another tensor
        return d_t.t() * 0.5
    x = torch.randn(4, 3, dtype=torch.float64)
    traced = vjp_formulas(gram_with(body), TracePoint((x,), [0], ["x"], [x.numpy()]), np.ones((4, 4)))
    assert isinstance(traced, str) and "a view of a tensor written in place by aten.mul_ at test_trace.py:" in traced, \
        traced


def test_a_slice_the_formulas_lack_leaves_the_tensor_it_was_taken_from_traced():
    def body(x, g):
        d = g @ x
        d[:, :2]  # a view the formulas cannot write: only it is lost, d keeps its formula
        return d * 0.5
    x = torch.randn(4, 3, dtype=torch.float64)
    traced = vjp_formulas(gram_with(body), TracePoint((x,), [0], ["x"], [x.numpy()]), np.ones((4, 4)))
    assert isinstance(traced, dict) and traced["vjp"][0] is not None, traced


def test_rows_written_into_a_constant_buffer_end_the_trace():
    """A buffer of zeros (a constant) written row by row in place: each write reads the buffer's other views again
    as constants, once each (reading one appended it to the tensors seen, and the walk over them did not end)."""
    def body(x, g):
        out = torch.zeros_like(g)
        for t in range(g.shape[0]):
            out[t] = g[t] * 2.0
        return out @ x
    x = torch.randn(4, 3, dtype=torch.float64)
    traced = vjp_formulas(gram_with(body), TracePoint((x,), [0], ["x"], [x.numpy()]), np.ones((4, 4)))
    assert isinstance(traced, (dict, str)), traced


def test_a_buffer_written_row_by_row_keeps_its_constants_linear_in_the_rows():
    """Each write reads the buffer's other views again as constants; a view read again is kept once, so 64 rows make
    a few constants per row (each view kept again at every write doubled them: 131,088 at 16 rows, then no memory)."""
    def body(x, g):
        out = torch.zeros_like(g)
        for t in range(g.shape[0]):
            out[t] = g[t] * 2.0
        return out @ x
    counts = {}
    for rows in (16, 64):
        x = torch.randn(rows, 3, dtype=torch.float64)
        traced = vjp_formulas(gram_with(body), TracePoint((x,), [0], ["x"], [x.numpy()]), np.ones((rows, rows)))
        assert isinstance(traced, dict), traced
        counts[rows] = len(traced["constants"])
    assert counts[64] <= 4 * 64 and counts[64] < 5 * counts[16], counts


def test_a_full_slice_is_the_value_itself():
    def body(x, g):
        return g[:, :] @ x * 2.0
    x = torch.randn(4, 3, dtype=torch.float64)
    traced = vjp_formulas(gram_with(body), TracePoint((x,), [0], ["x"], [x.numpy()]), np.ones((4, 4)))
    assert isinstance(traced, dict) and traced["vjp"][0] is not None, traced


def test_a_sum_over_a_middle_axis_and_unsqueeze_are_traced():
    """y[b, i] = Σ_j x[b, i, j]·w[b, j, i]...: a bias-like sum over the middle axis, dropped, and an unsqueeze."""

    class RowDot(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, a):
            ctx.save_for_backward(x, a)
            return (x @ a).sum(1)  # (b, n, n) @ (b, n, n) summed over the middle axis → (b, n)

        @staticmethod
        def backward(ctx, g):
            x, a = ctx.saved_tensors
            g_full = g.unsqueeze(1).expand(-1, x.shape[1], -1)
            d_x = g_full @ a.transpose(1, 2)
            d_a = x.transpose(1, 2) @ g_full
            return d_x, d_a

    gen = torch.Generator().manual_seed(3)
    x, a = (torch.randn(2, 4, 4, dtype=torch.float64, generator=gen) for _ in range(2))
    g = np.random.default_rng(1).standard_normal((2, 4))
    traced = vjp_formulas(RowDot, TracePoint((x, a), [0, 1], ["x", "a"], [x.numpy(), a.numpy()]), g)
    assert isinstance(traced, dict), traced
    assert "unsqueeze(g, -2)" in str(traced["lets"]), traced

    class Pool(torch.autograd.Function):  # the sum over the middle axis in the backward
        @staticmethod
        def forward(ctx, x):
            return x.unsqueeze(1).expand(-1, 3, -1) * 1.0

        @staticmethod
        def backward(ctx, g):
            return g.sum(dim=1)

    xs = torch.randn(2, 4, dtype=torch.float64)
    traced = vjp_formulas(Pool, TracePoint((xs,), [0], ["x"], [xs.numpy()]), np.ones((2, 3, 4)))
    assert traced["lets"][-1][1] == "squeeze(sum(g, -2), -2)", traced


def test_an_op_the_trace_cannot_follow_is_named_with_its_line_in_the_report():
    x = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
    report = tapegrad.gradcheck(gram("cumsum").apply, (x,))
    message = [d for d in report.diagnoses if d.kind == "unexplained"][0].message
    assert "the backward could not be traced into formulas: aten.cumsum, which the formula language does not have, " \
        "at test_trace.py:" in message and message.endswith("; no edit of the backward was tried)"), message
    assert "test_trace.py:" in message and "torch.cumsum(x, 1)" in message, message


def test_two_values_assigned_on_one_line_keep_their_names():
    def slipped(two_statements):
        class Attention(torch.autograd.Function):
            @staticmethod
            def forward(ctx, q, k, v):
                p = torch.softmax(q @ k.t() * 0.5, dim=-1)
                ctx.save_for_backward(q, k, v, p)
                return p @ v

            @staticmethod
            def backward(ctx, d_out):
                q, k, v, p = ctx.saved_tensors
                if two_statements:
                    dp = d_out @ v.t(); ds = p * (dp - (dp * p).sum(-1, keepdim=True))  # noqa: E702
                else:
                    dp, ds = d_out @ v.t(), None
                    ds = p * (dp - (dp * p).sum(-1, keepdim=True))
                return ds @ k * 0.5, ds @ q * 0.5, p.t() @ d_out

        return Attention

    q, k, v = attention_inputs(n=4, d=4)
    for two in (True, False):
        report = tapegrad.gradcheck(slipped(two).apply, (q, k, v))
        message = [d for d in report.diagnoses if d.kind == "transposed_term"][0].message
        assert message.startswith("x̄ agrees") and "`ds` (4, 4)" in message and "dp_2" not in message, message
    q0, k0, v0 = (t.detach() for t in (q, k, v))
    g = np.random.default_rng(0).standard_normal((4, 4))

    class Pair(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            ctx.save_for_backward(q, k, v)
            return q @ k.t() @ v

        @staticmethod
        def backward(ctx, g):
            q, k, v = ctx.saved_tensors
            a, b = g @ v.t(), g.t() @ q
            return a @ k, b @ v.t().t() * 0 + (q.t() @ g @ v.t()).t(), k @ q.t() @ g * 0 + (q @ k.t()).t() @ g

    traced = vjp_formulas(Pair, TracePoint((q0, k0, v0), [0, 1, 2], ["q", "k", "v"],
                                           [q0.numpy(), k0.numpy(), v0.numpy()]), g)
    names = [n for n, _, _ in traced["lets"]]
    assert "a" in names and "b" in names, traced["lets"]


@pytest.mark.parametrize("wrap", ["lambda", "partial", "module"])
def test_a_wrapped_function_is_traced_with_its_input_names(wrap):
    import functools
    q, k, v = attention_inputs(n=4, d=4)
    fn = make_attention("transposed_dK")
    if wrap == "lambda":
        op = lambda q, k, v: fn.apply(q, k, v)  # noqa: E731
    elif wrap == "partial":
        op = functools.partial(fn.apply, q.detach() * 0 + q.detach())  # q fixed: k and v checked
    else:
        class Wrapper(torch.nn.Module):
            def forward(self, q, k, v):
                return fn.apply(q, k, v)
        op = Wrapper()
    args = (k, v) if wrap == "partial" else (q, k, v)
    names = ["k", "v"] if wrap == "partial" else ["q", "k", "v"]
    report = tapegrad.gradcheck(op, args, names=names)
    assert report.has("transposed_term", "k") and not report.has("unexplained"), report
    message = [d for d in report.diagnoses if d.kind == "transposed_term"][0].message
    assert "`d_s`" in message and "attention_gradient.py:" in message, message


def test_a_callable_with_torch_own_backward_is_traced_without_user_lines():
    """A plain callable's backward is torch's own: its aten ops are written (softmax's, relu's), labelled as torch's,
    and one it cannot write is said to be torch's."""
    x = torch.randn(3, 4, dtype=torch.float64)
    w = torch.randn(4, 4, dtype=torch.float64)
    traced = vjp_formulas_of_callable(lambda x, w: torch.softmax(torch.relu(x @ w), dim=-1),
                                      TracePoint((x, w), [0, 1], ["x", "w"], [x.numpy(), w.numpy()]), np.ones((3, 4)))
    assert isinstance(traced, dict), traced
    backward = [name for name, _, label in traced["lets"] if label == "torch's own backward"]
    assert backward and "traced" not in [name for name, _, _ in traced["lets"]], traced["lets"]
    assert traced["vjp"][0] is not None and traced["vjp"][1] is not None, traced
    said = vjp_formulas_of_callable(lambda x: torch.cumsum(x, 0), TracePoint((x,), [0], ["x"], [x.numpy()]),
                                    np.ones((3, 4)))
    assert said == ("the backward could not be traced into formulas: aten.flip, which the formula language does not "
                    "have, in torch's own backward"), said


@pytest.mark.parametrize("shape", [(2, 5, 4), (2, 2, 5, 4)])
def test_batched_causal_attention_dk_slip_is_named_through_the_broadcast_mask(shape):
    gen = torch.Generator().manual_seed(1)
    xs = tuple(torch.randn(*shape, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(3))
    assert tapegrad.gradcheck(causal_attention(mask_as="where").apply, xs)
    report = tapegrad.gradcheck(causal_attention("transposed_dK", mask_as="where").apply, xs)
    assert report.has("transposed_term", "k") and not report.has("unexplained"), report


def centred(slip=None):
    """y = 3·(x − the row's mean), whose slip adds the mean term where it subtracts it."""

    class Centred(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return 3.0 * (x - x.mean(-1, keepdim=True))

        @staticmethod
        def backward(ctx, g):
            mean = g.mean(-1, keepdim=True)
            return 3.0 * (g + mean if slip == "mean_sign" else g - mean)

    return Centred


def test_a_per_row_term_with_the_wrong_sign_is_named_from_the_forward_and_no_edit_is_searched():
    # The Jacobian's per-row term, of vectors it names (1·1ᵀ: a mean), says what shape the error has in each row; the
    # term of the forward's rule it comes from is named from the forward (one forward and backward per edge), before
    # it. The edit search (a trace and its evaluations, more than the small check itself costs) runs only for an
    # input no kind explains or one whose per-row term names no vectors: its finding would say "once ... → ...".
    report = tapegrad.gradcheck(centred("mean_sign").apply, (torch.randn(4, 5, dtype=torch.float64,
                                                                         requires_grad=True),))
    assert report.kinds[:2] == ["term_sign", "per_row_term"], report
    named = report.diagnoses[0]
    assert "the error is −2 × that term" in named.message and " once " not in named.message, report
    assert "the term of `x.mean(-1, keepdim=True)` in `x - x.mean(-1, keepdim=True)` at test_trace.py:" in named.message
    right = tapegrad.gradcheck(centred().apply, (torch.randn(4, 5, dtype=torch.float64, requires_grad=True),))
    assert right.passed, right


def test_a_row_norm_is_traced_as_the_formulas_norm():
    def body(x, g):
        return g @ x / x.norm(dim=-1, keepdim=True)
    x = torch.randn(4, 3, dtype=torch.float64)
    traced = vjp_formulas(gram_with(body), TracePoint((x,), [0], ["x"], [x.numpy()]), np.ones((4, 4)))
    assert isinstance(traced, dict) and "norm(x, -1)" in str(traced["vjp"][0]) + str(traced["lets"]), traced
