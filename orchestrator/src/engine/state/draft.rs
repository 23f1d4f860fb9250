//! What `apply` decides: the events to commit ([`Draft`]), or the answer to a retry.

use super::*;

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
    /// A message that may be a plan or a deliverable ([`maybe_document`]), tested once where
    /// its payload was made or read: the state numbers those, and the store marks them so that
    /// recovery reads their payload.
    pub doc: bool,
}

impl Draft {
    /// A committed event as the fold reads it again (without its idempotency key).
    pub fn of_event(e: proto_spec::Event) -> Draft {
        Draft {
            seq: e.seq,
            kind: e.kind,
            doc: Draft::doc_of(e.kind, e.payload.get()),
            author: e.author,
            turn: e.turn,
            finality: e.finality,
            payload: e.payload,
            client_request_id: None,
            hash: None,
        }
    }

    /// Whether an event of `kind` with payload `raw` may be a plan or a deliverable.
    pub fn doc_of(kind: EventKind, raw: &str) -> bool {
        kind == EventKind::Message && maybe_document(raw)
    }
}

/// What a valid request does.
#[derive(Debug, Clone)]
pub enum Applied {
    /// New events to commit, and the answer for the caller.
    Append(Vec<Draft>, AppendResult),
    /// A retry of an earlier request: nothing to append; the original answer.
    Duplicate(AppendResult),
}
