"""One of tapegrad's own ops from numpy: row_normalize, β(x) = x/(1 + ‖x‖) row by row (the β-attention post), with
what `tapegrad explain` knows of it, and its gradient compared with the formula the record gives.

For one row x with r = ‖x‖ and c = 1/(1 + r), β = c·x, and the VJP of a cotangent g is
    x̄ = c·g − c²·⟨x, g⟩/r · x
(docs/derivations.md, section 1), which this script evaluates in numpy beside the tape's backward.
"""

import sys

import numpy as np


def main():
    import tapegrad

    record = tapegrad.explain("row_normalize")
    print(f"{record['op']}: {record['forward']}")
    print(f"  VJP: {record['vjp']}")
    print(f"  JVP: {record['jvp']}")
    print(f"  recorded at {record['recorded_at']}; derived in {', '.join(record['derivation'])}")
    print(f"  second order: {record['second_order']}")

    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((3, 5)), rng.standard_normal((3, 5))
    tape = tapegrad.Tape()
    leaf = tape.leaf(x)
    y = tape.op("row_normalize", leaf)
    tape.backward(y, g)

    r = np.linalg.norm(x, axis=-1, keepdims=True)
    c = 1 / (1 + r)
    by_formula = c * g - c**2 * (x * g).sum(-1, keepdims=True) / r * x
    error = np.abs(leaf.grad - by_formula).max()
    print(f"  tape's x̄ against the formula in numpy: max |difference| = {error:.2e}")
    return 0 if error < 1e-12 else 1


if __name__ == "__main__":
    sys.exit(main())
