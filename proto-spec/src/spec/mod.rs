//! The machine-readable protocol: an OpenRPC document and JSON Schemas, generated from the types.
//!
//! The committed copies live in `proto-spec/openrpc.json` and `proto-spec/schemas/`; the test
//! `spec_drift` fails when they no longer match the types (run it with `UPDATE_SPEC=1` to rewrite
//! them).

use std::collections::BTreeMap;

use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};

use crate::error::{ErrorCode, ErrorObject};
use crate::event::{Attachment, Event, EventKind, Finality, MessagePayload};
use crate::guidance::{ConversationStatus, Guidance, GuidanceStatus, Snapshot};
use crate::http::{EventsQuery, HttpError, PostMessageBody, WaitQuery, WaitResult, WhoAmI};
use crate::method::*;
use crate::tokens::*;

mod openapi;
pub use openapi::{openapi, Answer, RouteSpec, ROUTES};

/// One method of the protocol as the OpenRPC document describes it.
#[derive(Debug, Clone, Copy)]
pub struct MethodSpec {
    /// The wire name.
    pub name: &'static str,
    /// One line on what it does.
    pub summary: &'static str,
    /// Whether it needs an authenticated connection.
    pub needs_auth: bool,
    /// The errors it can return besides the standard ones.
    pub errors: &'static [ErrorCode],
    params: fn(&mut SchemaGenerator) -> Schema,
    result: fn(&mut SchemaGenerator) -> Schema,
    /// For subscriptions, the notification name.
    pub notification: Option<&'static str>,
}

fn s<T: JsonSchema>(g: &mut SchemaGenerator) -> Schema {
    g.subschema_for::<T>()
}

fn subscription_id(_: &mut SchemaGenerator) -> Schema {
    schemars::json_schema!({"description": "The subscription id.", "type": ["string", "integer"]})
}

use ErrorCode as E;
const READ_ERRORS: &[ErrorCode] = &[E::Unauthenticated, E::Forbidden, E::ConversationNotFound];
const APPEND_ERRORS: &[ErrorCode] = &[
    E::Unauthenticated,
    E::Forbidden,
    E::ConversationNotFound,
    E::ConversationClosed,
    E::TurnClosed,
    E::NotYourTurn,
    E::TurnMismatch,
    E::InvalidFinality,
    E::IdempotencyKeyReused,
    E::ConversationPaused,
    E::PayloadTooLarge,
    E::RateLimited,
];
/// A message's errors: an append's, a mode asked of an agent that does not declare it, and a
/// document whose shape is wrong.
const MESSAGE_ERRORS: &[ErrorCode] =
    &concat::<14>(APPEND_ERRORS, &[E::ModeNotSupported, E::InvalidParams]);

/// `a` then `b`, as a constant array of `N` (= both lengths) codes.
const fn concat<const N: usize>(a: &[ErrorCode], b: &[ErrorCode]) -> [ErrorCode; N] {
    assert!(a.len() + b.len() == N, "N is the sum of the lengths");
    let mut out = [E::Internal; N];
    let mut i = 0;
    while i < N {
        out[i] = if i < a.len() { a[i] } else { b[i - a.len()] };
        i += 1;
    }
    out
}

/// The errors of pausing and resuming (admins only, not on a closed conversation).
const PAUSE_ERRORS: &[ErrorCode] = &[
    E::Unauthenticated,
    E::Forbidden,
    E::ConversationNotFound,
    E::ConversationClosed,
];

/// The errors of deleting (its tenant's admins or its creator; a sub-conversation goes with
/// the open conversation above it).
const DELETE_ERRORS: &[ErrorCode] = &[
    E::Unauthenticated,
    E::Forbidden,
    E::ConversationNotFound,
    E::InvalidParams,
];

/// Every method of the protocol.
pub const METHODS: &[MethodSpec] = &[
    MethodSpec {
        name: names::AUTHENTICATE,
        summary: "Authenticate the connection; every other method needs it first.",
        needs_auth: false,
        errors: &[E::Unauthenticated],
        params: s::<AuthenticateParams>,
        result: s::<AuthenticateResult>,
        notification: None,
    },
    MethodSpec {
        name: names::CREATE_CONVERSATION,
        summary: "Create a conversation with its participants (admins), or a sub-conversation of one the caller takes part in (any agent).",
        needs_auth: true,
        errors: &[
            E::Unauthenticated,
            E::Forbidden,
            E::ConversationExists,
            E::InvalidParams,
            E::ConversationNotFound,
            E::ConversationClosed,
            E::SubconversationLimit,
        ],
        params: s::<CreateConversationParams>,
        result: s::<CreateConversationResult>,
        notification: None,
    },
    MethodSpec {
        name: names::GET_CONVERSATION,
        summary: "A snapshot of a conversation, with guidance for the caller.",
        needs_auth: true,
        errors: READ_ERRORS,
        params: s::<ConversationParams>,
        result: s::<Snapshot>,
        notification: None,
    },
    MethodSpec {
        name: names::LIST_CONVERSATIONS,
        summary:
            "A snapshot of every conversation the caller takes part in (every one, for an admin).",
        needs_auth: true,
        errors: &[E::Unauthenticated],
        params: s::<ListConversationsParams>,
        result: s::<ListConversationsResult>,
        notification: None,
    },
    MethodSpec {
        name: names::LIST_SCENARIOS,
        summary: "The server's scenario library (admins): each scenario's name, description and participants, with the kind of those the server runs.",
        needs_auth: true,
        errors: &[E::Unauthenticated, E::Forbidden],
        params: s::<ListScenariosParams>,
        result: s::<ListScenariosResult>,
        notification: None,
    },
    MethodSpec {
        name: names::CREATE_TOKEN,
        summary: "Mint a token of the caller's tenant, shown this once (its admins).",
        needs_auth: true,
        errors: &[E::Unauthenticated, E::Forbidden, E::InvalidParams],
        params: s::<CreateTokenParams>,
        result: s::<CreateTokenResult>,
        notification: None,
    },
    MethodSpec {
        name: names::LIST_TOKENS,
        summary: "The caller's tenant's tokens, never the tokens themselves (its admins).",
        needs_auth: true,
        errors: &[E::Unauthenticated, E::Forbidden],
        params: s::<ListTokensParams>,
        result: s::<ListTokensResult>,
        notification: None,
    },
    MethodSpec {
        name: names::REVOKE_TOKEN,
        summary: "Revoke a token of the caller's tenant by its id, or every token of an agent of it (its admins); their connections close.",
        needs_auth: true,
        errors: &[E::Unauthenticated, E::Forbidden, E::InvalidParams],
        params: s::<RevokeTokenParams>,
        result: s::<RevokeTokenResult>,
        notification: None,
    },
    MethodSpec {
        name: names::CREATE_TENANT,
        summary: "Make a tenant (operators).",
        needs_auth: true,
        errors: &[E::Unauthenticated, E::Forbidden, E::InvalidParams],
        params: s::<CreateTenantParams>,
        result: s::<TenantSummary>,
        notification: None,
    },
    MethodSpec {
        name: names::LIST_TENANTS,
        summary: "Every tenant, with how many tokens it has and its quotas (operators).",
        needs_auth: true,
        errors: &[E::Unauthenticated, E::Forbidden],
        params: s::<ListTenantsParams>,
        result: s::<ListTenantsResult>,
        notification: None,
    },
    MethodSpec {
        name: names::SET_TENANT_QUOTAS,
        summary: "Set a tenant's quotas, in force across the cluster within a second (operators).",
        needs_auth: true,
        errors: &[E::Unauthenticated, E::Forbidden, E::InvalidParams],
        params: s::<SetTenantQuotasParams>,
        result: s::<TenantSummary>,
        notification: None,
    },
    MethodSpec {
        name: names::TAIL,
        summary: "Events with seq greater than sinceSeq, in order.",
        needs_auth: true,
        errors: READ_ERRORS,
        params: s::<TailParams>,
        result: s::<TailResult>,
        notification: None,
    },
    MethodSpec {
        name: names::WAIT_FOR_CHANGE,
        summary: "Wait until the latest seq passes sinceSeq, or the (capped) timeout.",
        needs_auth: true,
        errors: READ_ERRORS,
        params: s::<WaitForChangeParams>,
        result: s::<WaitForChangeResult>,
        notification: None,
    },
    MethodSpec {
        name: names::GET_UPDATES_OR_GUIDANCE,
        summary: "New messages and guidance; waits for a change first when there are none.",
        needs_auth: true,
        errors: READ_ERRORS,
        params: s::<GetUpdatesParams>,
        result: s::<GetUpdatesResult>,
        notification: None,
    },
    MethodSpec {
        name: names::SEND_MESSAGE,
        summary: "Append a message; acknowledged once durable.",
        needs_auth: true,
        errors: MESSAGE_ERRORS,
        params: s::<SendMessageParams>,
        result: s::<AppendResult>,
        notification: None,
    },
    MethodSpec {
        name: names::SEND_TRACE,
        summary: "Append a trace to the current (or named, open) turn; acknowledged once durable.",
        needs_auth: true,
        errors: APPEND_ERRORS,
        params: s::<SendTraceParams>,
        result: s::<AppendResult>,
        notification: None,
    },
    MethodSpec {
        name: names::SUBSCRIBE,
        summary: "Replay events after sinceSeq, then live ones, as `event` notifications.",
        needs_auth: true,
        errors: READ_ERRORS,
        params: s::<SubscribeParams>,
        result: subscription_id,
        notification: Some(names::EVENT),
    },
    MethodSpec {
        name: names::REGISTER_EXECUTOR,
        summary: "Receive turns to claim as `request_turn` notifications.",
        needs_auth: true,
        errors: &[E::Unauthenticated],
        params: s::<RegisterExecutorParams>,
        result: subscription_id,
        notification: Some(names::REQUEST_TURN),
    },
    MethodSpec {
        name: names::CLAIM_TURN,
        summary: "Claim a turn offered by `request_turn`.",
        needs_auth: true,
        errors: &[E::Unauthenticated, E::ClaimNotFound],
        params: s::<ClaimTurnParams>,
        result: s::<ClaimTurnResult>,
        notification: None,
    },
    MethodSpec {
        name: names::PAUSE_CONVERSATION,
        summary: "Pause a conversation: messages are refused until it resumes (admins only).",
        needs_auth: true,
        errors: PAUSE_ERRORS,
        params: s::<ConversationParams>,
        result: s::<SeqResult>,
        notification: None,
    },
    MethodSpec {
        name: names::RESUME_CONVERSATION,
        summary: "Resume a paused conversation (admins only).",
        needs_auth: true,
        errors: PAUSE_ERRORS,
        params: s::<ConversationParams>,
        result: s::<SeqResult>,
        notification: None,
    },
    MethodSpec {
        name: names::DELETE_CONVERSATION,
        summary: "Delete a conversation with its sub-conversations: every read answers ConversationNotFound after, its subscribers and waits are told, and its id may be used again (its tenant's admins, or its creator).",
        needs_auth: true,
        errors: DELETE_ERRORS,
        params: s::<ConversationParams>,
        result: s::<DeleteConversationResult>,
        notification: None,
    },
    MethodSpec {
        name: names::FORK_CONVERSATION,
        summary: "A new conversation that starts from a prefix of this one, which stays untouched.",
        needs_auth: true,
        errors: &[
            E::Unauthenticated,
            E::Forbidden,
            E::ConversationNotFound,
            E::ConversationExists,
        ],
        params: s::<ForkConversationParams>,
        result: s::<CreateConversationResult>,
        notification: None,
    },
];

fn generator(definitions_path: &str) -> SchemaGenerator {
    let mut settings = SchemaSettings::draft2020_12();
    settings.definitions_path = definitions_path.to_string().into();
    settings.into_generator()
}

fn error_entry(code: ErrorCode) -> Value {
    json!({"code": code.code(), "message": code.name()})
}

/// The OpenRPC document of the WebSocket protocol, generated from the types.
pub fn openrpc() -> Value {
    let mut g = generator("/components/schemas");
    let mut methods = Vec::new();
    for m in METHODS {
        let params_ref = (m.params)(&mut g);
        let result = (m.result)(&mut g);
        let def_name = params_ref
            .get("$ref")
            .and_then(Value::as_str)
            .and_then(|r| r.rsplit('/').next())
            .map(str::to_string);
        let params_def = def_name
            .and_then(|n| g.definitions().get(&n).cloned())
            .unwrap_or_else(|| params_ref.clone().to_value());
        let required: Vec<&str> = params_def
            .get("required")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let params: Vec<Value> = params_def
            .get("properties")
            .and_then(Value::as_object)
            .map(|props| {
                props
                    .iter()
                    .map(|(name, schema)| {
                        json!({
                            "name": name,
                            "required": required.contains(&name.as_str()),
                            "schema": schema,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut errors: Vec<Value> = m.errors.iter().copied().map(error_entry).collect();
        errors.push(error_entry(ErrorCode::InvalidParams));
        let mut entry = json!({
            "name": m.name,
            "summary": m.summary,
            "paramStructure": "by-name",
            "params": params,
            "result": {"name": "result", "schema": result},
            "errors": errors,
        });
        if let Some(n) = m.notification {
            entry["x-notification"] = json!(n);
        }
        if !m.needs_auth {
            entry["x-authentication"] = json!("none");
        }
        methods.push(entry);
    }
    let event_schema = g.subschema_for::<EventNotification>();
    let request_turn = g.subschema_for::<RequestTurnNotification>();
    let error_schema = g.subschema_for::<ErrorObject>();
    let mut schemas: BTreeMap<String, Value> = BTreeMap::new();
    for (k, v) in g.take_definitions(true) {
        schemas.insert(k, v);
    }
    json!({
        "openrpc": "1.3.2",
        "info": {
            "title": "Conversation orchestrator protocol",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "JSON-RPC 2.0 over WebSocket at /rpc. See PROTOCOL.md for the normative text.",
        },
        "servers": [{"name": "default", "url": "ws://127.0.0.1:7300/rpc"}],
        "methods": methods,
        "components": {"schemas": schemas},
        "x-notifications": [
            {"name": names::EVENT, "description": "params: {subscription, result}", "result": event_schema},
            {"name": names::REQUEST_TURN, "description": "params: {subscription, result}", "result": request_turn},
        ],
        "x-errors": ErrorCode::ALL.iter().map(|c| json!({
            "code": c.code(), "name": c.name(), "httpStatus": c.http_status(),
        })).collect::<Vec<_>>(),
        "x-error-object": error_schema,
    })
}

fn root<T: JsonSchema>() -> Value {
    generator("/$defs").into_root_schema_for::<T>().to_value()
}

/// One JSON Schema per wire type, by type name.
pub fn json_schemas() -> BTreeMap<&'static str, Value> {
    let mut m: BTreeMap<&'static str, Value> = BTreeMap::new();
    m.insert("Event", root::<Event>());
    m.insert("EventKind", root::<EventKind>());
    m.insert("Finality", root::<Finality>());
    m.insert("MessagePayload", root::<MessagePayload>());
    m.insert("Attachment", root::<Attachment>());
    m.insert("Guidance", root::<Guidance>());
    m.insert("GuidanceStatus", root::<GuidanceStatus>());
    m.insert("ConversationStatus", root::<ConversationStatus>());
    m.insert("Snapshot", root::<Snapshot>());
    m.insert("ErrorObject", root::<ErrorObject>());
    m.insert("AuthenticateParams", root::<AuthenticateParams>());
    m.insert("AuthenticateResult", root::<AuthenticateResult>());
    m.insert(
        "CreateConversationParams",
        root::<CreateConversationParams>(),
    );
    m.insert(
        "CreateConversationResult",
        root::<CreateConversationResult>(),
    );
    m.insert("ConversationParams", root::<ConversationParams>());
    m.insert("ListConversationsParams", root::<ListConversationsParams>());
    m.insert("ListStatus", root::<ListStatus>());
    m.insert("ListConversationsResult", root::<ListConversationsResult>());
    m.insert("ListScenariosParams", root::<ListScenariosParams>());
    m.insert("ListScenariosResult", root::<ListScenariosResult>());
    m.insert("CreateTokenParams", root::<CreateTokenParams>());
    m.insert("CreateTokenResult", root::<CreateTokenResult>());
    m.insert("TokenSummary", root::<TokenSummary>());
    m.insert("ListTokensParams", root::<ListTokensParams>());
    m.insert("ListTokensResult", root::<ListTokensResult>());
    m.insert("RevokeTokenParams", root::<RevokeTokenParams>());
    m.insert("RevokeTokenResult", root::<RevokeTokenResult>());
    m.insert("CreateTenantParams", root::<CreateTenantParams>());
    m.insert("TenantSummary", root::<TenantSummary>());
    m.insert("ListTenantsParams", root::<ListTenantsParams>());
    m.insert("ListTenantsResult", root::<ListTenantsResult>());
    m.insert("TenantQuotas", root::<TenantQuotas>());
    m.insert("SetTenantQuotasParams", root::<SetTenantQuotasParams>());
    m.insert("TailParams", root::<TailParams>());
    m.insert("TailResult", root::<TailResult>());
    m.insert("WaitForChangeParams", root::<WaitForChangeParams>());
    m.insert("WaitForChangeResult", root::<WaitForChangeResult>());
    m.insert("GetUpdatesParams", root::<GetUpdatesParams>());
    m.insert("GetUpdatesResult", root::<GetUpdatesResult>());
    m.insert("SendMessageParams", root::<SendMessageParams>());
    m.insert("SendTraceParams", root::<SendTraceParams>());
    m.insert("TurnHint", root::<TurnHint>());
    m.insert("AppendResult", root::<AppendResult>());
    m.insert("SubscribeParams", root::<SubscribeParams>());
    m.insert("EventNotification", root::<EventNotification>());
    m.insert("RegisterExecutorParams", root::<RegisterExecutorParams>());
    m.insert("RequestTurnNotification", root::<RequestTurnNotification>());
    m.insert("ClaimTurnParams", root::<ClaimTurnParams>());
    m.insert("ClaimTurnResult", root::<ClaimTurnResult>());
    m.insert("SeqResult", root::<SeqResult>());
    m.insert(
        "DeleteConversationResult",
        root::<DeleteConversationResult>(),
    );
    m.insert("ForkConversationParams", root::<ForkConversationParams>());
    m.insert("PostMessageBody", root::<PostMessageBody>());
    m.insert("EventsQuery", root::<EventsQuery>());
    m.insert("WaitQuery", root::<WaitQuery>());
    m.insert("WaitResult", root::<WaitResult>());
    m.insert("WhoAmI", root::<WhoAmI>());
    m.insert("HttpError", root::<HttpError>());
    m.insert("SystemEvent", root::<crate::system::SystemEvent>());
    m.insert("StopData", root::<crate::system::StopData>());
    m.insert("ExecutorTrace", root::<crate::system::ExecutorTrace>());
    m.insert("DocumentData", root::<crate::DocumentData>());
    m.insert("OutputSpec", root::<crate::OutputSpec>());
    m
}

/// Serializes a generated document the way the committed files are written.
pub fn to_pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// The names of the keys of a JSON object, for tests that walk documents.
pub fn keys(v: &Value) -> Vec<String> {
    v.as_object()
        .map(Map::keys)
        .map(|k| k.cloned().collect())
        .unwrap_or_default()
}
