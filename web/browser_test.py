"""The workbook's pages in a real browser (headless Chromium), against the terminal (docs/web.md, "The test").

    python3 web/browser_test.py --site build-web/site --cli build/tapegrad --out build-web/browser-test

For every page of the set: it renders with no console error, no uncaught exception, no resource or font that fails
to load and no formula KaTeX cannot lay out, and a page with the module says it loaded. On the exercise pages, each
exercise's answer (docs/exercises.txt) is typed into its boxes and must be accepted, and each planted slip (`slip
KIND:` lines, typed with the answer's other rules) must be named with the kind the file gives it and with the same
kinds, inputs and checks as `tapegrad exercise NAME --vjp ...` names them. On the trace page, each op's worked
example, at two seeds and a shape, has the numbers of `tapegrad explain OP --trace --json` and the same text, and the
op's tape drawn there has the boxes and edges of `tapegrad graph` (web/browser_test_views.py), none overlapping. On the
claim page, each file of docs/claims/ gets the terminal's verdicts and kinds. The chapter pages are compared with
their Markdown: the page's source hash, headings and code blocks; their panels of numbers at two seeds have the
numbers of `tapegrad explain OP --trace --json`. The page set must be under 3 MB, and the median
exercise check, timed at real time (web/browser_pipe.py), within 200 ms in the page. Screenshots of every page go
to OUT/screenshots; OUT/report.json has every result. Exit 0 when all hold, 1 when one does not (each failure
printed), 2 when it cannot run.
"""

import argparse
import hashlib
import html.parser
import json
import os
import re
import shutil
import signal
import subprocess
import sys

import browser_pipe
import browser_test_views
import formula_panels

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
MAX_SITE_BYTES = 3_000_000
MAX_CHECK_MS = browser_test_views.MAX_MEDIAN_MS
TRACE_CASES = [(op, seed, "") for op in ("softmax", "attention", "layer_norm", "row_normalize")
               for seed in (20240809, 7)] + [("softmax", 3, "x=2,4")]


class Setup(Exception):
    """What the test needs and cannot find."""


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    raise Setup("no chromium on the PATH (Debian: chromium; tools/dev.sh web installs it)")


def browser(url, *extra, budget_ms=120000, timeout=180):
    """Chromium headless on url: (stdout, stderr). Chromium in its own process group, all of which is ended where
    it runs past the timeout (a headless run now and then never ends); then it is tried once more."""
    args = ["nice", "-n", "10", chromium(), "--headless=new", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
            "--enable-logging=stderr", "--v=0", f"--virtual-time-budget={budget_ms}"]
    if os.geteuid() == 0:
        args.append("--no-sandbox")  # Chromium refuses to run as root inside its sandbox
    for _ in range(2):
        process = subprocess.Popen(args + list(extra) + [url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, start_new_session=True)
        try:
            return process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
    return "", f"chromium ran past {timeout} s twice on {url}"


def read_exercise_file(path):
    """docs/exercises.txt's exercises: [{name, answer: [rule], slips: [(kind, rule)]}], in order."""
    exercises = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if m := re.match(r"^exercise (\S+)", line):
                exercises.append({"name": m.group(1), "answer": [], "slips": []})
            elif m := re.match(r"^answer (.+)$", line):
                exercises[-1]["answer"].append(m.group(1).strip())
            elif m := re.match(r"^slip (\w+): (.+)$", line):
                exercises[-1]["slips"].append((m.group(1), m.group(2).strip()))
    return exercises


def with_slip(answer, slip_rule):
    """The answer's rules with the slip's in place of the answer's for the same rule, in the answer's order."""
    head = slip_rule.split("=")[0].strip() if slip_rule.startswith("vjp") else "jvp"
    return [slip_rule if (r.split("=")[0].strip() if r.startswith("vjp") else "jvp") == head else r for r in answer]


def cli_exercise(cli, name, rules):
    """`tapegrad exercise NAME --vjp ...`: (exit code, stdout, [(kind, input, check)] of its diagnosis lines)."""
    args = [cli, "exercise", name]
    for r in rules:
        args += ["--vjp", r[4:]] if r.startswith("vjp ") else ["--jvp", r[4:]]
    run = subprocess.run(args, capture_output=True, text=True, timeout=120)
    return run.returncode, run.stdout, diagnosis_lines(run.stdout)


def diagnosis_lines(text):
    """The [kind] input, check: lines of a report, as (kind, where) pairs."""
    return [(m.group(1), m.group(2).strip()) for m in re.finditer(r"^\s+\[([^\]]+)\] ([^:]*):", text, re.M)]


class PageText(html.parser.HTMLParser):
    """A page's DOM as the test reads it: the text of headings and of <pre> blocks, in order, and the results."""

    def __init__(self):
        super().__init__()
        self.headings, self.pres, self.meta, self.results = [], [], {}, None
        self._stack, self._text = [], []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "meta" and attrs.get("name"):
            self.meta[attrs["name"]] = attrs.get("content", "")
        if tag in ("h1", "h2", "h3", "h4", "pre"):
            self._stack.append((tag, attrs.get("id", "")))
            self._text = []
        if tag == "annotation":  # KaTeX's copy of the TeX, beside its layout: read once, from the layout
            self._stack.append(("annotation", ""))

    def handle_endtag(self, tag):
        if self._stack and self._stack[-1][0] == tag:
            kind, ident = self._stack.pop()
            text = "".join(self._text)
            if kind == "pre" and ident == "tapegrad-test-results":
                self.results = json.loads(text)
            elif kind == "pre":
                self.pres.append(text)
            elif kind != "annotation":
                self.headings.append(" ".join(text.split()))
            if kind != "annotation":
                self._text = []

    def handle_data(self, data):
        if self._stack and self._stack[-1][0] != "annotation":
            self._text.append(data)


def driven_copy(site, out, page, cases):
    """A copy of site/page in out/pages/ that loads the capture script first and the driver last, with the cases."""
    with open(os.path.join(site, page), encoding="utf-8") as f:
        text = f.read()
    base = "file://" + os.path.abspath(site) + "/"
    capture = "file://" + os.path.join(HERE, "browser_test_capture.js")
    driver = "file://" + os.path.join(HERE, "browser_test_driver.js")
    text = text.replace("<head>", f'<head>\n<base href="{base}">\n<script src="{capture}"></script>', 1)
    text = text.replace("</body>", f"<script>window.tapegradTestCases = {json.dumps(cases)};</script>\n"
                                   f'<script src="{driver}"></script>\n</body>', 1)
    path = os.path.abspath(os.path.join(out, "pages", page))
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    return path


def run_page(site, out, page, cases, failures, shot=None, window="1280,2200"):
    """The page driven in Chromium (its DOM read back), then a screenshot of it driven again (OUT/screenshots/shot,
    by default the page's name with .png)."""
    path = driven_copy(site, out, page, cases)
    for _ in range(2):  # a headless run on a loaded machine now and then dumps the page before its driver is done
        dom, log = browser("file://" + path, "--dump-dom")
        parsed = PageText()
        parsed.feed(dom)
        if parsed.results is not None:
            break
    if parsed.results is None:
        failures.append(f"{page}: the driver did not finish, twice (stderr: {log[-800:]})")
        return parsed, {}
    shot = os.path.abspath(os.path.join(out, "screenshots", shot or page.replace(".html", ".png")))
    browser("file://" + path, f"--screenshot={shot}", f"--window-size={window}")
    if not os.path.exists(shot):
        failures.append(f"{page}: no screenshot was written")
    r = parsed.results
    for e in r["errors"]:
        failures.append(f"{page}: {e}")
    for line in log.splitlines():  # what the page logged that its scripts could not catch
        if ":CONSOLE" in line and ("Uncaught" in line or "ERROR" in line.split("]")[0]):
            failures.append(f"{page}: console: {line.strip()}")
    if r["mathErrors"]:
        failures.append(f"{page}: {r['mathErrors']} formulas KaTeX could not lay out")
    with open(os.path.join(site, page), encoding="utf-8") as f:
        loads_module = 'src="tapegrad.js"' in f.read()
    if loads_module and "is loaded" not in r["status"]:
        failures.append(f"{page}: the module did not load: {r['status']!r}")
    return parsed, r


def check_exercises(args, results, failures, report):
    by_page = {}
    for page in sorted(os.listdir(args.site)):
        if page.startswith("exercises-") and page.endswith(".html"):
            with open(os.path.join(args.site, page), encoding="utf-8") as f:
                for name in re.findall(r'<section class="exercise" id="([^"]+)"', f.read()):
                    by_page.setdefault(page, []).append(name)
    exercises = read_exercise_file(os.path.join(ROOT, "docs", "exercises.txt"))
    on_pages = [n for names in by_page.values() for n in names]
    if on_pages != [e["name"] for e in exercises]:
        failures.append(f"the exercise pages hold {on_pages}, docs/exercises.txt {[e['name'] for e in exercises]}")
    times = []
    for page, names in by_page.items():
        cases = []
        for e in (x for x in exercises if x["name"] in names):
            cases.append({"name": e["name"], "label": "answer", "rules": e["answer"], "slip": None})
            for kind, rule in e["slips"]:
                cases.append({"name": e["name"], "label": f"slip {kind}: {rule}", "rules": with_slip(e["answer"], rule),
                              "slip": kind})
        _, r = run_page(args.site, args.out, page, {"exercises": cases}, failures)
        # The time each check takes, at real time (the dump above runs under virtual time, whose clock stands still).
        try:
            timed = browser_pipe.results_at_real_time(chromium(), "file://" + os.path.abspath(
                os.path.join(args.out, "pages", page)))["exercises"]
        except browser_pipe.PipeError as e:
            failures.append(f"{page}: the run at real time failed: {e}")
            timed = []
        times += [got.get("wallMs", 0) for got in timed]
        for case, got in zip(cases, r.get("exercises", [])):
            where = f"{page} {case['name']} ({case['label']})"
            report.append({"page": page, **case, "page_result": got})
            if got.get("missing") or got.get("error"):
                failures.append(f"{where}: {got.get('error') or 'no such exercise on the page'}")
                continue
            code, text, cli_kinds = cli_exercise(args.cli, case["name"], got["rules"])
            page_kinds = [(d["kind"], (d["input"] + (", " + d["check"] if d["check"] else "")).strip(", "))
                          for d in got["diagnoses"]]
            report[-1].update(cli_exit=code, cli_text=text, same_text=text == got["shown"])
            if case["slip"] is None and not (got["passed"] and code == 0):
                failures.append(f"{where}: the answer is not accepted (page passed={got['passed']}, cli exit {code})")
            if case["slip"] is not None:
                keys = {d["key"] for d in got["diagnoses"]}
                if got["passed"] or code != 1:
                    failures.append(f"{where}: the slip is accepted (page passed={got['passed']}, cli exit {code})")
                if case["slip"] not in keys:
                    failures.append(f"{where}: the page does not name [{case['slip']}]: {sorted(keys)}")
                if page_kinds != cli_kinds:
                    failures.append(f"{where}: the page names {page_kinds}, the terminal {cli_kinds}")
            if got["shown"].splitlines()[0] != text.splitlines()[0]:
                failures.append(f"{where}: the page says {got['shown'].splitlines()[0]!r}, the terminal "
                                f"{text.splitlines()[0]!r}")
        if len(r.get("exercises", [])) != len(cases):
            failures.append(f"{page}: {len(r.get('exercises', []))} of {len(cases)} cases ran")
    results["exercise_cases"] = len(report)
    # The median check must take at most MAX_CHECK_MS; the slowest are reported, not held to it: on a machine whose
    # cores other work keeps busy, a check now and then waits for the CPU.
    results["check_ms"] = browser_test_views.timing(times, "the median exercise check in the page", failures)
    results["check_ms"][f"over_{MAX_CHECK_MS}"] = sum(1 for t in times if t > MAX_CHECK_MS)
    results["same_text_as_terminal"] = sum(1 for x in report if x.get("same_text"))


ROUNDING_LINE = re.compile(r"max \||^\s+\S+\s+(vjp|jvp|adjoint|accumulate)\s+\S+\s+\d")


def same_text(text):
    """A trace's text without the lines that hold rounding's differences."""
    return [line for line in text.splitlines() if not ROUNDING_LINE.search(line)]


def check_traces(args, results, failures):
    cases = [{"op": op, "seed": seed, "shapes": shapes} for op, seed, shapes in TRACE_CASES]
    _, r = run_page(args.site, args.out, "trace.html", {"traces": cases}, failures)
    compared = 0
    for case, got in zip(cases, r.get("traces", [])):
        where = f"trace.html {case['op']} seed {case['seed']} {case['shapes']}".strip()
        if got.get("error"):
            failures.append(f"{where}: {got['error']}")
            continue
        cmd = [args.cli, "explain", case["op"], "--trace", "--seed", str(case["seed"])]
        cmd += [f"--shape={s}" for s in case["shapes"].split()]
        cli_json = json.loads(subprocess.run(cmd + ["--json"], capture_output=True, text=True, timeout=120).stdout)
        cli_text = subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout
        page_json = got["json"]
        pairs = [(p["value"], c["value"]) for p, c in zip(page_json["inputs"], cli_json["inputs"])]
        pairs.append((page_json["ybar"], cli_json["ybar"]))
        pairs += [(p["value"], c["value"]) for p, c in zip(page_json["lines"], cli_json["lines"])]
        pairs += [(p["value"], c["value"]) for p, c in zip(page_json["jacobians"], cli_json["jacobians"])
                  if "value" in c]
        if [x["formula"] for x in page_json["lines"]] != [x["formula"] for x in cli_json["lines"]]:
            failures.append(f"{where}: the page's lines are not the terminal's")
        for p, c in pairs:
            if not browser_test_views.same_values(p, c):
                failures.append(f"{where}: a value differs from the terminal's: {p} against {c}")
            compared += len(c["values"])
        # The text, but for the lines of differences at rounding's size: "max |...|" lines and the rows of the node's
        # check table, whose errors are rounding's (the order of a product's additions differs).
        if same_text(got["text"]) != same_text(cli_text):
            failures.append(f"{where}: the page's text is not the terminal's")
        if not page_json["passed"]:
            failures.append(f"{where}: the trace does not pass in the page")
    results["trace_cases"] = len(r.get("traces", []))
    results["trace_page"] = r  # its drawings of the worked examples, for browser_test_views.check_graphs
    results["trace_numbers_compared"] = compared


def check_claims(args, results, failures):
    folder = os.path.join(ROOT, "docs", "claims")
    files = sorted(f for f in os.listdir(folder) if f.endswith(".txt"))
    cases = [{"label": f, "text": open(os.path.join(folder, f), encoding="utf-8").read()} for f in files]
    _, r = run_page(args.site, args.out, "claim.html", {"claims": cases}, failures)
    for case, got in zip(cases, r.get("claims", [])):
        run = subprocess.run([args.cli, "claim", "--file", os.path.join(folder, case["label"]), "--json"],
                             capture_output=True, text=True, timeout=300)
        cli = json.loads(run.stdout)
        if got.get("error"):
            failures.append(f"claim.html {case['label']}: {got['error']}")
            continue
        page = [(c["claim"], c["passed"], [d["kind"] for d in c["diagnoses"]]) for c in got["claims"]]
        term = [(c["claim"], c["passed"], [d["kind"] for d in c["diagnoses"]]) for c in cli]
        if page != term:
            failures.append(f"claim.html {case['label']}: the page gives {page}, the terminal {term}")
    results["claim_files"] = len(r.get("claims", []))
    # each file's check at real time, as the exercises' (the dump above runs under virtual time), and a claim's: a
    # file's time over its claims
    timed = real_time(args, "claim.html", failures).get("claims", [])
    files = [got.get("wallMs", 0) for got in timed]
    claims = [got.get("wallMs", 0) / max(1, len(got.get("claims") or [])) for got in timed]
    results["claim_file_ms"] = browser_test_views.timing(files, "the median claims file's check", failures)
    results["claim_ms"] = browser_test_views.timing(claims, "the median claim's check", failures)
    results["claim_ms"][f"over_{MAX_CHECK_MS}"] = sum(1 for t in claims if t > MAX_CHECK_MS)
    results["claim_ms"]["claims"] = sum(len(got.get("claims") or []) for got in timed)


def check_chapters(args, results, failures):
    for md, page in (("reverse-mode.md", "reverse-mode.html"), ("learn.md", "learn.html")):
        with open(os.path.join(ROOT, "docs", md), encoding="utf-8") as f:
            text = f.read()
        if any(p[0] == md for p in formula_panels.PANELS):  # its panels of numbers, against the terminal's
            parsed, _ = browser_test_views.check_panels(args, page, md, results, failures, run_page, real_time)
        else:
            parsed, _ = run_page(args.site, args.out, page, {}, failures)
        digest = hashlib.sha256(text.encode("utf-8")).hexdigest()
        if parsed.meta.get("tapegrad-source") != f"docs/{md} sha256:{digest}":
            failures.append(f"{page} was made from another docs/{md} (run bash tools/dev.sh web again)")
        # Headings and code blocks, in order, as the Markdown has them.
        prose = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)  # a "# comment" in a code block is no heading
        headings = [re.sub(r"[`*]|\$[^$]*\$", "", h[h.index(" ") + 1:]).split()
                    for h in re.findall(r"^#{1,4} .+$", prose, re.M)]
        page_heads = [re.sub(r"\s+", " ", h) for h in parsed.headings]
        for words in headings:
            if not any(all(w in h for w in words) for h in page_heads):
                failures.append(f"{page}: the heading {' '.join(words)!r} of docs/{md} is not on the page")
        blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, re.M | re.S)
        pres = [p for p in parsed.pres]
        at = 0
        for block in blocks:
            block = block.rstrip("\n")
            while at < len(pres) and pres[at] != block:
                at += 1
            if at == len(pres):
                failures.append(f"{page}: a code block of docs/{md} is not on the page, in order: {block[:60]!r}")
                break
        results[f"{page}_headings"] = len(headings)
        results[f"{page}_code_blocks"] = len(blocks)


def real_time(args, page, failures):
    """The driven copy of page run again at real time (web/browser_pipe.py): the driver's results, or {}."""
    try:
        return browser_pipe.results_at_real_time(chromium(), "file://" + os.path.abspath(
            os.path.join(args.out, "pages", page)))
    except browser_pipe.PipeError as e:
        failures.append(f"{page}: the run at real time failed: {e}")
        return {}


def check_other_pages(args, failures):
    for page in ("index.html",):
        run_page(args.site, args.out, page, {}, failures)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--site", required=True)
    parser.add_argument("--cli", required=True, help="the tapegrad program the pages are compared with")
    parser.add_argument("--out", required=True, help="the test's folder: pages driven, screenshots, report.json")
    args = parser.parse_args()
    try:
        chromium()
        for path in (args.site, args.cli):
            if not os.path.exists(path):
                raise Setup(f"{path} is missing")
    except Setup as e:
        print(f"browser_test: error: {e}", file=sys.stderr)
        return 2
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(os.path.join(args.out, "pages"))
    os.makedirs(os.path.join(args.out, "screenshots"))
    failures, results, report = [], {}, []
    size = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(args.site) for f in fs)
    results["site_bytes"] = size
    if size >= MAX_SITE_BYTES:
        failures.append(f"the page set is {size} bytes, over {MAX_SITE_BYTES}")
    check_chapters(args, results, failures)
    check_other_pages(args, failures)
    check_exercises(args, results, failures, report)
    check_traces(args, results, failures)
    browser_test_views.check_graphs(args, results, failures, run_page, real_time)
    check_claims(args, results, failures)
    results["screenshots"] = sorted(os.listdir(os.path.join(args.out, "screenshots")))
    results["failures"] = failures
    with open(os.path.join(args.out, "report.json.tmp"), "w", encoding="utf-8") as f:
        json.dump({"summary": results, "exercises": report}, f, indent=1, ensure_ascii=False)
    os.replace(os.path.join(args.out, "report.json.tmp"), os.path.join(args.out, "report.json"))
    for failure in failures:
        print("FAIL", failure)
    print(json.dumps({k: v for k, v in results.items() if k != "failures"}, ensure_ascii=False))
    print(f"browser test: {'passed' if not failures else f'{len(failures)} failures'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
