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
//! ```

mod bridge;

use std::net::SocketAddr;

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
        Some(addr) => serve_http(bridge, addr).await?,
    }
    Ok(())
}

async fn serve_http(bridge: Bridge, addr: SocketAddr) -> anyhow::Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    let mut config = StreamableHttpServerConfig::default();
    config.cancellation_token = stop.child_token();
    let service = StreamableHttpService::new(
        move || Ok(bridge.clone()),
        LocalSessionManager::default().into(),
        config,
    );
    let app = axum::Router::new().nest_service("/mcp", service);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("listening on {addr}"))?;
    let local = listener.local_addr()?;
    println!("orchestrator-mcp listening on http://{local}/mcp");
    use std::io::Write;
    std::io::stdout().flush()?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            agent_sdk::host::shutdown_signal().await;
            stop.cancel();
        })
        .await?;
    Ok(())
}
