//! The composition root: opens the orchestrator on a store and wires the agents that run inside
//! the server (the operator's, and every participant a scenario describes by `kind`) to the
//! method core through the in-process client. Nothing in the engine starts an agent; this is
//! the one place that does.

use std::collections::HashMap;
use std::sync::Arc;

use agent_sdk::Agent;

use crate::engine::auth::Identity;
use crate::engine::config::Limits;
use crate::engine::error::Result;
use crate::engine::service::Orchestrator;
use crate::engine::store::Store;
use crate::engine::turns::TurnConfig;

pub mod client;
pub mod kinds;
pub mod runner;

/// What a server starts with besides its store.
#[derive(Default)]
pub struct Options {
    /// The limits in force (the sandbox of server-run agents among them).
    pub limits: Limits,
    /// How turns are offered and claimed.
    pub turn_config: TurnConfig,
    /// Scenarios available by name, in place before the first turn runs.
    pub scenarios: Vec<(String, serde_json::Value)>,
    /// Agents the operator runs inside the server, by id (each speaks as itself).
    pub agents: HashMap<String, Arc<dyn Agent>>,
    /// Deadlines and retries of the internal executor.
    pub exec_policy: executors::ExecPolicy,
}

impl std::fmt::Debug for Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut agents: Vec<&String> = self.agents.keys().collect();
        agents.sort();
        f.debug_struct("Options")
            .field("limits", &self.limits)
            .field("turn_config", &self.turn_config)
            .field("scenarios", &self.scenarios.len())
            .field("agents", &agents)
            .field("exec_policy", &self.exec_policy)
            .finish()
    }
}

impl Options {
    /// Options with these limits, the rest default.
    pub fn with_limits(limits: Limits) -> Self {
        Options {
            limits,
            ..Options::default()
        }
    }

    /// Opens the orchestrator on `store` (rebuilding its state from the log) and starts the
    /// agents that run inside it: every pending turn of theirs is run again.
    pub fn start(self, store: Arc<dyn Store>) -> Result<Arc<Orchestrator>> {
        let orch = Orchestrator::open_with(store, self.limits, self.turn_config, self.scenarios)?;
        start_agents(&orch, self.agents, self.exec_policy);
        Ok(orch)
    }
}

/// Runs agents inside the server: each turn the policy gives one of `agents`, or a participant
/// a scenario describes by `kind`, is run by an [`executors::InternalExecutor`] through an
/// [`client::InProcessClient`]. Each tenant's turns run on an executor of their own, which
/// names conversations by their ids within the tenant, as agents outside the server do (the
/// operator's `agents` are of the default tenant).
fn start_agents(
    orch: &Arc<Orchestrator>,
    agents: HashMap<String, Arc<dyn Agent>>,
    policy: executors::ExecPolicy,
) {
    let ids: std::collections::HashSet<String> = agents.keys().cloned().collect();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<executors::Assignment>();
    let mut operators = Some((agents, ids.clone()));
    let mut tenants: HashMap<String, tokio::sync::mpsc::UnboundedSender<executors::Assignment>> =
        HashMap::new();
    let weak = Arc::downgrade(orch);
    tokio::spawn(async move {
        while let Some(mut a) = rx.recv().await {
            let tenant = proto_spec::tenant::tenant_of(&a.conversation_id).to_string();
            a.conversation_id = proto_spec::tenant::local_id(&a.conversation_id).to_string();
            let to = match tenants.get(&tenant) {
                Some(to) => to,
                None => {
                    let Some(orch) = weak.upgrade() else { return };
                    let (agents, ids) = match tenant.as_str() {
                        proto_spec::tenant::DEFAULT_TENANT => operators.take().unwrap_or_default(),
                        _ => Default::default(),
                    };
                    let to = tenant_executor(&orch, &tenant, agents, ids, policy.clone());
                    tenants.entry(tenant).or_insert(to)
                }
            };
            let _ = to.send(a);
        }
    });
    orch.turns().set_internal(ids, tx);
}

/// The executor of one tenant's turns (`agents`, the operator's, for the default tenant), fed
/// on the sender it answers.
fn tenant_executor(
    orch: &Arc<Orchestrator>,
    tenant: &str,
    agents: HashMap<String, Arc<dyn Agent>>,
    ids: std::collections::HashSet<String>,
    policy: executors::ExecPolicy,
) -> tokio::sync::mpsc::UnboundedSender<executors::Assignment> {
    let factory = client_factory(orch, tenant, ids);
    let core = Arc::new(executors::ExecutorCore::new(policy));
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    executors::InternalExecutor::new(core, agents, factory)
        .with_resolver(scenario_agents(orch, tenant))
        .spawn(rx);
    tx
}

/// The client each assignment of `tenant` runs with. An agent the operator gave the server
/// speaks as itself; one a scenario declares speaks as itself only within that scenario's
/// conversation, on the authority recorded when it was created (docs/security.md).
fn client_factory(
    orch: &Arc<Orchestrator>,
    tenant: &str,
    operators: std::collections::HashSet<String>,
) -> executors::ClientFactory {
    let weak = Arc::downgrade(orch);
    let hub = orch.hub().clone();
    let tenant = tenant.to_string();
    Arc::new(move |a: &executors::Assignment| {
        let key = proto_spec::tenant::key(&tenant, &a.conversation_id);
        let who = if operators.contains(&a.agent_id) {
            Identity::new(a.agent_id.clone(), false)
        } else {
            // None recorded (an older log): no reach beyond its own conversation.
            let authority = hub
                .get(&key)
                .and_then(|c| c.policy().and_then(|p| p.authority.clone()))
                .unwrap_or_default();
            Identity::declared(a.agent_id.clone(), key, authority)
        };
        let fence = a.claim.map(|fence| crate::engine::store::Fence {
            turn: a.turn,
            fence,
        });
        let client: Arc<dyn agent_sdk::ExecutorClient> =
            Arc::new(client::InProcessClient::from_weak(weak.clone(), who).with_fence(fence));
        client
    })
}

/// Builds the participants a scenario describes (`kind: scripted`, …) from the conversation's
/// logged policy: one value per (conversation, participant), kept while the conversation is
/// open. The assignments are of `tenant`'s conversations.
fn scenario_agents(orch: &Arc<Orchestrator>, tenant: &str) -> executors::internal::AgentResolver {
    let hub = orch.hub().clone();
    let tenant = tenant.to_string();
    // Agents are built only with the operator's own sandbox, never a default one in its place:
    // kinds of another implementation run no agent here.
    let sandbox = kinds::sandbox_of(orch.limits()).cloned();
    if sandbox.is_none() {
        tracing::error!(
            "the limits' agent kinds are not the built-in ones: no declared agent will run"
        );
    }
    let made: dashmap::DashMap<(String, String), Arc<dyn Agent>> = dashmap::DashMap::new();
    let quotas = orch.quotas().clone();
    Arc::new(move |a| {
        let id = proto_spec::tenant::key(&tenant, &a.conversation_id);
        let conv = hub.get(&id)?;
        let key = (id, a.agent_id.clone());
        if let Some(agent) = made.get(&key) {
            return Some(agent.clone());
        }
        let spec = conv.agent_spec(&a.agent_id)?;
        let mut agent = agent_kinds::from_spec(spec, sandbox.as_ref()?)?;
        if spec["kind"] == "llm" {
            agent = Arc::new(ModelQuota {
                agent,
                quotas: quotas.clone(),
                tenant: tenant.clone(),
            });
        }
        if made.len() > 10_000 {
            made.retain(|(c, _), _| hub.get(c).is_some_and(|c| !c.core().closed));
        }
        made.insert(key, agent.clone());
        Some(agent)
    })
}

/// A participant that calls a model, held to its tenant's model tokens a day: once they are
/// spent, its turns fail before any call (the executor traces why) until the day is over.
struct ModelQuota {
    agent: Arc<dyn Agent>,
    quotas: Arc<crate::engine::quotas::QuotaBook>,
    tenant: String,
}

#[agent_sdk::async_trait]
impl Agent for ModelQuota {
    async fn handle_turn(
        &self,
        ctx: &agent_sdk::AgentContext,
    ) -> std::result::Result<agent_sdk::TurnOutcome, agent_sdk::AgentError> {
        self.quotas.check_llm(&self.tenant).map_err(|e| e.message)?;
        self.agent.handle_turn(ctx).await
    }
}
