// The workbook's page script (docs/web.md): lays out the math of a page with KaTeX, and on the pages that load the
// WebAssembly module (tapegrad.js, web/bindings.cpp) runs the checker for the exercise boxes, the trace form and the
// claim form, the op's tape on the trace page (drawn by web/graph_layout.js) and the chapters' panels of numbers. Each
// check's result is shown as the terminal prints it; a section that was checked gets the event
// "tapegrad-checked" with the result as its detail.
"use strict";

(function () {
  // Every element of class "math" holds TeX; KaTeX replaces it with its layout. A formula KaTeX cannot read is
  // left as text, marked, and reported on the console.
  function renderMath() {
    if (typeof katex === "undefined") return;
    for (const el of document.querySelectorAll(".math")) {
      const tex = el.textContent;
      try {
        katex.render(tex, el, { displayMode: el.classList.contains("display"), throwOnError: true });
      } catch (e) {
        el.textContent = tex;
        el.classList.add("math-error");
        console.error("KaTeX could not lay out " + JSON.stringify(tex) + ": " + e.message);
      }
    }
  }

  // The module, made once; null on a page that does not load it.
  const moduleReady = typeof createTapegrad === "function" ? createTapegrad() : null;

  function setStatus(text, failed) {
    for (const el of document.querySelectorAll(".module-status")) {
      el.textContent = text;
      el.classList.toggle("failed", Boolean(failed));
    }
  }

  // A call into the module: its JSON answer as an object, the time it took in ms added as wallMs.
  async function call(name, ...args) {
    const module = await moduleReady;
    const start = performance.now();
    const result = JSON.parse(module[name](...args));
    result.wallMs = performance.now() - start;
    return result;
  }

  // The rule lines of an exercise's boxes, in their order: "vjp x = F", "jvp F"; an empty box is left out (its
  // input keeps the forward's own rule, as an option left out of `tapegrad exercise` does).
  function rulesOf(section) {
    const rules = [];
    for (const box of section.querySelectorAll("input.answer")) {
      const formula = box.value.trim();
      if (!formula) continue;
      rules.push(box.dataset.kind === "vjp" ? `vjp ${box.dataset.input} = ${formula}` : `jvp ${formula}`);
    }
    return rules;
  }

  async function checkExercise(section) {
    const out = section.querySelector(".result");
    const rules = rulesOf(section);
    out.classList.remove("right", "wrong", "error");
    let result;
    if (rules.length === 0) {
      result = { error: "exercise: no rule to check: write one in each box" };
    } else {
      out.textContent = "checking…";
      result = await call("checkExercise", section.dataset.name, JSON.stringify(rules));
    }
    result.rules = rules;
    if (result.error) {
      out.textContent = "tapegrad: error: " + result.error;
      out.classList.add("error");
    } else {
      out.textContent = result.text;
      out.classList.add(result.passed ? "right" : "wrong");
    }
    section.dispatchEvent(new CustomEvent("tapegrad-checked", { detail: result }));
    return result;
  }

  function setUpExercises() {
    for (const section of document.querySelectorAll("section.exercise")) {
      section.querySelector("form.rules").addEventListener("submit", (event) => {
        event.preventDefault();
        checkExercise(section);
      });
      section.querySelector(".show-answer").addEventListener("click", () => {
        const answer = section.querySelector(".answer-text");
        answer.hidden = !answer.hidden;
      });
    }
  }

  // "x=2,4 y=3": [["x", [2, 4]], ["y", [3]]], as --shape NAME=D,D,... reads them; throws for anything else.
  function parseShapes(text) {
    const shapes = [];
    for (const part of text.trim().split(/\s+/).filter(Boolean)) {
      const m = /^([A-Za-z_][A-Za-z0-9_]*)=(\d+(,\d+)*)$/.exec(part);
      if (!m) throw new Error(`--shape: expected NAME=D,D,... (as x=2,4), got '${part}'`);
      shapes.push([m[1], m[2].split(",").map(Number)]);
    }
    return shapes;
  }

  // A float64 matrix (shape, values in row-major order) as a table, six significant digits as the terminal's.
  function matrixTable(value) {
    const shape = value.shape.length ? value.shape : [1];
    const cols = shape[shape.length - 1];
    const table = document.createElement("table");
    table.className = "matrix";
    for (let r = 0; r < value.values.length / cols; ++r) {
      const row = table.insertRow();
      for (let c = 0; c < cols; ++c) row.insertCell().textContent = Number(value.values[r * cols + c].toPrecision(6));
    }
    return table;
  }

  // One line of a trace under parent: its title over its value's table.
  function addTraceLine(parent, title, value) {
    const div = document.createElement("div");
    div.className = "trace-line";
    const h = document.createElement("p");
    h.textContent = title;
    div.append(h, matrixTable(value));
    parent.append(div);
  }

  // A call into the module with a form's seed and shapes after its other arguments, as the terminal's --seed and
  // --shape take them; an error (a seed that is not a whole number, shapes it cannot read) as {error}.
  async function callAt(name, form, ...args) {
    const seed = form.seed.value.trim();
    try {
      if (!/^\d+$/.test(seed)) throw new Error(`--seed: '${seed}' is not a whole number`);
      return await call(name, ...args, Number(seed), JSON.stringify(parseShapes(form.shapes.value)));
    } catch (e) {
      return { error: e.message };
    }
  }

  // The shapes of a form as the terminal's options: " --shape x=2,4 --shape ...".
  function shapeOptions(form) {
    return form.shapes.value.trim().split(/\s+/).filter(Boolean).map((s) => ` --shape ${s}`).join("");
  }

  // The module's trace of op at the seed and shapes of form (a trace page's or a panel's): {result, command}.
  async function traceOf(op, form) {
    const result = await callAt("traceExample", form, op);
    return { result, command: `tapegrad explain ${op} --trace --seed ${form.seed.value.trim()}${shapeOptions(form)}` };
  }

  async function runTrace(form) {
    const op = form.op.value, lines = document.querySelector(".trace-lines");
    const text = document.querySelector(".trace-text");
    lines.textContent = "";
    const { result, command } = await traceOf(op, form);
    document.querySelector(".trace-command").textContent = command;
    if (result.error) {
      text.textContent = "tapegrad: error: " + result.error;
      lines.textContent = text.textContent;
      lines.className = "trace-lines error";
    } else {
      text.textContent = result.text;
      lines.className = "trace-lines";
      const add = (title, value) => addTraceLine(lines, title, value);
      for (const input of result.json.inputs) add(`${input.name}, an input`, input.value);
      add("ȳ, the cotangent", result.json.ybar);
      for (const line of result.json.lines) add(`${line.part}: ${line.formula}`, line.value);
      for (const j of result.json.jacobians) if (j.value) add(`the Jacobian ∂y/∂${j.input} (${j.rows} × ${j.cols})`, j.value);
    }
    if (document.querySelector(".graph-panel")) result.graph = await drawOpGraph();
    document.querySelector(".trace-form").dispatchEvent(new CustomEvent("tapegrad-checked", { detail: result }));
    return result;
  }

  // The op's tape on the trace page, drawn in the page (web/graph_layout.js): the worked example at the form's seed
  // and shapes, or the gradcheck case chosen, as `tapegrad graph --op OP [--case NAME] --unfused` draws it. The
  // panel gets the event "tapegrad-graph-drawn" with opGraph's answer as its detail (drawnMs: the time to the
  // drawing, in ms).
  async function drawOpGraph() {
    const start = performance.now();
    const form = document.querySelector("form.trace-form"), panel = document.querySelector(".graph-panel");
    const select = panel.querySelector("select.graph-case"), out = panel.querySelector(".graph");
    const op = form.op.value, seed = form.seed.value.trim();
    if (select.dataset.op !== op) select.value = "";
    const caseName = select.value;
    const result = await callAt("opGraph", form, op, caseName);
    if (result.cases && select.dataset.op !== op) {
      select.length = 1;
      for (const name of result.cases) select.add(new Option(`case '${name}'`, name));
      select.dataset.op = op;
    }
    const shapes = shapeOptions(form);
    panel.querySelector(".graph-command").textContent = caseName
      ? `tapegrad graph --op ${op} --case '${caseName}'${result.unfused ? " --unfused" : ""} --seed ${seed} --format dot` +
        (shapes ? `, at${shapes}` : "")
      : `the worked example of tapegrad explain ${op} --trace --seed ${seed}${shapes}, drawn as tapegrad graph draws a case`;
    out.textContent = "";
    out.classList.toggle("error", Boolean(result.error));
    panel.querySelector(".graph-caption").textContent = "";
    if (result.error) {
      out.textContent = "tapegrad: error: " + result.error;
    } else {
      out.append(window.tapegradGraph.drawGraph(result));
      panel.querySelector(".graph-caption").textContent = window.tapegradGraph.captionLines(result.caption).join("\n");
    }
    result.drawnMs = performance.now() - start;  // the module's answer and its drawing
    panel.dispatchEvent(new CustomEvent("tapegrad-graph-drawn", { detail: result }));
    return result;
  }

  // A panel of numbers beside a chapter's formulas (web/formula_panels.py): the trace's lines it names, with the
  // inputs (and ȳ where it shows a line of the VJP), at the panel's seed and shapes. A name that finds no line of the
  // trace, or several, is an error on the console: the chapter and the trace have drifted apart.
  async function runPanel(panel) {
    const form = panel.querySelector("form.numbers-form"), out = panel.querySelector(".numbers-lines");
    const op = panel.dataset.op, wanted = JSON.parse(panel.dataset.lines);
    const { result, command } = await traceOf(op, form);
    panel.querySelector(".numbers-command").textContent = command;
    out.textContent = "";
    out.classList.toggle("error", Boolean(result.error));
    const detail = { op, seed: form.seed.value.trim(), shapes: form.shapes.value, wanted, error: result.error,
                     lines: [], missing: [], wallMs: result.wallMs };
    if (result.error) {
      out.textContent = "tapegrad: error: " + result.error;
    } else {
      for (const start of wanted) {
        const found = result.json.lines.filter((l) => l.formula.startsWith(start));
        if (found.length !== 1) {
          detail.missing.push(start);
          console.error(`${op}: the panel's line '${start}' finds ${found.length} lines of tapegrad explain ${op} ` +
                        "--trace (web/formula_panels.py)");
        }
      }
      const shown = result.json.lines.filter((l) => wanted.some((start) => l.formula.startsWith(start)));
      const add = (title, value) => addTraceLine(out, title, value);
      for (const input of result.json.inputs) add(`${input.name}, an input`, input.value);
      if (shown.some((l) => l.part !== "forward")) add("ȳ, the cotangent", result.json.ybar);
      for (const line of shown) add(line.formula, line.value);
      detail.lines = shown;
      detail.inputs = result.json.inputs;
      detail.ybar = result.json.ybar;
    }
    panel.dispatchEvent(new CustomEvent("tapegrad-checked", { detail }));
    return detail;
  }

  async function checkClaims(form) {
    const out = document.querySelector(".claim-result");
    out.textContent = "checking…";
    const result = await call("checkClaims", form.claims.value);
    out.classList.remove("right", "wrong", "error");
    if (result.error) {
      out.textContent = "tapegrad: error: " + result.error;
      out.classList.add("error");
    } else {
      out.textContent = result.claims.map((c) => `# ${c.where}\n${c.text}\n`).join("") + result.summary;
      out.classList.add(result.claims.every((c) => c.passed) ? "right" : "wrong");
    }
    form.dispatchEvent(new CustomEvent("tapegrad-checked", { detail: result }));
    return result;
  }

  function setUpForms() {
    const trace = document.querySelector("form.trace-form");
    if (trace) trace.addEventListener("submit", (event) => { event.preventDefault(); runTrace(trace); });
    const claim = document.querySelector("form.claim-form");
    if (claim) claim.addEventListener("submit", (event) => { event.preventDefault(); checkClaims(claim); });
    const graphCase = document.querySelector("select.graph-case");
    if (graphCase) graphCase.addEventListener("change", () => drawOpGraph());
    for (const panel of document.querySelectorAll(".formula-numbers")) {
      panel.querySelector("form").addEventListener("submit", (event) => { event.preventDefault(); runPanel(panel); });
    }
    return trace;
  }

  // One check of the page's first exercise with its answer, or of the claim page's example, its result unused, as
  // the module loads: the browser compiles the module's code in a quick first tier and its busy functions again,
  // optimized, as they run, so the reader's first check runs on the optimized code (an exercise's took 230 to 670 ms
  // in Chromium on a loaded 2-core machine without this, 120 ms a check in the middle; a claims file's, 590 ms).
  async function warmUp() {
    const first = document.querySelector("section.exercise");
    const claims = document.querySelector("form.claim-form");
    if (first) {
      const rules = first.querySelector(".answer-text").textContent.split("\n").filter(Boolean);
      await call("checkExercise", first.dataset.name, JSON.stringify(rules));
    } else if (claims) {
      await call("checkClaims", claims.claims.value);
    }
  }

  renderMath();
  setUpExercises();
  const traceForm = setUpForms();
  // Settles once the module is loaded and the trace page's first example has run.
  const pageReady = moduleReady && moduleReady.then(
    async () => {
      await warmUp();
      setStatus("The checker is loaded: it runs in this page.");
      if (traceForm) await runTrace(traceForm);
      for (const panel of document.querySelectorAll(".formula-numbers")) await runPanel(panel);
    },
    (e) => {
      setStatus("The checker could not be loaded: " + e, true);
      console.error("tapegrad.js: " + e);
    });
  // For a script that drives the page (web/browser_test.py): the page's readiness and the checks the buttons run.
  window.tapegradWorkbook = { ready: pageReady, checkExercise, runTrace, checkClaims, drawOpGraph, runPanel };
})();
