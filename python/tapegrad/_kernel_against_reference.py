"""The op the structural kinds are read from at a precision (tapegrad/_precision_names.py): one checked input of the
kernel, its VJP the kernel's at p, its forward the reference in float64. The C++ checker (python/python_function.hpp)
compares them as it compares any op's rule with its forward.

With a reference given, the kernel is held to the reference's derivatives as torch computes them (the comparison,
tapegrad/_rounding.py, holds it to those), and the op gives the checker its full Jacobians in blocks:

    the reference's side   J e_k for every input element k, from J's rows: ȳ = e_j through the reference's backward,
                           m of them in a few batched calls, where finite differences take 2n runs of the forward
                           (n = 12288 runs of a loss's reference against one backward)
    the kernel's side      Jₚᵀ e_j for every output element j, from one run of the kernel at p

Without one, fn in float64 is the reference: its backward may carry the slip itself, so its Jacobian comes from
finite differences of its forward, one run per point, as in every float64 check.
"""

import warnings

import numpy as np
import torch

from ._rounding import _cast, _Run
from ._torch_op import float_outputs, unit_vjp_rows

ROWS_AT_ONCE = 1 << 22  # elements of the largest tensor the reference takes or gives, times the rows of one batched
#                        backward (whose every value is held once per row of the batch): 32 MB of float64 each


class KernelAgainstReference:
    """The interface of python/python_function.hpp: forward is the reference in float64 (finite differences of it give
    the reference's Jacobian), and the VJP at the point is the kernel's at its precision."""

    def __init__(self, c, inputs, slot):
        self.fn, self.ref_fn, self.slots, self.kwargs = c.fn, c.ref_fn, [slot], c.kwargs
        self.dtype, self.device = c.dtype, c.device
        self.fixed64 = _cast(list(inputs), torch.float64, c.device)
        self.fixed = list(inputs)
        self.no_forward_mode = "the kernel's forward mode is not compared at its precision"

    def _args(self, fixed, arrays, dtype):
        args = list(fixed)
        for slot, a in zip(self.slots, arrays):
            args[slot] = torch.from_numpy(np.array(a, dtype=np.float64)).to(device=self.device, dtype=dtype)
        return args

    def _kernel(self, arrays):
        return _Run(self.fn, self._args(self.fixed, arrays, self.dtype), self.slots, self.kwargs, "the kernel")

    def forward(self, arrays, keep):
        with torch.no_grad():
            ys = float_outputs(self.ref_fn(*self._args(self.fixed64, arrays, torch.float64), **self.kwargs))
        y = torch.cat([t.reshape(-1) for t in ys]).cpu().numpy() if len(ys) > 1 else ys[0].cpu().numpy()
        return y, (self._kernel(arrays) if keep else None)

    def vjp(self, kernel, gout):
        flat, cotangents = torch.from_numpy(np.array(gout, dtype=np.float64)).reshape(-1), []
        for y in kernel.ys:
            cotangents.append(flat[:y.numel()].reshape(y.shape))
            flat = flat[y.numel():]
        return kernel.vjp(cotangents)

    def jvp(self, state, tangents):
        return None


class KernelAgainstGivenReference(KernelAgainstReference):
    """KernelAgainstReference where a reference is given: the full Jacobians in blocks, the reference's from its
    backward (python/python_function.hpp's vjp_rows and unit_steps)."""

    def vjp_rows(self, arrays, yshape, wanted):
        """The kernel's x̄ at p for every unit ȳ = e_j, j over y's elements in order, from one run of it (wanted: the
        one input is checked in full, since the checker asks)."""
        kernel = self._kernel(arrays)
        return list(unit_vjp_rows(lambda unit: self.vjp(kernel, unit), yshape))

    def unit_steps(self, arrays, i, eps):
        """(plus, minus), row k holding y flattened at the point with element k moved by +ε and by −ε, to first order:
        y ± ε·J e_k, J the reference's Jacobian from its backward (J e_k the kth column: the kth element of every
        row)."""
        run = _Run(self.ref_fn, self._args(self.fixed64, arrays, torch.float64), self.slots, self.kwargs,
                   "the reference in float64")
        y = np.concatenate([v.reshape(-1) for v in run.values()])
        columns = _jacobian(run, y.size).T  # (n, m): row k is J e_k
        return y + eps * columns, y - eps * columns


def _jacobian(run, m):
    """J (m × n) of run's one checked input: row j the VJP of ȳ = e_j over run's outputs flattened and joined, through
    torch's batched backward in batches of rows that hold ROWS_AT_ONCE elements of the largest tensor the reference
    takes or gives, one VJP at a time where that cannot run."""
    x = run.xs[0]
    n = x.numel()
    jac = np.zeros((m, n))
    outputs = [(k, y) for k, y in enumerate(run.ys) if y.requires_grad]
    offsets = np.cumsum([0] + [y.numel() for y in run.ys])
    largest = max([n, 1] + [y.numel() for y in run.ys] + [a.numel() for a in run.args if isinstance(a, torch.Tensor)])
    batch = max(1, ROWS_AT_ONCE // largest)
    for start in range(0, m, batch):
        rows = range(start, min(m, start + batch))
        units = [torch.zeros((len(rows),) + tuple(y.shape), dtype=y.dtype, device=y.device) for _, y in outputs]
        for r, j in enumerate(rows):
            for (k, _), unit in zip(outputs, units):
                if offsets[k] <= j < offsets[k + 1]:
                    unit.view(len(rows), -1)[r, j - offsets[k]] = 1.0
        jac[start:start + len(rows)] = _rows(run, outputs, units, x, len(rows), n)
    return jac


def _rows(run, outputs, units, x, count, n):
    """x̄ for each of count batched cotangents (units, one tensor per output, the batch first): (count, n)."""
    if not outputs:
        return np.zeros((count, n))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns where a backward formula falls back to a loop
            (grad,) = torch.autograd.grad([y for _, y in outputs], [x], units, retain_graph=True, allow_unused=True,
                                          is_grads_batched=True)
        if grad is None:
            return np.zeros((count, n))
        return grad.detach().to(torch.float64).reshape(count, n).cpu().numpy()
    except (RuntimeError, NotImplementedError):  # a backward the batched rule cannot run: one VJP per row
        rows = np.zeros((count, n))
        for r in range(count):
            cotangents = [torch.zeros_like(y) for y in run.ys]
            for (k, _), unit in zip(outputs, units):
                cotangents[k] = unit[r]
            rows[r] = run.vjp(cotangents)[0].reshape(-1)
        return rows


def kernel_against_reference(c, inputs, slot):
    """The op for checked input slot: with a reference given, its full Jacobians in blocks."""
    return (KernelAgainstReference if c.ref_fn is c.fn else KernelAgainstGivenReference)(c, inputs, slot)
