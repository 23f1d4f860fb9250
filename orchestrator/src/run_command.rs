//! `orchestrator run` and `demo`: one scenario to its end, with a live transcript.

use crate::scenario_files::load_scenarios;
use crate::*;

#[derive(clap::Args, Debug)]
pub(crate) struct RunOpts {
    /// Keep the conversation in this database: a SQLite file or postgres://USER@HOST:PORT/DB
    /// (default: a temporary SQLite file).
    #[arg(long, env = "ORCHESTRATOR_DB")]
    db: Option<String>,
    /// Where external participants connect, when the scenario has any (port 0: any free one).
    #[arg(long, env = "ORCHESTRATOR_RUN_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Give up after this long (`90s`, `10m`, …); exit status 4.
    #[arg(long, env = "ORCHESTRATOR_RUN_TIMEOUT", default_value = "10m")]
    timeout: String,
    /// Colours: auto (on a terminal), always, never.
    #[arg(long, env = "ORCHESTRATOR_COLOR", value_enum, default_value_t = Color::Auto)]
    color: Color,
    /// A folder of scenario files, by name, for scenarios that open sub-conversations by name.
    #[arg(long, env = "ORCHESTRATOR_SCENARIOS")]
    scenarios: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) sandbox: SandboxOpts,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub(crate) enum Color {
    Auto,
    Always,
    Never,
}

/// Runs a scenario to its end; the exit status (README: "Exit statuses").
pub(crate) async fn run(scenario: serde_json::Value, opts: RunOpts) -> anyhow::Result<u8> {
    use orchestrator::host::runner::{External, RunSettings};
    use std::io::IsTerminal;
    let limit = orchestrator::engine::scenario::parse_duration(&serde_json::json!(opts.timeout))
        .map_err(|e| anyhow::anyhow!("--timeout: {e}"))?;
    let color = match opts.color {
        Color::Always => true,
        Color::Never => false,
        Color::Auto => std::io::stdout().is_terminal(),
    };
    let temp = tempfile::tempdir()?;
    let db = opts
        .db
        .unwrap_or_else(|| temp.path().join("run.db").display().to_string());
    let store = store::open(&db, Synchronous::Full)
        .with_context(|| format!("opening {}", store::display(&db)))?;
    let sandbox = opts.sandbox.sandbox()?;
    let named = match &opts.scenarios {
        Some(dir) => load_scenarios(dir, &sandbox)?,
        None => Vec::new(),
    };
    let spec = orchestrator::engine::scenario::Scenario::parse(&scenario, &sandbox)
        .map_err(|e| anyhow::anyhow!("{}", e.message))?;
    let mut externals = Vec::new();
    for p in &spec.participants {
        let runs_here = spec
            .policy
            .as_ref()
            .is_some_and(|pol| pol.agents.contains_key(p));
        if !runs_here {
            externals.push(External {
                id: p.clone(),
                token: auth::create_token(store.as_ref(), p, false)?,
            });
        }
    }
    let options = host::Options {
        scenarios: named,
        ..host::Options::with_limits(Limits {
            kinds: std::sync::Arc::new(sandbox),
            ..Limits::default()
        })
    };
    let max_attempts = options.exec_policy.max_attempts;
    let orch = options.start(store)?;
    let mut running = None;
    let mut address = None;
    if !externals.is_empty() {
        let listener =
            server::bind(opts.listen).with_context(|| format!("listening on {}", opts.listen))?;
        let r = server::start(orch.clone(), listener).await?;
        eprintln!(
            "external participants connect to ws://{}/rpc with:",
            r.local_addr()
        );
        for x in &externals {
            eprintln!("  {}: {}", x.id, x.token);
        }
        address = Some(r.local_addr().to_string());
        running = Some(r);
    }
    let settings = RunSettings {
        color,
        limit,
        max_attempts,
        externals,
        address,
    };
    let mut out = std::io::stdout();
    let result = tokio::select! {
        r = orchestrator::host::runner::run(orch.clone(), scenario, &mut out, &settings) => r.map(|s| s.end.exit_code()),
        code = interruption() => {
            eprintln!("orchestrator: interrupted");
            Ok(code)
        }
    };
    match running {
        Some(r) => r.stop().await,
        None => orch.shutdown().await,
    }
    match result {
        Ok(code) => Ok(code),
        // The reader went away (`| head`): nothing more to say, to anyone.
        Err(orchestrator::engine::error::Error::Transcript(e))
            if e.kind() == std::io::ErrorKind::BrokenPipe =>
        {
            Ok(0)
        }
        Err(e) => Err(anyhow::anyhow!("{e}")),
    }
}
