//! Speaker policies: who speaks next and when the conversation stops. Decided inside
//! [`ConvMachine::apply`] from the policy recorded in the `created` event, so each decision
//! commits with the event that caused it and recovery reads it back from the log.

use proto_spec::scenario::{approved, ApprovalSpec, OnTimeout, Order, RuleSpec};
use proto_spec::system::{
    ApprovalDecision, ApprovalRequested, NextSpeaker, SpeakerReason, StopData, StopReason,
    SystemEvent, STOP_SCHEMA,
};
use proto_spec::{EventKind, Finality, MessagePayload, Mode, ORCHESTRATOR_AUTHOR};
use serde_json::Value;

use super::{to_raw, ConvMachine, Draft};

/// Who speaks next and when the conversation stops, decided in the state machine and logged as
/// system events (`next_speaker`, `approval_requested`) or as the orchestrator's closing message,
/// in the same transaction as the message that closes a turn (invariant 7). It is recorded in
/// the conversation's `created` event, so recovery rebuilds it from the log.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnPolicy {
    /// The order; `None`: every participant may speak at any time (stop conditions still hold).
    #[serde(default)]
    pub order: Option<Order>,
    /// The speakers, in participant order.
    #[serde(default)]
    pub speakers: Vec<String>,
    /// The speakers of a `sequence` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequence: Vec<String>,
    /// Who takes turn 1.
    #[serde(default)]
    pub first: String,
    /// Selector rules, tried before the order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleSpec>,
    /// Approval checkpoints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalSpec>,
    /// Each turn's timeout, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// What a turn timeout does.
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// Close after this many turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u64>,
    /// Close when a turn-closing message contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_text: Option<String>,
    /// Close after this long without an append (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Close this long after creation (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<u64>,
    /// Whether internal executors trace each turn's start and end.
    #[serde(default = "yes", skip_serializing_if = "Clone::clone")]
    pub traces: bool,
    /// The participants the server runs itself, with their kind and settings.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub agents: std::collections::BTreeMap<String, Value>,
    /// On whose authority the participants the server runs act; absent in logs written before
    /// it was recorded (they then act with no authority beyond their own conversation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authority: Option<Authority>,

    /// The modes of each participant that does not support every mode, its default first
    /// (absent: every mode, `converse` by default).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub modes: std::collections::BTreeMap<String, Vec<Mode>>,
}

/// On whose authority the agents a scenario declares act (docs/security.md): they read other
/// conversations only with the rights of `reader`, the principal that created the
/// conversation (or of the principal that one acted for), and may themselves open
/// sub-conversations whose scenarios run code only when `trusted`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Authority {
    /// The principal whose read rights the agents have.
    pub reader: String,
    /// Whether that principal is an admin (who reads every conversation).
    #[serde(default)]
    pub admin: bool,
    /// Whether the scenario came from an admin or the server's library, and so may declare
    /// participants that run code.
    #[serde(default)]
    pub trusted: bool,
}

fn yes() -> bool {
    true
}

/// What the policy decides after a turn ends.
#[derive(Debug, Clone, PartialEq)]
enum Decision {
    /// Give the next turn to this speaker (its `turn` and `timeoutMs` are filled in when the
    /// event is made).
    Speaker(NextSpeaker),
    /// Close the conversation, for this reason.
    Stop(StopReason),
    /// Nothing to decide (no order: the floor is open).
    Open,
}

impl TurnPolicy {
    /// The speaker after `author` in participant order.
    fn after(&self, author: &str) -> String {
        let i = self.speakers.iter().position(|s| s == author);
        match i {
            Some(i) => self.speakers[(i + 1) % self.speakers.len()].clone(),
            None => self.first.clone(),
        }
    }

    /// The next speaker by the order alone, after `author` held the turn (`sequence_pos` is the
    /// position in `sequence` of the turn that ended).
    fn by_order(
        &self,
        author: &str,
        payload: Option<&Value>,
        sequence_pos: Option<usize>,
    ) -> Decision {
        match self.order {
            None => Decision::Open,
            Some(Order::RoundRobin) => speaker(self.after(author)),
            Some(Order::Addressed) => {
                let addressed = payload.and_then(|p| self.addressed(author, p));
                speaker(addressed.unwrap_or_else(|| self.after(author)))
            }
            Some(Order::Sequence) => {
                let next = sequence_pos.map_or(0, |p| p + 1);
                match self.sequence.get(next) {
                    Some(s) => Decision::Speaker(NextSpeaker {
                        position: Some(next as u64),
                        ..NextSpeaker::new(s.clone(), 0)
                    }),
                    None => Decision::Stop(StopReason::SequenceDone),
                }
            }
            Some(Order::Rules) => Decision::Stop(StopReason::NoRuleMatched),
        }
    }

    /// The participant a message addresses: its first `to`, or the first `@id` it mentions.
    fn addressed(&self, author: &str, payload: &Value) -> Option<String> {
        let known = |id: &str| id != author && self.speakers.iter().any(|s| s == id);
        if let Some(to) = payload.get("to").and_then(Value::as_array) {
            if let Some(id) = to.iter().filter_map(Value::as_str).find(|id| known(id)) {
                return Some(id.to_string());
            }
        }
        let text = payload.get("text").and_then(Value::as_str)?;
        text.split('@').skip(1).find_map(|rest| {
            let id: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || "._:-".contains(*c))
                .collect();
            let id = id.trim_end_matches(['.', ':']).to_string();
            known(&id).then_some(id)
        })
    }

    /// What a timeout of `speaker`'s turn `turn` decides, with `core` the state once the
    /// timeout is observed.
    fn timeout_decision(&self, speaker: &str, turn: u64, core: &super::TurnState) -> Decision {
        // A turn ended by its timeout is a turn: it counts towards maxTurns.
        if self.max_turns.is_some_and(|max| turn >= max) {
            return Decision::Stop(StopReason::MaxTurns);
        }
        // Nobody answered for two full rounds: nobody is speaking, so the conversation ends
        // instead of timing out forever.
        if core.silent_turns >= self.silent_limit() {
            return Decision::Stop(StopReason::NoAnswer);
        }
        match self.on_timeout {
            OnTimeout::End => Decision::Stop(StopReason::TurnTimeout),
            OnTimeout::Retry => Decision::Speaker(NextSpeaker {
                mode: Some(core.mode),
                retry: true,
                position: core.sequence_pos.map(|p| p as u64),
                ..NextSpeaker::new(speaker.to_string(), 0)
            }),
            OnTimeout::Skip => self.by_order(speaker, None, core.sequence_pos),
        }
    }

    /// What the open turn's timeout will decide when it fires: the participant the turn goes to
    /// next (`Ok(None)`: nobody in particular, the floor opens), or why the conversation closes.
    /// The state machine decides the same when the `turn_timeout` is appended; `run` asks
    /// ahead to tell whether waiting for it can lead anywhere. `None` without a turn timeout.
    pub fn after_timeout(
        &self,
        core: &super::TurnState,
    ) -> Option<std::result::Result<Option<String>, StopReason>> {
        self.timeout_ms?;
        let speaker = core.speaker.clone()?;
        let mut after = core.clone();
        after.silent_turns = after.silent_turns.saturating_add(1);
        Some(match self.timeout_decision(&speaker, core.turn, &after) {
            Decision::Speaker(n) => Ok(Some(n.speaker)),
            Decision::Stop(reason) => Err(reason),
            Decision::Open => Ok(None),
        })
    }

    /// How many turns in a row may end by a timeout before the conversation ends with reason
    /// `no_answer`: two full rounds of speakers (at least two turns).
    pub fn silent_limit(&self) -> u32 {
        u32::try_from(self.speakers.len().max(1) * 2).unwrap_or(u32::MAX)
    }

    /// The modes `agent` supports, its default first.
    pub fn modes_of(&self, agent: &str) -> &[Mode] {
        self.modes.get(agent).map_or(&Mode::ALL, Vec::as_slice)
    }

    /// The mode of a turn that asks `agent` for none.
    pub fn default_mode(&self, agent: &str) -> Mode {
        self.modes_of(agent)
            .first()
            .copied()
            .unwrap_or(Mode::Converse)
    }

    fn approver_of(&self, speaker: &str) -> Option<&str> {
        self.approvals
            .iter()
            .find(|a| a.before == speaker)
            .map(|a| a.approver.as_str())
    }
}

impl ConvMachine {
    /// The policy's decisions after `d` (already observed): the events that start the next
    /// turn (`next_speaker`, with `approval_requested` before it at a checkpoint) or the
    /// orchestrator's closing message; and, when `asked` (the mode `d` asks for) is given and
    /// the next turn goes to a speaker, that speaker (who must support the mode).
    pub(super) fn decide(&self, d: &Draft, asked: Option<Mode>) -> (Vec<Draft>, Option<String>) {
        let Some(policy) = self.policy.as_ref() else {
            return (Vec::new(), None);
        };
        if self.core.closed {
            return (Vec::new(), None);
        }
        // The mode the next speaker is asked for: what the message asked, or, for a speaker
        // approved at a checkpoint, what was asked before it, or, for the same speaker asked
        // again after a timeout, the mode it had.
        let mut asked = asked;
        let decision = match (d.kind, d.finality) {
            (EventKind::Message, Some(Finality::Turn)) if d.author != ORCHESTRATOR_AUTHOR => {
                let payload: Value = serde_json::from_str(d.payload.get()).unwrap_or(Value::Null);
                let decision = self.after_message(policy, d, &payload);
                if matches!(&decision, Decision::Speaker(n) if n.approval == Some(ApprovalDecision::Approved))
                {
                    asked = asked.or(self.core.pending_mode);
                }
                decision
            }
            (EventKind::System, _) => match SystemEvent::parse(d.payload.get()) {
                Some(SystemEvent::Created(_)) if policy.order.is_some() => {
                    let position = (policy.order == Some(Order::Sequence)).then_some(0);
                    Decision::Speaker(NextSpeaker {
                        position,
                        ..NextSpeaker::new(policy.first.clone(), 0)
                    })
                }
                Some(SystemEvent::TurnTimeout(t)) => {
                    policy.timeout_decision(&t.speaker, d.turn, &self.core)
                }
                Some(SystemEvent::IdleTimeout) => Decision::Stop(StopReason::IdleTimeout),
                Some(SystemEvent::MaxDuration) => Decision::Stop(StopReason::MaxDuration),
                _ => return (Vec::new(), None),
            },
            _ => return (Vec::new(), None),
        };
        let mut asked_of = None;
        // Built from this state without copying it: the drafts follow one another (seq + 1
        // each); none of them changes the turn before the next is built.
        let mut out = Vec::new();
        match decision {
            Decision::Open => {}
            Decision::Stop(reason) => out.push(self.closing_draft(reason)),
            Decision::Speaker(mut next) => {
                if asked.is_some() {
                    asked_of = Some(next.speaker.clone());
                }
                let mode = next
                    .mode
                    .or(asked)
                    .unwrap_or_else(|| policy.default_mode(&next.speaker));
                let gate = self.core.pending_approval.is_none()
                    && next.approval.is_none()
                    && policy.approver_of(&next.speaker).is_some();
                if gate {
                    let approver = policy
                        .approver_of(&next.speaker)
                        .unwrap_or_default()
                        .to_string();
                    out.push(self.system_draft(&SystemEvent::ApprovalRequested(
                        ApprovalRequested {
                            for_speaker: next.speaker.clone(),
                            approver: approver.clone(),
                            // In a sequence, the place of the speaker waiting for approval.
                            position: next.position,
                            // What the speaker is asked for once approved (a retried
                            // speaker's own mode, or what the message asked).
                            mode: next.mode.or(asked),
                        },
                    )));
                    let approver_mode = policy.default_mode(&approver);
                    let mut ask = self.speaker_draft(
                        policy,
                        NextSpeaker {
                            reason: Some(SpeakerReason::Approval),
                            for_speaker: Some(next.speaker),
                            mode: (approver_mode != Mode::Converse).then_some(approver_mode),
                            ..NextSpeaker::new(approver, 0)
                        },
                    );
                    ask.seq += 1;
                    out.push(ask);
                } else {
                    next.mode = (mode != Mode::Converse).then_some(mode);
                    out.push(self.speaker_draft(policy, next));
                }
            }
        }
        (out, asked_of)
    }

    /// What follows a participant's message that closed its turn.
    fn after_message(&self, policy: &TurnPolicy, d: &Draft, payload: &Value) -> Decision {
        if let Some(token) = &policy.on_text {
            let text = payload.get("text").and_then(Value::as_str).unwrap_or("");
            if text.contains(token.as_str()) {
                return Decision::Stop(StopReason::OnText);
            }
        }
        if policy.max_turns.is_some_and(|max| d.turn >= max) {
            return Decision::Stop(StopReason::MaxTurns);
        }
        // An approver's answer decides the pending checkpoint.
        if let Some(waiting) = &self.core.pending_approval {
            if policy.approver_of(waiting) == Some(d.author.as_str()) {
                return if approved(payload) {
                    Decision::Speaker(NextSpeaker {
                        approval: Some(ApprovalDecision::Approved),
                        ..NextSpeaker::new(waiting.clone(), 0)
                    })
                } else {
                    match policy.by_order(waiting, None, self.core.sequence_pos) {
                        Decision::Speaker(next) => Decision::Speaker(NextSpeaker {
                            approval: Some(ApprovalDecision::Rejected),
                            skipped: Some(waiting.clone()),
                            ..next
                        }),
                        other => other,
                    }
                };
            }
        }
        if let Some(rule) = policy
            .rules
            .iter()
            .find(|r| r.when.matches(&d.author, payload))
        {
            return speaker(rule.next.clone());
        }
        policy.by_order(&d.author, Some(payload), self.core.sequence_pos)
    }

    /// The `next_speaker` event of `next`, in the current turn, with the policy's timeout.
    fn speaker_draft(&self, policy: &TurnPolicy, next: NextSpeaker) -> Draft {
        self.system_draft(&SystemEvent::NextSpeaker(NextSpeaker {
            turn: self.core.turn,
            timeout_ms: policy.timeout_ms,
            ..next
        }))
    }

    /// The orchestrator's message that closes the conversation.
    fn closing_draft(&self, reason: StopReason) -> Draft {
        let payload = MessagePayload {
            schema: Some(STOP_SCHEMA.to_string()),
            data: Some(serde_json::to_value(StopData { reason }).unwrap_or(Value::Null)),
            ..MessagePayload::text(format!(
                "The conversation ended: {}.",
                reason.as_str().replace('_', " ")
            ))
        };
        Draft {
            seq: self.core.head + 1,
            kind: EventKind::Message,
            author: ORCHESTRATOR_AUTHOR.to_string(),
            turn: self.core.turn,
            finality: Some(Finality::Conversation),
            payload: to_raw(&payload),
            client_request_id: None,
            hash: None,
            doc: false,
        }
    }
}

/// The next turn to `speaker`, nothing else said.
fn speaker(speaker: String) -> Decision {
    Decision::Speaker(NextSpeaker::new(speaker, 0))
}
