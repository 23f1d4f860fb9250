//! `orchestrator-mcp`: the MCP adapter. A separate process that lets an MCP host (a desktop
//! assistant, an IDE, an agent framework) take part in orchestrated conversations through four
//! tools: `wait_for_updates`, `post_message`, `list_conversations`, `get_conversation`.
//!
//! It speaks MCP over stdio (the default) or over streamable HTTP (`--http ADDR`, at `/mcp`),
//! and the orchestrator's protocol over WebSocket. It holds no conversation state: the caller
//! keeps its cursor, so a restart loses nothing.
//!
//! ```sh
//! ORCHESTRATOR_TOKEN=oct_… orchestrator-mcp                       # stdio, as that token's agent
//! orchestrator-mcp --http 0.0.0.0:7310 --allowed-host mcp.example.com   # each caller's own token
//! ORCHESTRATOR_TOKEN=oct_… orchestrator-mcp --http 127.0.0.1:7310  # one local identity for all
//! ```
//!
//! Over HTTP without `--token`, each MCP client sends `Authorization: Bearer <its orchestrator
//! token>` and acts as that token's agent: clients of different partners see only their own
//! conversations. With `--token`, every HTTP caller speaks as the adapter's agent (a
//! single-tenant local setup), so beyond loopback a shared secret (`--http-token`) is required.

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sdk::pool::ClientPool;
use agent_sdk::WsConfig;
use anyhow::Context;
use clap::Parser;
use orchestrator_mcp::bridge::Bridge;
use orchestrator_mcp::{http_token, router, HttpAuth, HttpConfig, LOOPBACK_HOSTS};
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
    /// Required over stdio. Over HTTP, leave it out so that each caller acts as its own bearer
    /// token's agent; with it, every HTTP caller speaks as this one agent.
    #[arg(long, env = "ORCHESTRATOR_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Serve MCP over streamable HTTP on this address (at `/mcp`) instead of stdio.
    #[arg(long, env = "ORCHESTRATOR_MCP_HTTP")]
    http: Option<SocketAddr>,
    /// With --token: a shared secret HTTP callers must send (`Authorization: Bearer …`),
    /// required to listen beyond loopback. Without --token each caller sends its own
    /// orchestrator token instead, and this is refused.
    #[arg(long, env = "ORCHESTRATOR_MCP_HTTP_TOKEN", hide_env_values = true)]
    http_token: Option<String>,
    /// A `Host` value the HTTP endpoint answers (a hostname, or host:port); repeat for several.
    /// Default: localhost, 127.0.0.1 and ::1 only (others are refused with 403, against DNS
    /// rebinding); `*` answers any.
    #[arg(
        long = "allowed-host",
        env = "ORCHESTRATOR_MCP_ALLOWED_HOSTS",
        value_delimiter = ','
    )]
    allowed_hosts: Vec<String>,
    /// With each caller's own token: the most callers (tokens) with a connection to the
    /// orchestrator at once; an idle one is let go to make room.
    #[arg(long, env = "ORCHESTRATOR_MCP_MAX_CALLERS", default_value_t = 512)]
    max_callers: usize,
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
    let Some(addr) = cli.http else {
        let token = cli.token.context(
            "over stdio the adapter speaks as one agent: give its token with --token (or ORCHESTRATOR_TOKEN)",
        )?;
        let running = Bridge::new(WsConfig::new(cli.url, token))
            .serve(rmcp::transport::stdio())
            .await
            .context("starting MCP over stdio")?;
        running.waiting().await.context("serving MCP over stdio")?;
        return Ok(());
    };
    let auth = match cli.token {
        Some(token) => HttpAuth::Shared {
            upstream: WsConfig::new(cli.url, token),
            secret: http_token(addr, cli.http_token)?,
        },
        None if cli.http_token.is_some() => anyhow::bail!(
            "--http-token is the shared secret of an endpoint where every caller speaks as the adapter's agent (--token); \
             without --token each caller sends its own orchestrator token, so leave --http-token out"
        ),
        None => HttpAuth::PerCaller(Arc::new(ClientPool::new(cli.url, cli.max_callers))),
    };
    let allowed_hosts = match cli.allowed_hosts.as_slice() {
        [] => LOOPBACK_HOSTS.map(String::from).to_vec(),
        [any] if any == "*" => Vec::new(),
        hosts => hosts.to_vec(),
    };
    let tls = agent_sdk::tls::server_from_flags(cli.tls_cert.as_deref(), cli.tls_key.as_deref())?;
    let http = HttpConfig {
        auth,
        max_sessions: cli.max_sessions,
        allowed_hosts,
    };
    serve_http(addr, http, tls).await
}

async fn serve_http(
    addr: SocketAddr,
    http: HttpConfig,
    tls: Option<Arc<agent_sdk::tls::ServerTls>>,
) -> anyhow::Result<()> {
    let stop = tokio_util::sync::CancellationToken::new();
    if matches!(http.auth, HttpAuth::Shared { secret: None, .. }) {
        tracing::warn!(
            %addr,
            "every HTTP caller speaks as the adapter's agent and none is asked for a secret: any process on this machine may call it"
        );
    }
    let app = router(http, &stop);
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
