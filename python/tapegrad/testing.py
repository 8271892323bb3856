"""tapegrad in an op author's own pytest suite.

    from tapegrad.testing import assert_gradients, cases

    @cases(dtypes=[torch.float64, torch.bfloat16], devices=["cpu", "cuda"], shapes=[(4, 8), (64, 256)])
    def test_my_softmax(dtype, device, shape):
        x = torch.randn(shape, dtype=dtype, device=device)
        assert_gradients(MySoftmax.apply, (x,), reference=torch.softmax if dtype != torch.float64 else None)

assert_gradients runs tapegrad.gradcheck (with edges=True, its edge probes too) and raises an AssertionError whose
message is the report with its diagnosis first, so that pytest shows what is wrong before the table. cases
parametrizes a test over dtypes, devices, shapes (and, with edges=True, the edge probes), and skips (with the
reason) the devices this machine does not have. Every check assert_gradients makes is recorded; run pytest with
`-p tapegrad.pytest_plugin` for one summary table of them at the end of the run.
"""

import itertools
import time
from dataclasses import dataclass

from ._gradcheck import gradcheck


@dataclass
class CheckRecord:
    """One assert_gradients call: the test it ran in, the op's name, the dtype and device of its checked inputs, the
    verdict, the kinds the report named, and its time."""
    test: str
    op: str
    dtype: str
    device: str
    passed: bool
    kinds: list
    seconds: float


# The checks assert_gradients made in this process, in order (tapegrad.pytest_plugin prints them).
RECORDS = []


def assert_gradients(fn, inputs, **options):
    """tapegrad.gradcheck(fn, inputs, **options), with every option gradcheck takes; returns the report when it
    passed, and raises AssertionError with the report, diagnosis first, when it did not."""
    started = time.perf_counter()
    report = gradcheck(fn, inputs, **options)
    RECORDS.append(CheckRecord(_current_test(), report.op or "gradcheck", *_dtype_and_device(inputs),
                               bool(report.passed), list(report.kinds), time.perf_counter() - started))
    if not report.passed:
        raise AssertionError(diagnosis_first(report))
    return report


def diagnosis_first(report):
    """The report's text with its diagnosis lines moved above its table: the title (and its notes), what is wrong,
    then the rows."""
    lines = str(report).rstrip("\n").split("\n")
    if "  diagnosis:" not in lines:
        return "\n".join(lines)
    at = lines.index("  diagnosis:")
    table = next((i for i, line in enumerate(lines) if line.startswith("  input ")), at)
    return "\n".join(lines[:table] + lines[at:] + lines[table:at])


def cases(*, dtypes=(None,), devices=("cpu",), shapes=(None,), edges=None):
    """A pytest parametrization over every combination of dtypes × devices × shapes, passed to the test as the
    arguments `dtype`, `device` and `shape` (those given). A device this machine lacks (cuda without a GPU) is a
    skip that says so, not a pass. edges (True, or a dict of edges declared undefined): each case runs twice, the
    test's argument `edges` None (the check at a random point) and this value (its edge probes too), to pass on to
    assert_gradients(..., edges=edges)."""
    import pytest
    if edges is not None and edges is not False:
        from ._edges import edge_option
        edge_option(edges)
    probes = (None,) if edges is None or edges is False else (None, edges)
    names = [name for name, values in (("dtype", dtypes), ("device", devices), ("shape", shapes), ("edges", probes))
             if values != (None,)]
    params = []
    for dtype, device, shape, edge in itertools.product(dtypes, devices, shapes, probes):
        values = {"dtype": dtype, "device": device, "shape": shape, "edges": edge}
        marks = []
        missing = _missing_device(device)
        if missing:
            marks.append(pytest.mark.skip(reason=missing))
        text = "-".join(_id(values[n]) for n in names)
        params.append(pytest.param(*(values[n] for n in names), marks=marks, id=text))
    return pytest.mark.parametrize(",".join(names), params)


def _missing_device(device):
    if device is None or str(device).startswith("cpu"):
        return None
    import torch
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        return f"no {device} device on this machine"
    return None


def _id(value):
    if value is None:
        return "point"
    if value is True or isinstance(value, dict):
        return "edges"
    if isinstance(value, tuple):
        return "x".join(str(v) for v in value)
    return str(value).replace("torch.", "")


def _dtype_and_device(inputs):
    inputs = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    for x in inputs:
        if hasattr(x, "is_floating_point") and x.is_floating_point():
            return str(x.dtype).replace("torch.", ""), str(x.device)
        if hasattr(x, "dtype") and getattr(x.dtype, "kind", "") == "f":
            return str(x.dtype), "cpu"
    return "", ""


def _current_test():
    import os
    return os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
