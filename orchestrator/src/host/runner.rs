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

/// The live transcript: one line per message and decision, coloured by speaker when asked.
struct Transcript<'a> {
    out: &'a mut (dyn Write + Send),
    color: bool,
    participants: Vec<String>,
    /// Turns taken so far.
    turns: u64,
}

const PALETTE: [&str; 6] = ["36", "33", "35", "32", "34", "31"];

impl Transcript<'_> {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }

    fn colour_of(&self, who: &str) -> &'static str {
        self.participants
            .iter()
            .position(|p| p == who)
            .map_or("1", |i| PALETTE[i % PALETTE.len()])
    }

    fn line(&mut self, code: &str, text: &str) -> Result<()> {
        let painted = self.paint(code, text);
        writeln!(self.out, "{painted}").map_err(Error::Transcript)
    }

    /// Prints one event; the reason the conversation stopped when it closes it.
    fn event(&mut self, e: &proto_spec::Event) -> Result<Option<String>> {
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
                    _ => return Ok(None),
                };
                self.line("2", &line)?;
            }
            EventKind::Message => {
                let text = p["text"].as_str().unwrap_or("");
                let head = self.paint(
                    self.colour_of(&e.author),
                    &format!("[{}] {}:", e.turn, e.author),
                );
                let mark = if e.finality == Some(Finality::None) {
                    " …"
                } else {
                    ""
                };
                writeln!(self.out, "{head} {text}{mark}").map_err(Error::Transcript)?;
                if e.finality != Some(Finality::None) && e.author != proto_spec::ORCHESTRATOR_AUTHOR
                {
                    self.turns += 1;
                }
                if e.finality == Some(Finality::Conversation) {
                    return Ok(Some(match StopData::of(&p) {
                        Some(reason) if e.author == proto_spec::ORCHESTRATOR_AUTHOR => {
                            reason.as_str().to_string()
                        }
                        _ => format!("closed by {}", e.author),
                    }));
                }
            }
        }
        Ok(None)
    }
}

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
    let mut feed = orch
        .subscribe(
            &admin,
            SubscribeParams {
                conversation_id: Some(id.clone()),
                since_seq: Some(0),
                cursors: None,
            },
        )
        .await?;
    let participants = orch
        .hub()
        .get(&id)
        .map(|c| c.participants.clone())
        .unwrap_or_default();
    let header = format!("conversation {id}: {}", participants.join(", "));
    let mut transcript = Transcript {
        out,
        color,
        participants,
        turns: 0,
    };
    transcript.line("1", &header)?;
    let deadline = tokio::time::Instant::now() + limit;
    let reason = loop {
        let next = tokio::select! {
            n = feed.next() => n?,
            _ = tokio::time::sleep_until(deadline) => break "time limit of the run".to_string(),
        };
        let Some(e) = next else {
            break "the server stopped".into();
        };
        if let Some(reason) = transcript.event(&e)? {
            break reason;
        }
        transcript.out.flush().map_err(Error::Transcript)?;
    };
    let summary = Summary {
        conversation_id: id,
        turns: transcript.turns,
        elapsed: started.elapsed(),
        reason,
    };
    transcript.line(
        "1",
        &format!(
            "— {} turns in {:.2} s; stopped: {}",
            summary.turns,
            summary.elapsed.as_secs_f64(),
            summary.reason
        ),
    )?;
    Ok(summary)
}
