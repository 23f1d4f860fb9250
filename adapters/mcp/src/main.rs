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

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sdk::WsConfig;
use anyhow::Context;
use clap::Parser;
use orchestrator_mcp::bridge::Bridge;
use orchestrator_mcp::{http_token, router};
use rmcp::ServiceExt;

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

async fn serve_http(
    bridge: Bridge,
    addr: SocketAddr,
    token: Option<Arc<[u8; 32]>>,
    tls: Option<Arc<agent_sdk::tls::ServerTls>>,
    max_sessions: usize,
) -> anyhow::Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    if token.is_none() {
        tracing::warn!(
            %addr,
            "the HTTP endpoint takes no token: any process on this machine may call it (give --http-token to require one)"
        );
    }
    let app = router(bridge, token, max_sessions, &stop);
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
