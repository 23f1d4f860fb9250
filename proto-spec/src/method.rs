//! Method and notification names, and every method's params and result.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::event::{Event, Finality, MessagePayload};
use crate::guidance::{ConversationStatus, Guidance, Snapshot};

/// Method names, as they travel.
pub mod names {
    /// Authenticate the connection with a token.
    pub const AUTHENTICATE: &str = "authenticate";
    /// Create a conversation (admins).
    pub const CREATE_CONVERSATION: &str = "createConversation";
    /// A snapshot of a conversation with guidance for the caller.
    pub const GET_CONVERSATION: &str = "getConversation";
    /// Events after a cursor.
    pub const TAIL: &str = "tail";
    /// Wait until the log grows past a cursor, or a timeout.
    pub const WAIT_FOR_CHANGE: &str = "waitForChange";
    /// Messages after a cursor with guidance, waiting for change if there are none.
    pub const GET_UPDATES_OR_GUIDANCE: &str = "getUpdatesOrGuidance";
    /// Append a message.
    pub const SEND_MESSAGE: &str = "sendMessage";
    /// Append a trace.
    pub const SEND_TRACE: &str = "sendTrace";
    /// Subscribe to events (notification `event`).
    pub const SUBSCRIBE: &str = "subscribe";
    /// End a subscription made with `subscribe`.
    pub const UNSUBSCRIBE: &str = "unsubscribe";
    /// Become a push-claim executor (notification `request_turn`).
    pub const REGISTER_EXECUTOR: &str = "registerExecutor";
    /// End a `registerExecutor` subscription.
    pub const UNREGISTER_EXECUTOR: &str = "unregisterExecutor";
    /// Claim a turn offered by `request_turn`.
    pub const CLAIM_TURN: &str = "claimTurn";
    /// Pause a conversation (admins).
    pub const PAUSE_CONVERSATION: &str = "pauseConversation";
    /// Resume a paused conversation (admins).
    pub const RESUME_CONVERSATION: &str = "resumeConversation";
    /// Fork a conversation at a seq.
    pub const FORK_CONVERSATION: &str = "forkConversation";
    /// Delete a conversation and its sub-conversations (its tenant's admins, or its creator).
    pub const DELETE_CONVERSATION: &str = "deleteConversation";
    /// Lists the conversations the caller takes part in.
    pub const LIST_CONVERSATIONS: &str = "listConversations";
    /// Lists the server's scenario library (admins).
    pub const LIST_SCENARIOS: &str = "listScenarios";
    /// Mint a token of the caller's tenant (its admins).
    pub const CREATE_TOKEN: &str = "createToken";
    /// List the caller's tenant's tokens (its admins).
    pub const LIST_TOKENS: &str = "listTokens";
    /// Revoke tokens of the caller's tenant (its admins).
    pub const REVOKE_TOKEN: &str = "revokeToken";
    /// Make a tenant (operators).
    pub const CREATE_TENANT: &str = "createTenant";
    /// List the tenants (operators).
    pub const LIST_TENANTS: &str = "listTenants";
    /// Set a tenant's quotas (operators).
    pub const SET_TENANT_QUOTAS: &str = "setTenantQuotas";
    /// Notification: a committed event on a subscription.
    pub const EVENT: &str = "event";
    /// Notification: a turn offered to a push-claim executor.
    pub const REQUEST_TURN: &str = "request_turn";
}

/// `authenticate` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AuthenticateParams {
    /// The token printed by `orchestrator token create`.
    pub token: String,
}

/// `authenticate` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AuthenticateResult {
    /// Always true (a wrong token is an `Unauthenticated` error).
    pub ok: bool,
    /// The identity the connection now speaks as.
    pub agent_id: String,
    /// The tenant the identity belongs to (`default` unless the operator made others).
    pub tenant: String,
}

/// `createConversation` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateConversationParams {
    /// The id to use; one is generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    /// An inline scenario.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<Value>,
    /// The name of a scenario the server knows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario_name: Option<String>,
    /// The agents that take part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participants: Option<Vec<String>>,
    /// Free JSON kept with the conversation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Makes this a sub-conversation of that conversation, which the caller must take part in
    /// (any agent may open one; without a parent only admins create conversations). The parent
    /// logs `subconversation_started` in the same transaction, and `subconversation_finished`
    /// with the child's result when the child closes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_conversation_id: Option<String>,
    /// The sub-conversation's task: the first message of its log, from `orchestrator`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<MessagePayload>,
}

/// `createConversation` and `forkConversation` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateConversationResult {
    /// The new conversation's id.
    #[serde(serialize_with = "crate::tenant::local")]
    pub conversation_id: String,
}

/// Params naming one conversation: `getConversation`, `pauseConversation`,
/// `resumeConversation`, `deleteConversation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConversationParams {
    /// The conversation.
    pub conversation_id: String,
}

/// `tail` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TailParams {
    /// The conversation.
    pub conversation_id: String,
    /// Return events with seq greater than this (0 for all).
    #[serde(default)]
    pub since_seq: u64,
    /// At most this many events (the server caps it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// `tail` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TailResult {
    /// Events after the cursor, in seq order.
    pub events: Vec<Event>,
    /// The latest seq of the conversation when read.
    pub latest_seq: u64,
}

/// `waitForChange` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitForChangeParams {
    /// The conversation.
    pub conversation_id: String,
    /// Wait until the latest seq is greater than this.
    pub since_seq: u64,
    /// How long to wait at most (the server caps it).
    pub timeout_ms: u64,
}

/// `waitForChange` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitForChangeResult {
    /// The latest seq when the wait ended.
    pub latest_seq: u64,
    /// True when the wait ended by timeout with nothing new.
    pub timed_out: bool,
}

/// `getUpdatesOrGuidance` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GetUpdatesParams {
    /// The conversation.
    pub conversation_id: String,
    /// Messages with seq greater than this (0 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_seq: Option<u64>,
    /// At most this many messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// When nothing is new, wait this long for a change first (0 or absent: answer at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// `getUpdatesOrGuidance` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GetUpdatesResult {
    /// Message events after the cursor (traces and system events are left out).
    pub messages: Vec<Event>,
    /// Guidance for the caller.
    pub guidance: Guidance,
    /// The latest seq covered by this answer; pass it as the next `sinceSeq`.
    pub latest_seq: u64,
    /// The conversation's status.
    pub status: ConversationStatus,
    /// True when the call waited and nothing changed.
    pub timed_out: bool,
}

/// The compare-and-set on the turn: the append succeeds only in this turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TurnHint {
    /// The turn the writer believes is current.
    pub turn: u64,
}

/// `sendMessage` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SendMessageParams {
    /// The conversation.
    pub conversation_id: String,
    /// What is said.
    pub payload: MessagePayload,
    /// `none`, `turn` or `conversation`.
    pub finality: Finality,
    /// Append only if this is still the current turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_hint: Option<TurnHint>,
    /// Idempotency key: a retry with the same key appends nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_id: Option<String>,
    /// Append only if this agent's own earlier write to the conversation with this
    /// `clientRequestId` is in the log ahead of this one (committed, or in the same batch
    /// before it); refused with `InvalidParams` otherwise, and nothing is written. An executor
    /// sends an attempt's `turn_start` trace and starts the agent without waiting for its
    /// answer, naming the trace's key here on each write the attempt makes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_key: Option<String>,
}

impl SendMessageParams {
    /// A text message, with no turn hint and no idempotency key.
    pub fn text(
        conversation_id: impl Into<String>,
        text: impl Into<String>,
        finality: Finality,
    ) -> Self {
        SendMessageParams {
            conversation_id: conversation_id.into(),
            payload: MessagePayload::text(text),
            finality,
            turn_hint: None,
            client_request_id: None,
            after_key: None,
        }
    }
}

/// `sendTrace` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SendTraceParams {
    /// The conversation.
    pub conversation_id: String,
    /// Free JSON for observability.
    pub payload: Value,
    /// The turn the trace belongs to; the current turn when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<u64>,
    /// Idempotency key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_request_id: Option<String>,
    /// Never valid: a trace carries no finality. Present only so that a trace
    /// sent with one is answered `InvalidFinality` rather than ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finality: Option<Value>,
    /// Append only if this agent's own earlier write to the conversation with this
    /// `clientRequestId` is in the log ahead of this one (committed, or in the same batch
    /// before it); refused with `InvalidParams` otherwise, and nothing is written. An executor
    /// sends an attempt's `turn_start` trace and starts the agent without waiting for its
    /// answer, naming the trace's key here on each write the attempt makes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after_key: Option<String>,
}

/// `sendMessage` and `sendTrace` result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AppendResult {
    /// The seq of the appended event (of the original, for a duplicate).
    pub seq: u64,
    /// The turn it belongs to.
    pub turn: u64,
    /// True when this was a retry of an earlier append: nothing was appended.
    pub duplicate: bool,
}

/// `subscribe` params.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SubscribeParams {
    /// One conversation; absent: every conversation the caller takes part in, new ones included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conversation_id: Option<String>,
    /// Replay events with seq greater than this first. Absent: only what is committed from now on
    /// (with `conversationId`, the same as the latest seq).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since_seq: Option<u64>,
    /// Per-conversation cursors (without `conversationId` only): replay each named conversation
    /// after its own seq; `sinceSeq` applies to the others. A client resuming a subscription
    /// across every conversation passes what it has seen here, and `sinceSeq: 0` so that
    /// conversations created while it was away are replayed from their start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursors: Option<std::collections::BTreeMap<String, u64>>,
}

/// `listConversations` params: a page of the conversations the caller may read, newest
/// activity first, each filter narrowing it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListConversationsParams {
    /// How many at most (1–1,000; default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Where the page starts: the `nextCursor` of the page before (opaque).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<String>,
    /// Only conversations in this state: `active`, `paused`, `closed`, or `open` (active or
    /// paused).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ListStatus>,
    /// Only conversations this agent takes part in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub participant: Option<String>,
    /// Only conversations made from this scenario (its library name, or an inline scenario's
    /// `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    /// Only conversations whose metadata has each of these keys with these values (in a URL's
    /// query: `metadata=KEY:VALUE`, the value read as JSON when it is JSON, else as text).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "metadata_filter"
    )]
    pub metadata: Option<serde_json::Map<String, Value>>,
    /// Only conversations created after this time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<String>,
    /// Only conversations with an event after this time (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_after: Option<String>,
    /// Only conversations whose id or metadata contains this text (case-insensitive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub query: Option<String>,
    /// Operators: another tenant's conversations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A metadata filter: an object, or (as a URL's query carries it) `KEY:VALUE`.
fn metadata_filter<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<serde_json::Map<String, Value>>, D::Error> {
    match Value::deserialize(d)? {
        Value::Object(m) => Ok(Some(m)),
        Value::String(s) => {
            let (k, v) = s
                .split_once(':')
                .ok_or_else(|| serde::de::Error::custom("metadata: KEY:VALUE"))?;
            let value = serde_json::from_str(v).unwrap_or_else(|_| Value::String(v.into()));
            Ok(Some([(k.to_string(), value)].into_iter().collect()))
        }
        Value::Null => Ok(None),
        _ => Err(serde::de::Error::custom(
            "metadata: an object of the keys and values to match",
        )),
    }
}

/// The states `listConversations` filters by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ListStatus {
    /// Open and not paused.
    Active,
    /// Paused.
    Paused,
    /// Closed.
    Closed,
    /// Active or paused.
    Open,
}

/// `listConversations` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListConversationsResult {
    /// A snapshot of each conversation of the page the caller may read (those it takes part in
    /// and the sub-conversations below them; every one of its tenant, for an admin), newest
    /// activity first.
    pub conversations: Vec<Snapshot>,
    /// Where the next page starts, if there may be more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// `listScenarios` params (none).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListScenariosParams {}

/// `listScenarios` result: the scenarios `createConversation` takes by `scenarioName`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ListScenariosResult {
    /// Each scenario of the server's library, by name.
    pub scenarios: Vec<ScenarioInfo>,
}

/// A scenario of the library, as far as a client needs it: who takes part, and who of them
/// the server runs. What each participant the server runs does (its command, its URL, its
/// source) is not shown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScenarioInfo {
    /// Its name (`scenarioName`).
    pub name: String,
    /// Its `description`, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its participants, in order.
    pub participants: Vec<ScenarioParticipant>,
}

/// A participant of a scenario of the library.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScenarioParticipant {
    /// Its agent id.
    pub id: String,
    /// The kind the server runs it as (`scripted`, `llm`, …); none for an external participant,
    /// which speaks for itself with a token of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Whether it is the scenario's caller: whoever creates a conversation from the scenario
    /// speaks as it (and any agent may create one, not only an admin).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub caller: bool,
}

/// The `event` notification's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EventNotification {
    /// The conversation.
    #[serde(serialize_with = "crate::tenant::local")]
    pub conversation_id: String,
    /// The committed event.
    pub event: Event,
}

/// How an executor takes turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExecutorMode {
    /// The orchestrator offers turns with `request_turn`; the executor claims them.
    Push,
}

/// `registerExecutor` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RegisterExecutorParams {
    /// Only `push`.
    pub mode: ExecutorMode,
}

/// The `request_turn` notification's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RequestTurnNotification {
    /// The conversation.
    #[serde(serialize_with = "crate::tenant::local")]
    pub conversation_id: String,
    /// The agent whose turn it is.
    pub agent_id: String,
    /// Pass this to `claimTurn`.
    pub claim_id: String,
    /// The turn offered; reply with it as `turnHint`.
    pub turn: u64,
    /// How long the turn may take, in milliseconds from the claim.
    pub deadline_ms: u64,
    /// Read the log after this seq for context.
    pub since_seq: u64,
    /// The mode the turn asks for (`converse` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<crate::Mode>,
}

/// `claimTurn` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimTurnParams {
    /// From `request_turn`.
    pub claim_id: String,
}

/// `claimTurn` result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimTurnResult {
    /// True when this executor holds the turn.
    pub granted: bool,
    /// The conversation.
    #[serde(serialize_with = "crate::tenant::local")]
    pub conversation_id: String,
    /// The turn claimed; use it as `turnHint`.
    pub turn: u64,
    /// When the claim expires, RFC 3339.
    pub deadline: String,
}

/// `pauseConversation` and `resumeConversation` result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SeqResult {
    /// The seq of the system event that records the change.
    pub seq: u64,
}

/// `deleteConversation` result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeleteConversationResult {
    /// The conversations deleted: the one named, then its sub-conversations, each before those
    /// below it.
    #[serde(serialize_with = "crate::tenant::local_vec")]
    pub deleted: Vec<String>,
}

/// `forkConversation` params.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ForkConversationParams {
    /// The conversation to fork.
    pub conversation_id: String,
    /// The new conversation starts with the events up to this seq.
    pub at_seq: u64,
    /// The new id; one is generated when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_conversation_id: Option<String>,
}
