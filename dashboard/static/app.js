// mcp-quota's dashboard: plain DOM and SVG, no library. Every value from
// the server is set as text, never parsed as HTML.
"use strict";

const POLL_MS = Number(new URLSearchParams(location.search).get("poll_ms")) || 2000;
const COLORS = {
  sent: "#2e7d32", refused_upstream: "#c62828", refused_locally: "#ef6c00",
  kept_copy: "#1565c0", interrupted: "#6a1b9a", failed: "#424242", in_flight: "#90a4ae",
};
const LABELS = {
  sent: "sent and confirmed", refused_upstream: "refused by the upstream", refused_locally: "refused locally",
  kept_copy: "answered from the kept copy", interrupted: "interrupted", failed: "failed", in_flight: "in flight",
};
const REFUSED = new Set(["rejected_local", "rejected_upstream"]);

const $ = (id) => document.getElementById(id);
let me = null;           // GET /ui/api/session
let selected = "";       // the key shown in detail
let latestID = -1;       // the newest activity the table has seen
let cursors = [""];      // activity pages: cursors[i] fetches page i
let page = 0;
let timer = null;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("data-")) e.setAttribute(k, v); else e[k] = v;
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}

function svg(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

async function api(path, opts = {}) {
  opts.credentials = "same-origin";
  opts.headers = Object.assign({}, opts.headers);
  if (opts.method && opts.method !== "GET" && me && me.csrf) opts.headers["X-CSRF-Token"] = me.csrf;
  const r = await fetch(path, opts);
  if (r.status === 401) { showSignIn(); throw new Error("signed out"); }
  if (!r.ok) {
    let detail = r.statusText;
    try { detail = (await r.json()).detail || detail; } catch (_) { /* not a problem document */ }
    throw new Error(detail);
  }
  return r.status === 204 ? null : r.json();
}

function showSignIn() {
  clearTimeout(timer);
  me = null;
  $("main").hidden = true;
  $("signout").hidden = true;
  $("who").textContent = "";
  $("signin").hidden = false;
}

async function signIn(ev) {
  ev.preventDefault();
  const input = $("token");
  const token = input.value.trim();
  input.value = "";  // the token is not kept, not even in the form
  $("signin-error").textContent = "";
  const r = await fetch("/ui/api/session", { method: "POST", credentials: "same-origin", headers: { Authorization: "Bearer " + token } });
  if (!r.ok) {
    let detail = "That token is not valid.";
    try { detail = (await r.json()).detail || detail; } catch (_) { /* keep the sentence */ }
    $("signin-error").textContent = detail;
    return;
  }
  await start();
}

async function signOut() {
  try { await api("/ui/api/signout", { method: "POST" }); } catch (_) { /* signed out either way */ }
  showSignIn();
}

async function start() {
  try {
    me = await api("/ui/api/session");
  } catch (e) {
    return;
  }
  $("signin").hidden = true;
  $("main").hidden = false;
  $("who").textContent = "as " + me.caller;
  $("signout").hidden = !me.signed_in;
  latestID = -1;
  tick();
}

async function tick() {
  clearTimeout(timer);
  if (!me) return;
  if (!document.hidden) {
    try {
      const q = selected ? "?key=" + encodeURIComponent(selected) : "";
      const o = await api("/ui/api/overview" + q);
      $("error").textContent = "";
      renderKeys(o.keys);
      if (o.detail) {
        selected = o.detail.status.key;
        renderDetail(o.detail, new Date(o.now));
        if (page === 0 && o.detail.latest_id !== latestID) {
          latestID = o.detail.latest_id;
          await loadActivity();
        }
      }
      $("live").textContent = "updated " + new Date().toLocaleTimeString();
    } catch (e) {
      if (!me) return;
      $("error").textContent = "Could not update: " + e.message;
    }
  }
  timer = setTimeout(tick, POLL_MS);
}

function fraction(used, limit) { return limit > 0 ? Math.min(Math.max(used / limit, 0), 1) : 0; }

function bar(f) {
  const s = el("span", { class: f >= 0.9 ? "bad" : f >= 0.7 ? "warn" : "" });
  s.style.width = (f * 100).toFixed(1) + "%";
  return el("div", { class: "bar" }, s);
}

function renderKeys(keys) {
  const ul = $("keys");
  ul.replaceChildren(...keys.map((k) => {
    const left = k.remaining >= 0 && k.limit > 0 ? `${k.remaining}/${k.limit} left` : "no limit known";
    const li = el("li", { class: k.key === selected ? "selected" : "", "data-key": k.key },
      el("b", {}, k.key), " ", el("small", {}, k.action.replace("_", " ")), el("br"), el("small", {}, left),
      bar(k.used < 0 ? 0 : k.used));
    li.addEventListener("click", () => { selected = k.key; cursors = [""]; page = 0; latestID = -1; tick(); });
    return li;
  }));
}

function renderDetail(d, now) {
  const s = d.status;
  $("key-name").textContent = s.key;
  const adv = $("advice");
  adv.className = "advice " + s.advice.action;
  adv.textContent = s.advice.reason;
  $("gate").textContent = s.retry_after ? `Gate closed (${s.retry_after.source}) for ${s.retry_after.retry_after_s} s more: ${s.retry_after.reason}` : "";
  $("warnings").replaceChildren(...(s.warnings || []).map((w) => el("li", {}, w)));

  const gauges = [];
  for (const l of s.local) {
    gauges.push(el("div", { class: "gauge", "data-policy": l.policy, "data-origin": "local" },
      el("b", {}, l.policy), el("span", { class: "tag" }, "documented, counted by mcp-quota"),
      bar(fraction(l.used, l.limit)),
      el("div", { class: "facts" }, `q ${l.limit} per w ${l.window_s} s · used ${l.used} · left ${l.remaining} · oldest leaves in ${l.reset_s} s`)));
  }
  for (const u of s.upstream) {
    const name = u.partition ? `${u.policy} / ${u.partition}` : u.policy;
    const used = u.q > 0 && u.r >= 0 ? u.q - u.r : 0;
    const tags = [el("span", { class: "tag" }, "upstream · " + u.source)];
    if (u.hidden) tags.push(el("span", { class: "tag hidden" }, "hidden: inferred from a refusal"));
    if (u.expired) tags.push(el("span", { class: "tag expired" }, "expired"));
    if (u.counted_locally) tags.push(el("span", { class: "tag" }, "counted locally"));
    gauges.push(el("div", { class: "gauge" + (u.expired ? " expired" : ""), "data-policy": u.policy, "data-origin": "upstream" },
      el("b", {}, name), ...tags, bar(fraction(used, u.q)),
      el("div", { class: "facts" }, `q ${u.q || "?"} per w ${u.w || "?"} s (${u.unit}) · left ${u.r >= 0 ? u.r : "?"} · window ends in ${u.t} s · said ${u.age_s} s ago`)));
  }
  if (!gauges.length) gauges.push(el("p", {}, "No budget is known for this key yet."));
  $("gauges").replaceChildren(...gauges);

  renderChart(d.timeline, d.gates, d.warnings, now);

  $("spenders-caption").textContent = d.window_s ? `over the last ${d.window_s} s` : "";
  $("spenders").tBodies[0].replaceChildren(...d.spenders.map((p) => el("tr", {},
    el("td", {}, p.caller), el("td", {}, p.used), el("td", {}, (p.share * 100).toFixed(0) + "%"),
    el("td", {}, p.reserved || ""), el("td", {}, p.held || ""), el("td", {}, p.lent || ""))));
}

function renderChart(t, gates, warnings, now) {
  const W = 800, H = 220, top = 10, bottom = 20, left = 40;
  const chart = $("chart");
  const series = Object.keys(COLORS);
  const since = new Date(t.since).getTime();
  const stepMs = t.step_s * 1000;
  const totals = new Array(t.steps).fill(0);
  for (const name of series) (t.series[name] || []).forEach((n, i) => { totals[i] += n; });
  const peak = Math.max(t.limit_per_s * 1.25, ...totals.map((n) => n / t.step_s), 1);
  const y = (perS) => H - bottom - (perS / peak) * (H - top - bottom);
  const bw = (W - left) / t.steps;
  const x = (ms) => left + ((ms - since) / stepMs) * bw;
  const nodes = [];
  // Gates: shaded spans, from when they closed to when they open.
  for (const g of gates) {
    const x0 = Math.max(x(new Date(g.at).getTime()), left), x1 = Math.min(x(new Date(g.until).getTime()), W);
    if (x1 <= x0) continue;
    const r = svg("rect", { x: x0, y: top, width: x1 - x0, height: H - top - bottom, fill: "#ffcdd2", opacity: 0.5, class: "gate" });
    r.append(svg("title")); r.firstChild.textContent = `${g.kind}: ${g.reason}`;
    nodes.push(r);
  }
  // Bars: calls per second in each step, stacked by outcome.
  for (let i = 0; i < t.steps; i++) {
    let base = 0;
    for (const name of series) {
      const n = (t.series[name] || [])[i] || 0;
      if (!n) continue;
      const y0 = y(base / t.step_s), y1 = y((base + n) / t.step_s);
      const r = svg("rect", { x: left + i * bw + 0.5, y: y1, width: Math.max(bw - 1, 1), height: y0 - y1, fill: COLORS[name], class: "bar " + name });
      r.append(svg("title")); r.firstChild.textContent = `${n} ${LABELS[name]}`;
      nodes.push(r);
      base += n;
    }
  }
  // The limit: q per w as calls per second.
  if (t.limit_per_s > 0) {
    nodes.push(svg("line", { x1: left, x2: W, y1: y(t.limit_per_s), y2: y(t.limit_per_s), stroke: "#c62828", "stroke-dasharray": "6 4", class: "limit" }));
    const lbl = svg("text", { x: left + 4, y: y(t.limit_per_s) - 4, "text-anchor": "start", "font-size": 11, fill: "#c62828" });
    lbl.textContent = `limit ${t.limit}: ${t.limit_per_s.toFixed(2)}/s`;
    nodes.push(lbl);
  }
  // Warnings: a marker where each was raised.
  for (const w of warnings) {
    const wx = x(new Date(w.at).getTime());
    if (wx < left || wx > W) continue;
    const m = svg("path", { d: `M${wx - 5},${top} L${wx + 5},${top} L${wx},${top + 9} Z`, fill: "#ef6c00", class: "warning" });
    m.append(svg("title")); m.firstChild.textContent = `${w.kind}: ${w.reason}`;
    nodes.push(m);
  }
  // Axes.
  nodes.push(svg("line", { x1: left, x2: left, y1: top, y2: H - bottom, stroke: "#999" }));
  nodes.push(svg("line", { x1: left, x2: W, y1: H - bottom, y2: H - bottom, stroke: "#999" }));
  for (const v of [0, peak / 2, peak]) {
    const tx = svg("text", { x: left - 4, y: y(v) + 4, "text-anchor": "end", "font-size": 10, fill: "#666" });
    tx.textContent = v.toFixed(v < 10 ? 1 : 0);
    nodes.push(tx);
  }
  const span = (t.steps - 1) * t.step_s;
  for (const back of [span, span / 2, 0]) {
    const anchor = back === span ? "start" : back === 0 ? "end" : "middle";
    const tx = svg("text", { x: Math.min(Math.max(x(now.getTime() - back * 1000), left), W), y: H - 6, "text-anchor": anchor, "font-size": 10, fill: "#666" });
    tx.textContent = back ? `${Math.round(back)} s ago` : "now";
    nodes.push(tx);
  }
  chart.replaceChildren(...nodes);
  $("chart-caption").textContent = `calls per second, ${t.step_s} s steps`;
  $("legend").replaceChildren(...series.map((n) => { const i = el("i"); i.style.background = COLORS[n]; return el("span", {}, i, LABELS[n]); }),
    el("span", {}, "shaded: a gate (Retry-After, backoff, circuit, abnormal usage) · ▼ a warning"));
}

// loadActivity shows the activity page `page`, through /v1/activity —
// the same data the REST side serves — filtered by caller and state here.
async function loadActivity() {
  if (!selected) return;
  const caller = $("f-caller").value.trim(), st = $("f-state").value;
  const sinceLocal = $("f-since").value;
  const base = "/v1/activity?key=" + encodeURIComponent(selected) + (sinceLocal ? "&since=" + encodeURIComponent(new Date(sinceLocal).toISOString().replace(/\.\d+Z$/, "Z")) : "");
  const filtered = caller || st;
  const rows = [];
  let cursor = cursors[page], next = "";
  for (let fetches = 0; fetches < (filtered ? 10 : 1); fetches++) {
    const r = await api(base + "&limit=" + (filtered ? 200 : 50) + (cursor ? "&cursor=" + encodeURIComponent(cursor) : ""));
    for (const a of r.activity) if ((!caller || a.caller === caller) && (!st || a.state === st)) rows.push(a);
    next = r.next_cursor || "";
    if (!next || rows.length >= 50) break;
    cursor = next;
  }
  cursors[page + 1] = next;
  $("older").disabled = !next;
  $("newest").disabled = page === 0;
  $("activity").tBodies[0].replaceChildren(...rows.map((a) => {
    const tr = el("tr", { class: REFUSED.has(a.state) ? "refused" : "", "data-state": a.state, "data-call": a.call },
      el("td", {}, new Date(a.at).toLocaleTimeString()), el("td", {}, a.caller), el("td", {}, a.transport), el("td", {}, a.instance || ""), el("td", {}, a.method),
      el("td", {}, a.target), el("td", {}, a.attempt), el("td", { class: "state" }, a.state), el("td", {}, a.status || ""),
      el("td", {}, a.wait_ms ? a.wait_ms + " ms" : ""), el("td", {}, a.reason || ""));
    tr.addEventListener("click", () => showCall(a.call));
    return tr;
  }));
}

async function showCall(id) {
  const c = await api("/ui/api/call?key=" + encodeURIComponent(selected) + "&call=" + encodeURIComponent(id));
  $("call-id").textContent = id;
  $("call-body").replaceChildren(...c.attempts.map((a) => {
    const obs = a.observations.length ? el("table", { class: "observations" },
      el("thead", {}, el("tr", {}, ...["policy", "unit", "partition", "q", "w", "r", "t", "source", "status"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...a.observations.map((o) => el("tr", {},
        el("td", {}, o.policy), el("td", {}, o.unit), el("td", {}, o.partition || ""), el("td", {}, o.q ?? "?"),
        el("td", {}, o.w ?? "?"), el("td", {}, o.r ?? "?"), el("td", {}, o.t ?? "?"),
        el("td", {}, o.source + (o.guessed ? " (guessed)" : "") + (o.from_cache ? " (from a cache)" : "")), el("td", {}, o.status)))))
      : el("p", {}, el("small", {}, "This answer carried no rate-limit observation."));
    return el("div", { class: "attempt" },
      el("p", {}, el("b", {}, `Attempt ${a.attempt}: ${a.state}`), ` ${a.status ? "HTTP " + a.status : ""} ${a.reason || ""}`), obs);
  }));
  $("call").hidden = false;
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", signIn);
  $("signout").addEventListener("click", signOut);
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); cursors = [""]; page = 0; loadActivity(); });
  $("newest").addEventListener("click", () => { cursors = [""]; page = 0; loadActivity(); });
  $("older").addEventListener("click", () => { if (cursors[page + 1]) { page++; loadActivity(); } });
  $("call-close").addEventListener("click", () => { $("call").hidden = true; });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) tick(); });
  start();
});
