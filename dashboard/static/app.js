// mcp-quota's dashboard: plain DOM and SVG, no library. Every value from
// the server is set as text, never parsed as HTML.
"use strict";

// How often the page asks for news: ?poll_ms=, within 1 s and 5 min.
const POLL_MIN_MS = 1000, POLL_MAX_MS = 300000;
const POLL_MS = Math.min(Math.max(Number(new URLSearchParams(location.search).get("poll_ms")) || 2000, POLL_MIN_MS), POLL_MAX_MS);
const COLORS = {
  sent: "#2e7d32", refused_upstream: "#c62828", refused_locally: "#ef6c00", answered_error: "#8d6e63",
  kept_copy: "#1565c0", interrupted: "#6a1b9a", failed: "#424242", in_flight: "#90a4ae",
};
const LABELS = {
  sent: "sent and confirmed", refused_upstream: "refused by the upstream for quota (429)", refused_locally: "refused locally",
  answered_error: "answered with another 4xx", kept_copy: "answered from the kept copy", interrupted: "interrupted", failed: "failed", in_flight: "in flight",
};

// refusedForQuota reports an attempt refused for its budget: by mcp-quota,
// or by the upstream with 429. A 404 or a 403 is an answer, not a refusal
// for quota.
function refusedForQuota(a) { return a.state === "rejected_local" || (a.state === "rejected_upstream" && a.status === 429); }

const pad = (n) => String(n).padStart(2, "0");
// clock is a time of day, 24-hour, in the browser's time zone: 18:42:10.
function clock(d) { return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`; }
// stampText is a date and time of day: 2026-12-01 18:42:10.
function stampText(d) { return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${clock(d)}`; }
function plural(n, one, many) { return `${n} ${n === 1 ? one : many}`; }
// duration says s seconds in the largest whole unit: 90 seconds, 10 minutes.
function duration(s) {
  if (s >= 3600 && s % 3600 === 0) return plural(s / 3600, "hour", "hours");
  if (s >= 60 && s % 60 === 0) return plural(s / 60, "minute", "minutes");
  return plural(s, "second", "seconds");
}
// per says "per" a window of s seconds: per minute, per 10 minutes.
function per(s) { return "per " + ({ 1: "second", 60: "minute", 3600: "hour", 86400: "day" }[s] || duration(s)); }

const $ = (id) => document.getElementById(id);
let me = null;           // GET /ui/api/session
let selected = "";       // the key shown in detail
let latestID = -1;       // the newest activity the table has seen
let cursors = [""];      // activity pages: cursors[i] fetches page i
let page = 0;
let timer = null;
let openCall = "";       // the call whose detail is shown, under its row

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
  $("live").textContent = "";
  $("signout").hidden = true;
  $("who").textContent = "";
  $("signin").hidden = false;
  signInChoices();
}

// signInChoices shows the button of the sign-in with the authorization
// server, when mcp-quota offers it, above the token form.
async function signInChoices() {
  let o = {};
  try {
    const r = await fetch("/ui/api/signin", { credentials: "same-origin" });
    if (r.ok) o = await r.json();
  } catch (_) { /* the token form is there either way */ }
  const b = $("signin-oidc-button");
  $("signin-oidc").hidden = !o.oidc;
  $("signin-or").hidden = !o.oidc;
  $("signin-enter").hidden = !!o.oidc;
  if (o.oidc) {
    b.textContent = o.oidc.label;
    b.href = o.oidc.path;
  }
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
      $("live").textContent = "updated " + clock(new Date());
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

// freeSentence says when a documented budget's calls come back, with
// clock times: "None of 120 left now: 3 calls free at 18:42:10, all 120
// at 18:42:55."
function freeSentence(f, left) {
  if (!f.next) return `All ${f.limit} calls free now.`;
  const next = clock(new Date(f.next)), all = clock(new Date(f.all));
  const head = left > 0 ? `${left} of ${f.limit} left now; ` : `None of ${f.limit} left now: `;
  const more = left > 0 ? "more " : "";
  if (f.next === f.all) return `${head}all ${f.limit} free at ${all}.`;
  return `${head}${f.next_calls} ${more}${f.next_calls === 1 ? "call" : "calls"} free at ${next}, all ${f.limit} at ${all}.`;
}

// upstreamSentence says what the upstream's policy u allows, in words,
// saying what is not known rather than a question mark.
function upstreamSentence(u, now) {
  if (u.expired) return "What the upstream said has expired: it no longer holds, and the next call asks again.";
  const ends = u.t > 0 ? ` until ${clock(new Date(now.getTime() + u.t * 1000))}, when its window ends` : "";
  const left = u.r >= 0 ? `${u.r}${u.q > 0 ? " of " + u.q : ""} left` : "Calls left not said";
  return `${left}${ends}${u.counted_locally ? " (counted by mcp-quota from every caller's sends)" : ""}.`;
}

function quotaWords(q, w, unit) {
  const what = unit && unit !== "requests" ? unit : "calls";
  if (q > 0 && w > 0) return `${q} ${what} ${per(w)}`;
  if (q > 0) return `${q} ${what} per window; the upstream did not say how long`;
  if (w > 0) return `a window of ${duration(w)}; the upstream did not say how many ${what}`;
  return "its quota and window not said";
}

function renderDetail(d, now) {
  const s = d.status;
  $("key-name").textContent = s.key;
  const adv = $("advice");
  adv.className = "advice " + s.advice.action;
  adv.textContent = s.advice.reason;
  $("gate").textContent = s.retry_after ? `Gate closed (${s.retry_after.source}) until ${clock(new Date(s.retry_after.until))}: ${s.retry_after.reason}` : "";
  $("warnings").replaceChildren(...(s.warnings || []).map((w) => el("li", {}, w)));

  const frees = new Map((d.frees || []).map((f) => [f.policy, f]));
  const gauges = [];
  // The headline is the budget that binds now, else the tightest.
  let headline = "", bound = false;
  const lead = (when, binds, tightest) => {
    if (!when || bound) return;
    if (binds) { headline = when; bound = true; } else if (tightest || !headline) headline = when;
  };
  const bindsTag = (b) => b.binds ? [el("span", { class: "tag binds" }, "binds now")] : [];
  for (const l of s.local) {
    const f = frees.get(l.policy);
    const when = f ? freeSentence(f, l.remaining) : "";
    lead(when, l.binds, l.policy === s.quota.policy && s.quota.source === "local");
    gauges.push(el("div", { class: "gauge", "data-policy": l.policy, "data-origin": "local" },
      el("b", {}, l.policy), el("span", { class: "tag" }, "documented, counted by mcp-quota"), ...bindsTag(l),
      bar(fraction(l.used, l.limit)),
      el("div", { class: "facts" }, `${quotaWords(l.limit, l.window_s)} · ${l.used} used · ${l.remaining} left`),
      el("div", { class: "when" }, when)));
  }
  for (const u of s.upstream) {
    const name = u.partition ? `${u.policy} / ${u.partition}` : u.policy;
    const used = u.q > 0 && u.r >= 0 ? u.q - u.r : 0;
    const tags = [el("span", { class: "tag" }, "upstream · " + u.source)];
    if (u.hidden) tags.push(el("span", { class: "tag hidden" }, "hidden: inferred from a refusal"));
    if (u.expired) tags.push(el("span", { class: "tag expired" }, "expired"));
    const when = upstreamSentence(u, now);
    tags.push(...bindsTag(u));
    if (u.binds || !s.local.length) lead(when, u.binds, u.policy === s.quota.policy);
    gauges.push(el("div", { class: "gauge" + (u.expired ? " expired" : ""), "data-policy": u.policy, "data-origin": "upstream" },
      el("b", {}, name), ...tags, bar(u.expired ? 0 : fraction(used, u.q)),
      el("div", { class: "facts" }, `${quotaWords(u.q, u.w, u.unit)} · said ${u.age_s} s ago`),
      el("div", { class: "when" }, when)));
  }
  if (!gauges.length) gauges.push(el("p", {}, "No budget is known for this key yet."));
  $("gauges").replaceChildren(...gauges);
  $("free").textContent = headline;

  renderChart(d.timeline, d.gates, d.warnings, now);

  $("spenders-caption").textContent = d.window_s ? `over the last ${duration(d.window_s)}` : "";
  const reserved = d.spenders.some((p) => p.reserved > 0);
  $("spenders").classList.toggle("no-reservations", !reserved);
  $("spenders").tBodies[0].replaceChildren(...d.spenders.map((p) => el("tr", p.others ? { class: "others" } : {},
    el("td", {}, p.others ? "others (not yours to see)" : p.caller), el("td", {}, p.used), el("td", {}, (p.share * 100).toFixed(0) + "%"),
    el("td", { class: "res" }, p.reserved), el("td", { class: "res" }, p.held), el("td", { class: "res" }, p.lent))));
}

// The charts share one time axis: the past steps, then the steps ahead
// over which the budget's calls come back. Each is drawn at its own pixel
// width, so that its text is never stretched.
function axis(svgEl, t, height) {
  const W = Math.max(Math.round(svgEl.clientWidth || svgEl.getBoundingClientRect().width) || 800, 200);
  svgEl.setAttribute("viewBox", `0 0 ${W} ${height}`);
  const left = 34, right = 8, n = t.steps + t.ahead;
  const since = new Date(t.since).getTime(), stepMs = t.step_s * 1000;
  const bw = (W - left - right) / n;
  const x = (ms) => left + ((ms - since) / stepMs) * bw;
  return { W, left, right, bw, x, since, stepMs, end: W - right };
}

function text(x, y, s, attrs) {
  const tx = svg("text", Object.assign({ x, y, "font-size": 11, fill: "#555" }, attrs));
  tx.textContent = s;
  return tx;
}

function timeLabels(a, now, H) {
  const out = [];
  const nowX = a.x(now.getTime());
  out.push(svg("line", { x1: nowX, x2: nowX, y1: 4, y2: H - 18, stroke: "#263238", "stroke-dasharray": "2 3", class: "now" }));
  const first = new Date(a.since);
  out.push(text(a.left, H - 5, clock(first), { "text-anchor": "start" }));
  out.push(text(Math.min(nowX, a.end - 60), H - 5, "now " + clock(now), { "text-anchor": nowX > a.end - 60 ? "start" : "middle" }));
  return out;
}

function renderChart(t, gates, warnings, now) {
  const H = 200, top = 10, bottom = 20;
  const chart = $("chart");
  const a = axis(chart, t, H);
  const series = Object.keys(COLORS);
  const totals = new Array(t.steps).fill(0);
  for (const name of series) (t.series[name] || []).forEach((n, i) => { totals[i] += n; });
  const peak = Math.max(...totals, 1);
  const y = (n) => H - bottom - (n / peak) * (H - top - bottom);
  const nodes = [];
  // Gates: shaded spans, from when they closed to when they open.
  for (const g of gates) {
    const x0 = Math.max(a.x(new Date(g.at).getTime()), a.left), x1 = Math.min(a.x(new Date(g.until).getTime()), a.end);
    if (x1 <= x0) continue;
    const r = svg("rect", { x: x0, y: top, width: x1 - x0, height: H - top - bottom, fill: "#ffcdd2", opacity: 0.5, class: "gate" });
    r.append(svg("title")); r.firstChild.textContent = `${g.kind}: ${g.reason}`;
    nodes.push(r);
  }
  // Bars: calls in each step, stacked by outcome.
  for (let i = 0; i < t.steps; i++) {
    let base = 0;
    for (const name of series) {
      const n = (t.series[name] || [])[i] || 0;
      if (!n) continue;
      const y0 = y(base), y1 = y(base + n);
      const r = svg("rect", { x: a.left + i * a.bw + 0.25, y: y1, width: Math.max(a.bw - 0.5, 0.5), height: y0 - y1, fill: COLORS[name], class: "bar " + name });
      r.append(svg("title")); r.firstChild.textContent = `${n} ${LABELS[name]}`;
      nodes.push(r);
      base += n;
    }
  }
  // Warnings: a marker where each was raised.
  for (const w of warnings) {
    const wx = a.x(new Date(w.at).getTime());
    if (wx < a.left || wx > a.end) continue;
    const m = svg("path", { d: `M${wx - 5},${top} L${wx + 5},${top} L${wx},${top + 9} Z`, fill: "#ef6c00", class: "warning" });
    m.append(svg("title")); m.firstChild.textContent = `${w.kind}: ${w.reason}`;
    nodes.push(m);
  }
  nodes.push(svg("line", { x1: a.left, x2: a.left, y1: top, y2: H - bottom, stroke: "#999" }));
  nodes.push(svg("line", { x1: a.left, x2: a.end, y1: H - bottom, y2: H - bottom, stroke: "#999" }));
  for (const v of [0, peak]) nodes.push(text(a.left - 4, y(v) + 4, String(v), { "text-anchor": "end", "font-size": 10 }));
  nodes.push(...timeLabels(a, now, H));
  chart.replaceChildren(...nodes);
  $("chart-caption").textContent = `calls in each ${duration(t.step_s)}, by how they ended`;
  const shown = series.filter((n) => (t.series[n] || []).some((c) => c > 0));
  $("legend").replaceChildren(...shown.map((n) => { const i = el("i"); i.style.background = COLORS[n]; return el("span", {}, i, LABELS[n]); }),
    el("span", { class: "note" }, "shaded: a gate (Retry-After, backoff, circuit, abnormal usage) · ▼ a warning"));
  renderBudget(t, now);
}

// renderBudget draws one policy's calls left in its window: as they were
// (solid), and ahead as they come back if no other call is made (dashed).
function renderBudget(t, now) {
  const H = 120, top = 14, bottom = 20;
  const el2 = $("budget"), b = t.budget;
  if (!b) {
    el2.hidden = true;
    $("budget-caption").textContent = "no budget with a known quota and window";
    return;
  }
  el2.hidden = false;
  const a = axis(el2, t, H);
  const y = (n) => H - bottom - (n / b.limit) * (H - top - bottom);
  const nodes = [];
  nodes.push(svg("line", { x1: a.left, x2: a.end, y1: y(b.limit), y2: y(b.limit), stroke: "#bbb", class: "all" }));
  nodes.push(svg("line", { x1: a.left, x2: a.end, y1: y(0), y2: y(0), stroke: "#999" }));
  nodes.push(text(a.left - 4, y(b.limit) + 4, String(b.limit), { "text-anchor": "end", "font-size": 10 }));
  nodes.push(text(a.left - 4, y(0) + 4, "0", { "text-anchor": "end", "font-size": 10 }));
  const path = (from, to) => {
    let d = "";
    for (let i = from; i < to; i++) {
      const x0 = a.left + i * a.bw, x1 = x0 + a.bw, yy = y(b.left[i]);
      d += (d ? ` L${x0},${yy}` : `M${x0},${yy}`) + ` L${x1},${yy}`;
    }
    return d;
  };
  const past = t.steps, all = b.left.length;
  if (past > 0) nodes.push(svg("path", { d: path(0, past), fill: "none", stroke: "#1565c0", "stroke-width": 2, class: "left" }));
  if (all > past) nodes.push(svg("path", { d: path(past - 1, all), fill: "none", stroke: "#1565c0", "stroke-width": 2, "stroke-dasharray": "5 4", class: "ahead" }));
  nodes.push(...timeLabels(a, now, H));
  el2.replaceChildren(...nodes);
  $("budget-caption").textContent = `of ${b.policy}'s ${b.limit} ${per(b.window_s)}; dashed: as they come back if no other call is made`;
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
  const table = $("activity");
  table.classList.toggle("no-instance", !rows.some((a) => a.instance));
  unplaceCall($("call")); // out of the rows about to be replaced
  table.tBodies[0].replaceChildren(...rows.map((a) => {
    const tr = el("tr", { class: "row" + (refusedForQuota(a) ? " refused" : ""), "data-state": a.state, "data-call": a.call },
      el("td", { class: "time" }, stampText(new Date(a.at))), el("td", { class: "caller" }, a.caller), el("td", { class: "transport" }, a.transport),
      el("td", { class: "instance" }, a.instance || ""), el("td", { class: "method" }, a.method),
      el("td", { class: "target" }, a.target),
      el("td", { class: "state" }, a.state.replace("_", " ") + (a.attempt > 1 ? ` (attempt ${a.attempt})` : "")),
      el("td", { class: "status" }, statusText(a)),
      el("td", { class: "wait" }, a.wait_ms ? waitText(a.wait_ms) : ""), el("td", { class: "reason" }, reasonText(a)));
    tr.addEventListener("click", () => showCall(a.call, tr));
    return tr;
  }));
  if (openCall) {
    const tr = table.querySelector(`tr.row[data-call="${CSS.escape(openCall)}"]`);
    if (tr) placeCall(tr, false); else openCall = "";
  }
}

// An attempt's reason is often its status line ("HTTP 404 Not Found"):
// the status column gives the code, the reason column the rest.
function statusLine(a) { return a.status > 0 && (a.reason || "").startsWith("HTTP " + a.status); }
function statusText(a) { return a.status ? String(a.status) : ""; }
function reasonText(a) { return statusLine(a) ? a.reason.slice(("HTTP " + a.status).length).trim() : a.reason || ""; }

function waitText(ms) { return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(ms < 10000 ? 1 : 0) + " s"; }

// placeCall puts the call's detail in a row right under tr, the first
// attempt of the call clicked.
function placeCall(tr, scroll) {
  const call = $("call");
  unplaceCall(call);
  const cell = el("td", { class: "call-cell", colSpan: tr.children.length });
  cell.append(call);
  tr.after(el("tr", { class: "call-row" }, cell));
  tr.classList.add("open");
  call.hidden = false;
  if (scroll) call.scrollIntoView({ block: "nearest" });
}

// unplaceCall takes the call's detail out of the table, hidden.
function unplaceCall(call) {
  call.hidden = true;
  document.body.append(call);
  for (const o of $("activity").querySelectorAll("tr.open")) o.classList.remove("open");
  for (const o of $("activity").querySelectorAll("tr.call-row")) o.remove();
}

function closeCall() {
  openCall = "";
  unplaceCall($("call"));
}

async function showCall(id, tr) {
  if (openCall === id && !$("call").hidden) { closeCall(); return; }
  const c = await api("/ui/api/call?key=" + encodeURIComponent(selected) + "&call=" + encodeURIComponent(id));
  $("call-id").textContent = id;
  $("call-body").replaceChildren(...c.attempts.map((a) => {
    const obs = a.observations.length ? el("div", { class: "scroll" }, el("table", { class: "observations" },
      el("thead", {}, el("tr", {}, ...["policy", "unit", "partition", "q", "w", "r", "t", "source", "status"].map((h) => el("th", {}, h)))),
      el("tbody", {}, ...a.observations.map((o) => el("tr", {},
        el("td", {}, o.policy), el("td", {}, o.unit), el("td", {}, o.partition || ""), el("td", {}, o.q ?? "not said"),
        el("td", {}, o.w != null ? o.w + " s" : "not said"), el("td", {}, o.r ?? "not said"), el("td", {}, o.t != null ? o.t + " s" : "not said"),
        el("td", {}, o.source + (o.guessed ? " (guessed)" : "") + (o.from_cache ? " (from a cache)" : "")), el("td", {}, o.status))))))
      : el("p", {}, el("small", {}, "This answer carried no rate-limit observation."));
    return el("div", { class: "attempt" },
      el("p", {}, el("b", {}, `Attempt ${a.attempt}: ${a.state}`), ` ${a.status ? "HTTP " + a.status : ""} ${reasonText(a)}`), obs);
  }));
  openCall = id;
  // The row may have been redrawn while the call was read.
  const row = tr.isConnected ? tr : $("activity").querySelector(`tr.row[data-call="${CSS.escape(id)}"]`);
  if (row) placeCall(row, true);
}

document.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", signIn);
  $("signout").addEventListener("click", signOut);
  $("filters").addEventListener("submit", (ev) => { ev.preventDefault(); cursors = [""]; page = 0; loadActivity(); });
  $("newest").addEventListener("click", () => { cursors = [""]; page = 0; loadActivity(); });
  $("older").addEventListener("click", () => { if (cursors[page + 1]) { page++; loadActivity(); } });
  $("call-close").addEventListener("click", (ev) => { ev.stopPropagation(); closeCall(); });
  $("live").title = `updated every ${duration(POLL_MS / 1000)}`;
  $("live").dataset.pollMs = POLL_MS;
  document.addEventListener("visibilitychange", () => { if (!document.hidden) tick(); });
  start();
});
