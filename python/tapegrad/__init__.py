"""tapegrad from Python: the diagnosing gradchecker on PyTorch and numpy ops, and the engine on numpy arrays.

    import tapegrad
    report = tapegrad.gradcheck(MyAttention.apply, (q, k, v))   # torch tensors or numpy arrays
    assert report, report       # falsy on a failure; str(report) is the CLI's table with its diagnosis

The checks and the diagnoses run in tapegrad's C++ checker, the one `tapegrad gradcheck` runs: the Python op becomes
one node whose forward, VJP, JVP and second-order rule call back into Python (docs/python.md).
"""

from ._tapegrad import Check, Diagnosis, Error, NoJvp, Report, Tape, Var, __version__, finding_kinds, ops
from ._gradcheck import GradcheckError, claim, gradcheck
from ._explain import explain
from ._graph import graph

__all__ = [
    "Check", "Diagnosis", "Error", "GradcheckError", "NoJvp", "Report", "Tape", "Var", "claim", "explain",
    "finding_kinds", "gradcheck", "graph", "ops", "__version__",
]
