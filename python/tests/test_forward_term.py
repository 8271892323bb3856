"""One term of one call written with a value's entries moved (tapegrad/_forward_term.py): ȳ of a gather read
transposed, a recurrence's weight transposed in the gradient it carries, a convolution's kernel not reversed, and a
layout op's permutation left out or moved back along the wrong axes; and a recurrence's tanh′ taken at its output
at every step (tapegrad/_forward_derivative.py). The Functions the report can only name from their forward (no
trace of their backward into formulas follows index_add_, loops or views)."""

import pytest
import torch

from test_forward import check

Function = torch.autograd.Function


def _generator(seed):
    return torch.Generator().manual_seed(seed)


def relative_scores(slip=None):
    """P = σ(q·kᵀ + b[i − j + T − 1]): attention's weights, with a bias looked up by the offset of key from query."""

    class RelativeScores(Function):
        @staticmethod
        def forward(ctx, q, k, table, offsets):
            p = torch.sigmoid(q @ k.T + table[offsets])
            ctx.save_for_backward(q, k, offsets, p)
            ctx.entries = table.shape[0]
            return p

        @staticmethod
        def backward(ctx, g):
            q, k, offsets, p = ctx.saved_tensors
            ds = g * p * (1 - p)
            read = ds.T if slip == "table_from_transposed" else ds  # dS at (i, j) belongs to the offset i − j
            table = torch.zeros(ctx.entries, dtype=g.dtype).index_add_(0, offsets.reshape(-1), read.reshape(-1))
            return ds @ k, ds.T @ q, table, None

    return RelativeScores


def relative_inputs():
    gen, t, d = _generator(5), 5, 3
    q = torch.randn(t, d, dtype=torch.float64, generator=gen).requires_grad_()
    k = torch.randn(t, d, dtype=torch.float64, generator=gen).requires_grad_()
    table = torch.randn(2 * t - 1, dtype=torch.float64, generator=gen).requires_grad_()
    at = torch.arange(t)
    return q, k, table, at[:, None] - at[None, :] + t - 1


def elman(slip=None):
    """h_t = tanh(h_{t−1}·W + x_t), h_{−1} = 0: every state, and the last."""

    class Elman(Function):
        @staticmethod
        def forward(ctx, x, w):
            h = x.new_zeros(x.shape[0], x.shape[2])
            states = []
            for t in range(x.shape[1]):
                h = torch.tanh(h @ w + x[:, t])
                states.append(h)
            states = torch.stack(states, 1)
            ctx.save_for_backward(w, states)
            return states, h

        @staticmethod
        def backward(ctx, g_states, g_last):
            w, states = ctx.saved_tensors
            carried = g_last.clone()  # in the forward pass h_t fed h_{t+1} through W, so now dz_{t+1}·Wᵀ comes back
            gx, gw = torch.zeros_like(states), torch.zeros_like(w)
            for t in reversed(range(states.shape[1])):
                h = states[:, t]
                # tanh′(z) = 1 − tanh(z)² = 1 − h², at the step's pre-activation z (h its value)
                slope = 1 - torch.tanh(h) ** 2 if slip == "slope_at_state" else 1 - h * h
                dz = (g_states[:, t] + carried) * slope
                gx[:, t] = dz
                before = states[:, t - 1] if t > 0 else torch.zeros_like(h)
                gw += before.T @ dz
                carried = dz @ w if slip == "carried_through_w" else dz @ w.T
            return gx, gw

    return Elman


def elman_inputs():
    gen = _generator(7)
    x = torch.randn(2, 5, 3, dtype=torch.float64, generator=gen).requires_grad_()
    w = (0.6 * torch.randn(3, 3, dtype=torch.float64, generator=gen)).requires_grad_()
    return x, w


def shifted_conv(slip=None):
    """y[b, c, t] = Σ_u w[c, u]·x[b, c, t + u]: a depthwise convolution written as a sum of shifted products."""

    class ShiftedConv(Function):
        @staticmethod
        def forward(ctx, x, w):
            width = x.shape[-1] - w.shape[-1] + 1
            ctx.save_for_backward(x, w)
            return sum(w[:, u, None] * x[:, :, u:u + width] for u in range(w.shape[-1]))

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            taps, width = w.shape[-1], g.shape[-1]
            gw = torch.stack([(g * x[:, :, u:u + width]).sum((0, 2)) for u in range(taps)], -1)
            padded = torch.nn.functional.pad(g, (taps - 1, taps - 1))
            # x̄ correlates ȳ with the kernel reversed: x[t] met w[u] at y[t − u]
            kernel = w if slip == "kernel_unreversed" else w.flip(-1)
            gx = sum(kernel[:, u, None] * padded[:, :, u:u + x.shape[-1]] for u in range(taps))
            return gx, gw

    return ShiftedConv


def conv_inputs():
    gen = _generator(11)
    return (torch.randn(2, 3, 7, dtype=torch.float64, generator=gen).requires_grad_(),
            torch.randn(3, 3, dtype=torch.float64, generator=gen).requires_grad_())


def space_to_depth(slip=None):
    """(B, C, H, W) → (B, C·r², H/r, W/r), r = 2: each 2 × 2 block of pixels made channels."""

    class SpaceToDepth(Function):
        @staticmethod
        def forward(ctx, x):
            b, c, h, w = x.shape
            ctx.shape = x.shape
            return x.reshape(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, 4 * c, h // 2, w // 2)

        @staticmethod
        def backward(ctx, g):
            b, c, h, w = ctx.shape
            if slip == "bare_reshape":
                return g.reshape(ctx.shape)
            blocks = g.reshape(b, c, 2, 2, h // 2, w // 2)
            order = (0, 1, 4, 3, 5, 2) if slip == "subpixels_exchanged" else (0, 1, 4, 2, 5, 3)
            return blocks.permute(*order).reshape(ctx.shape)

    return SpaceToDepth


def space_inputs():
    return (torch.randn(1, 2, 4, 6, dtype=torch.float64, generator=_generator(13)).requires_grad_(),)


# (the Function's maker, the slip, its inputs, the input it names, the kind)
CASES = [(relative_scores, "table_from_transposed", relative_inputs, "table", "transposed_term"),
         (elman, "carried_through_w", elman_inputs, "x→y0", "transposed_term"),
         (elman, "slope_at_state", elman_inputs, "w→y1", "wrong_value"),
         (shifted_conv, "kernel_unreversed", conv_inputs, "x", "transposed_term"),
         (space_to_depth, "bare_reshape", space_inputs, "x", "wrong_axis"),
         (space_to_depth, "subpixels_exchanged", space_inputs, "x", "wrong_axis")]


@pytest.mark.parametrize("make, args", [(relative_scores, relative_inputs), (elman, elman_inputs),
                                        (shifted_conv, conv_inputs), (space_to_depth, space_inputs)])
def test_the_right_backwards_pass(make, args):
    report = check(make(), args())
    assert report.passed, report


@pytest.mark.parametrize("make, slip, args, name, kind", CASES)
def test_a_value_moved_in_one_term_is_named(make, slip, args, name, kind):
    report = check(make(slip), args())
    assert not report.passed and report.has(kind, name), report
    assert not any(d.kind == "unexplained" and d.input.split("→")[0] == name.split("→")[0]
                   for d in report.diagnoses), report


def test_what_the_report_says_of_each():
    said = {slip: str(check(make(slip), args())) for make, slip, args, _, _ in CASES}
    assert "ȳ of `q @ k.T + table[offsets]`" in said["table_from_transposed"], said["table_from_transposed"]
    assert "transposed (its axes 0 and 1 exchanged)" in said["table_from_transposed"]
    assert "`w` transposed" in said["carried_through_w"] and "at every one of its 5 runs" in said["carried_through_w"]
    assert "at `w` reversed along its axis 1" in said["kernel_unreversed"]
    assert "taken at the call's own value, tanh′(tanh(u)) where tanh′(u) belongs" in said["slope_at_state"]
    assert "(at every one of its 5 runs)" in said["slope_at_state"]
    assert "left out, its operand passed on reshaped" in said["bare_reshape"]
    assert "with its axes 3 and 5 exchanged" in said["subpixels_exchanged"]


def test_a_function_with_two_outputs_is_named_at_each():
    """The search runs on the outputs joined; the name takes the place of "no known kind" at each output's check."""
    make, slip, args, _, kind = CASES[1]
    report = check(make(slip), args())
    named = {d.input for d in report.diagnoses if d.kind == kind}
    assert {"x→y1", "w→y0", "w→y1"} <= named, report
