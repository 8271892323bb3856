"""The examples of examples/python/ run, and say what their docstrings say."""

import runpy

import pytest

import tapegrad
from attention_bias import inputs as bias_inputs, make_attention_bias
from layer_norm import inputs as layer_norm_inputs, make_layer_norm
from conftest import SOURCE_DIR

# The scripts with a main(); test_*.py there are an op author's pytest files, run by test_testing.py.
EXAMPLES = sorted(p for p in (SOURCE_DIR / "examples" / "python").glob("*.py") if not p.name.startswith("test_"))


def test_there_are_examples():
    assert {p.name for p in EXAMPLES} >= {"attention_gradient.py", "attention_bias.py", "engine_row_normalize.py"}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_runs(path, capsys):
    main = runpy.run_path(str(path))["main"]
    assert main() == 0
    assert capsys.readouterr().out


def test_the_attention_bias_code_passes_and_its_prose_is_not_linear_in_the_cotangent():
    assert tapegrad.gradcheck(make_attention_bias("code").apply, bias_inputs())
    prose = tapegrad.gradcheck(make_attention_bias("prose").apply, bias_inputs())
    assert not prose
    assert {"q", "k", "b"} <= {d.input for d in prose.diagnoses if d.kind == "nonlinear"}, prose


def test_layer_norm_passes_and_without_its_term_through_rho_is_a_per_row_term_of_x():
    assert tapegrad.gradcheck(make_layer_norm().apply, layer_norm_inputs())
    slip = tapegrad.gradcheck(make_layer_norm("dropped_row_term").apply, layer_norm_inputs())
    assert not slip
    assert "x" in {d.input for d in slip.diagnoses if d.kind == "per_row_term"}, slip
    assert {"w", "b"}.isdisjoint({d.input for d in slip.diagnoses}), slip
