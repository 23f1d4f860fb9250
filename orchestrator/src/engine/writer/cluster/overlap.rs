//! Two batches in flight, on a log that allows it ([`LogWriter::overlaps`]: PostgreSQL).
//!
//! A batch of plain appends ([`Writer::plain`]) is sent with its COMMIT and left in flight
//! ([`Pending`]): the writer decides the next batch meanwhile, on the state the first one left.
//! If that one is plain too, its writes are sent behind the first's COMMIT, on the same
//! connection, with its own COMMIT held back until the first has committed: it commits after
//! it or not at all. When the first fails, the second is rolled back, both states are put back
//! (the second's first: its undo is the state the first left), the first's jobs run again (or
//! are refused) and then the second's. Nothing is answered or published before the batch it
//! was decided on has committed; anything that is not a plain batch waits for the batch in
//! flight to settle first ([`Writer::settle`]).

use super::*;
use crate::engine::writer::decide::TouchedConversation;
use crate::engine::writer::pipeline::Committed;
use crate::engine::writer::rerun::{again_with, Retry};

/// A batch whose COMMIT is in flight.
pub(in crate::engine::writer) struct Pending {
    /// What is handed on once it has committed (the views as the batch left them, its
    /// answers).
    pub(in crate::engine::writer) committed: Committed,
    /// What it touched, to put back if it failed.
    pub(in crate::engine::writer) touched: Vec<TouchedConversation>,
    pub(in crate::engine::writer) slots_before: usize,
    /// Its jobs, to run again after a conflict.
    pub(in crate::engine::writer) again: Vec<Retry>,
    pub(in crate::engine::writer) jobs: u64,
    pub(in crate::engine::writer) rows: u64,
    /// The turns it claims for this node (see `Writer::claim_opened`).
    pub(in crate::engine::writer) opened: Vec<(Arc<ConvView>, u64)>,
    pub(in crate::engine::writer) sent: tokio::time::Instant,
    pub(in crate::engine::writer) started: std::time::Instant,
}

impl Writer {
    /// Whether `batch` may be decided while the batch before it is in flight: appends without
    /// a fence to conversations this node holds, that no other node wrote lately (their parents
    /// too), and notices of nothing past this node's view — a batch that reads nothing from the
    /// log before deciding and whose locks are taken with its commit — and no read for the
    /// reader thread to ask for (it reads past the views, which a failure could take back).
    /// Anything else waits for the batch in flight to settle.
    pub(in crate::engine::writer) fn plain(&self, batch: &[Job]) -> bool {
        if self
            .cluster
            .reader
            .as_ref()
            .is_some_and(cluster::Reader::would_ask)
        {
            return false;
        }
        let now = now_ms();
        let clear = |at: usize| {
            let s = &self.convs.slots[at];
            s.read_until_ms <= now && !s.behind()
        };
        batch.iter().all(|job| match job {
            Job::Append {
                conversation,
                request,
                ..
            } => {
                request.fence.is_none()
                    && self.convs.find(conversation).is_some_and(|at| {
                        clear(at)
                            && self.convs.slots[at].state.parent().is_none_or(|p| {
                                self.convs.find(&p.conversation_id).is_some_and(clear)
                            })
                    })
            }
            Job::Shared(SharedJob::Refresh(Some(heads))) => {
                heads
                    .iter()
                    .all(|&(num, head)| match self.convs.by_num.get(&num) {
                        Some(&at) => head <= self.convs.slots[at].state.core.head,
                        None => num > self.cluster.swept_until,
                    })
            }
            Job::CommitAnswered => true,
            _ => false,
        })
    }

    /// Waits for the batch in flight, if any, and hands it on (or, when it failed, puts its
    /// state back and runs its jobs again or refuses them).
    pub(in crate::engine::writer) fn settle(&mut self) {
        if let Some(p) = self.pending.take() {
            match self.outcome() {
                Ok(()) => self.committed_pending(p),
                Err(e) => self.failed_pending(p, e),
            }
        }
    }

    /// The log's word on the oldest batch in flight (the time waited for it counted as the
    /// commit's).
    pub(in crate::engine::writer) fn outcome(&mut self) -> Result<()> {
        let waiting = std::time::Instant::now();
        let out = self.log.outcome();
        self.stats
            .commit_ns
            .fetch_add(waiting.elapsed().as_nanos() as u64, Ordering::Relaxed);
        out
    }

    /// A batch in flight has committed: its claims are held and it is handed on.
    pub(in crate::engine::writer) fn committed_pending(&mut self, p: Pending) {
        self.hold_granted(&p.opened, p.sent);
        self.metrics
            .committed(p.jobs as usize, p.rows, p.started.elapsed());
        self.stats.batches.fetch_add(1, Ordering::Relaxed);
        self.stats.events.fetch_add(p.rows, Ordering::Relaxed);
        self.hand_on_committed(p.committed, p.jobs as usize);
    }

    /// A batch in flight failed (nothing of it was written; a batch decided after it has been
    /// put back already): its state is put back, and its jobs run again after a conflict, or
    /// are refused.
    pub(in crate::engine::writer) fn failed_pending(&mut self, p: Pending, e: Error) {
        let conflict = matches!(e, Error::Conflict(_) | Error::Deleted(_));
        self.roll_back(p.touched, p.slots_before, conflict);
        if let Error::Deleted(num) = e {
            self.let_go_of_deleted(num);
        }
        if !conflict {
            tracing::error!(error = %e, "commit failed; the batch is refused and the state rolled back");
            fail_all(p.committed.replies, cluster::failure_message(&e));
            return;
        }
        tracing::debug!(error = %e, "another node wrote first; the batch runs again");
        crate::engine::telemetry::conflict();
        self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
        let mut jobs = again_with(p.again, p.committed.replies);
        // Run here, ahead of the batch being decided (whose jobs came later): what that one was
        // told it put off stays its own.
        let put_off = std::mem::take(&mut self.cluster.put_off);
        self.attempts(&mut jobs, 2);
        self.cluster.put_off = put_off;
    }
}
