"""Ops that break when the axis they reduce over has length 1, each beside its fixed version: BUILD is what the
length-1 probe of tapegrad.gradcheck(..., edges=True) was built on, HELDOUT was written apart and is only measured.
What is expected was written down here before the probe existed (edge_set.EdgeCase's fields):
    buggy: at least one finding of kind "edge" whose message contains every word of `words` and a reproduction line
           containing `repro`;
    fixed: no finding of kind "edge".
HELDOUT_EXPECTED_RATE is the share of HELDOUT's buggy versions expected found and named so, frozen with the set.
"""

import torch

from edge_set import EdgeCase

HELDOUT_EXPECTED_RATE = 2 / 3
WORDS = ("a length of 1",)
REPRO = ".narrow(-1, 0, 1)"


def _randn(*shape, seed=300):
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)).requires_grad_()


# BUILD 1. Standardized with torch.var's default, the sample variance: its n − 1 is 0 at length 1.
def standardize_sample_var(x):
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + 1e-5).sqrt()


def standardize_population_var(x):
    return (x - x.mean(-1, keepdim=True)) / (x.var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()


# BUILD 2. The mean step between neighbours along a row: a mean over n − 1 steps, none at length 1.
def mean_step_naive(x):
    return (x[..., 1:] - x[..., :-1]).mean(-1)


def mean_step_safe(x):
    return (x[..., 1:] - x[..., :-1]).sum(-1) / max(x.shape[-1] - 1, 1)


BUILD = [
    EdgeCase("standardize with the sample variance", standardize_sample_var, standardize_population_var,
             lambda: (_randn(3, 5),), "a length of 1", WORDS, REPRO),
    EdgeCase("mean step between neighbours", mean_step_naive, mean_step_safe, lambda: (_randn(3, 6, seed=301),),
             "a length of 1", WORDS, REPRO),
]


# HELDOUT 1. A layer norm with Bessel's correction, its variance Σ(x − μ)²/(n − 1) + eps: 0/0 at length 1.
def layer_norm_bessel(x):
    c = x - x.mean(-1, keepdim=True)
    return c / ((c * c).sum(-1, keepdim=True) / (x.shape[-1] - 1) + 1e-5).sqrt()


def layer_norm_bessel_guarded(x):
    c = x - x.mean(-1, keepdim=True)
    return c / ((c * c).sum(-1, keepdim=True) / max(x.shape[-1] - 1, 1) + 1e-5).sqrt()


# HELDOUT 2. Attention scaled by 1/√(d − 1) where 1/√d is meant: at d = 1 the scale is 1/0.
def attention_scale_d_minus_1(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / (q.shape[-1] - 1) ** 0.5, -1) @ v


def attention_scale_d(q, k, v):
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, -1) @ v


# HELDOUT 3. A softmax whose temperature is the row's length less one: x/0 at length 1.
def softmax_length_temperature(x):
    return torch.softmax(x / (x.shape[-1] - 1), -1)


def softmax_length_temperature_guarded(x):
    return torch.softmax(x / max(x.shape[-1] - 1, 1), -1)


HELDOUT = [
    EdgeCase("layer norm with Bessel's correction", layer_norm_bessel, layer_norm_bessel_guarded,
             lambda: (_randn(4, 6, seed=310),), "a length of 1", WORDS, REPRO),
    EdgeCase("attention scaled by 1/sqrt(d - 1)", attention_scale_d_minus_1, attention_scale_d,
             lambda: (_randn(5, 4, seed=311), _randn(5, 4, seed=312), _randn(5, 3, seed=313)), "a length of 1",
             WORDS, REPRO),
    EdgeCase("softmax at temperature n - 1", softmax_length_temperature, softmax_length_temperature_guarded,
             lambda: (_randn(3, 5, seed=314),), "a length of 1", WORDS, REPRO),
]
