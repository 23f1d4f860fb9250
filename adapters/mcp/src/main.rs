//! `orchestrator-mcp`: the MCP adapter. A separate process that lets an MCP host (a desktop
//! assistant, an IDE, an agent framework) take part in orchestrated conversations through four
//! tools: `wait_for_updates`, `post_message`, `list_conversations`, `get_conversation`.
//!
//! It speaks MCP over stdio (the default) or over streamable HTTP (`--http ADDR`, at `/mcp`),
//! and the orchestrator's protocol over WebSocket with the token it is given, as that agent.
//! It holds no conversation state: the caller keeps its cursor, so a restart loses nothing.
//!
//! ```sh
//! ORCHESTRATOR_TOKEN=oct_… orchestrator-mcp                       # stdio
//! ORCHESTRATOR_TOKEN=oct_… orchestrator-mcp --http 127.0.0.1:7310  # http://127.0.0.1:7310/mcp
//! ORCHESTRATOR_TOKEN=oct_… ORCHESTRATOR_MCP_HTTP_TOKEN=s3cret orchestrator-mcp --http 0.0.0.0:7310
//! ```
//!
//! Over HTTP every caller speaks as the adapter's agent, so the endpoint is authenticated with a
//! bearer token of its own (`--http-token`): a request without it is answered 401. Listening
//! beyond loopback without one is refused at start.

mod bridge;

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sdk::WsConfig;
use anyhow::Context;
use clap::Parser;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::ServiceExt;

use crate::bridge::Bridge;

#[derive(Parser, Debug)]
#[command(
    name = "orchestrator-mcp",
    version,
    about = "MCP adapter for the conversation orchestrator"
)]
struct Cli {
    /// The orchestrator's WebSocket URL.
    #[arg(
        long,
        env = "ORCHESTRATOR_URL",
        default_value = "ws://127.0.0.1:7300/rpc"
    )]
    url: String,
    /// The token the adapter speaks as (an agent's token from `orchestrator token create`).
    #[arg(long, env = "ORCHESTRATOR_TOKEN", hide_env_values = true)]
    token: String,
    /// Serve MCP over streamable HTTP on this address (at `/mcp`) instead of stdio.
    #[arg(long, env = "ORCHESTRATOR_MCP_HTTP")]
    http: Option<SocketAddr>,
    /// The bearer token HTTP callers must send (`Authorization: Bearer …`). Required to listen
    /// beyond loopback; without it, only processes on this machine can reach the endpoint.
    #[arg(long, env = "ORCHESTRATOR_MCP_HTTP_TOKEN", hide_env_values = true)]
    http_token: Option<String>,
    /// Serve the HTTP endpoint over TLS with this certificate chain (PEM, the adapter's
    /// certificate first); reloaded on SIGHUP. With --tls-key.
    #[arg(long, env = "ORCHESTRATOR_MCP_TLS_CERT")]
    tls_cert: Option<std::path::PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, env = "ORCHESTRATOR_MCP_TLS_KEY")]
    tls_key: Option<std::path::PathBuf>,
    /// The most MCP sessions open at once on the HTTP endpoint; a new one beyond is refused
    /// (503, RateLimited) until one is closed (DELETE /mcp) or idles out (5 minutes).
    #[arg(long, env = "ORCHESTRATOR_MCP_MAX_SESSIONS", default_value_t = 256)]
    max_sessions: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // stdout is the MCP channel over stdio: logs go to stderr.
    agent_sdk::host::init_logging();
    let cli = Cli::parse();
    let bridge = Bridge::new(WsConfig::new(cli.url, cli.token));
    match cli.http {
        None => {
            let running = bridge
                .serve(rmcp::transport::stdio())
                .await
                .context("starting MCP over stdio")?;
            running.waiting().await.context("serving MCP over stdio")?;
        }
        Some(addr) => {
            let token = http_token(addr, cli.http_token)?;
            let tls =
                agent_sdk::tls::server_from_flags(cli.tls_cert.as_deref(), cli.tls_key.as_deref())?;
            serve_http(bridge, addr, token, tls, cli.max_sessions).await?
        }
    }
    Ok(())
}

/// The HTTP endpoint's token: required beyond loopback (every caller would speak as the
/// adapter's agent), and not empty when given.
fn http_token(addr: SocketAddr, token: Option<String>) -> anyhow::Result<Option<Arc<[u8; 32]>>> {
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

async fn serve_http(
    bridge: Bridge,
    addr: SocketAddr,
    token: Option<Arc<[u8; 32]>>,
    tls: Option<Arc<agent_sdk::tls::ServerTls>>,
    max_sessions: usize,
) -> anyhow::Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = stop.child_token();
    let sessions = Arc::new(LocalSessionManager::default());
    let service = StreamableHttpService::new(move || Ok(bridge.clone()), sessions.clone(), config);
    let mut app = axum::Router::new().nest_service("/mcp", service).layer(
        axum::middleware::from_fn_with_state((sessions, max_sessions), limit_sessions),
    );
    match token {
        Some(t) => app = app.layer(axum::middleware::from_fn_with_state(t, authorize)),
        None => tracing::warn!(
            %addr,
            "the HTTP endpoint takes no token: any process on this machine may call it (give --http-token to require one)"
        ),
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("orchestrator-mcp listening on {scheme}://{local}/mcp");
    use std::io::Write;
    std::io::stdout().flush()?;
    agent_sdk::host::serve(listener, tls, app, move || stop.cancel()).await?;
    Ok(())
}
