"""The fits tried after the forward's own edges and substitutions (tapegrad/_forward.py) leave an input unnamed: an
element-wise call's derivative written wrong or taken at the wrong value (_forward_derivative.py), a reduction or
broadcast along the wrong axis (_forward_axis.py), a slip made at every step of a loop (_forward_loop.py), then one
term of one call made with a value's entries moved: transposed, reversed, or a layout call left out
(_forward_term.py)."""

from ._forward_axis import AXIS_FITS
from ._forward_derivative import DERIVATIVE_FITS
from ._forward_loop import LOOP_FITS
from ._forward_term import TERM_FITS


def named_otherwise(search):
    """[(kind, input, check, message)] for the inputs of search.errors (index → x̄_user − x̄_true) these fits name
    (search: _forward_rewrite.Search); search.errors keeps those none names."""
    found = []
    for fit in DERIVATIVE_FITS + AXIS_FITS + LOOP_FITS + TERM_FITS:
        if not search.errors:
            break
        named = fit(search)  # input → finding, for inputs of search.errors
        found += named.values()
        search.errors = {i: e for i, e in search.errors.items() if i not in named}
    return found
