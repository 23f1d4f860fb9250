//! The adapter's errors in A2A terms: a JSON-RPC error with a `google.rpc.ErrorInfo` whose
//! `reason` names what happened, and the HTTP status it travels with.

use agent_sdk::proto::ErrorCode;
use agent_sdk::ClientError;
use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::tasks::ReadError;

/// An A2A JSON-RPC error.
#[derive(Debug)]
pub(crate) struct A2aError {
    pub(crate) code: i32,
    pub(crate) message: String,
    pub(crate) reason: &'static str,
    /// The HTTP status of the answer (200 for every error of a call that was read, as the
    /// JSON-RPC binding has it; 401 when the caller is not authenticated).
    pub(crate) status: StatusCode,
}

/// The code of a refusal for a peer over one of its caps (JSON-RPC's server-defined range;
/// A2A defines none for it).
pub(crate) const OVER_LIMIT: i32 = -32050;
/// The code of a call without valid credentials.
pub(crate) const UNAUTHENTICATED: i32 = -32040;

impl A2aError {
    pub(crate) fn new(code: i32, reason: &'static str, message: impl Into<String>) -> A2aError {
        A2aError {
            code,
            message: message.into(),
            reason,
            status: StatusCode::OK,
        }
    }

    /// No such task for this peer: the same answer whether it exists (for someone else) or not.
    pub(crate) fn task_not_found(id: &str) -> A2aError {
        A2aError::new(-32001, "TASK_NOT_FOUND", format!("no task {id}"))
    }

    /// No such context for this peer: the same answer whether it exists or not.
    pub(crate) fn context_not_found(id: &str) -> A2aError {
        A2aError::new(
            -32001,
            "CONTEXT_NOT_FOUND",
            format!("no context {id}; leave contextId out to start a new one"),
        )
    }

    pub(crate) fn invalid_params(message: impl Into<String>) -> A2aError {
        A2aError::new(-32602, "INVALID_PARAMS", message)
    }

    /// A peer over one of its caps; `what` says which and how to go on.
    pub(crate) fn over_limit(reason: &'static str, what: impl Into<String>) -> A2aError {
        A2aError::new(OVER_LIMIT, reason, what)
    }

    /// A call without a usable bearer token (HTTP 401).
    pub(crate) fn unauthenticated(message: impl Into<String>) -> A2aError {
        A2aError {
            status: StatusCode::UNAUTHORIZED,
            ..A2aError::new(UNAUTHENTICATED, "UNAUTHENTICATED", message)
        }
    }

    pub(crate) fn wire(&self, id: &Value) -> Value {
        json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": self.code,
                "message": self.message,
                "data": [{
                    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                    "reason": self.reason,
                    "domain": "a2a-protocol.org",
                    "metadata": {},
                }],
            },
        })
    }

    /// A refusal of the orchestrator, in A2A terms. A conversation the peer may not read is
    /// answered as one that does not exist, with no word of the orchestrator's.
    pub(crate) fn upstream(e: ClientError) -> A2aError {
        let ClientError::Rpc(rpc) = &e else {
            return A2aError::new(
                -32603,
                "UPSTREAM_UNAVAILABLE",
                format!("the orchestrator cannot be reached: {e}"),
            );
        };
        match rpc.code {
            ErrorCode::ConversationNotFound | ErrorCode::Forbidden => {
                A2aError::invalid_params("unknown contextId; leave it out to start a new context")
            }
            ErrorCode::Unauthenticated => A2aError::unauthenticated(format!(
                "the orchestrator no longer accepts this token: {}",
                rpc.message
            )),
            ErrorCode::RateLimited => A2aError::over_limit("RATE_LIMITED", rpc.message.clone()),
            ErrorCode::NotYourTurn | ErrorCode::TurnMismatch | ErrorCode::TurnClosed => {
                A2aError::new(
                    -32600,
                    "NOT_YOUR_TURN",
                    format!(
                        "{}; wait until the task is input-required before sending",
                        rpc.message
                    ),
                )
            }
            ErrorCode::ConversationClosed => A2aError::new(
                -32600,
                "CONTEXT_CLOSED",
                format!("{}; start a new context", rpc.message),
            ),
            ErrorCode::ConversationPaused => A2aError::new(
                -32600,
                "CONTEXT_PAUSED",
                format!("{}; try again once it resumes", rpc.message),
            ),
            ErrorCode::IdempotencyKeyReused => A2aError::invalid_params(format!(
                "this messageId was sent before with another content: {}",
                rpc.message
            )),
            ErrorCode::ModeNotSupported => {
                A2aError::invalid_params(format!("message.metadata.mode: {}", rpc.message))
            }
            ErrorCode::PayloadTooLarge | ErrorCode::InvalidParams => {
                A2aError::invalid_params(rpc.message.clone())
            }
            _ => A2aError::new(-32603, "INTERNAL", rpc.message.clone()),
        }
    }

    pub(crate) fn from_read(e: ReadError, id: &str) -> A2aError {
        match e {
            ReadError::NotFound => A2aError::task_not_found(id),
            ReadError::Upstream(e) => A2aError::upstream(e),
        }
    }
}
