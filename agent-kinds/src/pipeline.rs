//! The one execution pipeline of every built-in kind but `scripted`: trigger (the turn) →
//! assemble the declared context → execute → shape the reply for the turn's mode → respond.
//! Kinds differ only in [`Execute`]; the modes are shared ([`Outputs`]): the context carries
//! the mode (`mode`) and the document asked for (`output`), and in plan mode the reply becomes
//! a plan, in build mode a deliverable (when one is declared), checked against its declared
//! format before anything is posted.

use std::fmt::Debug;

use async_trait::async_trait;
use proto_spec::{Finality, MessagePayload, Mode};
use serde::Deserialize;
use serde_json::{json, Value};

use super::context::{assemble, ContextSpec};
pub use super::modes::Outputs;
use agent_sdk::{Agent, AgentContext, AgentError, TurnOutcome};

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

/// An agent made of a context declaration, an execute step, and what it declares about modes.
#[derive(Debug)]
pub struct Pipeline {
    context: ContextSpec,
    exec: Box<dyn Execute>,
    outputs: Outputs,
}

impl Pipeline {
    /// A pipeline with this declaration and step, in every mode, with undeclared documents.
    pub fn new(context: ContextSpec, exec: Box<dyn Execute>) -> Pipeline {
        Pipeline::with_outputs(context, exec, Outputs::default())
    }

    /// A pipeline with this declaration, step and modes.
    pub fn with_outputs(
        context: ContextSpec,
        exec: Box<dyn Execute>,
        outputs: Outputs,
    ) -> Pipeline {
        Pipeline {
            context,
            exec,
            outputs,
        }
    }
}

#[async_trait]
impl Agent for Pipeline {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        self.outputs.check_mode(ctx)?;
        let mut context = assemble(ctx, &self.context).await?;
        self.outputs.describe(ctx.mode, &mut context);
        let started = std::time::Instant::now();
        let reply = self.exec.execute(ctx, context).await?;
        let took_ms = started.elapsed().as_millis() as u64;
        tracing::debug!(kind = self.exec.kind(), took_ms, mode = %ctx.mode, "executed");
        let reply = self
            .outputs
            .shape(ctx.mode, reply, Some(self.exec.as_ref()))?;
        respond(ctx, reply).await
    }
}

/// Posts a reply's messages in order, in this turn.
pub async fn respond(ctx: &AgentContext, reply: Reply) -> Result<TurnOutcome, AgentError> {
    let n = reply.messages.len();
    if n == 0 {
        return Ok(TurnOutcome::NoAction);
    }
    let mut outcome = TurnOutcome::Posted;
    for (i, m) in reply.messages.into_iter().enumerate() {
        let finality = m.finality.unwrap_or(if i + 1 == n {
            Finality::Turn
        } else {
            Finality::None
        });
        if finality == Finality::Conversation {
            outcome = TurnOutcome::Complete;
        }
        let payload = MessagePayload {
            text: m.text,
            data: m.data,
            attachments: Vec::new(),
            schema: m.schema,
            tags: m.tags,
            to: m.to,
            mode: m.mode,
        };
        ctx.post(payload, finality).await?;
        if finality != Finality::None {
            break;
        }
    }
    Ok(outcome)
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

/// Reads a kind's settings (the participant without `kind`, `id` and `context`); the error
/// starts with the setting it is about (`fallback` when serde does not name one).
pub fn settings<T: serde::de::DeserializeOwned>(spec: &Value, fallback: &str) -> Result<T, String> {
    let mut v = spec.clone();
    if let Some(o) = v.as_object_mut() {
        for shared in ["kind", "id", "context", "modes", "plan", "deliverable"] {
            o.remove(shared);
        }
    }
    serde_json::from_value(v).map_err(|e| {
        let msg = e.to_string();
        match msg.split('`').nth(1) {
            Some(field) if msg.contains("unknown field") || msg.contains("missing field") => {
                format!("{field}: {msg}")
            }
            _ => format!("{fallback}: {msg}"),
        }
    })
}
