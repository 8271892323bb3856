"""A linear map y = x·Wᵀ written as a torch.autograd.Function with a 16-bit fast path, checked at bfloat16 on the CPU.

The backward of y = x·Wᵀ is x̄ = ȳ·W and W̄ = ȳᵀ·x. make_linear(variant) builds it:
- "right": the same two products at any dtype.
- "unscaled" (a slip of the 16-bit path alone): for bfloat16 and float16 the backward scales ȳ by 1024 before its
  products, so that small gradients do not underflow, and divides x̄ by 1024 again, but not W̄. At float32 and
  float64 it takes the plain path and is right, so a float64 check passes it.
- "accumulate_low" (a precision defect, not a slip): W̄ = Σₜ ȳₜᵀ·xₜ summed row by row in the input's dtype, as a
  kernel that keeps its accumulator in bf16 does. Each of the n additions rounds to 8 significant bits, so the error
  grows with n; the formula is right, and at float32 the error is float32's.

tapegrad.gradcheck runs each at the inputs' precision and compares its VJP with a float64 reference (the composite
x @ w.T, REFERENCE below) on the same rounded inputs, against what rounding at bf16 is measured to explain.

    PYTHONPATH=build/python:examples/python python3 examples/python/low_precision.py
"""

import torch

import tapegrad

VARIANTS = ("right", "unscaled", "accumulate_low")
GRADIENT_SCALE = 1024.0


def make_linear(variant="right"):
    if variant not in VARIANTS:
        raise ValueError(f"no variant {variant!r}; the variants: {', '.join(VARIANTS)}")

    class Linear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w.t()

        @staticmethod
        def backward(ctx, grad):
            x, w = ctx.saved_tensors
            if variant == "accumulate_low":
                gw = torch.zeros_like(w)
                for t in range(x.shape[0]):
                    gw = gw + torch.outer(grad[t], x[t])  # the running sum rounds to the input's dtype
                return grad @ w, gw
            if variant == "unscaled" and grad.dtype in (torch.bfloat16, torch.float16):
                scaled = grad * GRADIENT_SCALE
                return (scaled @ w) / GRADIENT_SCALE, scaled.t() @ x  # W̄ keeps the factor 1024
            return grad @ w, grad.t() @ x

    Linear.__name__ = "linear" if variant == "right" else f"linear[{variant}]"
    return Linear


def REFERENCE(x, w):
    return x @ w.t()


def inputs(rows=512, features=16, outputs=8, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, dtype=torch.float64, generator=gen).to(dtype).requires_grad_()
                 for shape in ((rows, features), (outputs, features)))


def main():
    reports = {v: tapegrad.gradcheck(make_linear(v).apply, inputs(), reference=REFERENCE) for v in VARIANTS}
    for report in reports.values():
        print(report)
    expected = {"right": True, "unscaled": False, "accumulate_low": False}
    return 0 if all(reports[v].passed == expected[v] for v in VARIANTS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
