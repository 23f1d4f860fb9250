//! Helpers the cluster suites share: an internal agent that counts its runs, and conversations
//! with a turn policy.

use std::collections::HashMap;
use std::sync::Arc;

use jsonrpsee::core::client::ClientT;
use serde_json::{json, Value};

use crate::{TestServer, P};

/// An internal agent that counts how often each turn of each conversation ran, and answers
/// with the run's number; `hold` keeps a run waiting until released.
#[derive(Debug, Default)]
pub struct Counting {
    /// How often each (conversation, turn) ran.
    pub runs: std::sync::Mutex<HashMap<(String, u64), u32>>,
    /// Runs in all.
    pub total: std::sync::atomic::AtomicU32,
    /// Keeps each run waiting until [`Counting::release`] wakes it.
    pub hold: std::sync::atomic::AtomicBool,
    /// Wakes held runs.
    pub release: tokio::sync::Notify,
    /// Runs that went on to answer (a stopped run never gets here).
    pub answered: std::sync::atomic::AtomicU32,
}

#[agent_sdk::async_trait]
impl agent_sdk::Agent for Counting {
    async fn handle_turn(
        &self,
        ctx: &agent_sdk::AgentContext,
    ) -> Result<agent_sdk::TurnOutcome, agent_sdk::AgentError> {
        let run = 1 + self.total.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if let Ok(mut runs) = self.runs.lock() {
            *runs
                .entry((ctx.conversation_id.clone(), ctx.turn))
                .or_default() += 1;
        }
        if self.hold.load(std::sync::atomic::Ordering::SeqCst) {
            self.release.notified().await;
        }
        self.answered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        ctx.say(format!("run {run}"), proto_spec::Finality::Turn)
            .await?;
        Ok(agent_sdk::TurnOutcome::Posted)
    }
}

/// `agent` as the internal agents `bot1` and `bot2`.
pub fn counting_agents(agent: &Arc<Counting>) -> HashMap<String, Arc<dyn agent_sdk::Agent>> {
    let mut agents: HashMap<String, Arc<dyn agent_sdk::Agent>> = HashMap::new();
    agents.insert("bot1".into(), agent.clone());
    agents.insert("bot2".into(), agent.clone());
    agents
}

/// Creates `id` on `node` with a round-robin policy among `participants`.
pub async fn create_with_policy(node: &TestServer, id: &str, participants: &[&str]) {
    let admin = node.client("admin").await;
    let _: Value = admin
        .request(
            "createConversation",
            P(json!({"conversationId": id, "scenario": {
                "participants": participants, "policy": {"order": "round_robin"}}})),
        )
        .await
        .expect("create");
}
