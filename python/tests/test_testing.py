"""tapegrad.testing and tapegrad.pytest_plugin: assert_gradients in an op author's pytest file, the report's diagnosis
first, the parametrization over dtypes, devices and shapes, and the summary of the run's checks."""

import os
import subprocess
import sys

import torch

import tapegrad
from conftest import SOURCE_DIR
from tapegrad.pytest_plugin import summary_lines
from tapegrad.testing import CheckRecord, assert_gradients, diagnosis_first

EXAMPLE = SOURCE_DIR / "examples" / "python" / "test_rms_norm_gradients.py"


def test_the_example_test_file_passes_and_the_plugin_lists_every_check():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                          "tapegrad.pytest_plugin", str(EXAMPLE)], capture_output=True, text=True, env=env,
                         cwd=str(EXAMPLE.parent), timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    out = run.stdout
    assert "tapegrad checks" in out, out
    cuda = torch.cuda.is_available()
    # 12 parametrized checks (6 on CUDA, skipped without a GPU) and the planted slip's.
    assert f"{13 if cuda else 7} checks: {12 if cuda else 6} passed, 1 failed" in out, out
    assert ("7 passed, 6 skipped" if not cuda else "13 passed") in out, out
    for dtype in ("float64", "float32", "bfloat16"):
        assert f"test_rms_norm_gradients[{dtype}-cpu-4x8]" in out, out


def test_a_failure_raises_with_the_diagnosis_above_the_table():
    class Doubled(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 3

        @staticmethod
        def backward(ctx, g):
            return g * 6

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    try:
        assert_gradients(Doubled.apply, (x,))
    except AssertionError as failure:
        message = str(failure)
    else:
        raise AssertionError("a wrong backward passed assert_gradients")
    lines = message.split("\n")
    assert lines[0].startswith("Doubled: FAILED"), message
    assert lines.index("  diagnosis:") < next(i for i, line in enumerate(lines) if line.startswith("  input ")), message
    assert "[scale] x, vjp" in message and "c = 2" in message, message


def test_diagnosis_first_keeps_every_line_of_the_report():
    report = tapegrad.gradcheck(lambda x: x * 3, (torch.randn(3, dtype=torch.float64),))
    assert sorted(diagnosis_first(report).split("\n")) == sorted(str(report).rstrip("\n").split("\n"))


def test_the_summary_has_a_row_per_check_and_a_total():
    lines = summary_lines([CheckRecord("t.py::a", "Op", "float32", "cpu", True, [], 0.5),
                           CheckRecord("t.py::b", "Op", "bfloat16", "cuda:0", False, ["scale"], 0.25)])
    assert lines[0].split() == ["test", "op", "dtype", "device", "verdict", "kinds", "seconds"]
    assert lines[1].split() == ["t.py::a", "Op", "float32", "cpu", "passed", "-", "0.50"]
    assert lines[2].split() == ["t.py::b", "Op", "bfloat16", "cuda:0", "FAILED", "scale", "0.25"]
    assert lines[3] == "2 checks: 1 passed, 1 failed, 0.75 s"
