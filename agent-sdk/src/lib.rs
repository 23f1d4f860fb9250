//! The agent programming model: what an agent is and how it talks to the orchestrator.
//!
//! - [`Agent`]: `handle_turn(ctx) -> TurnOutcome`; [`TurnOutcome`] is advisory, the logged
//!   finality is what counts.
//! - [`AgentContext`]: the conversation, the agent, the turn, the deadline, the client and a
//!   tracing span, with helpers (`get_updates`, `post`, `post_trace`, `wait_for_change`) that
//!   put the turn in every write and give each write an idempotency key.
//! - [`AgentClient`]: every protocol method. [`WsJsonRpcClient`] implements it over WebSocket
//!   for a partner's process; the orchestrator's `InProcessClient` implements it inside the
//!   server. The same agent code runs on either.
//! - [`pool::ClientPool`]: one authenticated connection per token, for a process that acts
//!   for many callers, each as its own principal (the adapters).
//!
//! It depends on [`proto_spec`] only, so adapters and partners can use it without the server.
//!
//! # Example
//! ```
//! use agent_sdk::{async_trait, Agent, AgentContext, AgentError, TurnOutcome};
//! use agent_sdk::proto::Finality;
//!
//! struct Echo;
//!
//! #[async_trait]
//! impl Agent for Echo {
//!     async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
//!         let updates = ctx.get_updates(None).await?;
//!         let last = updates.messages.last().map(|m| m.payload_value()["text"].to_string());
//!         ctx.say(format!("echo: {}", last.unwrap_or_default()), Finality::Turn).await?;
//!         Ok(TurnOutcome::Posted)
//!     }
//! }
//! ```

pub mod agent;
pub mod client;
pub mod host;
pub mod pool;
pub mod sub;
pub mod tls;
pub mod ws;

pub use agent::{Agent, AgentContext, AgentError, TurnOutcome};
pub use async_trait::async_trait;
pub use client::{
    all_conversations, new_request_id, AgentClient, Cancel, ClientError, ClientResult, EventStream,
    ExecutorClient, TurnRequests,
};
pub use proto_spec as proto;
pub use ws::{WsConfig, WsJsonRpcClient, WsStats};
