//! One batch through the writer: each job applied to the state machine (creations, appends,
//! the parent's side of a sub-conversation), one transaction for all of it, then the batch
//! handed on to be synced and published; on a failed commit, every touched state rolled back.

use super::*;

use super::decide::{append_one, BatchWork, TouchedConversation, Undo};
use super::rerun::{again_with, BatchEnd, Decided, Retry, RunAgain, Why};

impl Writer {
    pub(super) fn process(&mut self, batch: &mut Vec<Job>) {
        if self.stopped.load(Ordering::Acquire) {
            self.settle();
            answer(batch.drain(..).filter_map(Reply::refusing).collect());
            return;
        }
        if batch.iter().any(Job::runs_apart) {
            // Before any slot is looked up for the batch (forgetting moves slots).
            self.settle();
            let jobs = std::mem::take(batch);
            let mut deletions = Vec::new();
            for job in jobs {
                match job {
                    Job::Shared(job) if job.runs_apart() => self.run_apart(job),
                    Job::Delete { keys, reply } => deletions.push((keys, reply)),
                    other => batch.push(other),
                }
            }
            if !deletions.is_empty() {
                self.delete(deletions);
            }
        }
        self.attempts(batch, 1);
    }

    /// Runs `batch` until it is done, at most [`cluster::MAX_ATTEMPTS`] times counting from
    /// `attempt` (from the second on, every conversation is caught up on from the log first).
    pub(super) fn attempts(&mut self, batch: &mut Vec<Job>, mut attempt: usize) {
        let began = std::time::Instant::now();
        while let BatchEnd::RunAgain(again) = self.process_once(batch, attempt > 1) {
            match again.why {
                Why::Conflict => {
                    crate::engine::telemetry::conflict();
                    self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
                }
                Why::Recheck => {
                    self.stats.rechecks.fetch_add(1, Ordering::Relaxed);
                }
            }
            if attempt == cluster::MAX_ATTEMPTS {
                tracing::warn!(
                    attempts = attempt,
                    "other nodes kept getting ahead of a batch; refused"
                );
                fail_all(again.replies, crate::engine::error::UNAVAILABLE);
                break;
            }
            attempt += 1;
            batch.extend(again_with(again.retry, again.replies));
        }
        self.stats
            .busy_ns
            .fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Runs the batch once (catching up on every conversation from the log first when
    /// `read_all`): locked and caught up on a shared store, decided, then committed (or, on
    /// a log that overlaps batches, left in flight).
    fn process_once(&mut self, batch: &mut Vec<Job>, read_all: bool) -> BatchEnd {
        // Decided while the batch before commits, or once it has settled (see `overlap`).
        let overlap = self.cluster.is_shared()
            && self.busy
            && !read_all
            && self.log.overlaps()
            && self.plain(batch);
        if !overlap {
            self.settle();
        }
        if !self.lock_batch(batch, read_all) {
            return BatchEnd::Done;
        }
        // The batch in flight this one is decided on, if any.
        let mut prior = self.pending.take();
        let mut decided = self.decide(batch, read_all);
        let writes = decided.work.touched.iter().any(|t| !t.drafts.is_empty());
        if decided.unverified || !writes {
            // Nothing of this batch is sent: the one it was decided on must have committed
            // before it answers anything (or runs again).
            if let Some(p) = prior.take() {
                if let Err(e) = self.outcome() {
                    let again = self.rolled_back(decided, Why::Recheck);
                    self.failed_pending(p, e);
                    return BatchEnd::RunAgain(again);
                }
                self.committed_pending(p);
            }
        }
        if self.cluster.is_shared() && !read_all && decided.unverified {
            self.release_unwritten();
            return BatchEnd::RunAgain(self.rolled_back(decided, Why::Recheck));
        }
        // A conversation whose appends were all refused is as it was.
        decided.work.touched.retain(|t| !t.drafts.is_empty());
        if decided.work.touched.is_empty() {
            self.release_unwritten();
            self.answer_unwritten(decided);
            return BatchEnd::Done;
        }
        let opened = self.claim_opened(&decided.work.touched);
        if overlap {
            return self.send_in_flight(decided, prior, opened);
        }
        debug_assert!(prior.is_none(), "a batch in flight left unsettled");
        self.commit_batch(decided, &opened)
    }

    /// Applies each job of the batch to the state: what it writes, what it answers, and
    /// whether an answer was decided on a view nothing verified (a shared store).
    fn decide(&mut self, batch: &mut Vec<Job>, read_all: bool) -> Decided {
        // On a shared store, what each job asks, to run the batch again if another node gets
        // ahead of it (once the jobs put off for the next batch have left it).
        let retry: Vec<Retry> = match self.cluster.is_shared() {
            true => batch.iter().filter_map(Retry::of).collect(),
            false => Vec::new(),
        };
        let mut d = Decided {
            work: BatchWork {
                touched: Vec::with_capacity(batch.len()),
                new_convs: Vec::new(),
                replies: Vec::with_capacity(batch.len()),
            },
            retry,
            slots_before: self.convs.slots.len(),
            ts_ms: now_ms(),
            jobs: batch.len() as u64,
            unverified: false,
        };
        for job in batch.drain(..) {
            match job {
                // Loaded before the batch (`begin_shared`); answered after what was loaded is
                // published.
                Job::Shared(SharedJob::Load { reply, .. }) => {
                    d.work.replies.push(Reply::Create(reply, Ok(())));
                }
                Job::Create { conv, reply } => {
                    let created = self.create_one(*conv, &mut d.work);
                    // A refusal decided on a view nothing verifies (no lock, no write)?
                    d.unverified |= created.is_err();
                    d.work.replies.push(Reply::Create(reply, created));
                }
                Job::Append {
                    conversation,
                    request,
                    reply,
                } => {
                    let result = match self.refused_as_taken_over(&conversation, &request) {
                        Some(refused) => Err(refused),
                        None => append_one(
                            &mut self.convs,
                            &conversation,
                            *request,
                            &mut d.work.touched,
                        ),
                    };
                    d.work.replies.push(Reply::Append(reply, result));
                }
                // Done before the batch (`process`), or nothing to decide.
                Job::Stop | Job::CommitAnswered | Job::Shared(_) | Job::Delete { .. } => {}
            }
        }
        self.stats.jobs.fetch_add(d.jobs, Ordering::Relaxed);
        self.stats.most_jobs.fetch_max(d.jobs, Ordering::Relaxed);
        for t in &d.work.touched {
            self.convs.slots[t.slot].mark = 0;
        }
        d.unverified |= self.answered_unverified(&d.work.touched, read_all);
        d
    }

    /// Ends the transaction of a batch that writes nothing.
    fn release_unwritten(&mut self) {
        if let Err(e) = self.log.release() {
            tracing::warn!(error = %e, "ending a batch that wrote nothing failed");
        }
    }

    /// Answers a batch that writes nothing: at once, or on a shared store after what it caught
    /// up on is published.
    fn answer_unwritten(&mut self, d: Decided) {
        if self.cluster.is_shared() {
            let nothing = Committed {
                ts_ms: d.ts_ms,
                convs: Vec::new(),
                replies: d.work.replies,
                gone: Vec::new(),
            };
            self.hand_on_committed(nothing, 0);
        } else {
            answer(d.work.replies);
        }
    }

    /// Puts back the state a batch changed; what it owes, to run again.
    fn rolled_back(&mut self, d: Decided, why: Why) -> RunAgain {
        self.roll_back(d.work.touched, d.slots_before, why == Why::Conflict);
        RunAgain {
            retry: d.retry,
            replies: d.work.replies,
            why,
        }
    }

    /// Commits the batch and hands it on; on a conflict it runs again, on another failure every
    /// job is refused.
    fn commit_batch(&mut self, mut d: Decided, opened: &[(Arc<ConvView>, u64)]) -> BatchEnd {
        let started = std::time::Instant::now();
        let sent = tokio::time::Instant::now();
        let rows = self.rows_of(&d);
        let n_rows = rows.len() as u64;
        let committed = self.log.commit(&d.work.new_convs, &rows);
        self.stats
            .commit_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        drop(rows);
        match committed {
            Ok(()) => {
                self.hold_granted(opened, sent);
                self.count_stored(&d);
                self.metrics
                    .committed(d.jobs as usize, n_rows, started.elapsed());
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.stats.events.fetch_add(n_rows, Ordering::Relaxed);
                let committed = self.committed_of(d.ts_ms, &mut d.work);
                self.hand_on_committed(committed, d.jobs as usize);
                BatchEnd::Done
            }
            Err(Error::Conflict(e)) => {
                tracing::debug!(error = %e, "another node wrote first; the batch runs again");
                BatchEnd::RunAgain(self.rolled_back(d, Why::Conflict))
            }
            Err(Error::Deleted(num)) => {
                let again = self.rolled_back(d, Why::Recheck);
                self.let_go_of_deleted(num);
                BatchEnd::RunAgain(again)
            }
            Err(e) => {
                tracing::error!(error = %e, "commit failed; the batch is refused and the state rolled back");
                let again = self.rolled_back(d, Why::Recheck);
                fail_all(again.replies, cluster::failure_message(&e));
                BatchEnd::Done
            }
        }
    }

    /// Adds what a committed batch stored to its tenants' stored bytes, when some tenant has a
    /// quota of them.
    fn count_stored(&self, d: &Decided) {
        let Some(quotas) = self.caps.tenants.as_ref().filter(|q| q.meters_stored()) else {
            return;
        };
        for t in &d.work.touched {
            let bytes: usize = t.drafts.iter().map(|d| d.payload.get().len()).sum();
            let id = &self.convs.slots[t.slot].state.id;
            quotas.stored(proto_spec::tenant::tenant_of(id), bytes as u64);
        }
    }

    /// The rows a decided batch inserts, in order.
    fn rows_of<'a>(&self, d: &'a Decided) -> Vec<NewRow<'a>> {
        let slots = &self.convs.slots;
        let ts_ms = d.ts_ms;
        d.work
            .touched
            .iter()
            .flat_map(|t| {
                let conv = slots[t.slot].num;
                t.drafts
                    .iter()
                    .map(move |draft| NewRow { conv, draft, ts_ms })
            })
            .collect()
    }

    /// Sends the batch with its commit and leaves it in flight (see `overlap`): behind the
    /// batch in flight, if any, it commits only once that one has.
    fn send_in_flight(
        &mut self,
        mut d: Decided,
        prior: Option<cluster::overlap::Pending>,
        opened: Vec<(Arc<ConvView>, u64)>,
    ) -> BatchEnd {
        let started = std::time::Instant::now();
        let sent = tokio::time::Instant::now();
        let rows = self.rows_of(&d);
        let n_rows = rows.len() as u64;
        let staged = self.log.send(&d.work.new_convs, &rows, prior.is_none());
        drop(rows);
        let failed = match (staged, prior) {
            (Err(e), prior) => {
                tracing::warn!(error = %e, "a batch could not be sent; it runs again");
                let again = self.rolled_back(d, Why::Recheck);
                // The batch before it, settled as any other.
                self.pending = prior;
                self.settle();
                return BatchEnd::RunAgain(again);
            }
            (Ok(()), None) => None,
            (Ok(()), Some(p)) => {
                self.stats.overlapped.fetch_add(1, Ordering::Relaxed);
                match self.outcome() {
                    Ok(()) => {
                        let committing = self.log.send_commit();
                        self.committed_pending(p);
                        committing.err().map(|e| (e, None))
                    }
                    Err(e) => Some((e, Some(p))),
                }
            }
        };
        if let Some((e, prior)) = failed {
            // This batch's writes are rolled back, and its state put back before the state
            // of the batch it was decided on.
            self.log.abandon();
            let again = self.rolled_back(d, Why::Recheck);
            match prior {
                Some(p) => self.failed_pending(p, e),
                None => {
                    tracing::warn!(error = %e, "a batch could not be committed; it runs again");
                    if let Error::Deleted(num) = e {
                        self.let_go_of_deleted(num);
                    }
                }
            }
            return BatchEnd::RunAgain(again);
        }
        let committed = self.committed_of(d.ts_ms, &mut d.work);
        self.pending = Some(cluster::overlap::Pending {
            committed,
            touched: d.work.touched,
            slots_before: d.slots_before,
            again: d.retry,
            jobs: d.jobs,
            rows: n_rows,
            opened,
            sent,
            started,
        });
        BatchEnd::Done
    }

    /// On a cluster: the turns `touched` opens (their conversation was in another turn before
    /// the batch, or is new) for an agent this node runs, asked to be claimed for this node by
    /// the batch's commit (see [`crate::engine::hub::PreClaim`]); each with its view.
    fn claim_opened(&mut self, touched: &[TouchedConversation]) -> Vec<(Arc<ConvView>, u64)> {
        let Some(hook) = self.hub.pre_claim() else {
            return Vec::new();
        };
        let mut opened = Vec::new();
        let mut keys = Vec::new();
        for t in touched {
            let slot = &self.convs.slots[t.slot];
            let Some((agent, turn)) = slot.state.core.turn_to_hand_out() else {
                continue;
            };
            let before = match &t.undo {
                Undo::TurnState(core) => Some(core.turn),
                Undo::Created => None,
            };
            if before == Some(turn) || !hook.runs_here(&slot.shared, agent) {
                continue;
            }
            keys.push(crate::engine::store::TurnKey {
                conversation_id: slot.state.id.clone(),
                turn,
            });
            opened.push((slot.shared.clone(), turn));
        }
        if !keys.is_empty() {
            self.log
                .claim_with_commit(&hook.holder(), keys, crate::engine::turns::cluster::LEASE);
        }
        opened
    }

    /// After a commit: holds the claims it made for the turns it `opened` (before the commit
    /// is published, so that the runs find them).
    pub(super) fn hold_granted(
        &mut self,
        opened: &[(Arc<ConvView>, u64)],
        sent: tokio::time::Instant,
    ) {
        if opened.is_empty() {
            return;
        }
        let granted = self.log.granted();
        let Some(hook) = self.hub.pre_claim() else {
            return;
        };
        for (key, fence) in granted {
            let view = opened
                .iter()
                .find(|(v, turn)| *turn == key.turn && v.id == key.conversation_id);
            if let Some((view, _)) = view {
                hook.granted(view, key.turn, fence, sent);
            }
        }
    }

    /// Puts every conversation a batch touched back as it was before it, and forgets those it
    /// created; `contended`: another node wrote one of them first, so their heads are read
    /// before deciding for a while.
    pub(super) fn roll_back(
        &mut self,
        touched: Vec<TouchedConversation>,
        slots_before: usize,
        contended: bool,
    ) {
        let read_until = now_ms() + cluster::CONTENDED.as_millis() as i64;
        for t in touched {
            if let Undo::TurnState(core) = t.undo {
                let slot = &mut self.convs.slots[t.slot];
                let first_new = core.head + 1;
                slot.state.core = core;
                slot.state.forget_keys_from(first_new);
                if contended {
                    slot.read_until_ms = read_until;
                }
                self.convs.settle(t.slot);
            }
        }
        self.convs.truncate(slots_before);
    }

    /// What is handed on of a batch once it has committed: its events, the views as it leaves
    /// them, its answers (taken out of `work`, which keeps what rolls it back).
    fn committed_of(&self, ts_ms: i64, work: &mut BatchWork) -> Committed {
        let mut convs = Vec::with_capacity(work.touched.len());
        for t in &mut work.touched {
            let slot = &self.convs.slots[t.slot];
            let new = matches!(t.undo, Undo::Created);
            convs.push(CommittedConv {
                shared: slot.shared.clone(),
                core: slot.state.core.clone(),
                drafts: std::mem::take(&mut t.drafts),
                new,
                heads_only: None,
            });
        }
        Committed {
            ts_ms,
            convs,
            replies: std::mem::take(&mut work.replies),
            gone: Vec::new(),
        }
    }

    /// Hands a committed batch of `jobs` jobs on to be synced and published. A small batch with
    /// nothing ahead of it in the pipeline is synced and published here, saving two thread hops
    /// on the path of a lone turn; larger ones go down the pipeline, so that syncing and
    /// publishing overlap the next commit. Commit order holds either way: the pipeline is empty
    /// when this thread publishes.
    pub(super) fn hand_on_committed(&mut self, committed: Committed, jobs: usize) {
        if jobs <= INLINE_PUBLISH && self.queued.load(Ordering::Acquire) == 0 {
            if sync(&self.durability, &self.stopped) {
                publish(&self.hub, committed);
            } else {
                fail_all(committed.replies, LOG_STOPPED);
            }
        } else {
            self.queued.fetch_add(1, Ordering::AcqRel);
            self.syncer.push(committed);
        }
    }
}
