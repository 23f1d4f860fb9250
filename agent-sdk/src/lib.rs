//! The agent programming model: what an agent is and how it talks to the orchestrator.
//!
//! This crate will hold the `Agent` trait (`handle_turn(ctx) -> TurnOutcome`), the
//! `AgentContext` handed to each turn, the `AgentClient` trait that covers every protocol
//! method, and `WsJsonRpcClient`, the client that runs an agent in a partner's process. The same
//! agent code then runs inside the server (through the orchestrator's in-process client) or
//! outside it. It depends on [`proto_spec`] only, so adapters and partners can use it without
//! pulling in the server.
//!
//! # Layout
//! - (to come with the SDK issue) `agent`, `context`, `client`, `ws_client`.
//!
//! # Example
//! The wire types it builds on are already here:
//! ```
//! use agent_sdk::proto::{Finality, MessagePayload, SendMessageParams};
//! let p = SendMessageParams {
//!     conversation_id: "c1".into(),
//!     payload: MessagePayload::text("hello"),
//!     finality: Finality::Turn,
//!     turn_hint: None,
//!     client_request_id: None,
//! };
//! assert_eq!(serde_json::to_value(&p).unwrap()["finality"], "turn");
//! ```

pub use proto_spec as proto;
