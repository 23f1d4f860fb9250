//! The `orchestrator` command: serve the protocol, and mint tokens.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use orchestrator::config::Limits;
use orchestrator::service::Orchestrator;
use orchestrator::store::sqlite::{SqliteStore, Synchronous};
use orchestrator::{auth, server};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(
    name = "orchestrator",
    version,
    about = "A conversation orchestrator: durable event logs, turns, fanout"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve JSON-RPC over WebSocket at /rpc (and /healthz) on one port.
    Serve {
        /// Address to listen on.
        #[arg(long, env = "ORCHESTRATOR_LISTEN", default_value = "127.0.0.1:7300")]
        listen: SocketAddr,
        /// The SQLite database file (created if missing).
        #[arg(long, env = "ORCHESTRATOR_DB", default_value = "orchestrator.db")]
        db: PathBuf,
        /// full: every acknowledged event survives power loss; normal: survives a process crash.
        #[arg(long, env = "ORCHESTRATOR_SYNC", value_enum, default_value_t = SyncMode::Full)]
        sync: SyncMode,
        /// Largest WebSocket frame, in bytes.
        #[arg(long, env = "ORCHESTRATOR_MAX_FRAME_BYTES", default_value_t = Limits::default().max_frame_bytes)]
        max_frame_bytes: u32,
        /// Largest message or trace payload, in bytes.
        #[arg(long, env = "ORCHESTRATOR_MAX_PAYLOAD_BYTES", default_value_t = Limits::default().max_payload_bytes)]
        max_payload_bytes: usize,
        /// Most open connections.
        #[arg(long, env = "ORCHESTRATOR_MAX_CONNECTIONS", default_value_t = Limits::default().max_connections)]
        max_connections: u32,
        /// Most calls in flight on one connection.
        #[arg(long, env = "ORCHESTRATOR_MAX_IN_FLIGHT", default_value_t = Limits::default().max_in_flight_per_connection)]
        max_in_flight: usize,
    },
    /// Manage tokens.
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Subcommand, Debug)]
enum TokenCommand {
    /// Mint a token for an agent; prints it once (only its hash is stored).
    Create {
        /// The agent id the token speaks as.
        #[arg(long)]
        agent: String,
        /// Let it create conversations and read every conversation.
        #[arg(long)]
        admin: bool,
        /// The SQLite database file.
        #[arg(long, env = "ORCHESTRATOR_DB", default_value = "orchestrator.db")]
        db: PathBuf,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum SyncMode {
    Full,
    Normal,
}

impl From<SyncMode> for Synchronous {
    fn from(m: SyncMode) -> Self {
        match m {
            SyncMode::Full => Synchronous::Full,
            SyncMode::Normal => Synchronous::Normal,
        }
    }
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("ORCHESTRATOR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Token {
            command: TokenCommand::Create { agent, admin, db },
        } => {
            anyhow::ensure!(
                auth::valid_id(&agent),
                "--agent: 1-128 characters of letters, digits and . _ : @ -"
            );
            let store = SqliteStore::open(&db, Synchronous::Full)
                .with_context(|| format!("opening {}", db.display()))?;
            let token = auth::create_token(&store, &agent, admin)?;
            println!("{token}");
            Ok(())
        }
        Command::Serve {
            listen,
            db,
            sync,
            max_frame_bytes,
            max_payload_bytes,
            max_connections,
            max_in_flight,
        } => {
            let limits = Limits {
                max_frame_bytes,
                max_payload_bytes,
                max_connections,
                max_in_flight_per_connection: max_in_flight,
                ..Limits::default()
            };
            let runtime = tokio::runtime::Runtime::new()?;
            runtime.block_on(serve(listen, db, sync.into(), limits))
        }
    }
}

async fn serve(
    listen: SocketAddr,
    db: PathBuf,
    sync: Synchronous,
    limits: Limits,
) -> anyhow::Result<()> {
    let store = Arc::new(
        SqliteStore::open(&db, sync).with_context(|| format!("opening {}", db.display()))?,
    );
    let orch = Orchestrator::open(store, limits)?;
    let conversations = orch.hub().len();
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("listening on {listen}"))?;
    let running = server::start(orch, listener).await?;
    println!(
        "orchestrator listening on ws://{}/rpc (database {}, {} conversations)",
        running.local_addr(),
        db.display(),
        conversations
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    shutdown_signal().await;
    eprintln!("orchestrator: stopping");
    running.stop().await;
    eprintln!("orchestrator: stopped; every acknowledged event is on disk");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => {
                    let _ = ctrl_c.await;
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
