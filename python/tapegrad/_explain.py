"""tapegrad.explain(op): `tapegrad explain OP --json` as a dict, with docs/derivations.md found where tapegrad's
shared files are (the build tree's share/tapegrad, or the install prefix's)."""

import json
import os
import sys
from pathlib import Path

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


def explain(op):
    """One op on one screen as a dict: its forward, VJP, JVP and second-order rule, where they are written, the
    sections of docs/derivations.md that derive them, what its node keeps (bytes), its FLOPs, its gradchecks."""
    return json.loads(_tapegrad._explain_json(op, _derivations_path()))
