//! The writer on a log that other nodes write too (PostgreSQL).
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
//! so ([`Job::Refresh`], from the store's notifications and its polling), so that readers and
//! subscribers here see them; those are published in the log's order, through the same
//! pipeline as this node's own batches.

use super::*;
use crate::engine::store::{ConversationRecord, RecoveredEvent};

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

/// The writer's reader on a shared store: a thread with a connection of its own that reads
/// what other nodes committed past this node's views of conversations a batch does not write,
/// one read at a time, and hands it back to the writer as a job ([`Job::TakeIn`]). The writer
/// would otherwise read it in each batch's transaction, before the batch's own commit: with
/// three nodes, two thirds of the cluster's writes read back on every writer's path.
#[derive(Debug)]
pub(super) struct Reader {
    asks: std::sync::mpsc::Sender<Vec<(i64, u64)>>,
    /// Whether a read was asked for and its job has not come back yet.
    in_flight: bool,
    /// The conversations heard of while a read was in flight: the next read's.
    pending: Vec<i64>,
}

impl Reader {
    /// Whether the next batch would ask for a read (from the writer's views, which must then
    /// be the log's: see [`Writer::plain`]).
    pub(super) fn would_ask(&self) -> bool {
        !self.in_flight && !self.pending.is_empty()
    }
}

impl Reader {
    /// Starts the thread, reading on `log`'s connection and queueing what it reads on `jobs`;
    /// it ends with the writer (when the writer's end of its requests is dropped).
    pub(super) fn start(
        mut log: Box<dyn LogWriter>,
        jobs: mpsc::Sender<Job>,
    ) -> std::io::Result<Reader> {
        let (asks, asked) = std::sync::mpsc::channel::<Vec<(i64, u64)>>();
        std::thread::Builder::new()
            .name("log-reader".into())
            .spawn(move || {
                while let Ok(from) = asked.recv() {
                    let read = log.read_many(&from).map_err(|e| {
                        tracing::warn!(error = %e, conversations = from.len(), "could not read what other nodes committed; asked again at the next batch");
                        from.iter().map(|f| f.0).collect()
                    });
                    if jobs.blocking_send(Job::TakeIn(read)).is_err() {
                        return;
                    }
                }
            })?;
        Ok(Reader {
            asks,
            in_flight: false,
            pending: Vec::new(),
        })
    }
}

impl Slot {
    /// Whether another node committed past the writer's state of it, as far as notices said
    /// (a view nothing here follows is left behind: [`Writer::take_in_notices`]).
    pub(super) fn behind(&self) -> bool {
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
    /// The most jobs one batch takes: fewer on a shared store (see [`MAX_SHARED_BATCH`]).
    pub(super) fn max_batch(&self) -> usize {
        if self.shared {
            MAX_SHARED_BATCH
        } else {
            MAX_BATCH
        }
    }

    /// Loads the conversations `batch` may touch that this node does not know yet (created by
    /// another node) and the ids it would create that another node has taken meanwhile (so that
    /// the creation is refused); locks its conversations, the ids it would create and the
    /// claims of its fenced writes; catches up on the conversations another node wrote lately
    /// (on every one when `read_all`).
    ///
    /// A conversation another node wrote lately is locked only if no other transaction holds
    /// it now: the jobs that would write one that is held leave the batch for the next
    /// ([`Writer::carried`]), at most [`MAX_PUT_OFF`] times, then their batch waits for the
    /// lock. Batches of several nodes over the same conversations then commit side by side, each
    /// with the conversations free when it began, instead of each waiting for the others'
    /// commits.
    ///
    /// What the batch's notices say other nodes committed is read in the same round trip, for
    /// every notice at once ([`Writer::take_in_notices`]).
    #[allow(clippy::too_many_lines)] // longer than the house's 100 lines; to be split
    pub(super) fn begin_shared(&mut self, batch: &mut Vec<Job>, read_all: bool) -> Result<()> {
        self.verified.clear();
        let behind = self.take_in_notices(batch)?;
        let now = crate::engine::store::now_ms();
        let mut nums = Vec::new();
        // What the batch reads with its locks: the conversations it writes that other nodes
        // wrote lately (or all it writes, after a conflict). Those it heard of and does not
        // write are read off its path ([`Writer::read_behind`]).
        let mut read = Vec::new();
        let mut new_ids = Vec::new();
        let mut fences = Vec::new();
        // The conversations each job writes (by its place in the batch), for those it may put
        // off; and those the jobs carried from the last batch write, which are waited for.
        let mut writes: Vec<(usize, i64)> = Vec::new();
        let mut waited: Vec<i64> = Vec::new();
        let put_off_before = std::mem::take(&mut self.put_off);
        self.stale.clear();
        for (place, job) in batch.iter().enumerate() {
            let id = match job {
                Job::Append {
                    conversation,
                    request,
                    ..
                } => {
                    if let Some(f) = request.fence {
                        let key = crate::engine::store::TurnKey {
                            conversation_id: conversation.clone(),
                            turn: f.turn,
                        };
                        fences.push((key, f.fence));
                    }
                    conversation.as_str()
                }
                Job::Load { id, .. } => {
                    self.known(id)?;
                    continue;
                }
                Job::Create { conv, .. } => {
                    new_ids.push(conv.id.clone());
                    // The caps count the creator's open conversations: those another node may
                    // have closed past this node's view are read first.
                    read.extend(self.behind_of(&conv.created_by));
                    match &conv.child_of {
                        Some(c) => c.parent.as_str(),
                        None => continue,
                    }
                }
                Job::Stop
                | Job::CommitAnswered
                | Job::Forget { .. }
                | Job::Sweep { .. }
                | Job::Refresh(_)
                | Job::TakeIn(_)
                | Job::Follow(_) => continue,
            };
            let Some(at) = self.known(id)? else { continue };
            // Each conversation the job writes, and whether another node wrote it lately (or
            // wrote past this node's view, which stays behind while nothing here follows it).
            let touched = |slot: &Slot| (slot.num, slot.read_until_ms > now || slot.behind());
            let slot = &self.convs.slots[at];
            let own = touched(slot);
            // A sub-conversation that closes reports to its parent in the same batch.
            let parent = match slot.state.parent().map(|p| p.conversation_id.clone()) {
                Some(parent) => self.known(&parent)?.map(|p| touched(&self.convs.slots[p])),
                None => None,
            };
            for (num, contended) in std::iter::once(own).chain(parent) {
                nums.push(num);
                if read_all || contended {
                    read.push(num);
                }
                let tired = put_off_before.get(place).is_some_and(|&t| t >= MAX_PUT_OFF);
                if tired || read_all || !contended {
                    waited.push(num);
                } else {
                    writes.push((place, num));
                }
            }
        }
        nums.sort_unstable();
        nums.dedup();
        read.sort_unstable();
        read.dedup();
        self.read_behind(
            behind
                .into_iter()
                .filter(|n| nums.binary_search(n).is_err()),
        );
        waited.sort_unstable();
        let mut may_skip: Vec<i64> = writes
            .iter()
            .map(|w| w.1)
            .filter(|n| waited.binary_search(n).is_err())
            .collect();
        may_skip.sort_unstable();
        may_skip.dedup();
        // Each with its view's head as it is now: the read starts after it.
        let read: Vec<(i64, u64)> = read
            .into_iter()
            .filter_map(|n| {
                let at = *self.convs.by_num.get(&n)?;
                Some((n, self.convs.slots[at].state.core.head))
            })
            .collect();
        // Every event is read of those a client here follows (they are published here), of
        // those the batch does not lock, and of all after a conflict; of the others, once
        // locked, only what moves more than the head.
        let global = self.hub.followed_all();
        let whole: Vec<i64> = read
            .iter()
            .map(|r| r.0)
            .filter(|n| {
                read_all
                    || nums.binary_search(n).is_err()
                    || self.convs.by_num.get(n).is_none_or(|&at| {
                        self.convs.slots[at].shared.follows_remote_commits(global)
                    })
            })
            .collect();
        if nums.is_empty() && new_ids.is_empty() && fences.is_empty() {
            if read.is_empty() {
                return Ok(());
            }
            let caught_up = self.log.read_many(&read)?;
            return self.take_in_read(caught_up);
        }
        let locked = self.log.lock(&crate::engine::store::ToLock {
            nums: &nums,
            read: &read,
            whole: &whole,
            new_ids: &new_ids,
            fences: &fences,
            may_skip: &may_skip,
        })?;
        self.stale.extend(locked.stale);
        self.verified = read
            .into_iter()
            .map(|r| r.0)
            .filter(|n| nums.binary_search(n).is_ok() && locked.skipped.binary_search(n).is_err())
            .collect();
        for id in &locked.existing {
            self.known(id)?;
        }
        if !locked.skipped.is_empty() {
            let mut put_off: Vec<usize> = writes
                .iter()
                .filter(|w| locked.skipped.binary_search(&w.1).is_ok())
                .map(|w| w.0)
                .collect();
            put_off.dedup();
            crate::engine::telemetry::put_off(put_off.len());
            self.stats
                .put_off
                .fetch_add(put_off.len() as u64, Ordering::Relaxed);
            // In the batch's order, ahead of whatever comes next.
            let mut next = put_off.into_iter().peekable();
            let mut kept = Vec::with_capacity(batch.len());
            for (place, job) in batch.drain(..).enumerate() {
                if next.peek() == Some(&place) {
                    next.next();
                    let times = put_off_before.get(place).copied().unwrap_or(0);
                    self.carried.push((job, times + 1));
                } else {
                    kept.push(job);
                }
            }
            *batch = kept;
        }
        self.take_in_read(locked.read)?;
        self.skip_to_heads(locked.heads, &locked.skipped);
        Ok(())
    }

    /// Moves the views of conversations the batch locked past events other nodes committed
    /// that move nothing but the head ([`crate::engine::store::Locked::heads`]), and has the
    /// new heads published (no events: a reader here reads them from the log). Those the
    /// batch did not lock (`skipped`) are left; those it read whole are at their head already.
    fn skip_to_heads(&mut self, heads: Vec<(i64, u64, i64)>, skipped: &[i64]) {
        let until = crate::engine::store::now_ms() + CONTENDED.as_millis() as i64;
        let mut convs = Vec::new();
        for (num, head, ts_ms) in heads {
            if skipped.binary_search(&num).is_ok() {
                continue;
            }
            let Some(&at) = self.convs.by_num.get(&num) else {
                continue;
            };
            let slot = &mut self.convs.slots[at];
            slot.read_until_ms = until;
            if head <= slot.state.core.head {
                continue;
            }
            crate::engine::telemetry::passed(head - slot.state.core.head);
            slot.state.core.head = head;
            convs.push(CommittedConv {
                shared: slot.shared.clone(),
                core: slot.state.core.clone(),
                drafts: Vec::new(),
                new: false,
                heads_only: Some(ts_ms),
            });
        }
        if !convs.is_empty() {
            let committed = Committed {
                ts_ms: crate::engine::store::now_ms(),
                convs,
                replies: Vec::new(),
            };
            self.hand_on_committed(committed, 0);
        }
    }

    /// Conversations `creator` created whose views here are behind the log (another node
    /// committed to them since, and nothing here followed them).
    fn behind_of(&mut self, creator: &str) -> Vec<i64> {
        let convs = &self.convs;
        let mut found = Vec::new();
        self.behind_views.retain(|num| {
            let Some(&at) = convs.by_num.get(num) else {
                return false;
            };
            let slot = &convs.slots[at];
            if !slot.behind() {
                return false;
            }
            if slot.creator == creator {
                found.push(*num);
            }
            true
        });
        found
    }

    /// Takes in what other nodes committed past this node's views of conversations `ids`,
    /// which a client reads here ([`Job::Follow`]).
    pub(super) fn follow(&mut self, ids: &[String]) {
        let nums: Vec<i64> = ids
            .iter()
            .filter_map(|id| {
                let at = self.convs.find(id)?;
                let slot = &self.convs.slots[at];
                slot.behind().then_some(slot.num)
            })
            .collect();
        self.read_behind(nums);
    }

    /// Has the reader read what the log holds past this node's views of `nums` (conversations
    /// other nodes committed to), off the writer's path: at once when no read is in flight,
    /// else with the next one.
    fn read_behind(&mut self, nums: impl IntoIterator<Item = i64>) {
        if let Some(r) = self.reader.as_mut() {
            r.pending.extend(nums);
        }
        self.ask_reader();
    }

    fn ask_reader(&mut self) {
        let nums = match self.reader.as_mut() {
            Some(r) if r.would_ask() => std::mem::take(&mut r.pending),
            _ => return,
        };
        let mut from: Vec<(i64, u64)> = nums
            .into_iter()
            .filter_map(|n| {
                let at = *self.convs.by_num.get(&n)?;
                Some((n, self.convs.slots[at].state.core.head))
            })
            .collect();
        from.sort_unstable();
        from.dedup_by_key(|f| f.0);
        if let Some(r) = self.reader.as_mut() {
            if !from.is_empty() && r.asks.send(from).is_ok() {
                r.in_flight = true;
            }
        }
    }

    /// Takes in what the reader read ([`Job::TakeIn`]) (see [`Writer::take_in_read`]), then
    /// asks for what was heard of meanwhile. A failed read's conversations wait for the next
    /// batch.
    pub(super) fn apply_read(
        &mut self,
        read: std::result::Result<Vec<(i64, Vec<RecoveredEvent>)>, Vec<i64>>,
    ) {
        let Some(r) = self.reader.as_mut() else {
            return;
        };
        r.in_flight = false;
        match read {
            Ok(read) => {
                if let Err(e) = self.take_in_read(read) {
                    tracing::error!(error = %e, "could not take in what another node committed");
                }
                self.ask_reader();
            }
            Err(nums) => r.pending.extend(nums),
        }
    }

    /// The slot of conversation `id`, loaded from the log if this node does not know it.
    fn known(&mut self, id: &str) -> Result<Option<usize>> {
        if let Some(at) = self.convs.find(id) {
            return Ok(Some(at));
        }
        match self.log.load(id)? {
            Some((record, events)) => Ok(Some(self.adopt(record, events)?)),
            None => Ok(None),
        }
    }

    /// Takes in a conversation another node created: its state from its events, published
    /// here as it was committed there (the first commit registers it for readers).
    fn adopt(&mut self, record: ConversationRecord, events: Vec<RecoveredEvent>) -> Result<usize> {
        let state = ConvMachine::new(record.id.clone(), record.participants.clone());
        let shared = Hub::make(
            &record.id,
            state.participants().to_vec(),
            state.core.clone(),
        );
        let at = self.convs.insert(
            &record.id,
            Slot::new(record.num, state, shared, record.created_by),
        );
        self.take_in(at, events, true)?;
        Ok(at)
    }

    /// Takes in what was read from the log past this node's views (per conversation number);
    /// another node wrote those, so their next batches read them first for a while
    /// ([`CONTENDED`]).
    /// Each conversation is taken in from the first event past the view: a read made off the
    /// writer's path ([`Writer::apply_read`]) may find the view moved on since it was asked for
    /// (never back), and holds every event past the head it was asked from, so what is left
    /// follows the view.
    fn take_in_read(&mut self, read: Vec<(i64, Vec<RecoveredEvent>)>) -> Result<()> {
        let until = crate::engine::store::now_ms() + CONTENDED.as_millis() as i64;
        for (num, events) in read {
            if let Some(&at) = self.convs.by_num.get(&num) {
                let slot = &mut self.convs.slots[at];
                slot.read_until_ms = until;
                let head = slot.state.core.head;
                let events: Vec<RecoveredEvent> =
                    events.into_iter().filter(|e| e.draft.seq > head).collect();
                if !events.is_empty() {
                    self.take_in(at, events, false)?;
                }
            }
        }
        Ok(())
    }

    /// Observes events another node committed and hands them on to be published, one commit
    /// (one timestamp) at a time; `new`: the first commit makes the conversation known here.
    fn take_in(&mut self, at: usize, events: Vec<RecoveredEvent>, new: bool) -> Result<()> {
        let slot = &mut self.convs.slots[at];
        crate::engine::telemetry::caught_up(events.len());
        let mut groups: Vec<Committed> = Vec::new();
        for e in events {
            if e.draft.seq != slot.state.core.head + 1 {
                return Err(Error::Corrupt(format!(
                    "conversation {} read back seq {} after {}",
                    slot.state.id, e.draft.seq, slot.state.core.head
                )));
            }
            slot.state.observe(&e.draft);
            let core = slot.state.core.clone();
            match groups.last_mut() {
                Some(g) if g.ts_ms == e.ts_ms => {
                    let c = &mut g.convs[0];
                    c.drafts.push(e.draft);
                    c.core = core;
                }
                _ => groups.push(Committed {
                    ts_ms: e.ts_ms,
                    convs: vec![CommittedConv {
                        shared: slot.shared.clone(),
                        core,
                        drafts: vec![e.draft],
                        new: new && groups.is_empty(),
                        heads_only: None,
                    }],
                    replies: Vec::new(),
                }),
            }
        }
        if new {
            // Before anything is published: the turn dispatcher reads the policy when the
            // first commit names a speaker.
            share_links(&slot.state, &slot.shared);
        }
        self.convs.settle(at);
        for g in groups {
            self.hand_on_committed(g, 0);
        }
        Ok(())
    }

    /// Takes in a slice of the open conversations numbered after `after` (see
    /// [`Job::Sweep`]): each that this node does not know yet is built from its events and
    /// registered for readers, and the turn dispatcher looks at it, as at a start that loads
    /// everything. Read on the writer's connection between two batches, so no notice of a
    /// later commit can have been taken in before it: one this node already heard of was
    /// loaded then (and is skipped here), one it hears of later is caught up on. The last
    /// number read and how many were new here, or `None` when there were no more.
    pub(super) fn sweep(&mut self, after: i64) -> Result<Option<(i64, usize)>> {
        let loaded = self.log.open_after(after, SWEEP_SLICE)?;
        let Some(last) = loaded.last().map(|(record, _)| record.num) else {
            self.swept_until = i64::MAX;
            return Ok(None);
        };
        self.swept_until = last;
        let mut taken = 0;
        for (record, events) in loaded {
            if self.convs.find(&record.id).is_some() {
                continue;
            }
            taken += 1;
            let id = record.id.clone();
            let slot = slot_from(record, &events)?;
            let view = slot.shared.clone();
            self.hub.register(view.clone());
            self.convs.insert(&id, slot);
            self.hub.turn_changed(&view);
        }
        Ok(Some((last, taken)))
    }

    /// Lets go of the closed conversations nobody holds (only this writer and the hub have
    /// their view) and no client named for `idle_ms`; how many. Only on a shared store, where
    /// the next client to name one loads it again ([`Writer::known`]); a closed conversation
    /// never changes, so a reader that took its view just before keeps a true one.
    pub(super) fn forget_idle(&mut self, idle_ms: i64) -> usize {
        if !self.shared {
            return 0;
        }
        let now = crate::engine::store::now_ms();
        let mut forgotten = 0;
        let mut at = 0;
        while at < self.convs.slots.len() {
            let slot = &self.convs.slots[at];
            let idle = slot.state.core.closed
                && now - slot.shared.touched_ms() >= idle_ms
                && Arc::strong_count(&slot.shared) == 2;
            if idle {
                self.hub.remove(&slot.state.id);
                self.convs.remove(at);
                forgotten += 1;
            } else {
                at += 1;
            }
        }
        forgotten
    }

    /// Takes in what the notices among `batch` say other nodes committed (conversation
    /// numbers with their heads; everything changed lately for a notice without them): loads
    /// the conversations this node does not know (unless closed, or the sweep after the start
    /// will reach them), and answers, by number, those
    /// it knows and is behind on, now counted as written lately by another node
    /// ([`CONTENDED`]): the batch reads them past its view with its locks, in one round trip
    /// however many notices it holds.
    fn take_in_notices(&mut self, batch: &[Job]) -> Result<Vec<i64>> {
        let mut heads: Vec<(i64, u64)> = Vec::new();
        for job in batch {
            let Job::Refresh(changes) = job else { continue };
            match changes {
                Some(c) => {
                    crate::engine::telemetry::refreshed("notification");
                    heads.extend_from_slice(c);
                }
                None => {
                    crate::engine::telemetry::refreshed("scan");
                    heads.extend(self.log.changed_lately()?);
                }
            }
        }
        // The highest head heard of each.
        heads.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        heads.dedup_by_key(|h| h.0);
        let until = crate::engine::store::now_ms() + CONTENDED.as_millis() as i64;
        let global = self.hub.followed_all();
        let mut behind = Vec::new();
        let mut unmet = Vec::new();
        for (num, head) in heads {
            match self.convs.by_num.get(&num) {
                Some(&at) => {
                    let slot = &mut self.convs.slots[at];
                    if head > slot.state.core.head {
                        slot.read_until_ms = until;
                        slot.shared.note_remote_head(head);
                        // Read back now only if something here follows it; else when a batch
                        // writes it or a client reads it.
                        if slot.shared.follows_remote_commits(global) {
                            behind.push(num);
                        } else {
                            self.behind_views.insert(num);
                        }
                    }
                }
                // One the sweep after the start has not reached yet: it will read it, after
                // this commit (right after a start, the look at everything written lately
                // names many such; loading each here, one by one, would hold the sweep up).
                None if num > self.swept_until => {}
                None => unmet.push(num),
            }
        }
        // Those still open, read together (a look at everything written lately may name
        // thousands, most of them closed).
        if !unmet.is_empty() {
            for (record, events) in self.log.load_open(&unmet)? {
                self.adopt(record, events)?;
            }
        }
        Ok(behind)
    }
}
