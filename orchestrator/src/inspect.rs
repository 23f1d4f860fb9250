//! Looking inside: `orchestrator tail` and `orchestrator conversations list|show|export`, on a
//! database directly (`--db`: SQLite file or PostgreSQL URL, read without serving it) or on a
//! running server (`--url`, `--token`: JSON-RPC over WebSocket, as any client).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use agent_sdk::{AgentClient, WsConfig, WsJsonRpcClient};
use anyhow::Context;
use orchestrator::engine::state::{ConvMachine, Draft, TurnState};
use orchestrator::engine::store::{self, Store};
use proto_spec::system::SystemEvent;
use proto_spec::{Event, EventKind, Finality, TailParams};
use serde_json::Value;

/// How often `tail --follow` on a database looks for new events.
const POLL: Duration = Duration::from_millis(250);

/// Events read per call.
const PAGE: usize = 500;

/// Where to look: a database, or a running server.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// Read this database directly: a SQLite file or postgres://USER@HOST:PORT/DB (default:
    /// ./orchestrator.db, if it exists).
    #[arg(long, env = "ORCHESTRATOR_DB")]
    pub db: Option<String>,
    /// Ask the server at this address instead (ws://HOST:PORT/rpc).
    #[arg(long, env = "ORCHESTRATOR_URL")]
    pub url: Option<String>,
    /// The token to ask the server with (an admin's sees every conversation).
    #[arg(long, env = "ORCHESTRATOR_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

/// An open source of conversations.
pub enum Source {
    /// A database, read directly.
    Db(Arc<dyn Store>),
    /// A running server.
    Server(WsJsonRpcClient),
}

/// The turn state of conversation `id`, folded from its whole log.
fn state_of(store: &dyn Store, id: &str, participants: &[String]) -> anyhow::Result<TurnState> {
    let mut machine = ConvMachine::new(id, participants.to_vec());
    let mut after = 0;
    loop {
        let page = store.read_log(id, after, PAGE)?;
        let (full, last) = (page.len() == PAGE, page.last().map_or(after, |e| e.seq));
        for e in page {
            machine.observe(&Draft::of_event(e));
        }
        if !full {
            return Ok(machine.core);
        }
        after = last;
    }
}

/// One row of `conversations list`.
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The conversation.
    pub conversation_id: String,
    /// `active`, `paused` or `closed`, the protocol's words.
    pub status: String,
    /// The seq of its last event.
    pub latest_seq: u64,
    /// Its participants.
    pub participants: Vec<String>,
    /// Who holds the turn.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
    /// When its last event was committed (from a database).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_activity: Option<String>,
    /// The conversation that opened it (from a server).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parent_conversation_id: Option<String>,
}

/// Columns padded to their widest cell, two spaces apart.
pub fn table<const N: usize>(head: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = head.map(|h| h.chars().count());
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = vec![line(head.to_vec())];
    for r in rows {
        out.push(line(r.iter().map(String::as_str).collect()));
    }
    out.join("\n")
}

/// The database named, else `./orchestrator.db` if it exists (never a new, empty one); the
/// error says what to give instead, ending with `otherwise`.
pub fn given_or_default(given: &Option<String>, otherwise: &str) -> anyhow::Result<String> {
    if let Some(db) = given {
        return Ok(db.clone());
    }
    let default = "orchestrator.db";
    anyhow::ensure!(
        std::path::Path::new(default).exists(),
        "no database here ({default} does not exist): give --db PATH|postgres://… (or ORCHESTRATOR_DB), {otherwise}"
    );
    Ok(default.to_string())
}

impl Target {
    /// Opens the database or connects to the server.
    pub async fn open(&self) -> anyhow::Result<Source> {
        if let Some(url) = &self.url {
            let token = self.token.clone().ok_or_else(|| {
                anyhow::anyhow!("--url needs --token (or ORCHESTRATOR_TOKEN): an admin's sees every conversation")
            })?;
            let config = WsConfig::new(url.clone(), &token);
            let client = WsJsonRpcClient::connect(config)
                .await
                .with_context(|| format!("connecting to {url}"))?;
            return Ok(Source::Server(client));
        }
        let db = given_or_default(&self.db, "or --url ws://HOST:PORT/rpc --token T")?;
        if !db.starts_with("postgres://") && !db.starts_with("postgresql://") {
            anyhow::ensure!(
                std::path::Path::new(&db).exists(),
                "{db} does not exist (nothing to read)"
            );
        }
        let store = store::open(&db, store::sqlite::Synchronous::Normal)
            .with_context(|| format!("opening {}", store::display(&db)))?;
        Ok(Source::Db(store))
    }
}

impl Source {
    /// Every conversation the caller may see, oldest first.
    pub async fn list(&self) -> anyhow::Result<Vec<Row>> {
        match self {
            Source::Db(store) => {
                let store = store.clone();
                tokio::task::spawn_blocking(move || {
                    let listed = store.list_conversations()?;
                    let mut rows = Vec::with_capacity(listed.len());
                    for c in listed {
                        // A closed conversation's state is its closing; an open one's is folded
                        // from its log, as the server folds it.
                        let core = if c.closed {
                            None
                        } else {
                            Some(state_of(
                                store.as_ref(),
                                &c.conversation_id,
                                &c.participants,
                            )?)
                        };
                        let status = match &core {
                            None => "closed",
                            Some(core) if core.paused => "paused",
                            Some(_) => "active",
                        };
                        rows.push(Row {
                            conversation_id: c.conversation_id,
                            status: status.into(),
                            latest_seq: c.latest_seq,
                            participants: c.participants,
                            speaker: core.and_then(|core| core.speaker),
                            last_activity: c.last_ms.map(store::format_ts),
                            parent_conversation_id: None,
                        });
                    }
                    anyhow::Ok(rows)
                })
                .await?
            }
            Source::Server(client) => {
                Ok(
                    agent_sdk::all_conversations(client, Default::default(), 1_000)
                        .await?
                        .into_iter()
                        .map(|s| Row {
                            conversation_id: s.conversation_id,
                            status: serde_json::to_value(s.status)
                                .ok()
                                .and_then(|v| v.as_str().map(str::to_string))
                                .unwrap_or_default(),
                            latest_seq: s.latest_seq,
                            participants: s.participants,
                            speaker: s.speaker,
                            last_activity: s.last_event_at,
                            parent_conversation_id: s.parent_conversation_id,
                        })
                        .collect(),
                )
            }
        }
    }

    /// Events of `id` after seq `after`, at most [`PAGE`]; an error when there is no such
    /// conversation (or the caller may not read it).
    pub async fn events(&self, id: &str, after: u64) -> anyhow::Result<Vec<Event>> {
        match self {
            Source::Db(store) => {
                let (store, key) = (store.clone(), id.to_string());
                let events = tokio::task::spawn_blocking(move || store.read_log(&key, after, PAGE))
                    .await??;
                if events.is_empty() && after == 0 {
                    anyhow::bail!("no conversation {id} in this database");
                }
                Ok(events)
            }
            Source::Server(client) => Ok(client
                .tail(TailParams {
                    conversation_id: id.to_string(),
                    since_seq: after,
                    limit: Some(PAGE as u32),
                })
                .await?
                .events),
        }
    }

    /// Every event of `id` after seq `after`.
    pub async fn all_events(&self, id: &str, after: u64) -> anyhow::Result<Vec<Event>> {
        let mut out: Vec<Event> = Vec::new();
        loop {
            let from = out.last().map_or(after, |e| e.seq);
            let page = self.events(id, from).await?;
            if page.is_empty() {
                return Ok(out);
            }
            out.extend(page);
        }
    }

    /// Prints the events of `id` after `since` with `print`, then (with `follow`) each new one
    /// until the conversation closes.
    pub async fn tail(
        &self,
        id: &str,
        since: u64,
        follow: bool,
        print: &mut dyn FnMut(&Event) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let mut last = since;
        if let (Source::Server(client), true) = (self, follow) {
            // From the cursor: the log, then live events, with no gap and no duplicate.
            let mut feed = client
                .subscribe(proto_spec::SubscribeParams {
                    conversation_id: Some(id.to_string()),
                    since_seq: Some(since),
                    cursors: None,
                })
                .await?;
            while let Some(n) = feed.next().await {
                if n.event.seq <= last {
                    continue;
                }
                last = n.event.seq;
                print(&n.event)?;
                if closes(&n.event) {
                    return Ok(());
                }
            }
            anyhow::bail!("the server ended the subscription");
        }
        loop {
            let page = self.events(id, last).await?;
            let full = page.len() >= PAGE;
            let mut closed = false;
            for e in &page {
                last = e.seq;
                closed |= closes(e);
                print(e)?;
            }
            if full {
                continue;
            }
            if !follow || closed {
                return Ok(());
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Whether `e` closes its conversation.
fn closes(e: &Event) -> bool {
    e.kind == EventKind::Message && e.finality == Some(Finality::Conversation)
}

/// The time of day of an event (`HH:MM:SS`), from its timestamp.
fn clock(e: &Event) -> &str {
    e.ts.get(11..19).unwrap_or(&e.ts)
}

/// The text of a message's payload, or its JSON.
fn text_of(payload: &Value) -> String {
    match payload.get("text").and_then(Value::as_str) {
        Some(t) => t.to_string(),
        None => payload.to_string(),
    }
}

/// What a system event says, for people.
fn system_line(payload: &Value) -> String {
    match SystemEvent::from_value(payload) {
        Some(SystemEvent::NextSpeaker(n)) => match n.mode {
            Some(m) if m != proto_spec::Mode::Converse => {
                format!("turn {}: {} ({m} mode)", n.turn, n.speaker)
            }
            _ => format!("turn {}: {}", n.turn, n.speaker),
        },
        Some(SystemEvent::Created(c)) => format!(
            "created by {} with {}",
            c.created_by,
            c.participants.join(", ")
        ),
        Some(SystemEvent::ApprovalRequested(a)) => format!(
            "approval of {} requested from {}",
            a.for_speaker, a.approver
        ),
        Some(SystemEvent::TurnTimeout(t)) => format!("turn {} timed out ({})", t.turn, t.speaker),
        Some(SystemEvent::SubconversationStarted(s)) => {
            format!("sub-conversation {} started by {}", s.child, s.by)
        }
        Some(SystemEvent::SubconversationFinished(s)) => {
            format!("sub-conversation {} finished", s.child)
        }
        Some(other) => other.type_name().replace('_', " "),
        None => payload.to_string(),
    }
}

/// One event as a line for people: time, seq, turn, who, what.
pub fn line(e: &Event) -> String {
    let p = e.payload_value();
    let what = match e.kind {
        EventKind::Message => {
            let mark = match e.finality {
                Some(Finality::None) => " …",
                Some(Finality::Conversation) => " ■",
                _ => "",
            };
            match proto_spec::document::document_of(&p) {
                Some((mode, d)) => format!("{}: [{}]{mark}", e.author, d.title(mode)),
                None => format!("{}: {}{mark}", e.author, text_of(&p)),
            }
        }
        EventKind::System => format!("· {}", system_line(&p)),
        EventKind::Trace => format!(
            "{} ⋯ {}",
            e.author,
            p.get("type").and_then(Value::as_str).unwrap_or("trace")
        ),
    };
    format!("{} #{:<4} [{}] {what}", clock(e), e.seq, e.turn)
}

/// What `conversations show` says of a conversation before its events.
pub fn header(r: &Row) -> String {
    let mut lines = vec![
        format!("conversation {}", r.conversation_id),
        format!("  status        {}", r.status),
        format!("  events        {}", r.latest_seq),
        format!("  participants  {}", r.participants.join(", ")),
    ];
    let optional = [
        ("speaker", &r.speaker),
        ("last activity", &r.last_activity),
        ("opened by", &r.parent_conversation_id),
    ];
    for (name, value) in optional {
        if let Some(v) = value {
            lines.push(format!("  {name:<13} {v}"));
        }
    }
    lines.join("\n")
}

/// One event as the protocol's JSON (a line of `--json` and of the JSON-lines export).
pub fn json_line(e: &Event) -> String {
    e.to_json().get().to_string()
}

/// A conversation as a Markdown document: its messages and decisions (traces counted, not
/// shown).
pub fn markdown(id: &str, row: Option<&Row>, events: &[Event]) -> String {
    let mut out = format!("# Conversation `{id}`\n\n");
    if let Some(r) = row {
        out.push_str(&format!(
            "- participants: {}\n- status: {}, {} events\n",
            r.participants.join(", "),
            r.status,
            r.latest_seq
        ));
        if let Some(p) = &r.parent_conversation_id {
            out.push_str(&format!("- opened by conversation `{p}`\n"));
        }
    }
    let traces = events.iter().filter(|e| e.kind == EventKind::Trace).count();
    if traces > 0 {
        out.push_str(&format!(
            "- {traces} trace event{} left out (the JSON-lines export has them)\n",
            if traces == 1 { "" } else { "s" }
        ));
    }
    out.push('\n');
    for e in events {
        let p = e.payload_value();
        match e.kind {
            EventKind::Message => {
                let note = match e.finality {
                    Some(Finality::None) => " (progress)",
                    Some(Finality::Conversation) => " (closes the conversation)",
                    _ => "",
                };
                if let Some((mode, d)) = proto_spec::document::document_of(&p) {
                    // A plan or deliverable as a document of its own: its title, then its
                    // Markdown quoted (so its headings stay inside it) or its JSON.
                    let body = match d.format {
                        proto_spec::DocFormat::Markdown => d
                            .text()
                            .lines()
                            .map(|l| format!("> {l}"))
                            .collect::<Vec<_>>()
                            .join("\n"),
                        proto_spec::DocFormat::Json => format!("```json\n{}\n```", d.text()),
                    };
                    out.push_str(&format!(
                        "**{}** · turn {} · {}{note} · **{}**\n\n{body}\n\n",
                        e.author,
                        e.turn,
                        e.ts,
                        d.title(mode)
                    ));
                    continue;
                }
                out.push_str(&format!(
                    "**{}** · turn {} · {}{note}\n\n{}\n\n",
                    e.author,
                    e.turn,
                    e.ts,
                    text_of(&p)
                ));
                if let Some(data) = p.get("data") {
                    out.push_str(&format!("```json\n{data:#}\n```\n\n"));
                }
            }
            EventKind::System => {
                out.push_str(&format!("> _{}_ · {}\n\n", system_line(&p), e.ts));
            }
            EventKind::Trace => {}
        }
    }
    out
}

/// Writes a line to stdout; a closed pipe ends the command quietly.
pub fn out(text: &str) -> anyhow::Result<()> {
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => Err(e.into()),
    }
}
