"""A torch callable behind the interface of python/python_function.hpp: its rules are torch's autograd.

    forward      fn on float64 tensors over the checker's arrays (torch.from_numpy: no copy); when the node is
                 recorded, with grad enabled, keeping (xs, y) for the rules
    vjp          x̄ = torch.autograd.grad(y, xs, ȳ): the op's backward (a Function's hand-written one)
    jvp          forward-mode AD (dual tensors); None when the op has none, e.g. a Function without `jvp`
    vjp_tangent  ẋ̄ = ∂/∂x ⟨grad(⟨ȳ, f(x)⟩, x, create_graph=True), ẋ⟩: double backward; a str naming the reason
                 when the backward is not differentiable
    vjp_formulas the op's backward as tapegrad formulas (tapegrad/_trace.py), for the checker's edit search: a
                 Function's forward and backward called directly, any other callable through autograd; where
                 they cannot be written, a str saying why (the aten op and the line), which the report adds
In the second-order check a Function without `jvp` gets its tangent ẏ = Jẋ from the backward instead
(∂/∂ȳ ⟨Jᵀȳ, ẋ⟩), which the forward-over-reverse sweep needs only to carry on.
"""

import torch
import torch.autograd.forward_ad as fwAD


def _numpy(t):
    """A torch tensor's values as a float64 numpy array, apart from any graph."""
    return t.detach().to(torch.float64).numpy()


def _inner_product(grads, tangents, like):
    """Σᵢ ⟨gᵢ, tᵢ⟩ over the gradients that depend on what is differentiated (a scalar of like's dtype)."""
    return sum(((g * torch.from_numpy(t)).sum() for g, t in zip(grads, tangents)
                if g is not None and t is not None and g.requires_grad), torch.zeros((), dtype=like.dtype))


def _lacks_forward_mode(error):
    text = str(error)
    return isinstance(error, NotImplementedError) or "jvp" in text or "forward AD" in text or "forward-mode" in text


class TorchOp:
    def __init__(self, fn, inputs, slots, name, second_order=False):
        self.fn, self.name = fn, name
        self.slots = slots
        self.fixed = [x.detach().to(torch.float64) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                      for x in inputs]
        self.second_order = second_order
        self.no_forward_mode = None  # why forward mode failed, once it has

    def _call(self, xs):
        args = list(self.fixed)
        for slot, x in zip(self.slots, xs):
            args[slot] = x
        y = self.fn(*args)
        if isinstance(y, (tuple, list)):
            if len(y) != 1:
                raise TypeError(f"tapegrad.gradcheck: the op returns {len(y)} outputs; it checks one "
                                "(wrap it: lambda *x: fn(*x)[i])")
            y = y[0]
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"tapegrad.gradcheck: the op returns {type(y).__name__}, not a torch.Tensor")
        return y

    def vjp_formulas(self, arrays, gout, names):
        from ._gradcheck import _function_class
        from ._trace import vjp_formulas, vjp_formulas_of_callable
        function_class = _function_class(self.fn)
        try:
            if function_class is not None:
                return vjp_formulas(function_class, self.fixed, self.slots, names, arrays, gout)
            return vjp_formulas_of_callable(self.fn, self.fixed, self.slots, names, arrays, gout)
        except Exception as error:  # the formulas only add a diagnosis: without them the report stands as it is
            return f"the backward could not be traced into formulas: {type(error).__name__}: {error}"

    def forward(self, arrays, keep):
        xs = [torch.from_numpy(a) for a in arrays]
        if not keep:
            with torch.no_grad():
                y = self._call(xs)
            return _numpy(y), None
        xs = [x.requires_grad_() for x in xs]
        with torch.enable_grad():
            y = self._call(xs)
        return _numpy(y), (xs, y)

    def vjp(self, state, gout):
        xs, y = state
        if not y.requires_grad:
            return [None] * len(xs)
        grads = torch.autograd.grad(y, xs, torch.from_numpy(gout).to(y.dtype), retain_graph=True, allow_unused=True)
        return [None if g is None else _numpy(g) for g in grads]

    def jvp(self, state, tangents):
        if self.no_forward_mode is not None:
            return self._jvp_by_double_backward(state, tangents) if self.second_order else None
        xs, _ = state
        try:
            with fwAD.dual_level():
                duals = [fwAD.make_dual(x.detach(), torch.from_numpy(t) if t is not None else torch.zeros_like(x))
                         for x, t in zip(xs, tangents)]
                y = self._call(duals)
                tangent = fwAD.unpack_dual(y).tangent
                return _numpy(torch.zeros_like(y) if tangent is None else tangent)
        except (NotImplementedError, RuntimeError) as error:
            if not _lacks_forward_mode(error):
                raise
            self.no_forward_mode = str(error)
        if not self.second_order:
            return None
        return self._jvp_by_double_backward(state, tangents)

    def _jvp_by_double_backward(self, state, tangents):
        xs, y = state
        u = torch.zeros_like(y, requires_grad=True)
        with torch.enable_grad():
            grads = torch.autograd.grad(y, xs, u, create_graph=True, allow_unused=True)
            s = _inner_product(grads, tangents, y)
            if not s.requires_grad:
                return _numpy(torch.zeros_like(y))
            (jt,) = torch.autograd.grad(s, u, allow_unused=True)
        return _numpy(torch.zeros_like(y) if jt is None else jt)

    def vjp_tangent(self, state, gout, tangents):
        xs, y = state
        if not y.requires_grad:
            return [None] * len(xs)
        u = torch.from_numpy(gout).to(y.dtype).requires_grad_()
        try:
            with torch.enable_grad():
                grads = torch.autograd.grad(y, xs, u, create_graph=True, allow_unused=True)
                # Jᵀȳ depends on ȳ linearly: a backward built from differentiable ops leaves a graph behind it.
                opaque = [i for i, g in enumerate(grads) if g is not None and g.grad_fn is None]
                if opaque:
                    return (f"op '{self.name}': its backward is not differentiable (the gradient of input {opaque[0]} has no graph: "
                            "the backward is not built from differentiable torch ops), so its second order "
                            "cannot be checked")
                s = _inner_product(grads, tangents, y)
                if not s.requires_grad:
                    return [None] * len(xs)
                second = torch.autograd.grad(s, xs, allow_unused=True)
        except RuntimeError as error:
            if "differentiable" in str(error) or "does not require grad" in str(error):
                return (f"op '{self.name}': its backward is not differentiable ({error}), so its second order cannot "
                        "be checked")
            raise
        return [None if g is None else _numpy(g) for g in second]
