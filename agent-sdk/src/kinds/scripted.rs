//! `scripted`: fixed replies, in order, for tests and demos.

use async_trait::async_trait;
use proto_spec::Finality;
use serde_json::Value;

use crate::{Agent, AgentContext, AgentError, TurnOutcome};

/// Answers its n-th turn with its n-th reply (counting its own messages in the log, so it
/// picks up where it was after a restart). With its replies used up it yields.
#[derive(Debug, Clone)]
pub struct Scripted {
    replies: Vec<String>,
}

impl Scripted {
    /// An agent with these replies.
    pub fn new(replies: Vec<String>) -> Self {
        Scripted { replies }
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
        let history = ctx.history().await?;
        let mine = history
            .iter()
            .filter(|m| m.author == ctx.agent_id && m.finality != Some(Finality::None))
            .count();
        let Some(reply) = self.replies.get(mine) else {
            return Ok(TurnOutcome::Yield);
        };
        ctx.say(reply.clone(), Finality::Turn).await?;
        Ok(TurnOutcome::Posted)
    }
}
