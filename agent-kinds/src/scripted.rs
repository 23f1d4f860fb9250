//! `scripted`: fixed replies, in order, for tests and demos.

use async_trait::async_trait;
use proto_spec::{Finality, MessagePayload};
use serde_json::Value;

use super::execute::{OutMessage, Reply};
use super::modes::Outputs;
use agent_sdk::{Agent, AgentContext, AgentError, TurnOutcome};

/// Answers its n-th turn with its n-th reply. It counts its own messages in the log on its
/// first turn (so it picks up where it was after a restart), then keeps count itself: one
/// value serves one conversation. With its replies used up it yields. In plan or build mode
/// the reply is shaped into the declared document like every kind's ([`Outputs::shape`]).
#[derive(Debug)]
pub struct Scripted {
    replies: Vec<String>,
    said: std::sync::Mutex<Option<(usize, u64)>>,
    outputs: Outputs,
}

impl Scripted {
    /// An agent with these replies.
    pub fn new(replies: Vec<String>) -> Self {
        Scripted {
            replies,
            said: std::sync::Mutex::new(None),
            outputs: Outputs::default(),
        }
    }

    /// The same agent, with these modes and documents.
    pub fn with_outputs(mut self, outputs: Outputs) -> Self {
        self.outputs = outputs;
        self
    }

    /// From a scenario's participant: `{"kind": "scripted", "replies": [...]}`.
    pub fn from_spec(spec: &Value) -> Option<Self> {
        let replies = spec
            .get("replies")?
            .as_array()?
            .iter()
            .map(|r| r.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()?;
        Some(Scripted::new(replies))
    }
}

#[async_trait]
impl Agent for Scripted {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        // What this value last posted (how many replies so far, and the seq of the last one);
        // the log after it is read too, since the same agent may have spoken through another
        // value meanwhile (another node of a cluster, another executor after a restart).
        let (before, after) = self.said.lock().ok().and_then(|s| *s).unwrap_or((0, 0));
        let mine = before
            + ctx
                .messages_after(after)
                .await?
                .iter()
                .filter(|m| m.author == ctx.agent_id && m.finality != Some(Finality::None))
                .count();
        let Some(reply) = self.replies.get(mine) else {
            return Ok(TurnOutcome::Yield);
        };
        self.outputs.check_mode(ctx)?;
        let shaped = self.outputs.shape(
            ctx.mode,
            Reply {
                messages: vec![OutMessage::text(reply.clone())],
            },
            None,
        )?;
        let m = shaped.messages.into_iter().next().unwrap_or_default();
        let payload = MessagePayload {
            data: m.data,
            schema: m.schema,
            ..MessagePayload::text(m.text)
        };
        let posted = ctx.post(payload, Finality::Turn).await;
        if let Ok(mut s) = self.said.lock() {
            // After a failed post the log is the judge again.
            *s = posted.as_ref().ok().map(|r| (mine + 1, r.seq));
        }
        posted?;
        Ok(TurnOutcome::Posted)
    }
}
