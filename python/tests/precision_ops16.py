"""Right kernels written in torch ops at their inputs' dtype (no float32 inside: closed-form backwards in bf16 or
fp16 ops), for the block-by-block share of tapegrad/_blocks.py: BUILD, the ops its bound was set on, and HELDOUT,
ops written apart from it and run only to report it.

    from precision_ops16 import BUILD, HELDOUT
    case = BUILD[0]
    fn = case.make("right")
    xs = case.inputs("small", torch.bfloat16, seed=1)      # sizes: "small", "large", "3d"
    case.reference(*xs)                                    # the same math in composite torch ops

Read by python/tools/partial_table.py (--set ops, --set ops_heldout), which adds the slips (one block of x̄ a few
percent off, on the low-precision path).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class Case:
    name: str
    make: object
    reference: object
    inputs: object
    fp16_ok: bool = False


SHAPES = {"small": (64, 32), "large": (512, 128), "3d": (8, 16, 64)}


def _draw(gen, shape, dtype, scale=1.0, shift=0.0):
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale + shift).to(dtype).requires_grad_()


def _x_and_weight(size, dtype, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[size]
    return _draw(gen, shape, dtype, scale), _draw(gen, (shape[-1],), dtype, 0.3, 1.0)


# ---- BUILD: row normalizations and a softmax, the bound's own set ----

def make_layer_norm(variant="right"):
    class LayerNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            mean = x.mean(-1, keepdim=True)
            rstd = torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
            ctx.save_for_backward(x, w, mean, rstd)
            return (x - mean) * rstd * w

        @staticmethod
        def backward(ctx, g):
            x, w, mean, rstd = ctx.saved_tensors
            xhat, p = (x - mean) * rstd, g * w
            gx = rstd * (p - p.mean(-1, keepdim=True) - xhat * (p * xhat).mean(-1, keepdim=True))
            return gx, (g * xhat).reshape(-1, x.shape[-1]).sum(0)
    return LayerNorm.apply


def layer_norm_reference(x, w):
    m = x.mean(-1, keepdim=True)
    return (x - m) / torch.sqrt(((x - m) ** 2).mean(-1, keepdim=True) + 1e-5) * w


def make_softmax(variant="right"):
    class Softmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            y = torch.softmax(x, -1)
            ctx.save_for_backward(y, w)
            return y * w

        @staticmethod
        def backward(ctx, g):
            y, w = ctx.saved_tensors
            p = g * w
            return y * (p - (p * y).sum(-1, keepdim=True)), (g * y).reshape(-1, y.shape[-1]).sum(0)
    return Softmax.apply


def softmax_reference(x, w):
    e = torch.exp(x - x.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True) * w


def make_rms_norm(variant="right"):
    class RMSNorm(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            r = torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6)
            ctx.save_for_backward(x, w, r)
            return x * r * w

        @staticmethod
        def backward(ctx, g):
            x, w, r = ctx.saved_tensors
            p = g * w
            gx = r * p - x * r ** 3 * (p * x).mean(-1, keepdim=True)
            return gx, (g * x * r).reshape(-1, x.shape[-1]).sum(0)
    return RMSNorm.apply


def rms_norm_reference(x, w):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w


BUILD = [Case("layer_norm16", make_layer_norm, layer_norm_reference, _x_and_weight),
         Case("softmax16", make_softmax, softmax_reference, lambda s, d, seed: _x_and_weight(s, d, seed, 2.0)),
         Case("rms_norm16", make_rms_norm, rms_norm_reference, _x_and_weight)]


# ---- HELDOUT: attention, a linear layer with GELU, a log-softmax, a gated unit, a batched matmul ----

ATTENTION_SHAPES = {"small": (2, 2, 16, 16), "large": (2, 4, 64, 32), "3d": (4, 2, 32, 16)}


def make_attention(variant="right"):
    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            scale = 1 / math.sqrt(q.shape[-1])
            p = torch.softmax(q @ k.transpose(-1, -2) * scale, -1)
            ctx.save_for_backward(q, k, v, p)
            return p @ v

        @staticmethod
        def backward(ctx, g):
            q, k, v, p = ctx.saved_tensors
            scale = 1 / math.sqrt(q.shape[-1])
            dv = p.transpose(-1, -2) @ g
            dp = g @ v.transpose(-1, -2)
            ds = p * (dp - (dp * p).sum(-1, keepdim=True))
            return ds @ k * scale, ds.transpose(-1, -2) @ q * scale, dv
    return Attention.apply


def attention_reference(q, k, v):
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    e = torch.exp(s - s.max(-1, keepdim=True).values)
    return e / e.sum(-1, keepdim=True) @ v


def attention_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return tuple(_draw(gen, ATTENTION_SHAPES[size], dtype) for _ in range(3))


GELU_K, GELU_A = math.sqrt(2 / math.pi), 0.044715


def make_linear_gelu(variant="right"):
    class LinearGelu(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w, b):
            h = x @ w.transpose(0, 1) + b
            ctx.save_for_backward(x, w, h)
            return F.gelu(h, approximate="tanh")

        @staticmethod
        def backward(ctx, g):
            x, w, h = ctx.saved_tensors
            t = torch.tanh(GELU_K * (h + GELU_A * h ** 3))
            dgelu = 0.5 * (1 + t) + 0.5 * h * (1 - t * t) * GELU_K * (1 + 3 * GELU_A * h * h)
            dh = g * dgelu
            flat, xs = dh.reshape(-1, dh.shape[-1]), x.reshape(-1, x.shape[-1])
            return dh @ w, flat.transpose(0, 1) @ xs, flat.sum(0)
    return LinearGelu.apply


def linear_gelu_reference(x, w, b):
    h = x @ w.transpose(0, 1) + b
    return 0.5 * h * (1 + torch.tanh(GELU_K * (h + GELU_A * h ** 3)))


def linear_gelu_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[size]
    return (_draw(gen, shape, dtype), _draw(gen, (48, shape[-1]), dtype, 1 / math.sqrt(shape[-1])),
            _draw(gen, (48,), dtype, 0.1))


def make_log_softmax(variant="right"):
    class LogSoftmax(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            y = torch.log_softmax(x, -1)
            ctx.save_for_backward(y)
            return y

        @staticmethod
        def backward(ctx, g):
            y, = ctx.saved_tensors
            return g - torch.exp(y) * g.sum(-1, keepdim=True)
    return LogSoftmax.apply


def log_softmax_reference(x):
    m = x.max(-1, keepdim=True).values
    return x - m - torch.log(torch.exp(x - m).sum(-1, keepdim=True))


def make_gated(variant="right"):
    class Gated(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return a * torch.sigmoid(a) * b

        @staticmethod
        def backward(ctx, g):
            a, b = ctx.saved_tensors
            s = torch.sigmoid(a)
            return g * b * s * (1 + a * (1 - s)), g * a * s
    return Gated.apply


def gated_reference(a, b):
    return a / (1 + torch.exp(-a)) * b


def gated_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    return _draw(gen, SHAPES[size], dtype, 2.0), _draw(gen, SHAPES[size], dtype)


def make_batched_matmul(variant="right"):
    class BatchedMatmul(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x @ w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            return g @ w.transpose(0, 1), x.reshape(-1, x.shape[-1]).transpose(0, 1) @ g.reshape(-1, g.shape[-1])
    return BatchedMatmul.apply


def batched_matmul_reference(x, w):
    return x @ w


def batched_matmul_inputs(size, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    shape = SHAPES[size]
    return _draw(gen, shape, dtype), _draw(gen, (shape[-1], 24), dtype, 1 / math.sqrt(shape[-1]))


HELDOUT = [Case("attention16", make_attention, attention_reference, attention_inputs),
           Case("linear_gelu16", make_linear_gelu, linear_gelu_reference, linear_gelu_inputs),
           Case("log_softmax16", make_log_softmax, log_softmax_reference,
                lambda s, d, seed: (_draw(torch.Generator().manual_seed(seed), SHAPES[s], d, 2.0),)),
           Case("gated16", make_gated, gated_reference, gated_inputs),
           Case("batched_matmul16", make_batched_matmul, batched_matmul_reference, batched_matmul_inputs)]
