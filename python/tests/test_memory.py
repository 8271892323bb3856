"""Many calls across the boundary leave no references and no memory behind."""

import gc
import resource
import sys

import numpy as np
import torch

import tapegrad


def rss_kib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() // 1024


def test_ten_thousand_engine_calls_keep_refcounts_and_memory():
    x = np.random.default_rng(0).standard_normal((4, 8))
    seed = np.ones((4, 8))
    start_refs = sys.getrefcount(x)

    def run(n):
        for _ in range(n):
            tape = tapegrad.Tape()
            v = tape.leaf(x)
            y = tape.op("softmax", v)
            tape.backward(y, seed)
            v.grad, y.value

    run(500)
    gc.collect()
    before = rss_kib()
    run(10000)
    gc.collect()
    assert sys.getrefcount(x) == start_refs
    assert rss_kib() - before < 8 * 1024, "resident memory grew by more than 8 MiB over 10,000 calls"


def test_two_thousand_gradchecks_keep_refcounts_and_memory():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    a = np.random.default_rng(0).standard_normal(3)
    start = sys.getrefcount(x), sys.getrefcount(a)

    def run(n):
        for _ in range(n):
            assert tapegrad.gradcheck(torch.sin, (x,), diagnose=False)
            assert tapegrad.gradcheck(np.sin, (a,), vjp=lambda g, v: g * np.cos(v))

    run(100)
    gc.collect()
    before = rss_kib()
    run(1000)
    gc.collect()
    assert (sys.getrefcount(x), sys.getrefcount(a)) == start
    assert rss_kib() - before < 16 * 1024, "resident memory grew by more than 16 MiB over 2,000 gradchecks"
