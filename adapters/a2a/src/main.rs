//! `orchestrator-a2a`: the A2A adapter's command line (the adapter is the library beside it).

use std::net::SocketAddr;
use std::sync::Arc;

use agent_sdk::{WsConfig, WsJsonRpcClient};
use anyhow::Context;
use clap::Parser;
use orchestrator_a2a::{router, App};

#[derive(Parser, Debug)]
#[command(
    name = "orchestrator-a2a",
    version,
    about = "A2A adapter for the conversation orchestrator"
)]
struct Cli {
    /// The orchestrator's WebSocket URL.
    #[arg(
        long,
        env = "ORCHESTRATOR_URL",
        default_value = "ws://127.0.0.1:7300/rpc"
    )]
    url: String,
    /// The token the adapter speaks as: an admin agent that is an external participant of each
    /// exposed scenario.
    #[arg(long, env = "ORCHESTRATOR_TOKEN", hide_env_values = true)]
    token: String,
    /// Where to serve A2A.
    #[arg(
        long,
        env = "ORCHESTRATOR_A2A_LISTEN",
        default_value = "127.0.0.1:7400"
    )]
    listen: SocketAddr,
    /// Serve over TLS with this certificate chain (PEM, the adapter's certificate first);
    /// reloaded on SIGHUP. With --tls-key.
    #[arg(long, env = "ORCHESTRATOR_A2A_TLS_CERT")]
    tls_cert: Option<std::path::PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, env = "ORCHESTRATOR_A2A_TLS_KEY")]
    tls_key: Option<std::path::PathBuf>,
    /// The address peers reach this adapter at, for the Agent Cards (default: http://LISTEN,
    /// or https://LISTEN with --tls-cert).
    #[arg(long, env = "ORCHESTRATOR_A2A_PUBLIC_URL")]
    public_url: Option<String>,
    /// A scenario (by its name on the orchestrator, `serve --scenarios`) to expose; repeat for
    /// several. The first is also served at the root.
    #[arg(
        long = "scenario",
        env = "ORCHESTRATOR_A2A_SCENARIOS",
        value_delimiter = ',',
        required = true
    )]
    scenarios: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    agent_sdk::host::init_logging();
    let cli = Cli::parse();
    let tls = agent_sdk::tls::server_from_flags(cli.tls_cert.as_deref(), cli.tls_key.as_deref())?;
    let client = WsJsonRpcClient::connect(WsConfig::new(cli.url.clone(), cli.token))
        .await
        .with_context(|| format!("connecting to {}", cli.url))?;
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .with_context(|| format!("listening on {}", cli.listen))?;
    let local = listener.local_addr()?;
    let public_url = cli.public_url.unwrap_or_else(|| {
        let scheme = if tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{local}")
    });
    let app = Arc::new(App::start(client, &cli.url, cli.scenarios, public_url).await?);
    println!(
        "orchestrator-a2a listening on {} (scenarios: {})",
        app.public_url(),
        app.scenarios().join(", ")
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    agent_sdk::host::serve(listener, tls, router(app), || {}).await?;
    Ok(())
}
