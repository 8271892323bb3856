"""tapegrad.explain(op): `tapegrad explain OP --json` as a dict, with docs/derivations.md found where tapegrad's
shared files are (the build tree's share/tapegrad, or the install prefix's); explain(op, trace=True): the op's worked
example with its numbers, as `tapegrad explain OP --trace`."""

import json
import os
import sys
from pathlib import Path

import numpy as np

from . import _tapegrad


def _derivations_path():
    here = Path(__file__).resolve().parent
    candidates = []
    if os.environ.get("TAPEGRAD_SOURCE_DIR"):
        candidates.append(Path(os.environ["TAPEGRAD_SOURCE_DIR"]) / "docs")
    unresolved = Path(os.path.abspath(__file__)).parent  # the build tree links the package's files
    candidates += [unresolved.parent.parent / "share/tapegrad/docs", here.parent / "docs",
                   Path(sys.prefix) / "share/tapegrad/docs", Path("/usr/share/tapegrad/docs")]
    candidates += [p / "share/tapegrad/docs" for p in unresolved.parents]
    for folder in candidates:
        if (folder / "derivations.md").is_file():
            return str(folder / "derivations.md")
    return ""


def _array(value):
    return np.array(value["values"], dtype=np.float64).reshape(value["shape"])


def explain(op, trace=False, seed=None, shapes=None):
    """One op on one screen as a dict: its forward, VJP, JVP and second-order rule, where they are written, the
    sections of docs/derivations.md that derive them, what its node keeps (bytes), its FLOPs, its gradchecks.

    With trace=True, the op's worked example instead (softmax, attention, layer_norm, row_normalize): each formula of
    its forward and VJP with the matrix it produces on a tiny input drawn from `seed` (None: the checker's
    default seed), at the example's shapes or those of `shapes` ({"x": (2, 4)}, as --shape), as numpy arrays:
    {"op", "case", "seed", "shapes_given", "inputs": {name: array}, "ybar": array, "lines": [(part, formula, array)],
    "jacobians": [{"input", "rows", "cols", "value" (an array, where it has at most 64 entries), "max_abs_diff",
    "agrees"}], "gradients": [{"input", "max_abs_diff", "scale", "agrees"}], "gradcheck_passed", "passed", "text"},
    where "jacobians" is the node's J built by forward mode with Jᵀȳ against the lines' x̄, "gradients" compares
    what the lines end with against the node's own VJP and "text" is what the command prints."""
    if not trace:
        if seed is not None or shapes is not None:
            raise ValueError("explain: seed= and shapes= are for the worked example (trace=True)")
        return json.loads(_tapegrad._explain_json(op, _derivations_path()))
    at = [(name, [int(d) for d in shape]) for name, shape in (shapes or {}).items()]
    run = json.loads(_tapegrad._trace_json(op, shapes=at) if seed is None else _tapegrad._trace_json(op, seed, at))
    run["inputs"] = {i["name"]: _array(i["value"]) for i in run["inputs"]}
    run["ybar"] = _array(run["ybar"])
    run["lines"] = [(line["part"], line["formula"], _array(line["value"])) for line in run["lines"]]
    for jac in run["jacobians"]:
        if "value" in jac:
            jac["value"] = _array(jac["value"])
    return run
