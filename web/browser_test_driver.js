// Drives a copy of one page of the workbook in headless Chromium for web/browser_test.py: fills the exercise boxes
// with each case's rules and presses Check, runs the trace form and the claim form with each case, as a reader
// would, and writes what the page showed into <pre id="tapegrad-test-results"> as JSON, with the errors the page
// raised (web/browser_test_capture.js collects them from the start). The cases are window.tapegradTestCases:
//   {exercises: [{name, label, rules: ["vjp x = F", ...]}], traces: [{op, seed, shapes}], claims: [{label, text}],
//    graphs: [{op, case, seed}], panels: [{seed, shapes}], showFirst: a selector}
// A drawn graph is read back with its geometry: each node's box (its shape's bounding box), each edge's two ends.
"use strict";

(async function () {
  const cases = window.tapegradTestCases || {};
  const results = { exercises: [], traces: [], graphs: [], panels: [], claims: [], status: "", katex: 0, mathErrors: 0 };

  function once(target, type) {
    return new Promise((resolve) => target.addEventListener(type, (e) => resolve(e.detail), { once: true }));
  }

  // Presses the form's submit button and waits for the page to say it checked.
  async function submit(form, eventTarget) {
    const done = once(eventTarget, "tapegrad-checked");
    form.querySelector('[type="submit"]').click();
    return done;
  }

  // The SVG of the trace page's graph: {nodes: [{name, box: [x, y, w, h]}], edges: [{from, to, start, end}]}.
  function drawnGraph() {
    const svg = document.querySelector(".graph svg");
    if (!svg) return null;
    const nodes = [...svg.querySelectorAll("g.node")].map((g) => {
      const b = g.querySelector("rect, ellipse").getBBox();
      return { name: g.dataset.name, box: [b.x, b.y, b.width, b.height] };
    });
    const edges = [...svg.querySelectorAll("g.edge")].map((g) => {
      const path = g.querySelector("path"), length = path.getTotalLength();
      const a = path.getPointAtLength(0), b = path.getPointAtLength(length);
      return { from: g.dataset.from, to: g.dataset.to, start: [a.x, a.y], end: [b.x, b.y] };
    });
    return { nodes, edges };
  }

  try {
    const workbook = window.tapegradWorkbook;
    if (workbook && workbook.ready) await workbook.ready;
    for (const c of cases.exercises || []) {
      const section = document.getElementById(c.name);
      if (!section) {
        results.exercises.push({ name: c.name, label: c.label, missing: true });
        continue;
      }
      for (const box of section.querySelectorAll("input.answer")) {
        const rule = c.rules.find((r) => box.dataset.kind === "vjp"
          ? r.startsWith(`vjp ${box.dataset.input} =`) : r.startsWith("jvp "));
        box.value = rule ? rule.slice(rule.indexOf(box.dataset.kind === "vjp" ? "=" : " ") + 1).trim() : "";
      }
      const result = await submit(section.querySelector("form.rules"), section);
      results.exercises.push({
        name: c.name, label: c.label, rules: result.rules, passed: result.passed, error: result.error,
        shown: section.querySelector(".result").textContent, diagnoses: result.diagnoses || [], ms: result.ms,
        wallMs: result.wallMs,
      });
    }
    const traceForm = document.querySelector("form.trace-form");
    for (const c of cases.traces || []) {
      traceForm.op.value = c.op;
      traceForm.seed.value = String(c.seed);
      traceForm.shapes.value = c.shapes;
      const result = await submit(traceForm, traceForm);
      results.traces.push({ op: c.op, seed: c.seed, shapes: c.shapes, error: result.error,
                            text: result.text, json: result.json, wallMs: result.wallMs,
                            rows: document.querySelectorAll(".trace-line").length,
                            graph: result.graph, drawn: drawnGraph() });
    }
    for (const c of cases.graphs || []) {
      traceForm.op.value = c.op;
      traceForm.seed.value = String(c.seed);
      traceForm.shapes.value = "";
      await submit(traceForm, traceForm);  // the op's worked example, and the op's cases in the list
      const panel = document.querySelector(".graph-panel"), select = panel.querySelector("select.graph-case");
      const drawn = once(panel, "tapegrad-graph-drawn");
      select.value = c.case || select.options[1].value;  // "": the op's first case
      select.dispatchEvent(new Event("change"));
      const result = await drawn;
      results.graphs.push({ ...c, chosen: select.value, graph: result, drawn: drawnGraph(),
                            command: panel.querySelector(".graph-command").textContent });
    }
    const panels = [...document.querySelectorAll(".formula-numbers")];
    for (const c of cases.panels || []) {
      for (const panel of panels) {
        const form = panel.querySelector("form.numbers-form");
        form.seed.value = String(c.seed);
        form.shapes.value = c.shapes;
        results.panels.push(await submit(form, panel));
      }
    }
    const claimForm = document.querySelector("form.claim-form");
    for (const c of cases.claims || []) {
      claimForm.claims.value = c.text;
      const result = await submit(claimForm, claimForm);
      results.claims.push({ label: c.label, error: result.error, claims: result.claims, ms: result.ms,
                            wallMs: result.wallMs });
    }
  } catch (e) {
    console.error("browser test driver: " + (e && e.stack ? e.stack : e));
  }
  // For the screenshot: the view named by showFirst moved to the top of the page.
  const first = cases.showFirst && document.querySelector(cases.showFirst);
  if (first) document.querySelector("main").prepend(first);
  await document.fonts.ready;
  document.fonts.forEach((f) => { if (f.status === "error") window.tapegradTestErrors.push("font not loaded: " + f.family); });
  const status = document.querySelector(".module-status");
  results.status = status ? status.textContent : "";
  results.katex = document.querySelectorAll(".katex").length;
  results.mathErrors = document.querySelectorAll(".math-error").length;
  results.errors = window.tapegradTestErrors || [];
  const out = document.createElement("pre");
  out.id = "tapegrad-test-results";
  out.textContent = JSON.stringify(results);
  document.body.append(out);
  document.title = "tapegrad-test-done";
})();
