//! The log writer: one thread that owns the write connection and commits in groups.
//!
//! Callers send [`Job`]s over a bounded channel. The thread takes everything queued (up to
//! [`MAX_BATCH`]), runs each job through the state machine against its authoritative per-
//! conversation state, writes every resulting event in one transaction, and only once the
//! commit is durable publishes the events to the [`Hub`] and then answers the callers, in
//! commit order. A large batch goes down a pipeline of two threads: `log-sync` makes it durable
//! ([`Durability::sync`], one sync for every batch written since the last) while this thread
//! already writes the next (it waits while [`SYNC_AHEAD`] written batches wait for the sync,
//! and the jobs that come meanwhile gather into its next batch), and `log-publisher` publishes
//! and answers while the next one is synced. A small one, when nothing is in the pipeline, is
//! synced and published on this thread (no thread hop on the path of a lone turn).
//!
//! If the commit fails the in-memory state is rolled back and every caller of the batch gets
//! `Internal`: nothing is acknowledged that is not durable, and seq stays dense. If a sync
//! fails, the batches it covered may or may not be on disk and later batches were built on
//! them, so the log stops: those callers and every later one get `Internal` until the server
//! is restarted and recovers from what the disk holds.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use proto_spec::system::{Created, ForkedFrom, ParentLink, SubconversationStarted, SystemEvent};
use proto_spec::{AppendResult, ErrorCode, RpcError};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::engine::error::{Error, Result};
use crate::engine::hub::{ConvView, Hub};
use crate::engine::state::{
    AppendRequest, Applied, ConvMachine, Draft, Seeded, ShortKey, TurnPolicy, TurnState,
};
use crate::engine::store::{
    now_ms, Durability, Heard, LogWriter, NewConversation, NewRow, RecoveredEvent, Store,
};

mod appending;
mod batch;
mod gather;
mod overlap;
mod pipeline;
mod shared;
mod tally;
pub use appending::Appending;
use pipeline::{
    answer, fail_all, publish, publish_loop, sync, sync_loop, Committed, CommittedConv, Reply,
    SyncQueue, LOG_STOPPED,
};
pub use tally::OpenCaps;

/// The most jobs one transaction takes (on a shared store, `shared::MAX_SHARED_BATCH`).
pub const MAX_BATCH: usize = 4096;
/// Jobs that may wait for the writer; past this, an append waits for room (see
/// [`WriterHandle::append`]).
pub const QUEUE: usize = 65_536;
/// Batches of at most this many jobs are synced and published by the writer itself when
/// nothing is in the pipeline.
const INLINE_PUBLISH: usize = 4;
/// At most this many written batches wait for the sync thread to start on them. While they
/// wait, the jobs that come gather into the next batch (group commit) instead of each going to
/// the disk in a transaction of its own; two rather than one let the writer run on while a
/// sync is slow, and keep batches a few hundred jobs long under load (measured: one is ~7%
/// slower in the appends benchmark; none gives batches of ~100 and gains nothing).
const SYNC_AHEAD: usize = 2;
/// How long a batch of trailing writes only ([`AppendRequest::trailing`]) waits for a write
/// that is not, to commit with it, before it commits alone.
pub const TRAILING_WAIT: Duration = Duration::from_millis(1);

/// Work for the writer.
#[derive(Debug)]
pub enum Job {
    /// Append through the state machine.
    Append {
        /// The conversation.
        conversation: String,
        /// What to append (boxed: jobs are moved several times on their way).
        request: Box<AppendRequest>,
        /// Answered after the commit.
        reply: oneshot::Sender<Result<AppendResult, RpcError>>,
    },
    /// Create a conversation with its `created` event.
    Create {
        /// What to create (boxed: it is large and rare).
        conv: Box<CreateJob>,
        /// Answered after the commit.
        reply: oneshot::Sender<Result<(), RpcError>>,
    },
    /// Load a conversation another node created, if the log has it; answered once it is
    /// published here (or not found).
    Load {
        /// Its id.
        id: String,
        /// Answered after the conversation's events are published here.
        reply: oneshot::Sender<Result<(), RpcError>>,
    },
    /// Catch up on what other nodes committed (conversation numbers with their new heads, or
    /// everything changed lately when `None`).
    Refresh(Option<Vec<(i64, u64)>>),
    /// On a shared store: let go of the closed conversations nobody holds and no client named
    /// for `idle_ms` (they are loaded again when named); answered with how many.
    Forget {
        /// How long untouched.
        idle_ms: i64,
        /// How many were let go.
        reply: oneshot::Sender<usize>,
    },
    /// On a shared store, after the start: take in the open conversations numbered after
    /// `after` that this node does not know, a slice of them (see [`Writer::sweep`]); answered
    /// with the last number read and how many were taken in, or `None` when there were no
    /// more.
    Sweep {
        /// Where the slice starts (exclusive).
        after: i64,
        /// The last number read, and how many were new here.
        reply: oneshot::Sender<Result<Option<(i64, usize)>>>,
    },
    /// On a shared store: what the reader read past this node's views of conversations other
    /// nodes committed to ([`Writer::read_behind`]), to take in; `Err` with the numbers it was
    /// asked for when the read failed.
    TakeIn(std::result::Result<Vec<(i64, Vec<RecoveredEvent>)>, Vec<i64>>),
    /// On a shared store: clients read these conversations here; take in what other nodes
    /// committed to them past this node's views ([`ConvView::followed`]).
    Follow(Vec<String>),
    /// The batch in flight has its answer (see `overlap`): settle it if nothing else came.
    CommitAnswered,
    /// Finish the queued work and stop.
    Stop,
}

/// A conversation to create.
#[derive(Debug, Clone)]
pub struct CreateJob {
    /// Its id.
    pub id: String,
    /// Its participants.
    pub participants: Vec<String>,
    /// Its metadata.
    pub metadata: Option<Value>,
    /// Who creates it.
    pub created_by: String,
    /// Its turn policy, if any.
    pub policy: Option<TurnPolicy>,
    /// For a fork: the prefix of another conversation it starts from.
    pub fork: Option<ForkFrom>,
    /// For a sub-conversation: its parent and the limits it is checked against.
    pub child_of: Option<ChildOf>,
}

/// The prefix a forked conversation starts from.
#[derive(Debug, Clone)]
pub struct ForkFrom {
    /// The conversation forked.
    pub from: String,
    /// Its events 1..=`at_seq`.
    pub events: Vec<proto_spec::Event>,
}

/// What makes a new conversation a sub-conversation. The writer checks the limits against its
/// authoritative state and logs `subconversation_started` in the parent in the same transaction
/// as the child's creation.
#[derive(Debug, Clone)]
pub struct ChildOf {
    /// The parent conversation.
    pub parent: String,
    /// The child's task, posted as its first message.
    pub input: Option<Value>,
    /// The deepest a tree may go (a top-level conversation is at depth 0).
    pub max_depth: u32,
    /// The most sub-conversations a conversation may have open at once.
    pub max_children: u32,
}

/// Counters of the writer's work.
#[derive(Debug, Default)]
pub struct WriterStats {
    /// Transactions committed.
    pub batches: AtomicU64,
    /// Events committed.
    pub events: AtomicU64,
    /// Jobs handled (appends, duplicates, refusals, creations).
    pub jobs: AtomicU64,
    /// The most jobs one batch has handled.
    pub most_jobs: AtomicU64,
    /// Nanoseconds the writer thread spent on batches, all told.
    pub busy_ns: AtomicU64,
    /// Of which: locking the batch's conversations and catching up on them (a shared store).
    pub lock_ns: AtomicU64,
    /// Of which: the commit (the statements, the transaction's end, its sync when the writer
    /// syncs itself).
    pub commit_ns: AtomicU64,
    /// On a shared store: batches refused by the database because another node appended first
    /// (caught up and run again).
    pub conflicts: AtomicU64,
    /// On a shared store: batches run again, on views read from the log, because an answer
    /// that writes nothing was decided on a view nothing verified.
    pub rechecks: AtomicU64,
    /// On a shared store: jobs put off to the next batch because another node's batch held
    /// their conversation.
    pub put_off: AtomicU64,
    /// On PostgreSQL: batches decided and sent while the batch before them was committing
    /// (see `overlap`).
    pub overlapped: AtomicU64,
}

/// How many open conversations one [`Job::Sweep`] takes in: the writer reads them (and their
/// events) between two batches, so a slice holds appends back for a few tens of milliseconds
/// at most.
const SWEEP_SLICE: i64 = 256;

/// How long a creation waits for the sweep after the start (see [`sweep`]) before it is
/// refused: about a second per million events of open conversations when the database
/// answers.
const SWEEP_WAIT: Duration = Duration::from_secs(30);

/// On a shared store, right after the start: the open conversations taken in a slice at a
/// time, in number order, while the node serves (a client that names one first has it loaded
/// then); `done` says when every one is held. A slice the database could not give is asked for
/// again a second later.
async fn sweep(tx: mpsc::Sender<Job>, done: tokio::sync::watch::Sender<bool>) {
    let began = std::time::Instant::now();
    let (mut after, mut taken) = (0, 0);
    loop {
        let (reply, rx) = oneshot::channel();
        if tx.send(Job::Sweep { after, reply }).await.is_err() {
            return;
        }
        match rx.await {
            Ok(Ok(Some((last, new)))) => (after, taken) = (last, taken + new),
            Ok(Ok(None)) => break,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "could not read the open conversations; trying again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(_) => return,
        }
    }
    tracing::info!(
        elapsed_ms = began.elapsed().as_millis() as u64,
        taken_in = taken,
        "every open conversation is held"
    );
    done.send_replace(true);
}

/// Waits until `swept` says every open conversation is held (or its writer is gone), at most
/// `wait`; then the database is taken as unavailable.
async fn swept_within(mut swept: tokio::sync::watch::Receiver<bool>, wait: Duration) -> Result<()> {
    match tokio::time::timeout(wait, swept.wait_for(|s| *s)).await {
        Ok(_) => Ok(()),
        Err(_) => Err(Error::Unavailable(
            "this node is still taking in the open conversations after its start".into(),
        )),
    }
}

/// A cloneable handle to the writer thread.
#[derive(Debug, Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<Job>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    /// The writer's counters.
    pub stats: Arc<WriterStats>,
    /// Whether every conversation that was open when the writer started is held (at once on a
    /// store one node owns; on a shared one, once [`sweep`] has taken them in).
    swept: tokio::sync::watch::Receiver<bool>,
}

struct Slot {
    num: i64,
    state: ConvMachine,
    shared: Arc<ConvView>,
    /// While a batch runs: this conversation's place in its [`TouchedConversation`] list, plus one (0: not
    /// touched yet), so that each append finds its batch entry without a lookup.
    mark: usize,
    /// On a shared store: until when (ms since the epoch) batches read this conversation's head
    /// from the log before deciding, because another node wrote it lately (see `shared`).
    read_until_ms: i64,
    /// Who created it (what it counts against while open).
    creator: String,
    /// Whether it is counted among the open conversations ([`Convs::settle`]).
    counted: bool,
}

impl Slot {
    /// A slot for `state`, not yet counted.
    fn new(num: i64, state: ConvMachine, shared: Arc<ConvView>, creator: String) -> Slot {
        Slot {
            num,
            state,
            shared,
            mark: 0,
            read_until_ms: 0,
            creator,
            counted: false,
        }
    }

    /// The tree it counts in: for a sub-conversation, its top-level conversation (its parent,
    /// in a log written before the root was recorded).
    fn tree(&self) -> Option<&str> {
        self.state
            .parent()
            .map(|p| p.root.as_deref().unwrap_or(&p.conversation_id))
    }
}

/// The writer's conversations: their states side by side, found by id once per append (and
/// by number when another node's commits are caught up on).
#[derive(Default)]
struct Convs {
    slots: Vec<Slot>,
    by_id: Seeded<ShortKey, usize>,
    by_num: Seeded<i64, usize>,
    /// The open ones, per creator and per tree (for the caps).
    open: tally::OpenCounts,
}

impl Convs {
    fn find(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    fn get(&self, id: &str) -> Option<&Slot> {
        self.find(id).map(|i| &self.slots[i])
    }

    fn insert(&mut self, id: &str, slot: Slot) -> usize {
        self.by_num.insert(slot.num, self.slots.len());
        self.slots.push(slot);
        self.by_id.insert(ShortKey::new(id), self.slots.len() - 1);
        self.settle(self.slots.len() - 1);
        self.slots.len() - 1
    }

    /// Counts the conversation in `at` among the open ones, or out, as its state now is: open
    /// from its `created` event until it closes. Called whenever its state may have changed.
    fn settle(&mut self, at: usize) {
        let slot = &mut self.slots[at];
        let open = slot.state.core.head > 0 && !slot.state.core.closed;
        if open != slot.counted {
            slot.counted = open;
            self.open.count(&slot.creator, slot.tree(), open);
        }
    }

    /// Counts a conversation that leaves the writer out.
    fn uncount(open: &mut tally::OpenCounts, slot: &Slot) {
        if slot.counted {
            open.count(&slot.creator, slot.tree(), false);
        }
    }

    /// Forgets the conversation in `at` (the last one takes its place).
    fn remove(&mut self, at: usize) {
        let slot = self.slots.swap_remove(at);
        Self::uncount(&mut self.open, &slot);
        self.by_id.remove(slot.state.id.as_str());
        self.by_num.remove(&slot.num);
        if let Some(moved) = self.slots.get(at) {
            self.by_id.insert(ShortKey::new(&moved.state.id), at);
            self.by_num.insert(moved.num, at);
        }
    }

    /// Forgets the conversations added since there were `len` (a batch that failed).
    fn truncate(&mut self, len: usize) {
        for slot in self.slots.drain(len.min(self.slots.len())..) {
            Self::uncount(&mut self.open, &slot);
            self.by_id.remove(slot.state.id.as_str());
            self.by_num.remove(&slot.num);
        }
    }
}

struct Writer {
    log: Box<dyn LogWriter>,
    hub: Arc<Hub>,
    /// Batches handed to the sync thread and not yet published.
    queued: Arc<AtomicUsize>,
    /// Makes commits durable: the sync thread's, and this thread's for a small batch when
    /// nothing is queued (never both at once).
    durability: Arc<Mutex<Box<dyn Durability>>>,
    /// Set when a sync failed: the log takes nothing more.
    stopped: Arc<AtomicBool>,
    /// Written batches waiting for the sync thread.
    syncer: Arc<SyncQueue>,
    threads: Vec<JoinHandle<()>>,
    convs: Convs,
    /// Whether other nodes write the same log: each batch locks and catches up first.
    shared: bool,
    /// The fenced writes of the current batch whose turn another node has taken.
    stale: Vec<(crate::engine::store::TurnKey, i64)>,
    /// The conversations whose heads the current batch read from the log once it held their
    /// locks (by number, sorted): its view of them is the log's.
    verified: Vec<i64>,
    /// On a shared store: the jobs a batch put off because another node's batch held their
    /// conversations, with how many times each was put off; they begin the next batch.
    carried: Vec<(Job, u8)>,
    /// How many times each job at the front of the current batch was put off (those carried).
    put_off: Vec<u8>,
    stats: Arc<WriterStats>,
    metrics: crate::engine::telemetry::CommitMetrics,
    /// The caps on open conversations each creation is checked against.
    caps: OpenCaps,
    /// On a shared store, how far the sweep after the start has read the open conversations
    /// (by number; `i64::MAX` once done): a notice about one it has not reached and this node
    /// does not know is left to it (see [`Writer::take_in_notices`]).
    swept_until: i64,
    /// On a shared store: the reader thread, which reads what other nodes committed off the
    /// writer's path ([`Writer::read_behind`]).
    reader: Option<shared::Reader>,
    /// On a shared store: conversations (by number) whose views were left behind the log,
    /// nothing here following them ([`Writer::take_in_notices`]); some may have caught up since.
    behind_views: std::collections::BTreeSet<i64>,
    /// A batch whose commit is in flight while the next is decided ([`overlap`]).
    pending: Option<overlap::Pending>,
    /// Whether the current batch may be left in flight: it has more than one job, jobs were
    /// queued behind it, or a batch is in flight already (a lone write left in flight would
    /// only gain a wake-up on its path).
    busy: bool,
}

/// Gives a conversation's view what its state knows once, from its `created` event: the policy
/// and the parent.
fn share_links(state: &ConvMachine, view: &ConvView) {
    if let Some(p) = state.policy() {
        view.set_policy(p.clone());
    }
    if let Some(p) = state.parent() {
        view.set_parent(p.conversation_id.clone());
    }
}

/// A conversation's slot, its state rebuilt from its events (at start, or when this node first
/// meets a conversation another node created); not yet registered in the hub. A log that holds
/// an idempotency key twice for one author is refused: on SQLite no index stops that, the
/// writer does (its schema step 5), and a start is where a log written otherwise is found.
fn slot_from(
    record: crate::engine::store::ConversationRecord,
    events: &[crate::engine::store::RecoveredEvent],
) -> Result<Slot> {
    let mut state = ConvMachine::new(record.id.clone(), record.participants.clone());
    let mut turn_started = 0;
    for e in events {
        if let (Some(key), Some(_)) = (&e.draft.client_request_id, e.draft.hash) {
            if state.knows_key(&e.draft.author, key) {
                return Err(Error::Corrupt(format!(
                    "conversation {}: seq {} repeats the idempotency key {key:?} of {}",
                    record.id, e.draft.seq, e.draft.author
                )));
            }
        }
        state.observe(&e.draft);
        if state.core.speaker_seq == e.draft.seq {
            turn_started = e.ts_ms;
        }
    }
    let shared = Hub::make(
        &record.id,
        state.participants().to_vec(),
        state.core.clone(),
    );
    // Timers count from logged times, so they hold across a restart.
    shared.set_turn_started(turn_started);
    let created_ms = events.first().map_or(0, |e| e.ts_ms);
    let active_ms = events
        .iter()
        .rev()
        .find(|e| e.draft.author != proto_spec::ORCHESTRATOR_AUTHOR)
        .map_or(created_ms, |e| e.ts_ms);
    shared.set_clock(created_ms, active_ms);
    share_links(&state, &shared);
    Ok(Slot::new(record.num, state, shared, record.created_by))
}

impl WriterHandle {
    /// Rebuilds every conversation's state from the log, registers it in the hub, and starts
    /// the writer thread, which holds every creation to `caps`.
    pub fn start(store: &dyn Store, hub: Arc<Hub>, caps: OpenCaps) -> Result<WriterHandle> {
        let mut log = store.writer()?;
        let mut convs = Convs::default();
        let mut refused = None;
        store.recover(&mut |record, events| {
            if refused.is_some() {
                return;
            }
            let id = record.id.clone();
            match slot_from(record, &events) {
                Ok(slot) => {
                    hub.register(slot.shared.clone());
                    convs.insert(&id, slot);
                }
                Err(e) => refused = Some(e),
            }
        })?;
        if let Some(e) = refused {
            return Err(e);
        }
        let log_shared = store.shared();
        let stats = Arc::new(WriterStats::default());
        let (tx, rx) = mpsc::channel(QUEUE);
        let landed = tx.downgrade();
        log.on_landed(Box::new(move || {
            // A full queue has jobs enough to wake the writer.
            if let Some(tx) = landed.upgrade() {
                let _ = tx.try_send(Job::CommitAnswered);
            }
        }));
        let (swept_tx, swept) = tokio::sync::watch::channel(!log_shared);
        if log_shared {
            tokio::spawn(sweep(tx.clone(), swept_tx));
        }
        {
            // Other nodes' commits, caught up on by this writer (a full queue drops the notice,
            // and the store looks at everything changed lately at its next poll).
            let tx = tx.clone();
            store.follow(Box::new(move |changes| {
                match tx.try_send(Job::Refresh(changes)) {
                    Ok(()) => Heard::Taken,
                    Err(mpsc::error::TrySendError::Full(_)) => Heard::Dropped,
                    Err(mpsc::error::TrySendError::Closed(_)) => Heard::Stop,
                }
            }))?;
        }
        let durability = Arc::new(Mutex::new(log.durability()?));
        let stopped = Arc::new(AtomicBool::new(false));
        let syncer = Arc::new(SyncQueue::default());
        let (publisher, synced) = std::sync::mpsc::channel::<Committed>();
        let queued = Arc::new(AtomicUsize::new(0));
        let sync_thread = {
            let (durability, stopped, queued, written) = (
                durability.clone(),
                stopped.clone(),
                queued.clone(),
                syncer.clone(),
            );
            std::thread::Builder::new()
                .name("log-sync".into())
                .spawn(move || sync_loop(&durability, &stopped, &written, publisher, &queued))?
        };
        let publisher_thread = {
            let hub = hub.clone();
            let queued = queued.clone();
            std::thread::Builder::new()
                .name("log-publisher".into())
                .spawn(move || publish_loop(&hub, synced, &queued))?
        };
        let mut writer = Writer {
            log,
            hub,
            queued,
            durability,
            stopped,
            syncer,
            threads: vec![sync_thread, publisher_thread],
            convs,
            shared: log_shared,
            stale: Vec::new(),
            verified: Vec::new(),
            carried: Vec::new(),
            put_off: Vec::new(),
            stats: stats.clone(),
            metrics: crate::engine::telemetry::CommitMetrics::new(),
            caps,
            swept_until: if log_shared { 0 } else { i64::MAX },
            behind_views: Default::default(),
            pending: None,
            busy: false,
            reader: match log_shared {
                true => Some(shared::Reader::start(store.writer()?, tx.clone())?),
                false => None,
            },
        };
        let thread = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(WriterHandle {
            tx,
            thread: Arc::new(Mutex::new(Some(thread))),
            stats,
            swept,
        })
    }

    /// Has the writer take in what other nodes committed past this node's views of `ids` (read
    /// here); the views' heads say when it is done.
    pub fn follow(&self, ids: Vec<String>) {
        if let Err(mpsc::error::TrySendError::Full(job)) = self.tx.try_send(Job::Follow(ids)) {
            let tx = self.tx.clone();
            tokio::spawn(async move { tx.send(job).await });
        }
    }

    /// Appends through the state machine; the [`Appending`] answers once the event is durable.
    ///
    /// The job is queued when this is called (when the queue has room, as it nearly always
    /// has), not when the future is first polled, so the future only waits for the answer:
    /// a caller's task holds two pointers per append in flight, not a suspended send.
    pub fn append(&self, conversation: String, request: AppendRequest) -> Appending {
        let (reply, answer) = oneshot::channel();
        let job = Job::Append {
            conversation,
            request: Box::new(request),
            reply,
        };
        Appending::queue(&self.tx, job, answer)
    }

    /// Creates a conversation (a sub-conversation of `child_of.parent` when given: the parent's
    /// `subconversation_started` commits with it); answers once it is durable.
    pub async fn create(
        &self,
        id: String,
        participants: Vec<String>,
        metadata: Option<Value>,
        created_by: String,
        policy: Option<TurnPolicy>,
        child_of: Option<ChildOf>,
    ) -> Result<()> {
        // The caps count the creator's open conversations: every one must be held.
        self.swept_for_creation().await?;
        self.send_create(|reply| Job::Create {
            conv: Box::new(CreateJob {
                id,
                participants,
                metadata,
                created_by,
                policy,
                fork: None,
                child_of,
            }),
            reply,
        })
        .await
    }

    /// Creates `id` as a copy of another conversation's first events, followed by a
    /// `forked_from` event; answers once it is durable.
    pub async fn fork(
        &self,
        id: String,
        participants: Vec<String>,
        created_by: String,
        fork: ForkFrom,
    ) -> Result<()> {
        self.swept_for_creation().await?;
        self.send_create(|reply| Job::Create {
            conv: Box::new(CreateJob {
                id,
                participants,
                metadata: None,
                created_by,
                policy: None,
                fork: Some(fork),
                child_of: None,
            }),
            reply,
        })
        .await
    }

    async fn send_create(
        &self,
        job: impl FnOnce(oneshot::Sender<Result<(), RpcError>>) -> Job,
    ) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(job(reply))
            .await
            .map_err(|_| Error::WriterGone)?;
        Ok(rx.await.map_err(|_| Error::WriterGone)??)
    }

    /// On a shared store, lets go of the closed conversations that nobody holds and no client
    /// named for `idle` (see [`Job::Forget`]); how many.
    pub async fn forget_idle(&self, idle: std::time::Duration) -> Result<usize> {
        let (reply, rx) = oneshot::channel();
        let idle_ms = idle.as_millis() as i64;
        self.tx
            .send(Job::Forget { idle_ms, reply })
            .await
            .map_err(|_| Error::WriterGone)?;
        rx.await.map_err(|_| Error::WriterGone)
    }

    /// Returns once every conversation that was open when the writer started is held (at once
    /// on a store one node owns; see [`sweep`]), or the writer has stopped.
    pub async fn swept(&self) {
        let mut swept = self.swept.clone();
        let _ = swept.wait_for(|s| *s).await;
    }

    /// [`WriterHandle::swept`] for a creation, which is refused (the database is unavailable)
    /// rather than left waiting when the sweep after the start has not ended within
    /// [`SWEEP_WAIT`] (it tries again each second while the database does not answer).
    async fn swept_for_creation(&self) -> Result<()> {
        swept_within(self.swept.clone(), SWEEP_WAIT).await
    }

    /// How many jobs wait for the writer to take them.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// Loads conversation `id` if another node created it and this one does not know it yet;
    /// returns once it is known here (or the log has no such conversation).
    pub async fn ensure_known(&self, id: String) -> Result<()> {
        self.send_create(|reply| Job::Load { id, reply }).await
    }

    /// Finishes every queued job, then stops the thread and waits for it.
    pub async fn stop(&self) {
        let _ = self.tx.send(Job::Stop).await;
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A creation waits for the sweep after the start, and is refused as unavailable when the
    /// sweep has not ended within the wait (the database not answering).
    #[tokio::test(start_paused = true)]
    async fn a_creation_waits_for_the_sweep_within_a_bound() {
        let (done, swept) = tokio::sync::watch::channel(false);
        let waiting = tokio::spawn(swept_within(swept.clone(), SWEEP_WAIT));
        tokio::time::sleep(SWEEP_WAIT / 2).await;
        done.send_replace(true);
        assert!(
            waiting.await.expect("joined").is_ok(),
            "answered once swept"
        );

        let (_never, swept) = tokio::sync::watch::channel(false);
        let refused = swept_within(swept, SWEEP_WAIT).await;
        assert!(
            matches!(&refused, Err(Error::Unavailable(why)) if why.contains("taking in")),
            "{refused:?}"
        );

        // A writer that is gone does not hold a creation up: the writer itself refuses it.
        let (gone, swept) = tokio::sync::watch::channel(false);
        drop(gone);
        assert!(swept_within(swept, SWEEP_WAIT).await.is_ok());
    }
}
