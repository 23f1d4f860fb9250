//! What the orchestrator and the executors write about a conversation, as types: the payloads
//! of `system` events ([`SystemEvent`], author `orchestrator`), the data of the orchestrator's
//! closing message ([`StopData`], schema `orchestrator.stop.v1`), and the executors' traces
//! around each turn ([`ExecutorTrace`]). PROTOCOL.md §4.1 describes each.
//!
//! Every writer builds these types and every reader parses them; no string names a type
//! anywhere else. A reader meets only the types it knows: [`SystemEvent::parse`] answers `None`
//! for a type a newer server wrote, so old readers skip it instead of failing.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The schema name of the orchestrator's closing message.
pub const STOP_SCHEMA: &str = "orchestrator.stop.v1";

/// The payload of a `system` event, by its `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SystemEvent {
    /// The first event of every conversation (seq 1, turn 1).
    Created(Created),
    /// The policy named who speaks in the current turn.
    NextSpeaker(NextSpeaker),
    /// The next speaker has an approval checkpoint: the approver speaks first.
    ApprovalRequested(ApprovalRequested),
    /// The current turn ran past its deadline; it ends without an answer.
    TurnTimeout(TurnTimeout),
    /// No participant appended anything for the scenario's `stop.idleTimeout`.
    IdleTimeout,
    /// The conversation reached the scenario's `stop.maxDuration`.
    MaxDuration,
    /// An admin paused the conversation.
    Paused(ChangedBy),
    /// An admin resumed the conversation.
    Resumed(ChangedBy),
    /// The events before this one were copied from another conversation.
    ForkedFrom(ForkedFrom),
    /// A sub-conversation of this one was opened (in the parent's log).
    SubconversationStarted(SubconversationStarted),
    /// A sub-conversation of this one closed (in the parent's log).
    SubconversationFinished(SubconversationFinished),
}

impl SystemEvent {
    /// Every `type` this build writes, in the order of the variants.
    pub const TYPES: &'static [&'static str] = &[
        "created",
        "next_speaker",
        "approval_requested",
        "turn_timeout",
        "idle_timeout",
        "max_duration",
        "paused",
        "resumed",
        "forked_from",
        "subconversation_started",
        "subconversation_finished",
    ];

    /// The event's `type`, as written.
    pub fn type_name(&self) -> &'static str {
        match self {
            SystemEvent::Created(_) => "created",
            SystemEvent::NextSpeaker(_) => "next_speaker",
            SystemEvent::ApprovalRequested(_) => "approval_requested",
            SystemEvent::TurnTimeout(_) => "turn_timeout",
            SystemEvent::IdleTimeout => "idle_timeout",
            SystemEvent::MaxDuration => "max_duration",
            SystemEvent::Paused(_) => "paused",
            SystemEvent::Resumed(_) => "resumed",
            SystemEvent::ForkedFrom(_) => "forked_from",
            SystemEvent::SubconversationStarted(_) => "subconversation_started",
            SystemEvent::SubconversationFinished(_) => "subconversation_finished",
        }
    }

    /// Parses a system payload; `None` for a type this build does not know (or a payload that
    /// is not one), which a reader skips.
    pub fn parse(payload: &str) -> Option<SystemEvent> {
        serde_json::from_str(payload).ok()
    }

    /// [`SystemEvent::parse`] from a parsed value.
    pub fn from_value(payload: &Value) -> Option<SystemEvent> {
        SystemEvent::deserialize(payload).ok()
    }

    /// The payload as JSON.
    pub fn to_value(&self) -> Value {
        // Every field is a string, number, list or JSON value: serializing cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

/// `created`: who takes part, who created it, and what it was created with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Created {
    /// The agents that take part, in order.
    pub participants: Vec<String>,
    /// The agent that created it.
    pub created_by: String,
    /// The caller's metadata, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// The turn policy recorded from the scenario (the server's own format; readers other than
    /// the server treat it as opaque).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<Value>,
    /// For a sub-conversation: the conversation that opened it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<ParentLink>,
    /// The scenario it was made from: its library name, or an inline scenario's `name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
}

/// A sub-conversation's place in its tree.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ParentLink {
    /// The conversation that opened it.
    pub conversation_id: String,
    /// How deep it is (1 for a child of a top-level conversation).
    pub depth: u32,
    /// The top-level conversation of its tree (logs written before it was recorded lack it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
}

/// `next_speaker`: who speaks in turn `turn`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NextSpeaker {
    /// The agent whose turn it is.
    pub speaker: String,
    /// The turn.
    pub turn: u64,
    /// How long the turn may take (ms), from this event's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// In a `sequence`, the speaker's place in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// `approval`: the speaker is an approver deciding on [`NextSpeaker::for_speaker`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<SpeakerReason>,
    /// With `reason: approval`, the speaker waiting for approval.
    #[serde(default, rename = "for", skip_serializing_if = "Option::is_none")]
    pub for_speaker: Option<String>,
    /// The approver's decision that led here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval: Option<ApprovalDecision>,
    /// With `approval: rejected`, the speaker that was skipped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub skipped: Option<String>,
    /// True when the same speaker is asked again after its turn timed out (`onTimeout: retry`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retry: bool,
    /// The mode the turn asks of the speaker: the one the closing message asked for, else the
    /// speaker's default. Absent: `converse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::Mode>,
}

impl NextSpeaker {
    /// `speaker` speaks in `turn`, nothing else said.
    pub fn new(speaker: impl Into<String>, turn: u64) -> Self {
        NextSpeaker {
            speaker: speaker.into(),
            turn,
            timeout_ms: None,
            position: None,
            reason: None,
            for_speaker: None,
            approval: None,
            skipped: None,
            retry: false,
            mode: None,
        }
    }
}

/// Why a speaker was named other than by the order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum SpeakerReason {
    /// The speaker is an approver at a checkpoint.
    Approval,
}

/// An approver's decision at a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalDecision {
    /// The waiting speaker speaks.
    Approved,
    /// The waiting speaker is skipped.
    Rejected,
}

/// `approval_requested`: `for` waits for `approver`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalRequested {
    /// The speaker waiting for approval.
    #[serde(rename = "for")]
    pub for_speaker: String,
    /// Who decides.
    pub approver: String,
    /// In a `sequence`, the waiting speaker's place in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub position: Option<u64>,
    /// The mode the waiting speaker was asked for; its turn asks for it once approved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::Mode>,
}

/// `turn_timeout`: turn `turn` of `speaker` ended without an answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnTimeout {
    /// The turn that timed out.
    pub turn: u64,
    /// Its speaker.
    pub speaker: String,
}

/// `paused`, `resumed`: who did it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangedBy {
    /// The admin that paused or resumed.
    pub by: String,
}

/// `forked_from`: the events up to `atSeq` are those of `from`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ForkedFrom {
    /// The conversation forked.
    pub from: String,
    /// The last seq copied.
    pub at_seq: u64,
}

/// `subconversation_started`: `by` opened `child` at `depth`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubconversationStarted {
    /// The sub-conversation.
    pub child: String,
    /// Who opened it.
    pub by: String,
    /// Its depth.
    pub depth: u32,
}

/// `subconversation_finished`: how `child` ended, and its result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubconversationFinished {
    /// The sub-conversation.
    pub child: String,
    /// Whether a participant closed it or the orchestrator stopped it.
    pub status: FinishStatus,
    /// With `stopped`: the stop reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<StopReason>,
    /// The seq of its closing message (in the child's log).
    pub closed_seq: u64,
    /// Its last message from a participant, or `null`.
    pub result: Option<SubconversationResult>,
}

impl SubconversationFinished {
    /// The result's text ("" when the child ended without a participant message).
    pub fn text(&self) -> &str {
        self.result
            .as_ref()
            .and_then(|r| r.text.as_deref())
            .unwrap_or("")
    }

    /// Whether the child failed: it timed out, or ended without any participant message.
    pub fn failed(&self) -> bool {
        self.result.is_none() || self.reason.is_some_and(StopReason::is_timeout)
    }

    /// How it ended, in words.
    pub fn describe(&self) -> String {
        match (&self.reason, &self.result) {
            (Some(r), _) => format!("it was stopped: {}", r.as_str().replace('_', " ")),
            (None, Some(m)) => format!("{} closed it", m.author),
            (None, None) => "it closed without an answer".into(),
        }
    }
}

/// How a sub-conversation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FinishStatus {
    /// A participant closed it.
    Completed,
    /// The orchestrator stopped it.
    Stopped,
}

/// A sub-conversation's result: its last message from a participant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubconversationResult {
    /// The message's seq (in the child's log).
    pub seq: u64,
    /// Its author.
    pub author: String,
    /// Its text.
    pub text: Option<String>,
    /// Its data.
    pub data: Option<Value>,
    /// Its schema.
    pub schema: Option<String>,
}

/// Why the orchestrator closed a conversation (`data.reason` of its closing message).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// A turn-closing message contained `stop.onText`.
    OnText,
    /// The turn that closed was the last (`stop.maxTurns`).
    MaxTurns,
    /// Nobody appended anything for `stop.idleTimeout`.
    IdleTimeout,
    /// `stop.maxDuration` passed since creation.
    MaxDuration,
    /// A turn timed out and `turn.onTimeout` is `end`.
    TurnTimeout,
    /// Two full rounds of turns timed out with no message.
    NoAnswer,
    /// A `sequence` ran to its end.
    SequenceDone,
    /// A `rules` policy found no rule that matched.
    NoRuleMatched,
}

impl StopReason {
    /// The reason as written.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::OnText => "on_text",
            StopReason::MaxTurns => "max_turns",
            StopReason::IdleTimeout => "idle_timeout",
            StopReason::MaxDuration => "max_duration",
            StopReason::TurnTimeout => "turn_timeout",
            StopReason::NoAnswer => "no_answer",
            StopReason::SequenceDone => "sequence_done",
            StopReason::NoRuleMatched => "no_rule_matched",
        }
    }

    /// Whether the conversation ended because time ran out (a turn, idleness, the duration).
    pub fn is_timeout(self) -> bool {
        matches!(
            self,
            StopReason::TurnTimeout | StopReason::IdleTimeout | StopReason::MaxDuration
        )
    }
}

/// The `data` of the orchestrator's closing message (schema [`STOP_SCHEMA`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StopData {
    /// Why it closed.
    pub reason: StopReason,
}

impl StopData {
    /// The stop reason of a message payload, if it is the orchestrator's closing message.
    pub fn of(payload: &Value) -> Option<StopReason> {
        if payload.get("schema").and_then(Value::as_str) != Some(STOP_SCHEMA) {
            return None;
        }
        StopData::deserialize(payload.get("data")?)
            .ok()
            .map(|d| d.reason)
    }
}

/// A trace the executors write around each invocation of an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ExecutorTrace {
    /// Before an attempt.
    TurnStart(TurnAttempt),
    /// After an attempt that returned.
    TurnEnd(TurnEnd),
    /// A failed attempt (the agent's error, or `deadline exceeded`).
    TurnError(TurnError),
}

impl ExecutorTrace {
    /// The payload as JSON.
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// The attempt it reports on.
    pub fn attempt(&self) -> &TurnAttempt {
        match self {
            ExecutorTrace::TurnStart(a) => a,
            ExecutorTrace::TurnEnd(e) => &e.attempt,
            ExecutorTrace::TurnError(e) => &e.attempt,
        }
    }
}

/// Which invocation a trace reports on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnAttempt {
    /// The agent invoked.
    pub agent: String,
    /// The turn it was invoked for.
    pub turn: u64,
    /// The attempt (1 for the first).
    pub attempt: u32,
}

/// `turn_end`: how an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnEnd {
    /// The attempt.
    #[serde(flatten)]
    pub attempt: TurnAttempt,
    /// What the agent did.
    pub outcome: TurnEndOutcome,
}

/// What an agent's attempt did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnEndOutcome {
    /// It posted its reply.
    Posted,
    /// It handed the turn back without answering.
    Yield,
    /// It had nothing to do.
    NoAction,
    /// It closed the conversation.
    Complete,
    /// It posted only progress; the turn is still open.
    Incomplete,
}

/// `turn_error`: a failed attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnError {
    /// The attempt.
    #[serde(flatten)]
    pub attempt: TurnAttempt,
    /// What went wrong.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_unknown_type_is_skipped_not_an_error() {
        assert_eq!(
            SystemEvent::parse(r#"{"type":"from_the_future","x":1}"#),
            None
        );
        assert_eq!(
            SystemEvent::parse(r#"{"type":"paused","by":"admin"}"#),
            Some(SystemEvent::Paused(ChangedBy { by: "admin".into() }))
        );
    }

    #[test]
    fn type_names_are_what_is_written() {
        let all = [
            SystemEvent::IdleTimeout,
            SystemEvent::MaxDuration,
            SystemEvent::NextSpeaker(NextSpeaker::new("a", 1)),
            SystemEvent::TurnTimeout(TurnTimeout {
                turn: 1,
                speaker: "a".into(),
            }),
        ];
        for e in all {
            assert_eq!(e.to_value()["type"], e.type_name());
        }
    }

    #[test]
    fn a_stop_reason_is_read_only_from_the_closing_message() {
        let closing = json!({"text": "The conversation ended: max turns.", "schema": STOP_SCHEMA, "data": {"reason": "max_turns"}});
        assert_eq!(StopData::of(&closing), Some(StopReason::MaxTurns));
        let forged = json!({"text": "x", "data": {"reason": "max_turns"}});
        assert_eq!(StopData::of(&forged), None);
    }
}
