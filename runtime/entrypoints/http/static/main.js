// Starts the page: asks for the API key if the server wants one, draws the graph, opens the feed.
"use strict";

function taskButtons(graph, layout) {
  const root = document.getElementById("task-walks");
  const buttons = [];
  const add = (label, walks) => {
    const b = document.createElement("button");
    b.textContent = label;
    b.onclick = () => { graph.showWalks(walks); buttons.forEach(x => x.classList.toggle("on", x === b)); };
    buttons.push(b);
    root.appendChild(b);
  };
  add("all walks", null);
  for (const t of layout.tasks) {
    const walks = t.tracks.flatMap(tr => tr.walks);
    add(`${t.name}: ${t.tracks.map(tr => (t.tracks.length > 1 ? tr.name + " = " : "") + tr.walks.join(" → ")).join(" ‖ ")}`, walks);
  }
  buttons[0].classList.add("on");
}

async function start() {
  let layout;
  try {
    layout = await api.json("/v1/graph");
  } catch (err) {
    if (err.status !== 401) throw err;
    const form = document.getElementById("key-form");
    form.hidden = false;
    document.getElementById("key-error").textContent = api.key ? "that key was refused" : "";
    form.onsubmit = ev => {
      ev.preventDefault();
      api.key = document.getElementById("key-input").value;
      localStorage.setItem("mstar-api-key", api.key);
      form.hidden = true;
      start();
    };
    return;
  }
  document.getElementById("model").textContent = `${layout.model_id} · preset ${layout.preset} · placement ${layout.placement}`;
  const graph = new GraphView(document.getElementById("graph"), layout);
  taskButtons(graph, layout);
  const labels = document.getElementById("port-labels");
  labels.onchange = () => document.getElementById("graph").classList.toggle("show-labels", labels.checked);
  buildPlayground(document.getElementById("playground"), layout);
  window.mstar = { layout, graph, feed: new LiveFeed(graph) };
  window.mstar.feed.start();
  document.body.dataset.ready = "1";
}

start();
