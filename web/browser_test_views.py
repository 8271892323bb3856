"""The checks of web/browser_test.py on the op's tape drawn on the trace page and on the chapters' panels of numbers
(docs/web.md, "The test").

A graph drawn from a gradcheck case must have the boxes and edges of `tapegrad graph --op OP --case NAME [--unfused]
--seed SEED --format dot`: the same node names in the same order, each with the DOT's shape, colours and label text
(its HTML-like markup and heat maps' cells left out), and the same edges, in order, with the same labels. Every
drawing, of a case or of the worked example, must show each node and edge of the module's answer, no two boxes
overlapping, and each edge leaving its source's box at the bottom and ending at its target's box at the top. A panel
must show each line it names, with the numbers of `tapegrad explain OP --trace --json` at the same seed.
"""

import html
import json
import re
import subprocess

import formula_panels

# (op, seed) of the graphs drawn from each op's first gradcheck case; the ops with an unfused form.
GRAPH_CASES = [(op, seed) for op in ("softmax", "row_normalize", "layer_norm", "attention") for seed in (20240809, 7)]
UNFUSED_OPS = {"attention", "layer_norm"}
PANEL_SEEDS = (20240809, 7)
MAX_MEDIAN_MS = 200  # the median drawing, and the median panel, at real time, as an exercise's check
NODE = re.compile(r'^\s+([vs]\d+) \[shape=(\w+), fillcolor="([^"]+)", color="([^"]+)"(?:, penwidth=2)?'
                  r'(?:, peripheries=2)?, label=<(.*)>, tooltip="')
EDGE = re.compile(r'^\s+(\S+) -> (\S+) \[label="((?:[^"\\]|\\.)*)", tooltip=')


def label_text(label):
    """The text of an HTML-like label, line by line, without its markup (a heat map's cells have none)."""
    text = re.sub(r"<br/>|</TR>", "\n", label)
    text = html.unescape(re.sub(r"<[^>]*>", "", text))
    return [line for line in text.split("\n") if line]


def dot_graph(text):
    """The nodes [(name, shape, fill, border, label lines)] and edges [(from, to, label)] of the CLI's DOT text."""
    nodes, edges = [], []
    for line in text.splitlines():
        if m := EDGE.match(line):
            edges.append((m.group(1), m.group(2), m.group(3).replace('\\"', '"')))
        elif m := NODE.match(line):
            nodes.append((m.group(1), m.group(2), m.group(3), m.group(4), label_text(m.group(5))))
    return nodes, edges


def module_graph(graph):
    """The same records of the module's answer (opGraph)."""
    nodes = [(n["name"], n["shape"], n["fill"], n["border"], label_text("<br/>".join(n["lines"])))
             for n in graph["nodes"]]
    return nodes, [(e["from"], e["to"], e["label"]) for e in graph["edges"]]


def check_drawing(where, graph, drawn, failures):
    """The SVG shows the module's nodes and edges, boxes apart, each edge from its source's bottom to its target's
    top. Returns the number of boxes drawn."""
    if not drawn:
        failures.append(f"{where}: no graph was drawn")
        return 0
    names = [n["name"] for n in graph["nodes"]]
    if [n["name"] for n in drawn["nodes"]] != names:
        failures.append(f"{where}: the drawing's nodes {[n['name'] for n in drawn['nodes']]} are not {names}")
    if [(e["from"], e["to"]) for e in drawn["edges"]] != [(e["from"], e["to"]) for e in graph["edges"]]:
        failures.append(f"{where}: the drawing's edges are not the module's")
    boxes = {n["name"]: n["box"] for n in drawn["nodes"]}
    for i, a in enumerate(drawn["nodes"]):
        for b in drawn["nodes"][i + 1:]:
            (ax, ay, aw, ah), (bx, by, bw, bh) = a["box"], b["box"]
            if ax < bx + bw - 0.5 and bx < ax + aw - 0.5 and ay < by + bh - 0.5 and by < ay + ah - 0.5:
                failures.append(f"{where}: the boxes of {a['name']} and {b['name']} overlap")
    for e in drawn["edges"]:
        if e["from"] not in boxes or e["to"] not in boxes:
            failures.append(f"{where}: the edge {e['from']} -> {e['to']} joins a node that is not drawn")
            continue
        for (x, y), (bx, by, bw, bh), edge_y in ((e["start"], boxes[e["from"]], "bottom"),
                                                 (e["end"], boxes[e["to"]], "top")):
            want_y = by + bh if edge_y == "bottom" else by
            if not (bx - 1 <= x <= bx + bw + 1 and abs(y - want_y) <= 1.5):
                failures.append(f"{where}: the edge {e['from']} -> {e['to']} does not meet its box at the {edge_y}")
    return len(drawn["nodes"])


def check_graphs(args, results, failures, run_page, real_time):
    """The trace page's graph of each op's first case at two seeds, against `tapegrad graph`; and the drawings of the
    worked examples the trace test ran (run_page's answer for trace.html, passed in as results['trace_page'])."""
    cases = [{"op": op, "case": "", "seed": seed} for op, seed in GRAPH_CASES]
    _, r = run_page(args.site, args.out, "trace.html", {"graphs": cases, "showFirst": ".graph-panel"}, failures,
                    shot="trace-graph.png")
    boxes = 0
    for got in r.get("graphs", []):
        where = f"trace.html graph of {got['op']} case '{got['chosen']}' seed {got['seed']}"
        graph = got["graph"]
        if graph.get("error"):
            failures.append(f"{where}: {graph['error']}")
            continue
        if graph["unfused"] != (got["op"] in UNFUSED_OPS):
            failures.append(f"{where}: drawn {'unfused' if graph['unfused'] else 'fused'}")
        cmd = [args.cli, "graph", "--op", got["op"], "--case", got["chosen"], "--seed", str(got["seed"]),
               "--format", "dot", "-o", "-"] + (["--unfused"] if graph["unfused"] else [])
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        cli_nodes, cli_edges = dot_graph(run.stdout)
        page_nodes, page_edges = module_graph(graph)
        if run.returncode != 0 or not cli_nodes:
            failures.append(f"{where}: {' '.join(cmd)} failed: {run.stderr.strip()[-300:]}")
        elif page_nodes != cli_nodes:
            diff = next((p, c) for p, c in zip(page_nodes + [None] * len(cli_nodes), cli_nodes + [None] * len(
                page_nodes)) if p != c)
            failures.append(f"{where}: a node is not the terminal's: page {diff[0]}, terminal {diff[1]}")
        if page_edges != cli_edges:
            failures.append(f"{where}: the edges {page_edges} are not the terminal's {cli_edges}")
        if not got["command"].startswith(f"tapegrad graph --op {got['op']} --case '{got['chosen']}'"):
            failures.append(f"{where}: the page shows the command {got['command']!r}")
        boxes += check_drawing(where, graph, got["drawn"], failures)
    if len(r.get("graphs", [])) != len(cases):
        failures.append(f"trace.html: {len(r.get('graphs', []))} of {len(cases)} graphs were drawn")
    for got in results.pop("trace_page", {}).get("traces", []):
        where = f"trace.html graph of {got['op']}'s worked example seed {got['seed']} {got['shapes']}".strip()
        if not got.get("graph") or got["graph"].get("error"):
            failures.append(f"{where}: {(got.get('graph') or {}).get('error', 'not drawn')}")
            continue
        boxes += check_drawing(where, got["graph"], got["drawn"], failures)
    results["graphs_compared_with_terminal"] = len(r.get("graphs", []))
    timed = real_time(args, "trace.html", failures).get("graphs", [])
    results["graph_ms"] = timing([g["graph"].get("drawnMs", 0) for g in timed], "trace.html: the median drawing",
                                 failures)
    results["graph_boxes_drawn"] = boxes


def timing(times, what, failures):
    """The median and the largest of times in ms, taken at real time (the drawing's: the module's answer and the
    SVG; a panel's: the module's trace); a median over MAX_MEDIAN_MS is a failure."""
    ordered = sorted(times)
    median = ordered[len(ordered) // 2] if times else 0
    if median > MAX_MEDIAN_MS:
        failures.append(f"{what} took {median:.0f} ms (limit {MAX_MEDIAN_MS} ms)")
    return {"calls": len(times), "median": round(median, 1), "max": round(max(times, default=0), 1)}


def close(a, b):
    return abs(a - b) <= 1e-12 * (1 + abs(b))


def same_values(p, c):
    return p["shape"] == c["shape"] and len(p["values"]) == len(c["values"]) and all(
        close(x, y) for x, y in zip(p["values"], c["values"]))


def check_panels(args, page, chapter, results, failures, run_page, real_time):
    """Each panel of the chapter's page at two seeds: its lines, inputs and ȳ with the terminal's numbers. Returns
    run_page's answer."""
    wanted = [p for p in formula_panels.PANELS if p[0] == chapter]
    parsed, r = run_page(args.site, args.out, page, {"panels": [{"seed": s, "shapes": ""} for s in PANEL_SEEDS]},
                         failures, window="1280,7000")
    if len(r.get("panels", [])) != len(wanted) * len(PANEL_SEEDS):
        failures.append(f"{page}: {len(r.get('panels', []))} panels ran, not {len(wanted)} × {len(PANEL_SEEDS)}")
    terminal, compared = {}, 0
    for got, (_, anchor, _, op, lines) in zip(r.get("panels", []), wanted * len(PANEL_SEEDS)):
        where = f"{page}#{anchor} panel of {op} seed {got['seed']}"
        if got["op"] != op or got["wanted"] != lines:
            failures.append(f"{where}: the page's panel is of {got['op']} {got['wanted']}")
            continue
        if got.get("error") or got["missing"]:
            failures.append(f"{where}: {got.get('error') or 'no trace line for ' + repr(got['missing'])}")
            continue
        key = (op, got["seed"])
        if key not in terminal:
            run = subprocess.run([args.cli, "explain", op, "--trace", "--seed", str(got["seed"]), "--json"],
                                 capture_output=True, text=True, timeout=120)
            terminal[key] = json.loads(run.stdout)
        cli = terminal[key]
        by_formula = {line["formula"]: line["value"] for line in cli["lines"]}
        if len(got["lines"]) != len(lines):
            failures.append(f"{where}: {len(got['lines'])} lines shown for {len(lines)} named")
        pairs = [(p["value"], c["value"]) for p, c in zip(got["inputs"], cli["inputs"])] + [(got["ybar"], cli["ybar"])]
        for line in got["lines"]:
            if line["formula"] not in by_formula:
                failures.append(f"{where}: the terminal's trace has no line {line['formula']!r}")
                continue
            pairs.append((line["value"], by_formula[line["formula"]]))
        for p, c in pairs:
            if not same_values(p, c):
                failures.append(f"{where}: a value differs from the terminal's: {p} against {c}")
            compared += len(c["values"])
    results[f"{page}_panels"] = len(wanted)
    results[f"{page}_panel_ms"] = timing([got.get("wallMs", 0) for got in real_time(args, page, failures).get(
        "panels", [])], f"{page}: the median panel", failures)
    results[f"{page}_panel_numbers_compared"] = compared
    return parsed, r
