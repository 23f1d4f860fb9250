//! One batch through the writer: each job applied to the state machine (creations, appends,
//! the parent's side of a sub-conversation), one transaction for all of it, then the batch
//! handed on to be synced and published; on a failed commit, every touched state rolled back.

use super::*;

/// What one batch does, as the writer goes through its jobs: the conversations it touches (in
/// order of first touch, with their state before the batch and the events they append), the
/// conversations it creates, and the answers it owes.
struct BatchWork {
    touched: Vec<TouchedConversation>,
    new_convs: Vec<NewConversation>,
    replies: Vec<Reply>,
}

/// A conversation touched by a batch: the events the batch appends to it, and its state before
/// the batch (to roll back to if the commit fails).
pub(super) struct TouchedConversation {
    slot: usize,
    drafts: Vec<Draft>,
    undo: Undo,
}

/// Marks `slot` touched by the batch (remembering its state before it); its entry in `touched`.
fn touch(slots: &mut [Slot], slot: usize, touched: &mut Vec<TouchedConversation>) -> usize {
    let s = &mut slots[slot];
    if s.mark == 0 {
        touched.push(TouchedConversation {
            slot,
            drafts: Vec::new(),
            undo: Undo::TurnState(s.state.core.clone()),
        });
        s.mark = touched.len();
    }
    s.mark - 1
}

pub(super) enum Undo {
    Created,
    TurnState(TurnState),
}

/// Appends one request to a conversation within the batch. When it closes a sub-conversation,
/// the parent's `subconversation_finished` (with the child's result) joins the same batch, so
/// the tree is never seen half-finished, whatever moment the process stops.
fn append_one(
    convs: &mut Convs,
    conversation: &str,
    request: AppendRequest,
    touched: &mut Vec<TouchedConversation>,
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
    convs.settle(at);
    let slot = &convs.slots[at];
    let drafts = &touched[i].drafts;
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

/// The events of a fork: the prefix copied as it was (seq, kind, author, turn, finality,
/// payload; idempotency keys are not carried over), then `forked_from`.
fn fork_drafts(state: &mut ConvMachine, f: ForkFrom) -> Vec<Draft> {
    let at_seq = f.events.last().map_or(0, |e| e.seq);
    let mut drafts = Vec::with_capacity(f.events.len() + 1);
    for e in f.events {
        let d = Draft::of_event(e);
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

/// What a job asks, without its answer's channel (which stays in the batch's replies): what
/// runs again after a conflict.
pub(super) enum Retry {
    Append(String, Box<AppendRequest>),
    Create(Box<CreateJob>),
    Load(String),
}

impl Retry {
    fn of(job: &Job) -> Option<Retry> {
        match job {
            Job::Append {
                conversation,
                request,
                ..
            } => Some(Retry::Append(conversation.clone(), request.clone())),
            Job::Create { conv, .. } => Some(Retry::Create(conv.clone())),
            Job::Load { id, .. } => Some(Retry::Load(id.clone())),
            Job::Refresh(_)
            | Job::TakeIn(_)
            | Job::Follow(_)
            | Job::Forget { .. }
            | Job::Sweep { .. }
            | Job::CommitAnswered
            | Job::Stop => None,
        }
    }
}

/// The jobs of a batch to run again: each request with the reply it owes (the replies are in
/// job order, one per job that [`Retry::of`] kept).
pub(super) fn again_with(again: Vec<Retry>, replies: Vec<Reply>) -> Vec<Job> {
    let mut jobs = Vec::with_capacity(again.len());
    let mut unmatched = Vec::new();
    for (a, r) in again.into_iter().zip(replies) {
        match (a, r) {
            (Retry::Append(conversation, request), Reply::Append(reply, _)) => {
                jobs.push(Job::Append {
                    conversation,
                    request,
                    reply,
                })
            }
            (Retry::Create(conv), Reply::Create(reply, _)) => {
                jobs.push(Job::Create { conv, reply })
            }
            (Retry::Load(id), Reply::Create(reply, _)) => jobs.push(Job::Load { id, reply }),
            (_, r) => unmatched.push(r),
        }
    }
    fail_all(unmatched, "internal error: a batch could not be run again");
    jobs
}

impl Writer {
    /// Checks a new sub-conversation against its parent (open, depth, fan-out) and appends the
    /// parent's `subconversation_started` to the batch; the child's depth.
    fn start_child(
        &mut self,
        child: &str,
        by: &str,
        c: &ChildOf,
        touched: &mut Vec<TouchedConversation>,
    ) -> Result<u32, RpcError> {
        let Some(parent) = self.convs.get(c.parent.as_str()) else {
            return Err(RpcError::new(
                ErrorCode::ConversationNotFound,
                format!("no conversation {}", c.parent),
            ));
        };
        let depth = parent
            .state
            .admit_child(&c.parent, c.max_depth, c.max_children)?;
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

    pub(super) fn process(&mut self, batch: &mut Vec<Job>) {
        if self.stopped.load(Ordering::Acquire) {
            self.settle();
            answer(batch.drain(..).filter_map(Reply::refusing).collect());
            return;
        }
        if batch.iter().any(|j| {
            matches!(
                j,
                Job::Forget { .. } | Job::Sweep { .. } | Job::TakeIn(_) | Job::Follow(_)
            )
        }) {
            // Before any slot is looked up for the batch (forgetting moves slots).
            self.settle();
            let jobs = std::mem::take(batch);
            for job in jobs {
                match job {
                    Job::Forget { idle_ms, reply } => {
                        let _ = reply.send(self.forget_idle(idle_ms));
                    }
                    Job::Sweep { after, reply } => {
                        let _ = reply.send(self.sweep(after));
                    }
                    Job::TakeIn(read) => self.apply_read(read),
                    Job::Follow(ids) => self.follow(&ids),
                    other => batch.push(other),
                }
            }
        }
        self.attempts(batch, 1);
    }

    /// Runs `batch` until it is done, at most [`shared::MAX_ATTEMPTS`] times counting from
    /// `attempt` (from the second on, every conversation is caught up on from the log first).
    pub(super) fn attempts(&mut self, batch: &mut Vec<Job>, mut attempt: usize) {
        let began = std::time::Instant::now();
        loop {
            let Some((again, replies, conflict)) = self.process_once(batch, attempt > 1) else {
                break;
            };
            if conflict {
                crate::engine::telemetry::conflict();
                self.stats.conflicts.fetch_add(1, Ordering::Relaxed);
            } else {
                self.stats.rechecks.fetch_add(1, Ordering::Relaxed);
            }
            if attempt == shared::MAX_ATTEMPTS {
                tracing::warn!(
                    attempts = attempt,
                    "other nodes kept getting ahead of a batch; refused"
                );
                fail_all(replies, crate::engine::error::UNAVAILABLE);
                break;
            }
            attempt += 1;
            batch.extend(again_with(again, replies));
        }
        self.stats
            .busy_ns
            .fetch_add(began.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    /// Runs the batch once (catching up on every conversation from the log first when
    /// `read_all`). When it must run again, nothing of it was written and the state is rolled
    /// back: answers what each job it ran asks, the batch's unanswered replies, in job order,
    /// and whether that is because of a conflict (another node appended first) rather than an
    /// answer that must be decided on a view read from the log.
    #[allow(clippy::too_many_lines)] // longer than the house's 100 lines; to be split
    fn process_once(
        &mut self,
        batch: &mut Vec<Job>,
        read_all: bool,
    ) -> Option<(Vec<Retry>, Vec<Reply>, bool)> {
        // Decided while the batch before commits, or once it has settled (see `overlap`).
        let overlap =
            self.shared && self.busy && !read_all && self.log.overlaps() && self.plain(batch);
        if !overlap {
            self.settle();
        }
        if self.shared {
            // The conversations are locked, and those other nodes wrote lately caught up on,
            // before anything is decided (see `shared`).
            let locking = std::time::Instant::now();
            let locked = self.begin_shared(batch, read_all);
            self.stats
                .lock_ns
                .fetch_add(locking.elapsed().as_nanos() as u64, Ordering::Relaxed);
            if let Err(e) = locked {
                tracing::warn!(error = %e, "a batch could not lock its conversations; refused");
                let message = shared::failure_message(&e);
                let replies = batch.drain(..).filter_map(Reply::refusing).collect();
                fail_all(replies, message);
                return None;
            }
        }
        // The batch in flight this one is decided on, if any.
        let mut prior = self.pending.take();
        // On a shared store, what each job asks, to run the batch again if another node gets
        // ahead of it (once the jobs put off for the next batch have left it).
        let again: Vec<Retry> = match self.shared {
            true => batch.iter().filter_map(Retry::of).collect(),
            false => Vec::new(),
        };
        let ts_ms = now_ms();
        let slots_before = self.convs.slots.len();
        let mut work = BatchWork {
            touched: Vec::with_capacity(batch.len()),
            new_convs: Vec::new(),
            replies: Vec::with_capacity(batch.len()),
        };
        let jobs = batch.len() as u64;
        // A refusal decided on a view nothing verifies (no lock, no write)?
        let mut unverified = false;
        for job in batch.drain(..) {
            match job {
                Job::Stop
                | Job::CommitAnswered
                | Job::Refresh(_)
                | Job::TakeIn(_)
                | Job::Follow(_)
                | Job::Forget { .. }
                | Job::Sweep { .. } => {}
                // Loaded before the batch (`begin_shared`); answered after what was loaded is
                // published.
                Job::Load { reply, .. } => work.replies.push(Reply::Create(reply, Ok(()))),
                Job::Create { conv, reply } => {
                    let created = self.create_one(*conv, &mut work);
                    unverified |= created.is_err();
                    work.replies.push(Reply::Create(reply, created));
                }
                Job::Append {
                    conversation,
                    request,
                    reply,
                } => {
                    let stale = request.fence.is_some_and(|f| {
                        self.stale.iter().any(|(k, fence)| {
                            *fence == f.fence
                                && k.turn == f.turn
                                && k.conversation_id == conversation
                        })
                    });
                    let result = if stale {
                        let turn = request.fence.map_or(0, |f| f.turn);
                        Err(shared::taken_over(&conversation, turn))
                    } else {
                        append_one(&mut self.convs, &conversation, *request, &mut work.touched)
                    };
                    work.replies.push(Reply::Append(reply, result));
                }
            }
        }
        self.stats.jobs.fetch_add(jobs, Ordering::Relaxed);
        self.stats.most_jobs.fetch_max(jobs, Ordering::Relaxed);
        for t in &work.touched {
            self.convs.slots[t.slot].mark = 0;
        }
        if self.shared && !read_all {
            // What a batch writes is checked by the log's key at the commit; an answer that
            // writes nothing (a refusal, a change already made) is not: decided on this node's
            // view of a conversation whose head it did not read, it may be behind another
            // node's commit. The batch runs again on views read from the log before anything
            // is answered.
            let verified = &self.verified;
            unverified |= work.touched.iter().any(|t| {
                t.drafts.is_empty()
                    && verified
                        .binary_search(&self.convs.slots[t.slot].num)
                        .is_err()
            });
        }
        let writes = work.touched.iter().any(|t| !t.drafts.is_empty());
        if unverified || !writes {
            // Nothing of this batch is sent: the one it was decided on must have committed
            // before it answers anything (or runs again).
            if let Some(p) = prior.take() {
                match self.outcome() {
                    Ok(()) => self.committed_pending(p),
                    Err(e) => {
                        self.roll_back(work.touched, slots_before, false);
                        self.failed_pending(p, e);
                        return Some((again, work.replies, false));
                    }
                }
            }
        }
        if self.shared && !read_all && unverified {
            if let Err(e) = self.log.release() {
                tracing::warn!(error = %e, "ending a batch that wrote nothing failed");
            }
            self.roll_back(work.touched, slots_before, false);
            return Some((again, work.replies, false));
        }
        // A conversation whose appends were all refused is as it was.
        work.touched.retain(|t| !t.drafts.is_empty());
        let opened = self.claim_opened(&work.touched);
        if work.touched.is_empty() {
            if let Err(e) = self.log.release() {
                tracing::warn!(error = %e, "ending a batch that wrote nothing failed");
            }
            if self.shared {
                // Answered after what this batch caught up on is published.
                let nothing = Committed {
                    ts_ms,
                    convs: Vec::new(),
                    replies: work.replies,
                };
                self.hand_on_committed(nothing, 0);
            } else {
                answer(work.replies);
            }
            return None;
        }
        let slots = &self.convs.slots;
        let rows: Vec<NewRow<'_>> = work
            .touched
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
        let sent = tokio::time::Instant::now();
        if overlap {
            // Left in flight; behind a batch in flight, committed only once that one has.
            let staged = self.log.send(&work.new_convs, &rows, prior.is_none());
            drop(rows);
            let failed = match (staged, prior) {
                (Err(e), prior) => {
                    tracing::warn!(error = %e, "a batch could not be sent; it runs again");
                    self.roll_back(work.touched, slots_before, false);
                    // The batch before it, settled as any other.
                    self.pending = prior;
                    self.settle();
                    return Some((again, work.replies, false));
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
                self.roll_back(work.touched, slots_before, false);
                match prior {
                    Some(p) => self.failed_pending(p, e),
                    None => {
                        tracing::warn!(error = %e, "a batch could not be committed; it runs again")
                    }
                }
                return Some((again, work.replies, false));
            }
            let committed = self.committed_of(ts_ms, &mut work);
            self.pending = Some(overlap::Pending {
                committed,
                touched: work.touched,
                slots_before,
                again,
                jobs,
                rows: n_rows,
                opened,
                sent,
                started,
            });
            return None;
        }
        debug_assert!(prior.is_none(), "a batch in flight left unsettled");
        let committed = self.log.commit(&work.new_convs, &rows);
        self.stats
            .commit_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        drop(rows);
        match committed {
            Ok(()) => {
                self.hold_granted(&opened, sent);
                self.metrics
                    .committed(jobs as usize, n_rows, started.elapsed());
                self.stats.batches.fetch_add(1, Ordering::Relaxed);
                self.stats.events.fetch_add(n_rows, Ordering::Relaxed);
                self.hand_on(ts_ms, jobs as usize, work);
                None
            }
            Err(e) => {
                let conflict = matches!(e, Error::Conflict(_));
                if conflict {
                    tracing::debug!(error = %e, "another node wrote first; the batch runs again");
                } else {
                    tracing::error!(error = %e, "commit failed; the batch is refused and the state rolled back");
                }
                self.roll_back(work.touched, slots_before, conflict);
                if conflict {
                    return Some((again, work.replies, true));
                }
                fail_all(work.replies, shared::failure_message(&e));
                None
            }
        }
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
        let read_until = now_ms() + shared::CONTENDED.as_millis() as i64;
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

    /// Applies one creation to the batch: the new conversation's state and events (and, for a
    /// sub-conversation, its parent's `subconversation_started`), or the refusal.
    fn create_one(&mut self, c: CreateJob, work: &mut BatchWork) -> Result<(), RpcError> {
        let CreateJob {
            id,
            participants,
            metadata,
            created_by,
            policy,
            fork,
            child_of,
        } = c;
        if self.convs.find(&id).is_some() {
            return Err(RpcError::new(
                ErrorCode::ConversationExists,
                format!("conversation {id} exists already"),
            ));
        }
        // The tree a sub-conversation joins: its parent's, or the parent's own when that is a
        // top-level conversation (an unknown parent is refused by `start_child`).
        let root = child_of.as_ref().and_then(|c| {
            let parent = self.convs.get(&c.parent)?;
            Some(parent.tree().unwrap_or(&c.parent).to_string())
        });
        self.convs
            .open
            .admit(self.caps, &created_by, root.as_deref())?;
        // A sub-conversation: checked against its parent, which logs its start in this
        // transaction (or the creation is refused and nothing is written).
        let link = match &child_of {
            Some(c) => Some(ParentLink {
                conversation_id: c.parent.clone(),
                depth: self.start_child(&id, &created_by, c, &mut work.touched)?,
                root,
            }),
            None => None,
        };
        let num = self.log.conversation_num().map_err(|e| e.to_rpc())?;
        let mut state = ConvMachine::new(id.clone(), participants.clone());
        let drafts = match fork {
            None => {
                let created = Created {
                    parent: link,
                    ..ConvMachine::created(
                        &participants,
                        metadata.as_ref(),
                        &created_by,
                        policy.as_ref(),
                    )
                };
                let created = AppendRequest::system(&SystemEvent::Created(created))
                    .with_opening(&created_by, child_of.and_then(|c| c.input));
                match state.apply(created) {
                    Ok(Applied::Append(d, _)) => d,
                    _ => Vec::new(),
                }
            }
            Some(f) => fork_drafts(&mut state, f),
        };
        let declared = state
            .policy()
            .map(|p| p.agents.keys().cloned().collect())
            .unwrap_or_default();
        work.new_convs.push(NewConversation {
            id: id.clone(),
            num,
            participants,
            created_by: created_by.clone(),
            metadata,
            declared,
        });
        let empty = ConvMachine::new(id.clone(), Vec::new()).core;
        let shared = Hub::make(&id, state.participants().to_vec(), empty);
        share_links(&state, &shared);
        let mut slot = Slot::new(num, state, shared, created_by);
        slot.mark = work.touched.len() + 1;
        let slot = self.convs.insert(&id, slot);
        work.touched.push(TouchedConversation {
            slot,
            drafts,
            undo: Undo::Created,
        });
        Ok(())
    }

    /// Hands a committed batch on to be synced and published. A small batch with nothing ahead
    /// of it in the pipeline is synced and published here, saving two thread hops on the path
    /// of a lone turn; larger ones go down the pipeline, so that syncing and publishing overlap
    /// the next commit. Commit order holds either way: the pipeline is empty when this thread
    /// publishes.
    fn hand_on(&mut self, ts_ms: i64, jobs: usize, mut work: BatchWork) {
        let committed = self.committed_of(ts_ms, &mut work);
        self.hand_on_committed(committed, jobs);
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
        }
    }

    /// Publishes a committed batch of `jobs` jobs here when it is small and nothing is ahead
    /// of it, else queues it for the sync and publisher threads (see [`Writer::hand_on`]).
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
