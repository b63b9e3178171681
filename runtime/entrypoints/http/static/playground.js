// The playground: one panel per task the plan serves (GET /v1/graph's `playground`), each a real API call.
"use strict";

function el(tag, attrs, parent, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  if (parent) parent.appendChild(e);
  return e;
}

function panel(root, title) {
  const p = el("div", { class: "panel" }, root);
  el("h3", {}, p, title);
  return p;
}

async function guarded(out, fn) {
  out.classList.remove("error");
  out.dataset.done = "0";
  try { await fn(); } catch (err) { out.classList.add("error"); out.textContent = "error: " + err.message; }
  out.dataset.done = "1";
}

function chatPanel(root, model) {
  const p = panel(root, "Chat (streamed)");
  const input = el("textarea", { id: "chat-input", rows: 3 }, p, "What is the capital of France?");
  el("label", {}, p, "max tokens ");
  const max = el("input", { id: "chat-max", type: "number", value: 32, min: 1, style: "width:5em" }, p);
  const go = el("button", { id: "chat-send" }, p, "Send");
  const out = el("div", { id: "chat-output", class: "output" }, p);
  go.onclick = () => guarded(out, async () => {
    out.textContent = "";
    const resp = await api.post("/v1/chat/completions", { model, stream: true, temperature: 0,
      max_tokens: Number(max.value), messages: [{ role: "user", content: input.value }] });
    await api.sse(resp, ev => {
      if (ev.error) throw new Error(ev.error.message);
      const delta = ev.choices && ev.choices[0] && ev.choices[0].delta;
      if (delta && delta.content) out.textContent += delta.content;
    });
  });
}

function imagePanel(root, model, spec) {
  const p = panel(root, spec.edit ? "Images: generate and edit" : "Images: generate");
  const prompt = el("input", { id: "image-prompt", type: "text", value: "a red cat" }, p);
  const size = el("select", { id: "image-size" }, p);
  for (let s = spec.stride; s <= Math.min(spec.max_side, 512); s *= 2) {
    el("option", Object.assign({ value: `${s}x${s}` }, s === Math.min(64, spec.max_side) ? { selected: "" } : {}), size, `${s}×${s}`);
  }
  el("label", {}, p, " steps ");
  const steps = el("input", { id: "image-steps", type: "number", value: 4, min: 2, style: "width:4em" }, p);
  const go = el("button", { id: "image-go" }, p, "Generate");
  const edit = spec.edit ? el("button", { id: "image-edit", disabled: "" }, p, "Edit this image") : null;
  const out = el("div", { id: "image-output", class: "output" }, p);
  const img = el("img", { id: "image-result", alt: "" }, p);
  let last = null;
  const show = async resp => {
    const body = await resp.json();
    last = body.data[0].b64_json;
    img.src = "data:image/png;base64," + last;
    await img.decode();
    out.textContent = `${img.naturalWidth}×${img.naturalHeight} PNG`;
    if (edit) edit.disabled = false;
  };
  go.onclick = () => guarded(out, async () => {
    out.textContent = "generating…";
    await show(await api.post("/v1/images/generations", { model, prompt: prompt.value, size: size.value,
                                                         steps: Number(steps.value), seed: 1 }));
  });
  if (edit) edit.onclick = () => guarded(out, async () => {
    out.textContent = "editing…";
    const form = new FormData();
    const bytes = Uint8Array.from(atob(last), c => c.charCodeAt(0));
    form.append("image", new Blob([bytes], { type: "image/png" }), "image.png");
    for (const [k, v] of [["model", model], ["prompt", prompt.value], ["size", size.value], ["steps", steps.value]]) form.append(k, v);
    await show(await api.post("/v1/images/edits", form));
  });
}

function wavBlob(pcm, rate) {
  const head = new DataView(new ArrayBuffer(44));
  const text = (o, s) => [...s].forEach((c, i) => head.setUint8(o + i, c.charCodeAt(0)));
  text(0, "RIFF"); head.setUint32(4, 36 + pcm.length, true); text(8, "WAVE"); text(12, "fmt ");
  head.setUint32(16, 16, true); head.setUint16(20, 1, true); head.setUint16(22, 1, true);
  head.setUint32(24, rate, true); head.setUint32(28, rate * 2, true); head.setUint16(32, 2, true);
  head.setUint16(34, 16, true); text(36, "data"); head.setUint32(40, pcm.length, true);
  return new Blob([head, pcm], { type: "audio/wav" });
}

// Plays 16-bit PCM chunks as they arrive (Web Audio), keeps them for the audio element at the end.
class PcmPlayer {
  constructor(rate) {
    this.rate = rate; this.parts = []; this.size = 0; this.carry = null; this.next = 0;
    try { this.ctx = new AudioContext(); } catch (e) { this.ctx = null; }
  }
  push(bytes) {
    if (this.carry) { const j = new Uint8Array(this.carry.length + bytes.length); j.set(this.carry); j.set(bytes, 1); bytes = j; this.carry = null; }
    if (bytes.length % 2) { this.carry = bytes.slice(-1); bytes = bytes.slice(0, -1); }
    if (!bytes.length) return;
    this.parts.push(bytes); this.size += bytes.length;
    if (!this.ctx) return;
    const samples = new Int16Array(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
    const buf = this.ctx.createBuffer(1, samples.length, this.rate);
    const ch = buf.getChannelData(0);
    for (let i = 0; i < samples.length; i++) ch[i] = samples[i] / 32768;
    const src = this.ctx.createBufferSource();
    src.buffer = buf; src.connect(this.ctx.destination);
    this.next = Math.max(this.next, this.ctx.currentTime);
    src.start(this.next); this.next += buf.duration;
  }
  pcm() {
    const all = new Uint8Array(this.size);
    let o = 0;
    for (const p of this.parts) { all.set(p, o); o += p.length; }
    return all;
  }
}

function speechPanel(root, model, spec) {
  const p = panel(root, "Speech (streamed, played as it decodes)");
  const input = el("input", { id: "speech-input", type: "text", value: "Hello there." }, p);
  const voice = el("select", { id: "speech-voice" }, p);
  for (const v of spec.voices) el("option", { value: v }, voice, v);
  el("label", {}, p, " max tokens ");
  const max = el("input", { id: "speech-max", type: "number", value: 140, min: 7, style: "width:5em" }, p);
  const go = el("button", { id: "speech-go" }, p, "Speak");
  const out = el("div", { id: "speech-output", class: "output" }, p);
  const audio = el("audio", { id: "speech-audio", controls: "" }, p);
  go.onclick = () => guarded(out, async () => {
    out.textContent = "speaking…";
    const player = new PcmPlayer(spec.sample_rate);
    const resp = await api.post("/v1/audio/speech", { model, input: input.value, voice: voice.value, stream: true,
                                                     response_format: "pcm", max_tokens: Number(max.value) });
    const reader = resp.body.getReader();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      player.push(value);
      out.textContent = `${(player.size / 2 / spec.sample_rate).toFixed(2)} s of audio so far`;
    }
    audio.src = URL.createObjectURL(wavBlob(player.pcm(), spec.sample_rate));
    audio.dataset.bytes = player.size;
    out.textContent = `${(player.size / 2 / spec.sample_rate).toFixed(2)} s of audio at ${spec.sample_rate} Hz`;
  });
}

function contextFrame(size, shade) {
  const c = el("canvas", { width: size, height: size });
  const g = c.getContext("2d");
  const grad = g.createLinearGradient(0, 0, size, size);
  grad.addColorStop(0, `rgb(${shade},80,160)`); grad.addColorStop(1, "rgb(240,220,90)");
  g.fillStyle = grad; g.fillRect(0, 0, size, size);
  return c.toDataURL("image/png").split(",")[1];
}

function plotTrajectory(svg, points) {
  svg.innerHTML = "";
  if (!points.length) return;
  const xs = points.map(p => p[0]), ys = points.map(p => p[1]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const sx = v => 10 + 180 * (x1 > x0 ? (v - x0) / (x1 - x0) : 0.5), sy = v => 110 - 100 * (y1 > y0 ? (v - y0) / (y1 - y0) : 0.5);
  svgEl("polyline", { points: points.map(p => `${sx(p[0])},${sy(p[1])}`).join(" "), fill: "none", stroke: "#2563eb" }, svg);
  points.forEach((p, i) => svgText(svg, sx(p[0]) + 3, sy(p[1]) - 3, String(i + 1), "plot-label"));
}

function rolloutPanel(root, model, spec) {
  const p = panel(root, "Rollout (predicted embedding trajectory: patch-mean of dims 0 and 1)");
  el("label", {}, p, "horizon ");
  const horizon = el("input", { id: "rollout-horizon", type: "number", value: 3, min: 1, style: "width:4em" }, p);
  const go = el("button", { id: "rollout-go" }, p, "Roll out");
  const out = el("div", { id: "rollout-output", class: "output" }, p);
  const plot = svgEl("svg", { id: "rollout-plot", width: 200, height: 120, style: "background:#fff;border:1px solid #ddd" }, p);
  go.onclick = () => guarded(out, async () => {
    const H = Number(horizon.value), frames = [];
    for (let i = 0; i < spec.tubelet_size; i++) frames.push(contextFrame(spec.image_size, 40 + 60 * i));
    const actions = Array.from({ length: H }, (_, t) => Array.from({ length: spec.action_dim }, (_, d) => 0.05 * Math.sin(t + d)));
    const points = [];
    const resp = await api.post("/v1/rollouts", { model, frames, actions, stream: true });
    await api.sse(resp, ev => {
      if (ev.error) throw new Error(ev.error.message);
      if (ev.object !== "rollout.frame") return;
      const [P, E] = ev.shape, mean = [0, 1].map(d => ev.embeddings.reduce((s, row) => s + row[d], 0) / P);
      points.push(mean);
      plotTrajectory(plot, points);
      out.textContent = `${points.length} frame(s) of ${P}×${E}`;
    });
  });
}

function buildPlayground(root, layout) {
  const spec = layout.playground, model = layout.model_id;
  if (spec.chat) chatPanel(root, model);
  if (spec.images) imagePanel(root, model, spec.images);
  if (spec.speech) speechPanel(root, model, spec.speech);
  if (spec.rollout) rolloutPanel(root, model, spec.rollout);
  if (!root.querySelector(".panel")) el("p", {}, root, "This plan serves no task the playground knows (use POST /v1/tasks/{task}).");
}
