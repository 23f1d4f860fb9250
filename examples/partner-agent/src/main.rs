//! An external agent in 30 lines: it answers every turn the orchestrator gives it.
//! Run: ORCHESTRATOR_URL=ws://127.0.0.1:7300/rpc ORCHESTRATOR_TOKEN=oct_… partner-agent [push|pull]
use std::sync::Arc;

use agent_sdk::proto::Finality;
use agent_sdk::{
    async_trait, Agent, AgentContext, AgentError, TurnOutcome, WsConfig, WsJsonRpcClient,
};
use executors::{ExecutorCore, ExternalExecutor};

struct Echo;

#[async_trait]
impl Agent for Echo {
    async fn handle_turn(&self, ctx: &AgentContext) -> Result<TurnOutcome, AgentError> {
        let history = ctx.history().await?;
        let last = history
            .last()
            .map(|m| m.payload_value()["text"].as_str().unwrap_or("").to_string());
        ctx.say(
            format!("You said: {}", last.unwrap_or_default()),
            Finality::Turn,
        )
        .await?;
        Ok(TurnOutcome::Posted)
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url =
        std::env::var("ORCHESTRATOR_URL").unwrap_or_else(|_| "ws://127.0.0.1:7300/rpc".into());
    let token = std::env::var("ORCHESTRATOR_TOKEN")?;
    let client = WsJsonRpcClient::connect(WsConfig::new(url, token)).await?;
    let executor = ExternalExecutor::new(
        Arc::new(client),
        Arc::new(Echo),
        Arc::new(ExecutorCore::default()),
    );
    match std::env::args().nth(1).as_deref() {
        Some("pull") => executor.run_pull().await?,
        _ => executor.run_push().await?,
    }
    Ok(())
}
