//! The `orchestrator` command: serve the protocol, run scenarios, and mint tokens.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use orchestrator::engine::auth;
use orchestrator::engine::config::Limits;
use orchestrator::engine::store::{self, sqlite::Synchronous};
use orchestrator::host;
use orchestrator::transport::server;

mod conversations_cli;
mod inspect;
mod run_command;
mod scenario_files;
mod shares;
mod tokens;

use run_command::{run, RunOpts};
use scenario_files::{load_scenarios, scenario_value, SandboxOpts};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The runtime `serve` runs on: tokio's multi-threaded one, whose worker threads, as they go
/// idle, give the memory freed on them back to the system (at most once a second each), so
/// that a burst of connections does not leave its memory held once it has closed.
fn serving_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_park(|| memory_release::on_idle(std::time::Duration::from_secs(1)))
        // A blocking-pool thread (token lookups, reads of the store) gives back what was freed
        // on it when it exits: after a second idle rather than tokio's ten, so that a burst's
        // memory comes back within seconds however many such threads it took.
        .thread_keep_alive(std::time::Duration::from_secs(1))
        .build()
}

#[derive(Parser, Debug)]
#[command(
    name = "orchestrator",
    version,
    about = "A conversation orchestrator: durable event logs, turns, fanout"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How logs are written to stderr: text (coloured only on a terminal) or json (one object
    /// a line). ORCHESTRATOR_LOG filters them (`serve`: info by default; the others: warn).
    #[arg(long, global = true, env = "ORCHESTRATOR_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

/// `serve`'s flags: where to listen, the database, and the limits every client is held to.
#[derive(clap::Args, Debug)]
struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "ORCHESTRATOR_LISTEN", default_value = "127.0.0.1:7300")]
    listen: SocketAddr,
    /// The database: a SQLite file (created if missing) or postgres://USER@HOST:PORT/DB.
    #[arg(long, env = "ORCHESTRATOR_DB", default_value = "orchestrator.db")]
    db: String,
    /// full: every acknowledged event survives power loss; normal: survives a process crash.
    #[arg(long, env = "ORCHESTRATOR_SYNC", value_enum, default_value_t = SyncMode::Full)]
    sync: SyncMode,
    /// Largest WebSocket frame, in bytes.
    #[arg(long, env = "ORCHESTRATOR_MAX_FRAME_BYTES", default_value_t = Limits::default().max_frame_bytes)]
    max_frame_bytes: u32,
    /// Largest message or trace payload, in bytes.
    #[arg(long, env = "ORCHESTRATOR_MAX_PAYLOAD_BYTES", default_value_t = Limits::default().max_payload_bytes)]
    max_payload_bytes: usize,
    /// Most open WebSocket connections.
    #[arg(long, env = "ORCHESTRATOR_MAX_CONNECTIONS", default_value_t = Limits::default().max_connections)]
    max_connections: u32,
    /// Most open sockets, whatever they carry (WebSocket, SSE, long-poll, plain requests).
    #[arg(long, env = "ORCHESTRATOR_MAX_SOCKETS", default_value_t = Limits::default().max_sockets)]
    max_sockets: usize,
    /// How long a request head, or a request body, may take to arrive, in milliseconds.
    #[arg(long, env = "ORCHESTRATOR_HEADER_TIMEOUT_MS", default_value_t = Limits::default().header_timeout.as_millis() as u64)]
    header_timeout_ms: u64,
    /// Most calls in flight on one connection.
    #[arg(long, env = "ORCHESTRATOR_MAX_IN_FLIGHT", default_value_t = Limits::default().max_in_flight_per_connection)]
    max_in_flight: usize,
    /// Most open SSE streams and parked long-polls at once.
    #[arg(long, env = "ORCHESTRATOR_MAX_STREAMS", default_value_t = Limits::default().max_streams)]
    max_streams: usize,
    /// Most open SSE streams and parked long-polls of one agent at once.
    #[arg(long, env = "ORCHESTRATOR_MAX_STREAMS_PER_AGENT", default_value_t = Limits::default().max_streams_per_agent)]
    max_streams_per_agent: usize,
    /// Requests a second one identity may make on this node, over all its connections and
    /// streams (RateLimited / HTTP 429 beyond); 0 for no limit.
    #[arg(long, env = "ORCHESTRATOR_RATE_LIMIT", default_value_t = Limits::default().rate_per_identity)]
    rate_limit: u32,
    /// How many requests an identity may make at once above --rate-limit.
    #[arg(long, env = "ORCHESTRATOR_RATE_BURST", default_value_t = Limits::default().rate_burst)]
    rate_burst: u32,
    /// How long a new WebSocket connection may take to authenticate, in milliseconds.
    #[arg(long, env = "ORCHESTRATOR_AUTH_TIMEOUT_MS", default_value_t = Limits::default().auth_timeout.as_millis() as u64)]
    auth_timeout_ms: u64,
    /// How long a WebSocket connection may stay with no call and nothing open (no
    /// subscription, no registration), in milliseconds, before it is closed.
    #[arg(long, env = "ORCHESTRATOR_IDLE_TIMEOUT_MS", default_value_t = Limits::default().idle_timeout.as_millis() as u64)]
    idle_timeout_ms: u64,
    /// The longest long-poll wait, in milliseconds; longer timeouts are capped to it.
    #[arg(long, env = "ORCHESTRATOR_MAX_WAIT_MS", default_value_t = Limits::default().max_wait.as_millis() as u64)]
    max_wait_ms: u64,
    /// The largest scenario a createConversation may give inline, in bytes (JSON).
    #[arg(long, env = "ORCHESTRATOR_MAX_SCENARIO_BYTES", default_value_t = Limits::default().max_scenario_bytes)]
    max_scenario_bytes: usize,
    /// How deep sub-conversations may nest.
    #[arg(long, env = "ORCHESTRATOR_MAX_DEPTH", default_value_t = Limits::default().max_depth)]
    max_depth: u32,
    /// How many sub-conversations one conversation may have open at once.
    #[arg(long, env = "ORCHESTRATOR_MAX_CHILDREN", default_value_t = Limits::default().max_children)]
    max_children: u32,
    /// How many sub-conversations one tree (under one top-level conversation, at every
    /// depth) may have open at once; 0: no cap.
    #[arg(long, env = "ORCHESTRATOR_MAX_TREE", default_value_t = Limits::default().max_tree)]
    max_tree: u32,
    /// How many open conversations one agent may have created (an admin's top-level ones,
    /// any agent's sub-conversations and forks); 0: no cap.
    #[arg(long, env = "ORCHESTRATOR_MAX_OPEN_PER_AGENT", default_value_t = Limits::default().max_open_per_agent)]
    max_open_per_agent: u32,
    /// A folder of scenario files (*.yaml, *.yml, *.json), offered by name to createConversation.
    #[arg(long, env = "ORCHESTRATOR_SCENARIOS")]
    scenarios: Option<PathBuf>,
    /// How often the tokens of open connections are checked, in milliseconds: a revoked or
    /// expired token loses its connections and streams within this long.
    #[arg(long, env = "ORCHESTRATOR_TOKEN_RECHECK_MS", default_value_t = Limits::default().token_recheck.as_millis() as u64)]
    token_recheck_ms: u64,
    /// Print the limits these flags make, every one by name, and exit without serving.
    #[arg(long, env = "ORCHESTRATOR_PRINT_LIMITS")]
    print_limits: bool,
    /// Serve over TLS (wss://, https://) with this certificate chain (PEM, the server's
    /// certificate first); reloaded on SIGHUP. With --tls-key.
    #[arg(long, env = "ORCHESTRATOR_TLS_CERT")]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(long, env = "ORCHESTRATOR_TLS_KEY")]
    tls_key: Option<PathBuf>,
    #[command(flatten)]
    shares: shares::ShareOpts,
    #[command(flatten)]
    sandbox: SandboxOpts,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Serve JSON-RPC over WebSocket at /rpc (and /healthz) on one port.
    Serve(Box<ServeArgs>),
    /// Run one scenario to its end, printing the transcript live, then a summary.
    Run {
        /// The scenario file (YAML or JSON).
        scenario: PathBuf,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Run a built-in multi-agent scenario (no files needed).
    Demo {
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Manage tokens.
    Token {
        #[command(subcommand)]
        command: tokens::TokenCommand,
    },
    /// Manage tenants.
    Tenant {
        #[command(subcommand)]
        command: tokens::TenantCommand,
    },
    /// Print a conversation's events (after --since), and with --follow each new one until it
    /// closes; from a database (--db) or a running server (--url, --token).
    Tail {
        /// The conversation.
        conversation: String,
        /// Only events after this seq.
        #[arg(long, env = "ORCHESTRATOR_SINCE", default_value_t = 0)]
        since: u64,
        /// Keep printing new events until the conversation closes (Ctrl-C to stop).
        #[arg(long, short = 'f', env = "ORCHESTRATOR_FOLLOW")]
        follow: bool,
        /// One JSON event per line (the protocol's form) instead of text.
        #[arg(long, env = "ORCHESTRATOR_JSON")]
        json: bool,
        #[command(flatten)]
        target: inspect::Target,
    },
    /// List, show and export conversations, from a database (--db) or a running server (--url,
    /// --token).
    Conversations {
        #[command(subcommand)]
        command: conversations_cli::ConversationsCommand,
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

/// The routes one `serve` port answers, for `--help`.
const ROUTES: &str = "\
Routes (one port; every conversation route needs Authorization: Bearer <token>):
  /rpc                              JSON-RPC 2.0 over WebSocket (proto-spec/PROTOCOL.md)
  GET  /                            the console
  GET  /healthz                     liveness (no token)
  GET  /metrics                     Prometheus metrics (no token)
  GET  /openapi.json                the HTTP routes as OpenAPI (no token)
  GET  /me                          who the token speaks as
  GET  /scenarios                   the scenario library (admin)
  GET  /conversations               the caller's conversations
  POST /conversations               create one (admin)
  GET  /conversations/{id}          a snapshot with guidance
  POST /conversations/{id}/messages post a message (Idempotency-Key header)
  GET  /conversations/{id}/events   Server-Sent Events from a cursor (Last-Event-ID)
  GET  /conversations/{id}/wait     long-poll for the next change
  POST /conversations/{id}/pause    pause (admin)
  POST /conversations/{id}/resume   resume (admin)";

/// Every environment variable the commands read, with the flags it stands for: generated from
/// the command definitions, so that it cannot drift from them.
fn environment(cmd: &clap::Command) -> String {
    let mut vars: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    fn walk(
        cmd: &clap::Command,
        path: &str,
        vars: &mut std::collections::BTreeMap<String, Vec<String>>,
    ) {
        for arg in cmd.get_arguments() {
            if let (Some(env), Some(long)) = (arg.get_env(), arg.get_long()) {
                let uses = vars.entry(env.to_string_lossy().into_owned()).or_default();
                let flag = format!("--{long}");
                if !uses.contains(&flag) {
                    uses.push(flag);
                }
            }
        }
        for sub in cmd.get_subcommands() {
            let name = format!("{path} {}", sub.get_name()).trim().to_string();
            walk(sub, &name, vars);
        }
    }
    walk(cmd, "", &mut vars);
    let width = vars.keys().map(String::len).max().unwrap_or(0);
    let mut out = format!(
        "Environment (each stands for a flag, as each command's --help shows):\n  {:<width$}  the log filter: info, warn, orchestrator=debug, … (serve: info; the others: warn)\n",
        "ORCHESTRATOR_LOG"
    );
    for (var, flags) in vars {
        out.push_str(&format!("  {var:<width$}  {}\n", flags.join(", ")));
    }
    out
}

/// The command line, with the routes and variables in its help.
fn command() -> clap::Command {
    use clap::CommandFactory;
    let cmd = Cli::command();
    let env = environment(&cmd);
    cmd.after_help(format!(
        "{ROUTES}\n\n{env}\nExit statuses of run and demo: 0 closed, 1 error, 2 usage, 3 no more progress, 4 time limit, 130/143 interrupted (README)."
    ))
}

fn main() -> std::process::ExitCode {
    use clap::FromArgMatches;
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    let default = if matches!(cli.command, Command::Serve { .. }) {
        "info"
    } else {
        "warn"
    };
    agent_sdk::host::init_logging_with(default, cli.log_format == LogFormat::Json);
    match dispatch(cli.command) {
        Ok(code) => std::process::ExitCode::from(code),
        Err(e) => {
            eprintln!("orchestrator: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// `serve`: the limits its flags make (printed, with `--print-limits`), the scenario library,
/// then the server until it is stopped.
fn serve_command(args: ServeArgs) -> anyhow::Result<u8> {
    let ServeArgs {
        listen,
        db,
        sync,
        max_frame_bytes,
        max_payload_bytes,
        max_connections,
        max_sockets,
        header_timeout_ms,
        max_in_flight,
        max_streams,
        max_streams_per_agent,
        rate_limit,
        rate_burst,
        auth_timeout_ms,
        idle_timeout_ms,
        max_wait_ms,
        max_scenario_bytes,
        max_depth,
        max_children,
        max_tree,
        max_open_per_agent,
        scenarios,
        token_recheck_ms,
        tls_cert,
        tls_key,
        shares,
        sandbox,
        print_limits,
    } = args;
    let sandbox = sandbox.sandbox()?;
    // A certificate that cannot be read stops the start, before the database is opened.
    let tls = agent_sdk::tls::server_from_flags(tls_cert.as_deref(), tls_key.as_deref())?;
    let limits = Limits {
        max_frame_bytes,
        max_payload_bytes,
        max_connections,
        max_sockets,
        header_timeout: std::time::Duration::from_millis(header_timeout_ms.max(1)),
        max_in_flight_per_connection: max_in_flight,
        max_streams,
        max_streams_per_agent,
        rate_per_identity: rate_limit,
        rate_burst,
        auth_timeout: std::time::Duration::from_millis(auth_timeout_ms.max(1)),
        idle_timeout: std::time::Duration::from_millis(idle_timeout_ms.max(1)),
        max_wait: std::time::Duration::from_millis(max_wait_ms),
        max_scenario_bytes,
        max_depth,
        max_children,
        max_tree,
        max_open_per_agent,
        kinds: std::sync::Arc::new(sandbox.clone()),
        token_recheck: std::time::Duration::from_millis(token_recheck_ms.max(1)),
        ..Limits::default()
    };
    let limits = shares.apply(limits);
    if print_limits {
        println!("{limits:#?}");
        return Ok(0);
    }
    let named = match scenarios {
        Some(dir) => load_scenarios(&dir, &sandbox)?,
        None => Vec::new(),
    };
    let runtime = serving_runtime()?;
    runtime.block_on(serve(listen, db, sync.into(), limits, named, tls))
}

/// Runs a command; its exit status.
fn dispatch(command: Command) -> anyhow::Result<u8> {
    match command {
        Command::Token { command } => tokens::token(command),
        Command::Tenant { command } => tokens::tenant(command),
        Command::Serve(args) => serve_command(*args),
        Command::Run { scenario, opts } => {
            let text = std::fs::read_to_string(&scenario)
                .with_context(|| format!("reading {}", scenario.display()))?;
            let v = scenario_value(&text, &opts.sandbox.sandbox()?)
                .with_context(|| format!("{}", scenario.display()))?;
            tokio::runtime::Runtime::new()?.block_on(run(v, opts))
        }
        Command::Demo { opts } => {
            let v = scenario_value(orchestrator::host::runner::DEMO, &opts.sandbox.sandbox()?)?;
            tokio::runtime::Runtime::new()?.block_on(run(v, opts))
        }
        Command::Tail {
            conversation,
            since,
            follow,
            json,
            target,
        } => tokio::runtime::Runtime::new()?.block_on(async move {
            let source = target.open().await?;
            let print = &mut |e: &proto_spec::Event| {
                inspect::out(&if json {
                    inspect::json_line(e)
                } else {
                    inspect::line(e)
                })
            };
            tokio::select! {
                r = source.tail(&conversation, since, follow, print) => r.map(|()| 0),
                code = interruption() => Ok(code),
            }
        }),
        Command::Conversations { command } => {
            tokio::runtime::Runtime::new()?.block_on(conversations_cli::conversations(command))
        }
    }
}

/// Waits for Ctrl-C or SIGTERM; the exit status that reports it (130 or 143, as a shell
/// does).
async fn interruption() -> u8 {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return 130,
                _ = term.recv() => return 143,
            }
        }
    }
    let _ = tokio::signal::ctrl_c().await;
    130
}

async fn serve(
    listen: SocketAddr,
    db: String,
    sync: Synchronous,
    limits: Limits,
    scenarios: Vec<(String, serde_json::Value)>,
    tls: Option<std::sync::Arc<agent_sdk::tls::ServerTls>>,
) -> anyhow::Result<u8> {
    agent_sdk::host::raise_open_files_limit();
    let store =
        store::open(&db, sync).with_context(|| format!("opening {}", store::display(&db)))?;
    // The scenario library is in place before the first turn runs: turns taken again from the
    // log at start may open sub-conversations by scenario name.
    let options = host::Options {
        scenarios,
        ..host::Options::with_limits(limits)
    };
    // What stops a start is said as it is (a database in use, a schema too new, …).
    let orch = options.start(store).map_err(|e| anyhow::anyhow!("{e}"))?;
    let names = orch.scenario_names();
    if !names.is_empty() {
        eprintln!("scenarios: {}", names.join(", "));
    }
    // On a shared store the node serves at once: it takes the open conversations in after
    // this (and logs when it holds them all), a closed one when first named.
    let conversations = if orch.store().shared() {
        "open conversations taken in after the start".to_string()
    } else {
        format!("{} conversations", orch.hub().len())
    };
    // On a cluster, the node's name in the turn claims (and its logs), new at every start.
    let node = orch
        .turns()
        .node_name()
        .map(|n| format!(", {n}"))
        .unwrap_or_default();
    let listener = server::bind(listen).with_context(|| format!("listening on {listen}"))?;
    if let Some(tls) = &tls {
        tls.reload_on_sighup()?;
    }
    let (ws, http) = if tls.is_some() {
        ("wss", "https")
    } else {
        ("ws", "http")
    };
    let running = server::start_with(orch, listener, tls).await?;
    let addr = running.local_addr();
    println!(
        "orchestrator listening on {ws}://{addr}/rpc, HTTP and the console on {http}://{addr}/ (database {}, {}{node})",
        store::display(&db),
        conversations
    );
    tracing::info!(
        websocket = %format!("{ws}://{addr}/rpc"),
        http = %format!("{http}://{addr}/"),
        console = %format!("{http}://{addr}/"),
        metrics = %format!("{http}://{addr}/metrics"),
        database = %store::display(&db),
        "serving"
    );
    use std::io::Write;
    std::io::stdout().flush()?;
    agent_sdk::host::shutdown_signal().await;
    tracing::info!("stopping: finishing the queued appends, closing connections");
    eprintln!("orchestrator: stopping");
    running.stop().await;
    tracing::info!("stopped; every acknowledged event is on disk");
    eprintln!("orchestrator: stopped; every acknowledged event is on disk");
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every flag of every command can also be given by an environment variable, and the help
    /// lists each variable.
    #[test]
    fn every_flag_has_its_variable_and_the_help_lists_them_all() {
        let mut cmd = command();
        let help = cmd.render_long_help().to_string();
        fn check(cmd: &clap::Command, path: &str, help: &str) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_positional() || ["help", "version"].contains(&id) {
                    continue;
                }
                let env = arg
                    .get_env()
                    .unwrap_or_else(|| panic!("{path} --{id} has no environment variable"));
                let env = env.to_string_lossy();
                assert!(help.contains(&*env), "the help does not list {env}");
            }
            for sub in cmd.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()), help);
            }
        }
        check(&cmd, "orchestrator", &help);
        for word in [
            "ORCHESTRATOR_LOG ",
            "/conversations/{id}/events",
            "/metrics",
            "tail",
            "conversations",
            "token",
        ] {
            assert!(
                help.contains(word),
                "the help does not mention {word}:\n{help}"
            );
        }
    }
}
