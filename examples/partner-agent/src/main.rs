//! An external agent: it answers every turn the orchestrator gives it (the agent is the 15
//! lines of `Echo`; the rest is the command line around it).
//! Run: ORCHESTRATOR_URL=ws://127.0.0.1:7300/rpc ORCHESTRATOR_TOKEN=oct_… partner-agent [push|pull]
use std::sync::Arc;

use agent_sdk::proto::Finality;
use agent_sdk::{
    async_trait, Agent, AgentClient, AgentContext, AgentError, TurnOutcome, WsConfig,
    WsJsonRpcClient,
};
use executors::{ExecutorCore, ExternalExecutor};

const USAGE: &str = "\
partner-agent: an external agent that answers each of its turns with what it was told.

Usage: partner-agent [push|pull]
  push  the orchestrator offers turns; this replica claims them (several replicas may run)
  pull  this agent asks for its turns

Environment:
  ORCHESTRATOR_URL    the server's WebSocket address (default ws://127.0.0.1:7300/rpc)
  ORCHESTRATOR_TOKEN  the agent's token (required): orchestrator token create --agent ID
  ORCHESTRATOR_LOG    the log filter (default info)";

struct Echo;

#[async_trait]
impl Agent for Echo {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        tracing::info!(conversation = %ctx.conversation_id, turn = ctx.turn, "took turn");
        let history = ctx.history().await?;
        let last = history
            .last()
            .map(|m| m.payload_value()["text"].as_str().unwrap_or("").to_string());
        ctx.say(
            format!("You said: {}", last.unwrap_or_default()),
            Finality::Turn,
        )
        .await?;
        tracing::info!(conversation = %ctx.conversation_id, turn = ctx.turn, "replied");
        Ok(TurnOutcome::Posted)
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    agent_sdk::host::init_logging_with("info", false);
    let mode = match std::env::args().nth(1).as_deref() {
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            return std::process::ExitCode::SUCCESS;
        }
        None | Some("push") => "push",
        Some("pull") => "pull",
        Some(other) => {
            eprintln!("partner-agent: unknown mode {other:?}\n\n{USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    match run(mode).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("partner-agent: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(mode: &str) -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("ORCHESTRATOR_URL").unwrap_or_else(|_| "ws://127.0.0.1:7300/rpc".into());
    let token = std::env::var("ORCHESTRATOR_TOKEN").map_err(|_| {
        "ORCHESTRATOR_TOKEN is not set: mint a token with `orchestrator token create --agent ID` and export it (see --help)"
    })?;
    let client = WsJsonRpcClient::connect(WsConfig::new(url.clone(), token))
        .await
        .map_err(|e| format!("could not connect to {url}: {e}"))?;
    tracing::info!(agent = client.agent_id(), url = %url, mode, "connected");
    let executor = ExternalExecutor::new(
        Arc::new(client),
        Arc::new(Echo),
        Arc::new(ExecutorCore::default()),
    );
    match mode {
        "pull" => executor.run_pull().await?,
        _ => executor.run_push().await?,
    }
    Ok(())
}
