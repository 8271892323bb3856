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


def test_an_input_checked_in_full_beside_a_large_one_keeps_only_its_own_rows():
    """softmax(x / τ) with x of 8 × 512 and a scalar τ: τ's Jacobian (4096 × 1) is checked in full, x's by projections.
    The 4096 rows of the full check keep τ̄ alone; keeping x̄ too (4096 elements a row) took 360 MiB, and 8 GB at
    512 × 256 on a cut of 128 rows. Run in a process of its own, whose peak resident memory is its own."""
    import subprocess
    code = """if True:
        import resource, torch, tapegrad
        x = torch.randn(8, 512, dtype=torch.float64)
        tau = torch.tensor([1.3], dtype=torch.float64)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        report = tapegrad.gradcheck(lambda x, tau: (x / tau).softmax(-1), (x, tau), seed=0)
        assert report.passed, report
        print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)"""
    grew = int(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert grew < 64, f"the check's peak resident memory grew by {grew} MiB"
