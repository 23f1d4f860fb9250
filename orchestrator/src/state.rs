//! The per-conversation state machine: every invariant of the log, in one place.
//!
//! A conversation's state is a fold over its log: [`ConvState::observe`] applies one committed
//! event, and recovery rebuilds the state by observing every event again. Deciding what a request
//! appends is [`ConvState::apply`]: it validates the request against the state and, only when it
//! is valid, returns the events to append and moves the state past them. A refused request leaves
//! the state untouched, so `apply` behaves as the pure function
//! `(state, request) → (events, new state) | error`; it does no I/O and reads no clock.
//! Storage and transports call it; none of them re-implements a rule.

use std::collections::HashMap;

use proto_spec::scenario::{ApprovalSpec, OnTimeout, Order, RuleSpec};
use proto_spec::{
    AppendResult, ErrorCode, EventKind, Finality, Guidance, GuidanceStatus, RpcError,
    ORCHESTRATOR_AUTHOR,
};
use serde_json::value::RawValue;
use serde_json::{json, Value};

/// Serializes a JSON value into the stored form.
pub fn to_raw(v: &Value) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).unwrap_or_else(|_| RawValue::NULL.to_owned())
}
use sha2::{Digest, Sha256};

/// A digest of a request's body, to tell a retry from a reuse of its idempotency key.
pub type BodyHash = [u8; 16];

/// Hashes the parts of a request that make it "the same request".
pub fn body_hash(
    kind: EventKind,
    finality: Option<Finality>,
    payload_json: &str,
    turn: Option<u64>,
    turn_hint: Option<u64>,
) -> BodyHash {
    let mut h = Sha256::new();
    h.update(kind.as_str().as_bytes());
    h.update([0]);
    h.update(finality.map(Finality::as_str).unwrap_or("-").as_bytes());
    h.update([0]);
    h.update(turn.map(|t| t as i128).unwrap_or(-1).to_le_bytes());
    h.update(turn_hint.map(|t| t as i128).unwrap_or(-1).to_le_bytes());
    h.update(payload_json.as_bytes());
    let full = h.finalize();
    let mut out = [0u8; 16];
    out.copy_from_slice(&full[..16]);
    out
}

/// A request to append one event.
#[derive(Debug, Clone)]
pub struct AppendRequest {
    /// The authenticated author (never a param).
    pub author: String,
    /// `message`, `trace` or `system`.
    pub kind: EventKind,
    /// Finality; required for messages, refused for anything else.
    pub finality: Option<Finality>,
    /// The payload as stored (serialized once, by the caller).
    pub payload: Box<RawValue>,
    /// For traces and system events: the turn they name (the current one when absent).
    pub turn: Option<u64>,
    /// For messages: append only in this turn.
    pub turn_hint: Option<u64>,
    /// The idempotency key.
    pub client_request_id: Option<String>,
    /// Digest of the body, for idempotency (computed only when a key is set).
    pub hash: BodyHash,
    /// System events the orchestrator appends in the same transaction after this one
    /// (a policy decision such as `next_speaker`).
    pub follow_ups: Vec<Value>,
}

impl AppendRequest {
    /// Builds a request, serializing and hashing the payload.
    pub fn new(
        author: impl Into<String>,
        kind: EventKind,
        finality: Option<Finality>,
        payload: Value,
    ) -> Self {
        AppendRequest::from_raw(author, kind, finality, to_raw(&payload))
    }

    /// Builds a request from an already serialized payload.
    pub fn from_raw(
        author: impl Into<String>,
        kind: EventKind,
        finality: Option<Finality>,
        payload: Box<RawValue>,
    ) -> Self {
        AppendRequest {
            author: author.into(),
            kind,
            finality,
            payload,
            turn: None,
            turn_hint: None,
            client_request_id: None,
            hash: [0; 16],
            follow_ups: Vec::new(),
        }
    }

    /// A system event written by the orchestrator.
    pub fn system(payload: Value) -> Self {
        AppendRequest::new(ORCHESTRATOR_AUTHOR, EventKind::System, None, payload)
    }

    /// Sets the named turn (traces, system events).
    pub fn with_turn(mut self, turn: Option<u64>) -> Self {
        self.turn = turn;
        self.rehash();
        self
    }

    /// Sets the turn hint (messages).
    pub fn with_turn_hint(mut self, hint: Option<u64>) -> Self {
        self.turn_hint = hint;
        self.rehash();
        self
    }

    /// Sets the idempotency key.
    pub fn with_client_request_id(mut self, key: Option<String>) -> Self {
        self.client_request_id = key;
        self.rehash();
        self
    }

    /// Digests the body; only a keyed request needs it, so unkeyed ones skip the work.
    fn rehash(&mut self) {
        if self.client_request_id.is_some() {
            self.hash = body_hash(
                self.kind,
                self.finality,
                self.payload.get(),
                self.turn,
                self.turn_hint,
            );
        }
    }
}

/// An event decided by the state machine, not yet committed (it has no timestamp).
#[derive(Debug, Clone)]
pub struct Draft {
    /// Its seq.
    pub seq: u64,
    /// Its kind.
    pub kind: EventKind,
    /// Its author.
    pub author: String,
    /// Its turn.
    pub turn: u64,
    /// Its finality (messages only).
    pub finality: Option<Finality>,
    /// Its payload, as stored.
    pub payload: Box<RawValue>,
    /// Its idempotency key.
    pub client_request_id: Option<String>,
    /// The body digest stored with the key.
    pub hash: Option<BodyHash>,
}

/// What a valid request does.
#[derive(Debug, Clone)]
pub enum Applied {
    /// New events to commit, and the answer for the caller.
    Append(Vec<Draft>, AppendResult),
    /// A retry of an earlier request: nothing to append; the original answer.
    Duplicate(AppendResult),
}

/// What an idempotency key refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdemRecord {
    hash: BodyHash,
    seq: u64,
    turn: u64,
}

/// The small, cheaply cloned part of a conversation's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Core {
    /// The latest seq (0: empty log).
    pub head: u64,
    /// The current turn (starts at 1).
    pub turn: u64,
    /// Who holds the turn; `None`: open to every participant.
    pub speaker: Option<String>,
    /// A message with finality `conversation` was appended.
    pub closed: bool,
    /// Paused by an admin.
    pub paused: bool,
    /// How long the current speaker has, from its `next_speaker` event (a policy's turn timeout).
    pub turn_timeout_ms: Option<u64>,
    /// The speaker waiting for approval, while its approver holds the turn.
    pub pending_approval: Option<String>,
    /// In a `sequence` order: the position of the current speaker.
    pub sequence_pos: Option<usize>,
}

/// Who speaks next and when the conversation stops, decided in the state machine and logged as
/// system events (`next_speaker`, `approval_requested`) or as the orchestrator's closing message,
/// in the same transaction as the message that closes a turn (invariant 7). It is recorded in
/// the conversation's `created` event, so recovery rebuilds it from the log.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnPolicy {
    /// The order; `None`: every participant may speak at any time (stop conditions still hold).
    #[serde(default)]
    pub order: Option<Order>,
    /// The speakers, in participant order.
    #[serde(default)]
    pub speakers: Vec<String>,
    /// The speakers of a `sequence` order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sequence: Vec<String>,
    /// Who takes turn 1.
    #[serde(default)]
    pub first: String,
    /// Selector rules, tried before the order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<RuleSpec>,
    /// Approval checkpoints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approvals: Vec<ApprovalSpec>,
    /// Each turn's timeout, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// What a turn timeout does.
    #[serde(default)]
    pub on_timeout: OnTimeout,
    /// Close after this many turns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<u64>,
    /// Close when a turn-closing message contains this text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_text: Option<String>,
    /// Close after this long without an append (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// Close this long after creation (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_duration_ms: Option<u64>,
    /// Whether internal executors trace each turn's start and end.
    #[serde(default = "yes", skip_serializing_if = "Clone::clone")]
    pub traces: bool,
    /// The participants the server runs itself, with their kind and settings.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub agents: std::collections::BTreeMap<String, Value>,
}

fn yes() -> bool {
    true
}

/// What the policy decides after a turn ends.
#[derive(Debug, Clone, PartialEq)]
enum Decision {
    /// Give the next turn to this speaker (with extra fields for the `next_speaker` event).
    Speaker(String, Value),
    /// Close the conversation, for this reason.
    Stop(String),
    /// Nothing to decide (no order: the floor is open).
    Open,
}

impl TurnPolicy {
    /// The speaker after `author` in participant order.
    fn after(&self, author: &str) -> String {
        let i = self.speakers.iter().position(|s| s == author);
        match i {
            Some(i) => self.speakers[(i + 1) % self.speakers.len()].clone(),
            None => self.first.clone(),
        }
    }

    /// The next speaker by the order alone, after `author` held the turn (`sequence_pos` is the
    /// position in `sequence` of the turn that ended).
    fn by_order(
        &self,
        author: &str,
        payload: Option<&Value>,
        sequence_pos: Option<usize>,
    ) -> Decision {
        match self.order {
            None => Decision::Open,
            Some(Order::RoundRobin) => Decision::Speaker(self.after(author), Value::Null),
            Some(Order::Addressed) => {
                let addressed = payload.and_then(|p| self.addressed(author, p));
                Decision::Speaker(addressed.unwrap_or_else(|| self.after(author)), Value::Null)
            }
            Some(Order::Sequence) => {
                let next = sequence_pos.map_or(0, |p| p + 1);
                match self.sequence.get(next) {
                    Some(s) => Decision::Speaker(s.clone(), json!({"position": next})),
                    None => Decision::Stop("sequence_done".into()),
                }
            }
            Some(Order::Rules) => Decision::Stop("no_rule_matched".into()),
        }
    }

    /// The participant a message addresses: its first `to`, or the first `@id` it mentions.
    fn addressed(&self, author: &str, payload: &Value) -> Option<String> {
        let known = |id: &str| id != author && self.speakers.iter().any(|s| s == id);
        if let Some(to) = payload.get("to").and_then(Value::as_array) {
            if let Some(id) = to.iter().filter_map(Value::as_str).find(|id| known(id)) {
                return Some(id.to_string());
            }
        }
        let text = payload.get("text").and_then(Value::as_str)?;
        text.split('@').skip(1).find_map(|rest| {
            let id: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || "._:-".contains(*c))
                .collect();
            let id = id.trim_end_matches(['.', ':']).to_string();
            known(&id).then_some(id)
        })
    }

    fn approver_of(&self, speaker: &str) -> Option<&str> {
        self.approvals
            .iter()
            .find(|a| a.before == speaker)
            .map(|a| a.approver.as_str())
    }
}

/// Reads an approver's decision from its message: `data.decision`, or text starting with
/// approve/reject (any case). Anything else counts as a rejection.
fn approved(payload: &Value) -> bool {
    if let Some(d) = payload.pointer("/data/decision").and_then(Value::as_str) {
        return d.eq_ignore_ascii_case("approve") || d.eq_ignore_ascii_case("approved");
    }
    let text = payload.get("text").and_then(Value::as_str).unwrap_or("");
    let t = text.trim_start().to_ascii_lowercase();
    t.starts_with("approve") || t.starts_with("yes") || t.starts_with("lgtm")
}

/// A conversation's state, rebuilt from its log.
#[derive(Debug, Clone)]
pub struct ConvState {
    /// The conversation id.
    pub id: String,
    participants: Vec<String>,
    /// The same agents, for the membership check on every append.
    members: std::collections::HashSet<String, ahash::RandomState>,
    /// Head, turn, speaker, status.
    pub core: Core,
    idem: HashMap<(String, String), IdemRecord>,
    policy: Option<TurnPolicy>,
}

/// Guidance for one agent, from the participants and the core state.
pub fn guidance_for(participants: &[String], c: &Core, agent: &str) -> Guidance {
    let (status, reason) = if c.closed {
        (GuidanceStatus::Closed, None)
    } else if c.paused {
        (GuidanceStatus::Wait, Some("paused"))
    } else if !participants.iter().any(|p| p == agent) {
        (GuidanceStatus::Wait, Some("not_a_participant"))
    } else if c.speaker.as_deref().is_some_and(|s| s != agent) {
        (GuidanceStatus::Wait, Some("not_your_turn"))
    } else {
        (GuidanceStatus::MaySpeak, None)
    };
    Guidance {
        status,
        turn: c.turn,
        speaker: c.speaker.clone(),
        deadline: None,
        reason: reason.map(str::to_string),
    }
}

fn err(code: ErrorCode, message: impl Into<String>, data: Value) -> RpcError {
    RpcError::new(code, message).with_data(data)
}

impl ConvState {
    /// An empty conversation, before its `created` event.
    pub fn new(id: impl Into<String>, participants: Vec<String>) -> Self {
        ConvState {
            id: id.into(),
            members: participants.iter().cloned().collect(),
            participants,
            core: Core {
                head: 0,
                turn: 1,
                speaker: None,
                closed: false,
                paused: false,
                turn_timeout_ms: None,
                pending_approval: None,
                sequence_pos: None,
            },
            idem: HashMap::new(),
            policy: None,
        }
    }

    /// The `created` system event that opens every conversation's log.
    pub fn created_event(
        participants: &[String],
        metadata: Option<&Value>,
        created_by: &str,
    ) -> AppendRequest {
        Self::created_event_with(participants, metadata, created_by, None)
    }

    /// The `created` event of a conversation whose turns follow `policy`.
    pub fn created_event_with(
        participants: &[String],
        metadata: Option<&Value>,
        created_by: &str,
        policy: Option<&TurnPolicy>,
    ) -> AppendRequest {
        let mut payload =
            json!({"type": "created", "participants": participants, "createdBy": created_by});
        if let Some(m) = metadata {
            payload["metadata"] = m.clone();
        }
        if let Some(p) = policy {
            payload["policy"] = json!(p);
        }
        AppendRequest::system(payload)
    }

    /// The turn policy, if the conversation has one.
    pub fn policy(&self) -> Option<&TurnPolicy> {
        self.policy.as_ref()
    }

    /// The policy's decisions after `d` (already observed): the events that start the next
    /// turn (`next_speaker`, with `approval_requested` before it at a checkpoint) or the
    /// orchestrator's closing message.
    fn decide(&self, d: &Draft) -> Vec<Draft> {
        let Some(policy) = self.policy.as_ref() else {
            return Vec::new();
        };
        if self.core.closed {
            return Vec::new();
        }
        let decision = match (d.kind, d.finality) {
            (EventKind::Message, Some(Finality::Turn)) if d.author != ORCHESTRATOR_AUTHOR => {
                let payload: Value = serde_json::from_str(d.payload.get()).unwrap_or(Value::Null);
                self.after_message(policy, d, &payload)
            }
            (EventKind::System, _) => {
                let payload: Value = serde_json::from_str(d.payload.get()).unwrap_or(Value::Null);
                match payload.get("type").and_then(Value::as_str) {
                    Some("created") if policy.order.is_some() => {
                        let extra = if policy.order == Some(Order::Sequence) {
                            json!({"position": 0})
                        } else {
                            Value::Null
                        };
                        Decision::Speaker(policy.first.clone(), extra)
                    }
                    Some("turn_timeout") => {
                        let speaker = payload.get("speaker").and_then(Value::as_str).unwrap_or("");
                        match policy.on_timeout {
                            OnTimeout::End => Decision::Stop("turn_timeout".into()),
                            OnTimeout::Retry => Decision::Speaker(
                                speaker.to_string(),
                                json!({"retry": true, "position": self.core.sequence_pos}),
                            ),
                            OnTimeout::Skip => {
                                policy.by_order(speaker, None, self.core.sequence_pos)
                            }
                        }
                    }
                    Some("idle_timeout") => Decision::Stop("idle_timeout".into()),
                    Some("max_duration") => Decision::Stop("max_duration".into()),
                    _ => return Vec::new(),
                }
            }
            _ => return Vec::new(),
        };
        // Built from this state without copying it: the drafts follow one another (seq + 1
        // each); none of them changes the turn before the next is built.
        let mut out = Vec::new();
        match decision {
            Decision::Open => {}
            Decision::Stop(reason) => out.push(self.closing_draft(&reason)),
            Decision::Speaker(speaker, extra) => {
                let gate = self.core.pending_approval.is_none()
                    && extra.get("approval").is_none()
                    && policy.approver_of(&speaker).is_some();
                if gate {
                    let approver = policy.approver_of(&speaker).unwrap_or_default().to_string();
                    let mut ask =
                        json!({"type": "approval_requested", "for": speaker, "approver": approver});
                    if let Some(p) = extra.get("position") {
                        // In a sequence, the place of the speaker waiting for approval.
                        ask["position"] = p.clone();
                    }
                    out.push(self.system_draft(&ask));
                    let mut next = self.speaker_draft(
                        policy,
                        &approver,
                        json!({"reason": "approval", "for": speaker}),
                    );
                    next.seq += 1;
                    out.push(next);
                } else {
                    out.push(self.speaker_draft(policy, &speaker, extra));
                }
            }
        }
        out
    }

    /// What follows a participant's message that closed its turn.
    fn after_message(&self, policy: &TurnPolicy, d: &Draft, payload: &Value) -> Decision {
        if let Some(token) = &policy.on_text {
            let text = payload.get("text").and_then(Value::as_str).unwrap_or("");
            if text.contains(token.as_str()) {
                return Decision::Stop("on_text".into());
            }
        }
        if policy.max_turns.is_some_and(|max| d.turn >= max) {
            return Decision::Stop("max_turns".into());
        }
        // An approver's answer decides the pending checkpoint.
        if let Some(waiting) = &self.core.pending_approval {
            if policy.approver_of(waiting) == Some(d.author.as_str()) {
                return if approved(payload) {
                    Decision::Speaker(waiting.clone(), json!({"approval": "approved"}))
                } else {
                    match policy.by_order(waiting, None, self.core.sequence_pos) {
                        Decision::Speaker(next, mut extra) => {
                            if !extra.is_object() {
                                extra = json!({});
                            }
                            extra["approval"] = json!("rejected");
                            extra["skipped"] = json!(waiting);
                            Decision::Speaker(next, extra)
                        }
                        other => other,
                    }
                };
            }
        }
        if let Some(rule) = policy
            .rules
            .iter()
            .find(|r| r.when.matches(&d.author, payload))
        {
            return Decision::Speaker(rule.next.clone(), Value::Null);
        }
        policy.by_order(&d.author, Some(payload), self.core.sequence_pos)
    }

    fn speaker_draft(&self, policy: &TurnPolicy, speaker: &str, extra: Value) -> Draft {
        let mut payload =
            json!({"type": "next_speaker", "speaker": speaker, "turn": self.core.turn});
        if let Value::Object(m) = extra {
            for (k, v) in m {
                if !v.is_null() {
                    payload[k] = v;
                }
            }
        }
        if let Some(t) = policy.timeout_ms {
            payload["timeoutMs"] = json!(t);
        }
        self.system_draft(&payload)
    }

    /// The orchestrator's message that closes the conversation.
    fn closing_draft(&self, reason: &str) -> Draft {
        let payload = json!({
            "text": format!("The conversation ended: {}.", reason.replace('_', " ")),
            "data": {"reason": reason},
            "schema": "orchestrator.stop.v1"
        });
        Draft {
            seq: self.core.head + 1,
            kind: EventKind::Message,
            author: ORCHESTRATOR_AUTHOR.to_string(),
            turn: self.core.turn,
            finality: Some(Finality::Conversation),
            payload: to_raw(&payload),
            client_request_id: None,
            hash: None,
        }
    }

    fn system_draft(&self, payload: &Value) -> Draft {
        Draft {
            seq: self.core.head + 1,
            kind: EventKind::System,
            author: ORCHESTRATOR_AUTHOR.to_string(),
            turn: self.core.turn,
            finality: None,
            payload: to_raw(payload),
            client_request_id: None,
            hash: None,
        }
    }

    /// The agents that take part, in the order they were given.
    pub fn participants(&self) -> &[String] {
        &self.participants
    }

    /// Whether `agent` takes part.
    pub fn is_participant(&self, agent: &str) -> bool {
        self.members.contains(agent)
    }

    /// How many idempotency keys are remembered.
    pub fn idempotency_keys(&self) -> usize {
        self.idem.len()
    }

    /// Guidance for one agent.
    pub fn guidance(&self, agent: &str) -> Guidance {
        guidance_for(&self.participants, &self.core, agent)
    }

    fn position(&self) -> Value {
        json!({"currentTurn": self.core.turn, "latestSeq": self.core.head})
    }

    /// Validates a request and, when it is valid, moves the state past the events it appends.
    /// On error the state is unchanged.
    pub fn apply(&mut self, req: AppendRequest) -> Result<Applied, RpcError> {
        let mut drafts = Vec::new();
        let result = self.apply_into(req, &mut drafts)?;
        Ok(if result.duplicate {
            Applied::Duplicate(result)
        } else {
            Applied::Append(drafts, result)
        })
    }

    /// [`ConvState::apply`], pushing the new events onto `out` (nothing for a duplicate or a
    /// refusal); the writer uses it to collect a batch without a vector per request.
    pub fn apply_into(
        &mut self,
        req: AppendRequest,
        out: &mut Vec<Draft>,
    ) -> Result<AppendResult, RpcError> {
        self.check(&req)?;
        if let Some(key) = &req.client_request_id {
            if let Some(rec) = self.idem.get(&(req.author.clone(), key.clone())) {
                return if rec.hash == req.hash {
                    Ok(AppendResult {
                        seq: rec.seq,
                        turn: rec.turn,
                        duplicate: true,
                    })
                } else {
                    Err(err(
                        ErrorCode::IdempotencyKeyReused,
                        format!("clientRequestId {key:?} was used before with another body"),
                        json!({"clientRequestId": key, "originalSeq": rec.seq}),
                    ))
                };
            }
        }
        self.check_open(&req)?;
        let hash = req.client_request_id.as_ref().map(|_| req.hash);
        let first = Draft {
            seq: self.core.head + 1,
            kind: req.kind,
            author: req.author,
            turn: req.turn.unwrap_or(self.core.turn),
            finality: req.finality,
            payload: req.payload,
            client_request_id: req.client_request_id,
            hash,
        };
        let result = AppendResult {
            seq: first.seq,
            turn: first.turn,
            duplicate: false,
        };
        self.observe(&first);
        let decisions = self.decide(&first);
        out.push(first);
        for d in decisions {
            self.observe(&d);
            out.push(d);
        }
        for follow in req.follow_ups {
            if self.core.closed {
                break;
            }
            let d = self.system_draft(&follow);
            self.observe(&d);
            out.push(d);
        }
        Ok(result)
    }

    /// Checks that hold whatever the log says: finality only on messages, authorship.
    fn check(&self, req: &AppendRequest) -> Result<(), RpcError> {
        match (req.kind, req.finality) {
            (EventKind::Message, None) => {
                return Err(err(
                    ErrorCode::InvalidFinality,
                    "a message needs finality: none, turn or conversation",
                    Value::Null,
                ))
            }
            (EventKind::Trace | EventKind::System, Some(_)) => {
                return Err(err(
                    ErrorCode::InvalidFinality,
                    format!(
                        "only messages carry finality; a {} cannot",
                        req.kind.as_str()
                    ),
                    Value::Null,
                ))
            }
            _ => {}
        }
        if req.kind == EventKind::System && req.author != ORCHESTRATOR_AUTHOR {
            return Err(err(
                ErrorCode::Forbidden,
                "only the orchestrator writes system events",
                Value::Null,
            ));
        }
        if req.author != ORCHESTRATOR_AUTHOR && !self.is_participant(&req.author) {
            return Err(err(
                ErrorCode::Forbidden,
                format!(
                    "{} does not take part in conversation {}",
                    req.author, self.id
                ),
                Value::Null,
            ));
        }
        Ok(())
    }

    /// Checks against the current state of the log.
    fn check_open(&self, req: &AppendRequest) -> Result<(), RpcError> {
        let c = &self.core;
        if c.closed {
            return Err(err(
                ErrorCode::ConversationClosed,
                format!("conversation {} is closed", self.id),
                self.position(),
            ));
        }
        match req.kind {
            EventKind::Message => {
                if c.paused {
                    return Err(err(
                        ErrorCode::ConversationPaused,
                        format!("conversation {} is paused", self.id),
                        self.position(),
                    ));
                }
                if let Some(hint) = req.turn_hint {
                    if hint != c.turn {
                        return Err(err(
                            ErrorCode::TurnMismatch,
                            format!("turnHint {hint} is not the current turn {}", c.turn),
                            self.position(),
                        ));
                    }
                }
                if let Some(speaker) = c.speaker.as_deref() {
                    if speaker != req.author {
                        let mut data = self.position();
                        data["speaker"] = json!(speaker);
                        return Err(err(
                            ErrorCode::NotYourTurn,
                            format!("turn {} belongs to {speaker}", c.turn),
                            data,
                        ));
                    }
                }
            }
            EventKind::Trace | EventKind::System => {
                if let Some(t) = req.turn {
                    if t < c.turn {
                        return Err(err(
                            ErrorCode::TurnClosed,
                            format!("turn {t} is closed; the current turn is {}", c.turn),
                            self.position(),
                        ));
                    }
                    if t > c.turn {
                        return Err(err(
                            ErrorCode::TurnMismatch,
                            format!("turn {t} has not started; the current turn is {}", c.turn),
                            self.position(),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Moves the state past one committed event. Recovery calls this for every event in the log.
    pub fn observe(&mut self, d: &Draft) {
        let c = &mut self.core;
        c.head = d.seq;
        match d.kind {
            EventKind::Message => match d.finality {
                Some(Finality::Turn) => {
                    c.turn = d.turn + 1;
                    c.speaker = None;
                    c.turn_timeout_ms = None;
                }
                Some(Finality::Conversation) => c.closed = true,
                _ => {}
            },
            EventKind::System => {
                let payload: Value = serde_json::from_str(d.payload.get()).unwrap_or(Value::Null);
                match payload.get("type").and_then(Value::as_str) {
                    Some("created") => {
                        if let Some(ps) = payload.get("participants").and_then(Value::as_array) {
                            self.participants = ps
                                .iter()
                                .filter_map(|p| p.as_str().map(str::to_string))
                                .collect();
                            self.members = self.participants.iter().cloned().collect();
                        }
                        self.policy = payload
                            .get("policy")
                            .and_then(|p| serde_json::from_value(p.clone()).ok());
                    }
                    Some("next_speaker") => {
                        c.speaker = payload
                            .get("speaker")
                            .and_then(Value::as_str)
                            .map(str::to_string);
                        c.turn_timeout_ms = payload.get("timeoutMs").and_then(Value::as_u64);
                        if payload.get("reason").and_then(Value::as_str) != Some("approval") {
                            c.pending_approval = None;
                        }
                        if let Some(p) = payload.get("position").and_then(Value::as_u64) {
                            c.sequence_pos = Some(p as usize);
                        }
                    }
                    Some("approval_requested") => {
                        c.pending_approval = payload
                            .get("for")
                            .and_then(Value::as_str)
                            .map(str::to_string);
                        if let Some(p) = payload.get("position").and_then(Value::as_u64) {
                            c.sequence_pos = Some(p as usize);
                        }
                    }
                    Some("turn_timeout") => {
                        // The turn ends without an answer; the policy decides what follows.
                        c.turn = d.turn + 1;
                        c.speaker = None;
                        c.turn_timeout_ms = None;
                    }
                    Some("paused") => c.paused = true,
                    Some("resumed") => c.paused = false,
                    _ => {}
                }
            }
            EventKind::Trace => {}
        }
        if let (Some(key), Some(hash)) = (&d.client_request_id, d.hash) {
            self.idem.insert(
                (d.author.clone(), key.clone()),
                IdemRecord {
                    hash,
                    seq: d.seq,
                    turn: d.turn,
                },
            );
        }
    }

    /// Forgets idempotency keys recorded at or after `seq` (undo of an uncommitted batch).
    pub fn forget_keys_from(&mut self, seq: u64) {
        self.idem.retain(|_, r| r.seq < seq);
    }
}
