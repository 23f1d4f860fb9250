//! On a cluster, a client's append goes to the one node that writes its conversation.
//!
//! Several nodes that append to the same conversation take turns on it: each batch finds the
//! conversation's head moved by another node, locks it, reads back what the other wrote and
//! only then decides (see the writer's shared path). When each conversation's appends go
//! through one node, the others only take its commits in. So every node on a shared store says
//! every [`BEAT`] that it is alive and where it takes appends (the `nodes` table, with the
//! database's clock), and each conversation has one *writing node* among those seen within
//! [`ALIVE`]: the highest of a hash of (node, conversation) — every node computes the same one
//! from the same list, and when a node comes or goes only that node's share moves.
//!
//! A client's `sendMessage` or `sendTrace` that carries a `clientRequestId` and reaches another
//! node is sent on to the writing node over one WebSocket from node to node (authenticated
//! with the secret the nodes keep in the database, which no client reads), as the client's
//! identity, and its answer is the client's. This decides where an append is *made*, never
//! whether it is right: the writing node runs it through the same state machine, under the same
//! checks, as any append, and any node may still append to any conversation. When the forward
//! cannot be made or answered — the link is down, the node died, no answer within
//! [`FORWARD_WAIT`] — the append is made where it arrived instead: its key makes that safe
//! (were it committed over there too, the second attempt answers with the first's seq). An
//! append without a key is always made where it arrives: a forward cut off after it was sent
//! could not be tried again without the risk of appending twice.
//!
//! After a forwarded answer with seq N, readers on this node wait (at most [`FLOOR_WAIT`])
//! until it has taken in the conversation up to N, so a client reads its own writes on the node
//! it wrote through, as with one node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use agent_sdk::ws::{WsConfig, WsJsonRpcClient};
use agent_sdk::ClientError;
use proto_spec::AppendResult;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::engine::auth::Identity;
use crate::engine::error::{Error, Result};
use crate::engine::store::Store;

/// How often a node says it is alive.
pub const BEAT: Duration = Duration::from_millis(1000);
/// A node not heard from for this long writes no conversation: the others make its appends.
pub const ALIVE: Duration = Duration::from_millis(3000);
/// How long a forwarded append may wait for its answer before it is made here.
pub const FORWARD_WAIT: Duration = Duration::from_secs(5);
/// How long a reader waits for this node to take in what it acknowledged through another.
pub const FLOOR_WAIT: Duration = Duration::from_secs(2);
/// After a failed connection to a node, how long appends for it are made here before the
/// next try.
const RETRY_AFTER: Duration = Duration::from_secs(1);

/// The method a node calls on another: an append made as a client's identity.
pub const FORWARD: &str = "orchestrator.forward";
/// What a node's credential starts with (`node.SECRET.NAME`); no token does.
pub const CREDENTIAL_PREFIX: &str = "node.";

/// A forwarded append: whose, which method, its params as the client sent them.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Forwarded {
    /// The client's agent id, as the forwarding node authenticated it.
    pub agent_id: String,
    /// Whether the client is an admin.
    pub admin: bool,
    /// `sendMessage` or `sendTrace`.
    pub method: String,
    /// The method's params.
    pub params: Box<serde_json::value::RawValue>,
}

/// A node as the `nodes` table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Node {
    name: String,
    url: String,
}

#[derive(Debug)]
enum Linked {
    Connecting,
    Up(WsJsonRpcClient),
    Failed(Instant),
}

/// A link to the node that writes a conversation ([`Peers::link_for`]).
#[derive(Debug, Clone)]
pub struct Link(WsJsonRpcClient);

/// This node's view of the others, and its links to them.
#[derive(Debug)]
pub struct Peers {
    store: Arc<dyn Store>,
    /// This node's name (its name in the turn claims).
    name: String,
    secret: String,
    /// Where the others reach this node (none: it takes no forwarded appends).
    url: RwLock<Option<String>>,
    live: RwLock<Arc<[Node]>>,
    links: Mutex<HashMap<String, Linked>>,
    /// Appends sent on, and of those the ones made here after all (this node's own figures;
    /// the metric is the process's).
    sent: std::sync::atomic::AtomicU64,
    made_here: std::sync::atomic::AtomicU64,
}

/// A stable 64-bit hash (FNV-1a): every build and every node computes the same.
fn score(node: &str, conversation: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in node.bytes().chain([0u8]).chain(conversation.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    // FNV's low bits mix poorly for inputs that differ at their end: finish with a mixer.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

impl Peers {
    /// This node's peers on `store` (a shared one), as node `name`; says it is alive every
    /// [`BEAT`] until `closing`.
    pub fn start(
        store: Arc<dyn Store>,
        name: String,
        closing: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Arc<Peers>> {
        let secret = store
            .node_secret(&crate::engine::auth::generate_token())?
            .ok_or_else(|| Error::Unavailable("the store keeps no node secret".into()))?;
        let peers = Arc::new(Peers {
            store,
            name,
            secret,
            url: RwLock::new(None),
            live: RwLock::new(Arc::from(Vec::new())),
            links: Mutex::default(),
            sent: Default::default(),
            made_here: Default::default(),
        });
        tokio::spawn(beat(Arc::downgrade(&peers), closing));
        Ok(peers)
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How many appends this node sent on to others, and how many of them it made itself
    /// after all (unanswered).
    pub fn forwarded(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.sent.load(Relaxed), self.made_here.load(Relaxed))
    }

    /// How many nodes this one sees alive (itself included, once it says where it is reached).
    pub fn nodes(&self) -> usize {
        self.live.read().map(|l| l.len()).unwrap_or(0)
    }

    /// Takes forwarded appends at `url` (a WebSocket URL of `/rpc` the other nodes reach),
    /// from the next beat on.
    pub fn advertise(&self, url: String) {
        tracing::info!(url = %url, "other nodes forward appends to this node at this URL");
        if let Ok(mut u) = self.url.write() {
            *u = Some(url);
        }
    }

    /// Whether this node says where the others reach it.
    pub fn advertised(&self) -> bool {
        self.url.read().is_ok_and(|u| u.is_some())
    }

    /// [`Peers::advertise`] `url` unless a URL was given already (the one the listener's own
    /// address makes, when the operator named none).
    pub fn advertise_default(&self, url: String) {
        if !self.advertised() {
            self.advertise(url);
        }
    }

    /// The identity of a node's credential, if `token` is one (`node.SECRET.NAME`).
    pub fn node_of(&self, token: &str) -> Option<String> {
        let rest = token.strip_prefix(CREDENTIAL_PREFIX)?;
        let (secret, name) = rest.split_once('.')?;
        use sha2::Digest;
        // Compared as digests: the time taken says nothing about the secret.
        let ok =
            sha2::Sha256::digest(secret.as_bytes()) == sha2::Sha256::digest(self.secret.as_bytes());
        (ok && !name.is_empty()).then(|| format!("node/{name}"))
    }

    fn credential(&self) -> String {
        format!("{CREDENTIAL_PREFIX}{}.{}", self.secret, self.name)
    }

    /// The link to the node that writes `conversation`, when that is another node and a link
    /// to it is up (else the append is made here; a link is opened for the next one).
    fn writer_of(self: &Arc<Self>, conversation: &str) -> Option<WsJsonRpcClient> {
        let live = self.live.read().ok()?.clone();
        if live.len() < 2 {
            return None;
        }
        let best = live.iter().max_by_key(|n| score(&n.name, conversation))?;
        if best.name == self.name {
            return None;
        }
        let mut links = self.links.lock().ok()?;
        match links.get(&best.name) {
            Some(Linked::Up(c)) => return Some(c.clone()),
            Some(Linked::Connecting) => return None,
            Some(Linked::Failed(at)) if at.elapsed() < RETRY_AFTER => return None,
            _ => {}
        }
        links.insert(best.name.clone(), Linked::Connecting);
        let (peers, node) = (Arc::downgrade(self), best.clone());
        let config = WsConfig::new(node.url.clone(), self.credential());
        tokio::spawn(async move {
            let link = match WsJsonRpcClient::connect(config).await {
                Ok(c) => Linked::Up(c),
                Err(e) => {
                    tracing::warn!(node = %node.name, url = %node.url, error = %e, "cannot reach the node that writes some conversations; their appends are made here meanwhile");
                    Linked::Failed(Instant::now())
                }
            };
            if let Some(p) = peers.upgrade() {
                if let Ok(mut links) = p.links.lock() {
                    links.insert(node.name, link);
                }
            }
        });
        None
    }

    /// The link to the node that writes `conversation`, when `who`'s append there is to be
    /// made by another node (a client's, not a scenario's agent's) and the link is up.
    pub fn link_for(self: &Arc<Self>, who: &Identity, conversation: &str) -> Option<Link> {
        if who.scope.is_some() {
            return None;
        }
        self.writer_of(conversation).map(Link)
    }

    /// Sends `who`'s `method` with `params` (its `clientRequestId` set) over `link`; answers
    /// the other node's answer, or `None` when it did not come (make it here: the key makes
    /// that safe). Sent when this is called, in order with the appends sent before it.
    pub fn send(
        self: &Arc<Self>,
        link: Link,
        who: &Identity,
        method: &'static str,
        params: serde_json::Value,
    ) -> impl std::future::Future<Output = Option<Result<AppendResult>>> + Send + 'static {
        let call = serde_json::json!({
            "agentId": who.agent_id,
            "admin": who.admin,
            "method": method,
            "params": params,
        });
        let answer = link.0.send_call(FORWARD, call);
        crate::engine::telemetry::forwarded("sent");
        self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let me = self.clone();
        async move {
            let unanswered = |why: &dyn std::fmt::Display| {
                tracing::debug!(error = %why, "a forwarded append was not answered; making it here");
                crate::engine::telemetry::forwarded("made_here");
                me.made_here
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                None
            };
            match tokio::time::timeout(FORWARD_WAIT, answer).await {
                Ok(Ok(v)) => match serde_json::from_value::<AppendResult>(v) {
                    Ok(r) => Some(Ok(r)),
                    Err(e) => unanswered(&e),
                },
                Ok(Err(ClientError::Rpc(e))) => Some(Err(Error::Rpc(e))),
                Ok(Err(e)) => unanswered(&e),
                Err(_) => unanswered(&"no answer in time"),
            }
        }
    }

    /// Takes this node out of the list at once (a graceful stop): the others make their appends
    /// themselves without waiting for it to be missed.
    pub async fn leave(&self) {
        if let Ok(mut u) = self.url.write() {
            *u = None;
        }
        if let Ok(mut l) = self.live.write() {
            *l = Arc::from(Vec::new());
        }
        let (store, name) = (self.store.clone(), self.name.clone());
        if let Ok(Err(e)) = tokio::task::spawn_blocking(move || store.leave(&name)).await {
            tracing::warn!(error = %e, "could not take this node out of the list of nodes");
        }
    }

    /// Says this node is alive; takes in the list of live nodes and closes the links to nodes
    /// no longer in it.
    async fn beat_once(&self) {
        let url = self.url.read().ok().and_then(|u| u.clone());
        let (store, name) = (self.store.clone(), self.name.clone());
        let found =
            tokio::task::spawn_blocking(move || store.beat(&name, url.as_deref(), ALIVE)).await;
        let live: Vec<Node> = match found {
            Ok(Ok(rows)) => rows
                .into_iter()
                .map(|(name, url)| Node { name, url })
                .collect(),
            // Without the database's word, every append is made here (always correct).
            Ok(Err(e)) => {
                tracing::debug!(error = %e, "could not say this node is alive");
                Vec::new()
            }
            Err(_) => Vec::new(),
        };
        if let Ok(mut links) = self.links.lock() {
            links.retain(|name, _| live.iter().any(|n| &n.name == name));
        }
        if let Ok(mut l) = self.live.write() {
            if **l != *live {
                tracing::info!(
                    nodes = live.len(),
                    "the nodes that write conversations changed"
                );
                *l = Arc::from(live);
            }
        }
    }
}

async fn beat(peers: std::sync::Weak<Peers>, mut closing: tokio::sync::watch::Receiver<bool>) {
    let mut every = tokio::time::interval(BEAT);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = closing.wait_for(|c| *c) => return,
        }
        let Some(p) = peers.upgrade() else { return };
        p.beat_once().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_writes_about_a_third_and_a_departure_moves_only_its_share() {
        let nodes = ["node-a", "node-b", "node-c"];
        let best = |among: &[&str], c: &str| {
            among
                .iter()
                .copied()
                .max_by_key(|n| score(n, c))
                .map(str::to_string)
        };
        let mut counts = HashMap::new();
        let mut moved = 0;
        for i in 0..3000 {
            let c = format!("conv-{i}");
            let owner = best(&nodes, &c).expect("an owner");
            *counts.entry(owner.clone()).or_insert(0) += 1;
            let without_b = best(&["node-a", "node-c"], &c).expect("an owner");
            if owner != "node-b" {
                assert_eq!(owner, without_b, "only node-b's share moves when it leaves");
            } else {
                moved += 1;
            }
        }
        for n in nodes {
            let k = counts[n];
            assert!((800..1200).contains(&k), "{n} writes {k} of 3,000");
        }
        assert_eq!(moved, counts["node-b"]);
    }
}
