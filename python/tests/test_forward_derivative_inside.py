"""An element-wise call's derivative written wrong inside a composite (σ of attention's scores, tanh of a hidden
layer: the call's output is no input's shape) is named from the forward (tapegrad/_forward_derivative.py,
_wrong_derivative_inside): on derivative_build.py, the set it was built on, and derivative_heldout.py, written apart."""

import pytest

import derivative_build
import derivative_heldout
import tapegrad

SETS = {"build": derivative_build.OPS, "heldout": derivative_heldout.OPS}
CASES = [(s, op, v) for s, ops in SETS.items() for op, (_, slips) in ops.items() for v in ("right",) + tuple(slips)]


def check(set_name, op, variant):
    fn, inputs = SETS[set_name][op][0](variant, 0)
    return tapegrad.gradcheck(fn, inputs)


@pytest.mark.parametrize("set_name,op,variant", CASES)
def test_a_right_op_passes_and_a_slip_fails(set_name, op, variant):
    assert check(set_name, op, variant).passed == (variant == "right")


def test_sigma_for_its_derivative_inside_attention_is_named_with_the_form_written():
    report = check("build", "sigmoid_attention", "sigma_for_derivative")
    named = {d.input: d.message for d in report.diagnoses if d.kind == "term_factor"}
    assert set(named) == {"q", "k"}, report  # v's term does not go through σ′
    assert "written `sigmoid` where sigmoid′ = sigmoid·(1 − sigmoid) belongs" in named["q"]


def test_tanh_square_left_out_inside_a_layer_is_named():
    report = check("build", "tanh_layer", "square_left_out")
    assert any(d.kind == "term_factor" and "written `1 − tanh` where tanh′ = 1 − tanh² belongs" in d.message
               for d in report.diagnoses), report


@pytest.mark.parametrize("set_name", SETS)
def test_every_slip_of_the_sets_is_named_a_derivative_or_a_sign(set_name):
    """As measured when the fit was added: each slip gets term_factor (the derivative written wrong or left out) or,
    for exp′ written −exp, a sign; none is left at "no known kind"."""
    for s, op, variant in CASES:
        if s != set_name or variant == "right":
            continue
        kinds = {d.kind for d in check(s, op, variant).diagnoses}
        assert kinds & {"term_factor", "sign"} and "unexplained" not in kinds, (op, variant, kinds)
