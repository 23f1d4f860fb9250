//! The per-conversation state machine: every invariant of the log, in one place.
//!
//! A conversation's state is a fold over its log: [`ConvMachine::observe`] applies one committed
//! event, and recovery rebuilds the state by observing every event again. Deciding what a request
//! appends is [`ConvMachine::apply`]: it validates the request against the state and, only when it
//! is valid, returns the events to append and moves the state past them. A refused request leaves
//! the state untouched, so `apply` behaves as the pure function
//! `(state, request) → (events, new state) | error`; it does no I/O and reads no clock.
//! Storage and transports call it; none of them re-implements a rule.

use std::collections::HashMap;
use std::sync::Arc;

use proto_spec::system::{
    Created, FinishStatus, StopData, SubconversationFinished, SubconversationResult, SystemEvent,
};
use proto_spec::{
    AppendResult, ErrorCode, EventKind, Finality, Guidance, GuidanceStatus, Mode, RpcError,
    ORCHESTRATOR_AUTHOR,
};
use serde_json::value::RawValue;
use serde_json::{json, Value};

pub use proto_spec::system::ParentLink;

mod docs;
mod fold;
pub use docs::maybe_document;
mod draft;
mod names;
mod policy;
mod request;
mod turn_state;
pub use draft::{Applied, Draft};
pub(crate) use names::Members;
pub(crate) use names::ShortKey;
pub use policy::{Authority, TurnPolicy};
pub use request::{body_hash, to_raw, AppendRequest, BodyHash, Fence, Marks};
pub use turn_state::{guidance_for, LastSaid, TurnState};

/// What an idempotency key refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IdemRecord {
    hash: BodyHash,
    seq: u64,
    turn: u64,
}

/// A conversation's state, rebuilt from its log.
#[derive(Debug, Clone)]
pub struct ConvMachine {
    /// The conversation id.
    pub id: String,
    participants: Vec<String>,
    /// The same agents, for the membership check on every append.
    members: Members,
    /// Head, turn, speaker, status.
    pub core: TurnState,
    /// Idempotency keys by author, then key (looked up by `&str`, with no copy of either).
    idem: Seeded<String, Seeded<String, IdemRecord>>,
    policy: Option<TurnPolicy>,
    parent: Option<ParentLink>,
    /// The metadata it was created with, and the scenario it was made from (what lists
    /// filter by).
    metadata: Option<Arc<Value>>,
    scenario: Option<Arc<str>>,
}

/// A map keyed by strings clients choose: hashed with a random seed (`ahash`), so that nobody
/// can make keys that share a bucket of it.
pub(crate) type Seeded<K, V> = HashMap<K, V, ahash::RandomState>;

fn err(code: ErrorCode, message: impl Into<String>, data: Value) -> RpcError {
    RpcError::new(code, message).with_data(data)
}

impl ConvMachine {
    /// An empty conversation, before its `created` event.
    pub fn new(id: impl Into<String>, participants: Vec<String>) -> Self {
        ConvMachine {
            id: id.into(),
            members: Members::new(&participants),
            participants,
            core: TurnState {
                head: 0,
                turn: 1,
                speaker: None,
                speaker_seq: 0,
                closed: false,
                paused: false,
                turn_timeout_ms: None,
                pending_approval: None,
                sequence_pos: None,
                children_open: 0,
                last_said: None,
                silent_turns: 0,
                mode: Mode::Converse,
                pending_mode: None,
                doc_versions: Arc::default(),
            },
            idem: Seeded::default(),
            policy: None,
            parent: None,
            metadata: None,
            scenario: None,
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
        AppendRequest::system(&SystemEvent::Created(Self::created(
            participants,
            metadata,
            created_by,
            policy,
        )))
    }

    /// What a `created` event records.
    pub fn created(
        participants: &[String],
        metadata: Option<&Value>,
        created_by: &str,
        policy: Option<&TurnPolicy>,
    ) -> Created {
        Created {
            participants: participants.to_vec(),
            created_by: created_by.to_string(),
            metadata: metadata.cloned(),
            policy: policy.map(|p| json!(p)),
            parent: None,
            scenario: None,
        }
    }

    /// The turn policy, if the conversation has one.
    pub fn policy(&self) -> Option<&TurnPolicy> {
        self.policy.as_ref()
    }

    /// For a sub-conversation: its parent and depth.
    pub fn parent(&self) -> Option<&ParentLink> {
        self.parent.as_ref()
    }

    /// The metadata it was created with.
    pub fn metadata(&self) -> Option<&Arc<Value>> {
        self.metadata.as_ref()
    }

    /// The scenario it was made from, by name.
    pub fn scenario(&self) -> Option<&Arc<str>> {
        self.scenario.as_ref()
    }

    /// Whether this conversation may open one more sub-conversation (`id` names it in the
    /// refusal): the child's depth, or `SubconversationLimit` past `max_depth` deep or with
    /// `max_children` open already. The one place the tree's limits are decided.
    pub fn admit_child(
        &self,
        id: &str,
        max_depth: u32,
        max_children: u32,
    ) -> Result<u32, RpcError> {
        let depth = self.depth() + 1;
        if depth > max_depth {
            return Err(RpcError::new(
                ErrorCode::SubconversationLimit,
                format!(
                    "parentConversationId: {id} is at depth {}; sub-conversations go at most {max_depth} deep",
                    depth - 1
                ),
            )
            .with_data(json!({"limit": "depth", "max": max_depth, "depth": depth})));
        }
        let open = self.core.children_open;
        if open >= max_children {
            return Err(RpcError::new(
                ErrorCode::SubconversationLimit,
                format!(
                    "parentConversationId: {id} has {open} sub-conversations open; at most {max_children} at once"
                ),
            )
            .with_data(json!({"limit": "fanOut", "max": max_children, "open": open})));
        }
        Ok(depth)
    }

    /// How deep in a tree this conversation is (0 at the top).
    pub fn depth(&self) -> u32 {
        self.parent.as_ref().map_or(0, |p| p.depth)
    }

    /// A sub-conversation's `subconversation_finished` event for its parent, once it is closed:
    /// how it ended and its result (the closing message, or the last participant message when
    /// the orchestrator closed it).
    pub fn finished_event(&self, closing: &Draft) -> SystemEvent {
        let (status, reason) = if closing.author == ORCHESTRATOR_AUTHOR {
            let payload: Value = serde_json::from_str(closing.payload.get()).unwrap_or(Value::Null);
            (FinishStatus::Stopped, StopData::of(&payload))
        } else {
            (FinishStatus::Completed, None)
        };
        let result = self.core.last_said.as_ref().map(|l| {
            let payload: Value = serde_json::from_str(&l.payload).unwrap_or(Value::Null);
            SubconversationResult {
                seq: l.seq,
                author: l.author.clone(),
                text: payload
                    .get("text")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                data: payload.get("data").cloned().filter(|d| !d.is_null()),
                schema: payload
                    .get("schema")
                    .and_then(Value::as_str)
                    .map(str::to_string),
            }
        });
        SystemEvent::SubconversationFinished(SubconversationFinished {
            child: proto_spec::tenant::local_id(&self.id).to_string(),
            status,
            reason,
            closed_seq: closing.seq,
            result,
        })
    }

    fn system_draft(&self, event: &SystemEvent) -> Draft {
        Draft {
            seq: self.core.head + 1,
            kind: EventKind::System,
            author: ORCHESTRATOR_AUTHOR.to_string(),
            turn: self.core.turn,
            finality: None,
            payload: to_raw(event),
            client_request_id: None,
            hash: None,
            doc: false,
        }
    }

    /// The agents that take part, in the order they were given.
    pub fn participants(&self) -> &[String] {
        &self.participants
    }

    /// Whether `agent` takes part.
    pub fn is_participant(&self, agent: &str) -> bool {
        self.members.contains(agent, &self.participants)
    }

    /// Whether `author` has a write with idempotency key `key` in the log.
    pub fn knows_key(&self, author: &str, key: &str) -> bool {
        self.idem_record(author, key).is_some()
    }

    /// The record of `author`'s write with idempotency key `key`, if it is in the log.
    fn idem_record(&self, author: &str, key: &str) -> Option<&IdemRecord> {
        self.idem.get(author)?.get(key)
    }

    /// How many idempotency keys are remembered.
    pub fn idempotency_keys(&self) -> usize {
        self.idem.values().map(Seeded::len).sum()
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

    /// [`ConvMachine::apply`], pushing the new events onto `out` (nothing for a duplicate or a
    /// refusal); the writer uses it to collect a batch without a vector per request.
    pub fn apply_into(
        &mut self,
        req: AppendRequest,
        out: &mut Vec<Draft>,
    ) -> Result<AppendResult, RpcError> {
        self.check(&req)?;
        if let Some(key) = &req.client_request_id {
            if let Some(rec) = self.idem_record(&req.author, key) {
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
        if let Some(after) = &req.after {
            if !self.knows_key(&req.author, after) {
                return Err(err(
                    ErrorCode::InvalidParams,
                    format!(
                        "afterKey {after:?}: no write of this agent with that clientRequestId \
                         is in the log ahead of this one (an executor's turn_start that did not \
                         land); nothing was written"
                    ),
                    json!({"afterKey": after}),
                ));
            }
        }
        self.check_open(&req)?;
        if self.changes_nothing(&req) {
            return Ok(AppendResult {
                seq: self.core.head,
                turn: self.core.turn,
                duplicate: true,
            });
        }
        let asked = self.asked_mode(&req)?;
        let mut req = req;
        self.number_document(&mut req)?;
        // A mode asked of the next speaker is checked once the policy has named it; the state
        // goes back to this if it is refused.
        let before = asked.map(|_| self.core.clone());
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
            doc: req.marks.document,
        };
        let result = AppendResult {
            seq: first.seq,
            turn: first.turn,
            duplicate: false,
        };
        self.observe(&first);
        let opening = req.opening.map(|(author, payload)| {
            let d = Draft {
                seq: self.core.head + 1,
                kind: EventKind::Message,
                author,
                turn: self.core.turn,
                finality: Some(Finality::None),
                doc: Draft::doc_of(EventKind::Message, payload.get()),
                payload,
                client_request_id: None,
                hash: None,
            };
            self.observe(&d);
            d
        });
        let (decisions, asked_of) = self.decide(&first, asked);
        if let (Some(mode), Some(speaker), Some(before)) = (asked, asked_of, before) {
            if let Err(e) = self.check_supports(&speaker, mode) {
                self.core = before;
                self.forget_keys_from(first.seq);
                return Err(e);
            }
        }
        out.push(first);
        out.extend(opening);
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

    /// Whether `req` is a pause of a paused conversation or a resume of an active one: decided
    /// here, in the one writer, so that two pauses at once append one `paused`.
    fn changes_nothing(&self, req: &AppendRequest) -> bool {
        if req.kind != EventKind::System {
            return false;
        }
        match SystemEvent::parse(req.payload.get()) {
            Some(SystemEvent::Paused(_)) => self.core.paused,
            Some(SystemEvent::Resumed(_)) => !self.core.paused,
            _ => false,
        }
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
            // Answered as a conversation that does not exist: who takes part is not told to
            // those who do not.
            return Err(RpcError::new(
                ErrorCode::ConversationNotFound,
                format!("no conversation {}", proto_spec::tenant::local_id(&self.id)),
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
}

#[cfg(test)]
mod tests {
    use super::Seeded;

    /// Maps keyed by clients' strings are seeded: two of them place the same id apart, so no
    /// set of ids can be worked out offline to share a bucket of the writer's maps.
    #[test]
    fn maps_of_clients_strings_are_seeded() {
        let ids: Vec<String> = (0..8).map(|i| format!("conversation-{i}")).collect();
        let (a, b) = (
            Seeded::<String, ()>::default(),
            Seeded::<String, ()>::default(),
        );
        let hashes = |m: &Seeded<String, ()>| -> Vec<u64> {
            ids.iter().map(|id| m.hasher().hash_one(id)).collect()
        };
        assert_ne!(hashes(&a), hashes(&b));
    }
}
