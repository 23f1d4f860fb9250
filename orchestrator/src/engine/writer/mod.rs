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
use crate::engine::store::{now_ms, Durability, Heard, LogWriter, NewConversation, NewRow, Store};

mod appending;
mod batch;
mod cluster;
mod convs;
mod decide;
mod delete;
mod gather;
mod pipeline;
mod rebuild;
mod rerun;
mod tally;
pub use appending::Appending;
pub use cluster::SharedJob;
use convs::{Convs, Slot};
use pipeline::{
    answer, fail_all, publish, publish_loop, sync, sync_loop, Committed, CommittedConv, Reply,
    SyncQueue, LOG_STOPPED,
};
use rebuild::{share_links, slot_from};
pub use tally::OpenCaps;

/// The most jobs one transaction takes (on a shared store, `cluster::MAX_SHARED_BATCH`).
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
    /// Delete conversations with their events (a tree, the root first); runs apart from the
    /// batch it came in, before it (see `delete`).
    Delete {
        /// Their keys.
        keys: Vec<String>,
        /// Answered, with those deleted, once the deletion is durable and published.
        reply: oneshot::Sender<Result<Vec<String>, RpcError>>,
    },
    /// What only a writer on a store other nodes write too does (see `cluster`).
    Shared(SharedJob),
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
    /// The scenario it is made from, by name.
    pub scenario: Option<String>,
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

/// How many open conversations one [`SharedJob::Sweep`] takes in: the writer reads them (and their
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
        if tx
            .send(Job::Shared(SharedJob::Sweep { after, reply }))
            .await
            .is_err()
        {
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
    /// What a writer on a store other nodes write too keeps besides (nothing, on one node's).
    cluster: cluster::Cluster,
    stats: Arc<WriterStats>,
    metrics: crate::engine::telemetry::CommitMetrics,
    /// The caps on open conversations each creation is checked against.
    caps: OpenCaps,
    /// A batch whose commit is in flight while the next is decided ([`overlap`]).
    pending: Option<cluster::overlap::Pending>,
    /// Whether the current batch may be left in flight: it has more than one job, jobs were
    /// queued behind it, or a batch is in flight already (a lone write left in flight would
    /// only gain a wake-up on its path).
    busy: bool,
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
                match tx.try_send(Job::Shared(SharedJob::Refresh(changes))) {
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
            stats: stats.clone(),
            metrics: crate::engine::telemetry::CommitMetrics::new(),
            caps,
            pending: None,
            busy: false,
            cluster: match log_shared {
                true => cluster::Cluster::start(store.writer()?, tx.clone())?,
                false => cluster::Cluster::default(),
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
        if let Err(mpsc::error::TrySendError::Full(job)) =
            self.tx.try_send(Job::Shared(SharedJob::Follow(ids)))
        {
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
    pub async fn create(&self, conv: CreateJob) -> Result<()> {
        // The caps count the creator's open conversations: every one must be held.
        self.swept_for_creation().await?;
        self.send_create(|reply| Job::Create {
            conv: Box::new(conv),
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
                scenario: None,
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

    /// Deletes conversations `keys` (a tree, the root first) with their events; answers those
    /// the log had, once that is durable and every reader of them is told.
    pub async fn delete(&self, keys: Vec<String>) -> Result<Vec<String>> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Job::Delete { keys, reply })
            .await
            .map_err(|_| Error::WriterGone)?;
        Ok(rx.await.map_err(|_| Error::WriterGone)??)
    }

    /// On a shared store, lets go of the closed conversations that nobody holds and no client
    /// named for `idle` (see [`SharedJob::Forget`]); how many.
    pub async fn forget_idle(&self, idle: std::time::Duration) -> Result<usize> {
        let (reply, rx) = oneshot::channel();
        let idle_ms = idle.as_millis() as i64;
        self.tx
            .send(Job::Shared(SharedJob::Forget { idle_ms, reply }))
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
        self.send_create(|reply| Job::Shared(SharedJob::Load { id, reply }))
            .await
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
