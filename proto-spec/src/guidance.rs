//! Guidance and conversation snapshots: what an agent may do now.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The lifecycle state of a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ConversationStatus {
    /// Accepting events.
    Active,
    /// Paused by an admin: messages are refused until it resumes.
    Paused,
    /// A message with finality `conversation` was appended: nothing more will be.
    Closed,
}

/// Whether an agent may speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum GuidanceStatus {
    /// The agent may post messages in the current turn.
    MaySpeak,
    /// Another agent holds the turn, or the conversation is paused.
    Wait,
    /// The conversation is closed.
    Closed,
}

/// What one agent may do now, computed from the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Guidance {
    /// `may_speak`, `wait` or `closed`.
    pub status: GuidanceStatus,
    /// The current turn.
    pub turn: u64,
    /// The agent that holds the turn; absent when the conversation is open to all participants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
    /// When the current turn times out, RFC 3339, if it has a deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// Why the agent must wait, such as `paused` or `not_your_turn`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The mode the current turn asks of its speaker (`converse`, `plan`, `build`); absent when
    /// no speaker holds the turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::Mode>,
}

/// The state of a conversation at one point of its log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    /// The conversation.
    #[serde(serialize_with = "crate::tenant::local")]
    pub conversation_id: String,
    /// `active`, `paused` or `closed`.
    pub status: ConversationStatus,
    /// The seq of the last event (0 for an empty log).
    pub latest_seq: u64,
    /// The current turn.
    pub turn: u64,
    /// The agent that holds the turn, if turns are assigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speaker: Option<String>,
    /// The agents that take part.
    pub participants: Vec<String>,
    /// Guidance for the agent that asked.
    pub guidance: Guidance,
    /// For a sub-conversation: the conversation that opened it.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "crate::tenant::local_opt"
    )]
    pub parent_conversation_id: Option<String>,
    /// When its last event was committed, RFC 3339 (what a list sorts by last activity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event_at: Option<String>,
}
