//! `orchestrator-conformance`: checks a server against the protocol's conformance vectors and
//! prints a report per capability tier. Exits 0 when nothing failed, 1 when a case failed,
//! 2 when it could not run.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

/// Where `orchestrator serve` listens by default.
const DEFAULT_URL: &str = "ws://127.0.0.1:7300/rpc";

/// Checks a conversation orchestrator against the protocol's conformance vectors.
#[derive(Debug, Parser)]
#[command(name = "orchestrator-conformance", version)]
struct Args {
    /// The server's WebSocket endpoint.
    #[arg(long, env = "ORCHESTRATOR_URL", default_value = DEFAULT_URL)]
    url: String,
    /// An admin's token.
    #[arg(long, env = "ORCHESTRATOR_ADMIN_TOKEN")]
    admin_token: String,
    /// Agents' tokens, as NAME=TOKEN: the vectors speak as `alice`, `bob` and `carol` (three
    /// agents that are not admins); a case that needs a missing one is skipped.
    #[arg(long = "token", value_name = "NAME=TOKEN")]
    tokens: Vec<String>,
    /// The server's HTTP base (default: the WebSocket URL's host, over http).
    #[arg(long)]
    http_url: Option<String>,
    /// Vector files to run instead of the built-in ones (a directory of `*.json`).
    #[arg(long)]
    vectors: Option<PathBuf>,
    /// Only these tiers (core, scenarios, push, http); repeatable.
    #[arg(long = "tier")]
    tiers: Vec<String>,
    /// Only cases whose name contains this.
    #[arg(long)]
    only: Option<String>,
    /// How long a step waits for what it expects, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    step_timeout_ms: u64,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::from(1),
        Err(e) => {
            eprintln!("orchestrator-conformance: {e}");
            std::process::ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<bool, String> {
    let mut tokens = BTreeMap::from([("admin".to_string(), args.admin_token)]);
    for t in args.tokens {
        let (name, token) = t
            .split_once('=')
            .ok_or_else(|| format!("--token {t:?}: expected NAME=TOKEN"))?;
        tokens.insert(name.to_string(), token.to_string());
    }
    let vectors = match &args.vectors {
        Some(dir) => conformance::load_dir(dir)?,
        None => conformance::parse(conformance::EMBEDDED)?,
    };
    for t in &args.tiers {
        if !conformance::TIERS.contains(&t.as_str()) {
            return Err(format!(
                "--tier {t:?}: expected one of {:?}",
                conformance::TIERS
            ));
        }
    }
    let config = conformance::Config {
        http: args
            .http_url
            .unwrap_or_else(|| conformance::Config::http_of(&args.url)),
        url: args.url,
        tokens,
        vectors,
        tiers: args.tiers,
        only: args.only,
        step_timeout: Duration::from_millis(args.step_timeout_ms),
    };
    let report = conformance::run(&config).await?;
    if args.json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.render());
    }
    Ok(report.failures().is_empty())
}
