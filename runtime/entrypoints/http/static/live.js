// The live feed: /v1/state/stream (Server-Sent Events, a few per second) onto the graph and the tables.
"use strict";

function fillTable(table, head, rows) {
  table.innerHTML = "";
  const tr = table.insertRow();
  for (const h of head) { const th = document.createElement("th"); th.textContent = h; tr.appendChild(th); }
  for (const row of rows) {
    const r = table.insertRow();
    for (const cell of row.cells) {
      const td = r.insertCell();
      if (cell instanceof Node) td.appendChild(cell); else td.textContent = cell;
    }
    if (row.attrs) for (const [k, v] of Object.entries(row.attrs)) r.setAttribute(k, v);
    if (row.onclick) r.onclick = row.onclick;
  }
}

function bar(share) {
  const b = document.createElement("span");
  b.className = "bar";
  const i = document.createElement("i");
  i.style.width = (100 * Math.min(1, share)).toFixed(0) + "%";
  b.appendChild(i);
  return b;
}

class LiveFeed {
  constructor(graph) {
    this.graph = graph;
    this.followed = null;      // request id the user clicked; else the newest live request is tracked
    this.state = null;
    this.status = document.getElementById("feed-status");
  }

  start() {
    const url = "/v1/state/stream" + (api.key ? "?api_key=" + encodeURIComponent(api.key) : "");
    this.source = new EventSource(url);
    this.source.addEventListener("state", ev => this.show(JSON.parse(ev.data)));
    this.source.onopen = () => { this.status.textContent = "live"; this.status.className = "status live"; };
    this.source.onerror = () => { this.status.textContent = "feed lost, retrying"; this.status.className = "status down"; };
  }

  tracked(state) {
    const reqs = state.requests;
    const req = reqs.find(r => r.id === this.followed) || reqs.reduce((a, r) => (!a || r.id > a.id ? r : a), null);
    return req;
  }

  show(state) {
    this.state = state;
    const req = this.tracked(state);
    const nodes = new Set(req ? req.tracks.flatMap(t => t.nodes.map(n => n.node)) : []);
    this.graph.update(state, nodes);
    document.body.dataset.snapshots = state.num_snapshots;
    document.getElementById("summary").textContent = `${state.num_requests} live request(s)`;
    fillTable(document.getElementById("ranks"), ["rank", "busy", ""],
      Object.entries(state.ranks).map(([r, v]) => ({ cells: [r, bar(v.busy), (100 * v.busy).toFixed(0) + "%"] })));
    const states = Object.keys(Object.values(state.tasks)[0] || {});
    fillTable(document.getElementById("tasks"), ["task", ...states],
      Object.entries(state.tasks).map(([t, v]) => ({ cells: [t, ...states.map(s => v[s])] })));
    fillTable(document.getElementById("streams"), ["stream", "buffered", "open"],
      Object.entries(state.streams).map(([s, v]) => ({ cells: [s, v.buffered, v.num_requests] })));
    fillTable(document.getElementById("requests"), ["id", "task", "state", "where (track: walk @ node)", "tokens", "age s"],
      state.requests.slice(0, 40).map(r => ({
        cells: [r.id, r.task, r.state,
                r.tracks.filter(t => t.walk).map(t => `${t.name}: ${t.walk} @ ${t.nodes.map(n => n.node + (n.running ? " (running)" : "")).join(", ")}`).join("; "),
                r.num_output_tokens, r.age_s.toFixed(1)],
        attrs: req && r.id === req.id ? { class: "tracked" } : {},
        onclick: () => { this.followed = r.id; this.show(this.state); },
      })));
  }
}
