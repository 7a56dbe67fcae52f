// Waypoint's approval page: pending approvals across runs (/ui) and one run (/ui/runs/ID).
// Everything comes from the API, authenticated by the HttpOnly cookie the login form sets; writes send
// X-Requested-With so the cookie cannot be used by another site. Data is shown with textContent only.
"use strict";

const $ = (id) => document.getElementById(id);
const page = document.body.dataset.page;
let scopes = [];

function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleString() : "-";
}

async function api(path, options = {}) {
  const headers = { "X-Requested-With": "waypoint", ...(options.body ? { "Content-Type": "application/json" } : {}) };
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
    location.reload();
  } else {
    $("login-error").textContent = "That token was not accepted.";
  }
});

$("logout").addEventListener("click", async () => {
  await fetch("ui/logout", { method: "POST", credentials: "same-origin", headers: { "X-Requested-With": "waypoint" } });
  location.reload();
});

// --- answering an interrupt ----------------------------------------------------------------------

async function answer(item, card, answerBody) {
  for (const b of card.querySelectorAll("button, input, textarea")) b.disabled = true;
  const status = card.querySelector(".outcome");
  status.textContent = "sending…";
  const body = { answers: [{ interrupt_id: item.id, ...answerBody }], expected_version: item.version };
  const result = await api(`runs/${encodeURIComponent(item.checkpoint_id)}/resume`, {
    method: "POST", body: JSON.stringify(body),
  });
  if (result.ok) {
    card.classList.add("done");
    status.textContent = answerBody.action === "approve" ? "approved: the run continues" :
      answerBody.action === "reject" ? "rejected: the run continues" : "answered: the run continues";
  } else if (result.status === 409) {
    status.textContent = `Not sent: the run moved on (now version ${result.body.current_version}, ` +
      `${result.body.status}). ${problem(result.body)}`;
  } else {
    status.textContent = `Not sent (${result.status}): ${problem(result.body)}`;
    for (const b of card.querySelectorAll("button, input, textarea")) b.disabled = false;
  }
  reloadSoon();
}

function card(item, showRun) {
  const li = el("li", "card");
  li.dataset.interrupt = item.id;
  const head = el("div", "card-head");
  head.append(el("strong", "tool", item.kind === "approval" ? item.tool : (item.tool || "interrupt")));
  if (showRun) {
    const link = el("a", "run-link", item.checkpoint_id);
    link.href = `ui/runs/${encodeURIComponent(item.checkpoint_id)}`;
    head.append(" in run ", link);
  }
  head.append(el("span", "paused", `paused ${when(item.paused_at)} (version ${item.version})`));
  li.append(head);
  const shown = item.kind === "approval" ? item.arguments : item.info;
  li.append(el("pre", "arguments", JSON.stringify(shown, null, 2)));
  const actions = el("div", "actions");
  const allowed = scopes.includes("resume");
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
  for (const b of actions.querySelectorAll("button, input, textarea")) b.disabled = !allowed;
  li.append(actions, el("p", "outcome"));
  return li;
}

// --- live updates -----------------------------------------------------------------------------------

let timer = null;
function reloadSoon() {
  clearTimeout(timer);
  timer = setTimeout(load, 150);
}

function follow(path, onEvent) {
  const source = new EventSource(path);
  source.onopen = () => { $("live").textContent = "live"; $("live").className = "live on"; };
  source.onerror = () => { $("live").textContent = "reconnecting…"; $("live").className = "live"; };
  for (const kind of ["snapshot", "started", "checkpoint", "token", "message", "tool_call", "tool_result",
    "decision", "retry", "rerun", "interrupt", "end", "error", "deleted", "chunk", "node"]) {
    source.addEventListener(kind, (e) => onEvent(kind, JSON.parse(e.data)));
  }
  return source;
}

// --- the approvals page ---------------------------------------------------------------------------

async function loadApprovals() {
  const [pending, runs] = await Promise.all([api("approvals"), api("runs?limit=20")]);
  const list = $("approvals");
  list.replaceChildren(...pending.body.approvals.map((item) => card(item, true)));
  $("empty").hidden = pending.body.approvals.length > 0;
  $("runs").replaceChildren(...runs.body.runs.map((r) => {
    const tr = el("tr");
    const link = el("a", null, r.checkpoint_id);
    link.href = `ui/runs/${encodeURIComponent(r.checkpoint_id)}`;
    const first = el("td");
    first.append(link);
    tr.append(first, el("td", null, r.graph || "?"), el("td", `status ${r.status}`, r.status),
      el("td", null, r.version), el("td", null, when(r.updated_at)));
    return tr;
  }));
}

// --- a run's page ---------------------------------------------------------------------------------------

const runId = page === "run" ? decodeURIComponent(location.pathname.split("/ui/runs/")[1] || "") : null;

function renderRun(run) {
  $("run-id").textContent = run.checkpoint_id;
  const facts = [["graph", `${run.graph} (${run.kind})`], ["status", run.status], ["version", run.version],
    ["step", run.step], ["updated", when(run.updated_at)], ["error", run.error],
    ["decisions", (run.decisions || []).map((d) => `${d.verb} ${d.tool} (call ${d.call_id}) at version ${d.version}` +
      (d.reason ? `: ${d.reason}` : "")).join("; ") || null]];
  $("facts").replaceChildren(...facts.filter(([, v]) => v !== null && v !== undefined).flatMap(([k, v]) =>
    [el("dt", null, k), el("dd", k === "status" ? `status ${v}` : null, v)]));
  $("approvals").replaceChildren(...run.interrupts.filter((i) => i.kind !== "pause")
    .map((i) => card({ checkpoint_id: run.checkpoint_id, ...i }, false)));
  $("messages").replaceChildren(...(run.messages || []).map((m) => {
    const calls = (m.tool_calls || []).map((c) => `\n→ ${c.name}(${JSON.stringify(c.arguments)})`).join("");
    return el("li", `message ${m.role}`, `[${m.role}${m.name ? " " + m.name : ""}] ${m.content}${calls}`);
  }));
  $("history").replaceChildren(...run.history.map((h) => {
    const tr = el("tr");
    tr.append(el("td", null, h.version), el("td", `status ${h.status}`, h.status), el("td", null, h.step),
      el("td", null, when(h.updated_at)), el("td", null, h.error || ""));
    return tr;
  }));
}

async function loadRun() {
  const result = await api(`runs/${encodeURIComponent(runId)}`);
  if (result.status === 404) {
    $("facts").replaceChildren(el("dt", null, "status"), el("dd", null, "no such run (deleted?)"));
    return;
  }
  renderRun(result.body);
}

function onRunEvent(kind, data) {
  if (kind === "token") {
    $("tokens").textContent += data.text;
    return;
  }
  if (kind === "snapshot" && data.history) renderRun(data);
  if (kind === "message") $("tokens").textContent += "\n";
  const line = kind === "snapshot" ? `snapshot: ${data.status}` : `${kind} ${JSON.stringify(data)}`;
  $("events").append(el("li", `event ${kind}`, line));
  if (["checkpoint", "interrupt", "end", "deleted", "decision"].includes(kind)) reloadSoon();
}

// --- start ------------------------------------------------------------------------------------------------

function load() {
  return (page === "run" ? loadRun() : loadApprovals()).catch((e) => console.warn(e));
}

async function main() {
  let session;
  try { session = await api("ui/session"); } catch (e) { return; }
  scopes = session.body.scopes;
  $("login").hidden = true;
  $("main").hidden = false;
  $("logout").hidden = false;
  $("readonly").hidden = scopes.includes("resume");
  await load();
  if (page === "run") {
    follow(`runs/${encodeURIComponent(runId)}/events`, onRunEvent);
  } else {
    follow("events", () => reloadSoon());
  }
}

main();
