#!/usr/bin/env python3
"""The peak memory of tapegrad.gradcheck(fast_mode=False) against the estimate it is held to before it starts
(tapegrad/_callables.py, require_full_jacobian_memory), one op per process, as the growth of the process's peak
resident memory over the check:

    PYTHONPATH=build/python /usr/bin/python3 python/tools/full_check_memory.py [OP A B]

Without arguments it runs every op of OPS at the sizes in SIZES, each in a child process, and prints one line per
op: m (outputs), n (checked input elements), the growth, the bytes per Jacobian entry and the estimate's ratio to
the growth (at least 1: the estimate bounds the peak)."""

import os
import resource
import subprocess
import sys

import torch
import torch.nn.functional as F

SIZES = {"sum0": (400, 100), "sum0_wide": (50, 400), "wrong_sum0": (200, 100), "softmax": (20, 50),
         "matmul": (50, 40), "layer_norm": (30, 64), "cumsum": (250, 8), "attention": (16, 16), "conv1d": (60, 5),
         "normalize": (40, 40), "wrong_softmax": (20, 50), "cumprod": (300, 6)}


def _t(*shape):
    return torch.randn(*shape, dtype=torch.float64, requires_grad=True)


class _WrongSum(torch.autograd.Function):
    """x.sum(0) whose backward doubles ȳ: a failing check, whose diagnosis runs too."""

    @staticmethod
    def forward(ctx, x):
        ctx.shape = x.shape
        return x.sum(0)

    @staticmethod
    def backward(ctx, g):
        return 2 * g.expand(ctx.shape)


class _WrongSoftmax(torch.autograd.Function):
    """Softmax over the last axis whose backward drops the row term."""

    @staticmethod
    def forward(ctx, x):
        y = torch.softmax(x, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return y * g


def _attention(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v


OPS = {
    "sum0": lambda a, b: (lambda x: x.sum(0), (_t(a, b),)),
    "sum0_wide": lambda a, b: (lambda x: x.sum(0), (_t(a, b),)),
    "wrong_sum0": lambda a, b: (_WrongSum.apply, (_t(a, b),)),
    "softmax": lambda a, b: (lambda x: torch.softmax(x, -1), (_t(a, b),)),
    "matmul": lambda a, b: (lambda x, w: x @ w, (_t(a, b), _t(b, 30))),
    "layer_norm": lambda a, b: (lambda x: F.layer_norm(x, (b,)), (_t(a, b),)),
    "cumsum": lambda a, b: (lambda x: torch.cumsum(x, 0), (_t(a, b),)),
    "attention": lambda a, b: (_attention, (_t(2, a, b), _t(2, a, b), _t(2, a, b))),
    "conv1d": lambda a, b: (lambda x, w: F.conv1d(x, w), (_t(4, 3, a), _t(b, 3, 3))),
    "normalize": lambda a, b: (lambda x: F.normalize(x, dim=-1), (_t(a, b),)),
    "wrong_softmax": lambda a, b: (_WrongSoftmax.apply, (_t(a, b),)),
    "cumprod": lambda a, b: (lambda x: torch.cumprod(x, 0), (_t(a, b),)),
}


def measure(op, a, b):
    import tapegrad
    from tapegrad._gradcheck import _FULL_CHECK_BYTES_PER_ENTRY, _FULL_CHECK_BYTES_PER_INPUT_ELEMENT
    torch.manual_seed(0)
    fn, inputs = OPS[op](a, b)
    with torch.no_grad():
        m = fn(*inputs).numel()
    n = sum(x.numel() for x in inputs)
    estimate = _FULL_CHECK_BYTES_PER_ENTRY * m * n + _FULL_CHECK_BYTES_PER_INPUT_ELEMENT * n
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    report = tapegrad.gradcheck(fn, inputs, fast_mode=False)
    grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    verdict = "passes" if report.passed else "fails "
    print(f"{op:14} {a}x{b:<4} m={m:<5} n={n:<6} {verdict} grew {grew / 2**20:6.0f} MiB, {grew / (m * n):4.0f} B per "
          f"entry; estimate {estimate / 2**20:6.0f} MiB, {estimate / grew:.2f}× the growth", flush=True)


if __name__ == "__main__":
    if len(sys.argv) == 4:
        measure(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
    else:
        for op, (a, b) in SIZES.items():
            subprocess.run([sys.executable, os.path.abspath(__file__), op, str(a), str(b)], check=True)
