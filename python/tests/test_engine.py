"""The engine on numpy arrays: ops by name, backward, grad, jvp, hvp, explain; the GIL released in C++ work."""

import threading
import time

import numpy as np
import pytest

import tapegrad


def softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_softmax_forward_backward_jvp_and_hvp():
    rng = np.random.default_rng(0)
    x, g, t = (rng.standard_normal((3, 5)) for _ in range(3))
    tape = tapegrad.Tape()
    v = tape.leaf(x)
    y = tape.op("softmax", v)
    np.testing.assert_allclose(y.value, softmax(x), rtol=1e-12)
    tape.backward(y, g)
    p = softmax(x)
    np.testing.assert_allclose(v.grad, p * (g - (p * g).sum(-1, keepdims=True)), rtol=1e-10)
    np.testing.assert_allclose(tape.jvp(y, [v], [t]), p * (t - (p * t).sum(-1, keepdims=True)), rtol=1e-10)
    s = tape.op("sum", tape.op("square", tape.op("scale", v, s=0.5)))
    gradient, hv = tape.hvp(s, [v], [t])
    np.testing.assert_allclose(gradient[0], 0.5 * x, rtol=1e-12)
    np.testing.assert_allclose(hv[0], 0.5 * t, rtol=1e-12)


def test_float32_in_float32_out_and_the_leaf_shares_the_array():
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    tape = tapegrad.Tape()
    v = tape.leaf(x)
    x[0, 0] = 5.0  # no copy: the leaf reads the array's memory
    y = tape.op("sum", v)
    assert y.value.dtype == np.float32 and y.value == 20.0
    tape.backward(y)
    assert v.grad.dtype == np.float32 and np.all(v.grad == 1)


def test_explain_is_a_dict_of_the_op_record():
    e = tapegrad.explain("softmax")
    assert e["op"] == "softmax"
    text = str(e)
    assert "ops/" in text
    # the sheet's two lines, each on its own: the VJP in cotangents, the JVP in tangents
    assert e["vjp"] == "per row: x̄ += y ⊙ (ȳ − ⟨y, ȳ⟩)"
    assert e["jvp"] == "per row: ẏ = y ⊙ (ẋ − ⟨y, ẋ⟩)"


def test_explain_trace_gives_each_line_with_its_value_as_numpy():
    run = tapegrad.explain("softmax", trace=True)
    assert run["passed"] and run["gradcheck_passed"]
    x = run["inputs"]["x"]
    assert x.shape == (3, 2) and run["ybar"].shape == (3, 2)
    parts = [part for part, _, _ in run["lines"]]
    assert parts[0] == "forward" and parts[-1].startswith("VJP")
    values = {formula: value for _, formula, value in run["lines"]}
    y = np.exp(x) / np.exp(x).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(values["y = e / rowsum(e)"], y, rtol=1e-14)
    d = (y * run["ybar"]).sum(axis=1, keepdims=True)
    np.testing.assert_allclose(values["x̄ = y ⊙ ȳ − y ⊙ D = y ⊙ (ȳ − D)"], y * (run["ybar"] - d), rtol=1e-12,
                               atol=1e-15)
    assert "the same" in run["text"]
    # At other shapes: the Jacobian, built by forward mode, is diag(y) − y yᵀ in each row's block.
    wide = tapegrad.explain("softmax", trace=True, shapes={"x": (2, 4)})
    assert wide["passed"] and wide["shapes_given"] and wide["inputs"]["x"].shape == (2, 4)
    y = dict((formula, value) for _, formula, value in wide["lines"])["y = e / rowsum(e)"]
    blocks = np.zeros((8, 8))
    for r in range(2):
        blocks[4 * r:4 * r + 4, 4 * r:4 * r + 4] = np.diag(y[r]) - np.outer(y[r], y[r])
    jac, = wide["jacobians"]
    assert jac["agrees"]
    np.testing.assert_allclose(jac["value"], blocks, rtol=1e-12, atol=1e-15)
    # Another seed, other numbers; an op without a worked example is refused.
    assert not np.array_equal(tapegrad.explain("softmax", trace=True, seed=1)["inputs"]["x"], x)
    with pytest.raises(tapegrad.Error, match="the ops that have one"):
        tapegrad.explain("matmul", trace=True)


def test_the_gil_is_released_while_an_op_runs():
    a = np.random.default_rng(0).standard_normal((1200, 1200))
    tape = tapegrad.Tape()
    va = tape.leaf(a)
    ticks = []
    done = threading.Event()

    def count():
        while not done.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    thread = threading.Thread(target=count)
    thread.start()
    time.sleep(0.01)
    t0 = time.perf_counter()
    tape.op("matmul", va, va)  # one call into C++: without the GIL released, the other thread would stand still
    t1 = time.perf_counter()
    done.set()
    thread.join()
    during = sum(t0 < t < t1 for t in ticks)
    assert t1 - t0 < 0.02 or during >= 5, f"the other thread ran {during} times in {t1 - t0:.3f} s of C++ work"


def test_graph_draws_the_tape(tmp_path):
    tape = tapegrad.Tape()
    x = tape.leaf(np.ones((2, 3)))
    tape.backward(tape.op("sum", tape.op("softmax", x)))
    dot = tapegrad.graph(tape)
    assert dot.startswith("digraph") and "softmax" in dot
    svg = tapegrad.graph(tape, tmp_path / "tape.svg")
    assert svg.read_text().lstrip().startswith("<?xml") and "softmax" in svg.read_text()


def test_leaves_named_from_python_are_named_on_the_drawing_and_in_messages():
    """tape.leaf(x, name="q") and tape.constant(x, name=...): the Var's name, its repr, its node on tapegrad.graph
    (as C++ names leaves with DotOptions::names), and Tape.op's message when an op refuses its inputs."""
    rng = np.random.default_rng(0)
    tape = tapegrad.Tape()
    q = tape.leaf(rng.standard_normal((4, 3)), name="q")
    k = tape.leaf(rng.standard_normal((4, 3)), name="k")
    mask = tape.constant(np.zeros((4, 4)), name="mask")
    plain = tape.leaf(rng.standard_normal((4, 3)))
    assert (q.name, k.name, mask.name, plain.name) == ("q", "k", "mask", None)
    assert repr(q).startswith(f"Var #{q.id} 'q' ") and "'" not in repr(plain).split("\n")[0]
    s = tape.op("add", tape.op("matmul", q, tape.op("permute", k, perm=[1, 0])), mask)
    dot = tapegrad.graph(tape)
    assert "<b>leaf</b> q" in dot and "<b>leaf</b> k" in dot and "<b>constant</b> mask" in dot
    with pytest.raises(tapegrad.Error, match=r"matmul on shapes .*\[inputs: 'q', 'k'\]"):
        tape.op("matmul", q, k)
    with pytest.raises(tapegrad.Error, match=r"\[inputs: 'q', input 1\]"):
        tape.op("matmul", q, plain)
    with pytest.raises(tapegrad.Error) as unnamed:
        tape.op("matmul", plain, plain)
    assert "[inputs:" not in str(unnamed.value)
    with pytest.raises(tapegrad.Error, match="name= is empty"):
        tape.leaf(np.ones(2), name="")
    with pytest.raises(tapegrad.Error, match="name= is a int; a name is a string"):
        tape.constant(np.ones(2), name=3)
    assert s.name is None
    tape.clear()  # the names go with the values
    x = tape.leaf(np.ones(2))
    assert x.name is None and x.id == q.id and "<b>leaf</b> q" not in tapegrad.graph(tape)


def test_graph_from_python_draws_small_values_in_full_vjps_and_python_hints():
    tape = tapegrad.Tape()
    x = tape.leaf(np.array([[1.0, 2.0], [3.0, 4.0]]), name="x")
    e = tape.op("exp", x)
    tape.backward(tape.op("sum", e))
    dot = tapegrad.graph(tape)
    assert ">[1, 2]<" in dot and ">[3, 4]<" in dot  # 4 elements: drawn in full
    assert "grad: not kept (tape.retain_grad(v) keeps it)" in dot and "Tape::" not in dot
    assert 'color="#1f3f73">VJP: ' in dot  # exp's VJP on its node
    assert 'color="#1f3f73">VJP: ' not in tapegrad.graph(tape, formulas=False)
    with pytest.raises(tapegrad.Error, match=r"max_nodes=N"):
        tapegrad.graph(tape, max_nodes=2)


def test_every_registered_op_is_callable_by_name():
    assert sorted(tapegrad._tapegrad.registered_ops()) == tapegrad.ops()


def test_attention_by_name_takes_an_optional_bias():
    """tape.op("attention", q, k, v, bias): O = softmax(QKᵀ/√d + B + M)·V, and B̄ = Σ over batch and heads of
    A ⊙ (ȲVᵀ − rowsum(ȲVᵀ ⊙ A)); tiled_attention takes the bias the same way, beta_attention takes none."""
    rng = np.random.default_rng(1)
    tape = tapegrad.Tape()
    q, k, v = (tape.leaf(rng.standard_normal((2, 2, 4, 3))) for _ in range(3))
    b = rng.standard_normal((4, 4))
    bias = tape.leaf(b)
    y = tape.op("attention", q, k, v, bias, causal=True)
    s = q.value @ k.value.swapaxes(-1, -2) / np.sqrt(3) + b + np.triu(np.full((4, 4), -np.inf), 1)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    np.testing.assert_allclose(y.value, a @ v.value, rtol=1e-12, atol=1e-12)
    tiled = tape.op("tiled_attention", q, k, v, bias, causal=True, block=2)
    np.testing.assert_allclose(tiled.value, y.value, rtol=1e-12, atol=1e-12)
    tape.backward(tape.op("sum", y))
    d_a = np.ones_like(y.value) @ v.value.swapaxes(-1, -2)
    d_s = a * (d_a - (d_a * a).sum(-1, keepdims=True))
    np.testing.assert_allclose(bias.grad, d_s.sum((0, 1)), rtol=1e-10, atol=1e-12)
    without = tape.op("attention", q, k, v, causal=True)
    assert np.abs(without.value - y.value).max() > 1e-3
    with pytest.raises(tapegrad.Error, match="beta_attention: takes 3 values, got 4"):
        tape.op("beta_attention", q, k, v, bias)
    with pytest.raises(tapegrad.Error, match="attention: takes 3 or 4 values, got 2"):
        tape.op("attention", q, k)


def test_op_keywords_convert_from_python_and_a_wrong_kind_is_named():
    tape = tapegrad.Tape()
    x = tape.leaf(np.arange(6.0).reshape(2, 3))
    assert tape.op("sum", x, axis=np.int64(1), keepdim=np.bool_(True)).shape == (2, 1)
    assert tape.op("permute", x, perm=(1, 0)).shape == (3, 2)
    assert tape.op("reshape", x, shape=[3, np.int32(2)]).shape == (3, 2)
    assert tape.op("reshape", tape.leaf(np.ones((1, 1))), shape=()).shape == ()
    np.testing.assert_array_equal(tape.op("scale", x, s=np.float32(0.5)).value, np.arange(6.0).reshape(2, 3) / 2)
    with pytest.raises(tapegrad.Error, match=r"sum on shapes \(2, 3\): sum: the keyword axis= must be an integer, "
                                             r"got the number 1.5"):
        tape.op("sum", x, axis=1.5)
    with pytest.raises(tapegrad.Error, match="scale: the keyword s= must be a number, got the string 'two'"):
        tape.op("scale", x, s="two")
    with pytest.raises(tapegrad.Error, match="mlp: form must be exact or tanh, got 'erf'"):
        tape.op("mlp", *(tape.leaf(np.ones(s)) for s in [(2, 3), (4, 3), (4,), (3, 4), (3,)]), form="erf")
    with pytest.raises(tapegrad.Error, match="permute: the keyword perm= holds a float"):
        tape.op("permute", x, perm=[1.0, 0])


def test_linear_and_mlp_take_a_residual_by_name():
    rng = np.random.default_rng(0)
    tape = tapegrad.Tape()
    x, w, r = (tape.leaf(rng.standard_normal(s)) for s in [(4, 3), (2, 3), (4, 2)])
    w1, b1, w2, b2 = (tape.leaf(rng.standard_normal(s)) for s in [(5, 3), (5,), (2, 5), (2,)])
    y = tape.op("linear", x, w, r, residual=True)
    np.testing.assert_array_equal(y.value, tape.op("add", r, tape.op("linear", x, w)).value)
    z = tape.op("mlp", x, w1, b1, w2, b2, r, form="exact", residual=True)
    np.testing.assert_array_equal(z.value, tape.op("add", r, tape.op("mlp", x, w1, b1, w2, b2, form="exact")).value)
    with pytest.raises(tapegrad.Error, match="linear: takes x, W and an optional b, then the residual, got 2 values"):
        tape.op("linear", x, w, residual=True)


def test_ops_with_indices_and_keywords():
    rng = np.random.default_rng(0)
    tape = tapegrad.Tape()
    table = tape.leaf(rng.standard_normal((4, 3)))
    rows = tape.op("embedding", tape.constant(np.array([1, 0, 2], dtype=np.int32)), table)
    both = tape.op("concat", rows, rows, axis=0)
    part = tape.op("slice", both, axis=0, start=1, stop=4)
    loss = tape.op("cross_entropy", part, tape.constant(np.array([0, 1, 2], dtype=np.int32)))
    tape.backward(loss)
    assert table.grad.shape == (4, 3) and np.abs(table.grad[3]).max() == 0  # row 3 is never looked up
    with pytest.raises(tapegrad.Error, match="needs the keyword stop="):
        tape.op("slice", both, axis=0, start=1)
    with pytest.raises(tapegrad.Error, match="int32 tensor of shape \\(3\\) cannot require a gradient"):
        tape.leaf(np.array([1, 2, 3], dtype=np.int32))
