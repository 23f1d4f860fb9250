// The protocol's wire types, generated from proto-spec/schemas by scripts/gen-sdk-types
// (do not edit: run the script; the SDK's tests fail when this file and the schemas
// drift apart).

/** `sendMessage` and `sendTrace` result. */
export interface AppendResult {
  /** True when this was a retry of an earlier append: nothing was appended. */
  duplicate: boolean;
  /** The seq of the appended event (of the original, for a duplicate). */
  seq: number;
  /** The turn it belongs to. */
  turn: number;
}

/** An approver's decision at a checkpoint. */
export type ApprovalDecision = "approved" | "rejected";

/** `approval_requested`: `for` waits for `approver`. */
export interface ApprovalRequested {
  /** Who decides. */
  approver: string;
  /** The speaker waiting for approval. */
  for: string;
  /** The mode the waiting speaker was asked for; its turn asks for it once approved. */
  mode?: Mode | null;
  /** In a `sequence`, the waiting speaker's place in it. */
  position?: number | null;
}

/** A file or blob attached to a message: by `uri`, or inline as `content`. */
export interface Attachment {
  /** The content itself (text, or base64 for binary media types). */
  content?: string | null;
  /** The media type, such as `text/plain`. */
  mediaType: string;
  /** A file name for people. */
  name: string;
  /** Where the content lives. */
  uri?: string | null;
}

/** `authenticate` params. */
export interface AuthenticateParams {
  /** The token printed by `orchestrator token create`. */
  token: string;
}

/** `authenticate` result. */
export interface AuthenticateResult {
  /** The identity the connection now speaks as. */
  agentId: string;
  /** Always true (a wrong token is an `Unauthenticated` error). */
  ok: boolean;
  /** The tenant the identity belongs to (`default` unless the operator made others). */
  tenant: string;
}

/** `paused`, `resumed`: who did it. */
export interface ChangedBy {
  /** The admin that paused or resumed. */
  by: string;
}

/** `claimTurn` params. */
export interface ClaimTurnParams {
  /** From `request_turn`. */
  claimId: string;
}

/** `claimTurn` result. */
export interface ClaimTurnResult {
  /** The conversation. */
  conversationId: string;
  /** When the claim expires, RFC 3339. */
  deadline: string;
  /** True when this executor holds the turn. */
  granted: boolean;
  /** The turn claimed; use it as `turnHint`. */
  turn: number;
}

/**
 * Params naming one conversation: `getConversation`, `pauseConversation`,
 * `resumeConversation`, `deleteConversation`.
 */
export interface ConversationParams {
  /** The conversation. */
  conversationId: string;
}

/** The lifecycle state of a conversation. */
export type ConversationStatus = "active" | "paused" | "closed";

/** `createConversation` params. */
export interface CreateConversationParams {
  /** The id to use; one is generated when absent. */
  conversationId?: string | null;
  /** The sub-conversation's task: the first message of its log, from `orchestrator`. */
  input?: MessagePayload | null;
  /** Free JSON kept with the conversation. */
  metadata?: unknown;
  /**
   * Makes this a sub-conversation of that conversation, which the caller must take part in
   * (any agent may open one; without a parent only admins create conversations). The parent
   * logs `subconversation_started` in the same transaction, and `subconversation_finished`
   * with the child's result when the child closes.
   */
  parentConversationId?: string | null;
  /** The agents that take part. */
  participants?: Array<string> | null;
  /** An inline scenario. */
  scenario?: unknown;
  /** The name of a scenario the server knows. */
  scenarioName?: string | null;
}

/** `createConversation` and `forkConversation` result. */
export interface CreateConversationResult {
  /** The new conversation's id. */
  conversationId: string;
}

/** `createTenant` params (operators). */
export interface CreateTenantParams {
  /** Its name: 1–64 lowercase letters, digits and `-`, not starting with `-`. */
  name: string;
}

/** `createToken` params. */
export interface CreateTokenParams {
  /** Whether it administers the tenant. */
  admin?: boolean;
  /**
   * The agent id it speaks as, in the caller's tenant (1–128 characters of letters, digits
   * and `. _ : @ -`).
   */
  agentId: string;
  /**
   * How long it is accepted from now, as a scenario's durations are written: milliseconds,
   * or text such as `"30d"`, `"12h"`, `"90m"` (at most ten years); until revoked when
   * absent.
   */
  expiresIn?: unknown;
  /** The tenant (operators only; the caller's own by default). */
  tenant?: string | null;
}

/**
 * `createToken` result: the token, shown this once (only its hash is stored), and what
 * `listTokens` shows of it.
 */
export interface CreateTokenResult {
  /** Whether it administers its tenant. */
  admin: boolean;
  /** The agent it speaks as. */
  agentId: string;
  /** When it stops being accepted (ms since the epoch). */
  expiresMs?: number | null;
  /** Its id (`revokeToken` takes it). */
  id: string;
  /** The tenant it belongs to. */
  tenant: string;
  /** The token. */
  token: string;
}

/** `created`: who takes part, who created it, and what it was created with. */
export interface Created {
  /** The agent that created it. */
  createdBy: string;
  /** The caller's metadata, as given. */
  metadata?: unknown;
  /** For a sub-conversation: the conversation that opened it. */
  parent?: ParentLink | null;
  /** The agents that take part, in order. */
  participants: Array<string>;
  /**
   * The turn policy recorded from the scenario (the server's own format; readers other than
   * the server treat it as opaque).
   */
  policy?: unknown;
  /** The scenario it was made from: its library name, or an inline scenario's `name`. */
  scenario?: string | null;
}

/** `deleteConversation` result. */
export interface DeleteConversationResult {
  /**
   * The conversations deleted: the one named, then its sub-conversations, each before those
   * below it.
   */
  deleted: Array<string>;
}

/** How a document is written. */
export type DocFormat = "markdown" | "json";

/** The `data` of a plan or deliverable message. */
export interface DocumentData {
  /** The document: a string for `markdown`, any JSON for `json`. */
  content: unknown;
  /** `markdown` or `json`. */
  format: DocFormat;
  /** The type name (`plan`, `deliverable`, or the declared one). */
  type: string;
  /**
   * 1 for the first document of this schema and type in the conversation, then 2, 3, …
   * Set by the orchestrator when the message is appended (what a writer sends is replaced).
   */
  version?: number;
}

/**
 * The JSON-RPC error object as it travels: `{code, message, data}`.
 * `data.error` always names the code (such as `"NotYourTurn"`).
 */
export interface ErrorObject {
  /** The numeric code. */
  code: number;
  /** Details for programs. */
  data?: unknown;
  /** A message for people. */
  message: string;
}

/** One entry of a conversation's log. */
export interface Event {
  /** The authenticated identity that wrote it; `orchestrator` for the server itself. */
  author: string;
  /** The writer's idempotency key, if it gave one. */
  clientRequestId?: string | null;
  /** The conversation this event belongs to. */
  conversationId: string;
  /** Messages only: `none`, `turn` or `conversation`. */
  finality?: Finality | null;
  /** `message`, `trace` or `system`. */
  kind: EventKind;
  /** For a message, a [`MessagePayload`]; for a trace, free JSON; for a system event, an object with `type`. */
  payload: unknown;
  /** Position in the log: starts at 1, dense, strictly increasing. The cursor on every transport. */
  seq: number;
  /** When it was committed, RFC 3339 UTC with milliseconds. */
  ts: string;
  /** The turn the event belongs to (turns start at 1). */
  turn: number;
}

/** What kind of entry an event is. */
export type EventKind = "message" | "trace" | "system";

/** The `event` notification's result. */
export interface EventNotification {
  /** The conversation. */
  conversationId: string;
  /** The committed event. */
  event: Event;
}

/** Query of `GET /conversations/{id}/events` (SSE). */
export interface EventsQuery {
  /**
   * Replay events after this seq (default 0: the whole log). A `Last-Event-ID` header
   * takes precedence: the stream resumes exactly after that seq.
   */
  sinceSeq?: number | null;
}

/** How an executor takes turns. */
export type ExecutorMode = "push";

/** Before an attempt. */
export interface ExecutorTraceTurnStart extends TurnAttempt {
  type: "turn_start";
}

/** After an attempt that returned. */
export interface ExecutorTraceTurnEnd extends TurnEnd {
  type: "turn_end";
}

/** A failed attempt (the agent's error, or `deadline exceeded`). */
export interface ExecutorTraceTurnError extends TurnError {
  type: "turn_error";
}

/** A trace the executors write around each invocation of an agent. */
export type ExecutorTrace =
  | ExecutorTraceTurnStart
  | ExecutorTraceTurnEnd
  | ExecutorTraceTurnError;

/** How final a message is. */
export type Finality = "none" | "turn" | "conversation";

/** How a sub-conversation ended. */
export type FinishStatus = "completed" | "stopped";

/** `forkConversation` params. */
export interface ForkConversationParams {
  /** The new conversation starts with the events up to this seq. */
  atSeq: number;
  /** The conversation to fork. */
  conversationId: string;
  /** The new id; one is generated when absent. */
  newConversationId?: string | null;
}

/** `forked_from`: the events up to `atSeq` are those of `from`. */
export interface ForkedFrom {
  /** The last seq copied. */
  atSeq: number;
  /** The conversation forked. */
  from: string;
}

/** `getUpdatesOrGuidance` params. */
export interface GetUpdatesParams {
  /** The conversation. */
  conversationId: string;
  /** At most this many messages. */
  limit?: number | null;
  /** Messages with seq greater than this (0 when absent). */
  sinceSeq?: number | null;
  /** When nothing is new, wait this long for a change first (0 or absent: answer at once). */
  timeoutMs?: number | null;
}

/** `getUpdatesOrGuidance` result. */
export interface GetUpdatesResult {
  /** Guidance for the caller. */
  guidance: Guidance;
  /** The latest seq covered by this answer; pass it as the next `sinceSeq`. */
  latestSeq: number;
  /** Message events after the cursor (traces and system events are left out). */
  messages: Array<Event>;
  /** The conversation's status. */
  status: ConversationStatus;
  /** True when the call waited and nothing changed. */
  timedOut: boolean;
}

/** What one agent may do now, computed from the log. */
export interface Guidance {
  /** When the current turn times out, RFC 3339, if it has a deadline. */
  deadline?: string | null;
  /**
   * The mode the current turn asks of its speaker (`converse`, `plan`, `build`); absent when
   * no speaker holds the turn.
   */
  mode?: Mode | null;
  /** Why the agent must wait, such as `paused` or `not_your_turn`. */
  reason?: string | null;
  /** The agent that holds the turn; absent when the conversation is open to all participants. */
  speaker?: string | null;
  /** `may_speak`, `wait` or `closed`. */
  status: GuidanceStatus;
  /** The current turn. */
  turn: number;
}

/** Whether an agent may speak. */
export type GuidanceStatus = "may_speak" | "wait" | "closed";

/** The body of every HTTP error. */
export interface HttpError {
  /** The protocol's error object: code, message, data (with the code's name). */
  error: ErrorObject;
}

/**
 * `listConversations` params: a page of the conversations the caller may read, newest
 * activity first, each filter narrowing it.
 */
export interface ListConversationsParams {
  /** Only conversations created after this time (RFC 3339). */
  createdAfter?: string | null;
  /** Where the page starts: the `nextCursor` of the page before (opaque). */
  cursor?: string | null;
  /** How many at most (1–1,000; default 100). */
  limit?: number | null;
  /**
   * Only conversations whose metadata has each of these keys with these values (in a URL's
   * query: `metadata=KEY:VALUE`, the value read as JSON when it is JSON, else as text).
   */
  metadata?: Record<string, unknown> | null;
  /** Only conversations this agent takes part in. */
  participant?: string | null;
  /** Only conversations whose id or metadata contains this text (case-insensitive). */
  query?: string | null;
  /**
   * Only conversations made from this scenario (its library name, or an inline scenario's
   * `name`).
   */
  scenario?: string | null;
  /**
   * Only conversations in this state: `active`, `paused`, `closed`, or `open` (active or
   * paused).
   */
  status?: ListStatus | null;
  /** Operators: another tenant's conversations. */
  tenant?: string | null;
  /** Only conversations with an event after this time (RFC 3339). */
  updatedAfter?: string | null;
}

/** `listConversations` result. */
export interface ListConversationsResult {
  /**
   * A snapshot of each conversation of the page the caller may read (those it takes part in
   * and the sub-conversations below them; every one of its tenant, for an admin), newest
   * activity first.
   */
  conversations: Array<Snapshot>;
  /** Where the next page starts, if there may be more. */
  nextCursor?: string | null;
}

/** `listScenarios` params (none). */
export type ListScenariosParams = Record<string, unknown>;

/** `listScenarios` result: the scenarios `createConversation` takes by `scenarioName`. */
export interface ListScenariosResult {
  /** Each scenario of the server's library, by name. */
  scenarios: Array<ScenarioInfo>;
}

/** The states `listConversations` filters by. */
export type ListStatus = "active" | "paused" | "closed" | "open";

/** `listTenants` params (none). */
export type ListTenantsParams = Record<string, unknown>;

/** `listTenants` result: every tenant, by name (operators). */
export interface ListTenantsResult {
  /** Each tenant. */
  tenants: Array<TenantSummary>;
}

/** `listTokens` params. */
export interface ListTokensParams {
  /** The tenant (operators only; the caller's own by default). */
  tenant?: string | null;
}

/** `listTokens` result: the caller's tenant's tokens, oldest first. */
export interface ListTokensResult {
  /** Each token. */
  tokens: Array<TokenSummary>;
}

/** The payload of a message. */
export interface MessagePayload {
  /** Attached files. */
  attachments?: Array<Attachment>;
  /** Structured content; selectors match on it. */
  data?: unknown;
  /**
   * The mode this message asks for: of the agents in `to`, and, when it closes the turn, of
   * the next speaker. Absent: the agent's default mode (the first it declares). Asking an
   * agent for a mode it does not declare is refused (`ModeNotSupported`).
   */
  mode?: Mode | null;
  /** A type name for `data`, such as `tool.request.v1`. */
  schema?: string | null;
  /** Free labels; selectors match on them. */
  tags?: Array<string>;
  /** What was said. */
  text: string;
  /** The agents this message is addressed to. */
  to?: Array<string>;
}

/** What an agent is asked to do with its turn. */
export type Mode = "converse" | "plan" | "build";

/** `next_speaker`: who speaks in turn `turn`. */
export interface NextSpeaker {
  /** The approver's decision that led here. */
  approval?: ApprovalDecision | null;
  /** With `reason: approval`, the speaker waiting for approval. */
  for?: string | null;
  /**
   * The mode the turn asks of the speaker: the one the closing message asked for, else the
   * speaker's default. Absent: `converse`.
   */
  mode?: Mode | null;
  /** In a `sequence`, the speaker's place in it. */
  position?: number | null;
  /** `approval`: the speaker is an approver deciding on [`NextSpeaker::for_speaker`]. */
  reason?: SpeakerReason | null;
  /** True when the same speaker is asked again after its turn timed out (`onTimeout: retry`). */
  retry?: boolean;
  /** With `approval: rejected`, the speaker that was skipped. */
  skipped?: string | null;
  /** The agent whose turn it is. */
  speaker: string;
  /** How long the turn may take (ms), from this event's time. */
  timeoutMs?: number | null;
  /** The turn. */
  turn: number;
}

/**
 * A participant's declaration of its plans or deliverables (`plan:` / `deliverable:` in a
 * scenario).
 */
export interface OutputSpec {
  /** `markdown` (the default) or `json`. */
  format?: DocFormat;
  /** For `json`: a JSON Schema the content must match. */
  schema?: unknown;
  /** For `markdown`: headings the text must have, in any order. */
  sections?: Array<string>;
  /**
   * The document's type name (what versions count by and context selects on); `plan` or
   * `deliverable` when absent.
   */
  type?: string | null;
}

/** A sub-conversation's place in its tree. */
export interface ParentLink {
  /** The conversation that opened it. */
  conversationId: string;
  /** How deep it is (1 for a child of a top-level conversation). */
  depth: number;
  /** The top-level conversation of its tree (logs written before it was recorded lack it). */
  root?: string | null;
}

/**
 * Body of `POST /conversations/{id}/messages`. An `Idempotency-Key` header is the
 * `clientRequestId` (giving both with different values is refused).
 */
export interface PostMessageBody {
  /** Idempotency key: a retry with the same key appends nothing. */
  clientRequestId?: string | null;
  /** `none`, `turn` or `conversation`. */
  finality: Finality;
  /** What is said. */
  payload: MessagePayload;
  /** Append only if this is still the current turn. */
  turnHint?: TurnHint | null;
}

/** `registerExecutor` params. */
export interface RegisterExecutorParams {
  /** Only `push`. */
  mode: ExecutorMode;
}

/** The `request_turn` notification's result. */
export interface RequestTurnNotification {
  /** The agent whose turn it is. */
  agentId: string;
  /** Pass this to `claimTurn`. */
  claimId: string;
  /** The conversation. */
  conversationId: string;
  /** How long the turn may take, in milliseconds from the claim. */
  deadlineMs: number;
  /** The mode the turn asks for (`converse` when absent). */
  mode?: Mode | null;
  /** Read the log after this seq for context. */
  sinceSeq: number;
  /** The turn offered; reply with it as `turnHint`. */
  turn: number;
}

/** `revokeToken` params: a token by its id, or every token of an agent (one of the two). */
export interface RevokeTokenParams {
  /** Every token of this agent instead. */
  agentId?: string | null;
  /** A token's id (at least 8 hex digits of it). */
  id?: string | null;
  /** The tenant (operators only; the caller's own by default). */
  tenant?: string | null;
}

/**
 * `revokeToken` result. The connections and streams that authenticated with a revoked token
 * are closed at once on the node that revoked it, and within the token recheck on the others.
 */
export interface RevokeTokenResult {
  /** How many tokens were revoked (0: none matched). */
  revoked: number;
}

/**
 * A scenario of the library, as far as a client needs it: who takes part, and who of them
 * the server runs. What each participant the server runs does (its command, its URL, its
 * source) is not shown.
 */
export interface ScenarioInfo {
  /** Its `description`, if it has one. */
  description?: string | null;
  /** Its name (`scenarioName`). */
  name: string;
  /** Its participants, in order. */
  participants: Array<ScenarioParticipant>;
}

/** A participant of a scenario of the library. */
export interface ScenarioParticipant {
  /**
   * Whether it is the scenario's caller: whoever creates a conversation from the scenario
   * speaks as it (and any agent may create one, not only an admin).
   */
  caller?: boolean;
  /** Its agent id. */
  id: string;
  /**
   * The kind the server runs it as (`scripted`, `llm`, …); none for an external participant,
   * which speaks for itself with a token of its own.
   */
  kind?: string | null;
}

/** `sendMessage` params. */
export interface SendMessageParams {
  /**
   * Append only if this agent's own earlier write to the conversation with this
   * `clientRequestId` is in the log ahead of this one (committed, or in the same batch
   * before it); refused with `InvalidParams` otherwise, and nothing is written. An executor
   * sends an attempt's `turn_start` trace and starts the agent without waiting for its
   * answer, naming the trace's key here on each write the attempt makes.
   */
  afterKey?: string | null;
  /** Idempotency key: a retry with the same key appends nothing. */
  clientRequestId?: string | null;
  /** The conversation. */
  conversationId: string;
  /** `none`, `turn` or `conversation`. */
  finality: Finality;
  /** What is said. */
  payload: MessagePayload;
  /** Append only if this is still the current turn. */
  turnHint?: TurnHint | null;
}

/** `sendTrace` params. */
export interface SendTraceParams {
  /**
   * Append only if this agent's own earlier write to the conversation with this
   * `clientRequestId` is in the log ahead of this one (committed, or in the same batch
   * before it); refused with `InvalidParams` otherwise, and nothing is written. An executor
   * sends an attempt's `turn_start` trace and starts the agent without waiting for its
   * answer, naming the trace's key here on each write the attempt makes.
   */
  afterKey?: string | null;
  /** Idempotency key. */
  clientRequestId?: string | null;
  /** The conversation. */
  conversationId: string;
  /**
   * Never valid: a trace carries no finality. Present only so that a trace
   * sent with one is answered `InvalidFinality` rather than ignored.
   */
  finality?: unknown;
  /** Free JSON for observability. */
  payload: unknown;
  /** The turn the trace belongs to; the current turn when absent. */
  turn?: number | null;
}

/** `pauseConversation` and `resumeConversation` result. */
export interface SeqResult {
  /** The seq of the system event that records the change. */
  seq: number;
}

/**
 * `setTenantQuotas` params (operators): the tenant's quotas, replacing those set before
 * (an absent one goes back to the server's default).
 */
export interface SetTenantQuotasParams {
  /** Its quotas. */
  quotas: TenantQuotas;
  /** The tenant. */
  tenant: string;
}

/** The state of a conversation at one point of its log. */
export interface Snapshot {
  /** The conversation. */
  conversationId: string;
  /** Guidance for the agent that asked. */
  guidance: Guidance;
  /** When its last event was committed, RFC 3339 (what a list sorts by last activity). */
  lastEventAt?: string | null;
  /** The seq of the last event (0 for an empty log). */
  latestSeq: number;
  /** For a sub-conversation: the conversation that opened it. */
  parentConversationId?: string | null;
  /** The agents that take part. */
  participants: Array<string>;
  /** The agent that holds the turn, if turns are assigned. */
  speaker?: string | null;
  /** `active`, `paused` or `closed`. */
  status: ConversationStatus;
  /** The current turn. */
  turn: number;
}

/** Why a speaker was named other than by the order. */
export type SpeakerReason = "approval";

/** The `data` of the orchestrator's closing message (schema [`STOP_SCHEMA`]). */
export interface StopData {
  /** Why it closed. */
  reason: StopReason;
}

/** Why the orchestrator closed a conversation (`data.reason` of its closing message). */
export type StopReason = "on_text" | "max_turns" | "idle_timeout" | "max_duration" | "turn_timeout" | "no_answer" | "sequence_done" | "no_rule_matched";

/** `subconversation_finished`: how `child` ended, and its result. */
export interface SubconversationFinished {
  /** The sub-conversation. */
  child: string;
  /** The seq of its closing message (in the child's log). */
  closedSeq: number;
  /** With `stopped`: the stop reason. */
  reason?: StopReason | null;
  /** Its last message from a participant, or `null`. */
  result?: SubconversationResult | null;
  /** Whether a participant closed it or the orchestrator stopped it. */
  status: FinishStatus;
}

/** A sub-conversation's result: its last message from a participant. */
export interface SubconversationResult {
  /** Its author. */
  author: string;
  /** Its data. */
  data?: unknown;
  /** Its schema. */
  schema?: string | null;
  /** The message's seq (in the child's log). */
  seq: number;
  /** Its text. */
  text?: string | null;
}

/** `subconversation_started`: `by` opened `child` at `depth`. */
export interface SubconversationStarted {
  /** Who opened it. */
  by: string;
  /** The sub-conversation. */
  child: string;
  /** Its depth. */
  depth: number;
}

/** `subscribe` params. */
export interface SubscribeParams {
  /** One conversation; absent: every conversation the caller takes part in, new ones included. */
  conversationId?: string | null;
  /**
   * Per-conversation cursors (without `conversationId` only): replay each named conversation
   * after its own seq; `sinceSeq` applies to the others. A client resuming a subscription
   * across every conversation passes what it has seen here, and `sinceSeq: 0` so that
   * conversations created while it was away are replayed from their start.
   */
  cursors?: Record<string, number> | null;
  /**
   * Replay events with seq greater than this first. Absent: only what is committed from now on
   * (with `conversationId`, the same as the latest seq).
   */
  sinceSeq?: number | null;
}

/** The first event of every conversation (seq 1, turn 1). */
export interface SystemEventCreated extends Created {
  type: "created";
}

/** The policy named who speaks in the current turn. */
export interface SystemEventNextSpeaker extends NextSpeaker {
  type: "next_speaker";
}

/** The next speaker has an approval checkpoint: the approver speaks first. */
export interface SystemEventApprovalRequested extends ApprovalRequested {
  type: "approval_requested";
}

/** The current turn ran past its deadline; it ends without an answer. */
export interface SystemEventTurnTimeout extends TurnTimeout {
  type: "turn_timeout";
}

/** No participant appended anything for the scenario's `stop.idleTimeout`. */
export interface SystemEventIdleTimeout {
  type: "idle_timeout";
}

/** The conversation reached the scenario's `stop.maxDuration`. */
export interface SystemEventMaxDuration {
  type: "max_duration";
}

/** An admin paused the conversation. */
export interface SystemEventPaused extends ChangedBy {
  type: "paused";
}

/** An admin resumed the conversation. */
export interface SystemEventResumed extends ChangedBy {
  type: "resumed";
}

/** The events before this one were copied from another conversation. */
export interface SystemEventForkedFrom extends ForkedFrom {
  type: "forked_from";
}

/** A sub-conversation of this one was opened (in the parent's log). */
export interface SystemEventSubconversationStarted extends SubconversationStarted {
  type: "subconversation_started";
}

/** A sub-conversation of this one closed (in the parent's log). */
export interface SystemEventSubconversationFinished extends SubconversationFinished {
  type: "subconversation_finished";
}

/** The payload of a `system` event, by its `type`. */
export type SystemEvent =
  | SystemEventCreated
  | SystemEventNextSpeaker
  | SystemEventApprovalRequested
  | SystemEventTurnTimeout
  | SystemEventIdleTimeout
  | SystemEventMaxDuration
  | SystemEventPaused
  | SystemEventResumed
  | SystemEventForkedFrom
  | SystemEventSubconversationStarted
  | SystemEventSubconversationFinished;

/** `tail` params. */
export interface TailParams {
  /** The conversation. */
  conversationId: string;
  /** At most this many events (the server caps it). */
  limit?: number | null;
  /** Return events with seq greater than this (0 for all). */
  sinceSeq?: number;
}

/** `tail` result. */
export interface TailResult {
  /** Events after the cursor, in seq order. */
  events: Array<Event>;
  /** The latest seq of the conversation when read. */
  latestSeq: number;
}

/**
 * A tenant's quotas: each one given holds it to that limit (0: none), each one absent leaves
 * the server's default (`serve --tenant-…`). Refusals are `TenantQuotaExceeded` (-32033) with
 * `data: {quota, limit, used}`, the quota by its name here.
 */
export interface TenantQuotas {
  /** Events appended a second (messages and traces, across the cluster). */
  appendsPerSecond?: number | null;
  /** WebSocket connections open at once (across the cluster). */
  connections?: number | null;
  /** Model tokens the tenant's `llm` participants spend a day (UTC). */
  llmTokensPerDay?: number | null;
  /** Conversations open at once. */
  openConversations?: number | null;
  /** Bytes of payload its conversations' logs hold. */
  storedBytes?: number | null;
  /** Tokens (credentials) it holds. */
  tokens?: number | null;
}

/** A tenant as `listTenants` shows it. */
export interface TenantSummary {
  /** When it was made (ms since the epoch). */
  createdMs: number;
  /** Its name. */
  name: string;
  /** The quotas set for it (those not set are the server's defaults). */
  quotas?: TenantQuotas;
  /** How many tokens it has. */
  tokens: number;
}

/** A token as `listTokens` shows it: never the token, nor its whole hash. */
export interface TokenSummary {
  /** Whether it administers its tenant. */
  admin: boolean;
  /** The agent it speaks as. */
  agentId: string;
  /** When it was made (ms since the epoch). */
  createdMs: number;
  /** When it stops being accepted (ms since the epoch). */
  expiresMs?: number | null;
  /** Its id: the first 12 hex digits of its hash (`revokeToken` takes it). */
  id: string;
  /** When it last authenticated (ms since the epoch; recorded at most once a minute). */
  lastUsedMs?: number | null;
  /** Whether it is an operator's (it administers every tenant). */
  operator?: boolean;
  /** The tenant it belongs to. */
  tenant: string;
}

/** Which invocation a trace reports on. */
export interface TurnAttempt {
  /** The agent invoked. */
  agent: string;
  /** The attempt (1 for the first). */
  attempt: number;
  /** The turn it was invoked for. */
  turn: number;
}

/** `turn_end`: how an attempt ended. */
export interface TurnEnd {
  /** The agent invoked. */
  agent: string;
  /** The attempt (1 for the first). */
  attempt: number;
  /** What the agent did. */
  outcome: TurnEndOutcome;
  /** The turn it was invoked for. */
  turn: number;
}

/** What an agent's attempt did. */
export type TurnEndOutcome = "posted" | "yield" | "no_action" | "complete" | "incomplete";

/** `turn_error`: a failed attempt. */
export interface TurnError {
  /** The agent invoked. */
  agent: string;
  /** The attempt (1 for the first). */
  attempt: number;
  /** What went wrong. */
  error: string;
  /** The turn it was invoked for. */
  turn: number;
}

/** The compare-and-set on the turn: the append succeeds only in this turn. */
export interface TurnHint {
  /** The turn the writer believes is current. */
  turn: number;
}

/** `turn_timeout`: turn `turn` of `speaker` ended without an answer. */
export interface TurnTimeout {
  /** Its speaker. */
  speaker: string;
  /** The turn that timed out. */
  turn: number;
}

/** `waitForChange` params. */
export interface WaitForChangeParams {
  /** The conversation. */
  conversationId: string;
  /** Wait until the latest seq is greater than this. */
  sinceSeq: number;
  /** How long to wait at most (the server caps it). */
  timeoutMs: number;
}

/** `waitForChange` result. */
export interface WaitForChangeResult {
  /** The latest seq when the wait ended. */
  latestSeq: number;
  /** True when the wait ended by timeout with nothing new. */
  timedOut: boolean;
}

/** Query of `GET /conversations/{id}/wait` (long-poll). */
export interface WaitQuery {
  /** Answer once the latest seq passes this (default 0). */
  sinceSeq?: number;
  /** How long to wait, in milliseconds (default 30,000; capped by the server's limit). */
  timeoutMs?: number | null;
}

/** Result of `GET /conversations/{id}/wait`. */
export interface WaitResult {
  /**
   * Events with seq > `sinceSeq`, in order (at most the server's tail limit; ask again
   * from the last one for more).
   */
  events: Array<Event>;
  /** The seq of the last event. */
  latestSeq: number;
  /** True when the wait ended with nothing after `sinceSeq`. */
  timedOut: boolean;
}

/** Result of `GET /me`: who the bearer token speaks as. */
export interface WhoAmI {
  /** Whether it is an admin (creates, pauses and resumes conversations). */
  admin: boolean;
  /** The agent id. */
  agentId: string;
  /** The tenant it belongs to. */
  tenant: string;
}
