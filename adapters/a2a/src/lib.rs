//! The A2A adapter (`orchestrator-a2a`). A separate process that lets an A2A peer (any client of
//! the A2A protocol 1.0, JSON-RPC binding, as the official `a2a-sdk` speaks it) take part in
//! conversations run from the orchestrator's named scenarios.
//!
//! - One Agent Card per exposed scenario, at `/{scenario}/.well-known/agent-card.json` (the
//!   first scenario's also at `/.well-known/agent-card.json`); its JSON-RPC endpoint is
//!   `/{scenario}/` (the first's also `/`). The card declares one security scheme: HTTP
//!   `Bearer`, an orchestrator token.
//! - Every call is authenticated ([`peers`]): the peer's token opens the adapter's connection to
//!   the orchestrator for that peer, so the peer acts there as its own principal, never as the
//!   adapter. A call without a usable token is answered 401.
//! - An A2A `contextId` is a conversation: a message without one starts a new conversation from
//!   the scenario, created by the peer, who speaks in it as the scenario's `caller` participant
//!   (its agent id takes that participant's place). A peer reaches only the contexts it
//!   started through the adapter, from the scenario it calls; any other id is answered as not
//!   found, the same whether it exists or not. Context ids are keyed hashes of the first
//!   messageId under the peer's token: nobody else can tell one in advance.
//! - A task is one exchange (see [`tasks`]): `input-required` when the turn comes back to the
//!   peer, `completed` when the conversation closes, `canceled` on `CancelTask`. Its state is
//!   read back from the log each time, so the adapter holds nothing a restart could lose.
//! - A peer's retried message (same `messageId`) is recognised through the clientRequestId
//!   `a2a:{messageId}`: nothing is appended twice and the same task comes back.
//!
//! ```sh
//! orchestrator-a2a --url ws://127.0.0.1:7300/rpc --scenario support --listen 127.0.0.1:7400
//! ```

mod error;
mod exchange;
mod listing;
mod peers;
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

use crate::error::A2aError;
use crate::exchange::{cancel_task, get_task, send_message, start_exchange, stream, task_of};
use crate::listing::list_tasks;
pub use crate::peers::PeerLimits;
use crate::peers::{Peer, Peers};
use crate::tasks::{State as TaskState, TaskId, TaskView, CANCEL_TRACE, KEY_PREFIX};

/// How long a blocking `SendMessage` waits for the exchange to settle before it answers with
/// the task still `working` (the peer can then poll with `GetTask` or `SubscribeToTask`).
const BLOCKING_WAIT: Duration = Duration::from_secs(60);

/// The adapter: where its peers' connections go, where peers reach it and the scenarios it
/// exposes.
#[derive(Debug)]
pub struct App {
    peers: Peers,
    public_url: String,
    scenarios: Vec<String>,
    /// How long a blocking `SendMessage` waits ([`BLOCKING_WAIT`] unless told).
    blocking_wait: Duration,
}

type Shared = Arc<App>;

/// One call: the peer that makes it and the scenario whose endpoint it reached.
pub(crate) struct Call<'a> {
    pub(crate) app: &'a App,
    pub(crate) peer: Arc<Peer>,
    pub(crate) scenario: &'a str,
}

impl Call<'_> {
    /// The agent id the peer speaks as.
    pub(crate) fn me(&self) -> &str {
        &self.peer.me
    }

    /// The peer's connection to the orchestrator.
    pub(crate) fn client(&self) -> &Arc<WsJsonRpcClient> {
        &self.peer.client
    }
}

/// Checks, with an admin's token, that each exposed scenario is in the orchestrator's library
/// and names a `caller` participant (the participant a peer speaks as). The token is used for
/// nothing else.
async fn check_setup(
    client: &WsJsonRpcClient,
    url: &str,
    scenarios: &[String],
) -> anyhow::Result<()> {
    let library = match client.list_scenarios().await {
        Ok(l) => l,
        Err(ClientError::Rpc(e)) if e.code == ErrorCode::Forbidden => anyhow::bail!(
            "--token is not an admin's: the adapter uses it only to check at start that each scenario is in the library and names a caller; mint one with `orchestrator token create --agent ID --admin`, or leave --token out"
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
        if !found.participants.iter().any(|p| p.caller) {
            let external: Vec<&str> = found
                .participants
                .iter()
                .filter(|p| p.kind.is_none())
                .map(|p| p.id.as_str())
                .collect();
            anyhow::bail!(
                "scenario {name:?} names no caller participant, the one an A2A peer speaks as: mark one of its external participants ({}) with `caller: true`",
                if external.is_empty() { "none".to_string() } else { external.join(", ") }
            );
        }
    }
    Ok(())
}

/// The name of the Agent Card's one security scheme.
const SCHEME: &str = "orchestratorToken";

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
        "securitySchemes": {SCHEME: {"httpAuthSecurityScheme": {
            "scheme": "Bearer",
            "description": "An orchestrator token (`orchestrator token create --agent ID`): you act as its agent, \
                            which speaks as the scenario's caller participant.",
        }}},
        "securityRequirements": [{"schemes": {SCHEME: {"list": []}}}],
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
    match result {
        Ok(r) => Json(json!({"jsonrpc": "2.0", "id": id, "result": r})).into_response(),
        Err(e) => {
            let mut resp = (e.status, Json(e.wire(id))).into_response();
            if e.status == StatusCode::UNAUTHORIZED {
                resp.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    header::HeaderValue::from_static("Bearer"),
                );
            }
            resp
        }
    }
}

/// A request's id and method, or the error that answers it.
fn read_request(body: &[u8]) -> Result<(Value, String, Value), (Value, A2aError)> {
    let req: Value = serde_json::from_slice(body).map_err(|e| {
        let err = A2aError::new(-32700, "PARSE_ERROR", format!("invalid JSON: {e}"));
        (Value::Null, err)
    })?;
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    let id_ok = id.is_string() || id.is_null() || id.is_i64() || id.is_u64();
    if !id_ok {
        let err = A2aError::new(
            -32600,
            "INVALID_REQUEST",
            "id must be a string, an integer or null",
        );
        return Err((Value::Null, err));
    }
    let Some(method) = req["method"].as_str().filter(|_| req["jsonrpc"] == "2.0") else {
        let err = A2aError::new(-32600, "INVALID_REQUEST", "not a JSON-RPC 2.0 request");
        return Err((id, err));
    };
    let params = req.get("params").cloned().unwrap_or(json!({}));
    Ok((id.clone(), method.to_string(), params))
}

async fn dispatch(app: Shared, scenario: String, headers: &HeaderMap, body: Bytes) -> Response {
    let (id, method, params) = match read_request(&body) {
        Ok(r) => r,
        Err((id, err)) => return reply(&id, Err(err)),
    };
    if let Some(err) = version_refused(headers) {
        return reply(&id, Err(err));
    }
    let peer = match app.peers.authenticate(headers).await {
        Ok(peer) => peer,
        Err(e) => return reply(&id, Err(e)),
    };
    let slot = match peer.call_slot(app.peers.limits()) {
        Ok(slot) => slot,
        Err(e) => return reply(&id, Err(e)),
    };
    let call = Call {
        app: &app,
        peer: peer.clone(),
        scenario: &scenario,
    };
    let answer = serve(&call, &app, id.clone(), &method, &params).await;
    drop(slot);
    match answer {
        Answer::Done(Err(e)) if e.status == StatusCode::UNAUTHORIZED => {
            // The token stopped working (revoked or expired): the next call authenticates anew.
            app.peers.forget(&peer);
            reply(&id, Err(e))
        }
        Answer::Done(result) => reply(&id, result),
        Answer::Stream(resp) => resp,
    }
}

/// What a method gives: an answer, or a stream of them.
enum Answer {
    Done(Result<Value, A2aError>),
    Stream(Response),
}

async fn serve(call: &Call<'_>, app: &Shared, id: Value, method: &str, params: &Value) -> Answer {
    let limits = app.peers.limits();
    let streamed = |slot, view, posted| {
        Answer::Stream(stream(call.peer.clone(), slot, id.clone(), view, posted))
    };
    match method {
        "SendMessage" => Answer::Done(send_message(call, params).await),
        "SendStreamingMessage" => {
            // Refused before anything is posted when the peer has no stream to spare.
            let slot = match call.peer.stream_slot(limits) {
                Ok(slot) => slot,
                Err(e) => return Answer::Done(Err(e)),
            };
            match start_exchange(call, params).await {
                Ok((view, posted)) => streamed(slot, view, Some(posted)),
                Err(e) => Answer::Done(Err(e)),
            }
        }
        "GetTask" => Answer::Done(get_task(call, params).await),
        "ListTasks" => Answer::Done(list_tasks(call, params).await),
        "CancelTask" => Answer::Done(cancel_task(call, params).await),
        "SubscribeToTask" => match task_of(call, params).await {
            Ok(view) if view.state.terminal() => Answer::Done(Err(A2aError::new(
                -32004,
                "UNSUPPORTED_OPERATION",
                format!(
                    "task {} is {}; read it with GetTask",
                    view.id.wire(),
                    view.state.wire()
                ),
            ))),
            Ok(view) => match call.peer.stream_slot(limits) {
                Ok(slot) => streamed(slot, view, None),
                Err(e) => Answer::Done(Err(e)),
            },
            Err(e) => Answer::Done(Err(e)),
        },
        push if PUSH_METHODS.contains(&push) => Answer::Done(Err(A2aError::new(
            -32003,
            "PUSH_NOTIFICATION_NOT_SUPPORTED",
            "push notifications are not supported by this agent: stream, or poll with GetTask",
        ))),
        other => Answer::Done(Err(A2aError::new(
            -32601,
            "METHOD_NOT_FOUND",
            format!("method {other} is not served here"),
        ))),
    }
}

impl App {
    /// The adapter for the orchestrator at `url` (its WebSocket endpoint), exposing
    /// `scenarios`; its Agent Cards name `public_url`. With `admin_token`, it first checks that
    /// each scenario is in the library and names a caller participant.
    pub async fn start(
        url: &str,
        admin_token: Option<String>,
        scenarios: Vec<String>,
        public_url: String,
        limits: PeerLimits,
    ) -> anyhow::Result<App> {
        if let Some(token) = admin_token {
            let client = WsJsonRpcClient::connect(agent_sdk::WsConfig::new(url, token))
                .await
                .with_context(|| format!("connecting to {url} with --token"))?;
            check_setup(&client, url, &scenarios).await?;
        }
        Ok(App {
            peers: Peers::new(url, limits),
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
