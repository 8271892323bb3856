"""Seeded float64 draws for the measuring sets of python/tests (narrow_heldout2.py, scalar_heldout.py)."""
import torch


def generator(seed):
    return torch.Generator().manual_seed(seed)


def randn(g, *shape, grad=False):
    """Standard normal float64 values of `shape` from generator g, requiring grad where asked."""
    return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_(grad)


def uniform(g, lo, hi, *shape):
    """Uniform float64 values in [lo, hi) of `shape` from generator g."""
    return lo + (hi - lo) * torch.rand(*shape, generator=g, dtype=torch.float64)
