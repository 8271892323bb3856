"""An op author's test file: an RMSNorm written as a torch.autograd.Function, its gradients checked by tapegrad at
every dtype, device and shape it runs in (12 checks; the CUDA ones skip on a machine without a GPU).

    python3 -m pytest -p tapegrad.pytest_plugin examples/python/test_rms_norm_gradients.py

y = x / rms(x) ⊙ w over the last axis, rms(x) = √(mean(x²) + ε). Its backward:
x̄ = (ḡ − x̂·mean(ḡ ⊙ x̂)) / rms, ḡ = ȳ ⊙ w, x̂ = x / rms;  w̄ = Σ over the rows of ȳ ⊙ x̂.
"""

import pytest
import torch

from tapegrad.testing import assert_gradients, cases

EPS = 1e-6


class RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w):
        rms = torch.sqrt(x.float().pow(2).mean(-1, keepdim=True) + EPS)
        x_hat = x.float() / rms
        ctx.save_for_backward(x_hat, rms, w)
        return (x_hat * w.float()).to(x.dtype)

    @staticmethod
    def backward(ctx, y_bar):
        x_hat, rms, w = ctx.saved_tensors
        g = y_bar.float() * w.float()
        x_bar = (g - x_hat * (g * x_hat).mean(-1, keepdim=True)) / rms
        w_bar = (y_bar.float() * x_hat).reshape(-1, x_hat.shape[-1]).sum(0)
        return x_bar.to(y_bar.dtype), w_bar.to(w.dtype)


def rms_norm(x, w):
    """The same map as torch ops: the reference a low-precision check holds the Function to."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


@cases(dtypes=[torch.float64, torch.float32, torch.bfloat16], devices=["cpu", "cuda"], shapes=[(4, 8), (2, 16, 32)])
def test_rms_norm_gradients(dtype, device, shape):
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=generator, dtype=torch.float64)).to(device=device, dtype=dtype)
    # float64 on the CPU: against finite differences; otherwise at that precision against the torch composite.
    reference = None if dtype == torch.float64 and device == "cpu" else rms_norm
    assert_gradients(RMSNorm.apply, (x.requires_grad_(), w.requires_grad_()), names=["x", "w"], reference=reference)


def test_a_wrong_backward_fails_with_its_diagnosis_first():
    class DropsTheMeanTerm(RMSNorm):
        @staticmethod
        def backward(ctx, y_bar):
            x_hat, rms, w = ctx.saved_tensors
            return y_bar * w / rms, (y_bar * x_hat).reshape(-1, x_hat.shape[-1]).sum(0)

    x = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    w = torch.ones(8, dtype=torch.float64, requires_grad=True)
    with pytest.raises(AssertionError) as failure:
        assert_gradients(DropsTheMeanTerm.apply, (x, w), names=["x", "w"])
    message = str(failure.value)
    assert message.index("diagnosis:") < message.index("max_abs_err"), message
