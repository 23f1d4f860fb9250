//! Who an A2A call speaks as. Every call carries `Authorization: Bearer <an orchestrator
//! token>` (the Agent Card declares the scheme); the adapter holds a connection to the
//! orchestrator per token ([`ClientPool`]), which the orchestrator authenticates, and the peer
//! acts there as that token's principal, held to the orchestrator's own rules. Each peer's calls
//! in flight and waits are on a connection of its own.
//!
//! Each peer is also held to caps of the adapter's own ([`PeerLimits`]): streams open at once,
//! calls in flight, and new contexts a minute. One peer over a cap gets an error; every other
//! peer is served as before.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_sdk::pool::{bearer_token, ClientPool, PoolError};
use agent_sdk::WsJsonRpcClient;
use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::A2aError;

/// What one peer may hold of the adapter at once.
#[derive(Debug, Clone)]
pub struct PeerLimits {
    /// Streams (`SendStreamingMessage`, `SubscribeToTask`) open at once.
    pub streams: usize,
    /// Calls being answered at once (a stream counts while it is being opened).
    pub calls: usize,
    /// New contexts (conversations) a minute.
    pub new_contexts_per_minute: usize,
    /// Peers with a connection to the orchestrator at once; an idle one is let go to make room.
    pub peers: usize,
}

impl Default for PeerLimits {
    fn default() -> Self {
        PeerLimits {
            streams: 16,
            calls: 32,
            new_contexts_per_minute: 60,
            peers: 512,
        }
    }
}

/// A bearer token longer than this is refused before anything is asked of the orchestrator.
const MAX_TOKEN_BYTES: usize = 512;

/// One authenticated peer.
#[derive(Debug)]
pub struct Peer {
    /// Its connection to the orchestrator, authenticated with its own token.
    pub client: Arc<WsJsonRpcClient>,
    /// The agent id it speaks as.
    pub me: String,
    /// The pool's key of its token (its SHA-256): a secret only the token gives, which also
    /// keys its context ids.
    key: [u8; 32],
    calls: Arc<Semaphore>,
    streams: Arc<Semaphore>,
    contexts: Mutex<VecDeque<Instant>>,
    /// Contexts known to be the peer's (scenario, conversation): a context's creator and
    /// scenario never change, so each is checked once.
    owned: Mutex<HashSet<(String, String)>>,
    /// What `ListTasks` learned of each context: its tasks as of a seq.
    pub(crate) listed: Mutex<HashMap<String, Listed>>,
}

/// A context's tasks as `ListTasks` last read them: at `seq`, each task's first seq and state.
#[derive(Debug, Clone)]
pub(crate) struct Listed {
    pub(crate) seq: u64,
    pub(crate) tasks: Vec<(u64, &'static str)>,
}

/// How many contexts a peer's caches hold before they start over.
pub(crate) const CACHED_CONTEXTS: usize = 4096;

/// What a call holds while it runs; a stream holds a [`StreamSlot`] as well.
#[derive(Debug)]
pub struct CallSlot(#[allow(dead_code)] OwnedSemaphorePermit);

/// A stream's place among its peer's open streams, given back when the stream ends.
#[derive(Debug)]
pub struct StreamSlot(#[allow(dead_code)] OwnedSemaphorePermit);

impl Peer {
    /// A place for one more call, or the error that says the peer has too many.
    pub fn call_slot(&self, limits: &PeerLimits) -> Result<CallSlot, A2aError> {
        self.calls.clone().try_acquire_owned().map(CallSlot).map_err(|_| {
            A2aError::over_limit(
                "TOO_MANY_CALLS",
                format!(
                    "{} calls of this peer are being answered already (the limit); wait for one to end",
                    limits.calls
                ),
            )
        })
    }

    /// A place for one more open stream.
    pub fn stream_slot(&self, limits: &PeerLimits) -> Result<StreamSlot, A2aError> {
        self.streams
            .clone()
            .try_acquire_owned()
            .map(StreamSlot)
            .map_err(|_| {
                A2aError::over_limit(
                    "TOO_MANY_STREAMS",
                    format!(
                    "this peer has {} streams open (the limit); close one, or poll with GetTask",
                    limits.streams
                ),
                )
            })
    }

    /// Counts a new context against the peer's rate, or says when the next may start.
    pub fn new_context(&self, limits: &PeerLimits) -> Result<(), A2aError> {
        let now = Instant::now();
        let minute = Duration::from_secs(60);
        let mut started = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        while started
            .front()
            .is_some_and(|t| now.duration_since(*t) >= minute)
        {
            started.pop_front();
        }
        if started.len() >= limits.new_contexts_per_minute {
            let wait = started
                .front()
                .map_or(minute, |t| minute.saturating_sub(now.duration_since(*t)));
            return Err(A2aError::over_limit(
                "TOO_MANY_NEW_CONTEXTS",
                format!(
                    "this peer started {} contexts in the last minute (the limit); the next may start in {} ms, or continue one it has",
                    limits.new_contexts_per_minute,
                    wait.as_millis()
                ),
            ));
        }
        started.push_back(now);
        Ok(())
    }

    /// The context id of the conversation a first message with `message_id` opens: a keyed
    /// hash of it under the peer's key (its token's SHA-256), so a retried first message finds its conversation
    /// again (also after a restart of the adapter), and nobody without the peer's token can
    /// tell one in advance.
    pub fn context_id(&self, message_id: &str) -> String {
        let mut h = Sha256::new();
        h.update(self.key);
        h.update(b"\0a2a-context\0");
        h.update(message_id.as_bytes());
        format!("a2a-{}", hex::encode(&h.finalize()[..16]))
    }

    /// Whether `conversation` is known to be a context the peer started from `scenario`.
    pub fn knows_context(&self, scenario: &str, conversation: &str) -> bool {
        let owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        owned.contains(&(scenario.to_string(), conversation.to_string()))
    }

    /// Notes that `conversation` is a context the peer started from `scenario`.
    pub fn learn_context(&self, scenario: &str, conversation: &str) {
        let mut owned = self.owned.lock().unwrap_or_else(|e| e.into_inner());
        if owned.len() >= CACHED_CONTEXTS {
            owned.clear();
        }
        owned.insert((scenario.to_string(), conversation.to_string()));
    }

    fn new(client: WsJsonRpcClient, me: String, key: [u8; 32], limits: &PeerLimits) -> Peer {
        Peer {
            me,
            client: Arc::new(client),
            key,
            calls: Arc::new(Semaphore::new(limits.calls)),
            streams: Arc::new(Semaphore::new(limits.streams)),
            contexts: Mutex::new(VecDeque::new()),
            owned: Mutex::new(HashSet::new()),
            listed: Mutex::new(HashMap::new()),
        }
    }
}

/// The peers the adapter serves, by their token.
#[derive(Debug)]
pub struct Peers {
    limits: PeerLimits,
    pool: ClientPool<Peer>,
}

impl Peers {
    /// Peers of the orchestrator at `url` (its WebSocket endpoint).
    pub fn new(url: impl Into<String>, limits: PeerLimits) -> Peers {
        Peers {
            pool: ClientPool::new(url, limits.peers),
            limits,
        }
    }

    /// The caps every peer is held to.
    pub fn limits(&self) -> &PeerLimits {
        &self.limits
    }

    /// The peer a request's `Authorization` header names, connected to the orchestrator.
    pub async fn authenticate(&self, headers: &HeaderMap) -> Result<Arc<Peer>, A2aError> {
        let token = bearer(headers)?;
        let limits = &self.limits;
        let made = |client, me, key| Peer::new(client, me, key, limits);
        self.pool.get(token, made).await.map_err(|e| match e {
            PoolError::Refused(_) => A2aError::unauthenticated(
                "the orchestrator does not accept this token (unknown, revoked or expired)",
            ),
            PoolError::Busy => A2aError::over_limit("BUSY", e.to_string()),
            PoolError::Full(_) => A2aError::over_limit("TOO_MANY_PEERS", e.to_string()),
            PoolError::Unreachable(e) => A2aError::upstream(e),
        })
    }

    /// Lets a peer go (its token no longer works): the next call authenticates again.
    pub fn forget(&self, peer: &Peer) {
        self.pool.forget(&peer.key);
    }
}

/// The bearer token of `Authorization`, or why there is none to use.
fn bearer(headers: &HeaderMap) -> Result<&str, A2aError> {
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        A2aError::unauthenticated(
            "send Authorization: Bearer <an orchestrator token> (the Agent Card's securitySchemes)",
        )
    })?;
    value
        .to_str()
        .ok()
        .and_then(|v| bearer_token(v, MAX_TOKEN_BYTES))
        .ok_or_else(|| {
            A2aError::unauthenticated(
                "the Authorization header is not Bearer <an orchestrator token>",
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bearer_token_is_read_and_anything_else_refused() {
        let with = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            h
        };
        assert_eq!(bearer(&with("Bearer oct_abc")).unwrap(), "oct_abc");
        for bad in ["Basic abc", "Bearer ", "oct_abc"] {
            let e = bearer(&with(bad)).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::UNAUTHORIZED, "{bad}");
        }
        assert!(bearer(&HeaderMap::new()).is_err());
        let long = format!("Bearer {}", "x".repeat(MAX_TOKEN_BYTES + 1));
        assert!(bearer(&with(&long)).is_err());
    }
}
