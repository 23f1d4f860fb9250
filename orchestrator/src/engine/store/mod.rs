//! Storage behind a trait: the durable log, conversations and tokens.
//!
//! The writer thread owns one [`LogWriter`] and commits whole batches through it; everything
//! else reads through the shared [`Store`]. The SQLite backend is [`sqlite::SqliteStore`]; a
//! second backend implements the same two traits without touching the state machine.

pub mod migrations;
pub mod postgres;
mod principals;
pub mod sqlite;

use proto_spec::{Event, EventKind, Finality};
use serde_json::Value;

use crate::engine::error::{Error, Result};
pub use crate::engine::state::Fence;
use crate::engine::state::{BodyHash, Draft};
pub(crate) use principals::{
    declared_refusal, no_tenant, quotas_of, sum_usage, tenant_taken, tokens_quota, TENANT_OF_ID,
    USAGE_FORGET, USAGE_OTHERS, USAGE_PUT,
};
pub use principals::{
    valid_tenant, Principals, TenantUsage, TokenRecord, TokenSelector, DEFAULT_TENANT,
    TOKEN_ID_LEN, USAGE_FRESH_MS, USAGE_KEPT_MS,
};

/// A conversation as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct ConversationRecord {
    /// Its id.
    pub id: String,
    /// The storage's own number for it.
    pub num: i64,
    /// Participants.
    pub participants: Vec<String>,
    /// Who created it.
    pub created_by: String,
    /// Free metadata.
    pub metadata: Option<Value>,
}

/// A new conversation to insert in a batch.
#[derive(Debug, Clone)]
pub struct NewConversation {
    /// Its id.
    pub id: String,
    /// The number the writer assigned.
    pub num: i64,
    /// Participants.
    pub participants: Vec<String>,
    /// Who created it.
    pub created_by: String,
    /// Free metadata.
    pub metadata: Option<Value>,
    /// The ids of the participants the server runs for it (no token may be made for them).
    pub declared: Vec<String>,
}

/// One event row to insert in a batch.
#[derive(Debug, Clone, Copy)]
pub struct NewRow<'a> {
    /// The conversation's number.
    pub conv: i64,
    /// The decided event.
    pub draft: &'a Draft,
    /// Commit time, milliseconds since the epoch.
    pub ts_ms: i64,
}

impl NewRow<'_> {
    /// Whether the row is marked as a possible plan or deliverable (the `doc` column), so that
    /// recovery reads its payload: the state numbers documents.
    pub fn document(&self) -> bool {
        self.draft.doc
    }
}

/// An event read back for recovery: what the state machine needs to observe it.
#[derive(Debug, Clone)]
pub struct RecoveredEvent {
    /// Everything but the timestamp; the payload is kept for system events only.
    pub draft: Draft,
    /// When it was committed (ms since the epoch).
    pub ts_ms: i64,
}

/// A conversation as `conversations list` shows it when reading a database directly.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConvListing {
    /// Its id.
    pub conversation_id: String,
    /// Its participants.
    pub participants: Vec<String>,
    /// Who created it.
    pub created_by: String,
    /// The seq of its last event.
    pub latest_seq: u64,
    /// When its last event was committed (ms since the epoch).
    pub last_ms: Option<i64>,
    /// Whether it is closed.
    pub closed: bool,
}

/// The head a notice of another node's commits names for a conversation it deleted (a real
/// head is at least 1: the `created` event).
pub const DELETED_HEAD: u64 = 0;

/// What a list reads of the closed conversations a shared store keeps: one tenant's, in list
/// order (newest activity first, then by key), after a place, looking at `limit` at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedQuery {
    /// The tenant whose conversations are read.
    pub tenant: String,
    /// Only those this agent takes part in (the others are looked at, not returned whole).
    pub agent: Option<String>,
    /// Where to start: after this (activity ms, key).
    pub after: Option<(i64, String)>,
    /// Only those active after this time (ms).
    pub active_after_ms: Option<i64>,
    /// How many to look at.
    pub limit: usize,
}

/// A closed conversation as [`Store::closed_page`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClosedRow {
    /// Its key.
    pub key: String,
    /// Its participants' last event, else its creation (ms): its place in lists.
    pub active_ms: i64,
    /// Whether the query's agent takes part (always, with no agent): only then are the
    /// fields below read.
    pub hit: bool,
    /// When it was created (ms).
    pub created_ms: i64,
    /// The scenario it was made from.
    pub scenario: Option<String>,
    /// Its participants.
    pub participants: Vec<String>,
    /// Its metadata.
    pub metadata: Option<serde_json::Value>,
}

/// The writer side: owned by the writer thread.
///
/// A backend that several nodes share ([`Store::shared`]) runs each batch in a transaction
/// that [`LogWriter::lock`] begins: it locks the conversations the batch writes and reads what
/// the log has past the writer's view of those it asks for, which the writer takes in before
/// it decides anything; [`LogWriter::commit`] (or
/// [`LogWriter::release`], when the batch writes nothing) ends it. The commit refuses the whole
/// batch ([`crate::engine::error::Error::Conflict`]) when it inserts a seq the log has already:
/// the writer's view of that conversation was behind.
/// A backend with a single writer (SQLite) needs none of that: its defaults do nothing.
pub trait LogWriter: Send {
    /// Commits new conversations and events in one transaction. The commit is in the log when
    /// this returns, but durable (and readable through [`Store::read_events`]) only once a
    /// [`Durability::sync`] that starts after it has returned: nothing may be acknowledged
    /// before that.
    fn commit(&mut self, convs: &[NewConversation], rows: &[NewRow<'_>]) -> Result<()>;
    /// A number for a new conversation (numbers are never reused; a failed batch may leave a
    /// gap).
    fn conversation_num(&mut self) -> Result<i64>;
    /// Deletes the conversations of `keys` that the log has, with every event of theirs, in
    /// one transaction of its own (outside any batch); answers those it deleted, in the order
    /// asked. Durable, as a commit is, once a [`Durability::sync`] that starts after it has
    /// returned.
    fn delete(&mut self, keys: &[String]) -> Result<Vec<String>>;
    /// What makes this writer's commits durable, for the thread that answers callers (taken
    /// once, before the first commit).
    fn durability(&mut self) -> Result<Box<dyn Durability>>;
    /// Begins a batch: locks what [`ToLock`] names until the batch ends, and answers what the
    /// log has past the writer's view of the conversations it asked to read, which of the ids
    /// exist already, and which fences are stale. When there is nothing to read or check, a
    /// backend may take the conversations' locks with the commit instead, before it writes
    /// anything (a decision on a view nobody read is checked by the commit either way).
    fn lock(&mut self, asked: &ToLock<'_>) -> Result<Locked> {
        let _ = asked;
        Ok(Locked::default())
    }
    /// For each (conversation number, seq) pair: that conversation's events after the seq, in
    /// seq order, for those that have some (to catch up on what other nodes appended).
    fn read_many(&mut self, from: &[(i64, u64)]) -> Result<Vec<(i64, Vec<RecoveredEvent>)>> {
        let _ = from;
        Ok(Vec::new())
    }
    /// A conversation and all its events, when this node has not seen it yet.
    fn load(&mut self, id: &str) -> Result<Option<(ConversationRecord, Vec<RecoveredEvent>)>> {
        let _ = id;
        Ok(None)
    }
    /// Of these conversations (by number), those that are not closed, each with all its events
    /// (ones other nodes created or wrote: a closed one is left in the database until a client
    /// names it), read in one snapshot.
    fn load_open(
        &mut self,
        nums: &[i64],
    ) -> Result<Vec<(ConversationRecord, Vec<RecoveredEvent>)>> {
        let _ = nums;
        Ok(Vec::new())
    }
    /// On a shared log: up to `limit` conversations that are not closed, numbered after
    /// `after`, in number order, each with its events in seq order (read in one snapshot; the
    /// payloads of messages left out, as [`Store::recover`] leaves them) — what a node takes in
    /// after it starts, a slice at a time, while it already serves. None on a log one node
    /// owns: [`Store::recover`] gave it everything at start.
    fn open_after(
        &mut self,
        after: i64,
        limit: i64,
    ) -> Result<Vec<(ConversationRecord, Vec<RecoveredEvent>)>> {
        let _ = (after, limit);
        Ok(Vec::new())
    }
    /// The conversations written lately (by any node) with their heads: what a node compares
    /// with its own view when a notification may have been lost.
    fn changed_lately(&mut self) -> Result<Vec<(i64, u64)>> {
        Ok(Vec::new())
    }
    /// Ends a batch that writes nothing (its locks are let go).
    fn release(&mut self) -> Result<()> {
        Ok(())
    }
    /// On a shared store: claims `turns` (each unless it is claimed already) for `holder`, with
    /// a lease of `lease`, in the next [`LogWriter::commit`]'s transaction: the commit that
    /// opens a turn claims it for the node that will run it. A backend with a single node
    /// claims nothing.
    fn claim_with_commit(&mut self, holder: &str, turns: Vec<TurnKey>, lease: std::time::Duration) {
        let _ = (holder, turns, lease);
    }
    /// The claims the last commit made, with their fences (taken once).
    fn granted(&mut self) -> Vec<(TurnKey, i64)> {
        Vec::new()
    }
    /// Whether this backend can have a batch in flight while the writer decides the next
    /// ([`LogWriter::send`]); when not, none of the calls below is made.
    fn overlaps(&self) -> bool {
        false
    }
    /// What to call each time a batch in flight has its answer (from whichever thread runs the
    /// connection: on PostgreSQL the writer's own, while it waits in [`LogWriter::wait_for`];
    /// at once, [`LogWriter::outcome`] no longer waits for it): the writer then settles it when
    /// nothing else came meanwhile.
    fn on_landed(&mut self, wake: Box<dyn Fn() + Send + Sync>) {
        let _ = wake;
    }
    /// Sends a batch's writes as [`LogWriter::commit`] makes them, without waiting for them:
    /// with its COMMIT (`commit`), or leaving its transaction open until
    /// [`LogWriter::send_commit`] or [`LogWriter::abandon`] (one batch at most, sent behind
    /// every batch in flight: it commits after them or not at all). Its outcome (and, with it,
    /// [`LogWriter::granted`]) is [`LogWriter::outcome`]'s, in the order the batches were sent.
    fn send(&mut self, convs: &[NewConversation], rows: &[NewRow<'_>], commit: bool) -> Result<()> {
        let _ = (convs, rows, commit);
        Err(not_overlapping())
    }
    /// Sends the COMMIT of the batch sent without one.
    fn send_commit(&mut self) -> Result<()> {
        Err(not_overlapping())
    }
    /// Rolls the batch sent without a COMMIT back (the batch before it failed).
    fn abandon(&mut self) {}
    /// Whether the oldest batch in flight has its answer ([`LogWriter::outcome`] then does not
    /// wait for it).
    fn landed(&mut self) -> bool {
        false
    }
    /// Waits for the oldest batch in flight: `Ok` once it committed; an error as
    /// [`LogWriter::commit`]'s when nothing of it was written.
    fn outcome(&mut self) -> Result<()> {
        Err(not_overlapping())
    }
    /// Waits for `next` (the writer's next job) on the writer's thread. A backend whose
    /// connection is driven on that thread ([`LogWriter::drives`]) sends and receives for its
    /// batches in flight meanwhile; the others just wait.
    fn wait_for(&mut self, next: std::pin::Pin<&mut dyn std::future::Future<Output = ()>>) {
        futures::executor::block_on(next)
    }
    /// Whether the writer must wait through [`LogWriter::wait_for`] (its connection makes
    /// progress only while the writer's thread waits on it).
    fn drives(&self) -> bool {
        false
    }
}

/// What a backend that has no batch in flight answers when asked about one.
fn not_overlapping() -> Error {
    Error::Setup("this log commits one batch at a time".into())
}

/// What a batch locks before it decides ([`LogWriter::lock`]).
#[derive(Debug, Clone, Copy)]
pub struct ToLock<'a> {
    /// The conversations it touches, by number: locked until the batch ends.
    pub nums: &'a [i64],
    /// Those of them the writer catches up on from the log once the locks are held, each with
    /// the head of its view: the ones another node wrote lately, or every one when the batch
    /// runs again after a conflict. For the others the writer trusts its view, which the commit
    /// checks.
    pub read: &'a [(i64, u64)],
    /// Those of `read` (sorted) whose every event is needed (a client here follows the
    /// conversation, or the batch does not lock it). For the rest, once locked, only the events
    /// that move more than the head ([`Locked::heads`]) are read.
    pub whole: &'a [i64],
    /// The ids it would create.
    pub new_ids: &'a [String],
    /// The writes made for claimed turns: each turn and the fence the write carries (the claims
    /// are kept from being taken until the batch ends).
    pub fences: &'a [(TurnKey, i64)],
    /// Those of `nums` (sorted) that another node's batch may hold: locked only if they are
    /// free now, the others left out of the batch ([`Locked::skipped`]) rather than waited for.
    /// The rest of `nums` are locked first, waiting as long as it takes.
    pub may_skip: &'a [i64],
}

/// What a batch found when it locked its conversations ([`LogWriter::lock`]).
#[derive(Debug, Default)]
pub struct Locked {
    /// The events after the view's head of each conversation [`ToLock::read`] named (only those
    /// that have some), read once the locks were held: with them, the view is the log.
    pub read: Vec<(i64, Vec<RecoveredEvent>)>,
    /// The ids asked to be created that exist already.
    pub existing: Vec<String>,
    /// The fences asked about that another holder has taken.
    pub stale: Vec<(TurnKey, i64)>,
    /// Those of [`ToLock::may_skip`] another transaction held: not locked, so the batch must
    /// not write them.
    pub skipped: Vec<i64>,
    /// For each conversation of `read` not in [`ToLock::whole`] that the batch locked and
    /// whose events past the view's head only move its head (messages and traces of
    /// participants that end no turn, carry no idempotency key and are no plan or deliverable):
    /// the seq of the last of them and when it was committed (ms). Nothing else is read of
    /// them: the view's state after them is the state before them with this head.
    pub heads: Vec<(i64, u64, i64)>,
}

/// Makes a writer's commits durable, on a thread of its own, so that the writer's next
/// transaction overlaps the sync of the one before.
pub trait Durability: Send {
    /// Makes every commit that has returned so far durable, then readable through
    /// [`Store::read_events`]. After an error nothing committed since the last successful sync
    /// may be acknowledged (a failed sync may have dropped written pages: the writer stops).
    fn sync(&mut self) -> Result<()>;
}

/// The shared side: reads, recovery, and the principals ([`Principals`]: tenants and tokens).
pub trait Store: Principals + Send + Sync + std::fmt::Debug + 'static {
    /// Opens the writer (once, for the writer thread).
    fn writer(&self) -> Result<Box<dyn LogWriter>>;
    /// The conversations a node holds before it starts serving, with their events in seq
    /// order (the payloads of messages may be left out: the state machine does not read them):
    /// every one on a store one node owns; none on a [`Store::shared`] one, where a node serves
    /// at once and loads a conversation when a client first names it, and takes in the open
    /// ones (which may have a turn or a timer to run with nobody naming them) a slice at a
    /// time after it starts ([`LogWriter::open_after`]); a closed one stays in the database
    /// until named.
    fn recover(&self, each: &mut dyn FnMut(ConversationRecord, Vec<RecoveredEvent>)) -> Result<()>;
    /// The closed conversations `agent` takes part in (every closed one for `None`): on a
    /// shared store, what [`Store::recover`] left in the database. None on a store one node
    /// owns (it holds every conversation).
    fn closed_ids(&self, agent: Option<&str>) -> Result<Vec<String>> {
        let _ = agent;
        Ok(Vec::new())
    }
    /// On a shared store, the closed conversations [`ClosedQuery`] looks at, in list order:
    /// what [`Store::recover`] left in the database, read a page at a time. None on a store
    /// one node owns (it holds every conversation).
    fn closed_page(&self, query: &ClosedQuery) -> Result<Vec<ClosedRow>> {
        let _ = query;
        Ok(Vec::new())
    }
    /// Events of one conversation with seq > `after`, at most `limit`, in seq order.
    fn read_events(&self, conversation: &str, after: u64, limit: usize) -> Result<Vec<Event>>;
    /// Every conversation, oldest first, for a command that reads the database directly (no
    /// server's state behind it).
    fn list_conversations(&self) -> Result<Vec<ConvListing>>;
    /// [`Store::read_events`] for a process that does not serve the database (a command that
    /// reads it directly, with no index of its own built): by default the same.
    fn read_log(&self, conversation: &str, after: u64, limit: usize) -> Result<Vec<Event>> {
        self.read_events(conversation, after, limit)
    }
    /// For a log other nodes write too: calls `changed` with the conversations (numbers and
    /// new heads) another node committed to, as it learns of them, or with `None` when some may
    /// have been missed (look at everything changed lately); until `changed` answers
    /// [`Heard::Stop`].
    fn follow(&self, changed: Changed) -> Result<()> {
        let _ = changed;
        Ok(())
    }
    /// Whether several nodes share this store: the writer then locks and catches up before each
    /// batch, and turns are claimed in it before they run.
    fn shared(&self) -> bool {
        false
    }
    /// Claims a turn for `holder` for `lease` (the database's clock): granted with a fence when
    /// nobody holds it, `holder` held it already, or the last holder's lease ran out (the fence
    /// then grows: the old holder's writes are refused); else how long the current lease runs.
    /// A store with one node grants every claim (fence 0).
    fn claim_turn(
        &self,
        turn: &TurnKey,
        holder: &str,
        lease: std::time::Duration,
    ) -> Result<Claimed> {
        let _ = (turn, holder, lease);
        Ok(Claimed::Granted { fence: 0 })
    }
    /// Renews the leases `holder` holds (each with the fence it was granted); answers, for each,
    /// whether it is still `holder`'s.
    fn renew_turns(
        &self,
        holder: &str,
        held: &[(TurnKey, i64)],
        lease: std::time::Duration,
    ) -> Result<Vec<bool>> {
        let _ = (holder, lease);
        Ok(vec![true; held.len()])
    }
    /// Lets go of every lease `holder` holds, and those of holders named `holder/…` (a graceful
    /// stop, or a push replica's claim that ended: others take the turns at once).
    fn release_turns(&self, holder: &str) -> Result<()> {
        let _ = holder;
        Ok(())
    }
}

/// A turn of a conversation, as claims name it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TurnKey {
    /// The conversation.
    pub conversation_id: String,
    /// The turn.
    pub turn: u64,
}

/// The answer to a claim ([`Store::claim_turn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Claimed {
    /// The turn is the claimant's; its writes carry this fence.
    Granted {
        /// Grows at every takeover.
        fence: i64,
    },
    /// Another holder's lease runs this much longer.
    Held {
        /// Milliseconds left (by the database's clock).
        left_ms: i64,
    },
}

/// Told what other nodes committed ([`Store::follow`]).
pub type Changed = Box<dyn Fn(Option<Vec<(i64, u64)>>) -> Heard + Send + Sync>;

/// What became of news of other nodes' commits ([`Changed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// Taken: it will be acted on.
    Taken,
    /// Dropped (the writer's queue was full): look at everything changed lately soon.
    Dropped,
    /// No longer wanted: stop following.
    Stop,
}

/// Opens the store `db` names: a `postgres://` URL selects PostgreSQL (`sync` does not apply:
/// every commit is synced, `synchronous_commit=on`), anything else is a SQLite file (created if
/// missing).
pub fn open(db: &str, sync: sqlite::Synchronous) -> Result<std::sync::Arc<dyn Store>> {
    if postgres::is_url(db) {
        Ok(std::sync::Arc::new(postgres::PgStore::open(db)?))
    } else {
        Ok(std::sync::Arc::new(sqlite::SqliteStore::open(db, sync)?))
    }
}

/// The refusal of a token for an id a scenario declared as a participant the server runs.
/// `db` as it may be shown (a URL without its password).
pub fn display(db: &str) -> String {
    postgres::redacted(db)
}

/// Formats milliseconds since the epoch as RFC 3339 UTC with milliseconds.
pub fn format_ts(ts_ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ts_ms)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// Turns a committed draft into the wire event (`ts` formatted once per commit).
pub fn to_event(conversation_id: &str, d: Draft, ts: &str) -> Event {
    Event {
        conversation_id: conversation_id.to_string(),
        seq: d.seq,
        kind: d.kind,
        author: d.author,
        turn: d.turn,
        finality: d.finality,
        payload: d.payload,
        client_request_id: d.client_request_id,
        ts: ts.to_string(),
        json: Default::default(),
    }
}

pub(crate) fn kind_from(s: &str) -> Result<EventKind> {
    EventKind::parse(s)
        .ok_or_else(|| crate::engine::error::Error::Corrupt(format!("event kind {s:?}")))
}

pub(crate) fn finality_from(s: Option<String>) -> Result<Option<Finality>> {
    s.map(|s| {
        Finality::parse(&s)
            .ok_or_else(|| crate::engine::error::Error::Corrupt(format!("finality {s:?}")))
    })
    .transpose()
}

pub(crate) fn hash_from(b: Option<Vec<u8>>) -> Option<BodyHash> {
    b.and_then(|v| v.try_into().ok())
}
