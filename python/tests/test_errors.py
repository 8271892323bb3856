"""Bad input and raising callbacks become Python exceptions naming the op and the shapes, never a crash; a
callback's exception comes out as itself, with its traceback."""

import traceback

import numpy as np
import pytest
import torch

import tapegrad


class Planted(Exception):
    pass


def raising_in_backward(x):
    class Op(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a):
            return a * 2

        @staticmethod
        def backward(ctx, g):
            raise Planted("backward of the planted op")

    return Op.apply(x)


def test_an_exception_in_a_torch_backward_comes_out_with_its_traceback():
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    with pytest.raises(Planted) as caught:
        tapegrad.gradcheck(raising_in_backward, (x,))
    frames = [f.name for f in traceback.extract_tb(caught.value.__traceback__)]
    assert "backward" in frames


def test_an_exception_in_a_numpy_rule_or_forward_comes_out_as_itself():
    def bad_vjp(g, x):
        raise KeyError("the vjp's own error")

    with pytest.raises(KeyError, match="the vjp's own error"):
        tapegrad.gradcheck(np.sin, (np.ones(3),), vjp=bad_vjp)

    def bad_forward(x):
        raise ZeroDivisionError("forward")

    with pytest.raises(ZeroDivisionError):
        tapegrad.gradcheck(bad_forward, (np.ones(3),), vjp=lambda g, x: g)


def test_a_rule_of_the_wrong_shape_names_the_op_and_the_shapes():
    with pytest.raises(tapegrad.Error, match=r"sin.*VJP of input 0 has shape \(2\); expected \(3\)"):
        tapegrad.gradcheck(np.sin, (np.ones(3),), vjp=lambda g, x: np.ones(2), name="sin")


def test_a_torch_op_returning_a_non_tensor_is_a_type_error():
    with pytest.raises(TypeError, match="not a torch.Tensor"):
        tapegrad.gradcheck(lambda x: 3, (torch.ones(2, dtype=torch.float64, requires_grad=True),))


def test_integer_inputs_are_refused_when_checked():
    with pytest.raises(ValueError, match="input 0 has dtype int64"):
        tapegrad.gradcheck(np.sin, (np.ones(3, dtype=np.int64),), vjp=lambda g, x: g, inputs_to_check=[0])


def test_engine_bad_input():
    tape = tapegrad.Tape()
    with pytest.raises(tapegrad.Error, match="int64"):
        tape.leaf(np.ones((2, 3), dtype=np.int64))
    with pytest.raises(tapegrad.Error, match=r"not C-contiguous"):
        tape.leaf(np.ones((3, 4)).T)
    a, b = tape.leaf(np.ones((2, 3))), tape.leaf(np.ones((4, 5)))
    with pytest.raises(tapegrad.Error, match=r"matmul on shapes \(2, 3\), \(4, 5\)"):
        tape.op("matmul", a, b)
    with pytest.raises(tapegrad.Error, match="no op 'nonesuch'"):
        tape.op("nonesuch", a)
    tape.clear()
    with pytest.raises(tapegrad.Error, match="clear"):
        a.value
    with pytest.raises(tapegrad.Error, match="softmax"):
        tape.op("softmax", a)
    assert issubclass(tapegrad.Error, ValueError)


def test_a_var_keeps_its_tape_alive():
    import gc

    v = tapegrad.Tape().leaf(np.arange(3.0))
    gc.collect()
    assert list(v.value) == [0.0, 1.0, 2.0]


def test_an_op_whose_result_cannot_be_allocated_is_a_memory_error_naming_the_op_and_the_shapes():
    """A (6e6, 1) by (1, 6e6) product asks for 288 TB, more than a process can map even where memory is overcommitted:
    std::bad_alloc in C++, a MemoryError here that says which op on which shapes; no node is recorded, and the tape
    goes on working."""
    tape = tapegrad.Tape()
    a, b = tape.leaf(np.ones((6_000_000, 1))), tape.leaf(np.ones((1, 6_000_000)))
    with pytest.raises(MemoryError, match=r"^matmul on shapes \(6000000, 1\), \(1, 6000000\): the memory for its "
                                          r"result and its work could not be allocated \(no node was recorded\)$"):
        tape.op("matmul", a, b)
    assert tape.num_nodes == 0
    y = tape.op("matmul", tape.leaf(np.ones((3, 2))), tape.leaf(np.ones((2, 4))))
    assert y.value.shape == (3, 4) and tape.num_nodes == 1
