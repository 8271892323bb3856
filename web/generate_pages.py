"""Writes the workbook's page set (docs/web.md): the chapters of docs/ as pages with their math and, beside the
formulas of the ops with a worked example, panels of their numbers (web/formula_panels.py); one page of exercises
per chapter of docs/exercises.txt with an answer box checked in the page; the worked examples of `tapegrad explain
OP --trace` with the op's tape drawn; and a page to check a claim; with the WebAssembly module (web/CMakeLists.txt),
the page scripts and style, and KaTeX from Debian's libjs-katex (with its copyright file).

    python3 web/generate_pages.py --module build-web/module/tapegrad.js --out build-web/site

The exercises are read from the module itself (its exerciseList(), run under Node.js), so the page shows what the
module checks. The set is written into a new folder beside OUT and renamed into place, so OUT is never half written.
Exit 2 with one line on stderr for a missing input or a chapter the Markdown reader does not read.
"""

import argparse
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import formula_panels
import markdown_html

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The chapters with pages, in reading order: (Markdown file under docs/, page).
CHAPTERS = [("reverse-mode.md", "reverse-mode.html"), ("learn.md", "learn.html")]
# The ops whose sheets have a worked example (`tapegrad explain --help`, --trace).
TRACED_OPS = ["softmax", "attention", "layer_norm", "row_normalize"]
# KaTeX's files the pages use: the script, its style, and the woff2 fonts its style names first (every browser that
# runs the module reads woff2).
KATEX_FILES = ["katex.min.js", "katex.min.css"]
# KaTeX's alphabets the chapters do not use, left out of the set for its size, with the TeX that would use each: a
# chapter that has any of it is refused (a browser fetches a font only for text set in it; web/browser_test.py fails
# a page with a font that does not load).
KATEX_FONTS_LEFT_OUT = {"Caligraphic": ["\\mathcal", "\\cal"], "Fraktur": ["\\mathfrak", "\\frak"],
                        "SansSerif": ["\\mathsf", "\\textsf", "\\sf"], "Script": ["\\mathscr"],
                        "Typewriter": ["\\mathtt", "\\texttt", "\\tt"]}


class PageError(Exception):
    """An input of the page set that is missing or wrong."""


def page(title, body, scripts=(), source=None):
    """One page: the header with the set's contents, the body, the scripts at the end."""
    nav = ['<a href="index.html">Contents</a>']
    nav += [f'<a href="{p}">{html.escape(t)}</a>' for p, t in (("reverse-mode.html", "Reverse mode"),
                                                               ("learn.html", "Learning the derivations"),
                                                               ("trace.html", "Traces"), ("claim.html", "Claims"))]
    meta = f'<meta name="tapegrad-source" content="{html.escape(source)}">\n' if source else ""
    tags = "".join(f'<script src="{s}"></script>\n' for s in ("katex/katex.min.js",) + tuple(scripts) +
                   ("workbook.js",))
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
{meta}<title>{html.escape(title)} · tapegrad</title>
<link rel="stylesheet" href="katex/katex.min.css">
<link rel="stylesheet" href="workbook.css">
</head>
<body>
<nav class="site">{" · ".join(nav)}</nav>
<main>
{body}
</main>
{tags}</body>
</html>
"""


def exercise_pages(exercises):
    """{page: (chapter title, html of its exercises)} for the chapters of the exercises, in order."""
    chapters = []
    for e in exercises:
        if not chapters or chapters[-1][0] != e["chapter"]:
            chapters.append((e["chapter"], []))
        chapters[-1][1].append(e)
    pages = {}
    for number, (title, items) in enumerate(chapters, 1):
        sections = [exercise_section(e) for e in items]
        body = (f"<h1>Exercises: {html.escape(title)}</h1>\n<p>Each exercise gives a forward; write the rule it asks "
                "for in the claim language (<code>g</code> is ȳ, <code>y</code> the forward's value; "
                '<a href="../../docs/claims/README.md">docs/claims/README.md</a> lists the functions) and press '
                "Check. The checker runs in this page: it compares your rule with finite differences of the forward "
                "in float64, and a wrong rule gets its diagnosis as the hint, as <code>tapegrad exercise NAME --vjp "
                '"x = ..."</code> prints it in a terminal.</p>\n<p class="module-status">The checker is loading…</p>\n'
                + "\n".join(sections))
        pages[f"exercises-{number}.html"] = (title, body)
    return pages


def exercise_section(e):
    """One exercise: its task, what is given, a box per rule asked, Check, the answer on request, the typical
    slips by the kind of finding the checker names them with."""
    name = html.escape(e["name"])
    given = [f"input    {i['name']} {i['shape']}" for i in e["inputs"]]
    given += [f"let      {let['name']} = {let['formula']}" for let in e["lets"]]
    given.append(f"forward  y = {e['forward']}")
    boxes = []
    for r in e["rules"]:
        label = f"vjp {r['input']} =" if r["kind"] == "vjp" else "jvp"
        boxes.append(f'<label class="rule">{html.escape(label)} <input type="text" class="answer" spellcheck="false" '
                     f'autocomplete="off" data-kind="{r["kind"]}" data-input="{html.escape(r["input"])}" '
                     f'aria-label="{html.escape(label)}"></label>')
    slips = "".join(f'<li><span class="kind">[{html.escape(s["kind"])}]</span> <code>{html.escape(s["rule"])}</code>'
                    "</li>" for s in e["slips"])
    answer = "\n".join(e["answer"])
    return f"""<section class="exercise" id="{name}" data-name="{name}">
<h2>{name}</h2>
<p class="task">{html.escape(e["task"])}</p>
<pre class="given">{html.escape(chr(10).join(given))}</pre>
<form class="rules" autocomplete="off">{"".join(boxes)}
<button type="submit" class="check">Check</button> <button type="button" class="show-answer">Show the answer</button>
</form>
<pre class="answer-text" hidden>{html.escape(answer)}</pre>
<pre class="result" aria-live="polite"></pre>
<details class="slips"><summary>Typical slips, and the kind of finding each gets</summary><ul>{slips}</ul></details>
</section>"""


def trace_body():
    options = "".join(f'<option value="{op}">{op}</option>' for op in TRACED_OPS)
    return f"""<h1>Traces: each formula with its numbers</h1>
<p>The worked example of an op, as <code>tapegrad explain OP --trace</code> prints it: each line of its forward and
VJP on a tiny input drawn from the seed, with its shape and value; the node's Jacobian J built by forward mode, with
x̄ = Jᵀȳ; the lines' gradients against the node's own VJP; and the node's gradcheck there. Change the seed, or give
shapes as <code>--shape</code> does (<code>x=2,4</code>, several with spaces), and run it again.</p>
<p class="module-status">The checker is loading…</p>
<form class="trace-form" autocomplete="off">
<label>op <select name="op">{options}</select></label>
<label>seed <input type="text" name="seed" value="20240809" size="12"></label>
<label>shapes <input type="text" name="shapes" value="" size="30" placeholder="the example's own"></label>
<button type="submit">Run</button>
</form>
<p class="trace-command"></p>
<div class="trace-lines"></div>
<details><summary>As the terminal prints it</summary><pre class="trace-text"></pre></details>
<section class="graph-panel">
<h2>The tape, drawn</h2>
<p>The op's tape as <code>tapegrad graph --op OP --unfused</code> draws it with Graphviz, laid out in the page: a fused
op (attention, layer_norm) as the primitive ops it replaces, a primitive (softmax, row_normalize) as its one node. Each
box shows its op, its dtype and shape, the bytes it keeps for backward, its VJP and its value; leaves are ellipses
(yellow: an input with a gradient). Hover over a box or an edge for the rest. The worked example is drawn at the seed
and shapes above; a gradcheck case of the op at the seed, as the command shown draws it.</p>
<label>draw <select class="graph-case"><option value="">the worked example</option></select></label>
<p class="graph-command"></p>
<div class="graph"></div>
<div class="graph-caption"></div>
</section>"""


def claim_body():
    example = ("claim softmax_vjp\ninput x: 4, 6\nforward softmax(x)\nvjp x = y * (g - sum(y * g, -1))\n")
    return f"""<h1>Check a claim</h1>
<p>A derivative written as formulas, in the format of a claims file
(<a href="../../docs/claims/README.md">docs/claims/README.md</a>): the forward, and the claimed VJP or JVP. It is
checked here as <code>tapegrad claim --file FILE</code> checks it.</p>
<p class="module-status">The checker is loading…</p>
<form class="claim-form" autocomplete="off">
<textarea name="claims" rows="10" cols="90" spellcheck="false">{html.escape(example)}</textarea><br>
<button type="submit">Check</button>
</form>
<pre class="claim-result" aria-live="polite"></pre>"""


def index_body(exercise_titles):
    chapters = "".join(f'<li><a href="{p}">{html.escape(t)}</a></li>' for p, t in
                       (("reverse-mode.html", "Reverse mode from one scalar"),
                        ("learn.html", "Learning the derivations: softmax, attention, layer norm, β")))
    exercises = "".join(f'<li><a href="{p}">{html.escape(t)}</a></li>' for p, t in exercise_titles)
    return f"""<h1>tapegrad: the derivation workbook</h1>
<p>The chapters of docs/, their exercises and the worked examples, with tapegrad's gradchecker running in the page
(WebAssembly): no server, no install.</p>
<h2>Chapters</h2><ol>{chapters}</ol>
<h2>Exercises</h2><ol>{exercises}</ol>
<h2>Tools</h2><ul><li><a href="trace.html">Traces</a>: <code>tapegrad explain OP --trace</code> in the page</li>
<li><a href="claim.html">Claims</a>: <code>tapegrad claim</code> in the page</li></ul>"""


def read_exercises(module):
    """exerciseList() of the module, run under Node.js."""
    script = ("const create = require(process.argv[1]);"
              "create().then(m => { process.stdout.write(m.exerciseList()); });")
    try:
        out = subprocess.run(["node", "-e", script, os.path.abspath(module)], check=True, capture_output=True,
                             text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise PageError(f"{module}: could not list its exercises with node: {e}")
    data = json.loads(out)
    if isinstance(data, dict) and "error" in data:
        raise PageError(f"{module}: exerciseList: {data['error']}")
    return data


def write_site(out, module, katex, docs):
    for path in (module, os.path.join(katex, "katex.min.js"), os.path.join(katex, "fonts")):
        if not os.path.exists(path):
            raise PageError(f"{path} is missing (tools/dev.sh web builds the module and installs libjs-katex)")
    # Debian's copyright files of the two packages the copy comes from (libjs-katex, and fonts-katex for the fonts).
    copyright_file = "/usr/share/doc/libjs-katex/copyright"
    fonts_copyright_file = "/usr/share/doc/fonts-katex/copyright"
    exercises = read_exercises(module)
    parent = os.path.dirname(os.path.abspath(out)) or "."
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".site-", dir=parent)
    try:
        files = {}
        for md, target in CHAPTERS:
            with open(os.path.join(docs, md), encoding="utf-8") as f:
                text = f.read()
            for font, commands in KATEX_FONTS_LEFT_OUT.items():
                for command in commands:
                    if re.search(re.escape(command) + r"(?![A-Za-z])", text):
                        raise PageError(f"docs/{md} uses {command}, whose font KaTeX_{font} the page set leaves out "
                                        "(web/generate_pages.py, KATEX_FONTS_LEFT_OUT)")
            placer = formula_panels.Placer(md)
            body, headings = markdown_html.convert(text, md, after_block=placer)
            placer.check()
            digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
            scripts = ()
            if placer.wanted:  # the panels run the module's traces
                body = '<p class="module-status">The checker is loading…</p>\n' + body
                scripts = ("tapegrad.js",)
            files[target] = page(headings[0][1] if headings else md, body, scripts=scripts,
                                 source=f"docs/{md} sha256:{digest}")
        pages = exercise_pages(exercises)
        for target, (title, body) in pages.items():
            files[target] = page(f"Exercises: {title}", body, scripts=("tapegrad.js",))
        files["trace.html"] = page("Traces", trace_body(), scripts=("tapegrad.js", "graph_layout.js"))
        files["claim.html"] = page("Claims", claim_body(), scripts=("tapegrad.js",))
        files["index.html"] = page("Contents", index_body([(p, t) for p, (t, _) in pages.items()]))
        for name, text in files.items():
            with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                f.write(text)
        shutil.copyfile(module, os.path.join(staging, "tapegrad.js"))
        for name in ("workbook.js", "graph_layout.js", "workbook.css"):
            shutil.copyfile(os.path.join(HERE, name), os.path.join(staging, name))
        os.makedirs(os.path.join(staging, "katex", "fonts"))
        for name in KATEX_FILES:
            shutil.copyfile(os.path.join(katex, name), os.path.join(staging, "katex", name))
        for name in sorted(os.listdir(os.path.join(katex, "fonts"))):
            if name.endswith(".woff2") and name.split("-")[0][len("KaTeX_"):] not in KATEX_FONTS_LEFT_OUT:
                shutil.copyfile(os.path.join(katex, "fonts", name), os.path.join(staging, "katex", "fonts", name))
        shutil.copyfile(copyright_file, os.path.join(staging, "katex", "COPYRIGHT"))
        shutil.copyfile(fonts_copyright_file, os.path.join(staging, "katex", "fonts", "COPYRIGHT"))
        os.chmod(staging, 0o755)
        # The new set in place of the old: the old one moved aside first, so OUT is whole at every moment but one
        # rename.
        old = None
        if os.path.exists(out):
            old = tempfile.mkdtemp(prefix=".site-old-", dir=parent)
            os.rename(out, os.path.join(old, "site"))
        os.rename(staging, out)
        if old:
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return len(files)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", required=True, help="tapegrad.js, the module web/CMakeLists.txt builds")
    parser.add_argument("--out", required=True, help="the folder of the page set (replaced whole)")
    parser.add_argument("--katex", default="/usr/share/javascript/katex", help="Debian's libjs-katex files")
    parser.add_argument("--docs", default=os.path.join(ROOT, "docs"), help="the Markdown of the chapters")
    args = parser.parse_args()
    try:
        count = write_site(args.out, args.module, args.katex, args.docs)
    except (PageError, markdown_html.MarkdownError, formula_panels.PanelError, OSError, ValueError) as e:
        print(f"generate_pages: error: {e}", file=sys.stderr)
        return 2
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.out) for f in fs)
    print(f"wrote {count} pages to {args.out} ({size / 1e6:.2f} MB with the module and KaTeX)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
