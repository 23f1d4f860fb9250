//! [`InternalExecutor`]: runs the server's own agents when the orchestrator assigns them a turn.

use std::collections::HashMap;
use std::sync::Arc;

use agent_sdk::{Agent, AgentClient};
use tokio::sync::mpsc;

use crate::core::{Assignment, ExecutorCore, RunReport};

/// Makes the client an agent speaks through, by agent id (inside the server: an in-process
/// client with that identity).
pub type ClientFactory = Arc<dyn Fn(&str) -> Arc<dyn AgentClient> + Send + Sync>;

/// Runs internal agents on the turns it is handed.
#[derive(Clone)]
pub struct InternalExecutor {
    core: Arc<ExecutorCore>,
    agents: Arc<HashMap<String, Arc<dyn Agent>>>,
    clients: ClientFactory,
}

impl std::fmt::Debug for InternalExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InternalExecutor")
            .field("agents", &self.agents.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl InternalExecutor {
    /// An executor for these agents (by agent id).
    pub fn new(
        core: Arc<ExecutorCore>,
        agents: HashMap<String, Arc<dyn Agent>>,
        clients: ClientFactory,
    ) -> Self {
        InternalExecutor {
            core,
            agents: Arc::new(agents),
            clients,
        }
    }

    /// Whether this executor runs `agent_id`.
    pub fn runs(&self, agent_id: &str) -> bool {
        self.agents.contains_key(agent_id)
    }

    /// Runs one assignment to its end (None when the agent is not one of this executor's).
    pub async fn run_one(&self, a: &Assignment) -> Option<RunReport> {
        let agent = self.agents.get(&a.agent_id)?.clone();
        let client = (self.clients)(&a.agent_id);
        Some(self.core.run(agent.as_ref(), client, a).await)
    }

    /// Takes assignments from `source` until it closes, each on its own task.
    pub fn spawn(
        self,
        mut source: mpsc::UnboundedReceiver<Assignment>,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            while let Some(a) = source.recv().await {
                let me = self.clone();
                tokio::spawn(async move {
                    let report = me.run_one(&a).await;
                    tracing::debug!(conversation = %a.conversation_id, agent = %a.agent_id, turn = a.turn, ?report, "internal turn ran");
                });
            }
        })
    }
}
