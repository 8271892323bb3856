"""tapegrad.graph(tape, path): what `tapegrad graph` draws, for a tape recorded from Python."""

from pathlib import Path

from . import _tapegrad


def graph(tape, path=None, *, format=None, title=""):
    """Draws everything recorded on `tape` since its last clear(): one node per value (op, dtype, shape, bytes kept,
    norms of value and gradient), one edge per input, the ops' VJPs and JVPs in the tooltips. With a path, writes the
    drawing in the format its suffix names (.svg, .png by Graphviz's dot; .dot: the DOT text) and returns the path;
    without one, returns the DOT text."""
    if path is None:
        return _tapegrad._draw(tape, "dot", title).decode()
    path = Path(path)
    format = format or (path.suffix[1:] if path.suffix else "svg")
    _tapegrad._draw(tape, format, title, str(path))  # written atomically, as the CLI writes its files
    return path
