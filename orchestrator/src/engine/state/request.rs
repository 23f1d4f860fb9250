//! A request to append one event, and the digest that tells a retry from a reuse of its
//! idempotency key.

use proto_spec::system::SystemEvent;
use proto_spec::{EventKind, Finality, ORCHESTRATOR_AUTHOR};
use serde_json::value::RawValue;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Serializes a value into the stored form.
pub fn to_raw(v: &impl serde::Serialize) -> Box<RawValue> {
    serde_json::value::to_raw_value(v).unwrap_or_else(|_| RawValue::NULL.to_owned())
}

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
    pub follow_ups: Vec<SystemEvent>,
    /// A message appended right after this event and before the policy's decision, with
    /// finality `none`: a sub-conversation's input, after its `created`, by its author (the
    /// agent that opened the sub-conversation).
    pub opening: Option<(String, Box<RawValue>)>,
    /// For a write made for a claimed turn (an internal agent's on a shared log): the claim it
    /// holds; the write is refused if another node has taken the turn since.
    pub fence: Option<Fence>,
    /// For a write of an executor's attempt that did not wait for its `turn_start`: the key of
    /// that trace (by the same author), which must already be in the log, or in the batch ahead
    /// of this write; the write is refused otherwise.
    pub after: Option<String>,
    /// Nobody waits on its answer to go on (an executor's trace inside the server): a batch of
    /// such writes only waits a moment for another write to commit with, rather than taking
    /// a sync of its own.
    pub trailing: bool,
    /// What its payload may hold, tested once where the request is made (on the caller's
    /// thread, not the writer's).
    pub marks: Marks,
}

/// What a message's payload may hold, by cheap substring tests made once: a plan or a
/// deliverable (which the state numbers and the store marks for recovery), a mode asked of the
/// next speaker. Only a payload that may is parsed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Marks {
    /// It may be a plan or a deliverable ([`super::maybe_document`]).
    pub document: bool,
    /// It may name a `mode`.
    pub mode: bool,
}

impl Marks {
    /// The marks of a payload of `kind` (none but a message's).
    pub fn of(kind: EventKind, raw: &str) -> Marks {
        Marks {
            document: super::Draft::doc_of(kind, raw),
            mode: kind == EventKind::Message && super::docs::may_ask_mode(raw),
        }
    }
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

    /// With the claim this write is made for.
    pub fn with_fence(mut self, fence: Option<Fence>) -> Self {
        self.fence = fence;
        self
    }

    /// Refused unless the author's idempotency key `after` is in the log ahead of it.
    pub fn with_after(mut self, after: Option<String>) -> Self {
        self.after = after;
        self
    }

    /// Builds a request from an already serialized payload.
    pub fn from_raw(
        author: impl Into<String>,
        kind: EventKind,
        finality: Option<Finality>,
        payload: Box<RawValue>,
    ) -> Self {
        let marks = Marks::of(kind, payload.get());
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
            opening: None,
            fence: None,
            after: None,
            trailing: false,
            marks,
        }
    }

    /// A system event written by the orchestrator.
    pub fn system(event: &SystemEvent) -> Self {
        AppendRequest::from_raw(ORCHESTRATOR_AUTHOR, EventKind::System, None, to_raw(event))
    }

    /// Gives a sub-conversation's `created` event its input, as the opening message written by
    /// `author`, the agent that opened it.
    pub fn with_opening(mut self, author: &str, input: Option<Value>) -> Self {
        self.opening = input.map(|i| (author.to_string(), to_raw(&i)));
        self
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

/// A write made for a claimed turn: refused once the claim has another holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence {
    /// The turn claimed.
    pub turn: u64,
    /// The fence the claim was granted with.
    pub fence: i64,
}
