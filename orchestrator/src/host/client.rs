//! [`InProcessClient`]: the [`AgentClient`] of agents that run inside the server.
//!
//! It calls the same method core ([`Orchestrator`]) that serves `/rpc`, with a fixed identity,
//! so an internal agent is held to exactly the rules an external one is. No rule is
//! implemented here. What it answers names conversations as the wire does (by their ids within
//! their tenant, [`Local`]), so that an agent sees inside the server what it would see outside.

use std::sync::{Arc, Weak};

use agent_sdk::{
    async_trait, new_request_id, AgentClient, Cancel, ClientError, ClientResult, EventStream,
    TurnRequests,
};
use proto_spec::*;

use crate::engine::auth::Identity;
use crate::engine::error::Error;
use crate::engine::service::{ForTurn, Orchestrator};

/// An agent's client inside the server.
#[derive(Debug, Clone)]
pub struct InProcessClient {
    orch: Weak<Orchestrator>,
    _keep: Option<Arc<Orchestrator>>,
    who: Identity,
    /// The claim its writes are made under (a turn run on a cluster).
    fence: Option<crate::engine::store::Fence>,
    /// A conversation and the author's key whose event must be in its log ahead of every write
    /// this client makes there (an attempt's `turn_start`, not waited for).
    after: Option<(String, String)>,
}

fn rpc(e: Error) -> ClientError {
    ClientError::Rpc(e.to_rpc())
}

/// An answer whose conversation keys become ids within their tenant, as serializing it for
/// the wire makes them (in the default tenant a key is the id: nothing changes).
trait Local {
    fn local(self) -> Self;
}

fn local_id(key: &mut String) {
    if let Some((_, id)) = key.split_once('/') {
        *key = id.to_string();
    }
}

impl Local for Event {
    fn local(mut self) -> Self {
        local_id(&mut self.conversation_id);
        self
    }
}

impl Local for Snapshot {
    fn local(mut self) -> Self {
        local_id(&mut self.conversation_id);
        if let Some(p) = &mut self.parent_conversation_id {
            local_id(p);
        }
        self
    }
}

impl Local for DeleteConversationResult {
    fn local(mut self) -> Self {
        self.deleted.iter_mut().for_each(local_id);
        self
    }
}

impl Local for CreateConversationResult {
    fn local(mut self) -> Self {
        local_id(&mut self.conversation_id);
        self
    }
}

impl Local for ClaimTurnResult {
    fn local(mut self) -> Self {
        local_id(&mut self.conversation_id);
        self
    }
}

impl Local for RequestTurnNotification {
    fn local(mut self) -> Self {
        local_id(&mut self.conversation_id);
        self
    }
}

impl Local for ListConversationsResult {
    fn local(mut self) -> Self {
        self.conversations = self.conversations.into_iter().map(Local::local).collect();
        self
    }
}

impl Local for TailResult {
    fn local(mut self) -> Self {
        self.events = self.events.into_iter().map(Local::local).collect();
        self
    }
}

impl Local for GetUpdatesResult {
    fn local(mut self) -> Self {
        self.messages = self.messages.into_iter().map(Local::local).collect();
        self
    }
}

impl InProcessClient {
    /// A client speaking as `who`.
    pub fn new(orch: Arc<Orchestrator>, who: Identity) -> Self {
        InProcessClient {
            orch: Arc::downgrade(&orch),
            _keep: Some(orch),
            who,
            fence: None,
            after: None,
        }
    }

    /// A client for an internal agent, speaking as `who`, that does not keep the orchestrator
    /// alive.
    pub fn from_weak(orch: Weak<Orchestrator>, who: Identity) -> Self {
        InProcessClient {
            orch,
            _keep: None,
            who,
            fence: None,
            after: None,
        }
    }

    /// Its writes carry `fence`: refused once the claim they are made under is taken.
    pub fn with_fence(mut self, fence: Option<crate::engine::store::Fence>) -> Self {
        self.fence = fence;
        self
    }

    /// What a write into `conversation` with idempotency key `key` carries: the condition
    /// the client holds its writes there to, except for the write it names (an attempt's
    /// `turn_start`), which nobody waits on and so trails ([`ForTurn::trailing`]).
    fn made(&self, conversation: &str, key: Option<&str>) -> ForTurn {
        let after = self
            .after
            .as_ref()
            .filter(|(c, _)| c == conversation)
            .map(|(_, after)| after.as_str());
        let own = after.is_some() && after == key;
        ForTurn {
            fence: self.fence,
            after: after.filter(|_| !own).map(str::to_string),
            trailing: own,
        }
    }

    fn o(&self) -> ClientResult<Arc<Orchestrator>> {
        self.orch.upgrade().ok_or(ClientError::Closed)
    }
}

impl agent_sdk::ExecutorClient for InProcessClient {
    /// On one node only. On a shared log the `turn_start` is also what tells a node, under the
    /// conversation's lock, that the turn is still its agent's before the agent runs (its view
    /// may not have caught up with another node's answer yet), so there the executor waits
    /// for it.
    fn hold_writes_to(&self, conversation_id: &str, key: &str) -> Option<Arc<dyn AgentClient>> {
        if self.o().ok()?.store().shared() {
            return None;
        }
        let mut c = self.clone();
        c.after = Some((conversation_id.to_string(), key.to_string()));
        Some(Arc::new(c))
    }
}

#[async_trait]
impl AgentClient for InProcessClient {
    fn agent_id(&self) -> &str {
        &self.who.agent_id
    }

    async fn authenticate(&self, token: &str) -> ClientResult<AuthenticateResult> {
        let who = self.o()?.authenticate(token).await.map_err(rpc)?;
        Ok(AuthenticateResult {
            ok: true,
            tenant: who.tenant.to_string(),
            agent_id: who.agent_id,
        })
    }

    async fn create_conversation(
        &self,
        p: CreateConversationParams,
    ) -> ClientResult<CreateConversationResult> {
        self.o()?
            .create_conversation(&self.who, p)
            .await
            .map(Local::local)
            .map_err(rpc)
    }

    async fn get_conversation(&self, conversation_id: &str) -> ClientResult<Snapshot> {
        self.o()?
            .get_conversation(
                &self.who,
                ConversationParams {
                    conversation_id: conversation_id.to_string(),
                },
            )
            .await
            .map(Local::local)
            .map_err(rpc)
    }

    async fn list_conversations(
        &self,
        p: ListConversationsParams,
    ) -> ClientResult<ListConversationsResult> {
        self.o()?
            .list_conversations(&self.who, p)
            .await
            .map(Local::local)
            .map_err(rpc)
    }

    async fn list_scenarios(&self) -> ClientResult<ListScenariosResult> {
        self.o()?.list_scenarios(&self.who).map_err(rpc)
    }

    async fn create_token(&self, p: CreateTokenParams) -> ClientResult<CreateTokenResult> {
        self.o()?.create_token(&self.who, p).await.map_err(rpc)
    }

    async fn list_tokens(&self, p: ListTokensParams) -> ClientResult<ListTokensResult> {
        self.o()?.list_tokens(&self.who, p).await.map_err(rpc)
    }

    async fn create_tenant(&self, p: CreateTenantParams) -> ClientResult<TenantSummary> {
        self.o()?.create_tenant(&self.who, p).await.map_err(rpc)
    }

    async fn list_tenants(&self) -> ClientResult<ListTenantsResult> {
        self.o()?
            .list_tenants(&self.who, ListTenantsParams {})
            .await
            .map_err(rpc)
    }

    async fn set_tenant_quotas(&self, p: SetTenantQuotasParams) -> ClientResult<TenantSummary> {
        self.o()?.set_tenant_quotas(&self.who, p).await.map_err(rpc)
    }

    async fn revoke_token(&self, p: RevokeTokenParams) -> ClientResult<RevokeTokenResult> {
        self.o()?.revoke_token(&self.who, p).await.map_err(rpc)
    }

    async fn tail(&self, p: TailParams) -> ClientResult<TailResult> {
        let o = self.o()?;
        o.tail(&self.who, p).await.map(Local::local).map_err(rpc)
    }

    async fn wait_for_change(&self, p: WaitForChangeParams) -> ClientResult<WaitForChangeResult> {
        let o = self.o()?;
        o.wait_for_change(&self.who, p).await.map_err(rpc)
    }

    async fn get_updates(&self, p: GetUpdatesParams) -> ClientResult<GetUpdatesResult> {
        let o = self.o()?;
        o.get_updates(&self.who, p)
            .await
            .map(Local::local)
            .map_err(rpc)
    }

    async fn send_message(&self, mut p: SendMessageParams) -> ClientResult<AppendResult> {
        p.client_request_id.get_or_insert_with(new_request_id);
        let made = self.made(&p.conversation_id, p.client_request_id.as_deref());
        self.o()?
            .send_message_for(&self.who, p, made)
            .await
            .map_err(rpc)
    }

    async fn send_trace(&self, mut p: SendTraceParams) -> ClientResult<AppendResult> {
        p.client_request_id.get_or_insert_with(new_request_id);
        let made = self.made(&p.conversation_id, p.client_request_id.as_deref());
        self.o()?
            .send_trace_for(&self.who, p, made)
            .await
            .map_err(rpc)
    }

    async fn subscribe(&self, p: SubscribeParams) -> ClientResult<EventStream> {
        let mut feed = self.o()?.subscribe(&self.who, p).await.map_err(rpc)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    _ = tx.closed() => return,
                    n = feed.next() => n,
                };
                match next {
                    Ok(Some(e)) => {
                        let event = (*e).clone().local();
                        let n = EventNotification {
                            conversation_id: event.conversation_id.clone(),
                            event,
                        };
                        if tx.send(n).is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(e) => {
                        tracing::error!(error = %e, "in-process subscription ended");
                        return;
                    }
                }
            }
        });
        Ok(EventStream::new(rx, None))
    }

    async fn register_executor(&self, _p: RegisterExecutorParams) -> ClientResult<TurnRequests> {
        let o = self.o()?;
        let turns = o.turns().clone();
        let agent = self.who.principal().into_owned();
        let (id, mut offers) = turns.register(&agent);
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Some(offer) = offers.recv().await {
                if tx.send(offer.local()).is_err() {
                    return;
                }
            }
        });
        Ok(TurnRequests::new(
            rx,
            Some(Cancel::new(move || turns.unregister(&agent, id))),
        ))
    }

    async fn claim_turn(&self, p: ClaimTurnParams) -> ClientResult<ClaimTurnResult> {
        self.o()?
            .claim_turn(&self.who, p)
            .await
            .map(Local::local)
            .map_err(rpc)
    }

    async fn delete_conversation(
        &self,
        conversation_id: &str,
    ) -> ClientResult<DeleteConversationResult> {
        let p = ConversationParams {
            conversation_id: conversation_id.to_string(),
        };
        self.o()?
            .delete_conversation(&self.who, p)
            .await
            .map(Local::local)
            .map_err(rpc)
    }

    async fn pause_conversation(&self, conversation_id: &str) -> ClientResult<SeqResult> {
        let p = ConversationParams {
            conversation_id: conversation_id.to_string(),
        };
        self.o()?
            .pause_conversation(&self.who, p)
            .await
            .map_err(rpc)
    }

    async fn resume_conversation(&self, conversation_id: &str) -> ClientResult<SeqResult> {
        let p = ConversationParams {
            conversation_id: conversation_id.to_string(),
        };
        self.o()?
            .resume_conversation(&self.who, p)
            .await
            .map_err(rpc)
    }

    async fn fork_conversation(
        &self,
        p: ForkConversationParams,
    ) -> ClientResult<CreateConversationResult> {
        let o = self.o()?;
        o.fork_conversation(&self.who, p)
            .await
            .map(Local::local)
            .map_err(rpc)
    }
}
