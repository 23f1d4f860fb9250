//! The JSON-RPC methods: each maps onto the method core.
//!
//! Every connection carries a [`Session`]: who authenticated, and how many calls are in
//! flight. A call goes through the same steps whatever the method: counted in flight,
//! authenticated, admitted by the rate limiter, its params parsed strictly (unknown fields,
//! such as a forged `author`, are refused), then run; errors reach the wire through
//! [`proto_spec::RpcError::to_wire`] only. `subscribe` and `registerExecutor` write their own
//! answer before their first notification ([`crate::transport::push`]).

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use proto_spec::method::names;
use proto_spec::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::engine::auth::Identity;
use crate::engine::error::Result;
use crate::engine::service::Orchestrator;
use crate::transport::jsonrpc::Call;
use crate::transport::session::{parse, Session};

type Ctx = Arc<Orchestrator>;

/// What a method gives back.
#[derive(Debug)]
pub enum Outcome {
    /// The result, as JSON, for the caller to frame.
    Result(String),
    /// The method wrote its answer into the connection itself.
    Written,
}

type Answer = std::result::Result<Outcome, RpcError>;
type Running = Pin<Box<dyn Future<Output = Answer> + Send>>;
type Handler = Arc<dyn Fn(Ctx, Arc<Session>, Call) -> Running + Send + Sync>;

/// Every method this server implements, by name.
#[derive(Clone)]
pub struct Methods {
    orch: Ctx,
    table: Arc<HashMap<&'static str, Handler>>,
}

impl std::fmt::Debug for Methods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Methods")
            .field("names", &self.table.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Methods {
    /// The orchestrator the methods run on.
    pub fn orchestrator(&self) -> &Ctx {
        &self.orch
    }

    /// Runs `call` on the connection of `session`, admitted first unless it was already
    /// ([`Methods::admit`]).
    pub async fn run(&self, session: Arc<Session>, mut call: Call) -> Answer {
        let Some(handler) = self.table.get(call.method()) else {
            return Err(RpcError::new(
                ErrorCode::MethodNotFound,
                format!("no method `{}`; PROTOCOL.md lists them", call.method()),
            ));
        };
        self.admit(&session, &mut call).await?;
        handler(self.orch.clone(), session, call).await
    }

    /// The one place a JSON-RPC call meets the rate limiter ([`Ctx::admit`]): a call of an
    /// authenticated session, once, whichever transport read it (a WebSocket connection's
    /// reader admits each call before it reads the next frame, so that a connection over its
    /// rate waits in its socket). `authenticate`, and a call before it, pass: the first is how
    /// a session gets an identity, the second is refused as unauthenticated.
    pub async fn admit(&self, session: &Session, call: &mut Call) -> Result<(), RpcError> {
        if call.admitted() || call.method() == names::AUTHENTICATE {
            return Ok(());
        }
        let Ok(who) = session.identity() else {
            return Ok(());
        };
        self.orch.admit(&who).await?;
        call.set_admitted();
        Ok(())
    }
}

fn serialized<R: Serialize>(r: &R) -> Answer {
    serde_json::to_string(r)
        .map(Outcome::Result)
        .map_err(|e| RpcError::new(ErrorCode::Internal, e.to_string()))
}

#[derive(Default)]
struct Table(HashMap<&'static str, Handler>);

impl Table {
    fn raw<F, Fut>(&mut self, name: &'static str, f: F)
    where
        F: Fn(Ctx, Arc<Session>, Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Answer> + Send + 'static,
    {
        self.0.insert(
            name,
            Arc::new(move |o, s, c| Box::pin(f(o, s, c)) as Running),
        );
    }

    /// A method of the core: counted in flight, authenticated, params parsed, then run (the
    /// core brings in the conversation it names as its access needs).
    fn add<P, R, F, Fut>(&mut self, name: &'static str, f: F)
    where
        P: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(Ctx, Identity, P) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Result<R>> + Send + 'static,
    {
        self.raw(name, move |orch: Ctx, session: Arc<Session>, call: Call| {
            let f = f.clone();
            async move {
                let _guard = session.enter(orch.limits().max_in_flight_per_connection)?;
                let who = session.identity()?;
                let p: P = parse(call.params())?;
                let r = f(orch, who, p).await.map_err(|e| e.to_rpc())?;
                // A read that waited (a long-poll) answers only if the token still holds; a
                // write that landed is answered as it is (a retry with its key finds it).
                let writes = [
                    names::SEND_MESSAGE,
                    names::SEND_TRACE,
                    names::CREATE_CONVERSATION,
                    names::DELETE_CONVERSATION,
                ];
                if !writes.contains(&name) {
                    session.identity()?;
                }
                serialized(&r)
            }
        });
    }
}

/// The subscription id `unsubscribe` and `unregisterExecutor` name: `[id]` (as jsonrpsee
/// clients send it) or `{"subscription": id}`; a number, or a string of digits.
fn subscription_id(method: &str, params: &str) -> std::result::Result<u64, RpcError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Named {
        subscription: serde_json::Value,
    }
    let id = match serde_json::from_str::<(serde_json::Value,)>(params) {
        Ok((id,)) => Some(id),
        Err(_) => serde_json::from_str::<Named>(params)
            .ok()
            .map(|n| n.subscription),
    };
    id.and_then(|id| id.as_u64().or_else(|| id.as_str().and_then(|s| s.parse().ok())))
        .ok_or_else(|| {
            RpcError::new(
                ErrorCode::InvalidParams,
                format!(
                    "{method} takes the subscription id: [id] or {{\"subscription\": id}}, and nothing else"
                ),
            )
        })
}

/// `authenticate`: the connection's identity, its share of the agent's and the tenant's
/// connections.
fn add_authenticate(t: &mut Table) {
    t.raw(
        names::AUTHENTICATE,
        |ctx: Ctx, session: Arc<Session>, call: Call| async move {
            let _guard = session.enter(ctx.limits().max_in_flight_per_connection)?;
            let p: AuthenticateParams = parse(call.params())?;
            let (who, grant) = ctx
                .authenticate_held(&p.token)
                .await
                .map_err(|e| e.to_rpc())?;
            let result = AuthenticateResult {
                ok: true,
                agent_id: who.agent_id.clone(),
                tenant: who.tenant.to_string(),
            };
            session.take_share(
                &who.principal(),
                ctx.limits().max_connections_per_agent as usize,
            )?;
            session.take_tenant_share(&who.tenant, ctx.quotas())?;
            tracing::info!(
                tenant = %who.tenant,
                agent = %who.agent_id,
                admin = who.admin,
                operator = who.operator,
                "authenticated"
            );
            session.set_identity(who, Some(grant));
            serialized(&result)
        },
    );
}

/// Builds the table of every method this server implements.
pub fn methods(orch: Ctx) -> Methods {
    let mut t = Table::default();
    add_authenticate(&mut t);
    // Each of these is `Orchestrator::$method(&who, params).await`.
    macro_rules! core {
        ($($name:ident => $method:ident),* $(,)?) => {$(
            t.add(names::$name, |o: Ctx, who, p| async move { o.$method(&who, p).await });
        )*};
    }
    core!(
        CREATE_CONVERSATION => create_conversation,
        PAUSE_CONVERSATION => pause_conversation,
        RESUME_CONVERSATION => resume_conversation,
        FORK_CONVERSATION => fork_conversation,
        DELETE_CONVERSATION => delete_conversation,
        CLAIM_TURN => claim_turn,
        TAIL => tail,
        WAIT_FOR_CHANGE => wait_for_change,
        GET_UPDATES_OR_GUIDANCE => get_updates,
        GET_CONVERSATION => get_conversation,
        SEND_MESSAGE => send_message,
        SEND_TRACE => send_trace,
        CREATE_TOKEN => create_token,
        LIST_TOKENS => list_tokens,
        REVOKE_TOKEN => revoke_token,
        CREATE_TENANT => create_tenant,
        LIST_TENANTS => list_tenants,
        SET_TENANT_QUOTAS => set_tenant_quotas,
    );
    t.add(
        names::LIST_SCENARIOS,
        |o: Ctx, who, _p: ListScenariosParams| async move { o.list_scenarios(&who) },
    );
    t.add(
        names::LIST_CONVERSATIONS,
        |o: Ctx, who, p: ListConversationsParams| async move { o.list_conversations(&who, p).await },
    );
    // These write their answer themselves, before their first notification.
    t.raw(
        names::SUBSCRIBE,
        |o: Ctx, session: Arc<Session>, call: Call| async move {
            crate::transport::push::subscribe(&o, &session, &call)
                .await
                .map(|()| Outcome::Written)
        },
    );
    t.raw(
        names::REGISTER_EXECUTOR,
        |o: Ctx, session, call| async move {
            crate::transport::push::register_executor(&o, &session, &call)
                .await
                .map(|()| Outcome::Written)
        },
    );
    for (name, of) in [
        (names::UNSUBSCRIBE, Registered::Subscriptions),
        (names::UNREGISTER_EXECUTOR, Registered::Executors),
    ] {
        t.raw(
            name,
            move |_o: Ctx, session: Arc<Session>, call: Call| async move {
                session.identity()?;
                let id = subscription_id(name, call.params())?;
                let registry = match of {
                    Registered::Subscriptions => session.subscriptions(),
                    Registered::Executors => session.executors(),
                };
                serialized(&registry.cancel(id))
            },
        );
    }
    Methods {
        orch,
        table: Arc::new(t.0),
    }
}

/// Which of a connection's registries an `un…` method ends an entry of.
#[derive(Debug, Clone, Copy)]
enum Registered {
    Subscriptions,
    Executors,
}

#[cfg(test)]
mod tests {
    use super::subscription_id;

    #[test]
    fn a_subscription_is_named_by_an_array_or_an_object_and_nothing_else() {
        assert_eq!(subscription_id("u", "[7]").unwrap(), 7);
        assert_eq!(subscription_id("u", r#"["7"]"#).unwrap(), 7);
        assert_eq!(subscription_id("u", r#"{"subscription":7}"#).unwrap(), 7);
        for bad in [
            "[]",
            "[1,2]",
            r#"{"subscription":7,"x":1}"#,
            "{}",
            r#"["x"]"#,
        ] {
            assert!(subscription_id("u", bad).is_err(), "{bad}");
        }
    }
}
