//! The method core: every protocol method as a plain async function of (identity, params).
//!
//! WebSocket JSON-RPC, the HTTP routes and the in-process client of agents that run inside the
//! server all call these functions; none of them re-implements a rule. Appends go through the writer (and so
//! through the state machine); reads come from the hub's memory or the store.

use std::sync::Arc;

use proto_spec::system::ChangedBy;
use proto_spec::*;

use crate::engine::auth::{hash_token, valid_id, Identity};
use crate::engine::config::Limits;
use crate::engine::error::{refuse, Error, Result};
use crate::engine::fanout::{read_after, Feed, PAGE};
use crate::engine::hub::Hub;
use crate::engine::scenario::Scenario;
use crate::engine::state::AppendRequest;
use crate::engine::store::Store;
use crate::engine::turns::{TurnConfig, Turns};
use crate::engine::writer::WriterHandle;

mod access;
mod append;
mod create;
mod delete;
mod known;
mod list;
mod read;
mod tokens;

pub use append::ForTurn;
pub use known::CATCH_UP_WAIT;

/// The long-poll's wait when the caller names none, in milliseconds.
pub const DEFAULT_WAIT_MS: u64 = 30_000;

/// The orchestrator: the store, the hot state, the writer, the turn dispatcher and the limits.
#[derive(Debug)]
pub struct Orchestrator {
    store: Arc<dyn Store>,
    hub: Arc<Hub>,
    writer: WriterHandle,
    turns: Arc<Turns>,
    limits: Limits,
    scenarios: std::sync::RwLock<std::collections::HashMap<String, serde_json::Value>>,
    /// The tokens of open connections and streams, and their last uses.
    tokens: Arc<crate::engine::auth::Tokens>,
    /// Each identity's request rate.
    rate: crate::engine::rate::RateLimiter,
    /// Each identity's budget of bytes appended.
    appended: crate::engine::rate::RateLimiter,
    /// Open streams, waits and subscriptions, in all and per agent.
    streams: Arc<crate::engine::streams::Streams>,
    /// Each tenant's quotas and what it used of them.
    quotas: Arc<crate::engine::quotas::QuotaBook>,
}

impl Orchestrator {
    /// Rebuilds the state from the log, starts the writer and (inside a tokio runtime) the turn
    /// dispatcher, which hands out every pending turn again. No agent runs inside the server
    /// until the host wires some ([`crate::engine::turns::Turns::set_internal`]); the host
    /// module does that for scenario participants and the operator's agents.
    pub fn open(store: Arc<dyn Store>, limits: Limits) -> Result<Arc<Orchestrator>> {
        Orchestrator::open_with(store, limits, TurnConfig::default(), Vec::new())
    }

    /// [`Orchestrator::open`] with a turn configuration and a library of named scenarios (see
    /// [`Orchestrator::set_scenarios`]), in place before any turn runs: a turn taken again from
    /// the log at start may open a sub-conversation by scenario name at once. Every scenario is
    /// checked before anything is opened.
    pub fn open_with(
        store: Arc<dyn Store>,
        limits: Limits,
        turn_config: TurnConfig,
        scenarios: Vec<(String, serde_json::Value)>,
    ) -> Result<Arc<Orchestrator>> {
        let library = scenario_library(scenarios, &*limits.kinds)?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime)?;
        crate::engine::telemetry::install();
        let hub = Arc::new(Hub::default());
        let quotas = Arc::new(crate::engine::quotas::QuotaBook::new(
            limits.tenant_quotas.clone(),
        ));
        // In force from the first request: read once before serving (usage is exchanged and
        // stored bytes counted by the task below, off the start), then kept current.
        if let Err(e) = quotas.read_quotas(store.as_ref()) {
            tracing::warn!(error = %e, "could not read the tenants' quotas");
        }
        let caps = crate::engine::writer::OpenCaps {
            tenants: Some(quotas.clone()),
            ..limits.open_caps()
        };
        let writer = WriterHandle::start(store.as_ref(), hub.clone(), caps)?;
        let turns = Turns::new(hub.clone(), turn_config, runtime);
        if store.shared() {
            turns.join_cluster(store.clone());
        }
        turns.attach(&hub);
        crate::engine::telemetry::node(
            if store.shared() { "postgres" } else { "sqlite" },
            turns.node_name(),
        );
        crate::engine::timers::spawn(hub.clone(), writer.clone());
        let tokens = Arc::new(crate::engine::auth::Tokens::default());
        crate::engine::auth::spawn_token_recheck(&hub, &store, &tokens, limits.token_recheck);
        crate::engine::quotas::spawn_exchange(&hub, &store, &quotas);
        crate::engine::hub::listing::spawn_filing(&hub);
        Ok(Arc::new(Orchestrator {
            store,
            hub,
            writer,
            turns,
            rate: crate::engine::rate::RateLimiter::new(
                limits.rate_per_identity,
                limits.rate_burst,
            ),
            appended: crate::engine::rate::RateLimiter::bytes(limits.max_append_bytes_per_minute),
            limits,
            scenarios: std::sync::RwLock::new(library),
            tokens,
            streams: Arc::default(),
            quotas,
        }))
    }

    /// Makes scenarios available to `createConversation` by name. Each is checked first; the
    /// first bad one is refused with its name.
    pub fn set_scenarios(&self, named: Vec<(String, serde_json::Value)>) -> Result<()> {
        let map = scenario_library(named, &*self.limits.kinds)?;
        if let Ok(mut s) = self.scenarios.write() {
            *s = map;
        }
        Ok(())
    }

    /// The scenarios of the library, each by its name within its tenant's library and, for a
    /// tenant other than the default, `TENANT/NAME`.
    pub fn scenario_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .scenarios
            .read()
            .map(|s| s.keys().cloned().collect())
            .unwrap_or_default();
        names.sort();
        names
    }

    /// The names of `tenant`'s scenarios.
    fn scenario_names_of(&self, tenant: &str) -> Vec<String> {
        self.scenario_names()
            .into_iter()
            .filter(|k| proto_spec::tenant::tenant_of(k) == tenant)
            .map(|k| proto_spec::tenant::local_id(&k).to_string())
            .collect()
    }

    /// `listScenarios` (admins): each scenario of the caller's tenant's library with its
    /// participants and the kind of those the server runs (never their settings).
    pub fn list_scenarios(&self, who: &Identity) -> Result<ListScenariosResult> {
        if !who.admin || who.scope.is_some() {
            return Err(refuse(
                ErrorCode::Forbidden,
                "only an admin's token may list the scenario library",
            ));
        }
        let library = self
            .scenarios
            .read()
            .map_err(|_| Error::Poisoned("the scenario library"))?;
        let mut scenarios: Vec<ScenarioInfo> = library
            .iter()
            .filter(|(key, _)| proto_spec::tenant::tenant_of(key) == &*who.tenant)
            .map(|(key, v)| {
                let name = proto_spec::tenant::local_id(key);
                let parsed = Scenario::parse(v, &*self.limits.kinds).ok();
                let caller = parsed
                    .as_ref()
                    .and_then(|s| s.spec.caller())
                    .map(str::to_string);
                let agents = parsed
                    .as_ref()
                    .and_then(|s| s.policy.as_ref())
                    .map(|p| p.agents.clone())
                    .unwrap_or_default();
                ScenarioInfo {
                    name: name.to_string(),
                    description: v["description"].as_str().map(str::to_string),
                    participants: parsed
                        .map(|s| s.participants)
                        .unwrap_or_default()
                        .into_iter()
                        .map(|id| ScenarioParticipant {
                            caller: caller.as_deref() == Some(id.as_str()),
                            kind: agents
                                .get(&id)
                                .and_then(|a| a["kind"].as_str().map(str::to_string)),
                            id,
                        })
                        .collect(),
                }
            })
            .collect();
        scenarios.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(ListScenariosResult { scenarios })
    }

    /// The turn dispatcher.
    pub fn turns(&self) -> &Arc<Turns> {
        &self.turns
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Counts an open stream of `who` on `transport` (an SSE stream, a parked long-poll, a
    /// WebSocket subscription) while the slot lives, or refuses it (`RateLimited`) over
    /// `--max-streams` in all or `--max-streams-per-agent` for the agent.
    pub fn open_stream(
        &self,
        who: &Identity,
        transport: &'static str,
    ) -> std::result::Result<crate::engine::streams::StreamSlot, proto_spec::RpcError> {
        self.streams.take(
            &who.principal(),
            transport,
            self.limits.max_streams,
            self.limits.max_streams_per_agent,
        )
    }

    /// Admits one request of `who`, or refuses it with `RateLimited` when the identity is over
    /// its rate, after holding the refusal (see [`crate::engine::rate`]).
    pub async fn admit(&self, who: &Identity) -> std::result::Result<(), proto_spec::RpcError> {
        let Err(refused) = self.rate.take(&who.principal()) else {
            return Ok(());
        };
        tokio::time::sleep(refused.hold).await;
        Err(refused.error)
    }

    /// The tenants' quotas.
    pub fn quotas(&self) -> &Arc<crate::engine::quotas::QuotaBook> {
        &self.quotas
    }

    /// Spends `bytes` of `who`'s budget of bytes appended, or refuses the append
    /// (`QuotaExceeded`), and one of its tenant's appends a second (`TenantQuotaExceeded`).
    /// The agents the server runs for scenarios are not held to their own budget, but to
    /// their tenant's.
    pub(super) fn spend(&self, who: &Identity, bytes: usize) -> Result<()> {
        self.quotas.admit_append(&who.tenant).map_err(Error::Rpc)?;
        self.quotas
            .check_stored(&who.tenant, bytes)
            .map_err(Error::Rpc)?;
        if who.scope.is_some() {
            return Ok(());
        }
        self.appended
            .take_n(&who.principal(), bytes as f64)
            .map_err(|r| Error::Rpc(r.error))
    }

    /// The hot state and fanout.
    pub fn hub(&self) -> &Arc<Hub> {
        &self.hub
    }

    /// The store.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The writer (its counters are in `writer().stats`).
    pub fn writer(&self) -> &WriterHandle {
        &self.writer
    }

    /// Ends waits and feeds, finishes queued appends and stops the writer. Every acknowledged
    /// event is durable before this returns.
    pub async fn shutdown(&self) {
        self.hub.close();
        self.turns.leave_cluster().await;
        self.writer.stop().await;
    }

    /// Checks a token (known, not expired); the identity it speaks as.
    pub async fn authenticate(&self, token: &str) -> Result<Identity> {
        self.authenticate_hash(hash_token(token)).await
    }

    /// [`Orchestrator::authenticate`] for a connection or stream that stays open: also a grant
    /// that says when the token is revoked or expires.
    pub async fn authenticate_held(
        &self,
        token: &str,
    ) -> Result<(Identity, Arc<crate::engine::auth::Grant>)> {
        let hash = hash_token(token);
        let who = self.authenticate_hash(hash.clone()).await?;
        Ok((who, self.tokens.hold(&hash)))
    }

    /// The identity of the token whose hash this is, if it is known and not expired.
    async fn authenticate_hash(&self, hash: String) -> Result<Identity> {
        let store = self.store.clone();
        let key = hash.clone();
        let found = tokio::task::spawn_blocking(move || store.find_token(&key)).await??;
        let now = crate::engine::store::now_ms();
        match found {
            Some(t) if t.expires_ms.is_some_and(|at| at <= now) => Err(refuse(
                ErrorCode::Unauthenticated,
                "this token has expired; ask the operator for a new one (`orchestrator token create`)",
            )),
            Some(t) => {
                self.tokens.used(&hash, now);
                Ok(Identity::of_token(t))
            }
            None => Err(refuse(
                ErrorCode::Unauthenticated,
                "unknown token (never made here, or revoked)",
            )),
        }
    }

    /// The identity of `GET /me`.
    pub fn who_am_i(&self, who: &Identity) -> WhoAmI {
        WhoAmI {
            agent_id: who.agent_id.clone(),
            admin: who.admin,
            tenant: who.tenant.to_string(),
        }
    }

    /// `getConversation`.
    pub async fn get_conversation(
        &self,
        who: &Identity,
        p: ConversationParams,
    ) -> Result<Snapshot> {
        Ok(self
            .readable(who, &p.conversation_id)
            .await?
            .snapshot(&who.agent_id))
    }

    /// On a shared store, lets go of the closed conversations that nobody holds and no client
    /// named for `idle` (they are loaded again when named); how many.
    pub async fn forget_idle(&self, idle: std::time::Duration) -> Result<usize> {
        self.writer.forget_idle(idle).await
    }

    /// `claimTurn`.
    pub async fn claim_turn(&self, who: &Identity, p: ClaimTurnParams) -> Result<ClaimTurnResult> {
        self.turns
            .claim(&who.principal(), &p)
            .await
            .map_err(Error::Rpc)
    }

    /// `forkConversation` (admins): a new conversation that starts with the events of another
    /// up to `atSeq`, then a `forked_from` event; the original is untouched.
    pub async fn fork_conversation(
        &self,
        who: &Identity,
        p: ForkConversationParams,
    ) -> Result<CreateConversationResult> {
        if !who.admin {
            return Err(refuse(
                ErrorCode::Forbidden,
                "only admins fork conversations",
            ));
        }
        let conv = self.readable(who, &p.conversation_id).await?;
        let head = conv.head();
        if p.at_seq == 0 || p.at_seq > head {
            return Err(Error::Rpc(
                RpcError::new(
                    ErrorCode::InvalidParams,
                    format!("atSeq: {} is not in 1..={head}", p.at_seq),
                )
                .with_data(serde_json::json!({"latestSeq": head})),
            ));
        }
        let id = match p.new_conversation_id {
            Some(id) if valid_id(&id) => id,
            Some(id) => {
                return Err(refuse(
                    ErrorCode::InvalidParams,
                    format!(
                    "newConversationId {id:?}: 1-128 characters of letters, digits and . _ : @ -"
                ),
                ))
            }
            None => uuid::Uuid::new_v4().simple().to_string(),
        };
        let mut events = Vec::with_capacity(p.at_seq as usize);
        let mut cursor = 0;
        while cursor < p.at_seq {
            let page = read_after(&self.store, &conv, cursor, PAGE).await?;
            let Some(last) = page.last() else { break };
            cursor = last.seq;
            events.extend(
                page.into_iter()
                    .filter(|e| e.seq <= p.at_seq)
                    .map(|e| (*e).clone()),
            );
        }
        let fork = crate::engine::writer::ForkFrom {
            from: conv.id.clone(),
            events,
        };
        // The fork is of the original's tenant.
        let id = proto_spec::tenant::sibling(&conv.id, &id).into_owned();
        self.writer
            .fork(
                id.clone(),
                conv.participants.clone(),
                who.agent_id.clone(),
                fork,
            )
            .await?;
        Ok(CreateConversationResult {
            conversation_id: id,
        })
    }

    /// `pauseConversation` (admins): messages are refused until it resumes. Pausing a paused
    /// conversation changes nothing and answers the latest seq.
    pub async fn pause_conversation(
        &self,
        who: &Identity,
        p: ConversationParams,
    ) -> Result<SeqResult> {
        self.set_paused(who, p, true).await
    }

    /// `resumeConversation` (admins).
    pub async fn resume_conversation(
        &self,
        who: &Identity,
        p: ConversationParams,
    ) -> Result<SeqResult> {
        self.set_paused(who, p, false).await
    }

    async fn set_paused(
        &self,
        who: &Identity,
        p: ConversationParams,
        pause: bool,
    ) -> Result<SeqResult> {
        if !who.admin {
            return Err(refuse(
                ErrorCode::Forbidden,
                "only admins pause and resume conversations",
            ));
        }
        let conv = self.readable(who, &p.conversation_id).await?;
        let core = conv.core();
        if core.closed {
            return Err(refuse(
                ErrorCode::ConversationClosed,
                format!("conversation {} is closed", p.conversation_id),
            ));
        }
        // Pausing a paused conversation appends nothing: the state machine decides, in the
        // writer, so that two pauses at once append one `paused`.
        let by = ChangedBy {
            by: who.agent_id.clone(),
        };
        let event = if pause {
            SystemEvent::Paused(by)
        } else {
            SystemEvent::Resumed(by)
        };
        let req = AppendRequest::system(&event);
        let r = self.writer.append(conv.id.clone(), req).await?;
        Ok(SeqResult { seq: r.seq })
    }

    /// `subscribe`: a feed of the backlog after `sinceSeq`, then live events.
    pub async fn subscribe(&self, who: &Identity, p: SubscribeParams) -> Result<Feed> {
        // A backlog of every conversation: the closed ones too.
        let backlog = p.since_seq.is_some() || p.cursors.as_ref().is_some_and(|c| !c.is_empty());
        if p.conversation_id.is_none() && backlog {
            self.load_closed_of(who).await;
        }
        match p.conversation_id {
            Some(id) => {
                let conv = self.readable(who, &id).await?;
                let since = p.since_seq.unwrap_or_else(|| conv.head());
                Ok(Feed::one(self.store.clone(), self.hub.clone(), conv, since))
            }
            None if who.scope.is_some() => Err(refuse(
                ErrorCode::Forbidden,
                "an agent a scenario declares subscribes to one conversation at a time",
            )),
            None => {
                // The cursors name conversations as the caller does.
                let cursors = p
                    .cursors
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|(id, seq)| Some((who.key(&id).ok()?, seq)))
                    .collect();
                let feed = Feed::all(
                    self.store.clone(),
                    self.hub.clone(),
                    (&who.tenant, &who.agent_id),
                    p.since_seq,
                    cursors,
                );
                // With the feed listening, this node takes in every commit as it comes; what
                // it left behind before (views no one here followed) is read now, and reaches
                // the feed in order after the view's head.
                self.catch_up(&self.hub.all()).await;
                Ok(feed)
            }
        }
    }
}

/// Scenarios by name, each checked.
fn scenario_library(
    named: Vec<(String, serde_json::Value)>,
    kinds: &dyn crate::engine::kinds::AgentKinds,
) -> Result<std::collections::HashMap<String, serde_json::Value>> {
    let mut map = std::collections::HashMap::new();
    for (name, v) in named {
        Scenario::parse(&v, kinds).map_err(|e| {
            Error::Rpc(RpcError::new(
                e.code,
                format!("scenario {name}: {}", e.message),
            ))
        })?;
        map.insert(name, v);
    }
    Ok(map)
}
