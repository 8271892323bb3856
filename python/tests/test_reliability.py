"""What the module refuses, and what it never does: nonsense options refused as the CLI refuses them, a report that
checked nothing or whose error is not finite never "passed", one Tape from several threads without a crash, the
memory limit honoured by claim, a non-finite attention scale refused."""

import math
import threading
import time

import numpy as np
import pytest

import tapegrad

SOFTMAX_CLAIM = """claim softmax_rows
input x: 4, 6
forward softmax(x)
vjp x = y * (g - sum(y * g, -1))
"""


def square(x):
    return x * x


def square_vjp(g, x):
    return 2 * x * g


# --- options -------------------------------------------------------------------------------------------------------

BAD_OPTIONS = [
    ("eps", 0.0, "a finite number > 0"),
    ("eps", -1e-6, "a finite number > 0"),
    ("eps", math.nan, "a finite number > 0"),
    ("eps", math.inf, "a finite number > 0"),
    ("atol", -1.0, "a finite number > 0"),
    ("atol", 0.0, "a finite number > 0"),
    ("atol", math.nan, "a finite number > 0"),
    ("atol", math.inf, "a finite number > 0"),
    ("rtol", -1e-3, "a finite number ≥ 0"),
    ("rtol", math.nan, "a finite number ≥ 0"),
    ("rtol", -math.inf, "a finite number ≥ 0"),
    ("projections", 0, "an integer ≥ 1 (random directions per input)"),
    ("projections", -1, "an integer ≥ 1 (random directions per input)"),
    ("projections", 2.5, "an integer ≥ 1 (random directions per input)"),
    ("fast_mode", "yes", "True, False or None"),
]


@pytest.mark.parametrize("option,value,expected", BAD_OPTIONS)
def test_gradcheck_refuses_a_nonsense_option_naming_it_and_its_value(option, value, expected):
    x = np.linspace(0.5, 1.5, 6)
    with pytest.raises(ValueError) as refused:
        tapegrad.gradcheck(square, (x,), vjp=square_vjp, **{option: value})
    message = str(refused.value)
    assert message.startswith(f"gradcheck: {option} must be {expected}, got {value!r}"), message


@pytest.mark.parametrize("option,value,expected", BAD_OPTIONS)
def test_claim_refuses_a_nonsense_option_naming_it_and_its_value(option, value, expected):
    with pytest.raises(ValueError) as refused:
        tapegrad.claim(SOFTMAX_CLAIM, **{option: value})
    message = str(refused.value)
    assert message.startswith(f"claim: {option} must be {expected}, got {value!r}"), message


@pytest.mark.parametrize("order", [0, 3, -1, 1.5, True, "2"])
def test_gradcheck_refuses_an_order_other_than_1_or_2(order):
    x = np.linspace(0.5, 1.5, 6)
    with pytest.raises(ValueError, match=rf"gradcheck: order must be 1 \(VJP and JVP\) or 2 .*, got {order!r}$"):
        tapegrad.gradcheck(square, (x,), vjp=square_vjp, order=order)


def test_the_options_that_make_sense_still_check():
    x = np.linspace(0.5, 1.5, 6)
    assert tapegrad.gradcheck(square, (x,), vjp=square_vjp, rtol=0, projections=1, fast_mode=True)
    assert tapegrad.gradcheck(square, (x,), vjp=square_vjp, order=np.int64(1), fast_mode=np.bool_(False))
    (holds,) = tapegrad.claim(SOFTMAX_CLAIM, rtol=0.0, projections=np.int32(2))
    assert holds, holds


# --- no "passed" for a check that compared nothing or whose error is not finite ------------------------------------

def test_a_vjp_that_returns_inf_fails():
    x = np.linspace(0.5, 1.5, 6)
    report = tapegrad.gradcheck(square, (x,), vjp=lambda g, x: np.full_like(x, np.inf), diagnose=False)
    assert not report.passed, report
    assert "passed" not in str(report).splitlines()[-1], report


def test_a_vjp_that_returns_nan_fails():
    x = np.linspace(0.5, 1.5, 6)
    report = tapegrad.gradcheck(square, (x,), vjp=lambda g, x: np.full_like(x, np.nan), diagnose=False)
    assert not report.passed, report


# The verdict is the C++ checker's (checker/, GradcheckReport::conclude); Python computes none of its own.
# A numeric derivative of inf would make the tolerance atol + rtol·|n| infinite: the check requires both sides finite.
def test_a_step_so_large_the_differences_overflow_never_passes():
    x = np.linspace(0.5, 1.5, 6)
    try:
        with np.errstate(over="ignore"):  # exp(x + 1e300) is inf: that is the point
            report = tapegrad.gradcheck(np.exp, (x,), vjp=lambda g, x: g * np.exp(x), eps=1e300, diagnose=False)
    except ValueError as refused:
        assert "eps" in str(refused)
        return
    assert not report.passed, report


@pytest.mark.parametrize("shape", [(0,), (0, 4), (3, 0)])
def test_an_input_with_no_elements_is_refused_not_passed(shape):
    x = np.zeros(shape)
    with pytest.raises(ValueError, match=rf"gradcheck: input 'x' has shape {re_escape(shape)}, no elements"):
        tapegrad.gradcheck(square, (x,), vjp=lambda g, x: 5 * x * g)


def test_an_empty_input_among_others_is_refused_unless_left_out():
    def f(x, b):
        return x * x + b.sum()

    def vjp(g, x, b):
        return [2 * x * g, np.full_like(b, g.sum())]

    x, b = np.linspace(0.5, 1.5, 6), np.zeros((0,))
    with pytest.raises(ValueError, match=r"input 'b' has shape \(0,\), no elements"):
        tapegrad.gradcheck(f, (x, b), vjp=vjp)
    assert tapegrad.gradcheck(f, (x, b), vjp=lambda g, x, b: 2 * x * g, inputs_to_check=[0])


def re_escape(shape):
    import re
    return re.escape(str(tuple(shape)))


# --- one Tape, several threads -------------------------------------------------------------------------------------

def test_one_tape_from_four_threads_gives_every_result_right_and_never_crashes():
    tape = tapegrad.Tape()
    errors, wrong = [], []
    start = threading.Barrier(4)

    def work(k):
        try:
            rng = np.random.default_rng(k)
            start.wait()
            for i in range(1000):
                a = rng.standard_normal((8, 8))
                x = tape.leaf(a)
                y = tape.op("sum", tape.op("square", tape.op("scale", tape.op("matmul", x, x), s=0.5)), axis=1)
                expect = ((0.5 * (a @ a)) ** 2).sum(axis=1)
                if not np.allclose(y.value, expect, rtol=1e-12, atol=0) or y.shape != (8,) or not y.live:
                    wrong.append((k, i))
                repr(y)
                tape.num_nodes
        except Exception as e:  # noqa: BLE001: reported below with the thread's number
            errors.append((k, e))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a thread is still running: the calls wait for each other"
    assert not errors, errors
    assert not wrong, wrong
    assert tape.num_values == 4 * 1000 * 5 and tape.num_nodes == 4 * 1000 * 4


def test_backward_grad_and_clear_from_other_threads_are_serialised_with_the_ops():
    tape = tapegrad.Tape()
    errors = []
    stop = threading.Event()

    def ops():
        try:
            while not stop.is_set():
                try:
                    x = tape.leaf(np.ones((16, 16)))
                    y = tape.op("sum", tape.op("tanh", x))
                    tape.backward(y)
                    assert np.allclose(x.grad, 1 - np.tanh(1.0) ** 2)
                except tapegrad.Error as e:  # the other thread cleared the tape in between: refused as such
                    assert "clear" in str(e).lower(), e
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    def clears():
        try:
            for _ in range(200):
                tape.clear()
                time.sleep(0.001)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    workers = [threading.Thread(target=ops) for _ in range(3)]
    for t in workers:
        t.start()
    clearing = threading.Thread(target=clears)
    clearing.start()
    clearing.join(timeout=120)
    stop.set()
    for t in workers:
        t.join(timeout=120)
    assert not errors, errors


def test_a_keyword_that_calls_back_into_the_same_tape_is_refused_not_a_deadlock():
    tape = tapegrad.Tape()
    x = tape.leaf(np.ones(3))
    seen = []

    class Scale:
        def __float__(self):
            try:
                tape.op("neg", x)
            except RuntimeError as e:
                seen.append(str(e))
            return 2.0

    y = tape.op("scale", x, s=Scale())
    assert np.all(y.value == 2.0)
    assert seen and "this Tape is in use" in seen[0], seen


def test_an_op_on_vars_of_another_tape_is_refused():
    one, other = tapegrad.Tape(), tapegrad.Tape()
    x = other.leaf(np.ones(3))
    with pytest.raises(ValueError, match=r"exp: input 0 is a Var of another Tape"):
        one.op("exp", x)


# --- memory ---------------------------------------------------------------------------------------------------------

def test_claim_honours_the_memory_limit_as_the_cli_does(monkeypatch):
    big = SOFTMAX_CLAIM.replace("input x: 4, 6", "input x: 3000, 3000")
    monkeypatch.setenv("TAPEGRAD_MEMORY_LIMIT", "1M")
    with pytest.raises(ValueError, match=r"claim the claim text:1 \(9e\+06 input elements; its forward makes 9e\+06, "
                                         r"its output 9e\+06\) needs about 2\.9 GiB of memory, more than the 1\.0 MiB "
                                         r"available; check the formula on smaller"):
        tapegrad.claim(big)
    monkeypatch.setenv("TAPEGRAD_MEMORY_LIMIT", "lots")
    with pytest.raises(ValueError, match=r"TAPEGRAD_MEMORY_LIMIT=lots: expected a size in bytes"):
        tapegrad.claim(SOFTMAX_CLAIM)
    monkeypatch.setenv("TAPEGRAD_MEMORY_LIMIT", "64M")
    (holds,) = tapegrad.claim(SOFTMAX_CLAIM)
    assert holds, holds


# --- attention's scale ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op", ["attention", "tiled_attention", "beta_attention"])
@pytest.mark.parametrize("scale", [math.nan, math.inf, -math.inf])
def test_attention_refuses_a_scale_that_is_not_finite(op, scale):
    rng = np.random.default_rng(0)
    tape = tapegrad.Tape()
    q, k, v = (tape.leaf(rng.standard_normal((1, 2, 4, 3))) for _ in range(3))
    with pytest.raises(ValueError, match=rf"{op}: scale must be a finite number \(0: 1/√d\), got {scale}"):
        tape.op(op, q, k, v, scale=scale)
    assert tape.num_nodes == 0
    y = tape.op(op, q, k, v, scale=0.5)  # a finite scale still runs
    assert np.all(np.isfinite(y.value))


def test_full_jacobians_are_held_against_the_memory_limit(monkeypatch):
    x = np.linspace(0.5, 1.5, 4000)
    monkeypatch.setenv("TAPEGRAD_MEMORY_LIMIT", "16M")
    with pytest.raises(ValueError, match=r"gradcheck square with full Jacobians \(4000 outputs × 4000 input elements\) "
                                         r"needs about 1\.9 GiB of memory, more than the 16\.0 MiB available"):
        tapegrad.gradcheck(square, (x,), vjp=square_vjp, fast_mode=False)
    assert tapegrad.gradcheck(square, (x[:50],), vjp=square_vjp, fast_mode=False)
