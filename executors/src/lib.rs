//! Executors: run an agent one turn at a time, inside the server or in a partner's process.
//!
//! - [`core`]: the executor core both kinds share: one in-flight invocation per (conversation,
//!   agent), the deadline, a grace window after progress-only output, retries with backoff
//!   while the turn is still the agent's, and `turn_start` / `turn_end` / `turn_error` traces
//!   in the log.
//! - [`internal`]: [`InternalExecutor`], driven by the orchestrator's turn assignments. It
//!   does not depend on the orchestrator: it is handed a source of [`Assignment`]s and a
//!   client factory.
//! - [`external`]: [`ExternalExecutor`], in a partner's process: pull mode (watch guidance)
//!   or push-claim mode (`registerExecutor`, `request_turn`, `claimTurn`).

pub mod core;
pub mod external;
pub mod internal;

pub use crate::core::{Assignment, ExecPolicy, ExecutorCore, RunReport};
pub use agent_sdk;
pub use external::ExternalExecutor;
pub use internal::{ClientFactory, InternalExecutor};
