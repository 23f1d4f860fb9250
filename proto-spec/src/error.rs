//! The error-code table: constants, an enum, and the one mapping to the wire.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The numeric codes, as constants (JSON-RPC `error.code`).
pub mod codes {
    /// Invalid JSON was received.
    pub const PARSE_ERROR: i32 = -32700;
    /// The JSON sent is not a valid request object.
    pub const INVALID_REQUEST: i32 = -32600;
    /// The method does not exist.
    pub const METHOD_NOT_FOUND: i32 = -32601;
    /// Invalid method parameters (also: an invalid scenario).
    pub const INVALID_PARAMS: i32 = -32602;
    /// Internal error; details are logged by the server, never sent.
    pub const INTERNAL: i32 = -32603;
    /// A batch (JSON array of calls): this server takes one call per frame.
    pub const BATCH_NOT_SUPPORTED: i32 = -32005;
    /// Too many subscriptions open on one connection.
    pub const TOO_MANY_SUBSCRIPTIONS: i32 = -32006;
    /// A WebSocket frame over the frame limit.
    pub const FRAME_TOO_LARGE: i32 = -32007;
    /// An answer over the response limit.
    pub const RESPONSE_TOO_LARGE: i32 = -32008;
    /// The connection has not authenticated, or the token is wrong.
    pub const UNAUTHENTICATED: i32 = -32001;
    /// The agent may not do this: it does not take part, or it is not an admin.
    pub const FORBIDDEN: i32 = -32002;
    /// No conversation has this id.
    pub const CONVERSATION_NOT_FOUND: i32 = -32003;
    /// A conversation with this id exists already.
    pub const CONVERSATION_EXISTS: i32 = -32004;
    /// The conversation is closed: nothing more is appended.
    pub const CONVERSATION_CLOSED: i32 = -32010;
    /// The turn named is closed.
    pub const TURN_CLOSED: i32 = -32011;
    /// Another agent holds the turn.
    pub const NOT_YOUR_TURN: i32 = -32012;
    /// The `turnHint` (or named turn) is not the current turn.
    pub const TURN_MISMATCH: i32 = -32013;
    /// Finality on a trace or system event, or an unknown finality.
    pub const INVALID_FINALITY: i32 = -32014;
    /// The clientRequestId was used before with another body.
    pub const IDEMPOTENCY_KEY_REUSED: i32 = -32015;
    /// The conversation is paused.
    pub const CONVERSATION_PAUSED: i32 = -32016;
    /// A message asks an agent for a mode it does not declare.
    pub const MODE_NOT_SUPPORTED: i32 = -32017;
    /// The claim is unknown, expired or taken.
    pub const CLAIM_NOT_FOUND: i32 = -32020;
    /// A rate, connection or in-flight limit was hit.
    pub const RATE_LIMITED: i32 = -32029;
    /// A payload over the payload limit.
    pub const PAYLOAD_TOO_LARGE: i32 = -32030;
    /// A sub-conversation over the depth or fan-out limit.
    pub const SUBCONVERSATION_LIMIT: i32 = -32031;
    /// The agent's budget of bytes appended (a minute) is spent.
    pub const QUOTA_EXCEEDED: i32 = -32032;
    /// One of the tenant's quotas is reached (`data: {quota, limit, used}`).
    pub const TENANT_QUOTA_EXCEEDED: i32 = -32033;
}

/// Every error the protocol returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum ErrorCode {
    /// -32700: invalid JSON.
    ParseError,
    /// -32600: not a valid JSON-RPC request object (or an empty batch).
    InvalidRequest,
    /// -32601: unknown method.
    MethodNotFound,
    /// -32602: params missing, of the wrong type, or unknown; an invalid scenario.
    InvalidParams,
    /// -32603: the server failed; nothing about it is sent.
    Internal,
    /// -32005: a batch; send one call per frame.
    BatchNotSupported,
    /// -32006: too many subscriptions on one connection.
    TooManySubscriptions,
    /// -32007: a WebSocket frame over the frame limit.
    FrameTooLarge,
    /// -32008: an answer over the response limit (ask for fewer events).
    ResponseTooLarge,
    /// -32001: no authenticated identity, or a wrong token.
    Unauthenticated,
    /// -32002: not a participant, or not an admin.
    Forbidden,
    /// -32003: unknown conversation.
    ConversationNotFound,
    /// -32004: the conversation id is taken.
    ConversationExists,
    /// -32010: the conversation is closed.
    ConversationClosed,
    /// -32011: the turn is closed.
    TurnClosed,
    /// -32012: another agent holds the turn.
    NotYourTurn,
    /// -32013: the turn hint is stale.
    TurnMismatch,
    /// -32014: finality where it is not allowed.
    InvalidFinality,
    /// -32015: same clientRequestId, another body.
    IdempotencyKeyReused,
    /// -32016: the conversation is paused.
    ConversationPaused,
    /// -32017: a message asks an agent for a mode it does not declare.
    ModeNotSupported,
    /// -32020: unknown, expired or taken claim.
    ClaimNotFound,
    /// -32029: a rate, connection or in-flight limit.
    RateLimited,
    /// -32030: a payload over the limit.
    PayloadTooLarge,
    /// -32031: a sub-conversation over the depth or fan-out limit.
    SubconversationLimit,
    /// -32032: the agent's budget of bytes appended is spent for now (`data.retryAfterMs`).
    QuotaExceeded,
    /// -32033: one of the tenant's quotas is reached (`data: {quota, limit, used}`).
    TenantQuotaExceeded,
}

impl ErrorCode {
    /// Every code, in table order.
    pub const ALL: [ErrorCode; 27] = [
        ErrorCode::ParseError,
        ErrorCode::InvalidRequest,
        ErrorCode::MethodNotFound,
        ErrorCode::InvalidParams,
        ErrorCode::Internal,
        ErrorCode::BatchNotSupported,
        ErrorCode::TooManySubscriptions,
        ErrorCode::FrameTooLarge,
        ErrorCode::ResponseTooLarge,
        ErrorCode::Unauthenticated,
        ErrorCode::Forbidden,
        ErrorCode::ConversationNotFound,
        ErrorCode::ConversationExists,
        ErrorCode::ConversationClosed,
        ErrorCode::TurnClosed,
        ErrorCode::NotYourTurn,
        ErrorCode::TurnMismatch,
        ErrorCode::InvalidFinality,
        ErrorCode::IdempotencyKeyReused,
        ErrorCode::ConversationPaused,
        ErrorCode::ModeNotSupported,
        ErrorCode::ClaimNotFound,
        ErrorCode::RateLimited,
        ErrorCode::PayloadTooLarge,
        ErrorCode::SubconversationLimit,
        ErrorCode::QuotaExceeded,
        ErrorCode::TenantQuotaExceeded,
    ];

    /// The numeric JSON-RPC code.
    pub fn code(self) -> i32 {
        use codes::*;
        match self {
            ErrorCode::ParseError => PARSE_ERROR,
            ErrorCode::InvalidRequest => INVALID_REQUEST,
            ErrorCode::MethodNotFound => METHOD_NOT_FOUND,
            ErrorCode::InvalidParams => INVALID_PARAMS,
            ErrorCode::Internal => INTERNAL,
            ErrorCode::BatchNotSupported => BATCH_NOT_SUPPORTED,
            ErrorCode::TooManySubscriptions => TOO_MANY_SUBSCRIPTIONS,
            ErrorCode::FrameTooLarge => FRAME_TOO_LARGE,
            ErrorCode::ResponseTooLarge => RESPONSE_TOO_LARGE,
            ErrorCode::Unauthenticated => UNAUTHENTICATED,
            ErrorCode::Forbidden => FORBIDDEN,
            ErrorCode::ConversationNotFound => CONVERSATION_NOT_FOUND,
            ErrorCode::ConversationExists => CONVERSATION_EXISTS,
            ErrorCode::ConversationClosed => CONVERSATION_CLOSED,
            ErrorCode::TurnClosed => TURN_CLOSED,
            ErrorCode::NotYourTurn => NOT_YOUR_TURN,
            ErrorCode::TurnMismatch => TURN_MISMATCH,
            ErrorCode::InvalidFinality => INVALID_FINALITY,
            ErrorCode::IdempotencyKeyReused => IDEMPOTENCY_KEY_REUSED,
            ErrorCode::ConversationPaused => CONVERSATION_PAUSED,
            ErrorCode::ModeNotSupported => MODE_NOT_SUPPORTED,
            ErrorCode::ClaimNotFound => CLAIM_NOT_FOUND,
            ErrorCode::RateLimited => RATE_LIMITED,
            ErrorCode::PayloadTooLarge => PAYLOAD_TOO_LARGE,
            ErrorCode::SubconversationLimit => SUBCONVERSATION_LIMIT,
            ErrorCode::QuotaExceeded => QUOTA_EXCEEDED,
            ErrorCode::TenantQuotaExceeded => TENANT_QUOTA_EXCEEDED,
        }
    }

    /// The code for a number, if it is one of the table's.
    pub fn from_code(code: i32) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.code() == code)
    }

    /// The table's name for the code, such as `NotYourTurn`.
    pub fn name(self) -> &'static str {
        match self {
            ErrorCode::ParseError => "ParseError",
            ErrorCode::InvalidRequest => "InvalidRequest",
            ErrorCode::MethodNotFound => "MethodNotFound",
            ErrorCode::InvalidParams => "InvalidParams",
            ErrorCode::Internal => "Internal",
            ErrorCode::BatchNotSupported => "BatchNotSupported",
            ErrorCode::TooManySubscriptions => "TooManySubscriptions",
            ErrorCode::FrameTooLarge => "FrameTooLarge",
            ErrorCode::ResponseTooLarge => "ResponseTooLarge",
            ErrorCode::Unauthenticated => "Unauthenticated",
            ErrorCode::Forbidden => "Forbidden",
            ErrorCode::ConversationNotFound => "ConversationNotFound",
            ErrorCode::ConversationExists => "ConversationExists",
            ErrorCode::ConversationClosed => "ConversationClosed",
            ErrorCode::TurnClosed => "TurnClosed",
            ErrorCode::NotYourTurn => "NotYourTurn",
            ErrorCode::TurnMismatch => "TurnMismatch",
            ErrorCode::InvalidFinality => "InvalidFinality",
            ErrorCode::IdempotencyKeyReused => "IdempotencyKeyReused",
            ErrorCode::ConversationPaused => "ConversationPaused",
            ErrorCode::ModeNotSupported => "ModeNotSupported",
            ErrorCode::ClaimNotFound => "ClaimNotFound",
            ErrorCode::RateLimited => "RateLimited",
            ErrorCode::PayloadTooLarge => "PayloadTooLarge",
            ErrorCode::SubconversationLimit => "SubconversationLimit",
            ErrorCode::QuotaExceeded => "QuotaExceeded",
            ErrorCode::TenantQuotaExceeded => "TenantQuotaExceeded",
        }
    }

    /// The HTTP status that goes with the code on the HTTP routes.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::ParseError
            | ErrorCode::InvalidRequest
            | ErrorCode::InvalidParams
            | ErrorCode::BatchNotSupported => 400,
            ErrorCode::TooManySubscriptions => 429,
            ErrorCode::ResponseTooLarge => 413,
            ErrorCode::InvalidFinality => 400,
            ErrorCode::MethodNotFound => 404,
            ErrorCode::Internal => 500,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden => 403,
            ErrorCode::ConversationNotFound | ErrorCode::ClaimNotFound => 404,
            ErrorCode::ConversationExists
            | ErrorCode::ConversationClosed
            | ErrorCode::TurnClosed
            | ErrorCode::NotYourTurn
            | ErrorCode::TurnMismatch
            | ErrorCode::IdempotencyKeyReused
            | ErrorCode::ConversationPaused => 409,
            ErrorCode::RateLimited => 429,
            ErrorCode::SubconversationLimit => 409,
            ErrorCode::QuotaExceeded | ErrorCode::TenantQuotaExceeded => 429,
            ErrorCode::ModeNotSupported => 422,
            ErrorCode::PayloadTooLarge | ErrorCode::FrameTooLarge => 413,
        }
    }
}

/// A protocol error: a code from the table, a message for people, and details for programs.
#[derive(Debug, Clone, PartialEq)]
pub struct RpcError {
    /// Which error.
    pub code: ErrorCode,
    /// What went wrong, and where it helps, what to do.
    pub message: String,
    /// Details such as `{"currentTurn": 4, "latestSeq": 12}`.
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with a message and no data.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Adds details for programs.
    pub fn with_data(mut self, data: Value) -> Self {
        self.data = Some(data);
        self
    }

    /// The one mapping to the wire: the JSON-RPC error object.
    pub fn to_wire(&self) -> ErrorObject {
        let mut data = match &self.data {
            Some(Value::Object(map)) => map.clone(),
            Some(Value::Null) | None => serde_json::Map::new(),
            Some(other) => {
                let mut m = serde_json::Map::new();
                m.insert("detail".into(), other.clone());
                m
            }
        };
        data.insert("error".into(), Value::String(self.code.name().into()));
        ErrorObject {
            code: self.code.code(),
            message: self.message.clone(),
            data: Some(Value::Object(data)),
        }
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.code.name(),
            self.code.code(),
            self.message
        )
    }
}

impl std::error::Error for RpcError {}

/// The JSON-RPC error object as it travels: `{code, message, data}`.
/// `data.error` always names the code (such as `"NotYourTurn"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ErrorObject {
    /// The numeric code.
    pub code: i32,
    /// A message for people.
    pub message: String,
    /// Details for programs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl ErrorObject {
    /// Reads a wire error back into an [`RpcError`]; an unknown code becomes `Internal`.
    pub fn into_rpc_error(self) -> RpcError {
        RpcError {
            code: ErrorCode::from_code(self.code).unwrap_or(ErrorCode::Internal),
            message: self.message,
            data: self.data,
        }
    }
}
