"use strict";
// Drawing events: bubbles, system events in words, colours, markdown, documents and JSON.
function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function describeSystem(p) {
  switch (p.type) {
    case "created": return `created by ${p.createdBy} with ${(p.participants || []).join(", ")}` +
      (p.parent ? ` · sub-conversation of ${p.parent.conversationId}` : "");
    case "subconversation_started": return `opened sub-conversation ${p.child} for ${p.by}`;
    case "subconversation_finished": {
      const said = p.result && p.result.text ? `: “${p.result.text}”` : "";
      return `sub-conversation ${p.child} ${p.status}` + (p.reason ? ` (${p.reason})` : "") + said;
    }
    case "next_speaker": return `next speaker: ${p.speaker} (turn ${p.turn})` + (p.approval ? ` · ${p.approval}` : "") +
      (p.mode && p.mode !== "converse" ? ` · ${p.mode} mode` : "");
    case "approval_requested": return `${p.approver || "the approver"} is asked to approve ${p.for}'s turn` +
      (p.mode && p.mode !== "converse" ? ` (${p.mode} mode)` : "") + ": approve or reject";
    case "paused": return `paused by ${p.by}`;
    case "resumed": return `resumed by ${p.by}`;
    case "turn_timeout": return `turn ${p.turn} of ${p.speaker} timed out`;
    case "idle_timeout": return `nobody spoke for the idle timeout`;
    case "max_duration": return `the conversation reached its maximum duration`;
    case "forked_from": return `forked from ${p.from} at seq ${p.atSeq}`;
    default: {
      const rest = Object.assign({}, p);
      delete rest.type;
      const detail = Object.keys(rest).length ? " " + JSON.stringify(rest) : "";
      return p.type + detail;
    }
  }
}

const PALETTE = ["#1b5fc1", "#b4530a", "#7a3db8", "#1f7a44", "#b3261e", "#0e7c86", "#8a6d00", "#c2185b"];
function colourOf(who) {
  let h = 0;
  for (const ch of who) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return PALETTE[h % PALETTE.length];
}

function clock(ts) {
  return ts ? new Date(ts).toLocaleTimeString([], { hour12: false }) : "";
}

function atBottom() {
  const box = $("events");
  return box.scrollTop + box.clientHeight >= box.scrollHeight - 40;
}

function toBottom() {
  const box = $("events");
  box.scrollTop = box.scrollHeight;
  state.unseen = 0;
  $("newer").hidden = true;
}

// A plan or deliverable (schema plan.v1 / deliverable.v1), if the payload is one.
function documentOf(p) {
  if (!p || (p.schema !== "plan.v1" && p.schema !== "deliverable.v1")) return null;
  const d = p.data;
  if (!d || typeof d.type !== "string" || (d.format !== "markdown" && d.format !== "json")) return null;
  return { plan: p.schema === "plan.v1", type: d.type, format: d.format, version: d.version, content: d.content };
}

// Inline Markdown (`code`, **bold**, *emphasis*) as DOM nodes: text is never parsed as HTML.
function inline(text) {
  const out = document.createDocumentFragment();
  const re = /(`[^`]+`|\*\*[^*]+\*\*|\*[^*\s][^*]*\*)/g;
  let at = 0, m;
  while ((m = re.exec(text))) {
    if (m.index > at) out.append(text.slice(at, m.index));
    const t = m[0];
    if (t.startsWith("`")) out.append(el("code", "", t.slice(1, -1)));
    else if (t.startsWith("**")) out.append(el("strong", "", t.slice(2, -2)));
    else out.append(el("em", "", t.slice(1, -1)));
    at = m.index + t.length;
  }
  if (at < text.length) out.append(text.slice(at));
  return out;
}

// Markdown as a document: headings, lists, code blocks and paragraphs, built as elements.
function markdown(text) {
  const box = el("div", "doc-body md");
  let list = null, para = null, code = null;
  const close = () => { list = null; para = null; };
  for (const line of String(text).split("\n")) {
    if (code) {
      if (line.trim().startsWith("```")) { box.append(code); code = null; }
      else code.textContent += (code.textContent ? "\n" : "") + line;
      continue;
    }
    if (line.trim().startsWith("```")) { close(); code = el("pre", ""); continue; }
    const h = /^(#{1,4})\s+(.*)$/.exec(line.trim());
    const bullet = /^\s*[-*]\s+(.*)$/.exec(line);
    const numbered = /^\s*\d+[.)]\s+(.*)$/.exec(line);
    if (h) { close(); const e = el("h" + h[1].length); e.append(inline(h[2])); box.append(e); }
    else if (bullet || numbered) {
      const tag = bullet ? "UL" : "OL";
      if (!list || list.tagName !== tag) { para = null; list = el(tag.toLowerCase()); box.append(list); }
      const li = el("li"); li.append(inline((bullet || numbered)[1])); list.append(li);
    } else if (!line.trim()) close();
    else {
      list = null;
      if (!para) { para = el("p"); box.append(para); } else para.append(" ");
      para.append(inline(line.trim()));
    }
  }
  if (code) box.append(code);
  return box;
}

// JSON folded: objects and arrays as nested <details> (the top level open), values as text.
function jsonTree(value, label, open) {
  if (value !== null && typeof value === "object") {
    const entries = Array.isArray(value) ? value.map((v, i) => [i, v]) : Object.entries(value);
    const d = el("details");
    d.open = !!open;
    const count = Array.isArray(value) ? `[${entries.length}]` : `{${entries.length}}`;
    d.append(el("summary", "", (label !== undefined ? label + ": " : "") + count));
    for (const [k, v] of entries) d.append(jsonTree(v, String(k), false));
    return d;
  }
  return el("div", "leaf", (label !== undefined ? label + ": " : "") + JSON.stringify(value));
}

// A plan or deliverable as a document: what it is, its version, who made it in which mode.
function showDocument(bubble, doc) {
  const head = el("div", "doc-head");
  head.append(el("span", "pill kind", doc.plan ? "plan" : "deliverable"),
              el("b", "doc-type", doc.type),
              el("span", "pill doc-version", "v" + doc.version),
              el("span", "meta", `${doc.plan ? "plan" : "build"} mode · by ${bubble.dataset.author} · ${doc.format}`));
  const body = doc.format === "markdown" ? markdown(doc.content)
    : (() => { const b = el("div", "doc-body json"); b.append(jsonTree(doc.content, undefined, true)); return b; })();
  bubble.classList.add("doc");
  const text = bubble.querySelector(".text");
  text.hidden = true;
  text.after(head, body);
}

function show(ev) {
  const box = $("events");
  const following = atBottom();
  if (ev.kind === "message") {
    const key = ev.author + ":" + ev.turn;
    const text = (ev.payload && ev.payload.text) || "";
    let bubble = state.streams.get(key);
    if (!bubble) {
      bubble = el("div", "ev msg");
      const who = el("span", "who", ev.author);
      who.style.color = colourOf(ev.author);
      bubble.style.borderLeft = "3px solid " + colourOf(ev.author);
      const meta = el("span", "meta", " · turn " + ev.turn + " · ");
      meta.append(el("span", "ts", clock(ev.ts)));
      bubble.append(who, meta, el("div", "text", ""));
      box.append(bubble);
    }
    bubble.dataset.seq = ev.seq;
    bubble.dataset.author = ev.author;
    bubble.dataset.turn = ev.turn;
    bubble.dataset.finality = ev.finality;
    const body = bubble.querySelector(".text");
    if (ev.finality === "none") {
      // Progress: one bubble per speaker and turn, updated in place.
      const now = body.textContent;
      body.textContent = text.startsWith(now) ? text : now + text;
      bubble.classList.add("streaming");
      state.streams.set(key, bubble);
    } else {
      body.textContent = text;
      bubble.classList.remove("streaming");
      if (ev.finality === "conversation") {
        bubble.classList.add("final-conversation");
        endStreams();
      }
      state.streams.delete(key);
    }
    const doc = documentOf(ev.payload);
    if (doc) {
      // A document stands alone: progress after it starts a bubble of its own.
      state.streams.delete(key);
      bubble.classList.remove("streaming");
      showDocument(bubble, doc);
    } else if (ev.payload && ev.payload.data !== undefined && !bubble.querySelector("details")) {
      const d = el("details", "trace");
      d.append(el("summary", "", "data" + (ev.payload.schema ? " · " + ev.payload.schema : "")),
               el("pre", "", JSON.stringify(ev.payload.data, null, 2)));
      bubble.append(d);
    }
  } else if (ev.kind === "trace") {
    const d = el("details", "ev trace");
    d.dataset.seq = ev.seq;
    d.append(el("summary", "", `trace · ${ev.author} · turn ${ev.turn}` +
                               (ev.payload && ev.payload.type ? " · " + ev.payload.type : "")),
             el("pre", "", JSON.stringify(ev.payload, null, 2)));
    box.append(d);
  } else {
    const p = ev.payload || {};
    const s = el("div", "ev system", describeSystem(p));
    s.dataset.seq = ev.seq;
    // Follow the tree: a sub-conversation's events open the child, a child's creation its parent.
    const link = p.child || (p.parent && p.parent.conversationId);
    if (link) {
      s.classList.add("link");
      s.title = "open " + link;
      s.addEventListener("click", () => openConversation(link));
    }
    s.append(el("span", "meta", ` · turn ${ev.turn} · seq ${ev.seq} · ${clock(ev.ts)}`));
    box.append(s);
  }
  // Follow new events, unless the reader scrolled up: then say how many came.
  if (following) {
    box.scrollTop = box.scrollHeight;
  } else {
    state.unseen += 1;
    $("newer").textContent = `↓ ${state.unseen} new event${state.unseen === 1 ? "" : "s"}`;
    $("newer").hidden = false;
  }
}

// The picture of a conversation: a timeline of its turns, or the tree of its sub-conversations.
