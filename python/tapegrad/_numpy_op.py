"""A numpy function with rules of its own behind the interface of python/python_function.hpp.

    fn(*xs) → y;  vjp(gout, *xs) → x̄ per input;  jvp(tangents, *xs) → ẏ (None: no JVP);
    hvp(gout, tangents, *xs) → ẋ̄ per input, the tangent of the VJP at a fixed ȳ (None: no second order)
A tangent the checker leaves out (zero) is passed as zeros; a rule for one input may return an array alone.
"""

import numpy as np


def _per_input(result, count):
    if isinstance(result, np.ndarray) or np.isscalar(result):
        result = [result]
    return list(result) if len(result) == count else result


def _with_zeros(arrays, tangents):
    """The tangents, zeros where the checker leaves one out."""
    return [np.zeros_like(a) if t is None else t for a, t in zip(arrays, tangents)]


class NumpyOp:
    def __init__(self, fn, inputs, slots, vjp, jvp, hvp):
        self.fn, self.rule_vjp, self.rule_jvp, self.rule_hvp = fn, vjp, jvp, hvp
        self.fixed, self.slots = list(inputs), slots

    def _args(self, arrays):
        args = list(self.fixed)
        for slot, a in zip(self.slots, arrays):
            args[slot] = a
        return args

    def forward(self, arrays, keep):
        return np.asarray(self.fn(*self._args(arrays)), dtype=np.float64), (arrays if keep else None)

    def vjp(self, arrays, gout):
        return _per_input(self.rule_vjp(gout, *self._args(arrays)), len(arrays))

    def jvp(self, arrays, tangents):
        if self.rule_jvp is None:
            return None
        return self.rule_jvp(_with_zeros(arrays, tangents), *self._args(arrays))

    def vjp_tangent(self, arrays, gout, tangents):
        if self.rule_hvp is None:
            return "no second-order rule given (gradcheck(..., hvp=...))"
        return _per_input(self.rule_hvp(gout, _with_zeros(arrays, tangents), *self._args(arrays)), len(arrays))
