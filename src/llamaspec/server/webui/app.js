// llamaspec's chat page (ADR 0032). Plain browser JavaScript, no build step, nothing fetched but this
// server's own API. Model text is only ever written with textContent / text nodes, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const SVG_NS = "http://www.w3.org/2000/svg";
const KEY_STORE = "llamaspec.apiKey";   // sessionStorage: this tab only
const THEME_STORE = "llamaspec.theme";  // localStorage: "light", "dark" or absent (the system's)

const state = {
  key: sessionStorage.getItem(KEY_STORE) || "",
  props: null,
  messages: [],      // the conversation sent with each request: {role, content}
  busy: null,        // the running request's AbortController
  turns: [],         // per answer: {tokens, rate, acceptance, cached}
  answer: null,      // the running answer's figures (newAnswer())
  chat: 0,           // bumped by New chat: an answer still streaming then belongs to no conversation
};

// -- the server's API -------------------------------------------------------------------------------

class KeyNeeded extends Error {}

async function api(path, init = {}) {
  const headers = new Headers(init.headers || {});
  if (state.key) headers.set("Authorization", "Bearer " + state.key);
  const r = await fetch(path, { ...init, headers });
  if (r.status === 401) {
    askKey(state.key ? "That key was refused." : "");
    throw new KeyNeeded("the server needs an API key");
  }
  return r;
}

async function errorText(r) {
  try {
    const body = await r.json();
    return (body.error && body.error.message) || JSON.stringify(body);
  } catch (e) {
    return r.status + " " + r.statusText;
  }
}

function askKey(message) {
  $("key").hidden = false;  // the header's button opens the dialog again after Esc
  $("key-error").textContent = message;
  const d = $("key-dialog");
  if (!d.open) d.showModal();
  $("key-input").focus();
}

async function loadProps() {
  try {
    const r = await api("/props");
    if (!r.ok) throw new Error(await errorText(r));
    state.props = await r.json();
    const spec = state.props.speculative || {};
    const how = spec.method && spec.method !== "none"
      ? "speculative: " + spec.method + ", draft length " + spec.n_draft : "plain decoding";
    $("model").textContent = state.props.model_alias + " · " + how + " · " + state.props.total_slots + " sequences";
    // the first choice is what the server was started with: "auto" (a length chosen per step) or a fixed length
    $("spec-server").textContent = spec.method && spec.method !== "none"
      ? "server's (" + (spec.n_draft === "auto" ? "auto" : "length " + spec.n_draft) + ")" : "server's (none)";
  } catch (e) {
    if (!(e instanceof KeyNeeded)) {
      $("model").textContent = "not ready: " + e.message;
      setTimeout(loadProps, 2000);  // the model may still be loading (503)
    }
  }
}

// -- one answer's speculation figures ---------------------------------------------------------------

// From the stream's token_origin and token_drafted lists: a verify step is a run of "draft" tokens
// (accepted drafts) closed by a "target" token, which says how many drafts the step proposed.
function newAnswer() {
  return {
    t0: 0, tokens: 0, drafts: 0, samples: [],  // samples: [ms since the first token, tokens, accepted, proposed]
    run: 0, steps: 0, accepted: 0, proposed: 0,  // over closed steps (a run cut by a stop string stays open)
    hist: [],                                    // hist[k]: verify steps that accepted k drafts
    posProposed: [], posAccepted: [],            // [i]: steps that proposed / accepted a draft at position i
    timings: null, cached: null,
  };
}

function countOrigins(a, origins, drafted) {
  const now = performance.now();
  if (a.tokens === 0) a.t0 = now;
  origins.forEach((o, k) => {
    a.tokens += 1;
    if (o === "draft") { a.drafts += 1; a.run += 1; return; }
    if (o !== "target") return;
    const n = Math.max(drafted[k] || 0, a.run);
    a.hist[a.run] = (a.hist[a.run] || 0) + 1;
    for (let i = 1; i <= n; i++) {
      a.posProposed[i] = (a.posProposed[i] || 0) + 1;
      if (i <= a.run) a.posAccepted[i] = (a.posAccepted[i] || 0) + 1;
    }
    a.steps += 1; a.accepted += a.run; a.proposed += n; a.run = 0;
  });
  a.samples.push([now - a.t0, a.tokens, a.accepted, a.proposed]);
}

const fmt = (x, d = 1) => (x === null || x === undefined || !isFinite(x) ? "–" : x.toFixed(d));
const pct = (x) => (x === null || x === undefined || !isFinite(x) ? "–" : Math.round(x * 100) + "%");

function showFigures() {
  const a = state.answer;
  if (!a) return;
  const last = a.samples[a.samples.length - 1];
  const live = last && last[0] > 0 ? (a.tokens - 1) / (last[0] / 1000) : NaN;
  const t = a.timings;
  $("f-tokens").textContent = String(a.tokens);
  $("f-rate").textContent = fmt(t ? t.predicted_per_second : live);
  $("f-accepted").textContent = String(a.drafts);
  // the server's figure once the answer is done (it also counts a step a stop string cut short)
  const acceptance = t ? (t.draft_n ? t.draft_n_accepted / t.draft_n : NaN) : a.accepted / a.proposed;
  $("f-acceptance").textContent = pct(acceptance);
  $("f-mean").textContent = a.steps ? fmt(a.accepted / a.steps, 2) : "–";
  $("f-cached").textContent = a.cached === null ? "–" : String(a.cached);
  drawTime(a);
  const hist = Array.from({ length: a.hist.length }, (_, k) => a.hist[k] || 0);
  bars($("chart-hist"), hist, hist.map((_, k) => String(k)), (v) => String(v));
  const pos = [];
  for (let i = 1; i < a.posProposed.length; i++) pos.push((a.posAccepted[i] || 0) / a.posProposed[i]);
  bars($("chart-pos"), pos, pos.map((_, i) => String(i + 1)), pct, 1);
}

let drawPending = false;
function scheduleFigures() {
  if (drawPending) return;
  drawPending = true;
  requestAnimationFrame(() => { drawPending = false; showFigures(); });
}

// -- charts: small hand-made SVG ---------------------------------------------------------------------

function el(tag, attrs, parent) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
  if (parent) parent.appendChild(e);
  return e;
}

function label(svg, x, y, text, anchor = "start") {
  const t = el("text", { x, y, class: "label", "text-anchor": anchor }, svg);
  t.textContent = text;
}

function line(svg, points, cls, box, ymax, xmax) {
  if (points.length < 2) return;
  const [x0, y0, w, h] = box;
  xmax = xmax || 1;
  const d = points.map(([x, y], i) =>
    (i ? "L" : "M") + (x0 + (x / xmax) * w).toFixed(1) + " " + (y0 + h - (Math.min(y, ymax) / ymax) * h).toFixed(1));
  el("path", { d: d.join(" "), class: cls }, svg);
}

function drawTime(a) {
  const svg = $("chart-time");
  svg.replaceChildren();
  const box = [28, 8, 264, 96];
  el("line", { x1: 28, y1: 104, x2: 292, y2: 104, class: "axis" }, svg);
  // tokens/s and acceptance over the last half second at each sample (or since the first token)
  const rate = [], acceptance = [];
  let j = 0;
  const s = a.samples;
  for (let i = 1; i < s.length; i++) {
    while (j < i - 1 && s[i][0] - s[j + 1][0] >= 500) j++;
    const dt = s[i][0] - s[j][0], dn = s[i][1] - s[j][1], dp = s[i][3] - s[j][3];
    if (dt > 0 && dn > 0) rate.push([s[i][0], (dn / dt) * 1000]);
    if (dp > 0) acceptance.push([s[i][0], (s[i][2] - s[j][2]) / dp]);
  }
  const ymax = Math.max(1, ...rate.map((p) => p[1])) * 1.1;
  label(svg, 24, 14, fmt(ymax, 0), "end");
  label(svg, 24, 104, "0", "end");
  const end = s.length ? s[s.length - 1][0] / 1000 : 0;
  label(svg, 292, 116, fmt(end, 1) + " s", "end");
  line(svg, rate, "s1", box, ymax, end * 1000);
  line(svg, acceptance, "s2", box, 1, end * 1000);
}

function bars(svg, values, names, show, fixedMax) {
  svg.replaceChildren();
  el("line", { x1: 8, y1: 104, x2: 292, y2: 104, class: "axis" }, svg);
  if (!values.length) {
    label(svg, 150, 60, "no verify steps yet", "middle");
    return;
  }
  const max = fixedMax || Math.max(1, ...values);
  const w = 284 / values.length;
  values.forEach((v, i) => {
    const h = (v / max) * 84, x = 8 + i * w;
    const r = el("rect", { x: x + w * 0.1, y: 104 - h, width: w * 0.8, height: h, class: "bar" }, svg);
    el("title", {}, r).textContent = names[i] + ": " + show(v);
    if (values.length <= 16) {
      label(svg, x + w / 2, 116, names[i], "middle");
      label(svg, x + w / 2, Math.max(10, 100 - h), show(v), "middle");
    }
  });
}

// -- the conversation --------------------------------------------------------------------------------

function addMessage(role, text) {
  const li = document.createElement("li");
  li.className = role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "you" : role;
  const body = document.createElement("pre");
  body.className = "text";
  if (text) body.textContent = text;
  li.append(who, body);
  $("log").appendChild(li);
  li.scrollIntoView({ block: "end" });
  return body;
}

function addPiece(body, text, origins, reasoning = false) {
  if (!text) return;
  const span = document.createElement("span");
  const kinds = new Set(origins);
  const kind = kinds.size === 1 ? [...kinds][0] : kinds.size > 1 ? "mixed" : "none";
  span.className = "tok o-" + kind + (reasoning ? " reasoning" : "");
  if (origins.length) span.title = origins.join(", ");
  span.textContent = text;  // text, never HTML
  body.appendChild(span);
}

function number(id, integer) {
  const v = $(id).value.trim();
  if (v === "") return undefined;
  const x = Number(v);
  if (!isFinite(x) || (integer && !Number.isInteger(x))) throw new Error($(id).labels[0].textContent.trim() + ": not a number");
  return x;
}

// what the page needs of every request; "More request fields" may not replace them
const PAGE_FIELDS = ["messages", "stream", "stream_options", "return_token_origin"];

function requestBody() {
  const body = {
    messages: [],
    stream: true,
    stream_options: { include_usage: true },
    return_token_origin: true,
  };
  const system = $("system").value.trim();
  if (system) body.messages.push({ role: "system", content: system });
  body.messages.push(...state.messages);
  for (const [id, integer] of [["temperature", false], ["top_p", false], ["top_k", true], ["min_p", false],
                               ["seed", true], ["max_tokens", true]]) {
    const v = number(id, integer);
    if (v !== undefined) body[id] = v;
  }
  const mode = $("spec-mode").value;
  if (mode === "off") body.speculative = { n_max: 0 };
  if (mode === "cap") body.speculative = { n_max: number("n_max", true) ?? 4 };
  const extra = $("extra").value.trim();
  if (extra) {
    let more;
    try { more = JSON.parse(extra); } catch (e) { throw new Error("More request fields: " + e.message); }
    if (typeof more !== "object" || more === null || Array.isArray(more)) throw new Error("More request fields: not a JSON object");
    const own = Object.keys(more).filter((k) => PAGE_FIELDS.includes(k));
    if (own.length) throw new Error("More request fields: the page sets " + own.join(", ") + " itself");
    Object.assign(body, more);
  }
  return body;
}

async function* sseEvents(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
      const block = buf.slice(0, cut);
      buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
      const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trimStart()).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
  throw new Error("the stream ended before [DONE]");
}

function setBusy(controller) {
  state.busy = controller;
  $("send").disabled = !!controller;
  $("stop").disabled = !controller;
}

async function send() {
  const text = $("prompt").value;
  if (!text.trim() || state.busy) return;
  $("settings-error").textContent = "";
  let body;
  state.messages.push({ role: "user", content: text });
  try {
    body = requestBody();
  } catch (e) {
    state.messages.pop();
    $("settings-error").textContent = e.message;
    $("settings").open = true;
    return;
  }
  const chat = state.chat;
  $("prompt").value = "";
  addMessage("user", text);
  const out = addMessage("assistant", "");
  const li = out.parentElement;
  li.classList.add("streaming");
  $("log").setAttribute("aria-busy", "true");  // screen readers: the answer once, when it is done
  const a = (state.answer = newAnswer());
  showFigures();
  const controller = new AbortController();
  setBusy(controller);
  $("status").textContent = "generating…";
  let reply = "", stopped = false;
  try {
    const r = await api("/v1/chat/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!r.ok) throw new Error(await errorText(r));
    for await (const chunk of sseEvents(r)) {
      if (chunk.error) throw new Error(chunk.error.message || JSON.stringify(chunk.error));
      const origins = chunk.token_origin || [];
      if (origins.length) countOrigins(a, origins, chunk.token_drafted || []);
      const delta = (chunk.choices && chunk.choices[0] && chunk.choices[0].delta) || {};
      if (typeof delta.content === "string") { addPiece(out, delta.content, origins); reply += delta.content; }
      else if (typeof delta.reasoning_content === "string") addPiece(out, delta.reasoning_content, origins, true);
      if (chunk.timings) a.timings = chunk.timings;
      if (chunk.usage && chunk.usage.prompt_tokens_details) a.cached = chunk.usage.prompt_tokens_details.cached_tokens;
      else if (chunk.timings && chunk.timings.cache_n !== undefined) a.cached = chunk.timings.cache_n;
      scheduleFigures();
    }
    $("status").textContent = "done";
  } catch (e) {
    if (controller.signal.aborted) {
      stopped = true;
      $("status").textContent = "stopped";
    } else {
      li.classList.add("error");
      const msg = document.createElement("span");
      msg.className = "error";
      msg.textContent = (reply ? "\n" : "") + "error: " + e.message;
      out.appendChild(msg);
      $("status").textContent = "error";
    }
  } finally {
    li.classList.remove("streaming");
    $("log").removeAttribute("aria-busy");
    setBusy(null);
  }
  if (chat !== state.chat) return;  // New chat while it streamed: it belongs to no conversation now
  if (reply || stopped) {
    state.messages.push({ role: "assistant", content: reply });
  } else {  // nothing came back (an error, a key to give): the question is back in the box
    state.messages.pop();
    if (!$("prompt").value) $("prompt").value = text;
  }
  addTurn(a);
  showFigures();
  $("prompt").focus();
}

function addTurn(a) {
  const t = a.timings;
  const last = a.samples[a.samples.length - 1];
  const rate = t ? t.predicted_per_second : last && last[0] > 0 ? (a.tokens - 1) / (last[0] / 1000) : NaN;
  state.turns.push(a);
  const tr = document.createElement("tr");
  for (const v of [String(state.turns.length), String(a.tokens), fmt(rate),
                   t && t.draft_n ? pct(t.draft_n_accepted / t.draft_n) : "–",
                   a.cached === null ? "–" : String(a.cached)]) {
    const td = document.createElement("td");
    td.textContent = v;
    tr.appendChild(td);
  }
  $("turns").tBodies[0].appendChild(tr);
}

function stop() {
  if (state.busy) state.busy.abort();
}

function newChat() {
  stop();
  state.chat += 1;
  state.messages = [];
  state.turns = [];
  state.answer = null;
  $("log").replaceChildren();
  $("turns").tBodies[0].replaceChildren();
  $("status").textContent = "";
  for (const id of ["f-tokens", "f-accepted"]) $(id).textContent = "0";
  for (const id of ["f-rate", "f-acceptance", "f-mean", "f-cached"]) $(id).textContent = "–";
  for (const id of ["chart-time", "chart-hist", "chart-pos"]) $(id).replaceChildren();
  $("prompt").focus();
}

// -- dashboard ---------------------------------------------------------------------------------------

const dash = { on: false, timer: null, last: null, rates: [] };

// one poll a second while the tab shows, each after the one before has finished; none while the
// page waits for an API key
function dashLoop() {
  if (!dash.on) return;
  const next = () => { if (dash.on) dash.timer = setTimeout(dashLoop, 1000); };
  if ($("key-dialog").open) next();
  else pollDashboard().finally(next);
}

function parseMetrics(text) {
  const out = {};
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([A-Za-z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/);
    if (m && !m[2]) out[m[1]] = Number(m[3]);
  }
  return out;
}

async function pollDashboard() {
  const notes = [];
  let m = null, slots = null;
  try {
    const r = await api("/metrics");
    if (r.ok) m = parseMetrics(await r.text());
    else notes.push(r.status === 501 ? "Metrics are off: start `llamaspec serve` with --metrics." : await errorText(r));
    const s = await api("/slots");
    if (s.ok) slots = await s.json();
    else notes.push(s.status === 501 ? "/slots is off (--no-slots)." : await errorText(s));
  } catch (e) {
    if (e instanceof KeyNeeded) return;
    notes.push("cannot reach the server: " + e.message);
  }
  $("dash-note").textContent = notes.join(" ");
  const v = (name) => (m && name in m ? m[name] : NaN);
  const busy = slots ? slots.filter((s) => s.is_processing) : [];
  // generated tokens: finished requests' (the counter) plus what running ones decoded so far
  const generated = v("llamacpp:tokens_predicted_total") +
    busy.reduce((n, s) => n + ((s.next_token && s.next_token[0] && s.next_token[0].n_decoded) || 0), 0);
  const now = performance.now();
  if (dash.last && isFinite(generated)) {
    const rate = Math.max(0, (generated - dash.last.generated) / ((now - dash.last.t) / 1000));
    dash.rates.push([now, rate]);
    while (dash.rates.length && now - dash.rates[0][0] > 120000) dash.rates.shift();
    $("d-rate").textContent = fmt(rate);
  }
  dash.last = { t: now, generated };
  $("d-requests").textContent = fmt(v("llamaspec:requests_total"), 0);
  $("d-processing").textContent = fmt(v("llamacpp:requests_processing"), 0);
  $("d-queue").textContent = fmt(v("llamacpp:requests_deferred"), 0);
  $("d-slots").textContent = slots ? busy.length + " / " + slots.length : "–";
  const proposed = v("llamacpp:spec_decode_num_draft_tokens_total");  // none yet (or plain): "–"
  $("d-acceptance").textContent = proposed > 0 ? pct(v("llamacpp:spec_decode_num_accepted_tokens_total") / proposed) : "–";
  $("d-cached").textContent = fmt(v("llamacpp:prompt_tokens_cached_total"), 0);
  $("d-tokens").textContent = fmt(generated, 0);
  const svg = $("chart-dash");
  svg.replaceChildren();
  el("line", { x1: 28, y1: 92, x2: 292, y2: 92, class: "axis" }, svg);
  const pts = dash.rates.map(([t, r]) => [120000 - (now - t), r]);
  const ymax = Math.max(1, ...pts.map((p) => p[1])) * 1.1;
  label(svg, 24, 12, fmt(ymax, 0), "end");
  label(svg, 24, 92, "0", "end");
  if (pts.length > 1) {
    const d = pts.map(([x, y], i) => (i ? "L" : "M") + (28 + (x / 120000) * 264).toFixed(1) + " " + (92 - (y / ymax) * 84).toFixed(1));
    el("path", { d: d.join(" "), class: "s1" }, svg);
  }
}

// -- tabs, theme, keys -------------------------------------------------------------------------------

function showTab(name) {
  for (const [tab, view] of [["tab-chat", "view-chat"], ["tab-dash", "view-dash"]]) {
    const on = tab === "tab-" + name;
    $(tab).setAttribute("aria-selected", String(on));
    $(tab).tabIndex = on ? 0 : -1;
    $(view).hidden = !on;
  }
  clearTimeout(dash.timer);
  dash.on = name === "dash";
  if (dash.on) {
    dash.last = null;
    dashLoop();
  }
}

function applyTheme(theme) {
  if (theme) document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
  const dark = theme ? theme === "dark" : matchMedia("(prefers-color-scheme: dark)").matches;
  $("theme").setAttribute("aria-pressed", String(dark));
  $("theme").textContent = dark ? "Light theme" : "Dark theme";
}

function toggleTheme() {
  const current = document.documentElement.dataset.theme ||
    (matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light");
  const next = current === "dark" ? "light" : "dark";
  localStorage.setItem(THEME_STORE, next);
  applyTheme(next);
}

function init() {
  applyTheme(localStorage.getItem(THEME_STORE));
  $("theme").addEventListener("click", toggleTheme);
  $("tab-chat").addEventListener("click", () => showTab("chat"));
  $("tab-dash").addEventListener("click", () => showTab("dash"));
  for (const tab of ["tab-chat", "tab-dash"]) {
    $(tab).addEventListener("keydown", (e) => {
      if (e.key === "ArrowRight" || e.key === "ArrowLeft") {
        const next = tab === "tab-chat" ? "dash" : "chat";
        showTab(next);
        $("tab-" + next).focus();
      }
    });
  }
  $("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing && e.keyCode !== 229) { e.preventDefault(); send(); }
  });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && state.busy) { e.preventDefault(); stop(); } });
  $("stop").addEventListener("click", stop);
  $("clear").addEventListener("click", newChat);
  $("key").addEventListener("click", () => askKey(""));
  $("spec-mode").addEventListener("change", () => { $("n_max").disabled = $("spec-mode").value !== "cap"; });
  $("key-form").addEventListener("submit", () => {
    state.key = $("key-input").value.trim();
    sessionStorage.setItem(KEY_STORE, state.key);
    $("key-input").value = "";
    loadProps();
  });
  loadProps();
  $("prompt").focus();
}

document.addEventListener("DOMContentLoaded", init);
