//! The [`Agent`] trait, what a turn returns ([`TurnOutcome`]), and what it is given
//! ([`AgentContext`]).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use proto_spec::*;
use serde_json::Value;

use crate::client::{AgentClient, ClientResult};

/// What an agent says it did with its turn. Advisory: what counts is the finality it logged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurnOutcome {
    /// It posted (a reply with finality `turn`, or progress).
    Posted,
    /// It hands the turn back without answering.
    Yield,
    /// It had nothing to do.
    NoAction,
    /// It closed the conversation (finality `conversation`).
    Complete,
}

impl TurnOutcome {
    /// The name written in traces.
    pub fn as_str(self) -> &'static str {
        match self {
            TurnOutcome::Posted => "posted",
            TurnOutcome::Yield => "yield",
            TurnOutcome::NoAction => "no_action",
            TurnOutcome::Complete => "complete",
        }
    }

    /// The outcome as the executor's `turn_end` trace records it.
    pub fn as_trace(self) -> proto_spec::system::TurnEndOutcome {
        use proto_spec::system::TurnEndOutcome as T;
        match self {
            TurnOutcome::Posted => T::Posted,
            TurnOutcome::Yield => T::Yield,
            TurnOutcome::NoAction => T::NoAction,
            TurnOutcome::Complete => T::Complete,
        }
    }
}

/// The error an agent returns; the executor logs it as a trace and may retry.
pub type AgentError = Box<dyn std::error::Error + Send + Sync>;

/// An agent: code that takes one turn at a time. The same value runs inside the server (through
/// the in-process client) or in a partner's process (through [`crate::WsJsonRpcClient`]).
/// Agents are stateless between turns: they re-read what they need from the log.
#[async_trait]
pub trait Agent: Send + Sync {
    /// Takes the turn described by `ctx`.
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError>;
}

/// Everything one invocation of an agent needs.
#[derive(Debug)]
pub struct AgentContext {
    /// The conversation.
    pub conversation_id: String,
    /// The agent taking the turn.
    pub agent_id: String,
    /// The turn (every message is posted with it as `turnHint`).
    pub turn: u64,
    /// Which attempt this is (1 for the first).
    pub attempt: u32,
    /// When the turn must be done.
    pub deadline: tokio::time::Instant,
    /// Where to read context from: the log after this seq.
    pub since_seq: u64,
    /// The mode the turn asks for: `converse` (talk), `plan` (produce or revise a plan) or
    /// `build` (produce a deliverable).
    pub mode: Mode,
    /// The client the agent speaks through.
    pub client: Arc<dyn AgentClient>,
    /// A span for the agent's own tracing.
    pub span: tracing::Span,
    posts: AtomicU32,
}

impl AgentContext {
    /// A context for one attempt at one turn.
    pub fn new(
        client: Arc<dyn AgentClient>,
        conversation_id: impl Into<String>,
        turn: u64,
        attempt: u32,
        deadline: tokio::time::Instant,
        since_seq: u64,
    ) -> Self {
        let conversation_id = conversation_id.into();
        let agent_id = client.agent_id().to_string();
        let span = tracing::info_span!("turn", conversation = %conversation_id, agent = %agent_id, turn, attempt);
        AgentContext {
            conversation_id,
            agent_id,
            turn,
            attempt,
            deadline,
            since_seq,
            mode: Mode::Converse,
            client,
            span,
            posts: AtomicU32::new(0),
        }
    }

    /// The same context, for a turn that asks for `mode`.
    pub fn with_mode(mut self, mode: Mode) -> Self {
        self.mode = mode;
        self
    }

    /// The idempotency key of this attempt's next write. It depends only on the turn, the
    /// attempt and the order of writes, so an attempt that is run again (after a crash of the
    /// executor, or on another replica) writes nothing twice.
    pub fn next_key(&self, what: &str) -> String {
        let n = self.posts.fetch_add(1, Ordering::Relaxed);
        format!("t{}.a{}.{what}{n}", self.turn, self.attempt)
    }

    /// Time left before the deadline.
    pub fn remaining(&self) -> Duration {
        self.deadline
            .saturating_duration_since(tokio::time::Instant::now())
    }

    /// New messages and guidance after `since_seq` (the context's cursor when `None`).
    pub async fn get_updates(&self, since_seq: Option<u64>) -> ClientResult<GetUpdatesResult> {
        self.client
            .get_updates(GetUpdatesParams {
                conversation_id: self.conversation_id.clone(),
                since_seq: Some(since_seq.unwrap_or(self.since_seq)),
                limit: None,
                timeout_ms: None,
            })
            .await
    }

    /// Every message of the conversation so far.
    pub async fn history(&self) -> ClientResult<Vec<Event>> {
        self.messages_after(0).await
    }

    /// Every message after seq `after`, page by page.
    pub async fn messages_after(&self, after: u64) -> ClientResult<Vec<Event>> {
        let mut out = Vec::new();
        let mut cursor = after;
        loop {
            let page = self.get_updates(Some(cursor)).await?;
            let done = page.messages.is_empty() || page.latest_seq <= cursor;
            cursor = page.latest_seq;
            out.extend(page.messages);
            if done {
                return Ok(out);
            }
        }
    }

    /// Posts a message in this turn (`turnHint` is the turn, so a reply can never land in
    /// another turn).
    pub async fn post(
        &self,
        payload: MessagePayload,
        finality: Finality,
    ) -> ClientResult<AppendResult> {
        self.client
            .send_message(SendMessageParams {
                conversation_id: self.conversation_id.clone(),
                payload,
                finality,
                turn_hint: Some(TurnHint { turn: self.turn }),
                client_request_id: Some(self.next_key("m")),
                after_key: None,
            })
            .await
    }

    /// Posts text in this turn.
    pub async fn say(
        &self,
        text: impl Into<String>,
        finality: Finality,
    ) -> ClientResult<AppendResult> {
        self.post(MessagePayload::text(text), finality).await
    }

    /// Writes a trace for this turn.
    pub async fn post_trace(&self, payload: Value) -> ClientResult<AppendResult> {
        self.client
            .send_trace(SendTraceParams {
                conversation_id: self.conversation_id.clone(),
                payload,
                turn: Some(self.turn),
                client_request_id: Some(self.next_key("x")),
                finality: None,
                after_key: None,
            })
            .await
    }

    /// Waits until the conversation moves past `since_seq` or `timeout` passes.
    pub async fn wait_for_change(
        &self,
        since_seq: u64,
        timeout: Duration,
    ) -> ClientResult<WaitForChangeResult> {
        self.client
            .wait_for_change(WaitForChangeParams {
                conversation_id: self.conversation_id.clone(),
                since_seq,
                timeout_ms: timeout.as_millis() as u64,
            })
            .await
    }
}
