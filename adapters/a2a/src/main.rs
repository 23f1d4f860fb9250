//! `orchestrator-a2a`: the A2A adapter's command line (the adapter is the library beside it).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use orchestrator_a2a::{router, App, PeerLimits};

#[derive(Parser, Debug)]
#[command(
    name = "orchestrator-a2a",
    version,
    about = "A2A adapter for the conversation orchestrator",
    long_about = "A2A adapter for the conversation orchestrator. Every A2A call must carry \
Authorization: Bearer <an orchestrator token> (the Agent Card declares it); the peer acts on the \
orchestrator as that token's agent, which speaks as the scenario's caller participant (marked \
`caller: true`). A peer reaches only the contexts it started through the adapter."
)]
struct Cli {
    /// The orchestrator's WebSocket URL.
    #[arg(
        long,
        env = "ORCHESTRATOR_URL",
        default_value = "ws://127.0.0.1:7300/rpc"
    )]
    url: String,
    /// An admin's token, used only at start to check that each exposed scenario is in the
    /// library and names a caller participant; never to serve a peer (each peer acts with its
    /// own token). Without it the adapter starts unchecked.
    #[arg(long, env = "ORCHESTRATOR_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Streams one peer may have open at once.
    #[arg(long, env = "ORCHESTRATOR_A2A_MAX_STREAMS_PER_PEER", default_value_t = PeerLimits::default().streams)]
    max_streams_per_peer: usize,
    /// Calls of one peer being answered at once.
    #[arg(long, env = "ORCHESTRATOR_A2A_MAX_CALLS_PER_PEER", default_value_t = PeerLimits::default().calls)]
    max_calls_per_peer: usize,
    /// New contexts (conversations) one peer may start a minute.
    #[arg(long, env = "ORCHESTRATOR_A2A_MAX_NEW_CONTEXTS_PER_MINUTE", default_value_t = PeerLimits::default().new_contexts_per_minute)]
    max_new_contexts_per_minute: usize,
    /// Peers connected to the orchestrator at once (an idle one is let go to make room).
    #[arg(long, env = "ORCHESTRATOR_A2A_MAX_PEERS", default_value_t = PeerLimits::default().peers)]
    max_peers: usize,
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
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .with_context(|| format!("listening on {}", cli.listen))?;
    let local = listener.local_addr()?;
    let public_url = cli.public_url.unwrap_or_else(|| {
        let scheme = if tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{local}")
    });
    let limits = PeerLimits {
        streams: cli.max_streams_per_peer.max(1),
        calls: cli.max_calls_per_peer.max(1),
        new_contexts_per_minute: cli.max_new_contexts_per_minute,
        peers: cli.max_peers.max(1),
    };
    let app = App::start(&cli.url, cli.token, cli.scenarios, public_url, limits).await?;
    let app = Arc::new(app);
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
