// Draws /v1/graph (mstar_compiler/graph_layout.py: the layout `mstarc graph` draws too) as SVG.
"use strict";
const SVG_NS = "http://www.w3.org/2000/svg";

function svgEl(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  if (parent) parent.appendChild(el);
  return el;
}

function svgText(parent, x, y, text, cls) {
  const t = svgEl("text", { x, y, class: cls || "" }, parent);
  t.textContent = text;
  return t;
}

// Path and label spot of a link between two node boxes; `k` of `n` links of the same pair are fanned out.
function route(a, b, k, n) {
  const off = (k - (n - 1) / 2) * 10;
  if (a === b) {
    // a loop carry: out of the right side and back in (the band's label sits above the node)
    const x = a.x + a.w, y1 = a.y + a.h * 0.3, y2 = a.y + a.h * 0.7, out = x + 34 + 10 * k;
    return { d: `M${x},${y1} C${out},${y1 - 14} ${out},${y2 + 14} ${x},${y2}`, lx: out + 2, ly: a.y + a.h + 14 + 12 * k };
  }
  if (b.x > a.x) {
    const x1 = a.x + a.w, y1 = a.y + a.h / 2 + off, x2 = b.x, y2 = b.y + b.h / 2 + off, mx = (x1 + x2) / 2;
    return { d: `M${x1},${y1} C${mx},${y1} ${mx},${y2} ${x2},${y2}`, lx: mx, ly: (y1 + y2) / 2 - 4 };
  }
  if (b.x === a.x) {   // same column, another row (or band): an arc on the left
    const x = a.x, y1 = a.y + a.h / 2 + off, y2 = b.y + b.h / 2 + off, out = x - 40 - Math.abs(off);
    return { d: `M${x},${y1} C${out},${y1} ${out},${y2} ${x},${y2}`, lx: out, ly: (y1 + y2) / 2 };
  }
  const x1 = a.x + a.w / 2 + off, y1 = a.y + a.h, x2 = b.x + b.w / 2 + off, y2 = b.y + b.h, down = 34 + 8 * k;
  const low = Math.max(y1, y2) + down;
  return { d: `M${x1},${y1} C${x1},${low} ${x2},${low} ${x2},${y2}`, lx: (x1 + x2) / 2, ly: low - 6 };
}

class GraphView {
  constructor(svg, layout) {
    this.svg = svg;
    this.layout = layout;
    this.nodes = {};      // name -> {g, box, lines: [text, text]}
    this.links = [];      // {path, label, walks}
    this.streams = {};    // stream name -> label element
    this.bands = {};      // rank -> label element
    this.draw();
  }

  draw() {
    const L = this.layout, svg = this.svg;
    svg.innerHTML = "";
    svg.setAttribute("viewBox", `0 0 ${L.width + 80} ${L.height + 40}`);   // room for carries on the right
    svg.setAttribute("width", L.width + 80);
    svg.setAttribute("height", L.height + 40);
    const defs = svgEl("defs", {}, svg);
    for (const [id, color] of [["arrow", "#556"], ["arrow-blue", "#2563eb"]]) {
      const m = svgEl("marker", { id, viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7,
                                  orient: "auto-start-reverse" }, defs);
      svgEl("path", { d: "M0,0 L10,5 L0,10 z", fill: color }, m);
    }
    for (const band of L.ranks) {
      const g = svgEl("g", { class: "band", "data-rank": band.index }, svg);
      svgEl("rect", { x: band.x, y: band.y, width: band.w, height: band.h, rx: 6 }, g);
      this.bands[band.index] = svgText(g, band.x + 8, band.y + 15, `rank ${band.index}`);
    }
    const boxes = Object.fromEntries(L.nodes.map(n => [n.name, n]));
    const links = [
      ...L.edges.map(e => ({ ...e, cls: "edge", text: `${e.src_port}→${e.dst_port}` })),
      ...L.carries.map(c => ({ ...c, cls: "carry", text: `carry ${c.dst_port}` })),
      ...L.streams.map(s => ({ ...s, cls: "stream", walks: null, text: `stream ${s.name} (${s.policy})` })),
    ];
    const pairCount = {}, pairSeen = {};
    for (const l of links) pairCount[l.src + ">" + l.dst] = (pairCount[l.src + ">" + l.dst] || 0) + 1;
    const layer = svgEl("g", { class: "links" }, svg);
    for (const l of links) {
      const pair = l.src + ">" + l.dst, k = pairSeen[pair] = (pairSeen[pair] ?? -1) + 1;
      const b = boxes[l.dst], a = boxes[l.src] || { x: b.x, y: b.y - 60, w: b.w, h: 0 };  // client-fed: from above
      const r = route(a, b, k, pairCount[pair]);
      if (l.cls === "stream") r.ly = Math.max(a.y + a.h, b.y + b.h) + 30;   // under the nodes: room for policy and fill
      const path = svgEl("path", { d: r.d, class: l.cls, "data-src": l.src, "data-dst": l.dst }, layer);
      if (l.cls === "stream") path.setAttribute("data-stream", l.name);
      svgEl("title", {}, path).textContent = l.text + (l.walks ? ` (walks: ${l.walks.join(", ")})` : "");
      const label = svgText(layer, r.lx, r.ly, l.text, l.cls === "stream" ? "stream-label" : "label");
      label.setAttribute("text-anchor", "middle");
      if (l.cls === "stream") this.streams[l.name] = { label, base: l.text };
      this.links.push({ path, label, walks: l.walks, src: l.src, dst: l.dst });
    }
    for (const n of L.nodes) this.drawNode(n);
  }

  drawNode(n) {
    const g = svgEl("g", { class: "node", "data-node": n.name }, this.svg);
    svgEl("rect", { x: n.x, y: n.y, width: n.w, height: n.h, rx: 5 }, g);
    svgText(g, n.x + 8, n.y + 15, n.name, "name");
    const where = n.ranks.length > 1 ? ` · ranks ${n.ranks.join(",")}${n.tp_size > 1 ? " TP" : ""}` : "";
    svgText(g, n.x + 8, n.y + 29, n.kind + where, "kind");
    const lines = [svgText(g, n.x + 8, n.y + 45, "waiting 0 · running 0", "counts"),
                   svgText(g, n.x + 8, n.y + 60, "batch 0 · 0.0/s" + (n.has_kv_cache ? " · KV 0/0" : ""), "rates")];
    this.nodes[n.name] = { g, box: n, lines };
  }

  // Dims everything a task's walks do not touch (null: show all).
  showWalks(walks) {
    const set = walks ? new Set(walks) : null;
    const used = new Set();
    if (set) for (const w of this.layout.walks) if (set.has(w.name)) w.nodes.forEach(n => used.add(n));
    for (const [name, v] of Object.entries(this.nodes)) v.g.classList.toggle("dim", !!set && !used.has(name));
    for (const l of this.links) {
      const on = !set || (l.walks ? l.walks.some(w => set.has(w)) : used.has(l.src) && used.has(l.dst));
      l.path.classList.toggle("dim", !on);
      l.label.classList.toggle("dim", !on);
    }
  }

  update(state, trackedNodes) {
    for (const [name, v] of Object.entries(this.nodes)) {
      const s = state.nodes[name];
      if (!s) continue;
      v.lines[0].textContent = `waiting ${s.waiting} · running ${s.running}`;
      const kv = s.kv ? ` · KV ${s.kv.used_blocks}/${s.kv.num_blocks}` : "";
      v.lines[1].textContent = `batch ${s.last_batch} · ${s.batches_per_s.toFixed(1)}/s${kv}`;
      // lit while running, or when it ran since the previous snapshot (a short run falls between two)
      v.g.classList.toggle("busy", s.running > 0 || (v.batches !== undefined && s.batches > v.batches));
      v.batches = s.batches;
      v.g.classList.toggle("queued", s.waiting > 0 && s.running === 0);
      v.g.classList.toggle("tracked", trackedNodes.has(name));
      v.g.dataset.waiting = s.waiting;
      v.g.dataset.running = s.running;
      v.g.dataset.batches = s.batches;
    }
    for (const [name, v] of Object.entries(this.streams)) {
      const s = state.streams[name];
      if (s) v.label.textContent = `${v.base} · ${s.buffered} buffered`;
    }
    for (const [rank, v] of Object.entries(this.bands)) {
      const r = state.ranks[rank];
      if (r) v.textContent = `rank ${rank} · busy ${(100 * r.busy).toFixed(0)}%`;
    }
  }
}
