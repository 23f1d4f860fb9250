//! [`WsJsonRpcClient`]: the protocol over WebSocket, for agents in a partner's process.
//!
//! The handle is cheap to clone; one task owns the socket. When the connection drops the task
//! reconnects with exponential backoff and jitter, authenticates again, re-subscribes every
//! subscription from the last seq it delivered (per conversation), registers executors again,
//! and sends every unanswered call again. Appends always carry a clientRequestId (one is made
//! when the caller gives none), so a call sent again after its answer was lost appends nothing
//! and answers with the original seq. Calls have no client-side timeout: a long
//! `waitForChange` lasts as long as the server lets it.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::{SinkExt, StreamExt};
use proto_spec::method::names;
use proto_spec::*;
use rand::Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};
use tokio_tungstenite::tungstenite::Message;

use crate::client::*;

mod task;
use task::{open, Task};

/// How the client connects and reconnects.
#[derive(Debug, Clone)]
pub struct WsConfig {
    /// `ws://host:port/rpc`, or `wss://…` over TLS.
    pub url: String,
    /// For `wss://`: a PEM file of CA certificates trusted besides the built-in roots (for a
    /// server whose certificate an operator's own CA signed). Defaults to the file
    /// [`crate::tls::CA_FILE_ENV`] names.
    pub ca_file: Option<std::path::PathBuf>,
    /// The agent's token.
    pub token: String,
    /// The first reconnect delay.
    pub backoff_min: Duration,
    /// The longest reconnect delay.
    pub backoff_max: Duration,
}

impl WsConfig {
    /// Defaults: backoff from 50 ms to 5 s; the CA file [`crate::tls::CA_FILE_ENV`] names.
    pub fn new(url: impl Into<String>, token: impl Into<String>) -> Self {
        WsConfig {
            url: url.into(),
            ca_file: std::env::var_os(crate::tls::CA_FILE_ENV)
                .filter(|v| !v.is_empty())
                .map(Into::into),
            token: token.into(),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(5),
        }
    }
}

/// Counters of a client's connection.
#[derive(Debug, Default)]
pub struct WsStats {
    /// Connections made after the first.
    pub reconnects: AtomicU64,
    /// Calls sent again on a new connection.
    pub resent: AtomicU64,
    /// Events dropped because they were delivered before (after a resubscribe).
    pub duplicates_dropped: AtomicU64,
}

/// A JSON-RPC client over WebSocket that survives reconnects. See the module docs.
#[derive(Debug, Clone)]
pub struct WsJsonRpcClient {
    tx: mpsc::UnboundedSender<Cmd>,
    agent_id: Arc<str>,
    token: Arc<str>,
    stats: Arc<WsStats>,
    /// The conversation and key this client's writes there are held to
    /// ([`ExecutorClient::hold_writes_to`]): each carries it as `afterKey`, but the write it names.
    after: Option<(Arc<str>, Arc<str>)>,
}

type Reply = oneshot::Sender<ClientResult<Value>>;

#[derive(Debug)]
enum Cmd {
    Call {
        method: &'static str,
        params: Value,
        reply: Reply,
    },
    Subscribe {
        conversation_id: Option<String>,
        since: Option<u64>,
        cursors: BTreeMap<String, u64>,
        sink: mpsc::UnboundedSender<EventNotification>,
        reply: oneshot::Sender<ClientResult<u64>>,
    },
    Register {
        sink: mpsc::UnboundedSender<RequestTurnNotification>,
        reply: oneshot::Sender<ClientResult<u64>>,
    },
    Drop(u64),
    Cut,
}

#[derive(Debug)]
enum SubKind {
    Events {
        conversation_id: Option<String>,
        since: Option<u64>,
        cursors: BTreeMap<String, u64>,
        sink: mpsc::UnboundedSender<EventNotification>,
    },
    Turns {
        sink: mpsc::UnboundedSender<RequestTurnNotification>,
    },
}

#[derive(Debug)]
struct Sub {
    kind: SubKind,
    server_id: Option<String>,
    /// Answered when the first subscribe call is answered.
    started: Option<oneshot::Sender<ClientResult<u64>>>,
}

#[derive(Debug)]
enum Waiting {
    Call {
        method: &'static str,
        params: Value,
        reply: Reply,
        sent: u32,
    },
    SubStart(u64),
    Ignore,
}

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

fn sub_key(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl WsJsonRpcClient {
    /// Connects and authenticates; fails if the first connection or the token fails. Later
    /// connection losses are repaired in the background.
    pub async fn connect(config: WsConfig) -> ClientResult<WsJsonRpcClient> {
        let (mut ws, agent_id) = open(&config).await?;
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(WsStats::default());
        let token: Arc<str> = config.token.as_str().into();
        let task = Task::new(config, rx, stats.clone());
        ws.flush()
            .await
            .map_err(|e| ClientError::Transport(e.to_string()))?;
        tokio::spawn(task.run(ws));
        Ok(WsJsonRpcClient {
            tx,
            agent_id: agent_id.into(),
            token,
            stats,
            after: None,
        })
    }

    /// The key a write with idempotency key `key` into `conversation_id` is held to, if any
    /// (never the write's own: the one the condition names is not held).
    fn held_to(&self, conversation_id: &str, key: &str) -> Option<String> {
        self.after
            .as_ref()
            .filter(|(c, after)| &**c == conversation_id && &**after != key)
            .map(|(_, after)| after.to_string())
    }

    /// Whether the client has stopped for good (its token was refused on a reconnect, or it
    /// was shut down): every call fails from then on.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// The connection's counters.
    pub fn stats(&self) -> &Arc<WsStats> {
        &self.stats
    }

    /// Drops the current connection as a network failure would (the client reconnects). For
    /// tests of recovery.
    pub fn cut_connection(&self) {
        let _ = self.tx.send(Cmd::Cut);
    }

    async fn call<P: Serialize, R: DeserializeOwned>(
        &self,
        method: &'static str,
        p: &P,
    ) -> ClientResult<R> {
        let params = serde_json::to_value(p).map_err(|e| ClientError::Transport(e.to_string()))?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Call {
                method,
                params,
                reply,
            })
            .map_err(|_| ClientError::Closed)?;
        let v = rx.await.map_err(|_| ClientError::Closed)??;
        serde_json::from_value(v)
            .map_err(|e| ClientError::Transport(format!("bad answer to {method}: {e}")))
    }
}

fn cancel(tx: &mpsc::UnboundedSender<Cmd>, local: u64) -> Cancel {
    let tx = tx.clone();
    Cancel::new(move || {
        let _ = tx.send(Cmd::Drop(local));
    })
}

impl ExecutorClient for WsJsonRpcClient {
    /// The same connection, its writes into `conversation_id` carrying `afterKey` (calls on a
    /// connection reach the server's writer in the order they are sent, so the trace an
    /// executor sends first lands ahead of them, or they are refused).
    fn hold_writes_to(&self, conversation_id: &str, key: &str) -> Option<Arc<dyn AgentClient>> {
        let mut held = self.clone();
        held.after = Some((conversation_id.into(), key.into()));
        Some(Arc::new(held))
    }
}

/// The most pages of a listing the client reads to seed its cursors (a million conversations).
const ALL_PAGES: usize = 1_000;

#[async_trait]
impl AgentClient for WsJsonRpcClient {
    fn agent_id(&self) -> &str {
        &self.agent_id
    }

    async fn authenticate(&self, token: &str) -> ClientResult<AuthenticateResult> {
        // On this connection the identity stays the one the client was made with: checking
        // another token would switch it, so only the client's own token is accepted here.
        if token != &*self.token {
            return Err(ClientError::Rpc(RpcError::new(
                ErrorCode::InvalidParams,
                "a WsJsonRpcClient speaks as the agent it was made for; connect a new client for another token",
            )));
        }
        self.call(
            names::AUTHENTICATE,
            &AuthenticateParams {
                token: token.to_string(),
            },
        )
        .await
    }

    async fn create_conversation(
        &self,
        mut p: CreateConversationParams,
    ) -> ClientResult<CreateConversationResult> {
        // Name it here, so that sending the call again cannot create a second conversation.
        if p.conversation_id.is_none() {
            p.conversation_id = Some(new_request_id());
        }
        self.call(names::CREATE_CONVERSATION, &p).await
    }

    async fn get_conversation(&self, conversation_id: &str) -> ClientResult<Snapshot> {
        self.call(
            names::GET_CONVERSATION,
            &ConversationParams {
                conversation_id: conversation_id.into(),
            },
        )
        .await
    }

    async fn list_conversations(
        &self,
        p: ListConversationsParams,
    ) -> ClientResult<ListConversationsResult> {
        self.call(names::LIST_CONVERSATIONS, &p).await
    }

    async fn list_scenarios(&self) -> ClientResult<ListScenariosResult> {
        self.call(names::LIST_SCENARIOS, &ListScenariosParams {})
            .await
    }

    async fn create_token(&self, p: CreateTokenParams) -> ClientResult<CreateTokenResult> {
        self.call(names::CREATE_TOKEN, &p).await
    }

    async fn list_tokens(&self, p: ListTokensParams) -> ClientResult<ListTokensResult> {
        self.call(names::LIST_TOKENS, &p).await
    }

    async fn create_tenant(&self, p: CreateTenantParams) -> ClientResult<TenantSummary> {
        self.call(names::CREATE_TENANT, &p).await
    }

    async fn list_tenants(&self) -> ClientResult<ListTenantsResult> {
        self.call(names::LIST_TENANTS, &ListTenantsParams {}).await
    }

    async fn set_tenant_quotas(&self, p: SetTenantQuotasParams) -> ClientResult<TenantSummary> {
        self.call(names::SET_TENANT_QUOTAS, &p).await
    }

    async fn revoke_token(&self, p: RevokeTokenParams) -> ClientResult<RevokeTokenResult> {
        self.call(names::REVOKE_TOKEN, &p).await
    }

    async fn tail(&self, p: TailParams) -> ClientResult<TailResult> {
        self.call(names::TAIL, &p).await
    }

    async fn wait_for_change(&self, p: WaitForChangeParams) -> ClientResult<WaitForChangeResult> {
        self.call(names::WAIT_FOR_CHANGE, &p).await
    }

    async fn get_updates(&self, p: GetUpdatesParams) -> ClientResult<GetUpdatesResult> {
        self.call(names::GET_UPDATES_OR_GUIDANCE, &p).await
    }

    async fn send_message(&self, mut p: SendMessageParams) -> ClientResult<AppendResult> {
        let key = p.client_request_id.get_or_insert_with(new_request_id);
        if p.after_key.is_none() {
            p.after_key = self.held_to(&p.conversation_id, key);
        }
        self.call(names::SEND_MESSAGE, &p).await
    }

    async fn send_trace(&self, mut p: SendTraceParams) -> ClientResult<AppendResult> {
        let key = p.client_request_id.get_or_insert_with(new_request_id);
        if p.after_key.is_none() {
            p.after_key = self.held_to(&p.conversation_id, key);
        }
        self.call(names::SEND_TRACE, &p).await
    }

    async fn subscribe(&self, p: SubscribeParams) -> ClientResult<EventStream> {
        // Pin "from now" to a cursor, so that a resubscription after a reconnect starts there.
        let mut cursors = p.cursors.unwrap_or_default();
        let since = match (&p.conversation_id, p.since_seq) {
            (Some(c), None) => Some(self.get_conversation(c).await?.latest_seq),
            (None, since) => {
                // Seed a cursor for every existing conversation, so that a resubscription
                // replays only the conversations created after this call from their start.
                let mine = ListConversationsParams {
                    participant: Some(self.agent_id().to_string()),
                    ..Default::default()
                };
                for s in crate::all_conversations(self, mine, ALL_PAGES).await? {
                    let at = since.map_or(s.latest_seq, |since| since.min(s.latest_seq));
                    cursors.entry(s.conversation_id).or_insert(at);
                }
                since
            }
            (_, since) => since,
        };
        if let (Some(c), Some(s)) = (&p.conversation_id, since) {
            cursors.insert(c.clone(), s);
        }
        let (sink, rx) = mpsc::unbounded_channel();
        let (reply, started) = oneshot::channel();
        self.tx
            .send(Cmd::Subscribe {
                conversation_id: p.conversation_id,
                since,
                cursors,
                sink,
                reply,
            })
            .map_err(|_| ClientError::Closed)?;
        let local = started.await.map_err(|_| ClientError::Closed)??;
        Ok(EventStream::new(rx, Some(cancel(&self.tx, local))))
    }

    async fn register_executor(&self, _p: RegisterExecutorParams) -> ClientResult<TurnRequests> {
        let (sink, rx) = mpsc::unbounded_channel();
        let (reply, started) = oneshot::channel();
        self.tx
            .send(Cmd::Register { sink, reply })
            .map_err(|_| ClientError::Closed)?;
        let local = started.await.map_err(|_| ClientError::Closed)??;
        Ok(TurnRequests::new(rx, Some(cancel(&self.tx, local))))
    }

    async fn claim_turn(&self, p: ClaimTurnParams) -> ClientResult<ClaimTurnResult> {
        self.call(names::CLAIM_TURN, &p).await
    }

    async fn delete_conversation(
        &self,
        conversation_id: &str,
    ) -> ClientResult<DeleteConversationResult> {
        self.call(
            names::DELETE_CONVERSATION,
            &ConversationParams {
                conversation_id: conversation_id.into(),
            },
        )
        .await
    }

    async fn pause_conversation(&self, conversation_id: &str) -> ClientResult<SeqResult> {
        self.call(
            names::PAUSE_CONVERSATION,
            &ConversationParams {
                conversation_id: conversation_id.into(),
            },
        )
        .await
    }

    async fn resume_conversation(&self, conversation_id: &str) -> ClientResult<SeqResult> {
        self.call(
            names::RESUME_CONVERSATION,
            &ConversationParams {
                conversation_id: conversation_id.into(),
            },
        )
        .await
    }

    async fn fork_conversation(
        &self,
        p: ForkConversationParams,
    ) -> ClientResult<CreateConversationResult> {
        self.call(names::FORK_CONVERSATION, &p).await
    }
}
