//! Events: the entries of a conversation's log, and the payloads they carry.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

/// What kind of entry an event is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EventKind {
    /// Something a participant said. Only messages carry finality.
    Message,
    /// Observability: free JSON about what an agent did. Never carries finality.
    Trace,
    /// Written by the orchestrator itself (author `orchestrator`): decisions and state changes.
    System,
}

impl EventKind {
    /// The wire name of the kind.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Message => "message",
            EventKind::Trace => "trace",
            EventKind::System => "system",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "message" => Some(EventKind::Message),
            "trace" => Some(EventKind::Trace),
            "system" => Some(EventKind::System),
            _ => None,
        }
    }
}

/// How final a message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Finality {
    /// Progress or a streaming fragment; the turn stays open.
    None,
    /// Closes the current turn.
    Turn,
    /// Closes the conversation: nothing more is appended after it.
    Conversation,
}

impl Finality {
    /// The wire name of the finality.
    pub fn as_str(self) -> &'static str {
        match self {
            Finality::None => "none",
            Finality::Turn => "turn",
            Finality::Conversation => "conversation",
        }
    }

    /// Parses a wire name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "none" => Some(Finality::None),
            "turn" => Some(Finality::Turn),
            "conversation" => Some(Finality::Conversation),
            _ => None,
        }
    }
}

// The payload is kept as the JSON text it was stored as (`RawValue`): an event is serialized to
// many subscribers, and parsed only by those who look inside (see `Event::payload_value`).
/// One entry of a conversation's log.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    /// The conversation this event belongs to.
    #[serde(serialize_with = "crate::tenant::local")]
    pub conversation_id: String,
    /// Position in the log: starts at 1, dense, strictly increasing. The cursor on every transport.
    pub seq: u64,
    /// `message`, `trace` or `system`.
    pub kind: EventKind,
    /// The authenticated identity that wrote it; `orchestrator` for the server itself.
    pub author: String,
    /// The turn the event belongs to (turns start at 1).
    pub turn: u64,
    /// Messages only: `none`, `turn` or `conversation`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finality: Option<Finality>,
    /// For a message, a [`MessagePayload`]; for a trace, free JSON; for a system event, an object with `type`.
    #[schemars(with = "Value")]
    pub payload: Box<RawValue>,
    /// The writer's idempotency key, if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_id: Option<String>,
    /// When it was committed, RFC 3339 UTC with milliseconds.
    pub ts: String,
    /// This event as JSON, made on first use: an event sent to many subscribers is serialized
    /// once. Not part of the wire form.
    #[serde(skip)]
    #[schemars(skip)]
    pub json: JsonOnce,
}

/// A value's JSON text, made at most once and shared by every reader (see [`Event::to_json`]).
/// [`Event`]'s equality ignores it. A clone starts empty, so a copy that is changed and then
/// sent is serialized as it is, not as the original was.
#[derive(Default)]
pub struct JsonOnce(std::sync::OnceLock<Box<RawValue>>);

impl Clone for JsonOnce {
    fn clone(&self) -> Self {
        JsonOnce::default()
    }
}

impl std::fmt::Debug for JsonOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.get().is_some() {
            "JsonOnce(made)"
        } else {
            "JsonOnce(not made)"
        })
    }
}

impl Event {
    /// This event as JSON (its wire form), serialized on the first call and kept: the text is
    /// of the event as it was then. Events are shared read-only once committed; change a clone.
    pub fn to_json(&self) -> &RawValue {
        self.json.0.get_or_init(|| {
            // An event holds only strings, numbers and JSON text: serializing it cannot fail.
            serde_json::value::to_raw_value(self).unwrap_or_else(|_| RawValue::NULL.to_owned())
        })
    }

    /// The payload, parsed.
    pub fn payload_value(&self) -> Value {
        serde_json::from_str(self.payload.get()).unwrap_or(Value::Null)
    }
}

impl PartialEq for Event {
    fn eq(&self, other: &Self) -> bool {
        self.conversation_id == other.conversation_id
            && self.seq == other.seq
            && self.kind == other.kind
            && self.author == other.author
            && self.turn == other.turn
            && self.finality == other.finality
            && self.payload.get() == other.payload.get()
            && self.client_request_id == other.client_request_id
            && self.ts == other.ts
    }
}

/// A file or blob attached to a message: by `uri`, or inline as `content`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Attachment {
    /// A file name for people.
    pub name: String,
    /// The media type, such as `text/plain`.
    pub media_type: String,
    /// Where the content lives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// The content itself (text, or base64 for binary media types).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// The payload of a message.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MessagePayload {
    /// What was said.
    pub text: String,
    /// Structured content; selectors match on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
    /// Attached files.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
    /// A type name for `data`, such as `tool.request.v1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<String>,
    /// Free labels; selectors match on them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// The agents this message is addressed to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<String>,
    /// The mode this message asks for: of the agents in `to`, and, when it closes the turn, of
    /// the next speaker. Absent: the agent's default mode (the first it declares). Asking an
    /// agent for a mode it does not declare is refused (`ModeNotSupported`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::Mode>,
}

impl MessagePayload {
    /// A payload with only text.
    pub fn text(text: impl Into<String>) -> Self {
        MessagePayload {
            text: text.into(),
            ..Default::default()
        }
    }
}
