//! What a kind is: the step that turns a turn's assembled context into a reply ([`Execute`]),
//! and the reply's shape ([`Reply`], [`OutMessage`]), shared by every kind and by the modes that
//! shape a reply into a plan or a deliverable.

use std::fmt::Debug;

use async_trait::async_trait;
use proto_spec::{Finality, Mode};
use serde::Deserialize;
use serde_json::{json, Value};

use agent_sdk::{AgentContext, AgentError};

/// One message an execution asks to post.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OutMessage {
    /// What is said.
    pub text: String,
    /// Structured content.
    #[serde(default)]
    pub data: Option<Value>,
    /// A type name for `data`.
    #[serde(default)]
    pub schema: Option<String>,
    /// Labels.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Addressees.
    #[serde(default)]
    pub to: Vec<String>,
    /// Its finality; by default `turn` for the last message and `none` before it.
    #[serde(default)]
    pub finality: Option<Finality>,
    /// The mode it asks of the agents it addresses (and of the next speaker).
    #[serde(default)]
    pub mode: Option<Mode>,
}

impl OutMessage {
    /// A message with only text.
    pub fn text(text: impl Into<String>) -> Self {
        OutMessage {
            text: text.into(),
            data: None,
            schema: None,
            tags: Vec::new(),
            to: Vec::new(),
            finality: None,
            mode: None,
        }
    }
}

/// What one execution produced: messages to post, in order. None: the agent passes.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// The messages.
    pub messages: Vec<OutMessage>,
}

/// The step that differs between kinds: from the assembled context to a reply.
#[async_trait]
pub trait Execute: Send + Sync + Debug {
    /// The kind's name, for traces and errors.
    fn kind(&self) -> &'static str;
    /// Runs once for a turn. `context` is what the participant's declaration assembled, with
    /// the turn's `mode` and, in plan or build mode, the document asked for under `output`.
    async fn execute(&self, ctx: &AgentContext, context: Value) -> Result<Reply, AgentError>;
    /// What of a reply message is the document's content, for a kind whose reply wraps it
    /// (a tool's output); `None`: the message's `data`, else its text.
    fn document_content(&self, _m: &OutMessage) -> Result<Option<Value>, AgentError> {
        Ok(None)
    }
}

/// Reads a reply from JSON: `{"messages": [...]}`, one message, or `{"error": "..."}`.
pub fn parse_reply(v: Value) -> Result<Reply, AgentError> {
    if let Some(e) = v.get("error") {
        let text = e
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| e.to_string());
        return Err(format!("the agent reported an error: {text}").into());
    }
    if let Some(list) = v.get("messages") {
        let messages: Vec<OutMessage> =
            serde_json::from_value(list.clone()).map_err(|e| format!("reply.messages: {e}"))?;
        return Ok(Reply { messages });
    }
    let m: OutMessage = serde_json::from_value(v.clone()).map_err(|e| {
        format!("reply: {e} (expected {{\"text\": …}}, {{\"messages\": [...]}} or {{\"error\": …}}, got {})", json!(v))
    })?;
    Ok(Reply { messages: vec![m] })
}
