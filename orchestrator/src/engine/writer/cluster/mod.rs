//! The writer on a log that other nodes write too (PostgreSQL): all it does besides a writer on a
//! log one node owns sits in this folder, behind [`Cluster`] (which holds nothing on one node) and
//! [`SharedJob`]. `lock.rs`: each batch's locks and catch-up; `reader.rs`: the reader that takes
//! in other nodes' commits off the writer's path; `take_in.rs`: conversations and events other
//! nodes committed, taken in; `sweep.rs`: the open conversations taken in after the start, and
//! closed ones let go; `overlap.rs`: two batches in flight.
//!
//! Before a batch decides anything, [`Writer::begin_shared`] locks, in the database, every
//! conversation the batch may write (so that nodes writing the same conversation take turns),
//! and catches the writer's state up on whatever another node appended to those it wrote
//! lately ([`CONTENDED`]): what the log has past this node's view of them is read once the
//! locks are held. For the
//! others the batch trusts this node's view, and its commit checks it: the commit inserts the
//! seqs that follow the head the batch decided on, and the log's (conversation, seq) key
//! refuses the whole batch if another node appended first ([`Error::Conflict`]: this node
//! missed a notification, or had not received it yet). Nothing of it is written; the writer
//! runs it again reading every conversation ([`Writer::process`]), which no other node can get
//! ahead of, since it holds the locks. An answer that writes nothing (a refusal, a change
//! already made) is not checked by any insert, so one decided on a view that was not read is
//! decided again the same way. Events another node commits are also caught up on when it says
//! so ([`SharedJob::Refresh`], from the store's notifications and its polling), so that readers and
//! subscribers here see them; those are published in the log's order, through the same
//! pipeline as this node's own batches.

use super::decide::TouchedConversation;
use super::*;
use crate::engine::store::RecoveredEvent;

mod lock;
pub(super) mod overlap;
mod reader;
mod sweep;
mod take_in;

pub(super) use reader::Reader;

/// How long after another node last wrote a conversation (as far as this node has seen) its
/// batches read its head from the log before deciding, rather than decide on this node's view
/// and risk a conflict.
pub(super) const CONTENDED: std::time::Duration = std::time::Duration::from_secs(5);

/// The most times a job is put off because another node's batch held its conversation; then
/// its batch waits for the lock.
pub(super) const MAX_PUT_OFF: u8 = 3;

/// The most jobs one batch takes on a shared store. Each conversation a batch writes is a
/// lock in PostgreSQL's shared lock table until it commits (a job writes its conversation and
/// at most its parent: 1,024 locks a node at most), which every session of the server shares
/// (`max_locks_per_transaction` × `max_connections`, 6,400 by default; docs/cluster.md).
pub(super) const MAX_SHARED_BATCH: usize = 512;

/// The most times one batch runs: after a conflict it runs again with every head read under the
/// locks, which no other node can get ahead of; a further conflict would be a fault.
pub(super) const MAX_ATTEMPTS: usize = 4;

/// What a writer on a store other nodes write too keeps besides its conversations. On a store
/// one node owns it is the default, and holds nothing: no reader, and every step of a
/// batch that asks it returns at once.
#[derive(Debug)]
pub(super) struct Cluster {
    /// The fenced writes of the current batch whose turn another node has taken.
    pub(super) stale: Vec<(crate::engine::store::TurnKey, i64)>,
    /// The conversations whose heads the current batch read from the log once it held their
    /// locks (by number, sorted): its view of them is the log's.
    pub(super) verified: Vec<i64>,
    /// The jobs a batch put off because another node's batch held their conversations, with
    /// how many times each was put off; they begin the next batch.
    pub(super) carried: Vec<(Job, u8)>,
    /// How many times each job at the front of the current batch was put off (those carried).
    pub(super) put_off: Vec<u8>,
    /// How far the sweep after the start has read the open conversations (by number;
    /// `i64::MAX` once done): a notice about one it has not reached and this node does not
    /// know is left to it (see [`Writer::take_in_notices`]).
    pub(super) swept_until: i64,
    /// The reader thread, which reads what other nodes committed off the writer's path
    /// ([`Writer::read_behind`]).
    pub(super) reader: Option<Reader>,
    /// Conversations (by number) whose views were left behind the log, nothing here following
    /// them ([`Writer::take_in_notices`]); some may have caught up since.
    pub(super) behind_views: std::collections::BTreeSet<i64>,
}

impl Default for Cluster {
    /// A store one node owns: nothing to lock, catch up on or sweep.
    fn default() -> Cluster {
        Cluster {
            stale: Vec::new(),
            verified: Vec::new(),
            carried: Vec::new(),
            put_off: Vec::new(),
            swept_until: i64::MAX,
            reader: None,
            behind_views: Default::default(),
        }
    }
}

impl Cluster {
    /// Whether other nodes write the same log (it has a reader): each batch locks and
    /// catches up first.
    pub(super) fn is_shared(&self) -> bool {
        self.reader.is_some()
    }

    /// A writer's part on a shared store: its reader started on `log` (a connection of its
    /// own), queueing what it reads on `jobs`; the sweep after the start not begun.
    pub(super) fn start(
        log: Box<dyn LogWriter>,
        jobs: mpsc::Sender<Job>,
    ) -> std::io::Result<Cluster> {
        Ok(Cluster {
            swept_until: 0,
            reader: Some(Reader::start(log, jobs)?),
            ..Cluster::default()
        })
    }
}

/// The jobs of a writer on a store other nodes write too.
#[derive(Debug)]
pub enum SharedJob {
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
    /// let go of the closed conversations nobody holds and no client named
    /// for `idle_ms` (they are loaded again when named); answered with how many.
    Forget {
        /// How long untouched.
        idle_ms: i64,
        /// How many were let go.
        reply: oneshot::Sender<usize>,
    },
    /// After the start: take in the open conversations numbered after
    /// `after` that this node does not know, a slice of them (see [`Writer::sweep`]); answered
    /// with the last number read and how many were taken in, or `None` when there were no
    /// more.
    Sweep {
        /// Where the slice starts (exclusive).
        after: i64,
        /// The last number read, and how many were new here.
        reply: oneshot::Sender<Result<Option<(i64, usize)>>>,
    },
    /// what the reader read past this node's views of conversations other
    /// nodes committed to ([`Writer::read_behind`]), to take in; `Err` with the numbers it was
    /// asked for when the read failed.
    TakeIn(std::result::Result<Vec<(i64, Vec<RecoveredEvent>)>, Vec<i64>>),
    /// clients read these conversations here; take in what other nodes
    /// committed to them past this node's views ([`ConvView::follows_remote_commits`]).
    Follow(Vec<String>),
}

impl SharedJob {
    /// Its answer once the log has stopped ([`Reply::refusing`]).
    pub(in crate::engine::writer) fn refusing(self) -> Option<Reply> {
        match self {
            SharedJob::Load { reply, .. } => Some(Reply::Create(
                reply,
                Err(RpcError::new(ErrorCode::Internal, LOG_STOPPED)),
            )),
            SharedJob::Forget { reply, .. } => {
                let _ = reply.send(0);
                None
            }
            SharedJob::Sweep { reply, .. } => {
                let _ = reply.send(Err(Error::WriterGone));
                None
            }
            SharedJob::Refresh(_) | SharedJob::TakeIn(_) | SharedJob::Follow(_) => None,
        }
    }

    /// Whether it runs apart from the batch it came in, before it ([`Writer::run_apart`]):
    /// housekeeping and catching up on reads, not a load a caller waits for or a notice the
    /// batch takes in under its locks.
    pub(super) fn runs_apart(&self) -> bool {
        !matches!(self, SharedJob::Load { .. } | SharedJob::Refresh(_))
    }
}

impl Job {
    /// [`SharedJob::runs_apart`], and a deletion.
    pub(super) fn runs_apart(&self) -> bool {
        match self {
            Job::Shared(job) => job.runs_apart(),
            Job::Delete { .. } => true,
            _ => false,
        }
    }
}

impl Slot {
    /// Whether another node committed past the writer's state of it, as far as notices said
    /// (a view nothing here follows is left behind: [`Writer::take_in_notices`]).
    pub(in crate::engine::writer) fn behind(&self) -> bool {
        self.shared.remote_head() > self.state.core.head
    }
}

/// The refusal of a write made for a turn another node has taken over.
pub(super) fn taken_over(conversation: &str, turn: u64) -> RpcError {
    RpcError::new(
        ErrorCode::ClaimNotFound,
        format!("turn {turn} of conversation {conversation} was taken over by another node; this write is refused"),
    )
}

/// What a caller is told when a batch failed: whether the database could not be used, or
/// something else went wrong.
pub(super) fn failure_message(e: &Error) -> &'static str {
    match e {
        e if e.is_disk_full() => crate::engine::error::DISK_FULL,
        Error::Unavailable(_) | Error::Postgres(_) => crate::engine::error::UNAVAILABLE,
        _ => "the append could not be made durable",
    }
}

impl Writer {
    /// On a shared store, locks the batch's conversations and catches up on them (see
    /// [`Writer::begin_shared`]); false when that failed and every job of the batch was
    /// refused.
    pub(in crate::engine::writer) fn lock_batch(
        &mut self,
        batch: &mut Vec<Job>,
        read_all: bool,
    ) -> bool {
        if !self.cluster.is_shared() {
            return true;
        }
        let locking = std::time::Instant::now();
        let locked = self.begin_shared(batch, read_all);
        self.stats
            .lock_ns
            .fetch_add(locking.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let Err(e) = locked else { return true };
        tracing::warn!(error = %e, "a batch could not lock its conversations; refused");
        let message = cluster::failure_message(&e);
        fail_all(
            batch.drain(..).filter_map(Reply::refusing).collect(),
            message,
        );
        false
    }

    /// The refusal of a fenced write whose turn another node has taken (see `begin_shared`).
    pub(in crate::engine::writer) fn refused_as_taken_over(
        &self,
        conversation: &str,
        request: &AppendRequest,
    ) -> Option<RpcError> {
        let f = request.fence?;
        let stale = self.cluster.stale.iter().any(|(k, fence)| {
            *fence == f.fence && k.turn == f.turn && k.conversation_id == conversation
        });
        stale.then(|| cluster::taken_over(conversation, f.turn))
    }

    /// On a shared store (unless every view was read from the log), whether an answer that
    /// writes nothing was decided on this node's view of a conversation
    /// whose head the batch did not read. What a batch writes is checked by the log's key at the
    /// commit; an answer that writes nothing (a refusal, a change already made) is not, and may
    /// be behind another node's commit: the batch then runs again on views read from the log
    /// before anything is answered.
    pub(in crate::engine::writer) fn answered_unverified(
        &self,
        touched: &[TouchedConversation],
        read_all: bool,
    ) -> bool {
        if !self.cluster.is_shared() || read_all {
            return false;
        }
        touched.iter().any(|t| {
            t.drafts.is_empty()
                && self
                    .cluster
                    .verified
                    .binary_search(&self.convs.slots[t.slot].num)
                    .is_err()
        })
    }

    /// Runs a job that does not join the batch it came in ([`SharedJob::runs_apart`]).
    pub(in crate::engine::writer) fn run_apart(&mut self, job: SharedJob) {
        match job {
            SharedJob::Forget { idle_ms, reply } => {
                let _ = reply.send(self.forget_idle(idle_ms));
            }
            SharedJob::Sweep { after, reply } => {
                let _ = reply.send(self.sweep(after));
            }
            SharedJob::TakeIn(read) => self.apply_read(read),
            SharedJob::Follow(ids) => self.follow(&ids),
            SharedJob::Load { .. } | SharedJob::Refresh(_) => {}
        }
    }

    /// The most jobs one batch takes: fewer on a shared store (see [`MAX_SHARED_BATCH`]).
    pub(in crate::engine::writer) fn max_batch(&self) -> usize {
        if self.cluster.is_shared() {
            MAX_SHARED_BATCH
        } else {
            MAX_BATCH
        }
    }
}
