//! Running one scenario to its end with a live transcript: `orchestrator run` and `demo`.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto_spec::system::{StopData, SystemEvent};
use proto_spec::{CreateConversationParams, EventKind, Finality, SubscribeParams};
use serde_json::Value;

use crate::engine::auth::Identity;
use crate::engine::error::{Error, Result};
use crate::engine::service::Orchestrator;

/// The built-in scenario of `orchestrator demo`: three scripted agents debate in turn until one
/// of them says the stop word.
pub const DEMO: &str = r#"
name: demo-debate
description: Three scripted agents discuss a design question in turn.
participants:
  - id: moderator
    kind: scripted
    replies:
      - "Today's question: should our service keep every event forever? Optimist first."
      - "Good points. One more round: what would change your mind?"
      - "Thank you both. Summary: keep the log, compact by snapshot, never rewrite it. TERMINATE"
  - id: optimist
    kind: scripted
    replies:
      - "Yes. An append-only log makes every decision auditable and every crash recoverable."
      - "Storage is cheap; lost history is not. Snapshots keep reads fast."
  - id: skeptic
    kind: scripted
    replies:
      - "Forever is long. Logs grow without bound and replay gets slower every day."
      - "Fine, if snapshots are taken from the log and never replace it."
policy:
  order: round_robin
  first: moderator
stop:
  onText: TERMINATE
  maxTurns: 20
turn:
  timeout: 30s
"#;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The conversation.
    pub conversation_id: String,
    /// Turns taken (messages that closed a turn or the conversation).
    pub turns: u64,
    /// Wall time from creation to the close.
    pub elapsed: Duration,
    /// Why it stopped (`on_text`, `max_turns`, …, or who closed it).
    pub reason: String,
}

struct Style {
    color: bool,
}

impl Style {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
}

const PALETTE: [&str; 6] = ["36", "33", "35", "32", "34", "31"];

/// Creates a conversation from `scenario` and prints its transcript to `out` as it happens
/// (speaker, turn, text; progress and decisions marked; traces left out), until it closes or
/// `limit` passes. Colours when `color`.
pub async fn run(
    orch: Arc<Orchestrator>,
    scenario: Value,
    out: &mut (dyn Write + Send),
    color: bool,
    limit: Duration,
) -> Result<Summary> {
    let admin = Identity::new("orchestrator-run", true);
    let id = format!("run-{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
    let started = Instant::now();
    orch.create_conversation(
        &admin,
        CreateConversationParams {
            conversation_id: Some(id.clone()),
            scenario: Some(scenario),
            ..Default::default()
        },
    )
    .await?;
    // From seq 0: nothing is missed, however fast the agents are.
    let mut feed = orch.subscribe(
        &admin,
        SubscribeParams {
            conversation_id: Some(id.clone()),
            since_seq: Some(0),
            cursors: None,
        },
    )?;
    let style = Style { color };
    let participants = orch
        .hub()
        .get(&id)
        .map(|c| c.participants.clone())
        .unwrap_or_default();
    let colour_of = |who: &str| {
        participants
            .iter()
            .position(|p| p == who)
            .map_or("1", |i| PALETTE[i % PALETTE.len()])
    };
    let io = Error::Transcript;
    writeln!(
        out,
        "{}",
        style.paint(
            "1",
            &format!("conversation {id}: {}", participants.join(", "))
        )
    )
    .map_err(io)?;
    let deadline = tokio::time::Instant::now() + limit;
    let mut turns = 0;
    let reason = loop {
        let next = tokio::select! {
            n = feed.next() => n?,
            _ = tokio::time::sleep_until(deadline) => break "time limit of the run".to_string(),
        };
        let Some(e) = next else {
            break "the server stopped".into();
        };
        let p = e.payload_value();
        match e.kind {
            EventKind::Trace => {}
            EventKind::System => {
                let line = match SystemEvent::from_value(&p) {
                    Some(SystemEvent::NextSpeaker(n)) => {
                        format!("  → turn {}: {}", n.turn, n.speaker)
                    }
                    Some(SystemEvent::ApprovalRequested(a)) => format!(
                        "  ⏸ approval of {} requested from {}",
                        a.for_speaker, a.approver
                    ),
                    Some(SystemEvent::TurnTimeout(t)) => {
                        format!("  ⌛ turn {} timed out ({})", t.turn, t.speaker)
                    }
                    Some(e @ (SystemEvent::Paused(_) | SystemEvent::Resumed(_))) => {
                        format!("  {}", e.type_name())
                    }
                    _ => continue,
                };
                writeln!(out, "{}", style.paint("2", &line)).map_err(io)?;
            }
            EventKind::Message => {
                let text = p["text"].as_str().unwrap_or("");
                let head = format!("[{}] {}:", e.turn, e.author);
                let mark = if e.finality == Some(Finality::None) {
                    " …"
                } else {
                    ""
                };
                writeln!(
                    out,
                    "{} {text}{mark}",
                    style.paint(colour_of(&e.author), &head)
                )
                .map_err(io)?;
                if e.finality != Some(Finality::None) && e.author != proto_spec::ORCHESTRATOR_AUTHOR
                {
                    turns += 1;
                }
                if e.finality == Some(Finality::Conversation) {
                    break match StopData::of(&p) {
                        Some(reason) if e.author == proto_spec::ORCHESTRATOR_AUTHOR => {
                            reason.as_str().to_string()
                        }
                        _ => format!("closed by {}", e.author),
                    };
                }
            }
        }
        out.flush().map_err(io)?;
    };
    let summary = Summary {
        conversation_id: id,
        turns,
        elapsed: started.elapsed(),
        reason,
    };
    writeln!(
        out,
        "{}",
        style.paint(
            "1",
            &format!(
                "— {} turns in {:.2} s; stopped: {}",
                summary.turns,
                summary.elapsed.as_secs_f64(),
                summary.reason
            )
        )
    )
    .map_err(io)?;
    Ok(summary)
}
