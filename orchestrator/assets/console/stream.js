"use strict";
// Following the open conversation: its snapshot, its event stream (SSE over fetch) and what
// each block of the stream holds.
let snapshotTimer = null;
function refreshSnapshot() {
  if (snapshotTimer) return;
  snapshotTimer = setTimeout(async () => {
    snapshotTimer = null;
    if (!state.open) return;
    try {
      const s = await api("GET", "/conversations/" + encodeURIComponent(state.open));
      $("c-status").textContent = s.status;
      $("c-turn").textContent = s.turn;
      $("c-speaker").textContent = s.speaker || "anyone";
      const g = s.guidance || {};
      $("c-guidance").textContent = phrase(s);
      state.maySpeak = g.status === "may_speak";
      setComposer();
      showApproval();
      const known = state.conversations.find((c) => c.conversationId === s.conversationId);
      if (known) Object.assign(known, s);
      const item = document.querySelector(`#list .item[data-conversation="${CSS.escape(s.conversationId)}"] .meta`);
      if (item) item.textContent = listMeta(s);
      $("pause").disabled = s.status !== "active";
      $("resume").disabled = s.status !== "paused";
      if (s.status === "closed") endStreams();
    } catch (e) {
      showError(e.message);
    }
  }, 60);
}

// No bubble stays "streaming" once its conversation is closed.
function endStreams() {
  for (const b of document.querySelectorAll("#events .msg.streaming")) b.classList.remove("streaming");
  state.streams = new Map();
}

function openConversation(id) {
  if (state.controller) state.controller.abort();
  state.open = id;
  state.lastSeq = 0;
  state.seqs = [];
  state.streams = new Map();
  state.maySpeak = false;
  state.pendingKey = null;
  state.unseen = 0;
  state.events = [];
  $("newer").hidden = true;
  $("timeline-button").disabled = false;
  $("tree-button").disabled = false;
  setComposer();
  drawPanel();
  $("events").replaceChildren();
  $("c-id").textContent = id;
  for (const el of document.querySelectorAll("#list .item")) {
    el.classList.toggle("open", el.dataset.conversation === id);
  }
  refreshSnapshot();
  follow(id);
}

function setLink(text, cls) {
  const link = $("c-link");
  link.textContent = text;
  link.className = "pill " + (cls || "");
}

// Follows one conversation over SSE (fetch, so the token goes in a header). After a dropped
// connection it resumes with Last-Event-ID = the last seq shown, so nothing is shown twice.
async function follow(id) {
  let delay = 250;
  while (state.open === id) {
    const controller = new AbortController();
    state.controller = controller;
    try {
      const headers = { "Authorization": "Bearer " + state.token, "Accept": "text/event-stream" };
      if (state.lastSeq > 0) headers["Last-Event-ID"] = String(state.lastSeq);
      const res = await fetch("/conversations/" + encodeURIComponent(id) + "/events?sinceSeq=0",
                              { headers, signal: controller.signal });
      if (!res.ok) {
        const data = await res.json().catch(() => ({}));
        throw Object.assign(new Error((data.error && data.error.message) || res.statusText),
                            { status: res.status });
      }
      setLink("live", "live");
      showError("");
      delay = 250;
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.search(/\r?\n\r?\n/)) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut).replace(/^\r?\n\r?\n/, "");
          handleBlock(block);
        }
      }
    } catch (e) {
      if (controller.signal.aborted && state.open !== id) return;
      if (e.status === 401 || e.status === 403 || e.status === 404) {
        setLink("closed", "down");
        showError(e.message);
        return;
      }
    }
    if (state.open !== id) return;
    state.reconnects += 1;
    setLink("reconnecting…", "down");
    await new Promise((r) => setTimeout(r, delay));
    delay = Math.min(delay * 2, 5000);
  }
}

function handleBlock(block) {
  let data = "";
  for (const line of block.split(/\r?\n/)) {
    if (line.startsWith(":")) continue; // keep-alive comment
    if (line.startsWith("data:")) data += line.slice(5).replace(/^ /, "");
  }
  if (!data) return;
  let ev;
  try { ev = JSON.parse(data); } catch { return; }
  if (ev.seq <= state.lastSeq) return; // already shown
  state.lastSeq = ev.seq;
  state.seqs.push(ev.seq);
  state.events.push(ev);
  show(ev);
  if (state.panel === "timeline") drawPanelSoon();
  refreshSnapshot();
}

