"""tapegrad.gradcheck against torch.autograd.gradcheck on the attention Function of examples/python/, at the same
settings (float64, eps 1e-6, atol 1e-5, rtol 1e-3, full Jacobians), right and with each planted slip: the time of
each and what each says of a slip.

    PYTHONPATH=build/python /usr/bin/python3 python/tools/python_gradcheck_bench.py [--n 8] [--d 16] [--repeat 5]

Timings are measured, never tested. The figures of the last run are in docs/python.md.
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "python"))

import tapegrad  # noqa: E402
from attention_gradient import SLIPS, inputs, make_attention  # noqa: E402


def best_of(repeat, run):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - t0)
    return min(times), result


def torch_says(fn, xs):
    try:
        torch.autograd.gradcheck(fn, xs, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=False)
        return "passed"
    except Exception as e:  # GradcheckError: the first line names the output and input
        return str(e).splitlines()[0]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--d", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5)
    a = parser.parse_args()
    torch.set_num_threads(1)
    xs = inputs(a.n, a.d)
    print(f"attention Function, Q K V of shape ({a.n}, {a.d}), best of {a.repeat}; torch {torch.__version__}")
    for slip in (None,) + SLIPS:
        fn = make_attention(slip).apply
        t_torch, said = best_of(a.repeat, lambda: torch_says(fn, xs))
        t_ours, report = best_of(a.repeat, lambda: tapegrad.gradcheck(fn, xs, eps=1e-6, atol=1e-5, rtol=1e-3))
        kinds = ", ".join(f"{d.kind}({d.input})" if d.input else d.kind for d in report.diagnoses) or "-"
        print(f"{slip or 'correct':14} torch {t_torch * 1e3:8.1f} ms   tapegrad {t_ours * 1e3:8.1f} ms   "
              f"ratio {t_ours / t_torch:4.2f}")
        print(f"{'':14} torch: {said}")
        print(f"{'':14} tapegrad: {'passed' if report else 'FAILED'}; {kinds}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
