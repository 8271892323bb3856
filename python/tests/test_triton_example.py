"""The Triton attention-with-bias example (examples/python/triton_attention_bias.py): the right kernel's O and
gradients match float64 autograd of the composite reference at its dtype's precision, and each wrong variant is
off where and only where it is wrong. The kernel tests need Triton and a CUDA GPU and are skipped without them;
the input checks run anywhere."""

import pytest
import torch

import tapegrad
from triton_attention_bias import DTYPES, inputs, make_triton_attention_bias, max_errors, reference

# Largest |error| allowed for O and every gradient, at B·H = 2, T = 128, d = 64, against float64 autograd of
# reference() on the same rounded inputs: about 4 times the right kernel's largest error, measured on an H200
# (Triton 3.6, PyTorch 2.11): float32 1.1e-6, bfloat16 1.6e-2, float16 1.3e-3 (each dB's). The composite torch ops
# at the same dtypes: 1.0e-6, 3.2e-2, 4.1e-3. At T = 100, d = 40 the right kernel's largest errors were 1.0e-6,
# 9.5e-3, 8.2e-4.
BOUNDS = {torch.float32: 4e-6, torch.bfloat16: 6e-2, torch.float16: 5e-3}
# A slip is off by about a gradient's own size (measured 1.3 to 14), far past every bound.
SLIP_FACTOR = 10

SIXTEEN_BIT = (torch.bfloat16, torch.float16)
# Which gradients each slip spoils, and at which dtypes.
SLIPS = {
    "db_missing_rowsum": ({"dB"}, DTYPES),
    "dk_no_scale": ({"dK"}, DTYPES),
    "dq_scale_twice_16bit": ({"dQ"}, SIXTEEN_BIT),
}


def dtype_id(dtype):
    return str(dtype).removeprefix("torch.")


@pytest.fixture
def cuda_and_triton():
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.usefixtures("cuda_and_triton")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_right_kernel_matches_float64_autograd_of_the_reference(dtype):
    errors = max_errors(make_triton_attention_bias("right").apply, dtype)
    assert max(errors.values()) < BOUNDS[dtype], errors


@pytest.mark.usefixtures("cuda_and_triton")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_the_right_kernel_masks_a_T_and_d_that_fill_no_tile(dtype):
    # T = 100 ends inside the second 64-row block; d = 40 pads to 64 columns.
    errors = max_errors(make_triton_attention_bias("right").apply, dtype, heads=3, t=100, d=40)
    assert max(errors.values()) < BOUNDS[dtype], errors


@pytest.mark.usefixtures("cuda_and_triton")
@pytest.mark.parametrize("variant", sorted(SLIPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_a_slip_spoils_its_gradients_and_no_other(variant, dtype):
    spoiled, dtypes = SLIPS[variant]
    if dtype not in dtypes:
        spoiled = set()
    errors = max_errors(make_triton_attention_bias(variant).apply, dtype)
    bound = BOUNDS[dtype]
    assert {name for name, error in errors.items() if error > SLIP_FACTOR * bound} == spoiled, errors
    assert all(errors[name] < bound for name in errors if name not in spoiled), errors


@pytest.mark.usefixtures("cuda_and_triton")
def test_accumulating_in_16_bits_spoils_dv_and_dk_more_as_T_grows_and_not_at_float32():
    # Measured on an H200, B·H = 1: the error of dK, dV over the right kernel's was 0.65 to 1.0 at T = 128 (two
    # query blocks: one 16-bit rounding more than the store's) and 3.5 to 5.8 at T = 4096, in bfloat16 and float16.
    right = make_triton_attention_bias("right").apply
    low = make_triton_attention_bias("accumulate_low").apply
    assert max_errors(low, torch.float32, heads=1) == max_errors(right, torch.float32, heads=1)
    for dtype in SIXTEEN_BIT:
        ratio = {}
        for t in (128, 4096):
            errors_low, errors_right = (max_errors(apply, dtype, heads=1, t=t) for apply in (low, right))
            assert all(errors_low[name] == errors_right[name] for name in ("O", "dQ", "dB")), \
                (errors_low, errors_right)
            ratio[t] = {name: errors_low[name] / errors_right[name] for name in ("dK", "dV")}
        for name in ("dK", "dV"):
            assert ratio[4096][name] > 2.5 and ratio[4096][name] > 2 * ratio[128][name], (dtype, ratio)


def kernel_inputs(dtype, heads=2, t=128, d=64):
    q, k, v, b, _ = inputs(heads, t, d)
    return tuple(x.to("cuda", dtype).requires_grad_() for x in (q, k, v, b))


@pytest.mark.usefixtures("cuda_and_triton")
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_tapegrad_passes_the_right_kernel_at_its_precision_with_no_tolerance(dtype):
    report = tapegrad.gradcheck(make_triton_attention_bias("right").apply, kernel_inputs(dtype), reference=reference)
    assert report.passed, report
    assert "on cuda" in str(report) and "against the reference reference in float64" in str(report)


@pytest.mark.usefixtures("cuda_and_triton")
@pytest.mark.parametrize("variant", sorted(SLIPS))
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_tapegrad_fails_a_slip_at_the_precisions_it_lives_in_on_its_gradient_alone(variant, dtype):
    spoiled, dtypes = SLIPS[variant]
    report = tapegrad.gradcheck(make_triton_attention_bias(variant).apply, kernel_inputs(dtype), reference=reference)
    names = {"dQ": "q", "dK": "k", "dV": "v", "dB": "b"}
    failing = {names[g] for g in spoiled} if dtype in dtypes else set()
    assert {c.input for c in report.checks if not c.passed} == failing, report
    if variant in ("dk_no_scale", "dq_scale_twice_16bit") and dtype in dtypes:
        assert "scale" in report.kinds, report


def test_bad_inputs_are_refused_by_name_and_shape():
    apply = make_triton_attention_bias().apply
    q = torch.zeros(2, 8, 4)
    with pytest.raises(ValueError, match=r"b has shape \(2, 8, 7\); expected the scores' shape \(2, 8, 8\)"):
        apply(q, q, q, torch.zeros(2, 8, 7))
    with pytest.raises(ValueError, match="k is torch.float64 on cpu, q is torch.float32 on cpu"):
        apply(q, q.double(), q, torch.zeros(2, 8, 8))
    with pytest.raises(ValueError, match="inputs are torch.float64; expected one of"):
        apply(q.double(), q.double(), q.double(), torch.zeros(2, 8, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="inputs are on cpu; the kernel runs on a CUDA device"):
        apply(q, q, q, torch.zeros(2, 8, 8))
    with pytest.raises(ValueError, match="no variant 'wrong'; the variants: right, "):
        make_triton_attention_bias("wrong")
