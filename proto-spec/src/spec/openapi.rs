//! The HTTP routes beside `/rpc` as data ([`ROUTES`]), and the OpenAPI 3.1 document made from
//! them and the types (`proto-spec/openapi.json`).

use super::*;

/// What a route answers on success.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    /// A JSON body of this schema.
    Json(fn(&mut SchemaGenerator) -> Schema),
    /// A stream or text of this media type.
    Media(&'static str),
}

/// One HTTP route as the OpenAPI document describes it.
#[derive(Debug, Clone, Copy)]
pub struct RouteSpec {
    /// `get` or `post`.
    pub method: &'static str,
    /// The path, with `{id}` for a conversation id.
    pub path: &'static str,
    /// The operation id.
    pub operation_id: &'static str,
    /// One line on what it does.
    pub summary: &'static str,
    /// Whether it needs `Authorization: Bearer`.
    pub needs_auth: bool,
    /// The JSON body it takes.
    pub body: Option<fn(&mut SchemaGenerator) -> Schema>,
    /// The query it takes (each property is one query parameter).
    pub query: Option<fn(&mut SchemaGenerator) -> Schema>,
    /// Headers it reads, with what they mean.
    pub headers: &'static [(&'static str, &'static str)],
    /// The success status.
    pub status: u16,
    /// The success answer.
    pub answer: Answer,
    /// The protocol errors it can return (each with its HTTP status).
    pub errors: &'static [ErrorCode],
}

const HTTP_READ_ERRORS: &[ErrorCode] = &[
    E::Unauthenticated,
    E::Forbidden,
    E::ConversationNotFound,
    E::InvalidParams,
    E::RateLimited,
];

/// Every HTTP route served beside `/rpc`.
pub const ROUTES: &[RouteSpec] = &[
    RouteSpec {
        method: "get",
        path: "/conversations",
        operation_id: "listConversations",
        summary: "A page of the conversations the caller may read (those it takes part in and those below them; every one of its tenant, for an admin), newest activity first, filtered.",
        needs_auth: true,
        body: None,
        query: Some(s::<ListConversationsParams>),
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<ListConversationsResult>),
        errors: &[E::Unauthenticated, E::Forbidden, E::InvalidParams],
    },
    RouteSpec {
        method: "get",
        path: "/scenarios",
        operation_id: "listScenarios",
        summary: "The server's scenario library (admins only).",
        needs_auth: true,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<ListScenariosResult>),
        errors: &[E::Unauthenticated, E::Forbidden],
    },
    RouteSpec {
        method: "post",
        path: "/tenants",
        operation_id: "createTenant",
        summary: "Make a tenant (operators); the body is createTenant's params.",
        needs_auth: true,
        body: Some(s::<CreateTenantParams>),
        query: None,
        headers: &[],
        status: 201,
        answer: Answer::Json(s::<TenantSummary>),
        errors: &[E::Unauthenticated, E::Forbidden, E::InvalidParams],
    },
    RouteSpec {
        method: "get",
        path: "/tenants",
        operation_id: "listTenants",
        summary: "Every tenant (operators).",
        needs_auth: true,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<ListTenantsResult>),
        errors: &[E::Unauthenticated, E::Forbidden],
    },
    RouteSpec {
        method: "post",
        path: "/tokens",
        operation_id: "createToken",
        summary: "Mint a token of the caller's tenant, shown this once (its admins); the body is createToken's params.",
        needs_auth: true,
        body: Some(s::<CreateTokenParams>),
        query: None,
        headers: &[],
        status: 201,
        answer: Answer::Json(s::<CreateTokenResult>),
        errors: &[E::Unauthenticated, E::Forbidden, E::InvalidParams],
    },
    RouteSpec {
        method: "get",
        path: "/tokens",
        operation_id: "listTokens",
        summary: "The caller's tenant's tokens (its admins).",
        needs_auth: true,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<ListTokensResult>),
        errors: &[E::Unauthenticated, E::Forbidden],
    },
    RouteSpec {
        method: "delete",
        path: "/tokens/{id}",
        operation_id: "revokeToken",
        summary: "Revoke a token of the caller's tenant by its id (its admins).",
        needs_auth: true,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<RevokeTokenResult>),
        errors: &[E::Unauthenticated, E::Forbidden, E::InvalidParams],
    },
    RouteSpec {
        method: "post",
        path: "/conversations",
        operation_id: "createConversation",
        summary: "Create a conversation (admins only); the body is createConversation's params.",
        needs_auth: true,
        body: Some(s::<CreateConversationParams>),
        query: None,
        headers: &[],
        status: 201,
        answer: Answer::Json(s::<CreateConversationResult>),
        errors: &[
            E::Unauthenticated,
            E::Forbidden,
            E::ConversationExists,
            E::ParseError,
            E::InvalidParams,
            E::PayloadTooLarge,
            E::ConversationNotFound,
            E::ConversationClosed,
            E::SubconversationLimit,
        ],
    },
    RouteSpec {
        method: "get",
        path: "/conversations/{id}",
        operation_id: "getConversation",
        summary: "A snapshot of a conversation, with guidance for the caller.",
        needs_auth: true,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<Snapshot>),
        errors: HTTP_READ_ERRORS,
    },
    RouteSpec {
        method: "post",
        path: "/conversations/{id}/messages",
        operation_id: "postMessage",
        summary: "Append a message; answered once durable (201, or 200 for a retried key).",
        needs_auth: true,
        body: Some(s::<PostMessageBody>),
        query: None,
        headers: &[(
            "Idempotency-Key",
            "The clientRequestId: a retry with the same key appends nothing and answers the original result.",
        )],
        status: 201,
        answer: Answer::Json(s::<AppendResult>),
        errors: &[
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
            E::ModeNotSupported,
            E::ParseError,
            E::InvalidParams,
            E::PayloadTooLarge,
        ],
    },
    RouteSpec {
        method: "get",
        path: "/conversations/{id}/events",
        operation_id: "streamEvents",
        summary: "Server-sent events: the log after sinceSeq, then live events; each event's id is its seq.",
        needs_auth: true,
        body: None,
        query: Some(s::<EventsQuery>),
        headers: &[(
            "Last-Event-ID",
            "Resume exactly after this seq (takes precedence over sinceSeq).",
        )],
        status: 200,
        answer: Answer::Media("text/event-stream"),
        errors: HTTP_READ_ERRORS,
    },
    RouteSpec {
        method: "get",
        path: "/conversations/{id}/wait",
        operation_id: "waitForEvents",
        summary: "Long-poll: answers as soon as the log passes sinceSeq, or when the (capped) timeout ends.",
        needs_auth: true,
        body: None,
        query: Some(s::<WaitQuery>),
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<WaitResult>),
        errors: HTTP_READ_ERRORS,
    },
    RouteSpec {
        method: "delete",
        path: "/conversations/{id}",
        operation_id: "deleteConversation",
        summary: "Delete a conversation with its sub-conversations (its tenant's admins, or its creator).",
        needs_auth: true,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<DeleteConversationResult>),
        errors: DELETE_ERRORS,
    },
    RouteSpec {
        method: "post",
        path: "/conversations/{id}/pause",
        operation_id: "pauseConversation",
        summary: "Pause a conversation: messages are refused until it resumes (admins only).",
        needs_auth: true,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<SeqResult>),
        errors: PAUSE_ERRORS,
    },
    RouteSpec {
        method: "post",
        path: "/conversations/{id}/resume",
        operation_id: "resumeConversation",
        summary: "Resume a paused conversation (admins only).",
        needs_auth: true,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<SeqResult>),
        errors: PAUSE_ERRORS,
    },
    RouteSpec {
        method: "get",
        path: "/me",
        operation_id: "whoAmI",
        summary: "Who the bearer token speaks as.",
        needs_auth: true,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Json(s::<WhoAmI>),
        errors: &[E::Unauthenticated],
    },
    RouteSpec {
        method: "get",
        path: "/healthz",
        operation_id: "health",
        summary: "Liveness: `{status, conversations}`.",
        needs_auth: false,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Media("application/json"),
        errors: &[],
    },
    RouteSpec {
        method: "get",
        path: "/metrics",
        operation_id: "metrics",
        summary: "Prometheus text format.",
        needs_auth: false,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Media("text/plain"),
        errors: &[],
    },
    RouteSpec {
        method: "get",
        path: "/",
        operation_id: "console",
        summary: "The live console (an HTML page; it signs in with a token).",
        needs_auth: false,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Media("text/html"),
        errors: &[],
    },
    RouteSpec {
        method: "get",
        path: "/openapi.json",
        operation_id: "openapi",
        summary: "This document.",
        needs_auth: false,
        body: None,
        query: None,
        headers: &[],
        status: 200,
        answer: Answer::Media("application/json"),
        errors: &[],
    },
];

/// The OpenAPI 3.1 document of the HTTP routes, generated from [`ROUTES`] and the types.
pub fn openapi() -> Value {
    let mut g = generator("#/components/schemas");
    let error_ref = g.subschema_for::<HttpError>().to_value();
    let mut paths: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
    for r in ROUTES {
        let mut params = Vec::new();
        if r.path.contains("{id}") {
            params.push(json!({"name": "id", "in": "path", "required": true,
                "description": "The conversation id.", "schema": {"type": "string"}}));
        }
        if let Some(q) = r.query {
            query_params(&mut g, q, &mut params);
        }
        for (name, description) in r.headers {
            params.push(json!({"name": name, "in": "header", "required": false,
                "description": description, "schema": {"type": "string"}}));
        }
        let mut op = json!({
            "operationId": r.operation_id,
            "summary": r.summary,
            "parameters": params,
        });
        if let Some(b) = r.body {
            op["requestBody"] = json!({"required": true, "content": {"application/json": {"schema": b(&mut g).to_value()}}});
        }
        let mut responses = Map::new();
        let ok = match r.answer {
            Answer::Json(f) => {
                json!({"description": "Success.", "content": {"application/json": {"schema": f(&mut g).to_value()}}})
            }
            Answer::Media(m) => json!({"description": "Success.", "content": {m: {}}}),
        };
        responses.insert(r.status.to_string(), ok);
        if r.operation_id == "postMessage" {
            responses.insert("200".into(), json!({"description": "A retried Idempotency-Key: nothing appended; the original result.",
                "content": {"application/json": {"schema": g.subschema_for::<AppendResult>().to_value()}}}));
        }
        let mut by_status: BTreeMap<u16, Vec<&ErrorCode>> = BTreeMap::new();
        for c in r.errors {
            by_status.entry(c.http_status()).or_default().push(c);
        }
        for (status, codes) in by_status {
            let names: Vec<String> = codes
                .iter()
                .map(|c| format!("{} ({})", c.name(), c.code()))
                .collect();
            responses.insert(
                status.to_string(),
                json!({"description": names.join(", "),
                "content": {"application/json": {"schema": error_ref.clone()}}}),
            );
        }
        op["responses"] = Value::Object(responses);
        if r.needs_auth {
            op["security"] = json!([{"bearer": []}]);
        } else {
            op["security"] = json!([]);
        }
        paths
            .entry(r.path)
            .or_default()
            .insert(r.method.to_string(), op);
    }
    let mut schemas: BTreeMap<String, Value> = BTreeMap::new();
    for (k, v) in g.take_definitions(true) {
        schemas.insert(k, v);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Conversation orchestrator HTTP routes",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "The HTTP side of the orchestrator, on the same port as /rpc. Errors carry the protocol's codes (see PROTOCOL.md).",
        },
        "servers": [{"url": "http://127.0.0.1:7300"}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "A token from `orchestrator token create`."}},
        },
    })
}

/// One query parameter per field of the query type `q` makes, each with its description.
fn query_params(
    g: &mut SchemaGenerator,
    q: fn(&mut SchemaGenerator) -> Schema,
    params: &mut Vec<Value>,
) {
    let q_ref = q(g).to_value();
    let name = q_ref["$ref"]
        .as_str()
        .and_then(|r| r.rsplit('/').next())
        .unwrap_or_default()
        .to_string();
    let def = g.definitions().get(&name).cloned().unwrap_or(Value::Null);
    let required: Vec<&str> = def["required"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(props) = def["properties"].as_object() {
        for (pname, schema) in props {
            let mut schema = schema.clone();
            let description = schema
                .as_object_mut()
                .and_then(|o| o.remove("description"))
                .unwrap_or(Value::Null);
            params.push(
                json!({"name": pname, "in": "query", "required": required.contains(&pname.as_str()),
                "description": description, "schema": schema}),
            );
        }
    }
}
