//! [`InternalExecutor`]: runs the server's own agents when the orchestrator assigns them a turn.

use std::collections::HashMap;
use std::sync::Arc;

use agent_sdk::{Agent, ExecutorClient};
use tokio::sync::mpsc;

use crate::core::{Assignment, ExecutorCore, RunReport};

/// Makes the client an agent speaks through for an assignment (inside the server: an
/// in-process client with the agent's identity, scoped to the conversation that declares it).
pub type ClientFactory = Arc<dyn Fn(&Assignment) -> Arc<dyn ExecutorClient> + Send + Sync>;

/// Finds the agent for an assignment that is not one of the executor's fixed agents (such as
/// a participant a scenario describes).
pub type AgentResolver = Arc<dyn Fn(&Assignment) -> Option<Arc<dyn Agent>> + Send + Sync>;

/// Runs internal agents on the turns it is handed.
#[derive(Clone)]
pub struct InternalExecutor {
    core: Arc<ExecutorCore>,
    agents: Arc<HashMap<String, Arc<dyn Agent>>>,
    clients: ClientFactory,
    resolve: Option<AgentResolver>,
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
            resolve: None,
        }
    }

    /// Also runs the agents `resolve` finds for assignments of other agents.
    pub fn with_resolver(mut self, resolve: AgentResolver) -> Self {
        self.resolve = Some(resolve);
        self
    }

    /// Whether this executor runs `agent_id`.
    pub fn runs(&self, agent_id: &str) -> bool {
        self.agents.contains_key(agent_id)
    }

    /// Runs one assignment to its end (None when the agent is not one of this executor's).
    pub async fn run_one(&self, a: &Assignment) -> Option<RunReport> {
        let agent = match self.agents.get(&a.agent_id) {
            Some(agent) => agent.clone(),
            None => {
                // Building an agent from its description may compile code or load TLS roots:
                // done on a blocking thread, never on the async threads.
                let resolve = self.resolve.clone()?;
                let assignment = a.clone();
                tokio::task::spawn_blocking(move || resolve(&assignment))
                    .await
                    .ok()??
            }
        };
        let client = (self.clients)(a);
        let run = self.core.run(agent.as_ref(), client, a);
        match a.stop.clone() {
            None => Some(run.await),
            // The claim was lost (another node runs the turn now): the agent is stopped, not
            // left to finish work whose writes would be refused.
            Some(mut stop) => tokio::select! {
                report = run => Some(report),
                // A dropped sender means the claim is no longer watched (the turn moved on): the
                // run finishes.
                Ok(_) = stop.wait_for(|s| *s) => {
                    tracing::info!(conversation = %a.conversation_id, agent = %a.agent_id, turn = a.turn, "turn stopped: its claim was lost");
                    None
                }
            },
        }
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
