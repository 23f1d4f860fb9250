"""The protocol's wire types, generated from proto-spec/schemas by scripts/gen-sdk-types
(do not edit: run the script; tests/python/test_sdk_python.py fails when this file and the
schemas drift apart). Each is a TypedDict or a Literal: the dicts the client sends and
receives, typed for checkers, plain dicts at run time."""

from __future__ import annotations

from typing import Any, Literal, TypedDict


class AppendResult(TypedDict):
    """`sendMessage` and `sendTrace` result."""
    duplicate: bool
    """True when this was a retry of an earlier append: nothing was appended."""
    seq: int
    """The seq of the appended event (of the original, for a duplicate)."""
    turn: int
    """The turn it belongs to."""


ApprovalDecision = Literal["approved", "rejected"]
"""An approver's decision at a checkpoint."""


_ApprovalRequestedRequired = TypedDict("_ApprovalRequestedRequired", {"approver": "str", "for": "str"})
_ApprovalRequestedOptional = TypedDict("_ApprovalRequestedOptional", {"mode": "Mode | None", "position": "int | None"}, total=False)


class ApprovalRequested(_ApprovalRequestedRequired, _ApprovalRequestedOptional):
    """`approval_requested`: `for` waits for `approver`."""


class _AttachmentRequired(TypedDict):
    mediaType: str
    """The media type, such as `text/plain`."""
    name: str
    """A file name for people."""


class Attachment(_AttachmentRequired, total=False):
    """A file or blob attached to a message: by `uri`, or inline as `content`."""
    content: str | None
    """The content itself (text, or base64 for binary media types)."""
    uri: str | None
    """Where the content lives."""


class AuthenticateParams(TypedDict):
    """`authenticate` params."""
    token: str
    """The token printed by `orchestrator token create`."""


class AuthenticateResult(TypedDict):
    """`authenticate` result."""
    agentId: str
    """The identity the connection now speaks as."""
    ok: bool
    """Always true (a wrong token is an `Unauthenticated` error)."""
    tenant: str
    """The tenant the identity belongs to (`default` unless the operator made others)."""


class ChangedBy(TypedDict):
    """`paused`, `resumed`: who did it."""
    by: str
    """The admin that paused or resumed."""


class ClaimTurnParams(TypedDict):
    """`claimTurn` params."""
    claimId: str
    """From `request_turn`."""


class ClaimTurnResult(TypedDict):
    """`claimTurn` result."""
    conversationId: str
    """The conversation."""
    deadline: str
    """When the claim expires, RFC 3339."""
    granted: bool
    """True when this executor holds the turn."""
    turn: int
    """The turn claimed; use it as `turnHint`."""


class ConversationParams(TypedDict):
    """Params naming one conversation: `getConversation`, `pauseConversation`,
    `resumeConversation`, `deleteConversation`.
    """
    conversationId: str
    """The conversation."""


ConversationStatus = Literal["active", "paused", "closed"]
"""The lifecycle state of a conversation."""


class CreateConversationParams(TypedDict, total=False):
    """`createConversation` params."""
    conversationId: str | None
    """The id to use; one is generated when absent."""
    input: MessagePayload | None
    """The sub-conversation's task: the first message of its log, from `orchestrator`."""
    metadata: Any
    """Free JSON kept with the conversation."""
    parentConversationId: str | None
    """Makes this a sub-conversation of that conversation, which the caller must take part in
    (any agent may open one; without a parent only admins create conversations). The parent
    logs `subconversation_started` in the same transaction, and `subconversation_finished`
    with the child's result when the child closes.
    """
    participants: list[str] | None
    """The agents that take part."""
    scenario: Any
    """An inline scenario."""
    scenarioName: str | None
    """The name of a scenario the server knows."""


class CreateConversationResult(TypedDict):
    """`createConversation` and `forkConversation` result."""
    conversationId: str
    """The new conversation's id."""


class CreateTenantParams(TypedDict):
    """`createTenant` params (operators)."""
    name: str
    """Its name: 1–64 lowercase letters, digits and `-`, not starting with `-`."""


class _CreateTokenParamsRequired(TypedDict):
    agentId: str
    """The agent id it speaks as, in the caller's tenant (1–128 characters of letters, digits
    and `. _ : @ -`).
    """


class CreateTokenParams(_CreateTokenParamsRequired, total=False):
    """`createToken` params."""
    admin: bool
    """Whether it administers the tenant."""
    expiresIn: Any
    """How long it is accepted from now, as a scenario's durations are written: milliseconds,
    or text such as `"30d"`, `"12h"`, `"90m"` (at most ten years); until revoked when
    absent.
    """
    tenant: str | None
    """The tenant (operators only; the caller's own by default)."""


class _CreateTokenResultRequired(TypedDict):
    admin: bool
    """Whether it administers its tenant."""
    agentId: str
    """The agent it speaks as."""
    id: str
    """Its id (`revokeToken` takes it)."""
    tenant: str
    """The tenant it belongs to."""
    token: str
    """The token."""


class CreateTokenResult(_CreateTokenResultRequired, total=False):
    """`createToken` result: the token, shown this once (only its hash is stored), and what
    `listTokens` shows of it.
    """
    expiresMs: int | None
    """When it stops being accepted (ms since the epoch)."""


class _CreatedRequired(TypedDict):
    createdBy: str
    """The agent that created it."""
    participants: list[str]
    """The agents that take part, in order."""


class Created(_CreatedRequired, total=False):
    """`created`: who takes part, who created it, and what it was created with."""
    metadata: Any
    """The caller's metadata, as given."""
    parent: ParentLink | None
    """For a sub-conversation: the conversation that opened it."""
    policy: Any
    """The turn policy recorded from the scenario (the server's own format; readers other than
    the server treat it as opaque).
    """
    scenario: str | None
    """The scenario it was made from: its library name, or an inline scenario's `name`."""


class DeleteConversationResult(TypedDict):
    """`deleteConversation` result."""
    deleted: list[str]
    """The conversations deleted: the one named, then its sub-conversations, each before those
    below it.
    """


DocFormat = Literal["markdown", "json"]
"""How a document is written."""


class _DocumentDataRequired(TypedDict):
    content: Any
    """The document: a string for `markdown`, any JSON for `json`."""
    format: DocFormat
    """`markdown` or `json`."""
    type: str
    """The type name (`plan`, `deliverable`, or the declared one)."""


class DocumentData(_DocumentDataRequired, total=False):
    """The `data` of a plan or deliverable message."""
    version: int
    """1 for the first document of this schema and type in the conversation, then 2, 3, …
    Set by the orchestrator when the message is appended (what a writer sends is replaced).
    """


class _ErrorObjectRequired(TypedDict):
    code: int
    """The numeric code."""
    message: str
    """A message for people."""


class ErrorObject(_ErrorObjectRequired, total=False):
    """The JSON-RPC error object as it travels: `{code, message, data}`.
    `data.error` always names the code (such as `"NotYourTurn"`).
    """
    data: Any
    """Details for programs."""


class _EventRequired(TypedDict):
    author: str
    """The authenticated identity that wrote it; `orchestrator` for the server itself."""
    conversationId: str
    """The conversation this event belongs to."""
    kind: EventKind
    """`message`, `trace` or `system`."""
    payload: Any
    """For a message, a [`MessagePayload`]; for a trace, free JSON; for a system event, an object with `type`."""
    seq: int
    """Position in the log: starts at 1, dense, strictly increasing. The cursor on every transport."""
    ts: str
    """When it was committed, RFC 3339 UTC with milliseconds."""
    turn: int
    """The turn the event belongs to (turns start at 1)."""


class Event(_EventRequired, total=False):
    """One entry of a conversation's log."""
    clientRequestId: str | None
    """The writer's idempotency key, if it gave one."""
    finality: Finality | None
    """Messages only: `none`, `turn` or `conversation`."""


EventKind = Literal["message", "trace", "system"]
"""What kind of entry an event is."""


class EventNotification(TypedDict):
    """The `event` notification's result."""
    conversationId: str
    """The conversation."""
    event: Event
    """The committed event."""


class EventsQuery(TypedDict, total=False):
    """Query of `GET /conversations/{id}/events` (SSE)."""
    sinceSeq: int | None
    """Replay events after this seq (default 0: the whole log). A `Last-Event-ID` header
    takes precedence: the stream resumes exactly after that seq.
    """


ExecutorMode = Literal["push"]
"""How an executor takes turns."""


class TurnAttempt(TypedDict):
    """Which invocation a trace reports on."""
    agent: str
    """The agent invoked."""
    attempt: int
    """The attempt (1 for the first)."""
    turn: int
    """The turn it was invoked for."""


class TurnEnd(TypedDict):
    """`turn_end`: how an attempt ended."""
    agent: str
    """The agent invoked."""
    attempt: int
    """The attempt (1 for the first)."""
    outcome: TurnEndOutcome
    """What the agent did."""
    turn: int
    """The turn it was invoked for."""


class TurnError(TypedDict):
    """`turn_error`: a failed attempt."""
    agent: str
    """The agent invoked."""
    attempt: int
    """The attempt (1 for the first)."""
    error: str
    """What went wrong."""
    turn: int
    """The turn it was invoked for."""


class ExecutorTraceTurnStart(TurnAttempt):
    """Before an attempt."""
    type: Literal["turn_start"]


class ExecutorTraceTurnEnd(TurnEnd):
    """After an attempt that returned."""
    type: Literal["turn_end"]


class ExecutorTraceTurnError(TurnError):
    """A failed attempt (the agent's error, or `deadline exceeded`)."""
    type: Literal["turn_error"]


ExecutorTrace = (
    ExecutorTraceTurnStart
    | ExecutorTraceTurnEnd
    | ExecutorTraceTurnError
)
"""A trace the executors write around each invocation of an agent."""


Finality = Literal["none", "turn", "conversation"]
"""How final a message is."""


FinishStatus = Literal["completed", "stopped"]
"""How a sub-conversation ended."""


class _ForkConversationParamsRequired(TypedDict):
    atSeq: int
    """The new conversation starts with the events up to this seq."""
    conversationId: str
    """The conversation to fork."""


class ForkConversationParams(_ForkConversationParamsRequired, total=False):
    """`forkConversation` params."""
    newConversationId: str | None
    """The new id; one is generated when absent."""


_ForkedFromRequired = TypedDict("_ForkedFromRequired", {"atSeq": "int", "from": "str"})
_ForkedFromOptional = TypedDict("_ForkedFromOptional", {}, total=False)


class ForkedFrom(_ForkedFromRequired, _ForkedFromOptional):
    """`forked_from`: the events up to `atSeq` are those of `from`."""


class _GetUpdatesParamsRequired(TypedDict):
    conversationId: str
    """The conversation."""


class GetUpdatesParams(_GetUpdatesParamsRequired, total=False):
    """`getUpdatesOrGuidance` params."""
    limit: int | None
    """At most this many messages."""
    sinceSeq: int | None
    """Messages with seq greater than this (0 when absent)."""
    timeoutMs: int | None
    """When nothing is new, wait this long for a change first (0 or absent: answer at once)."""


class GetUpdatesResult(TypedDict):
    """`getUpdatesOrGuidance` result."""
    guidance: Guidance
    """Guidance for the caller."""
    latestSeq: int
    """The latest seq covered by this answer; pass it as the next `sinceSeq`."""
    messages: list[Event]
    """Message events after the cursor (traces and system events are left out)."""
    status: ConversationStatus
    """The conversation's status."""
    timedOut: bool
    """True when the call waited and nothing changed."""


class _GuidanceRequired(TypedDict):
    status: GuidanceStatus
    """`may_speak`, `wait` or `closed`."""
    turn: int
    """The current turn."""


class Guidance(_GuidanceRequired, total=False):
    """What one agent may do now, computed from the log."""
    deadline: str | None
    """When the current turn times out, RFC 3339, if it has a deadline."""
    mode: Mode | None
    """The mode the current turn asks of its speaker (`converse`, `plan`, `build`); absent when
    no speaker holds the turn.
    """
    reason: str | None
    """Why the agent must wait, such as `paused` or `not_your_turn`."""
    speaker: str | None
    """The agent that holds the turn; absent when the conversation is open to all participants."""


GuidanceStatus = Literal["may_speak", "wait", "closed"]
"""Whether an agent may speak."""


class HttpError(TypedDict):
    """The body of every HTTP error."""
    error: ErrorObject
    """The protocol's error object: code, message, data (with the code's name)."""


class ListConversationsParams(TypedDict, total=False):
    """`listConversations` params: a page of the conversations the caller may read, newest
    activity first, each filter narrowing it.
    """
    createdAfter: str | None
    """Only conversations created after this time (RFC 3339)."""
    cursor: str | None
    """Where the page starts: the `nextCursor` of the page before (opaque)."""
    limit: int | None
    """How many at most (1–1,000; default 100)."""
    metadata: dict[str, Any] | None
    """Only conversations whose metadata has each of these keys with these values (in a URL's
    query: `metadata=KEY:VALUE`, the value read as JSON when it is JSON, else as text).
    """
    participant: str | None
    """Only conversations this agent takes part in."""
    query: str | None
    """Only conversations whose id or metadata contains this text (case-insensitive)."""
    scenario: str | None
    """Only conversations made from this scenario (its library name, or an inline scenario's
    `name`).
    """
    status: ListStatus | None
    """Only conversations in this state: `active`, `paused`, `closed`, or `open` (active or
    paused).
    """
    tenant: str | None
    """Operators: another tenant's conversations."""
    updatedAfter: str | None
    """Only conversations with an event after this time (RFC 3339)."""


class _ListConversationsResultRequired(TypedDict):
    conversations: list[Snapshot]
    """A snapshot of each conversation of the page the caller may read (those it takes part in
    and the sub-conversations below them; every one of its tenant, for an admin), newest
    activity first.
    """


class ListConversationsResult(_ListConversationsResultRequired, total=False):
    """`listConversations` result."""
    nextCursor: str | None
    """Where the next page starts, if there may be more."""


class ListScenariosParams(TypedDict):
    """`listScenarios` params (none)."""
    pass


class ListScenariosResult(TypedDict):
    """`listScenarios` result: the scenarios `createConversation` takes by `scenarioName`."""
    scenarios: list[ScenarioInfo]
    """Each scenario of the server's library, by name."""


ListStatus = Literal["active", "paused", "closed", "open"]
"""The states `listConversations` filters by."""


class ListTenantsParams(TypedDict):
    """`listTenants` params (none)."""
    pass


class ListTenantsResult(TypedDict):
    """`listTenants` result: every tenant, by name (operators)."""
    tenants: list[TenantSummary]
    """Each tenant."""


class ListTokensParams(TypedDict, total=False):
    """`listTokens` params."""
    tenant: str | None
    """The tenant (operators only; the caller's own by default)."""


class ListTokensResult(TypedDict):
    """`listTokens` result: the caller's tenant's tokens, oldest first."""
    tokens: list[TokenSummary]
    """Each token."""


class _MessagePayloadRequired(TypedDict):
    text: str
    """What was said."""


class MessagePayload(_MessagePayloadRequired, total=False):
    """The payload of a message."""
    attachments: list[Attachment]
    """Attached files."""
    data: Any
    """Structured content; selectors match on it."""
    mode: Mode | None
    """The mode this message asks for: of the agents in `to`, and, when it closes the turn, of
    the next speaker. Absent: the agent's default mode (the first it declares). Asking an
    agent for a mode it does not declare is refused (`ModeNotSupported`).
    """
    schema: str | None
    """A type name for `data`, such as `tool.request.v1`."""
    tags: list[str]
    """Free labels; selectors match on them."""
    to: list[str]
    """The agents this message is addressed to."""


Mode = Literal["converse", "plan", "build"]
"""What an agent is asked to do with its turn."""


_NextSpeakerRequired = TypedDict("_NextSpeakerRequired", {"speaker": "str", "turn": "int"})
_NextSpeakerOptional = TypedDict("_NextSpeakerOptional", {"approval": "ApprovalDecision | None", "for": "str | None", "mode": "Mode | None", "position": "int | None", "reason": "SpeakerReason | None", "retry": "bool", "skipped": "str | None", "timeoutMs": "int | None"}, total=False)


class NextSpeaker(_NextSpeakerRequired, _NextSpeakerOptional):
    """`next_speaker`: who speaks in turn `turn`."""


class OutputSpec(TypedDict, total=False):
    """A participant's declaration of its plans or deliverables (`plan:` / `deliverable:` in a
    scenario).
    """
    format: DocFormat
    """`markdown` (the default) or `json`."""
    schema: Any
    """For `json`: a JSON Schema the content must match."""
    sections: list[str]
    """For `markdown`: headings the text must have, in any order."""
    type: str | None
    """The document's type name (what versions count by and context selects on); `plan` or
    `deliverable` when absent.
    """


class _ParentLinkRequired(TypedDict):
    conversationId: str
    """The conversation that opened it."""
    depth: int
    """How deep it is (1 for a child of a top-level conversation)."""


class ParentLink(_ParentLinkRequired, total=False):
    """A sub-conversation's place in its tree."""
    root: str | None
    """The top-level conversation of its tree (logs written before it was recorded lack it)."""


class _PostMessageBodyRequired(TypedDict):
    finality: Finality
    """`none`, `turn` or `conversation`."""
    payload: MessagePayload
    """What is said."""


class PostMessageBody(_PostMessageBodyRequired, total=False):
    """Body of `POST /conversations/{id}/messages`. An `Idempotency-Key` header is the
    `clientRequestId` (giving both with different values is refused).
    """
    clientRequestId: str | None
    """Idempotency key: a retry with the same key appends nothing."""
    turnHint: TurnHint | None
    """Append only if this is still the current turn."""


class RegisterExecutorParams(TypedDict):
    """`registerExecutor` params."""
    mode: ExecutorMode
    """Only `push`."""


class _RequestTurnNotificationRequired(TypedDict):
    agentId: str
    """The agent whose turn it is."""
    claimId: str
    """Pass this to `claimTurn`."""
    conversationId: str
    """The conversation."""
    deadlineMs: int
    """How long the turn may take, in milliseconds from the claim."""
    sinceSeq: int
    """Read the log after this seq for context."""
    turn: int
    """The turn offered; reply with it as `turnHint`."""


class RequestTurnNotification(_RequestTurnNotificationRequired, total=False):
    """The `request_turn` notification's result."""
    mode: Mode | None
    """The mode the turn asks for (`converse` when absent)."""


class RevokeTokenParams(TypedDict, total=False):
    """`revokeToken` params: a token by its id, or every token of an agent (one of the two)."""
    agentId: str | None
    """Every token of this agent instead."""
    id: str | None
    """A token's id (at least 8 hex digits of it)."""
    tenant: str | None
    """The tenant (operators only; the caller's own by default)."""


class RevokeTokenResult(TypedDict):
    """`revokeToken` result. The connections and streams that authenticated with a revoked token
    are closed at once on the node that revoked it, and within the token recheck on the others.
    """
    revoked: int
    """How many tokens were revoked (0: none matched)."""


class _ScenarioInfoRequired(TypedDict):
    name: str
    """Its name (`scenarioName`)."""
    participants: list[ScenarioParticipant]
    """Its participants, in order."""


class ScenarioInfo(_ScenarioInfoRequired, total=False):
    """A scenario of the library, as far as a client needs it: who takes part, and who of them
    the server runs. What each participant the server runs does (its command, its URL, its
    source) is not shown.
    """
    description: str | None
    """Its `description`, if it has one."""


class _ScenarioParticipantRequired(TypedDict):
    id: str
    """Its agent id."""


class ScenarioParticipant(_ScenarioParticipantRequired, total=False):
    """A participant of a scenario of the library."""
    caller: bool
    """Whether it is the scenario's caller: whoever creates a conversation from the scenario
    speaks as it (and any agent may create one, not only an admin).
    """
    kind: str | None
    """The kind the server runs it as (`scripted`, `llm`, …); none for an external participant,
    which speaks for itself with a token of its own.
    """


class _SendMessageParamsRequired(TypedDict):
    conversationId: str
    """The conversation."""
    finality: Finality
    """`none`, `turn` or `conversation`."""
    payload: MessagePayload
    """What is said."""


class SendMessageParams(_SendMessageParamsRequired, total=False):
    """`sendMessage` params."""
    afterKey: str | None
    """Append only if this agent's own earlier write to the conversation with this
    `clientRequestId` is in the log ahead of this one (committed, or in the same batch
    before it); refused with `InvalidParams` otherwise, and nothing is written. An executor
    sends an attempt's `turn_start` trace and starts the agent without waiting for its
    answer, naming the trace's key here on each write the attempt makes.
    """
    clientRequestId: str | None
    """Idempotency key: a retry with the same key appends nothing."""
    turnHint: TurnHint | None
    """Append only if this is still the current turn."""


class _SendTraceParamsRequired(TypedDict):
    conversationId: str
    """The conversation."""
    payload: Any
    """Free JSON for observability."""


class SendTraceParams(_SendTraceParamsRequired, total=False):
    """`sendTrace` params."""
    afterKey: str | None
    """Append only if this agent's own earlier write to the conversation with this
    `clientRequestId` is in the log ahead of this one (committed, or in the same batch
    before it); refused with `InvalidParams` otherwise, and nothing is written. An executor
    sends an attempt's `turn_start` trace and starts the agent without waiting for its
    answer, naming the trace's key here on each write the attempt makes.
    """
    clientRequestId: str | None
    """Idempotency key."""
    finality: Any
    """Never valid: a trace carries no finality. Present only so that a trace
    sent with one is answered `InvalidFinality` rather than ignored.
    """
    turn: int | None
    """The turn the trace belongs to; the current turn when absent."""


class SeqResult(TypedDict):
    """`pauseConversation` and `resumeConversation` result."""
    seq: int
    """The seq of the system event that records the change."""


class SetTenantQuotasParams(TypedDict):
    """`setTenantQuotas` params (operators): the tenant's quotas, replacing those set before
    (an absent one goes back to the server's default).
    """
    quotas: TenantQuotas
    """Its quotas."""
    tenant: str
    """The tenant."""


class _SnapshotRequired(TypedDict):
    conversationId: str
    """The conversation."""
    guidance: Guidance
    """Guidance for the agent that asked."""
    latestSeq: int
    """The seq of the last event (0 for an empty log)."""
    participants: list[str]
    """The agents that take part."""
    status: ConversationStatus
    """`active`, `paused` or `closed`."""
    turn: int
    """The current turn."""


class Snapshot(_SnapshotRequired, total=False):
    """The state of a conversation at one point of its log."""
    lastEventAt: str | None
    """When its last event was committed, RFC 3339 (what a list sorts by last activity)."""
    parentConversationId: str | None
    """For a sub-conversation: the conversation that opened it."""
    speaker: str | None
    """The agent that holds the turn, if turns are assigned."""


SpeakerReason = Literal["approval"]
"""Why a speaker was named other than by the order."""


class StopData(TypedDict):
    """The `data` of the orchestrator's closing message (schema [`STOP_SCHEMA`])."""
    reason: StopReason
    """Why it closed."""


StopReason = Literal["on_text", "max_turns", "idle_timeout", "max_duration", "turn_timeout", "no_answer", "sequence_done", "no_rule_matched"]
"""Why the orchestrator closed a conversation (`data.reason` of its closing message)."""


class _SubconversationFinishedRequired(TypedDict):
    child: str
    """The sub-conversation."""
    closedSeq: int
    """The seq of its closing message (in the child's log)."""
    status: FinishStatus
    """Whether a participant closed it or the orchestrator stopped it."""


class SubconversationFinished(_SubconversationFinishedRequired, total=False):
    """`subconversation_finished`: how `child` ended, and its result."""
    reason: StopReason | None
    """With `stopped`: the stop reason."""
    result: SubconversationResult | None
    """Its last message from a participant, or `null`."""


class _SubconversationResultRequired(TypedDict):
    author: str
    """Its author."""
    seq: int
    """The message's seq (in the child's log)."""


class SubconversationResult(_SubconversationResultRequired, total=False):
    """A sub-conversation's result: its last message from a participant."""
    data: Any
    """Its data."""
    schema: str | None
    """Its schema."""
    text: str | None
    """Its text."""


class SubconversationStarted(TypedDict):
    """`subconversation_started`: `by` opened `child` at `depth`."""
    by: str
    """Who opened it."""
    child: str
    """The sub-conversation."""
    depth: int
    """Its depth."""


class SubscribeParams(TypedDict, total=False):
    """`subscribe` params."""
    conversationId: str | None
    """One conversation; absent: every conversation the caller takes part in, new ones included."""
    cursors: dict[str, int] | None
    """Per-conversation cursors (without `conversationId` only): replay each named conversation
    after its own seq; `sinceSeq` applies to the others. A client resuming a subscription
    across every conversation passes what it has seen here, and `sinceSeq: 0` so that
    conversations created while it was away are replayed from their start.
    """
    sinceSeq: int | None
    """Replay events with seq greater than this first. Absent: only what is committed from now on
    (with `conversationId`, the same as the latest seq).
    """


class TurnTimeout(TypedDict):
    """`turn_timeout`: turn `turn` of `speaker` ended without an answer."""
    speaker: str
    """Its speaker."""
    turn: int
    """The turn that timed out."""


class SystemEventCreated(Created):
    """The first event of every conversation (seq 1, turn 1)."""
    type: Literal["created"]


class SystemEventNextSpeaker(NextSpeaker):
    """The policy named who speaks in the current turn."""
    type: Literal["next_speaker"]


class SystemEventApprovalRequested(ApprovalRequested):
    """The next speaker has an approval checkpoint: the approver speaks first."""
    type: Literal["approval_requested"]


class SystemEventTurnTimeout(TurnTimeout):
    """The current turn ran past its deadline; it ends without an answer."""
    type: Literal["turn_timeout"]


class SystemEventIdleTimeout(TypedDict):
    """No participant appended anything for the scenario's `stop.idleTimeout`."""
    type: Literal["idle_timeout"]


class SystemEventMaxDuration(TypedDict):
    """The conversation reached the scenario's `stop.maxDuration`."""
    type: Literal["max_duration"]


class SystemEventPaused(ChangedBy):
    """An admin paused the conversation."""
    type: Literal["paused"]


class SystemEventResumed(ChangedBy):
    """An admin resumed the conversation."""
    type: Literal["resumed"]


class SystemEventForkedFrom(ForkedFrom):
    """The events before this one were copied from another conversation."""
    type: Literal["forked_from"]


class SystemEventSubconversationStarted(SubconversationStarted):
    """A sub-conversation of this one was opened (in the parent's log)."""
    type: Literal["subconversation_started"]


class SystemEventSubconversationFinished(SubconversationFinished):
    """A sub-conversation of this one closed (in the parent's log)."""
    type: Literal["subconversation_finished"]


SystemEvent = (
    SystemEventCreated
    | SystemEventNextSpeaker
    | SystemEventApprovalRequested
    | SystemEventTurnTimeout
    | SystemEventIdleTimeout
    | SystemEventMaxDuration
    | SystemEventPaused
    | SystemEventResumed
    | SystemEventForkedFrom
    | SystemEventSubconversationStarted
    | SystemEventSubconversationFinished
)
"""The payload of a `system` event, by its `type`."""


class _TailParamsRequired(TypedDict):
    conversationId: str
    """The conversation."""


class TailParams(_TailParamsRequired, total=False):
    """`tail` params."""
    limit: int | None
    """At most this many events (the server caps it)."""
    sinceSeq: int
    """Return events with seq greater than this (0 for all)."""


class TailResult(TypedDict):
    """`tail` result."""
    events: list[Event]
    """Events after the cursor, in seq order."""
    latestSeq: int
    """The latest seq of the conversation when read."""


class TenantQuotas(TypedDict, total=False):
    """A tenant's quotas: each one given holds it to that limit (0: none), each one absent leaves
    the server's default (`serve --tenant-…`). Refusals are `TenantQuotaExceeded` (-32033) with
    `data: {quota, limit, used}`, the quota by its name here.
    """
    appendsPerSecond: int | None
    """Events appended a second (messages and traces, across the cluster)."""
    connections: int | None
    """WebSocket connections open at once (across the cluster)."""
    llmTokensPerDay: int | None
    """Model tokens the tenant's `llm` participants spend a day (UTC)."""
    openConversations: int | None
    """Conversations open at once."""
    storedBytes: int | None
    """Bytes of payload its conversations' logs hold."""
    tokens: int | None
    """Tokens (credentials) it holds."""


class _TenantSummaryRequired(TypedDict):
    createdMs: int
    """When it was made (ms since the epoch)."""
    name: str
    """Its name."""
    tokens: int
    """How many tokens it has."""


class TenantSummary(_TenantSummaryRequired, total=False):
    """A tenant as `listTenants` shows it."""
    quotas: TenantQuotas
    """The quotas set for it (those not set are the server's defaults)."""


class _TokenSummaryRequired(TypedDict):
    admin: bool
    """Whether it administers its tenant."""
    agentId: str
    """The agent it speaks as."""
    createdMs: int
    """When it was made (ms since the epoch)."""
    id: str
    """Its id: the first 12 hex digits of its hash (`revokeToken` takes it)."""
    tenant: str
    """The tenant it belongs to."""


class TokenSummary(_TokenSummaryRequired, total=False):
    """A token as `listTokens` shows it: never the token, nor its whole hash."""
    expiresMs: int | None
    """When it stops being accepted (ms since the epoch)."""
    lastUsedMs: int | None
    """When it last authenticated (ms since the epoch; recorded at most once a minute)."""
    operator: bool
    """Whether it is an operator's (it administers every tenant)."""


TurnEndOutcome = Literal["posted", "yield", "no_action", "complete", "incomplete"]
"""What an agent's attempt did."""


class TurnHint(TypedDict):
    """The compare-and-set on the turn: the append succeeds only in this turn."""
    turn: int
    """The turn the writer believes is current."""


class WaitForChangeParams(TypedDict):
    """`waitForChange` params."""
    conversationId: str
    """The conversation."""
    sinceSeq: int
    """Wait until the latest seq is greater than this."""
    timeoutMs: int
    """How long to wait at most (the server caps it)."""


class WaitForChangeResult(TypedDict):
    """`waitForChange` result."""
    latestSeq: int
    """The latest seq when the wait ended."""
    timedOut: bool
    """True when the wait ended by timeout with nothing new."""


class WaitQuery(TypedDict, total=False):
    """Query of `GET /conversations/{id}/wait` (long-poll)."""
    sinceSeq: int
    """Answer once the latest seq passes this (default 0)."""
    timeoutMs: int | None
    """How long to wait, in milliseconds (default 30,000; capped by the server's limit)."""


class WaitResult(TypedDict):
    """Result of `GET /conversations/{id}/wait`."""
    events: list[Event]
    """Events with seq > `sinceSeq`, in order (at most the server's tail limit; ask again
    from the last one for more).
    """
    latestSeq: int
    """The seq of the last event."""
    timedOut: bool
    """True when the wait ended with nothing after `sinceSeq`."""


class WhoAmI(TypedDict):
    """Result of `GET /me`: who the bearer token speaks as."""
    admin: bool
    """Whether it is an admin (creates, pauses and resumes conversations)."""
    agentId: str
    """The agent id."""
    tenant: str
    """The tenant it belongs to."""
