"""tapegrad.graph(tape, path): what `tapegrad graph` draws, for a tape recorded from Python."""

from pathlib import Path

from . import _tapegrad


def graph(tape, path=None, *, format=None, title="", formulas=True, max_nodes=2000):
    """Draws everything recorded on `tape` since its last clear(): one node per value (op, the name given by
    tape.leaf(x, name=...), dtype, shape, bytes kept, the values and gradients of up to 16 elements in full and the
    norm, min and max of larger ones), one edge per input, each op's VJP on its node (formulas=False: only in the
    tooltip) and its VJP and JVP in the tooltip. With a path, writes the drawing in the format its suffix names (.svg,
    .png by Graphviz's dot; .dot: the DOT text) and returns the path; without one, returns the DOT text. More than
    max_nodes values are refused (Graphviz takes minutes on tens of thousands)."""
    if path is None:
        return _tapegrad._draw(tape, "dot", title, "", formulas, max_nodes).decode()
    path = Path(path)
    format = format or (path.suffix[1:] if path.suffix else "svg")
    _tapegrad._draw(tape, format, title, str(path), formulas, max_nodes)  # written atomically, as the CLI writes
    return path
