//! One connection's state, shared by every call on it: who authenticated, how many calls are
//! in flight, its open subscriptions, and (on a WebSocket) the writer into its send buffer.
//! Also the parsing of params and the mapping of errors that every JSON-RPC method uses.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use proto_spec::{ErrorCode, RpcError};
use serde::de::DeserializeOwned;

use crate::engine::auth::{Grant, Identity};
use crate::engine::error::Result;
use crate::engine::hub::live::LiveSubscriber;
use crate::engine::hub::ConvView;
use crate::engine::shares::{Share, Shares};

/// What a call on a connection whose token was revoked or expired is told.
pub const REVOKED: &str =
    "the token this connection authenticated with was revoked or has expired; authenticate again with a valid one";

/// Per-connection state.
#[derive(Debug, Default)]
pub struct Session {
    /// Who authenticated, and the grant that says when their token is revoked.
    identity: RwLock<Option<(Identity, Option<Arc<Grant>>)>>,
    in_flight: AtomicUsize,
    /// Counts the connection as open while the session lives (WebSocket sessions only).
    _open: Option<crate::engine::telemetry::Open>,
    /// Writes frames into the connection's send buffer (WebSocket sessions only).
    frames: Option<crate::transport::net::ConnWriter>,
    /// The connection's `subscribe` subscriptions.
    subscriptions: Registry,
    /// Its `registerExecutor` registrations.
    executors: Registry,
    /// When the last call came, in milliseconds since the process started.
    last_call_ms: AtomicU64,
    /// Where a WebSocket connection counts against its agent's share of connections, and the
    /// share it holds once authenticated.
    agent_shares: Option<Arc<Shares<String>>>,
    agent_share: Mutex<Option<Share<String>>>,
    /// Its place in its tenant's quota of connections, once authenticated.
    tenant_share: Mutex<Option<Share<String>>>,
}

/// Milliseconds since the process started (for when a connection last called).
fn now_ms() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

/// Counts one call in flight on a connection while it lives.
#[derive(Debug)]
pub struct InFlightGuard(Arc<Session>);

impl Drop for InFlightGuard {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Session {
    /// A session; `open` counts its connection while it lives; `frames` writes into its
    /// connection (a WebSocket's).
    pub fn new(
        open: Option<crate::engine::telemetry::Open>,
        frames: Option<crate::transport::net::ConnWriter>,
    ) -> Self {
        Session {
            _open: open,
            frames,
            last_call_ms: AtomicU64::new(now_ms()),
            ..Default::default()
        }
    }

    /// Counts the connection against its agent's share of connections once it authenticates.
    pub fn with_agent_shares(mut self, shares: Arc<Shares<String>>) -> Self {
        self.agent_shares = Some(shares);
        self
    }

    /// Takes the connection's place in `agent`'s share of connections (at most `cap`), giving
    /// back the one it held; a connection that is not counted (HTTP) always has its place.
    pub fn take_share(&self, agent: &str, cap: usize) -> Result<(), RpcError> {
        let Some(shares) = &self.agent_shares else {
            return Ok(());
        };
        let mut held = self.agent_share.lock().unwrap_or_else(|p| p.into_inner());
        let key = agent.to_string();
        // Re-authenticating as the same agent keeps its place.
        if held.as_ref().is_some_and(|s| s.key() == &key) {
            return Ok(());
        }
        let share = shares.take(&key, cap).ok_or_else(|| {
            RpcError::new(
                ErrorCode::RateLimited,
                format!("{agent} has too many open connections (limit {cap} an agent); close some first"),
            )
            .with_data(serde_json::json!({"limit": cap, "per": "agent"}))
        })?;
        *held = Some(share);
        Ok(())
    }

    /// Takes the connection's place in `tenant`'s quota of connections (WebSocket connections
    /// only), giving back the one it held.
    pub fn take_tenant_share(
        &self,
        tenant: &str,
        quotas: &crate::engine::quotas::QuotaBook,
    ) -> Result<(), RpcError> {
        if self.agent_shares.is_none() {
            return Ok(());
        }
        let mut held = self.tenant_share.lock().unwrap_or_else(|p| p.into_inner());
        if held.as_ref().is_some_and(|s| s.key() == tenant) {
            return Ok(());
        }
        *held = quotas.connection(tenant)?;
        Ok(())
    }

    /// Whether anything is open on the connection: a call in flight, a subscription, a
    /// registration.
    fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Relaxed) > 0
            || !self.subscriptions.is_empty()
            || !self.executors.is_empty()
    }

    /// Ends a WebSocket connection that has not authenticated within `auth`, or that stays
    /// idle (no call, nothing open: [`Session::busy`]) for `idle`: a close frame with the
    /// reason, then the socket ends whether or not the peer answers.
    pub fn watch(self: &Arc<Self>, auth: std::time::Duration, idle: std::time::Duration) {
        let Some(frames) = self.frames.clone() else {
            return;
        };
        let session = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(auth) => {}
                _ = frames.closed() => return,
            }
            let authenticated = session
                .upgrade()
                .is_some_and(|s| s.identity.read().is_ok_and(|i| i.is_some()));
            if !authenticated {
                crate::engine::telemetry::dropped_connection("auth_timeout");
                let reason = format!("authenticate within {} s of connecting", auth.as_secs_f64());
                frames.abort(&crate::transport::net::close_frame(1008, &reason));
                return;
            }
            let idle_ms = idle.as_millis() as u64;
            loop {
                let wait_ms = {
                    let Some(s) = session.upgrade() else { return };
                    let quiet = now_ms().saturating_sub(s.last_call_ms.load(Ordering::Relaxed));
                    if s.busy() {
                        idle_ms
                    } else if quiet >= idle_ms {
                        crate::engine::telemetry::dropped_connection("idle_timeout");
                        let reason = format!("idle for {} s", idle.as_secs_f64());
                        frames.abort(&crate::transport::net::close_frame(1000, &reason));
                        return;
                    } else {
                        idle_ms - quiet
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep(std::time::Duration::from_millis(wait_ms.max(1))) => {}
                    _ = frames.closed() => return,
                }
            }
        });
    }

    /// Writes frames into the connection's send buffer, for a WebSocket session.
    pub fn frames(&self) -> Option<&crate::transport::net::ConnWriter> {
        self.frames.as_ref()
    }

    /// The connection's open `subscribe` subscriptions.
    pub fn subscriptions(&self) -> &Registry {
        &self.subscriptions
    }

    /// The connection's `registerExecutor` registrations.
    pub fn executors(&self) -> &Registry {
        &self.executors
    }

    /// How many calls are in flight.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The authenticated identity, or `Unauthenticated` (also once its token was revoked or
    /// expired).
    pub fn identity(&self) -> Result<Identity, RpcError> {
        let held = self.identity.read().ok().and_then(|i| i.clone());
        match held {
            Some((_, Some(grant))) if grant.is_revoked() => {
                Err(RpcError::new(ErrorCode::Unauthenticated, REVOKED))
            }
            Some((who, _)) => Ok(who),
            None => Err(RpcError::new(
                ErrorCode::Unauthenticated,
                "call authenticate with a token first",
            )),
        }
    }

    /// Sets who the connection speaks as. With a grant, a WebSocket connection is closed
    /// (1008, policy violation) and its subscriptions end when the token is revoked or expires;
    /// every call after that is refused.
    pub(crate) fn set_identity(self: &Arc<Self>, who: Identity, grant: Option<Arc<Grant>>) {
        if let Ok(mut i) = self.identity.write() {
            *i = Some((who, grant.clone()));
        }
        let (Some(grant), Some(frames)) = (grant, self.frames.clone()) else {
            return;
        };
        let session = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::select! {
                _ = grant.revoked() => {}
                _ = frames.closed() => return,
            }
            let Some(session) = session.upgrade() else {
                return;
            };
            let held = session.identity.read().ok().and_then(|i| i.clone());
            // Authenticated again since, with another token: that one holds.
            let Some((who, Some(current))) = held else {
                return;
            };
            if !Arc::ptr_eq(&current, &grant) {
                return;
            }
            tracing::info!(agent = %who.agent_id, "closing a connection: its token was revoked or expired");
            session.subscriptions.cancel_all();
            session.executors.cancel_all();
            // Ended by the server, whether or not the peer answers the close.
            frames.abort(&crate::transport::net::close_frame(
                1008,
                "token revoked or expired",
            ));
        });
    }

    /// Counts a call in flight, or refuses it when the connection is at its limit.
    pub fn enter(self: &Arc<Self>, limit: usize) -> Result<InFlightGuard, RpcError> {
        self.last_call_ms.store(now_ms(), Ordering::Relaxed);
        let before = self.in_flight.fetch_add(1, Ordering::Relaxed);
        let guard = InFlightGuard(self.clone());
        if before >= limit {
            return Err(RpcError::new(
                ErrorCode::RateLimited,
                format!(
                    "too many calls in flight on this connection (limit {limit}); wait for answers"
                ),
            )
            .with_data(serde_json::json!({"limit": limit})));
        }
        Ok(guard)
    }
}

/// Params, strictly: one object, by name, with no unknown field.
pub fn parse<P: DeserializeOwned>(raw: &str) -> Result<P, RpcError> {
    if !raw.trim_start().starts_with('{') {
        return Err(RpcError::new(
            ErrorCode::InvalidParams,
            "params must be one object, by name (positional params are not accepted)",
        ));
    }
    serde_json::from_str(raw).map_err(|e| {
        RpcError::new(ErrorCode::InvalidParams, format!("invalid params: {e}"))
            .with_data(serde_json::json!({"hint": "params are one object with camelCase fields; see PROTOCOL.md"}))
    })
}

/// The open subscriptions of one connection.
#[derive(Debug, Default)]
pub struct Registry {
    subs: Mutex<HashMap<u64, Subscription>>,
}

/// One open subscription: its task, and for one conversation, its place in the publisher's set.
#[derive(Debug)]
pub(crate) struct Subscription {
    pub(crate) task: tokio::task::AbortHandle,
    pub(crate) live: Option<(Arc<ConvView>, Arc<dyn LiveSubscriber>)>,
}

impl Registry {
    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Subscription>> {
        self.subs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many subscriptions are open.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether none is open.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Ends every subscription.
    pub fn cancel_all(&self) {
        let ids: Vec<u64> = self.lock().keys().copied().collect();
        for id in ids {
            self.cancel(id);
        }
    }

    /// Ends subscription `id`; false when there is none by that id.
    pub fn cancel(&self, id: u64) -> bool {
        let Some(open) = self.lock().remove(&id) else {
            return false;
        };
        // Out of the publisher's set first, so that nothing is written after the answer.
        if let Some((conv, p)) = &open.live {
            conv.live.leave(p);
        }
        open.task.abort();
        true
    }
}
