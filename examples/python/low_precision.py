"""A per-feature scale and shift y = x ⊙ γ + β written as a torch.autograd.Function with a 16-bit fast path, checked
at bfloat16 on the CPU.

x is (rows, features), γ and β are (features,), broadcast over the rows (a normalization's affine step). The
backward is x̄ = ȳ ⊙ γ, γ̄ = Σₜ ȳₜ ⊙ xₜ and β̄ = Σₜ ȳₜ, sums over the rows. make_affine(variant) builds it:
- "right": those three at any dtype, the sums accumulated in float32 and rounded once (as torch's sum does).
- "unscaled" (a slip of the 16-bit path alone): for bfloat16 and float16 the backward scales ȳ by 1024 before its
  products, so that small gradients do not underflow, and divides x̄ and β̄ by 1024 again, but not γ̄. At float32
  and float64 it takes the plain path and is right, so a float64 check passes it.
- "accumulate_low" (a precision defect, not a slip): γ̄ and β̄ summed row by row in the input's dtype, as a kernel
  that keeps its accumulator in bf16 does. Each of the n additions rounds to 8 significant bits, so the error grows
  with n; the formula is right, and at float32 the error is float32's.

make_layer_norm(variant) is a fused layer norm over the last axis, y = (x − μ)/σ ⊙ w + b, its statistics and its
backward in float32 inside, its inputs and outputs at their dtype:
- "right": x̄ = (ĝ − mean(ĝ) − x̂ ⊙ mean(ĝ ⊙ x̂))/σ with ĝ = ȳ ⊙ w, w̄ = Σₜ ȳₜ ⊙ x̂ₜ, b̄ = Σₜ ȳₜ.
- "no_mean_16bit" (a slip of the 16-bit path alone): x̄ leaves out mean(ĝ), the mean of the projected gradient. Its
  error is a few times what the composite reference errs at bf16, so a bound loose by a model of rounding passes it.
- "unbiased_backward" (a slip in every precision): the backward recomputes σ with torch.var's default, which divides
  by n − 1 where the forward divides by n, so w̄ is √((n − 1)/n) times what it should be: 0.9961 at 128 features,
  less than half an ulp of bf16 at every element, and of one piece over all of them.
- "last_row_16bit" (a slip of the 16-bit path alone): the last row of x̄ 2% off.

make_layer_norm_in_ops(variant) is the same layer norm written in torch ops at its inputs' dtype, nothing in float32
inside, as an op is first written: at bf16 every one of its ops rounds, and its own roundings move a row of x̄ along
itself by a unit or two of roundoff from one rounding to the next.
- "right": the same formulas.
- "second_row_16bit" (a slip of the 16-bit path alone): the second row of x̄ 2% off.

tapegrad.gradcheck runs each at the inputs' precision and compares its VJP with a float64 reference (the composite
x * g + b, REFERENCE below) on the same rounded inputs, against what rounding at bf16 is measured to explain: how far
that composite errs when its own ops run at bf16.

    PYTHONPATH=build/python:examples/python python3 examples/python/low_precision.py
"""

import torch

import tapegrad

VARIANTS = ("right", "unscaled", "accumulate_low")
GRADIENT_SCALE = 1024.0


def _known(variant, variants):
    """Refuses a variant the op does not have, naming those it has."""
    if variant not in variants:
        raise ValueError(f"no variant {variant!r}; the variants: {', '.join(variants)}")


def make_affine(variant="right"):
    _known(variant, VARIANTS)

    class Affine(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, g, b):
            ctx.save_for_backward(x, g)
            return x * g + b

        @staticmethod
        def backward(ctx, grad):
            x, g = ctx.saved_tensors
            if variant == "accumulate_low":
                gg, gb = torch.zeros_like(g), torch.zeros_like(g)
                for t in range(x.shape[0]):  # each running sum rounds to the input's dtype
                    gg, gb = gg + grad[t] * x[t], gb + grad[t]
                return grad * g, gg, gb
            if variant == "unscaled" and grad.dtype in (torch.bfloat16, torch.float16):
                scaled = grad * GRADIENT_SCALE  # γ̄ below keeps the factor 1024
                return (scaled * g) / GRADIENT_SCALE, (scaled * x).sum(0), scaled.sum(0) / GRADIENT_SCALE
            return grad * g, (grad * x).sum(0), grad.sum(0)

    Affine.__name__ = "affine" if variant == "right" else f"affine[{variant}]"
    return Affine


def REFERENCE(x, g, b):
    return x * g + b


LAYER_NORM_VARIANTS = ("right", "no_mean_16bit", "unbiased_backward", "last_row_16bit")


def make_layer_norm(variant="right"):
    _known(variant, LAYER_NORM_VARIANTS)

    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            xf = x.float()
            mean = xf.mean(-1, keepdim=True)
            rstd = torch.rsqrt(xf.var(-1, unbiased=False, keepdim=True) + 1e-5)
            ctx.save_for_backward(x, w, mean, rstd)
            return ((xf - mean) * rstd * w.float() + b.float()).to(x.dtype)

        @staticmethod
        def backward(ctx, grad):
            x, w, mean, rstd = ctx.saved_tensors
            if variant == "unbiased_backward":  # torch.var's default divides by n − 1, the forward's by n
                rstd = torch.rsqrt(x.float().var(-1, keepdim=True) + 1e-5)
            xhat, g = (x.float() - mean) * rstd, grad.float()
            projected = g * w.float()
            row_mean = projected.mean(-1, keepdim=True)
            if variant == "no_mean_16bit" and x.dtype in (torch.bfloat16, torch.float16):
                row_mean = torch.zeros_like(row_mean)
            gx = rstd * (projected - row_mean - xhat * (projected * xhat).mean(-1, keepdim=True))
            if variant == "last_row_16bit" and x.dtype in (torch.bfloat16, torch.float16) and len(gx) > 64:
                gx[-1] *= 1.02  # the last program of a kernel whose rows do not fill it, scaled by its own constant
            return gx.to(x.dtype), (g * xhat).sum(0).to(w.dtype), g.sum(0).to(w.dtype)

    LayerNorm.__name__ = "layer_norm" if variant == "right" else f"layer_norm[{variant}]"
    return LayerNorm


LAYER_NORM_IN_OPS_VARIANTS = ("right", "second_row_16bit")


def make_layer_norm_in_ops(variant="right"):
    _known(variant, LAYER_NORM_IN_OPS_VARIANTS)

    class LayerNormInOps(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            mean = x.mean(-1, keepdim=True)
            rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
            xhat = (x - mean) * rstd
            ctx.save_for_backward(xhat, w, rstd)
            return xhat * w + b

        @staticmethod
        def backward(ctx, grad):
            xhat, w, rstd = ctx.saved_tensors
            projected = grad * w
            gx = rstd * (projected - projected.mean(-1, keepdim=True)
                         - xhat * (projected * xhat).mean(-1, keepdim=True))
            if variant == "second_row_16bit" and gx.dtype in (torch.bfloat16, torch.float16):
                gx[1] *= 1.02
            return gx, (grad * xhat).sum(0), grad.sum(0)

    LayerNormInOps.__name__ = "layer_norm_in_ops" if variant == "right" else f"layer_norm_in_ops[{variant}]"
    return LayerNormInOps


def LAYER_NORM_REFERENCE(x, w, b):
    mean = x.mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5) * w + b


def layer_norm_inputs(rows=512, features=128, dtype=torch.bfloat16, seed=0):
    return inputs(rows, features, dtype, seed)


def inputs(rows=512, features=16, dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, dtype=torch.float64, generator=gen).to(dtype).requires_grad_()
                 for shape in ((rows, features), (features,), (features,)))


def main():
    reports = [(tapegrad.gradcheck(make_affine(v).apply, inputs(), reference=REFERENCE), v == "right")
               for v in VARIANTS]
    reports += [(tapegrad.gradcheck(make_layer_norm(v).apply, layer_norm_inputs(), reference=LAYER_NORM_REFERENCE),
                 v == "right") for v in LAYER_NORM_VARIANTS]
    reports += [(tapegrad.gradcheck(make_layer_norm_in_ops(v).apply, layer_norm_inputs(),
                                    reference=LAYER_NORM_REFERENCE), v == "right") for v in LAYER_NORM_IN_OPS_VARIANTS]
    for report, _ in reports:
        print(report)
    return 0 if all(report.passed == right for report, right in reports) else 1


if __name__ == "__main__":
    raise SystemExit(main())
