"use strict";
// The timeline and tree panels, pausing, and the wiring of the page's controls (this file
// loads last: it starts the console).
function togglePanel(which) {
  state.panel = state.panel === which ? null : which;
  // The tree is drawn from the list: read it again first (a child may be new).
  if (state.panel === "tree") loadList().then(drawPanel);
  else drawPanel();
}

let panelTimer = null;
function drawPanelSoon() {
  if (panelTimer) return;
  panelTimer = setTimeout(() => { panelTimer = null; drawPanel(); }, 200);
}

function drawPanel() {
  const panel = $("panel");
  $("timeline-button").setAttribute("aria-pressed", String(state.panel === "timeline"));
  $("tree-button").setAttribute("aria-pressed", String(state.panel === "tree"));
  panel.hidden = !state.panel || !state.open;
  if (panel.hidden) return;
  panel.replaceChildren(state.panel === "timeline" ? timeline() : tree());
}

function seconds(ms) {
  return ms >= 10000 ? (ms / 1000).toFixed(0) + " s" : (ms / 1000).toFixed(2) + " s";
}

// Each turn: who held it and for how long; of that, how long before the agent started (waiting
// for an agent, or for a person) and how long the agent's attempts ran (from the executor's
// traces); its progress messages, traces, failed attempts and timeout.
function turnsOf(events) {
  const turns = [];
  let cur = null;
  for (const e of events) {
    const t = Date.parse(e.ts);
    const p = e.payload || {};
    if (e.kind === "system" && p.type === "next_speaker") {
      if (cur && cur.end === null) cur.end = t;
      cur = { turn: p.turn, speaker: p.speaker, start: t, end: null, firstAttempt: null, attemptStart: null,
              agentMs: 0, progress: 0, traces: 0, errors: 0, timedOut: false, answeredBy: null };
      turns.push(cur);
      continue;
    }
    if (!cur) continue;
    if (e.kind === "trace") {
      cur.traces += 1;
      if (p.type === "turn_start") {
        cur.attemptStart = t;
        if (cur.firstAttempt === null) cur.firstAttempt = t;
      } else if ((p.type === "turn_end" || p.type === "turn_error") && cur.attemptStart !== null) {
        cur.agentMs += t - cur.attemptStart;
        cur.attemptStart = null;
      }
      if (p.type === "turn_error") cur.errors += 1;
    } else if (e.kind === "message") {
      if (e.finality === "none") cur.progress += 1;
      else if (e.author !== "orchestrator") cur.answeredBy = e.author;
      if (e.finality === "conversation") cur.end = t;
    } else if (p.type === "turn_timeout") {
      cur.timedOut = true;
    }
  }
  const now = Date.now();
  for (const c of turns) if (c.end === null) { c.end = now; c.open = true; }
  return turns;
}

function timeline() {
  const box = el("div", "timeline");
  const turns = turnsOf(state.events);
  if (!turns.length) {
    box.append(el("div", "legend", "No turns yet: this conversation has no speaker order."));
    return box;
  }
  const legend = el("div", "legend", "Turns, by who held each:");
  const wait = el("i"); wait.style.background = "#c9ced9";
  const work = el("i"); work.style.background = "var(--accent)";
  legend.append(wait, "before the agent started", work, "the agent at work");
  box.append(legend);
  const longest = Math.max(...turns.map((c) => c.end - c.start), 1);
  for (const c of turns) {
    const row = el("div", "turnrow");
    row.dataset.turn = c.turn;
    const total = c.end - c.start;
    const who = el("span", "", `turn ${c.turn} · `);
    const name = el("b", "", c.speaker);
    name.style.color = colourOf(c.speaker);
    who.append(name);
    const bar = el("div", "bar");
    bar.title = `${c.speaker}: ${seconds(total)}`;
    const scale = (ms) => (100 * ms / longest).toFixed(2) + "%";
    const waited = c.firstAttempt !== null ? c.firstAttempt - c.start : (c.answeredBy ? total : 0);
    const w = el("span", "wait"); w.style.left = "0"; w.style.width = scale(waited);
    const k = el("span", "work"); k.style.left = scale(waited); k.style.width = scale(c.agentMs);
    bar.append(w, k);
    const notes = [seconds(total) + (c.open ? " so far" : "")];
    if (c.progress) notes.push(`${c.progress} progress`);
    if (c.errors) notes.push(`✗ ${c.errors} failed`);
    if (c.timedOut) notes.push("⌛ timed out");
    if (c.answeredBy && c.answeredBy !== c.speaker) notes.push(`answered by ${c.answeredBy}`);
    row.append(who, bar, el("span", "notes", notes.join(" · ")));
    box.append(row);
  }
  return box;
}

// The tree the open conversation belongs to, from its root, as far as the list knows it.
function tree() {
  const box = el("div", "tree");
  const byId = new Map(state.conversations.map((c) => [c.conversationId, c]));
  let root = state.open;
  const seen = new Set();
  while (byId.get(root) && byId.get(root).parentConversationId && !seen.has(root)) {
    seen.add(root);
    root = byId.get(root).parentConversationId;
  }
  const kids = (id) => state.conversations.filter((c) => c.parentConversationId === id);
  const node = (id) => {
    const li = el("li");
    const c = byId.get(id);
    const label = el("span", "node" + (id === state.open ? " open" : ""), id);
    label.dataset.conversation = id;
    if (c) label.append(el("span", "meta", ` · ${c.status} · ${c.latestSeq} events · ${(c.participants || []).join(", ")}`));
    label.addEventListener("click", () => openConversation(id));
    li.append(label);
    const children = kids(id);
    if (children.length) {
      const ul = el("ul");
      for (const k of children) ul.append(node(k.conversationId));
      li.append(ul);
    }
    return li;
  };
  const ul = el("ul");
  ul.append(node(root));
  box.append(ul);
  if (!kids(root).length && root === state.open) {
    box.append(el("div", "legend", "No sub-conversations."));
  }
  return box;
}

async function setPaused(pause) {
  if (!state.open) return;
  try {
    await api("POST", `/conversations/${encodeURIComponent(state.open)}/${pause ? "pause" : "resume"}`);
    refreshSnapshot();
  } catch (e) {
    showError(e.message);
  }
}

$("signin-form").addEventListener("submit", (e) => {
  e.preventDefault();
  signIn($("token").value.trim());
});
$("signout").addEventListener("click", () => {
  if (state.controller) state.controller.abort();
  sessionStorage.removeItem("orchestrator.token");
  Object.assign(state, { token: "", me: null, open: null, maySpeak: false, conversations: [], nextCursor: null, pages: 0, listedQuery: null, events: [], panel: null });
  // The next person starts from an empty field (a pasted token is not appended to the last).
  $("token").value = "";
  $("list").replaceChildren();
  $("panel").hidden = true;
  $("approval").hidden = true;
  $("events").replaceChildren(el("div", "empty", "Open a conversation on the left."));
  render();
});
$("composer").addEventListener("submit", (e) => { e.preventDefault(); send(); });
$("say").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); send(); }
});
$("newer").addEventListener("click", toBottom);
$("timeline-button").addEventListener("click", () => togglePanel("timeline"));
$("tree-button").addEventListener("click", () => togglePanel("tree"));
$("events").addEventListener("scroll", () => { if (atBottom()) toBottom(); });
// The search box asks the server (a moment after the last key), the list's end the next page.
let searching = null;
$("search").addEventListener("input", () => {
  clearTimeout(searching);
  searching = setTimeout(loadList, 250);
});
$("list").addEventListener("scroll", () => {
  const l = $("list");
  if (l.scrollTop + l.clientHeight >= l.scrollHeight - 40) loadMore();
});
$("create-button").addEventListener("click", createFromScenario);
$("pause").addEventListener("click", () => setPaused(true));
$("approve").addEventListener("click", () => decide("approve"));
$("reject").addEventListener("click", () => decide("reject"));
$("resume").addEventListener("click", () => setPaused(false));

render();
if (state.token) signIn(state.token);
// New conversations show up in the list without a reload.
setInterval(() => { if (state.me) loadList(); }, 10000);
