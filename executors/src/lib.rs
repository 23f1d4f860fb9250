//! Executors: run an agent one turn at a time, inside the server or in a partner's process.
//!
//! This crate will hold the executor core (one in-flight invocation per conversation and
//! agent, the deadline, a grace window after progress-only output, retries while the turn is
//! still the agent's, and start/end/error traces), `InternalExecutor` (driven by the
//! orchestrator's turn assignments) and `ExternalExecutor` (pull and push-claim modes). It does
//! not depend on the orchestrator: the orchestrator hands it a source of assignments and a
//! client factory.
//!
//! # Layout
//! - (to come with the executors issue) `core`, `internal`, `external`.
//!
//! # Example
//! ```
//! // The agent SDK is the only way in:
//! let _ = agent_sdk::proto::method::names::SEND_MESSAGE;
//! ```

pub use agent_sdk;
