"""Panels of numbers beside the formulas of the chapters (docs/web.md): after a block of a chapter that derives an
op with a worked example, a panel that runs `tapegrad explain OP --trace` in the page (the module's traceExample)
and shows the lines of the trace that compute that block's formulas, with their values, at a seed and shapes the
reader can change.

PANELS says which block gets which lines: the chapter, the anchor of its section, a piece of the block's Markdown
that finds it, the op, and the start of each trace line's formula (a line of `tapegrad explain OP --trace`). The
Markdown stays the one source of the text: the panels are added beside its blocks when the page is written. A piece
that finds no block, or more than one, stops the page from being written; a line start that finds no line of the
trace, or more than one, is an error on the page's console (which web/browser_test.py fails on).
"""

import html
import json

# (chapter, section anchor, a piece of the block's Markdown, op, [start of a trace line's formula, ...])
PANELS = [
    ("learn.md", "2-softmaxs-jacobian-from-the-quotient-rule", r"y_i = \frac{e^{x_i}}{Z}", "softmax",
     ["e = exp(x)", "y = e / rowsum(e)"]),
    ("learn.md", "2-softmaxs-jacobian-from-the-quotient-rule", r"\Longrightarrow\quad \bar x = y \odot", "softmax",
     ["y ⊙ ȳ,", "D = rowsum(y ⊙ ȳ)", "y ⊙ D,", "x̄ = y ⊙ ȳ − y ⊙ D"]),
    ("learn.md", "3-attention-with-a-bias", r"S = s\ QK^\top + \mathrm{bias} + M", "attention",
     ["S = s·Q·Kᵀ + bias", "A = softmax(S)", "O = A·V"]),
    ("learn.md", "3-attention-with-a-bias", r"1. $O = AV$: $dV = A^\top G$", "attention",
     ["dV = Aᵀ·G", "dA = G·Vᵀ", "D = rowsum(G ⊙ O)", "rowsum(A ⊙ dA)", "dS = A ⊙ (dA − D·1ᵀ)", "dQ = s·dS·K",
      "dK = s·dSᵀ·Q", "d(bias) = "]),
    ("learn.md", "4-layer-norm-and-checking-your-own-vjp", r"\mu = \mathrm{mean}(x), \quad \rho", "layer_norm",
     ["μ = mean(x)", "ρ = 1/√(mean((x − μ)²) + ε)", "x̂ = (x − μ)·ρ", "y = w ⊙ x̂ + b"]),
    ("learn.md", "4-layer-norm-and-checking-your-own-vjp", r"\bar x = \rho\ \bigl(\hat g", "layer_norm",
     ["ĝ = w ⊙ ȳ", "ρ·ĝ,", "ρ·mean(ĝ),", "ρ·x̂ ⊙ mean(ĝ ⊙ x̂)", "x̄ = ρ·(ĝ", "w̄ = ", "b̄ = "]),
    ("learn.md", "5-β-beside-softmax-jacobian-against-jacobian", r"J_\beta = c\ I - \frac{c^2}{r}", "row_normalize",
     ["r = ‖x‖", "c = 1/(1 + r)", "y = β(x) = c·x", "c·ȳ,", "k = ⟨y, ȳ⟩/r", "k·y,", "x̄ = c·ȳ − k·y"]),
]


class PanelError(Exception):
    """A piece of PANELS that finds no block of its chapter, or more than one."""


def panel_html(op, lines):
    """The panel: its form (seed, shapes), the command it runs, and room for the lines' values."""
    return (f'<div class="formula-numbers" data-op="{html.escape(op)}" '
            f'data-lines="{html.escape(json.dumps(lines, ensure_ascii=False))}">\n'
            f'<form class="numbers-form" autocomplete="off"><span class="numbers-title">The numbers, from '
            f'<code>tapegrad explain {html.escape(op)} --trace</code>:</span> '
            '<label>seed <input type="text" name="seed" value="20240809" size="10"></label> '
            '<label>shapes <input type="text" name="shapes" value="" size="16" placeholder="the example\'s own">'
            '</label> <button type="submit">Run</button></form>\n'
            '<p class="numbers-command"></p><div class="numbers-lines"></div></div>')


class Placer:
    """markdown_html.convert's after_block for one chapter: the panel after each block PANELS finds, and a record of
    what each piece found, for check()."""

    def __init__(self, chapter):
        self.chapter = chapter
        self.wanted = [p for p in PANELS if p[0] == chapter]
        self.found = [0] * len(self.wanted)

    def __call__(self, section, source):
        out = []
        for i, (_, anchor, piece, op, lines) in enumerate(self.wanted):
            if section == anchor and piece in source:
                self.found[i] += 1
                out.append(panel_html(op, lines))
        return "\n".join(out)

    def check(self):
        for (_, anchor, piece, _, _), count in zip(self.wanted, self.found):
            if count != 1:
                raise PanelError(f"docs/{self.chapter}#{anchor}: the panel's piece {piece!r} finds "
                                 f"{'no block' if count == 0 else f'{count} blocks'} (web/formula_panels.py)")
