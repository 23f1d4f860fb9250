//! The MCP adapter for `mcp_request`: an orchestrator serving WebSocket on 127.0.0.1 with the
//! conversation `c1` of alice and bob, and the adapter's HTTP routes in process, speaking as
//! alice, behind the bearer token [`TOKEN`] and a cap of 4 sessions; one session is opened
//! (`initialize`, then `notifications/initialized`) and a tool called through it when the
//! harness is made. A long-poll waits at most 5 ms.

use std::sync::Arc;
use std::time::Duration;

use agent_sdk::WsConfig;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

/// The endpoint's bearer token.
pub const TOKEN: &str = "fuzz-token";
/// The protocol version the harness's session speaks.
pub const VERSION: &str = "2025-06-18";

/// The adapter and what it runs on.
pub struct McpHarness {
    /// The adapter's routes.
    pub app: axum::Router,
    /// The session opened when the harness was made.
    pub session: String,
    /// The orchestrator it speaks to, and the runtime both run on.
    pub served: crate::Served,
    stop: tokio_util::sync::CancellationToken,
}

/// The adapter: the same one for [`crate::RENEW_EVERY`] inputs.
pub fn mcp() -> Arc<McpHarness> {
    static H: crate::Renewed<McpHarness> = crate::Renewed::new();
    H.get(McpHarness::make, |old| {
        old.stop.cancel();
        drop(old.app);
        old.served.stop();
    })
}

/// A request to `/mcp` as an MCP client sends it: the token, JSON, both answer types accepted.
pub fn request(
    method: &str,
    session: Option<&str>,
    body: Vec<u8>,
) -> axum::http::Request<axum::body::Body> {
    let mut req = axum::http::Request::builder()
        .method(method)
        .uri("/mcp")
        .header("host", "127.0.0.1")
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream");
    if let Some(s) = session {
        req = req
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", VERSION);
    }
    req.body(axum::body::Body::from(body)).expect("a request")
}

/// The first JSON-RPC message of an answer (a JSON body, or the first `data:` of an SSE
/// stream), read within 5 s; `None` when the answer has no body or is of another type (a
/// refusal in plain text).
pub async fn first_message(answer: axum::response::Response) -> Option<Value> {
    let kind = answer
        .headers()
        .get("content-type")
        .map(|c| c.as_bytes().to_vec());
    let sse = kind
        .as_deref()
        .is_some_and(|c| c.starts_with(b"text/event-stream"));
    let json = kind
        .as_deref()
        .is_some_and(|c| c.starts_with(b"application/json"));
    if !sse && !json {
        return None;
    }
    let mut body = answer.into_body();
    let mut text = Vec::new();
    let read = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.expect("a body");
            if let Some(data) = frame.data_ref() {
                text.extend_from_slice(data);
            }
            if sse && sse_data(&text).is_some() {
                break;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("an answer within 5 s");
    let data = if sse { sse_data(&text)? } else { text.clone() };
    if data.iter().all(u8::is_ascii_whitespace) {
        return None;
    }
    Some(serde_json::from_slice(&data).unwrap_or_else(|e| {
        panic!(
            "every answer is JSON ({e}): {}",
            String::from_utf8_lossy(&data)
        )
    }))
}

/// The first complete SSE event's `data:` with something in it.
fn sse_data(text: &[u8]) -> Option<Vec<u8>> {
    let text = String::from_utf8_lossy(text);
    let mut events = text.split("\n\n");
    let last_complete = text.ends_with("\n\n");
    let mut found = None;
    while let Some(event) = events.next() {
        let complete = last_complete || events.clone().next().is_some();
        if !complete {
            break;
        }
        let data: Vec<&str> = event
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .map(str::trim_start)
            .collect();
        if data.iter().any(|d| !d.is_empty()) {
            found = Some(data.join("\n").into_bytes());
            break;
        }
    }
    found
}

/// Sends `message` to `app` in `session` (or opening one): the answer.
async fn send(
    app: &axum::Router,
    session: Option<&str>,
    message: Value,
) -> axum::response::Response {
    app.clone()
        .oneshot(request("POST", session, message.to_string().into_bytes()))
        .await
        .expect("infallible")
}

impl McpHarness {
    fn make() -> McpHarness {
        let served = crate::Served::start("alice", false, Vec::new(), async |orch| {
            orch.create_conversation(
                &orchestrator::engine::auth::Identity::new("admin", true),
                proto_spec::CreateConversationParams {
                    conversation_id: Some("c1".into()),
                    participants: Some(vec!["alice".into(), "bob".into()]),
                    ..Default::default()
                },
            )
            .await
            .expect("c1");
        });
        let stop = tokio_util::sync::CancellationToken::new();
        let (app, session) = served.rt.block_on(async {
            let secret = orchestrator_mcp::http_token(
                "127.0.0.1:0".parse().expect("an address"),
                Some(TOKEN.into()),
            )
            .expect("a token");
            let auth = orchestrator_mcp::HttpAuth::Shared {
                upstream: WsConfig::new(served.url(), served.token.clone()),
                secret,
            };
            let http = orchestrator_mcp::HttpConfig {
                auth,
                max_sessions: 4,
                allowed_hosts: orchestrator_mcp::LOOPBACK_HOSTS.map(String::from).to_vec(),
            };
            let app = orchestrator_mcp::router(http, &stop);
            let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
                "protocolVersion": VERSION, "capabilities": {},
                "clientInfo": {"name": "fuzz", "version": "0"}}});
            let answer = send(&app, None, init).await;
            let session = answer
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
                .expect("a session id")
                .to_string();
            let first = first_message(answer).await.expect("initialize's answer");
            assert!(first.get("result").is_some(), "{first}");
            let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
            let answer = send(&app, Some(&session), done).await;
            assert_eq!(answer.status(), 202, "the session is initialized");
            // The whole way through: a tool's call reaches the orchestrator as alice.
            let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
                "name": "get_conversation", "arguments": {"conversationId": "c1"}}});
            let got = first_message(send(&app, Some(&session), call).await)
                .await
                .expect("the tool's answer");
            assert_eq!(
                got["result"]["structuredContent"]["conversationId"], "c1",
                "{got}"
            );
            (app, session)
        });
        McpHarness {
            app,
            session,
            served,
            stop,
        }
    }
}
