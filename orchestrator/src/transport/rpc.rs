//! JSON-RPC 2.0 over WebSocket: the jsonrpsee module that maps each method onto the method core.
//!
//! Every connection carries a [`Session`](crate::transport::session::Session) (put into the upgrade request's extensions by the
//! HTTP host, so every call on the connection sees it): who authenticated, and how many calls
//! are in flight. Params are parsed strictly (unknown fields, such as a forged `author`, are
//! refused); errors are mapped to the wire by [`proto_spec::RpcError::to_wire`] only.

use std::future::Future;
use std::sync::Arc;

use jsonrpsee::core::SubscriptionResult;
use jsonrpsee::types::{ErrorObjectOwned, Params};
use jsonrpsee::RpcModule;
use proto_spec::method::names;
use proto_spec::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::auth::Identity;
use crate::engine::error::Result;
use crate::engine::service::Orchestrator;
use crate::transport::session::{parse, session_of, wire};

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
            orch.admit(&who).await.map_err(wire)?;
            let p: P = parse(&params).map_err(wire)?;
            // A creation names an id that is normally new: its batch finds out under the lock.
            if name != names::CREATE_CONVERSATION {
                if let Some(id) = conversation_named(&params) {
                    orch.meet(&id).await;
                }
            }
            f(orch, who, p).await.map_err(|e| wire(e.to_rpc()))
        }
    })?;
    Ok(())
}

/// The conversation a call's params name (`conversationId`), if any.
pub(crate) fn conversation_named(params: &Params<'_>) -> Option<String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Named {
        conversation_id: Option<String>,
    }
    params.parse::<Named>().ok().and_then(|n| n.conversation_id)
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
        let (who, grant) = ctx
            .authenticate_held(&p.token)
            .await
            .map_err(|e| wire(e.to_rpc()))?;
        let result = AuthenticateResult {
            ok: true,
            agent_id: who.agent_id.clone(),
        };
        tracing::info!(agent = %who.agent_id, admin = who.admin, "authenticated");
        session.set_identity(who, Some(grant));
        Ok::<_, ErrorObjectOwned>(result)
    })?;
    add(
        &mut m,
        names::CREATE_CONVERSATION,
        |o: Ctx, who, p| async move { o.create_conversation(&who, p).await },
    )?;
    add(
        &mut m,
        names::LIST_SCENARIOS,
        |o: Ctx, who, _p: ListScenariosParams| async move { o.list_scenarios(&who) },
    )?;
    add(
        &mut m,
        names::GET_CONVERSATION,
        |o: Ctx, who, p| async move { o.get_conversation(&who, p) },
    )?;
    add(
        &mut m,
        names::LIST_CONVERSATIONS,
        |o: Ctx, who, _p: ListConversationsParams| async move { Ok(o.list_conversations(&who).await) },
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
        o.claim_turn(&who, p).await
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
    // `subscribe` is answered by the middleware in [`crate::transport::push`], which writes its frames
    // straight into the connection; `unsubscribe` ends what it started.
    m.register_method(names::UNSUBSCRIBE, |params, _ctx, ext| {
        let session = session_of(ext).map_err(wire)?;
        let id = subscription_id(&params).map_err(wire)?;
        Ok::<_, ErrorObjectOwned>(session.subscriptions().cancel(id))
    })?;
    register_executor(&mut m)?;
    Ok(m)
}

/// `registerExecutor`: a push replica's subscription to `request_turn` offers, until it
/// unsubscribes, disconnects or the server stops.
fn register_executor(m: &mut RpcModule<Ctx>) -> Result<(), jsonrpsee::core::RegisterMethodError> {
    m.register_subscription(
        names::REGISTER_EXECUTOR,
        names::REQUEST_TURN,
        names::UNREGISTER_EXECUTOR,
        |params, pending, ctx, ext| async move {
            let started = async {
                let session = session_of(&ext)?;
                let who = session.identity()?;
                ctx.admit(&who).await?;
                let _p: RegisterExecutorParams = parse(&params)?;
                Ok::<_, RpcError>((who, session.hold()))
            }
            .await;
            let (who, _held) = match started {
                Ok(started) => started,
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
    Ok(())
}
