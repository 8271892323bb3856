"""The Python the docs show is run: README's example and the output it quotes, docs/python.md's complete blocks, and
every tapegrad.X and tape.X its other blocks name."""

import contextlib
import io
import re

import tapegrad
from conftest import SOURCE_DIR


def fenced_blocks(path, language):
    """The ```language blocks of a Markdown file, each with the block that follows it when that one is untyped."""
    text = (SOURCE_DIR / path).read_text()
    blocks = re.findall(r"^```(\w*)\n(.*?)^```\n", text, flags=re.S | re.M)
    return [(body, blocks[i + 1][1] if i + 1 < len(blocks) and blocks[i + 1][0] == "" else None)
            for i, (lang, body) in enumerate(blocks) if lang == language]


def run(code, namespace=None):
    """What the code prints, and the namespace it ran in: a fresh one, or the one given (blocks run in order)."""
    out = io.StringIO()
    namespace = {} if namespace is None else namespace
    with contextlib.redirect_stdout(out):
        exec(compile(code, "<docs>", "exec"), namespace)
    return out.getvalue(), namespace


def test_readme_example_prints_what_the_readme_quotes():
    (code, quoted), = fenced_blocks("README.md", "python")
    printed, _ = run(code)
    printed_lines = printed.splitlines()
    # The quoted output, but for its "..." and the table's numbers: the verdict, each row's input, check and mode,
    # and every diagnosis line word for word.
    for line in quoted.splitlines():
        if line.strip() == "...":
            continue
        if line.lstrip().startswith("[") or line.endswith(": FAILED") or line.strip() == "diagnosis:":
            assert line in printed_lines, f"README quotes {line!r}; the example printed:\n{printed}"
        elif re.match(r"\s+\w+\s+(vjp|jvp|adjoint|accumulate)\s", line):
            head = line.split()[:3]
            assert any(p.split()[:3] == head for p in printed_lines), f"no row {head}:\n{printed}"


def test_python_md_quotes_the_reports_of_the_examples_slips_word_for_word():
    """Every diagnosis line docs/python.md quotes from the attention example is one that example's report prints."""
    from attention_gradient import SLIPS, inputs, make_attention
    printed = set()
    for slip in SLIPS:
        printed.update(str(tapegrad.gradcheck(make_attention(slip).apply, inputs(8, 16))).splitlines())
    text = (SOURCE_DIR / "docs/python.md").read_text()
    quoted = [line for line in text.splitlines()
              if re.match(r"    \[[a-zA-Z -]+\] [qkv][,:]", line) and "test_forward.py" not in line
              and "derivative_build.py" not in line]
    assert quoted
    for line in quoted:
        assert line in printed, f"docs/python.md quotes {line!r}, which no report of the example prints"


def test_python_md_complete_blocks_run():
    complete = [code for code, _ in fenced_blocks("docs/python.md", "python") if "..." not in code]
    assert complete
    namespace = {}
    for code in complete:
        if "tapegrad.gradcheck(" not in code:
            continue
        _, namespace = run(code)
        assert namespace["report"], namespace["report"]
    assert "report" in namespace


def test_python_md_names_only_what_exists():
    tape = tapegrad.Tape()
    named = 0
    for code, _ in fenced_blocks("docs/python.md", "python"):
        code = re.sub(r"#.*|\"[^\"\n]*\"|'[^'\n]*'", "", code)  # names in strings and comments are not code
        for owner, attribute in re.findall(r"\b(tapegrad|tape)\.(\w+)", code):
            assert hasattr(tapegrad if owner == "tapegrad" else tape, attribute), f"{owner}.{attribute}"
            named += 1
    assert named > 5


def test_the_slips_named_from_the_forward_are_quoted_word_for_word():
    """docs/python.md's and docs/gradchecking.md's lines of the kinds named from the forward, and of a wrong axis,
    are printed by the Functions of python/tests/test_forward.py, test_forward_axis.py, test_forward_loop.py,
    test_forward_term.py and derivative_build.py."""
    import derivative_build
    import test_forward as f
    import test_forward_axis as a
    import test_forward_loop as loop
    import test_forward_term as term
    cases = [(f.silu("dropped"), f.inputs((4, 5))), (f.silu("twice"), f.inputs((4, 5))),
             (f.softmax("no_row_sum"), f.inputs((4, 5))), (f.softmax("row_sum_added"), f.inputs((4, 5))),
             (f.swish("no_beta"), (f.inputs((4, 5))[0], 1.7)), (f.cubic("exponent"), f.inputs((4, 5))),
             (f.attention("dP_for_dS"), f.inputs((4, 3), (4, 3), (4, 3)))]
    cases += [(make(slip), args()) for make, slip, args, _, _ in a.CASES + loop.CASES + term.CASES]
    printed = set()
    for fn, args in cases:
        printed.update(str(f.check(fn, args)).splitlines())
    for op, (make, slips) in derivative_build.OPS.items():
        printed.update(line for slip in slips for line in str(tapegrad.gradcheck(*make(slip, 0))).splitlines())
    kinds = (r"dropped term|term counted twice|term with a wrong factor|term from the wrong value|wrong axis|"
             r"transposed term")
    quoted = [line for path in ("docs/python.md", "docs/gradchecking.md")
              for line in (SOURCE_DIR / path).read_text().splitlines()
              if re.match(rf"    \[({kinds})\] ", line) and "tests/claims/" not in line  # a claim's: checked in C++
              and ("[transposed term]" not in line or "the forward's rule" in line)]  # else the edits' (examples)
    # python.md's lines of a sign of a term and of a per-row term are printed by them too (gradchecking.md's come
    # from the claims' edit search and the Jacobian, checked in C++)
    text = (SOURCE_DIR / "docs/python.md").read_text()
    text = text[:text.index("### Low precision and GPUs")] + text[text.index("## 2. numpy code"):]  # its own test
    quoted += [line for line in text.splitlines() if re.match(r"    \[(sign of a term|per-row term)\] ", line)]
    assert len(quoted) >= 5
    for line in quoted:
        assert line in printed, f"the docs quote {line!r}, which no report of test_forward.py's slips prints"


def test_python_md_low_precision_lines_are_what_the_checks_print():
    """The report, diagnosis and note lines docs/python.md quotes in its low-precision section (and
    docs/gradchecking.md's precision defect, rounds inside and not a function) are printed by the checks its text
    describes, word for word but for the numbers (bf16 products round differently on other CPUs)."""
    import numpy as np
    import torch
    from low_precision import (LAYER_NORM_REFERENCE, REFERENCE, inputs, layer_norm_inputs, make_affine,
                               make_layer_norm, make_layer_norm_in_ops)

    def softmax_in_float32(x):
        return torch.softmax(x.float(), dim=-1).double()

    noise = np.random.default_rng()

    class Dropoutish(torch.autograd.Function):  # noise from a generator the check's seed does not reach
        @staticmethod
        def forward(ctx, x):
            return 2 * x + 1e-3 * torch.from_numpy(noise.standard_normal(tuple(x.shape)))

        @staticmethod
        def backward(ctx, g):
            return 2.1 * g

    class RoundedExp(torch.autograd.Function):  # float64 in and out, bf16 inside
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.exp(x).to(torch.bfloat16).double()

        @staticmethod
        def backward(ctx, g):
            return g * torch.exp(ctx.saved_tensors[0])

    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    reports = [tapegrad.gradcheck(make_affine(v).apply, inputs(), reference=REFERENCE)
               for v in ("right", "unscaled", "accumulate_low")]
    reports += [tapegrad.gradcheck(make_layer_norm(v).apply, layer_norm_inputs(), reference=LAYER_NORM_REFERENCE)
                for v in ("no_mean_16bit", "unbiased_backward", "last_row_16bit")]
    reports.append(tapegrad.gradcheck(make_layer_norm_in_ops("second_row_16bit").apply, layer_norm_inputs(),
                                      reference=LAYER_NORM_REFERENCE))
    reports += [tapegrad.gradcheck(f, (x,)) for f in (softmax_in_float32, Dropoutish.apply, RoundedExp.apply)]

    def masked(line):
        return re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", line)
    printed = {masked(line) for r in reports for line in str(r).splitlines()}
    text = (SOURCE_DIR / "docs/python.md").read_text()
    section = text[text.index("### Low precision and GPUs"):text.index("### A backward that is not its forward's")]
    quoted = [line for language, body in re.findall(r"^```(\w*)\n(.*?)^```\n", section, flags=re.S | re.M)
              if not language for line in body.splitlines() if line.strip()]
    quoted += [line for line in (SOURCE_DIR / "docs/gradchecking.md").read_text().splitlines()
               if re.match(r"    \[(precision defect|rounds inside|not a function)\] (\w+, vjp bf16|the forward)",
                           line)]
    assert len(quoted) > 20
    for line in quoted:
        assert masked(line) in printed, f"the docs quote {line!r}, which no check prints"


def test_python_md_surrogate_example_prints_what_it_quotes():
    (code, quoted), = [(c, q) for c, q in fenced_blocks("docs/python.md", "python") if "surrogate=" in c]
    printed, namespace = run(code)
    assert namespace["report"], namespace["report"]
    assert printed == quoted


def test_learn_md_python_blocks_print_what_they_quote(tmp_path, monkeypatch):
    """docs/learn.md's Python runs as shown: the layer-norm slip's report (its verdict, rows and diagnosis lines) and
    the drawing of attention built from primitive ops."""
    import shutil

    import pytest

    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not on PATH: the chapter's drawing cannot be made")
    monkeypatch.chdir(tmp_path)
    blocks = fenced_blocks("docs/learn.md", "python")
    assert len(blocks) == 2
    for code, quoted in blocks:
        assert quoted, "each Python block of docs/learn.md is followed by the output it prints"
        printed_lines = run(code)[0].splitlines()
        for line in quoted.splitlines():
            if line.strip() in ("", "…"):
                continue
            if re.match(r"\s+\w+\s+(vjp|jvp|adjoint|accumulate)\s", line):
                head = line.split()[:3]
                assert any(p.split()[:3] == head for p in printed_lines), f"no row {head}:\n{printed_lines}"
            else:
                assert line in printed_lines, f"docs/learn.md quotes {line!r}; the block printed:\n{printed_lines}"
    assert (tmp_path / "steps.svg").stat().st_size > 0


def test_reverse_mode_md_runs_in_order_and_prints_what_it_quotes(tmp_path, monkeypatch):
    """docs/reverse-mode.md's Python blocks, run in order in one namespace as a reader runs them, print exactly the
    lines each block's quoted output shows; the drawing it makes is written."""
    import shutil

    import pytest

    if shutil.which("dot") is None:
        pytest.skip("Graphviz's dot is not on PATH: the chapter's drawing cannot be made")
    monkeypatch.chdir(tmp_path)
    blocks = fenced_blocks("docs/reverse-mode.md", "python")
    assert len(blocks) == 7
    namespace = {}
    for code, quoted in blocks:
        assert quoted, "each Python block of docs/reverse-mode.md is followed by the output it prints"
        printed, namespace = run(code, namespace)
        assert printed.splitlines() == quoted.splitlines()
    assert (tmp_path / "scalar.svg").stat().st_size > 0


def test_the_learners_pages_give_each_symbol_one_meaning():
    """docs/learn.md §1's table of symbols is the notation of the learner's pages (reverse-mode.md, learn.md): each
    symbol is in one row, and their math keeps to those meanings where a symbol had two. σ is the sigmoid (not a
    standard deviation: layer norm is written with ρ; not softmax, which is A or softmax); d before a name is a
    cotangent's name (dA, dS), never a differential (a tangent is ẋ, μ̇, ρ̇); M is the additive causal mask, never a
    0/1 factor; P is not a symbol of these pages (other write-ups' name for A)."""
    learn = (SOURCE_DIR / "docs/learn.md").read_text()
    table = learn[learn.index("## 1. Notation"):learn.index("## 2.")]
    rows = [line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    symbols = []
    for cell in rows[1:]:  # after the header
        symbols += [m.strip() for math in re.findall(r"\$([^$]+)\$", cell) for m in math.split(",")]
    assert len(symbols) >= 25
    twice = sorted({s for s in symbols if symbols.count(s) > 1})
    assert not twice, f"symbols in two rows of learn.md's notation table: {twice}"
    rules = [(r"\\sigma(?![($])", "σ is the sigmoid: σ(x), never a standard deviation or softmax"),
             (r"(?<![A-Za-z\\])d(\\mu|\\rho|\\beta|\\hat|x\b|r\b)", "a tangent is written with a dot, not d"),
             (r"M\s*\\odot", "M is the additive mask (0 or −∞), not a factor"),
             (r"(?<![A-Za-z\\_])P(?![A-Za-z_])", "P is no symbol of these pages")]
    broken = []
    for path in ("docs/reverse-mode.md", "docs/learn.md"):
        text = (SOURCE_DIR / path).read_text()
        text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)  # code and output, not math
        for math in re.findall(r"\$\$.+?\$\$|\$[^$\n]+\$", text, flags=re.S):
            broken += [f"{path}: {why}: {math[:70]!r}" for pattern, why in rules if re.search(pattern, math)]
    assert not broken, "\n".join(broken)


def test_math_in_the_docs_has_no_escape_githubs_markdown_takes_first():
    """GitHub's Markdown takes a backslash before ASCII punctuation as an escape before its math is drawn: `s\\,dS`
    shows as "s,dS". No $…$ or $$…$$ in docs/ or README.md holds one (`\\ ` and `\\quad` space math instead)."""
    paths = sorted((SOURCE_DIR / "docs").rglob("*.md")) + [SOURCE_DIR / "README.md"]
    found = []
    for path in paths:
        text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)  # code blocks are not drawn as math
        text = re.sub(r"`[^`\n]*`", "", text)
        for math in re.findall(r"\$\$.+?\$\$|\$[^$\n]+\$", text, flags=re.S):
            found += [f"{path.name}: {escape} in {math[:60]!r}" for escape in re.findall(r"\\[!-/:-@\[-`{-~]", math)]
    assert len(paths) > 10
    assert not found, "\n".join(found)
