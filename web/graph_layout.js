// An op's tape drawn in the page as SVG (docs/web.md): the boxes and edges that `tapegrad graph` writes as DOT
// (opGraph of the module, web/op_graph.cpp), laid out here in layers, since the page has no Graphviz.
//
// The layout: a node's layer is the longest path to it from a node with no input; an edge that spans several layers
// passes through a point of its own in each layer between (a "dummy"), so that it can bend around the boxes there.
// Within a layer the order is improved by barycenter sweeps (a node goes to the mean position of its neighbours in
// the layer above, then below) and the order with the fewest crossings between neighbouring layers is kept. Each
// layer is then placed left to right with a gap between boxes, each box as near as the gap allows to the mean x of
// its neighbours, and the layer shifted by the mean of what the gaps pushed it off. Edges are cubic curves, vertical
// where they leave a box and where they enter one.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const GAP_X = 24, GAP_Y = 44, PAD_X = 10, PAD_Y = 6, MARGIN = 12, LINE = 14, SMALL_LINE = 13;
  let drawings = 0;  // each drawing's arrow marker gets an id of its own

  // A line of HTML-like markup as its plain text.
  function plainText(line) {
    return line.replace(/<[^>]*>/g, "").replace(/&lt;/g, "<").replace(/&gt;/g, ">").replace(/&quot;/g, '"')
      .replace(/&amp;/g, "&");
  }

  // A line of a Graphviz HTML-like label as {text, bold, small, italic, colour}, or a heat map (a <TABLE> of cells,
  // inspect/heat_map.cpp) as {heat: rows of colours (null: the gap between two matrices), cell: a cell's side}.
  function labelLine(line) {
    if (line.startsWith("<TABLE")) {
      const rows = [...line.matchAll(/<TR>(.*?)<\/TR>/g)].map((r) =>
        [...r[1].matchAll(/<TD( BGCOLOR="(#[0-9a-fA-F]{6})")?[^>]*><\/TD>/g)].map((c) => c[2] || null));
      const cell = /<TD[^>]* WIDTH="(\d+)"/.exec(line);
      return { heat: rows, cell: cell ? Number(cell[1]) : 6, text: "" };
    }
    const colour = /color="(#[0-9a-fA-F]{6})"/.exec(line);
    return {
      text: plainText(line),
      bold: line.includes("<b>"),
      small: line.includes('point-size="9"'),
      italic: line.includes("<i>"),
      colour: colour ? colour[1] : null,
    };
  }

  // The width of text in the face the SVG uses, measured on a canvas.
  const measure = (() => {
    const context = document.createElement("canvas").getContext("2d");
    return (text, bold, small) => {
      context.font = `${bold ? "bold " : ""}${small ? 9 : 10}px Helvetica, Arial, sans-serif`;
      return context.measureText(text).width;
    };
  })();

  function lineHeight(l) { return l.heat ? l.heat.length * l.cell + 4 : l.small ? SMALL_LINE : LINE; }

  function makeNodes(graph) {
    return graph.nodes.map((n, index) => {
      const lines = n.lines.map(labelLine);
      const width = (l) => l.heat ? Math.max(0, ...l.heat.map((r) => r.length)) * l.cell : measure(l.text, l.bold, l.small);
      const textWidth = Math.max(...lines.map(width), 10);
      const textHeight = lines.reduce((h, l) => h + lineHeight(l), 0);
      const ellipse = n.shape === "ellipse";
      // An ellipse with axes 1.3 times the text box's (with its padding): √2 times would hold the box's corners too,
      // which a label's first and last lines, seldom its widest, do not reach.
      const w = (textWidth + 2 * PAD_X) * (ellipse ? 1.3 : 1), h = (textHeight + 2 * PAD_Y) * (ellipse ? 1.3 : 1);
      return { ...n, index, lines, w, h, textHeight, dummy: false, inputs: [], outputs: [] };
    });
  }

  // Layers by the longest path from the nodes without inputs (Kahn's order: a node after all of its inputs).
  function assignLayers(nodes) {
    const indegree = nodes.map((n) => n.inputs.length);
    const queue = nodes.filter((n, i) => indegree[i] === 0);
    for (const n of queue) n.layer = 0;
    for (let at = 0; at < queue.length; ++at) {
      for (const e of queue[at].outputs) {
        const to = e.to;
        to.layer = Math.max(to.layer || 0, queue[at].layer + 1);
        if (--indegree[to.index] === 0) queue.push(to);
      }
    }
    if (queue.length !== nodes.length) throw new Error("graph: the tape's edges make a cycle");
  }

  // Each edge split into edges of one layer each, through a dummy node per layer it crosses.
  function splitLongEdges(nodes, edges) {
    const short = [];
    for (const e of edges) {
      let from = e.from;
      e.points = [];
      for (let layer = e.from.layer + 1; layer < e.to.layer; ++layer) {
        const d = { dummy: true, layer, w: 2, h: 2, inputs: [], outputs: [], index: nodes.length };
        nodes.push(d);
        e.points.push(d);
        short.push({ from, to: d });
        from = d;
      }
      short.push({ from, to: e.to });
    }
    for (const n of nodes) { n.up = []; n.down = []; }
    for (const s of short) { s.from.down.push(s.to); s.to.up.push(s.from); }
    return short;
  }

  function crossings(layers, short) {
    let count = 0;
    for (let l = 0; l + 1 < layers.length; ++l) {
      const between = short.filter((s) => s.from.layer === l).map((s) => [s.from.order, s.to.order]);
      for (let i = 0; i < between.length; ++i)
        for (let j = i + 1; j < between.length; ++j)
          if ((between[i][0] - between[j][0]) * (between[i][1] - between[j][1]) < 0) ++count;
    }
    return count;
  }

  function setOrder(layer) { layer.forEach((n, i) => { n.order = i; }); }

  // Barycenter sweeps, down then up, keeping the order of fewest crossings.
  function orderLayers(layers, short) {
    layers.forEach(setOrder);
    let best = layers.map((l) => l.slice()), fewest = crossings(layers, short);
    const mean = (list, fallback) => list.length ? list.reduce((s, n) => s + n.order, 0) / list.length : fallback;
    for (let sweep = 0; sweep < 6 && fewest > 0; ++sweep) {
      const down = sweep % 2 === 0;
      const sequence = down ? layers.slice(1) : layers.slice(0, -1).reverse();
      for (const layer of sequence) {
        const key = new Map(layer.map((n) => [n, mean(down ? n.up : n.down, n.order)]));
        layer.sort((a, b) => key.get(a) - key.get(b) || a.order - b.order);
        setOrder(layer);
      }
      const count = crossings(layers, short);
      if (count < fewest) { fewest = count; best = layers.map((l) => l.slice()); }
    }
    best.forEach(setOrder);
    return best;
  }

  // x of each node (its centre) and y of each layer (its top), from the orders.
  function place(layers) {
    for (const layer of layers) {
      let x = 0;
      for (const n of layer) { n.x = x + n.w / 2; x += n.w + GAP_X; }
    }
    for (let pass = 0; pass < 8; ++pass) {
      const down = pass % 2 === 0;
      for (const layer of down ? layers.slice(1) : layers.slice(0, -1).reverse()) {
        const wanted = layer.map((n) => {
          const near = down ? n.up : n.down;
          return near.length ? near.reduce((s, m) => s + m.x, 0) / near.length : n.x;
        });
        let right = -Infinity;
        layer.forEach((n, i) => {
          n.x = Math.max(wanted[i], right + n.w / 2);
          right = n.x + n.w / 2 + GAP_X;
        });
        const shift = layer.reduce((s, n, i) => s + wanted[i] - n.x, 0) / layer.length;
        if (shift < 0) for (const n of layer) n.x += shift;  // back left by the mean push; gaps are kept
      }
    }
    const left = Math.min(...layers.flat().map((n) => n.x - n.w / 2));
    let y = MARGIN;
    for (const layer of layers) {
      const height = Math.max(...layer.map((n) => n.h));
      for (const n of layer) { n.x += MARGIN - left; n.y = y + (height - n.h) / 2; }
      y += height + GAP_Y;
    }
    return y - GAP_Y + MARGIN;
  }

  function element(name, attributes, parent) {
    const el = document.createElementNS(SVG, name);
    for (const [k, v] of Object.entries(attributes)) el.setAttribute(k, v);
    if (parent) parent.append(el);
    return el;
  }

  function title(parent, text) { element("title", {}, parent).textContent = text; }

  // Where the edges meet their boxes: the k edges into a box end at k points spread along its top, in the order of
  // where they come from (the x of the point before), and the edges out of a box leave from points along its bottom,
  // in the order of where they go.
  function spreadEnds(nodes) {
    const spread = (n, list, key, set) => {
      const step = Math.min(16, n.w / (list.length + 1));
      list.slice().sort((a, b) => key(a) - key(b)).forEach((e, i) => set(e, n.x + (i - (list.length - 1) / 2) * step));
    };
    for (const n of nodes) {
      spread(n, n.inputs, (e) => (e.points.length ? e.points[e.points.length - 1] : e.from).x, (e, x) => { e.endX = x; });
      spread(n, n.outputs, (e) => (e.points.length ? e.points[0] : e.to).x, (e, x) => { e.startX = x; });
    }
  }

  // The path of an edge: from the bottom of its source to the top of its target, through its dummies' points.
  function edgePath(e) {
    const points = [[e.startX, e.from.y + e.from.h]];
    for (const d of e.points) points.push([d.x, d.y], [d.x, d.y + d.h]);
    points.push([e.endX, e.to.y]);
    let d = `M${points[0][0].toFixed(1)},${points[0][1].toFixed(1)}`;
    for (let i = 1; i < points.length; ++i) {
      const [x0, y0] = points[i - 1], [x1, y1] = points[i], mid = (y0 + y1) / 2;
      d += ` C${x0.toFixed(1)},${mid.toFixed(1)} ${x1.toFixed(1)},${mid.toFixed(1)} ${x1.toFixed(1)},${y1.toFixed(1)}`;
    }
    return d;
  }

  function drawNode(n, svg) {
    const g = element("g", { class: "node", "data-name": n.name }, svg);
    title(g, n.tooltip);
    const style = { fill: n.fill, stroke: n.border, "stroke-width": n.bad ? 2 : 1 };
    if (n.shape === "ellipse") {
      element("ellipse", { cx: n.x, cy: n.y + n.h / 2, rx: n.w / 2, ry: n.h / 2, ...style }, g);
    } else {
      element("rect", { x: n.x - n.w / 2, y: n.y, width: n.w, height: n.h, rx: n.shape === "box3d" ? 0 : 3, ...style }, g);
    }
    if (n.loss) element("rect", { x: n.x - n.w / 2 + 3, y: n.y + 3, width: n.w - 6, height: n.h - 6, fill: "none", stroke: n.border }, g);
    const text = element("text", { "text-anchor": "middle" }, g);
    let y = n.y + (n.h - n.textHeight) / 2;
    for (const l of n.lines) {
      if (l.heat) {  // one square per element, each row of the map centred in the box
        l.heat.forEach((row, r) => row.forEach((colour, c) => {
          if (colour) element("rect", { x: n.x - row.length * l.cell / 2 + c * l.cell, y: y + 2 + r * l.cell,
                                        width: l.cell, height: l.cell, fill: colour }, g);
        }));
        y += lineHeight(l);
        continue;
      }
      y += l.small ? SMALL_LINE : LINE;
      const span = element("tspan", { x: n.x, y: y - 3.5, "font-size": l.small ? 9 : 10 }, text);
      if (l.bold) span.setAttribute("font-weight", "bold");
      if (l.italic) span.setAttribute("font-style", "italic");
      if (l.colour) span.setAttribute("fill", l.colour);
      span.textContent = l.text;
    }
  }

  // The SVG of a graph ({nodes, edges} as opGraph answers them): an <svg> element, its nodes <g class="node"
  // data-name=NAME>, its edges <g class="edge" data-from=NAME data-to=NAME>, in the module's order.
  function drawGraph(graph) {
    const nodes = makeNodes(graph);
    const byName = new Map(nodes.map((n) => [n.name, n]));
    const edges = graph.edges.map((e) => {
      const from = byName.get(e.from), to = byName.get(e.to);
      if (!from || !to) throw new Error(`graph: an edge ${e.from} -> ${e.to} joins a node that is not drawn`);
      const edge = { ...e, from, to };
      from.outputs.push(edge);
      to.inputs.push(edge);
      return edge;
    });
    const real = nodes.length;
    assignLayers(nodes);
    const short = splitLongEdges(nodes, edges);
    const layers = [];
    for (const n of nodes) (layers[n.layer] = layers[n.layer] || []).push(n);
    const ordered = orderLayers(layers.filter(Boolean), short);
    const height = place(ordered);
    spreadEnds(nodes.slice(0, real));
    const width = Math.max(...nodes.map((n) => n.x + n.w / 2)) + MARGIN;
    const id = `tapegrad-arrow-${++drawings}`;
    const svg = element("svg", { class: "tape-graph", width: width.toFixed(0), height: height.toFixed(0),
                                 viewBox: `0 0 ${width.toFixed(0)} ${height.toFixed(0)}`,
                                 "font-family": "Helvetica, Arial, sans-serif" });
    const marker = element("marker", { id, viewBox: "0 0 8 8", refX: 8, refY: 4, markerWidth: 6, markerHeight: 6,
                                       orient: "auto" }, element("defs", {}, svg));
    element("path", { d: "M0,0 L8,4 L0,8 z", fill: "#555555" }, marker);
    for (const e of edges) {
      const g = element("g", { class: "edge", "data-from": e.from.name, "data-to": e.to.name }, svg);
      title(g, `${e.label}: ${e.tooltip}`);
      element("path", { d: edgePath(e), fill: "none", stroke: "#555555", "marker-end": `url(#${id})` }, g);
    }
    for (const n of nodes.slice(0, real)) drawNode(n, svg);
    return svg;
  }

  // A caption's HTML-like lines (split at <br/>) as plain text lines.
  function captionLines(caption) {
    return caption.split("<br/>").map(plainText);
  }

  window.tapegradGraph = { drawGraph, captionLines };
})();
