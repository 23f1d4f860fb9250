//! Running one scenario to its end with a live transcript: `orchestrator run` and `demo`.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use proto_spec::system::{ExecutorTrace, SpeakerReason, StopData, SystemEvent};
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
    /// The open turn: its number and speaker.
    turn: u64,
    speaker: String,
    /// The external participants already told how to speak.
    told: Vec<String>,
    /// The agents that gave up their turn (failed every attempt) since a participant last
    /// closed a turn: while they are all that could speak next, nothing can make progress.
    gave_up: Vec<String>,
    /// The speaker whose turn the open turn's holder is asked to approve.
    approving: Option<String>,
    /// The live conversation, to ask what its turn timeout will decide.
    view: Option<Arc<crate::engine::hub::ConvView>>,
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
                        self.approving = n
                            .for_speaker
                            .clone()
                            .filter(|_| n.reason == Some(SpeakerReason::Approval));
                        match n.mode {
                            Some(m) if m != proto_spec::Mode::Converse => {
                                format!("  → turn {}: {} ({m} mode)", n.turn, n.speaker)
                            }
                            _ => format!("  → turn {}: {}", n.turn, n.speaker),
                        }
                    }
                    Some(SystemEvent::ApprovalRequested(a)) => {
                        // The mode asked of it, or else its default one.
                        let policy = self.view.as_ref().and_then(|v| v.policy());
                        let mode = a
                            .mode
                            .or_else(|| {
                                policy.and_then(|p| p.modes_of(&a.for_speaker).first().copied())
                            })
                            .filter(|m| *m != proto_spec::Mode::Converse)
                            .map(|m| format!(" ({m} mode)"))
                            .unwrap_or_default();
                        format!(
                            "  ⏸ approval of {}{mode} requested from {}: the turn goes to {} once approved",
                            a.for_speaker, a.approver, a.for_speaker
                        )
                    }
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
                let by_orchestrator = e.author == proto_spec::ORCHESTRATOR_AUTHOR;
                if e.finality != Some(Finality::None) && !by_orchestrator {
                    self.turns += 1;
                    self.gave_up.clear();
                }
                if e.finality == Some(Finality::Conversation) {
                    let stop = StopData::of(&p).filter(|_| by_orchestrator);
                    let reason = match stop {
                        Some(reason) => reason.as_str().to_string(),
                        None => format!("closed by {}", e.author),
                    };
                    // Closed by a timeout after agents gave up, not by the scenario's end: the
                    // run did not get anywhere.
                    match self.gave_up.last() {
                        Some(last) if stop.is_some_and(|r| !completes(r)) => {
                            return Ok(Some(End::Stuck(format!(
                                "{last} gave up its turn, and the conversation then stopped: {reason}"
                            ))));
                        }
                        _ => return Ok(Some(End::Closed(reason))),
                    }
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
        if !self.gave_up.contains(&a.agent) {
            self.gave_up.push(a.agent.clone());
        }
        let tries = if a.attempt == 1 {
            "its attempt".to_string()
        } else {
            format!("all {} attempts", a.attempt)
        };
        let failed = format!("{} failed {tries} at turn {}", a.agent, a.turn);
        let stuck = |why: String| {
            Ok(Some(End::Stuck(format!(
                "{failed}, and {why}; last error: {}",
                err.error
            ))))
        };
        // What the turn's timeout will do decides whether waiting for it leads anywhere.
        let core = self.view.as_ref().map(|v| v.core());
        if core.as_ref().is_some_and(|c| c.turn != a.turn) {
            return Ok(None); // the turn has already moved on
        }
        let policy = self.view.as_ref().and_then(|v| v.policy());
        let decided = policy
            .zip(core.as_ref())
            .and_then(|(p, c)| p.after_timeout(c));
        match (decided, policy.and_then(|p| p.timeout_ms)) {
            (Some(Err(reason)), _) if !completes(reason) => stuck(format!(
                "its turn timeout would close the conversation ({})",
                reason.as_str()
            )),
            (Some(Ok(Some(next))), _) if self.gave_up.contains(&next) => stuck(format!(
                "its turn timeout would give the turn to {next}, who gave up already"
            )),
            (Some(decided), Some(ms)) => {
                let then = match decided {
                    Ok(Some(n)) => format!("the turn goes to {n}"),
                    Ok(None) => "the floor opens".to_string(),
                    Err(reason) => format!("the conversation closes ({})", reason.as_str()),
                };
                let wait = humantime(Duration::from_millis(ms));
                self.line(
                    "2",
                    &format!("  … turn {} waits for its timeout ({wait} from the turn's start), then {then}", a.turn),
                )?;
                Ok(None)
            }
            _ => stuck(
                "no turn timeout moves the conversation on (a scenario's `turn: {timeout: 30s}` would)"
                    .to_string(),
            ),
        }
    }

    /// When the open turn is an external participant's, says how to speak for it: the
    /// address and token the first time, the `curl` line that posts its answer (or, asked to
    /// approve, its decision), and how long the run waits for it.
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
        let limit = humantime(self.settings.limit);
        let what = match &self.approving {
            Some(speaker) => format!("{} to approve or reject {speaker}'s turn", x.id),
            None => x.id.clone(),
        };
        let first = !self.told.contains(&x.id);
        if !first && self.approving.is_none() {
            return self.line("2", &format!("  … waiting for {what}"));
        }
        self.told.push(x.id.clone());
        let addr = self.settings.address.clone().unwrap_or_default();
        let mut lines = vec![format!(
            "  … waiting for {what} (not run by this server), up to the run's time limit ({limit}, --timeout):"
        )];
        if first {
            lines.push(format!(
                "    connect to ws://{addr}/rpc and authenticate with {}, or post over HTTP:",
                x.token
            ));
        }
        let (text, after) = match &self.approving {
            Some(_) => ("approve", "   # or \"reject\" to refuse it"),
            None => ("…", ""),
        };
        lines.push(format!(
            "    curl -s -X POST http://{addr}/conversations/{}/messages -H 'Authorization: Bearer {}' -H 'Content-Type: application/json' -d '{{\"payload\":{{\"text\":\"{text}\"}},\"finality\":\"turn\"}}'{after}",
            self.conversation_id, x.token
        ));
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
        told: Vec::new(),
        gave_up: Vec::new(),
        approving: None,
        view: orch.hub().get(&id),
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

/// Whether the conversation stopping for `reason` is the scenario's own end (its stop
/// condition, its sequence done, its time), not the way out of a turn nobody took.
fn completes(reason: proto_spec::system::StopReason) -> bool {
    use proto_spec::system::StopReason as R;
    matches!(
        reason,
        R::OnText | R::MaxTurns | R::SequenceDone | R::MaxDuration
    )
}

/// `90s`, `10m`, `1h30m`: a duration as `--timeout` takes it.
fn humantime(d: Duration) -> String {
    let s = d.as_secs();
    if s == 0 {
        return format!("{}ms", d.subsec_millis());
    }
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, 0) => format!("{m}m"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, 0, 0) => format!("{h}h"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}
