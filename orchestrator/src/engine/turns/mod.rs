//! Turn assignments: who is told to speak, and how.
//!
//! When a policy's `next_speaker` decision commits, the publisher hands the conversation to
//! [`Turns`]. At start every conversation is looked at once (recovery: a pending turn is handed
//! out again). A turn of an internal agent goes as an [`Assignment`] to the channel the host
//! wired for the agents that run inside the server; a turn of an agent with push executors registered is offered, with
//! `request_turn`, to one replica at a time: if the replica does not claim it within the claim
//! window, or it disconnects, or its claim expires, the turn is offered to another. A turn of
//! any other agent is left to its pull-mode executor, which follows guidance.
//!
//! Offers and claims live in memory only: after a restart every open turn is offered again.
//! A replica that lost its claim cannot post a second reply, because replies carry the turn as
//! `turnHint` and the first reply closes the turn.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use executors::Assignment;
use proto_spec::{ClaimTurnParams, ClaimTurnResult, ErrorCode, RequestTurnNotification, RpcError};
use tokio::sync::{mpsc, watch, Notify};
use tokio::time::Instant;

use crate::engine::hub::{ConvView, Hub, PreClaim};
use crate::engine::store::{format_ts, now_ms};

pub mod cluster;

/// How turns are handed out.
#[derive(Debug, Clone)]
pub struct TurnConfig {
    /// How long an offered replica has to claim a turn before it is offered to another.
    pub claim_window: Duration,
    /// How long a turn without a policy timeout may take (the claim's lease, and internal
    /// agents' deadline).
    pub default_timeout: Duration,
}

impl Default for TurnConfig {
    fn default() -> Self {
        TurnConfig {
            claim_window: Duration::from_secs(2),
            default_timeout: Duration::from_secs(60),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ClaimState {
    Offered,
    Claimed { deadline_ms: i64 },
    Gone,
}

#[derive(Debug)]
struct Claim {
    conv: Arc<ConvView>,
    /// The principal offered it (its agent id within its tenant).
    agent: String,
    turn: u64,
    replica: u64,
    state: watch::Sender<ClaimState>,
}

#[derive(Debug)]
struct Replica {
    id: u64,
    tx: mpsc::UnboundedSender<RequestTurnNotification>,
}

/// Counters of turn handling.
#[derive(Debug, Default)]
pub struct TurnStats {
    /// Turns handed to the internal executor.
    pub internal: AtomicU64,
    /// `request_turn` offers sent.
    pub offers: AtomicU64,
    /// Claims granted.
    pub claims: AtomicU64,
    /// Offers that went to another replica (not claimed in time, replica gone, claim expired).
    pub reoffers: AtomicU64,
}

/// The turn dispatcher and the push-executor registry.
#[derive(Debug)]
pub struct Turns {
    hub: Arc<Hub>,
    config: TurnConfig,
    internal: Mutex<(HashSet<String>, Option<mpsc::UnboundedSender<Assignment>>)>,
    replicas: Mutex<HashMap<String, Vec<Replica>>>,
    next_pick: Mutex<HashMap<String, usize>>,
    claims: Mutex<HashMap<String, Claim>>,
    registered: Notify,
    assigned: Mutex<HashMap<String, u64>>,
    next_replica: AtomicU64,
    runtime: tokio::runtime::Handle,
    /// On a store several nodes share: the claims that keep each internal turn on one node.
    cluster: std::sync::OnceLock<Arc<cluster::Cluster>>,
    /// Counters.
    pub stats: TurnStats,
}

fn instant_at(epoch_ms: i64) -> Instant {
    let left = epoch_ms - now_ms();
    Instant::now() + Duration::from_millis(left.max(0) as u64)
}

impl Turns {
    /// A dispatcher over `hub`, spawning its offers on `runtime`.
    pub fn new(hub: Arc<Hub>, config: TurnConfig, runtime: tokio::runtime::Handle) -> Arc<Turns> {
        Arc::new(Turns {
            hub,
            config,
            internal: Mutex::default(),
            replicas: Mutex::default(),
            next_pick: Mutex::default(),
            claims: Mutex::default(),
            registered: Notify::new(),
            assigned: Mutex::default(),
            next_replica: AtomicU64::new(1),
            runtime,
            cluster: std::sync::OnceLock::new(),
            stats: TurnStats::default(),
        })
    }

    /// On a store several nodes share: internal turns are claimed in it before they run (see
    /// [`cluster`]). Set before [`Turns::attach`].
    pub fn join_cluster(self: &Arc<Self>, store: Arc<dyn crate::engine::store::Store>) {
        let c = cluster::Cluster::start(store, &self.runtime, self.hub.closing());
        let _ = self.cluster.set(c);
        // Weak, as the turn sink (see `attach`).
        self.hub
            .set_pre_claim(Box::new(PreClaims(Arc::downgrade(self))));
    }

    /// The internal executor that runs `agent`'s turns in `conv` here, if one does: an agent
    /// the conversation's scenario declares, or one of the operator's agents (of the default
    /// tenant).
    fn internal_for(
        &self,
        conv: &ConvView,
        agent: &str,
    ) -> Option<mpsc::UnboundedSender<Assignment>> {
        self.internal.lock().ok().and_then(|i| {
            let ours = conv.agent_spec(agent).is_some()
                || i.0.contains(&*proto_spec::tenant::sibling(&conv.id, agent));
            ours.then(|| i.1.clone()).flatten()
        })
    }

    /// On a cluster, this node's name in the turn claims.
    pub fn node_name(&self) -> Option<&str> {
        self.cluster.get().map(|c| c.holder())
    }

    /// On a cluster, lets go of this node's claims (a graceful stop: other nodes take its turns
    /// at once).
    pub async fn leave_cluster(&self) {
        if let Some(c) = self.cluster.get() {
            c.release().await;
        }
    }

    /// The configuration.
    pub fn config(&self) -> &TurnConfig {
        &self.config
    }

    /// Sends the turns of these agents to an internal executor, and hands out again every
    /// pending turn of theirs.
    pub fn set_internal(
        self: &Arc<Self>,
        agents: HashSet<String>,
        tx: mpsc::UnboundedSender<Assignment>,
    ) {
        if let Ok(mut i) = self.internal.lock() {
            *i = (agents.clone(), Some(tx));
        }
        if let Ok(mut a) = self.assigned.lock() {
            a.clear();
        }
        self.scan();
    }

    /// Looks at every conversation (at start, and when internal agents are set).
    pub fn scan(self: &Arc<Self>) {
        for conv in self.hub.all() {
            self.consider(&conv);
        }
    }

    /// Follows policy decisions: the publisher calls [`Turns::consider`] itself right after
    /// each commit that may change a speaker (no hop through another task), and every
    /// conversation is looked at once now.
    pub fn attach(self: &Arc<Self>, hub: &Hub) {
        // Weak: the dispatcher holds the hub, so a strong handle here would keep both (and
        // the runtime's driver the dispatcher holds) alive after the orchestrator is dropped.
        let me = Arc::downgrade(self);
        hub.set_turn_sink(crate::engine::hub::TurnSink(Box::new(move |conv| {
            if let Some(me) = me.upgrade() {
                me.consider(conv)
            }
        })));
        self.scan();
    }

    /// Hands out the conversation's current turn, once per turn.
    pub fn consider(self: &Arc<Self>, conv: &Arc<ConvView>) {
        let core = conv.core();
        let Some((agent, _)) = core.turn_to_hand_out() else {
            return;
        };
        let agent = agent.to_string();
        {
            let Ok(mut a) = self.assigned.lock() else {
                return;
            };
            if a.get(&conv.id) == Some(&core.turn) {
                return;
            }
            a.insert(conv.id.clone(), core.turn);
        }
        let deadline_ms = conv
            .turn_deadline_ms(&core)
            .unwrap_or_else(|| now_ms() + self.config.default_timeout.as_millis() as i64);
        if let Some(tx) = self.internal_for(conv, &agent) {
            self.stats.internal.fetch_add(1, Ordering::Relaxed);
            crate::engine::telemetry::turn("internal");
            let a = Assignment {
                conversation_id: conv.id.clone(),
                agent_id: agent,
                turn: core.turn,
                deadline: instant_at(deadline_ms),
                since_seq: 0,
                mode: core.mode,
                traces: conv.traces(),
                claim: None,
                stop: None,
                granted: false,
            };
            match self.cluster.get() {
                None => {
                    let _ = tx.send(a);
                }
                Some(c) => {
                    self.runtime
                        .spawn(c.clone().run_claimed(conv.clone(), a, tx));
                }
            }
            return;
        }
        crate::engine::telemetry::turn("push");
        tracing::debug!(conversation = %conv.id, %agent, turn = core.turn, "turn to offer");
        let me = self.clone();
        let conv = conv.clone();
        self.runtime
            .spawn(async move { me.offer(conv, agent, core.turn).await });
    }

    /// Registers a push replica of `agent` (a principal's key: its agent id within its
    /// tenant); its offers arrive on the receiver.
    pub fn register(&self, agent: &str) -> (u64, mpsc::UnboundedReceiver<RequestTurnNotification>) {
        let id = self.next_replica.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = mpsc::unbounded_channel();
        if let Ok(mut r) = self.replicas.lock() {
            r.entry(agent.to_string())
                .or_default()
                .push(Replica { id, tx });
        }
        self.registered.notify_waiters();
        (id, rx)
    }

    /// Forgets a replica; its offers and claims go to another replica.
    pub fn unregister(&self, agent: &str, id: u64) {
        if let Ok(mut r) = self.replicas.lock() {
            if let Some(list) = r.get_mut(agent) {
                list.retain(|x| x.id != id);
            }
        }
        if let Ok(claims) = self.claims.lock() {
            for c in claims.values().filter(|c| c.replica == id) {
                c.state.send_replace(ClaimState::Gone);
            }
        }
    }

    /// How many push replicas `agent` has.
    pub fn replicas_of(&self, agent: &str) -> usize {
        self.replicas
            .lock()
            .map(|r| r.get(agent).map_or(0, Vec::len))
            .unwrap_or(0)
    }

    fn pick(
        &self,
        agent: &str,
        tried: &HashSet<u64>,
    ) -> Option<(u64, mpsc::UnboundedSender<RequestTurnNotification>)> {
        let r = self.replicas.lock().ok()?;
        let list = r.get(agent)?;
        if list.is_empty() {
            return None;
        }
        let mut next = self.next_pick.lock().ok()?;
        let start = next.entry(agent.to_string()).or_insert(0);
        for k in 0..list.len() {
            let rep = &list[(*start + k) % list.len()];
            if !tried.contains(&rep.id) {
                *start = (*start + k + 1) % list.len();
                return Some((rep.id, rep.tx.clone()));
            }
        }
        None
    }

    fn drop_claim(&self, claim_id: &str) {
        if let Ok(mut c) = self.claims.lock() {
            if let Some(c) = c.remove(claim_id) {
                c.state.send_replace(ClaimState::Gone);
            }
        }
    }

    /// Offers one turn until it is answered, closed, or taken from the agent (to the replicas
    /// of the agent of the conversation's tenant).
    async fn offer(self: Arc<Self>, conv: Arc<ConvView>, agent: String, turn: u64) {
        let principal = proto_spec::tenant::sibling(&conv.id, &agent).into_owned();
        let mut head = conv.watch();
        let mut closing = self.hub.closing();
        let mut tried = HashSet::new();
        let mut first = true;
        loop {
            // A deleted conversation keeps its last state in a view that readers may still hold.
            if *closing.borrow() || conv.deleted() || !conv.core().holds_turn(&agent, turn) {
                return;
            }
            let Some((replica, tx)) = self.pick(&principal, &tried) else {
                if !tried.is_empty() {
                    tried.clear();
                    continue;
                }
                // Nobody to offer it to (a pull-mode agent, or replicas not connected yet).
                let registered = self.registered.notified();
                tokio::select! {
                    _ = registered => {}
                    _ = head.changed() => {}
                    _ = closing.changed() => {}
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
                continue;
            };
            if !first {
                self.stats.reoffers.fetch_add(1, Ordering::Relaxed);
            }
            first = false;
            let (offer, mut state_rx) = self.open_claim(&conv, &principal, turn, replica);
            let claim_id = offer.claim_id.clone();
            tracing::debug!(conversation = %conv.id, %agent, turn, replica, claim = %claim_id, "turn offered");
            if tx.send(offer).is_err() {
                self.drop_claim(&claim_id);
                tried.insert(replica);
                continue;
            }
            // Wait for the claim, within the claim window.
            let window = tokio::time::sleep(self.config.claim_window);
            tokio::pin!(window);
            let claimed = loop {
                let s = *state_rx.borrow_and_update();
                match s {
                    ClaimState::Claimed { deadline_ms } => break Some(deadline_ms),
                    ClaimState::Gone => break None,
                    ClaimState::Offered => {}
                }
                tokio::select! {
                    r = state_rx.changed() => if r.is_err() { break None },
                    _ = &mut window => break None,
                    _ = head.changed() => {
                        if !conv.core().holds_turn(&agent, turn) {
                            self.drop_claim(&claim_id);
                            return;
                        }
                    }
                    _ = closing.changed() => {}
                }
            };
            let Some(deadline_ms) = claimed else {
                self.drop_claim(&claim_id);
                // The replica may have been granted the turn in the database and gone at once
                // (this loop then sees only `Gone`): let that claim go too.
                self.release_push(&conv, turn, &claim_id).await;
                tried.insert(replica);
                continue;
            };
            // Claimed: wait for the answer, the claim's expiry, or the replica to go.
            let expiry = tokio::time::sleep_until(instant_at(deadline_ms));
            tokio::pin!(expiry);
            loop {
                if !conv.core().holds_turn(&agent, turn) {
                    self.drop_claim(&claim_id);
                    return;
                }
                tokio::select! {
                    r = state_rx.changed() => {
                        if r.is_err() || *state_rx.borrow() == ClaimState::Gone { break }
                    }
                    _ = &mut expiry => break,
                    _ = head.changed() => {}
                    _ = closing.changed() => return,
                }
            }
            self.drop_claim(&claim_id);
            // The replica went or its claim expired: another may be granted the turn.
            self.release_push(&conv, turn, &claim_id).await;
            tried.insert(replica);
        }
    }

    /// On a cluster, lets go of the database claim a push replica's claim `claim_id` may hold.
    async fn release_push(&self, conv: &ConvView, turn: u64, claim_id: &str) {
        if let Some(cluster) = self.cluster.get() {
            let holder = self.push_holder(cluster, claim_id);
            cluster.release_push(&conv.id, turn, holder).await;
        }
    }

    /// The name a push replica's claim holds a turn under in the database.
    fn push_holder(&self, cluster: &cluster::Cluster, claim_id: &str) -> String {
        format!("{}/{claim_id}", cluster.holder())
    }

    /// Records a claim of `turn` offered to `replica`: the `request_turn` to send it, and the
    /// claim's state to wait on.
    fn open_claim(
        &self,
        conv: &Arc<ConvView>,
        agent: &str,
        turn: u64,
        replica: u64,
    ) -> (RequestTurnNotification, watch::Receiver<ClaimState>) {
        let claim_id = uuid::Uuid::new_v4().simple().to_string();
        let (state, state_rx) = watch::channel(ClaimState::Offered);
        if let Ok(mut c) = self.claims.lock() {
            c.insert(
                claim_id.clone(),
                Claim {
                    conv: conv.clone(),
                    agent: agent.to_string(),
                    turn,
                    replica,
                    state,
                },
            );
        }
        self.stats.offers.fetch_add(1, Ordering::Relaxed);
        let offer = RequestTurnNotification {
            conversation_id: conv.id.clone(),
            agent_id: proto_spec::tenant::local_id(agent).to_string(),
            claim_id,
            turn,
            deadline_ms: self.lease(conv).as_millis() as u64,
            since_seq: 0,
            mode: Some(conv.core().mode),
        };
        (offer, state_rx)
    }

    /// How long a claim granted now lasts: until the turn's deadline when it has one (so a
    /// replica stops when the turn's time is up), the default timeout otherwise.
    fn lease(&self, conv: &ConvView) -> Duration {
        match conv.turn_deadline_ms(&conv.core()) {
            Some(d) => Duration::from_millis((d - now_ms()).max(1) as u64),
            None => self.config.default_timeout,
        }
    }

    /// `claimTurn`: the offered replica takes the turn. Claiming again a claim this agent holds
    /// answers the same (a retry after a lost answer). On a cluster every node offers the turn
    /// to its own replicas, and the grant is taken in the database: one replica cluster-wide.
    pub async fn claim(
        &self,
        principal: &str,
        p: &ClaimTurnParams,
    ) -> Result<ClaimTurnResult, RpcError> {
        let not_found = || {
            RpcError::new(
                ErrorCode::ClaimNotFound,
                format!("claim {} is unknown, expired or taken", p.claim_id),
            )
        };
        let (conv, turn, offered) = {
            let claims = self.claims.lock().map_err(|_| not_found())?;
            let c = claims.get(&p.claim_id).ok_or_else(not_found)?;
            let agent = proto_spec::tenant::local_id(principal);
            if c.agent != principal || !c.conv.core().holds_turn(agent, c.turn) {
                return Err(not_found());
            }
            let offered = *c.state.borrow() == ClaimState::Offered;
            (c.conv.clone(), c.turn, offered)
        };
        if offered {
            if let Some(cluster) = self.cluster.get() {
                if !cluster
                    .claim_push(&conv, turn, self.push_holder(cluster, &p.claim_id))
                    .await
                {
                    self.drop_claim(&p.claim_id);
                    return Err(RpcError::new(
                        ErrorCode::ClaimNotFound,
                        format!(
                            "claim {}: turn {turn} of conversation {} was claimed by a replica on another node",
                            p.claim_id, conv.id
                        ),
                    ));
                }
            }
        }
        let gone = || async {
            // Granted in the database just as the offer was withdrawn here: let it go.
            if offered {
                self.release_push(&conv, turn, &p.claim_id).await;
            }
            not_found()
        };
        let state = match self
            .claims
            .lock()
            .map_err(|_| not_found())?
            .get(&p.claim_id)
        {
            Some(c) => *c.state.borrow(),
            None => ClaimState::Gone,
        };
        if state == ClaimState::Gone {
            return Err(gone().await);
        }
        let claims = self.claims.lock().map_err(|_| not_found())?;
        let c = claims.get(&p.claim_id).ok_or_else(not_found)?;
        let deadline_ms = match state {
            ClaimState::Gone => return Err(not_found()),
            ClaimState::Claimed { deadline_ms } => deadline_ms,
            ClaimState::Offered => {
                let d = now_ms() + self.lease(&c.conv).as_millis() as i64;
                c.state.send_replace(ClaimState::Claimed { deadline_ms: d });
                self.stats.claims.fetch_add(1, Ordering::Relaxed);
                d
            }
        };
        Ok(ClaimTurnResult {
            granted: true,
            conversation_id: c.conv.id.clone(),
            turn: c.turn,
            deadline: format_ts(deadline_ms),
        })
    }
}

/// The turn dispatcher as the writer's [`PreClaim`] on a cluster: the turns this node's
/// internal executor runs are claimed in the commit that opens them, and the run finds its
/// claim held ([`cluster::Cluster::granted`]) instead of asking the database again.
struct PreClaims(std::sync::Weak<Turns>);

impl PreClaim for PreClaims {
    fn holder(&self) -> String {
        self.0
            .upgrade()
            .and_then(|t| t.node_name().map(str::to_string))
            .unwrap_or_default()
    }

    fn runs_here(&self, conv: &ConvView, agent: &str) -> bool {
        self.0
            .upgrade()
            .is_some_and(|t| t.cluster.get().is_some() && t.internal_for(conv, agent).is_some())
    }

    fn granted(&self, conv: &Arc<ConvView>, turn: u64, fence: i64, sent: Instant) {
        if let Some(c) = self.0.upgrade().and_then(|t| t.cluster.get().cloned()) {
            c.granted(conv, turn, fence, sent);
        }
    }
}
