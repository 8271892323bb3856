"""A slip in a Function's backward named from its forward (tapegrad/_forward.py): the forward differentiated by torch,
one edge of its graph at a time, and the error fitted as a multiple of one edge's term."""

import math

import pytest
import torch

import tapegrad


def inputs(*shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*s, dtype=torch.float64, generator=gen, requires_grad=True) for s in shapes)


def silu(slip=None):
    class SiLU(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            s = torch.sigmoid(x)
            ctx.save_for_backward(x, s)
            return x * s

        @staticmethod
        def backward(ctx, g):
            x, s = ctx.saved_tensors
            if slip == "dropped":  # the product rule's second term, x·σ′(x), left out
                return g * s
            if slip == "twice":
                return g * (s + 2 * x * s * (1 - s))
            return g * (s + x * s * (1 - s))

    return SiLU


def swish(slip=None):
    """y = x·σ(βx) with β a number passed to forward."""

    class Swish(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, beta):
            s = torch.sigmoid(beta * x)
            ctx.save_for_backward(x, s)
            ctx.beta = beta
            return x * s

        @staticmethod
        def backward(ctx, g):
            x, s = ctx.saved_tensors
            beta = 1.0 if slip == "no_beta" else ctx.beta  # the chain rule's inner factor β forgotten
            return g * (s + x * s * (1 - s) * beta), None

    return Swish


def cubic(slip=None):
    """y = x³ − x, with the power rule's exponent written 2 in the slip."""

    class Cubic(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x ** 3 - x

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            n = 2 if slip == "exponent" else 3
            return g * (n * x ** 2 - 1)

    return Cubic


def layer_norm(slip=None):
    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            mu = x.mean(-1, keepdim=True)
            xc = x - mu
            sd = torch.sqrt((xc * xc).mean(-1, keepdim=True) + 1e-5)
            xh = xc / sd
            ctx.save_for_backward(xh, sd, w)
            return xh * w + b

        @staticmethod
        def backward(ctx, g):
            xh, sd, w = ctx.saved_tensors
            gh = g * w
            mean_term = 0 if slip == "no_mean" else gh.mean(-1, keepdim=True)
            dx = (gh - mean_term - xh * (gh * xh).mean(-1, keepdim=True)) / sd
            return dx, (g * xh).sum(0), g.sum(0)

    return LayerNorm


def softmax(slip=None):
    class Softmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            p = torch.softmax(x, dim=-1)
            ctx.save_for_backward(p)
            return p

        @staticmethod
        def backward(ctx, g):
            (p,) = ctx.saved_tensors
            if slip == "no_row_sum":
                return p * g
            if slip == "row_sum_added":
                return p * (g + (p * g).sum(-1, keepdim=True))
            return p * (g - (p * g).sum(-1, keepdim=True))

    return Softmax


def attention(slip=None):
    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            scale = 1 / math.sqrt(q.shape[-1])
            s = q @ k.transpose(-2, -1) * scale
            p = torch.softmax(s, dim=-1)
            ctx.save_for_backward(q, k, v, p)
            ctx.scale = scale
            return p @ v

        @staticmethod
        def backward(ctx, g):
            q, k, v, p = ctx.saved_tensors
            d_p = g @ v.transpose(-2, -1)
            d_s = p * (d_p - (d_p * p).sum(-1, keepdim=True))
            if slip == "dP_for_dS":
                d_s = d_p
            return d_s @ k * ctx.scale, d_s.transpose(-2, -1) @ q * ctx.scale, p.transpose(-2, -1) @ g

    return Attention


def check(fn, args, **options):
    return tapegrad.gradcheck(fn.apply, args, **options)


FORWARD_KINDS = {"term_dropped", "term_added", "term_sign", "term_factor", "wrong_value"}


def test_silu_with_the_product_rules_second_term_dropped_names_that_term():
    report = check(silu("dropped"), inputs((4, 5)))
    d = next(d for d in report.diagnoses if d.kind == "term_dropped")
    assert d.input == "x" and d.check == "vjp"
    assert "the product rule's term through `s` in `x * s`" in d.message
    assert "`s` = `torch.sigmoid(x)`" in d.message
    assert "unexplained" not in report.kinds
    assert str(d) in str(report)


def test_a_term_counted_twice():
    report = check(silu("twice"), inputs((4, 5)))
    d = next(d for d in report.diagnoses if d.kind == "term_added")
    assert "the product rule's term through `s` in `x * s`" in d.message


def test_swish_with_beta_left_out_of_the_inner_term_names_the_missing_factor():
    x, = inputs((4, 5))
    report = check(swish("no_beta"), (x, 1.7))
    d = next(d for d in report.diagnoses if d.kind == "term_factor")
    assert "1/beta (= 1.7) times" in d.message
    assert "the factor beta " in d.message and "(of `beta * x` at test_forward.py:" in d.message
    assert "`torch.sigmoid(beta * x)`" in d.message


def test_a_power_rules_exponent_written_wrong():
    report = check(cubic("exponent"), inputs((4, 5)))
    d = next(d for d in report.diagnoses if d.kind == "term_factor")
    assert "2/3 times" in d.message and "`x ** 3`" in d.message
    assert "the power rule's factor 3 is written 2" in d.message


def test_layer_norm_without_its_mean_term():
    report = check(layer_norm("no_mean"), inputs((3, 5), (5,), (5,)))
    assert not report.passed
    # The per-row kind sees this one from the Jacobian; where it does, it keeps its name.
    assert "per_row_term" in report.kinds or "term_dropped" in report.kinds


def test_softmax_without_its_row_sum_term_names_the_term_before_the_per_row_shape():
    report = check(softmax("no_row_sum"), inputs((4, 5)))
    assert report.kinds[:2] == ["term_dropped", "per_row_term"], str(report)
    dropped = report.diagnoses[0]
    assert dropped.input == "x" and dropped.check == "vjp"
    assert "the quotient rule's term through the denominator `sum`" in dropped.message
    assert "of `torch.softmax(x, dim=-1)` at test_forward.py:" in dropped.message
    assert "α = 1 in every row" in report.diagnoses[1].message  # the shape of the error in each row: y_r·y_rᵀ


def test_at_a_size_checked_by_random_projections_the_named_term_replaces_the_note():
    # 64 × 700: a Jacobian of 44,800² entries, checked along random projections, which show no structure: the term
    # named from the forward takes the place of the note that says so (one report says one thing of an input).
    report = check(softmax("no_row_sum"), inputs((64, 700)))
    assert [(d.kind, d.check) for d in report.diagnoses][:1] == [("term_dropped", "vjp")], report
    assert not any(d.kind == "unexplained" for d in report.diagnoses), report


def test_softmax_with_its_row_sum_term_added_is_a_term_of_the_wrong_sign():
    report = check(softmax("row_sum_added"), inputs((4, 5)))
    assert report.kinds[:2] == ["term_sign", "per_row_term"], str(report)
    assert "the error is −2 × that term" in report.diagnoses[0].message
    assert "the quotient rule's term through the denominator `sum`" in report.diagnoses[0].message


def shifted(slip=None):
    """y = 3x + 2·roll(x, 1) along the rows, whose slip leaves the rolled term out of the backward."""

    class Shifted(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3.0 + x.roll(1, -1) * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * 3.0 if slip == "no_roll" else g * 3.0 + g.roll(-1, -1) * 2.0

    return Shifted


def test_a_term_left_out_where_it_was_the_only_one_names_the_term_before_the_masked_positions():
    # The rolled term's Jacobian lives off the diagonal, where the rule without it gives 0: the Jacobian sees masked
    # positions; the forward names the term that is missing there.
    report = check(shifted("no_roll"), inputs((4, 6)))
    assert report.kinds[:2] == ["term_dropped", "masked_positions"], str(report)
    assert "the term of `x.roll(1, -1) * 2.0` in `x * 3.0 + x.roll(1, -1) * 2.0`" in report.diagnoses[0].message
    assert check(shifted(), inputs((4, 6))).passed


def test_attention_with_dP_for_dS_names_the_softmax_left_out():
    report = check(attention("dP_for_dS"), inputs((4, 3), (4, 3), (4, 3)))
    found = {d.input: d for d in report.diagnoses if d.kind == "wrong_value"}
    assert set(found) == {"q", "k"}, str(report)
    assert "the derivative of `torch.softmax(s, dim=-1)`" in found["q"].message
    assert "the gradient of `p` where the gradient of `s` belongs" in found["q"].message


@pytest.mark.parametrize("make, args", [
    (silu, lambda: inputs((4, 5))),
    (lambda slip=None: swish(slip), lambda: (inputs((4, 5))[0], 1.7)),
    (cubic, lambda: inputs((4, 5))),
    (layer_norm, lambda: inputs((3, 5), (5,), (5,))),
    (softmax, lambda: inputs((4, 5))),
    (attention, lambda: inputs((4, 3), (4, 3), (4, 3))),
])
def test_right_backwards_pass_with_no_finding_from_the_forward(make, args):
    report = check(make(), args())
    assert report.passed, str(report)
    assert not FORWARD_KINDS & set(report.kinds)


def test_at_sizes_where_projections_are_used():
    x, = inputs((64, 700))
    report = check(silu("dropped"), (x,))
    assert report.checks[0].mode == "fast"
    assert "term_dropped" in report.kinds, str(report)


def test_the_report_says_when_the_edges_tried_were_capped(monkeypatch):
    import tapegrad._forward_record as record
    monkeypatch.setattr(record, "MAX_EDGES", 1)
    report = check(silu("dropped"), inputs((4, 5)))
    d = next(d for d in report.diagnoses if d.kind == "term_dropped")
    assert d.message.endswith("(1 of the forward's 3 edges were tried)")


def test_a_forward_that_is_not_torch_code_leaves_the_report_as_it_was():
    class NumpyExp(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.from_numpy(x.detach().numpy().copy() ** 2)
            ctx.save_for_backward(x)
            return y

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            return g * torch.sin(x)

    report = check(NumpyExp, inputs((3, 4)))
    assert not report.passed
    assert not FORWARD_KINDS & set(report.kinds)


def affine_norm(slip=None):
    """y = x̂·w + b with x̂ = x / ‖x‖ per row; the slip's w̄ = Σ ȳ·x reads x where x̂ belongs."""

    class AffineNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            xhat = x / x.norm(dim=-1, keepdim=True)
            ctx.save_for_backward(x, xhat, w)
            return xhat * w + b

        @staticmethod
        def backward(ctx, g):
            x, xhat, w = ctx.saved_tensors
            r = x.norm(dim=-1, keepdim=True)
            gx = g * w
            dx = (gx - xhat * (gx * xhat).sum(-1, keepdim=True)) / r
            dw = (g * (x if slip == "x_for_xhat" else xhat)).sum(0)
            return dx, dw, g.sum(0)

    return AffineNorm


def test_a_term_built_from_the_wrong_value_is_named_by_the_value_read():
    report = check(affine_norm("x_for_xhat"), inputs((4, 5), (5,), (5,)))
    assert not report.passed
    d = next((d for d in report.diagnoses if d.kind == "wrong_value"), None)
    assert d is not None and d.input == "w", str(report)
    assert d.message.startswith("x̄ is the forward's rule with `x` read in place of `xhat` in `xhat * w`"), d.message
    assert check(affine_norm(), inputs((4, 5), (5,), (5,))).passed


def gate(slip=None):
    """y = x·σ(z); the slip's z̄ = ȳ·σ′(z) leaves out the product's other factor x."""

    class Gate(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, z):
            s = torch.sigmoid(z)
            ctx.save_for_backward(x, s)
            return x * s

        @staticmethod
        def backward(ctx, g):
            x, s = ctx.saved_tensors
            dz = g * s * (1 - s)
            return g * s, dz if slip == "no_x" else dz * x

    return Gate


def silu_call(slip=None):
    """y = F.silu(a) with a = x·w; the slip's silu′(a) = σ(a) leaves out the product rule's a·σ′(a)."""

    class SiLUCall(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            a = x @ w
            ctx.save_for_backward(x, w, a)
            return torch.nn.functional.silu(a)

        @staticmethod
        def backward(ctx, g):
            x, w, a = ctx.saved_tensors
            s = torch.sigmoid(a)
            da = g * (s if slip == "sigmoid" else s * (1 + a * (1 - s)))
            return da @ w.T, x.T @ da

    return SiLUCall


def test_a_factor_that_is_a_value_of_the_forward_missing_from_a_term():
    report = check(gate("no_x"), inputs((4, 5), (4, 5)))
    d = next((d for d in report.diagnoses if d.kind == "term_factor"), None)
    assert d is not None and d.input == "z", str(report)
    assert d.message.startswith("x̄ has one term of the forward's rule with the factor `x` missing from it"), d.message
    assert check(gate(), inputs((4, 5), (4, 5))).passed


def test_a_term_inside_one_call_is_named_from_the_call_written_out():
    report = check(silu_call("sigmoid"), inputs((3, 4), (4, 5)))
    d = next((d for d in report.diagnoses if d.kind == "term_dropped"), None)
    assert d is not None, str(report)
    assert "the product rule's term through `sigmoid` in silu = a·sigmoid(a), written out, of " in d.message, d.message
    assert check(silu_call(), inputs((3, 4), (4, 5))).passed


def test_at_size_the_terms_are_fitted_on_the_ops_first_rows():
    """Each run of the search costs the size it runs at: at 512 × 256 the forward is searched on its first two rows,
    and the report says so; the term is the one the search names at a small size."""
    small = check(layer_norm("no_mean"), inputs((3, 16), (16,), (16,)))
    large = check(layer_norm("no_mean"), inputs((512, 256), (256,), (256,)))
    named = next(d for d in large.diagnoses if d.kind == "term_dropped")
    assert named.input == "x" and named.message.startswith("on the first 2 of 512 along y's axis 0: "), large
    assert named.message.split(": ", 1)[1] == next(d.message for d in small.diagnoses if d.kind == "term_dropped")


def test_a_slip_that_does_not_show_on_the_first_rows_is_searched_at_the_whole_size(monkeypatch):
    """A backward wrong past its first rows only (its error on the first two is float64 rounding) is not looked for
    there: the search runs again at the whole size."""
    import tapegrad._forward as forward
    searched = []
    search = forward._name

    def recorded(function_class, fwd, checked, *args, **kwargs):
        searched.append(checked.arrays[0].shape)
        return search(function_class, fwd, checked, *args, **kwargs)
    monkeypatch.setattr(forward, "_name", recorded)

    class Sine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.sin(x)

        @staticmethod
        def backward(ctx, g):
            x, = ctx.saved_tensors
            dx = g * torch.cos(x)
            return torch.cat([dx[:2], 2 * dx[2:]])

    report = check(Sine, inputs((512, 256)))
    assert not report.passed
    assert searched[:2] == [(2, 256), (512, 256)], searched
    assert not any(d.message.startswith("on the first 2 of 512") for d in report.diagnoses), report
