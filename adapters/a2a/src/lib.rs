//! The A2A adapter (`orchestrator-a2a`). A separate process that lets an A2A peer (any client of
//! the A2A protocol 1.0, JSON-RPC binding, as the official `a2a-sdk` speaks it) take part in
//! conversations run from the orchestrator's named scenarios.
//!
//! - One Agent Card per exposed scenario, at `/{scenario}/.well-known/agent-card.json` (the
//!   first scenario's also at `/.well-known/agent-card.json`); its JSON-RPC endpoint is
//!   `/{scenario}/` (the first's also `/`).
//! - An A2A `contextId` is a conversation: a message without one starts a new conversation from
//!   the scenario; the peer speaks in it as the adapter's agent, which must be an external
//!   participant of the scenario (and an admin, to create conversations).
//! - A task is one exchange (see [`tasks`]): `input-required` when the turn comes back to the
//!   peer, `completed` when the conversation closes, `canceled` on `CancelTask`. Its state is
//!   read back from the log each time, so the adapter holds nothing a restart could lose.
//! - A peer's retried message (same `messageId`) is recognised through the clientRequestId
//!   `a2a:{messageId}`: nothing is appended twice and the same task comes back.
//!
//! ```sh
//! ORCHESTRATOR_TOKEN=oct_… orchestrator-a2a --scenario support --listen 127.0.0.1:7400
//! ```

mod exchange;
mod tasks;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, ClientError, WsJsonRpcClient};
use anyhow::Context;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::exchange::{
    cancel_task, get_task, list_tasks, send_message, start_exchange, stream, task_of,
};
use crate::tasks::{ReadError, State as TaskState, TaskId, TaskView, CANCEL_TRACE, KEY_PREFIX};

/// How long a blocking `SendMessage` waits for the exchange to settle before it answers with
/// the task still `working` (the peer can then poll with `GetTask` or `SubscribeToTask`).
const BLOCKING_WAIT: Duration = Duration::from_secs(60);
/// One wait on the orchestrator while streaming.
const POLL_MS: u64 = 20_000;

/// The adapter: its connection to the orchestrator, who it speaks as, where peers reach it
/// and the scenarios it exposes.
#[derive(Debug)]
pub struct App {
    client: Arc<WsJsonRpcClient>,
    me: String,
    public_url: String,
    scenarios: Vec<String>,
    /// How long a blocking `SendMessage` waits ([`BLOCKING_WAIT`] unless told).
    blocking_wait: Duration,
}

type Shared = Arc<App>;

/// An A2A JSON-RPC error.
struct A2aError {
    code: i32,
    message: String,
    reason: &'static str,
}

impl A2aError {
    fn new(code: i32, reason: &'static str, message: impl Into<String>) -> A2aError {
        A2aError {
            code,
            message: message.into(),
            reason,
        }
    }

    fn task_not_found(id: &str) -> A2aError {
        A2aError::new(-32001, "TASK_NOT_FOUND", format!("no task {id}"))
    }

    fn invalid_params(message: impl Into<String>) -> A2aError {
        A2aError::new(-32602, "INVALID_PARAMS", message)
    }

    fn wire(&self, id: &Value) -> Value {
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

    /// A refusal of the orchestrator, in A2A terms.
    fn upstream(e: ClientError) -> A2aError {
        match &e {
            ClientError::Rpc(rpc) => match rpc.code {
                ErrorCode::ConversationNotFound | ErrorCode::Forbidden => {
                    A2aError::invalid_params(format!("unknown contextId: {}", rpc.message))
                }
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
            },
            other => A2aError::new(
                -32603,
                "UPSTREAM_UNAVAILABLE",
                format!("the orchestrator cannot be reached: {other}"),
            ),
        }
    }

    fn from_read(e: ReadError, id: &str) -> A2aError {
        match e {
            ReadError::NotFound => A2aError::task_not_found(id),
            ReadError::Upstream(e) => A2aError::upstream(e),
        }
    }
}

/// Refuses to start unless the token can do the adapter's work: it is an admin's (a new A2A
/// context creates a conversation), and each exposed scenario exists on the orchestrator and
/// has the token's agent as an external participant (the peer speaks as it).
async fn check_setup(
    client: &WsJsonRpcClient,
    me: &str,
    url: &str,
    scenarios: &[String],
) -> anyhow::Result<()> {
    let mint = "mint one with `orchestrator token create --agent ID --admin`, ID an external participant of each scenario";
    let library = match client.list_scenarios().await {
        Ok(l) => l,
        Err(ClientError::Rpc(e)) if e.code == ErrorCode::Forbidden => anyhow::bail!(
            "the token speaks as {me}, which is not an admin: the adapter creates a conversation for each new A2A context; {mint}"
        ),
        Err(e) => return Err(e).with_context(|| format!("reading the scenario library of {url}")),
    };
    let names: Vec<&str> = library.scenarios.iter().map(|s| s.name.as_str()).collect();
    for name in scenarios {
        let Some(found) = library.scenarios.iter().find(|s| &s.name == name) else {
            anyhow::bail!(
                "the orchestrator at {url} has no scenario named {name:?} (it has: {}); start it with `serve --scenarios DIR`, DIR holding the scenario",
                if names.is_empty() { "none".to_string() } else { names.join(", ") }
            );
        };
        let external: Vec<&str> = found
            .participants
            .iter()
            .filter(|p| p.kind.is_none())
            .map(|p| p.id.as_str())
            .collect();
        match found.participants.iter().find(|p| p.id == me) {
            Some(p) if p.kind.is_none() => {}
            Some(p) => anyhow::bail!(
                "{me} is a participant the server runs in scenario {name:?} (kind {}), not an external one the peer can speak as; use a token of one of its external participants ({}): {mint}",
                p.kind.as_deref().unwrap_or(""),
                external.join(", ")
            ),
            None => anyhow::bail!(
                "the token speaks as {me}, who does not take part in scenario {name:?} (its external participants: {}); {mint}",
                if external.is_empty() { "none".to_string() } else { external.join(", ") }
            ),
        }
    }
    Ok(())
}

fn agent_card(app: &App, scenario: &str) -> Value {
    json!({
        "name": scenario,
        "description": format!(
            "The orchestrated conversation scenario \"{scenario}\". Each new contextId is a new conversation; \
             a task ends input-required when the turn comes back to you, completed when the conversation closes."
        ),
        "supportedInterfaces": [{
            "url": format!("{}/{scenario}/", app.public_url),
            "protocolBinding": "JSONRPC",
            "protocolVersion": "1.0",
        }],
        "version": env!("CARGO_PKG_VERSION"),
        "capabilities": {"streaming": true},
        "defaultInputModes": ["text/plain"],
        "defaultOutputModes": ["text/plain"],
        "skills": [{
            "id": scenario,
            "name": scenario,
            "description": format!("Take part in the \"{scenario}\" conversation."),
            "tags": ["conversation", "orchestrator"],
        }],
    })
}

async fn root_card(State(app): State<Shared>) -> Response {
    let first = app.scenarios[0].clone();
    Json(agent_card(&app, &first)).into_response()
}

async fn card(State(app): State<Shared>, Path(scenario): Path<String>) -> Response {
    if !app.scenarios.contains(&scenario) {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!("no scenario {scenario} here; try {}", app.scenarios.join(", "))})),
        )
            .into_response();
    }
    Json(agent_card(&app, &scenario)).into_response()
}

async fn root_rpc(State(app): State<Shared>, headers: HeaderMap, body: Bytes) -> Response {
    let first = app.scenarios[0].clone();
    dispatch(app, first, &headers, body).await
}

async fn rpc(
    State(app): State<Shared>,
    Path(scenario): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if !app.scenarios.contains(&scenario) {
        let e = A2aError::new(-32601, "NOT_FOUND", format!("no scenario {scenario} here"));
        return (StatusCode::NOT_FOUND, Json(e.wire(&Value::Null))).into_response();
    }
    dispatch(app, scenario, &headers, body).await
}

/// The A2A version a request asks for: its `A2A-Version` header, or 0.3 without one (as the
/// specification says); this adapter speaks 1.0 (and its patch versions).
fn version_refused(headers: &HeaderMap) -> Option<A2aError> {
    let asked = headers
        .get("a2a-version")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .unwrap_or("0.3");
    let supported = asked == "1.0" || asked.starts_with("1.0.");
    (!supported).then(|| {
        A2aError::new(
            -32009,
            "VERSION_NOT_SUPPORTED",
            format!(
                "A2A version {asked:?} is not supported here; send the header A2A-Version: 1.0"
            ),
        )
    })
}

/// The push-notification methods: this adapter sends none.
const PUSH_METHODS: [&str; 4] = [
    "CreateTaskPushNotificationConfig",
    "GetTaskPushNotificationConfig",
    "ListTaskPushNotificationConfigs",
    "DeleteTaskPushNotificationConfig",
];

fn reply(id: &Value, result: Result<Value, A2aError>) -> Response {
    let body = match result {
        Ok(r) => json!({"jsonrpc": "2.0", "id": id, "result": r}),
        Err(e) => e.wire(id),
    };
    Json(body).into_response()
}

async fn dispatch(app: Shared, scenario: String, headers: &HeaderMap, body: Bytes) -> Response {
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            let err = A2aError::new(-32700, "PARSE_ERROR", format!("invalid JSON: {e}"));
            return reply(&Value::Null, Err(err));
        }
    };
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    let id_ok = id.is_string() || id.is_null() || id.is_i64() || id.is_u64();
    if !id_ok {
        let err = A2aError::new(
            -32600,
            "INVALID_REQUEST",
            "id must be a string, an integer or null",
        );
        return reply(&Value::Null, Err(err));
    }
    if req.get("jsonrpc") != Some(&json!("2.0")) || !req["method"].is_string() {
        let err = A2aError::new(-32600, "INVALID_REQUEST", "not a JSON-RPC 2.0 request");
        return reply(&id, Err(err));
    }
    if let Some(err) = version_refused(headers) {
        return reply(&id, Err(err));
    }
    let params = req.get("params").cloned().unwrap_or(json!({}));
    match req["method"].as_str().unwrap_or_default() {
        "SendMessage" => reply(&id, send_message(&app, &scenario, &params).await),
        "SendStreamingMessage" => match start_exchange(&app, &scenario, &params).await {
            Ok((view, posted)) => stream(app, id, view, Some(posted)),
            Err(e) => reply(&id, Err(e)),
        },
        "GetTask" => reply(&id, get_task(&app, &params).await),
        "ListTasks" => reply(&id, list_tasks(&app, &params).await),
        "CancelTask" => reply(&id, cancel_task(&app, &params).await),
        "SubscribeToTask" => match task_of(&app, &params).await {
            Ok(view) if view.state.terminal() => reply(
                &id,
                Err(A2aError::new(
                    -32004,
                    "UNSUPPORTED_OPERATION",
                    format!(
                        "task {} is {}; read it with GetTask",
                        view.id.wire(),
                        view.state.wire()
                    ),
                )),
            ),
            Ok(view) => stream(app, id, view, None),
            Err(e) => reply(&id, Err(e)),
        },
        push if PUSH_METHODS.contains(&push) => reply(
            &id,
            Err(A2aError::new(
                -32003,
                "PUSH_NOTIFICATION_NOT_SUPPORTED",
                "push notifications are not supported by this agent: stream, or poll with GetTask",
            )),
        ),
        other => reply(
            &id,
            Err(A2aError::new(
                -32601,
                "METHOD_NOT_FOUND",
                format!("method {other} is not served here"),
            )),
        ),
    }
}

impl App {
    /// The adapter over `client` (authenticated on the orchestrator at `url`), after checking
    /// that its token can do the adapter's work for `scenarios`; its Agent Cards name
    /// `public_url`.
    pub async fn start(
        client: WsJsonRpcClient,
        url: &str,
        scenarios: Vec<String>,
        public_url: String,
    ) -> anyhow::Result<App> {
        let me = client.agent_id().to_string();
        check_setup(&client, &me, url, &scenarios).await?;
        Ok(App {
            client: Arc::new(client),
            me,
            public_url: public_url.trim_end_matches('/').to_string(),
            scenarios,
            blocking_wait: BLOCKING_WAIT,
        })
    }

    /// How long a blocking `SendMessage` waits for the exchange to settle.
    pub fn with_blocking_wait(mut self, wait: Duration) -> App {
        self.blocking_wait = wait;
        self
    }

    /// Where peers reach it.
    pub fn public_url(&self) -> &str {
        &self.public_url
    }

    /// The scenarios it exposes.
    pub fn scenarios(&self) -> &[String] {
        &self.scenarios
    }
}

/// The adapter's routes: the Agent Cards and the JSON-RPC endpoints.
pub fn router(app: Arc<App>) -> Router {
    let cards = Router::new()
        .route("/.well-known/agent-card.json", get(root_card))
        .route("/{scenario}/.well-known/agent-card.json", get(card));
    // Each scenario's endpoint with and without the trailing slash; the first's also at `/`.
    ["/{scenario}", "/{scenario}/"]
        .into_iter()
        .fold(cards.route("/", post(root_rpc)), |r, path| {
            r.route(path, post(rpc))
        })
        .with_state(app)
}
