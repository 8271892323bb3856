"""A torch op and its C++ twin with the same slip get the same findings (but for those named from the torch op's
forward, where the twin can only say "no known kind", or only its per-row term where the torch op has one). The twin is
the same attention backward claimed as formulas (docs/claims/README.md), which tapegrad evaluates in C++ on its own ops;
the torch op is the Function of examples/python/attention_gradient.py with its forward-mode rule, so that both check VJP
and JVP."""

import pytest

import tapegrad
from attention_gradient import SLIPS, inputs, make_attention


def claim_text(slip):
    """Attention at Q, K, V of shape (5, 4): 1/√d = 0.5. Ω is dS, the gradient of the scores."""
    omega = "A * dA" if slip == "no_row_term" else "A * (dA - sum(A * dA, -1))"
    d_q = "matmul(Omega, k)" if slip == "no_scale_dQ" else "matmul(Omega, k) * 0.5"
    d_k = "matmul(Omega, q) * 0.5" if slip == "transposed_dK" else "matmul(transpose(Omega), q) * 0.5"
    return f"""claim attention_twin
input q: 5, 4
input k: 5, 4
input v: 5, 4
let A = softmax(matmul(q, transpose(k)) * 0.5)
let dA = matmul(g, transpose(v))
let Omega = {omega}
forward matmul(A, v)
vjp q = {d_q}
vjp k = {d_k}
vjp v = matmul(transpose(A), g)
"""


# Named from the torch op's forward (tapegrad/_forward.py), which a claim's twin has as formulas only: where the torch
# op has one of these, the twin says "no known kind" for that input.
FROM_THE_FORWARD = {"term_dropped", "term_added", "term_factor", "wrong_value"}


def findings(report):
    return sorted((d.kind, d.input) for d in report.diagnoses)


def as_the_twin_sees_it(report):
    """The torch op's findings, those named from its forward as the twin has them: "no known kind", or nothing more
    where the input has a per-row term (which the named term goes before)."""
    per_row = {d.input for d in report.diagnoses if d.kind == "per_row_term"}
    return sorted(("unexplained" if kind in FROM_THE_FORWARD else kind, name) for kind, name in findings(report)
                  if not (kind in FROM_THE_FORWARD and name in per_row))


@pytest.mark.parametrize("slip", (None,) + SLIPS)
def test_the_torch_op_and_its_cpp_twin_get_the_same_findings(slip):
    (twin,) = tapegrad.claim(claim_text(slip))
    op = tapegrad.gradcheck(make_attention(slip, with_jvp=True).apply, inputs(5, 4))
    assert bool(op) == bool(twin) == (slip is None)
    assert as_the_twin_sees_it(op) == findings(twin), f"torch:\n{op}\nC++ twin:\n{twin}"


def test_a_claim_that_does_not_parse_is_a_tapegrad_error():
    with pytest.raises(tapegrad.Error):
        tapegrad.claim("claim broken\ninput x: 3\nforward softmax(x\n")
