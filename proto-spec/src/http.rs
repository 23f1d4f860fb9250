//! The HTTP routes served beside `/rpc` on the same port: their bodies, queries and results,
//! and the route table the OpenAPI document ([`crate::spec::openapi`]) is generated from.
//!
//! Every route but `/healthz`, `/metrics`, `/openapi.json` and the console page (`/`) needs
//! `Authorization: Bearer <token>`. Errors are [`HttpError`] bodies with the protocol's code
//! and the HTTP status of [`crate::ErrorCode::http_status`].

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::error::ErrorObject;
use crate::event::{Event, Finality, MessagePayload};
use crate::method::TurnHint;

/// Body of `POST /conversations/{id}/messages`. An `Idempotency-Key` header is the
/// `clientRequestId` (giving both with different values is refused).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostMessageBody {
    /// What is said.
    pub payload: MessagePayload,
    /// `none`, `turn` or `conversation`.
    pub finality: Finality,
    /// Append only if this is still the current turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_hint: Option<TurnHint>,
    /// Idempotency key: a retry with the same key appends nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_id: Option<String>,
}

/// Query of `GET /conversations/{id}/events` (SSE).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventsQuery {
    /// Replay events after this seq (default 0: the whole log). A `Last-Event-ID` header
    /// takes precedence: the stream resumes exactly after that seq.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_seq: Option<u64>,
}

/// Query of `GET /conversations/{id}/wait` (long-poll).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitQuery {
    /// Answer once the latest seq passes this (default 0).
    #[serde(default)]
    pub since_seq: u64,
    /// How long to wait, in milliseconds (default 30,000; capped by the server's limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// Result of `GET /conversations/{id}/wait`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitResult {
    /// The seq of the last event.
    pub latest_seq: u64,
    /// True when the wait ended with nothing after `sinceSeq`.
    pub timed_out: bool,
    /// Events with seq > `sinceSeq`, in order (at most the server's tail limit; ask again
    /// from the last one for more).
    pub events: Vec<Event>,
}

/// Result of `GET /me`: who the bearer token speaks as.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WhoAmI {
    /// The agent id.
    pub agent_id: String,
    /// Whether it is an admin (creates, pauses and resumes conversations).
    pub admin: bool,
    /// The tenant it belongs to.
    pub tenant: String,
}

/// The body of every HTTP error.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HttpError {
    /// The protocol's error object: code, message, data (with the code's name).
    pub error: ErrorObject,
}

/// HTTP header names the routes read.
pub mod headers {
    /// The clientRequestId of `POST /conversations/{id}/messages`.
    pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
    /// The seq an SSE stream resumes after.
    pub const LAST_EVENT_ID: &str = "last-event-id";
}
