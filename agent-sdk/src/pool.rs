//! [`ClientPool`]: connections by token, for a process that acts for many principals at once
//! (the A2A and MCP adapters). Each caller presents an orchestrator token; the pool opens a
//! [`WsJsonRpcClient`] authenticated with it, so the orchestrator checks the token and the
//! caller acts there as that token's agent, and keeps the connection while the caller is active.
//!
//! The pool holds at most `capacity` connections: when full, the one idle longest that nobody
//! is using is let go, and with every one in use a new caller is refused ([`PoolError::Full`]).
//! Connections idle for [`IDLE`] are let go. A flood of unknown tokens opens at most
//! [`OPENING_AT_ONCE`] connections at a time ([`PoolError::Busy`] beyond).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use proto_spec::{ErrorCode, RpcError};
use sha2::{Digest, Sha256};
use tokio::sync::Semaphore;

use crate::client::{AgentClient, ClientError};
use crate::ws::{WsConfig, WsJsonRpcClient};

/// A connection nobody used for this long is let go.
pub const IDLE: Duration = Duration::from_secs(300);
/// Connections being opened at once for tokens the pool does not hold yet.
pub const OPENING_AT_ONCE: usize = 16;

/// Why the pool gives no connection for a token.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The orchestrator does not accept the token (unknown, revoked or expired).
    #[error("the orchestrator does not accept this token: {0}")]
    Refused(RpcError),
    /// Too many new tokens are being checked at once.
    #[error("many new credentials are being checked at once; try again in a moment")]
    Busy,
    /// Every connection the pool may hold is in use.
    #[error("{0} callers are being served at once, all busy; try again shortly")]
    Full(usize),
    /// The orchestrator could not be reached.
    #[error("the orchestrator cannot be reached: {0}")]
    Unreachable(ClientError),
}

/// What the pool keeps for one token: the connection and the caller's own state around it.
#[derive(Debug)]
struct Held<T> {
    client: WsJsonRpcClient,
    value: Arc<T>,
    last_used: Instant,
}

/// Connections by token, each wrapped in the caller's state `T` (see the module docs).
#[derive(Debug)]
pub struct ClientPool<T> {
    url: String,
    capacity: usize,
    held: Mutex<HashMap<[u8; 32], Held<T>>>,
    opening: Semaphore,
}

/// The key a token is held under (its SHA-256): the pool keeps no token in its map.
pub fn token_key(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

impl<T> ClientPool<T> {
    /// A pool of connections to the orchestrator at `url` (its WebSocket endpoint), holding at
    /// most `capacity`.
    pub fn new(url: impl Into<String>, capacity: usize) -> ClientPool<T> {
        ClientPool {
            url: url.into(),
            capacity: capacity.max(1),
            held: Mutex::new(HashMap::new()),
            opening: Semaphore::new(OPENING_AT_ONCE),
        }
    }

    /// The caller's state for `token`: the one held, or a new connection authenticated with
    /// it, wrapped by `make` (given the connection, its agent id and the token's key). A held
    /// connection that stopped (its token was refused when it reconnected) is made anew, so a
    /// revoked token is refused here.
    pub async fn get(
        &self,
        token: &str,
        make: impl FnOnce(WsJsonRpcClient, String, [u8; 32]) -> T,
    ) -> Result<Arc<T>, PoolError> {
        let key = token_key(token);
        {
            let mut held = self.lock();
            match held.get_mut(&key) {
                Some(h) if h.client.is_closed() => {
                    held.remove(&key);
                }
                Some(h) => {
                    h.last_used = Instant::now();
                    return Ok(h.value.clone());
                }
                None => {}
            }
        }
        let _opening = self.opening.try_acquire().map_err(|_| PoolError::Busy)?;
        let client = WsJsonRpcClient::connect(WsConfig::new(self.url.clone(), token))
            .await
            .map_err(|e| match e {
                ClientError::Rpc(rpc) if rpc.code == ErrorCode::Unauthenticated => {
                    PoolError::Refused(rpc)
                }
                other => PoolError::Unreachable(other),
            })?;
        let agent = client.agent_id().to_string();
        let value = Arc::new(make(client.clone(), agent, key));
        let mut held = self.lock();
        let now = Instant::now();
        // Let go of what is idle and unused (a connection in use stays held by its users).
        held.retain(|_, h| {
            now.duration_since(h.last_used) < IDLE || Arc::strong_count(&h.value) > 1
        });
        if held.len() >= self.capacity && !held.contains_key(&key) {
            let idlest = held
                .iter()
                .filter(|(_, h)| Arc::strong_count(&h.value) == 1)
                .min_by_key(|(_, h)| h.last_used)
                .map(|(k, _)| *k);
            match idlest {
                Some(k) => {
                    held.remove(&k);
                }
                None => return Err(PoolError::Full(self.capacity)),
            }
        }
        let entry = held.entry(key).or_insert(Held {
            client,
            value,
            last_used: now,
        });
        Ok(entry.value.clone())
    }

    /// Lets go of the connection of the token whose key is `key` (its token stopped working):
    /// the next call with that token connects again.
    pub fn forget(&self, key: &[u8; 32]) {
        self.lock().remove(key);
    }

    /// How many connections the pool holds.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Held<T>>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The token of an `Authorization: Bearer …` header value, if it is one (the scheme in any
/// case, RFC 9110 §11.1); `None` for anything else or a token over `max_len` bytes.
pub fn bearer_token(header: &str, max_len: usize) -> Option<&str> {
    let (scheme, token) = header.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && token.len() <= max_len)
        .then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_and_anything_else_is_not() {
        assert_eq!(bearer_token("Bearer oct_abc", 64), Some("oct_abc"));
        assert_eq!(bearer_token("bearer  oct_abc ", 64), Some("oct_abc"));
        for bad in ["Basic abc", "Bearer ", "oct_abc", ""] {
            assert_eq!(bearer_token(bad, 64), None, "{bad:?}");
        }
        assert_eq!(
            bearer_token(&format!("Bearer {}", "x".repeat(65)), 64),
            None
        );
    }
}
