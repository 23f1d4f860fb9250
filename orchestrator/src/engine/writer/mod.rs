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

use proto_spec::system::{Created, ForkedFrom, ParentLink, SubconversationStarted, SystemEvent};
use proto_spec::{AppendResult, ErrorCode, RpcError};
use rustc_hash::FxHashMap as HashMap;
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::engine::error::{Error, Result};
use crate::engine::hub::{ConvShared, Hub};
use crate::engine::state::{AppendRequest, Applied, ConvState, Core, Draft, ShortKey, TurnPolicy};
use crate::engine::store::{now_ms, Durability, LogWriter, NewConversation, NewRow, Store};

mod appending;
mod pipeline;
pub use appending::Appending;
use pipeline::{
    answer, publish, publish_loop, refuse, sync, sync_loop, Committed, Reply, SyncQueue,
    LOG_STOPPED,
};

/// The most jobs one transaction takes.
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
        /// Its id.
        id: String,
        /// Its participants.
        participants: Vec<String>,
        /// Its metadata.
        metadata: Option<Value>,
        /// Who creates it.
        created_by: String,
        /// Its turn policy, if any (boxed: it is large and rare).
        policy: Option<Box<TurnPolicy>>,
        /// For a fork: the prefix of another conversation it starts from.
        fork: Option<Box<ForkFrom>>,
        /// For a sub-conversation: its parent and the limits it is checked against.
        child_of: Option<Box<ChildOf>>,
        /// Answered after the commit.
        reply: oneshot::Sender<Result<(), RpcError>>,
    },
    /// Finish the queued work and stop.
    Stop,
}

/// The prefix a forked conversation starts from.
#[derive(Debug)]
pub struct ForkFrom {
    /// The conversation forked.
    pub from: String,
    /// Its events 1..=`at_seq`.
    pub events: Vec<proto_spec::Event>,
}

/// What makes a new conversation a sub-conversation. The writer checks the limits against its
/// authoritative state and logs `subconversation_started` in the parent in the same transaction
/// as the child's creation.
#[derive(Debug)]
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
}

/// A cloneable handle to the writer thread.
#[derive(Debug, Clone)]
pub struct WriterHandle {
    tx: mpsc::Sender<Job>,
    thread: Arc<Mutex<Option<JoinHandle<()>>>>,
    /// The writer's counters.
    pub stats: Arc<WriterStats>,
}

struct Slot {
    num: i64,
    state: ConvState,
    shared: Arc<ConvShared>,
    /// While a batch runs: this conversation's place in its [`Touched`] list, plus one (0: not
    /// touched yet), so that each append finds its batch entry without a lookup.
    mark: usize,
}

/// The writer's conversations: their states side by side, found by id once per append.
#[derive(Default)]
struct Convs {
    slots: Vec<Slot>,
    by_id: HashMap<ShortKey, usize>,
}

impl Convs {
    fn find(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    fn get(&self, id: &str) -> Option<&Slot> {
        self.find(id).map(|i| &self.slots[i])
    }

    fn insert(&mut self, id: &str, slot: Slot) -> usize {
        self.slots.push(slot);
        self.by_id.insert(ShortKey::new(id), self.slots.len() - 1);
        self.slots.len() - 1
    }

    /// Forgets the conversations added since there were `len` (a batch that failed).
    fn truncate(&mut self, len: usize) {
        for slot in self.slots.drain(len.min(self.slots.len())..) {
            self.by_id.remove(slot.state.id.as_str());
        }
    }
}

/// A conversation touched by a batch: the events the batch appends to it, and its state before
/// the batch (to roll back to if the commit fails).
struct Touched {
    slot: usize,
    drafts: Vec<Draft>,
    undo: Undo,
}

/// Marks `slot` touched by the batch (remembering its state before it); its entry in `touched`.
fn touch(slots: &mut [Slot], slot: usize, touched: &mut Vec<Touched>) -> usize {
    let s = &mut slots[slot];
    if s.mark == 0 {
        touched.push(Touched {
            slot,
            drafts: Vec::new(),
            undo: Undo::Core(s.state.core.clone()),
        });
        s.mark = touched.len();
    }
    s.mark - 1
}

enum Undo {
    Created,
    Core(Core),
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
    next_num: i64,
    stats: Arc<WriterStats>,
    metrics: crate::engine::telemetry::CommitMetrics,
}

impl WriterHandle {
    /// Rebuilds every conversation's state from the log, registers it in the hub, and starts
    /// the writer thread.
    pub fn start(store: &dyn Store, hub: Arc<Hub>) -> Result<WriterHandle> {
        let mut log = store.writer()?;
        let mut convs = Convs::default();
        store.recover(&mut |record, events| {
            let mut state = ConvState::new(record.id.clone(), record.participants.clone());
            let mut turn_started = 0;
            for e in &events {
                state.observe(&e.draft);
                if state.core.speaker_seq == e.draft.seq {
                    turn_started = e.ts_ms;
                }
            }
            let shared = hub.insert(
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
            if let Some(p) = state.policy() {
                shared.set_policy(p.clone());
            }
            if let Some(p) = state.parent() {
                shared.set_parent(p.conversation_id.clone());
            }
            convs.insert(
                &record.id,
                Slot {
                    num: record.num,
                    state,
                    shared,
                    mark: 0,
                },
            );
        })?;
        let next_num = log.max_conversation_num()? + 1;
        let stats = Arc::new(WriterStats::default());
        let (tx, rx) = mpsc::channel(QUEUE);
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
            next_num,
            stats: stats.clone(),
            metrics: crate::engine::telemetry::CommitMetrics::new(),
        };
        let thread = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || writer.run(rx))?;
        Ok(WriterHandle {
            tx,
            thread: Arc::new(Mutex::new(Some(thread))),
            stats,
        })
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
        self.send_create(|reply| Job::Create {
            id,
            participants,
            metadata,
            created_by,
            policy: policy.map(Box::new),
            fork: None,
            child_of: child_of.map(Box::new),
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
        self.send_create(|reply| Job::Create {
            id,
            participants,
            metadata: None,
            created_by,
            policy: None,
            fork: Some(Box::new(fork)),
            child_of: None,
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

    /// Finishes every queued job, then stops the thread and waits for it.
    pub async fn stop(&self) {
        let _ = self.tx.send(Job::Stop).await;
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
    }
}

/// Appends one request to a conversation within the batch. When it closes a sub-conversation,
/// the parent's `subconversation_finished` (with the child's result) joins the same batch, so
/// the tree is never seen half-finished, whatever moment the process stops.
fn append_one(
    convs: &mut Convs,
    conversation: &str,
    request: AppendRequest,
    touched: &mut Vec<Touched>,
) -> Result<AppendResult, RpcError> {
    let Some(at) = convs.find(conversation) else {
        return Err(RpcError::new(
            ErrorCode::ConversationNotFound,
            format!("no conversation {conversation}"),
        ));
    };
    let i = touch(&mut convs.slots, at, touched);
    let slot = &mut convs.slots[at];
    let drafts = &mut touched[i].drafts;
    let before = drafts.len();
    let was_closed = slot.state.core.closed;
    let result = slot.state.apply_into(request, drafts);
    if was_closed || !slot.state.core.closed {
        return result;
    }
    let Some(parent) = slot.state.parent().map(|p| p.conversation_id.clone()) else {
        return result;
    };
    let closing = drafts[before..]
        .iter()
        .find(|d| d.finality == Some(proto_spec::Finality::Conversation));
    if let Some(closing) = closing {
        let event = slot.state.finished_event(closing);
        let report = append_one(convs, &parent, AppendRequest::system(&event), touched);
        if let Err(e) = report {
            // The parent closed first: nothing waits for this child any more.
            tracing::debug!(child = conversation, %parent, error = %e.message, "a finished sub-conversation was not reported");
        }
    }
    result
}

impl Writer {
    /// Checks a new sub-conversation against its parent (open, depth, fan-out) and appends the
    /// parent's `subconversation_started` to the batch; the child's depth.
    fn start_child(
        &mut self,
        child: &str,
        by: &str,
        c: &ChildOf,
        touched: &mut Vec<Touched>,
    ) -> Result<u32, RpcError> {
        let Some(parent) = self.convs.get(c.parent.as_str()) else {
            return Err(RpcError::new(
                ErrorCode::ConversationNotFound,
                format!("no conversation {}", c.parent),
            ));
        };
        let depth = parent.state.depth() + 1;
        if depth > c.max_depth {
            return Err(RpcError::new(
                ErrorCode::SubconversationLimit,
                format!(
                    "parentConversationId: {} is at depth {}; sub-conversations go at most {} deep",
                    c.parent,
                    depth - 1,
                    c.max_depth
                ),
            )
            .with_data(json!({"limit": "depth", "max": c.max_depth, "depth": depth})));
        }
        let open = parent.state.core.children_open;
        if open >= c.max_children {
            return Err(RpcError::new(
                ErrorCode::SubconversationLimit,
                format!(
                    "parentConversationId: {} has {open} sub-conversations open; at most {} at once",
                    c.parent, c.max_children
                ),
            )
            .with_data(json!({"limit": "fanOut", "max": c.max_children, "open": open})));
        }
        let started = AppendRequest::system(&SystemEvent::SubconversationStarted(
            SubconversationStarted {
                child: child.to_string(),
                by: by.to_string(),
                depth,
            },
        ));
        append_one(&mut self.convs, &c.parent, started, touched)?;
        Ok(depth)
    }

    fn run(&mut self, rx: mpsc::Receiver<Job>) {
        self.serve(rx);
        // Every committed batch is synced, published and answered before the writer is gone.
        self.syncer.close();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }

    fn serve(&mut self, mut rx: mpsc::Receiver<Job>) {
        let mut batch = Vec::with_capacity(MAX_BATCH);
        loop {
            let Some(first) = rx.blocking_recv() else {
                return;
            };
            // Group commit: see `SYNC_AHEAD`.
            self.syncer.wait_room();
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => break,
                }
            }
            let stop = batch.iter().any(|j| matches!(j, Job::Stop));
            self.process(&mut batch);
            if stop {
                rx.close();
                while let Ok(job) = rx.try_recv() {
                    batch.push(job);
                }
                self.process(&mut batch);
                return;
            }
        }
    }

    fn process(&mut self, batch: &mut Vec<Job>) {
        if self.stopped.load(Ordering::Acquire) {
            answer(batch.drain(..).filter_map(Reply::refusing).collect());
            return;
        }
        let ts_ms = now_ms();
        let num_before = self.next_num;
        let slots_before = self.convs.slots.len();
        // Per conversation touched by this batch, in order of first touch: its state before
        // the batch, and the events it appends.
        let mut touched: Vec<Touched> = Vec::with_capacity(batch.len());
        let mut new_convs: Vec<NewConversation> = Vec::new();
        let mut replies: Vec<Reply> = Vec::with_capacity(batch.len());
        let jobs = batch.len() as u64;
        for job in batch.drain(..) {
            match job {
                Job::Stop => {}
                Job::Create {
                    id,
                    participants,
                    metadata,
                    created_by,
                    policy,
                    fork,
                    child_of,
                    reply,
                } => {
                    if self.convs.find(&id).is_some() {
                        let e = RpcError::new(
                            ErrorCode::ConversationExists,
                            format!("conversation {id} exists already"),
                        );
                        replies.push(Reply::Create(reply, Err(e)));
                        continue;
                    }
                    // A sub-conversation: checked against its parent, which logs its start in
                    // this transaction (or the creation is refused and nothing is written).
                    let mut link = None;
                    if let Some(c) = &child_of {
                        let started = self.start_child(&id, &created_by, c, &mut touched);
                        match started {
                            Ok(depth) => {
                                link = Some(ParentLink {
                                    conversation_id: c.parent.clone(),
                                    depth,
                                })
                            }
                            Err(e) => {
                                replies.push(Reply::Create(reply, Err(e)));
                                continue;
                            }
                        }
                    }
                    let num = self.next_num;
                    self.next_num += 1;
                    let mut state = ConvState::new(id.clone(), participants.clone());
                    let drafts = match fork {
                        None => {
                            let created = Created {
                                parent: link,
                                ..ConvState::created(
                                    &participants,
                                    metadata.as_ref(),
                                    &created_by,
                                    policy.as_deref(),
                                )
                            };
                            let created = AppendRequest::system(&SystemEvent::Created(created))
                                .with_opening(child_of.and_then(|c| c.input));
                            match state.apply(created) {
                                Ok(Applied::Append(d, _)) => d,
                                _ => Vec::new(),
                            }
                        }
                        Some(f) => fork_drafts(&mut state, *f),
                    };
                    let declared = state
                        .policy()
                        .map(|p| p.agents.keys().cloned().collect())
                        .unwrap_or_default();
                    new_convs.push(NewConversation {
                        id: id.clone(),
                        num,
                        participants,
                        created_by: created_by.clone(),
                        metadata,
                        declared,
                    });
                    let empty = ConvState::new(id.clone(), Vec::new()).core;
                    let shared = Hub::make(&id, state.participants().to_vec(), empty);
                    if let Some(p) = state.policy() {
                        shared.set_policy(p.clone());
                    }
                    if let Some(p) = state.parent() {
                        shared.set_parent(p.conversation_id.clone());
                    }
                    let slot = self.convs.insert(
                        &id,
                        Slot {
                            num,
                            state,
                            shared,
                            mark: touched.len() + 1,
                        },
                    );
                    touched.push(Touched {
                        slot,
                        drafts,
                        undo: Undo::Created,
                    });
                    replies.push(Reply::Create(reply, Ok(())));
                }
                Job::Append {
                    conversation,
                    request,
                    reply,
                } => {
                    let result = append_one(&mut self.convs, &conversation, *request, &mut touched);
                    replies.push(Reply::Append(reply, result));
                }
            }
        }
        self.stats.jobs.fetch_add(jobs, Ordering::Relaxed);
        for t in &touched {
            self.convs.slots[t.slot].mark = 0;
        }
        // A conversation whose appends were all refused is as it was.
        touched.retain(|t| !t.drafts.is_empty());
        if touched.is_empty() {
            answer(replies);
            return;
        }
        let slots = &self.convs.slots;
        let rows: Vec<NewRow<'_>> = touched
            .iter()
            .flat_map(|t| {
                let conv = slots[t.slot].num;
                t.drafts
                    .iter()
                    .map(move |draft| NewRow { conv, draft, ts_ms })
            })
            .collect();
        let n_rows = rows.len() as u64;
        let started = std::time::Instant::now();
        let committed = self.log.commit(&new_convs, &rows);
        drop(rows);
        match committed {
            Ok(()) => {
                self.metrics
                    .committed(jobs as usize, n_rows, started.elapsed());
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.stats.events.fetch_add(n_rows, Ordering::Relaxed);
                let mut convs = Vec::with_capacity(touched.len());
                for t in touched {
                    let slot = &self.convs.slots[t.slot];
                    let new = matches!(t.undo, Undo::Created);
                    convs.push((slot.shared.clone(), slot.state.core.clone(), t.drafts, new));
                }
                let committed = Committed {
                    ts_ms,
                    convs,
                    replies,
                };
                // A small batch with nothing ahead of it in the pipeline is synced and
                // published here, saving two thread hops on the path of a lone turn; larger
                // ones go down the pipeline, so that syncing and publishing overlap the next
                // commit. Commit order holds either way: the pipeline is empty when this
                // thread publishes.
                if jobs as usize <= INLINE_PUBLISH && self.queued.load(Ordering::Acquire) == 0 {
                    if sync(&self.durability, &self.stopped) {
                        publish(&self.hub, committed);
                    } else {
                        refuse(committed.replies, LOG_STOPPED);
                    }
                } else {
                    self.queued.fetch_add(1, Ordering::AcqRel);
                    self.syncer.push(committed);
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "commit failed; the batch is refused and the state rolled back");
                for t in touched {
                    if let Undo::Core(core) = t.undo {
                        let state = &mut self.convs.slots[t.slot].state;
                        let first_new = core.head + 1;
                        state.core = core;
                        state.forget_keys_from(first_new);
                    }
                }
                self.convs.truncate(slots_before);
                self.next_num = num_before;
                refuse(replies, "the append could not be made durable");
            }
        }
    }
}

/// The events of a fork: the prefix copied as it was (seq, kind, author, turn, finality,
/// payload; idempotency keys are not carried over), then `forked_from`.
fn fork_drafts(state: &mut ConvState, f: ForkFrom) -> Vec<Draft> {
    let at_seq = f.events.last().map_or(0, |e| e.seq);
    let mut drafts = Vec::with_capacity(f.events.len() + 1);
    for e in f.events {
        let d = Draft {
            seq: e.seq,
            kind: e.kind,
            author: e.author,
            turn: e.turn,
            finality: e.finality,
            payload: e.payload,
            client_request_id: None,
            hash: None,
        };
        state.observe(&d);
        drafts.push(d);
    }
    let marker = AppendRequest::system(&SystemEvent::ForkedFrom(ForkedFrom {
        from: f.from,
        at_seq,
    }));
    if let Ok(Applied::Append(d, _)) = state.apply(marker) {
        drafts.extend(d);
    }
    drafts
}
