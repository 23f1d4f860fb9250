//! The MCP adapter as a library: the tools ([`bridge::Bridge`]) and the HTTP endpoint's
//! routes ([`router`]: the session cap, the bearer token, rmcp's streamable HTTP service). The
//! binary (`main.rs`) parses the command line and listens; the fuzz target `mcp_request`
//! drives the same routes in process.

pub mod bridge;

use std::net::SocketAddr;
use std::sync::Arc;

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::bridge::Bridge;

/// The HTTP endpoint's token: required beyond loopback (every caller would speak as the
/// adapter's agent), and not empty when given.
pub fn http_token(
    addr: SocketAddr,
    token: Option<String>,
) -> anyhow::Result<Option<Arc<[u8; 32]>>> {
    match token {
        Some(t) if t.trim().is_empty() => {
            anyhow::bail!("--http-token (ORCHESTRATOR_MCP_HTTP_TOKEN) is empty")
        }
        Some(t) => Ok(Some(Arc::new(digest(t.as_bytes())))),
        None if addr.ip().is_loopback() => Ok(None),
        None => anyhow::bail!(
            "--http {addr} listens beyond loopback, where anyone who reaches it would speak as this adapter's agent; \
             give --http-token (or ORCHESTRATOR_MCP_HTTP_TOKEN) so that callers must send `Authorization: Bearer …`, \
             or listen on 127.0.0.1"
        ),
    }
}

fn digest(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut out = [0u8; 32];
    out.copy_from_slice(&sha2::Sha256::digest(b));
    out
}

/// Answers 401 unless the request carries the endpoint's bearer token (compared as digests, so
/// the time taken says nothing about the token).
async fn authorize(
    axum::extract::State(token): axum::extract::State<Arc<[u8; 32]>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let given = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        // The scheme is case-insensitive (RFC 9110 §11.1).
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| digest(t.trim().as_bytes()));
    if given.as_ref() == Some(&*token) {
        return next.run(req).await;
    }
    (
        axum::http::StatusCode::UNAUTHORIZED,
        [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(serde_json::json!({"error": "this MCP endpoint needs `Authorization: Bearer <token>` (the adapter's --http-token)"})),
    )
        .into_response()
}

/// Refuses a request that would open a new MCP session (a `POST` without `Mcp-Session-Id`)
/// while `max` sessions are open: 503 with a JSON-RPC error (`RateLimited`, -32029).
async fn limit_sessions(
    axum::extract::State((sessions, max)): axum::extract::State<(Arc<LocalSessionManager>, usize)>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let opens =
        req.method() == axum::http::Method::POST && !req.headers().contains_key("mcp-session-id");
    if opens && sessions.sessions.read().await.len() >= max {
        tracing::info!(max, "an MCP session refused: too many open");
        let body = serde_json::json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {
                "code": agent_sdk::proto::codes::RATE_LIMITED,
                "message": format!("too many MCP sessions open (limit {max}); close one (DELETE /mcp) or retry later"),
                "data": {"error": "RateLimited", "limit": max},
            },
        });
        return (
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            [(axum::http::header::RETRY_AFTER, "1")],
            axum::Json(body),
        )
            .into_response();
    }
    next.run(req).await
}

/// The HTTP endpoint's routes (`/mcp`): rmcp's streamable HTTP service for `bridge`, behind the
/// cap of `max_sessions` open sessions and, when given, the bearer `token`'s digest (see
/// [`http_token`]). `stop` ends the service's streams.
pub fn router(
    bridge: Bridge,
    token: Option<Arc<[u8; 32]>>,
    max_sessions: usize,
    stop: &tokio_util::sync::CancellationToken,
) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = stop.child_token();
    let sessions = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(move || Ok(bridge.clone()), sessions.clone(), config);
    let app = axum::Router::new().nest_service("/mcp", service).layer(
        axum::middleware::from_fn_with_state((sessions, max_sessions), limit_sessions),
    );
    match token {
        Some(t) => app.layer(axum::middleware::from_fn_with_state(t, authorize)),
        None => app,
    }
}
