// Waypoint's approval page: pending approvals across runs (/ui) and one run (/ui/runs/ID).
// Everything comes from the API, authenticated by the session cookie the login sets (HttpOnly: scripts
// cannot read it); writes also send the session's write key, which only this origin can read.
// Data is shown with text nodes only, and text from runs is shown so nothing in it can hide or reorder
// what the person reads: control, format (bidi, zero-width) and other invisible characters, and lone
// surrogates, appear highlighted as \uXXXX, and a card that holds any says so.
"use strict";

const $ = (id) => document.getElementById(id);
const page = document.body.dataset.page;
const base = document.querySelector("base").getAttribute("href");
const KEY = `waypoint-write-key:${base}`;
let scopes = [];

// --- hostile text is data -----------------------------------------------------------------------------

// What a person cannot see, or what changes how the rest reads: controls (Cc), formats (Cf: bidi
// overrides and isolates, zero-width joiners, the BOM), line and paragraph separators, private use, lone
// surrogates, and the other default-ignorable code points (variation selectors, fillers, tags).
const HIDDEN = /[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Co}\p{Cs}\p{Default_Ignorable_Code_Point}]/u;
const HIDDEN_ALL = new RegExp(HIDDEN.source, "gu");

function hex(ch) {
  return [...ch].map((c) => {
    const code = c.codePointAt(0);
    return code > 0xffff ? `\\u{${code.toString(16)}}` : `\\u${code.toString(16).padStart(4, "0")}`;
  }).join("");
}

// `text` as nodes: plain text, with each hidden character as a highlighted \uXXXX (newlines and tabs
// kept as they are unless `strict`: identifiers such as run IDs and tool names are one line).
function visible(text, strict) {
  const out = document.createDocumentFragment();
  const s = String(text);
  let last = 0;
  for (const m of s.matchAll(HIDDEN_ALL)) {
    if (!strict && (m[0] === "\n" || m[0] === "\t")) continue;
    if (m.index > last) out.append(s.slice(last, m.index));
    const mark = document.createElement("mark");
    mark.className = "hidden-char";
    mark.title = "an invisible or direction-changing character, shown by its code";
    mark.textContent = hex(m[0]);
    out.append(mark);
    last = m.index + m[0].length;
  }
  if (last < s.length) out.append(s.slice(last));
  return out;
}

function hides(value, strict) {
  if (typeof value === "string") {
    for (const m of value.matchAll(HIDDEN_ALL)) if (strict || (m[0] !== "\n" && m[0] !== "\t")) return true;
    return false;
  }
  if (Array.isArray(value)) return value.some((v) => hides(v, strict));
  if (value && typeof value === "object") return Object.entries(value).some(([k, v]) => hides(k, true) || hides(v, strict));
  return false;
}

const JSON_TOKEN = /[ \t\n\r]*(?:("(?:[^"\\\u0000-\u001f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*")|(-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)|(true|false|null)|([{}[\],:]))/y;

const JSON_REST = /[ \t\n\r]*$/y;
const LAYOUT_DEPTH = 64;  // deeper: shown as written, on its lines

// JSON text (a tool call's arguments exactly as the model wrote them) laid out two spaces a level, never
// parsed as a whole: JSON.parse reads numbers as doubles, and a card would show 12345678901234567891 as
// 12345678901234567000 while the tool runs with the exact number. Numbers, true, false and null are kept
// character for character; each string is decoded on its own (exact) and written back as JSON.stringify
// writes it. Returns { text, hidden, repeated } — whether a string or a key hides characters, the keys an
// object names twice (the tool gets the last) — or null when `source` is not JSON, or nests deeper than
// LAYOUT_DEPTH (then it is shown as written).
function layout(source) {
  if (typeof source !== "string") return null;
  const out = [];
  const open = [];  // per open object or array: { close: "}" | "]", keys: Set | null, empty: true }
  let expect = "value";  // value, key, colon, next (a comma or the close), end
  let hidden = false;
  const repeated = [];
  const indent = () => "\n" + "  ".repeat(open.length);
  const startItem = () => {
    const top = open[open.length - 1];
    if (top) { out.push(indent()); top.empty = false; }
  };
  const valueDone = () => { expect = open.length ? "next" : "end"; };
  let at = 0;
  for (;;) {
    JSON_REST.lastIndex = at;
    if (JSON_REST.test(source)) break;  // nothing but whitespace left
    JSON_TOKEN.lastIndex = at;
    const m = JSON_TOKEN.exec(source);
    if (!m || m.index !== at) return null;
    at = JSON_TOKEN.lastIndex;
    const [, str, num, lit, punct] = m;
    const top = open[open.length - 1];
    if (str !== undefined) {
      const decoded = JSON.parse(str);  // one string: exact
      if (expect === "key") {
        startItem();
        if (top.keys.has(decoded)) repeated.push(decoded);
        top.keys.add(decoded);
        hidden = hidden || hides(decoded, true);
        out.push(JSON.stringify(decoded));
        expect = "colon";
        continue;
      }
      if (expect !== "value") return null;
      if (top && top.close === "]") startItem();
      hidden = hidden || hides(decoded, false);
      out.push(JSON.stringify(decoded));
      valueDone();
    } else if (num !== undefined || lit !== undefined) {
      if (expect !== "value") return null;
      if (top && top.close === "]") startItem();
      out.push(num !== undefined ? num : lit);  // as written: never through a double
      valueDone();
    } else if (punct === "{" || punct === "[") {
      if (expect !== "value") return null;
      if (top && top.close === "]") startItem();
      if (open.length >= LAYOUT_DEPTH) return null;  // its indentation would grow as its depth squared
      out.push(punct);
      open.push({ close: punct === "{" ? "}" : "]", keys: punct === "{" ? new Set() : null, empty: true });
      expect = punct === "{" ? "key" : "value";
    } else if (punct === "}" || punct === "]") {
      if (!top || top.close !== punct) return null;
      if (!(expect === "next" || (top.empty && (expect === "key" || expect === "value")))) return null;
      open.pop();
      out.push(top.empty ? punct : indent() + punct);
      valueDone();
    } else if (punct === ",") {
      if (expect !== "next") return null;
      out.push(",");
      expect = top.close === "}" ? "key" : "value";
    } else if (punct === ":") {
      if (expect !== "colon") return null;
      out.push(": ");
      expect = "value";
    }
  }
  if (expect !== "end") return null;
  return { text: out.join(""), hidden, repeated };
}

function el(tag, cls, text, strict) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.append(visible(text, strict));
  return node;
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "-";
}

function span(seconds) {
  const s = Math.ceil(seconds);
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
  return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
}

function runHref(cid) {
  return `ui/runs/${encodeURIComponent(cid)}`;
}

// --- talking to the API ---------------------------------------------------------------------------------

async function api(path, options = {}) {
  const headers = { ...(options.body ? { "Content-Type": "application/json" } : {}) };
  const key = localStorage.getItem(KEY);
  if (options.method && options.method !== "GET" && key) headers["X-Waypoint-CSRF"] = key;
  const response = await fetch(path, { credentials: "same-origin", ...options, headers });
  if (response.status === 401) {
    showLogin();
    throw new Error("not logged in");
  }
  let body = null;
  if (response.status !== 204) {
    try { body = await response.json(); } catch (e) { body = null; }
  }
  return { status: response.status, ok: response.ok, body };
}

function problem(body) {
  if (!body || body.detail === undefined) return "unexpected answer";
  if (Array.isArray(body.detail)) return body.detail.map((d) => `${(d.loc || []).join(".")}: ${d.msg}`).join("; ");
  return body.detail;
}

// --- login ----------------------------------------------------------------------------------------

function showLogin() {
  $("main").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("token").focus();
}

$("login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const response = await fetch("ui/login", {
    method: "POST", credentials: "same-origin",
    headers: { "Content-Type": "application/json", "X-Requested-With": "waypoint" },
    body: JSON.stringify({ token: $("token").value }),
  });
  $("token").value = "";
  if (response.ok) {
    localStorage.setItem(KEY, (await response.json()).csrf);
    location.reload();
  } else {
    $("login-error").textContent = response.status === 429 ? "Too many wrong tokens: wait a little." :
      "That token was not accepted.";
  }
});

$("logout").addEventListener("click", async () => {
  await api("ui/logout", { method: "POST" }).catch(() => null);
  localStorage.removeItem(KEY);
  location.reload();
});

// --- answering an interrupt ----------------------------------------------------------------------

const sending = new Set();   // interrupts (run, ID) whose answer is on its way: their cards stay disabled
const answered = new Map();  // interrupt (run, ID) -> what became of this page's answer (kept across refreshes)
const keyOf = (item) => JSON.stringify([item.checkpoint_id, item.id]);

function note(item, text, ok) {
  answered.set(keyOf(item), { item, text, ok });
  renderAnswered();
}

function renderAnswered() {
  const list = $("answered");
  if (!list) return;
  list.replaceChildren(...[...answered.values()].reverse().map(({ item, text, ok }) => {
    const li = el("li", ok ? "answer ok" : "answer refused");
    li.dataset.interrupt = item.id;
    li.dataset.run = item.checkpoint_id;
    li.append(el("strong", "tool", item.tool || "interrupt", true), " in run ",
      el("span", "run-id", item.checkpoint_id, true), ": ", el("span", "outcome", text));
    return li;
  }));
  $("answered-box").hidden = answered.size === 0;
}

async function answer(item, card, answerBody) {
  sending.add(keyOf(item));
  for (const b of card.querySelectorAll("button, input, textarea")) b.disabled = true;
  card.querySelector(".outcome").textContent = "sending…";
  const body = { answers: [{ interrupt_id: item.id, ...answerBody }], expected_version: item.version };
  let result;
  try {
    result = await api(`runs/${encodeURIComponent(item.checkpoint_id)}/resume`, {
      method: "POST", body: JSON.stringify(body),
    });
  } catch (e) {
    result = { status: 0, ok: false, body: { detail: String(e) } };
  } finally {
    sending.delete(keyOf(item));
  }
  const verb = { approve: "approved", reject: "rejected" }[answerBody.action] || "answered";
  if (result.ok) {
    note(item, `${verb}: the run continues (version ${result.body.version})`, true);
  } else if (result.status === 409) {
    note(item, `not sent: ${problem(result.body)}`, false);
  } else {
    note(item, `not sent (${result.status}): ${problem(result.body)}`, false);
  }
  const outcome = card.querySelector(".outcome");  // the card may be gone already: the list above keeps it
  if (outcome) outcome.textContent = answered.get(keyOf(item)).text;
  if (!result.ok && result.status !== 409) {
    for (const b of card.querySelectorAll("button, input, textarea")) b.disabled = false;
  }
  reloadSoon();
}

function card(item, showRun) {
  const li = el("li", "card");
  li.dataset.interrupt = item.id;
  li.dataset.run = item.checkpoint_id;
  const head = el("div", "card-head");
  head.append(el("strong", "tool", item.kind === "approval" ? item.tool : (item.tool || "interrupt"), true));
  if (showRun) {
    const link = el("a", "run-link", item.checkpoint_id, true);
    link.href = runHref(item.checkpoint_id);
    head.append(" in run ", link);
  }
  head.append(el("span", "paused", `paused ${when(item.paused_at)} (version ${item.version})`));
  if (typeof item.expires_in === "number") {  // seconds left by the store's clock when the list was read
    const left = item.expires_in > 0 ? `expires in ${span(item.expires_in)} (${when(Date.now() / 1000 + item.expires_in)})`
      : "expired: nobody answered in time; it is being " + (item.kind === "approval" ? "rejected" : "ended");
    head.append(el("span", item.expires_in > 0 ? "expires" : "expires due", left));
  }
  li.append(head);
  const path = Array.isArray(item.run_path) ? item.run_path : [];
  if (path.length > 1) {  // asked inside an agent another agent called: say whose call it is
    const agent = el("p", "agent", "Agent: ");
    path.forEach((name, i) => agent.append(...(i ? [" › "] : []), el("span", "agent-name", name, true)));
    li.append(agent);
  }
  // An approval's arguments as the model wrote them (the text the tool is given), laid out but never
  // parsed into doubles; anything else as the API gives it.
  const written = item.kind === "approval" && typeof item.arguments_json === "string" ? item.arguments_json : null;
  const laid = written === null ? null : layout(written);
  const text = laid ? laid.text : written !== null ? written : JSON.stringify(item.info, null, 2);
  const hidden = laid ? laid.hidden : hides(written !== null ? written : item.info, false);
  if (hides(item.tool, true) || hides(item.checkpoint_id, true) || hides(path, true) || hidden) {
    li.classList.add("suspicious");
    li.append(el("p", "warning", "This call holds invisible or direction-changing characters, highlighted below " +
      "as \\u codes: it may not do what it seems to. Read it character by character before approving."));
  }
  if (laid && laid.repeated.length) {
    li.classList.add("suspicious");
    li.append(el("p", "warning", `This call names ${[...new Set(laid.repeated)].map((k) => JSON.stringify(k))
      .join(", ")} more than once: the tool gets the last value of each. Read all of them before approving.`));
  }
  if (item.run_status === "failed") {
    li.classList.add("failed");
    li.append(el("p", "failure", `The run failed while this waits: ${item.run_error || "no reason recorded"}. ` +
      "Answering resumes it, retrying the step that failed."));
  }
  li.append(el("pre", "arguments", text));
  const actions = el("div", "actions");
  if (item.kind === "approval") {
    const approve = el("button", "approve", "Approve");
    const reason = el("input", "reason");
    reason.placeholder = "reason (for a rejection)";
    const reject = el("button", "reject", "Reject");
    approve.addEventListener("click", () => answer(item, li, { action: "approve", digest: item.digest }));
    reject.addEventListener("click", () => answer(item, li, { action: "reject", reason: reason.value || null }));
    actions.append(approve, reason, reject);
  } else {
    const output = el("textarea", "respond-json");
    output.placeholder = "answer as JSON, e.g. \"yes\"";
    const respond = el("button", "respond", "Answer");
    respond.addEventListener("click", () => {
      let value;
      try { value = JSON.parse(output.value); } catch (e) { li.querySelector(".outcome").textContent = "not JSON"; return; }
      answer(item, li, { action: "respond", output: value });
    });
    actions.append(output, respond);
  }
  const busy = sending.has(keyOf(item));
  for (const b of actions.querySelectorAll("button, input, textarea")) b.disabled = busy || !scopes.includes("resume");
  li.append(actions, el("p", "outcome", busy ? "sending…" : ""));
  return li;
}

// One card that cannot be drawn never hides the others.
function cards(items, showRun) {
  return items.map((item) => {
    try {
      return card(item, showRun);
    } catch (e) {
      return el("li", "card broken", `an interrupt of run ${item && item.checkpoint_id} cannot be shown: ${e}`);
    }
  });
}

// --- live updates -----------------------------------------------------------------------------------

let timer = null;
let lastLoad = 0;
function reloadSoon() {
  clearTimeout(timer);
  timer = setTimeout(load, 150);
}

// At most one reload a second however many events arrive (a run writing many versions).
function reloadThrottled() {
  if (timer) return;
  const wait = Math.max(150, 1000 - (Date.now() - lastLoad));
  timer = setTimeout(load, wait);
}

function follow(path, onEvent) {
  const source = new EventSource(path);
  source.onopen = () => { $("live").textContent = "live"; $("live").className = "live on"; };
  source.onerror = () => { $("live").textContent = "reconnecting…"; $("live").className = "live"; };
  for (const kind of ["snapshot", "started", "checkpoint", "token", "message", "tool_call", "tool_result",
    "decision", "retry", "rerun", "interrupt", "end", "error", "deleted", "chunk", "node"]) {
    source.addEventListener(kind, (e) => {
      let data;
      try { data = JSON.parse(e.data); } catch (err) { return; }
      onEvent(kind, data, e.data);
    });
  }
  return source;
}

// --- the approvals page ---------------------------------------------------------------------------

async function loadApprovals() {
  const [pending, runs] = await Promise.all([api("approvals"), api("runs?limit=20")]);
  const items = pending.body.approvals || [];
  $("approvals").replaceChildren(...cards(items, true));
  $("empty").hidden = items.length > 0;
  const unreadable = pending.body.unreadable || [];
  $("unreadable").hidden = unreadable.length === 0;
  $("unreadable").replaceChildren(el("span", null, "Runs that wait but cannot be read: "),
    ...unreadable.map((cid) => el("span", "run-id", cid, true)));
  $("runs").replaceChildren(...runs.body.runs.map((r) => {
    const tr = el("tr");
    const link = el("a", null, r.checkpoint_id, true);
    link.href = runHref(r.checkpoint_id);
    const first = el("td");
    first.append(link);
    tr.append(first, el("td", null, r.graph || "?", true), el("td", `status ${r.status}`, r.status),
      el("td", null, r.version), el("td", null, when(r.updated_at)));
    return tr;
  }));
}

// --- a run's page ---------------------------------------------------------------------------------------

const runId = page === "run" ? decodeURIComponent(location.pathname.split("/ui/runs/")[1] || "") : null;

function historyRows(rows) {
  return rows.map((h) => {
    const tr = el("tr");
    tr.append(el("td", null, h.version), el("td", `status ${h.status}`, h.status), el("td", null, h.step),
      el("td", null, when(h.updated_at)), el("td", null, h.error || ""));
    return tr;
  });
}

function setOlder(next) {
  $("older").hidden = next === null || next === undefined;
  $("older").dataset.before = next ?? "";
}

function renderRun(run) {
  $("run-id").replaceChildren(visible(run.checkpoint_id, true));
  const facts = [["graph", `${run.graph} (${run.kind})`], ["status", run.status], ["version", run.version],
    ["step", run.step], ["updated", when(run.updated_at)], ["error", run.error],
    ["decisions", (run.decisions || []).map((d) => `${d.verb} ${d.tool} (call ${d.call_id})` +
      ((d.run_path || []).length ? ` in ${d.run_path.join(" > ")}` : "") + ` at version ${d.version}` +
      (d.reason ? `: ${d.reason}` : "")).join("; ") || null]];
  $("facts").replaceChildren(...facts.filter(([, v]) => v !== null && v !== undefined).flatMap(([k, v]) =>
    [el("dt", null, k), el("dd", k === "status" ? `status ${v}` : null, v)]));
  $("approvals").replaceChildren(...cards(run.interrupts.filter((i) => i.kind !== "pause")
    .map((i) => ({ checkpoint_id: run.checkpoint_id, run_status: run.status, run_error: run.error, ...i })), false));
  $("messages").replaceChildren(...(run.messages || []).map((m) => {
    const calls = (m.tool_calls || []).map((c) => `\n→ ${c.name}(${typeof c.arguments_json === "string" ?
      c.arguments_json : JSON.stringify(c.arguments)})`).join("");  // as written: never through a double
    return el("li", `message ${m.role}`, `[${m.role}${m.name ? " " + m.name : ""}] ${m.content}${calls}`);
  }));
  $("history").replaceChildren(...historyRows(run.history));
  setOlder(run.history_next);
}

async function loadOlder() {
  const before = $("older").dataset.before;
  const result = await api(`runs/${encodeURIComponent(runId)}/history?before=${encodeURIComponent(before)}`);
  if (!result.ok) return;
  $("history").append(...historyRows(result.body.history));
  setOlder(result.body.next);
}

async function loadRun() {
  const result = await api(`runs/${encodeURIComponent(runId)}`);
  if (result.status === 404) {
    $("facts").replaceChildren(el("dt", null, "status"), el("dd", null, "no such run (deleted?)"));
    return;
  }
  if (!result.ok) {
    $("facts").replaceChildren(el("dt", null, "status"), el("dd", null, problem(result.body)));
    return;
  }
  renderRun(result.body);
}

function onRunEvent(kind, data, raw) {
  if (kind === "token") {
    $("tokens").append(visible(data.text));
    return;
  }
  if (kind === "snapshot" && data.history) renderRun(data);
  if (kind === "message") $("tokens").append("\n");
  const line = kind === "snapshot" ? `snapshot: ${data.status}` : `${kind} ${raw}`;  // the text sent: exact
  $("events").append(el("li", `event ${kind}`, line));
  if (kind === "checkpoint") reloadThrottled();  // the version moved: no need to read it at every one
  if (["interrupt", "end", "deleted", "decision"].includes(kind)) reloadSoon();
}

// --- start ------------------------------------------------------------------------------------------------

function load() {
  timer = null;
  lastLoad = Date.now();
  return (page === "run" ? loadRun() : loadApprovals()).catch((e) => console.warn(e));
}

async function main() {
  let session;
  try { session = await api("ui/session"); } catch (e) { return; }
  if (!localStorage.getItem(KEY)) {  // a session without its write key (storage cleared): log in again
    showLogin();
    return;
  }
  scopes = session.body.scopes;
  $("login").hidden = true;
  $("main").hidden = false;
  $("logout").hidden = false;
  $("readonly").hidden = scopes.includes("resume");
  if (page === "run") $("older").addEventListener("click", () => loadOlder().catch((e) => console.warn(e)));
  await load();
  if (page === "run") {
    follow(`runs/${encodeURIComponent(runId)}/events`, onRunEvent);
  } else {
    follow("events", () => reloadSoon());
  }
}

main();
