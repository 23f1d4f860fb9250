"use strict";
// The console's state, its calls to the server, signing in, the composer, approvals, scenarios
// and the conversation list.
const $ = (id) => document.getElementById(id);
const state = {
  token: sessionStorage.getItem("orchestrator.token") || "",
  me: null,
  open: null,       // conversation id
  lastSeq: 0,       // the seq of the last event shown
  seqs: [],         // every seq shown, in order (the test reads it)
  reconnects: 0,
  controller: null, // aborts the open stream
  streams: new Map(), // "author:turn" -> the streaming bubble
  conversations: [],  // the list, as last read (its pages so far)
  nextCursor: null,   // where the list's next page starts, if it has one
  pages: 0,           // how many pages of the list are read
  listedQuery: null,  // the search the list was read for
  loadingMore: false, // a next page is being read
  maySpeak: false,    // guidance for the signed-in agent in the open conversation
  pendingKey: null,   // the idempotency key of the message being sent (kept for a retry)
  unseen: 0,          // events that arrived while the reader was scrolled up
  events: [],         // every event shown in the open conversation (the timeline reads them)
  panel: null,        // "timeline", "tree" or null
};
window.viewerState = state;

function showError(text) { $("error").textContent = text ? "⚠ " + text : ""; }

async function api(method, path, body) {
  const res = await fetch(path, {
    method,
    headers: Object.assign({ "Authorization": "Bearer " + state.token },
                           body ? { "Content-Type": "application/json" } : {}),
    body: body ? JSON.stringify(body) : undefined,
  });
  const data = await res.json().catch(() => ({}));
  if (!res.ok) {
    const e = data.error || { message: res.statusText, code: res.status };
    throw Object.assign(new Error(e.message), { code: e.code, status: res.status });
  }
  return data;
}

async function signIn(token) {
  state.token = token;
  try {
    state.me = await api("GET", "/me");
  } catch (e) {
    state.token = "";
    sessionStorage.removeItem("orchestrator.token");
    showError("sign-in failed: " + e.message);
    render();
    return;
  }
  sessionStorage.setItem("orchestrator.token", token);
  showError("");
  render();
  if (state.me.admin) loadScenarios();
  await loadList();
}

function render() {
  const signedIn = !!state.me;
  $("signin").hidden = signedIn;
  $("app").hidden = !signedIn;
  $("signout").hidden = !signedIn;
  $("whoami").textContent = signedIn ? state.me.agentId + (state.me.admin ? " (admin)" : "") : "";
  $("pause").hidden = !(signedIn && state.me.admin);
  $("resume").hidden = !(signedIn && state.me.admin);
  $("search").disabled = !signedIn;
  $("create").hidden = !(signedIn && state.me.admin);
  $("tokens-button").hidden = !(signedIn && state.me.admin);
  if (!signedIn) {
    $("tokens").hidden = true;
    $("token-shown").textContent = "";
  }
  setComposer();
}

// The composer speaks for the signed-in agent, when guidance says it may.
function setComposer() {
  const can = !!(state.me && state.open && state.maySpeak);
  for (const id of ["say", "finality", "mode", "send"]) $(id).disabled = !can;
  $("say").placeholder = !state.open ? "Open a conversation to speak"
    : can ? `Speak as ${state.me.agentId}` : "You may not speak now";
}

// A fresh idempotency key (crypto.randomUUID needs a secure context; this does not).
function newKey() {
  const b = crypto.getRandomValues(new Uint8Array(16));
  return "console-" + [...b].map((x) => x.toString(16).padStart(2, "0")).join("");
}

// What the signed-in agent is asked to approve now, if anything: the turn of a speaker at a
// scenario's approval checkpoint (the latest next_speaker names it, with reason approval), or
// an orchestrate step's checkpoint message addressed to it. Says for whom and after what.
function pendingApproval() {
  if (!state.me || !state.maySpeak) return null;
  const me = state.me.agentId;
  const evs = state.events;
  for (let i = evs.length - 1; i >= 0; i--) {
    const ev = evs[i];
    const p = ev.payload || {};
    if (ev.kind === "system" && p.type === "next_speaker") {
      if (p.speaker !== me || p.reason !== "approval") return null;
      const before = evs.slice(0, i).reverse().find((e) => e.kind === "message" && e.author !== me);
      const doc = before && documentOf(before.payload);
      const after = !before ? "" : doc ? ` after ${before.author}'s ${doc.plan ? "plan" : "deliverable"} ${doc.type} v${doc.version}`
        : ` after ${before.author}: “${((before.payload || {}).text || "").slice(0, 200)}”`;
      const mode = p.mode && p.mode !== "converse" ? ` (${p.mode} mode)` : "";
      return `Approve ${p.for}'s turn${mode}${after}?`;
    }
    if (ev.kind === "message" && ev.author !== me) {
      if (p.schema === "orchestrate.checkpoint.v1" && (p.data || {}).by === me) {
        return `${ev.author} asks before its next step: “${p.text || ""}”`;
      }
      return null;
    }
  }
  return null;
}

function showApproval() {
  const what = pendingApproval();
  $("approval").hidden = !what;
  $("approval-what").textContent = what || "";
}

// Answers an approval with the decision as the turn's message.
async function decide(decision) {
  if (!state.open) return;
  for (const id of ["approve", "reject"]) $(id).disabled = true;
  try {
    await api("POST", `/conversations/${encodeURIComponent(state.open)}/messages`,
              { payload: { text: decision }, finality: "turn", clientRequestId: newKey() });
    $("approval").hidden = true;
    showError("");
  } catch (e) {
    showError(`not ${decision}d: ` + e.message);
  } finally {
    for (const id of ["approve", "reject"]) $(id).disabled = false;
    refreshSnapshot();
  }
}

async function send() {
  const text = $("say").value.trim();
  if (!text || !state.open) return;
  // The same key until it is accepted: sending again after a failure cannot post it twice.
  const key = state.pendingKey || (state.pendingKey = newKey());
  $("send").disabled = true;
  try {
    const payload = { text };
    if ($("mode").value) payload.mode = $("mode").value;
    await api("POST", `/conversations/${encodeURIComponent(state.open)}/messages`,
              { payload, finality: $("finality").value, clientRequestId: key });
    $("say").value = "";
    $("mode").value = "";
    state.pendingKey = null;
    showError("");
  } catch (e) {
    showError("not sent: " + e.message + (e.status >= 500 || !e.status ? " (Send again retries it)" : ""));
  } finally {
    refreshSnapshot();
  }
}

// Guidance as a person reads it.
function phrase(s) {
  const g = s.guidance || {};
  const speaker = g.speaker || s.speaker;
  const until = g.deadline ? " · until " + new Date(g.deadline).toLocaleTimeString([], { hour12: false }) : "";
  if (s.status === "closed") return "the conversation is closed";
  if (s.status === "paused") return "paused by an admin";
  const mode = g.mode && g.mode !== "converse" ? ` · asked to ${g.mode}` : "";
  if (g.status === "may_speak") return (speaker ? "your turn" : "anyone may speak") + mode + until;
  if (g.reason === "not_a_participant") {
    return (speaker ? `waiting for ${speaker}` : "open to its participants") + " · you are not a participant";
  }
  if (speaker) return `waiting for ${speaker}` + until;
  return g.reason ? g.reason.replaceAll("_", " ") : "waiting";
}

async function loadScenarios() {
  try {
    const { scenarios } = await api("GET", "/scenarios");
    const select = $("scenario");
    select.replaceChildren();
    for (const sc of scenarios) {
      const o = el("option", "", sc.name);
      o.value = sc.name;
      o.title = sc.description || "";
      select.append(o);
    }
    $("create").hidden = !scenarios.length;
  } catch (e) {
    $("create").hidden = true;
  }
}

async function createFromScenario() {
  const name = $("scenario").value;
  if (!name) return;
  try {
    const r = await api("POST", "/conversations", { scenarioName: name });
    await loadList();
    openConversation(r.conversationId);
  } catch (e) {
    showError("could not create: " + e.message);
  }
}

// The list a page at a time, newest activity first, filtered by the search box on the server:
// `loadList` reads the first page again (keeping the later pages read since), `loadMore` the
// next one as the list is scrolled to its end.
function listQuery(cursor) {
  const q = new URLSearchParams({ limit: "100" });
  const text = $("search").value.trim();
  if (text) q.set("query", text);
  if (cursor) q.set("cursor", cursor);
  return "/conversations?" + q;
}

async function loadList() {
  const asked = $("search").value;
  try {
    const { conversations, nextCursor } = await api("GET", listQuery());
    if ($("search").value !== asked) return; // the box changed: its own answer comes
    if (state.listedQuery === asked && state.pages > 1) {
      // A refresh: the first page anew, the later pages read since kept.
      const first = new Set(conversations.map((c) => c.conversationId));
      state.conversations = conversations.concat(state.conversations.filter((c) => !first.has(c.conversationId)));
    } else {
      state.conversations = conversations;
      state.nextCursor = nextCursor || null;
      state.pages = 1;
    }
    state.listedQuery = asked;
    drawList();
  } catch (e) {
    showError("could not list conversations: " + e.message);
  }
}

async function loadMore() {
  if (!state.nextCursor || state.loadingMore) return;
  state.loadingMore = true;
  try {
    const { conversations, nextCursor } = await api("GET", listQuery(state.nextCursor));
    const known = new Set(state.conversations.map((c) => c.conversationId));
    state.conversations = state.conversations.concat(conversations.filter((c) => !known.has(c.conversationId)));
    state.nextCursor = nextCursor || null;
    state.pages += 1;
    drawList();
  } catch (e) {
    showError("could not list more conversations: " + e.message);
  } finally {
    state.loadingMore = false;
  }
}

function listMeta(c) {
  const when = c.lastEventAt ? " · " + new Date(c.lastEventAt).toLocaleTimeString([], { hour12: false }) : "";
  // A sub-conversation says who is in it: siblings are told apart by more than their ids.
  const who = c.parentConversationId ? ` · ${(c.participants || []).join(", ")}` : "";
  return `${c.status} · turn ${c.turn} · ${c.latestSeq} events${when}${who}`;
}

// Most recently active first; each sub-conversation under its parent (the server filtered by
// the search box).
function drawList() {
  const list = $("list");
  list.replaceChildren();
  const searched = $("search").value.trim() !== "";
  const all = state.conversations;
  if (!all.length) {
    list.append(el("div", "empty", searched ? "No conversation matches." : "No conversations yet."));
    return;
  }
  const active = (c) => c.lastEventAt || "";
  const byActivity = (a, b) => active(b).localeCompare(active(a)) || b.latestSeq - a.latestSeq;
  const ids = new Set(all.map((c) => c.conversationId));
  const children = new Map();
  for (const c of all) {
    const p = c.parentConversationId;
    if (p && ids.has(p)) {
      if (!children.has(p)) children.set(p, []);
      children.get(p).push(c);
    }
  }
  const roots = all.filter((c) => !(c.parentConversationId && ids.has(c.parentConversationId)));
  const add = (c, depth) => {
    const item = el("div", "item" + (depth ? " child" : "") + (c.conversationId === state.open ? " open" : ""));
    if (depth > 1) item.style.paddingLeft = 14 + 14 * depth + "px";
    item.dataset.conversation = c.conversationId;
    item.append(el("div", "name", c.conversationId), el("div", "meta", listMeta(c)));
    item.addEventListener("click", () => openConversation(c.conversationId));
    list.append(item);
    for (const k of (children.get(c.conversationId) || []).sort(byActivity)) add(k, depth + 1);
  };
  for (const c of roots.sort(byActivity)) add(c, 0);
  if (state.nextCursor) list.append(el("div", "more", "Scroll for more…"));
}

