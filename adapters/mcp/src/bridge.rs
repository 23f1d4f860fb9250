//! The MCP tools, each a call of the orchestrator's protocol through [`WsJsonRpcClient`].
//!
//! The adapter keeps no conversation state: the cursor of `wait_for_updates` is the `sinceSeq`
//! its caller passes and gets back as `latestSeq`, so the adapter can be restarted at any
//! moment and the caller goes on from where it was. A protocol error becomes an MCP tool error
//! whose text says what to do next.

use std::sync::Arc;

use agent_sdk::proto::*;
use agent_sdk::{AgentClient, ClientError, WsConfig, WsJsonRpcClient};
use rmcp::handler::server::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Extensions, Implementation, ServerCapabilities, ServerConfig,
};
use rmcp::{schemars, tool, tool_handler, tool_router, ServerHandler};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::OnceCell;

/// The longest wait one `wait_for_updates` call asks the server for.
pub const MAX_WAIT_MS: u64 = 60_000;
/// The wait when the caller names none.
pub const DEFAULT_WAIT_MS: u64 = 25_000;

/// `wait_for_updates` arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitArgs {
    /// The conversation to follow.
    pub conversation_id: String,
    /// Return messages with a seq greater than this: pass the `latestSeq` of your previous
    /// call (0 or absent: from the start).
    #[serde(default)]
    pub since_seq: Option<u64>,
    /// How long to wait for something new when nothing is, in milliseconds (default 25,000;
    /// at most 60,000). 0 answers at once.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// `post_message` arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PostArgs {
    /// The conversation.
    pub conversation_id: String,
    /// What you say.
    pub text: String,
    /// `turn` (default: you are done speaking and the turn passes on), `none` (progress;
    /// you keep the turn) or `conversation` (this ends the conversation).
    #[serde(default)]
    pub finality: Option<Finality>,
    /// An idempotency key of your choice: posting again with the same key (after a timeout or
    /// a restart) appends nothing and returns the original result.
    #[serde(default)]
    pub client_request_id: Option<String>,
    /// Ask the next speaker for a mode: `converse`, `plan` (a plan) or `build` (a
    /// deliverable). Refused if it does not support that mode.
    #[serde(default)]
    pub mode: Option<Mode>,
}

/// `get_conversation` arguments.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConversationArgs {
    /// The conversation.
    pub conversation_id: String,
}

/// `list_conversations` arguments: a page, and what narrows it.
#[derive(Debug, Default, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListArgs {
    /// Where the page starts: `nextCursor` of the page before.
    #[serde(default)]
    pub cursor: Option<String>,
    /// How many at most (1-1000; default 100).
    #[serde(default)]
    pub limit: Option<u32>,
    /// Only `active`, `paused`, `closed` or `open` ones.
    #[serde(default)]
    pub status: Option<ListStatus>,
    /// Only those whose id or metadata contains this text.
    #[serde(default)]
    pub query: Option<String>,
}

/// The MCP server: four tools, each a call on the orchestrator as the caller's principal.
#[derive(Clone)]
pub struct Bridge {
    upstream: Upstream,
    tool_router: ToolRouter<Bridge>,
}

/// Whose connection a tool calls through.
#[derive(Clone)]
enum Upstream {
    /// The adapter's own agent (`--token`): over stdio, or one identity for every HTTP caller
    /// of a single-tenant local setup.
    Shared {
        config: WsConfig,
        client: Arc<OnceCell<Arc<WsJsonRpcClient>>>,
    },
    /// Each HTTP caller's own: the [`Caller`] the router put into its request.
    PerCaller,
}

/// The connection of an HTTP caller that authenticated with its own orchestrator token, put
/// into the request's extensions by the router; a tool's calls go through it.
#[derive(Clone, Debug)]
pub struct Caller(pub Arc<WsJsonRpcClient>);

impl std::fmt::Debug for Bridge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let upstream = match &self.upstream {
            Upstream::Shared { config, .. } => config.url.as_str(),
            Upstream::PerCaller => "each caller's own",
        };
        f.debug_struct("Bridge")
            .field("upstream", &upstream)
            .finish()
    }
}

/// A tool's answer: JSON for programs, and the same as text for models.
fn answer(value: Value) -> CallToolResult {
    let mut r = CallToolResult::success(vec![ContentBlock::text(value.to_string())]);
    r.structured_content = Some(value);
    r
}

/// What a caller should do after a protocol error.
fn advice(e: &RpcError) -> &'static str {
    match e.code {
        ErrorCode::NotYourTurn => {
            "It is not your turn. Call wait_for_updates with the latestSeq you have, and post when its guidance says may_speak."
        }
        ErrorCode::TurnMismatch | ErrorCode::TurnClosed => {
            "The turn has moved on. Call wait_for_updates to read what happened, then post again if it is your turn."
        }
        ErrorCode::ConversationClosed => {
            "The conversation is closed. Stop: nothing more can be posted to it."
        }
        ErrorCode::ConversationPaused => {
            "The conversation is paused. Call wait_for_updates and post once it resumes."
        }
        ErrorCode::ConversationNotFound => {
            "No such conversation. Call list_conversations to see the ones you take part in."
        }
        ErrorCode::Forbidden => "This is not allowed for you; the message says why.",
        ErrorCode::IdempotencyKeyReused => {
            "This clientRequestId was used before with another message. Use a new key for a new message."
        }
        ErrorCode::PayloadTooLarge => "The message is too large. Post a shorter one.",
        ErrorCode::ModeNotSupported => {
            "The next speaker does not support that mode. Ask for one of its modes (the message lists them), or for none."
        }
        ErrorCode::InvalidParams | ErrorCode::InvalidFinality => {
            "The arguments were refused; correct them as the message says."
        }
        ErrorCode::Unauthenticated => {
            "The token was refused by the orchestrator (unknown, revoked or expired): connect again with a valid one."
        }
        _ => "Try again in a moment.",
    }
}

/// A protocol error as an MCP tool error: the code, the server's message, what to do.
fn tool_error(e: ClientError) -> CallToolResult {
    let value = match &e {
        ClientError::Rpc(rpc) => json!({
            "error": rpc.code.name(),
            "code": rpc.code.code(),
            "message": rpc.message,
            "data": rpc.data,
            "whatToDo": advice(rpc),
        }),
        other => json!({
            "error": "Unavailable",
            "message": other.to_string(),
            "whatToDo": "The orchestrator cannot be reached right now; try again in a moment.",
        }),
    };
    let text = format!(
        "{}: {} {}",
        value["error"].as_str().unwrap_or("Error"),
        value["message"].as_str().unwrap_or_default(),
        value["whatToDo"].as_str().unwrap_or_default()
    );
    let mut r = CallToolResult::error(vec![ContentBlock::text(text)]);
    r.structured_content = Some(value);
    r
}

/// A message event as the tools show it: as agents' context shows it, with its finality.
fn message_view(e: &Event) -> Value {
    let mut v = agent_kinds::context::view(e);
    v["finality"] = json!(e.finality);
    v
}

type ToolResult = Result<CallToolResult, rmcp::ErrorData>;

#[tool_router]
impl Bridge {
    /// A bridge that speaks as the agent of `config`'s token, connecting to the orchestrator
    /// on first use (and reconnecting by itself).
    pub fn new(config: WsConfig) -> Bridge {
        Bridge {
            upstream: Upstream::Shared {
                config,
                client: Arc::new(OnceCell::new()),
            },
            tool_router: Self::tool_router(),
        }
    }

    /// A bridge whose every call goes through the [`Caller`] of its HTTP request: each MCP
    /// client acts as the principal of its own bearer token.
    pub fn per_caller() -> Bridge {
        Bridge {
            upstream: Upstream::PerCaller,
            tool_router: Self::tool_router(),
        }
    }

    async fn client(&self, ext: &Extensions) -> Result<Arc<WsJsonRpcClient>, ClientError> {
        match &self.upstream {
            Upstream::Shared { config, client } => client
                .get_or_try_init(|| async {
                    WsJsonRpcClient::connect(config.clone()).await.map(Arc::new)
                })
                .await
                .cloned(),
            Upstream::PerCaller => ext
                .get::<axum::http::request::Parts>()
                .and_then(|parts| parts.extensions.get::<Caller>())
                .map(|c| c.0.clone())
                .ok_or_else(|| {
                    ClientError::Transport("this call carries no caller's credentials".into())
                }),
        }
    }

    /// Runs `call` on the caller's connection: `view` of its result as the tool's answer, or
    /// the tool error that says what to do.
    async fn answered<R, Fut>(
        &self,
        ext: &Extensions,
        call: impl FnOnce(Arc<WsJsonRpcClient>) -> Fut,
        view: impl FnOnce(R) -> Value,
    ) -> ToolResult
    where
        Fut: std::future::Future<Output = Result<R, ClientError>>,
    {
        let client = match self.client(ext).await {
            Ok(c) => c,
            Err(e) => return Ok(tool_error(e)),
        };
        Ok(match call(client).await {
            Ok(r) => answer(view(r)),
            Err(e) => tool_error(e),
        })
    }

    #[tool(
        description = "Wait for new messages in a conversation and learn whether you may speak. Pass the latestSeq of your previous call as sinceSeq (0 the first time): you get the messages after it, guidance (status may_speak, wait or closed; the current turn and speaker), the conversation's status, and a new latestSeq to pass next time. Waits up to timeoutMs when nothing is new."
    )]
    async fn wait_for_updates(
        &self,
        Parameters(a): Parameters<WaitArgs>,
        ext: Extensions,
    ) -> ToolResult {
        let p = GetUpdatesParams {
            conversation_id: a.conversation_id,
            since_seq: a.since_seq,
            limit: None,
            timeout_ms: Some(a.timeout_ms.unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS)),
        };
        let view = |r: GetUpdatesResult| {
            json!({
                "messages": r.messages.iter().map(message_view).collect::<Vec<_>>(),
                "guidance": r.guidance,
                "status": r.status,
                "latestSeq": r.latest_seq,
                "timedOut": r.timed_out,
            })
        };
        self.answered(&ext, |c| async move { c.get_updates(p).await }, view)
            .await
    }

    #[tool(
        description = "Post a message to a conversation. finality: turn (default; you are done and the turn passes on), none (progress; you keep the turn) or conversation (ends the conversation). Give a clientRequestId to make a retry safe: the same key again appends nothing."
    )]
    async fn post_message(
        &self,
        Parameters(a): Parameters<PostArgs>,
        ext: Extensions,
    ) -> ToolResult {
        let p = SendMessageParams {
            conversation_id: a.conversation_id,
            payload: MessagePayload {
                mode: a.mode,
                ..MessagePayload::text(a.text)
            },
            finality: a.finality.unwrap_or(Finality::Turn),
            turn_hint: None,
            client_request_id: a.client_request_id,
            after_key: None,
        };
        let view =
            |r: AppendResult| json!({"seq": r.seq, "turn": r.turn, "duplicate": r.duplicate});
        self.answered(&ext, |c| async move { c.send_message(p).await }, view)
            .await
    }

    #[tool(
        description = "List the conversations you take part in, newest activity first, each with its status, latest seq, turn and guidance for you; a page at a time (nextCursor leads to the next), narrowed by status or a text in ids and metadata."
    )]
    async fn list_conversations(
        &self,
        Parameters(a): Parameters<ListArgs>,
        ext: Extensions,
    ) -> ToolResult {
        let p = ListConversationsParams {
            cursor: a.cursor,
            limit: a.limit,
            status: a.status,
            query: a.query,
            ..Default::default()
        };
        let view = |r: ListConversationsResult| serde_json::to_value(r).unwrap_or(Value::Null);
        self.answered(&ext, |c| async move { c.list_conversations(p).await }, view)
            .await
    }

    #[tool(
        description = "A conversation's state: status (active, paused or closed), latest seq, current turn and speaker, participants, and guidance for you."
    )]
    async fn get_conversation(
        &self,
        Parameters(a): Parameters<ConversationArgs>,
        ext: Extensions,
    ) -> ToolResult {
        let view = |r: Snapshot| serde_json::to_value(r).unwrap_or(Value::Null);
        let id = a.conversation_id;
        self.answered(&ext, |c| async move { c.get_conversation(&id).await }, view)
            .await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for Bridge {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new(
                "orchestrator-mcp",
                env!("CARGO_PKG_VERSION"),
            ))
            .with_instructions(
                "Take part in orchestrated conversations. Loop: wait_for_updates (pass back \
                 latestSeq as sinceSeq), and when guidance.status is may_speak, post_message. \
                 Stop when guidance.status is closed.",
            )
    }
}
