//! The [`AgentClient`] trait: every protocol method, whatever carries it.
//!
//! Two implementations exist: [`crate::WsJsonRpcClient`] (a partner's process, over
//! WebSocket) and the orchestrator's `InProcessClient` (inside the server, calling the same
//! method core that serves `/rpc`). Agent code only ever sees this trait.

use std::sync::Arc;

use async_trait::async_trait;
use proto_spec::*;
use tokio::sync::mpsc;

/// What a call can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The server refused the call with a protocol error.
    #[error("{0}")]
    Rpc(RpcError),
    /// The connection could not be made or an answer could not be read.
    #[error("transport: {0}")]
    Transport(String),
    /// The client was shut down.
    #[error("the client is closed")]
    Closed,
}

impl ClientError {
    /// The protocol error code, when the server answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Rpc(e) => Some(e.code),
            _ => None,
        }
    }
}

impl From<RpcError> for ClientError {
    fn from(e: RpcError) -> Self {
        ClientError::Rpc(e)
    }
}

/// The result of a client call.
pub type ClientResult<T> = std::result::Result<T, ClientError>;

/// Committed events, in seq order per conversation, with no gap and no duplicate (also across a
/// reconnect of the client). Dropping it ends the subscription.
#[derive(Debug)]
pub struct EventStream {
    rx: mpsc::UnboundedReceiver<EventNotification>,
    _cancel: Option<Cancel>,
}

/// Turns offered to this executor (`request_turn`). Dropping it unregisters.
#[derive(Debug)]
pub struct TurnRequests {
    rx: mpsc::UnboundedReceiver<RequestTurnNotification>,
    _cancel: Option<Cancel>,
}

/// Runs a closure when dropped (to end a subscription).
pub struct Cancel(Option<Box<dyn FnOnce() + Send>>);

impl std::fmt::Debug for Cancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Cancel")
    }
}

impl Cancel {
    /// Calls `f` on drop.
    pub fn new(f: impl FnOnce() + Send + 'static) -> Self {
        Cancel(Some(Box::new(f)))
    }
}

impl Drop for Cancel {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

impl EventStream {
    /// A stream fed by `rx`; `cancel` runs when the stream is dropped.
    pub fn new(rx: mpsc::UnboundedReceiver<EventNotification>, cancel: Option<Cancel>) -> Self {
        EventStream {
            rx,
            _cancel: cancel,
        }
    }

    /// The next event; `None` when the subscription ended (server stopping, client closed).
    pub async fn next(&mut self) -> Option<EventNotification> {
        self.rx.recv().await
    }
}

impl TurnRequests {
    /// Offers fed by `rx`; `cancel` runs when dropped.
    pub fn new(
        rx: mpsc::UnboundedReceiver<RequestTurnNotification>,
        cancel: Option<Cancel>,
    ) -> Self {
        TurnRequests {
            rx,
            _cancel: cancel,
        }
    }

    /// The next offer; `None` when the registration ended.
    pub async fn next(&mut self) -> Option<RequestTurnNotification> {
        self.rx.recv().await
    }
}

/// Every protocol method (DESIGN §6), as one agent sees it.
///
/// The identity is fixed when the client is made (WebSocket: the token it authenticates with;
/// in process: the identity it is given), so the author of everything it writes is that agent.
#[async_trait]
pub trait AgentClient: Send + Sync + std::fmt::Debug {
    /// The agent this client speaks as.
    fn agent_id(&self) -> &str;

    /// `authenticate`: checks a token and returns who it names. The client keeps speaking as the
    /// identity it was made with.
    async fn authenticate(&self, token: &str) -> ClientResult<AuthenticateResult>;
    /// `createConversation` (admins).
    async fn create_conversation(
        &self,
        p: CreateConversationParams,
    ) -> ClientResult<CreateConversationResult>;
    /// `getConversation`.
    async fn get_conversation(&self, conversation_id: &str) -> ClientResult<Snapshot>;
    /// `listConversations`: a page (newest activity first; `nextCursor` leads to the next).
    async fn list_conversations(
        &self,
        p: ListConversationsParams,
    ) -> ClientResult<ListConversationsResult>;
    /// `listScenarios` (admins).
    async fn list_scenarios(&self) -> ClientResult<ListScenariosResult>;
    /// `createToken` (a tenant's admins): a token of the tenant, shown this once.
    async fn create_token(&self, p: CreateTokenParams) -> ClientResult<CreateTokenResult>;
    /// `listTokens` (a tenant's admins; an operator names any tenant).
    async fn list_tokens(&self, p: ListTokensParams) -> ClientResult<ListTokensResult>;
    /// `createTenant` (operators).
    async fn create_tenant(&self, p: CreateTenantParams) -> ClientResult<TenantSummary>;
    /// `listTenants` (operators).
    async fn list_tenants(&self) -> ClientResult<ListTenantsResult>;
    /// `setTenantQuotas` (operators).
    async fn set_tenant_quotas(&self, p: SetTenantQuotasParams) -> ClientResult<TenantSummary>;
    /// `revokeToken` (a tenant's admins).
    async fn revoke_token(&self, p: RevokeTokenParams) -> ClientResult<RevokeTokenResult>;
    /// `tail`.
    async fn tail(&self, p: TailParams) -> ClientResult<TailResult>;
    /// `waitForChange`. Never cut by a client-side timeout: it lasts as long as the server lets it.
    async fn wait_for_change(&self, p: WaitForChangeParams) -> ClientResult<WaitForChangeResult>;
    /// `getUpdatesOrGuidance`.
    async fn get_updates(&self, p: GetUpdatesParams) -> ClientResult<GetUpdatesResult>;
    /// `sendMessage`. A clientRequestId is generated when none is given, so a retry appends
    /// nothing.
    async fn send_message(&self, p: SendMessageParams) -> ClientResult<AppendResult>;
    /// `sendTrace`, with the same retry rule.
    async fn send_trace(&self, p: SendTraceParams) -> ClientResult<AppendResult>;
    /// `subscribe`.
    async fn subscribe(&self, p: SubscribeParams) -> ClientResult<EventStream>;
    /// `registerExecutor`: turns offered to this client.
    async fn register_executor(&self, p: RegisterExecutorParams) -> ClientResult<TurnRequests>;
    /// `claimTurn`.
    async fn claim_turn(&self, p: ClaimTurnParams) -> ClientResult<ClaimTurnResult>;
    /// `pauseConversation` (admins).
    async fn pause_conversation(&self, conversation_id: &str) -> ClientResult<SeqResult>;
    /// `resumeConversation` (admins).
    async fn resume_conversation(&self, conversation_id: &str) -> ClientResult<SeqResult>;
    /// `deleteConversation` (its tenant's admins, or its creator): it and its
    /// sub-conversations.
    async fn delete_conversation(
        &self,
        conversation_id: &str,
    ) -> ClientResult<DeleteConversationResult>;
    /// `forkConversation`.
    async fn fork_conversation(
        &self,
        p: ForkConversationParams,
    ) -> ClientResult<CreateConversationResult>;
}

/// The client an executor runs an agent's turns through: an [`AgentClient`] that may also
/// hold an attempt's writes to its `turn_start`. Agents never meet it (their
/// [`crate::AgentContext`] holds an [`AgentClient`]); an executor uses it to send the
/// `turn_start` and run the agent without waiting for the trace's answer.
pub trait ExecutorClient: AgentClient {
    /// A client like this one whose writes into `conversation_id` are refused unless this
    /// agent's write with idempotency key `key` is in the log ahead of them (that write itself,
    /// made through it, is not held). `None` when the client cannot carry such a condition;
    /// the executor then waits for the trace first.
    fn hold_writes_to(&self, conversation_id: &str, key: &str) -> Option<Arc<dyn AgentClient>>;
}

/// A fresh idempotency key.
pub fn new_request_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

/// Every conversation `listConversations` answers for `p`, page after page (at most
/// `max_pages` of them, each of up to 1,000).
pub async fn all_conversations(
    client: &dyn AgentClient,
    mut p: ListConversationsParams,
    max_pages: usize,
) -> ClientResult<Vec<Snapshot>> {
    p.limit = Some(p.limit.unwrap_or(1_000));
    let mut all = Vec::new();
    for _ in 0..max_pages {
        let page = client.list_conversations(p.clone()).await?;
        all.extend(page.conversations);
        match page.next_cursor {
            Some(c) => p.cursor = Some(c),
            None => break,
        }
    }
    Ok(all)
}
