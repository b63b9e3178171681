// The one place the page talks to the server: the API key, JSON, streamed bodies, SSE lines.
"use strict";
const api = {
  key: localStorage.getItem("mstar-api-key") || "",
  headers(extra) {
    const h = Object.assign({}, extra || {});
    if (api.key) h["Authorization"] = "Bearer " + api.key;
    return h;
  },
  async json(path) {
    const resp = await fetch(path, { headers: api.headers() });
    if (!resp.ok) throw await api.error(resp);
    return resp.json();
  },
  async post(path, body, extraHeaders) {
    const isForm = body instanceof FormData;
    const headers = api.headers(isForm ? extraHeaders : Object.assign({ "Content-Type": "application/json" }, extraHeaders));
    const resp = await fetch(path, { method: "POST", headers, body: isForm ? body : JSON.stringify(body) });
    if (!resp.ok) throw await api.error(resp);
    return resp;
  },
  async error(resp) {
    let message = resp.status + " " + resp.statusText;
    try { message = (await resp.json()).error.message; } catch (e) { /* not an OpenAI error body */ }
    const err = new Error(message);
    err.status = resp.status;
    return err;
  },
  // Calls onData(parsed JSON) for each `data:` line of an SSE body; stops at [DONE].
  async sse(resp, onData) {
    const reader = resp.body.getReader();
    const decoder = new TextDecoder();
    let buffered = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffered += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, cut).trim();
        buffered = buffered.slice(cut + 1);
        if (!line.startsWith("data:")) continue;
        const data = line.slice(5).trim();
        if (data === "[DONE]") return;
        onData(JSON.parse(data));
      }
    }
  },
};
