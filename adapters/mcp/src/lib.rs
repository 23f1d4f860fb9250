//! The MCP adapter as a library: the tools ([`bridge::Bridge`]) and the HTTP endpoint's
//! routes ([`router`]: the session cap, who a caller is ([`HttpAuth`]), the allowed `Host`
//! values, rmcp's streamable HTTP service). The binary (`main.rs`) parses the command line and
//! listens; the fuzz target `mcp_request` drives the same routes in process.
//!
//! Over HTTP, by default each MCP client authenticates with its own orchestrator token
//! (`Authorization: Bearer oct_…`) and acts as that token's principal
//! ([`HttpAuth::PerCaller`]). A single-tenant local setup may instead give the adapter a token
//! of its own and let every caller speak as it ([`HttpAuth::Shared`], with or without a shared
//! secret of the endpoint's).

pub mod bridge;

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sdk::pool::{bearer_token, ClientPool, PoolError};
use agent_sdk::WsJsonRpcClient;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use crate::bridge::{Bridge, Caller};

/// Who an HTTP caller is.
#[derive(Debug, Clone)]
pub enum HttpAuth {
    /// Each caller presents its own orchestrator token and acts as its principal; the pool
    /// holds a connection per token.
    PerCaller(Arc<ClientPool<WsJsonRpcClient>>),
    /// Every caller speaks as the adapter's own agent (the token of `upstream`); with a
    /// `secret` (its digest), callers must send the endpoint's shared secret as a bearer token.
    Shared {
        /// The adapter's own connection settings.
        upstream: agent_sdk::WsConfig,
        /// The digest of the endpoint's shared secret ([`http_token`]).
        secret: Option<Arc<[u8; 32]>>,
    },
}

/// The `Host` values the endpoint answers by default: loopback only (DNS rebinding).
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];
/// A bearer token longer than this is refused before anything is asked of the orchestrator.
const MAX_TOKEN_BYTES: usize = 512;

/// The shared secret of a single-tenant endpoint: required beyond loopback (every caller would
/// speak as the adapter's agent), and not empty when given.
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
            "--http {addr} listens beyond loopback, where anyone who reaches it would speak as this adapter's agent (--token); \
             leave --token out so that each caller authenticates with its own orchestrator token, \
             or give --http-token (ORCHESTRATOR_MCP_HTTP_TOKEN) for one shared secret, or listen on 127.0.0.1"
        ),
    }
}

fn digest(b: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    let mut out = [0u8; 32];
    out.copy_from_slice(&sha2::Sha256::digest(b));
    out
}

/// The bearer token of a request's `Authorization` header (the scheme in any case, RFC 9110
/// §11.1), if it has one of at most [`MAX_TOKEN_BYTES`].
fn bearer_of(req: &axum::extract::Request) -> Option<&str> {
    req.headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| bearer_token(v, MAX_TOKEN_BYTES))
}

/// A 401 answer that says what to send.
fn unauthorized(why: &str) -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        axum::http::StatusCode::UNAUTHORIZED,
        [(axum::http::header::WWW_AUTHENTICATE, "Bearer")],
        axum::Json(serde_json::json!({"error": why})),
    )
        .into_response()
}

/// Authenticates a request with its own orchestrator token: its connection (from the pool) goes
/// into the request as its [`Caller`], or the request is refused (401 for a token the
/// orchestrator does not accept, 503 when the pool cannot take another caller now).
async fn per_caller(
    axum::extract::State(pool): axum::extract::State<Arc<ClientPool<WsJsonRpcClient>>>,
    mut req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let Some(token) = bearer_of(&req).map(str::to_string) else {
        return unauthorized(
            "this MCP endpoint needs `Authorization: Bearer <an orchestrator token>`: you act as that token's agent",
        );
    };
    match pool.get(&token, |client, _, _| client).await {
        Ok(client) => {
            req.extensions_mut().insert(Caller(client));
            next.run(req).await
        }
        Err(PoolError::Refused(_)) => unauthorized(
            "the orchestrator does not accept this token (unknown, revoked or expired)",
        ),
        Err(e) => {
            let status = match e {
                PoolError::Unreachable(_) => axum::http::StatusCode::BAD_GATEWAY,
                _ => axum::http::StatusCode::SERVICE_UNAVAILABLE,
            };
            (
                status,
                [(axum::http::header::RETRY_AFTER, "1")],
                axum::Json(serde_json::json!({"error": e.to_string()})),
            )
                .into_response()
        }
    }
}

/// Answers 401 unless the request carries the endpoint's shared secret as its bearer token
/// (compared as digests, so the time taken says nothing about the secret).
async fn shared_secret(
    axum::extract::State(token): axum::extract::State<Arc<[u8; 32]>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let given = bearer_of(&req).map(|t| digest(t.as_bytes()));
    if given.as_ref() == Some(&*token) {
        return next.run(req).await;
    }
    unauthorized(
        "this MCP endpoint needs `Authorization: Bearer <token>` (the adapter's --http-token)",
    )
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

/// How the HTTP endpoint is served.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    /// Who a caller is.
    pub auth: HttpAuth,
    /// The most MCP sessions open at once.
    pub max_sessions: usize,
    /// The `Host` values it answers (others get 403); empty: any.
    pub allowed_hosts: Vec<String>,
}

/// The HTTP endpoint's routes (`/mcp`): rmcp's streamable HTTP service, behind who a caller is
/// and the cap on open sessions. The tools speak as the adapter's agent (`--token`) with
/// [`HttpAuth::Shared`], and as each caller's own principal with [`HttpAuth::PerCaller`].
/// `stop` ends the service's streams.
pub fn router(http: HttpConfig, stop: &tokio_util::sync::CancellationToken) -> axum::Router {
    let mut config = StreamableHttpServerConfig::default().with_allowed_hosts(http.allowed_hosts);
    if config.allowed_hosts.is_empty() {
        config = config.disable_allowed_hosts();
    }
    config.cancellation_token = stop.child_token();
    let bridge = match &http.auth {
        HttpAuth::Shared { upstream, .. } => Bridge::new(upstream.clone()),
        HttpAuth::PerCaller(_) => Bridge::per_caller(),
    };
    let sessions = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(move || Ok(bridge.clone()), sessions.clone(), config);
    let app = axum::Router::new().nest_service("/mcp", service).layer(
        axum::middleware::from_fn_with_state((sessions, http.max_sessions), limit_sessions),
    );
    match http.auth {
        HttpAuth::PerCaller(pool) => {
            app.layer(axum::middleware::from_fn_with_state(pool, per_caller))
        }
        HttpAuth::Shared {
            secret: Some(t), ..
        } => app.layer(axum::middleware::from_fn_with_state(t, shared_secret)),
        HttpAuth::Shared { secret: None, .. } => app,
    }
}
