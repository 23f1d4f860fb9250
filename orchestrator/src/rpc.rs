//! JSON-RPC 2.0 over WebSocket: the jsonrpsee module that maps each method onto the method core.
//!
//! Every connection carries a [`Session`] (put into the upgrade request's extensions by the
//! HTTP host, so every call on the connection sees it): who authenticated, and how many calls
//! are in flight. Params are parsed strictly (unknown fields, such as a forged `author`, are
//! refused); errors are mapped to the wire by [`proto_spec::RpcError::to_wire`] only.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use jsonrpsee::core::SubscriptionResult;
use jsonrpsee::types::{ErrorObjectOwned, Params};
use jsonrpsee::{Extensions, RpcModule};
use proto_spec::method::names;
use proto_spec::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::auth::Identity;
use crate::error::Result;
use crate::service::Orchestrator;

/// Per-connection state.
#[derive(Debug, Default)]
pub struct Session {
    identity: RwLock<Option<Identity>>,
    in_flight: AtomicUsize,
    /// Counts the connection as open while the session lives (WebSocket sessions only).
    _open: Option<crate::telemetry::Open>,
    /// Writes frames into the connection's send buffer (WebSocket sessions only).
    frames: Option<crate::net::ConnWriter>,
    /// The connection's `subscribe` subscriptions.
    subscriptions: crate::push::Registry,
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
        open: Option<crate::telemetry::Open>,
        frames: Option<crate::net::ConnWriter>,
    ) -> Self {
        Session {
            _open: open,
            frames,
            ..Default::default()
        }
    }

    /// Writes frames into the connection's send buffer, for a WebSocket session.
    pub fn frames(&self) -> Option<&crate::net::ConnWriter> {
        self.frames.as_ref()
    }

    /// The connection's open `subscribe` subscriptions.
    pub fn subscriptions(&self) -> &crate::push::Registry {
        &self.subscriptions
    }

    /// The authenticated identity, or `Unauthenticated`.
    pub fn identity(&self) -> Result<Identity, RpcError> {
        self.identity
            .read()
            .ok()
            .and_then(|i| i.clone())
            .ok_or_else(|| {
                RpcError::new(
                    ErrorCode::Unauthenticated,
                    "call authenticate with a token first",
                )
            })
    }

    fn set_identity(&self, who: Identity) {
        if let Ok(mut i) = self.identity.write() {
            *i = Some(who);
        }
    }

    /// Counts a call in flight, or refuses it when the connection is at its limit.
    pub fn enter(self: &Arc<Self>, limit: usize) -> Result<InFlightGuard, RpcError> {
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

/// The one conversion of a protocol error into jsonrpsee's error object.
pub fn wire(e: RpcError) -> ErrorObjectOwned {
    crate::telemetry::error(e.code, "rpc");
    let w = e.to_wire();
    ErrorObjectOwned::owned(w.code, w.message, w.data)
}

pub(crate) fn session_of(ext: &Extensions) -> Result<Arc<Session>, RpcError> {
    ext.get::<Arc<Session>>()
        .cloned()
        .ok_or_else(|| RpcError::new(ErrorCode::Internal, "connection has no session"))
}

pub(crate) fn parse<P: DeserializeOwned>(params: &Params<'_>) -> Result<P, RpcError> {
    let raw = params.as_str().unwrap_or("{}");
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

type Ctx = Arc<Orchestrator>;

fn add<P, R, F, Fut>(
    m: &mut RpcModule<Ctx>,
    name: &'static str,
    f: F,
) -> Result<(), jsonrpsee::core::RegisterMethodError>
where
    P: DeserializeOwned + Send + 'static,
    R: Serialize + Clone + Send + 'static,
    F: Fn(Ctx, Identity, P) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Result<R>> + Send + 'static,
{
    m.register_async_method(name, move |params, ctx, ext| {
        let f = f.clone();
        async move {
            let session = session_of(&ext).map_err(wire)?;
            let orch: Ctx = (*ctx).clone();
            let _guard = session
                .enter(orch.limits().max_in_flight_per_connection)
                .map_err(wire)?;
            let who = session.identity().map_err(wire)?;
            let p: P = parse(&params).map_err(wire)?;
            f(orch, who, p).await.map_err(|e| wire(e.to_rpc()))
        }
    })?;
    Ok(())
}

/// The subscription id `unsubscribe` names: `[id]` (as jsonrpsee clients send it), `{"subscription": id}`
/// or the id alone; a number, or a string of digits.
fn subscription_id(params: &Params<'_>) -> Result<u64, RpcError> {
    let v: serde_json::Value =
        serde_json::from_str(params.as_str().unwrap_or("null")).unwrap_or(serde_json::Value::Null);
    let id = match &v {
        serde_json::Value::Array(a) if a.len() == 1 => &a[0],
        serde_json::Value::Object(o) => o.get("subscription").unwrap_or(&serde_json::Value::Null),
        other => other,
    };
    id.as_u64()
        .or_else(|| id.as_str().and_then(|s| s.parse().ok()))
        .ok_or_else(|| {
            RpcError::new(
                ErrorCode::InvalidParams,
                "unsubscribe takes the subscription id: [id] or {\"subscription\": id}",
            )
        })
}

/// Builds the module with every method this server implements.
pub fn module(
    orch: Arc<Orchestrator>,
) -> Result<RpcModule<Ctx>, jsonrpsee::core::RegisterMethodError> {
    let mut m = RpcModule::new(orch);
    m.register_async_method(names::AUTHENTICATE, |params, ctx, ext| async move {
        let session = session_of(&ext).map_err(wire)?;
        let p: AuthenticateParams = parse(&params).map_err(wire)?;
        let who = ctx
            .authenticate(&p.token)
            .await
            .map_err(|e| wire(e.to_rpc()))?;
        let result = AuthenticateResult {
            ok: true,
            agent_id: who.agent_id.clone(),
        };
        session.set_identity(who);
        Ok::<_, ErrorObjectOwned>(result)
    })?;
    add(
        &mut m,
        names::CREATE_CONVERSATION,
        |o: Ctx, who, p| async move { o.create_conversation(&who, p).await },
    )?;
    add(
        &mut m,
        names::GET_CONVERSATION,
        |o: Ctx, who, p| async move { o.get_conversation(&who, p) },
    )?;
    add(
        &mut m,
        names::LIST_CONVERSATIONS,
        |o: Ctx, who, _p: ListConversationsParams| async move { Ok(o.list_conversations(&who)) },
    )?;
    add(
        &mut m,
        names::PAUSE_CONVERSATION,
        |o: Ctx, who, p| async move { o.pause_conversation(&who, p).await },
    )?;
    add(
        &mut m,
        names::RESUME_CONVERSATION,
        |o: Ctx, who, p| async move { o.resume_conversation(&who, p).await },
    )?;
    add(
        &mut m,
        names::FORK_CONVERSATION,
        |o: Ctx, who, p| async move { o.fork_conversation(&who, p).await },
    )?;
    add(&mut m, names::CLAIM_TURN, |o: Ctx, who, p| async move {
        o.claim_turn(&who, p)
    })?;
    add(&mut m, names::TAIL, |o: Ctx, who, p| async move {
        o.tail(&who, p).await
    })?;
    add(
        &mut m,
        names::WAIT_FOR_CHANGE,
        |o: Ctx, who, p| async move { o.wait_for_change(&who, p).await },
    )?;
    add(
        &mut m,
        names::GET_UPDATES_OR_GUIDANCE,
        |o: Ctx, who, p| async move { o.get_updates(&who, p).await },
    )?;
    add(&mut m, names::SEND_MESSAGE, |o: Ctx, who, p| async move {
        o.send_message(&who, p).await
    })?;
    add(&mut m, names::SEND_TRACE, |o: Ctx, who, p| async move {
        o.send_trace(&who, p).await
    })?;
    // `subscribe` is answered by the middleware in [`crate::push`], which writes its frames
    // straight into the connection; `unsubscribe` ends what it started.
    m.register_method(names::UNSUBSCRIBE, |params, _ctx, ext| {
        let session = session_of(ext).map_err(wire)?;
        let id = subscription_id(&params).map_err(wire)?;
        Ok::<_, ErrorObjectOwned>(session.subscriptions().cancel(id))
    })?;
    m.register_subscription(
        names::REGISTER_EXECUTOR,
        names::REQUEST_TURN,
        names::UNREGISTER_EXECUTOR,
        |params, pending, ctx, ext| async move {
            let started = (|| {
                let session = session_of(&ext)?;
                let who = session.identity()?;
                let _p: RegisterExecutorParams = parse(&params)?;
                Ok::<_, RpcError>(who)
            })();
            let who = match started {
                Ok(who) => who,
                Err(e) => {
                    pending.reject(wire(e)).await;
                    return Ok(());
                }
            };
            let sink = pending.accept().await?;
            let turns = ctx.turns().clone();
            let (id, mut offers) = turns.register(&who.agent_id);
            let mut closing = ctx.hub().closing();
            loop {
                let offer = tokio::select! {
                    _ = sink.closed() => break,
                    _ = closing.wait_for(|c| *c) => break,
                    o = offers.recv() => o,
                };
                let Some(offer) = offer else { break };
                let msg = serde_json::value::to_raw_value(&offer)?;
                if sink.send(msg).await.is_err() {
                    break;
                }
            }
            turns.unregister(&who.agent_id, id);
            SubscriptionResult::Ok(())
        },
    )?;
    Ok(m)
}
