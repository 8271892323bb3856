"""The models of rounding that the low-precision check measures under (tapegrad/_rounding.py): AtPrecision (each
torch op of the reference at the dtype), Rounding (a fused kernel's arithmetic, Monte Carlo), OwnRounding (an op
in torch ops at the dtype, its own roundings falling otherwise) and StochasticRounding (its roundings made stochastic,
tapegrad/_averaged.py)."""

import torch

from tapegrad._averaged import StochasticRounding, stochastically_rounded
from tapegrad._rounding import OP_UNITS, UNIT_ROUNDOFF, AtPrecision, Draws, OwnRounding, Rounding


def _at_bf16(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=torch.float64, generator=g).to(torch.bfloat16).to(torch.float64)


def test_results_that_only_place_values_are_left_as_they_are():
    """A select's or a slice's backward places the gradient in a tensor of zeros; a scan's backward in a Python loop
    makes one of the whole input's size per step. Neither model moves such a result, nor a tensor of zeros or ones."""
    g = _at_bf16(4, 5)
    expected_select = torch.zeros(4, 6, 5, dtype=torch.float64)
    expected_select[:, 2] = g
    expected_slice = torch.zeros(4, 6, 5, dtype=torch.float64)
    expected_slice[:, 1:2] = g[:, None]
    for mode in (lambda: AtPrecision(torch.bfloat16), lambda: Rounding(torch.bfloat16, torch.Generator())):
        with mode():
            placed = torch.ops.aten.select_backward(g, [4, 6, 5], 1, 2)
            sliced = torch.ops.aten.slice_backward(g[:, None], [4, 6, 5], 1, 1, 2, 1)
            ones = torch.ones_like(g)
        assert placed.dtype == torch.float64 and torch.equal(placed, expected_select)
        assert torch.equal(sliced, expected_slice)
        assert torch.equal(ones, torch.ones_like(g))


def test_the_fused_model_moves_each_result_by_its_own_draws():
    """Each result r is moved to r·(1 + OP_UNITS·u·ξ) and rounded to float32, ξ uniform in [−1, 1] per element: two
    results of the same op on the same values differ, and neither moves past OP_UNITS + 1 units of float32."""
    t = _at_bf16(64, 32).abs() + 1
    with Rounding(torch.bfloat16, torch.Generator().manual_seed(1)):
        first, second = t * 1.0, t * 1.0
    u = UNIT_ROUNDOFF[torch.float32]
    for moved in (first, second):
        assert float(((moved - t).abs() / t.abs()).max()) <= (OP_UNITS + 1) * u
        assert float((moved != t).double().mean()) > 0.5
    assert float((first != second).double().mean()) > 0.5


def test_a_reference_through_a_row_maximum_passes_a_right_fused_kernel():
    """A softmax reference written x − max(x) without detaching the maximum: its backward divides the maximum's
    gradient by how many elements equal it. The fused model moved the maximum off every element, so that count
    was 0, the model's x̄ was NaN, and a block bound of NaN failed the right kernel."""
    import tapegrad

    class Softmax(torch.autograd.Function):  # a fused kernel: float32 inside, stored at the input's dtype
        @staticmethod
        def forward(ctx, x):
            y = torch.softmax(x.float(), dim=-1)
            ctx.save_for_backward(y)
            return y.to(x.dtype)

        @staticmethod
        def backward(ctx, g):
            (y,) = ctx.saved_tensors
            gy = g.float() * y
            return (gy - y * gy.sum(-1, keepdim=True)).to(g.dtype)

    def reference(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    for seed in range(3):
        x = (2 * torch.randn(8, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)))
        report = tapegrad.gradcheck(Softmax.apply, (x.to(torch.bfloat16).requires_grad_(),), reference=reference,
                                    seed=seed)
        assert report.passed, report
        assert "nan" not in str(report).lower(), report


def test_an_ops_own_roundings_fall_otherwise_by_about_a_rounding_and_a_products_by_what_it_erred():
    """OwnRounding moves each result an op computes at bf16 by up to u·|r| (and rounds it again), a product's by its
    distance from the same product in float32 too (measured), and leaves casts that round nothing,
    selections and tensors of constants as they are. Its draws are its own: the pool it draws from is not changed by
    a draw."""
    u = UNIT_ROUNDOFF[torch.bfloat16]
    a = _at_bf16(64, 512, seed=1).to(torch.bfloat16)
    b = _at_bf16(512, 24, seed=2).to(torch.bfloat16)
    exact = a.double() @ b.double()
    product_error = ((a @ b).double() - exact).abs()
    mode = OwnRounding(torch.bfloat16, torch.Generator().manual_seed(3))
    with mode:
        moved = [a * 1.5 for _ in range(2)]
        products = [a @ b for _ in range(2)]
        same = [a.to(torch.bfloat16), a[:, 3], torch.zeros_like(a)]
    plain = (a * 1.5).double()
    for m in moved:
        assert not torch.equal(m.double(), plain)
        # moved by up to u·|r|, then rounded again: at most a unit of u·|r| more
        assert float(((m.double() - plain).abs() / plain.abs().clamp_min(1e-30)).max()) <= 2 * u + 1e-12
    assert not torch.equal(moved[0], moved[1])
    for p in products:  # each within its measured error, its rounding and a rounding again of what it erred
        spread = product_error + u * exact.abs()
        assert bool(((p.double() - (a @ b).double()).abs() <= 2 * spread + u * p.double().abs()).all())
    assert float((products[0].double() - products[1].double()).abs().max()) > float(u * exact.abs().max())
    assert torch.equal(same[0], a) and torch.equal(same[1], a[:, 3]) and torch.equal(same[2], torch.zeros_like(a))
    pool = mode.draws.pools[(a.device, torch.float32)].clone()
    with mode:
        a * 1.5
    assert torch.equal(pool, mode.draws.pools[(a.device, torch.float32)])


def test_stochastic_rounding_keeps_the_mean_and_the_values_it_can_hold():
    """stochastically_rounded rounds to one of the two neighbours at the dtype, so that the mean over many draws is
    the value itself (to within its standard error, about an ulp over √draws), where rounding to nearest is off by up
    to half an ulp; values the dtype holds (1, 0.5, −4, 3) come back unchanged, at bf16 and at fp16, subnormals too."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(500, dtype=torch.float64, generator=g).float() * 3
    g = Draws(g)
    held = torch.tensor([1.0, 0.5, 2.0, -4.0, 3.0])
    for dtype in (torch.bfloat16, torch.float16):
        u = UNIT_ROUNDOFF[dtype]
        draws = torch.stack([stochastically_rounded(x, dtype, g).double() for _ in range(2000)])
        below, above = x.double() * (1 - 2 * u), x.double() * (1 + 2 * u)
        assert bool(((draws >= torch.minimum(below, above)) & (draws <= torch.maximum(below, above))).all())
        relative = ((draws.mean(0) - x.double()).abs() / x.double().abs()).max()
        nearest = ((x.to(dtype).double() - x.double()).abs() / x.double().abs()).max()
        assert float(relative) < 0.1 * float(nearest)
        for _ in range(20):
            assert torch.equal(stochastically_rounded(held, dtype, g).float(), held)
    tiny = torch.tensor([3e-7] * 4000)  # fp16's subnormals: spacing 2⁻²⁴
    assert abs(float(stochastically_rounded(tiny, torch.float16, g).double().mean()) - 3e-7) < 1e-9


def test_an_op_in_bf16_ops_averaged_over_stochastic_roundings_is_its_formula_in_float32():
    """Under StochasticRounding each result an op computes at bf16 is recomputed in float32 and rounded
    stochastically, in place too: one run errs by its roundings (a sum of products kept at bf16 by torch's CPU
    matmul errs many ulps), the mean over runs approaches the same formula in float32."""
    a = _at_bf16(16, 512, seed=1).to(torch.bfloat16)
    b = _at_bf16(512, 8, seed=2).to(torch.bfloat16)
    exact = a.double() @ b.double()

    def formula():
        c = a @ b
        c.mul_(0.75)
        return torch.exp(c / 8)
    reference = torch.exp(exact * 0.75 / 8)
    runs = []
    for k in range(64):
        with StochasticRounding(torch.bfloat16, torch.Generator().manual_seed(k)):
            runs.append(formula().double())
    one = float(((runs[0] - reference).abs() / reference).max())
    mean = float(((torch.stack(runs).mean(0) - reference).abs() / reference).max())
    assert not torch.equal(runs[0], runs[1])
    assert mean < one / 3, (mean, one)


def test_a_forward_summing_in_float32_one_term_after_another_is_allowed_its_sums_length():
    """y = x·w, its 2,048 terms of random signs added one after the other in float32 (a running sum, as a kernel's
    loop over k keeps it): a right forward erring past what torch's blocked product errs and an ulp of y, by about
    what such a walk does. y's bound names the float32 sum of that length; a forward 0.1% off still fails."""
    import tapegrad

    def make(off=1.0):
        class RunningSumProduct(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, w):
                ctx.save_for_backward(x, w)
                terms = x.float()[:, :, None] * w.float()[None]            # (n, k, m)
                running = torch.zeros_like(terms[:, 0])
                for k in range(terms.shape[1]):  # (torch's cumsum on a CPU adds float32 in float64)
                    running = running + terms[:, k]
                return (off * running).to(x.dtype)

            @staticmethod
            def backward(ctx, g):
                x, w = ctx.saved_tensors
                return (g.float() @ w.float().T).to(x.dtype), (x.float().T @ g.float()).to(w.dtype)
        return RunningSumProduct.apply

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 2048, dtype=torch.float64, generator=g).float().requires_grad_()
    w = torch.randn(2048, 3, dtype=torch.float64, generator=g).float().requires_grad_()
    report = tapegrad.gradcheck(make(), (x, w), reference=lambda x, w: x @ w, seed=0)
    assert report.passed, report
    assert "y: max error" in str(report) and "a float32 sum of 2048 terms" in str(report).split("y: max error")[1]
    assert not tapegrad.gradcheck(make(1.001), (x, w), reference=lambda x, w: x @ w, seed=0).passed
