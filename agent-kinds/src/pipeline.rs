//! The one execution pipeline of every built-in kind but `scripted`: trigger (the turn) →
//! assemble the declared context → execute → shape the reply for the turn's mode → respond.
//! Kinds differ only in [`Execute`]; the modes are shared ([`Outputs`]): the context carries
//! the mode (`mode`) and the document asked for (`output`), and in plan mode the reply becomes
//! a plan, in build mode a deliverable (when one is declared), checked against its declared
//! format before anything is posted.

use std::fmt::Debug;

use async_trait::async_trait;
use proto_spec::{Finality, MessagePayload};

use super::context::{assemble, ContextSpec};
use super::execute::{Execute, Reply};
use super::modes::Outputs;
use agent_sdk::{Agent, AgentContext, AgentError, TurnOutcome};

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
