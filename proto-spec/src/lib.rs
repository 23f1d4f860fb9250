//! Wire types, method names and error codes of the conversation orchestrator's protocol.
//!
//! This crate is the protocol's single source of truth: serde types for every object that
//! travels, the method and notification names, and the error-code table with the one mapping
//! to the wire. It has no runtime: no tokio, no SQLite. `PROTOCOL.md` beside this crate is the
//! normative text; `openrpc.json` and `schemas/` are generated from these types (see [`spec`]).
//!
//! # Layout
//! - [`document`]: agent modes, and the plans and deliverables they produce.
//! - [`event`]: events, kinds, finality, message payloads.
//! - [`guidance`]: guidance, conversation status, snapshots.
//! - [`method`]: method names ([`method::names`]) and every params and result type.
//! - [`error`]: the error-code table ([`error::codes`], [`ErrorCode`]) and [`RpcError::to_wire`].
//! - [`http`]: the HTTP routes' bodies, queries and results.
//! - [`system`]: the payloads of `system` events, the orchestrator's stop message and the
//!   executors' traces.
//! - [`tenant`]: tenant names and the keys that keep their conversations apart.
//! - [`tokens`]: minting, listing and revoking a tenant's tokens over the protocol.
//! - [`spec`]: the OpenRPC document and JSON Schemas generated from the types.
//!
//! # Example
//! ```
//! use proto_spec::{ErrorCode, RpcError, SendMessageParams, Finality, MessagePayload};
//!
//! let p: SendMessageParams = serde_json::from_value(serde_json::json!({
//!     "conversationId": "c1",
//!     "payload": {"text": "hello"},
//!     "finality": "turn",
//!     "turnHint": {"turn": 3}
//! })).unwrap();
//! assert_eq!(p.finality, Finality::Turn);
//! assert_eq!(p.payload, MessagePayload::text("hello"));
//!
//! let wire = RpcError::new(ErrorCode::TurnMismatch, "turn 3 is not current")
//!     .with_data(serde_json::json!({"currentTurn": 4}))
//!     .to_wire();
//! assert_eq!(wire.code, -32013);
//! assert_eq!(wire.data.unwrap()["error"], "TurnMismatch");
//! ```

pub mod document;
pub mod error;
pub mod event;
pub mod guidance;
pub mod http;
pub mod method;
pub mod scenario;
pub mod spec;
pub mod system;
pub mod tenant;
pub mod tokens;

pub use document::{DocFormat, DocumentData, Mode, OutputSpec, DELIVERABLE_SCHEMA, PLAN_SCHEMA};
pub use error::{codes, ErrorCode, ErrorObject, RpcError};
pub use event::{Attachment, Event, EventKind, Finality, MessagePayload};
pub use guidance::{ConversationStatus, Guidance, GuidanceStatus, Snapshot};
pub use http::{EventsQuery, HttpError, PostMessageBody, WaitQuery, WaitResult, WhoAmI};
pub use method::*;
pub use system::{ExecutorTrace, StopReason, SystemEvent};
pub use tokens::{
    CreateTenantParams, CreateTokenParams, CreateTokenResult, ListTenantsParams, ListTenantsResult,
    ListTokensParams, ListTokensResult, RevokeTokenParams, RevokeTokenResult,
    SetTenantQuotasParams, TenantQuotas, TenantSummary, TokenSummary,
};

/// The author of events the orchestrator writes itself.
pub const ORCHESTRATOR_AUTHOR: &str = "orchestrator";
