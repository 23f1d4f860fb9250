//! Running one scenario to its end with a live transcript: `orchestrator run` and `demo`.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto_spec::system::{ExecutorTrace, StopData, SystemEvent};
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
    /// Wall time from creation to the end of the run.
    pub elapsed: Duration,
    /// How it ended.
    pub end: End,
}

/// Why a run stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The conversation closed: the scenario's stop reason (`on_text`, `max_turns`, …) or who
    /// closed it.
    Closed(String),
    /// The run could make no more progress: an agent failed every attempt at its turn and no
    /// turn timeout moves the conversation on.
    Stuck(String),
    /// The run's time limit passed with the conversation still open.
    TimeLimit(String),
    /// The server stopped while the conversation was open.
    ServerStopped,
}

impl End {
    /// The process's exit status for this end (documented in the README): 0 closed, 3 stuck,
    /// 4 out of time, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            End::Closed(_) => 0,
            End::Stuck(_) => 3,
            End::TimeLimit(_) => 4,
            End::ServerStopped => 1,
        }
    }

    /// What the summary line says after "stopped:".
    pub fn describe(&self) -> String {
        match self {
            End::Closed(reason) => reason.clone(),
            End::Stuck(why) => format!("no more progress: {why}"),
            End::TimeLimit(why) => why.clone(),
            End::ServerStopped => "the server stopped".into(),
        }
    }
}

/// How a run is shown and bounded.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Colour the transcript.
    pub color: bool,
    /// Give up after this long.
    pub limit: Duration,
    /// Attempts the server's executor makes at a turn before it gives up (its
    /// [`executors::ExecPolicy::max_attempts`]).
    pub max_attempts: u32,
    /// Participants the server does not run, with how to speak for them.
    pub externals: Vec<External>,
    /// The address external participants connect to (`host:port`), when there are any.
    pub address: Option<String>,
}

/// A participant the run waits for from outside, with its token.
#[derive(Debug, Clone)]
pub struct External {
    /// Its id.
    pub id: String,
    /// A token that speaks as it.
    pub token: String,
}

/// The live transcript: one line per message and decision, coloured by speaker when asked.
struct Transcript<'a> {
    out: &'a mut (dyn Write + Send),
    settings: &'a RunSettings,
    conversation_id: String,
    participants: Vec<String>,
    /// Turns taken so far.
    turns: u64,
    /// The open turn: its number, speaker and whether a timeout moves it on.
    turn: u64,
    speaker: String,
    timeout: bool,
    /// The external participants already told how to speak.
    told: Vec<String>,
}

const PALETTE: [&str; 6] = ["36", "33", "35", "32", "34", "31"];

/// `n thing` or `n things`.
fn count(n: u64, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

impl Transcript<'_> {
    fn paint(&self, code: &str, s: &str) -> String {
        if self.settings.color {
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

    /// Prints one event; how the run ends when this event ends it.
    fn event(&mut self, e: &proto_spec::Event) -> Result<Option<End>> {
        let p = e.payload_value();
        match e.kind {
            EventKind::Trace => return self.trace(&p),
            EventKind::System => {
                let parsed = SystemEvent::from_value(&p);
                let named = matches!(parsed, Some(SystemEvent::NextSpeaker(_)));
                let line = match parsed {
                    Some(SystemEvent::NextSpeaker(n)) => {
                        self.turn = n.turn;
                        self.speaker = n.speaker.clone();
                        self.timeout = n.timeout_ms.is_some();
                        match n.mode {
                            Some(m) if m != proto_spec::Mode::Converse => {
                                format!("  → turn {}: {} ({m} mode)", n.turn, n.speaker)
                            }
                            _ => format!("  → turn {}: {}", n.turn, n.speaker),
                        }
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
                if named {
                    self.external_waited_for()?;
                }
            }
            EventKind::Message => {
                // A plan or deliverable shows as a document: its title, then its text indented.
                let document = proto_spec::document::document_of(&p).map(|(mode, d)| {
                    let body: Vec<String> = d.text().lines().map(|l| format!("    {l}")).collect();
                    format!("{}\n{}", d.title(mode), body.join("\n"))
                });
                let text = document
                    .as_deref()
                    .unwrap_or_else(|| p["text"].as_str().unwrap_or(""));
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
                    return Ok(Some(End::Closed(match StopData::of(&p) {
                        Some(reason) if e.author == proto_spec::ORCHESTRATOR_AUTHOR => {
                            reason.as_str().to_string()
                        }
                        _ => format!("closed by {}", e.author),
                    })));
                }
            }
        }
        Ok(None)
    }

    /// An executor's trace: a failed attempt is printed with its reason; the run is stuck
    /// when it was the last attempt and no turn timeout will move the conversation on.
    fn trace(&mut self, p: &Value) -> Result<Option<End>> {
        let Ok(ExecutorTrace::TurnError(err)) = serde_json::from_value::<ExecutorTrace>(p.clone())
        else {
            return Ok(None);
        };
        let a = &err.attempt;
        let max = self.settings.max_attempts.max(1);
        // The executor stops at the deadline, or after its last attempt.
        let last = a.attempt >= max || err.error == "deadline exceeded";
        let line = format!(
            "  ✗ turn {}: {} failed (attempt {} of {max}): {}",
            a.turn, a.agent, a.attempt, err.error
        );
        self.line("31", &line)?;
        if !last || a.turn != self.turn {
            return Ok(None);
        }
        if self.timeout {
            self.line(
                "2",
                &format!("  … turn {} waits for its timeout to move on", a.turn),
            )?;
            return Ok(None);
        }
        let tries = if a.attempt == 1 {
            "its attempt".to_string()
        } else {
            format!("all {} attempts", a.attempt)
        };
        Ok(Some(End::Stuck(format!(
            "{} failed {tries} at turn {}, and no turn timeout moves the conversation on (a scenario's `turn: {{timeout: 30s}}` would); last error: {}",
            a.agent, a.turn, err.error
        ))))
    }

    /// When the open turn is an external participant's, says (once per participant) how to
    /// speak for it.
    fn external_waited_for(&mut self) -> Result<()> {
        let Some(x) = self
            .settings
            .externals
            .iter()
            .find(|x| x.id == self.speaker)
            .cloned()
        else {
            return Ok(());
        };
        if self.told.contains(&x.id) {
            return self.line("2", &format!("  … waiting for {}", x.id));
        }
        self.told.push(x.id.clone());
        let addr = self.settings.address.clone().unwrap_or_default();
        let lines = [
            format!(
                "  … waiting for {} (not run by this server): connect to ws://{addr}/rpc and authenticate with {}, or post its answer over HTTP:",
                x.id, x.token
            ),
            format!(
                "    curl -s -X POST http://{addr}/conversations/{}/messages -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' -d '{{\"payload\":{{\"text\":\"…\"}},\"finality\":\"turn\"}}'",
                self.conversation_id, x.token
            ),
        ];
        for l in lines {
            self.line("2", &l)?;
        }
        Ok(())
    }
}

/// Creates a conversation from `scenario` and prints its transcript to `out` as it happens
/// (speaker, turn, text; progress, decisions and failed attempts marked; other traces left
/// out), until it closes, can make no more progress, or the time limit passes.
pub async fn run(
    orch: Arc<Orchestrator>,
    scenario: Value,
    out: &mut (dyn Write + Send),
    settings: &RunSettings,
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
        settings,
        conversation_id: id.clone(),
        participants,
        turns: 0,
        turn: 0,
        speaker: String::new(),
        timeout: false,
        told: Vec::new(),
    };
    transcript.line("1", &header)?;
    let deadline = tokio::time::Instant::now() + settings.limit;
    let end = loop {
        let next = tokio::select! {
            n = feed.next() => n?,
            _ = tokio::time::sleep_until(deadline) => {
                let waiting = if transcript.speaker.is_empty() {
                    String::new()
                } else {
                    format!(" waiting for {} at turn {}", transcript.speaker, transcript.turn)
                };
                break End::TimeLimit(format!(
                    "the run's time limit ({}) passed with the conversation still open{waiting} (--timeout sets it)",
                    humantime(settings.limit)
                ));
            }
        };
        let Some(e) = next else {
            break End::ServerStopped;
        };
        if let Some(end) = transcript.event(&e)? {
            break end;
        }
        transcript.out.flush().map_err(Error::Transcript)?;
    };
    let summary = Summary {
        conversation_id: id,
        turns: transcript.turns,
        elapsed: started.elapsed(),
        end,
    };
    transcript.line(
        "1",
        &format!(
            "— {} in {:.2} s; stopped: {}",
            count(summary.turns, "turn"),
            summary.elapsed.as_secs_f64(),
            summary.end.describe()
        ),
    )?;
    transcript.out.flush().map_err(Error::Transcript)?;
    Ok(summary)
}

/// `90s`, `10m`, `1h30m`: a duration as `--timeout` takes it.
fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}
