"""tapegrad.gradcheck on the held-out ops written as Triton kernels (precision_triton.py): the set verifies itself
(each right kernel matches both references and torch.autograd.gradcheck in float64 on the GPU; each slip changes a
gradient where, and only where, it lives), a right kernel passes at bf16, fp16 and float32, and a slip of every
precision fails at float32 (at 16 bits some of them are smaller than rounding: `python/tools/precision_table.py
--set triton` measures which). Needs Triton and a CUDA GPU; skipped without them."""

import pytest
import torch

import tapegrad

triton = pytest.importorskip("triton")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)

import precision_heldout  # noqa: E402
from precision_triton import CASES  # noqa: E402

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def test_the_set_verifies():
    assert precision_heldout._verify(CASES) == 0


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
def test_right_kernel_passes(case, dtype):
    report = tapegrad.gradcheck(case.make("right"), case.inputs("small", dtype, 0), reference=case.reference, seed=0)
    assert report.passed, str(report)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_slips_of_every_precision_fail_at_float32(case):
    passed = []
    for slip, (_, where) in case.slips.items():
        if where != "all":
            continue
        report = tapegrad.gradcheck(case.make(slip), case.inputs("small", torch.float32, 0),
                                    reference=case.reference, seed=0)
        if report.passed:
            passed.append(slip)
    assert not passed
